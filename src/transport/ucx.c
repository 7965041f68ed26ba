/*
 * ucx.c -- the UCX backend of the data transport (see ucx.h, SPEC §6 and
 * UCX-NOTES.md for why each UCX setting is what it is).
 *
 * Objects and ownership:
 *   ucx_xport_t  owns the ucp context/worker, the region registration (and
 *                the region itself when UCX or our mmap allocated it), the
 *                local blob, every peer and the transfer-record pool.
 *   ucx_peer_t   one imported blob: endpoint + unpacked rkey. Allocated at
 *                add_peer, freed only when (a) it was removed, (b) no transfer
 *                record refers to it (refs == 0) and (c) UCX completed the
 *                close of its endpoint. The rkey is destroyed once refs == 0,
 *                before the endpoint close is started.
 *   ucx_xfer_t   one transfer. Lives in the pool; `pending` counts the UCX
 *                requests (puts + flush, or AM sends) that UCX still owns. A record whose
 *                pending > 0 is never returned to the pool: UCX will call
 *                back with it as user_data.
 *
 * Transfer record life (where):
 *   FREE     -> LIVE       write() posted it (on peer->running or peer->done)
 *   LIVE     -> FREE       poll()/cancel() released it once pending == 0
 *   LIVE     -> RETIRED    remove_peer() (x->retired)
 *   RETIRED  -> FREE       poll_retired() once pending == 0
 *   LIVE|RETIRED -> DETACHED  cancel(IMMEDIATE)/force_release while UCX still
 *                          owns requests; the completion callback frees it.
 * A record is "terminal" when pending == 0; its status is decided when it is
 * handed back (poll*), so an endpoint error reported in the same progress
 * call as a flush that "succeeded" still fails it (UCX-NOTES §5).
 */
#include "transport/ucx_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- helpers */

/* One turn of both workers (RMA and AM contexts); nonzero when either did
 * something. */
static unsigned ucx_worker_turn(ucx_xport_t *x)
{
    unsigned n = 0;

    if (x->worker)
        n += ucp_worker_progress(x->worker);
    if (x->worker_am)
        n += ucp_worker_progress(x->worker_am);
    return n;
}

/* Start closing ep (flags), returning the request to own or NULL. */
static void *ucx_ep_close(ucx_xport_t *x, ucp_ep_h ep, uint32_t flags, kvp_xpeer_id_t id)
{
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS, .flags = flags};
    void *req = ucp_ep_close_nbx(ep, &prm);

    if (UCS_PTR_IS_PTR(req))
        return req;
    if (UCS_PTR_IS_ERR(req))
        KVP_DEBUG(PFX(x), "peer %llu: endpoint close: %s", (unsigned long long)id,
                  ucs_status_string(UCS_PTR_STATUS(req)));
    return NULL;
}

/* ------------------------------------------------------------------ peers */

/* Close p's tcp data stream (tcpd.h): its queued pieces are reported not
 * sent (the transfers fail; nothing reads their source memory any more). */
static void ucx_peer_close_out(ucx_peer_t *p)
{
    if (p->out != NULL) {
        kvp_tcpd_out_t *o = p->out;
        p->out = NULL;
        kvp__tcpd_out_close(o);
    }
}

static void ucx_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    ucx_peer_t *p = arg;

    p->err_seq++;
    if (p->ep_err == UCS_OK) {
        p->ep_err = status;
        KVP_WARN(PFX(p->x), "peer %llu: endpoint error: %s (outcome of its transfers unknown)",
                 (unsigned long long)p->id, ucs_status_string(status));
    }
    if (p->status == KVP_OK)
        p->status = KVP_ERR_TRANSPORT;
    p->x->base.ep_failures++;
    /* FORCE-closed right after the ucp_worker_progress() call that brought
     * us here (ucx_force_errored), not inside this callback, which libuct's
     * tcp event handler calls while it still holds the failing endpoint.
     * The in-callback close existed for UCX's emulated puts (a late one for
     * a failed, open endpoint aborted 1.13); kvpeer no longer lets UCX
     * emulate puts. */
    (void)ep;
    p->x->errored++;
}

/* Start closing the endpoint (FORCE when the peer errored or `force`).
 * The rkey goes first: every operation that used it has finished (refs==0)
 * or was cancelled by a FORCE close the caller already did. */
