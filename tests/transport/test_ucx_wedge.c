/*
 * test_ucx_wedge.c -- closing a tcp endpoint whose link is wedged (issue 14,
 * the partition crash; docs/DESIGN.md "UCX 1.13 tcp endpoint teardown").
 *
 * Both sides own an endpoint to each other over tcp (one full-duplex
 * socket). The consumer stops progressing, so our writes wedge in the
 * socket and in UCX's tx buffer; then we fence the consumer (what the node
 * does when a session dies by heartbeat during a partition). The consumer
 * resumes, drains our bytes and closes its own endpoint, and only then do
 * we progress again: the consumer's CONN_FIN and our socket's writability
 * arrive in one epoll round. UCX 1.13 crashes there if our endpoint was
 * already destroyed (FORCE-closed with wedged data: a lingering RX-only
 * endpoint freed in rx_progress, then used by tx_progress; or a CONN_FIN
 * still pending at destroy: stubs.c assertion). kvpeer drains such an
 * endpoint before closing it; this test checks that the process survives,
 * every transfer ends, the endpoint is closed once drained and nothing
 * leaks.
 */
#include "testutil.h"
#include "ucx_testlib.h"

#include <string.h>
#include <time.h>

static kvp_test_logcap_t cap;

#if defined(__SANITIZE_ADDRESS__)
/* UCX is not instrumented: a read of a freed endpoint inside libuct would go
 * unnoticed with ASan's untouched freed memory. Filling freed blocks turns
 * it into the crash the release build shows (a jump through conn_state
 * 0xff); without kvpeer's drain this test then dies with SIGSEGV in
 * uct_tcp_iface_progress (tried: 3 of 3). */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "max_free_fill_size=1048576:free_fill_byte=255";
}
#endif

#define SEC KVP_NSEC_PER_SEC
#define MSEC KVP_NSEC_PER_MSEC
#define SC(ns) kvp_test_scaled_ns(ns)
#define SC_MS(ms) (kvp_test_scaled_ns((uint64_t)(ms)*MSEC) / MSEC)

/* Transfers posted while the consumer sleeps: 4 x 64 KiB each, 40 MiB in
 * all, more than loopback's socket buffers hold. */
#define NXFER 160

static void test_ucx_fence_wedged_tcp(void **state)
{
    ut_pair_t p;
    ut_reply_t r;
    kvp_status_t st;
    kvp_xfer_id_t ids[NXFER];
    kvp_xport_stats_t xs;
    const void *b;
    size_t len;
    bool proof = false;

    (void)state;
    kvp_test_logcap_start(&cap);
    ut_pair_open(&p, "tcp", KVP_PATH_AM_TCP);
    /* the consumer's endpoint to us: the socket carries both directions */
    assert_int_equal(p.x->ops->local_blob(p.x, &b, &len), KVP_OK);
    assert_true(ut_call(&p.child, UT_ADD_PEER, UT_NB, UT_BS, b, (uint32_t)len, &r, NULL, 0));
    assert_int_equal(r.status, KVP_OK);
    assert_int_equal(r.v1, KVP_PATH_AM_TCP);
    ut_progress_for(p.x, SC(20 * MSEC));
    kvp_xfer_id_t id0 = ut_post4(&p, 0);
    assert_true(ut_wait_xfer(p.x, p.peer, id0, SC(5 * SEC), &st));
    assert_int_equal(st, KVP_OK);

    /* the consumer sleeps; our writes wedge */
    uint32_t pause_ms = (uint32_t)SC_MS(1500);
    assert_true(ut_send(&p.child, UT_PAUSE, pause_ms, 0, NULL, 0));
    struct timespec ts = {0, 100 * 1000 * 1000}; /* it is asleep before we write */
    nanosleep(&ts, NULL);
    for (uint32_t k = 0; k < NXFER; k++)
        ids[k] = ut_post4(&p, k + 1);
    ut_progress_for(p.x, SC(300 * MSEC));
    size_t done_before = 0;
    {
        kvp_xfer_result_t res[NXFER];
        size_t n = 0;
        assert_int_equal(p.x->ops->poll(p.x, p.peer, res, NXFER, &n), KVP_OK);
        done_before = n; /* handed back (and forgotten by the transport) */
        for (size_t i = 0; i < n; i++)
            for (uint32_t k = 0; k < NXFER; k++)
                if (ids[k] == res[i].id)
                    ids[k] = 0;
    }
    print_message("  %zu of %d transfers left our memory before the fence\n", done_before,
                  NXFER);
    assert_true(done_before < NXFER); /* wedged: the consumer is not reading */

    /* the session died (heartbeat): fence and remove, as the node does */
    assert_int_equal(p.x->ops->fence_peer(p.x, p.peer, &proof), KVP_OK);
    assert_true(proof); /* AM path: refusal is the proof, not the close */
    assert_int_equal(p.x->ops->remove_peer(p.x, p.peer), KVP_OK);
    ut_progress_for(p.x, SC(20 * MSEC));

    /* the consumer wakes up, reads our bytes and closes its endpoint, while
     * we do not progress (its FIN and our writability meet in one round) */
    assert_true(ut_recv_reply(&p.child, &r, NULL, 0));
    assert_true(ut_call(&p.child, UT_FENCE, 0, 0, NULL, 0, &r, NULL, 0));
    assert_int_equal(r.status, KVP_OK);
    ts.tv_nsec = 300 * 1000 * 1000;
    nanosleep(&ts, NULL);

    /* every transfer ends, retired records are handed back, the endpoint
     * is closed and reaped */
    xs = ut_drain_retired(p.x, 5 * MSEC, SC(10 * SEC));
    print_message("  after the consumer's close: retired %llu, zombie peers %llu\n",
                  (unsigned long long)xs.retired, (unsigned long long)xs.zombie_peers);
    assert_int_equal(xs.retired, 0);
    assert_int_equal(xs.zombie_peers, 0);
    ut_progress_for(p.x, SC(100 * MSEC));
    assert_int_equal(p.x->ops->close(p.x, false), KVP_OK);
    assert_true(ut_child_stop(&p.child));
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

int main(int argc, char **argv)
{
    (void)argc;
    ut_main_init(argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ucx_fence_wedged_tcp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
