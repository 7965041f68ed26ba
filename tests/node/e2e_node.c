/*
 * e2e_node.c -- a kvpeer node in its own process for end-to-end tests over
 * real TCP and UCX. It prints "ready <peer-id> <data-path-of-first-peer>" and
 * then answers one line per command read from stdin:
 *
 *   put FIRST COUNT [REQ]            -> "ok <n-put>" (external, REQ not 0: every
 *                                       third block published once for REQ)
 *   add PEER                         -> "ok" once the session is up (or "err ...")
 *   fetch PEER FIRST COUNT REQ       -> lookup + fetch of the hits; waits for the
 *                                       load: "load <status> <n_ok> <hits> <us> <n_held>"
 *   fetchnw PEER FIRST COUNT REQ     -> starts lookup+fetch, answers "started" at once;
 *                                       the load event is reported by "wait"
 *   wait MS                          -> "load <status> <n_ok> <hits> <us>" or "none"
 *   verify FIRST COUNT               -> "verify <present> <bad>" (byte-exact re-read);
 *                                       external: "verify <present> <bad> <late> <view_bad>"
 *   settle MS                        -> external: waits (at most MS) until no slot is
 *                                       lent, held or published: "settle <lent> <held> <pub> <ms>"
 *   unpub FIRST COUNT                -> external: "unpub <back-now> <busy>" (busy:
 *                                       back by SLOT_FREE, a once block's maybe already)
 *   busy MS                          -> the main (engine) thread is busy; "ok"
 *   stats                            -> "stats <ready> <filling> <quarantined> <suspect>
 *                                       <pins> <retained> <force_releases> <mismatches>
 *                                       <am_refuse_releases> <late_bytes_dropped>"
 *   path PEER                        -> "path <data-path>"
 *   blob                             -> "blob <hex>": this node's data-transport
 *                                       address blob (issue 27: handed to the
 *                                       foreign UCX attacker, stronger than a
 *                                       real one, which never sees it)
 *   quit                             -> destroys the node (drain), exits 0
 *
 * Usage: e2e_node LISTEN_ADDR BLOCK_SIZE NUM_BLOCKS [HOLD_CAP_MS] [DEAD_AFTER_MS]
 * Environment: KVPEER_E2E_PSK=<text>: that pre-shared key (issue 27 tests).
 * KVPEER_E2E_EXTERNAL=1: external-slots mode (issue 29; e2e_ext.c): the
 * process owns the region, `put` publishes, `fetch` is kvp_fetch_into.
 * Blocks: key "blk-%08u", content from a seeded PRNG (as tests/node/world.h).
 */
