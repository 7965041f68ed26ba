/* link.c -- one control-connection incarnation: framing, the handshake of
 * SPEC §4 (HELLO -> AUTH -> identity check -> HELLO_ACK), epochs on every
 * post-HELLO frame, heartbeats and dead-after, and the restart-claim /
 * simultaneous-dial rules. See ctl_int.h for the state machine. */
#include "ctl/ctl_int.h"

#include <stdio.h>
#include <string.h>

static const char *const link_state_names[] = {"CONNECTING", "HELLO", "AUTH", "CHECK",
                                               "ACKED",      "READY", "CLOSING"};

void kvp__ctl_link_set_state(kvp_link_t *l, link_state_t to)
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
    kvp_status_t st = kvp__ctl_encode(ctl, m, &len);
    if (st != KVP_OK)
        return st;
    st = l->conn->ops->write(l->conn, ctl->ebuf, len);
    if (st != KVP_OK)
        return st;
    l->last_tx_ns = ctl_link_now(l);
    ctl->st.frames_out++;
    ctl->st.bytes_out += len;
    return KVP_OK;
}

void kvp__ctl_link_send_ctl(kvp_link_t *l, kvp_msg_t *m)
{
    kvp_status_t st = link_write(l, m);
    if (st == KVP_ERR_LIMIT) {
        KVP_WARN(l->ctl->prefix, "peer %s: write queue over %zu bytes: closing slow peer",
                 l->peer_id, l->ctl->cfg.wbuf_max);
        kvp__ctl_link_down(l, KVP_DOWN_SLOW_PEER, -1, true);
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

void kvp__ctl_link_send_bye_compat(kvp_link_t *l)
{
    kvp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = KVP_MSG_BYE;
    m.u.bye.reason = KVP_BYE_INCOMPATIBLE;
    snprintf(m.u.bye.compat, sizeof(m.u.bye.compat), "%s", l->ctl->compat);
    l->bye_out = link_write(l, &m) == KVP_OK;
}

static void link_send_ping(kvp_link_t *l, uint16_t type, uint64_t seq, uint64_t sent_ns)
{
    kvp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = type;
    m.u.ping.seq = seq;
    m.u.ping.sent_ns = sent_ns;
    kvp__ctl_link_send_ctl(l, &m);
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
    kvp_status_t st = kvp__ctl_encode(ctl, m, &len);
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
            l->last_tx_ns = ctl_link_now(l);
        }
        kvp__free(p);
        if (st == KVP_ERR_LIMIT)
            kvp__ctl_link_down(l, KVP_DOWN_SLOW_PEER, -1, true);
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
        kvp__ctl_link_down(l, KVP_DOWN_SLOW_PEER, -1, true);
    }
    return st;
}

#ifdef KVP_TESTING /* test builds only (issue 31): never in the shipped library */
kvp_status_t kvp_link_send_epochs(kvp_link_t *l, const kvp_msg_t *msg, const kvp_epoch_t *src,
                                  const kvp_epoch_t *dst)
{
    if (l->state != LINK_READY || !l->conn)
        return KVP_ERR_STATE;
    kvp_msg_t m = *msg;
    m.src_epoch = *src;
    m.dst_epoch = *dst;
    size_t len;
    kvp_status_t st = kvp__ctl_encode(l->ctl, &m, &len);
    if (st == KVP_OK)
        st = l->conn->ops->write(l->conn, l->ctl->ebuf, len);
    return st;
}
#endif /* KVP_TESTING */

void kvp_link_ping(kvp_link_t *l)
{
    if (l->state != LINK_READY)
        return;
    link_send_ping(l, KVP_MSG_PING, ++l->ping_seq, ctl_link_now(l));
}

void kvp_link_close(kvp_link_t *l, kvp_bye_reason_t reason)
{
    kvp__ctl_link_down(l, KVP_DOWN_LOCAL_CLOSE, (int)reason, kvp_bye_reason_is_fault(reason));
}

/* ------------------------------------------------------------- going down */

/* Decide that the link is down: BYE (if the peer's epoch is known), close the
 * connection (gracefully when a BYE must get out), stop every timer and park
 * the link on the closing list. on_down and the free come from ctl_reap(). */
