/*
 * test_ucx_fail.c -- UCX backend under failure, real processes on 127.0.0.1:
 * target SIGKILLed mid-stream (tcp and direct shm), consumer-side fence with a
 * control run that shows late bytes do land without it, remove_peer with
 * transfers in flight, cancel modes, and endpoint errors -> peer_status.
 */
#include "testutil.h"
#include "ucx_testlib.h"
#include "transport/ucx_int.h"

#include <string.h>

static kvp_test_logcap_t cap; /* file-static: survives a failed assert */

#define SEC KVP_NSEC_PER_SEC
#define MSEC KVP_NSEC_PER_MSEC
/* A real-clock window or pause, scaled for sanitizers/valgrind. */
#define SC(ns) kvp_test_scaled_ns(ns)
#define SC_MS(ms) (kvp_test_scaled_ns((uint64_t)(ms)*MSEC) / MSEC)

typedef struct stream {
    uint64_t posted, ok, failed;
    kvp_xfer_id_t live[8];
    size_t nlive;
} stream_t;

/* Hand back whatever is terminal; returns how many were. */
static size_t stream_reap(ut_pair_t *p, stream_t *s)
{
    kvp_xfer_result_t res[16];
    size_t n = 0;
    assert_int_equal(p->x->ops->poll(p->x, p->peer, res, 16, &n), KVP_OK);
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < s->nlive && s->live[j] != res[i].id)
            j++;
        assert_true(j < s->nlive); /* only our own ids, each once */
        s->live[j] = s->live[--s->nlive];
        if (res[i].status == KVP_OK)
            s->ok++;
        else
            s->failed++;
    }
    return n;
}

/* Keep up to 8 transfers in flight for `ns`. */
static void stream_run(ut_pair_t *p, stream_t *s, uint64_t ns)
{
    uint64_t end = ut_now_ns() + ns;
    while (ut_now_ns() < end) {
        while (s->nlive < 8 && p->x->ops->peer_status(p->x, p->peer) == KVP_OK)
            s->live[s->nlive++] = ut_post4(p, (uint32_t)s->posted++);
        p->x->ops->progress(p->x);
        stream_reap(p, s);
    }
}

/* Drain: every live transfer reaches a terminal state within `ns`. */
static bool stream_drain(ut_pair_t *p, stream_t *s, uint64_t ns)
{
    uint64_t end = ut_now_ns() + ns;
    while (s->nlive && ut_now_ns() < end) {
        if (!p->x->ops->progress(p->x))
            ut_progress_for(p->x, 1 * MSEC);
        stream_reap(p, s);
    }
    return s->nlive == 0;
}

static bool wait_peer_error(kvp_xport_t *x, kvp_xpeer_id_t peer, uint64_t ns)
{
    uint64_t end = ut_now_ns() + ns;
    while (x->ops->peer_status(x, peer) == KVP_OK && ut_now_ns() < end)
        ut_progress_for(x, 5 * MSEC);
    return x->ops->peer_status(x, peer) != KVP_OK;
}

/* Close after the target died: remove the peer, release, no leaks. */
static void close_after_death(ut_pair_t *p)
{
    assert_int_equal(p->x->ops->remove_peer(p->x, p->peer), KVP_OK);
    kvp_xport_stats_t st = ut_drain_retired(p->x, 2 * MSEC, kvp_test_scaled_ns(2 * SEC));
    assert_int_equal(st.retired, 0);
    assert_int_equal(st.zombie_peers, 0);
    assert_int_equal(p->x->ops->close(p->x, false), KVP_OK);
}

