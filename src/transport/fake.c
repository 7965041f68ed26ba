/*
 * fake.c -- the fake data transport's ops (SPEC §6 "fake"): peers, writes
 * driven by scripts, poll/cancel/retire/fence semantics of transport.h, and
 * the call log. Time-ordered event application and the landing checker live
 * in fake_fabric.c.
 */
#include "transport/fake_int.h"

#include <string.h>

#define FAKE_MAGIC 0x4650564bu /* "KVPF" */
#define FAKE_VERSION 1u
#define FAKE_CALL_LOG_DEFAULT 65536u

static const char *pfx(const fake_xport_t *x)
{
    return x->base.log_prefix;
}

static void lock(fake_xport_t *x)
{
    pthread_mutex_lock(&x->fab->mu);
}

static void unlock(fake_xport_t *x)
{
    pthread_mutex_unlock(&x->fab->mu);
}

static uint64_t now_of(const fake_xport_t *x)
{
    return kvp_clock_now(x->clock);
}

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
static fake_peer_t *peer_live(fake_xport_t *x, kvp_xpeer_id_t id)
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
    KVP_DEBUG(pfx(x), "fake: peer %llu endpoint released", (unsigned long long)p->id);
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

static fake_xfer_t *xfer_tracked(fake_xport_t *x, kvp_xfer_id_t id)
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
        KVP_WARN(pfx(x), "fake add_peer: blob length %zu != %u", len, FAKE_BLOB_LEN);
        return KVP_ERR_INVALID;
    }
    if (get32(b) != FAKE_MAGIC || get32(b + 28) != blob_check(b)) {
        KVP_WARN(pfx(x), "fake add_peer: bad blob magic or check");
        return KVP_ERR_INVALID;
    }
    uint32_t ver = get32(b + 4);
    if ((ver & 0xffffu) != FAKE_VERSION || ver >> 16 != FAKE_BLOB_LEN) {
        KVP_WARN(pfx(x), "fake add_peer: blob version %u (want %u)", ver & 0xffffu, FAKE_VERSION);
        return KVP_ERR_INCOMPATIBLE;
    }
    uint64_t fid = (uint64_t)get32(b + 8) | (uint64_t)get32(b + 12) << 32;
    if (fid != x->fab->fabric_id) {
        KVP_WARN(pfx(x), "fake add_peer: blob of another fabric");
        return KVP_ERR_INVALID;
    }
    *ep = get32(b + 16);
    lay->num_blocks = get32(b + 20);
    lay->block_size = get32(b + 24);
    if (lay->num_blocks != expect->num_blocks || lay->block_size != expect->block_size ||
        lay->block_size != x->layout.block_size) {
        KVP_WARN(pfx(x), "fake add_peer: blob layout %u x %u, advertised %u x %u, ours bs %u",
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
    lock(x);
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
    unlock(x);
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
        KVP_WARN(pfx(x), "fake add_peer: endpoint %u is closed", ep);
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
    lock(x);
    kvp_status_t st = add_peer_locked(x, blob, len, expect, out);
    unlock(x);
    return st;
}

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
            KVP_WARN(pfx(x), "fake write: block %zu index out of range (src %u/%u, dst %u/%u)", i,
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
    uint64_t now = now_of(x);
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

static kvp_status_t write_locked(fake_xport_t *x, kvp_xpeer_id_t peer,
                                 const kvp_xfer_block_t *blocks, size_t n, kvp_xfer_id_t *out)
{
    fake_peer_t *p = peer_live(x, peer);
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
    if (st != KVP_OK) {
        kvp_fake_call_t c = {.kind = KVP_FAKE_CALL_WRITE_REFUSED,
                             .peer = peer,
                             .status = st,
                             .n_blocks = (uint32_t)n};
        fake__log_call(x, &c, NULL);
        return st;
    }
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
        kvp_fake_call_t c = {.kind = KVP_FAKE_CALL_WRITE_REFUSED,
                             .peer = peer,
                             .status = KVP_ERR_NOMEM,
                             .n_blocks = (uint32_t)n};
        fake__log_call(x, &c, NULL);
        return KVP_ERR_NOMEM;
    }
    script_pop(x);
    script_apply(x, xf, &s);
    /* Posted through an endpoint the consumer already fenced: nothing of it
     * lands (it still ends as scripted; the source cannot tell). */
    xf->fenced = p->remote_fenced;
    x->ctr.posted_fenced += xf->fenced;
    if (xf->fenced)
        KVP_DEBUG(pfx(x), "fake: transfer %llu posted through peer %llu, fenced by the consumer: "
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

static kvp_status_t fake_write(kvp_xport_t *xp, kvp_xpeer_id_t peer, const kvp_xfer_block_t *blocks,
                               size_t n, kvp_xfer_id_t *out)
{
    fake_xport_t *x = fake__x(xp);
    if (!blocks || n == 0 || n > UINT32_MAX || !out)
        return KVP_ERR_INVALID;
    if (!x->registered)
        return KVP_ERR_STATE;
    lock(x);
    kvp_status_t st = write_locked(x, peer, blocks, n, out);
    unlock(x);
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

static kvp_status_t fake_poll(kvp_xport_t *xp, kvp_xpeer_id_t peer, kvp_xfer_result_t *out,
                              size_t cap, size_t *n_out)
{
    fake_xport_t *x = fake__x(xp);
    if ((!out && cap) || !n_out)
        return KVP_ERR_INVALID;
    lock(x);
    kvp_status_t st = KVP_ERR_NOT_FOUND;
    if (peer_live(x, peer)) {
        size_t k = reap(x, false, peer, out, cap);
        if (k)
            fake__log_simple(x, KVP_FAKE_CALL_POLL, peer, 0, KVP_OK, k);
        *n_out = k;
        st = KVP_OK;
    }
    unlock(x);
    return st;
}

static kvp_status_t fake_poll_retired(kvp_xport_t *xp, kvp_xfer_result_t *out, size_t cap,
                                      size_t *n_out)
{
    fake_xport_t *x = fake__x(xp);
    if ((!out && cap) || !n_out)
        return KVP_ERR_INVALID;
    if (__atomic_load_n(&x->n_reportable, __ATOMIC_RELAXED) == 0) {
        *n_out = 0; /* what reap() answers at once, without the lock */
        return KVP_OK;
    }
    lock(x);
    *n_out = reap(x, true, 0, out, cap);
    unlock(x);
    return KVP_OK;
}

static kvp_status_t cancel_locked(fake_xport_t *x, const kvp_xfer_id_t *ids, size_t n,
                                  kvp_cancel_mode_t mode, kvp_xfer_id_t *still, size_t *n_running)
{
    for (size_t i = 0; i < n; i++)
        if (!xfer_tracked(x, ids[i]))
            return KVP_ERR_NOT_FOUND; /* nothing changed */
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        fake_xfer_t *xf = xfer_tracked(x, ids[i]);
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

static kvp_status_t fake_cancel(kvp_xport_t *xp, const kvp_xfer_id_t *ids, size_t n,
                                kvp_cancel_mode_t mode, kvp_xfer_id_t *still_running,
                                size_t *n_running)
{
    fake_xport_t *x = fake__x(xp);
    if ((!ids && n) || (mode != KVP_CANCEL_IMMEDIATE && mode != KVP_CANCEL_WAIT))
        return KVP_ERR_INVALID;
    if (mode == KVP_CANCEL_WAIT && (!still_running || !n_running))
        return KVP_ERR_INVALID;
    lock(x);
    kvp_status_t st = cancel_locked(x, ids, n, mode, still_running, n_running);
    unlock(x);
    return st;
}

/* -------------------------------------------------- retire, force, fence */

static kvp_status_t fake_remove_peer(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    fake_xport_t *x = fake__x(xp);
    lock(x);
    fake_peer_t *p = peer_live(x, peer);
    if (!p) {
        unlock(x);
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
    unlock(x);
    return KVP_OK;
}

static kvp_status_t fake_force_release_retired(kvp_xport_t *xp, const kvp_xfer_id_t *ids, size_t n)
{
    fake_xport_t *x = fake__x(xp);
    if (!ids && n)
        return KVP_ERR_INVALID;
    lock(x);
    for (size_t i = 0; i < n; i++) {
        fake_xfer_t *xf = xfer_tracked(x, ids[i]);
        if (!xf || !xf->retired) {
            unlock(x);
            return KVP_ERR_NOT_FOUND; /* nothing released */
        }
    }
    for (size_t i = 0; i < n; i++) {
        fake_xfer_t *xf = xfer_tracked(x, ids[i]);
        if (!xf)
            continue;
        KVP_ERROR(pfx(x), "fake: force-releasing retired transfer %llu of peer %llu (%s)",
                  (unsigned long long)xf->id, (unsigned long long)xf->peer_id,
                  xf->terminal ? "terminal" : "still running");
        fake__log_simple(x, KVP_FAKE_CALL_FORCE_RELEASE, xf->peer_id, xf->id, KVP_OK, 0);
        x->st.force_released++;
        fake__release(x, xf);
    }
    unlock(x);
    return KVP_OK;
}

static kvp_status_t fake_fence_peer(kvp_xport_t *xp, kvp_xpeer_id_t peer, bool *proof)
{
    fake_xport_t *x = fake__x(xp);
    if (!proof)
        return KVP_ERR_INVALID;
    lock(x);
    fake_peer_t *p = peer_live(x, peer);
    if (!p) {
        unlock(x);
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
    unlock(x);
    *proof = fenceable;
    return KVP_OK;
}

static kvp_status_t fake_peer_status(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    fake_xport_t *x = fake__x(xp);
    lock(x);
    fake_peer_t *p = peer_live(x, peer);
    kvp_status_t st = !p ? KVP_ERR_NOT_FOUND : p->fenced ? KVP_ERR_CLOSED : p->status;
    unlock(x);
    return st;
}

static kvp_data_path_t fake_peer_path(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    fake_xport_t *x = fake__x(xp);
    lock(x);
    fake_peer_t *p = peer_live(x, peer);
    kvp_data_path_t path = p ? p->path : KVP_PATH_UNKNOWN;
    unlock(x);
    return path;
}

/* ------------------------------------------------------------- AM model */

static bool fake_inbound_refusable(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    fake_xport_t *x = fake__x(xp);
    lock(x);
    fake_peer_t *p = peer_live(x, peer);
    bool am = p && p->path == KVP_PATH_FAKE_AM;
    unlock(x);
    return am;
}

static kvp_status_t fake_expect(kvp_xport_t *xp, kvp_xpeer_id_t peer, const kvp_xslot_t *slots,
                                size_t n)
{
    fake_xport_t *x = fake__x(xp);
    if (n && !slots)
        return KVP_ERR_INVALID;
    lock(x);
    kvp_status_t st = KVP_OK;
    fake_peer_t *p = peer ? peer_live(x, peer) : NULL;
    if (!x->acc)
        st = KVP_OK; /* not the AM model: every copy lands, nothing to expect */
    else if (peer && !p)
        st = KVP_ERR_NOT_FOUND;
    for (size_t i = 0; st == KVP_OK && x->acc && i < n; i++)
        if (slots[i].slot >= x->layout.num_blocks)
            st = KVP_ERR_INVALID;
    for (size_t i = 0; st == KVP_OK && x->acc && i < n; i++)
        x->acc[slots[i].slot] = (fake_acc_t){peer, p ? p->remote_ep : 0, slots[i].gen, true, false};
    unlock(x);
    return st;
}

static void fake_refuse(kvp_xport_t *xp, const kvp_xslot_t *slots, size_t n)
{
    fake_xport_t *x = fake__x(xp);
    lock(x);
    for (size_t i = 0; x->acc && i < n; i++) {
        fake_acc_t *e = slots[i].slot < x->layout.num_blocks ? &x->acc[slots[i].slot] : NULL;
        if (e && e->expect && e->gen == slots[i].gen) {
            e->expect = false;
            x->st.am_refused_slots++;
        }
    }
    unlock(x);
}

static bool fake_is_landed(kvp_xport_t *xp, kvp_xslot_t s)
{
    fake_xport_t *x = fake__x(xp);
    lock(x);
    const fake_acc_t *e = x->acc && s.slot < x->layout.num_blocks ? &x->acc[s.slot] : NULL;
    bool landed = e && e->expect && e->gen == s.gen && e->landed;
    unlock(x);
    return landed;
}

/* -------------------------------------------------------------- progress */

static bool fake_progress(kvp_xport_t *xp)
{
    fake_xport_t *x = fake__x(xp);
    if (__atomic_load_n(&x->due_hint, __ATOMIC_RELAXED) > now_of(x))
        return false; /* nothing due: what fake__apply_due finds, without the lock */
    lock(x);
    bool any = fake__apply_due(x->fab, x);
    unlock(x);
    return any;
}

uint64_t kvp_fake_quiet_until(kvp_xport_t *xp)
{
    fake_xport_t *x = fake__x(xp);
    lock(x);
    uint64_t t = fake__quiet_until(x);
    unlock(x);
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
    lock(x);
    bool due = fake__next_event(x) <= now_of(x);
    unlock(x);
    return due ? KVP_ERR_BUSY : KVP_OK;
}

static void fake_get_stats(kvp_xport_t *xp, kvp_xport_stats_t *st)
{
    fake_xport_t *x = fake__x(xp);
    lock(x);
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
    unlock(x);
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
            KVP_ERROR(pfx(x), "fake close(force): transfer %llu still tracked%s",
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
        KVP_WARN(pfx(x), "fake close: %llu released transfers with a copy still scripted dropped",
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
    .write = fake_write,
    .poll = fake_poll,
    .cancel = fake_cancel,
    .remove_peer = fake_remove_peer,
    .poll_retired = fake_poll_retired,
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
