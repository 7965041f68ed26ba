/*
 * wire.c -- message table, names, epochs, and the decoder (SPEC §4, §9).
 *
 * The decoder trusts nothing in the frame: every length is checked against
 * its limit and against the bytes actually left before anything is read or
 * any scratch entry is written. A broken rule is KVP_ERR_PROTO with a short
 * `why` naming the rule. Nothing is allocated per decode: lists land in the
 * caller's scratch, keys and blobs point into the frame.
 */
#include "wire/wire_int.h"

#include <stdio.h>

/* ------------------------------------------------------------ type table */

static const kvp_wire_type_info_t wire_types[] = {
#define KVP_WIRE_ROW_(name_, code_, prehs_, max_) [code_] = {#name_, (prehs_) != 0, (max_)},
    KVP_WIRE_MESSAGES(KVP_WIRE_ROW_)
#undef KVP_WIRE_ROW_
};

const kvp_wire_type_info_t *kvp__wire_type_info(uint16_t type)
{
    if (type >= KVP_ARRAY_SIZE(wire_types) || wire_types[type].name == NULL)
        return NULL;
    return &wire_types[type];
}

const char *kvp_msg_type_str(uint16_t type)
{
    const kvp_wire_type_info_t *ti = kvp__wire_type_info(type);
    return ti ? ti->name : "UNKNOWN";
}

static const char *const bye_reason_names[] = {
    [KVP_BYE_GRACEFUL] = "graceful",
    [KVP_BYE_PROTOCOL] = "protocol",
    [KVP_BYE_ABORT_ACK_TIMEOUT] = "abort-ack-timeout",
    [KVP_BYE_DEAD] = "dead",
    [KVP_BYE_DUPLICATE] = "duplicate",
    [KVP_BYE_INCOMPATIBLE] = "incompatible",
    [KVP_BYE_AUTH] = "auth",
    [KVP_BYE_LIMIT] = "limit",
    [KVP_BYE_SHUTDOWN] = "shutdown",
    [KVP_BYE_IDLE] = "idle",
    [KVP_BYE_TRANSPORT] = "transport",
};

const char *kvp_bye_reason_str(uint16_t reason)
{
    if (reason >= KVP_ARRAY_SIZE(bye_reason_names) || bye_reason_names[reason] == NULL)
        return "unknown";
    return bye_reason_names[reason];
}

bool kvp_bye_reason_is_fault(uint16_t reason)
{
    /* An unknown reason from a newer peer is treated as a fault: assuming
     * graceful could skip the crash-style cleanup the sender asked for. */
    return !(reason == KVP_BYE_GRACEFUL || reason == KVP_BYE_SHUTDOWN || reason == KVP_BYE_IDLE);
}

/* ------------------------------------------------------------ epochs */

bool kvp_epoch_is_zero(const kvp_epoch_t *e)
{
    uint8_t acc = 0;
    for (size_t i = 0; i < KVP_WIRE_EPOCH_LEN; i++)
        acc |= e->b[i];
    return acc == 0;
}

bool kvp_epoch_eq(const kvp_epoch_t *a, const kvp_epoch_t *b)
{
    return memcmp(a->b, b->b, KVP_WIRE_EPOCH_LEN) == 0;
}

kvp_status_t kvp_epoch_new(kvp_epoch_t *e)
{
    kvp_epoch_t t;
    do {
        kvp_status_t st = kvp_random_bytes(t.b, sizeof(t.b));
        if (st != KVP_OK)
            return st;
    } while (kvp_epoch_is_zero(&t)); /* 2^-128, but zero means "missing" */
    *e = t;
    return KVP_OK;
}

/* ------------------------------------------------------------ scratch */

/* One buffer with room for KVP_WIRE_LIST_MAX entries of the largest list
 * kind. A frame carries one list, so the kinds share it: decoding the next
 * frame reuses it and invalidates the previous message's arrays. */
struct kvp_wire_scratch {
    void *mem; /* owned; kvp__malloc'ed once in create */
};

