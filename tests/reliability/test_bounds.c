/*
 * test_bounds.c -- the resource limits of SPEC §8 / §9 on the fake world
 * (tests/node/world.h): each limit the node implements is hit, the
 * documented behaviour is checked together with the metric that counts the
 * refusal (kvp_stats_t) and the WARN line that names the limit and the
 * peer, and the node recovers once the cause is gone. Each test names the
 * mutation (a config or code change that drops the limit) under which it
 * fails.
 */
#include "node/world.h"
#include "session/session_int.h" /* KVP_FETCHQ_MAX */

#define MS KVP_NSEC_PER_MSEC

/* --------------------------------------------------------- log capture */

/* Every WARN/ERROR line since log_start(), "[prefix] line", so that a test
 * can assert that a refusal named its limit and its peer. */
#define LOG_LINES 2048
static struct {
    char line[LOG_LINES][320];
    uint32_t n;
} g_log;

static void log_sink(kvp_log_level_t level, const char *prefix, const char *line, void *arg)
{
    (void)arg;
    if (level > KVP_LOG_WARN)
        return;
    snprintf(g_log.line[g_log.n % LOG_LINES], sizeof(g_log.line[0]), "[%s] %s",
             prefix ? prefix : "-", line);
    g_log.n++;
    if (getenv("KVPEER_TEST_VERBOSE"))
        fprintf(stderr, "  [log %d] [%s] %s\n", (int)level, prefix ? prefix : "-", line);
}

static void log_start(void)
{
    memset(&g_log, 0, sizeof(g_log));
    kvp_log_set_level(KVP_LOG_WARN);
    kvp_log_set_sink(log_sink, NULL);
}

static void log_stop(void)
{
    kvp_log_set_sink(NULL, NULL);
    kvp_log_set_level(KVP_LOG_ERROR);
}

/* Lines since log_start() that contain both a and b. */
static uint32_t log_count(const char *a, const char *b)
{
    uint32_t c = 0, first = g_log.n > LOG_LINES ? g_log.n - LOG_LINES : 0;
    for (uint32_t i = first; i < g_log.n; i++) {
        const char *l = g_log.line[i % LOG_LINES];
        c += strstr(l, a) != NULL && strstr(l, b) != NULL;
    }
    return c;
}

static uint64_t do_lookup(world_t *w, int i, int j, uint64_t req, const wkeys_t *ks,
                          uint8_t *res)
{
    uint64_t op = 0;
    assert_int_equal(kvp_lookup(w->node[i], w->addr[j], req, ks->buf, ks->len, ks->n, res, &op),
                     KVP_OK);
    return op;
}

static kvp_status_t try_fetch(world_t *w, int i, int j, uint64_t req, const wkeys_t *ks,
                              uint64_t *op)
{
    return kvp_fetch(w->node[i], w->addr[j], req, ks->buf, ks->len, ks->n, 0, NULL, op);
}

/* Lookup of keys k0.. from j on i; returns the number of hits. */
static uint32_t lookup_hits(world_t *w, int i, int j, uint64_t req, uint32_t k0, uint32_t n)
{
    wkeys_t ks;
    uint8_t res[64];
    wkeys_make(&ks, k0, n);
    uint64_t op = do_lookup(w, i, j, req, &ks, res);
    const kvp_event_t *e = world_wait(w, i, KVP_EV_LOOKUP, op, 200 * MS);
    assert_non_null(e);
    /* a refusal at a limit (issue 27) keeps the hits that were granted */
    return e->status == KVP_OK || e->status == KVP_ERR_LIMIT ? e->n_ok : 0;
}

/* Lookup + fetch; returns the load's status (waits at most max_ns). */
static kvp_status_t lookup_fetch(world_t *w, int i, int j, uint64_t req, uint32_t k0,
                                 uint32_t n, uint64_t max_ns)
{
    assert_int_equal(lookup_hits(w, i, j, req, k0, n), n);
    wkeys_t ks;
    uint64_t op = 0;
    wkeys_make(&ks, k0, n);
    assert_int_equal(try_fetch(w, i, j, req, &ks, &op), KVP_OK);
    const kvp_event_t *e = world_wait(w, i, KVP_EV_LOAD, op, max_ns);
    assert_non_null(e);
    return (kvp_status_t)e->status;
}

