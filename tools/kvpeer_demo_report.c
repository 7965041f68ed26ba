/*
 * kvpeer_demo_report.c -- the demo's final report and verdict. Every count
 * below is read from the nodes' /metrics (summed over the incarnations of a
 * restarted node) or from the /admin/verify re-read; the demo's own
 * observations are only the fault timings and the per-phase checks.
 */
#include "kvpeer_demo.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void demo_check(demo_result_t *r, bool pass, const char *what, const char *fmt, ...)
{
    if (r->nchecks >= DEMO_MAX_CHECKS)
        return;
    demo_check_t *k = &r->checks[r->nchecks++];
    va_list ap;
    k->pass = pass;
    snprintf(k->what, sizeof(k->what), "%s", what);
    va_start(ap, fmt);
    vsnprintf(k->detail, sizeof(k->detail), fmt, ap);
    va_end(ap);
}

static double sum_total(const demo_cluster_t *c, const char *name, const char *match)
{
    double v = 0;
    for (int i = 0; i < DEMO_NODES; i++)
        v += demo_total(&c->n[i], name, match);
    return v;
}

static double sum_gauge(const demo_cluster_t *c, const char *name)
{
    double v = 0;
    for (int i = 0; i < DEMO_NODES; i++)
        v += demo_gauge(&c->n[i], name, NULL);
    return v;
}

/* "B->A direct-shm (rtt 80 us)" for each kvpeer_peer_info sample. */
static void print_paths(const demo_cluster_t *c)
{
    int printed = 0;
    printf("  data path       ");
    for (int i = 0; i < DEMO_NODES; i++) {
        const demo_node_t *n = &c->n[i];
        if (!n->has_cur)
            continue;
        for (size_t k = 0; k < n->cur.n; k++) {
            const cli_sample_t *s = &n->cur.s[k];
            char peer[64] = "?", path[32] = "?", who = '?', m[96];
            if (strcmp(s->name, "kvpeer_peer_info") != 0)
                continue;
            cli_label(s->labels, "peer", peer, sizeof(peer));
            cli_label(s->labels, "data_path", path, sizeof(path));
            for (int j = 0; j < DEMO_NODES; j++)
                if (strcmp(peer, c->n[j].ctl) == 0)
                    who = c->n[j].name;
            snprintf(m, sizeof(m), "peer=\"%s\"", peer);
            double rtt = cli_metric(&n->cur, "kvpeer_peer_rtt_seconds", m);
            printf("%s%c->%c %s (rtt %.0f us)", printed++ ? ", " : "", n->name, who, path,
                   rtt * 1e6);
        }
    }
    printf("%s\n", printed ? "" : "(no peer_info samples)");
}

static void report_checks(const demo_cluster_t *c, demo_result_t *r)
{
    double forced = sum_total(c, "kvpeer_force_releases_total", NULL);
    uint64_t bad = 0;
    for (int i = 0; i < DEMO_NODES; i++)
        bad += r->verify_bad[i];
    demo_check(r, bad == 0, "no corrupt committed block (verify re-read)",
               "bad blocks: A %llu, B %llu, C %llu", (unsigned long long)r->verify_bad[0],
               (unsigned long long)r->verify_bad[1], (unsigned long long)r->verify_bad[2]);
    demo_check(r, forced >= 1, "hold cap reached and force-released (loudly)",
               "%.0f force releases (a slot with no proof must reach the cap)", forced);
    bool clean = true;
    for (int i = 0; i < DEMO_NODES; i++)
        clean = clean && r->exit_status[i] == 0;
    demo_check(r, clean, "nodes exit cleanly on SIGTERM (bounded drain)",
               "exit status A %d, B %d, C %d", r->exit_status[0], r->exit_status[1],
               r->exit_status[2]);
}

