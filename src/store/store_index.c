/*
 * store_index.c -- the block store's key index: key -> slot for FILLING and
 * READY slots. Open addressing with linear probing over a preallocated table
 * of 1.5 x num_blocks entries (load <= 2/3), fastrange instead of a
 * power-of-two mask so the table costs 12 B per slot, backward-shift
 * deletion so churn leaves no tombstones. An entry holds the slot and the
 * key's 32-bit hash; the hash screens candidates before the key compare and
 * gives the entry's home bucket, so deletion never touches the key arena.
 */
#include "store/store_int.h"

#include <string.h>

uint32_t kvp__store_index_home(const kvp_store_t *s, uint32_t h32)
{
    return (uint32_t)(((uint64_t)h32 * s->index_cap) >> 32);
}

static inline uint32_t index_next(const kvp_store_t *s, uint32_t i)
{
    return ++i == s->index_cap ? 0 : i;
}

uint32_t kvp__store_index_find(const kvp_store_t *s, const void *key, size_t len, uint32_t h32)
{
    uint32_t i = kvp__store_index_home(s, h32);
    for (;;) {
        const kvp_index_entry_t *e = &s->index[i];
        if (e->slot1 == 0)
            return UINT32_MAX;
        if (e->h32 == h32) {
            uint32_t slot = e->slot1 - 1;
            if (s->meta[slot].key_len == len && memcmp(kvp__store_key(s, slot), key, len) == 0)
                return slot;
        }
        i = index_next(s, i);
    }
}

uint32_t kvp__store_index_peek(const kvp_store_t *s, uint32_t h32)
{
    uint32_t i = kvp__store_index_home(s, h32);
    for (; s->index[i].slot1 != 0; i = index_next(s, i))
        if (s->index[i].h32 == h32)
            return s->index[i].slot1 - 1;
    return UINT32_MAX;
}

void kvp__store_index_insert(kvp_store_t *s, uint32_t slot, uint32_t h32)
{
    /* Load stays <= 2/3 because at most n keys are indexed: an empty entry
     * always exists and the probe ends. */
    KVP_ASSERT(s->index_used < s->index_cap);
    uint32_t i = kvp__store_index_home(s, h32);
    while (s->index[i].slot1 != 0)
        i = index_next(s, i);
    s->index[i].slot1 = slot + 1;
    s->index[i].h32 = h32;
    s->index_used++;
}

/* Is `home` cyclically within (hole, j]? Then the entry at j must stay. */
static bool index_home_between(uint32_t hole, uint32_t home, uint32_t j)
{
    if (hole <= j)
        return hole < home && home <= j;
    return hole < home || home <= j;
}

void kvp__store_index_remove(kvp_store_t *s, uint32_t slot)
{
    /* Find the entry from the slot's home: the key is still in the arena,
     * but the entry's h32 is what we need, so hash once here. */
    uint32_t h32 = (uint32_t)kvp__store_hash(s, kvp__store_key(s, slot), s->meta[slot].key_len);
    uint32_t i = kvp__store_index_home(s, h32);
    while (s->index[i].slot1 != slot + 1) {
        KVP_ASSERT(s->index[i].slot1 != 0); /* removing a slot that is not indexed */
        i = index_next(s, i);
    }
    uint32_t hole = i;
    for (uint32_t j = index_next(s, hole); s->index[j].slot1 != 0; j = index_next(s, j)) {
        uint32_t home = kvp__store_index_home(s, s->index[j].h32);
        if (index_home_between(hole, home, j))
            continue;
        s->index[hole] = s->index[j];
        hole = j;
    }
    s->index[hole].slot1 = 0;
    s->index[hole].h32 = 0;
    s->index_used--;
}
