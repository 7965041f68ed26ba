/*
 * kvpeerd_dns.c -- peers from a DNS name (issue 28): `peers_dns = name:port`,
 * a name that resolves to many addresses (a Kubernetes headless service).
 *
 * One thread of its own resolves the name at start and every
 * peers_dns_interval_ms: getaddrinfo blocks (a dead DNS server: seconds), so
 * never on the node's thread nor on the main loop. Each answer:
 *   - its addresses (IPv4/IPv6 only, as "a.b.c.d:port" / "[v6]:port"; this
 *     node's own id skipped) are de-duplicated; at most peers_dns_max are
 *     kept: those already kept first, then the new ones in sorted order (a
 *     name resolving to 10 000 addresses makes at most that many peers; the
 *     node's max_wanted_peers caps kvp_peer_add as well);
 *   - every kept address is wanted (kvp_peer_add, idempotent: a session the
 *     node closed when idle is wanted again while the name lists it);
 *   - an address that left the answer is no longer wanted by us: a session
 *     up with it is left to the node, which closes it once idle
 *     (idle_session_ms) and stops redialling; one that is not up (failed,
 *     dialling) is removed at once (kvp_peer_remove).
 * A failed resolution keeps the last answer. Stop waits for a resolution in
 * progress (bounded by the system resolver's timeout).
 *
 * Ownership: the kvpd_dns_t is owned by kvpd_t (d->dns); the thread borrows
 * d->node, which outlives it (kvpd_dns_stop runs before kvp_node_destroy).
 */
#include "kvpeerd.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

enum {
    DNS_NAME = 64,         /* "[ipv6]:port" fits */
    DNS_RAW_MAX = 1 << 16, /* addresses read from one answer, at most */
    DNS_STATES = 4096,     /* peer states read to find a vanished one's */
};

typedef char dns_name_t[DNS_NAME];

struct kvpd_dns {
    kvpd_t *d;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    char host[256], port[8];
    dns_name_t *kept; /* peers_dns_max entries */
    uint32_t n_kept;
    uint64_t rounds, failures;
};

static int name_cmp(const void *a, const void *b)
{
    return strcmp(a, b);
}

/* The answer's addresses as peer names, sorted and unique; n_out of them. */
static dns_name_t *answer_names(const struct addrinfo *ai, const char *port, const char *self,
                                uint32_t *n_out)
{
    uint32_t n = 0, cap = 0;
    dns_name_t *v = NULL;
    for (; ai != NULL && n < DNS_RAW_MAX; ai = ai->ai_next) {
        char ip[INET6_ADDRSTRLEN];
        const void *src;
        if (ai->ai_family == AF_INET && ai->ai_addrlen >= sizeof(struct sockaddr_in))
            src = &((const struct sockaddr_in *)ai->ai_addr)->sin_addr;
        else if (ai->ai_family == AF_INET6 && ai->ai_addrlen >= sizeof(struct sockaddr_in6))
            src = &((const struct sockaddr_in6 *)ai->ai_addr)->sin6_addr;
        else
            continue;
        if (inet_ntop(ai->ai_family, src, ip, sizeof(ip)) == NULL)
            continue;
        if (n == cap) {
            uint32_t nc = cap ? cap * 2 : 64;
            dns_name_t *nv = realloc(v, (size_t)nc * sizeof(*v));
            if (nv == NULL)
                break; /* what we have so far */
            v = nv;
            cap = nc;
        }
        snprintf(v[n], DNS_NAME, ai->ai_family == AF_INET6 ? "[%s]:%s" : "%s:%s", ip, port);
        if (strcmp(v[n], self) != 0)
            n++;
    }
    if (n > 1)
        qsort(v, n, sizeof(*v), name_cmp);
    uint32_t u = 0;
    for (uint32_t i = 0; i < n; i++)
        if (u == 0 || strcmp(v[i], v[u - 1]) != 0)
            memmove(v[u++], v[i], DNS_NAME);
    *n_out = u;
    return v;
}

