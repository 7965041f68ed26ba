/*
 * ucx.c -- the UCX backend of the data transport (see ucx.h, SPEC §6 and
 * UCX-NOTES.md for why each UCX setting is what it is).
 *
 * Objects and ownership:
 *   ucx_xport_t  owns the ucp context/worker, the region registration (and
 *                the region itself when UCX or our mmap allocated it), the
 *                local blob, every peer and the transfer-record pool.
 *   ucx_peer_t   one imported blob: endpoint + unpacked rkey. Allocated at
 *                add_peer, freed only when (a) it was removed, (b) no transfer
 *                record refers to it (refs == 0) and (c) UCX completed the
 *                close of its endpoint. The rkey is destroyed once refs == 0,
 *                before the endpoint close is started.
 *   ucx_xfer_t   one transfer. Lives in the pool; `pending` counts the UCX
 *                requests (puts + flush) that UCX still owns. A record whose
 *                pending > 0 is never returned to the pool: UCX will call
 *                back with it as user_data.
 *
 * Transfer record life (where):
 *   FREE     -> LIVE       write() posted it (on peer->running or peer->done)
 *   LIVE     -> FREE       poll()/cancel() released it once pending == 0
 *   LIVE     -> RETIRED    remove_peer() (x->retired)
 *   RETIRED  -> FREE       poll_retired() once pending == 0
 *   LIVE|RETIRED -> DETACHED  cancel(IMMEDIATE)/force_release while UCX still
 *                          owns requests; the completion callback frees it.
 * A record is "terminal" when pending == 0; its status is decided when it is
 * handed back (poll*), so an endpoint error reported in the same progress
 * call as a flush that "succeeded" still fails it (UCX-NOTES §5).
 */
#include "transport/ucx.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <ucp/api/ucp.h>

#define UCX_BLOB_MAGIC 0x5550564Bu /* "KVPU" little-endian */
#define UCX_BLOB_VERSION 1u
#define UCX_BLOB_HDR 44u
#define UCX_HOST_MAX 256u
#define UCX_ADDR_MAX 8192u
#define UCX_RKEY_MAX 4096u
#define UCX_IDX_BITS 24
#define UCX_IDX_MASK ((1ull << UCX_IDX_BITS) - 1)
#define UCX_PROGRESS_MAX 1024 /* bound of one progress() call */
#define UCX_DEFAULT_ALLOC_PRIO "md:posix,md:sysv,huge,thp,md:*,mmap,heap"

enum { XF_FREE = 0, XF_LIVE, XF_RETIRED, XF_DETACHED };
enum { REGION_NONE = 0, REGION_UCX, REGION_MMAP, REGION_CALLER };

typedef struct ucx_peer ucx_peer_t;

typedef struct ucx_xfer {
    kvp_list_t link;     /* free list, peer->running/done, x->retired, x->detached */
    kvp_xfer_id_t id;
    ucx_peer_t *peer;    /* counted in peer->refs while not FREE */
    struct ucx_xport *x;
    uint32_t pending;    /* UCX requests still owned by UCX */
    uint8_t where;
    ucs_status_t first_err; /* first failed put/flush (or post) */
    uint64_t err_seq;    /* peer->err_seq when posted */
} ucx_xfer_t;

struct ucx_peer {
    kvp_list_t link;     /* x->peers (live), x->zombies (removed), x->closing */
    kvp_list_t running;  /* LIVE records with pending > 0 */
    kvp_list_t done;     /* LIVE records with pending == 0, not yet polled */
    struct ucx_xport *x;
    kvp_xpeer_id_t id;
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    void *close_req;     /* ucp_ep_close_nbx request, owned until complete */
    uint64_t rbase;
    kvp_layout_t layout;
    uint64_t refs;       /* records (LIVE, RETIRED or DETACHED) pointing here */
    uint64_t err_seq;    /* bumped by every endpoint error */
    kvp_status_t status; /* KVP_OK, KVP_ERR_TRANSPORT (ep error), KVP_ERR_CLOSED (fenced) */
    ucs_status_t ep_err;
    kvp_data_path_t path;    /* how OUR puts reach the peer */
    kvp_data_path_t inbound; /* how the peer's puts reach US: decides fence proof */
    bool same_host, removed, rkey_ptr_ok;
    char lanes[192];
};

typedef struct ucx_xport {
    kvp_xport_t base;
    char prefix[64];
    char host_id[UCX_HOST_MAX];
    const kvp_clock_t *clock;
    ucp_context_h ctx;
    ucp_worker_h worker;
    int efd;
    /* region */
    int region_kind;
    void *region;
    size_t region_len;
    kvp_layout_t layout;
    ucp_mem_h memh;
    uint8_t *blob;
    size_t blob_len;
    /* peers */
    kvp_list_t peers, zombies, closing;
    kvp_xpeer_id_t next_peer;
    /* transfers */
    ucx_xfer_t *pool;
    uint32_t pool_cap;
    kvp_list_t free_list, retired, detached;
    uint64_t next_seq;
    kvp_xport_stats_t st;
} ucx_xport_t;

#define PFX(x) ((x)->base.log_prefix)

static ucx_xport_t *ucx_of(kvp_xport_t *x)
{
    return (ucx_xport_t *)x;
}

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

static void ucx_host_id_default(char *buf, size_t cap)
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

static ucx_peer_t *ucx_peer_find(ucx_xport_t *x, kvp_xpeer_id_t id)
{
    kvp_list_t *pos, *tmp;

    kvp_list_foreach_safe(pos, tmp, &x->peers) {
        ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
        if (p->id == id)
            return p;
    }
    return NULL;
}

static ucx_xfer_t *ucx_xfer_find(ucx_xport_t *x, kvp_xfer_id_t id)
{
    uint64_t idx = id & UCX_IDX_MASK;

    if (idx == 0 || idx > x->pool_cap)
        return NULL;
    ucx_xfer_t *r = &x->pool[idx - 1];
    return (r->where != XF_FREE && r->id == id) ? r : NULL;
}

/* --------------------------------------------------------- transfer pool */

static ucx_xfer_t *ucx_xfer_get(ucx_xport_t *x, ucx_peer_t *p)
{
    if (kvp_list_empty(&x->free_list))
        return NULL;
    kvp_list_t *n = x->free_list.next;
    kvp_list_remove(n);
    ucx_xfer_t *r = KVP_CONTAINER_OF(n, ucx_xfer_t, link);
    uint64_t idx = (uint64_t)(r - x->pool) + 1;
    r->id = (++x->next_seq << UCX_IDX_BITS) | idx;
    r->peer = p;
    r->pending = 0;
    r->first_err = UCS_OK;
    r->err_seq = p->err_seq;
    r->where = XF_LIVE;
    p->refs++;
    return r;
}

