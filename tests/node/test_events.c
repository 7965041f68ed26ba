/*
 * test_events.c -- KV events (issue 19) on the fake world: a subscriber
 * written against the published format (ZMQ SUB + DEALER for replay,
 * msgpack-c decoding; see src/node/events.h) sees every put and eviction of
 * two nodes in order, exactly once, with no gaps, across a restart of one
 * node (a new incarnation); batches over the high-water mark are dropped
 * without blocking the node, counted, and recovered from replay.
 *
 * The nodes run on the manual clock; ZMQ I/O is real, so waits for delivery
 * are bounded in real time (scaled by KVPEER_TEST_TIME_SCALE).
 */
#include "world.h"

#include <msgpack.h>
#include <time.h>
#include <zmq.h>

#define MS KVP_NSEC_PER_MSEC
static const void *unused_world_wait_ __attribute__((unused)) = (const void *)world_wait;
#define SUB_MAX_LOG 1024
#define SUB_MAX_KEYS 256

enum { EV_STORED = 1, EV_REMOVED = 2, EV_CLEARED = 3 };

typedef struct logent {
    uint64_t incarnation, seq;
    int kind;
    char key[KVP_KEY_MAX + 1];
} logent_t;

typedef struct sub_node {
    char id[64];
    void *dealer; /* replay */
    uint64_t incarnation, next_seq;
    uint64_t applied; /* batches applied in this incarnation: == next_seq means no hole */
    bool known;
    char keys[SUB_MAX_KEYS][KVP_KEY_MAX + 1];
    uint32_t n_keys;
    logent_t log[SUB_MAX_LOG];
    uint32_t n_log;
} sub_node_t;

typedef struct sub {
    world_t *w; /* caller-driven nodes: stepped while waiting for a replay */
    void *ctx, *sock;
    sub_node_t node[2];
    uint64_t gaps, replays, lost;
} sub_t;

static void keyset_apply(sub_node_t *s, int kind, const char *key)
{
    if (kind == EV_CLEARED) {
        s->n_keys = 0;
        return;
    }
    for (uint32_t i = 0; i < s->n_keys; i++) {
        if (strcmp(s->keys[i], key) == 0) {
            if (kind == EV_REMOVED)
                memcpy(s->keys[i], s->keys[--s->n_keys], sizeof(s->keys[i]));
            return;
        }
    }
    if (kind == EV_STORED && s->n_keys < SUB_MAX_KEYS)
        snprintf(s->keys[s->n_keys++], sizeof(s->keys[0]), "%s", key);
}

static bool keyset_has(const sub_node_t *s, const char *key)
{
    for (uint32_t i = 0; i < s->n_keys; i++)
        if (strcmp(s->keys[i], key) == 0)
            return true;
    return false;
}

static bool obj_str_eq(const msgpack_object *o, const char *s)
{
    return o->type == MSGPACK_OBJECT_STR && o->via.str.size == strlen(s) &&
           memcmp(o->via.str.ptr, s, o->via.str.size) == 0;
}

/* Decode [ts, events, dp_rank, incarnation]: every field is checked. */
static bool batch_decode(const void *buf, size_t len, msgpack_unpacked *up, uint64_t *inc,
                         const msgpack_object **events)
{
    size_t off = 0;
    if (msgpack_unpack_next(up, buf, len, &off) != MSGPACK_UNPACK_SUCCESS || off != len)
        return false;
    const msgpack_object *b = &up->data;
    if (b->type != MSGPACK_OBJECT_ARRAY || b->via.array.size != 4 ||
        b->via.array.ptr[0].type != MSGPACK_OBJECT_FLOAT64 ||
        b->via.array.ptr[1].type != MSGPACK_OBJECT_ARRAY ||
        b->via.array.ptr[3].type != MSGPACK_OBJECT_POSITIVE_INTEGER)
        return false;
    *inc = b->via.array.ptr[3].via.u64;
    *events = &b->via.array.ptr[1];
    return true;
}