static uint32_t g_limit;

/* ---------------------------------------------------------- max_sessions */

static void tweak_sessions(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    if (i == 0)
        c->max_sessions = g_limit;
}

/* SPEC §8 "max sessions: refuse more, cleanly" (F20). Node 0 takes one
 * session; a second peer is refused at the handshake (ctl refused_limit,
 * sessions_refused, a WARN naming max_sessions and the peer), the first
 * session is untouched, and the refused peer gets in once the first leaves.
 * Mutations: max_sessions = 2 -> the second peer gets in; sessions_refused
 * not filled in by kvp_node_stats -> the metric assert fails. */
static void test_max_sessions_refuses_cleanly(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    g_limit = 1;
    world_init(w, 3, tweak_sessions);
    world_connect(w, 1, 0);
    log_start();
    kvp_stats_t before = world_stats(w, 0);
    assert_int_equal(kvp_peer_add(w->node[2], w->addr[0]), KVP_OK);
    world_run(w, 1000 * MS);
    assert_true(world_peer_ready(w, 1, 0));
    assert_false(world_peer_ready(w, 2, 0));
    assert_false(world_peer_ready(w, 0, 2));
    kvp_stats_t after = world_stats(w, 0);
    assert_int_equal(after.sessions_ready, 1);
    /* metric and log: node 2 redials with backoff, each dial refused */
    assert_true(after.sessions_refused > before.sessions_refused);
    assert_true(log_count("max_sessions", w->addr[2]) >= 1);
    assert_int_equal(log_count("max_sessions", w->addr[1]), 0);
    log_stop();
    kvp_ctl_stats_t cs;
    kvp_ctl_get_stats(w->node[0]->ctl, &cs);
    assert_true(cs.refused_limit >= 1);
    assert_int_equal(cs.blobs_out, 1); /* the refused peer never got our blob */
    /* the existing session still serves */
    world_put(w, 0, 1, 0);
    assert_int_equal(lookup_fetch(w, 1, 0, 5, 1, 1, 200 * MS), KVP_OK);
    /* recovery: node 1 leaves gracefully, node 2's redial gets in */
    assert_int_equal(kvp_peer_remove(w->node[1], w->addr[0]), KVP_OK);
    uint64_t end = kvp_clock_now(&w->mc.clock) + 2 * KVP_NSEC_PER_SEC;
    while (!world_peer_ready(w, 2, 0) && kvp_clock_now(&w->mc.clock) < end)
        world_step(w);
    assert_true(world_peer_ready(w, 2, 0));
    world_fini(w, false);
    free(w);
}

/* -------------------------------------------------------------- max_pins */

static void tweak_pins(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    if (i == 0)
        c->max_pins = g_limit;
}

/* SPEC §9 "caps on pinned bytes" (F20): with max_pins = 4 a LOOKUP of 8
 * READY keys pins 4 and answers the rest MISS (pins_refused +4, one WARN
 * naming max_pins and the peer); a local acquire is refused with
 * KVP_ERR_LIMIT (+1, a WARN for the local reader); finishing the request
 * returns the pins. Mutations: max_pins = 64 -> 8 hits; no log line in the
 * LOOKUP path -> the log assert fails. */
static void test_max_pins_lookup_answers_miss(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    g_limit = 4;
    world_init(w, 2, tweak_pins);
    world_connect(w, 1, 0);
    for (uint32_t k = 0; k < 8; k++)
        world_put(w, 0, k, 0);
    log_start();
    kvp_stats_t before = world_stats(w, 0);
    assert_int_equal(lookup_hits(w, 1, 0, 3, 0, 8), 4);
    kvp_stats_t after = world_stats(w, 0);
    assert_int_equal(after.pins, 4);
    assert_int_equal(after.pins_refused - before.pins_refused, 4);
    assert_int_equal(log_count("max_pins", w->addr[1]), 1); /* one line per LOOKUP */
    kvp_store_stats_t ss;
    kvp_store_get_stats(kvp__node_store(w->node[0]), &ss);
    assert_true(ss.pin_limit_refusals >= 4);
    uint8_t key[32];
    uint32_t kl = world_key(7, key);
    kvp_block_t b;
    assert_int_equal(kvp_get(w->node[0], key, kl, &b), KVP_ERR_LIMIT);
    assert_int_equal(world_stats(w, 0).pins_refused - after.pins_refused, 1);
    assert_int_equal(log_count("max_pins", "local reader"), 1);
    log_stop();
    assert_int_equal(kvp_finish_request(w->node[1], 3), KVP_OK);
    world_run(w, 20 * MS);
    assert_int_equal(world_stats(w, 0).pins, 0);
    assert_int_equal(kvp_get(w->node[0], key, kl, &b), KVP_OK);
    assert_int_equal(kvp_release(w->node[0], &b), KVP_OK);
    world_fini(w, false);
    free(w);
}

