/* ucx_testlib.c -- see ucx_testlib.h. */
#include "testutil.h"
#include "ucx_testlib.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct ut_cmd {
    uint32_t op, len;
    uint64_t a, b;
} ut_cmd_t;

void ut_main_init(char **argv)
{
#if defined(__SANITIZE_THREAD__)
    /* UCM's bistro hooks intercept the madvise() glibc calls while UCX's
     * async thread exits, after TSan tore the thread state down -> SIGSEGV
     * inside TSan. UCM reads its settings when libucs loads (before main),
     * so set them and re-exec once. kvpeer needs no memory events (no
     * registration cache on shm/tcp). */
    if (!getenv("UCX_MEM_MMAP_HOOK_MODE")) {
        setenv("UCX_MEM_MMAP_HOOK_MODE", "none", 1);
        setenv("UCX_MEM_MALLOC_HOOKS", "n", 1);
        execv("/proc/self/exe", argv);
        perror("execv");
    }
#else
    (void)argv;
#endif
}

/* UCX 1.22's cma transport probes a same-host peer with
 * process_vm_readv(pid, &iov, 1, &iov, 1, 0) (uct_cma_iface_is_reachable_v2):
 * one iovec is both the local buffer and the remote address. Against a
 * forked child (same address layout) the read succeeds and overwrites that
 * iovec with the child's bytes; ASan's interceptor then reads the iovec
 * AFTER the call and reports a write to wherever those bytes point
 * (heap-buffer-overflow in write_iovec: test_ucx aborted in ucp_ep_create).
 * The syscall itself harms nothing (UCX never reads the iovec again), and
 * only these tests' peers are forks (e2e_node and kvpeerd are exec'd, their
 * stacks elsewhere): here the call goes straight to the kernel. Exported
 * from the test binaries (tests/transport/CMakeLists.txt) so that libuct_cma
 * binds to it; UCX 1.13 never calls it there. (issue 30) */
ssize_t process_vm_readv(pid_t pid, const struct iovec *local_iov, unsigned long liovcnt,
                         const struct iovec *remote_iov, unsigned long riovcnt,
                         unsigned long flags)
{
    return syscall(SYS_process_vm_readv, pid, local_iov, liovcnt, remote_iov, riovcnt, flags);
}

uint64_t ut_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static bool io_all(int fd, void *buf, size_t len, bool wr)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t n = wr ? send(fd, p, len, MSG_NOSIGNAL) : read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

void ut_pattern_fill(void *slot, size_t len, uint32_t src, uint64_t seed)
{
    uint64_t *w = slot;
    uint64_t v = seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)src << 32);
    for (size_t i = 0; i < len / 8; i++)
        w[i] = v + i * 0xD1B54A32D192ED03ull;
}

bool ut_pattern_check(const void *slot, size_t len, uint32_t src, uint64_t seed)
{
    const uint64_t *w = slot;
    uint64_t v = seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)src << 32);
    for (size_t i = 0; i < len / 8; i++)
        if (w[i] != v + i * 0xD1B54A32D192ED03ull)
            return false;
    return true;
}

kvp_xport_t *ut_xport_new(const char *tls, const char *prefix)
{
    kvp_ucx_config_t cfg;
    kvp_xport_t *x = NULL;

    kvp_ucx_config_default(&cfg);
    cfg.tls = (tls && tls[0]) ? tls : NULL;
    cfg.log_prefix = prefix;
    cfg.max_transfers = 256;
    /* Tests pause the target for seconds (scaled) right after set-up; the
     * data-path probe must not fail those endpoints (the probe tests in
     * test_ucx_fail.c set their own timeout). */
    cfg.connect_timeout_ms = 60000;
    return kvp_ucx_xport_create(&cfg, &x) == KVP_OK ? x : NULL;
}

/* Sleep on the worker fd when UCX says it may; bounded so a BUSY storm
 * (shm back-pressure, UCX-NOTES §6) costs at most 1 ms per round. */
static void ut_wait_events(kvp_xport_t *x, int extra_fd, int timeout_ms)
{
    struct pollfd pf[2] = {{.fd = x->ops->event_fd(x), .events = POLLIN},
                           {.fd = extra_fd, .events = POLLIN}};
    if (x->ops->arm(x) != KVP_OK) {
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
        return;
    }
    poll(pf, extra_fd >= 0 ? 2 : 1, timeout_ms);
}

void ut_progress_for(kvp_xport_t *x, uint64_t ns)
{
    uint64_t end = ut_now_ns() + ns;
    while (ut_now_ns() < end) {
        bool more = x->ops->pump != NULL && x->ops->pump(x); /* as a node round */
        if (x->ops->progress(x) || more)
            continue;
        ut_wait_events(x, -1, 1);
    }
}

