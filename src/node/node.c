/*
 * node.c -- the node (SPEC §2 layer 6): owns the store, the data transport,
 * the control plane and the session table; runs the poll round; reaps
 * retained transfers and quarantined slots (hold cap); hands work between
 * engine threads and the owner thread.
 *
 * Threads: one thread owns all state below (the progress thread in
 * KVP_THREAD_OWN mode, the caller of kvp_node_progress() otherwise). Other
 * threads only touch `lock`, `cmds`, `cond` and the event ring.
 *
 * Poll round (node_round): commands -> transport progress -> completions of
 * sessions with transfers in flight (O(active), not O(sessions)) -> retired
 * transfers -> queued lookups -> sleep in the loop until an fd or the nearest
 * named deadline.
 */
#include "node/node.h"
#include "node/events.h"
#ifdef KVP_TESTING
#include "transport/fake.h"
#endif
#include "transport/ucx.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct kvp_cmd {
    kvp_list_t link;
    kvp_status_t (*fn)(kvp_node_t *n, void *arg);
    void *arg;
    kvp_status_t result;
    bool done;
};

uint64_t kvp__node_now(const kvp_node_t *n)
{
    return kvp_clock_now(n->clock);
}

/* ------------------------------------------------------------- events */

/* The eventfd is readable while events wait: written once per batch, under
 * the lock so that ev_signalled is exact (kvp__node_take_events reads it
 * back, and only then: an empty poll makes no syscall). Not while a waiting
 * thread leads (ev_quiet): it takes the batch itself, and what it leaves is
 * signalled when its lead ends (node_lead), one round later at most. */
static void node_ev_signal_locked(kvp_node_t *n)
{
    if (n->ev_signalled || n->ev_quiet || n->evfd < 0 || (n->ev_count == 0 && n->events_dropped == 0))
        return;
    uint64_t one = 1;
    ssize_t w = write(n->evfd, &one, sizeof(one));
    (void)w;
    n->ev_signalled = true;
}

void kvp__node_emit(kvp_node_t *n, const kvp_event_t *ev)
{
    pthread_mutex_lock(&n->lock);
    if (n->ev_count == KVP_EVENT_RING_MAX) { /* bounded: drop, counted, reported */
        uint64_t dropped = ++n->events_dropped;
        pthread_mutex_unlock(&n->lock);
        if (dropped == 1 || (dropped & 1023) == 0)
            KVP_ERROR(n->name,
                      "event ring full (%u undelivered events): event type %d dropped "
                      "(%llu so far); the embedding does not poll kvp_poll_events",
                      (unsigned)KVP_EVENT_RING_MAX, ev->type, (unsigned long long)dropped);
        return;
    }
    if (n->ev_count == n->ev_cap) {
        uint32_t cap = n->ev_cap ? KVP_MIN(n->ev_cap * 2, (uint32_t)KVP_EVENT_RING_MAX) : 64;
        kvp_event_t *ne = kvp__malloc(cap * sizeof(*ne));
        if (ne == NULL) {
            n->events_dropped++;
            pthread_mutex_unlock(&n->lock);
            KVP_ERROR(n->name, "event queue full and out of memory: event dropped");
            return;
        }
        for (uint32_t i = 0; i < n->ev_count; i++)
            ne[i] = n->events[(n->ev_head + i) % n->ev_cap];
        kvp__free(n->events);
        n->events = ne;
        n->ev_head = 0;
        n->ev_cap = cap;
    }
    n->events[(n->ev_head + n->ev_count) % n->ev_cap] = *ev;
    n->ev_count++;
    node_ev_signal_locked(n);
    pthread_mutex_unlock(&n->lock);
}

kvp_status_t kvp__node_take_events(kvp_node_t *n, kvp_event_t *out, uint32_t cap, uint32_t *n_out)
{
    uint32_t k = 0;
    pthread_mutex_lock(&n->lock);
    if (cap > 0 && n->events_dropped > 0) { /* the loss first: the caller must know */
        memset(&out[0], 0, sizeof(out[0]));
        out[0].type = KVP_EV_OVERFLOW;
        out[0].status = KVP_ERR_LIMIT;
        out[0].n_keys = (uint32_t)KVP_MIN(n->events_dropped, UINT32_MAX);
        n->events_dropped = 0;
        k = 1;
    }
    while (k < cap && n->ev_count > 0) {
        out[k++] = n->events[n->ev_head];
        n->ev_head = (n->ev_head + 1) % n->ev_cap;
        n->ev_count--;
    }
    if (n->ev_count == 0 && n->events_dropped == 0 && n->ev_signalled) { /* drained */
        uint64_t v;
        ssize_t r = read(n->evfd, &v, sizeof(v)); /* no longer readable */
        (void)r;
        n->ev_signalled = false;
    }
    pthread_mutex_unlock(&n->lock);
    *n_out = k;
    return KVP_OK;
}

/* ----------------------------------------------------------- sessions */

kvp_session_t *kvp__node_find_session(kvp_node_t *n, const char *peer)
{
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &n->sessions)
    {
        kvp_session_t *s = KVP_CONTAINER_OF(p, kvp_session_t, node_link);
        if (strcmp(s->peer_id, peer) == 0)
            return s;
    }
    return NULL;
}

kvp_load_t *kvp__node_find_load(kvp_node_t *n, uint64_t op_id)
{
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &n->sessions)
    {
        kvp_load_t *l = kvp__client_find_load(KVP_CONTAINER_OF(p, kvp_session_t, node_link), op_id);
        if (l != NULL)
            return l;
    }
    return NULL;
}

/* Have the node run the session's queued work at the end of the call. */
static void node_schedule(kvp_node_t *n, kvp_session_t *s)
{
    if (!kvp_list_linked(&s->flush_link))
        kvp_list_insert_tail(&n->flushq, &s->flush_link);
}

/* The session layer's upcalls (kvp_session_up_t). */
static void up_emit(void *arg, const kvp_event_t *ev)
{
    kvp__node_emit(arg, ev);
}

static void up_mark_active(void *arg, kvp_session_t *s)
{
    kvp_node_t *n = arg;
    if (!kvp_list_linked(&s->active_link))
        kvp_list_insert_tail(&n->active, &s->active_link);
}

static void up_schedule(void *arg, kvp_session_t *s)
{
    node_schedule(arg, s);
}

static const kvp_session_up_t node_session_up = {
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
        kvp_session_t *o = KVP_CONTAINER_OF(p, kvp_session_t, node_link);
        if (strcmp(o->instance_id, instance_id) == 0)
            kvp__session_probation(o, true);
    }
}

