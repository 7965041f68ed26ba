/*
 * kvpeerd_ops.c -- structured logging and the event dispatcher of kvpeerd.
 *
 * The main thread drains kvp_poll_events() and completes waiting admin
 * requests by op id. A handler starts its kvp call with the op lock held and
 * registers the op before unlocking, so the event always finds its waiter.
 */
#include "kvpeerd.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int log_level = KVPD_LOG_INFO;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *const level_names[] = {"error", "warn", "info", "debug", "trace"};

/* One line, one format for the daemon's events and the library's lines:
 * ts=<ISO-8601 UTC> level=<name> comp=<kvpeerd|kvpeer> ... */
static void log_line(int level, const char *comp, const char *rest)
{
    struct timespec ts;
    struct tm tm;
    char safe[2048];
    /* The fields a peer or a client chose are escaped where they are
     * printed (kvpd_esc); this is the net under a call site that forgot:
     * one event is one line, whatever it holds. */
    kvp_escape(safe, sizeof(safe), rest, strlen(rest), 0);
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    pthread_mutex_lock(&log_lock);
    fprintf(stderr, "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ level=%s comp=%s %s\n",
            tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
            ts.tv_nsec / 1000000, level_names[level], comp, safe);
    fflush(stderr);
    pthread_mutex_unlock(&log_lock);
}

kvpd_esc_t kvpd_esc(const char *s)
{
    kvpd_esc_t e;
    kvp_escape(e.s, sizeof(e.s), s, strlen(s),
               KVP_ESCAPE_BACKSLASH | KVP_ESCAPE_QUOTE | KVP_ESCAPE_SPACE);
    return e;
}

kvpd_esc_t kvpd_escq(const char *s)
{
    kvpd_esc_t e;
    kvp_escape(e.s, sizeof(e.s), s, strlen(s), KVP_ESCAPE_BACKSLASH | KVP_ESCAPE_QUOTE);
    return e;
}

/* The library's lines (kvp_set_log_callback): node=<name> msg="<text>". The
 * library already escaped the line (controls, '\\'); the quote is ours. The
 * node name is the operator's (--name) or the bound address. */
static void lib_log_cb(int32_t level, const char *component, const char *line, void *arg)
{
    char text[2200], msg[1100];
    kvp_escape(msg, sizeof(msg), line, strlen(line), KVP_ESCAPE_QUOTE);
    snprintf(text, sizeof(text), "node=%s msg=\"%s\"", kvpd_esc(component).s, msg);
    (void)arg;
    if (level < 0 || level > KVPD_LOG_TRACE)
        level = KVPD_LOG_ERROR;
    log_line(level, "kvpeer", text);
}

/* One level for the daemon and the library. */
void kvpd_log_set_level(int level)
{
    __atomic_store_n(&log_level, level, __ATOMIC_RELAXED);
    kvp_set_log_level(level);
    kvp_set_log_callback(lib_log_cb, NULL);
}

void kvpd_log(int level, const char *event, const char *kv, ...)
{
    char text[1024], rest[1100];
    va_list ap;
    if (level > __atomic_load_n(&log_level, __ATOMIC_RELAXED))
        return;
    va_start(ap, kv);
    vsnprintf(text, sizeof(text), kv, ap);
    va_end(ap);
    snprintf(rest, sizeof(rest), "event=%s%s%s", event, text[0] ? " " : "", text);
    log_line(level, "kvpeerd", rest);
}

uint64_t kvpd_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

uint64_t kvpd_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

kvpd_op_t *kvpd_op_new(uint32_t n, uint32_t key_bytes)
{
    kvpd_op_t *op = calloc(1, sizeof(*op));
    if (op == NULL)
        return NULL;
    op->n = n;
    op->keys = calloc(key_bytes ? key_bytes : 1, 1);
    op->key_lens = calloc(n ? n : 1, sizeof(uint32_t));
    op->results = calloc(n ? n : 1, 1);
    if (op->keys == NULL || op->key_lens == NULL || op->results == NULL) {
        kvpd_op_free(op);
        return NULL;
    }
    return op;
}

void kvpd_op_free(kvpd_op_t *op)
{
    if (op == NULL)
        return;
    free(op->keys);
    free(op->key_lens);
    free(op->results);
    free(op);
}

void kvpd_ops_lock(kvpd_t *d)
{
    pthread_mutex_lock(&d->lock);
}

