/*
 * fake_int.h -- internals shared by the fake transport (fake.c: the ops) and
 * its fabric (fake_fabric.c: endpoints, event application, landing checker).
 * Not part of any API.
 *
 * Locking: every entry point takes fab->mu once; functions named fake__*
 * expect it held.
 */
#ifndef KVP_TRANSPORT_FAKE_INT_H
#define KVP_TRANSPORT_FAKE_INT_H

#include "transport/fake.h"

#include <pthread.h>

#define FAKE_BLOB_LEN 32u

/* A remote peer as seen by one transport. Owned by the transport; freed at
 * the endpoint release (remove_peer with nothing retired, or when the last
 * retired transfer referring to it is released) or at close. */
typedef struct fake_peer {
    kvp_list_t link; /* fake_xport_t.peers */
    kvp_xpeer_id_t id;
    uint32_t remote_ep;
    kvp_layout_t layout;
    kvp_data_path_t path;
    kvp_status_t status; /* injected endpoint error */
    bool removed;        /* zombie: handle dropped, endpoint still held */
    bool fenced;
    /* The consumer at remote_ep fenced the endpoint this one is paired with
     * (UCX: FORCE-closed its PEER ep, whose id our software puts carry):
     * every byte we post through this endpoint from then on is dropped. A
     * later incarnation adds a new peer record, unaffected. */
    bool remote_fenced;
    uint64_t retired_refs; /* tracked retired transfers naming it */
} fake_peer_t;

/* One transfer. Owned by its (source) transport; lives while the caller
 * tracks its id OR a scripted copy is still to happen (a WRITE cannot be
 * recalled). `peer` is valid only while tracked. */
typedef struct fake_xfer {
    kvp_list_t link; /* fake_xport_t.xfers, in id order */
    kvp_xfer_id_t id;
    fake_peer_t *peer;
    kvp_xpeer_id_t peer_id;
    uint32_t dst_ep;
    uint64_t terminal_at; /* absolute; KVP_FAKE_NEVER */
    uint64_t copy_at;     /* absolute; KVP_FAKE_NEVER = no copy */
    uint32_t copy_blocks;
    kvp_status_t final_status; /* status once terminal */
    bool disconnect;           /* terminal marks the peer unreachable */
    bool tracked, retired, terminal, copied, fenced;
    /* Into an AM-model consumer: the source's bytes as read at write() (an
     * AM source's eager send copies them out then); owned, n blocks. */
    unsigned char *snap;
    uint32_t n;
    kvp_xfer_block_t blocks[];
} fake_xfer_t;

/* AM model (default path KVP_PATH_FAKE_AM): one entry per slot of our
 * region. A copy into us lands only while its slot is expected at the
 * copy's generation from the copying endpoint; anything else is dropped and
 * counted (late_bytes_dropped), as ucx_am.c's handler does. */
typedef struct fake_acc {
    kvp_xpeer_id_t peer; /* our handle of the source (fence scope); 0 = any */
    uint32_t src_ep;     /* its fabric endpoint; 0 = any */
    uint32_t gen;
    bool expect, landed;
} fake_acc_t;

typedef struct fake_script_node {
    kvp_list_t link;
    kvp_fake_script_t s;
} fake_script_node_t;

