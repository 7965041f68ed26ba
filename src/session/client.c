/*
 * client.c -- the consumer role of a session (SPEC §5), its loads: fetches
 * into reserved FILLING slots (lookups: lookup.c), FETCH_DONE
 * verification and commit, abort with resend and escalation, and the
 * consumer half of teardown (quarantine).
 *
 * Load phases: (QUEUED) -> SENT -> (ABORTING) -> SETTLED. The outcome is
 * published exactly once (kvp__load_publish asserts it); releasing the
 * slots is a separate step that needs proof:
 *   FETCH_DONE          commit verified blocks, abandon the rest
 *   ABORT_ACK           abandon every block
 *   outcome unknown     quarantine; release on proof or at the hold cap
 *
 * Limits (SPEC §8), decided in kvp__client_fetch, each refusal counted and
 * logged (rate-limited, naming the limit and the peer):
 *   max_inflight_bytes_per_peer  a fetch that does not fit the session's
 *       budget waits on session->fetchq (FIFO, at most KVP_FETCHQ_MAX) with
 *       nothing reserved; it starts when budget frees, or fails with
 *       KVP_ERR_LIMIT after half the load timeout. A fetch larger than the
 *       whole budget, or one that finds the queue full, is refused at once.
 *   max_quarantined, max_quarantined_per_peer  a peer is *faulty* while
 *       slots quarantined by its loads (any incarnation under its peer id)
 *       are held. A faulty peer past its share (max_quarantined_per_peer of
 *       its own, or the store past max_quarantined) is still served -- a
 *       restarted, healthy source must not wait for the hold cap -- but
 *       only from FREE slots, never by evicting READY blocks; its fetch is
 *       refused with KVP_ERR_LIMIT only when the store has fewer FREE
 *       slots than the fetch needs (issue 27). Healthy peers are served.
 */
#include "session/session_int.h"

#include <stdio.h>
#include <string.h>

static void load_timer_cb(kvp_timer_t *t);

/* Load phases (kvp_load_phase_t in node.h):
 *
 *   kvp__client_fetch -> QUEUED --(budget; FETCH sent)--> SENT --(timeout,
 *   finish, cancel: ABORT sent)--> ABORTING
 *   SENT / ABORTING --(FETCH_DONE on an AM path, blocks not all landed
 *   yet)--> LANDING (kvp__client_on_fetch_done)
 *   QUEUED / SENT / ABORTING / LANDING --(FETCH_DONE, ABORT_ACK, nothing to
 *   fetch, session down; LANDING: every block landed, endpoint error, the
 *   landing bound)--> SETTLED
 *
 * SETTLED is final for the phase; whether the slots are free, committed or
 * quarantined awaiting proof is l->slots' (and the store's) to say:
 *
 *   FILLING --(outcome unknown, kvp__client_fail_unknown)--> HELD (QUARANTINED
 *   awaiting proof) or, on a path our AM handler can refuse, REFUSED
 *
 * load_check() states what the two halves allow together; the setters run
 * it in debug builds (SQLite's assert_pager_state). */
static const char *const load_phase_names[] = {"queued", "sent", "aborting", "landing",
                                                "settled"};
static const char *const load_slots_names[] = {"filling", "held", "refused"};

#ifndef NDEBUG
/* Whether the load's state is one the machine can be in (debug builds). */
static bool load_check(const kvp_load_t *l)
{
    KVP_ASSERT((unsigned)l->phase <= KVP_LOAD_SETTLED);
    KVP_ASSERT((unsigned)l->slots <= KVP_LOAD_SLOTS_REFUSED);
    /* queued: nothing reserved yet; landing: answered, slots still FILLING */
    if (l->phase == KVP_LOAD_QUEUED || l->phase == KVP_LOAD_LANDING)
        KVP_ASSERT(l->slots == KVP_LOAD_SLOTS_FILLING);
    KVP_ASSERT(l->phase != KVP_LOAD_LANDING || l->sess != NULL);
    /* HELD / REFUSED: the outcome (failure) was published first */
    KVP_ASSERT(l->slots == KVP_LOAD_SLOTS_FILLING || l->published);
    KVP_ASSERT(!l->exit_held || l->slots == KVP_LOAD_SLOTS_HELD);
    if (l->slots == KVP_LOAD_SLOTS_REFUSED && l->blocks != NULL)
        for (uint32_t i = 0; i < l->n; i++)
            KVP_ASSERT(!l->blocks[i].reserved); /* released at once */
    return true;
}

#define LOAD_CHECK(l) (void)load_check(l)
#else
#define LOAD_CHECK(l) (void)0
#endif

