/*
 * ucx_testlib.h -- two-process harness for the UCX backend tests.
 *
 * The test process forks a TARGET child (before any UCX thread exists, so
 * TSan's fork rule holds) and drives it over an AF_UNIX socketpair. The
 * child owns its own UCX transport and region and keeps progressing it
 * (worker efd + arm + poll) between commands, which is what lands emulated
 * puts. The parent is the producer/source.
 */
#ifndef KVP_TEST_UCX_TESTLIB_H
#define KVP_TEST_UCX_TESTLIB_H

#include "transport/ucx.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct ut_child {
    pid_t pid;
    int sock;
} ut_child_t;

enum ut_op {
    UT_SETUP = 1,   /* a=num_blocks[|CALLER_MEM] b=block_size payload=tls ("" = default) -> blob */
    UT_ADD_PEER,    /* payload = blob, a/b = expected layout -> status, path */
    UT_VERIFY,      /* payload = (dst,src) u32 pairs, b = seed -> mismatching slots */
    UT_FILL,        /* a = byte -> 0 */
    UT_COUNT_NOT,   /* a = byte -> bytes of the region != byte */
    UT_FENCE,       /* -> status, proof */
    UT_PEER_STATUS, /* -> status */
    UT_PAUSE,       /* a = ms: no progress for that long, reply afterwards */
    UT_REFUSE,      /* a = first slot, b = count: refuse() them (generation 0) -> 0 */
    UT_DROPPED,     /* -> late_bytes_dropped, am_bytes_landed */
    UT_LANDED,      /* a = slot: is_landed(slot, generation 0) -> 0/1 */
    UT_REFUSED,     /* -> am_refused_slots */
    UT_EXIT,        /* close transport, exit(0) */
};

#define UT_SETUP_CALLER_MEM (1ull << 40) /* target registers its own mmap'd memory */

typedef struct ut_reply {
    int64_t status;
    int64_t v1, v2;
    uint32_t len; /* payload bytes that follow */
} ut_reply_t;

/* First call of main(): under TSan re-executes itself once with UCM's memory
 * hooks off (see the .c for why). */
void ut_main_init(char **argv);

/* Fork the target. Returns false in the parent on failure; never returns in
 * the child. */
bool ut_child_start(ut_child_t *c);
/* Send a command; *r gets the reply; payload_out (cap) the reply payload. */
bool ut_call(ut_child_t *c, uint32_t op, uint64_t a, uint64_t b, const void *payload, uint32_t len,
             ut_reply_t *r, void *payload_out, uint32_t cap);
/* Send without waiting for the reply (UT_PAUSE). */
bool ut_send(ut_child_t *c, uint32_t op, uint64_t a, uint64_t b, const void *payload, uint32_t len);
bool ut_recv_reply(ut_child_t *c, ut_reply_t *r, void *payload_out, uint32_t cap);
/* UT_EXIT + waitpid; true if the child exited 0. */
bool ut_child_stop(ut_child_t *c);
/* SIGKILL + waitpid (reaped: zombies defeat shm keepalive). */
void ut_child_kill(ut_child_t *c);

/* The deterministic content of source slot `src` for `seed`. */
void ut_pattern_fill(void *slot, size_t len, uint32_t src, uint64_t seed);
bool ut_pattern_check(const void *slot, size_t len, uint32_t src, uint64_t seed);

/* Producer-side helpers. */
kvp_xport_t *ut_xport_new(const char *tls, const char *prefix);
/* Progress x until transfer `id` of `peer` is handed back by poll (status in
 * *st) or `timeout_ns` passes (false). Sleeps on the event fd, bounded. */
bool ut_wait_xfer(kvp_xport_t *x, kvp_xpeer_id_t peer, kvp_xfer_id_t id, uint64_t timeout_ns,
                  kvp_status_t *st);
/* Forget results stashed by ut_wait_xfer (between tests). */
void ut_stash_clear(void);
/* Progress for about `ns` (event-fd sleep between progress calls). */
void ut_progress_for(kvp_xport_t *x, uint64_t ns);
uint64_t ut_now_ns(void);

/* A producer (this process) and a target child with one peer each way
 * prepared: ut_pair_open forks the child (before any UCX thread), creates both
 * transports with `tls` ("" = default), registers NB x BS regions, imports
 * the child's blob and asserts the peer's data path is `want_path` (a silent
 * fallback fails the test). */
#define UT_NB 64u
#define UT_BS (64u * 1024u)
typedef struct ut_pair {
    kvp_xport_t *x;
    uint8_t *region;
    ut_child_t child;
    kvp_xpeer_id_t peer;
    uint8_t blob[KVP_UCX_BLOB_MAX];
    uint32_t blob_len;
} ut_pair_t;
extern const kvp_layout_t ut_layout;
void ut_pair_open(ut_pair_t *p, const char *tls, kvp_data_path_t want_path);
/* Same; the target registers plain caller memory instead of letting UCX
 * allocate (so puts into it can only be emulated). */
void ut_pair_open_ex(ut_pair_t *p, const char *tls, kvp_data_path_t want_path,
                     bool target_caller_mem);
/* Asserts nothing in flight, removes the peer, closes, stops the child. */
void ut_pair_close(ut_pair_t *p);
/* Post transfer number k to the pair's peer: 4 adjacent blocks (slots
 * 4k..4k+3, cycling over the UT_NB-slot region); asserts the post. */
kvp_xfer_id_t ut_post4(ut_pair_t *p, uint32_t k);
/* The child (the consumer) imports our blob, so it owns a PEER endpoint to
 * us: asserts its add_peer and, if want_path >= 0, the data path it reports
 * (a kvp_data_path_t); then both sides wire up (20 ms, scaled). */
void ut_consumer_add_producer(ut_pair_t *p, int want_path);
/* Progresses x every step_ns and takes back its retired transfers until
 * none is retired and no removed peer is left, or timeout_ns passed: the
 * transport's stats at the end. */
kvp_xport_stats_t ut_drain_retired(kvp_xport_t *x, uint64_t step_ns, uint64_t timeout_ns);
/* ut_pair_open with the target paused for pause_ms (UT_PAUSE, its reply
 * left to the caller) before our endpoint is created: over tcp nothing we
 * send can complete until it wakes (the wire-up waits for it). With the
 * AM-only context (issue 27) a wired tcp endpoint completes small sends into
 * the socket at once, so "the target stopped" must come before the wire-up. */
void ut_pair_open_paused(ut_pair_t *p, const char *tls, kvp_data_path_t want_path,
                         uint32_t pause_ms);

#endif
