/*
 * fake.c -- the fake data transport's ops (SPEC §6 "fake"): peers, writes
 * driven by scripts, poll/cancel/retire/fence semantics of transport.h, and
 * the call log. Time-ordered event application and the landing checker live
 * in fake_fabric.c, writes, poll and cancel in fake_xfer.c.
 */
#include "transport/fake_int.h"

#include <string.h>

#define FAKE_MAGIC 0x4650564bu /* "KVPF" */
#define FAKE_VERSION 1u
#define FAKE_CALL_LOG_DEFAULT 65536u

/* ----------------------------------------------------------------- peers */

fake_peer_t *fake__peer_any(fake_xport_t *x, kvp_xpeer_id_t id)
{
    kvp_list_t *pos, *tmp;
    kvp_list_foreach_safe(pos, tmp, &x->peers)
    {
        fake_peer_t *p = KVP_CONTAINER_OF(pos, fake_peer_t, link);
        if (p->id == id)
            return p;
    }
    return NULL;
}

/* A peer handle the caller may still use (not removed). */
fake_peer_t *fake__peer_live(fake_xport_t *x, kvp_xpeer_id_t id)
{
    fake_peer_t *p = id ? fake__peer_any(x, id) : NULL;
    return p && !p->removed ? p : NULL;
}

/* The deferred endpoint + remote key release: no retired transfer refers to
 * the peer any more. */
static void endpoint_release(fake_xport_t *x, fake_peer_t *p)
{
    KVP_ASSERT(p->removed && p->retired_refs == 0);
    fake__log_simple(x, KVP_FAKE_CALL_ENDPOINT_RELEASE, p->id, 0, KVP_OK, 0);
    KVP_DEBUG(fake__pfx(x), "fake: peer %llu endpoint released", (unsigned long long)p->id);
    kvp_list_remove(&p->link);
    kvp__free(p);
}

/* ------------------------------------------------------------- transfers */

void fake__maybe_free(fake_xport_t *x, fake_xfer_t *xf)
{
    if (xf->tracked || fake__copy_pending(xf))
        return;
    kvp_list_remove(&xf->link);
    kvp__free(xf->snap);
    kvp__free(xf);
}

/* Hand the id back to the caller for good. The transfer object may outlive
 * this if a copy is still scripted (a WRITE is not recalled by a release). */
void fake__release(fake_xport_t *x, fake_xfer_t *xf)
{
    KVP_ASSERT(xf->tracked);
    xf->tracked = false;
    if (xf->terminal)
        fake__reportable_add(x, -1);
    fake_peer_t *p = xf->peer;
    xf->peer = NULL;
    if (xf->retired) {
        KVP_ASSERT(p && p->retired_refs > 0);
        if (--p->retired_refs == 0 && p->removed)
            endpoint_release(x, p);
    }
    fake__maybe_free(x, xf);
}

static fake_xfer_t *xfer_find(fake_xport_t *x, kvp_xfer_id_t id)
{
    kvp_list_t *pos, *tmp;
    kvp_list_foreach_safe(pos, tmp, &x->xfers)
    {
        fake_xfer_t *xf = KVP_CONTAINER_OF(pos, fake_xfer_t, link);
        if (xf->id == id)
            return xf;
    }
    return NULL;
}

fake_xfer_t *fake__xfer_tracked(fake_xport_t *x, kvp_xfer_id_t id)
{
    fake_xfer_t *xf = xfer_find(x, id);
    return xf && xf->tracked ? xf : NULL;
}

/* ------------------------------------------------------------------ blob */

static void put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t blob_check(const unsigned char *b)
{
    return (uint32_t)kvp_hash64(b, 28, FAKE_MAGIC);
}

/* magic u32 | version u16 | length u16 | fabric id u64 | ep u32 |
 * num_blocks u32 | block_size u32 | check u32, little-endian. */
static void blob_build(fake_xport_t *x)
{
    unsigned char *b = x->blob;
    put32(b, FAKE_MAGIC);
    put32(b + 4, FAKE_VERSION | FAKE_BLOB_LEN << 16);
    put32(b + 8, (uint32_t)x->fab->fabric_id);
    put32(b + 12, (uint32_t)(x->fab->fabric_id >> 32));
    put32(b + 16, x->ep);
    put32(b + 20, x->layout.num_blocks);
    put32(b + 24, x->layout.block_size);
    put32(b + 28, blob_check(b));
}

