/*
 * test_node_flow.c -- the node's flows (SPEC §5) on the fake control network
 * and the fake data transport, on a manual clock. Each test is named after
 * its SPEC §11 row where it has one; the comment names the mutation that
 * makes it fail.
 */
#include "world.h"

#define MS KVP_NSEC_PER_MSEC

static uint64_t do_lookup(world_t *w, int i, int j, uint64_t req, const wkeys_t *ks,
                          uint8_t *res)
{
    uint64_t op = 0;
    assert_int_equal(kvp_lookup(w->node[i], w->addr[j], req, ks->buf, ks->len, ks->n, res, &op),
                     KVP_OK);
    return op;
}

static uint64_t do_fetch(world_t *w, int i, int j, uint64_t req, const wkeys_t *ks,
                         uint32_t flags)
{
    uint64_t op = 0;
    assert_int_equal(
        kvp_fetch(w->node[i], w->addr[j], req, ks->buf, ks->len, ks->n, flags, NULL, &op),
        KVP_OK);
    return op;
}

/* Lookup -> fetch -> verify, byte-exact; one event per operation. */
static void test_lookup_fetch_roundtrip(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    for (uint32_t k = 0; k < 8; k++)
        world_put(w, 0, k, 0);
    wkeys_t ks;
    uint8_t res[10];
    wkeys_make(&ks, 0, 10); /* 8 hits, 2 misses */
    uint64_t op = do_lookup(w, 1, 0, 7, &ks, res);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOOKUP, op, 100 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    assert_int_equal(e->n_ok, 8);
    for (int i = 0; i < 10; i++)
        assert_int_equal(res[i], i < 8 ? KVP_LOOKUP_HIT : KVP_LOOKUP_MISS);
    kvp_stats_t s0 = world_stats(w, 0);
    assert_int_equal(s0.pins, 8); /* supply pinned for the round */

    wkeys_make(&ks, 0, 8);
    op = do_fetch(w, 1, 0, 7, &ks, 0);
    e = world_wait(w, 1, KVP_EV_LOAD, op, 100 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    assert_int_equal(e->n_ok, 8);
    world_run(w, 10 * MS);
    assert_int_equal(world_event_count(w, 1, KVP_EV_LOAD, op), 1);
    for (uint32_t k = 0; k < 8; k++)
        assert_true(world_verify(w, 1, k));
    s0 = world_stats(w, 0);
    assert_int_equal(s0.pins, 0); /* unpinned after remote completion */
    assert_int_equal(s0.released_terminal, 8); /* the transfer's store job */
    assert_int_equal(s0.blocks_out, 8);
    kvp_stats_t s1 = world_stats(w, 1);
    assert_int_equal(s1.released_fetch_done, 8); /* committed by FETCH_DONE */
    assert_int_equal(s1.blocks_in, 8);
    assert_int_equal(s1.slots_ready, 8);
    assert_int_equal(s1.slots_filling, 0);
    world_fini(w, false);
    free(w);
}

/* F9: demand for keys that were not supplied fails at once, not at the load
 * timeout. Mutation: park unsupplied demand (treat as WAIT_FOR_SUPPLY). */
static void test_F9_unsupplied_demand_fails_at_once(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    world_put(w, 0, 1, 0);
    wkeys_t ks;
    wkeys_make(&ks, 1, 1);
    uint64_t op = do_fetch(w, 1, 0, 9, &ks, 0); /* never looked up */
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 50 * MS);
    assert_non_null(e); /* within a few RTTs, far below the 30 s load timeout */
    assert_int_not_equal(e->status, KVP_OK);
    world_run(w, 10 * MS);
    assert_int_equal(world_event_count(w, 1, KVP_EV_LOAD, 0), 1);
    kvp_stats_t s1 = world_stats(w, 1);
    assert_int_equal(s1.slots_filling, 0); /* the FETCH_DONE freed the destination */
    assert_int_equal(world_stats(w, 0).pins, 0);
    /* A lookup-served round whose FETCH demands one key more than it
     * supplied fails at once, too. */
    uint8_t res[1];
    op = do_lookup(w, 1, 0, 10, &ks, res);
    assert_non_null(world_wait(w, 1, KVP_EV_LOOKUP, op, 100 * MS));
    assert_int_equal(res[0], KVP_LOOKUP_HIT);
    wkeys_t two;
    wkeys_make(&two, 1, 2); /* key 2 was never supplied */
    op = do_fetch(w, 1, 0, 10, &two, 0);
    e = world_wait(w, 1, KVP_EV_LOAD, op, 50 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_NOT_FOUND);
    world_run(w, 10 * MS);
    assert_int_equal(world_stats(w, 0).pins, 0); /* the supply of that round released */
    assert_int_equal(world_stats(w, 1).slots_filling, 0);
    world_fini(w, false);
    free(w);
}

