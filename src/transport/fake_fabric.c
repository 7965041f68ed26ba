/*
 * fake_fabric.c -- the fabric that joins fake transports: endpoint table,
 * time-ordered application of scripted events (byte copies, terminal
 * states), fences, and the LANDING CHECKER (SPEC §7 I1/I2) that inspects both
 * stores at the moment bytes land.
 */
#include "transport/fake_int.h"

#include <stdlib.h>
#include <string.h>

static uint64_t g_fabric_ids;

kvp_status_t kvp_fake_fabric_create(const kvp_clock_t *clock, kvp_fake_fabric_t **out)
{
    if (!clock || !out)
        return KVP_ERR_INVALID;
    kvp_fake_fabric_t *f = kvp__calloc(1, sizeof(*f));
    if (!f)
        return KVP_ERR_NOMEM;
    if (pthread_mutex_init(&f->mu, NULL) != 0) {
        kvp__free(f);
        return KVP_ERR_NOMEM;
    }
    f->clock = clock;
    fake__fabric_changed(f);
    f->fabric_id = __atomic_add_fetch(&g_fabric_ids, 1, __ATOMIC_RELAXED);
    f->next_id = 1;
    *out = f;
    return KVP_OK;
}

kvp_status_t kvp_fake_fabric_destroy(kvp_fake_fabric_t *f)
{
    if (!f)
        return KVP_OK;
    pthread_mutex_lock(&f->mu);
    uint32_t open = f->open;
    pthread_mutex_unlock(&f->mu);
    if (open)
        return KVP_ERR_BUSY;
    pthread_mutex_destroy(&f->mu);
    kvp__free(f->eps);
    kvp__free(f->viol);
    kvp__free(f);
    return KVP_OK;
}

kvp_status_t fake__fabric_attach(kvp_fake_fabric_t *f, fake_xport_t *x)
{
    if (f->n_eps == f->cap_eps) {
        uint32_t cap = f->cap_eps ? 2 * f->cap_eps : 8;
        fake_xport_t **eps = kvp__realloc(f->eps, cap * sizeof(*eps));
        if (!eps)
            return KVP_ERR_NOMEM;
        f->eps = eps;
        f->cap_eps = cap;
    }
    f->eps[f->n_eps++] = x;
    x->ep = f->n_eps; /* ids are never reused: a closed endpoint stays NULL */
    f->open++;
    fake__fabric_changed(f);
    f->mixed_clocks |= x->clock != f->clock;
    return KVP_OK;
}

void fake__fabric_detach(kvp_fake_fabric_t *f, fake_xport_t *x)
{
    KVP_ASSERT(x->ep >= 1 && x->ep <= f->n_eps && f->eps[x->ep - 1] == x);
    f->eps[x->ep - 1] = NULL;
    f->open--;
    fake__fabric_changed(f);
}

fake_xport_t *fake__fabric_ep(kvp_fake_fabric_t *f, uint32_t ep)
{
    if (ep == 0 || ep > f->n_eps)
        return NULL;
    return f->eps[ep - 1];
}

/* ---------------------------------------------------------------- checker */

const char *kvp_fake_violation_kind_str(kvp_fake_violation_kind_t k)
{
    switch (k) {
    case KVP_FAKE_V_DST_STALE:
        return "I1 destination generation changed";
    case KVP_FAKE_V_DST_STATE:
        return "I1 destination not FILLING/QUARANTINED";
    case KVP_FAKE_V_SRC_STALE:
        return "I2 source generation changed";
    case KVP_FAKE_V_SRC_STATE:
        return "I2 source not READY";
    case KVP_FAKE_V_SRC_UNPINNED:
        return "I2 source unpinned";
    case KVP_FAKE_V_DST_CLOSED:
        return "destination transport closed";
    }
    return "invalid";
}

static void record_violation(kvp_fake_fabric_t *f, fake_xport_t *src, kvp_fake_violation_t *v)
{
    KVP_ERROR(src->base.log_prefix,
              "fake landing checker: %s: xfer %llu ep%u slot %u -> ep%u slot %u, expected gen %u, "
              "actual gen %u state %s pins %u",
              kvp_fake_violation_kind_str(v->kind), (unsigned long long)v->xfer, v->src_ep,
              v->src_slot, v->dst_ep, v->dst_slot, v->expected_gen, v->actual_gen,
              kvp_slot_state_str(v->actual_state), v->actual_pins);
    if (f->n_viol == f->cap_viol) {
        size_t cap = f->cap_viol ? 2 * f->cap_viol : 16;
        kvp_fake_violation_t *nv = kvp__realloc(f->viol, cap * sizeof(*nv));
        if (!nv) {
            f->viol_lost++;
            return;
        }
        f->viol = nv;
        f->cap_viol = cap;
    }
    f->viol[f->n_viol++] = *v;
}