void kvp__load_set_slots(kvp_load_t *l, kvp_load_slots_t to)
{
    KVP_ASSERT(l->slots == KVP_LOAD_SLOTS_FILLING && to != KVP_LOAD_SLOTS_FILLING); /* once */
    KVP_TRACE(l->env->name, "peer %s load %llu: slots %s -> %s", l->peer,
              (unsigned long long)l->op_id, load_slots_names[l->slots], load_slots_names[to]);
    l->slots = to;
    LOAD_CHECK(l);
}

void kvp__load_set_phase(kvp_load_t *l, kvp_load_phase_t to)
{
    static const uint8_t legal[5] = {
        [KVP_LOAD_QUEUED] = 1u << KVP_LOAD_QUEUED, /* a new record starts QUEUED */
        [KVP_LOAD_SENT] = 1u << KVP_LOAD_QUEUED,
        [KVP_LOAD_ABORTING] = 1u << KVP_LOAD_SENT,
        [KVP_LOAD_LANDING] = (1u << KVP_LOAD_SENT) | (1u << KVP_LOAD_ABORTING),
        [KVP_LOAD_SETTLED] = (1u << KVP_LOAD_QUEUED) | (1u << KVP_LOAD_SENT) |
                             (1u << KVP_LOAD_ABORTING) | (1u << KVP_LOAD_LANDING),
    };
    KVP_ASSERT(legal[to] & (1u << l->phase));
    KVP_TRACE(l->env->name, "peer %s load %llu: %s -> %s", l->peer, (unsigned long long)l->op_id,
              load_phase_names[l->phase], load_phase_names[to]);
    l->phase = to;
    LOAD_CHECK(l);
}

kvp_status_t kvp__client_check_keys(const uint8_t *keys, const uint32_t *lens, uint32_t n)
{
    if (n == 0 || n > KVP_WIRE_LIST_MAX || keys == NULL || lens == NULL)
        return KVP_ERR_INVALID;
    for (uint32_t i = 0; i < n; i++)
        if (lens[i] == 0 || lens[i] > KVP_KEY_MAX)
            return KVP_ERR_INVALID;
    return KVP_OK;
}

kvp_creq_t *kvp__client_creq(kvp_session_t *s, uint64_t request_id, bool create)
{
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &s->creqs)
    {
        kvp_creq_t *c = KVP_CONTAINER_OF(p, kvp_creq_t, link);
        if (c->request_id == request_id)
            return c;
    }
    if (!create)
        return NULL;
    kvp_creq_t *c = kvp__calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->request_id = request_id;
    c->fetched = true; /* no lookup round to fetch against yet */
    kvp_list_insert_tail(&s->creqs, &c->link);
    return c;
}

/* ---------------------------------------------------------------- fetch */

/* Have the node start this session's queued fetches at the end of the
 * current call (up->schedule), never inside the caller's chain. */
static void fetchq_kick(kvp_session_t *s)
{
    if (!kvp_list_empty(&s->fetchq) && kvp__sess_open(s))
        s->env->up->schedule(s->env->up_arg, s);
}

static void load_free_blocks(kvp_load_t *l)
{
    kvp__free(l->blocks);
    l->blocks = NULL;
}

/* Issue 29: the slots a kvp_fetch_into load still held at its outcome are
 * the embedding's again (the load is freed only once every slot of it is
 * released): one KVP_EV_SLOTS_RELEASED for its op id. */
static void load_emit_released(kvp_load_t *l)
{
    for (uint32_t i = 0; i < l->n; i++)
        KVP_ASSERT(!l->blocks[i].reserved); /* freed only once every slot is back */
    if (!l->external || l->n_held == 0)
        return;
    kvp_event_t ev = {.type = KVP_EV_SLOTS_RELEASED, .op_id = l->op_id};
    ev.status = l->cap_released ? KVP_ERR_TIMEOUT : KVP_OK;
    ev.request_id = l->request_id;
    ev.n_keys = l->n_held;
    snprintf(ev.peer, sizeof(ev.peer), "%s", l->peer);
    kvp__env_emit(l->env, &ev);
}

