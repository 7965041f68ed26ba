/*
 * test_bounds.c -- the resource limits of SPEC §8 / §9 on the fake world
 * (tests/node/world.h): each limit the node implements is hit, the
 * documented behaviour is checked together with the metric that shows it,
 * and the node recovers once the cause is gone. Each test names the
 * mutation (a config that drops the limit) under which it fails.
 */
#include "node/world.h"

#define MS KVP_NSEC_PER_MSEC

static uint64_t do_lookup(world_t *w, int i, int j, uint64_t req, const wkeys_t *ks,
                          uint8_t *res)
{
    uint64_t op = 0;
    assert_int_equal(kvp_lookup(w->node[i], w->addr[j], req, ks->buf, ks->len, ks->n, res, &op),
                     KVP_OK);
    return op;
}

static kvp_status_t try_fetch(world_t *w, int i, int j, uint64_t req, const wkeys_t *ks,
                              uint64_t *op)
{
    return kvp_fetch(w->node[i], w->addr[j], req, ks->buf, ks->len, ks->n, 0, NULL, op);
}

/* Lookup of keys k0.. from j on i; returns the number of hits. */
static uint32_t lookup_hits(world_t *w, int i, int j, uint64_t req, uint32_t k0, uint32_t n)
{
    wkeys_t ks;
    uint8_t res[64];
    wkeys_make(&ks, k0, n);
    uint64_t op = do_lookup(w, i, j, req, &ks, res);
    const kvp_event_t *e = world_wait(w, i, KVP_EV_LOOKUP, op, 200 * MS);
    assert_non_null(e);
    return e->status == KVP_OK ? e->n_ok : 0;
}

/* Lookup + fetch; returns the load's status (waits at most max_ns). */
static kvp_status_t lookup_fetch(world_t *w, int i, int j, uint64_t req, uint32_t k0,
                                 uint32_t n, uint64_t max_ns)
{
    assert_int_equal(lookup_hits(w, i, j, req, k0, n), n);
    wkeys_t ks;
    uint64_t op = 0;
    wkeys_make(&ks, k0, n);
    assert_int_equal(try_fetch(w, i, j, req, &ks, &op), KVP_OK);
    const kvp_event_t *e = world_wait(w, i, KVP_EV_LOAD, op, max_ns);
    assert_non_null(e);
    return (kvp_status_t)e->status;
}

static uint32_t g_limit;

/* ---------------------------------------------------------- max_sessions */

static void tweak_sessions(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    if (i == 0)
        c->max_sessions = g_limit;
}

/* SPEC §8 "max sessions: refuse more, cleanly" (F20). Node 0 takes one
 * session; a second peer is refused at the handshake (ctl refused_limit),
 * the first session is untouched, and the refused peer gets in once the
 * first leaves. Mutation: max_sessions = 2 -> the second peer gets in. */
static void test_max_sessions_refuses_cleanly(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    g_limit = 1;
    world_init(w, 3, tweak_sessions);
    world_connect(w, 1, 0);
    assert_int_equal(kvp_peer_add(w->node[2], w->addr[0]), KVP_OK);
    world_run(w, 1000 * MS);
    assert_true(world_peer_ready(w, 1, 0));
    assert_false(world_peer_ready(w, 2, 0));
    assert_false(world_peer_ready(w, 0, 2));
    assert_int_equal(world_stats(w, 0).sessions_ready, 1);
    kvp_ctl_stats_t cs;
    kvp_ctl_get_stats(w->node[0]->ctl, &cs);
    assert_true(cs.refused_limit >= 1);
    assert_int_equal(cs.blobs_out, 1); /* the refused peer never got our blob */
    /* the existing session still serves */
    world_put(w, 0, 1, 0);
    assert_int_equal(lookup_fetch(w, 1, 0, 5, 1, 1, 200 * MS), KVP_OK);
    /* recovery: node 1 leaves gracefully, node 2's redial gets in */
    assert_int_equal(kvp_peer_remove(w->node[1], w->addr[0]), KVP_OK);
    uint64_t end = kvp_clock_now(&w->mc.clock) + 2 * KVP_NSEC_PER_SEC;
    while (!world_peer_ready(w, 2, 0) && kvp_clock_now(&w->mc.clock) < end)
        world_step(w);
    assert_true(world_peer_ready(w, 2, 0));
    world_fini(w, false);
    free(w);
}

/* -------------------------------------------------------------- max_pins */

static void tweak_pins(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    if (i == 0)
        c->max_pins = g_limit;
}

/* SPEC §9 "caps on pinned bytes" (F20): with max_pins = 4 a LOOKUP of 8
 * READY keys pins 4 and answers the rest MISS (store pin_limit_refusals);
 * a local acquire is refused with KVP_ERR_LIMIT; finishing the request
 * returns the pins. Mutation: max_pins = 64 -> 8 hits. */