void kvp__ctl_link_down(kvp_link_t *l, kvp_down_reason_t reason, int bye, bool fault)
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
        l->conn->ops->close(l->conn, sent_bye || l->bye_out);
        l->conn = NULL;
    }
    kvp_timer_stop(ctl->loop, &l->t_handshake);
    kvp_timer_stop(ctl->loop, &l->t_heartbeat);
    kvp_timer_stop(ctl->loop, &l->t_dead);
    kvp_timer_stop(ctl->loop, &l->t_check);
    kvp_timer_stop(ctl->loop, &l->t_resume);
    link_free_pending(l);
    kvp__ctl_link_set_state(l, LINK_CLOSING);
    kvp_list_remove(&l->node);
    kvp_list_insert_tail(&ctl->closing, &l->node);
    kvp__ctl_schedule_reap(ctl);
    if (l->have_peer)
        kvp__ctl_kick_checks(ctl, l->peer_id);
}

/* Refuse a peer during the handshake: counted, logged once here, BYE, no
 * callback (the link never became ready). */
void kvp__ctl_link_refuse(kvp_link_t *l, kvp_down_reason_t reason, uint16_t bye, uint64_t *counter)
{
    if (counter)
        (*counter)++;
    kvp__ctl_link_down(l, reason, bye, true);
}

void kvp__ctl_link_protocol_error(kvp_link_t *l, const char *why)
{
    kvp_ctl_t *ctl = l->ctl;
    ctl->st.protocol_errors++;
    KVP_LOG_RL(&ctl->rl_proto, ctl_link_now(l), KVP_LOG_ERROR, ctl->prefix,
               "peer %s (%s): protocol error: %s", l->peer_id,
               l->conn ? l->conn->remote : "?", why);
    kvp__ctl_link_down(l, KVP_DOWN_PROTOCOL, l->have_peer ? KVP_BYE_PROTOCOL : -1, true);
}

/* ------------------------------------------------------------ ready & live */

static void link_on_heartbeat(kvp_timer_t *t)
{
    kvp_link_t *l = t->data;
    uint64_t now = ctl_link_now(l), hb = l->ctl->cfg.heartbeat_ns;
    /* Idle either way -> PING. A busy link still samples its RTT every few
     * heartbeats (when only the peer pings, we would never measure it). */
    if (now - l->last_rx_ns >= hb || now - l->last_tx_ns >= hb || now - l->last_pong_ns >= 4 * hb)
        link_send_ping(l, KVP_MSG_PING, ++l->ping_seq, now);
    if (l->state == LINK_READY)
        kvp_timer_start(l->ctl->loop, &l->t_heartbeat, now + hb);
}

/* Lazy: frames only move last_rx_ns; the timer re-arms itself from it.
 * Silence counts only while we listened: after a long callback (our own
 * stall: a big commit, a descheduled process) the peer's frames may sit
 * unread in the socket, so the verdict waits for the next round's poll
 * (the timer fires after it) instead of blaming the peer for our pause. */
static void link_on_dead(kvp_timer_t *t)
{
    kvp_link_t *l = t->data;
    kvp_ctl_t *ctl = l->ctl;
    uint64_t now = ctl_link_now(l), dead = ctl->cfg.dead_after_ns;
    /* A read pause is ours, not the peer's silence: after one, the peer has
     * a whole dead_after from the resume to be heard (what it sent meanwhile
     * waits in the socket until our next polls read it). */
    uint64_t heard = KVP_MAX(l->last_rx_ns, l->resumed_ns);
    if (now - heard < dead) {
        kvp_timer_start(ctl->loop, &l->t_dead, heard + dead);
        return;
    }
    if (l->read_paused || l->resumed_ns >= kvp_loop_polled(ctl->loop)) {
        /* our pause, not the peer's silence: judge after it and after a
         * poll that read what waited meanwhile */
        ctl->st.dead_deferred++;
        kvp_timer_start(ctl->loop, &l->t_dead,
                        l->read_paused ? l->t_resume.deadline_ns + KVP_NSEC_PER_MSEC : now);
        return;
    }
    if (l->last_rx_ns + dead > kvp_loop_polled(ctl->loop)) {
        ctl->st.dead_deferred++;
        kvp_timer_start(ctl->loop, &l->t_dead, now); /* after the next poll */
        return;
    }
    ctl->st.peers_dead++;
    KVP_WARN(ctl->prefix, "peer %s: nothing received for %llu ms: dead", l->peer_id,
             (unsigned long long)((now - l->last_rx_ns) / KVP_NSEC_PER_MSEC));
    kvp__ctl_link_down(l, KVP_DOWN_DEAD, KVP_BYE_DEAD, true);
}

