/*
 * fake.h -- the fake data transport (SPEC §6 "fake") and its landing checker.
 *
 * A deterministic, fault-injecting test double of the transport.h ops table.
 * Several fake transports (one per node) are joined by one fabric. Nothing
 * happens by itself: a transfer follows a SCRIPT in time, and its events
 * (the byte copy, the terminal state) are applied when the clock has reached
 * them AND someone calls progress (the ops progress(), kvp_fake_progress() or
 * kvp_fake_fabric_progress()). Events due at the same moment are applied in
 * (time, transfer id, copy-before-terminal) order.
 *
 * The essential feature: the byte copy of a transfer is independent of what
 * the caller did with its id. cancel(IMMEDIATE), remove_peer(),
 * force_release_retired() or a transfer reported terminal too early do NOT
 * stop a scripted copy -- exactly like a one-sided WRITE that cannot be
 * recalled. Only a fence on a fenceable path drops copies.
 *
 * LANDING CHECKER. Each block copy (the moment bytes land) is checked:
 *   I1 destination: if the destination transport has a store, the slot's
 *      CURRENT generation equals the dst_gen the write named and its state is
 *      FILLING or QUARANTINED (a late copy into a QUARANTINED slot of the right
 *      generation is legal; FREE, READY or a new generation is not);
 *   I2 source: if the source transport has a store, the source slot is READY,
 *      has the named src_gen and pins > 0 (the transfer's own pin);
 *   the destination transport is still open (its region may be freed once it
 *      closed: the copy is skipped and recorded).
 * Every violation is recorded in the fabric (kvp_fake_violations) and logged
 * as an error. The bytes are copied anyway (except into a closed
 * destination), modelling the corruption the violation stands for.
 *
 * Fence (consumer side, fence_peer): on a peer whose path is
 * KVP_PATH_FAKE_FENCEABLE every copy not yet landed from that source's
 * transport into our region is dropped, and so is every copy of a transfer
 * the source posts LATER through an endpoint to us that it already had at
 * the fence (the fenced incarnation's, or older): as in UCX, where each
 * software put carries the id of the consumer's paired endpoint, which the
 * FORCE close invalidated, so "no later byte can land" (transport.h). Endpoints
 * the source adds afterwards (a new incarnation) are not affected. Then
 * *proof = true; on KVP_PATH_FAKE_UNFENCEABLE they land anyway and
 * *proof = false. Either way the peer handle is closed afterwards: write()
 * to it returns KVP_ERR_CLOSED and peer_status() KVP_ERR_CLOSED. Our own
 * outbound transfers on that peer are not affected (they follow their
 * scripts).
 *
 * cancel() accepts retired ids too (they are still tracked until
 * poll_retired/force_release_retired or a cancel hands them back).
 *
 * A transfer that is reported DONE although its bytes never land (a flush
 * that says OK for dropped data, SPEC §6) is kvp_fake_script_late(t,
 * KVP_FAKE_NEVER, KVP_OK).
 *
 * Threading: every fake call takes the fabric's mutex, so transports of one
 * fabric may be driven by different threads. The byte copy and the checker
 * run on the thread that progresses the SOURCE transport and read the
 * destination's store and region: that is a data race with a destination
 * owned by another thread (as a real WRITE is). Deterministic tests and the
 * simulator drive every node from one thread.
 *
 * Ownership: the fabric owns the transports' shared bookkeeping and the
 * violation list; a transport owns its transfers, scripts, peers and call
 * log. The region is always the caller's (no CAP_ALLOCATES_REGION):
 * register_region(NULL) is KVP_ERR_UNSUPPORTED; the caller frees its region
 * after close(). A store given in the config is borrowed and must outlive
 * the transport. Close every transport before destroying the fabric.
 */
#ifndef KVP_TRANSPORT_FAKE_H
#define KVP_TRANSPORT_FAKE_H

#include "store/store.h"
#include "transport/transport.h"

typedef struct kvp_fake_fabric kvp_fake_fabric_t;

/* ----------------------------------------------------------------- fabric */

/* Create a fabric. `clock` is borrowed (must outlive the fabric) and is the
 * default clock of its transports. Out-param written only on KVP_OK. */
kvp_status_t kvp_fake_fabric_create(const kvp_clock_t *clock, kvp_fake_fabric_t **out);
/* KVP_ERR_BUSY (nothing freed) while a transport of the fabric is open. */
kvp_status_t kvp_fake_fabric_destroy(kvp_fake_fabric_t *f);
/* Apply every due event of every transport of the fabric, in global
 * (time, id) order. Returns whether anything happened. */
