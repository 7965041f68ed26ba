/*
 * server.c -- the source role of a session (SPEC §5): its rounds (LOOKUP is answered in
 * server_lookup.c: HIT pins supply for the round, within the peer's budgets of budget.c), match
 * FETCH demand against the round's supply, post the transfer, send FETCH_DONE only after the
 * transport proved remote completion, handle ABORT (cancel in WAIT mode; ABORT_ACK only once the
 * transfer is terminal), park WAIT_FOR_SUPPLY demand.
 *
 * Round phases (one per kvp_sround_t; set only through kvp__sround_set_phase):
 *
 *   (new) SUPPLIED --LOOKUP with FILLING keys--> LOOKUP_PENDING
 *   LOOKUP_PENDING --(keys committed / pending deadline)--> SUPPLIED
 *   SUPPLIED --FETCH all supplied--> TRANSFERRING --poll terminal--> FINISHED
 *   SUPPLIED|(new) --FETCH WAIT_FOR_SUPPLY, keys missing--> PARKED
 *   PARKED --keys committed--> TRANSFERRING; --timeout/request finished--> FINISHED
 *   TRANSFERRING --ABORT, still running--> ABORTING --terminal--> FINISHED
 *
 * Pins: supply[i].pinned means this round holds one pin on supply[i].ref. When the transfer is
 * posted the pins of the demanded supply move to the kvp_xfer_t (the store job) and are dropped
 * only when the transport hands the transfer back as terminal, or at the hold cap.
 */
#include "session/session_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const sr_phase_names[] = {"LOOKUP_PENDING", "SUPPLIED", "PARKED",
                                             "TRANSFERRING", "ABORTING", "FINISHED"};

void kvp__sround_set_phase(kvp_sround_t *r, kvp_sround_phase_t to)
{
    static const uint8_t legal[6] = {
        [KVP_SR_LOOKUP_PENDING] = 1u << KVP_SR_SUPPLIED, /* a new round with FILLING keys */
        [KVP_SR_SUPPLIED] = 1u << KVP_SR_LOOKUP_PENDING, /* a new round starts SUPPLIED */
        [KVP_SR_PARKED] = 1u << KVP_SR_SUPPLIED,
        [KVP_SR_TRANSFERRING] = (1u << KVP_SR_SUPPLIED) | (1u << KVP_SR_PARKED),
        [KVP_SR_ABORTING] = 1u << KVP_SR_TRANSFERRING,
        [KVP_SR_FINISHED] = 0x3f & ~(1u << KVP_SR_FINISHED),
    };
    KVP_ASSERT(legal[to] & (1u << r->phase));
    KVP_TRACE(r->sess->env->name, "peer %s round %llu: %s -> %s", r->sess->peer_id,
              (unsigned long long)r->round, sr_phase_names[r->phase], sr_phase_names[to]);
    kvp__server_parked_count(r, to);
    r->phase = to;
    if (to == KVP_SR_FINISHED) { /* kept only to replay its answer: off the live list */
        KVP_ASSERT(r->sess->n_rounds > 0);
        r->sess->n_rounds--;
        kvp_list_remove(&r->link);
        kvp_list_insert_tail(&r->sess->srounds_done, &r->link);
    }
}

static kvp_sround_t *sround_find_in(kvp_list_t *head, uint64_t round)
{
    for (kvp_list_t *p = head->prev; p != head; p = p->prev) { /* newest first */
        kvp_sround_t *r = KVP_CONTAINER_OF(p, kvp_sround_t, link);
        if (r->round == round)
            return r;
    }
    return NULL;
}

/* A source keeps FINISHED rounds for abort_ack_timeout + abort_resend (12 s
 * by default) to replay ABORT_ACK / FETCH_DONE; at thousands of fetches per
 * second a single list of them made every LOOKUP and FETCH walk tens of
 * thousands of cold records (measured by bench/e2e). A token above every one
 * seen needs no walk; live rounds are searched before finished ones. */
kvp_sround_t *kvp__sround_find(kvp_session_t *s, uint64_t round)
{
    kvp_sround_t *r;
    if (!s->sround_seen || round > s->sround_max)
        return NULL;
    if ((r = sround_find_in(&s->srounds, round)) != NULL)
        return r;
    return sround_find_in(&s->srounds_done, round);
}

static bool key_eq(const kvp_key_buf_t *a, const uint8_t *data, uint32_t len)
{
    return a->len == len && memcmp(a->data, data, len) == 0;
}

