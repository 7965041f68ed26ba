/*
 * store.c -- the block store (SPEC §3): region, slot state machine, pins,
 * LRU eviction, quarantine, suspect slots and checksums. The key index is in
 * store_index.c, the invariant validator in store_check.c, the region and
 * the store's creation in store_region.c, the layout and the slot lists in
 * store_int.h.
 *
 * Who performs each transition (all through set_state()):
 *   FREE        -> FILLING      kvp_store_reserve
 *   FILLING     -> READY        kvp_store_commit / kvp_store_commit_verify
 *   FILLING     -> FREE         kvp_store_abandon
 *   FILLING     -> QUARANTINED  kvp_store_quarantine
 *   READY       -> FREE         evict_slot (kvp_store_evict_one, reserve) and
 *                               drop_corrupt (suspect re-verify failed)
 *   QUARANTINED -> FREE         kvp_store_release_quarantined
 */
#include "store/store_int.h"

#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static const char *const slot_state_names[] = {"FREE", "FILLING", "READY", "QUARANTINED"};

const char *kvp_slot_state_str(kvp_slot_state_t st)
{
    if ((unsigned)st >= KVP_ARRAY_SIZE(slot_state_names))
        return "?";
    return slot_state_names[st];
}

/* Legal predecessors of each state, as a bit set of kvp_slot_state_t. */
static const uint8_t slot_state_from[4] = {
    [KVP_SLOT_FREE] =
        (1u << KVP_SLOT_FILLING) | (1u << KVP_SLOT_READY) | (1u << KVP_SLOT_QUARANTINED),
    [KVP_SLOT_FILLING] = 1u << KVP_SLOT_FREE,
    [KVP_SLOT_READY] = 1u << KVP_SLOT_FILLING,
    [KVP_SLOT_QUARANTINED] = 1u << KVP_SLOT_FILLING,
};

/* The one place a slot changes state: asserts the predecessor, bumps the
 * generation when the slot leaves FREE, keeps the per-state counters and
 * traces old -> new. List and index membership are the caller's part. */
static void set_state(kvp_store_t *s, uint32_t slot, kvp_slot_state_t to)
{
    kvp_slot_meta_t *m = &s->meta[slot];
    kvp_slot_state_t from = (kvp_slot_state_t)m->state;
    KVP_ASSERT(slot_state_from[to] & (1u << from));
    if (from == KVP_SLOT_FREE) {
        if (++m->gen == 0) /* wrapped: 0 means "never used" */
            m->gen = 1;
    }
    KVP_ASSERT(s->st.slots[from] > 0);
    s->st.slots[from]--;
    s->st.slots[to]++;
    m->state = (uint8_t)to;
    KVP_TRACE(s->log_prefix, "store: slot %u gen %u %s -> %s", slot, m->gen, slot_state_names[from],
              slot_state_names[to]);
}

/* --------------------------------------------------------------- suspects */

static void suspect_clear(kvp_store_t *s, uint32_t slot)
{
    s->meta[slot].flags &= (uint8_t)~KVP_SLOTF_SUSPECT;
    s->t_ns[slot] = 0;
    KVP_ASSERT(s->st.suspect > 0);
    s->st.suspect--;
}

/* For a slot off the free lists: is it still suspect? Clears an expired mark. */
static bool suspect_active(kvp_store_t *s, uint32_t slot)
{
    if (!(s->meta[slot].flags & KVP_SLOTF_SUSPECT))
        return false;
    if (kvp_clock_now(s->clock) < s->t_ns[slot])
        return true;
    suspect_clear(s, slot);
    return false;
}

/* A slot that just became FREE goes on the clean or the suspect free list. */
static void free_push(kvp_store_t *s, uint32_t slot)
{
    KVP_ASSERT(s->meta[slot].state == KVP_SLOT_FREE && !link_linked(s, slot));
    s->meta[slot].key_len = 0;
    bool suspect = suspect_active(s, slot);
    list_insert_tail(s, suspect ? KVP_STORE_SUSPECT_HEAD(s) : KVP_STORE_FREE_HEAD(s), slot);
}

