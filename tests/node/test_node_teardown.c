/*
 * test_node_teardown.c -- safe teardown (SPEC §7): retained transfers,
 * quarantine, hold cap, reconnect isolation, host liveness, shutdown.
 * Deterministic: fake control network, fake data transport with scripts and
 * the landing checker, manual clock. Each test names its SPEC §11 row and
 * the mutation that makes it fail.
 */
#include "world.h"
#include "session/session_int.h" /* looks inside a session */

#define MS KVP_NSEC_PER_MSEC

static int teardown_free(void **state)
{
    (void)state;
    return 0;
}

/* Put keys k0.. on the source, look them up from the consumer, and start a
 * fetch whose transfer follows `sc` (NULL = default). Returns the load id. */
static uint64_t start_load(world_t *w, int cons, int src, uint32_t k0, uint32_t n, uint64_t req,
                           const kvp_fake_script_t *sc)
{
    wkeys_t ks;
    uint8_t res[64];
    uint64_t op;
    for (uint32_t k = k0; k < k0 + n; k++)
        world_put(w, src, k, 0);
    wkeys_make(&ks, k0, n);
    assert_int_equal(
        kvp_lookup(w->node[cons], w->addr[src], req, ks.buf, ks.len, n, res, &op), KVP_OK);
    const kvp_event_t *e = world_wait(w, cons, KVP_EV_LOOKUP, op, 100 * MS);
    assert_non_null(e);
    assert_int_equal(e->n_ok, n);
    if (sc != NULL)
        assert_int_equal(kvp_fake_script_next(kvp__node_xport(w->node[src]), sc), KVP_OK);
    assert_int_equal(
        kvp_fetch(w->node[cons], w->addr[src], req, ks.buf, ks.len, n, 0, NULL, &op), KVP_OK);
    world_run(w, 5 * MS); /* the FETCH reaches the source; the transfer is posted */
    return op;
}

static uint64_t log_errors_with(kvp_test_logcap_t *cap)
{
    return cap->count[KVP_LOG_ERROR];
}

/* F1: the source dies mid-transfer: the consumer fails the load at once for
 * routing, quarantines, and (fenceable path) the completed fence releases.
 * Mutation: commit or free the destinations at the fault instead of
 * quarantining -> slots READY / landing violation. */
static void test_F1_source_dies_fenceable(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    kvp_fake_script_t sc = kvp_fake_script_wedge_then_copy(100 * MS);
    uint64_t op = start_load(w, 1, 0, 0, 4, 1, &sc);
    uint64_t t0 = kvp_clock_now(&w->mc.clock);
    kvp_fake_net_kill(w->net, w->addr[0]);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 50 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_UNREACHABLE);
    assert_true(kvp_clock_now(&w->mc.clock) - t0 <= 5 * MS); /* EOF: fails at once */
    world_run(w, 300 * MS); /* the late copy is dropped by the fence */
    kvp_stats_t s1 = world_stats(w, 1);
    assert_int_equal(s1.slots_quarantined, 0);
    assert_int_equal(s1.slots_ready, 0);
    assert_int_equal(s1.force_releases, 0);
    /* Released by the named proof (release.c), not by the cap. */
    assert_int_equal(s1.released_fence, 4);
    assert_int_equal(s1.released_hold_cap, 0);
    assert_int_equal(s1.released_fetch_done + s1.released_abort_ack + s1.released_am_refuse, 0);
    kvp_fake_counters_t fc;
    kvp_fake_get_counters(kvp__node_xport(w->node[0]), &fc);
    assert_int_equal(fc.blocks_fenced, 4);
    assert_int_equal(world_event_count(w, 1, KVP_EV_LOAD, op), 1);
    world_fini(w, false);
    free(w);
}

static void tweak_unfenceable(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    (void)c;
    if (i == 1)
        s->fake_path = KVP_PATH_FAKE_UNFENCEABLE;
}