bool kvp_fake_fabric_progress(kvp_fake_fabric_t *f);
/* Earliest scheduled event of any transport, UINT64_MAX if none (the
 * simulator advances its clock there). */
uint64_t kvp_fake_fabric_next_event_ns(kvp_fake_fabric_t *f);

/* --------------------------------------------------------------- checker */

typedef enum kvp_fake_violation_kind {
    KVP_FAKE_V_DST_STALE = 0,    /* I1: destination slot has another generation */
    KVP_FAKE_V_DST_STATE = 1,    /* I1: right generation, not FILLING/QUARANTINED */
    KVP_FAKE_V_SRC_STALE = 2,    /* I2: source slot has another generation */
    KVP_FAKE_V_SRC_STATE = 3,    /* I2: right generation, not READY */
    KVP_FAKE_V_SRC_UNPINNED = 4, /* I2: READY, right generation, but pins == 0 */
    KVP_FAKE_V_DST_CLOSED = 5,   /* destination transport closed; copy skipped */
} kvp_fake_violation_kind_t;

const char *kvp_fake_violation_kind_str(kvp_fake_violation_kind_t k);

/* One violated landing. For DST_* kinds the slot fields describe the
 * destination, for SRC_* the source (the other slot is given too). */
typedef struct kvp_fake_violation {
    kvp_fake_violation_kind_t kind;
    kvp_xfer_id_t xfer;
    uint32_t src_ep, dst_ep; /* fabric endpoint ids of the transports */
    uint32_t src_slot, dst_slot;
    uint32_t expected_gen; /* the one the write named */
    uint32_t actual_gen;   /* the slot's current one */
    kvp_slot_state_t actual_state;
    uint32_t actual_pins;
    uint64_t at_ns; /* clock of the landing */
} kvp_fake_violation_t;

/* Number of violations so far; *list (may be NULL) gets the array of the
 * recorded ones, valid until the next fake call or destroy. The array holds
 * all of them unless an allocation failed while recording (then the count
 * still includes the unrecorded ones, so "zero violations" stays true). */
size_t kvp_fake_violations(kvp_fake_fabric_t *f, const kvp_fake_violation_t **list);
/* Forget recorded violations (a test that provoked some on purpose). */
void kvp_fake_violations_clear(kvp_fake_fabric_t *f);

/* ------------------------------------------------------------- transport */

typedef struct kvp_fake_config {
    kvp_fake_fabric_t *fabric;    /* required; borrowed, outlives the transport */
    const kvp_clock_t *clock;     /* NULL = the fabric's; borrowed */
    kvp_store_t *store;           /* optional; borrowed: the checker checks our own
                                   * slots with it (source slots of our writes,
                                   * destination slots of writes into us) */
    const char *log_prefix;       /* borrowed for the transport's lifetime; may be NULL */
    kvp_data_path_t default_path; /* of every new peer: KVP_PATH_FAKE_FENCEABLE
                                   * (also when UNKNOWN/0), KVP_PATH_FAKE_UNFENCEABLE
                                   * or KVP_PATH_FAKE_AM (below) */
    uint64_t default_delay_ns;    /* default script: copy + DONE after this (0 = at once) */
    uint64_t delay_jitter_ns;     /* default script: + uniform [0, jitter] from the rng */
    uint64_t rng_seed;
    size_t call_log_max; /* records kept in the call log; 0 = 65536 */
} kvp_fake_config_t;

/* AM model (default_path KVP_PATH_FAKE_AM, for the consumer side of
 * ucx_am.c): copies INTO this transport land only in slots it expects
 * (ops expect) at the copy's generation from that source; refused, stale or
 * foreign copies are dropped and counted (late_bytes_dropped); is_landed
 * says whether an expected slot got its copy; fence_peer refuses every slot
 * expected from that peer and is proof. inbound_refusable is true for its
 * peers. Without it, expect/refuse are no-ops and every copy lands. */

/* Create a fake transport; it registers itself (an endpoint id) with the
 * fabric. Free it with ops->close(). KVP_ERR_INVALID for a NULL fabric or a
 * path that is not a FAKE one; KVP_ERR_NOMEM (nothing leaks). */
kvp_status_t kvp_fake_create(const kvp_fake_config_t *cfg, kvp_xport_t **out);
extern const kvp_xport_ops_t kvp_fake_ops;
bool kvp_xport_is_fake(const kvp_xport_t *x);
/* Our fabric endpoint id (what our blob names). */
uint32_t kvp_fake_endpoint_id(kvp_xport_t *x);

