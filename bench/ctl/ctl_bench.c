/* ctl_bench.c -- the control transport on loopback, two processes:
 *   - handshake time (dial -> ready on the dialing side, which implies the
 *     peer sent its HELLO_ACK; the peer is ready one half-RTT later);
 *   - ping-pong round trips of LOOKUP frames (1, 64, 1024 keys) over ctl
 *     links, next to a raw blocking TCP ping-pong of the same byte sizes,
 *     alternating the two several times; p50/p99 per run, medians, ratio;
 *   - pipelined frames/s over a ctl link (window of 16 in flight).
 * Goals: ctl p50 within 1.5x of raw TCP; handshake <= 10 ms.
 * Usage: ctl_bench [rounds]   (default 3 alternations) */
#include "ctl/ctl.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define BS 4096u
static const char blob[] = "bench-blob";

static uint64_t now_ns(void)
{
    return kvp_clock_now(kvp_clock_real());
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static uint64_t pct(uint64_t *v, size_t n, double p)
{
    qsort(v, n, sizeof(*v), cmp_u64);
    size_t i = (size_t)(p * (double)(n - 1));
    return v[i];
}

static void base_cfg(kvp_ctl_config_t *c, kvp_loop_t *loop, const char *listen)
{
    memset(c, 0, sizeof(*c));
    c->listen_addr = listen;
    c->num_blocks = 1024;
    c->block_size = BS;
    c->fingerprint = 1;
    c->hash_seed = 2;
    c->blob = blob;
    c->blob_len = sizeof(blob);
    c->loop = loop;
}

/* ------------------------------------------------------------ ctl server */

static void srv_on_frame(void *arg, kvp_link_t *link, const kvp_msg_t *msg)
{
    if (msg->type == KVP_MSG_LOOKUP)
        kvp_link_send(link, msg); /* echo */
}

static kvp_status_t any_ready(void *arg, kvp_link_t *l, const kvp_msg_hello_t *p, const void *b,
                              size_t n)
{
    return KVP_OK;
}

static void srv_on_down(void *arg, kvp_link_t *l, kvp_down_reason_t r, uint16_t bye, bool f)
{
}

static void run_ctl_server(int wfd)
{
    kvp_loop_t *loop;
    kvp_ctl_t *ctl;
    kvp_ctl_config_t c;
    if (kvp_loop_create(NULL, &loop) != KVP_OK)
        _exit(2);
    base_cfg(&c, loop, "127.0.0.1:0");
    c.cb.on_ready = any_ready;
    c.cb.on_frame = srv_on_frame;
    c.cb.on_down = srv_on_down;
    if (kvp_ctl_create(&c, &ctl) != KVP_OK)
        _exit(3);
    const char *id = kvp_ctl_peer_id(ctl);
    if (write(wfd, id, strlen(id) + 1) < 0)
        _exit(4);
    close(wfd);
    for (;;)
        kvp_loop_run_once(loop, -1);
}

/* ------------------------------------------------------------ raw server */

static bool read_full(int fd, void *p, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = recv(fd, (char *)p + got, n - got, 0);
        if (r <= 0)
            return false;
        got += (size_t)r;
    }
    return true;
}

static bool write_full(int fd, const void *p, size_t n)
{
    size_t put = 0;
    while (put < n) {
        ssize_t r = send(fd, (const char *)p + put, n - put, MSG_NOSIGNAL);
        if (r <= 0)
            return false;
        put += (size_t)r;
    }
    return true;
}

/* Echo framed messages: u32 length then payload (same bytes as ours). */
static void run_raw_server(int wfd)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    if (bind(ls, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(ls, 4) != 0)
        _exit(2);
    getsockname(ls, (struct sockaddr *)&a, &al);
    char id[64];
    snprintf(id, sizeof(id), "%u", ntohs(a.sin_port));
    if (write(wfd, id, strlen(id) + 1) < 0)
        _exit(4);
    close(wfd);
    static uint8_t buf[8 << 20];
    for (;;) {
        int fd = accept(ls, NULL, NULL);
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        uint32_t len;
        while (read_full(fd, &len, 4) && len <= sizeof(buf) - 4 && read_full(fd, buf + 4, len - 4)) {
            memcpy(buf, &len, 4);
            if (!write_full(fd, buf, len))
                break;
        }
        close(fd);
    }
}

static pid_t spawn(void (*fn)(int), char *out, size_t cap)
{
    int p[2];
    if (pipe(p) != 0)
        exit(1);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        fn(p[1]);
        _exit(0);
    }
    close(p[1]);
    if (read(p[0], out, cap) <= 0)
        exit(1);
    close(p[0]);
    return pid;
}

/* ------------------------------------------------------------ ctl client */

typedef struct client {
    kvp_loop_t *loop;
    kvp_ctl_t *ctl;
    kvp_link_t *link;
    uint64_t echoes;
    int downs;
} client_t;

