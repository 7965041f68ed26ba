/*
 * ucx_am.c -- kvpeer's own active-message data path (issue 14).
 *
 * Why: on a path without native RMA (tcp, and shm into memory UCX did not
 * allocate) UCX 1.13 emulates ucp_put_nbx with active messages and the
 * TARGET's UCX answers every put with a completion message. When the source
 * died, that send fails and ucp_request_try_send() calls ucs_fatal(): the
 * consumer process aborts (UCX-NOTES, addendum 2; the same code is in 1.22).
 * Here the consumer never sends anything on the data path, so no such send
 * exists.
 *
 * Source side: each block is ucp_am_send_nbx(UCX_AM_ID_DATA, header, piece)
 * per piece of at most UCX_AM_PIECE_BYTES, in order, with
 * UCP_AM_SEND_FLAG_EAGER; the header names the destination slot, its
 * generation, the piece's offset and length and both transport secrets
 * (random per node incarnation, learned only from the authenticated blob:
 * a piece without the consumer's secret is dropped and counted,
 * am_unauth_dropped). The transfer is terminal when
 * every send completed (the source pins may go: the data left our memory);
 * no endpoint flush follows (ucx_write: on tcp it waited for the consumer's
 * next progress and proved nothing more). That is only LOCAL completion:
 * the consumer does not trust FETCH_DONE before its own handler saw the
 * blocks (is_landed, asked by the node each poll round while such a load
 * waits).
 *
 * Consumer side: ucx_acc_t per slot of our region. ucx_am_data_cb (inside
 * ucp_worker_progress, owner thread) copies a piece into its slot only if
 * that slot is expected (ACC_EXPECT) at that generation from that source and
 * the piece starts where the bytes landed so far end, or at 0 (the block
 * starts over: sent again while still expected); pieces of one block travel
 * in order on one endpoint (one ordered lane, each piece a single segment);
 * else it drops the bytes and counts them (late_bytes_dropped),
 * and the block never counts as landed: a piece lost or out of order fails
 * the block, it never leaves a hole in a committed one. The block has
 * landed when `next` reached the block size. Constant time, no allocation: a bounds check and an
 * array index. Because UCX never writes into the region on this path (eager
 * data arrives in UCX's own buffers; rendezvous is never accepted), refuse()
 * returning is proof that nothing lands in those slots afterwards
 * (KVP_PROOF_AM_REFUSE in the node).
 */
#include "transport/ucx_int.h"

#include <string.h>

/* ------------------------------------------------------------- consumer */

/* The landing rule, for a piece from UCX's AM handler or from kvpeer's own
 * tcp stream (ucx_tcpd.c): it lands only into a slot expected at that
 * generation from that source, in order; everything else is dropped and
 * counted. */
void kvp__ucx_land(ucx_xport_t *x, const ucx_am_hdr_t *hp, const void *data, size_t length)
{
    ucx_am_hdr_t h = *hp;
    const size_t bs = x->layout.block_size;

    if (x->acc == NULL) {
        x->st.late_bytes_dropped += length;
        return;
    }
    if (h.dst_token != x->token) {
        /* Not from a holder of our blob (issue 27): a foreign worker. */
        x->st.am_unauth_dropped += length;
        x->st.late_bytes_dropped += length;
        return;
    }
    if (h.magic != UCX_AM_MAGIC || h.slot >= x->layout.num_blocks ||
        h.zero != 0 || h.len == 0 || h.len != length || h.off >= bs || h.len > bs - h.off) {
        x->st.late_bytes_dropped += length;
        return;
    }
    ucx_acc_t *e = &x->acc[h.slot];
    if (e->state != ACC_EXPECT || e->gen != h.gen || (e->token != 0 && e->token != h.src_token) ||
        (h.off != e->next && h.off != 0)) {
        x->st.late_bytes_dropped += length; /* refused, stale, foreign or out of order */
        return;
    }
    if (h.off == 0)
        e->next = 0; /* the block (again, if it was sent twice while expected) */
    memcpy((uint8_t *)x->region + (size_t)h.slot * bs + h.off, data, h.len);
    e->next += h.len;
    if (e->next == bs)
        x->st.am_blocks_landed++;
    x->st.am_bytes_landed += h.len;
}

static ucs_status_t ucx_am_data_cb(void *arg, const void *header, size_t header_length,
                                   void *data, size_t length, const ucp_am_recv_param_t *param)
{
    ucx_xport_t *x = arg;
    ucx_am_hdr_t h;

    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        /* Never sent by kvpeer (EAGER only). Dropped without receiving:
         * UCX releases the descriptor. */
        x->st.late_bytes_dropped += length;
        return UCS_OK;
    }
    if (header_length != sizeof(h)) {
        x->st.late_bytes_dropped += length;
        return UCS_OK;
    }
    memcpy(&h, header, sizeof(h));
    kvp__ucx_land(x, &h, data, length);
    return UCS_OK; /* UCX releases its buffer */
}

