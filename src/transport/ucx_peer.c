/*
 * ucx_peer.c -- the UCX backend's peer table: finding a peer (live, or
 * removed and still closing) and what the node may ask of one (status,
 * path, same host, proven, lanes). Nothing here changes a peer; its life
 * (add, close, reap) is in ucx.c.
 */
#include "transport/ucx_int.h"

#include <stdio.h>

ucx_peer_t *kvp__ucx_peer_find(ucx_xport_t *x, kvp_xpeer_id_t id)
{
    kvp_list_t *pos, *tmp;

    kvp_list_foreach_safe(pos, tmp, &x->peers)
    {
        ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
        if (p->id == id)
            return p;
    }
    return NULL;
}

/* Live, removed or closing: the peer a late UCX callback may still name. */
ucx_peer_t *kvp__ucx_peer_find_any(ucx_xport_t *x, kvp_xpeer_id_t id)
{
    kvp_list_t *lists[3] = {&x->peers, &x->zombies, &x->closing}, *pos, *tmp;

    for (int k = 0; k < 3; k++)
        kvp_list_foreach_safe(pos, tmp, lists[k])
        {
            ucx_peer_t *p = KVP_CONTAINER_OF(pos, ucx_peer_t, link);
            if (p->id == id)
                return p;
        }
    return NULL;
}

kvp_status_t kvp__ucx_peer_status(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    ucx_peer_t *p = kvp__ucx_peer_find(ucx_of(xp), peer);

    return p ? p->status : KVP_ERR_NOT_FOUND;
}

kvp_data_path_t kvp__ucx_peer_path(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    ucx_peer_t *p = kvp__ucx_peer_find(ucx_of(xp), peer);

    return p ? p->path : KVP_PATH_UNKNOWN;
}

bool kvp_ucx_peer_same_host(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    ucx_peer_t *p = kvp__ucx_peer_find(ucx_of(xp), peer);

    return p && p->same_host;
}

bool kvp_ucx_peer_proven(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    ucx_peer_t *p = kvp__ucx_peer_find(ucx_of(xp), peer);

    return p && kvp__ucx_peer_proven(ucx_of(xp), p);
}

kvp_status_t kvp_ucx_peer_lanes(kvp_xport_t *xp, kvp_xpeer_id_t peer, char *buf, size_t cap)
{
    ucx_peer_t *p = kvp__ucx_peer_find(ucx_of(xp), peer);

    if (!p)
        return KVP_ERR_NOT_FOUND;
    if (cap)
        snprintf(buf, cap, "%s", p->lanes);
    return KVP_OK;
}

kvp_data_path_t kvp_ucx_peer_inbound_path(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    ucx_xport_t *x = ucx_of(xp);
    ucx_peer_t *p = kvp__ucx_peer_find(x, peer);

    if (p && p->inbound != KVP_PATH_DIRECT_SHM && x->region_kind == REGION_UCX &&
        kvp__ucx_peer_proven(x, p))
        return KVP_PATH_DIRECT_SHM; /* it shares our memory, whatever its host id says */
    if (p && p->inbound != KVP_PATH_DIRECT_CMA && x->cma_in && p->cma_src &&
        kvp__ucx_peer_proven(x, p))
        return KVP_PATH_DIRECT_CMA; /* issue 29 item 4: it may write us by process_vm_writev */
    return p ? p->inbound : KVP_PATH_UNKNOWN;
}

bool kvp_ucx_region_ucx_allocated(kvp_xport_t *xp)
{
    return ucx_of(xp)->region_kind == REGION_UCX;
}
