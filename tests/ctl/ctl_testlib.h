/* ctl_testlib.h -- helpers for the ctl tests (header-only): a test node
 * (loop + ctl + recorded callbacks) and loop-driving helpers for the manual
 * and the real clock. */
#ifndef KVP_CTL_TESTLIB_H
#define KVP_CTL_TESTLIB_H

#include "testutil.h"
#include "ctl/ctl.h"

#include <string.h>

#define TN_MAX_FRAMES 256

typedef struct tnode {
    kvp_loop_t *loop;
    bool own_loop;
    kvp_ctl_t *ctl;
    kvp_ctl_config_t cfg;
    char blob[64];
    int ready, down, pongs;
    kvp_status_t ready_status; /* what on_ready returns */
    kvp_link_t *link;          /* last ready link (cleared at its down) */
    kvp_down_reason_t down_reason;
    uint16_t down_bye;
    bool down_fault;
    char peer_blob[64];
    size_t peer_blob_len;
    uint64_t frames[TN_MAX_FRAMES]; /* request ids of LOOKUP frames received */
    int nframes;
    uint64_t send_on_ready; /* non-zero: on_ready sends a LOOKUP with this request id */
} tnode_t;

static inline kvp_status_t tn_on_ready(void *arg, kvp_link_t *link, const kvp_msg_hello_t *peer,
                                const void *blob, size_t blob_len)
{
    tnode_t *n = arg;
    if (n->ready_status != KVP_OK)
        return n->ready_status;
    n->ready++;
    n->link = link;
    n->peer_blob_len = blob_len < sizeof(n->peer_blob) ? blob_len : sizeof(n->peer_blob);
    memcpy(n->peer_blob, blob, n->peer_blob_len);
    if (n->send_on_ready) {
        static const uint8_t kb[4] = "key1";
        kvp_key_t key = {kb, 4};
        kvp_msg_t m = {.type = KVP_MSG_LOOKUP};
        m.u.lookup.request_id = n->send_on_ready;
        m.u.lookup.n = 1;
        m.u.lookup.keys = &key;
        assert_int_equal(kvp_link_send(link, &m), KVP_OK);
    }
    return KVP_OK;
}

static inline void tn_on_frame(void *arg, kvp_link_t *link, const kvp_msg_t *msg)
{
    tnode_t *n = arg;
    if (msg->type == KVP_MSG_LOOKUP && n->nframes < TN_MAX_FRAMES)
        n->frames[n->nframes++] = msg->u.lookup.request_id;
}

static inline void tn_on_down(void *arg, kvp_link_t *link, kvp_down_reason_t reason, uint16_t bye,
                       bool fault)
{
    tnode_t *n = arg;
    n->down++;
    n->down_reason = reason;
    n->down_bye = bye;
    n->down_fault = fault;
    if (n->link == link)
        n->link = NULL;
}

static inline void tn_on_pong(void *arg, kvp_link_t *link, uint64_t rtt_ns)
{
    ((tnode_t *)arg)->pongs++;
}

/* Fill a default config (caller may edit n->cfg before tn_start). */
static inline void tn_init(tnode_t *n, kvp_loop_t *loop, const char *listen, kvp_fake_net_t *net)
{
    memset(n, 0, sizeof(*n));
    n->loop = loop;
    /* unique per node: a blob equal to our own or a live peer's is refused (issue 27) */
    snprintf(n->blob, sizeof(n->blob), "blob-of-%s#%p", listen ? listen : "client", (void *)n);
    kvp_ctl_config_t *c = &n->cfg;
    c->listen_addr = listen;
    c->num_blocks = 128;
    c->block_size = 4096;
    c->fingerprint = 0x1234;
    c->hash_seed = 0x99;
    c->blob = n->blob;
    c->blob_len = strlen(n->blob);
    c->loop = loop;
    c->fake_net = net;
    c->cb.on_ready = tn_on_ready;
    c->cb.on_frame = tn_on_frame;
    c->cb.on_down = tn_on_down;
    c->cb.on_pong = tn_on_pong;
    c->cb.arg = n;
}

static inline void tn_start(tnode_t *n)
{
    assert_int_equal(kvp_ctl_create(&n->cfg, &n->ctl), KVP_OK);
}

static inline void tn_stop(tnode_t *n)
{
    kvp_ctl_destroy(n->ctl);
    n->ctl = NULL;
}

static inline kvp_ctl_stats_t tn_stats(const tnode_t *n)
{
    kvp_ctl_stats_t st;
    kvp_ctl_get_stats(n->ctl, &st);
    return st;
}

static inline void tn_lookup(kvp_msg_t *m, uint64_t req, uint32_t nkeys, kvp_key_t *keys)
{
    static const uint8_t kb[8] = "keybytes";
    memset(m, 0, sizeof(*m));
    m->type = KVP_MSG_LOOKUP;
    m->u.lookup.request_id = req;
    m->u.lookup.round = 1;
    for (uint32_t i = 0; i < nkeys; i++) {
        keys[i].data = kb;
        keys[i].len = 8;
    }
    m->u.lookup.n = nkeys;
    m->u.lookup.keys = keys;
}

/* ---- manual clock: advance in steps, running the loop (fake network) ---- */

static inline void tn_manual_run(kvp_manual_clock_t *mc, kvp_loop_t *loop, uint64_t total_ns,
                          uint64_t step_ns)
{
    uint64_t end = kvp_clock_now(&mc->clock) + total_ns;
    for (;;) {
        while (kvp_loop_run_once(loop, 0) > 0)
            ;
        uint64_t now = kvp_clock_now(&mc->clock);
        if (now >= end)
            break;
        kvp_manual_clock_advance(mc, KVP_MIN(step_ns, end - now));
    }
}

/* ---- real clock: run loops until cond or a (scaled) deadline ---- */

typedef bool (*tn_cond_fn)(void *arg);

static inline bool tn_run_until(kvp_loop_t **loops, int nloops, tn_cond_fn cond, void *arg,
                         uint64_t timeout_ns)
{
    uint64_t end = kvp_clock_now(kvp_clock_real()) + kvp_test_scaled_ns(timeout_ns);
    while (!cond || !cond(arg)) {
        if (kvp_clock_now(kvp_clock_real()) >= end)
            return false;
        for (int i = 0; i < nloops; i++)
            kvp_loop_run_once(loops[i], nloops > 1 ? 1 : 5);
    }
    return true;
}

#endif
