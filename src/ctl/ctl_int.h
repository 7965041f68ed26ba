/*
 * ctl_int.h -- internal to the ctl layer: the ctl and link structs shared by
 * ctl.c (the node-facing object: listener, wants, reaping, stats) and link.c
 * (one connection incarnation: framing, handshake, liveness, identity).
 *
 * Link state machine (link_set_state() asserts the predecessors):
 *
 *   CONNECTING --connected--> HELLO          (outbound; inbound starts in HELLO)
 *   HELLO  --peer HELLO valid, psk-->  AUTH  --peer AUTH verified--> CHECK
 *   HELLO  --peer HELLO valid, no psk-----------------------------> CHECK
 *   CHECK  --identity settled (claim / simultaneous dial)--> ACKED  (our HELLO_ACK sent)
 *   ACKED  --peer HELLO_ACK (may have arrived in CHECK)--> READY   (on_ready)
 *   any    --error / BYE / timeout / close--> CLOSING   (link_down(); freed by reap)
 *
 * Invariants: our blob leaves only in the CHECK->ACKED transition, i.e. after
 * the peer's HELLO validated and (with a psk) its AUTH verified; on_down runs
 * only for links that reached READY, from the reap timer or from another
 * link's timer, never inside a kvp_link_* call.
 */
#ifndef KVP_CTL_INT_H
#define KVP_CTL_INT_H

#include "ctl/conn.h"

#include <pthread.h>
#include <sys/socket.h>

typedef enum link_state {
    LINK_CONNECTING, /* outbound connect in progress; nothing sent */
    LINK_HELLO,      /* our HELLO sent; waiting for the peer's */
    LINK_AUTH,       /* peer HELLO valid; our AUTH sent; waiting for the peer's AUTH */
    LINK_CHECK,      /* peer validated+authenticated; identity conflict being settled */
    LINK_ACKED,      /* our HELLO_ACK (blob) sent; waiting for the peer's */
    LINK_READY,      /* both acks crossed; frames flow */
    LINK_CLOSING,    /* down decided; on the ctl's closing list until reaped */
} link_state_t;

typedef struct ctl_want ctl_want_t;
typedef struct ctl_resolve_req ctl_resolve_req_t;
typedef struct ctl_resolver ctl_resolver_t;

/* A frame queued before the link was ready: encoded with our epoch as a
 * placeholder target epoch, patched at flush. Owned by the link. */
typedef struct link_pending {
    kvp_list_t node;
    size_t len;
    uint8_t data[];
} link_pending_t;

/* Ownership: allocated by ctl (accept / dial), freed by ctl_reap() after
 * on_down (or link_finish() during a restart claim). Owns its conn until
 * link_down() hands it to the conn's graceful/hard close, the pending frames
 * and the copy of the peer's blob (freed right after on_ready). */
struct kvp_link {
    kvp_ctl_t *ctl;
    kvp_list_t node; /* ctl->links, or ctl->closing once CLOSING */
    kvp_conn_t *conn;
    link_state_t state;
    bool outbound, have_peer, peer_acked, was_ready;
    bool claim_started, claim_ping_pending;
    /* Refused over the fingerprint a peer of wire minor >= 1: our BYE with
     * our compat string is out, the link waits (handshake timeout) for the
     * peer's BYE with its string so the log can name both. */
    bool compat_wait;
    bool bye_out; /* that BYE was written: close gracefully so it gets out */
    char peer_compat[KVP_WIRE_COMPAT_MAX + 1]; /* from the peer's BYE, "" = none */
    kvp_msg_hello_t peer; /* the peer's HELLO, valid once have_peer */
    kvp_epoch_t local_epoch, remote_epoch;
    uint8_t nonce[KVP_WIRE_NONCE_LEN];
    char peer_id[KVP_WIRE_STR_MAX + 1]; /* from HELLO; outbound: the dialed address until then */
    kvp_wire_ctx_t wctx;
    uint8_t *peer_blob;
    uint32_t peer_blob_len;
    kvp_down_reason_t down_reason;
    uint16_t down_bye;
    bool down_fault;
    uint64_t created_ns, last_rx_ns, last_tx_ns, last_pong_ns, rx_frames;
    uint64_t ping_seq, rtt_ns;
    uint64_t claim_start_ns, claim_rx_mark; /* restart claim against another link */
    kvp_timer_t t_handshake, t_heartbeat, t_dead, t_check;
    kvp_list_t pending;
    size_t pending_bytes;
    ctl_want_t *want; /* the want that dialed this link, or NULL */
    void *user;
    /* gate.c (issue 27): hash of the source host (inbound), and of the
     * peer's blob once its HELLO_ACK came (no two live links share one). */
    uint64_t src_hash;
    uint8_t blob_hash[32];
    bool claim_logged;
    bool read_paused;  /* kvp_link_pause_read: no frame taken until t_resume */
    kvp_timer_t t_resume;
    uint64_t resumed_ns; /* the last resume: liveness waits for a poll after it */
};

