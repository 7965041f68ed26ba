/*
 * session_int.h -- the session layer's inside (SPEC §2 layer 5; issue 31):
 * its records and the calls its files share. Included only in src/session/
 * and by tests that look inside a session; the node sees session.h. One
 * session per peer, with the consumer role (client.c), the source role
 * (server.c), lifecycle, dispatch and teardown (session.c), the node's
 * entries (session_node.c), what outlives a session (held.c) and the one
 * place memory a WRITE may touch is released (release.c).
 *
 * Below the node: a session uses the layers under it (store, transport,
 * ctl links, wire) through kvp_session_env_t, and calls up only through the
 * kvp_session_up_t table. Nothing here includes node/node.h.
 *
 * Records that hold memory a WRITE may touch, and the proof that frees them:
 *
 *   kvp_load_t    consumer side. Its destination slots are FILLING from the
 *                 FETCH until FETCH_DONE (commit / abandon) or ABORT_ACK
 *                 (abandon). If the outcome becomes unknown (session fault,
 *                 probation, escalation, endpoint error) they become
 *                 QUARANTINED and the load moves to env->quarantined; they
 *                 return to FREE only on proof (FETCH_DONE / ABORT_ACK on a
 *                 live session, a completed fence on a fenceable path, the
 *                 exit of a same-host source's process, issue 27) or at
 *                 the hold cap (then suspect). The load's outcome is
 *                 published exactly once, separately from slot release.
 *
 *   kvp_xfer_t    source side: one posted transfer and its store job (the
 *                 pinned source slots it reads). The pins are dropped only
 *                 when the transport hands the transfer back as terminal
 *                 (poll on the live peer, poll_retired after the session
 *                 ended) or at the hold cap (force_release, logged).
 *                 A transfer outliving its session is "retained" on
 *                 env->retained.
 *
 *   kvp_sround_t  source side: one round (lookup->fetch generation) of a
 *                 request on a session: supply pinned by LOOKUP, demand from
 *                 FETCH, parked demand, the transfer in flight.
 */
#ifndef KVP_SESSION_INT_H
#define KVP_SESSION_INT_H

#include "session/session.h"

#include <stddef.h>
#include <string.h>

static inline uint64_t kvp__env_now(const kvp_session_env_t *e)
{
    return kvp_clock_now(e->clock);
}

static inline void kvp__env_emit(kvp_session_env_t *e, const kvp_event_t *ev)
{
    e->up->emit(e->up_arg, ev);
}

/* ------------------------------------------------------------- records */

typedef struct kvp_key_buf {
    uint8_t len;
    uint8_t data[KVP_KEY_MAX];
} kvp_key_buf_t;

typedef enum kvp_load_phase {
    KVP_LOAD_QUEUED = 0,   /* on session->fetchq waiting for byte budget; nothing reserved */
    KVP_LOAD_SENT = 1,     /* FETCH sent; load timer running */
    KVP_LOAD_ABORTING = 2, /* ABORT sent; re-sent until ABORT_ACK / FETCH_DONE */
    KVP_LOAD_LANDING = 3,  /* FETCH_DONE here; AM path: some blocks not yet landed;
                            * or (verify set) its blocks hashed off the node thread;
                            * on env->landing, timer = the landing bound */
    KVP_LOAD_SETTLED = 4,  /* slots committed/abandoned or quarantined */
} kvp_load_phase_t;

/* What the load's reserved destination slots are waiting for, the second
 * half of its state (client.c's header: the phases). Once the outcome is
 * unknown (kvp__client_fail_unknown) FILLING moves, exactly once, to HELD
 * or REFUSED; the phase goes on (an ABORTING load may hold its slots). */
typedef enum kvp_load_slots {
    KVP_LOAD_SLOTS_FILLING = 0, /* reserved FILLING slots: FETCH_DONE or ABORT_ACK releases */
    KVP_LOAD_SLOTS_HELD = 1,    /* QUARANTINED awaiting proof or the hold cap */
    KVP_LOAD_SLOTS_REFUSED = 2, /* AM path: refused by our handler, released (AM_REFUSE) */
} kvp_load_slots_t;

typedef struct kvp_load_block {
    kvp_key_buf_t key;
    kvp_slot_ref_t dst;
    bool reserved; /* dst holds a FILLING/QUARANTINED slot of ours */
    bool sent;     /* FETCH_DONE: the source sent it (ok), with this digest */
    kvp_digest_t digest;
} kvp_load_block_t;

