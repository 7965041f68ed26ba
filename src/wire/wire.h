/*
 * wire.h -- the kvpeer wire protocol (SPEC §4): message definitions and a
 * bounds-checked encoder/decoder. Pure functions, no I/O, fuzzable.
 *
 * Frame: little-endian   u32 length | u16 type | u16 flags | payload
 * `length` counts the payload only (the 8-byte header excluded).
 *
 * Every frame except HELLO starts its payload with two 16-byte epochs:
 * source epoch (the sender's own) and target epoch (the receiver's, learned
 * from its HELLO). Epochs are random and non-zero; a zero or missing epoch is
 * a protocol error. Whether the pair matches the live incarnation is the
 * session's business (a mismatch is stale, not an error).
 *
 * Payloads (after the epochs), all integers little-endian:
 *   HELLO       u16 major, u16 minor, str peer_id, str instance_id, epoch[16],
 *               u32 num_blocks, u32 block_size, u64 fingerprint, u64 hash_seed,
 *               nonce[16], u32 flags (bit 0: sender requires auth)
 *   AUTH        mac[32]   HMAC-SHA256(psk, "kvpeer-auth-v1" | sender epoch |
 *               receiver epoch | sender nonce | receiver nonce | sender layout)
 *   HELLO_ACK   acked_epoch[16] (the receiver's epoch), u32 blob_len, blob
 *   PING/PONG   u64 seq, u64 sent_ns (echoed in PONG)
 *   BYE         u16 reason [, str compat]   (minor >= 1, see below)
 *   LOOKUP      u64 request_id, u64 round, u32 n, n x key
 *   LOOKUP_RESP u64 request_id, u64 round, u32 n, n x u8 result
 *   FETCH       u64 request_id, u64 round, u32 flags, u32 n,
 *               n x (key, u32 dst_slot, u32 dst_gen)
 *   FETCH_DONE  u64 request_id, u64 round, i32 status, u32 n,
 *               n x (u8 ok, digest lo u64, digest hi u64)   (FETCH order)
 *   ABORT       u64 request_id, u64 round
 *   ABORT_ACK   u64 request_id, u64 round
 * str = u8 len (1..255) + bytes (no NUL); key = u8 len (1..64) + bytes.
 *
 * Minor 1: a BYE INCOMPATIBLE that refuses a peer over the compatibility
 * fingerprint may carry the refuser's compatibility string (1..
 * KVP_WIRE_COMPAT_MAX printable ASCII bytes; the hash stays the check, the
 * string is for the operator). It is sent only to a peer whose HELLO said
 * minor >= 1: a minor-0 decoder refuses trailing bytes, so an older peer gets
 * the plain BYE as before.
 */
#ifndef KVP_WIRE_H
#define KVP_WIRE_H

#include "common/common.h"

#define KVP_WIRE_MAJOR 1
#define KVP_WIRE_MINOR 1
#define KVP_WIRE_HDR_LEN 8u
#define KVP_WIRE_EPOCH_LEN 16u
#define KVP_WIRE_NONCE_LEN 16u
#define KVP_WIRE_MAC_LEN 32u
#define KVP_WIRE_KEY_MAX 64u
#define KVP_WIRE_STR_MAX 255u
#define KVP_WIRE_LIST_MAX 65536u
#define KVP_WIRE_BLOB_MAX 65536u
/* Longest compatibility string a BYE carries (longer ones are cut, "..."). */
#define KVP_WIRE_COMPAT_MAX 40u
/* Hard frame limits: before the handshake completes, only handshake frames
 * of bounded size are accepted. */
#define KVP_WIRE_FRAME_MAX (8u * 1024 * 1024)
#define KVP_WIRE_FRAME_MAX_PREHS (KVP_WIRE_BLOB_MAX + 1024u)

/* X-macro: name, type code, may appear before the handshake completes,
 * maximum payload length. The one place the message set is defined. */