/* --------------------------------------------- max_inflight_bytes_per_peer */

static void tweak_inflight(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    (void)s;
    if (i == 1)
        c->max_inflight_bytes_per_peer = (uint64_t)g_limit * c->block_size;
}

/* Node 1 fetches from node 0 with a budget of two blocks in flight; node 0
 * holds keys 0..nkeys-1. */
static world_t *inflight_world(void **state, uint32_t nkeys)
{
    world_t *w = *state = malloc(sizeof(world_t));
    g_limit = 2;
    world_init(w, 2, tweak_inflight);
    world_connect(w, 1, 0);
    for (uint32_t k = 0; k < nkeys; k++)
        world_put(w, 0, k, 0);
    return w;
}

static uint64_t peer_bytes_inflight(world_t *w, int i)
{
    kvp_peer_info_t pi[4];
    uint32_t np = 0;
    assert_int_equal(kvp_node_peers(w->node[i], pi, 4, &np), KVP_OK);
    assert_int_equal(np, 1);
    return pi[0].bytes_inflight;
}

/* Node 1 looks keys k0..k0+n-1 up on node 0 (request req) and fetches them;
 * the next transfer of node 0 follows `sc` if given. */
static uint64_t start_fetch(world_t *w, uint64_t req, uint32_t k0, uint32_t n,
                            kvp_fake_script_t *sc)
{
    assert_int_equal(lookup_hits(w, 1, 0, req, k0, n), n);
    if (sc != NULL)
        assert_int_equal(kvp_fake_script_next(kvp__node_xport(w->node[0]), sc), KVP_OK);
    wkeys_t ks;
    uint64_t op = 0;
    wkeys_make(&ks, k0, n);
    assert_int_equal(try_fetch(w, 1, 0, req, &ks, &op), KVP_OK);
    return op;
}

/* SPEC §8 "max bytes in flight per peer: further fetches queue, then MISS".
 * Budget 2 blocks: A (2 blocks, a slow transfer) fills it; B (1 block) is
 * accepted but queued -- nothing reserved, no FETCH sent, counted in
 * fetches_queued; when A completes B starts and completes OK, after A.
 * Mutation: no queue (the old "refuse at once") -> kvp_fetch returns LIMIT;
 * B started without budget -> bytes in flight exceed the budget. */