/* Back to the pool. Only for pending == 0 (UCX owns nothing of it). Never
 * frees the peer here: a peer whose refs drop to 0 is reaped by progress()
 * or by the caller's public function, not inside a UCX callback. */
static void ucx_xfer_put(ucx_xport_t *x, ucx_xfer_t *r)
{
    KVP_ASSERT(r->pending == 0 && r->where != XF_FREE);
    kvp_list_remove(&r->link);
    KVP_ASSERT(r->peer->refs > 0);
    r->peer->refs--;
    r->peer = NULL;
    r->where = XF_FREE;
    r->id = 0;
    kvp_list_insert_tail(&x->free_list, &r->link);
}

/* Status of a terminal record, decided at hand-back time. */
static kvp_status_t ucx_xfer_result(const ucx_xfer_t *r)
{
    if (r->first_err != UCS_OK)
        return KVP_ERR_TRANSPORT;
    if (r->peer->err_seq != r->err_seq)
        return KVP_ERR_TRANSPORT; /* a flush can be "OK" for dropped data */
    return KVP_OK;
}

static void ucx_xfer_count(ucx_xport_t *x, kvp_status_t s)
{
    if (s == KVP_OK)
        x->st.done++;
    else
        x->st.failed++;
}

/* One UCX request (put or flush) of `r` completed. Runs inside
 * ucp_worker_progress (or ucp_ep_close_nbx FORCE) on the owner thread. */
static void ucx_req_cb(void *req, ucs_status_t status, void *user_data)
{
    ucx_xfer_t *r = user_data;

    if (status != UCS_OK && r->first_err == UCS_OK)
        r->first_err = status;
    ucp_request_free(req);
    KVP_ASSERT(r->pending > 0);
    if (--r->pending > 0)
        return;
    if (r->where == XF_LIVE) {
        kvp_list_remove(&r->link);
        kvp_list_insert_tail(&r->peer->done, &r->link);
    } else if (r->where == XF_DETACHED) {
        ucx_xfer_put(r->x, r); /* tracking was released earlier */
    } /* RETIRED stays on x->retired; poll_retired finds pending == 0 */
}

/* Release tracking of `r` now; if UCX still owns requests the record waits
 * as DETACHED for the completion callback. */
static void ucx_xfer_detach(ucx_xport_t *x, ucx_xfer_t *r)
{
    if (r->pending == 0) {
        ucx_xfer_put(x, r);
        return;
    }
    kvp_list_remove(&r->link);
    r->where = XF_DETACHED;
    kvp_list_insert_tail(&x->detached, &r->link);
}

/* ------------------------------------------------------------------ peers */

static void ucx_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    ucx_peer_t *p = arg;

    p->err_seq++;
    if (p->ep_err == UCS_OK) {
        p->ep_err = status;
        KVP_WARN(PFX(p->x), "peer %llu: endpoint error: %s (outcome of its transfers unknown)",
                 (unsigned long long)p->id, ucs_status_string(status));
    }
    if (p->status == KVP_OK)
        p->status = KVP_ERR_TRANSPORT;
}

/* Start closing the endpoint (FORCE when the peer errored or `force`).
 * The rkey goes first: every operation that used it has finished (refs==0)
 * or was cancelled by a FORCE close the caller already did. */
static void ucx_peer_start_close(ucx_xport_t *x, ucx_peer_t *p, bool force)
{
    if (p->rkey) {
        ucp_rkey_destroy(p->rkey);
        p->rkey = NULL;
    }
    if (p->ep) {
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS};
        prm.flags = (force || p->status != KVP_OK) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
        void *req = ucp_ep_close_nbx(p->ep, &prm);
        p->ep = NULL;
        if (UCS_PTR_IS_PTR(req))
            p->close_req = req;
        else if (UCS_PTR_IS_ERR(req))
            KVP_DEBUG(PFX(x), "peer %llu: endpoint close: %s", (unsigned long long)p->id,
                      ucs_status_string(UCS_PTR_STATUS(req)));
    }
    kvp_list_remove(&p->link);
    kvp_list_insert_tail(&x->closing, &p->link);
}

/* Free closing peers whose endpoint close completed. */
static bool ucx_closing_reap(ucx_xport_t *x)
{
    kvp_list_t *pos, *tmp;
    bool any = false;

    kvp_list_foreach_safe(pos, tmp, &x->closing) {
        ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
        if (p->close_req) {
            if (ucp_request_check_status(p->close_req) == UCS_INPROGRESS)
                continue;
            ucp_request_free(p->close_req);
            p->close_req = NULL;
        }
        kvp_list_remove(&p->link);
        kvp__free(p);
        any = true;
    }
    return any;
}

/* Removed peers with no record left: release rkey, close endpoint. */
static bool ucx_zombies_reap(ucx_xport_t *x)
{
    kvp_list_t *pos, *tmp;
    bool any = false;

    kvp_list_foreach_safe(pos, tmp, &x->zombies) {
        ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
        if (p->refs == 0) {
            ucx_peer_start_close(x, p, false);
            any = true;
        }
    }
    return any;
}

/* ------------------------------------------------------- data-path check */

static bool ucx_tl_is_shm(const char *tl)
{
    return !strncmp(tl, "posix", 5) || !strncmp(tl, "sysv", 4) || !strncmp(tl, "xpmem", 5) ||
           !strncmp(tl, "knem", 4) || !strncmp(tl, "cma", 3);
}

static bool ucx_tl_is_rdma(const char *tl)
{
    return !strncmp(tl, "rc", 2) || !strncmp(tl, "dc", 2) || !strncmp(tl, "ud", 2);
}

typedef struct ucx_lane_info {
    char tl[8][40];      /* "posix/memory" per lane index */
    bool am[8], rma[8], ka[8];
} ucx_lane_info_t;

/* Parse ucp_ep_print_info(): "lane[i]: n:tl/dev.k md[..] -> ... am ... keepalive"
 * and "put[i]: ..." (lane i is an RMA lane). */