/* Fetches waiting for the bytes-in-flight budget of their session (SPEC §8
 * "further fetches queue, then MISS"): at most this many per session, each
 * for at most half the load timeout (kvp__client_fetch). */
#define KVP_FETCHQ_MAX 1024u

struct kvp_load {
    kvp_list_t link; /* session->fetchq (QUEUED), session->loads, or env->quarantined */
    kvp_list_t land_link; /* LANDING: env->landing (AM blocks), or env->verify_wait */
    uint32_t land_next;   /* LANDING: blocks before this one are known landed (or not sent) */
    int32_t done_status;  /* LANDING: the FETCH_DONE's status */
    struct load_verify *verify; /* LANDING: its digests being hashed (client_outcome.c) */
    bool verify_queued;         /* LANDING: on env->verify_wait, its verify not started */
    kvp_session_env_t *env;
    kvp_session_t *sess; /* NULL once the session is gone */
    kvp_xpeer_id_t xpeer; /* the transport peer WRITEs come through (fence scope) */
    uint64_t op_id, request_id, round;
    uint32_t flags;
    kvp_load_phase_t phase; /* load_set_phase() only */
    kvp_load_slots_t slots; /* load_set_slots() only (issue 31: were two booleans) */
    bool published;   /* the single outcome was published */
    bool exit_held;   /* issue 27: holds the transport's exit watch of xpeer (exit_hold): HELD */
    uint32_t n;
    kvp_load_block_t *blocks;
    int32_t *block_status; /* caller-owned, may be NULL */
    uint64_t bytes;
    uint64_t queued_ns; /* kvp_fetch() of a fetch that had to queue, else 0 */
    uint64_t started_ns, quarantined_ns, abort_started_ns;
    char peer[KVP_WIRE_STR_MAX + 1];
    kvp_timer_t timer; /* queue wait, load timeout, then abort resend / abort-ack timeout */
    /* Issue 29, kvp_fetch_into: the destination slots are the embedding's,
     * lent to this load (kvp_store_lend) from the call until their release;
     * n_held of them were still held when the outcome was published (their
     * block_status says KVP_ERR_BUSY): their release is the
     * KVP_EV_SLOTS_RELEASED event of op_id (status KVP_ERR_TIMEOUT when the
     * hold cap, not a proof, released them). */
    bool external;
    bool cap_released;
    uint32_t n_held;
};

struct kvp_xfer {
    kvp_list_t link; /* session->xfers, or env->retained */
    kvp_xfer_id_t id;
    kvp_sround_t *round; /* NULL once retained */
    uint32_t n;
    kvp_slot_ref_t *src; /* the store job: pinned source slots */
    uint64_t posted_ns, retained_ns;
    char peer[KVP_WIRE_STR_MAX + 1];
};

typedef enum kvp_sround_phase {
    KVP_SR_LOOKUP_PENDING = 0, /* LOOKUP with FILLING keys: answer deferred */
    KVP_SR_SUPPLIED = 1,       /* LOOKUP answered; supply pinned until FETCH */
    KVP_SR_PARKED = 2,         /* WAIT_FOR_SUPPLY demand waiting for commits */
    KVP_SR_TRANSFERRING = 3,   /* transfer posted */
    KVP_SR_ABORTING = 4,       /* ABORT received; waiting for the transfer */
    KVP_SR_FINISHED = 5,       /* FETCH_DONE or ABORT_ACK sent */
} kvp_sround_phase_t;

/* One supply entry per key the round holds or waits for: a LOOKUP's hits
 * and pending keys only (issue 27: a miss costs no memory), in key order. */
typedef struct kvp_supply {
    kvp_key_buf_t key;
    kvp_slot_ref_t ref;
    uint32_t idx; /* the key's position in the LOOKUP (supply_from_store: n_keys) */
    bool pinned;  /* holds one pin, counted in the peer's supply-pin budget */
    bool pending; /* LOOKUP_PENDING: key was FILLING */
} kvp_supply_t;

typedef struct kvp_demand {
    kvp_key_buf_t key;
    uint32_t dst_slot, dst_gen;
    int32_t supply; /* index into supply[], -1 = not (yet) supplied */
} kvp_demand_t;