static void test_inflight_queued_fetch_starts_when_budget_frees(void **state)
{
    world_t *w = inflight_world(state, 3);
    kvp_fake_script_t slow = kvp_fake_script_complete(300 * MS);
    uint64_t a = start_fetch(w, 9, 0, 2, &slow);
    world_run(w, 20 * MS);
    assert_int_equal(peer_bytes_inflight(w, 1), 2ull * w->cfg[1].block_size);
    kvp_stats_t before = world_stats(w, 1), src0 = world_stats(w, 0);
    uint64_t b = start_fetch(w, 10, 2, 1, NULL);
    world_run(w, 50 * MS);
    kvp_stats_t mid = world_stats(w, 1);
    assert_int_equal(mid.fetches_queued - before.fetches_queued, 1);
    assert_int_equal(mid.slots_filling, before.slots_filling); /* nothing reserved */
    assert_int_equal(peer_bytes_inflight(w, 1), 2ull * w->cfg[1].block_size);
    assert_int_equal(world_stats(w, 0).transfers_done, src0.transfers_done);
    assert_null(world_event(w, 1, KVP_EV_LOAD, b));
    const kvp_event_t *ea = world_wait(w, 1, KVP_EV_LOAD, a, 1000 * MS);
    assert_non_null(ea);
    assert_int_equal(ea->status, KVP_OK);
    assert_null(world_event(w, 1, KVP_EV_LOAD, b)); /* B starts only now */
    const kvp_event_t *eb = world_wait(w, 1, KVP_EV_LOAD, b, 500 * MS);
    assert_non_null(eb);
    assert_int_equal(eb->status, KVP_OK);
    assert_int_equal(world_event_count(w, 1, KVP_EV_LOAD, b), 1);
    assert_true(world_verify(w, 1, 2));
    kvp_stats_t after = world_stats(w, 1);
    assert_int_equal(after.fetches_ok - before.fetches_ok, 2);
    assert_int_equal(after.fetches_refused_inflight, before.fetches_refused_inflight);
    assert_int_equal(peer_bytes_inflight(w, 1), 0);
    world_fini(w, false);
    free(w);
}

/* A queued fetch that waits longer than half the load timeout fails with
 * KVP_ERR_LIMIT (one LOAD event, fetches_refused_inflight, a WARN naming
 * max_inflight_bytes_per_peer and the peer) while the load ahead of it is
 * still in flight, and that load is not disturbed. A fetch larger than the
 * whole budget is refused at once (no event).
 * Mutations: no queue wait bound -> B has no event until A completes;
 * counter increment removed -> the metric assert fails. */
static void test_inflight_queued_fetch_times_out_with_limit(void **state)
{
    world_t *w = inflight_world(state, 3);
    log_start();
    kvp_fake_script_t slow = kvp_fake_script_complete(800 * MS); /* < load timeout */
    uint64_t a = start_fetch(w, 9, 0, 2, &slow);
    world_run(w, 10 * MS);
    kvp_stats_t before = world_stats(w, 1);
    uint64_t b = start_fetch(w, 10, 2, 1, NULL);
    uint64_t t0 = kvp_clock_now(&w->mc.clock);
    const kvp_event_t *eb = world_wait(w, 1, KVP_EV_LOAD, b, 1000 * MS);
    assert_non_null(eb);
    assert_int_equal(eb->status, KVP_ERR_LIMIT);
    uint64_t waited = kvp_clock_now(&w->mc.clock) - t0;
    uint64_t bound = (uint64_t)w->cfg[1].load_timeout_ms * MS / 2;
    assert_true(waited >= bound && waited <= bound + 20 * MS);
    assert_null(world_event(w, 1, KVP_EV_LOAD, a)); /* A still in flight */
    kvp_stats_t after = world_stats(w, 1);
    assert_int_equal(after.fetches_refused_inflight - before.fetches_refused_inflight, 1);
    assert_int_equal(after.fetches_failed - before.fetches_failed, 1);
    assert_int_equal(after.slots_filling, before.slots_filling);
    assert_int_equal(log_count("max_inflight_bytes_per_peer", w->addr[0]), 1);
    /* larger than the whole budget: refused at once, no event */
    wkeys_t ks;
    uint64_t big = 0;
    wkeys_make(&ks, 0, 3);
    assert_int_equal(try_fetch(w, 1, 0, 11, &ks, &big), KVP_ERR_LIMIT);
    assert_int_equal(world_stats(w, 1).fetches_refused_inflight - before.fetches_refused_inflight, 2);
    assert_int_equal(log_count("max_inflight_bytes_per_peer", "larger than"), 1);
    log_stop();
    const kvp_event_t *ea = world_wait(w, 1, KVP_EV_LOAD, a, 1000 * MS);
    assert_non_null(ea);
    assert_int_equal(ea->status, KVP_OK);
    assert_int_equal(world_event_count(w, 1, KVP_EV_LOAD, b), 1);
    assert_int_equal(world_event_count(w, 1, KVP_EV_LOAD, 0), 2);
    world_fini(w, false);
    free(w);
}