static void ucx_peer_start_close(ucx_xport_t *x, ucx_peer_t *p, bool force)
{
    ucx_peer_close_out(p);
    kvp__ucx_cma_remove_peer(p);
    kvp__ucx_probe_unmark(p);
    if (p->rkey) {
        ucp_rkey_destroy(p->rkey);
        p->rkey = NULL;
        p->rptr = NULL; /* the mapping went with the rkey */
    }
    uint32_t flags = (force || p->status != KVP_OK) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    if (p->ep) {
        p->close_req = ucx_ep_close(x, p->ep, flags, p->id);
        p->ep = NULL;
    }
    if (p->ep_rma) {
        p->close_req_rma = ucx_ep_close(x, p->ep_rma, flags, p->id);
        p->ep_rma = NULL;
    }
    kvp_list_remove(&p->link);
    kvp_list_insert_tail(&x->closing, &p->link);
}

/* Free closing peers whose endpoint close completed. */
static bool ucx_closing_reap(ucx_xport_t *x)
{
    kvp_list_t *pos, *tmp;
    bool any = false;

    kvp_list_foreach_safe(pos, tmp, &x->closing)
    {
        ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
        if (p->close_req) {
            if (ucp_request_check_status(p->close_req) == UCS_INPROGRESS)
                continue;
            ucp_request_free(p->close_req);
            p->close_req = NULL;
        }
        if (p->close_req_rma) {
            if (ucp_request_check_status(p->close_req_rma) == UCS_INPROGRESS)
                continue;
            ucp_request_free(p->close_req_rma);
            p->close_req_rma = NULL;
        }
        kvp_list_remove(&p->link);
        kvp__free(p);
        any = true;
    }
    return any;
}

/* ------------------------------------------------------- ending a peer
 *
 * (Until issue 27's last door, a live UCX tcp endpoint was drained before it
 * was closed: UCX 1.13's lingering-endpoint teardown crashed under
 * partitions. UCX carries no tcp any more -- kvpeer's own stream does,
 * tcpd.h -- so every UCX endpoint is shm or RDMA and is closed at once.) */
static void ucx_peer_force_ep(ucx_xport_t *x, ucx_peer_t *p);

/* The node is done with p's endpoints (fence, removal after an error):
 * close them now (FORCE: UCX completes, i.e. cancels, what it still owns;
 * the stream's unsent pieces fail). */
static void ucx_peer_end_ep(ucx_xport_t *x, ucx_peer_t *p)
{
    ucx_peer_close_out(p);
    if (p->ep != NULL)
        ucx_peer_force_ep(x, p);
}

/* Removed peers with no record left: release rkey, close endpoint. */
bool kvp__ucx_zombies_reap(ucx_xport_t *x)
{
    kvp_list_t *pos, *tmp;
    bool any = false;

    kvp_list_foreach_safe(pos, tmp, &x->zombies)
    {
        ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
        if (p->refs == 0) {
            ucx_peer_start_close(x, p, false);
            any = true;
        }
    }
    return any;
}

/* ------------------------------------------------------ data-path probe */

/* The wire-up of a new endpoint is UCX's business, and UCX 1.13 over tcp can
 * leave it unfinished for good (both sides reconnecting right after a
 * partition: connection numbers no longer pair up, puts and flushes then
 * wait forever and keepalive, which runs only on wired endpoints, never
 * fires). A flush posted on the fresh endpoint completes only once the
 * wire-up did; if it has not within connect_timeout the endpoint counts as
 * failed, exactly like an endpoint error: FORCE-closed, its transfers FAILED
 * with unknown outcome, peer_status() reports it so the session is torn
 * down and redialled on fresh endpoints. */
static void ucx_probe_cb(void *req, ucs_status_t status, void *user_data)
{
    ucx_probe_t *pr = user_data;
    ucx_xport_t *x = pr->x;

    ucp_request_free(req);
    KVP_ASSERT(x->probes > 0);
    x->probes--;
    ucx_peer_t *p = x->destroying ? NULL : kvp__ucx_peer_find_any(x, pr->peer);
    if (p != NULL && p->probe == pr) {
        p->probe = NULL;
        KVP_DEBUG(PFX(x), "peer %llu: data-path probe %s", (unsigned long long)p->id,
                  ucs_status_string(status));
    }
    kvp__free(pr);
}