static void key_copy(kvp_key_buf_t *dst, const uint8_t *data, uint32_t len)
{
    dst->len = (uint8_t)len;
    memcpy(dst->data, data, len);
}

static void sround_timer_cb(kvp_timer_t *t);

/* A new live round; its supply array grows with hits (supply_push) unless
 * cap_supply (fetch-time supply: one per demand) is given. */
kvp_sround_t *kvp__sround_new(kvp_session_t *s, uint64_t request_id, uint64_t round,
                                uint32_t cap_supply)
{
    kvp_sround_t *r = kvp__calloc(1, sizeof(*r));
    if (r == NULL)
        return NULL;
    if (cap_supply > 0 && (r->supply = kvp__calloc(cap_supply, sizeof(*r->supply))) == NULL) {
        kvp__free(r);
        return NULL;
    }
    r->cap_supply = cap_supply;
    r->sess = s;
    r->born_ns = kvp__env_now(s->env);
    s->n_rounds++;
    kvp__budget_account(r, false);
    r->request_id = request_id;
    r->round = round;
    kvp__sround_set_phase(r, KVP_SR_SUPPLIED); /* from the zeroed LOOKUP_PENDING */
    kvp_list_init(&r->wait_link);
    kvp_timer_init(&r->timer, "round", sround_timer_cb, r);
    kvp_list_insert_tail(&s->srounds, &r->link);
    if (!s->sround_seen || round > s->sround_max)
        s->sround_max = round;
    s->sround_seen = true;
    return r;
}

/* Drop every pin this round still holds on supply (not those moved to a
 * transfer). */
static void sround_unpin_supply(kvp_sround_t *r)
{
    for (uint32_t i = 0; i < r->n_supply; i++) {
        if (r->supply[i].pinned) {
            /* A supply pin: no transfer reads it (those moved to a kvp_xfer_t). */
            kvp__release_supply(r->sess->env, r->sess->peer_id, r->supply[i].ref,
                                KVP_SUPPLY_ROUND_END);
            kvp__budget_pin_drop(r, &r->supply[i]);
        }
    }
}

void kvp__sround_free(kvp_sround_t *r)
{
    kvp_session_env_t *n = r->sess->env;
    KVP_ASSERT(r->xfer == NULL);
    kvp__server_wanted_forget(r); /* issue 29: its WANTED op, if any */
    kvp__server_parked_count(r, KVP_SR_FINISHED);
    sround_unpin_supply(r);
    kvp_timer_stop(n->loop, &r->timer);
    if (kvp_list_linked(&r->wait_link))
        kvp_list_remove(&r->wait_link);
    kvp_list_remove(&r->link);
    if (r->phase != KVP_SR_FINISHED) {
        KVP_ASSERT(r->sess->n_rounds > 0);
        r->sess->n_rounds--;
    }
    kvp__budget_account(r, true);
    kvp__free(r->supply);
    kvp__free(r->demand);
    kvp__free(r->digests);
    kvp__free(r->block_ok);
    kvp__free(r);
}

/* ------------------------------------------------------------- replies */

/* Finish a round: FETCH_DONE (status, digests) or ABORT_ACK; the round is kept
 * for a while so a repeated ABORT gets the same answer (F5). */
static void sround_finish(kvp_sround_t *r, bool ack, kvp_status_t status)
{
    kvp_session_t *s = r->sess;
    kvp_session_env_t *n = s->env;
    kvp_msg_t m = {0};
    sround_unpin_supply(r);
    if (kvp_list_linked(&r->wait_link))
        kvp_list_remove(&r->wait_link);
    if (ack) {
        m.type = KVP_MSG_ABORT_ACK;
        m.u.abort.request_id = r->request_id;
        m.u.abort.round = r->round;
        r->sent_ack = true;
    } else {
        kvp_fetch_block_t *blocks = kvp__calloc(r->n_demand ? r->n_demand : 1, sizeof(*blocks));
        if (blocks == NULL) {
            kvp__session_fault(s, KVP_BYE_PROTOCOL, "out of memory sending FETCH_DONE");
            return;
        }
        for (uint32_t i = 0; i < r->n_demand; i++) {
            blocks[i].ok = status == KVP_OK && r->block_ok && r->block_ok[i];
            if (r->digests)
                blocks[i].digest = r->digests[i];
        }
        m.type = KVP_MSG_FETCH_DONE;
        m.u.fetch_done.request_id = r->request_id;
        m.u.fetch_done.round = r->round;
        m.u.fetch_done.status = status;
        m.u.fetch_done.n = r->n_demand;
        m.u.fetch_done.blocks = blocks;
        r->final_status = status;
        r->sent_done = true;
        kvp__session_send(s, &m);
        kvp__free(blocks);
    }
    if (ack)
        kvp__session_send(s, &m);
    if (r->phase != KVP_SR_FINISHED)
        kvp__sround_set_phase(r, KVP_SR_FINISHED);
    /* Kept only to replay the answer (n_demand, digests, block_ok): its
     * supply and demand go now, so a finished round costs the peer's memory
     * budget little. */
    kvp__free(r->supply);
    kvp__free(r->demand);
    r->supply = NULL;
    r->demand = NULL;
    r->n_supply = r->cap_supply = 0;
    kvp__budget_account(r, false);
    /* Keep the answer for replays until the consumer's abort machinery is
     * surely over. */
    kvp_timer_start(n->loop, &r->timer,
                    kvp__env_now(n) +
                        ((uint64_t)n->cfg->abort_ack_timeout_ms + n->cfg->abort_resend_ms) *
                            KVP_NSEC_PER_MSEC);
}

