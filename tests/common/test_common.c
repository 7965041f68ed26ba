/* test_common.c -- the common layer: status text, rate limit, clocks, the
 * allocation seam, digests, the PRNG. */
#include "testutil.h"

#include <xxhash.h>

static void test_status_str(void **state)
{
    (void)state;
    assert_string_equal(kvp_status_str(KVP_OK), "ok");
    for (int s = 0; s >= KVP_ERR_TRUNCATED; s--)
        assert_string_not_equal(kvp_status_str((kvp_status_t)s), "unknown status");
    assert_string_equal(kvp_status_str((kvp_status_t)-999), "unknown status");
}

static void test_ratelimit(void **state)
{
    (void)state;
    kvp_ratelimit_t rl;
    uint64_t sup = 99;
    kvp_ratelimit_init(&rl, 1000, 2);
    assert_true(kvp_ratelimit_allow(&rl, 10, &sup));
    assert_int_equal(sup, 0);
    assert_true(kvp_ratelimit_allow(&rl, 20, &sup));
    assert_false(kvp_ratelimit_allow(&rl, 30, &sup));
    assert_false(kvp_ratelimit_allow(&rl, 40, &sup));
    assert_true(kvp_ratelimit_allow(&rl, 1010, &sup)); /* new window */
    assert_int_equal(sup, 2);
}

static void test_log_sink_and_rl_macro(void **state)
{
    (void)state;
    kvp_test_logcap_t cap;
    kvp_ratelimit_t rl;
    kvp_test_logcap_start(&cap);
    kvp_ratelimit_init(&rl, KVP_NSEC_PER_SEC, 1);
    for (int i = 0; i < 5; i++)
        KVP_LOG_RL(&rl, 100 + (uint64_t)i, KVP_LOG_ERROR, "n1", "peer %s: bad frame", "p");
    assert_int_equal(cap.count[KVP_LOG_ERROR], 1);
    KVP_LOG_RL(&rl, 100 + KVP_NSEC_PER_SEC, KVP_LOG_ERROR, "n1", "peer %s: bad frame", "p");
    assert_int_equal(cap.count[KVP_LOG_ERROR], 2);
    assert_non_null(strstr(cap.last[KVP_LOG_ERROR], "4 similar suppressed"));
    /* Levels above the threshold do not evaluate their arguments. */
    kvp_log_set_level(KVP_LOG_INFO);
    int evaluated = 0;
    KVP_DEBUG("n1", "x %d", ++evaluated);
    assert_int_equal(evaluated, 0);
    kvp_test_logcap_stop();
}

static void test_manual_clock(void **state)
{
    (void)state;
    kvp_manual_clock_t mc;
    kvp_manual_clock_init(&mc, 5);
    assert_int_equal(kvp_clock_now(&mc.clock), 5);
    kvp_manual_clock_advance(&mc, 10);
    assert_int_equal(kvp_clock_now(&mc.clock), 15);
    uint64_t a = kvp_clock_now(kvp_clock_real());
    uint64_t b = kvp_clock_now(kvp_clock_real());
    assert_true(b >= a);
}

