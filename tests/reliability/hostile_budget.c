/*
 * hostile_budget.c -- issue 27 "one peer can hold the cache", the attacker's
 * side, on the fake world (tests/node/world.h): node 0 is the victim with
 * the DEFAULT per-peer budgets, node 1 the abuser (a real kvpeer node that
 * calls the public API as hard as it can), node 2 a good peer. For each
 * abuse: the victim stays alive, stores and reads its own blocks, the good
 * peer's fetches succeed, the abuser's refused lookups say KVP_ERR_LIMIT
 * (never "ok, 0 hits"), and what the abuser holds is bounded (pins by the
 * budget, time by max_lease_ms, memory by hits not keys). Each test names
 * the mutation under which it fails.
 */
#include "node/world.h"

#define MS KVP_NSEC_PER_MSEC
#define NB 256u /* the victim's slots: its default share per peer is NB / 4 */

static int g_case;
#define KEY_RATE 1000u /* case 6: the victim's max_lookup_keys_per_sec */

/* VmRSS of this process in kB, from /proc (0 if unknown). */
static long kvp_test_rss_kb(void)
{
    FILE *f = fopen("/proc/self/status", "re");
    char line[128];
    long kb = 0;
    if (f == NULL)
        return 0;
    while (fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1)
            break;
    fclose(f);
    return kb;
}

/* Node 0 (the victim) runs the default budgets (world.h lifts the supply
 * pin budgets for tests about other things); a case may set one. */
static void tweak_victim(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    (void)s;
    if (i != 0)
        return;
    c->num_blocks = NB;
    c->max_supply_pins_per_peer = c->max_supply_pins = 0;
    if (g_case == 3)
        c->max_lookup_rounds_per_peer = 8;
    if (g_case == 4)
        c->max_wanted_peers = 2;
    if (g_case == 5)
        c->max_lookup_bytes_per_peer = 32 * 1024;
    if (g_case == 3 + 10) /* 80 x 65 536 keys in a few virtual ms: memory, not the key rate */
        c->max_lookup_keys_per_sec = 0;
    if (g_case == 6)
        c->max_lookup_keys_per_sec = KEY_RATE;
}

/* The abuser of case 5 needs destination slots for its flood. */
static void tweak_flood(kvp_config_t *c, kvp_node_seams_t *s, int i)
{
    tweak_victim(c, s, i);
    if (i == 1)
        c->num_blocks = 1024;
}

static uint32_t g_warns_n;
static char g_warns[64][320];

static void warn_sink(kvp_log_level_t level, const char *prefix, const char *line, void *arg)
{
    (void)arg;
    (void)prefix;
    if (level <= KVP_LOG_WARN && g_warns_n < 64)
        snprintf(g_warns[g_warns_n++], sizeof(g_warns[0]), "%s", line);
}

static uint32_t warns_with(const char *a, const char *b)
{
    uint32_t c = 0;
    for (uint32_t i = 0; i < g_warns_n; i++)
        c += strstr(g_warns[i], a) != NULL && strstr(g_warns[i], b) != NULL;
    return c;
}

static void warns_start(void)
{
    g_warns_n = 0;
    kvp_log_set_level(KVP_LOG_WARN);
    kvp_log_set_sink(warn_sink, NULL);
}

static void warns_stop(void)
{
    kvp_log_set_sink(NULL, NULL);
    kvp_log_set_level(KVP_LOG_ERROR);
}

/* The fake world of one case: the victim (node 0, holding keys
 * 0..held-1), the abuser (node 1) and a good peer (node 2) connected to it. */
static world_t *victim_world(void **state, int gcase, world_tweak_fn tweak, uint32_t held)
{
    world_t *w = malloc(sizeof(world_t));
    *state = w;
    g_case = gcase;
    world_init(w, 3, tweak);
    world_connect(w, 1, 0);
    world_connect(w, 2, 0);
    for (uint32_t k = 0; k < held; k++)
        world_put(w, 0, k, 0);
    return w;
}

