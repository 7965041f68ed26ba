/*
 * test_ucx_blob.c -- the UCX address blob's unpack on bad input (issue 9,
 * hostile peers). A peer's HELLO_ACK blob holds a UCX worker address and a
 * packed rkey that UCX parses without a length and trusts: ucp_ep_create on a
 * garbled address aborts the process (measured, UCX 1.13). So every byte of
 * the blob is covered by a digest and checked before anything reaches UCX.
 *
 * Mutations tried (each makes this test fail): the digest check removed from
 * kvp__ucx_blob_view (test_garbled_parts_never_reach_ucx aborts inside
 * ucp_ep_create); the region-length rule removed (test_header_rules).
 */
#include "testutil.h"
#include "transport/ucx_int.h"
#include "ucx_testlib.h"

#include <stdlib.h>
#include <string.h>

#define NB 32u
#define BS 4096u

static const kvp_layout_t g_layout = {NB, BS};
static kvp_test_logcap_t cap; /* file-static: see test_ucx.c */

static kvp_xport_t *solo(void)
{
    kvp_xport_t *x = ut_xport_new("", "blob");
    void *base = NULL;
    assert_non_null(x);
    assert_int_equal(x->ops->register_region(x, NULL, (size_t)NB * BS, &g_layout, &base), KVP_OK);
    return x;
}

