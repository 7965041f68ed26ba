/*
 * test_node_wanted.c -- issue 29 step 2, "keys wanted", on the fake world:
 * a LOOKUP for keys the source node does not have published raises
 * KVP_EV_WANTED at the source; its embedding publishes what it holds and
 * calls kvp_wanted_done; the LOOKUP is answered with exactly what was
 * published (unanswered: MISS at lookup_pending_ms). A flooding peer gets
 * at most max_wanted_ops_per_peer ops outstanding and the limit flag; the
 * node stays alive, its published blocks unchanged, a good peer served.
 *
 * KVPEER_TEST_MUTATION=12 (wanted-hit: a wanted key never published
 * answers HIT) must make these tests fail.
 */
#include "world.h"

#include <stdlib.h>

#define MS KVP_NSEC_PER_MSEC

static void tweak_wanted(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    (void)s;
    (void)i;
    c->external_slots = 1;
    c->external_wanted = 1;
    c->max_wanted_ops_per_peer = 4;
}

/* The embedding of node i holds block k in slot 10 + k; publish it. */
static void publish(world_t *w, int i, uint32_t k)
{
    world_publish(w, i, k, 10 + k);
}

/* Two nodes in "keys wanted" mode, node 1 connected to node 0. */
static world_t *wanted_world(void **state)
{
    world_t *w = world_new(state, 2, tweak_wanted);
    world_connect(w, 1, 0);
    return w;
}

/* The next KVP_EV_WANTED node 0 raises (within 100 ms). */
static const kvp_event_t *wanted_next(world_t *w)
{
    const kvp_event_t *we = world_wait(w, 0, KVP_EV_WANTED, 0, 100 * MS);
    assert_non_null(we);
    return we;
}

/* Answer a WANTED op of node i the way an embedding does: read the keys,
 * publish the ones in `have` (block numbers), then done. Returns how many
 * keys were wanted. */
static uint32_t answer(world_t *w, int i, uint64_t op, const uint32_t *have, uint32_t n_have)
{
    uint8_t keys[64 * KVP_KEY_MAX];
    uint32_t lens[64], n = 99;
    assert_int_equal(kvp_wanted_keys(w->node[i], op, keys, lens, 64, &n), KVP_OK);
    uint32_t published = 0;
    for (uint32_t j = 0; j < n; j++)
        for (uint32_t h = 0; h < n_have; h++) {
            uint8_t key[32];
            uint32_t kl = world_key(have[h], key);
            if (kl == lens[j] && memcmp(key, keys + (size_t)j * KVP_KEY_MAX, kl) == 0) {
                publish(w, i, have[h]);
                published++;
            }
        }
    /* every wanted key published: the last publish answered it already */
    assert_int_equal(kvp_wanted_done(w->node[i], op),
                     published == n ? KVP_ERR_NOT_FOUND : KVP_OK);
    return n;
}

static uint64_t lookup(world_t *w, int cons, int src, uint32_t k0, uint32_t n, uint64_t req,
                       uint8_t *res)
{
    wkeys_t ks;
    uint64_t op;
    wkeys_make(&ks, k0, n);
    assert_int_equal(kvp_lookup(w->node[cons], w->addr[src], req, ks.buf, ks.len, n, res, &op),
                     KVP_OK);
    return op;
}

/* The embedding holds blocks 1 and 3 of 1..4: the LOOKUP waits for its
 * answer and hits exactly those; a fetch_into lands them byte-exact. */
