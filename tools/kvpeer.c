/*
 * kvpeer.c -- the `kvpeer` CLI: command dispatch and the operator commands
 * (stat, held, peers) that read a running kvpeerd's HTTP endpoints. `demo`
 * lives in kvpeer_demo.c, `bench` in kvpeer_bench.c.
 */
#include "kvpeer_cli.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *g_top_usage =
    "usage: kvpeer <command> [flags]\n"
    "\n"
    "commands:\n"
    "  demo            three kvpeerd nodes on 127.0.0.1, fetches, fault injection, verdict\n"
    "  bench           end-to-end fetch throughput vs. raw UCX / perftest / memcpy ceilings\n"
    "  stat HOST:PORT  one-screen summary of a node (slots, pins, sessions, held, errors, peers)\n"
    "  held HOST:PORT  retained transfers and quarantined slots with their ages\n"
    "  peers HOST:PORT every peer: state (ready, dialing, failed, ...), last error,\n"
    "                  data path, RTT\n"
    "  peer add|remove HOST:PORT PEER   want / drop a session with PEER (--admin)\n"
    "  put HOST:PORT FIRST COUNT        write synthetic blocks (--admin)\n"
    "  fetch HOST:PORT PEER FIRST COUNT [REQUEST]  look up and fetch them from PEER\n"
    "  version         print the version (also --version)\n"
    "\n"
    "HOST:PORT is a kvpeerd --http address (docs/API.md). `kvpeer <command> --help`\n"
    "for flags. peer, put and fetch send the token of $KVPEER_ADMIN_TOKEN_FILE (the\n"
    "file kvpeerd's admin_token_file names).\n"
    "exit status: 0 ok/PASS, 1 failure/FAIL, 2 usage error\n";

static int usage_error(const char *cmd, const char *fmt, const char *arg)
{
    fprintf(stderr, "kvpeer %s: ", cmd);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\ntry 'kvpeer %s --help'\n", cmd);
    return CLI_EXIT_USAGE;
}

/* The flags every command shares: --help, --timeout MS (1..max_ms, default
 * def_ms) and, when `all` is not NULL, --all. Returns -1 to go on (the
 * positional arguments are argv[optind..]), else an exit code. */
static int parse_flags(const char *cmd, const char *help, int argc, char **argv, int def_ms,
                       long max_ms, int *timeout_ms, bool *all)
{
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'},
                                         {"timeout", required_argument, NULL, 't'},
                                         {"all", no_argument, NULL, 'a'},
                                         {0}};
    int c;
    *timeout_ms = def_ms;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "+ht:", opts, NULL)) != -1) {
        if (c == 'h') {
            fputs(help, stdout);
            return CLI_EXIT_OK;
        } else if (c == 't') {
            char *end = NULL;
            long v = strtol(optarg, &end, 10);
            if (*end != '\0' || v <= 0 || v > max_ms) {
                fprintf(stderr, "kvpeer %s: bad --timeout '%s' (milliseconds, 1..%ld)\n"
                        "try 'kvpeer %s --help'\n", cmd, optarg, max_ms, cmd);
                return CLI_EXIT_USAGE;
            }
            *timeout_ms = (int)v;
        } else if (c == 'a' && all != NULL) {
            *all = true;
        } else {
            return usage_error(cmd, "unknown or incomplete flag '%s'", argv[optind - 1]);
        }
    }
    return -1;
}

/* The operator commands: [--timeout MS] [--all] HOST:PORT (`all` NULL: the
 * command has no --all). Returns -1 to run, else an exit code. */
static int parse_op_args(const char *cmd, const char *help, int argc, char **argv,
                         const char **addr, int *timeout_ms, bool *all)
{
    int rc = parse_flags(cmd, help, argc, argv, 5000, 600000, timeout_ms, all);
    if (rc >= 0)
        return rc;
    if (optind != argc - 1)
        return usage_error(cmd, "%s", "expects exactly one HOST:PORT (a kvpeerd --http address)");
    *addr = argv[optind];
    if (strchr(*addr, ':') == NULL)
        return usage_error(cmd, "bad address '%s' (want HOST:PORT)", *addr);
    return -1;
}