static uint64_t le_get(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void le_put(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Re-seal a hand-edited blob, as a forger (or a buggy packer) would. */
static void reseal(uint8_t *b, size_t len)
{
    le_put(b + len - UCX_BLOB_DIGEST, kvp_hash64(b, len - UCX_BLOB_DIGEST, UCX_BLOB_MAGIC), 8);
}

static kvp_status_t parse(const uint8_t *b, size_t len)
{
    kvp_ucx_blob_parts_t parts;
    return kvp_ucx_blob_parse(b, len, &parts);
}

/* Our own blob parses and its parts are where the header says. */
static void test_own_blob(void **state)
{
    kvp_xport_t *x = solo();
    const void *b;
    size_t len;
    kvp_ucx_blob_parts_t p;
    assert_int_equal(x->ops->local_blob(x, &b, &len), KVP_OK);
    assert_int_equal(kvp_ucx_blob_parse(b, len, &p), KVP_OK);
    assert_int_equal(p.layout.num_blocks, NB);
    assert_int_equal(p.layout.block_size, BS);
    assert_true(p.region_len >= (uint64_t)NB * BS);
    /* v5: host | AM address | rkey | RMA address | probe rkey | digest */
    assert_ptr_equal(p.rma_worker_addr, (const uint8_t *)p.rkey + p.rkey_len);
    assert_true(p.rma_worker_addr_len > 0);
    assert_true(UCX_BLOB_HDR + p.host_id_len + p.worker_addr_len + p.rkey_len +
                    p.rma_worker_addr_len + le_get((const uint8_t *)b + 60, 2) + UCX_BLOB_DIGEST ==
                len);
    assert_true(le_get((const uint8_t *)b + 44, 8) != 0); /* the secret */
    assert_int_equal(le_get(b, 4), UCX_BLOB_MAGIC);
    assert_int_equal(le_get((const uint8_t *)b + 4, 2), UCX_BLOB_VERSION);
    assert_int_equal(x->ops->close(x, false), KVP_OK);
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* Random bytes of every small length and of the limits, every truncation,
 * every one-byte change, a trailing byte: refused, nothing read out of
 * bounds (ASan), no status but the three documented ones. */
static void test_garbage_truncation_flips(void **state)
{
    kvp_xport_t *x = solo();
    const void *ob;
    size_t len;
    kvp_rng_t rng;
    kvp_rng_seed(&rng, 9);
    assert_int_equal(x->ops->local_blob(x, &ob, &len), KVP_OK);
    uint8_t *b = malloc(KVP_UCX_BLOB_MAX + 16);
    assert_non_null(b);
    for (size_t n = 0; n <= KVP_UCX_BLOB_MAX + 1; n += (n < 512 ? 1 : 1531)) {
        for (size_t i = 0; i < n; i++)
            b[i] = (uint8_t)kvp_rng_next(&rng);
        if (n >= 6 && (n & 1)) { /* half of them with the right magic and version */
            le_put(b, UCX_BLOB_MAGIC, 4);
            le_put(b + 4, UCX_BLOB_VERSION, 2);
        }
        kvp_status_t s = parse(b, n);
        assert_true(s == KVP_ERR_PROTO || s == KVP_ERR_TRUNCATED || s == KVP_ERR_INCOMPATIBLE);
    }
    for (size_t cut = 0; cut < len; cut++) {
        memcpy(b, ob, cut);
        kvp_status_t s = parse(b, cut);
        assert_true(s == KVP_ERR_TRUNCATED || s == KVP_ERR_PROTO);
    }
    for (size_t i = 0; i < len; i++) {
        memcpy(b, ob, len);
        b[i] ^= (uint8_t)(1u << (i % 8));
        kvp_status_t s = parse(b, len);
        if (s == KVP_OK)
            fail_msg("a change of byte %zu of %zu went unnoticed", i, len);
    }
    memcpy(b, ob, len);
    b[len] = 0;
    assert_int_equal(parse(b, len + 1), KVP_ERR_PROTO);
    assert_int_equal(parse(NULL, len), KVP_ERR_TRUNCATED);
    assert_int_equal(kvp_ucx_blob_parse(ob, len, NULL), KVP_ERR_INVALID);
    free(b);
    assert_int_equal(x->ops->close(x, false), KVP_OK);
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* A blob of a previous format (version 1, no digest; version 4, one worker
 * with RMA reachable over tcp) is a clear incompatibility, not a protocol
 * error. */
static void test_old_version(void **state)
{
    kvp_xport_t *x = solo();
    const void *ob;
    size_t len;
    uint8_t b[KVP_UCX_BLOB_MAX];
    assert_int_equal(x->ops->local_blob(x, &ob, &len), KVP_OK);
    memcpy(b, ob, len - UCX_BLOB_DIGEST);
    le_put(b + 4, 1, 2);
    assert_int_equal(parse(b, len - UCX_BLOB_DIGEST), KVP_ERR_INCOMPATIBLE);
    memcpy(b, ob, len);
    le_put(b + 4, 4, 2);
    reseal(b, len);
    assert_int_equal(parse(b, len), KVP_ERR_INCOMPATIBLE);
    assert_int_equal(x->ops->close(x, false), KVP_OK);
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* Each header rule on its own: the blob is re-sealed after the edit, so only
 * that rule can refuse it. */
static void test_header_rules(void **state)
{
    kvp_xport_t *x = solo();
    const void *ob;
    size_t len;
    uint8_t b[KVP_UCX_BLOB_MAX];
    assert_int_equal(x->ops->local_blob(x, &ob, &len), KVP_OK);
    struct {
        const char *what;
        size_t off;
        int n;
        uint64_t v;
    } rules[] = {
        {"num_blocks 0", 8, 4, 0},
        {"block_size 0", 12, 4, 0},
        {"region base 0", 16, 8, 0},
        {"region shorter than the layout", 24, 8, (uint64_t)NB * BS - 1},
        {"region end wraps around", 16, 8, UINT64_MAX - 4096},
        {"reserved field not zero", 62, 2, 1},
        {"empty RMA worker address", 42, 2, 0},
        {"secret 0 (issue 27)", 44, 8, 0},
        {"probe base without its rkey", 60, 2, 0},
        {"host id longer than the limit", 36, 2, UCX_HOST_MAX + 1},
        {"rkey longer than the limit", 40, 2, UCX_RKEY_MAX + 1},
        {"empty worker address", 38, 2, 0},
        {"empty rkey", 40, 2, 0},
    };
    for (size_t i = 0; i < KVP_ARRAY_SIZE(rules); i++) {
        memcpy(b, ob, len);
        le_put(b + rules[i].off, rules[i].v, rules[i].n);
        reseal(b, len);
        kvp_status_t s = parse(b, len);
        if (s == KVP_OK)
            fail_msg("rule not enforced: %s", rules[i].what);
        assert_true(s == KVP_ERR_PROTO || s == KVP_ERR_TRUNCATED);
    }
    /* and a re-sealed, unchanged blob is fine (the digest is all reseal did) */
    memcpy(b, ob, len);
    reseal(b, len);
    assert_int_equal(parse(b, len), KVP_OK);
    assert_int_equal(x->ops->close(x, false), KVP_OK);
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* The case that aborted kvpeerd: header and lengths intact, the worker
 * address (or the rkey) garbled. add_peer refuses it before ucp_ep_create /
 * ucp_ep_rkey_unpack, registers nothing, and says why. */
static void test_garbled_parts_never_reach_ucx(void **state)
{
    kvp_test_logcap_start(&cap);
    kvp_xport_t *x = solo();
    const void *ob;
    size_t len;
    uint8_t b[KVP_UCX_BLOB_MAX];
    kvp_ucx_blob_parts_t p;
    kvp_xpeer_id_t id = 0;
    kvp_xport_stats_t st;
    kvp_rng_t rng;
    kvp_rng_seed(&rng, 99);
    assert_int_equal(x->ops->local_blob(x, &ob, &len), KVP_OK);
    assert_int_equal(kvp_ucx_blob_parse(ob, len, &p), KVP_OK);
    uint64_t warn0 = cap.count[KVP_LOG_WARN];
    size_t addr_off = (size_t)((const uint8_t *)p.worker_addr - (const uint8_t *)ob);
    size_t rkey_off = (size_t)((const uint8_t *)p.rkey - (const uint8_t *)ob);
    for (int round = 0; round < 16; round++) {
        memcpy(b, ob, len);
        size_t off = round % 2 ? rkey_off : addr_off,
               n = round % 2 ? p.rkey_len : p.worker_addr_len;
        if (round < 4)
            b[off] ^= 0x04; /* the address version nibble: what UCX asserted on */
        else
            for (size_t i = 0; i < n; i++)
                b[off + i] = (uint8_t)kvp_rng_next(&rng);
        assert_int_equal(x->ops->add_peer(x, b, len, &g_layout, &id), KVP_ERR_PROTO);
    }
    assert_int_equal(id, 0);
    x->ops->get_stats(x, &st);
    assert_int_equal(st.peers, 0);
    assert_int_equal(cap.count[KVP_LOG_WARN] - warn0, 16); /* one line per refusal */
    /* the intact blob still imports (a loopback endpoint to ourselves) */
    assert_int_equal(x->ops->add_peer(x, ob, len, &g_layout, &id), KVP_OK);
    assert_int_equal(x->ops->remove_peer(x, id), KVP_OK);
    assert_int_equal(x->ops->close(x, false), KVP_OK);
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* The UCX settings kvpeer applies (kvp_ucx_config_each): the tcp transport
 * sends 64K fragments unless the operator set either segment size (an RX
 * smaller than our TX would drop fragments). */
typedef struct seen_cfg {
    char tx[32];
    int n;
} seen_cfg_t;

static void seen_set(const char *k, const char *v, void *arg)
{
    seen_cfg_t *s = arg;
    s->n++;
    if (strcmp(k, "TX_SEG_SIZE") == 0)
        snprintf(s->tx, sizeof(s->tx), "%s", v);
}

static void test_tcp_segment_size(void **state)
{
    (void)state;
    char *old_tx = getenv("UCX_TCP_TX_SEG_SIZE"), *old_rx = getenv("UCX_TCP_RX_SEG_SIZE");
    old_tx = old_tx ? strdup(old_tx) : NULL;
    old_rx = old_rx ? strdup(old_rx) : NULL;
    unsetenv("UCX_TCP_TX_SEG_SIZE");
    unsetenv("UCX_TCP_RX_SEG_SIZE");
    seen_cfg_t s = {{0}, 0};
    kvp_ucx_config_each(NULL, seen_set, &s);
    assert_string_equal(s.tx, "64K");
    setenv("UCX_TCP_RX_SEG_SIZE", "8K", 1);
    memset(&s, 0, sizeof(s));
    kvp_ucx_config_each(NULL, seen_set, &s);
    assert_string_equal(s.tx, ""); /* the operator's segment sizes stand */
    assert_true(s.n > 0);
    unsetenv("UCX_TCP_RX_SEG_SIZE");
    if (old_tx)
        setenv("UCX_TCP_TX_SEG_SIZE", old_tx, 1);
    if (old_rx)
        setenv("UCX_TCP_RX_SEG_SIZE", old_rx, 1);
    free(old_tx);
    free(old_rx);
}

int main(int argc, char **argv)
{
    (void)argc;
    ut_main_init(argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_own_blob),
        cmocka_unit_test(test_garbage_truncation_flips),
        cmocka_unit_test(test_old_version),
        cmocka_unit_test(test_header_rules),
        cmocka_unit_test(test_garbled_parts_never_reach_ucx),
        cmocka_unit_test(test_tcp_segment_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
