/*
 * kvpeer_bench.c -- `kvpeer bench`: end-to-end fetch throughput between
 * kvpeerd processes on 127.0.0.1, per data path (shared memory; tcp via
 * UCX_TLS=tcp in the daemons' environment), block size, and checksum
 * verification on/off, against the ceilings of kvpeer_bench_ceil.c.
 *
 * Per (path, block size) one source A and two consumers run at once: B
 * verifies checksums, C does not; each run puts a fresh key range on A
 * (slot cycling: every region is larger than the LLC unless shrunk) and the
 * two consumers fetch it in alternating order, so drift hits both alike.
 * Throughput = bytes committed / the daemon-measured fetch time (FETCH sent
 * -> load event, lookup excluded); medians over the runs.
 */
#include "kvpeer_bench.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *g_bench_help =
    "usage: kvpeer bench [flags]\n"
    "End-to-end fetch throughput between two kvpeerd processes (16 KiB, 256 KiB,\n"
    "2 MiB blocks; checksums on and off; shared-memory and tcp paths) next to the\n"
    "raw UCX ceiling (bench/transport/ucx_bench, if built), ucx_perftest\n"
    "ucp_put_bw and single-core cold memcpy; lookup round trip p50/p99 (64 keys)\n"
    "and session set-up time. Alternating runs, medians, ratios. Writes\n"
    "bench.csv and bench.png (gnuplot) to --out.\n"
    "\n"
    "  --quick            small regions, 3 runs, short budgets (< 60 s)\n"
    "  --region SIZE      bytes per node region (default 1G > the LLC; quick 64M)\n"
    "  --sizes LIST       block sizes (default 16K,256K,2M)\n"
    "  --runs N           alternating runs per series (default 3)\n"
    "  --run-secs S       time budget of one e2e run (default 4; quick 0.4)\n"
    "  --request SIZE     bytes per fetch request (default 32M; quick 4M)\n"
    "  --path shm|tcp|both  data paths (default both)\n"
    "  --no-perftest      skip ucx_perftest\n"
    "  --no-raw           skip the raw UCX ceiling (ucx_bench)\n"
    "  --no-plot          CSV only\n"
    "  --kvpeerd PATH     daemon binary (default: next to kvpeer, then PATH)\n"
    "  --out DIR          output directory (default build/bench-out)\n"
    "  --help             this text\n";

static int bench_bad(const char *what, const char *arg)
{
    fprintf(stderr, "kvpeer bench: %s '%s'\ntry 'kvpeer bench --help'\n", what, arg);
    return CLI_EXIT_USAGE;
}

static int parse_sizes(const char *s, bench_opts_t *o)
{
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", s);
    o->nsizes = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        uint64_t v;
        if (o->nsizes >= BENCH_MAX_SIZES || cli_parse_size(t, &v) != 0 || v < 4096 ||
            v > (64u << 20) || v % 4096)
            return -1;
        o->sizes[o->nsizes++] = (uint32_t)v;
    }
    return o->nsizes > 0 ? 0 : -1;
}

static void bench_defaults(bench_opts_t *o)
{
    memset(o, 0, sizeof(*o));
    o->shm = o->tcp = o->perftest = o->raw = o->plot = true;
    o->sizes[0] = 16 << 10;
    o->sizes[1] = 256 << 10;
    o->sizes[2] = 2 << 20;
    o->nsizes = 3;
    o->runs = 3;
    o->request_bytes = 32ull << 20;
    snprintf(o->out, sizeof(o->out), "build/bench-out");
}