/* Free FINISHED rounds of the peer (oldest first; they are kept only to
 * replay an answer) until `extra` bytes fit its round memory. */
static void rounds_done_trim(kvp_session_t *s, uint64_t extra)
{
    while (!kvp__budget_round_fits(s, extra, false) && !kvp_list_empty(&s->srounds_done))
        kvp__sround_free(KVP_CONTAINER_OF(s->srounds_done.next, kvp_sround_t, link));
}

/* Whether a new round with `extra` bytes beyond its record fits the peer's
 * budgets (finished rounds give way first). */
bool kvp__server_round_admit(kvp_session_t *s, uint64_t extra)
{
    rounds_done_trim(s, sizeof(kvp_sround_t) + extra);
    return kvp__budget_round_fits(s, sizeof(kvp_sround_t) + extra, true);
}

/* ---------------------------------------------------------------- FETCH */

static void sround_post(kvp_sround_t *r);

static void fetch_fail_now(kvp_session_t *s, const kvp_msg_fetch_t *m, kvp_status_t st)
{
    kvp_sround_t *r = kvp__sround_find(s, m->round);
    if (r == NULL) { /* a record to replay the answer: finished ones give way */
        rounds_done_trim(s, sizeof(kvp_sround_t));
        r = kvp__sround_new(s, m->request_id, m->round, 0);
    }
    if (r == NULL) {
        kvp__session_fault(s, KVP_BYE_PROTOCOL, "out of memory on FETCH");
        return;
    }
    /* FETCH_DONE answers every item not ok: it needs the count, no demand
     * record (a failed FETCH keeps only the round record for replays). */
    if (r->demand == NULL)
        r->n_demand = m->n;
    sround_finish(r, false, st);
}

/* Find key in the round's supply, starting at the cursor (consumers fetch in
 * lookup order, so this is linear in the common case). */
static int32_t supply_find(kvp_sround_t *r, const kvp_key_t *k, uint32_t *cursor)
{
    for (uint32_t j = 0; j < r->n_supply; j++) {
        uint32_t i = (*cursor + j) % r->n_supply;
        if (r->supply[i].pinned && key_eq(&r->supply[i].key, k->data, k->len)) {
            *cursor = i + 1;
            return (int32_t)i;
        }
    }
    return -1;
}

/* Try to supply demand d from the store now (WAIT_FOR_SUPPLY). */
static bool supply_from_store(kvp_sround_t *r, kvp_demand_t *d)
{
    kvp_session_env_t *n = r->sess->env;
    kvp_slot_ref_t ref;
    if (r->n_supply == r->cap_supply)
        return false;
    if (kvp_store_lookup(n->store, d->key.data, d->key.len, &ref, NULL, NULL) != KVP_OK)
        return false;
    kvp_supply_t *sp = &r->supply[r->n_supply];
    memset(sp, 0, sizeof(*sp));
    if (!kvp__budget_pin_take(r, sp)) { /* the peer's supply-pin budget: stays missing */
        kvp__release_supply(n, r->sess->peer_id, ref, KVP_SUPPLY_REFUSED);
        return false;
    }
    sp->key = d->key;
    sp->ref = ref;
    sp->idx = r->n_keys;
    d->supply = (int32_t)r->n_supply++;
    return true;
}

