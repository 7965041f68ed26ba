/*
 * client_outcome.c -- the consumer's loads from their answer to their end
 * (issue 31: client.c cut along this seam): FETCH_DONE (verify, commit or
 * land first on an AM path), ABORT_ACK, an outcome unknown (quarantine, or
 * refuse at once on an AM path) and the proofs that release quarantined
 * slots. The phases and the slots' states are in client.c's header.
 */
#include "session/session_int.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* AM path: FETCH_DONE is sent once the source's sends and flush completed,
 * i.e. once the blocks left its memory; on the control connection it can
 * overtake their tail on the data connection. Such a load waits LANDING
 * (on env->landing; the node thread goes on serving everything else)
 * until our handler saw every block the source sent, its endpoint fails,
 * or the bound passes; a block not landed by then fails (refused,
 * abandoned) instead of being committed. */
#define KVP_AM_LAND_WAIT_NS (2 * KVP_NSEC_PER_SEC)


/* Release a quarantined load's slots: by proof, or by the hold cap (then
 * the slots are suspect). Frees the load. */
void kvp__load_release_quarantine(kvp_load_t *l, kvp_proof_t proof)
{
    l->cap_released = proof == KVP_PROOF_HOLD_CAP;
    for (uint32_t i = 0; i < l->n; i++) {
        if (!l->blocks[i].reserved)
            continue;
        kvp__release_dst(l->env, l->peer, l->blocks[i].dst, true, proof);
        l->blocks[i].reserved = false;
    }
    kvp__load_free(l);
}

static bool load_awaits_landing(const kvp_session_t *s, const kvp_msg_fetch_done_t *m)
{
    kvp_xport_t *x = s->env->xport;
    /* issue 27: a direct-shm commit needs the transport's same-host proof */
    bool need = x->ops->landing_required != NULL
                    ? x->ops->landing_required(x, s->xpeer)
                    : x->ops->inbound_refusable != NULL && x->ops->inbound_refusable(x, s->xpeer);
    return m->status == KVP_OK && m->n > 0 && x->ops->is_landed != NULL && need &&
           !KVP_MUTATED(KVP_MUT_AM_SKIP_AWAIT);
}

static bool block_landed(const kvp_load_t *l, const kvp_load_block_t *b)
{
    kvp_xport_t *x = l->env->xport;
    return x->ops->is_landed(x, (kvp_xslot_t){b->dst.slot, b->dst.gen});
}

/* Advance l->land_next past the blocks that need nothing more (not
 * reserved, not sent, or landed); true when none is left. Each block is
 * passed once over the load's life. */
static bool load_all_landed(kvp_load_t *l)
{
    while (l->land_next < l->n) {
        const kvp_load_block_t *b = &l->blocks[l->land_next];
        if (b->reserved && b->sent && !block_landed(l, b))
            return false;
        l->land_next++;
    }
    return true;
}

/* The digests of a load's blocks, hashed on two threads (issue 29: a 16 x
 * 2 MiB load is 1.7 ms of xxh3). Every block load_settle_done will verify
 * (sent, reserved, here): slots[j] is block idx[j]'s, its digest tmp[j];
 * h[0] hashes the first half, h[1] the second. Nothing writes these slots
 * any more: the FETCH_DONE came, and on the AM path only blocks that landed
 * are taken. */
typedef struct load_verify load_verify_t;

typedef struct load_hash {
    const kvp_store_t *store;
    const uint32_t *slots;
    kvp_digest_t *out;
    uint32_t n;
    load_verify_t *v; /* verified later: the job this half counts down */
} load_hash_t;

struct load_verify {
    load_hash_t h[2];
    kvp_digest_t *tmp;
    uint32_t *slots, *idx, k;
    kvp_session_env_t *env; /* verified later: its loop, the test's hold */
    atomic_uint left;       /* verified later: halves not hashed yet */
    bool split;             /* verified later: h[1] on verify_helper (else on ours) */
};