static int bench_parse(int argc, char **argv, bench_opts_t *o)
{
    static const struct option opts[] = {
        {"help", no_argument, NULL, 'h'},       {"quick", no_argument, NULL, 'q'},
        {"region", required_argument, NULL, 'r'}, {"sizes", required_argument, NULL, 's'},
        {"runs", required_argument, NULL, 'n'}, {"run-secs", required_argument, NULL, 'S'},
        {"request", required_argument, NULL, 'R'}, {"path", required_argument, NULL, 'p'},
        {"no-perftest", no_argument, NULL, 'P'}, {"no-raw", no_argument, NULL, 'W'},
        {"no-plot", no_argument, NULL, 'G'},    {"kvpeerd", required_argument, NULL, 'k'},
        {"out", required_argument, NULL, 'o'},  {0}};
    const char *kvpeerd = NULL;
    uint64_t region = 0;
    double secs = 0;
    bool req_given = false;
    int c;
    bench_defaults(o);
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
        char *end = NULL;
        switch (c) {
        case 'h': fputs(g_bench_help, stdout); return CLI_EXIT_OK;
        case 'q': o->quick = true; break;
        case 'r':
            if (cli_parse_size(optarg, &region) != 0 || region < (4u << 20))
                return bench_bad("bad --region (>= 4M)", optarg);
            break;
        case 's':
            if (parse_sizes(optarg, o) != 0)
                return bench_bad("bad --sizes (<= 4 sizes, 4K..64M, multiples of 4K)", optarg);
            break;
        case 'n':
            o->runs = (int)strtol(optarg, &end, 10);
            if (*end || o->runs < 1 || o->runs > BENCH_MAX_RUNS)
                return bench_bad("bad --runs (1..15)", optarg);
            break;
        case 'S':
            secs = strtod(optarg, &end);
            if (*end || secs <= 0 || secs > 600)
                return bench_bad("bad --run-secs", optarg);
            break;
        case 'R':
            req_given = true;
            if (cli_parse_size(optarg, &o->request_bytes) != 0 || o->request_bytes < 4096)
                return bench_bad("bad --request", optarg);
            break;
        case 'p':
            o->shm = !strcmp(optarg, "shm") || !strcmp(optarg, "both");
            o->tcp = !strcmp(optarg, "tcp") || !strcmp(optarg, "both");
            if (!o->shm && !o->tcp)
                return bench_bad("bad --path (shm|tcp|both)", optarg);
            break;
        case 'P': o->perftest = false; break;
        case 'W': o->raw = false; break;
        case 'G': o->plot = false; break;
        case 'k': kvpeerd = optarg; break;
        case 'o': snprintf(o->out, sizeof(o->out), "%s", optarg); break;
        default: return bench_bad("unknown or incomplete flag", argv[optind - 1]);
        }
    }
    if (optind < argc)
        return bench_bad("unexpected argument", argv[optind]);
    o->region = region ? region : o->quick ? (64ull << 20) : (1ull << 30);
    o->run_secs = secs > 0 ? secs : o->quick ? 0.4 : 4.0;
    if (o->quick && !req_given)
        o->request_bytes = 4ull << 20;
    o->lookups = o->quick ? 100 : 400;
    o->setups = o->quick ? 3 : 7;
    cli_find_kvpeerd(kvpeerd, o->kvpeerd, sizeof(o->kvpeerd));
    return -1;
}

/* ------------------------------------------------------------ daemons */

enum { BN_A = 0, BN_ON = 1, BN_OFF = 2, BN_NODES = 3 };

typedef struct bench_node {
    int ctl_port, http_port;
    char ctl[32], http[32];
    pid_t pid;
} bench_node_t;

typedef struct bench_group {
    bench_node_t n[BN_NODES];
    uint32_t bs, slots;
    const char *path;
    char log[PATH_MAX + 32];
} bench_group_t;

