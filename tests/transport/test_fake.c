/* test_fake.c -- the fake data transport: every operation and script, poll
 * scoping, cancel modes, retire/remove, fence, close, bad input. Each test
 * names the mutation of fake.c that would make it fail. Landing-checker
 * tests are in test_fake_checker.c. */
#include "fake_fix.h"

#define X(i) (f->n[i].x)
#define OPS(i) (f->n[i].x->ops)

/* Mutation: copy bytes at write() time instead of at the scripted time. */
static void test_complete_after_delay(void **state)
{
    fix_t fx, *f = &fx;
    fix_open(f, 2, KVP_PATH_FAKE_FENCEABLE);
    kvp_xpeer_id_t p = connect_to(f, 0, 1);
    kvp_slot_ref_t s = src_block(f, 0, "k1", 0xab), d = dst_block(f, 1, "k1");
    kvp_xfer_block_t b = blk(s, d);
    kvp_xfer_id_t id = 0;
    assert_int_equal(OPS(0)->write(X(0), p, &b, 1, &id), KVP_OK);
    assert_true(id != 0);
    kvp_xfer_result_t r[4];
    assert_false(OPS(0)->progress(X(0)));
    assert_int_equal(poll_n(f, 0, p, r, 4), 0);
    assert_false(slot_is(f, 1, d.slot, 0xab));
    assert_int_equal(kvp_fake_next_event_ns(X(0)), 1000 + MS);
    assert_int_equal(OPS(0)->arm(X(0)), KVP_OK);
    kvp_manual_clock_advance(&f->clk, MS);
    assert_int_equal(OPS(0)->arm(X(0)), KVP_ERR_BUSY);
    assert_true(OPS(0)->progress(X(0)));
    assert_true(slot_is(f, 1, d.slot, 0xab));
    assert_int_equal(poll_n(f, 0, p, r, 4), 1);
    assert_int_equal(r[0].id, id);
    assert_int_equal(r[0].status, KVP_OK);
    assert_int_equal(poll_n(f, 0, p, r, 4), 0); /* released: reported once */
    kvp_xport_stats_t st;
    OPS(0)->get_stats(X(0), &st);
    assert_int_equal(st.writes, 1);
    assert_int_equal(st.blocks_written, 1);
    assert_int_equal(st.bytes_written, BS);
    assert_int_equal(st.done, 1);
    assert_int_equal(st.inflight, 0);
    assert_int_equal(st.peers, 1);
    assert_int_equal(kvp_fake_xfer_info(X(0), id, &(kvp_fake_xfer_info_t){0}), KVP_ERR_NOT_FOUND);
    const kvp_fake_call_t *calls;
    size_t nc = kvp_fake_calls(X(0), &calls);
    assert_int_equal(nc, 3); /* add_peer, write, poll */
    assert_int_equal(calls[1].kind, KVP_FAKE_CALL_WRITE);
    assert_int_equal(calls[1].xfer, id);
    assert_int_equal(calls[1].peer, p);
    assert_int_equal(calls[1].n_blocks, 1);
    assert_memory_equal(calls[1].blocks, &b, sizeof(b));
    assert_int_equal(calls[2].kind, KVP_FAKE_CALL_POLL);
    assert_int_equal(calls[2].n, 1);
    assert_int_equal(OPS(0)->event_fd(X(0)), -1);
    assert_string_equal(OPS(0)->name, "fake");
    assert_true(OPS(0)->caps & KVP_XPORT_CAP_FENCE);
    assert_false(OPS(0)->caps & KVP_XPORT_CAP_ALLOCATES_REGION);
    assert_int_equal(violations(f), 0);
    fix_close(f);
}

/* Mutation: script_apply treats WEDGE like COMPLETE (terminal_at kept). */
static void test_wedge_never_terminal(void **state)
{
    fix_t fx, *f = &fx;
    fix_open(f, 2, KVP_PATH_FAKE_FENCEABLE);
    kvp_xpeer_id_t p = connect_to(f, 0, 1);
    kvp_fake_script_t sc = kvp_fake_script_wedge();
    assert_int_equal(kvp_fake_script_next(X(0), &sc), KVP_OK);
    assert_int_equal(kvp_fake_scripts_queued(X(0)), 1);
    kvp_xfer_block_t b = blk(src_block(f, 0, "k", 1), dst_block(f, 1, "k"));
    kvp_xfer_id_t id;
    assert_int_equal(OPS(0)->write(X(0), p, &b, 1, &id), KVP_OK);
    assert_int_equal(kvp_fake_scripts_queued(X(0)), 0);
    advance(f, 3600 * KVP_NSEC_PER_SEC);
    kvp_xfer_result_t r[2];
    assert_int_equal(poll_n(f, 0, p, r, 2), 0);
    assert_int_equal(kvp_fake_next_event_ns(X(0)), KVP_FAKE_NEVER);
    kvp_fake_xfer_info_t in;
    assert_int_equal(kvp_fake_xfer_info(X(0), id, &in), KVP_OK);
    assert_true(in.tracked && !in.terminal && !in.copy_pending);
    assert_false(slot_is(f, 1, b.dst_slot, 1));
    assert_int_equal(OPS(0)->cancel(X(0), &id, 1, KVP_CANCEL_IMMEDIATE, NULL, NULL), KVP_OK);
    assert_int_equal(kvp_fake_xfer_info(X(0), id, &in), KVP_ERR_NOT_FOUND);
    fix_close(f);
}

