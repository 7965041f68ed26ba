/*
 * release.c -- the one place memory a WRITE may touch is released (STYLE §5,
 * SPEC §7). Every call names its proof (kvp_proof_t, node.h); the release
 * is counted per proof (kvp_stats_t released_*) and logged at DEBUG. The
 * hold cap, which is no proof, is logged loudly by its caller (node.c,
 * once per held record) and counted here like the others.
 *
 * `grep -n KVP_PROOF_ src` lists every release and so the whole safety
 * argument; docs/DESIGN.md ("Which proof releases which memory") maps each
 * proof to its rule of SPEC §7.
 *
 * Memory covered:
 *   consumer  a destination slot of ours leaving FILLING (commit, abandon)
 *             or QUARANTINED (release; suspect when the proof is the cap);
 *   source    the pins of a transfer's store job (the source slots it reads).
 * And the pins no remote access covers, named by their reason only:
 *   supply    a LOOKUP's pins on our READY slots not moved to a transfer
 *             (kvp__release_supply).
 * Store calls are never made inside KVP_ASSERT: the assert checks the
 * status the call returned.
 */
#include "session/session_int.h"

const char *kvp__proof_str(kvp_proof_t p)
{
    static const char *const names[KVP_PROOF_COUNT] = {
        [KVP_PROOF_TERMINAL] = "terminal",   [KVP_PROOF_FETCH_DONE] = "fetch-done",
        [KVP_PROOF_ABORT_ACK] = "abort-ack", [KVP_PROOF_FENCE] = "fence",
        [KVP_PROOF_AM_REFUSE] = "am-refuse", [KVP_PROOF_HOLD_CAP] = "hold-cap",
        [KVP_PROOF_NOT_SENT] = "not-sent",   [KVP_PROOF_PROCESS_EXIT] = "process-exit",
    };
    return (unsigned)p < KVP_PROOF_COUNT ? names[p] : "invalid";
}

static void release_count(kvp_session_env_t *n, kvp_proof_t proof, uint64_t count)
{
    KVP_ASSERT((unsigned)proof < KVP_PROOF_COUNT);
    n->releases[proof] += count;
}

void kvp__release_dst(kvp_session_env_t *n, const char *peer, kvp_slot_ref_t dst, bool quarantined,
                      kvp_proof_t proof)
{
    bool suspect = proof == KVP_PROOF_HOLD_CAP; /* no proof: re-verified on acquire */
    kvp_status_t st = quarantined ? kvp_store_release_quarantined(n->store, dst, suspect)
                                  : kvp_store_abandon(n->store, dst);
    KVP_ASSERT(st == KVP_OK); /* the load held this slot at this generation */
    release_count(n, proof, 1);
    KVP_DEBUG(n->name, "peer %s: slot %u gen %u %s -> free (proof=%s)", peer, dst.slot, dst.gen,
              quarantined ? "quarantined" : "filling", kvp__proof_str(proof));
}

kvp_status_t kvp__release_dst_commit(kvp_session_env_t *n, const char *peer, kvp_slot_ref_t dst,
                                     const kvp_digest_t *digest, const kvp_digest_t *actual,
                                     bool verify, kvp_proof_t proof)
{
    kvp_status_t st = verify ? kvp_store_commit_verify_as(n->store, dst, digest, actual)
                             : kvp_store_commit_digest(n->store, dst, digest);
    if (st != KVP_OK)
        return st; /* still FILLING: the caller releases it (kvp__release_dst) */
    release_count(n, proof, 1);
    KVP_DEBUG(n->name, "peer %s: slot %u gen %u filling -> ready (proof=%s)", peer, dst.slot,
              dst.gen, kvp__proof_str(proof));
    return KVP_OK;
}

kvp_status_t kvp__release_dst_lent(kvp_session_env_t *n, const char *peer, kvp_slot_ref_t dst,
                                   const kvp_digest_t *digest, const kvp_digest_t *actual,
                                   bool verify, kvp_proof_t proof)
{
    kvp_status_t st = verify ? kvp_store_verify_as(n->store, dst, digest, actual) : KVP_OK;
    if (st != KVP_OK)
        return st; /* still FILLING: the caller releases it (kvp__release_dst) */
    st = kvp_store_abandon(n->store, dst); /* lent: never indexed, back to the embedding */
    KVP_ASSERT(st == KVP_OK);
    release_count(n, proof, 1);
    KVP_DEBUG(n->name, "peer %s: lent slot %u gen %u filling -> embedding's, verified=%d "
              "(proof=%s)", peer, dst.slot, dst.gen, verify, kvp__proof_str(proof));
    return KVP_OK;
}

void kvp__release_src(kvp_session_env_t *n, kvp_xfer_t *x, kvp_proof_t proof)
{
    for (uint32_t i = 0; i < x->n; i++) {
        kvp_status_t st = kvp_store_unpin(n->store, x->src[i]);
        KVP_ASSERT(st == KVP_OK); /* the store job holds one pin per source slot */
    }
    release_count(n, proof, x->n);
    KVP_DEBUG(n->name, "peer %s: transfer %llu: %u source pins dropped (proof=%s)", x->peer,
              (unsigned long long)x->id, x->n, kvp__proof_str(proof));
    x->n = 0;
}

const char *kvp__supply_why_str(kvp_supply_why_t why)
{
    static const char *const names[KVP_SUPPLY_WHY_COUNT] = {
        [KVP_SUPPLY_ROUND_END] = "round-end",
        [KVP_SUPPLY_PREFIX_CUT] = "prefix-cut",
        [KVP_SUPPLY_REFUSED] = "refused",
        [KVP_SUPPLY_CLOSING] = "closing",
    };
    return (unsigned)why < KVP_SUPPLY_WHY_COUNT ? names[why] : "?";
}

void kvp__release_supply(kvp_session_env_t *n, const char *peer, kvp_slot_ref_t ref,
                         kvp_supply_why_t why)
{
    kvp_status_t st = kvp_store_unpin(n->store, ref);
    KVP_ASSERT(st == KVP_OK); /* the round (or the lookup just made) holds this pin */
    KVP_DEBUG(n->name, "peer %s: slot %u gen %u: supply pin dropped (%s)", peer, ref.slot,
              ref.gen, kvp__supply_why_str(why));
}