/* The session's link is down (s->link NULL, state DOWN): out of the tables,
 * teardown (SPEC §7), then the node's part: probation of its siblings after
 * a fault, the PEER_DOWN event. */
static void node_session_down(kvp_node_t *n, kvp_session_t *s, bool fault, const char *why)
{
    char peer[KVP_WIRE_STR_MAX + 1], instance[KVP_WIRE_STR_MAX + 1];
    kvp_session_close_t closed;
    snprintf(peer, sizeof(peer), "%s", s->peer_id);
    snprintf(instance, sizeof(instance), "%s", s->instance_id);
    if (kvp_list_linked(&s->flush_link))
        kvp_list_remove(&s->flush_link);
    kvp_list_remove(&s->node_link);
    n->n_sessions--;
    n->st.peers_down++;
    kvp__session_teardown(s, fault, why, &closed); /* frees s */
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
    kvp_list_insert_tail(&n->sessions, &s->node_link);
    n->n_sessions++;
    kvp_link_set_user(link, s);
    kvp_event_t ev = {.type = KVP_EV_PEER_UP};
    snprintf(ev.peer, sizeof(ev.peer), "%s", s->peer_id);
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
    kvp_link_set_user(link, NULL);
    s->link = NULL;
    kvp__session_set_state(s, KVP_SESS_DOWN);
    char why[128];
    snprintf(why, sizeof(why), "%s%s%s", kvp_down_reason_str(reason),
             reason == KVP_DOWN_BYE ? " " : "", reason == KVP_DOWN_BYE ? kvp_bye_reason_str(bye_reason) : "");
    node_session_down(arg, s, fault, why);
}

static void ctl_on_pong(void *arg, kvp_link_t *link, uint64_t rtt_ns)
{
    kvp_node_t *n = arg;
    kvp_session_t *s = kvp_link_user(link);
    if (s != NULL)
        s->peer_heard = true; /* a READY link answered: the peer's session exists */
    /* Proof of life only from a PING sent after the probation began. */
    if (s != NULL && s->probation && kvp__node_now(n) - rtt_ns >= s->probation_ns)
        kvp__session_probation(s, false);
}

/* ------------------------------------------------------- hold cap, reap */

static void node_poll_retired(kvp_node_t *n)
{
    size_t got;
    if (kvp_list_empty(&n->env.retained))
        return;
    do {
        got = 0;
        n->xport->ops->poll_retired(n->xport, n->results, KVP_ARRAY_SIZE(n->results), &got);
        for (size_t i = 0; i < got; i++) {
            kvp_list_t *p, *t;
            kvp_list_foreach_safe(p, t, &n->env.retained)
            {
                kvp_xfer_t *x = KVP_CONTAINER_OF(p, kvp_xfer_t, link);
                if (x->id != n->results[i].id)
                    continue;
                KVP_INFO(n->name, "peer %s: retained transfer %llu stopped (%s): released", x->peer,
                         (unsigned long long)x->id, kvp_status_str(n->results[i].status));
                kvp__xfer_release(&n->env, x, KVP_PROOF_TERMINAL); /* poll_retired handed it back */
                n->env.n_retained--;
                break;
            }
        }
    } while (got == KVP_ARRAY_SIZE(n->results));
}

static void node_force_release_retired(kvp_node_t *n, kvp_xfer_t *x, const char *why)
{
    KVP_ERROR(n->name, "peer %s: retained transfer %llu force-released (%s): its source slots "
                       "may still be read",
              x->peer, (unsigned long long)x->id, why);
    n->xport->ops->force_release_retired(n->xport, &x->id, 1);
    kvp__xfer_release(&n->env, x, KVP_PROOF_HOLD_CAP);
    n->env.n_retained--;
    n->st.force_releases++;
}

static void node_force_release_quarantine(kvp_node_t *n, kvp_load_t *l, const char *why)
{
    KVP_ERROR(n->name, "peer %s: %u quarantined slots of load %llu released (%s): marked suspect",
              l->peer, l->n, (unsigned long long)l->op_id, why);
    n->st.force_releases++;
    kvp__load_release_quarantine(l, KVP_PROOF_HOLD_CAP);
}

static bool session_idle(const kvp_session_t *s)
{
    return kvp_list_empty(&s->loads) && kvp_list_empty(&s->fetchq) &&
           kvp_list_empty(&s->srounds) && kvp_list_empty(&s->srounds_done) &&
           kvp_list_empty(&s->xfers) && kvp_list_empty(&s->lookups_queued) &&
           kvp_list_empty(&s->lookups_sent);
}

/* Sessions whose endpoint failed (an endpoint error, or a data path that
 * never came up) are closed as faults: nothing can be written through them
 * any more, and the dialer reconnects on fresh endpoints. Run from the hold
 * timer and at once whenever the transport reports a new endpoint failure
 * (xport->ep_failures). */
static void node_check_endpoints(kvp_node_t *n)
{
    kvp_list_t *p, *t;
    n->ep_failures_seen = n->xport->ep_failures;
    kvp_list_foreach_safe(p, t, &n->sessions)
    {
        kvp_session_t *s = KVP_CONTAINER_OF(p, kvp_session_t, node_link);
        if (!kvp__session_open(s) || n->xport->ops->peer_status(n->xport, s->xpeer) == KVP_OK)
            continue;
        if (!kvp_list_empty(&s->loads))
            kvp__session_fault(s, KVP_BYE_TRANSPORT, "error on our endpoint to the source: "
                                                     "outcome of its loads unknown");
        else /* running transfers are retained as in §7 */
            kvp__session_fault(s, KVP_BYE_TRANSPORT, "our endpoint to the peer failed");
    }
}

