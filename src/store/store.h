/*
 * store.h -- the block store (SPEC §3): a region of num_blocks x block_size
 * bytes, a slot table, a key index, pins, LRU eviction and checksums. No I/O.
 *
 * Slot state machine (one set_state() asserts every transition):
 *
 *        reserve                 commit
 *   FREE ---------> FILLING ----------------> READY
 *    ^  <---------   |   abandon               |  evict (pins == 0) / drop (suspect
 *    |               |                         |  re-verify failed)
 *    |               v quarantine              |
 *    +---------- QUARANTINED <-----------------+ (never: READY is not quarantined)
 *      release_quarantined (proof, or the hold cap -> suspect)
 *
 *   FREE         on the free list; key empty; pins 0.
 *   FILLING      reserved for a local writer or an inbound remote WRITE; key
 *                indexed (answers "pending"); not evictable.
 *   READY        holds the block of its key; indexed; evictable iff pins == 0
 *                (pinned <=> not on the LRU list, asserted).
 *   QUARANTINED  a WRITE may still land here; content garbage; not indexed,
 *                never handed out, never evicted.
 *
 * A slot's generation increases each time it leaves FREE. Everything outside
 * the store names a slot by kvp_slot_ref_t (slot, generation); a stale ref is
 * refused with KVP_ERR_STALE, never acted on.
 *
 * Threading: a store is owned by one thread (the node's owner thread). No
 * call locks. Allocation happens only in create.
 */
#ifndef KVP_STORE_H
#define KVP_STORE_H

#include "common/common.h"

#define KVP_KEY_MAX 64

typedef struct kvp_store kvp_store_t;

typedef enum kvp_slot_state {
    KVP_SLOT_FREE = 0,
    KVP_SLOT_FILLING = 1,
    KVP_SLOT_READY = 2,
    KVP_SLOT_QUARANTINED = 3,
} kvp_slot_state_t;

const char *kvp_slot_state_str(kvp_slot_state_t s);

typedef struct kvp_slot_ref {
    uint32_t slot;
    uint32_t gen;
} kvp_slot_ref_t;

/* Called when a slot becomes READY (commit), so the node can serve lookups
 * pending on the key and parked WAIT_FOR_SUPPLY demand. Must not call back
 * into the store's mutating API synchronously except pin/unpin. */
typedef void (*kvp_store_commit_cb)(void *arg, const void *key, uint32_t key_len,
                                    kvp_slot_ref_t ref);
/* Called when a READY block leaves the cache (evicted, or a suspect block
 * dropped), with its key, before the slot is reused (KV events for routers).
 * Same rules as the commit callback; gets commit_cb_arg. */
typedef void (*kvp_store_remove_cb)(void *arg, const void *key, uint32_t key_len);

/* Issue 29: a published slot that was unpublished while pinned is FREE now
 * (its last pin dropped): the embedding may reuse it. Same rules as the
 * commit callback; gets commit_cb_arg. */
typedef void (*kvp_store_unpublish_cb)(void *arg, uint32_t slot);

typedef struct kvp_store_config {
    uint32_t num_blocks; /* > 0 */
    uint32_t block_size; /* > 0, a multiple of the page size */
    /* Region supplied from outside (by the data transport, which for UCX
     * allocates it, or by the embedding engine): base and length, length >=
     * num_blocks * block_size, base page-aligned. The supplier frees it after
     * kvp_store_destroy. NULL: the store maps its own (anonymous, populated)
     * and unmaps it at destroy. */
    void *region;
    size_t region_len;
    bool huge_pages;            /* own mapping only: try MAP_HUGETLB, fall back cleanly */
    uint32_t max_pins;          /* global bound on pins; 0 = 4 * num_blocks */
    uint64_t suspect_period_ns; /* how long a cap-released slot stays suspect */
    uint64_t hash_seed;         /* xxh3 seed for checksums */
    const kvp_clock_t *clock;   /* NULL = real clock */
    kvp_store_commit_cb commit_cb;
    void *commit_cb_arg;
    kvp_store_remove_cb remove_cb; /* may be NULL */
    const char *log_prefix; /* borrowed for the store's lifetime; may be NULL */
    /* Issue 29, external slots: the region and its slots are the embedding's.
     * FREE means "the embedding's": kvp_store_reserve is refused (UNSUPPORTED),
     * nothing is evicted; slots leave FREE only by kvp_store_lend (a load into
     * a slot the embedding named) or kvp_store_publish (a block it serves). */
    bool external;
    kvp_store_unpublish_cb unpublish_cb; /* may be NULL */
} kvp_store_config_t;