#include "kvpeer.h"
#include "common/common.h"
#include "node/node.h"
#include "transport/transport.h"
#include "e2e_ext.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static kvp_node_t *node;
static uint32_t block_size;
static uint64_t t_fetch_start;
static int ext; /* KVPEER_E2E_EXTERNAL */

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void block_fill(uint32_t k, uint8_t *buf, size_t len)
{
    uint64_t x = 0x5eed0000u + k;
    for (size_t i = 0; i < len; i += 8) { /* splitmix64 stream */
        uint64_t z = (x += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        memcpy(buf + i, &z, 8);
    }
}

static uint32_t key_of(uint32_t k, uint8_t *out)
{
    return (uint32_t)snprintf((char *)out, 16, "blk-%08u", k);
}

/* Wait for one event of `type` (for op, if non-zero), at most ms. */
static int wait_event(int type, uint64_t op, int ms, kvp_event_t *out)
{
    uint64_t end = now_us() + (uint64_t)ms * 1000u;
    while (now_us() < end) {
        kvp_event_t ev;
        uint32_t n = 0;
        kvp_poll_events(node, &ev, 1, &n);
        if (n == 1 && ext)
            e2e_ext_event(&ev);
        if (n == 1 && ev.type == type && (op == 0 || ev.op_id == op)) {
            *out = ev;
            return 1;
        }
        if (n == 0)
            usleep(500);
    }
    return 0;
}

typedef struct pending {
    uint64_t op;
    uint32_t hits;
    uint8_t keys[16 * 4096];
    uint32_t lens[4096];
    uint8_t res[4096];
    uint32_t ks[4096], slots[4096]; /* external: block k and slot of each hit */
    int32_t status[4096];
} pending_t;

static pending_t pend;

static int start_fetch(const char *peer, uint32_t first, uint32_t count, uint64_t req)
{
    size_t off = 0;
    uint64_t op;
    kvp_event_t ev;
    if (count > 4096)
        return -1;
    for (uint32_t i = 0; i < count; i++) {
        pend.lens[i] = key_of(first + i, pend.keys + off);
        off += pend.lens[i];
    }
    t_fetch_start = now_us();
    if (kvp_lookup(node, peer, req, pend.keys, pend.lens, count, pend.res, &op) != KVP_OK ||
        !wait_event(KVP_EV_LOOKUP, op, 10000, &ev))
        return -1;
    /* Fetch the hits only (the keys must be those of the lookup round). */
    size_t src = 0, dst = 0;
    uint32_t k = 0;
    for (uint32_t i = 0; i < count; i++) {
        if (pend.res[i] == 1) {
            memmove(pend.keys + dst, pend.keys + src, pend.lens[i]);
            pend.ks[k] = first + i;
            pend.lens[k++] = pend.lens[i];
            dst += pend.lens[i];
        }
        src += pend.lens[i];
    }
    pend.hits = k;
    if (k == 0)
        return 0;
    kvp_status_t st = ext ? e2e_ext_fetch(node, peer, req, pend.keys, pend.lens, k, pend.status,
                                          pend.slots, &pend.op)
                          : kvp_fetch(node, peer, req, pend.keys, pend.lens, k, 0, NULL, &pend.op);
    return st == KVP_OK ? 1 : -1;
}

static void report_load(int ms)
{
    kvp_event_t ev;
    if (!wait_event(KVP_EV_LOAD, pend.op, ms, &ev)) {
        printf("none\n");
        return;
    }
    if (ext)
        e2e_ext_load_done(pend.op, pend.slots, pend.ks, pend.hits, pend.status);
    printf("load %d %u %u %" PRIu64 " %u\n", ev.status, ev.n_ok, pend.hits,
           now_us() - t_fetch_start, ev.n_held);
}

static void cmd_verify(uint32_t first, uint32_t count)
{
    if (ext) {
        uint32_t present, bad, late, view_bad;
        e2e_ext_verify(node, first, count, block_fill, &present, &bad, &late, &view_bad);
        printf("verify %u %u %u %u\n", present, bad, late, view_bad);
        return;
    }
    uint8_t key[16], *buf = malloc(block_size);
    uint32_t present = 0, bad = 0;
    for (uint32_t k = first; k < first + count; k++) {
        kvp_block_t b;
        uint32_t kl = key_of(k, key);
        if (kvp_get(node, key, kl, &b) != KVP_OK)
            continue;
        present++;
        block_fill(k, buf, block_size);
        bad += memcmp(b.data, buf, block_size) != 0;
        kvp_release(node, &b);
    }
    free(buf);
    printf("verify %u %u\n", present, bad);
}

static void cmd_put(uint32_t first, uint32_t count, uint64_t req)
{
    uint8_t key[16], *buf = malloc(block_size);
    uint32_t ok = 0;
    for (uint32_t k = first; k < first + count; k++) {
        uint32_t kl = key_of(k, key);
        if (ext) {
            ok += e2e_ext_put(node, k, key, kl, block_fill, req); /* REQ: a third once */
            continue;
        }
        block_fill(k, buf, block_size);
        ok += kvp_put(node, key, kl, buf, block_size, req) == KVP_OK;
    }
    free(buf);
    printf("ok %u\n", ok);
}

static void cmd_add(const char *peer)
{
    kvp_event_t ev;
    kvp_peer_add(node, peer);
    for (int i = 0; i < 100; i++) {
        kvp_peer_info_t pi[16];
        uint32_t n = 0;
        kvp_node_peers(node, pi, 16, &n);
        for (uint32_t k = 0; k < n; k++)
            if (strcmp(pi[k].peer, peer) == 0 && pi[k].ready) {
                printf("ok\n");
                return;
            }
        wait_event(KVP_EV_PEER_UP, 0, 100, &ev);
    }
    printf("err no session\n");
}

static void cmd_stats(void)
{
    kvp_stats_t s;
    kvp_node_stats(node, &s);
    printf("stats %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64
           " %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n",
           s.slots_ready, s.slots_filling, s.slots_quarantined, s.slots_suspect, s.pins,
           s.retained_transfers, s.force_releases, s.checksum_mismatches, s.am_refuse_releases,
           s.late_bytes_dropped);
}

static void cmd_path(const char *peer)
{
    kvp_peer_info_t pi[16];
    uint32_t n = 0;
    kvp_node_peers(node, pi, 16, &n);
    for (uint32_t k = 0; k < n; k++)
        if (strcmp(pi[k].peer, peer) == 0) {
            printf("path %s\n", pi[k].data_path);
            return;
        }
    printf("path none\n");
}

/* External: read events until no slot is lent, held or published (or ms passed). */
static void cmd_settle(uint32_t ms)
{
    uint64_t t0 = now_us(), end = t0 + (uint64_t)ms * 1000u;
    uint32_t lent, held, pub;
    kvp_event_t ev;
    for (;;) {
        e2e_ext_counts(&lent, &held, &pub);
        if ((lent == 0 && held == 0 && pub == 0) || now_us() >= end)
            break;
        wait_event(-1, 0, 5, &ev); /* no such type: reads (and routes) events for 5 ms */
    }
    printf("settle %u %u %u %" PRIu64 "\n", lent, held, pub, (now_us() - t0) / 1000u);
}

static void cmd_unpub(uint32_t first, uint32_t count)
{
    uint32_t busy = 0, back;
    size_t off = 0;
    if (count > 4096) {
        printf("err count\n");
        return;
    }
    for (uint32_t i = 0; i < count; i++) {
        pend.lens[i] = key_of(first + i, pend.keys + off);
        off += pend.lens[i];
    }
    back = e2e_ext_unpublish(node, count, pend.keys, pend.lens, &busy);
    printf("unpub %u %u\n", back, busy);
}

static void cmd_blob(void)
{
    const void *b = NULL;
    size_t len = 0;
    kvp_xport_t *x = kvp__node_xport(node);
    if (x == NULL || x->ops->local_blob(x, &b, &len) != KVP_OK) {
        printf("err blob\n");
        return;
    }
    printf("blob ");
    for (size_t i = 0; i < len; i++)
        printf("%02x", ((const uint8_t *)b)[i]);
    printf("\n");
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: %s LISTEN BLOCK_SIZE NUM_BLOCKS [HOLD_CAP_MS] [DEAD_AFTER_MS]\n",
                argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* Test seam: KVPEER_E2E_MUTATION=<n> breaks one rule (common.h), so a
     * harness can show it catches the bug it guards against. */
    const char *mut = getenv("KVPEER_E2E_MUTATION");
    if (mut != NULL)
        kvp__mutation = atoi(mut);
    kvp_config_t c;
    kvp_config_init(&c);
    c.listen_addr = argv[1];
    c.block_size = (uint32_t)strtoul(argv[2], NULL, 0);
    c.num_blocks = (uint32_t)strtoul(argv[3], NULL, 0);
    c.compat = "e2e";
    if (argc > 4)
        c.hold_cap_ms = (uint32_t)strtoul(argv[4], NULL, 0);
    if (argc > 5) {
        c.dead_after_ms = (uint32_t)strtoul(argv[5], NULL, 0);
        c.heartbeat_ms = c.dead_after_ms / 4;
        c.abort_ack_timeout_ms = c.dead_after_ms * 2;
        c.abort_resend_ms = c.dead_after_ms / 2;
    }
    c.shutdown_drain_ms = 1000;
    const char *psk = getenv("KVPEER_E2E_PSK");
    if (psk != NULL && psk[0]) {
        c.psk = (const uint8_t *)psk;
        c.psk_len = (uint32_t)strlen(psk);
    }
    block_size = c.block_size;
    const char *e = getenv("KVPEER_E2E_EXTERNAL");
    ext = e != NULL && atoi(e) == 1;
    if (ext && e2e_ext_init(&c) != 0) {
        printf("err external region\n");
        return 1;
    }
    kvp_status_t st = kvp_node_create(&c, &node);
    if (st != KVP_OK) {
        printf("err create %s\n", kvp_status_str(st));
        return 1;
    }
    printf("ready %s\n", kvp_node_peer_id(node));
    char line[512], a[256];
    unsigned f, n;
    unsigned long long r;
    while (fgets(line, sizeof(line), stdin) != NULL) {
        if (sscanf(line, "put %u %u %llu", &f, &n, &r) >= 2)
            cmd_put(f, n, strchr(line + 4, ' ') && sscanf(line, "put %u %u %llu", &f, &n, &r) == 3 ? r : 0);
        else if (sscanf(line, "add %255s", a) == 1)
            cmd_add(a);
        else if (sscanf(line, "fetch %255s %u %u %llu", a, &f, &n, &r) == 4) {
            int s2 = start_fetch(a, f, n, r);
            if (s2 < 0)
                printf("err fetch\n");
            else if (s2 == 0)
                printf("load 0 0 0 0\n");
            else
                report_load(60000);
        } else if (sscanf(line, "fetchnw %255s %u %u %llu", a, &f, &n, &r) == 4)
            printf(start_fetch(a, f, n, r) > 0 ? "started\n" : "err fetch\n");
        else if (sscanf(line, "wait %u", &n) == 1)
            report_load((int)n);
        else if (sscanf(line, "verify %u %u", &f, &n) == 2)
            cmd_verify(f, n);
        else if (sscanf(line, "busy %u", &n) == 1) {
            usleep(n * 1000u); /* the engine thread is busy; the node's thread serves */
            printf("ok\n");
        } else if (strncmp(line, "stats", 5) == 0)
            cmd_stats();
        else if (sscanf(line, "path %255s", a) == 1)
            cmd_path(a);
        else if (strncmp(line, "blob", 4) == 0)
            cmd_blob();
        else if (ext && sscanf(line, "settle %u", &n) == 1)
            cmd_settle(n);
        else if (ext && sscanf(line, "unpub %u %u", &f, &n) == 2)
            cmd_unpub(f, n);
        else if (strncmp(line, "quit", 4) == 0)
            break;
        else
            printf("err unknown command\n");
    }
    kvp_node_destroy(node);
    if (ext)
        e2e_ext_fini();
    return 0;
}
