/*
 * session.c -- one session per peer (SPEC §2 layer 5): created when the
 * control link is ready (HELLO, AUTH, both HELLO_ACKs), bound to the peer's
 * data-transport registration; dispatches frames to the client and server
 * roles; tears down per SPEC §7 when the link goes down.
 *
 * Incarnation isolation (I3): frames of another incarnation never reach
 * here (the ctl drops frames whose epochs do not match); transfers of an old
 * incarnation are retired by remove_peer and never reported by poll() of the
 * new peer handle; loads of the old incarnation live on env->quarantined,
 * unreachable from the new session's frames.
 */
#include "session/session_int.h"

#include <stdio.h>
#include <string.h>

void kvp__session_env_init(kvp_session_env_t *e)
{
    kvp_list_init(&e->waiting);
    kvp_list_init(&e->retained);
    kvp_list_init(&e->quarantined);
    kvp_list_init(&e->landing);
    kvp_list_init(&e->verify_wait);
    e->n_retained = 0;
    atomic_init(&e->parked, 0);
    e->next_round = 1;
    memset(e->releases, 0, sizeof(e->releases));
}

kvp_status_t kvp__session_create(kvp_session_env_t *n, kvp_link_t *link,
                                 const kvp_msg_hello_t *hello, const void *blob, size_t blob_len,
                                 kvp_session_t **out)
{
    kvp_session_t *s = kvp__calloc(1, sizeof(*s));
    if (s == NULL)
        return KVP_ERR_NOMEM;
    kvp_layout_t layout = {hello->num_blocks, hello->block_size};
    if (n->xport->ops->bind_next_peer != NULL) /* issue 27: the proof is per connection */
        n->xport->ops->bind_next_peer(n->xport, kvp_link_binding(link));
    if (n->xport->ops->next_peer_host != NULL) { /* issue 27: a wildcard data stream address */
        char host[64];
        kvp_link_remote_host(link, host, sizeof(host));
        n->xport->ops->next_peer_host(n->xport, host);
    }
    kvp_status_t st = n->xport->ops->add_peer(n->xport, blob, blob_len, &layout, &s->xpeer);
    if (st != KVP_OK) {
        KVP_LOG_RL(n->rl_proto, kvp__env_now(n), KVP_LOG_ERROR, n->name,
                   "peer %s: data-transport blob refused: %s", hello->peer_id, kvp_status_str(st));
        kvp__free(s);
        return st;
    }
    s->env = n;
    s->link = link;
    s->state = KVP_SESS_READY; /* house: initial state (no transition leads to READY) */
    snprintf(s->peer_id, sizeof(s->peer_id), "%s", hello->peer_id);
    snprintf(s->instance_id, sizeof(s->instance_id), "%s", hello->instance_id);
    s->peer_num_blocks = hello->num_blocks;
    s->peer_block_size = hello->block_size;
    s->path = n->xport->ops->peer_path(n->xport, s->xpeer);
    s->last_work_ns = kvp__env_now(n);
    kvp__keyrate_take(s); /* the key rate outlives the session (keyrate.c) */
    kvp_ratelimit_init(&s->rl, KVP_NSEC_PER_SEC, 5);
    kvp_ratelimit_init(&s->rl_limit, KVP_NSEC_PER_SEC, 5);
    kvp_list_init(&s->nl.node_link);
    kvp_list_init(&s->nl.active_link);
    kvp_list_init(&s->nl.flush_link);
    kvp_list_init(&s->lookups_queued);
    kvp_list_init(&s->lookups_sent);
    kvp_list_init(&s->loads);
    kvp_list_init(&s->creqs);
    kvp_list_init(&s->fetchq);
    kvp_list_init(&s->srounds);
    kvp_list_init(&s->srounds_done);
    kvp_list_init(&s->xfers);
    KVP_INFO(n->name, "peer %s (instance %s) up, data path %s", s->peer_id, s->instance_id,
             kvp_data_path_str(s->path));
    *out = s;
    return KVP_OK;
}

static const char *const sess_state_names[] = {"ready", "closing", "down"};

kvp_status_t kvp__session_send(kvp_session_t *s, kvp_msg_t *m)
{
    if (!kvp__sess_open(s))
        return KVP_ERR_CLOSED;
    return kvp_link_send(s->link, m);
}

void kvp__session_mark_active(kvp_session_t *s)
{
    s->env->up->mark_active(s->env->up_arg, s);
}

