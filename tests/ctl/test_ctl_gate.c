/* test_ctl_gate.c -- the control plane's gate (issue 27) over real TCP,
 * each test an attacker with a raw socket and a good peer beside it:
 * unauthenticated links do not fill max_sessions; the per-source and total
 * pre-auth caps and the pre-auth deadline; a reflected blob (ours, or
 * another peer's live session's); a claim of a live peer's id while it is
 * silent; an unprintable peer id; and the listener out of file descriptors
 * (CPU and log bounded, it accepts again afterwards). */
#include "ctl_tcp_testlib.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

static const uint8_t KEY[] = "0123456789abcdef-the-gate-key";

static void use_key(tnode_t *n)
{
    n->cfg.psk = KEY;
    n->cfg.psk_len = sizeof(KEY);
}

/* A raw client that sends a valid HELLO asking for AUTH, reads the node's
 * HELLO and AUTH, and then never answers (it has no key). */
static raw_t *raw_hello_no_auth(tnode_t *n, const char *id)
{
    raw_t *r = raw_connect(kvp_ctl_peer_id(n->ctl));
    kvp_msg_t m;
    raw_hello(n, &m, r);
    snprintf(m.u.hello.peer_id, sizeof(m.u.hello.peer_id), "%s", id);
    m.u.hello.flags = KVP_HELLO_AUTH_REQUIRED;
    raw_send(r, &m, false);
    assert_true(raw_recv(r, n->loop, &m, 2000 * MS));
    assert_int_equal(m.type, KVP_MSG_HELLO);
    assert_true(raw_recv(r, n->loop, &m, 2000 * MS));
    assert_int_equal(m.type, KVP_MSG_AUTH);
    return r;
}

/* (b) of the brief: 25 connections in AUTH that never authenticate; a
 * keyed peer still gets its session under max_sessions = 2. */
static void test_gate_preauth_not_sessions(void **state)
{
    env_t *e = env_new();
    use_key(&e->a), use_key(&e->b), use_key(&e->c);
    e->a.cfg.max_sessions = 2;
    e->a.cfg.max_preauth = 64;
    e->a.cfg.max_preauth_per_addr = 64;
    tn_start(&e->a);
    raw_t *r[25];
    char id[32];
    for (int i = 0; i < 25; i++) {
        snprintf(id, sizeof(id), "squatter-%d:1", i);
        r[i] = raw_hello_no_auth(&e->a, id);
    }
    assert_int_equal(tn_stats(&e->a).links_handshaking, 25);
    tn_start(&e->b);
    assert_int_equal(kvp_ctl_want(e->b.ctl, kvp_ctl_peer_id(e->a.ctl)), KVP_OK);
    assert_true(RUN_UNTIL(e->loop, e->a.ready == 1 && e->b.ready == 1, 2000 * MS));
    assert_int_equal(tn_stats(&e->a).refused_limit, 0);
    for (int i = 0; i < 25; i++) {
        assert_int_equal(r[i]->acks_seen, 0); /* no blob to a keyless client */
        raw_close(r[i]);
    }
    assert_int_equal(tn_stats(&e->a).blobs_out, 1);
    env_free(e);
}

/* Idle connections from one source: max_preauth_per_addr stay, the rest are
 * closed at accept; a good peer from another address is served. */
static void test_gate_per_addr_cap(void **state)
{
    env_t *e = env_new();
    e->a.cfg.max_preauth_per_addr = 4;
    e->a.cfg.preauth_timeout_ns = e->a.cfg.handshake_timeout_ns = 30000 * MS;
    tn_start(&e->a);
    const char *aid = kvp_ctl_peer_id(e->a.ctl);
    raw_t *r[6];
    for (int i = 0; i < 6; i++)
        r[i] = raw_connect_from(aid, "127.0.0.2");
    kvp_msg_t m;
    int eofs = 0;
    for (int i = 0; i < 6; i++) {
        while (raw_recv(r[i], e->loop, &m, 300 * MS))
            ;
        eofs += r[i]->eof;
    }
    assert_int_equal(eofs, 2);
    assert_int_equal(tn_stats(&e->a).refused_preauth, 2);
    tn_start(&e->b); /* dials from 127.0.0.1 */
    assert_int_equal(kvp_ctl_want(e->b.ctl, aid), KVP_OK);
    assert_true(RUN_UNTIL(e->loop, e->a.ready == 1 && e->b.ready == 1, 2000 * MS));
    for (int i = 0; i < 6; i++)
        raw_close(r[i]);
    env_free(e);
}

/* At max_preauth the oldest link of the heaviest source goes, so a lone
 * peer's handshake gets in. */
