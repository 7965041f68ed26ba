/*
 * api.c -- the public C API of kvpeer.h. Every call validates its input
 * (bad input gets KVP_ERR_INVALID and changes nothing), then runs on the
 * owner thread through kvp__node_exec (inline in caller-driven mode).
 * Remote operations complete through events; a call that returns an error
 * never produces an event.
 */
#include "node/node.h"
#include "node/events.h"

#include <sodium.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static kvp_status_t check_key(const void *key, uint32_t len)
{
    return key != NULL && len >= 1 && len <= KVP_KEY_MAX ? KVP_OK : KVP_ERR_INVALID;
}

/* A peer address or id: 1..KVP_WIRE_STR_MAX printable ASCII characters (a
 * HELLO with anything else is refused, issue 27, so no session has such an
 * id; a name with a newline or ESC must not reach the dialler or a page). */
static kvp_status_t check_peer(const char *peer)
{
    if (peer == NULL || peer[0] == '\0' || strlen(peer) > KVP_WIRE_STR_MAX)
        return KVP_ERR_INVALID;
    for (const char *c = peer; *c; c++)
        if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e)
            return KVP_ERR_INVALID;
    return KVP_OK;
}

KVP_EXPORT void kvp_set_log_level(int32_t level)
{
    if (level >= KVP_LOG_ERROR && level <= KVP_LOG_TRACE)
        kvp_log_set_level((kvp_log_level_t)level);
}

KVP_EXPORT int32_t kvp_get_log_level(void)
{
    return kvp__log_level;
}

KVP_EXPORT const char *kvp_node_peer_id(const kvp_node_t *n)
{
    return n ? n->peer_id : "";
}

KVP_EXPORT int kvp_node_fd(const kvp_node_t *n)
{
    if (n == NULL)
        return -1;
    return n->pollfd >= 0 ? n->pollfd : n->evfd;
}

KVP_EXPORT kvp_status_t kvp_node_progress(kvp_node_t *n, int32_t timeout_ms)
{
    if (n == NULL)
        return KVP_ERR_INVALID;
    return kvp__node_progress(n, timeout_ms);
}

/* ---------------------------------------------------------- reconfigure */

typedef struct reconf_args {
    const kvp_config_t *cfg;
    uint8_t *psk; /* the new key's copy (owned until swapped in) */
} reconf_args_t;

/* On the owner thread: the new values in n->cfg (read when each timer is
 * armed) and in the ctl; the old key's copy is wiped and freed here, the new
 * one then belongs to the node (freed by node_free). */
