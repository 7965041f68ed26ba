/* clock.c -- the real monotonic clock and the manual test clock. */
#include "common.h"

#include <stdatomic.h>
#include <time.h>

static uint64_t real_now(void *arg)
{
    (void)arg;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * KVP_NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

static const kvp_clock_t real_clock = {real_now, NULL};

const kvp_clock_t *kvp_clock_real(void)
{
    return &real_clock;
}

static uint64_t manual_now(void *arg)
{
    kvp_manual_clock_t *mc = arg;
    return __atomic_load_n(&mc->now, __ATOMIC_ACQUIRE);
}

void kvp_manual_clock_init(kvp_manual_clock_t *mc, uint64_t start_ns)
{
    mc->clock.now_ns = manual_now;
    mc->clock.arg = mc;
    mc->now = start_ns;
}

void kvp_manual_clock_advance(kvp_manual_clock_t *mc, uint64_t delta_ns)
{
    __atomic_add_fetch(&mc->now, delta_ns, __ATOMIC_ACQ_REL);
}

void kvp_manual_clock_set(kvp_manual_clock_t *mc, uint64_t now_ns)
{
    KVP_ASSERT(now_ns >= kvp_clock_now(&mc->clock));
    __atomic_store_n(&mc->now, now_ns, __ATOMIC_RELEASE);
}
