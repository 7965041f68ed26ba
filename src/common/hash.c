/* hash.c -- xxh3 digests (libxxhash), random bytes, deterministic PRNG. */
#include "common.h"

#include <errno.h>
#include <sys/random.h>
#include <xxhash.h>

kvp_digest_t kvp__digest_avx2(const void *data, size_t len, uint64_t seed); /* hash_avx2.c */

static kvp_digest_t digest_generic(const void *data, size_t len, uint64_t seed)
{
    XXH128_hash_t h = XXH3_128bits_withSeed(data, len, seed);
    kvp_digest_t d = {h.low64, h.high64};
    return d;
}

/* Runtime dispatch: the AVX2 build of xxh3 when the CPU has it, else the
 * distribution's library. Same digest either way. */
static kvp_digest_t (*digest_impl)(const void *, size_t, uint64_t);

__attribute__((constructor)) static void digest_pick(void)
{
    __builtin_cpu_init();
    digest_impl = __builtin_cpu_supports("avx2") ? kvp__digest_avx2 : digest_generic;
}

kvp_digest_t kvp_digest(const void *data, size_t len, uint64_t seed)
{
    return digest_impl(data, len, seed);
}

uint64_t kvp_hash64(const void *data, size_t len, uint64_t seed)
{
    return XXH3_64bits_withSeed(data, len, seed);
}

#ifdef KVP_TESTING
void (*kvp__random_hook)(void *buf, size_t len, void *arg);
void *kvp__random_hook_arg;
#endif

kvp_status_t kvp_random_bytes(void *buf, size_t len)
{
#ifdef KVP_TESTING
    if (kvp__random_hook != NULL) {
        kvp__random_hook(buf, len, kvp__random_hook_arg);
        return KVP_OK;
    }
#endif
    unsigned char *p = buf;
    while (len > 0) {
        ssize_t n = getrandom(p, len, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return KVP_ERR_IO;
        }
        p += n;
        len -= (size_t)n;
    }
    return KVP_OK;
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kvp_rng_seed(kvp_rng_t *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

uint64_t kvp_rng_next(kvp_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

uint64_t kvp_rng_below(kvp_rng_t *r, uint64_t bound)
{
    KVP_ASSERT(bound > 0);
    return kvp_rng_next(r) % bound;
}
