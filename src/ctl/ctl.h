/*
 * ctl.h -- the control transport (SPEC §2 layer 3, §4, §8): an epoll event
 * loop with named deadlines, non-blocking framed connections (TCP, or a fake
 * in-memory network for deterministic tests), and the control plane of one
 * node: listener, dials with backoff, the authenticated handshake with
 * epochs, heartbeats, identity conflicts. Knows nothing of KV.
 *
 * Threading: everything here runs on the loop's owner thread, except
 * kvp_loop_wakeup(), which any thread may call. An owner that guards its
 * state with a lock (kvp_loop_set_wait_hooks) may let another thread holding
 * that lock act as the owner while the loop sleeps.
 */
#ifndef KVP_CTL_H
#define KVP_CTL_H

#include "common/common.h"
#include "wire/wire.h"

/* ================================================================= loop */

typedef struct kvp_loop kvp_loop_t;
typedef struct kvp_io kvp_io_t;
typedef struct kvp_timer kvp_timer_t;

/* events: EPOLLIN / EPOLLOUT / EPOLLERR / EPOLLHUP bits from <sys/epoll.h> */
typedef void (*kvp_io_cb)(kvp_io_t *io, uint32_t events);
typedef void (*kvp_timer_cb)(kvp_timer_t *t);

/* Embedded in the owner's struct; the loop never allocates or frees one. */
struct kvp_io {
    int fd;
    uint32_t events;
    kvp_io_cb cb;
    void *data;
    bool active;
};

/* A named deadline. Embedded in the owner's struct (e.g. a session has
 * handshake, heartbeat, dead, load... timers); all active timers feed one
 * min-heap; the poll timeout comes from its top. */
struct kvp_timer {
    uint64_t deadline_ns;
    kvp_timer_cb cb;
    void *data;
    const char *name; /* for traces: "handshake", "dead-after", ... */
    uint32_t heap_index; /* UINT32_MAX when not active */
    uint64_t seq;        /* arm order: equal deadlines fire in the order armed (determinism) */
};

/* `clock` is borrowed for the loop's lifetime (NULL = real clock). */
kvp_status_t kvp_loop_create(const kvp_clock_t *clock, kvp_loop_t **out);
/* Every io and timer must have been stopped. */
void kvp_loop_destroy(kvp_loop_t *loop);
const kvp_clock_t *kvp_loop_clock(const kvp_loop_t *loop);
uint64_t kvp_loop_now(const kvp_loop_t *loop);

kvp_status_t kvp_io_start(kvp_loop_t *loop, kvp_io_t *io, int fd, uint32_t events, kvp_io_cb cb,
                          void *data);
kvp_status_t kvp_io_modify(kvp_loop_t *loop, kvp_io_t *io, uint32_t events);
void kvp_io_stop(kvp_loop_t *loop, kvp_io_t *io);

void kvp_timer_init(kvp_timer_t *t, const char *name, kvp_timer_cb cb, void *data);
/* (Re)arm at an absolute deadline on the loop's clock. */
void kvp_timer_start(kvp_loop_t *loop, kvp_timer_t *t, uint64_t deadline_ns);
void kvp_timer_stop(kvp_loop_t *loop, kvp_timer_t *t);
bool kvp_timer_active(const kvp_timer_t *t);
/* Nearest deadline, or UINT64_MAX. */
uint64_t kvp_loop_next_deadline(const kvp_loop_t *loop);
/* When the loop last looked for input (its last poll of the fds, on the
 * loop's clock): whatever a peer sent before then has been read. A callback
 * that ran long makes now - polled large; input that came meanwhile is not
 * read yet (liveness judges silence only up to here). 0 before the first
 * round. */
uint64_t kvp_loop_polled(const kvp_loop_t *loop);

/* One iteration: wait up to timeout_ms (-1 = until the next deadline or an
 * event; 0 = do not sleep), dispatch ready fds, then fire due timers.
 * Returns the number of callbacks run. An idle loop sleeps: no busy polling.
 * Timers armed from inside this iteration at an already-due deadline fire in
 * the next one (no livelock). With a manual clock, a deadline cannot pass
 * while sleeping: -1 then waits only for fd events unless a timer is due, so
 * tests drive such loops with run_once(0) and kvp_manual_clock_advance(). */
int kvp_loop_run_once(kvp_loop_t *loop, int timeout_ms);
/* Any thread: make a sleeping run_once return (eventfd). */
void kvp_loop_wakeup(kvp_loop_t *loop);
/* Called on the owner thread after a wakeup was consumed. */
void kvp_loop_set_wakeup_cb(kvp_loop_t *loop, void (*cb)(void *arg), void *arg);
/* begin(arg) runs before run_once sleeps and end(arg) after it wakes (not
 * for a round that does not sleep): an owner thread that holds a lock over
 * its state releases it there, so that another thread may take the lock and
 * act as the owner meanwhile (start and stop ios and timers, write to
 * connections). The owner then sleeps on an outer epoll fd and collects its
 * batch after end() (so never an event of an io stopped meanwhile).
 * KVP_ERR_IO if the outer epoll fd cannot be made. */
