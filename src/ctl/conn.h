/*
 * conn.h -- internal: one byte-stream connection behind a small const ops
 * table (Redis connection.h style), with two backends: non-blocking TCP
 * (conn_tcp.c) and the fake in-memory network (conn_fake.c). Framing, the
 * handshake and liveness live above this (ctl.c, link.c) and are shared by
 * both backends, so the fake exercises the same parser as TCP.
 *
 * Ownership: a backend allocates its connection (the kvp_conn_t is the first
 * member of the backend struct) and frees it in ops->close(). The read buffer
 * is owned by the connection and grown by the owner through
 * kvp_conn_rbuf_reserve() up to the frame limit. After close() no handler is
 * ever called again for that connection.
 */
#ifndef KVP_CTL_CONN_H
#define KVP_CTL_CONN_H

#include "ctl/ctl.h"

typedef struct kvp_conn kvp_conn_t;
typedef struct kvp_listener kvp_listener_t;

/* Events a connection reports to its owner (the link). Each is called from
 * the loop, never from inside an ops call. */
typedef struct kvp_conn_handler {
    void (*connected)(kvp_conn_t *c);             /* outbound connect finished */
    void (*readable)(kvp_conn_t *c);              /* new bytes in c->rbuf */
    void (*closed)(kvp_conn_t *c, kvp_status_t why); /* EOF/reset/connect failure */
} kvp_conn_handler_t;

typedef struct kvp_conn_ops {
    const char *name;
    /* Queue bytes (a whole frame). Writes what it can at once, copies the
     * rest. KVP_ERR_LIMIT if the queue would exceed wbuf_max (nothing
     * queued), KVP_ERR_CLOSED if the connection is broken. */
    kvp_status_t (*write)(kvp_conn_t *c, const void *data, size_t len);
    /* Bytes accepted by write() and not yet handed to the kernel / peer. */
    size_t (*queued)(const kvp_conn_t *c);
    /* Graceful: let queued bytes drain (bounded by linger_ns), then close.
     * Hard: drop everything now. Either way the owner is detached at once
     * and never hears from the connection again; the backend frees it. */
    void (*close)(kvp_conn_t *c, bool graceful);
    /* Free a closed (lingering) connection now: only for the ctl's destroy,
     * outside every call chain of the connection. */
    void (*destroy)(kvp_conn_t *c);
    /* Issue 27: a hash of this connection's two endpoints, the same at both
     * ends (sorted), 0 if unknown. NULL: unknown (fake connections). */
    uint64_t (*binding)(const kvp_conn_t *c);
    /* Issue 27: stop (false) or resume (true) taking bytes from the peer
     * (c->read_paused). Paused, nothing is added to rbuf and readable() is
     * not called, so the peer's sends back up into its own socket; a broken
     * connection is still reported through closed(). */
    void (*set_read)(kvp_conn_t *c, bool on);
} kvp_conn_ops_t;

struct kvp_conn {
    const kvp_conn_ops_t *ops;
    const kvp_conn_handler_t *h; /* NULL once the owner detached */
    void *owner;
    kvp_loop_t *loop;
    uint8_t *rbuf; /* owned; rlen bytes valid from the start */
    size_t rlen, rcap;
    size_t wbuf_max;
    uint64_t linger_ns;   /* bound on a graceful close's drain */
    kvp_list_t lingering; /* on *linger_head from close() until the backend frees it */
    kvp_list_t *linger_head; /* the ctl's list of closed connections (set by the owner) */
    char remote[KVP_WIRE_STR_MAX + 1]; /* "host:port" or fake address */
    bool read_paused; /* ops->set_read(c, false) */
};

/* Common helpers (conn.c). */
kvp_status_t kvp_conn_init(kvp_conn_t *c, const kvp_conn_ops_t *ops, kvp_loop_t *loop,
                           size_t wbuf_max);
void kvp_conn_fini(kvp_conn_t *c);
/* Make room for `need` bytes in total (<= KVP_WIRE_FRAME_MAX + header). */
kvp_status_t kvp_conn_rbuf_reserve(kvp_conn_t *c, size_t need);
/* Drop the first n bytes (consumed frames). */
void kvp_conn_rbuf_consume(kvp_conn_t *c, size_t n);
/* Detach the owner and move the connection onto its linger list (close()). */
void kvp_conn_detach(kvp_conn_t *c);

/* Listener: accepts connections and hands them to on_accept (owner must set
 * c->h/c->owner before returning, or close it). */
typedef void (*kvp_accept_cb)(kvp_listener_t *l, kvp_conn_t *c);
struct kvp_listener {
    void (*close)(kvp_listener_t *l);
    kvp_accept_cb on_accept;
    void *owner;
    char addr[KVP_WIRE_STR_MAX + 1]; /* the bound address, "host:port" */
    uint64_t fd_exhausted; /* accepts that failed for want of an fd (issue 27) */
};

/* TCP backend (conn_tcp.c). `addr` is "host:port" or "[v6]:port". */
kvp_status_t kvp_tcp_listen(kvp_loop_t *loop, const char *addr, size_t wbuf_max,
                            kvp_accept_cb cb, void *owner, kvp_listener_t **out);
/* Starts a non-blocking connect; `connected` or `closed` follows from the
 * loop. The handler is set before any event can arrive. */
kvp_status_t kvp_tcp_dial(kvp_loop_t *loop, const char *addr, size_t wbuf_max,
                          const kvp_conn_handler_t *h, void *owner, kvp_conn_t **out);
/* The same with the address already resolved (sa, sslen); `addr` names it. */
kvp_status_t kvp_tcp_dial_ss(kvp_loop_t *loop, const void *sa, unsigned sslen, const char *addr,
                             size_t wbuf_max, const kvp_conn_handler_t *h, void *owner,
                             kvp_conn_t **out);
/* Parse "host:port" / "[v6]:port" (numeric or resolvable host: may block in
 * getaddrinfo). */
kvp_status_t kvp_tcp_parse_addr(const char *addr, void *ss, unsigned *sslen);
/* numeric: never resolve; a host name answers KVP_ERR_BUSY (resolve it off
 * the loop thread, resolve.c). */
kvp_status_t kvp_tcp_parse_addr_ex(const char *addr, void *ss, unsigned *sslen, bool numeric);

/* Fake backend (conn_fake.c). */
kvp_status_t kvp_fake_listen(kvp_fake_net_t *net, kvp_loop_t *loop, const char *addr,
                             size_t wbuf_max, kvp_accept_cb cb, void *owner,
                             kvp_listener_t **out);
kvp_status_t kvp_fake_dial(kvp_fake_net_t *net, kvp_loop_t *loop, const char *local_addr,
                           const char *addr, size_t wbuf_max, const kvp_conn_handler_t *h,
                           void *owner, kvp_conn_t **out);

#endif /* KVP_CTL_CONN_H */
