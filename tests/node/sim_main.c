/* sim_main.c -- `kvpeer_sim`: run the simulator over a seed range, replay one
 * seed, or soak for a while, on one process or several (--jobs, one process
 * per core: seeds first+j, first+j+jobs, ...). Prints seeds/s, wall time,
 * faults injected by kind and violations; exit status 1 on any violation.
 *   kvpeer_sim [--first X] [--seeds N] [--seed X] [--steps N] [--nodes N]
 *              [--soak SECONDS] [--jobs N] [--mutation M] [--until-caught]
 *              [--exact] [--full-quiesce] [--hashes] [--digest] [--log LEVEL] [--verbose] */
#include "sim.h"

#include "common/common.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_JOBS 64

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--first X] [--seeds N] [--seed X] [--steps N] [--nodes N]\n"
            "          [--soak SECONDS] [--jobs N] [--mutation 0..%d] [--until-caught]\n"
            "          [--exact] [--full-quiesce] [--hashes] [--digest] [--log 0..4] [--verbose]\n"
            "          [--profile 1|2] [--external] [--wanted]\n"
            "  --external      every node in external-slots mode (issue 29), a simulated\n"
            "                  embedding owning the region\n"
            "  --wanted        with --external: keys wanted (issue 29 step 2), the embedding\n"
            "                  answers KVP_EV_WANTED\n"
            "  --first X       the seed range starts at X (default 1)\n"
            "  --jobs N        N processes (seeds first+j, first+j+N, ...)\n"
            "  --until-caught  stop at the first seed with a violation (mutation table)\n"
            "  --exact         progress every node every tick (A/B check of the skipping)\n"
            "  --full-quiesce  run the whole quiesce phase, not only until at rest\n"
            "  --digest        one line per seed: its digest (events with their times, result\n"
            "                  counters), to check that a speed change left every run the same\n"
            "  --profile 1|2   workload weights: 1 = issue 7's (the I1 seeds were found\n"
            "                  with it), 2 = with issue 15's scenarios (default)\n",
            argv0, KVP_MUT_COUNT - 1);
    return 2;
}

/* What one process ran (sent to the parent through a pipe with --jobs). */
typedef struct totals {
    uint64_t ran, viol, loads, ok, rounds, seeds_bad, rest_ms;
    uint64_t first_bad; /* lowest seed with a violation, 0 = none */
    uint64_t faults[SIM_F_KINDS];
    double cpu;
    uint64_t exit_released; /* issue 27: slots released by the process-exit proof */
    uint64_t ext[7]; /* issue 29: held, released by proof, by the cap, slot-free;
                      * step 2: wanted ops answered, keys published for them;
                      * slots published once freed by their fetch */
} totals_t;

typedef struct run_cfg {
    sim_opts_t o;
    uint64_t first, seeds, stride;
    double soak, t0;
    bool one, hashes, digest, until_caught;
} run_cfg_t;

static void run_range(const run_cfg_t *c, uint64_t offset, totals_t *t)
{
    sim_opts_t o = c->o;
    double c0 = cpu_s();
    memset(t, 0, sizeof(*t));
    for (uint64_t k = offset; c->soak > 0 ? now_s() - c->t0 < c->soak : k < c->seeds;
         k += c->stride) {
        sim_result_t r;
        o.seed = c->first + k;
        sim_run(&o, &r);
        t->ran++;
        t->viol += r.violations;
        t->loads += r.loads;
        t->ok += r.loads_ok;
        t->ext[0] += r.ext_held;
        t->ext[1] += r.ext_released_proof;
        t->ext[2] += r.ext_released_cap;
        t->ext[3] += r.ext_slot_free;
        t->ext[4] += r.wanted_ops;
        t->ext[5] += r.wanted_published;
        t->ext[6] += r.ext_served_once;
        t->rounds += r.rounds;
        t->rest_ms += r.rest_ms;
        t->exit_released += r.exit_released;
        for (int f = 0; f < SIM_F_KINDS; f++)
            t->faults[f] += r.faults[f];
        if (c->digest)
            printf("seed %llu: digest %016llx violations %llu\n", (unsigned long long)o.seed,
                   (unsigned long long)r.digest, (unsigned long long)r.violations);
        if (r.violations) {
            t->seeds_bad++;
            if (t->first_bad == 0 || o.seed < t->first_bad)
                t->first_bad = o.seed;
            printf("seed %llu: %llu violations (first at step %d: %s)\n",
                   (unsigned long long)o.seed, (unsigned long long)r.violations,
                   r.violation_step, r.first_violation);
            fflush(stdout);
            if (c->until_caught)
                break;
        } else if (c->one || c->hashes) {
            printf("seed %llu: ok, trace hash %016llx\n", (unsigned long long)o.seed,
                   (unsigned long long)r.trace_hash);
        }
        if (c->digest || c->hashes)
            fflush(stdout); /* whole lines: --jobs children share the pipe */
    }
    t->cpu = cpu_s() - c0;
}

