/*
 * ucx_xfer.c -- the UCX backend's transfer records (ucx.c's header gives
 * their life, `where`): the pool, the WRITE path (RMA puts + flush, or AM
 * sends), poll, cancel and the retired records of removed peers.
 * kvp__ucx_xfer_set_where is the one writer of a record's `where`.
 */
#include "transport/ucx_int.h"

#include <stdio.h>
#include <string.h>

/* ----------------------------------------------------------------- write */

/* At most this many bytes per ucp_put_nbx. A direct shared-memory put is a
 * memcpy on the calling (node) thread, and glibc 2.36 copies up to about the
 * L2 size with `rep movsb` but larger pieces with a vector loop that is
 * slower on cold regions: here 10.3 GB/s in 64-256 KiB pieces against
 * 7.5-8.6 GB/s in 1-16 MiB pieces (same bytes, 256 MiB regions, issue 17).
 * Merged runs of adjacent slots (and blocks larger than this) therefore go
 * as several puts of at most UCX_PUT_MAX_BYTES, under the transfer's one
 * flush; the per-put cost is a few hundred ns against ~25 us of copy. */
#define UCX_PUT_MAX_BYTES ((size_t)256 << 10)

/* A transfer of at least this many bytes on a direct-shm path is copied by
 * us with streaming stores (kvp_copy_stream) into the peer's region mapped
 * here, instead of by UCX's memcpy: the same one-sided copy into the same
 * mapping that ucp_put_nbx makes on this path (which gives no fence proof
 * either way, ucx_fence_peer), without reading every destination line
 * into the cache first (common/copy.c). Smaller transfers keep UCX's
 * cached copy: their consumer may read them while still cached. */
#define UCX_STREAM_MIN_BYTES ((size_t)1 << 20)

/* The record's life (ucx.c's header): each allowed move of `where`, the
 * one writer of it (the UCX tcp endpoint's state table, in spirit). */
static const char *const where_names[] = {
    [XF_FREE] = "FREE", [XF_LIVE] = "LIVE", [XF_RETIRED] = "RETIRED", [XF_DETACHED] = "DETACHED"};

const char *kvp__ucx_where_str(uint8_t where)
{
    return where < KVP_ARRAY_SIZE(where_names) ? where_names[where] : "?";
}

static bool where_move_ok(uint8_t from, uint8_t to)
{
    switch (to) {
    case XF_LIVE:
        return from == XF_FREE;
    case XF_RETIRED:
        return from == XF_LIVE;
    case XF_DETACHED:
        return from == XF_LIVE || from == XF_RETIRED;
    case XF_FREE:
        return from != XF_FREE;
    default:
        return false;
    }
}

void kvp__ucx_xfer_set_where(ucx_xfer_t *r, uint8_t to)
{
    if (!where_move_ok(r->where, to))
        kvp__assert_fail(kvp__ucx_where_str(to), __FILE__, __LINE__, kvp__ucx_where_str(r->where));
    r->where = to;
}

static ucx_xfer_t *ucx_xfer_find(ucx_xport_t *x, kvp_xfer_id_t id)
{
    uint64_t idx = id & UCX_IDX_MASK;

    if (idx == 0 || idx > x->pool_cap)
        return NULL;
    ucx_xfer_t *r = &x->pool[idx - 1];
    return (r->where != XF_FREE && r->id == id) ? r : NULL;
}

static ucx_xfer_t *ucx_xfer_get(ucx_xport_t *x, ucx_peer_t *p)
{
    if (kvp_list_empty(&x->free_list))
        return NULL;
    kvp_list_t *n = x->free_list.next;
    kvp_list_remove(n);
    ucx_xfer_t *r = KVP_CONTAINER_OF(n, ucx_xfer_t, link);
    uint64_t idx = (uint64_t)(r - x->pool) + 1;
    r->id = (++x->next_seq << UCX_IDX_BITS) | idx;
    r->peer = p;
    r->pending = 0;
    r->first_err = UCS_OK;
    r->err_seq = p->err_seq;
    kvp__ucx_xfer_set_where(r, XF_LIVE);
    p->refs++;
    return r;
}

