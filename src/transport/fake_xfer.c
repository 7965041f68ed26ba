/*
 * fake_xfer.c -- the fake transport's transfers (issue 31: fake.c cut along
 * this seam): write (checked, then scripted: delay, fail, hang, ...), poll,
 * poll_retired and cancel, with the semantics of transport.h.
 */
#include "transport/fake_int.h"

#include <string.h>

/* ----------------------------------------------------------------- write */

/* Every index is checked before anything is posted (UCX checks nothing). */
static kvp_status_t write_check(fake_xport_t *x, fake_peer_t *p, const kvp_xfer_block_t *blocks,
                                size_t n)
{
    if (!p)
        return KVP_ERR_NOT_FOUND;
    if (p->fenced)
        return KVP_ERR_CLOSED;
    if (p->status != KVP_OK)
        return KVP_ERR_TRANSPORT;
    for (size_t i = 0; i < n; i++) {
        if (blocks[i].src_slot >= x->layout.num_blocks ||
            blocks[i].dst_slot >= p->layout.num_blocks) {
            KVP_WARN(fake__pfx(x),
                     "fake write: block %zu index out of range (src %u/%u, dst %u/%u)", i,
                     blocks[i].src_slot, x->layout.num_blocks, blocks[i].dst_slot,
                     p->layout.num_blocks);
            return KVP_ERR_INVALID;
        }
    }
    return KVP_OK;
}

static uint64_t after(uint64_t now, uint64_t delay)
{
    return delay == KVP_FAKE_NEVER || now + delay < now ? KVP_FAKE_NEVER : now + delay;
}

/* Peek the next script (or make the default one). */
static kvp_fake_script_t script_peek(fake_xport_t *x)
{
    if (!kvp_list_empty(&x->scripts))
        return KVP_CONTAINER_OF(x->scripts.next, fake_script_node_t, link)->s;
    uint64_t d = x->default_delay_ns;
    if (x->delay_jitter_ns)
        d += kvp_rng_below(&x->rng, x->delay_jitter_ns + 1);
    return kvp_fake_script_complete(d);
}

static void script_pop(fake_xport_t *x)
{
    if (kvp_list_empty(&x->scripts))
        return;
    fake_script_node_t *sn = KVP_CONTAINER_OF(x->scripts.next, fake_script_node_t, link);
    kvp_list_remove(&sn->link);
    x->n_scripts--;
    kvp__free(sn);
}

/* Turn the script into absolute times on the transfer. */
static void script_apply(fake_xport_t *x, fake_xfer_t *xf, const kvp_fake_script_t *s)
{
    uint64_t now = fake__now_of(x);
    xf->terminal_at = after(now, s->terminal_ns);
    xf->copy_blocks = KVP_MIN(s->copy_blocks, xf->n);
    xf->final_status = s->status;
    switch (s->kind) {
    case KVP_FAKE_COMPLETE:
        xf->copy_at = xf->terminal_at;
        xf->copy_blocks = xf->n;
        xf->final_status = KVP_OK;
        break;
    case KVP_FAKE_DISCONNECT:
        xf->disconnect = true;
        xf->final_status = KVP_ERR_UNREACHABLE;
        /* fall through */
    case KVP_FAKE_FAIL:
        xf->copy_at = xf->terminal_at;
        if (xf->final_status == KVP_OK)
            xf->final_status = KVP_ERR_TRANSPORT;
        break;
    case KVP_FAKE_WEDGE:
        xf->terminal_at = KVP_FAKE_NEVER;
        /* fall through */
    default: /* LATE */
        xf->copy_at = after(now, s->copy_ns);
        break;
    }
    if (xf->copy_blocks == 0)
        xf->copy_at = KVP_FAKE_NEVER;
    if (!fake__fabric_ep(x->fab, xf->dst_ep)) {
        /* The destination closed before we posted: the peer is gone, no
         * byte can be written; the transfer fails like a disconnect. */
        xf->copy_at = KVP_FAKE_NEVER;
        xf->final_status = KVP_ERR_UNREACHABLE;
        xf->terminal_at = now;
    }
}

