/*
 * ucx_path.c -- which data path each direction of a peer takes, decided from
 * facts kvpeer controls, never from ucp_ep_print_info() text (its put[] lines
 * are gone under UCX >= 1.16's protocol selection, and 1.13's ucp_ep_query
 * reports no transports).
 *
 * UCX-NOTES §2: a put is direct (one-sided, no target CPU) only into a
 * UCX-allocated shm region over an endpoint with a shm lane; every other put
 * is emulated with active messages, and an emulated put is what aborts the
 * target when the source dies (issue 14). So:
 *   outbound (our writes): direct shm  iff  ucp_rkey_ptr() maps the peer's
 *       region here (it is UCX shm on this host) AND our configuration keeps
 *       the shm transports with error handling (so the PEER endpoint has the
 *       shm lane); else kvpeer's AM path (am-shm on the same host with shm
 *       transports, am-tcp otherwise). RDMA is not detected: on an RDMA host
 *       peers go by AM (safe, slower) until it is.
 *   inbound (its writes to us): direct iff OUR region is UCX-allocated and
 *       the peer is on this host. This is a superset of the cases in which
 *       the peer's rule can pick direct (its rkey_ptr needs exactly that), so
 *       calling a peer's inbound path AM -- and treating refusal as proof --
 *       can never be wrong about a peer that puts directly.
 */
#include "transport/ucx_int.h"

#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

/* Direct shm: the peer's region mapped here at ptr (ucp_rkey_ptr). */
static void map_direct(ucx_xport_t *x, ucx_peer_t *p, void *ptr)
{
    /* Our large writes copy into that mapping ourselves (ucx.c,
     * ucx_post_puts): only if the whole region is mapped in one piece. */
    size_t rlen = (size_t)p->layout.num_blocks * p->layout.block_size;
    void *last = NULL;
    if (rlen > 0 && ucp_rkey_ptr(p->rkey, p->rbase + rlen - 1, &last) == UCS_OK &&
        (uint8_t *)last == (uint8_t *)ptr + rlen - 1)
        p->rptr = ptr;
    /* Our puts are memcpys into the peer's segment mapped here. Fault that
     * mapping in now, in one batched call, instead of one page fault per
     * 4 KiB inside the first put into each slot (30-60 us each on this VM).
     * Best effort; nothing depends on it. */
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t start = (uintptr_t)ptr & ~(page - 1);
    if (madvise((void *)start, rlen + ((uintptr_t)ptr - start), MADV_POPULATE_WRITE) != 0)
        KVP_DEBUG(PFX(x), "peer %llu: pre-fault of its segment failed",
                  (unsigned long long)p->id);
}

/* Decide the paths of a new peer; logged once. */
void kvp__ucx_peer_classify(ucx_xport_t *x, ucx_peer_t *p)
{
    void *ptr = NULL;

    /* No RMA endpoint (the RMA context does not reach it: another host) ->
     * no rkey, AM only. */
    p->rkey_ptr_ok = p->rkey != NULL && ucp_rkey_ptr(p->rkey, p->rbase, &ptr) == UCS_OK;
    bool direct = p->rkey_ptr_ok && x->shm_enabled;
    /* AM over UCX shm where that endpoint exists, else kvpeer's tcp stream */
    kvp_data_path_t am = p->out == NULL ? KVP_PATH_AM_SHM : KVP_PATH_AM_TCP;
    /* issue 29 item 4: into a region UCX did not allocate, a same-host
     * consumer whose process we proved (ucx_cma.c) gets direct-cma; one we
     * could not prove gets AM, and our proof in its segment stays pending
     * (ucx.c), so it waits for the AM to land. */
    bool cma = !direct && kvp__ucx_cma_bound(x, p) && p->cma_pidfd >= 0;
    bool cma_impossible = !direct && kvp__ucx_cma_bound(x, p) && p->cma_pidfd < 0;
    p->path = direct ? KVP_PATH_DIRECT_SHM : cma ? KVP_PATH_DIRECT_CMA : am;
    p->use_am = !direct;
    /* inbound: a superset of what the peer's rule can choose (ucx_cma.c
     * writes only into a consumer whose blob offers it: ours, cma_in) */
    p->inbound = x->region_kind == REGION_UCX && p->same_host ? KVP_PATH_DIRECT_SHM
                 : x->cma_in && p->cma_src && p->same_host    ? KVP_PATH_DIRECT_CMA
                                                              : am;
    p->rptr = NULL;
    if (direct)
        map_direct(x, p, ptr);
    /* Our proof in its segment, pending if it offers direct-cma (ucx.c):
     * final unless we cannot write it that way. Proven, it trusts our
     * FETCH_DONE without landing, so it must find the proof only when our
     * writes reach it directly; else it waits for our AM to land. */
    if (!cma_impossible)
        kvp__ucx_probe_settle(p);
    snprintf(p->lanes, sizeof(p->lanes), "out=%s in=%s rkey_ptr=%s shm=%s cma=%s%s",
             kvp_data_path_str(p->path), kvp_data_path_str(p->inbound),
             p->rkey_ptr_ok ? "ok" : "no", x->shm_enabled ? "on" : "off",
             cma              ? "pid-proven"
             : cma_impossible ? "impossible"
             : p->cma_offered ? "offered"
                              : "no",
             x->legacy_put && p->use_am ? " legacy-put(bench)" : "");
    KVP_INFO(PFX(x), "peer %llu: data path %s [%s]%s", (unsigned long long)p->id,
             kvp_data_path_str(p->path), p->lanes, p->same_host ? " (same host)" : "");
    /* am-tcp to a same-host peer happens only when the configured transports
     * leave out shared memory (shm_enabled false: UCX_TLS or the config's
     * tls chose it); say that (loudly, F28), not a guess at other causes or
     * a speed figure measured elsewhere. */
    if (p->same_host && p->path == KVP_PATH_AM_TCP)
        KVP_WARN(PFX(x),
                 "peer %llu is on this host but its data goes over tcp: the configured "
                 "transports (UCX_TLS=%s) include no shared memory (%s)",
                 (unsigned long long)p->id, x->tls[0] ? x->tls : "(default)", p->lanes);
    else if (p->same_host && p->path == KVP_PATH_AM_SHM && !p->cma_offered)
        KVP_WARN(PFX(x),
                 "peer %llu: same-host writes go by active messages over shm "
                 "(its region is not UCX-allocated shared memory?) [%s]",
                 (unsigned long long)p->id, p->lanes);
}
