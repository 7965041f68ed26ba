/* ctl.c -- the control plane of one node: configuration, the listener, the
 * links it accepts or dials, wanted peers redialed with backoff, the reap
 * that runs on_down and frees links from the loop, and stats. The per-link
 * protocol lives in link.c. */
#include "ctl/ctl_int.h"

#include <sodium.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static const char *const down_reason_names[] = {
    "bye",        "eof",         "dead",        "handshake-timeout", "protocol",  "incompatible",
    "auth",       "duplicate",   "limit",       "local-close",       "slow-peer", "refused",
};

const char *kvp_down_reason_str(kvp_down_reason_t r)
{
    if ((unsigned)r >= KVP_ARRAY_SIZE(down_reason_names))
        return "unknown";
    return down_reason_names[r];
}

/* Encode into the ctl's buffer; measure (an extra pass over the keys) only
 * when the buffer turns out too small. */
kvp_status_t kvp__ctl_encode(kvp_ctl_t *ctl, const kvp_msg_t *m, size_t *len)
{
    if (ctl->ebuf_cap) {
        kvp_status_t st = kvp_wire_encode(m, ctl->ebuf, ctl->ebuf_cap, len);
        if (st != KVP_ERR_NOSPACE)
            return st;
    }
    size_t need = kvp_wire_encoded_size(m);
    if (need == 0)
        return KVP_ERR_INVALID;
    if (need > ctl->ebuf_cap) {
        size_t cap = KVP_MAX(KVP_MAX(need, ctl->ebuf_cap * 2), (size_t)4096);
        uint8_t *b = kvp__realloc(ctl->ebuf, cap);
        if (!b)
            return KVP_ERR_NOMEM;
        ctl->ebuf = b;
        ctl->ebuf_cap = cap;
    }
    return kvp_wire_encode(m, ctl->ebuf, ctl->ebuf_cap, len);
}

/* ------------------------------------------------------------------- reap */

static void ctl_want_link_gone(kvp_ctl_t *ctl, kvp_link_t *l);

void kvp__ctl_link_finish(kvp_link_t *l)
{
    kvp_ctl_t *ctl = l->ctl;
    KVP_ASSERT(l->state == LINK_CLOSING);
    if (l->was_ready && ctl->cfg.cb.on_down)
        ctl->cfg.cb.on_down(ctl->cfg.cb.arg, l, l->down_reason, l->down_bye, l->down_fault);
    ctl_want_link_gone(ctl, l);
    kvp__ctl_link_free(l);
}

static void ctl_on_reap(kvp_timer_t *t)
{
    kvp_ctl_t *ctl = t->data;
    while (!kvp_list_empty(&ctl->closing))
        kvp__ctl_link_finish(KVP_CONTAINER_OF(ctl->closing.next, kvp_link_t, node));
}

void kvp__ctl_schedule_reap(kvp_ctl_t *ctl)
{
    if (!kvp_timer_active(&ctl->t_reap))
        kvp_timer_start(ctl->loop, &ctl->t_reap, kvp_loop_now(ctl->loop));
}

void kvp__ctl_kick_checks(kvp_ctl_t *ctl, const char *peer_id)
{
    kvp_list_t *pos;
    for (pos = ctl->links.next; pos != &ctl->links; pos = pos->next) {
        kvp_link_t *o = KVP_CONTAINER_OF(pos, kvp_link_t, node);
        if (o->state == LINK_CHECK && !strcmp(o->peer_id, peer_id))
            kvp_timer_start(ctl->loop, &o->t_check, kvp_loop_now(ctl->loop));
    }
}

/* --------------------------------------------------------------- identity */

/* Same peer: the identity it claims, or for an outbound link still before
 * the peer's HELLO, the address we dialed. */
static bool link_same_peer(const kvp_link_t *o, const char *peer_id)
{
    return (o->have_peer || o->outbound) && !strcmp(o->peer_id, peer_id);
}

/* A claim of a live session's peer id (issue 27: no takeover of a stalled
 * peer): `l` never replaces `o`. We PING `o`; if it answers, `l` is
 * refused; if it stays silent, `l` waits (bounded by its handshake timer)
 * until `o` goes down by itself -- EOF, BYE or the dead-after verdict of
 * liveness, which judges silence only while we listened -- and is then
 * kicked (kvp__ctl_link_down -> kvp__ctl_kick_checks). A restarted peer thus gets in
 * as soon as its old session is down; a connection that merely claims the
 * id of a peer stalled for less than dead_after never does. Returns true
 * when `l` must keep waiting (or was refused). */
