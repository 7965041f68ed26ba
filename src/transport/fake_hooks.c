/*
 * fake_hooks.c -- the fake transport's test-facing API: scripts, injected
 * peer errors and paths, transfer inspection, the call log and counters.
 */
#include "transport/fake_int.h"

#include <string.h>

static fake_xport_t *lock_x(kvp_xport_t *xp)
{
    KVP_ASSERT(kvp_xport_is_fake(xp));
    fake_xport_t *x = fake__x(xp);
    pthread_mutex_lock(&x->fab->mu);
    return x;
}

static void unlock_x(fake_xport_t *x)
{
    pthread_mutex_unlock(&x->fab->mu);
}

uint32_t kvp_fake_endpoint_id(kvp_xport_t *xp)
{
    KVP_ASSERT(kvp_xport_is_fake(xp));
    return fake__x(xp)->ep;
}

bool kvp_fake_progress(kvp_xport_t *xp)
{
    KVP_ASSERT(kvp_xport_is_fake(xp));
    return xp->ops->progress(xp);
}

uint64_t kvp_fake_next_event_ns(kvp_xport_t *xp)
{
    fake_xport_t *x = lock_x(xp);
    uint64_t t = fake__next_event(x);
    unlock_x(x);
    return t;
}

/* -------------------------------------------------------------- call log */

void fake__log_call(fake_xport_t *x, const kvp_fake_call_t *c, const kvp_xfer_block_t *blocks)
{
    x->call_counts[c->kind]++;
    if (x->n_calls >= x->max_calls)
        return;
    if (x->n_calls == x->cap_calls) { /* grows as used: most transports log little */
        size_t cap = KVP_MIN(KVP_MAX(x->cap_calls * 2, (size_t)64), x->max_calls);
        kvp_fake_call_t *calls = kvp__realloc(x->calls, cap * sizeof(*calls));
        if (!calls)
            return; /* not recorded; the count above still is */
        x->calls = calls;
        x->cap_calls = cap;
    }
    kvp_fake_call_t *r = &x->calls[x->n_calls];
    *r = *c;
    r->at_ns = kvp_clock_now(x->clock);
    r->blocks = NULL;
    if (blocks && c->n_blocks) {
        kvp_xfer_block_t *copy = kvp__malloc(c->n_blocks * sizeof(*copy));
        if (!copy)
            return; /* not recorded; the count above still is */
        memcpy(copy, blocks, c->n_blocks * sizeof(*copy));
        r->blocks = copy;
    }
    x->n_calls++;
}

void fake__log_simple(fake_xport_t *x, kvp_fake_call_kind_t kind, kvp_xpeer_id_t peer,
                      kvp_xfer_id_t xfer, kvp_status_t st, uint64_t n)
{
    kvp_fake_call_t c = {.kind = kind, .peer = peer, .xfer = xfer, .status = st, .n = n};
    fake__log_call(x, &c, NULL);
}

/* ---------------------------------------------------------------- scripts */

kvp_fake_script_t kvp_fake_script_complete(uint64_t delay_ns)
{
    kvp_fake_script_t s = {KVP_FAKE_COMPLETE, delay_ns, delay_ns, KVP_FAKE_ALL_BLOCKS, KVP_OK};
    return s;
}

kvp_fake_script_t kvp_fake_script_wedge(void)
{
    kvp_fake_script_t s = {KVP_FAKE_WEDGE, KVP_FAKE_NEVER, KVP_FAKE_NEVER, KVP_FAKE_ALL_BLOCKS,
                           KVP_OK};
    return s;
}

kvp_fake_script_t kvp_fake_script_wedge_then_copy(uint64_t copy_ns)
{
    kvp_fake_script_t s = {KVP_FAKE_WEDGE, KVP_FAKE_NEVER, copy_ns, KVP_FAKE_ALL_BLOCKS, KVP_OK};
    return s;
}

kvp_fake_script_t kvp_fake_script_fail(uint64_t delay_ns, uint32_t copied_blocks)
{
    kvp_fake_script_t s = {KVP_FAKE_FAIL, delay_ns, delay_ns, copied_blocks, KVP_ERR_TRANSPORT};
    return s;
}

kvp_fake_script_t kvp_fake_script_fail_submit(void)
{
    kvp_fake_script_t s = {KVP_FAKE_FAIL_SUBMIT, 0, KVP_FAKE_NEVER, 0, KVP_ERR_TRANSPORT};
    return s;
}

kvp_fake_script_t kvp_fake_script_disconnect(uint64_t delay_ns, uint32_t copied_blocks)
{
    kvp_fake_script_t s = {KVP_FAKE_DISCONNECT, delay_ns, delay_ns, copied_blocks,
                           KVP_ERR_UNREACHABLE};
    return s;
}

kvp_fake_script_t kvp_fake_script_late(uint64_t terminal_ns, uint64_t copy_ns, kvp_status_t status)
{
    kvp_fake_script_t s = {KVP_FAKE_LATE, terminal_ns, copy_ns, KVP_FAKE_ALL_BLOCKS, status};
    return s;
}

