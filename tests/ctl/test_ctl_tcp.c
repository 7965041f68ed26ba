/* test_ctl_tcp.c -- the control plane over real TCP on 127.0.0.1 (real
 * clock, bounds scaled by kvp_test_scaled_ns): handshakes, refusals checked
 * at the byte level by a raw client (no HELLO_ACK ever reaches a refused
 * peer), queued frames, EOF / SIGKILL / SIGSTOP of a peer process, stale
 * epochs, restart claims, simultaneous dials, the session cap, garbage input
 * and a peer that stops reading. */
#include "ctl_tcp_testlib.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ----------------------------------------------------------------- tests */

static void test_tcp_handshake_both_ways(void **state)
{
    env_t *e = env_new();
    connect_ab(e); /* a dials b */
    assert_memory_equal(e->a.peer_blob, e->b.blob, strlen(e->b.blob));
    assert_memory_equal(e->b.peer_blob, e->a.blob, strlen(e->a.blob));
    /* issue 27: one connection, one binding, the same at both ends */
    uint64_t ab = kvp_link_binding(e->a.link);
    assert_true(ab != 0);
    assert_true(ab == kvp_link_binding(e->b.link));
    tn_start(&e->c);
    assert_int_equal(kvp_ctl_want(e->c.ctl, kvp_ctl_peer_id(e->a.ctl)), KVP_OK); /* c dials a */
    assert_true(RUN_UNTIL(e->loop, e->a.ready == 2 && e->c.ready == 1, 2000 * MS));
    assert_false(kvp_link_outbound(e->a.link));
    assert_string_equal(kvp_link_peer_id(e->a.link), kvp_ctl_peer_id(e->c.ctl));
    /* another connection of a: another binding */
    assert_true(kvp_link_binding(e->a.link) == kvp_link_binding(e->c.link));
    assert_true(kvp_link_binding(e->a.link) != ab);
    env_free(e);
}

/* Each incompatibility: the raw peer gets our HELLO, then BYE with the right
 * reason, then EOF -- and never a HELLO_ACK. */
static void test_tcp_refusals_before_blob(void **state)
{
    static const uint8_t key[] = "the-key";
    for (int i = 0; i < 6; i++) {
        env_t *e = env_new();
        if (i >= 4) {
            e->a.cfg.psk = key;
            e->a.cfg.psk_len = sizeof(key);
        }
        tn_start(&e->a);
        raw_t *r = raw_connect(kvp_ctl_peer_id(e->a.ctl));
        kvp_msg_t m;
        raw_hello(&e->a, &m, r);
        int want_bye = KVP_BYE_INCOMPATIBLE;
        if (i == 0)
            m.u.hello.block_size = 8192;
        if (i == 1)
            m.u.hello.fingerprint ^= 1;
        if (i == 2)
            m.u.hello.hash_seed ^= 1;
        if (i == 3) { /* another wire major: patch the encoded bytes */
            static uint8_t out[1024];
            size_t n;
            assert_int_equal(kvp_wire_encode(&m, out, sizeof(out), &n), KVP_OK);
            out[KVP_WIRE_HDR_LEN] = KVP_WIRE_MAJOR + 1;
            raw_send_bytes(r, out, n);
        } else if (i == 4) { /* no key: HELLO without AUTH_REQUIRED */
            want_bye = KVP_BYE_AUTH;
            raw_send(r, &m, false);
        } else if (i == 5) { /* wrong key: a MAC that cannot verify */
            want_bye = KVP_BYE_AUTH;
            m.u.hello.flags = KVP_HELLO_AUTH_REQUIRED;
            raw_send(r, &m, false);
            assert_true(raw_recv(r, e->loop, &m, 2000 * MS));
            assert_int_equal(m.type, KVP_MSG_HELLO);
            r->peer_epoch = m.u.hello.epoch;
            memset(&m, 0, sizeof(m));
            m.type = KVP_MSG_AUTH;
            memset(m.u.auth.mac, 0xab, sizeof(m.u.auth.mac));
            raw_send(r, &m, true);
        }
        if (i < 3)
            raw_send(r, &m, false);
        assert_int_equal(raw_drain(r, e->loop), want_bye);
        assert_int_equal(r->acks_seen, 0); /* the blob never reached the refused peer */
        kvp_ctl_stats_t st = tn_stats(&e->a);
        assert_int_equal(st.blobs_out, 0);
        assert_int_equal(i < 4 ? st.refused_incompatible : st.refused_auth, 1);
        raw_close(r);
        env_free(e);
    }
}

