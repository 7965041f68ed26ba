/*
 * test_ucx.c -- UCX backend, core: real two-process writes on 127.0.0.1 with
 * the data path asserted (direct shm by default, tcp when forced), and bad
 * input (malformed blobs, wrong layouts, out-of-range indexes).
 */
#include "testutil.h"
#include "ucx_testlib.h"

#include <stdlib.h>
#include <string.h>

#define NB UT_NB
#define BS UT_BS

static const kvp_layout_t g_layout = {NB, BS};
/* File-static: a failed assert skips logcap_stop, and a stack capture would
 * dangle into the next test. */
static kvp_test_logcap_t cap;

/* Runs and scattered singles: coalescing must not mix up slots. */
static const kvp_xfer_block_t g_blocks[] = {
    {0, 0, 10, 0}, {1, 0, 11, 0},  {2, 0, 12, 0},  {3, 0, 13, 0}, /* run of 4 */
    {20, 0, 3, 0}, {21, 0, 40, 0}, {5, 0, 41, 0},                 /* broken runs */
    {63, 0, 0, 0}, {30, 0, 63, 0}, {31, 0, 62, 0},                /* edges */
};
#define NBLK KVP_ARRAY_SIZE(g_blocks)

static int64_t pair_verify(ut_pair_t *p, uint64_t seed)
{
    uint32_t pairs[2 * NBLK];
    ut_reply_t r;
    for (size_t i = 0; i < NBLK; i++) {
        pairs[2 * i] = g_blocks[i].dst_slot;
        pairs[2 * i + 1] = g_blocks[i].src_slot;
    }
    assert_true(ut_call(&p->child, UT_VERIFY, 0, seed, pairs, sizeof(pairs), &r, NULL, 0));
    return r.v1;
}

static void fill_sources(ut_pair_t *p, uint64_t seed)
{
    for (uint32_t s = 0; s < NB; s++)
        ut_pattern_fill(p->region + (size_t)s * BS, BS, s, seed);
}

/* Write with the target NOT progressing (paused in nanosleep). A direct
 * one-sided put completes and lands anyway (this tells direct shm apart by
 * behaviour, not by what UCX printed); on the AM path the target's handler
 * lands the blocks once it progresses again. */
static void write_while_paused(ut_pair_t *p, bool direct, uint64_t seed)
{
    kvp_xfer_id_t id;
    kvp_status_t st = KVP_ERR_TIMEOUT;
    ut_reply_t r;
    uint64_t pause_ms = kvp_test_scaled_ns(600 * KVP_NSEC_PER_MSEC) / KVP_NSEC_PER_MSEC;

    fill_sources(p, seed);
    assert_true(ut_send(&p->child, UT_PAUSE, pause_ms, 0, NULL, 0));
    ut_progress_for(p->x, kvp_test_scaled_ns(50 * KVP_NSEC_PER_MSEC)); /* child enters its sleep */
    uint64_t t0 = ut_now_ns();
    assert_int_equal(p->x->ops->write(p->x, p->peer, g_blocks, NBLK, &id), KVP_OK);
    assert_int_not_equal(id, 0);
    bool done = ut_wait_xfer(p->x, p->peer, id, kvp_test_scaled_ns(200 * KVP_NSEC_PER_MSEC), &st);
    if (direct) {
        assert_true(done); /* landed with the target asleep: direct put */
        assert_int_equal(st, KVP_OK);
        assert_true(ut_now_ns() - t0 < pause_ms * KVP_NSEC_PER_MSEC);
    } /* AM path: the send may complete locally while the target sleeps; the
       * bytes land only when its handler runs (verified below) */
    assert_true(ut_recv_reply(&p->child, &r, NULL, 0));
    if (!done) {
        assert_true(ut_wait_xfer(p->x, p->peer, id, kvp_test_scaled_ns(5 * KVP_NSEC_PER_SEC), &st));
        assert_int_equal(st, KVP_OK);
    }
    assert_int_equal(pair_verify(p, seed), 0); /* the target saw every byte */
}

