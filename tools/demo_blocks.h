/*
 * demo_blocks.h -- the synthetic blocks of the kvpeerd admin API and the
 * kvpeer demo (header-only; shared by kvpeerd and the kvpeer CLI).
 *
 * Key k (0..2^32-1) is the string "blk-%08u"; its content is the stream of a
 * xoshiro256** generator seeded (through splitmix64) with 0x5eed0000 + k,
 * 8 bytes little-endian at a time: byte-identical to world_block() of the
 * node tests (tests/node/world.h), so a block put by one tool verifies in
 * another. Only kvpeer.h-level C: no internal headers.
 */
#ifndef KVPEER_DEMO_BLOCKS_H
#define KVPEER_DEMO_BLOCKS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

enum { KVPEER_DEMO_KEY_MAX = 16 }; /* "blk-" + 10 digits + NUL fits */

static inline uint64_t kvpeer_demo_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t kvpeer_demo_rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

/* Fill buf[0..len) with the content of block k. */
static inline void kvpeer_demo_block(uint32_t k, uint8_t *buf, size_t len)
{
    uint64_t s[4], seed = 0x5eed0000ull + k;
    for (int i = 0; i < 4; i++)
        s[i] = kvpeer_demo_splitmix64(&seed);
    for (size_t off = 0; off < len; off += 8) {
        uint64_t v = kvpeer_demo_rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = kvpeer_demo_rotl(s[3], 45);
        uint8_t le[8];
        for (int b = 0; b < 8; b++)
            le[b] = (uint8_t)(v >> (8 * b));
        memcpy(buf + off, le, len - off < 8 ? len - off : 8);
    }
}

/* Write the key of block k into out (>= KVPEER_DEMO_KEY_MAX bytes); returns
 * its length (without the NUL). */
static inline uint32_t kvpeer_demo_key(uint32_t k, char *out)
{
    return (uint32_t)snprintf(out, KVPEER_DEMO_KEY_MAX, "blk-%08u", k);
}

#endif
