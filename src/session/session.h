/*
 * session.h -- the session layer (SPEC §2 layer 5) as the node sees it:
 * an opaque kvp_session_t per peer, the environment the node embeds and
 * fills (kvp_session_env_t), the upcalls, and the calls below. Nothing
 * else: the records (sessions, loads, transfers, rounds) and the calls the
 * session's own files share are in session_int.h, included only inside
 * src/session (and by the tests that look inside a session). Issue 31.
 *
 * A session ends only through kvp__session_close (graceful),
 * kvp__session_close_now (the shutdown drain) or kvp__session_link_down
 * (the link is gone), each followed by kvp__session_teardown once the link
 * is down; docs/DESIGN.md "Session lifecycle".
 */
#ifndef KVP_SESSION_H
#define KVP_SESSION_H

#include "kvpeer.h"
#include "common/common.h"
#include "ctl/ctl.h"
#include "store/store.h"
#include "transport/transport.h"
#include "wire/wire.h"

#include <stdatomic.h>
#include <string.h>
typedef struct kvp_session kvp_session_t;
typedef struct kvp_load kvp_load_t;
typedef struct kvp_xfer kvp_xfer_t;
typedef struct kvp_sround kvp_sround_t;
typedef struct kvp_lookup_op kvp_lookup_op_t;
typedef struct kvp_session_env kvp_session_env_t;

/* Which proof releases memory a WRITE may touch (STYLE §5). Every release
 * goes through kvp__release_* (session/release.c), which names, counts and
 * logs it; docs/DESIGN.md maps each to its rule of SPEC §7. */
typedef enum kvp_proof {
    KVP_PROOF_TERMINAL = 0,   /* the transport handed the transfer back as terminal */
    KVP_PROOF_FETCH_DONE = 1, /* the source finished writing (control channel) */
    KVP_PROOF_ABORT_ACK = 2,  /* the source stopped writing (control channel) */
    KVP_PROOF_FENCE = 3,      /* our endpoint to the source FORCE-closed on a fenceable path */
    KVP_PROOF_AM_REFUSE = 4,  /* AM path: our handler refuses the slots; nothing else writes them */
    KVP_PROOF_HOLD_CAP = 5,   /* no proof: the hold cap expired (slots marked suspect) */
    KVP_PROOF_NOT_SENT = 6,   /* the FETCH / transfer never left us: nothing can write or read */
    /* issue 27 item 8: the source's process exited (same host, direct shm;
     * its pid proven by SO_PEERCRED, watched by a pidfd): no CPU write of it
     * can reach our memory any more */
    KVP_PROOF_PROCESS_EXIT = 7,
    KVP_PROOF_COUNT = 8,
} kvp_proof_t;

const char *kvp__proof_str(kvp_proof_t p);

/* ------------------------------------------------- environment, upcalls */

/* What a session may ask of the layer above (the node), and nothing else
 * (the shape of ctl.h's kvp_ctl_callbacks_t). Called on the owner thread;
 * none of them may free or tear down the session synchronously. */
typedef struct kvp_session_up {
    /* An outcome (lookup, load) for the embedding's event ring. */
    void (*emit)(void *arg, const kvp_event_t *ev);
    /* The session has transfers in flight: poll its completions each round
     * (kvp__server_on_xfer_done) until it has none. */
    void (*mark_active)(void *arg, kvp_session_t *s);
    /* Work to start at the end of the current call, never inside the
     * caller's chain: kvp__client_flush_lookups + kvp__client_start_queued. */
    void (*schedule)(void *arg, kvp_session_t *s);
} kvp_session_up_t;

/* The session layer's environment: what every session of one node shares.
 * The node embeds it and fills it at create; borrowed pointers stay valid
 * until the node is destroyed, after every session. The lists hold records
 * that outlive their session (SPEC §7): the node's hold cap, poll of
 * retired transfers and shutdown drain walk them. */
