/* test_store.c -- block store unit tests: transitions, refs, keys, eviction,
 * LRU, suspect slots, pins, checksums, bad input, allocation failures, and
 * the validator. Every test runs kvp_store_check() after each step. */
#include "testutil.h"

#include "store/store.h"

#include <sys/mman.h>
#include <unistd.h>

#define BS 4096u

typedef struct fix {
    kvp_manual_clock_t clk;
    kvp_store_config_t cfg;
    kvp_store_t *s;
    kvp_test_logcap_t cap;
    /* commit callback record */
    int commits;
    char last_key[KVP_KEY_MAX + 1];
    kvp_slot_ref_t last_ref;
} fix_t;

static void on_commit(void *arg, const void *key, uint32_t key_len, kvp_slot_ref_t ref)
{
    fix_t *f = arg;
    f->commits++;
    memcpy(f->last_key, key, key_len);
    f->last_key[key_len] = '\0';
    f->last_ref = ref;
}

#define CHECK_OK(s)                                                                                \
    do {                                                                                           \
        char why_[256];                                                                            \
        kvp_status_t rc_ = kvp_store_check((s), why_, sizeof(why_));                               \
        if (rc_ != KVP_OK)                                                                         \
            fail_msg("kvp_store_check: %s", why_);                                                 \
    } while (0)

static void fix_open(fix_t *f, uint32_t n, uint32_t max_pins)
{
    memset(f, 0, sizeof(*f));
    kvp_manual_clock_init(&f->clk, 1000);
    f->cfg.num_blocks = n;
    f->cfg.block_size = BS;
    f->cfg.max_pins = max_pins;
    f->cfg.suspect_period_ns = 1000000;
    f->cfg.hash_seed = 0x1234;
    f->cfg.clock = &f->clk.clock;
    f->cfg.commit_cb = on_commit;
    f->cfg.commit_cb_arg = f;
    f->cfg.log_prefix = "t";
    kvp_test_logcap_start(&f->cap);
    assert_int_equal(kvp_store_create(&f->cfg, &f->s), KVP_OK);
    CHECK_OK(f->s);
}