static const kvp_event_t *lookup(world_t *w, int i, int j, uint64_t req, const wkeys_t *ks,
                                 uint8_t *res)
{
    uint64_t op = 0;
    assert_int_equal(kvp_lookup(w->node[i], w->addr[j], req, ks->buf, ks->len, ks->n, res, &op),
                     KVP_OK);
    const kvp_event_t *e = world_wait(w, i, KVP_EV_LOOKUP, op, 200 * MS);
    assert_non_null(e);
    return e;
}

/* The good peer (node 2) looks up and fetches keys k0..k0+n-1 of node 0. */
static void good_peer_fetches(world_t *w, uint64_t req, uint32_t k0, uint32_t n)
{
    wkeys_t ks;
    uint8_t res[64];
    wkeys_make(&ks, k0, n);
    const kvp_event_t *e = lookup(w, 2, 0, req, &ks, res);
    assert_int_equal(e->status, KVP_OK);
    assert_int_equal(e->n_ok, n);
    uint64_t op = 0;
    assert_int_equal(kvp_fetch(w->node[2], w->addr[0], req, ks.buf, ks.len, ks.n, 0, NULL, &op),
                     KVP_OK);
    e = world_wait(w, 2, KVP_EV_LOAD, op, 500 * MS);
    assert_non_null(e);
    assert_int_equal(e->status, KVP_OK);
    for (uint32_t k = k0; k < k0 + n; k++)
        assert_true(world_verify(w, 2, k));
}

/* The victim reads every block it holds of keys 0..n-1 (byte-exact). */
static uint32_t victim_reads(world_t *w, uint32_t n)
{
    uint32_t ok = 0;
    for (uint32_t k = 0; k < n; k++)
        ok += world_verify(w, 0, k);
    return ok;
}

/* Issue 27 "Why" 4, first half: 4 LOOKUPs of 64 keys (every slot) plus
 * lease renewals for as long as the abuser likes. With the default budgets
 * (a quarter of the slots per peer): the abuser holds 64 of 256 pins, every
 * LOOKUP past its share answers KVP_ERR_LIMIT (lookups_refused_limit,
 * supply_pins_refused, a WARN naming the budget and the abuser); meanwhile
 * the victim reads 256/256 of its blocks, stores 16/16 new ones, and the
 * good peer's fetch succeeds; the renewed lease ends at max_lease_ms
 * (leases_capped), pins 0.
 * Mutations: per-peer cap removed (kvp__budget_pin_take checks only the
 * total) -> the abuser holds 128; lease cap removed
 * (kvp__budget_lease_deadline ignores max_lease_ms) -> pins stay 64 after
 * max_lease_ms of renewals. */