static void batch_apply(sub_node_t *s, uint64_t seq, const msgpack_object *events)
{
    s->applied++;
    for (uint32_t i = 0; i < events->via.array.size; i++) {
        const msgpack_object *e = &events->via.array.ptr[i];
        assert_int_equal(e->type, MSGPACK_OBJECT_ARRAY);
        const msgpack_object *tag = &e->via.array.ptr[0];
        int kind = obj_str_eq(tag, "BlockStored")    ? EV_STORED
                   : obj_str_eq(tag, "BlockRemoved") ? EV_REMOVED
                   : obj_str_eq(tag, "AllBlocksCleared") ? EV_CLEARED
                                                       : 0;
        assert_int_not_equal(kind, 0);
        assert_int_equal(e->via.array.size, kind == EV_STORED ? 8 : kind == EV_REMOVED ? 3 : 1);
        uint32_t nk = kind == EV_CLEARED ? 1 : e->via.array.ptr[1].via.array.size;
        for (uint32_t k = 0; k < nk; k++) {
            char key[KVP_KEY_MAX + 1] = "";
            if (kind != EV_CLEARED) {
                const msgpack_object *ko = &e->via.array.ptr[1].via.array.ptr[k];
                assert_int_equal(ko->type, MSGPACK_OBJECT_BIN);
                assert_true(ko->via.bin.size <= KVP_KEY_MAX);
                memcpy(key, ko->via.bin.ptr, ko->via.bin.size);
            }
            keyset_apply(s, kind, key);
            assert_true(s->n_log < SUB_MAX_LOG);
            logent_t *l = &s->log[s->n_log++];
            l->incarnation = s->incarnation;
            l->seq = seq;
            l->kind = kind;
            snprintf(l->key, sizeof(l->key), "%s", key);
        }
    }
}

static uint64_t be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

static int recv_parts(void *sock, uint8_t bufs[][65536], size_t *lens, int max, int flags)
{
    int n = 0, more = 1;
    size_t ml = sizeof(more);
    while (more) {
        int got = zmq_recv(sock, bufs[n < max ? n : max - 1], 65536, flags);
        if (got < 0)
            return n ? n : -1;
        assert_true(got <= 65536); /* nothing truncated */
        if (n < max)
            lens[n] = (size_t)got;
        n++;
        zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &ml);
        flags = 0;
    }
    return n;
}

static uint8_t g_bufs[4][65536];
static uint64_t real_ms(void);

/* Replay batches >= start of s's current incarnation, in order. */
static void sub_replay(sub_t *sb, sub_node_t *s, uint64_t start)
{
    uint8_t req[8];
    for (int i = 0; i < 8; i++)
        req[i] = (uint8_t)(start >> (56 - 8 * i));
    assert_int_equal(zmq_send(s->dealer, "", 0, ZMQ_SNDMORE), 0);
    assert_int_equal(zmq_send(s->dealer, req, 8, 0), 8);
    sb->replays++;
    uint64_t end = real_ms() + (uint64_t)(5000 * kvp_test_time_scale());
    for (;;) {
        size_t lens[4];
        int n;
        while ((n = recv_parts(s->dealer, g_bufs, lens, 4, ZMQ_DONTWAIT)) < 0 &&
               real_ms() < end) {
            world_step(sb->w); /* the node answers replays in its poll round */
            zmq_pollitem_t it = {s->dealer, 0, ZMQ_POLLIN, 0};
            zmq_poll(&it, 1, 2);
        }
        assert_int_equal(n, 3); /* [empty, seq, payload] */
        uint64_t seq = be64(g_bufs[1]);
        if (seq == UINT64_MAX)
            return; /* END_SEQ */
        msgpack_unpacked up;
        msgpack_unpacked_init(&up);
        uint64_t inc = 0;
        const msgpack_object *evs = NULL;
        assert_true(batch_decode(g_bufs[2], lens[2], &up, &inc, &evs));
        if (inc == s->incarnation && seq >= s->next_seq) {
            sb->lost += seq - s->next_seq;
            batch_apply(s, seq, evs);
            s->next_seq = seq + 1;
        }
        msgpack_unpacked_destroy(&up);
    }
}