typedef struct kvp_store_stats {
    uint64_t slots[4]; /* by kvp_slot_state_t */
    uint64_t pins;     /* current total */
    uint64_t suspect;  /* slots currently marked suspect */
    uint64_t evictions;
    uint64_t checksum_mismatches; /* suspect re-verify failures + commit_verify failures */
    uint64_t reserves, commits, abandons, quarantines, quarantine_releases;
    uint64_t lookups_hit, lookups_miss, lookups_pending;
    uint64_t pin_limit_refusals;
} kvp_store_stats_t;

/* Everything about one slot, for the landing checker, inspection and tests. */
typedef struct kvp_slot_info {
    kvp_slot_state_t state;
    uint32_t gen;
    uint32_t pins;
    uint8_t key_len;
    uint8_t key[KVP_KEY_MAX];
    kvp_digest_t digest;        /* valid when READY */
    uint64_t quarantined_at_ns; /* valid when QUARANTINED */
    uint64_t suspect_until_ns;  /* 0 = not suspect */
} kvp_slot_info_t;

/* Create a store. Out-param written only on KVP_OK. KVP_ERR_INVALID for a
 * zero or non-page-multiple block size, zero or more than 2^31 blocks, a
 * region too small or unaligned; KVP_ERR_NOMEM if an allocation fails (nothing leaks). */
kvp_status_t kvp_store_create(const kvp_store_config_t *cfg, kvp_store_t **out);
/* Frees metadata and the region if the store mapped it (a supplied region
 * is left to its supplier). Pins still held are logged as a warning, not
 * asserted: destroy is the shutdown path after the drain and there is no
 * `force` parameter. NULL is a no-op. */
void kvp_store_destroy(kvp_store_t *s);

uint32_t kvp_store_num_blocks(const kvp_store_t *s);
uint32_t kvp_store_block_size(const kvp_store_t *s);
void *kvp_store_base(const kvp_store_t *s);
size_t kvp_store_region_len(const kvp_store_t *s);
/* Pointer to a slot's bytes. Valid for the store's lifetime. */
void *kvp_store_slot_ptr(const kvp_store_t *s, uint32_t slot);

/* Flags for reserve. */
enum {
    /* The slot will be the destination of a remote load whose content is
     * verified against the source's checksum: suspect slots may be used. */
    KVP_STORE_RESERVE_REMOTE = 1u << 0,
};

/* Reserve a slot for `key` (1..64 bytes): FREE (or evict the LRU READY
 * unpinned slot) -> FILLING; the key is indexed at once.
 *   KVP_OK          *ref, *ptr written
 *   KVP_ERR_EXISTS  the key is READY (no slot taken)
 *   KVP_ERR_PENDING the key is FILLING (no slot taken)
 *   KVP_ERR_NOSPACE nothing free and nothing evictable
 *   KVP_ERR_INVALID bad key or arguments */
kvp_status_t kvp_store_reserve(kvp_store_t *s, const void *key, size_t key_len, unsigned flags,
                               kvp_slot_ref_t *ref, void **ptr);
/* FILLING -> READY: computes the xxh3-128 digest of the slot and fires the
 * commit callback. */
kvp_status_t kvp_store_commit(kvp_store_t *s, kvp_slot_ref_t ref);
/* Like commit, but first verifies the content against `expected` (the
 * source's checksum). On mismatch returns KVP_ERR_CHECKSUM, counts it, and
 * leaves the slot FILLING (the caller abandons it). */
kvp_status_t kvp_store_commit_verify(kvp_store_t *s, kvp_slot_ref_t ref,
                                     const kvp_digest_t *expected);
/* The _as forms of commit_verify and verify take `actual`, the slot's
 * kvp_store_slot_digest taken by the caller since the slot was last written
 * (a load's blocks hashed on two threads, session/client_outcome.c); NULL:
 * hashed here. */
kvp_status_t kvp_store_commit_verify_as(kvp_store_t *s, kvp_slot_ref_t ref,
                                        const kvp_digest_t *expected, const kvp_digest_t *actual);