void kvp__session_fault(kvp_session_t *s, kvp_bye_reason_t reason, const char *why)
{
    kvp_session_env_t *n = s->env;
    if (!kvp__sess_open(s))
        return;
    if (reason == KVP_BYE_PROTOCOL)
        n->st->protocol_errors++;
    KVP_LOG_RL(&s->rl, kvp__env_now(n), KVP_LOG_ERROR, n->name,
               "peer %s: closing session as fault (%s): %s", s->peer_id,
               kvp_bye_reason_str(reason), why);
    kvp__session_set_state(s, KVP_SESS_CLOSING);
    kvp_link_close(s->link, reason); /* teardown runs from on_down */
}

#ifndef NDEBUG
/* Whether the session's state is one it can be in (debug builds, from the
 * setter; SQLite's assert_pager_state): a live session has its link, and
 * the byte budget in use is its SENT loads' bytes. */
static bool session_check(const kvp_session_t *s)
{
    KVP_ASSERT((unsigned)s->state <= KVP_SESS_DOWN);
    KVP_ASSERT(s->state == KVP_SESS_DOWN || s->link != NULL);
    uint64_t bytes = 0;
    const kvp_list_t *p;
    for (p = s->loads.next; p != &s->loads; p = p->next)
        bytes += KVP_CONTAINER_OF(p, kvp_load_t, link)->bytes;
    KVP_ASSERT(bytes == s->bytes_inflight);
    return true;
}
#endif

void kvp__session_set_state(kvp_session_t *s, kvp_session_state_t to)
{
    static const uint8_t legal[3] = {
        [KVP_SESS_READY] = 0, /* only kvp__session_create starts a session here */
        [KVP_SESS_CLOSING] = 1u << KVP_SESS_READY,
        [KVP_SESS_DOWN] = (1u << KVP_SESS_READY) | (1u << KVP_SESS_CLOSING),
    };
    KVP_ASSERT(legal[to] & (1u << s->state));
    KVP_TRACE(s->env->name, "peer %s: session %s -> %s", s->peer_id, sess_state_names[s->state],
              sess_state_names[to]);
    s->state = to;
#ifndef NDEBUG
    (void)session_check(s);
#endif
}

bool kvp__session_idle(const kvp_session_t *s)
{
    return kvp_list_empty(&s->loads) && kvp_list_empty(&s->fetchq) &&
           kvp_list_empty(&s->srounds) && kvp_list_empty(&s->srounds_done) &&
           kvp_list_empty(&s->xfers) && kvp_list_empty(&s->lookups_queued) &&
           kvp_list_empty(&s->lookups_sent);
}

void kvp__session_close(kvp_session_t *s, kvp_bye_reason_t reason)
{
    KVP_ASSERT(kvp__sess_open(s) && s->link != NULL);
    kvp__session_set_state(s, KVP_SESS_CLOSING);
    kvp_link_close(s->link, reason); /* the teardown follows from the link's down */
}

void kvp__session_link_down(kvp_session_t *s)
{
    KVP_ASSERT(s->link != NULL && kvp_link_user(s->link) == s);
    kvp_link_set_user(s->link, NULL);
    s->link = NULL;
    kvp__session_set_state(s, KVP_SESS_DOWN);
}

void kvp__session_close_now(kvp_session_t *s, kvp_bye_reason_t reason)
{
    if (s->link == NULL)
        return; /* down already */
    kvp_link_set_user(s->link, NULL); /* no down callback: the caller tears down */
    kvp_link_close(s->link, reason);
    s->link = NULL;
    kvp__session_set_state(s, KVP_SESS_DOWN);
}

void kvp__session_on_frame(kvp_session_t *s, const kvp_msg_t *m)
{
    s->peer_heard = true; /* sent by the peer's session: its endpoint to us exists */
    if (!kvp__sess_open(s))
        return;
    s->last_work_ns = kvp__env_now(s->env);
    switch (m->type) {
    case KVP_MSG_LOOKUP:
        kvp__server_on_lookup(s, &m->u.lookup, m->flags);
        break;
    case KVP_MSG_FETCH:
        kvp__server_on_fetch(s, &m->u.fetch);
        break;
    case KVP_MSG_ABORT:
        kvp__server_on_abort(s, &m->u.abort);
        break;
    case KVP_MSG_LOOKUP_RESP:
        kvp__client_on_lookup_resp(s, &m->u.lookup_resp, m->flags);
        break;
    case KVP_MSG_FETCH_DONE:
        kvp__client_on_fetch_done(s, &m->u.fetch_done);
        break;
    case KVP_MSG_ABORT_ACK:
        kvp__client_on_abort_ack(s, &m->u.abort);
        break;
    default: /* handshake frames after ready: protocol error */
        kvp__session_fault(s, KVP_BYE_PROTOCOL, "unexpected frame type after handshake");
        break;
    }
}