static void ucx_probe_start(ucx_xport_t *x, ucx_peer_t *p)
{
    ucx_probe_t *pr = kvp__malloc(sizeof(*pr));
    if (pr == NULL)
        return; /* no probe: the endpoint is trusted as UCX reports it */
    *pr = (ucx_probe_t){x, p->id};
    ucp_request_param_t prm = {.op_attr_mask =
                                   UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                               .cb.send = ucx_probe_cb,
                               .user_data = pr};
    ucs_status_ptr_t sp = ucp_ep_flush_nbx(p->ep, &prm);
    if (!UCS_PTR_IS_PTR(sp)) { /* done at once (or refused: the error callback says so) */
        kvp__free(pr);
        return;
    }
    x->probes++;
    p->probe = pr;
    p->probe_deadline_ns = kvp_clock_now(kvp_clock_real()) + x->connect_timeout_ns;
}

/* Probes past their deadline fail their endpoint (FORCE-closed by the caller). */
static void ucx_probe_check(ucx_xport_t *x)
{
    kvp_list_t *pos, *tmp;
    uint64_t now = 0;

    kvp_list_foreach_safe(pos, tmp, &x->peers)
    {
        ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
        if (p->probe == NULL || p->ep == NULL || p->ep_err != UCS_OK)
            continue;
        if (now == 0)
            now = kvp_clock_now(kvp_clock_real());
        if (now < p->probe_deadline_ns)
            continue;
        KVP_WARN(PFX(x), "peer %llu: data path not established within %llu ms (UCX wire-up "
                 "stuck): endpoint failed", (unsigned long long)p->id,
                 (unsigned long long)(x->connect_timeout_ns / KVP_NSEC_PER_MSEC));
        p->probe = NULL; /* UCX still owns it; its callback frees it */
        p->err_seq++;
        p->ep_err = UCS_ERR_ENDPOINT_TIMEOUT;
        if (p->status == KVP_OK)
            p->status = KVP_ERR_TRANSPORT;
        x->st.probe_timeouts++;
        x->errored++;
        x->base.ep_failures++;
    }
}

/* -------------------------------------------------------------- add_peer */

static void ucx_ep_abort(ucx_xport_t *x, ucp_ep_h ep)
{
    void *req = ucx_ep_close(x, ep, UCP_EP_CLOSE_FLAG_FORCE, 0);
    while (req && ucp_request_check_status(req) == UCS_INPROGRESS)
        ucx_worker_turn(x); /* FORCE close: local, completes at once */
    if (req)
        ucp_request_free(req);
}

/* The AM endpoint (always) and, where the RMA context reaches the peer
 * (same host, RDMA), the RMA endpoint with the peer's region rkey. */