/* Take a FREE slot: clean ones first; a remote reserve may take a suspect
 * one; a local reserve only one whose suspect period has ended. The suspect
 * list is in release order, so with a fixed period its head expires first. */
static uint32_t free_take(kvp_store_t *s, bool remote)
{
    uint32_t slot = list_first(s, KVP_STORE_FREE_HEAD(s));
    if (slot == UINT32_MAX) {
        slot = list_first(s, KVP_STORE_SUSPECT_HEAD(s));
        if (slot == UINT32_MAX)
            return UINT32_MAX;
        if (remote) {
            list_remove(s, slot);
            (void)suspect_active(s, slot); /* clears the mark if it has expired */
            return slot;
        }
        if (kvp_clock_now(s->clock) < s->t_ns[slot])
            return UINT32_MAX;
        list_remove(s, slot);
        suspect_clear(s, slot);
        return slot;
    }
    list_remove(s, slot);
    return slot;
}

/* --------------------------------------------------------------- refs */

/* Resolve a ref to a slot in state `want`. FREE slots have no live refs. */
static kvp_status_t ref_resolve(const kvp_store_t *s, kvp_slot_ref_t ref, kvp_slot_state_t want)
{
    if (!s || ref.slot >= s->n)
        return KVP_ERR_INVALID;
    const kvp_slot_meta_t *m = &s->meta[ref.slot];
    if (m->gen != ref.gen || m->state == KVP_SLOT_FREE)
        return KVP_ERR_STALE;
    if (m->state != want)
        return KVP_ERR_STATE;
    return KVP_OK;
}

bool kvp_store_ref_valid(const kvp_store_t *s, kvp_slot_ref_t ref)
{
    return s && ref.slot < s->n && s->meta[ref.slot].gen == ref.gen &&
           s->meta[ref.slot].state != KVP_SLOT_FREE;
}

static inline kvp_slot_ref_t ref_of(const kvp_store_t *s, uint32_t slot)
{
    kvp_slot_ref_t r = {slot, s->meta[slot].gen};
    return r;
}

static bool key_ok(const void *key, size_t len)
{
    return key && len >= 1 && len <= KVP_KEY_MAX;
}

/* -------------------------------------------------------------- eviction */

/* READY (unpinned, on the LRU) -> FREE: unindexed, onto a free list. */
static void ready_to_free(kvp_store_t *s, uint32_t slot)
{
    KVP_ASSERT(s->meta[slot].pins == 0 && link_linked(s, slot));
    if (s->remove_cb)
        s->remove_cb(s->commit_cb_arg, kvp__store_key(s, slot), s->meta[slot].key_len);
    list_remove(s, slot);
    kvp__store_index_remove(s, slot);
    if (s->meta[slot].flags & KVP_SLOTF_ONCE) {
        s->meta[slot].flags &= (uint8_t)~KVP_SLOTF_ONCE;
        s->t_ns[slot] = 0; /* its request */
    }
    set_state(s, slot, KVP_SLOT_FREE);
    free_push(s, slot);
}

static kvp_status_t evict_slot(kvp_store_t *s)
{
    uint32_t slot = list_first(s, KVP_STORE_LRU_HEAD(s));
    if (slot == UINT32_MAX)
        return KVP_ERR_NOSPACE;
    ready_to_free(s, slot);
    s->st.evictions++;
    return KVP_OK;
}

kvp_status_t kvp_store_evict_one(kvp_store_t *s)
{
    if (!s)
        return KVP_ERR_INVALID;
    if (s->external)
        return KVP_ERR_NOSPACE; /* issue 29: a published block leaves only by unpublish */
    return evict_slot(s);
}

/* ------------------------------------------------------- reserve / commit */

