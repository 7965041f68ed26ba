/*
 * store_check.c -- inspection (slot info, iteration) and kvp_store_check(),
 * the validator of every block-store invariant. O(num_blocks + index size):
 * meant for tests after each step and for debug builds, not the hot path.
 */
#include "store/store_int.h"

#include <stdio.h>
#include <string.h>

void kvp__store_fill_info(const kvp_store_t *s, uint32_t slot, kvp_slot_info_t *info)
{
    const kvp_slot_meta_t *m = &s->meta[slot];
    memset(info, 0, sizeof(*info));
    info->state = (kvp_slot_state_t)m->state; /* house: a copy for the caller, no transition */
    info->gen = m->gen;
    info->pins = m->pins;
    info->key_len = m->key_len;
    memcpy(info->key, kvp__store_key(s, slot), m->key_len);
    if (m->state == KVP_SLOT_READY)
        info->digest = s->digest[slot];
    if (m->state == KVP_SLOT_QUARANTINED)
        info->quarantined_at_ns = s->t_ns[slot];
    else if (m->flags & KVP_SLOTF_SUSPECT)
        info->suspect_until_ns = s->t_ns[slot];
}

kvp_status_t kvp_store_slot_info(const kvp_store_t *s, uint32_t slot, kvp_slot_info_t *info)
{
    if (!s || !info || slot >= s->n)
        return KVP_ERR_INVALID;
    kvp__store_fill_info(s, slot, info);
    return KVP_OK;
}

void kvp_store_iterate(const kvp_store_t *s, kvp_store_iter_cb fn, void *arg)
{
    kvp_slot_info_t info;
    for (uint32_t i = 0; i < s->n; i++) {
        if (s->meta[i].state == KVP_SLOT_FREE)
            continue;
        kvp__store_fill_info(s, i, &info);
        if (!fn(arg, i, &info))
            return;
    }
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            if (why && why_len)                                                                    \
                snprintf(why, why_len, __VA_ARGS__);                                               \
            return KVP_ERR_STATE;                                                                  \
        }                                                                                          \
    } while (0)

/* Per-slot facts: state vs key, pins, generation, list linkage, flags. */
static kvp_status_t check_slots(const kvp_store_t *s, char *why, size_t why_len)
{
    uint64_t count[4] = {0}, pins = 0, suspect = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        const kvp_slot_meta_t *m = &s->meta[i];
        const kvp_slot_link_t *l = &s->links[i];
        bool linked = l->next != i;
        CHECK(m->state <= KVP_SLOT_QUARANTINED, "slot %u: bad state %u", i, m->state);
        count[m->state]++;
        pins += m->pins;
        suspect += (m->flags & KVP_SLOTF_SUSPECT) != 0;
        CHECK((l->next == i) == (l->prev == i), "slot %u: half-linked", i);
        CHECK(m->state == KVP_SLOT_READY || m->pins == 0, "slot %u: %s with %u pins", i,
              kvp_slot_state_str(m->state), m->pins);
        CHECK(m->state == KVP_SLOT_FREE || m->gen != 0, "slot %u: in use with generation 0", i);
        bool keyed = m->state == KVP_SLOT_FILLING || m->state == KVP_SLOT_READY;
        CHECK(keyed ? (m->key_len >= 1 && m->key_len <= KVP_KEY_MAX) : m->key_len == 0,
              "slot %u: %s with key length %u", i, kvp_slot_state_str(m->state), m->key_len);
        if (m->state == KVP_SLOT_READY)
            CHECK(linked == (m->pins == 0), "slot %u: READY, %u pins, %s the LRU list", i, m->pins,
                  linked ? "on" : "off");
        else if (m->state == KVP_SLOT_FREE)
            CHECK(linked, "slot %u: FREE but on no free list", i);
        else
            CHECK(!linked, "slot %u: %s but on a list", i, kvp_slot_state_str(m->state));
    }
    for (int st = 0; st < 4; st++)
        CHECK(count[st] == s->st.slots[st], "%s: %llu slots, stats say %llu",
              kvp_slot_state_str((kvp_slot_state_t)st), (unsigned long long)count[st],
              (unsigned long long)s->st.slots[st]);
    CHECK(pins == s->st.pins, "pins: slots hold %llu, stats say %llu", (unsigned long long)pins,
          (unsigned long long)s->st.pins);
    CHECK(pins <= s->max_pins, "pins %llu over the bound %u", (unsigned long long)pins,
          s->max_pins);
    CHECK(suspect == s->st.suspect, "suspect: %llu slots flagged, stats say %llu",
          (unsigned long long)suspect, (unsigned long long)s->st.suspect);
    return KVP_OK;
}

