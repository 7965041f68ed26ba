/*
 * kvpeerd_admin.c -- the /admin/ routes of kvpeerd (only with --admin):
 * synthetic blocks (demo_blocks.h) put, fetched from a peer, verified and,
 * for tests, corrupted. Remote operations block the connection's thread on
 * the dispatcher (kvpeerd_ops.c) until their kvp event arrives.
 */
#include "demo_blocks.h"
#include "kvpeerd_http.h"

#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>

enum {
    ADMIN_MAX_COUNT = 1 << 20,    /* put / verify */
    ADMIN_MAX_FETCH = 1 << 16,    /* keys per lookup / fetch */
    ADMIN_CANCEL_GRACE_MS = 10000 /* after kvp_cancel, the event is due soon */
};

/* first/count of a block range, checked against the 32-bit key space. */
static int param_range(struct MHD_Connection *c, uint32_t max_count, uint32_t *first,
                       uint32_t *count, kvpd_buf_t *out)
{
    uint64_t f, n;
    if (kvpd_http_param_u64(c, "first", 1, 0, UINT32_MAX, &f, out) != 0 ||
        kvpd_http_param_u64(c, "count", 1, 0, max_count, &n, out) != 0)
        return -1;
    if (n == 0 || f + n - 1 > UINT32_MAX) {
        kvpd_buf_printf(out, "parameter count: need 1..%u blocks within the key space\n",
                        max_count);
        return -1;
    }
    *first = (uint32_t)f;
    *count = (uint32_t)n;
    return 0;
}

static void status_text(kvp_status_t st, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", kvp_status_str(st));
    for (char *p = buf; *p; p++) {
        if (*p == ' ')
            *p = '_';
    }
}

int kvpd_admin_put(kvpd_t *d, struct MHD_Connection *c, kvpd_buf_t *out)
{
    uint32_t first, count, ok = 0, failed = 0;
    uint64_t req;
    char key[KVPEER_DEMO_KEY_MAX];
    if (param_range(c, ADMIN_MAX_COUNT, &first, &count, out) != 0 ||
        kvpd_http_param_u64(c, "request", 0, 0, UINT64_MAX, &req, out) != 0)
        return MHD_HTTP_BAD_REQUEST;
    uint8_t *buf = malloc(d->set.cfg.block_size);
    if (buf == NULL) {
        kvpd_buf_printf(out, "out of memory\n");
        return MHD_HTTP_INTERNAL_SERVER_ERROR;
    }
    for (uint32_t i = 0; i < count; i++) {
        uint32_t k = first + i, kl = kvpeer_demo_key(k, key);
        kvpeer_demo_block(k, buf, d->set.cfg.block_size);
        kvp_status_t st = kvp_put(d->node, key, kl, buf, d->set.cfg.block_size, req);
        /* EXISTS: the same key already READY, with the same content by
         * construction: the block is there, which is what put asks for. */
        if (st == KVP_OK || st == KVP_ERR_EXISTS)
            ok++;
        else
            failed++;
    }
    free(buf);
    kvpd_buf_printf(out, "put %u %u\n", ok, failed);
    return MHD_HTTP_OK;
}

static void op_fill_keys(kvpd_op_t *op, uint32_t first, uint32_t count)
{
    size_t off = 0;
    for (uint32_t i = 0; i < count; i++) {
        op->key_lens[i] = kvpeer_demo_key(first + i, (char *)op->keys + off);
        off += op->key_lens[i];
    }
}

/* Wait for op's event until the deadline; a load that is still running
 * then is cancelled (its event follows). Returns 0 with the event's status
 * in *st (the caller owns op), or -1 with TIMEOUT/CLOSED in *st (op
 * abandoned to the dispatcher). */
static int op_finish(kvpd_t *d, kvpd_op_t *op, uint64_t deadline, int cancelable,
                     kvp_status_t *st)
{
    if (kvpd_op_wait(d, op, deadline) == 0 ||
        (cancelable && !d->stopping && kvp_cancel(d->node, op->op_id) == KVP_OK &&
         kvpd_op_wait(d, op, kvpd_now_ms() + ADMIN_CANCEL_GRACE_MS) == 0)) {
        *st = (kvp_status_t)op->ev.status;
        return 0;
    }
    *st = d->stopping ? KVP_ERR_CLOSED : KVP_ERR_TIMEOUT;
    kvpd_op_abandon(d, op);
    return -1;
}

typedef struct fetch_req {
    const char *peer;
    uint32_t first, count;
    uint64_t request, wait, timeout_ms;
} fetch_req_t;

