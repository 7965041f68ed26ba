/*
 * test_node_ops.c -- misuse by the embedding (issue 18): a region the host
 * cannot hold, settings that name their field, a double kvp_release, an
 * embedding that never polls events, and the node fd of the caller-driven
 * mode. Each test names the mutation that makes it fail.
 */
#include "world.h"

#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

/* Names in /dev/shm, as one sorted-free concatenation (for before/after). */
static size_t shm_entries(char *buf, size_t cap)
{
    DIR *d = opendir("/dev/shm");
    size_t n = 0, len = 0;
    struct dirent *e;
    buf[0] = '\0';
    if (d == NULL)
        return 0;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        n++;
        len += (size_t)snprintf(buf + KVP_MIN(len, cap - 1), cap - KVP_MIN(len, cap - 1), "%s/",
                                e->d_name);
    }
    closedir(d);
    return n;
}

/* A region larger than the host's memory is refused before a byte of it is
 * touched, naming the limit, and leaves nothing in /dev/shm. Mutation: skip
 * the memory check (config.c check_region): with the FAKE transport the
 * create then succeeds (overcommitted mapping), with UCX it pre-faults
 * /dev/shm until the OOM killer runs (the original report). */
static void test_region_over_memory_refused(void **state)
{
    (void)state;
    static char before[65536], after[65536];
    uint64_t avail = kvp__mem_available();
    assert_true(avail > 0);
    for (int transport = 0; transport < 2; transport++) {
        kvp_config_t c;
        kvp_config_init(&c);
        c.transport = transport == 0 ? KVP_TRANSPORT_FAKE : KVP_TRANSPORT_UCX;
        c.thread_mode = KVP_THREAD_CALLER;
        c.block_size = 1u << 30;                                    /* 1 GiB */
        c.num_blocks = (uint32_t)(avail / c.block_size) + 2;        /* > MemAvailable */
        kvp_fake_fabric_t *fab = NULL;
        assert_int_equal(kvp_fake_fabric_create(kvp_clock_real(), &fab), KVP_OK);
        kvp_node_seams_t seams = {NULL, NULL, fab, KVP_PATH_FAKE_FENCEABLE, 0, false, 0};
        size_t nb = shm_entries(before, sizeof(before));
        kvp_node_t *n = NULL;
        uint64_t t0 = kvp_clock_now(kvp_clock_real());
        kvp_status_t st = kvp__node_create_ex(&c, &seams, &n);
        uint64_t took = kvp_clock_now(kvp_clock_real()) - t0;
        if (st == KVP_OK)
            kvp_node_destroy(n);
        kvp_fake_fabric_destroy(fab);
        assert_int_equal(st, KVP_ERR_INVALID);
        assert_null(n);
        assert_non_null(strstr(kvp_last_error(), "MemAvailable"));
        assert_non_null(strstr(kvp_last_error(), "num_blocks"));
        assert_true(took < 2 * KVP_NSEC_PER_SEC * kvp_test_time_scale()); /* nothing touched */
        size_t na = shm_entries(after, sizeof(after));
        assert_int_equal(na, nb);
        assert_string_equal(after, before);
    }
}

/* Every refused setting names its field in kvp_last_error(). Mutation:
 * return KVP_ERR_INVALID without recording (the old config_check). */
static void test_bad_settings_name_the_field(void **state)
{
    (void)state;
    static const uint8_t short_psk[2] = {1, 2};
    static char region[8192];
    struct {
        const char *field;
        int which;
    } cases[] = {{"block_size", 0}, {"num_blocks", 1}, {"psk", 2},
                 {"dead_after_ms", 3}, {"region_len", 4}, {"thread_mode", 5}};
    for (size_t i = 0; i < KVP_ARRAY_SIZE(cases); i++) {
        kvp_config_t c;
        kvp_config_init(&c);
        c.transport = KVP_TRANSPORT_FAKE;
        switch (cases[i].which) {
        case 0: c.block_size = 1000; break;
        case 1: c.num_blocks = 0; break;
        case 2: c.psk = short_psk, c.psk_len = sizeof(short_psk); break;
        case 3: c.dead_after_ms = c.heartbeat_ms; break;
        case 4: c.region = region, c.region_len = sizeof(region), c.num_blocks = 4; break;
        case 5: c.thread_mode = 7; break;
        }
        kvp_node_t *n = NULL;
        assert_int_equal(kvp_node_create(&c, &n), KVP_ERR_INVALID);
        assert_null(n);
        if (strstr(kvp_last_error(), cases[i].field) != kvp_last_error()) {
            fprintf(stderr, "case %s: last error '%s'\n", cases[i].field, kvp_last_error());
            fail();
        }
    }
}

/* SPEC I2: the engine cannot drop a pin it does not hold. A double
 * kvp_release used to drop the pin of an outbound transfer (here taken with
 * kvp_store_pin, as server.c does), letting the slot be evicted while a
 * WRITE reads it. Mutation: do_release calling kvp_store_unpin directly. */
