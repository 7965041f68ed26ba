/*
 * events.c -- the KV-event publisher (events.h): ZMQ PUB + ROUTER (replay),
 * msgpack batches in vLLM's KVEventBatch format. libzmq and msgpack-c do
 * the work; this file only decides what goes in a batch and when.
 *
 * Memory: the open batch is a fixed array of KVP_KVEV_BATCH_MAX events
 * (preallocated); each published batch's payload is one allocation owned by
 * the replay ring until the ring overwrites it or the publisher is destroyed.
 */
#include "node/events.h"
#include "store/store.h" /* KVP_KEY_MAX */

#include <errno.h>
#include <msgpack.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

#define KVP_KVEV_BATCH_MAX 256u /* events per batch; a full batch is published at once */
#define KVP_KVEV_REPLAY_PER_FLUSH 16 /* replay requests answered per flush (bounded work) */
#define KVP_KVEV_ENDPOINT_MAX 256
/* A batch without events goes out when nothing was published for this long:
 * PUB drops what is sent before a subscriber's (re)connection completes, so
 * without it a subscriber would not learn of a gap or of a restarted node's
 * new incarnation until the node's store next changes. */
#define KVP_KVEV_IDLE_NS (1000ull * KVP_NSEC_PER_MSEC)

enum { KVEV_STORED = 1, KVEV_REMOVED = 2, KVEV_CLEARED = 3 };

typedef struct kvev_item {
    uint8_t kind;
    uint8_t key_len;
    uint8_t key[KVP_KEY_MAX];
} kvev_item_t;

typedef struct kvev_replay {
    uint64_t seq;
    uint8_t *buf; /* owned; NULL = empty entry */
    size_t len;
} kvev_replay_t;

struct kvp_kvevents {
    void *ctx, *pub, *router;
    char endpoint[KVP_KVEV_ENDPOINT_MAX], replay_endpoint[KVP_KVEV_ENDPOINT_MAX];
    char *topic;
    size_t topic_len;
    char log_prefix[64];
    uint64_t incarnation;
    uint64_t next_seq;
    uint64_t last_pub_ns; /* real clock: the idle batch */
    /* the open batch */
    kvev_item_t items[KVP_KVEV_BATCH_MAX];
    uint32_t n_items;
    /* the last ring_n published batches; ring_head = next to write = oldest */
    kvev_replay_t *ring;
    uint32_t ring_n, ring_head;
    msgpack_sbuffer sbuf;
    kvp_kvevents_stats_t st;
};

/* ------------------------------------------------------------ encoding */

static void pack_str(msgpack_packer *pk, const char *s)
{
    size_t n = strlen(s);
    msgpack_pack_str(pk, n);
    msgpack_pack_str_body(pk, s, n);
}

static void pack_item(msgpack_packer *pk, const kvev_item_t *it)
{
    switch (it->kind) {
    case KVEV_STORED:
        msgpack_pack_array(pk, 8);
        pack_str(pk, "BlockStored");
        msgpack_pack_array(pk, 1); /* block_hashes: the key, as bytes */
        msgpack_pack_bin(pk, it->key_len);
        msgpack_pack_bin_body(pk, it->key, it->key_len);
        msgpack_pack_nil(pk);      /* parent_block_hash: kvpeer keys stand alone */
        msgpack_pack_array(pk, 0); /* token_ids: not known to kvpeer */
        msgpack_pack_uint32(pk, 0); /* block_size in tokens: not known to kvpeer */
        msgpack_pack_nil(pk);      /* lora_id */
        pack_str(pk, "CPU");       /* medium: host memory */
        msgpack_pack_nil(pk);      /* lora_name */
        break;
    case KVEV_REMOVED:
        msgpack_pack_array(pk, 3);
        pack_str(pk, "BlockRemoved");
        msgpack_pack_array(pk, 1);
        msgpack_pack_bin(pk, it->key_len);
        msgpack_pack_bin_body(pk, it->key, it->key_len);
        pack_str(pk, "CPU");
        break;
    default:
        msgpack_pack_array(pk, 1);
        pack_str(pk, "AllBlocksCleared");
        break;
    }
}