/* Queued fetches get exactly one outcome whatever ends them, and never hold
 * a slot: kvp_cancel -> CANCELED at once; kvp_finish_request -> CANCELED;
 * the source dies -> UNREACHABLE (with the load in flight); the queue bound
 * (KVP_FETCHQ_MAX) refuses at once; fetches still queued at node shutdown
 * are failed there (leak check of world_fini).
 * Mutations: cancel / finish / teardown not walking the queue -> no event
 * (or a leak); no queue bound -> the 1025th fetch is accepted. */
static void test_inflight_queued_fetch_one_outcome(void **state)
{
    world_t *w = inflight_world(state, 6);
    kvp_fake_script_t slow = kvp_fake_script_complete(900 * MS);
    uint64_t a = start_fetch(w, 9, 0, 2, &slow);
    world_run(w, 10 * MS);
    uint64_t b1 = start_fetch(w, 20, 2, 1, NULL);
    uint64_t b2 = start_fetch(w, 21, 3, 1, NULL);
    uint64_t b3 = start_fetch(w, 22, 4, 1, NULL);
    kvp_stats_t st = world_stats(w, 1);
    assert_int_equal(st.fetches_queued, 3);
    assert_int_equal(st.slots_filling, 2); /* A's only */
    assert_int_equal(kvp_cancel(w->node[1], b1), KVP_OK);
    world_collect(w);
    const kvp_event_t *e = world_event(w, 1, KVP_EV_LOAD, b1);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_CANCELED);
    assert_int_equal(kvp_cancel(w->node[1], b1), KVP_ERR_NOT_FOUND); /* decided */
    assert_int_equal(kvp_finish_request(w->node[1], 21), KVP_OK);
    world_collect(w);
    assert_non_null(e = world_event(w, 1, KVP_EV_LOAD, b2));
    assert_int_equal(e->status, KVP_ERR_CANCELED);
    /* the queue bound: one more than KVP_FETCHQ_MAX waiting is refused */
    wkeys_t ks;
    wkeys_make(&ks, 5, 1);
    uint64_t op = 0;
    for (uint32_t i = 1; i < KVP_FETCHQ_MAX; i++) /* b3 is waiting already */
        assert_int_equal(try_fetch(w, 1, 0, 1000 + i, &ks, &op), KVP_OK);
    assert_int_equal(try_fetch(w, 1, 0, 5000, &ks, &op), KVP_ERR_LIMIT);
    assert_int_equal(world_stats(w, 1).fetches_refused_inflight, 1);
    /* the source dies: A fails for routing, every queued fetch UNREACHABLE */
    kvp_fake_net_kill(w->net, w->addr[0]);
    assert_non_null(e = world_wait(w, 1, KVP_EV_LOAD, b3, 1000 * MS));
    assert_int_equal(e->status, KVP_ERR_UNREACHABLE);
    assert_non_null(e = world_event(w, 1, KVP_EV_LOAD, a));
    assert_int_equal(e->status, KVP_ERR_UNREACHABLE);
    assert_int_equal(world_event_count(w, 1, KVP_EV_LOAD, 0), 3 + KVP_FETCHQ_MAX);
    assert_int_equal(world_event_count(w, 1, KVP_EV_LOAD, b1), 1);
    assert_int_equal(world_event_count(w, 1, KVP_EV_LOAD, b2), 1);
    st = world_stats(w, 1);
    assert_int_equal(st.slots_filling, 0);
    /* shutdown with fetches queued: they fail there, nothing leaks */
    world_connect(w, 1, 0);
    world_put(w, 0, 40, 0);
    slow = kvp_fake_script_complete(900 * MS);
    start_fetch(w, 30, 0, 2, &slow);
    world_run(w, 10 * MS);
    start_fetch(w, 31, 40, 1, NULL);
    assert_int_equal(world_stats(w, 1).fetches_queued, 3 + KVP_FETCHQ_MAX);
    world_fini(w, false);
    free(w);
}

static void tweak_inflight_instance(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    tweak_inflight(c, s, i);
    if (i == 0 || i == 2)
        c->instance_id = "hostA";
}

/* A sibling of the source's instance dies (SPEC §8 probation): the load in
 * flight fails for routing and the fetch queued behind it fails at once with
 * UNREACHABLE -- it never starts, even when the budget frees later.
 * Mutation: probation not failing the queue -> B starts once A settles and
 * its event says OK (or arrives late). */