static void sub_on_batch(sub_t *sb, const char *topic, size_t topic_len, uint64_t seq,
                         const void *payload, size_t len)
{
    sub_node_t *s = NULL;
    for (int i = 0; i < 2; i++) {
        size_t idl = strlen(sb->node[i].id);
        if (topic_len > 3 + idl && memcmp(topic + 3, sb->node[i].id, idl) == 0 &&
            topic[3 + idl] == '@')
            s = &sb->node[i];
    }
    assert_non_null(s);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    uint64_t inc = 0;
    const msgpack_object *evs = NULL;
    assert_true(batch_decode(payload, len, &up, &inc, &evs));
    if (!s->known || inc != s->incarnation) { /* a new stream (first seen or restarted) */
        s->known = true;
        s->incarnation = inc;
        s->next_seq = 0;
        s->applied = 0;
    }
    if (seq > s->next_seq) {
        sb->gaps++;
        sub_replay(sb, s, s->next_seq);
    }
    if (seq == s->next_seq) {
        batch_apply(s, seq, evs);
        s->next_seq++;
    }
    msgpack_unpacked_destroy(&up);
}

/* Take what has arrived, waiting at most wait_ms (real time). */
static void sub_poll(sub_t *sb, int wait_ms)
{
    zmq_pollitem_t it = {sb->sock, 0, ZMQ_POLLIN, 0};
    while (zmq_poll(&it, 1, wait_ms) > 0) {
        size_t lens[4];
        int n = recv_parts(sb->sock, g_bufs, lens, 4, ZMQ_DONTWAIT);
        if (n < 0)
            break;
        assert_int_equal(n, 3); /* topic, seq, payload */
        assert_int_equal(lens[1], 8);
        sub_on_batch(sb, (const char *)g_bufs[0], lens[0], be64(g_bufs[1]), g_bufs[2], lens[2]);
        wait_ms = 0;
    }
}

static void sub_connect(sub_t *sb, int i, world_t *w)
{
    sub_node_t *s = &sb->node[i];
    snprintf(s->id, sizeof(s->id), "%s", kvp_node_peer_id(w->node[i]));
    const char *pub = kvp_node_kv_events_endpoint(w->node[i], 0);
    const char *rep = kvp_node_kv_events_endpoint(w->node[i], 1);
    assert_non_null(pub);
    assert_non_null(rep);
    assert_int_equal(zmq_connect(sb->sock, pub), 0);
    if (s->dealer == NULL) {
        s->dealer = zmq_socket(sb->ctx, ZMQ_DEALER);
        int zero = 0;
        zmq_setsockopt(s->dealer, ZMQ_LINGER, &zero, sizeof(zero));
        assert_int_equal(zmq_connect(s->dealer, rep), 0);
    }
}

static void sub_init(sub_t *sb, world_t *w, int rcvhwm)
{
    memset(sb, 0, sizeof(*sb));
    sb->w = w;
    sb->ctx = zmq_ctx_new();
    sb->sock = zmq_socket(sb->ctx, ZMQ_SUB);
    int zero = 0;
    zmq_setsockopt(sb->sock, ZMQ_LINGER, &zero, sizeof(zero));
    if (rcvhwm > 0)
        zmq_setsockopt(sb->sock, ZMQ_RCVHWM, &rcvhwm, sizeof(rcvhwm));
    assert_int_equal(zmq_setsockopt(sb->sock, ZMQ_SUBSCRIBE, "kv@", 3), 0);
}

static void sub_fini(sub_t *sb)
{
    for (int i = 0; i < 2; i++)
        if (sb->node[i].dealer)
            zmq_close(sb->node[i].dealer);
    zmq_close(sb->sock);
    zmq_ctx_term(sb->ctx);
}

static uint64_t real_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Step the world and take events until node i's map has n_keys keys under
 * an incarnation other than not_inc (0 = any), at most 10 s (scaled). */
static bool pump_until(world_t *w, sub_t *sb, int i, uint32_t n_keys, uint64_t not_inc)
{
    uint64_t end = real_ms() + (uint64_t)(10000 * kvp_test_time_scale());
    while (real_ms() < end) {
        world_step(w);
        sub_poll(sb, 5);
        const sub_node_t *s = &sb->node[i];
        if (s->known && s->n_keys == n_keys && s->incarnation != not_inc)
            return true;
    }
    return false;
}

static char g_ep[2][2][256]; /* node, {pub, replay}: the bound endpoints, for restarts */

