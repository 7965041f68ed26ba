/*
 * kvpeer.h -- the one public header of kvpeer, a peer-to-peer KV-cache tier.
 *
 * Conventions (usable from ctypes): every name starts with kvp_, handles are
 * opaque pointers, integers are fixed-width, no macro is part of the API.
 * Every call returns a kvp_status_t; out-parameters are written only on
 * success; a call that returns an error never fires its callback or event.
 */
#ifndef KVPEER_H
#define KVPEER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(KVP_BUILDING_LIBRARY)
#define KVP_EXPORT __attribute__((visibility("default")))
#else
#define KVP_EXPORT
#endif

/* One status enum for the whole library: KVP_OK is 0, errors are negative. */
typedef enum kvp_status {
    KVP_OK = 0,
    KVP_ERR_INVALID = -1,      /* bad argument from the caller */
    KVP_ERR_NOMEM = -2,        /* an allocation failed */
    KVP_ERR_NOSPACE = -3,      /* no slot can be had (none free, none evictable) */
    KVP_ERR_EXISTS = -4,       /* the key is already READY */
    KVP_ERR_PENDING = -5,      /* the key is FILLING (someone is writing it) */
    KVP_ERR_NOT_FOUND = -6,    /* no such key, peer, transfer or request */
    KVP_ERR_STALE = -7,        /* a (slot, generation) reference is out of date */
    KVP_ERR_STATE = -8,        /* the object is not in a state that allows this */
    KVP_ERR_LIMIT = -9,        /* a configured limit (pins, sessions, ...) was hit */
    KVP_ERR_PROTO = -10,       /* a peer broke the wire protocol */
    KVP_ERR_IO = -11,          /* a system call failed */
    KVP_ERR_TIMEOUT = -12,     /* a deadline passed */
    KVP_ERR_CLOSED = -13,      /* the session, connection or node is closed */
    KVP_ERR_INCOMPATIBLE = -14,/* the peer's layout, fingerprint or version differs */
    KVP_ERR_AUTH = -15,        /* the peer failed authentication */
    KVP_ERR_TRANSPORT = -16,   /* the data transport reported an error */
    KVP_ERR_UNSUPPORTED = -17, /* the backend or build cannot do this */
    KVP_ERR_CANCELED = -18,    /* the operation was cancelled or aborted */
    KVP_ERR_CHECKSUM = -19,    /* a block's content does not match its checksum */
    KVP_ERR_BUSY = -20,        /* try again later (things still in flight) */
    KVP_ERR_UNREACHABLE = -21, /* the peer is down, on probation or unknown */
    KVP_ERR_TRUNCATED = -22,   /* input ended early (decoder: need more bytes) */
} kvp_status_t;

/* The library's version, "MAJOR.MINOR.PATCH". */
KVP_EXPORT const char *kvp_version(void);

/* Static English text for a status; never NULL. */
KVP_EXPORT const char *kvp_status_str(kvp_status_t status);

/* Library log level: 0 error, 1 warn (default: a library is quiet), 2 info,
 * 3 debug, 4 trace. The environment variable KVPEER_LOG_LEVEL sets it at
 * load time: a number 0..4 or a name (error, warn, info, debug, trace).
 * Lines go to stderr as "2026-01-31T12:00:00.123Z WARN  [node] text". */
KVP_EXPORT void kvp_set_log_level(int32_t level);
KVP_EXPORT int32_t kvp_get_log_level(void);
/* Send every library line that passes the level to `fn` instead of stderr
 * (NULL: back to stderr). `component` is the node's name; `line` is valid
 * for the call. Called from any kvpeer thread, one call at a time. */
typedef void (*kvp_log_fn)(int32_t level, const char *component, const char *line, void *arg);
KVP_EXPORT void kvp_set_log_callback(kvp_log_fn fn, void *arg);

/* Issue 27: a string a peer or a client chose (peer id, instance id, URL)
 * made safe for one log line or one line of a page. Always written as \xNN:
 * control characters (C0, DEL, C1), U+2028/U+2029, bidi overrides and every
 * byte that is not well-formed UTF-8; the flags add '\\', '"' and ' '.
 * Writes at most cap - 1 bytes and a NUL into dst (cap > 0), never cutting
 * an escape or a UTF-8 sequence; returns the length written. Every library
 * log line passes through it (KVP_ESCAPE_BACKSLASH) before it reaches
 * stderr or the kvp_set_log_callback function. */
typedef enum kvp_escape_flag {
    KVP_ESCAPE_BACKSLASH = 1, /* '\\': an escape in the output is then unambiguous */
    KVP_ESCAPE_QUOTE = 2,     /* '"': inside a quoted value */
    KVP_ESCAPE_SPACE = 4,     /* ' ': a bare key=value field */
} kvp_escape_flag_t;
KVP_EXPORT size_t kvp_escape(char *dst, size_t cap, const void *src, size_t len, uint32_t flags);

/* Why the calling thread's last failed kvp_node_create() (or kvp_psk_load)
 * failed, naming the field or the limit ("block_size: 1000 is not a positive
 * multiple of the page size (4096)"); "" if nothing was recorded.
 * Thread-local, valid until the thread's next such call. */
KVP_EXPORT const char *kvp_last_error(void);

/* Read a pre-shared-key file (issue 27), the one format every kvpeer tool
 * reads: hex digits as `openssl rand -hex 32 > psk` writes them, whitespace
 * around them ignored, 16..64 bytes of key. The file must be a regular file
 * that group and others cannot access (else KVP_ERR_INVALID; kvp_last_error
 * names the path, the mode and the fix `chmod 600`); KVP_ERR_IO if it cannot
 * be opened or read. On KVP_OK the key is in key[0..*len) (cap: the caller's
 * buffer, 64 holds any key); on error key and len are untouched. */
KVP_EXPORT kvp_status_t kvp_psk_load(const char *path, uint8_t *key, uint32_t cap, uint32_t *len);

/* ================================================================== node */