/* Apply our due outbound events (copies, terminal states). = ops->progress. */
bool kvp_fake_progress(kvp_xport_t *x);
/* Earliest scheduled event of our transfers, UINT64_MAX if none. */
uint64_t kvp_fake_next_event_ns(kvp_xport_t *x);

/* ---------------------------------------------------------------- scripts */

/* What a transfer does, relative to its write() time. A script is consumed
 * by the NEXT write() of the transport (queue, FIFO); without one the
 * default script applies (COMPLETE after default_delay_ns +- jitter). */
typedef enum kvp_fake_script_kind {
    KVP_FAKE_COMPLETE = 0,    /* copy all blocks at terminal_ns, then DONE (KVP_OK) */
    KVP_FAKE_WEDGE = 1,       /* never terminal; copies only if copy_ns is set */
    KVP_FAKE_FAIL = 2,        /* at terminal_ns: copy the first `copy_blocks` blocks,
                               * then FAILED with `status` */
    KVP_FAKE_FAIL_SUBMIT = 3, /* write() returns KVP_ERR_TRANSPORT; nothing posted */
    KVP_FAKE_DISCONNECT = 4,  /* like FAIL with KVP_ERR_UNREACHABLE, and the peer's
                               * status becomes KVP_ERR_UNREACHABLE */
    KVP_FAKE_LATE = 5,        /* terminal (with `status`) at terminal_ns, but the
                               * `copy_blocks` blocks land at copy_ns (later) */
} kvp_fake_script_kind_t;

#define KVP_FAKE_NEVER UINT64_MAX
#define KVP_FAKE_ALL_BLOCKS UINT32_MAX

typedef struct kvp_fake_script {
    kvp_fake_script_kind_t kind;
    uint64_t terminal_ns; /* delay from write() to terminal; KVP_FAKE_NEVER = never */
    uint64_t copy_ns;     /* delay from write() to the byte copy; KVP_FAKE_NEVER = none.
                           * COMPLETE/FAIL/DISCONNECT ignore it (copy at terminal_ns) */
    uint32_t copy_blocks; /* how many blocks (first ones) are copied; ALL_BLOCKS = all */
    kvp_status_t status;  /* terminal status (FAIL, LATE); FAIL with KVP_OK = TRANSPORT */
} kvp_fake_script_t;

/* Queue a script for the next write(). KVP_ERR_NOMEM. */
kvp_status_t kvp_fake_script_next(kvp_xport_t *x, const kvp_fake_script_t *s);
/* Drop every queued script: the next write follows the next one queued. */
void kvp_fake_scripts_clear(kvp_xport_t *x);
/* Scripts still queued. */
size_t kvp_fake_scripts_queued(kvp_xport_t *x);

/* Constructors (functions, not macros). */
kvp_fake_script_t kvp_fake_script_complete(uint64_t delay_ns);
kvp_fake_script_t kvp_fake_script_wedge(void);
/* Never terminal, but the bytes land at copy_ns (a wedged handle whose WRITE
 * still goes through, e.g. after cancel(IMMEDIATE) or remove_peer). */
kvp_fake_script_t kvp_fake_script_wedge_then_copy(uint64_t copy_ns);
kvp_fake_script_t kvp_fake_script_fail(uint64_t delay_ns, uint32_t copied_blocks);
kvp_fake_script_t kvp_fake_script_fail_submit(void);
kvp_fake_script_t kvp_fake_script_disconnect(uint64_t delay_ns, uint32_t copied_blocks);
/* Reported terminal with `status` at terminal_ns; every block lands at copy_ns. */
kvp_fake_script_t kvp_fake_script_late(uint64_t terminal_ns, uint64_t copy_ns, kvp_status_t status);

/* ------------------------------------------------------ peers (test hooks) */

/* Model an error on our endpoint to that peer (peer_status returns it;
 * later writes to it fail at submit with KVP_ERR_TRANSPORT). KVP_OK clears.
 * KVP_ERR_NOT_FOUND for an unknown or removed peer. */
kvp_status_t kvp_fake_peer_set_error(kvp_xport_t *x, kvp_xpeer_id_t peer, kvp_status_t st);
/* Override a live peer's path (FAKE_FENCEABLE or FAKE_UNFENCEABLE). */
kvp_status_t kvp_fake_peer_set_path(kvp_xport_t *x, kvp_xpeer_id_t peer, kvp_data_path_t p);

/* Issue 27 item 8 (fake_exit.c): whether this consumer may watch the
 * process of its KVP_PATH_FAKE_UNFENCEABLE sources (default on): a closed
 * source transport is an exited process, whose exit is then proof
 * (ops exit_hold/exit_proven). Off models a source the UCX backend cannot
 * watch (another network namespace or user, no pidfd_open). */
