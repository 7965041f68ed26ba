/*
 * test_pcred.c -- the process-exit side channel alone (src/transport/
 * pcred.h, issue 27 item 8), with forked children as sources: a claim
 * matched to a watch gives a pidfd of the connecting process (SO_PEERCRED);
 * a stopped process is alive, a killed one exited; a source that died
 * before its pid was watched is not watched (the liveness recheck); another
 * uid, garbage, an unknown claim (deadline) and a flood (pending cap) get
 * nothing; a claim that came before its watch is matched; a node's own
 * tell() reaches another listener; every fd closed at close.
 */
#include "testutil.h"
#include "transport/pcred.h"

#include <errno.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SECRET_C 0x0123456789abcdefull
#define SECRET_S 0x1122334455667788ull

enum { CH_HOLD, CH_EXIT, CH_GARBAGE };

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A child that connects to the consumer's listener as `uid` (0: ours),
 * sends `claim` (or garbage), then holds the connection until EOF and
 * runs on (CH_HOLD, CH_GARBAGE: killed by the test), or exits at once
 * (CH_EXIT). */
static pid_t child(uint64_t claim, int mode, uid_t uid)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    if (uid != 0 && setuid(uid) != 0)
        _exit(3);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() == 1) /* after setuid, which clears it */
        _exit(6); /* no child outlives a test that failed half-way */
    char name[KVP_PCRED_NAME_MAX];
    kvp__pcred_name(SECRET_C, name);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    memcpy(a.sun_path + 1, name, strlen(name));
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
    if (connect(fd, (struct sockaddr *)&a, len) != 0)
        _exit(4);
    kvp_pcred_msg_t m = {KVP_PCRED_MAGIC, KVP_PCRED_VERSION, claim};
    if (mode == CH_GARBAGE)
        memset(&m, 0x5a, sizeof(m));
    if (write(fd, &m, sizeof(m)) != (ssize_t)sizeof(m))
        _exit(5);
    if (mode == CH_EXIT)
        _exit(0);
    char b;
    while (read(fd, &b, 1) > 0) {
    }
    close(fd); /* as kvpeerd does at the consumer's EOF; the process runs on */
    for (;;)
        pause();
}

/* Progress until cond or ~2 s. */
#define PROGRESS_UNTIL(pc, cond)                                                                   \
    do {                                                                                           \
        for (int k_ = 0; k_ < 400 && !(cond); k_++) {                                             \
            kvp__pcred_progress(pc);                                                               \
            sleep_ms(5);                                                                           \
        }                                                                                          \
    } while (0)

static kvp_pcred_t *open_c(uint32_t max_pending, uint32_t timeout_ms)
{
    kvp_pcred_t *pc = NULL;
    kvp_pcred_config_t c = {.log_prefix = "C", .secret = SECRET_C, .max_pending = max_pending,
                            .timeout_ms = timeout_ms};
    assert_int_equal(kvp__pcred_open(&c, &pc), KVP_OK);
    return pc;
}

static kvp_pcred_stats_t stats(kvp_pcred_t *pc)
{
    kvp_pcred_stats_t st;
    kvp__pcred_stats(pc, &st);
    return st;
}