/* Results polled while waiting for another id are kept here, so waiting for
 * one transfer never swallows another's result. */
static kvp_xfer_result_t g_stash[64];
static size_t g_nstash;

static bool ut_stash_take(kvp_xfer_id_t id, kvp_status_t *st)
{
    for (size_t i = 0; i < g_nstash; i++)
        if (g_stash[i].id == id) {
            *st = g_stash[i].status;
            g_stash[i] = g_stash[--g_nstash];
            return true;
        }
    return false;
}

bool ut_wait_xfer(kvp_xport_t *x, kvp_xpeer_id_t peer, kvp_xfer_id_t id, uint64_t timeout_ns,
                  kvp_status_t *st)
{
    uint64_t end = ut_now_ns() + timeout_ns;
    kvp_xfer_result_t res[16];
    size_t n;

    for (;;) {
        if (ut_stash_take(id, st))
            return true;
        if (x->ops->pump != NULL)
            x->ops->pump(x); /* as a node round: the writer's finished direct-cma writes */
        x->ops->progress(x);
        kvp_status_t ps = x->ops->poll(x, peer, res, 16, &n);
        if (ps != KVP_OK) {
            fprintf(stderr, "ut_wait_xfer: poll: %s\n", kvp_status_str(ps));
            return false;
        }
        for (size_t i = 0; i < n && g_nstash < KVP_ARRAY_SIZE(g_stash); i++)
            g_stash[g_nstash++] = res[i];
        if (ut_stash_take(id, st))
            return true;
        if (ut_now_ns() > end) {
            if (!getenv("KVPEER_TEST_VERBOSE"))
                return false;
            kvp_xport_stats_t xs;
            x->ops->get_stats(x, &xs);
            fprintf(stderr, "ut_wait_xfer: %llx not done; inflight %llu retired %llu\n",
                    (unsigned long long)id, (unsigned long long)xs.inflight,
                    (unsigned long long)xs.retired);
            return false;
        }
        ut_wait_events(x, -1, 1);
    }
}

void ut_stash_clear(void)
{
    g_nstash = 0;
}

/* ------------------------------------------------------------ the child */

typedef struct ut_target {
    kvp_xport_t *x;
    uint8_t *region;
    kvp_layout_t layout;
    kvp_xpeer_id_t peer;
    int sock;
    void *own_region; /* caller memory (UT_SETUP_CALLER_MEM), unmapped after close */
    size_t own_len;
} ut_target_t;

static void ut_reply(int sock, int64_t status, int64_t v1, int64_t v2, const void *p, uint32_t len)
{
    ut_reply_t r;
    memset(&r, 0, sizeof(r)); /* no uninitialised padding on the socket */
    r.status = status;
    r.v1 = v1;
    r.v2 = v2;
    r.len = len;
    if (!io_all(sock, &r, sizeof(r), true) || (len && !io_all(sock, (void *)p, len, true)))
        _exit(3);
}

/* AM paths land only into expected slots: the tests write generation 0. */
static void ut_target_expect_all(ut_target_t *t, kvp_xpeer_id_t peer)
{
    for (uint32_t i = 0; i < t->layout.num_blocks; i++) {
        kvp_xslot_t xs = {i, 0};
        if (t->x->ops->expect(t->x, peer, &xs, 1) != KVP_OK)
            _exit(10);
    }
}

/* A transfer the source saw complete on an AM path has left its memory but
 * may still be on its way here: progress until nothing arrived for a while
 * before reading the region. */
static void ut_target_settle(ut_target_t *t)
{
    uint64_t quiet = kvp_test_scaled_ns(30 * KVP_NSEC_PER_MSEC), last = ut_now_ns();
    while (ut_now_ns() - last < quiet) {
        if (t->x->ops->progress(t->x))
            last = ut_now_ns();
        else
            ut_wait_events(t->x, -1, 1);
    }
}