/* Lookup: fills `f` with the hit keys. Returns the lookup's status. */
static kvp_status_t fetch_lookup(kvpd_t *d, const fetch_req_t *r, kvpd_op_t *f, uint32_t *hits,
                                 uint64_t deadline)
{
    kvpd_op_t *op = kvpd_op_new(r->count, r->count * KVPEER_DEMO_KEY_MAX);
    uint64_t id;
    if (op == NULL)
        return KVP_ERR_NOMEM;
    op_fill_keys(op, r->first, r->count);
    kvpd_ops_lock(d);
    kvp_status_t st = kvp_lookup(d->node, r->peer, r->request, op->keys, op->key_lens, r->count,
                                 op->results, &id);
    if (st == KVP_OK)
        kvpd_op_register(d, op, id);
    kvpd_ops_unlock(d);
    if (st != KVP_OK) {
        kvpd_op_free(op);
        return st;
    }
    if (op_finish(d, op, deadline, 0, &st) != 0)
        return st; /* abandoned: the dispatcher frees it */
    size_t off = 0, src = 0;
    *hits = 0;
    for (uint32_t i = 0; i < r->count; i++) {
        if (op->results[i] == 1) {
            memcpy(f->keys + off, op->keys + src, op->key_lens[i]);
            f->key_lens[(*hits)++] = op->key_lens[i];
            off += op->key_lens[i];
        }
        src += op->key_lens[i];
    }
    kvpd_op_free(op);
    return st;
}

/* Returns the load's status; *abandoned tells that f now belongs to the
 * dispatcher. */
static kvp_status_t fetch_load(kvpd_t *d, const fetch_req_t *r, kvpd_op_t *f, uint32_t n,
                               uint32_t *n_ok, uint64_t deadline, int *abandoned)
{
    uint64_t id;
    uint32_t flags = r->wait ? KVP_FETCH_FLAG_WAIT_FOR_SUPPLY : 0;
    kvpd_ops_lock(d);
    kvp_status_t st =
        kvp_fetch(d->node, r->peer, r->request, f->keys, f->key_lens, n, flags, NULL, &id);
    if (st == KVP_OK)
        kvpd_op_register(d, f, id);
    kvpd_ops_unlock(d);
    if (st != KVP_OK)
        return st;
    if (op_finish(d, f, deadline, 1, &st) == 0)
        *n_ok = f->ev.n_ok;
    else
        *abandoned = 1;
    return st;
}

static int fetch_params(struct MHD_Connection *c, fetch_req_t *r, kvpd_buf_t *out)
{
    r->peer = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "peer");
    if (r->peer == NULL || r->peer[0] == '\0') {
        kvpd_buf_printf(out, "missing parameter peer\n");
        return -1;
    }
    if (param_range(c, ADMIN_MAX_FETCH, &r->first, &r->count, out) != 0 ||
        kvpd_http_param_u64(c, "request", 1, 0, UINT64_MAX, &r->request, out) != 0 ||
        kvpd_http_param_u64(c, "wait", 0, 0, 1, &r->wait, out) != 0 ||
        kvpd_http_param_u64(c, "timeout_ms", 0, 60000, 24ull * 3600 * 1000, &r->timeout_ms,
                            out) != 0)
        return -1;
    return 0;
}

int kvpd_admin_fetch(kvpd_t *d, struct MHD_Connection *c, kvpd_buf_t *out)
{
    fetch_req_t r;
    uint32_t hits = 0, n_ok = 0;
    uint64_t lookup_us = 0, fetch_us = 0;
    char stxt[96];
    if (fetch_params(c, &r, out) != 0)
        return MHD_HTTP_BAD_REQUEST;
    uint64_t deadline = kvpd_now_ms() + r.timeout_ms;
    kvpd_op_t *f = kvpd_op_new(r.count, r.count * KVPEER_DEMO_KEY_MAX);
    if (f == NULL) {
        kvpd_buf_printf(out, "out of memory\n");
        return MHD_HTTP_INTERNAL_SERVER_ERROR;
    }
    kvp_status_t st = KVP_OK;
    uint64_t t0 = kvpd_now_us();
    if (r.wait) {
        op_fill_keys(f, r.first, r.count);
        hits = r.count;
    } else {
        st = fetch_lookup(d, &r, f, &hits, deadline);
        lookup_us = kvpd_now_us() - t0;
    }
    if (st == KVP_OK && hits > 0) {
        uint64_t t1 = kvpd_now_us();
        int abandoned = 0;
        st = fetch_load(d, &r, f, hits, &n_ok, deadline, &abandoned);
        fetch_us = kvpd_now_us() - t1;
        if (abandoned)
            f = NULL; /* the dispatcher frees it with its event */
    }
    kvpd_op_free(f);
    status_text(st, stxt, sizeof(stxt));
    kvpd_buf_printf(out, "lookup_hits=%u status=%s status_code=%d n_ok=%u lookup_us=%llu "
                         "fetch_us=%llu\n",
                    r.wait ? 0u : hits, stxt, (int)st, n_ok, (unsigned long long)lookup_us,
                    (unsigned long long)fetch_us);
    return MHD_HTTP_OK;
}

