/*
 * fuzz_session_run.c -- the world and op interpreter of the session fuzzer
 * (see fuzz_session.h for the oracles).
 *
 * World: one manual clock, one fake control network, one fake data fabric.
 * The node "n0:7000" is a real kvp_node_t (caller-driven). The fake peer
 * "peer:1" is a bare kvp_ctl_t on its own loop with a fake transport whose
 * region has NO store: what the node writes into it is not checked (the
 * peer is the hostile side), while everything that lands in the node's
 * region and every source slot the node's writes read is checked by the
 * fabric's landing checker against the node's store.
 *
 * The fake peer is hostile in the protocol but honest about its own WRITEs
 * (SPEC §9 trust model: an authenticated peer does not write outside the
 * slots a FETCH named and sends FETCH_DONE / ABORT_ACK only once its writes
 * are terminal). Hence: it writes only to (slot, gen) pairs of FETCHes of
 * the live incarnation, and before sending FETCH_DONE or ABORT_ACK it runs
 * virtual time until its own scheduled copies have landed.
 *
 * Input format: byte 0 = configuration (bit 0: unfenceable data path; bits
 * 1-2: small limits (pins, retained, in-flight bytes, quarantine); then ops
 * until the input ends, each an opcode byte followed by its argument bytes
 * (missing bytes read as 0). See fz_op() for the table.
 */
#include "fuzz_session.h"

#include "node/node.h"
#include "transport/fake.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FZ_NODE "n0:7000"
#define FZ_PEER "peer:1"
#define FZ_BLOCKS 16u
#define FZ_BS 4096u
#define FZ_ITEMS 6u
#define FZ_RECS 8u
#define FZ_NODE_OPS 48u
#define FZ_MAX_OPS 256u
#define FZ_MAX_VIRTUAL_NS (30ull * KVP_NSEC_PER_SEC)
#define FZ_MS KVP_NSEC_PER_MSEC

/* A FETCH the node sent to the fake peer (the peer may write into its
 * destinations and answer it). */
typedef struct fz_fetch {
    uint64_t req, round;
    uint32_t n;
    uint32_t slot[FZ_ITEMS], gen[FZ_ITEMS];
    int32_t src[FZ_ITEMS]; /* peer slot written into item i, -1 = none */
    bool closed;           /* we answered it: an honest peer writes no more */
} fz_fetch_t;

typedef struct fz_lookup {
    uint64_t req, round;
    uint32_t n;
} fz_lookup_t;

/* A node-side operation (caller-owned buffers live here until teardown). */
typedef struct fz_nop {
    uint64_t op_id;
    int type; /* KVP_EV_LOOKUP / KVP_EV_LOAD */
    uint32_t events;
    uint8_t results[FZ_ITEMS];
    int32_t bstat[FZ_ITEMS];
} fz_nop_t;

typedef struct fz {
    kvp_manual_clock_t mc;
    kvp_fake_fabric_t *fab;
    kvp_fake_net_t *net;
    kvp_config_t cfg;
    kvp_node_seams_t seams;
    kvp_node_t *node;
    uint64_t fingerprint;
    /* the fake peer */
    kvp_loop_t *ploop;
    kvp_ctl_t *pctl;
    kvp_xport_t *px;
    uint8_t *pregion;
    kvp_link_t *link;
    kvp_xpeer_id_t pxpeer;
    kvp_epoch_t old_src, old_dst;
    bool have_old;
    int epoch_mode; /* next send: 0 live, 1 old incarnation, 2 swapped, 3 forged */
    uint8_t forged[32];
    fz_fetch_t fetch[FZ_RECS];
    uint32_t n_fetch;
    fz_lookup_t look[FZ_RECS];
    uint32_t n_look;
    uint64_t sent_req[FZ_RECS], sent_round[FZ_RECS]; /* our FETCHes to the node */
    uint32_t n_sent;
    /* node-side ops */
    fz_nop_t nop[FZ_NODE_OPS];
    uint32_t n_nop;
    /* input cursor */
    const uint8_t *in;
    size_t len, pos;
    int verbose;
    bool known_bugs; /* KVPEER_FUZZ_KNOWN_BUGS set: do not steer around them */
    kvp_fuzz_session_result_t *res;
    bool failed;
} fz_t;

