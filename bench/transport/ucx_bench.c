/*
 * ucx_bench.c -- raw baseline of the UCX data path, two processes on this
 * machine (parent = producer, forked child = target).
 *
 * For each path (shared memory with the default config; tcp with TLS=tcp),
 * block size (16 KiB, 256 KiB, 2 MiB) and blocks per transfer (1..64), slot-
 * cycled over regions larger than the LLC on both sides (default 256 MiB = 8x
 * the 32 MiB L3; --region-mib 1024 for 1 GiB).
 * The regions are registered once per path with 16 KiB slots; a bigger block
 * is a run of adjacent slots, which our backend coalesces into one put (so
 * ours also pays a bounds check per 16 KiB slot: pessimistic for ours).
 * Every mapping (target, source, our and raw's mapping of the target) is
 * touched once before timing: on this VM the first touch of a page per
 * process costs ~30 us (shadow paging), which would otherwise dominate.
 *   ours  : kvpeer's UCX backend, write(D blocks) -> poll until DONE
 *   raw   : the same puts on the same regions with bare ucp_put_nbx + one
 *           ucp_ep_flush_nbx, none of our bookkeeping (the ceiling on shm;
 *           on tcp this is UCX's emulated put). Since issue 27 a kvpeer
 *           node's tcp worker has no RMA (no emulated put can reach it), so
 *           on tcp the target also opens a bare UCX RMA context of its own
 *           on tcp with the same region registered, for raw only (a bench
 *           target: the door the library closed, opened on purpose here)
 *   old   : (tcp) ours with legacy_put, i.e. the backend before issue 14
 *           (emulated put + our bookkeeping). On tcp ours is kvpeer's AM
 *           path, registered with slots of the block size (one AM per block,
 *           as a node does); "done" there is local completion (the consumer
 *           lands the blocks in its own progress, which keeps pace through
 *           socket back-pressure).
 * interleaved batch by batch, alternating who goes first, each timed on its
 * own (wall clock and producer-thread CPU time), so both see the same load
 * on this shared VM; --reps times; medians and ours/raw are printed. Then
 * `ucx_perftest -t ucp_put_bw` at the same sizes (server + client on
 * 127.0.0.1; on shm it reuses one cached destination buffer, so it is not a
 * ceiling for slot-cycled traffic) and a single-thread cold memcpy.
 *
 *   ucx_bench [--quick] [--region-mib N] [--reps N] [--secs S] [--path shm|tcp|both]
 *             [--no-perftest] [--sizes KiB,..]   (block sizes, default 16,256,2048; <= 4 MiB)
 */
#include "transport/ucx.h"

#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

typedef struct opts {
    bool quick, perftest;
    uint32_t sizes[8];
    int nsizes;
    size_t region;
    int reps;
    double secs;
    bool shm, tcp;
} opts_t;

static opts_t O = {
    .sizes = {16 << 10, 256 << 10, 2 << 20},
    .nsizes = 3,
    .perftest = true, .region = 256ull << 20, .reps = 5, .secs = 0.2, .shm = true, .tcp = true};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* This thread's CPU time: immune to being descheduled on the shared VM. */
static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

__attribute__((noreturn)) static void die(const char *what)
{
    fprintf(stderr, "ucx_bench: %s\n", what);
    exit(1);
}