static void test_gate_total_cap_evicts_heaviest(void **state)
{
    env_t *e = env_new();
    e->a.cfg.max_preauth = 4;
    e->a.cfg.preauth_timeout_ns = e->a.cfg.handshake_timeout_ns = 30000 * MS;
    tn_start(&e->a);
    const char *aid = kvp_ctl_peer_id(e->a.ctl);
    raw_t *r[4];
    for (int i = 0; i < 4; i++)
        r[i] = raw_connect_from(aid, "127.0.0.3");
    run_for(e->loop, kvp_test_scaled_ns(100 * MS));
    assert_int_equal(tn_stats(&e->a).links_handshaking, 4);
    tn_start(&e->b);
    assert_int_equal(kvp_ctl_want(e->b.ctl, aid), KVP_OK);
    assert_true(RUN_UNTIL(e->loop, e->a.ready == 1 && e->b.ready == 1, 2000 * MS));
    assert_int_equal(tn_stats(&e->a).refused_preauth, 1);
    kvp_msg_t m;
    while (raw_recv(r[0], e->loop, &m, 300 * MS))
        ;
    assert_true(r[0]->eof); /* the oldest */
    for (int i = 0; i < 4; i++)
        raw_close(r[i]);
    env_free(e);
}

/* A connection that never authenticates is closed at preauth_timeout, long
 * before the handshake timeout. */
static void test_gate_preauth_deadline(void **state)
{
    env_t *e = env_new();
    use_key(&e->a);
    e->a.cfg.preauth_timeout_ns = kvp_test_scaled_ns(200 * MS);
    e->a.cfg.handshake_timeout_ns = 30000 * MS;
    tn_start(&e->a);
    uint64_t t0 = now_ns();
    raw_t *r = raw_hello_no_auth(&e->a, "slow:1");
    raw_drain(r, e->loop);
    assert_true(r->eof);
    assert_true(now_ns() - t0 < kvp_test_scaled_ns(3000 * MS));
    kvp_ctl_stats_t st = tn_stats(&e->a);
    assert_int_equal(st.refused_preauth, 1);
    assert_int_equal(st.handshakes_timed_out, 1);
    raw_close(r);
    env_free(e);
}

/* A raw handshake whose HELLO_ACK carries `blob`: true if it became ready. */
static bool raw_ack_with(raw_t *r, tnode_t *n, const char *id, const void *blob, size_t len)
{
    int ready0 = n->ready;
    raw_hello_ack(r, n, id, blob, len);
    run_for(n->loop, kvp_test_scaled_ns(200 * MS));
    return n->ready > ready0;
}

/* (c) insecure: a mirror client handing the node its own blob, or a live
 * peer's, is refused; a blob of its own gets in (the control). */
static void test_gate_blob_reflection(void **state)
{
    env_t *e = env_new();
    connect_ab(e);
    raw_t *r = raw_connect(kvp_ctl_peer_id(e->a.ctl));
    assert_false(raw_ack_with(r, &e->a, "mirror:1", e->a.blob, strlen(e->a.blob)));
    assert_int_equal(raw_drain(r, e->loop), KVP_BYE_DUPLICATE);
    assert_int_equal(tn_stats(&e->a).refused_identity, 1);
    raw_close(r);
    r = raw_connect(kvp_ctl_peer_id(e->a.ctl));
    assert_false(raw_ack_with(r, &e->a, "mirror:2", e->b.blob, strlen(e->b.blob)));
    assert_int_equal(raw_drain(r, e->loop), KVP_BYE_DUPLICATE);
    assert_int_equal(tn_stats(&e->a).refused_identity, 2);
    raw_close(r);
    r = raw_connect(kvp_ctl_peer_id(e->a.ctl));
    assert_true(raw_ack_with(r, &e->a, "honest:3", "its-own-blob", 12));
    assert_int_equal(e->a.down + e->b.down, 0); /* the good session never noticed */
    raw_close(r);
    env_free(e);
}

/* (c) insecure: while a peer is silent (stalled, less than dead_after), a
 * second connection claiming its id is held; the peer speaks again and the
 * claimant is refused; the first session stays. Then a claim after the
 * real peer's connection closed (a restart) gets in. */
static void test_gate_no_takeover_of_silent_peer(void **state)
{
    env_t *e = env_new();
    e->a.cfg.heartbeat_ns = 100 * MS;
    e->a.cfg.dead_after_ns = kvp_test_scaled_ns(1500 * MS);
    tn_start(&e->a);
    const char *aid = kvp_ctl_peer_id(e->a.ctl);
    raw_t *real = raw_connect(aid);
    assert_true(raw_ack_with(real, &e->a, "victim:1", "victim-blob", 11));
    raw_t *thief = raw_connect(aid);
    assert_false(raw_ack_with(thief, &e->a, "victim:1", "thief-blob", 10));
    run_for(e->loop, kvp_test_scaled_ns(500 * MS)); /* the victim is "stopped" */
    assert_int_equal(e->a.ready, 1);
    kvp_msg_t m = {.type = KVP_MSG_PING}; /* SIGCONT: the victim speaks again */
    m.u.ping.seq = 1;
    raw_send(real, &m, true);
    assert_int_equal(raw_drain(thief, e->loop), KVP_BYE_DUPLICATE);
    assert_int_equal(e->a.ready, 1);
    assert_int_equal(e->a.down, 0);
    assert_int_equal(tn_stats(&e->a).refused_identity, 1);
    assert_memory_equal(e->a.peer_blob, "victim-blob", 11);
    raw_close(thief);
    /* a restart: the old connection is gone, the new one is served */
    raw_close(real);
    raw_t *again = raw_connect(aid);
    assert_true(RUN_UNTIL(e->loop, e->a.down == 1, 2000 * MS));
    assert_true(raw_ack_with(again, &e->a, "victim:1", "victim-blob-2", 13));
    raw_close(again);
    env_free(e);
}