int kvpd_admin_finish(kvpd_t *d, struct MHD_Connection *c, kvpd_buf_t *out)
{
    uint64_t req;
    if (kvpd_http_param_u64(c, "request", 1, 0, UINT64_MAX, &req, out) != 0)
        return MHD_HTTP_BAD_REQUEST;
    kvp_status_t st = kvp_finish_request(d->node, req);
    if (st != KVP_OK && st != KVP_ERR_NOT_FOUND) {
        kvpd_buf_printf(out, "finish failed: %s\n", kvp_status_str(st));
        return MHD_HTTP_BAD_REQUEST;
    }
    kvpd_buf_printf(out, "ok\n");
    return MHD_HTTP_OK;
}

static int status_http(kvp_status_t st)
{
    switch (st) {
    case KVP_ERR_NOT_FOUND: return MHD_HTTP_NOT_FOUND;
    case KVP_ERR_EXISTS: return MHD_HTTP_CONFLICT;
    case KVP_ERR_LIMIT: return MHD_HTTP_TOO_MANY_REQUESTS;
    default: return MHD_HTTP_BAD_REQUEST;
    }
}

int kvpd_admin_peer(kvpd_t *d, struct MHD_Connection *c, kvpd_buf_t *out)
{
    const char *add = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "add");
    const char *rem = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "remove");
    if ((add == NULL) == (rem == NULL) || (add ? add : rem)[0] == '\0') {
        kvpd_buf_printf(out, "need exactly one of add=H:P or remove=H:P\n");
        return MHD_HTTP_BAD_REQUEST;
    }
    kvp_status_t st = add ? kvp_peer_add(d->node, add) : kvp_peer_remove(d->node, rem);
    if (st != KVP_OK) {
        kvpd_buf_printf(out, "peer %s %s: %s\n", add ? "add" : "remove",
                        kvpd_esc(add ? add : rem).s, kvp_status_str(st));
        return status_http(st);
    }
    kvpd_log(KVPD_LOG_INFO, add ? "peer_add" : "peer_remove", "peer=%s source=admin",
             kvpd_esc(add ? add : rem).s);
    kvpd_buf_printf(out, "ok\n");
    return MHD_HTTP_OK;
}

int kvpd_admin_verify(kvpd_t *d, struct MHD_Connection *c, kvpd_buf_t *out)
{
    uint32_t first, count, present = 0, missing = 0, bad = 0;
    char key[KVPEER_DEMO_KEY_MAX];
    if (param_range(c, ADMIN_MAX_COUNT, &first, &count, out) != 0)
        return MHD_HTTP_BAD_REQUEST;
    uint8_t *want = malloc(d->set.cfg.block_size);
    if (want == NULL) {
        kvpd_buf_printf(out, "out of memory\n");
        return MHD_HTTP_INTERNAL_SERVER_ERROR;
    }
    for (uint32_t i = 0; i < count; i++) {
        uint32_t k = first + i, kl = kvpeer_demo_key(k, key);
        kvp_block_t b;
        if (kvp_get(d->node, key, kl, &b) != KVP_OK) {
            missing++;
            continue;
        }
        kvpeer_demo_block(k, want, d->set.cfg.block_size);
        if (b.len == d->set.cfg.block_size && memcmp(b.data, want, b.len) == 0)
            present++;
        else
            bad++;
        kvp_release(d->node, &b);
    }
    free(want);
    kvpd_buf_printf(out, "present=%u missing=%u bad=%u\n", present, missing, bad);
    return MHD_HTTP_OK;
}

#ifdef KVPD_TEST_ROUTES
/* TEST ONLY (compiled only into test builds, issue 27): flip one byte of a
 * READY block in place (the region is our own writable mapping; the pin
 * keeps the slot from moving meanwhile). */
int kvpd_admin_corrupt(kvpd_t *d, struct MHD_Connection *c, kvpd_buf_t *out)
{
    uint64_t k;
    char key[KVPEER_DEMO_KEY_MAX];
    kvp_block_t b;
    if (kvpd_http_param_u64(c, "key", 1, 0, UINT32_MAX, &k, out) != 0)
        return MHD_HTTP_BAD_REQUEST;
    uint32_t kl = kvpeer_demo_key((uint32_t)k, key);
    kvp_status_t st = kvp_get(d->node, key, kl, &b);
    if (st != KVP_OK) {
        kvpd_buf_printf(out, "block %llu: %s\n", (unsigned long long)k, kvp_status_str(st));
        return status_http(st);
    }
    ((volatile uint8_t *)(uintptr_t)b.data)[b.len / 2] ^= 0x5a;
    kvp_release(d->node, &b);
    kvpd_log(KVPD_LOG_WARN, "block_corrupted", "key=%s source=admin", key);
    kvpd_buf_printf(out, "ok\n");
    return MHD_HTTP_OK;
}
#endif