static bool in_sorted(dns_name_t *v, uint32_t n, const char *s)
{
    return n > 0 && bsearch(s, v, n, sizeof(*v), name_cmp) != NULL;
}

static bool in_list(dns_name_t *v, uint32_t n, const char *s)
{
    for (uint32_t i = 0; i < n; i++)
        if (strcmp(v[i], s) == 0)
            return true;
    return false;
}

/* A vanished address: left to the idle reaper if its session is up (no
 * longer kept: forgotten at the idle close), removed now otherwise. */
static void drop_vanished(kvpd_dns_t *x, dns_name_t *gone, uint32_t n_gone)
{
    kvp_peer_state_t *st = calloc(DNS_STATES, sizeof(*st));
    uint32_t n_st = 0;
    if (st != NULL && kvp_node_peer_states(x->d->node, st, DNS_STATES, &n_st) != KVP_OK)
        n_st = 0;
    for (uint32_t i = 0; i < n_gone; i++) {
        bool up = false;
        for (uint32_t j = 0; j < n_st; j++)
            if (strcmp(st[j].peer, gone[i]) == 0)
                up = strcmp(st[j].state, "ready") == 0 || strcmp(st[j].state, "probation") == 0;
        if (!up)
            (void)kvp_peer_remove(x->d->node, gone[i]); /* NOT_FOUND: no session; unwanted */
        else /* doors2: not kept past its idle close (forgotten then, as before) */
            (void)kvp_peer_forget(x->d->node, gone[i]);
        kvpd_log(KVPD_LOG_INFO, "peers_dns_vanished", "peer=%s session=%s",
                 kvpd_esc(gone[i]).s, up ? "up_until_idle" : "removed");
    }
    free(st);
}

static void resolve_once(kvpd_dns_t *x)
{
    const kvpd_settings_t *s = &x->d->set;
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_family = AF_UNSPEC;
    int rc = getaddrinfo(x->host, x->port, &hints, &ai); /* blocks: the point of the thread */
    x->rounds++;
    if (rc != 0) {
        x->failures++;
        if ((x->failures & (x->failures - 1)) == 0) /* 1, 2, 4, ...: bounded log */
            kvpd_log(KVPD_LOG_WARN, "peers_dns_failed",
                     "name=%s error=\"%s\" kept=%u failures=%llu", kvpd_esc(x->host).s,
                     kvpd_escq(gai_strerror(rc)).s, x->n_kept, (unsigned long long)x->failures);
        return;
    }
    uint32_t n_ans = 0;
    dns_name_t *ans = answer_names(ai, x->port, kvp_node_peer_id(x->d->node), &n_ans);
    freeaddrinfo(ai);
    uint32_t max = s->peers_dns_max, n_keep = 0, n_gone = 0;
    dns_name_t *keep = calloc(max, sizeof(*keep)), *gone = calloc(x->n_kept + 1, sizeof(*gone));
    if (keep == NULL || gone == NULL || (n_ans > 0 && ans == NULL)) {
        free(keep);
        free(gone);
        free(ans);
        return;
    }
    for (uint32_t i = 0; i < x->n_kept; i++) { /* kept ones keep their place */
        if (n_keep < max && in_sorted(ans, n_ans, x->kept[i]))
            memcpy(keep[n_keep++], x->kept[i], DNS_NAME);
        else
            memcpy(gone[n_gone++], x->kept[i], DNS_NAME);
    }
    uint32_t n_new = 0;
    for (uint32_t i = 0; i < n_ans && n_keep < max; i++)
        if (!in_list(x->kept, x->n_kept, ans[i])) {
            memcpy(keep[n_keep++], ans[i], DNS_NAME);
            n_new++;
        }
    free(ans);
    uint32_t refused = 0;
    for (uint32_t i = 0; i < n_keep; i++) {
        kvp_status_t st = kvp_peer_add(x->d->node, keep[i]);
        if (st == KVP_ERR_LIMIT) { /* max_wanted_peers: the rest would be refused too */
            refused = n_keep - i;
            break;
        }
        if (st != KVP_OK)
            kvpd_log(KVPD_LOG_WARN, "peers_dns_add_failed", "peer=%s status=\"%s\"",
                     kvpd_esc(keep[i]).s, kvp_status_str(st));
    }
    if (n_gone)
        drop_vanished(x, gone, n_gone);
    if (n_new || n_gone || refused || x->rounds == 1)
        kvpd_log(KVPD_LOG_INFO, "peers_dns", "name=%s addresses=%u kept=%u new=%u vanished=%u "
                 "truncated=%u refused_max_wanted=%u", kvpd_esc(x->host).s, n_ans, n_keep,
                 n_new, n_gone, n_ans > n_keep ? n_ans - n_keep : 0, refused);
    memcpy(x->kept, keep, (size_t)n_keep * sizeof(*keep));
    x->n_kept = n_keep;
    free(keep);
    free(gone);
}

