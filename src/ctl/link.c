/* link.c -- one control-connection incarnation: framing, the handshake of
 * SPEC §4 (HELLO -> AUTH -> identity check -> HELLO_ACK), epochs on every
 * post-HELLO frame, heartbeats and dead-after, and the restart-claim /
 * simultaneous-dial rules. See ctl_int.h for the state machine. */
#include "ctl/ctl_int.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

static const char *const link_state_names[] = {"CONNECTING", "HELLO", "AUTH", "CHECK",
                                               "ACKED",      "READY", "CLOSING"};

static void link_set_state(kvp_link_t *l, link_state_t to)
{
    static const unsigned legal_from[] = {
        [LINK_CONNECTING] = 0,
        [LINK_HELLO] = 1u << LINK_CONNECTING,
        [LINK_AUTH] = 1u << LINK_HELLO,
        [LINK_CHECK] = 1u << LINK_HELLO | 1u << LINK_AUTH,
        [LINK_ACKED] = 1u << LINK_CHECK,
        [LINK_READY] = 1u << LINK_ACKED,
        [LINK_CLOSING] = 0x3fu, /* from any state but CLOSING */
    };
    KVP_ASSERT(legal_from[to] & (1u << l->state));
    KVP_TRACE(l->ctl->prefix, "link %s: %s -> %s", l->peer_id, link_state_names[l->state],
              link_state_names[to]);
    l->state = to;
}

static uint64_t link_now(const kvp_link_t *l)
{
    return kvp_loop_now(l->ctl->loop);
}

/* --------------------------------------------------------------- sending */

/* Encode and write one frame, stamping (our epoch, the peer's epoch). */
static kvp_status_t link_write(kvp_link_t *l, kvp_msg_t *m)
{
    kvp_ctl_t *ctl = l->ctl;
    if (!l->conn)
        return KVP_ERR_CLOSED;
    if (m->type != KVP_MSG_HELLO) {
        m->src_epoch = l->local_epoch;
        m->dst_epoch = l->remote_epoch;
    }
    size_t len;
    kvp_status_t st = ctl_encode(ctl, m, &len);
    if (st != KVP_OK)
        return st;
    st = l->conn->ops->write(l->conn, ctl->ebuf, len);
    if (st != KVP_OK)
        return st;
    l->last_tx_ns = link_now(l);
    ctl->st.frames_out++;
    ctl->st.bytes_out += len;
    return KVP_OK;
}

static void link_send_ctl(kvp_link_t *l, kvp_msg_t *m)
{
    kvp_status_t st = link_write(l, m);
    if (st == KVP_ERR_LIMIT) {
        KVP_WARN(l->ctl->prefix, "peer %s: write queue over %zu bytes: closing slow peer",
                 l->peer_id, l->ctl->cfg.wbuf_max);
        ctl_link_down(l, KVP_DOWN_SLOW_PEER, -1, true);
    }
}

static void link_send_bye(kvp_link_t *l, uint16_t reason)
{
    kvp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = KVP_MSG_BYE;
    m.u.bye.reason = reason;
    (void)link_write(l, &m);
}

static void link_send_ping(kvp_link_t *l, uint16_t type, uint64_t seq, uint64_t sent_ns)
{
    kvp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = type;
    m.u.ping.seq = seq;
    m.u.ping.sent_ns = sent_ns;
    link_send_ctl(l, &m);
}

static void link_free_pending(kvp_link_t *l)
{
    kvp_list_t *pos, *tmp;
    kvp_list_foreach_safe(pos, tmp, &l->pending)
    {
        kvp_list_remove(pos);
        kvp__free(KVP_CONTAINER_OF(pos, link_pending_t, node));
    }
    l->pending_bytes = 0;
}

static kvp_status_t link_queue(kvp_link_t *l, kvp_msg_t *m)
{
    kvp_ctl_t *ctl = l->ctl;
    m->src_epoch = l->local_epoch;
    m->dst_epoch = l->local_epoch; /* placeholder until the peer's HELLO: patched at flush */
    size_t len;
    kvp_status_t st = ctl_encode(ctl, m, &len);
    if (st != KVP_OK)
        return st;
    if (l->pending_bytes + len > ctl->cfg.wbuf_max)
        return KVP_ERR_LIMIT;
    link_pending_t *p = kvp__malloc(sizeof(*p) + len);
    if (!p)
        return KVP_ERR_NOMEM;
    p->len = len;
    memcpy(p->data, ctl->ebuf, len);
    kvp_list_insert_tail(&l->pending, &p->node);
    l->pending_bytes += len;
    return KVP_OK;
}