static void load_hash_run(void *arg)
{
    load_hash_t *h = arg;
    load_verify_t *v = h->v;
    while (v != NULL && atomic_load_explicit(&v->env->verify_held, memory_order_acquire))
        usleep(1000); /* a test holds the verify (test_node_cma_ucx) */
    for (uint32_t i = 0; i < h->n; i++)
        h->out[i] = kvp_store_slot_digest(h->store, h->slots[i]);
    if (v != NULL && atomic_fetch_sub_explicit(&v->left, 1, memory_order_acq_rel) == 1)
        kvp_loop_wakeup(v->env->loop); /* the last half: the node thread settles the load */
}

static void verify_free(load_verify_t *v)
{
    kvp__free(v->tmp);
    kvp__free(v->slots);
    kvp__free(v->idx);
    kvp__free(v);
}

/* How many of l's blocks load_settle_done will verify; 0 when too few
 * bytes to split them over two threads (under KVP_HELPER_SPLIT_BYTES). */
static uint32_t verify_count(const kvp_load_t *l, bool landing)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < l->n; i++) {
        const kvp_load_block_t *b = &l->blocks[i];
        k += b->reserved && b->sent && (!landing || i < l->land_next || block_landed(l, b));
    }
    return k < 2 || (size_t)k * l->env->cfg->block_size < KVP_HELPER_SPLIT_BYTES ? 0 : k;
}

/* The hashing job of l's blocks; NULL (the store hashes each as it
 * verifies it) under KVP_HELPER_SPLIT_BYTES or without memory. */
static load_verify_t *verify_new(kvp_load_t *l, bool landing)
{
    kvp_session_env_t *n = l->env;
    uint32_t k = verify_count(l, landing);
    if (k == 0)
        return NULL;
    load_verify_t *v = kvp__calloc(1, sizeof(*v));
    if (v == NULL)
        return NULL;
    v->tmp = kvp__calloc(k, sizeof(*v->tmp));
    v->slots = kvp__calloc(k, sizeof(*v->slots));
    v->idx = kvp__calloc(k, sizeof(*v->idx));
    if (v->tmp == NULL || v->slots == NULL || v->idx == NULL) {
        verify_free(v);
        return NULL;
    }
    for (uint32_t i = 0, j = 0; i < l->n; i++) {
        const kvp_load_block_t *b = &l->blocks[i];
        if (b->reserved && b->sent && (!landing || i < l->land_next || block_landed(l, b))) {
            v->slots[j] = b->dst.slot;
            v->idx[j++] = i;
        }
    }
    v->k = k;
    v->env = n;
    v->h[0] = (load_hash_t){n->store, v->slots, v->tmp, k / 2, NULL};
    v->h[1] = (load_hash_t){n->store, v->slots + k / 2, v->tmp + k / 2, k - k / 2, NULL};
    atomic_init(&v->left, 0);
    return v;
}

/* out[i] is block i's digest (NULL without memory: the store hashes). */
static kvp_digest_t *verify_digests(const kvp_load_t *l, load_verify_t *v)
{
    kvp_digest_t *out = kvp__calloc(l->n, sizeof(*out));
    for (uint32_t j = 0; out != NULL && j < v->k; j++)
        out[v->idx[j]] = v->tmp[j];
    verify_free(v);
    return out;
}

/* Every block load_settle_done will verify, hashed now, half by the env's
 * helper thread (not while the verifier holds it: then NULL, as below the
 * split size). */
static kvp_digest_t *load_hash_blocks(kvp_load_t *l, bool landing)
{
    kvp_session_env_t *n = l->env;
    load_verify_t *v = n->verifying == NULL ? verify_new(l, landing) : NULL;
    if (v == NULL)
        return NULL;
    if (!kvp__helper_post(&n->verify_helper, n->name, load_hash_run, &v->h[1])) {
        verify_free(v);
        return NULL;
    }
    load_hash_run(&v->h[0]);
    kvp__helper_wait(n->verify_helper);
    return verify_digests(l, v);
}

/* l's blocks hashed by the verifier thread and the helper, a half each;
 * false: they cannot be (below the split size, no thread or memory). */