static kvp_status_t do_reconfigure(kvp_node_t *n, void *arg)
{
    reconf_args_t *a = arg;
    const kvp_config_t *c = a->cfg;
    kvp_config_t *k = &n->cfg;
    k->heartbeat_ms = c->heartbeat_ms;
    k->dead_after_ms = c->dead_after_ms;
    k->handshake_timeout_ms = c->handshake_timeout_ms;
    k->lookup_pending_ms = c->lookup_pending_ms;
    k->supply_pin_ms = c->supply_pin_ms;
    k->pin_lease_ms = c->pin_lease_ms;
    k->wait_spin_us = c->wait_spin_us;
    k->load_timeout_ms = c->load_timeout_ms;
    k->abort_resend_ms = c->abort_resend_ms;
    k->abort_ack_timeout_ms = c->abort_ack_timeout_ms;
    k->parked_demand_ms = c->parked_demand_ms;
    k->hold_cap_ms = c->hold_cap_ms;
    k->idle_session_ms = c->idle_session_ms;
    k->shutdown_drain_ms = c->shutdown_drain_ms;
    k->backoff_min_ms = c->backoff_min_ms;
    k->backoff_max_ms = c->backoff_max_ms;
    k->max_sessions = c->max_sessions;
    k->max_preauth = c->max_preauth;
    k->max_preauth_per_addr = c->max_preauth_per_addr;
    k->preauth_timeout_ms = c->preauth_timeout_ms;
    k->max_quarantined = c->max_quarantined ? c->max_quarantined : KVP_MAX(k->num_blocks / 4, 1);
    /* issue 27 budgets: reconfigurable, defaults as at create */
    k->max_supply_pins_per_peer = c->max_supply_pins_per_peer;
    k->max_supply_pins = c->max_supply_pins;
    k->max_lookup_rounds_per_peer = c->max_lookup_rounds_per_peer;
    k->max_lookup_bytes_per_peer = c->max_lookup_bytes_per_peer;
    k->max_lease_ms = c->max_lease_ms;
    k->max_quarantined_per_peer = c->max_quarantined_per_peer;
    k->max_wanted_peers = c->max_wanted_peers;
    k->max_lookup_keys_per_sec = c->max_lookup_keys_per_sec; /* issue 27: 0 = no limit */
    kvp__node_budget_defaults(k);
    k->max_inflight_bytes_per_peer = c->max_inflight_bytes_per_peer;
    if (n->psk_copy)
        sodium_memzero(n->psk_copy, k->psk_len);
    kvp__free(n->psk_copy);
    n->psk_copy = a->psk;
    a->psk = NULL;
    k->psk = n->psk_copy;
    k->psk_len = n->psk_copy ? c->psk_len : 0;
    kvp_ctl_config_t cc = {0};
    kvp__node_ctl_runtime(k, &cc);
    kvp_ctl_reconfigure(n->ctl, &cc);
    KVP_INFO(n->name, "reconfigured: heartbeat %u ms, dead after %u ms, load timeout %u ms, "
             "hold cap %u ms, idle %u ms, max sessions %u, psk %s",
             k->heartbeat_ms, k->dead_after_ms, k->load_timeout_ms, k->hold_cap_ms,
             k->idle_session_ms, k->max_sessions, k->psk_len ? "set" : "none");
    return KVP_OK;
}

KVP_EXPORT kvp_status_t kvp_node_reconfigure(kvp_node_t *n, const kvp_config_t *cfg)
{
    if (n == NULL || cfg == NULL)
        return KVP_ERR_INVALID;
    kvp__clear_last_error();
    kvp_status_t st = kvp__config_check_runtime(cfg);
    if (st != KVP_OK)
        return st;
    if (!n->listen_loopback && !n->cfg.insecure && cfg->psk_len == 0) { /* issue 27 */
        kvp__set_last_error("psk: this node listens beyond loopback; removing its pre-shared key "
                            "needs insecure = true at start");
        return KVP_ERR_INVALID;
    }
    reconf_args_t a = {cfg, NULL};
    if (cfg->psk_len) { /* cfg's buffers are borrowed for this call only */
        if ((a.psk = kvp__malloc(cfg->psk_len)) == NULL)
            return KVP_ERR_NOMEM;
        memcpy(a.psk, cfg->psk, cfg->psk_len);
    }
    st = kvp__node_exec(n, do_reconfigure, &a);
    if (a.psk) { /* not taken: the node is going down */
        sodium_memzero(a.psk, cfg->psk_len);
        kvp__free(a.psk);
    }
    return st;
}

/* --------------------------------------------------------------- peers */

static void count_want(void *arg, const kvp_ctl_want_info_t *wi)
{
    (void)wi;
    (*(uint32_t *)arg)++;
}

static void want_is(void *arg, const kvp_ctl_want_info_t *wi)
{
    const char **a = arg;
    if (*a != NULL && strcmp(wi->addr, *a) == 0)
        *a = NULL;
}

/* Issue 27: an admin caller (kvpeerd's /admin/peers, the CLI) cannot make
 * the node dial without bound: at most max_wanted_peers wanted peers.
 * doors2: the dormant kept peers (idle-closed, kept.c) count too -- at the
 * cap the oldest of them is forgotten first -- so kept peers are bounded. */
