/* wire_testutil.h -- sample messages of every type for the wire tests
 * (header-only, static). A wt_sample_t owns the arrays its message points
 * to, so it must not be copied or moved while the message is used. */
#ifndef KVP_WIRE_TESTUTIL_H
#define KVP_WIRE_TESTUTIL_H

#include "testutil.h"
#include "wire/wire.h"

#define WT_NKEYS 4

typedef struct wt_sample {
    kvp_msg_t m;
    uint8_t keybytes[WT_NKEYS][KVP_WIRE_KEY_MAX];
    kvp_key_t keys[WT_NKEYS];
    kvp_fetch_item_t items[WT_NKEYS];
    kvp_fetch_block_t blocks[WT_NKEYS];
    uint8_t results[WT_NKEYS];
    uint8_t blob[40];
} wt_sample_t;

static const uint16_t wt_all_types[] = {
    KVP_MSG_HELLO,       KVP_MSG_AUTH,  KVP_MSG_HELLO_ACK,  KVP_MSG_PING,
    KVP_MSG_PONG,        KVP_MSG_BYE,   KVP_MSG_LOOKUP,     KVP_MSG_LOOKUP_RESP,
    KVP_MSG_FETCH,       KVP_MSG_FETCH_DONE, KVP_MSG_ABORT, KVP_MSG_ABORT_ACK,
};

static inline void wt_epoch(kvp_epoch_t *e, uint8_t v)
{
    for (size_t i = 0; i < KVP_WIRE_EPOCH_LEN; i++)
        e->b[i] = (uint8_t)(v + i);
}

static inline void wt_sample_keys(wt_sample_t *s)
{
    /* Key lengths 1, 32, 64 (the bounds) and 7. */
    static const uint32_t lens[WT_NKEYS] = {1, 32, KVP_WIRE_KEY_MAX, 7};
    for (int i = 0; i < WT_NKEYS; i++) {
        for (uint32_t j = 0; j < KVP_WIRE_KEY_MAX; j++)
            s->keybytes[i][j] = (uint8_t)(i * 31 + j + 1);
        s->keys[i].data = s->keybytes[i];
        s->keys[i].len = lens[i];
        s->items[i].key = s->keys[i];
        s->items[i].dst_slot = (uint32_t)(10 * i + 3);
        s->items[i].dst_gen = 0xA0000000u + (uint32_t)i;
        s->blocks[i].ok = (uint8_t)(i & 1);
        s->blocks[i].digest.lo = 0x0102030405060708ull * (uint64_t)(i + 1);
        s->blocks[i].digest.hi = 0xF0E0D0C0B0A09080ull ^ (uint64_t)i;
        s->results[i] = (uint8_t)(i % 2 == 0 ? KVP_LOOKUP_HIT : KVP_LOOKUP_MISS);
    }
}

static inline void wt_sample_hello(kvp_msg_hello_t *h)
{
    h->major = KVP_WIRE_MAJOR;
    h->minor = 7;
    snprintf(h->peer_id, sizeof(h->peer_id), "node-a.example:4100");
    snprintf(h->instance_id, sizeof(h->instance_id), "inst-0123456789");
    wt_epoch(&h->epoch, 0x51);
    h->num_blocks = 4096;
    h->block_size = 1u << 20;
    h->fingerprint = 0x1122334455667788ull;
    h->hash_seed = 0x8877665544332211ull;
    for (unsigned i = 0; i < KVP_WIRE_NONCE_LEN; i++)
        h->nonce[i] = (uint8_t)(0xC0 + i);
    h->flags = KVP_HELLO_AUTH_REQUIRED;
}

/* A valid message of `type` with distinctive values in every field. */
static inline void wt_sample(wt_sample_t *s, uint16_t type)
{
    memset(s, 0, sizeof(*s));
    wt_sample_keys(s);
    for (size_t i = 0; i < sizeof(s->blob); i++)
        s->blob[i] = (uint8_t)(0x80 ^ i);
    kvp_msg_t *m = &s->m;
    m->type = type;
    m->flags = 0x0102;
    if (type != KVP_MSG_HELLO) {
        wt_epoch(&m->src_epoch, 0x11);
        wt_epoch(&m->dst_epoch, 0x22);
    }
    switch (type) {
    case KVP_MSG_HELLO: wt_sample_hello(&m->u.hello); break;
    case KVP_MSG_AUTH:
        for (unsigned i = 0; i < KVP_WIRE_MAC_LEN; i++)
            m->u.auth.mac[i] = (uint8_t)(0x30 + i);
        break;
    case KVP_MSG_HELLO_ACK:
        wt_epoch(&m->u.hello_ack.acked_epoch, 0x22);
        m->u.hello_ack.blob = s->blob;
        m->u.hello_ack.blob_len = sizeof(s->blob);
        break;
    case KVP_MSG_PING:
    case KVP_MSG_PONG:
        m->u.ping.seq = 0x0000000100000002ull + type;
        m->u.ping.sent_ns = 0x7FFF000011112222ull;
        break;
    case KVP_MSG_BYE: /* minor 1: the refusal names our compat string */
        m->u.bye.reason = KVP_BYE_INCOMPATIBLE;
        snprintf(m->u.bye.compat, sizeof(m->u.bye.compat), "llama-3-8b/bf16/16");
        break;
    case KVP_MSG_LOOKUP:
        m->u.lookup = (kvp_msg_lookup_t){0x1111222233334444ull, 5, WT_NKEYS, s->keys};
        break;
    case KVP_MSG_LOOKUP_RESP:
        m->u.lookup_resp = (kvp_msg_lookup_resp_t){0x1111222233334444ull, 5, WT_NKEYS, s->results};
        break;
    case KVP_MSG_FETCH:
        m->u.fetch = (kvp_msg_fetch_t){0xABCDull, 9, KVP_FETCH_WAIT_FOR_SUPPLY, WT_NKEYS, s->items};
        break;
    case KVP_MSG_FETCH_DONE:
        m->u.fetch_done = (kvp_msg_fetch_done_t){0xABCDull, 9, KVP_ERR_CHECKSUM, WT_NKEYS, s->blocks};
        break;
    case KVP_MSG_ABORT:
    case KVP_MSG_ABORT_ACK: m->u.abort = (kvp_msg_abort_t){0xDEADBEEFull + type, 77}; break;
    }
}

/* Little-endian patch helpers for hand-made malformed frames. */
static inline void wt_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void wt_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

#endif
