/*
 * test_node_extslots.c -- issue 29, external slots, on the fake world: the
 * embedding owns the region; a consumer fetches into slots it names, a
 * source serves slots it published. Each test asserts the ownership rule:
 * a slot is the embedding's exactly when kvp_slots_held says 0, and no WRITE
 * touches a slot the embedding got back (the fake's landing checker).
 */
#include "world.h"

#define MS KVP_NSEC_PER_MSEC
#define BS 4096

static void tweak_ext(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    (void)s;
    (void)i;
    c->external_slots = 1; /* the fake: the store maps the region (the embedding's) */
}

static void tweak_ext_unfenceable(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    tweak_ext(c, s, i);
    s->fake_path = KVP_PATH_FAKE_UNFENCEABLE;
}

static void tweak_ext_am(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    tweak_ext(c, s, i);
    s->fake_path = KVP_PATH_FAKE_AM;
}

static uint8_t held(world_t *w, int i, uint32_t slot)
{
    uint8_t h = 9;
    assert_int_equal(kvp_slots_held(w->node[i], slot, 1, &h), KVP_OK);
    return h;
}

static uint32_t held_count(world_t *w, int i)
{
    uint8_t h[64];
    uint32_t c = 0;
    assert_int_equal(kvp_slots_held(w->node[i], 0, 64, h), KVP_OK);
    for (int k = 0; k < 64; k++)
        c += h[k] != 0;
    return c;
}

/* Two nodes, node 1 connected to node 0, whose embedding published blocks
 * 1 and 2 in slots 10 and 11. */
static world_t *ext_world(void **state, world_tweak_fn tweak)
{
    world_t *w = world_new(state, 2, tweak);
    world_connect(w, 1, 0);
    world_publish(w, 0, 1, 10);
    world_publish(w, 0, 2, 11);
    return w;
}

/* Node 1 looks keys k1..kn up at node 0 (request 7, every one a hit), node
 * 0's next transfer follows `sc` (NULL: the world's default), and node 1
 * fetches the keys into `slots`: the load's op. */
static uint64_t ext_fetch(world_t *w, wkeys_t *ks, uint32_t n, const kvp_fake_script_t *sc,
                          const uint32_t *slots, int32_t *bs)
{
    uint64_t op;
    wkeys_make(ks, 1, n);
    world_lookup_hits(w, 1, 0, ks, 7);
    if (sc != NULL)
        assert_int_equal(kvp_fake_script_next(kvp__node_xport(w->node[0]), sc), KVP_OK);
    assert_int_equal(kvp_fetch_into(w->node[1], w->addr[0], 7, ks->buf, ks->len, n, slots, 0, bs,
                                    &op),
                     KVP_OK);
    return op;
}

/* ext_fetch of k1, k2 into `slots` while node 0's WRITE is wedged (its
 * late copy lands copy_ns later); node 0 is killed 5 ms in: the LOAD. */
static const kvp_event_t *ext_fetch_source_killed(world_t *w, uint64_t copy_ns,
                                                  const uint32_t *slots, int32_t *bs, uint64_t *op)
{
    wkeys_t ks;
    kvp_fake_script_t sc = kvp_fake_script_wedge_then_copy(copy_ns);
    *op = ext_fetch(w, &ks, 2, &sc, slots, bs);
    world_run(w, 5 * MS);
    kvp_fake_net_kill(w->net, w->addr[0]);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, *op, 500 * MS);
    assert_non_null(e);
    return e;
}

/* The blocks land byte-exact in the slots the consumer named, which are the
 * embedding's again at the event; nothing is indexed or copied. */