void kvpd_ops_unlock(kvpd_t *d)
{
    pthread_mutex_unlock(&d->lock);
}

void kvpd_op_register(kvpd_t *d, kvpd_op_t *op, uint64_t op_id)
{
    op->op_id = op_id;
    op->next = d->ops;
    d->ops = op;
}

static void op_unlink(kvpd_t *d, kvpd_op_t *op)
{
    for (kvpd_op_t **pp = &d->ops; *pp; pp = &(*pp)->next) {
        if (*pp == op) {
            *pp = op->next;
            op->next = NULL;
            return;
        }
    }
}

int kvpd_op_wait(kvpd_t *d, kvpd_op_t *op, uint64_t deadline_ms)
{
    int rc = -1;
    pthread_mutex_lock(&d->lock);
    while (!op->done && !d->stopping) {
        uint64_t now = kvpd_now_ms();
        if (now >= deadline_ms)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t wait = deadline_ms - now;
        ts.tv_sec += (time_t)(wait / 1000);
        ts.tv_nsec += (long)(wait % 1000) * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&d->cond, &d->lock, &ts);
    }
    if (op->done) {
        op_unlink(d, op);
        rc = 0;
    }
    pthread_mutex_unlock(&d->lock);
    return rc;
}

void kvpd_op_abandon(kvpd_t *d, kvpd_op_t *op)
{
    pthread_mutex_lock(&d->lock);
    if (op->done) { /* it came after all: nobody else will free it */
        op_unlink(d, op);
        pthread_mutex_unlock(&d->lock);
        kvpd_op_free(op);
        return;
    }
    op->orphan = true;
    pthread_mutex_unlock(&d->lock);
}

static void dispatch_one(kvpd_t *d, const kvp_event_t *ev)
{
    if (ev->type == KVP_EV_PEER_UP) {
        kvpd_log(KVPD_LOG_INFO, "peer_up", "peer=%s", kvpd_esc(ev->peer).s);
        return;
    }
    if (ev->type == KVP_EV_PEER_DOWN) {
        kvpd_log(ev->fault ? KVPD_LOG_WARN : KVPD_LOG_INFO, "peer_down",
                 "peer=%s fault=%u status=\"%s\"", kvpd_esc(ev->peer).s, ev->fault,
                 kvp_status_str((kvp_status_t)ev->status));
        return;
    }
    kvpd_op_t *found = NULL;
    bool orphan = false;
    pthread_mutex_lock(&d->lock);
    for (kvpd_op_t *op = d->ops; op; op = op->next) {
        if (op->op_id == ev->op_id) {
            found = op;
            break;
        }
    }
    /* Decide under the lock: once it is dropped, a waiter may free `found`. */
    if (found && found->orphan) {
        orphan = true;
        op_unlink(d, found);
    } else if (found) {
        found->ev = *ev;
        found->done = true;
        pthread_cond_broadcast(&d->cond);
    }
    pthread_mutex_unlock(&d->lock);
    if (orphan)
        kvpd_op_free(found);
    kvpd_log(KVPD_LOG_DEBUG, ev->type == KVP_EV_LOAD ? "load_done" : "lookup_done",
             "op=%llu request=%llu status=\"%s\" n_ok=%u n_keys=%u waiter=%s",
             (unsigned long long)ev->op_id, (unsigned long long)ev->request_id,
             kvp_status_str((kvp_status_t)ev->status), ev->n_ok, ev->n_keys,
             orphan ? "orphan" : found ? "yes" : "none");
}

void kvpd_dispatch(kvpd_t *d)
{
    kvp_event_t ev[64];
    uint32_t n;
    do {
        n = 0;
        if (kvp_poll_events(d->node, ev, 64, &n) != KVP_OK)
            return;
        for (uint32_t i = 0; i < n; i++)
            dispatch_one(d, &ev[i]);
    } while (n == 64);
}

void kvpd_ops_stop(kvpd_t *d)
{
    pthread_mutex_lock(&d->lock);
    d->stopping = true;
    pthread_cond_broadcast(&d->cond);
    pthread_mutex_unlock(&d->lock);
}

void kvpd_ops_free_all(kvpd_t *d)
{
    pthread_mutex_lock(&d->lock);
    kvpd_op_t *op = d->ops;
    d->ops = NULL;
    pthread_mutex_unlock(&d->lock);
    while (op) {
        kvpd_op_t *next = op->next;
        kvpd_op_free(op);
        op = next;
    }
}
