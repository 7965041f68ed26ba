/*
 * metrics.c -- Prometheus text format 0.0.4 from kvp_node_stats() and
 * kvp_node_peers(): every family gets # HELP and # TYPE once, then its
 * samples; label values are escaped (\\, \", \n) as the format requires.
 */
#include "metrics.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kvpd_buf_printf(kvpd_buf_t *b, const char *fmt, ...)
{
    va_list ap;
    if (b->oom)
        return;
    for (;;) {
        size_t room = b->cap - b->len;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t ncap = b->cap ? b->cap * 2 : 4096;
        while (ncap - b->len <= (size_t)n)
            ncap *= 2;
        char *p = realloc(b->p, ncap);
        if (p == NULL) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = ncap;
    }
}

void kvpd_buf_free(kvpd_buf_t *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

/* ------------------------------------------------------------ snapshots */

typedef kvp_status_t (*snap_fn)(kvp_node_t *, void *, uint32_t, uint32_t *);

static kvp_status_t snap_peers(kvp_node_t *node, void *out, uint32_t cap, uint32_t *n)
{
    return kvp_node_peers(node, out, cap, n);
}

static kvp_status_t snap_held(kvp_node_t *node, void *out, uint32_t cap, uint32_t *n)
{
    return kvp_node_held(node, out, cap, n);
}

/* The node fills at most cap items and gives no total, so a full answer
 * may be truncated: grow and ask again. */
static kvp_status_t snapshot(kvp_node_t *node, snap_fn fn, size_t item, void **out, uint32_t *n)
{
    for (uint32_t cap = 64; cap <= (1u << 22); cap *= 4) {
        void *arr = calloc(cap, item);
        uint32_t got = 0;
        if (arr == NULL)
            return KVP_ERR_NOMEM;
        kvp_status_t st = fn(node, arr, cap, &got);
        if (st != KVP_OK || got < cap) {
            if (st != KVP_OK)
                free(arr);
            else {
                *out = arr;
                *n = got;
            }
            return st;
        }
        free(arr);
    }
    return KVP_ERR_LIMIT;
}

kvp_status_t kvpd_peers_snapshot(kvp_node_t *node, kvp_peer_info_t **out, uint32_t *n)
{
    return snapshot(node, snap_peers, sizeof(kvp_peer_info_t), (void **)out, n);
}

static kvp_status_t snap_states(kvp_node_t *node, void *out, uint32_t cap, uint32_t *n)
{
    return kvp_node_peer_states(node, out, cap, n);
}

kvp_status_t kvpd_states_snapshot(kvp_node_t *node, kvp_peer_state_t **out, uint32_t *n)
{
    return snapshot(node, snap_states, sizeof(kvp_peer_state_t), (void **)out, n);
}

kvp_status_t kvpd_held_snapshot(kvp_node_t *node, kvp_held_item_t **out, uint32_t *n)
{
    return snapshot(node, snap_held, sizeof(kvp_held_item_t), (void **)out, n);
}

/* ------------------------------------------------------------ exposition */

static void family(kvpd_buf_t *b, const char *name, const char *type, const char *help)
{
    kvpd_buf_printf(b, "# HELP kvpeer_%s %s\n# TYPE kvpeer_%s %s\n", name, help, name, type);
}

static void one(kvpd_buf_t *b, const char *name, const char *type, const char *help, uint64_t v)
{
    family(b, name, type, help);
    kvpd_buf_printf(b, "kvpeer_%s %llu\n", name, (unsigned long long)v);
}

/* A label value, escaped per the text format; first through kvp_escape
 * (issue 27: a peer id is the peer's choice): no control byte or invalid
 * UTF-8 reaches the page, a literal backslash reads \x5c. */
static void label_value(kvpd_buf_t *b, const char *raw)
{
    char v[1024];
    kvp_escape(v, sizeof(v), raw, strlen(raw), KVP_ESCAPE_BACKSLASH);
    for (const char *p = v; *p; p++) {
        if (*p == '\\' || *p == '"')
            kvpd_buf_printf(b, "\\%c", *p);
        else if (*p == '\n')
            kvpd_buf_printf(b, "\\n");
        else
            kvpd_buf_printf(b, "%c", *p);
    }
}

static void labelled(kvpd_buf_t *b, const char *name, const char *type, const char *help,
                     const char *label, const char *const *vals, const uint64_t *nums, int n)
{
    family(b, name, type, help);
    for (int i = 0; i < n; i++)
        kvpd_buf_printf(b, "kvpeer_%s{%s=\"%s\"} %llu\n", name, label, vals[i],
                        (unsigned long long)nums[i]);
}

/* One family read from kvp_stats_t: one sample (label NULL, field offs[0])
 * or one sample per label value (n of them, fields offs[0..n)). */
#define KVPD_FAMILY_MAX 8 /* samples of one family (releases_total: 8 proofs) */
typedef struct stat_family {
    const char *name, *type, *help;
    const char *label;
    const char *const *vals;
    size_t offs[KVPD_FAMILY_MAX];
    int n;
} stat_family_t;

#define F(f) offsetof(kvp_stats_t, f)
#define ONE(name, type, field, help) {name, type, help, NULL, NULL, {F(field)}, 1}

static void stat_families(kvpd_buf_t *b, const kvp_stats_t *st, const stat_family_t *fam,
                          size_t nfam)
{
    for (size_t i = 0; i < nfam; i++) {
        const stat_family_t *f = &fam[i];
        uint64_t v[KVPD_FAMILY_MAX];
        for (int k = 0; k < f->n; k++)
            memcpy(&v[k], (const char *)st + f->offs[k], sizeof(v[k]));
        if (f->label == NULL)
            one(b, f->name, f->type, f->help, v[0]);
        else
            labelled(b, f->name, f->type, f->help, f->label, f->vals, v, f->n);
    }
}

static const char *const slot_states[] = {"free", "filling", "ready", "quarantined", "suspect"};
static const char *const lookup_results[] = {"hit", "miss", "pending"};
static const char *const fetch_results[] = {"ok", "failed", "aborted"};
static const char *const session_states[] = {"ready", "handshaking"};
static const char *const proofs[] = {"terminal",  "fetch-done", "abort-ack", "fence",
                                     "am-refuse", "hold-cap",   "not-sent",  "process-exit"};
static const char *const budgets[] = {"supply_pins", "rounds", "peers_add", "lookup_keys"};
static const char *const limits[] = {"sessions", "pins", "inflight_bytes", "quarantine",
                                     "retained"};

static const stat_family_t store_families[] = {
    {"slots", "gauge", "Slots of the region by state.", "state", slot_states,
     {F(slots_free), F(slots_filling), F(slots_ready), F(slots_quarantined), F(slots_suspect)}, 5},
    ONE("pins", "gauge", pins, "Pinned slots (readers and in-flight sources)."),
    {"lookups_total", "counter", "Keys looked up on this node, by answer.", "result",
     lookup_results, {F(lookups_hit), F(lookups_miss), F(lookups_pending)}, 3},
    {"fetches_total", "counter", "Loads (fetches) by outcome.", "result", fetch_results,
     {F(fetches_ok), F(fetches_failed), F(fetches_aborted)}, 3},
    ONE("evictions_total", "counter", evictions, "READY blocks evicted for space."),
    ONE("blocks_in_total", "counter", blocks_in, "Blocks received and committed."),
    ONE("bytes_in_total", "counter", bytes_in, "Bytes received and committed."),
    ONE("blocks_out_total", "counter", blocks_out, "Blocks sent to peers."),
    ONE("bytes_out_total", "counter", bytes_out, "Bytes sent to peers."),
};

static const stat_family_t safety_families[] = {
    ONE("loads_inflight", "gauge", loads_inflight, "Loads in flight."),
    {"sessions", "gauge", "Peer sessions by state.", "state", session_states,
     {F(sessions_ready), F(sessions_handshaking)}, 2},
    ONE("retained_transfers", "gauge", retained_transfers,
        "Transfers held after their session ended."),
    ONE("quarantined_slots", "gauge", quarantined_slots,
        "Slots held until proof no WRITE can land."),
    ONE("force_releases_total", "counter", force_releases, "Holds released at the hold cap."),
    {"releases_total", "counter",
     "Slots and source pins a WRITE may touch, released, by proof (SPEC 7).", "proof", proofs,
     {F(released_terminal), F(released_fetch_done), F(released_abort_ack), F(released_fence),
      F(released_am_refuse), F(released_hold_cap), F(released_not_sent),
      F(released_process_exit)}, 8},
    ONE("checksum_mismatches_total", "counter", checksum_mismatches,
        "Blocks whose checksum did not match."),
    ONE("stale_frames_total", "counter", stale_frames, "Frames of old epochs dropped."),
    ONE("protocol_errors_total", "counter", protocol_errors,
        "Peers that broke the wire protocol."),
    ONE("peers_down_total", "counter", peers_down, "Sessions that went down."),
    ONE("probations_total", "counter", probations, "Sibling sessions put on probation."),
    {"limit_refusals_total", "counter", "Work refused at a resource limit (SPEC 8).", "limit",
     limits, {F(sessions_refused), F(pins_refused), F(fetches_refused_inflight),
              F(fetches_refused_quarantine), F(fetches_refused_retained)}, 5},
    /* issue 27: per-peer budgets (source side unless said) */
    ONE("supply_pins", "gauge", supply_pins, "Slots pinned by lookups not fetched yet."),
    ONE("lookup_round_bytes", "gauge", lookup_bytes, "Memory of peers' live lookup rounds."),
    {"budget_refusals_total", "counter", "Work refused at a per-peer budget (issue 27).", "budget",
     budgets, {F(supply_pins_refused), F(rounds_refused), F(peers_add_refused),
               F(lookup_keys_refused)}, 4},
    ONE("data_streams_open", "gauge", data_streams_open,
        "Authenticated tcp data streams into this node (kvpeer's own data port)."),
    ONE("data_streams_refused_total", "counter", data_streams_refused,
        "Data-port connections closed before landing anything (no secret, caps, framing)."),
    ONE("bytes_copied_in_total", "counter", bytes_copied_in,
        "Bytes kvp_put copied into the store (a source's staging copy; issue 29)."),
    ONE("bytes_copied_out_total", "counter", bytes_copied_out,
        "Bytes of blocks kvp_get handed out for a copy (a consumer's staging; issue 29)."),
    ONE("lookups_refused_limit_total", "counter", lookups_refused_limit,
        "LOOKUP answers sent with the limit flag."),
    ONE("leases_capped_total", "counter", leases_capped,
        "Lookup rounds whose lease reached max_lease_ms."),
    ONE("lookups_limited_total", "counter", lookups_limited,
        "Our lookups a source answered with the limit flag."),
    ONE("fetches_queued_total", "counter", fetches_queued,
        "Fetches that waited for the bytes-in-flight budget."),
    ONE("pin_leases_renewed_total", "counter", leases_renewed,
        "Lookup pin leases renewed by requesters."),
    ONE("pin_leases_expired_total", "counter", leases_expired,
        "Lookup rounds whose pin lease ran out."),
    ONE("pin_lease_pins_expired_total", "counter", lease_pins_expired,
        "Pins released by expired leases."),
    ONE("fetch_hints_stale_total", "counter", fetch_hints_stale,
        "Hinted fetches answered miss (stale hint)."),
};

static void format_peers(kvpd_buf_t *b, const kvp_peer_info_t *p, uint32_t n)
{
    family(b, "peer_info", "gauge", "One sample per peer session: id, instance, data path.");
    for (uint32_t i = 0; i < n; i++) {
        kvpd_buf_printf(b, "kvpeer_peer_info{peer=\"");
        label_value(b, p[i].peer);
        kvpd_buf_printf(b, "\",instance=\"");
        label_value(b, p[i].instance);
        kvpd_buf_printf(b, "\",data_path=\"");
        label_value(b, p[i].data_path);
        kvpd_buf_printf(b, "\"} 1\n");
    }
    family(b, "peer_rtt_seconds", "gauge", "Last PING round trip per peer.");
    for (uint32_t i = 0; i < n; i++) {
        kvpd_buf_printf(b, "kvpeer_peer_rtt_seconds{peer=\"");
        label_value(b, p[i].peer);
        kvpd_buf_printf(b, "\"} %.9f\n", (double)p[i].rtt_ns / 1e9);
    }
}

void kvpd_metrics_format(kvpd_buf_t *b, const kvp_stats_t *st, const kvp_peer_info_t *peers,
                         uint32_t npeers)
{
    one(b, "up", "gauge", "1 while the node is up.", 1);
    one(b, "insecure", "gauge",
        "1 if the node listens beyond loopback without a pre-shared key.", st->insecure);
    stat_families(b, st, store_families, sizeof(store_families) / sizeof(store_families[0]));
    family(b, "transfer_latency_seconds", "summary", "Latency of completed transfers.");
    kvpd_buf_printf(b, "kvpeer_transfer_latency_seconds_sum %.9f\n",
                    (double)st->transfer_latency_ns_sum / 1e9);
    kvpd_buf_printf(b, "kvpeer_transfer_latency_seconds_count %llu\n",
                    (unsigned long long)st->transfers_done);
    stat_families(b, st, safety_families, sizeof(safety_families) / sizeof(safety_families[0]));
    format_peers(b, peers, npeers);
}

/* Peers by state (every state named, zeros included, so alerts can match
 * on absence) and session refusals by reason. */
void kvpd_metrics_format_states(kvpd_buf_t *b, const kvp_peer_state_t *ps, uint32_t n,
                                const kvp_refusal_stats_t *r)
{
    static const char *const states[] = {"ready",  "probation", "dialing",
                                         "failed", "wanted",    "closing"};
    uint64_t cnt[6] = {0}, wanted_not_ready = 0;
    for (uint32_t i = 0; i < n; i++) {
        for (int k = 0; k < 6; k++)
            if (strcmp(ps[i].state, states[k]) == 0)
                cnt[k]++;
        if (ps[i].wanted && strcmp(ps[i].state, "ready") != 0)
            wanted_not_ready++;
    }
    labelled(b, "peers", "gauge", "Known peers (wanted or with a session) by state.", "state",
             states, cnt, 6);
    one(b, "peers_wanted_not_ready", "gauge", "Wanted peers without a ready session.",
        wanted_not_ready);
    static const char *const reasons[] = {"dial_failed", "handshake_timeout", "incompatible",
                                          "auth", "duplicate", "limit", "dead", "preauth",
                                          "identity"};
    uint64_t rv[] = {r->dial_failures, r->handshakes_timed_out, r->refused_incompatible,
                     r->refused_auth, r->refused_duplicate, r->refused_limit, r->peers_dead,
                     r->refused_preauth, r->refused_identity};
    labelled(b, "session_failures_total", "counter",
             "Sessions that did not come up or ended, by reason.", "reason", reasons, rv, 9);
    one(b, "accept_fd_exhausted_total", "counter",
        "Accepts that found no free file descriptor (the listener backed off).",
        r->accept_fd_exhausted);
    one(b, "dials_total", "counter", "Outbound connection attempts.", r->dials);
}

kvp_status_t kvpd_metrics_render(kvp_node_t *node, kvpd_buf_t *b)
{
    kvp_stats_t st;
    kvp_refusal_stats_t rs;
    kvp_peer_info_t *peers = NULL;
    kvp_peer_state_t *states = NULL;
    uint32_t n = 0, ns = 0;
    kvp_status_t s = kvp_node_stats(node, &st);
    if (s == KVP_OK)
        s = kvp_node_refusals(node, &rs);
    if (s != KVP_OK)
        return s;
    if ((s = kvpd_peers_snapshot(node, &peers, &n)) != KVP_OK)
        return s;
    if ((s = kvpd_states_snapshot(node, &states, &ns)) != KVP_OK) {
        free(peers);
        return s;
    }
    kvpd_metrics_format(b, &st, peers, n);
    kvpd_metrics_format_states(b, states, ns, &rs);
    free(peers);
    free(states);
    return b->oom ? KVP_ERR_NOMEM : KVP_OK;
}