typedef struct fake_xport {
    kvp_xport_t base; /* first: kvp_xport_t * <-> fake_xport_t * */
    kvp_fake_fabric_t *fab;
    const kvp_clock_t *clock;
    kvp_store_t *store;
    uint32_t ep; /* fabric endpoint id, >= 1 */
    kvp_data_path_t default_path;
    uint64_t default_delay_ns, delay_jitter_ns;
    kvp_rng_t rng;
    bool registered;
    unsigned char *region;
    size_t region_len;
    kvp_layout_t layout;
    fake_acc_t *acc; /* owned; layout.num_blocks entries on the AM model, else NULL */
    unsigned char blob[FAKE_BLOB_LEN];
    kvp_list_t peers, xfers, scripts;
    /* The earliest scripted event (copy or terminal) of our transfers,
     * valid unless events_dirty (a write, an applied event or a close
     * changed them): lets progress and the queries skip the scan. */
    uint64_t next_at;
    bool events_dirty;
    /* events_dirty ? 0 : next_at, written under the lock (fake__events_changed,
     * next_at()), read without it by progress() to return at once when
     * nothing can be due (atomic: another thread may be applying events). */
    uint64_t due_hint;
    /* tracked terminal transfers: poll()/poll_retired() report them. Changed
     * under the lock with atomic stores; poll_retired() reads it without. */
    uint32_t n_reportable;
    size_t n_scripts;
    kvp_fake_call_t *calls; /* owned; WRITE records own their blocks */
    size_t n_calls, cap_calls, max_calls;
    uint64_t call_counts[KVP_FAKE_CALL_KINDS];
    kvp_xport_stats_t st; /* writes.. force_released; the rest computed */
    kvp_fake_counters_t ctr;
    /* issue 27 item 8 (fake_exit.c): exit watches of source processes */
    kvp_list_t exitw;
    bool exit_watch_off;
} fake_xport_t;

struct kvp_fake_fabric {
    pthread_mutex_t mu;
    const kvp_clock_t *clock;
    uint64_t fabric_id; /* distinguishes fabrics in one process */
    fake_xport_t **eps; /* eps[ep - 1]; NULL once closed */
    uint32_t n_eps, cap_eps, open;
    uint64_t next_id; /* transfer and peer ids, fabric-wide, never 0 */
    kvp_fake_violation_t *viol;
    size_t n_viol, cap_viol;
    uint64_t viol_lost; /* not recorded (allocation failed) */
    /* The minimum over open transports of fake__next_event (next_cache) and
     * fake__quiet_until (quiet_cache), valid unless cache_dirty: set with
     * every change of a transport's events (fake__events_changed), of its
     * reportable count (fake__reportable_add) or of the endpoint table. */
    bool cache_dirty;
    uint64_t next_cache, quiet_cache;
    bool mixed_clocks; /* a transport runs on a clock other than `clock` */
    /* cache_dirty ? 0 : next_cache / quiet_cache (next_hint stays 0 with
     * mixed clocks), written under the lock, read without it by the fabric
     * queries: a non-zero hint is the answer (0: ask under the lock). */
    uint64_t next_hint, quiet_hint;
};

static inline void fake__fabric_changed(kvp_fake_fabric_t *f)
{
    f->cache_dirty = true;
    __atomic_store_n(&f->next_hint, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&f->quiet_hint, 0, __ATOMIC_RELAXED);
}

static inline fake_xport_t *fake__x(kvp_xport_t *x)
{
    return (fake_xport_t *)x;
}

/* x's transfers changed (written, applied, freed at close): its earliest
 * event and the fabric's caches are recomputed when next asked. */
static inline void fake__events_changed(fake_xport_t *x)
{
    x->events_dirty = true;
    __atomic_store_n(&x->due_hint, 0, __ATOMIC_RELAXED);
    fake__fabric_changed(x->fab);
}

/* n_reportable += d (d = 0: set to 0). */
static inline void fake__reportable_add(fake_xport_t *x, int d)
{
    uint32_t v = d == 0 ? 0 : (uint32_t)((int64_t)x->n_reportable + d);
    __atomic_store_n(&x->n_reportable, v, __ATOMIC_RELAXED);
    fake__fabric_changed(x->fab);
}

static inline bool fake__copy_pending(const fake_xfer_t *xf)
{
    return xf->copy_at != KVP_FAKE_NEVER && !xf->copied;
}