#define KVP_WIRE_MESSAGES(X)                                                                       \
    X(HELLO, 1, 1, 1024u)                                                                          \
    X(AUTH, 2, 1, 2u * KVP_WIRE_EPOCH_LEN + KVP_WIRE_MAC_LEN)                                      \
    X(HELLO_ACK, 3, 1, 2u * KVP_WIRE_EPOCH_LEN + 20u + KVP_WIRE_BLOB_MAX)                         \
    X(PING, 4, 0, 2u * KVP_WIRE_EPOCH_LEN + 16u)                                                   \
    X(PONG, 5, 0, 2u * KVP_WIRE_EPOCH_LEN + 16u)                                                   \
    X(BYE, 6, 1, 2u * KVP_WIRE_EPOCH_LEN + 3u + KVP_WIRE_COMPAT_MAX)                               \
    X(LOOKUP, 7, 0, KVP_WIRE_FRAME_MAX)                                                            \
    X(LOOKUP_RESP, 8, 0, KVP_WIRE_FRAME_MAX)                                                       \
    X(FETCH, 9, 0, KVP_WIRE_FRAME_MAX)                                                             \
    X(FETCH_DONE, 10, 0, KVP_WIRE_FRAME_MAX)                                                       \
    X(ABORT, 11, 0, 2u * KVP_WIRE_EPOCH_LEN + 16u)                                                 \
    X(ABORT_ACK, 12, 0, 2u * KVP_WIRE_EPOCH_LEN + 16u)

typedef enum kvp_msg_type {
#define KVP_WIRE_ENUM_(name, code, prehs, max) KVP_MSG_##name = code,
    KVP_WIRE_MESSAGES(KVP_WIRE_ENUM_)
#undef KVP_WIRE_ENUM_
} kvp_msg_type_t;

const char *kvp_msg_type_str(uint16_t type); /* "UNKNOWN" for bad codes */

/* BYE reasons. GRACEFUL is the only non-fault reason. */
typedef enum kvp_bye_reason {
    KVP_BYE_GRACEFUL = 0,
    KVP_BYE_PROTOCOL = 1,
    KVP_BYE_ABORT_ACK_TIMEOUT = 2, /* consumer escalation; siblings treat like a crash */
    KVP_BYE_DEAD = 3,              /* heartbeat loss */
    KVP_BYE_DUPLICATE = 4,         /* refused duplicate / lost simultaneous dial */
    KVP_BYE_INCOMPATIBLE = 5,
    KVP_BYE_AUTH = 6,
    KVP_BYE_LIMIT = 7,             /* session cap */
    KVP_BYE_SHUTDOWN = 8,          /* node shutting down after its drain (graceful) */
    KVP_BYE_IDLE = 9,              /* idle timeout (graceful) */
    KVP_BYE_TRANSPORT = 10,        /* data-transport error on this peer */
} kvp_bye_reason_t;

const char *kvp_bye_reason_str(uint16_t reason);
/* GRACEFUL, SHUTDOWN and IDLE are graceful; every other reason is a fault. */
bool kvp_bye_reason_is_fault(uint16_t reason);

/* LOOKUP_RESP result per key. */
enum { KVP_LOOKUP_MISS = 0, KVP_LOOKUP_HIT = 1 };
/* LOOKUP modes, carried in the frame header's `flags` (LOOKUP and, echoed by
 * a source that honoured them, LOOKUP_RESP). Unknown header flags are
 * ignored, so a source that predates them answers in the general mode: the
 * consumer then reads the prefix off the per-key results itself.
 *   PREFIX  the keys are one request's blocks in order; the source answers
 *           HIT for the longest held prefix only and pins just that prefix
 *           (keys after the first miss are not looked up).
 *   RENEW   n = 0: a lease heartbeat -- extends the pin lease of every
 *           unfetched lookup round of request_id on this session.
 *   LIMIT   (LOOKUP_RESP only; issue 27) some MISS answers are refusals at
 *           one of the source's per-peer budgets (pins, rounds, memory), not
 *           absent keys: the consumer reports KVP_ERR_LIMIT (its HITs stay
 *           valid and pinned). A consumer that predates the flag ignores it
 *           and sees MISS, as before: compatible, no version change. */
enum { KVP_LOOKUP_F_PREFIX = 1u << 0, KVP_LOOKUP_F_RENEW = 1u << 1, KVP_LOOKUP_F_LIMIT = 1u << 2 };
/* FETCH flags. HINT: the consumer was told (by a router's map) that the
 * source holds these keys and fetches without a lookup; the source looks
 * them up at fetch time and answers NOT_FOUND at once if any is gone (a
 * stale hint), never parks. A source that predates the flag answers the
 * same way (no supply for the round). */
enum { KVP_FETCH_WAIT_FOR_SUPPLY = 1u << 0, KVP_FETCH_HINT = 1u << 1 };
/* HELLO flags. */
enum { KVP_HELLO_AUTH_REQUIRED = 1u << 0 };

typedef struct kvp_epoch {
    uint8_t b[KVP_WIRE_EPOCH_LEN];
} kvp_epoch_t;

