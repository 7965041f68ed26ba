/*
 * test_node_fence.c -- the fence as proof (SPEC §6, §7.4) when the source
 * posts its WRITE only AFTER the consumer fenced: the regressions behind the
 * simulator's I1 seeds of issue 15 (3478, 4082, 5245, 5390, 6713, 6834,
 * 7307), each reduced to a directed scenario on the fake world.
 *
 * Root cause: a completed fence on a fenceable path is proof that "no later
 * byte can land" (transport.h) -- in UCX 1.13 the consumer FORCE-closes its
 * own PEER endpoint, whose id every software put of the source's paired
 * endpoint carries, so any put through that endpoint is dropped from then on,
 * whenever it was posted (UCX-NOTES §5). The fake fenced only the copies
 * already pending at the fence; a FETCH still in the network (partition), or
 * parked demand served after the consumer gave up, let the source post a
 * WRITE through its old endpoint after the fence, and the fake landed it in
 * slots the fence had (rightly) released. The node's rule was right; the
 * model of the transport was weaker than its contract. Fixed in the fake:
 * a fence marks the source's endpoints paired with the fenced one, and their
 * later transfers are fenced too.
 */
#include "world.h"

#define MS KVP_NSEC_PER_MSEC

static int teardown_free(void **state)
{
    (void)state;
    return 0;
}

/* Seeds 7307, 4082 (and the race of 5245, 5390, 6713, 6834): a FETCH is
 * held by a partition; the consumer closes the session (its fence releases
 * the destinations at once: a fenceable path); the partition heals, the
 * held FETCH reaches the source, which posts a transfer through its endpoint
 * of the old session (wedged, copying late), then the BYE retires it. The
 * late copy must not land. Fails before the fix: two I1 violations (the
 * copy lands in FREE slots). */
static void test_fence_holds_for_fetch_delivered_after_heal(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    wkeys_t ks;
    world_put(w, 0, 1, 0);
    world_put(w, 0, 2, 0);
    wkeys_make(&ks, 1, 2);
    world_lookup_hits(w, 1, 0, &ks, 7);
    kvp_fake_script_t sc = kvp_fake_script_wedge_then_copy(100 * MS);
    assert_int_equal(kvp_fake_script_next(kvp__node_xport(w->node[0]), &sc), KVP_OK);
    kvp_fake_net_partition(w->net, w->addr[0], w->addr[1], true);
    uint64_t op;
    assert_int_equal(kvp_fetch(w->node[1], w->addr[0], 7, ks.buf, ks.len, 2, 0, NULL, &op),
                     KVP_OK);
    world_run(w, 3 * MS);
    assert_int_equal(kvp_peer_remove(w->node[1], w->addr[0]), KVP_OK);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 20 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_UNREACHABLE);
    assert_int_equal(world_stats(w, 1).slots_quarantined, 0); /* fenced: released at once */
    kvp_fake_net_partition(w->net, w->addr[0], w->addr[1], false);
    world_run(w, 20 * MS);
    /* The held FETCH reached the source after the fence: posted, retained. */
    assert_int_equal(kvp_fake_call_count(kvp__node_xport(w->node[0]), KVP_FAKE_CALL_WRITE), 1);
    assert_int_equal(world_stats(w, 0).retained_transfers, 1);
    /* The consumer reuses the released slots meanwhile. */
    for (uint32_t k = 10; k < 14; k++)
        world_put(w, 1, k, 0);
    world_run(w, 200 * MS); /* the wedged transfer's copy is due now */
    kvp_fake_counters_t fc;
    kvp_fake_get_counters(kvp__node_xport(w->node[0]), &fc);
    assert_int_equal(world_violations(w), 0);
    assert_int_equal(fc.blocks_landed, 0);
    assert_int_equal(fc.blocks_fenced, 2);
    for (uint32_t k = 10; k < 14; k++)
        assert_true(world_verify(w, 1, k));
    world_fini(w, false);
    free(w);
}

static void tweak_slow_source(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    (void)s;
    if (i == 0) /* the source notices the partition late */
        c->dead_after_ms = 400;
}

/* Seed 3478: WAIT_FOR_SUPPLY demand is parked on the source; a partition;
 * the consumer declares the source dead first and fences (slots FREE); the
 * source, still holding the session, commits the key and serves the parked
 * demand through its old endpoint. Fails before the fix: the copy lands in
 * a FREE slot. */