static void ucx_lanes_parse(char *text, ucx_lane_info_t *li)
{
    char *save = NULL;

    memset(li, 0, sizeof(*li));
    for (char *ln = strtok_r(text, "\n", &save); ln; ln = strtok_r(NULL, "\n", &save)) {
        unsigned i;
        char *s = strstr(ln, "lane[");
        if (s && sscanf(s, "lane[%u]:", &i) == 1 && i < 8) {
            char *c = strchr(s, ':');
            c = c ? strchr(c + 1, ':') : NULL; /* after "n:" */
            if (c && sscanf(c + 1, "%39[^. ]", li->tl[i]) != 1)
                li->tl[i][0] = '\0';
            char *arrow = strstr(s, "->");
            li->am[i] = arrow && strstr(arrow, " am") != NULL;
            li->ka[i] = arrow && strstr(arrow, "keepalive") != NULL;
            continue;
        }
        s = strstr(ln, "put[");
        if (s && sscanf(s, "put[%u]:", &i) == 1 && i < 8)
            li->rma[i] = true;
    }
}

static kvp_data_path_t ucx_path_classify(const ucx_lane_info_t *li, bool rkey_ptr_ok, char *sum,
                                         size_t cap)
{
    kvp_data_path_t path = KVP_PATH_UNKNOWN, am_path = KVP_PATH_UNKNOWN;
    size_t off = 0;

    for (int i = 0; i < 8 && off < cap; i++) {
        if (!li->tl[i][0])
            continue;
        off += (size_t)snprintf(sum + off, cap - off, "%s%s%s%s(%s)", off ? " " : "",
                                li->rma[i] ? "rma" : "", li->am[i] ? (li->rma[i] ? "+am" : "am") : "",
                                li->ka[i] ? "+ka" : "", li->tl[i]);
        if (li->rma[i] && ucx_tl_is_rdma(li->tl[i]))
            path = KVP_PATH_RDMA;
        else if (li->rma[i] && ucx_tl_is_shm(li->tl[i]) && rkey_ptr_ok && path == KVP_PATH_UNKNOWN)
            path = KVP_PATH_DIRECT_SHM;
        if (li->am[i] && am_path == KVP_PATH_UNKNOWN)
            am_path = !strncmp(li->tl[i], "tcp", 3) ? KVP_PATH_TCP
                      : ucx_tl_is_shm(li->tl[i])    ? KVP_PATH_EMULATED_SHM
                      : ucx_tl_is_rdma(li->tl[i])   ? KVP_PATH_RDMA
                                                    : KVP_PATH_UNKNOWN;
    }
    if (off < cap)
        snprintf(sum + off, cap - off, " rkey_ptr=%s", rkey_ptr_ok ? "ok" : "no");
    return path != KVP_PATH_UNKNOWN ? path : am_path; /* else: rma_am over the AM lane */
}

/* Which lanes did UCX select for this endpoint? Logged once per peer. */
static void ucx_peer_classify(ucx_xport_t *x, ucx_peer_t *p)
{
    char *text = NULL;
    size_t tlen = 0;
    void *ptr;
    ucx_lane_info_t li;
    FILE *f = open_memstream(&text, &tlen);

    p->rkey_ptr_ok = ucp_rkey_ptr(p->rkey, p->rbase, &ptr) == UCS_OK;
    if (!f) {
        p->path = p->inbound = KVP_PATH_UNKNOWN;
        snprintf(p->lanes, sizeof(p->lanes), "unknown (open_memstream failed)");
    } else {
        ucp_ep_print_info(p->ep, f);
        fclose(f);
        ucx_lanes_parse(text ? text : (char *)"", &li);
        free(text); /* open_memstream's buffer comes from libc malloc */
        p->path = ucx_path_classify(&li, p->rkey_ptr_ok, p->lanes, sizeof(p->lanes));
        /* The peer's lanes to us mirror ours; whether its puts can be direct
         * depends on OUR region being UCX (shm) allocated. */
        char scratch[sizeof(p->lanes)];
        p->inbound = ucx_path_classify(&li, x->region_kind == REGION_UCX, scratch, sizeof(scratch));
    }
    KVP_INFO(PFX(x), "peer %llu: data path %s [%s]%s", (unsigned long long)p->id,
             kvp_data_path_str(p->path), p->lanes, p->same_host ? " (same host)" : "");
    if (p->same_host && p->path == KVP_PATH_TCP)
        KVP_WARN(PFX(x), "peer %llu is on THIS host but its data path is tcp (%s): shared "
                 "memory unavailable (UCX_TLS, shm error handling or /dev/shm size); "
                 "expect ~20-40x lower bandwidth",
                 (unsigned long long)p->id, p->lanes);
    else if (p->same_host && p->path == KVP_PATH_EMULATED_SHM)
        KVP_WARN(PFX(x), "peer %llu: same-host puts are emulated over shm active messages "
                 "(region not UCX-allocated?) [%s]", (unsigned long long)p->id, p->lanes);
}

/* ------------------------------------------------------------ blob codec */

typedef struct ucx_blob_view {
    uint32_t flags;
    kvp_layout_t layout;
    uint64_t base, len;
    const uint8_t *host, *addr, *rkey;
    size_t host_len, addr_len, rkey_len;
} ucx_blob_view_t;

static kvp_status_t ucx_blob_parse(const uint8_t *b, size_t len, ucx_blob_view_t *v)
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
    if (v->host_len > UCX_HOST_MAX || v->addr_len == 0 || v->addr_len > UCX_ADDR_MAX ||
        v->rkey_len == 0 || v->rkey_len > UCX_RKEY_MAX || le_get(b + 42, 2) != 0)
        return KVP_ERR_PROTO;
    size_t need = UCX_BLOB_HDR + v->host_len + v->addr_len + v->rkey_len;
    if (len < need)
        return KVP_ERR_TRUNCATED;
    if (len != need)
        return KVP_ERR_PROTO;
    uint64_t span = (uint64_t)v->layout.num_blocks * v->layout.block_size;
    if (v->layout.num_blocks == 0 || v->layout.block_size == 0 || span > v->len ||
        v->base + v->len < v->base || v->base == 0)
        return KVP_ERR_PROTO;
    v->host = b + UCX_BLOB_HDR;
    v->addr = v->host + v->host_len;
    v->rkey = v->addr + v->addr_len;
    return KVP_OK;
}