/* Like commit, but the slot takes `digest` (the source's checksum of what
 * it sent) without hashing the content: a remote load with verification
 * off. The digest still describes what the block should be, so a suspect
 * re-verify or a verifying consumer downstream detects content that differs
 * (kvp_store_commit would hash whatever landed and hide it). */
kvp_status_t kvp_store_commit_digest(kvp_store_t *s, kvp_slot_ref_t ref,
                                     const kvp_digest_t *digest);
/* FILLING -> FREE, key unindexed. */
kvp_status_t kvp_store_abandon(kvp_store_t *s, kvp_slot_ref_t ref);

/* Look a key up.
 *   KVP_OK            READY: pinned (caller unpins), *ref, *ptr, *digest written
 *   KVP_ERR_PENDING   FILLING
 *   KVP_ERR_NOT_FOUND missing
 *   KVP_ERR_LIMIT     READY but the pin bound is reached (counted)
 * A suspect slot is re-verified against its digest on every acquire; a
 * mismatch drops the block (READY -> FREE), is counted and logged, and
 * answers NOT_FOUND. Any out-param may be NULL. Touches LRU. */
kvp_status_t kvp_store_lookup(kvp_store_t *s, const void *key, size_t key_len, kvp_slot_ref_t *ref,
                              const void **ptr, kvp_digest_t *digest);
/* Added by the store layer: look up `count` keys at once (e.g. the blocks of
 * one sequence). Per key exactly what kvp_store_lookup would answer, in
 * order: results[i] gets the status, refs[i] (refs may be NULL) is written
 * on KVP_OK and the slot is pinned (caller unpins). A NULL or bad key gets
 * KVP_ERR_INVALID. The cache misses of up to 16 keys are overlapped by
 * prefetching before the lookups run, which is what makes a million-slot
 * index fast. Returns the number of hits (0 if s, keys, key_lens or results
 * is NULL). */
uint32_t kvp_store_lookup_many(kvp_store_t *s, uint32_t count, const void *const *keys,
                               const size_t *key_lens, kvp_slot_ref_t *refs, kvp_status_t *results);
/* Index probe without pinning or touching LRU: state of the key's slot, or
 * KVP_ERR_NOT_FOUND. */
kvp_status_t kvp_store_probe(const kvp_store_t *s, const void *key, size_t key_len,
                             kvp_slot_ref_t *ref, kvp_slot_state_t *state);

/* Add / drop one pin on a READY slot named by ref. */
kvp_status_t kvp_store_pin(kvp_store_t *s, kvp_slot_ref_t ref);
kvp_status_t kvp_store_unpin(kvp_store_t *s, kvp_slot_ref_t ref);

/* FILLING -> QUARANTINED (a WRITE may still land), key unindexed, stamped
 * with the clock's now. */
kvp_status_t kvp_store_quarantine(kvp_store_t *s, kvp_slot_ref_t ref);
/* QUARANTINED -> FREE on proof. With `suspect` (released by the hold cap,
 * not by proof) the slot is marked suspect for suspect_period_ns: it is handed
 * out only to KVP_STORE_RESERVE_REMOTE reserves and re-verified on acquire. */
kvp_status_t kvp_store_release_quarantined(kvp_store_t *s, kvp_slot_ref_t ref, bool suspect);

/* ---- issue 29: external slots (a store created with cfg.external) ----
 * Lend: the FREE slot `slot` -> FILLING for a remote load into it, the key
 * kept but not indexed (KVP_SLOTF_LENT); the load's proofs then move it as
 * any FILLING slot (commit is kvp_store_verify + abandon: the block is the
 * embedding's, never the cache's). KVP_ERR_INVALID out of range or bad key,
 * KVP_ERR_BUSY if the slot is not FREE (lent already, or published). */
kvp_status_t kvp_store_lend(kvp_store_t *s, uint32_t slot, const void *key, size_t key_len,
                            kvp_slot_ref_t *ref);
/* Does the FILLING slot's content match `expected`? KVP_OK, or
 * KVP_ERR_CHECKSUM (counted, logged); no state change. */
kvp_status_t kvp_store_verify(kvp_store_t *s, kvp_slot_ref_t ref, const kvp_digest_t *expected);
kvp_status_t kvp_store_verify_as(kvp_store_t *s, kvp_slot_ref_t ref, const kvp_digest_t *expected,
                                 const kvp_digest_t *actual);
