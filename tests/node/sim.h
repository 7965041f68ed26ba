/*
 * sim.h -- the deterministic simulator (issue 7): N nodes in one process on a
 * virtual clock over the fake control network and the fake data transport.
 * A workload generator drives the public API and injects faults; everything
 * derives from one 64-bit seed, so a seed replays bit for bit. An invariant
 * checker runs after every step (I1-I5 of SPEC §7, the landing checker
 * feeding I1/I2; a landing in a destination the hold cap released, or a
 * copy reading a source it unpinned, is the allowed exception).
 *
 * Speed (issue 15): a node's round runs only when something is due for it,
 * ticks before the next due time are skipped, the quiesce phase stops once
 * everything is at rest; opts.exact / full_quiesce run everything, for A/B
 * checks (same trace hash, same violations).
 */
#ifndef KVP_SIM_H
#define KVP_SIM_H

#include <stdbool.h>
#include <stdint.h>

enum {
    SIM_F_KILL = 0,      /* a node's connections reset (process death seen by peers) */
    SIM_F_RESTART,       /* a node destroyed and recreated under the same peer id */
    SIM_F_PARTITION,     /* two nodes cut (heals later) */
    SIM_F_GRACEFUL,      /* peer removed gracefully */
    SIM_F_WEDGE,         /* a transfer that never ends (optionally copying late) */
    SIM_F_LATE,          /* terminal early, bytes land late */
    SIM_F_FAIL,          /* transfer fails (part copied) */
    SIM_F_SUBMIT,        /* submit fails */
    SIM_F_EP_ERROR,      /* consumer endpoint error */
    SIM_F_CANCEL,        /* the engine cancels a load */
    SIM_F_FINISH,        /* the engine finishes a request */
    SIM_F_RACE_PARTITION, /* a fetch held by a partition, the session closed, healed */
    SIM_F_PARKED_LATE,   /* parked demand served after the consumer gave up (partition) */
    SIM_F_EP_TEARDOWN,   /* an endpoint error while the session is being torn down */
    SIM_F_STALE_FRAME,   /* a FETCH_DONE of another incarnation (forged epochs) */
    SIM_F_PAST_CAP,      /* a WRITE landing after the hold cap released its slots */
    SIM_F_KINDS,
};

extern const char *const sim_fault_names[SIM_F_KINDS];

enum { SIM_PROFILE_V2 = 0, SIM_PROFILE_V1 = 1 };

typedef struct sim_opts {
    uint64_t seed;
    int nodes;      /* 3..8 */
    int steps;      /* workload steps before the quiesce phase */
    bool verbose;
    /* Progress every node in every pass of every tick, as before the
     * simulator skipped rounds with nothing due (A/B check: same trace). */
    bool exact;
    /* Run the whole quiesce phase instead of stopping once at rest. */
    bool full_quiesce;
    /* Workload weights: SIM_PROFILE_V1 is the generator that found the I1
     * seeds of issue 15 (their named regressions replay with it);
     * SIM_PROFILE_V2 (the default, 0) adds the scenarios those seeds hit. */
    int profile;
    /* Issue 29: every node in external-slots mode, driven by a simulated
     * embedding that owns the region (kvp_publish / kvp_unpublish /
     * kvp_fetch_into; sim_ext.c's rules). */
    bool external;
    /* Issue 29 step 2: with external, "keys wanted" too (external_wanted):
     * the simulated embedding answers KVP_EV_WANTED by publishing some of
     * the keys and (mostly) kvp_wanted_done; every LOOKUP hit must be a key
     * the source's embedding published. */
    bool wanted;
} sim_opts_t;

typedef struct sim_result {
    uint64_t violations;      /* invariant violations (0 on correct code) */
    uint64_t faults[SIM_F_KINDS];
    uint64_t loads, loads_ok, lookups, puts;
    uint64_t trace_hash;      /* every event observed, final stats: replay check */
    /* trace_hash plus every event's virtual time and fields and the result
     * counters (not rounds/store_checks, which measure the simulator's own
     * work): the A/B check that a speed change left every run the same. */
    uint64_t digest;
    uint64_t rounds;          /* node poll rounds run */
    uint64_t store_checks;    /* full store validations run */
    uint64_t rest_ms;         /* quiesce time until at rest (0: never) */
    uint64_t posted_fenced;   /* WRITEs posted after the consumer's fence (issue 15) */
    uint64_t post_cap_landings; /* blocks landed in destinations the hold cap released */
    /* issue 27: quarantined slots released because their source's process
     * exited (its fake transport closed: a restarted node), before the cap */
    uint64_t exit_released;
    /* External mode (issue 29): load slots held past the outcome
     * (block_status BUSY), released later by proof / by the hold cap, and
     * unpublished slots freed at their last unpin (KVP_EV_SLOT_FREE). */
    uint64_t ext_held, ext_released_proof, ext_released_cap, ext_slot_free;
    uint64_t ext_served_once; /* of those: published once, unpublished by its fetch */
    /* Wanted mode: KVP_EV_WANTED ops answered, keys published for them. */
    uint64_t wanted_ops, wanted_published;
    char first_violation[512];
    int violation_step;
} sim_result_t;

/* Run one seed. Never aborts on a violation: it is reported in the result
 * (with the step and a short trace printed to stderr). */
void sim_run(const sim_opts_t *o, sim_result_t *r);

#endif
