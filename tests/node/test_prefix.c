/*
 * test_prefix.c -- issue 19 on the fake world (manual clock): LOOKUP in
 * prefix mode against a model on random workloads, pin leases (expiry,
 * renewal by heartbeat and by fetch, counted), and the router's hinted
 * fetch (a stale hint answers miss at once). Each safety test names the
 * mutation tried against it.
 */
#include "world.h"

#define MS KVP_NSEC_PER_MSEC

static void lease_tweak(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    (void)s;
    (void)i;
    c->pin_lease_ms = 100; /* below supply_pin_ms (300): the lease decides */
}

/* Keys of `ids` (any ids) as a concatenated buffer + lengths. */
static void wkeys_ids(wkeys_t *ks, const uint32_t *ids, uint32_t n)
{
    size_t off = 0;
    ks->n = n;
    for (uint32_t i = 0; i < n; i++) {
        ks->len[i] = world_key(ids[i], ks->buf + off);
        off += ks->len[i];
    }
}

static const kvp_event_t *lookup_wait(world_t *w, int i, uint64_t op)
{
    const kvp_event_t *e = world_wait(w, i, KVP_EV_LOOKUP, op, 100 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    return e;
}

static uint64_t prefix_lookup(world_t *w, int i, int j, uint64_t req, const wkeys_t *ks,
                              uint8_t *res)
{
    uint64_t op = 0;
    assert_int_equal(
        kvp_lookup_prefix(w->node[i], w->addr[j], req, ks->buf, ks->len, ks->n, res, &op),
        KVP_OK);
    return op;
}

/* Run until node i's source pins equal want (at most max_ns). */
static uint64_t pins_after(world_t *w, int i, uint64_t want, uint64_t max_ns)
{
    uint64_t end = kvp_clock_now(&w->mc.clock) + max_ns;
    while (world_stats(w, i).pins != want && kvp_clock_now(&w->mc.clock) < end)
        world_step(w);
    return world_stats(w, i).pins;
}

/* Random workloads against a model: node 0 holds a random subset of a fresh
 * key range (a held prefix of random length, then random holes and hits);
 * node 1 asks in prefix mode and in the general mode. Prefix mode must answer
 * exactly the model's prefix, pin exactly that many blocks, and HIT exactly
 * those keys; the general mode the model's per-key set. Some rounds fetch the
 * prefix and check the bytes. Mutation tried: the source neither stops at
 * the first miss nor trims after it (answers and pins later hits too) ->
 * n_ok, results and pins differ from the model. */
static void test_prefix_matches_model_random(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    kvp_rng_t rng;
    kvp_rng_seed(&rng, 0x19191919u);
    uint32_t base = 1000, checked_prefix = 0, nonzero = 0, holes_after = 0;
    for (uint32_t it = 0; it < 120; it++) {
        uint32_t n = 1 + (uint32_t)(kvp_rng_next(&rng) % 24);
        uint32_t pre = (uint32_t)(kvp_rng_next(&rng) % (n + 1));
        bool held[24] = {false};
        uint32_t ids[24];
        for (uint32_t i = 0; i < n; i++) {
            ids[i] = base + i;
            held[i] = i < pre || (i > pre && kvp_rng_next(&rng) % 2 == 0);
            if (held[i])
                world_put(w, 0, ids[i], 0);
        }
        base += 24; /* a fresh range: older keys are evicted (LRU), never asked again */
        uint32_t model_prefix = 0, model_hits = 0;
        while (model_prefix < n && held[model_prefix])
            model_prefix++;
        for (uint32_t i = 0; i < n; i++)
            model_hits += held[i];
        holes_after += model_hits > model_prefix;
        nonzero += model_prefix > 0;

        wkeys_t ks;
        wkeys_ids(&ks, ids, n);
        uint8_t res[24], gres[24];
        uint64_t req = 500 + it;
        uint64_t op = prefix_lookup(w, 1, 0, req, &ks, res);
        const kvp_event_t *e = lookup_wait(w, 1, op);
        assert_int_equal(e->n_ok, model_prefix);
        assert_int_equal(e->n_keys, n);
        for (uint32_t i = 0; i < n; i++)
            assert_int_equal(res[i], i < model_prefix ? KVP_LOOKUP_HIT : KVP_LOOKUP_MISS);
        assert_int_equal(world_stats(w, 0).pins, model_prefix); /* only the prefix pinned */
        checked_prefix++;

        if (it % 4 == 0 && model_prefix > 0) { /* fetch the prefix, byte-exact */
            wkeys_t pk;
            wkeys_ids(&pk, ids, model_prefix);
            uint64_t fop = 0;
            assert_int_equal(kvp_fetch(w->node[1], w->addr[0], req, pk.buf, pk.len, pk.n, 0,
                                       NULL, &fop),
                             KVP_OK);
            const kvp_event_t *le = world_wait(w, 1, KVP_EV_LOAD, fop, 200 * MS);
            assert_non_null(le);
            assert_int_equal(le->status, KVP_OK);
            assert_int_equal(le->n_ok, model_prefix);
            for (uint32_t i = 0; i < model_prefix; i++)
                assert_true(world_verify(w, 1, ids[i]));
        }
        assert_int_equal(kvp_finish_request(w->node[1], req), KVP_OK);
        assert_int_equal(pins_after(w, 0, 0, 50 * MS), 0);

        /* The general mode on the same keys: every held key. */
        uint64_t gop = 0;
        assert_int_equal(kvp_lookup(w->node[1], w->addr[0], req + 100000, ks.buf, ks.len, ks.n,
                                    gres, &gop),
                         KVP_OK);
        e = lookup_wait(w, 1, gop);
        assert_int_equal(e->n_ok, model_hits);
        for (uint32_t i = 0; i < n; i++)
            assert_int_equal(gres[i], held[i] ? KVP_LOOKUP_HIT : KVP_LOOKUP_MISS);
        assert_int_equal(kvp_finish_request(w->node[1], req + 100000), KVP_OK);
        assert_int_equal(pins_after(w, 0, 0, 50 * MS), 0);
    }
    /* The workload exercised what it claims to. */
    assert_int_equal(checked_prefix, 120);
    assert_true(nonzero > 30);
    assert_true(holes_after > 30);
    world_fini(w, false);
    free(w);
}

/* A prefix lookup and a general lookup of the same request in the same poll
 * round are two LOOKUPs (never merged: the prefix's order is the request's),
 * results may be NULL, and bad arguments are refused cleanly. */
static void test_prefix_not_merged_and_args(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    uint32_t ids[4] = {1, 2, 3, 4};
    world_put(w, 0, 1, 0);
    world_put(w, 0, 3, 0); /* 1 held, 2 missing, 3 held */
    wkeys_t ks;
    wkeys_ids(&ks, ids, 4);
    uint8_t gres[4];
    uint64_t gop = 0, pop = prefix_lookup(w, 1, 0, 7, &ks, NULL);
    assert_int_equal(kvp_lookup(w->node[1], w->addr[0], 7, ks.buf, ks.len, ks.n, gres, &gop),
                     KVP_OK);
    const kvp_event_t *pe = lookup_wait(w, 1, pop);
    assert_int_equal(pe->n_ok, 1);
    const kvp_event_t *ge = lookup_wait(w, 1, gop);
    assert_int_equal(ge->n_ok, 2);
    assert_int_equal(world_stats(w, 0).pins, 3); /* prefix 1 + general 2 */
    uint64_t op;
    assert_int_equal(kvp_lookup_prefix(w->node[1], w->addr[0], 7, ks.buf, ks.len, 0, NULL, &op),
                     KVP_ERR_INVALID);
    assert_int_equal(kvp_lookup_prefix(w->node[1], NULL, 7, ks.buf, ks.len, 4, NULL, &op),
                     KVP_ERR_INVALID);
    assert_int_equal(kvp_lookup_prefix(w->node[1], "nosuch:1", 7, ks.buf, ks.len, 4, NULL, &op),
                     KVP_ERR_UNREACHABLE);
    assert_int_equal(kvp_lease_renew(w->node[1], "nosuch:1", 7), KVP_ERR_UNREACHABLE);
    assert_int_equal(kvp_lease_renew(w->node[1], NULL, 7), KVP_ERR_INVALID);
    assert_int_equal(kvp_finish_request(w->node[1], 7), KVP_OK);
    assert_int_equal(pins_after(w, 0, 0, 50 * MS), 0);
    world_fini(w, false);
    free(w);
}

/* Lease expiry frees pins and is counted; a heartbeat renews it. Manual
 * clock, pin_lease_ms = 100. Mutation tried: lease_renew() does nothing ->
 * the pins are gone at 160 ms and the test fails; the lease timer started
 * with supply_pin_ms (300) instead of the lease -> pins still held at 250 ms. */
static void test_lease_expiry_frees_pins(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, lease_tweak);
    world_connect(w, 1, 0);
    uint32_t ids[4] = {10, 11, 12, 13};
    for (int i = 0; i < 4; i++)
        world_put(w, 0, ids[i], 0);
    wkeys_t ks;
    wkeys_ids(&ks, ids, 4);
    uint64_t t0 = kvp_clock_now(&w->mc.clock);
    const kvp_event_t *e = lookup_wait(w, 1, prefix_lookup(w, 1, 0, 42, &ks, NULL));
    assert_int_equal(e->n_ok, 4);
    assert_int_equal(world_stats(w, 0).pins, 4);

    /* Heartbeats every 60 ms keep the lease alive well past 100 ms. */
    for (int hb = 0; hb < 4; hb++) {
        world_run(w, 60 * MS);
        assert_int_equal(world_stats(w, 0).pins, 4);
        assert_int_equal(kvp_lease_renew(w->node[1], w->addr[0], 42), KVP_OK);
    }
    assert_true(kvp_clock_now(&w->mc.clock) - t0 >= 240 * MS);
    world_run(w, 60 * MS); /* 60 ms after the last renewal: still leased */
    kvp_stats_t s0 = world_stats(w, 0);
    assert_int_equal(s0.pins, 4);
    assert_true(s0.leases_renewed >= 4);
    assert_int_equal(s0.leases_expired, 0);

    /* No more heartbeats: released at the lease (100 ms), counted. */
    world_run(w, 50 * MS);
    s0 = world_stats(w, 0);
    assert_int_equal(s0.pins, 0);
    assert_int_equal(s0.leases_expired, 1);
    assert_int_equal(s0.lease_pins_expired, 4);
    /* A fetch after expiry misses at once (F10), nothing is left behind. */
    uint64_t fop = 0;
    assert_int_equal(
        kvp_fetch(w->node[1], w->addr[0], 42, ks.buf, ks.len, ks.n, 0, NULL, &fop), KVP_OK);
    e = world_wait(w, 1, KVP_EV_LOAD, fop, 20 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_NOT_FOUND);
    world_run(w, 5 * MS);
    assert_int_equal(world_stats(w, 1).slots_filling, 0);

    /* A renewal for a request with nothing leased is harmless. */
    assert_int_equal(kvp_lease_renew(w->node[1], w->addr[0], 999), KVP_OK);
    world_run(w, 5 * MS);
    assert_int_equal(world_stats(w, 0).pins, 0);
    world_fini(w, false);
    free(w);
}

