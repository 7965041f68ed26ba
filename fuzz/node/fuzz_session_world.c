/*
 * fuzz_session_world.c -- the world of the session fuzzer (see
 * fuzz_session_run.c for the design): the input cursor, the raw fake peer
 * (a bare kvp_ctl_t + fake transport), virtual-time ticks, the oracles
 * checked after every op, setup and teardown.
 */
#include "fuzz_session_int.h"

/* ------------------------------------------------------------ helpers */

uint8_t fz_u8(fz_t *z)
{
    return z->pos < z->len ? z->in[z->pos++] : 0;
}

uint32_t fz_u32(fz_t *z)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)fz_u8(z) << (8 * i);
    return v;
}

void fz_fail(fz_t *z, const char *fmt, const char *arg)
{
    if (z->failed)
        return;
    z->failed = true;
    snprintf(z->res->why, sizeof(z->res->why), fmt, arg);
}

uint32_t fz_key(uint32_t k, uint8_t *out)
{
    if (k == 255) { /* the longest legal key */
        memset(out, 'K', KVP_WIRE_KEY_MAX);
        return KVP_WIRE_KEY_MAX;
    }
    return (uint32_t)snprintf((char *)out, 32, "blk-%08u", k % 20u);
}

/* Deterministic block content (as world.h). */
void fz_block(uint32_t k, uint8_t *buf, size_t len)
{
    kvp_rng_t r;
    kvp_rng_seed(&r, 0x5eed0000u + k);
    for (size_t i = 0; i < len; i += 8) {
        uint64_t v = kvp_rng_next(&r);
        memcpy(buf + i, &v, KVP_MIN(8, len - i));
    }
}

/* ------------------------------------------------------------ the fake peer */

static kvp_status_t peer_on_ready(void *arg, kvp_link_t *link, const kvp_msg_hello_t *h,
                                  const void *blob, size_t blob_len)
{
    fz_t *z = arg;
    kvp_layout_t lay = {h->num_blocks, h->block_size};
    kvp_status_t st = z->px->ops->add_peer(z->px, blob, blob_len, &lay, &z->pxpeer);
    if (st != KVP_OK)
        return st;
    z->link = link;
    z->n_fetch = z->n_look = z->n_sent = 0;
    z->res->readies++;
    return KVP_OK;
}

static void peer_record_fetch(fz_t *z, const kvp_msg_fetch_t *m)
{
    fz_fetch_t *f = &z->fetch[z->n_fetch++ % FZ_RECS];
    f->req = m->request_id;
    f->round = m->round;
    f->n = KVP_MIN(m->n, FZ_ITEMS);
    f->closed = false;
    for (uint32_t i = 0; i < f->n; i++) {
        f->slot[i] = m->items[i].dst_slot;
        f->gen[i] = m->items[i].dst_gen;
        f->src[i] = -1;
    }
}

static void peer_on_frame(void *arg, kvp_link_t *link, const kvp_msg_t *m)
{
    fz_t *z = arg;
    if (m->type == KVP_MSG_FETCH && m->u.fetch.n > 0) {
        peer_record_fetch(z, &m->u.fetch);
    } else if (m->type == KVP_MSG_LOOKUP) {
        fz_lookup_t *l = &z->look[z->n_look++ % FZ_RECS];
        *l = (fz_lookup_t){m->u.lookup.request_id, m->u.lookup.round, m->u.lookup.n};
    }
}

/* The link is gone: a real source cancels its transfers here; the fake
 * peer forgets every FETCH of the incarnation (it never writes for them). */
static void peer_on_down(void *arg, kvp_link_t *link, kvp_down_reason_t reason, uint16_t bye,
                         bool fault)
{
    fz_t *z = arg;
    if (link != z->link)
        return;
    z->old_src = *kvp_link_local_epoch(link);
    z->old_dst = *kvp_link_remote_epoch(link);
    z->have_old = true;
    z->link = NULL;
    z->n_fetch = z->n_look = z->n_sent = 0;
    if (z->pxpeer != 0)
        z->px->ops->remove_peer(z->px, z->pxpeer);
    z->pxpeer = 0;
}

