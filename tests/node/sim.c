/*
 * sim.c -- the deterministic simulator (see sim.h).
 *
 * One step = one workload action chosen by the seeded PRNG, then a random
 * advance of the virtual clock (network delivered, every node progressed,
 * fake transfers landed), then the invariant checker:
 *   I1/I2  the fake fabric's landing checker recorded no violation;
 *          every store validates (kvp_store_check);
 *   I3     no node logged a completion for a transfer it does not know
 *          (another incarnation's completion reaching a live session);
 *   I4     no operation produced more than one event; after the quiesce
 *          phase every operation of a surviving node produced exactly one;
 *   I5     retained transfers and quarantined slots never outlive the hold
 *          cap (plus one reap period), and after the quiesce phase nothing
 *          is pinned, FILLING, QUARANTINED or retained.
 */
#include "sim.h"

#include "node/node.h"
#include "session/session_int.h" /* the simulator looks inside sessions */
#include "transport/fake.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MS KVP_NSEC_PER_MSEC
#define SIM_MAX 8
#define SIM_KEYS 96
#define SIM_OPS 4096
#define TRACE_LEN 24
#define QUIESCE_STEP (50 * MS)

const char *const sim_fault_names[SIM_F_KINDS] = {
    "kill", "restart", "partition", "graceful", "wedge", "late", "fail", "submit-fail",
    "endpoint-error", "cancel", "finish", "race-partition", "parked-late", "ep-error-teardown",
    "stale-frame", "past-cap",
};

typedef struct sim_op {
    bool used, is_load;
    int node;       /* the node that issued it */
    int peer;
    uint64_t id, request;
    uint32_t events;
    uint32_t n;
    uint8_t keys[16 * 16];
    uint32_t lens[16];
    uint8_t results[16];
    int32_t block_status[16];
    uint32_t slots[16]; /* external mode: the embedding's slots lent to the load */
} sim_op_t;

/* Issue 29, external mode: what the simulated embedding believes of each
 * slot of its region. It must match the node's kvp_slots_held at every
 * check (OWNED <-> 0, LENT <-> 1, PUBLISHED/UNPUBLISHING <-> 2). */
enum { EXT_OWNED = 0, EXT_LENT = 1, EXT_PUBLISHED = 2, EXT_UNPUBLISHING = 3 };
#define SIM_SLOTS 48

typedef struct sim {
    sim_opts_t o;
    sim_result_t *r;
    kvp_rng_t rng;
    kvp_rng_t random_bytes; /* kvp_random_bytes while the run lasts */
    kvp_manual_clock_t mc;
    kvp_fake_fabric_t *fab;
    kvp_fake_net_t *net;
    kvp_node_t *node[SIM_MAX];
    char addr[SIM_MAX][32];
    kvp_config_t cfg[SIM_MAX];
    kvp_node_seams_t seams[SIM_MAX];
    bool cut[SIM_MAX][SIM_MAX];
    int ops_hi; /* ops[ops_hi..] were never used: scans stop there */
    int scan_start;
    int step;
    char trace[TRACE_LEN][96];
    int trace_n;
    uint64_t unknown_completions;
    bool tracing; /* keep the last actions (verbose runs, and the rerun of a bad seed) */
    /* Destinations (node, slot, generation) the hold cap released (SPEC
     * §7.4): a WRITE for one of them may still land, by design; the slot is
     * suspect and every acquire re-verifies it. Learnt from the node's log
     * line, while the load is still on its quarantine list. */
    struct {
        int node;
        uint32_t slot, gen;
    } capfree[512];
    int n_capfree;
    /* Retained transfers the hold cap force-released (SPEC §7.3): their
     * source slots may be read after the pins are gone, by design. */
    uint64_t capxfer[512];
    int n_capxfer;
    uint8_t *blockbuf;
    bool corrupt[SIM_MAX][SIM_KEYS]; /* (node, key) corrupted on purpose at the source */
    kvp_store_t *checked_store[SIM_MAX]; /* the store and its counters at its last check */
    kvp_store_stats_t checked_stats[SIM_MAX];
    /* External mode (issue 29): per node and slot, the embedding's view
     * (EXT_*), the pattern it wrote into an owned slot (0: unchecked), the
     * key it published there, and whether the hold cap (no proof) handed it
     * back once (a late WRITE may land there by design: unchecked). */
    uint8_t ext_state[SIM_MAX][SIM_SLOTS];
    uint64_t ext_tag[SIM_MAX][SIM_SLOTS];
    uint16_t ext_key[SIM_MAX][SIM_SLOTS];
    bool ext_taint[SIM_MAX][SIM_SLOTS];
    bool ext_once[SIM_MAX][SIM_SLOTS]; /* published once: its first fetch unpublishes it */
    uint64_t ext_next_tag;
    /* Issue 29 step 2: keys each node's embedding ever published (a LOOKUP
     * hit from that node for any other key is a violation). */
    bool ext_ever_pub[SIM_MAX][SIM_KEYS];
    /* Last: a run clears only ops[0..ops_hi) of the one before (sim_alloc). */
    sim_op_t ops[SIM_OPS];
} sim_t;

/* One sim_t per process, reused: zeroing its 1.4 MB op table for every seed
 * cost more than many a short run. A run starts from the same all-zero
 * state as from calloc: the head is cleared, and of the op table the part
 * the previous run used (ops[ops_hi..] are never touched). Freed at exit. */
static sim_t *g_spare;

static sim_t *sim_alloc(void)
{
    sim_t *s = g_spare;
    g_spare = NULL;
    if (s == NULL)
        return calloc(1, sizeof(*s));
    memset(s->ops, 0, (size_t)s->ops_hi * sizeof(s->ops[0]));
    memset(s, 0, offsetof(sim_t, ops));
    return s;
}

static void sim_free(sim_t *s)
{
    if (g_spare == NULL)
        g_spare = s;
    else
        free(s);
}

__attribute__((destructor)) static void sim_spare_free(void)
{
    free(g_spare);
    g_spare = NULL;
}

static void note_cap_release(sim_t *s, const char *prefix, uint64_t op_id)
{
    for (int i = 0; i < s->o.nodes; i++) {
        kvp_node_t *n = s->node[i];
        if (n == NULL || strcmp(s->addr[i], prefix) != 0)
            continue;
        for (kvp_list_t *p = n->env.quarantined.next; p != &n->env.quarantined; p = p->next) {
            const kvp_load_t *l = KVP_CONTAINER_OF(p, kvp_load_t, link);
            if (l->op_id != op_id)
                continue;
            for (uint32_t b = 0; b < l->n; b++) {
                if (!l->blocks[b].reserved)
                    continue;
                int k = s->n_capfree++ % (int)KVP_ARRAY_SIZE(s->capfree);
                s->capfree[k].node = i;
                s->capfree[k].slot = l->blocks[b].dst.slot;
                s->capfree[k].gen = l->blocks[b].dst.gen;
            }
        }
    }
}

/* A landing in a destination the hold cap released, or a copy reading a
 * source the cap unpinned: allowed, logged and counted (SPEC §7.3-4, I2). */
static bool landing_after_cap(sim_t *s, const kvp_fake_violation_t *v)
{
    if (v->kind == KVP_FAKE_V_SRC_STALE || v->kind == KVP_FAKE_V_SRC_STATE ||
        v->kind == KVP_FAKE_V_SRC_UNPINNED) { /* read after the source's cap */
        int n = KVP_MIN(s->n_capxfer, (int)KVP_ARRAY_SIZE(s->capxfer));
        for (int k = 0; k < n; k++)
            if (s->capxfer[k] == v->xfer)
                return true;
        return false;
    }
    if (v->kind != KVP_FAKE_V_DST_STALE && v->kind != KVP_FAKE_V_DST_STATE)
        return false;
    int node = -1;
    for (int i = 0; i < s->o.nodes; i++)
        if (s->node[i] != NULL && kvp_fake_endpoint_id(kvp__node_xport(s->node[i])) == v->dst_ep)
            node = i;
    int n = KVP_MIN(s->n_capfree, (int)KVP_ARRAY_SIZE(s->capfree));
    for (int k = 0; k < n; k++)
        if (s->capfree[k].node == node && s->capfree[k].slot == v->dst_slot &&
            s->capfree[k].gen == v->expected_gen)
            return true;
    return false;
}

static void sim_log_sink(kvp_log_level_t level, const char *prefix, const char *line, void *arg)
{
    sim_t *s = arg;
    (void)prefix;
    if (level == KVP_LOG_ERROR && strstr(line, "completion for unknown transfer"))
        s->unknown_completions++;
    const char *cap = level == KVP_LOG_ERROR ? strstr(line, " released (hold cap)") : NULL;
    const char *ld = cap ? strstr(line, "quarantined slots of load ") : NULL;
    if (ld != NULL && prefix != NULL)
        note_cap_release(s, prefix, strtoull(ld + strlen("quarantined slots of load "), NULL, 10));
    const char *rt = level == KVP_LOG_ERROR && strstr(line, " force-released (hold cap)")
                         ? strstr(line, "retained transfer ")
                         : NULL;
    if (rt != NULL)
        s->capxfer[s->n_capxfer++ % (int)KVP_ARRAY_SIZE(s->capxfer)] =
            strtoull(rt + strlen("retained transfer "), NULL, 10);
    if (s->o.verbose)
        fprintf(stderr, "    [%s] %s\n", prefix ? prefix : "-", line);
}