static kvp_status_t do_peer_add(kvp_node_t *n, void *arg)
{
    uint32_t wants = 0;
    const char *addr = arg;
    kvp_ctl_wants_foreach(n->ctl, count_want, &wants);
    kvp_ctl_wants_foreach(n->ctl, want_is, &addr);
    if (addr != NULL && kvp__node_kept_dormant(n, addr))
        addr = NULL; /* counted already: it turns from dormant to wanted */
    while (addr != NULL && wants + n->n_dormant >= n->cfg.max_wanted_peers &&
           kvp__node_kept_evict(n))
        ;
    if (addr != NULL && wants + n->n_dormant >= n->cfg.max_wanted_peers) { /* new, at the cap */
        n->st.peers_add_refused++;
        KVP_LOG_RL(&n->rl_local, kvp__node_now(n), KVP_LOG_WARN, n->name,
                   "peer add refused: max_wanted_peers (%u) reached", n->cfg.max_wanted_peers);
        return KVP_ERR_LIMIT;
    }
    kvp_status_t st = kvp_ctl_want(n->ctl, arg);
    if (st == KVP_OK && (st = kvp__node_kept_add(n, arg)) != KVP_OK)
        kvp_ctl_unwant(n->ctl, arg); /* out of memory: not added at all */
    return st;
}

static kvp_status_t do_peer_remove(kvp_node_t *n, void *arg)
{
    kvp__node_kept_drop(n, arg);
    kvp_ctl_unwant(n->ctl, arg);
    kvp_session_t *s = kvp__node_find_session(n, arg);
    if (s == NULL || !kvp__session_open(s))
        return KVP_ERR_NOT_FOUND; /* none, or already closing (a second remove) */
    kvp__session_close(s, KVP_BYE_GRACEFUL); /* teardown from on_down */
    return KVP_OK;
}

KVP_EXPORT kvp_status_t kvp_peer_add(kvp_node_t *n, const char *addr)
{
    if (n == NULL || check_peer(addr) != KVP_OK)
        return KVP_ERR_INVALID;
    return kvp__node_exec(n, do_peer_add, (void *)addr);
}

/* Ready for lookups and fetches: a live session that is not on probation. */
static kvp_status_t do_peer_state(kvp_node_t *n, void *arg)
{
    kvp_session_t *s = kvp__node_find_session(n, arg);
    if (s != NULL && kvp__session_ready(s))
        return KVP_OK;
    if (s != NULL)
        return KVP_ERR_UNREACHABLE; /* closing or on probation */
    return kvp_ctl_link_pending(n->ctl, arg) != NULL ? KVP_ERR_TIMEOUT : KVP_ERR_UNREACHABLE;
}

/* One step of a bounded wait for the owner thread's progress (at most 5 ms,
 * not past `deadline` on the real clock): run a round ourselves in
 * caller-driven mode, else sleep while the node thread works. */
static void node_wait_step(kvp_node_t *n, uint64_t deadline)
{
    uint64_t now = kvp_clock_now(kvp_clock_real());
    int left = now >= deadline ? 0 : (int)KVP_MIN((deadline - now) / KVP_NSEC_PER_MSEC + 1, 5);
    if (!n->thread_running) {
        kvp__node_progress(n, left);
    } else {
        struct timespec ts = {0, (long)left * 1000000L};
        nanosleep(&ts, NULL);
    }
}

KVP_EXPORT kvp_status_t kvp_peer_wait(kvp_node_t *n, const char *addr, int32_t timeout_ms)
{
    if (n == NULL || check_peer(addr) != KVP_OK || timeout_ms < 0)
        return KVP_ERR_INVALID;
    const kvp_clock_t *real = kvp_clock_real();
    uint64_t deadline = kvp_clock_now(real) + (uint64_t)timeout_ms * KVP_NSEC_PER_MSEC;
    for (;;) {
        kvp_status_t st = kvp__node_exec(n, do_peer_state, (void *)addr);
        if (st == KVP_OK)
            return KVP_OK;
        if (kvp_clock_now(real) >= deadline)
            return st;
        node_wait_step(n, deadline);
    }
}

