/*
 * test_tcpd.c -- kvpeer's own tcp data stream alone (src/transport/tcpd.h,
 * issue 27), in one process on loopback: pieces land through the callback
 * in order; a wildcard listener is reached at the control connection's
 * address; a wrong token, a bad header or an over-long piece close the
 * connection and land nothing; closing a stream reports every queued piece
 * as never sent; the unauthenticated cap evicts the oldest.
 */
#include "testutil.h"
#include "transport/tcpd.h"

#include <arpa/inet.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TOKEN_A 0x1111222233334444ull
#define TOKEN_B 0x5555666677778888ull

typedef struct rec {
    uint32_t landed, bytes, sent_ok, sent_fail, failed;
    uint64_t last_src;
    uint8_t data[4096];
} rec_t;

static void on_land(void *arg, uint64_t src, const kvp_tcpd_piece_t *h, const uint8_t *d)
{
    rec_t *r = arg;
    r->landed++;
    r->bytes += h->len;
    r->last_src = src;
    if (h->off + h->len <= sizeof(r->data))
        memcpy(r->data + h->off, d, h->len);
}

static void on_sent(void *arg, void *cookie, bool ok)
{
    rec_t *r = arg;
    (void)cookie;
    if (ok)
        r->sent_ok++;
    else
        r->sent_fail++;
}

static void on_failed(void *arg, void *owner, const char *why)
{
    rec_t *r = arg;
    (void)owner;
    (void)why;
    r->failed++;
}

static kvp_tcpd_t *open_one(const char *listen, uint64_t token, rec_t *r, uint32_t max_preauth)
{
    kvp_tcpd_config_t c = {.log_prefix = "tcpd-test", .listen_addr = listen, .token = token,
                           .max_preauth = max_preauth, .max_preauth_per_addr = 64};
    kvp_tcpd_cbs_t cbs = {r, on_land, on_sent, on_failed};
    kvp_tcpd_t *t = NULL;
    assert_int_equal(kvp__tcpd_open(&c, &cbs, &t), KVP_OK);
    return t;
}

static void turn(kvp_tcpd_t *a, kvp_tcpd_t *b, int ms)
{
    struct timespec ts = {0, 1000000};
    for (int i = 0; i < ms; i++) {
        kvp__tcpd_progress(a);
        if (b)
            kvp__tcpd_progress(b);
        nanosleep(&ts, NULL);
    }
}

