/* conn_fake.c -- the fake in-memory network: many ctls in one process,
 * addresses are plain strings, every write becomes a chunk delivered in order
 * to the other end after latency_ns on the receiving loop's clock. Partitions
 * hold chunks (and connects) until healed; kill resets every connection of an
 * address (EOF to both ends). Deterministic: delivery is driven by timers on
 * the loop, which fire in deadline-then-arm order.
 *
 * Ownership: the net owns its listeners' registry and the partition list;
 * each end (fake_end_t) is owned by whoever holds its kvp_conn_t and is freed
 * by its own event timer after close(); chunks are owned by the end they are
 * queued to. The net must outlive every ctl that uses it. */
#include "ctl/conn.h"

#include <stdio.h>
#include <string.h>

typedef enum fake_state {
    FAKE_CONNECTING, /* dial pending: resolved by the event timer after latency */
    FAKE_OPEN,
    FAKE_EOF,  /* the other end went away: deliver what is queued, then closed() */
    FAKE_DEAD, /* detached (or reported): freed by the event timer */
} fake_state_t;

typedef struct fake_chunk {
    kvp_list_t node;
    uint64_t at;
    size_t len, off;
    uint8_t data[];
} fake_chunk_t;

typedef struct fake_end fake_end_t;
struct fake_end {
    kvp_conn_t base;
    kvp_fake_net_t *net;
    kvp_list_t net_node;
    fake_end_t *peer;
    kvp_list_t inq; /* chunks on their way to this end */
    size_t inq_bytes;
    uint64_t seq;         /* creation order: the order of net->ends */
    kvp_list_t busy_node; /* on net->busy while inq holds a chunk */
    fake_state_t state;
    bool reported; /* closed() was delivered to the owner */
    kvp_timer_t ev;
    /* Whether a partition cuts this end's pair, as of the net's cuts_gen
     * (the pair never changes; the cut list is scanned once per change). */
    uint64_t cut_gen;
    bool cut;
    /* A dial found its pair cut: the SYN is held until the heal re-arms it
     * (at the heal's time + latency + 1, as its retry would have come). */
    bool syn_held;
    char local[KVP_WIRE_STR_MAX + 1];
};

typedef struct fake_listener {
    kvp_listener_t base;
    kvp_fake_net_t *net;
    kvp_loop_t *loop;
    size_t wbuf_max;
    kvp_list_t node;
} fake_listener_t;

/* The one writer of an end's state (as tcp_set_state in conn_tcp.c): a
 * new end starts CONNECTING (a dial stays there); any state may die. */
static const char *const fake_state_names[] = {
    [FAKE_CONNECTING] = "connecting", [FAKE_OPEN] = "open", [FAKE_EOF] = "eof", [FAKE_DEAD] = "dead"};

static void fake_set_state(fake_end_t *e, fake_state_t to)
{
    static const uint8_t legal[] = {
        [FAKE_CONNECTING] = 1u << FAKE_CONNECTING,
        [FAKE_OPEN] = 1u << FAKE_CONNECTING,
        [FAKE_EOF] = (1u << FAKE_CONNECTING) | (1u << FAKE_OPEN),
        [FAKE_DEAD] = 0xf,
    };
    if (!(legal[to] & (1u << e->state)))
        kvp__assert_fail(fake_state_names[to], __FILE__, __LINE__, fake_state_names[e->state]);
    e->state = to;
}

typedef struct fake_cut {
    kvp_list_t node;
    char a[KVP_WIRE_STR_MAX + 1], b[KVP_WIRE_STR_MAX + 1];
} fake_cut_t;

struct kvp_fake_net {
    uint64_t latency_ns;
    kvp_list_t listeners, ends, cuts;
    /* The ends with chunks queued, in creation order (a sublist of ends in
     * the same order): kvp_fake_net_deliver visits only them. */
    kvp_list_t busy;
    uint64_t end_seq;
    uint64_t cuts_gen; /* bumped by every change of `cuts`; never 0 */
    uint64_t delivered;
};

static const kvp_conn_ops_t fake_ops;

