/*
 * tcpd.c -- kvpeer's own tcp data stream (see tcpd.h for the wire and why).
 *
 * Objects: kvp_tcpd_t owns the listener, an epoll set (level-triggered) of
 * every socket, the accepted connections (tcpd_in_t) and the outgoing
 * streams (kvp_tcpd_out_t, each also referenced by its owner, the UCX
 * backend's peer, until kvp__tcpd_out_close). A connection closed while an
 * epoll batch may still name it goes to a dead list and is freed at the end
 * of progress(): no event ever reaches freed memory.
 *
 * Receiving: preface (PREAUTH) -> piece header (HDR) -> piece bytes (DATA)
 * into a staging buffer of the connection -> cbs.land() -> HDR ... The
 * staging buffer exists only after the preface proved our token, so an
 * unauthenticated connection costs one small record.
 */
#include "transport/tcpd.h"

#include "ctl/conn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#define TCPD_BACKOFF_NS (100 * KVP_NSEC_PER_MSEC) /* listener paused after EMFILE */
#define TCPD_CHECK_NS (50 * KVP_NSEC_PER_MSEC)    /* deadline scan period */
#define TCPD_READ_BUDGET ((size_t)4 << 20)        /* bytes per connection per progress */
#define TCPD_IOV 32

enum { K_LISTEN = 1, K_IN = 2, K_OUT = 3 };
enum { IN_PREAUTH = 0, IN_HDR, IN_DATA, IN_DEAD };
enum { OUT_CONNECTING = 0, OUT_OPEN, OUT_FAILED };

typedef struct tcpd_in {
    uint8_t kind; /* K_IN: first, as in every epoll target */
    uint8_t state;
    kvp_list_t link; /* t->preauth, t->open or t->dead_ins */
    int fd;
    uint64_t deadline_ns;
    struct sockaddr_storage peer;
    uint64_t src_token;
    uint32_t got; /* bytes of the current unit (preface, header or data) */
    kvp_tcpd_preface_t pre;
    kvp_tcpd_piece_t hdr;
    uint8_t *buf; /* KVP_TCPD_PIECE_MAX, once authenticated */
} tcpd_in_t;

typedef struct tcpd_q {
    kvp_tcpd_piece_t h;
    const uint8_t *data;
    void *cookie;
} tcpd_q_t;

struct kvp_tcpd_out {
    uint8_t kind; /* K_OUT */
    uint8_t state;
    kvp_list_t link; /* t->outs or t->dead_outs */
    kvp_tcpd_t *t;
    int fd;
    void *owner;
    uint64_t deadline_ns; /* connect */
    uint32_t events;      /* registered epoll events */
    kvp_tcpd_preface_t pre;
    uint32_t pre_sent;
    tcpd_q_t *q; /* ring: q[(qhead + i) % qcap], i < qlen */
    size_t qcap, qhead, qlen;
    size_t head_off; /* bytes of the head entry (header + data) already written */
    char name[64];
};

struct kvp_tcpd {
    uint8_t kind; /* K_LISTEN */
    char prefix[64];
    kvp_tcpd_config_t cfg;
    kvp_tcpd_cbs_t cbs;
    int lfd, epfd, reserve_fd;
    bool paused;
    uint64_t resume_ns, next_check_ns;
    kvp_list_t preauth, open, outs, dead_ins, dead_outs;
    uint32_t n_preauth, n_open;
    kvp_tcpd_addr_t local;
    kvp_ratelimit_t rl;
    kvp_tcpd_stats_t st;
};

static uint64_t now_ns(void)
{
    return kvp_clock_now(kvp_clock_real());
}

static void addr_str(const struct sockaddr_storage *ss, char *buf, size_t cap)
{
    char ip[INET6_ADDRSTRLEN] = "?";
    unsigned port = 0;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
        inet_ntop(AF_INET, &a->sin_addr, ip, sizeof(ip));
        port = ntohs(a->sin_port);
    } else if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof(ip));
        port = ntohs(a->sin6_port);
    }
    snprintf(buf, cap, "%s:%u", ip, port);
}