/* A raw client to t's port from 127.0.0.1. */
static int raw(kvp_tcpd_t *t)
{
    kvp_tcpd_addr_t a;
    kvp__tcpd_local_addr(t, &a);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(a.port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

static void test_pieces_land_wildcard(void **state)
{
    (void)state;
    rec_t ra = {0}, rb = {0};
    kvp_tcpd_t *a = open_one("127.0.0.1:0", TOKEN_A, &ra, 0);
    kvp_tcpd_t *b = open_one("0.0.0.0:0", TOKEN_B, &rb, 0); /* the consumer, wildcard */
    kvp_tcpd_addr_t ba;
    kvp__tcpd_local_addr(b, &ba);
    assert_int_equal(ba.family, 4);
    assert_null(kvp__tcpd_connect(a, &ba, NULL, TOKEN_B, NULL)); /* wildcard, no fallback */
    kvp_tcpd_out_t *o = kvp__tcpd_connect(a, &ba, "127.0.0.1", TOKEN_B, NULL);
    assert_non_null(o);
    static uint8_t src[4096];
    for (size_t i = 0; i < sizeof(src); i++)
        src[i] = (uint8_t)(i * 7 + 1);
    kvp_tcpd_piece_t h1 = {KVP_TCPD_PIECE_MAGIC, 3, 9, 0, 1000, 0};
    kvp_tcpd_piece_t h2 = {KVP_TCPD_PIECE_MAGIC, 3, 9, 1000, 3096, 0};
    assert_int_equal(kvp__tcpd_send(o, &h1, src, NULL), KVP_OK);
    assert_int_equal(kvp__tcpd_send(o, &h2, src + 1000, NULL), KVP_OK);
    kvp__tcpd_kick(o);
    turn(a, b, 200);
    assert_int_equal(ra.sent_ok, 2);
    assert_int_equal(rb.landed, 2);
    assert_int_equal(rb.last_src, TOKEN_A);
    assert_memory_equal(rb.data, src, sizeof(src));
    kvp_tcpd_stats_t st;
    kvp__tcpd_stats(b, &st);
    assert_int_equal(st.open, 1);
    kvp__tcpd_out_close(o);
    turn(a, b, 50);
    kvp__tcpd_stats(b, &st);
    assert_int_equal(st.open, 0); /* the consumer saw the close */
    assert_int_equal(ra.failed, 0); /* our own close is not a failure */
    kvp__tcpd_close(a);
    kvp__tcpd_close(b);
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void test_doors(void **state)
{
    (void)state;
    rec_t rb = {0};
    kvp_tcpd_t *b = open_one("127.0.0.1:0", TOKEN_B, &rb, 4);
    kvp_tcpd_stats_t st;
    /* a wrong token */
    kvp_tcpd_preface_t bad = {KVP_TCPD_PREFACE_MAGIC, KVP_TCPD_VERSION, TOKEN_B ^ 1, TOKEN_A};
    int fd = raw(b);
    assert_int_equal(write(fd, &bad, sizeof(bad)), (ssize_t)sizeof(bad));
    turn(b, NULL, 50);
    kvp__tcpd_stats(b, &st);
    assert_int_equal(st.closed_bad_preface, 1);
    close(fd);
    /* the right token, then an over-long piece: closed, nothing lands */
    kvp_tcpd_preface_t good = {KVP_TCPD_PREFACE_MAGIC, KVP_TCPD_VERSION, TOKEN_B, TOKEN_A};
    kvp_tcpd_piece_t big = {KVP_TCPD_PIECE_MAGIC, 0, 0, 0, KVP_TCPD_PIECE_MAX + 1, 0};
    fd = raw(b);
    assert_int_equal(write(fd, &good, sizeof(good)), (ssize_t)sizeof(good));
    assert_int_equal(write(fd, &big, sizeof(big)), (ssize_t)sizeof(big));
    turn(b, NULL, 50);
    kvp__tcpd_stats(b, &st);
    assert_int_equal(st.authenticated, 1);
    assert_int_equal(st.closed_proto, 1);
    assert_int_equal(st.open, 0);
    close(fd);
    /* garbage where a header goes */
    fd = raw(b);
    assert_int_equal(write(fd, &good, sizeof(good)), (ssize_t)sizeof(good));
    assert_int_equal(write(fd, "GET / HTTP/1.0\r\n\r\n.....", 24), 24);
    turn(b, NULL, 50);
    kvp__tcpd_stats(b, &st);
    assert_int_equal(st.closed_proto, 2);
    close(fd);
    /* the unauthenticated cap (4 here): the oldest goes, the newest stays */
    int idle[6];
    for (int i = 0; i < 6; i++) {
        idle[i] = raw(b);
        turn(b, NULL, 5);
    }
    kvp__tcpd_stats(b, &st);
    assert_int_equal(st.refused_preauth_cap, 2);
    fd = idle[5]; /* the newest can still authenticate */
    assert_int_equal(write(fd, &good, sizeof(good)), (ssize_t)sizeof(good));
    turn(b, NULL, 50);
    kvp__tcpd_stats(b, &st);
    assert_int_equal(st.open, 1);
    assert_int_equal(rb.landed, 0);
    for (int i = 0; i < 6; i++)
        close(idle[i]);
    kvp__tcpd_close(b);
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* Closing a stream whose consumer does not read reports every piece the
 * socket did not take as never sent, at once. */
static void test_close_fails_queued(void **state)
{
    (void)state;
    rec_t ra = {0}, rb = {0};
    kvp_tcpd_t *a = open_one("127.0.0.1:0", TOKEN_A, &ra, 0);
    kvp_tcpd_t *b = open_one("127.0.0.1:0", TOKEN_B, &rb, 0);
    kvp_tcpd_addr_t ba;
    kvp__tcpd_local_addr(b, &ba);
    kvp_tcpd_out_t *o = kvp__tcpd_connect(a, &ba, NULL, TOKEN_B, NULL);
    assert_non_null(o);
    uint8_t *src = test_malloc(KVP_TCPD_PIECE_MAX);
    memset(src, 0x5a, KVP_TCPD_PIECE_MAX);
    kvp_tcpd_piece_t h = {KVP_TCPD_PIECE_MAGIC, 0, 0, 0, KVP_TCPD_PIECE_MAX, 0};
    const uint32_t n = 256; /* 64 MiB: more than any socket buffer takes */
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(kvp__tcpd_send(o, &h, src, NULL), KVP_OK);
    kvp__tcpd_kick(o);
    turn(a, NULL, 100); /* b never progresses: nothing is read */
    assert_true(ra.sent_ok < n);
    kvp__tcpd_out_close(o);
    assert_int_equal(ra.sent_ok + ra.sent_fail, n);
    assert_true(ra.sent_fail > 0);
    kvp__tcpd_close(a);
    kvp__tcpd_close(b);
    test_free(src);
    KVP_TEST_ASSERT_NO_LEAKS();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pieces_land_wildcard),
        cmocka_unit_test(test_doors),
        cmocka_unit_test(test_close_fails_queued),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
