/*
 * kvpeerd_http_cap.c -- kvpeerd's HTTP connection cap, which a slow client
 * cannot hold shut.
 *
 * libmicrohttpd's own cap refuses a connection at accept once http_max_conns
 * are open, and its idle timeout only closes a connection that sends nothing:
 * a client trickling one header byte a second keeps its slots for ever, and
 * from http_max_conns / http_max_per_ip addresses it fills the cap (/healthz
 * refused, the orchestrator restarts a healthy node). libmicrohttpd has no
 * deadline for a whole request's headers.
 *
 * So the cap is ours (libmicrohttpd's stays as a backstop, twice ours plus
 * KVPD_HTTP_HEADROOM, for cut connections being closed): every connection is tracked from
 * accept (MHD_OPTION_NOTIFY_CONNECTION) and is "waiting" while no request of
 * it is in a handler -- its headers or body not yet complete (a body trickled
 * after complete headers waits too), or idle between keep-alive requests.
 * When an accept takes the open connections past http_max_conns, one waiting
 * connection is cut (shutdown(): its thread sees EOF and closes it as
 * libmicrohttpd does at stop): the one that has waited longest among those of
 * the client address holding the most open connections (IPv6 counted per
 * /64, the unit a host is given), which is the newcomer only when nothing
 * else of its address or a busier one waits. A request in a handler is never
 * cut. A flood, however fast it reconnects, thus displaces its own
 * connections first: a client from an address holding fewer loses a slot
 * only to flooders from at least http_max_conns / its count addresses, and a
 * slow client of a busy address holds one until http_max_conns newer
 * connections of its own kind arrived. The descriptor is shut down under the
 * lock, and libmicrohttpd closes it only after the CLOSED notification,
 * which takes the lock: never a descriptor of someone else.
 *
 * The cap per client address (http_max_per_ip) is kept here too, by the
 * same address keys: libmicrohttpd's counts each IPv6 address, and a host
 * given a /64 has 2^64 of them. A connection that takes its address past
 * the cap is refused at once (shut down, as libmicrohttpd refuses one),
 * counted in kvpeer_http_addr_refused_total; libmicrohttpd's per-address
 * cap stays, the same number (it refuses an IPv4 client before we see it).
 */
#include "kvpeerd_http.h"

#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define KEY_LEN 9

typedef struct haddr { /* a client address (an IPv6 /64) with connections */
    struct haddr *next;
    uint8_t key[KEY_LEN];
    uint32_t refs; /* tracked connections, cut or not */
    uint32_t open; /* of them not cut */
} haddr_t;

typedef struct hconn {
    struct hconn *prev, *next; /* on the waiting list, oldest first */
    haddr_t *addr;
    int fd;
    bool waiting, cut;
} hconn_t;

typedef struct hcount { /* connections closed for one cap, logged once a second */
    uint64_t total, unlogged, last_log_ms;
} hcount_t;

struct kvpd_hcap {
    pthread_mutex_t lock;
    hconn_t *head, *tail; /* waiting connections, oldest first */
    haddr_t *addrs;       /* addresses with tracked connections */
    uint32_t open;        /* tracked connections not cut */
    uint32_t cap, per_addr;
    hcount_t cut;     /* at the total cap (http_cap_full) */
    hcount_t refused; /* at an address's cap (http_addr_full) */
};

static void wait_push(kvpd_hcap_t *h, hconn_t *c)
{
    c->prev = h->tail;
    c->next = NULL;
    if (h->tail)
        h->tail->next = c;
    else
        h->head = c;
    h->tail = c;
    c->waiting = true;
}

static void wait_unlink(kvpd_hcap_t *h, hconn_t *c)
{
    if (!c->waiting)
        return;
    if (c->prev)
        c->prev->next = c->next;
    else
        h->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    else
        h->tail = c->prev;
    c->prev = c->next = NULL;
    c->waiting = false;
}

/* The key of sa: the family, then an IPv4 address (v4-mapped IPv6 too) or
 * an IPv6 /64. */