static void link_flush_pending(kvp_link_t *l)
{
    while (!kvp_list_empty(&l->pending) && l->state == LINK_READY) {
        link_pending_t *p = KVP_CONTAINER_OF(l->pending.next, link_pending_t, node);
        kvp_list_remove(&p->node);
        l->pending_bytes -= p->len;
        memcpy(p->data + KVP_WIRE_HDR_LEN + KVP_WIRE_EPOCH_LEN, l->remote_epoch.b,
               KVP_WIRE_EPOCH_LEN);
        kvp_status_t st = l->conn->ops->write(l->conn, p->data, p->len);
        if (st == KVP_OK) {
            l->ctl->st.frames_out++;
            l->ctl->st.bytes_out += p->len;
            l->last_tx_ns = link_now(l);
        }
        kvp__free(p);
        if (st == KVP_ERR_LIMIT)
            ctl_link_down(l, KVP_DOWN_SLOW_PEER, -1, true);
    }
}

kvp_status_t kvp_link_send(kvp_link_t *l, const kvp_msg_t *msg)
{
    if (l->state == LINK_CLOSING)
        return KVP_ERR_CLOSED;
    if (msg->type == KVP_MSG_HELLO || msg->type == KVP_MSG_AUTH || msg->type == KVP_MSG_HELLO_ACK)
        return KVP_ERR_INVALID; /* the handshake is ours */
    kvp_msg_t m = *msg;
    kvp_status_t st;
    if (l->state != LINK_READY || !kvp_list_empty(&l->pending))
        st = link_queue(l, &m); /* order: queued frames go first */
    else
        st = link_write(l, &m);
    if (st == KVP_ERR_LIMIT) {
        KVP_WARN(l->ctl->prefix, "peer %s: write queue over %zu bytes: closing slow peer",
                 l->peer_id, l->ctl->cfg.wbuf_max);
        ctl_link_down(l, KVP_DOWN_SLOW_PEER, -1, true);
    }
    return st;
}

kvp_status_t kvp_link_send_epochs(kvp_link_t *l, const kvp_msg_t *msg, const kvp_epoch_t *src,
                                  const kvp_epoch_t *dst)
{
    if (l->state != LINK_READY || !l->conn)
        return KVP_ERR_STATE;
    kvp_msg_t m = *msg;
    m.src_epoch = *src;
    m.dst_epoch = *dst;
    size_t len;
    kvp_status_t st = ctl_encode(l->ctl, &m, &len);
    if (st == KVP_OK)
        st = l->conn->ops->write(l->conn, l->ctl->ebuf, len);
    return st;
}

void kvp_link_ping(kvp_link_t *l)
{
    if (l->state != LINK_READY)
        return;
    link_send_ping(l, KVP_MSG_PING, ++l->ping_seq, link_now(l));
}

void kvp_link_close(kvp_link_t *l, kvp_bye_reason_t reason)
{
    ctl_link_down(l, KVP_DOWN_LOCAL_CLOSE, (int)reason, kvp_bye_reason_is_fault(reason));
}

/* ------------------------------------------------------------- going down */

/* Decide that the link is down: BYE (if the peer's epoch is known), close the
 * connection (gracefully when a BYE must get out), stop every timer and park
 * the link on the closing list. on_down and the free come from ctl_reap(). */
void ctl_link_down(kvp_link_t *l, kvp_down_reason_t reason, int bye, bool fault)
{
    kvp_ctl_t *ctl = l->ctl;
    if (l->state == LINK_CLOSING)
        return;
    l->down_reason = reason;
    l->down_bye = bye >= 0 ? (uint16_t)bye : 0;
    l->down_fault = fault;
    bool sent_bye = false;
    if (bye >= 0 && l->have_peer && l->conn && l->state != LINK_CONNECTING) {
        link_send_bye(l, (uint16_t)bye);
        sent_bye = true;
    }
    if (l->conn) {
        l->conn->ops->close(l->conn, sent_bye);
        l->conn = NULL;
    }
    kvp_timer_stop(ctl->loop, &l->t_handshake);
    kvp_timer_stop(ctl->loop, &l->t_heartbeat);
    kvp_timer_stop(ctl->loop, &l->t_dead);
    kvp_timer_stop(ctl->loop, &l->t_check);
    link_free_pending(l);
    link_set_state(l, LINK_CLOSING);
    kvp_list_remove(&l->node);
    kvp_list_insert_tail(&ctl->closing, &l->node);
    ctl_schedule_reap(ctl);
    if (l->have_peer)
        ctl_kick_checks(ctl, l->peer_id);
}

/* Refuse a peer during the handshake: counted, logged once here, BYE, no
 * callback (the link never became ready). */
static void link_refuse(kvp_link_t *l, kvp_down_reason_t reason, uint16_t bye, uint64_t *counter)
{
    if (counter)
        (*counter)++;
    ctl_link_down(l, reason, bye, true);
}