kvp_status_t kvp__ucx_am_init(ucx_xport_t *x)
{
    ucp_am_handler_param_t hp = {
        .field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_FLAGS |
                      UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG,
        .id = UCX_AM_ID_DATA,
        .flags = UCP_AM_FLAG_WHOLE_MSG,
        .cb = ucx_am_data_cb,
        .arg = x,
    };
    ucs_status_t s = ucp_worker_set_am_recv_handler(x->worker_am, &hp);
    if (s != UCS_OK) {
        KVP_ERROR(PFX(x), "ucp_worker_set_am_recv_handler: %s", ucs_status_string(s));
        return KVP_ERR_TRANSPORT;
    }
    return KVP_OK;
}

/* The accept slot's life, its one writer (as ucx_xfer.c's set_where):
 * IDLE -> EXPECT (expect), EXPECT -> EXPECT (expected again: the block is
 * sent again), EXPECT -> IDLE (refuse, fence_peer: counted as refused).
 * A refused slot stays IDLE until expected again. */
static const char *const acc_state_names[] = {[ACC_IDLE] = "IDLE", [ACC_EXPECT] = "EXPECT"};

static const char *ucx_acc_state_str(uint8_t s)
{
    return s < KVP_ARRAY_SIZE(acc_state_names) ? acc_state_names[s] : "?";
}

static void ucx_acc_set_state(ucx_xport_t *x, ucx_acc_t *e, uint8_t to)
{
    static const uint8_t legal[] = {
        [ACC_IDLE] = 1u << ACC_EXPECT,
        [ACC_EXPECT] = (1u << ACC_IDLE) | (1u << ACC_EXPECT),
    };
    if (to >= KVP_ARRAY_SIZE(legal) || !(legal[to] & (1u << e->state)))
        kvp__assert_fail(ucx_acc_state_str(to), __FILE__, __LINE__, ucx_acc_state_str(e->state));
    if (to == ACC_IDLE)
        x->st.am_refused_slots++;
    e->state = to;
}

kvp_status_t kvp__ucx_acc_alloc(ucx_xport_t *x)
{
    x->acc = kvp__calloc(x->layout.num_blocks, sizeof(*x->acc));
    return x->acc ? KVP_OK : KVP_ERR_NOMEM;
}

/* Release rule (conservative): a peer that COULD write our region directly
 * -- it claims our host, or proved it shares our memory; by direct shm, or
 * by direct-cma where our blob offers it (ucx_cma.c) -- is not refusable
 * (its loads are quarantined, not released, on an unknown outcome). */
bool kvp__ucx_inbound_refusable(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    ucx_xport_t *x = ucx_of(xp);
    ucx_peer_t *p = kvp__ucx_peer_find(x, peer);

    return p != NULL && !kvp__ucx_inbound_direct(x, p);
}

/* Commit rule (issue 27): a FETCH_DONE is trusted without our handler
 * seeing the blocks land only from a peer PROVEN to share our memory
 * (ucx_probe.c); a peer's claim of our host id is not enough. An honest
 * same-host kvpeer wrote its proof in add_peer, before it could serve us. */
bool kvp__ucx_landing_required(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    ucx_xport_t *x = ucx_of(xp);
    ucx_peer_t *p = kvp__ucx_peer_find(x, peer);

    if (p == NULL)
        return true;
    /* direct shm into UCX's shm, or direct-cma into memory our blob offers */
    return !((x->region_kind == REGION_UCX || (x->cma_in && p->cma_src)) &&
             kvp__ucx_peer_proven(x, p));
}

kvp_status_t kvp__ucx_expect(kvp_xport_t *xp, kvp_xpeer_id_t peer, const kvp_xslot_t *slots,
                             size_t n)
{
    ucx_xport_t *x = ucx_of(xp);
    uint64_t token = 0;

    if (n && !slots)
        return KVP_ERR_INVALID;
    if (!x->acc)
        return KVP_ERR_STATE;
    if (peer != 0) {
        ucx_peer_t *p = kvp__ucx_peer_find(x, peer);
        if (!p)
            return KVP_ERR_NOT_FOUND;
        token = p->token;
        /* Look for its proof now, while it is live (cached once found): a
         * source that answered FETCH_DONE and then closed at once has taken
         * its mark back (ucx_probe.c) by the time we read the FETCH_DONE. */
        (void)kvp__ucx_peer_proven(x, p);
    }
    for (size_t i = 0; i < n; i++)
        if (slots[i].slot >= x->layout.num_blocks)
            return KVP_ERR_INVALID;
    for (size_t i = 0; i < n; i++) {
        ucx_acc_t *e = &x->acc[slots[i].slot];
        ucx_acc_set_state(x, e, ACC_EXPECT);
        e->token = token;
        e->peer = peer;
        e->gen = slots[i].gen;
        e->next = 0;
    }
    return KVP_OK;
}

