/* conn_tcp.c -- the TCP connection backend: non-blocking sockets on the
 * loop, IPv4 and IPv6, TCP_NODELAY, a write queue bounded by wbuf_max, and a
 * graceful close that flushes, half-closes and drains (so a BYE is not lost to
 * an RST), bounded by linger_ns.
 *
 * Ownership: a tcp_conn_t is allocated by dial/accept and freed by its own
 * event timer after close() (never inside close(): the owner may be in the
 * middle of a readable callback), or by destroy() from the ctl's teardown.
 * The fd is owned by the tcp_conn_t. */
#include "ctl/conn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

typedef enum tcp_state {
    TCP_CONNECTING, /* non-blocking connect in progress: EPOLLOUT means done */
    TCP_OPEN,       /* owner attached */
    TCP_BROKEN,     /* error seen, closed() event scheduled */
    TCP_DRAINING,   /* detached, flushing the queue then reading to EOF */
    TCP_DEAD,       /* detached, freed by the event timer */
} tcp_state_t;

typedef struct tcp_conn {
    kvp_conn_t base;
    kvp_io_t io;
    int fd;
    tcp_state_t state;
    kvp_status_t pending_err; /* reported by the event timer in TCP_BROKEN */
    bool shut_wr;
    kvp_timer_t ev; /* deferred events: closed(), free, linger deadline */
    uint8_t *wbuf;  /* queued bytes are wbuf[whead..wlen) */
    size_t whead, wlen, wcap;
} tcp_conn_t;

/* The one writer of t->state (UCX's uct_tcp_cm_change_conn_state, in
 * spirit): each allowed move, checked. A new record starts CONNECTING (a
 * dial stays there, an accept opens at once); any state may die. */
static const char *const tcp_state_names[] = {
    [TCP_CONNECTING] = "connecting", [TCP_OPEN] = "open",  [TCP_BROKEN] = "broken",
    [TCP_DRAINING] = "draining",     [TCP_DEAD] = "dead",
};

static void tcp_set_state(tcp_conn_t *t, tcp_state_t to)
{
    static const uint8_t legal[] = {
        [TCP_CONNECTING] = 1u << TCP_CONNECTING,
        [TCP_OPEN] = 1u << TCP_CONNECTING,
        [TCP_BROKEN] = (1u << TCP_CONNECTING) | (1u << TCP_OPEN),
        [TCP_DRAINING] = 1u << TCP_OPEN,
        [TCP_DEAD] = 0x1f,
    };
    if (!(legal[to] & (1u << t->state)))
        kvp__assert_fail(tcp_state_names[to], __FILE__, __LINE__, tcp_state_names[t->state]);
    t->state = to;
}

/* Out of file descriptors (EMFILE/ENFILE), a level-triggered listen fd
 * stays readable and accept() keeps failing: a busy loop that logs each
 * time (issue 27 measured 143 % CPU, 186 MB of log in 6 s). As libuv and
 * nginx do, the listener keeps one reserve fd: it closes it, accepts and
 * closes the waiting connection (the peer sees a reset instead of hanging
 * in the backlog), reopens the reserve, and stops polling the listen fd
 * for TCP_ACCEPT_BACKOFF_NS; the log line is rate-limited. */
#define TCP_ACCEPT_BACKOFF_NS (100 * KVP_NSEC_PER_MSEC)

typedef struct tcp_listener {
    kvp_listener_t base;
    kvp_loop_t *loop;
    kvp_io_t io;
    int fd;
    int reserve_fd; /* /dev/null, given up to accept when out of fds; -1 if none */
    size_t wbuf_max;
    kvp_timer_t t_resume; /* polling the listen fd again after a back-off */
    kvp_ratelimit_t rl;
} tcp_listener_t;

static const kvp_conn_ops_t tcp_ops;

/* ------------------------------------------------------------- addresses */

kvp_status_t kvp_tcp_parse_addr(const char *addr, void *ss, unsigned *sslen)
{
    return kvp_tcp_parse_addr_ex(addr, ss, sslen, false);
}