/* I2: the source slot is READY with the named generation and pinned. */
static void check_src(kvp_fake_fabric_t *f, fake_xport_t *src, kvp_fake_violation_t *v,
                      const kvp_xfer_block_t *b)
{
    kvp_slot_info_t info;
    if (!src->store || kvp_store_slot_info(src->store, b->src_slot, &info) != KVP_OK)
        return;
    v->expected_gen = b->src_gen;
    v->actual_gen = info.gen;
    v->actual_state = info.state;
    v->actual_pins = info.pins;
    if (info.gen != b->src_gen)
        v->kind = KVP_FAKE_V_SRC_STALE;
    else if (info.state != KVP_SLOT_READY)
        v->kind = KVP_FAKE_V_SRC_STATE;
    else if (info.pins == 0)
        v->kind = KVP_FAKE_V_SRC_UNPINNED;
    else
        return;
    record_violation(f, src, v);
}

/* I1: the destination slot still has the named generation and is FILLING or
 * QUARANTINED (a late copy into quarantine is what quarantine is for). */
static void check_dst(kvp_fake_fabric_t *f, fake_xport_t *src, fake_xport_t *dst,
                      kvp_fake_violation_t *v, const kvp_xfer_block_t *b)
{
    kvp_slot_info_t info;
    if (!dst->store || kvp_store_slot_info(dst->store, b->dst_slot, &info) != KVP_OK)
        return;
    v->expected_gen = b->dst_gen;
    v->actual_gen = info.gen;
    v->actual_state = info.state;
    v->actual_pins = info.pins;
    if (info.gen != b->dst_gen)
        v->kind = KVP_FAKE_V_DST_STALE;
    else if (info.state != KVP_SLOT_FILLING && info.state != KVP_SLOT_QUARANTINED)
        v->kind = KVP_FAKE_V_DST_STATE;
    else
        return;
    record_violation(f, src, v);
}

/* The moment bytes land: check, then copy (the corruption a violation
 * stands for happens too), unless fenced or the destination is gone. */
static void apply_copy(kvp_fake_fabric_t *f, fake_xport_t *x, fake_xfer_t *xf, uint64_t now)
{
    uint32_t k = KVP_MIN(xf->copy_blocks, xf->n);
    xf->copied = true;
    fake__events_changed(x);
    if (xf->fenced) {
        x->ctr.blocks_fenced += k;
        return;
    }
    fake_xport_t *dst = fake__fabric_ep(f, xf->dst_ep);
    size_t bs = x->layout.block_size;
    for (uint32_t i = 0; i < k; i++) {
        const kvp_xfer_block_t *b = &xf->blocks[i];
        kvp_fake_violation_t v = {.xfer = xf->id,
                                  .src_ep = x->ep,
                                  .dst_ep = xf->dst_ep,
                                  .src_slot = b->src_slot,
                                  .dst_slot = b->dst_slot,
                                  .at_ns = now};
        if (!xf->snap)
            check_src(f, x, &v, b); /* a snapshot was checked when it was read */
        if (!dst) {
            v.kind = KVP_FAKE_V_DST_CLOSED;
            v.expected_gen = b->dst_gen;
            v.actual_gen = 0;
            v.actual_state = KVP_SLOT_FREE;
            v.actual_pins = 0;
            record_violation(f, x, &v);
            x->ctr.blocks_dst_closed++;
            continue;
        }
        fake_acc_t *e = dst->acc ? &dst->acc[b->dst_slot] : NULL;
        if (e && (!e->expect || e->gen != b->dst_gen || (e->src_ep && e->src_ep != x->ep))) {
            dst->st.late_bytes_dropped += bs; /* AM model: refused, stale or foreign */
            continue;
        }
        check_dst(f, x, dst, &v, b);
        memmove(dst->region + (size_t)b->dst_slot * bs,
                xf->snap ? xf->snap + (size_t)i * bs : x->region + (size_t)b->src_slot * bs, bs);
        if (e) {
            e->landed = true;
            dst->st.am_blocks_landed++;
            dst->st.am_bytes_landed += bs;
        }
        x->ctr.blocks_landed++;
        if (!xf->tracked)
            x->ctr.late_copies++;
    }
}