static bool io_all(int fd, void *buf, size_t len, bool wr)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t n = wr ? write(fd, p, len) : read(fd, p, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

/* ------------------------------------------------------------ target */

typedef struct cmd {
    uint32_t op; /* 1 setup, 2 teardown, 3 exit */
    uint32_t block_size;
    char tls[16];
} cmd_t;

static kvp_xport_t *make_xport(const char *tls, uint32_t bs, void **region, const char *name,
                               bool legacy_put)
{
    kvp_ucx_config_t cfg;
    kvp_xport_t *x;
    kvp_layout_t lay = {(uint32_t)(O.region / bs), bs};
    double t0 = now_s();

    kvp_ucx_config_default(&cfg);
    cfg.tls = tls[0] ? tls : NULL;
    cfg.log_prefix = name;
    cfg.legacy_put = legacy_put;
    cfg.connect_timeout_ms = 60000; /* the target is busy with the other sides' traffic */
    if (kvp_ucx_xport_create(&cfg, &x) != KVP_OK)
        die("transport create");
    if (x->ops->register_region(x, NULL, O.region, &lay, region) != KVP_OK)
        die("register_region");
    memset(*region, 0x11, O.region); /* first touch of every page before timing */
    fprintf(stderr, "  [%s: region %zu MiB allocated + touched in %.1f s]\n", name, O.region >> 20,
            now_s() - t0);
    return x;
}

/* The bare tcp RMA target for raw (see the header). */
typedef struct raw_target {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_mem_h memh;
    ucp_address_t *addr;
    size_t addr_len;
    void *rkey;
    size_t rkey_len;
} raw_target_t;

static void raw_target_open(raw_target_t *t, void *region)
{
    ucp_config_t *c;
    if (ucp_config_read(NULL, NULL, &c) != UCS_OK || ucp_config_modify(c, "TLS", "tcp") != UCS_OK)
        die("raw target config");
    ucp_params_t prm = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_RMA};
    if (ucp_init(&prm, c, &t->ctx) != UCS_OK)
        die("raw target ucp_init");
    ucp_config_release(c);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                             UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = region,
                               .length = O.region};
    if (ucp_worker_create(t->ctx, &wp, &t->worker) != UCS_OK ||
        ucp_mem_map(t->ctx, &mp, &t->memh) != UCS_OK ||
        ucp_rkey_pack(t->ctx, t->memh, &t->rkey, &t->rkey_len) != UCS_OK ||
        ucp_worker_get_address(t->worker, &t->addr, &t->addr_len) != UCS_OK)
        die("raw target");
}

static void raw_target_close(raw_target_t *t)
{
    if (t->ctx == NULL)
        return;
    ucp_worker_release_address(t->worker, t->addr);
    ucp_rkey_buffer_release(t->rkey);
    ucp_mem_unmap(t->ctx, t->memh);
    ucp_worker_destroy(t->worker);
    ucp_cleanup(t->ctx);
    memset(t, 0, sizeof(*t));
}

static void target_main(int sock)
{
    kvp_xport_t *x = NULL;
    void *region;
    cmd_t c;
    raw_target_t rt = {0};

    for (;;) {
        struct pollfd pf = {.fd = sock, .events = POLLIN};
        if (x) { /* spin: emulated puts land in our progress */
            for (int i = 0; i < 64; i++) {
                x->ops->progress(x);
                if (rt.worker)
                    ucp_worker_progress(rt.worker);
            }
        }
        if (poll(&pf, 1, x ? 0 : 100) <= 0)
            continue;
        if (!io_all(sock, &c, sizeof(c), false) || c.op == 3)
            break;
        if (c.op == 1) {
            const void *blob;
            size_t len;
            x = make_xport(c.tls, c.block_size, &region, "target", false);
            x->ops->local_blob(x, &blob, &len);
            /* AM path: land every slot (generation 0) from any source */
            for (uint32_t i = 0; i < (uint32_t)(O.region / c.block_size); i++) {
                kvp_xslot_t xs = {i, 0};
                x->ops->expect(x, 0, &xs, 1);
            }
            uint32_t l32 = (uint32_t)len;
            if (!io_all(sock, &l32, 4, true) || !io_all(sock, (void *)blob, len, true))
                break;
            if (strcmp(c.tls, "tcp") == 0)
                raw_target_open(&rt, region);
            uint32_t al = (uint32_t)rt.addr_len, rl = (uint32_t)rt.rkey_len;
            uint64_t base = (uintptr_t)region;
            if (!io_all(sock, &al, 4, true) || !io_all(sock, &rl, 4, true) ||
                !io_all(sock, &base, 8, true) || (al && !io_all(sock, rt.addr, al, true)) ||
                (rl && !io_all(sock, rt.rkey, rl, true)))
                break;
        } else if (c.op == 2 && x) {
            raw_target_close(&rt);
            x->ops->close(x, true);
            x = NULL;
            uint32_t ok = 0;
            io_all(sock, &ok, 4, true);
        }
    }
    raw_target_close(&rt);
    if (x)
        x->ops->close(x, true);
    _exit(0);
}

/* -------------------------------------------------------- raw baseline */

typedef struct raw {
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    uint64_t rbase;
} raw_t;