static bool link_claim(kvp_link_t *l, kvp_link_t *o)
{
    kvp_ctl_t *ctl = l->ctl;
    uint64_t now = ctl_link_now(l);
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
        CTL_LOG_REFUSED(l, KVP_LOG_WARN, "peer %s (%s): new connection claims the id of a live "
                        "session: refused", l->peer_id, l->conn ? l->conn->remote : "?");
        ctl->st.refused_duplicate++;
        kvp__ctl_link_refuse(l, KVP_DOWN_DUPLICATE, KVP_BYE_DUPLICATE, &ctl->st.refused_identity);
        return true;
    }
    /* Still silent: wait for o's own verdict (the kick), re-checking at
     * each dead-after period for an answer to the PING. */
    if (!l->claim_logged) {
        l->claim_logged = true;
        KVP_INFO(ctl->prefix, "peer %s: new connection waits until the silent session of that "
                 "id is judged dead (or answers)", o->peer_id);
    }
    kvp_timer_start(ctl->loop, &l->t_check, now + ctl->cfg.dead_after_ns);
    return true;
}

/* Settle identity conflicts before our blob goes out (SPEC §4): a ready
 * link for the same peer id makes this a restart claim; a committed one
 * (ACKED) is waited for; with an uncommitted one, a simultaneous dial is
 * decided by the lower peer id -- only on the lower side, which never has two
 * committed links, so both sides keep the same connection. */
void kvp__ctl_settle_identity(kvp_link_t *l)
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
            kvp__ctl_link_down(l, KVP_DOWN_DUPLICATE, KVP_BYE_DUPLICATE, false);
            return;
        }
        /* o loses: our own dial wins a crossing, a newer one replaces an older */
        KVP_DEBUG(ctl->prefix, "peer %s: duplicate connection in handshake closed", o->peer_id);
        ctl->st.refused_duplicate++;
        kvp__ctl_link_down(o, KVP_DOWN_DUPLICATE, o->have_peer ? KVP_BYE_DUPLICATE : -1, false);
    }
    kvp__ctl_hs_send_ack(l);
}

void kvp__ctl_on_check(kvp_timer_t *t)
{
    kvp_link_t *l = t->data;
    if (l->state == LINK_CHECK)
        kvp__ctl_settle_identity(l);
}

/* ------------------------------------------------------------------ wants */

static ctl_want_t *ctl_want_find(kvp_ctl_t *ctl, const char *addr)
{
    kvp_list_t *pos;
    for (pos = ctl->wants.next; pos != &ctl->wants; pos = pos->next) {
        ctl_want_t *w = KVP_CONTAINER_OF(pos, ctl_want_t, node);
        if (!strcmp(w->addr, addr))
            return w;
    }
    return NULL;
}

/* A link to the wanted peer that is up or on its way up (any direction). */
static bool ctl_has_link_to(const kvp_ctl_t *ctl, const char *addr)
{
    const kvp_list_t *pos;
    for (pos = ctl->links.next; pos != &ctl->links; pos = pos->next) {
        const kvp_link_t *o = KVP_CONTAINER_OF(pos, kvp_link_t, node);
        if ((o->have_peer || o->outbound) && !strcmp(o->peer_id, addr))
            return true;
    }
    return false;
}

static void ctl_want_arm(ctl_want_t *w)
{
    kvp_ctl_t *ctl = w->ctl;
    if (w->link || kvp_timer_active(&w->t_redial) || ctl_has_link_to(ctl, w->addr))
        return;
    /* jitter: uniform in [3/4, 5/4] of the backoff, so peers do not redial in step */
    uint64_t b = w->backoff_ns, delay = b - b / 4 + kvp_rng_below(&ctl->rng, b / 2 + 1);
    kvp_timer_start(ctl->loop, &w->t_redial, kvp_loop_now(ctl->loop) + delay);
}

