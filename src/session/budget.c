/*
 * budget.c -- the per-peer budgets of the source role (issue 27, SPEC §9
 * "no peer takes more than its share of pins, live lookup memory ... or
 * lease lifetime"). server.c asks; this file counts:
 *
 *   supply pins   slots a peer's rounds hold pinned by LOOKUP (or by parked
 *                 demand) and not yet moved to a transfer: at most
 *                 max_supply_pins_per_peer per peer and max_supply_pins for
 *                 all peers together. A hit past either is answered MISS and
 *                 the answer carries KVP_LOOKUP_F_LIMIT.
 *   rounds        a peer's live rounds (max_lookup_rounds_per_peer) and the
 *                 memory of all its rounds (max_lookup_bytes_per_peer).
 *                 Memory per round is the record plus one supply entry per
 *                 hit or pending key (never per key asked) plus its demand.
 *   lease         a round's pin lease is renewable, but never past
 *                 born_ns + max_lease_ms.
 *   key rate      keys a peer's LOOKUPs have looked up per second
 *                 (max_lookup_keys_per_sec), charged before any is hashed:
 *                 the keys past it answer MISS with the limit flag, and
 *                 the peer's link takes no frame for a while (ctl pause).
 *
 * The counters live in the session (its share) and the env (the total);
 * nothing here allocates or frees.
 */
#include "session/session_int.h"

/* The node resolves every budget to its default (kvp__node_budget_defaults);
 * a session env filled by hand (tests of this layer) may leave 0: no limit. */
static inline uint64_t lim(uint64_t v)
{
    return v ? v : UINT64_MAX;
}

static void budget_refused(kvp_session_t *s, const char *what, uint32_t limit)
{
    kvp_session_env_t *n = s->env;
    KVP_LOG_RL(&s->rl_limit, kvp__env_now(n), KVP_LOG_WARN, n->name,
               "peer %s: refused at %s (%u): answered limit", s->peer_id, what, limit);
}

bool kvp__budget_pin_take(kvp_sround_t *r, kvp_supply_t *sp)
{
    kvp_session_t *s = r->sess;
    kvp_session_env_t *n = s->env;
    KVP_ASSERT(!sp->pinned);
    if (s->supply_pins >= lim(n->cfg->max_supply_pins_per_peer) ||
        n->supply_pins >= lim(n->cfg->max_supply_pins)) {
        bool mine = s->supply_pins >= lim(n->cfg->max_supply_pins_per_peer);
        n->st->supply_pins_refused++;
        r->limited = true;
        budget_refused(s, mine ? "max_supply_pins_per_peer" : "max_supply_pins",
                       mine ? n->cfg->max_supply_pins_per_peer : n->cfg->max_supply_pins);
        return false;
    }
    sp->pinned = true;
    s->supply_pins++;
    n->supply_pins++;
    return true;
}

void kvp__budget_pin_drop(kvp_sround_t *r, kvp_supply_t *sp)
{
    kvp_session_t *s = r->sess;
    KVP_ASSERT(sp->pinned && s->supply_pins > 0 && s->env->supply_pins > 0);
    sp->pinned = false;
    s->supply_pins--;
    s->env->supply_pins--;
}

uint64_t kvp__budget_round_mem(const kvp_sround_t *r)
{
    uint64_t b = sizeof(*r) + (uint64_t)r->cap_supply * sizeof(kvp_supply_t);
    if (r->demand != NULL)
        b += (uint64_t)r->n_demand * sizeof(kvp_demand_t);
    if (r->digests != NULL)
        b += (uint64_t)r->n_demand * (sizeof(kvp_digest_t) + 1); /* + block_ok */
    return b;
}

void kvp__budget_account(kvp_sround_t *r, bool gone)
{
    kvp_session_t *s = r->sess;
    uint64_t now = gone ? 0 : kvp__budget_round_mem(r);
    KVP_ASSERT(s->round_bytes >= r->mem && s->env->round_bytes >= r->mem);
    s->round_bytes = s->round_bytes - r->mem + now;
    s->env->round_bytes = s->env->round_bytes - r->mem + now;
    r->mem = now;
}

bool kvp__budget_round_fits(const kvp_session_t *s, uint64_t extra, bool new_round)
{
    const kvp_config_t *c = s->env->cfg;
    if (new_round && s->n_rounds >= lim(c->max_lookup_rounds_per_peer))
        return false;
    return s->round_bytes + extra <= lim(c->max_lookup_bytes_per_peer);
}

void kvp__budget_round_refused(kvp_session_t *s, const char *what)
{
    kvp_session_env_t *n = s->env;
    n->st->rounds_refused++;
    KVP_LOG_RL(&s->rl_limit, kvp__env_now(n), KVP_LOG_WARN, n->name,
               "peer %s: %s refused: max_lookup_rounds_per_peer (%u, %u live) or "
               "max_lookup_bytes_per_peer (%llu B, %llu B held): answered limit",
               s->peer_id, what, n->cfg->max_lookup_rounds_per_peer, s->n_rounds,
               (unsigned long long)n->cfg->max_lookup_bytes_per_peer,
               (unsigned long long)s->round_bytes);
}