static void test_pin_and_lease_abuse(void **state)
{
    world_t *w = victim_world(state, 1, tweak_victim, NB);
    warns_start();
    uint8_t res[64];
    uint32_t held = 0, limited = 0;
    for (uint64_t req = 1; req <= 4; req++) {
        wkeys_t ks;
        wkeys_make(&ks, (uint32_t)(req - 1) * 64, 64);
        const kvp_event_t *e = lookup(w, 1, 0, req, &ks, res);
        assert_false(e->status == KVP_OK && e->n_ok < 64); /* never "ok" with refusals */
        limited += e->status == KVP_ERR_LIMIT;
        held += e->n_ok;
    }
    uint32_t share = NB / 4;
    assert_int_equal(w->node[0]->cfg.max_supply_pins_per_peer, share); /* the default */
    assert_int_equal(held, share);
    assert_int_equal(limited, 3);
    kvp_stats_t st = world_stats(w, 0);
    assert_int_equal(st.supply_pins, share);
    assert_int_equal(st.pins, share);
    assert_int_equal(st.supply_pins_refused, NB - share);
    assert_int_equal(st.lookups_refused_limit, 3);
    assert_true(warns_with("max_supply_pins_per_peer", w->addr[1]) >= 1);
    assert_int_equal(world_stats(w, 1).lookups_limited, 3);
    warns_stop();
    /* the abuser renews every 100 ms (its lease is 300 ms) while the victim
     * and the good peer work */
    uint64_t born = kvp_clock_now(&w->mc.clock), max_lease = w->node[0]->cfg.max_lease_ms;
    assert_int_equal(max_lease, 4 * w->cfg[0].supply_pin_ms); /* the default */
    bool worked = false;
    while (kvp_clock_now(&w->mc.clock) - born < (max_lease + 600) * MS) {
        for (uint64_t req = 1; req <= 4; req++)
            assert_int_equal(kvp_lease_renew(w->node[1], w->addr[0], req), KVP_OK);
        world_run(w, 100 * MS);
        if (!worked && kvp_clock_now(&w->mc.clock) - born >= max_lease / 2 * MS) {
            assert_int_equal(world_stats(w, 0).supply_pins, share); /* still held */
            assert_int_equal(victim_reads(w, NB), NB);
            for (uint32_t k = 1000; k < 1016; k++)
                world_put(w, 0, k, 0); /* asserts KVP_OK: 16/16 stored */
            good_peer_fetches(w, 50, 1000, 8);
            worked = true;
        }
    }
    assert_true(worked);
    st = world_stats(w, 0);
    assert_int_equal(st.supply_pins, 0); /* the lease ended although renewed */
    assert_int_equal(st.pins, 0);
    assert_true(st.leases_capped >= 1);
    assert_true(st.leases_renewed > 4);
    world_fini(w, false);
    free(w);
}

/* All peers together hold at most half the slots: two abusers take a
 * quarter each (64 of 256); a third peer's lookup is then refused
 * (KVP_ERR_LIMIT, naming max_supply_pins), and the victim still stores and
 * reads. Mutation: total cap removed -> the third peer gets hits. */
static void test_total_supply_pins(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    g_case = 2;
    world_init(w, 4, tweak_victim);
    for (int i = 1; i < 4; i++)
        world_connect(w, i, 0);
    for (uint32_t k = 0; k < NB; k++)
        world_put(w, 0, k, 0);
    wkeys_t ks;
    uint8_t res[64];
    wkeys_make(&ks, 0, 64);
    assert_int_equal(lookup(w, 1, 0, 1, &ks, res)->n_ok, 64);
    wkeys_make(&ks, 64, 64);
    assert_int_equal(lookup(w, 3, 0, 1, &ks, res)->n_ok, 64);
    warns_start();
    wkeys_make(&ks, 128, 64);
    const kvp_event_t *e = lookup(w, 2, 0, 1, &ks, res);
    assert_int_equal(e->status, KVP_ERR_LIMIT);
    assert_int_equal(e->n_ok, 0);
    assert_true(warns_with("max_supply_pins", w->addr[2]) >= 1);
    warns_stop();
    assert_int_equal(world_stats(w, 0).supply_pins, NB / 2);
    assert_int_equal(victim_reads(w, NB), NB);
    for (uint32_t k = 1000; k < 1000 + NB / 2; k++)
        world_put(w, 0, k, 0); /* the unpinned half makes room */
    world_fini(w, false);
    free(w);
}

/* Issue 27 "Why" 4, second half: LOOKUPs of 65 536 keys with one hit each.
 * The victim keeps supply state for hits only: its round memory after 80
 * such LOOKUPs (each ~0.8 MB on the wire) stays a few KiB per round
 * (lookup_bytes), the ones past the pin share (64) answer KVP_ERR_LIMIT
 * (none "ok, 0 hits"),
 * and the good peer is served. RSS of this process is printed, not
 * asserted (both nodes live here, and ASan keeps freed memory).
 * Mutation: supply allocated per key (sround_new(.., m->n) in
 * kvp__server_on_lookup) -> lookup_bytes over 5 MB after the first. */