/* A fetch of one round of a request renews the lease of its other rounds
 * (the requester is still working on it). Mutation tried: no renewal in
 * on_fetch -> round A's pins are gone at 130 ms. */
static void test_lease_renewed_by_fetch(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, lease_tweak);
    world_connect(w, 1, 0);
    uint32_t a_ids[3] = {20, 21, 22}, b_ids[2] = {30, 31};
    for (int i = 0; i < 3; i++)
        world_put(w, 0, a_ids[i], 0);
    for (int i = 0; i < 2; i++)
        world_put(w, 0, b_ids[i], 0);
    wkeys_t a, b;
    wkeys_ids(&a, a_ids, 3);
    wkeys_ids(&b, b_ids, 2);
    uint64_t t0 = kvp_clock_now(&w->mc.clock);
    lookup_wait(w, 1, prefix_lookup(w, 1, 0, 77, &a, NULL)); /* round A */
    assert_int_equal(lookup_wait(w, 1, prefix_lookup(w, 1, 0, 77, &b, NULL))->n_ok, 2);
    assert_int_equal(world_stats(w, 0).pins, 5);
    assert_true(kvp_clock_now(&w->mc.clock) - t0 < 10 * MS);
    world_run(w, 60 * MS);
    uint64_t fop = 0; /* fetch round B at ~65 ms: renews A */
    assert_int_equal(kvp_fetch(w->node[1], w->addr[0], 77, b.buf, b.len, b.n, 0, NULL, &fop),
                     KVP_OK);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, fop, 50 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    world_run(w, 50 * MS); /* > 100 ms after A's lookup: only the fetch renewed A */
    assert_true(kvp_clock_now(&w->mc.clock) - t0 > 110 * MS);
    assert_int_equal(pins_after(w, 0, 3, 5 * MS), 3); /* A still leased, B's moved and released */
    assert_int_equal(world_stats(w, 0).leases_expired, 0);
    world_run(w, 120 * MS);
    kvp_stats_t s0 = world_stats(w, 0);
    assert_int_equal(s0.pins, 0);
    assert_int_equal(s0.leases_expired, 1);
    assert_int_equal(s0.lease_pins_expired, 3);
    world_fini(w, false);
    free(w);
}