/* Mutation: FAIL copies every block (ignores copy_blocks) or reports KVP_OK. */
static void test_fail_partial_copy(void **state)
{
    fix_t fx, *f = &fx;
    fix_open(f, 2, KVP_PATH_FAKE_FENCEABLE);
    kvp_xpeer_id_t p = connect_to(f, 0, 1);
    kvp_fake_script_t sc = kvp_fake_script_fail(2 * MS, 1);
    assert_int_equal(kvp_fake_script_next(X(0), &sc), KVP_OK);
    kvp_xfer_block_t b[2] = {blk(src_block(f, 0, "a", 0xa), dst_block(f, 1, "a")),
                             blk(src_block(f, 0, "b", 0xb), dst_block(f, 1, "b"))};
    kvp_xfer_id_t id;
    assert_int_equal(OPS(0)->write(X(0), p, b, 2, &id), KVP_OK);
    advance(f, 2 * MS);
    assert_true(slot_is(f, 1, b[0].dst_slot, 0xa));
    assert_true(slot_is(f, 1, b[1].dst_slot, 0));
    kvp_xfer_result_t r[2];
    assert_int_equal(poll_n(f, 0, p, r, 2), 1);
    assert_int_equal(r[0].status, KVP_ERR_TRANSPORT);
    kvp_xport_stats_t st;
    OPS(0)->get_stats(X(0), &st);
    assert_int_equal(st.failed, 1);
    assert_int_equal(st.done, 0);
    /* fail without any copy */
    sc = kvp_fake_script_fail(MS, 0);
    assert_int_equal(kvp_fake_script_next(X(0), &sc), KVP_OK);
    assert_int_equal(OPS(0)->write(X(0), p, &b[1], 1, &id), KVP_OK);
    advance(f, MS);
    assert_true(slot_is(f, 1, b[1].dst_slot, 0));
    assert_int_equal(poll_n(f, 0, p, r, 2), 1);
    assert_int_equal(r[0].status, KVP_ERR_TRANSPORT);
    assert_int_equal(violations(f), 0);
    fix_close(f);
}

/* Mutation: FAIL_SUBMIT posts the transfer anyway (or does not consume the
 * script). */
static void test_fail_submit(void **state)
{
    fix_t fx, *f = &fx;
    fix_open(f, 2, KVP_PATH_FAKE_FENCEABLE);
    kvp_xpeer_id_t p = connect_to(f, 0, 1);
    kvp_fake_script_t sc = kvp_fake_script_fail_submit();
    assert_int_equal(kvp_fake_script_next(X(0), &sc), KVP_OK);
    kvp_xfer_block_t b = blk(src_block(f, 0, "k", 7), dst_block(f, 1, "k"));
    kvp_xfer_id_t id = 12345;
    assert_int_equal(OPS(0)->write(X(0), p, &b, 1, &id), KVP_ERR_TRANSPORT);
    assert_int_equal(id, 12345); /* out-param untouched */
    kvp_xport_stats_t st;
    OPS(0)->get_stats(X(0), &st);
    assert_int_equal(st.writes, 0);
    assert_int_equal(st.inflight, 0);
    assert_int_equal(kvp_fake_next_event_ns(X(0)), KVP_FAKE_NEVER);
    advance(f, 10 * MS);
    assert_true(slot_is(f, 1, b.dst_slot, 0));
    assert_int_equal(kvp_fake_call_count(X(0), KVP_FAKE_CALL_WRITE_REFUSED), 1);
    assert_int_equal(kvp_fake_call_count(X(0), KVP_FAKE_CALL_WRITE), 0);
    /* the script was consumed: the next write goes through */
    assert_int_equal(OPS(0)->write(X(0), p, &b, 1, &id), KVP_OK);
    advance(f, MS);
    kvp_xfer_result_t r;
    assert_int_equal(poll_n(f, 0, p, &r, 1), 1);
    assert_true(slot_is(f, 1, b.dst_slot, 7));
    fix_close(f);
}

/* Mutation: DISCONNECT does not mark the peer unreachable. */
static void test_disconnect(void **state)
{
    fix_t fx, *f = &fx;
    fix_open(f, 2, KVP_PATH_FAKE_FENCEABLE);
    kvp_xpeer_id_t p = connect_to(f, 0, 1);
    kvp_fake_script_t sc = kvp_fake_script_disconnect(MS, 0);
    assert_int_equal(kvp_fake_script_next(X(0), &sc), KVP_OK);
    kvp_xfer_block_t b = blk(src_block(f, 0, "k", 7), dst_block(f, 1, "k"));
    kvp_xfer_id_t id;
    assert_int_equal(OPS(0)->write(X(0), p, &b, 1, &id), KVP_OK);
    assert_int_equal(OPS(0)->peer_status(X(0), p), KVP_OK);
    advance(f, MS);
    kvp_xfer_result_t r;
    assert_int_equal(poll_n(f, 0, p, &r, 1), 1);
    assert_int_equal(r.status, KVP_ERR_UNREACHABLE);
    assert_int_equal(OPS(0)->peer_status(X(0), p), KVP_ERR_UNREACHABLE);
    assert_int_equal(OPS(0)->write(X(0), p, &b, 1, &id), KVP_ERR_TRANSPORT);
    fix_close(f);
}

/* Mutation: kvp_fake_peer_set_error ignored by peer_status / write. */
static void test_peer_error_and_path(void **state)
{
    fix_t fx, *f = &fx;
    fix_open(f, 2, KVP_PATH_FAKE_UNFENCEABLE);
    kvp_xpeer_id_t p = connect_to(f, 1, 0);
    assert_int_equal(OPS(1)->peer_path(X(1), p), KVP_PATH_FAKE_UNFENCEABLE);
    assert_int_equal(kvp_fake_peer_set_path(X(1), p, KVP_PATH_FAKE_FENCEABLE), KVP_OK);
    assert_int_equal(OPS(1)->peer_path(X(1), p), KVP_PATH_FAKE_FENCEABLE);
    assert_int_equal(kvp_fake_peer_set_path(X(1), p, KVP_PATH_AM_TCP), KVP_ERR_INVALID);
    assert_int_equal(OPS(1)->peer_path(X(1), 999), KVP_PATH_UNKNOWN);
    assert_int_equal(OPS(1)->peer_status(X(1), 999), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_fake_peer_set_error(X(1), p, KVP_ERR_TRANSPORT), KVP_OK);
    assert_int_equal(OPS(1)->peer_status(X(1), p), KVP_ERR_TRANSPORT);
    kvp_xfer_block_t b = {0, 1, 0, 1};
    kvp_xfer_id_t id;
    assert_int_equal(OPS(1)->write(X(1), p, &b, 1, &id), KVP_ERR_TRANSPORT);
    assert_int_equal(kvp_fake_peer_set_error(X(1), p, KVP_OK), KVP_OK);
    assert_int_equal(OPS(1)->peer_status(X(1), p), KVP_OK);
    assert_int_equal(kvp_fake_peer_set_error(X(1), 999, KVP_ERR_IO), KVP_ERR_NOT_FOUND);
    assert_string_equal(kvp_data_path_str(KVP_PATH_FAKE_FENCEABLE), "fake-fenceable");
    assert_string_equal(kvp_data_path_str(KVP_PATH_DIRECT_SHM), "direct-shm");
    fix_close(f);
}

