/*
 * test_session_close.c -- a session alone, with no node (issue 20): two
 * session environments (consumer A, source B) on the fake world -- fake
 * control network and ctl links, fake data transport with its landing
 * checker, manual clock -- wired by this file the way the node wires them
 * (ctl callbacks in, kvp_session_up_t upcalls out).
 *
 * A load is in flight (the source's transfer wedged) when the source's
 * process dies; the teardown's close result (SPEC §7) must say:
 *   fenceable path    consumer: the load failed, its slots released by the
 *                     fence (KVP_PROOF_FENCE), nothing quarantined;
 *   unfenceable path  consumer: the load failed, its slots QUARANTINED on
 *                     env->quarantined, nothing released;
 *   either            source: the running transfer retained with its pins.
 * Mutations tried: teardown without the fence (fenceable case fails: slots
 * quarantined, not fenced), fence taken as proof on the unfenceable path
 * (unfenceable case fails: slots fenced), source unpinning at close
 * (pins_retained / store pins differ).
 */
#include "testutil.h"
#include "session/session_int.h"
#include "transport/fake.h"

#include <stdio.h>
#include <string.h>

#define MS KVP_NSEC_PER_MSEC
#define NBLK 4u
#define EV_MAX 64

typedef struct end {
    const char *addr;
    kvp_config_t cfg;
    kvp_stats_t st;
    kvp_ratelimit_t rl_proto;
    kvp_store_t *store;
    kvp_xport_t *xport;
    const void *blob;
    size_t blob_len;
    kvp_ctl_t *ctl;
    kvp_session_env_t env;
    kvp_session_t *sess; /* the one session of this end, or NULL */
    bool active, flush;  /* upcalls received */
    kvp_event_t ev[EV_MAX];
    int nev, downs;
    bool closed_fault;
    kvp_session_close_t closed;
} end_t;

typedef struct sworld {
    kvp_manual_clock_t mc;
    kvp_loop_t *loop;
    kvp_fake_net_t *net;
    kvp_fake_fabric_t *fab;
    end_t a, b;
} sworld_t;

/* ---------------------------------------------------- upcalls (the node's part) */

static void up_emit(void *arg, const kvp_event_t *ev)
{
    end_t *e = arg;
    assert_true(e->nev < EV_MAX);
    e->ev[e->nev++] = *ev;
}

static void up_mark_active(void *arg, kvp_session_t *s)
{
    end_t *e = arg;
    assert_ptr_equal(s, e->sess);
    e->active = true;
}

static void up_schedule(void *arg, kvp_session_t *s)
{
    end_t *e = arg;
    assert_ptr_equal(s, e->sess);
    e->flush = true;
}

static const kvp_session_up_t test_up = {up_emit, up_mark_active, up_schedule};

/* ------------------------------------------------------------ ctl callbacks */

static kvp_status_t on_ready(void *arg, kvp_link_t *link, const kvp_msg_hello_t *peer,
                             const void *blob, size_t blob_len)
{
    end_t *e = arg;
    kvp_session_t *s;
    kvp_status_t st = kvp__session_create(&e->env, link, peer, blob, blob_len, &s);
    if (st != KVP_OK)
        return st;
    kvp_link_set_user(link, s);
    e->sess = s;
    return KVP_OK;
}

static void on_frame(void *arg, kvp_link_t *link, const kvp_msg_t *msg)
{
    (void)arg;
    kvp_session_t *s = kvp_link_user(link);
    if (s != NULL)
        kvp__session_on_frame(s, msg);
}

static void on_down(void *arg, kvp_link_t *link, kvp_down_reason_t reason, uint16_t bye,
                    bool fault)
{
    end_t *e = arg;
    kvp_session_t *s = kvp_link_user(link);
    (void)reason;
    (void)bye;
    if (s == NULL)
        return;
    kvp__session_link_down(s); /* the node's own link-down entry */
    kvp__session_teardown(s, fault, "link down", &e->closed);
    e->sess = NULL;
    e->active = e->flush = false;
    e->downs++;
    e->closed_fault = fault;
}

/* --------------------------------------------------------------- world */

