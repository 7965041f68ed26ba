/* gate.c -- the control plane's gate (issue 27, SPEC §9): what a connection
 * must pass before it costs the node more than a socket and a few hundred
 * bytes, and the identity rules at the end of the handshake.
 *
 * Pre-authentication: an inbound link in HELLO or AUTH has proven nothing.
 * Such links never count toward max_sessions (a flood of them cannot lock a
 * keyed peer out); they have their own caps instead: max_preauth_per_addr
 * from one source host (more are closed at accept), max_preauth in all (at
 * the cap the oldest link of the source holding the most goes, so one busy
 * source cannot push out a lone peer's handshake), and preauth_timeout (the
 * link's handshake timer runs that long until it authenticates).
 *
 * Identity: a peer's blob (its data-transport address, write access to its
 * region) that is byte for byte our own or a live link's of another peer id
 * is refused:
 * a reflected blob would make us write into our own or a neighbour's
 * memory. Peer ids that are not printable ASCII are refused at HELLO (they
 * reach logs and pages).
 *
 * Ownership: nothing is allocated here; the hashes live in the links. */
#include "ctl/ctl_int.h"

#include <sodium.h>
#include <stdio.h>
#include <string.h>

bool kvp__ctl_link_preauth(const kvp_link_t *l)
{
    return !l->outbound && (l->state == LINK_HELLO || l->state == LINK_AUTH);
}

/* The source host of "host:port" / "[v6]:port" (the port is not part of it). */
uint64_t kvp__ctl_gate_src_hash(const char *remote)
{
    const char *colon = strrchr(remote, ':');
    size_t n = colon ? (size_t)(colon - remote) : strlen(remote);
    return kvp_hash64(remote, n, 0x9a7e);
}

static uint32_t gate_count_src(const kvp_ctl_t *ctl, uint64_t h)
{
    uint32_t n = 0;
    const kvp_list_t *pos;
    for (pos = ctl->links.next; pos != &ctl->links; pos = pos->next) {
        const kvp_link_t *o = KVP_CONTAINER_OF(pos, kvp_link_t, node);
        n += kvp__ctl_link_preauth(o) && o->src_hash == h;
    }
    return n;
}

/* The oldest pre-auth link of the source with the most of them (ties: the
 * older link), and that source's count. O(n^2) in pre-auth links, which
 * max_preauth bounds (default 32). */
static kvp_link_t *gate_victim(const kvp_ctl_t *ctl, uint32_t *count)
{
    kvp_link_t *best = NULL;
    uint32_t best_n = 0;
    kvp_list_t *pos;
    for (pos = ctl->links.next; pos != &ctl->links; pos = pos->next) {
        kvp_link_t *o = KVP_CONTAINER_OF(pos, kvp_link_t, node);
        if (!kvp__ctl_link_preauth(o))
            continue;
        uint32_t n = gate_count_src(ctl, o->src_hash);
        if (n > best_n || (n == best_n && best && o->created_ns < best->created_ns))
            best = o, best_n = n;
    }
    *count = best_n;
    return best;
}

bool kvp__ctl_gate_admit(kvp_ctl_t *ctl, kvp_conn_t *c)
{
    uint64_t h = kvp__ctl_gate_src_hash(c->remote), now = kvp_loop_now(ctl->loop);
    uint32_t total = 0, mine = gate_count_src(ctl, h);
    kvp_list_t *pos;
    for (pos = ctl->links.next; pos != &ctl->links; pos = pos->next)
        total += kvp__ctl_link_preauth(KVP_CONTAINER_OF(pos, kvp_link_t, node));
    if (mine >= ctl->cfg.max_preauth_per_addr) {
        ctl->st.refused_preauth++;
        KVP_LOG_RL(&ctl->rl_gate, now, KVP_LOG_WARN, ctl->prefix,
                   "%s: %u connections from this address not yet authenticated "
                   "(max_preauth_per_addr): closed", c->remote, mine);
        return false;
    }
    if (total < ctl->cfg.max_preauth)
        return true;
    uint32_t heaviest = 0;
    kvp_link_t *v = gate_victim(ctl, &heaviest);
    if (v == NULL || heaviest <= mine + 1) { /* the newcomer's source is (about) the heaviest */
        ctl->st.refused_preauth++;
        KVP_LOG_RL(&ctl->rl_gate, now, KVP_LOG_WARN, ctl->prefix,
                   "%s: %u connections not yet authenticated (max_preauth): closed", c->remote, total);
        return false;
    }
    ctl->st.refused_preauth++;
    KVP_LOG_RL(&ctl->rl_gate, now, KVP_LOG_WARN, ctl->prefix,
               "%s: oldest of %u unauthenticated connections from this address closed "
               "(max_preauth %u reached)", v->conn ? v->conn->remote : "?", heaviest, ctl->cfg.max_preauth);
    kvp__ctl_link_down(v, KVP_DOWN_LIMIT, -1, true);
    return true;
}

size_t kvp__ctl_gate_sessions(const kvp_ctl_t *ctl, const kvp_link_t *l)
{
    size_t n = 0;
    const kvp_list_t *pos;
    for (pos = ctl->links.next; pos != &ctl->links; pos = pos->next) {
        const kvp_link_t *o = KVP_CONTAINER_OF(pos, kvp_link_t, node);
        n += o != l && (o->state == LINK_CHECK || o->state == LINK_ACKED ||
                        o->state == LINK_READY);
    }
    return n;
}

bool kvp__ctl_gate_blob_ok(kvp_link_t *l, const void *blob, size_t len)
{
    kvp_ctl_t *ctl = l->ctl;
    uint8_t h[32];
    const char *whose = NULL;
    crypto_generichash(h, sizeof(h), blob, len, NULL, 0);
    if (len == ctl->cfg.blob_len && len > 0 && !memcmp(blob, ctl->cfg.blob, len))
        whose = "our own";
    const kvp_list_t *pos;
    for (pos = ctl->links.next; whose == NULL && pos != &ctl->links; pos = pos->next) {
        const kvp_link_t *o = KVP_CONTAINER_OF(pos, kvp_link_t, node);
        /* the same peer id: a simultaneous dial or a restart, which the
         * identity rules settle (kvp__ctl_settle_identity) */
        if (o != l && o->peer_acked && strcmp(o->peer_id, l->peer_id) != 0 &&
            sodium_memcmp(o->blob_hash, h, sizeof(h)) == 0)
            whose = "another live session's";
    }
    if (whose == NULL) {
        memcpy(l->blob_hash, h, sizeof(h));
        return true;
    }
    CTL_LOG_REFUSED(l, KVP_LOG_ERROR, "peer %s (%s): its data-transport address is %s: refused",
                    l->peer_id, l->conn ? l->conn->remote : "?", whose);
    kvp__ctl_link_refuse(l, KVP_DOWN_DUPLICATE, KVP_BYE_DUPLICATE, &ctl->st.refused_identity);
    return false;
}

bool kvp__ctl_gate_id_ok(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
            return false;
    return true;
}
