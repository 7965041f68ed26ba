/* tcpd_out.c -- kvpeer's own tcp data stream: sending (connect, preface,
 * pieces straight from the caller's memory with sendmsg, completion, failure). */
#include "transport/tcpd_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

/* ------------------------------------------------------------- sending */

/* An outgoing stream always watches for its end (RDHUP: the consumer never
 * writes, so its FIN or reset is the only thing to read), plus EPOLLOUT
 * while bytes wait. */
static void out_want(kvp_tcpd_out_t *o, uint32_t events)
{
    events |= EPOLLRDHUP;
    if (o->events == events || o->fd < 0)
        return;
    if (kvp__tcpd_ep_set(o->t, EPOLL_CTL_MOD, o->fd, events, o) == 0)
        o->events = events;
}

/* The stream is over: closed, and every queued piece told it never left.
 * `report`: a failure the owner learns of (not its own close). */
static void out_end(kvp_tcpd_out_t *o, const char *why, bool report)
{
    kvp_tcpd_t *t = o->t;
    if (o->state == OUT_FAILED)
        return;
    kvp__tcpd_out_set_state(o, OUT_FAILED);
    if (o->fd >= 0) {
        close(o->fd);
        o->fd = -1;
    }
    if (report && t->cbs.failed)
        t->cbs.failed(t->cbs.arg, o->owner, why);
    while (o->qlen > 0) { /* never written now: the source memory is free */
        tcpd_q_t *e = &o->q[o->qhead];
        o->qhead = (o->qhead + 1) % o->qcap;
        o->qlen--;
        t->cbs.sent(t->cbs.arg, e->cookie, false);
    }
    o->head_off = 0;
}

void kvp__tcpd_out_fail(kvp_tcpd_out_t *o, const char *why)
{
    out_end(o, why, true);
}

/* Consume n written bytes from the head of the queue. */
static void out_consume(kvp_tcpd_out_t *o, size_t n)
{
    kvp_tcpd_t *t = o->t;
    while (n > 0) {
        tcpd_q_t *e = &o->q[o->qhead];
        size_t rem = sizeof(e->h) + e->h.len - o->head_off;
        if (n < rem) {
            o->head_off += n;
            return;
        }
        n -= rem;
        o->head_off = 0;
        o->qhead = (o->qhead + 1) % o->qcap;
        o->qlen--;
        t->st.pieces_out++;
        t->st.bytes_out += e->h.len;
        t->cbs.sent(t->cbs.arg, e->cookie, true);
    }
}

static bool out_send(kvp_tcpd_out_t *o, const struct iovec *iov, int n, size_t *done)
{
    struct msghdr m = {.msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n};
    ssize_t w = sendmsg(o->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
        *done = 0;
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return true;
        kvp__tcpd_out_fail(o, strerror(errno));
        return false;
    }
    *done = (size_t)w;
    return true;
}

void kvp__tcpd_out_write(kvp_tcpd_out_t *o)
{
    size_t done;
    if (o->state != OUT_OPEN)
        return;
    while (o->pre_sent < sizeof(o->pre)) {
        struct iovec v = {(uint8_t *)&o->pre + o->pre_sent, sizeof(o->pre) - o->pre_sent};
        if (!out_send(o, &v, 1, &done))
            return;
        if (done == 0) {
            out_want(o, EPOLLOUT);
            return;
        }
        o->pre_sent += (uint32_t)done;
    }
    while (o->qlen > 0) {
        struct iovec v[TCPD_IOV];
        int n = 0;
        size_t want = 0;
        for (size_t i = 0; i < o->qlen && n + 2 <= TCPD_IOV; i++) {
            tcpd_q_t *e = &o->q[(o->qhead + i) % o->qcap];
            size_t skip = i == 0 ? o->head_off : 0;
            if (skip < sizeof(e->h))
                v[n++] = (struct iovec){(uint8_t *)&e->h + skip, sizeof(e->h) - skip};
            size_t dskip = skip > sizeof(e->h) ? skip - sizeof(e->h) : 0;
            v[n++] = (struct iovec){(void *)(e->data + dskip), e->h.len - dskip};
            want += sizeof(e->h) + e->h.len - skip;
        }
        if (!out_send(o, v, n, &done))
            return;
        if (done == 0) {
            out_want(o, EPOLLOUT);
            return;
        }
        out_consume(o, done);
        if (done < want) {
            out_want(o, EPOLLOUT);
            return;
        }
    }
    out_want(o, 0);
}

void kvp__tcpd_out_connected(kvp_tcpd_out_t *o)
{
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(o->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = errno;
    if (err != 0) {
        char why[128];
        snprintf(why, sizeof(why), "connect to %s: %s", o->name, strerror(err));
        kvp__tcpd_out_fail(o, why);
        return;
    }
    kvp__tcpd_out_set_state(o, OUT_OPEN);
    kvp__tcpd_out_write(o);
}

static socklen_t sa_fill(struct sockaddr_storage *ss, uint8_t family, const uint8_t *ip,
                         uint16_t port)
{
    memset(ss, 0, sizeof(*ss));
    if (family == 4) {
        struct sockaddr_in *v4 = (struct sockaddr_in *)ss;
        v4->sin_family = AF_INET;
        v4->sin_port = htons(port);
        memcpy(&v4->sin_addr, ip, 4);
        return sizeof(*v4);
    }
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)ss;
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(port);
    memcpy(&v6->sin6_addr, ip, 16);
    return sizeof(*v6);
}

