/*
 * wire_encode.c -- the encoder: measures and validates a message with the
 * decoder's rules (so we never send what a peer must refuse), then writes it
 * through the bounds-checked writer.
 *
 * The one rule the encoder cannot check is FETCH dst_slot < the peer's
 * num_blocks: it has no context. Callers validate slots against the layout.
 */
#include "wire/wire_int.h"

/* Validation while measuring: *sz accumulates the payload size. */
static kvp_status_t meas_key(const kvp_key_t *k, size_t *sz)
{
    if (k->len == 0 || k->len > KVP_WIRE_KEY_MAX || k->data == NULL)
        return KVP_ERR_INVALID;
    *sz += 1 + (size_t)k->len;
    return KVP_OK;
}

static kvp_status_t meas_str(const char s[KVP_WIRE_STR_MAX + 1], size_t *sz)
{
    size_t n = strnlen(s, KVP_WIRE_STR_MAX + 1);
    if (n == 0 || n > KVP_WIRE_STR_MAX)
        return KVP_ERR_INVALID;
    *sz += 1 + n;
    return KVP_OK;
}

static kvp_status_t meas_hello(const kvp_msg_hello_t *h, size_t *sz)
{
    if (h->major != KVP_WIRE_MAJOR || kvp_epoch_is_zero(&h->epoch))
        return KVP_ERR_INVALID;
    *sz += 4;
    if (meas_str(h->peer_id, sz) != KVP_OK || meas_str(h->instance_id, sz) != KVP_OK)
        return KVP_ERR_INVALID;
    *sz += KVP_WIRE_EPOCH_LEN + 4 + 4 + 8 + 8 + KVP_WIRE_NONCE_LEN + 4;
    return KVP_OK;
}

static kvp_status_t meas_lookup(const kvp_msg_lookup_t *l, size_t *sz)
{
    if (l->n > KVP_WIRE_LIST_MAX || (l->n > 0 && l->keys == NULL))
        return KVP_ERR_INVALID;
    *sz += KVP_WIRE_LIST_HDR_LEN;
    for (uint32_t i = 0; i < l->n; i++)
        if (meas_key(&l->keys[i], sz) != KVP_OK)
            return KVP_ERR_INVALID;
    return KVP_OK;
}

static kvp_status_t meas_lookup_resp(const kvp_msg_lookup_resp_t *l, size_t *sz)
{
    if (l->n > KVP_WIRE_LIST_MAX || (l->n > 0 && l->results == NULL))
        return KVP_ERR_INVALID;
    for (uint32_t i = 0; i < l->n; i++)
        if (l->results[i] > KVP_LOOKUP_HIT)
            return KVP_ERR_INVALID;
    *sz += KVP_WIRE_LIST_HDR_LEN + l->n;
    return KVP_OK;
}

static kvp_status_t meas_fetch(const kvp_msg_fetch_t *f, size_t *sz)
{
    if (f->n > KVP_WIRE_LIST_MAX || (f->n > 0 && f->items == NULL))
        return KVP_ERR_INVALID;
    *sz += KVP_WIRE_FETCH_HDR_LEN + (size_t)f->n * KVP_WIRE_FETCH_ITEM_FIXED;
    for (uint32_t i = 0; i < f->n; i++)
        if (meas_key(&f->items[i].key, sz) != KVP_OK)
            return KVP_ERR_INVALID;
    return KVP_OK;
}

static kvp_status_t meas_fetch_done(const kvp_msg_fetch_done_t *f, size_t *sz)
{
    if (f->n > KVP_WIRE_LIST_MAX || (f->n > 0 && f->blocks == NULL) || f->status > 0)
        return KVP_ERR_INVALID;
    for (uint32_t i = 0; i < f->n; i++)
        if (f->blocks[i].ok > 1)
            return KVP_ERR_INVALID;
    *sz += KVP_WIRE_FETCH_HDR_LEN + (size_t)f->n * KVP_WIRE_FETCH_BLOCK_LEN;
    return KVP_OK;
}