kvp_status_t kvp_store_reserve(kvp_store_t *s, const void *key, size_t key_len, unsigned flags,
                               kvp_slot_ref_t *ref, void **ptr)
{
    if (!s || !key_ok(key, key_len) || !ref || (flags & ~KVP_STORE_RESERVE_REMOTE))
        return KVP_ERR_INVALID;
    if (s->external)
        return KVP_ERR_UNSUPPORTED; /* issue 29: every FREE slot is the embedding's */
    uint32_t h32 = (uint32_t)kvp__store_hash(s, key, key_len);
    uint32_t found = kvp__store_index_find(s, key, key_len, h32);
    if (found != UINT32_MAX)
        return s->meta[found].state == KVP_SLOT_READY ? KVP_ERR_EXISTS : KVP_ERR_PENDING;
    bool remote = flags & KVP_STORE_RESERVE_REMOTE;
    uint32_t slot;
    /* A local reserve may evict suspect READY slots that it cannot use; they
     * land on the suspect free list for remote reserves. Bounded by n. */
    while ((slot = free_take(s, remote)) == UINT32_MAX) {
        if (evict_slot(s) != KVP_OK)
            return KVP_ERR_NOSPACE;
    }
    kvp_slot_meta_t *m = &s->meta[slot];
    KVP_ASSERT(remote || !(m->flags & KVP_SLOTF_SUSPECT));
    memcpy(s->keys + (size_t)slot * KVP_KEY_MAX, key, key_len);
    m->key_len = (uint8_t)key_len;
    kvp__store_index_insert(s, slot, h32);
    set_state(s, slot, KVP_SLOT_FILLING);
    s->st.reserves++;
    *ref = ref_of(s, slot);
    if (ptr)
        *ptr = kvp_store_slot_ptr(s, slot);
    return KVP_OK;
}

static void commit_digest(kvp_store_t *s, uint32_t slot, const kvp_digest_t *d)
{
    s->digest[slot] = *d;
    set_state(s, slot, KVP_SLOT_READY);
    list_insert_tail(s, KVP_STORE_LRU_HEAD(s), slot);
    s->st.commits++;
    if (s->commit_cb)
        s->commit_cb(s->commit_cb_arg, kvp__store_key(s, slot), s->meta[slot].key_len,
                     ref_of(s, slot));
}

static kvp_digest_t slot_digest(const kvp_store_t *s, uint32_t slot)
{
    return kvp_digest(kvp_store_slot_ptr(s, slot), s->block_size, s->hash_seed);
}

/* A lent slot's block is the embedding's: never committed into the cache. */
static kvp_status_t ref_resolve_own(const kvp_store_t *s, kvp_slot_ref_t ref)
{
    kvp_status_t rc = ref_resolve(s, ref, KVP_SLOT_FILLING);
    if (rc == KVP_OK && (s->meta[ref.slot].flags & KVP_SLOTF_LENT))
        return KVP_ERR_STATE;
    return rc;
}

kvp_status_t kvp_store_commit(kvp_store_t *s, kvp_slot_ref_t ref)
{
    kvp_status_t rc = ref_resolve_own(s, ref);
    if (rc != KVP_OK)
        return rc;
    kvp_digest_t d = slot_digest(s, ref.slot);
    commit_digest(s, ref.slot, &d);
    return KVP_OK;
}

kvp_status_t kvp_store_commit_digest(kvp_store_t *s, kvp_slot_ref_t ref,
                                     const kvp_digest_t *digest)
{
    kvp_status_t rc = ref_resolve_own(s, ref);
    if (rc != KVP_OK)
        return rc;
    if (!digest)
        return KVP_ERR_INVALID;
    commit_digest(s, ref.slot, digest);
    return KVP_OK;
}

kvp_status_t kvp_store_commit_verify(kvp_store_t *s, kvp_slot_ref_t ref,
                                     const kvp_digest_t *expected)
{
    return kvp_store_commit_verify_as(s, ref, expected, NULL);
}