static kvp_status_t ucx_blob_build(ucx_xport_t *x, const void *addr, size_t addr_len,
                                   const void *rkey, size_t rkey_len)
{
    size_t host_len = strlen(x->host_id);
    size_t len = UCX_BLOB_HDR + host_len + addr_len + rkey_len;

    if (addr_len > UCX_ADDR_MAX || rkey_len > UCX_RKEY_MAX || len > KVP_UCX_BLOB_MAX) {
        KVP_ERROR(PFX(x), "blob too large (address %zu B, rkey %zu B)", addr_len, rkey_len);
        return KVP_ERR_LIMIT;
    }
    uint8_t *b = kvp__calloc(1, len);
    if (!b)
        return KVP_ERR_NOMEM;
    le_put(b, UCX_BLOB_MAGIC, 4);
    le_put(b + 4, UCX_BLOB_VERSION, 2);
    le_put(b + 6, x->region_kind == REGION_UCX ? 1 : 0, 2);
    le_put(b + 8, x->layout.num_blocks, 4);
    le_put(b + 12, x->layout.block_size, 4);
    le_put(b + 16, (uintptr_t)x->region, 8);
    le_put(b + 24, x->region_len, 8);
    le_put(b + 32, (uint64_t)getpid(), 4);
    le_put(b + 36, host_len, 2);
    le_put(b + 38, addr_len, 2);
    le_put(b + 40, rkey_len, 2);
    memcpy(b + UCX_BLOB_HDR, x->host_id, host_len);
    memcpy(b + UCX_BLOB_HDR + host_len, addr, addr_len);
    memcpy(b + UCX_BLOB_HDR + host_len + addr_len, rkey, rkey_len);
    x->blob = b;
    x->blob_len = len;
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
    if (ucx_mem_map(x, NULL, len, true) == KVP_OK) {
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
    KVP_WARN(PFX(x), "UCX could not allocate the %zu B region (posix/sysv shm, e.g. /dev/shm "
             "too small): using anonymous memory; same-host puts INTO this node will be "
             "EMULATED (consumer CPU, ~2x slower, and no direct shared memory)", len);
    return KVP_OK;
}

static void ucx_region_release(ucx_xport_t *x)
{
    if (x->memh)
        ucp_mem_unmap(x->ctx, x->memh); /* frees UCX-allocated memory too */
    if (x->region_kind == REGION_MMAP)
        munmap(x->region, x->region_len);
    x->memh = NULL;
    x->region = NULL;
    x->region_kind = REGION_NONE;
}

static kvp_status_t ucx_register_region(kvp_xport_t *xp, void *base, size_t len,
                                        const kvp_layout_t *layout, void **base_out)
{
    ucx_xport_t *x = ucx_of(xp);
    void *rkey = NULL;
    size_t rkey_len = 0;
    ucp_address_t *addr = NULL;
    size_t addr_len = 0;
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
    if (ucp_rkey_pack(x->ctx, x->memh, &rkey, &rkey_len) != UCS_OK ||
        ucp_worker_get_address(x->worker, &addr, &addr_len) != UCS_OK) {
        KVP_ERROR(PFX(x), "ucp_rkey_pack/ucp_worker_get_address failed");
        st = KVP_ERR_TRANSPORT;
        goto err_release;
    }
    st = ucx_blob_build(x, addr, addr_len, rkey, rkey_len);
    if (st != KVP_OK)
        goto err_release;
    ucp_worker_release_address(x->worker, addr);
    ucp_rkey_buffer_release(rkey);
    KVP_INFO(PFX(x), "region %zu B at %p (%s), blob %zu B", len, x->region,
             x->region_kind == REGION_UCX    ? "UCX-allocated"
             : x->region_kind == REGION_MMAP ? "anonymous mmap"
                                             : "caller memory",
             x->blob_len);
    *base_out = x->region;
    return KVP_OK;

err_release:
    if (addr)
        ucp_worker_release_address(x->worker, addr);
    if (rkey)
        ucp_rkey_buffer_release(rkey);
    ucx_region_release(x);
    return st;
}

static kvp_status_t ucx_local_blob(kvp_xport_t *xp, const void **blob, size_t *len)
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

/* -------------------------------------------------------------- add_peer */

static kvp_status_t ucx_peer_connect(ucx_xport_t *x, ucx_peer_t *p, const ucx_blob_view_t *v)
{
    /* copies: UCX may expect natural alignment of its address/rkey buffers */
    uint8_t *tmp = kvp__malloc(v->addr_len + v->rkey_len);
    ucs_status_t s;

    if (!tmp)
        return KVP_ERR_NOMEM;
    memcpy(tmp, v->addr, v->addr_len);
    memcpy(tmp + v->addr_len, v->rkey, v->rkey_len);
    ucp_ep_params_t ep = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = (const ucp_address_t *)tmp,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = ucx_ep_err_cb, .arg = p},
    };
    s = ucp_ep_create(x->worker, &ep, &p->ep);
    if (s != UCS_OK) {
        KVP_ERROR(PFX(x), "peer blob: ucp_ep_create: %s", ucs_status_string(s));
        kvp__free(tmp);
        return KVP_ERR_TRANSPORT;
    }
    s = ucp_ep_rkey_unpack(p->ep, tmp + v->addr_len, &p->rkey);
    kvp__free(tmp);
    if (s != UCS_OK) {
        KVP_ERROR(PFX(x), "peer blob: ucp_ep_rkey_unpack: %s", ucs_status_string(s));
        ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                                   .flags = UCP_EP_CLOSE_FLAG_FORCE};
        void *req = ucp_ep_close_nbx(p->ep, &prm);
        while (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS)
            ucp_worker_progress(x->worker); /* FORCE close: local, completes at once */
        if (UCS_PTR_IS_PTR(req))
            ucp_request_free(req);
        p->ep = NULL;
        return KVP_ERR_PROTO;
    }
    return KVP_OK;
}

static kvp_status_t ucx_add_peer(kvp_xport_t *xp, const void *blob, size_t len,
                                 const kvp_layout_t *expect, kvp_xpeer_id_t *out)
{
    ucx_xport_t *x = ucx_of(xp);
    ucx_blob_view_t v;
    kvp_status_t st;

    if (!expect || !out)
        return KVP_ERR_INVALID;
    st = ucx_blob_parse(blob, len, &v);
    if (st != KVP_OK) {
        KVP_WARN(PFX(x), "peer blob rejected (%zu B): %s", len, kvp_status_str(st));
        return st;
    }
    if (v.layout.num_blocks != expect->num_blocks || v.layout.block_size != expect->block_size ||
        (x->region_kind != REGION_NONE && v.layout.block_size != x->layout.block_size)) {
        KVP_WARN(PFX(x), "peer blob layout %ux%u differs from expected %ux%u (local block %u)",
                 v.layout.num_blocks, v.layout.block_size, expect->num_blocks,
                 expect->block_size, x->layout.block_size);
        return KVP_ERR_INCOMPATIBLE;
    }
    ucx_peer_t *p = kvp__calloc(1, sizeof(*p));
    if (!p)
        return KVP_ERR_NOMEM;
    p->x = x;
    kvp_list_init(&p->link);
    kvp_list_init(&p->running);
    kvp_list_init(&p->done);
    p->rbase = v.base;
    p->layout = v.layout;
    p->same_host = v.host_len == strlen(x->host_id) && !memcmp(v.host, x->host_id, v.host_len);
    st = ucx_peer_connect(x, p, &v);
    if (st != KVP_OK) {
        kvp__free(p);
        return st;
    }
    p->id = ++x->next_peer;
    kvp_list_insert_tail(&x->peers, &p->link);
    ucx_peer_classify(x, p);
    *out = p->id;
    return KVP_OK;
}