static kvp_status_t cli_ready(void *arg, kvp_link_t *l, const kvp_msg_hello_t *p, const void *b,
                              size_t n)
{
    ((client_t *)arg)->link = l;
    return KVP_OK;
}

static void cli_frame(void *arg, kvp_link_t *l, const kvp_msg_t *m)
{
    ((client_t *)arg)->echoes++;
}

static void cli_down(void *arg, kvp_link_t *l, kvp_down_reason_t r, uint16_t bye, bool f)
{
    client_t *c = arg;
    c->downs++;
    if (c->link == l)
        c->link = NULL;
}

static void cli_connect(client_t *c, const char *addr, uint64_t *took)
{
    uint64_t t0 = now_ns();
    kvp_ctl_want(c->ctl, addr);
    while (!c->link)
        kvp_loop_run_once(c->loop, -1);
    *took = now_ns() - t0;
}

static void cli_disconnect(client_t *c, const char *addr)
{
    kvp_ctl_unwant(c->ctl, addr);
    kvp_link_close(c->link, KVP_BYE_GRACEFUL);
    int d = c->downs;
    while (c->downs == d)
        kvp_loop_run_once(c->loop, -1);
}

static void make_lookup(kvp_msg_t *m, kvp_key_t *keys, uint32_t n)
{
    static uint8_t kb[1024][32]; /* distinct 32-byte keys, like block hashes */
    memset(m, 0, sizeof(*m));
    m->type = KVP_MSG_LOOKUP;
    m->u.lookup.request_id = 1;
    m->u.lookup.round = 1;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t h = kvp_hash64(&i, sizeof(i), 42);
        for (int j = 0; j < 4; j++)
            memcpy(kb[i] + 8 * j, &h, 8), h = h * 0x9e3779b97f4a7c15ull + 1;
        keys[i] = (kvp_key_t){kb[i], sizeof(kb[i])};
    }
    m->u.lookup.n = n;
    m->u.lookup.keys = keys;
    /* epochs only for sizing: the ctl stamps the link's pair on send */
    memset(m->src_epoch.b, 1, sizeof(m->src_epoch.b));
    memset(m->dst_epoch.b, 2, sizeof(m->dst_epoch.b));
}

static void ctl_pingpong(client_t *c, const kvp_msg_t *m, uint64_t *rtt, int iters)
{
    for (int i = 0; i < iters; i++) {
        uint64_t want = c->echoes + 1, t0 = now_ns();
        kvp_link_send(c->link, m);
        while (c->echoes < want)
            kvp_loop_run_once(c->loop, -1);
        rtt[i] = now_ns() - t0;
    }
}

static double ctl_pipelined(client_t *c, const kvp_msg_t *m, uint64_t dur_ns)
{
    const uint64_t window = 16;
    uint64_t sent = 0, base = c->echoes, t0 = now_ns();
    while (now_ns() - t0 < dur_ns) {
        while (sent - (c->echoes - base) < window) {
            kvp_link_send(c->link, m);
            sent++;
        }
        kvp_loop_run_once(c->loop, -1);
    }
    uint64_t done = c->echoes - base;
    double secs = (double)(now_ns() - t0) / 1e9;
    while (c->echoes - base < sent)
        kvp_loop_run_once(c->loop, -1);
    return (double)done / secs;
}

static void raw_pingpong(int fd, size_t size, uint64_t *rtt, int iters)
{
    static uint8_t buf[8 << 20];
    uint32_t len = (uint32_t)size;
    memset(buf, 7, size);
    memcpy(buf, &len, 4);
    for (int i = 0; i < iters; i++) {
        uint64_t t0 = now_ns();
        if (!write_full(fd, buf, size) || !read_full(fd, buf, size))
            exit(1);
        rtt[i] = now_ns() - t0;
    }
}

