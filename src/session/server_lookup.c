/*
 * server_lookup.c -- the source role's answer to LOOKUP (SPEC §5.1; split
 * from server.c): look the keys up in chunks, pin each hit as the round's
 * supply within the peer's budgets (budget.c), answer HIT/MISS per key (the
 * limit flag when a budget refused), hold FILLING keys until the pending
 * deadline, trim prefix mode to the held prefix, and the pin lease.
 *
 * The round (kvp_sround_t) and its phases are server.c's; this file creates
 * rounds through kvp__sround_new and frees them through kvp__sround_free.
 * A round keeps supply entries for hits and pending keys only (issue 27).
 */
#include "session/session_int.h"

#include <string.h>

/* ------------------------------------------------------------- replies */

static void send_lookup_resp(kvp_sround_t *r)
{
    kvp_session_t *s = r->sess;
    uint8_t stackbuf[256];
    /* One byte per key, for the send only (the round keeps hits alone). */
    uint8_t *res = r->n_keys <= sizeof(stackbuf) ? stackbuf : kvp__malloc(r->n_keys);
    if (res == NULL) {
        kvp__session_fault(s, KVP_BYE_PROTOCOL, "out of memory answering LOOKUP");
        return;
    }
    memset(res, KVP_LOOKUP_MISS, r->n_keys);
    for (uint32_t i = 0; i < r->n_supply; i++)
        if (r->supply[i].pinned ||
            (r->supply[i].pending && KVP_MUTATED(KVP_MUT_WANTED_HIT))) /* test-only: the bug */
            res[r->supply[i].idx] = KVP_LOOKUP_HIT;
    kvp_msg_t m = {.type = KVP_MSG_LOOKUP_RESP, .flags = r->lookup_flags};
    if (r->limited) {
        m.flags |= KVP_LOOKUP_F_LIMIT;
        s->env->st->lookups_refused_limit++;
    }
    m.u.lookup_resp.request_id = r->request_id;
    m.u.lookup_resp.round = r->round;
    m.u.lookup_resp.n = r->n_keys;
    m.u.lookup_resp.results = res;
    kvp__session_send(s, &m);
    if (res != stackbuf)
        kvp__free(res);
}

/* ---------------------------------------------------------- pin leases */

/* Supply pinned by a LOOKUP is held under a lease: pin_lease_ms (0 = the
 * supply-pin timeout) after the lookup or the requester's latest renewal --
 * a FETCH or LOOKUP of the same request on this session, or a lease
 * heartbeat (LOOKUP with KVP_LOOKUP_F_RENEW). When the lease runs out the
 * round's pins are released and counted (sround_timer_cb). */
void kvp__server_lease_renew(kvp_session_t *s, uint64_t request_id)
{
    kvp_session_env_t *n = s->env;
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &s->srounds)
    {
        kvp_sround_t *r = KVP_CONTAINER_OF(p, kvp_sround_t, link);
        if (r->request_id == request_id && r->phase == KVP_SR_SUPPLIED) {
            kvp_timer_start(n->loop, &r->timer, kvp__budget_lease_deadline(r));
            n->st->leases_renewed++;
        }
    }
}

/* Prefix mode: everything after the first key that is neither held nor
 * pending is not part of the prefix; drop its pins. The supply holds only
 * held and pending keys, in key order: a gap in idx is a miss. Returns the
 * number of keys still pinned. */
static uint32_t prefix_trim(kvp_sround_t *r)
{
    uint32_t held = 0, expect = 0;
    bool cut = false;
    for (uint32_t i = 0; i < r->n_supply; i++) {
        kvp_supply_t *sp = &r->supply[i];
        cut |= sp->idx != expect;
        if (cut && sp->pinned && (r->lookup_flags & KVP_LOOKUP_F_PREFIX)) {
            kvp__release_supply(r->sess->env, r->sess->peer_id, sp->ref, KVP_SUPPLY_PREFIX_CUT);
            kvp__budget_pin_drop(r, sp);
        }
        cut |= !sp->pinned && !sp->pending;
        held += sp->pinned;
        expect = sp->idx + 1;
    }
    return held;
}

/* --------------------------------------------------------------- LOOKUP */

enum { LOOKUP_CHUNK = 64 };

/* Look up k (<= LOOKUP_CHUNK) keys at once; each hit pinned into refs[i]. */
static void lookup_chunk(kvp_store_t *store, const kvp_key_t *keys, uint32_t k,
                         kvp_slot_ref_t *refs, kvp_status_t *st)
{
    const void *kp[LOOKUP_CHUNK];
    size_t kl[LOOKUP_CHUNK];
    for (uint32_t i = 0; i < k; i++) {
        kp[i] = keys[i].data;
        kl[i] = keys[i].len;
    }
    kvp_store_lookup_many(store, k, kp, kl, refs, st);
}

/* Room for `want` supply entries, within the peer's round memory; if it
 * does not fit, nothing changes (supply_push then refuses). */
