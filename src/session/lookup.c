/*
 * lookup.c -- the consumer role of a session (SPEC §5), its lookup rounds:
 * lookups queued per session, aggregated into one LOOKUP per request per
 * poll round (prefix lookups are a LOOKUP of their own), their answers
 * mapped back to each op, the lease heartbeat, and the lookups' part of
 * teardown. What a LOOKUP_RESP tells about a request (its latest round, not
 * fetched yet) is kept in a kvp_creq_t for the fetch that follows
 * (client.c). No memory a WRITE may touch is held here.
 */
#include "session/session_int.h"

#include <stdio.h>
#include <string.h>

kvp_status_t kvp__client_lookup(kvp_session_t *s, uint64_t op_id, uint64_t request_id,
                                const uint8_t *keys, const uint32_t *lens, uint32_t n,
                                uint8_t *results)
{
    kvp_status_t st = kvp__client_check_keys(keys, lens, n);
    if (st != KVP_OK || results == NULL)
        return KVP_ERR_INVALID;
    kvp_lookup_op_t *op = kvp__calloc(1, sizeof(*op));
    kvp_key_buf_t *kb = kvp__calloc(n, sizeof(*kb));
    if (op == NULL || kb == NULL) {
        kvp__free(op);
        kvp__free(kb);
        return KVP_ERR_NOMEM;
    }
    size_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        kvp__key_copy(&kb[i], keys + off, lens[i]);
        off += lens[i];
    }
    op->op_id = op_id;
    op->request_id = request_id;
    op->n = n;
    op->keys = kb;
    op->results = results;
    op->sess = s;
    kvp_list_insert_tail(&s->lookups_queued, &op->link);
    return KVP_OK;
}

kvp_status_t kvp__client_lookup_prefix(kvp_session_t *s, uint64_t op_id, uint64_t request_id,
                                       const uint8_t *keys, const uint32_t *lens, uint32_t n,
                                       uint8_t *results)
{
    uint8_t *own = NULL;
    if (kvp__client_check_keys(keys, lens, n) != KVP_OK)
        return KVP_ERR_INVALID;
    if (results == NULL && (results = own = kvp__malloc(n)) == NULL)
        return KVP_ERR_NOMEM;
    kvp_status_t st = kvp__client_lookup(s, op_id, request_id, keys, lens, n, results);
    if (st != KVP_OK) {
        kvp__free(own);
        return st;
    }
    /* kvp__client_lookup queued it last. */
    kvp_lookup_op_t *op = KVP_CONTAINER_OF(s->lookups_queued.prev, kvp_lookup_op_t, link);
    op->mode = KVP_LOOKUP_F_PREFIX;
    op->owns_results = own != NULL;
    return KVP_OK;
}

kvp_status_t kvp__client_lease_renew(kvp_session_t *s, uint64_t request_id)
{
    kvp_msg_t m = {.type = KVP_MSG_LOOKUP, .flags = KVP_LOOKUP_F_RENEW};
    m.u.lookup = (kvp_msg_lookup_t){request_id, s->env->next_round++, 0, NULL};
    /* Its empty LOOKUP_RESP matches no op and is ignored (on_lookup_resp). */
    return kvp__session_send(s, &m);
}

static void lookup_op_finish(kvp_lookup_op_t *op, kvp_status_t st, uint32_t hits)
{
    kvp_session_env_t *n = op->sess->env;
    kvp_event_t ev = {.type = KVP_EV_LOOKUP, .status = st, .op_id = op->op_id};
    ev.request_id = op->request_id;
    ev.n_keys = op->n;
    ev.n_ok = hits;
    snprintf(ev.peer, sizeof(ev.peer), "%s", op->sess->peer_id);
    if (st != KVP_OK && hits == 0) /* a LIMIT answer's hits are real: kept */
        memset(op->results, KVP_LOOKUP_MISS, op->n);
    kvp_list_remove(&op->link);
    kvp_timer_stop(n->loop, &op->timer);
    if (op->owns_results)
        kvp__free(op->results);
    kvp__free(op->keys);
    kvp__free(op);
    kvp__env_emit(n, &ev);
}

