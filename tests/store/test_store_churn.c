/* test_store_churn.c -- randomized churn of the block store against a simple
 * reference model (arrays and linear scans), fixed seeds. After every step:
 * kvp_store_check(), every slot's state/generation/pins and the counters
 * are compared with the model. The model predicts exactly which slot a
 * reserve gets (clean free FIFO, suspect free FIFO, LRU), so eviction order,
 * suspect hand-out and re-verify drops are checked, not just tolerated. */
#include "testutil.h"

#include "store/store.h"

#define BS 4096u
#define PERIOD 1000u
#define MAXN 32
#define NKEYS (3 * MAXN)

typedef struct mslot {
    int state;
    uint32_t gen, pins;
    int key; /* -1 if none */
    bool suspect, corrupted;
    uint64_t until;
} mslot_t;

typedef struct model {
    uint32_t n, max_pins;
    mslot_t s[MAXN];
    /* lists as arrays in order (head first) */
    uint32_t freeq[MAXN], nfree, susq[MAXN], nsus, lru[MAXN], nlru;
    uint64_t now, pins, mismatches, evictions, refusals, commits_cb;
    uint32_t held[8 * MAXN]; /* slots we hold a pin on */
    uint32_t nheld;
} model_t;

static kvp_manual_clock_t g_clk;
static model_t g_m;
static kvp_store_t *g_s;
static uint64_t g_cb;

static void q_push(uint32_t *q, uint32_t *n, uint32_t v)
{
    q[(*n)++] = v;
}

static void q_del(uint32_t *q, uint32_t *n, uint32_t v)
{
    for (uint32_t i = 0; i < *n; i++) {
        if (q[i] == v) {
            memmove(&q[i], &q[i + 1], (*n - i - 1) * sizeof(*q));
            (*n)--;
            return;
        }
    }
    fail_msg("model: %u not on list", v);
}

static void key_of(int k, char *buf, size_t *len)
{
    /* lengths 1..64 across the key space */
    int l = snprintf(buf, 72, "%d:", k);
    int want = 1 + (k * 7) % KVP_KEY_MAX;
    for (; l < want; l++)
        buf[l] = (char)('a' + (k + l) % 26);
    *len = (size_t)(want < l ? l : want);
    if (*len > KVP_KEY_MAX)
        *len = KVP_KEY_MAX;
}

static int m_find_key(int k)
{
    for (uint32_t i = 0; i < g_m.n; i++)
        if ((g_m.s[i].state == KVP_SLOT_FILLING || g_m.s[i].state == KVP_SLOT_READY) &&
            g_m.s[i].key == k)
            return (int)i;
    return -1;
}

static bool m_suspect_active(uint32_t i)
{
    mslot_t *ms = &g_m.s[i];
    if (!ms->suspect)
        return false;
    if (g_m.now < ms->until)
        return true;
    ms->suspect = false;
    return false;
}

static void m_free_push(uint32_t i)
{
    g_m.s[i].state = KVP_SLOT_FREE;
    g_m.s[i].key = -1;
    if (m_suspect_active(i))
        q_push(g_m.susq, &g_m.nsus, i);
    else
        q_push(g_m.freeq, &g_m.nfree, i);
}

static int m_free_take(bool remote)
{
    if (g_m.nfree) {
        uint32_t i = g_m.freeq[0];
        q_del(g_m.freeq, &g_m.nfree, i);
        return (int)i;
    }
    if (!g_m.nsus)
        return -1;
    uint32_t i = g_m.susq[0];
    if (!remote && g_m.now < g_m.s[i].until)
        return -1;
    q_del(g_m.susq, &g_m.nsus, i);
    if (remote)
        (void)m_suspect_active(i);
    else
        g_m.s[i].suspect = false;
    return (int)i;
}

static void m_ready_to_free(uint32_t i)
{
    q_del(g_m.lru, &g_m.nlru, i);
    m_free_push(i);
}

static bool m_evict(void)
{
    if (!g_m.nlru)
        return false;
    m_ready_to_free(g_m.lru[0]);
    g_m.evictions++;
    return true;
}

/* ------------------------------------------------------------------ ops */