static void test_double_release_keeps_transfer_pin(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 1, NULL);
    world_put(w, 0, 1, 0);
    wkeys_t ks;
    wkeys_make(&ks, 1, 1);
    kvp_block_t b;
    assert_int_equal(kvp_get(w->node[0], ks.buf, ks.len[0], &b), KVP_OK);
    kvp_store_t *st = kvp__node_store(w->node[0]);
    kvp_slot_ref_t ref = {b.slot, b.gen};
    assert_int_equal(kvp_store_pin(st, ref), KVP_OK); /* the transfer's pin */
    assert_int_equal(world_stats(w, 0).pins, 2);
    assert_int_equal(kvp_release(w->node[0], &b), KVP_OK);
    assert_int_equal(kvp_release(w->node[0], &b), KVP_ERR_STATE); /* the double release */
    assert_int_equal(world_stats(w, 0).pins, 1);                  /* the transfer's, intact */
    kvp_block_t forged = b;
    forged.slot = 100000;
    assert_int_equal(kvp_release(w->node[0], &forged), KVP_ERR_STATE);
    /* Two gets, two releases: still fine; the third is refused. */
    assert_int_equal(kvp_get(w->node[0], ks.buf, ks.len[0], &b), KVP_OK);
    assert_int_equal(kvp_get(w->node[0], ks.buf, ks.len[0], &b), KVP_OK);
    assert_int_equal(kvp_release(w->node[0], &b), KVP_OK);
    assert_int_equal(kvp_release(w->node[0], &b), KVP_OK);
    assert_int_equal(kvp_release(w->node[0], &b), KVP_ERR_STATE);
    assert_int_equal(world_stats(w, 0).pins, 1);
    assert_int_equal(kvp_store_unpin(st, ref), KVP_OK);
    world_fini(w, false);
    free(w);
}

/* kvp_blocks_copy: got blocks into the caller's buffers in one call, each
 * at most its buffer's length; a block that is not one of the node's slots
 * anywhere (a slot out of range, a data pointer off its slot, a length past
 * the block size) refuses the whole call with nothing copied. Mutation: the
 * data-pointer check left out -> the forged block is copied. */
static void test_blocks_copy(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 1, NULL);
    world_put(w, 0, 1, 0);
    world_put(w, 0, 2, 0);
    wkeys_t ks;
    wkeys_make(&ks, 1, 2);
    size_t bs = w->cfg[0].block_size;
    kvp_block_t b[2];
    assert_int_equal(kvp_get(w->node[0], ks.buf, ks.len[0], &b[0]), KVP_OK);
    assert_int_equal(kvp_get(w->node[0], ks.buf + ks.len[0], ks.len[1], &b[1]), KVP_OK);
    uint8_t *d0 = calloc(1, bs + 16), *d1 = calloc(1, bs), *want = malloc(bs);
    void *dst[2] = {d0, d1};
    uint64_t len[2] = {bs + 16, 100};
    kvp_block_t forged[2] = {b[0], b[1]};
    forged[1].data = (const uint8_t *)b[1].data + 64; /* off its slot: another's bytes */
    assert_int_equal(kvp_blocks_copy(w->node[0], forged, 2, dst, len), KVP_ERR_INVALID);
    forged[1] = b[1];
    forged[1].slot = w->cfg[0].num_blocks;
    assert_int_equal(kvp_blocks_copy(w->node[0], forged, 2, dst, len), KVP_ERR_INVALID);
    forged[1] = b[1];
    forged[1].len = bs + 1;
    assert_int_equal(kvp_blocks_copy(w->node[0], forged, 2, dst, len), KVP_ERR_INVALID);
    world_block(1, want, bs);
    assert_true(want[0] != 0 && want[bs - 1] != 0);
    assert_true(d0[0] == 0 && d0[bs - 1] == 0 && d1[0] == 0); /* nothing copied */
    assert_int_equal(kvp_blocks_copy(w->node[0], b, 2, NULL, len), KVP_ERR_INVALID);
    assert_int_equal(kvp_blocks_copy(w->node[0], NULL, 0, NULL, NULL), KVP_OK);
    assert_int_equal(kvp_blocks_copy(w->node[0], b, 2, dst, len), KVP_OK);
    world_block(1, want, bs);
    assert_memory_equal(d0, want, bs);
    assert_int_equal(d0[bs], 0); /* the block's length, not the buffer's */
    world_block(2, want, bs);
    assert_int_not_equal(want[100], 0);
    assert_memory_equal(d1, want, 100);
    assert_int_equal(d1[100], 0); /* the buffer's length, not the block's */
    assert_int_equal(kvp_release(w->node[0], &b[0]), KVP_OK);
    assert_int_equal(kvp_release(w->node[0], &b[1]), KVP_OK);
    free(d0);
    free(d1);
    free(want);
    world_fini(w, false);
    free(w);
}

/* An embedding that never takes its events cannot make the node grow
 * without bound: the ring stops at KVP_EVENT_RING_MAX and the loss is
 * reported as one KVP_EV_OVERFLOW event before the rest. Mutation: the
 * unbounded doubling of kvp__node_emit. */