static void test_fence_holds_for_parked_demand_served_late(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, tweak_slow_source);
    world_connect(w, 1, 0);
    world_run(w, 100 * MS); /* heartbeats: the consumer has heard the source's ready session */
    wkeys_t ks;
    wkeys_make(&ks, 5, 1);
    uint64_t op;
    assert_int_equal(kvp_fetch(w->node[1], w->addr[0], 3, ks.buf, ks.len, 1,
                               KVP_FETCH_FLAG_WAIT_FOR_SUPPLY, NULL, &op),
                     KVP_OK);
    world_run(w, 5 * MS); /* parked on the source */
    kvp_fake_net_partition(w->net, w->addr[0], w->addr[1], true);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 300 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_UNREACHABLE); /* dead after 200 ms */
    world_run(w, 2 * MS);
    assert_int_equal(world_stats(w, 1).slots_quarantined, 0); /* fenced: released */
    assert_non_null(kvp__node_find_session(w->node[0], w->addr[1])); /* source: still up */
    kvp_fake_script_t sc = kvp_fake_script_wedge_then_copy(60 * MS);
    assert_int_equal(kvp_fake_script_next(kvp__node_xport(w->node[0]), &sc), KVP_OK);
    world_put(w, 0, 5, 0); /* the parked demand is served now */
    world_run(w, 2 * MS);
    assert_int_equal(kvp_fake_call_count(kvp__node_xport(w->node[0]), KVP_FAKE_CALL_WRITE), 1);
    world_put(w, 1, 20, 0); /* the consumer reuses the released slot */
    world_run(w, 400 * MS);
    kvp_fake_counters_t fc;
    kvp_fake_get_counters(kvp__node_xport(w->node[0]), &fc);
    assert_int_equal(world_violations(w), 0);
    assert_int_equal(fc.blocks_landed, 0);
    assert_int_equal(fc.blocks_fenced, 1);
    assert_true(world_verify(w, 1, 20));
    kvp_fake_net_partition(w->net, w->addr[0], w->addr[1], false);
    world_fini(w, false);
    free(w);
}

/* Soak seeds 1045551, 1087982: the consumer's session is READY (the
 * source's HELLO_ACK arrived) but its own HELLO_ACK is held by a partition,
 * so the source has no endpoint to us yet. The consumer fetches and closes;
 * its fence covers no endpoint of the source; after the heal the source
 * registers our blob (a new endpoint), serves the held FETCH and its late
 * copy lands. The fence must not be credited: the slots stay quarantined.
 * Fails without the peer_heard rule (two I1 violations). */
static void test_fence_not_proof_before_the_peer_is_ready(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_put(w, 0, 40, 0);
    world_put(w, 0, 41, 0);
    assert_int_equal(kvp_peer_add(w->node[1], w->addr[0]), KVP_OK);
    /* Progress node by node (timers deliver): stop as soon as node 1 is
     * ready, before node 0 has processed node 1's HELLO_ACK. */
    bool split = false;
    for (int k = 0; k < 20000 && !split; k++) {
        kvp_manual_clock_advance(&w->mc, 10 * 1000);
        kvp_node_progress(w->node[1], 0);
        if (world_peer_ready(w, 1, 0) && !world_peer_ready(w, 0, 1)) {
            kvp_fake_net_partition(w->net, w->addr[0], w->addr[1], true);
            split = true;
            break;
        }
        kvp_node_progress(w->node[0], 0);
    }
    assert_true(split);
    kvp_fake_script_t sc = kvp_fake_script_wedge_then_copy(100 * MS);
    assert_int_equal(kvp_fake_script_next(kvp__node_xport(w->node[0]), &sc), KVP_OK);
    wkeys_t ks;
    wkeys_make(&ks, 40, 2);
    uint64_t op;
    assert_int_equal(kvp_fetch(w->node[1], w->addr[0], 3, ks.buf, ks.len, 2,
                               KVP_FETCH_FLAG_WAIT_FOR_SUPPLY, NULL, &op),
                     KVP_OK);
    world_run(w, 2 * MS);
    assert_int_equal(kvp_peer_remove(w->node[1], w->addr[0]), KVP_OK);
    assert_non_null(world_wait(w, 1, KVP_EV_LOAD, op, 20 * MS));
    assert_int_equal(world_stats(w, 1).slots_quarantined, 2); /* no proof yet */
    kvp_fake_net_partition(w->net, w->addr[0], w->addr[1], false);
    world_run(w, 300 * MS); /* the source gets ready, serves the FETCH, copies late */
    assert_true(kvp_fake_call_count(kvp__node_xport(w->node[0]), KVP_FAKE_CALL_WRITE) >= 1);
    assert_int_equal(world_violations(w), 0);
    world_run(w, (uint64_t)w->cfg[1].hold_cap_ms * MS + 300 * MS); /* released by the cap */
    assert_int_equal(world_stats(w, 1).slots_quarantined, 0);
    world_fini(w, false);
    free(w);
}

