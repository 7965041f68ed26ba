/*
 * transport.h -- the data transport (SPEC §6): a const ops table with two
 * backends, UCX (real one-sided puts) and fake (deterministic, fault
 * injecting, with a landing checker).
 *
 * The whole game here is ownership of memory a NIC may touch. A WRITE cannot
 * be recalled: releasing its id, cancelling it, closing the endpoint or losing
 * the peer does not stop bytes already on their way. So:
 *   - a transfer id is "tracked" from a successful write() until poll()
 *     (live peer), poll_retired() or force_release_retired() hands it back as
 *     terminal. Only then may the caller release the source pins (source
 *     side) -- that hand-back is the proof;
 *   - cancel(IMMEDIATE) releases tracking only. It is NEVER used on a path
 *     that then frees memory;
 *   - remove_peer() retires the peer's in-flight transfers: poll() of any
 *     peer never reports them again, so a new session for the same peer id
 *     cannot see them; the endpoint and remote key stay alive until no
 *     retired transfer refers to them.
 *
 * Threading: a transport is driven by one thread (the node's owner).
 */
#ifndef KVP_TRANSPORT_H
#define KVP_TRANSPORT_H

#include "common/common.h"

typedef struct kvp_xport kvp_xport_t;
typedef uint64_t kvp_xfer_id_t;  /* unique for the transport's lifetime; never 0 */
typedef uint64_t kvp_xpeer_id_t; /* remote-peer handle; unique for the lifetime; never 0 */

typedef enum kvp_cancel_mode {
    KVP_CANCEL_IMMEDIATE = 0, /* release tracking only; the WRITE may go on */
    KVP_CANCEL_WAIT = 1,      /* release what is terminal; report the rest, still tracked */
} kvp_cancel_mode_t;

/* How bytes reach a peer; reported per peer in stats and logs. */
typedef enum kvp_data_path {
    KVP_PATH_UNKNOWN = 0,
    KVP_PATH_DIRECT_SHM = 1,   /* one-sided shared-memory put; cannot be fenced */
    /* kvpeer's own active-message path (every peer whose put would not be
     * native RMA): the consumer's handler lands each block only into a slot
     * it expects (expect()/refuse() below), so refusal is proof. */
    KVP_PATH_AM_SHM = 2, /* AM over UCX shared memory */
    KVP_PATH_AM_TCP = 3, /* AM over tcp */
    KVP_PATH_RDMA = 4,
    KVP_PATH_FAKE_FENCEABLE = 5,
    KVP_PATH_FAKE_UNFENCEABLE = 6,
    /* The fake's model of the AM path: blocks into us land only in slots we
     * expect (expect/refuse/is_landed), so refusal is proof. */
    KVP_PATH_FAKE_AM = 7,
    /* Issue 29 item 4: same host, into a consumer region UCX did not
     * allocate: the source writes the blocks straight into the consumer's
     * slots with process_vm_writev (ucx_cma.c). Unfenceable, as direct shm. */
    KVP_PATH_DIRECT_CMA = 8,
} kvp_data_path_t;

const char *kvp_data_path_str(kvp_data_path_t p);

/* Capability bits. */
enum {
    KVP_XPORT_CAP_ALLOCATES_REGION = 1u << 0, /* register_region(NULL) allocates */
    KVP_XPORT_CAP_FENCE = 1u << 1,            /* fence_peer() can be proof on some paths */
    KVP_XPORT_CAP_EVENT_FD = 1u << 2,         /* event_fd() is meaningful */
    KVP_XPORT_CAP_AM_LANDING = 1u << 3,       /* expect/refuse/landed are implemented */
};

/* A destination slot of OUR region named with its generation (consumer side). */
typedef struct kvp_xslot {
    uint32_t slot, gen;
} kvp_xslot_t;

/* One block of a write: read src_slot of our region, write dst_slot of the
 * peer's. Generations travel so the fake's landing checker can tell a stale
 * destination; the UCX backend ignores them (UCX checks nothing). */
typedef struct kvp_xfer_block {
    uint32_t src_slot, src_gen;
    uint32_t dst_slot, dst_gen;
} kvp_xfer_block_t;

typedef struct kvp_xfer_result {
    kvp_xfer_id_t id;
    kvp_status_t status; /* KVP_OK = remote completion proven; else failed */
} kvp_xfer_result_t;

/* Layout of a region: used to validate a peer's blob and bounds-check every
 * destination index before a put. */
typedef struct kvp_layout {
    uint32_t num_blocks;
    uint32_t block_size;
} kvp_layout_t;