static void link_on_handshake_timeout(kvp_timer_t *t)
{
    kvp_link_t *l = t->data;
    if (l->compat_wait) { /* refused already; the peer's string never came */
        kvp__ctl_hs_compat_refused(l);
        return;
    }
    l->ctl->st.handshakes_timed_out++;
    bool pre = kvp__ctl_link_preauth(l);
    l->ctl->st.refused_preauth += pre;
    CTL_LOG_REFUSED(l, KVP_LOG_WARN, "peer %s (%s): %s not complete after %llu ms (%s): closed",
             l->peer_id, l->conn ? l->conn->remote : "?", pre ? "authentication" : "handshake",
             (unsigned long long)((ctl_link_now(l) - l->created_ns) / KVP_NSEC_PER_MSEC),
             link_state_names[l->state]);
    kvp__ctl_link_down(l, KVP_DOWN_HANDSHAKE_TIMEOUT, -1, true);
}

static uint16_t link_refusal_bye(kvp_status_t st)
{
    switch (st) {
    case KVP_ERR_INCOMPATIBLE: return KVP_BYE_INCOMPATIBLE;
    case KVP_ERR_AUTH: return KVP_BYE_AUTH;
    case KVP_ERR_LIMIT: return KVP_BYE_LIMIT;
    case KVP_ERR_TRANSPORT: return KVP_BYE_TRANSPORT;
    case KVP_ERR_CLOSED: return KVP_BYE_SHUTDOWN; /* we are shutting down */
    default: return KVP_BYE_PROTOCOL;
    }
}

void kvp__ctl_link_become_ready(kvp_link_t *l)
{
    kvp_ctl_t *ctl = l->ctl;
    uint64_t now = ctl_link_now(l);
    kvp__ctl_link_set_state(l, LINK_READY);
    l->wctx.handshake_done = true;
    /* dead-after counts from ready: the peer's ack may have waited in CHECK */
    l->last_rx_ns = l->last_pong_ns = now;
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
        CTL_LOG_REFUSED(l, KVP_LOG_WARN, "peer %s: refused by the session layer: %s", l->peer_id,
                 kvp_status_str(st));
        /* Its HELLO was compatible, so a blob that does not import (garbled,
         * truncated, or for another layout than that HELLO) breaks the
         * handshake: counted like any protocol error. */
        if (st == KVP_ERR_PROTO || st == KVP_ERR_TRUNCATED || st == KVP_ERR_INCOMPATIBLE)
            ctl->st.protocol_errors++;
        l->was_ready = false; /* never became ready for the user: no on_down */
        kvp__ctl_link_down(l, KVP_DOWN_REFUSED, link_refusal_bye(st), true);
        return;
    }
    if (l->state != LINK_READY)
        return; /* closed from inside on_ready */
    KVP_INFO(ctl->prefix, "peer %s: ready (%s, %s)", l->peer_id, l->outbound ? "dialed" : "accepted",
             l->conn->ops->name);
    link_flush_pending(l);
    kvp__ctl_want_link_ready(ctl, l);
    kvp__ctl_kick_checks(ctl, l->peer_id);
}

/* -------------------------------------------------------------- receiving */

static void link_on_pong(kvp_link_t *l, const kvp_msg_ping_t *p)
{
    uint64_t now = ctl_link_now(l);
    if (p->seq == 0 || p->seq > l->ping_seq || p->sent_ns > now)
        return; /* not one of ours: ignore (liveness already counted) */
    l->rtt_ns = now - p->sent_ns;
    l->last_pong_ns = now;
    if (l->ctl->cfg.cb.on_pong)
        l->ctl->cfg.cb.on_pong(l->ctl->cfg.cb.arg, l, l->rtt_ns);
}