static void test_wanted_answered_with_what_was_published(void **state)
{
    world_t *w = wanted_world(state);
    uint8_t res[4];
    memset(res, 7, sizeof(res));
    uint64_t lop = lookup(w, 1, 0, 1, 4, 77, res);
    const kvp_event_t *we = wanted_next(w);
    assert_int_equal(we->n_keys, 4);
    assert_int_equal(we->request_id, 77);
    assert_string_equal(we->peer, w->addr[1]);
    uint64_t wop = we->op_id;
    world_run(w, 20 * MS);
    assert_null(world_event(w, 1, KVP_EV_LOOKUP, lop)); /* waits for the embedding */
    uint32_t have[2] = {1, 3};
    assert_int_equal(answer(w, 0, wop, have, 2), 4);
    const kvp_event_t *le = world_wait(w, 1, KVP_EV_LOOKUP, lop, 50 * MS);
    assert_non_null(le);
    assert_int_equal(le->n_ok, 2);
    assert_int_equal(res[0], KVP_LOOKUP_HIT);
    assert_int_equal(res[1], KVP_LOOKUP_MISS);
    assert_int_equal(res[2], KVP_LOOKUP_HIT);
    assert_int_equal(res[3], KVP_LOOKUP_MISS);
    assert_int_equal(kvp_wanted_done(w->node[0], wop), KVP_ERR_NOT_FOUND); /* answered */
    uint32_t n = 9;
    assert_int_equal(kvp_wanted_keys(w->node[0], wop, NULL, NULL, 0, &n), KVP_ERR_NOT_FOUND);
    assert_int_equal(n, 0);
    /* The hits are served from the embedding's slots into the consumer's. */
    wkeys_t ks;
    ks.n = 2;
    ks.len[0] = world_key(1, ks.buf);
    ks.len[1] = world_key(3, ks.buf + ks.len[0]);
    uint32_t slots[2] = {40, 41};
    int32_t bs[2] = {99, 99};
    uint64_t fop;
    assert_int_equal(kvp_fetch_into(w->node[1], w->addr[0], 77, ks.buf, ks.len, 2, slots, 0, bs,
                                    &fop),
                     KVP_OK);
    const kvp_event_t *fe = world_wait(w, 1, KVP_EV_LOAD, fop, 200 * MS);
    assert_non_null(fe);
    assert_int_equal(fe->status, KVP_OK);
    assert_true(world_slot_is_block(w, 1, 40, 1));
    assert_true(world_slot_is_block(w, 1, 41, 3));
    kvp_stats_t s0 = world_stats(w, 0);
    assert_int_equal(s0.wanted_ops, 1);
    assert_int_equal(s0.wanted_keys, 4);
    assert_int_equal(s0.wanted_keys_missed, 2);
    assert_int_equal(s0.wanted_expired, 0);
    assert_int_equal(s0.bytes_copied_in + s0.bytes_copied_out, 0);
    world_fini(w, false);
    free(w);
}