static void reap(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* Watched, alive while stopped, exited once killed (not yet reaped: a
 * zombie's pidfd is readable too). Mutation exit-proof-alive: exited true
 * while it runs. */
static void test_watch_stop_kill(void **state)
{
    (void)state;
    kvp_pcred_t *pc = open_c(0, 0);
    uint64_t claim = kvp__pcred_claim(42);
    kvp__pcred_watch(pc, 7, claim);
    pid_t p = child(claim, CH_HOLD, 0);
    PROGRESS_UNTIL(pc, stats(pc).watched == 1);
    assert_int_equal(stats(pc).watched, 1);
    assert_true(kvp__pcred_hold(pc, 7));
    assert_false(kvp__pcred_exited(pc, 7));
    kill(p, SIGSTOP);
    sleep_ms(50);
    assert_false(kvp__pcred_exited(pc, 7)); /* stopped: alive */
    kvp__mutation = KVP_MUT_EXIT_PROOF_ALIVE; /* the bug the switch models is seen here */
    assert_true(kvp__pcred_exited(pc, 7));
    kvp__mutation = KVP_MUT_NONE;
    kill(p, SIGKILL);
    siginfo_t si;
    assert_int_equal(waitid(P_PID, (id_t)p, &si, WEXITED | WNOWAIT), 0);
    assert_true(kvp__pcred_exited(pc, 7));
    kvp__pcred_unwatch(pc, 7);                /* the peer went: held, kept */
    assert_true(kvp__pcred_exited(pc, 7));
    assert_int_equal(stats(pc).watches, 1);
    kvp__pcred_drop(pc, 7);                   /* the last holder: pidfd closed */
    assert_int_equal(stats(pc).watches, 0);
    assert_false(kvp__pcred_exited(pc, 7));
    waitpid(p, NULL, 0);
    kvp__pcred_close(pc);
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* The source's process died after connecting, before we took its pid: not
 * watched (its pid could belong to another process by now). Mutation: no
 * liveness recheck after pidfd_open -> watched. */
static void test_dead_before_pidfd_not_watched(void **state)
{
    (void)state;
    kvp_pcred_t *pc = open_c(0, 0);
    uint64_t claim = kvp__pcred_claim(43);
    pid_t p = child(claim, CH_EXIT, 0);
    siginfo_t si;
    assert_int_equal(waitid(P_PID, (id_t)p, &si, WEXITED | WNOWAIT), 0); /* exited, zombie */
    PROGRESS_UNTIL(pc, stats(pc).accepted == 1);
    for (int k = 0; k < 10; k++) /* its claim read: pending, no peer watches it yet */
        kvp__pcred_progress(pc);
    kvp__pcred_watch(pc, 8, claim); /* its claim is already here: matched now */
    PROGRESS_UNTIL(pc, stats(pc).closed_dead + stats(pc).closed_garbage > 0);
    assert_int_equal(stats(pc).watched, 0);
    assert_true(stats(pc).closed_dead + stats(pc).closed_garbage >= 1);
    assert_false(kvp__pcred_hold(pc, 8));
    waitpid(p, NULL, 0);
    kvp__pcred_close(pc);
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* A claim that arrives before its peer is watched is matched at watch(). */
static void test_claim_before_watch(void **state)
{
    (void)state;
    kvp_pcred_t *pc = open_c(0, 0);
    uint64_t claim = kvp__pcred_claim(44);
    pid_t p = child(claim, CH_HOLD, 0);
    PROGRESS_UNTIL(pc, stats(pc).accepted == 1);
    for (int k = 0; k < 20; k++) {
        kvp__pcred_progress(pc);
        sleep_ms(5);
    }
    assert_int_equal(stats(pc).watched, 0);
    kvp__pcred_watch(pc, 9, claim);
    assert_int_equal(stats(pc).watched, 1);
    assert_true(kvp__pcred_hold(pc, 9));
    kvp__pcred_drop(pc, 9);
    reap(p);
    kvp__pcred_close(pc);
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* The door: another uid is refused at accept; garbage is closed; an
 * unknown claim waits only until the deadline; a flood past the pending cap
 * is refused; none is watched, and the real source is watched afterwards. */
static void test_door(void **state)
{
    (void)state;
    kvp_pcred_t *pc = open_c(4, 300);
    uint64_t claim = kvp__pcred_claim(45);
    kvp__pcred_watch(pc, 10, claim);
    pid_t other = child(claim, CH_HOLD, 65534); /* the right claim, another user */
    PROGRESS_UNTIL(pc, stats(pc).refused_uid == 1);
    assert_int_equal(stats(pc).refused_uid, 1);
    pid_t g = child(claim, CH_GARBAGE, 0);
    PROGRESS_UNTIL(pc, stats(pc).closed_garbage == 1);
    assert_int_equal(stats(pc).closed_garbage, 1);
    pid_t flood[8];
    for (int i = 0; i < 8; i++) /* a wrong claim each, held open */
        flood[i] = child(kvp__pcred_claim(1000 + (uint64_t)i), CH_HOLD, 0);
    PROGRESS_UNTIL(pc, stats(pc).accepted >= 10);
    assert_true(stats(pc).refused_cap >= 4);
    assert_int_equal(stats(pc).watched, 0);
    PROGRESS_UNTIL(pc, stats(pc).closed_timeout >= 4); /* the deadline frees the pending */
    assert_true(stats(pc).closed_timeout >= 4);
    pid_t s = child(claim, CH_HOLD, 0);
    PROGRESS_UNTIL(pc, stats(pc).watched == 1);
    assert_int_equal(stats(pc).watched, 1);
    assert_true(kvp__pcred_hold(pc, 10));
    assert_false(kvp__pcred_exited(pc, 10));
    kvp__pcred_drop(pc, 10);
    for (int i = 0; i < 8; i++)
        reap(flood[i]);
    reap(other);
    reap(g);
    reap(s);
    kvp__pcred_close(pc);
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* tell(): a node's own connection to another node's listener, held until
 * that node closes it (it watched our pid: ours, alive). */
static void test_tell(void **state)
{
    (void)state;
    kvp_pcred_t *c = open_c(0, 0), *s = NULL;
    kvp_pcred_config_t sc = {.log_prefix = "S", .secret = SECRET_S};
    assert_int_equal(kvp__pcred_open(&sc, &s), KVP_OK);
    uint64_t claim = kvp__pcred_claim(46);
    kvp__pcred_watch(c, 11, claim);
    int lp = -1; /* issue 29 item 4: the listener's pid, the kernel's word */
    kvp__pcred_tell(s, 3, SECRET_C, claim, &lp);
    assert_int_equal(lp, (int)getpid());
    assert_int_equal(stats(s).told, 1);
    PROGRESS_UNTIL(c, stats(c).watched == 1);
    assert_int_equal(stats(c).watched, 1);
    assert_false(kvp__pcred_exited(c, 11));
    kvp__pcred_tell(s, 4, 0xdeadull, claim, &lp); /* nobody listens there: nothing */
    assert_int_equal(lp, 0);
    assert_int_equal(stats(s).told, 1);
    kvp__pcred_progress(s);
    kvp__pcred_untell(s, 3);
    kvp__pcred_close(s);
    kvp__pcred_close(c);
    KVP_TEST_ASSERT_NO_LEAKS();
}

int main(void)
{
    /* Nothing to test without pidfd_open: a kernel before 5.3, or valgrind
     * 3.19 (Debian 12's), which does not implement syscall 434 -- the proof
     * then never exists and the node falls back to the hold cap (logged). */
    long fd = syscall(SYS_pidfd_open, (long)getpid(), 0L);
    if (fd < 0 && errno == ENOSYS) {
        printf("SKIP: pidfd_open is not available here (ENOSYS)\n");
        return 77;
    }
    if (fd >= 0)
        close((int)fd);
    kvp_log_set_level(KVP_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_watch_stop_kill),
        cmocka_unit_test(test_dead_before_pidfd_not_watched),
        cmocka_unit_test(test_claim_before_watch),
        cmocka_unit_test(test_door),
        cmocka_unit_test(test_tell),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