static void ut_target_setup(ut_target_t *t, const ut_cmd_t *c, const char *tls)
{
    void *base = NULL;
    const void *blob = NULL;
    size_t blen = 0;
    kvp_status_t st;

    bool caller_mem = (c->a & UT_SETUP_CALLER_MEM) != 0;
    size_t len = (size_t)(uint32_t)c->a * c->b;

    t->layout.num_blocks = (uint32_t)c->a;
    t->layout.block_size = (uint32_t)c->b;
    if (caller_mem) { /* plain anonymous memory: UCX can only emulate puts into it */
        base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (base == MAP_FAILED)
            _exit(9);
        t->own_region = base;
        t->own_len = len;
    }
    t->x = ut_xport_new(tls, "target");
    if (!t->x) {
        ut_reply(t->sock, KVP_ERR_TRANSPORT, 0, 0, NULL, 0);
        return;
    }
    st = t->x->ops->register_region(t->x, base, len, &t->layout, &base);
    if (st == KVP_OK)
        st = t->x->ops->local_blob(t->x, &blob, &blen);
    t->region = base;
    if (st == KVP_OK)
        memset(t->region, 0, len);
    if (st == KVP_OK)
        ut_target_expect_all(t, 0); /* AM paths: accept every slot (gen 0) from any source */
    ut_reply(t->sock, st, kvp_ucx_region_ucx_allocated(t->x), 0, blob,
             st == KVP_OK ? (uint32_t)blen : 0);
}

static int64_t ut_target_verify(ut_target_t *t, const uint32_t *pairs, uint32_t n, uint64_t seed)
{
    int64_t bad = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t dst = pairs[2 * i], src = pairs[2 * i + 1];
        if (dst >= t->layout.num_blocks ||
            !ut_pattern_check(t->region + (size_t)dst * t->layout.block_size, t->layout.block_size,
                              src, seed))
            bad++;
    }
    return bad;
}