static void supply_reserve(kvp_sround_t *r, uint32_t want)
{
    if (want <= r->cap_supply ||
        !kvp__budget_round_fits(r->sess, (uint64_t)(want - r->cap_supply) * sizeof(kvp_supply_t),
                                false))
        return;
    kvp_supply_t *ns = kvp__realloc(r->supply, (size_t)want * sizeof(*ns));
    if (ns == NULL)
        return;
    r->supply = ns;
    r->cap_supply = want;
    kvp__budget_account(r, false);
}

/* Append a supply entry for key idx (a hit or a pending key), growing the
 * array within the peer's round memory. NULL (r->limited set, counted) when
 * the budget has no room, or out of memory. */
static kvp_supply_t *supply_push(kvp_sround_t *r, uint32_t idx, const kvp_key_t *k)
{
    if (r->n_supply == r->cap_supply) {
        uint32_t cap = r->cap_supply ? r->cap_supply * 2 : 8;
        uint64_t extra = (uint64_t)(cap - r->cap_supply) * sizeof(kvp_supply_t);
        kvp_supply_t *ns = NULL;
        if (kvp__budget_round_fits(r->sess, extra, false))
            ns = kvp__realloc(r->supply, (size_t)cap * sizeof(*ns));
        if (ns == NULL) {
            if (!r->limited)
                kvp__budget_round_refused(r->sess, "LOOKUP supply");
            r->limited = true;
            return NULL;
        }
        r->supply = ns;
        r->cap_supply = cap;
        kvp__budget_account(r, false);
    }
    kvp_supply_t *sp = &r->supply[r->n_supply++];
    memset(sp, 0, sizeof(*sp));
    kvp__key_copy(&sp->key, k->data, k->len);
    sp->idx = idx;
    return sp;
}

/* One key's answer: a pinned hit (within the budgets), a pending key, or a
 * miss (a refusal at a budget sets r->limited). Returns whether the key is
 * held or pending (prefix mode stops at the first that is not). */
static bool lookup_take(kvp_sround_t *r, uint32_t idx, const kvp_key_t *k, kvp_status_t st,
                        kvp_slot_ref_t ref, bool open)
{
    kvp_session_env_t *n = r->sess->env;
    if (st == KVP_OK && open) {
        kvp_supply_t *sp = supply_push(r, idx, k);
        if (sp != NULL && kvp__budget_pin_take(r, sp)) {
            sp->ref = ref;
            return true;
        }
        if (sp != NULL)
            r->n_supply--; /* the entry just pushed: refused */
        kvp__release_supply(n, r->sess->peer_id, ref, KVP_SUPPLY_REFUSED);
        return false;
    }
    if (st == KVP_OK) {
        kvp__release_supply(n, r->sess->peer_id, ref, KVP_SUPPLY_CLOSING); /* answer MISS */
        return false;
    }
    if (st == KVP_ERR_PENDING) {
        kvp_supply_t *sp = supply_push(r, idx, k);
        if (sp != NULL)
            sp->pending = true;
        return sp != NULL;
    }
    if (st == KVP_ERR_LIMIT)
        r->limited = true; /* max_pins of the store (counted there: pins_refused) */
    if (st == KVP_ERR_NOT_FOUND && r->want == KVP_WANT_MAY) { /* issue 29: ask the embedding */
        kvp_supply_t *sp = supply_push(r, idx, k);
        if (sp != NULL)
            sp->pending = true;
        return sp != NULL;
    }
    if (st == KVP_ERR_NOT_FOUND && r->want == KVP_WANT_REFUSED) {
        r->limited = true; /* max_wanted_ops_per_peer: counted once per LOOKUP */
        r->sess->env->st->wanted_refused++;
        r->want = KVP_WANT_NO;
    }
    return false;
}

/* Answer a LOOKUP a budget refused whole (the peer's rounds, or its key
 * rate; the caller counted and logged it): every key MISS, with the limit
 * flag; nothing is kept. */
static void lookup_refuse(kvp_session_t *s, const kvp_msg_lookup_t *m, uint16_t flags)
{
    kvp_sround_t r = {.sess = s, .request_id = m->request_id, .round = m->round,
                      .n_keys = m->n, .limited = true};
    r.lookup_flags = flags & (KVP_LOOKUP_F_PREFIX | KVP_LOOKUP_F_RENEW);
    send_lookup_resp(&r);
}

/* Look up the first `granted` keys of the LOOKUP into round r (batched
 * chunks; prefix mode one by one, stopping after the first key neither held
 * nor pending). Counts pending keys and keys the store's max_pins refused;
 * returns how many keys were looked up. */