typedef struct kvp_node kvp_node_t;

typedef enum kvp_transport_kind {
    KVP_TRANSPORT_UCX = 0,  /* real one-sided puts (shared memory, tcp, rdma) */
    KVP_TRANSPORT_FAKE = 1, /* deterministic test double (tests, simulator) */
} kvp_transport_kind_t;

typedef enum kvp_thread_mode {
    KVP_THREAD_OWN = 0,    /* the node runs its own progress thread (default) */
    KVP_THREAD_CALLER = 1, /* the embedding calls kvp_node_progress() on one thread */
} kvp_thread_mode_t;

/* Node configuration. Fill with kvp_config_init() (every default of the
 * SPEC §8 table), then override. Strings and buffers are borrowed for the
 * duration of kvp_node_create() only (the node copies what it keeps). */
typedef struct kvp_config {
    const char *name;        /* log prefix; NULL = the peer id */
    const char *listen_addr; /* "host:port", port 0 = ephemeral; default "127.0.0.1:0" */
    const char *peer_id;     /* advertised id; NULL = the bound listen address */
    const char *instance_id; /* ranks of one engine share it; NULL = peer id */
    uint32_t num_blocks;     /* default 1024 */
    uint32_t block_size;     /* bytes, multiple of the page size; default 256 KiB */
    const char *compat;      /* opaque compatibility string; its hash is the fingerprint */
    uint64_t hash_seed;      /* checksum / fingerprint seed; must match peers */
    const uint8_t *psk;      /* pre-shared key, or NULL */
    uint32_t psk_len;
    int32_t transport;       /* kvp_transport_kind_t */
    int32_t thread_mode;     /* kvp_thread_mode_t */
    void *region;            /* embedding-supplied region (emulated path), or NULL */
    uint64_t region_len;
    uint8_t verify_checksums;/* default 1; 0: a fetched block is committed unverified
                              * with the source's digest (no hash of it here) */
    uint8_t huge_pages;      /* own mapping only */
    uint16_t reserved0;
    uint32_t heartbeat_ms, dead_after_ms, handshake_timeout_ms;
    uint32_t lookup_pending_ms, supply_pin_ms, load_timeout_ms;
    uint32_t abort_resend_ms, abort_ack_timeout_ms, parked_demand_ms;
    uint32_t hold_cap_ms;       /* retained transfers and quarantined slots */
    uint64_t suspect_period_ms; /* default 10 x hold cap */
    uint32_t idle_session_ms, shutdown_drain_ms;
    uint32_t max_sessions, max_pins, max_retained, max_quarantined;
    uint64_t max_inflight_bytes_per_peer;
    uint32_t backoff_min_ms, backoff_max_ms;
    /* Lease of the pins a lookup takes on the source (the source's setting):
     * released pin_lease_ms after the lookup unless the requester renews it
     * (kvp_lease_renew, or any fetch/lookup of the same request); 0 = the
     * supply-pin timeout. Expiries are counted (kvp_stats_t.leases_expired). */
    uint32_t pin_lease_ms;
    /* kvp_wait_events, while a lookup's answer is due: the waiting thread
     * polls for it this long before it sleeps (default 50; 0 = never). On
     * virtual machines waking a sleeping CPU costs tens of microseconds, more
     * than a LOOKUP round trip; the spin ends as soon as an event is ready. */
    uint32_t wait_spin_us;
    /* KV events for routers (vLLM's format: ZMQ PUB, msgpack KVEventBatch;
     * see docs/DESIGN.md "KV events"): the PUB bind address, e.g.
     * "tcp://127.0.0.1:5557" or "tcp://127.0.0.1:*" (ephemeral; read it back
     * with kvp_node_kv_events_endpoint); NULL = no events. The replay ROUTER
     * bind address, or NULL = no replay. Publishing never blocks the node:
     * batches over the high-water mark (kv_events_hwm batches, 0 = 10000)
     * are dropped and counted, and stay replayable (the last
     * kv_events_replay_batches, 0 = 1000). */
    const char *kv_events_endpoint;
    const char *kv_events_replay_endpoint;
    uint32_t kv_events_hwm;
    uint32_t kv_events_replay_batches;
    /* Per-peer budgets (issue 27; docs/DESIGN.md "Resource limits"): no peer
     * takes more than its share of this node, and the defaults leave the node
     * at least half its slots. 0 = the default given. A refusal is
     * KVP_ERR_LIMIT (a LOOKUP answer carries the limit flag), counted in
     * kvp_stats_t and logged (rate-limited) naming the budget and the peer.
     *   max_supply_pins_per_peer   slots one peer's lookups hold pinned here
     *                              (not yet fetched); 0 = num_blocks / 4, at
     *                              least min(64, num_blocks / 2)
     *   max_supply_pins            the same, all peers together; 0 = num_blocks / 2
     *   max_lookup_rounds_per_peer live lookup / fetch rounds one peer holds
     *                              here (pinned, pending, parked); 0 = 1024
     *   max_lookup_bytes_per_peer  their memory; 0 = 16 MiB
     *   max_lease_ms               total lifetime of a lookup's pin lease,
     *                              renewals included; 0 = 4 x the lease
     *   max_quarantined_per_peer   quarantined slots of one faulty peer past
     *                              which its fetches take only FREE slots
     *                              (refused only when none is left); 0 = num_blocks / 8
     *   max_wanted_peers           peers added with kvp_peer_add; 0 = max_sessions */
    uint32_t max_supply_pins_per_peer, max_supply_pins;
    uint32_t max_lookup_rounds_per_peer;
    uint32_t max_lease_ms;
    uint64_t max_lookup_bytes_per_peer;
    uint32_t max_quarantined_per_peer;
    uint32_t max_wanted_peers;
    /* Issue 27, the control plane's gate. `insecure`: a listen address that
     * is not loopback needs a psk unless this is 1 (then a WARN at start and
     * kvp_stats_t.insecure = 1): anyone who reaches the port gets the
     * region. Connections that have not authenticated (no valid HELLO, or
     * with a psk no verified AUTH) do not count toward max_sessions; they
     * have their own caps: max_preauth in all (default 32; at the cap the
     * oldest is closed), max_preauth_per_addr from one source address
     * (default 8; more are closed at accept), and a deadline,
     * preauth_timeout_ms (default 3000, at most handshake_timeout_ms). */
    uint8_t insecure;
    uint8_t reserved1[3];
    uint32_t max_preauth, max_preauth_per_addr, preauth_timeout_ms;
    /* Issue 27: the port of kvpeer's own tcp data stream (the data port
     * between hosts; UCX carries no tcp), on the listen address's host.
     * 0 (default) = ephemeral (it travels in the blob); set it to write
     * firewall rules. At most 65535. */
    uint32_t data_port;
    /* Issue 27, the LOOKUP key rate: keys one peer's LOOKUPs may have looked
     * up here per second (a token bucket one second deep, per session),
     * charged before any key is hashed. Keys past it answer MISS and the
     * answer carries the limit flag (KVP_ERR_LIMIT at the peer, the keys
     * granted first kept); counted in kvp_stats_t.lookup_keys_refused.
     * Default 2000000 (docs/DESIGN.md "LOOKUP key rate"); 0 = no limit. */
    uint32_t max_lookup_keys_per_sec;
    /* Issue 29, external slots (docs/DESIGN.md "External slots"): 1 = the
     * region (`region`/`region_len`, required with UCX) and its num_blocks
     * slots of block_size bytes are the embedding's (its chunk indices). UCX
     * registers it as caller memory; the node runs no allocator or LRU on
     * it: every slot starts the embedding's and the node touches one only
     * while it is lent (kvp_fetch_into) or published (kvp_publish).
     * kvp_put, kvp_get and kvp_fetch answer KVP_ERR_UNSUPPORTED. */
    uint32_t external_slots;
    /* Issue 29 step 2, "keys wanted" (external_slots = 1 only): 1 = a
     * LOOKUP's keys that are not published raise KVP_EV_WANTED and the
     * answer waits (at most lookup_pending_ms) for the embedding to publish
     * what it holds and call kvp_wanted_done; unanswered keys answer MISS.
     * max_wanted_ops_per_peer: WANTED ops of one peer outstanding at once
     * (default 16); past it, a LOOKUP's unpublished keys answer MISS with
     * the limit flag (counted in wanted_refused). Each wanted key also
     * counts against the peer's key rate and round memory. */
    uint32_t external_wanted;
    uint32_t max_wanted_ops_per_peer;
} kvp_config_t;

