/* test_ctl_fake.c -- the control plane on the fake network with a manual
 * clock (deterministic): handshake, refusals before any blob, queued frames,
 * liveness, partitions, kill, stale epochs, restart claims, simultaneous
 * dials, session cap, slow peer, graceful BYE. */
#include "ctl_testlib.h"

#define MS KVP_NSEC_PER_MSEC
#define LAT (1 * MS)

typedef struct env {
    kvp_manual_clock_t mc;
    kvp_loop_t *loop;
    kvp_fake_net_t *net;
    tnode_t a, b, c;
} env_t;

static env_t *env_new(void)
{
    env_t *e = calloc(1, sizeof(*e));
    kvp_manual_clock_init(&e->mc, 1000 * KVP_NSEC_PER_SEC);
    assert_int_equal(kvp_loop_create(&e->mc.clock, &e->loop), KVP_OK);
    assert_int_equal(kvp_fake_net_create(LAT, &e->net), KVP_OK);
    tn_init(&e->a, e->loop, "A", e->net);
    tn_init(&e->b, e->loop, "B", e->net);
    tn_init(&e->c, e->loop, "C", e->net);
    for (tnode_t *n = &e->a; n <= &e->c; n++) {
        n->cfg.heartbeat_ns = 100 * MS;
        n->cfg.dead_after_ns = 400 * MS;
    }
    return e;
}

