/*
 * ucx.h -- the UCX backend of the data transport (SPEC §6), behind the ops
 * table of transport.h.
 *
 * What it does (UCX 1.13.1, see UCX-NOTES.md for the measurements):
 *   - two ucp contexts + workers (UCS_THREAD_MODE_SERIALIZED: created on one
 *     thread, progressed on another): RMA+WAKEUP limited to shm/RDMA
 *     transports (never tcp), holding the region; AM+WAKEUP without RMA for
 *     kvpeer's AM path (issue 27: no software put/get reachable); UCX settings
 *     come from ucp_config_read (so UCX_* environment variables still apply,
 *     e.g. UCX_TLS=tcp) and ucp_config_modify for what kvpeer needs:
 *     MM_ERROR_HANDLING=y, KEEPALIVE_INTERVAL, ALLOC_PRIO (posix first),
 *     ZCOPY_THRESH=inf (see ucx_setup.c);
 *   - register_region(NULL) allocates the region with UCP_MEM_MAP_ALLOCATE so
 *     that same-host puts are direct shared-memory writes; it falls back to an
 *     anonymous mmap (loud warning: same-host puts will be emulated);
 *   - every endpoint is UCP_ERR_HANDLING_MODE_PEER; an error on it is kept as
 *     that peer's status ("outcome unknown" for everything it carried);
 *   - write() bounds-checks every index against both layouts before posting.
 *     Direct shm: adjacent (src,dst) runs coalesced into one ucp_put_nbx
 *     each. Every other path (tcp, shm into memory UCX did not allocate):
 *     kvpeer's own active messages, one eager ucp_am_send_nbx per block
 *     (ucx_am.c; UCX never emulates a put). Then ucp_ep_flush_nbx. DONE = all
 *     sends and the flush completed OK and no endpoint error was reported
 *     since the transfer was posted (on the AM path that is local: the
 *     consumer's own handler decides what lands, see expect/refuse);
 *   - the data path of every peer (direct-shm / direct-cma / am-shm /
 *     am-tcp) is decided from rkey_ptr, both blobs' direct-cma bits and our
 *     own configuration (ucx_path.c, ucx_cma.c), logged once per peer, with
 *     a loud warning when a same-host peer ended up on tcp (F28).
 *
 * Threading: the transport is driven by one owner thread. UCX itself starts
 * an internal `async` thread; all kvpeer callbacks run inside progress() on
 * the owner thread.
 */
#ifndef KVP_TRANSPORT_UCX_H
#define KVP_TRANSPORT_UCX_H

#include "transport/transport.h"

/* Upper bound of a local blob (worker address + packed rkey + header); a blob
 * from a peer longer than this is refused before it is parsed further. */
#define KVP_UCX_BLOB_MAX (16u * 1024u)

/* Configuration. Every pointer is borrowed for the duration of
 * kvp_ucx_xport_create() only (strings are copied where kept). Zero/NULL
 * fields take the default named in the comment. */
typedef struct kvp_ucx_config {
    const char *log_prefix; /* NULL: "ucx"; copied */
    /* NULL: kvp_clock_real(); must outlive the transport. Protocol time only:
     * UCX's own waits (close) are bounded on the real clock. */
    const kvp_clock_t *clock;
    /* UCX transports. NULL: UCX_TLS from the environment, else UCX's default.
     * Non-NULL (e.g. "tcp") overrides the environment. */
    const char *tls;
    /* UCX keepalive interval (its own shm and tcp peer-failure detection).
     * NULL: the environment's UCX_KEEPALIVE_INTERVAL if set, else "inf" (off:
     * the node's control-plane heartbeat is the liveness signal; see
     * UCX_DEFAULT_KEEPALIVE in ucx_int.h for why). */
    const char *keepalive_interval;
    /* Allocation order for register_region(NULL). NULL: UCX_ALLOC_PRIO from
     * the environment if set, else "md:posix,md:sysv,huge,thp,md:*,mmap,heap". */
    const char *alloc_prio;
    /* Size of the preallocated transfer-record pool: transfers tracked at
     * once (live + retired + cancelled-but-still-owned-by-UCX). 0: 4096.
     * write() answers KVP_ERR_LIMIT when the pool is empty. */
    uint32_t max_transfers;
    /* Host identity put in the blob to tell same-host peers. NULL:
     * hostname + "/" + /proc/sys/kernel/random/boot_id. Copied. */
    const char *host_id;
    /* Data-path probe: a flush is posted on every new endpoint; if it has not
     * completed after this long (UCX's wire-up never finished -- seen with
     * UCX 1.13 tcp when both sides reconnect after a partition), the
     * endpoint is treated as failed (peer_status() = KVP_ERR_TRANSPORT,
     * FORCE-closed, its transfers FAILED). 0: 2000 ms. Real clock. */
    uint32_t connect_timeout_ms;
    /* Benchmarks only: send with ucp_put_nbx on every path, as before issue
     * 14 (UCX emulates it over active messages where RMA is not native, and
     * the TARGET then aborts when its completion send fails because the
     * source died). Never set by the node. */
    bool legacy_put;
    /* Issue 27: the control plane's listen address ("host:port"). UCX's tcp
     * transport (AM context) is limited to the interface carrying that host
     * (UCX_NET_DEVICES; 127.0.0.1 -> lo) unless UCX_NET_DEVICES is set in
     * the environment; a wildcard keeps every interface (WARN). NULL: UCX's
     * default (every interface). Borrowed during create only. */
    const char *listen_addr;
    /* Issue 27: the port of kvpeer's own tcp data stream (tcpd.h), on the
     * listen address's host; 0: an ephemeral port (in the blob). */
    uint16_t data_port;
} kvp_ucx_config_t;

