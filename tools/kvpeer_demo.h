/*
 * kvpeer_demo.h -- internals of `kvpeer demo`: the three-node cluster
 * (kvpeer_demo_nodes.c), the scenario (kvpeer_demo.c) and the final report
 * (kvpeer_demo_report.c). Not library API.
 */
#ifndef KVPEER_DEMO_H
#define KVPEER_DEMO_H

#include "kvpeer_cli.h"

#include <limits.h>

enum { DEMO_NODES = 3, DEMO_MAX_INC = 8, DEMO_MAX_CHECKS = 24 };

/* Daemon timeouts (ms, before the time scale). Short so the demo's fault
 * outcomes and the hold cap all happen within seconds. */
typedef struct demo_timeouts {
    uint32_t heartbeat, dead_after, load, abort_ack, abort_resend, hold_cap;
    uint32_t lookup_pending, parked_demand, supply_pin, backoff_min, backoff_max, drain;
} demo_timeouts_t;

typedef struct demo_opts {
    uint32_t blocks;     /* prompt length on A */
    uint32_t block_size; /* bytes */
    uint32_t chunk;      /* blocks per fetch request */
    uint32_t fault_blocks, parked_blocks;
    bool quick, corrupt_one, keep_logs, verbose;
    char kvpeerd[PATH_MAX];
    char logdir[PATH_MAX];
    char token_file[PATH_MAX + 16]; /* the nodes' admin_token_file (issue 27) */
    demo_timeouts_t t; /* already multiplied by the time scale */
    unsigned scale;
} demo_opts_t;

/* One kvpeerd. hist[] holds the last /metrics scrape of every ended
 * incarnation (owned; freed by demo_cluster_free) so counters survive a
 * SIGKILL + restart; `cur` is the latest scrape of the running one. */
typedef struct demo_node {
    char name; /* 'A', 'B', 'C' */
    int ctl_port, http_port;
    char ctl[32], http[32], log[PATH_MAX + 16];
    pid_t pid;
    int restarts;
    bool stopped;
    cli_metrics_t hist[DEMO_MAX_INC];
    int nhist;
    cli_metrics_t cur;
    bool has_cur;
} demo_node_t;

typedef struct demo_cluster {
    demo_node_t n[DEMO_NODES];
    const demo_opts_t *o;
} demo_cluster_t;

/* Outcome of one /admin/fetch, as the daemon reported it. */
typedef struct demo_fetch {
    int ok_http;
    uint64_t hits, n_ok, status_code_neg, lookup_us, fetch_us;
    char status[64];
    uint64_t t_start_ns, t_end_ns;
    char err[256];
} demo_fetch_t;

/* One verdict check. */
typedef struct demo_check {
    char what[96];
    bool pass;
    char detail[192];
} demo_check_t;

/* Measurements the scenario hands to the report. The moved/rate/held/error
 * figures in the report come from scraped /metrics and /admin/verify; these
 * are only the fault timings the demo itself observes, phase windows, and
 * the checks of each fault's outcome. */
typedef struct demo_result {
    double kill_to_fail_ms, stop_to_fail_ms, remove_to_fail_ms;
    double healthy_bytes, healthy_secs;
    double peak_retained, peak_quarantined;
    uint64_t keys_requested;      /* input: keys the consumers asked A for */
    double pre_hits, pre_misses;  /* store lookups before the verify re-read */
    uint64_t verify_present[DEMO_NODES], verify_missing[DEMO_NODES], verify_bad[DEMO_NODES];
    uint64_t expect_present[DEMO_NODES];
    demo_check_t checks[DEMO_MAX_CHECKS];
    int nchecks;
    char corrupted_note[384];
    int exit_status[DEMO_NODES];
} demo_result_t;

/* ---- cluster (kvpeer_demo_nodes.c) ---- */
/* Slots of each node's region for these options. */
uint32_t demo_node_slots(const demo_opts_t *o);
int demo_cluster_start(demo_cluster_t *c, const demo_opts_t *o);
int demo_node_start(demo_cluster_t *c, int i);
int demo_node_wait_up(demo_cluster_t *c, int i, int timeout_ms);
/* Wait until node i's /peers shows `peer` ready (1) or gone/not ready (0). */
int demo_wait_peer_ready(demo_cluster_t *c, int i, const char *peer, int timeout_ms);
/* Scrape node i into cur; on an ended incarnation call demo_node_retire. */
int demo_node_scrape(demo_cluster_t *c, int i);
/* Move `cur` into hist (the incarnation ends: we are about to kill it). */
void demo_node_retire(demo_node_t *n);
/* SIGTERM every node, wait for the bounded drain; exit statuses into st. */
void demo_cluster_stop(demo_cluster_t *c, int st[DEMO_NODES]);
void demo_cluster_free(demo_cluster_t *c);
/* Counter summed over every incarnation (hist + cur). */
double demo_total(const demo_node_t *n, const char *name, const char *match);
/* Gauge of the current incarnation. */
double demo_gauge(const demo_node_t *n, const char *name, const char *match);

/* ---- admin calls (kvpeer_demo_nodes.c) ---- */
int demo_put(demo_node_t *n, uint32_t first, uint32_t count, char *err, size_t errcap);
/* Blocking /admin/fetch; always fills *f (f->ok_http = 0 on transport error). */
void demo_fetch(const demo_cluster_t *c, demo_node_t *n, const char *peer, uint32_t first,
                uint32_t count, uint64_t req, bool wait, demo_fetch_t *f);
int demo_finish(demo_node_t *n, uint64_t req);
int demo_peer_op(demo_node_t *n, const char *op, const char *peer, char *err, size_t errcap);
int demo_verify(demo_node_t *n, uint32_t first, uint32_t count, uint64_t out[3], char *err,
                size_t errcap);
int demo_corrupt(demo_node_t *n, uint32_t key, char *err, size_t errcap);

/* ---- report (kvpeer_demo_report.c) ---- */
void demo_check(demo_result_t *r, bool pass, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Print the final report from the scrapes; returns CLI_EXIT_OK on PASS. */
int demo_report(demo_cluster_t *c, demo_result_t *r);

/* Log a line of the demo's narrative on stdout (flushed). */
void demo_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* KVPEER_DEMO_H */