/* Back to the pool. Only for pending == 0 (UCX owns nothing of it). Never
 * frees the peer here: a peer whose refs drop to 0 is reaped by progress()
 * or by the caller's public function, not inside a UCX callback. */
static void ucx_xfer_put(ucx_xport_t *x, ucx_xfer_t *r)
{
    KVP_ASSERT(r->pending == 0 && r->where != XF_FREE);
    kvp_list_remove(&r->link);
    KVP_ASSERT(r->peer->refs > 0);
    r->peer->refs--;
    r->peer = NULL;
    kvp__ucx_xfer_set_where(r, XF_FREE);
    r->id = 0;
    kvp_list_insert_tail(&x->free_list, &r->link);
}

/* Status of a terminal record, decided at hand-back time. */
static kvp_status_t ucx_xfer_result(const ucx_xfer_t *r)
{
    if (r->first_err != UCS_OK)
        return KVP_ERR_TRANSPORT;
    if (r->peer->err_seq != r->err_seq)
        return KVP_ERR_TRANSPORT; /* a flush can be "OK" for dropped data */
    return KVP_OK;
}

static void ucx_xfer_count(ucx_xport_t *x, kvp_status_t s)
{
    if (s == KVP_OK)
        x->st.done++;
    else
        x->st.failed++;
}

/* One UCX request (put or flush) of `r` completed. Runs inside
 * ucp_worker_progress (or ucp_ep_close_nbx FORCE) on the owner thread. */
static void ucx_req_cb(void *req, ucs_status_t status, void *user_data)
{
    ucp_request_free(req);
    kvp__ucx_xfer_step(user_data, status);
}

/* One request of r completed (a UCX request, or a piece of kvpeer's own tcp
 * stream: tcpd.h). */
void kvp__ucx_xfer_step(ucx_xfer_t *r, ucs_status_t status)
{
    if (status != UCS_OK && r->first_err == UCS_OK)
        r->first_err = status;
    KVP_ASSERT(r->pending > 0);
    if (r->x->destroying) { /* ucp_worker_destroy cancelling leftovers: peers are gone */
        r->pending--;
        return;
    }
    if (--r->pending > 0)
        return;
    if (r->where == XF_LIVE) {
        kvp_list_remove(&r->link);
        kvp_list_insert_tail(&r->peer->done, &r->link);
    } else if (r->where == XF_DETACHED) {
        ucx_xfer_put(r->x, r); /* tracking was released earlier */
    }                          /* RETIRED stays on x->retired; poll_retired finds pending == 0 */
}

/* Release tracking of `r` now; if UCX still owns requests the record waits
 * as DETACHED for the completion callback. */
void kvp__ucx_xfer_detach(ucx_xport_t *x, ucx_xfer_t *r)
{
    if (r->pending > 0)
        kvp__ucx_cma_drop(x, NULL, r, false); /* its write: no slice started now */
    if (r->pending == 0) {
        ucx_xfer_put(x, r);
        return;
    }
    kvp_list_remove(&r->link);
    kvp__ucx_xfer_set_where(r, XF_DETACHED);
    kvp_list_insert_tail(&x->detached, &r->link);
}

static kvp_status_t ucx_write_check(ucx_xport_t *x, const ucx_peer_t *p,
                                    const kvp_xfer_block_t *blocks, size_t n)
{
    if (x->region_kind == REGION_NONE)
        return KVP_ERR_STATE;
    if (p->status != KVP_OK || (!p->ep && !p->out))
        return p->status != KVP_OK ? p->status : KVP_ERR_CLOSED;
    if (p->layout.block_size != x->layout.block_size)
        return KVP_ERR_INCOMPATIBLE;
    for (size_t i = 0; i < n; i++)
        if (blocks[i].src_slot >= x->layout.num_blocks ||
            blocks[i].dst_slot >= p->layout.num_blocks)
            return KVP_ERR_INVALID;
    return KVP_OK;
}