void kvp__load_free(kvp_load_t *l)
{
    kvp_session_env_t *n = l->env;
    KVP_ASSERT(l->verify == NULL); /* settled first: its digests taken */
    if (l->blocks != NULL)
        load_emit_released(l);
    kvp_timer_stop(n->loop, &l->timer);
    if (kvp_list_linked(&l->link))
        kvp_list_remove(&l->link);
    if (kvp_list_linked(&l->land_link))
        kvp_list_remove(&l->land_link);
    if (l->sess != NULL && l->bytes > 0) {
        l->sess->bytes_inflight -= l->bytes;
        fetchq_kick(l->sess); /* budget freed: queued fetches may start */
    }
    if (l->exit_held) { /* the transport may close the source's pidfd now */
        kvp_xport_t *x = n->xport;
        x->ops->exit_drop(x, l->xpeer);
    }
    load_free_blocks(l);
    kvp__free(l);
}

void kvp__load_publish(kvp_load_t *l, kvp_status_t st, uint32_t n_ok)
{
    kvp_session_env_t *n = l->env;
    KVP_ASSERT(!l->published); /* I4: exactly one outcome */
    l->published = true;
    /* The caller's block_status is theirs again once the event is out: the
     * blocks still undecided take the load's outcome now, and nothing writes
     * the array after (a FETCH_DONE or ABORT_ACK settling the slots later). */
    for (uint32_t i = 0; i < l->n; i++) {
        if (!l->blocks[i].reserved)
            continue;
        /* Issue 29: a lent slot still held now comes back only with the
         * load's KVP_EV_SLOTS_RELEASED: its status says so. */
        bool held = l->external && !KVP_MUTATED(KVP_MUT_EXT_HELD_AS_REUSABLE); /* test-only */
        l->n_held += held;
        if (l->block_status != NULL && st != KVP_OK)
            l->block_status[i] = held ? KVP_ERR_BUSY : st;
    }
    l->block_status = NULL;
    if (st == KVP_OK)
        n->st->fetches_ok++;
    else if (st == KVP_ERR_CANCELED || st == KVP_ERR_TIMEOUT)
        n->st->fetches_aborted++;
    else
        n->st->fetches_failed++;
    kvp_event_t ev = {.type = KVP_EV_LOAD, .status = st, .op_id = l->op_id};
    ev.request_id = l->request_id;
    ev.n_keys = l->n;
    ev.n_ok = n_ok;
    ev.n_held = l->n_held;
    snprintf(ev.peer, sizeof(ev.peer), "%s", l->peer);
    kvp__env_emit(n, &ev);
}

/* Reserve one FILLING slot per key. Keys already READY or FILLING here are
 * not fetched (their block_status says so). */
static kvp_status_t load_reserve(kvp_load_t *l, uint32_t *to_fetch)
{
    kvp_session_env_t *n = l->env;
    *to_fetch = 0;
    if (l->external) { /* issue 29: lent at the call (kvp__client_fetch_into) */
        for (uint32_t i = 0; i < l->n; i++)
            *to_fetch += l->blocks[i].reserved;
        return KVP_OK;
    }
    for (uint32_t i = 0; i < l->n; i++) {
        kvp_load_block_t *b = &l->blocks[i];
        void *ptr;
        kvp_status_t st = kvp_store_reserve(n->store, b->key.data, b->key.len,
                                            KVP_STORE_RESERVE_REMOTE, &b->dst, &ptr);
        if (st == KVP_OK) {
            b->reserved = true;
            (*to_fetch)++;
        } else if (st != KVP_ERR_EXISTS && st != KVP_ERR_PENDING) {
            return st;
        }
        if (l->block_status)
            l->block_status[i] = st;
    }
    return KVP_OK;
}

/* AM paths (transport.h): our handler lands the source's blocks only into
 * slots expected at their generation. Expect before the FETCH leaves, so
 * nothing can arrive unexpected; refuse before a slot leaves FILLING, so
 * nothing lands after. Per block: O(1) each, no allocation. */
static void load_expect(kvp_load_t *l)
{
    kvp_xport_t *x = l->env->xport;
    if (x->ops->expect == NULL)
        return;
    for (uint32_t i = 0; i < l->n; i++) {
        kvp_load_block_t *b = &l->blocks[i];
        kvp_xslot_t xs = {b->dst.slot, b->dst.gen};
        if (b->reserved)
            KVP_ASSERT(x->ops->expect(x, l->xpeer, &xs, 1) == KVP_OK);
    }
}

void kvp__load_block_refuse(kvp_load_t *l, const kvp_load_block_t *b)
{
    kvp_xport_t *x = l->env->xport;
    kvp_xslot_t xs = {b->dst.slot, b->dst.gen};
    if (x->ops->refuse != NULL)
        x->ops->refuse(x, &xs, 1);
}

/* Every FILLING slot of the load -> FREE by `proof` (refused first on an AM
 * path, so nothing lands after). */