KVP_EXPORT void kvp_config_init(kvp_config_t *cfg);

/* Create a node: region, store, transports, listener, and (KVP_THREAD_OWN)
 * the progress thread. On error nothing is left behind. */
KVP_EXPORT kvp_status_t kvp_node_create(const kvp_config_t *cfg, kvp_node_t **out);
/* Bounded drain (shutdown_drain_ms) of in-flight work, retained transfers and
 * quarantined slots; what remains is force-released with error logs; then
 * everything is freed. Pending operations complete with KVP_ERR_CLOSED. */
KVP_EXPORT void kvp_node_destroy(kvp_node_t *node);
/* The node's peer id ("host:port"); valid for the node's lifetime. */
KVP_EXPORT const char *kvp_node_peer_id(const kvp_node_t *node);
/* Readable when events are ready (both modes); in caller-driven mode also
 * when kvp_node_progress() has work: incoming frames and connections, the
 * transport, a due timer (an epoll set over all of them). */
KVP_EXPORT int kvp_node_fd(const kvp_node_t *node);
/* Caller-driven mode: run one poll round, sleeping at most timeout_ms. */
KVP_EXPORT kvp_status_t kvp_node_progress(kvp_node_t *node, int32_t timeout_ms);

/* Change on a running node what needs no new memory registration: timings
 * (heartbeat_ms, dead_after_ms, handshake_timeout_ms, lookup_pending_ms,
 * supply_pin_ms, pin_lease_ms, load_timeout_ms, wait_spin_us, abort_resend_ms,
 * abort_ack_timeout_ms, parked_demand_ms, hold_cap_ms, idle_session_ms,
 * shutdown_drain_ms, backoff_min_ms, backoff_max_ms, preauth_timeout_ms),
 * limits (max_sessions, max_quarantined, max_inflight_bytes_per_peer,
 * max_preauth, max_preauth_per_addr, the per-peer budgets of issue 27:
 * max_supply_pins*, max_lookup_*, max_lease_ms, max_quarantined_per_peer,
 * max_wanted_peers) and the PSK (for handshakes that start afterwards;
 * sessions up keep theirs; a node listening beyond loopback keeps one unless
 * it was created insecure). Every other field of cfg
 * is ignored: it needs a new node (region, layout, identity, addresses,
 * compat, hash seed, max_pins, max_retained, suspect_period_ms, checksums,
 * KV events). The fields are checked together first: KVP_ERR_INVALID (see
 * kvp_last_error) changes nothing. Timers use the new values from their
 * next arm. */
KVP_EXPORT kvp_status_t kvp_node_reconfigure(kvp_node_t *node, const kvp_config_t *cfg);

/* Remote calls (kvp_lookup, kvp_lookup_prefix, kvp_fetch, kvp_lease_renew)
 * to a peer whose connection or handshake is in progress (e.g. right after
 * kvp_peer_add) wait for its session, at most min(handshake_timeout_ms,
 * dead_after_ms), with the node's own thread; in caller-driven mode they
 * never block. An unknown or failed peer answers KVP_ERR_UNREACHABLE at once
 * (and is dialled). */