static void lookup_timer_cb(kvp_timer_t *t)
{
    kvp_lookup_op_t *op = t->data;
    /* F13: a LOOKUP never answered -- the session is not serving us. */
    kvp__session_fault(op->sess, KVP_BYE_PROTOCOL, "LOOKUP not answered in time");
}

/* Whether op goes into the same LOOKUP as `first`: general-mode lookups of
 * one request merge; a prefix lookup is a LOOKUP of its own (its key order
 * is the request's block order). */
static bool lookup_batch_with(const kvp_lookup_op_t *first, const kvp_lookup_op_t *op)
{
    if (op == first)
        return true;
    return op->request_id == first->request_id && op->mode == 0 && first->mode == 0;
}

/* One LOOKUP per request per poll round with the union of the queued keys of
 * that request (a key asked twice in the same round is sent once). */
void kvp__client_flush_lookups(kvp_session_t *s)
{
    kvp_session_env_t *n = s->env;
    while (!kvp_list_empty(&s->lookups_queued)) {
        kvp_lookup_op_t *first = KVP_CONTAINER_OF(s->lookups_queued.next, kvp_lookup_op_t, link);
        uint64_t req = first->request_id, round = n->next_round++;
        uint16_t mode = first->mode;
        uint32_t total = 0, nops = 0;
        kvp_list_t *p, *t;
        kvp_list_foreach_safe(p, t, &s->lookups_queued)
        {
            kvp_lookup_op_t *op = KVP_CONTAINER_OF(p, kvp_lookup_op_t, link);
            if (lookup_batch_with(first, op)) {
                total += op->n;
                nops++;
            }
        }
        kvp_key_t *keys = kvp__calloc(total, sizeof(*keys));
        uint32_t nk = 0;
        kvp_list_foreach_safe(p, t, &s->lookups_queued)
        {
            kvp_lookup_op_t *op = KVP_CONTAINER_OF(p, kvp_lookup_op_t, link);
            if (!lookup_batch_with(first, op))
                continue;
            op->round = round;
            for (uint32_t i = 0; keys && i < op->n; i++) {
                uint32_t j = nops == 1 ? nk : 0; /* one op: sent as given, no O(n^2) merge */
                while (j < nk && !(keys[j].len == op->keys[i].len &&
                                   memcmp(keys[j].data, op->keys[i].data, keys[j].len) == 0))
                    j++;
                if (j == nk)
                    keys[nk++] = (kvp_key_t){op->keys[i].data, op->keys[i].len};
            }
            kvp_list_remove(&op->link);
            kvp_list_insert_tail(&s->lookups_sent, &op->link);
            kvp_timer_init(&op->timer, "lookup", lookup_timer_cb, op);
            kvp_timer_start(n->loop, &op->timer,
                            kvp__env_now(n) + ((uint64_t)n->cfg->lookup_pending_ms +
                                                n->cfg->dead_after_ms) * KVP_NSEC_PER_MSEC);
        }
        if (keys == NULL) {
            kvp__session_fault(s, KVP_BYE_PROTOCOL, "out of memory sending LOOKUP");
            return;
        }
        kvp_msg_t m = {.type = KVP_MSG_LOOKUP, .flags = mode};
        m.u.lookup = (kvp_msg_lookup_t){req, round, nk, keys};
        kvp__session_send(s, &m);
        kvp__free(keys);
    }
}

/* One lookup op of the answered round: its hits (the held prefix in prefix
 * mode), a LIMIT answer said so, and its outcome. */
