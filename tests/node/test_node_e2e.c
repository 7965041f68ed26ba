/*
 * test_node_e2e.c -- end to end over real TCP (control) and UCX (data), one
 * process per node (tests/node/e2e_node.c), on 127.0.0.1: the shared-memory
 * path and UCX_TLS=tcp; two consumers fetching the same keys at once; a
 * source serving while its engine thread is busy; F24 (SIGKILL the source
 * mid-fetch, restart under the same peer id) and F27 (SIGSTOP the source in
 * the middle of a direct shared-memory write, SIGCONT later).
 */
#include "testutil.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

typedef struct proc {
    pid_t pid;
    FILE *in, *out;
    char id[64];
} proc_t;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static uint64_t scaled_ms(uint64_t ms)
{
    return kvp_test_scaled_ns(ms * KVP_NSEC_PER_MSEC) / KVP_NSEC_PER_MSEC;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000001)};
    socklen_t l = sizeof(a);
    bind(fd, (struct sockaddr *)&a, sizeof(a));
    getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    return ntohs(a.sin_port);
}

static void proc_start(proc_t *p, const char *listen, const char *bs, const char *nb,
                       const char *tls, unsigned hold_ms, unsigned dead_ms)
{
    int in[2], out[2];
    char hold[32], dead[32];
    /* every bound scaled by the one test multiplier (sanitizers, loaded CI) */
    snprintf(hold, sizeof(hold), "%llu", (unsigned long long)scaled_ms(hold_ms));
    snprintf(dead, sizeof(dead), "%llu", (unsigned long long)scaled_ms(dead_ms));
    assert_int_equal(pipe(in), 0);
    assert_int_equal(pipe(out), 0);
    p->pid = fork();
    assert_true(p->pid >= 0);
    if (p->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        if (tls)
            setenv("UCX_TLS", tls, 1);
        execl(E2E_NODE_PATH, "e2e_node", listen, bs, nb, hold, dead, (char *)NULL);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    p->in = fdopen(in[1], "w");
    p->out = fdopen(out[0], "r");
    setvbuf(p->in, NULL, _IOLBF, 0);
    char line[256];
    assert_non_null(fgets(line, sizeof(line), p->out));
    assert_int_equal(sscanf(line, "ready %63s", p->id), 1);
}

static void proc_cmd(proc_t *p, char *reply, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void proc_cmd(proc_t *p, char *reply, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(p->in, fmt, ap);
    va_end(ap);
    fputc('\n', p->in);
    fflush(p->in);
    assert_non_null(fgets(reply, (int)cap, p->out));
}

static void proc_quit(proc_t *p)
{
    int status;
    fprintf(p->in, "quit\n");
    fclose(p->in);
    fclose(p->out);
    assert_int_equal(waitpid(p->pid, &status, 0), p->pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void proc_kill(proc_t *p, int sig)
{
    kill(p->pid, sig);
    if (sig == SIGKILL) {
        waitpid(p->pid, NULL, 0); /* reaped at once: shm keepalive ignores zombies */
        fclose(p->in);
        fclose(p->out);
    }
}

typedef struct load {
    int status;
    unsigned n_ok, hits;
    unsigned long long us;
} load_t;

static load_t parse_load(const char *r)
{
    load_t l = {-999, 0, 0, 0};
    if (sscanf(r, "load %d %u %u %llu", &l.status, &l.n_ok, &l.hits, &l.us) != 4)
        fail_msg("no load result: %s", r);
    return l;
}

static void expect_verify(proc_t *p, unsigned first, unsigned count, unsigned present)
{
    char r[256];
    unsigned pr, bad;
    proc_cmd(p, r, sizeof(r), "verify %u %u", first, count);
    assert_int_equal(sscanf(r, "verify %u %u", &pr, &bad), 2);
    assert_int_equal(bad, 0); /* no corrupt committed block, ever */
    if (present != UINT32_MAX)
        assert_int_equal(pr, present);
}

static void expect_path(proc_t *p, const char *peer, const char *want)
{
    char r[256], path[64];
    proc_cmd(p, r, sizeof(r), "path %s", peer);
    assert_int_equal(sscanf(r, "path %63s", path), 1);
    if (strcmp(path, want) != 0)
        fail_msg("data path to %s is %s, expected %s (silent fallback?)", peer, path, want);
}

/* Three processes: A serves, B and C fetch a few thousand blocks (B and C the
 * same keys at once), byte-exact; the data path is asserted. */
static void run_three(const char *tls, const char *want_path)
{
    proc_t a, b, c;
    char r[256];
    const unsigned N = 2000;
    proc_start(&a, "127.0.0.1:0", "32768", "2048", tls, 120000, 2000);
    proc_start(&b, "127.0.0.1:0", "32768", "2048", tls, 120000, 2000);
    proc_start(&c, "127.0.0.1:0", "32768", "2048", tls, 120000, 2000);
    proc_cmd(&a, r, sizeof(r), "put 0 %u", N);
    assert_string_equal(r, "ok 2000\n");
    proc_cmd(&b, r, sizeof(r), "add %s", a.id);
    assert_string_equal(r, "ok\n");
    proc_cmd(&c, r, sizeof(r), "add %s", a.id);
    assert_string_equal(r, "ok\n");
    expect_path(&b, a.id, want_path);
    for (unsigned f = 0; f < N; f += 500) {
        proc_cmd(&b, r, sizeof(r), "fetchnw %s %u 500 %u", a.id, f, 10 + f);
        assert_string_equal(r, "started\n");
        proc_cmd(&c, r, sizeof(r), "fetchnw %s %u 500 %u", a.id, f, 10 + f);
        assert_string_equal(r, "started\n");
        proc_cmd(&b, r, sizeof(r), "wait 60000");
        load_t lb = parse_load(r);
        proc_cmd(&c, r, sizeof(r), "wait 60000");
        load_t lc = parse_load(r);
        assert_int_equal(lb.status, 0);
        assert_int_equal(lc.status, 0);
        assert_int_equal(lb.n_ok, 500);
        assert_int_equal(lc.n_ok, 500);
    }
    expect_verify(&b, 0, N, N);
    expect_verify(&c, 0, N, N);
    /* The source serves while its engine thread is busy: its progress
     * thread answers lookups and posts transfers. */
    proc_cmd(&a, r, sizeof(r), "put 3000 10");
    unsigned busy = (unsigned)scaled_ms(3000);
    fprintf(a.in, "busy %u\n", busy);
    fflush(a.in);
    uint64_t t0 = now_ms();
    proc_cmd(&c, r, sizeof(r), "fetch %s 3000 10 778", a.id);
    uint64_t dt = now_ms() - t0;
    load_t l = parse_load(r);
    assert_int_equal(l.status, 0);
    assert_int_equal(l.n_ok, 10);
    assert_true(dt < busy); /* served before the engine thread woke up */
    assert_non_null(fgets(r, sizeof(r), a.out)); /* busy's own answer */
    expect_verify(&c, 3000, 10, 10);
    proc_quit(&c);
    proc_quit(&b);
    proc_quit(&a);
}

static void test_e2e_three_nodes_shm(void **state)
{
    (void)state;
    run_three(NULL, "direct-shm");
}

static void test_e2e_three_nodes_tcp(void **state)
{
    (void)state;
    run_three("tcp", "am-tcp");
}

/* F24: SIGKILL the source mid-fetch: the consumer fails fast (TCP EOF), never
 * commits a corrupt block, and a restarted source under the same peer id
 * serves the next fetch. */
static void test_F24_sigkill_source_mid_fetch(void **state)
{
    (void)state;
    proc_t a, b;
    char r[256], listen[64];
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", free_port());
    proc_start(&a, listen, "262144", "1024", "tcp", 3000, 1000);
    proc_start(&b, "127.0.0.1:0", "262144", "1024", "tcp", 3000, 1000);
    proc_cmd(&a, r, sizeof(r), "put 0 800");
    proc_cmd(&b, r, sizeof(r), "add %s", a.id);
    assert_string_equal(r, "ok\n");
    proc_cmd(&b, r, sizeof(r), "fetchnw %s 0 800 1", a.id);
    assert_string_equal(r, "started\n");
    usleep(2000);
    uint64_t t0 = now_ms();
    proc_kill(&a, SIGKILL);
    proc_cmd(&b, r, sizeof(r), "wait %u", (unsigned)scaled_ms(5000));
    uint64_t dt = now_ms() - t0;
    load_t l = parse_load(r);
    printf("F24: load status %d n_ok %u after kill: failed in %llu ms\n", l.status, l.n_ok,
           (unsigned long long)dt);
    if (l.status != 0) /* it may have finished before the kill landed */
        assert_true(dt <= scaled_ms(1000)); /* within dead-after; EOF makes it ms */
    expect_verify(&b, 0, 800, UINT32_MAX);
    proc_start(&a, listen, "262144", "1024", "tcp", 3000, 1000); /* same peer id */
    proc_cmd(&a, r, sizeof(r), "put 1000 50");
    proc_cmd(&b, r, sizeof(r), "add %s", a.id);
    assert_string_equal(r, "ok\n");
    proc_cmd(&b, r, sizeof(r), "fetch %s 1000 50 2", a.id);
    l = parse_load(r);
    assert_int_equal(l.status, 0);
    assert_int_equal(l.n_ok, 50);
    expect_verify(&b, 1000, 50, 50);
    proc_quit(&b);
    proc_quit(&a);
}

/* F27: SIGSTOP the source during a large direct shared-memory write: the
 * consumer fails fast (dead-after), quarantines; SIGCONT: late bytes land
 * only in quarantined slots, released at the (short) hold cap; every
 * committed block verifies. */
static void test_F27_sigstop_source_mid_shm_write(void **state)
{
    (void)state;
    proc_t a, b;
    char r[256];
    unsigned ready, filling, quar, suspect, pins, retained, force, mism;
    proc_start(&a, "127.0.0.1:0", "2097152", "256", NULL, 3000, 1000);
    proc_start(&b, "127.0.0.1:0", "2097152", "256", NULL, 3000, 1000);
    proc_cmd(&a, r, sizeof(r), "put 0 200");
    proc_cmd(&b, r, sizeof(r), "add %s", a.id);
    expect_path(&b, a.id, "direct-shm");
    proc_cmd(&b, r, sizeof(r), "fetchnw %s 0 200 1", a.id);
    assert_string_equal(r, "started\n");
    proc_kill(&a, SIGSTOP);
    uint64_t t0 = now_ms();
    proc_cmd(&b, r, sizeof(r), "wait %u", (unsigned)scaled_ms(10000));
    load_t l = parse_load(r);
    uint64_t dt = now_ms() - t0;
    proc_cmd(&b, r, sizeof(r), "stats");
    sscanf(r, "stats %u %u %u %u %u %u %u %u", &ready, &filling, &quar, &suspect, &pins, &retained,
           &force, &mism);
    printf("F27: load status %d n_ok %u, failed after %llu ms, quarantined %u\n", l.status,
           l.n_ok, (unsigned long long)dt, quar);
    if (l.status != 0) {
        assert_true(dt <= scaled_ms(1000) + scaled_ms(1500));
        assert_int_equal(filling, 0);
    }
    proc_kill(&a, SIGCONT);
    usleep((useconds_t)scaled_ms(4500) * 1000u); /* past the 3 s hold cap */
    proc_cmd(&b, r, sizeof(r), "stats");
    sscanf(r, "stats %u %u %u %u %u %u %u %u", &ready, &filling, &quar, &suspect, &pins, &retained,
           &force, &mism);
    assert_int_equal(quar, 0);
    assert_int_equal(filling, 0);
    expect_verify(&b, 0, 200, UINT32_MAX);
    proc_quit(&b);
    proc_quit(&a);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_e2e_three_nodes_shm),
        cmocka_unit_test(test_e2e_three_nodes_tcp),
        cmocka_unit_test(test_F24_sigkill_source_mid_fetch),
        cmocka_unit_test(test_F27_sigstop_source_mid_shm_write),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