/* Mutation: LATE copies at terminal time instead of copy_ns. */
static void test_late_copy_after_terminal(void **state)
{
    fix_t fx, *f = &fx;
    fix_open(f, 2, KVP_PATH_FAKE_FENCEABLE);
    kvp_xpeer_id_t p = connect_to(f, 0, 1);
    kvp_fake_script_t sc = kvp_fake_script_late(MS, 5 * MS, KVP_ERR_TRANSPORT);
    assert_int_equal(kvp_fake_script_next(X(0), &sc), KVP_OK);
    kvp_slot_ref_t s = src_block(f, 0, "k", 0x5a), d = dst_block(f, 1, "k");
    kvp_xfer_block_t b = blk(s, d);
    kvp_xfer_id_t id;
    assert_int_equal(OPS(0)->write(X(0), p, &b, 1, &id), KVP_OK);
    advance(f, MS);
    kvp_xfer_result_t r;
    assert_int_equal(poll_n(f, 0, p, &r, 1), 1);
    assert_int_equal(r.status, KVP_ERR_TRANSPORT);
    assert_false(slot_is(f, 1, d.slot, 0x5a));
    kvp_fake_xfer_info_t in;
    assert_int_equal(kvp_fake_xfer_info(X(0), id, &in), KVP_OK);
    assert_true(!in.tracked && in.copy_pending);
    /* the consumer quarantines (outcome unknown): the late copy is legal;
     * the source keeps its pin (the test holds it) */
    assert_int_equal(kvp_store_quarantine(f->n[1].s, d), KVP_OK);
    advance(f, 4 * MS);
    assert_true(slot_is(f, 1, d.slot, 0x5a));
    kvp_fake_counters_t c;
    kvp_fake_get_counters(X(0), &c);
    assert_int_equal(c.late_copies, 1);
    assert_int_equal(c.blocks_landed, 1);
    assert_int_equal(kvp_fake_xfer_info(X(0), id, &in), KVP_ERR_NOT_FOUND);
    assert_int_equal(violations(f), 0);
    fix_close(f);
}

/* Mutation: cancel(WAIT) releases running transfers (or does not release
 * terminal ones). */
static void test_cancel_wait_keeps_running(void **state)
{
    fix_t fx, *f = &fx;
    fix_open(f, 2, KVP_PATH_FAKE_FENCEABLE);
    kvp_xpeer_id_t p = connect_to(f, 0, 1);
    kvp_fake_script_t done = kvp_fake_script_complete(MS), wedge = kvp_fake_script_wedge();
    assert_int_equal(kvp_fake_script_next(X(0), &done), KVP_OK);
    assert_int_equal(kvp_fake_script_next(X(0), &wedge), KVP_OK);
    kvp_xfer_block_t b = blk(src_block(f, 0, "k", 3), dst_block(f, 1, "k"));
    kvp_xfer_id_t ids[2], still[2] = {0, 0};
    assert_int_equal(OPS(0)->write(X(0), p, &b, 1, &ids[0]), KVP_OK);
    assert_int_equal(OPS(0)->write(X(0), p, &b, 1, &ids[1]), KVP_OK);
    assert_true(ids[0] != ids[1]);
    advance(f, MS);
    size_t n = 99;
    assert_int_equal(OPS(0)->cancel(X(0), ids, 2, KVP_CANCEL_WAIT, still, &n), KVP_OK);
    assert_int_equal(n, 1);
    assert_int_equal(still[0], ids[1]);
    kvp_fake_xfer_info_t in;
    assert_int_equal(kvp_fake_xfer_info(X(0), ids[0], &in), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_fake_xfer_info(X(0), ids[1], &in), KVP_OK);
    assert_true(in.tracked);
    kvp_xport_stats_t st;
    OPS(0)->get_stats(X(0), &st);
    assert_int_equal(st.inflight, 1);
    /* the completed one is not reported by poll again */
    kvp_xfer_result_t r[2];
    assert_int_equal(poll_n(f, 0, p, r, 2), 0);
    /* WAIT again: still running, still tracked */
    assert_int_equal(OPS(0)->cancel(X(0), &ids[1], 1, KVP_CANCEL_WAIT, still, &n), KVP_OK);
    assert_int_equal(n, 1);
    assert_int_equal(kvp_fake_call_count(X(0), KVP_FAKE_CALL_CANCEL), 3);
    const kvp_fake_call_t *calls;
    size_t nc = kvp_fake_calls(X(0), &calls);
    assert_int_equal(calls[nc - 1].kind, KVP_FAKE_CALL_CANCEL);
    assert_int_equal(calls[nc - 1].mode, KVP_CANCEL_WAIT);
    assert_int_equal(calls[nc - 1].status, KVP_ERR_BUSY);
    assert_int_equal(calls[nc - 1].xfer, ids[1]);
    /* WAIT without an output array is refused */
    assert_int_equal(OPS(0)->cancel(X(0), &ids[1], 1, KVP_CANCEL_WAIT, NULL, &n), KVP_ERR_INVALID);
    assert_int_equal(OPS(0)->close(X(0), false), KVP_ERR_BUSY);
    assert_int_equal(OPS(0)->cancel(X(0), &ids[1], 1, KVP_CANCEL_IMMEDIATE, NULL, NULL), KVP_OK);
    OPS(0)->get_stats(X(0), &st);
    assert_int_equal(st.inflight, 0);
    fix_close(f);
}

/* Mutation: cancel(IMMEDIATE) also drops the scripted copy (the WRITE would
 * be "recalled", which no real transport can do). */
static void test_cancel_immediate_copy_still_lands(void **state)
{
    fix_t fx, *f = &fx;
    fix_open(f, 2, KVP_PATH_FAKE_FENCEABLE);
    kvp_xpeer_id_t p = connect_to(f, 0, 1);
    kvp_fake_script_t sc = kvp_fake_script_wedge_then_copy(5 * MS);
    assert_int_equal(kvp_fake_script_next(X(0), &sc), KVP_OK);
    kvp_slot_ref_t s = src_block(f, 0, "k", 0x77), d = dst_block(f, 1, "k");
    kvp_xfer_block_t b = blk(s, d);
    kvp_xfer_id_t id;
    assert_int_equal(OPS(0)->write(X(0), p, &b, 1, &id), KVP_OK);
    assert_int_equal(OPS(0)->cancel(X(0), &id, 1, KVP_CANCEL_IMMEDIATE, NULL, NULL), KVP_OK);
    kvp_xport_stats_t st;
    OPS(0)->get_stats(X(0), &st);
    assert_int_equal(st.inflight, 0);
    kvp_fake_xfer_info_t in;
    assert_int_equal(kvp_fake_xfer_info(X(0), id, &in), KVP_OK);
    assert_true(!in.tracked && in.copy_pending);
    advance(f, 4 * MS);
    assert_false(slot_is(f, 1, d.slot, 0x77));
    advance(f, MS);
    assert_true(slot_is(f, 1, d.slot, 0x77)); /* still FILLING: legal */
    kvp_fake_counters_t c;
    kvp_fake_get_counters(X(0), &c);
    assert_int_equal(c.late_copies, 1);
    assert_int_equal(kvp_fake_xfer_info(X(0), id, &in), KVP_ERR_NOT_FOUND);
    assert_int_equal(violations(f), 0);
    fix_close(f);
}

