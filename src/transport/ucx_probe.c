/*
 * ucx_probe.c -- "same host" is proven, never taken from the peer's word
 * (issue 27, SPEC §9).
 *
 * Why: a consumer commits a direct-shm load at FETCH_DONE without seeing
 * the bytes land (the source wrote them straight into our region). If that
 * verdict came from the host id in the peer's own blob, a remote peer
 * claiming our host id could commit whatever the slots held (measured: a
 * FETCH_DONE with no write committed zero blocks).
 *
 * How: every node maps a small segment in its RMA context (UCX-allocated
 * shared memory, like the region; its rkey and address are in the blob).
 * A peer that can map it (ucp_rkey_ptr through its RMA endpoint: only on
 * this host, through shared memory) writes its own secret into it -- a
 * cell claimed with a compare-and-swap from secret % cells, linear probing.
 * It does so in add_peer, i.e. before it can serve any fetch of ours. We
 * learned its secret from its blob over the authenticated control channel;
 * finding it in our segment proves the peer shares our memory, so it can
 * indeed write our region directly. No control message is needed: the
 * "echo" travels through the very memory whose sharing it proves.
 *
 * The mark is bound to the control connection the blob came on (issue 27:
 * a relay made X write its bare secret for a session carrying D's borrowed
 * blob, then gave D X's blob): kvp__ucx_proof_mark_value(secret, binding),
 * the binding a hash of the TCP endpoints both ends see (kvp_link_binding),
 * set by bind_next_peer before add_peer. 0 = unbound: the bare secret.
 *
 * A node takes its mark back when the peer goes (UCX_PROOF_TOMB: readers
 * probe past it, writers reuse it); a crashed node's marks stay. Past
 * UCX_PROOF_CELLS live marks in our segment a new peer stays unproven (its
 * loads then need AM landing and fail on a direct path -- logged). A same-host process of
 * the same user can write any cell (it can map the segment like a peer);
 * DESIGN.md "Threat model: data plane" says what that process can do anyway.
 */
#include "transport/ucx_int.h"

#include <string.h>

kvp_status_t kvp__ucx_probe_alloc(ucx_xport_t *x)
{
    size_t len = UCX_PROOF_CELLS * sizeof(uint64_t);
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .address = NULL,
        .length = len,
        .flags = UCP_MEM_MAP_ALLOCATE,
    };
    ucp_mem_attr_t ma = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH};

    if (ucp_mem_map(x->ctx, &mp, &x->probe_memh) != UCS_OK) {
        x->probe_memh = NULL;
        KVP_WARN(PFX(x), "same-host proof segment not allocated: same-host peers cannot "
                         "prove it (their direct writes are not trusted)");
        return KVP_ERR_TRANSPORT;
    }
    if (ucp_mem_query(x->probe_memh, &ma) != UCS_OK || ma.address == NULL || ma.length < len) {
        ucp_mem_unmap(x->ctx, x->probe_memh);
        x->probe_memh = NULL;
        return KVP_ERR_TRANSPORT;
    }
    x->probe_cells = ma.address;
    memset(x->probe_cells, 0, len);
    return KVP_OK;
}

void kvp__ucx_probe_release(ucx_xport_t *x)
{
    if (x->probe_memh)
        ucp_mem_unmap(x->ctx, x->probe_memh);
    x->probe_memh = NULL;
    x->probe_cells = NULL;
}

/* The pending form of a mark: never the mark, empty (0) nor a tombstone. */
static uint64_t probe_pending(uint64_t mark)
{
    uint64_t v = mark ^ 0x70656e64696e6721ull; /* "pending!" */
    return v > UCX_PROOF_TOMB && v != mark ? v : ~mark;
}

