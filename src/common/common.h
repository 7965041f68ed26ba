/*
 * common.h -- the common layer: status text, logging with rate limiting, the
 * injectable clock, the allocation seam, xxh3 digests, random bytes, an
 * intrusive list, and the test time multiplier.
 *
 * Internal: names are kvp__ or kvp_<thing>_; nothing here is exported.
 */
#ifndef KVP_COMMON_H
#define KVP_COMMON_H

#include "kvpeer.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KVP_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define KVP_MIN(a, b) ((a) < (b) ? (a) : (b))
#define KVP_MAX(a, b) ((a) > (b) ? (a) : (b))
#define KVP_NSEC_PER_MSEC 1000000ull
#define KVP_NSEC_PER_SEC 1000000000ull
#define KVP_CONTAINER_OF(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

/* Always-on cheap invariant. Violations are bugs in kvpeer, never bad input
 * (bad input gets a status). */
#define KVP_ASSERT(cond)                                                                           \
    do {                                                                                           \
        if (__builtin_expect(!(cond), 0))                                                          \
            kvp__assert_fail(#cond, __FILE__, __LINE__, __func__);                                 \
    } while (0)
void kvp__assert_fail(const char *cond, const char *file, int line, const char *func)
    __attribute__((noreturn));

/* ------------------------------------------------------------------ logging */

typedef enum kvp_log_level {
    KVP_LOG_ERROR = 0,
    KVP_LOG_WARN = 1,
    KVP_LOG_INFO = 2,
    KVP_LOG_DEBUG = 3,
    KVP_LOG_TRACE = 4,
} kvp_log_level_t;

/* A sink receives every formatted line that passed the level and the rate
 * limit. The default sink writes to stderr. Tests install one to capture
 * lines ("an error log was written"). `line` is valid for the call only. */
typedef void (*kvp_log_sink_cb)(kvp_log_level_t level, const char *prefix, const char *line,
                                void *arg);

/* Global log level (default INFO, or KVPEER_LOG_LEVEL=error|warn|info|debug|trace). */
extern int kvp__log_level;
void kvp_log_set_level(kvp_log_level_t level);
void kvp_log_set_sink(kvp_log_sink_cb sink, void *arg);
/* Per-level count of lines emitted (and suppressed by rate limits). */
uint64_t kvp_log_count(kvp_log_level_t level);
uint64_t kvp_log_suppressed(void);

void kvp__log(kvp_log_level_t level, const char *prefix, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Level macros skip argument evaluation when the level is off. `prefix` is
 * the node's name (or NULL); it is printed in brackets. */
#define KVP_LOG(level, prefix, ...)                                                                \
    do {                                                                                           \
        if ((int)(level) <= kvp__log_level)                                                        \
            kvp__log((level), (prefix), __VA_ARGS__);                                              \
    } while (0)
#define KVP_ERROR(prefix, ...) KVP_LOG(KVP_LOG_ERROR, prefix, __VA_ARGS__)
#define KVP_WARN(prefix, ...) KVP_LOG(KVP_LOG_WARN, prefix, __VA_ARGS__)
#define KVP_INFO(prefix, ...) KVP_LOG(KVP_LOG_INFO, prefix, __VA_ARGS__)
#define KVP_DEBUG(prefix, ...) KVP_LOG(KVP_LOG_DEBUG, prefix, __VA_ARGS__)
#define KVP_TRACE(prefix, ...) KVP_LOG(KVP_LOG_TRACE, prefix, __VA_ARGS__)

/* Rate limit for a repeated line (per peer, per cause): at most `burst`
 * lines per `interval_ns`; the rest are counted and reported with the next
 * line that passes. Embed one per (peer, cause). */
typedef struct kvp_ratelimit {
    uint64_t interval_ns;
    uint32_t burst;
    uint32_t emitted;    /* in the current window */
    uint64_t window_start;
    uint64_t suppressed; /* since the last emitted line */
} kvp_ratelimit_t;

void kvp_ratelimit_init(kvp_ratelimit_t *rl, uint64_t interval_ns, uint32_t burst);
/* True if a line may be emitted now; *suppressed gets the count of lines
 * dropped since the last one that passed. */
bool kvp_ratelimit_allow(kvp_ratelimit_t *rl, uint64_t now_ns, uint64_t *suppressed);

#define KVP_LOG_RL(rl, now, level, prefix, fmt, ...)                                               \
    do {                                                                                           \
        uint64_t kvp__sup_;                                                                        \
        if ((int)(level) <= kvp__log_level && kvp_ratelimit_allow((rl), (now), &kvp__sup_)) {      \
            if (kvp__sup_)                                                                         \
                kvp__log((level), (prefix), fmt " (%llu similar suppressed)", ##__VA_ARGS__,       \
                         (unsigned long long)kvp__sup_);                                           \
            else                                                                                   \
                kvp__log((level), (prefix), fmt, ##__VA_ARGS__);                                   \
        }                                                                                          \
    } while (0)

/* -------------------------------------------------------------------- clock */

/* The injectable monotonic clock. Everything that reads time takes one.
 * `now_ns` must be monotonic. The real clock is CLOCK_MONOTONIC. */
typedef struct kvp_clock {
    uint64_t (*now_ns)(void *arg);
    void *arg;
} kvp_clock_t;

const kvp_clock_t *kvp_clock_real(void);

static inline uint64_t kvp_clock_now(const kvp_clock_t *c)
{
    return c->now_ns(c->arg);
}

/* A manual clock for deterministic tests and the simulator. Thread-safe
 * reads (atomic), advanced by the test. */
typedef struct kvp_manual_clock {
    kvp_clock_t clock; /* pass &mc.clock wherever a clock is needed */
    uint64_t now;
} kvp_manual_clock_t;

void kvp_manual_clock_init(kvp_manual_clock_t *mc, uint64_t start_ns);
void kvp_manual_clock_advance(kvp_manual_clock_t *mc, uint64_t delta_ns);
void kvp_manual_clock_set(kvp_manual_clock_t *mc, uint64_t now_ns);

/* ---------------------------------------------------------- allocation seam */

/* All library allocations go through these, so tests can fail the Nth one.
 * kvp__free(NULL) is a no-op. */
void *kvp__malloc(size_t size);
void *kvp__calloc(size_t n, size_t size);
void *kvp__realloc(void *p, size_t size);
void kvp__free(void *p);
char *kvp__strdup(const char *s);

#ifdef KVP_TESTING /* test builds only (issue 31) */
/* Test hook: make the allocation with 1-based index `n` (counted from this
 * call) and every later one fail (`sticky`) or only that one. n == 0 turns
 * the injection off. */
void kvp_alloc_fail_at(uint64_t n, bool sticky);
/* Allocations made since the last kvp_alloc_fail_at() call. */
uint64_t kvp_alloc_count(void);
/* Live allocations (allocated and not yet freed) through the seam. */
int64_t kvp_alloc_live(void);
#endif

/* ------------------------------------------------------------------- copy */

/* Copy len bytes (no overlap) with streaming stores that bypass the cache,
 * for bulk copies nobody reads soon (copy.c says why not memcpy). Every byte
 * is visible to other cores and processes when it returns (sfence). */
void kvp_copy_stream(void *dst, const void *src, size_t len);

/* ------------------------------------------------------------------ helper */

/* A parked worker thread that does half of a big job for its owner thread
 * (helper.c). kvp__helper_post starts it at the first post (*h NULL) and
 * posts fn(arg); false: no helper (KVPEER_HELPER_THREAD=0, or it could not
 * be started): the owner runs fn itself. After a true post the owner does
 * its share, then kvp__helper_wait: fn has returned. One job at a time, one
 * owner thread. kvp__helper_fini joins it (*h NULL after). */
typedef struct kvp_helper kvp_helper_t;
bool kvp__helper_post(kvp_helper_t **h, const char *log_prefix, void (*fn)(void *), void *arg);
void kvp__helper_wait(kvp_helper_t *h);
void kvp__helper_fini(kvp_helper_t **h);
/* Start *h now (if not yet) as a thread named ``name``, ``nice`` steps
 * below the caller's priority (0: the same); a later kvp__helper_post uses
 * it. */
void kvp__helper_start(kvp_helper_t **h, const char *log_prefix, const char *name, int nice);
/* The calling thread: named ``name`` (15 chars at most), and ``nice``
 * steps below the priority it started with if above 0 (at most nice 19;
 * bulk copies below the threads that answer peers and the engine's own; a
 * failure is logged, the thread runs on). */
void kvp__thread_setup(const char *name, int nice, const char *log_prefix);

/* A job of this many bytes or more is split with the helper. */
#define KVP_HELPER_SPLIT_BYTES ((size_t)1 << 20)

/* -------------------------------------------------------------- hash & rand */

typedef struct kvp_digest {
    uint64_t lo, hi;
} kvp_digest_t;

/* xxh3-128 of a block (libxxhash). */
kvp_digest_t kvp_digest(const void *data, size_t len, uint64_t seed);
static inline bool kvp_digest_eq(const kvp_digest_t *a, const kvp_digest_t *b)
{
    return a->lo == b->lo && a->hi == b->hi;
}
/* xxh3-64 of a key, for indexes. */
uint64_t kvp_hash64(const void *data, size_t len, uint64_t seed);

/* Cryptographically random bytes (getrandom). */
kvp_status_t kvp_random_bytes(void *buf, size_t len);

/* Deterministic PRNG (splitmix64 seeding xoshiro256**) for tests, the fake
 * transport and the simulator. */
typedef struct kvp_rng {
    uint64_t s[4];
} kvp_rng_t;
void kvp_rng_seed(kvp_rng_t *r, uint64_t seed);
uint64_t kvp_rng_next(kvp_rng_t *r);
/* Uniform in [0, bound), bound > 0. */
uint64_t kvp_rng_below(kvp_rng_t *r, uint64_t bound);

/* --------------------------------------------------------- intrusive list */

/* Circular doubly-linked list (libuv's queue). A node that is not on a list
 * points at itself, so kvp_list_linked() tells membership in O(1). */
typedef struct kvp_list {
    struct kvp_list *next, *prev;
} kvp_list_t;

static inline void kvp_list_init(kvp_list_t *l)
{
    l->next = l->prev = l;
}
static inline bool kvp_list_empty(const kvp_list_t *l)
{
    return l->next == l;
}
static inline bool kvp_list_linked(const kvp_list_t *n)
{
    return n->next != n;
}
static inline void kvp_list_insert_tail(kvp_list_t *head, kvp_list_t *n)
{
    n->next = head;
    n->prev = head->prev;
    head->prev->next = n;
    head->prev = n;
}
static inline void kvp_list_insert_head(kvp_list_t *head, kvp_list_t *n)
{
    n->next = head->next;
    n->prev = head;
    head->next->prev = n;
    head->next = n;
}
static inline void kvp_list_remove(kvp_list_t *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->next = n->prev = n;
}
#define kvp_list_foreach_safe(pos, tmp, head)                                                      \
    for ((pos) = (head)->next, (tmp) = (pos)->next; (pos) != (head); (pos) = (tmp), (tmp) = (pos)->next)

/* ------------------------------------------------------------------- tests */

/* Test-only mutation switches: each breaks exactly one safety rule so the
 * simulator and directed tests can prove they catch it (issue: "a rule whose
 * mutation survives is not proven"). Always KVP_MUT_NONE outside those tests. */
typedef enum kvp_mutation {
    KVP_MUT_NONE = 0,
    KVP_MUT_CANCEL_IMMEDIATE_AT_CLOSE = 1, /* source teardown cancels IMMEDIATE, frees pins */
    KVP_MUT_UNPIN_AT_CLOSE = 2,            /* retained transfers' store jobs unpinned at close */
    KVP_MUT_RELEASE_QUARANTINE_AT_ONCE = 3,/* outcome-unknown slots freed instead of quarantined */
    KVP_MUT_ACCEPT_STALE_EPOCH = 4,        /* frames of another incarnation accepted */
    KVP_MUT_SKIP_SUSPECT_VERIFY = 5,       /* suspect slots not re-verified on acquire */
    KVP_MUT_SKIP_CHECKSUM = 6,             /* FETCH_DONE blocks committed unverified */
    KVP_MUT_UCX_EMULATED_PUT = 7,          /* UCX source puts on AM paths (UCX emulates; pre-issue-14) */
    KVP_MUT_AM_SKIP_AWAIT = 8,             /* FETCH_DONE commits without waiting for the AM blocks */
    KVP_MUT_EXIT_PROOF_ALIVE = 9,          /* issue 27: exit proof without looking at the process */
    /* Issue 29, external slots: */
    KVP_MUT_EXT_HELD_AS_REUSABLE = 10,     /* a held lent slot reported reusable at the outcome */
    KVP_MUT_EXT_UNPUBLISH_PINNED = 11,     /* unpublish of a pinned slot answers OK, still served */
    KVP_MUT_WANTED_HIT = 12,               /* a wanted key never published answers HIT */
    KVP_MUT_COUNT = 13,
} kvp_mutation_t;
/* KVP_MUTATED(m): is mutation m switched on? Only test builds (KVP_TESTING,
 * the kvpeer_testing library) have the switch; in the shipped library every
 * mutation branch is the constant 0 and compiles away (`nm libkvpeer.so`
 * shows no mutation or fake symbol). */
#ifdef KVP_TESTING
extern int kvp__mutation;
const char *kvp_mutation_str(int m);
#define KVP_MUTATED(m) (kvp__mutation == (m))

/* The one multiplier by which tests on the real clock scale every bound:
 * KVPEER_TEST_TIME_SCALE if set (a positive number), else 1. The build sets
 * it higher under sanitizers and valgrind. */
double kvp_test_time_scale(void);
uint64_t kvp_test_scaled_ns(uint64_t ns);

/* Test-only source of kvp_random_bytes: when set (by the simulator, one
 * thread), epochs and nonces come from it instead of getrandom, one system
 * call each, and a seed replays them too. NULL: getrandom. */
extern void (*kvp__random_hook)(void *buf, size_t len, void *arg);
extern void *kvp__random_hook_arg;
#else
#define KVP_MUTATED(m) 0
#endif

#endif /* KVP_COMMON_H */