/* F1/F6/F22 on a path that cannot be fenced: the late WRITE lands only in
 * quarantined slots (checker: no violation); the slots wait for the hold cap,
 * then return as suspect with an error log and a metric. Mutation: release
 * quarantined slots at once (late copy lands in a FREE slot: violation). */
static void test_F6_unfenceable_late_write_then_cap(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    kvp_test_logcap_t cap;
    world_init(w, 2, tweak_unfenceable);
    world_connect(w, 1, 0);
    kvp_fake_script_t sc = kvp_fake_script_wedge_then_copy(300 * MS);
    uint64_t op = start_load(w, 1, 0, 0, 4, 1, &sc);
    kvp_fake_net_kill(w->net, w->addr[0]);
    assert_non_null(world_wait(w, 1, KVP_EV_LOAD, op, 20 * MS));
    world_run(w, 20 * MS);
    assert_int_equal(world_stats(w, 1).slots_quarantined, 4);
    world_run(w, 500 * MS); /* the late copy lands: into QUARANTINED slots */
    kvp_fake_counters_t fc;
    kvp_fake_get_counters(kvp__node_xport(w->node[0]), &fc);
    assert_int_equal(fc.blocks_landed, 4);
    assert_int_equal(world_violations(w), 0);
    assert_int_equal(world_stats(w, 1).slots_quarantined, 4); /* no proof: held */
    kvp_test_logcap_start(&cap);
    world_run(w, (uint64_t)w->cfg[1].hold_cap_ms * MS);
    kvp_test_logcap_stop();
    kvp_stats_t s1 = world_stats(w, 1);
    assert_int_equal(s1.slots_quarantined, 0);
    assert_int_equal(s1.slots_suspect, 4);
    assert_true(s1.force_releases >= 1);
    assert_int_equal(s1.released_hold_cap, 4); /* no proof: the cap */
    assert_int_equal(s1.released_fence, 0);
    assert_true(log_errors_with(&cap) >= 1);
    world_fini(w, false);
    free(w);
}

/* F2 + F22: the consumer dies while the source's WRITE runs: the source
 * cancels in WAIT mode, retains the transfer and its pins; past the hold cap
 * it force-releases with an error log and a metric. Mutations: IMMEDIATE
 * cancel at close (call log), unpin store jobs at close (pins drop early). */
static void test_F2_consumer_dies_source_retains(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    kvp_test_logcap_t cap;
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    kvp_fake_script_t sc = kvp_fake_script_wedge();
    start_load(w, 1, 0, 0, 4, 1, &sc);
    kvp_xport_t *x0 = kvp__node_xport(w->node[0]);
    kvp_fake_net_kill(w->net, w->addr[1]);
    world_run(w, 20 * MS);
    kvp_stats_t s0 = world_stats(w, 0);
    assert_int_equal(s0.retained_transfers, 1);
    assert_int_equal(s0.pins, 4); /* the store job stays pinned */
    const kvp_fake_call_t *calls;
    size_t nc = kvp_fake_calls(x0, &calls);
    bool saw_wait = false, saw_immediate = false;
    for (size_t i = 0; i < nc; i++) {
        if (calls[i].kind == KVP_FAKE_CALL_CANCEL) {
            saw_wait |= calls[i].mode == KVP_CANCEL_WAIT;
            saw_immediate |= calls[i].mode == KVP_CANCEL_IMMEDIATE;
        }
    }
    assert_true(saw_wait);
    assert_false(saw_immediate);
    /* The endpoint of the removed peer is not released while the retired
     * transfer refers to it. */
    assert_int_equal(kvp_fake_call_count(x0, KVP_FAKE_CALL_ENDPOINT_RELEASE), 0);
    kvp_held_item_t held[8];
    uint32_t nh = 0;
    assert_int_equal(kvp_node_held(w->node[0], held, 8, &nh), KVP_OK);
    assert_int_equal(nh, 1);
    assert_int_equal(held[0].kind, 1);
    kvp_test_logcap_start(&cap);
    world_run(w, (uint64_t)w->cfg[0].hold_cap_ms * MS + 300 * MS);
    kvp_test_logcap_stop();
    s0 = world_stats(w, 0);
    assert_int_equal(s0.retained_transfers, 0);
    assert_int_equal(s0.pins, 0);
    assert_int_equal(s0.force_releases, 1);
    assert_int_equal(s0.released_hold_cap, 4); /* the 4 source pins, no proof */
    assert_int_equal(s0.released_terminal, 0);
    assert_true(log_errors_with(&cap) >= 1);
    assert_int_equal(kvp_fake_call_count(x0, KVP_FAKE_CALL_FORCE_RELEASE), 1);
    world_fini(w, false);
    free(w);
}

