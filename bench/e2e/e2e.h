/*
 * e2e.h -- internals of bench/e2e (issue 17): an engine-style end-to-end
 * benchmark of the public C API (include/kvpeer.h) between two processes,
 * like nixlbench. Not library API.
 *
 *   e2e_bench.c   the matrix, the consumer's K-outstanding loop
 *   e2e_opts.c    presets and command-line options
 *   e2e_serve.c   the producer child (exec'd with --serve) and the raw TCP
 *                 ping-pong it answers
 *   e2e_ceil.c    ceilings measured in the same run (cold memcpy, the raw
 *                 UCX put ceiling and ucx_perftest via bench/transport/
 *                 ucx_bench), the TCP ping-pong client, CSV + gnuplot output
 */
#ifndef KVP_E2E_H
#define KVP_E2E_H

#include "kvpeer.h"

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

enum { E2E_MAX_LIST = 8, E2E_MAX_ROWS = 512, E2E_MAX_CEIL = 64, E2E_KEY_LEN = 12 };

typedef struct e2e_opts {
    bool quick, smoke, plot, ceilings, shm, tcp;
    bool wait_fd;        /* --wait-fd: wait with poll(kvp_node_fd) + kvp_poll_events (an
                            embedding's own event loop) instead of kvp_wait_events */
    int wait_spin_us;    /* --wait-spin-us: the consumer's kvp_config_t.wait_spin_us (-1 = default) */
    bool hint;           /* --hint: one round trip per fetch (kvp_fetch with KVP_FETCH_FLAG_HINT,
                            no lookup first); rows say "<data path>+hint" */
    uint64_t region;     /* consumer region bytes; the producer holds 2x (keys cycle) */
    uint32_t sizes[E2E_MAX_LIST];
    int nsizes;
    uint32_t depths[E2E_MAX_LIST];
    int ndepths;
    uint64_t reqs[E2E_MAX_LIST]; /* bytes per fetch */
    int nreqs;
    uint32_t tcp_req_max_mib;    /* tcp: larger requests are skipped (slow path) */
    int cks_mask;                /* bit 0: checksums off, bit 1: on */
    double secs;                 /* timed window of one cell */
    double steady;               /* --steady: unrecorded K=4 load per consumer first (s) */
    int lookups;                 /* lookup latency samples */
    int smoke_fetches;           /* --smoke: exact number of fetches */
    uint32_t keep_ms;            /* abort_ack_timeout_ms + abort_resend_ms of both nodes
                                    (0 = library defaults) for the path being run */
    uint32_t diag_keep_ms;       /* --diag-keep-ms: shm again with this keep (diagnostic) */
    char out[PATH_MAX];
    char self[PATH_MAX];
} e2e_opts_t;

/* One measured cell of the matrix. */
typedef struct e2e_row {
    char path[8]; /* shm | tcp */
    char data_path[48];
    uint32_t bs, depth;
    uint64_t req;
    bool cks;
    double gbps, fetches_s, p50_us, p99_us, cpu_s_per_gb, cons_cpu, prod_cpu;
    uint64_t bytes, fetches, errors;
    double load1;     /* 1-minute load average at the cell */
    uint32_t keep_ms; /* 0 = library defaults; else the --diag-keep-ms run */
} e2e_row_t;

/* A ceiling figure (raw UCX put, ucx_perftest, memcpy) per (kind, path, bs). */
typedef struct e2e_ceil {
    char kind[16]; /* raw | ours_xport | perftest | memcpy */
    char path[8];
    uint32_t bs;
    double gbps;
    char note[64];
} e2e_ceil_t;

typedef struct e2e_lat {
    char path[8];
    uint32_t nkeys, req_bytes, resp_bytes;
    double lookup_p50_us, lookup_p99_us, ping_p50_us, ping_p99_us;
    int n;
    uint32_t keep_ms;
} e2e_lat_t;

typedef struct e2e_table {
    e2e_row_t rows[E2E_MAX_ROWS];
    int nrows;
    e2e_ceil_t ceil[E2E_MAX_CEIL];
    int nceil;
    e2e_lat_t lat[4];
    int nlat;
    char ceil_note[192];
    char load_start[96], load_end[96];
    uint64_t verified, verify_bad;
} e2e_table_t;

/* ---- shared helpers (e2e_bench.c) ---- */
double e2e_now(void);
void e2e_block_fill(uint32_t k, uint8_t *buf, size_t len);
uint32_t e2e_key(uint32_t k, uint8_t *out);
/* All of len bytes sent (wr) or received on a socket, EINTR retried;
 * false on error or EOF. */
bool e2e_io_all(int fd, void *buf, size_t len, bool wr);
double e2e_percentile(double *v, int n, double p); /* sorts v */
/* --keep-ms: how long a source keeps a finished round for ABORT replays is
 * abort_ack_timeout_ms + abort_resend_ms (src/session/server.c); 0 = defaults. */
void e2e_config_keep(kvp_config_t *cfg, uint32_t keep_ms);
void e2e_loadavg(char *buf, size_t cap, double *load1);

/* ---- options (e2e_opts.c): presets, then the command line; 0 or -1 (said why) ---- */
int e2e_parse(int argc, char **argv, e2e_opts_t *o);

/* ---- producer child (e2e_serve.c) ---- */
/* argv after "--serve": BLOCK_SIZE NUM_BLOCKS KEEP_MS; exits. */
int e2e_serve_main(int argc, char **argv);

/* ---- ceilings and outputs (e2e_ceil.c) ---- */
void e2e_memcpy(const e2e_opts_t *o, e2e_table_t *t);
void e2e_ucx_ceiling(const e2e_opts_t *o, e2e_table_t *t);
const e2e_ceil_t *e2e_ceil_find(const e2e_table_t *t, const char *kind, const char *path,
                                uint32_t bs);
/* Raw TCP ping-pong client to the producer's server on 127.0.0.1:port
 * (TCP_NODELAY): connect (fd or -1), then one round trip of req bytes out and
 * resp bytes back, in microseconds (or -1). */
int e2e_pp_connect(int port);
double e2e_pp_round(int fd, uint32_t req, uint32_t resp);
void e2e_print_table(const e2e_opts_t *o, const e2e_table_t *t);
void e2e_write_outputs(const e2e_opts_t *o, const e2e_table_t *t);

#endif /* KVP_E2E_H */