/* Hold cap (SPEC §7.3-4), the endpoint check (F26), idle sessions. */
static void node_hold_check(kvp_node_t *n)
{
    uint64_t now = kvp__node_now(n), cap = (uint64_t)n->cfg.hold_cap_ms * KVP_NSEC_PER_MSEC;
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &n->env.retained)
    {
        kvp_xfer_t *x = KVP_CONTAINER_OF(p, kvp_xfer_t, link);
        if (now - x->retained_ns >= cap)
            node_force_release_retired(n, x, "hold cap");
    }
    kvp_list_foreach_safe(p, t, &n->env.quarantined)
    {
        kvp_load_t *l = KVP_CONTAINER_OF(p, kvp_load_t, link);
        if (now - l->quarantined_ns >= cap)
            node_force_release_quarantine(n, l, "hold cap");
    }
    node_check_endpoints(n);
    kvp_list_foreach_safe(p, t, &n->sessions)
    {
        kvp_session_t *s = KVP_CONTAINER_OF(p, kvp_session_t, node_link);
        if (kvp__session_open(s) && session_idle(s) &&
            now - s->last_work_ns >= (uint64_t)n->cfg.idle_session_ms * KVP_NSEC_PER_MSEC) {
            /* No work for the idle timeout: close gracefully and stop redialling;
             * the next lookup or fetch for this peer dials again. */
            KVP_INFO(n->name, "peer %s: idle for %u ms: closing", s->peer_id,
                     n->cfg.idle_session_ms);
            kvp__session_set_state(s, KVP_SESS_CLOSING);
            kvp_ctl_unwant(n->ctl, s->peer_id);
            kvp_link_close(s->link, KVP_BYE_IDLE);
        }
    }
}

static uint64_t hold_period_ns(const kvp_node_t *n)
{
    uint64_t p = (uint64_t)n->cfg.hold_cap_ms * KVP_NSEC_PER_MSEC / 8;
    return KVP_MAX(KVP_MIN(p, 250 * KVP_NSEC_PER_MSEC), 5 * KVP_NSEC_PER_MSEC);
}

static void hold_timer_cb(kvp_timer_t *t)
{
    kvp_node_t *n = t->data;
    node_hold_check(n);
    kvp_timer_start(n->loop, &n->hold_timer, kvp__node_now(n) + hold_period_ns(n));
}

/* -------------------------------------------------------------- round */

static void node_poll_sessions(kvp_node_t *n)
{
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &n->active)
    {
        kvp_session_t *s = KVP_CONTAINER_OF(p, kvp_session_t, active_link);
        size_t got;
        do {
            got = 0;
            n->xport->ops->poll(n->xport, s->xpeer, n->results, KVP_ARRAY_SIZE(n->results), &got);
            for (size_t i = 0; i < got; i++)
                kvp__server_on_xfer_done(s, n->results[i].id, n->results[i].status);
        } while (got == KVP_ARRAY_SIZE(n->results));
        if (s->xfers_inflight == 0)
            kvp_list_remove(&s->active_link);
    }
}

static void node_flush_lookups(kvp_node_t *n)
{
    while (!kvp_list_empty(&n->flushq)) {
        kvp_session_t *s = KVP_CONTAINER_OF(n->flushq.next, kvp_session_t, flush_link);
        kvp_list_remove(&s->flush_link);
        kvp__client_flush_lookups(s);
        kvp__client_start_queued(s); /* budget freed since the last call */
    }
}

static void node_run_commands(kvp_node_t *n)
{
    kvp_list_t todo;
    if (n->cfg.thread_mode == KVP_THREAD_CALLER)
        return; /* kvp__node_exec runs every command at once: none is ever queued */
    kvp_list_init(&todo);
    pthread_mutex_lock(&n->lock);
    while (!kvp_list_empty(&n->cmds)) {
        kvp_list_t *c = n->cmds.next;
        kvp_list_remove(c);
        kvp_list_insert_tail(&todo, c);
    }
    pthread_mutex_unlock(&n->lock);
    if (kvp_list_empty(&todo))
        return;
    for (kvp_list_t *p = todo.next; p != &todo; p = p->next) {
        kvp_cmd_t *c = KVP_CONTAINER_OF(p, kvp_cmd_t, link);
        c->result = c->fn(n, c->arg);
    }
    /* The LOOKUPs and FETCHes these commands queued leave before their
     * callers are woken (one round trip earlier on the wire, and the woken
     * threads do not compete with the send for the CPU); still one LOOKUP
     * per request for the whole batch. */
    node_flush_lookups(n);
    pthread_mutex_lock(&n->lock);
    while (!kvp_list_empty(&todo)) {
        kvp_cmd_t *c = KVP_CONTAINER_OF(todo.next, kvp_cmd_t, link);
        kvp_list_remove(&c->link);
        c->done = true; /* the caller may return at once: c is not touched after */
    }
    pthread_cond_broadcast(&n->cond);
    pthread_mutex_unlock(&n->lock);
}

/* Work that follows any state change: completions, reaping, lookups out. */
static void node_settle(kvp_node_t *n)
{
    for (int i = 0; i < 64 && n->xport->ops->progress(n->xport); i++)
        ;
    if (!kvp_list_empty(&n->env.landing))
        kvp__client_check_landing(&n->env);
    node_poll_sessions(n);
    if (n->xport->ep_failures != n->ep_failures_seen)
        node_check_endpoints(n);
    node_poll_retired(n);
    node_flush_lookups(n);
}

static void node_round(kvp_node_t *n, int timeout_ms)
{
    static const int busy_limit = 32;
    int busy = 0;
    node_run_commands(n);
    node_settle(n);
    /* Transfers in flight: UCX completes a direct shared-memory put and its
     * flush only inside progress(), without always signalling the event fd,
     * so sleep at most 1 ms while any is in flight (a bounded spin). */
    if (timeout_ms != 0 && (!kvp_list_empty(&n->active) || !kvp_list_empty(&n->env.landing)))
        timeout_ms = 1; /* LANDING loads: blocks arrive inside progress() too */
    if (timeout_ms != 0 && (n->xport->ops->caps & KVP_XPORT_CAP_EVENT_FD)) {
        while (n->xport->ops->arm(n->xport) == KVP_ERR_BUSY && busy++ < busy_limit)
            node_settle(n);
        if (busy > busy_limit) /* arm keeps answering busy: bounded spin, short sleep */
            timeout_ms = 1;
    }
    kvp_loop_run_once(n->loop, timeout_ms);
    node_settle(n);
    if (n->kvevents != NULL)
        kvp__kvevents_flush(n->kvevents); /* this round's stored/removed, replays */
    atomic_store_explicit(&n->round_ns, kvp_clock_now(kvp_clock_real()), memory_order_relaxed);
}

static void node_wait_begin(void *arg)
{
    pthread_mutex_unlock(&((kvp_node_t *)arg)->owner);
}

static void node_wait_end(void *arg)
{
    pthread_mutex_lock(&((kvp_node_t *)arg)->owner);
}

static void *node_thread_main(void *arg)
{
    kvp_node_t *n = arg;
    pthread_mutex_lock(&n->owner); /* released only while the loop sleeps */
    for (;;) {
        pthread_mutex_lock(&n->lock);
        bool stop = n->stopping;
        pthread_mutex_unlock(&n->lock);
        if (stop)
            break;
        node_round(n, 100);
    }
    node_run_commands(n); /* nobody waits forever on a command */
    pthread_mutex_unlock(&n->owner);
    return NULL;
}