static void raw_cfg_set(const char *k, const char *v, void *arg)
{
    /* The raw ceiling is UCX's own put, emulated where UCX emulates it (tcp);
     * kvpeer switches emulation off for its direct puts (issue 30). */
    if (strcmp(k, "PROTO_EMULATION_ENABLE") == 0)
        return;
    if (kvp__ucx_config_modify(arg, k, v) != UCS_OK)
        die("ucp_config_modify");
}

typedef struct raw_peer { /* the bare tcp target's (tcp path only) */
    uint8_t addr[4096], rkey[4096];
    uint32_t addr_len, rkey_len;
    uint64_t base;
} raw_peer_t;

static void raw_open(raw_t *r, const char *tls, const void *blob, size_t len, const raw_peer_t *rp)
{
    kvp_ucx_blob_parts_t bp;
    kvp_ucx_config_t cfg;
    ucp_config_t *c;

    if (kvp_ucx_blob_parse(blob, len, &bp) != KVP_OK)
        die("blob");
    kvp_ucx_config_default(&cfg);
    cfg.tls = tls[0] ? tls : NULL;
    if (ucp_config_read(NULL, NULL, &c) != UCS_OK)
        die("ucp_config_read");
    kvp_ucx_config_each(&cfg, raw_cfg_set, c); /* UCX configured exactly as ours */
    if (rp->addr_len && ucp_config_modify(c, "TLS", "tcp") != UCS_OK)
        die("raw TLS"); /* to the bare tcp target (its RMA context is ours' AM one's twin) */
    ucp_params_t prm = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_RMA};
    if (ucp_init(&prm, c, &r->ctx) != UCS_OK)
        die("ucp_init");
    ucp_config_release(c);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if (ucp_worker_create(r->ctx, &wp, &r->worker) != UCS_OK)
        die("ucp_worker_create");
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                          .address = rp->addr_len ? (const ucp_address_t *)rp->addr
                                                  : bp.rma_worker_addr, /* puts: RMA worker */
                          .err_mode = UCP_ERR_HANDLING_MODE_PEER};
    if (ucp_ep_create(r->worker, &ep, &r->ep) != UCS_OK)
        die("ucp_ep_create");
    if (ucp_ep_rkey_unpack(r->ep, rp->addr_len ? rp->rkey : bp.rkey, &r->rkey) != UCS_OK)
        die("rkey_unpack");
    r->rbase = rp->addr_len ? rp->base : bp.region_base;
}

static void raw_wait(raw_t *r, void *req)
{
    if (UCS_PTR_IS_ERR(req))
        die("raw put/flush failed");
    if (!req)
        return;
    while (ucp_request_check_status(req) == UCS_INPROGRESS)
        ucp_worker_progress(r->worker);
    if (ucp_request_check_status(req) != UCS_OK)
        die("raw request failed");
    ucp_request_free(req);
}

static void raw_close(raw_t *r)
{
    ucp_rkey_destroy(r->rkey);
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *req = ucp_ep_close_nbx(r->ep, &prm);
    if (UCS_PTR_IS_PTR(req)) {
        while (ucp_request_check_status(req) == UCS_INPROGRESS)
            ucp_worker_progress(r->worker);
        ucp_request_free(req);
    }
    ucp_worker_destroy(r->worker);
    ucp_cleanup(r->ctx);
}

/* --------------------------------------------------------- the loops */

#define SLOT (16u << 10)

/* Block k (of size bs): source blocks cycle in order; destination blocks
 * follow a stride-7 permutation (never adjacent -> one put per block in both
 * ours and raw). In 16 KiB slots. */
static inline uint32_t blk_src(uint64_t k, uint32_t nbb)
{
    return (uint32_t)(k % nbb);
}

static inline uint32_t blk_dst(uint64_t k, uint32_t nbb)
{
    return (uint32_t)((k * 7) % nbb);
}

static kvp_xfer_block_t g_blocks[64 * (4u << 20) / SLOT];
static uint32_t g_slot = SLOT; /* slot size the regions of the current path are registered with */