static void end_init(sworld_t *w, end_t *e, const char *addr, kvp_data_path_t path)
{
    memset(e, 0, sizeof(*e));
    e->addr = addr;
    kvp_config_init(&e->cfg);
    e->cfg.num_blocks = 32;
    e->cfg.block_size = 4096;
    e->cfg.load_timeout_ms = 1000;
    e->cfg.lookup_pending_ms = 200;
    e->cfg.dead_after_ms = 200;
    e->cfg.supply_pin_ms = 300;
    e->cfg.abort_resend_ms = 100;
    e->cfg.abort_ack_timeout_ms = 500;
    e->cfg.parked_demand_ms = 400;
    e->cfg.hold_cap_ms = 2000;
    e->cfg.max_quarantined = 8;
    kvp_ratelimit_init(&e->rl_proto, KVP_NSEC_PER_SEC, 5);

    kvp_store_config_t sc = {0};
    sc.num_blocks = e->cfg.num_blocks;
    sc.block_size = e->cfg.block_size;
    sc.max_pins = 1024;
    sc.suspect_period_ns = 10ull * e->cfg.hold_cap_ms * MS;
    sc.clock = &w->mc.clock;
    sc.log_prefix = addr;
    assert_int_equal(kvp_store_create(&sc, &e->store), KVP_OK);
    kvp_fake_config_t fc = {0};
    fc.fabric = w->fab;
    fc.store = e->store;
    fc.log_prefix = addr;
    fc.default_path = path;
    fc.default_delay_ns = 1 * MS;
    assert_int_equal(kvp_fake_create(&fc, &e->xport), KVP_OK);
    kvp_layout_t layout = {e->cfg.num_blocks, e->cfg.block_size};
    void *base;
    assert_int_equal(e->xport->ops->register_region(e->xport, kvp_store_base(e->store),
                                                    kvp_store_region_len(e->store), &layout,
                                                    &base),
                     KVP_OK);
    assert_int_equal(e->xport->ops->local_blob(e->xport, &e->blob, &e->blob_len), KVP_OK);

    kvp__session_env_init(&e->env);
    e->env.cfg = &e->cfg;
    e->env.name = addr;
    e->env.clock = &w->mc.clock;
    e->env.loop = w->loop;
    e->env.store = e->store;
    e->env.xport = e->xport;
    e->env.st = &e->st;
    e->env.rl_proto = &e->rl_proto;
    e->env.up = &test_up;
    e->env.up_arg = e;

    kvp_ctl_config_t cc = {0};
    cc.peer_id = addr;
    cc.listen_addr = addr;
    cc.num_blocks = e->cfg.num_blocks;
    cc.block_size = e->cfg.block_size;
    cc.fingerprint = 0x1234;
    cc.hash_seed = e->cfg.hash_seed;
    cc.blob = e->blob;
    cc.blob_len = e->blob_len;
    cc.heartbeat_ns = 50 * MS;
    cc.dead_after_ns = 200 * MS;
    cc.loop = w->loop;
    cc.fake_net = w->net;
    cc.cb = (kvp_ctl_callbacks_t){on_ready, on_frame, on_down, NULL, e};
    cc.log_prefix = addr;
    assert_int_equal(kvp_ctl_create(&cc, &e->ctl), KVP_OK);
}

/* What the node's poll round does for a session: completions of an active
 * session, then scheduled lookups and queued fetches. */
static void end_round(end_t *e)
{
    if (e->sess == NULL)
        return;
    if (e->active) {
        kvp_xfer_result_t res[16];
        size_t got = 0;
        e->xport->ops->poll(e->xport, e->sess->xpeer, res, 16, &got);
        for (size_t i = 0; i < got; i++)
            kvp__server_on_xfer_done(e->sess, res[i].id, res[i].status);
        e->active = e->sess->xfers_inflight > 0;
    }
    if (e->flush) {
        e->flush = false;
        kvp__client_flush_lookups(e->sess);
        kvp__client_start_queued(e->sess);
    }
}

static void run(sworld_t *w, uint64_t ns)
{
    uint64_t end = kvp_clock_now(&w->mc.clock) + ns;
    while (kvp_clock_now(&w->mc.clock) < end) {
        kvp_manual_clock_advance(&w->mc, 1 * MS);
        for (int pass = 0; pass < 2; pass++) {
            kvp_fake_net_deliver(w->net);
            kvp_fake_fabric_progress(w->fab);
            kvp_loop_run_once(w->loop, 0);
            end_round(&w->a);
            end_round(&w->b);
        }
    }
}

