/*
 * test_node_landing.c -- FETCH_DONE overtaking its blocks on an AM path
 * (issue 17): the load waits LANDING, asynchronously, on the fake's AM
 * model (KVP_PATH_FAKE_AM: copies into the consumer land only in slots it
 * expects; a source transfer scripted LATE reports DONE -- so FETCH_DONE
 * leaves -- before its bytes land).
 *
 *   slow landing      another session's fetch completes while the first
 *                     load still waits for its blocks; then the first one
 *                     completes byte-exact.
 *   missing block     a block that never lands fails the load with
 *                     KVP_ERR_TRANSPORT, not before the landing bound, and
 *                     its slot is released (no FILLING left); the landed
 *                     one of the same load is committed.
 *   session down      the session goes while a load is LANDING: one
 *                     outcome, nothing held, the late copy is dropped.
 *
 * Each fails with KVP_MUT_AM_SKIP_AWAIT (FETCH_DONE commits at once: the
 * slots hold no data yet and fail their checksum).
 */
#include "world.h"

#define MS KVP_NSEC_PER_MSEC
#define LAND_BOUND (2000 * MS) /* KVP_AM_LAND_WAIT_NS in client.c */

static void tweak_am(kvp_config_t *cfg, kvp_node_seams_t *seams, int i)
{
    (void)cfg;
    (void)i;
    seams->fake_path = KVP_PATH_FAKE_AM;
}

static int teardown_world(void **state)
{
    free(*state);
    *state = NULL;
    return 0;
}

/* Node 1 consumes from node 0 and node 2. */
static void world_am3(world_t *w)
{
    world_init(w, 3, tweak_am);
    world_connect(w, 1, 0);
    world_connect(w, 1, 2);
}

/* Keys 1 and 2 on node 0, looked up by node 1 (request 7); node 0's next
 * transfer reports DONE after 1 ms and its bytes land after 300 ms. */
static world_t *world_late_pair(void **state, wkeys_t *ka)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_am3(w);
    world_put(w, 0, 1, 0);
    world_put(w, 0, 2, 0);
    wkeys_make(ka, 1, 2);
    world_lookup_hits(w, 1, 0, ka, 7);
    kvp_fake_script_t sc = kvp_fake_script_late(1 * MS, 300 * MS, KVP_OK);
    assert_int_equal(kvp_fake_script_next(kvp__node_xport(w->node[0]), &sc), KVP_OK);
    return w;
}

static void test_slow_landing_does_not_block_other_session(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_am3(w);
    wkeys_t ka, kb;
    for (uint32_t k = 1; k <= 4; k++)
        world_put(w, 0, k, 0);
    for (uint32_t k = 11; k <= 14; k++)
        world_put(w, 2, k, 0);
    wkeys_make(&ka, 1, 4);
    wkeys_make(&kb, 11, 4);
    world_lookup_hits(w, 1, 0, &ka, 7);
    world_lookup_hits(w, 1, 2, &kb, 8);
    /* Source 0 reports DONE after 1 ms; its bytes land after 300 ms. */
    kvp_fake_script_t sc = kvp_fake_script_late(1 * MS, 300 * MS, KVP_OK);
    assert_int_equal(kvp_fake_script_next(kvp__node_xport(w->node[0]), &sc), KVP_OK);
    uint64_t opa, opb;
    assert_int_equal(kvp_fetch(w->node[1], w->addr[0], 7, ka.buf, ka.len, 4, 0, NULL, &opa), KVP_OK);
    world_run(w, 20 * MS); /* FETCH_DONE of A is in: A waits LANDING */
    assert_null(world_event(w, 1, KVP_EV_LOAD, opa));
    uint64_t t0 = kvp_clock_now(&w->mc.clock);
    assert_int_equal(kvp_fetch(w->node[1], w->addr[2], 8, kb.buf, kb.len, 4, 0, NULL, &opb), KVP_OK);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, opb, 100 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    assert_int_equal(e->n_ok, 4);
    assert_true(kvp_clock_now(&w->mc.clock) - t0 < 50 * MS);
    assert_null(world_event(w, 1, KVP_EV_LOAD, opa)); /* still landing */
    assert_int_equal(world_stats(w, 1).slots_filling, 4);
    e = world_wait(w, 1, KVP_EV_LOAD, opa, 500 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    assert_int_equal(e->n_ok, 4);
    for (uint32_t k = 1; k <= 4; k++)
        assert_true(world_verify(w, 1, k));
    for (uint32_t k = 11; k <= 14; k++)
        assert_true(world_verify(w, 1, k));
    assert_int_equal(world_stats(w, 1).slots_filling, 0);
    world_fini(w, false);
}

static void test_missing_block_fails_after_bound(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_am3(w);
    wkeys_t ka;
    world_put(w, 0, 1, 0);
    world_put(w, 0, 2, 0);
    wkeys_make(&ka, 1, 2);
    world_lookup_hits(w, 1, 0, &ka, 7);
    /* DONE after 1 ms; only the first block ever lands (at 5 ms). */
    kvp_fake_script_t sc = {KVP_FAKE_LATE, 1 * MS, 5 * MS, 1, KVP_OK};
    assert_int_equal(kvp_fake_script_next(kvp__node_xport(w->node[0]), &sc), KVP_OK);
    int32_t bst[2] = {1, 1};
    uint64_t op;
    uint64_t t0 = kvp_clock_now(&w->mc.clock);
    assert_int_equal(kvp_fetch(w->node[1], w->addr[0], 7, ka.buf, ka.len, 2, 0, bst, &op), KVP_OK);
    world_run(w, LAND_BOUND - 100 * MS);
    assert_null(world_event(w, 1, KVP_EV_LOAD, op)); /* within the bound: still waiting */
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 500 * MS);
    assert_non_null(e);
    assert_true(kvp_clock_now(&w->mc.clock) - t0 >= LAND_BOUND);
    assert_int_equal(e->status, KVP_ERR_TRANSPORT);
    assert_int_equal(e->n_ok, 1);
    assert_int_equal(bst[0], KVP_OK);
    assert_int_equal(bst[1], KVP_ERR_TRANSPORT);
    assert_true(world_verify(w, 1, 1));
    kvp_stats_t st = world_stats(w, 1);
    assert_int_equal(st.slots_filling, 0);
    assert_int_equal(st.slots_quarantined, 0);
    world_fini(w, false);
}