/* One batch of ours: blocks k..k+d-1 in one write, wait until DONE. */
static void batch_ours(kvp_xport_t *x, kvp_xpeer_id_t peer, uint32_t bs, uint32_t d, uint64_t k)
{
    uint32_t nbb = (uint32_t)(O.region / bs), per = bs / g_slot;
    kvp_xfer_id_t id;
    kvp_xfer_result_t res;
    size_t n = 0, nblk = 0;

    for (uint32_t i = 0; i < d; i++, k++)
        for (uint32_t j = 0; j < per; j++)
            g_blocks[nblk++] =
                (kvp_xfer_block_t){blk_src(k, nbb) * per + j, 0, blk_dst(k, nbb) * per + j, 0};
    if (x->ops->write(x, peer, g_blocks, nblk, &id) != KVP_OK)
        die("write");
    while (x->ops->poll(x, peer, &res, 1, &n) == KVP_OK && n == 0) {
        if (x->ops->pump != NULL)
            x->ops->pump(x); /* as a node round: a big direct-cma write's next slice */
        x->ops->progress(x);
    }
    if (n != 1 || res.id != id || res.status != KVP_OK)
        die("transfer failed");
}

/* One batch of raw: the same d puts with bare UCX, one flush, wait. */
static void batch_raw(raw_t *r, const uint8_t *src, uint32_t bs, uint32_t d, uint64_t k)
{
    uint32_t nbb = (uint32_t)(O.region / bs);
    ucp_request_param_t prm = {.op_attr_mask = 0};

    for (uint32_t i = 0; i < d; i++, k++) {
        void *req = ucp_put_nbx(r->ep, src + (size_t)blk_src(k, nbb) * bs, bs,
                                r->rbase + (uint64_t)blk_dst(k, nbb) * bs, r->rkey, &prm);
        if (UCS_PTR_IS_ERR(req))
            die("raw put");
        if (req)
            ucp_request_free(req); /* completion is covered by the flush */
    }
    raw_wait(r, ucp_ep_flush_nbx(r->ep, &prm));
}

/* Ours and raw batch by batch, each timed separately, so both see the same
 * machine load (this VM is shared and noisy). Their cursors sit half a
 * region apart so neither reads what the other just left in cache.
 * secs == 0: exactly one pass over the region each (warm-up). */
typedef struct pair_res {
    double ours, raw, legacy;             /* GB/s on the wall clock */
    double ours_cpu, raw_cpu, legacy_cpu; /* GB/s per second of producer-thread CPU */
} pair_res_t;

/* xl (may be NULL): ours with legacy_put, i.e. the pre-issue-14 backend
 * (ucp_put_nbx everywhere; UCX emulates it over AM on tcp). */
static void run_pair(kvp_xport_t *x, kvp_xpeer_id_t peer, kvp_xport_t *xl, kvp_xpeer_id_t lpeer,
                     raw_t *r, const uint8_t *src, uint32_t bs, uint32_t d, double secs,
                     pair_res_t *res)
{
    uint32_t nbb = (uint32_t)(O.region / bs);
    int nside = xl ? 3 : 2;
    uint64_t k[3] = {0, nbb / 2, nbb / 4}, bytes = 0;
    double t[3] = {0}, c[3] = {0}, t0 = now_s();

    for (uint64_t it = 0;; it++) {
        /* rotate who goes first: no systematic order bias */
        for (int j = 0; j < nside; j++) {
            int side = (int)((it + (uint64_t)j) % (uint64_t)nside);
            double a = now_s(), ca = cpu_s();
            if (side == 0)
                batch_ours(x, peer, bs, d, k[0]);
            else if (side == 1)
                batch_raw(r, src, bs, d, k[1]);
            else
                batch_ours(xl, lpeer, bs, d, k[2]);
            t[side] += now_s() - a;
            c[side] += cpu_s() - ca;
        }
        for (int j = 0; j < 3; j++)
            k[j] += d;
        bytes += (uint64_t)d * bs;
        if (secs > 0 ? now_s() - t0 >= 2 * secs : k[0] >= nbb)
            break;
    }
    res->ours = (double)bytes / t[0] / 1e9;
    res->raw = (double)bytes / t[1] / 1e9;
    res->ours_cpu = (double)bytes / c[0] / 1e9;
    res->raw_cpu = (double)bytes / c[1] / 1e9;
    res->legacy = xl ? (double)bytes / t[2] / 1e9 : 0;
    res->legacy_cpu = xl ? (double)bytes / c[2] / 1e9 : 0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_d);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* ---------------------------------------------------------- perftest */

