/* xxh3_avx2.c -- bench only: xxh3-128 compiled inline with AVX2, to show
 * what kvp_digest would reach if the common layer built xxh3 with runtime
 * dispatch instead of calling the distribution's libxxhash (built for SSE2).
 * Compiled with -mavx2; called only when the CPU has AVX2. */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "xxh3_avx2.h"

void store_bench_xxh3_avx2(const void *data, size_t len, uint64_t seed, uint64_t out[2])
{
    XXH128_hash_t h = XXH3_128bits_withSeed(data, len, seed);
    out[0] = h.low64;
    out[1] = h.high64;
}