static void test_event_ring_bounded_with_overflow(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 1, NULL);
    kvp_event_t ev = {.type = KVP_EV_PEER_UP};
    const uint32_t extra = 7;
    for (uint32_t i = 0; i < KVP_EVENT_RING_MAX + extra; i++) {
        ev.op_id = i;
        kvp__node_emit(w->node[0], &ev);
    }
    kvp_event_t *out = calloc(KVP_EVENT_RING_MAX + 64, sizeof(*out));
    uint32_t got = 0;
    assert_int_equal(kvp_poll_events(w->node[0], out, KVP_EVENT_RING_MAX + 64, &got), KVP_OK);
    assert_int_equal(got, KVP_EVENT_RING_MAX + 1);
    assert_int_equal(out[0].type, KVP_EV_OVERFLOW);
    assert_int_equal(out[0].status, KVP_ERR_LIMIT);
    assert_int_equal(out[0].n_keys, extra);
    assert_int_equal(out[1].op_id, 0); /* the oldest kept, in order */
    assert_int_equal(out[got - 1].op_id, KVP_EVENT_RING_MAX - 1);
    assert_int_equal(kvp_poll_events(w->node[0], out, 8, &got), KVP_OK);
    assert_int_equal(got, 0);
    struct pollfd p = {kvp_node_fd(w->node[0]), POLLIN, 0};
    assert_int_equal(poll(&p, 1, 0), 0); /* nothing left: not readable */
    free(out);
    world_fini(w, false);
    free(w);
}

/* The node fd is readable exactly while events wait, across batches: a
 * partial take leaves it readable, a drain clears it, an empty poll (no
 * syscall any more: ev_signalled) leaves it clear, and the next event makes
 * it readable again. Mutation: set ev_signalled only on the first event of
 * the node's life (the second batch then never wakes the poller). */
static void test_event_fd_tracks_the_queue(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 1, NULL);
    kvp_node_t *n = w->node[0];
    struct pollfd p = {kvp_node_fd(n), POLLIN, 0};
    kvp_event_t ev = {.type = KVP_EV_PEER_UP}, out[4];
    uint32_t got;
    for (int batch = 0; batch < 3; batch++) {
        assert_int_equal(kvp_poll_events(n, out, 4, &got), KVP_OK); /* empty */
        assert_int_equal(got, 0);
        assert_int_equal(poll(&p, 1, 0), 0);
        ev.op_id = 10 * batch + 1;
        kvp__node_emit(n, &ev);
        ev.op_id++;
        kvp__node_emit(n, &ev);
        assert_int_equal(poll(&p, 1, 0), 1);
        assert_int_equal(kvp_poll_events(n, out, 1, &got), KVP_OK); /* partial */
        assert_int_equal(got, 1);
        assert_int_equal(out[0].op_id, 10 * batch + 1);
        assert_int_equal(poll(&p, 1, 0), 1); /* one still waits */
        assert_int_equal(kvp_poll_events(n, out, 4, &got), KVP_OK);
        assert_int_equal(got, 1);
        assert_int_equal(out[0].op_id, 10 * batch + 2);
        assert_int_equal(poll(&p, 1, 0), 0); /* drained */
    }
    world_fini(w, false);
    free(w);
}

/* kvpeer.h: in caller-driven mode the node fd is readable whenever
 * kvp_node_progress() has work -- incoming frames and timers, not only
 * events. Two caller-driven nodes over real TCP, each progressed ONLY when
 * its fd is readable, must complete the handshake; and an idle node's fd
 * wakes for its timers. Mutation: kvp_node_fd returning the event fd (the
 * listener never accepts, nothing ever becomes ready). */
static void test_caller_fd_wakes_for_frames_and_timers(void **state)
{
    (void)state;
    kvp_fake_fabric_t *fab;
    assert_int_equal(kvp_fake_fabric_create(kvp_clock_real(), &fab), KVP_OK);
    kvp_node_t *nd[2];
    for (int i = 0; i < 2; i++) {
        kvp_config_t c;
        kvp_config_init(&c);
        c.transport = KVP_TRANSPORT_FAKE;
        c.thread_mode = KVP_THREAD_CALLER;
        c.num_blocks = 16;
        c.block_size = 4096;
        c.listen_addr = "127.0.0.1:0";
        kvp_node_seams_t seams = {NULL, NULL, fab, KVP_PATH_FAKE_FENCEABLE, 0, false, 0};
        assert_int_equal(kvp__node_create_ex(&c, &seams, &nd[i]), KVP_OK);
        assert_true(kvp_node_fd(nd[i]) >= 0);
    }
    /* Timers: an idle node wakes for its hold-cap timer (<= 250 ms). */
    kvp_node_progress(nd[0], 0);
    struct pollfd p = {kvp_node_fd(nd[0]), POLLIN, 0};
    assert_int_equal(poll(&p, 1, (int)(2000 * kvp_test_time_scale())), 1);

    assert_int_equal(kvp_peer_add(nd[0], kvp_node_peer_id(nd[1])), KVP_OK);
    uint64_t end = kvp_clock_now(kvp_clock_real()) +
                   (uint64_t)(10 * kvp_test_time_scale()) * KVP_NSEC_PER_SEC;
    bool up[2] = {false, false};
    while (!(up[0] && up[1]) && kvp_clock_now(kvp_clock_real()) < end) {
        struct pollfd ps[2] = {{kvp_node_fd(nd[0]), POLLIN, 0}, {kvp_node_fd(nd[1]), POLLIN, 0}};
        if (poll(ps, 2, 100) <= 0)
            continue;
        for (int i = 0; i < 2; i++) {
            if (!(ps[i].revents & POLLIN))
                continue;
            kvp_node_progress(nd[i], 0);
            kvp_event_t ev[8];
            uint32_t got = 0;
            kvp_poll_events(nd[i], ev, 8, &got);
            for (uint32_t k = 0; k < got; k++)
                up[i] |= ev[k].type == KVP_EV_PEER_UP;
        }
    }
    assert_true(up[0]);
    assert_true(up[1]);
    for (int i = 0; i < 2; i++)
        kvp_node_destroy(nd[i]);
    kvp_fake_fabric_destroy(fab);
}