/* Mutation: reap() ignores the peer filter (a poll steals another peer's
 * completions, F15). */
static void test_poll_scoped_per_peer(void **state)
{
    fix_t fx, *f = &fx;
    fix_open(f, 3, KVP_PATH_FAKE_FENCEABLE);
    kvp_xpeer_id_t pb = connect_to(f, 0, 1), pc = connect_to(f, 0, 2);
    assert_true(pb != pc);
    kvp_slot_ref_t s = src_block(f, 0, "k", 9);
    kvp_xfer_block_t bb = blk(s, dst_block(f, 1, "k")), bc = blk(s, dst_block(f, 2, "k"));
    kvp_xfer_id_t ib[2], ic;
    assert_int_equal(OPS(0)->write(X(0), pb, &bb, 1, &ib[0]), KVP_OK);
    assert_int_equal(OPS(0)->write(X(0), pc, &bc, 1, &ic), KVP_OK);
    assert_int_equal(OPS(0)->write(X(0), pb, &bb, 1, &ib[1]), KVP_OK);
    advance(f, MS);
    kvp_xfer_result_t r[4];
    assert_int_equal(poll_n(f, 0, pc, r, 4), 1);
    assert_int_equal(r[0].id, ic);
    assert_int_equal(poll_n(f, 0, pb, r, 1), 1); /* cap respected */
    assert_int_equal(r[0].id, ib[0]);
    assert_int_equal(poll_n(f, 0, pc, r, 4), 0);
    assert_int_equal(poll_n(f, 0, pb, r, 4), 1);
    assert_int_equal(r[0].id, ib[1]);
    size_t n;
    assert_int_equal(OPS(0)->poll(X(0), 999, r, 4, &n), KVP_ERR_NOT_FOUND);
    assert_int_equal(OPS(0)->poll(X(0), pb, NULL, 4, &n), KVP_ERR_INVALID);
    assert_true(slot_is(f, 1, bb.dst_slot, 9) && slot_is(f, 2, bc.dst_slot, 9));
    assert_int_equal(violations(f), 0);
    fix_close(f);
}

/* Mutation: remove_peer does not mark in-flight transfers retired (a poll
 * of the re-added peer then sees the old incarnation's completion, I3). */
static void test_remove_peer_retires(void **state)
{
    fix_t fx, *f = &fx;
    fix_open(f, 2, KVP_PATH_FAKE_FENCEABLE);
    kvp_xpeer_id_t p = connect_to(f, 0, 1);
    kvp_fake_script_t sc = kvp_fake_script_complete(10 * MS);
    assert_int_equal(kvp_fake_script_next(X(0), &sc), KVP_OK);
    kvp_slot_ref_t s = src_block(f, 0, "k", 4);
    kvp_xfer_block_t b = blk(s, dst_block(f, 1, "k"));
    kvp_xfer_id_t id;
    assert_int_equal(OPS(0)->write(X(0), p, &b, 1, &id), KVP_OK);
    assert_int_equal(OPS(0)->remove_peer(X(0), p), KVP_OK);
    assert_int_equal(OPS(0)->remove_peer(X(0), p), KVP_ERR_NOT_FOUND);
    kvp_xport_stats_t st;
    OPS(0)->get_stats(X(0), &st);
    assert_int_equal(st.retired, 1);
    assert_int_equal(st.inflight, 0);
    assert_int_equal(st.peers, 0);
    assert_int_equal(st.zombie_peers, 1);
    assert_int_equal(kvp_fake_call_count(X(0), KVP_FAKE_CALL_ENDPOINT_RELEASE), 0);
    size_t n;
    kvp_xfer_result_t r[4];
    assert_int_equal(OPS(0)->poll(X(0), p, r, 4, &n), KVP_ERR_NOT_FOUND);
    assert_int_equal(OPS(0)->write(X(0), p, &b, 1, &id), KVP_ERR_NOT_FOUND);
    /* a re-added peer under the SAME blob gets a new handle ... */
    kvp_xpeer_id_t p2 = connect_to(f, 0, 1);
    assert_true(p2 != p);
    assert_int_equal(poll_n(f, 0, p2, r, 4), 0);
    assert_int_equal(OPS(0)->poll_retired(X(0), r, 4, &n), KVP_OK);
    assert_int_equal(n, 0); /* still running */
    advance(f, 10 * MS);
    /* ... and never sees the old incarnation's transfer */
    assert_int_equal(poll_n(f, 0, p2, r, 4), 0);
    assert_int_equal(kvp_fake_call_count(X(0), KVP_FAKE_CALL_ENDPOINT_RELEASE), 0);
    assert_int_equal(OPS(0)->poll_retired(X(0), r, 4, &n), KVP_OK);
    assert_int_equal(n, 1);
    assert_int_equal(r[0].id, id);
    assert_int_equal(r[0].status, KVP_OK);
    assert_int_equal(kvp_fake_call_count(X(0), KVP_FAKE_CALL_ENDPOINT_RELEASE), 1);
    const kvp_fake_call_t *calls;
    size_t nc = kvp_fake_calls(X(0), &calls);
    assert_int_equal(calls[nc - 1].kind, KVP_FAKE_CALL_ENDPOINT_RELEASE);
    assert_int_equal(calls[nc - 1].peer, p);
    OPS(0)->get_stats(X(0), &st);
    assert_int_equal(st.retired, 0);
    assert_int_equal(st.zombie_peers, 0);
    assert_int_equal(st.peers, 1);
    assert_int_equal(OPS(0)->poll_retired(X(0), r, 4, &n), KVP_OK);
    assert_int_equal(n, 0);
    assert_int_equal(OPS(0)->close(X(0), false), KVP_OK);
    f->n[0].x = NULL;
    fix_close(f);
}

