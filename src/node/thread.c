/*
 * thread.c -- the node's poll round and who runs it (SPEC §2 threads). One
 * thread owns all node state: the progress thread (KVP_THREAD_OWN), the
 * caller of kvp_node_progress() (KVP_THREAD_CALLER), or, while the progress
 * thread sleeps in the loop, an engine thread that took `owner` (the fast
 * path of kvp__node_exec, a leading waiter of kvp_wait_events). Other
 * threads only touch `lock`, `cmds`, `cond` and the event ring.
 *
 * Poll round (kvp__node_round): commands -> transport progress ->
 * completions of sessions with transfers in flight (O(active), not
 * O(sessions)) -> retired transfers -> queued lookups -> sleep in the loop
 * until an fd or the nearest named deadline.
 */
#include "node/node.h"
#include "node/events.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>


struct kvp_cmd {
    kvp_list_t link;
    kvp_status_t (*fn)(kvp_node_t *n, void *arg);
    void *arg;
    kvp_status_t result;
    bool done;
};

static void node_poll_sessions(kvp_node_t *n)
{
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &n->active)
    {
        if (!kvp__session_poll_xfers(KVP_SESSION_OF(p, active_link)))
            kvp_list_remove(p); /* none in flight any more */
    }
}

static void node_flush_lookups(kvp_node_t *n)
{
    while (!kvp_list_empty(&n->flushq)) {
        kvp_session_t *s = KVP_SESSION_OF(n->flushq.next, flush_link);
        kvp_list_remove(&kvp__session_links(s)->flush_link);
        kvp__session_flush(s);
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
    if (!kvp_list_empty(&n->env.landing) || n->env.verifying != NULL ||
        !kvp_list_empty(&n->env.verify_wait))
        kvp__client_check_landing(&n->env);
    node_poll_sessions(n);
    if (n->xport->ep_failures != n->ep_failures_seen)
        kvp__node_check_endpoints(n);
    kvp__session_poll_retired(&n->env);
    node_flush_lookups(n);
}

void kvp__node_round(kvp_node_t *n, int timeout_ms)
{
    static const int busy_limit = 32;
    int busy = 0;
    node_run_commands(n);
    node_settle(n);
    /* The transport's deferred work (the direct-cma writes its writer
     * thread finished); if it did any, this round does not sleep: it
     * settles those transfers at once. */
    if (n->xport->ops->pump != NULL && n->xport->ops->pump(n->xport))
        timeout_ms = 0;
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
        kvp__node_round(n, 100);
    }
    node_run_commands(n); /* nobody waits forever on a command */
    pthread_mutex_unlock(&n->owner);
    return NULL;
}

void kvp__node_wakeup_cb(void *arg)
{
    (void)arg; /* the round that follows runs the commands */
}

void kvp__node_xport_io_cb(kvp_io_t *io, uint32_t events)
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
        if (kvp__session_lookup_due(KVP_SESSION_OF(p, node_link)))
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
            kvp__node_round(n, 0);
            if (node_wait_over(n))
                break; /* not to the back of the run queue with the answer in hand */
            sched_yield(); /* the answering peer may share this CPU */
        }
    int ms;
    while (!node_wait_over(n) && (ms = node_ms_until(deadline_ns, 100)) > 0)
        kvp__node_round(n, ms);
    kvp__node_take_events(n, out, cap, n_out);
    pthread_mutex_lock(&n->lock);
    n->ev_quiet = false;
    kvp__node_ev_signal_locked(n); /* what did not fit in `out` */
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
            kvp__node_round(n, ms);
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
    kvp__node_round(n, timeout_ms);
    return KVP_OK;
}

/* KVP_THREAD_OWN: the progress thread, holding `owner` except while the loop
 * sleeps (the wait hooks give it up there for the fast path). */
kvp_status_t kvp__node_thread_start(kvp_node_t *n)
{
    kvp_status_t st = kvp_loop_set_wait_hooks(n->loop, node_wait_begin, node_wait_end, n);
    if (st != KVP_OK)
        return st;
    if (pthread_create(&n->thread, NULL, node_thread_main, n) != 0) {
        kvp_loop_set_wait_hooks(n->loop, NULL, NULL, NULL);
        return KVP_ERR_IO;
    }
    n->thread_running = true;
    return KVP_OK;
}

/* Stop the progress thread: waiters in kvp_wait_events leave first (with
 * KVP_ERR_CLOSED), then the thread runs the queued commands and exits; the
 * caller owns the node alone afterwards. */
void kvp__node_thread_stop(kvp_node_t *n)
{
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
    kvp_loop_set_wait_hooks(n->loop, NULL, NULL, NULL);
}