static void world_up(sworld_t *w, kvp_data_path_t consumer_path)
{
    memset(w, 0, sizeof(*w));
    kvp_manual_clock_init(&w->mc, 1 * KVP_NSEC_PER_SEC);
    assert_int_equal(kvp_loop_create(&w->mc.clock, &w->loop), KVP_OK);
    assert_int_equal(kvp_fake_net_create(100 * 1000, &w->net), KVP_OK);
    assert_int_equal(kvp_fake_fabric_create(&w->mc.clock, &w->fab), KVP_OK);
    end_init(w, &w->a, "A", consumer_path);
    end_init(w, &w->b, "B", KVP_PATH_FAKE_FENCEABLE);
    assert_int_equal(kvp_ctl_want(w->a.ctl, "B"), KVP_OK);
    run(w, 20 * MS);
    assert_non_null(w->a.sess);
    assert_non_null(w->b.sess);
}

/* Anything still held after the close is released the way the node's hold
 * cap would, then everything is freed; no allocation may remain. */
static void world_down(sworld_t *w)
{
    end_t *ends[2] = {&w->a, &w->b};
    for (int i = 0; i < 2; i++) {
        end_t *e = ends[i];
        while (!kvp_list_empty(&e->env.quarantined))
            kvp__load_release_quarantine(
                KVP_CONTAINER_OF(e->env.quarantined.next, kvp_load_t, link), KVP_PROOF_HOLD_CAP);
        while (!kvp_list_empty(&e->env.retained)) {
            kvp_xfer_t *x = KVP_CONTAINER_OF(e->env.retained.next, kvp_xfer_t, link);
            e->xport->ops->force_release_retired(e->xport, &x->id, 1);
            kvp__xfer_release_retained(&e->env, x, KVP_PROOF_HOLD_CAP);
        }
        assert_null(e->sess); /* both links went down in these tests */
        kvp_ctl_destroy(e->ctl);
        kvp__session_env_fini(&e->env); /* doors2: the key-rate table the sessions left */
    }
    for (int i = 0; i < 10; i++)
        kvp_loop_run_once(w->loop, 0);
    for (int i = 0; i < 2; i++) {
        ends[i]->xport->ops->close(ends[i]->xport, true);
        kvp_store_destroy(ends[i]->store);
    }
    assert_int_equal(kvp_fake_fabric_destroy(w->fab), KVP_OK);
    kvp_fake_net_destroy(w->net);
    kvp_loop_destroy(w->loop);
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void make_keys(uint8_t *buf, uint32_t *lens, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        memcpy(buf + 8 * i, "key-0000", 8);
        buf[8 * i + 7] = (uint8_t)('0' + i);
        lens[i] = 8;
    }
}

/* B holds the keys; A looks them up, B's transfer is wedged, A fetches: the
 * load is in flight (A's slots FILLING, B's pins on the transfer). */
static uint64_t load_in_flight(sworld_t *w)
{
    uint8_t keys[8 * NBLK];
    uint32_t lens[NBLK];
    uint8_t res[NBLK];
    make_keys(keys, lens, NBLK);
    for (uint32_t i = 0; i < NBLK; i++) {
        kvp_slot_ref_t ref;
        void *ptr;
        assert_int_equal(kvp_store_reserve(w->b.store, keys + 8 * i, 8, 0, &ref, &ptr), KVP_OK);
        memset(ptr, (int)(0x40 + i), w->b.cfg.block_size);
        assert_int_equal(kvp_store_commit(w->b.store, ref), KVP_OK);
    }
    assert_int_equal(kvp__client_lookup(w->a.sess, 1, 7, keys, lens, NBLK, res), KVP_OK);
    w->a.flush = true;
    run(w, 10 * MS);
    assert_int_equal(w->a.nev, 1);
    assert_int_equal(w->a.ev[0].type, KVP_EV_LOOKUP);
    assert_int_equal(w->a.ev[0].n_ok, NBLK);
    kvp_fake_script_t wedge = kvp_fake_script_wedge();
    assert_int_equal(kvp_fake_script_next(w->b.xport, &wedge), KVP_OK);
    assert_int_equal(kvp__client_fetch(w->a.sess, 2, 7, keys, lens, NBLK, 0, NULL), KVP_OK);
    run(w, 10 * MS);
    kvp_store_stats_t sa, sb;
    kvp_store_get_stats(w->a.store, &sa);
    kvp_store_get_stats(w->b.store, &sb);
    assert_int_equal(sa.slots[KVP_SLOT_FILLING], NBLK);
    assert_int_equal(w->b.sess->xfers_inflight, 1);
    return 2;
}

