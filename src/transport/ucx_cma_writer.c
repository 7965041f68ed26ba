/*
 * ucx_cma_writer.c -- direct-cma writes off the node thread (issue 29's
 * leftover, 2026-12-06). A process_vm_writev on the node thread blocks it
 * for the whole write: while one consumer's 32 MiB fetches were written,
 * another peer's LOOKUPs waited (p99 2.6-3.3 ms, max 7-9 ms:
 * python/bench/serve_fairness.py). Slices per node round (the previous
 * design) cut that to ~1.5 ms at a third of the throughput.
 *
 * So a write is queued as one request of its record (r->pending counts it)
 * and one writer thread writes it, split with the helper thread as before
 * (ucx_cma.c: two copy streams); the node thread goes on. The write's
 * completion comes back through cma_efd (in the transport's epoll fd, so a
 * sleeping node round or a caller-driven node's fd wakes) and
 * kvp__ucx_cma_pump, called once per node round, folds each finished write
 * into its record on the node thread (stats, failure, kvp__ucx_xfer_step).
 * The writer touches no record, no stats and no UCX: only the job, under
 * cma_lock, and the memory the write names (ours, fixed while posted).
 *
 * With KVPEER_CMA_SLICE_KIB=N the writer writes a write in slices of N KiB,
 * the oldest queued write's next slice each time (round-robin between
 * consumers; unset: whole writes). A write dropped -- its record detached
 * (a cancel IMMEDIATE, the hold cap), its peer removed, the transport closed
 * -- writes no slice after the one running, if any; its record fails
 * (CANCELED) once that slice returned, like any request in flight. The
 * removal of its peer and the close wait for that slice (the writer reads
 * the peer's pid and pidfd). Every rule of ucx_cma.c holds per slice: the
 * bounds were checked for every block at post, the pidfd is checked before
 * each syscall. KVPEER_CMA_WRITER=0, or no thread: the node thread writes
 * each write whole at post, as before.
 */
#include "transport/ucx_int.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

typedef struct cma_job {
    kvp_list_t link; /* on x->cma_jobs (queued or running) or x->cma_done */
    ucx_xfer_t *r;   /* the node thread's only */
    ucx_peer_t *p;
    size_t next, n; /* blocks [next, n) still to write */
    bool dropped;   /* write no more of it */
    kvp_cma_res_t res;
    kvp_xfer_block_t blocks[];
} cma_job_t;

/* Under cma_lock: cma_efd readable (once: it stays so until efd_clear). */
static void efd_signal(ucx_xport_t *x)
{
    uint64_t v = 1;
    if (atomic_load_explicit(&x->cma_signalled, memory_order_relaxed))
        return;
    atomic_store_explicit(&x->cma_signalled, true, memory_order_relaxed);
    if (write(x->cma_efd, &v, sizeof v) != sizeof v) {
        /* cannot fail: an eventfd counter at 0 */
    }
}

/* Under cma_lock. */
static void efd_clear(ucx_xport_t *x)
{
    uint64_t v;
    if (!atomic_load_explicit(&x->cma_signalled, memory_order_relaxed))
        return;
    atomic_store_explicit(&x->cma_signalled, false, memory_order_relaxed);
    if (read(x->cma_efd, &v, sizeof v) != sizeof v) {
        /* cannot fail: signalled */
    }
}

/* Under cma_lock: the first queued write that may run (the gate: tests). */
static cma_job_t *next_job(ucx_xport_t *x)
{
    if (kvp_list_empty(&x->cma_jobs) || x->cma_gate == 0)
        return NULL;
    return KVP_CONTAINER_OF(x->cma_jobs.next, cma_job_t, link);
}