static kvp_status_t meas_payload(const kvp_msg_t *m, size_t *sz)
{
    switch ((kvp_msg_type_t)m->type) {
    case KVP_MSG_HELLO: return meas_hello(&m->u.hello, sz);
    case KVP_MSG_AUTH: *sz += KVP_WIRE_MAC_LEN; return KVP_OK;
    case KVP_MSG_HELLO_ACK:
        if (kvp_epoch_is_zero(&m->u.hello_ack.acked_epoch) ||
            m->u.hello_ack.blob_len > KVP_WIRE_BLOB_MAX ||
            (m->u.hello_ack.blob_len > 0 && m->u.hello_ack.blob == NULL))
            return KVP_ERR_INVALID;
        *sz += KVP_WIRE_EPOCH_LEN + 4 + m->u.hello_ack.blob_len;
        return KVP_OK;
    case KVP_MSG_PING:
    case KVP_MSG_PONG: *sz += 16; return KVP_OK;
    case KVP_MSG_BYE: {
        size_t n = strnlen(m->u.bye.compat, sizeof(m->u.bye.compat));
        if (n == sizeof(m->u.bye.compat) ||
            (n > 0 && (m->u.bye.reason != KVP_BYE_INCOMPATIBLE ||
                       !kvp_wire_printable((const uint8_t *)m->u.bye.compat, n))))
            return KVP_ERR_INVALID;
        *sz += 2 + (n ? 1 + n : 0);
        return KVP_OK;
    }
    case KVP_MSG_LOOKUP: return meas_lookup(&m->u.lookup, sz);
    case KVP_MSG_LOOKUP_RESP: return meas_lookup_resp(&m->u.lookup_resp, sz);
    case KVP_MSG_FETCH: return meas_fetch(&m->u.fetch, sz);
    case KVP_MSG_FETCH_DONE: return meas_fetch_done(&m->u.fetch_done, sz);
    case KVP_MSG_ABORT:
    case KVP_MSG_ABORT_ACK: *sz += 16; return KVP_OK;
    }
    return KVP_ERR_INVALID;
}

/* Validates m and yields its whole frame size (header included). */
static kvp_status_t wire_measure(const kvp_msg_t *m, size_t *frame_len)
{
    const kvp_wire_type_info_t *ti = kvp__wire_type_info(m->type);
    if (ti == NULL)
        return KVP_ERR_INVALID;
    size_t sz = 0;
    if (m->type != KVP_MSG_HELLO) {
        if (kvp_epoch_is_zero(&m->src_epoch) || kvp_epoch_is_zero(&m->dst_epoch))
            return KVP_ERR_INVALID;
        sz += KVP_WIRE_EPOCHS_LEN;
    }
    if (meas_payload(m, &sz) != KVP_OK)
        return KVP_ERR_INVALID;
    if (sz > ti->max || sz > KVP_WIRE_FRAME_MAX - KVP_WIRE_HDR_LEN)
        return KVP_ERR_INVALID;
    *frame_len = sz + KVP_WIRE_HDR_LEN;
    return KVP_OK;
}

size_t kvp_wire_encoded_size(const kvp_msg_t *m)
{
    size_t len;
    if (m == NULL || wire_measure(m, &len) != KVP_OK)
        return 0;
    return len;
}

/* ------------------------------------------------------------ writing */

static void enc_key(kvp_wire_wr_t *w, const kvp_key_t *k)
{
    kvp_wire_wr_u8(w, (uint8_t)k->len);
    kvp_wire_wr_bytes(w, k->data, k->len);
}

static void enc_str(kvp_wire_wr_t *w, const char *s)
{
    size_t n = strnlen(s, KVP_WIRE_STR_MAX); /* measured: 1..255 */
    kvp_wire_wr_u8(w, (uint8_t)n);
    kvp_wire_wr_bytes(w, s, n);
}

static void enc_hello(kvp_wire_wr_t *w, const kvp_msg_hello_t *h)
{
    kvp_wire_wr_u16(w, h->major);
    kvp_wire_wr_u16(w, h->minor);
    enc_str(w, h->peer_id);
    enc_str(w, h->instance_id);
    kvp_wire_wr_bytes(w, h->epoch.b, KVP_WIRE_EPOCH_LEN);
    kvp_wire_wr_u32(w, h->num_blocks);
    kvp_wire_wr_u32(w, h->block_size);
    kvp_wire_wr_u64(w, h->fingerprint);
    kvp_wire_wr_u64(w, h->hash_seed);
    kvp_wire_wr_bytes(w, h->nonce, KVP_WIRE_NONCE_LEN);
    kvp_wire_wr_u32(w, h->flags);
}

static void enc_list_hdr(kvp_wire_wr_t *w, uint64_t req, uint64_t round)
{
    kvp_wire_wr_u64(w, req);
    kvp_wire_wr_u64(w, round);
}

static void enc_lookup(kvp_wire_wr_t *w, const kvp_msg_lookup_t *l)
{
    enc_list_hdr(w, l->request_id, l->round);
    kvp_wire_wr_u32(w, l->n);
    for (uint32_t i = 0; i < l->n; i++)
        enc_key(w, &l->keys[i]);
}

static void enc_fetch(kvp_wire_wr_t *w, const kvp_msg_fetch_t *f)
{
    enc_list_hdr(w, f->request_id, f->round);
    kvp_wire_wr_u32(w, f->flags);
    kvp_wire_wr_u32(w, f->n);
    for (uint32_t i = 0; i < f->n; i++) {
        enc_key(w, &f->items[i].key);
        kvp_wire_wr_u32(w, f->items[i].dst_slot);
        kvp_wire_wr_u32(w, f->items[i].dst_gen);
    }
}

