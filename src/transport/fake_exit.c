/*
 * fake_exit.c -- the fake's model of a source process whose exit is proof
 * (issue 27 item 8; the UCX backend's is ucx_pidfd.c).
 *
 * A fake transport is one node's process: while it is open its scripted
 * copies land whatever its caller did (a WRITE cannot be recalled); once it
 * is closed (the node destroyed: the process gone) none of its copies lands
 * any more (free_all drops them). So a consumer may treat "the source's
 * transport is closed" as its process's exit, and only that.
 *
 * Which peers: those on KVP_PATH_FAKE_UNFENCEABLE (the model of direct
 * shared memory, where only the exit can be proof), unless the consumer's
 * watch is switched off (kvp_fake_set_exit_watch: a peer in another network
 * namespace or of another user, which the UCX backend cannot watch). A watch
 * is a record {our peer handle, the source's fabric endpoint, holders}: it
 * outlives the peer record while a quarantined load holds it.
 *
 * Mutation KVP_MUT_EXIT_PROOF_ALIVE (test builds): exit_proven says yes
 * while the source still runs (the bug: a proof without checking the
 * process); the simulator and test_node_exit show late copies landing in
 * released slots.
 */
#include "transport/fake_int.h"

typedef struct fake_exitw {
    kvp_list_t link; /* fake_xport_t.exitw */
    kvp_xpeer_id_t peer;
    uint32_t remote_ep;
    uint32_t holds;
} fake_exitw_t;

static fake_exitw_t *exitw_find(fake_xport_t *x, kvp_xpeer_id_t peer)
{
    kvp_list_t *pos, *tmp;
    kvp_list_foreach_safe(pos, tmp, &x->exitw)
    {
        fake_exitw_t *w = KVP_CONTAINER_OF(pos, fake_exitw_t, link);
        if (w->peer == peer)
            return w;
    }
    return NULL;
}

bool fake__exit_hold(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    fake_xport_t *x = fake__x(xp);
    bool ok = false;
    pthread_mutex_lock(&x->fab->mu);
    fake_exitw_t *w = exitw_find(x, peer);
    fake_peer_t *p = w ? NULL : fake__peer_any(x, peer);
    if (w == NULL && p != NULL && !x->exit_watch_off && p->path == KVP_PATH_FAKE_UNFENCEABLE &&
        (w = kvp__calloc(1, sizeof(*w))) != NULL) {
        w->peer = peer;
        w->remote_ep = p->remote_ep;
        kvp_list_insert_tail(&x->exitw, &w->link);
    }
    if (w != NULL) {
        w->holds++;
        ok = true;
    }
    pthread_mutex_unlock(&x->fab->mu);
    return ok;
}

void fake__exit_drop(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    fake_xport_t *x = fake__x(xp);
    pthread_mutex_lock(&x->fab->mu);
    fake_exitw_t *w = exitw_find(x, peer);
    KVP_ASSERT(w != NULL && w->holds > 0); /* dropped only by a holder */
    if (--w->holds == 0) {
        kvp_list_remove(&w->link);
        kvp__free(w);
    }
    pthread_mutex_unlock(&x->fab->mu);
}

bool fake__exit_proven(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    fake_xport_t *x = fake__x(xp);
    pthread_mutex_lock(&x->fab->mu);
    fake_exitw_t *w = exitw_find(x, peer);
    bool gone = w != NULL && fake__fabric_ep(x->fab, w->remote_ep) == NULL;
    if (w != NULL && KVP_MUTATED(KVP_MUT_EXIT_PROOF_ALIVE))
        gone = true; /* test-only mutation: no look at the process */
    pthread_mutex_unlock(&x->fab->mu);
    return gone;
}

/* At close: every watch goes (the node dropped its holders first). */
void fake__exit_free_all(fake_xport_t *x)
{
    while (!kvp_list_empty(&x->exitw)) {
        fake_exitw_t *w = KVP_CONTAINER_OF(x->exitw.next, fake_exitw_t, link);
        kvp_list_remove(&w->link);
        kvp__free(w);
    }
}

void kvp_fake_set_exit_watch(kvp_xport_t *xp, bool on)
{
    KVP_ASSERT(kvp_xport_is_fake(xp));
    fake_xport_t *x = fake__x(xp);
    pthread_mutex_lock(&x->fab->mu);
    x->exit_watch_off = !on;
    pthread_mutex_unlock(&x->fab->mu);
}
