/* e2e_ext.h -- e2e_node's embedding in external-slots mode (issue 29). */
#ifndef KVP_E2E_EXT_H
#define KVP_E2E_EXT_H

#include "kvpeer.h"

#include <stddef.h>
#include <stdint.h>

#define E2E_EXT_KEY_MAX 32

/* The region (a shared memfd mapping) and c->external_slots; -1 on failure. */
int e2e_ext_init(kvp_config_t *c);
void e2e_ext_fini(void);
/* Block k written into a free slot and published: 1, or 0. once_for not 0:
 * every third block (k % 3 == 0) is published once for that request (its
 * fetch's completion hands the slot back by KVP_EV_SLOT_FREE). */
uint32_t e2e_ext_put(kvp_node_t *n, uint32_t k, const uint8_t *key, uint32_t kl,
                     void (*fill)(uint32_t, uint8_t *, size_t), uint64_t once_for);
/* kvp_fetch_into into free slots (written to slots[]), lent from here. */
kvp_status_t e2e_ext_fetch(kvp_node_t *n, const char *peer, uint64_t req, const uint8_t *keys,
                           const uint32_t *lens, uint32_t count, int32_t *block_status,
                           uint32_t *slots, uint64_t *op);
/* The LOAD of op: each slot OK (holds block ks[i]), HELD or reused. */
void e2e_ext_load_done(uint64_t op, const uint32_t *slots, const uint32_t *ks, uint32_t count,
                       const int32_t *block_status);
/* Every event the process reads goes here first (SLOTS_RELEASED, SLOT_FREE). */
void e2e_ext_event(const kvp_event_t *ev);
/* kvp_unpublish of `count` keys: how many came back at once; *busy the rest
 * that will come back (or came back) by KVP_EV_SLOT_FREE: BUSY, or a block
 * published once that its fetch unpublished already (NOT_FOUND). */
uint32_t e2e_ext_unpublish(kvp_node_t *n, uint32_t count, const uint8_t *keys,
                           const uint32_t *lens, uint32_t *busy);
void e2e_ext_counts(uint32_t *lent, uint32_t *held, uint32_t *pub);
/* Blocks of [first, first+count) present and bad, reuse patterns broken
 * (`late`), and slots the node holds that the embedding owns (`view_bad`). */
void e2e_ext_verify(kvp_node_t *n, uint32_t first, uint32_t count,
                    void (*fill)(uint32_t, uint8_t *, size_t), uint32_t *present, uint32_t *bad,
                    uint32_t *late, uint32_t *view_bad);

#endif