/* F10: a fetch after the lookup's supply expired fails at once. Mutation:
 * never unpin on the supply-pin timeout. */
static void test_F10_fetch_after_supply_expired(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    world_put(w, 0, 1, 0);
    wkeys_t ks;
    uint8_t res[1];
    wkeys_make(&ks, 1, 1);
    uint64_t op = do_lookup(w, 1, 0, 3, &ks, res);
    assert_non_null(world_wait(w, 1, KVP_EV_LOOKUP, op, 100 * MS));
    assert_int_equal(world_stats(w, 0).pins, 1);
    world_run(w, (uint64_t)w->cfg[0].supply_pin_ms * MS + 100 * MS);
    assert_int_equal(world_stats(w, 0).pins, 0); /* supply released */
    op = do_fetch(w, 1, 0, 3, &ks, 0);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 50 * MS);
    assert_non_null(e);
    assert_int_not_equal(e->status, KVP_OK);
    world_fini(w, false);
    free(w);
}

/* F11: fetch before supply: served when the supply commits; failed at once
 * when the source's request finishes. Mutation: ignore commits for parked
 * demand / do not fail parked demand at finish. */
static void test_F11_fetch_before_supply(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    wkeys_t ks;
    wkeys_make(&ks, 20, 3);
    uint64_t op = do_fetch(w, 1, 0, 42, &ks, KVP_FETCH_FLAG_WAIT_FOR_SUPPLY);
    world_run(w, 50 * MS);
    assert_null(world_event(w, 1, KVP_EV_LOAD, op)); /* parked */
    for (uint32_t k = 20; k < 23; k++)
        world_put(w, 0, k, 42);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 50 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    for (uint32_t k = 20; k < 23; k++)
        assert_true(world_verify(w, 1, k));

    wkeys_make(&ks, 30, 2);
    op = do_fetch(w, 1, 0, 43, &ks, KVP_FETCH_FLAG_WAIT_FOR_SUPPLY);
    world_run(w, 20 * MS);
    assert_int_equal(kvp_finish_request(w->node[0], 43), KVP_OK);
    e = world_wait(w, 1, KVP_EV_LOAD, op, 20 * MS);
    assert_non_null(e);
    assert_int_not_equal(e->status, KVP_OK);
    world_run(w, 10 * MS);
    assert_int_equal(world_stats(w, 1).slots_filling, 0);
    world_fini(w, false);
    free(w);
}

/* F7: the request finishes during an active load: exactly one failure
 * outcome, the destination slots stay FILLING until ABORT_ACK, then FREE.
 * Mutation: publish again at ABORT_ACK (double outcome) or free the slots at
 * finish (landing violation). */
static void test_F7_finish_during_load(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    for (uint32_t k = 0; k < 4; k++)
        world_put(w, 0, k, 0);
    wkeys_t ks;
    uint8_t res[4];
    wkeys_make(&ks, 0, 4);
    uint64_t op = do_lookup(w, 1, 0, 5, &ks, res);
    assert_non_null(world_wait(w, 1, KVP_EV_LOOKUP, op, 100 * MS));
    kvp_fake_script_t sc = kvp_fake_script_complete(80 * MS);
    assert_int_equal(kvp_fake_script_next(kvp__node_xport(w->node[0]), &sc), KVP_OK);
    op = do_fetch(w, 1, 0, 5, &ks, 0);
    world_run(w, 10 * MS);
    assert_int_equal(kvp_finish_request(w->node[1], 5), KVP_OK);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 5 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_CANCELED);
    assert_int_equal(world_stats(w, 1).slots_filling, 4); /* no proof yet */
    world_run(w, 200 * MS);
    assert_int_equal(world_event_count(w, 1, KVP_EV_LOAD, op), 1);
    kvp_stats_t s1 = world_stats(w, 1);
    assert_int_equal(s1.slots_filling, 0);
    assert_int_equal(s1.slots_quarantined, 0);
    assert_int_equal(s1.released_abort_ack, 4); /* the source acked once its copy stopped */
    assert_int_equal(s1.released_hold_cap, 0);
    assert_int_equal(world_stats(w, 0).pins, 0);
    world_fini(w, false);
    free(w);
}

