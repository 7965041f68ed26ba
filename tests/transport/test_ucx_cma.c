/*
 * test_ucx_cma.c -- direct-cma (issue 29 item 4): a same-host source writes
 * into a consumer region UCX did not allocate with process_vm_writev, into
 * the process the kernel names, only while the consumer is proven, only
 * inside its region. A forked target (ucx_testlib) registers plain caller
 * memory; this process is the source.
 *
 *   direct:    the target asleep, 4 blocks land byte-exact (one-sided), no
 *              AM byte, the source counts its writes; fence: no proof.
 *   unproven:  the target never imported our blob (its mark is not in our
 *              segment): our write is refused, nothing is written, by cma
 *              or by AM (mutation: cma without the proof -> lands).
 *   bounds:    a blob claiming one slot fewer: a write into the last real
 *              slot is refused, the slot unchanged (mutation: no bounds
 *              check -> written).
 *   outside:   a blob whose region lies where the target maps nothing: the
 *              write fails cleanly (EFAULT), both alive, region unchanged.
 *   other pid: a blob naming another process's pid: ignored, the write
 *              lands in the process SO_PEERCRED named (mutation: the blob's
 *              pid used -> "does not map its probe segment", write refused).
 * Mutations tried (report): cma_ready() without the proven check ->
 * "unproven" lands 256 KiB; no bounds check (write()'s slot check and
 * cma_bounds_ok) -> "bounds" answers OK for the slot past its layout.
 *   dead:      the target SIGKILLed: the next write is refused, no crash.
 *   split:     32 blocks (2 MiB, >= KVP_HELPER_SPLIT_BYTES) in reverse slot order
 *              go as two syscalls, one per thread, and land byte-exact;
 *              with KVPEER_HELPER_THREAD=0 as one; a split write outside
 *              the target's memory (forged blob) fails in both halves and
 *              counts one failed transfer, no crash
 *              (mutations: the helper's half not written -> verify fails;
 *              no split -> 1 syscall).
 *   writer:    a 2 MiB write in 512 KiB slices (KVPEER_CMA_SLICE_KIB) on the
 *              writer thread, its slices let through one at a time (the
 *              gate): the write returns before anything is written, is not
 *              done while a slice is held back, then lands whole; cancelled
 *              or its peer removed after the first slice, nothing more is
 *              written (the older bytes stay) and the record ends
 *              (mutations: the write on the node thread -> the bytes are
 *              there at once; the drop left out of detach -> the cancelled
 *              write's rest lands).
 *   nice:      the writer and its helper run 10 nice steps below the thread
 *              that starts them by default (their bulk copies give way to
 *              the threads answering peers),
 *              KVPEER_CMA_NICE=0 keeps them at the node's priority, a value
 *              not in 0..19 is logged and the default kept; the thread that
 *              drives the transport stays at its own (mutations: the nice
 *              left out -> 0 where 10 is wanted; applied on the caller's
 *              thread -> its nice 10).
 */
#include "testutil.h"
#include "transport/ucx_int.h"
#include "ucx_testlib.h"

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define SEC KVP_NSEC_PER_SEC
#define MSEC KVP_NSEC_PER_MSEC
#define SC(ns) kvp_test_scaled_ns(ns)
#define BLOB_MAGIC 0x5550564Bu /* ucx_setup.c: the digest's seed */

static kvp_test_logcap_t cap;

static int64_t child_count_not(ut_pair_t *p, uint8_t byte)
{
    ut_reply_t r;
    assert_true(ut_call(&p->child, UT_COUNT_NOT, byte, 0, NULL, 0, &r, NULL, 0));
    return r.v1;
}

static kvp_xport_stats_t xstats(kvp_xport_t *x)
{
    kvp_xport_stats_t s;
    x->ops->get_stats(x, &s);
    return s;
}

/* The child's blob with u32 field at `off` set to v (u64 when wide), its
 * digest recomputed (a forger can: the digest is no authentication). */