static void test_lookup_memory_abuse(void **state)
{
    enum { NK = 65536, NL = 80 };
    world_t *w = victim_world(state, 3 + 10, tweak_victim, 16);
    uint8_t *kb = malloc((size_t)NK * 16);
    uint32_t *lens = malloc(NK * sizeof(*lens));
    uint8_t *res = malloc((size_t)NL * NK);
    size_t off = 0;
    for (uint32_t i = 0; i < NK; i++) { /* key 0 is held; the rest are not */
        lens[i] = world_key(i == 0 ? 0 : 1000000 + i, kb + off);
        off += lens[i];
    }
    long rss0 = kvp_test_rss_kb();
    uint64_t peak = 0, ops[NL];
    uint32_t limited = 0, ok = 0;
    for (uint32_t l = 0; l < NL; l++) {
        assert_int_equal(kvp_lookup(w->node[1], w->addr[0], 100 + l, kb, lens, NK,
                                    res + (size_t)l * NK, &ops[l]),
                         KVP_OK);
        const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOOKUP, ops[l], 500 * MS);
        assert_non_null(e);
        peak = KVP_MAX(peak, world_stats(w, 0).lookup_bytes);
        assert_false(e->status == KVP_OK && e->n_ok == 0); /* a refusal is never "ok" */
        limited += e->status == KVP_ERR_LIMIT;
        ok += e->status == KVP_OK && e->n_ok == 1;
    }
    long rss1 = kvp_test_rss_kb();
    assert_int_equal(ok, NB / 4); /* the pin share */
    assert_int_equal(limited, NL - NB / 4);
    /* 64 rounds of one hit each: a record and 8 supply entries per round */
    print_message("  lookup_bytes peak %llu B for %u LOOKUPs of %u keys; RSS %ld -> %ld kB\n",
                  (unsigned long long)peak, NL, NK, rss0, rss1);
    assert_true(peak <= NB / 4 * 2048);
    good_peer_fetches(w, 7, 8, 8);
    free(kb);
    free(lens);
    free(res);
    world_fini(w, false);
    free(w);
}

/* Live rounds per peer: with max_lookup_rounds_per_peer = 8 the abuser's 9th
 * and 10th LOOKUP (each one hit, all held) answer KVP_ERR_LIMIT
 * (rounds_refused); once it finishes its requests it is served again.
 * Mutation: the round count not checked (kvp__budget_round_fits) -> 10 OK. */
static void test_round_count_abuse(void **state)
{
    world_t *w = victim_world(state, 3, tweak_victim, 16);
    uint8_t res[1];
    uint32_t ok = 0, limited = 0;
    for (uint32_t r = 0; r < 10; r++) {
        wkeys_t one;
        wkeys_make(&one, r, 1);
        const kvp_event_t *e = lookup(w, 1, 0, 200 + r, &one, res);
        ok += e->status == KVP_OK && e->n_ok == 1;
        limited += e->status == KVP_ERR_LIMIT && e->n_ok == 0;
    }
    assert_int_equal(ok, 8);
    assert_int_equal(limited, 2);
    assert_int_equal(world_stats(w, 0).rounds_refused, 2);
    good_peer_fetches(w, 9, 10, 4); /* another peer's rounds are its own */
    for (uint32_t r = 0; r < 10; r++)
        assert_int_equal(kvp_finish_request(w->node[1], 200 + r), KVP_OK);
    world_run(w, 20 * MS);
    wkeys_t one;
    wkeys_make(&one, 0, 1);
    assert_int_equal(lookup(w, 1, 0, 300, &one, res)->status, KVP_OK);
    world_fini(w, false);
    free(w);
}

/* Admin-added peers: with max_wanted_peers = 2 a third kvp_peer_add is
 * refused with KVP_ERR_LIMIT (peers_add_refused); re-adding a wanted peer
 * is still OK. Mutation: no cap in do_peer_add -> the third is OK. */
