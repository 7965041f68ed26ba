/*
 * ucx_setup.c -- UCX backend set-up: the ucp configuration (what kvpeer
 * changes through ucp_config_modify and why), context/worker creation, the
 * registered region, and the address blob codec. See ucx.c for ownership.
 *
 * Blob layout (little-endian; strict: every length checked, no trailing
 * bytes):
 *   0 magic u32 "KVPU" | 4 version u16 (5) | 6 flags u16 (bit0: UCX-allocated;
 *     bit1: takes direct-cma writes; bit2: writes direct-cma where taken,
 *     ucx_cma.c; other bits ignored)
 *   8 num_blocks u32 | 12 block_size u32 | 16 region base u64 | 24 region len u64
 *   32 pid u32 | 36 host_len u16 | 38 addr_len u16 | 40 rkey_len u16
 *   42 rma_addr_len u16 | 44 secret u64 | 52 probe base u64 | 60 probe_rkey_len u16
 *   62 zero u16 | 64 stream family u8 (4|6) | 65 zero u8 | 66 stream port u16
 *   68 stream address (16 B; v4 in the first 4; all zero: the address the
 *      control connection reached, tcpd.h)
 *   64 host id | AM worker address | packed rkey | RMA worker address |
 *      packed probe rkey | digest u64
 * The AM worker address is the AM context's (shm; no RMA, no tcp); the RMA
 * worker address and both rkeys belong to the RMA context (shm/RDMA only).
 * secret: the node incarnation's random AM authenticator (issue 27); the
 * blob travels only after authentication (SPEC §4), so nobody else has it.
 * digest = xxh3-64 (seed UCX_BLOB_MAGIC) of every byte before it.
 *
 * Why the digest: UCX parses a worker address and a packed rkey without a
 * length and trusts them; ucp_ep_create on a garbled address aborts the
 * process (UCX 1.13: an assertion in ucp_address_unpack, measured with the
 * hostile-peer test). Header checks alone cannot see inside those two
 * opaque parts, so every byte is covered by the digest and nothing reaches
 * UCX unless the blob is exactly what a kvpeer node packed. This stops
 * corruption, truncation, splicing and garbage; it is no authentication (a
 * forger can recompute it): against a malicious peer, configure a pre-shared
 * key, so that HELLO_ACK is accepted only from authenticated peers (SPEC §9).
 */
#include "transport/ucx_int.h"

#include <errno.h>
#include <sodium.h>
#include <sys/epoll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---------------------------------------------------------------- helpers */

static void le_put(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t le_get(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

void kvp__ucx_host_id_default(char *buf, size_t cap)
{
    char host[128] = "unknown", boot[64] = "";
    FILE *f;

    if (gethostname(host, sizeof(host) - 1) != 0)
        snprintf(host, sizeof(host), "unknown");
    f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof(boot), f))
            boot[0] = '\0';
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = '\0';
    snprintf(buf, cap, "%s/%s", host, boot);
}

/* ------------------------------------------------------------ blob codec */