static void test_gate_unprintable_id(void **state)
{
    env_t *e = env_new();
    tn_start(&e->a);
    raw_t *r = raw_connect(kvp_ctl_peer_id(e->a.ctl));
    kvp_msg_t m;
    raw_hello(&e->a, &m, r);
    snprintf(m.u.hello.peer_id, sizeof(m.u.hello.peer_id), "x:1\n2026 INFO forged\x1b[2J");
    raw_send(r, &m, false);
    assert_int_equal(raw_drain(r, e->loop), KVP_BYE_PROTOCOL);
    assert_int_equal(r->acks_seen, 0);
    assert_int_equal(tn_stats(&e->a).refused_identity, 1);
    raw_close(r);
    env_free(e);
}

/* ------------------------------------------------ out of file descriptors */

static int log_lines;
static void count_log(int32_t level, const char *component, const char *line, void *arg)
{
    log_lines++;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

/* A child holds 300 connections to our listener while this process may
 * open no more fds: the listener backs off (no busy loop, a bounded log)
 * and accepts again once fds are back. */
static void test_gate_listener_out_of_fds(void **state)
{
    env_t *e = env_new();
    tn_start(&e->a);
    char aid[64];
    snprintf(aid, sizeof(aid), "%s", kvp_ctl_peer_id(e->a.ctl));
    int pipefd[2];
    assert_int_equal(pipe(pipefd), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) { /* the flood: connect, hold until told to go */
        close(pipefd[1]);
        struct sockaddr_storage ss;
        unsigned sl;
        if (kvp_tcp_parse_addr(aid, &ss, &sl) != KVP_OK)
            _exit(2);
        for (int i = 0; i < 300; i++) {
            int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK, 0);
            connect(fd, (struct sockaddr *)&ss, sl);
        }
        char c;
        (void)!read(pipefd[0], &c, 1);
        _exit(0);
    }
    close(pipefd[0]);
    struct rlimit old, low;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &old), 0);
    int probe = open("/dev/null", O_RDONLY); /* the lowest free fd: leave a few above it */
    assert_true(probe >= 0);
    close(probe);
    low = old;
    low.rlim_cur = (rlim_t)probe + 4;
    kvp_set_log_callback(count_log, NULL);
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    double c0 = cpu_s();
    uint64_t t0 = now_ns();
    run_for(e->loop, 1000 * MS);
    double cpu = cpu_s() - c0, wall = (double)(now_ns() - t0) / 1e9;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &old), 0);
    kvp_set_log_callback(NULL, NULL);
    kvp_ctl_stats_t st = tn_stats(&e->a);
    print_message("out of fds: %.3f s CPU over %.3f s, %llu accepts without an fd, %d log lines\n",
                  cpu, wall, (unsigned long long)st.accept_fd_exhausted, log_lines);
    assert_true(st.accept_fd_exhausted > 0);
    assert_true(st.accept_fd_exhausted <= 40); /* ~10 per second of back-off, not a spin */
    assert_true(log_lines <= 5);
    assert_true(cpu < 0.5 * wall);
    /* fds back: the listener accepts again and a good peer is served */
    (void)!write(pipefd[1], "x", 1);
    close(pipefd[1]);
    waitpid(pid, NULL, 0);
    tn_start(&e->b);
    assert_int_equal(kvp_ctl_want(e->b.ctl, aid), KVP_OK);
    assert_true(RUN_UNTIL(e->loop, e->a.ready == 1 && e->b.ready == 1, 3000 * MS));
    env_free(e);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gate_preauth_not_sessions),
        cmocka_unit_test(test_gate_per_addr_cap),
        cmocka_unit_test(test_gate_total_cap_evicts_heaviest),
        cmocka_unit_test(test_gate_preauth_deadline),
        cmocka_unit_test(test_gate_blob_reflection),
        cmocka_unit_test(test_gate_no_takeover_of_silent_peer),
        cmocka_unit_test(test_gate_unprintable_id),
        cmocka_unit_test(test_gate_listener_out_of_fds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
