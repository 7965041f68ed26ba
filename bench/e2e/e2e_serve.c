/*
 * e2e_serve.c -- the producer of bench/e2e: a kvpeer node in its own process
 * (exec'd by the bench with --serve), holding NUM_BLOCKS blocks of keys
 * e2e-00000000.. with content from e2e_block_fill, plus a raw TCP ping-pong
 * server (the lookup-latency floor). Protocol on stdin/stdout, one line each:
 *
 *   (start)  -> "ready <peer-id> <ping-pong-port> <data-path-unknown-yet>"
 *   rusage   -> "rusage <user+sys CPU seconds of this process, all threads>"
 *   quit     -> destroys the node (drain) and exits 0 (also on EOF)
 *
 * The ping-pong server answers one connection at a time: per round a header
 * (u32 request bytes, u32 response bytes), the request bytes, then it writes
 * the response bytes. TCP_NODELAY on both ends, like the control plane.
 */
#include "e2e.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

static void pp_serve_conn(int c)
{
    enum { CAP = 1 << 20 };
    uint8_t *buf = calloc(1, CAP);
    int one = 1;
    setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    for (uint32_t h[2]; buf && e2e_io_all(c, h, sizeof(h), false);) {
        if (h[0] > CAP || h[1] > CAP || !e2e_io_all(c, buf, h[0], false) ||
            !e2e_io_all(c, buf, h[1], true))
            break;
    }
    free(buf);
    close(c);
}

/* The listener thread: ends when quit shuts the listening socket down. */
static void *pp_thread(void *arg)
{
    int lfd = *(int *)arg;
    for (;;) {
        int c = accept(lfd, NULL, NULL);
        if (c < 0) {
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            return NULL;
        }
        pp_serve_conn(c);
    }
}

static int pp_listen(int *port)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(fd, 4) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &al) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    *port = ntohs(a.sin_port);
    return fd;
}

static double rusage_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static kvp_status_t fill_store(kvp_node_t *node, uint32_t bs, uint32_t n)
{
    uint8_t key[16], *buf = malloc(bs);
    kvp_status_t st = buf ? KVP_OK : KVP_ERR_NOMEM;
    for (uint32_t k = 0; k < n && st == KVP_OK; k++) {
        e2e_block_fill(k, buf, bs);
        st = kvp_put(node, key, e2e_key(k, key), buf, bs, 0);
    }
    free(buf);
    return st;
}

int e2e_serve_main(int argc, char **argv)
{
    kvp_config_t cfg;
    kvp_node_t *node = NULL;
    pthread_t th;
    int port = 0, lfd = -1, rc = 1;
    char line[64];

    if (argc != 3)
        return 2;
    if (!getenv("KVPEER_LOG_LEVEL"))
        kvp_set_log_level(1); /* warnings and errors only: the bench owns stdout */
    kvp_config_init(&cfg);
    cfg.name = "e2e-producer";
    cfg.block_size = (uint32_t)strtoul(argv[0], NULL, 10);
    cfg.num_blocks = (uint32_t)strtoul(argv[1], NULL, 10);
    cfg.compat = "kvpeer-e2e-bench";
    e2e_config_keep(&cfg, (uint32_t)strtoul(argv[2], NULL, 10));
    kvp_status_t st = kvp_node_create(&cfg, &node);
    if (st != KVP_OK) {
        fprintf(stderr, "e2e producer: node create: %s\n", kvp_status_str(st));
        return 1;
    }
    if ((st = fill_store(node, cfg.block_size, cfg.num_blocks)) != KVP_OK) {
        fprintf(stderr, "e2e producer: put: %s\n", kvp_status_str(st));
        goto out_node;
    }
    if ((lfd = pp_listen(&port)) < 0 || pthread_create(&th, NULL, pp_thread, &lfd) != 0) {
        fprintf(stderr, "e2e producer: ping-pong listener: %s\n", strerror(errno));
        goto out_listen;
    }
    printf("ready %s %d\n", kvp_node_peer_id(node), port);
    fflush(stdout);
    while (fgets(line, sizeof(line), stdin)) {
        if (!strncmp(line, "rusage", 6))
            printf("rusage %.6f\n", rusage_s());
        else if (!strncmp(line, "quit", 4))
            break;
        else
            printf("err unknown command\n");
        fflush(stdout);
    }
    rc = 0;
    shutdown(lfd, SHUT_RDWR); /* wakes accept(): the thread returns */
    pthread_join(th, NULL);
out_listen:
    if (lfd >= 0)
        close(lfd);
out_node:
    kvp_node_destroy(node);
    return rc;
}
