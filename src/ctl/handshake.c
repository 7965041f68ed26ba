/* handshake.c -- the handshake of SPEC §4 for one link: HELLO (validated
 * field by field), AUTH (HMAC-SHA256 over both epochs, both nonces and the
 * sender's layout), then -- once ctl.c has settled the peer's identity
 * (restart claims, simultaneous dials) -- HELLO_ACK with our blob. Our blob
 * leaves only from kvp__ctl_hs_send_ack(), which runs only from
 * kvp__ctl_settle_identity() on a link in CHECK, i.e. after validation and
 * authentication. */
#include "ctl/ctl_int.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------- handshake */

void kvp__ctl_hs_send_hello(kvp_link_t *l)
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
    kvp__ctl_link_send_ctl(l, &m);
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
    kvp__ctl_link_send_ctl(l, &m);
}

/* Returns false (and refuses the peer, naming the field and both values) when
 * the peer's HELLO is not compatible with ours. */
static bool link_validate(kvp_link_t *l, const kvp_msg_hello_t *h)
{
    kvp_ctl_t *ctl = l->ctl;
    char why[224];
    why[0] = '\0';
    if (h->major != KVP_WIRE_MAJOR)
        snprintf(why, sizeof(why), "wire major version (ours %u, theirs %u)", KVP_WIRE_MAJOR,
                 h->major);
    else if (h->block_size != ctl->cfg.block_size)
        snprintf(why, sizeof(why), "block_size (ours %u, theirs %u)", ctl->cfg.block_size,
                 h->block_size);
    else if (h->fingerprint != ctl->cfg.fingerprint && h->minor >= 1) {
        /* Both sides see the mismatch; each sends its string in its BYE and
         * waits for the other's, so both logs name both strings. */
        ctl->st.refused_incompatible++;
        l->compat_wait = true;
        kvp__ctl_link_send_bye_compat(l);
        return false;
    } else if (h->fingerprint != ctl->cfg.fingerprint)
        snprintf(why, sizeof(why), "compat string: ours '%s' (fingerprint %016llx), theirs "
                 "fingerprint %016llx (wire minor %u sends no string)", ctl->compat,
                 (unsigned long long)ctl->cfg.fingerprint, (unsigned long long)h->fingerprint,
                 h->minor);
    else if (h->hash_seed != ctl->cfg.hash_seed)
        snprintf(why, sizeof(why), "hash seed (ours %016llx, theirs %016llx)",
                 (unsigned long long)ctl->cfg.hash_seed, (unsigned long long)h->hash_seed);
    else if (h->num_blocks == 0)
        snprintf(why, sizeof(why), "num_blocks (theirs 0)");
    if (why[0]) {
        CTL_LOG_REFUSED(l, KVP_LOG_ERROR, "peer %s: incompatible %s: refused", h->peer_id, why);
        kvp__ctl_link_refuse(l, KVP_DOWN_INCOMPATIBLE, KVP_BYE_INCOMPATIBLE,
                             &ctl->st.refused_incompatible);
        return false;
    }
    bool ours = ctl->cfg.psk_len > 0, theirs = (h->flags & KVP_HELLO_AUTH_REQUIRED) != 0;
    if (ours != theirs) {
        CTL_LOG_REFUSED(l, KVP_LOG_ERROR, "peer %s: authentication mismatch (%s pre-shared key, peer %s): "
                  "refused", h->peer_id, ours ? "we have a" : "we have no",
                  theirs ? "requires one" : "has none");
        kvp__ctl_link_refuse(l, KVP_DOWN_AUTH, KVP_BYE_AUTH, &ctl->st.refused_auth);
        return false;
    }
    return true;
}

void kvp__ctl_hs_compat_refused(kvp_link_t *l)
{
    kvp_ctl_t *ctl = l->ctl;
    l->compat_wait = false;
    if (l->peer_compat[0])
        CTL_LOG_REFUSED(l, KVP_LOG_ERROR, "peer %s: compat mismatch: ours '%s', peer's '%s' "
                        "(fingerprints %016llx, %016llx): refused", l->peer_id, ctl->compat,
                        l->peer_compat, (unsigned long long)ctl->cfg.fingerprint,
                        (unsigned long long)l->peer.fingerprint);
    else
        CTL_LOG_REFUSED(l, KVP_LOG_ERROR, "peer %s: compat mismatch: ours '%s' (fingerprint "
                        "%016llx), peer's fingerprint %016llx (its string did not arrive): "
                        "refused", l->peer_id, ctl->compat,
                        (unsigned long long)ctl->cfg.fingerprint,
                        (unsigned long long)l->peer.fingerprint);
    kvp__ctl_link_down(l, KVP_DOWN_INCOMPATIBLE, -1, true);
}