/* No answer: every key MISS at lookup_pending_ms, counted; the op is gone. */
static void test_wanted_unanswered_is_miss_at_deadline(void **state)
{
    world_t *w = wanted_world(state);
    uint8_t res[3];
    uint64_t lop = lookup(w, 1, 0, 5, 3, 8, res);
    const kvp_event_t *we = wanted_next(w);
    uint64_t wop = we->op_id;
    uint64_t t0 = kvp_clock_now(&w->mc.clock);
    const kvp_event_t *le = world_wait(w, 1, KVP_EV_LOOKUP, lop, 1000 * MS);
    assert_non_null(le);
    assert_true(kvp_clock_now(&w->mc.clock) - t0 >= 150 * MS); /* lookup_pending_ms = 200 */
    assert_int_equal(le->n_ok, 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(res[i], KVP_LOOKUP_MISS);
    assert_int_equal(kvp_wanted_done(w->node[0], wop), KVP_ERR_NOT_FOUND);
    /* A late publish of a wanted key is harmless: served to later lookups. */
    publish(w, 0, 5);
    kvp_stats_t s0 = world_stats(w, 0);
    assert_int_equal(s0.wanted_expired, 1);
    assert_int_equal(s0.wanted_keys_missed, 3);
    world_fini(w, false);
    free(w);
}

/* Everything wanted published before done: answered at the last publish. */
static void test_wanted_all_published_answers_at_once(void **state)
{
    world_t *w = wanted_world(state);
    publish(w, 0, 2); /* already published: a plain hit, not wanted */
    uint8_t res[3];
    uint64_t lop = lookup(w, 1, 0, 1, 3, 9, res);
    const kvp_event_t *we = wanted_next(w);
    assert_int_equal(we->n_keys, 2);
    publish(w, 0, 1);
    publish(w, 0, 3);
    const kvp_event_t *le = world_wait(w, 1, KVP_EV_LOOKUP, lop, 50 * MS);
    assert_non_null(le);
    assert_int_equal(le->n_ok, 3);
    assert_int_equal(kvp_wanted_done(w->node[0], we->op_id), KVP_ERR_NOT_FOUND);
    assert_int_equal(world_stats(w, 0).wanted_keys_missed, 0);
    world_fini(w, false);
    free(w);
}

/* A peer floods LOOKUPs of keys nobody has: at most max_wanted_ops_per_peer
 * (4) WANTED ops outstanding; the rest MISS at once with the limit flag.
 * The node stays alive, its published block unchanged, a good peer served
 * (its own ops not refused by the flooder's), the session up after a
 * reconnect-free run past the deadline. */
static void test_wanted_flood_bounded_good_peer_served(void **state)
{
    world_t *w = world_new(state, 3, tweak_wanted);
    world_connect(w, 1, 0);
    world_connect(w, 2, 0);
    publish(w, 0, 30);
    uint8_t res[40][8];
    uint64_t ops[40];
    for (uint32_t r = 0; r < 40; r++)
        ops[r] = lookup(w, 1, 0, 1000 + r * 8, 8, 100 + r, res[r]);
    world_run(w, 30 * MS);
    assert_int_equal(world_event_count(w, 0, KVP_EV_WANTED, 0), 4);
    uint32_t limited = 0, answered = 0;
    for (uint32_t r = 0; r < 40; r++) {
        const kvp_event_t *e = world_event(w, 1, KVP_EV_LOOKUP, ops[r]);
        if (e == NULL)
            continue;
        answered++;
        limited += e->status == KVP_ERR_LIMIT;
        assert_int_equal(e->n_ok, 0);
    }
    assert_int_equal(answered, 36);
    assert_int_equal(limited, 36);
    assert_true(world_stats(w, 0).wanted_refused >= 36);
    /* The good peer: a published key hits, a wanted one is asked for. */
    uint8_t gres[2];
    uint64_t gop = lookup(w, 2, 0, 30, 2, 500, gres);
    const kvp_event_t *we = NULL;
    for (int t = 0; t < 100 && we == NULL; t++) {
        world_step(w);
        for (uint32_t k = 0; k < w->nev[0]; k++)
            if (w->ev[0][k].type == KVP_EV_WANTED && strcmp(w->ev[0][k].peer, w->addr[2]) == 0)
                we = &w->ev[0][k];
    }
    assert_non_null(we);
    uint32_t have[1] = {31};
    assert_int_equal(answer(w, 0, we->op_id, have, 1), 1);
    const kvp_event_t *le = world_wait(w, 1 + 1, KVP_EV_LOOKUP, gop, 50 * MS);
    assert_non_null(le);
    assert_int_equal(le->n_ok, 2);
    assert_true(world_slot_is_block(w, 0, 40, 30)); /* the published blocks unchanged */
    assert_true(world_slot_is_block(w, 0, 41, 31));
    uint32_t slots[2] = {50, 51};
    wkeys_t ks;
    wkeys_make(&ks, 30, 2);
    uint64_t fop;
    assert_int_equal(kvp_fetch_into(w->node[2], w->addr[0], 500, ks.buf, ks.len, 2, slots, 0,
                                    NULL, &fop),
                     KVP_OK);
    const kvp_event_t *fe = world_wait(w, 2, KVP_EV_LOAD, fop, 200 * MS);
    assert_non_null(fe);
    assert_int_equal(fe->status, KVP_OK);
    assert_true(world_slot_is_block(w, 2, 50, 30));
    assert_true(world_slot_is_block(w, 2, 51, 31));
    world_run(w, 300 * MS); /* the flooder's 4 ops expire; the node lives on */
    assert_int_equal(world_stats(w, 0).wanted_expired, 4);
    assert_true(world_peer_ready(w, 0, 1));
    world_fini(w, false);
    free(w);
}

/* The wanting peer goes away: its op is gone (NOT_FOUND), nothing leaks;
 * without external_wanted no WANTED is raised and the calls are refused. */
static void test_wanted_peer_gone_and_mode_off(void **state)
{
    world_t *w = wanted_world(state);
    uint8_t res[2];
    lookup(w, 1, 0, 1, 2, 5, res);
    const kvp_event_t *we = wanted_next(w);
    uint64_t wop = we->op_id;
    kvp_fake_net_kill(w->net, w->addr[1]);
    world_run(w, 400 * MS);
    uint32_t n = 9;
    uint8_t keys[KVP_KEY_MAX];
    uint32_t lens[1];
    assert_int_equal(kvp_wanted_keys(w->node[0], wop, keys, lens, 1, &n), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_wanted_done(w->node[0], wop), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_wanted_done(w->node[0], 0), KVP_ERR_NOT_FOUND);
    assert_int_equal(kvp_wanted_keys(w->node[0], wop, NULL, NULL, 1, &n), KVP_ERR_INVALID);
    world_fini(w, false);
    free(w);
}

/* How many keys kvp_parked_keys names at node i, and whether key k is one. */
static uint32_t parked_cap(world_t *w, int i, uint32_t cap, uint32_t k, bool *has)
{
    uint8_t keys[8 * KVP_KEY_MAX], key[32];
    uint32_t lens[8], n = 99, kl = world_key(k, key);
    assert_true(cap <= 8);
    assert_int_equal(kvp_parked_keys(w->node[i], keys, lens, cap, &n), KVP_OK);
    *has = false;
    for (uint32_t j = 0; j < n; j++)
        *has |= lens[j] == kl && memcmp(keys + (size_t)j * KVP_KEY_MAX, key, kl) == 0;
    return n;
}

static uint32_t parked(world_t *w, int i, uint32_t k, bool *has)
{
    return parked_cap(w, i, 8, k, has);
}

/* A FETCH with wait-for-supply for keys node 0 has not published parks
 * there; kvp_parked_keys names exactly the keys it still waits for (each
 * once, however many FETCHes), the embedding publishes them and the loads
 * complete byte-exact; then nothing is parked. */
static void test_parked_keys_named_until_published(void **state)
{
    world_t *w = wanted_world(state);
    wkeys_t ks;
    wkeys_make(&ks, 3, 2);
    uint32_t slots[2] = {40, 41}, again[2] = {42, 43};
    int32_t bs[2];
    uint64_t f1, f2;
    assert_int_equal(kvp_fetch_into(w->node[1], w->addr[0], 9, ks.buf, ks.len, 2, slots,
                                    KVP_FETCH_FLAG_WAIT_FOR_SUPPLY, bs, &f1),
                     KVP_OK);
    assert_int_equal(kvp_fetch_into(w->node[1], w->addr[0], 9, ks.buf, ks.len, 2, again,
                                    KVP_FETCH_FLAG_WAIT_FOR_SUPPLY, bs, &f2),
                     KVP_OK);
    world_run(w, 20 * MS);
    bool has;
    assert_int_equal(parked(w, 0, 3, &has), 2); /* keys 3 and 4, each once */
    assert_true(has);
    publish(w, 0, 3);
    world_run(w, 5 * MS);
    assert_int_equal(parked(w, 0, 4, &has), 1); /* 4 still waited for, 3 supplied */
    assert_true(has);
    assert_null(world_event(w, 1, KVP_EV_LOAD, f1));
    publish(w, 0, 4);
    for (int f = 0; f < 2; f++) {
        const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, f ? f2 : f1, 200 * MS);
        assert_non_null(e);
        assert_int_equal(e->status, KVP_OK);
    }
    assert_true(world_slot_is_block(w, 1, 40, 3) && world_slot_is_block(w, 1, 41, 4));
    assert_true(world_slot_is_block(w, 1, 42, 3) && world_slot_is_block(w, 1, 43, 4));
    assert_int_equal(parked(w, 0, 3, &has), 0);
    uint32_t n;
    assert_int_equal(kvp_parked_keys(w->node[0], NULL, NULL, 1, &n), KVP_ERR_INVALID);
    assert_int_equal(kvp_parked_keys(w->node[0], NULL, NULL, 0, NULL), KVP_ERR_INVALID);
    world_fini(w, false);
    free(w);
}