static void node_wakeup_cb(void *arg)
{
    (void)arg; /* the round that follows runs the commands */
}

static void xport_io_cb(kvp_io_t *io, uint32_t events)
{
    (void)io;
    (void)events; /* progress runs in every round */
}

/* The node this thread runs a command for on the fast path (a command that
 * calls back into the API then runs inline). */
static _Thread_local const kvp_node_t *tl_owner_of;

/* Fast path: the node thread is asleep in the loop (it holds `owner` at
 * every other moment), so this thread runs the command itself and sends the
 * frames it queued: no wake-up of the node thread before the frame leaves,
 * none of the caller after. Unless the command is quiet (frames and
 * bookkeeping only), the node thread is woken afterwards, off the request's
 * path, to run a round for what the command changed; so it is too when
 * transfers or landing loads are in flight (they are polled). A busy node
 * thread keeps the queue (batching). */
/* A caller that ran the node's work on its own thread (fast path, leader)
 * gives `owner` back. The node thread sleeps on: wake it if it has work no fd
 * will announce -- polled transfers and landing loads, or what the caller
 * knows of (`more`). */
static void node_owner_return(kvp_node_t *n, bool more)
{
    bool wake = more || !kvp_list_empty(&n->active) || !kvp_list_empty(&n->env.landing);
    tl_owner_of = NULL;
    pthread_mutex_unlock(&n->owner);
    if (wake)
        kvp_loop_wakeup(n->loop);
}

static bool node_exec_fast(kvp_node_t *n, kvp_status_t (*fn)(kvp_node_t *, void *), void *arg,
                           bool quiet, kvp_status_t *out)
{
    if (pthread_mutex_trylock(&n->owner) != 0)
        return false;
    pthread_mutex_lock(&n->lock);
    bool stopping = n->stopping;
    pthread_mutex_unlock(&n->lock);
    if (stopping) {
        *out = KVP_ERR_CLOSED;
    } else {
        tl_owner_of = n;
        *out = fn(n, arg);
        node_flush_lookups(n);
    }
    node_owner_return(n, !quiet); /* a command's other changes: a round of the node thread */
    return true;
}

static kvp_status_t node_exec(kvp_node_t *n, kvp_status_t (*fn)(kvp_node_t *, void *), void *arg,
                              bool quiet)
{
    if (!n->thread_running || pthread_equal(pthread_self(), n->thread) || tl_owner_of == n) {
        kvp_status_t r = fn(n, arg);
        node_flush_lookups(n);
        return r;
    }
    kvp_status_t r;
    if (node_exec_fast(n, fn, arg, quiet, &r))
        return r;
    kvp_cmd_t c = {.fn = fn, .arg = arg};
    pthread_mutex_lock(&n->lock);
    if (n->stopping) {
        pthread_mutex_unlock(&n->lock);
        return KVP_ERR_CLOSED;
    }
    kvp_list_insert_tail(&n->cmds, &c.link);
    pthread_mutex_unlock(&n->lock);
    kvp_loop_wakeup(n->loop);
    pthread_mutex_lock(&n->lock);
    while (!c.done)
        pthread_cond_wait(&n->cond, &n->lock);
    pthread_mutex_unlock(&n->lock);
    return c.result;
}

kvp_status_t kvp__node_exec(kvp_node_t *n, kvp_status_t (*fn)(kvp_node_t *, void *), void *arg)
{
    return node_exec(n, fn, arg, false);
}

kvp_status_t kvp__node_exec_quiet(kvp_node_t *n, kvp_status_t (*fn)(kvp_node_t *, void *),
                                  void *arg)
{
    return node_exec(n, fn, arg, true);
}

/* ------------------------------------------------------------ waiting */

static bool node_wait_over(kvp_node_t *n)
{
    pthread_mutex_lock(&n->lock);
    bool over = n->ev_count > 0 || n->events_dropped > 0 || n->stopping;
    pthread_mutex_unlock(&n->lock);
    return over;
}

static int node_ms_until(uint64_t deadline_ns, int cap_ms)
{
    uint64_t now = kvp_clock_now(kvp_clock_real());
    if (now >= deadline_ns)
        return 0;
    uint64_t ms = (deadline_ns - now + KVP_NSEC_PER_MSEC - 1) / KVP_NSEC_PER_MSEC;
    return ms > (uint64_t)cap_ms ? cap_ms : (int)ms;
}

/* A LOOKUP of ours awaits its answer (kvp_config_t.wait_spin_us). */
static bool node_lookup_due(const kvp_node_t *n)
{
    for (const kvp_list_t *p = n->sessions.next; p != &n->sessions; p = p->next)
        if (!kvp_list_empty(&KVP_CONTAINER_OF(p, kvp_session_t, node_link)->lookups_sent))
            return true;
    return false;
}

/* A waiting engine thread leads (kvp_loop_lead): while the node thread
 * sleeps, this thread runs the node's rounds until an event is ready or the
 * deadline passes, so the frame that completes its operation wakes it and
 * not the node thread, which would then have to wake it (one thread wake-up
 * less per round trip: the reply is read, handled and taken on one thread).
 * While a lookup's answer is due it first polls (rounds that do not sleep)
 * for at most wait_spin_us: its CPU stays awake for the answer. It takes the
 * events itself before it stops leading, and the event fd is not written for
 * them meanwhile (ev_quiet; what it leaves is signalled then).
 * False if the node thread is busy or the loop cannot lead. Afterwards the
 * node thread is woken only if transfers or landing loads need its polling,
 * commands wait or the node is stopping; fds, timers and wakeups reach it by
 * themselves once the loop stops leading. */