kvp_status_t kvp_tcp_parse_addr_ex(const char *addr, void *ss, unsigned *sslen, bool numeric)
{
    char host[KVP_WIRE_STR_MAX + 1];
    const char *port;
    if (!addr || strlen(addr) > KVP_WIRE_STR_MAX)
        return KVP_ERR_INVALID;
    if (addr[0] == '[') {
        const char *end = strchr(addr, ']');
        if (!end || end[1] != ':')
            return KVP_ERR_INVALID;
        memcpy(host, addr + 1, (size_t)(end - addr - 1));
        host[end - addr - 1] = '\0';
        port = end + 2;
    } else {
        const char *colon = strrchr(addr, ':');
        if (!colon)
            return KVP_ERR_INVALID;
        memcpy(host, addr, (size_t)(colon - addr));
        host[colon - addr] = '\0';
        port = colon + 1;
    }
    /* getaddrinfo wraps a port over 65535 silently: check it ourselves. */
    char *end = NULL;
    unsigned long pn = strtoul(port, &end, 10);
    if (!*port || *end != '\0' || pn > 65535)
        return KVP_ERR_INVALID;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | (numeric ? AI_NUMERICHOST : 0);
    int rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &res);
    if (rc == EAI_NONAME && numeric && host[0]) {
        if (res)
            freeaddrinfo(res);
        return KVP_ERR_BUSY; /* a name: resolve it with kvp_tcp_parse_addr (blocking) */
    }
    if (rc != 0 || !res) {
        if (res)
            freeaddrinfo(res);
        return KVP_ERR_INVALID;
    }
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *sslen = (unsigned)res->ai_addrlen;
    freeaddrinfo(res);
    return KVP_OK;
}

static void tcp_format_addr(const struct sockaddr_storage *ss, char *out, size_t cap)
{
    char host[INET6_ADDRSTRLEN] = "?";
    if (ss->ss_family == AF_INET6) {
        const struct sockaddr_in6 *a = (const void *)ss;
        inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
        snprintf(out, cap, "[%s]:%u", host, ntohs(a->sin6_port));
    } else {
        const struct sockaddr_in *a = (const void *)ss;
        inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
        snprintf(out, cap, "%s:%u", host, ntohs(a->sin_port));
    }
}

/* ------------------------------------------------------------ lifecycle */

static void tcp_free(tcp_conn_t *t)
{
    kvp_loop_t *loop = t->base.loop;
    kvp_io_stop(loop, &t->io);
    kvp_timer_stop(loop, &t->ev);
    if (t->fd >= 0)
        close(t->fd);
    kvp__free(t->wbuf);
    kvp_conn_fini(&t->base);
    kvp__free(t);
}

/* Report a failure to the owner from the loop, never from inside write(). */
static void tcp_break(tcp_conn_t *t, kvp_status_t why)
{
    if (t->state == TCP_DRAINING) {
        tcp_set_state(t, TCP_DEAD);
        kvp_timer_start(t->base.loop, &t->ev, kvp_loop_now(t->base.loop));
        return;
    }
    if (t->state == TCP_BROKEN || t->state == TCP_DEAD)
        return;
    tcp_set_state(t, TCP_BROKEN);
    t->pending_err = why;
    kvp_io_stop(t->base.loop, &t->io);
    kvp_timer_start(t->base.loop, &t->ev, kvp_loop_now(t->base.loop));
}

static void tcp_on_ev(kvp_timer_t *tm)
{
    tcp_conn_t *t = tm->data;
    if (t->state == TCP_BROKEN && t->base.h) {
        tcp_set_state(t, TCP_DEAD); /* the owner will close() us; the free follows */
        t->base.h->closed(&t->base, t->pending_err);
        return;
    }
    if (t->state == TCP_DRAINING || t->state == TCP_DEAD || !t->base.h)
        tcp_free(t); /* linger deadline passed, or a scheduled free */
}

