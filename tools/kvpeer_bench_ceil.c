/*
 * kvpeer_bench_ceil.c -- the ceilings `kvpeer bench` compares kvpeer with:
 * single-core cold memcpy over a region larger than the LLC, `ucx_perftest
 * -t ucp_put_bw` (server + client on 127.0.0.1; it reuses one destination
 * buffer, so on shm it overstates slot-cycled traffic), and the raw
 * ucp_put_nbx ceiling measured by bench/transport/ucx_bench when that
 * binary is in the build tree. Plus the CSV and gnuplot outputs.
 */
#include "kvpeer_bench.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------ table */

bench_row_t *bench_row_add(bench_table_t *t, const char *kind, const char *path, const char *cks,
                           uint32_t bs)
{
    if (t->nrows >= BENCH_MAX_ROWS)
        return NULL;
    bench_row_t *r = &t->rows[t->nrows++];
    memset(r, 0, sizeof(*r));
    snprintf(r->kind, sizeof(r->kind), "%s", kind);
    snprintf(r->path, sizeof(r->path), "%s", path);
    snprintf(r->cks, sizeof(r->cks), "%s", cks);
    r->block_size = bs;
    return r;
}

const bench_row_t *bench_row_find(const bench_table_t *t, const char *kind, const char *path,
                                  const char *cks, uint32_t bs)
{
    for (int i = 0; i < t->nrows; i++) {
        const bench_row_t *r = &t->rows[i];
        if (!strcmp(r->kind, kind) && !strcmp(r->path, path) && !strcmp(r->cks, cks) &&
            r->block_size == bs && r->n > 0)
            return r;
    }
    return NULL;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double bench_median(const double *v, int n)
{
    double s[BENCH_MAX_RUNS];
    if (n <= 0)
        return 0;
    memcpy(s, v, sizeof(double) * (size_t)n);
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

double bench_percentile(double *v, int n, double p)
{
    if (n <= 0)
        return 0;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    int i = (int)(p / 100.0 * (double)n + 0.5) - 1;
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

/* ------------------------------------------------------------ memcpy */

/* One pass over a region larger than the LLC, one block-sized memcpy at a
 * time: every source and destination byte comes from / goes to DRAM. */
static double memcpy_pass(uint8_t *dst, const uint8_t *src, uint64_t len, uint32_t bs)
{
    uint64_t t0 = cli_now_ns();
    for (uint64_t off = 0; off + bs <= len; off += bs)
        memcpy(dst + off, src + off, bs);
    double secs = (double)(cli_now_ns() - t0) / 1e9;
    __asm__ volatile("" ::: "memory");
    return (double)(len - len % bs) / secs / 1e9;
}

void bench_memcpy(const bench_opts_t *o, bench_table_t *t)
{
    uint64_t len = o->region;
    uint8_t *src = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t *dst = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (src == MAP_FAILED || dst == MAP_FAILED) {
        fprintf(stderr, "kvpeer bench: memcpy: cannot map 2 x %llu MiB\n",
                (unsigned long long)(len >> 20));
        goto out;
    }
    memset(src, 0x5a, len); /* fault every page in before timing */
    memset(dst, 0xa5, len);
    bench_row_t *rows[BENCH_MAX_SIZES];
    for (int s = 0; s < o->nsizes; s++)
        rows[s] = bench_row_add(t, "memcpy", "mem", "-", o->sizes[s]);
    for (int r = 0; r < o->runs; r++) /* alternate the sizes run by run */
        for (int s = 0; s < o->nsizes; s++)
            if (rows[s])
                rows[s]->v[rows[s]->n++] = memcpy_pass(dst, src, len, o->sizes[s]);
    for (int s = 0; s < o->nsizes; s++)
        if (rows[s]) {
            rows[s]->median = bench_median(rows[s]->v, rows[s]->n);
            snprintf(rows[s]->note, sizeof(rows[s]->note), "single core, %llu MiB region",
                     (unsigned long long)(len >> 20));
        }
out:
    if (src != MAP_FAILED)
        munmap(src, len);
    if (dst != MAP_FAILED)
        munmap(dst, len);
}

/* ------------------------------------------------------------ ucx_perftest */

/* Run server + client once; GB/s from the client's "Final:" line, or -1. */
static double perftest_once(const char *tls, uint32_t bs, long iters)
{
    char port[16], sz[16], it[24], wu[24], outp[PATH_MAX];
    int p = cli_free_port();
    snprintf(port, sizeof(port), "%d", p);
    snprintf(sz, sizeof(sz), "%u", bs);
    snprintf(it, sizeof(it), "%ld", iters);
    snprintf(wu, sizeof(wu), "%ld", iters / 10 + 10); /* default warm-up: 10000 iterations */
    snprintf(outp, sizeof(outp), "/tmp/kvpeer-perftest.%d.txt", (int)getpid());
    char tlsenv[64];
    snprintf(tlsenv, sizeof(tlsenv), "UCX_TLS=%s", tls);
    char *env[] = {tlsenv[8] ? tlsenv : NULL, NULL};
    char *srv[] = {"/usr/bin/ucx_perftest", "-t", "ucp_put_bw", "-s", sz, "-n", it, "-w", wu, "-p", port, NULL};
    char *cli[] = {"/usr/bin/ucx_perftest", "127.0.0.1", "-t", "ucp_put_bw", "-s", sz, "-n", it,
                   "-w", wu, "-p", port, NULL};
    unlink(outp);
    pid_t ps = cli_spawn(srv, env, "/dev/null");
    if (ps < 0)
        return -1;
    cli_sleep_ms(200); /* the server binds */
    pid_t pc = cli_spawn(cli, env, outp);
    int st = 0;
    if (pc < 0 || cli_wait(pc, 60000, &st) != 1)
        cli_kill_reap(pc);
    if (cli_wait(ps, 5000, NULL) != 1)
        cli_kill_reap(ps);
    double gbps = -1;
    FILE *f = fopen(outp, "r");
    char line[512];
    while (f && fgets(line, sizeof(line), f)) {
        double a[7];
        if (sscanf(line, " Final: %lf %lf %lf %lf %lf %lf", &a[0], &a[1], &a[2], &a[3], &a[4],
                   &a[5]) == 6)
            gbps = a[5] * 1048576.0 / 1e9; /* perftest's MB/s are MiB/s */
    }
    if (f)
        fclose(f);
    unlink(outp);
    return gbps;
}

void bench_perftest(const bench_opts_t *o, bench_table_t *t)
{
    if (access("/usr/bin/ucx_perftest", X_OK) != 0) {
        printf("ucx_perftest: not installed (Debian ucx-utils)\n");
        return;
    }
    const char *paths[2] = {"shm", "tcp"}, *tls[2] = {"", "tcp"};
    bool on[2] = {o->shm, o->tcp};
    for (int p = 0; p < 2; p++) {
        /* tcp loopback puts run at tens of MB/s here: smaller quick volume */
        uint64_t bytes = p == 0 ? (o->quick ? 16ull << 20 : 1ull << 30)
                                : (o->quick ? 4ull << 20 : 128ull << 20);
        if (!on[p])
            continue;
        bench_row_t *rows[BENCH_MAX_SIZES];
        for (int s = 0; s < o->nsizes; s++)
            rows[s] = bench_row_add(t, "perftest", paths[p], "-", o->sizes[s]);
        for (int r = 0; r < o->runs; r++)
            for (int s = 0; s < o->nsizes; s++) {
                long it = (long)(bytes / o->sizes[s]);
                long min_it = o->quick ? 10 : 100;
                double g = perftest_once(tls[p], o->sizes[s], it < min_it ? min_it : it);
                if (rows[s] && g > 0)
                    rows[s]->v[rows[s]->n++] = g;
            }
        for (int s = 0; s < o->nsizes; s++)
            if (rows[s]) {
                rows[s]->median = bench_median(rows[s]->v, rows[s]->n);
                snprintf(rows[s]->note, sizeof(rows[s]->note), "%s",
                         p == 0 ? "reuses one cached buffer: overstates shm" : "UCX_TLS=tcp");
            }
    }
}

/* ------------------------------------------------------------ raw ceiling */

/* Parse `shm|tcp <KiB> KiB  D=<d>  ours <x> GB/s  raw <y> GB/s ...`, keep the
 * best raw figure per (path, size): the ceiling. */
static void raw_parse(FILE *f, bench_table_t *t)
{
    char line[512], path[8];
    unsigned kib, d;
    double ours, raw;
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "%7s %u KiB D=%u ours %lf GB/s raw %lf GB/s", path, &kib, &d, &ours,
                   &raw) != 5)
            continue;
        bench_row_t *r = (bench_row_t *)bench_row_find(t, "raw", path, "-", kib * 1024u);
        if (r == NULL) {
            r = bench_row_add(t, "raw", path, "-", kib * 1024u);
            if (r == NULL)
                continue;
            r->n = 1;
            r->v[0] = r->median = raw;
            snprintf(r->note, sizeof(r->note), "ucx_bench best batch D=%u", d);
        } else if (raw > r->median) {
            r->v[0] = r->median = raw;
            snprintf(r->note, sizeof(r->note), "ucx_bench best batch D=%u", d);
        }
    }
}