/* kvp_parked_keys takes turns: parked keys that are never supplied (a
 * FETCH of three, first in line) do not keep a later FETCH's key from being
 * named when the embedding asks for two at a time. */
static void test_parked_keys_take_turns(void **state)
{
    world_t *w = wanted_world(state);
    wkeys_t ks, late;
    wkeys_make(&ks, 3, 3);
    wkeys_make(&late, 9, 1);
    uint32_t slots[3] = {40, 41, 42}, slot9[1] = {43};
    int32_t bs[3];
    uint64_t f1, f2;
    assert_int_equal(kvp_fetch_into(w->node[1], w->addr[0], 9, ks.buf, ks.len, 3, slots,
                                    KVP_FETCH_FLAG_WAIT_FOR_SUPPLY, bs, &f1),
                     KVP_OK);
    world_run(w, 10 * MS);
    assert_int_equal(kvp_fetch_into(w->node[1], w->addr[0], 10, late.buf, late.len, 1, slot9,
                                    KVP_FETCH_FLAG_WAIT_FOR_SUPPLY, bs, &f2),
                     KVP_OK);
    world_run(w, 10 * MS);
    bool has;
    assert_int_equal(parked_cap(w, 0, 2, 9, &has), 2); /* 3 and 4: the first FETCH's */
    assert_false(has);
    assert_int_equal(parked_cap(w, 0, 2, 9, &has), 2); /* 9 now, then 3 */
    assert_true(has);
    publish(w, 0, 9);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, f2, 200 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    assert_true(world_slot_is_block(w, 1, 43, 9));
    assert_int_equal(parked(w, 0, 9, &has), 3); /* 3, 4, 5 still waited for */
    assert_false(has);
    world_fini(w, false);
    free(w);
}