/* Fetching keys of which some missed in the lookup: the hits are sent and
 * committed, the misses answer NOT_FOUND per block; the load's status says
 * not everything came (NOT_FOUND) and n_ok counts the hits. It used to fail
 * every block of the load. Mutation: the old `missing > 0 && !wait` that
 * finishes the whole round NOT_FOUND in kvp__server_on_fetch. */
static void test_fetch_with_missed_keys_delivers_the_hits(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    world_put(w, 0, 1, 0);
    world_put(w, 0, 3, 0);
    wkeys_t ks;
    wkeys_make(&ks, 1, 4); /* keys 1..4: 1 and 3 hit, 2 and 4 miss */
    uint8_t res[4];
    uint64_t op = 0;
    assert_int_equal(kvp_lookup(w->node[1], w->addr[0], 5, ks.buf, ks.len, 4, res, &op), KVP_OK);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOOKUP, op, 100 * KVP_NSEC_PER_MSEC);
    assert_non_null(e);
    assert_int_equal(e->n_ok, 2);
    int32_t bs[4] = {99, 99, 99, 99};
    assert_int_equal(kvp_fetch(w->node[1], w->addr[0], 5, ks.buf, ks.len, 4, 0, bs, &op), KVP_OK);
    e = world_wait(w, 1, KVP_EV_LOAD, op, 100 * KVP_NSEC_PER_MSEC);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_ERR_NOT_FOUND);
    assert_int_equal(e->n_ok, 2);
    assert_int_equal(bs[0], KVP_OK);
    assert_int_equal(bs[1], KVP_ERR_NOT_FOUND);
    assert_int_equal(bs[2], KVP_OK);
    assert_int_equal(bs[3], KVP_ERR_NOT_FOUND);
    assert_true(world_verify(w, 1, 1));
    assert_true(world_verify(w, 1, 3));
    assert_false(world_verify(w, 1, 2));
    world_run(w, 10 * KVP_NSEC_PER_MSEC);
    assert_int_equal(world_stats(w, 0).pins, 0);
    assert_int_equal(world_stats(w, 1).slots_filling, 0);
    assert_int_equal(world_stats(w, 1).slots_ready, 2);
    world_fini(w, false);
    free(w);
}

/* kvp_node_reconfigure (SIGHUP of kvpeerd): values the node refuses change
 * nothing, the error names the field; accepted ones act at once (here the
 * idle timeout closes the idle session; a PSK set afterwards refuses a new
 * handshake with a peer that has none). Mutations: apply before the check
 * (the idle session closes after the refused call); drop the ctl PSK update
 * in do_reconfigure (the redial succeeds). */
static void test_reconfigure_runtime_settings(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    world_connect(w, 1, 0);
    kvp_config_t c = w->cfg[0];
    c.idle_session_ms = 100;
    c.heartbeat_ms = 500; /* >= dead_after_ms (200): refused whole */
    assert_int_equal(kvp_node_reconfigure(w->node[0], &c), KVP_ERR_INVALID);
    assert_non_null(strstr(kvp_last_error(), "dead_after_ms"));
    c.heartbeat_ms = 50;
    c.psk = (const uint8_t *)"short";
    c.psk_len = 5;
    assert_int_equal(kvp_node_reconfigure(w->node[0], &c), KVP_ERR_INVALID);
    assert_non_null(strstr(kvp_last_error(), "psk"));
    world_run(w, 400 * KVP_NSEC_PER_MSEC);
    assert_true(world_peer_ready(w, 0, 1)); /* nothing of the refused calls applied */
    assert_int_equal(world_event_count(w, 0, KVP_EV_PEER_DOWN, 0), 0);
    c.psk = NULL;
    c.psk_len = 0;
    assert_int_equal(kvp_node_reconfigure(w->node[0], &c), KVP_OK);
    world_run(w, 400 * KVP_NSEC_PER_MSEC);
    /* closed as idle after 100 ms (node 1 still wants it: redialled) */
    assert_true(world_event_count(w, 0, KVP_EV_PEER_DOWN, 0) >= 1);
    /* A key from now on: the idle session closes, node 1 (no key) is refused
     * on its redial. */
    static const uint8_t key[] = "0123456789abcdef-new-key";
    c.psk = key;
    c.psk_len = sizeof(key) - 1;
    assert_int_equal(kvp_node_reconfigure(w->node[0], &c), KVP_OK);
    world_run(w, 600 * KVP_NSEC_PER_MSEC);
    assert_false(world_peer_ready(w, 1, 0));
    kvp_refusal_stats_t r;
    assert_int_equal(kvp_node_refusals(w->node[0], &r), KVP_OK);
    assert_true(r.refused_auth >= 1);
    world_fini(w, false);
    free(w);
}