/* The peer proved what it had to (a valid HELLO, and with a psk a verified
 * AUTH): only now does it count toward max_sessions (issue 27: links that
 * have not authenticated have their own caps, gate.c), its handshake gets
 * the full handshake timeout instead of the pre-auth deadline, and its
 * identity is settled. */
static void hs_authenticated(kvp_link_t *l)
{
    kvp_ctl_t *ctl = l->ctl;
    if (kvp__ctl_gate_sessions(ctl, l) >= ctl->cfg.max_sessions) {
        KVP_LOG_RL(&ctl->rl_limit, ctl_link_now(l), KVP_LOG_WARN, ctl->prefix,
                   "peer %s: session refused: max_sessions (%u) reached", l->peer_id,
                   ctl->cfg.max_sessions);
        kvp__ctl_link_refuse(l, KVP_DOWN_LIMIT, KVP_BYE_LIMIT, &ctl->st.refused_limit);
        return;
    }
    kvp__ctl_link_set_state(l, LINK_CHECK);
    if (!l->outbound)
        kvp_timer_start(ctl->loop, &l->t_handshake, l->created_ns + ctl->cfg.handshake_timeout_ns);
    kvp__ctl_settle_identity(l);
}

void kvp__ctl_hs_on_hello(kvp_link_t *l, const kvp_msg_hello_t *h)
{
    kvp_ctl_t *ctl = l->ctl;
    if (l->have_peer || l->state != LINK_HELLO) {
        kvp__ctl_link_protocol_error(l, "unexpected HELLO");
        return;
    }
    l->peer = *h;
    l->have_peer = true;
    l->remote_epoch = h->epoch;
    snprintf(l->peer_id, sizeof(l->peer_id), "%s", h->peer_id);
    l->wctx.peer_num_blocks = h->num_blocks;
    if (!kvp__ctl_gate_id_ok(h->peer_id) || !kvp__ctl_gate_id_ok(h->instance_id)) {
        /* Logged as sent: every library log line is escaped (kvp_escape). */
        CTL_LOG_REFUSED(l, KVP_LOG_ERROR, "peer %s (%s): peer or instance id not printable ASCII: "
                        "refused", h->peer_id, l->conn ? l->conn->remote : "?");
        kvp__ctl_link_refuse(l, KVP_DOWN_PROTOCOL, KVP_BYE_PROTOCOL, &ctl->st.refused_identity);
        return;
    }
    if (!link_validate(l, h))
        return;
    if (!strcmp(h->peer_id, ctl->peer_id)) {
        CTL_LOG_REFUSED(l, KVP_LOG_ERROR, "peer %s: claims our own peer id: refused", h->peer_id);
        kvp__ctl_link_refuse(l, KVP_DOWN_DUPLICATE, KVP_BYE_DUPLICATE, &ctl->st.refused_duplicate);
        return;
    }
    if (ctl->cfg.psk_len) {
        kvp__ctl_link_set_state(l, LINK_AUTH);
        link_send_auth(l);
        return;
    }
    hs_authenticated(l);
}

void kvp__ctl_hs_on_auth(kvp_link_t *l, const kvp_msg_auth_t *a)
{
    kvp_ctl_t *ctl = l->ctl;
    if (l->state != LINK_AUTH) {
        if (!ctl->cfg.psk_len) {
            CTL_LOG_REFUSED(l, KVP_LOG_ERROR, "peer %s: sent AUTH but we have no key: refused", l->peer_id);
            kvp__ctl_link_refuse(l, KVP_DOWN_AUTH, KVP_BYE_AUTH, &ctl->st.refused_auth);
        } else {
            kvp__ctl_link_protocol_error(l, "unexpected AUTH");
        }
        return;
    }
    uint8_t want[KVP_WIRE_MAC_LEN];
    link_mac(ctl, &l->remote_epoch, &l->local_epoch, l->peer.nonce, l->nonce, l->peer.num_blocks,
             l->peer.block_size, want);
    if (crypto_verify_32(want, a->mac) != 0) {
        CTL_LOG_REFUSED(l, KVP_LOG_ERROR, "peer %s: authentication failed (wrong key): refused",
                  l->peer_id);
        kvp__ctl_link_refuse(l, KVP_DOWN_AUTH, KVP_BYE_AUTH, &ctl->st.refused_auth);
        return;
    }
    hs_authenticated(l);
}