static void test_ext_fetch_into_lands(void **state)
{
    world_t *w = ext_world(state, tweak_ext);
    wkeys_t ks;
    uint32_t slots[2] = {40, 3};
    int32_t bs[2] = {99, 99};
    uint64_t op = ext_fetch(w, &ks, 2, NULL, slots, bs);
    assert_int_equal(held(w, 1, 40), 1);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 200 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    assert_int_equal(e->n_ok, 2);
    assert_int_equal(e->n_held, 0);
    assert_int_equal(bs[0], KVP_OK);
    assert_int_equal(bs[1], KVP_OK);
    assert_true(world_slot_is_block(w, 1, 40, 1));
    assert_true(world_slot_is_block(w, 1, 3, 2));
    assert_int_equal(held_count(w, 1), 0);                /* every slot the embedding's */
    assert_int_equal(held(w, 0, 10), 2);                  /* still published at the source */
    assert_int_equal(world_event_count(w, 1, KVP_EV_SLOTS_RELEASED, op), 0);
    uint8_t key[32];
    uint32_t kl = world_key(1, key);
    assert_int_equal(kvp_store_probe(kvp__node_store(w->node[1]), key, kl, NULL, NULL),
                     KVP_ERR_NOT_FOUND); /* not indexed: the embedding's block */
    kvp_stats_t s0 = world_stats(w, 0), s1 = world_stats(w, 1);
    assert_int_equal(s1.blocks_in, 2);
    assert_int_equal(s0.bytes_copied_in + s0.bytes_copied_out, 0);
    assert_int_equal(s1.bytes_copied_in + s1.bytes_copied_out, 0);
    world_fini(w, false);
    free(w);
}

/* Bad slot lists are refused whole (KVP_ERR_INVALID, nothing lent); the
 * normal-mode calls answer UNSUPPORTED; a good fetch still works after. */
static void test_ext_fetch_into_refusals(void **state)
{
    world_t *w = ext_world(state, tweak_ext);
    wkeys_t ks;
    wkeys_make(&ks, 1, 2);
    uint64_t op, op2;
    uint32_t out_of_range[2] = {5, 64}, twice[2] = {5, 5}, published[2] = {5, 6};
    assert_int_equal(kvp_fetch_into(w->node[1], w->addr[0], 7, ks.buf, ks.len, 2, out_of_range,
                                    0, NULL, &op),
                     KVP_ERR_INVALID);
    assert_int_equal(kvp_fetch_into(w->node[1], w->addr[0], 7, ks.buf, ks.len, 2, twice, 0, NULL,
                                    &op),
                     KVP_ERR_INVALID);
    uint8_t key[32];
    uint32_t kl = world_key(50, key);
    assert_int_equal(kvp_publish(w->node[1], key, kl, 6), KVP_OK);
    assert_int_equal(kvp_fetch_into(w->node[1], w->addr[0], 7, ks.buf, ks.len, 2, published, 0,
                                    NULL, &op),
                     KVP_ERR_INVALID);
    assert_int_equal(held_count(w, 1), 1); /* only the published slot */
    /* A slot lent to a load in flight cannot be lent again. */
    kvp_fake_script_t sc = kvp_fake_script_complete(50 * MS);
    assert_int_equal(kvp_fake_script_next(kvp__node_xport(w->node[0]), &sc), KVP_OK);
    uint32_t good[2] = {20, 21}, overlap[2] = {22, 21};
    int32_t bs[2];
    assert_int_equal(kvp_fetch_into(w->node[1], w->addr[0], 7, ks.buf, ks.len, 2, good,
                                    KVP_FETCH_FLAG_WAIT_FOR_SUPPLY, bs, &op),
                     KVP_OK);
    assert_int_equal(kvp_fetch_into(w->node[1], w->addr[0], 8, ks.buf, ks.len, 2, overlap, 0,
                                    NULL, &op2),
                     KVP_ERR_INVALID);
    assert_int_equal(held(w, 1, 22), 0); /* all or nothing */
    assert_int_equal(kvp_fetch(w->node[1], w->addr[0], 7, ks.buf, ks.len, 2, 0, NULL, &op2),
                     KVP_ERR_UNSUPPORTED);
    assert_int_equal(kvp_put(w->node[1], key, kl, world_slot_ptr(w, 1, 6), BS, 0), KVP_ERR_UNSUPPORTED);
    kvp_block_t b;
    assert_int_equal(kvp_get(w->node[1], key, kl, &b), KVP_ERR_UNSUPPORTED);
    void *bdst[1] = {world_slot_ptr(w, 1, 6)};
    uint64_t blen[1] = {BS};
    b = (kvp_block_t){world_slot_ptr(w, 1, 7), BS, 7, 0};
    assert_int_equal(kvp_blocks_copy(w->node[1], &b, 1, bdst, blen), KVP_ERR_UNSUPPORTED);
    assert_int_equal(kvp_publish(w->node[1], key, kl, 7), KVP_ERR_EXISTS);
    uint8_t key2[32];
    uint32_t kl2 = world_key(51, key2);
    assert_int_equal(kvp_publish(w->node[1], key2, kl2, 20), KVP_ERR_BUSY); /* lent */
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 300 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    assert_true(world_slot_is_block(w, 1, 20, 1));
    assert_true(world_slot_is_block(w, 1, 21, 2));
    assert_int_equal(kvp_unpublish(w->node[1], key, kl, NULL), KVP_OK);
    assert_int_equal(held_count(w, 1), 0);
    world_fini(w, false);
    free(w);
}