/* Decode and validate a peer's blob; logs the observed cause. */
static kvp_status_t blob_parse(fake_xport_t *x, const unsigned char *b, size_t len,
                               const kvp_layout_t *expect, uint32_t *ep, kvp_layout_t *lay)
{
    if (len != FAKE_BLOB_LEN) {
        KVP_WARN(fake__pfx(x), "fake add_peer: blob length %zu != %u", len, FAKE_BLOB_LEN);
        return KVP_ERR_INVALID;
    }
    if (get32(b) != FAKE_MAGIC || get32(b + 28) != blob_check(b)) {
        KVP_WARN(fake__pfx(x), "fake add_peer: bad blob magic or check");
        return KVP_ERR_INVALID;
    }
    uint32_t ver = get32(b + 4);
    if ((ver & 0xffffu) != FAKE_VERSION || ver >> 16 != FAKE_BLOB_LEN) {
        KVP_WARN(fake__pfx(x),
                 "fake add_peer: blob version %u (want %u)", ver & 0xffffu, FAKE_VERSION);
        return KVP_ERR_INCOMPATIBLE;
    }
    uint64_t fid = (uint64_t)get32(b + 8) | (uint64_t)get32(b + 12) << 32;
    if (fid != x->fab->fabric_id) {
        KVP_WARN(fake__pfx(x), "fake add_peer: blob of another fabric");
        return KVP_ERR_INVALID;
    }
    *ep = get32(b + 16);
    lay->num_blocks = get32(b + 20);
    lay->block_size = get32(b + 24);
    if (lay->num_blocks != expect->num_blocks || lay->block_size != expect->block_size ||
        lay->block_size != x->layout.block_size) {
        KVP_WARN(fake__pfx(x), "fake add_peer: blob layout %u x %u, advertised %u x %u, ours bs %u",
                 lay->num_blocks, lay->block_size, expect->num_blocks, expect->block_size,
                 x->layout.block_size);
        return KVP_ERR_INCOMPATIBLE;
    }
    return KVP_OK;
}

/* ---------------------------------------------------------------- region */

static kvp_status_t fake_register_region(kvp_xport_t *xp, void *base, size_t len,
                                         const kvp_layout_t *layout, void **base_out)
{
    fake_xport_t *x = fake__x(xp);
    if (!base)
        return KVP_ERR_UNSUPPORTED; /* no CAP_ALLOCATES_REGION: the node maps it */
    if (!layout || !layout->num_blocks || !layout->block_size ||
        len / layout->block_size < layout->num_blocks)
        return KVP_ERR_INVALID;
    if (x->store && (kvp_store_num_blocks(x->store) != layout->num_blocks ||
                     kvp_store_block_size(x->store) != layout->block_size))
        return KVP_ERR_INVALID;
    fake__lock(x);
    kvp_status_t st = KVP_ERR_STATE;
    if (!x->registered) {
        x->registered = true;
        x->region = base;
        x->region_len = len;
        x->layout = *layout;
        blob_build(x);
        st = KVP_OK;
        if (x->default_path == KVP_PATH_FAKE_AM &&
            (x->acc = kvp__calloc(layout->num_blocks, sizeof(*x->acc))) == NULL) {
            x->registered = false;
            st = KVP_ERR_NOMEM;
        }
    }
    fake__unlock(x);
    if (st == KVP_OK && base_out)
        *base_out = base;
    return st;
}

static kvp_status_t fake_local_blob(kvp_xport_t *xp, const void **blob, size_t *len)
{
    fake_xport_t *x = fake__x(xp);
    if (!blob || !len)
        return KVP_ERR_INVALID;
    if (!x->registered)
        return KVP_ERR_STATE;
    *blob = x->blob;
    *len = FAKE_BLOB_LEN;
    return KVP_OK;
}

