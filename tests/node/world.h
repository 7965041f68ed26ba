/*
 * world.h -- a deterministic world of N nodes for node tests and the
 * simulator: one manual clock, one fake control network, one fake data
 * fabric; every node caller-driven. Header-only (static functions).
 */
#ifndef KVP_TEST_WORLD_H
#define KVP_TEST_WORLD_H

#include "testutil.h"

#include "node/node.h"
#include "transport/fake.h"

#define W_MAX 8
#define W_EVMAX 4096

typedef struct world {
    kvp_manual_clock_t mc;
    kvp_fake_fabric_t *fab;
    kvp_fake_net_t *net;
    int n;
    kvp_node_t *node[W_MAX];
    char addr[W_MAX][32];
    kvp_config_t cfg[W_MAX];
    kvp_node_seams_t seams[W_MAX];
    kvp_event_t ev[W_MAX][W_EVMAX];
    uint32_t nev[W_MAX];
    uint64_t step_ns;
} world_t;

typedef void (*world_tweak_fn)(kvp_config_t *cfg, kvp_node_seams_t *seams, int i);

static __attribute__((unused)) void world_cfg(world_t *w, int i)
{
    kvp_config_t *c = &w->cfg[i];
    kvp_config_init(c);
    snprintf(w->addr[i], sizeof(w->addr[i]), "n%d:7000", i);
    c->name = w->addr[i];
    c->listen_addr = w->addr[i];
    c->transport = KVP_TRANSPORT_FAKE;
    c->thread_mode = KVP_THREAD_CALLER;
    c->num_blocks = 64;
    c->block_size = 4096;
    c->compat = "model-x/fp16/16tok";
    /* Short, consistent timeouts (virtual time; the ordering of SPEC §8 kept). */
    c->heartbeat_ms = 50;
    c->dead_after_ms = 200;
    c->handshake_timeout_ms = 500;
    c->lookup_pending_ms = 200;
    c->supply_pin_ms = 300;
    c->load_timeout_ms = 1000;
    c->abort_resend_ms = 100;
    c->abort_ack_timeout_ms = 500;
    c->parked_demand_ms = 400;
    c->hold_cap_ms = 2000;
    c->shutdown_drain_ms = 200;
    /* Issue 27: the default supply-pin budgets (a quarter / half of the
     * region) would bite on this 64-block world in tests about other
     * things; the budget tests set their own. */
    c->max_supply_pins_per_peer = c->max_supply_pins = UINT32_MAX;
    c->backoff_min_ms = 20;
    c->backoff_max_ms = 200;
    w->seams[i] = (kvp_node_seams_t){&w->mc.clock, w->net, w->fab, KVP_PATH_FAKE_FENCEABLE,
                                     1 * KVP_NSEC_PER_MSEC, false, 0};
}

static __attribute__((unused)) kvp_status_t world_start_node(world_t *w, int i)
{
    return kvp__node_create_ex(&w->cfg[i], &w->seams[i], &w->node[i]);
}

static __attribute__((unused)) void world_init(world_t *w, int n, world_tweak_fn tweak)
{
    memset(w, 0, sizeof(*w));
    kvp_manual_clock_init(&w->mc, 1 * KVP_NSEC_PER_SEC);
    assert_int_equal(kvp_fake_fabric_create(&w->mc.clock, &w->fab), KVP_OK);
    assert_int_equal(kvp_fake_net_create(100 * 1000, &w->net), KVP_OK);
    w->n = n;
    w->step_ns = 1 * KVP_NSEC_PER_MSEC;
    for (int i = 0; i < n; i++) {
        world_cfg(w, i);
        if (tweak)
            tweak(&w->cfg[i], &w->seams[i], i);
        assert_int_equal(world_start_node(w, i), KVP_OK);
    }
}

/* A world of n nodes on the heap, also the cmocka state (the test frees it
 * after world_fini). */
static __attribute__((unused)) world_t *world_new(void **state, int n, world_tweak_fn tweak)
{
    world_t *w = *state = malloc(sizeof(world_t));
    assert_non_null(w);
    world_init(w, n, tweak);
    return w;
}

static __attribute__((unused)) void world_collect(world_t *w)
{
    for (int i = 0; i < w->n; i++) {
        if (w->node[i] == NULL)
            continue;
        uint32_t got = 0;
        kvp_poll_events(w->node[i], &w->ev[i][w->nev[i]], W_EVMAX - w->nev[i], &got);
        w->nev[i] += got;
    }
}

/* One tick: advance the clock, deliver the network, progress every node
 * (which lands due fake copies of its transport). */
