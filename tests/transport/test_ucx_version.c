/*
 * test_ucx_version.c -- this build loads the UCX it was built against, and
 * says so at start-up (issue 30: a second build against UCX 1.22 from PyPI
 * beside Debian's 1.13, found through PKG_CONFIG_PATH, loaded through the
 * binaries' RUNPATH).
 *
 * Mutation tried (makes test_loaded_is_the_build_ucx fail): the 1.22 build's
 * binary run with LD_LIBRARY_PATH=/lib/x86_64-linux-gnu, i.e. Debian's
 * libucp 1.13 picked instead of the wheel's (what a missing RUNPATH does).
 */
#include "testutil.h"
#include "transport/ucx_int.h"
#include "ucx_testlib.h"

#include <stdio.h>
#include <string.h>

/* The library's major.minor are the headers' (UCX keeps its ABI within a
 * minor series only forward: ucp_init merely warns on a mismatch). */
static void test_loaded_is_the_build_ucx(void **state)
{
    unsigned major = 0, minor = 0, release = 0;
    char line[512];

    ucp_get_version(&major, &minor, &release);
    printf("# %s\n", (kvp__ucx_version_describe(line, sizeof(line)), line));
    assert_int_equal(major, UCP_API_MAJOR);
    assert_int_equal(minor, UCP_API_MINOR);
    assert_true(kvp__ucx_version_describe(line, sizeof(line)));
    assert_non_null(strstr(line, "libucp"));
}

/* Creating a transport logs the loaded version once, at INFO. */
typedef struct seen {
    char want[64];
    int info, other;
} seen_t;

static void version_sink(kvp_log_level_t level, const char *prefix, const char *line, void *arg)
{
    seen_t *s = arg;

    if (strncmp(line, s->want, strlen(s->want)) == 0) {
        if (level == KVP_LOG_INFO && strstr(line, "libucp") != NULL)
            s->info++;
        else
            s->other++;
    }
}

static void test_start_up_line(void **state)
{
    unsigned major = 0, minor = 0, release = 0;
    seen_t seen = {.info = 0};

    ucp_get_version(&major, &minor, &release);
    snprintf(seen.want, sizeof(seen.want), "UCX %u.%u.%u loaded from ", major, minor, release);
    int level = kvp__log_level;
    kvp_log_set_level(KVP_LOG_INFO); /* a library logs WARN and up by default */
    kvp_log_set_sink(version_sink, &seen);
    kvp_xport_t *x = ut_xport_new("", "ver");
    kvp_log_set_sink(NULL, NULL);
    kvp_log_set_level((kvp_log_level_t)level);
    assert_non_null(x);
    assert_int_equal(x->ops->close(x, false), KVP_OK);
    assert_int_equal(seen.info, 1);
    assert_int_equal(seen.other, 0);
    KVP_TEST_ASSERT_NO_LEAKS();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loaded_is_the_build_ucx),
        cmocka_unit_test(test_start_up_line),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
