/*
 * api_inspect.c -- the inspection calls of kvpeer.h: counters
 * (kvp_node_stats), held memory (kvp_node_held), sessions (kvp_node_peers),
 * every peer's state (kvp_node_peer_states), refused peers
 * (kvp_node_refusals), the stall gauge and the KV-event endpoints. Each runs
 * on the owner thread through kvp__node_exec and fills the caller's memory.
 */
#include "node/node.h"
#include "node/events.h"

#include <stdio.h>
#include <string.h>

/* The store's and the ctl's counters, merged into the node's. */
static void stats_store_ctl(kvp_node_t *n, kvp_stats_t *o)
{
    kvp_store_stats_t ss;
    kvp_ctl_stats_t cs;
    kvp_store_get_stats(n->store, &ss);
    kvp_ctl_get_stats(n->ctl, &cs);
    o->slots_free = ss.slots[KVP_SLOT_FREE];
    o->slots_filling = ss.slots[KVP_SLOT_FILLING];
    o->slots_ready = ss.slots[KVP_SLOT_READY];
    o->slots_quarantined = ss.slots[KVP_SLOT_QUARANTINED];
    o->slots_suspect = ss.suspect;
    o->pins = ss.pins;
    o->lookups_hit = ss.lookups_hit;
    o->lookups_miss = ss.lookups_miss;
    o->lookups_pending = ss.lookups_pending;
    o->evictions = ss.evictions;
    o->checksum_mismatches = ss.checksum_mismatches;
    o->sessions_ready = cs.links_ready;
    o->sessions_handshaking = cs.links_handshaking;
    o->stale_frames = cs.stale_frames;
    o->protocol_errors += cs.protocol_errors;
    o->retained_transfers = n->env.n_retained;
    o->quarantined_slots = ss.slots[KVP_SLOT_QUARANTINED];
    o->sessions_refused += cs.refused_limit; /* ctl (HELLO) + session layer */
    o->pins_refused = ss.pin_limit_refusals;
}

/* The KV-event publisher's, the transport's and the session layer's counters
 * (releases per proof, the issue 27 budget gauges), loads in flight. */
static void stats_more(kvp_node_t *n, kvp_stats_t *o)
{
    if (n->kvevents != NULL) {
        kvp_kvevents_stats_t es;
        kvp__kvevents_get_stats(n->kvevents, &es);
        o->kv_event_batches = es.batches_published;
        o->kv_event_batches_dropped = es.batches_dropped;
        o->kv_events = es.events;
        o->kv_event_replays = es.replays_served;
    }
    kvp_xport_stats_t xs;
    n->xport->ops->get_stats(n->xport, &xs);
    o->late_bytes_dropped = xs.late_bytes_dropped;
    o->am_bytes_landed = xs.am_bytes_landed;
    o->data_streams_open = xs.tcpd_open; /* issue 27: kvpeer's own tcp data stream */
    o->data_streams_refused = xs.tcpd_refused + xs.tcpd_emfile;
    o->cma_bytes_written = xs.cma_bytes; /* issue 29 item 4: direct-cma */
    o->cma_writes_failed = xs.cma_failed;
    o->released_terminal = n->env.releases[KVP_PROOF_TERMINAL];
    o->released_fetch_done = n->env.releases[KVP_PROOF_FETCH_DONE];
    o->released_abort_ack = n->env.releases[KVP_PROOF_ABORT_ACK];
    o->released_fence = n->env.releases[KVP_PROOF_FENCE];
    o->released_am_refuse = n->env.releases[KVP_PROOF_AM_REFUSE];
    o->released_hold_cap = n->env.releases[KVP_PROOF_HOLD_CAP];
    o->released_not_sent = n->env.releases[KVP_PROOF_NOT_SENT];
    o->released_process_exit = n->env.releases[KVP_PROOF_PROCESS_EXIT]; /* issue 27 */
    o->supply_pins = n->env.supply_pins; /* issue 27 budgets: gauges */
    o->lookup_bytes = n->env.round_bytes;
    uint64_t inflight = 0;
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &n->sessions)
    {
        kvp_session_info_t si;
        kvp__session_info(KVP_SESSION_OF(p, node_link), &si);
        inflight += si.loads_inflight;
    }
    o->loads_inflight = inflight;
}

static kvp_status_t do_stats(kvp_node_t *n, void *arg)
{
    kvp_stats_t *o = arg;
    *o = n->st;
    stats_store_ctl(n, o);
    o->insecure = !n->listen_loopback && n->cfg.psk_len == 0;
    stats_more(n, o);
    return KVP_OK;
}