kvp_status_t kvp_fake_script_next(kvp_xport_t *xp, const kvp_fake_script_t *s)
{
    if (!s || (unsigned)s->kind > KVP_FAKE_LATE || s->status > 0)
        return KVP_ERR_INVALID;
    fake_script_node_t *sn = kvp__calloc(1, sizeof(*sn));
    if (!sn)
        return KVP_ERR_NOMEM;
    sn->s = *s;
    fake_xport_t *x = lock_x(xp);
    kvp_list_insert_tail(&x->scripts, &sn->link);
    x->n_scripts++;
    unlock_x(x);
    return KVP_OK;
}

void kvp_fake_scripts_clear(kvp_xport_t *xp)
{
    fake_xport_t *x = lock_x(xp);
    while (!kvp_list_empty(&x->scripts)) {
        kvp_list_t *pos = x->scripts.next;
        kvp_list_remove(pos);
        kvp__free(KVP_CONTAINER_OF(pos, fake_script_node_t, link));
    }
    x->n_scripts = 0;
    unlock_x(x);
}

size_t kvp_fake_scripts_queued(kvp_xport_t *xp)
{
    fake_xport_t *x = lock_x(xp);
    size_t n = x->n_scripts;
    unlock_x(x);
    return n;
}

/* ------------------------------------------------------------------ peers */

static fake_peer_t *peer_live(fake_xport_t *x, kvp_xpeer_id_t id)
{
    fake_peer_t *p = id ? fake__peer_any(x, id) : NULL;
    return p && !p->removed ? p : NULL;
}

kvp_status_t kvp_fake_peer_set_error(kvp_xport_t *xp, kvp_xpeer_id_t peer, kvp_status_t st)
{
    if (st > 0)
        return KVP_ERR_INVALID;
    fake_xport_t *x = lock_x(xp);
    fake_peer_t *p = peer_live(x, peer);
    if (p)
        p->status = st;
    unlock_x(x);
    return p ? KVP_OK : KVP_ERR_NOT_FOUND;
}

kvp_status_t kvp_fake_peer_set_path(kvp_xport_t *xp, kvp_xpeer_id_t peer, kvp_data_path_t path)
{
    if (path != KVP_PATH_FAKE_FENCEABLE && path != KVP_PATH_FAKE_UNFENCEABLE &&
        path != KVP_PATH_FAKE_AM)
        return KVP_ERR_INVALID;
    fake_xport_t *x = lock_x(xp);
    fake_peer_t *p = peer_live(x, peer);
    kvp_status_t st = !p ? KVP_ERR_NOT_FOUND : (path == KVP_PATH_FAKE_AM) != (x->acc != NULL)
                                                   ? KVP_ERR_STATE /* the AM model is per transport */
                                                   : KVP_OK;
    if (st == KVP_OK)
        p->path = path;
    unlock_x(x);
    return st;
}

/* ------------------------------------------------------------ inspection */

kvp_status_t kvp_fake_xfer_info(kvp_xport_t *xp, kvp_xfer_id_t id, kvp_fake_xfer_info_t *info)
{
    if (!info)
        return KVP_ERR_INVALID;
    fake_xport_t *x = lock_x(xp);
    kvp_status_t st = KVP_ERR_NOT_FOUND;
    kvp_list_t *pos, *tmp;
    kvp_list_foreach_safe(pos, tmp, &x->xfers)
    {
        fake_xfer_t *xf = KVP_CONTAINER_OF(pos, fake_xfer_t, link);
        if (xf->id != id)
            continue;
        kvp_fake_xfer_info_t i = {.peer = xf->peer_id,
                                  .tracked = xf->tracked,
                                  .retired = xf->retired,
                                  .terminal = xf->terminal,
                                  .copy_pending = fake__copy_pending(xf),
                                  .fenced = xf->fenced,
                                  .status = xf->final_status,
                                  .n_blocks = xf->n};
        *info = i;
        st = KVP_OK;
        break;
    }
    unlock_x(x);
    return st;
}

size_t kvp_fake_calls(kvp_xport_t *xp, const kvp_fake_call_t **calls)
{
    fake_xport_t *x = lock_x(xp);
    size_t n = x->n_calls;
    if (calls)
        *calls = x->calls;
    unlock_x(x);
    return n;
}

uint64_t kvp_fake_call_count(kvp_xport_t *xp, kvp_fake_call_kind_t kind)
{
    if ((unsigned)kind >= KVP_FAKE_CALL_KINDS)
        return 0;
    fake_xport_t *x = lock_x(xp);
    uint64_t n = x->call_counts[kind];
    unlock_x(x);
    return n;
}

void kvp_fake_get_counters(kvp_xport_t *xp, kvp_fake_counters_t *c)
{
    fake_xport_t *x = lock_x(xp);
    *c = x->ctr;
    unlock_x(x);
}