/* Release the fake peer's terminal writes (it has no pins to drop). */
static void peer_poll(fz_t *z)
{
    kvp_xfer_result_t r[64];
    size_t n = 0;
    if (z->pxpeer != 0)
        z->px->ops->poll(z->px, z->pxpeer, r, 64, &n);
    z->px->ops->poll_retired(z->px, r, 64, &n);
}

static kvp_status_t peer_create(fz_t *z)
{
    kvp_layout_t lay = {FZ_BLOCKS, FZ_BS};
    void *base = NULL;
    const void *blob;
    size_t blob_len;
    kvp_status_t st;
    if ((st = kvp_loop_create(&z->mc.clock, &z->ploop)) != KVP_OK)
        return st;
    kvp_fake_config_t fc = {.fabric = z->fab, .clock = &z->mc.clock, .log_prefix = FZ_PEER};
    if ((st = kvp_fake_create(&fc, &z->px)) != KVP_OK)
        return st;
    if ((z->pregion = aligned_alloc(4096, (size_t)FZ_BLOCKS * FZ_BS)) == NULL)
        return KVP_ERR_NOMEM;
    for (uint32_t i = 0; i < FZ_BLOCKS; i++)
        fz_block(1000 + i, z->pregion + (size_t)i * FZ_BS, FZ_BS);
    st = z->px->ops->register_region(z->px, z->pregion, (size_t)FZ_BLOCKS * FZ_BS, &lay, &base);
    if (st != KVP_OK || (st = z->px->ops->local_blob(z->px, &blob, &blob_len)) != KVP_OK)
        return st;
    kvp_ctl_config_t cc = {0};
    cc.listen_addr = FZ_PEER;
    cc.num_blocks = FZ_BLOCKS;
    cc.block_size = FZ_BS;
    cc.fingerprint = z->fingerprint;
    cc.hash_seed = z->cfg.hash_seed;
    cc.blob = blob;
    cc.blob_len = blob_len;
    cc.heartbeat_ns = (uint64_t)z->cfg.heartbeat_ms * FZ_MS;
    cc.dead_after_ns = (uint64_t)z->cfg.dead_after_ms * FZ_MS;
    cc.handshake_timeout_ns = (uint64_t)z->cfg.handshake_timeout_ms * FZ_MS;
    cc.backoff_min_ns = 20 * FZ_MS;
    cc.backoff_max_ns = 100 * FZ_MS;
    cc.max_sessions = 4;
    cc.loop = z->ploop;
    cc.fake_net = z->net;
    cc.cb = (kvp_ctl_callbacks_t){peer_on_ready, peer_on_frame, peer_on_down, NULL, z};
    cc.log_prefix = FZ_PEER;
    if ((st = kvp_ctl_create(&cc, &z->pctl)) != KVP_OK)
        return st;
    return kvp_ctl_want(z->pctl, FZ_NODE);
}

static void peer_destroy(fz_t *z)
{
    if (z->pctl)
        kvp_ctl_destroy(z->pctl);
    if (z->px) {
        if (z->pxpeer != 0)
            z->px->ops->remove_peer(z->px, z->pxpeer);
        z->px->ops->close(z->px, true);
    }
    free(z->pregion);
    if (z->ploop)
        kvp_loop_destroy(z->ploop);
}

/* Send with the epochs the current mode asks for (stale frames must be
 * dropped by the node's ctl before they change anything). */