static void lookup_op_answered(kvp_session_t *s, kvp_lookup_op_t *op, uint16_t flags)
{
    uint32_t hits = 0;
    for (uint32_t i = 0; i < op->n; i++)
        hits += op->results[i] == KVP_LOOKUP_HIT;
    if (op->mode & KVP_LOOKUP_F_PREFIX) {
        /* The held prefix. A source that predates prefix mode answers
         * every key (and pins every hit until the lease or the request
         * ends): what follows the first miss is not part of the prefix. */
        hits = 0;
        while (hits < op->n && op->results[hits] == KVP_LOOKUP_HIT)
            hits++;
        memset(op->results + hits, KVP_LOOKUP_MISS, op->n - hits);
    }
    /* The source refused part of the lookup at one of its budgets: say
     * so (never "ok" with misses that are refusals); the hits stay
     * valid and pinned for a fetch. */
    if (flags & KVP_LOOKUP_F_LIMIT) {
        s->env->st->lookups_limited++;
        KVP_LOG_RL(&s->rl_limit, kvp__env_now(s->env), KVP_LOG_WARN, s->env->name,
                   "peer %s: lookup %llu answered limit (%u of %u keys held for us)",
                   s->peer_id, (unsigned long long)op->op_id, hits, op->n);
    }
    lookup_op_finish(op, (flags & KVP_LOOKUP_F_LIMIT) ? KVP_ERR_LIMIT : KVP_OK, hits);
}

void kvp__client_on_lookup_resp(kvp_session_t *s, const kvp_msg_lookup_resp_t *m,
                                uint16_t flags)
{
    /* Rebuild the key order of the LOOKUP we sent from the ops of that round. */
    kvp_list_t *p, *t;
    kvp_key_buf_t *order[256];
    kvp_key_buf_t **keys = m->n <= 256 ? order : kvp__calloc(m->n, sizeof(*keys));
    uint32_t nk = 0, nops = 0;
    bool found = false;
    kvp_list_foreach_safe(p, t, &s->lookups_sent)
    {
        kvp_lookup_op_t *op = KVP_CONTAINER_OF(p, kvp_lookup_op_t, link);
        nops += op->round == m->round;
    }
    if (keys == NULL) {
        kvp__session_fault(s, KVP_BYE_PROTOCOL, "out of memory on LOOKUP_RESP");
        return;
    }
    kvp_list_foreach_safe(p, t, &s->lookups_sent)
    {
        kvp_lookup_op_t *op = KVP_CONTAINER_OF(p, kvp_lookup_op_t, link);
        if (op->round != m->round)
            continue;
        found = true;
        for (uint32_t i = 0; i < op->n; i++) {
            uint32_t j = nops == 1 ? nk : 0; /* as flush_lookups: one op, no merge */
            while (j < nk && !(keys[j]->len == op->keys[i].len &&
                               memcmp(keys[j]->data, op->keys[i].data, keys[j]->len) == 0))
                j++;
            if (j == nk && nk < m->n)
                keys[nk++] = &op->keys[i];
            op->results[i] = j < m->n ? m->results[j] : KVP_LOOKUP_MISS;
        }
    }
    if (keys != order)
        kvp__free(keys);
    if (!found)
        return; /* a response to a lookup we already failed: ignore */
    if (nk != m->n) {
        kvp__session_fault(s, KVP_BYE_PROTOCOL, "LOOKUP_RESP has the wrong number of results");
        return;
    }
    kvp_creq_t *c = kvp__client_creq(s, m->request_id, true);
    if (c != NULL) {
        c->round = m->round;
        c->fetched = false;
    }
    kvp_list_foreach_safe(p, t, &s->lookups_sent)
    {
        kvp_lookup_op_t *op = KVP_CONTAINER_OF(p, kvp_lookup_op_t, link);
        if (op->round != m->round)
            continue;
        lookup_op_answered(s, op, flags);
    }
}

/* Teardown and faults: every queued or sent lookup of the session answers
 * `why` (all MISS), one outcome each. */
void kvp__client_fail_lookups(kvp_session_t *s, kvp_status_t why)
{
    kvp_list_t *p, *t;
    kvp_list_foreach_safe(p, t, &s->lookups_queued)
        lookup_op_finish(KVP_CONTAINER_OF(p, kvp_lookup_op_t, link), why, 0);
    kvp_list_foreach_safe(p, t, &s->lookups_sent)
        lookup_op_finish(KVP_CONTAINER_OF(p, kvp_lookup_op_t, link), why, 0);
}