static bool node_lead(kvp_node_t *n, uint64_t deadline_ns, kvp_event_t *out, uint32_t cap,
                      uint32_t *n_out)
{
    if (pthread_mutex_trylock(&n->owner) != 0)
        return false;
    if (node_wait_over(n) || kvp_loop_lead(n->loop, true) != KVP_OK) {
        pthread_mutex_unlock(&n->owner);
        return false;
    }
    tl_owner_of = n;
    n->st.waits_led++;
    pthread_mutex_lock(&n->lock);
    n->ev_quiet = true; /* only the owner emits, and that is us until we give it back */
    pthread_mutex_unlock(&n->lock);
    uint64_t now = kvp_clock_now(kvp_clock_real());
    uint64_t spin_end = now + (uint64_t)n->cfg.wait_spin_us * 1000u;
    if (spin_end > deadline_ns)
        spin_end = deadline_ns;
    if (n->cfg.wait_spin_us > 0 && node_lookup_due(n))
        while (!node_wait_over(n) && kvp_clock_now(kvp_clock_real()) < spin_end) {
            node_round(n, 0);
            if (node_wait_over(n))
                break; /* not to the back of the run queue with the answer in hand */
            sched_yield(); /* the answering peer may share this CPU */
        }
    int ms;
    while (!node_wait_over(n) && (ms = node_ms_until(deadline_ns, 100)) > 0)
        node_round(n, ms);
    kvp__node_take_events(n, out, cap, n_out);
    pthread_mutex_lock(&n->lock);
    n->ev_quiet = false;
    node_ev_signal_locked(n); /* what did not fit in `out` */
    /* A command queued while we led may have had its wakeup read by our last
     * round and not run yet. */
    bool more = n->stopping || !kvp_list_empty(&n->cmds);
    pthread_mutex_unlock(&n->lock);
    if (kvp_loop_lead(n->loop, false) != KVP_OK) /* cannot happen (MOD of an entry); then the */
        KVP_ERROR(n->name, "node thread now sleeps holding its lock (no fast path)"); /* loop keeps leading */
    node_owner_return(n, more);
    return true;
}

kvp_status_t kvp__node_wait_events(kvp_node_t *n, kvp_event_t *out, uint32_t cap, uint32_t *n_out,
                                   int32_t timeout_ms)
{
    uint64_t deadline = timeout_ms < 0 ? UINT64_MAX
                                       : kvp_clock_now(kvp_clock_real()) +
                                             (uint64_t)timeout_ms * KVP_NSEC_PER_MSEC;
    kvp_status_t st = KVP_OK;
    if (!n->thread_running) { /* caller-driven: this is the progress thread */
        while (kvp__node_take_events(n, out, cap, n_out) == KVP_OK && *n_out == 0) {
            int ms = node_ms_until(deadline, 100);
            if (ms == 0)
                break;
            node_round(n, ms);
        }
        return KVP_OK;
    }
    if (pthread_equal(pthread_self(), n->thread) || tl_owner_of == n)
        return KVP_ERR_STATE; /* from inside the node's own work: it would wait on itself */
    pthread_mutex_lock(&n->lock);
    if (n->stopping) {
        pthread_mutex_unlock(&n->lock);
        return KVP_ERR_CLOSED;
    }
    n->waiters++;
    pthread_mutex_unlock(&n->lock);
    for (;;) {
        kvp__node_take_events(n, out, cap, n_out);
        if (*n_out > 0)
            break;
        pthread_mutex_lock(&n->lock);
        bool stopping = n->stopping;
        pthread_mutex_unlock(&n->lock);
        if (stopping) {
            st = KVP_ERR_CLOSED;
            break;
        }
        int ms = node_ms_until(deadline, 10);
        if (ms == 0)
            break;
        if (node_lead(n, deadline, out, cap, n_out)) {
            if (*n_out > 0)
                break;
        } else {
            /* The node thread is busy (or another waiter leads): its events
             * make the event fd readable; try to lead again soon. */
            struct pollfd pf = {.fd = n->evfd, .events = POLLIN};
            poll(&pf, 1, ms);
        }
    }
    if (n->wait_exit_delay_ms > 0)
        poll(NULL, 0, (int)n->wait_exit_delay_ms);
    pthread_mutex_lock(&n->lock);
    if (--n->waiters == 0 && n->stopping)
        pthread_cond_broadcast(&n->cond);
    pthread_mutex_unlock(&n->lock);
    return st;
}

kvp_status_t kvp__node_progress(kvp_node_t *n, int timeout_ms)
{
    if (n->thread_running)
        return KVP_ERR_STATE;
    node_round(n, timeout_ms);
    return KVP_OK;
}

/* -------------------------------------------------------------- create */

KVP_EXPORT void kvp_config_init(kvp_config_t *c)
{
    memset(c, 0, sizeof(*c));
    c->listen_addr = "127.0.0.1:0";
    c->num_blocks = 1024;
    c->block_size = 256 * 1024;
    c->compat = "";
    c->verify_checksums = 1;
    c->heartbeat_ms = 500;
    c->dead_after_ms = 2000;
    c->handshake_timeout_ms = 10000;
    c->lookup_pending_ms = 5000;
    c->supply_pin_ms = 30000;
    c->load_timeout_ms = 30000;
    c->abort_resend_ms = 2000;
    c->abort_ack_timeout_ms = 10000;
    c->parked_demand_ms = 20000;
    c->hold_cap_ms = 120000;
    c->suspect_period_ms = 0; /* 0 = 10 x hold cap */
    c->idle_session_ms = 300000;
    c->wait_spin_us = 50;
    c->shutdown_drain_ms = 3000;
    c->max_sessions = 1024;
    c->max_pins = 0; /* 0 = 4 x num_blocks */
    c->max_retained = 4096;
    c->max_quarantined = 0; /* 0 = 25% of the region */
    c->max_inflight_bytes_per_peer = 1ull << 30;
    c->backoff_min_ms = 100;
    c->backoff_max_ms = 5000;
    c->max_preauth = 32;
    c->max_preauth_per_addr = 8;
    c->preauth_timeout_ms = 3000;
    c->max_lookup_keys_per_sec = 2000000; /* issue 27: docs/DESIGN.md "LOOKUP key rate" */
}

/* Store callbacks: what the store holds, told to routers (KV events). */
static void node_store_commit_cb(void *arg, const void *key, uint32_t key_len,
                                 kvp_slot_ref_t ref)
{
    kvp_node_t *n = arg;
    (void)ref;
    if (n->kvevents != NULL)
        kvp__kvevents_stored(n->kvevents, key, key_len);
}

static void node_store_remove_cb(void *arg, const void *key, uint32_t key_len)
{
    kvp_node_t *n = arg;
    if (n->kvevents != NULL)
        kvp__kvevents_removed(n->kvevents, key, key_len);
}

static kvp_status_t node_make_kvevents(kvp_node_t *n, const kvp_config_t *cfg)
{
    if (cfg->kv_events_endpoint == NULL)
        return KVP_OK;
    kvp_kvevents_config_t ec = {0};
    ec.endpoint = cfg->kv_events_endpoint;
    ec.replay_endpoint = cfg->kv_events_replay_endpoint;
    ec.node_id = n->peer_id;
    ec.model = cfg->compat;
    ec.hwm = cfg->kv_events_hwm;
    ec.replay_batches = cfg->kv_events_replay_batches;
    ec.log_prefix = n->name;
    return kvp__kvevents_create(&ec, &n->kvevents);
}

