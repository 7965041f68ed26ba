/*
 * kvpeer_demo_nodes.c -- the demo's three kvpeerd processes and the admin
 * calls made to them. Ports are chosen once at start, so a node restarted
 * after SIGKILL listens on the same address and keeps its peer id.
 */
#include "kvpeer_demo.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

void demo_say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

/* ------------------------------------------------------------ daemon argv */

enum { ARGV_MAX = 64 };

typedef struct argv_buf {
    char *v[ARGV_MAX];
    char s[ARGV_MAX][PATH_MAX + 64];
    int n;
} argv_buf_t;

static void argv_add(argv_buf_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void argv_add(argv_buf_t *a, const char *fmt, ...)
{
    if (a->n >= ARGV_MAX - 1)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(a->s[a->n], sizeof(a->s[a->n]), fmt, ap);
    va_end(ap);
    a->v[a->n] = a->s[a->n];
    a->v[++a->n] = NULL;
}

/* Slots per node: everything A ever holds, or everything a consumer
 * fetches, plus room for the quarantined slots of the faults. */
uint32_t demo_node_slots(const demo_opts_t *o)
{
    return o->blocks + o->blocks / 8 + 4 * (o->fault_blocks + o->parked_blocks) + 64;
}

static void build_argv(const demo_cluster_t *c, int i, argv_buf_t *a)
{
    const demo_opts_t *o = c->o;
    const demo_node_t *n = &c->n[i];
    const demo_timeouts_t *t = &o->t;
    a->n = 0;
    argv_add(a, "%s", o->kvpeerd);
    argv_add(a, "--listen=%s", n->ctl);
    argv_add(a, "--http=%s", n->http);
    argv_add(a, "--admin");
    argv_add(a, "--admin-token-file=%s", o->token_file);
    argv_add(a, "--name=%c", n->name);
    argv_add(a, "--num-blocks=%u", demo_node_slots(o));
    argv_add(a, "--block-size=%u", o->block_size);
    if (i != 0) /* consumers dial the source */
        argv_add(a, "--peers=%s", c->n[0].ctl);
    argv_add(a, "--heartbeat-ms=%u", t->heartbeat);
    argv_add(a, "--dead-after-ms=%u", t->dead_after);
    argv_add(a, "--load-timeout-ms=%u", t->load);
    argv_add(a, "--abort-resend-ms=%u", t->abort_resend);
    argv_add(a, "--abort-ack-timeout-ms=%u", t->abort_ack);
    argv_add(a, "--hold-cap-ms=%u", t->hold_cap);
    argv_add(a, "--lookup-pending-ms=%u", t->lookup_pending);
    argv_add(a, "--parked-demand-ms=%u", t->parked_demand);
    argv_add(a, "--supply-pin-ms=%u", t->supply_pin);
    argv_add(a, "--backoff-min-ms=%u", t->backoff_min);
    argv_add(a, "--backoff-max-ms=%u", t->backoff_max);
    argv_add(a, "--shutdown-drain-ms=%u", t->drain);
    if (o->verbose)
        argv_add(a, "--log-level=debug");
}

int demo_node_start(demo_cluster_t *c, int i)
{
    demo_node_t *n = &c->n[i];
    argv_buf_t a;
    build_argv(c, i, &a);
    FILE *lf = fopen(n->log, "a");
    if (lf != NULL) {
        fprintf(lf, "==== kvpeer demo: start #%d:", n->restarts + 1);
        for (int k = 0; k < a.n; k++)
            fprintf(lf, " %s", a.v[k]);
        fprintf(lf, "\n");
        fclose(lf);
    }
    n->pid = cli_spawn(a.v, NULL, n->log);
    n->stopped = false;
    if (n->pid < 0) {
        fprintf(stderr, "kvpeer demo: cannot start %s: %s\n", c->o->kvpeerd, strerror(errno));
        return -1;
    }
    return 0;
}

int demo_cluster_start(demo_cluster_t *c, const demo_opts_t *o)
{
    memset(c, 0, sizeof(*c));
    c->o = o;
    for (int i = 0; i < DEMO_NODES; i++) {
        demo_node_t *n = &c->n[i];
        n->name = (char)('A' + i);
        n->ctl_port = cli_free_port();
        n->http_port = cli_free_port();
        if (n->ctl_port == 0 || n->http_port == 0 || n->ctl_port == n->http_port)
            return -1;
        for (int j = 0; j < i; j++) /* a port handed out twice would collide */
            if (c->n[j].ctl_port == n->ctl_port || c->n[j].http_port == n->http_port ||
                c->n[j].ctl_port == n->http_port || c->n[j].http_port == n->ctl_port)
                return -1;
        snprintf(n->ctl, sizeof(n->ctl), "127.0.0.1:%d", n->ctl_port);
        snprintf(n->http, sizeof(n->http), "127.0.0.1:%d", n->http_port);
        snprintf(n->log, sizeof(n->log), "%s/node-%c.log", o->logdir, n->name);
        n->pid = -1;
    }
    for (int i = 0; i < DEMO_NODES; i++)
        if (demo_node_start(c, i) != 0)
            return -1;
    return 0;
}

/* Still running? (reaps and reports an unexpected exit) */
static bool node_alive(demo_node_t *n)
{
    int st = 0;
    if (n->pid <= 0)
        return false;
    if (cli_wait(n->pid, 0, &st) == 1) {
        fprintf(stderr, "kvpeer demo: node %c (pid %d) exited unexpectedly (%s %d); log: %s\n",
                n->name, (int)n->pid, WIFSIGNALED(st) ? "signal" : "status",
                WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st), n->log);
        n->pid = -1;
        return false;
    }
    return true;
}