static uint64_t real_ms(void)
{
    return kvp_clock_now(kvp_clock_real()) / KVP_NSEC_PER_MSEC;
}

/* Issue 18: an unknown or failed peer answers UNREACHABLE at once, and in
 * caller-driven mode (the fake world) an API call never blocks, even for a
 * peer still dialing: the embedding drives progress (the wait for a dialing
 * peer is the node thread's: test_lookup_right_after_peer_add_ucx).
 * Mutations: wait in caller-driven mode too (the dialing lookup takes the
 * 200 ms bound: node 0 never runs meanwhile); wait for any wanted peer. */
static void test_lookup_waits_for_dialing_peer_fake(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    wkeys_t ks;
    wkeys_make(&ks, 1, 1);
    uint8_t res[1];
    uint64_t op = 0, t0 = real_ms();
    /* unknown: at once */
    assert_int_equal(kvp_lookup(w->node[1], "n9:7000", 1, ks.buf, ks.len, 1, res, &op),
                     KVP_ERR_UNREACHABLE);
    /* failed: the dial to a node nobody runs fails; then at once */
    world_run(w, 300 * KVP_NSEC_PER_MSEC);
    assert_int_equal(kvp_lookup(w->node[1], "n9:7000", 1, ks.buf, ks.len, 1, res, &op),
                     KVP_ERR_UNREACHABLE);
    assert_true(real_ms() - t0 < 150); /* the bound is 200 ms */
    /* dialing, caller-driven: at once, no progress run inside the call */
    assert_int_equal(kvp_peer_add(w->node[1], w->addr[0]), KVP_OK);
    t0 = real_ms();
    assert_int_equal(kvp_lookup(w->node[1], w->addr[0], 1, ks.buf, ks.len, 1, res, &op),
                     KVP_ERR_UNREACHABLE);
    assert_true(real_ms() - t0 < 150);
    /* ... and the session comes up as the world runs */
    world_run(w, 300 * KVP_NSEC_PER_MSEC);
    assert_true(world_peer_ready(w, 1, 0));
    assert_int_equal(kvp_lookup(w->node[1], w->addr[0], 1, ks.buf, ks.len, 1, res, &op), KVP_OK);
    world_fini(w, false);
    free(w);
}

/* A second kvp_peer_remove while the first one's session is still closing
 * answers NOT_FOUND, whenever it comes: the closing session is already
 * going. (It answered OK until the teardown ran, so kvpeerd's "peer remove
 * twice" check depended on which thread ran the second call first.) Here
 * the two calls come back to back in caller-driven mode, before any round
 * could tear the session down. Mutation: OK for a closing session. */
static void test_peer_remove_twice_fake(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 2, NULL);
    assert_int_equal(kvp_peer_add(w->node[1], w->addr[0]), KVP_OK);
    world_run(w, 300 * KVP_NSEC_PER_MSEC);
    assert_true(world_peer_ready(w, 1, 0));
    assert_int_equal(kvp_peer_remove(w->node[1], w->addr[0]), KVP_OK);
    assert_int_equal(kvp_peer_remove(w->node[1], w->addr[0]), KVP_ERR_NOT_FOUND);
    world_run(w, 300 * KVP_NSEC_PER_MSEC);
    assert_int_equal(kvp_peer_remove(w->node[1], w->addr[0]), KVP_ERR_NOT_FOUND);
    world_fini(w, false);
    free(w);
}

/* The real path (UCX, TCP, node threads): kvp_lookup and kvp_fetch right
 * after kvp_peer_add, no kvp_peer_wait, succeed (the README example without
 * kvp_peer_wait). It answered UNREACHABLE before (3 of 3 runs). Mutation:
 * no wait in remote_exec. */
static void test_lookup_right_after_peer_add_ucx(void **state)
{
    (void)state;
    kvp_node_t *nd[2];
    for (int i = 0; i < 2; i++) {
        kvp_config_t c;
        kvp_config_init(&c);
        c.num_blocks = 8;
        c.block_size = 4096;
        c.listen_addr = "127.0.0.1:0";
        c.dead_after_ms = (uint32_t)(2000 * kvp_test_time_scale());
        c.handshake_timeout_ms = c.dead_after_ms;
        assert_int_equal(kvp_node_create(&c, &nd[i]), KVP_OK);
    }
    static const uint8_t blk[4096] = {7};
    assert_int_equal(kvp_put(nd[0], "k1", 2, blk, sizeof(blk), 0), KVP_OK);
    const char *src = kvp_node_peer_id(nd[0]);
    assert_int_equal(kvp_peer_add(nd[1], src), KVP_OK);
    uint8_t res[1];
    uint32_t len = 2;
    uint64_t op = 0;
    assert_int_equal(kvp_lookup(nd[1], src, 3, (const uint8_t *)"k1", &len, 1, res, &op), KVP_OK);
    kvp_event_t ev;
    uint32_t got = 0;
    uint64_t end = real_ms() + (uint64_t)(10000 * kvp_test_time_scale());
    while (got == 0 && real_ms() < end) {
        struct pollfd p = {kvp_node_fd(nd[1]), POLLIN, 0};
        poll(&p, 1, 100);
        kvp_poll_events(nd[1], &ev, 1, &got);
        if (got && ev.op_id != op)
            got = 0; /* PEER_UP */
    }
    assert_int_equal(got, 1);
    assert_int_equal(ev.type, KVP_EV_LOOKUP);
    assert_int_equal(ev.n_ok, 1);
    kvp_finish_request(nd[1], 3);
    for (int i = 1; i >= 0; i--)
        kvp_node_destroy(nd[i]);
}