static void fix_close(fix_t *f)
{
    CHECK_OK(f->s);
    kvp_store_destroy(f->s);
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

static kvp_slot_ref_t put(fix_t *f, const char *key, unsigned flags, uint8_t fill)
{
    kvp_slot_ref_t ref;
    void *p;
    assert_int_equal(kvp_store_reserve(f->s, key, strlen(key), flags, &ref, &p), KVP_OK);
    memset(p, fill, BS);
    CHECK_OK(f->s);
    assert_int_equal(kvp_store_commit(f->s, ref), KVP_OK);
    CHECK_OK(f->s);
    return ref;
}

static kvp_slot_state_t state_of(fix_t *f, kvp_slot_ref_t ref)
{
    kvp_slot_info_t info;
    assert_int_equal(kvp_store_slot_info(f->s, ref.slot, &info), KVP_OK);
    return info.state;
}

static kvp_status_t get(fix_t *f, const char *key, kvp_slot_ref_t *ref)
{
    kvp_status_t rc = kvp_store_lookup(f->s, key, strlen(key), ref, NULL, NULL);
    CHECK_OK(f->s);
    return rc;
}

/* ---------------------------------------------------------------- create */

static void test_create_bad_input(void **state)
{
    kvp_store_config_t cfg = {.num_blocks = 4, .block_size = BS};
    kvp_store_t *s = (kvp_store_t *)(uintptr_t)0x1;
    assert_int_equal(kvp_store_create(NULL, &s), KVP_ERR_INVALID);
    assert_int_equal(kvp_store_create(&cfg, NULL), KVP_ERR_INVALID);
    cfg.block_size = 0;
    assert_int_equal(kvp_store_create(&cfg, &s), KVP_ERR_INVALID);
    cfg.block_size = 1000;
    assert_int_equal(kvp_store_create(&cfg, &s), KVP_ERR_INVALID);
    cfg.block_size = BS + 512;
    assert_int_equal(kvp_store_create(&cfg, &s), KVP_ERR_INVALID);
    cfg.block_size = BS;
    cfg.num_blocks = 0;
    assert_int_equal(kvp_store_create(&cfg, &s), KVP_ERR_INVALID);
    cfg.num_blocks = 4;
    char *buf = mmap(NULL, 8 * BS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(buf != MAP_FAILED);
    cfg.region = buf;
    cfg.region_len = 4 * BS - 1; /* too small */
    assert_int_equal(kvp_store_create(&cfg, &s), KVP_ERR_INVALID);
    cfg.region = buf + 64; /* unaligned */
    cfg.region_len = 6 * BS;
    assert_int_equal(kvp_store_create(&cfg, &s), KVP_ERR_INVALID);
    assert_ptr_equal(s, (kvp_store_t *)(uintptr_t)0x1); /* out-param untouched */
    munmap(buf, 8 * BS);
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void test_create_regions(void **state)
{
    kvp_store_config_t cfg = {.num_blocks = 4, .block_size = BS};
    kvp_store_t *s;
    long page = sysconf(_SC_PAGESIZE);
    /* own mapping */
    assert_int_equal(kvp_store_create(&cfg, &s), KVP_OK);
    assert_int_equal((uintptr_t)kvp_store_base(s) % (uintptr_t)page, 0);
    assert_int_equal(kvp_store_region_len(s), 4 * BS);
    assert_int_equal(kvp_store_num_blocks(s), 4);
    assert_int_equal(kvp_store_block_size(s), BS);
    assert_ptr_equal(kvp_store_slot_ptr(s, 3), (char *)kvp_store_base(s) + 3 * BS);
    memset(kvp_store_slot_ptr(s, 3), 7, BS); /* writable */
    kvp_store_destroy(s);
    /* huge pages asked: either got them or fell back cleanly */
    cfg.huge_pages = true;
    assert_int_equal(kvp_store_create(&cfg, &s), KVP_OK);
    memset(kvp_store_base(s), 1, 4 * BS);
    kvp_store_destroy(s);
    /* supplied region: used as is, not unmapped by destroy */
    char *buf = mmap(NULL, 4 * BS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cfg.huge_pages = false;
    cfg.region = buf;
    cfg.region_len = 4 * BS;
    assert_int_equal(kvp_store_create(&cfg, &s), KVP_OK);
    assert_ptr_equal(kvp_store_base(s), buf);
    assert_false(kvp_store_is_huge(s));
    kvp_store_destroy(s);
    buf[0] = 1; /* still mapped */
    munmap(buf, 4 * BS);
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void test_create_alloc_failures(void **state)
{
    kvp_store_config_t cfg = {.num_blocks = 8, .block_size = BS};
    kvp_store_t *s = NULL;
    uint64_t n;
    for (n = 1; n < 100; n++) {
        kvp_alloc_fail_at(n, false);
        kvp_status_t rc = kvp_store_create(&cfg, &s);
        if (rc == KVP_OK)
            break;
        assert_int_equal(rc, KVP_ERR_NOMEM);
        assert_int_equal(kvp_alloc_live(), 0);
    }
    kvp_alloc_fail_at(0, false);
    assert_true(n > 1 && n < 100);
    char why[128];
    assert_int_equal(kvp_store_check(s, why, sizeof(why)), KVP_OK);
    kvp_store_destroy(s);
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* ------------------------------------------------------------ transitions */

static void test_legal_transitions(void **state)
{
    fix_t f;
    fix_open(&f, 4, 0);
    kvp_slot_ref_t r, r2;
    kvp_slot_state_t st;
    void *p;
    /* FREE -> FILLING: key indexed as pending; set_state traces old -> new */
    kvp_log_set_level(KVP_LOG_TRACE);
    assert_int_equal(kvp_store_reserve(f.s, "a", 1, 0, &r, &p), KVP_OK);
    kvp_log_set_level(KVP_LOG_INFO);
    assert_non_null(strstr(f.cap.last[KVP_LOG_TRACE], "FREE -> FILLING"));
    assert_int_equal(r.gen, 1);
    assert_int_equal(kvp_store_probe(f.s, "a", 1, &r2, &st), KVP_OK);
    assert_int_equal(st, KVP_SLOT_FILLING);
    assert_int_equal(get(&f, "a", NULL), KVP_ERR_PENDING);
    /* FILLING -> READY: digest, callback */
    memset(p, 0x5a, BS);
    assert_int_equal(kvp_store_commit(f.s, r), KVP_OK);
    CHECK_OK(f.s);
    assert_int_equal(f.commits, 1);
    assert_string_equal(f.last_key, "a");
    assert_int_equal(f.last_ref.slot, r.slot);
    assert_int_equal(f.last_ref.gen, r.gen);
    kvp_digest_t d, want = kvp_digest(p, BS, f.cfg.hash_seed);
    const void *rp;
    assert_int_equal(kvp_store_lookup(f.s, "a", 1, &r2, &rp, &d), KVP_OK);
    assert_ptr_equal(rp, p);
    assert_true(kvp_digest_eq(&d, &want));
    assert_int_equal(kvp_store_unpin(f.s, r2), KVP_OK);
    /* READY -> FREE by eviction; the ref is stale afterwards */
    assert_int_equal(kvp_store_evict_one(f.s), KVP_OK);
    CHECK_OK(f.s);
    assert_int_equal(state_of(&f, r), KVP_SLOT_FREE);
    assert_false(kvp_store_ref_valid(f.s, r));
    assert_int_equal(get(&f, "a", NULL), KVP_ERR_NOT_FOUND);
    /* FILLING -> FREE by abandon */
    assert_int_equal(kvp_store_reserve(f.s, "b", 1, 0, &r, NULL), KVP_OK);
    assert_int_equal(kvp_store_abandon(f.s, r), KVP_OK);
    CHECK_OK(f.s);
    assert_int_equal(kvp_store_probe(f.s, "b", 1, NULL, NULL), KVP_ERR_NOT_FOUND);
    /* FILLING -> QUARANTINED -> FREE */
    kvp_manual_clock_set(&f.clk, 5000);
    assert_int_equal(kvp_store_reserve(f.s, "c", 1, 0, &r, NULL), KVP_OK);
    assert_int_equal(kvp_store_quarantine(f.s, r), KVP_OK);
    CHECK_OK(f.s);
    kvp_slot_info_t info;
    assert_int_equal(kvp_store_slot_info(f.s, r.slot, &info), KVP_OK);
    assert_int_equal(info.state, KVP_SLOT_QUARANTINED);
    assert_int_equal(info.quarantined_at_ns, 5000);
    assert_int_equal(kvp_store_probe(f.s, "c", 1, NULL, NULL), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_store_release_quarantined(f.s, r, false), KVP_OK);
    CHECK_OK(f.s);
    assert_int_equal(state_of(&f, r), KVP_SLOT_FREE);
    kvp_store_stats_t st2;
    kvp_store_get_stats(f.s, &st2);
    assert_int_equal(st2.reserves, 3);
    assert_int_equal(st2.commits, 1);
    assert_int_equal(st2.abandons, 1);
    assert_int_equal(st2.quarantines, 1);
    assert_int_equal(st2.quarantine_releases, 1);
    assert_int_equal(st2.evictions, 1);
    assert_int_equal(st2.slots[KVP_SLOT_FREE], 4);
    fix_close(&f);
}

static void test_illegal_transitions(void **state)
{
    fix_t f;
    fix_open(&f, 4, 0);
    kvp_slot_ref_t ready = put(&f, "ready", 0, 1), filling, quar;
    assert_int_equal(kvp_store_reserve(f.s, "fill", 4, 0, &filling, NULL), KVP_OK);
    assert_int_equal(kvp_store_reserve(f.s, "quar", 4, 0, &quar, NULL), KVP_OK);
    assert_int_equal(kvp_store_quarantine(f.s, quar), KVP_OK);
    /* READY accepts only pin/unpin/evict */
    assert_int_equal(kvp_store_commit(f.s, ready), KVP_ERR_STATE);
    assert_int_equal(kvp_store_abandon(f.s, ready), KVP_ERR_STATE);
    assert_int_equal(kvp_store_quarantine(f.s, ready), KVP_ERR_STATE);
    assert_int_equal(kvp_store_release_quarantined(f.s, ready, false), KVP_ERR_STATE);
    assert_int_equal(kvp_store_unpin(f.s, ready), KVP_ERR_STATE); /* no pin held */
    /* FILLING is not pinned nor released */
    assert_int_equal(kvp_store_pin(f.s, filling), KVP_ERR_STATE);
    assert_int_equal(kvp_store_unpin(f.s, filling), KVP_ERR_STATE);
    assert_int_equal(kvp_store_release_quarantined(f.s, filling, true), KVP_ERR_STATE);
    /* QUARANTINED: only release */
    assert_int_equal(kvp_store_commit(f.s, quar), KVP_ERR_STATE);
    assert_int_equal(kvp_store_abandon(f.s, quar), KVP_ERR_STATE);
    assert_int_equal(kvp_store_quarantine(f.s, quar), KVP_ERR_STATE);
    assert_int_equal(kvp_store_pin(f.s, quar), KVP_ERR_STATE);
    kvp_digest_t d = {0, 0};
    assert_int_equal(kvp_store_commit_verify(f.s, quar, &d), KVP_ERR_STATE);
    /* FREE slot: refs to it are stale (never used: gen 0; used: old gen) */
    kvp_slot_info_t info;
    uint32_t free_slot = UINT32_MAX;
    for (uint32_t i = 0; i < 4; i++) {
        assert_int_equal(kvp_store_slot_info(f.s, i, &info), KVP_OK);
        if (info.state == KVP_SLOT_FREE)
            free_slot = i;
    }
    assert_true(free_slot != UINT32_MAX);
    kvp_slot_ref_t fr = {free_slot, 0};
    assert_int_equal(kvp_store_commit(f.s, fr), KVP_ERR_STALE);
    assert_int_equal(kvp_store_abandon(f.s, fr), KVP_ERR_STALE);
    assert_int_equal(kvp_store_pin(f.s, fr), KVP_ERR_STALE);
    assert_int_equal(kvp_store_release_quarantined(f.s, fr, false), KVP_ERR_STALE);
    /* out of range */
    kvp_slot_ref_t bad = {4, 1};
    assert_int_equal(kvp_store_commit(f.s, bad), KVP_ERR_INVALID);
    assert_int_equal(kvp_store_pin(f.s, bad), KVP_ERR_INVALID);
    assert_int_equal(kvp_store_slot_info(f.s, 4, &info), KVP_ERR_INVALID);
    assert_int_equal(kvp_store_commit_verify(f.s, filling, NULL), KVP_ERR_INVALID);
    CHECK_OK(f.s);
    assert_int_equal(kvp_store_abandon(f.s, filling), KVP_OK);
    assert_int_equal(kvp_store_release_quarantined(f.s, quar, false), KVP_OK);
    fix_close(&f);
}

static void test_generations_and_stale_refs(void **state)
{
    fix_t f;
    fix_open(&f, 1, 0);
    kvp_slot_ref_t r1, r2, r3;
    assert_int_equal(kvp_store_reserve(f.s, "k", 1, 0, &r1, NULL), KVP_OK);
    assert_int_equal(kvp_store_abandon(f.s, r1), KVP_OK);
    assert_int_equal(kvp_store_reserve(f.s, "k", 1, 0, &r2, NULL), KVP_OK);
    assert_int_equal(r2.slot, r1.slot);
    assert_true(r2.gen > r1.gen);
    /* the old ref names the same slot, now FILLING again: refused, not acted on */
    assert_false(kvp_store_ref_valid(f.s, r1));
    assert_int_equal(kvp_store_commit(f.s, r1), KVP_ERR_STALE);
    assert_int_equal(kvp_store_abandon(f.s, r1), KVP_ERR_STALE);
    assert_int_equal(kvp_store_quarantine(f.s, r1), KVP_ERR_STALE);
    assert_int_equal(state_of(&f, r2), KVP_SLOT_FILLING);
    assert_int_equal(kvp_store_quarantine(f.s, r2), KVP_OK);
    assert_int_equal(kvp_store_release_quarantined(f.s, r2, false), KVP_OK);
    r3 = put(&f, "z", 0, 3);
    assert_true(r3.gen > r2.gen);
    assert_int_equal(kvp_store_pin(f.s, r2), KVP_ERR_STALE);
    assert_int_equal(kvp_store_unpin(f.s, r2), KVP_ERR_STALE);
    assert_int_equal(kvp_store_release_quarantined(f.s, r2, false), KVP_ERR_STALE);
    assert_true(kvp_store_ref_valid(f.s, r3));
    /* pin/unpin do not change the generation */
    assert_int_equal(kvp_store_pin(f.s, r3), KVP_OK);
    assert_int_equal(kvp_store_unpin(f.s, r3), KVP_OK);
    assert_true(kvp_store_ref_valid(f.s, r3));
    fix_close(&f);
}

static void test_duplicate_reserve(void **state)
{
    fix_t f;
    fix_open(&f, 4, 0);
    kvp_slot_ref_t r, r2 = {99, 99};
    assert_int_equal(kvp_store_reserve(f.s, "dup", 3, 0, &r, NULL), KVP_OK);
    assert_int_equal(kvp_store_reserve(f.s, "dup", 3, 0, &r2, NULL), KVP_ERR_PENDING);
    assert_int_equal(kvp_store_reserve(f.s, "dup", 3, KVP_STORE_RESERVE_REMOTE, &r2, NULL),
                     KVP_ERR_PENDING);
    assert_int_equal(r2.slot, 99); /* untouched */
    assert_int_equal(kvp_store_commit(f.s, r), KVP_OK);
    assert_int_equal(kvp_store_reserve(f.s, "dup", 3, 0, &r2, NULL), KVP_ERR_EXISTS);
    /* a key that is a prefix, or with the same length, is a different key */
    kvp_slot_ref_t r3;
    assert_int_equal(kvp_store_reserve(f.s, "du", 2, 0, &r3, NULL), KVP_OK);
    assert_int_equal(kvp_store_reserve(f.s, "dux", 3, 0, &r3, NULL), KVP_OK);
    kvp_store_stats_t st;
    kvp_store_get_stats(f.s, &st);
    assert_int_equal(st.reserves, 3);
    assert_int_equal(st.slots[KVP_SLOT_FREE], 1);
    CHECK_OK(f.s);
    fix_close(&f);
}

static void test_bad_keys_and_args(void **state)
{
    fix_t f;
    fix_open(&f, 2, 0);
    kvp_slot_ref_t r;
    char big[KVP_KEY_MAX + 1];
    memset(big, 'x', sizeof(big));
    assert_int_equal(kvp_store_reserve(f.s, "k", 0, 0, &r, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_store_reserve(f.s, big, KVP_KEY_MAX + 1, 0, &r, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_store_reserve(f.s, NULL, 1, 0, &r, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_store_reserve(f.s, "k", 1, 0, NULL, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_store_reserve(f.s, "k", 1, 0x80, &r, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_store_reserve(NULL, "k", 1, 0, &r, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_store_lookup(f.s, "k", 0, NULL, NULL, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_store_lookup(f.s, big, KVP_KEY_MAX + 1, NULL, NULL, NULL),
                     KVP_ERR_INVALID);
    assert_int_equal(kvp_store_lookup(f.s, NULL, 3, NULL, NULL, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_store_probe(f.s, NULL, 3, NULL, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_store_evict_one(NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_store_slot_info(f.s, 0, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_store_check(NULL, NULL, 0), KVP_ERR_INVALID);
    /* a 64-byte key is fine, and binary keys with NULs too */
    assert_int_equal(kvp_store_reserve(f.s, big, KVP_KEY_MAX, 0, &r, NULL), KVP_OK);
    assert_int_equal(kvp_store_reserve(f.s, "\0\0", 2, 0, &r, NULL), KVP_OK);
    assert_int_equal(kvp_store_probe(f.s, "\0", 1, NULL, NULL), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_store_probe(f.s, "\0\0", 2, NULL, NULL), KVP_OK);
    kvp_store_destroy(NULL);
    fix_close(&f);
}

/* --------------------------------------------------------- eviction, LRU */

static void test_eviction_spares_pinned_filling_quarantined(void **state)
{
    fix_t f;
    fix_open(&f, 4, 0);
    kvp_slot_ref_t pinned = put(&f, "pinned", 0, 1), filling, quar, e;
    assert_int_equal(get(&f, "pinned", NULL), KVP_OK);
    assert_int_equal(kvp_store_reserve(f.s, "filling", 7, 0, &filling, NULL), KVP_OK);
    assert_int_equal(kvp_store_reserve(f.s, "quar", 4, 0, &quar, NULL), KVP_OK);
    assert_int_equal(kvp_store_quarantine(f.s, quar), KVP_OK);
    kvp_slot_ref_t victim = put(&f, "victim", 0, 2);
    /* full: the only evictable slot is the unpinned READY one */
    assert_int_equal(kvp_store_reserve(f.s, "new", 3, 0, &e, NULL), KVP_OK);
    CHECK_OK(f.s);
    assert_int_equal(e.slot, victim.slot);
    assert_int_equal(kvp_store_probe(f.s, "victim", 6, NULL, NULL), KVP_ERR_NOT_FOUND);
    kvp_slot_ref_t e2;
    assert_int_equal(kvp_store_reserve(f.s, "new2", 4, 0, &e2, NULL), KVP_ERR_NOSPACE);
    assert_int_equal(kvp_store_reserve(f.s, "new2", 4, KVP_STORE_RESERVE_REMOTE, &e2, NULL),
                     KVP_ERR_NOSPACE);
    assert_int_equal(kvp_store_evict_one(f.s), KVP_ERR_NOSPACE);
    assert_int_equal(state_of(&f, pinned), KVP_SLOT_READY);
    assert_int_equal(state_of(&f, filling), KVP_SLOT_FILLING);
    assert_int_equal(state_of(&f, quar), KVP_SLOT_QUARANTINED);
    /* once unpinned it becomes evictable */
    assert_int_equal(kvp_store_unpin(f.s, pinned), KVP_OK);
    assert_int_equal(kvp_store_evict_one(f.s), KVP_OK);
    assert_int_equal(state_of(&f, pinned), KVP_SLOT_FREE);
    kvp_store_stats_t st;
    kvp_store_get_stats(f.s, &st);
    assert_int_equal(st.evictions, 2);
    assert_int_equal(kvp_store_abandon(f.s, filling), KVP_OK);
    assert_int_equal(kvp_store_abandon(f.s, e), KVP_OK);
    assert_int_equal(kvp_store_release_quarantined(f.s, quar, false), KVP_OK);
    fix_close(&f);
}

static void test_lru_order(void **state)
{
    fix_t f;
    fix_open(&f, 3, 0);
    kvp_slot_ref_t a = put(&f, "a", 0, 1), b = put(&f, "b", 0, 2), c = put(&f, "c", 0, 3), r;
    /* touch a: order becomes b, c, a */
    assert_int_equal(get(&f, "a", &r), KVP_OK);
    assert_int_equal(kvp_store_unpin(f.s, r), KVP_OK);
    /* a pin/unpin via ref also counts as use: touch b -> c, a, b */
    assert_int_equal(kvp_store_pin(f.s, b), KVP_OK);
    assert_int_equal(kvp_store_unpin(f.s, b), KVP_OK);
    /* probe does not touch */
    assert_int_equal(kvp_store_probe(f.s, "c", 1, NULL, NULL), KVP_OK);
    kvp_slot_ref_t order[3] = {c, a, b};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(kvp_store_evict_one(f.s), KVP_OK);
        CHECK_OK(f.s);
        assert_int_equal(state_of(&f, order[i]), KVP_SLOT_FREE);
        for (int j = i + 1; j < 3; j++)
            assert_int_equal(state_of(&f, order[j]), KVP_SLOT_READY);
    }
    assert_int_equal(kvp_store_evict_one(f.s), KVP_ERR_NOSPACE);
    fix_close(&f);
}

/* --------------------------------------------------------------- suspects */

/* Make slot of `key`'s reservation suspect: reserve, quarantine, release by cap. */
static kvp_slot_ref_t make_suspect(fix_t *f, const char *key)
{
    kvp_slot_ref_t r;
    assert_int_equal(kvp_store_reserve(f->s, key, strlen(key), 0, &r, NULL), KVP_OK);
    assert_int_equal(kvp_store_quarantine(f->s, r), KVP_OK);
    assert_int_equal(kvp_store_release_quarantined(f->s, r, true), KVP_OK);
    CHECK_OK(f->s);
    return r;
}

static void test_suspect_never_local(void **state)
{
    fix_t f;
    fix_open(&f, 2, 0);
    kvp_slot_ref_t sus = make_suspect(&f, "q"), r, r2;
    kvp_slot_info_t info;
    assert_int_equal(kvp_store_slot_info(f.s, sus.slot, &info), KVP_OK);
    assert_int_equal(info.suspect_until_ns, 1000 + f.cfg.suspect_period_ns);
    kvp_store_stats_t st;
    kvp_store_get_stats(f.s, &st);
    assert_int_equal(st.suspect, 1);
    /* local fills get the clean slot, then nothing */
    assert_int_equal(kvp_store_reserve(f.s, "l1", 2, 0, &r, NULL), KVP_OK);
    assert_int_not_equal(r.slot, sus.slot);
    assert_int_equal(kvp_store_reserve(f.s, "l2", 2, 0, &r2, NULL), KVP_ERR_NOSPACE);
    CHECK_OK(f.s);
    /* a remote load may use it */
    assert_int_equal(kvp_store_reserve(f.s, "r1", 2, KVP_STORE_RESERVE_REMOTE, &r2, NULL), KVP_OK);
    assert_int_equal(r2.slot, sus.slot);
    assert_int_equal(kvp_store_abandon(f.s, r2), KVP_OK);
    CHECK_OK(f.s);
    /* after the suspect period a local fill may use it */
    kvp_manual_clock_advance(&f.clk, f.cfg.suspect_period_ns);
    assert_int_equal(kvp_store_reserve(f.s, "l2", 2, 0, &r2, NULL), KVP_OK);
    assert_int_equal(r2.slot, sus.slot);
    kvp_store_get_stats(f.s, &st);
    assert_int_equal(st.suspect, 0);
    assert_int_equal(kvp_store_abandon(f.s, r), KVP_OK);
    assert_int_equal(kvp_store_abandon(f.s, r2), KVP_OK);
    fix_close(&f);
}

static void test_suspect_remote_prefers_clean(void **state)
{
    fix_t f;
    fix_open(&f, 2, 0);
    kvp_slot_ref_t sus = make_suspect(&f, "q"), r;
    assert_int_equal(kvp_store_reserve(f.s, "r", 1, KVP_STORE_RESERVE_REMOTE, &r, NULL), KVP_OK);
    assert_int_not_equal(r.slot, sus.slot);
    assert_int_equal(kvp_store_abandon(f.s, r), KVP_OK);
    /* a local reserve evicting a suspect READY slot cannot use it: NOSPACE,
     * and the slot lands on the suspect free list */
    kvp_slot_ref_t a = put(&f, "a", 0, 1), b;
    assert_int_equal(kvp_store_reserve(f.s, "b", 1, KVP_STORE_RESERVE_REMOTE, &b, NULL), KVP_OK);
    assert_int_equal(b.slot, sus.slot);
    assert_int_equal(kvp_store_commit(f.s, b), KVP_OK);
    assert_int_equal(kvp_store_pin(f.s, a), KVP_OK);
    assert_int_equal(kvp_store_reserve(f.s, "c", 1, 0, &r, NULL), KVP_ERR_NOSPACE);
    CHECK_OK(f.s);
    assert_int_equal(state_of(&f, b), KVP_SLOT_FREE);
    assert_int_equal(kvp_store_unpin(f.s, a), KVP_OK);
    fix_close(&f);
}

static void test_suspect_reverify_detects_corruption(void **state)
{
    fix_t f;
    fix_open(&f, 1, 0); /* the suspect slot is the only one */
    make_suspect(&f, "q");
    kvp_slot_ref_t r, r2;
    void *p;
    const void *rp;
    /* the remote load fills the suspect slot and commits */
    assert_int_equal(kvp_store_reserve(f.s, "blk", 3, KVP_STORE_RESERVE_REMOTE, &r, &p), KVP_OK);
    memset(p, 0x42, BS);
    assert_int_equal(kvp_store_commit(f.s, r), KVP_OK);
    /* intact: served */
    assert_int_equal(kvp_store_lookup(f.s, "blk", 3, &r2, &rp, NULL), KVP_OK);
    assert_int_equal(kvp_store_unpin(f.s, r2), KVP_OK);
    /* a late WRITE lands: the next acquire sees it, drops the block */
    ((uint8_t *)p)[BS / 2] ^= 0xff;
    uint64_t errors = f.cap.count[KVP_LOG_ERROR];
    assert_int_equal(get(&f, "blk", &r2), KVP_ERR_NOT_FOUND);
    kvp_store_stats_t st;
    kvp_store_get_stats(f.s, &st);
    assert_int_equal(st.checksum_mismatches, 1);
    assert_int_equal(f.cap.count[KVP_LOG_ERROR], errors + 1);
    assert_non_null(strstr(f.cap.last[KVP_LOG_ERROR], "suspect slot"));
    assert_int_equal(state_of(&f, r), KVP_SLOT_FREE);
    assert_int_equal(kvp_store_probe(f.s, "blk", 3, NULL, NULL), KVP_ERR_NOT_FOUND);
    /* still suspect: a local reserve does not get it */
    assert_int_equal(kvp_store_reserve(f.s, "loc", 3, 0, &r2, NULL), KVP_ERR_NOSPACE);
    fix_close(&f);
}

/* Verification off (issue 17): commit takes the source's digest without
 * hashing; a block that landed different from it is still caught where
 * digests are checked (here: the suspect re-verify on acquire). */
static void test_commit_digest(void **state)
{
    fix_t f;
    fix_open(&f, 2, 0);
    kvp_slot_ref_t r, r2;
    void *p;
    const void *rp;
    kvp_digest_t d;
    assert_int_equal(kvp_store_reserve(f.s, "a", 1, KVP_STORE_RESERVE_REMOTE, &r, &p), KVP_OK);
    memset(p, 0x42, BS);
    kvp_digest_t src = kvp_digest(p, BS, f.cfg.hash_seed);
    assert_int_equal(kvp_store_commit_digest(f.s, r, NULL), KVP_ERR_INVALID);
    assert_int_equal(kvp_store_commit_digest(f.s, r, &src), KVP_OK);
    CHECK_OK(f.s);
    assert_int_equal(f.commits, 1);
    assert_int_equal(kvp_store_lookup(f.s, "a", 1, &r2, &rp, &d), KVP_OK);
    assert_true(kvp_digest_eq(&d, &src));
    assert_int_equal(kvp_store_unpin(f.s, r2), KVP_OK);
    assert_int_equal(kvp_store_commit_digest(f.s, r, &src), KVP_ERR_STATE); /* READY already */
    assert_int_equal(kvp_store_evict_one(f.s), KVP_OK);
    assert_int_equal(kvp_store_commit_digest(f.s, r, &src), KVP_ERR_STALE);
    fix_close(&f);

    /* into a suspect slot, content not what the source sent: the stored
     * digest is the source's, so the re-verify on acquire drops it */
    fix_open(&f, 1, 0);
    make_suspect(&f, "q");
    assert_int_equal(kvp_store_reserve(f.s, "blk", 3, KVP_STORE_RESERVE_REMOTE, &r, &p), KVP_OK);
    memset(p, 0x42, BS);
    src = kvp_digest(p, BS, f.cfg.hash_seed);
    ((uint8_t *)p)[7] ^= 0xff; /* a late WRITE before the commit */
    assert_int_equal(kvp_store_commit_digest(f.s, r, &src), KVP_OK);
    assert_int_equal(get(&f, "blk", &r2), KVP_ERR_NOT_FOUND);
    kvp_store_stats_t st;
    kvp_store_get_stats(f.s, &st);
    assert_int_equal(st.checksum_mismatches, 1);
    fix_close(&f);
}

static void test_suspect_reverify_pinned_and_expiry(void **state)
{
    fix_t f;
    fix_open(&f, 1, 0); /* the suspect slot is the only one */
    make_suspect(&f, "q");
    kvp_slot_ref_t r, r2;
    void *p;
    assert_int_equal(kvp_store_reserve(f.s, "blk", 3, KVP_STORE_RESERVE_REMOTE, &r, &p), KVP_OK);
    memset(p, 0x42, BS);
    assert_int_equal(kvp_store_commit(f.s, r), KVP_OK);
    assert_int_equal(get(&f, "blk", &r2), KVP_OK); /* a reader holds a pin */
    ((uint8_t *)p)[0] ^= 1;
    /* a new acquirer is refused; the pinned slot stays until its reader leaves */
    assert_int_equal(get(&f, "blk", NULL), KVP_ERR_NOT_FOUND);
    assert_int_equal(state_of(&f, r), KVP_SLOT_READY);
    assert_int_equal(kvp_store_unpin(f.s, r2), KVP_OK);
    assert_int_equal(get(&f, "blk", NULL), KVP_ERR_NOT_FOUND);
    assert_int_equal(state_of(&f, r), KVP_SLOT_FREE);
    kvp_store_stats_t st;
    kvp_store_get_stats(f.s, &st);
    assert_int_equal(st.checksum_mismatches, 2);
    /* after the period, the slot is no longer re-verified */
    assert_int_equal(kvp_store_reserve(f.s, "b2", 2, KVP_STORE_RESERVE_REMOTE, &r, &p), KVP_OK);
    assert_int_equal(kvp_store_commit(f.s, r), KVP_OK);
    kvp_manual_clock_advance(&f.clk, f.cfg.suspect_period_ns);
    ((uint8_t *)p)[0] ^= 1;
    assert_int_equal(get(&f, "b2", &r2), KVP_OK);
    assert_int_equal(kvp_store_unpin(f.s, r2), KVP_OK);
    kvp_store_get_stats(f.s, &st);
    assert_int_equal(st.suspect, 0);
    assert_int_equal(st.checksum_mismatches, 2);
    fix_close(&f);
}

static void test_suspect_requarantined_stays_suspect(void **state)
{
    fix_t f;
    fix_open(&f, 1, 0);
    kvp_slot_ref_t r;
    make_suspect(&f, "q");
    assert_int_equal(kvp_store_reserve(f.s, "x", 1, KVP_STORE_RESERVE_REMOTE, &r, NULL), KVP_OK);
    assert_int_equal(kvp_store_quarantine(f.s, r), KVP_OK);
    /* released by proof, but it was suspect: stays suspect for a full period */
    kvp_manual_clock_advance(&f.clk, 10);
    assert_int_equal(kvp_store_release_quarantined(f.s, r, false), KVP_OK);
    kvp_slot_info_t info;
    assert_int_equal(kvp_store_slot_info(f.s, r.slot, &info), KVP_OK);
    assert_int_equal(info.suspect_until_ns, 1010 + f.cfg.suspect_period_ns);
    assert_int_equal(kvp_store_reserve(f.s, "y", 1, 0, &r, NULL), KVP_ERR_NOSPACE);
    fix_close(&f);
}

/* ------------------------------------------------------- pins, checksums */

static void test_pin_limit(void **state)
{
    fix_t f;
    fix_open(&f, 4, 2);
    kvp_slot_ref_t a = put(&f, "a", 0, 1), r1, r2;
    put(&f, "b", 0, 2);
    assert_int_equal(get(&f, "a", &r1), KVP_OK);
    assert_int_equal(get(&f, "b", &r2), KVP_OK);
    assert_int_equal(get(&f, "a", NULL), KVP_ERR_LIMIT);
    assert_int_equal(kvp_store_pin(f.s, a), KVP_ERR_LIMIT);
    kvp_store_stats_t st;
    kvp_store_get_stats(f.s, &st);
    assert_int_equal(st.pin_limit_refusals, 2);
    assert_int_equal(st.pins, 2);
    assert_int_equal(st.lookups_hit, 2);
    assert_int_equal(kvp_store_unpin(f.s, r1), KVP_OK);
    assert_int_equal(kvp_store_pin(f.s, a), KVP_OK); /* room again */
    assert_int_equal(kvp_store_unpin(f.s, a), KVP_OK);
    assert_int_equal(kvp_store_unpin(f.s, r2), KVP_OK);
    fix_close(&f);
}

static void test_commit_verify(void **state)
{
    fix_t f;
    fix_open(&f, 2, 0);
    kvp_slot_ref_t r;
    void *p;
    assert_int_equal(kvp_store_reserve(f.s, "v", 1, KVP_STORE_RESERVE_REMOTE, &r, &p), KVP_OK);
    memset(p, 9, BS);
    kvp_digest_t good = kvp_digest(p, BS, f.cfg.hash_seed), bad = good;
    bad.lo ^= 1;
    assert_int_equal(kvp_store_commit_verify(f.s, r, &bad), KVP_ERR_CHECKSUM);
    CHECK_OK(f.s);
    assert_int_equal(state_of(&f, r), KVP_SLOT_FILLING);
    assert_int_equal(f.commits, 0);
    kvp_store_stats_t st;
    kvp_store_get_stats(f.s, &st);
    assert_int_equal(st.checksum_mismatches, 1);
    /* a digest with another seed is a mismatch too */
    kvp_digest_t other = kvp_digest(p, BS, f.cfg.hash_seed + 1);
    assert_int_equal(kvp_store_commit_verify(f.s, r, &other), KVP_ERR_CHECKSUM);
    assert_int_equal(kvp_store_commit_verify(f.s, r, &good), KVP_OK);
    assert_int_equal(f.commits, 1);
    kvp_digest_t d;
    assert_int_equal(kvp_store_lookup(f.s, "v", 1, &r, NULL, &d), KVP_OK);
    assert_true(kvp_digest_eq(&d, &good));
    assert_int_equal(kvp_store_unpin(f.s, r), KVP_OK);
    fix_close(&f);
}

static void test_lookup_many(void **state)
{
    fix_t f;
    fix_open(&f, 40, 30);
    char names[40][8];
    const void *keys[40];
    size_t lens[40];
    kvp_slot_ref_t refs[40], r;
    kvp_status_t res[40];
    for (int i = 0; i < 40; i++) {
        snprintf(names[i], sizeof(names[i]), "k%02d", i);
        keys[i] = names[i];
        lens[i] = 3;
        if (i % 4 == 0)
            put(&f, names[i], 0, (uint8_t)i); /* READY */
        else if (i % 4 == 1)
            assert_int_equal(kvp_store_reserve(f.s, names[i], 3, 0, &r, NULL), KVP_OK);
    }
    keys[39] = NULL; /* a bad key among good ones */
    lens[38] = 0;
    /* 10 READY keys, pin bound 30: all hit; across 2 batches of 16 and one of 8 */
    assert_int_equal(kvp_store_lookup_many(f.s, 40, keys, lens, refs, res), 10);
    CHECK_OK(f.s);
    for (int i = 0; i < 38; i++) {
        kvp_status_t want = i % 4 == 0 ? KVP_OK : i % 4 == 1 ? KVP_ERR_PENDING : KVP_ERR_NOT_FOUND;
        assert_int_equal(res[i], want);
        if (want == KVP_OK) {
            kvp_slot_info_t info;
            assert_int_equal(kvp_store_slot_info(f.s, refs[i].slot, &info), KVP_OK);
            assert_memory_equal(info.key, names[i], 3);
            assert_int_equal(info.pins, 1);
        }
    }
    assert_int_equal(res[38], KVP_ERR_INVALID);
    assert_int_equal(res[39], KVP_ERR_INVALID);
    /* twice more: the pin bound (30) stops the last 10, counted */
    assert_int_equal(kvp_store_lookup_many(f.s, 40, keys, lens, NULL, res), 10);
    assert_int_equal(kvp_store_lookup_many(f.s, 40, keys, lens, NULL, res), 10);
    assert_int_equal(kvp_store_lookup_many(f.s, 40, keys, lens, NULL, res), 0);
    assert_int_equal(res[0], KVP_ERR_LIMIT);
    kvp_store_stats_t st;
    kvp_store_get_stats(f.s, &st);
    assert_int_equal(st.pin_limit_refusals, 10);
    assert_int_equal(kvp_store_lookup_many(NULL, 40, keys, lens, NULL, res), 0);
    CHECK_OK(f.s);
    /* release everything: 3 pins on each READY key */
    for (int i = 0; i < 40; i += 4)
        for (int j = 0; j < 3; j++)
            assert_int_equal(kvp_store_unpin(f.s, refs[i]), KVP_OK);
    for (int i = 1; i < 40; i += 4) {
        assert_int_equal(kvp_store_probe(f.s, names[i], 3, &r, NULL), KVP_OK);
        assert_int_equal(kvp_store_abandon(f.s, r), KVP_OK);
    }
    fix_close(&f);
}

/* ------------------------------------------------------------ inspection */

static bool count_cb(void *arg, uint32_t slot, const kvp_slot_info_t *info)
{
    int *n = arg;
    assert_int_not_equal(info->state, KVP_SLOT_FREE);
    (*n)++;
    return true;
}

static void test_iterate_and_meta_size(void **state)
{
    fix_t f;
    fix_open(&f, 8, 0);
    put(&f, "a", 0, 1);
    kvp_slot_ref_t r;
    assert_int_equal(kvp_store_reserve(f.s, "b", 1, 0, &r, NULL), KVP_OK);
    int n = 0;
    kvp_store_iterate(f.s, count_cb, &n);
    assert_int_equal(n, 2);
    kvp_slot_info_t info;
    assert_int_equal(kvp_store_slot_info(f.s, r.slot, &info), KVP_OK);
    assert_int_equal(info.key_len, 1);
    assert_memory_equal(info.key, "b", 1);
    assert_true(kvp_store_meta_bytes_per_slot(f.s) <= 64);
    assert_int_equal(kvp_store_key_bytes_per_slot(f.s), KVP_KEY_MAX);
    assert_int_equal(kvp_store_abandon(f.s, r), KVP_OK);
    fix_close(&f);
}

static void test_check_detects_broken_lru(void **state)
{
    fix_t f;
    fix_open(&f, 4, 0);
    kvp_slot_ref_t a = put(&f, "a", 0, 1), r;
    char why[256] = "";
    kvp__store_test_break_lru(f.s, a.slot); /* READY unpinned, off the LRU */
    assert_int_equal(kvp_store_check(f.s, why, sizeof(why)), KVP_ERR_STATE);
    assert_non_null(strstr(why, "LRU"));
    kvp__store_test_break_lru(f.s, a.slot); /* back on: valid again */
    CHECK_OK(f.s);
    assert_int_equal(get(&f, "a", &r), KVP_OK);
    kvp__store_test_break_lru(f.s, a.slot); /* pinned, yet on the LRU */
    assert_int_equal(kvp_store_check(f.s, why, sizeof(why)), KVP_ERR_STATE);
    kvp__store_test_break_lru(f.s, a.slot);
    assert_int_equal(kvp_store_unpin(f.s, r), KVP_OK);
    fix_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_bad_input),
        cmocka_unit_test(test_create_regions),
        cmocka_unit_test(test_create_alloc_failures),
        cmocka_unit_test(test_legal_transitions),
        cmocka_unit_test(test_commit_digest),
        cmocka_unit_test(test_illegal_transitions),
        cmocka_unit_test(test_generations_and_stale_refs),
        cmocka_unit_test(test_duplicate_reserve),
        cmocka_unit_test(test_bad_keys_and_args),
        cmocka_unit_test(test_eviction_spares_pinned_filling_quarantined),
        cmocka_unit_test(test_lru_order),
        cmocka_unit_test(test_suspect_never_local),
        cmocka_unit_test(test_suspect_remote_prefers_clean),
        cmocka_unit_test(test_suspect_reverify_detects_corruption),
        cmocka_unit_test(test_suspect_reverify_pinned_and_expiry),
        cmocka_unit_test(test_suspect_requarantined_stays_suspect),
        cmocka_unit_test(test_pin_limit),
        cmocka_unit_test(test_commit_verify),
        cmocka_unit_test(test_lookup_many),
        cmocka_unit_test(test_iterate_and_meta_size),
        cmocka_unit_test(test_check_detects_broken_lru),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
