/*
 * realnode.h -- what the real-node tests and benches share (TCP control,
 * UCX data, 127.0.0.1): an external-slots node on the embedding's memory,
 * that memory (anonymous, or a /dev/shm file the way vLLM maps it), the
 * deterministic block content, waiting for an event, and a source node in
 * a re-executed copy of the program (a clean process: no UCX state
 * inherited) that prints its peer id and serves until its stdin closes.
 *
 * Header-only (static functions), and no cmocka: bench/e2e/cma_bench.c uses
 * it too. Failures are returned (NULL / false); the tests assert on them.
 * Users: tests/node/test_node_cma_ucx.c, test_node_extslots_ucx.c,
 * bench/e2e/cma_bench.c. The transport-level forked peer is
 * tests/transport/ucx_testlib (a transport, not a node).
 */
#ifndef KVP_TEST_REALNODE_H
#define KVP_TEST_REALNODE_H

#include "kvpeer.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RN_UNUSED __attribute__((unused))

static RN_UNUSED uint64_t rn_real_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Block k's content: bs bytes (a multiple of 8). */
static RN_UNUSED void rn_fill(uint32_t k, uint8_t *p, size_t bs)
{
    for (size_t i = 0; i < bs; i += 8) {
        uint64_t v = (uint64_t)k * 0x9e3779b97f4a7c15ull ^ i;
        memcpy(p + i, &v, 8);
    }
}

/* n keys "<3 chars of prefix><k0 + i, 5 digits>", 8 bytes each, packed. */
static RN_UNUSED void rn_keys_make(const char *prefix, uint32_t k0, uint32_t n, uint8_t *buf,
                                   uint32_t *lens)
{
    for (uint32_t i = 0; i < n; i++)
        lens[i] = (uint32_t)snprintf((char *)buf + 8 * i, 9, "%.3s%05u", prefix, k0 + i);
}

/* The embedding's memory, len bytes: anonymous (devshm_tag NULL), or a
 * /dev/shm file "<devshm_tag>-<pid>" mapped MAP_SHARED, then unlinked and
 * its fd closed (what vLLM's shared_offload_region does: only the mapping
 * is left). NULL on failure; munmap it after the node is destroyed. */
static RN_UNUSED uint8_t *rn_region_map(size_t len, const char *devshm_tag)
{
    if (devshm_tag == NULL) {
        void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return p == MAP_FAILED ? NULL : p;
    }
    char name[96];
    snprintf(name, sizeof(name), "/dev/shm/%s-%d", devshm_tag, (int)getpid());
    int fd = open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd < 0)
        return NULL;
    void *p = ftruncate(fd, (off_t)len) == 0
                  ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
    unlink(name);
    close(fd);
    return p == MAP_FAILED ? NULL : p;
}

/* A node on 127.0.0.1:<any port>, nb blocks of bs; in external-slots mode
 * on `region` (nb * bs bytes) unless region is NULL. dead_after_ms (also
 * the handshake timeout) and hold_cap_ms: 0 keeps the default. NULL on
 * failure. */
static RN_UNUSED kvp_node_t *rn_node_start(uint8_t *region, uint32_t nb, uint32_t bs,
                                           uint32_t dead_after_ms, uint32_t hold_cap_ms)
{
    kvp_config_t c;
    kvp_node_t *n = NULL;
    kvp_config_init(&c);
    c.num_blocks = nb;
    c.block_size = bs;
    c.listen_addr = "127.0.0.1:0";
    if (dead_after_ms != 0) {
        c.dead_after_ms = dead_after_ms;
        c.handshake_timeout_ms = c.dead_after_ms;
    }
    if (hold_cap_ms != 0)
        c.hold_cap_ms = hold_cap_ms;
    if (region != NULL) {
        c.external_slots = 1;
        c.region = region;
        c.region_len = (uint64_t)nb * bs;
    }
    return kvp_node_create(&c, &n) == KVP_OK ? n : NULL;
}

/* The next event of `type` (for op_id, 0 = any) within timeout_ms. */
static RN_UNUSED bool rn_wait_event(kvp_node_t *n, int type, uint64_t op_id, uint32_t timeout_ms,
                                    kvp_event_t *out)
{
    uint64_t end = rn_real_ms() + timeout_ms;
    while (rn_real_ms() < end) {
        kvp_event_t ev;
        uint32_t got = 0;
        struct pollfd p = {kvp_node_fd(n), POLLIN, 0};
        poll(&p, 1, 20);
        while (kvp_poll_events(n, &ev, 1, &got) == KVP_OK && got == 1)
            if (ev.type == type && (op_id == 0 || ev.op_id == op_id)) {
                *out = ev;
                return true;
            }
    }
    return false;
}

/* ------------------------------------------- a source in another process */

typedef struct rn_src {
    pid_t pid; /* 0: none */
    int in;    /* its stdin: closing it ends it */
    char peer[128];
} rn_src_t;

/* Runs argv (argv[0] the program: this one, re-executed) with a pipe on its
 * stdin and stdout, and reads the peer id it prints (rn_source_serve).
 * False if that failed (the child, if any, is reaped). */
static RN_UNUSED bool rn_src_spawn(rn_src_t *s, char *const argv[])
{
    int to[2], from[2];
    s->pid = 0;
    s->in = -1;
    s->peer[0] = '\0';
    if (pipe(to) != 0)
        return false;
    if (pipe(from) != 0) {
        close(to[0]);
        close(to[1]);
        return false;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(to[0], 0);
        dup2(from[1], 1);
        close(to[1]);
        close(from[0]);
        execv(argv[0], argv);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    if (pid < 0) {
        close(to[1]);
        close(from[0]);
        return false;
    }
    s->pid = pid;
    s->in = to[1];
    FILE *f = fdopen(from[0], "r");
    bool ok = f != NULL && fgets(s->peer, sizeof(s->peer), f) != NULL;
    if (f != NULL)
        fclose(f);
    else
        close(from[0]);
    s->peer[strcspn(s->peer, "\n")] = '\0';
    return ok;
}

/* Ends the source: SIGKILL (kill_it), or its stdin closed (it destroys its
 * node and exits). True if it exited with status 0 (or there was none). */
static RN_UNUSED bool rn_src_end(rn_src_t *s, bool kill_it)
{
    int status = 0;
    if (s->pid <= 0)
        return true;
    if (kill_it)
        kill(s->pid, SIGKILL);
    close(s->in);
    waitpid(s->pid, &status, 0);
    s->pid = 0;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* The source's side: print the peer id, serve until stdin closes. */
static RN_UNUSED void rn_source_serve(kvp_node_t *n)
{
    printf("%s\n", kvp_node_peer_id(n));
    fflush(stdout);
    char b[16];
    while (read(0, b, sizeof(b)) > 0) {
    }
}

#endif
