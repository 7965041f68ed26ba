/*
 * keyrate.c -- the LOOKUP key-rate buckets that outlive their session
 * (max_lookup_keys_per_sec; budget.c charges them). A bucket kept only in
 * the session was full again at every reconnect, so a key holder in a
 * reconnect loop took a second's worth of keys per session. Now a session
 * that ends leaves its bucket here, under its peer id -- the id the
 * handshake accepted (kvp__session_create's HELLO after AUTH, and at most
 * one live session per id: ctl's identity rule) --, and the next session of
 * that id takes it back: it starts from what the old one left, refilled at
 * the rate for the time between.
 *
 * Bounded without a setting of its own: an entry one second idle is full
 * again (the bucket is one second deep), so it is dropped; and the table
 * holds at most max_sessions entries (min 16): past that the entry idle
 * longest -- the nearest to full -- gives way. Owned by the session env:
 * kvp__session_env_fini frees it.
 */
#include "session/session_int.h"

#include <stdio.h>

struct kvp_keyrate {
    char peer[KVP_WIRE_STR_MAX + 1];
    uint64_t tokens, refill_ns;
};

static uint32_t keyrate_cap(const kvp_session_env_t *e)
{
    return KVP_MAX(e->cfg->max_sessions, 16u);
}

static void keyrate_drop(kvp_session_env_t *e, uint32_t i)
{
    e->keyrate[i] = e->keyrate[--e->n_keyrate];
}

/* Drop every entry full again at `now`; with `room`, make room for one. */
static void keyrate_prune(kvp_session_env_t *e, uint64_t now, bool room)
{
    uint32_t oldest = 0;
    for (uint32_t i = 0; i < e->n_keyrate;) {
        if (now - KVP_MIN(now, e->keyrate[i].refill_ns) >= KVP_NSEC_PER_SEC) {
            keyrate_drop(e, i);
            continue;
        }
        if (e->keyrate[i].refill_ns < e->keyrate[oldest].refill_ns)
            oldest = i;
        i++;
    }
    if (room && e->n_keyrate > 0 && e->n_keyrate >= keyrate_cap(e))
        keyrate_drop(e, oldest);
}

void kvp__keyrate_take(kvp_session_t *s)
{
    kvp_session_env_t *e = s->env;
    keyrate_prune(e, kvp__env_now(e), false);
    for (uint32_t i = 0; i < e->n_keyrate; i++) {
        if (strcmp(e->keyrate[i].peer, s->peer_id) != 0)
            continue;
        s->key_bucket_set = true;
        s->key_tokens = e->keyrate[i].tokens;
        s->key_refill_ns = e->keyrate[i].refill_ns;
        keyrate_drop(e, i);
        return;
    }
}

void kvp__keyrate_leave(kvp_session_t *s)
{
    kvp_session_env_t *e = s->env;
    uint64_t now = kvp__env_now(e);
    if (!s->key_bucket_set || now - KVP_MIN(now, s->key_refill_ns) >= KVP_NSEC_PER_SEC)
        return; /* never charged, or full again: nothing to remember */
    keyrate_prune(e, now, false);
    for (uint32_t i = 0; i < e->n_keyrate; i++) {
        struct kvp_keyrate *k = &e->keyrate[i];
        if (strcmp(k->peer, s->peer_id) != 0)
            continue;
        /* Two sessions of one id overlapped (the ctl lets a new one up only
         * after the old one is down; this is the guard): the emptier wins. */
        k->tokens = KVP_MIN(k->tokens, s->key_tokens);
        k->refill_ns = KVP_MAX(k->refill_ns, s->key_refill_ns);
        return;
    }
    keyrate_prune(e, now, true);
    if (e->cap_keyrate < keyrate_cap(e)) { /* grown once, to the cap (max_sessions) */
        uint32_t cap = keyrate_cap(e);
        struct kvp_keyrate *t = kvp__realloc(e->keyrate, (size_t)cap * sizeof(*t));
        if (t == NULL)
            return; /* out of memory: this peer's next session starts full */
        e->keyrate = t;
        e->cap_keyrate = cap;
    }
    if (e->n_keyrate >= e->cap_keyrate)
        return; /* the cap was lowered (reconfigure): the next prune makes room */
    struct kvp_keyrate *k = &e->keyrate[e->n_keyrate++];
    snprintf(k->peer, sizeof(k->peer), "%s", s->peer_id);
    k->tokens = s->key_tokens;
    k->refill_ns = s->key_refill_ns;
}

void kvp__session_env_fini(kvp_session_env_t *e)
{
    KVP_ASSERT(atomic_load(&e->parked) == 0); /* every round freed: none counted PARKED */
    KVP_ASSERT(e->verifying == NULL); /* every load settled: no verify running */
    KVP_ASSERT(kvp_list_empty(&e->verify_wait)); /* nor waiting for one */
    kvp__helper_fini(&e->verifier);
    kvp__helper_fini(&e->verify_helper);
    kvp__free(e->keyrate);
    e->keyrate = NULL;
    e->n_keyrate = e->cap_keyrate = 0;
}