static bool same_ip(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family)
        return false;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                  &((const struct sockaddr_in6 *)b)->sin6_addr, 16) == 0;
}

/* Constant time: the token is the connection's only credential. */
static bool token_eq(uint64_t a, uint64_t b)
{
    volatile uint64_t d = a ^ b;
    return d == 0;
}

static int ep_set(kvp_tcpd_t *t, int op, int fd, uint32_t events, void *ptr)
{
    struct epoll_event ev = {.events = events, .data.ptr = ptr};
    return epoll_ctl(t->epfd, op, fd, &ev);
}

/* ------------------------------------------------------------ receiving */

static void in_close(kvp_tcpd_t *t, tcpd_in_t *c, const char *why)
{
    if (c->state == IN_DEAD)
        return;
    char a[80];
    addr_str(&c->peer, a, sizeof(a));
    KVP_LOG_RL(&t->rl, now_ns(), KVP_LOG_WARN, t->prefix, "data stream from %s closed: %s", a,
               why);
    if (c->state == IN_PREAUTH)
        t->n_preauth--;
    else
        t->n_open--;
    close(c->fd); /* also leaves the epoll set */
    c->fd = -1;
    c->state = IN_DEAD;
    kvp_list_remove(&c->link);
    kvp_list_insert_tail(&t->dead_ins, &c->link);
}

/* The preface arrived whole: our token, or the connection goes. */
static void in_auth(kvp_tcpd_t *t, tcpd_in_t *c)
{
    const kvp_tcpd_preface_t *p = &c->pre;
    if (p->magic != KVP_TCPD_PREFACE_MAGIC || p->version != KVP_TCPD_VERSION ||
        !token_eq(p->dst_token, t->cfg.token) || p->src_token == 0) {
        t->st.closed_bad_preface++;
        in_close(t, c, "no valid preface (not a kvpeer peer holding our blob)");
        return;
    }
    if (t->n_open >= t->cfg.max_open) {
        t->st.refused_open_cap++;
        in_close(t, c, "too many data streams (max_open)");
        return;
    }
    c->buf = kvp__malloc(KVP_TCPD_PIECE_MAX);
    if (c->buf == NULL) {
        in_close(t, c, "no memory");
        return;
    }
    t->n_preauth--;
    t->n_open++;
    t->st.authenticated++;
    c->src_token = p->src_token;
    c->state = IN_HDR;
    c->got = 0;
    kvp_list_remove(&c->link);
    kvp_list_insert_tail(&t->open, &c->link);
}

static bool in_header_ok(const kvp_tcpd_piece_t *h)
{
    return h->magic == KVP_TCPD_PIECE_MAGIC && h->zero == 0 && h->len > 0 &&
           h->len <= KVP_TCPD_PIECE_MAX;
}

/* Where the next bytes of c go, and how many are wanted. */
static uint8_t *in_dst(tcpd_in_t *c, size_t *want)
{
    switch (c->state) {
    case IN_PREAUTH:
        *want = sizeof(c->pre) - c->got;
        return (uint8_t *)&c->pre + c->got;
    case IN_HDR:
        *want = sizeof(c->hdr) - c->got;
        return (uint8_t *)&c->hdr + c->got;
    default:
        *want = c->hdr.len - c->got;
        return c->buf + c->got;
    }
}

/* One unit (preface, header or piece) complete. */
static void in_unit(kvp_tcpd_t *t, tcpd_in_t *c)
{
    c->got = 0;
    if (c->state == IN_PREAUTH) {
        in_auth(t, c);
    } else if (c->state == IN_HDR) {
        if (!in_header_ok(&c->hdr)) {
            t->st.closed_proto++;
            in_close(t, c, "bad piece header");
            return;
        }
        c->state = IN_DATA;
    } else {
        t->st.pieces_in++;
        t->st.bytes_in += c->hdr.len;
        c->state = IN_HDR;
        t->cbs.land(t->cbs.arg, c->src_token, &c->hdr, c->buf);
    }
}