static kvp_status_t sround_take_demand(kvp_sround_t *r, const kvp_msg_fetch_t *m,
                                       uint32_t *missing)
{
    bool from_store = (r->flags & (KVP_FETCH_WAIT_FOR_SUPPLY | KVP_FETCH_HINT)) != 0;
    uint64_t grow = from_store && r->cap_supply < r->n_supply + m->n
                        ? (uint64_t)(r->n_supply + m->n - r->cap_supply) * sizeof(kvp_supply_t)
                        : 0;
    uint64_t need = grow + (uint64_t)m->n * (sizeof(kvp_demand_t) + sizeof(kvp_digest_t) + 1);
    rounds_done_trim(r->sess, need);
    if (!kvp__budget_round_fits(r->sess, need, false))
        return KVP_ERR_LIMIT; /* the peer's round memory (counted by the caller) */
    r->demand = kvp__calloc(m->n, sizeof(*r->demand));
    if (r->demand == NULL)
        return KVP_ERR_NOMEM;
    if (grow > 0) {
        kvp_supply_t *ns = kvp__realloc(r->supply, (r->n_supply + m->n) * sizeof(*ns));
        if (ns == NULL)
            return KVP_ERR_NOMEM;
        r->supply = ns;
        r->cap_supply = r->n_supply + m->n;
    }
    r->n_demand = m->n;
    kvp__budget_account(r, false);
    uint32_t cursor = 0;
    *missing = 0;
    for (uint32_t i = 0; i < m->n; i++) {
        kvp_demand_t *d = &r->demand[i];
        key_copy(&d->key, m->items[i].key.data, m->items[i].key.len);
        d->dst_slot = m->items[i].dst_slot;
        d->dst_gen = m->items[i].dst_gen;
        d->supply = r->n_supply ? supply_find(r, &m->items[i].key, &cursor) : -1;
        if (d->supply >= 0) {
            /* Claim it: the same supply entry cannot feed two demands. */
            continue;
        }
        if (from_store && supply_from_store(r, d)) /* parked demand, or a router's hint */
            continue;
        (*missing)++;
    }
    return KVP_OK;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* A FETCH naming one destination slot twice asks for two writes into one
 * slot: no consumer of ours does that, and the outcome of racing puts into
 * one slot is undefined. KVP_OK if every destination is distinct. */
static kvp_status_t fetch_dsts_distinct(const kvp_msg_fetch_t *m)
{
    if (m->n < 2)
        return KVP_OK;
    uint32_t *d = kvp__malloc((size_t)m->n * sizeof(*d));
    if (d == NULL)
        return KVP_ERR_NOMEM;
    for (uint32_t i = 0; i < m->n; i++)
        d[i] = m->items[i].dst_slot;
    qsort(d, m->n, sizeof(*d), cmp_u32);
    kvp_status_t st = KVP_OK;
    for (uint32_t i = 1; i < m->n && st == KVP_OK; i++)
        if (d[i] == d[i - 1])
            st = KVP_ERR_PROTO;
    kvp__free(d);
    return st;
}

/* A FETCH with no LOOKUP before it (WAIT_FOR_SUPPLY, a router's HINT)
 * makes us look each of its keys up in the store: charged to the peer's
 * LOOKUP key rate like a LOOKUP's keys (issue 27: before, such FETCHes
 * looked keys up past the rate, bounded only by round memory). All or
 * nothing: a FETCH past the rate is answered LIMIT at once, none of its
 * keys looked up. False when refused. */
static bool fetch_keys_charged(kvp_session_t *s, const kvp_msg_fetch_t *m)
{
    uint32_t granted = kvp__budget_lookup_keys(s, m->n);
    if (granted == m->n)
        return true;
    kvp__budget_lookup_refund(s, granted);
    fetch_fail_now(s, m, KVP_ERR_LIMIT);
    return false;
}

/* The round a FETCH goes against: the one its lookup supplied, or a new
 * one (WAIT_FOR_SUPPLY, HINT) if the budgets allow. NULL: answered
 * (refused) or faulted already. */
static kvp_sround_t *fetch_round(kvp_session_t *s, const kvp_msg_fetch_t *m, kvp_sround_t *r)
{
    kvp_session_env_t *n = s->env;
    if (n->n_retained >= n->cfg->max_retained) {
        n->st->fetches_refused_retained++;
        KVP_LOG_RL(&s->rl_limit, kvp__env_now(n), KVP_LOG_WARN, n->name,
                   "peer %s: FETCH refused: max_retained reached (%u retained transfers)",
                   s->peer_id, n->n_retained);
        fetch_fail_now(s, m, KVP_ERR_LIMIT);
        return NULL;
    }
    bool wait = (m->flags & KVP_FETCH_WAIT_FOR_SUPPLY) != 0;
    bool hint = (m->flags & KVP_FETCH_HINT) != 0 && !wait;
    if (r == NULL && !wait && !hint) { /* no supply: never looked up, or expired (F9, F10) */
        fetch_fail_now(s, m, KVP_ERR_NOT_FOUND);
        return NULL;
    }
    if (r != NULL)
        return r;
    if (!fetch_keys_charged(s, m))
        return NULL; /* refused at the key rate: answered LIMIT */
    if (!kvp__server_round_admit(s, (uint64_t)m->n * sizeof(kvp_supply_t))) {
        kvp__budget_round_refused(s, "FETCH");
        fetch_fail_now(s, m, KVP_ERR_LIMIT);
        return NULL;
    }
    if ((r = kvp__sround_new(s, m->request_id, m->round, m->n)) == NULL)
        kvp__session_fault(s, KVP_BYE_PROTOCOL, "out of memory on FETCH");
    return r;
}

/* The demand is taken, `missing` of it not in the store: post, park or
 * answer at once. */
static void fetch_start(kvp_sround_t *r, uint32_t missing, bool wait, bool hint)
{
    kvp_session_env_t *n = r->sess->env;
    if (missing > 0 && hint)
        n->st->fetch_hints_stale++; /* the router's map was (partly) out of date: quick misses */
    if (missing > 0 && !wait && missing == r->n_demand) {
        /* F9: at once, never a silent wait; LIMIT if a budget refused it */
        sround_finish(r, false, r->limited ? KVP_ERR_LIMIT : KVP_ERR_NOT_FOUND);
        return;
    }
    if (missing > 0 && !wait) { /* F9, partly supplied: send what we have, at once; */
        sround_post(r);         /* FETCH_DONE marks the rest not ok (NOT_FOUND there) */
        return;
    }
    if (missing > 0) {
        kvp__sround_set_phase(r, KVP_SR_PARKED);
        kvp_list_insert_tail(&n->waiting, &r->wait_link);
        kvp_timer_start(n->loop, &r->timer,
                        kvp__env_now(n) + (uint64_t)n->cfg->parked_demand_ms * KVP_NSEC_PER_MSEC);
        return;
    }
    sround_post(r);
}

void kvp__server_on_fetch(kvp_session_t *s, const kvp_msg_fetch_t *m)
{
    if (m->n == 0) { /* terminal: the consumer finished the request */
        kvp__server_finish_request(s, m->request_id);
        return;
    }
    /* the requester still works on it: other rounds live on */
    kvp__server_lease_renew(s, m->request_id);
    kvp_status_t dst = fetch_dsts_distinct(m);
    if (dst != KVP_OK) {
        kvp__session_fault(s, KVP_BYE_PROTOCOL, dst == KVP_ERR_NOMEM
                                                    ? "out of memory on FETCH"
                                                    : "FETCH names one destination slot twice");
        return;
    }
    kvp_sround_t *r = kvp__sround_find(s, m->round);
    if (r != NULL && r->phase != KVP_SR_SUPPLIED) {
        if (r->phase == KVP_SR_FINISHED && r->sent_done)
            return; /* a duplicate of a FETCH we already answered */
        kvp__session_fault(s, KVP_BYE_PROTOCOL, "second FETCH for a round");
        return;
    }
    if ((r = fetch_round(s, m, r)) == NULL)
        return;
    r->flags = m->flags;
    uint32_t missing = 0;
    kvp_status_t tk = sround_take_demand(r, m, &missing);
    if (tk != KVP_OK) {
        if (tk == KVP_ERR_LIMIT)
            kvp__budget_round_refused(s, "FETCH");
        if (r->demand == NULL)
            r->n_demand = m->n; /* FETCH_DONE answers every item, not ok */
        sround_finish(r, false, tk);
        return;
    }
    bool wait = (m->flags & KVP_FETCH_WAIT_FOR_SUPPLY) != 0;
    fetch_start(r, missing, wait, (m->flags & KVP_FETCH_HINT) != 0 && !wait);
}

/* Move the demanded supply's pins into a transfer record and post it. */
static kvp_xfer_t *xfer_new(kvp_sround_t *r)
{
    kvp_xfer_t *x = kvp__calloc(1, sizeof(*x));
    if (x == NULL)
        return NULL;
    x->src = kvp__calloc(r->n_demand, sizeof(*x->src));
    r->digests = kvp__calloc(r->n_demand, sizeof(*r->digests));
    r->block_ok = kvp__calloc(r->n_demand, 1);
    if (x->src == NULL || r->digests == NULL || r->block_ok == NULL) {
        kvp__free(x->src);
        kvp__free(x);
        return NULL;
    }
    x->n = r->n_demand;
    x->round = r;
    kvp__budget_account(r, false); /* digests, block_ok */
    snprintf(x->peer, sizeof(x->peer), "%s", r->sess->peer_id);
    kvp_list_init(&x->link);
    return x;
}

/* Every block of the transfer holds one pin on its source slot. The first
 * demand of a supply entry takes over the round's pin; a key demanded again
 * needs a pin of its own, taken BEFORE anything is posted, so a refused pin
 * (the pin bound) fails the round cleanly instead of asserting. On error the
 * pins taken so far are in x->src[0..x->n). */
static kvp_status_t xfer_take_pins(kvp_sround_t *r, kvp_xfer_t *x)
{
    kvp_store_t *st = r->sess->env->store;
    x->n = 0;
    for (uint32_t i = 0; i < r->n_demand; i++) {
        if (r->demand[i].supply < 0)
            continue; /* not supplied (F9): reported not ok in FETCH_DONE */
        kvp_supply_t *sp = &r->supply[r->demand[i].supply];
        if (sp->pinned) {
            kvp__budget_pin_drop(r, sp); /* the pin moves to the transfer */
        } else {
            kvp_status_t rc = kvp_store_pin(st, sp->ref);
            if (rc != KVP_OK)
                return rc;
        }
        x->src[x->n++] = sp->ref;
    }
    return KVP_OK;
}

/* Unpin (by `proof`) and free a transfer that is on no list (never posted,
 * or unlinked). */
static void xfer_drop(kvp_session_env_t *n, kvp_xfer_t *x, kvp_proof_t proof)
{
    kvp__release_src(n, x, proof);
    kvp__free(x->src);
    kvp__free(x);
}

static void sround_post(kvp_sround_t *r)
{
    kvp_session_t *s = r->sess;
    kvp_session_env_t *n = s->env;
    kvp_xfer_t *x = xfer_new(r);
    kvp_xfer_block_t *blocks = kvp__calloc(r->n_demand, sizeof(*blocks));
    kvp_status_t st = x && blocks ? xfer_take_pins(r, x) : KVP_ERR_NOMEM;
    if (st == KVP_OK) {
        for (uint32_t i = 0, k = 0; i < r->n_demand; i++) {
            if (r->demand[i].supply < 0)
                continue; /* x->src holds the supplied demands, in order */
            kvp_slot_info_t info;
            kvp_store_slot_info(n->store, x->src[k].slot, &info);
            r->digests[i] = info.digest;
            blocks[k] = (kvp_xfer_block_t){x->src[k].slot, x->src[k].gen, r->demand[i].dst_slot,
                                           r->demand[i].dst_gen};
            k++;
        }
        st = n->xport->ops->write(n->xport, s->xpeer, blocks, x->n, &x->id);
        if (st != KVP_OK) /* nothing was posted: fail cleanly (F14) */
            KVP_WARN(n->name, "peer %s: transfer submit failed: %s", s->peer_id,
                     kvp_status_str(st));
    }
    kvp__free(blocks);
    if (st != KVP_OK) {
        if (x != NULL)
            xfer_drop(n, x, KVP_PROOF_NOT_SENT); /* write() refused it: nothing reads */
        sround_finish(r, false, st);
        return;
    }
    x->posted_ns = kvp__env_now(n);
    r->xfer = x;
    kvp_list_insert_tail(&s->xfers, &x->link);
    s->xfers_inflight++;
    kvp__session_mark_active(s);
    kvp_timer_stop(n->loop, &r->timer);
    kvp__sround_set_phase(r, KVP_SR_TRANSFERRING);
}

/* ---------------------------------------------------------- completions */

void kvp__xfer_release(kvp_session_env_t *n, kvp_xfer_t *x, kvp_proof_t proof)
{
    kvp_list_remove(&x->link);
    xfer_drop(n, x, proof);
}

void kvp__xfer_release_retained(kvp_session_env_t *n, kvp_xfer_t *x, kvp_proof_t proof)
{
    KVP_ASSERT(x->round == NULL && n->n_retained > 0); /* on n->retained (server teardown) */
    n->n_retained--;
    kvp__xfer_release(n, x, proof);
}

void kvp__server_on_xfer_done(kvp_session_t *s, kvp_xfer_id_t id, kvp_status_t st)
{
    kvp_session_env_t *n = s->env;
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &s->xfers)
    {
        kvp_xfer_t *x = KVP_CONTAINER_OF(p, kvp_xfer_t, link);
        if (x->id != id)
            continue;
        kvp_sround_t *r = x->round;
        uint64_t now = kvp__env_now(n);
        s->xfers_inflight--;
        if (st == KVP_OK) {
            n->st->blocks_out += x->n;
            n->st->bytes_out += (uint64_t)x->n * n->cfg->block_size;
            n->st->transfers_done++;
            n->st->transfer_latency_ns_sum += now - x->posted_ns;
            for (uint32_t i = 0; i < r->n_demand; i++)
                r->block_ok[i] = r->demand[i].supply >= 0;
            kvp_store_served(n->store, x->src, x->n, r->request_id); /* once: back (before unpin) */
        }
        r->xfer = NULL;
        kvp__xfer_release(n, x, KVP_PROOF_TERMINAL); /* poll handed it back */
        sround_finish(r, r->phase == KVP_SR_ABORTING, st);
        return;
    }
    KVP_ERROR(n->name, "peer %s: completion for unknown transfer %llu", s->peer_id,
              (unsigned long long)id);
}