static void test_peer_add_cap(void **state)
{
    world_t *w = *state = malloc(sizeof(world_t));
    g_case = 4;
    world_init(w, 1, tweak_victim);
    assert_int_equal(kvp_peer_add(w->node[0], "x1:1"), KVP_OK);
    assert_int_equal(kvp_peer_add(w->node[0], "x2:1"), KVP_OK);
    assert_int_equal(kvp_peer_add(w->node[0], "x3:1"), KVP_ERR_LIMIT);
    assert_int_equal(kvp_peer_add(w->node[0], "x1:1"), KVP_OK);
    assert_int_equal(world_stats(w, 0).peers_add_refused, 1);
    assert_int_equal(kvp_peer_remove(w->node[0], "x2:1"), KVP_ERR_NOT_FOUND); /* unwanted */
    assert_int_equal(kvp_peer_add(w->node[0], "x3:1"), KVP_OK);
    world_fini(w, false);
    free(w);
}

/* Floods of FETCHes the victim cannot serve: WAIT_FOR_SUPPLY for keys it
 * never gets (each parks a round, then finishes with a failure kept for
 * replays), then plain fetches never looked up (each answered NOT_FOUND at
 * once, its record kept for replays). The peer's round memory stays within
 * max_lookup_bytes_per_peer (32 KiB here) at every step -- parked fetches
 * past it fail at once with KVP_ERR_LIMIT (rounds_refused), and the
 * finished records give way oldest first -- while the good peer is served.
 * Mutation: no trim before a failed fetch's record (fetch_fail_now) ->
 * the second flood's records pass the budget. */
static void test_failed_fetch_flood(void **state)
{
    world_t *w = victim_world(state, 5, tweak_flood, 16);
    uint64_t budget = w->node[0]->cfg.max_lookup_bytes_per_peer, peak = 0;
    uint32_t sent = 0;
    for (uint32_t i = 0; i < 400; i++) {
        wkeys_t one;
        wkeys_make(&one, 500000 + i, 1);
        uint64_t op = 0;
        if (kvp_fetch(w->node[1], w->addr[0], 1000 + i, one.buf, one.len, 1,
                      KVP_FETCH_FLAG_WAIT_FOR_SUPPLY, NULL, &op) == KVP_OK)
            sent++;
        world_step(w);
        peak = KVP_MAX(peak, world_stats(w, 0).lookup_bytes);
    }
    for (int t = 0; t < 1500; t++) {
        world_step(w);
        peak = KVP_MAX(peak, world_stats(w, 0).lookup_bytes);
    }
    uint32_t plain = 0;
    for (uint32_t i = 0; i < 400; i++) { /* never looked up: NOT_FOUND at once */
        wkeys_t one;
        wkeys_make(&one, 600000 + i, 1);
        uint64_t op = 0;
        if (kvp_fetch(w->node[1], w->addr[0], 5000 + i, one.buf, one.len, 1, 0, NULL, &op) ==
            KVP_OK)
            plain++;
        world_step(w);
        peak = KVP_MAX(peak, world_stats(w, 0).lookup_bytes);
    }
    assert_true(plain >= 300);
    kvp_stats_t st = world_stats(w, 0);
    uint32_t limited = 0;
    for (uint32_t k = 0; k < w->nev[1]; k++)
        limited += w->ev[1][k].type == KVP_EV_LOAD && w->ev[1][k].status == KVP_ERR_LIMIT;
    print_message("  %u fetches sent, %u answered limit, rounds_refused %llu, lookup_bytes peak "
                  "%llu B (budget %llu B)\n",
                  sent, limited, (unsigned long long)st.rounds_refused, (unsigned long long)peak,
                  (unsigned long long)budget);
    assert_true(sent >= 300);
    assert_true(st.rounds_refused > 0);
    assert_true(limited > 0);
    assert_true(peak <= budget);
    good_peer_fetches(w, 9, 0, 8);
    world_fini(w, false);
    free(w);
}