kvp_status_t fake__snapshot(kvp_fake_fabric_t *f, fake_xport_t *x, fake_xfer_t *xf)
{
    size_t bs = x->layout.block_size;
    if ((xf->snap = kvp__malloc((size_t)xf->n * bs)) == NULL)
        return KVP_ERR_NOMEM;
    uint64_t now = kvp_clock_now(x->clock);
    for (uint32_t i = 0; i < xf->n; i++) {
        const kvp_xfer_block_t *b = &xf->blocks[i];
        kvp_fake_violation_t v = {.xfer = xf->id,
                                  .src_ep = x->ep,
                                  .dst_ep = xf->dst_ep,
                                  .src_slot = b->src_slot,
                                  .dst_slot = b->dst_slot,
                                  .at_ns = now};
        check_src(f, x, &v, b);
        memcpy(xf->snap + (size_t)i * bs, x->region + (size_t)b->src_slot * bs, bs);
    }
    return KVP_OK;
}

static void apply_terminal(fake_xport_t *x, fake_xfer_t *xf)
{
    xf->terminal = true;
    fake__events_changed(x);
    if (xf->tracked)
        fake__reportable_add(x, 1); /* until fake__release hands it back */
    if (xf->final_status == KVP_OK)
        x->st.done++;
    else
        x->st.failed++;
    if (xf->disconnect) {
        fake_peer_t *p = fake__peer_any(x, xf->peer_id);
        if (p && p->status == KVP_OK)
            p->status = KVP_ERR_UNREACHABLE;
    }
}

/* ------------------------------------------------------------ event order */

typedef struct fake_event {
    uint64_t t;
    kvp_xfer_id_t id;
    int type; /* 0 copy, 1 terminal: a copy due at the same time lands first */
    fake_xport_t *x;
    fake_xfer_t *xf;
} fake_event_t;

static bool event_before(const fake_event_t *a, const fake_event_t *b)
{
    if (a->t != b->t)
        return a->t < b->t;
    if (a->id != b->id)
        return a->id < b->id;
    return a->type < b->type;
}

static void earliest_of(fake_xport_t *x, bool due_only, fake_event_t *best)
{
    uint64_t now = due_only ? kvp_clock_now(x->clock) : KVP_FAKE_NEVER - 1;
    kvp_list_t *pos, *tmp;
    kvp_list_foreach_safe(pos, tmp, &x->xfers)
    {
        fake_xfer_t *xf = KVP_CONTAINER_OF(pos, fake_xfer_t, link);
        fake_event_t c[2] = {{xf->copy_at, xf->id, 0, x, xf}, {xf->terminal_at, xf->id, 1, x, xf}};
        bool live[2] = {fake__copy_pending(xf), !xf->terminal && xf->terminal_at != KVP_FAKE_NEVER};
        for (int i = 0; i < 2; i++)
            if (live[i] && c[i].t <= now && (!best->xf || event_before(&c[i], best)))
                *best = c[i];
    }
}

/* x's earliest pending event, rescanned only after a change. */
static uint64_t next_at(fake_xport_t *x)
{
    if (x->events_dirty) {
        fake_event_t best = {0};
        earliest_of(x, false, &best);
        x->next_at = best.xf ? best.t : KVP_FAKE_NEVER;
        x->events_dirty = false;
        __atomic_store_n(&x->due_hint, x->next_at, __ATOMIC_RELAXED);
    }
    return x->next_at;
}

/* Only a transport with an event due can contribute one. */
static void earliest_due(fake_xport_t *x, fake_event_t *best)
{
    if (next_at(x) <= kvp_clock_now(x->clock))
        earliest_of(x, true, best);
}

/* Repeatedly apply the earliest due event: O(transfers) per event, no
 * allocation on the way (progress must not fail). */
bool fake__apply_due(kvp_fake_fabric_t *f, fake_xport_t *only)
{
    bool any = false;
    for (;;) {
        fake_event_t best = {0};
        if (only) {
            earliest_due(only, &best);
        } else {
            for (uint32_t i = 0; i < f->n_eps; i++)
                if (f->eps[i])
                    earliest_due(f->eps[i], &best);
        }
        if (!best.xf)
            return any;
        any = true;
        if (best.type == 0)
            apply_copy(f, best.x, best.xf, kvp_clock_now(best.x->clock));
        else
            apply_terminal(best.x, best.xf);
        fake__maybe_free(best.x, best.xf);
    }
}