/* ----------------------------------------------------------------- write */

static kvp_status_t ucx_write_check(ucx_xport_t *x, const ucx_peer_t *p,
                                    const kvp_xfer_block_t *blocks, size_t n)
{
    if (x->region_kind == REGION_NONE)
        return KVP_ERR_STATE;
    if (p->status != KVP_OK || !p->ep)
        return p->status != KVP_OK ? p->status : KVP_ERR_CLOSED;
    if (p->layout.block_size != x->layout.block_size)
        return KVP_ERR_INCOMPATIBLE;
    for (size_t i = 0; i < n; i++)
        if (blocks[i].src_slot >= x->layout.num_blocks ||
            blocks[i].dst_slot >= p->layout.num_blocks)
            return KVP_ERR_INVALID;
    return KVP_OK;
}

/* Post one request for r; false when UCX refused it (r->first_err set). */
static bool ucx_post_done(ucx_xfer_t *r, ucs_status_ptr_t sp)
{
    if (UCS_PTR_IS_PTR(sp)) {
        r->pending++;
        return true;
    }
    if (UCS_PTR_IS_ERR(sp)) {
        if (r->first_err == UCS_OK)
            r->first_err = UCS_PTR_STATUS(sp);
        return false;
    }
    return true; /* completed in place (direct shm put) */
}

static kvp_status_t ucx_write(kvp_xport_t *xp, kvp_xpeer_id_t peer, const kvp_xfer_block_t *blocks,
                              size_t n, kvp_xfer_id_t *out)
{
    ucx_xport_t *x = ucx_of(xp);
    ucx_peer_t *p = ucx_peer_find(x, peer);
    size_t posted = 0;

    if (!blocks || n == 0 || !out)
        return KVP_ERR_INVALID;
    if (!p)
        return KVP_ERR_NOT_FOUND;
    kvp_status_t st = ucx_write_check(x, p, blocks, n);
    if (st != KVP_OK)
        return st;
    ucx_xfer_t *r = ucx_xfer_get(x, p);
    if (!r)
        return KVP_ERR_LIMIT;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
                               .cb.send = ucx_req_cb,
                               .user_data = r};
    const size_t bs = x->layout.block_size;
    for (size_t i = 0; i < n;) {
        size_t run = 1; /* coalesce adjacent (src, dst) slots into one put */
        while (i + run < n && blocks[i + run].src_slot == blocks[i].src_slot + run &&
               blocks[i + run].dst_slot == blocks[i].dst_slot + run)
            run++;
        const uint8_t *src = (const uint8_t *)x->region + (size_t)blocks[i].src_slot * bs;
        uint64_t dst = p->rbase + (uint64_t)blocks[i].dst_slot * bs;
        if (!ucx_post_done(r, ucp_put_nbx(p->ep, src, run * bs, dst, p->rkey, &prm)))
            break;
        posted++;
        i += run;
    }
    if (posted == 0) { /* nothing reached UCX: the caller may treat it as never posted */
        KVP_WARN(PFX(x), "peer %llu: put refused: %s", (unsigned long long)peer,
                 ucs_status_string(r->first_err));
        ucx_xfer_put(x, r);
        return KVP_ERR_TRANSPORT;
    }
    /* Something was posted: the transfer exists; a later refusal makes it FAILED. */
    ucx_post_done(r, ucp_ep_flush_nbx(p->ep, &prm));
    kvp_list_insert_tail(r->pending ? &p->running : &p->done, &r->link);
    x->st.writes++;
    x->st.blocks_written += n;
    x->st.bytes_written += (uint64_t)n * bs;
    *out = r->id;
    return KVP_OK;
}

/* ------------------------------------------------------ poll and cancel */

static kvp_status_t ucx_poll(kvp_xport_t *xp, kvp_xpeer_id_t peer, kvp_xfer_result_t *out,
                             size_t cap, size_t *n_out)
{
    ucx_xport_t *x = ucx_of(xp);
    ucx_peer_t *p = ucx_peer_find(x, peer);
    kvp_list_t *pos, *tmp;
    size_t n = 0;

    if (!n_out || (cap && !out))
        return KVP_ERR_INVALID;
    if (!p)
        return KVP_ERR_NOT_FOUND;
    kvp_list_foreach_safe(pos, tmp, &p->done) {
        if (n == cap)
            break;
        ucx_xfer_t *r = KVP_CONTAINER_OF(pos, ucx_xfer_t, link);
        out[n].id = r->id;
        out[n].status = ucx_xfer_result(r);
        ucx_xfer_count(x, out[n].status);
        n++;
        ucx_xfer_put(x, r);
    }
    *n_out = n;
    return KVP_OK;
}

static kvp_status_t ucx_cancel(kvp_xport_t *xp, const kvp_xfer_id_t *ids, size_t n,
                               kvp_cancel_mode_t mode, kvp_xfer_id_t *still_running,
                               size_t *n_running)
{
    ucx_xport_t *x = ucx_of(xp);
    size_t nr = 0;

    if ((n && !ids) || (mode == KVP_CANCEL_WAIT && (!n_running || (n && !still_running))))
        return KVP_ERR_INVALID;
    for (size_t i = 0; i < n; i++) { /* all-or-nothing: validate first */
        ucx_xfer_t *r = ucx_xfer_find(x, ids[i]);
        if (!r || r->where != XF_LIVE)
            return KVP_ERR_NOT_FOUND;
    }
    for (size_t i = 0; i < n; i++) {
        ucx_xfer_t *r = ucx_xfer_find(x, ids[i]);
        if (!r)
            continue; /* duplicate id, already released */
        if (r->pending == 0) {
            ucx_xfer_count(x, ucx_xfer_result(r));
            ucx_xfer_put(x, r);
        } else if (mode == KVP_CANCEL_WAIT) {
            still_running[nr++] = r->id; /* stays tracked: UCX still owns requests */
        } else {
            ucx_xfer_detach(x, r); /* the WRITE may go on; the callback frees it */
        }
    }
    if (n_running)
        *n_running = nr;
    return KVP_OK;
}

