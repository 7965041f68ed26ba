/* sim_main.c -- `kvpeer_sim`: run the simulator over seeds, replay one, or
 * soak for a while. Prints seeds/s, faults injected by kind and violations.
 *   kvpeer_sim [--seeds N] [--seed X] [--steps N] [--nodes N] [--soak SECONDS]
 *              [--mutation M] [--verbose]                                  */
#include "sim.h"

#include "common/common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--seeds N] [--seed X] [--steps N] [--nodes N] [--soak SECONDS]\n"
            "          [--mutation 0..%d] [--verbose]\n",
            argv0, KVP_MUT_COUNT - 1);
    return 2;
}

int main(int argc, char **argv)
{
    sim_opts_t o = {.seed = 1, .nodes = 4, .steps = 600};
    uint64_t seeds = 20, first = 1;
    double soak = 0;
    bool one = false, hashes = false;
    int log_level = KVP_LOG_WARN;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--verbose") == 0) {
            o.verbose = true;
            continue;
        }
        if (strcmp(a, "--hashes") == 0) {
            hashes = true;
            continue;
        }
        if (strcmp(a, "--exact") == 0) {
            o.exact = true;
            continue;
        }
        if (v == NULL)
            return usage(argv[0]);
        i++;
        if (strcmp(a, "--seeds") == 0)
            seeds = strtoull(v, NULL, 0);
        else if (strcmp(a, "--seed") == 0)
            first = strtoull(v, NULL, 0), one = true;
        else if (strcmp(a, "--steps") == 0)
            o.steps = atoi(v);
        else if (strcmp(a, "--nodes") == 0)
            o.nodes = atoi(v);
        else if (strcmp(a, "--soak") == 0)
            soak = atof(v);
        else if (strcmp(a, "--log") == 0)
            log_level = atoi(v);
        else if (strcmp(a, "--mutation") == 0)
            kvp__mutation = atoi(v);
        else
            return usage(argv[0]);
    }
    if (one)
        seeds = 1;
    uint64_t faults[SIM_F_KINDS] = {0}, viol = 0, ran = 0, loads = 0, ok = 0, rounds = 0;
    double t0 = now_s();
    kvp_log_set_level((kvp_log_level_t)log_level);
    for (uint64_t k = 0; soak > 0 ? now_s() - t0 < soak : k < seeds; k++) {
        sim_result_t r;
        o.seed = first + k;
        sim_run(&o, &r);
        ran++;
        viol += r.violations;
        loads += r.loads;
        ok += r.loads_ok;
        rounds += r.rounds;
        for (int f = 0; f < SIM_F_KINDS; f++)
            faults[f] += r.faults[f];
        if (r.violations)
            printf("seed %llu: %llu violations (first at step %d: %s)\n",
                   (unsigned long long)o.seed, (unsigned long long)r.violations,
                   r.violation_step, r.first_violation);
        else if (one || hashes)
            printf("seed %llu: ok, trace hash %016llx\n", (unsigned long long)o.seed,
                   (unsigned long long)r.trace_hash);
    }
    double dt = now_s() - t0;
    printf("sim: %llu seeds in %.1f s (%.2f seeds/s), mutation %s, loads %llu (ok %llu)\n",
           (unsigned long long)ran, dt, (double)ran / dt, kvp_mutation_str(kvp__mutation),
           (unsigned long long)loads, (unsigned long long)ok);
    printf("sim: node rounds %llu (%.0f per seed)\n", (unsigned long long)rounds,
           ran ? (double)rounds / (double)ran : 0.0);
    printf("sim: faults injected:");
    for (int f = 0; f < SIM_F_KINDS; f++)
        printf(" %s=%llu", sim_fault_names[f], (unsigned long long)faults[f]);
    printf("\nsim: violations: %llu\n", (unsigned long long)viol);
    return viol ? 1 : 0;
}