static void enc_fetch_done(kvp_wire_wr_t *w, const kvp_msg_fetch_done_t *f)
{
    enc_list_hdr(w, f->request_id, f->round);
    kvp_wire_wr_u32(w, (uint32_t)f->status);
    kvp_wire_wr_u32(w, f->n);
    for (uint32_t i = 0; i < f->n; i++) {
        kvp_wire_wr_u8(w, f->blocks[i].ok);
        kvp_wire_wr_u64(w, f->blocks[i].digest.lo);
        kvp_wire_wr_u64(w, f->blocks[i].digest.hi);
    }
}

static void enc_payload(kvp_wire_wr_t *w, const kvp_msg_t *m)
{
    switch ((kvp_msg_type_t)m->type) {
    case KVP_MSG_HELLO: enc_hello(w, &m->u.hello); break;
    case KVP_MSG_AUTH: kvp_wire_wr_bytes(w, m->u.auth.mac, KVP_WIRE_MAC_LEN); break;
    case KVP_MSG_HELLO_ACK:
        kvp_wire_wr_bytes(w, m->u.hello_ack.acked_epoch.b, KVP_WIRE_EPOCH_LEN);
        kvp_wire_wr_u32(w, m->u.hello_ack.blob_len);
        kvp_wire_wr_bytes(w, m->u.hello_ack.blob, m->u.hello_ack.blob_len);
        break;
    case KVP_MSG_PING:
    case KVP_MSG_PONG:
        kvp_wire_wr_u64(w, m->u.ping.seq);
        kvp_wire_wr_u64(w, m->u.ping.sent_ns);
        break;
    case KVP_MSG_BYE: {
        size_t n = strlen(m->u.bye.compat); /* validated by wire_measure */
        kvp_wire_wr_u16(w, m->u.bye.reason);
        if (n) {
            kvp_wire_wr_u8(w, (uint8_t)n);
            kvp_wire_wr_bytes(w, m->u.bye.compat, n);
        }
        break;
    }
    case KVP_MSG_LOOKUP: enc_lookup(w, &m->u.lookup); break;
    case KVP_MSG_LOOKUP_RESP:
        enc_list_hdr(w, m->u.lookup_resp.request_id, m->u.lookup_resp.round);
        kvp_wire_wr_u32(w, m->u.lookup_resp.n);
        kvp_wire_wr_bytes(w, m->u.lookup_resp.results, m->u.lookup_resp.n);
        break;
    case KVP_MSG_FETCH: enc_fetch(w, &m->u.fetch); break;
    case KVP_MSG_FETCH_DONE: enc_fetch_done(w, &m->u.fetch_done); break;
    case KVP_MSG_ABORT:
    case KVP_MSG_ABORT_ACK: enc_list_hdr(w, m->u.abort.request_id, m->u.abort.round); break;
    }
}

kvp_status_t kvp_wire_encode(const kvp_msg_t *m, uint8_t *buf, size_t cap, size_t *len_out)
{
    size_t len;
    if (m == NULL || (buf == NULL && cap > 0) || len_out == NULL)
        return KVP_ERR_INVALID;
    if (wire_measure(m, &len) != KVP_OK)
        return KVP_ERR_INVALID;
    if (cap < len)
        return KVP_ERR_NOSPACE;
    kvp_wire_wr_t w = {.buf = buf, .pos = 0, .cap = len, .overflow = false};
    kvp_wire_wr_u32(&w, (uint32_t)(len - KVP_WIRE_HDR_LEN));
    kvp_wire_wr_u16(&w, m->type);
    kvp_wire_wr_u16(&w, m->flags);
    if (m->type != KVP_MSG_HELLO) {
        kvp_wire_wr_bytes(&w, m->src_epoch.b, KVP_WIRE_EPOCH_LEN);
        kvp_wire_wr_bytes(&w, m->dst_epoch.b, KVP_WIRE_EPOCH_LEN);
    }
    enc_payload(&w, m);
    /* Measuring and writing disagree only on a bug here; never overrun. */
    KVP_ASSERT(!w.overflow && w.pos == len);
    *len_out = len;
    return KVP_OK;
}

void kvp_wire_compat_for_bye(const char *compat, char out[KVP_WIRE_COMPAT_MAX + 1])
{
    size_t n = compat ? strlen(compat) : 0, k = KVP_MIN(n, (size_t)KVP_WIRE_COMPAT_MAX);
    for (size_t i = 0; i < k; i++) {
        unsigned char c = (unsigned char)compat[i];
        out[i] = c >= 0x20 && c <= 0x7e ? (char)c : '?';
    }
    if (n > KVP_WIRE_COMPAT_MAX)
        memcpy(out + KVP_WIRE_COMPAT_MAX - 3, "...", 3);
    out[k] = '\0';
}