/* Keys of the key-rate case: 0..7 held by the victim, then misses. */
typedef struct nkeys {
    uint8_t buf[1000 * 16];
    uint32_t len[1000];
} nkeys_t;

static void nkeys_make(nkeys_t *k, uint32_t n)
{
    size_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        k->len[i] = world_key(i < 8 ? i : 100000 + i, k->buf + off);
        off += k->len[i];
    }
}

static const kvp_event_t *lookup_n(world_t *w, uint64_t req, const nkeys_t *k, uint32_t n,
                                   bool prefix)
{
    static uint8_t res[1000];
    uint64_t op = 0;
    kvp_status_t st = prefix ? kvp_lookup_prefix(w->node[1], w->addr[0], req, k->buf, k->len, n,
                                                 res, &op)
                             : kvp_lookup(w->node[1], w->addr[0], req, k->buf, k->len, n, res,
                                          &op);
    assert_int_equal(st, KVP_OK);
    const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOOKUP, op, 200 * MS);
    assert_non_null(e);
    assert_false(e->status == KVP_OK && e->n_ok < 8 && !prefix); /* a refusal is never "ok" */
    return e;
}

/* Issue 27, the LOOKUP key rate: with max_lookup_keys_per_sec = 1000 (a
 * bucket one second deep) the abuser's first LOOKUP of 600 keys is served
 * whole; the second, right after, has ~400 keys looked up (its 8 hits come
 * first and are kept) and the rest refused: KVP_ERR_LIMIT, counted in
 * lookup_keys_refused (200 minus what the bucket refilled meanwhile), a
 * WARN naming the budget and the abuser; the good peer is served from its
 * own bucket; a second later the abuser is served whole again. A prefix
 * LOOKUP pays only for the keys it looked up (up to the first miss), so a
 * LOOKUP of 900 keys right after one of 600 in prefix mode is served whole.
 * A LOOKUP past the rate also pauses the abuser's link (its next frame is
 * taken only after the refused keys' worth of time, capped at dead_after /
 * 4), so its floods cost no more decoding than its rate.
 * Mutations: the bucket never charged (kvp__budget_lookup_keys) -> the
 * second LOOKUP answers OK; no refund for prefix mode -> the 900 keys
 * answer KVP_ERR_LIMIT; no pause (key_rate_pause) -> the third LOOKUP is
 * answered within a few ms. */