/* sa: the resolved address (TCP), NULL for the fake network. */
static kvp_status_t ctl_dial(kvp_ctl_t *ctl, const char *addr, const void *sa, unsigned sslen,
                             kvp_link_t **out)
{
    kvp_conn_t *c = NULL;
    kvp_status_t st;
    if (ctl->cfg.fake_net) {
#ifndef KVP_TESTING
        return KVP_ERR_UNSUPPORTED; /* the fake network exists in test builds only */
#else
        /* our fake source address: the listener's, else a client-only name
         * that partitions of our peer id do not match */
        char local[KVP_WIRE_STR_MAX + 1];
        if (ctl->cfg.listen_addr)
            snprintf(local, sizeof(local), "%s", ctl->cfg.listen_addr);
        else
            snprintf(local, sizeof(local), "%.200s/client", ctl->peer_id);
        st = kvp_fake_dial(ctl->cfg.fake_net, ctl->loop, local, addr, ctl->cfg.wbuf_max,
                           &kvp__ctl_link_handler, NULL, &c);
#endif
    } else
        st = kvp_tcp_dial_ss(ctl->loop, sa, sslen, addr, ctl->cfg.wbuf_max, &kvp__ctl_link_handler,
                             NULL, &c);
    if (st != KVP_OK)
        return st;
    ctl->st.dials++;
    st = kvp__ctl_link_new(ctl, c, true, addr, out);
    if (st != KVP_OK)
        c->ops->close(c, false);
    return st;
}

/* A wanted peer's attempt failed: remember why, log it (the first failure
 * and then at powers of two, so a dead peer does not flood the log). */
static void ctl_want_failed(ctl_want_t *w, const char *why)
{
    kvp_ctl_t *ctl = w->ctl;
    w->failures++;
    snprintf(w->last_error, sizeof(w->last_error), "%s", why);
    if ((w->failures & (w->failures - 1)) == 0)
        KVP_WARN(ctl->prefix, "peer %s: not reachable: %s (attempt %u; redialling with backoff)",
                 w->addr, why, w->failures);
}

static void ctl_want_dial_done(ctl_want_t *w, kvp_status_t st, kvp_link_t *l);

static void ctl_want_dial(ctl_want_t *w)
{
    kvp_ctl_t *ctl = w->ctl;
    kvp_link_t *l = NULL;
    if (ctl_has_link_to(ctl, w->addr) || w->resolving)
        return;
    kvp_status_t st;
    if (!ctl->cfg.fake_net) {
        struct sockaddr_storage ss;
        unsigned sslen;
        st = kvp_tcp_parse_addr_ex(w->addr, &ss, &sslen, true);
        if (st == KVP_ERR_BUSY) { /* a host name: resolved off this thread */
            if ((st = kvp__ctl_resolve_start(ctl, w)) == KVP_OK)
                return;
        } else if (st == KVP_OK) {
            kvp__ctl_want_resolved(w, st, &ss, sslen);
            return;
        }
        ctl_want_dial_done(w, st, NULL);
        return;
    }
    st = ctl_dial(ctl, w->addr, NULL, 0, &l);
    ctl_want_dial_done(w, st, l);
}

void kvp__ctl_want_resolved(ctl_want_t *w, kvp_status_t st, const void *sa, unsigned sslen)
{
    kvp_link_t *l = NULL;
    if (st == KVP_OK && !ctl_has_link_to(w->ctl, w->addr))
        st = ctl_dial(w->ctl, w->addr, sa, sslen, &l);
    else if (st == KVP_OK)
        return; /* a link to it came up meanwhile */
    ctl_want_dial_done(w, st, l);
}

static void ctl_want_dial_done(ctl_want_t *w, kvp_status_t st, kvp_link_t *l)
{
    kvp_ctl_t *ctl = w->ctl;
    if (st != KVP_OK) {
        ctl_want_failed(w, st == KVP_ERR_INVALID ? "cannot resolve the host name"
                                                 : kvp_status_str(st));
        ctl->st.dial_failures++;
        w->backoff_ns = KVP_MIN(w->backoff_ns * 2, ctl->cfg.backoff_max_ns);
        ctl_want_arm(w);
        return;
    }
    l->want = w;
    w->link = l;
}

static void ctl_on_redial(kvp_timer_t *t)
{
    ctl_want_dial(t->data);
}

/* A want stays satisfied while the link it dialed lives (whatever peer id
 * the peer announces) or while any link carries the wanted address as its
 * peer id; it redials when neither holds. */