kvp_status_t kvp_fake_net_create(uint64_t latency_ns, kvp_fake_net_t **out)
{
    kvp_fake_net_t *n = kvp__calloc(1, sizeof(*n));
    if (!n)
        return KVP_ERR_NOMEM;
    n->latency_ns = latency_ns;
    n->cuts_gen = 1;
    kvp_list_init(&n->listeners);
    kvp_list_init(&n->ends);
    kvp_list_init(&n->cuts);
    kvp_list_init(&n->busy);
    *out = n;
    return KVP_OK;
}

void kvp_fake_net_destroy(kvp_fake_net_t *net)
{
    if (!net)
        return;
    /* Every ctl (owner of listeners and ends) must be gone already. */
    KVP_ASSERT(kvp_list_empty(&net->listeners) && kvp_list_empty(&net->ends));
    kvp_list_t *pos, *tmp;
    kvp_list_foreach_safe(pos, tmp, &net->cuts)
    {
        kvp_list_remove(pos);
        kvp__free(KVP_CONTAINER_OF(pos, fake_cut_t, node));
    }
    kvp__free(net);
}

static bool fake_is_cut(const kvp_fake_net_t *net, const char *a, const char *b)
{
    const kvp_list_t *pos;
    for (pos = net->cuts.next; pos != &net->cuts; pos = pos->next) {
        const fake_cut_t *c = KVP_CONTAINER_OF(pos, fake_cut_t, node);
        if ((!strcmp(c->a, a) && !strcmp(c->b, b)) || (!strcmp(c->a, b) && !strcmp(c->b, a)))
            return true;
    }
    return false;
}

/* fake_is_cut for e's own pair (local, remote), cached per cut list. */
static bool fake_end_cut(fake_end_t *e)
{
    if (kvp_list_empty(&e->net->cuts))
        return false;
    if (e->cut_gen != e->net->cuts_gen) {
        e->cut = fake_is_cut(e->net, e->local, e->base.remote);
        e->cut_gen = e->net->cuts_gen;
    }
    return e->cut;
}

/* Copy a NUL-terminated string of at most cap - 1 bytes (truncating), as
 * snprintf("%s") did, without the formatting machinery. */