/* Unpublish while a transfer reads the slot: BUSY, no new lookup hit, the
 * transfer completes byte-exact, then KVP_EV_SLOT_FREE names the slot. */
static void test_ext_unpublish_busy_then_free(void **state)
{
    world_t *w = ext_world(state, tweak_ext);
    wkeys_t ks;
    kvp_fake_script_t sc = kvp_fake_script_complete(80 * MS);
    uint32_t slots[1] = {30};
    int32_t bs[1];
    uint64_t op = ext_fetch(w, &ks, 1, &sc, slots, bs); /* k1 (slot 10) pinned as supply */
    world_run(w, 10 * MS); /* the transfer is running */
    uint8_t key[32];
    uint32_t kl = world_key(1, key), slot = 0;
    assert_int_equal(kvp_unpublish(w->node[0], key, kl, &slot), KVP_ERR_BUSY);
    assert_int_equal(slot, 10);
    assert_int_equal(held(w, 0, 10), 2);
    uint8_t res[1];
    uint64_t lop;
    assert_int_equal(kvp_lookup(w->node[1], w->addr[0], 8, ks.buf, ks.len, 1, res, &lop), KVP_OK);
    const kvp_event_t *le = world_wait(w, 1, KVP_EV_LOOKUP, lop, 50 * MS);
    assert_non_null(le);
    assert_int_equal(le->n_ok, 0); /* no new pin on an unpublished slot */
    assert_null(world_event(w, 0, KVP_EV_SLOT_FREE, 0));
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 300 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    assert_true(world_slot_is_block(w, 1, 30, 1));
    const kvp_event_t *fe = world_wait(w, 0, KVP_EV_SLOT_FREE, 10, 50 * MS);
    assert_non_null(fe);
    assert_int_equal(held(w, 0, 10), 0);
    kvp_finish_request(w->node[1], 8);
    /* Unpinned: at once. */
    kl = world_key(2, key);
    assert_int_equal(kvp_unpublish(w->node[0], key, kl, &slot), KVP_OK);
    assert_int_equal(slot, 11);
    assert_int_equal(kvp_unpublish(w->node[0], key, kl, &slot), KVP_ERR_NOT_FOUND);
    world_run(w, 20 * MS);
    assert_int_equal(held_count(w, 0), 0);
    world_fini(w, false);
    free(w);
}

/* The end of a test: node 1 finishes request `req`; node 0's embedding
 * takes back block k, its last published one (at once: nothing pins it),
 * and holds every slot again; the world ends. */