void kvp__load_abandon_all(kvp_load_t *l, kvp_proof_t proof)
{
    for (uint32_t i = 0; i < l->n; i++) {
        if (l->blocks[i].reserved) {
            kvp__load_block_refuse(l, &l->blocks[i]);
            kvp__release_dst(l->env, l->peer, l->blocks[i].dst, false, proof);
            l->blocks[i].reserved = false;
        }
    }
}

static kvp_status_t load_send_fetch(kvp_load_t *l, uint32_t to_fetch)
{
    kvp_fetch_item_t *items = kvp__calloc(to_fetch, sizeof(*items));
    if (items == NULL)
        return KVP_ERR_NOMEM;
    uint32_t k = 0;
    for (uint32_t i = 0; i < l->n; i++) {
        kvp_load_block_t *b = &l->blocks[i];
        if (b->reserved)
            items[k++] = (kvp_fetch_item_t){{b->key.data, b->key.len}, b->dst.slot, b->dst.gen};
    }
    load_expect(l);
    kvp_msg_t m = {.type = KVP_MSG_FETCH};
    m.u.fetch = (kvp_msg_fetch_t){l->request_id, l->round, l->flags, k, items};
    kvp_status_t st = kvp__session_send(l->sess, &m);
    kvp__free(items);
    return st;
}

/* ------------------------------------------------------------- limits */

/* Slots held QUARANTINED by loads from this peer: loads of a dead
 * incarnation wait on env->quarantined under the same peer id, loads of a
 * session on probation stay on its list. Only scanned at the limit. */
static uint64_t peer_quarantined_slots(const kvp_session_t *s)
{
    const kvp_list_t *lists[2] = {&s->env->quarantined, &s->loads};
    uint64_t slots = 0;
    for (int k = 0; k < 2; k++) {
        for (const kvp_list_t *p = lists[k]->next; p != lists[k]; p = p->next) {
            const kvp_load_t *l = KVP_CONTAINER_OF(p, kvp_load_t, link);
            if (l->slots != KVP_LOAD_SLOTS_HELD || strcmp(l->peer, s->peer_id) != 0)
                continue;
            for (uint32_t i = 0; i < l->n; i++)
                slots += l->blocks[i].reserved;
        }
    }
    return slots;
}

/* SPEC §8 max quarantined slots, per peer (issue 27): a faulty peer past
 * its share gets FREE slots only -- refused (KVP_ERR_LIMIT) when the store
 * has fewer FREE slots than the fetch's `nblocks`, i.e. when serving it
 * would evict READY blocks for a peer that already holds quarantine. While
 * FREE slots exist it is served at once (the restarted source), and its
 * reserves take FREE slots first (kvp_store_reserve). */
static kvp_status_t quarantine_check(kvp_session_t *s, uint32_t nblocks)
{
    kvp_session_env_t *n = s->env;
    kvp_store_stats_t ss;
    kvp_store_get_stats(n->store, &ss);
    uint64_t total = ss.slots[KVP_SLOT_QUARANTINED], mine;
    if (total == 0 || (mine = peer_quarantined_slots(s)) == 0)
        return KVP_OK;
    if (total < n->cfg->max_quarantined && mine < n->cfg->max_quarantined_per_peer)
        return KVP_OK;
    if (ss.slots[KVP_SLOT_FREE] >= nblocks)
        return KVP_OK;
    n->st->fetches_refused_quarantine++;
    KVP_LOG_RL(&s->rl_limit, kvp__env_now(n), KVP_LOG_WARN, n->name,
               "peer %s: fetch refused: %s reached (%llu quarantined by this peer, share %u; "
               "%llu of %u in the store) and %llu FREE slots for %u blocks",
               s->peer_id,
               mine >= n->cfg->max_quarantined_per_peer ? "max_quarantined_per_peer"
                                                        : "max_quarantined",
               (unsigned long long)mine, n->cfg->max_quarantined_per_peer,
               (unsigned long long)total, n->cfg->max_quarantined,
               (unsigned long long)ss.slots[KVP_SLOT_FREE], nblocks);
    return KVP_ERR_LIMIT;
}

static void inflight_refused(kvp_session_t *s, const char *why, uint64_t op_id)
{
    kvp_session_env_t *n = s->env;
    n->st->fetches_refused_inflight++;
    KVP_LOG_RL(&s->rl_limit, kvp__env_now(n), KVP_LOG_WARN, n->name,
               "peer %s: fetch %llu refused: max_inflight_bytes_per_peer (%llu B, %llu B in "
               "flight): %s",
               s->peer_id, (unsigned long long)op_id,
               (unsigned long long)n->cfg->max_inflight_bytes_per_peer,
               (unsigned long long)s->bytes_inflight, why);
}

