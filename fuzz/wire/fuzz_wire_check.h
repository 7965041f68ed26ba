/*
 * fuzz_wire_check.h -- the one check shared by the libFuzzer target and the
 * corpus replay test (header-only, static).
 *
 * The input is treated as a byte stream: frames are cut with the resumable
 * header step and decoded, under a pre-handshake and a post-handshake
 * context. Every frame that decodes must re-encode to exactly its input
 * bytes (the encoding is canonical), and decode again to an equal message.
 * Scratch and buffers are owned by the caller.
 */
#ifndef KVP_FUZZ_WIRE_CHECK_H
#define KVP_FUZZ_WIRE_CHECK_H

#include "wire/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct kvp_fuzz_wire {
    kvp_wire_scratch_t *s1, *s2; /* one for the decode, one for the re-decode */
    uint8_t *enc;                /* re-encode buffer, KVP_WIRE_FRAME_MAX bytes */
    uint64_t frames_ok, frames_bad;
} kvp_fuzz_wire_t;

static inline int kvp_fuzz_wire_init(kvp_fuzz_wire_t *f)
{
    memset(f, 0, sizeof(*f));
    f->enc = malloc(KVP_WIRE_FRAME_MAX);
    if (f->enc == NULL || kvp_wire_scratch_create(&f->s1) != KVP_OK ||
        kvp_wire_scratch_create(&f->s2) != KVP_OK)
        return -1;
    return 0;
}

static inline void kvp_fuzz_wire_fini(kvp_fuzz_wire_t *f)
{
    kvp_wire_scratch_destroy(f->s1);
    kvp_wire_scratch_destroy(f->s2);
    free(f->enc);
}

/* Checks one decoded frame; returns 0 or -1 with a message on stderr. */
static inline int kvp_fuzz_wire_reencode(kvp_fuzz_wire_t *f, const kvp_wire_ctx_t *ctx,
                                         const uint8_t *frame, size_t len, const kvp_msg_t *m)
{
    size_t elen = 0;
    kvp_msg_t m2;
    char why[160] = "";
    if (kvp_wire_encoded_size(m) != len) {
        fprintf(stderr, "fuzz_wire: encoded_size %zu != frame %zu (%s)\n",
                kvp_wire_encoded_size(m), len, kvp_msg_type_str(m->type));
        return -1;
    }
    if (kvp_wire_encode(m, f->enc, KVP_WIRE_FRAME_MAX, &elen) != KVP_OK || elen != len ||
        memcmp(f->enc, frame, len) != 0) {
        fprintf(stderr, "fuzz_wire: re-encode differs (%s)\n", kvp_msg_type_str(m->type));
        return -1;
    }
    if (kvp_wire_decode(ctx, f->enc, elen, f->s2, &m2, why, sizeof(why)) != KVP_OK ||
        !kvp_wire_msg_eq(m, &m2)) {
        fprintf(stderr, "fuzz_wire: decode(encode(m)) != m (%s: %s)\n", kvp_msg_type_str(m->type),
                why);
        return -1;
    }
    return 0;
}

/* Runs the stream under one context. */
static inline int kvp_fuzz_wire_stream(kvp_fuzz_wire_t *f, const kvp_wire_ctx_t *ctx,
                                       const uint8_t *data, size_t size)
{
    size_t off = 0;
    for (;;) {
        kvp_frame_hdr_t hdr;
        kvp_msg_t m;
        char why[160] = "";
        kvp_status_t rc = kvp_wire_parse_hdr(ctx, data + off, size - off, &hdr);
        if (rc != KVP_OK || size - off < (size_t)hdr.length + KVP_WIRE_HDR_LEN)
            return 0; /* refused header, or the stream ends mid-frame */
        size_t flen = (size_t)hdr.length + KVP_WIRE_HDR_LEN;
        rc = kvp_wire_decode(ctx, data + off, flen, f->s1, &m, why, sizeof(why));
        if (rc == KVP_OK) {
            f->frames_ok++;
            if (kvp_fuzz_wire_reencode(f, ctx, data + off, flen, &m) != 0)
                return -1;
        } else if (rc != KVP_ERR_PROTO || why[0] == '\0') {
            fprintf(stderr, "fuzz_wire: decode returned %d without a reason\n", rc);
            return -1;
        } else {
            f->frames_bad++;
            return 0; /* a real reader closes the session here */
        }
        off += flen;
    }
}

/* The whole check for one input: 0 if every property holds. */
static inline int kvp_fuzz_wire_one(kvp_fuzz_wire_t *f, const uint8_t *data, size_t size)
{
    static const kvp_wire_ctx_t ctxs[] = {
        {.handshake_done = false, .peer_num_blocks = 0},
        {.handshake_done = true, .peer_num_blocks = 4096},
    };
    static const uint8_t empty[1];
    if (data == NULL)
        data = empty; /* libFuzzer may pass NULL with size 0 */
    for (size_t i = 0; i < sizeof(ctxs) / sizeof(ctxs[0]); i++)
        if (kvp_fuzz_wire_stream(f, &ctxs[i], data, size) != 0)
            return -1;
    return 0;
}

#endif