/* ------------------------------------------------------------ helpers */

static uint8_t fz_u8(fz_t *z)
{
    return z->pos < z->len ? z->in[z->pos++] : 0;
}

static uint32_t fz_u32(fz_t *z)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)fz_u8(z) << (8 * i);
    return v;
}

static void fz_fail(fz_t *z, const char *fmt, const char *arg)
{
    if (z->failed)
        return;
    z->failed = true;
    snprintf(z->res->why, sizeof(z->res->why), fmt, arg);
}

static void fz_log_sink(kvp_log_level_t level, const char *prefix, const char *line, void *arg)
{
    if (*(const int *)arg)
        fprintf(stderr, "  [%d %s] %s\n", (int)level, prefix ? prefix : "-", line);
}

static uint32_t fz_key(uint32_t k, uint8_t *out)
{
    if (k == 255) { /* the longest legal key */
        memset(out, 'K', KVP_WIRE_KEY_MAX);
        return KVP_WIRE_KEY_MAX;
    }
    return (uint32_t)snprintf((char *)out, 32, "blk-%08u", k % 20u);
}

/* Deterministic block content (as world.h). */
static void fz_block(uint32_t k, uint8_t *buf, size_t len)
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
static void peer_send(fz_t *z, const kvp_msg_t *m)
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

static void fz_check(fz_t *z)
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

static void fz_tick(fz_t *z, uint64_t ns)
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

static void fz_advance(fz_t *z, uint64_t ns, uint64_t step)
{
    uint64_t end = kvp_clock_now(&z->mc.clock) + ns;
    while (kvp_clock_now(&z->mc.clock) < end)
        fz_tick(z, KVP_MIN(step, end - kvp_clock_now(&z->mc.clock)));
}

/* Honesty rule: before FETCH_DONE / ABORT_ACK, every scheduled copy of the
 * peer has landed (wedged writes never copy). Bounded. */
static void peer_flush_writes(fz_t *z)
{
    for (int i = 0; i < 64; i++) {
        uint64_t next = kvp_fake_next_event_ns(z->px), now = kvp_clock_now(&z->mc.clock);
        if (next == UINT64_MAX)
            return;
        fz_tick(z, next > now ? next - now : 0);
    }
}

static fz_nop_t *fz_nop_new(fz_t *z)
{
    if (z->n_nop >= FZ_NODE_OPS)
        return NULL;
    fz_nop_t *o = &z->nop[z->n_nop];
    memset(o, 0, sizeof(*o));
    return o;
}

/* Keys from argument bytes: concatenated buffer + lengths. */
typedef struct fz_keys {
    uint8_t buf[FZ_ITEMS * KVP_WIRE_KEY_MAX];
    uint32_t len[FZ_ITEMS];
    kvp_key_t key[FZ_ITEMS];
    uint32_t n;
} fz_keys_t;

static void fz_keys(fz_t *z, fz_keys_t *ks, uint32_t n)
{
    size_t off = 0;
    ks->n = n;
    for (uint32_t i = 0; i < n; i++) {
        ks->len[i] = fz_key(fz_u8(z), ks->buf + off);
        ks->key[i] = (kvp_key_t){ks->buf + off, ks->len[i]};
        off += ks->len[i];
    }
}

/* KNOWN BUG (fuzz/node/known-crashes/): a FETCH naming one supplied key
 * twice needs a second pin per duplicate, taken by KVP_ASSERT after the
 * write was posted (server.c sround_post): at the pin limit the node
 * aborts. Until it is fixed, duplicates get a fresh, unsupplied key. */
static void fz_keys_dedup(fz_keys_t *ks)
{
    for (uint32_t i = 1; i < ks->n; i++)
        for (uint32_t j = 0; j < i; j++)
            if (ks->len[i] == ks->len[j] && memcmp(ks->key[i].data, ks->key[j].data, ks->len[i]) == 0) {
                uint8_t *d = (uint8_t *)ks->key[i].data; /* points into ks->buf */
                d[0] = (uint8_t)('A' + i); /* "Blk-..": never put */
                break;
            }
}

/* Request ids and rounds: mostly small (collisions), sometimes huge. */
static uint64_t fz_small(fz_t *z)
{
    uint8_t b = fz_u8(z);
    return b < 250 ? b % 5u : (uint64_t)fz_u32(z) << (b - 250) * 8;
}