static void events_tweak(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    (void)s;
    c->num_blocks = 16;
    c->kv_events_endpoint = g_ep[i][0][0] ? g_ep[i][0] : "tcp://127.0.0.1:*";
    c->kv_events_replay_endpoint = g_ep[i][1][0] ? g_ep[i][1] : "tcp://127.0.0.1:*";
}

static void expect_log(const sub_node_t *s, uint32_t from, const int *kinds, char keys[][16],
                       uint32_t n)
{
    assert_true(s->n_log >= from + n);
    for (uint32_t k = 0; k < n; k++) {
        const logent_t *l = &s->log[from + k];
        if (l->kind != kinds[k] || strcmp(l->key, keys[k]) != 0)
            fail_msg("event %u: got kind %d key '%s', want kind %d key '%s'", from + k, l->kind,
                     l->key, kinds[k], keys[k]);
    }
}

/* Each incarnation's events come in sequence order from seq 0, and every
 * batch 0..next_seq-1 of the current one was applied exactly once (batches
 * without events -- the idle ones -- leave no log entry). */
static void expect_contiguous(const sub_node_t *s)
{
    for (uint32_t k = 1; k < s->n_log; k++) {
        const logent_t *a = &s->log[k - 1], *b = &s->log[k];
        if (a->incarnation == b->incarnation)
            assert_true(b->seq >= a->seq);
        else
            assert_int_equal(b->seq, 0);
    }
    assert_int_equal(s->log[0].seq, 0);
    assert_int_equal(s->applied, s->next_seq);
}

/* Every put and eviction of two nodes, in order, across a restart. The
 * model: 16 slots, no reads, so the (16+i)th put evicts the i-th (LRU).
 * Mutations tried: no remove callback from the store (evictions not
 * published) -> the map never shrinks to 16 keys; subscriber without
 * replay -> the late-joined streams miss seq 0.. and the logs differ. */
static void test_events_every_put_and_evict_across_restart(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    memset(g_ep, 0, sizeof(g_ep));
    world_init(w, 2, events_tweak);
    for (int i = 0; i < 2; i++) {
        snprintf(g_ep[i][0], 256, "%s", kvp_node_kv_events_endpoint(w->node[i], 0));
        snprintf(g_ep[i][1], 256, "%s", kvp_node_kv_events_endpoint(w->node[i], 1));
    }
    sub_t *sb = malloc(sizeof(*sb));
    sub_init(sb, w, 0);
    sub_connect(sb, 0, w);
    sub_connect(sb, 1, w);
    static int kinds[128];
    static char keys[128][16];
    uint32_t n = 0;
    kinds[n] = EV_CLEARED, keys[n++][0] = '\0';
    for (uint32_t k = 0; k < 40; k++) {
        world_put(w, 0, k, 0);
        if (k >= 16) {
            kinds[n] = EV_REMOVED;
            world_key(k - 16, (uint8_t *)keys[n++]);
        }
        kinds[n] = EV_STORED;
        world_key(k, (uint8_t *)keys[n++]);
        if (k % 7 == 0)
            world_step(w); /* several batches */
    }
    for (uint32_t k = 100; k < 110; k++)
        world_put(w, 1, k, 0);
    assert_true(pump_until(w, sb, 0, 16, 0));
    assert_true(pump_until(w, sb, 1, 10, 0));
    expect_log(&sb->node[0], 0, kinds, keys, n);
    assert_int_equal(sb->node[0].n_log, n); /* nothing more, nothing twice */
    for (uint32_t k = 24; k < 40; k++) {
        char key[32];
        world_key(k, (uint8_t *)key);
        assert_true(keyset_has(&sb->node[0], key));
    }
    expect_contiguous(&sb->node[0]);
    assert_int_equal(world_stats(w, 0).evictions, 24);

    /* Restart node 1 on the same endpoints: a new incarnation. */
    uint64_t old_inc = sb->node[1].incarnation;
    uint32_t old_n = sb->node[1].n_log;
    world_stop_node(w, 1);
    w->cfg[1].kv_events_endpoint = g_ep[1][0]; /* the same endpoints as before */
    w->cfg[1].kv_events_replay_endpoint = g_ep[1][1];
    assert_int_equal(world_start_node(w, 1), KVP_OK);
    assert_string_equal(kvp_node_kv_events_endpoint(w->node[1], 0), g_ep[1][0]);
    for (uint32_t k = 200; k < 205; k++)
        world_put(w, 1, k, 0);
    assert_true(pump_until(w, sb, 1, 5, old_inc));
    const sub_node_t *s1 = &sb->node[1];
    n = 0;
    kinds[n] = EV_CLEARED, keys[n++][0] = '\0';
    for (uint32_t k = 100; k < 110; k++) {
        kinds[n] = EV_STORED;
        world_key(k, (uint8_t *)keys[n++]);
    }
    expect_log(s1, 0, kinds, keys, n); /* the old incarnation, complete */
    uint32_t from = n;
    while (from < s1->n_log && s1->log[from].incarnation == old_inc)
        from++; /* its goodbye [AllBlocksCleared], if it was received */
    assert_true(from - n <= 1);
    assert_true(from >= old_n);
    n = 0;
    kinds[n] = EV_CLEARED, keys[n++][0] = '\0';
    for (uint32_t k = 200; k < 205; k++) {
        kinds[n] = EV_STORED;
        world_key(k, (uint8_t *)keys[n++]);
    }
    expect_log(s1, from, kinds, keys, n);
    assert_int_equal(s1->n_log, from + n);
    expect_contiguous(s1);
    assert_int_equal(sb->lost, 0);
    assert_true(sb->replays >= 1); /* the late joins went through replay */
    sub_fini(sb);
    free(sb);
    world_fini(w, false);
    free(w);
}