#define WIRE_SCRATCH_ENTRY                                                                         \
    KVP_MAX(sizeof(kvp_key_t), KVP_MAX(sizeof(kvp_fetch_item_t), sizeof(kvp_fetch_block_t)))

kvp_status_t kvp_wire_scratch_create(kvp_wire_scratch_t **out)
{
    if (out == NULL)
        return KVP_ERR_INVALID;
    kvp_wire_scratch_t *s = kvp__malloc(sizeof(*s));
    if (s == NULL)
        goto err_nomem;
    s->mem = kvp__malloc((size_t)KVP_WIRE_LIST_MAX * WIRE_SCRATCH_ENTRY);
    if (s->mem == NULL)
        goto err_free_s;
    *out = s;
    return KVP_OK;
err_free_s:
    kvp__free(s);
err_nomem:
    return KVP_ERR_NOMEM;
}

void kvp_wire_scratch_destroy(kvp_wire_scratch_t *s)
{
    if (s == NULL)
        return;
    kvp__free(s->mem);
    kvp__free(s);
}

/* ------------------------------------------------------------ header */

/* Decoder state for one frame: the cursor over the payload, the receiver's
 * context, the caller's scratch and where to explain a rejection. */
typedef struct wire_dec {
    kvp_wire_rd_t r;
    const kvp_wire_ctx_t *ctx;
    kvp_wire_scratch_t *scratch;
    const char *tname;
    char *why;
    size_t why_len;
} wire_dec_t;