kvp_status_t kvp__ucx_blob_view(const uint8_t *b, size_t len, ucx_blob_view_t *v)
{
    if (!b || len < UCX_BLOB_HDR)
        return KVP_ERR_TRUNCATED;
    if (len > KVP_UCX_BLOB_MAX || le_get(b, 4) != UCX_BLOB_MAGIC)
        return KVP_ERR_PROTO;
    if (le_get(b + 4, 2) != UCX_BLOB_VERSION)
        return KVP_ERR_INCOMPATIBLE;
    v->flags = (uint32_t)le_get(b + 6, 2);
    v->layout.num_blocks = (uint32_t)le_get(b + 8, 4);
    v->layout.block_size = (uint32_t)le_get(b + 12, 4);
    v->base = le_get(b + 16, 8);
    v->len = le_get(b + 24, 8);
    v->host_len = le_get(b + 36, 2);
    v->addr_len = le_get(b + 38, 2);
    v->rkey_len = le_get(b + 40, 2);
    v->rma_addr_len = le_get(b + 42, 2);
    v->secret = le_get(b + 44, 8);
    v->probe_base = le_get(b + 52, 8);
    v->probe_rkey_len = le_get(b + 60, 2);
    v->tcpd.family = b[64];
    v->tcpd.port = (uint16_t)le_get(b + 66, 2);
    memcpy(v->tcpd.ip, b + 68, 16);
    if (v->host_len > UCX_HOST_MAX || v->addr_len == 0 || v->addr_len > UCX_ADDR_MAX ||
        v->rkey_len == 0 || v->rkey_len > UCX_RKEY_MAX || v->rma_addr_len == 0 ||
        v->rma_addr_len > UCX_ADDR_MAX || v->probe_rkey_len > UCX_RKEY_MAX ||
        (v->probe_rkey_len != 0) != (v->probe_base != 0) || v->secret == 0 ||
        le_get(b + 62, 2) != 0 || (v->tcpd.family != 4 && v->tcpd.family != 6) || b[65] != 0 ||
        v->tcpd.port == 0)
        return KVP_ERR_PROTO;
    size_t need = UCX_BLOB_HDR + v->host_len + v->addr_len + v->rkey_len + v->rma_addr_len +
                  v->probe_rkey_len + UCX_BLOB_DIGEST;
    if (len < need)
        return KVP_ERR_TRUNCATED;
    if (len != need)
        return KVP_ERR_PROTO;
    if (le_get(b + need - UCX_BLOB_DIGEST, 8) !=
        kvp_hash64(b, need - UCX_BLOB_DIGEST, UCX_BLOB_MAGIC))
        return KVP_ERR_PROTO; /* corrupted, spliced or forged: never shown to UCX */
    uint64_t span = (uint64_t)v->layout.num_blocks * v->layout.block_size;
    if (v->layout.num_blocks == 0 || v->layout.block_size == 0 || span > v->len ||
        v->base + v->len < v->base || v->base == 0)
        return KVP_ERR_PROTO;
    v->host = b + UCX_BLOB_HDR;
    v->addr = v->host + v->host_len;
    v->rkey = v->addr + v->addr_len;
    v->rma_addr = v->rkey + v->rkey_len;
    v->probe_rkey = v->rma_addr + v->rma_addr_len;
    return KVP_OK;
}

typedef struct ucx_blob_parts_in {
    const void *addr, *rkey, *rma_addr, *probe_rkey;
    size_t addr_len, rkey_len, rma_addr_len, probe_rkey_len;
} ucx_blob_in_t;

static kvp_status_t ucx_blob_build(ucx_xport_t *x, const ucx_blob_in_t *in)
{
    size_t host_len = strlen(x->host_id);
    size_t len = UCX_BLOB_HDR + host_len + in->addr_len + in->rkey_len + in->rma_addr_len +
                 in->probe_rkey_len + UCX_BLOB_DIGEST;

    if (in->addr_len > UCX_ADDR_MAX || in->rkey_len > UCX_RKEY_MAX ||
        in->rma_addr_len > UCX_ADDR_MAX || in->probe_rkey_len > UCX_RKEY_MAX ||
        len > KVP_UCX_BLOB_MAX) {
        KVP_ERROR(PFX(x), "blob too large (addresses %zu+%zu B, rkeys %zu+%zu B)", in->addr_len,
                  in->rma_addr_len, in->rkey_len, in->probe_rkey_len);
        return KVP_ERR_LIMIT;
    }
    uint8_t *b = kvp__calloc(1, len);
    if (!b)
        return KVP_ERR_NOMEM;
    le_put(b, UCX_BLOB_MAGIC, 4);
    le_put(b + 4, UCX_BLOB_VERSION, 2);
    le_put(b + 6, (x->region_kind == REGION_UCX ? 1u : 0u) | kvp__ucx_cma_flags(x), 2);
    le_put(b + 8, x->layout.num_blocks, 4);
    le_put(b + 12, x->layout.block_size, 4);
    le_put(b + 16, (uintptr_t)x->region, 8);
    le_put(b + 24, x->region_len, 8);
    le_put(b + 32, (uint64_t)getpid(), 4);
    le_put(b + 36, host_len, 2);
    le_put(b + 38, in->addr_len, 2);
    le_put(b + 40, in->rkey_len, 2);
    le_put(b + 42, in->rma_addr_len, 2);
    le_put(b + 44, x->token, 8);
    le_put(b + 52, in->probe_rkey_len ? (uintptr_t)x->probe_cells : 0, 8);
    le_put(b + 60, in->probe_rkey_len, 2);
    kvp_tcpd_addr_t ta;
    kvp__tcpd_local_addr(x->tcpd, &ta);
    b[64] = ta.family;
    le_put(b + 66, ta.port, 2);
    memcpy(b + 68, ta.ip, 16);
    uint8_t *q = b + UCX_BLOB_HDR;
    memcpy(q, x->host_id, host_len);
    q += host_len;
    memcpy(q, in->addr, in->addr_len);
    q += in->addr_len;
    memcpy(q, in->rkey, in->rkey_len);
    q += in->rkey_len;
    memcpy(q, in->rma_addr, in->rma_addr_len);
    q += in->rma_addr_len;
    if (in->probe_rkey_len)
        memcpy(q, in->probe_rkey, in->probe_rkey_len);
    le_put(b + len - UCX_BLOB_DIGEST, kvp_hash64(b, len - UCX_BLOB_DIGEST, UCX_BLOB_MAGIC), 8);
    x->blob = b;
    x->blob_len = len;
    return KVP_OK;
}