void kvp__ctl_hs_on_ack(kvp_link_t *l, const kvp_msg_hello_ack_t *a)
{
    kvp_ctl_t *ctl = l->ctl;
    if (l->state == LINK_AUTH) {
        CTL_LOG_REFUSED(l, KVP_LOG_ERROR, "peer %s: HELLO_ACK without AUTH: refused", l->peer_id);
        kvp__ctl_link_refuse(l, KVP_DOWN_AUTH, KVP_BYE_AUTH, &ctl->st.refused_auth);
        return;
    }
    if ((l->state != LINK_CHECK && l->state != LINK_ACKED) || l->peer_acked) {
        kvp__ctl_link_protocol_error(l, "unexpected HELLO_ACK");
        return;
    }
    if (!kvp_epoch_eq(&a->acked_epoch, &l->local_epoch)) {
        kvp__ctl_link_protocol_error(l, "HELLO_ACK acknowledges another epoch");
        return;
    }
    if (!kvp__ctl_gate_blob_ok(l, a->blob, a->blob_len))
        return; /* our own or another live link's address: refused */
    l->peer_blob = kvp__malloc(a->blob_len ? a->blob_len : 1);
    if (!l->peer_blob) {
        kvp__ctl_link_down(l, KVP_DOWN_LOCAL_CLOSE, KVP_BYE_PROTOCOL, true);
        return;
    }
    memcpy(l->peer_blob, a->blob, a->blob_len);
    l->peer_blob_len = a->blob_len;
    l->peer_acked = true;
    ctl->st.blobs_in++;
    if (l->state == LINK_ACKED)
        kvp__ctl_link_become_ready(l);
}

/* Our blob leaves only from here, called only by kvp__ctl_settle_identity() on a
 * link in CHECK, i.e. after validation and authentication. */
void kvp__ctl_hs_send_ack(kvp_link_t *l)
{
    kvp_ctl_t *ctl = l->ctl;
    kvp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = KVP_MSG_HELLO_ACK;
    m.u.hello_ack.acked_epoch = l->remote_epoch;
    m.u.hello_ack.blob = ctl->cfg.blob;
    m.u.hello_ack.blob_len = (uint32_t)ctl->cfg.blob_len;
    kvp__ctl_link_set_state(l, LINK_ACKED);
    ctl->st.blobs_out++;
    kvp__ctl_link_send_ctl(l, &m);
    if (l->state == LINK_ACKED && l->peer_acked)
        kvp__ctl_link_become_ready(l);
}

/* A HELLO of another wire major version does not decode (its layout may
 * differ), yet it deserves a clear refusal, not a protocol error: the wire
 * layer reads the fields every version shares, we answer BYE INCOMPATIBLE. */
bool kvp__ctl_hs_refuse_version(kvp_link_t *l, const uint8_t *f, size_t len)
{
    kvp_ctl_t *ctl = l->ctl;
    kvp_wire_hello_id_t id;
    if (l->have_peer || kvp_wire_peek_hello(f, len, &id) != KVP_OK || id.major == KVP_WIRE_MAJOR)
        return false;
    l->remote_epoch = id.epoch;
    snprintf(l->peer_id, sizeof(l->peer_id), "%s", id.peer_id);
    l->have_peer = !kvp_epoch_is_zero(&l->remote_epoch); /* lets the BYE carry epochs */
    CTL_LOG_REFUSED(l, KVP_LOG_ERROR, "peer %s: incompatible wire major version (ours %u, theirs %u): refused",
              id.peer_id, KVP_WIRE_MAJOR, id.major);
    kvp__ctl_link_refuse(l, KVP_DOWN_INCOMPATIBLE, KVP_BYE_INCOMPATIBLE,
                         &ctl->st.refused_incompatible);
    return true;
}