static kvp_status_t ucx_peer_connect(ucx_xport_t *x, ucx_peer_t *p, const ucx_blob_view_t *v)
{
    /* copies: UCX may expect natural alignment of its address/rkey buffers */
    uint8_t *tmp = kvp__malloc(v->addr_len + v->rma_addr_len + v->rkey_len);
    ucs_status_t s;

    if (!tmp)
        return KVP_ERR_NOMEM;
    memcpy(tmp, v->addr, v->addr_len);
    memcpy(tmp + v->addr_len, v->rma_addr, v->rma_addr_len);
    memcpy(tmp + v->addr_len + v->rma_addr_len, v->rkey, v->rkey_len);
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)tmp,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = ucx_ep_err_cb, .arg = p},
    };
    /* AM over UCX only where UCX's shared memory reaches the peer; every
     * other peer gets kvpeer's own tcp stream (issue 27: UCX's tcp is never
     * used, see tcpd.h). */
    s = p->same_host && x->shm_enabled ? ucp_ep_create(x->worker_am, &ep, &p->ep)
                                       : UCS_ERR_UNREACHABLE;
    if (s != UCS_OK) { /* another host, or its transports leave out shm: the stream */
        if (p->same_host && x->shm_enabled)
            KVP_DEBUG(PFX(x), "peer blob: AM endpoint over shm: %s (tcp stream instead)",
                      ucs_status_string(s));
        p->ep = NULL;
        p->out = kvp__tcpd_connect(x->tcpd, &v->tcpd, x->next_host, p->dst_token, p);
        if (p->out == NULL) {
            kvp__free(tmp);
            return KVP_ERR_TRANSPORT;
        }
    }
    /* The RMA context reaches only this host's memory (RDMA is not detected
     * yet): tried only for a peer claiming our host (its claim is then
     * proven or not, ucx_probe.c) and only when shm transports are on. */
    ep.address = (const ucp_address_t *)(tmp + v->addr_len);
    s = p->same_host && x->shm_enabled ? ucp_ep_create(x->worker, &ep, &p->ep_rma)
                                       : UCS_ERR_UNREACHABLE;
    if (s != UCS_OK) { /* not on this host (and no RDMA): AM only */
        KVP_DEBUG(PFX(x), "peer blob: RMA endpoint: %s (AM path only)", ucs_status_string(s));
        p->ep_rma = NULL;
    } else {
        s = ucp_ep_rkey_unpack(p->ep_rma, tmp + v->addr_len + v->rma_addr_len, &p->rkey);
        if (s != UCS_OK) {
            KVP_ERROR(PFX(x), "peer blob: ucp_ep_rkey_unpack: %s", ucs_status_string(s));
            kvp__free(tmp);
            ucx_ep_abort(x, p->ep_rma);
            if (p->ep)
                ucx_ep_abort(x, p->ep);
            ucx_peer_close_out(p);
            p->ep = p->ep_rma = NULL;
            return KVP_ERR_PROTO;
        }
    }
    kvp__free(tmp);
    return KVP_OK;
}

static kvp_status_t ucx_add_peer(kvp_xport_t *xp, const void *blob, size_t len,
                                 const kvp_layout_t *expect, kvp_xpeer_id_t *out)
{
    ucx_xport_t *x = ucx_of(xp);
    ucx_blob_view_t v;
    kvp_status_t st;
    uint64_t binding = x->bind_next; /* bind_next_peer: this add_peer only */

    x->bind_next = 0;
    char host[sizeof(x->next_host)];
    memcpy(host, x->next_host, sizeof(host));
    x->next_host[0] = '\0';
    if (!expect || !out)
        return KVP_ERR_INVALID;
    st = kvp__ucx_blob_accept(x, blob, len, expect, &v);
    if (st != KVP_OK)
        return st;
    ucx_peer_t *p = kvp__calloc(1, sizeof(*p));
    if (!p)
        return KVP_ERR_NOMEM;
    p->x = x;
    kvp_list_init(&p->link);
    kvp_list_init(&p->running);
    kvp_list_init(&p->done);
    p->rbase = v.base;
    p->rlen = v.len;
    p->layout = v.layout;
    p->cma_offered = (v.flags & 2u) != 0; /* issue 29 item 4: it takes direct-cma */
    p->cma_src = (v.flags & 4u) != 0;     /* ... and writes it where taken */
    p->cma_pidfd = -1;
    p->same_host = v.host_len == strlen(x->host_id) && !memcmp(v.host, x->host_id, v.host_len);
    p->token = p->dst_token = v.secret; /* checked non-zero by blob_view */
    p->mark_ours = kvp__ucx_proof_mark_value(x->token, binding);
    p->mark_theirs = kvp__ucx_proof_mark_value(p->token, binding);
    memcpy(x->next_host, host, sizeof(host)); /* for a wildcard stream address */
    st = ucx_peer_connect(x, p, &v);
    x->next_host[0] = '\0';
    if (st != KVP_OK) {
        kvp__free(p);
        return st;
    }
    p->id = ++x->next_peer;
    kvp_list_insert_tail(&x->peers, &p->link);
    /* Before anything of ours can reach it: our secret into its segment
     * (the same-host proof, ucx_probe.c); pending to a consumer that offers
     * direct-cma, until classify decided our path (ucx_path.c). */
    bool pend = x->cma_out && p->cma_offered;
    bool marked = kvp__ucx_probe_mark(x, p, &v, pend);
    if (marked)
        KVP_DEBUG(PFX(x), "peer %llu: proof written into its shared segment%s",
                  (unsigned long long)p->id, pend ? " (pending)" : "");
    kvp__ucx_exit_add_peer(x, p, marked); /* issue 27: our process to it, its to us */
    kvp__ucx_peer_classify(x, p);
    if (p->ep)
        ucx_probe_start(x, p); /* the tcp stream has its own connect deadline */
    *out = p->id;
    return KVP_OK;
}