static double perftest(const char *tls, size_t size, int outstanding)
{
    double gbps = -1;
    char port[16], sz[32], iters[32], warm[32], out[32], line[512];
    double budget = (tls[0] ? 0.4e9 : 2e9) * (O.quick ? 0.25 : 1);
    long n = (long)(budget / (double)size);

    snprintf(port, sizeof(port), "%d", 20000 + (int)(getpid() % 20000));
    snprintf(sz, sizeof(sz), "%zu", size);
    snprintf(iters, sizeof(iters), "%ld", n < 50 ? 50 : n);
    snprintf(warm, sizeof(warm), "%ld", n / 10 + 5);
    snprintf(out, sizeof(out), "%d", outstanding);
    fflush(stdout);
    pid_t srv = fork();
    if (srv == 0) {
        if (tls[0])
            setenv("UCX_TLS", tls, 1);
        freopen("/dev/null", "w", stdout);
        freopen("/dev/null", "w", stderr);
        execlp("ucx_perftest", "ucx_perftest", "-p", port, (char *)NULL);
        _exit(127);
    }
    struct timespec ts = {0, 300000000};
    nanosleep(&ts, NULL);
    char cmd[512];
    snprintf(
        cmd, sizeof(cmd),
        "%s%s ucx_perftest 127.0.0.1 -p %s -t ucp_put_bw -s %s -n %s -w %s -O %s -f 2>/dev/null",
        tls[0] ? "UCX_TLS=" : "", tls, port, sz, iters, warm, out);
    FILE *p = popen(cmd, "r");
    while (p && fgets(line, sizeof(line), p)) {
        double it, p50, avg, ov, bw_avg, bw_ov;
        char *f = strstr(line, "Final:"); /* with -f: the bare numbers row */
        f = f ? f + 6 : line;
        if (sscanf(f, "%lf %lf %lf %lf %lf %lf", &it, &p50, &avg, &ov, &bw_avg, &bw_ov) == 6)
            gbps = bw_ov * 1048576.0 / 1e9; /* perftest "MB/s" are MiB/s */
    }
    if (p)
        pclose(p);
    kill(srv, SIGTERM);
    waitpid(srv, NULL, 0);
    return gbps;
}

/* Single-thread memcpy with the same slot cycling over two regions of the
 * same size (touched once before timing, like the UCX regions). */
static void cold_memcpy_all(const uint32_t *sizes, int ns)
{
    uint8_t *a = malloc(O.region), *b = malloc(O.region);

    if (!a || !b)
        die("malloc");
    memset(a, 1, O.region);
    memset(b, 2, O.region);
    __asm__ volatile("" : : "r"(a), "r"(b) : "memory"); /* keep the first-touch stores */
    for (int si = 0; si < ns; si++) {
        uint32_t bs = sizes[si], nbb = (uint32_t)(O.region / bs);
        uint64_t k = 0, bytes = 0;
        double t0 = now_s(), t;
        do {
            for (int i = 0; i < 16; i++, k++)
                memcpy(b + (size_t)blk_dst(k, nbb) * bs, a + (size_t)blk_src(k, nbb) * bs, bs);
            bytes += 16ull * bs;
            t = now_s();
        } while (t - t0 < O.secs);
        printf("mem  %5u KiB         single-thread cold memcpy %7.2f GB/s\n", bs / 1024,
               (double)bytes / (t - t0) / 1e9);
    }
    free(a);
    free(b);
}

/* ------------------------------------------------------------ driver */