kvp_status_t kvp_store_commit_verify_as(kvp_store_t *s, kvp_slot_ref_t ref,
                                        const kvp_digest_t *expected, const kvp_digest_t *actual)
{
    kvp_status_t rc = ref_resolve_own(s, ref);
    if (rc != KVP_OK)
        return rc;
    if (!expected)
        return KVP_ERR_INVALID;
    kvp_digest_t d = actual ? *actual : slot_digest(s, ref.slot);
    if (!kvp_digest_eq(&d, expected)) {
        s->st.checksum_mismatches++;
        KVP_WARN(s->log_prefix,
                 "store: slot %u gen %u: content does not match the source's "
                 "checksum (%016llx%016llx != %016llx%016llx)",
                 ref.slot, ref.gen, (unsigned long long)d.hi, (unsigned long long)d.lo,
                 (unsigned long long)expected->hi, (unsigned long long)expected->lo);
        return KVP_ERR_CHECKSUM;
    }
    commit_digest(s, ref.slot, &d);
    return KVP_OK;
}

/* Issue 29: a lent slot leaving FILLING (it was never indexed). */
static void lent_leave(kvp_store_t *s, uint32_t slot)
{
    KVP_ASSERT(s->lent > 0);
    s->lent--;
    s->meta[slot].flags &= (uint8_t)~KVP_SLOTF_LENT;
}

kvp_status_t kvp_store_abandon(kvp_store_t *s, kvp_slot_ref_t ref)
{
    kvp_status_t rc = ref_resolve(s, ref, KVP_SLOT_FILLING);
    if (rc != KVP_OK)
        return rc;
    if (s->meta[ref.slot].flags & KVP_SLOTF_LENT)
        lent_leave(s, ref.slot);
    else
        kvp__store_index_remove(s, ref.slot);
    set_state(s, ref.slot, KVP_SLOT_FREE);
    free_push(s, ref.slot);
    s->st.abandons++;
    return KVP_OK;
}

/* ------------------------------------------------------------ pins, lookup */

/* Add a pin to a READY slot: pinned <=> off the LRU list. */
static kvp_status_t pin_slot(kvp_store_t *s, uint32_t slot)
{
    kvp_slot_meta_t *m = &s->meta[slot];
    if (s->st.pins >= s->max_pins) {
        s->st.pin_limit_refusals++;
        return KVP_ERR_LIMIT;
    }
    KVP_ASSERT((m->pins == 0) == link_linked(s, slot));
    if (m->pins++ == 0)
        list_remove(s, slot);
    s->st.pins++;
    return KVP_OK;
}

kvp_status_t kvp_store_pin(kvp_store_t *s, kvp_slot_ref_t ref)
{
    kvp_status_t rc = ref_resolve(s, ref, KVP_SLOT_READY);
    if (rc == KVP_OK && (s->meta[ref.slot].flags & KVP_SLOTF_UNPUBLISHING))
        return KVP_ERR_STALE; /* issue 29: unpublished, freed at its last unpin */
    return rc != KVP_OK ? rc : pin_slot(s, ref.slot);
}

/* Issue 29: an unpublished slot whose last pin dropped -> FREE (the
 * embedding's), the remove and unpublish callbacks told. */
static void unpublish_finish(kvp_store_t *s, uint32_t slot)
{
    list_insert_tail(s, KVP_STORE_LRU_HEAD(s), slot); /* ready_to_free takes it off */
    s->meta[slot].flags &= (uint8_t)~KVP_SLOTF_UNPUBLISHING;
    ready_to_free(s, slot);
    if (s->unpublish_cb)
        s->unpublish_cb(s->commit_cb_arg, slot);
}