/* A write refused before it became a transfer: logged as such. */
static kvp_status_t write_refused(fake_xport_t *x, kvp_xpeer_id_t peer, kvp_status_t st, size_t n)
{
    kvp_fake_call_t c = {
        .kind = KVP_FAKE_CALL_WRITE_REFUSED, .peer = peer, .status = st, .n_blocks = (uint32_t)n};
    fake__log_call(x, &c, NULL);
    return st;
}

static kvp_status_t write_locked(fake_xport_t *x, kvp_xpeer_id_t peer,
                                 const kvp_xfer_block_t *blocks, size_t n, kvp_xfer_id_t *out)
{
    fake_peer_t *p = fake__peer_live(x, peer);
    kvp_status_t st = write_check(x, p, blocks, n);
    kvp_fake_script_t s = script_peek(x);
    if (st == KVP_OK && s.kind == KVP_FAKE_FAIL_SUBMIT) {
        script_pop(x);
        st = KVP_ERR_TRANSPORT;
    }
    fake_xfer_t *xf = NULL;
    if (st == KVP_OK) {
        xf = kvp__malloc(sizeof(*xf) + n * sizeof(xf->blocks[0]));
        if (!xf)
            st = KVP_ERR_NOMEM;
    }
    if (st != KVP_OK)
        return write_refused(x, peer, st, n);
    memset(xf, 0, sizeof(*xf));
    xf->id = x->fab->next_id++;
    xf->peer = p;
    xf->peer_id = p->id;
    xf->dst_ep = p->remote_ep;
    xf->tracked = true;
    xf->n = (uint32_t)n;
    memcpy(xf->blocks, blocks, n * sizeof(*blocks));
    fake_xport_t *dst = fake__fabric_ep(x->fab, p->remote_ep);
    if (dst && dst->acc && fake__snapshot(x->fab, x, xf) != KVP_OK) {
        kvp__free(xf);
        return write_refused(x, peer, KVP_ERR_NOMEM, n);
    }
    script_pop(x);
    script_apply(x, xf, &s);
    /* Posted through an endpoint the consumer already fenced: nothing of it
     * lands (it still ends as scripted; the source cannot tell). */
    xf->fenced = p->remote_fenced;
    x->ctr.posted_fenced += xf->fenced;
    if (xf->fenced)
        KVP_DEBUG(fake__pfx(x),
                  "fake: transfer %llu posted through peer %llu, fenced by the consumer: "
                  "nothing of it lands",
                  (unsigned long long)xf->id, (unsigned long long)p->id);
    kvp_list_insert_tail(&x->xfers, &xf->link);
    fake__events_changed(x);
    x->st.writes++;
    x->st.blocks_written += n;
    x->st.bytes_written += (uint64_t)n * x->layout.block_size;
    kvp_fake_call_t c = {
        .kind = KVP_FAKE_CALL_WRITE, .peer = peer, .xfer = xf->id, .n_blocks = (uint32_t)n};
    fake__log_call(x, &c, blocks);
    *out = xf->id;
    return KVP_OK;
}

kvp_status_t fake__write(kvp_xport_t *xp, kvp_xpeer_id_t peer, const kvp_xfer_block_t *blocks,
                         size_t n, kvp_xfer_id_t *out)
{
    fake_xport_t *x = fake__x(xp);
    if (!blocks || n == 0 || n > UINT32_MAX || !out)
        return KVP_ERR_INVALID;
    if (!x->registered)
        return KVP_ERR_STATE;
    fake__lock(x);
    kvp_status_t st = write_locked(x, peer, blocks, n, out);
    fake__unlock(x);
    return st;
}

/* ------------------------------------------------------- poll and cancel */

/* Release up to cap terminal tracked transfers that are `retired` and, for
 * live ones, belong to `peer`. */