static kvp_status_t add_peer_locked(fake_xport_t *x, const void *blob, size_t len,
                                    const kvp_layout_t *expect, kvp_xpeer_id_t *out)
{
    uint32_t ep;
    kvp_layout_t lay;
    kvp_status_t st = blob_parse(x, blob, len, expect, &ep, &lay);
    if (st != KVP_OK)
        return st;
    if (!fake__fabric_ep(x->fab, ep)) {
        KVP_WARN(fake__pfx(x), "fake add_peer: endpoint %u is closed", ep);
        return KVP_ERR_UNREACHABLE;
    }
    fake_peer_t *p = kvp__calloc(1, sizeof(*p));
    if (!p)
        return KVP_ERR_NOMEM;
    p->id = x->fab->next_id++;
    p->remote_ep = ep;
    p->layout = lay;
    p->path = x->default_path;
    p->status = KVP_OK;
    kvp_list_insert_tail(&x->peers, &p->link);
    fake__log_simple(x, KVP_FAKE_CALL_ADD_PEER, p->id, 0, KVP_OK, ep);
    *out = p->id;
    return KVP_OK;
}

static kvp_status_t fake_add_peer(kvp_xport_t *xp, const void *blob, size_t len,
                                  const kvp_layout_t *expect, kvp_xpeer_id_t *out)
{
    fake_xport_t *x = fake__x(xp);
    if (!blob || !expect || !out)
        return KVP_ERR_INVALID;
    if (!x->registered)
        return KVP_ERR_STATE;
    fake__lock(x);
    kvp_status_t st = add_peer_locked(x, blob, len, expect, out);
    fake__unlock(x);
    return st;
}

/* -------------------------------------------------- retire, force, fence */

static kvp_status_t fake_remove_peer(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    fake_xport_t *x = fake__x(xp);
    fake__lock(x);
    fake_peer_t *p = fake__peer_live(x, peer);
    if (!p) {
        fake__unlock(x);
        return KVP_ERR_NOT_FOUND;
    }
    kvp_list_t *pos, *tmp;
    kvp_list_foreach_safe(pos, tmp, &x->xfers)
    {
        fake_xfer_t *xf = KVP_CONTAINER_OF(pos, fake_xfer_t, link);
        if (xf->tracked && xf->peer == p) {
            xf->retired = true; /* poll() of any peer never reports it again */
            p->retired_refs++;
        }
    }
    p->removed = true;
    fake__log_simple(x, KVP_FAKE_CALL_REMOVE_PEER, peer, 0, KVP_OK, p->retired_refs);
    if (p->retired_refs == 0)
        endpoint_release(x, p);
    fake__unlock(x);
    return KVP_OK;
}

static kvp_status_t fake_force_release_retired(kvp_xport_t *xp, const kvp_xfer_id_t *ids, size_t n)
{
    fake_xport_t *x = fake__x(xp);
    if (!ids && n)
        return KVP_ERR_INVALID;
    fake__lock(x);
    for (size_t i = 0; i < n; i++) {
        fake_xfer_t *xf = fake__xfer_tracked(x, ids[i]);
        if (!xf || !xf->retired) {
            fake__unlock(x);
            return KVP_ERR_NOT_FOUND; /* nothing released */
        }
    }
    for (size_t i = 0; i < n; i++) {
        fake_xfer_t *xf = fake__xfer_tracked(x, ids[i]);
        if (!xf)
            continue;
        KVP_ERROR(fake__pfx(x), "fake: force-releasing retired transfer %llu of peer %llu (%s)",
                  (unsigned long long)xf->id, (unsigned long long)xf->peer_id,
                  xf->terminal ? "terminal" : "still running");
        fake__log_simple(x, KVP_FAKE_CALL_FORCE_RELEASE, xf->peer_id, xf->id, KVP_OK, 0);
        x->st.force_released++;
        fake__release(x, xf);
    }
    fake__unlock(x);
    return KVP_OK;
}

