/*
 * test_node_cma_ucx.c -- issue 29 item 4: direct-cma between two nodes in
 * two processes (this test re-executes itself as the source: a clean
 * process, no UCX state inherited), each region the embedding's memory.
 *
 *   plain / devshm: the consumer's region is plain anonymous memory, or a
 *       /dev/shm file mapped MAP_SHARED, unlinked and its fd closed (what
 *       vLLM's shared_offload_region does); 8 blocks land byte-exact in the
 *       slots named, the data path is direct-cma, no byte came by AM, no
 *       copy is counted on the consumer.
 *   killed: a fetch parked on the source (WAIT_FOR_SUPPLY) when the source
 *       is SIGKILLed: its slots are held (KVP_ERR_BUSY, n_held) -- a direct
 *       write cannot be refused -- and released by the process-exit proof
 *       (KVP_EV_SLOTS_RELEASED with KVP_OK, long before the 60 s hold cap),
 *       never handed back before it.
 *   source off: KVPEER_UCX_CMA=0 in the source only: am-shm, every block
 *       through the consumer's AM handler (it does not trust that source's
 *       FETCH_DONE without them).
 *   verify split: 8 x 256 KiB (>= KVP_HELPER_SPLIT_BYTES: hashed on two
 *       threads at FETCH_DONE), blocks 1 and 7 published with a stale
 *       checksum: exactly those refused (KVP_ERR_CHECKSUM), the rest
 *       byte-exact (mutation: the helper hashing the first half's slots ->
 *       more refused).
 *   verify later: the same load, its digests hashed on the verifier thread
 *       (held by the test): no outcome while held, a LOOKUP answered
 *       meanwhile; the peer removed under it: the teardown waits for the
 *       digests, the two stale blocks refused, the rest committed, nothing
 *       quarantined (mutations: the teardown not waiting for the digests ->
 *       every block refused; settled before the digests -> an outcome while
 *       held).
 *   verify queue: two such loads at once, the verifier held: the second
 *       waits its turn (not hashed on the node thread), neither settles,
 *       a LOOKUP is answered; released, both verified later in turn; again
 *       with the peer removed under them (the waiting one hashed at the
 *       teardown); the same two blocks of each refused.
 *   tcp: UCX_TLS=tcp in both processes: no shared memory, the source is not
 *       proven, the path is am-tcp, never direct-cma; the blocks still land.
 *
 * Mutation tried (report): inbound_refusable() answering true for
 * direct-cma (held slots released at once) -> "killed" fails (0 held).
 */
#include "testutil.h"
#include "node/node.h"
#include "transport/transport.h"
#include "realnode.h"

#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define NB 16u
#define BS (256u * 1024u)
#define NPUB 8u

static const char *g_self;
static bool g_env_once; /* KVPEER_UCX_CMA=0 for the next source process only */

static uint32_t scaled(uint32_t ms)
{
    return (uint32_t)(ms * kvp_test_time_scale());
}

/* The embedding's memory: anonymous, or a /dev/shm file the way vLLM maps it. */
static uint8_t *region_map(bool devshm)
{
    return rn_region_map((size_t)NB * BS, devshm ? "kvpeer-cma-test" : NULL);
}

static kvp_node_t *node_start(uint8_t *region, uint32_t hold_cap_ms)
{
    return rn_node_start(region, NB, BS, scaled(2000), hold_cap_ms);
}

static void fill(uint32_t k, uint8_t *p)
{
    rn_fill(k, p, BS);
}

static void keys_make(uint32_t k0, uint32_t n, uint8_t *buf, uint32_t *lens)
{
    rn_keys_make("cma", k0, n, buf, lens);
}

/* ----------------------------------------------------------- the source */

/* argv: self --source devshm(0|1). Publishes NPUB blocks (slots 2.., keys
 * 0..), prints its peer id, serves until stdin closes. */
static bool bad_sum(uint32_t i)
{
    return i == 1 || i == NPUB - 1; /* one in each half of a split verify */
}