void peer_send(fz_t *z, const kvp_msg_t *m)
{
    if (z->link == NULL)
        return;
    int mode = z->epoch_mode;
    z->epoch_mode = 0;
    z->res->frames++;
    kvp_epoch_t s = *kvp_link_local_epoch(z->link), d = *kvp_link_remote_epoch(z->link);
    if (mode == 0) {
        kvp_link_send(z->link, m);
        return;
    }
    if (mode == 1 && z->have_old) {
        s = z->old_src;
        d = z->old_dst;
    } else if (mode == 2) {
        kvp_epoch_t t = s;
        s = d;
        d = t;
    } else if (mode == 3) {
        memcpy(s.b, z->forged, 16);
        s.b[0] |= 1; /* non-zero: a zero epoch is a protocol error, tested too */
    } else {
        memcpy(d.b, z->forged + 16, 16);
    }
    kvp_link_send_epochs(z->link, m, &s, &d);
}

/* --------------------------------------------------------------- the world */

static void fz_collect(fz_t *z)
{
    kvp_event_t ev[64];
    uint32_t got = 0;
    do {
        if (kvp_poll_events(z->node, ev, 64, &got) != KVP_OK)
            return;
        for (uint32_t i = 0; i < got; i++) {
            if (ev[i].type != KVP_EV_LOAD && ev[i].type != KVP_EV_LOOKUP)
                continue;
            if (ev[i].type == KVP_EV_LOAD)
                z->res->loads++;
            if (z->verbose)
                fprintf(stderr, "event %s op %llu: %s, %u ok\n",
                        ev[i].type == KVP_EV_LOAD ? "load" : "lookup",
                        (unsigned long long)ev[i].op_id, kvp_status_str(ev[i].status),
                        ev[i].n_ok);
            bool known = false;
            for (uint32_t k = 0; k < z->n_nop; k++) {
                if (z->nop[k].op_id != ev[i].op_id)
                    continue;
                known = true;
                if (z->nop[k].type != ev[i].type)
                    fz_fail(z, "event of the wrong type for an op (%s)", "I4");
                if (++z->nop[k].events > 1)
                    fz_fail(z, "second outcome event for one op (%s)", "I4");
            }
            if (!known)
                fz_fail(z, "event for an op id never issued (%s)", "I4");
        }
    } while (got == 64);
}

void fz_check(fz_t *z)
{
    char why[192]; /* fits res->why with its prefix */
    if (kvp_store_check(kvp__node_store(z->node), why, sizeof(why)) != KVP_OK)
        fz_fail(z, "store check: %s", why);
    const kvp_fake_violation_t *v;
    size_t n = kvp_fake_violations(z->fab, &v);
    if (n > 0) {
        snprintf(why, sizeof(why), "%zu, first %s xfer %llu dst slot %u src slot %u", n,
                 kvp_fake_violation_kind_str(v[0].kind), (unsigned long long)v[0].xfer,
                 v[0].dst_slot, v[0].src_slot);
        fz_fail(z, "landing violations: %s", why);
    }
}

void fz_tick(fz_t *z, uint64_t ns)
{
    kvp_manual_clock_advance(&z->mc, ns);
    for (int pass = 0; pass < 2; pass++) {
        kvp_fake_net_deliver(z->net);
        kvp_fake_fabric_progress(z->fab);
        kvp_node_progress(z->node, 0);
        for (int i = 0; i < 8 && kvp_loop_run_once(z->ploop, 0) > 0; i++)
            ;
        peer_poll(z);
    }
    fz_collect(z);
}

void fz_advance(fz_t *z, uint64_t ns, uint64_t step)
{
    uint64_t end = kvp_clock_now(&z->mc.clock) + ns;
    while (kvp_clock_now(&z->mc.clock) < end)
        fz_tick(z, KVP_MIN(step, end - kvp_clock_now(&z->mc.clock)));
}

/* Honesty rule: before FETCH_DONE / ABORT_ACK, every scheduled copy of the
 * peer has landed (wedged writes never copy). Bounded. */
void peer_flush_writes(fz_t *z)
{
    for (int i = 0; i < 64; i++) {
        uint64_t next = kvp_fake_next_event_ns(z->px), now = kvp_clock_now(&z->mc.clock);
        if (next == UINT64_MAX)
            return;
        fz_tick(z, next > now ? next - now : 0);
    }
}