static kvp_status_t fake_fence_peer(kvp_xport_t *xp, kvp_xpeer_id_t peer, bool *proof)
{
    fake_xport_t *x = fake__x(xp);
    if (!proof)
        return KVP_ERR_INVALID;
    fake__lock(x);
    fake_peer_t *p = fake__peer_live(x, peer);
    if (!p) {
        fake__unlock(x);
        return KVP_ERR_NOT_FOUND;
    }
    bool fenceable = p->path == KVP_PATH_FAKE_FENCEABLE;
    uint64_t dropped = fenceable ? fake__fence(x->fab, p->remote_ep, x->ep) : 0;
    if (p->path == KVP_PATH_FAKE_AM) { /* refuse what this handle expects: proof */
        for (uint32_t i = 0; i < x->layout.num_blocks; i++)
            if (x->acc[i].expect && x->acc[i].peer == peer) {
                x->acc[i].expect = false;
                x->st.am_refused_slots++;
            }
        fenceable = true;
    }
    p->fenced = true;
    fake__log_simple(x, KVP_FAKE_CALL_FENCE, peer, 0, fenceable ? KVP_OK : KVP_ERR_UNSUPPORTED,
                     dropped);
    fake__unlock(x);
    *proof = fenceable;
    return KVP_OK;
}

static kvp_status_t fake_peer_status(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    fake_xport_t *x = fake__x(xp);
    fake__lock(x);
    fake_peer_t *p = fake__peer_live(x, peer);
    kvp_status_t st = !p ? KVP_ERR_NOT_FOUND : p->fenced ? KVP_ERR_CLOSED : p->status;
    fake__unlock(x);
    return st;
}

static kvp_data_path_t fake_peer_path(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    fake_xport_t *x = fake__x(xp);
    fake__lock(x);
    fake_peer_t *p = fake__peer_live(x, peer);
    kvp_data_path_t path = p ? p->path : KVP_PATH_UNKNOWN;
    fake__unlock(x);
    return path;
}

/* ------------------------------------------------------------- AM model */

static bool fake_inbound_refusable(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    fake_xport_t *x = fake__x(xp);
    fake__lock(x);
    fake_peer_t *p = fake__peer_live(x, peer);
    bool am = p && p->path == KVP_PATH_FAKE_AM;
    fake__unlock(x);
    return am;
}

static kvp_status_t fake_expect(kvp_xport_t *xp, kvp_xpeer_id_t peer, const kvp_xslot_t *slots,
                                size_t n)
{
    fake_xport_t *x = fake__x(xp);
    if (n && !slots)
        return KVP_ERR_INVALID;
    fake__lock(x);
    kvp_status_t st = KVP_OK;
    fake_peer_t *p = peer ? fake__peer_live(x, peer) : NULL;
    if (!x->acc)
        st = KVP_OK; /* not the AM model: every copy lands, nothing to expect */
    else if (peer && !p)
        st = KVP_ERR_NOT_FOUND;
    for (size_t i = 0; st == KVP_OK && x->acc && i < n; i++)
        if (slots[i].slot >= x->layout.num_blocks)
            st = KVP_ERR_INVALID;
    for (size_t i = 0; st == KVP_OK && x->acc && i < n; i++)
        x->acc[slots[i].slot] = (fake_acc_t){peer, p ? p->remote_ep : 0, slots[i].gen, true, false};
    fake__unlock(x);
    return st;
}

static void fake_refuse(kvp_xport_t *xp, const kvp_xslot_t *slots, size_t n)
{
    fake_xport_t *x = fake__x(xp);
    fake__lock(x);
    for (size_t i = 0; x->acc && i < n; i++) {
        fake_acc_t *e = slots[i].slot < x->layout.num_blocks ? &x->acc[slots[i].slot] : NULL;
        if (e && e->expect && e->gen == slots[i].gen) {
            e->expect = false;
            x->st.am_refused_slots++;
        }
    }
    fake__unlock(x);
}

static bool fake_is_landed(kvp_xport_t *xp, kvp_xslot_t s)
{
    fake_xport_t *x = fake__x(xp);
    fake__lock(x);
    const fake_acc_t *e = x->acc && s.slot < x->layout.num_blocks ? &x->acc[s.slot] : NULL;
    bool landed = e && e->expect && e->gen == s.gen && e->landed;
    fake__unlock(x);
    return landed;
}

/* -------------------------------------------------------------- progress */