static void link_on_bye(kvp_link_t *l, const kvp_msg_bye_t *b)
{
    uint16_t reason = b->reason;
    if (b->compat[0])
        snprintf(l->peer_compat, sizeof(l->peer_compat), "%s", b->compat);
    if (l->compat_wait) {
        kvp__ctl_hs_compat_refused(l);
        return;
    }
    bool fault = kvp_bye_reason_is_fault(reason);
    KVP_LOG(fault && l->state == LINK_READY ? KVP_LOG_WARN : KVP_LOG_INFO, l->ctl->prefix,
            "peer %s: BYE %s", l->peer_id, kvp_bye_reason_str(reason));
    kvp__ctl_link_down(l, KVP_DOWN_BYE, -1, fault);
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
        kvp__ctl_hs_on_hello(l, &m->u.hello);
        return;
    }
    if (!l->have_peer) {
        kvp__ctl_link_protocol_error(l, "frame before HELLO");
        return;
    }
    if ((!kvp_epoch_eq(&m->src_epoch, &l->remote_epoch) ||
         !kvp_epoch_eq(&m->dst_epoch, &l->local_epoch)) &&
        !KVP_MUTATED(KVP_MUT_ACCEPT_STALE_EPOCH) /* test-only: the bug */) {
        if (l->state != LINK_READY && link_is_handshake_msg(m->type)) {
            kvp__ctl_link_protocol_error(l, "bad epochs on a handshake frame");
            return;
        }
        ctl->st.stale_frames++; /* another incarnation's frame: dropped before any effect */
        return;
    }
    if (l->compat_wait && m->type != KVP_MSG_BYE)
        return; /* refused: only the peer's BYE still matters */
    switch (m->type) {
    case KVP_MSG_AUTH: kvp__ctl_hs_on_auth(l, &m->u.auth); return;
    case KVP_MSG_HELLO_ACK: kvp__ctl_hs_on_ack(l, &m->u.hello_ack); return;
    case KVP_MSG_BYE: link_on_bye(l, &m->u.bye); return;
    default: break;
    }
    if (l->state != LINK_READY) {
        kvp__ctl_link_protocol_error(l, "frame before the handshake completed");
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
        if (!kvp__ctl_hs_refuse_version(l, frame, len))
            kvp__ctl_link_protocol_error(l, why[0] ? why : kvp_status_str(st));
        return;
    }
    ctl->st.frames_in++;
    ctl->st.bytes_in += len;
    l->last_rx_ns = ctl_link_now(l);
    l->rx_frames++;
    if (l->claim_ping_pending) {
        l->claim_ping_pending = false;
        kvp__ctl_kick_checks(ctl, l->peer_id); /* the restart claim is answered */
    }
    link_dispatch(l, &m);
}

static void link_on_readable(kvp_conn_t *c)
{
    kvp_link_t *l = c->owner;
    size_t off = 0;
    while (l->state != LINK_CLOSING && !l->read_paused) { /* a frame may pause the link */
        kvp_frame_hdr_t hdr;
        char why[128] = "bad frame header";
        kvp_status_t st = kvp_wire_parse_hdr_why(&l->wctx, c->rbuf + off, c->rlen - off, &hdr,
                                                 why, sizeof(why));
        if (st == KVP_ERR_TRUNCATED)
            break;
        if (st != KVP_OK) {
            kvp__ctl_link_protocol_error(l, why);
            return;
        }
        size_t total = KVP_WIRE_HDR_LEN + (size_t)hdr.length;
        if (c->rlen - off < total) {
            kvp_conn_rbuf_consume(c, off);
            off = 0;
            if (kvp_conn_rbuf_reserve(c, total) != KVP_OK)
                kvp__ctl_link_protocol_error(l, "cannot buffer frame");
            return;
        }
        link_handle(l, c->rbuf + off, total);
        off += total;
    }
    if (l->state != LINK_CLOSING)
        kvp_conn_rbuf_consume(c, off);
}

void kvp_link_pause_read(kvp_link_t *l, uint64_t until_ns)
{
    if (l->state != LINK_READY || l->conn == NULL)
        return;
    if (!l->read_paused || l->t_resume.deadline_ns < until_ns)
        kvp_timer_start(l->ctl->loop, &l->t_resume, until_ns);
    if (!l->read_paused && l->conn->ops->set_read)
        l->conn->ops->set_read(l->conn, false);
    l->read_paused = true;
}

/* The pause is over: read again, and take the frames that waited in rbuf
 * (no new bytes may come to announce them). */