/* Mutation: remove_peer defers the endpoint release even with nothing in
 * flight (zombie forever). */
static void test_remove_idle_peer_released_at_once(void **state)
{
    fix_t fx, *f = &fx;
    fix_open(f, 2, KVP_PATH_FAKE_FENCEABLE);
    kvp_xpeer_id_t p = connect_to(f, 0, 1);
    kvp_xfer_block_t b = blk(src_block(f, 0, "k", 4), dst_block(f, 1, "k"));
    kvp_xfer_id_t id;
    assert_int_equal(OPS(0)->write(X(0), p, &b, 1, &id), KVP_OK);
    advance(f, MS);
    kvp_xfer_result_t r;
    assert_int_equal(poll_n(f, 0, p, &r, 1), 1);
    assert_int_equal(OPS(0)->remove_peer(X(0), p), KVP_OK);
    assert_int_equal(kvp_fake_call_count(X(0), KVP_FAKE_CALL_ENDPOINT_RELEASE), 1);
    kvp_xport_stats_t st;
    OPS(0)->get_stats(X(0), &st);
    assert_int_equal(st.zombie_peers, 0);
    assert_int_equal(OPS(0)->close(X(0), false), KVP_OK);
    f->n[0].x = NULL;
    fix_close(f);
}

/* Mutation: force_release_retired does not release (or releases a live
 * transfer). */
static void test_force_release_retired(void **state)
{
    fix_t fx, *f = &fx;
    fix_open(f, 2, KVP_PATH_FAKE_FENCEABLE);
    kvp_xpeer_id_t p = connect_to(f, 0, 1);
    kvp_fake_script_t w = kvp_fake_script_wedge();
    assert_int_equal(kvp_fake_script_next(X(0), &w), KVP_OK);
    assert_int_equal(kvp_fake_script_next(X(0), &w), KVP_OK);
    kvp_xfer_block_t b = blk(src_block(f, 0, "k", 4), dst_block(f, 1, "k"));
    kvp_xfer_id_t id, live;
    assert_int_equal(OPS(0)->write(X(0), p, &b, 1, &id), KVP_OK);
    assert_int_equal(OPS(0)->remove_peer(X(0), p), KVP_OK);
    kvp_xpeer_id_t p2 = connect_to(f, 0, 1);
    assert_int_equal(OPS(0)->write(X(0), p2, &b, 1, &live), KVP_OK);
    advance(f, 1000 * KVP_NSEC_PER_SEC);
    kvp_xfer_result_t r[2];
    size_t n;
    assert_int_equal(OPS(0)->poll_retired(X(0), r, 2, &n), KVP_OK);
    assert_int_equal(n, 0);
    assert_int_equal(OPS(0)->close(X(0), false), KVP_ERR_BUSY);
    /* a live transfer is not retired: refused, nothing released */
    kvp_xfer_id_t both[2] = {id, live};
    assert_int_equal(OPS(0)->force_release_retired(X(0), both, 2), KVP_ERR_NOT_FOUND);
    kvp_xport_stats_t st;
    OPS(0)->get_stats(X(0), &st);
    assert_int_equal(st.retired, 1);
    uint64_t errs = f->cap.count[KVP_LOG_ERROR];
    assert_int_equal(OPS(0)->force_release_retired(X(0), &id, 1), KVP_OK);
    assert_int_equal(f->cap.count[KVP_LOG_ERROR], errs + 1);
    OPS(0)->get_stats(X(0), &st);
    assert_int_equal(st.retired, 0);
    assert_int_equal(st.force_released, 1);
    assert_int_equal(st.zombie_peers, 0);
    assert_int_equal(kvp_fake_call_count(X(0), KVP_FAKE_CALL_FORCE_RELEASE), 1);
    assert_int_equal(kvp_fake_call_count(X(0), KVP_FAKE_CALL_ENDPOINT_RELEASE), 1);
    assert_int_equal(OPS(0)->force_release_retired(X(0), &id, 1), KVP_ERR_NOT_FOUND);
    assert_int_equal(OPS(0)->cancel(X(0), &live, 1, KVP_CANCEL_IMMEDIATE, NULL, NULL), KVP_OK);
    assert_int_equal(OPS(0)->close(X(0), false), KVP_OK);
    f->n[0].x = NULL;
    fix_close(f);
}

/* Mutation: fence_peer ignores the path (drops on unfenceable / lands on
 * fenceable) -- see also the two fence tests below. */
static void fence_case(bool fenceable)
{
    fix_t fx, *f = &fx;
    fix_open(f, 2, fenceable ? KVP_PATH_FAKE_FENCEABLE : KVP_PATH_FAKE_UNFENCEABLE);
    kvp_xpeer_id_t to_cons = connect_to(f, 0, 1), to_src = connect_to(f, 1, 0);
    kvp_fake_script_t sc = kvp_fake_script_wedge_then_copy(5 * MS);
    assert_int_equal(kvp_fake_script_next(X(0), &sc), KVP_OK);
    kvp_slot_ref_t s = src_block(f, 0, "k", 0x66), d = dst_block(f, 1, "k");
    kvp_xfer_block_t b = blk(s, d);
    kvp_xfer_id_t id;
    assert_int_equal(OPS(0)->write(X(0), to_cons, &b, 1, &id), KVP_OK);
    /* consumer gives up: quarantine, fence its own endpoint to the source */
    assert_int_equal(kvp_store_quarantine(f->n[1].s, d), KVP_OK);
    bool proof = !fenceable;
    assert_int_equal(OPS(1)->fence_peer(X(1), to_src, &proof), KVP_OK);
    assert_int_equal(proof, fenceable);
    assert_int_equal(OPS(1)->peer_status(X(1), to_src), KVP_ERR_CLOSED);
    assert_int_equal(OPS(1)->write(X(1), to_src, &b, 1, &id), KVP_ERR_CLOSED);
    advance(f, 5 * MS);
    kvp_fake_counters_t c;
    kvp_fake_get_counters(X(0), &c);
    if (fenceable) {
        assert_true(slot_is(f, 1, d.slot, 0));
        assert_int_equal(c.blocks_fenced, 1);
        assert_int_equal(c.blocks_landed, 0);
        /* the fence is proof: releasing the slot is safe, later nothing lands */
        assert_int_equal(kvp_store_release_quarantined(f->n[1].s, d, false), KVP_OK);
    } else {
        assert_true(slot_is(f, 1, d.slot, 0x66));
        assert_int_equal(c.blocks_landed, 1);
    }
    const kvp_fake_call_t *calls;
    size_t nc = kvp_fake_calls(X(1), &calls);
    assert_int_equal(calls[nc - 1].kind, KVP_FAKE_CALL_WRITE_REFUSED);
    assert_int_equal(calls[nc - 1].status, KVP_ERR_CLOSED);
    assert_int_equal(calls[nc - 2].kind, KVP_FAKE_CALL_FENCE);
    assert_int_equal(calls[nc - 2].peer, to_src);
    assert_int_equal(calls[nc - 2].n, fenceable ? 1 : 0);
    assert_int_equal(violations(f), 0);
    bool pr;
    assert_int_equal(OPS(1)->fence_peer(X(1), 999, &pr), KVP_ERR_NOT_FOUND);
    assert_int_equal(OPS(0)->cancel(X(0), &id, 1, KVP_CANCEL_IMMEDIATE, NULL, NULL), KVP_OK);
    fix_close(f);
}