/* Peers: want a session with a peer ("host:port"); redialled with backoff. */
KVP_EXPORT kvp_status_t kvp_peer_add(kvp_node_t *node, const char *addr);
/* Wait until the session with `addr` (added with kvp_peer_add) is ready for
 * lookups and fetches, at most timeout_ms. KVP_OK once ready; on timeout
 * the reason the peer is not ready: KVP_ERR_UNREACHABLE (dial failed or not
 * yet answered), KVP_ERR_AUTH, KVP_ERR_INCOMPATIBLE, KVP_ERR_LIMIT, or
 * KVP_ERR_TIMEOUT (still handshaking). KVP_ERR_NOT_FOUND if the peer was
 * never added. Blocks the calling thread; in caller-driven mode it runs
 * kvp_node_progress() itself (call it from the progress thread then). */
KVP_EXPORT kvp_status_t kvp_peer_wait(kvp_node_t *node, const char *addr, int32_t timeout_ms);
/* Close the session gracefully and stop redialling. KVP_ERR_NOT_FOUND when
 * there is no open session (none, or one already closing). */
KVP_EXPORT kvp_status_t kvp_peer_remove(kvp_node_t *node, const char *addr);
/* doors2: a peer added with kvp_peer_add is kept across an idle close
 * (idle_session_ms): not dialled meanwhile (state "idle"), the next lookup
 * or fetch to it redials and waits for it like one right after
 * kvp_peer_add. kvp_peer_remove forgets it; kvp_peer_forget only stops
 * keeping it (an open session stays until idle, then the peer is forgotten
 * as one that dialled in; kvpeerd: a DNS address that vanished).
 * KVP_ERR_NOT_FOUND if it was not kept. */
KVP_EXPORT kvp_status_t kvp_peer_forget(kvp_node_t *node, const char *addr);

/* Local put: copy `len` (== block_size, or less: zero-padded) bytes as the
 * block of `key`. request_id (0 = none) ties it to a source request so parked
 * demand (WAIT_FOR_SUPPLY) of that request is served at once. */
KVP_EXPORT kvp_status_t kvp_put(kvp_node_t *node, const void *key, uint32_t key_len,
                                const void *data, uint64_t len, uint64_t request_id);

/* A pinned block: read-only until kvp_release(). */
typedef struct kvp_block {
    const void *data;
    uint64_t len;
    uint32_t slot, gen;
} kvp_block_t;

/* Acquire the READY block of `key` (pinned). KVP_ERR_NOT_FOUND / PENDING. */
KVP_EXPORT kvp_status_t kvp_get(kvp_node_t *node, const void *key, uint32_t key_len,
                                kvp_block_t *out);
KVP_EXPORT kvp_status_t kvp_release(kvp_node_t *node, const kvp_block_t *block);
/* Copy blocks[i] (each from kvp_get, still pinned) into dst[i], at most
 * dst_len[i] bytes of it, for i < n: on the calling thread, without the
 * node's lock, with streaming stores, in one call (a binding that drops
 * its interpreter lock around a call takes it back once, not once per
 * block). A block that is not one of this node's slots anywhere:
 * KVP_ERR_INVALID, nothing copied. External slots: KVP_ERR_UNSUPPORTED (as kvp_get). */
KVP_EXPORT kvp_status_t kvp_blocks_copy(kvp_node_t *node, const kvp_block_t *blocks, uint32_t n,
                                        void *const *dst, const uint64_t *dst_len);

/* Remote operations complete through events (kvp_poll_events). Keys are
 * given as one buffer of concatenated keys with a length array. */
enum {
    KVP_FETCH_FLAG_WAIT_FOR_SUPPLY = 1, /* the source parks demand until supplied */
    /* Router hint: fetch without a lookup because a router's block map says
     * `peer` holds the keys. The source looks them up at fetch time; if any
     * is gone (a stale hint) the load fails at once with KVP_ERR_NOT_FOUND.
     * Never parks, never waits for a timeout. Not with WAIT_FOR_SUPPLY. */
    KVP_FETCH_FLAG_HINT = 2,
};

/* Ask `peer` which keys it holds. `results` (n bytes, 1 = HIT, 0 = MISS) is
 * caller-owned and must stay valid until the KVP_EV_LOOKUP event for *op_id. */
KVP_EXPORT kvp_status_t kvp_lookup(kvp_node_t *node, const char *peer, uint64_t request_id,
                                   const uint8_t *keys, const uint32_t *key_lens, uint32_t n,
                                   uint8_t *results, uint64_t *op_id);
/* Prefix lookup, as engines ask: `keys` are one request's blocks in order;
 * the KVP_EV_LOOKUP event's n_ok is the length of the longest prefix `peer`
 * holds, and exactly those blocks are pinned there for this request under
 * the source's pin lease (see kvp_config_t.pin_lease_ms). `results` (n
 * bytes, may be NULL) gets HIT for the prefix and MISS after it; if given it
 * is caller-owned like kvp_lookup's. A prefix lookup is one LOOKUP of its
 * own (never merged with other lookups of the request). */
KVP_EXPORT kvp_status_t kvp_lookup_prefix(kvp_node_t *node, const char *peer,
                                          uint64_t request_id, const uint8_t *keys,
                                          const uint32_t *key_lens, uint32_t n,
                                          uint8_t *results, uint64_t *op_id);
/* Lease heartbeat: renew, on `peer`, the pin lease of every lookup of
 * `request_id` not fetched yet. One small frame; no event. A fetch or a
 * lookup of the request renews too. KVP_ERR_UNREACHABLE if no session. */
KVP_EXPORT kvp_status_t kvp_lease_renew(kvp_node_t *node, const char *peer,
                                        uint64_t request_id);
/* Fetch keys from `peer` into our store (after a lookup of the same request,
 * or with KVP_FETCH_FLAG_WAIT_FOR_SUPPLY). Exactly one KVP_EV_LOAD event per
 * load. `block_status` (n int32, may be NULL) is caller-owned like `results`;
 * it is final when the KVP_EV_LOAD event is out and never written after. */
KVP_EXPORT kvp_status_t kvp_fetch(kvp_node_t *node, const char *peer, uint64_t request_id,
                                  const uint8_t *keys, const uint32_t *key_lens, uint32_t n,
                                  uint32_t flags, int32_t *block_status, uint64_t *op_id);
