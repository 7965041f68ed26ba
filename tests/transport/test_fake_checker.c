/* test_fake_checker.c -- the landing checker of the fake transport can fail:
 * scenarios that misbehave on purpose (reuse a destination slot before a late
 * copy lands, unpin or evict a source under a running transfer, close the
 * destination) must record a violation; the same scenarios done correctly
 * (quarantine; keep the pin until terminal) must record none. Each test
 * names the checker mutation that would make it fail. */
#include "fake_fix.h"

#define X(i) (f->n[i].x)
#define OPS(i) (f->n[i].x->ops)

/* Reserve every slot of node i but one, so the next reserve after freeing a
 * slot gets that very slot back (with a new generation). */
static void fill_all_but_one(fix_t *f, int i)
{
    char key[16];
    for (uint32_t k = 0; k < NB - 1; k++) {
        snprintf(key, sizeof(key), "fill%u", k);
        (void)dst_block(f, i, key);
    }
}

typedef struct scen {
    kvp_xpeer_id_t p;
    kvp_slot_ref_t s, d;
    kvp_xfer_id_t id;
} scen_t;

/* A transfer from node 0 into node 1 whose handle is wedged but whose bytes
 * land at +5 ms (the WRITE cannot be recalled). */
static void start_late(fix_t *f, scen_t *sc)
{
    fill_all_but_one(f, 1);
    sc->p = connect_to(f, 0, 1);
    kvp_fake_script_t s = kvp_fake_script_wedge_then_copy(5 * MS);
    assert_int_equal(kvp_fake_script_next(X(0), &s), KVP_OK);
    sc->s = src_block(f, 0, "blk", 0xc3);
    sc->d = dst_block(f, 1, "blk");
    kvp_xfer_block_t b = blk(sc->s, sc->d);
    assert_int_equal(OPS(0)->write(X(0), sc->p, &b, 1, &sc->id), KVP_OK);
}

static void cancel_and_close(fix_t *f, scen_t *sc)
{
    kvp_fake_xfer_info_t in;
    if (kvp_fake_xfer_info(X(0), sc->id, &in) == KVP_OK && in.tracked)
        assert_int_equal(OPS(0)->cancel(X(0), &sc->id, 1, KVP_CANCEL_IMMEDIATE, NULL, NULL),
                         KVP_OK);
    fix_close(f);
}

/* Wrong on purpose: abandon + re-reserve the destination before the late
 * copy lands. Mutation: check_dst ignores the generation. */
static void test_dst_reused_is_violation(void **state)
{
    fix_t fx, *f = &fx;
    scen_t sc;
    fix_open(f, 2, KVP_PATH_FAKE_UNFENCEABLE);
    start_late(f, &sc);
    assert_int_equal(OPS(0)->cancel(X(0), &sc.id, 1, KVP_CANCEL_IMMEDIATE, NULL, NULL), KVP_OK);
    assert_int_equal(kvp_store_abandon(f->n[1].s, sc.d), KVP_OK);
    kvp_slot_ref_t again = dst_block(f, 1, "someone-else");
    assert_int_equal(again.slot, sc.d.slot);
    assert_true(again.gen != sc.d.gen);
    uint64_t errs = f->cap.count[KVP_LOG_ERROR];
    advance(f, 5 * MS);
    assert_int_equal(violations(f), 1);
    const kvp_fake_violation_t *v;
    kvp_fake_violations(f->fab, &v);
    assert_int_equal(v[0].kind, KVP_FAKE_V_DST_STALE);
    assert_int_equal(v[0].xfer, sc.id);
    assert_int_equal(v[0].dst_slot, sc.d.slot);
    assert_int_equal(v[0].src_slot, sc.s.slot);
    assert_int_equal(v[0].expected_gen, sc.d.gen);
    assert_int_equal(v[0].actual_gen, again.gen);
    assert_int_equal(v[0].actual_state, KVP_SLOT_FILLING);
    assert_int_equal(v[0].src_ep, kvp_fake_endpoint_id(X(0)));
    assert_int_equal(v[0].dst_ep, kvp_fake_endpoint_id(X(1)));
    assert_int_equal(v[0].at_ns, 1000 + 5 * MS);
    assert_true(f->cap.count[KVP_LOG_ERROR] > errs);
    assert_non_null(strstr(f->cap.last[KVP_LOG_ERROR], "I1"));
    assert_true(slot_is(f, 1, sc.d.slot, 0xc3)); /* the corruption happened */
    kvp_fake_violations_clear(f->fab);
    assert_int_equal(violations(f), 0);
    cancel_and_close(f, &sc);
}

/* Wrong on purpose: abandon only (FREE, same generation). Mutation:
 * check_dst accepts any state when the generation matches. */