static void ext_last_back(world_t *w, uint64_t req, uint32_t k)
{
    kvp_finish_request(w->node[1], req);
    world_run(w, 20 * MS);
    uint8_t key[32];
    uint32_t kl = world_key(k, key);
    assert_int_equal(kvp_unpublish(w->node[0], key, kl, NULL), KVP_OK);
    assert_int_equal(held_count(w, 0), 0);
    world_fini(w, false);
    free(w);
}

/* Two nodes, node 1 connected to node 0, whose embedding published block 1
 * in slot 10 once (for request once_for; 0: any) and block 2 in slot 11
 * the usual way. */
static world_t *once_world(void **state, uint64_t once_for)
{
    world_t *w = world_new(state, 2, tweak_ext);
    world_connect(w, 1, 0);
    uint8_t key[32];
    uint32_t kl = world_key(1, key);
    world_block(1, world_slot_ptr(w, 0, 10), w->cfg[0].block_size);
    assert_int_equal(kvp_publish_once(w->node[0], key, kl, 10, NULL, once_for), KVP_OK);
    world_publish(w, 0, 2, 11);
    return w;
}

/* Node 1 looks ks (k1, k2) up again as request `req` and fetches them into
 * slots 32, 33: the load completes with block 1 in slot 32. */
static void once_refetch(world_t *w, wkeys_t *ks, uint64_t req)
{
    uint32_t slots[2] = {32, 33};
    int32_t bs[2];
    uint64_t op;
    world_lookup_hits(w, 1, 0, ks, req);
    assert_int_equal(
        kvp_fetch_into(w->node[1], w->addr[0], req, ks->buf, ks->len, 2, slots, 0, bs, &op),
        KVP_OK);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 300 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    assert_true(world_slot_is_block(w, 1, 32, 1));
}

/* Published once (the prefill half of P/D): a transfer from the slot that
 * fails leaves it published; the first that completes unpublishes it
 * (KVP_EV_SLOT_FREE, no kvp_unpublish) and a later LOOKUP misses it. A slot
 * published the usual way stays served. */
static void test_ext_publish_once_back_at_its_fetch(void **state)
{
    world_t *w = once_world(state, 0);
    wkeys_t ks;
    int32_t bs[2];
    uint32_t slots[2] = {30, 31};
    kvp_fake_script_t fail = kvp_fake_script_fail(5 * MS, 0);
    uint64_t op = ext_fetch(w, &ks, 2, &fail, slots, bs); /* request 7 */
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 300 * MS);
    assert_non_null(e);
    assert_int_not_equal(e->status, KVP_OK);
    kvp_finish_request(w->node[1], 7);
    world_run(w, 20 * MS);
    assert_int_equal(held(w, 0, 10), 2); /* not served: still published */
    assert_null(world_event(w, 0, KVP_EV_SLOT_FREE, 10));
    once_refetch(w, &ks, 8);
    assert_non_null(world_wait(w, 0, KVP_EV_SLOT_FREE, 10, 50 * MS));
    assert_int_equal(held(w, 0, 10), 0); /* the embedding's again */
    assert_int_equal(held(w, 0, 11), 2);
    uint8_t key[32];
    uint32_t kl = world_key(1, key);
    assert_int_equal(kvp_unpublish(w->node[0], key, kl, NULL), KVP_ERR_NOT_FOUND);
    uint8_t res[2];
    uint64_t lop;
    assert_int_equal(kvp_lookup(w->node[1], w->addr[0], 9, ks.buf, ks.len, 2, res, &lop), KVP_OK);
    const kvp_event_t *le = world_wait(w, 1, KVP_EV_LOOKUP, lop, 50 * MS);
    assert_non_null(le);
    assert_int_equal(le->n_ok, 1); /* k2 only */
    kvp_finish_request(w->node[1], 8);
    ext_last_back(w, 9, 2);
}

/* Published once for a request (the decoder's, which its FETCH names):
 * another request's transfer from the slot completes and leaves it
 * published (no SLOT_FREE); the first of that request that completes
 * unpublishes it. */