typedef struct kvp_session_env {
    const kvp_config_t *cfg;
    const char *name; /* log name */
    const kvp_clock_t *clock;
    kvp_loop_t *loop;
    kvp_store_t *store;
    kvp_xport_t *xport;
    kvp_stats_t *st;           /* the node's counters */
    kvp_ratelimit_t *rl_proto; /* the node's protocol-error log limit */
    const kvp_session_up_t *up;
    void *up_arg;

    kvp_list_t waiting;     /* kvp_sround_t waiting for commits (pending lookups, parked) */
    _Atomic uint32_t parked; /* of those, PARKED: kvp_parked_keys reads it from any thread */
    kvp_list_t retained;    /* kvp_xfer_t retained after their session ended, with their pins */
    kvp_list_t quarantined; /* kvp_load_t whose slots are QUARANTINED awaiting proof */
    kvp_list_t landing;     /* kvp_load_t LANDING: the node calls kvp__client_check_landing
                             * after each transport progress while it is not empty */
    uint32_t n_retained;
    uint32_t supply_pins; /* lookup-pinned supply of every session (budget.c) */
    uint64_t round_bytes; /* memory of every session's source rounds (budget.c) */
    uint64_t next_round;                /* round tokens, unique per node */
    uint64_t releases[KVP_PROOF_COUNT]; /* slots / pins released, per proof (release.c) */
    /* issue 29 step 2 (server_wanted.c): KVP_EV_WANTED op ids, and the ops
     * outstanding (a list apart: a round's size stays what the budgets and
     * the simulator's digests know) */
    uint64_t next_wanted;
    struct kvp_wanted *wanted;
    /* LOOKUP key-rate buckets of peers whose session ended, by peer id
     * (keyrate.c): a reconnect does not refill them */
    struct kvp_keyrate *keyrate;
    uint32_t n_keyrate, cap_keyrate;
    /* hashes half of a big load's blocks at FETCH_DONE (client_outcome.c);
     * started at the first such load, joined by kvp__session_env_fini */
    kvp_helper_t *verify_helper;
    /* issue 29: a big load's verify off the node thread (client_outcome.c):
     * a thread hashing one half (verify_helper the other), and the load
     * being verified (at most one; verify_helper is busy with it meanwhile) */
    kvp_helper_t *verifier;
    struct kvp_load *verifying;
    kvp_list_t verify_wait; /* big loads (LANDING) waiting their turn at the verifier, FIFO */
    atomic_bool verify_held; /* tests only: the verifier does not start hashing while set;
                              * a give-up that must wait for its digests ends it */
    /* scratch of the transport's poll and poll_retired (owner thread only;
     * issue 31: was the node's) */
    kvp_xfer_result_t results[256];
} kvp_session_env_t;

/* Initialise the lists and counters (the node fills the pointers). */
void kvp__session_env_init(kvp_session_env_t *e);
/* Free what the env allocated (keyrate.c's table); after every session. */
void kvp__session_env_fini(kvp_session_env_t *e);

/* ----------------------------------------------- the node's list links */

/* The one part of a session the node writes: the links of its own lists
 * (the session never walks them). First member of struct kvp_session, so a
 * session and its links are the same address (session_int.h asserts it). */
typedef struct kvp_session_links {
    kvp_list_t node_link;   /* the node's session table */
    kvp_list_t active_link; /* sessions with transfers in flight (up->mark_active) */
    kvp_list_t flush_link;  /* lookups to send, queued fetches to start (up->schedule) */
} kvp_session_links_t;

static inline kvp_session_links_t *kvp__session_links(kvp_session_t *s)
{
    return (kvp_session_links_t *)(void *)s;
}

/* The session whose link `member` (node_link, active_link, flush_link) is p. */
#define KVP_SESSION_OF(p, member) \
    ((kvp_session_t *)(void *)KVP_CONTAINER_OF(p, kvp_session_links_t, member))

/* ------------------------------------------------------ the node's calls */

/* session.c: lifecycle. Register the peer's data-transport blob and make a
 * READY session on `link` (borrowed until teardown). The caller (the node)
 * enforces its session limit and links the session into its table. */
