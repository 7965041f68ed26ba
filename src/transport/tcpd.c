/*
 * tcpd.c -- kvpeer's own tcp data stream: progress, open, close (see tcpd.h for
 * the wire and why; tcpd_in.c receives, tcpd_out.c sends).
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
#include "transport/tcpd_int.h"

#include "ctl/conn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

static const char *const in_state_names[] = {
    [IN_PREAUTH] = "preauth", [IN_HDR] = "header", [IN_DATA] = "data", [IN_DEAD] = "dead"};
static const char *const out_state_names[] = {
    [OUT_CONNECTING] = "connecting", [OUT_OPEN] = "open", [OUT_FAILED] = "failed"};

void kvp__tcpd_in_set_state(tcpd_in_t *c, uint8_t to)
{
    static const uint8_t legal[] = {
        [IN_PREAUTH] = 1u << IN_PREAUTH, /* a new record (zeroed) */
        [IN_HDR] = (1u << IN_PREAUTH) | (1u << IN_DATA),
        [IN_DATA] = 1u << IN_HDR,
        [IN_DEAD] = 0xf,
    };
    KVP_ASSERT(to < KVP_ARRAY_SIZE(legal) && c->state < KVP_ARRAY_SIZE(legal));
    if (!(legal[to] & (1u << c->state)))
        kvp__assert_fail(in_state_names[to], __FILE__, __LINE__, in_state_names[c->state]);
    c->state = to;
}

void kvp__tcpd_out_set_state(kvp_tcpd_out_t *o, uint8_t to)
{
    static const uint8_t legal[] = {
        [OUT_CONNECTING] = 1u << OUT_CONNECTING, /* a new record (zeroed) */
        [OUT_OPEN] = 1u << OUT_CONNECTING,
        [OUT_FAILED] = (1u << OUT_CONNECTING) | (1u << OUT_OPEN),
    };
    KVP_ASSERT(to < KVP_ARRAY_SIZE(legal) && o->state < KVP_ARRAY_SIZE(legal));
    if (!(legal[to] & (1u << o->state)))
        kvp__assert_fail(out_state_names[to], __FILE__, __LINE__, out_state_names[o->state]);
    o->state = to;
}

uint64_t kvp__tcpd_now_ns(void)
{
    return kvp_clock_now(kvp_clock_real());
}

void kvp__tcpd_addr_str(const struct sockaddr_storage *ss, char *buf, size_t cap)
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

int kvp__tcpd_ep_set(kvp_tcpd_t *t, int op, int fd, uint32_t events, void *ptr)
{
    struct epoll_event ev = {.events = events, .data.ptr = ptr};
    return epoll_ctl(t->epfd, op, fd, &ev);
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
            kvp__tcpd_in_close(t, c, "no preface before the deadline");
        }
    }
    kvp_list_foreach_safe(pos, tmp, &t->outs)
    {
        kvp_tcpd_out_t *o = KVP_CONTAINER_OF(pos, kvp_tcpd_out_t, link);
        if (o->state == OUT_CONNECTING && now >= o->deadline_ns) {
            char why[128];
            snprintf(why, sizeof(why), "connect to %s: no answer within %u ms", o->name,
                     t->cfg.connect_timeout_ms);
            kvp__tcpd_out_fail(o, why);
        }
    }
    if (t->paused && now >= t->resume_ns &&
        kvp__tcpd_ep_set(t, EPOLL_CTL_ADD, t->lfd, EPOLLIN, t) == 0)
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
        kvp__tcpd_on_accept(t);
    } else if (kind == K_IN) {
        tcpd_in_t *c = ptr;
        if (c->state != IN_DEAD)
            kvp__tcpd_in_read(t, c);
    } else {
        kvp_tcpd_out_t *o = ptr;
        if (o->state == OUT_CONNECTING)
            kvp__tcpd_out_connected(o);
        else if (o->state == OUT_OPEN && (events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP | EPOLLIN)))
            kvp__tcpd_out_fail(o, "connection closed by the consumer");
        else if (o->state == OUT_OPEN)
            kvp__tcpd_out_write(o);
    }
}

bool kvp__tcpd_progress(kvp_tcpd_t *t)
{
    struct epoll_event ev[64];
    bool any = false;
    uint64_t now = kvp__tcpd_now_ns();

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
        kvp__tcpd_addr_str(&ss, a, sizeof(a));
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
    kvp__tcpd_addr_str(&ss, a, sizeof(a));
    KVP_INFO(t->prefix, "data stream listening on %s (kvpeer's own tcp data path)", a);
    return kvp__tcpd_ep_set(t, EPOLL_CTL_ADD, t->lfd, EPOLLIN, t) == 0 ? KVP_OK : KVP_ERR_IO;
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
            kvp__tcpd_in_set_state(c, IN_DEAD);
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