static void add(totals_t *sum, const totals_t *t)
{
    sum->ran += t->ran;
    sum->viol += t->viol;
    sum->loads += t->loads;
    sum->ok += t->ok;
    sum->rounds += t->rounds;
    sum->rest_ms += t->rest_ms;
    sum->exit_released += t->exit_released;
    sum->seeds_bad += t->seeds_bad;
    if (t->first_bad && (sum->first_bad == 0 || t->first_bad < sum->first_bad))
        sum->first_bad = t->first_bad;
    for (int f = 0; f < SIM_F_KINDS; f++)
        sum->faults[f] += t->faults[f];
    sum->cpu += t->cpu;
    for (int k = 0; k < (int)(sizeof sum->ext / sizeof sum->ext[0]); k++)
        sum->ext[k] += t->ext[k];
}

/* One child per job; each writes its totals to its pipe. */
static int run_jobs(run_cfg_t *c, int jobs, totals_t *sum)
{
    pid_t pid[MAX_JOBS];
    int fd[MAX_JOBS];
    c->stride = (uint64_t)jobs;
    fflush(stdout);
    for (int j = 0; j < jobs; j++) {
        int p[2];
        if (pipe(p) != 0 || (pid[j] = fork()) < 0) {
            fprintf(stderr, "kvpeer_sim: cannot start job %d: %s\n", j, strerror(errno));
            return -1;
        }
        if (pid[j] == 0) {
            totals_t t;
            close(p[0]);
            run_range(c, (uint64_t)j, &t);
            fflush(stdout);
            ssize_t w = write(p[1], &t, sizeof(t));
            _exit(w == (ssize_t)sizeof(t) ? 0 : 3);
        }
        close(p[1]);
        fd[j] = p[0];
    }
    int bad = 0;
    for (int j = 0; j < jobs; j++) {
        totals_t t;
        int status = 0;
        ssize_t got = read(fd[j], &t, sizeof(t));
        close(fd[j]);
        waitpid(pid[j], &status, 0);
        if (got != (ssize_t)sizeof(t) || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "kvpeer_sim: job %d died (status %d)\n", j, status);
            bad = -1;
            continue;
        }
        add(sum, &t);
    }
    return bad;
}

