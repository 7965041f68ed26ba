/*
 * e2e_ext.c -- e2e_node's embedding in external-slots mode (issue 29): the
 * process owns the region (a memfd mapped shared, as vLLM maps its /dev/shm
 * files), publishes its blocks on the source side, fetches into slots it
 * names on the consumer side, and keeps its own view of every slot:
 *
 *   OWN   the embedding's (holding block k, a reuse pattern, or nothing)
 *   LENT  named in a kvp_fetch_into whose LOAD event has not come
 *   HELD  block_status KVP_ERR_BUSY at the LOAD: a WRITE may still land; the
 *         embedding's again only at that op's KVP_EV_SLOTS_RELEASED
 *   PUB   published (kvp_publish, or kvp_publish_once: back at its fetch's
 *         KVP_EV_SLOT_FREE) and not yet handed back
 *
 * A slot handed back unfilled is reused at once: the embedding writes its
 * own pattern into it, as vLLM reuses a chunk for other KV; a late landing
 * shows as a broken pattern at the next `verify`. Every `verify` also asks
 * kvp_slots_held() and counts a slot the node still holds that the
 * embedding owns (the other way round is an event not read yet).
 */
#include "e2e_ext.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

enum { EXT_OWN, EXT_LENT, EXT_HELD, EXT_PUB };
#define EXT_NONE UINT32_MAX   /* no block, no pattern */
#define EXT_REUSED (UINT32_MAX - 1)

static struct {
    uint8_t *region;
    size_t len;
    uint32_t nb, bs, next;
    uint8_t *state;
    uint32_t *content; /* block k, EXT_REUSED or EXT_NONE */
    uint64_t *op;      /* LENT/HELD: the load */
    uint8_t *once;     /* PUB: published once (e2e_ext_put's once_for) */
    uint8_t (*key)[E2E_EXT_KEY_MAX]; /* PUB: its key (klen bytes) */
    uint8_t *klen;
} E;

static uint8_t *slot_ptr(uint32_t s)
{
    return E.region + (size_t)s * E.bs;
}

static uint8_t reuse_byte(uint32_t s)
{
    return (uint8_t)(0xa5u ^ (s * 0x3bu));
}

static void reuse(uint32_t s)
{
    E.state[s] = EXT_OWN;
    E.content[s] = EXT_REUSED;
    memset(slot_ptr(s), reuse_byte(s), E.bs);
}