static int group_start_node(bench_group_t *g, const bench_opts_t *o, int i)
{
    static char a[16][PATH_MAX + 32], token[PATH_MAX];
    char *argv[17];
    int k = 0;
    /* the daemons' admin token (issue 27), next to their logs */
    if (token[0] == '\0' && cli_admin_token_make(o->out, token, sizeof(token)) != 0) {
        fprintf(stderr, "kvpeer bench: cannot write %s/admin.token: %s\n", o->out, strerror(errno));
        token[0] = '\0';
        return -1;
    }
    snprintf(a[k++], sizeof(a[0]), "%s", o->kvpeerd);
    snprintf(a[k++], sizeof(a[0]), "--listen=%s", g->n[i].ctl);
    snprintf(a[k++], sizeof(a[0]), "--http=%s", g->n[i].http);
    snprintf(a[k++], sizeof(a[0]), "--admin");
    snprintf(a[k++], sizeof(a[0]), "--admin-token-file=%s", token);
    snprintf(a[k++], sizeof(a[0]), "--name=%s", i == BN_A ? "src" : i == BN_ON ? "cks-on" : "cks-off");
    snprintf(a[k++], sizeof(a[0]), "--num-blocks=%u", g->slots);
    snprintf(a[k++], sizeof(a[0]), "--block-size=%u", g->bs);
    snprintf(a[k++], sizeof(a[0]), "--verify-checksums=%d", i == BN_OFF ? 0 : 1);
    snprintf(a[k++], sizeof(a[0]), "--log-level=warn");
    snprintf(a[k++], sizeof(a[0]), "--max-inflight-bytes-per-peer=%llu",
             (unsigned long long)(o->request_bytes * 2));
    if (i != BN_A)
        snprintf(a[k++], sizeof(a[0]), "--peers=%s", g->n[BN_A].ctl);
    for (int j = 0; j < k; j++)
        argv[j] = a[j];
    argv[k] = NULL;
    char *env_tcp[] = {"UCX_TLS=tcp", NULL};
    g->n[i].pid = cli_spawn(argv, strcmp(g->path, "tcp") ? NULL : env_tcp, g->log);
    return g->n[i].pid > 0 ? 0 : -1;
}

static int wait_ok(const char *http, const char *path, const char *want, int ms)
{
    uint64_t deadline = cli_now_ns() + (uint64_t)ms * 1000000ull;
    char err[256], *body = NULL;
    while (cli_now_ns() < deadline) {
        if (cli_http_call(http, "GET", path, 1000, &body, err, sizeof(err)) == 0) {
            bool ok = want == NULL || strstr(body, want) != NULL;
            free(body);
            if (ok)
                return 0;
        }
        cli_sleep_ms(5);
    }
    return -1;
}

static void group_stop(bench_group_t *g)
{
    for (int i = 0; i < BN_NODES; i++)
        if (g->n[i].pid > 0)
            kill(g->n[i].pid, SIGTERM);
    for (int i = 0; i < BN_NODES; i++) {
        if (g->n[i].pid > 0 && cli_wait(g->n[i].pid, 15000, NULL) != 1)
            cli_kill_reap(g->n[i].pid);
        g->n[i].pid = -1;
    }
}

static int group_start(bench_group_t *g, const bench_opts_t *o, const char *path, uint32_t bs)
{
    memset(g, 0, sizeof(*g));
    g->bs = bs;
    g->path = path;
    g->slots = (uint32_t)(o->region / bs);
    snprintf(g->log, sizeof(g->log), "%s/kvpeerd-%s-%uk.log", o->out, path, bs / 1024);
    unlink(g->log);
    for (int i = 0; i < BN_NODES; i++) {
        g->n[i].ctl_port = cli_free_port();
        g->n[i].http_port = cli_free_port();
        snprintf(g->n[i].ctl, sizeof(g->n[i].ctl), "127.0.0.1:%d", g->n[i].ctl_port);
        snprintf(g->n[i].http, sizeof(g->n[i].http), "127.0.0.1:%d", g->n[i].http_port);
    }
    char want[64];
    snprintf(want, sizeof(want), "peer=%s ", g->n[BN_A].ctl);
    for (int i = 0; i < BN_NODES; i++) /* start all three, then wait: start-up overlaps */
        if (group_start_node(g, o, i) != 0)
            goto fail;
    for (int i = 0; i < BN_NODES; i++)
        if (wait_ok(g->n[i].http, "/healthz", NULL, 30000) != 0)
            goto fail;
    for (int i = BN_ON; i < BN_NODES; i++)
        if (wait_ok(g->n[i].http, "/peers", "ready=1", 30000) != 0)
            goto fail;
    return 0;
fail:
    fprintf(stderr, "kvpeer bench: %s %u KiB: daemons did not come up; log %s\n", path, bs / 1024,
            g->log);
    group_stop(g);
    return -1;
}