static void *dns_main(void *arg)
{
    kvpd_dns_t *x = arg;
    pthread_mutex_lock(&x->mu);
    while (!x->stop) {
        pthread_mutex_unlock(&x->mu);
        resolve_once(x);
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        uint64_t ns = (uint64_t)until.tv_nsec + (uint64_t)x->d->set.peers_dns_interval_ms * 1000000u;
        until.tv_sec += (time_t)(ns / 1000000000u);
        until.tv_nsec = (long)(ns % 1000000000u);
        pthread_mutex_lock(&x->mu);
        while (!x->stop && pthread_cond_timedwait(&x->cv, &x->mu, &until) == 0)
            ;
    }
    pthread_mutex_unlock(&x->mu);
    return NULL;
}

int kvpd_dns_start(kvpd_t *d)
{
    const char *src = d->set.peers_dns;
    if (src == NULL || src[0] == '\0')
        return 0;
    kvpd_dns_t *x = calloc(1, sizeof(*x));
    if (x == NULL || (x->kept = calloc(d->set.peers_dns_max, sizeof(*x->kept))) == NULL) {
        free(x);
        return -1;
    }
    const char *colon = strrchr(src, ':'); /* checked by options.c: name:port */
    size_t hl = (size_t)(colon - src);
    if (src[0] == '[' && hl >= 2 && src[hl - 1] == ']')
        snprintf(x->host, sizeof(x->host), "%.*s", (int)(hl - 2), src + 1);
    else
        snprintf(x->host, sizeof(x->host), "%.*s", (int)hl, src);
    snprintf(x->port, sizeof(x->port), "%s", colon + 1);
    x->d = d;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&x->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&x->mu, NULL);
    if (pthread_create(&x->thread, NULL, dns_main, x) != 0) {
        pthread_cond_destroy(&x->cv);
        pthread_mutex_destroy(&x->mu);
        free(x->kept);
        free(x);
        kvpd_log(KVPD_LOG_ERROR, "peers_dns_failed", "error=\"no resolver thread\"");
        return -1;
    }
    d->dns = x;
    kvpd_log(KVPD_LOG_INFO, "peers_dns_start", "name=%s port=%s interval_ms=%u max=%u",
             kvpd_esc(x->host).s, x->port, d->set.peers_dns_interval_ms, d->set.peers_dns_max);
    return 0;
}

void kvpd_dns_stop(kvpd_t *d)
{
    kvpd_dns_t *x = d->dns;
    if (x == NULL)
        return;
    pthread_mutex_lock(&x->mu);
    x->stop = true;
    pthread_cond_signal(&x->cv);
    pthread_mutex_unlock(&x->mu);
    pthread_join(x->thread, NULL);
    pthread_cond_destroy(&x->cv);
    pthread_mutex_destroy(&x->mu);
    free(x->kept);
    free(x);
    d->dns = NULL;
}