static void test_dst_freed_is_violation(void **state)
{
    fix_t fx, *f = &fx;
    scen_t sc;
    fix_open(f, 2, KVP_PATH_FAKE_UNFENCEABLE);
    start_late(f, &sc);
    assert_int_equal(kvp_store_abandon(f->n[1].s, sc.d), KVP_OK);
    advance(f, 5 * MS);
    assert_int_equal(violations(f), 1);
    assert_int_equal(violation_kind(f, 0), KVP_FAKE_V_DST_STATE);
    const kvp_fake_violation_t *v;
    kvp_fake_violations(f->fab, &v);
    assert_int_equal(v[0].actual_state, KVP_SLOT_FREE);
    assert_int_equal(v[0].actual_gen, sc.d.gen);
    cancel_and_close(f, &sc);
}

/* Right: the outcome is unknown, so the slot is QUARANTINED; the late copy
 * lands there legally. Mutation: check_dst refuses QUARANTINED. */
static void test_dst_quarantined_is_legal(void **state)
{
    fix_t fx, *f = &fx;
    scen_t sc;
    fix_open(f, 2, KVP_PATH_FAKE_UNFENCEABLE);
    start_late(f, &sc);
    assert_int_equal(OPS(0)->cancel(X(0), &sc.id, 1, KVP_CANCEL_IMMEDIATE, NULL, NULL), KVP_OK);
    assert_int_equal(kvp_store_quarantine(f->n[1].s, sc.d), KVP_OK);
    advance(f, 5 * MS);
    assert_true(slot_is(f, 1, sc.d.slot, 0xc3));
    assert_int_equal(violations(f), 0);
    /* after the copy (proof in a real system) it may be released */
    assert_int_equal(kvp_store_release_quarantined(f->n[1].s, sc.d, false), KVP_OK);
    cancel_and_close(f, &sc);
}

/* Wrong on purpose: the source drops the transfer's pin while it runs.
 * Mutation: check_src ignores pins. */
static void test_src_unpinned_is_violation(void **state)
{
    fix_t fx, *f = &fx;
    scen_t sc;
    fix_open(f, 2, KVP_PATH_FAKE_FENCEABLE);
    start_late(f, &sc);
    assert_int_equal(kvp_store_unpin(f->n[0].s, sc.s), KVP_OK);
    advance(f, 5 * MS);
    assert_int_equal(violations(f), 1);
    const kvp_fake_violation_t *v;
    kvp_fake_violations(f->fab, &v);
    assert_int_equal(v[0].kind, KVP_FAKE_V_SRC_UNPINNED);
    assert_int_equal(v[0].src_slot, sc.s.slot);
    assert_int_equal(v[0].actual_pins, 0);
    assert_int_equal(v[0].actual_state, KVP_SLOT_READY);
    assert_non_null(strstr(f->cap.last[KVP_LOG_ERROR], "I2"));
    cancel_and_close(f, &sc);
}

/* Wrong on purpose: unpin, evict and rewrite the source slot under a
 * running transfer. Mutation: check_src ignores the generation / state. */
static void test_src_evicted_is_violation(void **state)
{
    fix_t fx, *f = &fx;
    scen_t sc;
    fix_open(f, 2, KVP_PATH_FAKE_FENCEABLE);
    fill_all_but_one(f, 0);
    start_late(f, &sc);
    assert_int_equal(kvp_store_unpin(f->n[0].s, sc.s), KVP_OK);
    assert_int_equal(kvp_store_evict_one(f->n[0].s), KVP_OK);
    kvp_slot_info_t info;
    assert_int_equal(kvp_store_slot_info(f->n[0].s, sc.s.slot, &info), KVP_OK);
    assert_int_equal(info.state, KVP_SLOT_FREE);
    /* evicted (FREE, same generation) when the copy lands: wrong state */
    advance(f, 5 * MS);
    assert_int_equal(violations(f), 1);
    assert_int_equal(violation_kind(f, 0), KVP_FAKE_V_SRC_STATE);
    /* a second transfer of the same block; the slot is then rewritten under
     * another key (new generation) before its copy lands */
    kvp_fake_script_t s = kvp_fake_script_wedge_then_copy(5 * MS);
    assert_int_equal(kvp_fake_script_next(X(0), &s), KVP_OK);
    kvp_xfer_block_t b = blk(sc.s, sc.d);
    kvp_xfer_id_t id2;
    assert_int_equal(OPS(0)->write(X(0), sc.p, &b, 1, &id2), KVP_OK);
    kvp_slot_ref_t other = src_block(f, 0, "other", 0x01);
    assert_int_equal(other.slot, sc.s.slot);
    advance(f, 5 * MS);
    assert_int_equal(violations(f), 2);
    assert_int_equal(violation_kind(f, 1), KVP_FAKE_V_SRC_STALE);
    assert_true(slot_is(f, 1, sc.d.slot, 0x01)); /* the wrong bytes landed */
    assert_int_equal(OPS(0)->cancel(X(0), &id2, 1, KVP_CANCEL_IMMEDIATE, NULL, NULL), KVP_OK);
    cancel_and_close(f, &sc);
}

/* Right: the source keeps the pin until the transport hands the transfer
 * back as terminal, then unpins. Mutation: apply_copy checks after the
 * terminal event instead of at the copy (would see the pin dropped). */