/* F8: rounds of one request are isolated: fetching round 0 releases only its
 * own supply; round 1's supply stays pinned. Mutation: release supply by
 * request id instead of by round. */
static void test_F8_rounds_isolated(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    for (uint32_t k = 0; k < 4; k++)
        world_put(w, 0, k, 0);
    wkeys_t a, b;
    uint8_t ra[2], rb[2];
    wkeys_make(&a, 0, 2);
    wkeys_make(&b, 2, 2);
    uint64_t op = do_lookup(w, 1, 0, 8, &a, ra);
    assert_non_null(world_wait(w, 1, KVP_EV_LOOKUP, op, 100 * MS));
    uint64_t f0 = do_fetch(w, 1, 0, 8, &a, 0); /* round 0 */
    op = do_lookup(w, 1, 0, 8, &b, rb);        /* round 1 */
    assert_non_null(world_wait(w, 1, KVP_EV_LOOKUP, op, 100 * MS));
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, f0, 100 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    world_run(w, 10 * MS);
    assert_int_equal(world_stats(w, 0).pins, 2); /* round 1's supply untouched */
    uint64_t f1 = do_fetch(w, 1, 0, 8, &b, 0);
    e = world_wait(w, 1, KVP_EV_LOAD, f1, 100 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    for (uint32_t k = 0; k < 4; k++)
        assert_true(world_verify(w, 1, k));
    world_fini(w, false);
    free(w);
}

/* F14: submit and completion errors fail the round cleanly; nothing stays in
 * flight. Mutation: leave the round TRANSFERRING on submit failure. */
static void test_F14_transport_errors(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    for (uint32_t k = 0; k < 4; k++)
        world_put(w, 0, k, 0);
    wkeys_t ks;
    uint8_t res[2];
    kvp_xport_t *x0 = kvp__node_xport(w->node[0]);
    for (int pass = 0; pass < 2; pass++) {
        wkeys_make(&ks, (uint32_t)pass * 2, 2);
        uint64_t req = 100 + (uint64_t)pass;
        uint64_t op = do_lookup(w, 1, 0, req, &ks, res);
        assert_non_null(world_wait(w, 1, KVP_EV_LOOKUP, op, 100 * MS));
        kvp_fake_script_t sc =
            pass == 0 ? kvp_fake_script_fail_submit() : kvp_fake_script_fail(5 * MS, 1);
        kvp_fake_script_next(x0, &sc);
        op = do_fetch(w, 1, 0, req, &ks, 0);
        const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 100 * MS);
        assert_non_null(e);
        assert_int_not_equal(e->status, KVP_OK);
        world_run(w, 10 * MS);
        assert_int_equal(world_stats(w, 0).pins, 0);
        kvp_stats_t s1 = world_stats(w, 1);
        assert_int_equal(s1.slots_filling, 0);
        assert_int_equal(s1.slots_ready, 0);
    }
    world_fini(w, false);
    free(w);
}

/* F15: many peers share one data transport; polls are scoped per peer so no
 * completion is stolen. Mutation: an unscoped poll (poll all peers). */
static void test_F15_many_peers_share_transport(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 4, NULL);
    for (int c = 1; c < 4; c++)
        world_connect(w, c, 0);
    for (uint32_t k = 0; k < 12; k++)
        world_put(w, 0, k, 0);
    uint64_t ops[4];
    uint8_t res[4][4];
    wkeys_t ks[4];
    for (int c = 1; c < 4; c++) {
        wkeys_make(&ks[c], (uint32_t)(c - 1) * 4, 4);
        ops[c] = do_lookup(w, c, 0, 1, &ks[c], res[c]);
    }
    for (int c = 1; c < 4; c++)
        assert_non_null(world_wait(w, c, KVP_EV_LOOKUP, ops[c], 100 * MS));
    kvp_xport_t *x0 = kvp__node_xport(w->node[0]);
    for (int c = 1; c < 4; c++) {
        kvp_fake_script_t sc = kvp_fake_script_complete((uint64_t)(40 - 10 * c) * MS);
        kvp_fake_script_next(x0, &sc);
        ops[c] = do_fetch(w, c, 0, 1, &ks[c], 0);
    }
    for (int c = 1; c < 4; c++) {
        const kvp_event_t *e = world_wait(w, c, KVP_EV_LOAD, ops[c], 200 * MS);
        assert_non_null(e);
        assert_int_equal(e->status, KVP_OK);
        for (uint32_t k = 0; k < 4; k++)
            assert_true(world_verify(w, c, (uint32_t)(c - 1) * 4 + k));
    }
    assert_int_equal(world_stats(w, 0).blocks_out, 12);
    world_fini(w, false);
    free(w);
}