/* The other side of the rule: a fence covers the old incarnation only. After
 * the reconnect, the new session's transfers land normally (a fence that
 * stuck to the endpoint pair for good would starve every later session). */
static void test_fence_does_not_cover_the_next_incarnation(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    assert_int_equal(kvp_peer_remove(w->node[1], w->addr[0]), KVP_OK);
    world_run(w, 20 * MS);
    world_connect(w, 1, 0);
    wkeys_t ks;
    world_put(w, 0, 30, 0);
    world_put(w, 0, 31, 0);
    wkeys_make(&ks, 30, 2);
    world_lookup_hits(w, 1, 0, &ks, 9);
    uint64_t op;
    assert_int_equal(kvp_fetch(w->node[1], w->addr[0], 9, ks.buf, ks.len, 2, 0, NULL, &op),
                     KVP_OK);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 200 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    assert_true(world_verify(w, 1, 30));
    assert_true(world_verify(w, 1, 31));
    world_fini(w, false);
    free(w);
}

/* ------------------------------------------------ issue 27: process exit */

static void tweak_direct(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    (void)c;
    if (i == 1) /* the consumer: its sources write straight into its memory */
        s->fake_path = KVP_PATH_FAKE_UNFENCEABLE;
}

/* What one run of the exit scenario saw. */
typedef struct exit_seen {
    size_t violations;
    uint64_t quarantined_alive; /* slots still quarantined while the source ran */
    uint64_t released_exit, released_cap, quarantined_end;
    bool reused_ok; /* the released slots, reused, verify */
} exit_seen_t;

/* Direct-shm model (unfenceable): a fetch of 4 blocks whose transfer copies
 * late (copy_ms after posting; 0: never), the source's links cut (its
 * process still runs), then -- when `exit_source` -- the source node is
 * destroyed (its fake transport closed: the process exited). `watch` off
 * models a source the consumer cannot watch. `mutation` is on during the
 * whole scenario. */
static exit_seen_t exit_scenario(uint64_t copy_ms, bool exit_source, bool watch, int mutation)
{
    exit_seen_t seen = {0};
    world_t *w = malloc(sizeof(world_t));
    world_init(w, 2, tweak_direct);
    if (!watch)
        kvp_fake_set_exit_watch(kvp__node_xport(w->node[1]), false);
    world_connect(w, 1, 0);
    wkeys_t ks;
    uint8_t res[4];
    uint64_t op;
    for (uint32_t k = 60; k < 64; k++)
        world_put(w, 0, k, 0);
    wkeys_make(&ks, 60, 4);
    assert_int_equal(kvp_lookup(w->node[1], w->addr[0], 4, ks.buf, ks.len, 4, res, &op), KVP_OK);
    assert_non_null(world_wait(w, 1, KVP_EV_LOOKUP, op, 100 * MS));
    kvp_fake_script_t sc = copy_ms ? kvp_fake_script_wedge_then_copy(copy_ms * MS)
                                   : kvp_fake_script_wedge();
    assert_int_equal(kvp_fake_script_next(kvp__node_xport(w->node[0]), &sc), KVP_OK);
    kvp__mutation = mutation;
    assert_int_equal(kvp_fetch(w->node[1], w->addr[0], 4, ks.buf, ks.len, 4, 0, NULL, &op),
                     KVP_OK);
    world_run(w, 5 * MS); /* posted */
    kvp_fake_net_kill(w->net, w->addr[0]); /* the links die; the process runs on */
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 50 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_UNREACHABLE);
    /* Past the late copy (if any), well before the hold cap (2 s). */
    world_run(w, (copy_ms + 200) * MS);
    seen.quarantined_alive = world_stats(w, 1).slots_quarantined;
    if (exit_source) {
        world_stop_node(w, 0); /* the source process exits: its writes end */
        world_run(w, 300 * MS); /* one hold check or more */
    }
    for (uint32_t k = 10; k < 40; k++) /* reuse whatever was released */
        world_put(w, 1, k, 0);
    world_run(w, copy_ms * MS + 5 * MS);
    seen.reused_ok = true;
    for (uint32_t k = 10; k < 40; k++)
        seen.reused_ok &= world_verify(w, 1, k) || !world_stats(w, 1).slots_free;
    kvp__mutation = KVP_MUT_NONE;
    kvp_stats_t s1 = world_stats(w, 1);
    seen.released_exit = s1.released_process_exit;
    seen.released_cap = s1.released_hold_cap;
    seen.quarantined_end = s1.slots_quarantined;
    seen.violations = world_violations(w);
    kvp_fake_violations_clear(w->fab);
    world_fini(w, false);
    free(w);
    return seen;
}

/* The source's process exits after its links died: the quarantined slots
 * are released by that proof (not the cap), within a hold check. */