KVP_EXPORT const char *kvp_node_kv_events_endpoint(const kvp_node_t *n, int32_t replay)
{
    if (n == NULL || n->kvevents == NULL)
        return NULL;
    const char *ep = replay ? kvp__kvevents_replay_endpoint(n->kvevents)
                            : kvp__kvevents_endpoint(n->kvevents);
    return ep[0] ? ep : NULL;
}

KVP_EXPORT uint64_t kvp_node_stall_ms(kvp_node_t *n)
{
    if (n == NULL)
        return 0;
    uint64_t last = atomic_load_explicit(&n->round_ns, memory_order_relaxed);
    uint64_t now = kvp_clock_now(kvp_clock_real());
    return now > last ? (now - last) / KVP_NSEC_PER_MSEC : 0;
}

KVP_EXPORT kvp_status_t kvp_node_stats(kvp_node_t *n, kvp_stats_t *out)
{
    if (n == NULL || out == NULL)
        return KVP_ERR_INVALID;
    return kvp__node_exec(n, do_stats, out);
}

/* Arguments of the inspection calls that fill a caller's array. */
typedef struct list_args {
    void *out;
    uint32_t cap, n;
} list_args_t;
typedef list_args_t held_args_t;

/* The next entry of the caller's array, zeroed, or NULL when it is full. */
static void *list_next(list_args_t *a, size_t size)
{
    if (a->n >= a->cap)
        return NULL;
    void *e = (uint8_t *)a->out + (size_t)a->n++ * size;
    memset(e, 0, size);
    return e;
}

/* Run a list-filling command; *n_out written only on success. */
static kvp_status_t exec_list(kvp_node_t *n, kvp_status_t (*fn)(kvp_node_t *, void *), void *out,
                              uint32_t cap, uint32_t *n_out)
{
    if (n == NULL || (out == NULL && cap > 0) || n_out == NULL)
        return KVP_ERR_INVALID;
    list_args_t a = {out, cap, 0};
    kvp_status_t st = kvp__node_exec(n, fn, &a);
    if (st == KVP_OK)
        *n_out = a.n;
    return st;
}

static void held_add(kvp_node_t *n, held_args_t *a, int kind, uint32_t slot, uint64_t id,
                     uint64_t since, const char *peer)
{
    kvp_held_item_t *h = list_next(a, sizeof(*h));
    if (h == NULL)
        return;
    h->kind = kind;
    h->slot = slot;
    h->id = id;
    h->age_ms = (kvp__node_now(n) - since) / KVP_NSEC_PER_MSEC;
    snprintf(h->peer, sizeof(h->peer), "%s", peer);
}

typedef struct suspect_iter {
    kvp_node_t *n;
    held_args_t *a;
    uint64_t now;
} suspect_iter_t;

static bool held_suspect_cb(void *arg, uint32_t slot, const kvp_slot_info_t *info)
{
    suspect_iter_t *it = arg;
    if (info->suspect_until_ns > it->now)
        held_add(it->n, it->a, 3, slot, 0, it->now, "");
    return it->a->n < it->a->cap;
}

static void held_session_cb(void *arg, int kind, uint32_t slot, uint64_t id, uint64_t since_ns,
                            const char *peer)
{
    suspect_iter_t *it = arg;
    held_add(it->n, it->a, kind, slot, id, since_ns, peer);
}

static kvp_status_t do_held(kvp_node_t *n, void *arg)
{
    held_args_t *a = arg;
    suspect_iter_t it = {n, a, kvp__node_now(n)};
    kvp__session_held_foreach(&n->env, held_session_cb, &it); /* retained, quarantined */
    if (a->n < a->cap)
        kvp_store_iterate(n->store, held_suspect_cb, &it); /* age: remaining, see docs */
    return KVP_OK;
}

KVP_EXPORT kvp_status_t kvp_node_held(kvp_node_t *n, kvp_held_item_t *out, uint32_t cap,
                                      uint32_t *n_out)
{
    return exec_list(n, do_held, out, cap, n_out);
}

static kvp_status_t do_peers(kvp_node_t *n, void *arg)
{
    list_args_t *a = arg;
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &n->sessions)
    {
        kvp_session_info_t si;
        kvp__session_info(KVP_SESSION_OF(p, node_link), &si);
        kvp_peer_info_t *pi = list_next(a, sizeof(*pi));
        if (pi == NULL)
            break;
        snprintf(pi->peer, sizeof(pi->peer), "%s", si.peer);
        snprintf(pi->instance, sizeof(pi->instance), "%s", si.instance);
        snprintf(pi->data_path, sizeof(pi->data_path), "%s", kvp_data_path_str(si.path));
        pi->ready = si.open;
        pi->probation = si.probation;
        pi->rtt_ns = si.rtt_ns;
        pi->bytes_inflight = si.bytes_inflight;
        pi->loads_inflight = si.loads_inflight;
    }
    return KVP_OK;
}