static void test_tcp_auth_ok(void **state)
{
    static const uint8_t key[] = "the-key";
    env_t *e = env_new();
    e->a.cfg.psk = e->b.cfg.psk = key;
    e->a.cfg.psk_len = e->b.cfg.psk_len = sizeof(key);
    connect_ab(e);
    env_free(e);
}

static void test_tcp_queued_order(void **state)
{
    env_t *e = env_new();
    tn_start(&e->a);
    tn_start(&e->b);
    const char *bid = kvp_ctl_peer_id(e->b.ctl);
    assert_int_equal(kvp_ctl_want(e->a.ctl, bid), KVP_OK);
    kvp_link_t *l = kvp_ctl_link_pending(e->a.ctl, bid);
    assert_non_null(l);
    kvp_msg_t m;
    kvp_key_t keys[64];
    for (uint64_t q = 1; q <= 5; q++) {
        tn_lookup(&m, q, 64, keys);
        assert_int_equal(kvp_link_send(l, &m), KVP_OK);
    }
    assert_true(RUN_UNTIL(e->loop, e->b.nframes == 5, 2000 * MS));
    for (int i = 0; i < 5; i++)
        assert_int_equal(e->b.frames[i], (uint64_t)i + 1);
    env_free(e);
}

/* The peer closes: down at once (EOF), long before dead_after. */
static void test_tcp_peer_closed(void **state)
{
    env_t *e = env_new();
    e->a.cfg.dead_after_ns = 30 * KVP_NSEC_PER_SEC;
    connect_ab(e);
    uint64_t t0 = now_ns();
    tn_stop(&e->b);
    assert_true(RUN_UNTIL(e->loop, e->a.down == 1, 1000 * MS));
    assert_int_equal(e->a.down_reason, KVP_DOWN_EOF);
    assert_true(now_ns() - t0 < kvp_test_scaled_ns(1000 * MS));
    env_free(e);
}

/* ---- a peer in a child process ---- */

static pid_t spawn_peer(char *addr, size_t cap, uint64_t hb, uint64_t dead)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* a failed assertion in the parent must not leave us running (and
         * holding ctest's output pipe) */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(p[0]);
        kvp_loop_t *loop;
        tnode_t n;
        if (kvp_loop_create(NULL, &loop) != KVP_OK)
            _exit(2);
        tn_init(&n, loop, "127.0.0.1:0", NULL);
        n.cfg.heartbeat_ns = hb;
        n.cfg.dead_after_ns = dead;
        if (kvp_ctl_create(&n.cfg, &n.ctl) != KVP_OK)
            _exit(3);
        const char *id = kvp_ctl_peer_id(n.ctl);
        if (write(p[1], id, strlen(id) + 1) < 0)
            _exit(4);
        close(p[1]);
        for (;;)
            kvp_loop_run_once(loop, -1); /* until the parent kills us */
    }
    close(p[1]);
    ssize_t n = read(p[0], addr, cap);
    close(p[0]);
    assert_true(n > 0);
    return pid;
}

static void reap_child(pid_t pid)
{
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
}