static void op_reserve(kvp_rng_t *r)
{
    int k = (int)kvp_rng_below(r, NKEYS);
    bool remote = kvp_rng_below(r, 3) == 0;
    char key[72];
    size_t len;
    key_of(k, key, &len);
    kvp_slot_ref_t ref;
    void *p;
    kvp_status_t rc =
        kvp_store_reserve(g_s, key, len, remote ? KVP_STORE_RESERVE_REMOTE : 0, &ref, &p);
    int have = m_find_key(k);
    if (have >= 0) {
        assert_int_equal(rc,
                         g_m.s[have].state == KVP_SLOT_READY ? KVP_ERR_EXISTS : KVP_ERR_PENDING);
        return;
    }
    int slot;
    while ((slot = m_free_take(remote)) < 0) {
        if (!m_evict()) {
            assert_int_equal(rc, KVP_ERR_NOSPACE);
            return;
        }
    }
    assert_int_equal(rc, KVP_OK);
    assert_int_equal(ref.slot, (uint32_t)slot);
    mslot_t *ms = &g_m.s[slot];
    assert_true(remote || !ms->suspect);
    if (++ms->gen == 0)
        ms->gen = 1;
    assert_int_equal(ref.gen, ms->gen);
    ms->state = KVP_SLOT_FILLING;
    ms->key = k;
    ms->corrupted = false;
    memset(p, (int)(k * 31 + ms->gen), BS);
}

/* A random slot in `state`, or -1. */
static int m_pick(kvp_rng_t *r, int state)
{
    uint32_t start = (uint32_t)kvp_rng_below(r, g_m.n);
    for (uint32_t j = 0; j < g_m.n; j++) {
        uint32_t i = (start + j) % g_m.n;
        if (g_m.s[i].state == state)
            return (int)i;
    }
    return -1;
}

static kvp_slot_ref_t mref(int i)
{
    kvp_slot_ref_t ref = {(uint32_t)i, g_m.s[i].gen};
    return ref;
}

static void op_finish_fill(kvp_rng_t *r)
{
    int i = m_pick(r, KVP_SLOT_FILLING);
    if (i < 0)
        return;
    mslot_t *ms = &g_m.s[i];
    switch (kvp_rng_below(r, 5)) {
    case 0:
    case 1:
        assert_int_equal(kvp_store_commit(g_s, mref(i)), KVP_OK);
        break;
    case 2: {
        kvp_digest_t d = kvp_digest(kvp_store_slot_ptr(g_s, (uint32_t)i), BS, 77);
        bool bad = kvp_rng_below(r, 2);
        d.hi ^= bad;
        assert_int_equal(kvp_store_commit_verify(g_s, mref(i), &d),
                         bad ? KVP_ERR_CHECKSUM : KVP_OK);
        if (bad) {
            g_m.mismatches++;
            return;
        }
        break;
    }
    case 3:
        assert_int_equal(kvp_store_abandon(g_s, mref(i)), KVP_OK);
        m_free_push((uint32_t)i);
        return;
    default:
        assert_int_equal(kvp_store_quarantine(g_s, mref(i)), KVP_OK);
        ms->state = KVP_SLOT_QUARANTINED;
        ms->key = -1;
        return;
    }
    ms->state = KVP_SLOT_READY;
    q_push(g_m.lru, &g_m.nlru, (uint32_t)i);
    g_m.commits_cb++;
}

static void op_release(kvp_rng_t *r)
{
    int i = m_pick(r, KVP_SLOT_QUARANTINED);
    if (i < 0)
        return;
    bool suspect = kvp_rng_below(r, 2);
    assert_int_equal(kvp_store_release_quarantined(g_s, mref(i), suspect), KVP_OK);
    mslot_t *ms = &g_m.s[i];
    if (suspect || ms->suspect) {
        ms->suspect = true;
        ms->until = g_m.now + PERIOD;
    }
    m_free_push((uint32_t)i);
}

static void m_pin(uint32_t i, kvp_status_t rc)
{
    if (g_m.pins >= g_m.max_pins) {
        assert_int_equal(rc, KVP_ERR_LIMIT);
        g_m.refusals++;
        return;
    }
    assert_int_equal(rc, KVP_OK);
    if (g_m.s[i].pins++ == 0)
        q_del(g_m.lru, &g_m.nlru, i);
    g_m.pins++;
    g_m.held[g_m.nheld++] = i;
}

static int m_pick(kvp_rng_t *r, int state);