/* Probation (SPEC §8): a sibling of this session's instance died by a fault.
 * Loads in flight fail for routing (slots quarantined until ABORT_ACK or
 * FETCH_DONE proves them), new work answers MISS until a fresh PONG. */
void kvp__session_probation(kvp_session_t *s, bool on)
{
    kvp_session_env_t *n = s->env;
    if (on == s->probation)
        return;
    s->probation = on;
    if (!on) {
        KVP_INFO(n->name, "peer %s: proven alive, probation over", s->peer_id);
        return;
    }
    n->st->probations++;
    s->probation_ns = kvp__env_now(n);
    KVP_WARN(n->name, "peer %s: sibling of instance %s died: on probation", s->peer_id,
             s->instance_id);
    kvp__client_fail_queued(s, KVP_ERR_UNREACHABLE); /* never started: fail now */
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &s->loads)
    {
        kvp_load_t *l = KVP_CONTAINER_OF(p, kvp_load_t, link);
        if (l->slots == KVP_LOAD_SLOTS_HELD || l->phase == KVP_LOAD_SETTLED ||
            l->phase == KVP_LOAD_LANDING)
            continue; /* LANDING: answered already; its blocks or the bound end it */
        kvp__client_fail_unknown(l, KVP_ERR_UNREACHABLE);
        kvp__client_abort(l, KVP_ERR_UNREACHABLE); /* the ack is the proof */
    }
    if (s->link != NULL)
        kvp_link_ping(s->link);
}

/* Teardown per SPEC §7: consumer side quarantines, fence (proof on a
 * fenceable path), source side cancels in WAIT mode and retains, then the
 * peer is removed from the transport (retire; endpoint release deferred).
 * The caller (the node) unlinked the session from its tables; probation of
 * siblings after a fault is the node's. */
void kvp__session_teardown(kvp_session_t *s, bool fault, const char *why,
                           kvp_session_close_t *out)
{
    kvp_session_env_t *n = s->env;
    kvp_xport_t *x = n->xport;
    KVP_ASSERT(s->state == KVP_SESS_DOWN && s->link == NULL); /* set by the caller */
    memset(out, 0, sizeof(*out));
    kvp__client_teardown(s, fault, out);
    bool proof = false;
    /* The fence covers the peer's endpoints to us that exist when it
     * completes. Until we heard from the peer's ready session, its endpoint
     * may not exist yet (our HELLO_ACK still on its way, e.g. held by a
     * partition): it would be created after the fence, unfenced, and a FETCH
     * delivered late would be written through it. No proof then: the loads
     * wait for the hold cap (issue 15, sim seeds 1045551, 1087982). */
    if (x->ops->fence_peer(x, s->xpeer, &proof) == KVP_OK && proof && s->peer_heard) {
        kvp_list_t *p, *t;
        out->fenced = true;
        kvp_list_foreach_safe(p, t, &n->quarantined)
        {
            kvp_load_t *l = KVP_CONTAINER_OF(p, kvp_load_t, link);
            if (l->xpeer != s->xpeer)
                continue;
            uint32_t k = 0;
            for (uint32_t i = 0; i < l->n; i++)
                k += l->blocks[i].reserved;
            out->loads_quarantined--;
            out->slots_quarantined -= k;
            out->slots_fenced += k;
            kvp__load_release_quarantine(l, KVP_PROOF_FENCE); /* no byte can land */
        }
    } else {
        /* Issue 27: no fence on this path (direct shm), but the source's
         * process may have exited already (proof, whatever our HELLO_ACK's
         * fate: a dead process creates no endpoint). Usually it is reported
         * a little later: the node's hold check asks again. */
        out->slots_exited = kvp__client_release_exited(n, s->xpeer);
        out->slots_quarantined -= out->slots_exited;
    }
    kvp__server_teardown(s, out);
    x->ops->remove_peer(x, s->xpeer);
    if (kvp_list_linked(&s->nl.active_link))
        kvp_list_remove(&s->nl.active_link);
    KVP_LOG(fault ? KVP_LOG_WARN : KVP_LOG_INFO, n->name, "peer %s down (%s): %s", s->peer_id,
            fault ? "fault" : "graceful", why);
    KVP_DEBUG(n->name,
              "peer %s closed: %u loads failed, %u quarantined (%u slots), %u slots fenced, "
              "%u refused, %u released (process exited); %u transfers retained (%u pins), "
              "%u released",
              s->peer_id, out->loads_failed, out->loads_quarantined, out->slots_quarantined,
              out->slots_fenced, out->slots_refused, out->slots_exited, out->xfers_retained,
              out->pins_retained, out->xfers_released);
    kvp__keyrate_leave(s);
    kvp__free(s);
}