KVP_EXPORT kvp_status_t kvp_peer_remove(kvp_node_t *n, const char *addr)
{
    if (n == NULL || check_peer(addr) != KVP_OK)
        return KVP_ERR_INVALID;
    return kvp__node_exec(n, do_peer_remove, (void *)addr);
}

/* doors2: not kept any more; the want and an open session stay as they are
 * (the session closes once idle and the peer is then forgotten). */
static kvp_status_t do_peer_forget(kvp_node_t *n, void *arg)
{
    return kvp__node_kept_drop(n, arg) ? KVP_OK : KVP_ERR_NOT_FOUND;
}

KVP_EXPORT kvp_status_t kvp_peer_forget(kvp_node_t *n, const char *addr)
{
    if (n == NULL || check_peer(addr) != KVP_OK)
        return KVP_ERR_INVALID;
    return kvp__node_exec(n, do_peer_forget, (void *)addr);
}

/* ---------------------------------------------------------- local put/get */

typedef struct put_args {
    const void *key;
    uint32_t key_len;
    const void *data;
    uint64_t len;
    uint64_t request_id;
} put_args_t;

static kvp_status_t do_put(kvp_node_t *n, void *arg)
{
    put_args_t *a = arg;
    kvp_slot_ref_t ref;
    void *ptr;
    kvp_status_t st = kvp_store_reserve(n->store, a->key, a->key_len, 0, &ref, &ptr);
    if (st != KVP_OK)
        return st;
    memcpy(ptr, a->data, a->len);
    n->st.bytes_copied_in += a->len; /* issue 29: the staging copy of a source */
    if (a->len < n->cfg.block_size)
        memset((uint8_t *)ptr + a->len, 0, n->cfg.block_size - a->len);
    st = kvp_store_commit(n->store, ref);
    if (st != KVP_OK) {
        kvp_store_abandon(n->store, ref);
        return st;
    }
    kvp__server_on_commit(&n->env, a->key, a->key_len); /* pending lookups, parked demand */
    return KVP_OK;
}

KVP_EXPORT kvp_status_t kvp_put(kvp_node_t *n, const void *key, uint32_t key_len,
                                const void *data, uint64_t len, uint64_t request_id)
{
    if (n == NULL || check_key(key, key_len) != KVP_OK || data == NULL || len == 0 ||
        len > n->cfg.block_size)
        return KVP_ERR_INVALID;
    if (n->cfg.external_slots)
        return KVP_ERR_UNSUPPORTED; /* issue 29: kvp_publish the embedding's slot instead */
    put_args_t a = {key, key_len, data, len, request_id};
    return kvp__node_exec(n, do_put, &a);
}

typedef struct get_args {
    const void *key;
    uint32_t key_len;
    kvp_block_t *out;
} get_args_t;

static kvp_status_t do_get(kvp_node_t *n, void *arg)
{
    get_args_t *a = arg;
    kvp_slot_ref_t ref;
    const void *ptr;
    kvp_status_t st = kvp_store_lookup(n->store, a->key, a->key_len, &ref, &ptr, NULL);
    if (st == KVP_ERR_LIMIT)
        KVP_LOG_RL(&n->rl_local, kvp__node_now(n), KVP_LOG_WARN, n->name,
                   "local reader: acquire refused: max_pins reached");
    if (st != KVP_OK)
        return st;
    if (n->engine_pins == NULL &&
        (n->engine_pins = kvp__calloc(n->cfg.num_blocks, sizeof(*n->engine_pins))) == NULL) {
        kvp_store_unpin(n->store, ref); /* house: the engine's own pin, no peer's (DESIGN.md) */
        return KVP_ERR_NOMEM;
    }
    n->engine_pins[ref.slot]++; /* the engine's own pins, apart from transfers' (I2) */
    n->st.bytes_copied_out += n->cfg.block_size; /* issue 29: handed out for a copy */
    a->out->data = ptr;
    a->out->len = n->cfg.block_size;
    a->out->slot = ref.slot;
    a->out->gen = ref.gen;
    return KVP_OK;
}

