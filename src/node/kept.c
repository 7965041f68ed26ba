/*
 * kept.c -- the peers the embedding configured (kvp_peer_add), remembered
 * across an idle close (doors2). The ctl's want dials and redials a peer;
 * an idle close (hold.c) drops the want so that the node stops talking to
 * a peer it has nothing for. A peer added with kvp_peer_add stays kept
 * then, "dormant": not dialled, but the next lookup or fetch to it wakes it
 * -- wanted again, dialled now -- and waits for its handshake within the
 * bound of a lookup right after kvp_peer_add (api.c, remote_exec) instead
 * of answering UNREACHABLE. Peers that only dialled in, or that a remote
 * call alone wanted, are not kept (forgotten at idle close, as before);
 * kvp_peer_remove and kvp_peer_forget (a DNS address that vanished) drop a
 * kept peer.
 *
 * Bounded by max_wanted_peers: kvp_peer_add counts the dormant peers with
 * the ctl's wants (a kept peer is one or the other) and, at the cap,
 * forgets the oldest dormant peer before it refuses (kvp__node_kept_evict),
 * so an admin caller cannot grow this list past the cap by letting peers
 * go idle. A kept peer's address is matched against the session's peer id:
 * a peer added by a host name (not its "ip:port" id) is not matched at the
 * idle close (its want is not dropped there either, as before).
 */
#include "node/node.h"

#include <stdio.h>
#include <string.h>

typedef struct kept_peer {
    kvp_list_t link;
    char addr[KVP_WIRE_STR_MAX + 1];
    bool dormant;        /* idle-closed: not wanted by the ctl until woken */
    uint64_t waking_ns;  /* woken: remote calls wait for its session until then */
} kept_peer_t;

static kept_peer_t *kept_find(kvp_node_t *n, const char *addr)
{
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &n->kept)
    {
        kept_peer_t *k = KVP_CONTAINER_OF(p, kept_peer_t, link);
        if (strcmp(k->addr, addr) == 0)
            return k;
    }
    return NULL;
}

kvp_status_t kvp__node_kept_add(kvp_node_t *n, const char *addr)
{
    kept_peer_t *k = kept_find(n, addr);
    if (k != NULL) { /* added again while dormant: wanted now */
        if (k->dormant)
            n->n_dormant--;
        k->dormant = false;
        return KVP_OK;
    }
    if ((k = kvp__calloc(1, sizeof(*k))) == NULL)
        return KVP_ERR_NOMEM;
    snprintf(k->addr, sizeof(k->addr), "%s", addr);
    kvp_list_insert_tail(&n->kept, &k->link);
    return KVP_OK;
}

static void kept_free(kvp_node_t *n, kept_peer_t *k)
{
    if (k->dormant)
        n->n_dormant--;
    kvp_list_remove(&k->link);
    kvp__free(k);
}

bool kvp__node_kept_drop(kvp_node_t *n, const char *addr)
{
    kept_peer_t *k = kept_find(n, addr);
    if (k == NULL)
        return false;
    kept_free(n, k);
    return true;
}

bool kvp__node_kept_dormant(kvp_node_t *n, const char *addr)
{
    kept_peer_t *k = kept_find(n, addr);
    return k != NULL && k->dormant;
}

bool kvp__node_kept_sleep(kvp_node_t *n, const char *addr)
{
    kept_peer_t *k = kept_find(n, addr);
    if (k == NULL)
        return false;
    if (!k->dormant)
        n->n_dormant++;
    k->dormant = true;
    k->waking_ns = 0;
    return true;
}

bool kvp__node_kept_wake(kvp_node_t *n, const char *addr, uint64_t now, uint64_t wait_ns)
{
    kept_peer_t *k = kept_find(n, addr);
    if (k == NULL)
        return false;
    if (k->dormant) {
        k->dormant = false;
        n->n_dormant--;
        k->waking_ns = now + wait_ns;
    }
    return now < k->waking_ns;
}

bool kvp__node_kept_evict(kvp_node_t *n)
{
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &n->kept)
    {
        kept_peer_t *k = KVP_CONTAINER_OF(p, kept_peer_t, link);
        if (k->dormant) {
            kept_free(n, k);
            return true;
        }
    }
    return false;
}

void kvp__node_kept_foreach(kvp_node_t *n, void (*cb)(void *arg, const char *addr), void *arg)
{
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &n->kept)
    {
        kept_peer_t *k = KVP_CONTAINER_OF(p, kept_peer_t, link);
        if (k->dormant)
            cb(arg, k->addr);
    }
}

void kvp__node_kept_free(kvp_node_t *n)
{
    while (!kvp_list_empty(&n->kept))
        kept_free(n, KVP_CONTAINER_OF(n->kept.next, kept_peer_t, link));
}