/* -------------------------------------------------- removal and retirement */

static void ucx_retire_list(ucx_xport_t *x, kvp_list_t *l)
{
    while (!kvp_list_empty(l)) {
        ucx_xfer_t *r = KVP_CONTAINER_OF(l->next, ucx_xfer_t, link);
        kvp_list_remove(&r->link);
        r->where = XF_RETIRED;
        kvp_list_insert_tail(&x->retired, &r->link);
    }
}

/* An errored or fenced endpoint cannot complete anything normally any more:
 * FORCE-close it so UCX completes (cancels) what it still owns. */
static void ucx_peer_force_ep(ucx_xport_t *x, ucx_peer_t *p)
{
    if (!p->ep)
        return;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *req = ucp_ep_close_nbx(p->ep, &prm);
    p->ep = NULL;
    /* FORCE completes locally; give UCX a bounded number of turns. */
    for (int i = 0; UCS_PTR_IS_PTR(req) && i < 100000 &&
                    ucp_request_check_status(req) == UCS_INPROGRESS; i++)
        ucp_worker_progress(x->worker);
    if (UCS_PTR_IS_PTR(req)) {
        if (ucp_request_check_status(req) == UCS_INPROGRESS)
            p->close_req = req; /* reaped with the peer */
        else
            ucp_request_free(req);
    }
}

static kvp_status_t ucx_remove_peer(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    ucx_xport_t *x = ucx_of(xp);
    ucx_peer_t *p = ucx_peer_find(x, peer);

    if (!p)
        return KVP_ERR_NOT_FOUND;
    ucx_retire_list(x, &p->running);
    ucx_retire_list(x, &p->done);
    p->removed = true;
    kvp_list_remove(&p->link);
    kvp_list_insert_tail(&x->zombies, &p->link);
    if (p->status != KVP_OK)
        ucx_peer_force_ep(x, p); /* errored: have UCX finish its requests now */
    ucx_zombies_reap(x);
    ucx_closing_reap(x);
    return KVP_OK;
}

static kvp_status_t ucx_poll_retired(kvp_xport_t *xp, kvp_xfer_result_t *out, size_t cap,
                                     size_t *n_out)
{
    ucx_xport_t *x = ucx_of(xp);
    kvp_list_t *pos, *tmp;
    size_t n = 0;

    if (!n_out || (cap && !out))
        return KVP_ERR_INVALID;
    kvp_list_foreach_safe(pos, tmp, &x->retired) {
        if (n == cap)
            break;
        ucx_xfer_t *r = KVP_CONTAINER_OF(pos, ucx_xfer_t, link);
        if (r->pending)
            continue;
        out[n].id = r->id;
        out[n].status = ucx_xfer_result(r);
        ucx_xfer_count(x, out[n].status);
        n++;
        ucx_xfer_put(x, r);
    }
    ucx_zombies_reap(x);
    *n_out = n;
    return KVP_OK;
}

static kvp_status_t ucx_force_release_retired(kvp_xport_t *xp, const kvp_xfer_id_t *ids, size_t n)
{
    ucx_xport_t *x = ucx_of(xp);

    if (n && !ids)
        return KVP_ERR_INVALID;
    for (size_t i = 0; i < n; i++) {
        ucx_xfer_t *r = ucx_xfer_find(x, ids[i]);
        if (!r || r->where != XF_RETIRED)
            return KVP_ERR_NOT_FOUND;
    }
    for (size_t i = 0; i < n; i++) {
        ucx_xfer_t *r = ucx_xfer_find(x, ids[i]);
        if (!r)
            continue;
        KVP_ERROR(PFX(x), "transfer %llu (peer %llu) force-released with %u UCX request(s) "
                  "outstanding: its WRITE may still land", (unsigned long long)r->id,
                  (unsigned long long)r->peer->id, r->pending);
        x->st.force_released++;
        ucx_xfer_detach(x, r);
    }
    ucx_zombies_reap(x);
    return KVP_OK;
}

/* ------------------------------------------------------- fence and status */

static kvp_status_t ucx_fence_peer(kvp_xport_t *xp, kvp_xpeer_id_t peer, bool *proof)
{
    ucx_xport_t *x = ucx_of(xp);
    ucx_peer_t *p = ucx_peer_find(x, peer);

    if (!proof)
        return KVP_ERR_INVALID;
    if (!p)
        return KVP_ERR_NOT_FOUND;
    ucx_peer_force_ep(x, p);
    if (p->status == KVP_OK)
        p->status = KVP_ERR_CLOSED;
    /* Emulated puts INTO us are landed by OUR progress and dropped once our
     * PEER endpoint id is gone (UCX-NOTES §5): a completed FORCE close is
     * proof. Direct shm (and RDMA) puts never involve us: no proof. */
    bool fenceable = p->inbound == KVP_PATH_TCP || p->inbound == KVP_PATH_EMULATED_SHM;
    *proof = fenceable && p->close_req == NULL; /* close completed */
    KVP_INFO(PFX(x), "peer %llu fenced (its puts to us: %s): %s", (unsigned long long)peer,
             kvp_data_path_str(p->inbound), *proof ? "no later write can land" : "NOT a proof");
    return KVP_OK;
}

static kvp_status_t ucx_peer_status(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    ucx_peer_t *p = ucx_peer_find(ucx_of(xp), peer);

    return p ? p->status : KVP_ERR_NOT_FOUND;
}

static kvp_data_path_t ucx_peer_path(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    ucx_peer_t *p = ucx_peer_find(ucx_of(xp), peer);

    return p ? p->path : KVP_PATH_UNKNOWN;
}

/* ------------------------------------------------------------- progress */

static bool ucx_progress(kvp_xport_t *xp)
{
    ucx_xport_t *x = ucx_of(xp);
    bool any = false;

    for (int i = 0; i < UCX_PROGRESS_MAX && ucp_worker_progress(x->worker); i++)
        any = true;
    any |= ucx_zombies_reap(x);
    any |= ucx_closing_reap(x);
    return any;
}

static int ucx_event_fd(kvp_xport_t *xp)
{
    return ucx_of(xp)->efd;
}