int main(int argc, char **argv)
{
    run_cfg_t c = {.o = {.seed = 1, .nodes = 4, .steps = 600}, .first = 1, .seeds = 20,
                   .stride = 1};
    int log_level = -1, jobs = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool *flag = strcmp(a, "--verbose") == 0        ? &c.o.verbose
                     : strcmp(a, "--hashes") == 0       ? &c.hashes
                     : strcmp(a, "--digest") == 0       ? &c.digest
                     : strcmp(a, "--exact") == 0        ? &c.o.exact
                     : strcmp(a, "--until-caught") == 0 ? &c.until_caught
                     : strcmp(a, "--full-quiesce") == 0 ? &c.o.full_quiesce
                     : strcmp(a, "--external") == 0     ? &c.o.external
                     : strcmp(a, "--wanted") == 0       ? &c.o.wanted
                                                        : NULL;
        if (flag != NULL) {
            *flag = true;
            continue;
        }
        if (v == NULL)
            return usage(argv[0]);
        i++;
        char *end = NULL;
        errno = 0;
        unsigned long long n = strtoull(v, &end, 0);
        bool num_ok = errno == 0 && end != v && *end == '\0';
        if (strcmp(a, "--soak") == 0) {
            c.soak = atof(v);
            num_ok = c.soak > 0;
        } else if (strcmp(a, "--seeds") == 0) {
            c.seeds = n;
        } else if (strcmp(a, "--first") == 0) {
            c.first = n;
        } else if (strcmp(a, "--seed") == 0) {
            c.first = n;
            c.one = true;
        } else if (strcmp(a, "--steps") == 0) {
            c.o.steps = (int)n;
            num_ok &= n > 0 && n <= 1000000;
        } else if (strcmp(a, "--nodes") == 0) {
            c.o.nodes = (int)n;
            num_ok &= n >= 3 && n <= 8;
        } else if (strcmp(a, "--jobs") == 0) {
            jobs = (int)n;
            num_ok &= n >= 1 && n <= MAX_JOBS;
        } else if (strcmp(a, "--profile") == 0) {
            c.o.profile = n == 1 ? SIM_PROFILE_V1 : SIM_PROFILE_V2;
            num_ok &= n == 1 || n == 2;
        } else if (strcmp(a, "--log") == 0) {
            log_level = (int)n;
            num_ok &= n <= KVP_LOG_TRACE;
        } else if (strcmp(a, "--mutation") == 0) {
            kvp__mutation = (int)n;
            num_ok &= n < KVP_MUT_COUNT;
        } else {
            return usage(argv[0]);
        }
        if (!num_ok) {
            fprintf(stderr, "kvpeer_sim: bad value for %s: '%s'\n", a, v);
            return usage(argv[0]);
        }
    }
    if (c.one)
        c.seeds = 1, jobs = 1;
    /* The simulator's log sink reads ERROR lines (hold-cap releases,
     * completions for unknown transfers) and prints lines only with
     * --verbose: without it, lines below ERROR would be formatted for
     * nothing. */
    if (log_level < 0)
        log_level = c.o.verbose ? KVP_LOG_WARN : KVP_LOG_ERROR;
    kvp_log_set_level((kvp_log_level_t)log_level);
    totals_t sum = {0};
    c.t0 = now_s();
    if (jobs == 1) {
        run_range(&c, 0, &sum);
    } else if (run_jobs(&c, jobs, &sum) != 0) {
        return 2;
    }
    double dt = now_s() - c.t0;
    printf("sim: %llu seeds (first %llu) x %d steps, %d nodes, profile v%d, in %.1f s wall with "
           "%d job%s: %.1f seeds/s (%.1f seeds/s per core: %.1f s CPU), mutation %s\n",
           (unsigned long long)sum.ran, (unsigned long long)c.first, c.o.steps,
           KVP_MAX(3, KVP_MIN(c.o.nodes, 8)), c.o.profile == SIM_PROFILE_V1 ? 1 : 2, dt, jobs,
           jobs > 1 ? "s" : "",
           dt > 0 ? (double)sum.ran / dt : 0.0, sum.cpu > 0 ? (double)sum.ran / sum.cpu : 0.0,
           sum.cpu, kvp_mutation_str(kvp__mutation));
    if (c.o.external)
        printf("sim: external slots (issue 29): slots held past the outcome %llu, released by "
               "proof %llu, by the hold cap %llu; unpublished slots freed at the last unpin %llu "
               "(published once, by their fetch: %llu)\n",
               (unsigned long long)sum.ext[0], (unsigned long long)sum.ext[1],
               (unsigned long long)sum.ext[2], (unsigned long long)sum.ext[3],
               (unsigned long long)sum.ext[6]);
    if (c.o.external && c.o.wanted)
        printf("sim: keys wanted (issue 29 step 2): WANTED ops answered %llu, keys published "
               "for them %llu\n",
               (unsigned long long)sum.ext[4], (unsigned long long)sum.ext[5]);
    printf("sim: loads %llu (ok %llu), node rounds %.0f per seed, at rest %.0f ms into the "
           "quiesce on average\n",
           (unsigned long long)sum.loads, (unsigned long long)sum.ok,
           sum.ran ? (double)sum.rounds / (double)sum.ran : 0.0,
           sum.ran ? (double)sum.rest_ms / (double)sum.ran : 0.0);
    printf("sim: quarantined slots released by a source's process exit: %llu\n",
           (unsigned long long)sum.exit_released);
    printf("sim: faults injected:");
    for (int f = 0; f < SIM_F_KINDS; f++)
        printf(" %s=%llu", sim_fault_names[f], (unsigned long long)sum.faults[f]);
    printf("\nsim: violations: %llu in %llu seeds", (unsigned long long)sum.viol,
           (unsigned long long)sum.seeds_bad);
    if (sum.first_bad)
        printf(" (first seed with one: %llu)", (unsigned long long)sum.first_bad);
    printf("\n");
    return sum.viol ? 1 : 0;
}
