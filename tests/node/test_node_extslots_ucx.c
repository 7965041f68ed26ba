/*
 * test_node_extslots_ucx.c -- issue 29, external slots over the real path:
 * two nodes in this process on 127.0.0.1 (TCP control, UCX data), each
 * region memory this test mapped (UCX registers it as caller memory). The
 * consumer's blocks land byte-exact in the slots it named with no copy
 * counted (the staging pair beside it counts one copy per byte on each
 * side); an unpublish during a lookup's pin answers BUSY, then
 * KVP_EV_SLOT_FREE; a removed or destroyed source leaves the load's slots
 * either reusable at once or held until KVP_EV_SLOTS_RELEASED, never both,
 * never lost.
 */
#include "testutil.h"
#include "realnode.h"

#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#define NB 16u
#define BS (64u * 1024u)

typedef struct ext_node {
    kvp_node_t *n;
    uint8_t *region;
} ext_node_t;

static uint32_t scaled(uint32_t ms)
{
    return (uint32_t)(ms * kvp_test_time_scale());
}

/* A node on 127.0.0.1; external: on memory this test mapped. */
static void ext_start(ext_node_t *e, bool external, uint32_t hold_cap_ms)
{
    e->region = NULL;
    if (external) {
        e->region = rn_region_map((size_t)NB * BS, NULL);
        assert_non_null(e->region);
    }
    e->n = rn_node_start(e->region, NB, BS, scaled(2000), hold_cap_ms);
    assert_non_null(e->n);
}

static void ext_stop(ext_node_t *e)
{
    if (e->n != NULL)
        kvp_node_destroy(e->n);
    e->n = NULL;
    if (e->region != NULL) /* the embedding frees its memory after the node */
        munmap(e->region, (size_t)NB * BS);
    e->region = NULL;
}

static void fill(uint32_t k, uint8_t *p)
{
    rn_fill(k, p, BS);
}

static void keys_make(uint32_t k0, uint32_t n, uint8_t *buf, uint32_t *lens)
{
    rn_keys_make("ext", k0, n, buf, lens);
}

static void connect_pair(ext_node_t *src, ext_node_t *dst)
{
    const char *peer = kvp_node_peer_id(src->n);
    assert_int_equal(kvp_peer_add(dst->n, peer), KVP_OK);
    assert_int_equal(kvp_peer_wait(dst->n, peer, (int32_t)scaled(10000)), KVP_OK);
}

static void lookup_all(ext_node_t *dst, ext_node_t *src, uint64_t req, uint8_t *keys,
                       uint32_t *lens, uint32_t n)
{
    uint8_t res[8];
    uint64_t op;
    kvp_event_t ev;
    assert_int_equal(kvp_lookup(dst->n, kvp_node_peer_id(src->n), req, keys, lens, n, res, &op),
                     KVP_OK);
    assert_true(rn_wait_event(dst->n, KVP_EV_LOOKUP, op, scaled(5000), &ev));
    assert_int_equal(ev.n_ok, n);
}

/* Zero copy: the blocks land in the named slots, byte-exact; the copy
 * counters stay 0 on both sides. The staging pair (normal mode: kvp_put on
 * the source, kvp_get + copy on the consumer) counts 1 byte per byte. */