static void test_lookup_key_rate(void **state)
{
    world_t *w = victim_world(state, 6, tweak_victim, 16);
    nkeys_t *k = malloc(sizeof(*k));
    nkeys_make(k, 1000);
    warns_start();
    uint64_t t0 = kvp_clock_now(&w->mc.clock);
    const kvp_event_t *e = lookup_n(w, 1, k, 600, false);
    assert_int_equal(e->status, KVP_OK);
    assert_int_equal(e->n_ok, 8);
    e = lookup_n(w, 2, k, 600, false);
    uint64_t refill = (kvp_clock_now(&w->mc.clock) - t0) * KEY_RATE / KVP_NSEC_PER_SEC + 1;
    assert_int_equal(e->status, KVP_ERR_LIMIT);
    assert_int_equal(e->n_ok, 8); /* the keys granted first: the hits, kept */
    kvp_stats_t st = world_stats(w, 0);
    print_message("  second LOOKUP of 600 keys: %llu refused (bucket refilled <= %llu)\n",
                  (unsigned long long)st.lookup_keys_refused, (unsigned long long)refill);
    assert_true(st.lookup_keys_refused <= 200 && st.lookup_keys_refused + refill >= 200);
    assert_int_equal(st.lookups_refused_limit, 1);
    assert_true(warns_with("max_lookup_keys_per_sec", w->addr[1]) >= 1);
    warns_stop();
    /* The bucket is (nearly) empty: refused, never "ok"; and the abuser's
     * frames waited -- the link took nothing -- for as long as the refused
     * keys take to earn, capped at dead_after / 4. */
    uint64_t t2 = kvp_clock_now(&w->mc.clock);
    uint64_t pause = KVP_MIN(200ull * KVP_NSEC_PER_SEC / KEY_RATE,
                             w->cfg[0].dead_after_ms * MS / 4) -
                     5 * MS; /* it began before the answer's trip back to us */
    e = lookup_n(w, 3, k, 600, false);
    assert_int_equal(e->status, KVP_ERR_LIMIT);
    print_message("  third LOOKUP answered %llu ms after the second (pause >= %llu ms)\n",
                  (unsigned long long)((kvp_clock_now(&w->mc.clock) - t2) / MS),
                  (unsigned long long)(pause / MS));
    assert_true(kvp_clock_now(&w->mc.clock) - t2 >= pause);
    good_peer_fetches(w, 9, 8, 8); /* another peer's bucket is its own */
    world_run(w, 1000 * MS);
    e = lookup_n(w, 4, k, 600, false);
    assert_int_equal(e->status, KVP_OK);
    assert_int_equal(e->n_ok, 8);
    world_run(w, 1000 * MS);
    e = lookup_n(w, 5, k, 600, true); /* prefix: 9 keys looked up (8 held, one miss) */
    assert_int_equal(e->status, KVP_OK);
    assert_int_equal(e->n_ok, 8);
    e = lookup_n(w, 6, k, 900, false);
    assert_int_equal(e->status, KVP_OK);
    assert_int_equal(world_stats(w, 1).lookups_limited, 2);
    free(k);
    world_fini(w, false);
    free(w);
}

/* The same key rate for FETCHes that look their keys up themselves (a
 * router's HINT, WAIT_FOR_SUPPLY): a HINT FETCH of 600 keys is charged 600;
 * the next one, past the rate, is answered KVP_ERR_LIMIT at once with
 * nothing looked up (lookup_keys_refused: those past the bucket); the good peer is served
 * meanwhile; a second later the abuser's HINT fetch is served again.
 * Mutation: FETCHes not charged (fetch_keys_charged returns true) -> the
 * second HINT fetch answers KVP_ERR_NOT_FOUND (looked up: stale keys). */
static void test_hint_fetch_key_rate(void **state)
{
    world_t *w = victim_world(state, 6, tweak_flood, 16);
    nkeys_t *k = malloc(sizeof(*k));
    nkeys_make(k, 1000);
    kvp_status_t want[3] = {KVP_ERR_NOT_FOUND, KVP_ERR_LIMIT, KVP_ERR_NOT_FOUND};
    for (int i = 0; i < 3; i++) {
        uint64_t op = 0;
        if (i == 2)
            world_run(w, 1000 * MS); /* the bucket refills */
        uint64_t refused0 = world_stats(w, 0).lookup_keys_refused;
        assert_int_equal(kvp_fetch(w->node[1], w->addr[0], 40 + (uint64_t)i, k->buf, k->len, 600,
                                   KVP_FETCH_FLAG_HINT, NULL, &op),
                         KVP_OK);
        const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOAD, op, 500 * MS);
        assert_non_null(e);
        uint64_t refused = world_stats(w, 0).lookup_keys_refused - refused0;
        print_message("  HINT FETCH %d of 600 keys: status %d, %u ok, %llu keys refused\n", i + 1,
                      e->status, e->n_ok, (unsigned long long)refused);
        assert_int_equal(e->status, want[i]);
        if (i < 2) /* the 8 held keys, when looked up (the third finds them fetched already) */
            assert_int_equal(e->n_ok, i == 1 ? 0 : 8);
        assert_true(i == 1 ? refused > 0 : refused == 0); /* 600 minus what the bucket held */
        if (i == 1)
            good_peer_fetches(w, 9, 8, 8); /* another peer's bucket is its own */
    }
    free(k);
    world_fini(w, false);
    free(w);
}