static void link_on_resume(kvp_timer_t *t)
{
    kvp_link_t *l = t->data;
    l->read_paused = false;
    l->resumed_ns = ctl_link_now(l);
    if (l->state == LINK_CLOSING || l->conn == NULL)
        return;
    if (l->conn->ops->set_read)
        l->conn->ops->set_read(l->conn, true);
    link_on_readable(l->conn);
}

static void link_on_closed(kvp_conn_t *c, kvp_status_t why)
{
    kvp_link_t *l = c->owner;
    kvp_ctl_t *ctl = l->ctl;
    if (l->compat_wait) {
        kvp__ctl_hs_compat_refused(l);
        return;
    }
    if (l->state == LINK_CONNECTING) {
        ctl->st.dial_failures++;
        KVP_DEBUG(ctl->prefix, "dial %s failed", l->peer_id);
    } else {
        KVP_LOG(l->state == LINK_READY ? KVP_LOG_WARN : KVP_LOG_INFO, ctl->prefix,
                "peer %s: connection %s", l->peer_id, why == KVP_ERR_CLOSED ? "closed" : "reset");
    }
    kvp__ctl_link_down(l, KVP_DOWN_EOF, -1, true);
}

static void link_on_connected(kvp_conn_t *c)
{
    kvp_link_t *l = c->owner;
    kvp__ctl_link_set_state(l, LINK_HELLO);
    kvp__ctl_hs_send_hello(l);
}

const kvp_conn_handler_t kvp__ctl_link_handler = {
    .connected = link_on_connected,
    .readable = link_on_readable,
    .closed = link_on_closed,
};

/* -------------------------------------------------------------- lifecycle */

kvp_status_t kvp__ctl_link_new(kvp_ctl_t *ctl, kvp_conn_t *conn, bool outbound,
                               const char *addr, kvp_link_t **out)
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
    snprintf(l->peer_id, sizeof(l->peer_id), "%s", addr ? addr : "?");
    /* Zeroed, a link is CONNECTING (an outbound connect in progress); an
     * accepted connection is connected already: HELLO (the setter's first call). */
    if (!outbound)
        kvp__ctl_link_set_state(l, LINK_HELLO);
    kvp_list_init(&l->pending);
    kvp_timer_init(&l->t_handshake, "handshake", link_on_handshake_timeout, l);
    kvp_timer_init(&l->t_heartbeat, "heartbeat", link_on_heartbeat, l);
    kvp_timer_init(&l->t_dead, "dead-after", link_on_dead, l);
    kvp_timer_init(&l->t_check, "identity-check", kvp__ctl_on_check, l);
    kvp_timer_init(&l->t_resume, "read-resume", link_on_resume, l);
    /* An inbound connection has preauth_timeout to authenticate (gate.c);
     * hs_authenticated() then extends it to the handshake timeout. */
    kvp_timer_start(ctl->loop, &l->t_handshake,
                    now + (outbound ? ctl->cfg.handshake_timeout_ns : ctl->cfg.preauth_timeout_ns));
    kvp_list_insert_tail(&ctl->links, &l->node);
    if (conn) {
        l->conn = conn;
        conn->owner = l;
        conn->h = &kvp__ctl_link_handler;
        conn->linger_head = &ctl->lingering;
    }
    if (!outbound)
        kvp__ctl_hs_send_hello(l);
    *out = l;
    return KVP_OK;
}

/* The link must be CLOSING (conn already handed off, timers stopped). */
void kvp__ctl_link_free(kvp_link_t *l)
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

bool kvp_link_outbound(const kvp_link_t *l)
{
    return l->outbound;
}

void kvp_link_remote_host(const kvp_link_t *l, char *buf, size_t cap)
{
    /* conn->remote is "host:port" or "[v6]:port" as the tcp conn formats it */
    const char *r = l->conn != NULL ? l->conn->remote : "";
    const char *colon = strrchr(r, ':');
    size_t n = colon ? (size_t)(colon - r) : 0;
    if (n >= 2 && r[0] == '[' && r[n - 1] == ']') {
        r++;
        n -= 2;
    }
    if (cap == 0)
        return;
    n = KVP_MIN(n, cap - 1);
    memcpy(buf, r, n);
    buf[n] = '\0';
}

uint64_t kvp_link_binding(const kvp_link_t *l)
{
    const kvp_conn_t *c = l->conn;
    return c != NULL && c->ops->binding != NULL ? c->ops->binding(c) : 0;
}