/* Walk one list: well linked, no cycle, every member in `state` with the
 * suspect flag as `suspect` demands (-1: any). Returns the length in *len. */
static kvp_status_t check_list(const kvp_store_t *s, uint32_t head, const char *name,
                               kvp_slot_state_t state, int suspect, uint64_t *len, char *why,
                               size_t why_len)
{
    uint64_t k = 0;
    uint32_t prev = head;
    for (uint32_t i = s->links[head].next; i != head; prev = i, i = s->links[i].next) {
        CHECK(i < s->n, "%s list: link to %u out of range", name, i);
        CHECK(++k <= s->n, "%s list: cycle", name);
        CHECK(s->links[i].prev == prev, "%s list: slot %u prev %u, expected %u", name, i,
              s->links[i].prev, prev);
        CHECK(s->meta[i].state == state, "%s list: slot %u is %s", name, i,
              kvp_slot_state_str(s->meta[i].state));
        bool f = s->meta[i].flags & KVP_SLOTF_SUSPECT;
        CHECK(suspect < 0 || f == (suspect == 1), "%s list: slot %u suspect flag %d", name, i, f);
    }
    CHECK(s->links[head].prev == prev, "%s list: head prev %u, expected %u", name,
          s->links[head].prev, prev);
    *len = k;
    return KVP_OK;
}

static kvp_status_t check_lists(const kvp_store_t *s, char *why, size_t why_len)
{
    uint64_t nfree, nsus, nlru, unpinned = 0;
    kvp_status_t rc;
    if ((rc = check_list(s, KVP_STORE_FREE_HEAD(s), "free", KVP_SLOT_FREE, 0, &nfree, why,
                         why_len)) != KVP_OK ||
        (rc = check_list(s, KVP_STORE_SUSPECT_HEAD(s), "suspect", KVP_SLOT_FREE, 1, &nsus, why,
                         why_len)) != KVP_OK ||
        (rc = check_list(s, KVP_STORE_LRU_HEAD(s), "LRU", KVP_SLOT_READY, -1, &nlru, why,
                         why_len)) != KVP_OK)
        return rc;
    CHECK(nfree + nsus == s->st.slots[KVP_SLOT_FREE], "free lists hold %llu, %llu slots FREE",
          (unsigned long long)(nfree + nsus), (unsigned long long)s->st.slots[KVP_SLOT_FREE]);
    for (uint32_t i = 0; i < s->n; i++)
        unpinned += s->meta[i].state == KVP_SLOT_READY && s->meta[i].pins == 0;
    CHECK(nlru == unpinned, "LRU holds %llu, %llu READY slots unpinned", (unsigned long long)nlru,
          (unsigned long long)unpinned);
    return KVP_OK;
}

/* Index entries <=> FILLING/READY slots, with matching keys and hashes, each
 * reachable from its home bucket. */