static void link_protocol_error(kvp_link_t *l, const char *why)
{
    kvp_ctl_t *ctl = l->ctl;
    ctl->st.protocol_errors++;
    KVP_LOG_RL(&ctl->rl_proto, link_now(l), KVP_LOG_ERROR, ctl->prefix,
               "peer %s (%s): protocol error: %s", l->peer_id,
               l->conn ? l->conn->remote : "?", why);
    ctl_link_down(l, KVP_DOWN_PROTOCOL, l->have_peer ? KVP_BYE_PROTOCOL : -1, true);
}

/* ------------------------------------------------------------- handshake */

static void link_send_hello(kvp_link_t *l)
{
    kvp_ctl_t *ctl = l->ctl;
    kvp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = KVP_MSG_HELLO;
    kvp_msg_hello_t *h = &m.u.hello;
    h->major = KVP_WIRE_MAJOR;
    h->minor = KVP_WIRE_MINOR;
    snprintf(h->peer_id, sizeof(h->peer_id), "%s", ctl->peer_id);
    snprintf(h->instance_id, sizeof(h->instance_id), "%s", ctl->instance_id);
    h->epoch = l->local_epoch;
    h->num_blocks = ctl->cfg.num_blocks;
    h->block_size = ctl->cfg.block_size;
    h->fingerprint = ctl->cfg.fingerprint;
    h->hash_seed = ctl->cfg.hash_seed;
    memcpy(h->nonce, l->nonce, sizeof(h->nonce));
    h->flags = ctl->cfg.psk_len ? KVP_HELLO_AUTH_REQUIRED : 0;
    link_send_ctl(l, &m);
}

static void link_on_connected(kvp_conn_t *c)
{
    kvp_link_t *l = c->owner;
    link_set_state(l, LINK_HELLO);
    link_send_hello(l);
}

/* HMAC-SHA256(psk, "kvpeer-auth-v1" | sender epoch | receiver epoch |
 * sender nonce | receiver nonce | sender layout), as wire.h defines it. */
static void link_mac(const kvp_ctl_t *ctl, const kvp_epoch_t *s_epoch, const kvp_epoch_t *r_epoch,
                     const uint8_t *s_nonce, const uint8_t *r_nonce, uint32_t s_num_blocks,
                     uint32_t s_block_size, uint8_t out[KVP_WIRE_MAC_LEN])
{
    static const char label[] = "kvpeer-auth-v1";
    uint8_t layout[8];
    for (int i = 0; i < 4; i++) {
        layout[i] = (uint8_t)(s_num_blocks >> (8 * i));
        layout[4 + i] = (uint8_t)(s_block_size >> (8 * i));
    }
    crypto_auth_hmacsha256_state st;
    crypto_auth_hmacsha256_init(&st, ctl->cfg.psk, ctl->cfg.psk_len);
    crypto_auth_hmacsha256_update(&st, (const uint8_t *)label, sizeof(label) - 1);
    crypto_auth_hmacsha256_update(&st, s_epoch->b, KVP_WIRE_EPOCH_LEN);
    crypto_auth_hmacsha256_update(&st, r_epoch->b, KVP_WIRE_EPOCH_LEN);
    crypto_auth_hmacsha256_update(&st, s_nonce, KVP_WIRE_NONCE_LEN);
    crypto_auth_hmacsha256_update(&st, r_nonce, KVP_WIRE_NONCE_LEN);
    crypto_auth_hmacsha256_update(&st, layout, sizeof(layout));
    crypto_auth_hmacsha256_final(&st, out);
    sodium_memzero(&st, sizeof(st));
}

static void link_check(kvp_link_t *l);

static void link_send_auth(kvp_link_t *l)
{
    kvp_ctl_t *ctl = l->ctl;
    kvp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = KVP_MSG_AUTH;
    link_mac(ctl, &l->local_epoch, &l->remote_epoch, l->nonce, l->peer.nonce, ctl->cfg.num_blocks,
             ctl->cfg.block_size, m.u.auth.mac);
    link_send_ctl(l, &m);
}

/* Returns false (and refuses the peer, naming the field and both values) when
 * the peer's HELLO is not compatible with ours. */