static __attribute__((unused)) void world_step(world_t *w)
{
    kvp_manual_clock_advance(&w->mc, w->step_ns);
    for (int pass = 0; pass < 2; pass++) {
        kvp_fake_net_deliver(w->net);
        kvp_fake_fabric_progress(w->fab);
        for (int i = 0; i < w->n; i++)
            if (w->node[i] != NULL)
                kvp_node_progress(w->node[i], 0);
    }
    world_collect(w);
}

static __attribute__((unused)) void world_run(world_t *w, uint64_t ns)
{
    uint64_t end = kvp_clock_now(&w->mc.clock) + ns;
    while (kvp_clock_now(&w->mc.clock) < end)
        world_step(w);
}

static const kvp_event_t *world_event(world_t *w, int i, int type, uint64_t op_id)
{
    for (uint32_t k = 0; k < w->nev[i]; k++)
        if (w->ev[i][k].type == type && (op_id == 0 || w->ev[i][k].op_id == op_id))
            return &w->ev[i][k];
    return NULL;
}

static __attribute__((unused)) uint32_t world_event_count(world_t *w, int i, int type, uint64_t op_id)
{
    uint32_t c = 0;
    for (uint32_t k = 0; k < w->nev[i]; k++)
        if (w->ev[i][k].type == type && (op_id == 0 || w->ev[i][k].op_id == op_id))
            c++;
    return c;
}

/* Run until node i has an event of `type` for op_id, at most max_ns. */
static const kvp_event_t *world_wait(world_t *w, int i, int type, uint64_t op_id, uint64_t max_ns)
{
    uint64_t end = kvp_clock_now(&w->mc.clock) + max_ns;
    const kvp_event_t *e;
    while ((e = world_event(w, i, type, op_id)) == NULL && kvp_clock_now(&w->mc.clock) < end)
        world_step(w);
    return e;
}

static __attribute__((unused)) bool world_peer_ready(world_t *w, int i, int j)
{
    kvp_peer_info_t pi[W_MAX];
    uint32_t n = 0;
    kvp_node_peers(w->node[i], pi, W_MAX, &n);
    for (uint32_t k = 0; k < n; k++)
        if (strcmp(pi[k].peer, w->addr[j]) == 0 && pi[k].ready)
            return true;
    return false;
}

static __attribute__((unused)) void world_connect(world_t *w, int i, int j)
{
    assert_int_equal(kvp_peer_add(w->node[i], w->addr[j]), KVP_OK);
    uint64_t end = kvp_clock_now(&w->mc.clock) + 2 * KVP_NSEC_PER_SEC;
    while (!(world_peer_ready(w, i, j) && world_peer_ready(w, j, i)) &&
           kvp_clock_now(&w->mc.clock) < end)
        world_step(w);
    assert_true(world_peer_ready(w, i, j));
    assert_true(world_peer_ready(w, j, i));
}

/* Deterministic block content for key k. */
static __attribute__((unused)) void world_block(uint32_t k, uint8_t *buf, size_t len)
{
    kvp_rng_t r;
    kvp_rng_seed(&r, 0x5eed0000u + k);
    for (size_t i = 0; i < len; i += 8) {
        uint64_t v = kvp_rng_next(&r);
        memcpy(buf + i, &v, KVP_MIN(8, len - i));
    }
}

static __attribute__((unused)) uint32_t world_key(uint32_t k, uint8_t *out)
{
    return (uint32_t)snprintf((char *)out, 32, "blk-%08u", k);
}

static __attribute__((unused)) void world_put(world_t *w, int i, uint32_t k, uint64_t req)
{
    uint8_t key[32], *buf = malloc(w->cfg[i].block_size);
    uint32_t kl = world_key(k, key);
    world_block(k, buf, w->cfg[i].block_size);
    assert_int_equal(kvp_put(w->node[i], key, kl, buf, w->cfg[i].block_size, req), KVP_OK);
    free(buf);
}

/* Keys k0..k0+n-1 as a concatenated buffer + lengths. */
typedef struct wkeys {
    uint8_t buf[64 * 32];
    uint32_t len[64];
    uint32_t n;
} wkeys_t;

static __attribute__((unused)) void wkeys_make(wkeys_t *ks, uint32_t k0, uint32_t n)
{
    size_t off = 0;
    ks->n = n;
    for (uint32_t i = 0; i < n; i++) {
        ks->len[i] = world_key(k0 + i, ks->buf + off);
        off += ks->len[i];
    }
}