void kvp__ucx_refuse(kvp_xport_t *xp, const kvp_xslot_t *slots, size_t n)
{
    ucx_xport_t *x = ucx_of(xp);

    if (!x->acc)
        return;
    for (size_t i = 0; i < n; i++) {
        if (slots[i].slot >= x->layout.num_blocks)
            continue;
        ucx_acc_t *e = &x->acc[slots[i].slot];
        if (e->state == ACC_EXPECT && e->gen == slots[i].gen)
            ucx_acc_set_state(x, e, ACC_IDLE);
    }
}

/* Every slot expected from this peer handle stops accepting (fence_peer).
 * By handle, not token: a new session of the same source (same token) may
 * already expect other slots. O(num_blocks): teardown only. */
void kvp__ucx_acc_refuse_peer(ucx_xport_t *x, kvp_xpeer_id_t peer)
{
    if (!x->acc || peer == 0)
        return;
    for (uint32_t i = 0; i < x->layout.num_blocks; i++)
        if (x->acc[i].state == ACC_EXPECT && x->acc[i].peer == peer)
            ucx_acc_set_state(x, &x->acc[i], ACC_IDLE);
}

/* The source's flush completing means its blocks left its memory, not that
 * they reached us: FETCH_DONE on the control connection can overtake the
 * tail of the data connection. The node keeps such a load waiting (its
 * LANDING phase) and asks this per block after each progress, which is
 * exactly what lands them. */
bool kvp__ucx_is_landed(kvp_xport_t *xp, kvp_xslot_t s)
{
    ucx_xport_t *x = ucx_of(xp);

    if (!x->acc || s.slot >= x->layout.num_blocks)
        return false;
    const ucx_acc_t *e = &x->acc[s.slot];
    return e->state == ACC_EXPECT && e->gen == s.gen && e->next == x->layout.block_size;
}

/* --------------------------------------------------------------- source */

static size_t ucx_am_pieces(size_t block_size)
{
    return (block_size + UCX_AM_PIECE_BYTES - 1) / UCX_AM_PIECE_BYTES;
}

/* One header per piece, valid until its send completed (UCX reads it then). */
bool kvp__ucx_am_reserve_hdrs(ucx_xfer_t *r, size_t n, size_t block_size)
{
    n *= ucx_am_pieces(block_size);
    if (n > UINT32_MAX)
        return false;
    if (n <= r->hdr_cap)
        return true;
    ucx_am_hdr_t *h = kvp__realloc(r->hdrs, n * sizeof(*h));
    if (!h)
        return false;
    r->hdrs = h;
    r->hdr_cap = (uint32_t)n;
    return true;
}

size_t kvp__ucx_am_post(ucx_xport_t *x, ucx_peer_t *p, ucx_xfer_t *r,
                        const kvp_xfer_block_t *blocks, size_t n, const ucp_request_param_t *prm)
{
    const size_t bs = x->layout.block_size;
    ucp_request_param_t ap = *prm;
    size_t posted = 0;

    ap.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
    ap.flags = UCP_AM_SEND_FLAG_EAGER; /* never rendezvous; never REPLY */
    if (p->out != NULL) /* kvpeer's own tcp stream (ucx_tcpd.c) */
        return kvp__ucx_tcpd_post(x, p, r, blocks, n);
    ucx_am_hdr_t *h = r->hdrs;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *src = (const uint8_t *)x->region + (size_t)blocks[i].src_slot * bs;
        for (size_t off = 0; off < bs; off += UCX_AM_PIECE_BYTES, h++) {
            uint32_t len = (uint32_t)KVP_MIN(bs - off, (size_t)UCX_AM_PIECE_BYTES);
            *h = (ucx_am_hdr_t){UCX_AM_MAGIC, blocks[i].dst_slot, blocks[i].dst_gen,
                                (uint32_t)off, len, 0, x->token, p->dst_token};
            ucs_status_ptr_t sp =
                ucp_am_send_nbx(p->ep, UCX_AM_ID_DATA, h, sizeof(*h), src + off, len, &ap);
            if (UCS_PTR_IS_PTR(sp)) {
                r->pending++;
            } else if (UCS_PTR_IS_ERR(sp)) {
                if (r->first_err == UCS_OK)
                    r->first_err = UCS_PTR_STATUS(sp);
                return posted; /* the rest is not sent: the transfer fails */
            }
            posted++;
        }
    }
    return posted;
}