static void op_lookup(kvp_rng_t *r)
{
    /* half the time a key that is READY, so hits and re-verifies happen */
    int k = (int)kvp_rng_below(r, NKEYS), ready = m_pick(r, KVP_SLOT_READY);
    if (ready >= 0 && kvp_rng_below(r, 2))
        k = g_m.s[ready].key;
    char key[72];
    size_t len;
    key_of(k, key, &len);
    kvp_slot_ref_t ref;
    kvp_status_t rc;
    if (kvp_rng_below(r, 3) == 0) { /* the batched path answers the same */
        const void *kp = key;
        uint32_t hits = kvp_store_lookup_many(g_s, 1, &kp, &len, &ref, &rc);
        assert_int_equal(hits, rc == KVP_OK);
    } else {
        rc = kvp_store_lookup(g_s, key, len, &ref, NULL, NULL);
    }
    int i = m_find_key(k);
    if (i < 0) {
        assert_int_equal(rc, KVP_ERR_NOT_FOUND);
        return;
    }
    mslot_t *ms = &g_m.s[i];
    if (ms->state == KVP_SLOT_FILLING) {
        assert_int_equal(rc, KVP_ERR_PENDING);
        return;
    }
    if (m_suspect_active((uint32_t)i) && ms->corrupted) {
        assert_int_equal(rc, KVP_ERR_NOT_FOUND);
        g_m.mismatches++;
        if (ms->pins == 0)
            m_ready_to_free((uint32_t)i);
        return;
    }
    if (rc == KVP_OK)
        assert_int_equal(ref.slot, (uint32_t)i);
    m_pin((uint32_t)i, rc);
}

static void op_pin_unpin(kvp_rng_t *r)
{
    if (g_m.nheld && kvp_rng_below(r, 3)) {
        uint32_t h = (uint32_t)kvp_rng_below(r, g_m.nheld);
        uint32_t i = g_m.held[h];
        g_m.held[h] = g_m.held[--g_m.nheld];
        assert_int_equal(kvp_store_unpin(g_s, mref((int)i)), KVP_OK);
        g_m.pins--;
        if (--g_m.s[i].pins == 0)
            q_push(g_m.lru, &g_m.nlru, i);
        return;
    }
    int i = m_pick(r, KVP_SLOT_READY);
    if (i >= 0 && g_m.nheld < KVP_ARRAY_SIZE(g_m.held))
        m_pin((uint32_t)i, kvp_store_pin(g_s, mref(i)));
}

static void op_misc(kvp_rng_t *r)
{
    switch (kvp_rng_below(r, 4)) {
    case 0: { /* corrupt a suspect READY block, as a late WRITE would */
        int i = m_pick(r, KVP_SLOT_READY);
        if (i >= 0 && g_m.s[i].suspect) {
            ((uint8_t *)kvp_store_slot_ptr(g_s, (uint32_t)i))[kvp_rng_below(r, BS)] ^= 0x10;
            g_m.s[i].corrupted = true;
        }
        break;
    }
    case 1: { /* a stale ref: an older generation of a slot */
        uint32_t i = (uint32_t)kvp_rng_below(r, g_m.n);
        kvp_slot_ref_t old = {i, g_m.s[i].gen - 1};
        if (old.gen != 0) {
            assert_int_equal(kvp_store_pin(g_s, old), KVP_ERR_STALE);
            assert_int_equal(kvp_store_commit(g_s, old), KVP_ERR_STALE);
            assert_int_equal(kvp_store_abandon(g_s, old), KVP_ERR_STALE);
        }
        break;
    }
    case 2:
        assert_int_equal(kvp_store_evict_one(g_s), m_evict() ? KVP_OK : KVP_ERR_NOSPACE);
        break;
    default:
        g_m.now += kvp_rng_below(r, PERIOD / 4);
        kvp_manual_clock_set(&g_clk, g_m.now);
        break;
    }
}

/* -------------------------------------------------------------- compare */

static void compare(void)
{
    char why[256];
    kvp_status_t rc = kvp_store_check(g_s, why, sizeof(why));
    if (rc != KVP_OK)
        fail_msg("kvp_store_check: %s", why);
    kvp_store_stats_t st;
    kvp_store_get_stats(g_s, &st);
    uint64_t count[4] = {0}, suspect = 0;
    for (uint32_t i = 0; i < g_m.n; i++) {
        kvp_slot_info_t info;
        assert_int_equal(kvp_store_slot_info(g_s, i, &info), KVP_OK);
        assert_int_equal(info.state, g_m.s[i].state);
        assert_int_equal(info.gen, g_m.s[i].gen);
        assert_int_equal(info.pins, g_m.s[i].pins);
        count[g_m.s[i].state]++;
        suspect += g_m.s[i].suspect;
    }
    for (int i = 0; i < 4; i++)
        assert_int_equal(st.slots[i], count[i]);
    assert_int_equal(st.pins, g_m.pins);
    assert_int_equal(st.suspect, suspect);
    assert_int_equal(st.evictions, g_m.evictions);
    assert_int_equal(st.checksum_mismatches, g_m.mismatches);
    assert_int_equal(st.pin_limit_refusals, g_m.refusals);
    assert_int_equal(g_cb, g_m.commits_cb);
}