static double wall_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* [ts, [events], data_parallel_rank, incarnation] into e->sbuf. */
static void encode_batch(kvp_kvevents_t *e)
{
    msgpack_packer pk;
    msgpack_sbuffer_clear(&e->sbuf);
    msgpack_packer_init(&pk, &e->sbuf, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 4);
    msgpack_pack_double(&pk, wall_seconds());
    msgpack_pack_array(&pk, e->n_items);
    for (uint32_t i = 0; i < e->n_items; i++)
        pack_item(&pk, &e->items[i]);
    msgpack_pack_uint32(&pk, 0);
    msgpack_pack_uint64(&pk, e->incarnation);
}

/* ------------------------------------------------------------- sending */

static void seq_bytes(uint64_t seq, uint8_t out[8])
{
    for (int i = 0; i < 8; i++)
        out[i] = (uint8_t)(seq >> (56 - 8 * i));
}

/* One multipart message, never blocking. false: not sent (EAGAIN at the
 * high-water mark, or an error, logged). */
static bool send_multipart(kvp_kvevents_t *e, void *sock, const void *const *parts,
                           const size_t *lens, int n)
{
    for (int i = 0; i < n; i++) {
        int flags = ZMQ_DONTWAIT | (i + 1 < n ? ZMQ_SNDMORE : 0);
        if (zmq_send(sock, parts[i], lens[i], flags) < 0) {
            if (i > 0 || errno != EAGAIN) /* libzmq queues the rest once the first part went */
                KVP_WARN(e->log_prefix, "kv events: send failed at part %d: %s", i,
                         zmq_strerror(errno));
            return false;
        }
    }
    return true;
}

/* Keep the published batch for replay (ring of replay_n). On allocation
 * failure the batch is simply not replayable (logged). */
static void ring_keep(kvp_kvevents_t *e, uint64_t seq)
{
    /* ring_head is the next entry to write: the oldest batch once the ring
     * has wrapped, so replays read from ring_head onwards, oldest first. */
    kvev_replay_t *r = &e->ring[e->ring_head];
    kvp__free(r->buf);
    r->buf = kvp__malloc(e->sbuf.size);
    r->len = r->buf ? e->sbuf.size : 0;
    r->seq = seq;
    if (r->buf != NULL)
        memcpy(r->buf, e->sbuf.data, e->sbuf.size);
    else
        KVP_WARN(e->log_prefix, "kv events: out of memory keeping batch %llu for replay",
                 (unsigned long long)seq);
    e->ring_head = (e->ring_head + 1) % e->ring_n;
}

static void publish_open_batch(kvp_kvevents_t *e)
{
    uint64_t now = kvp_clock_now(kvp_clock_real());
    if (e->n_items == 0 && now - e->last_pub_ns < KVP_KVEV_IDLE_NS)
        return;
    e->last_pub_ns = now;
    uint64_t seq = e->next_seq++;
    uint8_t sb[8];
    seq_bytes(seq, sb);
    encode_batch(e);
    e->n_items = 0;
    const void *parts[3] = {e->topic, sb, e->sbuf.data};
    size_t lens[3] = {e->topic_len, 8, e->sbuf.size};
    if (send_multipart(e, e->pub, parts, lens, 3))
        e->st.batches_published++;
    else
        e->st.batches_dropped++; /* the subscriber sees the gap and replays it */
    ring_keep(e, seq);
}

static void push_item(kvp_kvevents_t *e, uint8_t kind, const void *key, uint32_t key_len)
{
    if (e->n_items == KVP_KVEV_BATCH_MAX)
        publish_open_batch(e);
    kvev_item_t *it = &e->items[e->n_items++];
    it->kind = kind;
    it->key_len = (uint8_t)KVP_MIN(key_len, KVP_KEY_MAX);
    if (it->key_len)
        memcpy(it->key, key, it->key_len);
    e->st.events++;
}

void kvp__kvevents_stored(kvp_kvevents_t *e, const void *key, uint32_t key_len)
{
    push_item(e, KVEV_STORED, key, key_len);
}

void kvp__kvevents_removed(kvp_kvevents_t *e, const void *key, uint32_t key_len)
{
    push_item(e, KVEV_REMOVED, key, key_len);
}

void kvp__kvevents_cleared(kvp_kvevents_t *e)
{
    push_item(e, KVEV_CLEARED, NULL, 0);
}

/* -------------------------------------------------------------- replay */

/* Read one request [identity, empty, start seq (8 bytes)]; anything else
 * is drained and ignored. Returns false when nothing is waiting. */