static bool link_validate(kvp_link_t *l, const kvp_msg_hello_t *h)
{
    kvp_ctl_t *ctl = l->ctl;
    char why[160];
    why[0] = '\0';
    if (h->major != KVP_WIRE_MAJOR)
        snprintf(why, sizeof(why), "wire major version (ours %u, theirs %u)", KVP_WIRE_MAJOR,
                 h->major);
    else if (h->block_size != ctl->cfg.block_size)
        snprintf(why, sizeof(why), "block_size (ours %u, theirs %u)", ctl->cfg.block_size,
                 h->block_size);
    else if (h->fingerprint != ctl->cfg.fingerprint)
        snprintf(why, sizeof(why), "config fingerprint (ours %016llx, theirs %016llx)",
                 (unsigned long long)ctl->cfg.fingerprint, (unsigned long long)h->fingerprint);
    else if (h->hash_seed != ctl->cfg.hash_seed)
        snprintf(why, sizeof(why), "hash seed (ours %016llx, theirs %016llx)",
                 (unsigned long long)ctl->cfg.hash_seed, (unsigned long long)h->hash_seed);
    else if (h->num_blocks == 0)
        snprintf(why, sizeof(why), "num_blocks (theirs 0)");
    if (why[0]) {
        KVP_ERROR(ctl->prefix, "peer %s: incompatible %s: refused", h->peer_id, why);
        link_refuse(l, KVP_DOWN_INCOMPATIBLE, KVP_BYE_INCOMPATIBLE, &ctl->st.refused_incompatible);
        return false;
    }
    bool ours = ctl->cfg.psk_len > 0, theirs = (h->flags & KVP_HELLO_AUTH_REQUIRED) != 0;
    if (ours != theirs) {
        KVP_ERROR(ctl->prefix, "peer %s: authentication mismatch (%s a pre-shared key, peer %s): "
                  "refused", h->peer_id, ours ? "we have" : "we have no",
                  theirs ? "requires one" : "has none");
        link_refuse(l, KVP_DOWN_AUTH, KVP_BYE_AUTH, &ctl->st.refused_auth);
        return false;
    }
    return true;
}

static size_t ctl_count_sessions(const kvp_ctl_t *ctl)
{
    size_t n = 0;
    const kvp_list_t *pos;
    for (pos = ctl->links.next; pos != &ctl->links; pos = pos->next) {
        const kvp_link_t *o = KVP_CONTAINER_OF(pos, kvp_link_t, node);
        n += o->have_peer;
    }
    return n;
}

static void link_on_hello(kvp_link_t *l, const kvp_msg_hello_t *h)
{
    kvp_ctl_t *ctl = l->ctl;
    if (l->have_peer || l->state != LINK_HELLO) {
        link_protocol_error(l, "unexpected HELLO");
        return;
    }
    l->peer = *h;
    l->have_peer = true;
    l->remote_epoch = h->epoch;
    snprintf(l->peer_id, sizeof(l->peer_id), "%s", h->peer_id);
    l->wctx.peer_num_blocks = h->num_blocks;
    if (!link_validate(l, h))
        return;
    if (!strcmp(h->peer_id, ctl->peer_id)) {
        KVP_ERROR(ctl->prefix, "peer %s: claims our own peer id: refused", h->peer_id);
        link_refuse(l, KVP_DOWN_DUPLICATE, KVP_BYE_DUPLICATE, &ctl->st.refused_duplicate);
        return;
    }
    if (ctl_count_sessions(ctl) > ctl->cfg.max_sessions) {
        KVP_WARN(ctl->prefix, "peer %s: session cap %u reached: refused", h->peer_id,
                 ctl->cfg.max_sessions);
        link_refuse(l, KVP_DOWN_LIMIT, KVP_BYE_LIMIT, &ctl->st.refused_limit);
        return;
    }
    if (ctl->cfg.psk_len) {
        link_set_state(l, LINK_AUTH);
        link_send_auth(l);
        return;
    }
    link_set_state(l, LINK_CHECK);
    link_check(l);
}

static void link_on_auth(kvp_link_t *l, const kvp_msg_auth_t *a)
{
    kvp_ctl_t *ctl = l->ctl;
    if (l->state != LINK_AUTH) {
        if (!ctl->cfg.psk_len) {
            KVP_ERROR(ctl->prefix, "peer %s: sent AUTH but we have no key: refused", l->peer_id);
            link_refuse(l, KVP_DOWN_AUTH, KVP_BYE_AUTH, &ctl->st.refused_auth);
        } else {
            link_protocol_error(l, "unexpected AUTH");
        }
        return;
    }
    uint8_t want[KVP_WIRE_MAC_LEN];
    link_mac(ctl, &l->remote_epoch, &l->local_epoch, l->peer.nonce, l->nonce, l->peer.num_blocks,
             l->peer.block_size, want);
    if (crypto_verify_32(want, a->mac) != 0) {
        KVP_ERROR(ctl->prefix, "peer %s: authentication failed (wrong key): refused",
                  l->peer_id);
        link_refuse(l, KVP_DOWN_AUTH, KVP_BYE_AUTH, &ctl->st.refused_auth);
        return;
    }
    link_set_state(l, LINK_CHECK);
    link_check(l);
}

static void link_become_ready(kvp_link_t *l);