/* --------------------------------------------------------------- ABORT */

void kvp__server_on_abort(kvp_session_t *s, const kvp_msg_abort_t *m)
{
    kvp_session_env_t *n = s->env;
    kvp_sround_t *r = kvp__sround_find(s, m->round);
    if (r == NULL) {
        /* Nothing of this round was ever posted in this incarnation: proven. */
        kvp_msg_t a = {.type = KVP_MSG_ABORT_ACK};
        a.u.abort = *m;
        kvp__session_send(s, &a);
        return;
    }
    switch (r->phase) {
    case KVP_SR_FINISHED: /* replay the same answer (F5) */
        if (r->sent_ack) {
            kvp_msg_t a = {.type = KVP_MSG_ABORT_ACK};
            a.u.abort = *m;
            kvp__session_send(s, &a);
        } else {
            sround_finish(r, false, r->final_status);
        }
        return;
    case KVP_SR_ABORTING:
        return; /* the ack follows once the transfer is terminal */
    case KVP_SR_TRANSFERRING: {
        kvp_xfer_id_t running[1];
        size_t n_running = 0;
        n->xport->ops->cancel(n->xport, &r->xfer->id, 1, KVP_CANCEL_WAIT, running, &n_running);
        kvp__sround_set_phase(r, KVP_SR_ABORTING);
        if (n_running == 0) { /* terminal already: released by cancel */
            s->xfers_inflight--;
            kvp__xfer_release(n, r->xfer, KVP_PROOF_TERMINAL);
            r->xfer = NULL;
            sround_finish(r, true, KVP_ERR_CANCELED);
        }
        return;
    }
    default:
        sround_finish(r, true, KVP_ERR_CANCELED);
        return;
    }
}