kvp_status_t kvp_ucx_blob_parse(const void *blob, size_t len, kvp_ucx_blob_parts_t *out)
{
    ucx_blob_view_t v;
    kvp_status_t st;

    if (!out)
        return KVP_ERR_INVALID;
    st = kvp__ucx_blob_view(blob, len, &v);
    if (st != KVP_OK)
        return st;
    out->layout = v.layout;
    out->region_base = v.base;
    out->region_len = v.len;
    out->ucx_allocated = v.flags & 1;
    out->pid = (uint32_t)le_get((const uint8_t *)blob + 32, 4);
    out->host_id = v.host;
    out->host_id_len = v.host_len;
    out->worker_addr = v.addr;
    out->worker_addr_len = v.addr_len;
    out->rkey = v.rkey;
    out->rkey_len = v.rkey_len;
    out->rma_worker_addr = v.rma_addr;
    out->rma_worker_addr_len = v.rma_addr_len;
    return KVP_OK;
}

/* ------------------------------------------------------------ region */

static kvp_status_t ucx_mem_map(ucx_xport_t *x, void *addr, size_t len, bool allocate)
{
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_FLAGS,
        .address = addr,
        .length = len,
        .flags = allocate ? UCP_MEM_MAP_ALLOCATE : 0,
    };
    ucs_status_t s = ucp_mem_map(x->ctx, &mp, &x->memh);

    if (s != UCS_OK) {
        KVP_LOG(allocate ? KVP_LOG_WARN : KVP_LOG_ERROR, PFX(x), "ucp_mem_map(%s, %zu B): %s",
                allocate ? "ALLOCATE" : "register", len, ucs_status_string(s));
        return KVP_ERR_TRANSPORT;
    }
    if (allocate) {
        ucp_mem_attr_t ma = {.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH};
        s = ucp_mem_query(x->memh, &ma);
        if (s != UCS_OK || !ma.address || ma.length < len) {
            KVP_WARN(PFX(x), "ucp_mem_query after ALLOCATE: %s", ucs_status_string(s));
            ucp_mem_unmap(x->ctx, x->memh);
            x->memh = NULL;
            return KVP_ERR_TRANSPORT;
        }
        x->region = ma.address;
    } else {
        x->region = addr;
    }
    return KVP_OK;
}

static kvp_status_t ucx_region_acquire(ucx_xport_t *x, void *base, size_t len)
{
    if (base) {
        x->region_kind = REGION_CALLER;
        return ucx_mem_map(x, base, len, false);
    }
    /* UCX-allocated (shm) memory only serves direct shm puts, which need shm
     * transports: without them, plain memory (peers reach it by AM). */
    if (x->shm_enabled && ucx_mem_map(x, NULL, len, true) == KVP_OK) {
        x->region_kind = REGION_UCX;
        return KVP_OK;
    }
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) {
        KVP_ERROR(PFX(x), "mmap(%zu B): %s", len, strerror(errno));
        return KVP_ERR_NOMEM;
    }
    if (ucx_mem_map(x, m, len, false) != KVP_OK) {
        munmap(m, len);
        return KVP_ERR_TRANSPORT;
    }
    x->region_kind = REGION_MMAP;
    if (x->shm_enabled)
        KVP_WARN(PFX(x),
                 "UCX could not allocate the %zu B region (posix/sysv shm, e.g. /dev/shm "
                 "too small): using anonymous memory; same-host writes INTO this node go "
                 "by active messages (consumer CPU, ~2x slower, no direct shared memory)",
                 len);
    return KVP_OK;
}

void kvp__ucx_region_release(ucx_xport_t *x)
{
    if (x->memh)
        ucp_mem_unmap(x->ctx, x->memh); /* frees UCX-allocated memory too */
    if (x->region_kind == REGION_MMAP)
        munmap(x->region, x->region_len);
    x->memh = NULL;
    x->region = NULL;
    x->region_kind = REGION_NONE;
}

