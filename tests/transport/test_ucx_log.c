/*
 * test_ucx_log.c -- UCX's own log lines reach kvpeer's log, escaped (issue
 * 27: "nothing a peer sends reaches a log line unescaped"; UCX printed its
 * lines to stderr byte for byte).
 *
 * UCX warns about an unused UCX_* environment variable, naming it, once per
 * process at the first worker: a name holding a terminal escape is the
 * line under test (a string another party chose, as a peer's worker name
 * or address would be, but one we can make UCX print on demand).
 *
 * Mutation tried: the handler not pushed (kvp__ucx_log_install a no-op) ->
 * no "ucx" line reaches the sink and the raw ESC goes to stderr: fails.
 */
#include "testutil.h"
#include "transport/ucx_int.h"
#include "ucx_testlib.h"

#include <stdlib.h>
#include <string.h>

static kvp_test_logcap_t cap;
static char g_ucx_line[512];

static void sink(kvp_log_level_t level, const char *prefix, const char *line, void *arg)
{
    (void)arg;
    if (prefix && strcmp(prefix, "ucx") == 0 && strstr(line, "KVPTEST") && level <= KVP_LOG_WARN)
        snprintf(g_ucx_line, sizeof(g_ucx_line), "%s", line);
    cap.count[level]++;
}

static void test_ucx_lines_escaped(void **state)
{
    (void)state;
    kvp_log_set_level(KVP_LOG_WARN);
    kvp_log_set_sink(sink, NULL);
    kvp_xport_t *x = ut_xport_new("", "log");
    assert_non_null(x);
    assert_int_equal(x->ops->close(x, false), KVP_OK);
    kvp_log_set_sink(NULL, NULL);
    print_message("  UCX's line as logged: %s\n", g_ucx_line);
    assert_non_null(strstr(g_ucx_line, "UCX_KVPTEST_\\x1b[31mX")); /* escaped, named */
    assert_null(strchr(g_ucx_line, 0x1b));
    KVP_TEST_ASSERT_NO_LEAKS();
}

int main(int argc, char **argv)
{
    (void)argc;
    /* before UCX reads its environment (the first worker of the process) */
    setenv("UCX_WARN_UNUSED_ENV_VARS", "y", 1);
    setenv("UCX_KVPTEST_\x1b[31mX", "1", 1);
    ut_main_init(argv);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_ucx_lines_escaped)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