static void env_free(env_t *e)
{
    for (tnode_t *n = &e->a; n <= &e->c; n++)
        if (n->ctl)
            tn_stop(n);
    for (int i = 0; i < 10; i++)
        kvp_loop_run_once(e->loop, 0); /* let closed connections free themselves */
    kvp_fake_net_destroy(e->net);
    kvp_loop_destroy(e->loop);
    free(e);
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void run(env_t *e, uint64_t ns)
{
    tn_manual_run(&e->mc, e->loop, ns, LAT / 2);
}

static void connect_ab(env_t *e)
{
    tn_start(&e->a);
    tn_start(&e->b);
    assert_int_equal(kvp_ctl_want(e->a.ctl, "B"), KVP_OK);
    run(e, 20 * MS);
    assert_int_equal(e->a.ready, 1);
    assert_int_equal(e->b.ready, 1);
}

static void test_fake_handshake(void **state)
{
    env_t *e = env_new();
    connect_ab(e);
    assert_memory_equal(e->a.peer_blob, "blob-of-B", 9);
    assert_memory_equal(e->b.peer_blob, "blob-of-A", 9);
    assert_string_equal(kvp_link_peer_id(e->a.link), "B");
    assert_string_equal(kvp_link_peer_id(e->b.link), "A");
    assert_true(kvp_epoch_eq(kvp_link_local_epoch(e->a.link), kvp_link_remote_epoch(e->b.link)));
    assert_true(kvp_epoch_eq(kvp_link_remote_epoch(e->a.link), kvp_link_local_epoch(e->b.link)));
    assert_true(kvp_link_outbound(e->a.link));
    assert_false(kvp_link_outbound(e->b.link));
    /* heartbeats flow on idle links and measure RTT (2 x latency) */
    run(e, 1000 * MS);
    assert_true(e->a.pongs > 0 && e->b.pongs > 0);
    assert_int_equal(kvp_link_rtt_ns(e->a.link), 2 * LAT);
    assert_int_equal(e->a.down + e->b.down, 0);
    env_free(e);
}

/* Every incompatibility is refused before any blob crosses, both ways. */
static void test_fake_refusals(void **state)
{
    static const uint8_t k1[] = "secret-one", k2[] = "secret-two";
    for (int i = 0; i < 6; i++) {
        env_t *e = env_new();
        kvp_ctl_config_t *cb = &e->b.cfg;
        switch (i) {
        case 0: cb->block_size = 8192; break;
        case 1: cb->fingerprint = 0x5678; break;
        case 2: cb->hash_seed = 0x77; break;
        case 3: /* wrong key */
            e->a.cfg.psk = k1, e->a.cfg.psk_len = sizeof(k1);
            cb->psk = k2, cb->psk_len = sizeof(k2);
            break;
        case 4: cb->psk = k2, cb->psk_len = sizeof(k2); break; /* A has none */
        case 5: e->a.cfg.psk = k1, e->a.cfg.psk_len = sizeof(k1); break; /* B has none */
        }
        tn_start(&e->a);
        tn_start(&e->b);
        assert_int_equal(kvp_ctl_want(e->a.ctl, "B"), KVP_OK);
        run(e, 50 * MS);
        kvp_ctl_stats_t sa = tn_stats(&e->a), sb = tn_stats(&e->b);
        assert_int_equal(e->a.ready + e->b.ready, 0);
        assert_int_equal(sa.blobs_in + sb.blobs_in, 0); /* the blob never reached anyone */
        assert_int_equal(sa.blobs_out + sb.blobs_out, 0);
        if (i < 3)
            assert_true(sa.refused_incompatible + sb.refused_incompatible >= 1);
        else
            assert_true(sa.refused_auth + sb.refused_auth >= 1);
        assert_int_equal(sa.links_ready + sb.links_ready, 0);
        env_free(e);
    }
}

/* Every error line of the run, in order (both nodes log into one process). */
static char compat_log[8192];
static void compat_sink(kvp_log_level_t level, const char *prefix, const char *line, void *arg)
{
    (void)arg;
    if (level == KVP_LOG_ERROR)
        snprintf(compat_log + strlen(compat_log), sizeof(compat_log) - strlen(compat_log),
                 "%s: %s\n", prefix ? prefix : "-", line);
}

static void want_error_cb(void *arg, const kvp_ctl_want_info_t *wi)
{
    snprintf(arg, 128, "%s", wi->last_error);
}

/* Issue 18: a compat mismatch names both strings (the BYE of wire minor 1
 * carries each side's), in both logs and in the dialer's want last_error;
 * the refusal is still counted and no blob crosses. */
static void test_fake_compat_names_both(void **state)
{
    env_t *e = env_new();
    e->a.cfg.compat = "llama-3-8b/bf16/16";
    e->b.cfg.compat = "llama-3-8b/fp8/16";
    e->b.cfg.fingerprint = 0x5678;
    tn_start(&e->a);
    tn_start(&e->b);
    compat_log[0] = '\0';
    kvp_log_set_sink(compat_sink, NULL);
    assert_int_equal(kvp_ctl_want(e->a.ctl, "B"), KVP_OK);
    run(e, 50 * MS);
    char a_err[128] = "";
    kvp_ctl_wants_foreach(e->a.ctl, want_error_cb, a_err);
    kvp_log_set_sink(NULL, NULL);
    kvp_ctl_stats_t sa = tn_stats(&e->a), sb = tn_stats(&e->b);
    assert_int_equal(e->a.ready + e->b.ready, 0);
    assert_int_equal(sa.blobs_out + sb.blobs_out, 0);
    assert_true(sa.refused_incompatible >= 1 && sb.refused_incompatible >= 1);
    assert_int_equal(sa.protocol_errors + sb.protocol_errors, 0);
    if (!strstr(compat_log, "compat mismatch: ours 'llama-3-8b/bf16/16', peer's 'llama-3-8b/fp8/16'") ||
        !strstr(compat_log, "compat mismatch: ours 'llama-3-8b/fp8/16', peer's 'llama-3-8b/bf16/16'"))
        fail_msg("log does not name both strings on both sides:\n%s", compat_log);
    assert_string_equal(a_err, "compat mismatch: ours 'llama-3-8b/bf16/16', peer's 'llama-3-8b/fp8/16'");
    env_free(e);
}

static void test_fake_auth_ok(void **state)
{
    static const uint8_t k[] = "shared-secret";
    env_t *e = env_new();
    e->a.cfg.psk = e->b.cfg.psk = k;
    e->a.cfg.psk_len = e->b.cfg.psk_len = sizeof(k);
    e->b.cfg.num_blocks = 4096; /* layouts may differ in num_blocks */
    connect_ab(e);
    kvp_ctl_stats_t sa = tn_stats(&e->a);
    assert_int_equal(sa.blobs_in, 1);
    env_free(e);
}

/* Frames sent before ready are queued and flushed in order after both acks. */
static void test_fake_queued_order(void **state)
{
    env_t *e = env_new();
    e->a.send_on_ready = 100; /* sent from on_ready: must follow the queued ones */
    tn_start(&e->a);
    tn_start(&e->b);
    assert_int_equal(kvp_ctl_want(e->a.ctl, "B"), KVP_OK);
    kvp_link_t *l = kvp_ctl_link_pending(e->a.ctl, "B");
    assert_non_null(l);
    kvp_msg_t m;
    kvp_key_t keys[4];
    for (uint64_t r = 1; r <= 3; r++) {
        tn_lookup(&m, r, 4, keys);
        assert_int_equal(kvp_link_send(l, &m), KVP_OK);
    }
    run(e, 20 * MS);
    assert_int_equal(e->a.ready, 1);
    tn_lookup(&m, 4, 1, keys);
    assert_int_equal(kvp_link_send(e->a.link, &m), KVP_OK);
    run(e, 5 * MS);
    assert_int_equal(e->b.nframes, 5);
    static const uint64_t want[] = {1, 2, 3, 100, 4};
    for (int i = 0; i < 5; i++)
        assert_int_equal(e->b.frames[i], want[i]);
    assert_int_equal(tn_stats(&e->b).stale_frames, 0);
    env_free(e);
}

/* Partition: both sides declare the peer dead after dead_after (fault); on
 * heal the wanting side redials and the session comes back. */
static void test_fake_partition(void **state)
{
    env_t *e = env_new();
    connect_ab(e);
    kvp_fake_net_partition(e->net, "A", "B", true);
    run(e, 300 * MS);
    assert_int_equal(e->a.down + e->b.down, 0); /* not yet: dead after 400 ms */
    run(e, 200 * MS);
    assert_int_equal(e->a.down, 1);
    assert_int_equal(e->b.down, 1);
    assert_int_equal(e->a.down_reason, KVP_DOWN_DEAD);
    assert_true(e->a.down_fault);
    assert_int_equal(tn_stats(&e->a).peers_dead, 1);
    kvp_fake_net_partition(e->net, "A", "B", false);
    run(e, 2000 * MS);
    assert_int_equal(e->a.ready, 2);
    assert_int_equal(e->b.ready, 2);
    assert_int_equal(tn_stats(&e->a).links_ready, 1);
    env_free(e);
}

/* Kill: the other side sees EOF at once, not after dead_after. */
static void test_fake_kill(void **state)
{
    env_t *e = env_new();
    connect_ab(e);
    kvp_fake_net_kill(e->net, "B");
    run(e, 2 * MS);
    assert_int_equal(e->a.down, 1);
    assert_int_equal(e->a.down_reason, KVP_DOWN_EOF);
    assert_true(e->a.down_fault);
    env_free(e);
}

/* Frames with another incarnation's epochs are dropped before any effect
 * and counted; the link keeps working. */
static void test_fake_stale_epochs(void **state)
{
    env_t *e = env_new();
    connect_ab(e);
    kvp_link_t *l = e->a.link;
    kvp_epoch_t bogus;
    assert_int_equal(kvp_epoch_new(&bogus), KVP_OK);
    kvp_msg_t m;
    kvp_key_t keys[1];
    tn_lookup(&m, 7, 1, keys);
    assert_int_equal(kvp_link_send_epochs(l, &m, &bogus, kvp_link_remote_epoch(l)), KVP_OK);
    assert_int_equal(kvp_link_send_epochs(l, &m, kvp_link_local_epoch(l), &bogus), KVP_OK);
    kvp_msg_t bye = {.type = KVP_MSG_BYE};
    assert_int_equal(kvp_link_send_epochs(l, &bye, &bogus, kvp_link_remote_epoch(l)), KVP_OK);
    tn_lookup(&m, 8, 1, keys);
    assert_int_equal(kvp_link_send(l, &m), KVP_OK);
    run(e, 5 * MS);
    assert_int_equal(tn_stats(&e->b).stale_frames, 3);
    assert_int_equal(e->b.nframes, 1);
    assert_int_equal(e->b.frames[0], 8);
    assert_int_equal(e->b.down, 0); /* the stale BYE changed nothing */
    env_free(e);
}

/* A new connection claiming a live session's peer id is refused; the
 * existing session is untouched. */
static void test_fake_restart_claim_live(void **state)
{
    env_t *e = env_new();
    connect_ab(e);
    kvp_link_t *old = e->a.link;
    e->c.cfg.listen_addr = NULL;
    e->c.cfg.peer_id = "B"; /* an impostor / restarted B while B still answers */
    tn_start(&e->c);
    assert_int_equal(kvp_ctl_want(e->c.ctl, "A"), KVP_OK);
    run(e, 50 * MS);
    assert_int_equal(e->c.ready, 0);
    assert_int_equal(e->a.ready, 1);
    assert_int_equal(e->a.down, 0);
    assert_ptr_equal(e->a.link, old);
    assert_int_equal(tn_stats(&e->a).refused_duplicate, 1);
    assert_int_equal(tn_stats(&e->c).blobs_in, 0);
    kvp_ctl_unwant(e->c.ctl, "A");
    env_free(e);
}

/* The old session is silent: after dead_after it is reaped as a fault and
 * then the new one is accepted (on_down of the old before on_ready). */
static void test_fake_restart_claim_dead(void **state)
{
    env_t *e = env_new();
    connect_ab(e);
    kvp_fake_net_partition(e->net, "A", "B", true);
    e->c.cfg.listen_addr = NULL;
    e->c.cfg.peer_id = "B";
    tn_start(&e->c);
    assert_int_equal(kvp_ctl_want(e->c.ctl, "A"), KVP_OK);
    run(e, 100 * MS);
    assert_int_equal(e->c.ready, 0); /* claim pending */
    run(e, 500 * MS);
    assert_int_equal(e->a.down, 1);
    assert_int_equal(e->a.down_reason, KVP_DOWN_DEAD);
    assert_true(e->a.down_fault);
    assert_int_equal(e->a.ready, 2);
    assert_int_equal(e->c.ready, 1);
    assert_non_null(e->a.link);
    assert_int_equal(tn_stats(&e->a).links_ready, 1);
    env_free(e);
}

/* Both dial at once, at many relative offsets: exactly one link on each
 * side, no on_down anywhere, and both keep the same connection. */
static void test_fake_simultaneous_dial(void **state)
{
    static const uint8_t key[] = "k";
    for (int k = 0; k < 48; k++) {
        env_t *e = env_new();
        if (k >= 24) { /* with a psk both links sit in AUTH: the lower-id rule decides */
            e->a.cfg.psk = e->b.cfg.psk = key;
            e->a.cfg.psk_len = e->b.cfg.psk_len = sizeof(key);
        }
        tn_start(&e->a);
        tn_start(&e->b);
        kvp_ctl_t *first = (k & 1) ? e->b.ctl : e->a.ctl, *second = (k & 1) ? e->a.ctl : e->b.ctl;
        assert_int_equal(kvp_ctl_want(first, (k & 1) ? "A" : "B"), KVP_OK);
        run(e, (uint64_t)((k % 24) / 2) * (LAT / 4));
        assert_int_equal(kvp_ctl_want(second, (k & 1) ? "B" : "A"), KVP_OK);
        run(e, 3000 * MS);
        kvp_ctl_stats_t sa = tn_stats(&e->a), sb = tn_stats(&e->b);
        assert_int_equal(sa.links_ready, 1);
        assert_int_equal(sb.links_ready, 1);
        assert_int_equal(sa.links_handshaking + sb.links_handshaking, 0);
        assert_int_equal(e->a.ready, 1);
        assert_int_equal(e->b.ready, 1);
        assert_int_equal(e->a.down + e->b.down, 0);
        assert_true(sa.dials + sb.dials <= 2); /* settled at once: nobody redialed */
        assert_true(kvp_epoch_eq(kvp_link_local_epoch(e->a.link),
                                 kvp_link_remote_epoch(e->b.link)));
        env_free(e);
    }
}

static void test_fake_session_cap(void **state)
{
    env_t *e = env_new();
    e->a.cfg.max_sessions = 1;
    tn_start(&e->a);
    tn_start(&e->b);
    tn_start(&e->c);
    assert_int_equal(kvp_ctl_want(e->b.ctl, "A"), KVP_OK);
    run(e, 20 * MS);
    assert_int_equal(kvp_ctl_want(e->c.ctl, "A"), KVP_OK);
    run(e, 20 * MS);
    assert_int_equal(e->a.ready, 1);
    assert_int_equal(e->b.ready, 1);
    assert_int_equal(e->c.ready, 0);
    assert_int_equal(tn_stats(&e->a).refused_limit, 1);
    assert_int_equal(tn_stats(&e->c).blobs_in, 0);
    assert_int_equal(e->a.down + e->b.down, 0);
    kvp_ctl_unwant(e->c.ctl, "A");
    env_free(e);
}

static void test_fake_handshake_timeout(void **state)
{
    env_t *e = env_new();
    tn_start(&e->a);
    tn_start(&e->b);
    kvp_fake_net_partition(e->net, "A", "B", true);
    assert_int_equal(kvp_ctl_want(e->a.ctl, "B"), KVP_OK);
    run(e, 10500 * MS);
    assert_true(tn_stats(&e->a).handshakes_timed_out >= 1);
    assert_int_equal(e->a.ready, 0);
    assert_int_equal(e->a.down, 0); /* never ready: no on_down */
    env_free(e);
}

/* A peer that takes nothing: the writer's queue stays within its bound and
 * that link goes down as SLOW_PEER -- from the loop, not inside send. */
static void test_fake_slow_peer(void **state)
{
    env_t *e = env_new();
    e->a.cfg.wbuf_max = 64 * 1024;
    connect_ab(e);
    kvp_fake_net_partition(e->net, "A", "B", true);
    kvp_msg_t m;
    kvp_key_t keys[64];
    tn_lookup(&m, 1, 64, keys);
    kvp_link_t *l = e->a.link;
    kvp_status_t st = KVP_OK;
    int sent = 0;
    while (st == KVP_OK && sent < 10000) {
        st = kvp_link_send(l, &m);
        if (st == KVP_OK)
            assert_true(kvp_link_queued_bytes(l) <= 64 * 1024);
        sent++;
    }
    assert_int_equal(st, KVP_ERR_LIMIT);
    assert_int_equal(e->a.down, 0); /* not inside the call */
    assert_int_equal(kvp_link_send(l, &m), KVP_ERR_CLOSED);
    run(e, 1 * MS);
    assert_int_equal(e->a.down, 1);
    assert_int_equal(e->a.down_reason, KVP_DOWN_SLOW_PEER);
    env_free(e);
}

static void test_fake_graceful_bye(void **state)
{
    env_t *e = env_new();
    connect_ab(e);
    kvp_link_close(e->a.link, KVP_BYE_GRACEFUL);
    assert_int_equal(e->a.down, 0); /* on_down runs from the loop */
    run(e, 5 * MS);
    assert_int_equal(e->a.down, 1);
    assert_int_equal(e->a.down_reason, KVP_DOWN_LOCAL_CLOSE);
    assert_false(e->a.down_fault);
    assert_int_equal(e->b.down, 1);
    assert_int_equal(e->b.down_reason, KVP_DOWN_BYE);
    assert_int_equal(e->b.down_bye, KVP_BYE_GRACEFUL);
    assert_false(e->b.down_fault);
    env_free(e);
}

/* on_ready refusing: the refusing side never reports the link; the other
 * sees a fault BYE. */
static void test_fake_ready_refused(void **state)
{
    env_t *e = env_new();
    e->b.ready_status = KVP_ERR_TRANSPORT;
    tn_start(&e->a);
    tn_start(&e->b);
    assert_int_equal(kvp_ctl_want(e->a.ctl, "B"), KVP_OK);
    run(e, 20 * MS);
    kvp_ctl_unwant(e->a.ctl, "B");
    assert_int_equal(e->b.ready + e->b.down, 0);
    assert_int_equal(e->a.ready, 1);
    assert_int_equal(e->a.down, 1);
    assert_int_equal(e->a.down_reason, KVP_DOWN_BYE);
    assert_int_equal(e->a.down_bye, KVP_BYE_TRANSPORT);
    assert_true(e->a.down_fault);
    env_free(e);
}

/* Redial with exponential backoff while wanted and not ready; none after
 * unwant. Backoff 100 ms doubling (jitter +-25%): dials near 0, 0.1, 0.3,
 * 0.7, 1.5 s. */
static void test_fake_backoff(void **state)
{
    env_t *e = env_new();
    tn_start(&e->a);
    assert_int_equal(kvp_ctl_want(e->a.ctl, "nobody"), KVP_OK);
    assert_int_equal(kvp_ctl_want(e->a.ctl, "nobody"), KVP_OK); /* idempotent */
    assert_int_equal(kvp_ctl_want(e->a.ctl, "A"), KVP_ERR_INVALID); /* ourselves */
    assert_int_equal(tn_stats(&e->a).dials, 1); /* the first dial is immediate */
    run(e, 50 * MS);
    assert_int_equal(tn_stats(&e->a).dials, 1);
    run(e, 1950 * MS);
    kvp_ctl_stats_t st = tn_stats(&e->a);
    assert_true(st.dials >= 4 && st.dials <= 6);
    assert_int_equal(st.dial_failures, st.dials);
    kvp_ctl_unwant(e->a.ctl, "nobody");
    run(e, 10000 * MS);
    assert_int_equal(tn_stats(&e->a).dials, st.dials);
    env_free(e);
}

/* A wanted address whose peer announces another peer id: the dialed link
 * satisfies the want, and its loss triggers a redial. */
static void test_fake_want_alias(void **state)
{
    env_t *e = env_new();
    e->b.cfg.peer_id = "b-id";
    tn_start(&e->a);
    tn_start(&e->b);
    assert_int_equal(kvp_ctl_want(e->a.ctl, "B"), KVP_OK);
    run(e, 500 * MS);
    assert_int_equal(e->a.ready, 1);
    assert_int_equal(tn_stats(&e->a).dials, 1); /* no redial while it is up */
    assert_string_equal(kvp_link_peer_id(e->a.link), "b-id");
    kvp_fake_net_kill(e->net, "B");
    run(e, 1000 * MS);
    assert_int_equal(e->a.down, 1);
    assert_int_equal(e->a.ready, 2);
    env_free(e);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fake_handshake),
        cmocka_unit_test(test_fake_refusals),
        cmocka_unit_test(test_fake_compat_names_both),
        cmocka_unit_test(test_fake_auth_ok),
        cmocka_unit_test(test_fake_queued_order),
        cmocka_unit_test(test_fake_partition),
        cmocka_unit_test(test_fake_kill),
        cmocka_unit_test(test_fake_stale_epochs),
        cmocka_unit_test(test_fake_restart_claim_live),
        cmocka_unit_test(test_fake_restart_claim_dead),
        cmocka_unit_test(test_fake_simultaneous_dial),
        cmocka_unit_test(test_fake_session_cap),
        cmocka_unit_test(test_fake_handshake_timeout),
        cmocka_unit_test(test_fake_slow_peer),
        cmocka_unit_test(test_fake_graceful_bye),
        cmocka_unit_test(test_fake_ready_refused),
        cmocka_unit_test(test_fake_backoff),
        cmocka_unit_test(test_fake_want_alias),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