bool kvp_epoch_is_zero(const kvp_epoch_t *e);
bool kvp_epoch_eq(const kvp_epoch_t *a, const kvp_epoch_t *b);
/* A fresh random non-zero epoch. */
kvp_status_t kvp_epoch_new(kvp_epoch_t *e);

/* Keys and strings point into the decoded frame's buffer (zero-copy). */
typedef struct kvp_key {
    const uint8_t *data;
    uint32_t len;
} kvp_key_t;

typedef struct kvp_msg_hello {
    uint16_t major, minor;
    char peer_id[KVP_WIRE_STR_MAX + 1];     /* NUL-terminated copy */
    char instance_id[KVP_WIRE_STR_MAX + 1]; /* NUL-terminated copy */
    kvp_epoch_t epoch;
    uint32_t num_blocks, block_size;
    uint64_t fingerprint, hash_seed;
    uint8_t nonce[KVP_WIRE_NONCE_LEN];
    uint32_t flags;
} kvp_msg_hello_t;

typedef struct kvp_msg_auth {
    uint8_t mac[KVP_WIRE_MAC_LEN];
} kvp_msg_auth_t;

typedef struct kvp_msg_hello_ack {
    kvp_epoch_t acked_epoch;
    const uint8_t *blob;
    uint32_t blob_len;
} kvp_msg_hello_ack_t;

typedef struct kvp_msg_ping {
    uint64_t seq, sent_ns;
} kvp_msg_ping_t; /* PING and PONG */

typedef struct kvp_msg_bye {
    uint16_t reason;
    /* Minor 1, optional: the sender's compatibility string (NUL-terminated,
     * "" = absent), only with KVP_BYE_INCOMPATIBLE; printable ASCII. */
    char compat[KVP_WIRE_COMPAT_MAX + 1];
} kvp_msg_bye_t;

typedef struct kvp_msg_lookup {
    uint64_t request_id, round;
    uint32_t n;
    const kvp_key_t *keys;
} kvp_msg_lookup_t;

typedef struct kvp_msg_lookup_resp {
    uint64_t request_id, round;
    uint32_t n;
    const uint8_t *results;
} kvp_msg_lookup_resp_t;

typedef struct kvp_fetch_item {
    kvp_key_t key;
    uint32_t dst_slot, dst_gen;
} kvp_fetch_item_t;

typedef struct kvp_msg_fetch {
    uint64_t request_id, round;
    uint32_t flags;
    uint32_t n; /* 0 = terminal "request finished" */
    const kvp_fetch_item_t *items;
} kvp_msg_fetch_t;

typedef struct kvp_fetch_block {
    uint8_t ok;
    kvp_digest_t digest;
} kvp_fetch_block_t;

typedef struct kvp_msg_fetch_done {
    uint64_t request_id, round;
    int32_t status; /* kvp_status_t */
    uint32_t n;
    const kvp_fetch_block_t *blocks;
} kvp_msg_fetch_done_t;

typedef struct kvp_msg_abort {
    uint64_t request_id, round;
} kvp_msg_abort_t; /* ABORT and ABORT_ACK */

typedef struct kvp_msg {
    uint16_t type; /* kvp_msg_type_t */
    uint16_t flags;
    kvp_epoch_t src_epoch, dst_epoch; /* absent (zero) for HELLO only */
    union {
        kvp_msg_hello_t hello;
        kvp_msg_auth_t auth;
        kvp_msg_hello_ack_t hello_ack;
        kvp_msg_ping_t ping;
        kvp_msg_bye_t bye;
        kvp_msg_lookup_t lookup;
        kvp_msg_lookup_resp_t lookup_resp;
        kvp_msg_fetch_t fetch;
        kvp_msg_fetch_done_t fetch_done;
        kvp_msg_abort_t abort;
    } u;
} kvp_msg_t;

/* Decoder context: what the receiver knows. */
typedef struct kvp_wire_ctx {
    bool handshake_done;       /* stricter limits before */
    uint32_t peer_num_blocks;  /* FETCH dst_slot must be < this (0 = unknown: refuse FETCH) */
} kvp_wire_ctx_t;

/* Scratch for decoded lists (owned by the caller, reused; one per owner
 * thread). Decoded arrays point into it and into the frame buffer; both must
 * stay unchanged while the kvp_msg_t is used. */
/* Implementation note: one kvp__malloc'ed buffer with room for
 * KVP_WIRE_LIST_MAX entries of the largest list kind, shared by all kinds (a
 * frame carries one list), so the next decode with the same scratch
 * overwrites the previous message's keys/items/blocks arrays. */