static void test_exit_proof_releases_after_source_exit(void **state)
{
    (void)state;
    exit_seen_t s = exit_scenario(0, true, true, KVP_MUT_NONE);
    assert_int_equal(s.quarantined_alive, 4); /* alive: held */
    assert_int_equal(s.released_exit, 4);
    assert_int_equal(s.released_cap, 0);
    assert_int_equal(s.quarantined_end, 0);
    assert_int_equal(s.violations, 0);
    assert_true(s.reused_ok);
}

/* The SIGSTOP case: the source's links died but its process runs (stopped,
 * then writing late): no release by the exit proof; the late copy lands in
 * quarantined slots only. Then it exits: released. Mutation
 * exit-proof-alive (the proof given without looking at the process): the
 * slots are released while it runs and its late copy lands in reused
 * slots (I1 violations). */
static void test_exit_proof_not_while_source_runs(void **state)
{
    (void)state;
    exit_seen_t s = exit_scenario(400, true, true, KVP_MUT_NONE);
    assert_int_equal(s.quarantined_alive, 4);
    assert_int_equal(s.violations, 0);
    assert_int_equal(s.released_exit, 4); /* after its exit only */
    assert_int_equal(s.released_cap, 0);
    s = exit_scenario(400, false, true, KVP_MUT_NONE);
    assert_int_equal(s.quarantined_alive, 4);
    assert_int_equal(s.released_exit, 0);
    assert_int_equal(s.violations, 0);
    s = exit_scenario(400, true, true, KVP_MUT_EXIT_PROOF_ALIVE);
    assert_true(s.quarantined_alive < 4);
    assert_true(s.violations > 0);
}

/* A source the consumer cannot watch (another netns or user, no pidfd):
 * its exit proves nothing here; the hold cap releases (suspect). */
static void test_exit_proof_needs_a_watch(void **state)
{
    (void)state;
    exit_seen_t s = exit_scenario(0, true, false, KVP_MUT_NONE);
    assert_int_equal(s.released_exit, 0);
    assert_int_equal(s.quarantined_end, 4);
    assert_int_equal(s.violations, 0);
}

/* The exit reported before the consumer saw the link die (a graceful
 * shutdown of the source: BYE processed after its transport closed): the
 * teardown itself releases by the proof. */
static void test_exit_proof_at_teardown(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, tweak_direct);
    world_connect(w, 1, 0);
    wkeys_t ks;
    uint8_t res[2];
    uint64_t op;
    world_put(w, 0, 50, 0);
    world_put(w, 0, 51, 0);
    wkeys_make(&ks, 50, 2);
    assert_int_equal(kvp_lookup(w->node[1], w->addr[0], 8, ks.buf, ks.len, 2, res, &op), KVP_OK);
    assert_non_null(world_wait(w, 1, KVP_EV_LOOKUP, op, 100 * MS));
    kvp_fake_script_t sc = kvp_fake_script_wedge();
    assert_int_equal(kvp_fake_script_next(kvp__node_xport(w->node[0]), &sc), KVP_OK);
    assert_int_equal(kvp_fetch(w->node[1], w->addr[0], 8, ks.buf, ks.len, 2, 0, NULL, &op),
                     KVP_OK);
    world_run(w, 5 * MS);
    world_stop_node(w, 0);
    /* 2 ms: the EOF arrives; the hold check runs every 250 ms (this run
     * is deterministic: it does not fall in these 2 ms), so what is
     * released now was released by the teardown. */
    world_run(w, 2 * MS);
    const kvp_event_t *e = world_event(w, 1, KVP_EV_LOAD, op);
    assert_non_null(e);
    assert_true(e->status != KVP_OK);
    kvp_stats_t s1 = world_stats(w, 1);
    assert_int_equal(s1.released_process_exit, 2);
    assert_int_equal(s1.slots_quarantined, 0);
    world_fini(w, false);
    free(w);
}

int main(void)
{
    kvp_log_set_level(KVP_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_fence_holds_for_fetch_delivered_after_heal, teardown_free),
        cmocka_unit_test_teardown(test_fence_holds_for_parked_demand_served_late, teardown_free),
        cmocka_unit_test_teardown(test_fence_does_not_cover_the_next_incarnation, teardown_free),
        cmocka_unit_test_teardown(test_fence_not_proof_before_the_peer_is_ready, teardown_free),
        cmocka_unit_test(test_exit_proof_releases_after_source_exit),
        cmocka_unit_test(test_exit_proof_not_while_source_runs),
        cmocka_unit_test(test_exit_proof_needs_a_watch),
        cmocka_unit_test_teardown(test_exit_proof_at_teardown, teardown_free),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