/* ------------------------------------------------------------ e2e runs */

static int admin_post(const char *http, const char *path, char **body)
{
    char err[256];
    if (cli_http_call(http, "POST", path, 600000, body, err, sizeof(err)) != 0) {
        fprintf(stderr, "kvpeer bench: %s\n", err);
        return -1;
    }
    return 0;
}

/* One run of consumer i over keys [first, first + n). With `put` set the
 * run puts each request's keys on the source just before fetching them
 * (outside the measured time) and stops at the run's time budget; *covered
 * returns how many keys it got to, so the other consumer fetches exactly
 * those. Returns GB/s, or -1. */
static double e2e_run(const bench_opts_t *o, bench_group_t *g, int i, uint32_t first, uint32_t n,
                      bool put, double budget_s, uint64_t req, uint32_t *covered)
{
    uint32_t per = (uint32_t)(o->request_bytes / g->bs);
    double fetch_s = 0, bytes = 0;
    uint64_t t_end = cli_now_ns() + (uint64_t)(budget_s * 1e9);
    uint32_t at = 0;
    per = per < 1 ? 1 : per > 65536 ? 65536 : per;
    for (; at < n && (budget_s <= 0 || cli_now_ns() < t_end); at += per, req++) {
        uint32_t cnt = n - at < per ? n - at : per;
        char path[256], *body = NULL, *b2 = NULL;
        uint64_t ok = 0, us = 0;
        snprintf(path, sizeof(path), "/admin/put?first=%u&count=%u", first + at, cnt);
        if (put && admin_post(g->n[BN_A].http, path, &body) != 0)
            return -1;
        free(body);
        body = NULL;
        snprintf(path, sizeof(path), "/admin/fetch?peer=%s&first=%u&count=%u&request=%llu",
                 g->n[BN_A].ctl, first + at, cnt, (unsigned long long)req);
        if (admin_post(g->n[i].http, path, &body) != 0)
            return -1;
        char codes[16] = "";
        cli_kv(body, "status_code", codes, sizeof(codes));
        cli_kv_u64(body, "n_ok", &ok);
        cli_kv_u64(body, "fetch_us", &us);
        if (strtol(codes, NULL, 10) != 0 || ok != cnt)
            fprintf(stderr, "kvpeer bench: fetch %u+%u: %s", first + at, cnt, body);
        free(body);
        snprintf(path, sizeof(path), "/admin/finish?request=%llu", (unsigned long long)req);
        if (admin_post(g->n[i].http, path, &b2) == 0)
            free(b2);
        fetch_s += (double)us / 1e6;
        bytes += (double)ok * g->bs;
    }
    *covered = at < n ? at : n;
    return fetch_s > 0 ? bytes / fetch_s / 1e9 : -1;
}

static void data_path_of(const bench_group_t *g, char *out, size_t cap)
{
    char err[256], *body = NULL;
    snprintf(out, cap, "?");
    if (cli_http_call(g->n[BN_ON].http, "GET", "/peers", 2000, &body, err, sizeof(err)) == 0) {
        cli_kv(body, "path", out, cap);
        free(body);
    }
}

/* First pass over the whole region, per consumer: every destination page is
 * touched for the first time (page faults in the consumer and in the source's
 * mapping of the consumer's segment). Reported as its own series, because
 * on this VM a first touch costs tens of microseconds per page and would
 * otherwise dominate the steady-state figure. */
