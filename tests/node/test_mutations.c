/*
 * test_mutations.c -- directed checks for the mutation switches the
 * simulator does not reach by itself: each scenario runs once correctly
 * (the rule holds) and once with the mutation on (the rule is seen broken).
 * The simulator covers cancel-immediate-at-close, unpin-at-close,
 * release-quarantine-at-once and skip-checksum (tests/node/test_sim.c).
 */
#include "world.h"
#include "session/session_int.h" /* the load behind an op id */

#define MS KVP_NSEC_PER_MSEC

/* The load with this op id on any session of n, or NULL. */
static kvp_load_t *find_load(kvp_node_t *n, uint64_t op_id)
{
    for (kvp_list_t *p = n->sessions.next; p != &n->sessions; p = p->next) {
        kvp_load_t *l = kvp__client_find_load(KVP_SESSION_OF(p, node_link), op_id);
        if (l != NULL)
            return l;
    }
    return NULL;
}

/* I3 with accept-stale-epoch: while a cancelled load waits for its
 * ABORT_ACK, a forged ABORT_ACK carrying another incarnation's epoch must not
 * free the consumer's slots while the WRITE is still on its way. Returns the
 * landing violations seen. */
static size_t stale_ack_scenario(int mutation)
{
    world_t *w = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    wkeys_t ks;
    uint8_t res[2];
    uint64_t op;
    world_put(w, 0, 1, 0);
    world_put(w, 0, 2, 0);
    wkeys_make(&ks, 1, 2);
    assert_int_equal(kvp_lookup(w->node[1], w->addr[0], 5, ks.buf, ks.len, 2, res, &op), KVP_OK);
    assert_non_null(world_wait(w, 1, KVP_EV_LOOKUP, op, 100 * MS));
    kvp_fake_script_t sc = kvp_fake_script_complete(60 * MS);
    kvp_fake_script_next(kvp__node_xport(w->node[0]), &sc);
    assert_int_equal(kvp_fetch(w->node[1], w->addr[0], 5, ks.buf, ks.len, 2, 0, NULL, &op), KVP_OK);
    world_run(w, 5 * MS);
    kvp_session_t *s = kvp__node_find_session(w->node[0], w->addr[1]);
    kvp_load_t *l = find_load(w->node[1], op);
    assert_non_null(s);
    assert_non_null(l);
    /* The engine cancels: ABORT is on its way and the slots wait for the
     * real ABORT_ACK, which the source sends only once the WRITE ended. */
    assert_int_equal(kvp_cancel(w->node[1], op), KVP_OK);
    kvp_epoch_t bogus;
    kvp_epoch_new(&bogus);
    kvp_msg_t m = {.type = KVP_MSG_ABORT_ACK};
    m.u.abort.request_id = 5;
    m.u.abort.round = l->round;
    kvp__mutation = mutation;
    assert_int_equal(
        kvp_link_send_epochs(s->link, &m, &bogus, kvp_link_remote_epoch(s->link)), KVP_OK);
    world_run(w, 200 * MS);
    kvp__mutation = KVP_MUT_NONE;
    size_t v = world_violations(w);
    kvp_fake_violations_clear(w->fab);
    world_fini(w, false);
    free(w);
    return v;
}

static void test_mutation_accept_stale_epoch(void **state)
{
    (void)state;
    assert_int_equal(stale_ack_scenario(KVP_MUT_NONE), 0);
    assert_true(stale_ack_scenario(KVP_MUT_ACCEPT_STALE_EPOCH) > 0);
}

/* SPEC §7.4 with skip-suspect-verify: a slot released by the hold cap is
 * suspect; a late WRITE lands after it was reused and committed; the next
 * acquire must detect it. Returns whether the corrupt block was served. */
static bool suspect_scenario(int mutation)
{
    kvp_manual_clock_t mc;
    kvp_manual_clock_init(&mc, KVP_NSEC_PER_SEC);
    kvp_store_config_t sc = {.num_blocks = 1, .block_size = 4096, .clock = &mc.clock,
                             .suspect_period_ns = 10 * KVP_NSEC_PER_SEC};
    kvp_store_t *st;
    kvp_slot_ref_t ref;
    void *ptr;
    const void *rptr;
    assert_int_equal(kvp_store_create(&sc, &st), KVP_OK);
    assert_int_equal(kvp_store_reserve(st, "a", 1, KVP_STORE_RESERVE_REMOTE, &ref, &ptr), KVP_OK);
    assert_int_equal(kvp_store_quarantine(st, ref), KVP_OK);
    assert_int_equal(kvp_store_release_quarantined(st, ref, true), KVP_OK); /* by the cap */
    assert_int_equal(kvp_store_reserve(st, "b", 1, KVP_STORE_RESERVE_REMOTE, &ref, &ptr), KVP_OK);
    memset(ptr, 7, 4096);
    assert_int_equal(kvp_store_commit(st, ref), KVP_OK);
    memset(ptr, 9, 100); /* the late WRITE of the old load lands */
    kvp__mutation = mutation;
    kvp_status_t rc = kvp_store_lookup(st, "b", 1, &ref, &rptr, NULL);
    kvp__mutation = KVP_MUT_NONE;
    bool served_corrupt = rc == KVP_OK && ((const uint8_t *)rptr)[0] == 9;
    if (rc == KVP_OK)
        kvp_store_unpin(st, ref);
    kvp_store_destroy(st);
    return served_corrupt;
}

static void test_mutation_skip_suspect_verify(void **state)
{
    (void)state;
    assert_false(suspect_scenario(KVP_MUT_NONE));
    assert_true(suspect_scenario(KVP_MUT_SKIP_SUSPECT_VERIFY));
    KVP_TEST_ASSERT_NO_LEAKS();
}

int main(void)
{
    kvp_log_set_level(KVP_LOG_WARN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mutation_accept_stale_epoch),
        cmocka_unit_test(test_mutation_skip_suspect_verify),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