static void test_ext_publish_once_for_its_request(void **state)
{
    world_t *w = once_world(state, 9);
    wkeys_t ks;
    int32_t bs[2];
    uint32_t slots[2] = {30, 31};
    uint64_t op = ext_fetch(w, &ks, 2, NULL, slots, bs); /* request 7 */
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 300 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    assert_true(world_slot_is_block(w, 1, 30, 1));
    kvp_finish_request(w->node[1], 7);
    world_run(w, 20 * MS);
    assert_null(world_event(w, 0, KVP_EV_SLOT_FREE, 10));
    assert_int_equal(held(w, 0, 10), 2); /* request 7 only read it: still published */
    once_refetch(w, &ks, 9);
    assert_non_null(world_wait(w, 0, KVP_EV_SLOT_FREE, 10, 50 * MS)); /* its request's: back */
    assert_int_equal(held(w, 0, 10), 0);
    assert_int_equal(held(w, 0, 11), 2);
    ext_last_back(w, 9, 2);
}

/* Node 1 looks up blocks k0 and k0 + 1 at node 0 for request req and
 * fetches them into its slots 30 and 31: both verified and committed. */
static void fetch_two_ok(world_t *w, uint32_t k0, uint64_t req)
{
    wkeys_t ks;
    int32_t bs[2];
    uint32_t into[2] = {30, 31};
    uint64_t op;
    wkeys_make(&ks, k0, 2);
    world_lookup_hits(w, 1, 0, &ks, req);
    assert_int_equal(
        kvp_fetch_into(w->node[1], w->addr[0], req, ks.buf, ks.len, 2, into, 0, bs, &op), KVP_OK);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 300 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    assert_true(world_slot_is_block(w, 1, 30, k0));
    assert_true(world_slot_is_block(w, 1, 31, k0 + 1));
}

/* kvp_publish_many: a bad slot anywhere refuses the whole call (nothing
 * published); otherwise one status per key, as kvp_publish_checksum would
 * answer it (a key published already: EXISTS; a published slot: BUSY),
 * and the published ones are served with the checksums given, once when
 * asked. */
