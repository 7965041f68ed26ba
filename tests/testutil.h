/* testutil.h -- shared helpers for the cmocka tests (header-only).
 *
 * cmocka needs <stdarg.h>, <stddef.h>, <stdint.h>, <setjmp.h> before it. */
#ifndef KVP_TESTUTIL_H
#define KVP_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <cmocka.h>

#include "common/common.h"

/* Log capture: counts lines per level and keeps the last error line, so a
 * test can assert "an error log naming X was written". */
typedef struct kvp_test_logcap {
    uint64_t count[KVP_LOG_TRACE + 1];
    char last[KVP_LOG_TRACE + 1][512];
    bool echo;
} kvp_test_logcap_t;

static void kvp_test_log_sink(kvp_log_level_t level, const char *prefix, const char *line,
                              void *arg)
{
    kvp_test_logcap_t *cap = arg;
    cap->count[level]++;
    snprintf(cap->last[level], sizeof(cap->last[level]), "%s", line);
    if (cap->echo || getenv("KVPEER_TEST_VERBOSE"))
        fprintf(stderr, "  [log %d %s] %s\n", (int)level, prefix ? prefix : "-", line);
}

static inline void kvp_test_logcap_start(kvp_test_logcap_t *cap)
{
    memset(cap, 0, sizeof(*cap));
    kvp_log_set_sink(kvp_test_log_sink, cap);
}

static inline void kvp_test_logcap_stop(void)
{
    kvp_log_set_sink(NULL, NULL);
}

/* Every test's teardown: nothing allocated through the seam stays live. */
#define KVP_TEST_ASSERT_NO_LEAKS() assert_int_equal(kvp_alloc_live(), 0)

#endif