/* ---- issue 29: external slots (kvp_config_t.external_slots = 1) ----
 * Every slot is the embedding's unless lent to a load or published. All
 * calls may be made from any thread (vLLM: the scheduler or tier-poll
 * thread, under its manager's lock); none blocks on the network.
 *
 * Fetch into the embedding's slots: slots[i] (< num_blocks) receives the
 * block of key i. The slots are lent to the node from this call: KVP_ERR_INVALID
 * (nothing lent) if one is out of range, named twice, already lent or
 * published. One KVP_EV_LOAD as for kvp_fetch; then, per block_status[i]
 * (n int32, may be NULL; final when the event is out):
 *   KVP_OK          the verified block is in slots[i]; the slot is the
 *                   embedding's again (the node does not index it)
 *   KVP_ERR_BUSY    failed, and the slot is still held: a WRITE may still
 *                   land in it. It is the embedding's again only at the
 *                   KVP_EV_SLOTS_RELEASED event of this op_id (proof, or
 *                   the hold cap); the LOAD event's n_held counts them
 *   other errors    failed; the slot is the embedding's again now.
 * kvp_slots_held() answers the same from the node's state at any time. */
KVP_EXPORT kvp_status_t kvp_fetch_into(kvp_node_t *node, const char *peer, uint64_t request_id,
                                       const uint8_t *keys, const uint32_t *key_lens, uint32_t n,
                                       const uint32_t *slots, uint32_t flags,
                                       int32_t *block_status, uint64_t *op_id);
/* Serve: the embedding's slot `slot` holds the block of `key` (written, and
 * not written again while published). The node hashes it and serves it
 * (lookups pin it as any READY block). KVP_ERR_BUSY if the slot is lent or
 * published, KVP_ERR_EXISTS if the key is published in another slot. */
KVP_EXPORT kvp_status_t kvp_publish(kvp_node_t *node, const void *key, uint32_t key_len,
                                    uint32_t slot);
/* The checksum kvp_publish would compute of slot `slot` (KVP_CHECKSUM_LEN
 * opaque bytes into sum), computed on the calling thread without the
 * node's lock: an embedding hashes a block when it writes it, off every
 * request's path, and publishes it later with kvp_publish_checksum. The
 * slot must not be written meanwhile. */
#define KVP_CHECKSUM_LEN 16
KVP_EXPORT kvp_status_t kvp_slot_checksum(kvp_node_t *node, uint32_t slot,
                                          uint8_t sum[KVP_CHECKSUM_LEN]);
/* kvp_slot_checksum of slots[0..n) into sums (n x KVP_CHECKSUM_LEN bytes), in
 * one call: a binding that drops its interpreter lock around a call takes it
 * back once, not once per slot (CPython: up to its switch interval, 5 ms,
 * each time while another thread runs Python). A slot out of range
 * anywhere: KVP_ERR_INVALID, nothing hashed. */
KVP_EXPORT kvp_status_t kvp_slot_checksums(kvp_node_t *node, const uint32_t *slots, uint32_t n,
                                           uint8_t *sums);
/* kvp_publish with the block's checksum given (kvp_slot_checksum of this
 * node, taken since the slot was last written): the node hashes nothing.
 * The embedding vouches for it: a stale one (the slot rewritten since)
 * makes every consumer that verifies (verify_checksums, the default) fail
 * that block with KVP_ERR_CHECKSUM -- never commit it. */
KVP_EXPORT kvp_status_t kvp_publish_checksum(kvp_node_t *node, const void *key,
                                             uint32_t key_len, uint32_t slot,
                                             const uint8_t sum[KVP_CHECKSUM_LEN]);
/* kvp_publish_checksum (sum NULL: kvp_publish), served once: the first
 * transfer from the slot that completes unpublishes it, as kvp_unpublish
 * would (KVP_EV_SLOT_FREE, op_id = the slot, when its last pin drops; a
 * later kvp_unpublish answers BUSY until then, NOT_FOUND after). For a
 * block one consumer will fetch (the prefill half of prefill -> decode):
 * the embedding gets its slot back as soon as it was fetched. request_id
 * not 0: only a transfer for that request (the consumer's FETCH names it)
 * takes it back; other peers' transfers are served from it as from any
 * published slot, and the one consumer is not left without it. */
KVP_EXPORT kvp_status_t kvp_publish_once(kvp_node_t *node, const void *key, uint32_t key_len,
                                         uint32_t slot, const uint8_t sum[KVP_CHECKSUM_LEN],
                                         uint64_t request_id);
/* n publishes in one call to the node (one wake-up of its thread, not n):
 * key i (keys packed, key_lens[i] bytes each) from slots[i], with the
 * checksum sums[i * KVP_CHECKSUM_LEN] (sums NULL: each slot hashed on the
 * node's thread), once if flags has KVP_PUBLISH_ONCE (for request_id as
 * kvp_publish_once; 0 without the flag); status[i] gets what
 * kvp_publish_checksum / kvp_publish_once answers for it. KVP_ERR_INVALID
 * (nothing published): a bad key or slot anywhere, unknown flags, n = 0,
 * a request_id without KVP_PUBLISH_ONCE. */
#define KVP_PUBLISH_ONCE 1u
KVP_EXPORT kvp_status_t kvp_publish_many(kvp_node_t *node, const uint8_t *keys,
                                         const uint32_t *key_lens, const uint32_t *slots,
                                         uint32_t n, const uint8_t *sums, uint32_t flags,
                                         uint64_t request_id, int32_t *status);
/* kvp_slot_checksums, then kvp_publish_many with those checksums, in one
 * call: the slots are hashed on the calling thread (without the node's
 * lock, never on its thread), and sums (n x KVP_CHECKSUM_LEN bytes)
 * receives the checksums. A binding that drops its interpreter lock around
 * a call has the blocks published before it takes the lock back (once,
 * not twice). Arguments, flags and statuses as kvp_publish_many; an
 * argument it refuses, or sums NULL: KVP_ERR_INVALID, nothing hashed or
 * published. */