kvp_status_t kvp_loop_set_wait_hooks(kvp_loop_t *loop, void (*begin)(void *arg),
                                     void (*end)(void *arg), void *arg);
/* With wait hooks set, a thread holding the owner's lock while the owner
 * sleeps may lead (on = true): the sleeping owner is no longer woken by the
 * loop's fds, timers or wakeups, and this thread runs rounds (run_once, no
 * hooks) until it stops leading (on = false), after which whatever is ready
 * wakes the owner. One syscall each way; KVP_ERR_IO if it fails (nothing
 * changed); KVP_ERR_STATE to lead a loop without wait hooks or one already
 * led. */
kvp_status_t kvp_loop_lead(kvp_loop_t *loop, bool on);
/* The epoll fd: readable when run_once has work (caller-driven mode). */
int kvp_loop_fd(const kvp_loop_t *loop);

/* ========================================================== control plane */

typedef struct kvp_ctl kvp_ctl_t;
typedef struct kvp_link kvp_link_t; /* one control-connection incarnation */

/* Why a link went down. */
typedef enum kvp_down_reason {
    KVP_DOWN_BYE = 0,            /* the peer sent BYE (see bye_reason) */
    KVP_DOWN_EOF = 1,            /* connection closed / reset */
    KVP_DOWN_DEAD = 2,           /* nothing received for dead_after */
    KVP_DOWN_HANDSHAKE_TIMEOUT = 3,
    KVP_DOWN_PROTOCOL = 4,       /* malformed frame, bad epochs on a handshake frame */
    KVP_DOWN_INCOMPATIBLE = 5,   /* layout / fingerprint / seed / version */
    KVP_DOWN_AUTH = 6,
    KVP_DOWN_DUPLICATE = 7,      /* refused duplicate or lost a simultaneous dial */
    KVP_DOWN_LIMIT = 8,          /* session cap */
    KVP_DOWN_LOCAL_CLOSE = 9,    /* kvp_link_close() */
    KVP_DOWN_SLOW_PEER = 10,     /* write queue over its bound */
    KVP_DOWN_REFUSED = 11,       /* the ready callback refused the peer */
} kvp_down_reason_t;

const char *kvp_down_reason_str(kvp_down_reason_t r);

/* The network a ctl speaks over: real TCP, or the fake in-memory network. */
typedef struct kvp_fake_net kvp_fake_net_t;

typedef struct kvp_ctl_callbacks {
    /* Handshake complete (HELLO validated, AUTH if configured, both HELLO_ACKs
     * exchanged). `blob` is the peer's data-transport address blob, borrowed
     * for the call. Returning non-OK refuses the peer (link closed with a
     * fault BYE, on_down not called for a link that never became ready). */
    kvp_status_t (*on_ready)(void *arg, kvp_link_t *link, const kvp_msg_hello_t *peer,
                             const void *blob, size_t blob_len);
    /* A post-handshake frame whose epochs match this incarnation (PING/PONG/
     * BYE are handled here; everything else is delivered). `msg` and its
     * arrays are valid for the call only. */
    void (*on_frame)(void *arg, kvp_link_t *link, const kvp_msg_t *msg);
    /* A ready link went down. `fault` is false only for a graceful BYE (or a
     * local graceful close). The link is freed after the callback returns. */
    void (*on_down)(void *arg, kvp_link_t *link, kvp_down_reason_t reason, uint16_t bye_reason,
                    bool fault);
    /* Optional: a fresh PONG arrived (proof of life; RTT in ns). */
    void (*on_pong)(void *arg, kvp_link_t *link, uint64_t rtt_ns);
    void *arg;
} kvp_ctl_callbacks_t;