/* ------------------------------------------------------- peer-side frames */

static void op_peer_lookup(fz_t *z)
{
    fz_keys_t ks;
    kvp_msg_t m = {.type = KVP_MSG_LOOKUP};
    m.u.lookup.request_id = fz_small(z);
    m.u.lookup.round = fz_small(z);
    fz_keys(z, &ks, fz_u8(z) % (FZ_ITEMS + 1));
    m.u.lookup.n = ks.n;
    m.u.lookup.keys = ks.key;
    peer_send(z, &m);
}

/* Destination slots: mostly in range, sometimes the first ones out of it. */
static uint32_t fz_slot(fz_t *z)
{
    uint8_t b = fz_u8(z);
    if (b < 240)
        return b % FZ_BLOCKS;
    return b == 255 ? UINT32_MAX : FZ_BLOCKS + (b - 240u);
}

static void op_peer_fetch(fz_t *z)
{
    fz_keys_t ks;
    kvp_fetch_item_t it[FZ_ITEMS];
    kvp_msg_t m = {.type = KVP_MSG_FETCH};
    m.u.fetch.request_id = fz_small(z);
    m.u.fetch.round = fz_small(z);
    m.u.fetch.flags = fz_u8(z) & 3u;
    fz_keys(z, &ks, fz_u8(z) % (FZ_ITEMS + 1));
    if (!z->known_bugs)
        fz_keys_dedup(&ks);
    for (uint32_t i = 0; i < ks.n; i++) {
        uint8_t g = fz_u8(z); /* explicit order: initialisers are unsequenced */
        uint32_t gen = g < 200 ? g : fz_u32(z);
        uint32_t slot = fz_slot(z);
        it[i] = (kvp_fetch_item_t){ks.key[i], slot, gen};
    }
    m.u.fetch.n = ks.n;
    m.u.fetch.items = it;
    uint32_t k = z->n_sent++ % FZ_RECS;
    z->sent_req[k] = m.u.fetch.request_id;
    z->sent_round[k] = m.u.fetch.round;
    peer_send(z, &m);
}

static void op_peer_abort(fz_t *z)
{
    kvp_msg_t m = {.type = KVP_MSG_ABORT};
    uint32_t n = KVP_MIN(z->n_sent, FZ_RECS), pick = fz_u8(z) % (n + 1);
    if (pick < n) {
        m.u.abort = (kvp_msg_abort_t){z->sent_req[pick], z->sent_round[pick]};
    } else {
        m.u.abort.request_id = fz_small(z);
        m.u.abort.round = fz_small(z);
    }
    peer_send(z, &m);
}

/* A recorded FETCH of the live incarnation, or NULL (then: garbage ids). */
static fz_fetch_t *fz_pick_fetch(fz_t *z)
{
    uint32_t n = KVP_MIN(z->n_fetch, FZ_RECS), pick = fz_u8(z) % (n + 1);
    return pick < n ? &z->fetch[pick] : NULL;
}

/* After FETCH_DONE / ABORT_ACK for (req, round) the round is over for the
 * peer too: it never writes for it again. */
static void peer_close_round(fz_t *z, uint64_t req, uint64_t round)
{
    for (uint32_t i = 0; i < KVP_MIN(z->n_fetch, FZ_RECS); i++)
        if (z->fetch[i].req == req && z->fetch[i].round == round)
            z->fetch[i].closed = true;
}

static const int32_t fz_statuses[] = {KVP_OK, KVP_ERR_NOT_FOUND, KVP_ERR_CANCELED,
                                      KVP_ERR_TRANSPORT, KVP_ERR_LIMIT, KVP_ERR_TIMEOUT,
                                      KVP_ERR_CHECKSUM, 12345, INT32_MIN};