/* kvp_ctl_want(): dial, redial with backoff while not ready. Owned by ctl. */
struct ctl_want {
    kvp_list_t node;
    kvp_ctl_t *ctl;
    char addr[KVP_WIRE_STR_MAX + 1];
    kvp_link_t *link; /* our dial in progress (not yet ready), or NULL */
    uint64_t backoff_ns;
    kvp_timer_t t_redial;
    /* visibility (kvp_ctl_wants_foreach): failed attempts since the last
     * ready link, and why the last one failed */
    uint32_t failures;
    char last_error[128];
    ctl_resolve_req_t *resolving; /* its host name is being resolved (resolve.c) */
};

/* Ownership: created by kvp_ctl_create, freed by kvp_ctl_destroy; the config
 * strings are copied; psk, blob and loop are borrowed (see ctl.h). */
struct kvp_ctl {
    kvp_ctl_config_t cfg; /* defaults applied; string fields point at the copies below */
    char peer_id[KVP_WIRE_STR_MAX + 1], instance_id[KVP_WIRE_STR_MAX + 1];
    char compat[KVP_WIRE_COMPAT_MAX + 1]; /* the form a BYE carries */
    char prefix[64];
    kvp_loop_t *loop;
    kvp_listener_t *listener;
    kvp_list_t links;     /* links not yet CLOSING */
    kvp_list_t closing;   /* CLOSING links waiting for ctl_reap() */
    kvp_list_t lingering; /* closed conns still draining */
    kvp_list_t wants;
    kvp_timer_t t_reap;
    kvp_wire_scratch_t *scratch;
    uint8_t *ebuf; /* encode buffer */
    size_t ebuf_cap;
    kvp_rng_t rng; /* backoff jitter */
    kvp_ctl_stats_t st;
    kvp_ratelimit_t rl_proto;
    kvp_ratelimit_t rl_limit; /* refusals at max_sessions */
    kvp_ratelimit_t rl_refuse; /* handshakes refused or timed out (any peer can cause them) */
    kvp_ratelimit_t rl_gate;   /* pre-auth caps (gate.c) */
    const kvp_conn_handler_t *handler;
    ctl_resolver_t *resolver; /* started at the first host name to resolve */
};

static inline uint64_t ctl_link_now(const kvp_link_t *l)
{
    return kvp_loop_now(l->ctl->loop);
}

/* link.c */
void kvp__ctl_link_set_state(kvp_link_t *l, link_state_t to);
/* Send a frame of our own (handshake, PING/PONG); a full queue closes the link. */
void kvp__ctl_link_send_ctl(kvp_link_t *l, kvp_msg_t *m);
/* Refuse during the handshake: count, BYE, no callback (never ready). */
void kvp__ctl_link_refuse(kvp_link_t *l, kvp_down_reason_t reason, uint16_t bye, uint64_t *counter);
void kvp__ctl_link_protocol_error(kvp_link_t *l, const char *why);
/* BYE INCOMPATIBLE carrying our compat string (peer of wire minor >= 1). */
void kvp__ctl_link_send_bye_compat(kvp_link_t *l);
/* compat_wait ends (the peer's BYE, its EOF or the handshake timeout): log
 * the refusal naming what we know and take the link down INCOMPATIBLE. */
void kvp__ctl_hs_compat_refused(kvp_link_t *l);
void kvp__ctl_link_become_ready(kvp_link_t *l);
kvp_status_t kvp__ctl_link_new(kvp_ctl_t *ctl, kvp_conn_t *conn, bool outbound,
                               const char *addr, kvp_link_t **out);
