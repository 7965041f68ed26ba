/*
 * metrics.c -- Prometheus text format 0.0.4 from kvp_node_stats() and
 * kvp_node_peers(): every family gets # HELP and # TYPE once, then its
 * samples; label values are escaped (\\, \", \n) as the format requires.
 */
#include "metrics.h"

#include <stdarg.h>
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

/* A label value, escaped per the text format. */
static void label_value(kvpd_buf_t *b, const char *v)
{
    for (const char *p = v; *p; p++) {
        if (*p == '\\' || *p == '"')
            kvpd_buf_printf(b, "\\%c", *p);
        else if (*p == '\n')
            kvpd_buf_printf(b, "\\n");
        else
            kvpd_buf_printf(b, "%c", *p);
    }
}

static void labelled(kvpd_buf_t *b, const char *name, const char *label, const char *const *vals,
                     const uint64_t *nums, int n)
{
    for (int i = 0; i < n; i++)
        kvpd_buf_printf(b, "kvpeer_%s{%s=\"%s\"} %llu\n", name, label, vals[i],
                        (unsigned long long)nums[i]);
}

static void format_store(kvpd_buf_t *b, const kvp_stats_t *st)
{
    static const char *const slot_states[] = {"free", "filling", "ready", "quarantined",
                                              "suspect"};
    uint64_t slots[] = {st->slots_free, st->slots_filling, st->slots_ready,
                        st->slots_quarantined, st->slots_suspect};
    family(b, "slots", "gauge", "Slots of the region by state.");
    labelled(b, "slots", "state", slot_states, slots, 5);
    one(b, "pins", "gauge", "Pinned slots (readers and in-flight sources).", st->pins);
    static const char *const lk[] = {"hit", "miss", "pending"};
    uint64_t lkv[] = {st->lookups_hit, st->lookups_miss, st->lookups_pending};
    family(b, "lookups_total", "counter", "Keys looked up on this node, by answer.");
    labelled(b, "lookups_total", "result", lk, lkv, 3);
    static const char *const fr[] = {"ok", "failed", "aborted"};
    uint64_t frv[] = {st->fetches_ok, st->fetches_failed, st->fetches_aborted};
    family(b, "fetches_total", "counter", "Loads (fetches) by outcome.");
    labelled(b, "fetches_total", "result", fr, frv, 3);
    one(b, "evictions_total", "counter", "READY blocks evicted for space.", st->evictions);
}

static void format_transfers(kvpd_buf_t *b, const kvp_stats_t *st)
{
    one(b, "blocks_in_total", "counter", "Blocks received and committed.", st->blocks_in);
    one(b, "bytes_in_total", "counter", "Bytes received and committed.", st->bytes_in);
    one(b, "blocks_out_total", "counter", "Blocks sent to peers.", st->blocks_out);
    one(b, "bytes_out_total", "counter", "Bytes sent to peers.", st->bytes_out);
    family(b, "transfer_latency_seconds", "summary", "Latency of completed transfers.");
    kvpd_buf_printf(b, "kvpeer_transfer_latency_seconds_sum %.9f\n",
                    (double)st->transfer_latency_ns_sum / 1e9);
    kvpd_buf_printf(b, "kvpeer_transfer_latency_seconds_count %llu\n",
                    (unsigned long long)st->transfers_done);
    one(b, "loads_inflight", "gauge", "Loads in flight.", st->loads_inflight);
}

static void format_safety(kvpd_buf_t *b, const kvp_stats_t *st)
{
    static const char *const ss[] = {"ready", "handshaking"};
    uint64_t ssv[] = {st->sessions_ready, st->sessions_handshaking};
    family(b, "sessions", "gauge", "Peer sessions by state.");
    labelled(b, "sessions", "state", ss, ssv, 2);
    one(b, "retained_transfers", "gauge", "Transfers held after their session ended.",
        st->retained_transfers);
    one(b, "quarantined_slots", "gauge", "Slots held until proof no WRITE can land.",
        st->quarantined_slots);
    one(b, "force_releases_total", "counter", "Holds released at the hold cap.",
        st->force_releases);
    one(b, "checksum_mismatches_total", "counter", "Blocks whose checksum did not match.",
        st->checksum_mismatches);
    one(b, "stale_frames_total", "counter", "Frames of old epochs dropped.", st->stale_frames);
    one(b, "protocol_errors_total", "counter", "Peers that broke the wire protocol.",
        st->protocol_errors);
    one(b, "peers_down_total", "counter", "Sessions that went down.", st->peers_down);
    one(b, "probations_total", "counter", "Sibling sessions put on probation.", st->probations);
    static const char *const lim[] = {"sessions", "pins", "inflight_bytes", "quarantine",
                                      "retained"};
    uint64_t limv[] = {st->sessions_refused, st->pins_refused, st->fetches_refused_inflight,
                       st->fetches_refused_quarantine, st->fetches_refused_retained};
    family(b, "limit_refusals_total", "counter", "Work refused at a resource limit (SPEC 8).");
    labelled(b, "limit_refusals_total", "limit", lim, limv, 5);
    one(b, "fetches_queued_total", "counter", "Fetches that waited for the bytes-in-flight budget.",
        st->fetches_queued);
    one(b, "pin_leases_renewed_total", "counter", "Lookup pin leases renewed by requesters.",
        st->leases_renewed);
    one(b, "pin_leases_expired_total", "counter", "Lookup rounds whose pin lease ran out.",
        st->leases_expired);
    one(b, "pin_lease_pins_expired_total", "counter", "Pins released by expired leases.",
        st->lease_pins_expired);
    one(b, "fetch_hints_stale_total", "counter", "Hinted fetches answered miss (stale hint).",
        st->fetch_hints_stale);
}

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
    format_store(b, st);
    format_transfers(b, st);
    format_safety(b, st);
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
    family(b, "peers", "gauge", "Known peers (wanted or with a session) by state.");
    labelled(b, "peers", "state", states, cnt, 6);
    one(b, "peers_wanted_not_ready", "gauge", "Wanted peers without a ready session.",
        wanted_not_ready);
    static const char *const reasons[] = {"dial_failed", "handshake_timeout", "incompatible",
                                          "auth", "duplicate", "limit", "dead"};
    uint64_t rv[] = {r->dial_failures, r->handshakes_timed_out, r->refused_incompatible,
                     r->refused_auth, r->refused_duplicate, r->refused_limit, r->peers_dead};
    family(b, "session_failures_total", "counter",
           "Sessions that did not come up or ended, by reason.");
    labelled(b, "session_failures_total", "reason", reasons, rv, 7);
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