typedef struct kvp_ctl_config {
    const char *peer_id;     /* our advertised host:port; NULL = the bound address */
    const char *instance_id; /* NULL = peer_id */
    const char *listen_addr; /* "host:port" (port 0 = ephemeral), IPv4 or [IPv6]; NULL = no listener */
    uint32_t num_blocks, block_size;
    uint64_t fingerprint, hash_seed;
    /* Our compatibility string (its hash is `fingerprint`), NULL = "": only
     * for the operator -- a refusal over the fingerprint names both strings
     * (BYE INCOMPATIBLE of wire minor 1). Copied (bounded, see wire.h). */
    const char *compat;
    const uint8_t *psk; /* pre-shared key or NULL; borrowed */
    size_t psk_len;
    const void *blob;   /* our data-transport blob; borrowed for the ctl's lifetime */
    size_t blob_len;
    uint64_t heartbeat_ns;         /* default 500 ms */
    uint64_t dead_after_ns;        /* default 2 s */
    uint64_t handshake_timeout_ns; /* default 10 s */
    uint64_t backoff_min_ns, backoff_max_ns; /* default 100 ms, 5 s */
    uint32_t max_sessions;   /* default 1024 */
    size_t wbuf_max;         /* per-connection write queue bound, default 64 MiB */
    kvp_loop_t *loop;        /* borrowed */
    kvp_fake_net_t *fake_net; /* non-NULL: use the fake network instead of TCP */
    kvp_ctl_callbacks_t cb;
    const char *log_prefix;
    /* Issue 27: inbound links before authentication (gate.c). */
    uint32_t max_preauth;          /* default 32; at the cap the heaviest source's oldest goes */
    uint32_t max_preauth_per_addr; /* default 8 from one source address; more are closed */
    uint64_t preauth_timeout_ns;   /* default 3 s, at most handshake_timeout_ns */
} kvp_ctl_config_t;

typedef struct kvp_ctl_stats {
    uint64_t links_ready, links_handshaking;
    uint64_t frames_in, frames_out, bytes_in, bytes_out;
    uint64_t stale_frames;    /* dropped: epochs of another incarnation */
    uint64_t protocol_errors;
    uint64_t refused_incompatible, refused_auth, refused_duplicate, refused_limit;
    uint64_t handshakes_timed_out, peers_dead, dials, dial_failures;
    uint64_t dead_deferred; /* dead-after verdicts put off past our own stall */
    /* Added by the ctl layer: HELLO_ACKs (data-transport blobs) received from
     * / sent to peers. A refused peer never gets one (tests assert this). */
    uint64_t blobs_in, blobs_out;
    /* Issue 27: connections closed by the pre-auth caps (per source, in
     * all) or its deadline; handshakes refused over identity (a peer id
     * with a live session, our own blob or another live link's); accepts
     * that hit the fd limit (the listener backed off). */
    uint64_t refused_preauth, refused_identity, accept_fd_exhausted;
} kvp_ctl_stats_t;

/* KVP_ERR_IO: the listener could not bind or listen; errno says why. */
kvp_status_t kvp_ctl_create(const kvp_ctl_config_t *cfg, kvp_ctl_t **out);
/* Closes every link (no callbacks) and the listener. Not from a callback. */
void kvp_ctl_destroy(kvp_ctl_t *ctl);
/* Our peer id ("host:port" of the listener). */
const char *kvp_ctl_peer_id(const kvp_ctl_t *ctl);

/* Want a session with `addr` ("host:port"): dial now, redial with exponential
 * backoff and jitter while wanted and not ready. Idempotent. The want is
 * satisfied while the link it dialed lives (whatever peer id the peer
 * announces) or while any link's peer id equals `addr`. KVP_ERR_INVALID for
 * our own peer id. */
kvp_status_t kvp_ctl_want(kvp_ctl_t *ctl, const char *addr);
/* Stop wanting `addr` (links already up stay until closed). */
void kvp_ctl_unwant(kvp_ctl_t *ctl, const char *addr);
/* Every wanted address with its state: a link to it in progress or up,
 * failed attempts since the last ready link, and why the last one failed
 * ("" if none). Strings valid for the callback only. */
typedef struct kvp_ctl_want_info {
    const char *addr;
    bool linked;
    uint32_t failures;
    const char *last_error;
} kvp_ctl_want_info_t;
typedef void (*kvp_ctl_want_cb)(void *arg, const kvp_ctl_want_info_t *wi);
void kvp_ctl_wants_foreach(const kvp_ctl_t *ctl, kvp_ctl_want_cb cb, void *arg);

/* Send a frame on a link; the ctl stamps the epochs. Before the link is ready
 * frames are queued and flushed in order after both acks. KVP_ERR_CLOSED if
 * the link is going down; KVP_ERR_LIMIT if the write queue is over its bound
 * (the link is then closed as a slow peer). */
kvp_status_t kvp_link_send(kvp_link_t *link, const kvp_msg_t *msg);
/* Close: sends BYE(reason), then closes. Asynchronous: on_down runs from the
 * loop, never inside this call. */
void kvp_link_close(kvp_link_t *link, kvp_bye_reason_t reason);
/* PING now (e.g. probation: prove the peer alive; on_pong reports it). */
void kvp_link_ping(kvp_link_t *link);

