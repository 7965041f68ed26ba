/*
 * server_wanted.c -- issue 29 step 2, "keys wanted" (docs/DESIGN.md "Keys
 * wanted"): in external-slots mode with external_wanted, a LOOKUP's keys
 * that are not published wait in the round as pending keys
 * (server_lookup.c) and the node raises KVP_EV_WANTED for the embedding.
 * The embedding publishes the chunks it holds (kvp_publish: the commit path
 * pins them into the round, kvp__server_on_commit) and calls
 * kvp_wanted_done; the round then answers with what is pinned. Unanswered
 * by lookup_pending_ms (the pending-lookup timer): MISS.
 *
 * An op outstanding is a record in env->wanted (not a field of the round:
 * a round's size is charged to the peer's round memory and seen by the
 * simulator's digests of the other modes). Bounds: a wanted key is a
 * granted key of the peer's key rate and a supply entry of its round
 * memory; a peer has at most max_wanted_ops_per_peer ops outstanding (past
 * it, MISS + limit).
 */
#include "session/session_int.h"

#include <stdio.h>
#include <string.h>

struct kvp_wanted {
    struct kvp_wanted *next;
    kvp_sround_t *r;
    uint64_t op;
};

void kvp__server_parked_count(const kvp_sround_t *r, kvp_sround_phase_t to)
{
    kvp_session_env_t *e = r->sess->env;
    if (to == KVP_SR_PARKED)
        atomic_fetch_add_explicit(&e->parked, 1u, memory_order_relaxed);
    else if (r->phase == KVP_SR_PARKED)
        atomic_fetch_sub_explicit(&e->parked, 1u, memory_order_relaxed);
}

uint8_t kvp__server_want_admit(kvp_session_t *s)
{
    kvp_session_env_t *e = s->env;
    if (!e->cfg->external_wanted || !kvp__sess_open(s))
        return KVP_WANT_NO;
    uint32_t outstanding = 0;
    for (const struct kvp_wanted *w = e->wanted; w != NULL; w = w->next)
        outstanding += w->r->sess == s;
    return outstanding < e->cfg->max_wanted_ops_per_peer ? KVP_WANT_MAY : KVP_WANT_REFUSED;
}

void kvp__server_wanted_raise(kvp_sround_t *r)
{
    kvp_session_t *s = r->sess;
    kvp_session_env_t *e = s->env;
    uint32_t n = 0;
    for (uint32_t i = 0; i < r->n_supply; i++)
        n += r->supply[i].pending;
    if (n == 0 || r->want != KVP_WANT_MAY)
        return;
    struct kvp_wanted *w = kvp__malloc(sizeof(*w));
    if (w == NULL)
        return; /* no event: the keys answer MISS at the deadline */
    *w = (struct kvp_wanted){.next = e->wanted, .r = r, .op = ++e->next_wanted};
    e->wanted = w;
    r->want = KVP_WANT_RAISED;
    e->st->wanted_ops++;
    e->st->wanted_keys += n;
    kvp_event_t ev = {.type = KVP_EV_WANTED, .status = KVP_OK, .op_id = w->op,
                      .request_id = r->request_id, .n_keys = n};
    snprintf(ev.peer, sizeof(ev.peer), "%s", s->peer_id);
    kvp__env_emit(e, &ev);
}

/* Unlink r's record (NULL if it has none). */
static struct kvp_wanted *wanted_unlink(kvp_sround_t *r)
{
    if (r->want != KVP_WANT_RAISED && r->want != KVP_WANT_DONE)
        return NULL;
    for (struct kvp_wanted **p = &r->sess->env->wanted; *p != NULL; p = &(*p)->next)
        if ((*p)->r == r) {
            struct kvp_wanted *w = *p;
            *p = w->next;
            return w;
        }
    KVP_ASSERT(!"a raised round without its record");
    return NULL;
}

void kvp__server_wanted_settle(kvp_sround_t *r)
{
    struct kvp_wanted *w = wanted_unlink(r);
    if (w == NULL)
        return;
    kvp_session_env_t *e = r->sess->env;
    uint32_t missed = 0;
    for (uint32_t i = 0; i < r->n_supply; i++)
        missed += r->supply[i].pending;
    e->st->wanted_keys_missed += missed;
    if (missed > 0 && r->want != KVP_WANT_DONE)
        e->st->wanted_expired++; /* the deadline (or the request finished) */
    r->want = KVP_WANT_NO;
    kvp__free(w);
}

void kvp__server_wanted_forget(kvp_sround_t *r)
{
    kvp__free(wanted_unlink(r));
    r->want = KVP_WANT_NO;
}

static kvp_sround_t *wanted_find(kvp_session_env_t *e, uint64_t op_id)
{
    for (const struct kvp_wanted *w = e->wanted; w != NULL; w = w->next)
        if (w->op == op_id && w->r->phase == KVP_SR_LOOKUP_PENDING)
            return w->r;
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

/* The keys parked FETCHes wait for (wait-for-supply: prefill -> decode),
 * distinct, at most cap: the embedding publishes those it holds. The rounds
 * named go to the end of the list, so the next call names the others first:
 * a peer's parked keys that are never supplied cannot keep another's from
 * being named (the embedding asks for at most cap at a time). */
uint32_t kvp__server_parked_keys(kvp_session_env_t *e, uint8_t *keys, uint32_t *key_lens,
                                 uint32_t cap)
{
    uint32_t k = 0;
    kvp_list_t named, *p, *t;
    kvp_list_init(&named);
    kvp_list_foreach_safe(p, t, &e->waiting)
    {
        kvp_sround_t *r = KVP_CONTAINER_OF(p, kvp_sround_t, wait_link);
        if (k >= cap)
            break;
        if (r->phase != KVP_SR_PARKED)
            continue;
        uint32_t k0 = k;
        for (uint32_t i = 0; i < r->n_demand && k < cap; i++) {
            const kvp_demand_t *d = &r->demand[i];
            bool seen = d->supply >= 0;
            for (uint32_t j = 0; j < k && !seen; j++)
                seen = key_lens[j] == d->key.len &&
                       memcmp(keys + (size_t)j * KVP_KEY_MAX, d->key.data, d->key.len) == 0;
            if (seen)
                continue;
            memcpy(keys + (size_t)k * KVP_KEY_MAX, d->key.data, d->key.len);
            key_lens[k++] = d->key.len;
        }
        if (k > k0) {
            kvp_list_remove(&r->wait_link);
            kvp_list_insert_tail(&named, &r->wait_link);
        }
    }
    kvp_list_foreach_safe(p, t, &named)
    {
        kvp_list_remove(p);
        kvp_list_insert_tail(&e->waiting, p);
    }
    return k;
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