static bool load_verify_start(kvp_load_t *l)
{
    kvp_session_env_t *n = l->env;
    KVP_ASSERT(n->verifying == NULL);
    load_verify_t *v = verify_new(l, false);
    if (v == NULL)
        return false;
    v->h[0].v = v->h[1].v = v;
    atomic_init(&v->left, 2);
    kvp__helper_start(&n->verifier, n->name, "kvp-verifier", 0);
    if (!kvp__helper_post(&n->verifier, n->name, load_hash_run, &v->h[0])) {
        verify_free(v);
        return false;
    }
    v->split = kvp__helper_post(&n->verify_helper, n->name, load_hash_run, &v->h[1]);
    if (!v->split) /* no second helper: that half here, the first still off the thread */
        load_hash_run(&v->h[1]);
    l->verify = v;
    n->verifying = l;
    n->st->loads_verified_later++;
    return true;
}

/* Issue 29 (serve_fairness.py --at consumer): a big load's blocks hashed off
 * the node thread while the load waits LANDING, so the node thread answers
 * its other peers meanwhile (a 16 x 2 MiB verify on it put their LOOKUPs at
 * p99 ~1.7-2.1 ms); the last half wakes the node thread, which settles the
 * load (kvp__client_check_landing). One load at a time on the two threads:
 * a big load arriving meanwhile waits its turn on env->verify_wait (FIFO;
 * kvp__client_check_landing starts it). false: verify at once (below the
 * split size, verification off, no thread or memory). */
static bool load_verify_later(kvp_load_t *l, kvp_status_t done)
{
    kvp_session_env_t *n = l->env;
    if (done != KVP_OK || !n->cfg->verify_checksums || KVP_MUTATED(KVP_MUT_SKIP_CHECKSUM))
        return false;
    if (n->verifying == NULL)
        return load_verify_start(l);
    if (verify_count(l, false) == 0)
        return false;
    kvp_list_insert_tail(&n->verify_wait, &l->land_link);
    l->verify_queued = true;
    n->st->loads_verify_queued++;
    return true;
}

/* The digests of a load verified later: waited for if its job still runs
 * (the landing bound, its session ending). */
static kvp_digest_t *load_verify_take(kvp_load_t *l)
{
    kvp_session_env_t *n = l->env;
    load_verify_t *v = l->verify;
    KVP_ASSERT(n->verifying == l);
    atomic_store_explicit(&n->verify_held, false, memory_order_release); /* a test's hold ends */
    kvp__helper_wait(n->verifier); /* both halves returned: nothing touches v after */
    if (v->split)
        kvp__helper_wait(n->verify_helper);
    l->verify = NULL;
    n->verifying = NULL;
    return verify_digests(l, v);
}

/* The digests load_settle_done verifies against: those hashed later, or
 * now (NULL: the store hashes each block as it verifies it, or none). */
static kvp_digest_t *load_digests(kvp_load_t *l, bool verify, bool landing)
{
    if (l->verify != NULL)
        return load_verify_take(l);
    return verify ? load_hash_blocks(l, landing) : NULL;
}

/* Apply the FETCH_DONE recorded in the load's blocks: commit the verified
 * blocks (on a LANDING load: only those that landed), abandon the rest,
 * publish (once), settle and free. Every block is refused before its slot
 * leaves FILLING, so nothing can land after. */