static int source_main(bool devshm, bool bad_sums)
{
    uint8_t *region = region_map(devshm);
    kvp_node_t *n = region ? node_start(region, 0) : NULL;
    if (n == NULL)
        return 2;
    uint8_t keys[8 * NPUB + 1];
    uint32_t lens[NPUB];
    keys_make(0, NPUB, keys, lens);
    for (uint32_t i = 0; i < NPUB; i++)
        fill(i, region + (size_t)(2 + i) * BS);
    for (uint32_t i = 0; i < NPUB; i++) {
        uint8_t sum[KVP_CHECKSUM_LEN];
        kvp_status_t st = KVP_OK;
        if (bad_sums && bad_sum(i)) /* the checksum of another block: stale */
            st = kvp_slot_checksum(n, 2 + (i + 1) % NPUB, sum);
        if (st == KVP_OK)
            st = bad_sums && bad_sum(i) ? kvp_publish_checksum(n, keys + 8 * i, lens[i], 2 + i, sum)
                                        : kvp_publish(n, keys + 8 * i, lens[i], 2 + i);
        if (st != KVP_OK)
            return 3;
    }
    rn_source_serve(n);
    kvp_node_destroy(n);
    munmap(region, (size_t)NB * BS);
    return 0;
}

static void src_spawn_mode(rn_src_t *s, const char *mode)
{
    char *argv[] = {(char *)g_self, "--source", (char *)mode, NULL};
    assert_true(rn_src_spawn(s, argv));
}

static void src_spawn(rn_src_t *s, bool devshm)
{
    char *argv[] = {(char *)g_self, "--source", devshm ? "1" : "0", NULL};
    assert_true(rn_src_spawn(s, argv));
}

static void src_end(rn_src_t *s, bool kill_it)
{
    bool clean = rn_src_end(s, kill_it);
    if (!kill_it)
        assert_true(clean);
}

/* ------------------------------------------------------------- consumer */

/* The consumer's slots of keys 0..NPUB-1 (none adjacent in order). */
static const uint32_t g_slots[NPUB] = {15, 0, 7, 8, 9, 3, 12, 1};

/* A consumer node on `region` that looks up all NPUB keys at the source
 * (every one a hit) and fetches them into g_slots: the node, with the LOAD
 * event in *ev and each block's status in bs. */
static kvp_node_t *fetch_all(rn_src_t *s, uint8_t *region, int32_t *bs, kvp_event_t *ev)
{
    kvp_node_t *n = node_start(region, 0);
    assert_non_null(n);
    assert_int_equal(kvp_peer_add(n, s->peer), KVP_OK);
    assert_int_equal(kvp_peer_wait(n, s->peer, (int32_t)scaled(10000)), KVP_OK);
    uint8_t keys[8 * NPUB + 1], res[NPUB];
    uint32_t lens[NPUB];
    uint64_t op;
    keys_make(0, NPUB, keys, lens);
    assert_int_equal(kvp_lookup(n, s->peer, 1, keys, lens, NPUB, res, &op), KVP_OK);
    assert_true(rn_wait_event(n, KVP_EV_LOOKUP, op, scaled(5000), ev));
    assert_int_equal(ev->n_ok, NPUB);
    assert_int_equal(kvp_fetch_into(n, s->peer, 1, keys, lens, NPUB, g_slots, 0, bs, &op),
                     KVP_OK);
    assert_true(rn_wait_event(n, KVP_EV_LOAD, op, scaled(10000), ev));
    return n;
}

static void fetch_case(bool devshm, const char *want_path)
{
    rn_src_t s;
    uint8_t *region = region_map(devshm);
    assert_non_null(region);
    src_spawn(&s, devshm);
    if (g_env_once)
        unsetenv("KVPEER_UCX_CMA");
    g_env_once = false;
    uint8_t want[BS];
    int32_t bs[NPUB];
    kvp_event_t ev;
    kvp_node_t *n = fetch_all(&s, region, bs, &ev);
    assert_int_equal(ev.status, KVP_OK);
    for (uint32_t i = 0; i < NPUB; i++) {
        assert_int_equal(bs[i], KVP_OK);
        fill(i, want);
        assert_memory_equal(region + (size_t)g_slots[i] * BS, want, BS);
    }
    kvp_peer_info_t pi;
    uint32_t np = 0;
    kvp_stats_t st;
    kvp_xport_stats_t xs;
    assert_int_equal(kvp_node_peers(n, &pi, 1, &np), KVP_OK);
    assert_int_equal(np, 1);
    assert_int_equal(kvp_node_stats(n, &st), KVP_OK);
    kvp_xport_t *x = kvp__node_xport(n);
    x->ops->get_stats(x, &xs);
    printf("%s region: %u x %u B byte-exact, data path %s, %llu B by AM, copied %llu B\n",
           devshm ? "/dev/shm" : "anonymous", NPUB, BS, pi.data_path,
           (unsigned long long)xs.am_bytes_landed,
           (unsigned long long)(st.bytes_copied_in + st.bytes_copied_out));
    assert_string_equal(pi.data_path, want_path);
    if (strcmp(want_path, "direct-cma") == 0)
        assert_int_equal(xs.am_bytes_landed, 0); /* nothing came through our handler */
    else
        assert_int_equal(xs.am_bytes_landed, (uint64_t)NPUB * BS); /* all through it */
    assert_int_equal(st.bytes_copied_in + st.bytes_copied_out, 0);
    kvp_finish_request(n, 1);
    kvp_node_destroy(n);
    src_end(&s, false);
    munmap(region, (size_t)NB * BS);
}