static void test_max_pins_lookup_answers_miss(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    g_limit = 4;
    world_init(w, 2, tweak_pins);
    world_connect(w, 1, 0);
    for (uint32_t k = 0; k < 8; k++)
        world_put(w, 0, k, 0);
    assert_int_equal(lookup_hits(w, 1, 0, 3, 0, 8), 4);
    assert_int_equal(world_stats(w, 0).pins, 4);
    kvp_store_stats_t ss;
    kvp_store_get_stats(kvp__node_store(w->node[0]), &ss);
    assert_true(ss.pin_limit_refusals >= 4);
    uint8_t key[32];
    uint32_t kl = world_key(7, key);
    kvp_block_t b;
    assert_int_equal(kvp_get(w->node[0], key, kl, &b), KVP_ERR_LIMIT);
    assert_int_equal(kvp_finish_request(w->node[1], 3), KVP_OK);
    world_run(w, 20 * MS);
    assert_int_equal(world_stats(w, 0).pins, 0);
    assert_int_equal(kvp_get(w->node[0], key, kl, &b), KVP_OK);
    assert_int_equal(kvp_release(w->node[0], &b), KVP_OK);
    world_fini(w, false);
    free(w);
}

/* --------------------------------------------- max_inflight_bytes_per_peer */

static void tweak_inflight(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    if (i == 1)
        c->max_inflight_bytes_per_peer = (uint64_t)g_limit * c->block_size;
}

/* SPEC §8 "max bytes in flight per peer": two blocks in flight fill the
 * budget of 2 blocks; a third fetch is refused at once with KVP_ERR_LIMIT
 * (no event, nothing reserved); once the load settles the budget returns.
 * Mutation: a budget of 3 blocks -> the third fetch is accepted. */
static void test_max_inflight_bytes_refuses_fetch(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    g_limit = 2;
    world_init(w, 2, tweak_inflight);
    world_connect(w, 1, 0);
    for (uint32_t k = 0; k < 4; k++)
        world_put(w, 0, k, 0);
    assert_int_equal(lookup_hits(w, 1, 0, 9, 0, 3), 3);
    kvp_fake_script_t slow = kvp_fake_script_complete(300 * MS);
    assert_int_equal(kvp_fake_script_next(kvp__node_xport(w->node[0]), &slow), KVP_OK);
    wkeys_t ks;
    uint64_t op = 0, op2 = 0;
    wkeys_make(&ks, 0, 2);
    assert_int_equal(try_fetch(w, 1, 0, 9, &ks, &op), KVP_OK);
    world_run(w, 20 * MS);
    kvp_peer_info_t pi[4];
    uint32_t np = 0;
    assert_int_equal(kvp_node_peers(w->node[1], pi, 4, &np), KVP_OK);
    assert_int_equal(np, 1);
    assert_int_equal(pi[0].bytes_inflight, 2ull * w->cfg[1].block_size);
    wkeys_make(&ks, 2, 1);
    kvp_stats_t before = world_stats(w, 1);
    assert_int_equal(try_fetch(w, 1, 0, 9, &ks, &op2), KVP_ERR_LIMIT);
    kvp_stats_t after = world_stats(w, 1);
    assert_int_equal(after.slots_filling, before.slots_filling); /* nothing reserved */
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 1000 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    assert_int_equal(world_event_count(w, 1, KVP_EV_LOAD, 0), 1); /* none for the refusal */
    assert_int_equal(lookup_fetch(w, 1, 0, 10, 2, 2, 500 * MS), KVP_OK); /* budget back */
    world_fini(w, false);
    free(w);
}

/* ------------------------------------------------------- max_quarantined */

static void tweak_quarantine(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    if (i == 1) {
        c->max_quarantined = g_limit;
        s->fake_path = KVP_PATH_FAKE_UNFENCEABLE; /* no fence proof: slots stay held */
    }
}

/* SPEC §8 "max quarantined slots: further fetches answer MISS" (I5). A
 * source dies mid-transfer on an unfenceable path: its 2 destination slots
 * stay QUARANTINED; with max_quarantined = 2 the next fetch -- even from a
 * healthy peer -- is refused with KVP_ERR_LIMIT; at the hold cap the slots
 * are released (suspect) and fetching works again.
 * Mutation: max_quarantined = 3 -> the fetch from node 2 is accepted. */