/* -------------------------------------------------- removal and retirement */

/* FORCE-close p's endpoint so UCX completes (cancels) what it still owns:
 * (fence, an error, removal, shutdown). */
static void ucx_peer_force_ep(ucx_xport_t *x, ucx_peer_t *p)
{
    ucx_peer_close_out(p);
    if (p->ep) {
        p->close_req = ucx_ep_close(x, p->ep, UCP_EP_CLOSE_FLAG_FORCE, p->id);
        p->ep = NULL;
    }
    if (p->ep_rma) {
        kvp__ucx_probe_unmark(p);
        if (p->rkey) { /* the rkey is unpacked on this endpoint: it goes first */
            ucp_rkey_destroy(p->rkey);
            p->rkey = NULL;
            p->rptr = NULL;
        }
        p->close_req_rma = ucx_ep_close(x, p->ep_rma, UCP_EP_CLOSE_FLAG_FORCE, p->id);
        p->ep_rma = NULL;
    }
    /* FORCE completes locally (also one started in the error callback);
     * give UCX a bounded number of turns, else it is reaped with the peer. */
    for (int i = 0; i < 100000 &&
                    ((p->close_req && ucp_request_check_status(p->close_req) == UCS_INPROGRESS) ||
                     (p->close_req_rma &&
                      ucp_request_check_status(p->close_req_rma) == UCS_INPROGRESS));
         i++)
        ucx_worker_turn(x);
    if (p->close_req && ucp_request_check_status(p->close_req) != UCS_INPROGRESS) {
        ucp_request_free(p->close_req);
        p->close_req = NULL;
    }
    if (p->close_req_rma && ucp_request_check_status(p->close_req_rma) != UCS_INPROGRESS) {
        ucp_request_free(p->close_req_rma);
        p->close_req_rma = NULL;
    }
}

static kvp_status_t ucx_remove_peer(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    ucx_xport_t *x = ucx_of(xp);
    ucx_peer_t *p = kvp__ucx_peer_find(x, peer);

    if (!p)
        return KVP_ERR_NOT_FOUND;
    kvp__ucx_retire_list(x, &p->running);
    kvp__ucx_retire_list(x, &p->done);
    /* Our tcp stream to it closes now: what it has not written never will
     * be (those transfers fail at once, their pins can go). */
    ucx_peer_close_out(p);
    kvp__ucx_exit_remove_peer(x, p);
    kvp__ucx_cma_remove_peer(p); /* no write of ours reaches it any more */
    p->removed = true;
    kvp_list_remove(&p->link);
    kvp_list_insert_tail(&x->zombies, &p->link);
    if (p->status != KVP_OK)
        ucx_peer_end_ep(x, p); /* errored: have UCX finish its requests */
    kvp__ucx_zombies_reap(x);
    ucx_closing_reap(x);
    return KVP_OK;
}

/* ------------------------------------------------------- fence and status */

static kvp_status_t ucx_fence_peer(kvp_xport_t *xp, kvp_xpeer_id_t peer, bool *proof)
{
    ucx_xport_t *x = ucx_of(xp);
    ucx_peer_t *p = kvp__ucx_peer_find(x, peer);

    if (!proof)
        return KVP_ERR_INVALID;
    if (!p)
        return KVP_ERR_NOT_FOUND;
    if (p->status == KVP_OK)
        p->status = KVP_ERR_CLOSED; /* no new writes */
    ucx_peer_end_ep(x, p);
    /* On an AM path the peer's blocks land only through our handler, into
     * slots we expect from it: refusing them all is proof (AM_REFUSE), at
     * once. Direct shm (and RDMA) puts never involve us: no proof. */
    kvp__ucx_acc_refuse_peer(x, p->id);
    *proof = p->inbound == KVP_PATH_AM_TCP || p->inbound == KVP_PATH_AM_SHM;
    KVP_DEBUG(PFX(x), "peer %llu fenced (its puts to us: %s): %s", (unsigned long long)peer,
             kvp_data_path_str(p->inbound), *proof ? "no later write can land" : "NOT a proof");
    return KVP_OK;
}

