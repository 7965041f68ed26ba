/*
 * api_external.c -- issue 29, external slots: the calls of kvpeer.h by
 * which an embedding that owns the region serves its own chunks
 * (kvp_publish, kvp_publish_once, kvp_publish_many, kvp_unpublish) and
 * asks which of its slots the node holds (kvp_slots_held). kvp_fetch_into
 * is with the other remote calls (api.c).
 * Each runs on the owner thread through kvp__node_exec.
 *
 * Ownership: a slot is the embedding's unless the store says otherwise --
 * FILLING or QUARANTINED (lent to a load: a WRITE may land; back at the
 * load's outcome or its KVP_EV_SLOTS_RELEASED) or READY (published: WRITEs
 * read it while pinned; back at kvp_unpublish, or at KVP_EV_SLOT_FREE when
 * the last pin drops -- the pins are dropped only by the release helper,
 * release.c, with their proof).
 */
#include "node/node.h"

#include <string.h>

typedef struct publish_args {
    const void *key;
    uint32_t key_len;
    uint32_t slot;
    const kvp_digest_t *digest; /* NULL: hash the slot here */
    bool once;                  /* kvp_publish_once */
    uint64_t once_for;          /* its request (0: any) */
} publish_args_t;

static kvp_status_t do_publish(kvp_node_t *n, void *arg)
{
    publish_args_t *a = arg;
    kvp_slot_ref_t ref;
    kvp_status_t st = kvp_store_publish_digest(n->store, a->slot, a->key, a->key_len, a->digest,
                                               a->once, a->once_for, &ref);
    if (st != KVP_OK)
        return st;
    kvp__server_on_commit(&n->env, a->key, a->key_len); /* pending lookups, parked demand */
    return KVP_OK;
}

static kvp_status_t publish(kvp_node_t *n, const void *key, uint32_t key_len, uint32_t slot,
                            const kvp_digest_t *digest, bool once, uint64_t once_for)
{
    if (n == NULL || key == NULL || key_len == 0 || key_len > KVP_KEY_MAX ||
        slot >= n->cfg.num_blocks)
        return KVP_ERR_INVALID;
    if (!n->cfg.external_slots)
        return KVP_ERR_UNSUPPORTED;
    publish_args_t a = {key, key_len, slot, digest, once, once_for};
    return kvp__node_exec(n, do_publish, &a);
}

KVP_EXPORT kvp_status_t kvp_publish(kvp_node_t *n, const void *key, uint32_t key_len,
                                    uint32_t slot)
{
    return publish(n, key, key_len, slot, NULL, false, 0);
}

_Static_assert(sizeof(kvp_digest_t) == KVP_CHECKSUM_LEN, "a checksum is one digest");

KVP_EXPORT kvp_status_t kvp_publish_checksum(kvp_node_t *n, const void *key, uint32_t key_len,
                                             uint32_t slot, const uint8_t sum[KVP_CHECKSUM_LEN])
{
    if (sum == NULL)
        return KVP_ERR_INVALID;
    kvp_digest_t d;
    memcpy(&d, sum, sizeof d);
    return publish(n, key, key_len, slot, &d, false, 0);
}

KVP_EXPORT kvp_status_t kvp_publish_once(kvp_node_t *n, const void *key, uint32_t key_len,
                                         uint32_t slot, const uint8_t sum[KVP_CHECKSUM_LEN],
                                         uint64_t request_id)
{
    kvp_digest_t d;
    if (sum != NULL)
        memcpy(&d, sum, sizeof d);
    return publish(n, key, key_len, slot, sum != NULL ? &d : NULL, true, request_id);
}

/* On the caller's thread, no lock: the store's region, geometry and seed
 * are fixed from create to destroy, and the slot's bytes are the
 * embedding's to keep still (kvpeer.h). */
KVP_EXPORT kvp_status_t kvp_slot_checksum(kvp_node_t *n, uint32_t slot,
                                          uint8_t sum[KVP_CHECKSUM_LEN])
{
    if (n == NULL || sum == NULL || slot >= n->cfg.num_blocks)
        return KVP_ERR_INVALID;
    if (!n->cfg.external_slots)
        return KVP_ERR_UNSUPPORTED;
    kvp_digest_t d = kvp_store_slot_digest(n->store, slot);
    memcpy(sum, &d, sizeof d);
    return KVP_OK;
}

/* The checksums of slots already checked, on the calling thread. */
static void slot_sums(kvp_node_t *n, const uint32_t *slots, uint32_t cnt, uint8_t *sums)
{
    for (uint32_t i = 0; i < cnt; i++) {
        kvp_digest_t d = kvp_store_slot_digest(n->store, slots[i]);
        memcpy(sums + (size_t)i * KVP_CHECKSUM_LEN, &d, sizeof d);
    }
}