/* fake_fabric.c */
kvp_status_t fake__fabric_attach(kvp_fake_fabric_t *f, fake_xport_t *x);
void fake__fabric_detach(kvp_fake_fabric_t *f, fake_xport_t *x);
fake_xport_t *fake__fabric_ep(kvp_fake_fabric_t *f, uint32_t ep);
/* Apply x's due events (x == NULL: every transport's), in (time, id) order. */
bool fake__apply_due(kvp_fake_fabric_t *f, fake_xport_t *only);
uint64_t fake__next_event(fake_xport_t *x);
/* Until when x has nothing to report or apply (see kvp_fake_quiet_until). */
uint64_t fake__quiet_until(fake_xport_t *x);
/* The consumer dst_ep fenced its endpoint to src_ep: drop the copies not yet
 * landed from src_ep into dst_ep, and mark src_ep's endpoints to dst_ep
 * (every one that exists now: the fenced incarnation and older) so that
 * transfers posted through them later are dropped too. Returns the
 * transfers fenced now. */
uint64_t fake__fence(kvp_fake_fabric_t *f, uint32_t src_ep, uint32_t dst_ep);
/* xf goes to an AM-model consumer: read (and check, I2) its source blocks
 * now into xf->snap, as the AM source's send does. KVP_ERR_NOMEM. */
kvp_status_t fake__snapshot(kvp_fake_fabric_t *f, fake_xport_t *x, fake_xfer_t *xf);

/* fake_hooks.c: the call log (counts every call; keeps max_calls records) */
void fake__log_call(fake_xport_t *x, const kvp_fake_call_t *c, const kvp_xfer_block_t *blocks);
void fake__log_simple(fake_xport_t *x, kvp_fake_call_kind_t kind, kvp_xpeer_id_t peer,
                      kvp_xfer_id_t xfer, kvp_status_t st, uint64_t n);

/* fake_exit.c: the source process's exit as proof (ops exit_*) */
bool fake__exit_hold(kvp_xport_t *xp, kvp_xpeer_id_t peer);
void fake__exit_drop(kvp_xport_t *xp, kvp_xpeer_id_t peer);
bool fake__exit_proven(kvp_xport_t *xp, kvp_xpeer_id_t peer);
void fake__exit_free_all(fake_xport_t *x);

/* fake.c and fake_xfer.c: the prefix, the fabric lock, the clock */
static inline const char *fake__pfx(const fake_xport_t *x)
{
    return x->base.log_prefix;
}

static inline void fake__lock(fake_xport_t *x)
{
    pthread_mutex_lock(&x->fab->mu);
}

static inline void fake__unlock(fake_xport_t *x)
{
    pthread_mutex_unlock(&x->fab->mu);
}

static inline uint64_t fake__now_of(const fake_xport_t *x)
{
    return kvp_clock_now(x->clock);
}

/* fake_xfer.c: the ops write, poll, poll_retired, cancel (issue 31) */
kvp_status_t fake__write(kvp_xport_t *xp, kvp_xpeer_id_t peer, const kvp_xfer_block_t *blocks,
                         size_t n, kvp_xfer_id_t *out);
kvp_status_t fake__poll(kvp_xport_t *xp, kvp_xpeer_id_t peer, kvp_xfer_result_t *out, size_t cap,
                        size_t *n_out);
kvp_status_t fake__poll_retired(kvp_xport_t *xp, kvp_xfer_result_t *out, size_t cap,
                                size_t *n_out);
kvp_status_t fake__cancel(kvp_xport_t *xp, const kvp_xfer_id_t *ids, size_t n,
                          kvp_cancel_mode_t mode, kvp_xfer_id_t *still_running, size_t *n_running);

/* fake.c */
void fake__release(fake_xport_t *x, fake_xfer_t *xf);
void fake__maybe_free(fake_xport_t *x, fake_xfer_t *xf);
fake_peer_t *fake__peer_any(fake_xport_t *x, kvp_xpeer_id_t id);
/* A live (not removed) peer; a transfer still tracked (not released). */
fake_peer_t *fake__peer_live(fake_xport_t *x, kvp_xpeer_id_t id);
fake_xfer_t *fake__xfer_tracked(fake_xport_t *x, kvp_xfer_id_t id);

#endif /* KVP_TRANSPORT_FAKE_INT_H */
