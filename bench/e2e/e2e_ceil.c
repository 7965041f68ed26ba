/*
 * e2e_ceil.c -- what bench/e2e compares kvpeer with, measured in the same
 * run: single-thread cold memcpy with the same slot cycling, the raw UCX put
 * ceiling (bare ucp_put_nbx + one flush per batch) and ucx_perftest, both by
 * running bench/transport/ucx_bench; the raw TCP ping-pong client; the table,
 * the goal ratios, CSV and gnuplot output.
 */
#include "e2e.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------ ceilings */

static e2e_ceil_t *ceil_put(e2e_table_t *t, const char *kind, const char *path, uint32_t bs,
                            double gbps, const char *note)
{
    e2e_ceil_t *c = (e2e_ceil_t *)e2e_ceil_find(t, kind, path, bs);
    if (c == NULL) {
        if (t->nceil >= E2E_MAX_CEIL)
            return NULL;
        c = &t->ceil[t->nceil++];
        memset(c, 0, sizeof(*c));
        snprintf(c->kind, sizeof(c->kind), "%s", kind);
        snprintf(c->path, sizeof(c->path), "%s", path);
        c->bs = bs;
        c->gbps = -1;
    }
    if (gbps > c->gbps) { /* the best figure is the ceiling */
        c->gbps = gbps;
        snprintf(c->note, sizeof(c->note), "%s", note);
    }
    return c;
}

const e2e_ceil_t *e2e_ceil_find(const e2e_table_t *t, const char *kind, const char *path,
                                uint32_t bs)
{
    for (int i = 0; i < t->nceil; i++)
        if (!strcmp(t->ceil[i].kind, kind) && !strcmp(t->ceil[i].path, path) &&
            t->ceil[i].bs == bs)
            return &t->ceil[i];
    return NULL;
}

/* Two regions of the consumer's size (larger than the LLC), touched before
 * timing; source blocks in order, destinations stride-7 permuted. */
void e2e_memcpy(const e2e_opts_t *o, e2e_table_t *t)
{
    uint64_t len = o->region;
    uint8_t *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    uint8_t *b = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED || b == MAP_FAILED)
        goto out;
    memset(a, 1, len);
    memset(b, 2, len);
    for (int si = 0; si < o->nsizes; si++) {
        uint32_t bs = o->sizes[si], nbb = (uint32_t)(len / bs);
        uint64_t k = 0, bytes = 0;
        double t0 = e2e_now(), t1;
        do {
            for (int i = 0; i < 16; i++, k++)
                memcpy(b + (k * 7 % nbb) * bs, a + (k % nbb) * bs, bs);
            bytes += 16ull * bs;
            __asm__ volatile("" : : "r"(b) : "memory");
            t1 = e2e_now();
        } while (t1 - t0 < (o->quick ? 0.15 : 0.3));
        ceil_put(t, "memcpy", "mem", bs, (double)bytes / (t1 - t0) / 1e9, "single thread, cold");
    }
out:
    if (a != MAP_FAILED)
        munmap(a, len);
    if (b != MAP_FAILED)
        munmap(b, len);
}

/* Lines of ucx_bench:
 *   shm   256 KiB  D=16   ours   x GB/s  raw   y GB/s ...
 *   tcp   256 KiB  O=16   ucx_perftest ucp_put_bw   z GB/s ... */
static void ucx_parse(FILE *f, e2e_table_t *t)
{
    char line[512], path[8], note[64];
    unsigned kib, d;
    double ours, raw;
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "%7s %u KiB D=%u ours %lf GB/s raw %lf GB/s", path, &kib, &d, &ours,
                   &raw) == 5) {
            snprintf(note, sizeof(note), "ucx_bench, best batch (D=%u)", d);
            ceil_put(t, "raw", path, kib * 1024u, raw, note);
            ceil_put(t, "xport", path, kib * 1024u, ours, note);
        } else if (sscanf(line, "%7s %u KiB O=%u ucx_perftest ucp_put_bw %lf GB/s", path, &kib,
                          &d, &raw) == 4 && raw > 0) {
            snprintf(note, sizeof(note), "ucx_perftest -O %u%s", d,
                     strcmp(path, "shm") ? "" : " (one cached buffer)");
            ceil_put(t, "perftest", path, kib * 1024u, raw, note);
        }
    }
}