/* F3 + F4: a session closed with a transfer in progress: retained (not
 * released), the peer reconnects under the same id with new epochs and never
 * sees the old transfer, which is released by poll_retired when it stops,
 * without a force release. Mutation: poll retired transfers as live (the new
 * session would receive the old completion). */
static void test_F3_F4_close_retain_reconnect(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    kvp_fake_script_t sc = kvp_fake_script_complete(400 * MS);
    uint64_t op = start_load(w, 1, 0, 0, 4, 1, &sc);
    assert_int_equal(kvp_peer_remove(w->node[1], w->addr[0]), KVP_OK);
    assert_non_null(world_wait(w, 1, KVP_EV_LOAD, op, 20 * MS));
    world_run(w, 10 * MS);
    assert_int_equal(world_stats(w, 0).retained_transfers, 1);
    assert_int_equal(world_stats(w, 0).pins, 4);
    world_connect(w, 1, 0); /* new incarnation, same peer ids */
    uint64_t op2 = start_load(w, 1, 0, 10, 2, 2, NULL);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op2, 100 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    world_run(w, 500 * MS); /* the old transfer stops: released, not reported */
    kvp_stats_t s0 = world_stats(w, 0);
    assert_int_equal(s0.retained_transfers, 0);
    assert_int_equal(s0.force_releases, 0);
    assert_int_equal(s0.pins, 0);
    assert_int_equal(s0.released_terminal, 4 + 2); /* retained (poll_retired) + new */
    assert_int_equal(s0.released_hold_cap, 0);
    assert_true(world_verify(w, 1, 10));
    assert_int_equal(world_event_count(w, 1, KVP_EV_LOAD, op), 1);
    assert_int_equal(world_stats(w, 1).slots_quarantined, 0);
    world_fini(w, false);
    free(w);
}

/* Removing a peer with nothing in flight releases its endpoint at once. */
static void test_remove_idle_peer_releases_endpoint(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    assert_int_equal(kvp_peer_remove(w->node[1], w->addr[0]), KVP_OK);
    world_run(w, 20 * MS);
    assert_int_equal(kvp_fake_call_count(kvp__node_xport(w->node[0]),
                                         KVP_FAKE_CALL_ENDPOINT_RELEASE), 1);
    assert_int_equal(kvp_fake_call_count(kvp__node_xport(w->node[1]),
                                         KVP_FAKE_CALL_ENDPOINT_RELEASE), 1);
    world_fini(w, false);
    free(w);
}

/* F5: ABORT_ACK never comes (the transfer is wedged): the consumer re-sends
 * ABORT, then after the abort-ack timeout closes the session as a fault and
 * quarantines. Mutation: never escalate (the load's slots stay FILLING). */
