/*
 * e2e_bench.c -- engine-style end-to-end benchmark of kvpeer (issue 17):
 * the public C API only, two processes on this machine. The parent is the
 * consumer (an engine: K fetches outstanding, each a LOOKUP of B keys, then a
 * FETCH of the hits, then kvp_finish_request); a child exec'd from this
 * binary (--serve) is the producer. Regions are larger than the LLC and the
 * keys cycle over a producer region twice the consumer's, so every fetch
 * lands in an evicted (cold) slot and reads a cold source slot.
 *
 * Per data path (shm = UCX's default choice; tcp = UCX_TLS=tcp in both
 * processes), block size, checksum verification (off/on), request size
 * (bytes per fetch) and K: GB/s, fetches/s, p50/p99 fetch latency (lookup
 * submitted -> load event) and CPU seconds per GB of both processes
 * (getrusage). In the same run: cold memcpy, the raw UCX put ceiling and
 * ucx_perftest (bench/transport/ucx_bench), and lookup p50 next to a raw TCP
 * ping-pong of the same frame sizes. Table on stdout, CSV + PNG in --out.
 *
 *   e2e_bench [--quick | --smoke] [--path shm|tcp|both] [--sizes KiB,..]
 *             [--depths K,..] [--req-mib M,..] [--region-mib N] [--secs S]
 *             [--cks off|on|both] [--no-ceilings] [--no-plot] [--out DIR]
 *   --smoke: a fixed, small run for ctest: completes and every fetched block
 *            verifies byte-exact (exit 1 otherwise); no speed is asserted.
 */
#include "e2e.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ helpers */

double e2e_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void e2e_block_fill(uint32_t k, uint8_t *buf, size_t len)
{
    uint64_t x = 0xe2e00000ull + k;
    for (size_t i = 0; i + 8 <= len; i += 8) { /* splitmix64 stream */
        uint64_t z = (x += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        memcpy(buf + i, &z, 8);
    }
}

bool e2e_io_all(int fd, void *buf, size_t len, bool wr)
{
    uint8_t *p = buf;
    while (len) {
        ssize_t n = wr ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        p += n;
        len -= (size_t)n;
    }
    return true;
}

uint32_t e2e_key(uint32_t k, uint8_t *out)
{
    char tmp[16];
    snprintf(tmp, sizeof(tmp), "e2e-%08u", k % 100000000u);
    memcpy(out, tmp, E2E_KEY_LEN);
    return E2E_KEY_LEN;
}

void e2e_config_keep(kvp_config_t *cfg, uint32_t keep_ms)
{
    if (keep_ms == 0)
        return;
    cfg->abort_resend_ms = keep_ms / 3 ? keep_ms / 3 : 1;
    cfg->abort_ack_timeout_ms = keep_ms - cfg->abort_resend_ms ? keep_ms - cfg->abort_resend_ms : 1;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double e2e_percentile(double *v, int n, double p)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof(double), cmp_d);
    int i = (int)(p / 100.0 * (double)n + 0.5) - 1;
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

void e2e_loadavg(char *buf, size_t cap, double *load1)
{
    double a = -1, b = -1, c = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &a, &b, &c) != 3)
            a = b = c = -1;
        fclose(f);
    }
    if (buf)
        snprintf(buf, cap, "load average: %.2f, %.2f, %.2f", a, b, c);
    if (load1)
        *load1 = a;
}

static double self_cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static e2e_opts_t O;
static e2e_table_t T;

/* ------------------------------------------------------------ producer */

typedef struct producer {
    pid_t pid;
    FILE *in, *out; /* its stdin (we write), its stdout (we read) */
    char peer[256];
    int pp_port;
} producer_t;