static void e2e_cold(const bench_opts_t *o, bench_group_t *g, bench_table_t *t)
{
    bench_row_t *on = bench_row_add(t, "e2e-cold", g->path, "on", g->bs);
    bench_row_t *off = bench_row_add(t, "e2e-cold", g->path, "off", g->bs);
    uint32_t covered = g->slots;
    if (on == NULL || off == NULL)
        return;
    double v = e2e_run(o, g, BN_ON, 0, covered, true, 0, 1000000, &covered);
    if (v > 0)
        on->v[on->n++] = on->median = v;
    v = e2e_run(o, g, BN_OFF, 0, covered, false, 0, 2000000, &covered);
    if (v > 0)
        off->v[off->n++] = off->median = v;
    snprintf(on->note, sizeof(on->note), "first touch of the %u MiB region",
             (unsigned)((uint64_t)g->slots * g->bs >> 20));
    snprintf(off->note, sizeof(off->note), "%s", on->note);
}

/* Steady state: runs alternate the consumers' order; each run uses a fresh
 * key range, so both regions cycle (LRU eviction) over pages already
 * touched, instead of re-reading hot slots. */
static void e2e_group(const bench_opts_t *o, bench_group_t *g, bench_table_t *t)
{
    bench_row_t *on = bench_row_add(t, "e2e", g->path, "on", g->bs);
    bench_row_t *off = bench_row_add(t, "e2e", g->path, "off", g->bs);
    uint32_t per = (uint32_t)(o->request_bytes / g->bs), n = g->slots;
    double moved = 0;
    if (on == NULL || off == NULL)
        return;
    for (int r = 0; r < o->runs; r++) {
        uint32_t first = (uint32_t)(r + 1) * n, covered = n;
        for (int k = 0; k < 2; k++) {
            int node = (r + k) % 2 ? BN_OFF : BN_ON;
            bench_row_t *row = node == BN_ON ? on : off;
            uint64_t req = 10000000ull * (uint64_t)(r + 1) + (uint64_t)k * 1000000;
            double v = e2e_run(o, g, node, first, covered, k == 0, k == 0 ? o->run_secs : 0,
                               req, &covered);
            if (v > 0)
                row->v[row->n++] = v;
        }
        moved += (double)covered * g->bs;
    }
    char dp[32];
    data_path_of(g, dp, sizeof(dp));
    on->median = bench_median(on->v, on->n);
    off->median = bench_median(off->v, off->n);
    snprintf(on->note, sizeof(on->note), "path %s, %.0f MiB/run, %u blocks/req", dp,
             moved / o->runs / 1048576.0, per);
    snprintf(off->note, sizeof(off->note), "%s", on->note);
}

/* Lookup round trips of 64 keys the source does not hold (answered MISS:
 * nothing is fetched), measured by the consumer daemon (lookup_us). */
static void lookup_rtt(const bench_opts_t *o, bench_group_t *g, bench_table_t *t)
{
    double *v = calloc((size_t)o->lookups, sizeof(double));
    int n = 0;
    for (int i = 0; v && i < o->lookups; i++) {
        char path[256], *body = NULL, *b2 = NULL;
        uint64_t us = 0;
        snprintf(path, sizeof(path), "/admin/fetch?peer=%s&first=%u&count=64&request=%d",
                 g->n[BN_A].ctl, 4000000000u - 64u * (uint32_t)i, 90000000 + i);
        if (admin_post(g->n[BN_ON].http, path, &body) != 0)
            break;
        if (cli_kv_u64(body, "lookup_us", &us) == 0)
            v[n++] = (double)us;
        free(body);
        snprintf(path, sizeof(path), "/admin/finish?request=%d", 90000000 + i);
        if (admin_post(g->n[BN_ON].http, path, &b2) == 0)
            free(b2);
    }
    if (n > 0) {
        t->lookup_p50_us = bench_percentile(v, n, 50);
        t->lookup_p99_us = bench_percentile(v, n, 99);
        t->lookup_n = n;
    }
    free(v);
}

