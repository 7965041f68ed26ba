/*
 * node.c -- the node's life (SPEC §2 layer 6): the config defaults, create
 * (the store, the data transport, the control plane, the KV-event
 * publisher, the progress thread) and destroy (the bounded drain of SPEC
 * §7.6, then everything in reverse order).
 *
 * The rest of the node: the session table (sessions.c), the poll round and
 * its threads (thread.c), what is held past a session (hold.c), the event
 * ring (ring.c), the public API (api.c, api_inspect.c).
 */
#include "node/node.h"
#include "node/events.h"
#ifdef KVP_TESTING
#include "transport/fake.h"
#endif
#include "transport/ucx.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sodium.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/eventfd.h>
#include <unistd.h>

uint64_t kvp__node_now(const kvp_node_t *n)
{
    return kvp_clock_now(n->clock);
}

/* -------------------------------------------------------------- create */

KVP_EXPORT void kvp_config_init(kvp_config_t *c)
{
    memset(c, 0, sizeof(*c));
    c->listen_addr = "127.0.0.1:0";
    c->num_blocks = 1024;
    c->block_size = 256 * 1024;
    c->compat = "";
    c->verify_checksums = 1;
    c->heartbeat_ms = 500;
    c->dead_after_ms = 2000;
    c->handshake_timeout_ms = 10000;
    c->lookup_pending_ms = 5000;
    c->supply_pin_ms = 30000;
    c->load_timeout_ms = 30000;
    c->abort_resend_ms = 2000;
    c->abort_ack_timeout_ms = 10000;
    c->parked_demand_ms = 20000;
    c->hold_cap_ms = 120000;
    c->suspect_period_ms = 0; /* 0 = 10 x hold cap */
    c->idle_session_ms = 300000;
    c->wait_spin_us = 50;
    c->shutdown_drain_ms = 3000;
    c->max_sessions = 1024;
    c->max_pins = 0; /* 0 = 4 x num_blocks */
    c->max_retained = 4096;
    c->max_quarantined = 0; /* 0 = 25% of the region */
    c->max_inflight_bytes_per_peer = 1ull << 30;
    c->backoff_min_ms = 100;
    c->backoff_max_ms = 5000;
    c->max_preauth = 32;
    c->max_preauth_per_addr = 8;
    c->preauth_timeout_ms = 3000;
    c->max_lookup_keys_per_sec = 2000000; /* issue 27: docs/DESIGN.md "LOOKUP key rate" */
    c->max_wanted_ops_per_peer = 16;      /* issue 29 step 2: "keys wanted" */
}

/* Store callbacks: what the store holds, told to routers (KV events). */
static void node_store_commit_cb(void *arg, const void *key, uint32_t key_len,
                                 kvp_slot_ref_t ref)
{
    kvp_node_t *n = arg;
    (void)ref;
    if (n->kvevents != NULL)
        kvp__kvevents_stored(n->kvevents, key, key_len);
}

static void node_store_remove_cb(void *arg, const void *key, uint32_t key_len)
{
    kvp_node_t *n = arg;
    if (n->kvevents != NULL)
        kvp__kvevents_removed(n->kvevents, key, key_len);
}

static kvp_status_t node_make_kvevents(kvp_node_t *n, const kvp_config_t *cfg)
{
    if (cfg->kv_events_endpoint == NULL)
        return KVP_OK;
    kvp_kvevents_config_t ec = {0};
    ec.endpoint = cfg->kv_events_endpoint;
    ec.replay_endpoint = cfg->kv_events_replay_endpoint;
    ec.node_id = n->peer_id;
    ec.model = cfg->compat;
    ec.hwm = cfg->kv_events_hwm;
    ec.replay_batches = cfg->kv_events_replay_batches;
    ec.log_prefix = n->name;
    return kvp__kvevents_create(&ec, &n->kvevents);
}