static void fmt_bytes(double b, char *out, size_t cap)
{
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) {
        b /= 1024;
        i++;
    }
    snprintf(out, cap, i ? "%.1f %s" : "%.0f %s", b, u[i]);
}

static void fmt_age(uint64_t ms, char *out, size_t cap)
{
    if (ms < 1000)
        snprintf(out, cap, "%llu ms", (unsigned long long)ms);
    else if (ms < 120000)
        snprintf(out, cap, "%.1f s", (double)ms / 1000.0);
    else
        snprintf(out, cap, "%.1f min", (double)ms / 60000.0);
}

/* ------------------------------------------------------------------ peers */

static void print_peer_line(const char *line)
{
    char peer[256] = "?", inst[256] = "?", path[64] = "?", state[32] = "", err[160] = "";
    uint64_t ready = 0, prob = 0, rtt = 0;
    cli_kv(line, "peer", peer, sizeof(peer));
    cli_kv(line, "instance", inst, sizeof(inst));
    cli_kv(line, "path", path, sizeof(path));
    cli_kv(line, "state", state, sizeof(state));
    cli_kv_u64(line, "ready", &ready);
    cli_kv_u64(line, "probation", &prob);
    const char *le = strstr(line, "last_error=\"");
    if (le != NULL) { /* quoted: may hold spaces */
        le += strlen("last_error=\"");
        const char *q = strchr(le, '"');
        size_t len = q ? (size_t)(q - le) : strlen(le);
        snprintf(err, sizeof(err), "%.*s", (int)len, le);
    }
    bool has_rtt = cli_kv_u64(line, "rtt_us", &rtt) == 0;
    char rtts[32] = "-";
    if (has_rtt && rtt > 0)
        snprintf(rtts, sizeof(rtts), "%llu us", (unsigned long long)rtt);
    if (state[0] == '\0')
        snprintf(state, sizeof(state), "%s", ready ? "ready" : "not-ready");
    printf("  %-22s %-12s %-9s %-10s %s%s%s%s\n", peer, path, rtts, state,
           prob ? "PROBATION " : "", strcmp(inst, peer) && strcmp(inst, "?") ? inst : "",
           err[0] && strcmp(state, "ready") ? "last error: " : "",
           strcmp(state, "ready") ? err : "");
}