void kvp__ctl_want_link_ready(kvp_ctl_t *ctl, kvp_link_t *l)
{
    ctl_want_t *w = ctl_want_find(ctl, l->peer_id);
    if (w) {
        w->backoff_ns = ctl->cfg.backoff_min_ns;
        kvp_timer_stop(ctl->loop, &w->t_redial);
        w->failures = 0;
    }
    if (l->want) {
        l->want->backoff_ns = ctl->cfg.backoff_min_ns;
        l->want->failures = 0;
    }
}

static void ctl_want_link_gone(kvp_ctl_t *ctl, kvp_link_t *l)
{
    ctl_want_t *w = l->want;
    if (w) {
        KVP_ASSERT(w->link == l);
        w->link = NULL;
        l->want = NULL;
        if (!l->was_ready) { /* a failed attempt: back off further */
            char why[128];
            if (l->peer_compat[0])
                snprintf(why, sizeof(why), "compat mismatch: ours '%s', peer's '%s'",
                         ctl->compat, l->peer_compat);
            else if (l->down_reason == KVP_DOWN_INCOMPATIBLE && l->have_peer &&
                     l->peer.fingerprint != ctl->cfg.fingerprint)
                snprintf(why, sizeof(why), "compat mismatch: ours '%s', peer's fingerprint "
                         "%016llx (it sent no string)", ctl->compat,
                         (unsigned long long)l->peer.fingerprint);
            else if (l->down_reason == KVP_DOWN_BYE)
                snprintf(why, sizeof(why), "refused by the peer: %s",
                         kvp_bye_reason_str(l->down_bye));
            else if (l->down_reason == KVP_DOWN_EOF && l->have_peer)
                snprintf(why, sizeof(why), "connection closed during the handshake (the "
                                           "peer's log says why: PSK, compat, limit)");
            else if (l->down_reason == KVP_DOWN_EOF)
                snprintf(why, sizeof(why), "connection refused or reset");
            else if (l->down_reason == KVP_DOWN_AUTH)
                snprintf(why, sizeof(why), "authentication failed: the pre-shared keys "
                                           "differ (or only one side has one)");
            else if (l->down_reason == KVP_DOWN_INCOMPATIBLE)
                snprintf(why, sizeof(why), "incompatible: block layout, compat string, hash "
                                           "seed or wire version differ (see the log)");
            else
                snprintf(why, sizeof(why), "%s", kvp_down_reason_str(l->down_reason));
            ctl_want_failed(w, why);
            w->backoff_ns = KVP_MIN(w->backoff_ns * 2, ctl->cfg.backoff_max_ns);
        }
        ctl_want_arm(w);
    }
    if (l->have_peer && (w = ctl_want_find(ctl, l->peer_id)) != NULL)
        ctl_want_arm(w);
}

/* "host:port" or "[v6]:port" with a numeric port 1..65535 (not resolved:
 * a name may resolve later, that is a runtime state of the want). */
static bool ctl_addr_syntax_ok(const char *addr)
{
    const char *colon;
    if (addr[0] == '[') {
        const char *end = strchr(addr, ']');
        if (end == NULL || end == addr + 1 || end[1] != ':')
            return false;
        colon = end + 1;
    } else {
        colon = strrchr(addr, ':');
        if (colon == NULL || colon == addr || memchr(addr, ':', (size_t)(colon - addr)))
            return false; /* no host, or a bare IPv6 address without brackets */
    }
    char *end = NULL;
    unsigned long pn = strtoul(colon + 1, &end, 10);
    return colon[1] >= '0' && colon[1] <= '9' && *end == '\0' && pn >= 1 && pn <= 65535;
}