struct kvp_sround {
    kvp_list_t link; /* session->srounds, or session->srounds_done once FINISHED */
    kvp_list_t wait_link; /* env->waiting (pending lookups, parked demand) */
    kvp_session_t *sess;
    uint64_t request_id, round;
    kvp_sround_phase_t phase;
    uint32_t n_keys; /* keys of the LOOKUP (LOOKUP_RESP answers this many) */
    uint32_t n_supply, cap_supply;
    kvp_supply_t *supply;
    uint64_t mem;      /* bytes accounted to the peer's round memory (budget.c) */
    uint64_t born_ns;  /* the lease's start: it never runs past born + max_lease_ms */
    bool limited;      /* something was refused at a budget: the answer says limit */
    bool lease_capped; /* counted once in leases_capped */
    uint32_t n_demand;
    kvp_demand_t *demand;
    uint32_t flags;
    uint16_t lookup_flags;  /* KVP_LOOKUP_F_PREFIX: only the held prefix is supplied */
    kvp_xfer_t *xfer;       /* in flight, or NULL */
    int32_t final_status;   /* what FETCH_DONE said / will say */
    bool sent_done, sent_ack;
    uint8_t want;           /* issue 29 step 2: KVP_WANT_* (server_wanted.c), in padding */
    kvp_digest_t *digests;  /* per demand, for FETCH_DONE */
    uint8_t *block_ok;
    kvp_timer_t timer;      /* pending deadline / supply-pin / parked demand */
};

/* Client-side lookup: aggregated per (session, request) per poll round. */
struct kvp_lookup_op {
    kvp_list_t link; /* session->lookups_queued, then session->lookups_sent */
    uint64_t op_id, request_id, round;
    uint32_t n;
    kvp_key_buf_t *keys;
    uint8_t *results; /* caller-owned, or owned by the op when owns_results */
    bool owns_results; /* kvp_lookup_prefix() without a results array */
    uint16_t mode;     /* LOOKUP header flags (KVP_LOOKUP_F_PREFIX); such ops are never merged */
    kvp_timer_t timer; /* answer deadline */
    kvp_session_t *sess;
};

/* What the consumer learned from the latest lookup of a request. */
typedef struct kvp_creq {
    kvp_list_t link;
    uint64_t request_id;
    uint64_t round;  /* latest lookup round answered */
    bool fetched;    /* that round already carries a FETCH */
} kvp_creq_t;

/* Session lifecycle (session.c, kvp__session_set_state):
 *
 *   kvp__session_create          close asked: kvp__session_fault, idle
 *   ------------------> READY -----------------------------------> CLOSING
 *                         |      timeout, kvp_peer_remove              |
 *                         |                                            |
 *                         | link down (ctl_on_down), node shutdown     | link down
 *                         +------------------> DOWN <------------------+
 *                                  (kvp__session_teardown, then freed)
 *
 * Probation (SPEC §8) is orthogonal: a READY session on probation answers
 * MISS to new work until a fresh PONG. */
typedef enum kvp_session_state {
    KVP_SESS_READY = 0,   /* link up: both roles serve; frames dispatched */
    KVP_SESS_CLOSING = 1, /* close asked, link closing: frames ignored, no new work */
    KVP_SESS_DOWN = 2,    /* link gone (s->link == NULL): teardown runs, then freed */
} kvp_session_state_t;

