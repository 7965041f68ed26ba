/*
 * events.h -- KV events for routers (issue 19): every node publishes what
 * its store holds -- block stored, block removed, all blocks cleared -- in
 * the format vLLM engines publish, so that the indexers of llm-d and NVIDIA
 * Dynamo (and our own subscriber, python/kvpeer/router.py) can build a
 * cluster-wide block map.
 *
 * Transport (as vLLM's ZmqEventPublisher): a ZMQ PUB socket sends one
 * three-frame message per batch
 *     topic  "kv@<peer id>@<compat>"   (llm-d: pod id and model from the topic)
 *     seq    u64 big-endian, 0, 1, 2, ... per incarnation of the node
 *     payload msgpack KVEventBatch, array-encoded:
 *         [ts float64, [event, ...], data_parallel_rank 0, incarnation u64]
 * Events (array-encoded, tag first):
 *     ["BlockStored", [key bin], nil, [], 0, nil, "CPU", nil]
 *         block_hashes, parent_block_hash, token_ids, block_size (tokens;
 *         unknown to kvpeer: 0), lora_id, medium (host memory), lora_name
 *     ["BlockRemoved", [key bin], "CPU"]
 *     ["AllBlocksCleared"]
 * The 4th batch element (the incarnation, a random non-zero u64 drawn when
 * the node starts) is kvpeer's; vLLM's decoder and llm-d's ignore trailing
 * elements. Each incarnation's stream starts with seq 0 = [AllBlocksCleared],
 * so a subscriber drops what it knew of the node's previous life.
 *
 * A batch without events is published after a second without any, so that
 * a subscriber that (re)connected after a batch went out (PUB drops what it
 * sends before the subscription arrives) sees the gap, or the new
 * incarnation, within a second and replays.
 *
 * Replay (as vLLM): a ROUTER socket; a subscriber sends [empty, start seq
 * (8 bytes big-endian)] from a DEALER (or REQ) and receives [empty, seq,
 * payload] for every buffered batch with seq >= start, then [empty, -1 as 8
 * bytes, empty]. The last `replay_batches` batches are kept.
 *
 * Never blocks the node thread: every send is ZMQ_DONTWAIT with ZMQ_SNDHWM
 * set and ZMQ_XPUB_NODROP, so a full subscriber queue is seen (EAGAIN) and
 * the batch is counted as dropped -- it keeps its sequence number and stays
 * in the replay buffer, so the subscriber sees a gap and can replay it.
 *
 * Threading: owned by the node's owner thread (store callbacks, flush at the
 * end of each poll round). Endpoints are immutable after create.
 */
#ifndef KVP_NODE_EVENTS_H
#define KVP_NODE_EVENTS_H

#include "common/common.h"

typedef struct kvp_kvevents kvp_kvevents_t;

typedef struct kvp_kvevents_config {
    const char *endpoint;        /* PUB bind address, e.g. "tcp://127.0.0.1:*"; required */
    const char *replay_endpoint; /* ROUTER bind address, or NULL = no replay */
    const char *node_id;         /* the node's peer id (topic) */
    const char *model;           /* the compatibility string (topic) */
    uint32_t hwm;                /* ZMQ_SNDHWM in batches; 0 = 10000 */
    uint32_t replay_batches;     /* batches kept for replay; 0 = 1000 */
    const char *log_prefix;      /* borrowed for the publisher's lifetime */
} kvp_kvevents_config_t;

typedef struct kvp_kvevents_stats {
    uint64_t batches_published; /* sent to the PUB socket */
    uint64_t batches_dropped;   /* EAGAIN at the high-water mark (still replayable) */
    uint64_t events;            /* events put into batches */
    uint64_t replays_served;    /* replay requests answered */
} kvp_kvevents_stats_t;

/* Bind the sockets; the first batch (seq 0) is [AllBlocksCleared]. Strings
 * are copied. KVP_ERR_INVALID for an endpoint ZMQ refuses (logged). */
kvp_status_t kvp__kvevents_create(const kvp_kvevents_config_t *cfg, kvp_kvevents_t **out);
/* Publish a last [AllBlocksCleared] (the node's blocks go away), close the
 * sockets with a short linger (bounded), free everything. NULL is a no-op. */
void kvp__kvevents_destroy(kvp_kvevents_t *e);

/* Queue an event into the open batch (published at the next flush, or at
 * once when the batch is full). */
void kvp__kvevents_stored(kvp_kvevents_t *e, const void *key, uint32_t key_len);
void kvp__kvevents_removed(kvp_kvevents_t *e, const void *key, uint32_t key_len);
void kvp__kvevents_cleared(kvp_kvevents_t *e);

/* Publish the open batch, if any, and answer waiting replay requests. Never
 * blocks. */
void kvp__kvevents_flush(kvp_kvevents_t *e);

/* The bound endpoints (wildcard ports resolved), "" for none. */
const char *kvp__kvevents_endpoint(const kvp_kvevents_t *e);
const char *kvp__kvevents_replay_endpoint(const kvp_kvevents_t *e);
uint64_t kvp__kvevents_incarnation(const kvp_kvevents_t *e);
void kvp__kvevents_get_stats(const kvp_kvevents_t *e, kvp_kvevents_stats_t *out);

#endif /* KVP_NODE_EVENTS_H */