static void load_settle_done(kvp_load_t *l, kvp_status_t done_status, bool landing)
{
    kvp_session_env_t *n = l->env;
    uint32_t ok = 0, missing = 0, k = 0;
    kvp_status_t first_err = done_status;
    /* Verification off: the slot takes the source's digest, no hash of the
     * block on the node thread. */
    bool verify = n->cfg->verify_checksums && !KVP_MUTATED(KVP_MUT_SKIP_CHECKSUM);
    kvp_digest_t *sums = load_digests(l, verify && done_status == KVP_OK, landing);
    for (uint32_t i = 0; i < l->n; i++) {
        kvp_load_block_t *b = &l->blocks[i];
        if (!b->reserved)
            continue;
        k++;
        bool here = !landing || i < l->land_next || !b->sent || block_landed(l, b);
        /* Not ok in a successful FETCH_DONE: the source had no supply for
         * that key (it missed), the others were sent (F9, partial). */
        kvp_status_t st = done_status == KVP_OK ? KVP_ERR_NOT_FOUND : KVP_ERR_TRANSPORT;
        kvp__load_block_refuse(l, b); /* leaves FILLING below: nothing may land after */
        if (done_status == KVP_OK && b->sent && !here) {
            st = KVP_ERR_TRANSPORT; /* sent, but never reached us (AM path) */
            missing++;
        } else if (done_status == KVP_OK && b->sent) {
            const kvp_digest_t *got = sums ? &sums[i] : NULL;
            st = l->external ? kvp__release_dst_lent(n, l->peer, b->dst, &b->digest, got,
                                                     verify, KVP_PROOF_FETCH_DONE)
                             : kvp__release_dst_commit(n, l->peer, b->dst, &b->digest, got,
                                                       verify, KVP_PROOF_FETCH_DONE);
        }
        if (st == KVP_ERR_CHECKSUM)
            KVP_ERROR(n->name, "peer %s: block %u of round %llu fails its checksum: dropped",
                      l->peer, i, (unsigned long long)l->round);
        if (st != KVP_OK) {
            /* A sent block that never landed is safe to free because our
             * handler refused it above (AM path), not because of FETCH_DONE. */
            kvp__release_dst(n, l->peer, b->dst, false,
                             b->sent && !here ? KVP_PROOF_AM_REFUSE : KVP_PROOF_FETCH_DONE);
            if (first_err == KVP_OK)
                first_err = st;
        } else {
            ok++;
            if (!l->external) /* issue 29: a lent slot's block is the embedding's */
                kvp__server_on_commit(n, b->key.data, b->key.len);
        }
        b->reserved = false;
        if (l->block_status)
            l->block_status[i] = st;
    }
    kvp__free(sums);
    if (missing)
        KVP_WARN(n->name, "peer %s: %u of %u blocks of round %llu never reached us "
                 "after FETCH_DONE: failed", l->peer, missing, k, (unsigned long long)l->round);
    n->st->blocks_in += ok;
    n->st->bytes_in += (uint64_t)ok * n->cfg->block_size;
    if (!l->published)
        kvp__load_publish(l, first_err, ok);
    kvp__load_set_phase(l, KVP_LOAD_SETTLED);
    kvp__load_free(l);
}

void kvp__client_on_fetch_done(kvp_session_t *s, const kvp_msg_fetch_done_t *m)
{
    kvp_session_env_t *n = s->env;
    kvp_load_t *l = kvp__load_find(s, m->round, m->request_id);
    if (l == NULL || l->phase == KVP_LOAD_LANDING)
        return; /* duplicate of an answer already applied (or being applied): idempotent */
    if (l->slots == KVP_LOAD_SLOTS_REFUSED) { /* failed, released earlier (AM_REFUSE) */
        kvp__load_set_phase(l, KVP_LOAD_SETTLED);
        kvp__load_free(l);
        return;
    }
    uint32_t want = 0;
    for (uint32_t i = 0; i < l->n; i++)
        want += l->blocks[i].reserved;
    if (m->n != want) {
        kvp__session_fault(s, KVP_BYE_PROTOCOL, "FETCH_DONE block count differs from FETCH");
        return;
    }
    if (l->slots == KVP_LOAD_SLOTS_HELD) { /* proof from the live session: release */
        kvp__load_release_quarantine(l, KVP_PROOF_FETCH_DONE);
        return;
    }
    /* Record the answer in the load (no allocation): settled now, or once
     * the blocks landed. */
    uint32_t k = 0;
    for (uint32_t i = 0; i < l->n; i++) {
        kvp_load_block_t *b = &l->blocks[i];
        if (!b->reserved)
            continue;
        b->sent = m->blocks[k].ok != 0;
        b->digest = m->blocks[k++].digest;
    }
    kvp_status_t done = m->status != KVP_OK ? (kvp_status_t)m->status : KVP_OK;
    bool landing = load_awaits_landing(s, m);
    if (!landing && !load_verify_later(l, done)) {
        load_settle_done(l, done, false);
        return;
    }
    l->land_next = 0;
    if (landing) {
        n->st->loads_landing_awaited++;
        if (load_all_landed(l)) {
            load_settle_done(l, done, true);
            return;
        }
    }
    l->done_status = done;
    kvp__load_set_phase(l, KVP_LOAD_LANDING);
    if (landing) /* polled; a verify wakes the node thread itself */
        kvp_list_insert_tail(&n->landing, &l->land_link);
    kvp_timer_stop(n->loop, &l->timer); /* the load / abort deadlines are over */
    kvp_timer_start(n->loop, &l->timer, kvp__env_now(n) + KVP_AM_LAND_WAIT_NS);
}