/* Mutation: fake__fence not called / does not mark transfers fenced. */
static void test_fence_fenceable_drops_late_copies(void **state)
{
    fence_case(true);
}

/* Mutation: fence drops copies regardless of the path. */
static void test_fence_unfenceable_lands(void **state)
{
    fence_case(false);
}

/* Issue 15: the fence also holds for transfers the source posts AFTER it
 * through the endpoint it already had (a FETCH that reached it late), and
 * only for that one: an endpoint added afterwards (the next incarnation)
 * writes normally. Mutation: fence only the copies pending at the fence
 * (the old fake) -> the later copy lands in the released slot. */
static void test_fence_holds_for_later_posts_of_that_endpoint(void **state)
{
    (void)state;
    fix_t fx, *f = &fx;
    fix_open(f, 2, KVP_PATH_FAKE_FENCEABLE);
    kvp_xpeer_id_t to_cons = connect_to(f, 0, 1), to_src = connect_to(f, 1, 0);
    kvp_slot_ref_t s = src_block(f, 0, "k", 0x66), d = dst_block(f, 1, "k");
    kvp_xfer_block_t b = blk(s, d);
    assert_int_equal(kvp_store_quarantine(f->n[1].s, d), KVP_OK);
    bool proof = false;
    assert_int_equal(OPS(1)->fence_peer(X(1), to_src, &proof), KVP_OK);
    assert_true(proof);
    assert_int_equal(kvp_store_release_quarantined(f->n[1].s, d, false), KVP_OK);
    /* Only now does the source post (the request reached it late). */
    kvp_fake_script_t sc = kvp_fake_script_wedge_then_copy(5 * MS);
    assert_int_equal(kvp_fake_script_next(X(0), &sc), KVP_OK);
    kvp_xfer_id_t id;
    assert_int_equal(OPS(0)->write(X(0), to_cons, &b, 1, &id), KVP_OK);
    advance(f, 10 * MS);
    kvp_fake_counters_t c;
    kvp_fake_get_counters(X(0), &c);
    assert_int_equal(c.blocks_fenced, 1);
    assert_int_equal(c.blocks_landed, 0);
    assert_int_equal(violations(f), 0);
    assert_true(slot_is(f, 1, d.slot, 0));
    assert_int_equal(OPS(0)->cancel(X(0), &id, 1, KVP_CANCEL_IMMEDIATE, NULL, NULL), KVP_OK);
    /* The next incarnation: both sides add new endpoints; its copies land. */
    assert_int_equal(OPS(0)->remove_peer(X(0), to_cons), KVP_OK);
    assert_int_equal(OPS(1)->remove_peer(X(1), to_src), KVP_OK);
    kvp_xpeer_id_t to_cons2 = connect_to(f, 0, 1);
    (void)connect_to(f, 1, 0);
    kvp_slot_ref_t d2 = dst_block(f, 1, "k2");
    kvp_xfer_block_t b2 = blk(s, d2);
    assert_int_equal(OPS(0)->write(X(0), to_cons2, &b2, 1, &id), KVP_OK);
    advance(f, 10 * MS);
    kvp_fake_get_counters(X(0), &c);
    assert_int_equal(c.blocks_landed, 1);
    assert_int_equal(c.blocks_fenced, 1);
    assert_true(slot_is(f, 1, d2.slot, 0x66));
    assert_int_equal(violations(f), 0);
    kvp_xfer_result_t r[2];
    assert_int_equal(poll_n(f, 0, to_cons2, r, 2), 1);
    assert_int_equal(kvp_store_abandon(f->n[1].s, d2), KVP_OK);
    fix_close(f);
}

/* Mutation: close(false) ignores tracked transfers. */
static void test_close_refuses_unless_forced(void **state)
{
    fix_t fx, *f = &fx;
    fix_open(f, 2, KVP_PATH_FAKE_FENCEABLE);
    kvp_xpeer_id_t p = connect_to(f, 0, 1);
    kvp_fake_script_t w = kvp_fake_script_wedge();
    assert_int_equal(kvp_fake_script_next(X(0), &w), KVP_OK);
    kvp_xfer_block_t b = blk(src_block(f, 0, "k", 4), dst_block(f, 1, "k"));
    kvp_xfer_id_t id;
    assert_int_equal(OPS(0)->write(X(0), p, &b, 1, &id), KVP_OK);
    assert_int_equal(OPS(0)->close(X(0), false), KVP_ERR_BUSY);
    assert_int_equal(kvp_fake_fabric_destroy(f->fab), KVP_ERR_BUSY);
    uint64_t errs = f->cap.count[KVP_LOG_ERROR];
    assert_int_equal(OPS(0)->close(X(0), true), KVP_OK);
    assert_true(f->cap.count[KVP_LOG_ERROR] > errs); /* the tracked transfer is named */
    f->n[0].x = NULL;
    fix_close(f);
}

