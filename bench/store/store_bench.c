/* store_bench.c -- block store micro-benchmarks (release build; figures are
 * printed, not asserted).
 *
 *   index: 1M slots x 4 KiB over a reserved, unpopulated region; keys of 24
 *          bytes; hit lookups (lookup + unpin) and miss lookups in random
 *          order; reserve + commit + evict cycles on a full store.
 *   checksum: xxh3-128 over a cold 512 MiB buffer of 2 MiB blocks next to a
 *          plain read pass (sum of 64-bit words) over the same buffer.
 *
 * Times are thread CPU time (see now_s).
 *
 * Usage: store_bench [num_slots [checksum_MiB]]
 */
#include "store/store.h"
#include "xxh3_avx2.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define KEY_LEN 24

/* Rates use this thread's CPU time: the machine is shared (several builds
 * run beside the bench), and wall time would measure the scheduler. */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void make_key(char *k, const char *prefix, uint32_t i)
{
    char tmp[KEY_LEN + 16];
    snprintf(tmp, sizeof(tmp), "%s/layer%02u/blk%010u", prefix, i % 61, i);
    memcpy(k, tmp, KEY_LEN);
}

/* Keys in random order, laid out in that order so reading them is sequential
 * and the measured misses are the store's own. */
static char *make_keys(const char *prefix, uint32_t n, uint64_t seed)
{
    char *keys = malloc((size_t)n * KEY_LEN);
    uint32_t *perm = malloc((size_t)n * sizeof(*perm));
    kvp_rng_t r;
    kvp_rng_seed(&r, seed);
    for (uint32_t i = 0; i < n; i++)
        perm[i] = i;
    for (uint32_t i = n - 1; i > 0; i--) {
        uint32_t j = (uint32_t)kvp_rng_below(&r, i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (uint32_t i = 0; i < n; i++)
        make_key(keys + (size_t)i * KEY_LEN, prefix, perm[i]);
    free(perm);
    return keys;
}

static int bench_index(uint32_t n)
{
    size_t len = (size_t)n * 4096;
    void *region =
        mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (region == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    kvp_store_config_t cfg = {
        .num_blocks = n, .block_size = 4096, .region = region, .region_len = len, .hash_seed = 42};
    kvp_store_t *s;
    if (kvp_store_create(&cfg, &s) != KVP_OK) {
        fprintf(stderr, "store create failed\n");
        return 1;
    }
    char *keys = make_keys("kv", n, 1), *hits = make_keys("kv", n, 2),
         *miss = make_keys("zz", n, 3);
    char *fresh = make_keys("nw", n, 4);
    kvp_slot_ref_t ref;
    for (uint32_t i = 0; i < n; i++) {
        if (kvp_store_reserve(s, keys + (size_t)i * KEY_LEN, KEY_LEN, 0, &ref, NULL) != KVP_OK ||
            kvp_store_commit(s, ref) != KVP_OK) {
            fprintf(stderr, "fill failed at %u\n", i);
            return 1;
        }
    }
    uint64_t bad = 0;
    for (int round = 0; round < 2; round++) { /* round 0 warms up */
        double t0 = now_s();
        for (uint32_t i = 0; i < n; i++) {
            bad += kvp_store_lookup(s, hits + (size_t)i * KEY_LEN, KEY_LEN, &ref, NULL, NULL) !=
                   KVP_OK;
            kvp_store_unpin(s, ref);
        }
        double t1 = now_s();
        for (uint32_t i = 0; i < n; i++)
            bad += kvp_store_lookup(s, miss + (size_t)i * KEY_LEN, KEY_LEN, NULL, NULL, NULL) !=
                   KVP_ERR_NOT_FOUND;
        double t2 = now_s();
        const void *kp[64];
        size_t kl[64];
        kvp_slot_ref_t refs[64];
        kvp_status_t res[64];
        for (int j = 0; j < 64; j++)
            kl[j] = KEY_LEN;
        double t3 = now_s();
        for (uint32_t i = 0; i + 64 <= n; i += 64) {
            for (int j = 0; j < 64; j++)
                kp[j] = hits + (size_t)(i + j) * KEY_LEN;
            bad += 64 - kvp_store_lookup_many(s, 64, kp, kl, refs, res);
            for (int j = 0; j < 64; j++)
                kvp_store_unpin(s, refs[j]);
        }
        double t4 = now_s();
        if (round == 1) {
            printf("slots                    %u x 4096 B\n", n);
            printf("hit lookups/s            %.2f M  (lookup + unpin, random order)\n",
                   n / (t1 - t0) / 1e6);
            printf("miss lookups/s           %.2f M\n", n / (t2 - t1) / 1e6);
            printf("hit lookups/s, batched   %.2f M  (kvp_store_lookup_many of 64 + unpins)\n",
                   (n & ~63u) / (t4 - t3) / 1e6);
        }
    }
    double t0 = now_s();
    for (uint32_t i = 0; i < n; i++) {
        bad += kvp_store_reserve(s, fresh + (size_t)i * KEY_LEN, KEY_LEN, 0, &ref, NULL) != KVP_OK;
        bad += kvp_store_commit(s, ref) != KVP_OK;
    }
    double t1 = now_s();
    printf("reserve+commit+evict/s   %.2f M  (includes xxh3-128 of each cold 4 KiB block)\n",
           n / (t1 - t0) / 1e6);
    printf("metadata bytes/slot      %zu  (+ key arena %zu B/slot)\n",
           kvp_store_meta_bytes_per_slot(s), kvp_store_key_bytes_per_slot(s));
    char why[256];
    if (kvp_store_check(s, why, sizeof(why)) != KVP_OK || bad) {
        fprintf(stderr, "store inconsistent (%llu bad results): %s\n", (unsigned long long)bad,
                why);
        return 1;
    }
    kvp_store_destroy(s);
    free(keys);
    free(hits);
    free(miss);
    free(fresh);
    munmap(region, len);
    return 0;
}

static int bench_checksum(size_t mib)
{
    const size_t block = 2u << 20, len = mib << 20, nblk = len / block;
    uint64_t *buf =
        mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (buf == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    kvp_rng_t r;
    kvp_rng_seed(&r, 9);
    for (size_t i = 0; i < len / 8; i++)
        buf[i] = kvp_rng_next(&r);
    double best_read = 1e9, best_hash = 1e9, best_avx2 = 1e9;
    uint64_t sink = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now_s();
        uint64_t a = 0, b = 0, c = 0, d = 0;
        for (size_t i = 0; i < len / 8; i += 4) {
            a += buf[i];
            b += buf[i + 1];
            c += buf[i + 2];
            d += buf[i + 3];
        }
        sink += a + b + c + d;
        double t1 = now_s();
        for (size_t k = 0; k < nblk; k++) {
            kvp_digest_t dg = kvp_digest((char *)buf + k * block, block, 42);
            sink += dg.lo;
        }
        double t2 = now_s();
        if (__builtin_cpu_supports("avx2")) {
            for (size_t k = 0; k < nblk; k++) {
                uint64_t dg[2];
                store_bench_xxh3_avx2((char *)buf + k * block, block, 42, dg);
                sink += dg[0];
            }
        }
        double t3 = now_s();
        best_avx2 = t3 - t2 < best_avx2 ? t3 - t2 : best_avx2;
        best_read = t1 - t0 < best_read ? t1 - t0 : best_read;
        best_hash = t2 - t1 < best_hash ? t2 - t1 : best_hash;
    }
    double rd = (double)len / best_read / 1e9, hs = (double)len / best_hash / 1e9;
    printf("cold buffer              %zu MiB of 2 MiB blocks (best of 3)\n", mib);
    printf("read pass GB/s           %.2f  (sum of 64-bit words)\n", rd);
    printf(
        "xxh3-128 GB/s            %.2f  (kvp_digest; ratio %.2fx of the read pass)  [sink %llx]\n",
        hs, hs / rd, (unsigned long long)(sink & 0xf));
    if (__builtin_cpu_supports("avx2")) {
        double av = (double)len / best_avx2 / 1e9;
        kvp_digest_t a = kvp_digest(buf, block, 42);
        uint64_t b[2];
        store_bench_xxh3_avx2(buf, block, 42, b);
        printf("xxh3-128 AVX2 GB/s       %.2f  (ratio %.2fx; same digest as kvp_digest: %s)\n", av,
               av / rd, a.lo == b[0] && a.hi == b[1] ? "yes" : "NO");
    }
    munmap(buf, len);
    return 0;
}

int main(int argc, char **argv)
{
    uint32_t n = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 0) : 1u << 20;
    size_t mib = argc > 2 ? strtoul(argv[2], NULL, 0) : 512;
    kvp_log_set_level(KVP_LOG_WARN);
    if (bench_index(n))
        return 1;
    return bench_checksum(mib);
}
