/*
 * wire_eq.c -- kvp_wire_msg_eq: deep comparison of two messages, so a test
 * or the fuzz target can check decode(encode(m)) == m field by field.
 */
#include "wire/wire_int.h"

static bool key_eq(const kvp_key_t *a, const kvp_key_t *b)
{
    return a->len == b->len && (a->len == 0 || memcmp(a->data, b->data, a->len) == 0);
}

static bool hello_eq(const kvp_msg_hello_t *a, const kvp_msg_hello_t *b)
{
    return a->major == b->major && a->minor == b->minor &&
           strcmp(a->peer_id, b->peer_id) == 0 && strcmp(a->instance_id, b->instance_id) == 0 &&
           kvp_epoch_eq(&a->epoch, &b->epoch) && a->num_blocks == b->num_blocks &&
           a->block_size == b->block_size && a->fingerprint == b->fingerprint &&
           a->hash_seed == b->hash_seed && memcmp(a->nonce, b->nonce, KVP_WIRE_NONCE_LEN) == 0 &&
           a->flags == b->flags;
}

static bool lookup_eq(const kvp_msg_lookup_t *a, const kvp_msg_lookup_t *b)
{
    if (a->request_id != b->request_id || a->round != b->round || a->n != b->n)
        return false;
    for (uint32_t i = 0; i < a->n; i++)
        if (!key_eq(&a->keys[i], &b->keys[i]))
            return false;
    return true;
}

static bool fetch_eq(const kvp_msg_fetch_t *a, const kvp_msg_fetch_t *b)
{
    if (a->request_id != b->request_id || a->round != b->round || a->flags != b->flags ||
        a->n != b->n)
        return false;
    for (uint32_t i = 0; i < a->n; i++) {
        const kvp_fetch_item_t *x = &a->items[i], *y = &b->items[i];
        if (!key_eq(&x->key, &y->key) || x->dst_slot != y->dst_slot || x->dst_gen != y->dst_gen)
            return false;
    }
    return true;
}

static bool fetch_done_eq(const kvp_msg_fetch_done_t *a, const kvp_msg_fetch_done_t *b)
{
    if (a->request_id != b->request_id || a->round != b->round || a->status != b->status ||
        a->n != b->n)
        return false;
    for (uint32_t i = 0; i < a->n; i++) {
        const kvp_fetch_block_t *x = &a->blocks[i], *y = &b->blocks[i];
        if (x->ok != y->ok || !kvp_digest_eq(&x->digest, &y->digest))
            return false;
    }
    return true;
}

static bool payload_eq(const kvp_msg_t *a, const kvp_msg_t *b)
{
    const typeof(a->u) *x = &a->u, *y = &b->u;
    switch ((kvp_msg_type_t)a->type) {
    case KVP_MSG_HELLO: return hello_eq(&x->hello, &y->hello);
    case KVP_MSG_AUTH: return memcmp(x->auth.mac, y->auth.mac, KVP_WIRE_MAC_LEN) == 0;
    case KVP_MSG_HELLO_ACK:
        return kvp_epoch_eq(&x->hello_ack.acked_epoch, &y->hello_ack.acked_epoch) &&
               x->hello_ack.blob_len == y->hello_ack.blob_len &&
               (x->hello_ack.blob_len == 0 ||
                memcmp(x->hello_ack.blob, y->hello_ack.blob, x->hello_ack.blob_len) == 0);
    case KVP_MSG_PING:
    case KVP_MSG_PONG: return x->ping.seq == y->ping.seq && x->ping.sent_ns == y->ping.sent_ns;
    case KVP_MSG_BYE: return x->bye.reason == y->bye.reason && !strcmp(x->bye.compat, y->bye.compat);
    case KVP_MSG_LOOKUP: return lookup_eq(&x->lookup, &y->lookup);
    case KVP_MSG_LOOKUP_RESP:
        return x->lookup_resp.request_id == y->lookup_resp.request_id &&
               x->lookup_resp.round == y->lookup_resp.round &&
               x->lookup_resp.n == y->lookup_resp.n &&
               (x->lookup_resp.n == 0 ||
                memcmp(x->lookup_resp.results, y->lookup_resp.results, x->lookup_resp.n) == 0);
    case KVP_MSG_FETCH: return fetch_eq(&x->fetch, &y->fetch);
    case KVP_MSG_FETCH_DONE: return fetch_done_eq(&x->fetch_done, &y->fetch_done);
    case KVP_MSG_ABORT:
    case KVP_MSG_ABORT_ACK:
        return x->abort.request_id == y->abort.request_id && x->abort.round == y->abort.round;
    }
    return false;
}

bool kvp_wire_msg_eq(const kvp_msg_t *a, const kvp_msg_t *b)
{
    if (a->type != b->type || a->flags != b->flags || !kvp_epoch_eq(&a->src_epoch, &b->src_epoch) ||
        !kvp_epoch_eq(&a->dst_epoch, &b->dst_epoch))
        return false;
    return payload_eq(a, b);
}