uint64_t fake__next_event(fake_xport_t *x)
{
    return next_at(x);
}

uint64_t fake__quiet_until(fake_xport_t *x)
{
    return x->n_reportable > 0 ? 0 : next_at(x);
}

uint64_t fake__fence(kvp_fake_fabric_t *f, uint32_t src_ep, uint32_t dst_ep)
{
    fake_xport_t *src = fake__fabric_ep(f, src_ep);
    uint64_t n = 0;
    if (!src)
        return 0;
    kvp_list_t *pos, *tmp;
    kvp_list_foreach_safe(pos, tmp, &src->xfers)
    {
        fake_xfer_t *xf = KVP_CONTAINER_OF(pos, fake_xfer_t, link);
        if (xf->dst_ep == dst_ep && fake__copy_pending(xf) && !xf->fenced) {
            xf->fenced = true;
            n++;
        }
    }
    kvp_list_foreach_safe(pos, tmp, &src->peers)
    {
        fake_peer_t *p = KVP_CONTAINER_OF(pos, fake_peer_t, link);
        if (p->remote_ep == dst_ep)
            p->remote_fenced = true;
    }
    return n;
}

/* ------------------------------------------------------------ public API */

/* Refresh next_cache and quiet_cache if something changed. Lock held. */
static void fabric_cache(kvp_fake_fabric_t *f)
{
    if (!f->cache_dirty)
        return;
    uint64_t next = KVP_FAKE_NEVER, quiet = KVP_FAKE_NEVER;
    for (uint32_t i = 0; i < f->n_eps; i++)
        if (f->eps[i]) {
            next = KVP_MIN(next, fake__next_event(f->eps[i]));
            quiet = KVP_MIN(quiet, fake__quiet_until(f->eps[i]));
        }
    f->next_cache = next;
    f->quiet_cache = quiet;
    f->cache_dirty = false;
    __atomic_store_n(&f->next_hint, f->mixed_clocks ? 0 : next, __ATOMIC_RELAXED);
    __atomic_store_n(&f->quiet_hint, quiet, __ATOMIC_RELAXED);
}

bool kvp_fake_fabric_progress(kvp_fake_fabric_t *f)
{
    bool any = false;
    uint64_t hint = __atomic_load_n(&f->next_hint, __ATOMIC_RELAXED);
    if (hint != 0 && hint > kvp_clock_now(f->clock))
        return false; /* nothing due anywhere: what the locked path finds */
    pthread_mutex_lock(&f->mu);
    /* On one clock, no transport has an event due unless the earliest is. */
    if (f->mixed_clocks || (fabric_cache(f), f->next_cache <= kvp_clock_now(f->clock)))
        any = fake__apply_due(f, NULL);
    pthread_mutex_unlock(&f->mu);
    return any;
}

/* One of the cached times: its lock-free hint while set, else recomputed
 * under the lock. */
static uint64_t fabric_cached(kvp_fake_fabric_t *f, const uint64_t *hint, const uint64_t *cache)
{
    uint64_t h = __atomic_load_n(hint, __ATOMIC_RELAXED);
    if (h != 0)
        return h;
    pthread_mutex_lock(&f->mu);
    fabric_cache(f);
    uint64_t t = *cache;
    pthread_mutex_unlock(&f->mu);
    return t;
}

uint64_t kvp_fake_fabric_quiet_until(kvp_fake_fabric_t *f)
{
    return fabric_cached(f, &f->quiet_hint, &f->quiet_cache);
}

uint64_t kvp_fake_fabric_next_event_ns(kvp_fake_fabric_t *f)
{
    return fabric_cached(f, &f->next_hint, &f->next_cache);
}

size_t kvp_fake_violations(kvp_fake_fabric_t *f, const kvp_fake_violation_t **list)
{
    pthread_mutex_lock(&f->mu);
    size_t n = f->n_viol + f->viol_lost;
    if (list)
        *list = f->viol;
    pthread_mutex_unlock(&f->mu);
    return n;
}

void kvp_fake_violations_clear(kvp_fake_fabric_t *f)
{
    pthread_mutex_lock(&f->mu);
    f->n_viol = 0;
    f->viol_lost = 0;
    pthread_mutex_unlock(&f->mu);
}