static void test_ext_publish_many(void **state)
{
    world_t *w = world_new(state, 2, tweak_ext);
    world_connect(w, 1, 0);
    world_publish(w, 0, 1, 10); /* k1 in slot 10 */
    uint8_t keys[4 * 32];
    uint32_t lens[4], off = 0;
    uint32_t ids[4] = {2, 3, 1, 4}, slots[4] = {12, 13, 14, 10};
    uint8_t sums[4 * KVP_CHECKSUM_LEN];
    for (int i = 0; i < 4; i++) {
        lens[i] = world_key(ids[i], keys + off);
        off += lens[i];
        world_block(ids[i], world_slot_ptr(w, 0, slots[i]), w->cfg[0].block_size);
        if (slots[i] != 10)
            assert_int_equal(kvp_slot_checksum(w->node[0], slots[i], sums + i * KVP_CHECKSUM_LEN),
                             KVP_OK);
    }
    uint8_t batch[3 * KVP_CHECKSUM_LEN], none[KVP_CHECKSUM_LEN] = {0};
    uint32_t bad[4] = {12, 13, 64, 10};
    memset(batch, 0, sizeof batch);
    assert_int_equal(kvp_slot_checksums(w->node[0], bad, 3, batch), KVP_ERR_INVALID);
    assert_memory_equal(batch, none, KVP_CHECKSUM_LEN); /* nothing hashed */
    assert_int_equal(kvp_slot_checksums(w->node[0], slots, 3, batch), KVP_OK); /* one call */
    assert_memory_equal(batch, sums, 2 * KVP_CHECKSUM_LEN);
    assert_memory_equal(batch + 2 * KVP_CHECKSUM_LEN, sums + 2 * KVP_CHECKSUM_LEN,
                        KVP_CHECKSUM_LEN);
    assert_int_equal(kvp_slot_checksums(w->node[0], NULL, 0, NULL), KVP_OK);
    assert_int_equal(kvp_slot_checksums(w->node[0], NULL, 1, batch), KVP_ERR_INVALID);
    int32_t st[4];
    assert_int_equal(kvp_publish_many(w->node[0], keys, lens, bad, 4, sums, 0, 0, st),
                     KVP_ERR_INVALID);
    assert_int_equal(kvp_publish_many(w->node[0], keys, lens, slots, 4, sums, 8, 0, st),
                     KVP_ERR_INVALID); /* unknown flag */
    assert_int_equal(kvp_publish_many(w->node[0], keys, lens, slots, 4, sums, 0, 7, st),
                     KVP_ERR_INVALID); /* a request to serve once for, not once */
    assert_int_equal(held_count(w, 0), 1);
    assert_int_equal(
        kvp_publish_many(w->node[0], keys, lens, slots, 4, sums, KVP_PUBLISH_ONCE, 0, st), KVP_OK);
    assert_int_equal(st[0], KVP_OK);
    assert_int_equal(st[1], KVP_OK);
    assert_int_equal(st[2], KVP_ERR_EXISTS); /* k1: published in slot 10 */
    assert_int_equal(st[3], KVP_ERR_BUSY);   /* slot 10: published */
    assert_int_equal(held(w, 0, 12), 2);
    assert_int_equal(held(w, 0, 14), 0);
    fetch_two_ok(w, 2, 7); /* k2, k3: verified with the checksums given */
    assert_non_null(world_wait(w, 0, KVP_EV_SLOT_FREE, 12, 50 * MS)); /* once: back */
    assert_non_null(world_wait(w, 0, KVP_EV_SLOT_FREE, 13, 50 * MS));
    ext_last_back(w, 7, 1);
}

/* kvp_hash_publish_many: hashed on the caller's thread into sums, then
 * published with them (a fetch verifies against them); a bad slot anywhere
 * or no sums buffer: refused, nothing hashed or published. */
static void test_ext_hash_publish_many(void **state)
{
    world_t *w = world_new(state, 2, tweak_ext);
    world_connect(w, 1, 0);
    uint8_t keys[2 * 32], sums[2 * KVP_CHECKSUM_LEN], want[2 * KVP_CHECKSUM_LEN];
    uint8_t none[2 * KVP_CHECKSUM_LEN] = {0};
    uint32_t lens[2], off = 0, slots[2] = {20, 21}, bad[2] = {20, 64};
    for (int i = 0; i < 2; i++) {
        lens[i] = world_key((uint32_t)(5 + i), keys + off);
        off += lens[i];
        world_block((uint32_t)(5 + i), world_slot_ptr(w, 0, slots[i]), w->cfg[0].block_size);
    }
    assert_int_equal(kvp_slot_checksums(w->node[0], slots, 2, want), KVP_OK);
    int32_t st[2] = {-99, -99};
    memset(sums, 0, sizeof sums);
    assert_int_equal(kvp_hash_publish_many(w->node[0], keys, lens, bad, 2, sums, 0, 0, st),
                     KVP_ERR_INVALID);
    assert_int_equal(kvp_hash_publish_many(w->node[0], keys, lens, slots, 2, NULL, 0, 0, st),
                     KVP_ERR_INVALID);
    assert_int_equal(kvp_hash_publish_many(w->node[0], keys, lens, slots, 2, sums, 8, 0, st),
                     KVP_ERR_INVALID);
    assert_memory_equal(sums, none, sizeof sums); /* nothing hashed */
    assert_int_equal(held_count(w, 0), 0);        /* nor published */
    assert_int_equal(st[0], -99);
    assert_int_equal(
        kvp_hash_publish_many(w->node[0], keys, lens, slots, 2, sums, KVP_PUBLISH_ONCE, 7, st),
        KVP_OK);
    assert_int_equal(st[0], KVP_OK);
    assert_int_equal(st[1], KVP_OK);
    assert_memory_equal(sums, want, sizeof sums);
    assert_int_equal(held(w, 0, 20), 2);
    fetch_two_ok(w, 5, 7); /* k5, k6: verified with the sums the call took */
    assert_non_null(world_wait(w, 0, KVP_EV_SLOT_FREE, 20, 50 * MS)); /* once, for 7: back */
    assert_non_null(world_wait(w, 0, KVP_EV_SLOT_FREE, 21, 50 * MS));
    kvp_finish_request(w->node[1], 7);
    world_run(w, 20 * MS);
    assert_int_equal(held_count(w, 0), 0);
    world_fini(w, false);
    free(w);
}