static size_t reap(fake_xport_t *x, bool retired, kvp_xpeer_id_t peer, kvp_xfer_result_t *out,
                   size_t cap)
{
    size_t k = 0;
    if (x->n_reportable == 0)
        return 0; /* no tracked terminal transfer: nothing to hand back */
    kvp_list_t *pos, *tmp;
    kvp_list_foreach_safe(pos, tmp, &x->xfers)
    {
        fake_xfer_t *xf = KVP_CONTAINER_OF(pos, fake_xfer_t, link);
        if (k == cap)
            break;
        if (!xf->tracked || !xf->terminal || xf->retired != retired ||
            (!retired && xf->peer_id != peer))
            continue;
        out[k].id = xf->id;
        out[k].status = xf->final_status;
        k++;
        if (retired)
            fake__log_simple(x, KVP_FAKE_CALL_POLL_RETIRED, xf->peer_id, xf->id, xf->final_status,
                             0);
        fake__release(x, xf);
    }
    return k;
}

kvp_status_t fake__poll(kvp_xport_t *xp, kvp_xpeer_id_t peer, kvp_xfer_result_t *out,
                        size_t cap, size_t *n_out)
{
    fake_xport_t *x = fake__x(xp);
    if ((!out && cap) || !n_out)
        return KVP_ERR_INVALID;
    fake__lock(x);
    kvp_status_t st = KVP_ERR_NOT_FOUND;
    if (fake__peer_live(x, peer)) {
        size_t k = reap(x, false, peer, out, cap);
        if (k)
            fake__log_simple(x, KVP_FAKE_CALL_POLL, peer, 0, KVP_OK, k);
        *n_out = k;
        st = KVP_OK;
    }
    fake__unlock(x);
    return st;
}

kvp_status_t fake__poll_retired(kvp_xport_t *xp, kvp_xfer_result_t *out, size_t cap,
                                size_t *n_out)
{
    fake_xport_t *x = fake__x(xp);
    if ((!out && cap) || !n_out)
        return KVP_ERR_INVALID;
    if (__atomic_load_n(&x->n_reportable, __ATOMIC_RELAXED) == 0) {
        *n_out = 0; /* what reap() answers at once, without the lock */
        return KVP_OK;
    }
    fake__lock(x);
    *n_out = reap(x, true, 0, out, cap);
    fake__unlock(x);
    return KVP_OK;
}

static kvp_status_t cancel_locked(fake_xport_t *x, const kvp_xfer_id_t *ids, size_t n,
                                  kvp_cancel_mode_t mode, kvp_xfer_id_t *still, size_t *n_running)
{
    for (size_t i = 0; i < n; i++)
        if (!fake__xfer_tracked(x, ids[i]))
            return KVP_ERR_NOT_FOUND; /* nothing changed */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        fake_xfer_t *xf = fake__xfer_tracked(x, ids[i]);
        if (!xf)
            continue; /* a duplicate id, already released */
        bool release = mode == KVP_CANCEL_IMMEDIATE || xf->terminal;
        kvp_fake_call_t c = {.kind = KVP_FAKE_CALL_CANCEL,
                             .peer = xf->peer_id,
                             .xfer = xf->id,
                             .mode = mode,
                             .status = release ? KVP_OK : KVP_ERR_BUSY};
        fake__log_call(x, &c, NULL);
        if (release)
            fake__release(x, xf); /* IMMEDIATE: a scripted copy still happens */
        else
            still[k++] = ids[i];
    }
    if (n_running)
        *n_running = k;
    return KVP_OK;
}

kvp_status_t fake__cancel(kvp_xport_t *xp, const kvp_xfer_id_t *ids, size_t n,
                          kvp_cancel_mode_t mode, kvp_xfer_id_t *still_running,
                          size_t *n_running)
{
    fake_xport_t *x = fake__x(xp);
    if ((!ids && n) || (mode != KVP_CANCEL_IMMEDIATE && mode != KVP_CANCEL_WAIT))
        return KVP_ERR_INVALID;
    if (mode == KVP_CANCEL_WAIT && (!still_running || !n_running))
        return KVP_ERR_INVALID;
    fake__lock(x);
    kvp_status_t st = cancel_locked(x, ids, n, mode, still_running, n_running);
    fake__unlock(x);
    return st;
}