/* Our blob (ucx_blob_build) from the region's packed rkey, both workers'
 * addresses and the probe segment's rkey; the packed buffers released
 * either way. */
static kvp_status_t ucx_region_blob(ucx_xport_t *x)
{
    void *rkey = NULL, *prkey = NULL;
    size_t rkey_len = 0, prkey_len = 0, addr_len = 0, rma_addr_len = 0;
    ucp_address_t *addr = NULL, *rma_addr = NULL;
    kvp_status_t st;

    if (ucp_rkey_pack(x->ctx, x->memh, &rkey, &rkey_len) != UCS_OK ||
        ucp_worker_get_address(x->worker_am, &addr, &addr_len) != UCS_OK ||
        ucp_worker_get_address(x->worker, &rma_addr, &rma_addr_len) != UCS_OK ||
        (x->probe_memh && ucp_rkey_pack(x->ctx, x->probe_memh, &prkey, &prkey_len) != UCS_OK)) {
        KVP_ERROR(PFX(x), "ucp_rkey_pack/ucp_worker_get_address failed");
        st = KVP_ERR_TRANSPORT;
    } else {
        ucx_blob_in_t in = {addr,     rkey,     rma_addr,     prkey,
                            addr_len, rkey_len, rma_addr_len, prkey_len};
        st = ucx_blob_build(x, &in);
    }
    if (addr)
        ucp_worker_release_address(x->worker_am, addr);
    if (rma_addr)
        ucp_worker_release_address(x->worker, rma_addr);
    if (rkey)
        ucp_rkey_buffer_release(rkey);
    if (prkey)
        ucp_rkey_buffer_release(prkey);
    return st;
}

kvp_status_t kvp__ucx_register_region(kvp_xport_t *xp, void *base, size_t len,
                                      const kvp_layout_t *layout, void **base_out)
{
    ucx_xport_t *x = ucx_of(xp);
    kvp_status_t st;

    if (!layout || !base_out || layout->num_blocks == 0 || layout->block_size == 0 ||
        (uint64_t)layout->num_blocks * layout->block_size > len)
        return KVP_ERR_INVALID;
    if (x->region_kind != REGION_NONE)
        return KVP_ERR_STATE;
    st = ucx_region_acquire(x, base, len);
    if (st != KVP_OK)
        return st;
    x->region_len = len;
    x->layout = *layout;
    st = kvp__ucx_acc_alloc(x);
    if (st == KVP_OK)
        st = ucx_region_blob(x);
    if (st != KVP_OK) {
        kvp__free(x->acc);
        x->acc = NULL;
        kvp__ucx_region_release(x);
        return st;
    }
    /* The address only at DEBUG (issue 27: it helped aim a foreign put). */
    KVP_INFO(PFX(x), "region %zu B (%s), blob %zu B", len,
             x->region_kind == REGION_UCX    ? "UCX-allocated"
             : x->region_kind == REGION_MMAP ? "anonymous mmap"
                                             : "caller memory",
             x->blob_len);
    KVP_DEBUG(PFX(x), "region at %p", x->region);
    *base_out = x->region;
    return KVP_OK;
}

kvp_status_t kvp__ucx_local_blob(kvp_xport_t *xp, const void **blob, size_t *len)
{
    ucx_xport_t *x = ucx_of(xp);

    if (!blob || !len)
        return KVP_ERR_INVALID;
    if (!x->blob)
        return KVP_ERR_STATE;
    *blob = x->blob;
    *len = x->blob_len;
    return KVP_OK;
}

/* ---------------------------------------------------------------- config */

typedef struct ucx_kv {
    const char *k, *v;
} ucx_kv_t;

enum { UCX_KV_N = 8 };

