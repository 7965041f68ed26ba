/* alloc.c -- the allocation seam: every library allocation passes here so a
 * test can fail the Nth one (libuv test-loop-oom, SQLite test_malloc). */
#include "common.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#ifdef KVP_TESTING /* the fault injection and the counters: test builds only (issue 31) */
static _Atomic uint64_t alloc_seq;     /* allocations since the last arm */
static _Atomic uint64_t alloc_fail_n;  /* 0 = off */
static _Atomic bool alloc_fail_sticky;
static _Atomic int64_t alloc_live;

void kvp_alloc_fail_at(uint64_t n, bool sticky)
{
    atomic_store(&alloc_seq, 0);
    atomic_store(&alloc_fail_sticky, sticky);
    atomic_store(&alloc_fail_n, n);
}

uint64_t kvp_alloc_count(void)
{
    return atomic_load(&alloc_seq);
}

int64_t kvp_alloc_live(void)
{
    return atomic_load(&alloc_live);
}

static bool alloc_should_fail(void)
{
    uint64_t seq = atomic_fetch_add(&alloc_seq, 1) + 1;
    uint64_t n = atomic_load(&alloc_fail_n);
    if (n == 0)
        return false;
    return seq == n || (seq > n && atomic_load(&alloc_fail_sticky));
}
#define ALLOC_LIVE_ADD(d) atomic_fetch_add(&alloc_live, (d))
#else /* the shipped library: a plain allocator, no atomics per call */
static inline bool alloc_should_fail(void)
{
    return false;
}
#define ALLOC_LIVE_ADD(d) ((void)0)
#endif

void *kvp__malloc(size_t size)
{
    if (alloc_should_fail())
        return NULL;
    void *p = malloc(size ? size : 1);
    if (p)
        ALLOC_LIVE_ADD(1);
    return p;
}

void *kvp__calloc(size_t n, size_t size)
{
    if (alloc_should_fail())
        return NULL;
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (p)
        ALLOC_LIVE_ADD(1);
    return p;
}

void *kvp__realloc(void *p, size_t size)
{
    if (alloc_should_fail())
        return NULL;
    void *q = realloc(p, size ? size : 1);
    if (q && p == NULL)
        ALLOC_LIVE_ADD(1);
    return q;
}

void kvp__free(void *p)
{
    if (p == NULL)
        return;
    ALLOC_LIVE_ADD(-1);
    free(p);
}

char *kvp__strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = kvp__malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}