kvp_status_t kvp__session_create(kvp_session_env_t *e, kvp_link_t *link,
                                 const kvp_msg_hello_t *hello, const void *blob, size_t blob_len,
                                 kvp_session_t **out);
/* The ctl's callbacks of the session's link: a frame; a PONG (rtt_ns: the
 * PING's age; ends a probation begun before that PING). */
void kvp__session_on_frame(kvp_session_t *s, const kvp_msg_t *m);
void kvp__session_on_pong(kvp_session_t *s, uint64_t rtt_ns);
/* What a session's teardown left behind and released (SPEC §7.1, §7.4). */
typedef struct kvp_session_close {
    uint32_t loads_failed;      /* loads in flight, failed for routing (one outcome each) */
    uint32_t loads_quarantined; /* now on env->quarantined: proof or the hold cap frees them */
    uint32_t slots_quarantined; /* their QUARANTINED destination slots */
    uint32_t slots_fenced;      /* released by the completed fence (KVP_PROOF_FENCE) */
    uint32_t slots_refused;     /* released at once by AM refusal (KVP_PROOF_AM_REFUSE) */
    uint32_t xfers_retained;    /* still running: on env->retained, pins kept */
    uint32_t pins_retained;     /* the source pins those transfers keep */
    uint32_t xfers_released;    /* terminal at the WAIT cancel: pins dropped (TERMINAL) */
    bool fenced;                /* the fence was proof for this peer */
    uint32_t slots_exited;      /* issue 27: released, the source process exited (PROCESS_EXIT) */
} kvp_session_close_t;
/* The only ways a session ends (issue 31). kvp__session_close: gracefully
 * (READY -> CLOSING, BYE `reason`; its end follows when the link is down).
 * kvp__session_end: its link went down (the ctl's on_down: bye < 0), or the
 * node ends it at once (the shutdown drain: the link closed with BYE `bye`
 * and forgotten); the caller unlinked it from its tables. DOWN, then
 * teardown per SPEC §7 (fault: it died by a fault); *out says what is
 * retained, quarantined and released; the session is freed. */
void kvp__session_close(kvp_session_t *s, kvp_bye_reason_t reason);
void kvp__session_end(kvp_session_t *s, int bye, bool fault, const char *why,
                      kvp_session_close_t *out);
/* Our endpoint to the peer failed (transport peer_status): close it as a
 * fault (nothing can be written through it any more). False: it is fine,
 * or the session is not open. */
bool kvp__session_check_endpoint(kvp_session_t *s);
/* Sibling probation (SPEC §8): a READY session on probation answers MISS to
 * new work until a fresh PONG. */
void kvp__session_probation(kvp_session_t *s, bool on);

/* Accessors: READY (the link is up, no close asked, probation aside);
 * READY and not on probation (lookups and fetches may use it); the peer's
 * id; a LOOKUP of ours awaits its answer; open, without work of either
 * role, and without work for at least idle_ns at `now`. */
bool kvp__session_open(const kvp_session_t *s);
bool kvp__session_ready(const kvp_session_t *s);
const char *kvp__session_peer(const kvp_session_t *s);
bool kvp__session_lookup_due(const kvp_session_t *s);
bool kvp__session_idle_for(const kvp_session_t *s, uint64_t now, uint64_t idle_ns);
/* What kvp_node_peers / peer_states / stats show of a session. */
typedef struct kvp_session_info {
    const char *peer, *instance; /* valid while the session is */
    kvp_data_path_t path;
    bool open, probation;
    uint64_t rtt_ns, bytes_inflight;
    uint32_t loads_inflight; /* loads sent, not settled (not the queued ones) */
} kvp_session_info_t;
void kvp__session_info(const kvp_session_t *s, kvp_session_info_t *out);

/* The consumer's calls (client.c, lookup.c): one request of the embedding
 * on the session. Lookups leave frames for the flush (up->schedule). */