static void tweak_ext_only(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    (void)s;
    (void)i;
    c->external_slots = 1;
}

static void test_wanted_off_no_event(void **state)
{
    world_t *w = world_new(state, 2, tweak_ext_only);
    world_connect(w, 1, 0);
    uint8_t res[2];
    uint64_t lop = lookup(w, 1, 0, 1, 2, 5, res);
    const kvp_event_t *le = world_wait(w, 1, KVP_EV_LOOKUP, lop, 50 * MS); /* at once */
    assert_non_null(le);
    assert_int_equal(le->n_ok, 0);
    assert_int_equal(world_event_count(w, 0, KVP_EV_WANTED, 0), 0);
    uint32_t n;
    assert_int_equal(kvp_wanted_done(w->node[0], 1), KVP_ERR_UNSUPPORTED);
    assert_int_equal(kvp_wanted_keys(w->node[0], 1, NULL, NULL, 0, &n), KVP_ERR_UNSUPPORTED);
    assert_int_equal(kvp_parked_keys(w->node[0], NULL, NULL, 0, &n), KVP_ERR_UNSUPPORTED);
    kvp_config_t c = w->cfg[0];
    c.external_slots = 0;
    c.external_wanted = 1;
    kvp_node_t *bad = NULL;
    assert_int_equal(kvp_node_create(&c, &bad), KVP_ERR_INVALID); /* needs external_slots */
    assert_null(bad);
    world_fini(w, false);
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wanted_answered_with_what_was_published),
        cmocka_unit_test(test_wanted_unanswered_is_miss_at_deadline),
        cmocka_unit_test(test_wanted_all_published_answers_at_once),
        cmocka_unit_test(test_wanted_flood_bounded_good_peer_served),
        cmocka_unit_test(test_wanted_peer_gone_and_mode_off),
        cmocka_unit_test(test_wanted_off_no_event),
        cmocka_unit_test(test_parked_keys_named_until_published),
        cmocka_unit_test(test_parked_keys_take_turns),
    };
    const char *m = getenv("KVPEER_TEST_MUTATION"); /* show the tests catch it */
    if (m != NULL)
        kvp__mutation = atoi(m);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