static void op_peer_fetch_done(fz_t *z)
{
    kvp_fetch_block_t b[FZ_ITEMS + 1];
    kvp_msg_t m = {.type = KVP_MSG_FETCH_DONE};
    fz_fetch_t *f = fz_pick_fetch(z);
    m.u.fetch_done.request_id = f ? f->req : fz_small(z);
    m.u.fetch_done.round = f ? f->round : fz_small(z);
    m.u.fetch_done.status = fz_statuses[fz_u8(z) % (sizeof(fz_statuses) / sizeof(int32_t))];
    uint8_t nb = fz_u8(z), okbits = fz_u8(z), badbits = fz_u8(z);
    uint32_t n = f ? f->n : nb % (FZ_ITEMS + 1);
    if (f && (nb & 0xc0) == 0xc0) /* a count that contradicts the FETCH */
        n = (nb & 1) ? KVP_MIN(n + 1, FZ_ITEMS + 1) : (n ? n - 1 : 0);
    for (uint32_t i = 0; i < n; i++) {
        int32_t src = f && i < f->n ? f->src[i] : -1;
        const uint8_t *data = z->pregion + (size_t)(src >= 0 ? src : 0) * FZ_BS;
        b[i].ok = (okbits >> (i % 8)) & 1u;
        b[i].digest = kvp_digest(data, FZ_BS, z->cfg.hash_seed);
        if ((badbits >> (i % 8)) & 1u)
            b[i].digest.lo ^= 1;
    }
    m.u.fetch_done.n = n;
    m.u.fetch_done.blocks = b;
    peer_flush_writes(z);
    if (z->epoch_mode == 0)
        peer_close_round(z, m.u.fetch_done.request_id, m.u.fetch_done.round);
    peer_send(z, &m);
}

static void op_peer_abort_ack(fz_t *z)
{
    kvp_msg_t m = {.type = KVP_MSG_ABORT_ACK};
    fz_fetch_t *f = fz_pick_fetch(z);
    m.u.abort.request_id = f ? f->req : fz_small(z);
    m.u.abort.round = f ? f->round : fz_small(z);
    peer_flush_writes(z);
    if (z->epoch_mode == 0)
        peer_close_round(z, m.u.abort.request_id, m.u.abort.round);
    peer_send(z, &m);
}

static void op_peer_lookup_resp(fz_t *z)
{
    uint8_t r[FZ_ITEMS + 2];
    kvp_msg_t m = {.type = KVP_MSG_LOOKUP_RESP};
    uint32_t n = KVP_MIN(z->n_look, FZ_RECS), pick = fz_u8(z) % (n + 1);
    const fz_lookup_t *l = pick < n ? &z->look[pick] : NULL;
    m.u.lookup_resp.request_id = l ? l->req : fz_small(z);
    m.u.lookup_resp.round = l ? l->round : fz_small(z);
    uint8_t nb = fz_u8(z);
    m.u.lookup_resp.n = l && nb < 0xc0 ? KVP_MIN(l->n, FZ_ITEMS) : nb % (FZ_ITEMS + 2);
    for (uint32_t i = 0; i < m.u.lookup_resp.n; i++) {
        uint8_t v = fz_u8(z);
        r[i] = v < 0xf0 ? v & 1u : v; /* sometimes a result that is neither HIT nor MISS */
    }
    m.u.lookup_resp.results = r;
    peer_send(z, &m);
}

/* An honest WRITE into destinations a live FETCH named: completes after a
 * delay, fails after copying some blocks, or wedges without copying. */
static void op_peer_write(fz_t *z)
{
    fz_fetch_t *f = fz_pick_fetch(z);
    uint8_t mask = fz_u8(z), kind = fz_u8(z), d = fz_u8(z);
    if (f == NULL || f->closed || z->pxpeer == 0)
        return;
    kvp_xfer_block_t blk[FZ_ITEMS];
    uint32_t n = 0;
    for (uint32_t i = 0; i < f->n; i++) {
        if (!((mask >> i) & 1u) || f->slot[i] >= FZ_BLOCKS)
            continue;
        int32_t src = (int32_t)((mask + i) % FZ_BLOCKS);
        blk[n++] = (kvp_xfer_block_t){(uint32_t)src, 1, f->slot[i], f->gen[i]};
        f->src[i] = src;
    }
    if (n == 0)
        return;
    uint64_t delay = (uint64_t)(d % 50u) * 10 * FZ_MS;
    kvp_fake_script_t s = kind % 4 == 0   ? kvp_fake_script_wedge()
                          : kind % 4 == 1 ? kvp_fake_script_fail(delay, d % (n + 1))
                                          : kvp_fake_script_complete(kind % 4 == 2 ? 0 : delay);
    kvp_xfer_id_t id;
    if (kvp_fake_script_next(z->px, &s) == KVP_OK)
        z->px->ops->write(z->px, z->pxpeer, blk, n, &id);
}