static void *writer_main(void *arg)
{
    ucx_xport_t *x = arg;
    kvp__thread_setup("kvp-cma-writer", x->cma_nice, PFX(x));
    pthread_mutex_lock(&x->cma_lock);
    while (!x->cma_stop) {
        cma_job_t *j = next_job(x);
        if (j == NULL) {
            pthread_cond_wait(&x->cma_cv, &x->cma_lock);
            continue;
        }
        if (x->cma_gate != SIZE_MAX)
            x->cma_gate--;
        x->cma_running = j;
        size_t k = KVP_MIN(KVP_MAX(x->cma_slice / x->layout.block_size, (size_t)1),
                           j->n - j->next);
        pthread_mutex_unlock(&x->cma_lock);
        kvp__ucx_cma_write_raw(x, j->p, j->blocks + j->next, k, &x->cma_helper, &j->res);
        pthread_mutex_lock(&x->cma_lock);
        j->next += k;
        x->cma_running = NULL;
        kvp_list_remove(&j->link);
        if (j->res.failed || j->next == j->n || j->dropped) {
            kvp_list_insert_tail(&x->cma_done, &j->link);
            efd_signal(x);
        } else { /* round-robin: the next slice is another write's */
            kvp_list_insert_tail(&x->cma_jobs, &j->link);
        }
        pthread_cond_broadcast(&x->cma_cv); /* a drop waiting for this slice */
    }
    pthread_mutex_unlock(&x->cma_lock);
    return NULL;
}

/* The writer, its lock and cma_efd (in epfd), at the first write; false:
 * none (the caller writes on the node thread). Not retried after a failure. */
static bool writer_start(ucx_xport_t *x)
{
    if (x->cma_writer_on || x->cma_writer_off)
        return x->cma_writer_on;
    x->cma_writer_off = true;
    const char *e = getenv("KVPEER_CMA_WRITER");
    if (e != NULL && strcmp(e, "0") == 0)
        return false;
    int fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN};
    int rc = fd < 0 || epoll_ctl(x->epfd, EPOLL_CTL_ADD, fd, &ev) != 0 ? errno : 0;
    if (rc == 0 && (rc = pthread_mutex_init(&x->cma_lock, NULL)) == 0 &&
        (rc = pthread_cond_init(&x->cma_cv, NULL)) != 0)
        pthread_mutex_destroy(&x->cma_lock);
    x->cma_efd = fd;
    if (rc == 0) /* the writer's helper from now on, at the writer's priority */
        kvp__helper_start(&x->cma_helper, PFX(x), "kvp-cma-helper", x->cma_nice);
    if (rc == 0 && (rc = pthread_create(&x->cma_thread, NULL, writer_main, x)) != 0) {
        pthread_cond_destroy(&x->cma_cv);
        pthread_mutex_destroy(&x->cma_lock);
        kvp__helper_fini(&x->cma_helper); /* the node thread's again: restarted at its priority */
    }
    if (rc != 0) {
        if (fd >= 0)
            close(fd);
        x->cma_efd = -1;
        KVP_WARN(PFX(x), "no direct-cma writer thread (%s): writes on the node thread",
                 strerror(rc));
        return false;
    }
    x->cma_writer_off = false;
    x->cma_writer_on = true;
    return true;
}

bool kvp__ucx_cma_queue(ucx_xport_t *x, ucx_peer_t *p, ucx_xfer_t *r,
                        const kvp_xfer_block_t *blocks, size_t n)
{
    if (!writer_start(x))
        return false;
    cma_job_t *j = kvp__calloc(1, sizeof(*j) + n * sizeof(j->blocks[0]));
    if (j == NULL)
        return false;
    memcpy(j->blocks, blocks, n * sizeof(j->blocks[0]));
    j->r = r;
    j->p = p;
    j->n = n;
    r->pending++; /* the write: one request until written, failed or dropped */
    pthread_mutex_lock(&x->cma_lock);
    kvp_list_insert_tail(&x->cma_jobs, &j->link);
    pthread_cond_broadcast(&x->cma_cv);
    pthread_mutex_unlock(&x->cma_lock);
    return true;
}

/* Node thread: j is off every list; its results into its record, which
 * ends this request (CANCELED if dropped before it was all written). */