/* The router hint: a fetch without a lookup, naming the source and the keys
 * a router's map lists. A fresh hint is served; a stale one (a key gone)
 * fails at once with NOT_FOUND, releasing everything. Mutation tried:
 * a hinted fetch parks like WAIT_FOR_SUPPLY -> no event within 20 ms. */
static void test_hint_fetch_fresh_and_stale(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    uint32_t ids[3] = {40, 41, 42};
    for (int i = 0; i < 3; i++)
        world_put(w, 0, ids[i], 0);
    wkeys_t ks;
    wkeys_ids(&ks, ids, 3);
    uint64_t op = 0;
    assert_int_equal(kvp_fetch(w->node[1], w->addr[0], 5, ks.buf, ks.len, ks.n,
                               KVP_FETCH_FLAG_HINT, NULL, &op),
                     KVP_OK);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 50 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    for (int i = 0; i < 3; i++)
        assert_true(world_verify(w, 1, ids[i]));

    uint32_t stale_ids[2] = {42, 43}; /* 43 was never there */
    wkeys_t st;
    wkeys_ids(&st, stale_ids, 2);
    uint64_t t0 = kvp_clock_now(&w->mc.clock);
    assert_int_equal(kvp_fetch(w->node[1], w->addr[0], 6, st.buf, st.len, st.n,
                               KVP_FETCH_FLAG_HINT, NULL, &op),
                     KVP_OK);
    e = world_wait(w, 1, KVP_EV_LOAD, op, 20 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_NOT_FOUND);
    assert_true(kvp_clock_now(&w->mc.clock) - t0 < 20 * MS);
    world_run(w, 5 * MS);
    assert_int_equal(world_stats(w, 0).pins, 0);
    assert_int_equal(world_stats(w, 0).fetch_hints_stale, 1);
    assert_int_equal(world_stats(w, 1).slots_filling, 0);
    /* HINT and WAIT_FOR_SUPPLY together make no sense: refused. */
    assert_int_equal(kvp_fetch(w->node[1], w->addr[0], 7, st.buf, st.len, st.n,
                               KVP_FETCH_FLAG_HINT | KVP_FETCH_FLAG_WAIT_FOR_SUPPLY, NULL, &op),
                     KVP_ERR_INVALID);
    assert_int_equal(kvp_fetch(w->node[1], w->addr[0], 7, st.buf, st.len, st.n, 4, NULL, &op),
                     KVP_ERR_INVALID);
    world_fini(w, false);
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_matches_model_random),
        cmocka_unit_test(test_prefix_not_merged_and_args),
        cmocka_unit_test(test_lease_expiry_frees_pins),
        cmocka_unit_test(test_lease_renewed_by_fetch),
        cmocka_unit_test(test_hint_fetch_fresh_and_stale),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