static void write_and_verify(ut_pair_t *p, uint64_t seed)
{
    kvp_xfer_id_t id, id2;
    kvp_status_t st = KVP_ERR_TIMEOUT;

    fill_sources(p, seed);
    assert_int_equal(p->x->ops->write(p->x, p->peer, g_blocks, NBLK, &id), KVP_OK);
    assert_int_equal(p->x->ops->write(p->x, p->peer, g_blocks, 1, &id2), KVP_OK);
    assert_int_not_equal(id, id2);
    assert_true(ut_wait_xfer(p->x, p->peer, id, kvp_test_scaled_ns(5 * KVP_NSEC_PER_SEC), &st));
    assert_int_equal(st, KVP_OK);
    assert_true(ut_wait_xfer(p->x, p->peer, id2, kvp_test_scaled_ns(5 * KVP_NSEC_PER_SEC), &st));
    assert_int_equal(st, KVP_OK);
    assert_int_equal(pair_verify(p, seed), 0);
    assert_int_not_equal(pair_verify(p, seed + 1), 0); /* the check can fail */
}

static void test_ucx_write_shm_direct(void **state)
{
    ut_pair_t p;
    kvp_test_logcap_start(&cap);
    ut_pair_open(&p, "", KVP_PATH_DIRECT_SHM);
    write_and_verify(&p, 7);
    write_while_paused(&p, true, 8);
    kvp_xport_stats_t st;
    p.x->ops->get_stats(p.x, &st);
    assert_int_equal(st.done, 3);
    assert_int_equal(st.failed, 0);
    assert_int_equal(st.blocks_written, 2 * NBLK + 1);
    ut_pair_close(&p);
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* A run of adjacent slots longer than one put (UCX_PUT_MAX_BYTES = 256 KiB
 * in ucx.c, 4 blocks here) goes as several puts under one flush: 11 blocks
 * = 4 + 4 + 3, then a single block and a run of 2. Every byte must land in
 * its own slot (a piece written at the run's start, or past its end, shows)
 * and the puts are counted. */
static const kvp_xfer_block_t g_long[] = {
    {40, 0, 20, 0}, {41, 0, 21, 0}, {42, 0, 22, 0}, {43, 0, 23, 0}, {44, 0, 24, 0},
    {45, 0, 25, 0}, {46, 0, 26, 0}, {47, 0, 27, 0}, {48, 0, 28, 0}, {49, 0, 29, 0},
    {50, 0, 30, 0}, /* run of 11: pieces of 4, 4, 3 blocks */
    {7, 0, 31, 0},  /* adjacent in dst only: a new run */
    {8, 0, 50, 0},  {9, 0, 51, 0},
};

static void test_ucx_write_shm_long_run(void **state)
{
    ut_pair_t p;
    kvp_xfer_id_t id;
    kvp_status_t st = KVP_ERR_TIMEOUT;
    ut_reply_t r;
    uint32_t pairs[2 * KVP_ARRAY_SIZE(g_long)];
    kvp_xport_stats_t xs;
    kvp_test_logcap_start(&cap);
    ut_pair_open(&p, "", KVP_PATH_DIRECT_SHM);
    fill_sources(&p, 21);
    assert_true(ut_call(&p.child, UT_FILL, 0xee, 0, NULL, 0, &r, NULL, 0));
    assert_int_equal(p.x->ops->write(p.x, p.peer, g_long, KVP_ARRAY_SIZE(g_long), &id), KVP_OK);
    assert_true(ut_wait_xfer(p.x, p.peer, id, kvp_test_scaled_ns(5 * KVP_NSEC_PER_SEC), &st));
    assert_int_equal(st, KVP_OK);
    for (size_t i = 0; i < KVP_ARRAY_SIZE(g_long); i++) {
        pairs[2 * i] = g_long[i].dst_slot;
        pairs[2 * i + 1] = g_long[i].src_slot;
    }
    assert_true(ut_call(&p.child, UT_VERIFY, 0, 21, pairs, sizeof(pairs), &r, NULL, 0));
    assert_int_equal(r.v1, 0); /* every destination holds its source, byte-exact */
    /* nothing outside the 14 destinations was written: the pattern holds
     * some 0xee bytes, so the count is at most 14 slots' bytes (one more
     * slot written would add ~BS) */
    assert_true(ut_call(&p.child, UT_COUNT_NOT, 0xee, 0, NULL, 0, &r, NULL, 0));
    assert_true(r.v1 <= (int64_t)KVP_ARRAY_SIZE(g_long) * BS);
    assert_true(r.v1 > (int64_t)(KVP_ARRAY_SIZE(g_long) - 1) * BS);
    p.x->ops->get_stats(p.x, &xs);
    assert_int_equal(xs.puts, 3 + 1 + 1);
    assert_int_equal(xs.blocks_written, KVP_ARRAY_SIZE(g_long));
    ut_pair_close(&p);
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* A direct-shm transfer of at least 1 MiB (UCX_STREAM_MIN_BYTES in ucx.c)
 * is copied by us with streaming stores into the peer's mapped region: 17
 * adjacent blocks (1088 KiB: pieces of 4, 4, 4, 4, 1 blocks) and three
 * singles. Byte-exact, nothing else written, counted as stream copies (no
 * ucp_put_nbx); the same blocks in a transfer under 1 MiB go by ucp_put_nbx. */
static void test_ucx_write_shm_stream(void **state)
{
    kvp_xfer_block_t blocks[20];
    uint32_t pairs[2 * 20];
    ut_pair_t p;
    kvp_xfer_id_t id;
    kvp_status_t st = KVP_ERR_TIMEOUT;
    ut_reply_t r;
    kvp_xport_stats_t xs;
    for (uint32_t i = 0; i < 17; i++)
        blocks[i] = (kvp_xfer_block_t){40 + i, 0, 10 + i, 0};
    blocks[17] = (kvp_xfer_block_t){3, 0, 60, 0};
    blocks[18] = (kvp_xfer_block_t){4, 0, 0, 0};
    blocks[19] = (kvp_xfer_block_t){63, 0, 63, 0};
    for (uint32_t i = 0; i < 20; i++) {
        pairs[2 * i] = blocks[i].dst_slot;
        pairs[2 * i + 1] = blocks[i].src_slot;
    }
    kvp_test_logcap_start(&cap);
    ut_pair_open(&p, "", KVP_PATH_DIRECT_SHM);
    fill_sources(&p, 31);
    assert_true(ut_call(&p.child, UT_FILL, 0xee, 0, NULL, 0, &r, NULL, 0));
    assert_int_equal(p.x->ops->write(p.x, p.peer, blocks, 20, &id), KVP_OK);
    assert_true(ut_wait_xfer(p.x, p.peer, id, kvp_test_scaled_ns(5 * KVP_NSEC_PER_SEC), &st));
    assert_int_equal(st, KVP_OK);
    assert_true(ut_call(&p.child, UT_VERIFY, 0, 31, pairs, sizeof(pairs), &r, NULL, 0));
    assert_int_equal(r.v1, 0);
    assert_true(ut_call(&p.child, UT_COUNT_NOT, 0xee, 0, NULL, 0, &r, NULL, 0));
    assert_true(r.v1 <= 20 * (int64_t)BS && r.v1 > 19 * (int64_t)BS);
    p.x->ops->get_stats(p.x, &xs);
    assert_int_equal(xs.stream_copies, 5 + 3);
    assert_int_equal(xs.puts, 0);
    /* 15 blocks = 960 KiB: below the bound, UCX puts (4+4+4+3 blocks) */
    fill_sources(&p, 32);
    assert_int_equal(p.x->ops->write(p.x, p.peer, blocks, 15, &id), KVP_OK);
    assert_true(ut_wait_xfer(p.x, p.peer, id, kvp_test_scaled_ns(5 * KVP_NSEC_PER_SEC), &st));
    assert_int_equal(st, KVP_OK);
    assert_true(ut_call(&p.child, UT_VERIFY, 0, 32, pairs, 15 * 8, &r, NULL, 0));
    assert_int_equal(r.v1, 0);
    p.x->ops->get_stats(p.x, &xs);
    assert_int_equal(xs.stream_copies, 5 + 3);
    assert_int_equal(xs.puts, 4);
    ut_pair_close(&p);
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void test_ucx_write_tcp_forced(void **state)
{
    ut_pair_t p;
    kvp_test_logcap_start(&cap);
    ut_pair_open(&p, "tcp", KVP_PATH_AM_TCP);
    /* F28: a same-host peer on tcp is reported loudly. */
    assert_true(cap.count[KVP_LOG_WARN] >= 1);
    assert_non_null(strstr(cap.last[KVP_LOG_WARN], "tcp"));
    /* what is true when tcp was chosen: the transports named, no speed guess */
    assert_non_null(strstr(cap.last[KVP_LOG_WARN], "UCX_TLS=tcp"));
    assert_null(strstr(cap.last[KVP_LOG_WARN], "bandwidth"));
    write_and_verify(&p, 11);
    write_while_paused(&p, false, 12);
    ut_pair_close(&p);
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* Active messages (issue 17): the source's transfer is terminal once its
 * sends completed locally -- the block left the source slot -- without the
 * target progressing. An endpoint flush after the sends (what the AM path
 * did before) completed on tcp only after the target's next progress, one
 * more wait per request. The target's own landing is what proves delivery
 * (checked once it runs again). One 64 KiB block fits the loopback socket
 * buffers, so the send itself never waits for the target. */
static void test_ucx_am_done_without_target(void **state)
{
    ut_pair_t p;
    kvp_xfer_id_t id;
    kvp_status_t st = KVP_ERR_TIMEOUT;
    ut_reply_t r;
    const kvp_xfer_block_t blk = {9, 0, 17, 0};
    const uint32_t pair[2] = {17, 9};
    uint64_t pause_ms = kvp_test_scaled_ns(3 * KVP_NSEC_PER_SEC) / KVP_NSEC_PER_MSEC;

    kvp_test_logcap_start(&cap);
    ut_pair_open(&p, "tcp", KVP_PATH_AM_TCP);
    write_and_verify(&p, 40); /* the endpoints are wired up both ways */
    fill_sources(&p, 41);
    assert_true(ut_send(&p.child, UT_PAUSE, pause_ms, 0, NULL, 0));
    ut_progress_for(p.x, kvp_test_scaled_ns(50 * KVP_NSEC_PER_MSEC)); /* child enters its sleep */
    uint64_t t0 = ut_now_ns();
    assert_int_equal(p.x->ops->write(p.x, p.peer, &blk, 1, &id), KVP_OK);
    bool done = ut_wait_xfer(p.x, p.peer, id, kvp_test_scaled_ns(1 * KVP_NSEC_PER_SEC), &st);
    uint64_t took = ut_now_ns() - t0;
    assert_true(done); /* terminal while the target sleeps */
    assert_int_equal(st, KVP_OK);
    assert_true(took < pause_ms * KVP_NSEC_PER_MSEC / 2);
    assert_true(ut_recv_reply(&p.child, &r, NULL, 0)); /* the target woke up */
    assert_true(ut_call(&p.child, UT_VERIFY, 0, 41, pair, sizeof(pair), &r, NULL, 0));
    assert_int_equal(r.v1, 0); /* and its handler landed every byte */
    ut_pair_close(&p);
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* Target region in caller memory: UCX cannot map it, so the same default
 * config must land on the EMULATED shm path (and say so), and puts wait for
 * the target's progress. */
static void test_ucx_write_shm_emulated(void **state)
{
    ut_pair_t p;
    kvp_test_logcap_start(&cap);
    ut_pair_open_ex(&p, "", KVP_PATH_AM_SHM, true);
    assert_true(cap.count[KVP_LOG_WARN] >= 1); /* "emulated" warning */
    write_and_verify(&p, 21);
    write_while_paused(&p, false, 22);
    ut_pair_close(&p);
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* UCX_TLS from the environment must still apply (ucp_config_read). */
static void test_ucx_write_tcp_env(void **state)
{
    ut_pair_t p;
    setenv("UCX_TLS", "tcp", 1); /* inherited by the child at fork */
    ut_pair_open(&p, "", KVP_PATH_AM_TCP);
    write_and_verify(&p, 13);
    ut_pair_close(&p);
    unsetenv("UCX_TLS");
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* ------------------------------------------------------------ bad input */

static kvp_xport_t *solo(kvp_layout_t lay, uint8_t **region)
{
    kvp_xport_t *x = ut_xport_new("", "solo");
    void *base = NULL;
    assert_non_null(x);
    assert_int_equal(
        x->ops->register_region(x, NULL, (size_t)lay.num_blocks * lay.block_size, &lay, &base),
        KVP_OK);
    if (region)
        *region = base;
    return x;
}

static void test_ucx_bad_blob(void **state)
{
    kvp_test_logcap_start(&cap); /* dozens of expected rejections */
    kvp_xport_t *x = solo(g_layout, NULL);
    const void *b;
    size_t len;
    uint8_t m[KVP_UCX_BLOB_MAX + 8];
    kvp_xpeer_id_t id = 0;
    kvp_status_t s;

    assert_int_equal(x->ops->local_blob(x, &b, &len), KVP_OK);
    assert_true(len > 44 && len < KVP_UCX_BLOB_MAX);
    for (size_t cut = 0; cut < len; cut += (cut < 64 ? 1 : 37)) { /* every truncation */
        s = x->ops->add_peer(x, b, cut, &g_layout, &id);
        assert_true(s == KVP_ERR_TRUNCATED || s == KVP_ERR_PROTO);
    }
    memcpy(m, b, len);
    m[len] = 0;
    assert_int_equal(x->ops->add_peer(x, m, len + 1, &g_layout, &id), KVP_ERR_PROTO); /* trailing */
    m[0] ^= 0xff;
    assert_int_equal(x->ops->add_peer(x, m, len, &g_layout, &id), KVP_ERR_PROTO); /* magic */
    memcpy(m, b, len);
    m[4] = 9;
    assert_int_equal(x->ops->add_peer(x, m, len, &g_layout, &id), KVP_ERR_INCOMPATIBLE);
    memcpy(m, b, len);
    m[38] ^= 0x01; /* address length off by one */
    s = x->ops->add_peer(x, m, len, &g_layout, &id);
    assert_true(s == KVP_ERR_TRUNCATED || s == KVP_ERR_PROTO);
    memcpy(m, b, len);
    m[41] = 0xff; /* rkey length huge */
    assert_int_equal(x->ops->add_peer(x, m, len, &g_layout, &id), KVP_ERR_PROTO);
    memcpy(m, b, len);
    memset(m + 24, 0, 8); /* region shorter than the layout */
    assert_int_equal(x->ops->add_peer(x, m, len, &g_layout, &id), KVP_ERR_PROTO);
    assert_int_equal(x->ops->add_peer(x, NULL, len, &g_layout, &id), KVP_ERR_TRUNCATED);
    /* layout disagreeing with what the peer's HELLO said */
    kvp_layout_t other_bs = {NB, BS / 4}, other_nb = {NB + 1, BS};
    assert_int_equal(x->ops->add_peer(x, b, len, &other_bs, &id), KVP_ERR_INCOMPATIBLE);
    assert_int_equal(x->ops->add_peer(x, b, len, &other_nb, &id), KVP_ERR_INCOMPATIBLE);
    assert_int_equal(id, 0); /* never written on error */
    kvp_xport_stats_t st;
    x->ops->get_stats(x, &st);
    assert_int_equal(st.peers, 0);
    /* each rejection says why, up to the rate limit (50 lines a second; a
     * hostile peer can send one bad blob per connection) */
    assert_true(cap.count[KVP_LOG_WARN] >= 50);
    assert_int_equal(x->ops->close(x, false), KVP_OK);
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* A blob whose block size differs from OUR region's (agreeing with its own
 * HELLO) cannot be written to: refused at import. */
static void test_ucx_blob_other_block_size(void **state)
{
    kvp_layout_t small = {NB, BS / 4};
    kvp_xport_t *x = solo(g_layout, NULL), *y = solo(small, NULL);
    const void *b;
    size_t len;
    kvp_xpeer_id_t id = 0;

    assert_int_equal(y->ops->local_blob(y, &b, &len), KVP_OK);
    assert_int_equal(x->ops->add_peer(x, b, len, &small, &id), KVP_ERR_INCOMPATIBLE);
    assert_int_equal(id, 0);
    assert_int_equal(x->ops->close(x, false), KVP_OK);
    assert_int_equal(y->ops->close(y, false), KVP_OK);
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* Out-of-range indexes: clear status, nothing posted (a direct put outside
 * the segment would kill the producer, UCX-NOTES §7). */
static void test_ucx_bad_index(void **state)
{
    uint8_t *region;
    kvp_xport_t *x = solo(g_layout, &region);
    const void *b;
    size_t len;
    kvp_xpeer_id_t self;
    kvp_xfer_id_t id = 0;
    kvp_xport_stats_t st;

    assert_int_equal(x->ops->local_blob(x, &b, &len), KVP_OK);
    assert_int_equal(x->ops->add_peer(x, b, len, &g_layout, &self), KVP_OK);
    memset(region, 0x5a, (size_t)NB * BS);
    kvp_xfer_block_t bad_dst[] = {{0, 0, 1, 0}, {1, 0, NB, 0}};
    kvp_xfer_block_t bad_src[] = {{NB, 0, 2, 0}};
    kvp_xfer_block_t huge[] = {{0, 0, UINT32_MAX, 0}};
    kvp_xfer_block_t ok[] = {{0, 0, 1, 0}};
    assert_int_equal(x->ops->write(x, self, bad_dst, 2, &id), KVP_ERR_INVALID);
    assert_int_equal(x->ops->write(x, self, bad_src, 1, &id), KVP_ERR_INVALID);
    assert_int_equal(x->ops->write(x, self, huge, 1, &id), KVP_ERR_INVALID);
    assert_int_equal(x->ops->write(x, self, ok, 0, &id), KVP_ERR_INVALID);
    assert_int_equal(x->ops->write(x, self + 99, ok, 1, &id), KVP_ERR_NOT_FOUND);
    assert_int_equal(id, 0);
    ut_progress_for(x, 20 * KVP_NSEC_PER_MSEC);
    x->ops->get_stats(x, &st);
    assert_int_equal(st.writes, 0);
    assert_int_equal(st.inflight, 0);
    for (size_t i = 0; i < (size_t)NB * BS; i++)
        if (region[i] != 0x5a)
            fail_msg("byte %zu changed by a refused write", i);
    assert_int_equal(x->ops->remove_peer(x, self), KVP_OK);
    assert_int_equal(x->ops->remove_peer(x, self), KVP_ERR_NOT_FOUND);
    assert_int_equal(x->ops->close(x, false), KVP_OK);
    KVP_TEST_ASSERT_NO_LEAKS();
}

int main(int argc, char **argv)
{
    (void)argc;
    ut_main_init(argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ucx_bad_blob),
        cmocka_unit_test(test_ucx_blob_other_block_size),
        cmocka_unit_test(test_ucx_bad_index),
        cmocka_unit_test(test_ucx_write_shm_direct),
        cmocka_unit_test(test_ucx_write_shm_long_run),
        cmocka_unit_test(test_ucx_write_shm_stream),
        cmocka_unit_test(test_ucx_write_shm_emulated),
        cmocka_unit_test(test_ucx_write_tcp_forced),
        cmocka_unit_test(test_ucx_write_tcp_env),
        cmocka_unit_test(test_ucx_am_done_without_target),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