static bool fake_progress(kvp_xport_t *xp)
{
    fake_xport_t *x = fake__x(xp);
    if (__atomic_load_n(&x->due_hint, __ATOMIC_RELAXED) > fake__now_of(x))
        return false; /* nothing due: what fake__apply_due finds, without the lock */
    fake__lock(x);
    bool any = fake__apply_due(x->fab, x);
    fake__unlock(x);
    return any;
}

uint64_t kvp_fake_quiet_until(kvp_xport_t *xp)
{
    fake_xport_t *x = fake__x(xp);
    fake__lock(x);
    uint64_t t = fake__quiet_until(x);
    fake__unlock(x);
    return t;
}

static int fake_event_fd(kvp_xport_t *xp)
{
    return -1;
}

/* KVP_ERR_BUSY while an event is already due (progress again). */
static kvp_status_t fake_arm(kvp_xport_t *xp)
{
    fake_xport_t *x = fake__x(xp);
    fake__lock(x);
    bool due = fake__next_event(x) <= fake__now_of(x);
    fake__unlock(x);
    return due ? KVP_ERR_BUSY : KVP_OK;
}

static void fake_get_stats(kvp_xport_t *xp, kvp_xport_stats_t *st)
{
    fake_xport_t *x = fake__x(xp);
    fake__lock(x);
    *st = x->st;
    st->inflight = st->retired = st->peers = st->zombie_peers = 0;
    kvp_list_t *pos, *tmp;
    kvp_list_foreach_safe(pos, tmp, &x->xfers)
    {
        fake_xfer_t *xf = KVP_CONTAINER_OF(pos, fake_xfer_t, link);
        if (xf->tracked && xf->retired)
            st->retired++;
        else if (xf->tracked)
            st->inflight++;
    }
    kvp_list_foreach_safe(pos, tmp, &x->peers)
    {
        fake_peer_t *p = KVP_CONTAINER_OF(pos, fake_peer_t, link);
        if (p->removed)
            st->zombie_peers++;
        else
            st->peers++;
    }
    fake__unlock(x);
}

/* ----------------------------------------------------------------- close */

static bool close_busy(fake_xport_t *x)
{
    kvp_list_t *pos, *tmp;
    kvp_list_foreach_safe(pos, tmp, &x->xfers)
    {
        if (KVP_CONTAINER_OF(pos, fake_xfer_t, link)->tracked)
            return true;
    }
    kvp_list_foreach_safe(pos, tmp, &x->peers)
    {
        if (KVP_CONTAINER_OF(pos, fake_peer_t, link)->removed)
            return true;
    }
    return false;
}

/* Free everything the transport owns. Untracked transfers whose copy is
 * still scripted die with the transport (counted); tracked ones only get
 * here with force (logged). */
static void free_all(fake_xport_t *x)
{
    kvp_list_t *pos, *tmp;
    kvp_list_foreach_safe(pos, tmp, &x->xfers)
    {
        fake_xfer_t *xf = KVP_CONTAINER_OF(pos, fake_xfer_t, link);
        if (xf->tracked)
            KVP_ERROR(fake__pfx(x), "fake close(force): transfer %llu still tracked%s",
                      (unsigned long long)xf->id, xf->retired ? " (retired)" : "");
        else if (fake__copy_pending(xf))
            x->ctr.dropped_at_close++;
        kvp_list_remove(&xf->link);
        kvp__free(xf->snap);
        kvp__free(xf);
    }
    fake__events_changed(x);
    fake__reportable_add(x, 0);
    kvp_list_foreach_safe(pos, tmp, &x->peers)
    {
        kvp_list_remove(pos);
        kvp__free(KVP_CONTAINER_OF(pos, fake_peer_t, link));
    }
    kvp_list_foreach_safe(pos, tmp, &x->scripts)
    {
        kvp_list_remove(pos);
        kvp__free(KVP_CONTAINER_OF(pos, fake_script_node_t, link));
    }
    for (size_t i = 0; i < x->n_calls; i++)
        kvp__free((void *)x->calls[i].blocks);
    kvp__free(x->calls);
    kvp__free(x->acc);
}