static kvp_status_t tcp_conn_new(kvp_loop_t *loop, int fd, size_t wbuf_max, tcp_conn_t **out)
{
    tcp_conn_t *t = kvp__calloc(1, sizeof(*t));
    if (!t)
        return KVP_ERR_NOMEM;
    t->fd = fd;
    kvp_timer_init(&t->ev, "tcp-event", tcp_on_ev, t);
    kvp_status_t st = kvp_conn_init(&t->base, &tcp_ops, loop, wbuf_max);
    if (st != KVP_OK) {
        kvp_conn_fini(&t->base);
        kvp__free(t);
        return st;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    *out = t;
    return KVP_OK;
}

/* ------------------------------------------------------------------ I/O */

static void tcp_update_events(tcp_conn_t *t)
{
    uint32_t ev = t->base.read_paused ? 0 : EPOLLIN;
    if (t->wlen > t->whead || t->state == TCP_CONNECTING)
        ev |= EPOLLOUT;
    if (t->io.active && kvp_io_modify(t->base.loop, &t->io, ev) != KVP_OK)
        tcp_break(t, KVP_ERR_IO);
}

static void tcp_flush(tcp_conn_t *t)
{
    while (t->whead < t->wlen) {
        ssize_t n = send(t->fd, t->wbuf + t->whead, t->wlen - t->whead, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            break;
        if (n <= 0) {
            tcp_break(t, KVP_ERR_IO);
            return;
        }
        t->whead += (size_t)n;
    }
    if (t->whead == t->wlen)
        t->whead = t->wlen = 0;
    if (t->state == TCP_DRAINING && t->wlen == 0 && !t->shut_wr) {
        shutdown(t->fd, SHUT_WR); /* FIN after the queued bytes (the BYE) */
        t->shut_wr = true;
    }
    tcp_update_events(t);
}

/* Bytes one readiness event may take from a connection (about one large
 * frame): epoll is level-triggered, so the rest is read on the next round,
 * after every other ready fd and due timer had its turn. Without it a peer
 * that sends as fast as we parse held the loop: measured, a LOOKUP flood
 * left a good peer 0 fetches in 4 s (issue 27). */
#define TCP_READ_BUDGET (1u << 20)

/* hup: EPOLLHUP/EPOLLERR, reported even while reads are paused (a reset or
 * an error: what is unread is lost anyway); with no room left then, the
 * connection is broken now instead of waking the loop until the resume. */
static void tcp_on_readable(tcp_conn_t *t, bool hup)
{
    kvp_conn_t *c = &t->base;
    for (size_t taken = 0; taken < TCP_READ_BUDGET;) {
        if (t->state == TCP_DRAINING)
            c->rlen = 0; /* nobody reads any more: discard until EOF */
        size_t room = c->rcap - c->rlen;
        if (room == 0 && hup && c->read_paused)
            tcp_break(t, KVP_ERR_IO);
        if (room == 0)
            return; /* the owner grows rbuf when it knows the frame size */
        ssize_t n = recv(t->fd, c->rbuf + c->rlen, room, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
            return;
        if (n <= 0) {
            tcp_break(t, n == 0 ? KVP_ERR_CLOSED : KVP_ERR_IO);
            return;
        }
        c->rlen += (size_t)n;
        taken += (size_t)n;
        if (t->state == TCP_OPEN && c->h) {
            c->h->readable(c);
            if (t->state != TCP_OPEN || !c->h || c->read_paused)
                return; /* closed, broken or paused inside the callback */
        }
        if ((size_t)n < room)
            return;
    }
}

static void tcp_on_connect(tcp_conn_t *t)
{
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(t->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) {
        tcp_break(t, KVP_ERR_IO);
        return;
    }
    tcp_set_state(t, TCP_OPEN);
    tcp_update_events(t);
    if (t->base.h)
        t->base.h->connected(&t->base);
}

static void tcp_on_io(kvp_io_t *io, uint32_t events)
{
    tcp_conn_t *t = io->data;
    if (t->state == TCP_CONNECTING) {
        if (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))
            tcp_on_connect(t);
        return;
    }
    if (events & EPOLLOUT)
        tcp_flush(t);
    if (t->state != TCP_OPEN && t->state != TCP_DRAINING)
        return;
    bool hup = (events & (EPOLLERR | EPOLLHUP)) != 0;
    if (hup || ((events & EPOLLIN) && !t->base.read_paused))
        tcp_on_readable(t, hup);
}

static void tcp_set_read(kvp_conn_t *c, bool on)
{
    tcp_conn_t *t = (tcp_conn_t *)c;
    c->read_paused = !on;
    if (t->state == TCP_OPEN)
        tcp_update_events(t);
}

static size_t tcp_queued(const kvp_conn_t *c)
{
    const tcp_conn_t *t = (const tcp_conn_t *)c;
    return t->wlen - t->whead;
}

static kvp_status_t tcp_append(tcp_conn_t *t, const uint8_t *p, size_t len)
{
    if (t->whead > 0 && t->wlen + len > t->wcap) {
        memmove(t->wbuf, t->wbuf + t->whead, t->wlen - t->whead);
        t->wlen -= t->whead;
        t->whead = 0;
    }
    if (t->wlen + len > t->wcap) {
        size_t cap = t->wcap ? t->wcap : 64 * 1024;
        while (cap < t->wlen + len)
            cap *= 2;
        uint8_t *b = kvp__realloc(t->wbuf, cap);
        if (!b)
            return KVP_ERR_NOMEM;
        t->wbuf = b;
        t->wcap = cap;
    }
    memcpy(t->wbuf + t->wlen, p, len);
    t->wlen += len;
    return KVP_OK;
}

static kvp_status_t tcp_write(kvp_conn_t *c, const void *data, size_t len)
{
    tcp_conn_t *t = (tcp_conn_t *)c;
    if (t->state != TCP_OPEN && t->state != TCP_CONNECTING)
        return KVP_ERR_CLOSED;
    size_t queued = tcp_queued(c);
    if (queued + len > c->wbuf_max)
        return KVP_ERR_LIMIT;
    const uint8_t *p = data;
    if (queued == 0 && t->state == TCP_OPEN) {
        ssize_t n = send(t->fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            tcp_break(t, KVP_ERR_IO);
            return KVP_OK; /* the failure is reported through closed() */
        }
        if (n > 0) {
            p += n;
            len -= (size_t)n;
        }
        if (len == 0)
            return KVP_OK;
    }
    kvp_status_t st = tcp_append(t, p, len);
    if (st == KVP_OK)
        tcp_update_events(t);
    return st;
}

static void tcp_close(kvp_conn_t *c, bool graceful)
{
    tcp_conn_t *t = (tcp_conn_t *)c;
    kvp_conn_detach(c);
    c->read_paused = false; /* draining reads (and discards) to EOF */
    if (graceful && t->state == TCP_OPEN) {
        tcp_set_state(t, TCP_DRAINING);
        kvp_timer_start(c->loop, &t->ev, kvp_loop_now(c->loop) + c->linger_ns);
        tcp_flush(t);
        return;
    }
    tcp_set_state(t, TCP_DEAD);
    kvp_io_stop(c->loop, &t->io);
    kvp_timer_start(c->loop, &t->ev, kvp_loop_now(c->loop));
}

static void tcp_destroy(kvp_conn_t *c)
{
    tcp_free((tcp_conn_t *)c);
}

/* One endpoint as bytes: family, port, address (IPv4-mapped IPv6 as IPv4,
 * so a dual-stack listener and an IPv4 dialer agree). 0 if not IP. */
static size_t endpoint_bytes(const struct sockaddr_storage *ss, uint8_t out[20])
{
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;
    if (ss->ss_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;
        out[0] = 4;
        memcpy(out + 1, &s4->sin_port, 2);
        memcpy(out + 3, &s4->sin_addr, 4);
        return 7;
    }
    if (ss->ss_family != AF_INET6)
        return 0;
    if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
        out[0] = 4;
        memcpy(out + 1, &s6->sin6_port, 2);
        memcpy(out + 3, s6->sin6_addr.s6_addr + 12, 4);
        return 7;
    }
    out[0] = 6;
    memcpy(out + 1, &s6->sin6_port, 2);
    memcpy(out + 3, &s6->sin6_addr, 16);
    return 19;
}

/* Issue 27: both endpoints, sorted, hashed: what the same-host proof is
 * bound to (a relay holds two connections, never this one at both ends). */
static uint64_t tcp_binding(const kvp_conn_t *c)
{
    const tcp_conn_t *t = (const tcp_conn_t *)c;
    struct sockaddr_storage a, b;
    socklen_t la = sizeof(a), lb = sizeof(b);
    uint8_t ea[20], eb[20], both[40];
    if (t->fd < 0 || getsockname(t->fd, (struct sockaddr *)&a, &la) != 0 ||
        getpeername(t->fd, (struct sockaddr *)&b, &lb) != 0)
        return 0;
    size_t na = endpoint_bytes(&a, ea), nb = endpoint_bytes(&b, eb);
    if (na == 0 || nb == 0)
        return 0;
    bool swap = na > nb || (na == nb && memcmp(ea, eb, na) > 0);
    memcpy(both, swap ? eb : ea, swap ? nb : na);
    memcpy(both + (swap ? nb : na), swap ? ea : eb, swap ? na : nb);
    uint64_t h = kvp_hash64(both, na + nb, 0);
    return h ? h : 1;
}

static const kvp_conn_ops_t tcp_ops = {
    .name = "tcp",
    .set_read = tcp_set_read,
    .write = tcp_write,
    .queued = tcp_queued,
    .close = tcp_close,
    .destroy = tcp_destroy,
    .binding = tcp_binding,
};

/* ------------------------------------------------------------ dial/listen */

kvp_status_t kvp_tcp_dial(kvp_loop_t *loop, const char *addr, size_t wbuf_max,
                          const kvp_conn_handler_t *h, void *owner, kvp_conn_t **out)
{
    struct sockaddr_storage ss;
    unsigned sslen;
    kvp_status_t st = kvp_tcp_parse_addr(addr, &ss, &sslen);
    if (st != KVP_OK)
        return st;
    return kvp_tcp_dial_ss(loop, &ss, sslen, addr, wbuf_max, h, owner, out);
}

kvp_status_t kvp_tcp_dial_ss(kvp_loop_t *loop, const void *sa, unsigned sslen, const char *addr,
                             size_t wbuf_max, const kvp_conn_handler_t *h, void *owner,
                             kvp_conn_t **out)
{
    struct sockaddr_storage ss;
    kvp_status_t st;
    if (sslen > sizeof(ss))
        return KVP_ERR_INVALID;
    memcpy(&ss, sa, sslen);
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return KVP_ERR_IO;
    tcp_conn_t *t;
    st = tcp_conn_new(loop, fd, wbuf_max, &t);
    if (st != KVP_OK)
        goto err_fd;
    tcp_set_state(t, TCP_CONNECTING);
    t->base.h = h;
    t->base.owner = owner;
    (void)addr; /* numeric, as for accepted connections (kvp_link_remote_host) */
    tcp_format_addr(&ss, t->base.remote, sizeof(t->base.remote));
    st = kvp_io_start(loop, &t->io, fd, EPOLLOUT, tcp_on_io, t);
    if (st != KVP_OK)
        goto err_conn;
    if (connect(fd, (struct sockaddr *)&ss, sslen) != 0 && errno != EINPROGRESS)
        tcp_break(t, KVP_ERR_IO); /* reported from the loop */
    *out = &t->base;
    return KVP_OK;

err_conn:
    t->fd = -1;
    tcp_free(t);
err_fd:
    close(fd);
    return st;
}

static void tcp_on_accept(kvp_io_t *io, uint32_t events);

static void tcp_listener_resume(kvp_timer_t *t)
{
    tcp_listener_t *l = t->data;
    if (!l->io.active)
        kvp_io_start(l->loop, &l->io, l->fd, EPOLLIN, tcp_on_accept, l);
}

/* accept() failed with err (not EAGAIN/EINTR): shed and back off. */
static void tcp_accept_failed(tcp_listener_t *l, int err)
{
    uint64_t now = kvp_loop_now(l->loop), sup = 0;
    bool fds = err == EMFILE || err == ENFILE;
    if (fds) {
        l->base.fd_exhausted++;
        if (l->reserve_fd >= 0) {
            close(l->reserve_fd);
            int fd = accept(l->fd, NULL, NULL);
            if (fd >= 0)
                close(fd);
            l->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        }
    }
    if (kvp_ratelimit_allow(&l->rl, now, &sup))
        KVP_WARN(NULL, "listener %s: accept: %s%s (not accepting for %llu ms; %llu such lines "
                 "suppressed)", l->base.addr, strerror(err),
                 fds ? ": out of file descriptors, raise the limit (LimitNOFILE / ulimit -n)" : "",
                 (unsigned long long)(TCP_ACCEPT_BACKOFF_NS / KVP_NSEC_PER_MSEC),
                 (unsigned long long)sup);
    kvp_io_stop(l->loop, &l->io);
    kvp_timer_start(l->loop, &l->t_resume, now + TCP_ACCEPT_BACKOFF_NS);
}

static void tcp_on_accept(kvp_io_t *io, uint32_t events)
{
    tcp_listener_t *l = io->data;
    for (int i = 0; i < 64; i++) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        int fd = accept4(l->fd, (struct sockaddr *)&ss, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                errno != ECONNABORTED)
                tcp_accept_failed(l, errno);
            return;
        }
        tcp_conn_t *t;
        if (tcp_conn_new(l->loop, fd, l->wbuf_max, &t) != KVP_OK) {
            close(fd);
            continue;
        }
        tcp_set_state(t, TCP_OPEN);
        tcp_format_addr(&ss, t->base.remote, sizeof(t->base.remote));
        if (kvp_io_start(l->loop, &t->io, fd, EPOLLIN, tcp_on_io, t) != KVP_OK) {
            tcp_free(t);
            continue;
        }
        l->base.on_accept(&l->base, &t->base);
    }
}