/* Post one request for r; false when UCX refused it (r->first_err set). */
static bool ucx_post_done(ucx_xfer_t *r, ucs_status_ptr_t sp)
{
    if (UCS_PTR_IS_PTR(sp)) {
        r->pending++;
        return true;
    }
    if (UCS_PTR_IS_ERR(sp)) {
        if (r->first_err == UCS_OK)
            r->first_err = UCS_PTR_STATUS(sp);
        return false;
    }
    return true; /* completed in place (direct shm put) */
}

/* Puts for each run of adjacent (src, dst) slots, in pieces of at most
 * UCX_PUT_MAX_BYTES (or streaming copies, `stream`); stops at the first
 * refusal. Returns how many puts or copies were made. */
static size_t ucx_post_puts(ucx_xport_t *x, ucx_peer_t *p, ucx_xfer_t *r,
                            const kvp_xfer_block_t *blocks, size_t n,
                            const ucp_request_param_t *prm, bool stream)
{
    const size_t bs = x->layout.block_size;
    size_t posted = 0;

    for (size_t i = 0; i < n;) {
        size_t run = 1;
        while (i + run < n && blocks[i + run].src_slot == blocks[i].src_slot + run &&
               blocks[i + run].dst_slot == blocks[i].dst_slot + run)
            run++;
        const uint8_t *src = (const uint8_t *)x->region + (size_t)blocks[i].src_slot * bs;
        uint64_t dst = p->rbase + (uint64_t)blocks[i].dst_slot * bs;
        for (size_t off = 0, len = run * bs; off < len; off += UCX_PUT_MAX_BYTES) {
            size_t piece = KVP_MIN(len - off, UCX_PUT_MAX_BYTES);
            if (stream) { /* slots checked by ucx_write_check; p->rptr maps them all */
                kvp_copy_stream(p->rptr + (size_t)(dst - p->rbase) + off, src + off, piece);
                x->st.stream_copies++;
            } else {
                if (!ucx_post_done(r, ucp_put_nbx(p->ep_rma, src + off, piece, dst + off,
                                                  p->rkey, prm)))
                    return posted;
                x->st.puts++;
            }
            posted++;
        }
        i += run;
    }
    return posted;
}

/* Post the puts (and the flush) or the AM sends of r: how many were
 * posted; r ends on p->running, or on p->done if already complete. */
static size_t ucx_write_post(ucx_xport_t *x, ucx_peer_t *p, ucx_xfer_t *r,
                             const kvp_xfer_block_t *blocks, size_t n, bool am, bool cma)
{
    /* Linked and biased by one while posting, so a completion UCX might
     * deliver from inside a later post can never see pending reach 0. */
    kvp_list_insert_tail(&p->running, &r->link);
    r->pending = 1;
    ucp_request_param_t prm = {.op_attr_mask =
                                   UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                               .cb.send = ucx_req_cb,
                               .user_data = r};
    bool stream = !am && p->rptr != NULL && p->path == KVP_PATH_DIRECT_SHM &&
                  n * x->layout.block_size >= UCX_STREAM_MIN_BYTES;
    /* direct-cma (ucx_cma.c): synchronous process_vm_writev, no UCX request */
    size_t posted = cma  ? kvp__ucx_cma_post(x, p, r, blocks, n)
                    : am ? kvp__ucx_am_post(x, p, r, blocks, n, &prm)
                         : ucx_post_puts(x, p, r, blocks, n, &prm, stream);
    /* The transfer exists once anything was posted; a later refusal makes it
     * FAILED. Puts need the endpoint flush for remote completion (SPEC §6).
     * Active messages do not: a completed ucp_am_send_nbx means its bytes
     * left the source block (UCX's local completion), which is all the
     * source's pins wait for, and the consumer trusts only what its own
     * handler landed (LANDING). The flush would add a wait, not a proof: on
     * tcp it completed only after the consumer's next progress, i.e. after
     * its handler had copied the whole block (~200 us per 2 MiB block at
     * K=1, issue 17). */
    if (posted > 0 && !am && !cma)
        ucx_post_done(r, ucp_ep_flush_nbx(p->ep_rma, &prm));
    if (--r->pending == 0 && posted > 0) {
        kvp_list_remove(&r->link);
        kvp_list_insert_tail(&p->done, &r->link);
    }
    return posted;
}