KVP_EXPORT kvp_status_t kvp_hash_publish_many(kvp_node_t *node, const uint8_t *keys,
                                              const uint32_t *key_lens, const uint32_t *slots,
                                              uint32_t n, uint8_t *sums, uint32_t flags,
                                              uint64_t request_id, int32_t *status);
/* Stop serving `key`. KVP_OK: the node will not read its slot again (the
 * slot is the embedding's now). KVP_ERR_BUSY: pinned by a lookup or a
 * transfer; no new pin is taken, and KVP_EV_SLOT_FREE (op_id = the slot)
 * comes when the last pin drops (its transfer terminal, its lease expired,
 * or the hold cap). KVP_ERR_NOT_FOUND: not published. *slot (may be NULL)
 * gets the slot on OK and BUSY. */
KVP_EXPORT kvp_status_t kvp_unpublish(kvp_node_t *node, const void *key, uint32_t key_len,
                                      uint32_t *slot);
/* held[i] for slot first + i (count slots): 0 = the embedding's, 1 = lent
 * to a load (filling, or held until KVP_EV_SLOTS_RELEASED), 2 = published. */
KVP_EXPORT kvp_status_t kvp_slots_held(kvp_node_t *node, uint32_t first, uint32_t count,
                                       uint8_t *held);

/* Issue 29 step 2 (external_wanted = 1): the keys of a KVP_EV_WANTED op
 * still wanted (not published since), at most `cap`: key i in
 * keys[i * KVP_KEY_MAX ...], its length in key_lens[i]; *n_out = how many.
 * KVP_ERR_NOT_FOUND: the op is answered already (done or its deadline).
 * The bytes are the peer's: treat them as untrusted. */
KVP_EXPORT kvp_status_t kvp_wanted_keys(kvp_node_t *node, uint64_t op_id, uint8_t *keys,
                                        uint32_t *key_lens, uint32_t cap, uint32_t *n_out);
/* The embedding published (kvp_publish) what it holds of the op's keys:
 * answer the LOOKUP now (every key still unpublished: MISS).
 * KVP_ERR_NOT_FOUND: answered already (all its keys published, or the
 * deadline) -- harmless. */
KVP_EXPORT kvp_status_t kvp_wanted_done(kvp_node_t *node, uint64_t op_id);
/* Issue 29 (external_wanted = 1): the keys that parked FETCHes on this node
 * wait for (a consumer's wait-for-supply, prefill -> decode), distinct, at
 * most `cap`, in kvp_wanted_keys's layout. The embedding publishes those it
 * holds (kvp_publish serves the parked FETCH at once). Calls take turns:
 * the FETCHes named go last, so the next call names the others first. The
 * bytes are the peers': treat them as untrusted. */
KVP_EXPORT kvp_status_t kvp_parked_keys(kvp_node_t *node, uint8_t *keys, uint32_t *key_lens,
                                        uint32_t cap, uint32_t *n_out);

/* Abort a load (its event still comes, with KVP_ERR_CANCELED unless decided). */
KVP_EXPORT kvp_status_t kvp_cancel(kvp_node_t *node, uint64_t op_id);
/* The engine finished `request_id` locally: its loads fail, its supply and
 * parked demand on this node are released. */
KVP_EXPORT kvp_status_t kvp_finish_request(kvp_node_t *node, uint64_t request_id);

typedef enum kvp_event_type {
    KVP_EV_LOOKUP = 1,    /* op_id, status, n_hits */
    KVP_EV_LOAD = 2,      /* op_id, status (KVP_OK = every block verified and committed) */
    KVP_EV_PEER_UP = 3,   /* peer */
    KVP_EV_PEER_DOWN = 4, /* peer, status = reason (fault or not: `fault`) */
    KVP_EV_OVERFLOW = 5,  /* the event ring was full: n_keys events were dropped
                           * (status KVP_ERR_LIMIT); poll events more often or
                           * track loads yourself -- dropped LOAD outcomes are lost */
    /* Issue 29 (external slots). */
    KVP_EV_SLOTS_RELEASED = 6, /* op_id (a kvp_fetch_into load): its n_keys slots that
                                * were still held at its KVP_EV_LOAD (block_status
                                * KVP_ERR_BUSY) are the embedding's again. status
                                * KVP_OK: by proof; KVP_ERR_TIMEOUT: by the hold cap
                                * (no proof: a late write may still land) */
    KVP_EV_SLOT_FREE = 7,      /* op_id = a slot unpublished while pinned: the last
                                * transfer reading it is terminal; the embedding's again */
    KVP_EV_WANTED = 8,         /* op_id, request_id, n_keys, peer: a LOOKUP wants keys
                                * not published (external_wanted): read them with
                                * kvp_wanted_keys, publish the held ones, then
                                * kvp_wanted_done(op_id) */
} kvp_event_type_t;

typedef struct kvp_event {
    int32_t type;   /* kvp_event_type_t */
    int32_t status; /* kvp_status_t */
    uint64_t op_id;
    uint64_t request_id;
    uint32_t n_keys, n_ok; /* lookup: hits; load: blocks committed */
    uint32_t fault;        /* peer down: 1 = fault, 0 = graceful */
    uint32_t n_held;       /* issue 29, LOAD of kvp_fetch_into: slots still held (their
                            * KVP_EV_SLOTS_RELEASED follows); else 0 */
    char peer[256];
} kvp_event_t;

/* The event ring holds at most this many undelivered events; beyond it new
 * events are dropped and counted, and one KVP_EV_OVERFLOW is delivered as the
 * oldest pending event is taken. */
enum { KVP_EVENT_RING_MAX = 16384 };

/* Take up to cap events (non-blocking). */
KVP_EXPORT kvp_status_t kvp_poll_events(kvp_node_t *node, kvp_event_t *out, uint32_t cap,
                                        uint32_t *n_out);