/* ---------------------------------------------------------------- fetch */

static kvp_load_t *load_new(kvp_session_t *s, uint64_t op_id, uint64_t request_id,
                            const uint8_t *keys, const uint32_t *lens, uint32_t n, uint32_t flags,
                            int32_t *block_status)
{
    kvp_load_t *l = kvp__calloc(1, sizeof(*l));
    if (l == NULL || (l->blocks = kvp__calloc(n, sizeof(*l->blocks))) == NULL) {
        kvp__free(l);
        return NULL;
    }
    l->env = s->env;
    l->sess = s;
    l->xpeer = s->xpeer;
    l->op_id = op_id;
    l->request_id = request_id;
    l->flags = flags & (KVP_FETCH_WAIT_FOR_SUPPLY | KVP_FETCH_HINT);
    l->n = n;
    l->block_status = block_status;
    size_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        kvp__key_copy(&l->blocks[i].key, keys + off, lens[i]);
        off += lens[i];
    }
    snprintf(l->peer, sizeof(l->peer), "%s", s->peer_id);
    kvp_list_init(&l->link);
    kvp_list_init(&l->land_link);
    kvp_timer_init(&l->timer, "load", load_timer_cb, l);
    return l;
}

/* A fetch goes against the supply of the latest lookup of its request (if
 * not fetched yet), else a new round. Bound when the fetch is made, so a
 * fetch that queues keeps the round of the lookup it followed. */
static void load_bind_round(kvp_load_t *l)
{
    kvp_session_t *s = l->sess;
    kvp_creq_t *c = kvp__client_creq(s, l->request_id, true);
    if (c != NULL && !c->fetched &&
        !(l->flags & (KVP_FETCH_WAIT_FOR_SUPPLY | KVP_FETCH_HINT))) {
        l->round = c->round;
        c->fetched = true;
    } else {
        l->round = s->env->next_round++;
    }
}

/* Reserve the destinations, send FETCH, start the load timer. On KVP_OK the
 * load belongs to the session (or was settled at once and freed: every key
 * is here already). On error nothing is reserved or on the wire, the load
 * is on no list and holds no budget; the caller frees it. */
static kvp_status_t load_launch(kvp_load_t *l)
{
    kvp_session_t *s = l->sess;
    kvp_session_env_t *node = l->env;
    uint32_t to_fetch = 0;
    kvp_status_t st = load_reserve(l, &to_fetch);
    if (st != KVP_OK) {
        kvp__load_abandon_all(l, KVP_PROOF_NOT_SENT); /* no FETCH yet */
        return st;
    }
    if (l->round == 0)
        load_bind_round(l);
    l->started_ns = kvp__env_now(node);
    if (to_fetch == 0) { /* everything is here already */
        kvp__load_set_phase(l, KVP_LOAD_SETTLED);
        kvp__load_publish(l, KVP_OK, 0);
        kvp__load_free(l);
        return KVP_OK;
    }
    kvp_list_insert_tail(&s->loads, &l->link);
    l->bytes = (uint64_t)to_fetch * node->cfg->block_size;
    s->bytes_inflight += l->bytes;
    if ((st = load_send_fetch(l, to_fetch)) != KVP_OK) {
        /* nothing reached the wire: no WRITE can come */
        kvp__load_abandon_all(l, KVP_PROOF_NOT_SENT);
        kvp_list_remove(&l->link);
        s->bytes_inflight -= l->bytes;
        l->bytes = 0;
        return st;
    }
    kvp__load_set_phase(l, KVP_LOAD_SENT);
    kvp_timer_start(node->loop, &l->timer,
                    l->started_ns + (uint64_t)node->cfg->load_timeout_ms * KVP_NSEC_PER_MSEC);
    return KVP_OK;
}

/* How long a fetch may wait for budget: half the load timeout, so that a
 * fetch that starts late still ends (SENT gets the full load timeout)
 * within 1.5 load timeouts of kvp_fetch(). */
static uint64_t fetchq_wait_ns(const kvp_session_env_t *n)
{
    return (uint64_t)n->cfg->load_timeout_ms * KVP_NSEC_PER_MSEC / 2;
}

static void fetchq_push(kvp_load_t *l)
{
    kvp_session_t *s = l->sess;
    kvp_session_env_t *n = l->env;
    kvp__load_set_phase(l, KVP_LOAD_QUEUED);
    l->queued_ns = kvp__env_now(n);
    load_bind_round(l);
    kvp_list_insert_tail(&s->fetchq, &l->link);
    s->n_fetchq++;
    n->st->fetches_queued++;
    kvp_timer_start(n->loop, &l->timer, l->queued_ns + fetchq_wait_ns(n));
    KVP_DEBUG(n->name, "peer %s: fetch %llu queued: %llu B in flight (%u waiting)", s->peer_id,
              (unsigned long long)l->op_id, (unsigned long long)s->bytes_inflight, s->n_fetchq);
}