/* kvp_fetch's block_status is caller-owned "like results": once the load's
 * event is out the caller may reuse it. A load cancelled while LANDING has
 * its outcome (CANCELED) published at once; its blocks land and settle
 * later, and that settling must not write the array. Mutation: drop the
 * reset of l->block_status in kvp__load_publish. */
static void test_block_status_untouched_after_event(void **state)
{
    wkeys_t ka;
    world_t *w = world_late_pair(state, &ka);
    int32_t bst[2] = {1, 1};
    uint64_t op;
    assert_int_equal(kvp_fetch(w->node[1], w->addr[0], 7, ka.buf, ka.len, 2, 0, bst, &op), KVP_OK);
    world_run(w, 20 * MS); /* FETCH_DONE is in: the load waits LANDING */
    assert_null(world_event(w, 1, KVP_EV_LOAD, op));
    assert_int_equal(kvp_cancel(w->node[1], op), KVP_OK);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 5 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_CANCELED);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(bst[i], KVP_ERR_CANCELED); /* decided with the event */
        bst[i] = 777;                               /* the caller reuses it */
    }
    world_run(w, 500 * MS); /* the blocks land, the load settles */
    kvp_stats_t st = world_stats(w, 1);
    assert_int_equal(st.slots_filling, 0);
    assert_int_equal(st.slots_quarantined, 0);
    assert_int_equal(world_event_count(w, 1, KVP_EV_LOAD, op), 1);
    for (int i = 0; i < 2; i++)
        assert_int_equal(bst[i], 777);
    world_fini(w, false);
}

static void test_session_down_while_landing(void **state)
{
    wkeys_t ka;
    world_t *w = world_late_pair(state, &ka);
    uint64_t op;
    assert_int_equal(kvp_fetch(w->node[1], w->addr[0], 7, ka.buf, ka.len, 2, 0, NULL, &op), KVP_OK);
    world_run(w, 20 * MS);
    assert_null(world_event(w, 1, KVP_EV_LOAD, op)); /* LANDING */
    assert_int_equal(kvp_peer_remove(w->node[1], w->addr[0]), KVP_OK);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 50 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_TRANSPORT);
    assert_int_equal(e->n_ok, 0);
    kvp_stats_t st = world_stats(w, 1);
    assert_int_equal(st.slots_filling, 0);
    assert_int_equal(st.slots_quarantined, 0);
    world_run(w, 400 * MS); /* the late copy comes: refused, dropped */
    assert_int_equal(world_event_count(w, 1, KVP_EV_LOAD, op), 1);
    assert_true(world_stats(w, 1).late_bytes_dropped >= 2 * w->cfg[1].block_size);
    world_fini(w, false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_slow_landing_does_not_block_other_session, teardown_world),
        cmocka_unit_test_teardown(test_missing_block_fails_after_bound, teardown_world),
        cmocka_unit_test_teardown(test_session_down_while_landing, teardown_world),
        cmocka_unit_test_teardown(test_block_status_untouched_after_event, teardown_world),
    };
    const char *m = getenv("KVPEER_TEST_MUTATION"); /* show the tests catch it */
    if (m != NULL)
        kvp__mutation = atoi(m);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
