/*
 * pcred.c -- a same-host peer's process, proven by SO_PEERCRED and watched
 * by a pidfd (issue 27 item 8; see pcred.h for the why and the protocol).
 *
 * Objects (all owned by kvp_pcred_t, freed at close):
 *   pc_conn   an inbound connection, pending until its claim matched a
 *             watch (then closed), or closed at the deadline / on garbage;
 *   pc_out    an outbound connection (we are the source), held open until
 *             the consumer closes it (its liveness check needs it open);
 *   pc_watch  a peer we consume from: its claim, then its pidfd.
 * The epoll set only wakes the owner; progress() scans the (few, short
 * lived) connections, so nothing is freed under an epoll batch.
 */
#include "transport/pcred.h"

#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#define PC_NAME_SALT 0x6b76706565727063ull /* names: a hash of the secret, not the secret */
#define PC_CLAIM_SALT 0x636c61696d706964ull

typedef struct pc_conn {
    kvp_list_t link;
    int fd;
    pid_t pid;
    uint32_t got;
    bool matched_once; /* its whole claim was read and matched against the watches */
    uint8_t buf[sizeof(kvp_pcred_msg_t)];
    uint64_t deadline_ns;
} pc_conn_t;

typedef struct pc_out {
    kvp_list_t link;
    uint64_t id;
    int fd;
    uint64_t deadline_ns;
} pc_out_t;

typedef struct pc_watch {
    kvp_list_t link;
    uint64_t id, claim;
    int pidfd; /* -1 until proven */
    pid_t pid;
    uint32_t holds;
    bool removed, exited;
} pc_watch_t;

struct kvp_pcred {
    const char *pfx;
    const kvp_clock_t *clock;
    int lfd, epfd;
    uid_t uid;
    uint32_t max_pending, max_watches, n_pending, n_pidfds;
    uint64_t timeout_ns;
    bool no_pidfd; /* pidfd_open said ENOSYS: no proof here (logged once) */
    kvp_list_t conns, outs, watches;
    kvp_pcred_stats_t st;
    kvp_ratelimit_t rl;
};

void kvp__pcred_name(uint64_t secret, char buf[KVP_PCRED_NAME_MAX])
{
    snprintf(buf, KVP_PCRED_NAME_MAX, "kvpeer-pid-%016llx",
             (unsigned long long)kvp_hash64(&secret, sizeof(secret), PC_NAME_SALT));
}

uint64_t kvp__pcred_claim(uint64_t mark)
{
    return kvp_hash64(&mark, sizeof(mark), PC_CLAIM_SALT);
}

static socklen_t pc_addr(uint64_t secret, struct sockaddr_un *a)
{
    char name[KVP_PCRED_NAME_MAX];
    kvp__pcred_name(secret, name);
    memset(a, 0, sizeof(*a));
    a->sun_family = AF_UNIX;
    size_t n = strlen(name);
    memcpy(a->sun_path + 1, name, n); /* sun_path[0] = 0: abstract */
    return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + n);
}

static void pc_epoll_add(kvp_pcred_t *pc, int fd, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.fd = fd};
    (void)epoll_ctl(pc->epfd, EPOLL_CTL_ADD, fd, &ev);
}

kvp_status_t kvp__pcred_open(const kvp_pcred_config_t *cfg, kvp_pcred_t **out)
{
    if (!cfg || !out || cfg->secret == 0)
        return KVP_ERR_INVALID;
    kvp_pcred_t *pc = kvp__calloc(1, sizeof(*pc));
    if (!pc)
        return KVP_ERR_NOMEM;
    pc->pfx = cfg->log_prefix ? cfg->log_prefix : "pcred";
    pc->clock = cfg->clock ? cfg->clock : kvp_clock_real();
    pc->uid = geteuid();
    pc->max_pending = cfg->max_pending ? cfg->max_pending : 16;
    pc->max_watches = cfg->max_watches ? cfg->max_watches : 1024;
    pc->timeout_ns = (uint64_t)(cfg->timeout_ms ? cfg->timeout_ms : 5000) * KVP_NSEC_PER_MSEC;
    kvp_list_init(&pc->conns);
    kvp_list_init(&pc->outs);
    kvp_list_init(&pc->watches);
    kvp_ratelimit_init(&pc->rl, KVP_NSEC_PER_SEC, 10);
    struct sockaddr_un a;
    socklen_t alen = pc_addr(cfg->secret, &a);
    pc->epfd = epoll_create1(EPOLL_CLOEXEC);
    pc->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (pc->epfd < 0 || pc->lfd < 0 || bind(pc->lfd, (struct sockaddr *)&a, alen) != 0 ||
        listen(pc->lfd, 64) != 0) {
        KVP_WARN(pc->pfx, "process-exit proof: unix listener: %s (same-host sources' exits "
                          "prove nothing here)", strerror(errno));
        if (pc->lfd >= 0)
            close(pc->lfd);
        if (pc->epfd >= 0)
            close(pc->epfd);
        kvp__free(pc);
        return KVP_ERR_IO;
    }
    pc_epoll_add(pc, pc->lfd, EPOLLIN);
    *out = pc;
    return KVP_OK;
}