kvp_status_t kvp_store_unpin(kvp_store_t *s, kvp_slot_ref_t ref)
{
    kvp_status_t rc = ref_resolve(s, ref, KVP_SLOT_READY);
    if (rc != KVP_OK)
        return rc;
    kvp_slot_meta_t *m = &s->meta[ref.slot];
    if (m->pins == 0)
        return KVP_ERR_STATE; /* the caller holds no pin: its bug, not ours */
    KVP_ASSERT(!link_linked(s, ref.slot));
    s->st.pins--;
    if (--m->pins == 0 && (m->flags & KVP_SLOTF_UNPUBLISHING))
        unpublish_finish(s, ref.slot);
    else if (m->pins == 0)
        list_insert_tail(s, KVP_STORE_LRU_HEAD(s), ref.slot); /* most recently used */
    return KVP_OK;
}

/* Re-verify a suspect READY slot. On mismatch the block is dropped (if no one
 * else holds a pin; otherwise it stays indexed and the next acquire checks
 * again), the mismatch is counted and logged. */
static bool suspect_verify(kvp_store_t *s, uint32_t slot)
{
    if (KVP_MUTATED(KVP_MUT_SKIP_SUSPECT_VERIFY)) /* test-only: the bug */
        return true;
    kvp_digest_t d = slot_digest(s, slot);
    if (kvp_digest_eq(&d, &s->digest[slot]))
        return true;
    s->st.checksum_mismatches++;
    KVP_ERROR(s->log_prefix,
              "store: suspect slot %u gen %u: content changed since commit "
              "(a late write landed); block dropped",
              slot, s->meta[slot].gen);
    if (s->meta[slot].pins == 0)
        ready_to_free(s, slot);
    return false;
}

static kvp_status_t lookup_h(kvp_store_t *s, const void *key, size_t key_len, uint32_t h32,
                             kvp_slot_ref_t *ref, const void **ptr, kvp_digest_t *digest)
{
    uint32_t slot = kvp__store_index_find(s, key, key_len, h32);
    if (slot == UINT32_MAX) {
        s->st.lookups_miss++;
        return KVP_ERR_NOT_FOUND;
    }
    if (s->meta[slot].state == KVP_SLOT_FILLING) {
        s->st.lookups_pending++;
        return KVP_ERR_PENDING;
    }
    if (__builtin_expect(s->meta[slot].flags & KVP_SLOTF_UNPUBLISHING, 0)) {
        s->st.lookups_miss++; /* issue 29: the embedding took it back */
        return KVP_ERR_NOT_FOUND;
    }
    if (__builtin_expect(s->meta[slot].flags & KVP_SLOTF_SUSPECT, 0) && suspect_active(s, slot) &&
        !suspect_verify(s, slot)) {
        s->st.lookups_miss++;
        return KVP_ERR_NOT_FOUND;
    }
    kvp_status_t rc = pin_slot(s, slot);
    if (rc != KVP_OK)
        return rc;
    s->st.lookups_hit++;
    if (ref)
        *ref = ref_of(s, slot);
    if (ptr)
        *ptr = kvp_store_slot_ptr(s, slot);
    if (digest)
        *digest = s->digest[slot];
    return KVP_OK;
}

kvp_status_t kvp_store_lookup(kvp_store_t *s, const void *key, size_t key_len, kvp_slot_ref_t *ref,
                              const void **ptr, kvp_digest_t *digest)
{
    if (!s || !key_ok(key, key_len))
        return KVP_ERR_INVALID;
    return lookup_h(s, key, key_len, (uint32_t)kvp__store_hash(s, key, key_len), ref, ptr, digest);
}

#define LOOKUP_BATCH 16

/* Prefetch what looking up a group of keys will touch, in dependency order:
 * index buckets, then each candidate's key, metadata and links, then its LRU
 * neighbours. Only hints: nothing decided here is trusted later. */
