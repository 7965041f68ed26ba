/*
 * session_node.c -- the session's calls for the node (session.h, issue 31):
 * the accessors the node reads a session through, and the entries that
 * fold what it always calls together (a request of the embedding, the
 * flush, a cancel, a finished request, the transport's poll, an endpoint
 * check, a PONG). The node touches no field of a session but its list
 * links (kvp_session_links_t).
 */
#include "session/session_int.h"

void kvp__session_end(kvp_session_t *s, int bye, bool fault, const char *why,
                      kvp_session_close_t *out)
{
    if (bye < 0)
        kvp__session_link_down(s);
    else
        kvp__session_close_now(s, (kvp_bye_reason_t)bye);
    kvp__session_teardown(s, fault, why, out); /* frees s */
}

bool kvp__session_open(const kvp_session_t *s)
{
    return kvp__sess_open(s);
}

bool kvp__session_ready(const kvp_session_t *s)
{
    return kvp__sess_open(s) && !s->probation;
}

const char *kvp__session_peer(const kvp_session_t *s)
{
    return s->peer_id;
}

bool kvp__session_lookup_due(const kvp_session_t *s)
{
    return !kvp_list_empty(&s->lookups_sent);
}

bool kvp__session_idle_for(const kvp_session_t *s, uint64_t now, uint64_t idle_ns)
{
    return kvp__sess_open(s) && kvp__session_idle(s) && now - s->last_work_ns >= idle_ns;
}

void kvp__session_info(const kvp_session_t *s, kvp_session_info_t *out)
{
    const kvp_list_t *p;
    *out = (kvp_session_info_t){.peer = s->peer_id, .instance = s->instance_id, .path = s->path};
    out->open = kvp__sess_open(s);
    out->probation = s->probation;
    out->rtt_ns = s->link ? kvp_link_rtt_ns(s->link) : 0;
    out->bytes_inflight = s->bytes_inflight;
    for (p = s->loads.next; p != &s->loads; p = p->next)
        out->loads_inflight++;
}

void kvp__session_on_pong(kvp_session_t *s, uint64_t rtt_ns)
{
    s->peer_heard = true; /* a READY link answered: the peer's session exists */
    /* Proof of life only from a PING sent after the probation began. */
    if (s->probation && kvp__env_now(s->env) - rtt_ns >= s->probation_ns)
        kvp__session_probation(s, false);
}

kvp_status_t kvp__session_request(kvp_session_t *s, uint64_t id, const kvp_session_req_t *r)
{
    switch (r->call) {
    case KVP_CALL_LOOKUP:
        return kvp__client_lookup(s, id, r->request_id, r->keys, r->lens, r->n, r->results);
    case KVP_CALL_LOOKUP_PREFIX:
        return kvp__client_lookup_prefix(s, id, r->request_id, r->keys, r->lens, r->n,
                                         r->results);
    case KVP_CALL_LEASE_RENEW:
        return kvp__client_lease_renew(s, r->request_id);
    case KVP_CALL_FETCH:
        return kvp__client_fetch(s, id, r->request_id, r->keys, r->lens, r->n, r->flags,
                                 r->block_status);
    case KVP_CALL_FETCH_INTO:
        return kvp__client_fetch_into(s, id, r->request_id, r->keys, r->lens, r->n, r->slots,
                                      r->flags, r->block_status);
    }
    return KVP_ERR_INVALID;
}

void kvp__session_flush(kvp_session_t *s)
{
    kvp__client_flush_lookups(s);
    kvp__client_start_queued(s); /* budget freed since the last call */
}

kvp_status_t kvp__session_cancel(kvp_session_t *s, uint64_t op_id)
{
    kvp_load_t *l = kvp__client_find_load(s, op_id);
    if (l == NULL || l->published)
        return KVP_ERR_NOT_FOUND;
    kvp__client_abort(l, KVP_ERR_CANCELED);
    return KVP_OK;
}

void kvp__session_finish_request(kvp_session_t *s, uint64_t request_id)
{
    kvp__client_finish_request(s, request_id); /* our loads: one failure outcome each (F7) */
    kvp__server_finish_request(s, request_id); /* our supply and parked demand (F11) */
}

bool kvp__session_poll_xfers(kvp_session_t *s)
{
    kvp_session_env_t *e = s->env;
    size_t got;
    do {
        got = 0;
        e->xport->ops->poll(e->xport, s->xpeer, e->results, KVP_ARRAY_SIZE(e->results), &got);
        for (size_t i = 0; i < got; i++)
            kvp__server_on_xfer_done(s, e->results[i].id, e->results[i].status);
    } while (got == KVP_ARRAY_SIZE(e->results));
    return s->xfers_inflight != 0;
}

/* Sessions whose endpoint failed (an endpoint error, or a data path that
 * never came up) are closed as faults: nothing can be written through them
 * any more, and the dialer reconnects on fresh endpoints. */
bool kvp__session_check_endpoint(kvp_session_t *s)
{
    kvp_xport_t *x = s->env->xport;
    if (!kvp__sess_open(s) || x->ops->peer_status(x, s->xpeer) == KVP_OK)
        return false;
    if (!kvp_list_empty(&s->loads))
        kvp__session_fault(s, KVP_BYE_TRANSPORT, "error on our endpoint to the source: "
                                                 "outcome of its loads unknown");
    else /* running transfers are retained as in §7 */
        kvp__session_fault(s, KVP_BYE_TRANSPORT, "our endpoint to the peer failed");
    return true;
}
