/* test_store_external.c -- issue 29: a store created `external` (the
 * embedding's region): no reserve, no eviction; lend / verify / abandon /
 * quarantine of lent slots (never indexed); publish / unpublish with the
 * unpublish callback at the last unpin. kvp_store_check() after each step. */
#include "testutil.h"

#include "store/store.h"

#define BS 4096u
#define NB 8u

typedef struct fix {
    kvp_manual_clock_t clk;
    kvp_store_t *s;
    int freed;
    uint32_t freed_slot;
} fix_t;

static void on_unpublish(void *arg, uint32_t slot)
{
    fix_t *f = arg;
    f->freed++;
    f->freed_slot = slot;
}

#define CHECK_OK(s)                                                                                \
    do {                                                                                           \
        char why_[256];                                                                            \
        if (kvp_store_check((s), why_, sizeof(why_)) != KVP_OK)                                    \
            fail_msg("kvp_store_check: %s", why_);                                                 \
    } while (0)

static void fix_open(fix_t *f)
{
    memset(f, 0, sizeof(*f));
    kvp_manual_clock_init(&f->clk, 1000);
    kvp_store_config_t c = {0};
    c.num_blocks = NB;
    c.block_size = BS;
    c.hash_seed = 7;
    c.clock = &f->clk.clock;
    c.commit_cb_arg = f;
    c.external = true;
    c.unpublish_cb = on_unpublish;
    assert_int_equal(kvp_store_create(&c, &f->s), KVP_OK);
    CHECK_OK(f->s);
}

static kvp_slot_state_t state_of(fix_t *f, uint32_t slot)
{
    kvp_slot_info_t info;
    assert_int_equal(kvp_store_slot_info(f->s, slot, &info), KVP_OK);
    return info.state;
}

static void test_ext_no_reserve_no_eviction(void **state)
{
    (void)state;
    fix_t f;
    fix_open(&f);
    kvp_slot_ref_t ref;
    void *p;
    assert_int_equal(kvp_store_reserve(f.s, "a", 1, 0, &ref, &p), KVP_ERR_UNSUPPORTED);
    assert_int_equal(kvp_store_publish(f.s, 2, "a", 1, &ref), KVP_OK);
    assert_int_equal(kvp_store_evict_one(f.s), KVP_ERR_NOSPACE); /* published: not evictable */
    assert_int_equal(state_of(&f, 2), KVP_SLOT_READY);
    CHECK_OK(f.s);
    uint32_t slot;
    assert_int_equal(kvp_store_unpublish(f.s, "a", 1, &slot), KVP_OK);
    assert_int_equal(slot, 2);
    assert_int_equal(state_of(&f, 2), KVP_SLOT_FREE);
    assert_int_equal(f.freed, 0); /* unpinned: the caller knows at once */
    CHECK_OK(f.s);
    kvp_store_destroy(f.s);
}

static void test_ext_lend_is_not_indexed(void **state)
{
    (void)state;
    fix_t f;
    fix_open(&f);
    kvp_slot_ref_t r1, r2, r3;
    assert_int_equal(kvp_store_lend(f.s, NB, "k", 1, &r1), KVP_ERR_INVALID);
    assert_int_equal(kvp_store_lend(f.s, 3, "k", 1, &r1), KVP_OK);
    assert_int_equal(kvp_store_lend(f.s, 3, "k", 1, &r2), KVP_ERR_BUSY); /* lent already */
    assert_int_equal(kvp_store_lend(f.s, 4, "k", 1, &r2), KVP_OK);      /* same key: fine */
    CHECK_OK(f.s);
    assert_int_equal(kvp_store_probe(f.s, "k", 1, NULL, NULL), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_store_lookup(f.s, "k", 1, NULL, NULL, NULL), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_store_publish(f.s, 4, "z", 1, &r3), KVP_ERR_BUSY); /* lent */
    /* Never committed into the cache. */
    assert_int_equal(kvp_store_commit(f.s, r1), KVP_ERR_STATE);
    kvp_digest_t d = kvp_digest(kvp_store_slot_ptr(f.s, 3), BS, 7), bad = d;
    bad.lo ^= 1;
    assert_int_equal(kvp_store_commit_verify(f.s, r1, &d), KVP_ERR_STATE);
    assert_int_equal(kvp_store_verify(f.s, r1, &d), KVP_OK);
    assert_int_equal(kvp_store_verify(f.s, r1, &bad), KVP_ERR_CHECKSUM);
    assert_int_equal(state_of(&f, 3), KVP_SLOT_FILLING);
    assert_int_equal(kvp_store_abandon(f.s, r1), KVP_OK);
    assert_int_equal(state_of(&f, 3), KVP_SLOT_FREE);
    CHECK_OK(f.s);
    /* Quarantined and released: back to FREE, not suspect (the embedding's). */
    assert_int_equal(kvp_store_quarantine(f.s, r2), KVP_OK);
    CHECK_OK(f.s);
    assert_int_equal(kvp_store_release_quarantined(f.s, r2, true), KVP_OK);
    kvp_slot_info_t info;
    assert_int_equal(kvp_store_slot_info(f.s, 4, &info), KVP_OK);
    assert_int_equal(info.state, KVP_SLOT_FREE);
    assert_int_equal(info.suspect_until_ns, 0);
    CHECK_OK(f.s);
    assert_int_equal(kvp_store_lend(f.s, 4, "q", 1, &r2), KVP_OK); /* lendable again */
    assert_int_equal(kvp_store_abandon(f.s, r2), KVP_OK);
    CHECK_OK(f.s);
    kvp_store_destroy(f.s);
}