/* Callers racing the node thread (kvp__node_exec's fast path: a caller runs
 * its command itself while the node thread sleeps, else queues it). Three
 * engine threads on the consumer each look up, fetch, read back and finish
 * their own keys while an event thread hands out outcomes, a stats reader
 * polls, and a thread on the source puts new blocks: every lookup hits,
 * every load commits byte-exact, nothing hangs, and under TSan no access
 * to the node's state goes unordered. The event thread waits on the node fd,
 * or (use_wait) in kvp_wait_events, where it runs the node's rounds itself
 * while the node thread sleeps (it must then have led at least once). */
enum { RACE_THREADS = 3, RACE_ITERS = 12, RACE_KEYS = 2, RACE_BS = 4096 };

typedef struct race {
    kvp_node_t *src, *dst;
    const char *peer;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kvp_event_t evs[RACE_THREADS * RACE_ITERS * 2 + 64];
    uint32_t nev;
    bool stop, use_wait;
    int failures;
} race_t;

static void race_key(uint32_t t, uint32_t it, uint32_t k, char key[16])
{
    snprintf(key, 16, "r%u-%u-%u", t, it, k);
}

static void race_fill(const char *key, uint8_t *buf)
{
    for (uint32_t i = 0; i < RACE_BS; i++)
        buf[i] = (uint8_t)(key[1] * 31 + key[3] * 7 + key[5] + i);
}

static void *race_events(void *arg)
{
    race_t *r = arg;
    for (;;) {
        kvp_event_t ev[16];
        uint32_t got = 0;
        if (r->use_wait) {
            if (kvp_wait_events(r->dst, ev, 16, &got, 20) != KVP_OK) {
                pthread_mutex_lock(&r->mu);
                r->failures++;
                pthread_mutex_unlock(&r->mu);
            }
        } else {
            struct pollfd p = {kvp_node_fd(r->dst), POLLIN, 0};
            poll(&p, 1, 20);
            kvp_poll_events(r->dst, ev, 16, &got);
        }
        pthread_mutex_lock(&r->mu);
        for (uint32_t i = 0; i < got && r->nev < KVP_ARRAY_SIZE(r->evs); i++)
            if (ev[i].type == KVP_EV_LOOKUP || ev[i].type == KVP_EV_LOAD)
                r->evs[r->nev++] = ev[i];
        bool stop = r->stop;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        if (stop)
            return NULL;
    }
}