void kvp_fake_set_exit_watch(kvp_xport_t *x, bool on);

/* ----------------------------------------------------- transfer inspection */

typedef struct kvp_fake_xfer_info {
    kvp_xpeer_id_t peer;
    bool tracked;        /* the caller still holds the id */
    bool retired;        /* its peer was removed while it was tracked */
    bool terminal;       /* its terminal time has come */
    bool copy_pending;   /* a scripted copy has not happened yet */
    bool fenced;         /* its copies are dropped */
    kvp_status_t status; /* terminal status (valid when terminal) */
    uint32_t n_blocks;
} kvp_fake_xfer_info_t;

/* KVP_ERR_NOT_FOUND once the fake forgot the transfer (untracked and no
 * copy pending). */
kvp_status_t kvp_fake_xfer_info(kvp_xport_t *x, kvp_xfer_id_t id, kvp_fake_xfer_info_t *info);

/* -------------------------------------------------------------- call log */

typedef enum kvp_fake_call_kind {
    KVP_FAKE_CALL_ADD_PEER = 0,         /* peer */
    KVP_FAKE_CALL_WRITE = 1,            /* peer, xfer, n_blocks, blocks */
    KVP_FAKE_CALL_WRITE_REFUSED = 2,    /* peer, status (bad input, fail-submit, ...) */
    KVP_FAKE_CALL_POLL = 3,             /* peer, n (released) */
    KVP_FAKE_CALL_CANCEL = 4,           /* xfer, mode, status: KVP_OK released /
                                         * KVP_ERR_BUSY still running (WAIT) */
    KVP_FAKE_CALL_REMOVE_PEER = 5,      /* peer, n (retired) */
    KVP_FAKE_CALL_POLL_RETIRED = 6,     /* xfer (one record per released transfer) */
    KVP_FAKE_CALL_FORCE_RELEASE = 7,    /* xfer, peer */
    KVP_FAKE_CALL_ENDPOINT_RELEASE = 8, /* peer (the deferred endpoint/rkey release) */
    KVP_FAKE_CALL_FENCE = 9,            /* peer, status KVP_OK = proof, else not; n dropped */
    KVP_FAKE_CALL_CLOSE = 10,           /* status */
    KVP_FAKE_CALL_KINDS = 11,
} kvp_fake_call_kind_t;

/* One recorded call. `blocks` (WRITE only) is owned by the call log and
 * valid until close. */
typedef struct kvp_fake_call {
    kvp_fake_call_kind_t kind;
    uint64_t at_ns;
    kvp_xpeer_id_t peer;
    kvp_xfer_id_t xfer;
    kvp_cancel_mode_t mode;
    kvp_status_t status;
    uint64_t n;
    uint32_t n_blocks;
    const kvp_xfer_block_t *blocks;
} kvp_fake_call_t;

/* The call log (oldest first, at most call_log_max records; later ones are
 * only counted). *calls valid until the next fake call on x. */
size_t kvp_fake_calls(kvp_xport_t *x, const kvp_fake_call_t **calls);
/* Calls of that kind ever made (never capped). */
uint64_t kvp_fake_call_count(kvp_xport_t *x, kvp_fake_call_kind_t kind);

/* Until when this transport has nothing to tell its owner: 0 while a
 * terminal transfer waits to be reported by poll()/poll_retired(), else the
 * time of its next scripted copy or terminal event (KVP_FAKE_NEVER: none).
 * The simulator skips a node's poll round while nothing else is due either. */
uint64_t kvp_fake_quiet_until(kvp_xport_t *x);
/* The same over every transport of the fabric. */
uint64_t kvp_fake_fabric_quiet_until(kvp_fake_fabric_t *f);

/* Landing counters of our outbound transfers. */
typedef struct kvp_fake_counters {
    uint64_t blocks_landed;     /* copied into a destination */
    uint64_t blocks_fenced;     /* dropped by a fence */
    uint64_t blocks_dst_closed; /* dropped: destination closed */
    uint64_t late_copies;       /* blocks landed after the caller released the id */
    uint64_t dropped_at_close;  /* untracked pending copies dropped when we closed */
    uint64_t posted_fenced;     /* transfers posted through an endpoint already fenced */
} kvp_fake_counters_t;
void kvp_fake_get_counters(kvp_xport_t *x, kvp_fake_counters_t *c);

#endif /* KVP_TRANSPORT_FAKE_H */