static bool replay_recv(kvp_kvevents_t *e, uint8_t *id, size_t *id_len, uint64_t *start,
                        bool *valid)
{
    uint8_t buf[3][256];
    int lens[3] = {0, 0, 0}, nparts = 0;
    int more = 1;
    size_t more_len = sizeof(more);
    *valid = false;
    while (more) {
        int got = zmq_recv(e->router, nparts < 3 ? buf[nparts] : buf[2], 256, ZMQ_DONTWAIT);
        if (got < 0)
            return nparts > 0; /* EAGAIN before any part: nothing waiting */
        if (nparts < 3)
            lens[nparts] = got;
        nparts++;
        if (zmq_getsockopt(e->router, ZMQ_RCVMORE, &more, &more_len) != 0)
            more = 0;
    }
    if (nparts != 3 || lens[0] > 255 || lens[1] != 0 || lens[2] != 8)
        return true;
    memcpy(id, buf[0], (size_t)lens[0]);
    *id_len = (size_t)lens[0];
    *start = 0;
    for (int i = 0; i < 8; i++)
        *start = *start << 8 | buf[2][i];
    *valid = true;
    return true;
}

static void replay_serve(kvp_kvevents_t *e, const uint8_t *id, size_t id_len, uint64_t start)
{
    for (uint32_t k = 0; k < e->ring_n; k++) {
        const kvev_replay_t *r = &e->ring[(e->ring_head + k) % e->ring_n];
        if (r->buf == NULL || r->seq < start)
            continue;
        uint8_t sb[8];
        seq_bytes(r->seq, sb);
        const void *parts[4] = {id, "", sb, r->buf};
        size_t lens[4] = {id_len, 0, 8, r->len};
        if (!send_multipart(e, e->router, parts, lens, 4))
            return; /* the requester's queue is full: it sees the gap and asks again */
    }
    uint8_t end[8];
    memset(end, 0xff, sizeof(end)); /* -1, as vLLM's END_SEQ */
    const void *parts[4] = {id, "", end, ""};
    size_t lens[4] = {id_len, 0, 8, 0};
    if (send_multipart(e, e->router, parts, lens, 4))
        e->st.replays_served++;
}

void kvp__kvevents_flush(kvp_kvevents_t *e)
{
    publish_open_batch(e);
    for (int i = 0; e->router != NULL && i < KVP_KVEV_REPLAY_PER_FLUSH; i++) {
        uint8_t id[256];
        size_t id_len = 0;
        uint64_t start = 0;
        bool valid = false;
        if (!replay_recv(e, id, &id_len, &start, &valid))
            break;
        if (valid)
            replay_serve(e, id, id_len, start);
    }
}

/* ----------------------------------------------------- create, destroy */

static kvp_status_t bind_socket(kvp_kvevents_t *e, void *sock, const char *ep, char *bound,
                                const char *what)
{
    size_t len = KVP_KVEV_ENDPOINT_MAX;
    if (zmq_bind(sock, ep) != 0) {
        KVP_ERROR(e->log_prefix, "kv events: cannot bind %s socket to '%s': %s", what, ep,
                  zmq_strerror(errno));
        return KVP_ERR_INVALID;
    }
    if (zmq_getsockopt(sock, ZMQ_LAST_ENDPOINT, bound, &len) != 0)
        snprintf(bound, KVP_KVEV_ENDPOINT_MAX, "%s", ep);
    return KVP_OK;
}

static kvp_status_t make_topic(kvp_kvevents_t *e, const kvp_kvevents_config_t *cfg)
{
    const char *model = cfg->model ? cfg->model : "";
    const char *id = cfg->node_id ? cfg->node_id : "";
    e->topic_len = 3 + strlen(id) + 1 + strlen(model);
    if ((e->topic = kvp__malloc(e->topic_len + 1)) == NULL)
        return KVP_ERR_NOMEM;
    snprintf(e->topic, e->topic_len + 1, "kv@%s@%s", id, model);
    for (size_t i = 3; i < e->topic_len; i++) /* '@' separates the fields: none inside them */
        if (e->topic[i] == '@' && i != 3 + strlen(id))
            e->topic[i] = '_';
    return KVP_OK;
}

