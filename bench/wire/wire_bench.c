/*
 * wire_bench.c -- decoder and encoder throughput for LOOKUP frames of 1, 64
 * and 1024 keys of 32 bytes (goal: decoder >= 1 GB/s in a release build).
 *
 *   wire_bench [seconds-per-case]     (default 0.3)
 * GB/s counts frame bytes (header included) per second, 1 GB = 1e9 bytes.
 */
#include "wire/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct bench_case {
    uint32_t nkeys;
    kvp_key_t *keys;
    uint8_t *keybytes;
    kvp_msg_t msg;
    uint8_t *frame;
    size_t len;
} bench_case_t;

static void case_init(bench_case_t *c, uint32_t nkeys)
{
    c->nkeys = nkeys;
    c->keys = calloc(nkeys, sizeof(*c->keys));
    c->keybytes = malloc((size_t)nkeys * 32);
    if (c->keys == NULL || c->keybytes == NULL)
        abort();
    for (uint32_t i = 0; i < nkeys; i++) {
        for (int j = 0; j < 32; j++)
            c->keybytes[i * 32 + j] = (uint8_t)(i * 7 + j);
        c->keys[i] = (kvp_key_t){c->keybytes + (size_t)i * 32, 32};
    }
    memset(&c->msg, 0, sizeof(c->msg));
    c->msg.type = KVP_MSG_LOOKUP;
    memset(c->msg.src_epoch.b, 0x11, KVP_WIRE_EPOCH_LEN);
    memset(c->msg.dst_epoch.b, 0x22, KVP_WIRE_EPOCH_LEN);
    c->msg.u.lookup = (kvp_msg_lookup_t){42, 1, nkeys, c->keys};
    size_t cap = kvp_wire_encoded_size(&c->msg);
    c->frame = malloc(cap);
    if (c->frame == NULL || kvp_wire_encode(&c->msg, c->frame, cap, &c->len) != KVP_OK)
        abort();
}

static void case_fini(bench_case_t *c)
{
    free(c->keys);
    free(c->keybytes);
    free(c->frame);
}

static double now_s(void)
{
    return (double)kvp_clock_now(kvp_clock_real()) / 1e9;
}

/* Runs `op` in batches until `secs` pass; returns GB/s and ns per frame. */
static double bench_decode(bench_case_t *c, kvp_wire_scratch_t *s, double secs, double *ns_per)
{
    const kvp_wire_ctx_t ctx = {.handshake_done = true, .peer_num_blocks = 1};
    uint64_t iters = 0, sink = 0;
    double t0 = now_s(), t;
    do {
        for (int i = 0; i < 256; i++) {
            kvp_msg_t m;
            if (kvp_wire_decode(&ctx, c->frame, c->len, s, &m, NULL, 0) != KVP_OK)
                abort();
            sink += m.u.lookup.keys[m.u.lookup.n - 1].len;
        }
        iters += 256;
        t = now_s() - t0;
    } while (t < secs);
    if (sink == 0)
        abort();
    *ns_per = t * 1e9 / (double)iters;
    return (double)c->len * (double)iters / t / 1e9;
}

static double bench_encode(bench_case_t *c, double secs, double *ns_per)
{
    uint64_t iters = 0;
    double t0 = now_s(), t;
    do {
        for (int i = 0; i < 256; i++) {
            size_t len;
            if (kvp_wire_encode(&c->msg, c->frame, c->len, &len) != KVP_OK)
                abort();
        }
        iters += 256;
        t = now_s() - t0;
    } while (t < secs);
    *ns_per = t * 1e9 / (double)iters;
    return (double)c->len * (double)iters / t / 1e9;
}

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 0.3;
    static const uint32_t sizes[] = {1, 64, 1024};
    kvp_wire_scratch_t *s;
    if (kvp_wire_scratch_create(&s) != KVP_OK)
        return 1;
    printf("wire_bench: LOOKUP frames, 32-byte keys, %.2f s per case\n", secs);
    printf("%-6s %9s %12s %12s %12s %12s\n", "keys", "bytes", "dec GB/s", "dec ns/frm",
           "enc GB/s", "enc ns/frm");
    for (size_t i = 0; i < KVP_ARRAY_SIZE(sizes); i++) {
        bench_case_t c;
        double dns, ens;
        case_init(&c, sizes[i]);
        double dec = bench_decode(&c, s, secs, &dns);
        double enc = bench_encode(&c, secs, &ens);
        printf("%-6u %9zu %12.2f %12.1f %12.2f %12.1f\n", sizes[i], c.len, dec, dns, enc, ens);
        case_fini(&c);
    }
    kvp_wire_scratch_destroy(s);
    return 0;
}
