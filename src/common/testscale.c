/* testscale.c -- the one real-clock multiplier for tests. */
#include "common.h"

#include <stdlib.h>

double kvp_test_time_scale(void)
{
    const char *v = getenv("KVPEER_TEST_TIME_SCALE");
    if (v != NULL) {
        double d = strtod(v, NULL);
        if (d > 0)
            return d;
    }
    return 1.0;
}

uint64_t kvp_test_scaled_ns(uint64_t ns)
{
    return (uint64_t)((double)ns * kvp_test_time_scale());
}
