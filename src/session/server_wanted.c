/*
 * server_wanted.c -- issue 29 step 2, "keys wanted" (docs/DESIGN.md
 * "External slots"): in external-slots mode with external_wanted, a
 * LOOKUP's keys that are not published wait in the round as pending keys
 * (server_lookup.c) and the node raises KVP_EV_WANTED for the embedding.
 * The embedding publishes the chunks it holds (kvp_publish: the commit path
 * pins them into the round, kvp__server_on_commit) and calls
 * kvp_wanted_done; the round then answers with what is pinned. Unanswered
 * by lookup_pending_ms (the pending-lookup timer): MISS.
 *
 * Bounds: a wanted key is a granted key of the peer's key rate and a
 * supply entry of its round memory; a peer has at most
 * max_wanted_ops_per_peer WANTED ops outstanding (past it, MISS + limit).
 */
#include "session/session.h"

#include <stdio.h>
#include <string.h>

uint8_t kvp__server_want_admit(kvp_session_t *s)
{
    kvp_session_env_t *e = s->env;
    if (!e->cfg->external_wanted || !kvp__session_open(s))
        return KVP_WANT_NO;
    uint32_t outstanding = 0;
    kvp_list_t *p;
    for (p = s->srounds.next; p != &s->srounds; p = p->next) {
        kvp_sround_t *r = KVP_CONTAINER_OF(p, kvp_sround_t, link);
        outstanding += r->phase == KVP_SR_LOOKUP_PENDING && r->wanted_op != 0;
    }
    if (outstanding < e->cfg->max_wanted_ops_per_peer)
        return KVP_WANT_MAY;
    return KVP_WANT_REFUSED;
}

void kvp__server_wanted_raise(kvp_sround_t *r)
{
    kvp_session_t *s = r->sess;
    kvp_session_env_t *e = s->env;
    uint32_t n = 0;
    for (uint32_t i = 0; i < r->n_supply; i++)
        n += r->supply[i].pending;
    if (n == 0)
        return;
    r->wanted_op = ++e->next_wanted;
    e->st->wanted_ops++;
    e->st->wanted_keys += n;
    kvp_event_t ev = {.type = KVP_EV_WANTED, .status = KVP_OK, .op_id = r->wanted_op,
                      .request_id = r->request_id, .n_keys = n};
    snprintf(ev.peer, sizeof(ev.peer), "%s", s->peer_id);
    kvp__env_emit(e, &ev);
}

void kvp__server_wanted_settle(kvp_sround_t *r)
{
    if (r->wanted_op == 0)
        return;
    kvp_session_env_t *e = r->sess->env;
    uint32_t missed = 0;
    for (uint32_t i = 0; i < r->n_supply; i++)
        missed += r->supply[i].pending;
    e->st->wanted_keys_missed += missed;
    if (missed > 0 && r->want != KVP_WANT_DONE)
        e->st->wanted_expired++; /* the deadline (or the request finished) */
    r->wanted_op = 0;
}

static kvp_sround_t *wanted_find(kvp_session_env_t *e, uint64_t op_id)
{
    if (op_id == 0)
        return NULL;
    kvp_list_t *p;
    for (p = e->waiting.next; p != &e->waiting; p = p->next) {
        kvp_sround_t *r = KVP_CONTAINER_OF(p, kvp_sround_t, wait_link);
        if (r->phase == KVP_SR_LOOKUP_PENDING && r->wanted_op == op_id)
            return r;
    }
    return NULL;
}

kvp_status_t kvp__server_wanted_keys(kvp_session_env_t *e, uint64_t op_id, uint8_t *keys,
                                     uint32_t *key_lens, uint32_t cap, uint32_t *n_out)
{
    kvp_sround_t *r = wanted_find(e, op_id);
    *n_out = 0;
    if (r == NULL)
        return KVP_ERR_NOT_FOUND;
    uint32_t k = 0;
    for (uint32_t i = 0; i < r->n_supply && k < cap; i++) {
        const kvp_supply_t *sp = &r->supply[i];
        if (!sp->pending)
            continue;
        memcpy(keys + (size_t)k * KVP_KEY_MAX, sp->key.data, sp->key.len);
        key_lens[k++] = sp->key.len;
    }
    *n_out = k;
    return KVP_OK;
}

kvp_status_t kvp__server_wanted_done(kvp_session_env_t *e, uint64_t op_id)
{
    kvp_sround_t *r = wanted_find(e, op_id);
    if (r == NULL)
        return KVP_ERR_NOT_FOUND;
    r->want = KVP_WANT_DONE;
    kvp__server_lookup_resolve(r);
    return KVP_OK;
}
