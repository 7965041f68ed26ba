/* ctl_tcp_testlib.h -- helpers of the real-TCP ctl tests (test_ctl_tcp.c,
 * test_ctl_gate.c): a real-clock loop runner, an environment of three
 * nodes on 127.0.0.1, and a raw client that speaks the wire by hand (the
 * byte-level view of what a refused or hostile peer receives). Included
 * once per test binary (static functions). */
#ifndef KVP_CTL_TCP_TESTLIB_H
#define KVP_CTL_TCP_TESTLIB_H

#include "ctl_testlib.h"
#include "ctl/conn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <unistd.h>
#include <sys/socket.h>

#define MS KVP_NSEC_PER_MSEC

static inline uint64_t now_ns(void)
{
    return kvp_clock_now(kvp_clock_real());
}

/* Run the loop until cond holds or the scaled timeout passes; true if cond. */
#define RUN_UNTIL(loop, cond, ns)                                                                  \
    ({                                                                                             \
        uint64_t end_ = now_ns() + kvp_test_scaled_ns(ns);                                        \
        while (!(cond) && now_ns() < end_)                                                         \
            kvp_loop_run_once((loop), 5);                                                          \
        (cond);                                                                                    \
    })

static inline void run_for(kvp_loop_t *loop, uint64_t ns)
{
    uint64_t end = now_ns() + ns;
    while (now_ns() < end)
        kvp_loop_run_once(loop, 5);
}

typedef struct env {
    kvp_loop_t *loop;
    tnode_t a, b, c;
} env_t;

static inline env_t *env_new(void)
{
    env_t *e = calloc(1, sizeof(*e));
    assert_int_equal(kvp_loop_create(NULL, &e->loop), KVP_OK);
    tn_init(&e->a, e->loop, "127.0.0.1:0", NULL);
    tn_init(&e->b, e->loop, "127.0.0.1:0", NULL);
    tn_init(&e->c, e->loop, "127.0.0.1:0", NULL);
    return e;
}

static inline void env_free(env_t *e)
{
    for (tnode_t *n = &e->a; n <= &e->c; n++)
        if (n->ctl)
            tn_stop(n);
    kvp_loop_destroy(e->loop);
    free(e);
    KVP_TEST_ASSERT_NO_LEAKS();
}

static inline void connect_ab(env_t *e)
{
    tn_start(&e->a);
    tn_start(&e->b);
    assert_int_equal(kvp_ctl_want(e->a.ctl, kvp_ctl_peer_id(e->b.ctl)), KVP_OK);
    assert_true(RUN_UNTIL(e->loop, e->a.ready == 1 && e->b.ready == 1, 2000 * MS));
}

/* ------------------------------------------------------------ raw client */

typedef struct raw {
    int fd;
    uint8_t buf[1 << 20];
    size_t len;
    kvp_wire_ctx_t ctx;
    kvp_wire_scratch_t *scratch;
    kvp_epoch_t epoch, peer_epoch;
    int acks_seen;
    bool eof;
} raw_t;