bool kvp__ucx_probe_mark(ucx_xport_t *x, ucx_peer_t *p, const ucx_blob_view_t *v, bool pending)
{
    ucp_rkey_h rk = NULL;
    void *ptr = NULL;
    bool ok = false;

    if (p->ep_rma == NULL || v->probe_rkey_len == 0)
        return false;
    uint8_t *tmp = kvp__malloc(v->probe_rkey_len); /* aligned copy for UCX */
    if (tmp == NULL)
        return false;
    memcpy(tmp, v->probe_rkey, v->probe_rkey_len);
    ucs_status_t s = ucp_ep_rkey_unpack(p->ep_rma, tmp, &rk);
    kvp__free(tmp);
    if (s != UCS_OK)
        return false;
    void *last = NULL;
    size_t len = UCX_PROOF_CELLS * sizeof(uint64_t);
    if (ucp_rkey_ptr(rk, v->probe_base, &ptr) == UCS_OK &&
        ucp_rkey_ptr(rk, v->probe_base + len - 1, &last) == UCS_OK &&
        (uint8_t *)last == (uint8_t *)ptr + len - 1 && ((uintptr_t)ptr & 7) == 0) {
        uint64_t *cells = ptr;
        uint64_t mark = pending ? probe_pending(p->mark_ours) : p->mark_ours;
        /* probed from the final mark's cell: settle turns it final in place */
        for (uint32_t i = 0, c = (uint32_t)(p->mark_ours % UCX_PROOF_CELLS);
             i < UCX_PROOF_CELLS && !ok;
             i++, c = (c + 1) % UCX_PROOF_CELLS) {
            uint64_t cur = __atomic_load_n(&cells[c], __ATOMIC_ACQUIRE);
            if (cur == mark || ((cur == 0 || cur == UCX_PROOF_TOMB) &&
                                __atomic_compare_exchange_n(&cells[c], &cur, mark, false,
                                                            __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))) {
                ok = true;
                p->mark_cell = &cells[c];
                p->mark_put = mark;
                p->mark_raddr = v->probe_base + (uint64_t)c * sizeof(uint64_t); /* ucx_cma.c */
            }
        }
        if (!ok)
            KVP_WARN(PFX(x), "peer %llu: its same-host proof segment is full",
                     (unsigned long long)p->id);
    }
    if (ok) { /* keep the mapping: the mark is taken back when the peer goes */
        p->probe_rk = rk;
        return true;
    }
    ucp_rkey_destroy(rk);
    return false;
}

bool kvp__ucx_peer_proven(ucx_xport_t *x, ucx_peer_t *p)
{
    if (p->proven || x->probe_cells == NULL || p->mark_theirs == 0)
        return p->proven;
    for (uint32_t i = 0, c = (uint32_t)(p->mark_theirs % UCX_PROOF_CELLS); i < UCX_PROOF_CELLS;
         i++, c = (c + 1) % UCX_PROOF_CELLS) {
        uint64_t v = __atomic_load_n(&x->probe_cells[c], __ATOMIC_ACQUIRE);
        if (v == p->mark_theirs) {
            p->proven = true;
            KVP_INFO(PFX(x), "peer %llu: same host proven (it wrote our shared segment)",
                     (unsigned long long)p->id);
            break;
        }
        if (v == 0)
            break;
    }
    return p->proven;
}

/* The cell value of a secret on one control connection: the secret itself
 * when unbound (transport tests), else a hash of it and the connection's
 * binding -- a node writes it only for a peer whose blob came on that very
 * connection, so a relay (two connections) finds no mark it can use. */
uint64_t kvp__ucx_proof_mark_value(uint64_t secret, uint64_t binding)
{
    uint64_t h = binding == 0 ? secret : kvp_hash64(&binding, sizeof(binding), secret);
    return h > UCX_PROOF_TOMB ? h : h + 2; /* never empty (0) nor a tombstone (1) */
}

/* A pending mark made final: the peer now finds our proof. */
void kvp__ucx_probe_settle(ucx_peer_t *p)
{
    uint64_t want = p->mark_put;
    if (p->mark_cell != NULL && want != p->mark_ours &&
        __atomic_compare_exchange_n(p->mark_cell, &want, p->mark_ours, false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST))
        p->mark_put = p->mark_ours;
}

/* Take our mark back from the peer's segment (a tombstone: its readers
 * probe past it) and drop the mapping: before the RMA endpoint closes.
 * So a peer's segment holds one cell per live session of ours, however
 * many sessions (a relay's too) come and go. */
void kvp__ucx_probe_unmark(ucx_peer_t *p)
{
    if (p->mark_cell != NULL) {
        uint64_t want = p->mark_put;
        (void)__atomic_compare_exchange_n(p->mark_cell, &want, UCX_PROOF_TOMB, false,
                                          __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
        p->mark_cell = NULL;
    }
    if (p->probe_rk != NULL) {
        ucp_rkey_destroy(p->probe_rk);
        p->probe_rk = NULL;
    }
}

void kvp__ucx_bind_next_peer(kvp_xport_t *xp, uint64_t binding)
{
    ucx_of(xp)->bind_next = binding;
}