static void fetchq_take(kvp_load_t *l)
{
    KVP_ASSERT(l->phase == KVP_LOAD_QUEUED && l->sess->n_fetchq > 0);
    kvp_timer_stop(l->env->loop, &l->timer);
    kvp_list_remove(&l->link);
    l->sess->n_fetchq--;
}

/* Issue 29: a kvp_fetch_into load that never sent its FETCH gives its lent
 * slots back at once, each block failed with `why`. */
static void load_unlend(kvp_load_t *l, kvp_status_t why)
{
    for (uint32_t i = 0; i < l->n; i++)
        if (l->blocks[i].reserved && l->block_status != NULL)
            l->block_status[i] = why;
    kvp__load_abandon_all(l, KVP_PROOF_NOT_SENT); /* no FETCH left us: nothing writes them */
}

/* The queued fetch's one outcome; nothing was reserved. Fetches behind it
 * may fit now. */
static void fetchq_fail(kvp_load_t *l, kvp_status_t why)
{
    kvp_session_t *s = l->sess;
    fetchq_take(l);
    load_unlend(l, why);
    kvp__load_publish(l, why, 0);
    kvp__load_free(l);
    fetchq_kick(s);
}

void kvp__client_start_queued(kvp_session_t *s)
{
    kvp_session_env_t *n = s->env;
    while (!kvp_list_empty(&s->fetchq) && kvp__sess_open(s) && !s->probation) {
        kvp_load_t *l = KVP_CONTAINER_OF(s->fetchq.next, kvp_load_t, link);
        if (s->bytes_inflight + (uint64_t)l->n * n->cfg->block_size >
            n->cfg->max_inflight_bytes_per_peer)
            break; /* FIFO: nothing overtakes the head */
        fetchq_take(l);
        kvp_status_t st = quarantine_check(s, l->n);
        if (st == KVP_OK && (st = load_launch(l)) == KVP_OK)
            continue;
        load_unlend(l, st);
        kvp__load_publish(l, st, 0);
        kvp__load_free(l);
    }
}

void kvp__client_fail_queued(kvp_session_t *s, kvp_status_t why)
{
    while (!kvp_list_empty(&s->fetchq))
        fetchq_fail(KVP_CONTAINER_OF(s->fetchq.next, kvp_load_t, link), why);
}

/* Issue 29: lend the embedding's slots to the load, all or none. */
static kvp_status_t load_lend(kvp_load_t *l, const uint32_t *slots)
{
    kvp_session_env_t *n = l->env;
    l->external = true;
    for (uint32_t i = 0; i < l->n; i++) {
        kvp_load_block_t *b = &l->blocks[i];
        kvp_status_t st = kvp_store_lend(n->store, slots[i], b->key.data, b->key.len, &b->dst);
        if (st != KVP_OK) {
            kvp__load_abandon_all(l, KVP_PROOF_NOT_SENT); /* nothing was sent */
            KVP_DEBUG(n->name, "peer %s: fetch_into refused: slot %u (block %u): %s", l->peer,
                      slots[i], i, kvp_status_str(st));
            return KVP_ERR_INVALID;
        }
        b->reserved = true;
    }
    return KVP_OK;
}

static kvp_status_t client_fetch(kvp_session_t *s, uint64_t op_id, uint64_t request_id,
                                 const uint8_t *keys, const uint32_t *lens, uint32_t n,
                                 const uint32_t *slots, uint32_t flags, int32_t *block_status);

kvp_status_t kvp__client_fetch(kvp_session_t *s, uint64_t op_id, uint64_t request_id,
                               const uint8_t *keys, const uint32_t *lens, uint32_t n,
                               uint32_t flags, int32_t *block_status)
{
    return client_fetch(s, op_id, request_id, keys, lens, n, NULL, flags, block_status);
}

kvp_status_t kvp__client_fetch_into(kvp_session_t *s, uint64_t op_id, uint64_t request_id,
                                    const uint8_t *keys, const uint32_t *lens, uint32_t n,
                                    const uint32_t *slots, uint32_t flags, int32_t *block_status)
{
    if (slots == NULL)
        return KVP_ERR_INVALID;
    return client_fetch(s, op_id, request_id, keys, lens, n, slots, flags, block_status);
}

