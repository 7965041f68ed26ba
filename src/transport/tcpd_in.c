/* tcpd_in.c -- kvpeer's own tcp data stream: the listener and receiving
 * (preface, header, piece, land; the doors: caps, eviction, deadline, EMFILE). */
#include "transport/tcpd_int.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

static bool tcpd_same_ip(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
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

/* ------------------------------------------------------------ receiving */

void kvp__tcpd_in_close(kvp_tcpd_t *t, tcpd_in_t *c, const char *why)
{
    if (c->state == IN_DEAD)
        return;
    char a[80];
    kvp__tcpd_addr_str(&c->peer, a, sizeof(a));
    KVP_LOG_RL(&t->rl, kvp__tcpd_now_ns(), KVP_LOG_WARN, t->prefix,
               "data stream from %s closed: %s", a,
               why);
    if (c->state == IN_PREAUTH)
        t->n_preauth--;
    else
        t->n_open--;
    close(c->fd); /* also leaves the epoll set */
    c->fd = -1;
    kvp__tcpd_in_set_state(c, IN_DEAD);
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
        kvp__tcpd_in_close(t, c, "no valid preface (not a kvpeer peer holding our blob)");
        return;
    }
    if (t->n_open >= t->cfg.max_open) {
        t->st.refused_open_cap++;
        kvp__tcpd_in_close(t, c, "too many data streams (max_open)");
        return;
    }
    c->buf = kvp__malloc(KVP_TCPD_PIECE_MAX);
    if (c->buf == NULL) {
        kvp__tcpd_in_close(t, c, "no memory");
        return;
    }
    t->n_preauth--;
    t->n_open++;
    t->st.authenticated++;
    c->src_token = p->src_token;
    kvp__tcpd_in_set_state(c, IN_HDR);
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
            kvp__tcpd_in_close(t, c, "bad piece header");
            return;
        }
        kvp__tcpd_in_set_state(c, IN_DATA);
    } else {
        t->st.pieces_in++;
        t->st.bytes_in += c->hdr.len;
        kvp__tcpd_in_set_state(c, IN_HDR);
        t->cbs.land(t->cbs.arg, c->src_token, &c->hdr, c->buf);
    }
}

void kvp__tcpd_in_read(kvp_tcpd_t *t, tcpd_in_t *c)
{
    size_t budget = TCPD_READ_BUDGET;
    while (c->state != IN_DEAD && budget > 0) {
        size_t want;
        uint8_t *dst = in_dst(c, &want);
        ssize_t n = recv(c->fd, dst, want, 0);
        if (n == 0) {
            kvp__tcpd_in_close(t, c, c->state == IN_HDR && c->got == 0 ? "closed by the source"
                                                             : "closed mid-frame");
            return;
        }
        if (n < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return;
            if (errno == EINTR)
                continue;
            kvp__tcpd_in_close(t, c, strerror(errno));
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
        n += tcpd_same_ip(&KVP_CONTAINER_OF(p, tcpd_in_t, link)->peer, ss);
    return n;
}

static void listen_pause(kvp_tcpd_t *t, int err)
{
    uint64_t now = kvp__tcpd_now_ns();
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
               err == EMFILE || err == ENFILE ? ": out of file descriptors, raise LimitNOFILE"
                                              : "");
    (void)epoll_ctl(t->epfd, EPOLL_CTL_DEL, t->lfd, NULL);
    t->paused = true;
    t->resume_ns = now + TCPD_BACKOFF_NS;
}

static void refuse(kvp_tcpd_t *t, int fd, const struct sockaddr_storage *ss, uint64_t *counter,
                   const char *why)
{
    char a[80];
    kvp__tcpd_addr_str(ss, a, sizeof(a));
    (*counter)++;
    KVP_LOG_RL(&t->rl, kvp__tcpd_now_ns(), KVP_LOG_WARN, t->prefix,
               "data stream from %s refused: %s", a,
               why);
    close(fd);
}

void kvp__tcpd_on_accept(kvp_tcpd_t *t)
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
            kvp__tcpd_in_close(t, old, "evicted: too many unauthenticated streams");
        }
        tcpd_in_t *c = kvp__calloc(1, sizeof(*c));
        if (c == NULL) {
            close(fd);
            continue;
        }
        c->kind = K_IN;
        kvp__tcpd_in_set_state(c, IN_PREAUTH);
        c->fd = fd;
        c->peer = ss;
        c->deadline_ns =
            kvp__tcpd_now_ns() + (uint64_t)t->cfg.preauth_timeout_ms * KVP_NSEC_PER_MSEC;
        if (kvp__tcpd_ep_set(t, EPOLL_CTL_ADD, fd, EPOLLIN, c) != 0) {
            close(fd);
            kvp__free(c);
            continue;
        }
        kvp_list_insert_tail(&t->preauth, &c->link);
        t->n_preauth++;
        kvp__tcpd_in_read(t, c); /* the preface is usually here already */
    }
}