static void test_cma_fetch_plain(void **state)
{
    (void)state;
    fetch_case(false, "direct-cma");
}

static void test_cma_fetch_devshm(void **state)
{
    (void)state;
    fetch_case(true, "direct-cma");
}

/* Two of the 8 blocks (2 MiB: verified on two threads, one in each half)
 * carry a stale checksum: exactly those two are refused, the other six
 * land byte-exact. */
static void test_cma_verify_split(void **state)
{
    (void)state;
    rn_src_t s;
    uint8_t *region = region_map(false);
    assert_non_null(region);
    src_spawn_mode(&s, "2");
    uint8_t want[BS];
    int32_t bs[NPUB];
    kvp_event_t ev;
    kvp_stats_t st;
    kvp_node_t *n = fetch_all(&s, region, bs, &ev);
    uint32_t refused = 0;
    for (uint32_t i = 0; i < NPUB; i++) {
        if (bad_sum(i)) {
            assert_int_equal(bs[i], KVP_ERR_CHECKSUM);
            refused++;
            continue;
        }
        assert_int_equal(bs[i], KVP_OK);
        fill(i, want);
        assert_memory_equal(region + (size_t)g_slots[i] * BS, want, BS);
    }
    assert_int_equal(kvp_node_stats(n, &st), KVP_OK);
    printf("stale checksums: %u of %u blocks refused, %llu mismatches counted\n", refused, NPUB,
           (unsigned long long)st.checksum_mismatches);
    assert_int_equal(st.checksum_mismatches, 2);
    assert_int_equal(st.loads_verified_later, 1); /* off the node thread */
    kvp_finish_request(n, 1);
    kvp_node_destroy(n);
    src_end(&s, false);
    munmap(region, (size_t)NB * BS);
}

/* The node whose verifier a test holds: released by hold_lift if the test
 * fails while holding it (else its landing bound would wait forever). */
static kvp_node_t *g_held;

static void verify_hold(kvp_node_t *n)
{
    g_held = n;
    atomic_store(&n->env.verify_held, true);
}

static int hold_lift(void **state)
{
    (void)state;
    if (g_held != NULL)
        atomic_store(&g_held->env.verify_held, false);
    g_held = NULL;
    return 0;
}

static void *verify_release(void *arg)
{
    kvp_node_t *n = arg;
    usleep(scaled(100) * 1000u);
    atomic_store(&n->env.verify_held, false);
    return NULL;
}

/* A consumer (plain memory) whose session to a source publishing blocks 1
 * and 7 with a stale checksum (mode "2") is up. */
static kvp_node_t *node_with_stale_source(rn_src_t *s, uint8_t **region)
{
    *region = region_map(false);
    assert_non_null(*region);
    src_spawn_mode(s, "2");
    kvp_node_t *n = node_start(*region, 0);
    assert_non_null(n);
    assert_int_equal(kvp_peer_add(n, s->peer), KVP_OK);
    assert_int_equal(kvp_peer_wait(n, s->peer, (int32_t)scaled(10000)), KVP_OK);
    return n;
}

/* The verify split's load, its digests hashed on the verifier thread (held
 * by the test): no outcome while it is held, the node thread answering a
 * LOOKUP meanwhile; the session then removed under it: its teardown waits
 * for the digests and commits what they vouch for (the two stale blocks
 * refused, the rest byte-exact, nothing quarantined). */
