/*
 * store_region.c -- the store's region (mapped here, or the caller's, or a
 * spare kept from a destroyed store of the same size), its metadata arrays,
 * creation and destruction, and the accessors of its geometry (issue 31:
 * store.c cut along this seam).
 */
#include "store/store_int.h"

#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ------------------------------------------------------------ create/destroy */

static kvp_status_t config_check(const kvp_store_config_t *cfg, size_t *need)
{
    long page = sysconf(_SC_PAGESIZE);
    if (cfg->num_blocks == 0 || cfg->num_blocks > (1u << 31) || cfg->block_size == 0 ||
        cfg->block_size % (uint32_t)page != 0)
        return KVP_ERR_INVALID;
    *need = (size_t)cfg->num_blocks * cfg->block_size;
    if (cfg->region) {
        if ((uintptr_t)cfg->region % (uintptr_t)page != 0 || cfg->region_len < *need)
            return KVP_ERR_INVALID;
    }
    return KVP_OK;
}

#ifdef KVP_TESTING
/* Test builds only (kvpeer_testing): the simulator creates and destroys
 * thousands of nodes, and mapping, populating and unmapping a region costs
 * more than a node's share of a run. Up to KVP_STORE_SPARES regions of
 * normal pages (up to 4 MiB each) are kept at destroy and handed, zeroed as
 * a fresh anonymous mapping is, to the next stores mapping that length. */
#define KVP_STORE_SPARE_MAX (4u << 20)
#define KVP_STORE_SPARES 8
static pthread_mutex_t g_spare_mu = PTHREAD_MUTEX_INITIALIZER;
static void *g_spare[KVP_STORE_SPARES];
static size_t g_spare_len[KVP_STORE_SPARES];

static void *region_spare_take(size_t len)
{
    void *p = NULL;
    pthread_mutex_lock(&g_spare_mu);
    for (int i = 0; i < KVP_STORE_SPARES && p == NULL; i++)
        if (g_spare[i] != NULL && g_spare_len[i] == len) {
            p = g_spare[i];
            g_spare[i] = NULL;
        }
    pthread_mutex_unlock(&g_spare_mu);
    if (p != NULL)
        memset(p, 0, len);
    return p;
}

static bool region_spare_keep(void *p, size_t len)
{
    bool kept = false;
    if (len > KVP_STORE_SPARE_MAX)
        return false;
    pthread_mutex_lock(&g_spare_mu);
    for (int i = 0; i < KVP_STORE_SPARES && !kept; i++)
        if (g_spare[i] == NULL) {
            g_spare[i] = p;
            g_spare_len[i] = len;
            kept = true;
        }
    pthread_mutex_unlock(&g_spare_mu);
    return kept;
}
#endif