/* The key rate outlives the session (keyrate.c): a key holder that
 * reconnects in a loop -- kvp_peer_remove, kvp_peer_add, a LOOKUP of 600
 * all-miss keys on each new session -- gets at most rate x (elapsed + the
 * bucket's one second) keys looked up over the run (keys asked minus
 * lookup_keys_refused), while the good peer is served on every round and
 * the victim's blocks stay intact. Mutation: the bucket per session (the
 * old behaviour: kvp__keyrate_take takes nothing) -> every session starts
 * full and 6 x 600 keys are looked up in well under a second. */
#define RECONNECTS 6u
static void test_reconnect_key_rate(void **state)
{
    world_t *w = victim_world(state, 6, tweak_victim, 16 + 8 * RECONNECTS);
    uint8_t *kb = malloc(600 * 16);
    uint32_t lens[600], asked = 0;
    static uint8_t res[600];
    size_t off = 0;
    for (uint32_t i = 0; i < 600; i++) { /* held: 0..63; these: none */
        lens[i] = world_key(300000 + i, kb + off);
        off += lens[i];
    }
    uint64_t refused0 = world_stats(w, 0).lookup_keys_refused;
    uint64_t t0 = kvp_clock_now(&w->mc.clock);
    for (uint32_t r = 0; r < RECONNECTS; r++) {
        uint64_t op = 0;
        assert_int_equal(kvp_lookup(w->node[1], w->addr[0], 100 + r, kb, lens, 600, res, &op),
                         KVP_OK);
        const kvp_event_t *e = world_wait(w, 1, KVP_EV_LOOKUP, op, 200 * MS);
        assert_non_null(e);
        assert_int_equal(e->n_ok, 0);
        asked += 600;
        good_peer_fetches(w, 900 + r, 16 + 8 * r, 8); /* served meanwhile */
        /* the abuser leaves and comes back: a new session, the same peer id */
        assert_int_equal(kvp_peer_remove(w->node[1], w->addr[0]), KVP_OK);
        uint64_t end = kvp_clock_now(&w->mc.clock) + 2 * KVP_NSEC_PER_SEC;
        while ((world_peer_ready(w, 0, 1) || world_peer_ready(w, 1, 0)) &&
               kvp_clock_now(&w->mc.clock) < end)
            world_step(w);
        assert_false(world_peer_ready(w, 0, 1));
        world_connect(w, 1, 0);
    }
    uint64_t elapsed = kvp_clock_now(&w->mc.clock) - t0;
    uint64_t looked = asked - (world_stats(w, 0).lookup_keys_refused - refused0);
    uint64_t bound = KEY_RATE * (elapsed + KVP_NSEC_PER_SEC) / KVP_NSEC_PER_SEC + 1;
    print_message("  %u reconnects in %llu ms: %u keys asked, %llu looked up (bound %llu)\n",
                  RECONNECTS, (unsigned long long)(elapsed / MS), asked,
                  (unsigned long long)looked, (unsigned long long)bound);
    assert_true(looked <= bound);
    assert_true(looked >= KEY_RATE); /* the first second's worth was served */
    for (uint32_t k = 0; k < 16 + 8 * RECONNECTS; k++)
        assert_true(world_verify(w, 0, k));
    free(kb);
    world_fini(w, false);
    free(w);
}

int main(void)
{
    kvp_log_set_level(KVP_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pin_and_lease_abuse),
        cmocka_unit_test(test_total_supply_pins),
        cmocka_unit_test(test_lookup_memory_abuse),
        cmocka_unit_test(test_round_count_abuse),
        cmocka_unit_test(test_peer_add_cap),
        cmocka_unit_test(test_failed_fetch_flood),
        cmocka_unit_test(test_lookup_key_rate),
        cmocka_unit_test(test_hint_fetch_key_rate),
        cmocka_unit_test(test_reconnect_key_rate),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