/* src: the IPv4 source address to bind ("127.0.0.2"), or NULL. */
static inline raw_t *raw_connect_from(const char *addr, const char *src)
{
    raw_t *r = calloc(1, sizeof(*r));
    struct sockaddr_storage ss;
    unsigned sl;
    assert_int_equal(kvp_tcp_parse_addr(addr, &ss, &sl), KVP_OK);
    r->fd = socket(ss.ss_family, SOCK_STREAM, 0);
    assert_true(r->fd >= 0);
    if (src) {
        struct sockaddr_in sin = {.sin_family = AF_INET};
        assert_int_equal(inet_pton(AF_INET, src, &sin.sin_addr), 1);
        assert_int_equal(bind(r->fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
    }
    assert_int_equal(connect(r->fd, (struct sockaddr *)&ss, sl), 0);
    assert_int_equal(kvp_wire_scratch_create(&r->scratch), KVP_OK);
    assert_int_equal(kvp_epoch_new(&r->epoch), KVP_OK);
    return r;
}

static inline raw_t *raw_connect(const char *addr)
{
    return raw_connect_from(addr, NULL);
}

static inline void raw_close(raw_t *r)
{
    if (r->fd >= 0)
        close(r->fd);
    kvp_wire_scratch_destroy(r->scratch);
    free(r);
}

static inline void raw_send_bytes(raw_t *r, const void *p, size_t n)
{
    assert_int_equal(send(r->fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

static inline void raw_send(raw_t *r, kvp_msg_t *m, bool stamp)
{
    static uint8_t out[1 << 20];
    size_t n;
    if (stamp) {
        m->src_epoch = r->epoch;
        m->dst_epoch = r->peer_epoch;
    }
    assert_int_equal(kvp_wire_encode(m, out, sizeof(out), &n), KVP_OK);
    raw_send_bytes(r, out, n);
}

static inline void raw_hello(const tnode_t *like, kvp_msg_t *m, raw_t *r)
{
    memset(m, 0, sizeof(*m));
    m->type = KVP_MSG_HELLO;
    kvp_msg_hello_t *h = &m->u.hello;
    h->major = KVP_WIRE_MAJOR;
    snprintf(h->peer_id, sizeof(h->peer_id), "raw-client:1");
    snprintf(h->instance_id, sizeof(h->instance_id), "raw-client:1");
    h->epoch = r->epoch;
    h->num_blocks = like->cfg.num_blocks;
    h->block_size = like->cfg.block_size;
    h->fingerprint = like->cfg.fingerprint;
    h->hash_seed = like->cfg.hash_seed;
    h->nonce[0] = 1;
}

/* Receive one frame while running the loop (the server lives in this
 * process). Returns false on EOF / timeout. HELLO_ACKs are counted. */
static inline bool raw_recv(raw_t *r, kvp_loop_t *loop, kvp_msg_t *m, uint64_t timeout_ns)
{
    uint64_t end = now_ns() + kvp_test_scaled_ns(timeout_ns);
    for (;;) {
        kvp_frame_hdr_t hdr;
        if (kvp_wire_parse_hdr(&r->ctx, r->buf, r->len, &hdr) == KVP_OK &&
            r->len >= KVP_WIRE_HDR_LEN + hdr.length) {
            size_t n = KVP_WIRE_HDR_LEN + hdr.length;
            assert_int_equal(kvp_wire_decode(&r->ctx, r->buf, n, r->scratch, m, NULL, 0), KVP_OK);
            if (m->type == KVP_MSG_HELLO_ACK)
                r->acks_seen++;
            memmove(r->buf, r->buf + n, r->len - n);
            r->len -= n;
            return true;
        }
        if (r->eof || now_ns() > end)
            return false;
        kvp_loop_run_once(loop, 1);
        ssize_t got = recv(r->fd, r->buf + r->len, sizeof(r->buf) - r->len, MSG_DONTWAIT);
        if (got == 0 || (got < 0 && errno != EAGAIN))
            r->eof = true;
        else if (got > 0)
            r->len += (size_t)got;
    }
}

/* Read everything until EOF; returns the last BYE reason seen (or -1). */
static inline int raw_drain(raw_t *r, kvp_loop_t *loop)
{
    kvp_msg_t m;
    int bye = -1;
    while (raw_recv(r, loop, &m, 2000 * MS))
        if (m.type == KVP_MSG_BYE)
            bye = m.u.bye.reason;
    return bye;
}

/* The raw client's half of a handshake (no psk) against node n: HELLO (under
 * peer id `id`, NULL = the one raw_hello gives), n's HELLO, then a HELLO_ACK
 * carrying `blob`. */
static inline void raw_hello_ack(raw_t *r, tnode_t *n, const char *id, const void *blob,
                                 size_t len)
{
    kvp_msg_t m;
    raw_hello(n, &m, r);
    if (id != NULL)
        snprintf(m.u.hello.peer_id, sizeof(m.u.hello.peer_id), "%s", id);
    raw_send(r, &m, false);
    assert_true(raw_recv(r, n->loop, &m, 2000 * MS));
    assert_int_equal(m.type, KVP_MSG_HELLO);
    r->peer_epoch = m.u.hello.epoch;
    r->ctx.peer_num_blocks = m.u.hello.num_blocks;
    memset(&m, 0, sizeof(m));
    m.type = KVP_MSG_HELLO_ACK;
    m.u.hello_ack.acked_epoch = r->peer_epoch;
    m.u.hello_ack.blob = blob;
    m.u.hello_ack.blob_len = (uint32_t)len;
    raw_send(r, &m, true);
}

/* The raw client plays a full handshake (no psk) against node n. */
static inline void raw_handshake(raw_t *r, tnode_t *n)
{
    int ready0 = n->ready;
    kvp_msg_t m;
    raw_hello_ack(r, n, NULL, "raw", 3);
    assert_true(raw_recv(r, n->loop, &m, 2000 * MS));
    assert_int_equal(m.type, KVP_MSG_HELLO_ACK);
    r->ctx.handshake_done = true;
    assert_true(RUN_UNTIL(n->loop, n->ready == ready0 + 1, 1000 * MS));
}

#endif