static kvp_status_t region_map(kvp_store_t *s, size_t len, bool huge)
{
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE;
    void *p = MAP_FAILED;
    if (huge) {
        size_t hlen = (len + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
        p = mmap(NULL, hlen, PROT_READ | PROT_WRITE, flags | MAP_HUGETLB, -1, 0);
        if (p != MAP_FAILED) {
            s->map_len = hlen;
            s->huge = true;
        } else {
            KVP_INFO(s->log_prefix, "store: no huge pages for %zu bytes, using normal pages", len);
        }
    }
#ifdef KVP_TESTING
    if (p == MAP_FAILED) {
        void *spare = region_spare_take(len);
        if (spare != NULL) {
            p = spare;
            s->map_len = len;
        }
    }
#endif
    if (p == MAP_FAILED) {
        p = mmap(NULL, len, PROT_READ | PROT_WRITE, flags, -1, 0);
        if (p == MAP_FAILED) {
            KVP_ERROR(s->log_prefix, "store: mmap of %zu bytes failed", len);
            return KVP_ERR_NOMEM;
        }
        s->map_len = len;
    }
    s->region = p;
    s->region_len = len;
    s->own_region = true;
    return KVP_OK;
}

#define KVP_STORE_HUGE (2u << 20)

static size_t align_up(size_t v, size_t a)
{
    return (v + a - 1) & ~(a - 1);
}

/* All metadata arrays live in one allocation, carved at 64-byte boundaries.
 * At a million slots it is ~120 MiB touched at random by every lookup, so
 * it is aligned to 2 MiB and offered to transparent huge pages: with 4 KiB
 * pages nearly every lookup pays several TLB misses. Zeroed (and so
 * populated) here, off the hot path. */
static kvp_status_t arrays_alloc(kvp_store_t *s)
{
    size_t n = s->n, off[6], total = 0;
    s->index_cap = (uint32_t)(n + n / 2 + 1);
    const size_t sizes[6] = {n * sizeof(*s->meta),
                             (n + 3) * sizeof(*s->links),
                             n * sizeof(*s->digest),
                             n * sizeof(*s->t_ns),
                             (size_t)s->index_cap * sizeof(*s->index),
                             n * KVP_KEY_MAX};
    for (int i = 0; i < 6; i++) {
        off[i] = total;
        total = align_up(total + sizes[i], 64);
    }
    size_t align = total >= 2 * KVP_STORE_HUGE ? KVP_STORE_HUGE : 64;
    s->arrays_raw = kvp__malloc(total + align);
    if (!s->arrays_raw)
        return KVP_ERR_NOMEM;
    char *base = (char *)align_up((uintptr_t)s->arrays_raw, align);
    if (align == KVP_STORE_HUGE)
        (void)madvise(base, total & ~(size_t)(KVP_STORE_HUGE - 1), MADV_HUGEPAGE); /* a hint */
    memset(base, 0, total);
    s->meta = (kvp_slot_meta_t *)(base + off[0]);
    s->links = (kvp_slot_link_t *)(base + off[1]);
    s->digest = (kvp_digest_t *)(base + off[2]);
    s->t_ns = (uint64_t *)(base + off[3]);
    s->index = (kvp_index_entry_t *)(base + off[4]);
    s->keys = (uint8_t *)(base + off[5]);
    return KVP_OK;
}

static void arrays_free(kvp_store_t *s)
{
    kvp__free(s->arrays_raw);
}

kvp_status_t kvp_store_create(const kvp_store_config_t *cfg, kvp_store_t **out)
{
    size_t need;
    kvp_status_t rc;
    if (!cfg || !out)
        return KVP_ERR_INVALID;
    if ((rc = config_check(cfg, &need)) != KVP_OK)
        return rc;
    kvp_store_t *s = kvp__calloc(1, sizeof(*s));
    if (!s)
        return KVP_ERR_NOMEM;
    s->n = cfg->num_blocks;
    s->block_size = cfg->block_size;
    s->max_pins = cfg->max_pins ? cfg->max_pins : (uint32_t)KVP_MIN(4ull * s->n, UINT32_MAX);
    s->suspect_period_ns = cfg->suspect_period_ns;
    s->hash_seed = cfg->hash_seed;
    s->clock = cfg->clock ? cfg->clock : kvp_clock_real();
    s->commit_cb = cfg->commit_cb;
    s->commit_cb_arg = cfg->commit_cb_arg;
    s->remove_cb = cfg->remove_cb;
    s->log_prefix = cfg->log_prefix;
    s->external = cfg->external;
    s->unpublish_cb = cfg->unpublish_cb;
    if ((rc = arrays_alloc(s)) != KVP_OK)
        goto undo_arrays;
    if (cfg->region) {
        s->region = cfg->region;
        s->region_len = cfg->region_len;
    } else if ((rc = region_map(s, need, cfg->huge_pages)) != KVP_OK) {
        goto undo_arrays;
    }
    for (uint32_t i = 0; i < s->n + 3; i++)
        link_self(s, i);
    for (uint32_t i = 0; i < s->n; i++)
        list_insert_tail(s, KVP_STORE_FREE_HEAD(s), i);
    s->st.slots[KVP_SLOT_FREE] = s->n;
    *out = s;
    return KVP_OK;

undo_arrays:
    arrays_free(s);
    kvp__free(s);
    return rc;
}

void kvp_store_destroy(kvp_store_t *s)
{
    if (!s)
        return;
    /* The header's `force` has no parameter: destroy is the shutdown path
     * after the drain, so leftover pins are reported, not asserted. */
    if (s->st.pins)
        KVP_WARN(s->log_prefix, "store: destroyed with %llu pins held",
                 (unsigned long long)s->st.pins);
    if (s->own_region) {
#ifdef KVP_TESTING
        if (!s->huge && region_spare_keep(s->region, s->map_len))
            s->own_region = false;
#endif
        if (s->own_region)
            munmap(s->region, s->map_len);
    }
    arrays_free(s);
    kvp__free(s);
}

uint32_t kvp_store_num_blocks(const kvp_store_t *s)
{
    return s->n;
}

uint32_t kvp_store_block_size(const kvp_store_t *s)
{
    return s->block_size;
}

void *kvp_store_base(const kvp_store_t *s)
{
    return s->region;
}

size_t kvp_store_region_len(const kvp_store_t *s)
{
    return s->region_len;
}

void *kvp_store_slot_ptr(const kvp_store_t *s, uint32_t slot)
{
    KVP_ASSERT(slot < s->n);
    return s->region + (size_t)slot * s->block_size;
}

bool kvp_store_is_huge(const kvp_store_t *s)
{
    return s->huge;
}