/* The source is killed while its WRITE is wedged on a path that cannot be
 * fenced: the load fails at once, its slots are held (KVP_ERR_BUSY,
 * n_held), the late bytes land only in them, and the hold cap hands them
 * back with KVP_EV_SLOTS_RELEASED (status TIMEOUT: no proof). */
static void test_ext_source_killed_deferred_to_cap(void **state)
{
    world_t *w = ext_world(state, tweak_ext_unfenceable);
    uint32_t slots[2] = {12, 13};
    int32_t bs[2];
    uint64_t op;
    const kvp_event_t *e = ext_fetch_source_killed(w, 600 * MS, slots, bs, &op);
    assert_int_equal(e->status, KVP_ERR_UNREACHABLE);
    assert_int_equal(e->n_held, 2);
    assert_int_equal(bs[0], KVP_ERR_BUSY);
    assert_int_equal(bs[1], KVP_ERR_BUSY);
    assert_int_equal(held(w, 1, 12), 1);
    assert_int_equal(held(w, 1, 13), 1);
    world_run(w, 700 * MS); /* the late copy lands: in held slots only */
    assert_int_equal(world_violations(w), 0);
    assert_null(world_event(w, 1, KVP_EV_SLOTS_RELEASED, op));
    uint64_t cap = (uint64_t)w->cfg[1].hold_cap_ms * MS;
    const kvp_event_t *r = world_wait(w, 1, KVP_EV_SLOTS_RELEASED, op, cap + 500 * MS);
    assert_non_null(r);
    assert_int_equal(r->status, KVP_ERR_TIMEOUT);
    assert_int_equal(r->n_keys, 2);
    assert_int_equal(held_count(w, 1), 0);
    world_fini(w, false);
    free(w);
}

/* A cancelled load: failed at once, slots held until the source's
 * ABORT_ACK proves its transfer stopped, then released (status OK). */
static void test_ext_cancel_deferred_to_abort_ack(void **state)
{
    world_t *w = ext_world(state, tweak_ext);
    wkeys_t ks;
    kvp_fake_script_t sc = kvp_fake_script_complete(150 * MS);
    uint32_t slots[2] = {14, 15};
    int32_t bs[2];
    uint64_t op = ext_fetch(w, &ks, 2, &sc, slots, bs);
    world_run(w, 10 * MS);
    assert_int_equal(kvp_cancel(w->node[1], op), KVP_OK);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 5 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_CANCELED);
    assert_int_equal(e->n_held, 2);
    assert_int_equal(bs[0], KVP_ERR_BUSY);
    assert_int_equal(held(w, 1, 14), 1);
    const kvp_event_t *r = world_wait(w, 1, KVP_EV_SLOTS_RELEASED, op, 400 * MS);
    assert_non_null(r);
    assert_int_equal(r->status, KVP_OK);
    assert_int_equal(r->n_keys, 2);
    assert_int_equal(held_count(w, 1), 0);
    kvp_stats_t st = world_stats(w, 1);
    assert_int_equal(st.released_hold_cap, 0);
    world_fini(w, false);
    free(w);
}