/* ------------------------------------------------------------- progress */

/* UCX 1.13 aborts the process (ucp_request.inl "unexpected error") when an
 * emulated put arrives for an endpoint that already failed and its ack
 * cannot be sent (seen: the source SIGKILLed mid-transfer over tcp). A
 * FORCE-closed PEER endpoint's id is invalid, so such late puts are dropped
 * instead (UCX-NOTES §5). The outcome of the peer's transfers is unknown
 * either way; closing at once is also the fence. */
static void ucx_force_errored(ucx_xport_t *x)
{
    kvp_list_t *lists[2] = {&x->peers, &x->zombies}, *pos, *tmp;
    x->errored = 0;
    for (int k = 0; k < 2; k++) {
        kvp_list_foreach_safe(pos, tmp, lists[k])
        {
            ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
            if (p->ep_err != UCS_OK && (p->ep != NULL || p->ep_rma != NULL))
                ucx_peer_force_ep(x, p);
        }
    }
}

static bool ucx_progress(kvp_xport_t *xp)
{
    ucx_xport_t *x = ucx_of(xp);
    bool any = false;

    for (int i = 0; i < UCX_PROGRESS_MAX && ucx_worker_turn(x); i++) {
        any = true;
        if (x->errored)
            ucx_force_errored(x);
    }
    if (x->tcpd)
        any |= kvp__tcpd_progress(x->tcpd);
    if (x->pcred)
        any |= kvp__pcred_progress(x->pcred);
    ucx_probe_check(x);
    if (x->errored)
        ucx_force_errored(x);
    any |= kvp__ucx_zombies_reap(x);
    any |= ucx_closing_reap(x);
    return any;
}

/* The epoll fd holding both workers' event fds (and cma_efd). */
static int ucx_event_fd(kvp_xport_t *xp)
{
    return ucx_of(xp)->epfd;
}

/* Both workers armed, or BUSY (progress again). */
static kvp_status_t ucx_arm(kvp_xport_t *xp)
{
    ucx_xport_t *x = ucx_of(xp);
    ucs_status_t s = ucp_worker_arm(x->worker);

    if (s == UCS_OK)
        s = ucp_worker_arm(x->worker_am);
    return s == UCS_OK ? KVP_OK : s == UCS_ERR_BUSY ? KVP_ERR_BUSY : KVP_ERR_TRANSPORT;
}

static uint64_t ucx_list_len(const kvp_list_t *l)
{
    uint64_t n = 0;

    for (const kvp_list_t *p = l->next; p != l; p = p->next)
        n++;
    return n;
}

static void ucx_get_stats(kvp_xport_t *xp, kvp_xport_stats_t *st)
{
    ucx_xport_t *x = ucx_of(xp);
    kvp_list_t *pos, *tmp;

    *st = x->st;
    st->inflight = st->peers = 0;
    kvp_list_foreach_safe(pos, tmp, &x->peers)
    {
        ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
        st->peers++;
        st->inflight += ucx_list_len(&p->running) + ucx_list_len(&p->done);
    }
    st->retired = ucx_list_len(&x->retired);
    if (x->tcpd) {
        kvp_tcpd_stats_t ts;
        kvp__tcpd_stats(x->tcpd, &ts);
        st->tcpd_open = ts.open;
        st->tcpd_refused = ts.refused_preauth_cap + ts.refused_addr_cap + ts.refused_open_cap +
                           ts.closed_bad_preface + ts.closed_timeout + ts.closed_proto;
        st->tcpd_emfile = ts.accept_emfile;
    }
    st->zombie_peers = ucx_list_len(&x->zombies) + ucx_list_len(&x->closing);
}

/* ---------------------------------------------------------------- close */

static bool ucx_busy(ucx_xport_t *x)
{
    kvp_list_t *pos, *tmp;

    if (!kvp_list_empty(&x->retired) || !kvp_list_empty(&x->detached))
        return true;
    kvp_list_foreach_safe(pos, tmp, &x->peers)
    {
        ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
        if (!kvp_list_empty(&p->running) || !kvp_list_empty(&p->done))
            return true;
    }
    return false;
}