static void link_on_ack(kvp_link_t *l, const kvp_msg_hello_ack_t *a)
{
    kvp_ctl_t *ctl = l->ctl;
    if (l->state == LINK_AUTH) {
        KVP_ERROR(ctl->prefix, "peer %s: HELLO_ACK without AUTH: refused", l->peer_id);
        link_refuse(l, KVP_DOWN_AUTH, KVP_BYE_AUTH, &ctl->st.refused_auth);
        return;
    }
    if ((l->state != LINK_CHECK && l->state != LINK_ACKED) || l->peer_acked) {
        link_protocol_error(l, "unexpected HELLO_ACK");
        return;
    }
    if (!kvp_epoch_eq(&a->acked_epoch, &l->local_epoch)) {
        link_protocol_error(l, "HELLO_ACK acknowledges another epoch");
        return;
    }
    l->peer_blob = kvp__malloc(a->blob_len ? a->blob_len : 1);
    if (!l->peer_blob) {
        ctl_link_down(l, KVP_DOWN_LOCAL_CLOSE, KVP_BYE_PROTOCOL, true);
        return;
    }
    memcpy(l->peer_blob, a->blob, a->blob_len);
    l->peer_blob_len = a->blob_len;
    l->peer_acked = true;
    ctl->st.blobs_in++;
    if (l->state == LINK_ACKED)
        link_become_ready(l);
}

static void link_send_ack(kvp_link_t *l)
{
    kvp_ctl_t *ctl = l->ctl;
    kvp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = KVP_MSG_HELLO_ACK;
    m.u.hello_ack.acked_epoch = l->remote_epoch;
    m.u.hello_ack.blob = ctl->cfg.blob;
    m.u.hello_ack.blob_len = (uint32_t)ctl->cfg.blob_len;
    link_set_state(l, LINK_ACKED);
    ctl->st.blobs_out++;
    link_send_ctl(l, &m);
    if (l->state == LINK_ACKED && l->peer_acked)
        link_become_ready(l);
}

/* ------------------------------------------------------------ ready & live */

static void link_on_heartbeat(kvp_timer_t *t)
{
    kvp_link_t *l = t->data;
    uint64_t now = link_now(l), hb = l->ctl->cfg.heartbeat_ns;
    if (now - l->last_rx_ns >= hb || now - l->last_tx_ns >= hb)
        link_send_ping(l, KVP_MSG_PING, ++l->ping_seq, now);
    if (l->state == LINK_READY)
        kvp_timer_start(l->ctl->loop, &l->t_heartbeat, now + hb);
}

/* Lazy: frames only move last_rx_ns; the timer re-arms itself from it. */
static void link_on_dead(kvp_timer_t *t)
{
    kvp_link_t *l = t->data;
    kvp_ctl_t *ctl = l->ctl;
    uint64_t now = link_now(l), dead = ctl->cfg.dead_after_ns;
    if (now - l->last_rx_ns < dead) {
        kvp_timer_start(ctl->loop, &l->t_dead, l->last_rx_ns + dead);
        return;
    }
    ctl->st.peers_dead++;
    KVP_WARN(ctl->prefix, "peer %s: nothing received for %llu ms: dead", l->peer_id,
             (unsigned long long)((now - l->last_rx_ns) / KVP_NSEC_PER_MSEC));
    ctl_link_down(l, KVP_DOWN_DEAD, KVP_BYE_DEAD, true);
}

static void link_on_handshake_timeout(kvp_timer_t *t)
{
    kvp_link_t *l = t->data;
    l->ctl->st.handshakes_timed_out++;
    KVP_WARN(l->ctl->prefix, "peer %s: handshake not complete after %llu ms (%s): closed",
             l->peer_id, (unsigned long long)(l->ctl->cfg.handshake_timeout_ns / KVP_NSEC_PER_MSEC),
             link_state_names[l->state]);
    ctl_link_down(l, KVP_DOWN_HANDSHAKE_TIMEOUT, -1, true);
}

static uint16_t link_refusal_bye(kvp_status_t st)
{
    switch (st) {
    case KVP_ERR_INCOMPATIBLE: return KVP_BYE_INCOMPATIBLE;
    case KVP_ERR_AUTH: return KVP_BYE_AUTH;
    case KVP_ERR_LIMIT: return KVP_BYE_LIMIT;
    case KVP_ERR_TRANSPORT: return KVP_BYE_TRANSPORT;
    default: return KVP_BYE_PROTOCOL;
    }
}