static void test_cma_verify_later(void **state)
{
    (void)state;
    rn_src_t s;
    uint8_t *region;
    kvp_node_t *n = node_with_stale_source(&s, &region);
    uint8_t keys[8 * NPUB + 1], res[NPUB], want[BS];
    uint32_t lens[NPUB];
    int32_t bs[NPUB];
    uint64_t op, load;
    kvp_event_t ev;
    kvp_stats_t st = {0};
    keys_make(0, NPUB, keys, lens);
    assert_int_equal(kvp_lookup(n, s.peer, 1, keys, lens, NPUB, res, &op), KVP_OK);
    assert_true(rn_wait_event(n, KVP_EV_LOOKUP, op, scaled(5000), &ev));
    verify_hold(n);
    assert_int_equal(kvp_fetch_into(n, s.peer, 1, keys, lens, NPUB, g_slots, 0, bs, &load),
                     KVP_OK);
    for (uint64_t end = rn_real_ms() + scaled(10000);
         st.loads_verified_later == 0 && rn_real_ms() < end; usleep(1000))
        assert_int_equal(kvp_node_stats(n, &st), KVP_OK);
    assert_int_equal(st.loads_verified_later, 1); /* FETCH_DONE here, verify posted */
    /* held: the node thread serves (a LOOKUP answered), the load has no outcome */
    assert_int_equal(kvp_lookup(n, s.peer, 2, keys, lens, NPUB, res, &op), KVP_OK);
    assert_true(rn_wait_event(n, KVP_EV_LOOKUP, op, scaled(5000), &ev));
    assert_int_equal(ev.n_ok, NPUB);
    assert_false(rn_wait_event(n, KVP_EV_LOAD, load, 50, &ev));
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, verify_release, n), 0);
    assert_int_equal(kvp_peer_remove(n, s.peer), KVP_OK); /* teardown: waits for the digests */
    assert_true(rn_wait_event(n, KVP_EV_LOAD, load, scaled(5000), &ev));
    pthread_join(t, NULL);
    for (uint32_t i = 0; i < NPUB; i++) {
        assert_int_equal(bs[i], bad_sum(i) ? KVP_ERR_CHECKSUM : KVP_OK);
        if (!bad_sum(i)) {
            fill(i, want);
            assert_memory_equal(region + (size_t)g_slots[i] * BS, want, BS);
        }
    }
    assert_int_equal(kvp_node_stats(n, &st), KVP_OK);
    printf("verified later: held, a LOOKUP answered meanwhile; session removed under it: "
           "%llu mismatches, %u blocks ok, %llu quarantined\n",
           (unsigned long long)st.checksum_mismatches, ev.n_ok,
           (unsigned long long)st.slots_quarantined);
    assert_int_equal(st.checksum_mismatches, 2);
    assert_int_equal(ev.n_ok, NPUB - 2);
    assert_int_equal(st.slots_quarantined, 0);
    assert_int_equal(ev.n_held, 0); /* every slot reusable now */
    kvp_finish_request(n, 1);
    g_held = NULL;
    kvp_node_destroy(n);
    src_end(&s, false);
    munmap(region, (size_t)NB * BS);
}

/* The other eight slots, for a second load beside g_slots' one. */
static const uint32_t g_slots2[NPUB] = {2, 4, 5, 6, 10, 11, 13, 14};

/* A LOOKUP of the NPUB keys for request req, then their fetch into slots. */
static uint64_t fetch_req(kvp_node_t *n, const char *peer, uint64_t req, const uint32_t *slots,
                          int32_t *bs)
{
    uint8_t keys[8 * NPUB + 1], res[NPUB];
    uint32_t lens[NPUB];
    uint64_t op, load;
    kvp_event_t ev;
    keys_make(0, NPUB, keys, lens);
    assert_int_equal(kvp_lookup(n, peer, req, keys, lens, NPUB, res, &op), KVP_OK);
    assert_true(rn_wait_event(n, KVP_EV_LOOKUP, op, scaled(5000), &ev));
    assert_int_equal(ev.n_ok, NPUB);
    assert_int_equal(kvp_fetch_into(n, peer, req, keys, lens, NPUB, slots, 0, bs, &load), KVP_OK);
    return load;
}

/* The node's stats once field `off` of them reaches want (10 s at most). */
static kvp_stats_t stats_at(kvp_node_t *n, size_t off, uint64_t want)
{
    kvp_stats_t st = {0};
    for (uint64_t end = rn_real_ms() + scaled(10000); rn_real_ms() < end; usleep(1000)) {
        assert_int_equal(kvp_node_stats(n, &st), KVP_OK);
        if (*(const uint64_t *)((const char *)&st + off) >= want)
            break;
    }
    return st;
}