kvp_status_t kvp__kvevents_create(const kvp_kvevents_config_t *cfg, kvp_kvevents_t **out)
{
    kvp_status_t st = KVP_ERR_NOMEM;
    if (cfg == NULL || cfg->endpoint == NULL || out == NULL)
        return KVP_ERR_INVALID;
    kvp_kvevents_t *e = kvp__calloc(1, sizeof(*e));
    if (e == NULL)
        return KVP_ERR_NOMEM;
    snprintf(e->log_prefix, sizeof(e->log_prefix), "%s", cfg->log_prefix ? cfg->log_prefix : "");
    msgpack_sbuffer_init(&e->sbuf);
    e->ring_n = cfg->replay_batches ? cfg->replay_batches : 1000;
    if ((e->ring = kvp__calloc(e->ring_n, sizeof(*e->ring))) == NULL)
        goto fail;
    if ((st = make_topic(e, cfg)) != KVP_OK)
        goto fail;
    do {
        if ((st = kvp_random_bytes(&e->incarnation, sizeof(e->incarnation))) != KVP_OK)
            goto fail;
    } while (e->incarnation == 0);
    st = KVP_ERR_IO;
    if ((e->ctx = zmq_ctx_new()) == NULL || zmq_ctx_set(e->ctx, ZMQ_IO_THREADS, 1) != 0)
        goto fail;
    if ((e->pub = zmq_socket(e->ctx, ZMQ_PUB)) == NULL)
        goto fail;
    int hwm = (int)(cfg->hwm ? cfg->hwm : 10000), one = 1, linger = 200;
    if (zmq_setsockopt(e->pub, ZMQ_SNDHWM, &hwm, sizeof(hwm)) != 0 ||
        zmq_setsockopt(e->pub, ZMQ_XPUB_NODROP, &one, sizeof(one)) != 0 ||
        zmq_setsockopt(e->pub, ZMQ_LINGER, &linger, sizeof(linger)) != 0)
        goto fail;
    if ((st = bind_socket(e, e->pub, cfg->endpoint, e->endpoint, "PUB")) != KVP_OK)
        goto fail;
    if (cfg->replay_endpoint != NULL) {
        st = KVP_ERR_IO;
        if ((e->router = zmq_socket(e->ctx, ZMQ_ROUTER)) == NULL ||
            zmq_setsockopt(e->router, ZMQ_LINGER, &linger, sizeof(linger)) != 0)
            goto fail;
        st = bind_socket(e, e->router, cfg->replay_endpoint, e->replay_endpoint, "replay");
        if (st != KVP_OK)
            goto fail;
    }
    kvp__kvevents_cleared(e); /* seq 0 of this incarnation */
    kvp__kvevents_flush(e);
    KVP_INFO(e->log_prefix, "kv events: publishing on %s (replay %s), incarnation %016llx",
             e->endpoint, e->replay_endpoint[0] ? e->replay_endpoint : "off",
             (unsigned long long)e->incarnation);
    *out = e;
    return KVP_OK;
fail:
    if (st == KVP_ERR_IO)
        KVP_ERROR(e->log_prefix, "kv events: zmq setup failed: %s", zmq_strerror(errno));
    kvp__kvevents_destroy(e);
    return st;
}

void kvp__kvevents_destroy(kvp_kvevents_t *e)
{
    if (e == NULL)
        return;
    if (e->pub != NULL && e->endpoint[0]) {
        e->n_items = 0; /* whatever was open is superseded: the node's blocks go away */
        kvp__kvevents_cleared(e);
        kvp__kvevents_flush(e);
    }
    if (e->router)
        zmq_close(e->router);
    if (e->pub)
        zmq_close(e->pub);
    if (e->ctx)
        zmq_ctx_term(e->ctx); /* bounded by the sockets' linger (200 ms) */
    for (uint32_t i = 0; e->ring && i < e->ring_n; i++)
        kvp__free(e->ring[i].buf);
    kvp__free(e->ring);
    kvp__free(e->topic);
    msgpack_sbuffer_destroy(&e->sbuf);
    kvp__free(e);
}

const char *kvp__kvevents_endpoint(const kvp_kvevents_t *e)
{
    return e->endpoint;
}

const char *kvp__kvevents_replay_endpoint(const kvp_kvevents_t *e)
{
    return e->replay_endpoint;
}

uint64_t kvp__kvevents_incarnation(const kvp_kvevents_t *e)
{
    return e->incarnation;
}

void kvp__kvevents_get_stats(const kvp_kvevents_t *e, kvp_kvevents_stats_t *out)
{
    *out = e->st;
}