static void link_become_ready(kvp_link_t *l)
{
    kvp_ctl_t *ctl = l->ctl;
    uint64_t now = link_now(l);
    link_set_state(l, LINK_READY);
    l->wctx.handshake_done = true;
    kvp_timer_stop(ctl->loop, &l->t_handshake);
    kvp_timer_start(ctl->loop, &l->t_heartbeat, now + ctl->cfg.heartbeat_ns);
    kvp_timer_start(ctl->loop, &l->t_dead, l->last_rx_ns + ctl->cfg.dead_after_ns);
    l->was_ready = true;
    kvp_status_t st = KVP_OK;
    if (ctl->cfg.cb.on_ready)
        st = ctl->cfg.cb.on_ready(ctl->cfg.cb.arg, l, &l->peer, l->peer_blob, l->peer_blob_len);
    kvp__free(l->peer_blob); /* borrowed by on_ready for the call only */
    l->peer_blob = NULL;
    if (st != KVP_OK) {
        KVP_WARN(ctl->prefix, "peer %s: refused by the session layer: %s", l->peer_id,
                 kvp_status_str(st));
        l->was_ready = false; /* never became ready for the user: no on_down */
        ctl_link_down(l, KVP_DOWN_REFUSED, link_refusal_bye(st), true);
        return;
    }
    if (l->state != LINK_READY)
        return; /* closed from inside on_ready */
    KVP_INFO(ctl->prefix, "peer %s: ready (%s, %s)", l->peer_id, l->outbound ? "dialed" : "accepted",
             l->conn->ops->name);
    link_flush_pending(l);
    ctl_want_link_ready(ctl, l);
    ctl_kick_checks(ctl, l->peer_id);
}

/* Same peer: the identity it claims, or for an outbound link still before
 * the peer's HELLO, the address we dialed. */
static bool link_same_peer(const kvp_link_t *o, const char *peer_id)
{
    return (o->have_peer || o->outbound) && !strcmp(o->peer_id, peer_id);
}

/* A restart claim against a ready link `o`: PING it; refuse `l` if `o`
 * answers within dead_after, else reap `o` as dead. Returns true when `l`
 * must keep waiting (or was refused). */
static bool link_claim(kvp_link_t *l, kvp_link_t *o)
{
    kvp_ctl_t *ctl = l->ctl;
    uint64_t now = link_now(l);
    if (!l->claim_started) {
        l->claim_started = true;
        l->claim_start_ns = now;
        l->claim_rx_mark = o->rx_frames;
        o->claim_ping_pending = true;
        kvp_link_ping(o);
        kvp_timer_start(ctl->loop, &l->t_check, now + ctl->cfg.dead_after_ns);
        return true;
    }
    if (o->rx_frames > l->claim_rx_mark) {
        KVP_WARN(ctl->prefix, "peer %s: new connection claims a live session: refused as duplicate",
                 l->peer_id);
        link_refuse(l, KVP_DOWN_DUPLICATE, KVP_BYE_DUPLICATE, &ctl->st.refused_duplicate);
        return true;
    }
    if (now < l->claim_start_ns + ctl->cfg.dead_after_ns) {
        kvp_timer_start(ctl->loop, &l->t_check, l->claim_start_ns + ctl->cfg.dead_after_ns);
        return true;
    }
    KVP_WARN(ctl->prefix, "peer %s: restart claim: old session silent for %llu ms: reaped",
             l->peer_id, (unsigned long long)(ctl->cfg.dead_after_ns / KVP_NSEC_PER_MSEC));
    ctl->st.peers_dead++;
    ctl_link_down(o, KVP_DOWN_DEAD, KVP_BYE_DEAD, true);
    ctl_link_finish(o); /* on_down of the old before on_ready of the new */
    return false;
}

/* Settle identity conflicts before our blob goes out (SPEC §4): a ready
 * link for the same peer id makes this a restart claim; a committed one
 * (ACKED) is waited for; with an uncommitted one, a simultaneous dial is
 * decided by the lower peer id -- only on the lower side, which never has two
 * committed links, so both sides keep the same connection. */
static void link_check(kvp_link_t *l)
{
    kvp_ctl_t *ctl = l->ctl;
    bool lower = strcmp(ctl->peer_id, l->peer_id) < 0;
    kvp_list_t *pos, *tmp;
restart:
    if (l->state != LINK_CHECK)
        return; /* closed from a callback while settling */
    kvp_list_foreach_safe(pos, tmp, &ctl->links)
    {
        kvp_link_t *o = KVP_CONTAINER_OF(pos, kvp_link_t, node);
        if (o == l || !link_same_peer(o, l->peer_id))
            continue;
        if (o->state == LINK_READY) {
            if (link_claim(l, o))
                return;
            goto restart;
        }
        bool cross = o->outbound != l->outbound;
        if (o->state == LINK_ACKED) {
            if (cross && !lower)
                continue; /* the lower side decides */
            return;      /* wait: kicked when o becomes ready or goes down */
        }
        if (cross && !lower)
            continue;
        if (cross && !l->outbound) {
            KVP_DEBUG(ctl->prefix, "peer %s: simultaneous dial: keeping ours", l->peer_id);
            ctl->st.refused_duplicate++;
            ctl_link_down(l, KVP_DOWN_DUPLICATE, KVP_BYE_DUPLICATE, false);
            return;
        }
        /* o loses: our own dial wins a crossing, a newer one replaces an older */
        KVP_DEBUG(ctl->prefix, "peer %s: duplicate connection in handshake closed", o->peer_id);
        ctl->st.refused_duplicate++;
        ctl_link_down(o, KVP_DOWN_DUPLICATE, o->have_peer ? KVP_BYE_DUPLICATE : -1, false);
    }
    link_send_ack(l);
}

