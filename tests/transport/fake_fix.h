/* fake_fix.h -- fixture shared by the fake transport tests: a manual clock,
 * one fabric and up to four nodes, each a store (own region) plus a fake
 * transport registered on that region. Header-only, static inline. */
#ifndef KVP_TEST_FAKE_FIX_H
#define KVP_TEST_FAKE_FIX_H

#include "testutil.h"

#include "store/store.h"
#include "transport/fake.h"

#define BS 4096u
#define NB 8u
#define MS KVP_NSEC_PER_MSEC

typedef struct node {
    kvp_store_t *s;
    kvp_xport_t *x;
} node_t;

typedef struct fix {
    kvp_manual_clock_t clk;
    kvp_fake_fabric_t *fab;
    node_t n[4];
    int nn;
    kvp_test_logcap_t cap;
} fix_t;

static inline void node_open(fix_t *f, int i, kvp_data_path_t path, bool with_store)
{
    node_t *n = &f->n[i];
    kvp_store_config_t sc = {.num_blocks = NB,
                             .block_size = BS,
                             .clock = &f->clk.clock,
                             .suspect_period_ns = 1000 * MS,
                             .log_prefix = "store"};
    assert_int_equal(kvp_store_create(&sc, &n->s), KVP_OK);
    kvp_fake_config_t fc = {.fabric = f->fab,
                            .store = with_store ? n->s : NULL,
                            .log_prefix = "fake",
                            .default_path = path,
                            .default_delay_ns = 1 * MS,
                            .rng_seed = 42};
    assert_int_equal(kvp_fake_create(&fc, &n->x), KVP_OK);
    kvp_layout_t lay = {NB, BS};
    void *base = NULL;
    assert_int_equal(n->x->ops->register_region(n->x, kvp_store_base(n->s),
                                                kvp_store_region_len(n->s), &lay, &base),
                     KVP_OK);
    assert_ptr_equal(base, kvp_store_base(n->s));
    if (i >= f->nn)
        f->nn = i + 1;
}

static inline void fix_open(fix_t *f, int nodes, kvp_data_path_t path)
{
    memset(f, 0, sizeof(*f));
    kvp_manual_clock_init(&f->clk, 1000);
    kvp_test_logcap_start(&f->cap);
    assert_int_equal(kvp_fake_fabric_create(&f->clk.clock, &f->fab), KVP_OK);
    for (int i = 0; i < nodes; i++)
        node_open(f, i, path, true);
}

/* Unpin every READY slot (tests leave pins held on purpose sometimes). */
static inline bool unpin_all_cb(void *arg, uint32_t slot, const kvp_slot_info_t *info)
{
    kvp_store_t *s = arg;
    kvp_slot_ref_t ref = {slot, info->gen};
    for (uint32_t p = 0; p < info->pins; p++)
        assert_int_equal(kvp_store_unpin(s, ref), KVP_OK);
    return true;
}

static inline void fix_close(fix_t *f)
{
    for (int i = 0; i < f->nn; i++)
        if (f->n[i].x)
            assert_int_equal(f->n[i].x->ops->close(f->n[i].x, true), KVP_OK);
    assert_int_equal(kvp_fake_fabric_destroy(f->fab), KVP_OK);
    for (int i = 0; i < f->nn; i++) {
        if (!f->n[i].s)
            continue;
        kvp_store_iterate(f->n[i].s, unpin_all_cb, f->n[i].s);
        char why[256];
        assert_int_equal(kvp_store_check(f->n[i].s, why, sizeof(why)), KVP_OK);
        kvp_store_destroy(f->n[i].s);
    }
    kvp_test_logcap_stop();
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* peer handle of `to` in `from` */
static inline kvp_xpeer_id_t connect_to(fix_t *f, int from, int to)
{
    const void *blob;
    size_t len;
    kvp_xport_t *dst = f->n[to].x;
    assert_int_equal(dst->ops->local_blob(dst, &blob, &len), KVP_OK);
    kvp_layout_t lay = {NB, BS};
    kvp_xpeer_id_t id = 0;
    assert_int_equal(f->n[from].x->ops->add_peer(f->n[from].x, blob, len, &lay, &id), KVP_OK);
    assert_true(id != 0);
    return id;
}

/* A READY source block filled with `fill`, pinned once (the transfer's pin). */
static inline kvp_slot_ref_t src_block(fix_t *f, int i, const char *key, uint8_t fill)
{
    kvp_store_t *s = f->n[i].s;
    kvp_slot_ref_t ref, ref2;
    void *p;
    assert_int_equal(kvp_store_reserve(s, key, strlen(key), 0, &ref, &p), KVP_OK);
    memset(p, fill, BS);
    assert_int_equal(kvp_store_commit(s, ref), KVP_OK);
    assert_int_equal(kvp_store_lookup(s, key, strlen(key), &ref2, NULL, NULL), KVP_OK);
    assert_int_equal(ref2.slot, ref.slot);
    return ref;
}

/* A FILLING destination slot, zeroed. */
static inline kvp_slot_ref_t dst_block(fix_t *f, int i, const char *key)
{
    kvp_slot_ref_t ref;
    void *p;
    assert_int_equal(
        kvp_store_reserve(f->n[i].s, key, strlen(key), KVP_STORE_RESERVE_REMOTE, &ref, &p), KVP_OK);
    memset(p, 0, BS);
    return ref;
}

static inline kvp_xfer_block_t blk(kvp_slot_ref_t src, kvp_slot_ref_t dst)
{
    kvp_xfer_block_t b = {src.slot, src.gen, dst.slot, dst.gen};
    return b;
}

/* Does every byte of node i's slot equal v? */
static inline bool slot_is(fix_t *f, int i, uint32_t slot, uint8_t v)
{
    const uint8_t *p = kvp_store_slot_ptr(f->n[i].s, slot);
    for (uint32_t k = 0; k < BS; k++)
        if (p[k] != v)
            return false;
    return true;
}

static inline void advance(fix_t *f, uint64_t ns)
{
    kvp_manual_clock_advance(&f->clk, ns);
    kvp_fake_fabric_progress(f->fab);
}

static inline size_t poll_n(fix_t *f, int i, kvp_xpeer_id_t peer, kvp_xfer_result_t *out,
                            size_t cap)
{
    size_t n = 99;
    assert_int_equal(f->n[i].x->ops->poll(f->n[i].x, peer, out, cap, &n), KVP_OK);
    return n;
}

static inline size_t violations(fix_t *f)
{
    return kvp_fake_violations(f->fab, NULL);
}

static inline kvp_fake_violation_kind_t violation_kind(fix_t *f, size_t i)
{
    const kvp_fake_violation_t *v;
    assert_true(kvp_fake_violations(f->fab, &v) > i);
    return v[i].kind;
}

#endif