uint64_t kvp__budget_lease_deadline(kvp_sround_t *r)
{
    kvp_session_env_t *n = r->sess->env;
    uint32_t ms = n->cfg->pin_lease_ms ? n->cfg->pin_lease_ms : n->cfg->supply_pin_ms;
    uint64_t d = kvp__env_now(n) + (uint64_t)ms * KVP_NSEC_PER_MSEC;
    uint64_t cap = r->born_ns + (uint64_t)n->cfg->max_lease_ms * KVP_NSEC_PER_MSEC;
    if (d <= cap || n->cfg->max_lease_ms == 0)
        return d;
    if (!r->lease_capped) {
        r->lease_capped = true;
        n->st->leases_capped++;
        KVP_LOG_RL(&r->sess->rl_limit, kvp__env_now(n), KVP_LOG_WARN, n->name,
                   "peer %s: request %llu: pin lease at max_lease_ms (%u ms): not renewed "
                   "past it",
                   r->sess->peer_id, (unsigned long long)r->request_id, n->cfg->max_lease_ms);
    }
    return cap;
}

/* The LOOKUP key rate (issue 27: a LOOKUP flood of all-miss keys from one
 * peer made the owner thread hash keys instead of serving the others). A
 * token bucket per session, one second deep, in nano-keys so that a refill
 * of a few nanoseconds still counts; elapsed time is capped at the depth
 * first, so nothing here overflows (1e9 ns x 2^32 keys/s < 2^63). */
#define KEY_NANO 1000000000ull

static void key_bucket_refill(kvp_session_t *s, uint64_t rate, uint64_t now)
{
    uint64_t depth = rate * KEY_NANO;
    if (!s->key_bucket_set) {
        s->key_bucket_set = true;
        s->key_tokens = depth;
    } else if (now > s->key_refill_ns) {
        uint64_t dt = KVP_MIN(now - s->key_refill_ns, KVP_NSEC_PER_SEC);
        s->key_tokens = KVP_MIN(s->key_tokens + dt * rate, depth);
    }
    s->key_tokens = KVP_MIN(s->key_tokens, depth); /* the rate may have been lowered */
    s->key_refill_ns = now;
}

/* A refusal costs the peer little and us still the frame's decode (a
 * LOOKUP of 65 536 keys is ~0.85 MB): a peer past its key rate has its
 * frames wait -- its link takes nothing more -- for as long as its rate
 * needs to earn the keys refused, at most a quarter of dead_after (its
 * liveness is not judged meanwhile). Its sends then back up into its own
 * socket, so its frames cost us at most about its rate. */
static uint64_t key_rate_pause(kvp_session_t *s, uint32_t refused, uint64_t rate)
{
    kvp_session_env_t *e = s->env;
    uint64_t ns = (uint64_t)refused * KVP_NSEC_PER_SEC / rate;
    ns = KVP_MIN(ns, (uint64_t)e->cfg->dead_after_ms * KVP_NSEC_PER_MSEC / 4);
    if (s->link != NULL && ns > 0)
        kvp_link_pause_read(s->link, kvp__env_now(e) + ns);
    return ns;
}

uint32_t kvp__budget_lookup_keys(kvp_session_t *s, uint32_t n)
{
    kvp_session_env_t *e = s->env;
    uint64_t rate = e->cfg->max_lookup_keys_per_sec, now = kvp__env_now(e);
    if (rate == 0 || n == 0)
        return n;
    key_bucket_refill(s, rate, now);
    uint32_t granted = (uint32_t)KVP_MIN((uint64_t)n, s->key_tokens / KEY_NANO);
    s->key_tokens -= (uint64_t)granted * KEY_NANO;
    if (granted < n) {
        uint64_t pause = key_rate_pause(s, n - granted, rate);
        e->st->lookup_keys_refused += n - granted;
        KVP_LOG_RL(&s->rl_limit, now, KVP_LOG_WARN, e->name,
                   "peer %s: LOOKUP of %u keys: %u past max_lookup_keys_per_sec (%llu) not "
                   "looked up: answered limit, its frames wait %llu ms",
                   s->peer_id, n, n - granted, (unsigned long long)rate,
                   (unsigned long long)(pause / KVP_NSEC_PER_MSEC));
    }
    return granted;
}

void kvp__budget_lookup_refund(kvp_session_t *s, uint32_t n)
{
    uint64_t rate = s->env->cfg->max_lookup_keys_per_sec;
    if (rate == 0 || n == 0 || !s->key_bucket_set)
        return;
    s->key_tokens = KVP_MIN(s->key_tokens + (uint64_t)n * KEY_NANO, rate * KEY_NANO);
}