static void test_F5_abort_ack_timeout_escalates(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, tweak_unfenceable);
    world_connect(w, 1, 0);
    kvp_fake_script_t sc = kvp_fake_script_wedge();
    uint64_t op = start_load(w, 1, 0, 0, 2, 1, &sc);
    uint64_t t0 = kvp_clock_now(&w->mc.clock);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 2000 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_TIMEOUT);
    const kvp_event_t *d = world_wait(w, 1, KVP_EV_PEER_DOWN, 0, 1000 * MS);
    assert_non_null(d);
    assert_int_equal(d->fault, 1);
    uint64_t dt = kvp_clock_now(&w->mc.clock) - t0;
    assert_true(dt >= (uint64_t)(w->cfg[1].load_timeout_ms + w->cfg[1].abort_ack_timeout_ms) * MS -
                         10 * MS);
    world_run(w, 10 * MS);
    assert_int_equal(world_stats(w, 1).slots_quarantined, 2);
    assert_int_equal(world_event_count(w, 1, KVP_EV_LOAD, op), 1);
    world_fini(w, false);
    free(w);
}

/* F5 (late ack): the source's transfer ends after the ABORT: the ABORT_ACK
 * comes only then; the consumer frees its slots on it, one outcome.
 * Mutation: ack before the transfer is terminal (landing violation). */
static void test_F5_abort_ack_after_terminal(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    kvp_fake_script_t sc = kvp_fake_script_complete(1200 * MS);
    uint64_t op = start_load(w, 1, 0, 0, 2, 1, &sc);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 1100 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_TIMEOUT);
    assert_int_equal(world_stats(w, 1).slots_filling, 2); /* waiting for proof */
    world_run(w, 400 * MS);
    kvp_stats_t s1 = world_stats(w, 1);
    assert_int_equal(s1.slots_filling, 0);
    assert_int_equal(s1.slots_quarantined, 0);
    assert_null(world_event(w, 1, KVP_EV_PEER_DOWN, 0));
    assert_int_equal(world_event_count(w, 1, KVP_EV_LOAD, op), 1);
    world_fini(w, false);
    free(w);
}

static void tweak_instance(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    (void)s;
    if (i == 0 || i == 2)
        c->instance_id = "hostA";
}

/* F12: one rank of a multi-rank instance dies: loads to its sibling fail
 * fast (within dead-after), new work answers MISS until a fresh PONG proves
 * the sibling alive. Mutation: no probation (the load waits for its timeout). */
static void test_F12_sibling_probation(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 3, tweak_instance);
    world_connect(w, 1, 0);
    world_connect(w, 1, 2);
    kvp_fake_script_t sc = kvp_fake_script_complete(800 * MS);
    uint64_t op = start_load(w, 1, 2, 0, 2, 1, &sc);
    uint64_t t0 = kvp_clock_now(&w->mc.clock);
    kvp_fake_net_kill(w->net, w->addr[0]);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 300 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_UNREACHABLE);
    assert_true(kvp_clock_now(&w->mc.clock) - t0 <= (uint64_t)w->cfg[1].dead_after_ms * MS);
    assert_true(world_stats(w, 1).probations >= 1);
    /* Proof of life arrives within a round trip; then work flows again. */
    world_run(w, 20 * MS);
    wkeys_t ks;
    uint8_t res[1];
    uint64_t lop;
    world_put(w, 2, 50, 0);
    wkeys_make(&ks, 50, 1);
    assert_int_equal(kvp_lookup(w->node[1], w->addr[2], 9, ks.buf, ks.len, 1, res, &lop), KVP_OK);
    assert_non_null(world_wait(w, 1, KVP_EV_LOOKUP, lop, 100 * MS));
    assert_int_equal(res[0], KVP_LOOKUP_HIT);
    world_run(w, 1000 * MS); /* the transfer ends; ABORT_ACK releases the slots */
    kvp_stats_t s1 = world_stats(w, 1);
    assert_int_equal(s1.slots_quarantined, 0);
    assert_int_equal(s1.slots_filling, 0);
    assert_int_equal(world_event_count(w, 1, KVP_EV_LOAD, op), 1);
    world_fini(w, false);
    free(w);
}

