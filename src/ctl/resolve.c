/* resolve.c -- host names of wanted peers resolved off the loop thread
 * (libuv's uv_getaddrinfo model): one worker thread per ctl, started at the
 * first name, runs the blocking getaddrinfo() of queued requests; each
 * completion comes back to the loop through an eventfd, where the want dials
 * the address or records "cannot resolve the host name". A name that takes
 * seconds to resolve (or not to) stalls neither the loop nor other peers.
 *
 * Ownership: a request is allocated by kvp__ctl_resolve_start and freed on the
 * loop thread when its completion is taken (ctl_resolve_on_done) or by
 * kvp__ctl_resolve_destroy. `want` is read and written on the loop thread only
 * (NULL once the want is gone); the worker touches addr, st, ss and sslen,
 * and the lists under the mutex. */
#include "ctl/ctl_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct ctl_resolve_req {
    kvp_list_t node; /* todo, then done (under mu) */
    char addr[KVP_WIRE_STR_MAX + 1];
    ctl_want_t *want;
    kvp_status_t st;
    struct sockaddr_storage ss;
    unsigned sslen;
};

struct ctl_resolver {
    kvp_ctl_t *ctl;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    kvp_list_t todo, done;
    int efd;
    kvp_io_t io;
};

static void *resolver_main(void *arg)
{
    ctl_resolver_t *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (kvp_list_empty(&r->todo) && !r->stop)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->stop)
            break;
        ctl_resolve_req_t *q = KVP_CONTAINER_OF(r->todo.next, ctl_resolve_req_t, node);
        kvp_list_remove(&q->node);
        pthread_mutex_unlock(&r->mu);
        q->st = kvp_tcp_parse_addr(q->addr, &q->ss, &q->sslen); /* may block: the point */
        pthread_mutex_lock(&r->mu);
        kvp_list_insert_tail(&r->done, &q->node);
        uint64_t one = 1;
        (void)!write(r->efd, &one, sizeof(one));
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Loop thread: take every completion; dial or fail each want still there. */
static void resolver_on_io(kvp_io_t *io, uint32_t events)
{
    ctl_resolver_t *r = io->data;
    uint64_t v;
    (void)events;
    (void)!read(r->efd, &v, sizeof(v));
    kvp_list_t done;
    kvp_list_init(&done);
    pthread_mutex_lock(&r->mu);
    while (!kvp_list_empty(&r->done)) {
        kvp_list_t *p = r->done.next;
        kvp_list_remove(p);
        kvp_list_insert_tail(&done, p);
    }
    pthread_mutex_unlock(&r->mu);
    while (!kvp_list_empty(&done)) {
        ctl_resolve_req_t *q = KVP_CONTAINER_OF(done.next, ctl_resolve_req_t, node);
        kvp_list_remove(&q->node);
        ctl_want_t *w = q->want;
        if (w != NULL) {
            w->resolving = NULL;
            kvp__ctl_want_resolved(w, q->st, &q->ss, q->sslen);
        }
        kvp__free(q);
    }
}

static kvp_status_t resolver_create(kvp_ctl_t *ctl)
{
    ctl_resolver_t *r = kvp__calloc(1, sizeof(*r));
    if (r == NULL)
        return KVP_ERR_NOMEM;
    r->ctl = ctl;
    kvp_list_init(&r->todo);
    kvp_list_init(&r->done);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if ((r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0)
        goto fail;
    if (kvp_io_start(ctl->loop, &r->io, r->efd, EPOLLIN, resolver_on_io, r) != KVP_OK)
        goto fail_fd;
    if (pthread_create(&r->thread, NULL, resolver_main, r) != 0)
        goto fail_io;
    ctl->resolver = r;
    return KVP_OK;
fail_io:
    kvp_io_stop(ctl->loop, &r->io);
fail_fd:
    close(r->efd);
fail:
    KVP_ERROR(ctl->prefix, "resolver: cannot start: %s", strerror(errno));
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    kvp__free(r);
    return KVP_ERR_IO;
}

kvp_status_t kvp__ctl_resolve_start(kvp_ctl_t *ctl, ctl_want_t *w)
{
    kvp_status_t st;
    if (ctl->resolver == NULL && (st = resolver_create(ctl)) != KVP_OK)
        return st;
    ctl_resolve_req_t *q = kvp__calloc(1, sizeof(*q));
    if (q == NULL)
        return KVP_ERR_NOMEM;
    snprintf(q->addr, sizeof(q->addr), "%s", w->addr);
    q->want = w;
    w->resolving = q;
    ctl_resolver_t *r = ctl->resolver;
    pthread_mutex_lock(&r->mu);
    kvp_list_insert_tail(&r->todo, &q->node);
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return KVP_OK;
}

void kvp__ctl_resolve_forget(ctl_want_t *w)
{
    if (w->resolving != NULL)
        w->resolving->want = NULL; /* freed when its completion is taken */
    w->resolving = NULL;
}

/* Joins the worker: a getaddrinfo() in progress is waited for (bounded by
 * the system resolver's timeout, resolv.conf). */
void kvp__ctl_resolve_destroy(kvp_ctl_t *ctl)
{
    ctl_resolver_t *r = ctl->resolver;
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
    kvp_io_stop(ctl->loop, &r->io);
    close(r->efd);
    kvp_list_t *lists[2] = {&r->todo, &r->done};
    for (int i = 0; i < 2; i++)
        while (!kvp_list_empty(lists[i])) {
            ctl_resolve_req_t *q = KVP_CONTAINER_OF(lists[i]->next, ctl_resolve_req_t, node);
            kvp_list_remove(&q->node);
            if (q->want)
                q->want->resolving = NULL;
            kvp__free(q);
        }
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    kvp__free(r);
    ctl->resolver = NULL;
}