/* Two big loads at once: the second waits its turn at the verifier instead
 * of being hashed on the node thread. With the verifier held, neither has
 * an outcome and a LOOKUP is answered meanwhile; released, both are
 * verified later, in turn. Then again with the peer removed under them: the
 * first's digests are awaited, the waiting one is verified at once. Each
 * time exactly the two stale blocks of each load are refused, the others
 * byte-exact, nothing quarantined, no slot held. */
static void test_cma_verify_queue(void **state)
{
    (void)state;
    rn_src_t s;
    uint8_t *region;
    kvp_node_t *n = node_with_stale_source(&s, &region);
    uint8_t want[BS];
    for (uint64_t round = 0; round < 2; round++) {
        const uint32_t *slots[2] = {g_slots, g_slots2};
        int32_t bs[2][NPUB];
        uint64_t load[2];
        kvp_event_t ev;
        verify_hold(n);
        load[0] = fetch_req(n, s.peer, 10 + 2 * round, slots[0], bs[0]);
        kvp_stats_t st = stats_at(n, offsetof(kvp_stats_t, loads_verified_later), 2 * round + 1);
        assert_int_equal(st.loads_verified_later, 2 * round + 1); /* the first: posted */
        load[1] = fetch_req(n, s.peer, 11 + 2 * round, slots[1], bs[1]);
        st = stats_at(n, offsetof(kvp_stats_t, loads_verify_queued), round + 1);
        assert_int_equal(st.loads_verify_queued, round + 1); /* the second: waits its turn */
        assert_false(rn_wait_event(n, KVP_EV_LOAD, 0, 50, &ev)); /* neither settled */
        uint8_t keys[8 * NPUB + 1], res[NPUB];
        uint32_t lens[NPUB];
        uint64_t op;
        keys_make(0, NPUB, keys, lens);
        assert_int_equal(kvp_lookup(n, s.peer, 9, keys, lens, NPUB, res, &op), KVP_OK);
        assert_true(rn_wait_event(n, KVP_EV_LOOKUP, op, scaled(5000), &ev)); /* still served */
        kvp_finish_request(n, 9);
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, verify_release, n), 0);
        if (round == 1) /* teardown: the first's digests awaited, the second hashed now */
            assert_int_equal(kvp_peer_remove(n, s.peer), KVP_OK);
        for (int j = 0; j < 2; j++) {
            assert_true(rn_wait_event(n, KVP_EV_LOAD, load[j], scaled(5000), &ev));
            assert_int_equal(ev.n_ok, NPUB - 2);
            assert_int_equal(ev.n_held, 0);
            for (uint32_t i = 0; i < NPUB; i++) {
                assert_int_equal(bs[j][i], bad_sum(i) ? KVP_ERR_CHECKSUM : KVP_OK);
                fill(i, want);
                if (!bad_sum(i))
                    assert_memory_equal(region + (size_t)slots[j][i] * BS, want, BS);
            }
            kvp_finish_request(n, 10 + 2 * round + (uint64_t)j);
        }
        pthread_join(t, NULL);
        assert_int_equal(kvp_node_stats(n, &st), KVP_OK);
        printf("round %llu%s: %llu verified later, %llu of them waited their turn, %llu "
               "mismatches, %llu quarantined\n",
               (unsigned long long)round, round ? " (peer removed under them)" : "",
               (unsigned long long)st.loads_verified_later,
               (unsigned long long)st.loads_verify_queued,
               (unsigned long long)st.checksum_mismatches,
               (unsigned long long)st.slots_quarantined);
        /* round 0: the second ran on the verifier too (2); round 1: the first
         * did (3), the second was hashed at the teardown */
        assert_int_equal(st.loads_verified_later, round == 0 ? 2 : 3);
        assert_int_equal(st.checksum_mismatches, 4 * (round + 1));
        assert_int_equal(st.slots_quarantined, 0);
    }
    g_held = NULL;
    kvp_node_destroy(n);
    src_end(&s, false);
    munmap(region, (size_t)NB * BS);
}

/* The source does not write direct-cma (KVPEER_UCX_CMA=0 there only): the
 * consumer, which offers it, must not trust that proven source's FETCH_DONE
 * without seeing its AM blocks land (its blob says it does not write cma). */
static void test_cma_source_off(void **state)
{
    (void)state;
    setenv("KVPEER_UCX_CMA", "0", 1);
    g_env_once = true; /* fetch_case unsets it once the source runs */
    fetch_case(true, "am-shm");
}

static void test_cma_tcp_not_proven(void **state)
{
    (void)state;
    setenv("UCX_TLS", "tcp", 1); /* both processes: no shared memory at all */
    fetch_case(true, "am-tcp");
    unsetenv("UCX_TLS");
}