/* Mutation: blob_parse skips a check (magic, checksum, length, layout). */
static void test_bad_blob(void **state)
{
    fix_t fx, *f = &fx;
    fix_open(f, 2, KVP_PATH_FAKE_FENCEABLE);
    const void *blob;
    size_t len;
    assert_int_equal(OPS(1)->local_blob(X(1), &blob, &len), KVP_OK);
    unsigned char buf[64];
    memcpy(buf, blob, len);
    kvp_layout_t lay = {NB, BS}, other = {NB * 2, BS}, otherbs = {NB, BS * 2};
    kvp_xpeer_id_t id = 777;
    kvp_xport_t *x = X(0);
    assert_int_equal(x->ops->add_peer(x, buf, len - 1, &lay, &id), KVP_ERR_INVALID);
    assert_int_equal(x->ops->add_peer(x, buf, 0, &lay, &id), KVP_ERR_INVALID);
    buf[len] = 0;
    assert_int_equal(x->ops->add_peer(x, buf, len + 1, &lay, &id), KVP_ERR_INVALID);
    assert_int_equal(x->ops->add_peer(x, NULL, len, &lay, &id), KVP_ERR_INVALID);
    assert_int_equal(x->ops->add_peer(x, buf, len, NULL, &id), KVP_ERR_INVALID);
    for (size_t i = 0; i < len; i++) { /* any flipped byte is caught */
        buf[i] ^= 0x10;
        assert_int_equal(x->ops->add_peer(x, buf, len, &lay, &id), KVP_ERR_INVALID);
        buf[i] ^= 0x10;
    }
    assert_int_equal(x->ops->add_peer(x, buf, len, &other, &id), KVP_ERR_INCOMPATIBLE);
    assert_int_equal(x->ops->add_peer(x, buf, len, &otherbs, &id), KVP_ERR_INCOMPATIBLE);
    /* a blob of another fabric */
    kvp_fake_fabric_t *fab2;
    assert_int_equal(kvp_fake_fabric_create(&f->clk.clock, &fab2), KVP_OK);
    kvp_fake_config_t fc = {.fabric = fab2};
    kvp_xport_t *y;
    assert_int_equal(kvp_fake_create(&fc, &y), KVP_OK);
    assert_int_equal(y->ops->register_region(y, kvp_store_base(f->n[1].s), NB * BS, &lay, NULL),
                     KVP_OK);
    const void *yblob;
    assert_int_equal(y->ops->local_blob(y, &yblob, &len), KVP_OK);
    assert_int_equal(x->ops->add_peer(x, yblob, len, &lay, &id), KVP_ERR_INVALID);
    assert_int_equal(y->ops->close(y, false), KVP_OK);
    assert_int_equal(kvp_fake_fabric_destroy(fab2), KVP_OK);
    assert_int_equal(id, 777);
    kvp_xport_stats_t st;
    x->ops->get_stats(x, &st);
    assert_int_equal(st.peers, 0);
    assert_int_equal(kvp_fake_call_count(x, KVP_FAKE_CALL_ADD_PEER), 0);
    /* the valid blob of a closed endpoint */
    assert_int_equal(OPS(1)->close(X(1), false), KVP_OK);
    f->n[1].x = NULL;
    assert_int_equal(x->ops->add_peer(x, buf, len, &lay, &id), KVP_ERR_UNREACHABLE);
    fix_close(f);
}

/* Mutation: write() posts before checking every index (or checks dst
 * against our own layout instead of the peer's). */
static void test_write_bad_input(void **state)
{
    fix_t fx, *f = &fx;
    fix_open(f, 2, KVP_PATH_FAKE_FENCEABLE);
    kvp_xpeer_id_t p = connect_to(f, 0, 1);
    kvp_fake_script_t w = kvp_fake_script_wedge();
    assert_int_equal(kvp_fake_script_next(X(0), &w), KVP_OK);
    kvp_xfer_block_t b[2] = {{0, 1, 0, 1}, {1, 1, 1, 1}};
    kvp_xfer_id_t id = 5;
    assert_int_equal(OPS(0)->write(X(0), 999, b, 2, &id), KVP_ERR_NOT_FOUND);
    b[1].dst_slot = NB;
    assert_int_equal(OPS(0)->write(X(0), p, b, 2, &id), KVP_ERR_INVALID);
    b[1].dst_slot = 1;
    b[1].src_slot = UINT32_MAX;
    assert_int_equal(OPS(0)->write(X(0), p, b, 2, &id), KVP_ERR_INVALID);
    b[1].src_slot = 1;
    assert_int_equal(OPS(0)->write(X(0), p, b, 0, &id), KVP_ERR_INVALID);
    assert_int_equal(OPS(0)->write(X(0), p, NULL, 1, &id), KVP_ERR_INVALID);
    assert_int_equal(OPS(0)->write(X(0), p, b, 1, NULL), KVP_ERR_INVALID);
    assert_int_equal(id, 5);
    kvp_xport_stats_t st;
    OPS(0)->get_stats(X(0), &st);
    assert_int_equal(st.writes, 0);
    assert_int_equal(st.inflight, 0);
    assert_int_equal(kvp_fake_scripts_queued(X(0)), 1); /* no script consumed */
    assert_int_equal(kvp_fake_call_count(X(0), KVP_FAKE_CALL_WRITE), 0);
    /* unknown ids: cancel refuses and changes nothing */
    assert_int_equal(OPS(0)->write(X(0), p, b, 1, &id), KVP_OK);
    kvp_xfer_id_t ids[2] = {id, 424242};
    assert_int_equal(OPS(0)->cancel(X(0), ids, 2, KVP_CANCEL_IMMEDIATE, NULL, NULL),
                     KVP_ERR_NOT_FOUND);
    OPS(0)->get_stats(X(0), &st);
    assert_int_equal(st.inflight, 1);
    assert_int_equal(OPS(0)->cancel(X(0), ids, 1, 7, NULL, NULL), KVP_ERR_INVALID);
    /* duplicates are harmless */
    ids[1] = id;
    assert_int_equal(OPS(0)->cancel(X(0), ids, 2, KVP_CANCEL_IMMEDIATE, NULL, NULL), KVP_OK);
    OPS(0)->get_stats(X(0), &st);
    assert_int_equal(st.inflight, 0);
    /* region rules */
    kvp_layout_t lay = {NB, BS};
    void *out;
    assert_int_equal(OPS(0)->register_region(X(0), kvp_store_base(f->n[0].s), NB * BS, &lay, &out),
                     KVP_ERR_STATE);
    assert_int_equal(OPS(0)->register_region(X(0), NULL, NB * BS, &lay, &out), KVP_ERR_UNSUPPORTED);
    kvp_fake_config_t bad = {.fabric = f->fab, .default_path = KVP_PATH_AM_TCP};
    kvp_xport_t *y = NULL;
    assert_int_equal(kvp_fake_create(&bad, &y), KVP_ERR_INVALID);
    bad.default_path = KVP_PATH_UNKNOWN;
    bad.store = f->n[0].s;
    assert_int_equal(kvp_fake_create(&bad, &y), KVP_OK);
    const void *blob;
    size_t len;
    assert_int_equal(y->ops->local_blob(y, &blob, &len), KVP_ERR_STATE);
    assert_int_equal(OPS(1)->local_blob(X(1), &blob, &len), KVP_OK);
    assert_int_equal(y->ops->add_peer(y, blob, len, &lay, &(kvp_xpeer_id_t){0}), KVP_ERR_STATE);
    kvp_layout_t small = {NB + 1, BS};
    assert_int_equal(y->ops->register_region(y, kvp_store_base(f->n[0].s), NB * BS, &small, &out),
                     KVP_ERR_INVALID);
    assert_int_equal(y->ops->close(y, false), KVP_OK);
    fix_close(f);
}