static void lookup_prefetch(const kvp_store_t *s, uint32_t m, const uint32_t *h, const bool *ok)
{
    uint32_t cand[LOOKUP_BATCH];
    for (uint32_t i = 0; i < m; i++)
        if (ok[i])
            __builtin_prefetch(&s->index[kvp__store_index_home(s, h[i])]);
    for (uint32_t i = 0; i < m; i++) {
        cand[i] = ok[i] ? kvp__store_index_peek(s, h[i]) : UINT32_MAX;
        if (cand[i] == UINT32_MAX)
            continue;
        __builtin_prefetch(kvp__store_key(s, cand[i]));
        __builtin_prefetch(&s->meta[cand[i]]);
        __builtin_prefetch(&s->links[cand[i]]);
    }
    for (uint32_t i = 0; i < m; i++) {
        if (cand[i] == UINT32_MAX)
            continue;
        __builtin_prefetch(&s->links[s->links[cand[i]].prev]);
        __builtin_prefetch(&s->links[s->links[cand[i]].next]);
    }
}

uint32_t kvp_store_lookup_many(kvp_store_t *s, uint32_t count, const void *const *keys,
                               const size_t *key_lens, kvp_slot_ref_t *refs, kvp_status_t *results)
{
    uint32_t hits = 0, h[LOOKUP_BATCH];
    bool ok[LOOKUP_BATCH];
    if (!s || !keys || !key_lens || !results)
        return 0;
    for (uint32_t base = 0; base < count; base += LOOKUP_BATCH) {
        uint32_t m = KVP_MIN(LOOKUP_BATCH, count - base);
        for (uint32_t i = 0; i < m; i++) {
            ok[i] = key_ok(keys[base + i], key_lens[base + i]);
            h[i] = ok[i] ? (uint32_t)kvp__store_hash(s, keys[base + i], key_lens[base + i]) : 0;
        }
        lookup_prefetch(s, m, h, ok);
        for (uint32_t i = 0; i < m; i++) {
            kvp_status_t rc = KVP_ERR_INVALID;
            if (ok[i])
                rc = lookup_h(s, keys[base + i], key_lens[base + i], h[i],
                              refs ? &refs[base + i] : NULL, NULL, NULL);
            results[base + i] = rc;
            hits += rc == KVP_OK;
        }
    }
    return hits;
}

kvp_status_t kvp_store_probe(const kvp_store_t *s, const void *key, size_t key_len,
                             kvp_slot_ref_t *ref, kvp_slot_state_t *state)
{
    if (!s || !key_ok(key, key_len))
        return KVP_ERR_INVALID;
    uint32_t slot =
        kvp__store_index_find(s, key, key_len, (uint32_t)kvp__store_hash(s, key, key_len));
    if (slot == UINT32_MAX)
        return KVP_ERR_NOT_FOUND;
    if (ref)
        *ref = ref_of(s, slot);
    if (state)
        *state = (kvp_slot_state_t)s->meta[slot].state;
    return KVP_OK;
}

/* -------------------------------------------------------------- quarantine */

kvp_status_t kvp_store_quarantine(kvp_store_t *s, kvp_slot_ref_t ref)
{
    kvp_status_t rc = ref_resolve(s, ref, KVP_SLOT_FILLING);
    if (rc != KVP_OK)
        return rc;
    if (s->meta[ref.slot].flags & KVP_SLOTF_LENT)
        lent_leave(s, ref.slot);
    else
        kvp__store_index_remove(s, ref.slot);
    s->meta[ref.slot].key_len = 0;
    set_state(s, ref.slot, KVP_SLOT_QUARANTINED);
    s->t_ns[ref.slot] = kvp_clock_now(s->clock);
    s->st.quarantines++;
    return KVP_OK;
}