static void job_end(ucx_xport_t *x, cma_job_t *j)
{
    ucx_xfer_t *r = j->r;
    bool cut = j->next < j->n && !j->res.failed;
    kvp__ucx_cma_fold(x, j->p, r, &j->res);
    kvp__free(j);
    kvp__ucx_xfer_step(r, cut ? UCS_ERR_CANCELED : UCS_OK); /* a failure: in first_err */
}

/* Node thread: the finished writes of peer p / record r (NULL: any) off
 * cma_done, ended. */
static bool reap(ucx_xport_t *x, const ucx_peer_t *p, const ucx_xfer_t *r)
{
    kvp_list_t mine, *pos, *tmp;
    kvp_list_init(&mine);
    pthread_mutex_lock(&x->cma_lock);
    if (p == NULL && r == NULL)
        efd_clear(x); /* every done write taken: a later one signals again */
    kvp_list_foreach_safe(pos, tmp, &x->cma_done)
    {
        cma_job_t *j = KVP_CONTAINER_OF(pos, cma_job_t, link);
        if ((p == NULL || j->p == p) && (r == NULL || j->r == r)) {
            kvp_list_remove(&j->link);
            kvp_list_insert_tail(&mine, &j->link);
        }
    }
    pthread_mutex_unlock(&x->cma_lock);
    bool any = !kvp_list_empty(&mine);
    kvp_list_foreach_safe(pos, tmp, &mine)
    {
        kvp_list_remove(pos);
        job_end(x, KVP_CONTAINER_OF(pos, cma_job_t, link));
    }
    return any;
}

bool kvp__ucx_cma_pump(kvp_xport_t *xp)
{
    ucx_xport_t *x = ucx_of(xp);
    /* a stale false: cma_efd is readable, the next round's look sees it */
    if (!x->cma_writer_on || !atomic_load_explicit(&x->cma_signalled, memory_order_relaxed))
        return false;
    return reap(x, NULL, NULL); /* records done: this round settles them, no sleep */
}

void kvp__ucx_cma_drop(ucx_xport_t *x, const ucx_peer_t *p, const ucx_xfer_t *r, bool wait)
{
    if (!x->cma_writer_on)
        return;
    kvp_list_t *pos, *tmp;
    pthread_mutex_lock(&x->cma_lock);
    kvp_list_foreach_safe(pos, tmp, &x->cma_jobs)
    {
        cma_job_t *j = KVP_CONTAINER_OF(pos, cma_job_t, link);
        if ((p != NULL && j->p != p) || (r != NULL && j->r != r))
            continue;
        j->dropped = true;
        if (j != x->cma_running) { /* not started, or between slices: nothing in flight */
            kvp_list_remove(&j->link);
            kvp_list_insert_tail(&x->cma_done, &j->link);
        }
    }
    while (wait && x->cma_running != NULL && (p == NULL || x->cma_running->p == p) &&
           (r == NULL || x->cma_running->r == r))
        pthread_cond_wait(&x->cma_cv, &x->cma_lock); /* its slice returns to cma_done */
    pthread_mutex_unlock(&x->cma_lock);
    reap(x, p, r);
}

void kvp__ucx_cma_writer_stop(ucx_xport_t *x)
{
    if (!x->cma_writer_on)
        return;
    kvp__ucx_cma_drop(x, NULL, NULL, true);
    pthread_mutex_lock(&x->cma_lock);
    x->cma_stop = true;
    pthread_cond_broadcast(&x->cma_cv);
    pthread_mutex_unlock(&x->cma_lock);
    pthread_join(x->cma_thread, NULL);
    pthread_cond_destroy(&x->cma_cv);
    pthread_mutex_destroy(&x->cma_lock);
    close(x->cma_efd);
    x->cma_efd = -1;
    atomic_store(&x->cma_signalled, false);
    x->cma_writer_on = false;
}

void kvp__ucx_cma_gate(ucx_xport_t *x, size_t slices)
{
    if (!writer_start(x))
        return;
    pthread_mutex_lock(&x->cma_lock);
    x->cma_gate = slices;
    pthread_cond_broadcast(&x->cma_cv);
    pthread_mutex_unlock(&x->cma_lock);
}