int e2e_ext_init(kvp_config_t *c)
{
    int fd = memfd_create("kvpeer-e2e-ext", MFD_CLOEXEC);
    E.nb = c->num_blocks;
    E.bs = c->block_size;
    E.len = (size_t)E.nb * E.bs;
    if (fd < 0 || ftruncate(fd, (off_t)E.len) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    E.region = mmap(NULL, E.len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    E.state = calloc(E.nb, 1);
    E.content = malloc(E.nb * sizeof(*E.content));
    E.op = calloc(E.nb, sizeof(*E.op));
    E.once = calloc(E.nb, 1);
    E.key = calloc(E.nb, sizeof(*E.key));
    E.klen = calloc(E.nb, 1);
    if (E.region == MAP_FAILED || E.state == NULL || E.content == NULL || E.op == NULL ||
        E.once == NULL || E.key == NULL || E.klen == NULL)
        return -1;
    for (uint32_t s = 0; s < E.nb; s++)
        E.content[s] = EXT_NONE;
    c->external_slots = 1;
    c->region = E.region;
    c->region_len = E.len;
    return 0;
}

void e2e_ext_fini(void)
{
    if (E.region != NULL && E.region != MAP_FAILED)
        munmap(E.region, E.len);
    free(E.state);
    free(E.content);
    free(E.op);
    free(E.once);
    free(E.key);
    free(E.klen);
}

/* An OWN slot for new content: never used first, then any OWN one. */
static int64_t take_slot(void)
{
    for (int pass = 0; pass < 2; pass++)
        for (uint32_t i = 0; i < E.nb; i++) {
            uint32_t s = (E.next + i) % E.nb;
            if (E.state[s] == EXT_OWN && (pass == 1 || E.content[s] == EXT_NONE)) {
                E.next = s + 1;
                return s;
            }
        }
    return -1;
}

uint32_t e2e_ext_put(kvp_node_t *n, uint32_t k, const uint8_t *key, uint32_t kl,
                     void (*fill)(uint32_t, uint8_t *, size_t), uint64_t once_for)
{
    int64_t s = take_slot();
    if (s < 0 || kl > E2E_EXT_KEY_MAX)
        return 0;
    fill(k, slot_ptr((uint32_t)s), E.bs);
    E.content[s] = k;
    memcpy(E.key[s], key, kl);
    E.klen[s] = (uint8_t)kl;
    bool once = once_for != 0 && k % 3 == 0;
    kvp_status_t st = once ? kvp_publish_once(n, key, kl, (uint32_t)s, NULL, once_for)
                           : kvp_publish(n, key, kl, (uint32_t)s);
    if (st != KVP_OK)
        return 0;
    E.state[s] = EXT_PUB;
    E.once[s] = once;
    return 1;
}

kvp_status_t e2e_ext_fetch(kvp_node_t *n, const char *peer, uint64_t req, const uint8_t *keys,
                           const uint32_t *lens, uint32_t count, int32_t *block_status,
                           uint32_t *slots, uint64_t *op)
{
    for (uint32_t i = 0; i < count; i++) {
        int64_t s = take_slot();
        if (s < 0) {
            for (uint32_t j = 0; j < i; j++)
                E.state[slots[j]] = EXT_OWN;
            return KVP_ERR_NOMEM;
        }
        slots[i] = (uint32_t)s;
        E.state[s] = EXT_LENT; /* taken: the next take_slot skips it */
        E.content[s] = EXT_NONE;
    }
    kvp_status_t st = kvp_fetch_into(n, peer, req, keys, lens, count, slots, 0, block_status, op);
    for (uint32_t i = 0; i < count; i++) {
        if (st == KVP_OK)
            E.op[slots[i]] = *op;
        else
            E.state[slots[i]] = EXT_OWN; /* nothing lent */
    }
    return st;
}

void e2e_ext_load_done(uint64_t op, const uint32_t *slots, const uint32_t *ks, uint32_t count,
                       const int32_t *block_status)
{
    for (uint32_t i = 0; i < count; i++) {
        uint32_t s = slots[i];
        if (E.state[s] != EXT_LENT || E.op[s] != op)
            continue;
        if (block_status[i] == KVP_OK) {
            E.state[s] = EXT_OWN;
            E.content[s] = ks[i];
        } else if (block_status[i] == KVP_ERR_BUSY) {
            E.state[s] = EXT_HELD;
        } else {
            reuse(s); /* the embedding's now: used for other KV at once */
        }
    }
}

void e2e_ext_event(const kvp_event_t *ev)
{
    if (ev->type == KVP_EV_SLOTS_RELEASED) {
        for (uint32_t s = 0; s < E.nb; s++)
            if (E.state[s] == EXT_HELD && E.op[s] == ev->op_id)
                reuse(s);
    } else if (ev->type == KVP_EV_SLOT_FREE && ev->op_id < E.nb &&
               E.state[ev->op_id] == EXT_PUB) {
        E.state[ev->op_id] = EXT_OWN;
    }
}

/* A key published once, not back yet (its SLOT_FREE not read). */
static bool once_published(const uint8_t *key, uint32_t kl)
{
    for (uint32_t s = 0; s < E.nb; s++)
        if (E.state[s] == EXT_PUB && E.once[s] && E.klen[s] == kl && memcmp(E.key[s], key, kl) == 0)
            return true;
    return false;
}

uint32_t e2e_ext_unpublish(kvp_node_t *n, uint32_t count, const uint8_t *keys,
                           const uint32_t *lens, uint32_t *busy)
{
    uint32_t ok = 0;
    size_t off = 0;
    *busy = 0;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t slot = 0;
        kvp_status_t st = kvp_unpublish(n, keys + off, lens[i], &slot);
        off += lens[i];
        if (st == KVP_OK && slot < E.nb && E.state[slot] == EXT_PUB) {
            E.state[slot] = EXT_OWN;
            ok++;
        } else if (st == KVP_ERR_BUSY) {
            (*busy)++; /* KVP_EV_SLOT_FREE hands it back */
        } else if (st == KVP_ERR_NOT_FOUND && once_published(keys + off - lens[i], lens[i])) {
            (*busy)++; /* served once: its fetch unpublished it, SLOT_FREE comes or came */
        }
    }
    return ok;
}

void e2e_ext_counts(uint32_t *lent, uint32_t *held, uint32_t *pub)
{
    *lent = *held = *pub = 0;
    for (uint32_t s = 0; s < E.nb; s++) {
        *lent += E.state[s] == EXT_LENT;
        *held += E.state[s] == EXT_HELD;
        *pub += E.state[s] == EXT_PUB;
    }
}

void e2e_ext_verify(kvp_node_t *n, uint32_t first, uint32_t count,
                    void (*fill)(uint32_t, uint8_t *, size_t), uint32_t *present, uint32_t *bad,
                    uint32_t *late, uint32_t *view_bad)
{
    uint8_t *buf = malloc(E.bs), *held = malloc(E.nb);
    *present = *bad = *late = *view_bad = 0;
    for (uint32_t s = 0; s < E.nb; s++) {
        uint32_t k = E.content[s];
        if (E.state[s] != EXT_OWN && E.state[s] != EXT_PUB)
            continue;
        if (k == EXT_REUSED) {
            memset(buf, reuse_byte(s), E.bs);
            *late += memcmp(slot_ptr(s), buf, E.bs) != 0;
        } else if (k != EXT_NONE && k >= first && k - first < count) {
            (*present)++;
            fill(k, buf, E.bs);
            *bad += memcmp(slot_ptr(s), buf, E.bs) != 0;
        }
    }
    if (kvp_slots_held(n, 0, E.nb, held) == KVP_OK) {
        for (uint32_t s = 0; s < E.nb; s++)
            *view_bad += E.state[s] == EXT_OWN && held[s] != 0;
    } else {
        *view_bad = E.nb;
    }
    free(buf);
    free(held);
}