static kvp_status_t ucx_arm(kvp_xport_t *xp)
{
    ucs_status_t s = ucp_worker_arm(ucx_of(xp)->worker);

    return s == UCS_OK ? KVP_OK : s == UCS_ERR_BUSY ? KVP_ERR_BUSY : KVP_ERR_TRANSPORT;
}

static uint64_t ucx_list_len(const kvp_list_t *l)
{
    uint64_t n = 0;

    for (const kvp_list_t *p = l->next; p != l; p = p->next)
        n++;
    return n;
}

static void ucx_get_stats(kvp_xport_t *xp, kvp_xport_stats_t *st)
{
    ucx_xport_t *x = ucx_of(xp);
    kvp_list_t *pos, *tmp;

    *st = x->st;
    st->inflight = st->peers = 0;
    kvp_list_foreach_safe(pos, tmp, &x->peers) {
        ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
        st->peers++;
        st->inflight += ucx_list_len(&p->running) + ucx_list_len(&p->done);
    }
    st->retired = ucx_list_len(&x->retired);
    st->zombie_peers = ucx_list_len(&x->zombies) + ucx_list_len(&x->closing);
}

/* ---------------------------------------------------------------- close */

static bool ucx_busy(ucx_xport_t *x)
{
    kvp_list_t *pos, *tmp;

    if (!kvp_list_empty(&x->retired) || !kvp_list_empty(&x->detached))
        return true;
    kvp_list_foreach_safe(pos, tmp, &x->peers) {
        ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
        if (!kvp_list_empty(&p->running) || !kvp_list_empty(&p->done))
            return true;
    }
    return false;
}

/* Tear down every endpoint; FORCE makes UCX cancel what it still owns. */
static void ucx_close_all_peers(ucx_xport_t *x, bool force)
{
    kvp_list_t *pos, *tmp;

    kvp_list_foreach_safe(pos, tmp, &x->peers) {
        ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
        ucx_retire_list(x, &p->running);
        ucx_retire_list(x, &p->done);
        kvp_list_remove(&p->link);
        kvp_list_insert_tail(&x->zombies, &p->link);
    }
    kvp_list_foreach_safe(pos, tmp, &x->zombies) {
        ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
        if (force)
            ucx_peer_force_ep(x, p);
    }
    /* Every record is terminal now (FORCE cancelled the rest) or UCX never
     * called back; either way no one will hand them back any more. */
    uint64_t deadline = kvp_clock_now(x->clock) + 2 * KVP_NSEC_PER_SEC;
    while (!kvp_list_empty(&x->zombies) || !kvp_list_empty(&x->closing)) {
        kvp_list_foreach_safe(pos, tmp, &x->retired) {
            ucx_xfer_t *r = KVP_CONTAINER_OF(pos, ucx_xfer_t, link);
            ucx_xfer_detach(x, r);
        }
        ucx_progress(&x->base);
        if (kvp_clock_now(x->clock) > deadline)
            break;
    }
}

static void ucx_destroy(ucx_xport_t *x)
{
    kvp_list_t *pos, *tmp;

    kvp_list_foreach_safe(pos, tmp, &x->closing) { /* past the deadline: give up */
        ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
        if (p->close_req)
            ucp_request_free(p->close_req);
        kvp_list_remove(&p->link);
        kvp__free(p);
    }
    kvp_list_foreach_safe(pos, tmp, &x->zombies) {
        ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
        KVP_ERROR(PFX(x), "peer %llu: endpoint still referenced at close; leaking it to UCX",
                  (unsigned long long)p->id);
        if (p->rkey)
            ucp_rkey_destroy(p->rkey);
        kvp_list_remove(&p->link);
        kvp__free(p);
    }
    if (x->blob)
        kvp__free(x->blob);
    ucx_region_release(x);
    if (x->worker)
        ucp_worker_destroy(x->worker);
    if (x->ctx)
        ucp_cleanup(x->ctx);
    kvp__free(x->pool); /* after the worker: no callback can name a record now */
    kvp__free(x);
}

static kvp_status_t ucx_close(kvp_xport_t *xp, bool force)
{
    ucx_xport_t *x = ucx_of(xp);

    if (!force && ucx_busy(x))
        return KVP_ERR_BUSY;
    if (force && ucx_busy(x))
        KVP_WARN(PFX(x), "forced close with transfers in flight or retired");
    ucx_close_all_peers(x, force);
    ucx_destroy(x);
    return KVP_OK;
}

/* ---------------------------------------------------------------- create */

typedef struct ucx_kv {
    const char *k, *v;
} ucx_kv_t;

/* Which keys need ucp_config_modify; UCX_* environment values stay unless a
 * config field overrides them. Fills kv[4]; returns the effective TLS. */
static const char *ucx_config_keys(const kvp_ucx_config_t *cfg, ucx_kv_t kv[4])
{
    const char *tls = cfg->tls ? cfg->tls : getenv("UCX_TLS");
    const char *ka = cfg->keepalive_interval ? cfg->keepalive_interval
                     : getenv("UCX_KEEPALIVE_INTERVAL") ? NULL
                                                         : "1s";
    const char *ap = cfg->alloc_prio ? cfg->alloc_prio
                     : getenv("UCX_ALLOC_PRIO") ? NULL
                                                : UCX_DEFAULT_ALLOC_PRIO;
    /* MM_ERROR_HANDLING is the 1.13 key that keeps shm for PEER endpoints;
     * without any shm transport UCX rejects it with a warning, so skip. */
    bool shm = !tls || tls[0] == '^' || strstr(tls, "sm") || strstr(tls, "posix") ||
               strstr(tls, "sysv") || strstr(tls, "mm") || strstr(tls, "all");

    kv[0] = (ucx_kv_t){"TLS", cfg->tls};
    kv[1] = (ucx_kv_t){"MM_ERROR_HANDLING", shm ? "y" : NULL};
    kv[2] = (ucx_kv_t){"KEEPALIVE_INTERVAL", ka};
    kv[3] = (ucx_kv_t){"ALLOC_PRIO", ap};
    return tls;
}

void kvp_ucx_config_each(const kvp_ucx_config_t *cfg,
                         void (*set)(const char *key, const char *value, void *arg), void *arg)
{
    ucx_kv_t kv[4];
    kvp_ucx_config_t def;

    if (!cfg) {
        kvp_ucx_config_default(&def);
        cfg = &def;
    }
    ucx_config_keys(cfg, kv);
    for (size_t i = 0; i < KVP_ARRAY_SIZE(kv); i++)
        if (kv[i].v)
            set(kv[i].k, kv[i].v, arg);
}