/* Mutation: write() leaks or half-posts when an allocation fails. */
static void test_alloc_failures(void **state)
{
    fix_t fx, *f = &fx;
    fix_open(f, 2, KVP_PATH_FAKE_FENCEABLE);
    kvp_xpeer_id_t p = connect_to(f, 0, 1);
    kvp_xfer_block_t b = blk(src_block(f, 0, "k", 4), dst_block(f, 1, "k"));
    kvp_xfer_id_t id = 5;
    kvp_alloc_fail_at(1, true);
    assert_int_equal(OPS(0)->write(X(0), p, &b, 1, &id), KVP_ERR_NOMEM);
    kvp_fake_config_t fc = {.fabric = f->fab};
    kvp_xport_t *y = NULL;
    assert_int_equal(kvp_fake_create(&fc, &y), KVP_ERR_NOMEM);
    kvp_fake_script_t w = kvp_fake_script_wedge();
    assert_int_equal(kvp_fake_script_next(X(0), &w), KVP_ERR_NOMEM);
    const void *blob;
    size_t len;
    assert_int_equal(OPS(1)->local_blob(X(1), &blob, &len), KVP_OK);
    kvp_layout_t lay = {NB, BS};
    kvp_xpeer_id_t q = 0;
    assert_int_equal(OPS(0)->add_peer(X(0), blob, len, &lay, &q), KVP_ERR_NOMEM);
    kvp_alloc_fail_at(0, false);
    assert_int_equal(id, 5);
    assert_null(y);
    kvp_xport_stats_t st;
    OPS(0)->get_stats(X(0), &st);
    assert_int_equal(st.writes, 0);
    assert_int_equal(st.peers, 1);
    assert_int_equal(OPS(0)->write(X(0), p, &b, 1, &id), KVP_OK);
    advance(f, MS);
    assert_true(slot_is(f, 1, b.dst_slot, 4));
    fix_close(f);
}

/* Mutation: events applied in list order instead of (time, id): the later
 * write with the earlier deadline would land first and be overwritten. */
static void test_fabric_event_order(void **state)
{
    fix_t fx, *f = &fx;
    fix_open(f, 3, KVP_PATH_FAKE_FENCEABLE);
    kvp_xpeer_id_t p01 = connect_to(f, 0, 2), p12 = connect_to(f, 1, 2);
    kvp_slot_ref_t d = dst_block(f, 2, "k");
    kvp_xfer_block_t b0 = blk(src_block(f, 0, "k", 0x10), d),
                     b1 = blk(src_block(f, 1, "k", 0x11), d);
    kvp_fake_script_t late = kvp_fake_script_complete(3 * MS), early = kvp_fake_script_complete(MS);
    assert_int_equal(kvp_fake_script_next(X(1), &early), KVP_OK);
    assert_int_equal(kvp_fake_script_next(X(0), &late), KVP_OK);
    kvp_xfer_id_t i0, i1;
    /* the first write (lower id) has the later deadline */
    assert_int_equal(OPS(0)->write(X(0), p01, &b0, 1, &i0), KVP_OK);
    assert_int_equal(OPS(1)->write(X(1), p12, &b1, 1, &i1), KVP_OK);
    assert_true(i0 < i1);
    assert_int_equal(kvp_fake_fabric_next_event_ns(f->fab), 1000 + MS);
    kvp_manual_clock_advance(&f->clk, 5 * MS);
    assert_true(kvp_fake_fabric_progress(f->fab));
    assert_false(kvp_fake_fabric_progress(f->fab));
    assert_true(slot_is(f, 2, d.slot, 0x10)); /* the later deadline wins */
    assert_int_equal(kvp_fake_fabric_next_event_ns(f->fab), KVP_FAKE_NEVER);
    /* equal times: ascending id, so the later write lands last */
    assert_int_equal(kvp_fake_script_next(X(0), &early), KVP_OK);
    assert_int_equal(kvp_fake_script_next(X(1), &early), KVP_OK);
    assert_int_equal(OPS(0)->write(X(0), p01, &b0, 1, &i0), KVP_OK);
    assert_int_equal(OPS(1)->write(X(1), p12, &b1, 1, &i1), KVP_OK);
    advance(f, MS);
    assert_true(slot_is(f, 2, d.slot, 0x11));
    assert_int_equal(violations(f), 0);
    fix_close(f);
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_complete_after_delay),
    cmocka_unit_test(test_wedge_never_terminal),
    cmocka_unit_test(test_fail_partial_copy),
    cmocka_unit_test(test_fail_submit),
    cmocka_unit_test(test_disconnect),
    cmocka_unit_test(test_peer_error_and_path),
    cmocka_unit_test(test_late_copy_after_terminal),
    cmocka_unit_test(test_cancel_wait_keeps_running),
    cmocka_unit_test(test_cancel_immediate_copy_still_lands),
    cmocka_unit_test(test_poll_scoped_per_peer),
    cmocka_unit_test(test_remove_peer_retires),
    cmocka_unit_test(test_remove_idle_peer_released_at_once),
    cmocka_unit_test(test_force_release_retired),
    cmocka_unit_test(test_fence_fenceable_drops_late_copies),
    cmocka_unit_test(test_fence_unfenceable_lands),
    cmocka_unit_test(test_fence_holds_for_later_posts_of_that_endpoint),
    cmocka_unit_test(test_close_refuses_unless_forced),
    cmocka_unit_test(test_bad_blob),
    cmocka_unit_test(test_write_bad_input),
    cmocka_unit_test(test_alloc_failures),
    cmocka_unit_test(test_fabric_event_order),
};

int main(void)
{
    return cmocka_run_group_tests(tests, NULL, NULL);
}