static void hwm_tweak(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    (void)s;
    (void)i;
    c->num_blocks = 16;
    c->kv_events_endpoint = "tcp://127.0.0.1:*";
    c->kv_events_replay_endpoint = "tcp://127.0.0.1:*";
    c->kv_events_hwm = 1;
}

/* A subscriber that does not read: batches over the high-water mark are
 * dropped at once (the node never waits), counted, and a subscriber that
 * reads later recovers every one of them from replay. Mutation tried: send
 * without ZMQ_XPUB_NODROP -> drops invisible, kv_event_batches_dropped 0. */
static void test_events_hwm_drops_counted_and_replayed(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    world_init(w, 1, hwm_tweak);
    sub_t *sb = malloc(sizeof(*sb));
    sub_init(sb, w, 1);
    sub_connect(sb, 0, w);
    /* Let the subscription reach the publisher (idle batches flow). */
    uint64_t end = real_ms() + (uint64_t)(5000 * kvp_test_time_scale());
    while (!sb->node[0].known && real_ms() < end) {
        world_step(w);
        sub_poll(sb, 20);
    }
    assert_true(sb->node[0].known);
    uint64_t t0 = real_ms();
    for (uint32_t k = 0; k < 400; k++) { /* one batch per step, nobody reading */
        world_put(w, 0, k, 0);
        world_step(w);
    }
    uint64_t took = real_ms() - t0;
    kvp_stats_t st = world_stats(w, 0);
    assert_true(st.kv_event_batches_dropped > 0);
    assert_int_equal(st.kv_events, 1 + 400 + 384);
    fprintf(stderr, "hwm 1: %llu batches published, %llu dropped, 400 puts in %llu ms\n",
            (unsigned long long)st.kv_event_batches, (unsigned long long)st.kv_event_batches_dropped,
            (unsigned long long)took);
    assert_true(pump_until(w, sb, 0, 16, 0));
    end = real_ms() + (uint64_t)(5000 * kvp_test_time_scale());
    while (sb->node[0].n_log < 1 + 400 + 384 && real_ms() < end) {
        world_step(w);
        sub_poll(sb, 20);
    }
    assert_int_equal(sb->node[0].n_log, 1 + 400 + 384); /* every event, once */
    assert_true(sb->gaps >= 1);
    assert_int_equal(sb->lost, 0);
    expect_contiguous(&sb->node[0]);
    for (uint32_t k = 384; k < 400; k++) {
        char key[32];
        world_key(k, (uint8_t *)key);
        assert_true(keyset_has(&sb->node[0], key));
    }
    sub_fini(sb);
    free(sb);
    world_fini(w, false);
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_events_every_put_and_evict_across_restart),
        cmocka_unit_test(test_events_hwm_drops_counted_and_replayed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