static void op_peer_bye(fz_t *z)
{
    kvp_msg_t m = {.type = KVP_MSG_BYE};
    m.u.bye.reason = fz_u8(z) % 12u;
    peer_send(z, &m);
}

static void op_epoch_mode(fz_t *z)
{
    z->epoch_mode = fz_u8(z) % 5;
    if (z->epoch_mode >= 3)
        for (int i = 0; i < 32; i++)
            z->forged[i] = fz_u8(z);
}

/* ------------------------------------------------------------ node side */

static void op_node_put(fz_t *z)
{
    uint8_t key[KVP_WIRE_KEY_MAX], *buf = malloc(FZ_BS);
    uint8_t k = fz_u8(z);
    uint32_t kl = fz_key(k, key);
    if (buf == NULL)
        return;
    fz_block(k, buf, FZ_BS);
    kvp_put(z->node, key, kl, buf, FZ_BS, fz_small(z));
    free(buf);
}

static void op_node_get(fz_t *z)
{
    uint8_t key[KVP_WIRE_KEY_MAX];
    uint32_t kl = fz_key(fz_u8(z), key);
    kvp_block_t b;
    if (kvp_get(z->node, key, kl, &b) == KVP_OK)
        kvp_release(z->node, &b);
}

static void op_node_lookup_or_fetch(fz_t *z, bool fetch)
{
    fz_keys_t ks;
    uint64_t req = fz_small(z);
    uint32_t flags = fz_u8(z) & 1u;
    fz_keys(z, &ks, 1 + fz_u8(z) % FZ_ITEMS);
    fz_nop_t *o = fz_nop_new(z);
    if (o == NULL)
        return;
    kvp_status_t st;
    if (fetch)
        st = kvp_fetch(z->node, FZ_PEER, req, ks.buf, ks.len, ks.n, flags, o->bstat, &o->op_id);
    else
        st = kvp_lookup(z->node, FZ_PEER, req, ks.buf, ks.len, ks.n, o->results, &o->op_id);
    if (st == KVP_OK) {
        o->type = fetch ? KVP_EV_LOAD : KVP_EV_LOOKUP;
        z->n_nop++;
    }
}

static void op_node_cancel(fz_t *z)
{
    uint8_t b = fz_u8(z);
    if (z->n_nop > 0)
        kvp_cancel(z->node, z->nop[b % z->n_nop].op_id);
    else
        kvp_cancel(z->node, b);
}

/* The node's next outbound write (node as source) follows this script. All
 * of them terminate or stay wedged without copying, except a wedged copy
 * well before the hold cap (a copy after the cap is the documented,
 * suspect-checked exception, not a bug). */
static void op_node_script(fz_t *z)
{
    uint8_t kind = fz_u8(z), d = fz_u8(z);
    uint64_t delay = (uint64_t)(d % 50u) * 10 * FZ_MS;
    kvp_fake_script_t s;
    switch (kind % 6) {
    case 0: s = kvp_fake_script_wedge(); break;
    case 1: s = kvp_fake_script_fail(delay, d % 3u); break;
    case 2: s = kvp_fake_script_disconnect(delay, d % 3u); break;
    case 3: s = kvp_fake_script_fail_submit(); break;
    case 4: s = kvp_fake_script_wedge_then_copy(delay % (z->cfg.hold_cap_ms * FZ_MS / 4)); break;
    default: s = kvp_fake_script_complete(delay); break;
    }
    kvp_fake_script_next(kvp__node_xport(z->node), &s);
}

static void op_kill(fz_t *z)
{
    switch (fz_u8(z) % 5) {
    case 0: kvp_fake_net_kill(z->net, FZ_PEER); break;
    case 1: kvp_fake_net_partition(z->net, FZ_PEER, FZ_NODE, true); break;
    case 2: kvp_fake_net_partition(z->net, FZ_PEER, FZ_NODE, false); break;
    case 3:
        if (z->link)
            kvp_link_close(z->link, (kvp_bye_reason_t)(fz_u8(z) % 11u));
        break;
    default: kvp_fake_net_kill(z->net, FZ_NODE); break;
    }
}

