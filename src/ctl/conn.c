/* conn.c -- what both connection backends share: the read buffer and the
 * detach-on-close bookkeeping. */
#include "ctl/conn.h"

#include <string.h>

#define CONN_RBUF_INITIAL (64u * 1024)

kvp_status_t kvp_conn_init(kvp_conn_t *c, const kvp_conn_ops_t *ops, kvp_loop_t *loop,
                           size_t wbuf_max)
{
    c->ops = ops;
    c->loop = loop;
    c->wbuf_max = wbuf_max;
    c->linger_ns = 1000 * KVP_NSEC_PER_MSEC;
    kvp_list_init(&c->lingering);
    c->rbuf = kvp__malloc(CONN_RBUF_INITIAL);
    if (!c->rbuf)
        return KVP_ERR_NOMEM;
    c->rcap = CONN_RBUF_INITIAL;
    return KVP_OK;
}

void kvp_conn_fini(kvp_conn_t *c)
{
    if (kvp_list_linked(&c->lingering))
        kvp_list_remove(&c->lingering);
    kvp__free(c->rbuf);
    c->rbuf = NULL;
}

kvp_status_t kvp_conn_rbuf_reserve(kvp_conn_t *c, size_t need)
{
    if (need <= c->rcap)
        return KVP_OK;
    if (need > KVP_WIRE_FRAME_MAX + KVP_WIRE_HDR_LEN)
        return KVP_ERR_LIMIT;
    size_t cap = c->rcap;
    while (cap < need)
        cap *= 2;
    cap = KVP_MIN(cap, (size_t)KVP_WIRE_FRAME_MAX + KVP_WIRE_HDR_LEN);
    uint8_t *b = kvp__realloc(c->rbuf, cap);
    if (!b)
        return KVP_ERR_NOMEM;
    c->rbuf = b;
    c->rcap = cap;
    return KVP_OK;
}

void kvp_conn_rbuf_consume(kvp_conn_t *c, size_t n)
{
    KVP_ASSERT(n <= c->rlen);
    if (n == c->rlen) {
        c->rlen = 0;
        return;
    }
    memmove(c->rbuf, c->rbuf + n, c->rlen - n);
    c->rlen -= n;
}

void kvp_conn_detach(kvp_conn_t *c)
{
    c->h = NULL;
    c->owner = NULL;
    if (c->linger_head && !kvp_list_linked(&c->lingering))
        kvp_list_insert_tail(c->linger_head, &c->lingering);
}