/* Which keys need ucp_config_modify; UCX_* environment values stay unless a
 * config field overrides them. Fills kv[UCX_KV_N]; returns the effective TLS.
 *
 * ZCOPY_THRESH=inf (unless UCX_ZCOPY_THRESH is set): UCX 1.13's tcp
 * transport crashes under network partitions (a jump through a stale
 * endpoint in uct_tcp_iface_progress's event handler) far more often with
 * zero-copy sends in flight: tests/reliability/partition.py with kvpeer's
 * AM path, release build, loaded VM, 2026-12-03: 26 of 40 runs crashed the
 * source daemon with zero-copy, 9 of 50 with bcopy only (main, emulated
 * puts, which use bcopy: 2 of 10 the same day). Not the cure: the cause is
 * UCX's lingering-endpoint teardown, worked around by draining a live tcp
 * endpoint before closing it (ucx.c, ucx_peer_end_ep; DESIGN.md); with it,
 * zero-copy crashed 0 of 19 runs, too few to switch: bcopy stays the default.
 * Direct shm puts never use zero-copy; on tcp bcopy costs one more copy
 * into UCX's send buffer.
 *
 * TCP_TX_SEG_SIZE=64K (unless UCX_TCP_TX_SEG_SIZE or UCX_TCP_RX_SEG_SIZE is
 * set): the AM path sends a block as one eager bcopy message, which UCX's tcp
 * transport cuts into TX_SEG_SIZE fragments, one send() each; the default 8K
 * made a 256 KiB block 32 syscalls on each side. 64K is UCX's default
 * RX_SEG_SIZE, so a peer on the defaults (or an older kvpeer, at 8K) still
 * receives every fragment (an operator who sets UCX_TCP_RX_SEG_SIZE below 64K
 * on one node must set it on all). e2e_bench tcp, 256 KiB blocks, 16 MiB requests,
 * K=4, checksums off, 2026-12-03 load 1.5: 1.04 -> 2.67 GB/s, CPU 1.55 ->
 * 0.64 s/GB.
 *
 * PROTO_EMULATION_ENABLE=n (issue 30; only where the loaded UCX has the key,
 * >= 1.21, and unless UCX_PROTO_EMULATION_ENABLE is set): kvpeer posts
 * ucp_put_nbx only on a direct path and never wants UCX to emulate it (the
 * target would copy it and answer with a send, which aborts the target when
 * the source died): such a put now fails, the transfer with it. It is a
 * sender setting: it does not stop the software put handler from serving
 * another process's emulated puts (issue 27). The bench's legacy_put and the
 * emulated-put mutation keep emulation.
 *
 * TCP_PUT_ENABLE=n (issue 30; unless UCX_TCP_PUT_ENABLE is set): our tcp
 * interface does not offer UCX's native tcp put. UCX 1.22 sends a put over
 * tcp as that zero-copy put whenever the target offers it (1.13 emulated it
 * with active messages), and libuct's tcp receiver writes its bytes to the
 * address in the request -- no rkey, no region, no UCP feature checked: a
 * foreign UCX 1.22 worker wrote 64 KiB into memory of a context WITHOUT
 * UCP_FEATURE_RMA that had registered nothing. Not offered, a stock sender
 * falls back to the emulated put, which a context without RMA drops (the
 * receiver still parses a hand-made PUT request: only not exposing the tcp
 * port closes that). kvpeer's own writes on tcp are active messages. */
static const char *ucx_config_keys(const kvp_ucx_config_t *cfg, ucx_kv_t kv[UCX_KV_N])
{
    const char *tls = cfg->tls ? cfg->tls : getenv("UCX_TLS");
    const char *ka = cfg->keepalive_interval            ? cfg->keepalive_interval
                     : getenv("UCX_KEEPALIVE_INTERVAL") ? NULL
                                                        : UCX_DEFAULT_KEEPALIVE;
    const char *ap = cfg->alloc_prio            ? cfg->alloc_prio
                     : getenv("UCX_ALLOC_PRIO") ? NULL
                                                : UCX_DEFAULT_ALLOC_PRIO;
    /* MM_ERROR_HANDLING is the 1.13 key that keeps shm for PEER endpoints;
     * without any shm transport UCX rejects it with a warning, so skip. */
    bool shm = !tls || tls[0] == '^' || strstr(tls, "sm") || strstr(tls, "posix") ||
               strstr(tls, "sysv") || strstr(tls, "mm") || strstr(tls, "all");
    /* The tcp keys likewise only with tcp (1.13 warns "invalid
     * configurations: TX_SEG_SIZE=64K,..." when no transport takes them). */
    bool tcp = !tls || strstr(tls, "all") ||
               (tls[0] == '^' ? strstr(tls, "tcp") == NULL : strstr(tls, "tcp") != NULL);

    kv[0] = (ucx_kv_t){"TLS", cfg->tls};
    kv[1] = (ucx_kv_t){"MM_ERROR_HANDLING", shm ? "y" : NULL};
    kv[2] = (ucx_kv_t){"KEEPALIVE_INTERVAL", ka};
    kv[3] = (ucx_kv_t){"ALLOC_PRIO", ap};
    kv[4] = (ucx_kv_t){"ZCOPY_THRESH", getenv("UCX_ZCOPY_THRESH") ? NULL : "inf"};
    kv[5] = (ucx_kv_t){"TX_SEG_SIZE", /* the tcp transport's, without its TCP_ prefix */
                       !tcp || getenv("UCX_TCP_TX_SEG_SIZE") || getenv("UCX_TCP_RX_SEG_SIZE")
                           ? NULL
                           : "64K"};
    kv[6] = (ucx_kv_t){"PROTO_EMULATION_ENABLE",
                       cfg->legacy_put || KVP_MUTATED(KVP_MUT_UCX_EMULATED_PUT) ||
                               getenv("UCX_PROTO_EMULATION_ENABLE") ||
                               !kvp__ucx_config_has("PROTO_EMULATION_ENABLE", "n")
                           ? NULL
                           : "n"};
    kv[7] = (ucx_kv_t){"PUT_ENABLE", /* the tcp transport's, without its TCP_ prefix */
                       !tcp || getenv("UCX_TCP_PUT_ENABLE") ? NULL : "n"};
    return tls;
}