static kvp_status_t client_fetch(kvp_session_t *s, uint64_t op_id, uint64_t request_id,
                                 const uint8_t *keys, const uint32_t *lens, uint32_t n,
                                 const uint32_t *slots, uint32_t flags, int32_t *block_status)
{
    kvp_session_env_t *node = s->env;
    kvp_status_t st = kvp__client_check_keys(keys, lens, n);
    if (st != KVP_OK)
        return st;
    uint64_t bytes = (uint64_t)n * node->cfg->block_size;
    uint64_t budget = node->cfg->max_inflight_bytes_per_peer;
    if (bytes > budget) {
        inflight_refused(s, "larger than the whole budget", op_id);
        return KVP_ERR_LIMIT;
    }
    if ((st = quarantine_check(s, n)) != KVP_OK)
        return st;
    bool queue = !kvp_list_empty(&s->fetchq) || s->bytes_inflight + bytes > budget;
    if (queue && s->n_fetchq >= KVP_FETCHQ_MAX) {
        inflight_refused(s, "fetch queue full", op_id);
        return KVP_ERR_LIMIT;
    }
    kvp_load_t *l = load_new(s, op_id, request_id, keys, lens, n, flags, block_status);
    if (l == NULL)
        return KVP_ERR_NOMEM;
    if (slots != NULL && (st = load_lend(l, slots)) != KVP_OK) {
        kvp__load_free(l);
        return st;
    }
    if (queue) {
        fetchq_push(l);
        return KVP_OK;
    }
    if ((st = load_launch(l)) != KVP_OK)
        kvp__load_free(l);
    return st;
}

/* The load a FETCH_DONE / ABORT_ACK answers: same round AND request. */
kvp_load_t *kvp__load_find(kvp_session_t *s, uint64_t round, uint64_t request_id)
{
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &s->loads)
    {
        kvp_load_t *l = KVP_CONTAINER_OF(p, kvp_load_t, link);
        if (l->round == round && l->request_id == request_id)
            return l;
    }
    return NULL;
}

kvp_load_t *kvp__client_find_load(kvp_session_t *s, uint64_t op_id)
{
    kvp_list_t *p, *t;
    for (int k = 0; k < 2; k++) {
        kvp_list_t *head = k == 0 ? &s->loads : &s->fetchq;
        kvp_list_foreach_safe(p, t, head)
        {
            kvp_load_t *l = KVP_CONTAINER_OF(p, kvp_load_t, link);
            if (l->op_id == op_id)
                return l;
        }
    }
    return NULL;
}

/* ------------------------------------------------------------- abort */

static void send_abort(kvp_load_t *l)
{
    kvp_msg_t m = {.type = KVP_MSG_ABORT};
    m.u.abort.request_id = l->request_id;
    m.u.abort.round = l->round;
    kvp__session_send(l->sess, &m);
}

/* Abort a SENT load: the outcome (failure) is decided now; the slots stay
 * FILLING until ABORT_ACK or FETCH_DONE, re-sent every abort interval, and
 * the session is closed as a fault after the abort-ack timeout. */
void kvp__client_abort(kvp_load_t *l, kvp_status_t why)
{
    kvp_session_env_t *n = l->env;
    if (l->phase == KVP_LOAD_QUEUED) { /* never started: nothing to abort */
        fetchq_fail(l, why);
        return;
    }
    if (!l->published)
        kvp__load_publish(l, why, 0);
    if (l->phase != KVP_LOAD_SENT)
        return;
    kvp__load_set_phase(l, KVP_LOAD_ABORTING);
    l->abort_started_ns = kvp__env_now(n);
    send_abort(l);
    kvp_timer_start(n->loop, &l->timer,
                    l->abort_started_ns + (uint64_t)n->cfg->abort_resend_ms * KVP_NSEC_PER_MSEC);
}