static void link_on_check(kvp_timer_t *t)
{
    kvp_link_t *l = t->data;
    if (l->state == LINK_CHECK)
        link_check(l);
}

/* -------------------------------------------------------------- receiving */

static void link_on_pong(kvp_link_t *l, const kvp_msg_ping_t *p)
{
    uint64_t now = link_now(l);
    if (p->seq == 0 || p->seq > l->ping_seq || p->sent_ns > now)
        return; /* not one of ours: ignore (liveness already counted) */
    l->rtt_ns = now - p->sent_ns;
    if (l->ctl->cfg.cb.on_pong)
        l->ctl->cfg.cb.on_pong(l->ctl->cfg.cb.arg, l, l->rtt_ns);
}

static void link_on_bye(kvp_link_t *l, uint16_t reason)
{
    bool fault = kvp_bye_reason_is_fault(reason);
    KVP_LOG(fault && l->state == LINK_READY ? KVP_LOG_WARN : KVP_LOG_INFO, l->ctl->prefix,
            "peer %s: BYE %s", l->peer_id, kvp_bye_reason_str(reason));
    ctl_link_down(l, KVP_DOWN_BYE, -1, fault);
    l->down_bye = reason;
}

static bool link_is_handshake_msg(uint16_t type)
{
    return type == KVP_MSG_AUTH || type == KVP_MSG_HELLO_ACK;
}

static void link_dispatch(kvp_link_t *l, const kvp_msg_t *m)
{
    kvp_ctl_t *ctl = l->ctl;
    if (m->type == KVP_MSG_HELLO) {
        link_on_hello(l, &m->u.hello);
        return;
    }
    if (!l->have_peer) {
        link_protocol_error(l, "frame before HELLO");
        return;
    }
    if (!kvp_epoch_eq(&m->src_epoch, &l->remote_epoch) ||
        !kvp_epoch_eq(&m->dst_epoch, &l->local_epoch)) {
        if (l->state != LINK_READY && link_is_handshake_msg(m->type)) {
            link_protocol_error(l, "bad epochs on a handshake frame");
            return;
        }
        ctl->st.stale_frames++; /* another incarnation's frame: dropped before any effect */
        return;
    }
    switch (m->type) {
    case KVP_MSG_AUTH: link_on_auth(l, &m->u.auth); return;
    case KVP_MSG_HELLO_ACK: link_on_ack(l, &m->u.hello_ack); return;
    case KVP_MSG_BYE: link_on_bye(l, m->u.bye.reason); return;
    default: break;
    }
    if (l->state != LINK_READY) {
        link_protocol_error(l, "frame before the handshake completed");
        return;
    }
    if (m->type == KVP_MSG_PING)
        link_send_ping(l, KVP_MSG_PONG, m->u.ping.seq, m->u.ping.sent_ns);
    else if (m->type == KVP_MSG_PONG)
        link_on_pong(l, &m->u.ping);
    else if (ctl->cfg.cb.on_frame)
        ctl->cfg.cb.on_frame(ctl->cfg.cb.arg, l, m);
}

/* One frame: the header was checked by kvp_wire_parse_hdr. Liveness counts
 * any decodable frame, stale or not (the peer is alive). */
static void link_handle(kvp_link_t *l, const uint8_t *frame, size_t len)
{
    kvp_ctl_t *ctl = l->ctl;
    kvp_msg_t m;
    char why[96] = "";
    kvp_status_t st = kvp_wire_decode(&l->wctx, frame, len, ctl->scratch, &m, why, sizeof(why));
    if (st != KVP_OK) {
        link_protocol_error(l, why[0] ? why : kvp_status_str(st));
        return;
    }
    ctl->st.frames_in++;
    ctl->st.bytes_in += len;
    l->last_rx_ns = link_now(l);
    l->rx_frames++;
    if (l->claim_ping_pending) {
        l->claim_ping_pending = false;
        ctl_kick_checks(ctl, l->peer_id); /* the restart claim is answered */
    }
    link_dispatch(l, &m);
}