/* Publish: the FREE slot `slot` holds the block of `key` (the embedding
 * wrote it): FREE -> FILLING -> READY, hashed and indexed, served like any
 * READY block. KVP_ERR_BUSY if the slot is not FREE, KVP_ERR_EXISTS if the
 * key is READY or FILLING in another slot, KVP_ERR_INVALID bad arguments. */
kvp_status_t kvp_store_publish(kvp_store_t *s, uint32_t slot, const void *key, size_t key_len,
                               kvp_slot_ref_t *ref);
/* kvp_store_publish with the block's digest given (kvp_store_slot_digest,
 * taken when the embedding wrote the slot; NULL: hashed here). A stale one
 * (the slot rewritten since) fails the consumer's verify of the block.
 * `once`: served once -- kvp_store_served unpublishes it, at a transfer for
 * request `once_for` only if that is not 0 (must be 0 without once). */
kvp_status_t kvp_store_publish_digest(kvp_store_t *s, uint32_t slot, const void *key,
                                      size_t key_len, const kvp_digest_t *digest, bool once,
                                      uint64_t once_for, kvp_slot_ref_t *ref);
/* A transfer for `request_id` that read the READY slots of refs[0..n) (and
 * holds a pin on each) completed: each slot published `once` (for any
 * request, or for this one) is unpublished now, as by kvp_store_unpublish
 * (no new pin; the unpublish callback at its last unpin); the others (not
 * once, once for another request, already unpublishing, stale) are left
 * as they are. How many were unpublished. */
uint32_t kvp_store_served(kvp_store_t *s, const kvp_slot_ref_t *refs, uint32_t n,
                          uint64_t request_id);
/* The digest of slot's bytes (slot < num_blocks). Reads nothing of the
 * store's state but its geometry and seed, fixed at create: any thread may
 * call it, while the caller keeps the slot unwritten. */
kvp_digest_t kvp_store_slot_digest(const kvp_store_t *s, uint32_t slot);
/* Unpublish the READY block of `key`: unpinned -> FREE at once (KVP_OK, the
 * slot is the embedding's again); pinned -> no new pin, KVP_ERR_BUSY, and
 * the unpublish callback fires with the slot when the last pin drops.
 * KVP_ERR_NOT_FOUND if the key is not published (or already unpublishing:
 * then KVP_ERR_BUSY again). *slot gets the slot on OK and BUSY. */
kvp_status_t kvp_store_unpublish(kvp_store_t *s, const void *key, size_t key_len, uint32_t *slot);

/* Evict the least-recently-used READY unpinned slot (READY -> FREE).
 * KVP_ERR_NOSPACE if none. */
kvp_status_t kvp_store_evict_one(kvp_store_t *s);

/* Slot details. KVP_ERR_INVALID if slot >= num_blocks. */
kvp_status_t kvp_store_slot_info(const kvp_store_t *s, uint32_t slot, kvp_slot_info_t *info);
/* Is ref the slot's current generation? */
bool kvp_store_ref_valid(const kvp_store_t *s, kvp_slot_ref_t ref);

/* Call fn for every slot not FREE; stop when fn returns false. */
typedef bool (*kvp_store_iter_cb)(void *arg, uint32_t slot, const kvp_slot_info_t *info);
void kvp_store_iterate(const kvp_store_t *s, kvp_store_iter_cb fn, void *arg);

void kvp_store_get_stats(const kvp_store_t *s, kvp_store_stats_t *st);
/* Bytes of metadata per slot (slot table + index share), for the bench. */
size_t kvp_store_meta_bytes_per_slot(const kvp_store_t *s);

/* Added by the store layer: bytes of key arena per slot (64, kept apart from
 * the metadata so kvp_store_meta_bytes_per_slot stays small), and whether
 * the store's own mapping got huge pages (false for a supplied region or
 * after the fallback). */
size_t kvp_store_key_bytes_per_slot(const kvp_store_t *s);
bool kvp_store_is_huge(const kvp_store_t *s);

/* Validate every invariant (state vs lists vs index vs pins vs counters).
 * KVP_OK or KVP_ERR_STATE with a description in `why` (may be NULL). */
kvp_status_t kvp_store_check(const kvp_store_t *s, char *why, size_t why_len);

#ifdef KVP_TESTING
/* Test-only hooks that break one invariant on purpose, so tests can prove
 * kvp_store_check() can fail (test builds only, issue 31). */
void kvp__store_test_break_lru(kvp_store_t *s, uint32_t slot);
#endif

#endif /* KVP_STORE_H */