KVP_EXPORT kvp_status_t kvp_slot_checksums(kvp_node_t *n, const uint32_t *slots, uint32_t cnt,
                                           uint8_t *sums)
{
    if (n == NULL || (cnt > 0 && (slots == NULL || sums == NULL)))
        return KVP_ERR_INVALID;
    if (!n->cfg.external_slots)
        return KVP_ERR_UNSUPPORTED;
    for (uint32_t i = 0; i < cnt; i++)
        if (slots[i] >= n->cfg.num_blocks)
            return KVP_ERR_INVALID;
    slot_sums(n, slots, cnt, sums);
    return KVP_OK;
}

typedef struct publish_many_args {
    const uint8_t *keys;
    const uint32_t *key_lens, *slots;
    uint32_t n;
    const uint8_t *sums; /* n checksums, or NULL */
    bool once;
    uint64_t once_for;
    int32_t *status;
} publish_many_args_t;

static kvp_status_t do_publish_many(kvp_node_t *n, void *arg)
{
    publish_many_args_t *a = arg;
    size_t off = 0;
    for (uint32_t i = 0; i < a->n; i++) {
        kvp_digest_t d;
        if (a->sums != NULL)
            memcpy(&d, a->sums + (size_t)i * KVP_CHECKSUM_LEN, sizeof d);
        publish_args_t one = {a->keys + off, a->key_lens[i], a->slots[i],
                              a->sums != NULL ? &d : NULL, a->once, a->once_for};
        a->status[i] = do_publish(n, &one);
        off += a->key_lens[i];
    }
    return KVP_OK;
}

/* Arguments checked: the publishes, on the node's thread. */
static kvp_status_t publish_many_exec(kvp_node_t *n, const uint8_t *keys,
                                      const uint32_t *key_lens, const uint32_t *slots,
                                      uint32_t count, const uint8_t *sums, uint32_t flags,
                                      uint64_t request_id, int32_t *status)
{
    publish_many_args_t a = {keys,  key_lens, slots,      count,
                             sums,  flags & KVP_PUBLISH_ONCE, request_id, status};
    return kvp__node_exec(n, do_publish_many, &a);
}

/* kvp_publish_many's arguments, all checked before anything is done. */
static kvp_status_t publish_many_check(kvp_node_t *n, const uint8_t *keys,
                                       const uint32_t *key_lens, const uint32_t *slots,
                                       uint32_t count, uint32_t flags, uint64_t request_id,
                                       const int32_t *status)
{
    if (n == NULL || keys == NULL || key_lens == NULL || slots == NULL || status == NULL ||
        count == 0 || (flags & ~KVP_PUBLISH_ONCE) ||
        (request_id != 0 && !(flags & KVP_PUBLISH_ONCE)))
        return KVP_ERR_INVALID;
    for (uint32_t i = 0; i < count; i++)
        if (key_lens[i] == 0 || key_lens[i] > KVP_KEY_MAX || slots[i] >= n->cfg.num_blocks)
            return KVP_ERR_INVALID; /* refused whole: nothing published */
    if (!n->cfg.external_slots)
        return KVP_ERR_UNSUPPORTED;
    return KVP_OK;
}

KVP_EXPORT kvp_status_t kvp_publish_many(kvp_node_t *n, const uint8_t *keys,
                                         const uint32_t *key_lens, const uint32_t *slots,
                                         uint32_t count, const uint8_t *sums, uint32_t flags,
                                         uint64_t request_id, int32_t *status)
{
    kvp_status_t st = publish_many_check(n, keys, key_lens, slots, count, flags, request_id,
                                         status);
    if (st != KVP_OK)
        return st;
    return publish_many_exec(n, keys, key_lens, slots, count, sums, flags, request_id, status);
}

/* Checked once: hashed here, then published with those sums. */
KVP_EXPORT kvp_status_t kvp_hash_publish_many(kvp_node_t *n, const uint8_t *keys,
                                              const uint32_t *key_lens, const uint32_t *slots,
                                              uint32_t count, uint8_t *sums, uint32_t flags,
                                              uint64_t request_id, int32_t *status)
{
    kvp_status_t st = publish_many_check(n, keys, key_lens, slots, count, flags, request_id,
                                         status);
    if (st == KVP_OK && sums == NULL)
        st = KVP_ERR_INVALID;
    if (st != KVP_OK)
        return st;
    slot_sums(n, slots, count, sums);
    return publish_many_exec(n, keys, key_lens, slots, count, sums, flags, request_id, status);
}

static kvp_status_t do_unpublish(kvp_node_t *n, void *arg)
{
    publish_args_t *a = arg;
    return kvp_store_unpublish(n->store, a->key, a->key_len, &a->slot);
}

