/*
 * sessions.c -- the node's session table (SPEC §2 layer 6): the sessions the
 * ctl hands up when a link is ready (ctl_on_ready), their frames
 * (ctl_on_frame), their end (ctl_on_down -> kvp__node_session_down:
 * teardown, sibling probation, PEER_DOWN), the session layer's upcalls
 * (kvp_session_up_t) and the lookup by peer id.
 */
#include "node/node.h"

#include <stdio.h>
#include <string.h>

kvp_session_t *kvp__node_find_session(kvp_node_t *n, const char *peer)
{
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &n->sessions)
    {
        kvp_session_t *s = KVP_SESSION_OF(p, node_link);
        if (strcmp(kvp__session_peer(s), peer) == 0)
            return s;
    }
    return NULL;
}

/* Have the node run the session's queued work at the end of the call. */
static void node_schedule(kvp_node_t *n, kvp_session_t *s)
{
    kvp_session_links_t *sl = kvp__session_links(s);
    if (!kvp_list_linked(&sl->flush_link))
        kvp_list_insert_tail(&n->flushq, &sl->flush_link);
}

/* The session layer's upcalls (kvp_session_up_t). */
static void up_emit(void *arg, const kvp_event_t *ev)
{
    kvp__node_emit(arg, ev);
}

static void up_mark_active(void *arg, kvp_session_t *s)
{
    kvp_node_t *n = arg;
    kvp_session_links_t *sl = kvp__session_links(s);
    if (!kvp_list_linked(&sl->active_link))
        kvp_list_insert_tail(&n->active, &sl->active_link);
}

static void up_schedule(void *arg, kvp_session_t *s)
{
    node_schedule(arg, s);
}

const kvp_session_up_t kvp__node_session_up = {
    .emit = up_emit,
    .mark_active = up_mark_active,
    .schedule = up_schedule,
};

/* Sibling probation (SPEC §8): a session of this instance died by a fault;
 * every other session to the same instance is put on probation. */
static void node_probation_siblings(kvp_node_t *n, const char *instance_id)
{
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &n->sessions)
    {
        kvp_session_t *o = KVP_SESSION_OF(p, node_link);
        kvp_session_info_t si;
        kvp__session_info(o, &si);
        if (strcmp(si.instance, instance_id) == 0)
            kvp__session_probation(o, true);
    }
}

/* The session ends (its link went down, or the node ends it now: bye):
 * out of the tables, its end and teardown (SPEC §7), then the node's part:
 * probation of its siblings after a fault, the PEER_DOWN event. */
void kvp__node_session_down(kvp_node_t *n, kvp_session_t *s, int bye, bool fault, const char *why)
{
    char peer[KVP_WIRE_STR_MAX + 1], instance[KVP_WIRE_STR_MAX + 1];
    kvp_session_close_t closed;
    kvp_session_info_t si;
    kvp_session_links_t *sl = kvp__session_links(s);
    kvp__session_info(s, &si);
    snprintf(peer, sizeof(peer), "%s", si.peer);
    snprintf(instance, sizeof(instance), "%s", si.instance);
    if (kvp_list_linked(&sl->flush_link))
        kvp_list_remove(&sl->flush_link);
    kvp_list_remove(&sl->node_link);
    n->n_sessions--;
    n->st.peers_down++;
    kvp__session_end(s, bye, fault, why, &closed); /* frees s */
    if (fault)
        node_probation_siblings(n, instance);
    kvp_event_t ev = {.type = KVP_EV_PEER_DOWN, .status = fault ? KVP_ERR_UNREACHABLE : KVP_OK};
    ev.fault = fault;
    snprintf(ev.peer, sizeof(ev.peer), "%s", peer);
    kvp__node_emit(n, &ev);
}

static kvp_status_t ctl_on_ready(void *arg, kvp_link_t *link, const kvp_msg_hello_t *peer,
                                 const void *blob, size_t blob_len)
{
    kvp_node_t *n = arg;
    kvp_session_t *s;
    if (n->draining)
        return KVP_ERR_CLOSED; /* a peer (re)connecting while we shut down: BYE shutdown */
    if (n->n_sessions >= n->cfg.max_sessions) {
        /* The ctl refuses at the HELLO already (sessions_refused counts both). */
        n->st.sessions_refused++;
        KVP_LOG_RL(&n->rl_cap, kvp__node_now(n), KVP_LOG_WARN, n->name,
                   "peer %s: session refused: max_sessions (%u) reached", peer->peer_id,
                   n->cfg.max_sessions);
        return KVP_ERR_LIMIT;
    }
    kvp_status_t st = kvp__session_create(&n->env, link, peer, blob, blob_len, &s);
    if (st != KVP_OK)
        return st;
    kvp_list_insert_tail(&n->sessions, &kvp__session_links(s)->node_link);
    n->n_sessions++;
    kvp_link_set_user(link, s);
    kvp_event_t ev = {.type = KVP_EV_PEER_UP};
    snprintf(ev.peer, sizeof(ev.peer), "%s", kvp__session_peer(s));
    kvp__node_emit(n, &ev);
    return KVP_OK;
}

static void ctl_on_frame(void *arg, kvp_link_t *link, const kvp_msg_t *msg)
{
    kvp_session_t *s = kvp_link_user(link);
    (void)arg;
    if (s != NULL)
        kvp__session_on_frame(s, msg);
}

static void ctl_on_down(void *arg, kvp_link_t *link, kvp_down_reason_t reason, uint16_t bye_reason,
                        bool fault)
{
    kvp_session_t *s = kvp_link_user(link);
    (void)arg;
    if (s == NULL)
        return;
    char why[128];
    snprintf(why, sizeof(why), "%s%s%s", kvp_down_reason_str(reason),
             reason == KVP_DOWN_BYE ? " " : "", reason == KVP_DOWN_BYE ? kvp_bye_reason_str(bye_reason) : "");
    kvp__node_session_down(arg, s, -1, fault, why);
}

static void ctl_on_pong(void *arg, kvp_link_t *link, uint64_t rtt_ns)
{
    kvp_session_t *s = kvp_link_user(link);
    (void)arg;
    if (s != NULL)
        kvp__session_on_pong(s, rtt_ns);
}

/* The ctl's callbacks into this file (kvp_ctl_config_t.cb), for node_make_ctl. */
void kvp__node_ctl_callbacks(kvp_node_t *n, kvp_ctl_callbacks_t *cb)
{
    *cb = (kvp_ctl_callbacks_t){ctl_on_ready, ctl_on_frame, ctl_on_down, ctl_on_pong, n};
}