static kvp_status_t fake_close(kvp_xport_t *xp, bool force)
{
    fake_xport_t *x = fake__x(xp);
    kvp_fake_fabric_t *f = x->fab;
    pthread_mutex_lock(&f->mu);
    if (!force && close_busy(x)) {
        fake__log_simple(x, KVP_FAKE_CALL_CLOSE, 0, 0, KVP_ERR_BUSY, 0);
        pthread_mutex_unlock(&f->mu);
        return KVP_ERR_BUSY;
    }
    free_all(x);
    fake__exit_free_all(x);
    if (x->ctr.dropped_at_close)
        KVP_WARN(fake__pfx(x),
                 "fake close: %llu released transfers with a copy still scripted dropped",
                 (unsigned long long)x->ctr.dropped_at_close);
    fake__fabric_detach(f, x);
    pthread_mutex_unlock(&f->mu);
    kvp__free(x);
    return KVP_OK;
}

/* ------------------------------------------------------------- the table */

const kvp_xport_ops_t kvp_fake_ops = {
    .name = "fake",
    .caps = KVP_XPORT_CAP_FENCE,
    .register_region = fake_register_region,
    .local_blob = fake_local_blob,
    .add_peer = fake_add_peer,
    .write = fake__write,
    .poll = fake__poll,
    .cancel = fake__cancel,
    .remove_peer = fake_remove_peer,
    .poll_retired = fake__poll_retired,
    .force_release_retired = fake_force_release_retired,
    .fence_peer = fake_fence_peer,
    .peer_status = fake_peer_status,
    .peer_path = fake_peer_path,
    .exit_hold = fake__exit_hold,
    .exit_drop = fake__exit_drop,
    .exit_proven = fake__exit_proven,
    .inbound_refusable = fake_inbound_refusable,
    .expect = fake_expect,
    .refuse = fake_refuse,
    .is_landed = fake_is_landed,
    .progress = fake_progress,
    .event_fd = fake_event_fd,
    .arm = fake_arm,
    .get_stats = fake_get_stats,
    .close = fake_close,
};

bool kvp_xport_is_fake(const kvp_xport_t *x)
{
    return x && x->ops == &kvp_fake_ops;
}

kvp_status_t kvp_fake_create(const kvp_fake_config_t *cfg, kvp_xport_t **out)
{
    if (!cfg || !cfg->fabric || !out)
        return KVP_ERR_INVALID;
    kvp_data_path_t path = cfg->default_path ? cfg->default_path : KVP_PATH_FAKE_FENCEABLE;
    if (path != KVP_PATH_FAKE_FENCEABLE && path != KVP_PATH_FAKE_UNFENCEABLE &&
        path != KVP_PATH_FAKE_AM)
        return KVP_ERR_INVALID;
    fake_xport_t *x = kvp__calloc(1, sizeof(*x));
    if (!x)
        return KVP_ERR_NOMEM;
    x->base.ops = &kvp_fake_ops;
    x->base.log_prefix = cfg->log_prefix;
    x->fab = cfg->fabric;
    x->clock = cfg->clock ? cfg->clock : cfg->fabric->clock;
    x->store = cfg->store;
    x->default_path = path;
    x->default_delay_ns = cfg->default_delay_ns;
    x->delay_jitter_ns = cfg->delay_jitter_ns;
    x->next_at = KVP_FAKE_NEVER; /* no transfer yet */
    x->due_hint = KVP_FAKE_NEVER;
    kvp_rng_seed(&x->rng, cfg->rng_seed);
    x->max_calls = cfg->call_log_max ? cfg->call_log_max : FAKE_CALL_LOG_DEFAULT;
    kvp_list_init(&x->peers);
    kvp_list_init(&x->exitw);
    kvp_list_init(&x->xfers);
    kvp_list_init(&x->scripts);
    pthread_mutex_lock(&x->fab->mu);
    kvp_status_t st = fake__fabric_attach(x->fab, x);
    pthread_mutex_unlock(&x->fab->mu);
    if (st != KVP_OK) {
        kvp__free(x);
        return st;
    }
    *out = &x->base;
    return KVP_OK;
}