static void store_config(const kvp_node_t *n, kvp_store_config_t *sc)
{
    memset(sc, 0, sizeof(*sc));
    sc->num_blocks = n->cfg.num_blocks;
    sc->block_size = n->cfg.block_size;
    sc->huge_pages = n->cfg.huge_pages;
    sc->max_pins = n->cfg.max_pins;
    sc->suspect_period_ns = n->cfg.suspect_period_ms * KVP_NSEC_PER_MSEC;
    sc->hash_seed = n->cfg.hash_seed;
    sc->clock = n->clock;
    sc->log_prefix = n->name;
    sc->commit_cb = node_store_commit_cb;
    sc->remove_cb = node_store_remove_cb;
    sc->commit_cb_arg = (void *)n; /* the callbacks run on the owner thread */
    sc->external = n->cfg.external_slots != 0; /* issue 29 */
    sc->unpublish_cb = kvp__node_unpublished;
}

#ifdef KVP_TESTING
/* Fake transport (test builds only): the store maps its own region first, so
 * the fake's landing checker can see our slots; then the region is registered. */
static kvp_status_t node_make_fake(kvp_node_t *n, const kvp_node_seams_t *seams)
{
    kvp_store_config_t sc;
    kvp_layout_t layout = {n->cfg.num_blocks, n->cfg.block_size};
    void *base;
    kvp_status_t st;
    if (seams == NULL || seams->fake_fabric == NULL)
        return KVP_ERR_UNSUPPORTED; /* the fake needs a fabric: tests pass one */
    store_config(n, &sc);
    if (n->cfg.external_slots) { /* issue 29: the embedding's region, or the store maps one */
        sc.region = n->cfg.region;
        sc.region_len = n->cfg.region_len;
    }
    if ((st = kvp_store_create(&sc, &n->store)) != KVP_OK)
        return st;
    kvp_fake_config_t fc = {0};
    fc.fabric = seams->fake_fabric;
    fc.clock = n->clock;
    fc.store = n->store;
    fc.log_prefix = n->name;
    fc.default_path = seams->fake_path ? seams->fake_path : KVP_PATH_FAKE_FENCEABLE;
    fc.default_delay_ns = seams->fake_delay_ns;
    if ((st = kvp_fake_create(&fc, &n->xport)) != KVP_OK)
        return st;
    return n->xport->ops->register_region(n->xport, kvp_store_base(n->store),
                                          kvp_store_region_len(n->store), &layout, &base);
}
#endif

/* UCX: the transport allocates the region (direct shared-memory puts) unless
 * the embedding supplied one; the store manages it; the transport frees it. */
static kvp_status_t node_make_ucx(kvp_node_t *n)
{
    kvp_layout_t layout = {n->cfg.num_blocks, n->cfg.block_size};
    size_t len = (size_t)n->cfg.num_blocks * n->cfg.block_size;
    void *base = NULL;
    kvp_store_config_t sc;
    kvp_ucx_config_t uc;
    kvp_ucx_config_default(&uc);
    uc.log_prefix = n->name;
    uc.clock = n->clock;
    uc.max_transfers = n->cfg.max_retained + 1024;
    uc.connect_timeout_ms = n->cfg.dead_after_ms; /* a data path must come up as fast */
    uc.listen_addr = n->cfg.listen_addr; /* issue 27: the data stream on that host */
    uc.data_port = (uint16_t)n->cfg.data_port;
    kvp_status_t st = kvp_ucx_xport_create(&uc, &n->xport);
    if (st != KVP_OK)
        return st;
    st = n->xport->ops->register_region(n->xport, n->cfg.region, len, &layout, &base);
    if (st != KVP_OK)
        return st;
    store_config(n, &sc);
    sc.region = base;
    sc.region_len = len;
    /* Fault the region's pages in now (one batched call) rather than one
     * page fault per 4 KiB on the first WRITE into each slot and the first
     * checksum of it: measured here, first-touch faults dominated a fetch.
     * Best effort: older kernels answer EINVAL and nothing changes. */
    if (madvise(base, len, MADV_POPULATE_WRITE) != 0)
        KVP_DEBUG(n->name, "region pre-fault not available: %s", strerror(errno));
    return kvp_store_create(&sc, &n->store);
}