/* F12 (probation holds): while the sibling has not answered a PING, new
 * lookups to it answer MISS. */
static void test_F12_probation_blocks_new_work(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 3, tweak_instance);
    world_connect(w, 1, 0);
    world_connect(w, 1, 2);
    kvp_fake_net_partition(w->net, w->addr[1], w->addr[2], true); /* no PONG can come */
    kvp_fake_net_kill(w->net, w->addr[0]);
    world_run(w, 5 * MS);
    wkeys_t ks;
    uint8_t res[1];
    uint64_t lop;
    wkeys_make(&ks, 1, 1);
    assert_int_equal(kvp_lookup(w->node[1], w->addr[2], 9, ks.buf, ks.len, 1, res, &lop),
                     KVP_ERR_UNREACHABLE);
    kvp_fake_net_partition(w->net, w->addr[1], w->addr[2], false);
    world_fini(w, false);
    free(w);
}

/* F23: node shutdown with work in flight: a bounded drain, then what
 * remains is force-released with error logs; nothing is freed early inside
 * the drain (the checker sees no violation). */
static void test_F23_shutdown_with_work_in_flight(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    kvp_test_logcap_t cap;
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    kvp_fake_script_t sc = kvp_fake_script_wedge();
    uint64_t op = start_load(w, 1, 0, 0, 3, 1, &sc);
    kvp_test_logcap_start(&cap);
    world_stop_node(w, 0);
    kvp_test_logcap_stop();
    assert_true(log_errors_with(&cap) >= 1); /* the retained transfer, force-released */
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 50 * MS);
    assert_non_null(e);
    assert_int_not_equal(e->status, KVP_OK);
    world_run(w, 20 * MS);
    assert_int_equal(world_stats(w, 1).slots_filling, 0);
    world_fini(w, false);
    free(w);
}

/* F26: an error on the consumer's own endpoint to a source: every load from
 * it fails for routing; its slots are quarantined, never committed.
 * Mutation: ignore peer_status (the load completes "successfully"). */
static void test_F26_consumer_endpoint_error(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, tweak_unfenceable);
    world_connect(w, 1, 0);
    kvp_fake_script_t sc = kvp_fake_script_complete(600 * MS);
    uint64_t op = start_load(w, 1, 0, 0, 2, 1, &sc);
    kvp_session_t *s = kvp__node_find_session(w->node[1], w->addr[0]);
    assert_non_null(s);
    assert_int_equal(kvp_fake_peer_set_error(kvp__node_xport(w->node[1]), s->xpeer,
                                             KVP_ERR_TRANSPORT),
                     KVP_OK);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 400 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_UNREACHABLE);
    world_run(w, 10 * MS);
    kvp_stats_t s1 = world_stats(w, 1);
    assert_int_equal(s1.slots_quarantined, 2);
    assert_int_equal(s1.slots_ready, 0);
    world_fini(w, false);
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_F1_source_dies_fenceable, teardown_free),
        cmocka_unit_test_teardown(test_F6_unfenceable_late_write_then_cap, teardown_free),
        cmocka_unit_test_teardown(test_F2_consumer_dies_source_retains, teardown_free),
        cmocka_unit_test_teardown(test_F3_F4_close_retain_reconnect, teardown_free),
        cmocka_unit_test_teardown(test_remove_idle_peer_releases_endpoint, teardown_free),
        cmocka_unit_test_teardown(test_F5_abort_ack_timeout_escalates, teardown_free),
        cmocka_unit_test_teardown(test_F5_abort_ack_after_terminal, teardown_free),
        cmocka_unit_test_teardown(test_F12_sibling_probation, teardown_free),
        cmocka_unit_test_teardown(test_F12_probation_blocks_new_work, teardown_free),
        cmocka_unit_test_teardown(test_F23_shutdown_with_work_in_flight, teardown_free),
        cmocka_unit_test_teardown(test_F26_consumer_endpoint_error, teardown_free),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