void e2e_ucx_ceiling(const e2e_opts_t *o, e2e_table_t *t)
{
    char bin[PATH_MAX + 32], outp[64], mib[24], sizes[128] = "", *slash;
    snprintf(bin, sizeof(bin), "%s", o->self);
    if ((slash = strrchr(bin, '/')) == NULL)
        return;
    snprintf(slash, sizeof(bin) - (size_t)(slash - bin), "/../transport/ucx_bench");
    if (access(bin, X_OK) != 0) {
        snprintf(t->ceil_note, sizeof(t->ceil_note),
                 "raw ceiling: %.120s not built (make release)", bin);
        return;
    }
    for (int i = 0; i < o->nsizes; i++) {
        size_t l = strlen(sizes);
        snprintf(sizes + l, sizeof(sizes) - l, "%s%u", i ? "," : "", o->sizes[i] / 1024);
    }
    snprintf(mib, sizeof(mib), "%llu", (unsigned long long)(o->region >> 20));
    snprintf(outp, sizeof(outp), "/tmp/kvpeer-e2e-ucxbench.%d.txt", (int)getpid());
    /* --quick first: its preset region is then overridden by ours */
    const char *path = o->shm && o->tcp ? "both" : o->shm ? "shm" : "tcp";
    char *argv[16];
    int n = 0;
    argv[n++] = bin;
    if (o->quick) {
        argv[n++] = "--quick";
        argv[n++] = "--secs";
        argv[n++] = "0.1";
    } else {
        argv[n++] = "--secs";
        argv[n++] = "0.2";
    }
    argv[n++] = "--reps";
    argv[n++] = "3";
    argv[n++] = "--region-mib";
    argv[n++] = mib;
    argv[n++] = "--sizes";
    argv[n++] = sizes;
    argv[n++] = "--path";
    argv[n++] = (char *)path;
    argv[n] = NULL;
    printf("ceilings:");
    for (int i = 0; i < n; i++)
        printf(" %s", argv[i]);
    printf("\n");
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(outp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0)
            _exit(127);
        dup2(fd, 1);
        execv(bin, argv);
        _exit(127);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        st = -1;
    FILE *f = fopen(outp, "r");
    if (f) {
        ucx_parse(f, t);
        fclose(f);
    }
    unlink(outp);
    snprintf(t->ceil_note, sizeof(t->ceil_note), "raw ceiling + ucx_perftest: bench/transport/"
             "ucx_bench%s (exit %d)", o->quick ? " --quick" : "",
             WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

/* ------------------------------------------------------------ ping-pong */

int e2e_pp_connect(int port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int one = 1, fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The header and the request go out in one send (like one framed message). */
double e2e_pp_round(int fd, uint32_t req, uint32_t resp)
{
    static uint8_t buf[1 << 16];
    uint32_t h[2] = {req, resp};
    if (req + 8 > sizeof(buf) || resp > sizeof(buf))
        return -1;
    memcpy(buf, h, 8);
    double t0 = e2e_now();
    if (!e2e_io_all(fd, buf, 8 + (size_t)req, true) || !e2e_io_all(fd, buf, resp, false))
        return -1;
    return (e2e_now() - t0) * 1e6;
}

/* ------------------------------------------------------------ report */

/* Best e2e GB/s at (path, bs, cks) with depth >= kmin. */
static const e2e_row_t *best_row(const e2e_table_t *t, const char *path, uint32_t bs, bool cks,
                                 uint32_t kmin, uint32_t keep)
{
    const e2e_row_t *b = NULL;
    for (int i = 0; i < t->nrows; i++) {
        const e2e_row_t *r = &t->rows[i];
        if (!strcmp(r->path, path) && r->bs == bs && r->cks == cks && r->depth >= kmin &&
            r->keep_ms == keep &&
            (!b || r->gbps > b->gbps))
            b = r;
    }
    return b;
}

static void ratio_rows(const e2e_opts_t *o, const e2e_table_t *t, FILE *f, uint32_t keep)
{
    static const char *paths[2] = {"shm", "tcp"};
    if (keep)
        fprintf(f, "\nDiagnostic (not the product's defaults): finished rounds kept %u ms:\n", keep);
    else
        fprintf(f, "\nGoal ratios (best e2e cell with K >= 4 vs the ceiling at the same block "
                   "size):\n");
    for (int p = 0; p < (keep ? 1 : 2); p++)
        for (int si = 0; si < o->nsizes; si++) {
            uint32_t bs = o->sizes[si];
            if (bs < (256u << 10))
                continue;
            const e2e_ceil_t *raw = e2e_ceil_find(t, "raw", paths[p], bs);
            const e2e_ceil_t *pt = e2e_ceil_find(t, "perftest", paths[p], bs);
            for (int c = 0; c < 2; c++) {
                const e2e_row_t *r = best_row(t, paths[p], bs, c == 1, 4, keep);
                if (!r)
                    continue;
                fprintf(f, "  %s %5u KiB cks %-3s e2e %6.3f GB/s (K=%u, %.0f MiB)", paths[p],
                        bs / 1024, c ? "on" : "off", r->gbps, r->depth,
                        (double)r->req / 1048576.0);
                if (raw && raw->gbps > 0)
                    fprintf(f, " | raw put %6.3f -> %.2fx (goal >= %.2f)", raw->gbps,
                            r->gbps / raw->gbps, c ? 0.75 : 0.9);
                else
                    fprintf(f, " | raw put: not measured");
                if (p == 1 && pt && pt->gbps > 0)
                    fprintf(f, " | ucx_perftest tcp %6.3f -> %.2fx (goal >= 0.9)", pt->gbps,
                            r->gbps / pt->gbps);
                fprintf(f, "\n");
            }
        }
    for (int i = 0; i < t->nlat; i++) {
        const e2e_lat_t *l = &t->lat[i];
        if ((l->keep_ms != 0) != (keep != 0))
            continue;
        fprintf(f, "  %s lookup p50 of %u keys %.1f us vs raw TCP ping-pong (%u/%u B) p50 %.1f us"
                   " -> %.2fx (goal <= 1.5)\n",
                l->path, l->nkeys, l->lookup_p50_us, l->req_bytes, l->resp_bytes, l->ping_p50_us,
                l->lookup_p50_us / l->ping_p50_us);
    }
}

void e2e_print_table(const e2e_opts_t *o, const e2e_table_t *t)
{
    printf("\n%-4s %-16s %7s %8s %3s %4s %8s %9s %9s %9s %8s %6s %6s %5s %s\n", "path",
           "data_path", "bs_KiB", "req_MiB", "K", "cks", "GB/s", "fetch/s", "p50_us", "p99_us",
           "cpu_s/GB", "x_raw", "x_mcpy", "load", "keep_ms");
    for (int i = 0; i < t->nrows; i++) {
        const e2e_row_t *r = &t->rows[i];
        const e2e_ceil_t *raw = e2e_ceil_find(t, "raw", r->path, r->bs);
        const e2e_ceil_t *mc = e2e_ceil_find(t, "memcpy", "mem", r->bs);
        printf("%-4s %-16s %7u %8.2f %3u %4s %8.3f %9.1f %9.0f %9.0f %8.3f %6.2f %6.2f %5.2f %s\n",
               r->path, r->data_path, r->bs / 1024, (double)r->req / 1048576.0, r->depth,
               r->cks ? "on" : "off", r->gbps, r->fetches_s, r->p50_us, r->p99_us,
               r->cpu_s_per_gb, raw && raw->gbps > 0 ? r->gbps / raw->gbps : 0,
               mc && mc->gbps > 0 ? r->gbps / mc->gbps : 0, r->load1,
               r->keep_ms ? "diag" : "dflt");
    }
    printf("\nCeilings measured in this run (%s):\n", t->ceil_note[0] ? t->ceil_note : "none");
    for (int i = 0; i < t->nceil; i++)
        printf("  %-8s %-4s %5u KiB %8.3f GB/s  %s\n", t->ceil[i].kind, t->ceil[i].path,
               t->ceil[i].bs / 1024, t->ceil[i].gbps, t->ceil[i].note);
    ratio_rows(o, t, stdout, 0);
    if (o->diag_keep_ms)
        ratio_rows(o, t, stdout, o->diag_keep_ms);
    printf("\nmachine: %s at start, %s at end (2 cores shared with other builds)\n", t->load_start,
           t->load_end);
}

static void write_csv(const char *path, const e2e_table_t *t)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    fprintf(f, "kind,path,data_path,block_size,req_bytes,depth,checksums,gbps,fetches_s,p50_us,"
               "p99_us,cpu_s_per_gb,bytes,errors,load1,note,keep_ms\n");
    for (int i = 0; i < t->nrows; i++) {
        const e2e_row_t *r = &t->rows[i];
        fprintf(f, "e2e,%s,%s,%u,%llu,%u,%s,%.4f,%.1f,%.1f,%.1f,%.4f,%llu,%llu,%.2f,,%u\n", r->path,
                r->data_path, r->bs, (unsigned long long)r->req, r->depth, r->cks ? "on" : "off",
                r->gbps, r->fetches_s, r->p50_us, r->p99_us, r->cpu_s_per_gb,
                (unsigned long long)r->bytes, (unsigned long long)r->errors, r->load1, r->keep_ms);
    }
    for (int i = 0; i < t->nceil; i++)
        fprintf(f, "%s,%s,,%u,,,,%.4f,,,,,,,,\"%s\"\n", t->ceil[i].kind, t->ceil[i].path,
                t->ceil[i].bs, t->ceil[i].gbps, t->ceil[i].note);
    for (int i = 0; i < t->nlat; i++) {
        const e2e_lat_t *l = &t->lat[i];
        fprintf(f, "lookup,%s,,,%u,1,,,,%.1f,%.1f,,,,,\"%u keys, %d samples\",%u\n", l->path,
                l->req_bytes, l->lookup_p50_us, l->lookup_p99_us, l->nkeys, l->n, l->keep_ms);
        fprintf(f, "tcp_pingpong,%s,,,%u,1,,,,%.1f,%.1f,,,,,\"response %u bytes\",%u\n", l->path,
                l->req_bytes, l->ping_p50_us, l->ping_p99_us, l->resp_bytes, l->keep_ms);
    }
    fclose(f);
    printf("csv: %s\n", path);
}

/* gnuplot data: per series one block "x y"; x = block size KiB. */
static int write_plot_data(const e2e_opts_t *o, const e2e_table_t *t, FILE *f, char titles[][64],
                           int cap)
{
    static const char *paths[2] = {"shm", "tcp"};
    int ns = 0;
    for (int p = 0; p < 2; p++)
        for (int c = 0; c < 2 && ns < cap; c++) {
            int pts = 0;
            for (int si = 0; si < o->nsizes; si++) {
                const e2e_row_t *r = best_row(t, paths[p], o->sizes[si], c == 1, 1, 0);
                if (r && ++pts)
                    fprintf(f, "%u %.4f\n", o->sizes[si] / 1024, r->gbps);
            }
            if (pts) {
                snprintf(titles[ns++], 64, "kvpeer e2e %s cks %s", paths[p], c ? "on" : "off");
                fprintf(f, "\n\n");
            }
        }
    static const char *kinds[3] = {"raw", "perftest", "memcpy"};
    for (int k = 0; k < 3; k++)
        for (int p = 0; p < (k == 2 ? 1 : 2) && ns < cap; p++) {
            int pts = 0;
            const char *path = k == 2 ? "mem" : paths[p];
            for (int si = 0; si < o->nsizes; si++) {
                const e2e_ceil_t *c = e2e_ceil_find(t, kinds[k], path, o->sizes[si]);
                if (c && c->gbps > 0 && ++pts)
                    fprintf(f, "%u %.4f\n", o->sizes[si] / 1024, c->gbps);
            }
            if (pts) {
                snprintf(titles[ns++], 64, "%s %s", kinds[k] == kinds[0] ? "raw UCX put" :
                         kinds[k] == kinds[1] ? "ucx_perftest" : "cold memcpy", path);
                fprintf(f, "\n\n");
            }
        }
    return ns;
}

static void write_plot(const e2e_opts_t *o, const e2e_table_t *t)
{
    char dat[PATH_MAX + 32], gp[PATH_MAX + 32], png[PATH_MAX + 32], titles[16][64];
    snprintf(dat, sizeof(dat), "%s/e2e.dat", o->out);
    snprintf(gp, sizeof(gp), "%s/e2e.gp", o->out);
    snprintf(png, sizeof(png), "%s/e2e.png", o->out);
    FILE *f = fopen(dat, "w");
    if (!f)
        return;
    int ns = write_plot_data(o, t, f, titles, 16);
    fclose(f);
    if (!(f = fopen(gp, "w")))
        return;
    fprintf(f, "set terminal png size 1100,650 noenhanced\nset output '%s'\n"
               "set title 'bench/e2e: best cell per block size (K fetches outstanding) vs ceilings "
               "of the same run'\nset logscale xy\nset xlabel 'block size (KiB)'\n"
               "set ylabel 'GB/s'\nset key outside right\nset grid\nplot ", png);
    for (int i = 0; i < ns; i++)
        fprintf(f, "%s'%s' index %d using 1:2 with linespoints lw 2 dt %d title '%s'", i ? ", " : "",
                dat, i, strncmp(titles[i], "kvpeer", 6) ? 2 : 1, titles[i]);
    fprintf(f, "\n");
    fclose(f);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int nul = open("/dev/null", O_WRONLY);
        dup2(nul, 1);
        dup2(nul, 2);
        execl("/usr/bin/gnuplot", "gnuplot", gp, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    if (pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0)
        printf("plot: %s\n", png);
    else
        printf("plot: gnuplot failed or missing (Debian gnuplot-nox); data in %s\n", dat);
}

static void mkdirs(const char *path)
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
}

void e2e_write_outputs(const e2e_opts_t *o, const e2e_table_t *t)
{
    char csv[PATH_MAX + 32];
    mkdirs(o->out);
    snprintf(csv, sizeof(csv), "%s/e2e.csv", o->out);
    write_csv(csv, t);
    if (o->plot)
        write_plot(o, t);
}