static void ut_target_cmd(ut_target_t *t, const ut_cmd_t *c, uint8_t *pl)
{
    size_t rlen = (size_t)t->layout.num_blocks * t->layout.block_size;
    kvp_status_t st;
    bool proof = false;

    switch (c->op) {
    case UT_SETUP:
        pl[c->len] = '\0';
        ut_target_setup(t, c, (const char *)pl);
        break;
    case UT_ADD_PEER: {
        kvp_layout_t exp = {(uint32_t)c->a, (uint32_t)c->b};
        st = t->x->ops->add_peer(t->x, pl, c->len, &exp, &t->peer);
        if (st == KVP_OK)
            ut_target_expect_all(t, t->peer); /* from that peer: fence_peer refuses them */
        ut_reply(t->sock, st, st == KVP_OK ? t->x->ops->peer_path(t->x, t->peer) : 0, 0, NULL, 0);
        break;
    }
    case UT_VERIFY:
        ut_target_settle(t);
        ut_reply(t->sock, KVP_OK, ut_target_verify(t, (const uint32_t *)pl, c->len / 8, c->b), 0,
                 NULL, 0);
        break;
    case UT_FILL:
        ut_target_settle(t); /* what was on its way lands first */
        memset(t->region, (int)c->a, rlen);
        ut_reply(t->sock, KVP_OK, 0, 0, NULL, 0);
        break;
    case UT_COUNT_NOT: {
        int64_t n = 0;
        ut_target_settle(t);
        for (size_t i = 0; i < rlen; i++)
            n += t->region[i] != (uint8_t)c->a;
        ut_reply(t->sock, KVP_OK, n, 0, NULL, 0);
        break;
    }
    case UT_FENCE:
        st = t->x->ops->fence_peer(t->x, t->peer, &proof);
        ut_reply(t->sock, st, proof, 0, NULL, 0);
        break;
    case UT_REFUSE:
        for (uint64_t i = c->a; i < c->a + c->b; i++) {
            kvp_xslot_t xs = {(uint32_t)i, 0};
            t->x->ops->refuse(t->x, &xs, 1);
        }
        ut_reply(t->sock, KVP_OK, 0, 0, NULL, 0);
        break;
    case UT_DROPPED: {
        kvp_xport_stats_t xs;
        ut_target_settle(t);
        t->x->ops->get_stats(t->x, &xs);
        ut_reply(t->sock, KVP_OK, (int64_t)xs.late_bytes_dropped, (int64_t)xs.am_bytes_landed,
                 NULL, 0);
        break;
    }
    case UT_REFUSED: {
        kvp_xport_stats_t xs;
        t->x->ops->get_stats(t->x, &xs);
        ut_reply(t->sock, KVP_OK, (int64_t)xs.am_refused_slots, 0, NULL, 0);
        break;
    }
    case UT_LANDED:
        ut_target_settle(t);
        ut_reply(t->sock, KVP_OK,
                 t->x->ops->is_landed(t->x, (kvp_xslot_t){(uint32_t)c->a, 0}) ? 1 : 0, 0, NULL, 0);
        break;
    case UT_PEER_STATUS:
        ut_reply(t->sock, t->x->ops->peer_status(t->x, t->peer), 0, 0, NULL, 0);
        break;
    case UT_PAUSE: {
        struct timespec ts = {(time_t)(c->a / 1000), (long)(c->a % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        ut_reply(t->sock, KVP_OK, 0, 0, NULL, 0);
        break;
    }
    default:
        _exit(4);
    }
}

static void ut_target_main(int sock)
{
    ut_target_t t = {.sock = sock};
    ut_cmd_t c;
    uint8_t *pl = malloc(1 << 20);

    for (;;) {
        struct pollfd pf = {.fd = sock, .events = POLLIN};
        if (t.x) {
            if (t.x->ops->progress(t.x))
                continue;
            ut_wait_events(t.x, sock, 5);
        }
        if (poll(&pf, 1, t.x ? 0 : 100) <= 0)
            continue;
        if (!io_all(sock, &c, sizeof(c), false) || c.op == UT_EXIT)
            break;
        if (c.len >= (1 << 20) || (c.len && !io_all(sock, pl, c.len, false)))
            _exit(5);
        ut_target_cmd(&t, &c, pl);
    }
    int rc = 0;
    if (t.x && t.x->ops->close(t.x, false) != KVP_OK)
        rc = t.x->ops->close(t.x, true) == KVP_OK ? 6 : 7;
    if (t.own_region)
        munmap(t.own_region, t.own_len);
    free(pl);
    if (kvp_alloc_live() != 0)
        rc = 8;
    _exit(rc);
}

static pid_t g_live_child; /* reaped here if a failed test left it behind */

bool ut_child_start(ut_child_t *c)
{
    int sv[2];
    if (g_live_child > 0) {
        kill(g_live_child, SIGKILL);
        waitpid(g_live_child, NULL, 0);
        g_live_child = 0;
    }
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        return false;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        return false;
    if (pid == 0) {
        kvp_log_set_sink(NULL, NULL); /* the parent's sink may point into its stack */
        close(sv[0]);
        ut_target_main(sv[1]);
    }
    close(sv[1]);
    g_live_child = pid;
    c->pid = pid;
    c->sock = sv[0];
    return true;
}

bool ut_send(ut_child_t *c, uint32_t op, uint64_t a, uint64_t b, const void *payload, uint32_t len)
{
    ut_cmd_t cmd = {.op = op, .len = len, .a = a, .b = b};
    return io_all(c->sock, &cmd, sizeof(cmd), true) &&
           (!len || io_all(c->sock, (void *)payload, len, true));
}

bool ut_recv_reply(ut_child_t *c, ut_reply_t *r, void *payload_out, uint32_t cap)
{
    if (!io_all(c->sock, r, sizeof(*r), false) || r->len > cap)
        return false;
    return !r->len || io_all(c->sock, payload_out, r->len, false);
}

bool ut_call(ut_child_t *c, uint32_t op, uint64_t a, uint64_t b, const void *payload, uint32_t len,
             ut_reply_t *r, void *payload_out, uint32_t cap)
{
    return ut_send(c, op, a, b, payload, len) && ut_recv_reply(c, r, payload_out, cap);
}

bool ut_child_stop(ut_child_t *c)
{
    int ws = 0;
    ut_send(c, UT_EXIT, 0, 0, NULL, 0);
    close(c->sock);
    if (waitpid(c->pid, &ws, 0) != c->pid)
        return false;
    g_live_child = 0;
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
        fprintf(stderr, "target exit status 0x%x\n", ws);
    return WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
}

void ut_child_kill(ut_child_t *c)
{
    kill(c->pid, SIGKILL);
    waitpid(c->pid, NULL, 0);
    g_live_child = 0;
    close(c->sock);
}

/* ------------------------------------------------------------ pairs */

const kvp_layout_t ut_layout = {UT_NB, UT_BS};

/* Fork the target, create both transports (same tls), import its blob. */
void ut_pair_open(ut_pair_t *p, const char *tls, kvp_data_path_t want_path)
{
    ut_pair_open_ex(p, tls, want_path, false);
}

static void ut_pair_open_impl(ut_pair_t *p, const char *tls, kvp_data_path_t want_path,
                              bool target_caller_mem, uint32_t pause_ms)
{
    ut_reply_t r;
    void *base = NULL;

    memset(p, 0, sizeof(*p));
    /* Issue 29 item 4: the AM path into caller memory is what such a test
     * asks for; the same-host direct-cma path (test_ucx_cma) is switched
     * off in both processes for it. */
    bool no_cma = target_caller_mem && want_path != KVP_PATH_DIRECT_CMA;
    if (no_cma)
        setenv("KVPEER_UCX_CMA", "0", 1); /* inherited by the child at fork */
    assert_true(ut_child_start(&p->child)); /* before any UCX thread */
    assert_true(ut_call(&p->child, UT_SETUP, UT_NB | (target_caller_mem ? UT_SETUP_CALLER_MEM : 0),
                        UT_BS, tls, (uint32_t)strlen(tls), &r, p->blob, sizeof(p->blob)));
    assert_int_equal(r.status, KVP_OK);
    if (pause_ms) /* before our endpoint exists: its wire-up waits for the target */
        assert_true(ut_send(&p->child, UT_PAUSE, pause_ms, 0, NULL, 0));
    p->blob_len = r.len;
    p->x = ut_xport_new(tls, "producer");
    if (no_cma)
        unsetenv("KVPEER_UCX_CMA");
    assert_non_null(p->x);
    assert_int_equal(
        p->x->ops->register_region(p->x, NULL, (size_t)UT_NB * UT_BS, &ut_layout, &base), KVP_OK);
    p->region = base;
    assert_int_equal(p->x->ops->add_peer(p->x, p->blob, p->blob_len, &ut_layout, &p->peer), KVP_OK);
    assert_true(kvp_ucx_peer_same_host(p->x, p->peer));
    char lanes[192];
    assert_int_equal(kvp_ucx_peer_lanes(p->x, p->peer, lanes, sizeof(lanes)), KVP_OK);
    print_message("  data path: %s [%s]\n", kvp_data_path_str(p->x->ops->peer_path(p->x, p->peer)),
                  lanes);
    /* A silent fallback (e.g. PEER endpoint on tcp) fails here. */
    assert_int_equal(p->x->ops->peer_path(p->x, p->peer), want_path);
    if (want_path == KVP_PATH_DIRECT_SHM) {
        assert_true(kvp_ucx_region_ucx_allocated(p->x));
        assert_int_equal(r.v1, 1); /* target region UCX-allocated too */
    }
}

void ut_pair_open_ex(ut_pair_t *p, const char *tls, kvp_data_path_t want_path,
                     bool target_caller_mem)
{
    ut_pair_open_impl(p, tls, want_path, target_caller_mem, 0);
}

void ut_pair_open_paused(ut_pair_t *p, const char *tls, kvp_data_path_t want_path,
                         uint32_t pause_ms)
{
    ut_pair_open_impl(p, tls, want_path, false, pause_ms);
}

void ut_pair_close(ut_pair_t *p)
{
    kvp_xport_stats_t st;
    p->x->ops->get_stats(p->x, &st);
    assert_int_equal(st.inflight, 0);
    assert_int_equal(p->x->ops->remove_peer(p->x, p->peer), KVP_OK);
    assert_int_equal(p->x->ops->close(p->x, false), KVP_OK);
    assert_true(ut_child_stop(&p->child));
}

void ut_consumer_add_producer(ut_pair_t *p, int want_path)
{
    const void *b;
    size_t len;
    ut_reply_t r;
    assert_int_equal(p->x->ops->local_blob(p->x, &b, &len), KVP_OK);
    assert_true(ut_call(&p->child, UT_ADD_PEER, UT_NB, UT_BS, b, (uint32_t)len, &r, NULL, 0));
    assert_int_equal(r.status, KVP_OK);
    if (want_path >= 0)
        assert_int_equal(r.v1, want_path);
    ut_progress_for(p->x, kvp_test_scaled_ns(20 * KVP_NSEC_PER_MSEC)); /* wire-up both ways */
}

kvp_xport_stats_t ut_drain_retired(kvp_xport_t *x, uint64_t step_ns, uint64_t timeout_ns)
{
    kvp_xfer_result_t res[16];
    size_t n;
    kvp_xport_stats_t st;
    uint64_t end = ut_now_ns() + timeout_ns;
    do {
        ut_progress_for(x, step_ns);
        assert_int_equal(x->ops->poll_retired(x, res, 16, &n), KVP_OK);
        x->ops->get_stats(x, &st);
    } while ((st.retired || st.zombie_peers) && ut_now_ns() < end);
    return st;
}

kvp_xfer_id_t ut_post4(ut_pair_t *p, uint32_t k)
{
    kvp_xfer_block_t b[4];
    kvp_xfer_id_t id = 0;
    for (uint32_t i = 0; i < 4; i++) {
        uint32_t s = (k * 4 + i) % UT_NB;
        b[i] = (kvp_xfer_block_t){s, 0, s, 0};
    }
    assert_int_equal(p->x->ops->write(p->x, p->peer, b, 4, &id), KVP_OK);
    return id;
}