KVP_EXPORT kvp_status_t kvp_get(kvp_node_t *n, const void *key, uint32_t key_len,
                                kvp_block_t *out)
{
    if (n == NULL || out == NULL || check_key(key, key_len) != KVP_OK)
        return KVP_ERR_INVALID;
    if (n->cfg.external_slots)
        return KVP_ERR_UNSUPPORTED; /* issue 29: the blocks are in the embedding's slots */
    get_args_t a = {key, key_len, out};
    /* A pin and a lookup: nothing for the node thread to follow up (an
     * engine asks per key, per scheduler step; most answers are misses). */
    return kvp__node_exec_quiet(n, do_get, &a);
}

/* Drop one pin the ENGINE took with kvp_get. A release without such a pin
 * (double release, a forged block) is refused: it would otherwise drop a pin
 * an outbound transfer holds, and the slot could be evicted and refilled
 * while a WRITE still reads it (SPEC I2). */
static kvp_status_t do_release(kvp_node_t *n, void *arg)
{
    const kvp_block_t *b = arg;
    if (b->slot >= n->cfg.num_blocks || n->engine_pins == NULL || n->engine_pins[b->slot] == 0) {
        KVP_LOG_RL(&n->rl_local, kvp__node_now(n), KVP_LOG_WARN, n->name,
                   "kvp_release: slot %u gen %u holds no pin of the engine (double release?): "
                   "refused",
                   b->slot, b->gen);
        return KVP_ERR_STATE;
    }
    /* house: the engine's own pin (engine_pins), no peer's: no proof (DESIGN.md) */
    kvp_status_t st = kvp_store_unpin(n->store, (kvp_slot_ref_t){b->slot, b->gen});
    if (st == KVP_OK)
        n->engine_pins[b->slot]--;
    return st;
}

KVP_EXPORT kvp_status_t kvp_release(kvp_node_t *n, const kvp_block_t *b)
{
    if (n == NULL || b == NULL)
        return KVP_ERR_INVALID;
    return kvp__node_exec(n, do_release, (void *)b);
}

/* On the caller's thread, no lock: a block kvp_get handed out is pinned
 * (its bytes stay until kvp_release), and the region's geometry is fixed
 * from create to destroy, so a block that does not describe one of its
 * slots is refused before anything is copied. */
KVP_EXPORT kvp_status_t kvp_blocks_copy(kvp_node_t *n, const kvp_block_t *blocks, uint32_t cnt,
                                        void *const *dst, const uint64_t *dst_len)
{
    if (n == NULL || (cnt > 0 && (blocks == NULL || dst == NULL || dst_len == NULL)))
        return KVP_ERR_INVALID;
    if (n->cfg.external_slots)
        return KVP_ERR_UNSUPPORTED; /* as kvp_get: the blocks are the embedding's */
    for (uint32_t i = 0; i < cnt; i++) {
        const kvp_block_t *b = &blocks[i];
        if (b->slot >= n->cfg.num_blocks || b->data != kvp_store_slot_ptr(n->store, b->slot) ||
            b->len > n->cfg.block_size || (dst[i] == NULL && dst_len[i] > 0))
            return KVP_ERR_INVALID;
    }
    for (uint32_t i = 0; i < cnt; i++) {
        size_t len = (size_t)(blocks[i].len < dst_len[i] ? blocks[i].len : dst_len[i]);
        if (len > 0)
            kvp_copy_stream(dst[i], blocks[i].data, len);
    }
    return KVP_OK;
}

/* ------------------------------------------------------------- remote */

typedef struct remote_args remote_args_t;