/* Tear down every endpoint; FORCE makes UCX cancel what it still owns. */
static void ucx_close_all_peers(ucx_xport_t *x)
{
    kvp_list_t *pos, *tmp;

    kvp_list_foreach_safe(pos, tmp, &x->peers)
    {
        ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
        kvp__ucx_retire_list(x, &p->running);
        kvp__ucx_retire_list(x, &p->done);
        kvp_list_remove(&p->link);
        kvp_list_insert_tail(&x->zombies, &p->link);
    }
    /* FORCE: nothing of ours needs flushing (not busy, or forced), and a
     * flush-close would wait on a remote that may never answer. */
    kvp_list_foreach_safe(pos, tmp, &x->zombies)
    {
        ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
        ucx_peer_force_ep(x, p);
    }
    /* Every record is terminal now (FORCE cancelled the rest) or UCX never
     * called back; either way no one will hand them back any more. The bound
     * is wall-clock (UCX time), not the injectable protocol clock. */
    const kvp_clock_t *rc = kvp_clock_real();
    uint64_t deadline = kvp_clock_now(rc) + 2 * KVP_NSEC_PER_SEC;
    while (!kvp_list_empty(&x->zombies) || !kvp_list_empty(&x->closing)) {
        kvp_list_foreach_safe(pos, tmp, &x->retired)
        {
            ucx_xfer_t *r = KVP_CONTAINER_OF(pos, ucx_xfer_t, link);
            kvp__ucx_xfer_detach(x, r);
        }
        ucx_progress(&x->base);
        if (kvp_clock_now(rc) > deadline)
            break;
    }
}

static void ucx_destroy(ucx_xport_t *x)
{
    kvp_list_t *pos, *tmp;

    kvp_list_foreach_safe(pos, tmp, &x->closing)
    { /* past the deadline: give up */
        ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
        if (p->close_req)
            ucp_request_free(p->close_req);
        if (p->close_req_rma)
            ucp_request_free(p->close_req_rma);
        kvp_list_remove(&p->link);
        kvp__free(p);
    }
    kvp_list_foreach_safe(pos, tmp, &x->zombies)
    {
        ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
        KVP_ERROR(PFX(x), "peer %llu: endpoint still referenced at close; leaking it to UCX",
                  (unsigned long long)p->id);
        ucx_peer_close_out(p);
        kvp__ucx_cma_remove_peer(p);
        kvp__ucx_probe_unmark(p);
        if (p->rkey)
            ucp_rkey_destroy(p->rkey);
        kvp_list_remove(&p->link);
        kvp__free(p);
    }
    if (x->blob)
        kvp__free(x->blob);
    x->destroying = true;
    kvp__tcpd_close(x->tcpd); /* streams left (none normally): pieces only counted down */
    x->tcpd = NULL;
    kvp__pcred_close(x->pcred); /* every pidfd still held (the node released its loads) */
    x->pcred = NULL;
    if (x->worker_am)
        ucp_worker_destroy(x->worker_am);
    if (x->worker)
        ucp_worker_destroy(x->worker);
    /* The region and the proof segment go only once no worker is left that
     * could still read or land into them (issue 31; the contexts, which own
     * their registrations, go after). */
    kvp__ucx_region_release(x);
    kvp__ucx_probe_release(x);
    kvp__ucx_cma_close(x);
    if (x->ctx_am)
        ucp_cleanup(x->ctx_am);
    if (x->ctx)
        ucp_cleanup(x->ctx);
    if (x->epfd >= 0)
        close(x->epfd);
    for (uint32_t i = 0; x->pool && i < x->pool_cap; i++)
        kvp__free(x->pool[i].hdrs);
    kvp__free(x->pool); /* after the worker: no callback can name a record now */
    kvp__free(x->acc);
    kvp__free(x);
}

static kvp_status_t ucx_close(kvp_xport_t *xp, bool force)
{
    ucx_xport_t *x = ucx_of(xp);

    if (!force && ucx_busy(x))
        return KVP_ERR_BUSY;
    if (force && ucx_busy(x))
        KVP_WARN(PFX(x), "forced close with transfers in flight or retired");
    ucx_close_all_peers(x);
    ucx_destroy(x);
    return KVP_OK;
}

/* ---------------------------------------------------------------- create */