static void ucx_rma_tls(const char *tls, bool keep_sysv, char *buf, size_t cap);

void kvp_ucx_config_each(const kvp_ucx_config_t *cfg,
                         void (*set)(const char *key, const char *value, void *arg), void *arg)
{
    ucx_kv_t kv[UCX_KV_N];
    kvp_ucx_config_t def;

    if (!cfg) {
        kvp_ucx_config_default(&def);
        cfg = &def;
    }
    char rtls[256];
    ucx_rma_tls(ucx_config_keys(cfg, kv), false, rtls, sizeof(rtls));
    kv[0].v = rtls; /* the RMA context's: never tcp (issue 27) */
    for (size_t i = 0; i < KVP_ARRAY_SIZE(kv); i++)
        if (kv[i].v)
            set(kv[i].k, kv[i].v, arg);
}

/* The RMA context's transports: the configured list without tcp (issue 27:
 * UCX serves emulated put/get over any AM lane of an RMA context; tcp would
 * let any host reach them) and without sysv (UCX creates its sysv segments
 * with mode 0660: any process of the node's GROUP could attach the RMA
 * worker's FIFO and reach those handlers; posix segments are reached through
 * /proc/<pid>/fd, i.e. only by processes allowed to ptrace the node; cma
 * needs the same). NULL/"all" -> "^tcp,sysv"; "^x" -> "^x,tcp,sysv"; a list
 * -> the list minus tcp and sysv, "sm"/"shm" -> "posix,cma" (nothing left:
 * "self"). The AM context keeps sysv (keep_sysv): it has no RMA handlers,
 * and kvpeer's data AM needs the node's secret; it has no tcp either: across
 * hosts kvpeer's own stream carries the data (tcpd.h; libuct's tcp receiver
 * executes PUT_REQ frames from anyone). */