kvp_status_t kvp__ucx_write(kvp_xport_t *xp, kvp_xpeer_id_t peer, const kvp_xfer_block_t *blocks,
                            size_t n, kvp_xfer_id_t *out)
{
    ucx_xport_t *x = ucx_of(xp);
    ucx_peer_t *p = kvp__ucx_peer_find(x, peer);

    if (!blocks || n == 0 || !out)
        return KVP_ERR_INVALID;
    if (!p)
        return KVP_ERR_NOT_FOUND;
    kvp_status_t st = ucx_write_check(x, p, blocks, n); /* every index, before any put */
    if (st != KVP_OK)
        return st;
    /* Issue 29 item 4: direct-cma only while the consumer is proven and its
     * proven process alive; else nothing is written (AM is no fallback:
     * ucx_cma.c). */
    bool cma = p->path == KVP_PATH_DIRECT_CMA;
    if (cma && kvp__ucx_cma_ready(x, p) < 0) {
        KVP_LOG_RL(&x->rl_cma, kvp_clock_now(x->clock), KVP_LOG_WARN, PFX(x),
                   "peer %llu: direct-cma write refused (its process exited, is not proven "
                   "same host or was not proven at add_peer): nothing written",
                   (unsigned long long)peer);
        return KVP_ERR_TRANSPORT;
    }
    /* Puts exist only on the RMA endpoint (shm/RDMA); the AM context has
     * no RMA, so legacy_put (bench) applies only where one exists. */
    bool am = !cma && p->use_am &&
              !((x->legacy_put || KVP_MUTATED(KVP_MUT_UCX_EMULATED_PUT)) && p->rkey != NULL);
    ucx_xfer_t *r = ucx_xfer_get(x, p);
    if (!r)
        return KVP_ERR_LIMIT;
    /* UCX AM headers live in the record; the tcp stream queues its own */
    if (am && p->out == NULL && !kvp__ucx_am_reserve_hdrs(r, n, x->layout.block_size)) {
        ucx_xfer_put(x, r);
        return KVP_ERR_NOMEM;
    }
    size_t posted = ucx_write_post(x, p, r, blocks, n, am, cma);
    if (posted == 0) { /* nothing reached UCX: the caller may treat it as never posted */
        KVP_WARN(PFX(x), "peer %llu: %s refused: %s", (unsigned long long)peer,
                 cma ? "direct-cma write" : "put", ucs_status_string(r->first_err));
        ucx_xfer_put(x, r);
        return KVP_ERR_TRANSPORT;
    }
    x->st.writes++;
    x->st.blocks_written += n;
    x->st.bytes_written += (uint64_t)n * x->layout.block_size;
    *out = r->id;
    return KVP_OK;
}

kvp_status_t kvp__ucx_poll(kvp_xport_t *xp, kvp_xpeer_id_t peer, kvp_xfer_result_t *out,
                           size_t cap, size_t *n_out)
{
    ucx_xport_t *x = ucx_of(xp);
    ucx_peer_t *p = kvp__ucx_peer_find(x, peer);
    kvp_list_t *pos, *tmp;
    size_t n = 0;

    if (!n_out || (cap && !out))
        return KVP_ERR_INVALID;
    if (!p)
        return KVP_ERR_NOT_FOUND;
    kvp_list_foreach_safe(pos, tmp, &p->done)
    {
        if (n == cap)
            break;
        ucx_xfer_t *r = KVP_CONTAINER_OF(pos, ucx_xfer_t, link);
        out[n].id = r->id;
        out[n].status = ucx_xfer_result(r);
        ucx_xfer_count(x, out[n].status);
        n++;
        ucx_xfer_put(x, r);
    }
    *n_out = n;
    return KVP_OK;
}