static void store_config(const kvp_node_t *n, kvp_store_config_t *sc)
{
    memset(sc, 0, sizeof(*sc));
    sc->num_blocks = n->cfg.num_blocks;
    sc->block_size = n->cfg.block_size;
    sc->huge_pages = n->cfg.huge_pages;
    sc->max_pins = n->cfg.max_pins;
    sc->suspect_period_ns = n->cfg.suspect_period_ms * KVP_NSEC_PER_MSEC;
    sc->hash_seed = n->cfg.hash_seed;
    sc->clock = n->clock;
    sc->log_prefix = n->name;
    sc->commit_cb = node_store_commit_cb;
    sc->remove_cb = node_store_remove_cb;
    sc->commit_cb_arg = (void *)n; /* the callbacks run on the owner thread */
}

#ifdef KVP_TESTING
/* Fake transport (test builds only): the store maps its own region first, so
 * the fake's landing checker can see our slots; then the region is registered. */
static kvp_status_t node_make_fake(kvp_node_t *n, const kvp_node_seams_t *seams)
{
    kvp_store_config_t sc;
    kvp_layout_t layout = {n->cfg.num_blocks, n->cfg.block_size};
    void *base;
    kvp_status_t st;
    if (seams == NULL || seams->fake_fabric == NULL)
        return KVP_ERR_UNSUPPORTED; /* the fake needs a fabric: tests pass one */
    store_config(n, &sc);
    if ((st = kvp_store_create(&sc, &n->store)) != KVP_OK)
        return st;
    kvp_fake_config_t fc = {0};
    fc.fabric = seams->fake_fabric;
    fc.clock = n->clock;
    fc.store = n->store;
    fc.log_prefix = n->name;
    fc.default_path = seams->fake_path ? seams->fake_path : KVP_PATH_FAKE_FENCEABLE;
    fc.default_delay_ns = seams->fake_delay_ns;
    if ((st = kvp_fake_create(&fc, &n->xport)) != KVP_OK)
        return st;
    return n->xport->ops->register_region(n->xport, kvp_store_base(n->store),
                                          kvp_store_region_len(n->store), &layout, &base);
}
#endif

/* UCX: the transport allocates the region (direct shared-memory puts) unless
 * the embedding supplied one; the store manages it; the transport frees it. */
static kvp_status_t node_make_ucx(kvp_node_t *n)
{
    kvp_layout_t layout = {n->cfg.num_blocks, n->cfg.block_size};
    size_t len = (size_t)n->cfg.num_blocks * n->cfg.block_size;
    void *base = NULL;
    kvp_store_config_t sc;
    kvp_ucx_config_t uc;
    kvp_ucx_config_default(&uc);
    uc.log_prefix = n->name;
    uc.clock = n->clock;
    uc.max_transfers = n->cfg.max_retained + 1024;
    uc.connect_timeout_ms = n->cfg.dead_after_ms; /* a data path must come up as fast */
    uc.listen_addr = n->cfg.listen_addr; /* issue 27: UCX tcp only on that interface */
    kvp_status_t st = kvp_ucx_xport_create(&uc, &n->xport);
    if (st != KVP_OK)
        return st;
    st = n->xport->ops->register_region(n->xport, n->cfg.region, len, &layout, &base);
    if (st != KVP_OK)
        return st;
    store_config(n, &sc);
    sc.region = base;
    sc.region_len = len;
    /* Fault the region's pages in now (one batched call) rather than one
     * page fault per 4 KiB on the first WRITE into each slot and the first
     * checksum of it: measured here, first-touch faults dominated a fetch.
     * Best effort: older kernels answer EINVAL and nothing changes. */
    if (madvise(base, len, MADV_POPULATE_WRITE) != 0)
        KVP_DEBUG(n->name, "region pre-fault not available: %s", strerror(errno));
    return kvp_store_create(&sc, &n->store);
}

kvp_xport_t *kvp__node_xport(kvp_node_t *n)
{
    return n->xport;
}

kvp_store_t *kvp__node_store(kvp_node_t *n)
{
    return n->store;
}

/* Issue 27 defaults, chosen so that peers together never hold more than
 * half the slots pinned, one peer a quarter (at least 64 slots, so that a
 * small node still serves a usual prefix in one lookup, but never more than
 * the half); a faulty peer's quarantine stops displacing READY blocks at an
 * eighth; memory and rounds per peer far above a vLLM tier's needs (one
 * round per request in flight, ~90 B per held key) and far below what a
 * host notices. */
void kvp__node_budget_defaults(kvp_config_t *c)
{
    if (c->max_supply_pins_per_peer == 0)
        c->max_supply_pins_per_peer =
            KVP_MAX(KVP_MAX(c->num_blocks / 4, KVP_MIN(c->num_blocks / 2, 64u)), 1u);
    if (c->max_supply_pins == 0)
        c->max_supply_pins = KVP_MAX(c->num_blocks / 2, 1);
    if (c->max_lookup_rounds_per_peer == 0)
        c->max_lookup_rounds_per_peer = 1024;
    if (c->max_lookup_bytes_per_peer == 0)
        c->max_lookup_bytes_per_peer = 16ull << 20;
    if (c->max_lease_ms == 0) {
        uint32_t lease = c->pin_lease_ms ? c->pin_lease_ms : c->supply_pin_ms;
        c->max_lease_ms = lease > UINT32_MAX / 4 ? UINT32_MAX : 4 * lease;
    }
    if (c->max_quarantined_per_peer == 0)
        c->max_quarantined_per_peer = KVP_MAX(c->num_blocks / 8, 1);
    if (c->max_wanted_peers == 0)
        c->max_wanted_peers = c->max_sessions;
}

void kvp__node_ctl_runtime(const kvp_config_t *c, kvp_ctl_config_t *cc)
{
    cc->heartbeat_ns = (uint64_t)c->heartbeat_ms * KVP_NSEC_PER_MSEC;
    cc->dead_after_ns = (uint64_t)c->dead_after_ms * KVP_NSEC_PER_MSEC;
    cc->handshake_timeout_ns = (uint64_t)c->handshake_timeout_ms * KVP_NSEC_PER_MSEC;
    cc->backoff_min_ns = (uint64_t)c->backoff_min_ms * KVP_NSEC_PER_MSEC;
    cc->backoff_max_ns = (uint64_t)c->backoff_max_ms * KVP_NSEC_PER_MSEC;
    cc->max_sessions = c->max_sessions;
    cc->max_preauth = c->max_preauth;
    cc->max_preauth_per_addr = c->max_preauth_per_addr;
    cc->preauth_timeout_ns = (uint64_t)c->preauth_timeout_ms * KVP_NSEC_PER_MSEC;
    cc->psk = c->psk;
    cc->psk_len = c->psk_len;
}