/* Where a's stream is; a wildcard address is replaced by `fallback` (the
 * numeric host its control connection came from). */
static bool out_addr(const kvp_tcpd_addr_t *a, const char *fallback, struct sockaddr_storage *ss,
                     socklen_t *len)
{
    static const uint8_t zero[16];
    uint8_t ip[16];
    if ((a->family != 4 && a->family != 6) || a->port == 0)
        return false;
    if (memcmp(a->ip, zero, a->family == 4 ? 4 : 16) != 0) {
        *len = sa_fill(ss, a->family, a->ip, a->port);
        return true;
    }
    if (fallback == NULL || fallback[0] == '\0')
        return false;
    if (inet_pton(AF_INET, fallback, ip) == 1)
        *len = sa_fill(ss, 4, ip, a->port);
    else if (inet_pton(AF_INET6, fallback, ip) == 1)
        *len = sa_fill(ss, 6, ip, a->port);
    else
        return false;
    return true;
}

kvp_tcpd_out_t *kvp__tcpd_connect(kvp_tcpd_t *t, const kvp_tcpd_addr_t *a,
                                  const char *fallback_host, uint64_t dst_token, void *owner)
{
    struct sockaddr_storage ss;
    socklen_t len;
    if (!out_addr(a, fallback_host, &ss, &len)) {
        KVP_LOG_RL(&t->rl, kvp__tcpd_now_ns(), KVP_LOG_WARN, t->prefix,
                   "peer's data stream address unusable (family %u, port %u)", a->family,
                   a->port);
        return NULL;
    }
    kvp_tcpd_out_t *o = kvp__calloc(1, sizeof(*o));
    if (o == NULL)
        return NULL;
    o->kind = K_OUT;
    o->t = t;
    o->owner = owner;
    o->pre = (kvp_tcpd_preface_t){KVP_TCPD_PREFACE_MAGIC, KVP_TCPD_VERSION, dst_token,
                                  t->cfg.token};
    kvp__tcpd_addr_str(&ss, o->name, sizeof(o->name));
    o->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (o->fd < 0 || setsockopt(o->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0 ||
        (connect(o->fd, (struct sockaddr *)&ss, len) != 0 && errno != EINPROGRESS) ||
        kvp__tcpd_ep_set(t, EPOLL_CTL_ADD, o->fd, EPOLLOUT | EPOLLRDHUP, o) != 0) {
        KVP_LOG_RL(&t->rl, kvp__tcpd_now_ns(), KVP_LOG_WARN, t->prefix, "data stream to %s: %s",
                   o->name, strerror(errno));
        if (o->fd >= 0)
            close(o->fd);
        kvp__free(o);
        return NULL;
    }
    o->events = EPOLLOUT | EPOLLRDHUP;
    kvp__tcpd_out_set_state(o, OUT_CONNECTING);
    o->deadline_ns = kvp__tcpd_now_ns() + (uint64_t)t->cfg.connect_timeout_ms * KVP_NSEC_PER_MSEC;
    kvp_list_insert_tail(&t->outs, &o->link);
    return o;
}

kvp_status_t kvp__tcpd_send(kvp_tcpd_out_t *o, const kvp_tcpd_piece_t *h, const uint8_t *data,
                            void *cookie)
{
    if (o->state == OUT_FAILED)
        return KVP_ERR_TRANSPORT;
    if (h->len == 0 || h->len > KVP_TCPD_PIECE_MAX)
        return KVP_ERR_INVALID;
    if (o->qlen == o->qcap) {
        size_t cap = o->qcap ? 2 * o->qcap : 64;
        tcpd_q_t *q = kvp__malloc(cap * sizeof(*q));
        if (q == NULL)
            return KVP_ERR_NOMEM;
        for (size_t i = 0; i < o->qlen; i++)
            q[i] = o->q[(o->qhead + i) % o->qcap];
        kvp__free(o->q);
        o->q = q;
        o->qcap = cap;
        o->qhead = 0;
    }
    o->q[(o->qhead + o->qlen) % o->qcap] = (tcpd_q_t){*h, data, cookie};
    o->qlen++;
    return KVP_OK;
}

void kvp__tcpd_kick(kvp_tcpd_out_t *o)
{
    if (o->state == OUT_OPEN && !(o->events & EPOLLOUT))
        kvp__tcpd_out_write(o);
}

void kvp__tcpd_out_close(kvp_tcpd_out_t *o)
{
    kvp_tcpd_t *t = o->t;
    out_end(o, "closed", false); /* the owner closes it: not a failure to report */
    kvp_list_remove(&o->link);
    kvp_list_insert_tail(&t->dead_outs, &o->link);
}