kvp_status_t kvp_store_release_quarantined(kvp_store_t *s, kvp_slot_ref_t ref, bool suspect)
{
    kvp_status_t rc = ref_resolve(s, ref, KVP_SLOT_QUARANTINED);
    if (rc != KVP_OK)
        return rc;
    kvp_slot_meta_t *m = &s->meta[ref.slot];
    bool was = m->flags & KVP_SLOTF_SUSPECT;
    set_state(s, ref.slot, KVP_SLOT_FREE);
    if (s->external) {
        /* Issue 29: the slot is the embedding's again; no acquire of ours
         * could re-verify it. The cap release is reported to the embedding
         * (KVP_EV_SLOTS_RELEASED status) instead. */
        s->t_ns[ref.slot] = 0;
    } else if (suspect || was) {
        if (!was)
            s->st.suspect++;
        m->flags |= KVP_SLOTF_SUSPECT;
        s->t_ns[ref.slot] = kvp_clock_now(s->clock) + s->suspect_period_ns;
    } else {
        s->t_ns[ref.slot] = 0;
    }
    free_push(s, ref.slot);
    s->st.quarantine_releases++;
    return KVP_OK;
}

/* ------------------------------------------------------------------ stats */

void kvp_store_get_stats(const kvp_store_t *s, kvp_store_stats_t *st)
{
    *st = s->st;
}

size_t kvp_store_meta_bytes_per_slot(const kvp_store_t *s)
{
    size_t per = sizeof(*s->meta) + sizeof(*s->links) + sizeof(*s->digest) + sizeof(*s->t_ns);
    size_t index = (size_t)s->index_cap * sizeof(*s->index);
    return per + (index + s->n - 1) / s->n;
}

size_t kvp_store_key_bytes_per_slot(const kvp_store_t *s)
{
    (void)s;
    return KVP_KEY_MAX;
}

/* ------------------------------------------------ issue 29: external slots */

/* The FREE slot `slot` off whichever free list holds it (external stores
 * never mark suspect, but a list is a list). */
static kvp_status_t free_take_at(kvp_store_t *s, uint32_t slot)
{
    if (s->meta[slot].state != KVP_SLOT_FREE)
        return KVP_ERR_BUSY;
    KVP_ASSERT(link_linked(s, slot));
    list_remove(s, slot);
    if (s->meta[slot].flags & KVP_SLOTF_SUSPECT)
        suspect_clear(s, slot);
    return KVP_OK;
}

static void key_set(kvp_store_t *s, uint32_t slot, const void *key, size_t key_len)
{
    memcpy(s->keys + (size_t)slot * KVP_KEY_MAX, key, key_len);
    s->meta[slot].key_len = (uint8_t)key_len;
}

kvp_status_t kvp_store_lend(kvp_store_t *s, uint32_t slot, const void *key, size_t key_len,
                            kvp_slot_ref_t *ref)
{
    if (!s || !s->external || slot >= s->n || !key_ok(key, key_len) || !ref)
        return KVP_ERR_INVALID;
    kvp_status_t rc = free_take_at(s, slot);
    if (rc != KVP_OK)
        return rc;
    key_set(s, slot, key, key_len);
    s->meta[slot].flags |= KVP_SLOTF_LENT;
    s->lent++;
    set_state(s, slot, KVP_SLOT_FILLING);
    s->st.reserves++;
    *ref = ref_of(s, slot);
    return KVP_OK;
}

kvp_status_t kvp_store_verify(kvp_store_t *s, kvp_slot_ref_t ref, const kvp_digest_t *expected)
{
    return kvp_store_verify_as(s, ref, expected, NULL);
}

kvp_status_t kvp_store_verify_as(kvp_store_t *s, kvp_slot_ref_t ref, const kvp_digest_t *expected,
                                 const kvp_digest_t *actual)
{
    kvp_status_t rc = ref_resolve(s, ref, KVP_SLOT_FILLING);
    if (rc != KVP_OK)
        return rc;
    if (!expected)
        return KVP_ERR_INVALID;
    kvp_digest_t d = actual ? *actual : slot_digest(s, ref.slot);
    if (kvp_digest_eq(&d, expected))
        return KVP_OK;
    s->st.checksum_mismatches++;
    KVP_WARN(s->log_prefix, "store: lent slot %u gen %u: content does not match the source's "
             "checksum", ref.slot, ref.gen);
    return KVP_ERR_CHECKSUM;
}