static void ucx_rma_tls(const char *tls, bool keep_sysv, char *buf, size_t cap)
{
    const char *drop = keep_sysv ? "tcp" : "tcp,sysv";
    if (tls == NULL || strcmp(tls, "all") == 0) {
        snprintf(buf, cap, "^%s", drop);
        return;
    }
    if (tls[0] == '^') {
        snprintf(buf, cap, "%s,%s", tls, drop);
        return;
    }
    char tmp[256];
    size_t n = 0;
    snprintf(tmp, sizeof(tmp), "%s", tls);
    buf[0] = '\0';
    for (char *save = NULL, *t = strtok_r(tmp, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        if (strcmp(t, "tcp") == 0 || strcmp(t, "all") == 0 ||
            (!keep_sysv && strcmp(t, "sysv") == 0))
            continue;
        const char *w_t = strcmp(t, "sm") == 0 || strcmp(t, "shm") == 0
                              ? (keep_sysv ? "posix,sysv,cma" : "posix,cma")
                              : t;
        int w = snprintf(buf + n, cap - n, "%s%s", n ? "," : "", w_t);
        if (w < 0 || (size_t)w >= cap - n)
            break;
        n += (size_t)w;
    }
    if (n == 0)
        snprintf(buf, cap, "self");
}

static kvp_status_t ucx_config_apply(ucx_xport_t *x, ucp_config_t *c, const kvp_ucx_config_t *cfg,
                                     bool rma)
{
    ucx_kv_t kv[UCX_KV_N];
    const char *tls = ucx_config_keys(cfg, kv);
    char rtls[256];

    x->shm_enabled = kv[1].v != NULL;
    snprintf(x->tls, sizeof(x->tls), "%s", tls ? tls : "");
    /* Neither context has tcp (issue 27): kvpeer's own stream, tcpd.h. */
    ucx_rma_tls(tls, !rma, rtls, sizeof(rtls));
    kv[0].v = rtls;
    kv[5].v = NULL; /* tcp's keys: refused (WARN) by a context without tcp */
    kv[7].v = NULL;
    for (size_t i = 0; i < KVP_ARRAY_SIZE(kv); i++) {
        if (!kv[i].v)
            continue;
        ucs_status_t s = kvp__ucx_config_modify(c, kv[i].k, kv[i].v); /* issue 30 */
        if (s != UCS_OK) {
            KVP_ERROR(PFX(x), "ucp_config_modify(%s=%s): %s", kv[i].k, kv[i].v,
                      ucs_status_string(s));
            return KVP_ERR_INVALID;
        }
    }
    if (!rma && x->net_devices[0] && ucp_config_modify(c, "NET_DEVICES", x->net_devices) != UCS_OK) {
        KVP_ERROR(PFX(x), "ucp_config_modify(NET_DEVICES=%s) failed", x->net_devices);
        return KVP_ERR_INVALID;
    }
    KVP_INFO(PFX(x),
             "UCX %s %s context: TLS=%s NET_DEVICES=%s MM_ERROR_HANDLING=%s KEEPALIVE_INTERVAL=%s "
             "ALLOC_PRIO=%s ZCOPY_THRESH=%s TCP_TX_SEG_SIZE=%s PROTO_EMULATION_ENABLE=%s "
             "TCP_PUT_ENABLE=%s",
             ucp_get_version_string(), rma ? "RMA (shm/RDMA, no tcp)" : "AM (shm; no RMA, no tcp)",
             kv[0].v ? kv[0].v : "(default)",
             rma ? "-" : x->net_devices[0] ? x->net_devices : "(default)",
             kv[1].v ? "y" : "(no shm)", kv[2].v ? kv[2].v : "(env)",
             kv[3].v ? kv[3].v : "(env)", kv[4].v ? kv[4].v : "(env)",
             kv[5].v ? kv[5].v : "(env)", kv[6].v ? kv[6].v : "(env or UCX default)",
             kv[7].v ? kv[7].v : "(env)");
    return KVP_OK;
}

/* UCX_NET_DEVICES of the AM context from the control listen address, unless
 * the environment sets it. */
static void ucx_pick_net_devices(ucx_xport_t *x, const kvp_ucx_config_t *cfg)
{
    bool all = false;

    x->net_devices[0] = '\0';
    if (cfg->listen_addr == NULL)
        return;
    if (getenv("UCX_NET_DEVICES")) {
        KVP_INFO(PFX(x), "UCX_NET_DEVICES=%s from the environment (not derived from listen %s)",
                 getenv("UCX_NET_DEVICES"), cfg->listen_addr);
        return;
    }
    kvp_status_t st =
        kvp__ucx_net_devices(cfg->listen_addr, x->net_devices, sizeof(x->net_devices), &all);
    if (st == KVP_OK && all)
        KVP_WARN(PFX(x), "listen %s is a wildcard: the data stream listens on every "
                         "interface too", cfg->listen_addr);
    else if (st != KVP_OK)
        KVP_WARN(PFX(x), "listen %s: no local interface carries it (%s): UCX's tcp data port "
                         "listens on every interface", cfg->listen_addr, kvp_status_str(st));
}

static kvp_status_t ucx_open_one(ucx_xport_t *x, const kvp_ucx_config_t *cfg, bool rma,
                                 ucp_context_h *ctx, ucp_worker_h *worker, int *efd)
{
    ucp_config_t *c = NULL;
    kvp__ucx_log_install(); /* UCX's own lines through our (escaped) log */
    ucs_status_t s = ucp_config_read(NULL, NULL, &c);

    if (s != UCS_OK) {
        KVP_ERROR(PFX(x), "ucp_config_read: %s", ucs_status_string(s));
        return KVP_ERR_TRANSPORT;
    }
    kvp_status_t st = ucx_config_apply(x, c, cfg, rma);
    if (st != KVP_OK)
        goto out_config;
    /* The AM context never has UCP_FEATURE_RMA: UCX then installs no
     * software put/get handlers (rma_sw.c) on the worker tcp reaches. */
    ucp_params_t prm = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                        .features = (rma ? UCP_FEATURE_RMA : UCP_FEATURE_AM) | UCP_FEATURE_WAKEUP};
    s = ucp_init(&prm, c, ctx);
    if (s != UCS_OK) {
        KVP_ERROR(PFX(x), "ucp_init (%s): %s", rma ? "RMA" : "AM", ucs_status_string(s));
        st = KVP_ERR_TRANSPORT;
        goto out_config;
    }
    /* SERIALIZED, not SINGLE: the worker is created on the caller's thread
     * and progressed on the node thread; UCX >= 1.18 asserts the owner
     * thread of a SINGLE worker (ucs_async_check_owner_thread) and aborts.
     * Every call still comes from one thread at a time. */
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SERIALIZED};
    s = ucp_worker_create(*ctx, &wp, worker);
    if (s == UCS_OK)
        s = ucp_worker_get_efd(*worker, efd);
    if (s != UCS_OK) {
        KVP_ERROR(PFX(x), "ucp_worker_create/get_efd (%s): %s", rma ? "RMA" : "AM",
                  ucs_status_string(s));
        st = KVP_ERR_TRANSPORT;
    }