static void test_inflight_queued_fetch_fails_on_probation(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    g_limit = 2;
    world_init(w, 3, tweak_inflight_instance);
    world_connect(w, 1, 2);
    world_connect(w, 1, 0);
    for (uint32_t k = 0; k < 3; k++)
        world_put(w, 2, k, 0);
    assert_int_equal(lookup_hits(w, 1, 2, 9, 0, 2), 2);
    kvp_fake_script_t slow = kvp_fake_script_complete(300 * MS);
    assert_int_equal(kvp_fake_script_next(kvp__node_xport(w->node[2]), &slow), KVP_OK);
    wkeys_t ks;
    uint64_t a = 0, b = 0;
    wkeys_make(&ks, 0, 2);
    assert_int_equal(try_fetch(w, 1, 2, 9, &ks, &a), KVP_OK);
    world_run(w, 10 * MS);
    assert_int_equal(lookup_hits(w, 1, 2, 10, 2, 1), 1);
    wkeys_make(&ks, 2, 1);
    assert_int_equal(try_fetch(w, 1, 2, 10, &ks, &b), KVP_OK);
    assert_int_equal(world_stats(w, 1).fetches_queued, 1);
    uint64_t t0 = kvp_clock_now(&w->mc.clock);
    kvp_fake_net_kill(w->net, w->addr[0]); /* node 2's sibling dies */
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, b, 1000 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_UNREACHABLE);
    assert_true(kvp_clock_now(&w->mc.clock) - t0 <= (uint64_t)w->cfg[1].dead_after_ms * MS);
    assert_non_null(e = world_event(w, 1, KVP_EV_LOAD, a));
    assert_int_equal(e->status, KVP_ERR_UNREACHABLE);
    world_run(w, 1000 * MS); /* A's transfer ends, the ABORT_ACK releases its slots */
    kvp_stats_t st = world_stats(w, 1);
    assert_int_equal(st.slots_filling + st.slots_quarantined, 0);
    assert_int_equal(world_event_count(w, 1, KVP_EV_LOAD, b), 1);
    assert_false(world_verify(w, 1, 2)); /* B never started */
    world_fini(w, false);
    free(w);
}

/* ------------------------------------------------------- max_quarantined */

static bool g_per_peer; /* the limit is max_quarantined_per_peer, not the store's */

static void tweak_quarantine(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    if (i == 1) {
        if (g_per_peer)
            c->max_quarantined_per_peer = g_limit; /* the store's stays a quarter */
        else
            c->max_quarantined = g_limit;
        s->fake_path = KVP_PATH_FAKE_UNFENCEABLE; /* no fence proof: slots stay held */
    }
}

/* SPEC §8 max quarantined slots, as issue 27 changed it: a faulty peer past
 * its share is served from FREE slots, refused only when none is left.
 * Source 0 dies mid-transfer on an unfenceable path: its 2 destination
 * slots stay QUARANTINED, attributed to peer 0 (faulty). With
 * max_quarantined = 2, node 0 comes back (same peer id) and its fetch is
 * served AT ONCE (FREE slots exist; before issue 27 it was refused until
 * the hold cap). Then node 1 fills its store with its own READY blocks: no
 * FREE slot is left, and node 0's next fetch is refused with KVP_ERR_LIMIT
 * (fetches_refused_quarantine, a WARN naming the limit and peer 0, nothing
 * reserved, no READY block of node 1 evicted for it), while healthy node 2
 * is served (by eviction). At the hold cap the slots are released (suspect)
 * and node 0 is served again.
 * Run twice: with the store's max_quarantined = 2, and with the peer's share
 * max_quarantined_per_peer = 2 (the store's a quarter).
 * Mutations: the old rule (refuse past max_quarantined, FREE slots or not)
 * -> the restarted source's first fetch is LIMIT; no FREE check (never
 * refuse) -> the fetch with no FREE slot is accepted and evicts; the
 * per-peer share not checked -> the second run's fetch is accepted. */