static int producer_start(const e2e_opts_t *o, uint32_t bs, uint32_t n, producer_t *p)
{
    int to[2], from[2];
    char a_bs[16], a_n[16], a_keep[16], line[512];
    if (pipe2(to, O_CLOEXEC) != 0 || pipe2(from, O_CLOEXEC) != 0)
        return -1;
    snprintf(a_bs, sizeof(a_bs), "%u", bs);
    snprintf(a_n, sizeof(a_n), "%u", n);
    snprintf(a_keep, sizeof(a_keep), "%u", o->keep_ms);
    fflush(NULL);
    p->pid = fork();
    if (p->pid == 0) {
        dup2(to[0], 0);
        dup2(from[1], 1);
        execl(o->self, o->self, "--serve", a_bs, a_n, a_keep, (char *)NULL);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    p->in = fdopen(to[1], "w");
    p->out = fdopen(from[0], "r");
    if (p->pid < 0 || !p->in || !p->out || !fgets(line, sizeof(line), p->out) ||
        sscanf(line, "ready %255s %d", p->peer, &p->pp_port) != 2) {
        fprintf(stderr, "e2e: producer did not start (bs %u, %u blocks)\n", bs, n);
        return -1;
    }
    return 0;
}

static double producer_cpu(producer_t *p)
{
    char line[128];
    double s = -1;
    fprintf(p->in, "rusage\n");
    fflush(p->in);
    if (fgets(line, sizeof(line), p->out))
        sscanf(line, "rusage %lf", &s);
    return s;
}

static int producer_stop(producer_t *p)
{
    int st = 0;
    if (p->in) {
        fprintf(p->in, "quit\n");
        fclose(p->in);
    }
    if (p->out)
        fclose(p->out);
    if (p->pid > 0 && waitpid(p->pid, &st, 0) != p->pid)
        return -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* ------------------------------------------------------------ consumer */

typedef struct consumer {
    kvp_node_t *node;
    const char *peer;
    uint32_t bs, ncons, nprod;
    uint64_t cursor, next_req;
    char data_path[32];
} consumer_t;

static int consumer_start(consumer_t *c, uint32_t bs, uint32_t ncons, bool cks, const char *peer)
{
    kvp_config_t cfg;
    kvp_config_init(&cfg);
    cfg.name = "e2e-consumer";
    cfg.block_size = bs;
    cfg.num_blocks = ncons;
    cfg.compat = "kvpeer-e2e-bench";
    cfg.verify_checksums = cks;
    if (O.wait_spin_us >= 0)
        cfg.wait_spin_us = (uint32_t)O.wait_spin_us;
    e2e_config_keep(&cfg, O.keep_ms);
    c->bs = bs;
    c->ncons = ncons;
    c->peer = peer;
    c->next_req = 1;
    kvp_status_t st = kvp_node_create(&cfg, &c->node);
    if (st != KVP_OK) {
        fprintf(stderr, "e2e: consumer create: %s\n", kvp_status_str(st));
        return -1;
    }
    kvp_peer_add(c->node, peer);
    for (double end = e2e_now() + 20; e2e_now() < end;) {
        kvp_peer_info_t pi[4] = {0};
        uint32_t n = 0;
        kvp_event_t ev[8];
        kvp_node_peers(c->node, pi, 4, &n);
        for (uint32_t i = 0; i < n && i < 4; i++)
            if (!strncmp(pi[i].peer, peer, sizeof(pi[i].peer)) && pi[i].ready) {
                snprintf(c->data_path, sizeof(c->data_path), "%s", pi[i].data_path);
                return 0;
            }
        kvp_poll_events(c->node, ev, 8, &n); /* PEER_UP: nothing else to do */
        usleep(2000);
    }
    fprintf(stderr, "e2e: no session with %s within 20 s\n", peer);
    return -1;
}

/* One outstanding fetch of the K. */
typedef struct fslot {
    int state; /* 0 idle, 1 lookup, 2 load */
    uint64_t op, req;
    double t0;
    uint32_t hits;
    uint8_t *keys, *res;
    uint32_t *lens;
} fslot_t;

typedef struct cell {
    consumer_t *c;
    fslot_t *s;
    uint32_t depth, b; /* K, blocks per fetch */
    double *lat;
    int nlat, caplat;
    uint64_t bytes, fetches, errors, limit; /* limit: fetches to start (0 = time) */
    uint64_t started;
    double end;
} cell_t;

static void slot_start(cell_t *x, fslot_t *f)
{
    consumer_t *c = x->c;
    for (uint32_t i = 0; i < x->b; i++)
        f->lens[i] = e2e_key((uint32_t)((c->cursor + i) % c->nprod), f->keys + i * E2E_KEY_LEN);
    c->cursor += x->b;
    f->req = c->next_req++;
    f->t0 = e2e_now();
    x->started++;
    if (O.hint) { /* one round trip: the FETCH names the keys, the source supplies them */
        f->hits = x->b;
        kvp_status_t st = kvp_fetch(c->node, c->peer, f->req, f->keys, f->lens, x->b,
                                    KVP_FETCH_FLAG_HINT, NULL, &f->op);
        if (st != KVP_OK) {
            fprintf(stderr, "e2e: kvp_fetch (hint): %s\n", kvp_status_str(st));
            x->errors++;
            f->state = 0;
            return;
        }
        f->state = 2;
        return;
    }
    kvp_status_t st = kvp_lookup(c->node, c->peer, f->req, f->keys, f->lens, x->b, f->res, &f->op);
    if (st != KVP_OK) {
        fprintf(stderr, "e2e: kvp_lookup: %s\n", kvp_status_str(st));
        x->errors++;
        f->state = 0;
        return;
    }
    f->state = 1;
}

static bool cell_more(const cell_t *x)
{
    return x->limit ? x->started < x->limit : e2e_now() < x->end;
}

/* The fetch of slot f is over (ok or not): its request is finished, and the
 * slot starts the next one while the window lasts. */
static void slot_done(cell_t *x, fslot_t *f)
{
    kvp_finish_request(x->c->node, f->req);
    f->state = 0;
    if (cell_more(x) && x->errors == 0)
        slot_start(x, f);
}

static void on_lookup(cell_t *x, fslot_t *f, const kvp_event_t *ev)
{
    uint32_t k = 0;
    if (ev->status != KVP_OK || ev->n_keys != x->b) {
        fprintf(stderr, "e2e: lookup: %s, %u of %u hits\n", kvp_status_str(ev->status),
                ev->n_keys, x->b);
        x->errors++;
        slot_done(x, f);
        return;
    }
    for (uint32_t i = 0; i < x->b; i++) /* fetch the hits (all of them, checked above) */
        if (f->res[i] == 1) {
            memmove(f->keys + k * E2E_KEY_LEN, f->keys + i * E2E_KEY_LEN, E2E_KEY_LEN);
            k++;
        }
    f->hits = k;
    kvp_status_t st = kvp_fetch(x->c->node, x->c->peer, f->req, f->keys, f->lens, k, 0, NULL, &f->op);
    if (st != KVP_OK) {
        fprintf(stderr, "e2e: kvp_fetch: %s\n", kvp_status_str(st));
        x->errors++;
        slot_done(x, f);
        return;
    }
    f->state = 2;
}

static void on_load(cell_t *x, fslot_t *f, const kvp_event_t *ev)
{
    if (ev->status != KVP_OK || ev->n_ok != f->hits) {
        fprintf(stderr, "e2e: load: %s, %u of %u blocks\n", kvp_status_str(ev->status), ev->n_ok,
                f->hits);
        x->errors++;
    } else {
        x->bytes += (uint64_t)ev->n_ok * x->c->bs;
        x->fetches++;
        if (x->nlat < x->caplat)
            x->lat[x->nlat++] = (e2e_now() - f->t0) * 1e6;
    }
    slot_done(x, f);
}

static int cell_dispatch(cell_t *x, const kvp_event_t *ev)
{
    if (ev->type == KVP_EV_PEER_DOWN) {
        fprintf(stderr, "e2e: peer down: %s\n", kvp_status_str(ev->status));
        return -1;
    }
    for (uint32_t i = 0; i < x->depth; i++) {
        fslot_t *f = &x->s[i];
        if (f->state == 0 || f->op != ev->op_id)
            continue;
        if (ev->type == KVP_EV_LOOKUP && f->state == 1)
            on_lookup(x, f, ev);
        else if (ev->type == KVP_EV_LOAD && f->state == 2)
            on_load(x, f, ev);
        return 0;
    }
    return 0;
}

static int cell_active(const cell_t *x)
{
    int a = 0;
    for (uint32_t i = 0; i < x->depth; i++)
        a += x->s[i].state != 0;
    return a;
}

/* Wait up to timeout_ms for the consumer's events: kvp_wait_events, or
 * (--wait-fd) poll on kvp_node_fd + kvp_poll_events. */
static kvp_status_t wait_events(kvp_node_t *node, kvp_event_t *ev, uint32_t cap, uint32_t *n,
                                int timeout_ms)
{
    if (!O.wait_fd)
        return kvp_wait_events(node, ev, cap, n, timeout_ms);
    struct pollfd pf = {.fd = kvp_node_fd(node), .events = POLLIN};
    poll(&pf, 1, timeout_ms);
    return kvp_poll_events(node, ev, cap, n);
}

/* Run K outstanding fetches of b blocks for `secs` (or `limit` fetches);
 * the window closes, the outstanding ones drain. Elapsed time out. */
static double cell_run(cell_t *x, double secs)
{
    kvp_event_t ev[64];
    double t0 = e2e_now(), hard = t0 + secs + 120;
    x->end = t0 + secs;
    for (uint32_t i = 0; i < x->depth && cell_more(x); i++)
        slot_start(x, &x->s[i]);
    while (cell_active(x) > 0) {
        uint32_t n = 0;
        if (wait_events(x->c->node, ev, 64, &n, 100) != KVP_OK)
            break;
        for (uint32_t i = 0; i < n; i++)
            if (cell_dispatch(x, &ev[i]) != 0)
                x->errors++;
        if (e2e_now() > hard) {
            fprintf(stderr, "e2e: cell did not drain within 120 s\n");
            x->errors++;
            break;
        }
        if (x->errors && n == 0 && cell_active(x) > 0 && e2e_now() > x->end + 35)
            break;
    }
    return e2e_now() - t0;
}

static int cell_alloc(cell_t *x, consumer_t *c, uint32_t depth, uint32_t b, int caplat)
{
    memset(x, 0, sizeof(*x));
    x->c = c;
    x->depth = depth;
    x->b = b;
    x->caplat = caplat;
    x->s = calloc(depth, sizeof(fslot_t));
    x->lat = calloc((size_t)caplat, sizeof(double));
    if (!x->s || !x->lat)
        return -1;
    for (uint32_t i = 0; i < depth; i++) {
        x->s[i].keys = malloc((size_t)b * E2E_KEY_LEN);
        x->s[i].res = malloc(b);
        x->s[i].lens = malloc(sizeof(uint32_t) * b);
        if (!x->s[i].keys || !x->s[i].res || !x->s[i].lens)
            return -1;
    }
    return 0;
}

static void cell_free(cell_t *x)
{
    for (uint32_t i = 0; x->s && i < x->depth; i++) {
        free(x->s[i].keys);
        free(x->s[i].res);
        free(x->s[i].lens);
    }
    free(x->s);
    free(x->lat);
}

/* ------------------------------------------------------------ the matrix */

static int run_cell(consumer_t *c, producer_t *p, const char *path, bool cks, uint32_t depth,
                    uint64_t req, double secs, uint64_t limit, bool record)
{
    cell_t x;
    uint32_t b = req / c->bs ? (uint32_t)(req / c->bs) : 1;
    int rc = -1;
    if (cell_alloc(&x, c, depth, b, 200000) != 0)
        goto out;
    x.limit = limit;
    double pc0 = producer_cpu(p), cc0 = self_cpu_s();
    double el = cell_run(&x, secs);
    double pc1 = producer_cpu(p), cc1 = self_cpu_s();
    rc = x.errors ? -1 : 0;
    if (!record || T.nrows >= E2E_MAX_ROWS)
        goto out;
    e2e_row_t *r = &T.rows[T.nrows++];
    memset(r, 0, sizeof(*r));
    snprintf(r->path, sizeof(r->path), "%s", path);
    snprintf(r->data_path, sizeof(r->data_path), "%s%s%s", c->data_path, O.hint ? "+hint" : "",
             O.wait_fd ? "+fdwait" : "");
    r->bs = c->bs;
    r->depth = depth;
    r->req = (uint64_t)b * c->bs;
    r->cks = cks;
    r->keep_ms = O.keep_ms;
    r->bytes = x.bytes;
    r->fetches = x.fetches;
    r->errors = x.errors;
    r->gbps = (double)x.bytes / el / 1e9;
    r->fetches_s = (double)x.fetches / el;
    r->prod_cpu = pc1 - pc0;
    r->cons_cpu = cc1 - cc0;
    r->cpu_s_per_gb = x.bytes ? (r->prod_cpu + r->cons_cpu) / ((double)x.bytes / 1e9) : 0;
    r->p50_us = e2e_percentile(x.lat, x.nlat, 50);
    r->p99_us = e2e_percentile(x.lat, x.nlat, 99);
    e2e_loadavg(NULL, 0, &r->load1);
    printf("  %-3s %-10s %s bs %5u KiB  req %6.2f MiB  K=%-2u cks %-3s  %7.3f GB/s  %8.1f f/s  "
           "p50 %8.0f us  p99 %8.0f us  cpu %.3f s/GB  err %llu  load %.2f\n",
           path, r->data_path, O.keep_ms ? "keep-diag" : "", r->bs / 1024, (double)r->req / 1048576.0, depth, cks ? "on" : "off",
           r->gbps, r->fetches_s, r->p50_us, r->p99_us, r->cpu_s_per_gb,
           (unsigned long long)r->errors, r->load1);
    fflush(stdout);
out:
    cell_free(&x);
    return rc;
}

/* Every block the consumer still holds among the last `n` fetched keys is
 * compared byte-exact with what the producer put. */
static int verify_recent(consumer_t *c, uint64_t n)
{
    uint8_t key[16], *want = malloc(c->bs);
    uint64_t bad = 0, seen = 0;
    if (!want)
        return -1;
    for (uint64_t i = c->cursor > n ? c->cursor - n : 0; i < c->cursor; i++) {
        kvp_block_t blk;
        uint32_t k = (uint32_t)(i % c->nprod);
        if (kvp_get(c->node, key, e2e_key(k, key), &blk) != KVP_OK)
            continue;
        e2e_block_fill(k, want, c->bs);
        seen++;
        bad += blk.len != c->bs || memcmp(blk.data, want, c->bs) != 0;
        kvp_release(c->node, &blk);
    }
    free(want);
    T.verified += seen;
    T.verify_bad += bad;
    if (bad || seen == 0)
        fprintf(stderr, "e2e: verify: %llu of %llu blocks differ\n", (unsigned long long)bad,
                (unsigned long long)seen);
    return bad || seen == 0 ? -1 : 0;
}

/* LOOKUP / LOOKUP_RESP frame sizes for n keys of E2E_KEY_LEN (src/wire/wire.h:
 * 8-byte header, two 16-byte epochs, u64 request, u64 round, u32 n). */
static uint32_t lookup_frame(uint32_t n)
{
    return 8 + 32 + 20 + n * (1 + E2E_KEY_LEN);
}
static uint32_t lookup_resp_frame(uint32_t n)
{
    return 8 + 32 + 20 + n;
}

/* Lookup p50 of `nk` keys (hits) next to a raw TCP ping-pong of the same
 * frame sizes, interleaved sample by sample so both see the same load. */
static int lookup_latency(consumer_t *c, producer_t *p, const char *path, int samples)
{
    enum { NK = 64 };
    uint8_t keys[NK * E2E_KEY_LEN], res[NK];
    uint32_t lens[NK];
    double *lk = calloc((size_t)samples, sizeof(double)), *pp = calloc((size_t)samples, sizeof(double));
    int got = 0, rc = -1, fd = e2e_pp_connect(p->pp_port);
    if (!lk || !pp || fd < 0)
        goto out;
    kvp_stats_t st0, st1; /* how many waits the waiting thread led (DESIGN, threads) */
    if (kvp_node_stats(c->node, &st0) != KVP_OK)
        goto out;
    for (int s = 0; s < samples; s++) {
        for (uint32_t i = 0; i < NK; i++)
            lens[i] = e2e_key((uint32_t)((c->cursor + i) % c->nprod), keys + i * E2E_KEY_LEN);
        uint64_t op, req = c->next_req++;
        double t0 = e2e_now(), t1 = 0;
        if (kvp_lookup(c->node, c->peer, req, keys, lens, NK, res, &op) != KVP_OK)
            goto out;
        for (double end = t0 + 10; !t1 && e2e_now() < end;) {
            kvp_event_t ev[8];
            uint32_t n = 0;
            if (wait_events(c->node, ev, 8, &n, 100) != KVP_OK)
                break;
            for (uint32_t i = 0; i < n; i++)
                if (ev[i].type == KVP_EV_LOOKUP && ev[i].op_id == op)
                    t1 = e2e_now();
        }
        kvp_finish_request(c->node, req);
        if (!t1)
            goto out;
        lk[got] = (t1 - t0) * 1e6;
        if ((pp[got] = e2e_pp_round(fd, lookup_frame(NK), lookup_resp_frame(NK))) < 0)
            goto out;
        got++;
    }
    if (T.nlat >= (int)(sizeof(T.lat) / sizeof(T.lat[0])) || kvp_node_stats(c->node, &st1) != KVP_OK)
        goto out;
    e2e_lat_t *l = &T.lat[T.nlat++];
    snprintf(l->path, sizeof(l->path), "%s", path);
    l->nkeys = NK;
    l->keep_ms = O.keep_ms;
    l->req_bytes = lookup_frame(NK);
    l->resp_bytes = lookup_resp_frame(NK);
    l->n = got;
    l->lookup_p50_us = e2e_percentile(lk, got, 50);
    l->lookup_p99_us = e2e_percentile(lk, got, 99);
    l->ping_p50_us = e2e_percentile(pp, got, 50);
    l->ping_p99_us = e2e_percentile(pp, got, 99);
    printf("  %-3s lookup of %d keys%s: p50 %.1f us p99 %.1f us | raw TCP ping-pong %u/%u bytes: "
           "p50 %.1f us p99 %.1f us | waits led %llu (%d lookups) | ratio %.2f\n",
           path, NK, O.wait_fd ? " (fd wait)" : "", l->lookup_p50_us, l->lookup_p99_us, l->req_bytes, l->resp_bytes,
           l->ping_p50_us, l->ping_p99_us, (unsigned long long)(st1.waits_led - st0.waits_led), got,
           l->lookup_p50_us / l->ping_p50_us);
    rc = 0;
out:
    if (fd >= 0)
        close(fd);
    free(lk);
    free(pp);
    return rc;
}

/* One consumer node (checksums on or off) against producer p: warm-up, the
 * (request, K) cells, a byte-exact check of recent blocks. */
static int run_consumer(producer_t *p, const char *path, uint32_t bs, bool cks, bool do_lat)
{
    consumer_t c = {0};
    uint32_t ncons = (uint32_t)(O.region / bs);
    int rc = -1;
    c.nprod = 2 * ncons;
    if (consumer_start(&c, bs, ncons, cks, p->peer) != 0)
        goto out;
    if (O.smoke) {
        rc = run_cell(&c, p, path, cks, O.depths[0], O.reqs[0], 0, (uint64_t)O.smoke_fetches, true);
        if (rc == 0)
            rc = verify_recent(&c, c.ncons / 2);
        goto out;
    }
    /* warm-up: one pass over the consumer region, not recorded */
    uint64_t wreq = bs >= (1u << 20) ? bs : 1u << 20;
    if (run_cell(&c, p, path, cks, 4, wreq, 0, O.region / wreq, false) != 0)
        goto out;
    /* --steady: the source keeps finished rounds for abort replays (12 s by
     * default); an engine that has run for a while sees that many */
    if (O.steady > 0 && run_cell(&c, p, path, cks, 4, wreq, O.steady, 0, false) != 0)
        goto out;
    if (do_lat && lookup_latency(&c, p, path, O.lookups) != 0)
        fprintf(stderr, "e2e: lookup latency on %s failed\n", path);
    rc = 0;
    for (int ri = 0; ri < O.nreqs; ri++) {
        uint64_t req = O.reqs[ri] < bs ? bs : O.reqs[ri] / bs * bs;
        if (ri > 0 && (O.reqs[ri - 1] < bs ? bs : O.reqs[ri - 1] / bs * bs) == req)
            continue; /* same blocks per fetch as the previous request size */
        if (!strcmp(path, "tcp") && req > ((uint64_t)O.tcp_req_max_mib << 20))
            continue;
        for (int di = 0; di < O.ndepths; di++) {
            if ((uint64_t)O.depths[di] * req > O.region / 2)
                continue; /* K requests in flight must fit half the consumer region */
            if (run_cell(&c, p, path, cks, O.depths[di], req, O.secs, 0, true) != 0)
                rc = -1;
        }
    }
    if (verify_recent(&c, c.ncons / 2) != 0)
        rc = -1;
out:
    if (c.node)
        kvp_node_destroy(c.node);
    return rc;
}

static int run_path(const char *path)
{
    int rc = 0;
    if (!strcmp(path, "tcp"))
        setenv("UCX_TLS", "tcp", 1);
    else
        unsetenv("UCX_TLS");
    for (int si = 0; si < O.nsizes; si++) {
        producer_t p = {0};
        uint32_t bs = O.sizes[si];
        uint32_t nprod = (uint32_t)(2 * O.region / bs);
        if (producer_start(&O, bs, nprod, &p) != 0) {
            producer_stop(&p);
            return -1;
        }
        bool lat = si == 0 && !O.smoke; /* lookup latency: once per path */
        for (int k = 0; k < 2; k++) {
            if (!(O.cks_mask & (1 << k)))
                continue;
            if (run_consumer(&p, path, bs, k == 1, lat) != 0)
                rc = -1;
            lat = false;
        }
        if (producer_stop(&p) != 0) {
            fprintf(stderr, "e2e: producer (bs %u) did not exit cleanly\n", bs);
            rc = -1;
        }
    }
    unsetenv("UCX_TLS");
    return rc;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "--serve"))
        return e2e_serve_main(argc - 2, argv + 2);
    if (e2e_parse(argc, argv, &O) != 0)
        return 2;
    ssize_t sl = readlink("/proc/self/exe", O.self, sizeof(O.self) - 1);
    if (sl <= 0)
        return fprintf(stderr, "e2e: readlink /proc/self/exe: %s\n", strerror(errno)), 1;
    O.self[sl] = '\0';
    if (!O.out[0])
        snprintf(O.out, sizeof(O.out), "build/bench-out");
    if (!getenv("UCX_NET_DEVICES"))
        setenv("UCX_NET_DEVICES", "lo", 1); /* tcp on loopback only */
    if (getenv("UCX_TLS"))
        fprintf(stderr, "e2e: note: UCX_TLS=%s from the environment is replaced per path\n",
                getenv("UCX_TLS"));
    signal(SIGPIPE, SIG_IGN);
    if (!getenv("KVPEER_LOG_LEVEL"))
        kvp_set_log_level(1);
    e2e_loadavg(T.load_start, sizeof(T.load_start), NULL);
    printf("e2e_bench: consumer region %llu MiB, producer %llu MiB (L3 is typically 32 MiB), "
           "%.2f s per cell, %.0f s steady-state load per consumer first; %s\n",
           (unsigned long long)(O.region >> 20), (unsigned long long)(O.region >> 19), O.secs,
           O.steady, T.load_start);
    int rc = 0;
    if (O.ceilings)
        e2e_memcpy(&O, &T);
    if (O.shm && run_path("shm") != 0)
        rc = 1;
    if (O.tcp && run_path("tcp") != 0)
        rc = 1;
    if (O.diag_keep_ms) {
        O.keep_ms = O.diag_keep_ms;
        printf("diagnostic: shm again, finished rounds kept %u ms instead of 12000 ms\n",
               O.keep_ms);
        if (run_path("shm") != 0)
            rc = 1;
        O.keep_ms = 0;
    }
    if (O.ceilings)
        e2e_ucx_ceiling(&O, &T);
    e2e_loadavg(T.load_end, sizeof(T.load_end), NULL);
    if (!O.smoke) {
        e2e_print_table(&O, &T);
        e2e_write_outputs(&O, &T);
    }
    printf("verified %llu blocks byte-exact, %llu differ; %s\n", (unsigned long long)T.verified,
           (unsigned long long)T.verify_bad, rc ? "ERRORS (see above)" : "no errors");
    return rc;
}