/* ------------------------------------------------------- timers, commits */

static void sround_timer_cb(kvp_timer_t *t)
{
    kvp_sround_t *r = t->data;
    switch (r->phase) {
    case KVP_SR_LOOKUP_PENDING:
        kvp__server_lookup_resolve(r);
        return;
    case KVP_SR_SUPPLIED: { /* the pin lease ran out: never fetched, never renewed */
        kvp_session_env_t *n = r->sess->env;
        uint32_t pinned = 0;
        for (uint32_t i = 0; i < r->n_supply; i++)
            pinned += r->supply[i].pinned;
        n->st->leases_expired++;
        n->st->lease_pins_expired += pinned;
        KVP_DEBUG(n->name, "peer %s request %llu round %llu: pin lease expired, %u pins released",
                  r->sess->peer_id, (unsigned long long)r->request_id,
                  (unsigned long long)r->round, pinned);
        kvp__sround_free(r);
        return;
    }
    case KVP_SR_PARKED: /* parked-demand timeout (F11) */
        sround_finish(r, false, KVP_ERR_TIMEOUT);
        return;
    case KVP_SR_FINISHED:
        kvp__sround_free(r);
        return;
    default:
        return;
    }
}

static bool sround_take_commit(kvp_sround_t *r, const void *key, uint32_t key_len)
{
    kvp_store_t *st = r->sess->env->store;
    bool changed = false;
    if (r->phase == KVP_SR_LOOKUP_PENDING) {
        bool still = false;
        for (uint32_t i = 0; i < r->n_supply; i++) {
            kvp_supply_t *sp = &r->supply[i];
            kvp_slot_ref_t ref;
            if (sp->pending && key_eq(&sp->key, key, key_len) &&
                kvp_store_lookup(st, key, key_len, &ref, NULL, NULL) == KVP_OK) {
                sp->pending = false;
                if (kvp__budget_pin_take(r, sp))
                    sp->ref = ref;
                else
                    kvp__release_supply(r->sess->env, r->sess->peer_id, ref, KVP_SUPPLY_REFUSED);
            }
            still |= sp->pending;
        }
        return !still;
    }
    for (uint32_t i = 0; i < r->n_demand; i++) {
        kvp_demand_t *d = &r->demand[i];
        if (d->supply < 0 && key_eq(&d->key, key, key_len))
            changed |= supply_from_store(r, d);
    }
    for (uint32_t i = 0; i < r->n_demand; i++)
        if (r->demand[i].supply < 0)
            return false;
    return changed;
}