static void quarantine_case(void **state, bool per_peer)
{
    world_t *w = *state = malloc(sizeof(world_t));
    g_limit = 2;
    g_per_peer = per_peer;
    world_init(w, 3, tweak_quarantine);
    world_connect(w, 1, 0);
    world_connect(w, 1, 2);
    for (uint32_t k = 0; k < 6; k++)
        world_put(w, 0, k, 0);
    for (uint32_t k = 10; k < 12; k++)
        world_put(w, 2, k, 0);
    assert_int_equal(lookup_hits(w, 1, 0, 4, 0, 2), 2);
    kvp_fake_script_t wedge = kvp_fake_script_wedge();
    assert_int_equal(kvp_fake_script_next(kvp__node_xport(w->node[0]), &wedge), KVP_OK);
    wkeys_t ks;
    uint64_t op = 0;
    wkeys_make(&ks, 0, 2);
    assert_int_equal(try_fetch(w, 1, 0, 4, &ks, &op), KVP_OK);
    world_run(w, 10 * MS);
    uint64_t t0 = kvp_clock_now(&w->mc.clock);
    kvp_fake_net_kill(w->net, w->addr[0]); /* the source's connections die */
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 1000 * MS);
    assert_non_null(e);
    assert_int_not_equal(e->status, KVP_OK);
    assert_true(kvp_clock_now(&w->mc.clock) - t0 <= (uint64_t)w->cfg[1].dead_after_ms * MS);
    assert_int_equal(world_stats(w, 1).slots_quarantined, 2);
    /* node 0 comes back under the same peer id: faulty, past the limit, but
     * FREE slots exist: served at once */
    world_connect(w, 1, 0);
    log_start();
    kvp_stats_t before = world_stats(w, 1);
    assert_int_equal(lookup_fetch(w, 1, 0, 5, 2, 2, 500 * MS), KVP_OK);
    assert_true(world_verify(w, 1, 2));
    assert_int_equal(world_stats(w, 1).fetches_refused_quarantine,
                     before.fetches_refused_quarantine);
    /* node 1 fills every FREE slot with its own blocks */
    for (uint32_t k = 100; world_stats(w, 1).slots_free > 0; k++)
        world_put(w, 1, k, 0);
    kvp_stats_t full = world_stats(w, 1);
    assert_int_equal(lookup_hits(w, 1, 0, 6, 4, 2), 2);
    wkeys_make(&ks, 4, 2);
    assert_int_equal(try_fetch(w, 1, 0, 6, &ks, &op), KVP_ERR_LIMIT);
    kvp_stats_t mid = world_stats(w, 1);
    assert_int_equal(mid.fetches_refused_quarantine - full.fetches_refused_quarantine, 1);
    assert_int_equal(mid.slots_filling, full.slots_filling); /* nothing reserved */
    assert_int_equal(mid.slots_ready, full.slots_ready);     /* nothing evicted for it */
    assert_int_equal(mid.evictions, full.evictions);
    assert_int_equal(log_count(per_peer ? "max_quarantined_per_peer reached"
                                        : "max_quarantined reached",
                               w->addr[0]),
                     1);
    assert_int_equal(kvp_finish_request(w->node[1], 6), KVP_OK);
    /* the healthy peer is served at the limit (its slots by eviction) */
    assert_int_equal(lookup_fetch(w, 1, 2, 7, 10, 2, 500 * MS), KVP_OK);
    assert_true(world_verify(w, 1, 10));
    kvp_stats_t after = world_stats(w, 1);
    assert_int_equal(after.fetches_refused_quarantine, mid.fetches_refused_quarantine);
    assert_int_equal(log_count("max_quarantined", w->addr[2]), 0);
    assert_int_equal(after.slots_quarantined, 2);
    log_stop();
    /* the hold cap releases them (suspect); node 0 is no longer faulty */
    world_run(w, (uint64_t)w->cfg[1].hold_cap_ms * MS + 500 * MS);
    kvp_stats_t st = world_stats(w, 1);
    assert_int_equal(st.slots_quarantined, 0);
    assert_int_equal(st.slots_suspect, 2);
    assert_true(st.force_releases >= 1);
    assert_int_equal(lookup_fetch(w, 1, 0, 8, 4, 2, 500 * MS), KVP_OK);
    assert_true(world_verify(w, 1, 4));
    assert_int_equal(world_stats(w, 1).fetches_refused_quarantine,
                     after.fetches_refused_quarantine);
    world_fini(w, false);
    free(w);
}