static void addr_key(const struct sockaddr *sa, uint8_t key[KEY_LEN])
{
    static const uint8_t v4mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    memset(key, 0, KEY_LEN);
    if (sa != NULL && sa->sa_family == AF_INET) {
        key[0] = 4;
        memcpy(key + 1, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    } else if (sa != NULL && sa->sa_family == AF_INET6) {
        const uint8_t *a = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
        key[0] = memcmp(a, v4mapped, 12) == 0 ? 4 : 6;
        memcpy(key + 1, key[0] == 4 ? a + 12 : a, key[0] == 4 ? 4 : 8);
    }
}

/* The entry of key (new with no connections); NULL when out of memory. */
static haddr_t *addr_ref(kvpd_hcap_t *h, const uint8_t key[KEY_LEN])
{
    haddr_t *a;
    for (a = h->addrs; a != NULL; a = a->next)
        if (memcmp(a->key, key, KEY_LEN) == 0)
            break;
    if (a == NULL) {
        if ((a = calloc(1, sizeof(*a))) == NULL)
            return NULL;
        memcpy(a->key, key, KEY_LEN);
        a->next = h->addrs;
        h->addrs = a;
    }
    a->refs++;
    a->open++;
    return a;
}

static void addr_unref(kvpd_hcap_t *h, haddr_t *a)
{
    if (--a->refs > 0)
        return;
    haddr_t **pp = &h->addrs;
    while (*pp != a)
        pp = &(*pp)->next;
    *pp = a->next;
    free(a);
}

/* The waiting connection to cut: the oldest of the address holding the most
 * open connections (list order is age, so the first of the busiest wins). */
static hconn_t *victim(kvpd_hcap_t *h)
{
    hconn_t *v = h->head;
    for (hconn_t *c = h->head; c != NULL; c = c->next)
        if (c->addr->open > v->addr->open)
            v = c;
    return v;
}

/* Close c (its thread sees EOF); counted as cut at the total cap, or
 * refused at its address's. */
static void cut(kvpd_hcap_t *h, hconn_t *c, bool refused)
{
    wait_unlink(h, c);
    c->cut = true;
    c->addr->open--;
    h->open--;
    hcount_t *n = refused ? &h->refused : &h->cut;
    n->total++;
    n->unlogged++;
    shutdown(c->fd, SHUT_RDWR);
}

/* At most one line a second for n, with how many since the last. */
static void log_count(hcount_t *n, uint64_t now, const char *event, const char *limit,
                      uint32_t value, const char *note)
{
    if (n->unlogged == 0 || now - n->last_log_ms < 1000)
        return;
    kvpd_log(KVPD_LOG_WARN, event, "%s=%u closed=%llu closed_total=%llu note=\"%s\"", limit, value,
             (unsigned long long)n->unlogged, (unsigned long long)n->total, note);
    n->unlogged = 0;
    n->last_log_ms = now;
}

static void log_cuts(kvpd_hcap_t *h)
{
    uint64_t now = kvpd_now_ms();
    log_count(&h->cut, now, "http_cap_full", "max_conns", h->cap,
              "closed the connections that waited longest without a request in a handler, "
              "of the busiest client addresses");
    log_count(&h->refused, now, "http_addr_full", "max_per_ip", h->per_addr,
              "refused connections past the cap of their client address (IPv6: its /64)");
}

void kvpd_hcap_on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                             enum MHD_ConnectionNotificationCode code)
{
    kvpd_hcap_t *h = ((kvpd_t *)cls)->hcap;
    hconn_t *c = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        const union MHD_ConnectionInfo *ca =
            MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
        if (ci == NULL)
            return;
        uint8_t key[KEY_LEN];
        addr_key(ca ? ca->client_addr : NULL, key);
        pthread_mutex_lock(&h->lock);
        if ((c = calloc(1, sizeof(*c))) == NULL || (c->addr = addr_ref(h, key)) == NULL) {
            pthread_mutex_unlock(&h->lock); /* no record, no slot: refused */
            free(c);
            shutdown(ci->connect_fd, SHUT_RDWR);
            return;
        }
        c->fd = ci->connect_fd;
        *socket_context = c;
        h->open++;
        wait_push(h, c);
        if (c->addr->open > h->per_addr)
            cut(h, c, true); /* the newcomer, past its address's cap */
        else if (h->open > h->cap) /* the newcomer if nothing else of its or a busier waits */
            cut(h, victim(h), false);
        log_cuts(h);
        pthread_mutex_unlock(&h->lock);
        return;
    }
    if (c == NULL)
        return;
    pthread_mutex_lock(&h->lock);
    wait_unlink(h, c);
    if (!c->cut) {
        c->addr->open--;
        h->open--;
    }
    addr_unref(h, c->addr);
    pthread_mutex_unlock(&h->lock);
    *socket_context = NULL;
    free(c);
}

void kvpd_hcap_request(kvpd_t *d, struct MHD_Connection *mc, bool in_handler)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    hconn_t *c = ci ? ci->socket_context : NULL;
    if (c == NULL)
        return;
    pthread_mutex_lock(&d->hcap->lock);
    if (in_handler)
        wait_unlink(d->hcap, c);
    else if (!c->cut && !c->waiting)
        wait_push(d->hcap, c);
    pthread_mutex_unlock(&d->hcap->lock);
}

void kvpd_hcap_on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                            enum MHD_RequestTerminationCode toe)
{
    (void)con_cls;
    (void)toe;
    kvpd_hcap_request(cls, mc, false);
}

int kvpd_hcap_init(kvpd_t *d)
{
    if ((d->hcap = calloc(1, sizeof(*d->hcap))) == NULL)
        return -1;
    pthread_mutex_init(&d->hcap->lock, NULL);
    d->hcap->cap = d->set.http_max_conns;
    d->hcap->per_addr = d->set.http_max_per_ip;
    return 0;
}

void kvpd_hcap_free(kvpd_t *d)
{
    if (d->hcap == NULL)
        return;
    while (d->hcap->addrs != NULL) { /* none once libmicrohttpd stopped; never leaked */
        haddr_t *a = d->hcap->addrs;
        d->hcap->addrs = a->next;
        free(a);
    }
    pthread_mutex_destroy(&d->hcap->lock);
    free(d->hcap);
    d->hcap = NULL;
}

void kvpd_hcap_totals(kvpd_t *d, uint64_t *cut_total, uint64_t *refused_total)
{
    *cut_total = *refused_total = 0;
    if (d->hcap == NULL)
        return;
    pthread_mutex_lock(&d->hcap->lock);
    *cut_total = d->hcap->cut.total;
    *refused_total = d->hcap->refused.total;
    pthread_mutex_unlock(&d->hcap->lock);
}