/* The verifier free: the loads waiting for it, in turn -- the first one
 * that can be started is, the others before it verified at once. */
static void load_verify_next(kvp_session_env_t *n)
{
    while (n->verifying == NULL && !kvp_list_empty(&n->verify_wait)) {
        kvp_load_t *l = KVP_CONTAINER_OF(n->verify_wait.next, kvp_load_t, land_link);
        kvp_list_remove(&l->land_link);
        l->verify_queued = false;
        if (!load_verify_start(l))
            load_settle_done(l, l->done_status, false);
    }
}

void kvp__client_check_landing(kvp_session_env_t *n)
{
    kvp_load_t *v = n->verifying;
    if (v != NULL && atomic_load_explicit(&v->verify->left, memory_order_acquire) == 0)
        load_settle_done(v, v->done_status, false); /* every block here: digests taken */
    load_verify_next(n);
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &n->landing)
    {
        kvp_load_t *l = KVP_CONTAINER_OF(p, kvp_load_t, land_link);
        KVP_ASSERT(l->phase == KVP_LOAD_LANDING && l->sess != NULL && l->verify == NULL);
        if (load_all_landed(l) || n->xport->ops->peer_status(n->xport, l->xpeer) != KVP_OK)
            load_settle_done(l, l->done_status, true);
    }
}

/* A LANDING load that cannot wait any longer (bound, session down): what
 * landed is committed, the rest fails. Frees the load. */
void kvp__load_landing_give_up(kvp_load_t *l)
{
    bool queued = l->verify_queued; /* waiting for the verifier: verified now */
    if (queued) {
        kvp_list_remove(&l->land_link);
        l->verify_queued = false;
    }
    /* else with digests being hashed every block is here: they are awaited */
    bool landing = l->verify == NULL && !queued;
    if (landing)
        load_all_landed(l);
    load_settle_done(l, l->done_status, landing);
}

void kvp__client_on_abort_ack(kvp_session_t *s, const kvp_msg_abort_t *m)
{
    kvp_load_t *l = kvp__load_find(s, m->round, m->request_id);
    if (l == NULL || l->phase == KVP_LOAD_LANDING)
        return; /* answered by FETCH_DONE already (a repeated ABORT's ack) */
    if (l->phase != KVP_LOAD_ABORTING) {
        /* We never asked: an ack for a load still being written is no proof
         * (freeing its slots now would let the WRITE land in reused memory). */
        kvp__session_fault(s, KVP_BYE_PROTOCOL, "ABORT_ACK for a round that was not aborted");
        return;
    }
    if (l->slots == KVP_LOAD_SLOTS_HELD) {
        kvp__load_release_quarantine(l, KVP_PROOF_ABORT_ACK);
        return;
    }
    if (l->slots == KVP_LOAD_SLOTS_REFUSED) { /* released at once earlier (AM_REFUSE) */
        kvp__load_set_phase(l, KVP_LOAD_SETTLED);
        kvp__load_free(l);
        return;
    }
    kvp__load_abandon_all(l, KVP_PROOF_ABORT_ACK);
    if (!l->published)
        kvp__load_publish(l, KVP_ERR_CANCELED, 0);
    kvp__load_set_phase(l, KVP_LOAD_SETTLED);
    kvp__load_free(l);
}