static void test_alloc_seam(void **state)
{
    (void)state;
    kvp_alloc_fail_at(2, false);
    void *a = kvp__malloc(8);
    void *b = kvp__malloc(8);
    void *c = kvp__malloc(8);
    assert_non_null(a);
    assert_null(b);
    assert_non_null(c);
    kvp__free(a);
    kvp__free(c);
    kvp_alloc_fail_at(1, true);
    assert_null(kvp__calloc(1, 1));
    assert_null(kvp__strdup("x"));
    kvp_alloc_fail_at(0, false);
    char *d = kvp__strdup("abc");
    assert_string_equal(d, "abc");
    kvp__free(d);
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void test_digest_and_rng(void **state)
{
    (void)state;
    char buf[64];
    memset(buf, 7, sizeof(buf));
    kvp_digest_t d1 = kvp_digest(buf, sizeof(buf), 0);
    kvp_digest_t d2 = kvp_digest(buf, sizeof(buf), 0);
    assert_true(kvp_digest_eq(&d1, &d2));
    buf[10] ^= 1;
    d2 = kvp_digest(buf, sizeof(buf), 0);
    assert_false(kvp_digest_eq(&d1, &d2));

    kvp_rng_t r1, r2;
    kvp_rng_seed(&r1, 42);
    kvp_rng_seed(&r2, 42);
    for (int i = 0; i < 100; i++)
        assert_int_equal(kvp_rng_next(&r1), kvp_rng_next(&r2));
    for (int i = 0; i < 100; i++)
        assert_true(kvp_rng_below(&r1, 7) < 7);
    uint8_t e[16] = {0};
    assert_int_equal(kvp_random_bytes(e, sizeof(e)), KVP_OK);
}

kvp_digest_t kvp__digest_avx2(const void *data, size_t len, uint64_t seed);

/* The AVX2 build of xxh3 and the distribution's library give the same
 * digest (the store's checksums must not depend on the CPU). */
static void test_digest_avx2_matches_library(void **state)
{
    (void)state;
    if (!__builtin_cpu_supports("avx2"))
        skip();
    static uint8_t buf[1 << 20];
    kvp_rng_t r;
    kvp_rng_seed(&r, 7);
    for (size_t i = 0; i < sizeof(buf); i++)
        buf[i] = (uint8_t)kvp_rng_next(&r);
    size_t lens[] = {0, 1, 16, 17, 128, 129, 240, 241, 4096, 65536, sizeof(buf)};
    for (size_t i = 0; i < KVP_ARRAY_SIZE(lens); i++) {
        XXH128_hash_t h = XXH3_128bits_withSeed(buf, lens[i], 99);
        kvp_digest_t d = kvp__digest_avx2(buf, lens[i], 99);
        assert_int_equal(d.lo, h.low64);
        assert_int_equal(d.hi, h.high64);
        kvp_digest_t e = kvp_digest(buf, lens[i], 99);
        assert_true(kvp_digest_eq(&d, &e));
    }
}

/* kvp_copy_stream equals memcpy for every length around its 16-byte head,
 * 64-byte body and tail boundaries and every destination / source
 * misalignment, and writes nothing outside [dst, dst + len). */
static void test_copy_stream(void **state)
{
    (void)state;
    enum { CAP = 8192, GUARD = 64 };
    static uint8_t src[CAP + 64], dst[CAP + 2 * GUARD + 64], want[CAP + 2 * GUARD + 64];
    static const size_t lens[] = {0,   1,   15,  16,  63,  64,   255,  256,  257,
                                  271, 319, 320, 333, 4095, 4096, 4097, 8000, CAP};
    kvp_rng_t rng;
    kvp_rng_seed(&rng, 5);
    for (size_t i = 0; i < sizeof(src); i++)
        src[i] = (uint8_t)kvp_rng_next(&rng);
    for (size_t li = 0; li < sizeof(lens) / sizeof(lens[0]); li++)
        for (size_t da = 0; da < 17; da += 3)
            for (size_t sa = 0; sa < 17; sa += 8) {
                memset(dst, 0xa5, sizeof(dst));
                memset(want, 0xa5, sizeof(want));
                memcpy(want + GUARD + da, src + sa, lens[li]);
                kvp_copy_stream(dst + GUARD + da, src + sa, lens[li]);
                assert_memory_equal(dst, want, sizeof(dst));
            }
}

static void test_list(void **state)
{
    (void)state;
    kvp_list_t head, a, b;
    kvp_list_init(&head);
    kvp_list_init(&a);
    kvp_list_init(&b);
    assert_true(kvp_list_empty(&head));
    kvp_list_insert_tail(&head, &a);
    kvp_list_insert_head(&head, &b);
    assert_ptr_equal(head.next, &b);
    assert_true(kvp_list_linked(&a));
    kvp_list_remove(&a);
    assert_false(kvp_list_linked(&a));
    kvp_list_remove(&b);
    assert_true(kvp_list_empty(&head));
}

static void test_time_scale(void **state)
{
    (void)state;
    assert_true(kvp_test_time_scale() >= 1.0);
    assert_true(kvp_test_scaled_ns(1000) >= 1000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_str),   cmocka_unit_test(test_ratelimit),
        cmocka_unit_test(test_log_sink_and_rl_macro), cmocka_unit_test(test_manual_clock),
        cmocka_unit_test(test_alloc_seam),   cmocka_unit_test(test_digest_and_rng),
        cmocka_unit_test(test_list),         cmocka_unit_test(test_copy_stream),
        cmocka_unit_test(test_digest_avx2_matches_library), cmocka_unit_test(test_time_scale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
