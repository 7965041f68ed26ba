/*
 * kvpeer_bench.h -- internals of `kvpeer bench`: options, result rows, the
 * ceilings (kvpeer_bench_ceil.c: cold memcpy, ucx_perftest, the raw UCX
 * ceiling of bench/transport/ucx_bench) and the end-to-end runs between
 * kvpeerd processes (kvpeer_bench.c). Not library API.
 */
#ifndef KVPEER_BENCH_H
#define KVPEER_BENCH_H

#include "kvpeer_cli.h"

#include <limits.h>

enum { BENCH_MAX_SIZES = 4, BENCH_MAX_RUNS = 15, BENCH_MAX_ROWS = 64 };

typedef struct bench_opts {
    bool quick, shm, tcp, perftest, raw, plot;
    uint64_t region;        /* bytes per node region */
    uint64_t request_bytes; /* bytes per /admin/fetch */
    uint32_t sizes[BENCH_MAX_SIZES];
    int nsizes, runs, lookups, setups;
    double run_secs; /* time budget of one e2e run */
    char kvpeerd[PATH_MAX];
    char out[PATH_MAX];
} bench_opts_t;

/* One measured series: `runs` values (GB/s, or microseconds for the
 * latency rows) and its median. */
typedef struct bench_row {
    char kind[16];  /* e2e, raw, perftest, memcpy */
    char path[16];  /* shm, tcp, mem */
    char cks[8];    /* on, off, - */
    char note[96];  /* data path reported, bytes per run, ... */
    uint32_t block_size;
    double v[BENCH_MAX_RUNS];
    int n;
    double median;
} bench_row_t;

typedef struct bench_table {
    bench_row_t rows[BENCH_MAX_ROWS];
    int nrows;
    double lookup_p50_us, lookup_p99_us, setup_ms_median;
    int lookup_n, setup_n;
    char raw_note[160];
} bench_table_t;

bench_row_t *bench_row_add(bench_table_t *t, const char *kind, const char *path, const char *cks,
                           uint32_t bs);
const bench_row_t *bench_row_find(const bench_table_t *t, const char *kind, const char *path,
                                  const char *cks, uint32_t bs);
double bench_median(const double *v, int n);
double bench_percentile(double *v, int n, double p); /* sorts v */

/* ---- ceilings (kvpeer_bench_ceil.c) ---- */
void bench_memcpy(const bench_opts_t *o, bench_table_t *t);
void bench_perftest(const bench_opts_t *o, bench_table_t *t);
void bench_raw_ucx(const bench_opts_t *o, bench_table_t *t);
/* mkdir -p; 0 if the directory is writable. */
int bench_mkdirs(const char *path);
/* CSV + gnuplot PNG into o->out; prints what it wrote. */
void bench_write_outputs(const bench_opts_t *o, const bench_table_t *t);

#endif /* KVPEER_BENCH_H */