static kvp_status_t check_index(const kvp_store_t *s, char *why, size_t why_len)
{
    uint64_t used = 0;
    for (uint32_t j = 0; j < s->index_cap; j++) {
        const kvp_index_entry_t *e = &s->index[j];
        if (e->slot1 == 0)
            continue;
        used++;
        uint32_t slot = e->slot1 - 1;
        CHECK(slot < s->n, "index %u: slot %u out of range", j, slot);
        uint8_t st = s->meta[slot].state;
        CHECK(st == KVP_SLOT_FILLING || st == KVP_SLOT_READY, "index %u: slot %u is %s", j, slot,
              kvp_slot_state_str(st));
        uint32_t h = (uint32_t)kvp__store_hash(s, kvp__store_key(s, slot), s->meta[slot].key_len);
        CHECK(h == e->h32, "index %u: slot %u hash %08x, key hashes to %08x", j, slot, e->h32, h);
        for (uint32_t i = kvp__store_index_home(s, h); i != j;
             i = i + 1 == s->index_cap ? 0 : i + 1)
            CHECK(s->index[i].slot1 != 0, "index %u: slot %u unreachable (hole at %u)", j, slot, i);
    }
    CHECK(used == s->index_used, "index: %llu entries, counter says %llu", (unsigned long long)used,
          (unsigned long long)s->index_used);
    /* Issue 29: lent FILLING slots keep their key unindexed. */
    uint64_t lent = 0;
    for (uint32_t i = 0; i < s->n; i++)
        if (s->meta[i].flags & KVP_SLOTF_LENT) {
            CHECK(s->external, "slot %u: lent in a store that lends nothing", i);
            CHECK(s->meta[i].state == KVP_SLOT_FILLING || s->meta[i].state == KVP_SLOT_QUARANTINED,
                  "slot %u: lent but %s", i, kvp_slot_state_str(s->meta[i].state));
            lent += s->meta[i].state == KVP_SLOT_FILLING;
        }
    for (uint32_t i = 0; i < s->n; i++) /* published once: a READY block of an embedding's */
        if (s->meta[i].flags & KVP_SLOTF_ONCE)
            CHECK(s->external && s->meta[i].state == KVP_SLOT_READY, "slot %u: served once but %s",
                  i, kvp_slot_state_str(s->meta[i].state));
    CHECK(lent == s->lent, "lent: %llu slots FILLING lent, counter says %llu",
          (unsigned long long)lent, (unsigned long long)s->lent);
    CHECK(used + lent == s->st.slots[KVP_SLOT_FILLING] + s->st.slots[KVP_SLOT_READY],
          "index: %llu entries (+%llu lent) for %llu FILLING/READY slots",
          (unsigned long long)used, (unsigned long long)lent,
          (unsigned long long)(s->st.slots[KVP_SLOT_FILLING] + s->st.slots[KVP_SLOT_READY]));
    for (uint32_t i = 0; i < s->n; i++) {
        uint8_t st = s->meta[i].state;
        if ((st != KVP_SLOT_FILLING && st != KVP_SLOT_READY) ||
            (s->meta[i].flags & KVP_SLOTF_LENT))
            continue;
        const uint8_t *k = kvp__store_key(s, i);
        uint32_t h = (uint32_t)kvp__store_hash(s, k, s->meta[i].key_len);
        uint32_t found = kvp__store_index_find(s, k, s->meta[i].key_len, h);
        CHECK(found == i, "slot %u: its key finds slot %d", i, (int)found);
    }
    return KVP_OK;
}

kvp_status_t kvp_store_check(const kvp_store_t *s, char *why, size_t why_len)
{
    kvp_status_t rc;
    if (!s)
        return KVP_ERR_INVALID;
    if ((rc = check_slots(s, why, why_len)) != KVP_OK ||
        (rc = check_lists(s, why, why_len)) != KVP_OK ||
        (rc = check_index(s, why, why_len)) != KVP_OK)
        return rc;
    if (why && why_len)
        why[0] = '\0';
    return KVP_OK;
}

#ifdef KVP_TESTING /* test builds only (issue 31): never in the shipped library */
void kvp__store_test_break_lru(kvp_store_t *s, uint32_t slot)
{
    /* Unlink a listed slot without changing its state, or link an unlisted
     * one onto the LRU: either way "pinned <=> off the LRU" (or "FREE <=> on
     * a free list") no longer holds. */
    KVP_ASSERT(slot < s->n);
    kvp_slot_link_t *l = s->links;
    if (l[slot].next != slot) {
        l[l[slot].prev].next = l[slot].next;
        l[l[slot].next].prev = l[slot].prev;
        l[slot].prev = l[slot].next = slot;
    } else {
        uint32_t head = KVP_STORE_LRU_HEAD(s), tail = l[head].prev;
        l[slot].prev = tail;
        l[slot].next = head;
        l[tail].next = slot;
        l[head].prev = slot;
    }
}
#endif /* KVP_TESTING */