typedef struct kvp_wire_scratch kvp_wire_scratch_t;
kvp_status_t kvp_wire_scratch_create(kvp_wire_scratch_t **out);
void kvp_wire_scratch_destroy(kvp_wire_scratch_t *s);

typedef struct kvp_frame_hdr {
    uint32_t length; /* payload bytes */
    uint16_t type;
    uint16_t flags;
} kvp_frame_hdr_t;

/* Parse a frame header at the start of buf[0..len).
 *   KVP_OK             *hdr written; the whole frame is hdr->length + 8 bytes
 *                      (may not all be in buf yet)
 *   KVP_ERR_TRUNCATED  fewer than 8 bytes: read more
 *   KVP_ERR_PROTO      unknown type, type not allowed before the handshake,
 *                      or length over the type's limit / the frame limit */
kvp_status_t kvp_wire_parse_hdr(const kvp_wire_ctx_t *ctx, const uint8_t *buf, size_t len,
                                kvp_frame_hdr_t *hdr);
/* Added helper: kvp_wire_parse_hdr that also explains a KVP_ERR_PROTO in
 * why[0..why_len) (may be NULL), for the connection layer's log line.
 * Note: KVP_WIRE_FRAME_MAX and KVP_WIRE_FRAME_MAX_PREHS count the 8-byte
 * header, so a receive buffer of KVP_WIRE_FRAME_MAX bytes always holds a
 * whole frame; per-type limits (X-macro) count the payload only. */
kvp_status_t kvp_wire_parse_hdr_why(const kvp_wire_ctx_t *ctx, const uint8_t *buf, size_t len,
                                    kvp_frame_hdr_t *hdr, char *why, size_t why_len);

/* Decode one complete frame (header + payload, exactly `len` bytes).
 * KVP_ERR_PROTO for anything that breaks a rule; `why` (may be NULL) gets a
 * short description naming the rule ("key length 0", "trailing bytes", ...).
 * Nothing is allocated. */
kvp_status_t kvp_wire_decode(const kvp_wire_ctx_t *ctx, const uint8_t *frame, size_t len,
                             kvp_wire_scratch_t *scratch, kvp_msg_t *msg, char *why,
                             size_t why_len);

/* Bytes the encoded frame of m will take (header included); 0 if m breaks a
 * rule (kvp_wire_encode would return KVP_ERR_INVALID). */
size_t kvp_wire_encoded_size(const kvp_msg_t *m);
/* Encode m into buf[0..cap). KVP_ERR_INVALID if m breaks a rule (a key of 0
 * or > 64 bytes, a list over its bound, ...), KVP_ERR_NOSPACE if cap is too
 * small; *len_out written on KVP_OK. */
kvp_status_t kvp_wire_encode(const kvp_msg_t *m, uint8_t *buf, size_t cap, size_t *len_out);

/* The identity every wire major version's HELLO starts with (u16 major,
 * u16 minor, str peer_id, str instance_id, epoch), read from a HELLO frame
 * (header included) that may not decode under our version, so the control
 * layer can refuse a peer of another major version clearly. */
typedef struct kvp_wire_hello_id {
    uint16_t major, minor;
    char peer_id[KVP_WIRE_STR_MAX + 1];
    kvp_epoch_t epoch; /* may be zero: the peer sent none */
} kvp_wire_hello_id_t;
/* KVP_OK and *out written when frame[0..len) is a HELLO whose shared prefix
 * reads within bounds; KVP_ERR_PROTO otherwise (not a HELLO, truncated). */
kvp_status_t kvp_wire_peek_hello(const uint8_t *frame, size_t len, kvp_wire_hello_id_t *out);

/* The form of a compatibility string a BYE carries: bytes outside printable
 * ASCII become '?', and a string over KVP_WIRE_COMPAT_MAX bytes is cut and
 * ends in "..." (out has KVP_WIRE_COMPAT_MAX + 1 bytes). "" stays "". */
void kvp_wire_compat_for_bye(const char *compat, char out[KVP_WIRE_COMPAT_MAX + 1]);

/* Added helper: true if a and b carry the same message (type, flags,
 * epochs, and every field of the type's payload; lists compared by content,
 * not by pointer). For tests, the fuzz target and debug checks. */
bool kvp_wire_msg_eq(const kvp_msg_t *a, const kvp_msg_t *b);

#endif /* KVP_WIRE_H */
