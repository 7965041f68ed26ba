/*
 * ucx_cma_slice.c -- with KVPEER_CMA_SLICE_KIB set, a direct-cma write
 * larger than that is written a slice per node round (issue 29's leftover,
 * 2026-12-06). A process_vm_writev runs on the node thread (split with one
 * helper thread), and while it runs the node answers nothing else: one
 * consumer's 32 MiB fetches put another peer's LOOKUPs at p99 2.6-3.3 ms,
 * max 7-9 ms (python/bench/serve_fairness.py); 4 MiB slices: p99 1.4-1.7,
 * max ~4 ms -- but the consumer's fetches ran at 5.3-5.9 GB/s, not 7.9-8.6
 * (8 MiB slices: 6.8-7.4 GB/s, p99 1.7-1.8; 16 MiB: ~7.5-8, p99 as whole).
 * A slice's halves cost a helper hand-off each (without the helper the gap
 * is ~7%). So slices are off by default (whole writes, as before); an
 * operator whose other peers' latency matters more turns them on.
 *
 * The first slice is written at post (the transfer exists once something
 * reached the consumer); the rest is queued as one request of the record
 * (r->pending counts it), and kvp__ucx_cma_pump, called once per node round
 * (the transport's pump op), writes the next slice of the oldest queued
 * write, round-robin between them. Every slice is synchronous: between two
 * slices nothing of ours is in flight, so a queued write that is dropped --
 * its record detached (a cancel, the hold cap), its peer removed, the
 * transport closed -- writes nothing more, and its record fails (CANCELED)
 * and is terminal at once. Every rule of ucx_cma.c holds per slice: the
 * bounds were checked for every block at post, the pidfd is checked before
 * each syscall. While any write is queued, cma_efd (in the transport's
 * epoll fd) stays readable: a caller-driven node's fd wakes its caller, and
 * the node thread does not sleep.
 */
#include "transport/ucx_int.h"

#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

typedef struct cma_job {
    kvp_list_t link; /* on x->cma_jobs */
    ucx_xfer_t *r;
    ucx_peer_t *p;
    size_t next, n; /* blocks [next, n) still to write */
    kvp_xfer_block_t blocks[];
} cma_job_t;

/* cma_efd readable iff a write is queued (level-triggered in epfd). */
static void cma_efd_set(ucx_xport_t *x, bool queued)
{
    uint64_t v = 1;
    if (x->cma_efd < 0)
        return;
    if (queued) {
        if (write(x->cma_efd, &v, sizeof v) != sizeof v)
            KVP_WARN(PFX(x), "direct-cma: eventfd write failed");
    } else if (read(x->cma_efd, &v, sizeof v) != sizeof v) {
        /* EAGAIN: not set */
    }
}

static bool cma_efd_open(ucx_xport_t *x)
{
    if (x->cma_efd >= 0)
        return true;
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN};
    if (fd < 0 || epoll_ctl(x->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        if (fd >= 0)
            close(fd);
        return false;
    }
    x->cma_efd = fd;
    return true;
}

bool kvp__ucx_cma_queue(ucx_xport_t *x, ucx_peer_t *p, ucx_xfer_t *r,
                        const kvp_xfer_block_t *blocks, size_t first, size_t n)
{
    if (!cma_efd_open(x))
        return false;
    cma_job_t *j = kvp__malloc(sizeof(*j) + (n - first) * sizeof(j->blocks[0]));
    if (j == NULL)
        return false;
    memcpy(j->blocks, blocks + first, (n - first) * sizeof(j->blocks[0]));
    j->r = r;
    j->p = p;
    j->next = 0;
    j->n = n - first;
    r->pending++; /* the queued rest: one request until written or dropped */
    if (kvp_list_empty(&x->cma_jobs))
        cma_efd_set(x, true);
    kvp_list_insert_tail(&x->cma_jobs, &j->link);
    return true;
}

/* j is done (written, failed or dropped): off the queue, its request ends. */
static void cma_job_end(ucx_xport_t *x, cma_job_t *j, ucs_status_t status)
{
    ucx_xfer_t *r = j->r;
    kvp_list_remove(&j->link);
    kvp__free(j);
    if (kvp_list_empty(&x->cma_jobs))
        cma_efd_set(x, false);
    kvp__ucx_xfer_step(r, status);
}

bool kvp__ucx_cma_pump(kvp_xport_t *xp)
{
    ucx_xport_t *x = ucx_of(xp);
    if (kvp_list_empty(&x->cma_jobs))
        return false;
    cma_job_t *j = KVP_CONTAINER_OF(x->cma_jobs.next, cma_job_t, link);
    size_t k = KVP_MIN(KVP_MAX(x->cma_slice / x->layout.block_size, (size_t)1),
                       j->n - j->next);
    kvp__ucx_cma_write(x, j->p, j->r, j->blocks + j->next, k);
    j->next += k;
    if (j->r->first_err != UCS_OK || j->next == j->n) {
        cma_job_end(x, j, UCS_OK); /* a failure is in first_err already */
    } else { /* round-robin: the next slice is another write's */
        kvp_list_remove(&j->link);
        kvp_list_insert_tail(&x->cma_jobs, &j->link);
    }
    return !kvp_list_empty(&x->cma_jobs);
}

void kvp__ucx_cma_drop(ucx_xport_t *x, const ucx_peer_t *p, const ucx_xfer_t *r)
{
    kvp_list_t *pos, *tmp;
    kvp_list_foreach_safe(pos, tmp, &x->cma_jobs)
    {
        cma_job_t *j = KVP_CONTAINER_OF(pos, cma_job_t, link);
        if ((p != NULL && j->p != p) || (r != NULL && j->r != r))
            continue;
        cma_job_end(x, j, UCS_ERR_CANCELED);
    }
}