static void bench_path(int sock, const char *path, const char *tls, const uint32_t *sizes, int ns,
                       const uint32_t *depths, int nd, uint32_t slot)
{
    cmd_t c = {.op = 1, .block_size = slot};
    uint8_t blob[KVP_UCX_BLOB_MAX];
    uint32_t len = 0;
    void *src, *lsrc;
    kvp_xpeer_id_t peer, lpeer = 0;
    raw_t raw;
    kvp_layout_t lay = {(uint32_t)(O.region / slot), slot};

    g_slot = slot;

    snprintf(c.tls, sizeof(c.tls), "%s", tls);
    static raw_peer_t rp;
    if (!io_all(sock, &c, sizeof(c), true) || !io_all(sock, &len, 4, false) || len > sizeof(blob) ||
        !io_all(sock, blob, len, false) || !io_all(sock, &rp.addr_len, 4, false) ||
        !io_all(sock, &rp.rkey_len, 4, false) || !io_all(sock, &rp.base, 8, false) ||
        rp.addr_len > sizeof(rp.addr) || rp.rkey_len > sizeof(rp.rkey) ||
        (rp.addr_len && !io_all(sock, rp.addr, rp.addr_len, false)) ||
        (rp.rkey_len && !io_all(sock, rp.rkey, rp.rkey_len, false)))
        die("target setup");
    kvp_xport_t *x = make_xport(tls, slot, &src, "producer", false);
    if (x->ops->add_peer(x, blob, len, &lay, &peer) != KVP_OK)
        die("add_peer");
    kvp_xport_t *xl = NULL; /* the old emulated put, only where ours is not a put */
    if (x->ops->peer_path(x, peer) != KVP_PATH_DIRECT_SHM) {
        xl = make_xport(tls, slot, &lsrc, "legacy", true);
        if (xl->ops->add_peer(xl, blob, len, &lay, &lpeer) != KVP_OK)
            die("add_peer (legacy)");
    }
    char lanes[192];
    kvp_ucx_peer_lanes(x, peer, lanes, sizeof(lanes));
    raw_open(&raw, tls, blob, len, &rp);
    double t0 = now_s(); /* one pass each: our mapping and raw's mapping of the target */
    pair_res_t w;
    run_pair(x, peer, xl, lpeer, &raw, src, KVP_MAX(2u << 20, slot), 64, 0, &w);
    fprintf(stderr, "  [%s: warm-up passes %.1f s (first touch: ours %.2f GB/s, raw %.2f GB/s)]\n",
            path, now_s() - t0, w.ours, w.raw);
    for (int si = 0; si < ns; si++)
        for (int di = 0; di < nd; di++) {
            double o[16], rw[16], oc[16], rc[16], lg[16], lgc[16];
            uint32_t bs = sizes[si], d = depths[di];
            for (int r = 0; r < O.reps; r++) {
                pair_res_t pr;
                run_pair(x, peer, xl, lpeer, &raw, src, bs, d, O.secs, &pr);
                o[r] = pr.ours, rw[r] = pr.raw, oc[r] = pr.ours_cpu, rc[r] = pr.raw_cpu;
                lg[r] = pr.legacy, lgc[r] = pr.legacy_cpu;
            }
            double mo = median(o, O.reps), mr = median(rw, O.reps);
            double moc = median(oc, O.reps), mrc = median(rc, O.reps);
            printf("%-4s %5u KiB  D=%-3u  ours %6.2f GB/s  raw %6.2f GB/s  ours/raw %.3f  |  "
                   "per CPU-s: ours %6.2f raw %6.2f ratio %.3f  [%s]\n",
                   path, bs / 1024, d, mo, mr, mo / mr, moc, mrc, moc / mrc,
                   kvp_data_path_str(x->ops->peer_path(x, peer)));
            if (xl) {
                double ml = median(lg, O.reps), mlc = median(lgc, O.reps);
                printf("%-4s %5u KiB  D=%-3u  old emulated put (ours, legacy_put) %6.2f GB/s  "
                       "ours(am)/old %.3f  |  per CPU-s: old %6.2f ours/old %.3f\n",
                       path, bs / 1024, d, ml, mo / ml, mlc, moc / mlc);
            }
            fflush(stdout);
        }
    printf("%-4s lanes: %s\n", path, lanes);
    raw_close(&raw);
    x->ops->remove_peer(x, peer);
    x->ops->close(x, true);
    if (xl) {
        xl->ops->remove_peer(xl, lpeer);
        xl->ops->close(xl, true);
    }
    c.op = 2;
    if (!io_all(sock, &c, sizeof(c), true) || !io_all(sock, &len, 4, false))
        die("target teardown");
}