kvp_status_t kvp_store_publish(kvp_store_t *s, uint32_t slot, const void *key, size_t key_len,
                               kvp_slot_ref_t *ref)
{
    return kvp_store_publish_digest(s, slot, key, key_len, NULL, false, 0, ref);
}

kvp_digest_t kvp_store_slot_digest(const kvp_store_t *s, uint32_t slot)
{
    return slot_digest(s, slot);
}

kvp_status_t kvp_store_publish_digest(kvp_store_t *s, uint32_t slot, const void *key,
                                      size_t key_len, const kvp_digest_t *digest, bool once,
                                      uint64_t once_for, kvp_slot_ref_t *ref)
{
    if (!s || !s->external || slot >= s->n || !key_ok(key, key_len) || !ref ||
        (once_for != 0 && !once))
        return KVP_ERR_INVALID;
    uint32_t h32 = (uint32_t)kvp__store_hash(s, key, key_len);
    if (kvp__store_index_find(s, key, key_len, h32) != UINT32_MAX)
        return KVP_ERR_EXISTS;
    kvp_status_t rc = free_take_at(s, slot);
    if (rc != KVP_OK)
        return rc;
    key_set(s, slot, key, key_len);
    kvp__store_index_insert(s, slot, h32);
    set_state(s, slot, KVP_SLOT_FILLING);
    s->st.reserves++;
    kvp_digest_t d = digest != NULL ? *digest : slot_digest(s, slot);
    if (once) { /* before the commit serves parked demand */
        s->meta[slot].flags |= KVP_SLOTF_ONCE;
        s->t_ns[slot] = once_for; /* free_take_at left it 0: no suspect here */
    }
    commit_digest(s, slot, &d); /* READY: serves pending lookups and parked demand */
    *ref = ref_of(s, slot);
    return KVP_OK;
}

uint32_t kvp_store_served(kvp_store_t *s, const kvp_slot_ref_t *refs, uint32_t n,
                          uint64_t request_id)
{
    uint32_t done = 0;
    for (uint32_t i = 0; s != NULL && i < n; i++) {
        if (ref_resolve(s, refs[i], KVP_SLOT_READY) != KVP_OK)
            continue;
        kvp_slot_meta_t *m = &s->meta[refs[i].slot];
        if ((m->flags & (KVP_SLOTF_ONCE | KVP_SLOTF_UNPUBLISHING)) != KVP_SLOTF_ONCE)
            continue;
        uint64_t want = s->t_ns[refs[i].slot];
        if (want != 0 && want != request_id)
            continue; /* once for another request: this one only read it */
        KVP_ASSERT(m->pins > 0); /* the transfer that read it holds one until its release */
        m->flags |= KVP_SLOTF_UNPUBLISHING;
        done++;
    }
    return done;
}

kvp_status_t kvp_store_unpublish(kvp_store_t *s, const void *key, size_t key_len, uint32_t *slot)
{
    if (!s || !s->external || !key_ok(key, key_len) || !slot)
        return KVP_ERR_INVALID;
    uint32_t i = kvp__store_index_find(s, key, key_len, (uint32_t)kvp__store_hash(s, key, key_len));
    if (i == UINT32_MAX || s->meta[i].state != KVP_SLOT_READY)
        return KVP_ERR_NOT_FOUND;
    *slot = i;
    kvp_slot_meta_t *m = &s->meta[i];
    if (m->flags & KVP_SLOTF_UNPUBLISHING)
        return KVP_ERR_BUSY;
    if (m->pins > 0 && KVP_MUTATED(KVP_MUT_EXT_UNPUBLISH_PINNED))
        return KVP_OK; /* test-only mutation: the embedding takes back a slot still served */
    if (m->pins > 0) {
        m->flags |= KVP_SLOTF_UNPUBLISHING; /* I2: pins hold it until the last unpin */
        return KVP_ERR_BUSY;
    }
    ready_to_free(s, i);
    return KVP_OK;
}