static void on_commit(void *arg, const void *key, uint32_t key_len, kvp_slot_ref_t ref)
{
    g_cb++;
}

static void churn(uint64_t seed, uint32_t n, uint32_t max_pins, unsigned ops)
{
    memset(&g_m, 0, sizeof(g_m));
    g_cb = 0;
    g_m.n = n;
    g_m.max_pins = max_pins;
    g_m.now = 1;
    kvp_manual_clock_init(&g_clk, 1);
    for (uint32_t i = 0; i < n; i++) {
        g_m.s[i].key = -1;
        q_push(g_m.freeq, &g_m.nfree, i);
    }
    kvp_store_config_t cfg = {.num_blocks = n,
                              .block_size = BS,
                              .max_pins = max_pins,
                              .suspect_period_ns = PERIOD,
                              .hash_seed = 77,
                              .clock = &g_clk.clock,
                              .commit_cb = on_commit};
    assert_int_equal(kvp_store_create(&cfg, &g_s), KVP_OK);
    kvp_test_logcap_t cap; /* mismatch lines are expected: keep them quiet */
    kvp_test_logcap_start(&cap);
    kvp_rng_t r;
    kvp_rng_seed(&r, seed);
    for (unsigned step = 0; step < ops; step++) {
        switch (kvp_rng_below(&r, 7)) {
        case 0:
        case 1:
            op_reserve(&r);
            break;
        case 2:
            op_finish_fill(&r);
            break;
        case 3:
            op_release(&r);
            break;
        case 4:
            op_lookup(&r);
            break;
        case 5:
            op_pin_unpin(&r);
            break;
        default:
            op_misc(&r);
            break;
        }
        compare();
    }
    while (g_m.nheld)
        assert_int_equal(kvp_store_unpin(g_s, mref((int)g_m.held[--g_m.nheld])), KVP_OK);
    kvp_store_stats_t st;
    kvp_store_get_stats(g_s, &st);
    print_message("  n=%u: %llu reserves %llu commits %llu evictions %llu hits %llu pending %llu "
                  "quarantines %llu mismatches %llu pin refusals\n",
                  n, (unsigned long long)st.reserves, (unsigned long long)st.commits,
                  (unsigned long long)st.evictions, (unsigned long long)st.lookups_hit,
                  (unsigned long long)st.lookups_pending, (unsigned long long)st.quarantines,
                  (unsigned long long)st.checksum_mismatches,
                  (unsigned long long)st.pin_limit_refusals);
    /* the churn must reach the interesting paths, or it proves little */
    assert_true(st.evictions > 0 && st.quarantine_releases > 0 && st.lookups_hit > 0);
    assert_true(n < 4 || st.checksum_mismatches > 0);
    assert_int_equal(cap.count[KVP_LOG_ERROR], st.checksum_mismatches - cap.count[KVP_LOG_WARN]);
    kvp_test_logcap_stop();
    kvp_store_destroy(g_s);
    KVP_TEST_ASSERT_NO_LEAKS();
}

static unsigned ops_budget(void)
{
    /* ~20k ops in all under valgrind (scale 20), ~60k otherwise */
    return kvp_test_time_scale() >= 10 ? 5000 : 15000;
}

static void test_churn_tiny(void **state)
{
    churn(1, 1, 2, ops_budget());
}

static void test_churn_small(void **state)
{
    churn(2, 7, 5, ops_budget());
}

static void test_churn_medium(void **state)
{
    churn(3, 32, 64, ops_budget());
}

static void test_churn_pin_starved(void **state)
{
    churn(4, 16, 3, ops_budget());
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_churn_tiny),
        cmocka_unit_test(test_churn_small),
        cmocka_unit_test(test_churn_medium),
        cmocka_unit_test(test_churn_pin_starved),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