KVP_EXPORT kvp_status_t kvp_unpublish(kvp_node_t *n, const void *key, uint32_t key_len,
                                      uint32_t *slot)
{
    if (n == NULL || key == NULL || key_len == 0 || key_len > KVP_KEY_MAX)
        return KVP_ERR_INVALID;
    if (!n->cfg.external_slots)
        return KVP_ERR_UNSUPPORTED;
    publish_args_t a = {key, key_len, UINT32_MAX, NULL, false, 0};
    kvp_status_t st = kvp__node_exec(n, do_unpublish, &a);
    if ((st == KVP_OK || st == KVP_ERR_BUSY) && slot != NULL)
        *slot = a.slot;
    return st;
}

typedef struct held_args {
    uint32_t first, count;
    uint8_t *held;
} held_args_t;

static kvp_status_t do_slots_held(kvp_node_t *n, void *arg)
{
    held_args_t *a = arg;
    for (uint32_t i = 0; i < a->count; i++) {
        kvp_slot_info_t info;
        kvp_status_t st = kvp_store_slot_info(n->store, a->first + i, &info);
        KVP_ASSERT(st == KVP_OK); /* range checked by the caller */
        a->held[i] = info.state == KVP_SLOT_FREE    ? 0
                     : info.state == KVP_SLOT_READY ? 2
                                                    : 1;
    }
    return KVP_OK;
}

KVP_EXPORT kvp_status_t kvp_slots_held(kvp_node_t *n, uint32_t first, uint32_t count,
                                       uint8_t *held)
{
    if (n == NULL || held == NULL || first >= n->cfg.num_blocks ||
        count > n->cfg.num_blocks - first)
        return KVP_ERR_INVALID;
    if (!n->cfg.external_slots)
        return KVP_ERR_UNSUPPORTED;
    held_args_t a = {first, count, held};
    return kvp__node_exec(n, do_slots_held, &a);
}

/* The store's unpublish callback: an unpublished slot's last pin dropped. */
void kvp__node_unpublished(void *arg, uint32_t slot)
{
    kvp_node_t *n = arg;
    kvp_event_t ev = {.type = KVP_EV_SLOT_FREE, .status = KVP_OK, .op_id = slot};
    kvp__node_emit(n, &ev);
}

/* ---- issue 29 step 2, "keys wanted" (server_wanted.c) ---- */

typedef struct wanted_args {
    uint64_t op_id;
    uint8_t *keys;
    uint32_t *key_lens;
    uint32_t cap, n;
} wanted_args_t;

static kvp_status_t do_wanted_keys(kvp_node_t *n, void *arg)
{
    wanted_args_t *a = arg;
    return kvp__server_wanted_keys(&n->env, a->op_id, a->keys, a->key_lens, a->cap, &a->n);
}

KVP_EXPORT kvp_status_t kvp_wanted_keys(kvp_node_t *n, uint64_t op_id, uint8_t *keys,
                                        uint32_t *key_lens, uint32_t cap, uint32_t *n_out)
{
    if (n == NULL || n_out == NULL || (cap > 0 && (keys == NULL || key_lens == NULL)))
        return KVP_ERR_INVALID;
    *n_out = 0;
    if (!n->cfg.external_wanted)
        return KVP_ERR_UNSUPPORTED;
    wanted_args_t a = {op_id, keys, key_lens, cap, 0};
    kvp_status_t st = kvp__node_exec(n, do_wanted_keys, &a);
    *n_out = a.n;
    return st;
}

static kvp_status_t do_parked_keys(kvp_node_t *n, void *arg)
{
    wanted_args_t *a = arg;
    a->n = kvp__server_parked_keys(&n->env, a->keys, a->key_lens, a->cap);
    return KVP_OK;
}

KVP_EXPORT kvp_status_t kvp_parked_keys(kvp_node_t *n, uint8_t *keys, uint32_t *key_lens,
                                        uint32_t cap, uint32_t *n_out)
{
    if (n == NULL || n_out == NULL || (cap > 0 && (keys == NULL || key_lens == NULL)))
        return KVP_ERR_INVALID;
    *n_out = 0;
    if (!n->cfg.external_wanted)
        return KVP_ERR_UNSUPPORTED;
    if (atomic_load_explicit(&n->env.parked, memory_order_relaxed) == 0)
        return KVP_OK; /* none parked: no trip to the node's thread (each tier-poll round) */
    wanted_args_t a = {0, keys, key_lens, cap, 0};
    kvp_status_t st = kvp__node_exec(n, do_parked_keys, &a);
    *n_out = a.n;
    return st;
}

static kvp_status_t do_wanted_done(kvp_node_t *n, void *arg)
{
    return kvp__server_wanted_done(&n->env, *(uint64_t *)arg);
}

KVP_EXPORT kvp_status_t kvp_wanted_done(kvp_node_t *n, uint64_t op_id)
{
    if (n == NULL)
        return KVP_ERR_INVALID;
    if (!n->cfg.external_wanted)
        return KVP_ERR_UNSUPPORTED;
    return kvp__node_exec(n, do_wanted_done, &op_id);
}