kvp_status_t kvp_ctl_want(kvp_ctl_t *ctl, const char *addr)
{
    if (!addr || !*addr || strlen(addr) > KVP_WIRE_STR_MAX || !strcmp(addr, ctl->peer_id))
        return KVP_ERR_INVALID;
    if (!ctl->cfg.fake_net && !ctl_addr_syntax_ok(addr)) {
        KVP_WARN(ctl->prefix, "peer %s: not an address (host:port or [v6]:port): refused",
                 addr);
        return KVP_ERR_INVALID;
    }
    if (ctl_want_find(ctl, addr))
        return KVP_OK;
    ctl_want_t *w = kvp__calloc(1, sizeof(*w));
    if (!w)
        return KVP_ERR_NOMEM;
    w->ctl = ctl;
    snprintf(w->addr, sizeof(w->addr), "%s", addr);
    w->backoff_ns = ctl->cfg.backoff_min_ns;
    kvp_timer_init(&w->t_redial, "redial", ctl_on_redial, w);
    kvp_list_insert_tail(&ctl->wants, &w->node);
    ctl_want_dial(w);
    return KVP_OK;
}

static void ctl_want_free(kvp_ctl_t *ctl, ctl_want_t *w)
{
    kvp_timer_stop(ctl->loop, &w->t_redial);
    kvp__ctl_resolve_forget(w);
    if (w->link)
        w->link->want = NULL;
    kvp_list_remove(&w->node);
    kvp__free(w);
}

void kvp_ctl_unwant(kvp_ctl_t *ctl, const char *addr)
{
    ctl_want_t *w = ctl_want_find(ctl, addr);
    if (w)
        ctl_want_free(ctl, w);
}

/* ---------------------------------------------------------------- accept */

static void ctl_on_accept(kvp_listener_t *lis, kvp_conn_t *c)
{
    kvp_ctl_t *ctl = lis->owner;
    /* Connections that have not authenticated are bounded by the gate's
     * caps and deadline (gate.c), apart from max_sessions. */
    kvp_link_t *l;
    c->linger_head = &ctl->lingering;
    if (!kvp__ctl_gate_admit(ctl, c) || kvp__ctl_link_new(ctl, c, false, c->remote, &l) != KVP_OK) {
        c->ops->close(c, false);
        return;
    }
    l->src_hash = kvp__ctl_gate_src_hash(c->remote);
}

/* ---------------------------------------------------------- create/destroy */

static void ctl_apply_defaults(kvp_ctl_config_t *c)
{
    if (!c->heartbeat_ns)
        c->heartbeat_ns = 500 * KVP_NSEC_PER_MSEC;
    if (!c->dead_after_ns)
        c->dead_after_ns = 2 * KVP_NSEC_PER_SEC;
    if (!c->handshake_timeout_ns)
        c->handshake_timeout_ns = 10 * KVP_NSEC_PER_SEC;
    if (!c->backoff_min_ns)
        c->backoff_min_ns = 100 * KVP_NSEC_PER_MSEC;
    if (!c->backoff_max_ns)
        c->backoff_max_ns = 5 * KVP_NSEC_PER_SEC;
    if (c->backoff_max_ns < c->backoff_min_ns)
        c->backoff_max_ns = c->backoff_min_ns;
    if (!c->max_sessions)
        c->max_sessions = 1024;
    if (!c->wbuf_max)
        c->wbuf_max = 64u << 20;
    if (!c->max_preauth)
        c->max_preauth = 32;
    if (!c->max_preauth_per_addr)
        c->max_preauth_per_addr = 8;
    if (!c->preauth_timeout_ns)
        c->preauth_timeout_ns = 3 * KVP_NSEC_PER_SEC;
    if (c->preauth_timeout_ns > c->handshake_timeout_ns)
        c->preauth_timeout_ns = c->handshake_timeout_ns;
}

void kvp_ctl_reconfigure(kvp_ctl_t *ctl, const kvp_ctl_config_t *c)
{
    kvp_ctl_config_t n = ctl->cfg;
    n.heartbeat_ns = c->heartbeat_ns;
    n.dead_after_ns = c->dead_after_ns;
    n.handshake_timeout_ns = c->handshake_timeout_ns;
    n.backoff_min_ns = c->backoff_min_ns;
    n.backoff_max_ns = c->backoff_max_ns;
    n.max_sessions = c->max_sessions;
    n.max_preauth = c->max_preauth;
    n.max_preauth_per_addr = c->max_preauth_per_addr;
    n.preauth_timeout_ns = c->preauth_timeout_ns;
    n.psk = c->psk_len ? c->psk : NULL;
    n.psk_len = c->psk_len;
    ctl_apply_defaults(&n);
    ctl->cfg = n;
}