void bench_raw_ucx(const bench_opts_t *o, bench_table_t *t)
{
    char bin[PATH_MAX], outp[PATH_MAX], mib[24], reps[16], secs[16];
    if (cli_find_sibling("../bench/transport/ucx_bench", bin, sizeof(bin)) != 0) {
        snprintf(t->raw_note, sizeof(t->raw_note), "raw ceiling: not available "
                 "(bench/transport/ucx_bench not built; `make release`)");
        return;
    }
    snprintf(outp, sizeof(outp), "/tmp/kvpeer-ucxbench.%d.txt", (int)getpid());
    /* --quick: a 64 MiB region and 50 ms windows keep ucx_bench near 20 s */
    uint64_t region_mib = o->region >> 20;
    snprintf(mib, sizeof(mib), "%llu",
             (unsigned long long)(o->quick && region_mib > 64 ? 64 : region_mib));
    snprintf(reps, sizeof(reps), "%d", o->quick ? 2 : o->runs > 16 ? 16 : o->runs);
    snprintf(secs, sizeof(secs), "%s", o->quick ? "0.05" : "0.3");
    char *argv[14] = {bin, "--no-perftest", "--region-mib", mib, "--reps", reps, "--secs", secs};
    int n = 8;
    argv[n++] = "--path";
    /* --quick: the shm ceiling only (ucx_bench's tcp half costs ~15 s) */
    argv[n++] = o->shm && (o->quick || !o->tcp) ? "shm" : o->shm ? "both" : "tcp";
    if (o->quick)
        argv[n++] = "--quick";
    argv[n] = NULL;
    unlink(outp);
    pid_t pid = cli_spawn(argv, NULL, outp);
    int st = 0;
    /* --quick keeps its promise of < 60 s: ucx_bench is cut at 15 s and
     * whatever rows it printed by then are used */
    int limit_ms = o->quick ? 15000 : 600000;
    bool cut = false;
    if (pid < 0)
        return;
    if (cli_wait(pid, limit_ms, &st) != 1) {
        cli_kill_reap(pid);
        cut = true;
    }
    FILE *f = fopen(outp, "r");
    if (f) {
        raw_parse(f, t);
        fclose(f);
    }
    unlink(outp);
    if (cut)
        snprintf(t->raw_note, sizeof(t->raw_note),
                 "raw ceiling: bench/transport/ucx_bench %scut at %d s (rows printed by then)",
                 o->quick && o->shm ? "--quick, shm only, " : "", limit_ms / 1000);
    else
        snprintf(t->raw_note, sizeof(t->raw_note), "raw ceiling: bench/transport/ucx_bench %s(exit %d)",
                 o->quick && o->shm ? "--quick, shm only " : "",
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

/* ------------------------------------------------------------ outputs */

static void write_csv(const char *path, const bench_table_t *t)
{
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return;
    fprintf(f, "kind,path,block_size,checksums,run,value,unit,median,note\n");
    for (int i = 0; i < t->nrows; i++) {
        const bench_row_t *r = &t->rows[i];
        for (int k = 0; k < r->n; k++)
            fprintf(f, "%s,%s,%u,%s,%d,%.4f,GB/s,%.4f,\"%s\"\n", r->kind, r->path, r->block_size,
                    r->cks, k + 1, r->v[k], r->median, r->note);
    }
    if (t->lookup_n > 0)
        fprintf(f, "lookup64,shm,16384,-,p50,%.1f,us,%.1f,\"%d lookups of 64 keys\"\n"
                   "lookup64,shm,16384,-,p99,%.1f,us,%.1f,\"\"\n",
                t->lookup_p50_us, t->lookup_p50_us, t->lookup_n, t->lookup_p99_us,
                t->lookup_p99_us);
    if (t->setup_n > 0)
        fprintf(f, "session_setup,shm,-,-,median,%.2f,ms,%.2f,\"%d add->ready\"\n",
                t->setup_ms_median, t->setup_ms_median, t->setup_n);
    fclose(f);
}

/* gnuplot data: one block per series (index i), x = KiB, y = median GB/s. */
static int write_dat(const char *path, const bench_table_t *t, char titles[][64], int cap)
{
    FILE *f = fopen(path, "w");
    int ns = 0;
    if (f == NULL)
        return 0;
    bool done[BENCH_MAX_ROWS] = {false};
    for (int i = 0; i < t->nrows && ns < cap; i++) {
        const bench_row_t *a = &t->rows[i];
        if (done[i] || a->n == 0)
            continue;
        snprintf(titles[ns], 64, "%s %s%s%s", a->kind, a->path, strcmp(a->cks, "-") ? " cks " : "",
                 strcmp(a->cks, "-") ? a->cks : "");
        for (int j = i; j < t->nrows; j++) {
            const bench_row_t *b = &t->rows[j];
            if (!done[j] && b->n > 0 && !strcmp(a->kind, b->kind) && !strcmp(a->path, b->path) &&
                !strcmp(a->cks, b->cks)) {
                fprintf(f, "%u %.4f\n", b->block_size / 1024, b->median);
                done[j] = true;
            }
        }
        fprintf(f, "\n\n");
        ns++;
    }
    fclose(f);
    return ns;
}

static void write_plot(const bench_opts_t *o, const bench_table_t *t, const char *png)
{
    char dat[PATH_MAX + 16], gp[PATH_MAX + 16], titles[BENCH_MAX_ROWS][64];
    snprintf(dat, sizeof(dat), "%s/bench.dat", o->out);
    snprintf(gp, sizeof(gp), "%s/bench.gp", o->out);
    int ns = write_dat(dat, t, titles, BENCH_MAX_ROWS);
    FILE *f = fopen(gp, "w");
    if (f == NULL || ns == 0) {
        if (f)
            fclose(f);
        return;
    }
    fprintf(f, "set terminal png size 1100,700 noenhanced\nset output '%s'\n"
               "set title 'kvpeer bench: end-to-end fetch vs ceilings (medians)'\n"
               "set logscale xy\nset xlabel 'block size (KiB)'\nset ylabel 'GB/s'\n"
               "set key outside right\nset grid\nset linetype 9 lc rgb '#8b4513'\n"
               "set linetype 10 lc rgb '#000080'\nset linetype cycle 10\nplot ",
            png);
    for (int i = 0; i < ns; i++)
        fprintf(f, "%s'%s' index %d using 1:2 with linespoints lt %d lw 2 dt %d title '%s'",
                i ? ", " : "", dat, i, i % 10 + 1, strncmp(titles[i], "e2e", 3) ? 2 : 1,
                titles[i]); /* ceilings dashed, kvpeer solid */
    fprintf(f, "\n");
    fclose(f);
    char *argv[] = {"/usr/bin/gnuplot", gp, NULL};
    pid_t pid = access(argv[0], X_OK) == 0 ? cli_spawn(argv, NULL, "/dev/null") : -1;
    int st = 0;
    if (pid < 0 || cli_wait(pid, 30000, &st) != 1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        cli_kill_reap(pid);
        printf("plot: gnuplot not available or failed (Debian gnuplot-nox); data in %s\n", dat);
        return;
    }
    printf("plot: %s\n", png);
}

int bench_mkdirs(const char *path)
{
    char buf[PATH_MAX];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char *p = buf + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            mkdir(buf, 0755);
            *p = '/';
        }
    mkdir(buf, 0755);
    return access(buf, W_OK);
}

void bench_write_outputs(const bench_opts_t *o, const bench_table_t *t)
{
    char csv[PATH_MAX + 16], png[PATH_MAX + 16];
    bench_mkdirs(o->out);
    snprintf(csv, sizeof(csv), "%s/bench.csv", o->out);
    snprintf(png, sizeof(png), "%s/bench.png", o->out);
    write_csv(csv, t);
    printf("csv: %s\n", csv);
    if (o->plot)
        write_plot(o, t, png);
}