static void fake_strcpy(char *dst, size_t cap, const char *src)
{
    size_t n = strnlen(src, cap - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* Keep e on net->busy exactly while its inq is not empty, in seq order. */
static void fake_busy_sync(fake_end_t *e)
{
    bool want = !kvp_list_empty(&e->inq);
    if (want == kvp_list_linked(&e->busy_node))
        return;
    if (!want) {
        kvp_list_remove(&e->busy_node);
        return;
    }
    kvp_list_t *p = e->net->busy.prev; /* usually the newest end: from the tail */
    while (p != &e->net->busy && KVP_CONTAINER_OF(p, fake_end_t, busy_node)->seq > e->seq)
        p = p->prev;
    kvp_list_insert_tail(p->next, &e->busy_node); /* right after p */
}

static void fake_purge(fake_end_t *e)
{
    kvp_list_t *pos, *tmp;
    kvp_list_foreach_safe(pos, tmp, &e->inq)
    {
        kvp_list_remove(pos);
        kvp__free(KVP_CONTAINER_OF(pos, fake_chunk_t, node));
    }
    e->inq_bytes = 0;
    fake_busy_sync(e);
}

static void fake_free(fake_end_t *e)
{
    if (e->peer)
        e->peer->peer = NULL;
    kvp_timer_stop(e->base.loop, &e->ev);
    fake_purge(e);
    kvp_list_remove(&e->net_node);
    kvp_conn_fini(&e->base);
    kvp__free(e);
}

static void fake_arm(fake_end_t *e, uint64_t at)
{
    if (!kvp_timer_active(&e->ev) || e->ev.deadline_ns > at)
        kvp_timer_start(e->base.loop, &e->ev, at);
}

/* The other end is gone: this end sees EOF once its queue drained. */
static void fake_hangup(fake_end_t *e)
{
    e->peer = NULL;
    if (e->state == FAKE_OPEN || e->state == FAKE_CONNECTING)
        fake_set_state(e, FAKE_EOF);
    fake_arm(e, kvp_loop_now(e->base.loop));
}

/* ------------------------------------------------------------- delivery */

static int fake_deliver_end(fake_end_t *e)
{
    kvp_conn_t *c = &e->base;
    uint64_t now = kvp_loop_now(c->loop);
    int frames = 0;
    while (!kvp_list_empty(&e->inq) && c->h && e->state != FAKE_DEAD && !c->read_paused) {
        fake_chunk_t *ch = KVP_CONTAINER_OF(e->inq.next, fake_chunk_t, node);
        if (ch->at > now || fake_end_cut(e))
            break;
        size_t n = KVP_MIN(ch->len - ch->off, c->rcap - c->rlen);
        if (n == 0)
            break; /* rbuf full: the owner grows it when it knows the frame size */
        memcpy(c->rbuf + c->rlen, ch->data + ch->off, n);
        c->rlen += n;
        ch->off += n;
        e->inq_bytes -= n;
        if (ch->off == ch->len) {
            kvp_list_remove(&ch->node);
            kvp__free(ch);
            fake_busy_sync(e);
            frames++;
        }
        c->h->readable(c);
    }
    return frames;
}

static void fake_resolve_connect(fake_end_t *e);

static void fake_on_ev(kvp_timer_t *tm)
{
    fake_end_t *e = tm->data;
    if (e->state == FAKE_DEAD) {
        fake_free(e);
        return;
    }
    if (e->state == FAKE_CONNECTING) {
        fake_resolve_connect(e);
        return;
    }
    e->net->delivered += (uint64_t)fake_deliver_end(e);
    if (e->state == FAKE_DEAD || !e->base.h || e->base.read_paused)
        return; /* paused: fake_set_read re-arms */
    if (!kvp_list_empty(&e->inq)) {
        fake_chunk_t *ch = KVP_CONTAINER_OF(e->inq.next, fake_chunk_t, node);
        uint64_t now = kvp_loop_now(e->base.loop);
        if (!fake_end_cut(e))
            fake_arm(e, ch->at > now ? ch->at : now); /* partitioned: heal re-arms */
        return;
    }
    if (e->state == FAKE_EOF && !e->reported) {
        e->reported = true;
        e->base.h->closed(&e->base, KVP_ERR_CLOSED);
    }
}

/* Every end with something queued, in creation order (as a walk of
 * net->ends would: an end that gets a chunk meanwhile is visited if it comes
 * later in that order). */
int kvp_fake_net_deliver(kvp_fake_net_t *net)
{
    uint64_t before = net->delivered, seq = 0;
    kvp_list_t *pos = net->busy.next;
    for (;;) {
        while (pos != &net->busy && KVP_CONTAINER_OF(pos, fake_end_t, busy_node)->seq <= seq)
            pos = pos->next;
        if (pos == &net->busy)
            break;
        fake_end_t *e = KVP_CONTAINER_OF(pos, fake_end_t, busy_node);
        seq = e->seq;
        if ((e->state == FAKE_OPEN || e->state == FAKE_EOF) && e->base.h)
            net->delivered += (uint64_t)fake_deliver_end(e);
        /* Still queued: what follows it is later; else look again from the start. */
        pos = kvp_list_linked(&e->busy_node) ? e->busy_node.next : net->busy.next;
    }
    return (int)(net->delivered - before);
}

/* ----------------------------------------------------------- ends & ops */

static kvp_status_t fake_end_new(kvp_fake_net_t *net, kvp_loop_t *loop, size_t wbuf_max,
                                 const char *local, const char *remote, fake_end_t **out)
{
    fake_end_t *e = kvp__calloc(1, sizeof(*e));
    if (!e)
        return KVP_ERR_NOMEM;
    kvp_status_t st = kvp_conn_init(&e->base, &fake_ops, loop, wbuf_max);
    if (st != KVP_OK) {
        kvp_conn_fini(&e->base);
        kvp__free(e);
        return st;
    }
    e->net = net;
    kvp_list_init(&e->inq);
    kvp_list_init(&e->busy_node);
    e->seq = ++net->end_seq;
    kvp_timer_init(&e->ev, "fake-net", fake_on_ev, e);
    fake_strcpy(e->local, sizeof(e->local), local);
    fake_strcpy(e->base.remote, sizeof(e->base.remote), remote);
    kvp_list_insert_tail(&net->ends, &e->net_node);
    *out = e;
    return KVP_OK;
}

static size_t fake_queued(const kvp_conn_t *c)
{
    const fake_end_t *e = (const fake_end_t *)c;
    return e->peer ? e->peer->inq_bytes : 0;
}

static kvp_status_t fake_write(kvp_conn_t *c, const void *data, size_t len)
{
    fake_end_t *e = (fake_end_t *)c;
    if (e->state != FAKE_OPEN)
        return e->state == FAKE_EOF ? KVP_OK : KVP_ERR_CLOSED; /* EOF: reported later */
    fake_end_t *p = e->peer;
    if (!p)
        return KVP_OK;
    if (p->inq_bytes + len > c->wbuf_max)
        return KVP_ERR_LIMIT;
    fake_chunk_t *ch = kvp__malloc(sizeof(*ch) + len);
    if (!ch)
        return KVP_ERR_NOMEM;
    ch->at = kvp_loop_now(c->loop) + e->net->latency_ns;
    ch->len = len;
    ch->off = 0;
    memcpy(ch->data, data, len);
    kvp_list_insert_tail(&p->inq, &ch->node);
    p->inq_bytes += len;
    fake_busy_sync(p);
    if (!fake_end_cut(e))
        fake_arm(p, ch->at);
    return KVP_OK;
}

/* Graceful and hard close differ only for the other end: graceful lets what
 * was written arrive first (TCP FIN), hard drops it (RST). */
static void fake_close(kvp_conn_t *c, bool graceful)
{
    fake_end_t *e = (fake_end_t *)c;
    kvp_conn_detach(c);
    if (e->peer) {
        if (!graceful)
            fake_purge(e->peer);
        fake_hangup(e->peer);
        e->peer = NULL;
    }
    fake_set_state(e, FAKE_DEAD);
    kvp_timer_start(c->loop, &e->ev, kvp_loop_now(c->loop));
}

static void fake_set_read(kvp_conn_t *c, bool on)
{
    fake_end_t *e = (fake_end_t *)c;
    c->read_paused = !on;
    if (on && e->state != FAKE_DEAD)
        fake_arm(e, kvp_loop_now(c->loop));
}

static void fake_destroy(kvp_conn_t *c)
{
    fake_free((fake_end_t *)c);
}

static const kvp_conn_ops_t fake_ops = {
    .name = "fake",
    .set_read = fake_set_read,
    .write = fake_write,
    .queued = fake_queued,
    .close = fake_close,
    .destroy = fake_destroy,
};

/* -------------------------------------------------------- dial & listen */

static fake_listener_t *fake_find_listener(kvp_fake_net_t *net, const char *addr)
{
    kvp_list_t *pos;
    for (pos = net->listeners.next; pos != &net->listeners; pos = pos->next) {
        fake_listener_t *l = KVP_CONTAINER_OF(pos, fake_listener_t, node);
        if (!strcmp(l->base.addr, addr))
            return l;
    }
    return NULL;
}

static void fake_resolve_connect(fake_end_t *e)
{
    kvp_fake_net_t *net = e->net;
    if (fake_end_cut(e)) {
        /* SYN held. It used to retry every latency + 1 ns, a round of the
         * dialing node every tick for nothing until the heal: now the heal
         * re-arms it, for the deadline that retry would have had (the last
         * retry ran at the last round before the heal, at the heal's time
         * in a simulation on a manual clock). */
        e->syn_held = true;
        return;
    }
    fake_listener_t *l = fake_find_listener(net, e->base.remote);
    fake_end_t *s = NULL;
    if (!l || fake_end_new(net, l->loop, l->wbuf_max, e->base.remote, e->local, &s) != KVP_OK) {
        fake_set_state(e, FAKE_EOF); /* connection refused */
        e->reported = true;
        e->base.h->closed(&e->base, KVP_ERR_IO);
        return;
    }
    fake_set_state(s, FAKE_OPEN);
    fake_set_state(e, FAKE_OPEN);
    s->peer = e;
    e->peer = s;
    l->base.on_accept(&l->base, &s->base);
    if (e->state == FAKE_OPEN)
        e->base.h->connected(&e->base);
    else
        fake_arm(e, kvp_loop_now(e->base.loop)); /* refused at once: EOF follows */
}

kvp_status_t kvp_fake_dial(kvp_fake_net_t *net, kvp_loop_t *loop, const char *local_addr,
                           const char *addr, size_t wbuf_max, const kvp_conn_handler_t *h,
                           void *owner, kvp_conn_t **out)
{
    fake_end_t *e;
    kvp_status_t st = fake_end_new(net, loop, wbuf_max, local_addr, addr, &e);
    if (st != KVP_OK)
        return st;
    fake_set_state(e, FAKE_CONNECTING);
    e->base.h = h;
    e->base.owner = owner;
    fake_arm(e, kvp_loop_now(loop) + net->latency_ns);
    *out = &e->base;
    return KVP_OK;
}

static void fake_listener_close(kvp_listener_t *base)
{
    fake_listener_t *l = (fake_listener_t *)base;
    kvp_list_remove(&l->node);
    kvp__free(l);
}

kvp_status_t kvp_fake_listen(kvp_fake_net_t *net, kvp_loop_t *loop, const char *addr,
                             size_t wbuf_max, kvp_accept_cb cb, void *owner,
                             kvp_listener_t **out)
{
    if (!addr || !*addr || strlen(addr) > KVP_WIRE_STR_MAX)
        return KVP_ERR_INVALID;
    if (fake_find_listener(net, addr))
        return KVP_ERR_EXISTS; /* address in use */
    fake_listener_t *l = kvp__calloc(1, sizeof(*l));
    if (!l)
        return KVP_ERR_NOMEM;
    l->net = net;
    l->loop = loop;
    l->wbuf_max = wbuf_max;
    snprintf(l->base.addr, sizeof(l->base.addr), "%s", addr);
    l->base.close = fake_listener_close;
    l->base.on_accept = cb;
    l->base.owner = owner;
    kvp_list_insert_tail(&net->listeners, &l->node);
    *out = &l->base;
    return KVP_OK;
}

/* ----------------------------------------------------- fault injection */

static void fake_cut_add(kvp_fake_net_t *net, const char *a, const char *b)
{
    if (fake_is_cut(net, a, b))
        return;
    fake_cut_t *c = kvp__calloc(1, sizeof(*c));
    KVP_ASSERT(c != NULL); /* test-only API */
    snprintf(c->a, sizeof(c->a), "%s", a);
    snprintf(c->b, sizeof(c->b), "%s", b);
    kvp_list_insert_tail(&net->cuts, &c->node);
    net->cuts_gen++;
}

void kvp_fake_net_partition(kvp_fake_net_t *net, const char *a, const char *b, bool cut)
{
    if (cut) {
        fake_cut_add(net, a, b);
        return;
    }
    kvp_list_t *pos, *tmp;
    kvp_list_foreach_safe(pos, tmp, &net->cuts)
    {
        fake_cut_t *c = KVP_CONTAINER_OF(pos, fake_cut_t, node);
        if ((!strcmp(c->a, a) && !strcmp(c->b, b)) || (!strcmp(c->a, b) && !strcmp(c->b, a))) {
            kvp_list_remove(pos);
            kvp__free(c);
            net->cuts_gen++;
        }
    }
    /* Healed: held chunks and connects resume, in order, from the loops. */
    for (pos = net->ends.next; pos != &net->ends; pos = pos->next) {
        fake_end_t *e = KVP_CONTAINER_OF(pos, fake_end_t, net_node);
        if (e->state != FAKE_DEAD && (!kvp_list_empty(&e->inq) || e->state == FAKE_EOF))
            fake_arm(e, kvp_loop_now(e->base.loop));
        else if (e->state == FAKE_CONNECTING && e->syn_held && !fake_end_cut(e)) {
            e->syn_held = false;
            fake_arm(e, kvp_loop_now(e->base.loop) + net->latency_ns + 1);
        }
    }
}

void kvp_fake_net_kill(kvp_fake_net_t *net, const char *addr)
{
    kvp_list_t *pos;
    for (pos = net->ends.next; pos != &net->ends; pos = pos->next) {
        fake_end_t *e = KVP_CONTAINER_OF(pos, fake_end_t, net_node);
        if (e->state == FAKE_DEAD || (strcmp(e->local, addr) && strcmp(e->base.remote, addr)))
            continue;
        fake_purge(e);
        if (e->state == FAKE_CONNECTING) {
            fake_set_state(e, FAKE_EOF); /* resolves as EOF on its timer */
        }
        if (e->peer)
            e->peer->peer = NULL;
        fake_hangup(e);
    }
}
