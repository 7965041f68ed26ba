/*
 * kvpeerd.h -- internal header of the kvpeerd daemon (tools/kvpeerd*.c):
 * the daemon record, structured logging, the event dispatcher that lets
 * HTTP admin handlers block on their kvp events, and the HTTP server.
 *
 * Threads: the main thread polls the signal fd and kvp_node_fd() and
 * dispatches events (kvpd_dispatch); libmicrohttpd runs one thread per
 * connection; the node runs its own progress thread. The kvpeer API is
 * thread-safe; kvpd_t.lock guards only the op list and `stopping`.
 */
#ifndef KVPD_H
#define KVPD_H

#include "kvpeer.h"
#include "options.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct MHD_Daemon;

/* One remote operation an admin handler waits for. Owns its buffers: the
 * library borrows keys/results until the op's event, so an op whose waiter
 * gave up (timeout, shutdown) becomes an orphan, freed by the dispatcher
 * when the event arrives or by kvpd_ops_free_all after kvp_node_destroy. */
typedef struct kvpd_op {
    struct kvpd_op *next;
    uint64_t op_id;
    bool done, orphan;
    kvp_event_t ev;
    uint32_t n;
    uint8_t *keys;
    uint32_t *key_lens;
    uint8_t *results;
} kvpd_op_t;

typedef struct kvpd_hcap kvpd_hcap_t;

typedef struct kvpd {
    kvpd_settings_t set;
    kvp_node_t *node;
    struct MHD_Daemon *http;
    char http_addr[300];
    pthread_mutex_t lock;
    pthread_cond_t cond;
    kvpd_op_t *ops; /* registered ops (waited for or orphaned) */
    bool stopping;  /* shutdown began: waiters give up */
    int http_active; /* requests inside a handler (graceful HTTP stop) */
    /* dead_after_ms for /healthz's stall limit: written by the main thread
     * (start, SIGHUP), read by HTTP threads, so atomic -- `set` is the main
     * thread's. */
    _Atomic uint32_t dead_after_ms;
    struct kvpd_hcap *hcap; /* the HTTP connection cap (kvpeerd_http_cap.c) */
    struct kvpd_dns *dns; /* issue 28: peers_dns resolver (kvpeerd_dns.c), NULL = off */
} kvpd_t;

/* ----------------------------------------------------------------- logging */

/* One logfmt line on stderr: `ts=... level=... event=<event> <kv>`; `kv`
 * is printf text of key=value pairs. Filtered by the log_level option. */
void kvpd_log(int level, const char *event, const char *kv, ...)
    __attribute__((format(printf, 3, 4)));
void kvpd_log_set_level(int level);

/* Issue 27: a string a peer or an HTTP client chose (peer id, instance id,
 * URL, query value, a library error text) made safe for one field of a log
 * line or of a page (kvp_escape: controls, ESC, invalid UTF-8, '\\' and '"'
 * as \xNN). kvpd_esc also escapes ' ' (a bare key=value field: no forged
 * fields); kvpd_escq keeps it (inside "..."). Use the result's .s within the
 * full expression: `kvpd_log(..., "peer=%s", kvpd_esc(p).s)`; longer input
 * is cut at a whole escape. */
typedef struct kvpd_esc {
    char s[1024];
} kvpd_esc_t;
kvpd_esc_t kvpd_esc(const char *s);
kvpd_esc_t kvpd_escq(const char *s);

/* -------------------------------------------------------------- dispatcher */

kvpd_op_t *kvpd_op_new(uint32_t n, uint32_t key_bytes);
/* Lock held around the starting kvp call and kvpd_op_register, so the
 * event cannot be dispatched before its waiter is on the list. */
void kvpd_ops_lock(kvpd_t *d);
void kvpd_ops_unlock(kvpd_t *d);
void kvpd_op_register(kvpd_t *d, kvpd_op_t *op, uint64_t op_id); /* lock held */
/* Wait until the op's event arrived (returns 0; the op is unlinked and the
 * caller frees it with kvpd_op_free) or until deadline_ms on CLOCK_MONOTONIC
 * or shutdown (returns -1; the op stays registered). */
int kvpd_op_wait(kvpd_t *d, kvpd_op_t *op, uint64_t deadline_ms);
/* Give up waiting: the dispatcher frees the op when its event comes. */
void kvpd_op_abandon(kvpd_t *d, kvpd_op_t *op);
void kvpd_op_free(kvpd_op_t *op);
/* Drain kvp_poll_events: complete waiters, log peer up/down. */
void kvpd_dispatch(kvpd_t *d);
/* Begin shutdown: every waiter wakes and gives up. */
void kvpd_ops_stop(kvpd_t *d);
/* After kvp_node_destroy: free what is still registered. */
void kvpd_ops_free_all(kvpd_t *d);
uint64_t kvpd_now_ms(void); /* CLOCK_MONOTONIC */
uint64_t kvpd_now_us(void);

/* ------------------------------------------------------------------- http */

/* Start the HTTP server on d->set.http (host:port; port 0 = ephemeral);
 * writes the bound address into d->http_addr. Returns 0 or -1 (logged). */
int kvpd_http_start(kvpd_t *d);
/* Stop accepting, let running handlers answer (bounded), then stop. */
void kvpd_http_stop(kvpd_t *d);

/* -------------------------------------------------------------- peers_dns */
/* Issue 28 (kvpeerd_dns.c): with peers_dns set, a thread resolves the name
 * at once and every peers_dns_interval_ms and wants its addresses (at most
 * peers_dns_max). Start after the node is up: 0 or -1 (logged). Stop before
 * kvp_node_destroy (waits for a resolution in progress). */
typedef struct kvpd_dns kvpd_dns_t;
int kvpd_dns_start(kvpd_t *d);
void kvpd_dns_stop(kvpd_t *d);

#endif