static void report_figures(const demo_cluster_t *c, const demo_result_t *r)
{
    const demo_opts_t *o = c->o;
    double bin = sum_total(c, "kvpeer_blocks_in_total", NULL);
    double byin = sum_total(c, "kvpeer_bytes_in_total", NULL);
    double bout = sum_total(c, "kvpeer_blocks_out_total", NULL);
    double lat_s = sum_total(c, "kvpeer_transfer_latency_seconds_sum", NULL);
    double lat_n = sum_total(c, "kvpeer_transfer_latency_seconds_count", NULL);
    printf("  moved           %.0f blocks / %.1f MiB into consumers (B %.0f, C %.0f); "
           "A sent %.0f blocks over %d incarnation(s)\n",
           bin, byin / 1048576.0, demo_total(&c->n[1], "kvpeer_blocks_in_total", NULL),
           demo_total(&c->n[2], "kvpeer_blocks_in_total", NULL), bout, c->n[0].restarts + 1);
    printf("  throughput      %.2f GB/s (healthy phase: %.1f MiB in %.3f s, /metrics delta)",
           r->healthy_secs > 0 ? r->healthy_bytes / r->healthy_secs / 1e9 : 0.0,
           r->healthy_bytes / 1048576.0, r->healthy_secs);
    if (lat_n > 0)
        printf("; transfer latency avg %.0f us", lat_s / lat_n * 1e6);
    printf("\n  hit rate        %.1f%% (%.0f blocks committed by consumers / %llu keys they asked "
           "for); store lookups before verify: hit %.0f, miss %.0f\n",
           r->keys_requested ? 100.0 * bin / (double)r->keys_requested : 0.0, bin,
           (unsigned long long)r->keys_requested, r->pre_hits, r->pre_misses);
    printf("  fetches         ok %.0f, failed %.0f, aborted %.0f\n",
           sum_total(c, "kvpeer_fetches_total", "result=ok"),
           sum_total(c, "kvpeer_fetches_total", "result=failed"),
           sum_total(c, "kvpeer_fetches_total", "result=aborted"));
    printf("  fail fast       SIGKILL -> load failed %.1f ms; SIGSTOP -> %.1f ms; "
           "teardown -> %.1f ms (dead-after %u ms, load timeout %u ms)\n",
           r->kill_to_fail_ms, r->stop_to_fail_ms, r->remove_to_fail_ms, o->t.dead_after,
           o->t.load);
    printf("  held            now retained %.0f, quarantined %.0f; peak retained %.0f, "
           "quarantined %.0f\n",
           sum_gauge(c, "kvpeer_retained_transfers"), sum_gauge(c, "kvpeer_quarantined_slots"),
           r->peak_retained, r->peak_quarantined);
    printf("  force released  %.0f (hold cap %u ms)\n",
           sum_total(c, "kvpeer_force_releases_total", NULL), o->t.hold_cap);
    printf("  errors          checksum mismatches %.0f, stale frames %.0f, protocol errors %.0f, "
           "peers down %.0f, probations %.0f\n",
           sum_total(c, "kvpeer_checksum_mismatches_total", NULL),
           sum_total(c, "kvpeer_stale_frames_total", NULL),
           sum_total(c, "kvpeer_protocol_errors_total", NULL),
           sum_total(c, "kvpeer_peers_down_total", NULL),
           sum_total(c, "kvpeer_probations_total", NULL));
    printf("  verify          ");
    for (int i = 0; i < DEMO_NODES; i++)
        printf("%s%c present %llu bad %llu", i ? "; " : "", c->n[i].name,
               (unsigned long long)r->verify_present[i], (unsigned long long)r->verify_bad[i]);
    printf(" (byte-exact re-read)\n");
    print_paths(c);
}

int demo_report(demo_cluster_t *c, demo_result_t *r)
{
    report_checks(c, r);
    printf("\n================ kvpeer demo report (from /metrics + /admin/verify) ================\n");
    report_figures(c, r);
    if (r->corrupted_note[0])
        printf("  test switch     %s\n", r->corrupted_note);
    printf("  checks\n");
    int failed = 0;
    for (int i = 0; i < r->nchecks; i++) {
        const demo_check_t *k = &r->checks[i];
        failed += !k->pass;
        printf("    [%s] %-46s %s\n", k->pass ? " ok " : "FAIL", k->what, k->detail);
    }
    if (failed == 0) {
        printf("  verdict         PASS\n");
    } else {
        printf("  verdict         FAIL:");
        for (int i = 0, n = 0; i < r->nchecks; i++)
            if (!r->checks[i].pass)
                printf("%s %s", n++ ? ";" : "", r->checks[i].what);
        printf("\n");
    }
    printf("====================================================================================\n");
    fflush(stdout);
    return failed == 0 ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}