struct kvp_session {
    kvp_session_links_t nl; /* the node's list links (session.h): first, always */
    kvp_session_env_t *env; /* borrowed: outlives every session */
    kvp_link_t *link; /* control link; NULL once down */
    char peer_id[KVP_WIRE_STR_MAX + 1];
    char instance_id[KVP_WIRE_STR_MAX + 1];
    uint32_t peer_num_blocks, peer_block_size;
    kvp_xpeer_id_t xpeer;
    kvp_data_path_t path;
    kvp_session_state_t state; /* kvp__session_set_state() only */
    bool probation;
    /* A frame of the peer's own ready session arrived (a node frame, or a
     * PONG, answered only by a READY link): the peer had registered our blob,
     * so its endpoint to us existed. Only then does our fence cover it. */
    bool peer_heard;
    uint64_t probation_ns;
    uint64_t bytes_inflight; /* consumer side: bytes of loads not settled */
    /* client role */
    kvp_list_t lookups_queued, lookups_sent, loads, creqs;
    kvp_list_t fetchq; /* QUEUED loads, FIFO, waiting for bytes_inflight budget */
    uint32_t n_fetchq;
    /* server role */
    kvp_list_t srounds, xfers;
    /* FINISHED rounds kept to replay their answer (F5) until their timer
     * frees them; apart so the live list stays short (kvp__server_*). */
    kvp_list_t srounds_done;
    uint64_t sround_max; /* the highest round token seen, if sround_seen */
    bool sround_seen;
    uint32_t xfers_inflight;
    /* This peer's share of the node (issue 27; budget.c): */
    uint32_t supply_pins; /* slots its rounds hold pinned (not yet fetched) */
    uint32_t n_rounds;    /* its live rounds (not FINISHED) */
    uint64_t round_bytes; /* memory of its rounds, FINISHED ones included */
    /* its LOOKUP key rate (max_lookup_keys_per_sec): a token bucket in
     * nano-keys (1e9 per key), full when the peer id is new, else what its
     * last session left (keyrate.c) */
    uint64_t key_tokens, key_refill_ns;
    bool key_bucket_set;
    uint64_t last_work_ns;
    kvp_ratelimit_t rl;       /* repeated log lines of this peer */
    kvp_ratelimit_t rl_limit; /* this peer's refusals at a limit of SPEC §8 */
};
_Static_assert(offsetof(struct kvp_session, nl) == 0, "kvp__session_links: nl first");

/* -------------------------------------------------------------- calls */

/* Serialise and send a message on a session (stamped by ctl). */
kvp_status_t kvp__session_send(kvp_session_t *s, kvp_msg_t *m);
void kvp__session_mark_active(kvp_session_t *s);
/* Close a session from inside a callback: BYE, teardown runs from on_down. */
void kvp__session_fault(kvp_session_t *s, kvp_bye_reason_t reason, const char *why);

/* session.c: lifecycle and dispatch (the node's calls: session.h).
 * kvp__session_end's parts: the link went down (unbound, DOWN), or is
 * closed now with BYE `reason` and forgotten (DOWN, no on_down); then the
 * teardown (state DOWN, s->link NULL). */
void kvp__session_link_down(kvp_session_t *s);
void kvp__session_close_now(kvp_session_t *s, kvp_bye_reason_t reason);
void kvp__session_teardown(kvp_session_t *s, bool fault, const char *why,
                           kvp_session_close_t *out);
/* READY: the link is up and no close was asked (probation aside). */
static inline bool kvp__sess_open(const kvp_session_t *s)
{
    return s->state == KVP_SESS_READY;
}
/* The one place a session changes state; asserts the diagram above. */
void kvp__session_set_state(kvp_session_t *s, kvp_session_state_t to);
/* No work of either role in the session: loads (queued or not), lookups,
 * rounds, transfers (the node's idle close). */
bool kvp__session_idle(const kvp_session_t *s);
/* client.c + lookup.c: the consumer role */
/* Keys given by a caller: 1..KVP_WIRE_LIST_MAX keys of 1..KVP_KEY_MAX bytes. */
kvp_status_t kvp__client_check_keys(const uint8_t *keys, const uint32_t *lens, uint32_t n);
/* What the consumer learned from the latest lookup of a request (created
 * when `create`; NULL if absent or out of memory). Freed at teardown or
 * when the request finishes. */
kvp_creq_t *kvp__client_creq(kvp_session_t *s, uint64_t request_id, bool create);
/* Every queued or sent lookup of the session answers `why` (lookup.c). */
void kvp__client_fail_lookups(kvp_session_t *s, kvp_status_t why);
static inline void kvp__key_copy(kvp_key_buf_t *dst, const uint8_t *data, uint32_t len)
{
    dst->len = (uint8_t)len;
    memcpy(dst->data, data, len);
}
kvp_status_t kvp__client_lookup(kvp_session_t *s, uint64_t op_id, uint64_t request_id,
                                const uint8_t *keys, const uint32_t *lens, uint32_t n,
                                uint8_t *results);
/* Prefix mode (KVP_LOOKUP_F_PREFIX): one LOOKUP of its own; the event's
 * n_ok is the held prefix length. results may be NULL. */
