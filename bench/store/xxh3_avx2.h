/* xxh3_avx2.h -- bench only, see xxh3_avx2.c. */
#ifndef STORE_BENCH_XXH3_AVX2_H
#define STORE_BENCH_XXH3_AVX2_H
#include <stddef.h>
#include <stdint.h>
void store_bench_xxh3_avx2(const void *data, size_t len, uint64_t seed, uint64_t out[2]);
#endif