#ifdef KVP_TESTING /* test builds only (issue 31): never in the shipped library */
kvp_xport_t *kvp__node_xport(kvp_node_t *n)
{
    return n->xport;
}

kvp_store_t *kvp__node_store(kvp_node_t *n)
{
    return n->store;
}
#endif /* KVP_TESTING */

/* Issue 27 defaults, chosen so that peers together never hold more than
 * half the slots pinned, one peer a quarter (at least 64 slots, so that a
 * small node still serves a usual prefix in one lookup, but never more than
 * the half); a faulty peer's quarantine stops displacing READY blocks at an
 * eighth; memory and rounds per peer far above a vLLM tier's needs (one
 * round per request in flight, ~90 B per held key) and far below what a
 * host notices. */
void kvp__node_budget_defaults(kvp_config_t *c)
{
    if (c->max_supply_pins_per_peer == 0)
        c->max_supply_pins_per_peer =
            KVP_MAX(KVP_MAX(c->num_blocks / 4, KVP_MIN(c->num_blocks / 2, 64u)), 1u);
    if (c->max_supply_pins == 0)
        c->max_supply_pins = KVP_MAX(c->num_blocks / 2, 1);
    if (c->max_lookup_rounds_per_peer == 0)
        c->max_lookup_rounds_per_peer = 1024;
    if (c->max_lookup_bytes_per_peer == 0)
        c->max_lookup_bytes_per_peer = 16ull << 20;
    if (c->max_lease_ms == 0) {
        uint32_t lease = c->pin_lease_ms ? c->pin_lease_ms : c->supply_pin_ms;
        c->max_lease_ms = lease > UINT32_MAX / 4 ? UINT32_MAX : 4 * lease;
    }
    if (c->max_quarantined_per_peer == 0)
        c->max_quarantined_per_peer = KVP_MAX(c->num_blocks / 8, 1);
    if (c->max_wanted_peers == 0)
        c->max_wanted_peers = c->max_sessions;
}

void kvp__node_ctl_runtime(const kvp_config_t *c, kvp_ctl_config_t *cc)
{
    cc->heartbeat_ns = (uint64_t)c->heartbeat_ms * KVP_NSEC_PER_MSEC;
    cc->dead_after_ns = (uint64_t)c->dead_after_ms * KVP_NSEC_PER_MSEC;
    cc->handshake_timeout_ns = (uint64_t)c->handshake_timeout_ms * KVP_NSEC_PER_MSEC;
    cc->backoff_min_ns = (uint64_t)c->backoff_min_ms * KVP_NSEC_PER_MSEC;
    cc->backoff_max_ns = (uint64_t)c->backoff_max_ms * KVP_NSEC_PER_MSEC;
    cc->max_sessions = c->max_sessions;
    cc->max_preauth = c->max_preauth;
    cc->max_preauth_per_addr = c->max_preauth_per_addr;
    cc->preauth_timeout_ns = (uint64_t)c->preauth_timeout_ms * KVP_NSEC_PER_MSEC;
    cc->psk = c->psk;
    cc->psk_len = c->psk_len;
}

static kvp_status_t node_make_ctl(kvp_node_t *n, const kvp_node_seams_t *seams)
{
    kvp_ctl_config_t cc = {0};
    cc.peer_id = n->cfg.peer_id;
    cc.instance_id = n->cfg.instance_id;
    cc.listen_addr = n->cfg.listen_addr;
    cc.num_blocks = n->cfg.num_blocks;
    cc.block_size = n->cfg.block_size;
    cc.fingerprint = n->fingerprint;
    cc.compat = n->cfg.compat;
    cc.hash_seed = n->cfg.hash_seed;
    cc.blob = n->blob;
    cc.blob_len = n->blob_len;
    kvp__node_ctl_runtime(&n->cfg, &cc);
    cc.loop = n->loop;
    cc.fake_net = seams ? seams->fake_net : NULL;
    kvp__node_ctl_callbacks(n, &cc.cb);
    cc.log_prefix = n->name;
    kvp_status_t st = kvp_ctl_create(&cc, &n->ctl);
    if (st == KVP_ERR_IO) /* the listener: errno as bind/listen left it */
        kvp__set_last_error("listen_addr %s: cannot listen: %s", cc.listen_addr, strerror(errno));
    return st;
}