/* F18: incompatible peers are refused before registration. Mutation: skip
 * the fingerprint comparison. */
static void tweak_incompat(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    (void)s;
    if (i == 1)
        c->compat = "model-y/fp8/16tok";
}

static void test_F18_incompatible_refused(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, tweak_incompat);
    assert_int_equal(kvp_peer_add(w->node[1], w->addr[0]), KVP_OK);
    world_run(w, 300 * MS);
    assert_false(world_peer_ready(w, 1, 0));
    assert_false(world_peer_ready(w, 0, 1));
    assert_null(world_event(w, 0, KVP_EV_PEER_UP, 0));
    assert_int_equal(kvp_fake_call_count(kvp__node_xport(w->node[0]), KVP_FAKE_CALL_ADD_PEER), 0);
    world_fini(w, false);
    free(w);
}

/* F20: session cap and pin exhaustion refuse cleanly. Mutation: no cap. */
static void tweak_caps(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    (void)s;
    if (i == 0) {
        c->max_sessions = 1;
        c->max_pins = 3;
    }
}

static void test_F20_session_and_pin_exhaustion(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 3, tweak_caps);
    world_connect(w, 1, 0);
    assert_int_equal(kvp_peer_add(w->node[2], w->addr[0]), KVP_OK);
    world_run(w, 300 * MS);
    assert_false(world_peer_ready(w, 2, 0));
    assert_true(world_peer_ready(w, 1, 0)); /* the existing session is untouched */
    for (uint32_t k = 0; k < 5; k++)
        world_put(w, 0, k, 0);
    wkeys_t ks;
    uint8_t res[5];
    wkeys_make(&ks, 0, 5);
    uint64_t op = do_lookup(w, 1, 0, 1, &ks, res);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOOKUP, op, 100 * MS);
    assert_non_null(e);
    assert_int_equal(e->n_ok, 3); /* pins ran out: the rest answer MISS */
    world_fini(w, false);
    free(w);
}

/* F21: a block whose bytes do not match the source's checksum is failed,
 * counted and never committed. Mutation: commit without verifying. */
static void test_F21_checksum_mismatch(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    world_put(w, 0, 1, 0);
    world_put(w, 0, 2, 0);
    wkeys_t ks;
    uint8_t res[2];
    wkeys_make(&ks, 1, 2);
    uint64_t op = do_lookup(w, 1, 0, 1, &ks, res);
    assert_non_null(world_wait(w, 1, KVP_EV_LOOKUP, op, 100 * MS));
    /* Corrupt the source's copy of block 1 behind the store's back. */
    kvp_slot_ref_t ref;
    kvp_slot_state_t stt;
    uint8_t key[32];
    uint32_t kl = world_key(1, key);
    assert_int_equal(kvp_store_probe(kvp__node_store(w->node[0]), key, kl, &ref, &stt), KVP_OK);
    ((uint8_t *)kvp_store_slot_ptr(kvp__node_store(w->node[0]), ref.slot))[100] ^= 0xff;
    int32_t bs[2];
    assert_int_equal(kvp_fetch(w->node[1], w->addr[0], 1, ks.buf, ks.len, 2, 0, bs, &op), KVP_OK);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 100 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_CHECKSUM);
    assert_int_equal(e->n_ok, 1);
    assert_int_equal(bs[0], KVP_ERR_CHECKSUM);
    assert_int_equal(bs[1], KVP_OK);
    kvp_stats_t s1 = world_stats(w, 1);
    assert_int_equal(s1.checksum_mismatches, 1);
    assert_int_equal(s1.slots_ready, 1);
    kvp_block_t b;
    assert_int_equal(kvp_get(w->node[1], key, kl, &b), KVP_ERR_NOT_FOUND);
    assert_true(world_verify(w, 1, 2));
    world_fini(w, false);
    free(w);
}

