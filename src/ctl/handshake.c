/* handshake.c -- the handshake of SPEC §4 for one link: HELLO (validated
 * field by field), AUTH (HMAC-SHA256 over both epochs, both nonces and the
 * sender's layout), the identity check that settles restart claims and
 * simultaneous dials, then HELLO_ACK with our blob. Our blob leaves only from
 * link_send_ack(), which runs only from link_check() on a link in CHECK,
 * i.e. after validation and authentication. */
#include "ctl/ctl_int.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

static void link_check(kvp_link_t *l);

/* ------------------------------------------------------------- handshake */

void ctl_hs_send_hello(kvp_link_t *l)
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
    ctl_link_send_ctl(l, &m);
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


static void link_send_auth(kvp_link_t *l)
{
    kvp_ctl_t *ctl = l->ctl;
    kvp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = KVP_MSG_AUTH;
    link_mac(ctl, &l->local_epoch, &l->remote_epoch, l->nonce, l->peer.nonce, ctl->cfg.num_blocks,
             ctl->cfg.block_size, m.u.auth.mac);
    ctl_link_send_ctl(l, &m);
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
        CTL_LOG_REFUSED(l, KVP_LOG_ERROR, "peer %s: incompatible %s: refused", h->peer_id, why);
        ctl_link_refuse(l, KVP_DOWN_INCOMPATIBLE, KVP_BYE_INCOMPATIBLE, &ctl->st.refused_incompatible);
        return false;
    }
    bool ours = ctl->cfg.psk_len > 0, theirs = (h->flags & KVP_HELLO_AUTH_REQUIRED) != 0;
    if (ours != theirs) {
        CTL_LOG_REFUSED(l, KVP_LOG_ERROR, "peer %s: authentication mismatch (%s pre-shared key, peer %s): "
                  "refused", h->peer_id, ours ? "we have a" : "we have no",
                  theirs ? "requires one" : "has none");
        ctl_link_refuse(l, KVP_DOWN_AUTH, KVP_BYE_AUTH, &ctl->st.refused_auth);
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

void ctl_hs_on_hello(kvp_link_t *l, const kvp_msg_hello_t *h)
{
    kvp_ctl_t *ctl = l->ctl;
    if (l->have_peer || l->state != LINK_HELLO) {
        ctl_link_protocol_error(l, "unexpected HELLO");
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
        CTL_LOG_REFUSED(l, KVP_LOG_ERROR, "peer %s: claims our own peer id: refused", h->peer_id);
        ctl_link_refuse(l, KVP_DOWN_DUPLICATE, KVP_BYE_DUPLICATE, &ctl->st.refused_duplicate);
        return;
    }
    if (ctl_count_sessions(ctl) > ctl->cfg.max_sessions) {
        KVP_LOG_RL(&ctl->rl_limit, ctl_link_now(l), KVP_LOG_WARN, ctl->prefix,
                   "peer %s: session refused: max_sessions (%u) reached", h->peer_id,
                   ctl->cfg.max_sessions);
        ctl_link_refuse(l, KVP_DOWN_LIMIT, KVP_BYE_LIMIT, &ctl->st.refused_limit);
        return;
    }
    if (ctl->cfg.psk_len) {
        ctl_link_set_state(l, LINK_AUTH);
        link_send_auth(l);
        return;
    }
    ctl_link_set_state(l, LINK_CHECK);
    link_check(l);
}

void ctl_hs_on_auth(kvp_link_t *l, const kvp_msg_auth_t *a)
{
    kvp_ctl_t *ctl = l->ctl;
    if (l->state != LINK_AUTH) {
        if (!ctl->cfg.psk_len) {
            CTL_LOG_REFUSED(l, KVP_LOG_ERROR, "peer %s: sent AUTH but we have no key: refused", l->peer_id);
            ctl_link_refuse(l, KVP_DOWN_AUTH, KVP_BYE_AUTH, &ctl->st.refused_auth);
        } else {
            ctl_link_protocol_error(l, "unexpected AUTH");
        }
        return;
    }
    uint8_t want[KVP_WIRE_MAC_LEN];
    link_mac(ctl, &l->remote_epoch, &l->local_epoch, l->peer.nonce, l->nonce, l->peer.num_blocks,
             l->peer.block_size, want);
    if (crypto_verify_32(want, a->mac) != 0) {
        CTL_LOG_REFUSED(l, KVP_LOG_ERROR, "peer %s: authentication failed (wrong key): refused",
                  l->peer_id);
        ctl_link_refuse(l, KVP_DOWN_AUTH, KVP_BYE_AUTH, &ctl->st.refused_auth);
        return;
    }
    ctl_link_set_state(l, LINK_CHECK);
    link_check(l);
}


void ctl_hs_on_ack(kvp_link_t *l, const kvp_msg_hello_ack_t *a)
{
    kvp_ctl_t *ctl = l->ctl;
    if (l->state == LINK_AUTH) {
        CTL_LOG_REFUSED(l, KVP_LOG_ERROR, "peer %s: HELLO_ACK without AUTH: refused", l->peer_id);
        ctl_link_refuse(l, KVP_DOWN_AUTH, KVP_BYE_AUTH, &ctl->st.refused_auth);
        return;
    }
    if ((l->state != LINK_CHECK && l->state != LINK_ACKED) || l->peer_acked) {
        ctl_link_protocol_error(l, "unexpected HELLO_ACK");
        return;
    }
    if (!kvp_epoch_eq(&a->acked_epoch, &l->local_epoch)) {
        ctl_link_protocol_error(l, "HELLO_ACK acknowledges another epoch");
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
        ctl_link_become_ready(l);
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
    ctl_link_set_state(l, LINK_ACKED);
    ctl->st.blobs_out++;
    ctl_link_send_ctl(l, &m);
    if (l->state == LINK_ACKED && l->peer_acked)
        ctl_link_become_ready(l);
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
        KVP_WARN(ctl->prefix, "peer %s: new connection claims a live session: refused as duplicate",
                 l->peer_id);
        ctl_link_refuse(l, KVP_DOWN_DUPLICATE, KVP_BYE_DUPLICATE, &ctl->st.refused_duplicate);
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

void ctl_hs_on_check(kvp_timer_t *t)
{
    kvp_link_t *l = t->data;
    if (l->state == LINK_CHECK)
        link_check(l);
}

/* A HELLO of another wire major version does not decode (its layout may
 * differ), yet it deserves a clear refusal, not a protocol error: read the
 * fields every version shares (u16 major, u16 minor, str peer_id, str
 * instance_id, epoch) by hand and answer BYE INCOMPATIBLE. */
bool ctl_hs_refuse_version(kvp_link_t *l, const uint8_t *f, size_t len)
{
    kvp_ctl_t *ctl = l->ctl;
    size_t off = KVP_WIRE_HDR_LEN;
    if ((f[4] | f[5] << 8) != KVP_MSG_HELLO || l->have_peer || len < off + 5)
        return false;
    unsigned major = (unsigned)(f[off] | f[off + 1] << 8);
    if (major == KVP_WIRE_MAJOR)
        return false;
    off += 4;
    size_t id_len = f[off];
    if (off + 1 + id_len + 1 > len)
        return false;
    char id[KVP_WIRE_STR_MAX + 1];
    memcpy(id, f + off + 1, id_len);
    id[id_len] = '\0';
    off += 1 + id_len;
    off += 1 + f[off]; /* instance id */
    if (off + KVP_WIRE_EPOCH_LEN > len)
        return false;
    memcpy(l->remote_epoch.b, f + off, KVP_WIRE_EPOCH_LEN);
    snprintf(l->peer_id, sizeof(l->peer_id), "%s", id);
    l->have_peer = !kvp_epoch_is_zero(&l->remote_epoch); /* lets the BYE carry epochs */
    CTL_LOG_REFUSED(l, KVP_LOG_ERROR, "peer %s: incompatible wire major version (ours %u, theirs %u): refused",
              id, KVP_WIRE_MAJOR, major);
    ctl_link_refuse(l, KVP_DOWN_INCOMPATIBLE, KVP_BYE_INCOMPATIBLE, &ctl->st.refused_incompatible);
    return true;
}