static void node_free(kvp_node_t *n);

/* The node's fields before anything is created (kvp__node_create_ex). */
static void node_init(kvp_node_t *n, const kvp_config_t *cfg, const kvp_node_seams_t *seams,
                      bool loopback)
{
    n->listen_loopback = loopback || (seams && seams->fake_net);
    n->cfg = *cfg;
    n->evfd = -1;
    n->pollfd = -1;
    snprintf(n->name, sizeof(n->name), "%s", cfg->name ? cfg->name : "kvpeer");
    if (n->cfg.suspect_period_ms == 0)
        n->cfg.suspect_period_ms = 10ull * n->cfg.hold_cap_ms;
    if (n->cfg.max_quarantined == 0)
        n->cfg.max_quarantined = KVP_MAX(n->cfg.num_blocks / 4, 1);
    kvp__node_budget_defaults(&n->cfg);
    n->fingerprint = kvp_hash64(cfg->compat ? cfg->compat : "",
                                cfg->compat ? strlen(cfg->compat) : 0, cfg->hash_seed);
    n->clock = seams && seams->clock ? seams->clock : kvp_clock_real();
    n->wait_exit_delay_ms = seams ? seams->wait_exit_delay_ms : 0;
    n->next_op_id = 1;
    kvp__session_env_init(&n->env);
    n->env.cfg = &n->cfg;
    n->env.name = n->name;
    n->env.clock = n->clock;
    n->env.st = &n->st;
    n->env.rl_proto = &n->rl_proto;
    n->env.up = &kvp__node_session_up;
    n->env.up_arg = n;
    kvp_list_init(&n->sessions);
    kvp_list_init(&n->kept);
    kvp_list_init(&n->active);
    kvp_list_init(&n->flushq);
    kvp_list_init(&n->cmds);
    kvp_ratelimit_init(&n->rl_proto, KVP_NSEC_PER_SEC, 5);
    kvp_ratelimit_init(&n->rl_cap, KVP_NSEC_PER_SEC, 1);
    kvp_ratelimit_init(&n->rl_local, KVP_NSEC_PER_SEC, 1);
    pthread_mutex_init(&n->owner, NULL);
    pthread_mutex_init(&n->lock, NULL);
    pthread_cond_init(&n->cond, NULL);
    n->xport_io.fd = -1;
}

/* The region, the store and the data transport; then the transport's blob,
 * which the ctl sends to authenticated peers. */
static kvp_status_t node_make_data_plane(kvp_node_t *n, const kvp_node_seams_t *seams)
{
    kvp_status_t st;
#ifdef KVP_TESTING
    st = n->cfg.transport == KVP_TRANSPORT_FAKE ? node_make_fake(n, seams) : node_make_ucx(n);
#else
    /* the fake transport exists in test builds (kvpeer_testing) only */
    (void)seams;
    st = n->cfg.transport == KVP_TRANSPORT_FAKE ? KVP_ERR_UNSUPPORTED : node_make_ucx(n);
#endif
    if (st != KVP_OK)
        return st;
    if ((st = n->xport->ops->local_blob(n->xport, &n->blob, &n->blob_len)) != KVP_OK)
        return st;
    n->env.loop = n->loop; /* before the ctl: sessions start with it */
    n->env.store = n->store;
    n->env.xport = n->xport;
    return KVP_OK;
}

/* Caller-driven mode: the node fd must also wake for incoming frames, the
 * transport and timers (kvpeer.h), i.e. whenever kvp_node_progress() has
 * work. One epoll set over the event fd and the loop's epoll fd (which holds
 * the sockets, the transport fd and a timerfd armed at the nearest
 * deadline) is readable exactly then. Closed by node_free. */