static void parse(int argc, char **argv)
{
    static const struct option lo[] = {
        {"quick", 0, 0, 'q'}, {"region-mib", 1, 0, 'r'},  {"reps", 1, 0, 'n'}, {"secs", 1, 0, 's'},
        {"path", 1, 0, 'p'},  {"no-perftest", 0, 0, 'P'}, {"sizes", 1, 0, 'z'}, {0, 0, 0, 0}};
    int ch;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'q':
            O.quick = true;
            O.region = 128ull << 20;
            O.reps = 3;
            O.secs = 0.1;
            break;
        case 'r':
            O.region = strtoull(optarg, NULL, 10) << 20;
            break;
        case 'n':
            O.reps = atoi(optarg);
            break;
        case 's':
            O.secs = atof(optarg);
            break;
        case 'p':
            O.shm = !strcmp(optarg, "shm") || !strcmp(optarg, "both");
            O.tcp = !strcmp(optarg, "tcp") || !strcmp(optarg, "both");
            break;
        case 'P':
            O.perftest = false;
            break;
        case 'z': {
            char *s = optarg, *end;
            O.nsizes = 0;
            while (*s && O.nsizes < 8) {
                unsigned long kib = strtoul(s, &end, 10);
                if (end == s || kib < 16 || kib % 16 || kib > 4096)
                    die("bad --sizes (KiB, multiples of 16, 16..4096)");
                O.sizes[O.nsizes++] = (uint32_t)kib << 10;
                s = *end == ',' ? end + 1 : end;
            }
            break;
        }
        default:
            die("usage: ucx_bench [--quick] [--region-mib N] [--reps N] [--secs S] "
                "[--path shm|tcp|both] [--no-perftest] [--sizes KiB,..]");
        }
    }
    if (O.reps < 1 || O.reps > 16 || O.region < (4ull << 20) || O.region % (2u << 20))
        die("bad --reps (1..16) or --region-mib (>= 4, even)");
}

int main(int argc, char **argv)
{
    static const uint32_t depths_full[] = {1, 16, 64}, depths_quick[] = {16};
    const uint32_t *depths = depths_full;
    int nd = 3, sv[2];

    parse(argc, argv);
    if (O.quick) {
        depths = depths_quick;
        nd = 1;
    }
    if (!getenv("UCX_NET_DEVICES"))
        setenv("UCX_NET_DEVICES", "lo", 1); /* tcp on loopback only */
    if (getenv("UCX_TLS"))
        fprintf(stderr, "note: UCX_TLS=%s from the environment applies to the shm rows too\n",
                getenv("UCX_TLS"));
    kvp_log_set_level(KVP_LOG_WARN);
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        die("socketpair");
    pid_t pid = fork(); /* before any UCX thread exists */
    if (pid == 0) {
        close(sv[0]);
        target_main(sv[1]);
    }
    close(sv[1]);
    printf("ucx_bench: UCX %s, region %zu MiB per side, %d reps of %.2f s each for ours and raw "
           "(interleaved per batch), batch = D blocks -> one write/flush, destinations "
           "stride-permuted\n",
           ucp_get_version_string(), O.region >> 20, O.reps, O.secs);
    const struct {
        const char *name, *tls;
        bool on;
    } paths[] = {{"shm", "", O.shm}, {"tcp", "tcp", O.tcp}};
    for (int pi = 0; pi < 2; pi++) {
        if (!paths[pi].on)
            continue;
        if (pi == 0) { /* shm: 16 KiB slots, bigger blocks are coalesced runs */
            bench_path(sv[0], paths[pi].name, paths[pi].tls, O.sizes, O.nsizes, depths, nd, SLOT);
            continue;
        }
        /* tcp (AM path, one message per slot): slots of the block size, as a
         * node registers them */
        for (int si = 0; si < O.nsizes; si++)
            bench_path(sv[0], paths[pi].name, paths[pi].tls, &O.sizes[si], 1, depths, nd,
                       O.sizes[si]);
    }
    cmd_t c = {.op = 3};
    io_all(sv[0], &c, sizeof(c), true);
    waitpid(pid, NULL, 0);
    for (int pi = 0; O.perftest && pi < 2; pi++) {
        if (!paths[pi].on)
            continue;
        for (int si = 0; si < O.nsizes; si++)
            for (int oi = 0; oi < (O.quick ? 1 : 2); oi++) {
                int outst = oi ? 64 : 16;
                printf("%-4s %5u KiB  O=%-3d  ucx_perftest ucp_put_bw %7.2f GB/s%s\n",
                       paths[pi].name, O.sizes[si] / 1024, outst,
                       perftest(paths[pi].tls, O.sizes[si], outst),
                       pi == 0 ? "  (reuses one cached buffer)" : "");
                fflush(stdout);
            }
    }
    cold_memcpy_all(O.sizes, O.nsizes);
    return 0;
}