/* F19 + F25: both sides dial each other at once, and a duplicate add: one
 * session survives on each side. Mutation: accept both connections. */
static void test_F25_simultaneous_dial(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    assert_int_equal(kvp_peer_add(w->node[0], w->addr[1]), KVP_OK);
    assert_int_equal(kvp_peer_add(w->node[1], w->addr[0]), KVP_OK);
    assert_int_equal(kvp_peer_add(w->node[1], w->addr[0]), KVP_OK);
    world_run(w, 500 * MS);
    kvp_peer_info_t pi[4];
    uint32_t n0 = 0, n1 = 0;
    kvp_node_peers(w->node[0], pi, 4, &n0);
    kvp_node_peers(w->node[1], pi, 4, &n1);
    assert_int_equal(n0, 1);
    assert_int_equal(n1, 1);
    assert_true(world_peer_ready(w, 0, 1));
    assert_int_equal(world_event_count(w, 0, KVP_EV_PEER_UP, 0), 1);
    assert_int_equal(world_event_count(w, 0, KVP_EV_PEER_DOWN, 0), 0);
    world_fini(w, false);
    free(w);
}

/* F13: a lookup never answered (the source went silent): the dead-after
 * deadline closes the session and the lookup answers MISS, long before any
 * load timeout. Mutation: no dead-after (the lookup would hang). */
static void test_F13_lookup_never_answered(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    world_put(w, 0, 1, 0);
    kvp_fake_net_partition(w->net, w->addr[0], w->addr[1], true);
    wkeys_t ks;
    uint8_t res[1] = {0xee};
    wkeys_make(&ks, 1, 1);
    uint64_t op = do_lookup(w, 1, 0, 1, &ks, res);
    uint64_t t0 = kvp_clock_now(&w->mc.clock);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOOKUP, op, 2000 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_UNREACHABLE);
    assert_int_equal(res[0], KVP_LOOKUP_MISS);
    assert_true(kvp_clock_now(&w->mc.clock) - t0 <= (uint64_t)w->cfg[1].dead_after_ms * MS + 20 * MS);
    assert_non_null(world_event(w, 1, KVP_EV_PEER_DOWN, 0));
    kvp_fake_net_partition(w->net, w->addr[0], w->addr[1], false);
    world_fini(w, false);
    free(w);
}

static void tweak_idle(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    (void)s;
    (void)i;
    c->idle_session_ms = 500;
}

/* Idle session timeout (SPEC §8): a session without work is closed
 * gracefully; the next lookup dials again. Mutation: never close idle
 * sessions (no PEER_DOWN). */
/* kvp_node_stall_ms (kvpeerd's /healthz): the age of the last completed
 * progress round, on the real clock, never blocking. Caller-driven here, so
 * a caller that stops progressing is exactly a stuck loop. */
static void test_stall_ms(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 1, NULL);
    assert_int_equal(kvp_node_progress(w->node[0], 0), KVP_OK);
    assert_true(kvp_node_stall_ms(w->node[0]) < 1000 * kvp_test_time_scale());
    struct timespec ts = {0, 60 * 1000 * 1000};
    nanosleep(&ts, NULL); /* no progress meanwhile */
    assert_true(kvp_node_stall_ms(w->node[0]) >= 55);
    assert_int_equal(kvp_node_progress(w->node[0], 0), KVP_OK);
    assert_true(kvp_node_stall_ms(w->node[0]) < 55);
    assert_int_equal(kvp_node_stall_ms(NULL), 0);
    world_fini(w, false);
    free(w);
}