static kvp_status_t node_open_pollfd(kvp_node_t *n)
{
    int fds[2] = {n->evfd, kvp_loop_fd(n->loop)};
    if ((n->pollfd = epoll_create1(EPOLL_CLOEXEC)) < 0)
        goto fail;
    for (int i = 0; i < 2; i++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = fds[i]};
        if (epoll_ctl(n->pollfd, EPOLL_CTL_ADD, fds[i], &ev) != 0)
            goto fail;
    }
    return KVP_OK;
fail:
    KVP_ERROR(n->name, "node fd: epoll: %s", strerror(errno));
    return KVP_ERR_IO;
}

kvp_status_t kvp__node_create_ex(const kvp_config_t *cfg, const kvp_node_seams_t *seams,
                                 kvp_node_t **out)
{
    kvp_status_t st;
    kvp__clear_last_error();
    bool loopback = false;
    if (out == NULL || (st = kvp__config_check(cfg)) != KVP_OK)
        return KVP_ERR_INVALID;
    /* The fake network's addresses are names, not hosts: no gate there. */
    if (!(seams && seams->fake_net) && kvp__config_check_gate(cfg, &loopback) != KVP_OK)
        return KVP_ERR_INVALID;
    kvp_node_t *n = kvp__calloc(1, sizeof(*n));
    if (n == NULL)
        return KVP_ERR_NOMEM;
    node_init(n, cfg, seams, loopback);
    if (cfg->psk_len) { /* kvp_config_t buffers are borrowed for this call only */
        if ((n->psk_copy = kvp__malloc(cfg->psk_len)) == NULL) {
            st = KVP_ERR_NOMEM;
            goto fail;
        }
        memcpy(n->psk_copy, cfg->psk, cfg->psk_len);
        n->cfg.psk = n->psk_copy;
    }
    if (!(seams && seams->no_event_fd) && (n->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
        st = KVP_ERR_IO;
        goto fail;
    }
    if ((st = kvp_loop_create(n->clock, &n->loop)) != KVP_OK)
        goto fail;
    kvp__node_hold_init(n);
    kvp_loop_set_wakeup_cb(n->loop, kvp__node_wakeup_cb, n);
    if ((st = node_make_data_plane(n, seams)) != KVP_OK || (st = node_make_ctl(n, seams)) != KVP_OK)
        goto fail;
    snprintf(n->peer_id, sizeof(n->peer_id), "%s", kvp_ctl_peer_id(n->ctl));
    if (cfg->name == NULL)
        snprintf(n->name, sizeof(n->name), "%s", n->peer_id);
    if ((st = node_make_kvevents(n, cfg)) != KVP_OK)
        goto fail;
    int xfd = n->xport->ops->event_fd(n->xport);
    if (xfd >= 0 &&
        (st = kvp_io_start(n->loop, &n->xport_io, xfd, EPOLLIN, kvp__node_xport_io_cb, n)) != KVP_OK)
        goto fail;
    kvp__node_hold_start(n);
    if (cfg->thread_mode == KVP_THREAD_CALLER && n->evfd >= 0 &&
        (st = node_open_pollfd(n)) != KVP_OK)
        goto fail;
    atomic_store_explicit(&n->round_ns, kvp_clock_now(kvp_clock_real()), memory_order_relaxed);
    if (cfg->thread_mode == KVP_THREAD_OWN && (st = kvp__node_thread_start(n)) != KVP_OK)
        goto fail;
    KVP_INFO(n->name, "node up: %u blocks x %u B, transport %s, compat '%s' (fingerprint %016llx)",
             n->cfg.num_blocks, n->cfg.block_size, n->xport->ops->name,
             cfg->compat ? cfg->compat : "", (unsigned long long)n->fingerprint);
    *out = n;
    return KVP_OK;
fail:
    kvp__note_create_failure(st);
    node_free(n);
    return st;
}

KVP_EXPORT kvp_status_t kvp_node_create(const kvp_config_t *cfg, kvp_node_t **out)
{
    return kvp__node_create_ex(cfg, NULL, out);
}

/* ------------------------------------------------------------- destroy */

static bool node_busy(kvp_node_t *n)
{
    kvp_list_t *p, *t;
    if (!kvp_list_empty(&n->env.retained) || !kvp_list_empty(&n->env.quarantined) ||
        !kvp_list_empty(&n->active))
        return true;
    kvp_list_foreach_safe(p, t, &n->sessions)
    {
        kvp_session_info_t si;
        kvp__session_info(KVP_SESSION_OF(p, node_link), &si);
        if (si.loads_inflight > 0)
            return true;
    }
    return false;
}

/* Bounded drain (SPEC §7.6): in-flight loads and transfers, then sessions
 * closed, then retained transfers and quarantined slots; what remains at the
 * deadline is released with error logs. */
static void node_drain(kvp_node_t *n)
{
    uint64_t deadline = kvp__node_now(n) + (uint64_t)n->cfg.shutdown_drain_ms * KVP_NSEC_PER_MSEC;
    bool real = n->clock == kvp_clock_real();
    int rounds = 0;
    kvp_list_t *p, *t;
    n->draining = true; /* sessions are torn down below; none may start after */
    kvp_list_foreach_safe(p, t, &n->sessions) /* fetches waiting for budget never start */
        kvp__client_fail_queued(KVP_SESSION_OF(p, node_link), KVP_ERR_CLOSED);
    while (node_busy(n) && kvp__node_now(n) < deadline && (real || rounds++ < 100))
        kvp__node_round(n, real ? 5 : 0);
    while (!kvp_list_empty(&n->sessions)) {
        kvp_session_t *s = KVP_SESSION_OF(n->sessions.next, node_link);
        kvp__node_session_down(n, s, KVP_BYE_SHUTDOWN, false, "node shutdown");
    }
    rounds = 0;
    while (node_busy(n) && kvp__node_now(n) < deadline && (real || rounds++ < 100))
        kvp__node_round(n, real ? 5 : 0);
    kvp__session_held_end(&n->env, "shutdown drain over");
    for (int i = 0; i < 10; i++) /* let the BYEs go out */
        kvp_loop_run_once(n->loop, 0);
}

static void node_free(kvp_node_t *n)
{
    kvp__kvevents_destroy(n->kvevents); /* last batch: AllBlocksCleared */
    n->kvevents = NULL;
    if (n->ctl)
        kvp_ctl_destroy(n->ctl);
    if (n->loop) {
        kvp_timer_stop(n->loop, &n->hold_timer);
        if (n->xport_io.active)
            kvp_io_stop(n->loop, &n->xport_io);
    }
    /* Transport first: its pending copies may still target our region;
     * then the store (which unmaps the region only if it mapped it). */
    if (n->xport)
        n->xport->ops->close(n->xport, true);
    if (n->store)
        kvp_store_destroy(n->store);
    if (n->loop)
        kvp_loop_destroy(n->loop);
    if (n->evfd >= 0)
        close(n->evfd);
    if (n->pollfd >= 0)
        close(n->pollfd);
    kvp__free(n->engine_pins);
    kvp__session_env_fini(&n->env);
    kvp__node_kept_free(n);
    pthread_mutex_destroy(&n->owner);
    pthread_mutex_destroy(&n->lock);
    pthread_cond_destroy(&n->cond);
    kvp__free(n->events);
    kvp__free(n->txbuf);
    if (n->psk_copy)
        sodium_memzero(n->psk_copy, n->cfg.psk_len);
    kvp__free(n->psk_copy);
    kvp__free(n);
}

KVP_EXPORT void kvp_node_destroy(kvp_node_t *n)
{
    if (n == NULL)
        return;
    if (n->thread_running)
        kvp__node_thread_stop(n); /* the drain runs here, alone */
    node_drain(n);
    KVP_INFO(n->name, "node down");
    node_free(n);
}