static kvp_status_t ctl_check_config(const kvp_ctl_config_t *c)
{
    if (!c->loop || !c->block_size || !c->num_blocks || c->blob_len > KVP_WIRE_BLOB_MAX ||
        (c->blob_len && !c->blob) || (c->psk_len && !c->psk))
        return KVP_ERR_INVALID;
    if ((c->peer_id && strlen(c->peer_id) > KVP_WIRE_STR_MAX) ||
        (c->instance_id && strlen(c->instance_id) > KVP_WIRE_STR_MAX))
        return KVP_ERR_INVALID;
    if (c->fake_net && !c->listen_addr && !c->peer_id)
        return KVP_ERR_INVALID; /* a fake-net ctl needs an address to be told apart */
    return KVP_OK;
}

static kvp_status_t ctl_listen(kvp_ctl_t *ctl)
{
    const kvp_ctl_config_t *c = &ctl->cfg;
    if (!c->listen_addr)
        return KVP_OK;
    if (c->fake_net)
#ifdef KVP_TESTING
        return kvp_fake_listen(c->fake_net, ctl->loop, c->listen_addr, c->wbuf_max, ctl_on_accept,
                               ctl, &ctl->listener);
#else
        return KVP_ERR_UNSUPPORTED; /* the fake network exists in test builds only */
#endif
    return kvp_tcp_listen(ctl->loop, c->listen_addr, c->wbuf_max, ctl_on_accept, ctl,
                          &ctl->listener);
}

static void ctl_set_ids(kvp_ctl_t *ctl, const kvp_ctl_config_t *cfg)
{
    if (cfg->peer_id)
        snprintf(ctl->peer_id, sizeof(ctl->peer_id), "%s", cfg->peer_id);
    else if (ctl->listener)
        snprintf(ctl->peer_id, sizeof(ctl->peer_id), "%s", ctl->listener->addr);
    else
        snprintf(ctl->peer_id, sizeof(ctl->peer_id), "unbound-%016llx",
                 (unsigned long long)kvp_rng_next(&ctl->rng));
    snprintf(ctl->instance_id, sizeof(ctl->instance_id), "%s",
             cfg->instance_id ? cfg->instance_id : ctl->peer_id);
    ctl->cfg.peer_id = ctl->peer_id;
    ctl->cfg.instance_id = ctl->instance_id;
    kvp_wire_compat_for_bye(cfg->compat, ctl->compat);
    ctl->cfg.compat = ctl->compat;
    snprintf(ctl->prefix, sizeof(ctl->prefix), "%.63s",
             cfg->log_prefix ? cfg->log_prefix : ctl->peer_id);
    ctl->cfg.log_prefix = ctl->prefix;
}

kvp_status_t kvp_ctl_create(const kvp_ctl_config_t *cfg, kvp_ctl_t **out)
{
    kvp_status_t st = ctl_check_config(cfg);
    if (st != KVP_OK)
        return st;
    if (sodium_init() < 0)
        return KVP_ERR_IO;
    kvp_ctl_t *ctl = kvp__calloc(1, sizeof(*ctl));
    if (!ctl)
        return KVP_ERR_NOMEM;
    ctl->cfg = *cfg;
    ctl_apply_defaults(&ctl->cfg);
    ctl->loop = cfg->loop;
    kvp_list_init(&ctl->links);
    kvp_list_init(&ctl->closing);
    kvp_list_init(&ctl->lingering);
    kvp_list_init(&ctl->wants);
    kvp_timer_init(&ctl->t_reap, "reap", ctl_on_reap, ctl);
    kvp_ratelimit_init(&ctl->rl_proto, KVP_NSEC_PER_SEC, 10);
    kvp_ratelimit_init(&ctl->rl_limit, KVP_NSEC_PER_SEC, 5);
    kvp_ratelimit_init(&ctl->rl_refuse, KVP_NSEC_PER_SEC, 50);
    kvp_ratelimit_init(&ctl->rl_gate, KVP_NSEC_PER_SEC, 5);
    uint64_t seed;
    st = kvp_random_bytes(&seed, sizeof(seed));
    if (st != KVP_OK)
        goto err_ctl;
    if (ctl->cfg.fake_net && cfg->listen_addr) /* the simulator replays a seed bit for bit */
        seed = kvp_hash64(cfg->listen_addr, strlen(cfg->listen_addr), 0x6a177e5);
    kvp_rng_seed(&ctl->rng, seed);
    st = kvp_wire_scratch_create(&ctl->scratch);
    if (st != KVP_OK)
        goto err_ctl;
    st = ctl_listen(ctl);
    if (st != KVP_OK)
        goto err_scratch;
    ctl_set_ids(ctl, cfg);
    *out = ctl;
    return KVP_OK;

err_scratch:
    kvp_wire_scratch_destroy(ctl->scratch);
err_ctl:
    kvp__free(ctl);
    return st;
}