static void op_node_peer(fz_t *z)
{
    if (fz_u8(z) & 1)
        kvp_peer_add(z->node, FZ_PEER);
    else
        kvp_peer_remove(z->node, FZ_PEER);
}

/* F26: an error on the node's own endpoint to the peer. */
static void op_node_endpoint_error(fz_t *z)
{
    kvp_session_t *s = kvp__node_find_session(z->node, FZ_PEER);
    if (s != NULL)
        kvp_fake_peer_set_error(kvp__node_xport(z->node), s->xpeer,
                                (fz_u8(z) & 1) ? KVP_ERR_UNREACHABLE : KVP_OK);
}

/* ------------------------------------------------------------ interpreter */

typedef void (*fz_op_fn)(fz_t *z);

static void op_advance(fz_t *z)
{
    fz_advance(z, (uint64_t)fz_u8(z) * 10 * FZ_MS, 25 * FZ_MS);
}

static void op_tick(fz_t *z)
{
    fz_advance(z, (uint64_t)(fz_u8(z) % 32u) * FZ_MS, FZ_MS);
}

static void op_node_lookup(fz_t *z)
{
    op_node_lookup_or_fetch(z, false);
}

static void op_node_fetch(fz_t *z)
{
    op_node_lookup_or_fetch(z, true);
}

static void op_node_finish(fz_t *z)
{
    kvp_finish_request(z->node, fz_small(z));
}

static void op_peer_ping(fz_t *z)
{
    if (z->link)
        kvp_link_ping(z->link);
}

static const fz_op_fn fz_ops[] = {
    op_peer_lookup,  op_peer_fetch,  op_peer_abort,   op_peer_fetch_done, op_peer_abort_ack,
    op_peer_lookup_resp, op_peer_write, op_peer_bye,  op_epoch_mode,      op_advance,
    op_tick,         op_node_put,    op_node_get,     op_node_lookup,     op_node_fetch,
    op_node_cancel,  op_node_finish, op_node_script,  op_kill,            op_node_peer,
    op_node_endpoint_error, op_peer_ping,
};
#define FZ_NOPS (sizeof(fz_ops) / sizeof(fz_ops[0]))

static void fz_config(fz_t *z, uint8_t conf)
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
                                  (uint64_t)(1 + (conf >> 3) % 8) * FZ_MS};
}

static int fz_setup(fz_t *z, uint8_t conf)
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

static void fz_teardown(fz_t *z)
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

int kvp_fuzz_session_run(const uint8_t *data, size_t size, int verbose,
                         kvp_fuzz_session_result_t *res)
{
    static fz_t z; /* large (caller-owned buffers of node ops): not on the stack */
    static int log_verbose;
    memset(&z, 0, sizeof(z));
    memset(res, 0, sizeof(*res));
    z.res = res;
    z.in = data;
    z.len = size;
    z.verbose = verbose;
    z.known_bugs = getenv("KVPEER_FUZZ_KNOWN_BUGS") != NULL;
    log_verbose = verbose;
    kvp_log_set_sink(fz_log_sink, &log_verbose);
    if (fz_setup(&z, fz_u8(&z)) != 0)
        fz_fail(&z, "world setup failed (%s)", "create");
    while (!z.failed && z.pos < z.len && res->ops < FZ_MAX_OPS &&
           kvp_clock_now(&z.mc.clock) < FZ_MAX_VIRTUAL_NS) {
        uint8_t op = fz_u8(&z) % FZ_NOPS;
        if (verbose)
            fprintf(stderr, "op %u: %u at %llu ms\n", res->ops, op,
                    (unsigned long long)(kvp_clock_now(&z.mc.clock) / FZ_MS));
        fz_ops[op](&z);
        res->ops++;
        fz_advance(&z, 3 * FZ_MS, FZ_MS);
        fz_check(&z);
    }
    if (!z.failed) /* let pending deadlines fire before the shutdown */
        fz_advance(&z, 1 * KVP_NSEC_PER_SEC, 25 * FZ_MS);
    if (!z.failed)
        fz_check(&z);
    fz_teardown(&z);
    kvp_log_set_sink(NULL, NULL);
    if (!z.failed && kvp_alloc_live() != 0)
        fz_fail(&z, "allocations live after teardown (%s)", "leak");
    return z.failed ? -1 : 0;
}