static void test_tcp_child_sigkill(void **state)
{
    char addr[256];
    pid_t pid = spawn_peer(addr, sizeof(addr), 500 * MS, 30 * KVP_NSEC_PER_SEC);
    env_t *e = env_new();
    e->a.cfg.dead_after_ns = 30 * KVP_NSEC_PER_SEC;
    tn_start(&e->a);
    assert_int_equal(kvp_ctl_want(e->a.ctl, addr), KVP_OK);
    assert_true(RUN_UNTIL(e->loop, e->a.ready == 1, 3000 * MS));
    uint64_t t0 = now_ns();
    kill(pid, SIGKILL);
    assert_true(RUN_UNTIL(e->loop, e->a.down == 1, 1000 * MS));
    assert_int_equal(e->a.down_reason, KVP_DOWN_EOF);
    assert_true(e->a.down_fault);
    assert_true(now_ns() - t0 < kvp_test_scaled_ns(1000 * MS));
    reap_child(pid);
    kvp_ctl_unwant(e->a.ctl, addr);
    env_free(e);
}

/* A (in-process, heartbeat hb, dead-after dead) connected to a peer
 * process (heartbeat hb, dead-after peer_dead) at addr. */
static env_t *connect_child(char *addr, size_t cap, pid_t *pid, uint64_t hb, uint64_t dead,
                            uint64_t peer_dead)
{
    *pid = spawn_peer(addr, cap, hb, peer_dead);
    env_t *e = env_new();
    e->a.cfg.heartbeat_ns = hb;
    e->a.cfg.dead_after_ns = dead;
    tn_start(&e->a);
    assert_int_equal(kvp_ctl_want(e->a.ctl, addr), KVP_OK);
    assert_true(RUN_UNTIL(e->loop, e->a.ready == 1, 3000 * MS));
    return e;
}

static void test_tcp_child_sigstop(void **state)
{
    uint64_t hb = kvp_test_scaled_ns(100 * MS), dead = kvp_test_scaled_ns(400 * MS);
    char addr[256];
    pid_t pid;
    env_t *e = connect_child(addr, sizeof(addr), &pid, hb, dead, dead);
    /* heartbeats flow (RTT sampled at least every 4 heartbeats), the link stays up */
    assert_true(RUN_UNTIL(e->loop, e->a.pongs > 0, 6 * 100 * MS));
    assert_int_equal(e->a.down, 0);
    uint64_t t0 = now_ns();
    kill(pid, SIGSTOP);
    assert_true(RUN_UNTIL(e->loop, e->a.down == 1, 3000 * MS));
    uint64_t took = now_ns() - t0;
    assert_int_equal(e->a.down_reason, KVP_DOWN_DEAD);
    assert_true(e->a.down_fault);
    assert_true(took >= dead - hb); /* not before the peer was silent ~dead_after */
    assert_true(took <= dead + kvp_test_scaled_ns(300 * MS));
    assert_int_equal(tn_stats(&e->a).peers_dead, 1);
    kvp_ctl_unwant(e->a.ctl, addr);
    reap_child(pid);
    env_free(e);
}

/* Our own stall is not the peer's silence: a callback that runs for twice
 * dead_after (a big commit, a descheduled process) leaves the peer's
 * heartbeats unread in the socket; the dead-after verdict waits for the
 * next poll, which reads them, so the link stays up. (Judged on now instead
 * of on the last poll, A declared the peer dead here.) */