static int raw_dial(const char *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                            .sin_port = htons((uint16_t)atoi(port))};
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0)
        exit(1);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* What one encode + one decode of the frame costs (a ctl round trip does
 * two of each: our send and our receive, the echo server's likewise). */
static double codec_us(const kvp_msg_t *m)
{
    static uint8_t buf[1 << 20];
    kvp_wire_scratch_t *sc;
    kvp_wire_ctx_t ctx = {.handshake_done = true, .peer_num_blocks = 1024};
    kvp_msg_t out;
    size_t len = 0;
    if (kvp_wire_scratch_create(&sc) != KVP_OK)
        exit(1);
    enum { N = 2000 };
    uint64_t t0 = now_ns();
    for (int i = 0; i < N; i++) {
        if (kvp_wire_encode(m, buf, sizeof(buf), &len) != KVP_OK ||
            kvp_wire_decode(&ctx, buf, len, sc, &out, NULL, 0) != KVP_OK)
            exit(1);
    }
    double us = (double)(now_ns() - t0) / N / 1e3;
    kvp_wire_scratch_destroy(sc);
    return us;
}

static void bench_sizes(client_t *c, int rawfd, int rounds)
{
    static const uint32_t nkeys[] = {1, 64, 1024};
    static kvp_key_t keys[1024];
    static uint64_t rtt[20000];
    printf("%-6s %8s | %10s %10s | %10s %10s | %7s | %12s %14s | %s\n", "keys", "bytes",
           "ctl p50us", "ctl p99us", "raw p50us", "raw p99us", "ratio", "ctl rt/s",
           "ctl pipe fr/s", "wire codec us (1 enc + 1 dec)");
    for (int s = 0; s < 3; s++) {
        kvp_msg_t m;
        make_lookup(&m, keys, nkeys[s]);
        size_t bytes = kvp_wire_encoded_size(&m);
        int iters = nkeys[s] >= 1024 ? 2000 : 10000;
        double cp50[16], cp99[16], rp50[16], rp99[16], pipe[16];
        for (int r = 0; r < rounds; r++) {
            ctl_pingpong(c, &m, rtt, iters / 10); /* warm-up */
            ctl_pingpong(c, &m, rtt, iters);
            cp99[r] = (double)pct(rtt, (size_t)iters, 0.99) / 1e3;
            cp50[r] = (double)pct(rtt, (size_t)iters, 0.50) / 1e3;
            raw_pingpong(rawfd, bytes, rtt, iters / 10);
            raw_pingpong(rawfd, bytes, rtt, iters);
            rp99[r] = (double)pct(rtt, (size_t)iters, 0.99) / 1e3;
            rp50[r] = (double)pct(rtt, (size_t)iters, 0.50) / 1e3;
            pipe[r] = ctl_pipelined(c, &m, 300 * KVP_NSEC_PER_MSEC);
            printf("  run %d: %4u keys ctl p50 %.1f us p99 %.1f us | raw p50 %.1f us p99 %.1f us\n",
                   r, nkeys[s], cp50[r], cp99[r], rp50[r], rp99[r]);
        }
        double c50 = median(cp50, rounds), c99 = median(cp99, rounds);
        double r50 = median(rp50, rounds), r99 = median(rp99, rounds);
        /* a ctl round trip encodes and decodes the frame twice (both ends) */
        double codec = codec_us(&m);
        printf("%-6u %8zu | %10.1f %10.1f | %10.1f %10.1f | %6.2fx | %12.0f %14.0f | %6.2f\n",
               nkeys[s], bytes, c50, c99, r50, r99, c50 / r50, 1e6 / c50, median(pipe, rounds),
               codec);
    }
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 3;
    if (rounds < 1 || rounds > 16)
        rounds = 3;
    signal(SIGPIPE, SIG_IGN);
    kvp_log_set_level(KVP_LOG_WARN);
    char ctl_addr[256], raw_port[64];
    pid_t ctl_pid = spawn(run_ctl_server, ctl_addr, sizeof(ctl_addr));
    pid_t raw_pid = spawn(run_raw_server, raw_port, sizeof(raw_port));

    client_t c = {0};
    kvp_ctl_config_t cfg;
    if (kvp_loop_create(NULL, &c.loop) != KVP_OK)
        return 1;
    base_cfg(&cfg, c.loop, NULL);
    cfg.peer_id = "bench-client:0";
    cfg.cb = (kvp_ctl_callbacks_t){cli_ready, cli_frame, cli_down, NULL, &c};
    if (kvp_ctl_create(&cfg, &c.ctl) != KVP_OK)
        return 1;

    enum { HS = 50 };
    uint64_t hs[HS];
    for (int i = 0; i < HS; i++) {
        cli_connect(&c, ctl_addr, &hs[i]);
        if (i + 1 < HS)
            cli_disconnect(&c, ctl_addr);
    }
    printf("handshake (dial -> ready, TCP connect included, %d runs): p50 %.3f ms  p99 %.3f ms"
           "  (goal <= 10 ms)\n",
           HS, (double)pct(hs, HS, 0.5) / 1e6, (double)pct(hs, HS, 0.99) / 1e6);

    int rawfd = raw_dial(raw_port);
    bench_sizes(&c, rawfd, rounds);
    printf("ratio = ctl p50 / raw TCP p50 (median of %d alternating runs; goal <= 1.5x).\n"
           "A ctl round trip encodes and decodes the frame twice (both ends); the raw TCP\n"
           "ping-pong moves the same bytes without a codec.\n",
           rounds);

    close(rawfd);
    kvp_ctl_destroy(c.ctl);
    kvp_loop_destroy(c.loop);
    kill(ctl_pid, SIGKILL);
    kill(raw_pid, SIGKILL);
    waitpid(ctl_pid, NULL, 0);
    waitpid(raw_pid, NULL, 0);
    return 0;
}