void kvp__server_on_commit(kvp_session_env_t *n, const void *key, uint32_t key_len)
{
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &n->waiting)
    {
        kvp_sround_t *r = KVP_CONTAINER_OF(p, kvp_sround_t, wait_link);
        if (!sround_take_commit(r, key, key_len))
            continue;
        if (r->phase == KVP_SR_LOOKUP_PENDING) {
            kvp__server_lookup_resolve(r);
        } else {
            kvp_list_remove(&r->wait_link);
            sround_post(r);
        }
    }
}

/* The request finished (locally on this node, or the consumer's terminal
 * empty FETCH): unfetched supply is unpinned, parked demand fails at once,
 * transfers in flight complete normally. */
void kvp__server_finish_request(kvp_session_t *s, uint64_t request_id)
{
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &s->srounds)
    {
        kvp_sround_t *r = KVP_CONTAINER_OF(p, kvp_sround_t, link);
        if (r->request_id != request_id)
            continue;
        if (r->phase == KVP_SR_SUPPLIED)
            kvp__sround_free(r);
        else if (r->phase == KVP_SR_PARKED)
            sround_finish(r, false, KVP_ERR_CANCELED);
        else if (r->phase == KVP_SR_LOOKUP_PENDING)
            kvp__server_lookup_resolve(r);
    }
}