static void in_read(kvp_tcpd_t *t, tcpd_in_t *c)
{
    size_t budget = TCPD_READ_BUDGET;
    while (c->state != IN_DEAD && budget > 0) {
        size_t want;
        uint8_t *dst = in_dst(c, &want);
        ssize_t n = recv(c->fd, dst, want, 0);
        if (n == 0) {
            in_close(t, c, c->state == IN_HDR && c->got == 0 ? "closed by the source"
                                                             : "closed mid-frame");
            return;
        }
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            if (errno == EINTR)
                continue;
            in_close(t, c, strerror(errno));
            return;
        }
        c->got += (uint32_t)n;
        budget -= KVP_MIN(budget, (size_t)n);
        if ((size_t)n == want)
            in_unit(t, c);
    }
}

static uint32_t preauth_from(const kvp_tcpd_t *t, const struct sockaddr_storage *ss)
{
    uint32_t n = 0;
    for (const kvp_list_t *p = t->preauth.next; p != &t->preauth; p = p->next)
        n += same_ip(&KVP_CONTAINER_OF(p, tcpd_in_t, link)->peer, ss);
    return n;
}

static void listen_pause(kvp_tcpd_t *t, int err)
{
    uint64_t now = now_ns();
    if (err == EMFILE || err == ENFILE) {
        t->st.accept_emfile++;
        if (t->reserve_fd >= 0) { /* shed the waiting connection instead of spinning */
            close(t->reserve_fd);
            int fd = accept(t->lfd, NULL, NULL);
            if (fd >= 0)
                close(fd);
            t->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        }
    }
    KVP_LOG_RL(&t->rl, now, KVP_LOG_WARN, t->prefix,
               "data listener: accept: %s (paused %llu ms)%s", strerror(err),
               (unsigned long long)(TCPD_BACKOFF_NS / KVP_NSEC_PER_MSEC),
               err == EMFILE || err == ENFILE ? ": out of file descriptors, raise LimitNOFILE" : "");
    (void)epoll_ctl(t->epfd, EPOLL_CTL_DEL, t->lfd, NULL);
    t->paused = true;
    t->resume_ns = now + TCPD_BACKOFF_NS;
}

static void refuse(kvp_tcpd_t *t, int fd, const struct sockaddr_storage *ss, uint64_t *counter,
                   const char *why)
{
    char a[80];
    addr_str(ss, a, sizeof(a));
    (*counter)++;
    KVP_LOG_RL(&t->rl, now_ns(), KVP_LOG_WARN, t->prefix, "data stream from %s refused: %s", a,
               why);
    close(fd);
}

static void on_accept(kvp_tcpd_t *t)
{
    for (int i = 0; i < 64; i++) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        int fd = accept4(t->lfd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                errno != ECONNABORTED)
                listen_pause(t, errno);
            return;
        }
        t->st.accepted++;
        if (preauth_from(t, &ss) >= t->cfg.max_preauth_per_addr) {
            refuse(t, fd, &ss, &t->st.refused_addr_cap,
                   "too many unauthenticated streams from this address");
            continue;
        }
        if (t->n_preauth >= t->cfg.max_preauth) {
            /* Full: the OLDEST unauthenticated one goes, not the newcomer. A
             * real source sends its preface with its first bytes (it is
             * usually read right below, at accept), so only idle holders
             * age; refusing newcomers would let them lock real sources out. */
            tcpd_in_t *old = KVP_CONTAINER_OF(t->preauth.next, tcpd_in_t, link);
            t->st.refused_preauth_cap++;
            in_close(t, old, "evicted: too many unauthenticated streams");
        }
        tcpd_in_t *c = kvp__calloc(1, sizeof(*c));
        if (c == NULL) {
            close(fd);
            continue;
        }
        c->kind = K_IN;
        c->state = IN_PREAUTH;
        c->fd = fd;
        c->peer = ss;
        c->deadline_ns = now_ns() + (uint64_t)t->cfg.preauth_timeout_ms * KVP_NSEC_PER_MSEC;
        if (ep_set(t, EPOLL_CTL_ADD, fd, EPOLLIN, c) != 0) {
            close(fd);
            kvp__free(c);
            continue;
        }
        kvp_list_insert_tail(&t->preauth, &c->link);
        t->n_preauth++;
        in_read(t, c); /* the preface is usually here already */
    }
}