static uint32_t lookup_keys(kvp_sround_t *r, const kvp_msg_lookup_t *m, uint32_t granted,
                            uint32_t *pending, uint32_t *refused)
{
    kvp_store_t *store = r->sess->env->store;
    bool prefix = (r->lookup_flags & KVP_LOOKUP_F_PREFIX) != 0, open = kvp__sess_open(r->sess);
    for (uint32_t base = 0; base < granted; base += LOOKUP_CHUNK) {
        uint32_t k = KVP_MIN(LOOKUP_CHUNK, granted - base);
        kvp_status_t st[LOOKUP_CHUNK];
        kvp_slot_ref_t refs[LOOKUP_CHUNK];
        if (!prefix) { /* batched: the store prefetches a group's buckets and slots */
            lookup_chunk(store, &m->keys[base], k, refs, st);
            uint32_t kept = 0; /* the chunk's hits and pending keys: one allocation */
            for (uint32_t i = 0; i < k; i++)
                kept += st[i] == KVP_OK || st[i] == KVP_ERR_PENDING;
            if (kept > 0 && open)
                supply_reserve(r, r->n_supply + kept);
        }
        for (uint32_t i = 0; i < k; i++) {
            const kvp_key_t *key = &m->keys[base + i];
            if (prefix)
                st[i] = kvp_store_lookup(store, key->data, key->len, &refs[i], NULL, NULL);
            bool kept = lookup_take(r, base + i, key, st[i], refs[i], open);
            *pending += kept && (st[i] == KVP_ERR_PENDING || st[i] == KVP_ERR_NOT_FOUND);
            *refused += st[i] == KVP_ERR_LIMIT; /* the store's max_pins (counted there) */
            if (prefix && !kept) /* past the first miss: not looked up */
                return base + i + 1;
        }
    }
    return granted;
}

void kvp__server_on_lookup(kvp_session_t *s, const kvp_msg_lookup_t *m, uint16_t flags)
{
    kvp_session_env_t *n = s->env;
    if (kvp__sround_find(s, m->round) != NULL) {
        kvp__session_fault(s, KVP_BYE_PROTOCOL, "LOOKUP reuses a round token");
        return;
    }
    kvp__server_lease_renew(s, m->request_id); /* any lookup of the request is a heartbeat for it */
    if (!kvp__server_round_admit(s, 0)) {
        kvp__budget_round_refused(s, "LOOKUP");
        lookup_refuse(s, m, flags);
        return;
    }
    /* The key rate, before a key is hashed: only the first `granted` keys
     * are looked up; the rest answer MISS with the limit flag. */
    uint32_t granted = kvp__budget_lookup_keys(s, m->n);
    if (granted == 0 && m->n > 0) {
        lookup_refuse(s, m, flags);
        return;
    }
    kvp_sround_t *r = kvp__sround_new(s, m->request_id, m->round, 0);
    if (r == NULL) {
        kvp__budget_lookup_refund(s, granted);
        kvp__session_fault(s, KVP_BYE_PROTOCOL, "out of memory on LOOKUP");
        return;
    }
    r->n_keys = m->n;
    r->lookup_flags = flags & (KVP_LOOKUP_F_PREFIX | KVP_LOOKUP_F_RENEW);
    r->want = kvp__server_want_admit(s); /* issue 29: unpublished keys wanted? */
    uint32_t pending = 0, refused = 0;
    /* prefix mode stops at the first miss: the keys after it cost nothing */
    kvp__budget_lookup_refund(s, granted - lookup_keys(r, m, granted, &pending, &refused));
    if (refused > 0)
        KVP_LOG_RL(&s->rl_limit, kvp__env_now(n), KVP_LOG_WARN, n->name,
                   "peer %s: %u keys of LOOKUP answered MISS: max_pins reached", s->peer_id,
                   refused);
    else if (r->limited)
        KVP_LOG_RL(&s->rl_limit, kvp__env_now(n), KVP_LOG_WARN, n->name,
                   "peer %s: LOOKUP of %u keys answered limit (%u held)", s->peer_id, m->n,
                   r->n_supply - pending);
    r->limited |= granted < m->n; /* the key rate (counted and logged by the budget) */
    if (pending > 0) {
        kvp__sround_set_phase(r, KVP_SR_LOOKUP_PENDING);
        kvp_list_insert_tail(&n->waiting, &r->wait_link);
        kvp_timer_start(n->loop, &r->timer,
                        kvp__env_now(n) + (uint64_t)n->cfg->lookup_pending_ms * KVP_NSEC_PER_MSEC);
        kvp__server_wanted_raise(r); /* issue 29: KVP_EV_WANTED */
        return;
    }
    uint32_t hits = prefix_trim(r);
    send_lookup_resp(r);
    if (hits == 0) {
        kvp__sround_free(r);
        return;
    }
    kvp_timer_start(n->loop, &r->timer, kvp__budget_lease_deadline(r));
}

/* Pending keys that did not commit in time answer MISS; the rest HIT. */
void kvp__server_lookup_resolve(kvp_sround_t *r)
{
    kvp_session_env_t *n = r->sess->env;
    kvp__server_wanted_settle(r); /* issue 29: wanted keys unpublished: MISS */
    for (uint32_t i = 0; i < r->n_supply; i++)
        r->supply[i].pending &= KVP_MUTATED(KVP_MUT_WANTED_HIT); /* test-only: kept, answered HIT */
    if (kvp_list_linked(&r->wait_link))
        kvp_list_remove(&r->wait_link);
    kvp__sround_set_phase(r, KVP_SR_SUPPLIED);
    bool any = prefix_trim(r) > 0;
    send_lookup_resp(r);
    if (!any) {
        kvp__sround_free(r);
        return;
    }
    kvp_timer_start(n->loop, &r->timer, kvp__budget_lease_deadline(r));
}