static void conn_close(kvp_pcred_t *pc, pc_conn_t *c)
{
    close(c->fd); /* also leaves the epoll set */
    kvp_list_remove(&c->link);
    pc->n_pending--;
    kvp__free(c);
}

static void out_close(pc_out_t *o)
{
    close(o->fd);
    kvp_list_remove(&o->link);
    kvp__free(o);
}

static void watch_free(kvp_pcred_t *pc, pc_watch_t *w)
{
    if (w->pidfd >= 0) {
        close(w->pidfd);
        pc->n_pidfds--;
    }
    kvp_list_remove(&w->link);
    kvp__free(w);
}

void kvp__pcred_close(kvp_pcred_t *pc)
{
    if (pc == NULL)
        return;
    while (!kvp_list_empty(&pc->conns))
        conn_close(pc, KVP_CONTAINER_OF(pc->conns.next, pc_conn_t, link));
    while (!kvp_list_empty(&pc->outs))
        out_close(KVP_CONTAINER_OF(pc->outs.next, pc_out_t, link));
    while (!kvp_list_empty(&pc->watches))
        watch_free(pc, KVP_CONTAINER_OF(pc->watches.next, pc_watch_t, link));
    close(pc->lfd);
    close(pc->epfd);
    kvp__free(pc);
}

int kvp__pcred_fd(const kvp_pcred_t *pc)
{
    return pc->epfd;
}

static pc_watch_t *watch_find(kvp_pcred_t *pc, uint64_t id)
{
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &pc->watches)
    {
        pc_watch_t *w = KVP_CONTAINER_OF(p, pc_watch_t, link);
        if (w->id == id)
            return w;
    }
    return NULL;
}

/* ------------------------------------------------------- consumer side */

static void pc_accept(kvp_pcred_t *pc)
{
    for (int k = 0; k < 64; k++) {
        int fd = accept4(pc->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return; /* EAGAIN, or out of fds: the backlog waits (level-triggered) */
        pc->st.accepted++;
        struct ucred cr;
        socklen_t len = sizeof(cr);
        const char *why = NULL;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) != 0 || len != sizeof(cr)) {
            why = "no peer credentials";
            pc->st.refused_pid++;
        } else if (cr.uid != pc->uid) { /* another user cannot prove our peer's process */
            why = "another uid";
            pc->st.refused_uid++;
        } else if (cr.pid <= 0) { /* not visible in our pid namespace */
            why = "no pid in our pid namespace";
            pc->st.refused_pid++;
        }
        if (why != NULL) {
            KVP_LOG_RL(&pc->rl, kvp_clock_now(pc->clock), KVP_LOG_WARN, pc->pfx,
                       "process-exit proof: unix connection refused (%s, uid %u)", why,
                       (unsigned)(len == sizeof(cr) ? cr.uid : 0));
            close(fd);
            continue;
        }
        if (pc->n_pending >= pc->max_pending) {
            /* Full: the oldest pending goes (a flood cannot keep a fresh
             * source out for a whole deadline; a real claim matches at once
             * or as soon as its peer is added). */
            pc->st.refused_cap++;
            KVP_LOG_RL(&pc->rl, kvp_clock_now(pc->clock), KVP_LOG_WARN, pc->pfx,
                       "process-exit proof: %u unix connections pending: the oldest closed",
                       pc->max_pending);
            conn_close(pc, KVP_CONTAINER_OF(pc->conns.next, pc_conn_t, link));
        }
        pc_conn_t *c = kvp__calloc(1, sizeof(*c));
        if (c == NULL) {
            close(fd);
            continue;
        }
        c->fd = fd;
        c->pid = cr.pid;
        c->deadline_ns = kvp_clock_now(pc->clock) + pc->timeout_ns;
        kvp_list_insert_tail(&pc->conns, &c->link);
        pc->n_pending++;
        pc_epoll_add(pc, fd, EPOLLIN | EPOLLRDHUP);
    }
}

int kvp__pidfd_open(pid_t pid)
{
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, pid, 0);
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

/* Whether the connection's other end is still open (nothing to read is
 * expected after the claim: data counts as open, EOF/HUP as closed). */
static bool conn_alive(int fd)
{
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) < 0)
        return false;
    return (p.revents & (POLLHUP | POLLRDHUP | POLLERR)) == 0;
}