/* Fill `cfg` with the defaults (all zero/NULL). */
void kvp_ucx_config_default(kvp_ucx_config_t *cfg);

/* Create a UCX transport: context, worker, event fd. *out is written only on
 * KVP_OK; the caller owns it and releases it with (*out)->ops->close().
 * Errors: KVP_ERR_INVALID (bad config), KVP_ERR_NOMEM, KVP_ERR_TRANSPORT
 * (UCX refused; the reason is logged). */
kvp_status_t kvp_ucx_xport_create(const kvp_ucx_config_t *cfg, kvp_xport_t **out);

/* The ops table (name "ucx", caps ALLOCATES_REGION|FENCE|EVENT_FD|AM_LANDING). */
extern const kvp_xport_ops_t kvp_ucx_xport_ops;

/* ---- introspection (diagnostics, stats and tests; not on the data path) */

/* True when the peer's blob carried the same host id as ours. False for an
 * unknown peer. */
bool kvp_ucx_peer_same_host(kvp_xport_t *x, kvp_xpeer_id_t peer);

/* True once the peer proved it shares our memory (it wrote its secret into
 * our probe segment; ucx_probe.c). Only then is a FETCH_DONE from it
 * trusted without AM landing (issue 27). */
bool kvp_ucx_peer_proven(kvp_xport_t *x, kvp_xpeer_id_t peer);

/* The facts the peer's data paths were decided from at add_peer (e.g.
 * "out=direct-shm in=direct-shm rkey_ptr=ok shm=on"), copied into buf
 * (always NUL-terminated when cap > 0). KVP_ERR_NOT_FOUND for an unknown
 * peer. */
kvp_status_t kvp_ucx_peer_lanes(kvp_xport_t *x, kvp_xpeer_id_t peer, char *buf, size_t cap);

/* How the PEER's puts reach OUR region (the mirror of peer_path): direct
 * shm only when our region is UCX-allocated shared memory; direct-cma when
 * our blob offers it and the peer's says it writes it (issue 29 item 4).
 * This is what fence_peer() proof depends on. KVP_PATH_UNKNOWN for an
 * unknown peer. */
kvp_data_path_t kvp_ucx_peer_inbound_path(kvp_xport_t *x, kvp_xpeer_id_t peer);

/* True when register_region() got its memory from UCX (UCP_MEM_MAP_ALLOCATE)
 * rather than the anonymous-mmap fallback or the caller. */
bool kvp_ucx_region_ucx_allocated(kvp_xport_t *x);

/* The parts of a blob, for diagnostics and the raw-UCX baseline bench.
 * Pointers borrow from `blob` (valid while it is). Same strict validation as
 * add_peer; *out written only on KVP_OK. */
typedef struct kvp_ucx_blob_parts {
    kvp_layout_t layout;
    uint64_t region_base, region_len;
    bool ucx_allocated; /* the region came from UCP_MEM_MAP_ALLOCATE */
    uint32_t pid;       /* diagnostic only */
    const void *host_id, *worker_addr, *rkey;
    size_t host_id_len, worker_addr_len, rkey_len;
    /* the RMA context's worker (shm/RDMA, never tcp): where puts go and
     * rkey unpacks; worker_addr is the AM context's (no RMA) */
    const void *rma_worker_addr;
    size_t rma_worker_addr_len;
} kvp_ucx_blob_parts_t;
kvp_status_t kvp_ucx_blob_parse(const void *blob, size_t len, kvp_ucx_blob_parts_t *out);

/* The ucp_config_modify settings this backend applies for `cfg` (same rules
 * as kvp_ucx_xport_create: env wins unless cfg overrides). Calls
 * set(key, value, arg) per key; for the raw baseline bench, so that it runs
 * UCX exactly as configured here. */
void kvp_ucx_config_each(const kvp_ucx_config_t *cfg,
                         void (*set)(const char *key, const char *value, void *arg), void *arg);
/* ucp_config_modify((ucp_config_t *)ucp_config, key, value) for a key of
 * kvp_ucx_config_each, under the name the loaded UCX applies (ucx_version.c:
 * UCX 1.13 and 1.22 spell a transport's key differently). A ucs_status_t. */
int kvp__ucx_config_modify(void *ucp_config, const char *key, const char *value);

#endif /* KVP_TRANSPORT_UCX_H */