KVP_EXPORT kvp_status_t kvp_node_peers(kvp_node_t *n, kvp_peer_info_t *out, uint32_t cap,
                                       uint32_t *n_out)
{
    return exec_list(n, do_peers, out, cap, n_out);
}

/* ------------------------------------------------------------ peer states */

typedef struct states_args {
    list_args_t *a;
    kvp_node_t *n;
} states_args_t;

static kvp_peer_state_t *state_find(list_args_t *a, const char *peer)
{
    for (uint32_t i = 0; i < a->n; i++) {
        kvp_peer_state_t *ps = &((kvp_peer_state_t *)a->out)[i];
        if (strcmp(ps->peer, peer) == 0)
            return ps;
    }
    return NULL;
}

static void state_want_cb(void *arg, const kvp_ctl_want_info_t *wi)
{
    list_args_t *a = arg;
    kvp_peer_state_t *ps = state_find(a, wi->addr);
    if (ps == NULL) { /* no session: where its dialling stands */
        if ((ps = list_next(a, sizeof(*ps))) == NULL)
            return;
        snprintf(ps->peer, sizeof(ps->peer), "%s", wi->addr);
        snprintf(ps->state, sizeof(ps->state), "%s",
                 wi->linked ? "dialing" : wi->failures > 0 ? "failed" : "wanted");
    }
    ps->wanted = 1;
    ps->failures = wi->failures;
    snprintf(ps->last_error, sizeof(ps->last_error), "%s", wi->last_error);
}

/* doors2: a kept peer closed as idle (kept.c): not wanted (not dialled)
 * until a lookup or fetch wakes it. */
static void state_kept_cb(void *arg, const char *addr)
{
    list_args_t *a = arg;
    kvp_peer_state_t *ps = state_find(a, addr);
    if (ps == NULL && (ps = list_next(a, sizeof(*ps))) != NULL) {
        snprintf(ps->peer, sizeof(ps->peer), "%s", addr);
        snprintf(ps->state, sizeof(ps->state), "idle");
    }
}

static kvp_status_t do_peer_states(kvp_node_t *n, void *arg)
{
    list_args_t *a = arg;
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &n->sessions)
    {
        kvp_session_info_t si;
        kvp__session_info(KVP_SESSION_OF(p, node_link), &si);
        kvp_peer_state_t *ps = list_next(a, sizeof(*ps));
        if (ps == NULL)
            break;
        snprintf(ps->peer, sizeof(ps->peer), "%s", si.peer);
        snprintf(ps->state, sizeof(ps->state), "%s",
                 !si.open       ? "closing"
                 : si.probation ? "probation"
                                : "ready");
    }
    kvp_ctl_wants_foreach(n->ctl, state_want_cb, a);
    kvp__node_kept_foreach(n, state_kept_cb, a);
    return KVP_OK;
}

KVP_EXPORT kvp_status_t kvp_node_peer_states(kvp_node_t *n, kvp_peer_state_t *out, uint32_t cap,
                                             uint32_t *n_out)
{
    return exec_list(n, do_peer_states, out, cap, n_out);
}

static kvp_status_t do_refusals(kvp_node_t *n, void *arg)
{
    kvp_refusal_stats_t *o = arg;
    kvp_ctl_stats_t cs;
    kvp_ctl_get_stats(n->ctl, &cs);
    memset(o, 0, sizeof(*o));
    o->dials = cs.dials;
    o->dial_failures = cs.dial_failures;
    o->handshakes_timed_out = cs.handshakes_timed_out;
    o->refused_incompatible = cs.refused_incompatible;
    o->refused_auth = cs.refused_auth;
    o->refused_duplicate = cs.refused_duplicate;
    o->refused_limit = cs.refused_limit + n->st.sessions_refused;
    o->peers_dead = cs.peers_dead;
    o->refused_preauth = cs.refused_preauth;
    o->refused_identity = cs.refused_identity;
    o->accept_fd_exhausted = cs.accept_fd_exhausted;
    return KVP_OK;
}

KVP_EXPORT kvp_status_t kvp_node_refusals(kvp_node_t *n, kvp_refusal_stats_t *out)
{
    if (n == NULL || out == NULL)
        return KVP_ERR_INVALID;
    return kvp__node_exec(n, do_refusals, out);
}
