/*
 * cma_bench.c -- issue 29 item 4: same-host fetches into an embedding's
 * region (memory UCX did not allocate), am-shm against direct-cma.
 *
 * Two processes (the source is this program re-executed with --source), both
 * regions a /dev/shm file mapped MAP_SHARED, unlinked and its fd closed (as
 * vLLM's CPU tier), both nodes external_slots. The source publishes every
 * slot; the consumer repeats: LOOKUP of a batch of keys, kvp_fetch_into the
 * same slot numbers, wait for KVP_EV_LOAD (all verified and committed), over
 * the whole region slot-cycled. am-shm = KVPEER_UCX_CMA=0 in both processes
 * (the consumer does not offer direct-cma); direct-cma = the default.
 * Printed per block size: GB/s of the fetches (fetch_into -> LOAD, 10^9 B/s),
 * blocks/s with the lookups, and direct-cma / am-shm. Linked with the
 * shipped objects (kvpeer_static).
 *
 *   cma_bench [--sizes KiB,..] [--region-mib N] [--batch N] [--mib N]
 *   (defaults 256,2048 KiB; 256 MiB regions; 16 blocks per fetch; 2048 MiB
 *    fetched per size and path)
 */
#include "kvpeer.h"
#include "realnode.h" /* tests/node: the region, the node, the source process */

#include <stdbool.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static const char *g_self;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint8_t *region_map(size_t len)
{
    uint8_t *p = rn_region_map(len, "kvpeer-cma-bench");
    if (p != NULL)
        memset(p, 0, len); /* faulted in before timing, as a running engine's tier */
    return p;
}

static kvp_node_t *node_start(uint8_t *region, uint32_t nb, uint32_t bs)
{
    return rn_node_start(region, nb, bs, 0, 0);
}

static void key(uint32_t i, uint8_t *k, uint32_t *len)
{
    *len = (uint32_t)snprintf((char *)k, 16, "cb%08u", i);
}

static int source_main(uint32_t nb, uint32_t bs)
{
    uint8_t *r = region_map((size_t)nb * bs);
    kvp_node_t *n = r ? node_start(r, nb, bs) : NULL;
    if (n == NULL)
        return 2;
    for (uint32_t i = 0; i < nb; i++) {
        uint8_t k[16];
        uint32_t kl;
        key(i, k, &kl);
        rn_fill(i, r + (size_t)i * bs, bs);
        if (kvp_publish(n, k, kl, i) != KVP_OK)
            return 3;
    }
    rn_source_serve(n);
    kvp_node_destroy(n);
    munmap(r, (size_t)nb * bs);
    return 0;
}

static bool wait_ev(kvp_node_t *n, int type, uint64_t op, kvp_event_t *out)
{
    double end = now_s() + 30;
    while (now_s() < end) {
        kvp_event_t ev;
        uint32_t got = 0;
        if (kvp_wait_events(n, &ev, 1, &got, 100) == KVP_OK && got == 1 && ev.type == type &&
            ev.op_id == op) {
            *out = ev;
            return true;
        }
    }
    return false;
}

typedef struct res {
    double gbs, blocks_s;
    char path[32];
} res_t;