static void test_max_quarantined_refuses_faulty_peer_only(void **state)
{
    quarantine_case(state, false);
}

static void test_max_quarantined_per_peer(void **state)
{
    quarantine_case(state, true);
}

/* ---------------------------------------------------------- max_retained */

static void tweak_retained(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    if (i == 0)
        c->max_retained = g_limit;
}

/* SPEC §8 "max retained transfers: the node stops serving new fetches until
 * some release". The consumer dies while node 0's transfer is wedged: it is
 * retained with its pins (retained_transfers = 1). With max_retained = 1
 * node 0 answers the next FETCH (another consumer) with a failure and
 * moves no byte; at the hold cap the wedged transfer is force-released
 * (force_releases) and node 0 serves again. The refusal is counted
 * (fetches_refused_retained) and logged naming max_retained and the peer.
 * Mutations: max_retained = 2 -> node 2's fetch is served; counter
 * increment removed -> the metric assert fails. */
static void test_max_retained_refuses_fetch(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    g_limit = 1;
    world_init(w, 3, tweak_retained);
    world_connect(w, 1, 0);
    world_connect(w, 2, 0);
    for (uint32_t k = 0; k < 3; k++)
        world_put(w, 0, k, 0);
    assert_int_equal(lookup_hits(w, 1, 0, 4, 0, 1), 1);
    kvp_fake_script_t wedge = kvp_fake_script_wedge();
    assert_int_equal(kvp_fake_script_next(kvp__node_xport(w->node[0]), &wedge), KVP_OK);
    wkeys_t ks;
    uint64_t op = 0;
    wkeys_make(&ks, 0, 1);
    assert_int_equal(try_fetch(w, 1, 0, 4, &ks, &op), KVP_OK);
    world_run(w, 10 * MS);
    world_stop_node(w, 1); /* the consumer goes away; node 0's WRITE is wedged */
    world_run(w, (uint64_t)w->cfg[0].dead_after_ms * MS + 100 * MS);
    kvp_stats_t st = world_stats(w, 0);
    assert_int_equal(st.retained_transfers, 1);
    assert_int_equal(st.pins, 1); /* the retained transfer keeps its source pin */
    uint64_t out0 = st.blocks_out;
    log_start();
    kvp_status_t ls = lookup_fetch(w, 2, 0, 8, 1, 2, 500 * MS);
    assert_int_equal(ls, KVP_ERR_LIMIT); /* the source's reason travels in FETCH_DONE */
    kvp_stats_t st2 = world_stats(w, 0);
    assert_int_equal(st2.blocks_out, out0); /* no byte moved */
    assert_int_equal(st2.fetches_refused_retained - st.fetches_refused_retained, 1);
    assert_int_equal(log_count("max_retained", w->addr[2]), 1);
    log_stop();
    world_run(w, (uint64_t)w->cfg[0].hold_cap_ms * MS + 500 * MS);
    st = world_stats(w, 0);
    assert_int_equal(st.retained_transfers, 0);
    assert_true(st.force_releases >= 1);
    assert_int_equal(lookup_fetch(w, 2, 0, 9, 1, 2, 500 * MS), KVP_OK);
    assert_true(world_verify(w, 2, 1));
    world_fini(w, false);
    free(w);
}

int main(void)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_max_sessions_refuses_cleanly),
        cmocka_unit_test(test_max_pins_lookup_answers_miss),
        cmocka_unit_test(test_inflight_queued_fetch_starts_when_budget_frees),
        cmocka_unit_test(test_inflight_queued_fetch_times_out_with_limit),
        cmocka_unit_test(test_inflight_queued_fetch_one_outcome),
        cmocka_unit_test(test_inflight_queued_fetch_fails_on_probation),
        cmocka_unit_test(test_max_quarantined_refuses_faulty_peer_only),
        cmocka_unit_test(test_max_quarantined_per_peer),
        cmocka_unit_test(test_max_retained_refuses_fetch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