static kvp_status_t node_make_ctl(kvp_node_t *n, const kvp_node_seams_t *seams)
{
    kvp_ctl_config_t cc = {0};
    cc.peer_id = n->cfg.peer_id;
    cc.instance_id = n->cfg.instance_id;
    cc.listen_addr = n->cfg.listen_addr;
    cc.num_blocks = n->cfg.num_blocks;
    cc.block_size = n->cfg.block_size;
    cc.fingerprint = n->fingerprint;
    cc.compat = n->cfg.compat;
    cc.hash_seed = n->cfg.hash_seed;
    cc.blob = n->blob;
    cc.blob_len = n->blob_len;
    kvp__node_ctl_runtime(&n->cfg, &cc);
    cc.loop = n->loop;
    cc.fake_net = seams ? seams->fake_net : NULL;
    cc.cb = (kvp_ctl_callbacks_t){ctl_on_ready, ctl_on_frame, ctl_on_down, ctl_on_pong, n};
    cc.log_prefix = n->name;
    return kvp_ctl_create(&cc, &n->ctl);
}

static void node_free(kvp_node_t *n);

kvp_status_t kvp__node_create_ex(const kvp_config_t *cfg, const kvp_node_seams_t *seams,
                                 kvp_node_t **out)
{
    kvp_status_t st;
    kvp__clear_last_error();
    bool loopback = false;
    if (out == NULL || (st = kvp__config_check(cfg)) != KVP_OK)
        return KVP_ERR_INVALID;
    /* The fake network's addresses are names, not hosts: no gate there. */
    if (!(seams && seams->fake_net) && kvp__config_check_gate(cfg, &loopback) != KVP_OK)
        return KVP_ERR_INVALID;
    kvp_node_t *n = kvp__calloc(1, sizeof(*n));
    if (n == NULL)
        return KVP_ERR_NOMEM;
    n->listen_loopback = loopback || (seams && seams->fake_net);
    n->cfg = *cfg;
    n->evfd = -1;
    n->pollfd = -1;
    snprintf(n->name, sizeof(n->name), "%s", cfg->name ? cfg->name : "kvpeer");
    if (n->cfg.suspect_period_ms == 0)
        n->cfg.suspect_period_ms = 10ull * n->cfg.hold_cap_ms;
    if (n->cfg.max_quarantined == 0)
        n->cfg.max_quarantined = KVP_MAX(n->cfg.num_blocks / 4, 1);
    kvp__node_budget_defaults(&n->cfg);
    n->fingerprint = kvp_hash64(cfg->compat ? cfg->compat : "",
                                cfg->compat ? strlen(cfg->compat) : 0, cfg->hash_seed);
    n->clock = seams && seams->clock ? seams->clock : kvp_clock_real();
    n->wait_exit_delay_ms = seams ? seams->wait_exit_delay_ms : 0;
    n->next_op_id = 1;
    kvp__session_env_init(&n->env);
    n->env.cfg = &n->cfg;
    n->env.name = n->name;
    n->env.clock = n->clock;
    n->env.st = &n->st;
    n->env.rl_proto = &n->rl_proto;
    n->env.up = &node_session_up;
    n->env.up_arg = n;
    kvp_list_init(&n->sessions);
    kvp_list_init(&n->active);
    kvp_list_init(&n->flushq);
    kvp_list_init(&n->cmds);
    kvp_ratelimit_init(&n->rl_proto, KVP_NSEC_PER_SEC, 5);
    kvp_ratelimit_init(&n->rl_cap, KVP_NSEC_PER_SEC, 1);
    kvp_ratelimit_init(&n->rl_local, KVP_NSEC_PER_SEC, 1);
    pthread_mutex_init(&n->owner, NULL);
    pthread_mutex_init(&n->lock, NULL);
    pthread_cond_init(&n->cond, NULL);
    n->xport_io.fd = -1;
    if (cfg->psk_len) { /* kvp_config_t buffers are borrowed for this call only */
        if ((n->psk_copy = kvp__malloc(cfg->psk_len)) == NULL) {
            st = KVP_ERR_NOMEM;
            goto fail;
        }
        memcpy(n->psk_copy, cfg->psk, cfg->psk_len);
        n->cfg.psk = n->psk_copy;
    }
    if (!(seams && seams->no_event_fd) && (n->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
        st = KVP_ERR_IO;
        goto fail;
    }
    if ((st = kvp_loop_create(n->clock, &n->loop)) != KVP_OK)
        goto fail;
    kvp_timer_init(&n->hold_timer, "hold-cap", hold_timer_cb, n);
    kvp_loop_set_wakeup_cb(n->loop, node_wakeup_cb, n);
#ifdef KVP_TESTING
    st = cfg->transport == KVP_TRANSPORT_FAKE ? node_make_fake(n, seams) : node_make_ucx(n);
#else
    /* the fake transport exists in test builds (kvpeer_testing) only */
    st = cfg->transport == KVP_TRANSPORT_FAKE ? KVP_ERR_UNSUPPORTED : node_make_ucx(n);
#endif
    if (st != KVP_OK)
        goto fail;
    if ((st = n->xport->ops->local_blob(n->xport, &n->blob, &n->blob_len)) != KVP_OK)
        goto fail;
    n->env.loop = n->loop; /* before the ctl: sessions start with it */
    n->env.store = n->store;
    n->env.xport = n->xport;
    if ((st = node_make_ctl(n, seams)) != KVP_OK)
        goto fail;
    snprintf(n->peer_id, sizeof(n->peer_id), "%s", kvp_ctl_peer_id(n->ctl));
    if (cfg->name == NULL)
        snprintf(n->name, sizeof(n->name), "%s", n->peer_id);
    if ((st = node_make_kvevents(n, cfg)) != KVP_OK)
        goto fail;
    int xfd = n->xport->ops->event_fd(n->xport);
    if (xfd >= 0 && (st = kvp_io_start(n->loop, &n->xport_io, xfd, EPOLLIN, xport_io_cb, n)) != KVP_OK)
        goto fail;
    kvp_timer_start(n->loop, &n->hold_timer, kvp__node_now(n) + hold_period_ns(n));
    if (cfg->thread_mode == KVP_THREAD_CALLER && n->evfd >= 0 &&
        (st = kvp__node_open_pollfd(n)) != KVP_OK)
        goto fail;
    atomic_store_explicit(&n->round_ns, kvp_clock_now(kvp_clock_real()), memory_order_relaxed);
    if (cfg->thread_mode == KVP_THREAD_OWN) {
        if ((st = kvp_loop_set_wait_hooks(n->loop, node_wait_begin, node_wait_end, n)) != KVP_OK)
            goto fail;
        if (pthread_create(&n->thread, NULL, node_thread_main, n) != 0) {
            kvp_loop_set_wait_hooks(n->loop, NULL, NULL, NULL);
            st = KVP_ERR_IO;
            goto fail;
        }
        n->thread_running = true;
    }
    KVP_INFO(n->name, "node up: %u blocks x %u B, transport %s, compat '%s' (fingerprint %016llx)",
             n->cfg.num_blocks, n->cfg.block_size, n->xport->ops->name,
             cfg->compat ? cfg->compat : "", (unsigned long long)n->fingerprint);
    *out = n;
    return KVP_OK;
fail:
    kvp__note_create_failure(st);
    node_free(n);
    return st;
}

KVP_EXPORT kvp_status_t kvp_node_create(const kvp_config_t *cfg, kvp_node_t **out)
{
    return kvp__node_create_ex(cfg, NULL, out);
}

/* ------------------------------------------------------------- destroy */

static bool node_busy(kvp_node_t *n)
{
    kvp_list_t *p, *t;
    if (!kvp_list_empty(&n->env.retained) || !kvp_list_empty(&n->env.quarantined) ||
        !kvp_list_empty(&n->active))
        return true;
    kvp_list_foreach_safe(p, t, &n->sessions)
    {
        kvp_session_t *s = KVP_CONTAINER_OF(p, kvp_session_t, node_link);
        if (!kvp_list_empty(&s->loads))
            return true;
    }
    return false;
}

/* Bounded drain (SPEC §7.6): in-flight loads and transfers, then sessions
 * closed, then retained transfers and quarantined slots; what remains at the
 * deadline is released with error logs. */
static void node_drain(kvp_node_t *n)
{
    uint64_t deadline = kvp__node_now(n) + (uint64_t)n->cfg.shutdown_drain_ms * KVP_NSEC_PER_MSEC;
    bool real = n->clock == kvp_clock_real();
    int rounds = 0;
    kvp_list_t *p, *t;
    n->draining = true; /* sessions are torn down below; none may start after */
    kvp_list_foreach_safe(p, t, &n->sessions) /* fetches waiting for budget never start */
        kvp__client_fail_queued(KVP_CONTAINER_OF(p, kvp_session_t, node_link), KVP_ERR_CLOSED);
    while (node_busy(n) && kvp__node_now(n) < deadline && (real || rounds++ < 100))
        node_round(n, real ? 5 : 0);
    while (!kvp_list_empty(&n->sessions)) {
        kvp_session_t *s = KVP_CONTAINER_OF(n->sessions.next, kvp_session_t, node_link);
        if (s->link != NULL) {
            kvp_link_set_user(s->link, NULL);
            kvp_link_close(s->link, KVP_BYE_SHUTDOWN);
            s->link = NULL;
            kvp__session_set_state(s, KVP_SESS_DOWN);
        }
        node_session_down(n, s, false, "node shutdown");
    }
    rounds = 0;
    while (node_busy(n) && kvp__node_now(n) < deadline && (real || rounds++ < 100))
        node_round(n, real ? 5 : 0);
    while (!kvp_list_empty(&n->env.retained))
        node_force_release_retired(n, KVP_CONTAINER_OF(n->env.retained.next, kvp_xfer_t, link),
                                   "shutdown drain over");
    while (!kvp_list_empty(&n->env.quarantined))
        node_force_release_quarantine(n, KVP_CONTAINER_OF(n->env.quarantined.next, kvp_load_t, link),
                                      "shutdown drain over");
    for (int i = 0; i < 10; i++) /* let the BYEs go out */
        kvp_loop_run_once(n->loop, 0);
}

static void node_free(kvp_node_t *n)
{
    kvp__kvevents_destroy(n->kvevents); /* last batch: AllBlocksCleared */
    n->kvevents = NULL;
    if (n->ctl)
        kvp_ctl_destroy(n->ctl);
    if (n->loop) {
        kvp_timer_stop(n->loop, &n->hold_timer);
        if (n->xport_io.active)
            kvp_io_stop(n->loop, &n->xport_io);
    }
    /* Transport first: its pending copies may still target our region;
     * then the store (which unmaps the region only if it mapped it). */
    if (n->xport)
        n->xport->ops->close(n->xport, true);
    if (n->store)
        kvp_store_destroy(n->store);
    if (n->loop)
        kvp_loop_destroy(n->loop);
    if (n->evfd >= 0)
        close(n->evfd);
    if (n->pollfd >= 0)
        close(n->pollfd);
    kvp__free(n->engine_pins);
    pthread_mutex_destroy(&n->owner);
    pthread_mutex_destroy(&n->lock);
    pthread_cond_destroy(&n->cond);
    kvp__free(n->events);
    kvp__free(n->txbuf);
    if (n->psk_copy)
        sodium_memzero(n->psk_copy, n->cfg.psk_len);
    kvp__free(n->psk_copy);
    kvp__free(n);
}

KVP_EXPORT void kvp_node_destroy(kvp_node_t *n)
{
    if (n == NULL)
        return;
    if (n->thread_running) {
        pthread_mutex_lock(&n->lock);
        n->stopping = true;
        if (n->waiters > 0) { /* threads in kvp_wait_events leave with KVP_ERR_CLOSED */
            uint64_t one = 1;
            if (n->evfd >= 0) {
                ssize_t w = write(n->evfd, &one, sizeof(one));
                (void)w;
            }
            kvp_loop_wakeup(n->loop); /* a leader sleeps in the loop */
            while (n->waiters > 0)
                pthread_cond_wait(&n->cond, &n->lock);
        }
        pthread_mutex_unlock(&n->lock);
        kvp_loop_wakeup(n->loop);
        pthread_join(n->thread, NULL);
        n->thread_running = false;
        kvp_loop_set_wait_hooks(n->loop, NULL, NULL, NULL); /* the drain runs here, alone */
    }
    node_drain(n);
    KVP_INFO(n->name, "node down");
    node_free(n);
}