static void tcp_listener_close(kvp_listener_t *base)
{
    tcp_listener_t *l = (tcp_listener_t *)base;
    kvp_io_stop(l->loop, &l->io);
    kvp_timer_stop(l->loop, &l->t_resume);
    close(l->fd);
    if (l->reserve_fd >= 0)
        close(l->reserve_fd);
    kvp__free(l);
}

static kvp_status_t tcp_bind(int fd, const struct sockaddr_storage *ss, unsigned sslen)
{
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (const struct sockaddr *)ss, sslen) != 0 || listen(fd, 512) != 0)
        return KVP_ERR_IO;
    return KVP_OK;
}

kvp_status_t kvp_tcp_listen(kvp_loop_t *loop, const char *addr, size_t wbuf_max,
                            kvp_accept_cb cb, void *owner, kvp_listener_t **out)
{
    struct sockaddr_storage ss;
    unsigned sslen;
    kvp_status_t st = kvp_tcp_parse_addr(addr, &ss, &sslen);
    if (st != KVP_OK)
        return st;
    tcp_listener_t *l = kvp__calloc(1, sizeof(*l));
    if (!l)
        return KVP_ERR_NOMEM;
    l->reserve_fd = -1;
    l->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (l->fd < 0 || tcp_bind(l->fd, &ss, sslen) != KVP_OK) {
        int e = errno;
        KVP_ERROR(NULL, "listen %s: %s", addr, strerror(e));
        errno = e;
        st = KVP_ERR_IO;
        goto err_sock;
    }
    socklen_t len = sizeof(ss);
    getsockname(l->fd, (struct sockaddr *)&ss, &len);
    tcp_format_addr(&ss, l->base.addr, sizeof(l->base.addr));
    l->loop = loop;
    l->wbuf_max = wbuf_max;
    l->base.close = tcp_listener_close;
    l->base.on_accept = cb;
    l->base.owner = owner;
    l->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    kvp_timer_init(&l->t_resume, "accept-backoff", tcp_listener_resume, l);
    kvp_ratelimit_init(&l->rl, KVP_NSEC_PER_SEC, 1);
    st = kvp_io_start(loop, &l->io, l->fd, EPOLLIN, tcp_on_accept, l);
    if (st != KVP_OK)
        goto err_sock;
    *out = &l->base;
    return KVP_OK;

err_sock:; /* errno kept for the caller (kvp_last_error: EADDRINUSE, EACCES, ...) */
    int e = errno;
    if (l->fd >= 0)
        close(l->fd);
    if (l->reserve_fd >= 0)
        close(l->reserve_fd);
    kvp__free(l);
    errno = e;
    return st;
}