static kvp_status_t ucx_config_apply(ucx_xport_t *x, ucp_config_t *c, const kvp_ucx_config_t *cfg)
{
    ucx_kv_t kv[4];
    const char *tls = ucx_config_keys(cfg, kv);

    for (size_t i = 0; i < KVP_ARRAY_SIZE(kv); i++) {
        if (!kv[i].v)
            continue;
        ucs_status_t s = ucp_config_modify(c, kv[i].k, kv[i].v);
        if (s != UCS_OK) {
            KVP_ERROR(PFX(x), "ucp_config_modify(%s=%s): %s", kv[i].k, kv[i].v,
                      ucs_status_string(s));
            return KVP_ERR_INVALID;
        }
    }
    KVP_INFO(PFX(x), "UCX %s: TLS=%s MM_ERROR_HANDLING=%s KEEPALIVE_INTERVAL=%s ALLOC_PRIO=%s",
             ucp_get_version_string(), tls ? tls : "(default)", kv[1].v ? "y" : "(no shm)",
             kv[2].v ? kv[2].v : "(env)", kv[3].v ? kv[3].v : "(env)");
    return KVP_OK;
}

static kvp_status_t ucx_ucp_open(ucx_xport_t *x, const kvp_ucx_config_t *cfg)
{
    ucp_config_t *c = NULL;
    ucs_status_t s = ucp_config_read(NULL, NULL, &c);

    if (s != UCS_OK) {
        KVP_ERROR(PFX(x), "ucp_config_read: %s", ucs_status_string(s));
        return KVP_ERR_TRANSPORT;
    }
    kvp_status_t st = ucx_config_apply(x, c, cfg);
    if (st != KVP_OK)
        goto out_config;
    ucp_params_t prm = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                        .features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP};
    s = ucp_init(&prm, c, &x->ctx);
    if (s != UCS_OK) {
        KVP_ERROR(PFX(x), "ucp_init: %s", ucs_status_string(s));
        st = KVP_ERR_TRANSPORT;
        goto out_config;
    }
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    s = ucp_worker_create(x->ctx, &wp, &x->worker);
    if (s == UCS_OK)
        s = ucp_worker_get_efd(x->worker, &x->efd);
    if (s != UCS_OK) {
        KVP_ERROR(PFX(x), "ucp_worker_create/get_efd: %s", ucs_status_string(s));
        st = KVP_ERR_TRANSPORT;
    }
out_config:
    ucp_config_release(c);
    return st;
}

void kvp_ucx_config_default(kvp_ucx_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
}

kvp_status_t kvp_ucx_xport_create(const kvp_ucx_config_t *cfg, kvp_xport_t **out)
{
    kvp_ucx_config_t def;

    if (!out)
        return KVP_ERR_INVALID;
    if (!cfg) {
        kvp_ucx_config_default(&def);
        cfg = &def;
    }
    uint32_t cap = cfg->max_transfers ? cfg->max_transfers : 4096;
    if (cap > UCX_IDX_MASK)
        return KVP_ERR_INVALID;
    ucx_xport_t *x = kvp__calloc(1, sizeof(*x));
    if (!x)
        return KVP_ERR_NOMEM;
    x->base.ops = &kvp_ucx_xport_ops;
    snprintf(x->prefix, sizeof(x->prefix), "%s", cfg->log_prefix ? cfg->log_prefix : "ucx");
    x->base.log_prefix = x->prefix;
    x->clock = cfg->clock ? cfg->clock : kvp_clock_real();
    x->efd = -1;
    if (cfg->host_id)
        snprintf(x->host_id, sizeof(x->host_id), "%s", cfg->host_id);
    else
        ucx_host_id_default(x->host_id, sizeof(x->host_id));
    kvp_list_init(&x->peers);
    kvp_list_init(&x->zombies);
    kvp_list_init(&x->closing);
    kvp_list_init(&x->free_list);
    kvp_list_init(&x->retired);
    kvp_list_init(&x->detached);
    x->pool = kvp__calloc(cap, sizeof(*x->pool));
    if (!x->pool) {
        kvp__free(x);
        return KVP_ERR_NOMEM;
    }
    x->pool_cap = cap;
    for (uint32_t i = 0; i < cap; i++) {
        x->pool[i].x = x;
        kvp_list_insert_tail(&x->free_list, &x->pool[i].link);
    }
    kvp_status_t st = ucx_ucp_open(x, cfg);
    if (st != KVP_OK) {
        ucx_destroy(x);
        return st;
    }
    *out = &x->base;
    return KVP_OK;
}

/* ---------------------------------------------------------- introspection */

kvp_status_t kvp_ucx_blob_parse(const void *blob, size_t len, kvp_ucx_blob_parts_t *out)
{
    ucx_blob_view_t v;
    kvp_status_t st;

    if (!out)
        return KVP_ERR_INVALID;
    st = ucx_blob_parse(blob, len, &v);
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
    return KVP_OK;
}

bool kvp_ucx_peer_same_host(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    ucx_peer_t *p = ucx_peer_find(ucx_of(xp), peer);

    return p && p->same_host;
}

kvp_status_t kvp_ucx_peer_lanes(kvp_xport_t *xp, kvp_xpeer_id_t peer, char *buf, size_t cap)
{
    ucx_peer_t *p = ucx_peer_find(ucx_of(xp), peer);

    if (!p)
        return KVP_ERR_NOT_FOUND;
    if (cap)
        snprintf(buf, cap, "%s", p->lanes);
    return KVP_OK;
}

bool kvp_ucx_region_ucx_allocated(kvp_xport_t *xp)
{
    return ucx_of(xp)->region_kind == REGION_UCX;
}

const kvp_xport_ops_t kvp_ucx_xport_ops = {
    .name = "ucx",
    .caps = KVP_XPORT_CAP_ALLOCATES_REGION | KVP_XPORT_CAP_FENCE | KVP_XPORT_CAP_EVENT_FD,
    .register_region = ucx_register_region,
    .local_blob = ucx_local_blob,
    .add_peer = ucx_add_peer,
    .write = ucx_write,
    .poll = ucx_poll,
    .cancel = ucx_cancel,
    .remove_peer = ucx_remove_peer,
    .poll_retired = ucx_poll_retired,
    .force_release_retired = ucx_force_release_retired,
    .fence_peer = ucx_fence_peer,
    .peer_status = ucx_peer_status,
    .peer_path = ucx_peer_path,
    .progress = ucx_progress,
    .event_fd = ucx_event_fd,
    .arm = ucx_arm,
    .get_stats = ucx_get_stats,
    .close = ucx_close,
};