kvp_status_t kvp__client_lookup_prefix(kvp_session_t *s, uint64_t op_id, uint64_t request_id,
                                       const uint8_t *keys, const uint32_t *lens, uint32_t n,
                                       uint8_t *results);
/* Lease heartbeat: a LOOKUP with KVP_LOOKUP_F_RENEW and no keys, sent now. */
kvp_status_t kvp__client_lease_renew(kvp_session_t *s, uint64_t request_id);
void kvp__client_flush_lookups(kvp_session_t *s);
/* Start queued fetches (FIFO) while the session's byte budget allows. */
void kvp__client_start_queued(kvp_session_t *s);
kvp_status_t kvp__client_fetch(kvp_session_t *s, uint64_t op_id, uint64_t request_id,
                               const uint8_t *keys, const uint32_t *lens, uint32_t n,
                               uint32_t flags, int32_t *block_status);
/* flags: the LOOKUP_RESP header's (KVP_LOOKUP_F_LIMIT: the op's event says
 * KVP_ERR_LIMIT, its hits kept). */
/* Issue 29: kvp_fetch_into. `slots` (n) are the embedding's chunk indices,
 * lent to the load now: KVP_ERR_INVALID (nothing lent) if one is out of
 * range, repeated, or not the embedding's (lent or published). */
kvp_status_t kvp__client_fetch_into(kvp_session_t *s, uint64_t op_id, uint64_t request_id,
                                    const uint8_t *keys, const uint32_t *lens, uint32_t n,
                                    const uint32_t *slots, uint32_t flags, int32_t *block_status);
void kvp__client_on_lookup_resp(kvp_session_t *s, const kvp_msg_lookup_resp_t *m,
                                uint16_t flags);
void kvp__client_on_fetch_done(kvp_session_t *s, const kvp_msg_fetch_done_t *m);
void kvp__client_on_abort_ack(kvp_session_t *s, const kvp_msg_abort_t *m);
/* The load (SENT, ABORTING or QUEUED) of this session with this op id. */
kvp_load_t *kvp__client_find_load(kvp_session_t *s, uint64_t op_id);
void kvp__client_abort(kvp_load_t *l, kvp_status_t why);
void kvp__client_finish_request(kvp_session_t *s, uint64_t request_id);
/* Outcome unknown (fault, probation, endpoint error): publish routing
 * failure, quarantine the load's slots. */
void kvp__client_fail_unknown(kvp_load_t *l, kvp_status_t why);
void kvp__client_teardown(kvp_session_t *s, bool fault, kvp_session_close_t *out);
void kvp__load_publish(kvp_load_t *l, kvp_status_t st, uint32_t n_ok);
/* Release a quarantined load's slots by `proof` (KVP_PROOF_HOLD_CAP: the
 * slots become suspect). Frees it. */
void kvp__load_release_quarantine(kvp_load_t *l, kvp_proof_t proof);
/* Issue 27: release every load on env->quarantined from `xpeer` (0: from
 * any peer) whose source process the transport proves exited
 * (KVP_PROOF_PROCESS_EXIT). Returns the slots released. */
uint32_t kvp__client_release_exited(kvp_session_env_t *e, kvp_xpeer_id_t xpeer);
void kvp__load_free(kvp_load_t *l);
/* client.c's load machine, shared with client_outcome.c (issue 31): the
 * two setters (checked by load_check() in debug builds), the AM refusal of
 * a block, every FILLING slot -> FREE by `proof`, a load by its round, and
 * a LANDING load that cannot wait any longer (frees it). */
void kvp__load_set_phase(kvp_load_t *l, kvp_load_phase_t to);
void kvp__load_set_slots(kvp_load_t *l, kvp_load_slots_t to);
void kvp__load_block_refuse(kvp_load_t *l, const kvp_load_block_t *b);
void kvp__load_abandon_all(kvp_load_t *l, kvp_proof_t proof);
kvp_load_t *kvp__load_find(kvp_session_t *s, uint64_t round, uint64_t request_id);
void kvp__load_landing_give_up(kvp_load_t *l);