/* The source's embedding rewrites a chunk it published (its contract
 * broken, or a stray write): the consumer verifies the checksum taken at
 * publish, fails that block (its slot the embedding's again at once, not
 * held) and keeps the other. No corrupt block is reported OK. */
static void test_ext_rewritten_published_chunk_fails_verify(void **state)
{
    world_t *w = ext_world(state, tweak_ext);
    wkeys_t ks;
    wkeys_make(&ks, 1, 2);
    world_lookup_hits(w, 1, 0, &ks, 7);
    world_slot_ptr(w, 0, 11)[100] ^= 0x5a; /* k2's chunk, after publish */
    uint32_t slots[2] = {16, 17};
    int32_t bs[2];
    uint64_t op;
    assert_int_equal(kvp_fetch_into(w->node[1], w->addr[0], 7, ks.buf, ks.len, 2, slots, 0, bs,
                                    &op),
                     KVP_OK);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 200 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_CHECKSUM);
    assert_int_equal(e->n_ok, 1);
    assert_int_equal(e->n_held, 0);
    assert_int_equal(bs[0], KVP_OK);
    assert_int_equal(bs[1], KVP_ERR_CHECKSUM);
    assert_true(world_slot_is_block(w, 1, 16, 1));
    assert_int_equal(held_count(w, 1), 0);
    assert_int_equal(world_stats(w, 1).checksum_mismatches, 1);
    world_fini(w, false);
    free(w);
}

/* The attacker's late write on an AM path: the source is killed with its
 * WRITE wedged; our handler refuses the load's slots (AM_REFUSE), so they
 * are the embedding's at once (not BUSY); the embedding reuses them; the
 * late copy arrives and is dropped and counted: the embedding's bytes are
 * unchanged and the landing checker saw nothing. */
static void test_ext_am_late_write_dropped(void **state)
{
    world_t *w = ext_world(state, tweak_ext_am);
    uint32_t slots[2] = {18, 19};
    int32_t bs[2];
    uint64_t op;
    const kvp_event_t *e = ext_fetch_source_killed(w, 300 * MS, slots, bs, &op);
    assert_true(e->status != KVP_OK);
    assert_int_equal(e->n_held, 0);
    assert_true(bs[0] != KVP_OK && bs[0] != KVP_ERR_BUSY);
    assert_int_equal(held_count(w, 1), 0);
    memset(world_slot_ptr(w, 1, 18), 0xee, BS); /* the embedding reuses them at once */
    memset(world_slot_ptr(w, 1, 19), 0xee, BS);
    world_run(w, 600 * MS); /* the late copy comes */
    for (uint32_t i = 0; i < BS; i++)
        if (world_slot_ptr(w, 1, 18)[i] != 0xee || world_slot_ptr(w, 1, 19)[i] != 0xee)
            fail_msg("byte %u of a slot the embedding got back was written", i);
    assert_true(world_stats(w, 1).late_bytes_dropped >= 2 * BS);
    assert_int_equal(world_stats(w, 1).released_am_refuse, 2);
    assert_int_equal(world_event_count(w, 1, KVP_EV_SLOTS_RELEASED, op), 0);
    world_fini(w, false);
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ext_fetch_into_lands),
        cmocka_unit_test(test_ext_fetch_into_refusals),
        cmocka_unit_test(test_ext_unpublish_busy_then_free),
        cmocka_unit_test(test_ext_publish_once_back_at_its_fetch),
        cmocka_unit_test(test_ext_publish_once_for_its_request),
        cmocka_unit_test(test_ext_publish_many),
        cmocka_unit_test(test_ext_hash_publish_many),
        cmocka_unit_test(test_ext_source_killed_deferred_to_cap),
        cmocka_unit_test(test_ext_cancel_deferred_to_abort_ack),
        cmocka_unit_test(test_ext_rewritten_published_chunk_fails_verify),
        cmocka_unit_test(test_ext_am_late_write_dropped),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