static void test_src_pin_kept_until_terminal_is_clean(void **state)
{
    fix_t fx, *f = &fx;
    fix_open(f, 2, KVP_PATH_FAKE_FENCEABLE);
    kvp_xpeer_id_t p = connect_to(f, 0, 1);
    kvp_slot_ref_t s = src_block(f, 0, "k", 0x42), d = dst_block(f, 1, "k");
    kvp_xfer_block_t b = blk(s, d);
    kvp_xfer_id_t id;
    kvp_fake_script_t sc = kvp_fake_script_complete(2 * MS);
    assert_int_equal(kvp_fake_script_next(X(0), &sc), KVP_OK);
    assert_int_equal(OPS(0)->write(X(0), p, &b, 1, &id), KVP_OK);
    kvp_xfer_result_t r;
    while (poll_n(f, 0, p, &r, 1) == 0)
        advance(f, MS / 2);
    assert_int_equal(r.id, id);
    assert_int_equal(kvp_store_unpin(f->n[0].s, s), KVP_OK);
    assert_int_equal(kvp_store_commit(f->n[1].s, d), KVP_OK);
    assert_true(slot_is(f, 1, d.slot, 0x42));
    assert_int_equal(violations(f), 0);
    fix_close(f);
}

/* Wrong on purpose: the destination node closes its transport (and may
 * free its region) while a WRITE into it is still on its way. Mutation:
 * apply_copy writes into a closed endpoint's region. */
static void test_dst_closed_is_violation(void **state)
{
    fix_t fx, *f = &fx;
    scen_t sc;
    fix_open(f, 2, KVP_PATH_FAKE_FENCEABLE);
    start_late(f, &sc);
    assert_int_equal(OPS(1)->close(X(1), false), KVP_OK); /* it holds no transfer */
    f->n[1].x = NULL;
    advance(f, 5 * MS);
    assert_int_equal(violations(f), 1);
    assert_int_equal(violation_kind(f, 0), KVP_FAKE_V_DST_CLOSED);
    assert_true(slot_is(f, 1, sc.d.slot, 0)); /* nothing written */
    kvp_fake_counters_t c;
    kvp_fake_get_counters(X(0), &c);
    assert_int_equal(c.blocks_dst_closed, 1);
    assert_int_equal(c.blocks_landed, 0);
    /* writes posted after the close fail like a disconnect, no violation */
    kvp_xfer_block_t b = blk(sc.s, sc.d);
    kvp_xfer_id_t id2;
    assert_int_equal(OPS(0)->write(X(0), sc.p, &b, 1, &id2), KVP_OK);
    advance(f, MS);
    kvp_xfer_result_t r[2];
    assert_int_equal(poll_n(f, 0, sc.p, r, 2), 1);
    assert_int_equal(r[0].id, id2);
    assert_int_equal(r[0].status, KVP_ERR_UNREACHABLE);
    assert_int_equal(violations(f), 1);
    assert_string_equal(kvp_fake_violation_kind_str(KVP_FAKE_V_DST_CLOSED),
                        "destination transport closed");
    cancel_and_close(f, &sc);
}

/* Without stores the checker has nothing to check: a landing is never
 * reported as a violation. Mutation: check_dst dereferences a NULL store. */
static void test_no_store_no_checks(void **state)
{
    fix_t fx, *f = &fx;
    memset(f, 0, sizeof(*f));
    kvp_manual_clock_init(&f->clk, 1000);
    kvp_test_logcap_start(&f->cap);
    assert_int_equal(kvp_fake_fabric_create(&f->clk.clock, &f->fab), KVP_OK);
    node_open(f, 0, KVP_PATH_FAKE_FENCEABLE, false);
    node_open(f, 1, KVP_PATH_FAKE_FENCEABLE, false);
    kvp_xpeer_id_t p = connect_to(f, 0, 1);
    kvp_xfer_block_t b = {0, 99, 0, 99};
    kvp_xfer_id_t id;
    assert_int_equal(OPS(0)->write(X(0), p, &b, 1, &id), KVP_OK);
    advance(f, MS);
    assert_int_equal(violations(f), 0);
    kvp_fake_counters_t c;
    kvp_fake_get_counters(X(0), &c);
    assert_int_equal(c.blocks_landed, 1);
    kvp_xfer_result_t r;
    assert_int_equal(poll_n(f, 0, p, &r, 1), 1);
    fix_close(f);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_dst_reused_is_violation),
    cmocka_unit_test(test_dst_freed_is_violation),
    cmocka_unit_test(test_dst_quarantined_is_legal),
    cmocka_unit_test(test_src_unpinned_is_violation),
    cmocka_unit_test(test_src_evicted_is_violation),
    cmocka_unit_test(test_src_pin_kept_until_terminal_is_clean),
    cmocka_unit_test(test_dst_closed_is_violation),
    cmocka_unit_test(test_no_store_no_checks),
};

int main(void)
{
    return cmocka_run_group_tests(tests, NULL, NULL);
}
