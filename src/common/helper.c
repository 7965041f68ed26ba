/* helper.c -- a parked worker thread that takes half of a big job off its
 * owner thread (the node thread: a direct-cma write, a load's checksum
 * verify; issue 29). The owner posts one job, does its own share, then
 * waits for the job: at most one job is posted at a time, and it is done
 * before the owner goes on, so nothing the job touches outlives the call.
 *
 * Started at the first post, parked between jobs, joined at
 * kvp__helper_fini. Not a thread per job: a clone and an exit per job, and
 * glibc madvises an exiting thread's stack, which UCX's UCM hooks (a memory
 * event per job). KVPEER_HELPER_THREAD=0: no helper, the owner does every
 * job alone (kvp__helper_post answers false). A helper that cannot be
 * started is not retried (logged once by the caller's prefix). */
#include "common.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

struct kvp_helper {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* job posted, job done, stop */
    void (*fn)(void *);
    void *arg; /* fn non-NULL: posted, not done */
    bool stop;
    bool off;  /* none: disabled, or could not be started */
    char name[16];
    int nice;
    const char *log_prefix; /* helper_main's own log line only: the caller's, alive at start */
};

void kvp__thread_setup(const char *name, int nice, const char *log_prefix)
{
    pthread_setname_np(pthread_self(), name); /* ps -L, top -H: which thread copies */
    if (nice <= 0)
        return;
    /* relative to the nice it was started with (its creator's): an engine
     * run at nice 5 gets its copies at 15, never above its own priority */
    id_t tid = (id_t)syscall(SYS_gettid);
    errno = 0;
    int cur = getpriority(PRIO_PROCESS, tid);
    int want = cur + nice > 19 ? 19 : cur + nice;
    if (errno != 0 || (want > cur && setpriority(PRIO_PROCESS, tid, want) != 0))
        KVP_WARN(log_prefix, "thread %s keeps its priority: nice +%d: %s", name, nice,
                 strerror(errno));
}

static void *helper_main(void *a)
{
    kvp_helper_t *h = a;
    kvp__thread_setup(h->name, h->nice, h->log_prefix);
    pthread_mutex_lock(&h->mu);
    while (!h->stop) {
        if (h->fn == NULL) {
            pthread_cond_wait(&h->cv, &h->mu);
            continue;
        }
        void (*fn)(void *) = h->fn;
        void *arg = h->arg;
        pthread_mutex_unlock(&h->mu);
        fn(arg);
        pthread_mutex_lock(&h->mu);
        h->fn = NULL;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

static kvp_helper_t *helper_start(kvp_helper_t **hp, const char *log_prefix, const char *name,
                                  int nice)
{
    kvp_helper_t *h = kvp__calloc(1, sizeof(*h));
    if (h == NULL)
        return NULL;
    *hp = h;
    snprintf(h->name, sizeof(h->name), "%s", name);
    h->nice = nice;
    h->log_prefix = log_prefix;
    const char *e = getenv("KVPEER_HELPER_THREAD");
    if (e != NULL && strcmp(e, "0") == 0) {
        h->off = true;
        return h;
    }
    int rc = pthread_mutex_init(&h->mu, NULL);
    if (rc == 0 && (rc = pthread_cond_init(&h->cv, NULL)) != 0)
        pthread_mutex_destroy(&h->mu);
    if (rc == 0 && (rc = pthread_create(&h->thread, NULL, helper_main, h)) != 0) {
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
    }
    if (rc != 0) {
        h->off = true;
        KVP_WARN(log_prefix, "no helper thread (%s): big writes and verifies on one thread",
                 strerror(rc));
    }
    return h;
}

bool kvp__helper_post(kvp_helper_t **hp, const char *log_prefix, void (*fn)(void *), void *arg)
{
    kvp_helper_t *h = *hp != NULL ? *hp : helper_start(hp, log_prefix, "kvp-helper", 0);
    if (h == NULL || h->off)
        return false;
    pthread_mutex_lock(&h->mu);
    KVP_ASSERT(h->fn == NULL); /* one job at a time: the last one was waited for */
    h->fn = fn;
    h->arg = arg;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return true;
}

void kvp__helper_start(kvp_helper_t **hp, const char *log_prefix, const char *name, int nice)
{
    if (*hp == NULL)
        helper_start(hp, log_prefix, name, nice);
}

void kvp__helper_wait(kvp_helper_t *h)
{
    pthread_mutex_lock(&h->mu);
    while (h->fn != NULL)
        pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
}

void kvp__helper_fini(kvp_helper_t **hp)
{
    kvp_helper_t *h = *hp;
    if (h == NULL)
        return;
    if (!h->off) {
        pthread_mutex_lock(&h->mu);
        h->stop = true; /* no job is posted: its owner waited for the last */
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->thread, NULL);
        pthread_cond_destroy(&h->cv);
        pthread_mutex_destroy(&h->mu);
    }
    kvp__free(h);
    *hp = NULL;
}