static void test_max_quarantined_refuses_fetch(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    g_limit = 2;
    world_init(w, 3, tweak_quarantine);
    world_connect(w, 1, 0);
    world_connect(w, 1, 2);
    for (uint32_t k = 0; k < 2; k++)
        world_put(w, 0, k, 0);
    for (uint32_t k = 10; k < 12; k++)
        world_put(w, 2, k, 0);
    assert_int_equal(lookup_hits(w, 1, 0, 4, 0, 2), 2);
    kvp_fake_script_t wedge = kvp_fake_script_wedge();
    assert_int_equal(kvp_fake_script_next(kvp__node_xport(w->node[0]), &wedge), KVP_OK);
    wkeys_t ks;
    uint64_t op = 0;
    wkeys_make(&ks, 0, 2);
    assert_int_equal(try_fetch(w, 1, 0, 4, &ks, &op), KVP_OK);
    world_run(w, 10 * MS);
    uint64_t t0 = kvp_clock_now(&w->mc.clock);
    kvp_fake_net_kill(w->net, w->addr[0]); /* the source process dies */
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 1000 * MS);
    assert_non_null(e);
    assert_int_not_equal(e->status, KVP_OK);
    assert_true(kvp_clock_now(&w->mc.clock) - t0 <= (uint64_t)w->cfg[1].dead_after_ms * MS);
    assert_int_equal(world_stats(w, 1).slots_quarantined, 2);
    /* the limit: a healthy peer's fetch is refused too */
    assert_int_equal(lookup_hits(w, 1, 2, 6, 10, 2), 2);
    wkeys_make(&ks, 10, 2);
    assert_int_equal(try_fetch(w, 1, 2, 6, &ks, &op), KVP_ERR_LIMIT);
    /* the hold cap releases them (suspect), then fetching works again */
    world_run(w, (uint64_t)w->cfg[1].hold_cap_ms * MS + 500 * MS);
    kvp_stats_t st = world_stats(w, 1);
    assert_int_equal(st.slots_quarantined, 0);
    assert_int_equal(st.slots_suspect, 2);
    assert_true(st.force_releases >= 1);
    assert_int_equal(lookup_fetch(w, 1, 2, 7, 10, 2, 500 * MS), KVP_OK);
    assert_true(world_verify(w, 1, 10));
    world_fini(w, false);
    free(w);
}

/* ---------------------------------------------------------- max_retained */

static void tweak_retained(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    if (i == 0)
        c->max_retained = g_limit;
}

/* SPEC §8 "max retained transfers: the node stops serving new fetches until
 * some release". The consumer dies while node 0's transfer is wedged: it is
 * retained with its pins (retained_transfers = 1). With max_retained = 1
 * node 0 answers the next FETCH (another consumer) with a failure and
 * moves no byte; at the hold cap the wedged transfer is force-released
 * (force_releases) and node 0 serves again.
 * Mutation: max_retained = 2 -> node 2's fetch is served. */
static void test_max_retained_refuses_fetch(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    g_limit = 1;
    world_init(w, 3, tweak_retained);
    world_connect(w, 1, 0);
    world_connect(w, 2, 0);
    for (uint32_t k = 0; k < 3; k++)
        world_put(w, 0, k, 0);
    assert_int_equal(lookup_hits(w, 1, 0, 4, 0, 1), 1);
    kvp_fake_script_t wedge = kvp_fake_script_wedge();
    assert_int_equal(kvp_fake_script_next(kvp__node_xport(w->node[0]), &wedge), KVP_OK);
    wkeys_t ks;
    uint64_t op = 0;
    wkeys_make(&ks, 0, 1);
    assert_int_equal(try_fetch(w, 1, 0, 4, &ks, &op), KVP_OK);
    world_run(w, 10 * MS);
    world_stop_node(w, 1); /* the consumer goes away; node 0's WRITE is wedged */
    world_run(w, (uint64_t)w->cfg[0].dead_after_ms * MS + 100 * MS);
    kvp_stats_t st = world_stats(w, 0);
    assert_int_equal(st.retained_transfers, 1);
    assert_int_equal(st.pins, 1); /* the retained transfer keeps its source pin */
    uint64_t out0 = st.blocks_out;
    kvp_status_t ls = lookup_fetch(w, 2, 0, 8, 1, 2, 500 * MS);
    assert_int_equal(ls, KVP_ERR_LIMIT); /* the source's reason travels in FETCH_DONE */
    assert_int_equal(world_stats(w, 0).blocks_out, out0); /* no byte moved */
    world_run(w, (uint64_t)w->cfg[0].hold_cap_ms * MS + 500 * MS);
    st = world_stats(w, 0);
    assert_int_equal(st.retained_transfers, 0);
    assert_true(st.force_releases >= 1);
    assert_int_equal(lookup_fetch(w, 2, 0, 9, 1, 2, 500 * MS), KVP_OK);
    assert_true(world_verify(w, 2, 1));
    world_fini(w, false);
    free(w);
}

int main(void)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_max_sessions_refuses_cleanly),
        cmocka_unit_test(test_max_pins_lookup_answers_miss),
        cmocka_unit_test(test_max_inflight_bytes_refuses_fetch),
        cmocka_unit_test(test_max_quarantined_refuses_fetch),
        cmocka_unit_test(test_max_retained_refuses_fetch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