out_config:
    ucp_config_release(c);
    return st;
}

kvp_status_t kvp__ucx_ucp_open(ucx_xport_t *x, const kvp_ucx_config_t *cfg)
{
    ucx_pick_net_devices(x, cfg);
    kvp_status_t st = ucx_open_one(x, cfg, true, &x->ctx, &x->worker, &x->efd);
    if (st == KVP_OK)
        st = ucx_open_one(x, cfg, false, &x->ctx_am, &x->worker_am, &x->efd_am);
    if (st != KVP_OK)
        return st;
    /* One fd for the node's loop: readable when either worker has work. */
    x->epfd = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN};
    if (x->epfd < 0 || epoll_ctl(x->epfd, EPOLL_CTL_ADD, x->efd, &ev) != 0 ||
        epoll_ctl(x->epfd, EPOLL_CTL_ADD, x->efd_am, &ev) != 0) {
        KVP_ERROR(PFX(x), "epoll for the UCX workers: %s", strerror(errno));
        return KVP_ERR_TRANSPORT;
    }
    /* The AM authenticator: random per incarnation, never derived from
     * anything public (issue 27; it was a hash of the worker address). */
    if (sodium_init() < 0)
        return KVP_ERR_TRANSPORT;
    do
        randombytes_buf(&x->token, sizeof(x->token));
    while (x->token == 0);
    (void)kvp__ucx_probe_alloc(x); /* without it: no same-host proof (logged) */
    kvp__ucx_exit_open(x);         /* without it: no process-exit proof (logged) */
    kvp__ucx_cma_open(x);          /* issue 29 item 4: direct-cma allowed here? */
    st = kvp__ucx_tcpd_open(x, cfg);
    return st == KVP_OK ? kvp__ucx_am_init(x) : st;
}

void kvp_ucx_config_default(kvp_ucx_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
}

/* A peer's blob parsed and its layout checked against what the session
 * expects (and our block size); refusals logged, rate-limited. */
kvp_status_t kvp__ucx_blob_accept(ucx_xport_t *x, const void *blob, size_t len,
                                  const kvp_layout_t *expect, ucx_blob_view_t *v)
{
    kvp_status_t st = kvp__ucx_blob_view(blob, len, v);
    if (st != KVP_OK) {
        KVP_LOG_RL(&x->rl_blob, kvp_clock_now(x->clock), KVP_LOG_WARN, PFX(x),
                   "peer blob rejected (%zu B): %s", len, kvp_status_str(st));
        return st;
    }
    if (v->layout.num_blocks != expect->num_blocks || v->layout.block_size != expect->block_size ||
        (x->region_kind != REGION_NONE && v->layout.block_size != x->layout.block_size)) {
        KVP_LOG_RL(&x->rl_blob, kvp_clock_now(x->clock), KVP_LOG_WARN, PFX(x),
                   "peer blob layout %ux%u differs from expected %ux%u (local block %u)",
                   v->layout.num_blocks, v->layout.block_size, expect->num_blocks,
                   expect->block_size, x->layout.block_size);
        return KVP_ERR_INCOMPATIBLE;
    }
    return KVP_OK;
}