static void trace(sim_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void trace(sim_t *s, const char *fmt, ...)
{
    if (!s->tracing) /* a seed with a violation is run again with tracing on */
        return;
    va_list ap;
    char *t = s->trace[s->trace_n++ % TRACE_LEN];
    int k = snprintf(t, 96, "#%d t=%llums ", s->step,
                     (unsigned long long)(kvp_clock_now(&s->mc.clock) / MS));
    va_start(ap, fmt);
    vsnprintf(t + k, (size_t)(96 - k), fmt, ap);
    va_end(ap);
    if (s->o.verbose)
        fprintf(stderr, "  %s\n", t);
}

static void violation(sim_t *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void violation(sim_t *s, const char *fmt, ...)
{
    va_list ap;
    s->r->violations++;
    if (s->r->violations > 1)
        return;
    va_start(ap, fmt);
    vsnprintf(s->r->first_violation, sizeof(s->r->first_violation), fmt, ap);
    va_end(ap);
    s->r->violation_step = s->step;
    if (!s->tracing)
        return;
    fprintf(stderr, "sim: VIOLATION seed=%llu step=%d: %s\n", (unsigned long long)s->o.seed,
            s->step, s->r->first_violation);
    fprintf(stderr, "sim: last actions:\n");
    for (int i = KVP_MAX(0, s->trace_n - TRACE_LEN); i < s->trace_n; i++)
        fprintf(stderr, "  %s\n", s->trace[i % TRACE_LEN]);
}

/* The nodes' random bytes (epochs, nonces): from a stream of the seed's
 * own, not the workload's, instead of a getrandom call each. */
static void sim_random_bytes(void *buf, size_t len, void *arg)
{
    kvp_rng_t *r = arg;
    for (size_t i = 0; i < len; i += 8) {
        uint64_t v = kvp_rng_next(r);
        memcpy((uint8_t *)buf + i, &v, KVP_MIN(len - i, 8u));
    }
}

static uint64_t rnd(sim_t *s, uint64_t bound)
{
    return kvp_rng_below(&s->rng, bound);
}

/* ------------------------------------------------------------- nodes */

static void node_cfg(sim_t *s, int i)
{
    kvp_config_t *c = &s->cfg[i];
    kvp_config_init(c);
    snprintf(s->addr[i], sizeof(s->addr[i]), "s%d:9000", i);
    c->name = s->addr[i];
    c->listen_addr = s->addr[i];
    c->instance_id = i % 2 == 0 ? "hostA" : NULL; /* even ranks share an instance */
    c->transport = KVP_TRANSPORT_FAKE;
    c->thread_mode = KVP_THREAD_CALLER;
    c->num_blocks = 48;
    c->block_size = 4096;
    c->compat = "sim";
    c->heartbeat_ms = 50;
    c->dead_after_ms = 200;
    c->handshake_timeout_ms = 500;
    c->lookup_pending_ms = 100;
    c->supply_pin_ms = 300;
    c->load_timeout_ms = 600;
    c->abort_resend_ms = 100;
    c->abort_ack_timeout_ms = 400;
    c->parked_demand_ms = 300;
    c->hold_cap_ms = 1500;
    c->shutdown_drain_ms = 100;
    c->backoff_min_ms = 20;
    c->backoff_max_ms = 200;
    c->max_retained = 64;
    /* Issue 27's per-peer budgets stay out of the simulated workload (its
     * digests and coverage seeds predate them; tests/reliability/test_bounds.c
     * and test_budgets.c cover them). */
    c->max_supply_pins_per_peer = c->max_supply_pins = UINT32_MAX;
    c->max_lease_ms = UINT32_MAX;
    c->external_slots = s->o.external; /* issue 29: the fake's store maps the region */
    c->external_wanted = s->o.external && s->o.wanted; /* issue 29 step 2 */
    s->seams[i] = (kvp_node_seams_t){&s->mc.clock, s->net, s->fab,
                                     i % 3 == 2 ? KVP_PATH_FAKE_UNFENCEABLE
                                                : KVP_PATH_FAKE_FENCEABLE,
                                     2 * MS, .no_event_fd = true};
}

static void ext_reset(sim_t *s, int i);

static bool node_start(sim_t *s, int i)
{
    kvp_status_t st = kvp__node_create_ex(&s->cfg[i], &s->seams[i], &s->node[i]);
    if (st != KVP_OK) {
        violation(s, "node %d could not start: %s", i, kvp_status_str(st));
        return false;
    }
    if (s->o.external)
        ext_reset(s, i);
    for (int j = 0; j < s->o.nodes; j++)
        if (j != i)
            kvp_peer_add(s->node[i], s->addr[j]);
    return true;
}

static void node_stop(sim_t *s, int i)
{
    kvp_fake_counters_t fc;
    kvp_fake_get_counters(kvp__node_xport(s->node[i]), &fc);
    s->r->posted_fenced += fc.posted_fenced;
    kvp_stats_t st;
    kvp_node_stats(s->node[i], &st);
    s->r->exit_released += st.released_process_exit; /* issue 27 */
    kvp_node_destroy(s->node[i]);
    s->node[i] = NULL;
    for (int k = 0; k < s->ops_hi; k++) /* its operations died with it */
        if (s->ops[k].used && s->ops[k].node == i)
            s->ops[k].used = false;
}

/* ---------------------------------------------------------- operations */

static sim_op_t *op_new(sim_t *s)
{
    for (int k = 0; k < SIM_OPS; k++)
        if (!s->ops[k].used) {
            memset(&s->ops[k], 0, sizeof(s->ops[k]));
            s->ops[k].used = true;
            s->ops_hi = KVP_MAX(s->ops_hi, k + 1);
            return &s->ops[k];
        }
    return NULL;
}

static sim_op_t *op_find(sim_t *s, int node, uint64_t id)
{
    for (int k = 0; k < s->ops_hi; k++)
        if (s->ops[k].used && s->ops[k].node == node && s->ops[k].id == id)
            return &s->ops[k];
    return NULL;
}

/* A circular scan of the op table from `start` (drawn over SIM_OPS): the
 * order of k = start, start+1, ... mod SIM_OPS, restricted to the part ever
 * used, [0, ops_hi). Returns -1 when done; the start is kept in scan_start. */
static int op_scan_first(sim_t *s, int start)
{
    s->scan_start = start;
    if (start < s->ops_hi)
        return start;
    return s->ops_hi > 0 ? 0 : -1;
}

static int op_scan_next(sim_t *s, int k)
{
    int start = s->scan_start, next = k + 1;
    if (k >= start) /* first leg: start .. ops_hi-1, then 0 .. start-1 */
        return next < s->ops_hi ? next : (start > 0 && start <= s->ops_hi ? 0 : -1);
    return next < start && next < s->ops_hi ? next : -1;
}

/* "k%03u" without printf (k < SIM_KEYS < 1000): 4 bytes, NUL-terminated. */
static uint32_t key_fmt(uint32_t k, uint8_t *out)
{
    out[0] = 'k';
    out[1] = (uint8_t)('0' + k / 100 % 10);
    out[2] = (uint8_t)('0' + k / 10 % 10);
    out[3] = (uint8_t)('0' + k % 10);
    out[4] = '\0';
    return 4;
}

static void make_keys(sim_t *s, sim_op_t *op, uint32_t n)
{
    size_t off = 0;
    op->n = n;
    for (uint32_t i = 0; i < n; i++) {
        op->lens[i] = key_fmt((uint32_t)rnd(s, SIM_KEYS), op->keys + off);
        off += op->lens[i];
    }
}

/* The content of key k: derived from k alone, computed once per process. */
#define SIM_BLOCK 4096
static void block_fill(uint32_t k, uint8_t *buf, size_t len)
{
    static uint8_t cache[SIM_KEYS][SIM_BLOCK];
    static bool cached[SIM_KEYS];
    KVP_ASSERT(k < SIM_KEYS && len == SIM_BLOCK);
    if (!cached[k]) {
        kvp_rng_t r;
        kvp_rng_seed(&r, 0xb10c0000u + k);
        for (size_t i = 0; i < SIM_BLOCK; i += 8) {
            uint64_t v = kvp_rng_next(&r);
            memcpy(cache[k] + i, &v, 8);
        }
        cached[k] = true;
    }
    memcpy(buf, cache[k], len);
}


static uint32_t key_index(const uint8_t *key, uint32_t len);

/* ------------------------------------------- issue 29: the embedding */

static uint8_t *ext_ptr(sim_t *s, int i, uint32_t slot)
{
    return kvp_store_slot_ptr(kvp__node_store(s->node[i]), slot);
}

static uint64_t ext_word(uint64_t tag, int w)
{
    return tag * 0x9e3779b97f4a7c15ull + (uint64_t)w;
}

/* The embedding reuses a slot it owns: its own pattern, 8 words spread over
 * the block (a landing of any block overwrites them). */
static void ext_scribble(sim_t *s, int i, uint32_t slot)
{
    uint64_t tag = ++s->ext_next_tag;
    uint8_t *p = ext_ptr(s, i, slot);
    for (int w = 0; w < 8; w++) {
        uint64_t v = ext_word(tag, w);
        memcpy(p + w * 512, &v, 8);
    }
    s->ext_tag[i][slot] = tag;
    s->ext_state[i][slot] = EXT_OWNED;
    s->ext_once[i][slot] = false;
}

/* A slot the embedding owned all along must still hold its pattern. */
static void ext_check_pattern(sim_t *s, int i, uint32_t slot, const char *when)
{
    uint64_t tag = s->ext_tag[i][slot];
    if (tag == 0 || s->ext_taint[i][slot] || s->ext_state[i][slot] != EXT_OWNED)
        return;
    const uint8_t *p = ext_ptr(s, i, slot);
    for (int w = 0; w < 8; w++) {
        uint64_t v;
        memcpy(&v, p + w * 512, 8);
        if (v != ext_word(tag, w)) {
            violation(s, "n%d: slot %u written while the embedding's (seen at %s)", i, slot, when);
            s->ext_tag[i][slot] = 0;
            return;
        }
    }
}

/* The node (re)started: every slot is the embedding's (the region is new). */
static void ext_reset(sim_t *s, int i)
{
    for (uint32_t k = 0; k < SIM_SLOTS; k++) {
        s->ext_taint[i][k] = false;
        ext_scribble(s, i, k);
    }
}

/* n distinct slots the embedding owns, drawn at random; false if too few. */
static bool ext_pick(sim_t *s, int i, uint32_t n, uint32_t *out)
{
    uint32_t owned[SIM_SLOTS], m = 0;
    for (uint32_t k = 0; k < SIM_SLOTS; k++)
        if (s->ext_state[i][k] == EXT_OWNED)
            owned[m++] = k;
    if (m < n)
        return false;
    for (uint32_t b = 0; b < n; b++) {
        uint32_t r = b + (uint32_t)rnd(s, m - b), t = owned[b];
        owned[b] = owned[r];
        owned[r] = t;
        out[b] = owned[b];
    }
    return true;
}

/* Put block k (normal mode), or publish it from a slot the embedding owns. */
static kvp_status_t sim_put(sim_t *s, int j, uint32_t k, const uint8_t *key, uint32_t kl,
                            uint64_t req)
{
    block_fill(k, s->blockbuf, s->cfg[j].block_size);
    if (!s->o.external)
        return kvp_put(s->node[j], key, kl, s->blockbuf, s->cfg[j].block_size, req);
    uint32_t slot;
    if (!ext_pick(s, j, 1, &slot))
        return KVP_ERR_NOSPACE;
    ext_check_pattern(s, j, slot, "publish");
    memcpy(ext_ptr(s, j, slot), s->blockbuf, s->cfg[j].block_size);
    bool once = rnd(s, 3) == 0; /* the prefill half of P/D: back at its first fetch */
    uint64_t once_for = once && rnd(s, 2) == 0 ? 1 + rnd(s, 8) : 0; /* ... of that request */
    kvp_status_t st = once ? kvp_publish_once(s->node[j], key, kl, slot, NULL, once_for)
                           : kvp_publish(s->node[j], key, kl, slot);
    if (st == KVP_OK) {
        s->ext_state[j][slot] = EXT_PUBLISHED;
        s->ext_once[j][slot] = once;
        s->ext_key[j][slot] = (uint16_t)k;
        s->ext_ever_pub[j][k] = true;
        return st;
    }
    if (st != KVP_ERR_EXISTS)
        violation(s, "n%d: publish into its own slot %u refused: %s", j, slot, kvp_status_str(st));
    ext_scribble(s, j, slot);
    return st;
}

/* Fetch (normal mode), or fetch into slots the embedding owns. */
static kvp_status_t sim_fetch(sim_t *s, int i, int j, sim_op_t *op, uint32_t flags)
{
    if (!s->o.external)
        return kvp_fetch(s->node[i], s->addr[j], op->request, op->keys, op->lens, op->n, flags,
                         op->block_status, &op->id);
    if (!ext_pick(s, i, op->n, op->slots))
        return KVP_ERR_NOSPACE;
    for (uint32_t b = 0; b < op->n; b++)
        ext_check_pattern(s, i, op->slots[b], "lend");
    kvp_status_t st = kvp_fetch_into(s->node[i], s->addr[j], op->request, op->keys, op->lens,
                                     op->n, op->slots, flags, op->block_status, &op->id);
    if (st == KVP_ERR_INVALID)
        violation(s, "n%d: fetch_into refused the embedding's own slots", i);
    for (uint32_t b = 0; b < op->n && st == KVP_OK; b++)
        s->ext_state[i][op->slots[b]] = EXT_LENT;
    return st;
}

/* The embedding takes a published slot back. */
static void act_unpublish(sim_t *s, int i)
{
    uint32_t pub[SIM_SLOTS], m = 0;
    for (uint32_t k = 0; k < SIM_SLOTS; k++)
        if (s->ext_state[i][k] == EXT_PUBLISHED)
            pub[m++] = k;
    if (m == 0)
        return;
    uint32_t slot = pub[rnd(s, m)], got = UINT32_MAX;
    uint8_t key[16];
    uint32_t kl = key_fmt(s->ext_key[i][slot], key);
    kvp_status_t st = kvp_unpublish(s->node[i], key, kl, &got);
    trace(s, "unpublish n%d slot %u -> %s", i, slot, kvp_status_str(st));
    if (st == KVP_ERR_NOT_FOUND && s->ext_once[i][slot]) {
        s->ext_state[i][slot] = EXT_UNPUBLISHING; /* fetched: its SLOT_FREE is on its way */
        return;
    }
    if ((st != KVP_OK && st != KVP_ERR_BUSY) || got != slot) {
        violation(s, "n%d: unpublish of slot %u: %s (slot %u)", i, slot, kvp_status_str(st), got);
        return;
    }
    if (st == KVP_OK)
        ext_scribble(s, i, slot);
    else
        s->ext_state[i][slot] = EXT_UNPUBLISHING;
}

/* KVP_EV_LOAD of a fetch_into: each slot is the embedding's now (reused at
 * once: a verified block checked byte-exact first), or held (BUSY). */
static void ext_on_load(sim_t *s, int i, sim_op_t *op, const kvp_event_t *ev)
{
    uint32_t held = 0;
    size_t off = 0;
    for (uint32_t b = 0; b < op->n; off += op->lens[b], b++) {
        uint32_t slot = op->slots[b];
        if (s->ext_state[i][slot] != EXT_LENT) {
            violation(s, "n%d: load %llu: slot %u not lent", i, (unsigned long long)op->id, slot);
            continue;
        }
        if (op->block_status[b] == KVP_ERR_BUSY) {
            held++;
            s->r->ext_held++;
            continue;
        }
        uint32_t k = key_index(op->keys + off, op->lens[b]);
        if (op->block_status[b] == KVP_OK && !s->ext_taint[i][slot]) {
            block_fill(k, s->blockbuf, s->cfg[i].block_size);
            if (memcmp(ext_ptr(s, i, slot), s->blockbuf, s->cfg[i].block_size) != 0)
                violation(s, "n%d: fetched block k%03u in slot %u has wrong content", i, k, slot);
        }
        s->ext_state[i][slot] = EXT_OWNED;
        if (op->block_status[b] == KVP_OK && !s->ext_taint[i][slot] && rnd(s, 2) == 0 &&
            kvp_publish(s->node[i], op->keys + off, op->lens[b], slot) == KVP_OK) {
            s->ext_state[i][slot] = EXT_PUBLISHED; /* the embedding serves what it loaded */
            s->ext_key[i][slot] = (uint16_t)k;
            s->ext_ever_pub[i][k] = true;
            continue;
        }
        ext_scribble(s, i, slot); /* reused at once */
    }
    if (held != ev->n_held)
        violation(s, "n%d: load %llu: %u slots held, the event says %u", i,
                  (unsigned long long)op->id, held, ev->n_held);
}

/* Issue 29 step 2: KVP_EV_WANTED. The embedding reads the keys, holds
 * (publishes from an owned slot) about two in three, and calls
 * kvp_wanted_done three times in four (else the deadline answers). The op
 * may be gone only when every key it read was published. */
static void ext_on_wanted(sim_t *s, int i, const kvp_event_t *ev)
{
    uint8_t keys[16 * KVP_KEY_MAX];
    uint32_t lens[16], n = 0;
    kvp_status_t st = kvp_wanted_keys(s->node[i], ev->op_id, keys, lens, 16, &n);
    trace(s, "wanted n%d op %llu x%u -> %s", i, (unsigned long long)ev->op_id, n,
          kvp_status_str(st));
    if (st == KVP_ERR_NOT_FOUND)
        return; /* answered already: its deadline passed in the same advance */
    if (st != KVP_OK || n == 0 || n > ev->n_keys) {
        violation(s, "n%d: wanted op %llu: %s, %u keys of %u", i,
                  (unsigned long long)ev->op_id, kvp_status_str(st), n, ev->n_keys);
        return;
    }
    s->r->wanted_ops++;
    bool all = true, here[SIM_KEYS] = {false}; /* a key twice in the LOOKUP: published once */
    for (uint32_t b = 0; b < n; b++) {
        const uint8_t *key = keys + (size_t)b * KVP_KEY_MAX;
        uint32_t k = key_index(key, lens[b]);
        if (k >= SIM_KEYS) {
            violation(s, "n%d: wanted op %llu: a key no one asked for", i,
                      (unsigned long long)ev->op_id);
            return;
        }
        kvp_status_t ps = rnd(s, 3) != 0 ? sim_put(s, i, k, key, lens[b], 0) : KVP_ERR_NOT_FOUND;
        s->r->wanted_published += ps == KVP_OK;
        here[k] |= ps == KVP_OK || ps == KVP_ERR_EXISTS;
    }
    for (uint32_t b = 0; b < n; b++)
        all &= here[key_index(keys + (size_t)b * KVP_KEY_MAX, lens[b])];
    if (rnd(s, 4) == 0)
        return;
    st = kvp_wanted_done(s->node[i], ev->op_id);
    if (st != KVP_OK && !(st == KVP_ERR_NOT_FOUND && all))
        violation(s, "n%d: wanted_done of op %llu: %s", i, (unsigned long long)ev->op_id,
                  kvp_status_str(st));
}

/* A LOOKUP of node i answered by node j: every hit is a key j's embedding
 * published (external mode: the node serves nothing else). */
static void ext_check_hits(sim_t *s, int i, const sim_op_t *op)
{
    size_t off = 0;
    for (uint32_t b = 0; b < op->n; off += op->lens[b], b++) {
        uint32_t k = key_index(op->keys + off, op->lens[b]);
        if (op->results[b] == KVP_LOOKUP_HIT && k < SIM_KEYS && !s->ext_ever_pub[op->peer][k])
            violation(s, "n%d: LOOKUP hit for k%03u at n%d, which its embedding never published",
                      i, k, op->peer);
    }
}

/* KVP_EV_SLOTS_RELEASED / KVP_EV_SLOT_FREE: slots handed back later. */
static void ext_on_release(sim_t *s, int i, const kvp_event_t *ev)
{
    if (ev->type == KVP_EV_SLOT_FREE) {
        uint32_t slot = (uint32_t)ev->op_id;
        bool fetched = slot < SIM_SLOTS && s->ext_state[i][slot] == EXT_PUBLISHED &&
                       s->ext_once[i][slot]; /* published once: its fetch unpublished it */
        if (slot >= SIM_SLOTS || (s->ext_state[i][slot] != EXT_UNPUBLISHING && !fetched))
            violation(s, "n%d: SLOT_FREE for slot %u not unpublishing", i, slot);
        else
            ext_scribble(s, i, slot);
        s->r->ext_slot_free++;
        s->r->ext_served_once += fetched;
        return;
    }
    sim_op_t *op = op_find(s, i, ev->op_id);
    if (op == NULL || !op->is_load || op->events != 1) {
        violation(s, "n%d: SLOTS_RELEASED for op %llu without its outcome", i,
                  (unsigned long long)ev->op_id);
        return;
    }
    uint32_t n = 0;
    for (uint32_t b = 0; b < op->n; b++) {
        uint32_t slot = op->slots[b];
        if (op->block_status[b] != KVP_ERR_BUSY || s->ext_state[i][slot] != EXT_LENT)
            continue;
        n++;
        s->ext_taint[i][slot] |= ev->status != KVP_OK; /* the cap: a late WRITE may land */
        if (ev->status == KVP_OK)
            s->r->ext_released_proof++;
        else
            s->r->ext_released_cap++;
        ext_scribble(s, i, slot);
    }
    if (n != ev->n_keys)
        violation(s, "n%d: SLOTS_RELEASED op %llu names %u slots, %u were held", i,
                  (unsigned long long)ev->op_id, ev->n_keys, n);
}

/* Every check: the embedding's view is the node's (owned <-> not held, lent
 * <-> lent, published <-> published), and owned slots keep their pattern. */
static void ext_check(sim_t *s, int i)
{
    uint8_t held[SIM_SLOTS];
    static const uint8_t want[4] = {0, 1, 2, 2};
    if (kvp_slots_held(s->node[i], 0, SIM_SLOTS, held) != KVP_OK) {
        violation(s, "n%d: kvp_slots_held failed", i);
        return;
    }
    for (uint32_t k = 0; k < SIM_SLOTS; k++) {
        if (held[k] != want[s->ext_state[i][k]]) {
            violation(s, "n%d: slot %u: the embedding's view %u, the node holds it as %u", i, k,
                      s->ext_state[i][k], held[k]);
            return;
        }
        ext_check_pattern(s, i, k, "check");
    }
}

/* Before the final check: the embedding takes back what it published. */
static void ext_unpublish_all(sim_t *s)
{
    for (int i = 0; i < s->o.nodes; i++)
        for (uint32_t k = 0; k < SIM_SLOTS; k++)
            if (s->ext_state[i][k] == EXT_PUBLISHED) {
                uint8_t key[16];
                uint32_t kl = key_fmt(s->ext_key[i][k], key);
                kvp_status_t st = kvp_unpublish(s->node[i], key, kl, NULL);
                if (st != KVP_OK)
                    violation(s, "n%d: unpublish of slot %u at rest: %s", i, k,
                              kvp_status_str(st));
                else
                    ext_scribble(s, i, k);
            }
}

static void act_put(sim_t *s, int i)
{
    uint32_t k = (uint32_t)rnd(s, SIM_KEYS);
    uint8_t key[16];
    uint32_t kl = key_fmt(k, key);
    kvp_status_t st = sim_put(s, i, k, key, kl, 1 + rnd(s, 8));
    s->r->puts += st == KVP_OK;
    trace(s, "put n%d k%03u -> %s", i, k, kvp_status_str(st));
}

static void act_lookup(sim_t *s, int i, int j)
{
    sim_op_t *op = op_new(s);
    if (op == NULL)
        return;
    make_keys(s, op, 1 + (uint32_t)rnd(s, 8));
    op->node = i;
    op->peer = j;
    op->request = 1 + rnd(s, 8);
    kvp_status_t st = kvp_lookup(s->node[i], s->addr[j], op->request, op->keys, op->lens, op->n,
                                 op->results, &op->id);
    trace(s, "lookup n%d->n%d req %llu x%u -> %s", i, j, (unsigned long long)op->request, op->n,
          kvp_status_str(st));
    if (st != KVP_OK)
        op->used = false;
    else
        s->r->lookups++;
}

/* A completed lookup of node i with hits, to fetch against (the usual flow). */
static sim_op_t *pick_lookup(sim_t *s, int i)
{
    for (int k = op_scan_first(s, (int)rnd(s, SIM_OPS)); k >= 0; k = op_scan_next(s, k)) {
        sim_op_t *op = &s->ops[k];
        if (op->used && !op->is_load && op->node == i && op->events == 1)
            return op;
    }
    return NULL;
}

static void act_fetch(sim_t *s, int i, int j)
{
    sim_op_t *lk = rnd(s, 10) < 7 ? pick_lookup(s, i) : NULL;
    sim_op_t *op = op_new(s);
    if (op == NULL)
        return;
    make_keys(s, op, 1 + (uint32_t)rnd(s, 6));
    if (lk != NULL) { /* fetch the hits of that lookup, same request and peer */
        size_t off = 0, loff = 0;
        op->n = 0;
        for (uint32_t k = 0; k < lk->n; k++) {
            if (lk->results[k] == KVP_LOOKUP_HIT) {
                memcpy(op->keys + off, lk->keys + loff, lk->lens[k]);
                op->lens[op->n++] = lk->lens[k];
                off += lk->lens[k];
            }
            loff += lk->lens[k];
        }
        j = lk->peer;
        lk->used = false; /* one fetch per lookup */
        if (op->n == 0) {
            op->used = false;
            return;
        }
    }
    op->node = i;
    op->peer = j;
    op->is_load = true;
    op->request = lk ? lk->request : 1 + rnd(s, 8);
    uint32_t flags = !lk && rnd(s, 2) == 0 ? KVP_FETCH_FLAG_WAIT_FOR_SUPPLY : 0;
    kvp_status_t st = sim_fetch(s, i, j, op, flags);
    trace(s, "fetch n%d<-n%d req %llu x%u%s -> %s op %llu", i, j, (unsigned long long)op->request,
          op->n, flags ? " wait" : "", kvp_status_str(st), (unsigned long long)op->id);
    if (st != KVP_OK)
        op->used = false;
    else
        s->r->loads++;
}

static uint32_t key_index(const uint8_t *key, uint32_t len)
{
    char tmp[16];
    memcpy(tmp, key, KVP_MIN(len, 15u));
    tmp[KVP_MIN(len, 15u)] = '\0';
    return (uint32_t)atoi(tmp + 1);
}

/* A committed block must hold exactly the content of its key. */
static void verify_block(sim_t *s, int i, const uint8_t *key, uint32_t len, const char *what)
{
    uint32_t k = key_index(key, len);
    kvp_block_t b;
    if (s->corrupt[i][k] || kvp_get(s->node[i], key, len, &b) != KVP_OK)
        return;
    block_fill(k, s->blockbuf, s->cfg[i].block_size);
    bool ok = memcmp(b.data, s->blockbuf, s->cfg[i].block_size) == 0;
    kvp_release(s->node[i], &b);
    if (!ok)
        violation(s, "n%d: %s block k%03u has wrong content", i, what, k);
}

/* Flip a byte of a READY block behind the store's back (a bad DIMM, a stray
 * write): consumers must never commit it (checksums). */
static void act_corrupt(sim_t *s, int j)
{
    uint32_t k = (uint32_t)rnd(s, SIM_KEYS);
    uint8_t key[16];
    uint32_t kl = key_fmt(k, key);
    kvp_slot_ref_t ref;
    kvp_slot_state_t st;
    kvp_store_t *store = kvp__node_store(s->node[j]);
    if (kvp_store_probe(store, key, kl, &ref, &st) != KVP_OK || st != KVP_SLOT_READY)
        return;
    ((uint8_t *)kvp_store_slot_ptr(store, ref.slot))[rnd(s, 4096)] ^= 0x5a;
    s->corrupt[j][k] = true;
    trace(s, "corrupt n%d k%03u", j, k);
    /* Someone fetches it right away (supplied from the store at once). */
    int i = (int)((j + 1 + (int)rnd(s, (uint64_t)s->o.nodes - 1)) % s->o.nodes);
    sim_op_t *op = op_new(s);
    if (op == NULL)
        return;
    op->n = 1;
    op->lens[0] = kl;
    memcpy(op->keys, key, kl);
    op->node = i;
    op->peer = j;
    op->is_load = true;
    op->request = 200 + rnd(s, 8);
    if (sim_fetch(s, i, j, op, KVP_FETCH_FLAG_WAIT_FOR_SUPPLY) != KVP_OK)
        op->used = false;
}

static void act_script(sim_t *s, int i)
{
    kvp_fake_script_t sc;
    int kind = (int)rnd(s, 5);
    uint64_t d = (1 + rnd(s, 400)) * MS;
    switch (kind) {
    case 0:
        sc = rnd(s, 2) ? kvp_fake_script_wedge() : kvp_fake_script_wedge_then_copy(d);
        s->r->faults[SIM_F_WEDGE]++;
        break;
    case 1:
        /* Terminal only after its bytes landed: a transport reporting a
         * transfer terminal while its bytes are still on the way breaks the
         * transport contract (§6), which no node can defend against. The late
         * WRITE that outlives its session is the wedged-then-copying one. */
        sc = kvp_fake_script_late(d, d, KVP_OK);
        s->r->faults[SIM_F_LATE]++;
        break;
    case 2:
        sc = kvp_fake_script_fail(d / 2, (uint32_t)rnd(s, 3));
        s->r->faults[SIM_F_FAIL]++;
        break;
    case 3:
        sc = kvp_fake_script_fail_submit();
        s->r->faults[SIM_F_SUBMIT]++;
        break;
    default:
        sc = kvp_fake_script_complete(d);
        break;
    }
    kvp_fake_script_next(kvp__node_xport(s->node[i]), &sc);
    trace(s, "script n%d kind %d delay %llums", i, kind, (unsigned long long)(d / MS));
}

static void act_fault(sim_t *s, int i, int j)
{
    switch (rnd(s, 6)) {
    case 0:
        kvp_fake_net_kill(s->net, s->addr[i]);
        s->r->faults[SIM_F_KILL]++;
        trace(s, "kill n%d", i);
        break;
    case 1:
        node_stop(s, i);
        s->r->faults[SIM_F_RESTART]++;
        trace(s, "restart n%d", i);
        node_start(s, i);
        break;
    case 2:
        s->cut[i][j] = s->cut[j][i] = !s->cut[i][j];
        kvp_fake_net_partition(s->net, s->addr[i], s->addr[j], s->cut[i][j]);
        s->r->faults[SIM_F_PARTITION] += s->cut[i][j];
        trace(s, "%s n%d-n%d", s->cut[i][j] ? "partition" : "heal", i, j);
        break;
    case 3:
        kvp_peer_remove(s->node[i], s->addr[j]);
        kvp_peer_add(s->node[i], s->addr[j]);
        s->r->faults[SIM_F_GRACEFUL]++;
        trace(s, "graceful close n%d-n%d", i, j);
        break;
    case 4: {
        kvp_session_t *ss = kvp__node_find_session(s->node[i], s->addr[j]);
        if (ss != NULL) {
            kvp_fake_peer_set_error(kvp__node_xport(s->node[i]), ss->xpeer, KVP_ERR_TRANSPORT);
            s->r->faults[SIM_F_EP_ERROR]++;
            trace(s, "endpoint error n%d->n%d", i, j);
        }
        break;
    }
    default: {
        uint64_t req = 1 + rnd(s, 8);
        kvp_finish_request(s->node[i], req);
        s->r->faults[SIM_F_FINISH]++;
        trace(s, "finish n%d req %llu", i, (unsigned long long)req);
        break;
    }
    }
}

static void act_cancel(sim_t *s, int i)
{
    for (int k = op_scan_first(s, (int)rnd(s, SIM_OPS)); k >= 0; k = op_scan_next(s, k)) {
        sim_op_t *op = &s->ops[k];
        if (op->used && op->is_load && op->node == i && op->events == 0) {
            kvp_status_t st = kvp_cancel(s->node[i], op->id);
            s->r->faults[SIM_F_CANCEL]++;
            trace(s, "cancel n%d op %llu -> %s", i, (unsigned long long)op->id,
                  kvp_status_str(st));
            return;
        }
    }
}

static void advance(sim_t *s, uint64_t ns);
static void act_stale_frame(sim_t *s, int i, int j);

/* The race the whole project exists for: a WRITE is on its way when the
 * session dies. Source j's next transfer keeps running and lands its bytes
 * late; consumer i fetches; then i dies, j dies, or the session is closed. */
static bool act_race_fetch(sim_t *s, int i, int j, const char *what)
{
    sim_op_t *op = op_new(s);
    if (op == NULL)
        return false;
    op->n = 2;
    size_t off = 0;
    for (uint32_t b = 0; b < 2; b++) {
        uint32_t k = (uint32_t)rnd(s, SIM_KEYS);
        uint8_t key[16];
        op->lens[b] = key_fmt(k, key);
        memcpy(op->keys + off, key, op->lens[b]);
        off += op->lens[b];
        sim_put(s, j, k, key, op->lens[b], 0);
    }
    kvp_fake_script_t sc = kvp_fake_script_wedge_then_copy((20 + rnd(s, 300)) * MS);
    kvp_fake_script_next(kvp__node_xport(s->node[j]), &sc);
    op->node = i;
    op->peer = j;
    op->is_load = true;
    op->request = 100 + rnd(s, 8);
    kvp_status_t st = sim_fetch(s, i, j, op, KVP_FETCH_FLAG_WAIT_FOR_SUPPLY);
    trace(s, "%s n%d<-n%d -> %s op %llu", what, i, j, kvp_status_str(st),
          (unsigned long long)op->id);
    if (st != KVP_OK) {
        op->used = false;
        return false;
    }
    s->r->loads++;
    return true;
}

static void act_race(sim_t *s, int i, int j)
{
    if (!act_race_fetch(s, i, j, "race"))
        return;
    if (s->o.profile != SIM_PROFILE_V1 && rnd(s, 4) == 0)
        act_stale_frame(s, i, j); /* a late frame of a previous incarnation, meanwhile */
    advance(s, (1 + rnd(s, 5)) * MS);
    switch (rnd(s, 3)) {
    case 0:
        kvp_fake_net_kill(s->net, s->addr[i]);
        s->r->faults[SIM_F_KILL]++;
        break;
    case 1:
        kvp_fake_net_kill(s->net, s->addr[j]);
        s->r->faults[SIM_F_KILL]++;
        break;
    default:
        kvp_peer_remove(s->node[i], s->addr[j]);
        kvp_peer_add(s->node[i], s->addr[j]);
        s->r->faults[SIM_F_GRACEFUL]++;
        break;
    }
}

/* Issue 15's scenarios, given their own weights (profile v2). */

static void set_cut(sim_t *s, int i, int j, bool cut)
{
    if (s->cut[i][j] == cut)
        return;
    s->cut[i][j] = s->cut[j][i] = cut;
    kvp_fake_net_partition(s->net, s->addr[i], s->addr[j], cut);
    s->r->faults[SIM_F_PARTITION] += cut;
}

/* Seeds 7307, 4082, ...: consumer i's FETCH is held by a partition; i gives
 * up on the session (closes it, or declares j dead); the partition heals and
 * the held FETCH reaches j, which posts its WRITE (late copy) after i's fence. */
static void act_race_partition(sim_t *s, int i, int j)
{
    set_cut(s, i, j, true);
    act_race_fetch(s, i, j, "race-partition");
    s->r->faults[SIM_F_RACE_PARTITION]++;
    advance(s, (1 + rnd(s, 5)) * MS);
    if (rnd(s, 2) == 0) {
        kvp_peer_remove(s->node[i], s->addr[j]);
        kvp_peer_add(s->node[i], s->addr[j]);
        s->r->faults[SIM_F_GRACEFUL]++;
    } else {
        advance(s, (uint64_t)(s->cfg[i].dead_after_ms + rnd(s, 100)) * MS);
    }
    advance(s, rnd(s, 30) * MS);
    set_cut(s, i, j, false);
    trace(s, "race-partition n%d<-n%d healed", i, j);
}

/* Seed 3478: WAIT_FOR_SUPPLY demand parked on j; a partition; i declares j
 * dead (fence) while j still holds the session, then the key is committed
 * on j and the parked demand is served by a WRITE that copies late. */
static void act_parked_late(sim_t *s, int i, int j)
{
    sim_op_t *op = op_new(s);
    if (op == NULL)
        return;
    uint32_t k = (uint32_t)rnd(s, SIM_KEYS);
    uint8_t key[16];
    op->n = 1;
    op->lens[0] = key_fmt(k, key);
    memcpy(op->keys, key, op->lens[0]);
    op->node = i;
    op->peer = j;
    op->is_load = true;
    op->request = 300 + rnd(s, 8);
    kvp_status_t st = sim_fetch(s, i, j, op, KVP_FETCH_FLAG_WAIT_FOR_SUPPLY);
    trace(s, "parked-late n%d<-n%d k%03u -> %s op %llu", i, j, k, kvp_status_str(st),
          (unsigned long long)op->id);
    if (st != KVP_OK) {
        op->used = false;
        return;
    }
    s->r->loads++;
    s->r->faults[SIM_F_PARKED_LATE]++;
    advance(s, (2 + rnd(s, 5)) * MS);
    set_cut(s, i, j, true);
    advance(s, (uint64_t)(s->cfg[i].dead_after_ms + rnd(s, 60)) * MS);
    kvp_fake_script_t sc = kvp_fake_script_wedge_then_copy((20 + rnd(s, 200)) * MS);
    kvp_fake_script_next(kvp__node_xport(s->node[j]), &sc);
    sim_put(s, j, k, key, op->lens[0], 0);
    advance(s, rnd(s, 100) * MS);
    set_cut(s, i, j, false);
}

/* An endpoint error on i's endpoint to j while a WRITE from j runs and the
 * session is torn down (killed or closed) in the same instant. */
static void act_ep_error_teardown(sim_t *s, int i, int j)
{
    act_race_fetch(s, i, j, "ep-error-teardown");
    advance(s, (1 + rnd(s, 5)) * MS);
    kvp_session_t *ss = kvp__node_find_session(s->node[i], s->addr[j]);
    if (ss != NULL) {
        kvp_fake_peer_set_error(kvp__node_xport(s->node[i]), ss->xpeer, KVP_ERR_TRANSPORT);
        s->r->faults[SIM_F_EP_ERROR]++;
    }
    s->r->faults[SIM_F_EP_TEARDOWN]++;
    if (rnd(s, 2) == 0) {
        kvp_fake_net_kill(s->net, s->addr[rnd(s, 2) ? i : j]);
        s->r->faults[SIM_F_KILL]++;
    } else {
        kvp_peer_remove(s->node[i], s->addr[j]);
        kvp_peer_add(s->node[i], s->addr[j]);
        s->r->faults[SIM_F_GRACEFUL]++;
    }
}

/* A frame of another incarnation: j sends i a FETCH_DONE (failure) for one
 * of i's loads in flight, stamped with an epoch that is not the live one
 * (what a late frame of the previous session carries). It must be dropped
 * (I3); accepted, i would free the destinations while j's WRITE runs. */
static void act_stale_frame(sim_t *s, int i, int j)
{
    kvp_session_t *si = kvp__node_find_session(s->node[i], s->addr[j]);
    kvp_session_t *sj = kvp__node_find_session(s->node[j], s->addr[i]);
    if (si == NULL || sj == NULL || !kvp__session_open(sj) || kvp_list_empty(&si->loads))
        return;
    const kvp_load_t *l = KVP_CONTAINER_OF(si->loads.next, kvp_load_t, link);
    kvp_fetch_block_t blocks[64];
    uint32_t nb = 0;
    for (uint32_t b = 0; b < l->n && nb < 64; b++)
        if (l->blocks[b].reserved)
            blocks[nb++] = (kvp_fetch_block_t){0};
    kvp_epoch_t stale;
    for (size_t b = 0; b < sizeof(stale.b); b++)
        stale.b[b] = (uint8_t)(1 + rnd(s, 255)); /* non-zero, from the seed */
    kvp_msg_t m = {.type = KVP_MSG_FETCH_DONE};
    m.u.fetch_done = (kvp_msg_fetch_done_t){l->request_id, l->round, KVP_ERR_TRANSPORT, nb, blocks};
    kvp_status_t st = kvp_link_send_epochs(sj->link, &m, &stale, kvp_link_remote_epoch(sj->link));
    s->r->faults[SIM_F_STALE_FRAME] += st == KVP_OK;
    trace(s, "stale FETCH_DONE n%d->n%d round %llu -> %s", j, i, (unsigned long long)l->round,
          kvp_status_str(st));
}

/* An engine reads a block of node i: what it is served must be the key's
 * content (a suspect slot is re-verified on acquire). */
static void act_read(sim_t *s, int i)
{
    uint8_t key[16];
    uint32_t kl = key_fmt((uint32_t)rnd(s, SIM_KEYS), key);
    verify_block(s, i, key, kl, "read");
}

/* Local puts on node i until no clean FREE slot is left, so that its next
 * remote load takes the suspect ones (clean slots are handed out first). */
static void fill_clean_slots(sim_t *s, int i, uint32_t skip)
{
    kvp_store_t *store = kvp__node_store(s->node[i]);
    for (uint32_t k = 0; k < SIM_KEYS; k++) {
        kvp_store_stats_t ss;
        kvp_store_get_stats(store, &ss);
        if (ss.slots[KVP_SLOT_FREE] <= ss.suspect)
            return;
        if (k == skip || k == skip + 1)
            continue;
        uint8_t key[16];
        uint32_t kl = key_fmt(k, key);
        block_fill(k, s->blockbuf, s->cfg[i].block_size);
        kvp_put(s->node[i], key, kl, s->blockbuf, s->cfg[i].block_size, 0);
    }
}

/* SPEC §7.4: a WRITE that lands after the hold cap. Consumer i on a path
 * that cannot be fenced fetches from j, whose transfer copies only after
 * the cap; j's connections die, i quarantines; the cap releases the slots
 * (suspect); i loads the same keys from k into them and commits; the late
 * copy lands; the blocks are read. Served, they must be the right ones. */
static void act_past_cap(sim_t *s, int j, int k)
{
    int i = 2; /* node 2's paths cannot be fenced (node_cfg) */
    if (j == i || k == i || j == k || s->o.external) /* external: no suspect slots */
        return;
    uint32_t key0 = (uint32_t)rnd(s, SIM_KEYS - 1);
    for (uint32_t b = 0; b < 2; b++) {
        uint8_t key[16];
        uint32_t kl = key_fmt(key0 + b, key);
        block_fill(key0 + b, s->blockbuf, s->cfg[j].block_size);
        kvp_put(s->node[j], key, kl, s->blockbuf, s->cfg[j].block_size, 0);
        kvp_put(s->node[k], key, kl, s->blockbuf, s->cfg[k].block_size, 0);
    }
    uint64_t cap = (uint64_t)s->cfg[i].hold_cap_ms * MS;
    kvp_fake_script_t sc = kvp_fake_script_wedge_then_copy(cap + (300 + rnd(s, 400)) * MS);
    kvp_fake_scripts_clear(kvp__node_xport(s->node[j])); /* this one applies to our fetch */
    kvp_fake_script_next(kvp__node_xport(s->node[j]), &sc);
    int loads = 0;
    for (int round = 0; round < 2; round++) {
        sim_op_t *op = op_new(s);
        if (op == NULL)
            return;
        op->n = 2;
        op->lens[0] = key_fmt(key0, op->keys);
        op->lens[1] = key_fmt(key0 + 1, op->keys + 4);
        op->node = i;
        op->peer = round == 0 ? j : k;
        op->is_load = true;
        op->request = 400 + rnd(s, 8);
        kvp_status_t st = kvp_fetch(s->node[i], s->addr[op->peer], op->request, op->keys, op->lens,
                                    2, KVP_FETCH_FLAG_WAIT_FOR_SUPPLY, op->block_status, &op->id);
        trace(s, "past-cap n%d<-n%d k%03u -> %s op %llu", i, op->peer, key0, kvp_status_str(st),
              (unsigned long long)op->id);
        if (st != KVP_OK) {
            op->used = false;
            return;
        }
        s->r->loads++;
        loads++;
        if (round == 0) {
            advance(s, (3 + rnd(s, 3)) * MS);
            kvp_fake_net_kill(s->net, s->addr[j]);
            s->r->faults[SIM_F_KILL]++;
            s->r->faults[SIM_F_PAST_CAP]++;
            advance(s, cap + (260 + rnd(s, 20)) * MS); /* the cap and one hold check */
            fill_clean_slots(s, i, key0);
        }
    }
    advance(s, 700 * MS); /* the reload commits; the late copy lands */
    for (uint32_t b = 0; b < 2; b++) {
        uint8_t key[16];
        uint32_t kl = key_fmt(key0 + b, key);
        verify_block(s, i, key, kl, "read after a late write");
    }
}

/* -------------------------------------------------------------- time */

static void collect(sim_t *s)
{
    kvp_event_t ev[64];
    for (int i = 0; i < s->o.nodes; i++) {
        uint32_t got;
        if (s->node[i] == NULL || s->node[i]->ev_count == 0) /* owner thread: no lock needed */
            continue;
        do {
            got = 0;
            kvp_poll_events(s->node[i], ev, 64, &got);
            for (uint32_t e = 0; e < got; e++) {
                s->r->trace_hash = kvp_hash64(&ev[e].type, sizeof(ev[e].type) * 2 + 8,
                                              s->r->trace_hash) ^ (uint64_t)ev[e].op_id;
                uint64_t now = kvp_clock_now(&s->mc.clock);
                s->r->digest = kvp_hash64(&ev[e], offsetof(kvp_event_t, n_held), s->r->digest);
                s->r->digest = kvp_hash64(ev[e].peer, strnlen(ev[e].peer, sizeof(ev[e].peer)),
                                          s->r->digest ^ now);
                if (s->o.external &&
                    (ev[e].type == KVP_EV_SLOTS_RELEASED || ev[e].type == KVP_EV_SLOT_FREE))
                    ext_on_release(s, i, &ev[e]);
                if (s->o.external && ev[e].type == KVP_EV_WANTED)
                    ext_on_wanted(s, i, &ev[e]);
                if (ev[e].type != KVP_EV_LOOKUP && ev[e].type != KVP_EV_LOAD)
                    continue;
                sim_op_t *op = op_find(s, i, ev[e].op_id);
                if (op == NULL) {
                    violation(s, "n%d: event for unknown op %llu", i,
                              (unsigned long long)ev[e].op_id);
                    continue;
                }
                if (++op->events > 1) /* I4 */
                    violation(s, "n%d: op %llu has %u outcomes", i,
                              (unsigned long long)op->id, op->events);
                if (op->is_load && ev[e].status == KVP_OK)
                    s->r->loads_ok++;
                if (!op->is_load && s->o.external)
                    ext_check_hits(s, i, op);
                if (op->is_load && s->o.external)
                    ext_on_load(s, i, op, &ev[e]);
                else if (op->is_load) {
                    size_t off = 0;
                    for (uint32_t b = 0; b < op->n; off += op->lens[b], b++)
                        if (op->block_status[b] == KVP_OK)
                            verify_block(s, i, op->keys + off, op->lens[b], "fetched");
                }
            }
        } while (got == 64);
    }
}

/* Would a poll round of node n change anything now? A round runs commands,
 * progresses the transport and polls what it reports, checks endpoints,
 * polls retired transfers, sends queued lookups/fetches and fires due
 * timers (the fake network delivers through timers too). When none of
 * those has work the round is a no-op and is skipped: the run stays the
 * same bit for bit (opts.exact runs every round; test_sim compares). */
/* Work a round would do at once, whatever the clock says. */
static bool node_has_work(const kvp_node_t *n)
{
    if (!kvp_list_empty(&n->flushq) || !kvp_list_empty(&n->cmds) ||
        n->xport->ep_failures != n->ep_failures_seen)
        return true;
    for (const kvp_list_t *p = n->active.next; p != &n->active; p = p->next)
        if (KVP_SESSION_OF(p, active_link)->xfers_inflight == 0)
            return true; /* the round takes it off the active list */
    return false;
}

static bool node_due(sim_t *s, kvp_node_t *n, uint64_t now, int *fake_quiet)
{
    if (kvp_loop_next_deadline(n->loop) <= now || node_has_work(n))
        return true;
    if (*fake_quiet < 0) /* asked once per pass, only if needed */
        *fake_quiet = kvp_fake_fabric_quiet_until(s->fab) > now;
    return !*fake_quiet && kvp_fake_quiet_until(n->xport) <= now;
}

/* The earliest time at which a tick can do anything: a node's timer (the
 * fake network delivers through timers too: every chunk that can be
 * delivered has its end's timer armed no later than its arrival), a fake
 * transfer event or report, work already queued, events to collect. Ticks
 * before it are no-ops and are skipped (the clock still moves by them). */
static uint64_t next_wake(sim_t *s)
{
    uint64_t t = kvp_fake_fabric_quiet_until(s->fab);
    for (int i = 0; i < s->o.nodes; i++) {
        kvp_node_t *n = s->node[i];
        if (n == NULL)
            continue;
        if (n->ev_count > 0 || node_has_work(n))
            return 0;
        t = KVP_MIN(t, kvp_loop_next_deadline(n->loop));
    }
    return t;
}

static void tick(sim_t *s, uint64_t ns)
{
    kvp_manual_clock_advance(&s->mc, ns);
    uint64_t now = kvp_clock_now(&s->mc.clock);
    for (int pass = 0; pass < 2; pass++) {
        kvp_fake_net_deliver(s->net);
        kvp_fake_fabric_progress(s->fab);
        int fake_quiet = -1;
        for (int i = 0; i < s->o.nodes; i++) {
            if (s->node[i] == NULL || (!s->o.exact && !node_due(s, s->node[i], now, &fake_quiet)))
                continue;
            kvp_node_progress(s->node[i], 0);
            s->r->rounds++;
        }
    }
    collect(s);
}

static void advance(sim_t *s, uint64_t ns)
{
    uint64_t wake = 0;
    while (ns > 0) {
        uint64_t d = KVP_MIN(ns, 2 * MS);
        if (!s->o.exact && wake > kvp_clock_now(&s->mc.clock) + d) {
            kvp_manual_clock_advance(&s->mc, d); /* nothing due in this tick */
        } else {
            tick(s, d);
            wake = s->o.exact ? 0 : next_wake(s);
        }
        ns -= d;
    }
}

/* ---------------------------------------------------------- invariants */

static void check(sim_t *s, bool final)
{
    const kvp_fake_violation_t *v;
    size_t nv = kvp_fake_violations(s->fab, &v);
    /* A copy into a node that shut down (its bounded drain over, slots
     * released with error logs, SPEC §7.6) lands nowhere: the fake skips it.
     * Not a handover of live memory; every other kind is a violation. */
    size_t real = 0;
    for (size_t k = 0; k < nv; k++) {
        if (v[k].kind == KVP_FAKE_V_DST_CLOSED)
            continue;
        if (landing_after_cap(s, &v[k])) {
            s->r->post_cap_landings++;
            continue;
        }
        v = &v[k], real++, k = nv;
    }
    if (real == 0 && nv > 0)
        kvp_fake_violations_clear(s->fab);
    if (real > 0) { /* I1/I2 */
        violation(s, "landing checker: %s xfer %llu src %u dst %u (gen %u, now %u, state %s)",
                  kvp_fake_violation_kind_str(v[0].kind), (unsigned long long)v[0].xfer,
                  v[0].src_slot, v[0].dst_slot, v[0].expected_gen, v[0].actual_gen,
                  kvp_slot_state_str(v[0].actual_state));
        kvp_fake_violations_clear(s->fab);
    }
    if (s->unknown_completions > 0) { /* I3 */
        violation(s, "a completion of another incarnation reached a live session");
        s->unknown_completions = 0;
    }
    uint64_t cap = (uint64_t)s->cfg[0].hold_cap_ms * MS + 300 * MS;
    for (int i = 0; i < s->o.nodes; i++) {
        if (s->node[i] == NULL)
            continue;
        kvp_node_t *n = s->node[i];
        kvp_store_t *store = kvp__node_store(n);
        kvp_store_stats_t ss;
        kvp_store_get_stats(store, &ss);
        /* The full validator runs whenever the store changed: every store
         * operation moves one of its counters (reserve, commit, abandon,
         * quarantine, release, eviction, pins, lookups, slot states). */
        if (final || store != s->checked_store[i] ||
            memcmp(&ss, &s->checked_stats[i], sizeof(ss)) != 0) {
            char why[256];
            if (kvp_store_check(store, why, sizeof(why)) != KVP_OK)
                violation(s, "n%d store invalid: %s", i, why);
            s->checked_store[i] = store;
            s->checked_stats[i] = ss;
            s->r->store_checks++;
        }
        /* I5, bounded in time: what kvp_node_held reports as retained
         * transfers and quarantined slots, read in place. */
        uint64_t now = kvp_clock_now(&s->mc.clock);
        for (kvp_list_t *p = n->env.retained.next; p != &n->env.retained; p = p->next) {
            const kvp_xfer_t *x = KVP_CONTAINER_OF(p, kvp_xfer_t, link);
            if ((now - x->retained_ns) / MS * MS > cap) /* whole ms, as kvp_node_held */
                violation(s, "n%d holds transfer %llu for %llu ms (cap %u)", i,
                          (unsigned long long)x->id,
                          (unsigned long long)((now - x->retained_ns) / MS), s->cfg[0].hold_cap_ms);
        }
        for (kvp_list_t *p = n->env.quarantined.next; p != &n->env.quarantined; p = p->next) {
            const kvp_load_t *l = KVP_CONTAINER_OF(p, kvp_load_t, link);
            for (uint32_t b = 0; b < l->n && (now - l->quarantined_ns) / MS * MS > cap; b++)
                if (l->blocks[b].reserved)
                    violation(s, "n%d holds slot %u for %llu ms (cap %u)", i,
                              l->blocks[b].dst.slot,
                              (unsigned long long)((now - l->quarantined_ns) / MS),
                              s->cfg[0].hold_cap_ms);
        }
        if (s->o.external)
            ext_check(s, i);
        if (!final)
            continue;
        for (uint32_t k = 0; k < SIM_SLOTS && s->o.external; k++)
            if (s->ext_state[i][k] != EXT_OWNED) { /* its slots never leak */
                violation(s, "n%d after quiesce: slot %u is not the embedding's (%u)", i, k,
                          s->ext_state[i][k]);
                break;
            }
        kvp_stats_t st;
        kvp_node_stats(s->node[i], &st);
        if (st.pins || st.slots_filling || st.slots_quarantined || st.retained_transfers)
            violation(s, "n%d after quiesce: pins %llu filling %llu quarantined %llu retained %llu",
                      i, (unsigned long long)st.pins, (unsigned long long)st.slots_filling,
                      (unsigned long long)st.slots_quarantined,
                      (unsigned long long)st.retained_transfers);
    }
    if (!final)
        return;
    for (int k = 0; k < s->ops_hi; k++) /* I4: exactly one outcome each */
        if (s->ops[k].used && s->ops[k].events != 1)
            violation(s, "n%d op %llu (%s) ended with %u outcomes", s->ops[k].node,
                      (unsigned long long)s->ops[k].id, s->ops[k].is_load ? "load" : "lookup",
                      s->ops[k].events);
}

/* Everything at rest: every operation has its outcome, no pin, no FILLING,
 * QUARANTINED or retained item, no round, load or lookup on any session, no
 * scripted copy or completion pending anywhere in the fabric. */
static bool at_rest(sim_t *s)
{
    for (int k = 0; k < s->ops_hi; k++)
        if (s->ops[k].used && s->ops[k].events != 1)
            return false;
    if (kvp_fake_fabric_next_event_ns(s->fab) != KVP_FAKE_NEVER ||
        kvp_fake_fabric_quiet_until(s->fab) != KVP_FAKE_NEVER)
        return false;
    for (int i = 0; i < s->o.nodes; i++) {
        kvp_node_t *n = s->node[i];
        if (n == NULL)
            continue;
        kvp_stats_t st;
        kvp_node_stats(n, &st);
        if (st.pins || st.slots_filling || st.slots_quarantined || st.retained_transfers ||
            !kvp_list_empty(&n->env.retained) || !kvp_list_empty(&n->env.quarantined) ||
            !kvp_list_empty(&n->env.waiting) || !kvp_list_empty(&n->active))
            return false;
        for (kvp_list_t *p = n->sessions.next; p != &n->sessions; p = p->next) {
            const kvp_session_t *ss = KVP_SESSION_OF(p, node_link);
            if (!kvp_list_empty(&ss->loads) || !kvp_list_empty(&ss->fetchq) ||
                !kvp_list_empty(&ss->srounds) || !kvp_list_empty(&ss->xfers) ||
                !kvp_list_empty(&ss->lookups_queued) || !kvp_list_empty(&ss->lookups_sent))
                return false;
        }
    }
    return true;
}

/* --------------------------------------------------------------- run */

static void step(sim_t *s)
{
    int i = (int)rnd(s, (uint64_t)s->o.nodes);
    int j = (int)((i + 1 + (int)rnd(s, (uint64_t)s->o.nodes - 1)) % s->o.nodes);
    uint64_t a = rnd(s, 100);
    if (s->o.external && rnd(s, 12) == 0)
        act_unpublish(s, i); /* balances publishing: ~1 in 4 puts' worth */
    if (s->o.profile == SIM_PROFILE_V1) { /* the generator of issue 7 */
        if (a < 30)
            act_put(s, i);
        else if (a < 50)
            act_lookup(s, i, j);
        else if (a < 72)
            act_fetch(s, i, j);
        else if (a < 84)
            act_script(s, j);
        else if (a < 88)
            act_cancel(s, i);
        else if (a < 92)
            act_fault(s, i, j);
        else if (a < 95)
            act_race(s, i, j);
        else
            act_corrupt(s, j);
    } else { /* v2: issue 15's scenarios get weights of their own */
        if (a < 29)
            act_put(s, i);
        else if (a < 48)
            act_lookup(s, i, j);
        else if (a < 68)
            act_fetch(s, i, j);
        else if (a < 79)
            act_script(s, j);
        else if (a < 82)
            act_cancel(s, i);
        else if (a < 86)
            act_fault(s, i, j);
        else if (a < 89)
            act_race(s, i, j);
        else if (a < 91)
            act_race_partition(s, i, j);
        else if (a < 93)
            act_parked_late(s, i, j);
        else if (a < 95)
            act_ep_error_teardown(s, i, j);
        else if (a < 96)
            act_stale_frame(s, i, j);
        else if (a < 97)
            rnd(s, 3) == 0 ? act_past_cap(s, i, j) : act_read(s, i);
        else
            act_corrupt(s, j);
    }
    advance(s, (1 + rnd(s, 20)) * MS);
    check(s, false);
}

static void sim_run_once(const sim_opts_t *o, sim_result_t *r, bool tracing);

/* Run without keeping a trace (formatting one line per action costs more
 * than the action); a seed that shows a violation runs again, bit for bit
 * the same, with the trace kept, to print its last actions. */
void sim_run(const sim_opts_t *o, sim_result_t *r)
{
    sim_run_once(o, r, o->verbose);
    if (r->violations && !o->verbose)
        sim_run_once(o, r, true);
}

static void sim_run_once(const sim_opts_t *o, sim_result_t *r, bool tracing)
{
    sim_t *s = sim_alloc();
    KVP_ASSERT(s != NULL);
    memset(r, 0, sizeof(*r));
    s->o = *o;
    s->r = r;
    s->tracing = tracing;
    s->o.nodes = KVP_MAX(3, KVP_MIN(o->nodes, SIM_MAX));
    kvp_rng_seed(&s->rng, o->seed);
    kvp_rng_seed(&s->random_bytes, o->seed ^ 0x72616e646f6d2d62ull /* "random-b" */);
    kvp__random_hook_arg = &s->random_bytes;
    kvp__random_hook = sim_random_bytes;
    kvp_manual_clock_init(&s->mc, KVP_NSEC_PER_SEC);
    kvp_log_set_sink(sim_log_sink, s);
    kvp_fake_fabric_create(&s->mc.clock, &s->fab);
    kvp_fake_net_create(200 * 1000, &s->net);
    s->blockbuf = malloc(4096);
    for (int i = 0; i < s->o.nodes; i++)
        node_cfg(s, i);
    for (int i = 0; i < s->o.nodes; i++)
        node_start(s, i);
    advance(s, 100 * MS);
    for (s->step = 0; s->step < o->steps && r->violations == 0; s->step++)
        step(s);
    /* Quiesce: heal, stop injecting, let every timeout and the hold cap pass. */
    for (int i = 0; i < s->o.nodes; i++)
        for (int j = 0; j < s->o.nodes; j++)
            if (s->cut[i][j]) {
                kvp_fake_net_partition(s->net, s->addr[i], s->addr[j], false);
                s->cut[i][j] = false;
            }
    for (int i = 0; i < s->o.nodes; i++)
        kvp_fake_script_next(kvp__node_xport(s->node[i]), &(kvp_fake_script_t){0});
    /* At most three hold caps and two load timeouts; the run stops as soon
     * as everything is at rest (nothing after that can move a slot, a pin or
     * a byte: only heartbeats run), unless opts.full_quiesce. */
    uint64_t quiesce = (uint64_t)(s->cfg[0].hold_cap_ms * 3 + s->cfg[0].load_timeout_ms * 2) * MS;
    for (uint64_t t = 0; t < quiesce; t += QUIESCE_STEP) {
        advance(s, KVP_MIN(QUIESCE_STEP, quiesce - t));
        if (!r->rest_ms && at_rest(s)) {
            r->rest_ms = (t + QUIESCE_STEP) / MS;
            if (!s->o.full_quiesce)
                break;
        }
    }
    if (s->o.external)
        ext_unpublish_all(s);
    check(s, true);
    for (int i = 0; i < s->o.nodes; i++) { /* the end state joins the replay hash */
        kvp_stats_t st;
        uint64_t calls[KVP_FAKE_CALL_KINDS];
        kvp_fake_counters_t fc;
        kvp_node_stats(s->node[i], &st);
        kvp_fake_get_counters(kvp__node_xport(s->node[i]), &fc);
        for (int k = 0; k < KVP_FAKE_CALL_KINDS; k++)
            calls[k] = kvp_fake_call_count(kvp__node_xport(s->node[i]), (kvp_fake_call_kind_t)k);
        /* Counters up to issue 29's copy counters: the digests of the modes
         * before it stay the same (they observe, they change no behaviour). */
        r->trace_hash = kvp_hash64(&st, offsetof(kvp_stats_t, bytes_copied_in), r->trace_hash);
        r->trace_hash = kvp_hash64(calls, sizeof(calls), r->trace_hash);
        r->trace_hash = kvp_hash64(&fc, sizeof(fc), r->trace_hash);
    }
    uint64_t sums[] = {r->trace_hash, r->violations, r->loads, r->loads_ok, r->lookups, r->puts,
                       r->rest_ms, r->posted_fenced, r->post_cap_landings,
                       (uint64_t)r->violation_step};
    r->digest = kvp_hash64(sums, sizeof(sums), r->digest);
    r->digest = kvp_hash64(r->faults, sizeof(r->faults), r->digest);
    r->digest = kvp_hash64(r->first_violation, strlen(r->first_violation), r->digest);
    for (int i = 0; i < s->o.nodes; i++)
        node_stop(s, i);
    kvp_fake_fabric_destroy(s->fab);
    kvp_fake_net_destroy(s->net);
    kvp_log_set_sink(NULL, NULL);
    kvp__random_hook = NULL;
    kvp__random_hook_arg = NULL;
    free(s->blockbuf);
    sim_free(s);
}