static void test_idle_session_closed_then_redialled(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, tweak_idle);
    world_connect(w, 1, 0);
    world_put(w, 0, 1, 0);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_PEER_DOWN, 0, 1000 * MS);
    assert_non_null(e);
    assert_int_equal(e->fault, 0);
    world_run(w, 300 * MS);
    assert_false(world_peer_ready(w, 1, 0)); /* not redialled without work */
    wkeys_t ks;
    uint8_t res[1];
    uint64_t op;
    wkeys_make(&ks, 1, 1);
    assert_int_equal(kvp_lookup(w->node[1], w->addr[0], 1, ks.buf, ks.len, 1, res, &op),
                     KVP_ERR_UNREACHABLE);
    world_run(w, 100 * MS); /* the lookup's want dialled again */
    assert_true(world_peer_ready(w, 1, 0));
    assert_int_equal(kvp_lookup(w->node[1], w->addr[0], 1, ks.buf, ks.len, 1, res, &op), KVP_OK);
    e = world_wait(w, 1, KVP_EV_LOOKUP, op, 100 * MS);
    assert_non_null(e);
    assert_int_equal(e->n_ok, 1);
    world_fini(w, false);
    free(w);
}

/* Bad input from an API caller: clear status, no event, nothing changes. */
static void test_api_bad_input(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 1, NULL);
    kvp_node_t *n = w->node[0];
    uint8_t key[65] = {0}, res[1];
    uint32_t len0 = 0, len65 = 65, len1 = 1;
    uint64_t op;
    kvp_block_t b;
    assert_int_equal(kvp_put(n, key, 0, key, 1, 0), KVP_ERR_INVALID);
    assert_int_equal(kvp_put(n, key, 65, key, 1, 0), KVP_ERR_INVALID);
    assert_int_equal(kvp_put(n, key, 1, NULL, 1, 0), KVP_ERR_INVALID);
    assert_int_equal(kvp_put(n, key, 1, key, 8192, 0), KVP_ERR_INVALID);
    assert_int_equal(kvp_get(n, key, 0, &b), KVP_ERR_INVALID);
    assert_int_equal(kvp_lookup(n, "x:1", 1, key, &len0, 1, res, &op), KVP_ERR_INVALID);
    assert_int_equal(kvp_lookup(n, "x:1", 1, key, &len65, 1, res, &op), KVP_ERR_INVALID);
    assert_int_equal(kvp_lookup(n, NULL, 1, key, &len1, 1, res, &op), KVP_ERR_INVALID);
    assert_int_equal(kvp_lookup(n, "x:1", 1, key, &len1, 1, res, &op), KVP_ERR_UNREACHABLE);
    assert_int_equal(kvp_fetch(n, "x:1", 1, key, &len1, 1, 99, NULL, &op), KVP_ERR_INVALID);
    assert_int_equal(kvp_cancel(n, 12345), KVP_ERR_NOT_FOUND);
    kvp_config_t c;
    kvp_config_init(&c);
    c.block_size = 1000;
    kvp_node_t *bad = NULL;
    assert_int_equal(kvp_node_create(&c, &bad), KVP_ERR_INVALID);
    assert_null(bad);
    world_run(w, 10 * MS);
    assert_int_equal(w->nev[0], 0);
    world_fini(w, false);
    free(w);
}

static int teardown_free(void **state)
{
    (void)state;
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_lookup_fetch_roundtrip, teardown_free),
        cmocka_unit_test_teardown(test_F9_unsupplied_demand_fails_at_once, teardown_free),
        cmocka_unit_test_teardown(test_F10_fetch_after_supply_expired, teardown_free),
        cmocka_unit_test_teardown(test_F11_fetch_before_supply, teardown_free),
        cmocka_unit_test_teardown(test_F7_finish_during_load, teardown_free),
        cmocka_unit_test_teardown(test_F8_rounds_isolated, teardown_free),
        cmocka_unit_test_teardown(test_F14_transport_errors, teardown_free),
        cmocka_unit_test_teardown(test_F15_many_peers_share_transport, teardown_free),
        cmocka_unit_test_teardown(test_F18_incompatible_refused, teardown_free),
        cmocka_unit_test_teardown(test_F20_session_and_pin_exhaustion, teardown_free),
        cmocka_unit_test_teardown(test_F21_checksum_mismatch, teardown_free),
        cmocka_unit_test_teardown(test_F25_simultaneous_dial, teardown_free),
        cmocka_unit_test_teardown(test_F13_lookup_never_answered, teardown_free),
        cmocka_unit_test_teardown(test_stall_ms, teardown_free),
        cmocka_unit_test_teardown(test_idle_session_closed_then_redialled, teardown_free),
        cmocka_unit_test_teardown(test_api_bad_input, teardown_free),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