/* Take up to cap (>= 1) events, waiting up to timeout_ms (< 0: no limit)
 * for the first; *n_out = 0 when the time passed without one. While the
 * node thread sleeps, the waiting thread runs the node's poll rounds itself,
 * so the frame that completes an operation wakes the waiter directly (one
 * thread wake-up less than waiting on kvp_node_fd: the lowest-latency way
 * to wait for a LOOKUP or LOAD). Several threads may wait at once; one leads,
 * the others wait on the event fd. KVP_ERR_CLOSED when kvp_node_destroy()
 * starts meanwhile (the only call that may overlap kvp_node_destroy; it
 * returns before the node is freed). KVP_ERR_STATE from the node's own
 * thread. Caller-driven mode: runs kvp_node_progress() itself (call it from
 * the progress thread). */
KVP_EXPORT kvp_status_t kvp_wait_events(kvp_node_t *node, kvp_event_t *out, uint32_t cap,
                                        uint32_t *n_out, int32_t timeout_ms);

typedef struct kvp_stats {
    uint64_t slots_free, slots_filling, slots_ready, slots_quarantined, slots_suspect;
    uint64_t pins;
    uint64_t lookups_hit, lookups_miss, lookups_pending;
    uint64_t fetches_ok, fetches_failed, fetches_aborted;
    uint64_t blocks_in, bytes_in, blocks_out, bytes_out;
    uint64_t transfer_latency_ns_sum, transfers_done;
    uint64_t sessions_ready, sessions_handshaking;
    uint64_t retained_transfers, quarantined_slots, force_releases;
    uint64_t checksum_mismatches, stale_frames, protocol_errors, peers_down;
    uint64_t probations, evictions, loads_inflight;
    /* Resource limits of SPEC §8 (counters; each refusal also logs a
     * rate-limited WARN naming the limit and the peer). */
    uint64_t sessions_refused;           /* handshakes refused at max_sessions */
    uint64_t pins_refused;               /* pins refused at max_pins (keys answered MISS) */
    uint64_t fetches_queued;             /* fetches that waited for the bytes-in-flight budget */
    uint64_t fetches_refused_inflight;   /* refused or timed out in the queue: bytes in flight */
    uint64_t fetches_refused_quarantine; /* refused: faulty peer, quarantine limit reached */
    uint64_t fetches_refused_retained;   /* FETCHes of peers refused: max_retained reached */
    /* Pin leases of lookups served by this node (source side). */
    uint64_t leases_renewed;     /* lease renewals (heartbeats, fetches, lookups) */
    uint64_t leases_expired;     /* lookup rounds whose lease ran out unfetched */
    uint64_t lease_pins_expired; /* pins those expiries released */
    uint64_t fetch_hints_stale;  /* hinted fetches answered NOT_FOUND (stale hint) */
    /* KV events (when kv_events_endpoint is set). */
    uint64_t kv_event_batches;         /* batches published */
    uint64_t kv_event_batches_dropped; /* not sent: subscriber queue full (replayable) */
    uint64_t kv_events;                /* stored/removed/cleared events in batches */
    uint64_t kv_event_replays;         /* replay requests answered */
    /* Active-message data path (peers whose writes are not native RMA, e.g.
     * tcp): destination slots of failed loads released at once because our
     * handler refuses them (proof=am-refuse, no quarantine); bytes that
     * arrived for a slot not expecting them (dropped); bytes landed. */
    uint64_t am_refuse_releases;
    uint64_t late_bytes_dropped;
    uint64_t am_bytes_landed;
    /* Releases of memory a WRITE may touch (our destination slots leaving
     * FILLING or QUARANTINED; source pins of a transfer), by the proof that
     * allowed each: the transport handed the transfer back (terminal),
     * FETCH_DONE, ABORT_ACK, a completed fence, our AM handler's refusal, the
     * hold cap (no proof: slots suspect, pins force-released), or nothing
     * was ever sent (a FETCH or transfer that never left us). */
    uint64_t released_terminal, released_fetch_done, released_abort_ack, released_fence;
    uint64_t released_am_refuse, released_hold_cap, released_not_sent;
    /* kvp_wait_events calls whose thread ran the node's rounds itself (led
     * while the node thread slept). */
    uint64_t waits_led;
    /* Per-peer budgets (issue 27), source side unless said: */
    uint64_t supply_pins;           /* slots pinned by lookups not fetched yet (all peers) */
    uint64_t supply_pins_refused;   /* hits answered MISS: a supply-pin budget was reached */
    uint64_t lookups_refused_limit; /* LOOKUP answers sent with the limit flag */
    uint64_t rounds_refused;        /* LOOKUPs / FETCHes refused: a peer's round count or memory */
    uint64_t lookup_bytes;          /* memory of live rounds (all peers) */
    uint64_t leases_capped;         /* rounds whose lease reached max_lease_ms */
    uint64_t lookups_limited;       /* consumer: KVP_EV_LOOKUP events with KVP_ERR_LIMIT */
    uint64_t peers_add_refused;     /* kvp_peer_add refused at max_wanted_peers */
    /* Issue 27: 1 if the node listens beyond loopback without a pre-shared
     * key (config insecure = 1). */
    uint64_t insecure;
    /* Issue 27: keys of peers' LOOKUPs answered MISS unlooked-up, over
     * max_lookup_keys_per_sec (source side). */
    uint64_t lookup_keys_refused;
    /* Issue 27: kvpeer's own tcp data stream (the data port between hosts):
     * streams into us authenticated now (gauge), and connections refused or
     * closed before landing anything (no valid secret, caps, deadline, bad
     * framing, out of fds). */
    uint64_t data_streams_open;
    uint64_t data_streams_refused;
    /* Issue 27: quarantined destination slots released because their
     * same-host source's process exited (proof=process-exit: a pidfd of the
     * process proven by SO_PEERCRED), before the hold cap. */
    uint64_t released_process_exit;
    /* Issue 29: bytes this node copied between the embedding's memory and
     * its own region: in = kvp_put's copy of a block into the store (the
     * staging copy of a source); out = bytes of blocks kvp_get handed out
     * for the embedding to copy (the staging copy of a consumer). 0 in
     * external-slots mode: blocks land in and are served from the
     * embedding's own slots. */
    uint64_t bytes_copied_in;
    uint64_t bytes_copied_out;
    /* Issue 29 step 2 (external_wanted): KVP_EV_WANTED ops raised and the
     * keys they asked; keys answered MISS because the embedding did not
     * publish them (done or deadline); ops answered at the deadline
     * without kvp_wanted_done; LOOKUPs whose unpublished keys were refused
     * at max_wanted_ops_per_peer. */
    uint64_t wanted_ops;
    uint64_t wanted_keys;
    uint64_t wanted_keys_missed;
    uint64_t wanted_expired;
    uint64_t wanted_refused;
    /* Issue 29 item 4 (direct-cma, source side): bytes this node wrote into
     * same-host consumers' regions with process_vm_writev, and such writes
     * that failed (their transfers failed). */
    uint64_t cma_bytes_written;
    uint64_t cma_writes_failed;
    /* Loads whose FETCH_DONE waited for our transport to see every block
     * land (the source is not proven to write our memory directly), not
     * trusted at once. */
    uint64_t loads_landing_awaited;
    /* Loads of 1 MiB or more whose checksums were verified on the node's
     * verifier thread while it served its other peers (one at a time). */
    uint64_t loads_verified_later;
    /* Such loads that waited for the verifier behind another one (their
     * FETCH_DONE came while it verified that one). */
    uint64_t loads_verify_queued;
} kvp_stats_t;