/* The outcome is unknown: publish routing failure now, quarantine the
 * destination slots (a WRITE may still land in them). */
void kvp__client_fail_unknown(kvp_load_t *l, kvp_status_t why)
{
    kvp_session_env_t *n = l->env;
    kvp_xport_t *x = n->xport;
    bool refusable = x->ops->inbound_refusable != NULL && x->ops->inbound_refusable(x, l->xpeer);
    /* Issue 29: on an AM path the slots are released below, before the
     * outcome, so a lent slot's block_status says "reusable now". */
    if (!l->published && !(refusable && l->slots == KVP_LOAD_SLOTS_FILLING))
        kvp__load_publish(l, why, 0);
    if (l->slots != KVP_LOAD_SLOTS_FILLING)
        return;
    if (KVP_MUTATED(KVP_MUT_RELEASE_QUARANTINE_AT_ONCE)) {
        /* The bug: claims AM_REFUSE on a path our handler cannot refuse. */
        kvp__load_abandon_all(l, KVP_PROOF_AM_REFUSE); /* test-only mutation: a false proof */
        if (!l->published)
            kvp__load_publish(l, why, 0);
        return;
    }
    if (refusable) {
        /* AM path: once our handler refuses the slots nothing can land in
         * them (no UCX-owned write into the region exists on this path):
         * released at once, no quarantine. */
        uint32_t k = 0;
        for (uint32_t i = 0; i < l->n; i++)
            k += l->blocks[i].reserved;
        for (uint32_t i = 0; i < l->n; i++)
            if (l->blocks[i].reserved && l->block_status != NULL)
                l->block_status[i] = why;
        kvp__load_abandon_all(l, KVP_PROOF_AM_REFUSE); /* refuse, then FILLING -> FREE */
        if (!l->published)
            kvp__load_publish(l, why, 0);
        kvp__load_set_slots(l, KVP_LOAD_SLOTS_REFUSED);
        n->st->am_refuse_releases += k;
        KVP_INFO(n->name, "peer %s: load %llu failed (%s): %u slots released at once (proof=%s)",
                 l->peer, (unsigned long long)l->op_id, kvp_status_str(why), k,
                 kvp__proof_str(KVP_PROOF_AM_REFUSE));
        return;
    }
    for (uint32_t i = 0; i < l->n; i++)
        if (l->blocks[i].reserved) {
            kvp__load_block_refuse(l, &l->blocks[i]);
            kvp_status_t st = kvp_store_quarantine(n->store, l->blocks[i].dst);
            KVP_ASSERT(st == KVP_OK); /* FILLING -> QUARANTINED: held, not released */
        }
    l->quarantined_ns = kvp__env_now(n);
    kvp__load_set_slots(l, KVP_LOAD_SLOTS_HELD);
    /* Issue 27: where the transport watches the source's process (same
     * host, direct shm), its exit will be proof (kvp__client_release_exited). */
    if (x->ops->exit_hold != NULL && !l->exit_held)
        l->exit_held = x->ops->exit_hold(x, l->xpeer);
}

uint32_t kvp__client_release_exited(kvp_session_env_t *e, kvp_xpeer_id_t xpeer)
{
    kvp_xport_t *x = e->xport;
    uint32_t slots = 0;
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &e->quarantined)
    {
        kvp_load_t *l = KVP_CONTAINER_OF(p, kvp_load_t, link);
        if (!l->exit_held || (xpeer != 0 && l->xpeer != xpeer) || !x->ops->exit_proven(x, l->xpeer))
            continue;
        uint32_t k = 0;
        for (uint32_t i = 0; i < l->n; i++)
            k += l->blocks[i].reserved;
        KVP_INFO(e->name, "peer %s: %u quarantined slots of load %llu released: its source "
                          "process exited (proof=%s)",
                 l->peer, k, (unsigned long long)l->op_id,
                 kvp__proof_str(KVP_PROOF_PROCESS_EXIT));
        slots += k;
        kvp__load_release_quarantine(l, KVP_PROOF_PROCESS_EXIT); /* no CPU write of it can land */
    }
    return slots;
}