static void link_on_readable(kvp_conn_t *c)
{
    kvp_link_t *l = c->owner;
    size_t off = 0;
    while (l->state != LINK_CLOSING) {
        kvp_frame_hdr_t hdr;
        kvp_status_t st = kvp_wire_parse_hdr(&l->wctx, c->rbuf + off, c->rlen - off, &hdr);
        if (st == KVP_ERR_TRUNCATED)
            break;
        if (st != KVP_OK) {
            link_protocol_error(l, "bad frame header (type or length)");
            return;
        }
        size_t total = KVP_WIRE_HDR_LEN + (size_t)hdr.length;
        if (c->rlen - off < total) {
            kvp_conn_rbuf_consume(c, off);
            off = 0;
            if (kvp_conn_rbuf_reserve(c, total) != KVP_OK)
                link_protocol_error(l, "cannot buffer frame");
            return;
        }
        link_handle(l, c->rbuf + off, total);
        off += total;
    }
    if (l->state != LINK_CLOSING)
        kvp_conn_rbuf_consume(c, off);
}

static void link_on_closed(kvp_conn_t *c, kvp_status_t why)
{
    kvp_link_t *l = c->owner;
    kvp_ctl_t *ctl = l->ctl;
    if (l->state == LINK_CONNECTING) {
        ctl->st.dial_failures++;
        KVP_DEBUG(ctl->prefix, "dial %s failed", l->peer_id);
    } else {
        KVP_LOG(l->state == LINK_READY ? KVP_LOG_WARN : KVP_LOG_INFO, ctl->prefix,
                "peer %s: connection %s", l->peer_id, why == KVP_ERR_CLOSED ? "closed" : "reset");
    }
    ctl_link_down(l, KVP_DOWN_EOF, -1, true);
}

const kvp_conn_handler_t ctl_link_handler = {
    .connected = link_on_connected,
    .readable = link_on_readable,
    .closed = link_on_closed,
};

/* -------------------------------------------------------------- lifecycle */

kvp_status_t ctl_link_new(kvp_ctl_t *ctl, kvp_conn_t *conn, bool outbound, const char *addr,
                          kvp_link_t **out)
{
    kvp_link_t *l = kvp__calloc(1, sizeof(*l));
    if (!l)
        return KVP_ERR_NOMEM;
    kvp_status_t st = kvp_epoch_new(&l->local_epoch);
    if (st == KVP_OK)
        st = kvp_random_bytes(l->nonce, sizeof(l->nonce));
    if (st != KVP_OK) {
        kvp__free(l);
        return st;
    }
    uint64_t now = kvp_loop_now(ctl->loop);
    l->ctl = ctl;
    l->outbound = outbound;
    l->created_ns = l->last_rx_ns = l->last_tx_ns = now;
    l->state = outbound ? LINK_CONNECTING : LINK_HELLO;
    snprintf(l->peer_id, sizeof(l->peer_id), "%s", addr ? addr : "?");
    kvp_list_init(&l->pending);
    kvp_timer_init(&l->t_handshake, "handshake", link_on_handshake_timeout, l);
    kvp_timer_init(&l->t_heartbeat, "heartbeat", link_on_heartbeat, l);
    kvp_timer_init(&l->t_dead, "dead-after", link_on_dead, l);
    kvp_timer_init(&l->t_check, "identity-check", link_on_check, l);
    kvp_timer_start(ctl->loop, &l->t_handshake, now + ctl->cfg.handshake_timeout_ns);
    kvp_list_insert_tail(&ctl->links, &l->node);
    if (conn) {
        l->conn = conn;
        conn->owner = l;
        conn->h = &ctl_link_handler;
        conn->linger_head = &ctl->lingering;
    }
    if (!outbound)
        link_send_hello(l);
    *out = l;
    return KVP_OK;
}

/* The link must be CLOSING (conn already handed off, timers stopped). */
void ctl_link_free(kvp_link_t *l)
{
    KVP_ASSERT(l->state == LINK_CLOSING && l->conn == NULL);
    kvp_list_remove(&l->node);
    kvp__free(l->peer_blob);
    kvp__free(l);
}

const char *kvp_link_peer_id(const kvp_link_t *l)
{
    return l->peer_id;
}

const char *kvp_link_instance_id(const kvp_link_t *l)
{
    return l->have_peer ? l->peer.instance_id : "";
}

const kvp_epoch_t *kvp_link_local_epoch(const kvp_link_t *l)
{
    return &l->local_epoch;
}

const kvp_epoch_t *kvp_link_remote_epoch(const kvp_link_t *l)
{
    return &l->remote_epoch;
}

uint64_t kvp_link_rtt_ns(const kvp_link_t *l)
{
    return l->rtt_ns;
}

void kvp_link_set_user(kvp_link_t *l, void *user)
{
    l->user = user;
}

void *kvp_link_user(const kvp_link_t *l)
{
    return l->user;
}

bool kvp_link_is_ready(const kvp_link_t *l)
{
    return l->state == LINK_READY;
}

size_t kvp_link_queued_bytes(const kvp_link_t *l)
{
    return (l->conn ? l->conn->ops->queued(l->conn) : 0) + l->pending_bytes;
}