static void test_cma_source_killed(void **state)
{
    (void)state;
    rn_src_t s;
    uint8_t *region = region_map(true);
    assert_non_null(region);
    src_spawn(&s, true);
    kvp_node_t *n = node_start(region, scaled(60000));
    assert_non_null(n);
    assert_int_equal(kvp_peer_add(n, s.peer), KVP_OK);
    assert_int_equal(kvp_peer_wait(n, s.peer, (int32_t)scaled(10000)), KVP_OK);
    uint8_t keys[25], held[NB];
    uint32_t lens[3], slots[3] = {4, 11, 13};
    int32_t bs[3];
    uint64_t op;
    kvp_event_t ev;
    keys_make(500, 3, keys, lens); /* never published: the FETCH parks on the source */
    for (uint32_t i = 0; i < 3; i++)
        memset(region + (size_t)slots[i] * BS, 0x5a, BS);
    assert_int_equal(kvp_fetch_into(n, s.peer, 2, keys, lens, 3, slots,
                                     KVP_FETCH_FLAG_WAIT_FOR_SUPPLY, bs, &op),
                     KVP_OK);
    uint64_t t = rn_real_ms() + 300;
    while (rn_real_ms() < t)
        poll(NULL, 0, 10);
    uint64_t t_kill = rn_real_ms();
    src_end(&s, true);
    assert_true(rn_wait_event(n, KVP_EV_LOAD, op, scaled(5000), &ev));
    assert_int_not_equal(ev.status, KVP_OK);
    uint32_t busy = 0;
    for (uint32_t i = 0; i < 3; i++)
        busy += bs[i] == KVP_ERR_BUSY;
    printf("source SIGKILLed: load %s, %u of 3 slots held\n",
           kvp_status_str((kvp_status_t)ev.status), busy);
    assert_int_equal(busy, 3); /* a direct write cannot be refused: held */
    assert_int_equal(ev.n_held, 3);
    /* Held until the proof, all three in one step: either still held, or the
     * proof came already (the pidfd is often readable by now) and then its
     * KVP_EV_SLOTS_RELEASED is already in the ring (emitted in that step). */
    assert_int_equal(kvp_slots_held(n, 0, NB, held), KVP_OK);
    uint32_t still = held[slots[0]] + held[slots[1]] + held[slots[2]];
    printf("  at the LOAD event: %u of 3 still held\n", still);
    assert_true(still == 3 || still == 0);
    assert_true(rn_wait_event(n, KVP_EV_SLOTS_RELEASED, op, still ? scaled(10000) : 100, &ev));
    uint64_t took = rn_real_ms() - t_kill;
    printf("  released %llu ms after the kill: status %s\n", (unsigned long long)took,
           kvp_status_str((kvp_status_t)ev.status));
    assert_int_equal(ev.status, KVP_OK); /* a proof (process exit), not the hold cap */
    assert_int_equal(ev.n_keys, 3);
    kvp_stats_t st;
    assert_int_equal(kvp_node_stats(n, &st), KVP_OK);
    assert_true(st.released_process_exit >= 3);
    assert_int_equal(kvp_slots_held(n, 0, NB, held), KVP_OK);
    for (uint32_t i = 0; i < NB; i++)
        assert_int_equal(held[i], 0);
    for (uint32_t i = 0; i < 3; i++) /* nothing wrote them: the source never had the keys */
        for (size_t b = 0; b < BS; b += 4096)
            assert_int_equal(region[(size_t)slots[i] * BS + b], 0x5a);
    kvp_finish_request(n, 2);
    kvp_node_destroy(n);
    munmap(region, (size_t)NB * BS);
}

int main(int argc, char **argv)
{
    g_self = argv[0];
    if (argc == 3 && strcmp(argv[1], "--source") == 0)
        return source_main(strcmp(argv[2], "1") == 0, strcmp(argv[2], "2") == 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cma_fetch_plain),
        cmocka_unit_test(test_cma_fetch_devshm),
        cmocka_unit_test(test_cma_verify_split),
        cmocka_unit_test_teardown(test_cma_verify_later, hold_lift),
        cmocka_unit_test_teardown(test_cma_verify_queue, hold_lift),
        cmocka_unit_test(test_cma_source_killed),
        cmocka_unit_test(test_cma_source_off),
        cmocka_unit_test(test_cma_tcp_not_proven),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