/* A whole claim arrived on c: match it; true when c is done with. */
static bool conn_match(kvp_pcred_t *pc, pc_conn_t *c)
{
    kvp_pcred_msg_t m;
    memcpy(&m, c->buf, sizeof(m));
    pc_watch_t *w = NULL;
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &pc->watches)
    {
        pc_watch_t *x = KVP_CONTAINER_OF(p, pc_watch_t, link);
        if (!x->removed && x->pidfd < 0 && x->claim == m.claim)
            w = x;
    }
    if (w == NULL)
        return false; /* its peer may not be added yet: pending until the deadline */
    if (pc->n_pidfds >= pc->max_watches) {
        KVP_LOG_RL(&pc->rl, kvp_clock_now(pc->clock), KVP_LOG_WARN, pc->pfx,
                   "peer %llu: process-exit proof: %u pidfds open already: not watched",
                   (unsigned long long)w->id, pc->max_watches);
        return true;
    }
    int pidfd = kvp__pidfd_open(c->pid);
    if (pidfd < 0) {
        if (errno == ENOSYS && !pc->no_pidfd)
            KVP_WARN(pc->pfx, "process-exit proof: pidfd_open unsupported by this kernel: "
                              "same-host sources' exits prove nothing here");
        pc->no_pidfd |= errno == ENOSYS;
        pc->st.closed_dead += errno == ESRCH;
        return true;
    }
    /* The pid was the connector's at connect(); it holds the connection
     * until we close it. Still open now, after pidfd_open: the pidfd names
     * that very process (a dead one's end would be closed, and its pid
     * could have been reused). */
    if (!conn_alive(c->fd)) {
        close(pidfd);
        pc->st.closed_dead++;
        KVP_LOG_RL(&pc->rl, kvp_clock_now(pc->clock), KVP_LOG_WARN, pc->pfx,
                   "peer %llu: process-exit proof: its connection closed before its pid was "
                   "watched: not watched", (unsigned long long)w->id);
        return true;
    }
    w->pidfd = pidfd;
    w->pid = c->pid;
    pc->n_pidfds++;
    pc->st.watched++;
    KVP_INFO(pc->pfx, "peer %llu: its process (pid %d) watched: its exit will be proof",
             (unsigned long long)w->id, (int)c->pid);
    return true;
}

/* Read what c has; true when c is done with (matched, garbage, closed). */
static bool conn_read(kvp_pcred_t *pc, pc_conn_t *c)
{
    while (c->got < sizeof(c->buf)) {
        ssize_t r = read(c->fd, c->buf + c->got, sizeof(c->buf) - c->got);
        if (r > 0) {
            c->got += (uint32_t)r;
            continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EINTR))
            return false;
        pc->st.closed_garbage++; /* EOF or error before a whole claim */
        return true;
    }
    if (c->matched_once && !conn_alive(c->fd)) {
        pc->st.closed_garbage++; /* a claim nobody expects, and its sender left */
        return true;
    }
    kvp_pcred_msg_t m;
    memcpy(&m, c->buf, sizeof(m));
    if (m.magic != KVP_PCRED_MAGIC || m.version != KVP_PCRED_VERSION) {
        pc->st.closed_garbage++;
        KVP_LOG_RL(&pc->rl, kvp_clock_now(pc->clock), KVP_LOG_WARN, pc->pfx,
                   "process-exit proof: pid %d sent no claim: closed", (int)c->pid);
        return true;
    }
    c->matched_once = true;
    return conn_match(pc, c);
}

void kvp__pcred_watch(kvp_pcred_t *pc, uint64_t id, uint64_t claim)
{
    pc_watch_t *w = kvp__calloc(1, sizeof(*w));
    if (w == NULL)
        return;
    w->id = id;
    w->claim = claim;
    w->pidfd = -1;
    kvp_list_insert_tail(&pc->watches, &w->link);
    kvp_list_t *p, *t; /* a claim that came before its peer */
    kvp_list_foreach_safe(p, t, &pc->conns)
    {
        pc_conn_t *c = KVP_CONTAINER_OF(p, pc_conn_t, link);
        if (c->got == sizeof(c->buf) && conn_match(pc, c))
            conn_close(pc, c);
    }
}

void kvp__pcred_unwatch(kvp_pcred_t *pc, uint64_t id)
{
    pc_watch_t *w = watch_find(pc, id);
    if (w == NULL)
        return;
    w->removed = true;
    if (w->holds == 0)
        watch_free(pc, w);
}

bool kvp__pcred_hold(kvp_pcred_t *pc, uint64_t id)
{
    pc_watch_t *w = watch_find(pc, id);
    if (w == NULL || w->pidfd < 0)
        return false;
    w->holds++;
    return true;
}