/* ------------------------------------------------------------- sending */

/* An outgoing stream always watches for its end (RDHUP: the consumer never
 * writes, so its FIN or reset is the only thing to read), plus EPOLLOUT
 * while bytes wait. */
static void out_want(kvp_tcpd_out_t *o, uint32_t events)
{
    events |= EPOLLRDHUP;
    if (o->events == events || o->fd < 0)
        return;
    if (ep_set(o->t, EPOLL_CTL_MOD, o->fd, events, o) == 0)
        o->events = events;
}

/* The stream is over: closed, and every queued piece told it never left.
 * `report`: a failure the owner learns of (not its own close). */
static void out_end(kvp_tcpd_out_t *o, const char *why, bool report)
{
    kvp_tcpd_t *t = o->t;
    if (o->state == OUT_FAILED)
        return;
    o->state = OUT_FAILED;
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

static void out_fail(kvp_tcpd_out_t *o, const char *why)
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
        out_fail(o, strerror(errno));
        return false;
    }
    *done = (size_t)w;
    return true;
}

static void out_write(kvp_tcpd_out_t *o)
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

static void out_connected(kvp_tcpd_out_t *o)
{
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(o->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0)
        err = errno;
    if (err != 0) {
        char why[128];
        snprintf(why, sizeof(why), "connect to %s: %s", o->name, strerror(err));
        out_fail(o, why);
        return;
    }
    o->state = OUT_OPEN;
    out_write(o);
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
        KVP_LOG_RL(&t->rl, now_ns(), KVP_LOG_WARN, t->prefix,
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
    addr_str(&ss, o->name, sizeof(o->name));
    o->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (o->fd < 0 || setsockopt(o->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0 ||
        (connect(o->fd, (struct sockaddr *)&ss, len) != 0 && errno != EINPROGRESS) ||
        ep_set(t, EPOLL_CTL_ADD, o->fd, EPOLLOUT | EPOLLRDHUP, o) != 0) {
        KVP_LOG_RL(&t->rl, now_ns(), KVP_LOG_WARN, t->prefix, "data stream to %s: %s", o->name,
                   strerror(errno));
        if (o->fd >= 0)
            close(o->fd);
        kvp__free(o);
        return NULL;
    }
    o->events = EPOLLOUT | EPOLLRDHUP;
    o->state = OUT_CONNECTING;
    o->deadline_ns = now_ns() + (uint64_t)t->cfg.connect_timeout_ms * KVP_NSEC_PER_MSEC;
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
        out_write(o);
}

bool kvp__tcpd_out_failed(const kvp_tcpd_out_t *o)
{
    return o->state == OUT_FAILED;
}

void kvp__tcpd_out_close(kvp_tcpd_out_t *o)
{
    kvp_tcpd_t *t = o->t;
    out_end(o, "closed", false); /* the owner closes it: not a failure to report */
    kvp_list_remove(&o->link);
    kvp_list_insert_tail(&t->dead_outs, &o->link);
}

/* ------------------------------------------------------------- progress */

static void check_deadlines(kvp_tcpd_t *t, uint64_t now)
{
    kvp_list_t *pos, *tmp;
    kvp_list_foreach_safe(pos, tmp, &t->preauth)
    {
        tcpd_in_t *c = KVP_CONTAINER_OF(pos, tcpd_in_t, link);
        if (now >= c->deadline_ns) {
            t->st.closed_timeout++;
            in_close(t, c, "no preface before the deadline");
        }
    }
    kvp_list_foreach_safe(pos, tmp, &t->outs)
    {
        kvp_tcpd_out_t *o = KVP_CONTAINER_OF(pos, kvp_tcpd_out_t, link);
        if (o->state == OUT_CONNECTING && now >= o->deadline_ns) {
            char why[128];
            snprintf(why, sizeof(why), "connect to %s: no answer within %u ms", o->name,
                     t->cfg.connect_timeout_ms);
            out_fail(o, why);
        }
    }
    if (t->paused && now >= t->resume_ns &&
        ep_set(t, EPOLL_CTL_ADD, t->lfd, EPOLLIN, t) == 0)
        t->paused = false;
}

static void reap_dead(kvp_tcpd_t *t)
{
    while (!kvp_list_empty(&t->dead_ins)) {
        tcpd_in_t *c = KVP_CONTAINER_OF(t->dead_ins.next, tcpd_in_t, link);
        kvp_list_remove(&c->link);
        kvp__free(c->buf);
        kvp__free(c);
    }
    while (!kvp_list_empty(&t->dead_outs)) {
        kvp_tcpd_out_t *o = KVP_CONTAINER_OF(t->dead_outs.next, kvp_tcpd_out_t, link);
        kvp_list_remove(&o->link);
        kvp__free(o->q);
        kvp__free(o);
    }
}

static void on_event(kvp_tcpd_t *t, void *ptr, uint32_t events)
{
    uint8_t kind = *(const uint8_t *)ptr;
    if (kind == K_LISTEN) {
        on_accept(t);
    } else if (kind == K_IN) {
        tcpd_in_t *c = ptr;
        if (c->state != IN_DEAD)
            in_read(t, c);
    } else {
        kvp_tcpd_out_t *o = ptr;
        if (o->state == OUT_CONNECTING)
            out_connected(o);
        else if (o->state == OUT_OPEN && (events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP | EPOLLIN)))
            out_fail(o, "connection closed by the consumer");
        else if (o->state == OUT_OPEN)
            out_write(o);
    }
}

bool kvp__tcpd_progress(kvp_tcpd_t *t)
{
    struct epoll_event ev[64];
    bool any = false;
    uint64_t now = now_ns();

    for (int round = 0; round < 4; round++) {
        int n = epoll_wait(t->epfd, ev, (int)KVP_ARRAY_SIZE(ev), 0);
        if (n <= 0)
            break;
        any = true;
        for (int i = 0; i < n; i++)
            on_event(t, ev[i].data.ptr, ev[i].events);
        if (n < (int)KVP_ARRAY_SIZE(ev))
            break;
    }
    /* After reading: a preface waiting in the socket of a connection whose
     * deadline passed while we were not running still counts. */
    if (now >= t->next_check_ns) {
        check_deadlines(t, now);
        t->next_check_ns = now + TCPD_CHECK_NS;
    }
    reap_dead(t);
    return any;
}

/* ---------------------------------------------------------- open, close */

static kvp_status_t listen_open(kvp_tcpd_t *t)
{
    struct sockaddr_storage ss;
    unsigned sslen = sizeof(ss);
    const char *la = t->cfg.listen_addr ? t->cfg.listen_addr : "127.0.0.1:0";
    if (kvp_tcp_parse_addr(la, &ss, &sslen) != KVP_OK) {
        char e[160];
        kvp_escape(e, sizeof(e), la, strlen(la), 0);
        KVP_ERROR(t->prefix, "data listener: listen address %s: not host:port, or the host "
                  "does not resolve", e);
        return KVP_ERR_INVALID;
    }
    if (ss.ss_family == AF_INET)
        ((struct sockaddr_in *)&ss)->sin_port = htons(t->cfg.port);
    else
        ((struct sockaddr_in6 *)&ss)->sin6_port = htons(t->cfg.port);
    int one = 1;
    t->lfd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (t->lfd < 0 || setsockopt(t->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0 ||
        bind(t->lfd, (struct sockaddr *)&ss, sslen) != 0 || listen(t->lfd, 128) != 0) {
        char a[80];
        addr_str(&ss, a, sizeof(a));
        KVP_ERROR(t->prefix, "data listener on %s: %s", a, strerror(errno));
        return KVP_ERR_IO;
    }
    socklen_t len = sizeof(ss);
    if (getsockname(t->lfd, (struct sockaddr *)&ss, &len) != 0)
        return KVP_ERR_IO;
    memset(&t->local, 0, sizeof(t->local));
    if (ss.ss_family == AF_INET) {
        t->local.family = 4;
        t->local.port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        memcpy(t->local.ip, &((struct sockaddr_in *)&ss)->sin_addr, 4);
    } else {
        t->local.family = 6;
        t->local.port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        memcpy(t->local.ip, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
    }
    char a[80];
    addr_str(&ss, a, sizeof(a));
    KVP_INFO(t->prefix, "data stream listening on %s (kvpeer's own tcp data path)", a);
    return ep_set(t, EPOLL_CTL_ADD, t->lfd, EPOLLIN, t) == 0 ? KVP_OK : KVP_ERR_IO;
}

kvp_status_t kvp__tcpd_open(const kvp_tcpd_config_t *cfg, const kvp_tcpd_cbs_t *cbs,
                            kvp_tcpd_t **out)
{
    if (!cfg || !cbs || !cbs->land || !cbs->sent || !out || cfg->token == 0)
        return KVP_ERR_INVALID;
    kvp_tcpd_t *t = kvp__calloc(1, sizeof(*t));
    if (t == NULL)
        return KVP_ERR_NOMEM;
    t->kind = K_LISTEN;
    t->cfg = *cfg;
    t->cfg.listen_addr = NULL; /* borrowed: used in listen_open only */
    snprintf(t->prefix, sizeof(t->prefix), "%s", cfg->log_prefix ? cfg->log_prefix : "tcpd");
    t->cfg.max_preauth = cfg->max_preauth ? cfg->max_preauth : 16;
    t->cfg.max_preauth_per_addr = cfg->max_preauth_per_addr ? cfg->max_preauth_per_addr : 4;
    t->cfg.max_open = cfg->max_open ? cfg->max_open : 256;
    t->cfg.preauth_timeout_ms = cfg->preauth_timeout_ms ? cfg->preauth_timeout_ms : 3000;
    t->cfg.connect_timeout_ms = cfg->connect_timeout_ms ? cfg->connect_timeout_ms : 2000;
    t->cbs = *cbs;
    t->lfd = -1;
    t->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    kvp_list_init(&t->preauth);
    kvp_list_init(&t->open);
    kvp_list_init(&t->outs);
    kvp_list_init(&t->dead_ins);
    kvp_list_init(&t->dead_outs);
    kvp_ratelimit_init(&t->rl, KVP_NSEC_PER_SEC, 20);
    t->epfd = epoll_create1(EPOLL_CLOEXEC);
    t->cfg.listen_addr = cfg->listen_addr;
    kvp_status_t st = t->epfd < 0 ? KVP_ERR_IO : listen_open(t);
    t->cfg.listen_addr = NULL;
    if (st != KVP_OK) {
        kvp__tcpd_close(t);
        return st;
    }
    *out = t;
    return KVP_OK;
}

void kvp__tcpd_close(kvp_tcpd_t *t)
{
    if (t == NULL)
        return;
    kvp_list_t *lists[2] = {&t->preauth, &t->open}, *pos, *tmp;
    for (int k = 0; k < 2; k++)
        kvp_list_foreach_safe(pos, tmp, lists[k])
        {
            tcpd_in_t *c = KVP_CONTAINER_OF(pos, tcpd_in_t, link);
            close(c->fd);
            c->state = IN_DEAD;
            kvp_list_remove(&c->link);
            kvp_list_insert_tail(&t->dead_ins, &c->link);
        }
    while (!kvp_list_empty(&t->outs)) /* owners close theirs first; any left go here */
        kvp__tcpd_out_close(KVP_CONTAINER_OF(t->outs.next, kvp_tcpd_out_t, link));
    reap_dead(t);
    if (t->lfd >= 0)
        close(t->lfd);
    if (t->reserve_fd >= 0)
        close(t->reserve_fd);
    if (t->epfd >= 0)
        close(t->epfd);
    kvp__free(t);
}

void kvp__tcpd_local_addr(const kvp_tcpd_t *t, kvp_tcpd_addr_t *a)
{
    *a = t->local;
}

int kvp__tcpd_fd(const kvp_tcpd_t *t)
{
    return t->epfd;
}

void kvp__tcpd_stats(const kvp_tcpd_t *t, kvp_tcpd_stats_t *st)
{
    *st = t->st;
    st->open = t->n_open;
}