static void test_ext_ucx_fetch_into_zero_copy(void **state)
{
    (void)state;
    ext_node_t src, dst, ssrc, sdst;
    ext_start(&src, true, 0);
    ext_start(&dst, true, 0);
    uint8_t keys[64], want[BS];
    uint32_t lens[4], slots[4] = {9, 1, 14, 7};
    keys_make(0, 4, keys, lens);
    for (uint32_t i = 0; i < 4; i++) {
        fill(i, src.region + (size_t)(2 + i) * BS);
        assert_int_equal(kvp_publish(src.n, keys + 8 * i, lens[i], 2 + i), KVP_OK);
    }
    connect_pair(&src, &dst);
    lookup_all(&dst, &src, 5, keys, lens, 4);
    int32_t bs[4] = {99, 99, 99, 99};
    uint64_t op;
    kvp_event_t ev;
    assert_int_equal(kvp_fetch_into(dst.n, kvp_node_peer_id(src.n), 5, keys, lens, 4, slots, 0,
                                    bs, &op),
                     KVP_OK);
    assert_true(rn_wait_event(dst.n, KVP_EV_LOAD, op, scaled(10000), &ev));
    assert_int_equal(ev.status, KVP_OK);
    assert_int_equal(ev.n_ok, 4);
    assert_int_equal(ev.n_held, 0);
    for (uint32_t i = 0; i < 4; i++) {
        assert_int_equal(bs[i], KVP_OK);
        fill(i, want);
        assert_memory_equal(dst.region + (size_t)slots[i] * BS, want, BS);
    }
    uint8_t held[NB];
    assert_int_equal(kvp_slots_held(dst.n, 0, NB, held), KVP_OK);
    for (uint32_t i = 0; i < NB; i++)
        assert_int_equal(held[i], 0);
    kvp_stats_t s0, s1;
    assert_int_equal(kvp_node_stats(src.n, &s0), KVP_OK);
    assert_int_equal(kvp_node_stats(dst.n, &s1), KVP_OK);
    assert_int_equal(s1.bytes_in, 4ull * BS);
    assert_int_equal(s0.bytes_copied_in + s0.bytes_copied_out, 0);
    assert_int_equal(s1.bytes_copied_in + s1.bytes_copied_out, 0);
    /* issue 29 item 4: same host, the source wrote them with direct-cma */
    assert_int_equal(s0.cma_bytes_written, 4ull * BS);
    assert_int_equal(s0.cma_writes_failed, 0);
    kvp_peer_info_t pi;
    uint32_t np = 0;
    assert_int_equal(kvp_node_peers(dst.n, &pi, 1, &np), KVP_OK);
    printf("external slots: %llu B fetched, copied in %llu B / out %llu B (data path %s)\n",
           (unsigned long long)s1.bytes_in, (unsigned long long)s0.bytes_copied_in,
           (unsigned long long)s1.bytes_copied_out, np ? pi.data_path : "?");
    kvp_finish_request(dst.n, 5);
    ext_stop(&dst);
    ext_stop(&src);

    /* The staging pair: the same four blocks through the node's own store. */
    ext_start(&ssrc, false, 0);
    ext_start(&sdst, false, 0);
    for (uint32_t i = 0; i < 4; i++) {
        fill(i, want);
        assert_int_equal(kvp_put(ssrc.n, keys + 8 * i, lens[i], want, BS, 0), KVP_OK);
    }
    connect_pair(&ssrc, &sdst);
    lookup_all(&sdst, &ssrc, 6, keys, lens, 4);
    assert_int_equal(kvp_fetch(sdst.n, kvp_node_peer_id(ssrc.n), 6, keys, lens, 4, 0, NULL, &op),
                     KVP_OK);
    assert_true(rn_wait_event(sdst.n, KVP_EV_LOAD, op, scaled(10000), &ev));
    assert_int_equal(ev.status, KVP_OK);
    uint8_t *chunk = malloc(BS);
    for (uint32_t i = 0; i < 4; i++) { /* the embedding's copy into its own chunk */
        kvp_block_t b;
        assert_int_equal(kvp_get(sdst.n, keys + 8 * i, lens[i], &b), KVP_OK);
        memcpy(chunk, b.data, BS);
        assert_int_equal(kvp_release(sdst.n, &b), KVP_OK);
    }
    free(chunk);
    assert_int_equal(kvp_node_stats(ssrc.n, &s0), KVP_OK);
    assert_int_equal(kvp_node_stats(sdst.n, &s1), KVP_OK);
    assert_int_equal(s0.bytes_copied_in, s1.bytes_in);
    assert_int_equal(s1.bytes_copied_out, s1.bytes_in);
    printf("staging: %llu B fetched, copied in %llu B / out %llu B: %.2f / %.2f per fetched "
           "byte (external slots: 0 / 0)\n",
           (unsigned long long)s1.bytes_in, (unsigned long long)s0.bytes_copied_in,
           (unsigned long long)s1.bytes_copied_out,
           (double)s0.bytes_copied_in / (double)s1.bytes_in,
           (double)s1.bytes_copied_out / (double)s1.bytes_in);
    kvp_finish_request(sdst.n, 6);
    ext_stop(&sdst);
    ext_stop(&ssrc);
}

/* Unpublish while a lookup's pin holds the slot: BUSY, no new hit; the
 * fetch of the pinned supply still lands byte-exact; KVP_EV_SLOT_FREE names
 * the slot once the transfer is terminal. */
static void test_ext_ucx_unpublish_busy_then_free(void **state)
{
    (void)state;
    ext_node_t src, dst;
    ext_start(&src, true, 0);
    ext_start(&dst, true, 0);
    uint8_t keys[16], want[BS];
    uint32_t lens[1], slot = 0, dslot[1] = {3};
    keys_make(40, 1, keys, lens);
    fill(40, src.region + 6 * (size_t)BS);
    assert_int_equal(kvp_publish(src.n, keys, lens[0], 6), KVP_OK);
    connect_pair(&src, &dst);
    lookup_all(&dst, &src, 9, keys, lens, 1);
    assert_int_equal(kvp_unpublish(src.n, keys, lens[0], &slot), KVP_ERR_BUSY);
    assert_int_equal(slot, 6);
    uint8_t h = 9, res[1];
    assert_int_equal(kvp_slots_held(src.n, 6, 1, &h), KVP_OK);
    assert_int_equal(h, 2);
    uint64_t op;
    kvp_event_t ev;
    assert_int_equal(kvp_lookup(dst.n, kvp_node_peer_id(src.n), 10, keys, lens, 1, res, &op),
                     KVP_OK);
    assert_true(rn_wait_event(dst.n, KVP_EV_LOOKUP, op, scaled(5000), &ev));
    assert_int_equal(ev.n_ok, 0);
    int32_t bs[1];
    assert_int_equal(kvp_fetch_into(dst.n, kvp_node_peer_id(src.n), 9, keys, lens, 1, dslot, 0,
                                    bs, &op),
                     KVP_OK);
    assert_true(rn_wait_event(dst.n, KVP_EV_LOAD, op, scaled(10000), &ev));
    assert_int_equal(ev.status, KVP_OK);
    fill(40, want);
    assert_memory_equal(dst.region + 3 * (size_t)BS, want, BS);
    assert_true(rn_wait_event(src.n, KVP_EV_SLOT_FREE, 6, scaled(5000), &ev));
    assert_int_equal(kvp_slots_held(src.n, 6, 1, &h), KVP_OK);
    assert_int_equal(h, 0);
    kvp_finish_request(dst.n, 9);
    kvp_finish_request(dst.n, 10);
    ext_stop(&dst);
    ext_stop(&src);
}

