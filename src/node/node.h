/*
 * node.h -- internal header of the node layer (SPEC §2 layer 6): the session
 * table, the poll round, retained transfers and quarantined loads past
 * their session (hold cap, drain), sibling probation, threads, the API. The
 * public surface is include/kvpeer.h. The node sits above the session layer
 * (session/session.h): it embeds the sessions' environment
 * (kvp_session_env_t) and answers their upcalls (kvp_session_up_t); no
 * session file includes this header.
 */
#ifndef KVP_NODE_H
#define KVP_NODE_H

#include "kvpeer.h"
#include "common/common.h"
#include "ctl/ctl.h"
#include "session/session.h"
#include "store/store.h"
#include "transport/transport.h"
#include "wire/wire.h"

#include <pthread.h>
#include <stdatomic.h>

/* Test seams: an injected clock, the fake control network and a prebuilt
 * data transport (e.g. the fake). Borrowed; must outlive the node. */
typedef struct kvp_fake_fabric kvp_fake_fabric_t;
typedef struct kvp_node_seams {
    const kvp_clock_t *clock;
    kvp_fake_net_t *fake_net;
    /* KVP_TRANSPORT_FAKE: the node creates its fake transport on this fabric
     * (with its store, for the landing checker) and closes it at destroy. */
    kvp_fake_fabric_t *fake_fabric;
    kvp_data_path_t fake_path;   /* FAKE_FENCEABLE (default) or FAKE_UNFENCEABLE */
    uint64_t fake_delay_ns;      /* default script delay */
    /* No event fd (and so no node fd: kvp_node_fd() is -1): for a caller
     * that never waits on it (the simulator, KVP_THREAD_CALLER, polling
     * events after every round), which then saves a write and a read
     * system call per batch of events. */
    bool no_event_fd;
    /* A thread leaving kvp_wait_events sleeps this long first (tests: a
     * kvp_node_destroy that did not wait for it would free the node under it). */
    uint32_t wait_exit_delay_ms;
} kvp_node_seams_t;

#ifdef KVP_TESTING
/* The node's data transport and store (test builds only, issue 31: scripts,
 * call log, store checks). */
kvp_xport_t *kvp__node_xport(kvp_node_t *n);
kvp_store_t *kvp__node_store(kvp_node_t *n);
#endif

kvp_status_t kvp__node_create_ex(const kvp_config_t *cfg, const kvp_node_seams_t *seams,
                                 kvp_node_t **out);

/* ------------------------------------------------------------------ node */

typedef struct kvp_cmd kvp_cmd_t;

struct kvp_node {
    uint8_t *psk_copy; /* owned copy of cfg.psk (the caller's is borrowed for create only) */
    bool listen_loopback; /* the listen address is loopback (issue 27: psk optional) */
    kvp_config_t cfg; /* strings below are owned copies */
    char name[KVP_WIRE_STR_MAX + 1];
    char peer_id[KVP_WIRE_STR_MAX + 1];
    const kvp_clock_t *clock;
    kvp_loop_t *loop;
    kvp_store_t *store;
    kvp_xport_t *xport;
    uint64_t ep_failures_seen; /* xport->ep_failures when endpoints were last checked */
    _Atomic uint64_t round_ns; /* real clock at the end of the last round (kvp_node_stall_ms) */
    bool own_xport;
    kvp_ctl_t *ctl;
    const void *blob;
    size_t blob_len;
    uint64_t fingerprint;

    /* The session layer's environment (lists of retained transfers,
     * quarantined loads, waiting rounds; round tokens; per-proof release
     * counters), shared by every session of this node. */
    kvp_session_env_t env;
    kvp_list_t sessions; /* kvp_session_t, ready */
    kvp_list_t active;   /* sessions with transfers in flight (up->mark_active) */
    kvp_list_t flushq;   /* sessions with queued lookups or startable queued fetches */
    uint32_t n_sessions;
    uint64_t next_op_id;
    kvp_io_t xport_io;
    kvp_timer_t hold_timer;

    /* scratch for frames (owner thread only) */
    uint8_t *txbuf;
    size_t txcap;

    /* threads: commands in, events out. `owner` guards everything the node
     * thread owns; the node thread holds it except while it sleeps in the
     * loop, when a caller may take it and run its command itself
     * (kvp__node_exec's fast path). Order: owner before lock. */
    pthread_mutex_t owner;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    kvp_list_t cmds;
    pthread_t thread;
    bool thread_running, stopping;
    uint32_t waiters; /* threads in kvp_wait_events (kvp_node_destroy waits them out) */
    uint32_t wait_exit_delay_ms; /* seams: see kvp_node_seams_t */
    bool draining; /* node_drain began: no new session (it would outlive the drain) */
    int evfd;
    int pollfd; /* caller-driven mode: epoll over evfd + the loop (kvp_node_fd) */
    uint32_t *engine_pins; /* per slot: pins taken by kvp_get, not yet released */
    kvp_event_t *events;
    uint32_t ev_head, ev_count, ev_cap;
    uint64_t events_dropped;
    bool ev_signalled; /* evfd written since the queue was last drained (under lock) */
    bool ev_quiet; /* a waiter leads and takes the batch itself: evfd left alone (under lock) */

    struct kvp_kvevents *kvevents; /* KV-event publisher (events.h), or NULL */
    kvp_stats_t st; /* counters owned by the node (store/ctl stats merged on read) */
    kvp_ratelimit_t rl_proto, rl_cap, rl_local; /* rl_local: refusals of local readers */
    /* doors2 (kept.c): peers added with kvp_peer_add, kept across an idle close */
    kvp_list_t kept;
    uint32_t n_dormant; /* of them, idle-closed: not wanted by the ctl until woken */
};