static bool race_wait(race_t *r, uint64_t op, kvp_event_t *out)
{
    uint64_t end = real_ms() + (uint64_t)(20000 * kvp_test_time_scale());
    pthread_mutex_lock(&r->mu);
    for (;;) {
        for (uint32_t i = 0; i < r->nev; i++)
            if (r->evs[i].op_id == op) {
                *out = r->evs[i];
                pthread_mutex_unlock(&r->mu);
                return true;
            }
        if (real_ms() > end)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
    pthread_mutex_unlock(&r->mu);
    return false;
}

typedef struct race_arg {
    race_t *r;
    uint32_t t;
} race_arg_t;

static void *race_engine(void *arg)
{
    race_arg_t *a = arg;
    race_t *r = a->r;
    int bad = 0;
    for (uint32_t it = 0; it < RACE_ITERS && !bad; it++) {
        char keys[RACE_KEYS][16];
        uint8_t buf[RACE_KEYS * 16], res[RACE_KEYS];
        uint32_t lens[RACE_KEYS], off = 0;
        for (uint32_t k = 0; k < RACE_KEYS; k++) {
            race_key(a->t, it, k, keys[k]);
            lens[k] = (uint32_t)strlen(keys[k]);
            memcpy(buf + off, keys[k], lens[k]);
            off += lens[k];
        }
        uint64_t req = 1000 + a->t * 100 + it, op = 0;
        kvp_event_t ev;
        bad |= kvp_lookup(r->dst, r->peer, req, buf, lens, RACE_KEYS, res, &op) != KVP_OK;
        bad |= !bad && (!race_wait(r, op, &ev) || ev.status != KVP_OK || ev.n_ok != RACE_KEYS);
        int32_t st[RACE_KEYS];
        bad |= !bad && kvp_fetch(r->dst, r->peer, req, buf, lens, RACE_KEYS, 0, st, &op) != KVP_OK;
        bad |= !bad && (!race_wait(r, op, &ev) || ev.status != KVP_OK);
        for (uint32_t k = 0; k < RACE_KEYS && !bad; k++) {
            kvp_block_t b;
            uint8_t want[RACE_BS];
            race_fill(keys[k], want);
            bad |= kvp_get(r->dst, keys[k], lens[k], &b) != KVP_OK;
            if (!bad) {
                bad |= b.len != RACE_BS || memcmp(b.data, want, RACE_BS) != 0;
                kvp_release(r->dst, &b);
            }
        }
        kvp_finish_request(r->dst, req);
    }
    if (bad) {
        pthread_mutex_lock(&r->mu);
        r->failures++;
        pthread_mutex_unlock(&r->mu);
    }
    return NULL;
}

static void *race_side(void *arg)
{
    race_t *r = arg;
    uint8_t blk[RACE_BS] = {1};
    for (uint32_t i = 0; i < 200; i++) {
        kvp_stats_t st;
        kvp_node_stats(r->dst, &st);
        char key[16];
        snprintf(key, sizeof(key), "side%u", i % 32);
        kvp_put(r->src, key, (uint32_t)strlen(key), blk, sizeof(blk), 0);
    }
    return NULL;
}

static void race_run(bool use_wait)
{
    race_t r;
    memset(&r, 0, sizeof(r));
    r.use_wait = use_wait;
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    kvp_node_t *nd[2];
    for (int i = 0; i < 2; i++) {
        kvp_config_t c;
        kvp_config_init(&c);
        c.num_blocks = 256;
        c.block_size = RACE_BS;
        c.listen_addr = "127.0.0.1:0";
        c.dead_after_ms = (uint32_t)(2000 * kvp_test_time_scale());
        c.handshake_timeout_ms = c.dead_after_ms;
        assert_int_equal(kvp_node_create(&c, &nd[i]), KVP_OK);
    }
    r.src = nd[0];
    r.dst = nd[1];
    r.peer = kvp_node_peer_id(nd[0]);
    for (uint32_t t = 0; t < RACE_THREADS; t++)
        for (uint32_t it = 0; it < RACE_ITERS; it++)
            for (uint32_t k = 0; k < RACE_KEYS; k++) {
                char key[16];
                uint8_t blk[RACE_BS];
                race_key(t, it, k, key);
                race_fill(key, blk);
                assert_int_equal(kvp_put(nd[0], key, (uint32_t)strlen(key), blk, RACE_BS, 0),
                                 KVP_OK);
            }
    assert_int_equal(kvp_peer_add(nd[1], r.peer), KVP_OK);
    assert_int_equal(kvp_peer_wait(nd[1], r.peer, (int32_t)(10000 * kvp_test_time_scale())),
                     KVP_OK);
    pthread_t evt, side, eng[RACE_THREADS];
    race_arg_t args[RACE_THREADS];
    assert_int_equal(pthread_create(&evt, NULL, race_events, &r), 0);
    assert_int_equal(pthread_create(&side, NULL, race_side, &r), 0);
    for (uint32_t t = 0; t < RACE_THREADS; t++) {
        args[t] = (race_arg_t){&r, t};
        assert_int_equal(pthread_create(&eng[t], NULL, race_engine, &args[t]), 0);
    }
    for (uint32_t t = 0; t < RACE_THREADS; t++)
        pthread_join(eng[t], NULL);
    pthread_join(side, NULL);
    pthread_mutex_lock(&r.mu);
    r.stop = true;
    pthread_mutex_unlock(&r.mu);
    pthread_join(evt, NULL);
    assert_int_equal(r.failures, 0);
    kvp_stats_t st;
    assert_int_equal(kvp_node_stats(nd[1], &st), KVP_OK);
    assert_int_equal(st.fetches_ok, RACE_THREADS * RACE_ITERS);
    assert_int_equal(st.pins, 0);
    if (use_wait)
        assert_true(st.waits_led > 0);
    else
        assert_int_equal(st.waits_led, 0);
    for (int i = 1; i >= 0; i--)
        kvp_node_destroy(nd[i]);
    pthread_mutex_destroy(&r.mu);
    pthread_cond_destroy(&r.cv);
}

static void test_callers_race_the_node_thread_ucx(void **state)
{
    (void)state;
    race_run(false);
}

static void test_wait_events_leader_races_ucx(void **state)
{
    (void)state;
    race_run(true);
}

/* A thread in kvp_wait_events: up to `cap` (<= 4) events, `timeout_ms`. */
typedef struct waiter {
    kvp_node_t *n;
    uint32_t cap;
    int32_t timeout_ms;
    kvp_status_t st;
    uint32_t got;
    kvp_event_t ev[4];
} waiter_t;

static void *waiter_main(void *arg)
{
    waiter_t *w = arg;
    w->st = kvp_wait_events(w->n, w->ev, w->cap, &w->got, w->timeout_ms);
    return NULL;
}

/* kvp_wait_events: argument checks, a timeout with nothing to take, the
 * caller-driven mode (it runs the rounds), and kvp_node_destroy() while a
 * thread waits without limit: the waiter leaves with KVP_ERR_CLOSED before
 * the node is freed. The waiter lingers 100 ms on its way out (seam), so a
 * destroy that did not wait for it would free the node under it (ASan). */
static void test_wait_events_timeout_and_destroy_ucx(void **state)
{
    (void)state;
    for (int mode = 0; mode < 2; mode++) {
        kvp_config_t c;
        kvp_config_init(&c);
        c.num_blocks = 16;
        c.block_size = 4096;
        c.thread_mode = mode ? KVP_THREAD_CALLER : KVP_THREAD_OWN;
        kvp_node_t *n;
        kvp_node_seams_t seams = {.wait_exit_delay_ms = mode ? 0 : 100};
        assert_int_equal(kvp__node_create_ex(&c, &seams, &n), KVP_OK);
        kvp_event_t ev[4];
        uint32_t got = 7;
        assert_int_equal(kvp_wait_events(NULL, ev, 4, &got, 0), KVP_ERR_INVALID);
        assert_int_equal(kvp_wait_events(n, ev, 0, &got, 0), KVP_ERR_INVALID);
        assert_int_equal(kvp_wait_events(n, NULL, 4, &got, 0), KVP_ERR_INVALID);
        uint64_t t0 = real_ms();
        assert_int_equal(kvp_wait_events(n, ev, 4, &got, 30), KVP_OK);
        assert_int_equal(got, 0);
        assert_true(real_ms() - t0 >= 29);
        t0 = real_ms();
        if (mode == 0) {
            waiter_t w = {.n = n, .cap = 4, .timeout_ms = -1, .st = KVP_OK, .got = 9};
            pthread_t t;
            assert_int_equal(pthread_create(&t, NULL, waiter_main, &w), 0);
            usleep(50000); /* into its wait (leading or on the event fd) */
            kvp_node_destroy(n);
            assert_true(real_ms() - t0 >= 150); /* it waited out the lingering waiter */
            pthread_join(t, NULL);
            assert_int_equal(w.st, KVP_ERR_CLOSED);
            assert_int_equal(w.got, 0);
        } else {
            kvp_node_destroy(n);
        }
    }
}

/* A waiter that leads takes its events itself, and the event fd is not
 * written for them meanwhile; what does not fit in its buffer must make the
 * fd readable when its lead ends. A waiter with room for one leads (the node
 * thread sleeps); two events are queued while it sleeps in its round; it
 * returns the first, and the second must be announced on kvp_node_fd.
 * Mutation: no signal at the lead's end (the fd stays quiet with an event
 * queued). */
static void test_wait_leader_signals_what_it_leaves_ucx(void **state)
{
    (void)state;
    kvp_config_t c;
    kvp_config_init(&c);
    c.num_blocks = 16;
    c.block_size = 4096;
    kvp_node_t *n;
    assert_int_equal(kvp_node_create(&c, &n), KVP_OK);
    struct pollfd p = {kvp_node_fd(n), POLLIN, 0};
    waiter_t w = {.n = n, .cap = 1, .timeout_ms = (int32_t)(5000 * kvp_test_time_scale())};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, waiter_main, &w), 0);
    /* It leads (the node thread sleeps): the stats call is a command its
     * round runs, and its lead goes on until an event comes. */
    kvp_stats_t st = {0};
    uint64_t end = real_ms() + (uint64_t)(5000 * kvp_test_time_scale());
    for (;;) {
        assert_int_equal(kvp_node_stats(n, &st), KVP_OK);
        if (st.waits_led > 0 || real_ms() >= end)
            break;
        usleep(1000);
    }
    assert_true(st.waits_led >= 1);
    kvp_event_t ev = {.type = KVP_EV_PEER_UP, .op_id = 1};
    kvp__node_emit(n, &ev);
    ev.op_id = 2;
    kvp__node_emit(n, &ev);
    pthread_join(t, NULL);
    assert_int_equal(w.st, KVP_OK);
    assert_int_equal(w.got, 1);
    assert_int_equal(w.ev[0].op_id, 1);
    assert_int_equal(poll(&p, 1, 0), 1); /* the one left is announced */
    uint32_t got;
    assert_int_equal(kvp_poll_events(n, &ev, 1, &got), KVP_OK);
    assert_int_equal(got, 1);
    assert_int_equal(ev.op_id, 2);
    assert_int_equal(poll(&p, 1, 0), 0);
    kvp_node_destroy(n);
}

static __attribute__((unused)) void unused_helpers(world_t *w) { (void)world_wait(w, 0, 0, 0, 0); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_region_over_memory_refused),
        cmocka_unit_test(test_bad_settings_name_the_field),
        cmocka_unit_test(test_double_release_keeps_transfer_pin),
        cmocka_unit_test(test_blocks_copy),
        cmocka_unit_test(test_event_ring_bounded_with_overflow),
        cmocka_unit_test(test_event_fd_tracks_the_queue),
        cmocka_unit_test(test_caller_fd_wakes_for_frames_and_timers),
        cmocka_unit_test(test_fetch_with_missed_keys_delivers_the_hits),
        cmocka_unit_test(test_reconfigure_runtime_settings),
        cmocka_unit_test(test_lookup_waits_for_dialing_peer_fake),
        cmocka_unit_test(test_peer_remove_twice_fake),
        cmocka_unit_test(test_lookup_right_after_peer_add_ucx),
        cmocka_unit_test(test_callers_race_the_node_thread_ucx),
        cmocka_unit_test(test_wait_events_leader_races_ucx),
        cmocka_unit_test(test_wait_events_timeout_and_destroy_ucx),
        cmocka_unit_test(test_wait_leader_signals_what_it_leaves_ucx),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