/* server.c: the source role */
void kvp__server_on_lookup(kvp_session_t *s, const kvp_msg_lookup_t *m, uint16_t flags);
void kvp__server_on_fetch(kvp_session_t *s, const kvp_msg_fetch_t *m);
void kvp__server_on_abort(kvp_session_t *s, const kvp_msg_abort_t *m);
/* Transfers of this session reported terminal by poll. */
void kvp__server_on_xfer_done(kvp_session_t *s, kvp_xfer_id_t id, kvp_status_t st);
void kvp__server_finish_request(kvp_session_t *s, uint64_t request_id);
/* Teardown: cancel in WAIT mode; running transfers move to env->retained. */
void kvp__server_teardown(kvp_session_t *s, kvp_session_close_t *out);
/* Unlink and free a transfer, dropping its source pins by `proof`. */
void kvp__xfer_release(kvp_session_env_t *e, kvp_xfer_t *x, kvp_proof_t proof);
/* The same for a transfer on e->retained (the one place n_retained drops;
 * kvp__server_teardown, the one place it grows). */
void kvp__xfer_release_retained(kvp_session_env_t *e, kvp_xfer_t *x, kvp_proof_t proof);
/* server.c's rounds, shared with server_lookup.c (the LOOKUP answer): */
kvp_sround_t *kvp__sround_new(kvp_session_t *s, uint64_t request_id, uint64_t round,
                              uint32_t cap_supply);
void kvp__sround_free(kvp_sround_t *r);
void kvp__sround_set_phase(kvp_sround_t *r, kvp_sround_phase_t to);
kvp_sround_t *kvp__sround_find(kvp_session_t *s, uint64_t round);
/* A new live round with `extra` bytes beyond its record fits the peer's
 * budgets (its finished rounds give way first). */
bool kvp__server_round_admit(kvp_session_t *s, uint64_t extra);
/* server_lookup.c: renew the pin lease of the request's SUPPLIED rounds;
 * answer a LOOKUP_PENDING round now (pending keys MISS). */
void kvp__server_lease_renew(kvp_session_t *s, uint64_t request_id);
void kvp__server_lookup_resolve(kvp_sround_t *r);

/* server_wanted.c, issue 29 step 2 ("keys wanted", cfg->external_wanted):
 * a LOOKUP's unpublished keys wait for the embedding. */
enum {
    KVP_WANT_NO = 0,      /* unpublished keys answer MISS */
    KVP_WANT_MAY = 1,     /* unpublished keys become wanted (pending) */
    KVP_WANT_REFUSED = 2, /* max_wanted_ops_per_peer: MISS + limit */
    KVP_WANT_RAISED = 3,  /* KVP_EV_WANTED out: a record in env->wanted */
    KVP_WANT_DONE = 4,    /* answered by kvp_wanted_done (record until settled) */
};
/* Whether round r (new, of session s) may want keys: external_wanted and
 * the peer under max_wanted_ops_per_peer (else KVP_WANT_REFUSED, counted). */
uint8_t kvp__server_want_admit(kvp_session_t *s);
/* r waits for wanted keys (LOOKUP_PENDING, timer set): raise KVP_EV_WANTED. */
void kvp__server_wanted_raise(kvp_sround_t *r);
/* At resolve: count r's wanted keys answered MISS (and the deadline). */
void kvp__server_wanted_settle(kvp_sround_t *r);
/* r is freed: drop its op record, if any (kvp__sround_free). */
void kvp__server_wanted_forget(kvp_sround_t *r);
/* env->parked as r goes to phase `to` (kvp__sround_set_phase) or is freed
 * (to = KVP_SR_FINISHED, kvp__sround_free). */
void kvp__server_parked_count(const kvp_sround_t *r, kvp_sround_phase_t to);

/* budget.c: the per-peer budgets of the source role (issue 27). Each
 * refusal is counted and logged (rate-limited) naming budget and peer. */
/* sp now holds a pin (taken by the caller): counted, if the budgets allow;
 * else false and the caller unpins (refusal counted, r->limited set). */
bool kvp__budget_pin_take(kvp_sround_t *r, kvp_supply_t *sp);
/* sp's pin was dropped or moved to a transfer: uncounted. */
void kvp__budget_pin_drop(kvp_sround_t *r, kvp_supply_t *sp);
/* Bytes a round holds now (record, supply, demand, digests). */
uint64_t kvp__budget_round_mem(const kvp_sround_t *r);
/* Re-account r->mem after its arrays changed (to 0 when freed: `gone`). */
void kvp__budget_account(kvp_sround_t *r, bool gone);
/* Whether the peer may hold `extra` more bytes of rounds (and, with
 * new_round, one more live round). No side effect. */