int demo_node_wait_up(demo_cluster_t *c, int i, int timeout_ms)
{
    demo_node_t *n = &c->n[i];
    uint64_t deadline = cli_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    char err[256], *body = NULL;
    while (cli_now_ns() < deadline) {
        if (!node_alive(n))
            return -1;
        if (cli_http_call(n->http, "GET", "/healthz", 1000, &body, err, sizeof(err)) == 0) {
            free(body);
            return 0;
        }
        cli_sleep_ms(20);
    }
    fprintf(stderr, "kvpeer demo: node %c not up after %d ms (%s); log: %s\n", n->name,
            timeout_ms, err, n->log);
    return -1;
}

/* Is `peer` listed with ready=1 in node i's /peers? -1 on error. */
static int peer_ready(demo_node_t *n, const char *peer)
{
    char err[256], *body = NULL, want[64];
    if (cli_http_call(n->http, "GET", "/peers", 2000, &body, err, sizeof(err)) != 0)
        return -1;
    snprintf(want, sizeof(want), "peer=%s ", peer);
    int ready = 0;
    for (char *save = NULL, *l = strtok_r(body, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        uint64_t r = 0;
        if (strncmp(l, want, strlen(want)) == 0 && cli_kv_u64(l, "ready", &r) == 0 && r == 1)
            ready = 1;
    }
    free(body);
    return ready;
}

int demo_wait_peer_ready(demo_cluster_t *c, int i, const char *peer, int timeout_ms)
{
    uint64_t deadline = cli_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (cli_now_ns() < deadline) {
        if (!node_alive(&c->n[i]))
            return -1;
        if (peer_ready(&c->n[i], peer) == 1)
            return 0;
        cli_sleep_ms(20);
    }
    fprintf(stderr, "kvpeer demo: node %c has no ready session to %s after %d ms\n",
            c->n[i].name, peer, timeout_ms);
    return -1;
}

int demo_node_scrape(demo_cluster_t *c, int i)
{
    demo_node_t *n = &c->n[i];
    cli_metrics_t m;
    char err[256];
    if (cli_scrape(n->http, &m, err, sizeof(err)) != 0)
        return -1;
    if (n->has_cur)
        cli_metrics_free(&n->cur);
    n->cur = m;
    n->has_cur = true;
    return 0;
}

void demo_node_retire(demo_node_t *n)
{
    if (!n->has_cur)
        return;
    if (n->nhist < DEMO_MAX_INC)
        n->hist[n->nhist++] = n->cur;
    else
        cli_metrics_free(&n->cur);
    memset(&n->cur, 0, sizeof(n->cur));
    n->has_cur = false;
}

double demo_total(const demo_node_t *n, const char *name, const char *match)
{
    double v = n->has_cur ? cli_metric(&n->cur, name, match) : 0;
    for (int k = 0; k < n->nhist; k++)
        v += cli_metric(&n->hist[k], name, match);
    return v;
}

double demo_gauge(const demo_node_t *n, const char *name, const char *match)
{
    return n->has_cur ? cli_metric(&n->cur, name, match) : 0;
}

void demo_cluster_stop(demo_cluster_t *c, int st[DEMO_NODES])
{
    for (int i = 0; i < DEMO_NODES; i++) {
        st[i] = -1;
        if (c->n[i].pid > 0) {
            kill(c->n[i].pid, SIGCONT);
            kill(c->n[i].pid, SIGTERM);
        }
    }
    /* bounded drain + sanitizer exit work */
    int wait_ms = (int)c->o->t.drain + 10000 * (int)c->o->scale;
    for (int i = 0; i < DEMO_NODES; i++) {
        demo_node_t *n = &c->n[i];
        int ws = 0;
        if (n->pid <= 0)
            continue;
        if (cli_wait(n->pid, wait_ms, &ws) == 1) {
            st[i] = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
        } else {
            fprintf(stderr, "kvpeer demo: node %c ignored SIGTERM for %d ms; killing\n", n->name,
                    wait_ms);
            cli_kill_reap(n->pid);
            st[i] = 128 + SIGKILL;
        }
        n->pid = -1;
    }
}

void demo_cluster_free(demo_cluster_t *c)
{
    for (int i = 0; i < DEMO_NODES; i++) {
        demo_node_t *n = &c->n[i];
        if (n->pid > 0)
            cli_kill_reap(n->pid);
        n->pid = -1;
        for (int k = 0; k < n->nhist; k++)
            cli_metrics_free(&n->hist[k]);
        n->nhist = 0;
        if (n->has_cur)
            cli_metrics_free(&n->cur);
        n->has_cur = false;
    }
}

/* ------------------------------------------------------------ admin calls */

static int admin(demo_node_t *n, const char *method, const char *path, int tmo, char **body,
                 char *err, size_t errcap)
{
    return cli_http_call(n->http, method, path, tmo, body, err, errcap);
}

int demo_put(demo_node_t *n, uint32_t first, uint32_t count, char *err, size_t errcap)
{
    char path[128], *body = NULL;
    unsigned okc = 0, failc = 0;
    snprintf(path, sizeof(path), "/admin/put?first=%u&count=%u", first, count);
    if (admin(n, "POST", path, 120000, &body, err, errcap) != 0)
        return -1;
    int rc = sscanf(body, "put %u %u", &okc, &failc) == 2 && okc == count ? 0 : -1;
    if (rc != 0)
        snprintf(err, errcap, "node %c %s: %.100s", n->name, path, body);
    free(body);
    return rc;
}

void demo_fetch(const demo_cluster_t *c, demo_node_t *n, const char *peer, uint32_t first,
                uint32_t count, uint64_t req, bool wait, demo_fetch_t *f)
{
    char path[256], *body = NULL;
    int tmo = (int)c->o->t.load + 5000 * (int)c->o->scale;
    memset(f, 0, sizeof(*f));
    snprintf(path, sizeof(path),
             "/admin/fetch?peer=%s&first=%u&count=%u&request=%llu%s&timeout_ms=%d", peer, first,
             count, (unsigned long long)req, wait ? "&wait=1" : "", tmo);
    f->t_start_ns = cli_now_ns();
    int rc = admin(n, "POST", path, tmo + 5000, &body, f->err, sizeof(f->err));
    f->t_end_ns = cli_now_ns();
    if (rc != 0)
        return;
    int64_t code = 0;
    char codes[32] = "";
    f->ok_http = 1;
    cli_kv_u64(body, "lookup_hits", &f->hits);
    cli_kv_u64(body, "n_ok", &f->n_ok);
    cli_kv_u64(body, "lookup_us", &f->lookup_us);
    cli_kv_u64(body, "fetch_us", &f->fetch_us);
    if (cli_kv(body, "status", f->status, sizeof(f->status)) != 0)
        snprintf(f->status, sizeof(f->status), "?");
    if (cli_kv(body, "status_code", codes, sizeof(codes)) == 0)
        code = strtoll(codes, NULL, 10);
    f->status_code_neg = (uint64_t)(code < 0 ? -code : code);
    if (code != 0 || f->status[0] == '?')
        snprintf(f->err, sizeof(f->err), "%.200s", body);
    free(body);
}

int demo_finish(demo_node_t *n, uint64_t req)
{
    char path[96], err[256], *body = NULL;
    snprintf(path, sizeof(path), "/admin/finish?request=%llu", (unsigned long long)req);
    if (admin(n, "POST", path, 10000, &body, err, sizeof(err)) != 0)
        return -1;
    free(body);
    return 0;
}

int demo_peer_op(demo_node_t *n, const char *op, const char *peer, char *err, size_t errcap)
{
    char path[128], *body = NULL;
    snprintf(path, sizeof(path), "/admin/peer?%s=%s", op, peer);
    if (admin(n, "POST", path, 10000, &body, err, errcap) != 0)
        return -1;
    free(body);
    return 0;
}

int demo_verify(demo_node_t *n, uint32_t first, uint32_t count, uint64_t out[3], char *err,
                size_t errcap)
{
    char path[128], *body = NULL;
    snprintf(path, sizeof(path), "/admin/verify?first=%u&count=%u", first, count);
    if (admin(n, "GET", path, 120000, &body, err, errcap) != 0)
        return -1;
    int rc = 0;
    if (cli_kv_u64(body, "present", &out[0]) != 0 || cli_kv_u64(body, "missing", &out[1]) != 0 ||
        cli_kv_u64(body, "bad", &out[2]) != 0) {
        snprintf(err, errcap, "node %c %s: unexpected answer %.100s", n->name, path, body);
        rc = -1;
    }
    free(body);
    return rc;
}

int demo_corrupt(demo_node_t *n, uint32_t key, char *err, size_t errcap)
{
    char path[96], *body = NULL;
    snprintf(path, sizeof(path), "/admin/corrupt?key=%u", key);
    if (admin(n, "POST", path, 10000, &body, err, errcap) != 0)
        return -1;
    free(body);
    return 0;
}
