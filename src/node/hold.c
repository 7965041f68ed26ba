/*
 * hold.c -- what the node holds past its sessions (SPEC §7): transfers
 * retained with their source pins until the transport hands them back
 * (kvp__node_poll_retired) and quarantined loads until a proof; both
 * force-released at the hold cap (logged, counted; quarantined slots become
 * suspect), or quarantined loads released earlier when their same-host
 * source's process exited (issue 27, KVP_PROOF_PROCESS_EXIT). The hold
 * timer also closes sessions whose endpoint failed and sessions idle past
 * idle_session_ms.
 */
#include "node/node.h"

void kvp__node_poll_retired(kvp_node_t *n)
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
                /* poll_retired handed it back */
                kvp__xfer_release_retained(&n->env, x, KVP_PROOF_TERMINAL);
                break;
            }
        }
    } while (got == KVP_ARRAY_SIZE(n->results));
}

void kvp__node_force_release_retired(kvp_node_t *n, kvp_xfer_t *x, const char *why)
{
    KVP_ERROR(n->name, "peer %s: retained transfer %llu force-released (%s): its source slots "
                       "may still be read",
              x->peer, (unsigned long long)x->id, why);
    n->xport->ops->force_release_retired(n->xport, &x->id, 1);
    kvp__xfer_release_retained(&n->env, x, KVP_PROOF_HOLD_CAP);
    n->st.force_releases++;
}

void kvp__node_force_release_quarantine(kvp_node_t *n, kvp_load_t *l, const char *why)
{
    KVP_ERROR(n->name, "peer %s: %u quarantined slots of load %llu released (%s): %s", l->peer,
              l->n, (unsigned long long)l->op_id, why,
              l->external ? "handed back to the embedding without proof (issue 29)"
                          : "marked suspect");
    n->st.force_releases++;
    kvp__load_release_quarantine(l, KVP_PROOF_HOLD_CAP);
}

/* Sessions whose endpoint failed (an endpoint error, or a data path that
 * never came up) are closed as faults: nothing can be written through them
 * any more, and the dialer reconnects on fresh endpoints. Run from the hold
 * timer and at once whenever the transport reports a new endpoint failure
 * (xport->ep_failures). */
void kvp__node_check_endpoints(kvp_node_t *n)
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
            kvp__node_force_release_retired(n, x, "hold cap");
    }
    kvp_list_foreach_safe(p, t, &n->env.quarantined)
    {
        kvp_load_t *l = KVP_CONTAINER_OF(p, kvp_load_t, link);
        if (now - l->quarantined_ns >= cap)
            kvp__node_force_release_quarantine(n, l, "hold cap");
    }
    /* Issue 27: a same-host source's process exit is proof; it is usually
     * reported just after its control link died (teardown asked first). */
    kvp__client_release_exited(&n->env, 0);
    kvp__node_check_endpoints(n);
    kvp_list_foreach_safe(p, t, &n->sessions)
    {
        kvp_session_t *s = KVP_CONTAINER_OF(p, kvp_session_t, node_link);
        if (kvp__session_open(s) && kvp__session_idle(s) &&
            now - s->last_work_ns >= (uint64_t)n->cfg.idle_session_ms * KVP_NSEC_PER_MSEC) {
            /* No work for the idle timeout: close gracefully and stop redialling;
             * the next lookup or fetch for this peer dials again. */
            KVP_INFO(n->name, "peer %s: idle for %u ms: closing", s->peer_id,
                     n->cfg.idle_session_ms);
            kvp_ctl_unwant(n->ctl, s->peer_id);
            kvp__session_close(s, KVP_BYE_IDLE);
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

void kvp__node_hold_init(kvp_node_t *n)
{
    kvp_timer_init(&n->hold_timer, "hold-cap", hold_timer_cb, n);
}

void kvp__node_hold_start(kvp_node_t *n)
{
    kvp_timer_start(n->loop, &n->hold_timer, kvp__node_now(n) + hold_period_ns(n));
}