typedef enum kvp_session_call {
    KVP_CALL_LOOKUP = 0,        /* keys -> results (merged per poll round) */
    KVP_CALL_LOOKUP_PREFIX = 1, /* KVP_LOOKUP_F_PREFIX, results may be NULL */
    KVP_CALL_LEASE_RENEW = 2,   /* KVP_LOOKUP_F_RENEW, no keys, sent now; no op id */
    KVP_CALL_FETCH = 3,         /* flags, block_status */
    KVP_CALL_FETCH_INTO = 4,    /* issue 29: + slots, the embedding's chunks lent */
} kvp_session_call_t;
typedef struct kvp_session_req {
    kvp_session_call_t call;
    uint64_t request_id;
    const uint8_t *keys;
    const uint32_t *lens;
    uint32_t n;
    uint32_t flags;
    uint8_t *results;
    int32_t *block_status;
    const uint32_t *slots;
} kvp_session_req_t;
kvp_status_t kvp__session_request(kvp_session_t *s, uint64_t op_id, const kvp_session_req_t *r);
/* The lookups queued this round go out, queued fetches start while the
 * byte budget allows (the node's flush, at the end of its call). */
void kvp__session_flush(kvp_session_t *s);
/* kvp_cancel: the session's unpublished load op_id aborts (CANCELED).
 * KVP_ERR_NOT_FOUND: no such load here, or its outcome is out. */
kvp_status_t kvp__session_cancel(kvp_session_t *s, uint64_t op_id);
/* kvp_finish_request: both roles let the request go (our loads: one
 * failure outcome each, F7; our supply and parked demand, F11). */
void kvp__session_finish_request(kvp_session_t *s, uint64_t request_id);
/* Shutdown drain: fetches waiting for budget never start (CLOSED). */
void kvp__client_fail_queued(kvp_session_t *s, kvp_status_t why);
/* The session's transfers reported terminal by the transport's poll;
 * true while some are still in flight. */
bool kvp__session_poll_xfers(kvp_session_t *s);

/* Of the whole environment: after each transport progress, settle the
 * LANDING loads (env->landing) whose blocks all landed or whose endpoint
 * failed, and the load verified off the node thread (env->verifying) once
 * its digests are all hashed (the last half wakes the node's loop); a key
 * committed locally (pending lookups, parked demand); the embedding's keys
 * wanted (issue 29 step 2). */
void kvp__client_check_landing(kvp_session_env_t *e);
void kvp__server_on_commit(kvp_session_env_t *e, const void *key, uint32_t key_len);
kvp_status_t kvp__server_wanted_keys(kvp_session_env_t *e, uint64_t op_id, uint8_t *keys,
                                     uint32_t *key_lens, uint32_t cap, uint32_t *n_out);
kvp_status_t kvp__server_wanted_done(kvp_session_env_t *e, uint64_t op_id);
uint32_t kvp__server_parked_keys(kvp_session_env_t *e, uint8_t *keys, uint32_t *key_lens,
                                 uint32_t cap);

/* held.c: what outlives its session (SPEC §7): transfers retained with their
 * pins until the transport hands them back (poll_retired: each round), and
 * quarantined loads until a proof; hold_check (the node's hold timer):
 * those past the hold cap force-released (logged, counted in
 * st->force_releases), quarantined loads of an exited same-host source
 * released (issue 27); held_end: everything force-released (`why`, the
 * shutdown drain's end); held_foreach: what is held, for kvp_node_held
 * (kind 1 a retained transfer: id; kind 2 a quarantined slot: slot, op id). */
void kvp__session_poll_retired(kvp_session_env_t *e);
void kvp__session_hold_check(kvp_session_env_t *e, uint64_t now);
void kvp__session_held_end(kvp_session_env_t *e, const char *why);
typedef void (*kvp_held_cb_t)(void *arg, int kind, uint32_t slot, uint64_t id, uint64_t since_ns,
                              const char *peer);
void kvp__session_held_foreach(kvp_session_env_t *e, kvp_held_cb_t cb, void *arg);

#endif /* KVP_SESSION_H */