static void forge(const ut_pair_t *p, uint8_t *out, size_t off, uint64_t v, bool wide)
{
    memcpy(out, p->blob, p->blob_len);
    for (int i = 0; i < (wide ? 8 : 4); i++)
        out[off + (size_t)i] = (uint8_t)(v >> (8 * i));
    uint64_t d = kvp_hash64(out, p->blob_len - 8, BLOB_MAGIC);
    memcpy(out + p->blob_len - 8, &d, 8);
}

static void open_cma(ut_pair_t *p)
{
    ut_pair_open_ex(p, "", KVP_PATH_DIRECT_CMA, true);
    char lanes[192];
    assert_int_equal(kvp_ucx_peer_lanes(p->x, p->peer, lanes, sizeof(lanes)), KVP_OK);
    assert_non_null(strstr(lanes, "cma=pid-proven"));
}

static void test_cma_direct(void **state)
{
    (void)state;
    ut_pair_t p;
    ut_reply_t r;
    kvp_status_t st;
    open_cma(&p);
    ut_consumer_add_producer(&p, -1);
    for (uint32_t s = 0; s < 4; s++)
        ut_pattern_fill(p.region + (size_t)s * UT_BS, UT_BS, s, 51);
    assert_true(ut_send(&p.child, UT_PAUSE, 300, 0, NULL, 0)); /* the target asleep */
    uint64_t t0 = ut_now_ns();
    kvp_xfer_id_t id = ut_post4(&p, 0);
    assert_true(ut_wait_xfer(p.x, p.peer, id, SC(5 * SEC), &st));
    uint64_t took = ut_now_ns() - t0;
    assert_int_equal(st, KVP_OK);
    assert_true(took < 250 * MSEC); /* done while the target slept: nobody else wrote */
    assert_true(ut_recv_reply(&p.child, &r, NULL, 0));
    uint32_t pairs[8] = {0, 0, 1, 1, 2, 2, 3, 3};
    assert_true(ut_call(&p.child, UT_VERIFY, 0, 51, pairs, sizeof(pairs), &r, NULL, 0));
    assert_int_equal(r.v1, 0);
    assert_true(ut_call(&p.child, UT_DROPPED, 0, 0, NULL, 0, &r, NULL, 0));
    assert_int_equal(r.v2, 0); /* no AM byte landed: the target's handler saw nothing */
    kvp_xport_stats_t xs = xstats(p.x);
    print_message("  direct-cma: 4 x %u B in %.3f ms while the target slept, %llu writes, "
                  "%llu B\n", UT_BS, (double)took / 1e6, (unsigned long long)xs.cma_writes,
                  (unsigned long long)xs.cma_bytes);
    assert_int_equal(xs.cma_bytes, 4ull * UT_BS);
    assert_int_equal(xs.cma_writes, 1); /* 4 adjacent slots: one run, one syscall */
    assert_int_equal(xs.puts, 0);
    assert_true(ut_call(&p.child, UT_FENCE, 0, 0, NULL, 0, &r, NULL, 0));
    assert_int_equal(r.status, KVP_OK);
    assert_int_equal(r.v1, 0); /* unfenceable: no proof, as direct shm */
    ut_pair_close(&p);
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void test_cma_unproven(void **state)
{
    (void)state;
    ut_pair_t p;
    ut_reply_t r;
    kvp_status_t st;
    open_cma(&p); /* the target never imports our blob: not proven */
    assert_false(kvp_ucx_peer_proven(p.x, p.peer));
    assert_true(ut_call(&p.child, UT_FILL, 0xAA, 0, NULL, 0, &r, NULL, 0));
    kvp_xfer_block_t b[4] = {{0, 0, 0, 0}, {1, 0, 1, 0}, {2, 0, 2, 0}, {3, 0, 3, 0}};
    kvp_xfer_id_t id = 0;
    kvp_test_logcap_start(&cap);
    st = p.x->ops->write(p.x, p.peer, b, 4, &id); /* refused: not by AM either */
    kvp_test_logcap_stop();
    int64_t landed = child_count_not(&p, 0xAA);
    assert_true(ut_call(&p.child, UT_DROPPED, 0, 0, NULL, 0, &r, NULL, 0));
    print_message("  unproven: write %s, %lld B landed, %lld B by AM, %llu cma writes\n",
                  kvp_status_str(st), (long long)landed, (long long)(r.v1 + r.v2),
                  (unsigned long long)xstats(p.x).cma_writes);
    assert_int_equal(st, KVP_ERR_TRANSPORT);
    assert_int_equal(landed, 0);
    assert_int_equal(r.v1 + r.v2, 0); /* no AM byte either (its handler expects all) */
    assert_int_equal(xstats(p.x).cma_writes, 0);
    ut_pair_close(&p);
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* A forged blob of the target as a second peer; the caller checks. */
static kvp_xpeer_id_t add_forged(ut_pair_t *p, const uint8_t *b, kvp_layout_t lay)
{
    kvp_xpeer_id_t id = 0;
    assert_int_equal(p->x->ops->add_peer(p->x, b, p->blob_len, &lay, &id), KVP_OK);
    return id;
}

static void test_cma_bounds(void **state)
{
    (void)state;
    ut_pair_t p;
    ut_reply_t r;
    uint8_t b[KVP_UCX_BLOB_MAX];
    open_cma(&p);
    ut_consumer_add_producer(&p, -1);
    assert_true(ut_call(&p.child, UT_FILL, 0xAA, 0, NULL, 0, &r, NULL, 0));
    forge(&p, b, 8, UT_NB - 1, false); /* num_blocks: one slot fewer than its region */
    kvp_xpeer_id_t f = add_forged(&p, b, (kvp_layout_t){UT_NB - 1, UT_BS});
    assert_int_equal(p.x->ops->peer_path(p.x, f), KVP_PATH_DIRECT_CMA);
    kvp_xfer_block_t blk = {0, 0, UT_NB - 1, 0}, ok = {0, 0, UT_NB - 2, 0};
    kvp_xfer_id_t id = 0;
    kvp_status_t st;
    assert_int_equal(p.x->ops->write(p.x, f, &blk, 1, &id), KVP_ERR_INVALID);
    assert_int_equal(child_count_not(&p, 0xAA), 0); /* nothing written */
    assert_int_equal(p.x->ops->write(p.x, f, &ok, 1, &id), KVP_OK); /* the control: inside */
    assert_true(ut_wait_xfer(p.x, f, id, SC(5 * SEC), &st));
    assert_int_equal(st, KVP_OK);
    assert_int_equal(child_count_not(&p, 0xAA), (int64_t)UT_BS);
    assert_int_equal(p.x->ops->remove_peer(p.x, f), KVP_OK);
    ut_pair_close(&p);
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void test_cma_outside(void **state)
{
    (void)state;
    ut_pair_t p;
    ut_reply_t r;
    uint8_t b[KVP_UCX_BLOB_MAX];
    kvp_test_logcap_start(&cap);
    open_cma(&p);
    ut_consumer_add_producer(&p, -1);
    assert_true(ut_call(&p.child, UT_FILL, 0xAA, 0, NULL, 0, &r, NULL, 0));
    /* region base: a non-canonical address (bit 62), outside every user
     * address space (4- and 5-level paging), so nothing can be mapped there
     * under any sanitizer; 1 TiB, used first, is TSan's shadow: it took the
     * write. */
    forge(&p, b, 16, 0x4000000000000000ull, true);
    kvp_xpeer_id_t f = add_forged(&p, b, ut_layout);
    kvp_xfer_id_t id = 0;
    kvp_status_t st = p.x->ops->write(p.x, f, &(kvp_xfer_block_t){0, 0, 3, 0}, 1, &id);
    if (st == KVP_OK) { /* posted: it must fail */
        assert_true(ut_wait_xfer(p.x, f, id, SC(5 * SEC), &st));
        assert_int_not_equal(st, KVP_OK);
    }
    print_message("  outside its region: %s, %llu failed cma writes\n", kvp_status_str(st),
                  (unsigned long long)xstats(p.x).cma_failed);
    assert_int_not_equal(st, KVP_OK);
    assert_int_equal(xstats(p.x).cma_bytes, 0);
    assert_int_equal(child_count_not(&p, 0xAA), 0); /* alive, unchanged */
    assert_int_equal(p.x->ops->remove_peer(p.x, f), KVP_OK);
    ut_pair_close(&p);
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void test_cma_other_pid(void **state)
{
    (void)state;
    ut_pair_t p;
    ut_reply_t r;
    kvp_status_t st;
    uint8_t b[KVP_UCX_BLOB_MAX];
    pid_t victim = fork(); /* a process of ours that maps nothing at the target's region */
    if (victim == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives a failed test */
        for (;;)
            pause();
    }
    assert_true(victim > 0);
    open_cma(&p);
    ut_consumer_add_producer(&p, -1);
    forge(&p, b, 32, (uint64_t)victim, false); /* the blob's pid: the peer's word only */
    kvp_xpeer_id_t f = add_forged(&p, b, ut_layout);
    assert_int_equal(p.x->ops->peer_path(p.x, f), KVP_PATH_DIRECT_CMA);
    ut_pattern_fill(p.region + 5 * (size_t)UT_BS, UT_BS, 5, 77);
    kvp_xfer_id_t id = 0;
    assert_int_equal(p.x->ops->write(p.x, f, &(kvp_xfer_block_t){5, 0, 9, 0}, 1, &id), KVP_OK);
    assert_true(ut_wait_xfer(p.x, f, id, SC(5 * SEC), &st));
    assert_int_equal(st, KVP_OK); /* into the kernel's pid: the target */
    uint32_t pairs[2] = {9, 5};
    assert_true(ut_call(&p.child, UT_VERIFY, 0, 77, pairs, sizeof(pairs), &r, NULL, 0));
    assert_int_equal(r.v1, 0);
    kill(victim, SIGKILL);
    waitpid(victim, NULL, 0);
    assert_int_equal(p.x->ops->remove_peer(p.x, f), KVP_OK);
    ut_pair_close(&p);
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void test_cma_dead(void **state)
{
    (void)state;
    ut_pair_t p;
    kvp_status_t st;
    kvp_test_logcap_start(&cap);
    open_cma(&p);
    ut_consumer_add_producer(&p, -1);
    kvp_xfer_id_t id = ut_post4(&p, 0);
    assert_true(ut_wait_xfer(p.x, p.peer, id, SC(5 * SEC), &st));
    assert_int_equal(st, KVP_OK);
    ut_child_kill(&p.child);
    kvp_xfer_block_t b[4] = {{0, 0, 4, 0}, {1, 0, 5, 0}, {2, 0, 6, 0}, {3, 0, 7, 0}};
    st = p.x->ops->write(p.x, p.peer, b, 4, &id);
    if (st == KVP_OK) {
        assert_true(ut_wait_xfer(p.x, p.peer, id, SC(5 * SEC), &st));
        assert_int_not_equal(st, KVP_OK);
    }
    print_message("  target killed: next write %s\n", kvp_status_str(st));
    assert_int_not_equal(st, KVP_OK);
    assert_int_equal(xstats(p.x).cma_bytes, 4ull * UT_BS); /* only the first */
    assert_int_equal(p.x->ops->remove_peer(p.x, p.peer), KVP_OK);
    (void)ut_drain_retired(p.x, 2 * MSEC, SC(2 * SEC));
    assert_int_equal(p.x->ops->close(p.x, false), KVP_OK);
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* 32 blocks, source slot s into destination slot 63 - s: no two adjacent,
 * 32 runs (one syscall unless split). */
static kvp_status_t write_reversed(ut_pair_t *p, kvp_xpeer_id_t peer, kvp_xfer_id_t *id)
{
    kvp_xfer_block_t b[32];
    for (uint32_t s = 0; s < 32; s++)
        b[s] = (kvp_xfer_block_t){s, 0, UT_NB - 1 - s, 0};
    return p->x->ops->write(p->x, peer, b, 32, id);
}

static void split_case(bool split)
{
    ut_pair_t p;
    ut_reply_t r;
    kvp_status_t st;
    kvp_xfer_id_t id = 0;
    if (!split)
        setenv("KVPEER_HELPER_THREAD", "0", 1);
    open_cma(&p);
    ut_consumer_add_producer(&p, -1);
    for (uint32_t s = 0; s < 32; s++)
        ut_pattern_fill(p.region + (size_t)s * UT_BS, UT_BS, s, 53);
    assert_int_equal(write_reversed(&p, p.peer, &id), KVP_OK);
    assert_true(ut_wait_xfer(p.x, p.peer, id, SC(5 * SEC), &st));
    assert_int_equal(st, KVP_OK);
    uint32_t pairs[64];
    for (uint32_t s = 0; s < 32; s++) {
        pairs[2 * s] = UT_NB - 1 - s; /* (destination, source) */
        pairs[2 * s + 1] = s;
    }
    assert_true(ut_call(&p.child, UT_VERIFY, 0, 53, pairs, sizeof(pairs), &r, NULL, 0));
    assert_int_equal(r.v1, 0); /* every block byte-exact, both halves */
    kvp_xport_stats_t xs = xstats(p.x);
    print_message("  %s: 32 x %u B in %llu syscall(s), %llu B\n", split ? "split" : "no split",
                  UT_BS, (unsigned long long)xs.cma_writes, (unsigned long long)xs.cma_bytes);
    assert_int_equal(xs.cma_bytes, 32ull * UT_BS);
    assert_int_equal(xs.cma_writes, split ? 2 : 1);
    unsetenv("KVPEER_HELPER_THREAD"); /* read when the helper would start: done */
    /* Both halves fail (a forged blob's region where nothing is mapped, as
     * "outside"): one failure is reported for the transfer. */
    uint8_t b[KVP_UCX_BLOB_MAX];
    forge(&p, b, 16, 0x4000000000000000ull, true);
    kvp_xpeer_id_t f = add_forged(&p, b, ut_layout);
    st = write_reversed(&p, f, &id);
    if (st == KVP_OK) {
        assert_true(ut_wait_xfer(p.x, f, id, SC(5 * SEC), &st));
        assert_int_not_equal(st, KVP_OK);
    }
    xs = xstats(p.x);
    assert_int_equal(xs.cma_failed, 1); /* one per transfer, not one per half */
    assert_int_equal(xs.cma_bytes, 32ull * UT_BS); /* nothing more written */
    assert_int_equal(p.x->ops->remove_peer(p.x, f), KVP_OK);
    assert_int_equal(p.x->ops->remove_peer(p.x, p.peer), KVP_OK);
    (void)ut_drain_retired(p.x, 2 * MSEC, SC(2 * SEC));
    assert_int_equal(p.x->ops->close(p.x, false), KVP_OK);
}

static void test_cma_split(void **state)
{
    (void)state;
    kvp_test_logcap_start(&cap);
    split_case(true);
    split_case(false);
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* Destination slots 63 - s for s in [first, last) hold source slot s's
 * pattern of `seed`: mismatching blocks. */
static int64_t verify_reversed(ut_pair_t *p, uint32_t first, uint32_t last, uint64_t seed)
{
    uint32_t pairs[64];
    ut_reply_t r;
    for (uint32_t s = first; s < last; s++) {
        pairs[2 * (s - first)] = UT_NB - 1 - s;
        pairs[2 * (s - first) + 1] = s;
    }
    assert_true(ut_call(&p->child, UT_VERIFY, 0, seed, pairs, (last - first) * 8, &r, NULL, 0));
    return r.v1;
}

/* Until the source's first slice of the write landed in the target. */
static void wait_first_slice(ut_pair_t *p, uint64_t seed)
{
    uint64_t until = ut_now_ns() + SC(5 * SEC);
    while (verify_reversed(p, 0, 8, seed) != 0)
        assert_true(ut_now_ns() < until);
}

/* The writer thread (ucx_cma_writer.c), its slices held by the test's
 * gate: a 2 MiB write in 512 KiB slices returns before anything is
 * written and is not done while the writer may not go on; with the gate
 * open it lands whole, a syscall per slice. Cancelled after its first
 * slice, or its peer removed then, no slice more is written (the older
 * bytes stay) and the record ends. */
static void test_cma_writer(void **state)
{
    (void)state;
    ut_pair_t p;
    kvp_status_t st;
    kvp_xfer_id_t id = 0;
    kvp_xfer_result_t res[4];
    size_t n;
    const uint64_t slice = 512 * 1024;
    kvp_test_logcap_start(&cap);
    setenv("KVPEER_CMA_SLICE_KIB", "512", 1); /* read when the transport opens */
    open_cma(&p);
    unsetenv("KVPEER_CMA_SLICE_KIB");
    ut_consumer_add_producer(&p, -1);
    ucx_xport_t *x = ucx_of(p.x);
    for (uint32_t s = 0; s < 32; s++)
        ut_pattern_fill(p.region + (size_t)s * UT_BS, UT_BS, s, 53);
    kvp__ucx_cma_gate(x, 0);
    assert_int_equal(write_reversed(&p, p.peer, &id), KVP_OK); /* queued: nothing written */
    ut_progress_for(p.x, SC(20 * MSEC));
    assert_int_equal(child_count_not(&p, 0), 0);
    kvp__ucx_cma_gate(x, 1);
    wait_first_slice(&p, 53);
    ut_progress_for(p.x, SC(20 * MSEC));
    assert_int_equal(p.x->ops->poll(p.x, p.peer, res, 4, &n), KVP_OK);
    assert_int_equal(n, 0); /* not done: three slices to go */
    assert_int_equal(verify_reversed(&p, 8, 9, 53), 1); /* the second slice not written */
    kvp__ucx_cma_gate(x, SIZE_MAX);
    assert_true(ut_wait_xfer(p.x, p.peer, id, SC(5 * SEC), &st));
    assert_int_equal(st, KVP_OK);
    assert_int_equal(verify_reversed(&p, 0, 32, 53), 0);
    kvp_xport_stats_t xs = xstats(p.x);
    assert_int_equal(xs.cma_bytes, 32ull * UT_BS);
    assert_int_equal(xs.cma_writes, 4); /* a syscall per slice */
    /* dropped by a cancel after its first slice */
    for (uint32_t s = 0; s < 32; s++)
        ut_pattern_fill(p.region + (size_t)s * UT_BS, UT_BS, s, 57);
    kvp__ucx_cma_gate(x, 1);
    assert_int_equal(write_reversed(&p, p.peer, &id), KVP_OK);
    wait_first_slice(&p, 57);
    assert_int_equal(p.x->ops->cancel(p.x, &id, 1, KVP_CANCEL_IMMEDIATE, NULL, NULL), KVP_OK);
    kvp__ucx_cma_gate(x, SIZE_MAX);
    ut_progress_for(p.x, SC(20 * MSEC));
    assert_int_equal(xstats(p.x).cma_bytes, 32ull * UT_BS + slice);
    assert_int_equal(verify_reversed(&p, 0, 8, 57), 0);  /* the slice written */
    assert_int_equal(verify_reversed(&p, 8, 32, 53), 0); /* the rest never */
    /* dropped by the removal of its peer: its record terminal, failed */
    for (uint32_t s = 0; s < 32; s++)
        ut_pattern_fill(p.region + (size_t)s * UT_BS, UT_BS, s, 59);
    kvp__ucx_cma_gate(x, 1);
    assert_int_equal(write_reversed(&p, p.peer, &id), KVP_OK);
    wait_first_slice(&p, 59);
    assert_int_equal(p.x->ops->remove_peer(p.x, p.peer), KVP_OK);
    kvp__ucx_cma_gate(x, SIZE_MAX);
    xs = ut_drain_retired(p.x, 2 * MSEC, SC(2 * SEC));
    print_message("  writer: 32 x %u B in 512 KiB slices, %llu syscalls, %llu B written "
                  "(two writes dropped after their first slice)\n",
                  UT_BS, (unsigned long long)xs.cma_writes, (unsigned long long)xs.cma_bytes);
    assert_int_equal(xs.cma_bytes, 32ull * UT_BS + 2 * slice);
    assert_int_equal(verify_reversed(&p, 8, 32, 53), 0);
    assert_int_equal(p.x->ops->close(p.x, false), KVP_OK);
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* The nice of this process's thread named `name` (/proc/self/task/N/stat,
 * field 19), or -100 if there is none. */
static int thread_nice(const char *name)
{
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    int nice = -100;
    for (struct dirent *e; nice == -100 && (e = readdir(d)) != NULL;) {
        char path[300], buf[512] = "";
        snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        bool match = fgets(buf, sizeof(buf), f) != NULL && strcspn(buf, "\n") == strlen(name) &&
                     strncmp(buf, name, strlen(name)) == 0;
        fclose(f);
        snprintf(path, sizeof(path), "/proc/self/task/%s/stat", e->d_name);
        if (!match || (f = fopen(path, "r")) == NULL)
            continue;
        size_t got = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[got] = '\0';
        char *t = strrchr(buf, ')'); /* then state, ppid, ... : nice is the 17th field after */
        for (int i = 0; t != NULL && i < 17; i++)
            t = strchr(t + 1, ' ');
        assert_non_null(t);
        nice = atoi(t + 1);
    }
    closedir(d);
    return nice;
}

static int g_nice0; /* this thread's nice when the test began (a CI may run us niced) */

static void nice_case(const char *env, int want, bool warned)
{
    ut_pair_t p;
    kvp_status_t st;
    kvp_xfer_id_t id = 0;
    kvp_test_logcap_start(&cap);
    if (env != NULL)
        setenv("KVPEER_CMA_NICE", env, 1); /* read when the transport opens */
    open_cma(&p);
    unsetenv("KVPEER_CMA_NICE");
    ut_consumer_add_producer(&p, -1);
    assert_int_equal(write_reversed(&p, p.peer, &id), KVP_OK); /* starts the writer */
    assert_true(ut_wait_xfer(p.x, p.peer, id, SC(5 * SEC), &st));
    assert_int_equal(st, KVP_OK);
    int w = thread_nice("kvp-cma-writer"), h = thread_nice("kvp-cma-helper");
    int self = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
    print_message("  KVPEER_CMA_NICE=%s: writer at nice %d, its helper %d, the caller's thread %d\n",
                  env ? env : "(unset)", w, h, self);
    want = self + want > 19 ? 19 : self + want; /* relative to the thread that started them */
    assert_int_equal(w, want);
    assert_int_equal(h, want);
    assert_int_equal(self, g_nice0); /* the thread driving the transport keeps its priority */
    bool logged = cap.count[KVP_LOG_WARN] > 0 && strstr(cap.last[KVP_LOG_WARN], "KVPEER_CMA_NICE");
    assert_int_equal(logged, warned);
    assert_int_equal(p.x->ops->remove_peer(p.x, p.peer), KVP_OK);
    (void)ut_drain_retired(p.x, 2 * MSEC, SC(2 * SEC));
    assert_int_equal(p.x->ops->close(p.x, false), KVP_OK);
    assert_int_equal(thread_nice("kvp-cma-writer"), -100); /* joined at close */
    kvp_test_logcap_stop();
}

static void test_cma_nice(void **state)
{
    (void)state;
    g_nice0 = getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
    nice_case(NULL, 10, false);
    nice_case("0", 0, false);
    nice_case("7", 7, false);
    nice_case("20", 10, true);
    nice_case("ten", 10, true);
    KVP_TEST_ASSERT_NO_LEAKS();
}

int main(int argc, char **argv)
{
    (void)argc;
    ut_main_init(argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cma_direct),   cmocka_unit_test(test_cma_unproven),
        cmocka_unit_test(test_cma_bounds),   cmocka_unit_test(test_cma_outside),
        cmocka_unit_test(test_cma_other_pid), cmocka_unit_test(test_cma_dead),
        cmocka_unit_test(test_cma_split),    cmocka_unit_test(test_cma_writer),
        cmocka_unit_test(test_cma_nice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