typedef struct kvp_xport_stats {
    uint64_t inflight;      /* tracked transfers of live peers */
    uint64_t retired;       /* tracked transfers of removed peers */
    uint64_t peers;         /* live peers */
    uint64_t zombie_peers;  /* removed peers whose endpoint is not yet released */
    uint64_t writes, blocks_written, bytes_written;
    uint64_t puts;          /* ucp_put_nbx calls that reached UCX (0 on AM paths) */
    uint64_t stream_copies; /* direct shm: pieces we copied with streaming stores */
    uint64_t done, failed, force_released;
    uint64_t probe_timeouts; /* new endpoints whose data path never came up */
    /* consumer side of AM paths */
    uint64_t am_blocks_landed, am_bytes_landed;
    uint64_t late_bytes_dropped; /* AM data for a slot not expecting it (refused, stale gen, foreign) */
    uint64_t am_refused_slots;   /* slots refused while still expected */
    /* issue 27: AM data without the consumer's secret (foreign worker, or a
     * peer that never had our blob): dropped, counted also here (bytes) */
    uint64_t am_unauth_dropped;
    /* issue 27: kvpeer's own tcp data stream (UCX backend, tcpd.h) */
    uint64_t tcpd_open;    /* authenticated inbound streams now */
    uint64_t tcpd_refused; /* connections refused or closed: caps, bad preface, deadline, framing */
    uint64_t tcpd_emfile;  /* accept() out of file descriptors */
    /* issue 29 item 4: direct-cma (source side): process_vm_writev calls,
     * bytes they wrote, calls that failed (the transfer FAILED) */
    uint64_t cma_writes, cma_bytes, cma_failed;
} kvp_xport_stats_t;