kvp_status_t kvp_ucx_xport_create(const kvp_ucx_config_t *cfg, kvp_xport_t **out)
{
    kvp_ucx_config_t def;

    if (!out)
        return KVP_ERR_INVALID;
    if (!cfg) {
        kvp_ucx_config_default(&def);
        cfg = &def;
    }
    uint32_t cap = cfg->max_transfers ? cfg->max_transfers : 4096;
    if (cap > UCX_IDX_MASK)
        return KVP_ERR_INVALID;
    ucx_xport_t *x = kvp__calloc(1, sizeof(*x));
    if (!x)
        return KVP_ERR_NOMEM;
    x->base.ops = &kvp_ucx_xport_ops;
    snprintf(x->prefix, sizeof(x->prefix), "%s", cfg->log_prefix ? cfg->log_prefix : "ucx");
    x->base.log_prefix = x->prefix;
    x->clock = cfg->clock ? cfg->clock : kvp_clock_real();
    x->connect_timeout_ns =
        (uint64_t)(cfg->connect_timeout_ms ? cfg->connect_timeout_ms : 2000) * KVP_NSEC_PER_MSEC;
    x->efd = x->efd_am = x->epfd = x->cma_efd = -1;
    x->legacy_put = cfg->legacy_put;
    kvp_ratelimit_init(&x->rl_blob, KVP_NSEC_PER_SEC, 50);
    if (cfg->host_id)
        snprintf(x->host_id, sizeof(x->host_id), "%s", cfg->host_id);
    else
        kvp__ucx_host_id_default(x->host_id, sizeof(x->host_id));
    kvp_list_init(&x->peers);
    kvp_list_init(&x->zombies);
    kvp_list_init(&x->closing);
    kvp_list_init(&x->free_list);
    kvp_list_init(&x->retired);
    kvp_list_init(&x->detached);
    x->pool = kvp__calloc(cap, sizeof(*x->pool));
    if (!x->pool) {
        kvp__free(x);
        return KVP_ERR_NOMEM;
    }
    x->pool_cap = cap;
    for (uint32_t i = 0; i < cap; i++) {
        x->pool[i].x = x;
        kvp_list_insert_tail(&x->free_list, &x->pool[i].link);
    }
    kvp__ucx_version_log(x);
    kvp_status_t st = kvp__ucx_ucp_open(x, cfg);
    if (st != KVP_OK) {
        ucx_destroy(x);
        return st;
    }
    *out = &x->base;
    return KVP_OK;
}

/* ------------------------------------------------------------ the ops */

/* The transfer records' ops are in ucx_xfer.c, the peer table's in
 * ucx_peer.c (issue 31). */
const kvp_xport_ops_t kvp_ucx_xport_ops = {
    .name = "ucx",
    .caps = KVP_XPORT_CAP_ALLOCATES_REGION | KVP_XPORT_CAP_FENCE | KVP_XPORT_CAP_EVENT_FD |
            KVP_XPORT_CAP_AM_LANDING,
    .register_region = kvp__ucx_register_region,
    .local_blob = kvp__ucx_local_blob,
    .add_peer = ucx_add_peer,
    .write = kvp__ucx_write,
    .poll = kvp__ucx_poll,
    .cancel = kvp__ucx_cancel,
    .remove_peer = ucx_remove_peer,
    .poll_retired = kvp__ucx_poll_retired,
    .force_release_retired = kvp__ucx_force_release_retired,
    .fence_peer = ucx_fence_peer,
    .peer_status = kvp__ucx_peer_status,
    .peer_path = kvp__ucx_peer_path,
    .exit_hold = kvp__ucx_exit_hold,
    .exit_drop = kvp__ucx_exit_drop,
    .exit_proven = kvp__ucx_exit_proven,
    .inbound_refusable = kvp__ucx_inbound_refusable,
    .landing_required = kvp__ucx_landing_required,
    .bind_next_peer = kvp__ucx_bind_next_peer,
    .next_peer_host = kvp__ucx_next_peer_host,
    .expect = kvp__ucx_expect,
    .refuse = kvp__ucx_refuse,
    .is_landed = kvp__ucx_is_landed,
    .progress = ucx_progress,
    .event_fd = ucx_event_fd,
    .arm = ucx_arm,
    .pump = kvp__ucx_cma_pump,
    .get_stats = ucx_get_stats,
    .close = ucx_close,
};