/* A load waiting on the source (WAIT_FOR_SUPPLY) when the source goes away:
 * removed by the consumer, or destroyed. The LOAD fails; each slot is
 * either the embedding's at once or held (KVP_ERR_BUSY, n_held) until one
 * KVP_EV_SLOTS_RELEASED (a proof, or the hold cap); nothing stays held. */
static void source_gone(bool destroy)
{
    ext_node_t src, dst;
    ext_start(&src, true, 0);
    ext_start(&dst, true, scaled(800));
    uint8_t keys[32];
    uint32_t lens[3], slots[3] = {0, 15, 8};
    keys_make(70, 3, keys, lens);
    connect_pair(&src, &dst);
    int32_t bs[3];
    uint64_t op;
    kvp_event_t ev;
    assert_int_equal(kvp_fetch_into(dst.n, kvp_node_peer_id(src.n), 11, keys, lens, 3, slots,
                                    KVP_FETCH_FLAG_WAIT_FOR_SUPPLY, bs, &op),
                     KVP_OK);
    uint8_t held[NB];
    assert_int_equal(kvp_slots_held(dst.n, 0, NB, held), KVP_OK);
    assert_int_equal(held[0] + held[15] + held[8], 3);
    uint64_t t_wait = rn_real_ms() + 200;
    while (rn_real_ms() < t_wait) /* the FETCH parks on the source */
        poll(NULL, 0, 10);
    if (destroy) {
        kvp_node_destroy(src.n);
        src.n = NULL;
    } else {
        assert_int_equal(kvp_peer_remove(dst.n, kvp_node_peer_id(src.n)), KVP_OK);
    }
    assert_true(rn_wait_event(dst.n, KVP_EV_LOAD, op, scaled(5000), &ev));
    assert_true(ev.status != KVP_OK);
    uint32_t busy = 0;
    assert_int_equal(kvp_slots_held(dst.n, 0, NB, held), KVP_OK);
    for (uint32_t i = 0; i < 3; i++) {
        busy += bs[i] == KVP_ERR_BUSY;
        assert_int_equal(held[slots[i]], bs[i] == KVP_ERR_BUSY ? 1 : 0);
    }
    assert_int_equal(busy, ev.n_held);
    printf("source %s: load %s, %u slots held past the outcome\n",
           destroy ? "destroyed" : "removed", kvp_status_str((kvp_status_t)ev.status), busy);
    if (busy > 0) {
        assert_true(rn_wait_event(dst.n, KVP_EV_SLOTS_RELEASED, op, scaled(5000), &ev));
        assert_int_equal(ev.n_keys, busy);
        printf("  released: %s\n", ev.status == KVP_OK ? "by proof" : "by the hold cap");
    }
    assert_int_equal(kvp_slots_held(dst.n, 0, NB, held), KVP_OK);
    for (uint32_t i = 0; i < NB; i++)
        assert_int_equal(held[i], 0);
    ext_stop(&dst);
    ext_stop(&src);
}

static void test_ext_ucx_source_removed(void **state)
{
    (void)state;
    source_gone(false);
}

static void test_ext_ucx_source_destroyed(void **state)
{
    (void)state;
    source_gone(true);
}

/* Creation: UCX needs the embedding's region. */
static void test_ext_ucx_needs_region(void **state)
{
    (void)state;
    kvp_config_t c;
    kvp_node_t *n = NULL;
    kvp_config_init(&c);
    c.num_blocks = NB;
    c.block_size = BS;
    c.external_slots = 1;
    assert_int_equal(kvp_node_create(&c, &n), KVP_ERR_INVALID);
    assert_non_null(strstr(kvp_last_error(), "external_slots"));
    c.external_slots = 2;
    assert_int_equal(kvp_node_create(&c, &n), KVP_ERR_INVALID);
    assert_null(n);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ext_ucx_needs_region),
        cmocka_unit_test(test_ext_ucx_fetch_into_zero_copy),
        cmocka_unit_test(test_ext_ucx_unpublish_busy_then_free),
        cmocka_unit_test(test_ext_ucx_source_removed),
        cmocka_unit_test(test_ext_ucx_source_destroyed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
