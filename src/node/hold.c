/*
 * hold.c -- the node's hold timer: what outlives its session (SPEC §7) is
 * the session layer's (session/held.c: retained transfers, quarantined
 * loads, the hold cap), checked from here; the timer also closes sessions
 * whose endpoint failed and sessions idle past idle_session_ms.
 */
#include "node/node.h"

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
        (void)kvp__session_check_endpoint(KVP_SESSION_OF(p, node_link));
}

/* Hold cap (SPEC §7.3-4: the session's held records), the endpoint check
 * (F26), idle sessions. */
static void node_hold_check(kvp_node_t *n)
{
    uint64_t now = kvp__node_now(n);
    uint64_t idle = (uint64_t)n->cfg.idle_session_ms * KVP_NSEC_PER_MSEC;
    kvp_list_t *p, *t;
    kvp__session_hold_check(&n->env, now);
    kvp__node_check_endpoints(n);
    kvp_list_foreach_safe(p, t, &n->sessions)
    {
        kvp_session_t *s = KVP_SESSION_OF(p, node_link);
        if (kvp__session_idle_for(s, now, idle)) {
            /* No work for the idle timeout: close gracefully and stop redialling;
             * the next lookup or fetch for this peer dials again -- and, for a
             * peer added with kvp_peer_add (kept.c: now dormant), waits for
             * its handshake as right after kvp_peer_add. */
            bool kept = kvp__node_kept_sleep(n, kvp__session_peer(s));
            KVP_INFO(n->name, "peer %s: idle for %u ms: closing%s", kvp__session_peer(s),
                     n->cfg.idle_session_ms, kept ? " (kept: redialled on demand)" : "");
            kvp_ctl_unwant(n->ctl, kvp__session_peer(s));
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