const char *kvp_link_peer_id(const kvp_link_t *link);
const char *kvp_link_instance_id(const kvp_link_t *link);
const kvp_epoch_t *kvp_link_local_epoch(const kvp_link_t *link);
const kvp_epoch_t *kvp_link_remote_epoch(const kvp_link_t *link);
uint64_t kvp_link_rtt_ns(const kvp_link_t *link);
void kvp_link_set_user(kvp_link_t *link, void *user);
void *kvp_link_user(const kvp_link_t *link);

void kvp_ctl_get_stats(const kvp_ctl_t *ctl, kvp_ctl_stats_t *st);
/* At run time: take the timing, backoff, session cap, pre-auth caps and
 * deadline, and PSK of `c` (the
 * other fields are ignored; zero timings get the defaults). Links already
 * up keep running and use the new timings from their next timer arm; the
 * PSK (borrowed like at create) counts for handshakes that start afterwards
 * -- one in AUTH already may fail and be redialled. */
void kvp_ctl_reconfigure(kvp_ctl_t *ctl, const kvp_ctl_config_t *c);

/* --- additions (ctl layer) --- */
/* The READY link whose peer id is `peer_id`, or NULL. Borrowed: valid until
 * its on_down returns. */
kvp_link_t *kvp_ctl_link_by_peer(const kvp_ctl_t *ctl, const char *peer_id);
/* True between on_ready and the decision that the link is down. */
bool kvp_link_is_ready(const kvp_link_t *link);
/* Bytes queued on the link and not yet handed to the kernel / fake peer
 * (write queue + frames waiting for the handshake). Bounded by wbuf_max. */
size_t kvp_link_queued_bytes(const kvp_link_t *link);
/* True if we dialed this link (false: accepted). */
bool kvp_link_outbound(const kvp_link_t *link);
/* Issue 27: a hash of the connection's two endpoints, equal at both ends; 0
 * if unknown (the same-host proof is bound to it, transport bind_next_peer). */
uint64_t kvp_link_binding(const kvp_link_t *link);
/* The numeric host of the connection's remote end ("" if unknown): where a
 * peer whose data stream listens on a wildcard address is reached. */
void kvp_link_remote_host(const kvp_link_t *link, char *buf, size_t cap);
/* A link still in its handshake whose peer id (or, for our dial, the address
 * dialed) is `peer_id`, or NULL. Lets a caller queue frames before ready
 * (kvp_link_send queues them). Borrowed: valid only until the loop runs
 * again unless it becomes ready (then until its on_down returns). */
kvp_link_t *kvp_ctl_link_pending(const kvp_ctl_t *ctl, const char *peer_id);
/* Issue 27: take no frame from this peer until `until_ns` (extends a pause
 * in progress, never shortens it): frames already buffered wait, nothing
 * more is read, so the peer's sends back up into its own socket. Liveness
 * does not count the pause against the peer. For a peer past a rate
 * (session/budget.c); no effect on a link that is not READY. */
void kvp_link_pause_read(kvp_link_t *link, uint64_t until_ns);
#ifdef KVP_TESTING
/* Test hook (test builds only, issue 31): send `msg` on a READY link with the
 * given epochs instead of the live pair (to inject stale frames).
 * KVP_ERR_STATE if not ready. */
kvp_status_t kvp_link_send_epochs(kvp_link_t *link, const kvp_msg_t *msg, const kvp_epoch_t *src,
                                  const kvp_epoch_t *dst);
#endif

/* ============================================================ fake network */

/* An in-memory network for deterministic tests and the simulator: many ctls
 * in one process, no sockets, on the loop's (manual) clock. Delivery is in
 * order per connection after `latency_ns`, driven by timers on the receiving
 * ctl's loop (so running the loops is enough; kvp_fake_net_deliver() is an
 * optional manual push). A ctl on the fake net is addressed by its
 * listen_addr (any string); its dials originate from listen_addr, or from
 * "<peer_id>/client" when it has no listener. Single-threaded: every ctl on
 * one net must run on the same thread. The net must outlive its ctls. */
kvp_status_t kvp_fake_net_create(uint64_t latency_ns, kvp_fake_net_t **out);
void kvp_fake_net_destroy(kvp_fake_net_t *net);
/* Cut / heal connectivity between two addresses (both directions): frames
 * are held, not delivered, while partitioned. */
void kvp_fake_net_partition(kvp_fake_net_t *net, const char *a, const char *b, bool cut);
/* Reset every connection of `addr` as if its process died (EOF to both ends,
 * undelivered frames dropped). Its listener stays. */
void kvp_fake_net_kill(kvp_fake_net_t *net, const char *addr);
/* Deliver everything due at the clock's now. Returns frames delivered. */
int kvp_fake_net_deliver(kvp_fake_net_t *net);

#endif /* KVP_CTL_H */