bool kvp__budget_round_fits(const kvp_session_t *s, uint64_t extra, bool new_round);
/* Count and log a refusal at the round budget (count or memory). */
void kvp__budget_round_refused(kvp_session_t *s, const char *what);
/* The pin lease's next deadline: pin_lease_ms from now, never past
 * born_ns + max_lease_ms (then counted once in leases_capped). */
uint64_t kvp__budget_lease_deadline(kvp_sround_t *r);
/* How many of a LOOKUP's n keys the peer's key rate lets us look up now
 * (the first ones; max_lookup_keys_per_sec, 0 = all): charged; the rest are
 * counted (lookup_keys_refused) and logged, rate-limited. */
uint32_t kvp__budget_lookup_keys(kvp_session_t *s, uint32_t n);
/* Give back n keys charged by kvp__budget_lookup_keys but not looked up
 * (prefix mode stopped at a miss). */
void kvp__budget_lookup_refund(kvp_session_t *s, uint32_t n);
/* keyrate.c: a new session takes the key-rate bucket its peer id's last
 * session left (if it is not full again); a session that ends leaves its own. */
void kvp__keyrate_take(kvp_session_t *s);
void kvp__keyrate_leave(kvp_session_t *s);

/* release.c: the one place memory a WRITE may touch is released. Each call
 * names its proof, counts it (n->releases) and logs it at DEBUG. */
/* A destination slot of ours FILLING (or QUARANTINED) -> FREE. */
void kvp__release_dst(kvp_session_env_t *e, const char *peer, kvp_slot_ref_t dst, bool quarantined,
                      kvp_proof_t proof);
/* FILLING -> READY with the source's digest: verified against it with
 * `verify`, else taken as the slot's (kvp_store_commit_digest). On error
 * (e.g. KVP_ERR_CHECKSUM) the slot stays FILLING and nothing is counted: the
 * caller releases it with kvp__release_dst. */
/* Issue 29: a lent slot's block landed: verified (unless `verify` is off)
 * and handed back to the embedding (FILLING -> FREE by `proof`); never
 * committed into the cache. KVP_ERR_CHECKSUM: still FILLING, the caller
 * releases it with kvp__release_dst. */
/* Both: `actual` is the slot's digest hashed by the caller since it landed
 * (client_outcome.c, two threads), NULL: the store hashes it. */
kvp_status_t kvp__release_dst_lent(kvp_session_env_t *e, const char *peer, kvp_slot_ref_t dst,
                                   const kvp_digest_t *digest, const kvp_digest_t *actual,
                                   bool verify, kvp_proof_t proof);
kvp_status_t kvp__release_dst_commit(kvp_session_env_t *e, const char *peer, kvp_slot_ref_t dst,
                                     const kvp_digest_t *digest, const kvp_digest_t *actual,
                                     bool verify, kvp_proof_t proof);
/* Drop every pin of the transfer's store job (x->n becomes 0). */
void kvp__release_src(kvp_session_env_t *e, kvp_xfer_t *x, kvp_proof_t proof);
/* Why a supply pin (a LOOKUP's pin on one of our READY slots, which no
 * transfer reads: those moved to a kvp_xfer_t go by kvp__release_src) is
 * dropped. No proof is needed (nothing writes or reads it remotely), so it
 * is named and logged, not counted in n->releases. */
typedef enum kvp_supply_why {
    KVP_SUPPLY_ROUND_END = 0,  /* the round ended with the pin not moved to a transfer */
    KVP_SUPPLY_PREFIX_CUT = 1, /* prefix mode: past the first miss */
    KVP_SUPPLY_REFUSED = 2,    /* the peer's supply-pin budget refused it: MISS */
    KVP_SUPPLY_CLOSING = 3,    /* the session is closing: MISS */
    KVP_SUPPLY_WHY_COUNT = 4,
} kvp_supply_why_t;
const char *kvp__supply_why_str(kvp_supply_why_t why);
/* Drop one supply pin (the caller held it: asserted). */
void kvp__release_supply(kvp_session_env_t *e, const char *peer, kvp_slot_ref_t ref,
                         kvp_supply_why_t why);

#endif /* KVP_SESSION_INT_H */