/* One remote call on the owner thread: the session's call, whether it
 * takes an op id (it completes through an event) and whether it leaves
 * frames for the session's flush. */
typedef struct remote_call {
    kvp_session_call_t call;
    bool takes_op;
    bool flush;
    bool quiet; /* frames and bookkeeping only (kvp__node_exec_quiet) */
} remote_call_t;

struct remote_args {
    const remote_call_t *call;
    const char *peer;
    uint64_t request_id;
    const uint8_t *keys;
    const uint32_t *lens;
    uint32_t n;
    uint32_t flags;
    uint8_t *results;
    int32_t *block_status;
    uint64_t op_id;
    uint64_t wait_ms; /* set with UNREACHABLE: the peer is dialing, worth this wait */
    const uint32_t *slots; /* issue 29: kvp_fetch_into's destination slots */
};

/* The session to use, or why there is none (the caller sees a MISS). A
 * peer whose connection or handshake is in progress (just added, or
 * redialling), or a kept peer woken now from its idle close (kept.c: its
 * dial may wait for the old link's end), sets *wait_ms: the caller waits
 * that long for it (remote_exec). */
static kvp_status_t remote_session(kvp_node_t *n, const char *peer, kvp_session_t **out,
                                   uint64_t *wait_ms)
{
    kvp_session_t *s = kvp__node_find_session(n, peer);
    if (s == NULL || !kvp__session_open(s)) {
        uint64_t wait = KVP_MIN(n->cfg.handshake_timeout_ms, n->cfg.dead_after_ms);
        if (kvp__node_kept_wake(n, peer, kvp__node_now(n), wait * KVP_NSEC_PER_MSEC) ||
            kvp_ctl_link_pending(n->ctl, peer) != NULL)
            *wait_ms = wait;
        kvp_ctl_want(n->ctl, peer); /* work for a peer: (re)dial with backoff */
        return KVP_ERR_UNREACHABLE;
    }
    if (!kvp__session_ready(s))
        return KVP_ERR_UNREACHABLE; /* on probation */
    *out = s;
    return KVP_OK;
}

/* Every remote call has this shape: the session, an op id, the client call,
 * the flush queued. */
static kvp_status_t do_remote(kvp_node_t *n, void *arg)
{
    remote_args_t *a = arg;
    kvp_session_t *s;
    kvp_status_t st = remote_session(n, a->peer, &s, &a->wait_ms);
    if (st != KVP_OK)
        return st;
    uint64_t id = a->call->takes_op ? n->next_op_id++ : 0;
    kvp_session_req_t r = {a->call->call, a->request_id, a->keys, a->lens, a->n,
                           a->flags, a->results, a->block_status, a->slots};
    st = kvp__session_request(s, id, &r);
    if (st != KVP_OK)
        return st;
    if (a->call->flush && !kvp_list_linked(&kvp__session_links(s)->flush_link))
        kvp_list_insert_tail(&n->flushq, &kvp__session_links(s)->flush_link);
    a->op_id = id;
    return KVP_OK;
}

/* Run a remote call; while the peer is dialing (a connection or handshake
 * in progress), wait for its session -- at most min(handshake_timeout_ms,
 * dead_after_ms) from the first try -- then run it, so a lookup right after
 * kvp_peer_add works. Only with the node's own thread: in caller-driven mode
 * the embedding drives progress and an API call never blocks (it answers
 * UNREACHABLE; kvp_peer_wait or KVP_EV_PEER_UP say when to retry). A peer
 * that is unknown, failed (redial pending), on probation or closing answers
 * KVP_ERR_UNREACHABLE at once. */