/* thread.c (exec, progress, wait), ring.c (events), sessions.c (lookups) */
kvp_status_t kvp__node_exec(kvp_node_t *n, kvp_status_t (*fn)(kvp_node_t *, void *), void *arg);
/* kvp__node_exec for a command that only queues frames and bookkeeping
 * (lookups, a consumer's fetch): run on the fast path, it does not wake the
 * node thread unless transfers or landing loads need its polling. */
kvp_status_t kvp__node_exec_quiet(kvp_node_t *n, kvp_status_t (*fn)(kvp_node_t *, void *),
                                  void *arg);
kvp_status_t kvp__node_progress(kvp_node_t *n, int timeout_ms);
kvp_status_t kvp__node_take_events(kvp_node_t *n, kvp_event_t *out, uint32_t cap,
                                   uint32_t *n_out);
kvp_status_t kvp__node_wait_events(kvp_node_t *n, kvp_event_t *out, uint32_t cap, uint32_t *n_out,
                                   int32_t timeout_ms);
uint64_t kvp__node_now(const kvp_node_t *n);
void kvp__node_emit(kvp_node_t *n, const kvp_event_t *ev);
/* Issue 29 (api_external.c): the store's unpublish callback. */
void kvp__node_unpublished(void *arg, uint32_t slot);
kvp_session_t *kvp__node_find_session(kvp_node_t *n, const char *peer);
/* config.c: validation naming the field (kvp_last_error), the region
 * against the host's memory and /dev/shm. */
kvp_status_t kvp__config_check(const kvp_config_t *cfg);
/* The ctl settings kvp_node_reconfigure() may change, from a node config
 * (timings in ns, backoff, session cap, PSK: borrowed from c). */
void kvp__node_ctl_runtime(const kvp_config_t *c, kvp_ctl_config_t *cc);
/* Issue 27: the per-peer budgets left 0 take their defaults (kvpeer.h). */
void kvp__node_budget_defaults(kvp_config_t *c);
/* Issue 27: a listen address that is not loopback needs a psk unless
 * insecure is set (KVP_ERR_INVALID naming listen, psk_file, insecure).
 * loopback: the listen address is loopback (out, may be NULL). */
kvp_status_t kvp__config_check_gate(const kvp_config_t *cfg, bool *loopback);
bool kvp__addr_is_loopback(const char *addr);
/* The subset kvp_node_reconfigure() may change (called by the above). */
kvp_status_t kvp__config_check_runtime(const kvp_config_t *cfg);
void kvp__set_last_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void kvp__clear_last_error(void);
/* kvp_node_create failed after validation: keep a last error if none is set. */
void kvp__note_create_failure(kvp_status_t st);
uint64_t kvp__mem_available(void);

/* Between the node's own files (issue 31: node.c split along its seams);
 * nothing outside src/node/ calls these. */
/* thread.c: one poll round (commands, progress, completions, sleep). */
void kvp__node_round(kvp_node_t *n, int timeout_ms);
/* thread.c: the progress thread of KVP_THREAD_OWN, started and stopped. */
kvp_status_t kvp__node_thread_start(kvp_node_t *n);
void kvp__node_thread_stop(kvp_node_t *n);
/* thread.c: the loop's wakeup and the transport fd's callbacks. */
void kvp__node_wakeup_cb(void *arg);
void kvp__node_xport_io_cb(kvp_io_t *io, uint32_t events);
/* ring.c: write the event fd if events wait and nobody leads (under lock). */
void kvp__node_ev_signal_locked(kvp_node_t *n);
/* sessions.c: the upcalls of every session, the ctl's callbacks, and the end
 * of a session whose link is down (teardown; frees s). */
extern const kvp_session_up_t kvp__node_session_up;
void kvp__node_ctl_callbacks(kvp_node_t *n, kvp_ctl_callbacks_t *cb);
/* bye < 0: the link went down; else the node ends it now with BYE bye. */
void kvp__node_session_down(kvp_node_t *n, kvp_session_t *s, int bye, bool fault, const char *why);
/* hold.c: the hold timer (the session's hold cap, endpoint checks, idle
 * sessions). */
void kvp__node_hold_init(kvp_node_t *n);
void kvp__node_hold_start(kvp_node_t *n);
void kvp__node_check_endpoints(kvp_node_t *n);
/* kept.c (doors2): the peers added with kvp_peer_add (kept: an idle close
 * makes them dormant, not forgotten). add: kept (again), awake; drop: not
 * kept (false: it was not); sleep: dormant if kept (false: not kept);
 * wake: a dormant peer is awake again, and remote calls to it wait for its
 * session until now + wait_ns (true while they should); dormant: it is
 * dormant now; evict: the oldest
 * dormant peer is forgotten (false: none); foreach: the dormant ones. */
kvp_status_t kvp__node_kept_add(kvp_node_t *n, const char *addr);
bool kvp__node_kept_drop(kvp_node_t *n, const char *addr);
bool kvp__node_kept_sleep(kvp_node_t *n, const char *addr);
bool kvp__node_kept_dormant(kvp_node_t *n, const char *addr);
bool kvp__node_kept_wake(kvp_node_t *n, const char *addr, uint64_t now, uint64_t wait_ns);
bool kvp__node_kept_evict(kvp_node_t *n);
void kvp__node_kept_foreach(kvp_node_t *n, void (*cb)(void *arg, const char *addr), void *arg);
void kvp__node_kept_free(kvp_node_t *n);

#endif /* KVP_NODE_H */