static void test_ext_unpublish_pinned(void **state)
{
    (void)state;
    fix_t f;
    fix_open(&f);
    kvp_slot_ref_t ref, got;
    memset(kvp_store_slot_ptr(f.s, 5), 0xab, BS);
    assert_int_equal(kvp_store_publish(f.s, 5, "pub", 3, &ref), KVP_OK);
    assert_int_equal(kvp_store_publish(f.s, 6, "pub", 3, &got), KVP_ERR_EXISTS);
    assert_int_equal(kvp_store_lend(f.s, 5, "x", 1, &got), KVP_ERR_BUSY); /* published */
    assert_int_equal(kvp_store_lookup(f.s, "pub", 3, &got, NULL, NULL), KVP_OK); /* a pin */
    assert_int_equal(kvp_store_pin(f.s, ref), KVP_OK);                          /* two */
    uint32_t slot = 99;
    assert_int_equal(kvp_store_unpublish(f.s, "pub", 3, &slot), KVP_ERR_BUSY);
    assert_int_equal(slot, 5);
    assert_int_equal(kvp_store_unpublish(f.s, "pub", 3, &slot), KVP_ERR_BUSY); /* still */
    CHECK_OK(f.s);
    assert_int_equal(kvp_store_lookup(f.s, "pub", 3, NULL, NULL, NULL), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_store_pin(f.s, ref), KVP_ERR_STALE); /* no new pin */
    assert_int_equal(kvp_store_unpin(f.s, ref), KVP_OK);
    assert_int_equal(f.freed, 0);
    assert_int_equal(state_of(&f, 5), KVP_SLOT_READY);
    assert_int_equal(kvp_store_unpin(f.s, ref), KVP_OK); /* the last pin */
    assert_int_equal(f.freed, 1);
    assert_int_equal(f.freed_slot, 5);
    assert_int_equal(state_of(&f, 5), KVP_SLOT_FREE);
    assert_int_equal(kvp_store_unpublish(f.s, "pub", 3, &slot), KVP_ERR_NOT_FOUND);
    CHECK_OK(f.s);
    kvp_store_destroy(f.s);
}

/* kvp_store_slot_digest is what publish computes; publish_digest takes the
 * digest it is given (the embedding's, from when it wrote the slot) and
 * hashes nothing: a stale one is served as given (the consumer's verify
 * refuses it; tests/python test_vllm_zerocopy). */
static void test_ext_publish_digest(void **state)
{
    (void)state;
    fix_t f;
    fix_open(&f);
    kvp_slot_ref_t ref;
    kvp_digest_t got, want = kvp_digest("", 0, 1);
    memset(kvp_store_slot_ptr(f.s, 1), 0x5a, BS);
    memset(kvp_store_slot_ptr(f.s, 2), 0x5a, BS);
    kvp_digest_t d1 = kvp_store_slot_digest(f.s, 1), h = kvp_digest(kvp_store_slot_ptr(f.s, 1), BS, 7);
    assert_true(kvp_digest_eq(&d1, &h)); /* the store's seed (7) */
    assert_int_equal(kvp_store_publish(f.s, 1, "h", 1, &ref), KVP_OK); /* hashed here */
    assert_int_equal(kvp_store_lookup(f.s, "h", 1, &ref, NULL, &got), KVP_OK);
    assert_true(kvp_digest_eq(&got, &d1));
    assert_int_equal(kvp_store_unpin(f.s, ref), KVP_OK);
    assert_int_equal(kvp_store_publish_digest(f.s, 2, "g", 1, &want, false, 0, &ref), KVP_OK);
    assert_int_equal(kvp_store_lookup(f.s, "g", 1, &ref, NULL, &got), KVP_OK);
    assert_true(kvp_digest_eq(&got, &want)); /* as given, not the bytes' */
    assert_false(kvp_digest_eq(&got, &d1));
    assert_int_equal(kvp_store_unpin(f.s, ref), KVP_OK);
    assert_int_equal(kvp_store_publish_digest(f.s, 3, "g", 1, &want, false, 0, &ref), KVP_ERR_EXISTS);
    CHECK_OK(f.s);
    kvp_store_destroy(f.s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ext_no_reserve_no_eviction),
        cmocka_unit_test(test_ext_lend_is_not_indexed),
        cmocka_unit_test(test_ext_unpublish_pinned),
        cmocka_unit_test(test_ext_publish_digest),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