static kvp_status_t remote_exec(kvp_node_t *n, remote_args_t *a)
{
    const kvp_clock_t *real = kvp_clock_real();
    uint64_t deadline = 0;
    for (;;) {
        a->wait_ms = 0;
        kvp_status_t st = a->call->quiet ? kvp__node_exec_quiet(n, do_remote, a)
                                         : kvp__node_exec(n, do_remote, a);
        if (st != KVP_ERR_UNREACHABLE || a->wait_ms == 0 || !n->thread_running)
            return st;
        uint64_t now = kvp_clock_now(real);
        if (deadline == 0)
            deadline = now + a->wait_ms * KVP_NSEC_PER_MSEC;
        if (now >= deadline)
            return st;
        node_wait_step(n, deadline);
    }
}

static const remote_call_t CALL_FETCH_INTO = {KVP_CALL_FETCH_INTO, true, false, true};
static const remote_call_t CALL_LOOKUP = {KVP_CALL_LOOKUP, true, true, true};
static const remote_call_t CALL_LOOKUP_PREFIX = {KVP_CALL_LOOKUP_PREFIX, true, true, true};
static const remote_call_t CALL_LEASE_RENEW = {KVP_CALL_LEASE_RENEW, false, false, true};
static const remote_call_t CALL_FETCH = {KVP_CALL_FETCH, true, false, true};

static kvp_status_t check_remote(kvp_node_t *n, const char *peer, const uint8_t *keys,
                                 const uint32_t *lens, uint32_t cnt, const uint64_t *op_id)
{
    if (n == NULL || check_peer(peer) != KVP_OK || keys == NULL || lens == NULL || cnt == 0 ||
        cnt > KVP_WIRE_LIST_MAX || op_id == NULL)
        return KVP_ERR_INVALID;
    for (uint32_t i = 0; i < cnt; i++)
        if (lens[i] == 0 || lens[i] > KVP_KEY_MAX)
            return KVP_ERR_INVALID;
    return KVP_OK;
}

KVP_EXPORT kvp_status_t kvp_lookup(kvp_node_t *n, const char *peer, uint64_t request_id,
                                   const uint8_t *keys, const uint32_t *key_lens, uint32_t cnt,
                                   uint8_t *results, uint64_t *op_id)
{
    if (check_remote(n, peer, keys, key_lens, cnt, op_id) != KVP_OK || results == NULL)
        return KVP_ERR_INVALID;
    remote_args_t a = {&CALL_LOOKUP, peer, request_id, keys, key_lens, cnt, 0, results, NULL, 0, 0,
                       NULL};
    kvp_status_t st = remote_exec(n, &a);
    if (st == KVP_OK)
        *op_id = a.op_id;
    return st;
}

KVP_EXPORT kvp_status_t kvp_lookup_prefix(kvp_node_t *n, const char *peer, uint64_t request_id,
                                          const uint8_t *keys, const uint32_t *key_lens,
                                          uint32_t cnt, uint8_t *results, uint64_t *op_id)
{
    if (check_remote(n, peer, keys, key_lens, cnt, op_id) != KVP_OK)
        return KVP_ERR_INVALID;
    remote_args_t a = {&CALL_LOOKUP_PREFIX, peer, request_id, keys, key_lens, cnt, 0, results,
                       NULL, 0, 0, NULL};
    kvp_status_t st = remote_exec(n, &a);
    if (st == KVP_OK)
        *op_id = a.op_id;
    return st;
}

KVP_EXPORT kvp_status_t kvp_lease_renew(kvp_node_t *n, const char *peer, uint64_t request_id)
{
    if (n == NULL || check_peer(peer) != KVP_OK)
        return KVP_ERR_INVALID;
    remote_args_t a = {&CALL_LEASE_RENEW, peer, request_id, NULL, NULL, 0, 0, NULL, NULL, 0, 0,
                       NULL};
    return remote_exec(n, &a);
}