static void load_timer_cb(kvp_timer_t *t)
{
    kvp_load_t *l = t->data;
    kvp_session_env_t *n = l->env;
    if (l->phase == KVP_LOAD_QUEUED) {
        inflight_refused(l->sess, "waited too long in the fetch queue", l->op_id);
        fetchq_fail(l, KVP_ERR_LIMIT);
        return;
    }
    if (l->phase == KVP_LOAD_LANDING) { /* the landing bound */
        kvp__load_landing_give_up(l);
        return;
    }
    if (l->phase == KVP_LOAD_SENT) {
        KVP_WARN(n->name, "peer %s: load %llu timed out: aborting", l->peer,
                 (unsigned long long)l->op_id);
        kvp__client_abort(l, KVP_ERR_TIMEOUT);
        return;
    }
    if (l->phase != KVP_LOAD_ABORTING || l->sess == NULL)
        return;
    uint64_t now = kvp__env_now(n);
    if (now - l->abort_started_ns >= (uint64_t)n->cfg->abort_ack_timeout_ms * KVP_NSEC_PER_MSEC) {
        kvp__session_fault(l->sess, KVP_BYE_ABORT_ACK_TIMEOUT, "no ABORT_ACK in time");
        return;
    }
    send_abort(l); /* F5: re-send until ABORT_ACK or FETCH_DONE */
    uint64_t next = now + (uint64_t)n->cfg->abort_resend_ms * KVP_NSEC_PER_MSEC;
    uint64_t limit = l->abort_started_ns + (uint64_t)n->cfg->abort_ack_timeout_ms * KVP_NSEC_PER_MSEC;
    kvp_timer_start(n->loop, &l->timer, KVP_MIN(next, limit));
}

/* The engine finished the request locally: its loads fail (exactly once) and
 * are aborted; the source is told with a terminal empty FETCH. */
void kvp__client_finish_request(kvp_session_t *s, uint64_t request_id)
{
    kvp_list_t *p, *t;
    bool any = false;
    kvp_list_foreach_safe(p, t, &s->fetchq)
    {
        kvp_load_t *l = KVP_CONTAINER_OF(p, kvp_load_t, link);
        if (l->request_id == request_id)
            fetchq_fail(l, KVP_ERR_CANCELED); /* F7: one failure outcome */
    }
    kvp_list_foreach_safe(p, t, &s->loads)
    {
        kvp_load_t *l = KVP_CONTAINER_OF(p, kvp_load_t, link);
        if (l->request_id != request_id)
            continue;
        any = true;
        kvp__client_abort(l, KVP_ERR_CANCELED);
    }
    kvp_creq_t *c = kvp__client_creq(s, request_id, false);
    if (c != NULL || any) {
        kvp_msg_t m = {.type = KVP_MSG_FETCH};
        m.u.fetch = (kvp_msg_fetch_t){request_id, s->env->next_round++, 0, 0, NULL};
        kvp__session_send(s, &m);
    }
    if (c != NULL) {
        kvp_list_remove(&c->link);
        kvp__free(c);
    }
}

/* Session teardown, consumer side (SPEC §7.4): every load whose outcome is
 * unknown fails for routing and its slots are quarantined; the loads move
 * to env->quarantined to wait for proof or the hold cap. */
void kvp__client_teardown(kvp_session_t *s, bool fault, kvp_session_close_t *out)
{
    kvp_session_env_t *n = s->env;
    kvp_list_t *p, *t;
    (void)fault;
    kvp__client_fail_queued(s, KVP_ERR_UNREACHABLE); /* nothing reserved: nothing to hold */
    kvp_list_foreach_safe(p, t, &s->loads)
    {
        kvp_load_t *l = KVP_CONTAINER_OF(p, kvp_load_t, link);
        if (l->phase == KVP_LOAD_LANDING) /* answered: what landed counts, the rest fails */
            kvp__load_landing_give_up(l);
    }
    kvp__client_fail_lookups(s, KVP_ERR_UNREACHABLE);
    kvp_list_foreach_safe(p, t, &s->loads)
    {
        kvp_load_t *l = KVP_CONTAINER_OF(p, kvp_load_t, link);
        uint32_t k = 0;
        for (uint32_t i = 0; i < l->n; i++)
            k += l->blocks[i].reserved;
        out->loads_failed += !l->published;
        kvp_timer_stop(n->loop, &l->timer);
        kvp__client_fail_unknown(l, KVP_ERR_UNREACHABLE);
        kvp_list_remove(&l->link);
        s->bytes_inflight -= l->bytes;
        l->bytes = 0;
        l->sess = NULL;
        kvp__load_set_phase(l, KVP_LOAD_SETTLED);
        if (l->slots == KVP_LOAD_SLOTS_REFUSED) { /* nothing held: no proof to wait for */
            out->slots_refused += k; /* 0 if refused before (probation) */
            kvp__load_free(l);
            continue;
        }
        out->loads_quarantined++;
        out->slots_quarantined += k;
        kvp_list_insert_tail(&n->quarantined, &l->link);
    }
    while (!kvp_list_empty(&s->creqs)) {
        kvp_creq_t *c = KVP_CONTAINER_OF(s->creqs.next, kvp_creq_t, link);
        kvp_list_remove(&c->link);
        kvp__free(c);
    }
}