static void stall_cb(kvp_io_t *io, uint32_t events)
{
    (void)events;
    char c;
    if (read(io->fd, &c, 1) != 1)
        return;
    uint64_t *ns = io->data;
    struct timespec ts = {(time_t)(*ns / KVP_NSEC_PER_SEC), (long)(*ns % KVP_NSEC_PER_SEC)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
    *ns = 0; /* once */
}

static void test_tcp_own_stall_is_not_peer_silence(void **state)
{
    uint64_t hb = kvp_test_scaled_ns(50 * MS), dead = kvp_test_scaled_ns(300 * MS);
    char addr[256];
    pid_t pid; /* the peer waits long: it must not hang up on our stall itself */
    env_t *e = connect_child(addr, sizeof(addr), &pid, hb, dead, 60 * KVP_NSEC_PER_SEC);
    int p[2];
    assert_int_equal(pipe(p), 0);
    uint64_t stall = 2 * dead;
    kvp_io_t io;
    assert_int_equal(kvp_io_start(e->loop, &io, p[0], EPOLLIN, stall_cb, &stall), KVP_OK);
    assert_int_equal(write(p[1], "s", 1), 1);
    assert_true(RUN_UNTIL(e->loop, stall == 0, 1000 * MS)); /* the stall ran */
    kvp_io_stop(e->loop, &io);
    close(p[0]);
    close(p[1]);
    run_for(e->loop, 4 * hb);
    assert_int_equal(e->a.down, 0);
    assert_true(tn_stats(&e->a).dead_deferred >= 1); /* the verdict did come, and waited */
    assert_int_equal(tn_stats(&e->a).peers_dead, 0);
    kvp_ctl_unwant(e->a.ctl, addr);
    reap_child(pid);
    env_free(e);
}

/* Frames with another incarnation's epochs, injected by a raw peer after a
 * real handshake, are dropped and counted. */
static void test_tcp_stale_epochs(void **state)
{
    env_t *e = env_new();
    tn_start(&e->a);
    raw_t *r = raw_connect(kvp_ctl_peer_id(e->a.ctl));
    raw_handshake(r, &e->a);
    kvp_msg_t m;
    kvp_key_t keys[2];
    tn_lookup(&m, 11, 2, keys);
    assert_int_equal(kvp_epoch_new(&m.src_epoch), KVP_OK); /* an old incarnation's epoch */
    m.dst_epoch = r->peer_epoch;
    raw_send(r, &m, false);
    tn_lookup(&m, 12, 2, keys);
    raw_send(r, &m, true);
    assert_true(RUN_UNTIL(e->loop, e->a.nframes == 1, 1000 * MS));
    assert_int_equal(e->a.frames[0], 12);
    assert_int_equal(tn_stats(&e->a).stale_frames, 1);
    assert_int_equal(e->a.down, 0);
    raw_close(r);
    assert_true(RUN_UNTIL(e->loop, e->a.down == 1, 1000 * MS));
    env_free(e);
}

static void test_tcp_restart_claim_live(void **state)
{
    env_t *e = env_new();
    connect_ab(e);
    kvp_link_t *old = e->a.link;
    e->c.cfg.listen_addr = NULL;
    e->c.cfg.peer_id = kvp_ctl_peer_id(e->b.ctl);
    tn_start(&e->c);
    assert_int_equal(kvp_ctl_want(e->c.ctl, kvp_ctl_peer_id(e->a.ctl)), KVP_OK);
    assert_true(RUN_UNTIL(e->loop, tn_stats(&e->a).refused_duplicate == 1, 2000 * MS));
    assert_int_equal(e->c.ready, 0);
    assert_int_equal(e->a.down + e->b.down, 0);
    assert_ptr_equal(e->a.link, old);
    assert_int_equal(tn_stats(&e->c).blobs_in, 0);
    kvp_ctl_unwant(e->c.ctl, kvp_ctl_peer_id(e->a.ctl));
    env_free(e);
}

/* The old session's process is stopped: the claim reaps it (fault) and then
 * accepts the new connection. */
static void test_tcp_restart_claim_dead(void **state)
{
    uint64_t hb = kvp_test_scaled_ns(100 * MS), dead = kvp_test_scaled_ns(400 * MS);
    char addr[256];
    pid_t pid = spawn_peer(addr, sizeof(addr), hb, dead);
    env_t *e = env_new();
    e->a.cfg.heartbeat_ns = e->c.cfg.heartbeat_ns = hb;
    e->a.cfg.dead_after_ns = e->c.cfg.dead_after_ns = dead;
    tn_start(&e->a);
    assert_int_equal(kvp_ctl_want(e->a.ctl, addr), KVP_OK);
    assert_true(RUN_UNTIL(e->loop, e->a.ready == 1, 3000 * MS));
    kvp_ctl_unwant(e->a.ctl, addr);
    kill(pid, SIGSTOP);
    e->c.cfg.listen_addr = NULL;
    e->c.cfg.peer_id = addr; /* the "restarted" peer */
    tn_start(&e->c);
    assert_int_equal(kvp_ctl_want(e->c.ctl, kvp_ctl_peer_id(e->a.ctl)), KVP_OK);
    assert_true(RUN_UNTIL(e->loop, e->c.ready == 1, 3000 * MS));
    assert_int_equal(e->a.down, 1); /* the old one, reaped before the new was ready */
    assert_int_equal(e->a.down_reason, KVP_DOWN_DEAD);
    assert_int_equal(e->a.ready, 2);
    assert_int_equal(tn_stats(&e->a).links_ready, 1);
    reap_child(pid);
    env_free(e);
}

static void test_tcp_simultaneous_dial(void **state)
{
    for (int k = 0; k < 5; k++) {
        env_t *e = env_new();
        tn_start(&e->a);
        tn_start(&e->b);
        assert_int_equal(kvp_ctl_want(e->a.ctl, kvp_ctl_peer_id(e->b.ctl)), KVP_OK);
        assert_int_equal(kvp_ctl_want(e->b.ctl, kvp_ctl_peer_id(e->a.ctl)), KVP_OK);
        run_for(e->loop, kvp_test_scaled_ns(300 * MS));
        kvp_ctl_stats_t sa = tn_stats(&e->a), sb = tn_stats(&e->b);
        assert_int_equal(sa.links_ready, 1);
        assert_int_equal(sb.links_ready, 1);
        assert_int_equal(sa.links_handshaking + sb.links_handshaking, 0);
        assert_int_equal(e->a.ready + e->b.ready, 2);
        assert_int_equal(e->a.down + e->b.down, 0);
        assert_true(kvp_epoch_eq(kvp_link_local_epoch(e->a.link),
                                 kvp_link_remote_epoch(e->b.link)));
        env_free(e);
    }
}

static void test_tcp_session_cap(void **state)
{
    env_t *e = env_new();
    e->a.cfg.max_sessions = 1;
    connect_ab(e);
    tn_start(&e->c);
    assert_int_equal(kvp_ctl_want(e->c.ctl, kvp_ctl_peer_id(e->a.ctl)), KVP_OK);
    assert_true(RUN_UNTIL(e->loop, tn_stats(&e->a).refused_limit == 1, 2000 * MS));
    assert_int_equal(e->c.ready, 0);
    assert_int_equal(tn_stats(&e->c).blobs_in, 0);
    assert_int_equal(e->a.down + e->b.down, 0);
    kvp_ctl_unwant(e->c.ctl, kvp_ctl_peer_id(e->a.ctl));
    env_free(e);
}

/* Garbage from one client closes that connection (counted); a ready link of
 * the same node keeps working. */
static void test_tcp_garbage(void **state)
{
    env_t *e = env_new();
    connect_ab(e);
    raw_t *r = raw_connect(kvp_ctl_peer_id(e->a.ctl));
    static const uint8_t junk[] = {0x10, 0, 0, 0, 0x77, 0x77, 0, 0, 'j', 'u', 'n', 'k'};
    raw_send_bytes(r, junk, sizeof(junk));
    raw_drain(r, e->loop);
    assert_true(r->eof);
    assert_int_equal(r->acks_seen, 0);
    assert_int_equal(tn_stats(&e->a).protocol_errors, 1);
    kvp_msg_t m;
    kvp_key_t keys[1];
    tn_lookup(&m, 99, 1, keys);
    assert_int_equal(kvp_link_send(e->b.link, &m), KVP_OK);
    assert_true(RUN_UNTIL(e->loop, e->a.nframes == 1, 1000 * MS));
    assert_int_equal(e->a.down + e->b.down, 0);
    raw_close(r);
    env_free(e);
}

/* A peer that stops reading: our queue stays within wbuf_max and only that
 * link goes down (SLOW_PEER); another link of the node keeps working. */
static void test_tcp_slow_reader(void **state)
{
    env_t *e = env_new();
    e->a.cfg.wbuf_max = 256 * 1024;
    connect_ab(e);
    raw_t *r = raw_connect(kvp_ctl_peer_id(e->a.ctl));
    raw_handshake(r, &e->a);
    kvp_link_t *l = e->a.link; /* the raw peer's link (ready last) */
    assert_string_equal(kvp_link_peer_id(l), "raw-client:1");
    kvp_msg_t m;
    static kvp_key_t keys[1024];
    tn_lookup(&m, 1, 1024, keys);
    kvp_status_t st = KVP_OK;
    for (int i = 0; i < 100000 && st == KVP_OK; i++) {
        st = kvp_link_send(l, &m);
        if (st == KVP_OK)
            assert_true(kvp_link_queued_bytes(l) <= 256 * 1024);
        if ((i & 15) == 0)
            kvp_loop_run_once(e->loop, 0);
    }
    assert_int_equal(st, KVP_ERR_LIMIT);
    assert_true(RUN_UNTIL(e->loop, e->a.down == 1, 1000 * MS));
    assert_int_equal(e->a.down_reason, KVP_DOWN_SLOW_PEER);
    tn_lookup(&m, 5, 1, keys);
    assert_int_equal(kvp_link_send(e->b.link, &m), KVP_OK);
    assert_true(RUN_UNTIL(e->loop, e->a.nframes == 1, 1000 * MS));
    assert_int_equal(e->b.down, 0);
    raw_close(r);
    env_free(e);
}

/* LOOKUPs of request 1 and 6 pause the link that took them for g_pause_ns
 * (as the session does for a peer past its key rate). */
static uint64_t g_pause_ns;

static void pause_on_frame(void *arg, kvp_link_t *link, const kvp_msg_t *msg)
{
    tnode_t *n = arg;
    tn_on_frame(arg, link, msg);
    if (msg->type == KVP_MSG_LOOKUP && msg->u.lookup.request_id % 5 == 1)
        kvp_link_pause_read(link, kvp_loop_now(n->loop) + g_pause_ns);
}

static void send_lookups(env_t *e, uint64_t q0, uint64_t q1)
{
    kvp_msg_t m;
    static kvp_key_t keys[1024];
    for (uint64_t q = q0; q <= q1; q++) {
        tn_lookup(&m, q, 1024, keys);
        assert_int_equal(kvp_link_send(e->b.link, &m), KVP_OK);
    }
}

/* Issue 27, kvp_link_pause_read. (1) Frames 1-5 sent at once; frame 1
 * pauses the link: 2-5 (in our buffer or the sockets) are taken only after
 * the deadline, in order. (2) Frame 6 pauses it again; 7-10, sent after it,
 * wait in the sockets; we stall across the pause's end (the resume and the
 * dead-after verdict then fall due in one round, before a poll read what
 * waited): a pause longer than dead_after is ours, not the peer's silence,
 * the link stays up. Mutations: the link keeps dispatching what it buffered
 * (link_on_readable ignores read_paused) -> frame 2 before the deadline; no
 * wait for a poll after the resume (link_on_dead) -> down as DEAD. */
static void test_tcp_pause_read(void **state)
{
    env_t *e = env_new();
    e->a.cfg.heartbeat_ns = 50 * MS;
    e->a.cfg.dead_after_ns = 250 * MS;
    e->a.cfg.cb.on_frame = pause_on_frame;
    g_pause_ns = kvp_test_scaled_ns(600 * MS);
    /* B is not under test: A answers no ping while it does not read, and a
     * scaled pause (3.6 s under TSan) outlasts B's default dead_after. */
    e->b.cfg.dead_after_ns = 60 * KVP_NSEC_PER_SEC;
    connect_ab(e);
    uint64_t t0 = now_ns();
    send_lookups(e, 1, 5);
    assert_true(RUN_UNTIL(e->loop, e->a.nframes == 1, 1000 * MS));
    run_for(e->loop, g_pause_ns / 2);
    assert_int_equal(e->a.nframes, 1);
    assert_true(RUN_UNTIL(e->loop, e->a.nframes == 5, 2000 * MS));
    assert_true(now_ns() - t0 >= g_pause_ns);
    send_lookups(e, 6, 6);
    assert_true(RUN_UNTIL(e->loop, e->a.nframes == 6, 1000 * MS));
    t0 = now_ns();
    send_lookups(e, 7, 10);
    run_for(e->loop, g_pause_ns / 2);
    assert_int_equal(e->a.nframes, 6);
    uint64_t until = t0 + g_pause_ns + 300 * MS, now = now_ns(); /* our stall past the end */
    uint64_t left = until > now ? until - now : 0;
    struct timespec ts = {(time_t)(left / KVP_NSEC_PER_SEC), (long)(left % KVP_NSEC_PER_SEC)};
    nanosleep(&ts, NULL);
    assert_true(RUN_UNTIL(e->loop, e->a.nframes == 10, 2000 * MS));
    for (int i = 0; i < 10; i++)
        assert_int_equal(e->a.frames[i], (uint64_t)i + 1);
    run_for(e->loop, 100 * MS);
    assert_int_equal(e->a.down, 0);
    assert_int_equal(e->b.down, 0);
    env_free(e);
}

/* A client that connects and never says HELLO is closed at the handshake
 * deadline, counted, without any callback. */
static void test_tcp_handshake_timeout(void **state)
{
    env_t *e = env_new();
    uint64_t hs = kvp_test_scaled_ns(200 * MS);
    e->a.cfg.handshake_timeout_ns = hs;
    tn_start(&e->a);
    raw_t *r = raw_connect(kvp_ctl_peer_id(e->a.ctl));
    uint64_t t0 = now_ns();
    assert_int_equal(raw_drain(r, e->loop), -1); /* our HELLO, then EOF: no BYE, no ack */
    uint64_t took = now_ns() - t0;
    assert_true(r->eof);
    assert_true(took >= hs - 5 * MS && took < hs + kvp_test_scaled_ns(500 * MS));
    assert_int_equal(r->acks_seen, 0);
    assert_int_equal(tn_stats(&e->a).handshakes_timed_out, 1);
    assert_int_equal(e->a.ready + e->a.down, 0);
    raw_close(r);
    env_free(e);
}

static void test_tcp_ipv6(void **state)
{
    env_t *e = env_new();
    e->a.cfg.listen_addr = "[::1]:0";
    if (kvp_ctl_create(&e->a.cfg, &e->a.ctl) != KVP_OK) {
        env_free(e);
        skip();
    }
    tn_start(&e->b);
    assert_string_equal(strncmp(kvp_ctl_peer_id(e->a.ctl), "[::1]:", 6) == 0 ? "ok" : "", "ok");
    assert_int_equal(kvp_ctl_want(e->b.ctl, kvp_ctl_peer_id(e->a.ctl)), KVP_OK);
    assert_true(RUN_UNTIL(e->loop, e->a.ready == 1 && e->b.ready == 1, 2000 * MS));
    assert_true(kvp_link_binding(e->a.link) != 0);
    assert_true(kvp_link_binding(e->a.link) == kvp_link_binding(e->b.link));
    env_free(e);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tcp_handshake_both_ways),
        cmocka_unit_test(test_tcp_refusals_before_blob),
        cmocka_unit_test(test_tcp_auth_ok),
        cmocka_unit_test(test_tcp_queued_order),
        cmocka_unit_test(test_tcp_peer_closed),
        cmocka_unit_test(test_tcp_child_sigkill),
        cmocka_unit_test(test_tcp_child_sigstop),
        cmocka_unit_test(test_tcp_own_stall_is_not_peer_silence),
        cmocka_unit_test(test_tcp_stale_epochs),
        cmocka_unit_test(test_tcp_restart_claim_live),
        cmocka_unit_test(test_tcp_restart_claim_dead),
        cmocka_unit_test(test_tcp_simultaneous_dial),
        cmocka_unit_test(test_tcp_session_cap),
        cmocka_unit_test(test_tcp_garbage),
        cmocka_unit_test(test_tcp_slow_reader),
        cmocka_unit_test(test_tcp_pause_read),
        cmocka_unit_test(test_tcp_handshake_timeout),
        cmocka_unit_test(test_tcp_ipv6),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