kvp_status_t kvp__ucx_cancel(kvp_xport_t *xp, const kvp_xfer_id_t *ids, size_t n,
                             kvp_cancel_mode_t mode, kvp_xfer_id_t *still_running,
                             size_t *n_running)
{
    ucx_xport_t *x = ucx_of(xp);
    size_t nr = 0;

    if ((n && !ids) || (mode == KVP_CANCEL_WAIT && (!n_running || (n && !still_running))))
        return KVP_ERR_INVALID;
    for (size_t i = 0; i < n; i++) { /* all-or-nothing: validate first */
        ucx_xfer_t *r = ucx_xfer_find(x, ids[i]);
        if (!r || r->where != XF_LIVE)
            return KVP_ERR_NOT_FOUND;
    }
    for (size_t i = 0; i < n; i++) {
        ucx_xfer_t *r = ucx_xfer_find(x, ids[i]);
        if (!r)
            continue; /* duplicate id, already released */
        if (r->pending == 0) {
            ucx_xfer_count(x, ucx_xfer_result(r));
            ucx_xfer_put(x, r);
        } else if (mode == KVP_CANCEL_WAIT) {
            still_running[nr++] = r->id; /* stays tracked: UCX still owns requests */
        } else {
            kvp__ucx_xfer_detach(x, r); /* the WRITE may go on; the callback frees it */
        }
    }
    if (n_running)
        *n_running = nr;
    return KVP_OK;
}

void kvp__ucx_retire_list(ucx_xport_t *x, kvp_list_t *l)
{
    while (!kvp_list_empty(l)) {
        ucx_xfer_t *r = KVP_CONTAINER_OF(l->next, ucx_xfer_t, link);
        kvp_list_remove(&r->link);
        kvp__ucx_xfer_set_where(r, XF_RETIRED);
        kvp_list_insert_tail(&x->retired, &r->link);
    }
}

kvp_status_t kvp__ucx_poll_retired(kvp_xport_t *xp, kvp_xfer_result_t *out, size_t cap,
                                   size_t *n_out)
{
    ucx_xport_t *x = ucx_of(xp);
    kvp_list_t *pos, *tmp;
    size_t n = 0;

    if (!n_out || (cap && !out))
        return KVP_ERR_INVALID;
    kvp_list_foreach_safe(pos, tmp, &x->retired)
    {
        if (n == cap)
            break;
        ucx_xfer_t *r = KVP_CONTAINER_OF(pos, ucx_xfer_t, link);
        if (r->pending)
            continue;
        out[n].id = r->id;
        out[n].status = ucx_xfer_result(r);
        ucx_xfer_count(x, out[n].status);
        n++;
        ucx_xfer_put(x, r);
    }
    kvp__ucx_zombies_reap(x);
    *n_out = n;
    return KVP_OK;
}

kvp_status_t kvp__ucx_force_release_retired(kvp_xport_t *xp, const kvp_xfer_id_t *ids, size_t n)
{
    ucx_xport_t *x = ucx_of(xp);

    if (n && !ids)
        return KVP_ERR_INVALID;
    for (size_t i = 0; i < n; i++) {
        ucx_xfer_t *r = ucx_xfer_find(x, ids[i]);
        if (!r || r->where != XF_RETIRED)
            return KVP_ERR_NOT_FOUND;
    }
    for (size_t i = 0; i < n; i++) {
        ucx_xfer_t *r = ucx_xfer_find(x, ids[i]);
        if (!r)
            continue;
        KVP_ERROR(PFX(x),
                  "transfer %llu (peer %llu) force-released with %u UCX request(s) "
                  "outstanding: its WRITE may still land",
                  (unsigned long long)r->id, (unsigned long long)r->peer->id, r->pending);
        x->st.force_released++;
        kvp__ucx_xfer_detach(x, r);
    }
    kvp__ucx_zombies_reap(x);
    return KVP_OK;
}
