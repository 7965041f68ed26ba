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
 * (missing bytes read as 0). See fz_ops[] for the table.
 */
#include "fuzz_session_int.h"
#include "session/session_int.h" /* looks inside the session */

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
    fz_keys(z, &ks, fz_u8(z) % (FZ_ITEMS + 1)); /* repeated keys too */
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
 * peer too: it never writes for it again. (An answer naming another request
 * is a protocol error at the node, which then closes the session.) */
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

static void fz_log_sink(kvp_log_level_t level, const char *prefix, const char *line, void *arg)
{
    if (*(const int *)arg)
        fprintf(stderr, "  [%d %s] %s\n", (int)level, prefix ? prefix : "-", line);
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