/* Session set-up: remove A, wait until it is gone, add it, poll /peers
 * every millisecond until ready=1. */
static void session_setup(const bench_opts_t *o, bench_group_t *g, bench_table_t *t)
{
    double v[BENCH_MAX_RUNS];
    int n = 0;
    char path[128], want[96], *body = NULL;
    snprintf(want, sizeof(want), "peer=%s ", g->n[BN_A].ctl);
    for (int i = 0; i < o->setups && i < BENCH_MAX_RUNS; i++) {
        snprintf(path, sizeof(path), "/admin/peer?remove=%s", g->n[BN_A].ctl);
        if (admin_post(g->n[BN_ON].http, path, &body) != 0)
            break;
        free(body);
        for (int k = 0; k < 2000; k++) { /* until the session is gone */
            char err[64], *pb = NULL;
            bool gone = cli_http_call(g->n[BN_ON].http, "GET", "/peers", 1000, &pb, err,
                                      sizeof(err)) == 0 && strstr(pb, "ready=1") == NULL;
            free(pb);
            if (gone)
                break;
            cli_sleep_ms(1);
        }
        uint64_t t0 = cli_now_ns();
        snprintf(path, sizeof(path), "/admin/peer?add=%s", g->n[BN_A].ctl);
        if (admin_post(g->n[BN_ON].http, path, &body) != 0)
            break;
        free(body);
        if (wait_ok(g->n[BN_ON].http, "/peers", "ready=1", 10000) != 0)
            break;
        v[n++] = (double)(cli_now_ns() - t0) / 1e6;
    }
    t->setup_n = n;
    t->setup_ms_median = bench_median(v, n);
}

/* ------------------------------------------------------------ report */

static void print_table(const bench_opts_t *o, const bench_table_t *t)
{
    printf("\n%-8s %-4s %9s %-4s %9s  %s\n", "kind", "path", "block", "cks", "GB/s med",
           "runs (GB/s) / note");
    for (int i = 0; i < t->nrows; i++) {
        const bench_row_t *r = &t->rows[i];
        printf("%-8s %-4s %6u KiB %-4s %9.3f  [", r->kind, r->path, r->block_size / 1024, r->cks,
               r->median);
        for (int k = 0; k < r->n; k++)
            printf("%s%.3f", k ? " " : "", r->v[k]);
        printf("] %s\n", r->note);
    }
    printf("\nratios (e2e median / ceiling median)\n");
    const char *paths[2] = {"shm", "tcp"};
    for (int p = 0; p < 2; p++)
        for (int s = 0; s < o->nsizes; s++) {
            const bench_row_t *on = bench_row_find(t, "e2e", paths[p], "on", o->sizes[s]);
            const bench_row_t *off = bench_row_find(t, "e2e", paths[p], "off", o->sizes[s]);
            const bench_row_t *raw = bench_row_find(t, "raw", paths[p], "-", o->sizes[s]);
            const bench_row_t *pt = bench_row_find(t, "perftest", paths[p], "-", o->sizes[s]);
            const bench_row_t *mc = bench_row_find(t, "memcpy", "mem", "-", o->sizes[s]);
            if (off == NULL)
                continue;
            printf("  %s %6u KiB: cks on/off %.2f", paths[p], o->sizes[s] / 1024,
                   on ? on->median / off->median : 0.0);
            if (raw)
                printf("  e2e/raw %.3f", off->median / raw->median);
            else
                printf("  e2e/raw n/a");
            if (pt)
                printf("  e2e/perftest %.3f", off->median / pt->median);
            if (mc)
                printf("  e2e/memcpy %.3f", off->median / mc->median);
            printf("\n");
        }
    printf("%s\n", t->raw_note);
    if (t->lookup_n)
        printf("lookup round trip (64 keys, MISS, shm): p50 %.0f us, p99 %.0f us (%d lookups)\n",
               t->lookup_p50_us, t->lookup_p99_us, t->lookup_n);
    if (t->setup_n)
        printf("session set-up (peer add -> ready, shm): median %.2f ms (%d runs)\n",
               t->setup_ms_median, t->setup_n);
}