/* Session teardown, source side (SPEC §7.1): cancel in WAIT mode; transfers
 * still running are retained with their store jobs; nothing is unpinned
 * that a running transfer reads. */
void kvp__server_teardown(kvp_session_t *s, kvp_session_close_t *out)
{
    kvp_session_env_t *n = s->env;
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &s->xfers)
    {
        kvp_xfer_t *x = KVP_CONTAINER_OF(p, kvp_xfer_t, link);
        kvp_xfer_id_t running[1];
        size_t n_running = 0;
        if (KVP_MUTATED(KVP_MUT_CANCEL_IMMEDIATE_AT_CLOSE)) /* test-only: the bug */
            n->xport->ops->cancel(n->xport, &x->id, 1, KVP_CANCEL_IMMEDIATE, NULL, NULL);
        else
            n->xport->ops->cancel(n->xport, &x->id, 1, KVP_CANCEL_WAIT, running, &n_running);
        x->round->xfer = NULL;
        x->round = NULL;
        if (n_running == 0) { /* cancel (WAIT) handed it back terminal */
            out->xfers_released++;
            kvp__xfer_release(n, x, KVP_PROOF_TERMINAL);
            continue;
        }
        if (KVP_MUTATED(KVP_MUT_UNPIN_AT_CLOSE)) /* the bug: the transfer is still running */
            kvp__release_src(n, x, KVP_PROOF_TERMINAL); /* test-only mutation: a false proof */
        kvp_list_remove(&x->link);
        x->retained_ns = kvp__env_now(n);
        kvp_list_insert_tail(&n->retained, &x->link);
        n->n_retained++;
        out->xfers_retained++;
        out->pins_retained += x->n;
        KVP_WARN(n->name, "peer %s: transfer %llu still running at teardown: retained", s->peer_id,
                 (unsigned long long)x->id);
    }
    s->xfers_inflight = 0;
    while (!kvp_list_empty(&s->srounds))
        kvp__sround_free(KVP_CONTAINER_OF(s->srounds.next, kvp_sround_t, link));
    while (!kvp_list_empty(&s->srounds_done))
        kvp__sround_free(KVP_CONTAINER_OF(s->srounds_done.next, kvp_sround_t, link));
}