KVP_EXPORT kvp_status_t kvp_fetch(kvp_node_t *n, const char *peer, uint64_t request_id,
                                  const uint8_t *keys, const uint32_t *key_lens, uint32_t cnt,
                                  uint32_t flags, int32_t *block_status, uint64_t *op_id)
{
    uint32_t known = KVP_FETCH_FLAG_WAIT_FOR_SUPPLY | KVP_FETCH_FLAG_HINT;
    if (check_remote(n, peer, keys, key_lens, cnt, op_id) != KVP_OK || (flags & ~known) ||
        flags == known)
        return KVP_ERR_INVALID;
    if (n->cfg.external_slots)
        return KVP_ERR_UNSUPPORTED; /* issue 29: the node has no slots of its own */
    remote_args_t a = {&CALL_FETCH, peer, request_id, keys, key_lens, cnt, flags, NULL,
                       block_status, 0, 0, NULL};
    kvp_status_t st = remote_exec(n, &a);
    if (st == KVP_OK)
        *op_id = a.op_id;
    return st;
}

KVP_EXPORT kvp_status_t kvp_fetch_into(kvp_node_t *n, const char *peer, uint64_t request_id,
                                       const uint8_t *keys, const uint32_t *key_lens,
                                       uint32_t cnt, const uint32_t *slots, uint32_t flags,
                                       int32_t *block_status, uint64_t *op_id)
{
    uint32_t known = KVP_FETCH_FLAG_WAIT_FOR_SUPPLY | KVP_FETCH_FLAG_HINT;
    if (check_remote(n, peer, keys, key_lens, cnt, op_id) != KVP_OK || (flags & ~known) ||
        flags == known || slots == NULL)
        return KVP_ERR_INVALID;
    if (!n->cfg.external_slots)
        return KVP_ERR_UNSUPPORTED;
    remote_args_t a = {&CALL_FETCH_INTO, peer, request_id, keys, key_lens, cnt, flags, NULL,
                       block_status, 0, 0, slots};
    kvp_status_t st = remote_exec(n, &a);
    if (st == KVP_OK)
        *op_id = a.op_id;
    return st;
}

/* Op ids are unique per node: at most one session has the load. */
static kvp_status_t do_cancel(kvp_node_t *n, void *arg)
{
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &n->sessions)
    {
        if (kvp__session_cancel(KVP_SESSION_OF(p, node_link), *(uint64_t *)arg) == KVP_OK)
            return KVP_OK;
    }
    return KVP_ERR_NOT_FOUND;
}

KVP_EXPORT kvp_status_t kvp_cancel(kvp_node_t *n, uint64_t op_id)
{
    if (n == NULL || op_id == 0)
        return KVP_ERR_INVALID;
    return kvp__node_exec(n, do_cancel, &op_id);
}

static kvp_status_t do_finish(kvp_node_t *n, void *arg)
{
    uint64_t req = *(uint64_t *)arg;
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &n->sessions)
    {
        kvp__session_finish_request(KVP_SESSION_OF(p, node_link), req);
    }
    return KVP_OK;
}

KVP_EXPORT kvp_status_t kvp_finish_request(kvp_node_t *n, uint64_t request_id)
{
    if (n == NULL)
        return KVP_ERR_INVALID;
    /* Frames, events and unpinning; transfers it leaves running keep the
     * node thread polling (kvp__node_exec_quiet). */
    return kvp__node_exec_quiet(n, do_finish, &request_id);
}

KVP_EXPORT kvp_status_t kvp_poll_events(kvp_node_t *n, kvp_event_t *out, uint32_t cap,
                                        uint32_t *n_out)
{
    if (n == NULL || out == NULL || n_out == NULL)
        return KVP_ERR_INVALID;
    return kvp__node_take_events(n, out, cap, n_out);
}

KVP_EXPORT kvp_status_t kvp_wait_events(kvp_node_t *n, kvp_event_t *out, uint32_t cap,
                                        uint32_t *n_out, int32_t timeout_ms)
{
    if (n == NULL || out == NULL || n_out == NULL || cap == 0)
        return KVP_ERR_INVALID;
    *n_out = 0;
    return kvp__node_wait_events(n, out, cap, n_out, timeout_ms);
}

