/*
 * store_int.h -- the block store's private layout, shared by store.c (state
 * machine and operations), store_index.c (the key index) and store_check.c
 * (the invariant validator and inspection). Nothing outside src/store/
 * includes this.
 *
 * Memory layout (one allocation in create, 2 MiB-aligned and offered to
 * transparent huge pages when large; nothing is allocated after it):
 *
 *   meta[n]      16 B  state, key length, flags, generation, pins (hot)
 *   links[n+3]    8 B  u32 prev/next of the one list a slot is on: the clean
 *                      free list, the suspect free list or the LRU list; the
 *                      three heads are entries n, n+1, n+2; a slot on no list
 *                      points at itself
 *   digest[n]    16 B  xxh3-128 of the content, valid when READY
 *   t_ns[n]       8 B  quarantined_at (QUARANTINED), suspect_until (suspect) or,
 *                      READY and published once, the request whose transfer
 *                      takes it back (0: any; external stores never suspect)
 *   index[cap]    8 B  open addressing, linear probing, cap = 1.5 n: u32 slot+1
 *                      (0 = empty) and the key's 32-bit hash (which also
 *                      gives the home bucket, so deletion needs no rehash)
 *   keys[n]      64 B  the key arena: slot i's key at keys + 64 i
 *
 * Metadata is therefore 48 B per slot + 12 B of index = 60 B; the key arena
 * is 64 B per slot on top (kvp_store_key_bytes_per_slot()).
 */
#ifndef KVP_STORE_INT_H
#define KVP_STORE_INT_H

#include "store/store.h"

/* Slot flags. */
enum {
    /* Released from quarantine by the hold cap (not by proof): handed only
     * to remote reserves and re-verified on acquire until t_ns. While the
     * slot is QUARANTINED again the flag means "was suspect": the release
     * re-marks it for a full period, whatever the proof (conservative). */
    KVP_SLOTF_SUSPECT = 1u << 0,
    /* Issue 29 (external slots): FILLING or QUARANTINED for a load into a
     * slot the embedding lent (kvp_store_lend): the key is kept, never
     * indexed (the block will be the embedding's, not the cache's). */
    KVP_SLOTF_LENT = 1u << 1,
    /* Issue 29: a published READY slot the embedding unpublished while pins
     * held it: no new pin; freed (unpublish_cb) when the last pin drops. */
    KVP_SLOTF_UNPUBLISHING = 1u << 2,
    /* Issue 29: a published READY slot served once: the first transfer from
     * it that completes unpublishes it (kvp_store_served); only one for the
     * request in t_ns if that is not 0. */
    KVP_SLOTF_ONCE = 1u << 3,
};

/* Hot per-slot metadata. 16 bytes so it never straddles a cache line. */
typedef struct kvp_slot_meta {
    uint32_t gen;    /* increases each time the slot leaves FREE; 0 = never used */
    uint32_t pins;   /* READY only */
    uint8_t state;   /* kvp_slot_state_t */
    uint8_t key_len; /* 0 when FREE, 1..64 otherwise */
    uint8_t flags;   /* KVP_SLOTF_* */
    uint8_t pad_[5];
} kvp_slot_meta_t;

typedef struct kvp_slot_link {
    uint32_t prev, next;
} kvp_slot_link_t;

typedef struct kvp_index_entry {
    uint32_t slot1; /* slot + 1; 0 = empty */
    uint32_t h32;   /* low 32 bits of kvp_hash64(key) */
} kvp_index_entry_t;

/* The store. Owns every array below (kvp__calloc in create, kvp__free in
 * destroy) and the region iff own_region (munmap in destroy); a supplied
 * region is borrowed and freed by its supplier after destroy. */
struct kvp_store {
    uint32_t n; /* num_blocks */
    uint32_t block_size;
    uint32_t max_pins;
    uint32_t index_cap;
    uint64_t index_used;
    uint64_t suspect_period_ns;
    uint64_t hash_seed;
    char *region;
    size_t region_len;
    size_t map_len; /* own mapping only */
    bool own_region;
    bool huge; /* own mapping got MAP_HUGETLB */
    const kvp_clock_t *clock;
    kvp_store_commit_cb commit_cb;
    void *commit_cb_arg;
    kvp_store_remove_cb remove_cb;
    const char *log_prefix;
    bool external;                         /* issue 29: no reserve, no eviction */
    uint64_t lent;                         /* issue 29: FILLING slots with KVP_SLOTF_LENT */
    kvp_store_unpublish_cb unpublish_cb;   /* issue 29 */

    void *arrays_raw; /* the one allocation the arrays below are carved from */
    kvp_slot_meta_t *meta;
    kvp_slot_link_t *links;
    kvp_digest_t *digest;
    uint64_t *t_ns;
    kvp_index_entry_t *index;
    uint8_t *keys;

    kvp_store_stats_t st;
};

/* List heads inside links[]. */
#define KVP_STORE_FREE_HEAD(s) ((s)->n + 0u)
#define KVP_STORE_SUSPECT_HEAD(s) ((s)->n + 1u)
#define KVP_STORE_LRU_HEAD(s) ((s)->n + 2u)

static inline const uint8_t *kvp__store_key(const kvp_store_t *s, uint32_t slot)
{
    return s->keys + (size_t)slot * KVP_KEY_MAX;
}

static inline uint64_t kvp__store_hash(const kvp_store_t *s, const void *key, size_t len)
{
    return kvp_hash64(key, len, s->hash_seed ^ 0x6b76702d696478ull /* "kvp-idx" */);
}

/* ---- store_index.c ---- */
/* Slot holding key (FILLING or READY), or UINT32_MAX. */
uint32_t kvp__store_index_find(const kvp_store_t *s, const void *key, size_t len, uint32_t h32);
/* First slot whose entry carries h32 (no key compare; a prefetch hint). */
uint32_t kvp__store_index_peek(const kvp_store_t *s, uint32_t h32);
/* Insert slot (its key already in the arena); the key must be absent. */
void kvp__store_index_insert(kvp_store_t *s, uint32_t slot, uint32_t h32);
/* Remove slot's entry (backward-shift deletion: no tombstones). */
void kvp__store_index_remove(kvp_store_t *s, uint32_t slot);
uint32_t kvp__store_index_home(const kvp_store_t *s, uint32_t h32);

/* ---- store_check.c ---- */
void kvp__store_fill_info(const kvp_store_t *s, uint32_t slot, kvp_slot_info_t *info);

/* The slot lists (free, suspect, LRU: index-linked through s->links; heads
 * above), shared by store.c and store_region.c (issue 31). */

static inline bool link_linked(const kvp_store_t *s, uint32_t i)
{
    return s->links[i].next != i;
}

static inline void link_self(kvp_store_t *s, uint32_t i)
{
    s->links[i].prev = s->links[i].next = i;
}

static inline void list_insert_tail(kvp_store_t *s, uint32_t head, uint32_t i)
{
    uint32_t tail = s->links[head].prev;
    s->links[i].prev = tail;
    s->links[i].next = head;
    s->links[tail].next = i;
    s->links[head].prev = i;
}

static inline void list_remove(kvp_store_t *s, uint32_t i)
{
    uint32_t p = s->links[i].prev, nx = s->links[i].next;
    s->links[p].next = nx;
    s->links[nx].prev = p;
    link_self(s, i);
}

/* First element of the list at head, or UINT32_MAX if empty. */
static inline uint32_t list_first(const kvp_store_t *s, uint32_t head)
{
    uint32_t i = s->links[head].next;
    return i == head ? UINT32_MAX : i;
}

#endif /* KVP_STORE_INT_H */