KVP_EXPORT kvp_status_t kvp_node_stats(kvp_node_t *node, kvp_stats_t *out);

/* Inspection: retained transfers and quarantined slots with their ages. */
typedef struct kvp_held_item {
    int32_t kind; /* 1 = retained transfer, 2 = quarantined slot, 3 = suspect slot */
    uint32_t slot;
    uint64_t id;     /* transfer id (retained) */
    uint64_t age_ms;
    char peer[256];
} kvp_held_item_t;

KVP_EXPORT kvp_status_t kvp_node_held(kvp_node_t *node, kvp_held_item_t *out, uint32_t cap,
                                      uint32_t *n_out);

/* Per-peer session info, including the data path ("direct-shm", "tcp", ...). */
typedef struct kvp_peer_info {
    char peer[256];
    char instance[256];
    char data_path[32];
    uint32_t ready, probation;
    uint64_t rtt_ns;
    uint64_t loads_inflight, bytes_inflight;
} kvp_peer_info_t;

KVP_EXPORT kvp_status_t kvp_node_peers(kvp_node_t *node, kvp_peer_info_t *out, uint32_t cap,
                                       uint32_t *n_out);

/* Every peer the node knows: wanted ones (kvp_peer_add, redialled) and
 * those with a session (either direction), with a state and, for a peer
 * that cannot be reached, why. `state` is one of
 *   "ready"      session up, lookups and fetches go to it
 *   "probation"  session up, but a transfer fault is being proven; not used
 *   "dialing"    a connection or handshake in progress
 *   "failed"     the last attempt failed (last_error), a redial is pending
 *   "wanted"     wanted, waiting to (re)dial
 *   "closing"    the session is going down
 *   "idle"       added with kvp_peer_add, closed as idle (wanted 0: not
 *                dialled); the next lookup or fetch to it redials (doors2) */
typedef struct kvp_peer_state {
    char peer[256];
    char state[16];
    char last_error[128];
    uint32_t wanted;   /* 1 = added with kvp_peer_add (redialled while not ready) */
    uint32_t failures; /* failed attempts since it was last ready */
} kvp_peer_state_t;

KVP_EXPORT kvp_status_t kvp_node_peer_states(kvp_node_t *node, kvp_peer_state_t *out,
                                             uint32_t cap, uint32_t *n_out);

/* Why sessions did not come up, per reason (counters since creation). */
typedef struct kvp_refusal_stats {
    uint64_t dials;                /* outbound connection attempts */
    uint64_t dial_failures;        /* could not start (address does not resolve, ...) */
    uint64_t handshakes_timed_out; /* connected, never ready */
    uint64_t refused_incompatible; /* block layout, compat fingerprint, hash seed, version */
    uint64_t refused_auth;         /* PSK missing or different */
    uint64_t refused_duplicate;    /* a second session with one peer */
    uint64_t refused_limit;        /* max_sessions */
    uint64_t peers_dead;           /* sessions ended: nothing heard for dead_after_ms */
    /* Issue 27: connections closed before authenticating (max_preauth,
     * max_preauth_per_addr, preauth_timeout_ms); handshakes refused over
     * identity (a peer id with a live session, a blob that is ours or
     * another live session's, an unprintable id); accepts that found no
     * free file descriptor (the listener backed off). */
    uint64_t refused_preauth, refused_identity, accept_fd_exhausted;
} kvp_refusal_stats_t;

KVP_EXPORT kvp_status_t kvp_node_refusals(kvp_node_t *node, kvp_refusal_stats_t *out);

/* The bound KV-event endpoint (replay = 0: the PUB socket; 1: the replay
 * ROUTER), wildcard ports resolved, e.g. "tcp://127.0.0.1:40123"; NULL when
 * the node publishes no events (or no replay). Valid for the node's life. */
KVP_EXPORT const char *kvp_node_kv_events_endpoint(const kvp_node_t *node, int32_t replay);

/* Liveness of the node itself: milliseconds since its progress loop last
 * completed a round (own thread: it does at least every few hundred ms;
 * caller-driven: since the caller's last kvp_node_progress). A large value
 * means the loop is stuck, e.g. inside the transport. Never blocks, safe
 * from any thread (health checks). */
KVP_EXPORT uint64_t kvp_node_stall_ms(kvp_node_t *node);

#ifdef __cplusplus
}
#endif
#endif /* KVPEER_H */