/* Print the /peers table; returns the number of peers or -1. */
static int print_peers(const char *addr, int timeout_ms)
{
    char err[512], *body = NULL;
    if (cli_http_call(addr, "GET", "/peers", timeout_ms, &body, err, sizeof(err)) != 0) {
        fprintf(stderr, "kvpeer: %s\n", err);
        return -1;
    }
    int n = 0;
    printf("  %-22s %-12s %-9s %-10s %s\n", "PEER", "DATA PATH", "RTT", "STATE", "INSTANCE");
    for (char *save = NULL, *l = strtok_r(body, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
        if (strncmp(l, "peer=", 5) == 0) {
            print_peer_line(l);
            n++;
        }
    if (n == 0)
        printf("  (no peers)\n");
    free(body);
    return n;
}

static const char *g_peers_help =
    "usage: kvpeer peers [--timeout MS] HOST:PORT\n"
    "List the node's peers: data path (direct-shm, tcp, ...), RTT, session\n"
    "readiness, probation (a sibling of a dead instance), instance id.\n"
    "A same-host peer on 'tcp' is the F28 warning sign: 16-40x slower.\n";

static int cmd_peers(int argc, char **argv)
{
    const char *addr;
    int tmo, rc = parse_op_args("peers", g_peers_help, argc, argv, &addr, &tmo, NULL);
    if (rc >= 0)
        return rc;
    printf("peers of %s\n", addr);
    return print_peers(addr, tmo) < 0 ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}

/* ------------------------------------------------------------------- held */

static const char *g_held_help =
    "usage: kvpeer held [--timeout MS] [--all] HOST:PORT\n"
    "Incident view: what the node refuses to reuse because a one-sided WRITE may\n"
    "still touch it -- retained transfers (source side: a WRITE that may still\n"
    "read a pinned slot) and quarantined/suspect slots (consumer side: a slot a\n"
    "late WRITE may still land in). One summary line per kind and peer (count,\n"
    "oldest, youngest), then the oldest items (all of them with --all), and the\n"
    "force-release count (items that reached the hold cap).\n"
    "Exit 0 whether or not anything is held; 1 if the node cannot be read.\n";

typedef struct held_row {
    char kind[16], what[48], peer[256];
    uint64_t age;
} held_row_t;

static int held_cmp(const void *a, const void *b)
{
    const held_row_t *x = a, *y = b;
    int k = strcmp(x->kind, y->kind);
    if (k != 0)
        return k;
    return x->age < y->age ? 1 : x->age > y->age ? -1 : 0;
}

static int held_age_cmp(const void *a, const void *b)
{
    const held_row_t *x = a, *y = b;
    return x->age < y->age ? 1 : x->age > y->age ? -1 : 0;
}

static size_t parse_held(char *body, held_row_t *rows, size_t cap)
{
    size_t n = 0;
    for (char *save = NULL, *l = strtok_r(body, "\n", &save); l && n < cap;
         l = strtok_r(NULL, "\n", &save)) {
        held_row_t *r = &rows[n];
        char v[32];
        if (sscanf(l, "%15s", r->kind) != 1)
            continue;
        if (cli_kv(l, "id", v, sizeof(v)) == 0)
            snprintf(r->what, sizeof(r->what), "id %s", v);
        else if (cli_kv(l, "slot", v, sizeof(v)) == 0)
            snprintf(r->what, sizeof(r->what), "slot %s", v);
        else
            snprintf(r->what, sizeof(r->what), "-");
        if (cli_kv(l, "peer", r->peer, sizeof(r->peer)) != 0)
            snprintf(r->peer, sizeof(r->peer), "?");
        r->age = 0;
        cli_kv_u64(l, "age_ms", &r->age);
        n++;
    }
    qsort(rows, n, sizeof(*rows), held_cmp);
    return n;
}

/* One line per (kind, peer): rows are sorted by kind then age, so a group's
 * first row is its oldest. */
static void print_held_groups(const held_row_t *rows, size_t n)
{
    printf("  %-12s %-22s %6s  %-10s %s\n", "KIND", "PEER", "COUNT", "OLDEST", "YOUNGEST");
    bool *done = calloc(n ? n : 1, sizeof(bool));
    for (size_t i = 0; done && i < n; i++) {
        if (done[i])
            continue;
        size_t cnt = 0;
        uint64_t young = rows[i].age;
        for (size_t j = i; j < n; j++)
            if (!done[j] && !strcmp(rows[j].kind, rows[i].kind) && !strcmp(rows[j].peer, rows[i].peer)) {
                done[j] = true;
                cnt++;
                young = rows[j].age < young ? rows[j].age : young;
            }
        char a1[32], a2[32];
        fmt_age(rows[i].age, a1, sizeof(a1));
        fmt_age(young, a2, sizeof(a2));
        printf("  %-12s %-22s %6zu  %-10s %s\n", rows[i].kind, rows[i].peer, cnt, a1, a2);
    }
    free(done);
}

static void print_held_items(held_row_t *rows, size_t n, bool all)
{
    enum { SHOWN = 10 };
    held_row_t *by_age = malloc((n ? n : 1) * sizeof(*by_age));
    if (by_age == NULL)
        return;
    memcpy(by_age, rows, n * sizeof(*rows));
    qsort(by_age, n, sizeof(*by_age), held_age_cmp);
    size_t lim = all || n <= SHOWN ? n : SHOWN;
    printf("  %s:\n", all || n <= SHOWN ? "items, oldest first" : "oldest items (--all for every one)");
    for (size_t i = 0; i < lim; i++) {
        char age[32];
        fmt_age(by_age[i].age, age, sizeof(age));
        printf("    %-12s %-12s %-22s %s\n", by_age[i].kind, by_age[i].what, by_age[i].peer, age);
    }
    if (lim < n)
        printf("    ... %zu more\n", n - lim);
    free(by_age);
}

static int cmd_held(int argc, char **argv)
{
    const char *addr;
    bool all = false;
    int tmo, rc = parse_op_args("held", g_held_help, argc, argv, &addr, &tmo, &all);
    if (rc >= 0)
        return rc;
    char err[512], *body = NULL;
    if (cli_http_call(addr, "GET", "/held", tmo, &body, err, sizeof(err)) != 0) {
        fprintf(stderr, "kvpeer: %s\n", err);
        return CLI_EXIT_FAIL;
    }
    enum { CAP = 1 << 16 };
    held_row_t *rows = calloc(CAP, sizeof(*rows));
    if (rows == NULL) {
        free(body);
        return CLI_EXIT_FAIL;
    }
    size_t n = parse_held(body, rows, CAP), nret = 0;
    for (size_t i = 0; i < n; i++)
        nret += strcmp(rows[i].kind, "retained") == 0;
    printf("held on %s: %zu retained transfer(s), %zu quarantined/suspect slot(s)\n", addr, nret,
           n - nret);
    if (n > 0) {
        print_held_groups(rows, n);
        print_held_items(rows, n, all);
    }
    cli_metrics_t m;
    if (cli_scrape(addr, &m, err, sizeof(err)) == 0) {
        printf("force releases so far (items that reached the hold cap): %.0f\n",
               cli_metric(&m, "kvpeer_force_releases_total", NULL));
        cli_metrics_free(&m);
    }
    free(rows);
    free(body);
    return CLI_EXIT_OK;
}

/* ------------------------------------------------------------------- stat */

static const char *g_stat_help =
    "usage: kvpeer stat [--timeout MS] HOST:PORT\n"
    "Compact summary of one node from its /metrics and /peers: slots by state,\n"
    "pins, sessions, loads in flight, traffic, lookups and hit rate, retained\n"
    "transfers, quarantined slots, force releases, checksum mismatches and other\n"
    "error counters, then one line per peer with its data path and RTT.\n";

#define M(name) cli_metric(&m, "kvpeer_" name, NULL)
#define ML(name, lab) cli_metric(&m, "kvpeer_" name, lab)

static void print_stat_body(const cli_metrics_t *mp)
{
    const cli_metrics_t m = *mp;
    char bin[32], bout[32];
    fmt_bytes(M("bytes_in_total"), bin, sizeof(bin));
    fmt_bytes(M("bytes_out_total"), bout, sizeof(bout));
    double hit = ML("lookups_total", "result=hit"), miss = ML("lookups_total", "result=miss");
    double pend = ML("lookups_total", "result=pending"), lat_n = M("transfer_latency_seconds_count");
    printf("slots     free %.0f  filling %.0f  ready %.0f  quarantined %.0f  suspect %.0f   pins %.0f\n",
           ML("slots", "state=free"), ML("slots", "state=filling"), ML("slots", "state=ready"),
           ML("slots", "state=quarantined"), ML("slots", "state=suspect"), M("pins"));
    printf("sessions  ready %.0f  handshaking %.0f   loads in flight %.0f\n",
           ML("sessions", "state=ready"), ML("sessions", "state=handshaking"), M("loads_inflight"));
    printf("traffic   in %.0f blocks / %s   out %.0f blocks / %s", M("blocks_in_total"), bin,
           M("blocks_out_total"), bout);
    if (lat_n > 0)
        printf("   transfer latency avg %.0f us", M("transfer_latency_seconds_sum") / lat_n * 1e6);
    printf("\nlookups   hit %.0f  miss %.0f  pending %.0f", hit, miss, pend);
    if (hit + miss > 0)
        printf("  (hit rate %.1f%%)", 100.0 * hit / (hit + miss));
    printf("   fetches ok %.0f  failed %.0f  aborted %.0f\n", ML("fetches_total", "result=ok"),
           ML("fetches_total", "result=failed"), ML("fetches_total", "result=aborted"));
    printf("held      retained %.0f  quarantined %.0f   force releases %.0f\n",
           M("retained_transfers"), M("quarantined_slots"), M("force_releases_total"));
    printf("errors    checksum mismatches %.0f  stale frames %.0f  protocol errors %.0f  peers down "
           "%.0f  probations %.0f  evictions %.0f\n",
           M("checksum_mismatches_total"), M("stale_frames_total"), M("protocol_errors_total"),
           M("peers_down_total"), M("probations_total"), M("evictions_total"));
}

static int cmd_stat(int argc, char **argv)
{
    const char *addr;
    int tmo, rc = parse_op_args("stat", g_stat_help, argc, argv, &addr, &tmo, NULL);
    if (rc >= 0)
        return rc;
    char err[512];
    cli_metrics_t m;
    if (cli_scrape(addr, &m, err, sizeof(err)) != 0) {
        fprintf(stderr, "kvpeer: %s\n", err);
        return CLI_EXIT_FAIL;
    }
    printf("node %s  %s\n", addr, M("up") > 0 ? "up" : "NOT UP");
    print_stat_body(&m);
    cli_metrics_free(&m);
    printf("peers\n");
    return print_peers(addr, tmo) < 0 ? CLI_EXIT_FAIL : CLI_EXIT_OK;
}

/* ------------------------------------------------------- admin verbs */

/* --timeout MS, then exactly `npos` positional arguments (argv[optind..]). */
static int parse_verb_args(const char *cmd, const char *help, int argc, char **argv, int npos,
                           int *timeout_ms)
{
    int rc = parse_flags(cmd, help, argc, argv, 60000, 3600000, timeout_ms, NULL);
    if (rc >= 0)
        return rc;
    if (argc - optind != npos) {
        fputs(help, stderr);
        return CLI_EXIT_USAGE;
    }
    return -1;
}

static int check_http_addr(const char *cmd, const char *addr)
{
    if (strchr(addr, ':') == NULL)
        return usage_error(cmd, "bad address '%s' (want HOST:PORT of kvpeerd --http)", addr);
    return -1;
}

/* POST an /admin/ path, print the answer; 0 / 1 like every command. */
static int admin_post_print(const char *addr, const char *path, int timeout_ms)
{
    char err[512], *body = NULL;
    if (cli_http_call(addr, "POST", path, timeout_ms, &body, err, sizeof(err)) != 0) {
        fprintf(stderr, "kvpeer: %s%s\n", err,
                strstr(err, "HTTP 403")   ? " (start kvpeerd with --admin)"
                : strstr(err, "HTTP 401") ? " (set KVPEER_ADMIN_TOKEN_FILE to kvpeerd's "
                                            "admin_token_file)"
                                          : "");
        return CLI_EXIT_FAIL;
    }
    fputs(body, stdout);
    free(body);
    return CLI_EXIT_OK;
}

static const char *g_peer_help =
    "usage: kvpeer peer [--timeout MS] add|remove HOST:PORT PEER\n"
    "Ask the node at HOST:PORT (kvpeerd --http, started with --admin) to want a\n"
    "session with PEER (its control address, host:port or [v6]:port; redialled\n"
    "with backoff) or to close it and stop redialling. `kvpeer peers` shows the\n"
    "state and the last error of every peer.\n";

static int cmd_peer(int argc, char **argv)
{
    int tmo, rc = parse_verb_args("peer", g_peer_help, argc, argv, 3, &tmo);
    if (rc >= 0)
        return rc;
    const char *verb = argv[0 + optind], *addr = argv[1 + optind], *peer = argv[2 + optind];
    if ((rc = check_http_addr("peer", addr)) >= 0)
        return rc;
    if (strcmp(verb, "add") != 0 && strcmp(verb, "remove") != 0)
        return usage_error("peer", "unknown verb '%s' (add or remove)", verb);
    char path[600];
    snprintf(path, sizeof(path), "/admin/peer?%s=%s", verb, peer);
    return admin_post_print(addr, path, tmo);
}

static const char *g_fetch_help =
    "usage: kvpeer fetch [--timeout MS] HOST:PORT PEER FIRST COUNT [REQUEST]\n"
    "Make the node at HOST:PORT (kvpeerd --http, started with --admin) look up\n"
    "and fetch the synthetic blocks FIRST..FIRST+COUNT-1 (as `kvpeer put` or the\n"
    "demo writes them) from PEER; prints hits, blocks loaded and timings.\n";

static const char *g_put_help =
    "usage: kvpeer put [--timeout MS] HOST:PORT FIRST COUNT\n"
    "Write the synthetic blocks FIRST..FIRST+COUNT-1 into the node at HOST:PORT\n"
    "(kvpeerd --http, started with --admin): test and demo data.\n";

static bool all_digits(const char *s)
{
    return s[0] != '\0' && strspn(s, "0123456789") == strlen(s);
}

static int cmd_fetch(int argc, char **argv)
{
    int tmo, n = argc - 1, rc;
    bool with_req = false;
    for (int i = 1; i < argc; i++) /* positional count: 4, or 5 with REQUEST */
        if (argv[i][0] == '-' && strcmp(argv[i], "--timeout") == 0)
            n -= 2;
    with_req = n == 5;
    rc = parse_verb_args("fetch", g_fetch_help, argc, argv, with_req ? 5 : 4, &tmo);
    if (rc >= 0)
        return rc;
    char **a = argv + optind;
    if ((rc = check_http_addr("fetch", a[0])) >= 0)
        return rc;
    if (!all_digits(a[2]) || !all_digits(a[3]) || (with_req && !all_digits(a[4])))
        return usage_error("fetch", "%s", "FIRST, COUNT and REQUEST are numbers");
    char path[700];
    snprintf(path, sizeof(path), "/admin/fetch?peer=%s&first=%s&count=%s&request=%s&timeout_ms=%d",
             a[1], a[2], a[3], with_req ? a[4] : "1", tmo);
    return admin_post_print(a[0], path, tmo + 5000);
}

static int cmd_put(int argc, char **argv)
{
    int tmo, rc = parse_verb_args("put", g_put_help, argc, argv, 3, &tmo);
    if (rc >= 0)
        return rc;
    char **a = argv + optind;
    if ((rc = check_http_addr("put", a[0])) >= 0)
        return rc;
    if (!all_digits(a[1]) || !all_digits(a[2]))
        return usage_error("put", "%s", "FIRST and COUNT are numbers");
    char path[300];
    snprintf(path, sizeof(path), "/admin/put?first=%s&count=%s", a[1], a[2]);
    return admin_post_print(a[0], path, tmo);
}

/* ------------------------------------------------------------------- main */

typedef struct command {
    const char *name;
    int (*fn)(int argc, char **argv);
} command_t;

static const command_t g_commands[] = {
    {"demo", cli_cmd_demo}, {"bench", cli_cmd_bench}, {"stat", cmd_stat},
    {"held", cmd_held},     {"peers", cmd_peers}, {"peer", cmd_peer},
    {"fetch", cmd_fetch},   {"put", cmd_put},
};

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(g_top_usage, stderr);
        return CLI_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0 ||
        strcmp(argv[1], "version") == 0) {
        printf("kvpeer %s\n", KVP_VERSION_STRING);
        return CLI_EXIT_OK;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        fputs(g_top_usage, stdout);
        return CLI_EXIT_OK;
    }
    for (size_t i = 0; i < sizeof(g_commands) / sizeof(g_commands[0]); i++)
        if (strcmp(argv[1], g_commands[i].name) == 0)
            return g_commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "kvpeer: unknown command '%s'\n\n%s", argv[1], g_top_usage);
    return CLI_EXIT_USAGE;
}