/* One path, one block size. */
static bool run(bool cma, uint32_t bs, size_t region, uint32_t batch, size_t total, res_t *out)
{
    uint32_t nb = (uint32_t)(region / bs);
    char nbs[16], bss[16];
    if (cma)
        unsetenv("KVPEER_UCX_CMA");
    else
        setenv("KVPEER_UCX_CMA", "0", 1); /* both processes */
    snprintf(nbs, sizeof(nbs), "%u", nb);
    snprintf(bss, sizeof(bss), "%u", bs);
    char *argv[] = {(char *)g_self, "--source", nbs, bss, NULL};
    rn_src_t src;
    bool ok = rn_src_spawn(&src, argv);
    const char *peer = src.peer;
    uint8_t *r = ok ? region_map(region) : NULL;
    kvp_node_t *n = r ? node_start(r, nb, bs) : NULL;
    ok = n != NULL && kvp_peer_add(n, peer) == KVP_OK && kvp_peer_wait(n, peer, 10000) == KVP_OK;
    uint8_t *keys = calloc(batch, 16);
    uint32_t *lens = calloc(batch, 4), *slots = calloc(batch, 4);
    uint8_t *lres = calloc(batch, 1);
    int32_t *bst = calloc(batch, 4);
    uint8_t *want = malloc(bs);
    double t_fetch = 0, t0 = now_s();
    size_t done = 0;
    uint64_t req = 1;
    for (uint32_t first = 0; ok && done < total; first = (first + batch) % nb, req++) {
        uint32_t k = batch;
        for (uint32_t i = 0; i < k; i++) {
            slots[i] = (first + i) % nb;
            key(slots[i], keys + 16 * i, &lens[i]);
            memmove(keys + 10 * i, keys + 16 * i, 10); /* packed: 10-byte keys */
        }
        uint64_t op;
        kvp_event_t ev;
        ok = kvp_lookup(n, peer, req, keys, lens, k, lres, &op) == KVP_OK &&
             wait_ev(n, KVP_EV_LOOKUP, op, &ev) && ev.n_ok == k;
        double tf = now_s();
        ok = ok && kvp_fetch_into(n, peer, req, keys, lens, k, slots, 0, bst, &op) == KVP_OK &&
             wait_ev(n, KVP_EV_LOAD, op, &ev) && ev.status == KVP_OK;
        t_fetch += now_s() - tf;
        kvp_finish_request(n, req);
        done += (size_t)k * bs;
        if (ok && req == 1) { /* byte-exact, once */
            rn_fill(slots[0], want, bs);
            ok = memcmp(r + (size_t)slots[0] * bs, want, bs) == 0;
        }
    }
    double t_all = now_s() - t0;
    if (ok) {
        kvp_peer_info_t pi;
        uint32_t np = 0;
        kvp_node_peers(n, &pi, 1, &np);
        snprintf(out->path, sizeof(out->path), "%s", np ? pi.data_path : "?");
        out->gbs = (double)done / t_fetch / 1e9;
        out->blocks_s = (double)(done / bs) / t_all;
    }
    free(keys);
    free(lens);
    free(slots);
    free(lres);
    free(bst);
    free(want);
    if (n)
        kvp_node_destroy(n);
    if (r)
        munmap(r, region);
    rn_src_end(&src, false);
    unsetenv("KVPEER_UCX_CMA");
    return ok;
}

int main(int argc, char **argv)
{
    g_self = argv[0];
    kvp_set_log_level(1); /* warnings and errors */
    if (argc == 4 && strcmp(argv[1], "--source") == 0)
        return source_main((uint32_t)atoi(argv[2]), (uint32_t)atoi(argv[3]));
    char sizes[128] = "256,2048";
    size_t region = 256u << 20, total = 2048u << 20;
    uint32_t batch = 16;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--sizes") == 0)
            snprintf(sizes, sizeof(sizes), "%s", argv[i + 1]);
        else if (strcmp(argv[i], "--region-mib") == 0)
            region = (size_t)atoi(argv[i + 1]) << 20;
        else if (strcmp(argv[i], "--batch") == 0)
            batch = (uint32_t)atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--mib") == 0)
            total = (size_t)atoi(argv[i + 1]) << 20;
        else {
            fprintf(stderr, "usage: %s [--sizes KiB,..] [--region-mib N] [--batch N] [--mib N]\n",
                    argv[0]);
            return 2;
        }
    }
    printf("same host, /dev/shm regions of %zu MiB, %u blocks per fetch, %zu MiB per run\n",
           region >> 20, batch, total >> 20);
    printf("%9s | %-10s %8s %10s | %-10s %8s %10s | %s\n", "block", "path", "GB/s", "blocks/s",
           "path", "GB/s", "blocks/s", "ratio");
    int rc = 0;
    for (char *s = strtok(sizes, ","); s != NULL; s = strtok(NULL, ",")) {
        uint32_t bs = (uint32_t)atoi(s) << 10;
        res_t am = {0}, cm = {0};
        if (bs == 0 || region / bs < batch || !run(false, bs, region, batch, total, &am) ||
            !run(true, bs, region, batch, total, &cm)) {
            fprintf(stderr, "%u KiB: run failed\n", bs >> 10);
            rc = 1;
            continue;
        }
        printf("%6u KiB | %-10s %8.2f %10.0f | %-10s %8.2f %10.0f | %.2fx\n", bs >> 10, am.path,
               am.gbs, am.blocks_s, cm.path, cm.gbs, cm.blocks_s, cm.gbs / am.gbs);
        fflush(stdout);
    }
    return rc;
}