void kvp__ctl_link_free(kvp_link_t *l);
void kvp__ctl_link_down(kvp_link_t *l, kvp_down_reason_t reason, int bye, bool fault);
extern const kvp_conn_handler_t kvp__ctl_link_handler;

/* handshake.c */
void kvp__ctl_hs_send_hello(kvp_link_t *l);
void kvp__ctl_hs_on_hello(kvp_link_t *l, const kvp_msg_hello_t *h);
void kvp__ctl_hs_on_auth(kvp_link_t *l, const kvp_msg_auth_t *a);
void kvp__ctl_hs_on_ack(kvp_link_t *l, const kvp_msg_hello_ack_t *a);
/* HELLO_ACK with our blob: only from kvp__ctl_settle_identity(), link in CHECK. */
void kvp__ctl_hs_send_ack(kvp_link_t *l);
/* A HELLO of another wire major: refuse it cleanly. False if not that case. */
bool kvp__ctl_hs_refuse_version(kvp_link_t *l, const uint8_t *frame, size_t len);

/* gate.c (issue 27): what a link must pass before it costs the node more
 * than a few hundred bytes. */
/* Hash of the host part of "host:port" (a link's source address). */
uint64_t kvp__ctl_gate_src_hash(const char *remote);
/* Inbound and not yet authenticated (HELLO or AUTH state). */
bool kvp__ctl_link_preauth(const kvp_link_t *l);
/* An accepted connection: within the pre-auth caps? May close the oldest
 * pre-auth link of the heaviest source to make room. False: close c. */
bool kvp__ctl_gate_admit(kvp_ctl_t *ctl, kvp_conn_t *c);
/* Authenticated links other than l (CHECK, ACKED, READY): max_sessions. */
size_t kvp__ctl_gate_sessions(const kvp_ctl_t *ctl, const kvp_link_t *l);
/* The peer's blob in its HELLO_ACK: refused (false, logged, counted, link
 * down) if it is ours or another live link's; else remembered. */
bool kvp__ctl_gate_blob_ok(kvp_link_t *l, const void *blob, size_t len);
/* A peer id or instance id only of printable ASCII (it reaches logs). */
bool kvp__ctl_gate_id_ok(const char *s);
/* Copy for a log line: non-printable bytes as '?'. */

/* resolve.c: host names resolved off the loop thread */
kvp_status_t kvp__ctl_resolve_start(kvp_ctl_t *ctl, ctl_want_t *w);
void kvp__ctl_resolve_forget(ctl_want_t *w); /* the want goes away */
void kvp__ctl_resolve_destroy(kvp_ctl_t *ctl);
/* ctl.c: a want's name resolved (st KVP_OK: dial sa) or not */
void kvp__ctl_want_resolved(ctl_want_t *w, kvp_status_t st, const void *sa, unsigned sslen);

/* ctl.c */
void kvp__ctl_schedule_reap(kvp_ctl_t *ctl);
/* Run one CLOSING link's on_down and free it now (loop context only). */
void kvp__ctl_link_finish(kvp_link_t *l);
/* Re-run identity checks of CHECK links for this peer id (from the loop). */
void kvp__ctl_kick_checks(kvp_ctl_t *ctl, const char *peer_id);
/* Settle the identity of a validated (and authenticated) link in CHECK
 * against the other links of its peer id (SPEC §4: restart claims,
 * simultaneous dials), then send our HELLO_ACK; may refuse or wait. */
void kvp__ctl_settle_identity(kvp_link_t *l);
void kvp__ctl_on_check(kvp_timer_t *t); /* the identity-check timer */
void kvp__ctl_want_link_ready(kvp_ctl_t *ctl, kvp_link_t *l);
kvp_status_t kvp__ctl_encode(kvp_ctl_t *ctl, const kvp_msg_t *m, size_t *len);

/* A refused or timed-out handshake: anyone who can connect can cause one
 * per connection, so these lines are rate-limited (50/s, then a count). */
#define CTL_LOG_REFUSED(l, level, fmt, ...)                                                        \
    KVP_LOG_RL(&(l)->ctl->rl_refuse, ctl_link_now(l), (level), (l)->ctl->prefix, fmt, ##__VA_ARGS__)

#endif /* KVP_CTL_INT_H */
