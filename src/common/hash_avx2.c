/* hash_avx2.c -- xxh3-128 compiled inline with AVX2 (this file only is built
 * with -mavx2). Debian's libxxhash is built for SSE2 and reached 0.4-0.9x of
 * a plain read pass here; this reaches ~1x. Called only after a runtime CPU
 * check (hash.c); the digest is identical (xxh3 is a fixed function). */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "common.h"

kvp_digest_t kvp__digest_avx2(const void *data, size_t len, uint64_t seed);

kvp_digest_t kvp__digest_avx2(const void *data, size_t len, uint64_t seed)
{
    XXH128_hash_t h = XXH3_128bits_withSeed(data, len, seed);
    kvp_digest_t d = {h.low64, h.high64};
    return d;
}