typedef struct kvp_xport_ops {
    const char *name;
    uint32_t caps;

    /* Register the region once. base == NULL and CAP_ALLOCATES_REGION: the
     * transport allocates it and frees it at close (*base_out written). With
     * base != NULL the caller owns the memory and frees it after close. */
    kvp_status_t (*register_region)(kvp_xport_t *x, void *base, size_t len,
                                    const kvp_layout_t *layout, void **base_out);
    /* The address blob (write access to our region!) for HELLO_ACK. Borrowed,
     * valid until close. */
    kvp_status_t (*local_blob)(kvp_xport_t *x, const void **blob, size_t *len);
    /* Import a peer's blob; `expect` is the layout the peer advertised in its
     * HELLO and the blob must agree. Nothing is registered on error. */
    kvp_status_t (*add_peer)(kvp_xport_t *x, const void *blob, size_t len,
                             const kvp_layout_t *expect, kvp_xpeer_id_t *out);
    /* Post a batch. Non-blocking. Every index is bounds-checked first; on error
     * nothing was posted. */
    kvp_status_t (*write)(kvp_xport_t *x, kvp_xpeer_id_t peer, const kvp_xfer_block_t *blocks,
                          size_t n, kvp_xfer_id_t *out);
    /* Terminal transfers of that peer only (up to cap); they are released. */
    kvp_status_t (*poll)(kvp_xport_t *x, kvp_xpeer_id_t peer, kvp_xfer_result_t *out, size_t cap,
                         size_t *n_out);
    /* Cancel. IMMEDIATE: tracking released for all ids. WAIT: terminal ones
     * released, running ones written to still_running (cap >= n) and kept. */
    kvp_status_t (*cancel)(kvp_xport_t *x, const kvp_xfer_id_t *ids, size_t n,
                           kvp_cancel_mode_t mode, kvp_xfer_id_t *still_running,
                           size_t *n_running);
    /* Retire the peer's in-flight transfers and drop the peer handle; its
     * endpoint/remote key are released once no retired transfer needs them. */
    kvp_status_t (*remove_peer)(kvp_xport_t *x, kvp_xpeer_id_t peer);
    /* Retired transfers that stopped (done, failed, peer disconnected). */
    kvp_status_t (*poll_retired)(kvp_xport_t *x, kvp_xfer_result_t *out, size_t cap,
                                 size_t *n_out);
    /* Release retired transfers regardless (hold cap). Logs an error each. */
    kvp_status_t (*force_release_retired)(kvp_xport_t *x, const kvp_xfer_id_t *ids, size_t n);
    /* Consumer side: force-close our own endpoint to the source. *proof is
     * true when the path is fenceable (no later byte can land). */
    kvp_status_t (*fence_peer)(kvp_xport_t *x, kvp_xpeer_id_t peer, bool *proof);
    /* KVP_OK, or the error that hit our endpoint to that peer (the outcome of
     * every load from it is unknown). */
    kvp_status_t (*peer_status)(kvp_xport_t *x, kvp_xpeer_id_t peer);
    kvp_data_path_t (*peer_path)(kvp_xport_t *x, kvp_xpeer_id_t peer);

    /* ---- issue 27 item 8: the source's process exit as proof (NULL: none) ----
     * Where the peer's writes reach us without us (direct shm: no fence) and
     * the transport knows the peer's process for sure (same host: SO_PEERCRED
     * on a unix side channel bound to the peer's secret, then a pidfd), the
     * process's exit ends every write of it into our memory: do_exit tears
     * its mm down before the exit is reported. The watch outlives
     * remove_peer while held: a quarantined load is released only after the
     * session ended, and the control link usually dies before the exit is
     * reported (exit_files precedes exit_notify). */
    /* One more holder (a quarantined load) of the peer's exit watch; false
     * (nothing held) when there is none for that peer (not same host, not
     * direct shm, not proven, no pidfd, or the watch cap is reached). */
    bool (*exit_hold)(kvp_xport_t *x, kvp_xpeer_id_t peer);
    /* One holder fewer; the last one of a removed peer closes the watch. */
    void (*exit_drop)(kvp_xport_t *x, kvp_xpeer_id_t peer);
    /* True only when the held watch proves the process exited (a stopped
     * process is alive: false). Cheap (one poll of a pidfd; sticky once true). */
    bool (*exit_proven)(kvp_xport_t *x, kvp_xpeer_id_t peer);

    /* ---- consumer side of AM paths (CAP_AM_LANDING; NULL otherwise) ----
     * On an AM path the source's blocks arrive as active messages that OUR
     * handler lands (inside progress(), on the owner thread) only into a slot
     * expected at that very generation from that peer; everything else is
     * dropped and counted (late_bytes_dropped). Nothing in UCX writes into
     * the region on that path, so once refuse() returned, no byte can land in
     * those slots any more: that is the AM_REFUSE proof. */
    /* True when the peer's writes to us can only arrive through the AM
     * handler (refusal is proof for its loads); false for direct shm/RDMA. */
    bool (*inbound_refusable)(kvp_xport_t *x, kvp_xpeer_id_t peer);
    /* Issue 27: true when a FETCH_DONE from `peer` may be trusted only for
     * blocks our handler saw land (is_landed), i.e. unless the transport has
     * PROVEN that the peer writes straight into our memory (same host, its
     * own claim is not enough). NULL: inbound_refusable decides. */
    bool (*landing_required)(kvp_xport_t *x, kvp_xpeer_id_t peer);
    /* Issue 27: the control connection the NEXT add_peer's blob arrived on
     * (kvp_link_binding; 0 = unknown). The same-host proof written and
     * expected for that peer is bound to it, so a proof a node wrote for one
     * connection proves nothing on another (a relay). NULL: not used. */
    void (*bind_next_peer)(kvp_xport_t *x, uint64_t binding);
    /* Issue 27: the numeric address the NEXT add_peer's blob came from (its
     * control connection's remote host): where to reach a peer whose data
     * stream listens on a wildcard address. NULL: not used. */
    void (*next_peer_host)(kvp_xport_t *x, const char *host);
    /* Accept blocks from `peer` into these slots at these generations (peer 0:
     * from any source -- transport tests only). Clears their landed flag. */
    kvp_status_t (*expect)(kvp_xport_t *x, kvp_xpeer_id_t peer, const kvp_xslot_t *slots,
                           size_t n);
    /* Stop accepting into these slots (no-op for slots not expected at that
     * generation). After it returns nothing lands in them. */
    void (*refuse)(kvp_xport_t *x, const kvp_xslot_t *slots, size_t n);
    /* Whether this slot, still expected at this generation, has landed in
     * full. No progress, no allocation, O(1): the node asks it per poll
     * round for the loads whose FETCH_DONE overtook their blocks. */
    bool (*is_landed)(kvp_xport_t *x, kvp_xslot_t slot);
    /* Drive the backend (UCX: worker progress until idle). Returns whether
     * anything happened. */
    bool (*progress)(kvp_xport_t *x);
    /* An fd readable when progress() has work, or -1. */
    int (*event_fd)(kvp_xport_t *x);
    /* Arm the fd before sleeping: KVP_OK may sleep, KVP_ERR_BUSY progress again. */
    kvp_status_t (*arm)(kvp_xport_t *x);
    /* Deferred work, once per node round (UCX: the direct-cma writes its
     * writer thread finished, folded into their records). Returns whether
     * it did any: the round must not sleep, it settles them. NULL: none. */
    bool (*pump)(kvp_xport_t *x);
    void (*get_stats)(kvp_xport_t *x, kvp_xport_stats_t *st);
    /* Refuses (KVP_ERR_BUSY) while anything is in flight or retired unless
     * force. On KVP_OK the transport is freed. */
    kvp_status_t (*close)(kvp_xport_t *x, bool force);
} kvp_xport_ops_t;

/* Every backend's object starts with this. */
struct kvp_xport {
    const kvp_xport_ops_t *ops;
    const char *log_prefix;
    /* Bumped by the backend (owner thread) whenever an endpoint fails, so the
     * owner learns of it at once instead of polling peer_status(). */
    uint64_t ep_failures;
};

#endif /* KVP_TRANSPORT_H */
