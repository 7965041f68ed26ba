/*
 * held.c -- what outlives its session (SPEC §7; issue 31: was the node's
 * hold.c): transfers retained with their source pins until the transport
 * hands them back (kvp__session_poll_retired) and quarantined loads until
 * a proof; both force-released at the hold cap (logged, counted; quarantined
 * slots become suspect) or at the end of the shutdown drain, quarantined
 * loads released earlier when their same-host source's process exited
 * (issue 27, KVP_PROOF_PROCESS_EXIT). The node's hold timer calls in.
 */
#include "session/session_int.h"

void kvp__session_poll_retired(kvp_session_env_t *e)
{
    size_t got;
    if (kvp_list_empty(&e->retained))
        return;
    do {
        got = 0;
        e->xport->ops->poll_retired(e->xport, e->results, KVP_ARRAY_SIZE(e->results), &got);
        for (size_t i = 0; i < got; i++) {
            kvp_list_t *p, *t;
            kvp_list_foreach_safe(p, t, &e->retained)
            {
                kvp_xfer_t *x = KVP_CONTAINER_OF(p, kvp_xfer_t, link);
                if (x->id != e->results[i].id)
                    continue;
                KVP_INFO(e->name, "peer %s: retained transfer %llu stopped (%s): released", x->peer,
                         (unsigned long long)x->id, kvp_status_str(e->results[i].status));
                /* poll_retired handed it back */
                kvp__xfer_release_retained(e, x, KVP_PROOF_TERMINAL);
                break;
            }
        }
    } while (got == KVP_ARRAY_SIZE(e->results));
}

static void force_release_retired(kvp_session_env_t *e, kvp_xfer_t *x, const char *why)
{
    KVP_ERROR(e->name, "peer %s: retained transfer %llu force-released (%s): its source slots "
                       "may still be read",
              x->peer, (unsigned long long)x->id, why);
    e->xport->ops->force_release_retired(e->xport, &x->id, 1);
    kvp__xfer_release_retained(e, x, KVP_PROOF_HOLD_CAP);
    e->st->force_releases++;
}

static void force_release_quarantine(kvp_session_env_t *e, kvp_load_t *l, const char *why)
{
    KVP_ERROR(e->name, "peer %s: %u quarantined slots of load %llu released (%s): %s", l->peer,
              l->n, (unsigned long long)l->op_id, why,
              l->external ? "handed back to the embedding without proof (issue 29)"
                          : "marked suspect");
    e->st->force_releases++;
    kvp__load_release_quarantine(l, KVP_PROOF_HOLD_CAP);
}

void kvp__session_hold_check(kvp_session_env_t *e, uint64_t now)
{
    uint64_t cap = (uint64_t)e->cfg->hold_cap_ms * KVP_NSEC_PER_MSEC;
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &e->retained)
    {
        kvp_xfer_t *x = KVP_CONTAINER_OF(p, kvp_xfer_t, link);
        if (now - x->retained_ns >= cap)
            force_release_retired(e, x, "hold cap");
    }
    kvp_list_foreach_safe(p, t, &e->quarantined)
    {
        kvp_load_t *l = KVP_CONTAINER_OF(p, kvp_load_t, link);
        if (now - l->quarantined_ns >= cap)
            force_release_quarantine(e, l, "hold cap");
    }
    /* Issue 27: a same-host source's process exit is proof; it is usually
     * reported just after its control link died (teardown asked first). */
    kvp__client_release_exited(e, 0);
}

void kvp__session_held_end(kvp_session_env_t *e, const char *why)
{
    while (!kvp_list_empty(&e->retained))
        force_release_retired(e, KVP_CONTAINER_OF(e->retained.next, kvp_xfer_t, link), why);
    while (!kvp_list_empty(&e->quarantined))
        force_release_quarantine(e, KVP_CONTAINER_OF(e->quarantined.next, kvp_load_t, link), why);
}

void kvp__session_held_foreach(kvp_session_env_t *e, kvp_held_cb_t cb, void *arg)
{
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &e->retained)
    {
        kvp_xfer_t *x = KVP_CONTAINER_OF(p, kvp_xfer_t, link);
        cb(arg, 1, 0, x->id, x->retained_ns, x->peer);
    }
    kvp_list_foreach_safe(p, t, &e->quarantined)
    {
        kvp_load_t *l = KVP_CONTAINER_OF(p, kvp_load_t, link);
        for (uint32_t i = 0; i < l->n; i++)
            if (l->blocks[i].reserved)
                cb(arg, 2, l->blocks[i].dst.slot, l->op_id, l->quarantined_ns, l->peer);
    }
}