void kvp__pcred_drop(kvp_pcred_t *pc, uint64_t id)
{
    pc_watch_t *w = watch_find(pc, id);
    KVP_ASSERT(w != NULL && w->holds > 0); /* dropped only by a holder */
    if (--w->holds == 0 && w->removed)
        watch_free(pc, w); /* its pidfd closes with its last holder */
}

bool kvp__pcred_exited(kvp_pcred_t *pc, uint64_t id)
{
    pc_watch_t *w = watch_find(pc, id);
    if (w == NULL || w->pidfd < 0)
        return false;
    if (w->exited)
        return true;
    if (KVP_MUTATED(KVP_MUT_EXIT_PROOF_ALIVE))
        return true; /* test-only mutation: the pidfd not looked at */
    struct pollfd p = {.fd = w->pidfd, .events = POLLIN};
    if (poll(&p, 1, 0) == 1 && (p.revents & POLLIN)) {
        w->exited = true; /* the whole process exited: its mm is gone */
        pc->st.exits_seen++;
        KVP_INFO(pc->pfx, "peer %llu: its process (pid %d) exited", (unsigned long long)w->id,
                 (int)w->pid);
    }
    return w->exited;
}

/* --------------------------------------------------------- source side */

void kvp__pcred_tell(kvp_pcred_t *pc, uint64_t id, uint64_t peer_secret, uint64_t claim,
                     int *listener_pid)
{
    if (listener_pid != NULL)
        *listener_pid = 0;
    struct sockaddr_un a;
    socklen_t alen = pc_addr(peer_secret, &a);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    kvp_pcred_msg_t m = {KVP_PCRED_MAGIC, KVP_PCRED_VERSION, claim};
    if (fd < 0)
        return;
    /* A unix connect completes at once or fails (another netns: ENOENT /
     * ECONNREFUSED; a full backlog: EAGAIN): no proof then, nothing else. */
    if (connect(fd, (struct sockaddr *)&a, alen) != 0 ||
        write(fd, &m, sizeof(m)) != (ssize_t)sizeof(m)) {
        KVP_DEBUG(pc->pfx, "peer %llu: process-exit side channel: %s (no proof of our exit "
                           "there)", (unsigned long long)id, strerror(errno));
        close(fd);
        return;
    }
    struct ucred cr;
    socklen_t crlen = sizeof(cr);
    if (listener_pid != NULL && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crlen) == 0 &&
        crlen == sizeof(cr) && cr.uid == pc->uid && cr.pid > 0)
        *listener_pid = (int)cr.pid;
    pc_out_t *o = kvp__calloc(1, sizeof(*o));
    if (o == NULL) {
        close(fd);
        return;
    }
    o->id = id;
    o->fd = fd;
    o->deadline_ns = kvp_clock_now(pc->clock) + pc->timeout_ns;
    kvp_list_insert_tail(&pc->outs, &o->link);
    pc->st.told++;
    pc_epoll_add(pc, fd, EPOLLIN | EPOLLRDHUP);
}

void kvp__pcred_untell(kvp_pcred_t *pc, uint64_t id)
{
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &pc->outs)
    {
        pc_out_t *o = KVP_CONTAINER_OF(p, pc_out_t, link);
        if (o->id == id)
            out_close(o);
    }
}

/* ------------------------------------------------------------ progress */

bool kvp__pcred_progress(kvp_pcred_t *pc)
{
    struct epoll_event ev[16];
    int n = epoll_wait(pc->epfd, ev, (int)KVP_ARRAY_SIZE(ev), 0);
    bool any = n > 0;
    if (n <= 0 && kvp_list_empty(&pc->conns) && kvp_list_empty(&pc->outs))
        return false;
    uint64_t now = kvp_clock_now(pc->clock);
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &pc->conns)
    {
        pc_conn_t *c = KVP_CONTAINER_OF(p, pc_conn_t, link);
        if (conn_read(pc, c)) {
            conn_close(pc, c);
        } else if (now >= c->deadline_ns) {
            pc->st.closed_timeout++;
            conn_close(pc, c);
        }
    }
    kvp_list_foreach_safe(p, t, &pc->outs)
    {
        pc_out_t *o = KVP_CONTAINER_OF(p, pc_out_t, link);
        uint8_t b[64];
        ssize_t r = read(o->fd, b, sizeof(b)); /* the consumer sends nothing: EOF */
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR) || r > 0 ||
            now >= o->deadline_ns)
            out_close(o);
    }
    pc_accept(pc);
    return any;
}

void kvp__pcred_stats(const kvp_pcred_t *pc, kvp_pcred_stats_t *st)
{
    *st = pc->st;
    st->watches = pc->n_pidfds;
}
