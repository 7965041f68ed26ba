/* test_node_gate.c -- secure by default (issue 27): kvp_node_create refuses
 * a listen address beyond loopback without a pre-shared key, naming the
 * keys that fix it; `insecure` (or a key) lets it pass; loopback nodes need
 * no key and report insecure = 0; in a network namespace of its own, an
 * insecure node on 0.0.0.0 reports insecure = 1 and a keyed one cannot drop
 * its key by reconfiguring.
 * Real TCP control listener, UCX data transport with an 8-block region. */
#include "testutil.h"
#include "node/node.h"
#include "transport/fake.h"

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

static const uint8_t KEY[] = "0123456789abcdef-node-gate";

static void cfg_for(kvp_config_t *c, const char *listen)
{
    kvp_config_init(c);
    c->listen_addr = listen;
    c->transport = KVP_TRANSPORT_UCX;
    c->thread_mode = KVP_THREAD_CALLER;
    c->num_blocks = 8;
    c->block_size = 4096;
}

static uint64_t insecure_of(kvp_node_t *n)
{
    kvp_stats_t st;
    assert_int_equal(kvp_node_stats(n, &st), KVP_OK);
    return st.insecure;
}

static void test_gate_refuses_open_listen_without_key(void **state)
{
    kvp_config_t c;
    kvp_node_t *n = NULL;
    cfg_for(&c, "0.0.0.0:0");
    assert_int_equal(kvp_node_create(&c, &n), KVP_ERR_INVALID);
    assert_null(n);
    const char *why = kvp_last_error();
    assert_non_null(strstr(why, "listen"));
    assert_non_null(strstr(why, "psk_file"));
    assert_non_null(strstr(why, "insecure"));
    /* The accepted cases are checked without binding beyond loopback (the
     * tests use 127.0.0.0/8 only): the same gate kvp_node_create runs. */
    c.insecure = 1; /* the operator's explicit choice */
    bool lo = true;
    assert_int_equal(kvp__config_check_gate(&c, &lo), KVP_OK);
    assert_false(lo);
    c.insecure = 0;
    c.psk = KEY;
    c.psk_len = sizeof(KEY) - 1;
    assert_int_equal(kvp__config_check_gate(&c, &lo), KVP_OK);
}

static void test_gate_loopback_needs_no_key(void **state)
{
    static const char *const lo[] = {"127.0.0.1:0", "127.0.0.2:0", "[::1]:0"};
    for (size_t i = 0; i < sizeof(lo) / sizeof(lo[0]); i++) {
        kvp_config_t c;
        kvp_node_t *n = NULL;
        cfg_for(&c, lo[i]);
        assert_int_equal(kvp_node_create(&c, &n), KVP_OK);
        assert_int_equal(insecure_of(n), 0);
        kvp_node_destroy(n);
    }
    static const char *const open[] = {"[::]:0", "10.255.255.1:0", "example.invalid:0"};
    for (size_t i = 0; i < sizeof(open) / sizeof(open[0]); i++) {
        kvp_config_t c;
        kvp_node_t *n = NULL;
        cfg_for(&c, open[i]);
        assert_int_equal(kvp_node_create(&c, &n), KVP_ERR_INVALID);
        assert_non_null(strstr(kvp_last_error(), "not a loopback address"));
    }
}

/* In a child in a network namespace of its own (so 0.0.0.0 is only that
 * namespace's loopback): an insecure node beyond loopback starts and says
 * so in kvp_stats_t; a keyed one cannot drop its key by reconfiguring.
 * Exit status: 0 ok, 77 no namespace (not root), else the failed step. */
static int open_node_child(void)
{
    if (unshare(CLONE_NEWNET) != 0)
        return 77;
    kvp_fake_fabric_t *fab = NULL;
    if (kvp_fake_fabric_create(kvp_clock_real(), &fab) != KVP_OK)
        return 2;
    kvp_node_seams_t seams = {.fake_fabric = fab};
    kvp_config_t c;
    kvp_node_t *n = NULL;
    cfg_for(&c, "0.0.0.0:0");
    c.transport = KVP_TRANSPORT_FAKE;
    c.insecure = 1;
    if (kvp__node_create_ex(&c, &seams, &n) != KVP_OK)
        return 3;
    int rc = insecure_of(n) == 1 ? 0 : 4;
    kvp_node_destroy(n);
    c.insecure = 0;
    c.psk = KEY;
    c.psk_len = sizeof(KEY) - 1;
    if (rc == 0 && kvp__node_create_ex(&c, &seams, &n) != KVP_OK)
        rc = 5;
    if (rc == 0) {
        kvp_config_t r = c;
        r.psk = NULL;
        r.psk_len = 0;
        if (insecure_of(n) != 0)
            rc = 6;
        else if (kvp_node_reconfigure(n, &r) != KVP_ERR_INVALID ||
                 strstr(kvp_last_error(), "insecure") == NULL)
            rc = 7;
        kvp_node_destroy(n);
    }
    kvp_fake_fabric_destroy(fab);
    return rc;
}

static void test_gate_open_node_in_netns(void **state)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(open_node_child());
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) == 77)
        skip();
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gate_refuses_open_listen_without_key),
        cmocka_unit_test(test_gate_loopback_needs_no_key),
        cmocka_unit_test(test_gate_open_node_in_netns),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