fz_nop_t *fz_nop_new(fz_t *z)
{
    if (z->n_nop >= FZ_NODE_OPS)
        return NULL;
    fz_nop_t *o = &z->nop[z->n_nop];
    memset(o, 0, sizeof(*o));
    return o;
}


void fz_keys(fz_t *z, fz_keys_t *ks, uint32_t n)
{
    size_t off = 0;
    ks->n = n;
    for (uint32_t i = 0; i < n; i++) {
        ks->len[i] = fz_key(fz_u8(z), ks->buf + off);
        ks->key[i] = (kvp_key_t){ks->buf + off, ks->len[i]};
        off += ks->len[i];
    }
}

/* Request ids and rounds: mostly small (collisions), sometimes huge. */
uint64_t fz_small(fz_t *z)
{
    uint8_t b = fz_u8(z);
    return b < 250 ? b % 5u : (uint64_t)fz_u32(z) << (b - 250) * 8;
}

void fz_config(fz_t *z, uint8_t conf)
{
    kvp_config_t *c = &z->cfg;
    kvp_config_init(c);
    c->name = FZ_NODE;
    c->listen_addr = FZ_NODE;
    c->transport = KVP_TRANSPORT_FAKE;
    c->thread_mode = KVP_THREAD_CALLER;
    c->num_blocks = FZ_BLOCKS;
    c->block_size = FZ_BS;
    c->compat = "model-x/fp16/16tok";
    c->heartbeat_ms = 50;
    c->dead_after_ms = 200;
    c->handshake_timeout_ms = 500;
    c->lookup_pending_ms = 200;
    c->supply_pin_ms = 300;
    c->load_timeout_ms = 1000;
    c->abort_resend_ms = 100;
    c->abort_ack_timeout_ms = 500;
    c->parked_demand_ms = 400;
    c->hold_cap_ms = 2000;
    c->shutdown_drain_ms = 200;
    c->backoff_min_ms = 20;
    c->backoff_max_ms = 100;
    if (conf & 2) { /* small limits: every refusal path is reachable */
        c->max_pins = 6;
        c->max_retained = 1;
        c->max_inflight_bytes_per_peer = 3ull * FZ_BS;
        c->max_quarantined = 2;
    }
    if (conf & 4)
        c->max_sessions = 1;
    z->fingerprint = kvp_hash64(c->compat, strlen(c->compat), c->hash_seed);
    z->seams = (kvp_node_seams_t){&z->mc.clock, z->net, z->fab,
                                  (conf & 1) ? KVP_PATH_FAKE_UNFENCEABLE
                                             : KVP_PATH_FAKE_FENCEABLE,
                                  (uint64_t)(1 + (conf >> 3) % 8) * FZ_MS, false, 0};
}

int fz_setup(fz_t *z, uint8_t conf)
{
    kvp_manual_clock_init(&z->mc, 1 * KVP_NSEC_PER_SEC);
    if (kvp_fake_fabric_create(&z->mc.clock, &z->fab) != KVP_OK ||
        kvp_fake_net_create(100 * 1000, &z->net) != KVP_OK)
        return -1;
    fz_config(z, conf);
    if (kvp__node_create_ex(&z->cfg, &z->seams, &z->node) != KVP_OK)
        return -1;
    if (peer_create(z) != KVP_OK)
        return -1;
    /* The handshake (bounded): most inputs start from a ready session. */
    for (int i = 0; i < 200 && z->link == NULL; i++)
        fz_tick(z, FZ_MS);
    return 0;
}

void fz_teardown(fz_t *z)
{
    if (z->node) {
        kvp_node_destroy(z->node);
        z->node = NULL;
    }
    peer_destroy(z);
    if (z->fab) {
        size_t v = kvp_fake_violations(z->fab, NULL);
        if (v > 0)
            fz_fail(z, "landing violations during shutdown (%s)", "drain");
        if (kvp_fake_fabric_destroy(z->fab) != KVP_OK)
            fz_fail(z, "fabric destroy: %s", "busy");
    }
    if (z->net)
        kvp_fake_net_destroy(z->net);
}