void kvp_ctl_destroy(kvp_ctl_t *ctl)
{
    if (!ctl)
        return;
    while (!kvp_list_empty(&ctl->wants))
        ctl_want_free(ctl, KVP_CONTAINER_OF(ctl->wants.next, ctl_want_t, node));
    kvp__ctl_resolve_destroy(ctl);
    while (!kvp_list_empty(&ctl->links)) {
        kvp_link_t *l = KVP_CONTAINER_OF(ctl->links.next, kvp_link_t, node);
        l->was_ready = false; /* destroy: no callbacks */
        kvp__ctl_link_down(l, KVP_DOWN_LOCAL_CLOSE, -1, false);
    }
    while (!kvp_list_empty(&ctl->closing)) {
        kvp_link_t *l = KVP_CONTAINER_OF(ctl->closing.next, kvp_link_t, node);
        l->want = NULL;
        kvp__ctl_link_free(l);
    }
    while (!kvp_list_empty(&ctl->lingering)) {
        kvp_conn_t *c = KVP_CONTAINER_OF(ctl->lingering.next, kvp_conn_t, lingering);
        c->ops->destroy(c);
    }
    kvp_timer_stop(ctl->loop, &ctl->t_reap);
    if (ctl->listener)
        ctl->listener->close(ctl->listener);
    kvp_wire_scratch_destroy(ctl->scratch);
    kvp__free(ctl->ebuf);
    kvp__free(ctl);
}

const char *kvp_ctl_peer_id(const kvp_ctl_t *ctl)
{
    return ctl->peer_id;
}

void kvp_ctl_get_stats(const kvp_ctl_t *ctl, kvp_ctl_stats_t *st)
{
    *st = ctl->st;
    st->accept_fd_exhausted = ctl->listener ? ctl->listener->fd_exhausted : 0;
    st->links_ready = st->links_handshaking = 0;
    const kvp_list_t *pos;
    for (pos = ctl->links.next; pos != &ctl->links; pos = pos->next) {
        const kvp_link_t *l = KVP_CONTAINER_OF(pos, kvp_link_t, node);
        if (l->state == LINK_READY)
            st->links_ready++;
        else
            st->links_handshaking++;
    }
}

kvp_link_t *kvp_ctl_link_by_peer(const kvp_ctl_t *ctl, const char *peer_id)
{
    const kvp_list_t *pos;
    for (pos = ctl->links.next; pos != &ctl->links; pos = pos->next) {
        kvp_link_t *l = KVP_CONTAINER_OF(pos, kvp_link_t, node);
        if (l->state == LINK_READY && !strcmp(l->peer_id, peer_id))
            return l;
    }
    return NULL;
}

kvp_link_t *kvp_ctl_link_pending(const kvp_ctl_t *ctl, const char *peer_id)
{
    const kvp_list_t *pos;
    for (pos = ctl->links.next; pos != &ctl->links; pos = pos->next) {
        kvp_link_t *l = KVP_CONTAINER_OF(pos, kvp_link_t, node);
        if (l->state != LINK_READY && (l->have_peer || l->outbound) && !strcmp(l->peer_id, peer_id))
            return l;
    }
    return NULL;
}

void kvp_ctl_wants_foreach(const kvp_ctl_t *ctl, kvp_ctl_want_cb cb, void *arg)
{
    const kvp_list_t *pos;
    for (pos = ctl->wants.next; pos != &ctl->wants; pos = pos->next) {
        const ctl_want_t *w = KVP_CONTAINER_OF(pos, ctl_want_t, node);
        kvp_ctl_want_info_t wi = {w->addr, w->link != NULL || ctl_has_link_to(ctl, w->addr),
                                  w->failures, w->last_error};
        cb(arg, &wi);
    }
}