/* The source's process dies (EOF on every connection of B): both sessions
 * go down as faults and return their close results. */
static void kill_source(sworld_t *w)
{
    kvp_fake_net_kill(w->net, "B");
    run(w, 5 * MS);
    assert_int_equal(w->a.downs, 1);
    assert_int_equal(w->b.downs, 1);
    assert_true(w->a.closed_fault);
}

static void assert_source_retained(sworld_t *w)
{
    const kvp_session_close_t *c = &w->b.closed;
    kvp_store_stats_t sb;
    kvp_store_get_stats(w->b.store, &sb);
    assert_int_equal(c->xfers_retained, 1);
    assert_int_equal(c->pins_retained, NBLK);
    assert_int_equal(c->xfers_released, 0);
    assert_int_equal(w->b.env.n_retained, 1);
    assert_int_equal(sb.pins, NBLK); /* the transfer may still read them (I2) */
    assert_int_equal(c->loads_failed + c->loads_quarantined, 0);
}

static void test_close_fenceable(void **state)
{
    (void)state;
    sworld_t w;
    world_up(&w, KVP_PATH_FAKE_FENCEABLE);
    uint64_t op = load_in_flight(&w);
    kill_source(&w);
    const kvp_session_close_t *c = &w.a.closed;
    assert_int_equal(c->loads_failed, 1);
    assert_true(c->fenced);
    assert_int_equal(c->slots_fenced, NBLK);
    assert_int_equal(c->loads_quarantined, 0);
    assert_int_equal(c->slots_quarantined, 0);
    assert_int_equal(c->slots_refused, 0);
    assert_true(kvp_list_empty(&w.a.env.quarantined));
    assert_int_equal(w.a.env.releases[KVP_PROOF_FENCE], NBLK);
    kvp_store_stats_t sa;
    kvp_store_get_stats(w.a.store, &sa);
    assert_int_equal(sa.slots[KVP_SLOT_FILLING] + sa.slots[KVP_SLOT_QUARANTINED], 0);
    /* the load's one outcome: failed for routing */
    assert_int_equal(w.a.ev[w.a.nev - 1].type, KVP_EV_LOAD);
    assert_int_equal(w.a.ev[w.a.nev - 1].op_id, op);
    assert_int_equal(w.a.ev[w.a.nev - 1].status, KVP_ERR_UNREACHABLE);
    assert_source_retained(&w);
    assert_int_equal(kvp_fake_violations(w.fab, NULL), 0);
    world_down(&w);
}

static void test_close_unfenceable(void **state)
{
    (void)state;
    sworld_t w;
    world_up(&w, KVP_PATH_FAKE_UNFENCEABLE);
    uint64_t op = load_in_flight(&w);
    kill_source(&w);
    const kvp_session_close_t *c = &w.a.closed;
    assert_int_equal(c->loads_failed, 1);
    assert_false(c->fenced);
    assert_int_equal(c->slots_fenced, 0);
    assert_int_equal(c->loads_quarantined, 1);
    assert_int_equal(c->slots_quarantined, NBLK);
    assert_int_equal(w.a.env.releases[KVP_PROOF_FENCE], 0);
    assert_false(kvp_list_empty(&w.a.env.quarantined));
    kvp_load_t *l = KVP_CONTAINER_OF(w.a.env.quarantined.next, kvp_load_t, link);
    assert_int_equal(l->op_id, op);
    assert_null(l->sess);
    kvp_store_stats_t sa;
    kvp_store_get_stats(w.a.store, &sa);
    assert_int_equal(sa.slots[KVP_SLOT_QUARANTINED], NBLK); /* a WRITE may still land */
    assert_int_equal(w.a.ev[w.a.nev - 1].status, KVP_ERR_UNREACHABLE);
    assert_source_retained(&w);
    world_down(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_close_fenceable),
        cmocka_unit_test(test_close_unfenceable),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
