/*
 * wire_int.h -- internals shared by wire.c (decoder) and wire_encode.c: the
 * per-type table generated from the X-macro, and the bounds-checked cursor.
 *
 * The cursor is the only code that touches frame bytes. Every read checks the
 * bytes left first; integers are assembled byte by byte, little-endian, so no
 * struct is ever overlaid on the wire and host byte order never leaks.
 */
#ifndef KVP_WIRE_INT_H
#define KVP_WIRE_INT_H

#include "wire/wire.h"

#include <string.h>

/* One row per message type, from KVP_WIRE_MESSAGES. */
typedef struct kvp_wire_type_info {
    const char *name; /* NULL: no such type */
    bool prehs;       /* may arrive before the handshake completes */
    uint32_t max;     /* payload limit for this type */
} kvp_wire_type_info_t;

/* The row for `type`, or NULL for an unknown code. */
const kvp_wire_type_info_t *kvp__wire_type_info(uint16_t type);

/* Fixed sizes of list entries on the wire (keys excluded: 1 + len each). */
#define KVP_WIRE_EPOCHS_LEN (2u * KVP_WIRE_EPOCH_LEN)
#define KVP_WIRE_LIST_HDR_LEN 20u  /* u64 request_id, u64 round, u32 n */
#define KVP_WIRE_FETCH_HDR_LEN 24u /* ... plus u32 flags */
#define KVP_WIRE_FETCH_ITEM_FIXED 8u  /* u32 dst_slot, u32 dst_gen after the key */
#define KVP_WIRE_FETCH_BLOCK_LEN 17u  /* u8 ok, u64 lo, u64 hi */

/* ------------------------------------------------------------ reader */

/* Reads buf[pos..len). The buffer is borrowed; nothing is copied. */
typedef struct kvp_wire_rd {
    const uint8_t *buf;
    size_t pos, len;
} kvp_wire_rd_t;

static inline size_t kvp_wire_rd_left(const kvp_wire_rd_t *r)
{
    return r->len - r->pos;
}

static inline uint16_t kvp_wire_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}

static inline uint32_t kvp_wire_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t kvp_wire_le64(const uint8_t *p)
{
    return (uint64_t)kvp_wire_le32(p) | (uint64_t)kvp_wire_le32(p + 4) << 32;
}

static inline bool kvp_wire_rd_u8(kvp_wire_rd_t *r, uint8_t *v)
{
    if (kvp_wire_rd_left(r) < 1)
        return false;
    *v = r->buf[r->pos++];
    return true;
}

static inline bool kvp_wire_rd_u16(kvp_wire_rd_t *r, uint16_t *v)
{
    if (kvp_wire_rd_left(r) < 2)
        return false;
    *v = kvp_wire_le16(r->buf + r->pos);
    r->pos += 2;
    return true;
}

static inline bool kvp_wire_rd_u32(kvp_wire_rd_t *r, uint32_t *v)
{
    if (kvp_wire_rd_left(r) < 4)
        return false;
    *v = kvp_wire_le32(r->buf + r->pos);
    r->pos += 4;
    return true;
}

static inline bool kvp_wire_rd_u64(kvp_wire_rd_t *r, uint64_t *v)
{
    if (kvp_wire_rd_left(r) < 8)
        return false;
    *v = kvp_wire_le64(r->buf + r->pos);
    r->pos += 8;
    return true;
}

/* Borrow n bytes of the frame (zero-copy). */
static inline bool kvp_wire_rd_ptr(kvp_wire_rd_t *r, size_t n, const uint8_t **p)
{
    if (kvp_wire_rd_left(r) < n)
        return false;
    *p = r->buf + r->pos;
    r->pos += n;
    return true;
}

static inline bool kvp_wire_rd_copy(kvp_wire_rd_t *r, void *dst, size_t n)
{
    if (kvp_wire_rd_left(r) < n)
        return false;
    memcpy(dst, r->buf + r->pos, n);
    r->pos += n;
    return true;
}

/* ------------------------------------------------------------ writer */

/* Writes buf[pos..cap). A write that does not fit sets `overflow` and writes
 * nothing; the encoder sizes the frame first, so overflow means a sizing bug
 * and is reported as KVP_ERR_NOSPACE rather than a memory overrun. */
typedef struct kvp_wire_wr {
    uint8_t *buf;
    size_t pos, cap;
    bool overflow;
} kvp_wire_wr_t;

static inline bool kvp_wire_wr_room(kvp_wire_wr_t *w, size_t n)
{
    if (w->cap - w->pos < n) {
        w->overflow = true;
        return false;
    }
    return true;
}

static inline void kvp_wire_wr_u8(kvp_wire_wr_t *w, uint8_t v)
{
    if (kvp_wire_wr_room(w, 1))
        w->buf[w->pos++] = v;
}

static inline void kvp_wire_wr_u16(kvp_wire_wr_t *w, uint16_t v)
{
    if (!kvp_wire_wr_room(w, 2))
        return;
    w->buf[w->pos++] = (uint8_t)v;
    w->buf[w->pos++] = (uint8_t)(v >> 8);
}

static inline void kvp_wire_wr_u32(kvp_wire_wr_t *w, uint32_t v)
{
    if (!kvp_wire_wr_room(w, 4))
        return;
    for (int i = 0; i < 4; i++)
        w->buf[w->pos++] = (uint8_t)(v >> (8 * i));
}

static inline void kvp_wire_wr_u64(kvp_wire_wr_t *w, uint64_t v)
{
    if (!kvp_wire_wr_room(w, 8))
        return;
    for (int i = 0; i < 8; i++)
        w->buf[w->pos++] = (uint8_t)(v >> (8 * i));
}

static inline void kvp_wire_wr_bytes(kvp_wire_wr_t *w, const void *src, size_t n)
{
    if (n == 0 || !kvp_wire_wr_room(w, n))
        return;
    memcpy(w->buf + w->pos, src, n);
    w->pos += n;
}

/* Printable ASCII (0x20..0x7e) only: strings an operator reads in logs. */
static inline bool kvp_wire_printable(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] < 0x20 || p[i] > 0x7e)
            return false;
    return true;
}

#endif /* KVP_WIRE_INT_H */