static void run_e2e(const bench_opts_t *o, bench_table_t *t)
{
    const char *paths[2] = {"shm", "tcp"};
    bool on[2] = {o->shm, o->tcp};
    for (int p = 0; p < 2; p++)
        for (int s = 0; on[p] && s < o->nsizes; s++) {
            bench_group_t g;
            uint64_t t0 = cli_now_ns();
            if (group_start(&g, o, paths[p], o->sizes[s]) != 0)
                continue;
            e2e_cold(o, &g, t);
            e2e_group(o, &g, t);
            if (s == 0) { /* control-plane latencies once, on the first group */
                lookup_rtt(o, &g, t);
                session_setup(o, &g, t);
            }
            group_stop(&g);
            fprintf(stderr, "  e2e %s %u KiB done in %.1f s\n", paths[p], o->sizes[s] / 1024,
                    (double)(cli_now_ns() - t0) / 1e9);
        }
}

int cli_cmd_bench(int argc, char **argv)
{
    bench_opts_t o;
    int rc = bench_parse(argc, argv, &o);
    if (rc >= 0)
        return rc;
    if (access(o.kvpeerd, X_OK) != 0) {
        fprintf(stderr, "kvpeer bench: kvpeerd not found: '%s' (use --kvpeerd)\n", o.kvpeerd);
        return CLI_EXIT_USAGE;
    }
    if (getenv("UCX_NET_DEVICES") == NULL)
        setenv("UCX_NET_DEVICES", "lo", 1); /* tcp on loopback only */
    cli_children_guard();
    static bench_table_t t;
    uint64_t t0 = cli_now_ns();
    printf("kvpeer bench%s: region %llu MiB per node, %d alternating runs, run budget %.1f s, "
           "%llu MiB per request\n", o.quick ? " --quick" : "",
           (unsigned long long)(o.region >> 20), o.runs, o.run_secs,
           (unsigned long long)(o.request_bytes >> 20));
    fflush(stdout);
    if (bench_mkdirs(o.out) != 0) {
        fprintf(stderr, "kvpeer bench: cannot create %s\n", o.out);
        return CLI_EXIT_FAIL;
    }
    uint64_t ts = cli_now_ns();
    run_e2e(&o, &t);
    fprintf(stderr, "  [e2e %.1f s] memcpy...\n", (double)(cli_now_ns() - ts) / 1e9);
    ts = cli_now_ns();
    bench_memcpy(&o, &t);
    fprintf(stderr, "  [memcpy %.1f s]\n", (double)(cli_now_ns() - ts) / 1e9);
    ts = cli_now_ns();
    if (o.perftest) {
        bench_perftest(&o, &t);
        fprintf(stderr, "  [ucx_perftest %.1f s]\n", (double)(cli_now_ns() - ts) / 1e9);
    }
    ts = cli_now_ns();
    if (o.raw) {
        bench_raw_ucx(&o, &t);
        fprintf(stderr, "  [raw ucx ceiling %.1f s]\n", (double)(cli_now_ns() - ts) / 1e9);
    } else {
        snprintf(t.raw_note, sizeof(t.raw_note), "raw ceiling: skipped (--no-raw)");
    }
    print_table(&o, &t);
    bench_write_outputs(&o, &t);
    printf("bench took %.1f s\n", (double)(cli_now_ns() - t0) / 1e9);
    return t.nrows > 0 ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}
