/*
 * ucx_tcpd.c -- the UCX backend's am-tcp path on kvpeer's own tcp stream
 * (tcpd.h; issue 27).
 *
 * Source side: each block goes as pieces of at most KVP_TCPD_PIECE_MAX,
 * queued on the peer's stream straight from the pinned source slot (no
 * copy); a piece counts as one request of its transfer (r->pending) and
 * completes when the socket took its last byte (the data left our memory,
 * as a UCX eager send's local completion) or fails when the stream does.
 * The transfer is terminal when all its pieces are; the consumer trusts only
 * what its landing rule saw (LANDING), exactly as on the UCX AM path.
 *
 * Consumer side: a piece from a stream that proved our token is handed to
 * the same landing rule as a UCX active message (kvp__ucx_land), with the
 * source token the stream's preface named. No one else's code parses bytes
 * from the network on this path.
 */
#include "transport/ucx_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>

static void ucx_tcpd_land(void *arg, uint64_t src_token, const kvp_tcpd_piece_t *p,
                          const uint8_t *data)
{
    ucx_xport_t *x = arg;
    ucx_am_hdr_t h = {UCX_AM_MAGIC, p->slot, p->gen, p->off, p->len, p->zero, src_token, x->token};
    kvp__ucx_land(x, &h, data, p->len);
}

static void ucx_tcpd_sent(void *arg, void *cookie, bool ok)
{
    (void)arg;
    if (cookie != NULL) /* NULL: a piece a transport test sent by hand */
        kvp__ucx_xfer_step(cookie, ok ? UCS_OK : UCS_ERR_CONNECTION_RESET);
}

/* The stream to a peer failed: as an endpoint error (ucx.c, ucx_ep_err_cb),
 * the outcome of everything it carried is unknown to the consumer; here, at
 * the source, every piece not yet written fails its transfer. */
static void ucx_tcpd_failed(void *arg, void *owner, const char *why)
{
    ucx_xport_t *x = arg;
    ucx_peer_t *p = owner;

    p->err_seq++;
    if (p->ep_err == UCS_OK) {
        p->ep_err = UCS_ERR_CONNECTION_RESET;
        KVP_WARN(PFX(x), "peer %llu: data stream failed: %s (outcome of its transfers unknown)",
                 (unsigned long long)p->id, why);
    }
    if (p->status == KVP_OK)
        p->status = KVP_ERR_TRANSPORT;
    x->base.ep_failures++;
}

kvp_status_t kvp__ucx_tcpd_open(ucx_xport_t *x, const kvp_ucx_config_t *cfg)
{
    kvp_tcpd_config_t tc = {
        .log_prefix = PFX(x),
        .listen_addr = cfg->listen_addr,
        .port = cfg->data_port,
        .token = x->token,
        .connect_timeout_ms = cfg->connect_timeout_ms,
    };
    kvp_tcpd_cbs_t cbs = {x, ucx_tcpd_land, ucx_tcpd_sent, ucx_tcpd_failed};
    kvp_status_t st = kvp__tcpd_open(&tc, &cbs, &x->tcpd);
    if (st != KVP_OK)
        return st;
    struct epoll_event ev = {.events = EPOLLIN};
    if (epoll_ctl(x->epfd, EPOLL_CTL_ADD, kvp__tcpd_fd(x->tcpd), &ev) != 0) {
        KVP_ERROR(PFX(x), "epoll for the data stream: %s", strerror(errno));
        return KVP_ERR_IO;
    }
    return KVP_OK;
}

size_t kvp__ucx_tcpd_post(ucx_xport_t *x, ucx_peer_t *p, ucx_xfer_t *r,
                          const kvp_xfer_block_t *blocks, size_t n)
{
    const size_t bs = x->layout.block_size;
    size_t posted = 0;

    for (size_t i = 0; i < n; i++) {
        const uint8_t *src = (const uint8_t *)x->region + (size_t)blocks[i].src_slot * bs;
        for (size_t off = 0; off < bs; off += KVP_TCPD_PIECE_MAX) {
            kvp_tcpd_piece_t h = {KVP_TCPD_PIECE_MAGIC, blocks[i].dst_slot, blocks[i].dst_gen,
                                  (uint32_t)off, (uint32_t)KVP_MIN(bs - off, KVP_TCPD_PIECE_MAX),
                                  0};
            kvp_status_t st = kvp__tcpd_send(p->out, &h, src + off, r);
            if (st != KVP_OK) {
                if (r->first_err == UCS_OK)
                    r->first_err = st == KVP_ERR_NOMEM ? UCS_ERR_NO_MEMORY
                                                        : UCS_ERR_CONNECTION_RESET;
                goto out;
            }
            r->pending++;
            posted++;
        }
    }
out:
    kvp__tcpd_kick(p->out); /* may complete pieces (and r) at once */
    return posted;
}

void kvp__ucx_next_peer_host(kvp_xport_t *xp, const char *host)
{
    ucx_xport_t *x = ucx_of(xp);
    snprintf(x->next_host, sizeof(x->next_host), "%s", host ? host : "");
}