static void test_ucx_kill_tcp(void **state)
{
    ut_pair_t p;
    stream_t s = {0};
    kvp_xfer_id_t id;
    kvp_test_logcap_start(&cap);
    ut_pair_open(&p, "tcp", KVP_PATH_AM_TCP);
    stream_run(&p, &s, SC(200 * MSEC));
    assert_true(s.ok > 0);
    /* Make sure transfers are in flight at the kill: the target stops
     * progressing. An AM transfer is done when its sends completed locally,
     * so the stream goes on until the socket buffers (grown by the first
     * stream, megabytes) are full and sends wait in UCX: then the window of
     * 8 stays in flight. Under TSan on a loaded machine 100 ms was not
     * always enough to fill them. */
    assert_true(ut_send(&p.child, UT_PAUSE, SC_MS(10000), 0, NULL, 0));
    uint64_t fill_end = ut_now_ns() + SC(5 * SEC);
    do
        stream_run(&p, &s, SC(100 * MSEC));
    while (s.nlive < 8 && ut_now_ns() < fill_end);
    size_t inflight_at_kill = s.nlive;
    assert_int_equal(inflight_at_kill, 8);
    uint64_t t0 = ut_now_ns();
    ut_child_kill(&p.child); /* SIGKILL + waitpid */
    /* tcp: the kernel closes the socket; every in-flight transfer FAILS fast. */
    assert_true(stream_drain(&p, &s, kvp_test_scaled_ns(2 * SEC)));
    assert_true(wait_peer_error(p.x, p.peer, kvp_test_scaled_ns(2 * SEC)));
    print_message("  tcp: %llu posted, %llu ok, %llu failed; terminal %.0f ms after the kill\n",
                  (unsigned long long)s.posted, (unsigned long long)s.ok,
                  (unsigned long long)s.failed, (double)(ut_now_ns() - t0) / 1e6);
    assert_true(s.failed >= inflight_at_kill); /* none of them reported DONE */
    assert_int_equal(p.x->ops->peer_status(p.x, p.peer), KVP_ERR_TRANSPORT);
    kvp_xfer_block_t b = {0, 0, 0, 0};
    assert_int_equal(p.x->ops->write(p.x, p.peer, &b, 1, &id), KVP_ERR_TRANSPORT);
    close_after_death(&p);
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* Direct shm: puts complete inside the call into the dead peer's orphaned
 * segment (UCX-NOTES §4), so transfers are terminal at once; the death is
 * learnt by shm keepalive (1 s interval) once the target is reaped. */
static void test_ucx_kill_shm_direct(void **state)
{
    ut_pair_t p;
    stream_t s = {0};
    kvp_test_logcap_start(&cap);
    ut_pair_open(&p, "", KVP_PATH_DIRECT_SHM);
    stream_run(&p, &s, SC(100 * MSEC));
    uint64_t t0 = ut_now_ns();
    ut_child_kill(&p.child);
    stream_run(&p, &s, SC(50 * MSEC)); /* writes after the death: no crash */
    assert_true(stream_drain(&p, &s, kvp_test_scaled_ns(1 * SEC)));
    assert_true(wait_peer_error(p.x, p.peer, kvp_test_scaled_ns(5 * SEC)));
    print_message("  shm: %llu posted, %llu ok, %llu failed; peer error %.0f ms after the kill\n",
                  (unsigned long long)s.posted, (unsigned long long)s.ok,
                  (unsigned long long)s.failed, (double)(ut_now_ns() - t0) / 1e6);
    assert_int_equal(s.ok + s.failed, s.posted); /* each handed back exactly once */
    close_after_death(&p);
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* The consumer's own endpoint to a source errors -> peer_status says so. */
static void ep_error_case(const char *tls, kvp_data_path_t path, uint64_t bound)
{
    ut_pair_t p;
    kvp_test_logcap_start(&cap);
    ut_pair_open(&p, tls, path);
    ut_progress_for(p.x, 20 * MSEC);
    assert_int_equal(p.x->ops->peer_status(p.x, p.peer), KVP_OK);
    ut_child_kill(&p.child);
    assert_true(wait_peer_error(p.x, p.peer, kvp_test_scaled_ns(bound)));
    assert_int_equal(p.x->ops->peer_status(p.x, p.peer), KVP_ERR_TRANSPORT);
    assert_true(cap.count[KVP_LOG_WARN] >= 1); /* "endpoint error" logged */
    close_after_death(&p);
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void test_ucx_ep_error_tcp(void **state)
{
    ep_error_case("tcp", KVP_PATH_AM_TCP, 2 * SEC);
}

static void test_ucx_ep_error_shm(void **state)
{
    ep_error_case("", KVP_PATH_DIRECT_SHM, 5 * SEC); /* keepalive 1 s */
}

/* --------------------------------------------------------------- fence */

static int64_t child_count_not(ut_pair_t *p, uint8_t byte)
{
    ut_reply_t r;
    assert_true(ut_call(&p->child, UT_COUNT_NOT, byte, 0, NULL, 0, &r, NULL, 0));
    return r.v1;
}

/* fenced == false is the control run: the same late writes DO land, so the
 * fenced run's "0 bytes" is meaningful. */
static void fence_case(bool fenced, bool emulated_shm)
{
    kvp_data_path_t path = emulated_shm ? KVP_PATH_AM_SHM : KVP_PATH_AM_TCP;
    ut_pair_t p;
    ut_reply_t r;
    kvp_status_t st;
    kvp_xfer_id_t ids[5];
    kvp_test_logcap_start(&cap);
    ut_pair_open_ex(&p, emulated_shm ? "" : "tcp", path, emulated_shm);
    /* the consumer's endpoint to us: its side of the path (our region is
     * UCX-allocated, so on shm it sees a direct path towards us) */
    ut_consumer_add_producer(&p, emulated_shm ? KVP_PATH_DIRECT_SHM : KVP_PATH_AM_TCP);
    kvp_xfer_id_t id0 = ut_post4(&p, 0);
    assert_true(ut_wait_xfer(p.x, p.peer, id0, kvp_test_scaled_ns(5 * SEC), &st));
    assert_int_equal(st, KVP_OK);
    assert_true(ut_call(&p.child, UT_FILL, 0xAA, 0, NULL, 0, &r, NULL, 0));
    if (fenced) {
        assert_true(ut_call(&p.child, UT_FENCE, 0, 0, NULL, 0, &r, NULL, 0));
        assert_int_equal(r.status, KVP_OK);
        assert_int_equal(r.v1, 1); /* proof on tcp / emulated shm */
    }
    for (uint32_t k = 0; k < 5; k++) { /* late writes, 20 ms apart */
        ids[k] = ut_post4(&p, k + 1);
        ut_progress_for(p.x, 20 * MSEC);
    }
    ut_progress_for(p.x, SC(200 * MSEC));
    int64_t landed = child_count_not(&p, 0xAA);
    print_message("  %s: %lld bytes landed after the %s\n", fenced ? "fenced" : "control",
                  (long long)landed, fenced ? "fence" : "fill");
    if (!fenced) {
        assert_int_equal(landed, 5 * 4 * (int64_t)UT_BS); /* they DO land */
        for (int k = 0; k < 5; k++) {
            assert_true(ut_wait_xfer(p.x, p.peer, ids[k], kvp_test_scaled_ns(2 * SEC), &st));
            assert_int_equal(st, KVP_OK);
        }
        ut_pair_close(&p);
    } else {
        assert_int_equal(landed, 0);
        /* AM path: the source's completion is local (its sends left its
         * memory) and says nothing about landing; the consumer's refusal is
         * what decides. Every late transfer is terminal, whatever its status. */
        for (int k = 0; k < 5; k++)
            assert_true(ut_wait_xfer(p.x, p.peer, ids[k], kvp_test_scaled_ns(5 * SEC), &st));
        assert_int_equal(child_count_not(&p, 0xAA), 0);
        assert_int_equal(p.x->ops->remove_peer(p.x, p.peer), KVP_OK);
        ut_progress_for(p.x, 20 * MSEC);
        assert_int_equal(p.x->ops->close(p.x, false), KVP_OK);
        assert_true(ut_child_stop(&p.child));
    }
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void test_ucx_fence_tcp(void **state)
{
    fence_case(true, false);
}

static void test_ucx_fence_tcp_control(void **state)
{
    fence_case(false, false);
}

static void test_ucx_fence_emulated_shm(void **state)
{
    fence_case(true, true);
}

static void test_ucx_fence_emulated_shm_control(void **state)
{
    fence_case(false, true);
}

/* AM_REFUSE (issue 14): with the endpoints left up, blocks written into
 * refused slots are dropped by the consumer's handler and counted, while
 * expected slots still land -- refusal alone, not a closed connection, is
 * what keeps the bytes out. The consumer counts the 8 expected slots it
 * refused (am_refused_slots; mutation: the count dropped -> 0 != 8). */
static void am_refuse_case(const char *tls, kvp_data_path_t path, bool caller_mem)
{
    ut_pair_t p;
    ut_reply_t r;
    kvp_status_t st;
    kvp_test_logcap_start(&cap);
    ut_pair_open_ex(&p, tls, path, caller_mem);
    assert_true(ut_call(&p.child, UT_FILL, 0xAA, 0, NULL, 0, &r, NULL, 0));
    assert_true(ut_call(&p.child, UT_REFUSE, 0, 8, NULL, 0, &r, NULL, 0)); /* slots 0..7 */
    assert_true(ut_call(&p.child, UT_REFUSED, 0, 0, NULL, 0, &r, NULL, 0));
    int64_t refused = r.v1;
    kvp_xfer_id_t a = ut_post4(&p, 0), b = ut_post4(&p, 1); /* slots 0..3, 4..7: refused */
    kvp_xfer_id_t c = ut_post4(&p, 2);                       /* slots 8..11: expected */
    assert_true(ut_wait_xfer(p.x, p.peer, a, kvp_test_scaled_ns(5 * SEC), &st));
    assert_true(ut_wait_xfer(p.x, p.peer, b, kvp_test_scaled_ns(5 * SEC), &st));
    assert_true(ut_wait_xfer(p.x, p.peer, c, kvp_test_scaled_ns(5 * SEC), &st));
    assert_int_equal(st, KVP_OK);
    assert_true(ut_call(&p.child, UT_DROPPED, 0, 0, NULL, 0, &r, NULL, 0));
    int64_t landed = child_count_not(&p, 0xAA);
    print_message("  %s: %lld bytes in refused+expected slots, %lld dropped\n", tls[0] ? tls : "shm",
                  (long long)landed, (long long)r.v1);
    assert_int_equal(landed, 4 * (int64_t)UT_BS);     /* only the expected slots */
    assert_int_equal(r.v1, 8 * (int64_t)UT_BS);       /* the refused ones, counted */
    assert_int_equal(refused, 8);                      /* am_refused_slots: 8 expected slots */
    ut_pair_close(&p);
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void test_ucx_am_refuse_tcp(void **state)
{
    am_refuse_case("tcp", KVP_PATH_AM_TCP, false);
}

static void test_ucx_am_refuse_shm(void **state)
{
    am_refuse_case("", KVP_PATH_AM_SHM, true);
}

/* Pieces of a block (issue 17): crafted AMs on the real tcp endpoint. A
 * block counts as landed only when its pieces arrived in order, each
 * starting where the landed bytes end: the tail before the head, a piece
 * that does not start where the head ended (its bytes would count, the
 * head's end would stay a hole), one past the block's end or one whose
 * header lies about its length is dropped and counted, and the slot stays not landed (a hole is never
 * committed). The same pieces in order land it, byte-exact. */
static void am_piece_send(ut_pair_t *p, uint32_t slot, uint32_t off, uint32_t len,
                          uint32_t hdr_len)
{
    ucx_xport_t *x = ucx_of(p->x);
    ucx_peer_t *pe = kvp__ucx_peer_find(x, p->peer);
    ucx_am_hdr_t h = {UCX_AM_MAGIC, slot, 0, off, hdr_len, 0, x->token, pe->dst_token};
    if (pe->out != NULL) { /* kvpeer's own tcp stream: its framing cannot lie about a length */
        kvp_tcpd_piece_t th = {KVP_TCPD_PIECE_MAGIC, slot, 0, off, len, 0};
        assert_int_equal(hdr_len, len);
        assert_int_equal(kvp__tcpd_send(pe->out, &th, p->region + (size_t)slot * UT_BS + off,
                                        NULL), KVP_OK);
        kvp__tcpd_kick(pe->out);
        ut_progress_for(p->x, 20 * MSEC);
        return;
    }
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_AM_SEND_FLAG_EAGER};
    const uint8_t *src = p->region + (size_t)slot * UT_BS + off;
    ucs_status_ptr_t sp = ucp_am_send_nbx(pe->ep, UCX_AM_ID_DATA, &h, sizeof(h), src, len, &prm);
    assert_false(UCS_PTR_IS_ERR(sp));
    while (UCS_PTR_IS_PTR(sp) && ucp_request_check_status(sp) == UCS_INPROGRESS)
        p->x->ops->progress(p->x);
    if (UCS_PTR_IS_PTR(sp))
        ucp_request_free(sp);
}

static int64_t am_landed(ut_pair_t *p, uint32_t slot)
{
    ut_reply_t r;
    assert_true(ut_call(&p->child, UT_LANDED, slot, 0, NULL, 0, &r, NULL, 0));
    return r.v1;
}

static void test_ucx_am_pieces_tcp(void **state)
{
    ut_pair_t p;
    ut_reply_t r;
    const uint32_t piece = UCX_AM_PIECE_BYTES, tail = UT_BS - UCX_AM_PIECE_BYTES;
    const uint32_t pair[2] = {5, 5};
    kvp_test_logcap_start(&cap);
    assert_true(UT_BS > UCX_AM_PIECE_BYTES); /* two pieces per block */
    ut_pair_open(&p, "tcp", KVP_PATH_AM_TCP);
    for (uint32_t s = 0; s < UT_NB; s++)
        ut_pattern_fill(p.region + (size_t)s * UT_BS, UT_BS, s, 51);
    assert_int_equal(am_landed(&p, 5), 0);
    am_piece_send(&p, 5, piece, tail, tail);       /* the tail first: out of order */
    am_piece_send(&p, 5, 0, piece, piece);         /* the head */
    am_piece_send(&p, 5, 1024, tail, tail);        /* not where the head ended: a hole */
    am_piece_send(&p, 5, piece, tail + 1024, tail + 1024); /* past the block's end */
    assert_int_equal(am_landed(&p, 5), 0); /* head only: not landed */
    assert_true(ut_call(&p.child, UT_DROPPED, 0, 0, NULL, 0, &r, NULL, 0));
    assert_int_equal(r.v1, 3 * (int64_t)tail + 1024); /* the three bad pieces, counted */
    assert_int_equal(r.v2, piece);                    /* the head landed */
    am_piece_send(&p, 5, 0, piece, piece);            /* the block again, in order */
    am_piece_send(&p, 5, piece, tail, tail);
    assert_int_equal(am_landed(&p, 5), 1);
    assert_true(ut_call(&p.child, UT_VERIFY, 0, 51, pair, sizeof(pair), &r, NULL, 0));
    assert_int_equal(r.v1, 0);
    ut_pair_close(&p);
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* Direct shm cannot be fenced: proof is false and late writes land. */
static void test_ucx_fence_shm_no_proof(void **state)
{
    ut_pair_t p;
    ut_reply_t r;
    kvp_status_t st;
    kvp_test_logcap_start(&cap);
    ut_pair_open(&p, "", KVP_PATH_DIRECT_SHM);
    ut_consumer_add_producer(&p, KVP_PATH_DIRECT_SHM);
    assert_true(ut_call(&p.child, UT_FILL, 0xAA, 0, NULL, 0, &r, NULL, 0));
    assert_true(ut_call(&p.child, UT_FENCE, 0, 0, NULL, 0, &r, NULL, 0));
    assert_int_equal(r.status, KVP_OK);
    assert_int_equal(r.v1, 0); /* NOT a proof */
    assert_int_equal(kvp_ucx_peer_inbound_path(p.x, p.peer), KVP_PATH_DIRECT_SHM);
    kvp_xfer_id_t id = ut_post4(&p, 1);
    assert_true(ut_wait_xfer(p.x, p.peer, id, kvp_test_scaled_ns(2 * SEC), &st));
    assert_int_equal(child_count_not(&p, 0xAA), 4 * (int64_t)UT_BS);
    assert_int_equal(p.x->ops->remove_peer(p.x, p.peer), KVP_OK);
    ut_progress_for(p.x, 20 * MSEC);
    assert_int_equal(p.x->ops->close(p.x, true), KVP_OK);
    ut_child_kill(&p.child);
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* ------------------------------------------------- remove_peer and cancel */

/* Transfers of the pair's peer still owned by the stream (pending > 0). */
static size_t running_count(ut_pair_t *p)
{
    ucx_peer_t *pe = kvp__ucx_peer_find(ucx_of(p->x), p->peer);
    size_t n = 0;
    for (const kvp_list_t *l = pe->running.next; l != &pe->running; l = l->next)
        n++;
    return n;
}

/* Post 64-block transfers to a paused target until `want` of them stay
 * running (its socket buffers are full); returns how many were posted. */
static size_t post_until_stuck(ut_pair_t *p, kvp_xfer_id_t *ids, size_t max, size_t want)
{
    kvp_xfer_block_t b[UT_NB];
    for (uint32_t i = 0; i < UT_NB; i++)
        b[i] = (kvp_xfer_block_t){i, 0, i, 0};
    size_t n = 0;
    while (n < max) {
        assert_int_equal(p->x->ops->write(p->x, p->peer, b, UT_NB, &ids[n]), KVP_OK);
        n++;
        ut_progress_for(p->x, 20 * MSEC);
        if (running_count(p) >= want)
            break;
    }
    assert_true(running_count(p) >= want);
    return n;
}

/* Over kvpeer's own tcp stream (tcpd.h), remove_peer closes the stream: what
 * it had not written never will be, so those transfers are terminal (failed)
 * at once and their source pins may go -- no wait for the target, which is
 * paused throughout (UCX's tcp kept the endpoint for them instead). */
static void test_ucx_remove_stops_stream(void **state)
{
    ut_pair_t p;
    ut_reply_t r;
    kvp_xport_stats_t st;
    kvp_xfer_result_t res[32];
    kvp_xfer_id_t ids[32];
    size_t n;
    kvp_test_logcap_start(&cap);
    ut_pair_open_paused(&p, "tcp", KVP_PATH_AM_TCP, SC_MS(3000)); /* target stops progressing */
    ut_progress_for(p.x, SC(50 * MSEC));
    size_t posted = post_until_stuck(&p, ids, 32, 1);
    p.x->ops->get_stats(p.x, &st);
    uint64_t running = st.inflight; /* not polled: every posted one, running or done */
    assert_int_equal(running, posted);
    assert_int_equal(p.x->ops->remove_peer(p.x, p.peer), KVP_OK);
    assert_int_equal(p.x->ops->poll_retired(p.x, res, 32, &n), KVP_OK);
    assert_int_equal(n, running); /* all terminal at once, target still paused */
    size_t failed = 0;
    for (size_t i = 0; i < n; i++)
        failed += res[i].status != KVP_OK;
    assert_true(failed >= 1); /* the stuck one never left: failed, not "ok" */
    ut_progress_for(p.x, 2 * MSEC); /* the peer record goes once nothing refers to it */
    p.x->ops->get_stats(p.x, &st);
    assert_int_equal(st.retired, 0);
    assert_int_equal(st.zombie_peers, 0);
    print_message("  %zu posted, %zu running at remove_peer, %zu failed at once\n", posted,
                  (size_t)running, failed);
    assert_int_equal(p.x->ops->close(p.x, false), KVP_OK);
    assert_true(ut_recv_reply(&p.child, &r, NULL, 0)); /* target resumes */
    assert_true(ut_child_stop(&p.child));
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void test_ucx_cancel_modes(void **state)
{
    ut_pair_t p;
    ut_reply_t r;
    kvp_xfer_id_t running[4], ids[32];
    size_t nr = 99;
    kvp_status_t st;
    kvp_xport_stats_t xs;
    kvp_test_logcap_start(&cap);
    ut_pair_open_paused(&p, "tcp", KVP_PATH_AM_TCP, SC_MS(3000));
    ut_progress_for(p.x, SC(50 * MSEC));
    size_t posted = post_until_stuck(&p, ids, 32, 2);
    kvp_xfer_id_t two[2] = {ids[posted - 2], ids[posted - 1]}; /* the last two: running */
    kvp_xfer_id_t bogus = two[1] + (1ull << 24);
    assert_int_equal(p.x->ops->cancel(p.x, &bogus, 1, KVP_CANCEL_WAIT, running, &nr),
                     KVP_ERR_NOT_FOUND);
    assert_int_equal(nr, 99);
    assert_int_equal(p.x->ops->cancel(p.x, two, 2, KVP_CANCEL_WAIT, running, &nr), KVP_OK);
    assert_int_equal(nr, 2); /* running: reported and still tracked */
    p.x->ops->get_stats(p.x, &xs);
    uint64_t before = xs.inflight;
    assert_int_equal(p.x->ops->cancel(p.x, &two[0], 1, KVP_CANCEL_IMMEDIATE, NULL, NULL), KVP_OK);
    p.x->ops->get_stats(p.x, &xs);
    assert_int_equal(xs.inflight, before - 1);
    assert_int_equal(p.x->ops->close(p.x, false), KVP_ERR_BUSY);
    assert_true(ut_recv_reply(&p.child, &r, NULL, 0));
    for (size_t k = 0; k < posted; k++) {
        if (ids[k] == two[0])
            continue;
        assert_true(ut_wait_xfer(p.x, p.peer, ids[k], kvp_test_scaled_ns(5 * SEC), &st));
        assert_int_equal(st, KVP_OK);
    }
    /* the released id is never reported, and its record is freed by the
     * stream's completion (ASan would flag a use after release) */
    assert_false(ut_wait_xfer(p.x, p.peer, two[0], 100 * MSEC, &st));
    ut_pair_close(&p);
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* ------------------------------------------------ a data path that never comes up */

/* A stream whose target is gone must fail its transfers at once instead of
 * holding them (UCX's tcp wire-up could stay stuck for good: the connect
 * probe existed for it; kvpeer's stream fails on the socket's own error,
 * or at connect_timeout_ms when no answer comes). The control run shows a
 * healthy stream is not failed past the deadline. */
static void stream_case(bool gone)
{
    ut_pair_t p;
    ut_reply_t r;
    void *base = NULL;
    kvp_ucx_config_t cfg;
    kvp_xfer_id_t id = 0;
    kvp_status_t st = KVP_OK;
    const uint32_t timeout_ms = (uint32_t)SC_MS(300);

    kvp_test_logcap_start(&cap);
    memset(&p, 0, sizeof(p));
    assert_true(ut_child_start(&p.child));
    assert_true(ut_call(&p.child, UT_SETUP, UT_NB, UT_BS, "tcp", 3, &r, p.blob, sizeof(p.blob)));
    assert_int_equal(r.status, KVP_OK);
    kvp_ucx_config_default(&cfg);
    cfg.tls = "tcp";
    cfg.log_prefix = "producer";
    cfg.max_transfers = 256;
    cfg.connect_timeout_ms = timeout_ms;
    assert_int_equal(kvp_ucx_xport_create(&cfg, &p.x), KVP_OK);
    assert_int_equal(
        p.x->ops->register_region(p.x, NULL, (size_t)UT_NB * UT_BS, &ut_layout, &base), KVP_OK);
    if (gone)
        ut_child_kill(&p.child); /* its listener is gone: the connect is refused */
    uint64_t t0 = ut_now_ns();
    assert_int_equal(p.x->ops->add_peer(p.x, p.blob, r.len, &ut_layout, &p.peer), KVP_OK);
    kvp_xfer_block_t b = {1, 0, 2, 0};
    assert_int_equal(p.x->ops->write(p.x, p.peer, &b, 1, &id), KVP_OK);
    bool handed_back = ut_wait_xfer(p.x, p.peer, id, (uint64_t)timeout_ms * 2 * MSEC, &st);
    assert_true(handed_back); /* within the connect timeout either way */
    if (gone) {
        assert_int_not_equal(st, KVP_OK);
        assert_int_equal(p.x->ops->peer_status(p.x, p.peer), KVP_ERR_TRANSPORT);
        assert_true(cap.count[KVP_LOG_WARN] >= 1); /* "data stream failed" */
        print_message("  target gone: transfer failed %.0f ms after add_peer (timeout %u ms)\n",
                      (double)(ut_now_ns() - t0) / 1e6, timeout_ms);
    } else {
        assert_int_equal(st, KVP_OK);
        ut_progress_for(p.x, (uint64_t)timeout_ms * 2 * MSEC); /* past the deadline */
        assert_int_equal(p.x->ops->peer_status(p.x, p.peer), KVP_OK);
    }
    close_after_death(&p);
    if (!gone)
        assert_true(ut_child_stop(&p.child));
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void test_ucx_stream_target_gone(void **state)
{
    (void)state;
    stream_case(true);
}

static void test_ucx_stream_healthy(void **state)
{
    (void)state;
    stream_case(false);
}

int main(int argc, char **argv)
{
    (void)argc;
    /* These tests check UCX's own failure detection and fencing, where the
     * producer learns of a dead or fenced peer through UCX keepalive. The
     * node keeps it off (its control plane is the liveness signal; see
     * UCX_DEFAULT_KEEPALIVE), so turn it on here, before any UCX context. */
    setenv("UCX_KEEPALIVE_INTERVAL", "1s", 0);
    ut_main_init(argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ucx_kill_tcp),
        cmocka_unit_test(test_ucx_kill_shm_direct),
        cmocka_unit_test(test_ucx_ep_error_tcp),
        cmocka_unit_test(test_ucx_ep_error_shm),
        cmocka_unit_test(test_ucx_fence_tcp),
        cmocka_unit_test(test_ucx_fence_tcp_control),
        cmocka_unit_test(test_ucx_fence_emulated_shm),
        cmocka_unit_test(test_ucx_fence_emulated_shm_control),
        cmocka_unit_test(test_ucx_fence_shm_no_proof),
        cmocka_unit_test(test_ucx_am_refuse_tcp),
        cmocka_unit_test(test_ucx_am_pieces_tcp),
        cmocka_unit_test(test_ucx_am_refuse_shm),
        cmocka_unit_test(test_ucx_remove_stops_stream),
        cmocka_unit_test(test_ucx_cancel_modes),
        cmocka_unit_test(test_ucx_stream_target_gone),
        cmocka_unit_test(test_ucx_stream_healthy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
