/*
 * ring.c -- the node's event ring (kvpeer.h kvp_event_t): the owner thread
 * emits outcomes, engine threads take them (kvp_poll_events,
 * kvp_wait_events); bounded (KVP_EVENT_RING_MAX, the loss reported as one
 * KVP_EV_OVERFLOW) and announced on the event fd once per batch. Everything
 * here runs under the node's `lock`.
 */
#include "node/node.h"

#include <string.h>
#include <unistd.h>

/* The eventfd is readable while events wait: written once per batch, under
 * the lock so that ev_signalled is exact (kvp__node_take_events reads it
 * back, and only then: an empty poll makes no syscall). Not while a waiting
 * thread leads (ev_quiet): it takes the batch itself, and what it leaves is
 * signalled when its lead ends (node_lead), one round later at most. */
void kvp__node_ev_signal_locked(kvp_node_t *n)
{
    if (n->ev_signalled || n->ev_quiet || n->evfd < 0 || (n->ev_count == 0 && n->events_dropped == 0))
        return;
    uint64_t one = 1;
    ssize_t w = write(n->evfd, &one, sizeof(one));
    (void)w;
    n->ev_signalled = true;
}

void kvp__node_emit(kvp_node_t *n, const kvp_event_t *ev)
{
    pthread_mutex_lock(&n->lock);
    if (n->ev_count == KVP_EVENT_RING_MAX) { /* bounded: drop, counted, reported */
        uint64_t dropped = ++n->events_dropped;
        pthread_mutex_unlock(&n->lock);
        if (dropped == 1 || (dropped & 1023) == 0)
            KVP_ERROR(n->name,
                      "event ring full (%u undelivered events): event type %d dropped "
                      "(%llu so far); the embedding does not poll kvp_poll_events",
                      (unsigned)KVP_EVENT_RING_MAX, ev->type, (unsigned long long)dropped);
        return;
    }
    if (n->ev_count == n->ev_cap) {
        uint32_t cap = n->ev_cap ? KVP_MIN(n->ev_cap * 2, (uint32_t)KVP_EVENT_RING_MAX) : 64;
        kvp_event_t *ne = kvp__malloc(cap * sizeof(*ne));
        if (ne == NULL) {
            n->events_dropped++;
            pthread_mutex_unlock(&n->lock);
            KVP_ERROR(n->name, "event queue full and out of memory: event dropped");
            return;
        }
        for (uint32_t i = 0; i < n->ev_count; i++)
            ne[i] = n->events[(n->ev_head + i) % n->ev_cap];
        kvp__free(n->events);
        n->events = ne;
        n->ev_head = 0;
        n->ev_cap = cap;
    }
    n->events[(n->ev_head + n->ev_count) % n->ev_cap] = *ev;
    n->ev_count++;
    kvp__node_ev_signal_locked(n);
    pthread_mutex_unlock(&n->lock);
}

kvp_status_t kvp__node_take_events(kvp_node_t *n, kvp_event_t *out, uint32_t cap, uint32_t *n_out)
{
    uint32_t k = 0;
    pthread_mutex_lock(&n->lock);
    if (cap > 0 && n->events_dropped > 0) { /* the loss first: the caller must know */
        memset(&out[0], 0, sizeof(out[0]));
        out[0].type = KVP_EV_OVERFLOW;
        out[0].status = KVP_ERR_LIMIT;
        out[0].n_keys = (uint32_t)KVP_MIN(n->events_dropped, UINT32_MAX);
        n->events_dropped = 0;
        k = 1;
    }
    while (k < cap && n->ev_count > 0) {
        out[k++] = n->events[n->ev_head];
        n->ev_head = (n->ev_head + 1) % n->ev_cap;
        n->ev_count--;
    }
    if (n->ev_count == 0 && n->events_dropped == 0 && n->ev_signalled) { /* drained */
        uint64_t v;
        ssize_t r = read(n->evfd, &v, sizeof(v)); /* no longer readable */
        (void)r;
        n->ev_signalled = false;
    }
    pthread_mutex_unlock(&n->lock);
    *n_out = k;
    return KVP_OK;
}