/* Byte-exact check that node i holds block k as READY. */
/* Node `cons` looks keys `ks` up on `src` for request `req`; every one must hit. */
static __attribute__((unused)) void world_lookup_hits(world_t *w, int cons, int src, wkeys_t *ks,
                                                      uint64_t req)
{
    uint8_t res[64];
    uint64_t op;
    assert_true(ks->n <= sizeof(res));
    assert_int_equal(kvp_lookup(w->node[cons], w->addr[src], req, ks->buf, ks->len, ks->n, res,
                                &op),
                     KVP_OK);
    const kvp_event_t *e = world_wait(w, cons, KVP_EV_LOOKUP, op, 100 * KVP_NSEC_PER_MSEC);
    assert_non_null(e);
    assert_int_equal(e->n_ok, ks->n);
}

static __attribute__((unused)) bool world_verify(world_t *w, int i, uint32_t k)
{
    uint8_t key[32], *buf = malloc(w->cfg[i].block_size);
    uint32_t kl = world_key(k, key);
    kvp_block_t b;
    bool ok = false;
    world_block(k, buf, w->cfg[i].block_size);
    if (kvp_get(w->node[i], key, kl, &b) == KVP_OK) {
        ok = memcmp(b.data, buf, w->cfg[i].block_size) == 0;
        kvp_release(w->node[i], &b);
    }
    free(buf);
    return ok;
}

/* External slots (issue 29): node i's region is its embedding's memory. */
static __attribute__((unused)) uint8_t *world_slot_ptr(world_t *w, int i, uint32_t slot)
{
    return (uint8_t *)kvp_store_slot_ptr(kvp__node_store(w->node[i]), slot);
}

/* The embedding of node i writes block k into `slot` and publishes it. */
static __attribute__((unused)) void world_publish(world_t *w, int i, uint32_t k, uint32_t slot)
{
    uint8_t key[32];
    uint32_t kl = world_key(k, key);
    world_block(k, world_slot_ptr(w, i, slot), w->cfg[i].block_size);
    assert_int_equal(kvp_publish(w->node[i], key, kl, slot), KVP_OK);
}

/* Slot `slot` of node i holds block k, byte-exact. */
static __attribute__((unused)) bool world_slot_is_block(world_t *w, int i, uint32_t slot,
                                                        uint32_t k)
{
    size_t bs = w->cfg[i].block_size;
    uint8_t *buf = malloc(bs);
    assert_non_null(buf);
    world_block(k, buf, bs);
    bool same = memcmp(world_slot_ptr(w, i, slot), buf, bs) == 0;
    free(buf);
    return same;
}

static __attribute__((unused)) kvp_stats_t world_stats(world_t *w, int i)
{
    kvp_stats_t st;
    assert_int_equal(kvp_node_stats(w->node[i], &st), KVP_OK);
    return st;
}

static __attribute__((unused)) void world_check_stores(world_t *w)
{
    for (int i = 0; i < w->n; i++) {
        if (w->node[i] == NULL)
            continue;
        char why[256];
        kvp_status_t st = kvp_store_check(kvp__node_store(w->node[i]), why, sizeof(why));
        if (st != KVP_OK)
            fail_msg("node %d store invalid: %s", i, why);
    }
}

static __attribute__((unused)) size_t world_violations(world_t *w)
{
    const kvp_fake_violation_t *v;
    size_t n = kvp_fake_violations(w->fab, &v);
    for (size_t i = 0; i < n && i < 5; i++)
        fprintf(stderr, "  violation: %s xfer %llu dst slot %u (gen %u vs %u)\n",
                kvp_fake_violation_kind_str(v[i].kind), (unsigned long long)v[i].xfer,
                v[i].dst_slot, v[i].expected_gen, v[i].actual_gen);
    return n;
}

static __attribute__((unused)) void world_stop_node(world_t *w, int i)
{
    kvp_node_destroy(w->node[i]);
    w->node[i] = NULL;
}

/* Tear down; assert no landing violations (unless allowed), no pins or
 * slots left (store destroy asserts), no leaks. */
static __attribute__((unused)) void world_fini(world_t *w, bool allow_violations)
{
    world_check_stores(w);
    size_t v = world_violations(w);
    for (int i = 0; i < w->n; i++)
        if (w->node[i] != NULL)
            world_stop_node(w, i);
    if (!allow_violations)
        assert_int_equal(v, 0);
    assert_int_equal(kvp_fake_fabric_destroy(w->fab), KVP_OK);
    kvp_fake_net_destroy(w->net);
    KVP_TEST_ASSERT_NO_LEAKS();
}

#endif