static kvp_status_t wire_reject(char *why, size_t why_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static kvp_status_t wire_reject(char *why, size_t why_len, const char *fmt, ...)
{
    if (why != NULL && why_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
    }
    return KVP_ERR_PROTO;
}

#define DEC_FAIL(d, fmt, ...) wire_reject((d)->why, (d)->why_len, "%s: " fmt, (d)->tname, ##__VA_ARGS__)
#define DEC_TRUNC(d, field) DEC_FAIL(d, "truncated payload (reading %s)", field)

kvp_status_t kvp_wire_parse_hdr_why(const kvp_wire_ctx_t *ctx, const uint8_t *buf, size_t len,
                                    kvp_frame_hdr_t *hdr, char *why, size_t why_len)
{
    if (ctx == NULL || (buf == NULL && len > 0) || hdr == NULL)
        return KVP_ERR_INVALID;
    if (len < KVP_WIRE_HDR_LEN)
        return KVP_ERR_TRUNCATED;
    uint32_t length = kvp_wire_le32(buf);
    uint16_t type = kvp_wire_le16(buf + 4);
    const kvp_wire_type_info_t *ti = kvp__wire_type_info(type);
    if (ti == NULL)
        return wire_reject(why, why_len, "unknown type %u", type);
    if (!ctx->handshake_done && !ti->prehs)
        return wire_reject(why, why_len, "%s not allowed before handshake", ti->name);
    /* The frame limits count the header, so a receive buffer of
     * KVP_WIRE_FRAME_MAX bytes always holds a whole frame. */
    uint32_t limit = ctx->handshake_done ? KVP_WIRE_FRAME_MAX : KVP_WIRE_FRAME_MAX_PREHS;
    if (length > limit - KVP_WIRE_HDR_LEN)
        return wire_reject(why, why_len, "%s frame too large (%u > %s frame limit %u)", ti->name,
                           length + KVP_WIRE_HDR_LEN, ctx->handshake_done ? "" : "pre-handshake",
                           limit);
    if (length > ti->max)
        return wire_reject(why, why_len, "%s payload too large (%u > type limit %u)", ti->name,
                           length, ti->max);
    hdr->length = length;
    hdr->type = type;
    hdr->flags = kvp_wire_le16(buf + 6);
    return KVP_OK;
}

kvp_status_t kvp_wire_parse_hdr(const kvp_wire_ctx_t *ctx, const uint8_t *buf, size_t len,
                                kvp_frame_hdr_t *hdr)
{
    return kvp_wire_parse_hdr_why(ctx, buf, len, hdr, NULL, 0);
}

/* ------------------------------------------------------------ fields */

static kvp_status_t dec_epoch(wire_dec_t *d, kvp_epoch_t *e, const char *field)
{
    if (!kvp_wire_rd_copy(&d->r, e->b, KVP_WIRE_EPOCH_LEN))
        return DEC_FAIL(d, "missing epoch (%s)", field);
    if (kvp_epoch_is_zero(e))
        return DEC_FAIL(d, "zero epoch (%s)", field);
    return KVP_OK;
}

/* str = u8 len (1..255) + bytes; copied NUL-terminated. An embedded NUL is
 * refused: the copy would silently name a different identity. */
static kvp_status_t dec_str(wire_dec_t *d, char out[KVP_WIRE_STR_MAX + 1], const char *field)
{
    uint8_t n;
    const uint8_t *p;
    if (!kvp_wire_rd_u8(&d->r, &n))
        return DEC_TRUNC(d, field);
    if (n == 0)
        return DEC_FAIL(d, "string length 0 (%s)", field);
    if (!kvp_wire_rd_ptr(&d->r, n, &p))
        return DEC_TRUNC(d, field);
    if (memchr(p, 0, n) != NULL)
        return DEC_FAIL(d, "string contains NUL (%s)", field);
    memcpy(out, p, n);
    out[n] = '\0';
    return KVP_OK;
}

static inline kvp_status_t dec_key(wire_dec_t *d, kvp_key_t *k)
{
    uint8_t n;
    if (!kvp_wire_rd_u8(&d->r, &n))
        return DEC_TRUNC(d, "key length");
    if (__builtin_expect(n == 0 || n > KVP_WIRE_KEY_MAX, 0))
        return DEC_FAIL(d, "key length %u (must be 1..%u)", n, KVP_WIRE_KEY_MAX);
    if (!kvp_wire_rd_ptr(&d->r, n, &k->data))
        return DEC_TRUNC(d, "key");
    k->len = n;
    return KVP_OK;
}

/* Reads request_id, round, [extra u32 (flags/status)], n and checks n against
 * the list bound and against the bytes left (each entry needs at least
 * min_entry bytes) -- before any scratch entry is touched. */
static kvp_status_t dec_list_hdr(wire_dec_t *d, uint64_t *req, uint64_t *round, uint32_t *extra,
                                 uint32_t *n, size_t min_entry)
{
    if (!kvp_wire_rd_u64(&d->r, req) || !kvp_wire_rd_u64(&d->r, round))
        return DEC_TRUNC(d, "request id/round");
    if (extra != NULL && !kvp_wire_rd_u32(&d->r, extra))
        return DEC_TRUNC(d, "flags/status");
    if (!kvp_wire_rd_u32(&d->r, n))
        return DEC_TRUNC(d, "count");
    if (*n > KVP_WIRE_LIST_MAX)
        return DEC_FAIL(d, "list too long (%u > %u)", *n, KVP_WIRE_LIST_MAX);
    if ((uint64_t)*n * min_entry > kvp_wire_rd_left(&d->r))
        return DEC_FAIL(d, "count %u exceeds payload (%zu bytes left)", *n,
                        kvp_wire_rd_left(&d->r));
    return KVP_OK;
}

/* ------------------------------------------------------------ per type */

static kvp_status_t dec_hello(wire_dec_t *d, kvp_msg_t *m)
{
    kvp_msg_hello_t *h = &m->u.hello;
    kvp_status_t st;
    if (!kvp_wire_rd_u16(&d->r, &h->major) || !kvp_wire_rd_u16(&d->r, &h->minor))
        return DEC_TRUNC(d, "version");
    if (h->major != KVP_WIRE_MAJOR)
        return DEC_FAIL(d, "unknown major version %u (want %u)", h->major, KVP_WIRE_MAJOR);
    if ((st = dec_str(d, h->peer_id, "peer_id")) != KVP_OK ||
        (st = dec_str(d, h->instance_id, "instance_id")) != KVP_OK ||
        (st = dec_epoch(d, &h->epoch, "hello epoch")) != KVP_OK)
        return st;
    if (!kvp_wire_rd_u32(&d->r, &h->num_blocks) || !kvp_wire_rd_u32(&d->r, &h->block_size) ||
        !kvp_wire_rd_u64(&d->r, &h->fingerprint) || !kvp_wire_rd_u64(&d->r, &h->hash_seed) ||
        !kvp_wire_rd_copy(&d->r, h->nonce, KVP_WIRE_NONCE_LEN) ||
        !kvp_wire_rd_u32(&d->r, &h->flags))
        return DEC_TRUNC(d, "layout/nonce/flags");
    return KVP_OK;
}

static kvp_status_t dec_auth(wire_dec_t *d, kvp_msg_t *m)
{
    if (!kvp_wire_rd_copy(&d->r, m->u.auth.mac, KVP_WIRE_MAC_LEN))
        return DEC_TRUNC(d, "mac");
    return KVP_OK;
}

static kvp_status_t dec_hello_ack(wire_dec_t *d, kvp_msg_t *m)
{
    kvp_msg_hello_ack_t *a = &m->u.hello_ack;
    kvp_status_t st = dec_epoch(d, &a->acked_epoch, "acked epoch");
    if (st != KVP_OK)
        return st;
    if (!kvp_wire_rd_u32(&d->r, &a->blob_len))
        return DEC_TRUNC(d, "blob length");
    if (a->blob_len > KVP_WIRE_BLOB_MAX)
        return DEC_FAIL(d, "blob too large (%u > %u)", a->blob_len, KVP_WIRE_BLOB_MAX);
    if (!kvp_wire_rd_ptr(&d->r, a->blob_len, &a->blob))
        return DEC_TRUNC(d, "blob");
    return KVP_OK;
}

static kvp_status_t dec_ping(wire_dec_t *d, kvp_msg_t *m)
{
    if (!kvp_wire_rd_u64(&d->r, &m->u.ping.seq) || !kvp_wire_rd_u64(&d->r, &m->u.ping.sent_ns))
        return DEC_TRUNC(d, "seq/sent_ns");
    return KVP_OK;
}

/* Minor 1: an optional compat string after the reason, only with
 * INCOMPATIBLE, 1..KVP_WIRE_COMPAT_MAX printable ASCII bytes. */
static kvp_status_t dec_bye(wire_dec_t *d, kvp_msg_t *m)
{
    kvp_msg_bye_t *b = &m->u.bye;
    uint8_t n;
    const uint8_t *p;
    b->compat[0] = '\0';
    if (!kvp_wire_rd_u16(&d->r, &b->reason))
        return DEC_TRUNC(d, "reason");
    if (kvp_wire_rd_left(&d->r) == 0)
        return KVP_OK;
    if (b->reason != KVP_BYE_INCOMPATIBLE)
        return DEC_FAIL(d, "compat string with reason %u", b->reason);
    if (!kvp_wire_rd_u8(&d->r, &n))
        return DEC_TRUNC(d, "compat");
    if (n == 0 || n > KVP_WIRE_COMPAT_MAX)
        return DEC_FAIL(d, "compat string length %u (1..%u)", n, KVP_WIRE_COMPAT_MAX);
    if (!kvp_wire_rd_ptr(&d->r, n, &p))
        return DEC_TRUNC(d, "compat");
    if (!kvp_wire_printable(p, n))
        return DEC_FAIL(d, "compat string not printable ASCII");
    memcpy(b->compat, p, n);
    b->compat[n] = '\0';
    return KVP_OK;
}

static kvp_status_t dec_lookup(wire_dec_t *d, kvp_msg_t *m)
{
    kvp_msg_lookup_t *l = &m->u.lookup;
    kvp_status_t st = dec_list_hdr(d, &l->request_id, &l->round, NULL, &l->n, 2);
    if (st != KVP_OK)
        return st;
    kvp_key_t *keys = d->scratch->mem;
    for (uint32_t i = 0; i < l->n; i++)
        if ((st = dec_key(d, &keys[i])) != KVP_OK)
            return st;
    l->keys = keys;
    return KVP_OK;
}

static kvp_status_t dec_lookup_resp(wire_dec_t *d, kvp_msg_t *m)
{
    kvp_msg_lookup_resp_t *l = &m->u.lookup_resp;
    kvp_status_t st = dec_list_hdr(d, &l->request_id, &l->round, NULL, &l->n, 1);
    if (st != KVP_OK)
        return st;
    if (!kvp_wire_rd_ptr(&d->r, l->n, &l->results))
        return DEC_TRUNC(d, "results");
    for (uint32_t i = 0; i < l->n; i++)
        if (l->results[i] > KVP_LOOKUP_HIT)
            return DEC_FAIL(d, "bad lookup result %u at %u", l->results[i], i);
    return KVP_OK;
}

static kvp_status_t dec_fetch(wire_dec_t *d, kvp_msg_t *m)
{
    kvp_msg_fetch_t *f = &m->u.fetch;
    uint32_t nb = d->ctx->peer_num_blocks;
    if (nb == 0)
        return DEC_FAIL(d, "refused: peer layout unknown (num_blocks 0)");
    kvp_status_t st = dec_list_hdr(d, &f->request_id, &f->round, &f->flags, &f->n,
                                   2 + KVP_WIRE_FETCH_ITEM_FIXED);
    if (st != KVP_OK)
        return st;
    kvp_fetch_item_t *items = d->scratch->mem;
    for (uint32_t i = 0; i < f->n; i++) {
        kvp_fetch_item_t *it = &items[i];
        if ((st = dec_key(d, &it->key)) != KVP_OK)
            return st;
        if (!kvp_wire_rd_u32(&d->r, &it->dst_slot) || !kvp_wire_rd_u32(&d->r, &it->dst_gen))
            return DEC_TRUNC(d, "dst slot/gen");
        if (it->dst_slot >= nb)
            return DEC_FAIL(d, "dst_slot %u out of range (num_blocks %u)", it->dst_slot, nb);
    }
    f->items = items;
    return KVP_OK;
}

static kvp_status_t dec_fetch_done(wire_dec_t *d, kvp_msg_t *m)
{
    kvp_msg_fetch_done_t *f = &m->u.fetch_done;
    uint32_t status;
    kvp_status_t st = dec_list_hdr(d, &f->request_id, &f->round, &status, &f->n,
                                   KVP_WIRE_FETCH_BLOCK_LEN);
    if (st != KVP_OK)
        return st;
    f->status = (int32_t)status;
    if (f->status > 0)
        return DEC_FAIL(d, "bad status %d (must be <= 0)", f->status);
    kvp_fetch_block_t *blocks = d->scratch->mem;
    for (uint32_t i = 0; i < f->n; i++) {
        kvp_fetch_block_t *b = &blocks[i];
        if (!kvp_wire_rd_u8(&d->r, &b->ok) || !kvp_wire_rd_u64(&d->r, &b->digest.lo) ||
            !kvp_wire_rd_u64(&d->r, &b->digest.hi))
            return DEC_TRUNC(d, "block");
        if (b->ok > 1)
            return DEC_FAIL(d, "bad block ok flag %u at %u", b->ok, i);
    }
    f->blocks = blocks;
    return KVP_OK;
}

static kvp_status_t dec_abort(wire_dec_t *d, kvp_msg_t *m)
{
    if (!kvp_wire_rd_u64(&d->r, &m->u.abort.request_id) ||
        !kvp_wire_rd_u64(&d->r, &m->u.abort.round))
        return DEC_TRUNC(d, "request id/round");
    return KVP_OK;
}

/* ------------------------------------------------------------ decode */

static kvp_status_t dec_payload(wire_dec_t *d, kvp_msg_t *m)
{
    switch ((kvp_msg_type_t)m->type) {
    case KVP_MSG_HELLO: return dec_hello(d, m);
    case KVP_MSG_AUTH: return dec_auth(d, m);
    case KVP_MSG_HELLO_ACK: return dec_hello_ack(d, m);
    case KVP_MSG_PING:
    case KVP_MSG_PONG: return dec_ping(d, m);
    case KVP_MSG_BYE: return dec_bye(d, m);
    case KVP_MSG_LOOKUP: return dec_lookup(d, m);
    case KVP_MSG_LOOKUP_RESP: return dec_lookup_resp(d, m);
    case KVP_MSG_FETCH: return dec_fetch(d, m);
    case KVP_MSG_FETCH_DONE: return dec_fetch_done(d, m);
    case KVP_MSG_ABORT:
    case KVP_MSG_ABORT_ACK: return dec_abort(d, m);
    }
    return DEC_FAIL(d, "unknown type"); /* parse_hdr already refused it */
}

kvp_status_t kvp_wire_decode(const kvp_wire_ctx_t *ctx, const uint8_t *frame, size_t len,
                             kvp_wire_scratch_t *scratch, kvp_msg_t *msg, char *why,
                             size_t why_len)
{
    if (ctx == NULL || frame == NULL || scratch == NULL || msg == NULL)
        return KVP_ERR_INVALID;
    kvp_frame_hdr_t hdr = {0, 0, 0};
    kvp_status_t st = kvp_wire_parse_hdr_why(ctx, frame, len, &hdr, why, why_len);
    if (st == KVP_ERR_TRUNCATED)
        return wire_reject(why, why_len, "truncated header (%zu bytes)", len);
    if (st != KVP_OK)
        return st;
    if (len - KVP_WIRE_HDR_LEN != hdr.length)
        return wire_reject(why, why_len, "%s frame length mismatch (header says %u, got %zu)",
                           kvp_msg_type_str(hdr.type), hdr.length, len - KVP_WIRE_HDR_LEN);
    wire_dec_t d = {.r = {frame + KVP_WIRE_HDR_LEN, 0, hdr.length},
                    .ctx = ctx,
                    .scratch = scratch,
                    .tname = kvp_msg_type_str(hdr.type),
                    .why = why,
                    .why_len = why_len};
    kvp_msg_t m;
    m.type = hdr.type;
    m.flags = hdr.flags;
    memset(&m.src_epoch, 0, sizeof(m.src_epoch));
    memset(&m.dst_epoch, 0, sizeof(m.dst_epoch));
    if (hdr.type != KVP_MSG_HELLO) {
        if ((st = dec_epoch(&d, &m.src_epoch, "source")) != KVP_OK ||
            (st = dec_epoch(&d, &m.dst_epoch, "target")) != KVP_OK)
            return st;
    }
    if ((st = dec_payload(&d, &m)) != KVP_OK)
        return st;
    if (kvp_wire_rd_left(&d.r) != 0)
        return DEC_FAIL(&d, "trailing bytes (%zu)", kvp_wire_rd_left(&d.r));
    *msg = m;
    return KVP_OK;
}

/* Only the prefix every version shares; see wire.h. */
kvp_status_t kvp_wire_peek_hello(const uint8_t *frame, size_t len, kvp_wire_hello_id_t *out)
{
    kvp_wire_rd_t r = {frame, 0, len};
    kvp_wire_hello_id_t id;
    uint32_t flen;
    uint16_t type, flags;
    uint8_t n, inst_len;
    const uint8_t *p;
    memset(&id, 0, sizeof(id));
    if (!kvp_wire_rd_u32(&r, &flen) || !kvp_wire_rd_u16(&r, &type) || !kvp_wire_rd_u16(&r, &flags) ||
        type != KVP_MSG_HELLO)
        return KVP_ERR_PROTO;
    if (!kvp_wire_rd_u16(&r, &id.major) || !kvp_wire_rd_u16(&r, &id.minor) ||
        !kvp_wire_rd_u8(&r, &n) || !kvp_wire_rd_ptr(&r, n, &p))
        return KVP_ERR_PROTO;
    memcpy(id.peer_id, p, n); /* n <= 255 == KVP_WIRE_STR_MAX */
    if (!kvp_wire_rd_u8(&r, &inst_len) || !kvp_wire_rd_ptr(&r, inst_len, &p) ||
        !kvp_wire_rd_copy(&r, id.epoch.b, KVP_WIRE_EPOCH_LEN))
        return KVP_ERR_PROTO;
    *out = id;
    return KVP_OK;
}
