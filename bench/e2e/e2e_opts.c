/*
 * e2e_opts.c -- options of bench/e2e: the presets (full, --quick, --smoke)
 * and the command line that overrides them.
 */
#include "e2e.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>


static int parse_list(const char *s, uint64_t *out, int cap, uint64_t unit)
{
    int n = 0;
    char *end;
    while (*s && n < cap) {
        unsigned long long v = strtoull(s, &end, 10);
        if (end == s || v == 0)
            return -1;
        out[n++] = v * unit;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return -1;
    }
    return *s ? -1 : n;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: e2e_bench [--quick | --smoke] [--path shm|tcp|both] [--sizes KiB,..]\n"
            "                 [--depths K,..] [--req-mib M,..] [--region-mib N] [--secs S]\n"
            "                 [--cks off|on|both] [--lookups N] [--no-ceilings] [--no-plot]\n"
            "                 [--out DIR] [--diag-keep-ms MS] [--steady S] [--hint]\n"
            "                 [--wait-fd] [--wait-spin-us US]\n"
            "  --wait-spin-us: the consumer's wait_spin_us (default: the library's)\n"
            "  --wait-fd: the consumer waits on kvp_node_fd() with poll() and takes events\n"
            "      with kvp_poll_events (an embedding's own event loop) instead of\n"
            "      kvp_wait_events (the waiting thread runs the node's rounds)\n"
            "  --hint: each fetch is one round trip (kvp_fetch with KVP_FETCH_FLAG_HINT: the\n"
            "      source supplies what it holds), no lookup first\n"
            "  --steady S: per consumer, S seconds of unrecorded K=4 fetches before the cells\n"
            "  --diag-keep-ms: diagnostic; after the matrix, shm again with\n"
            "      abort_ack_timeout_ms + abort_resend_ms = MS on both nodes (how long a\n"
            "      source keeps finished rounds; default 12000); rows marked keep-diag\n");
}

static void defaults(e2e_opts_t *o, bool quick, bool smoke)
{
    static const uint32_t full_sizes[] = {16 << 10, 256 << 10, 2 << 20, 4 << 20};
    static const uint32_t full_depths[] = {1, 4, 16, 64};
    static const uint64_t full_reqs[] = {1 << 20, 16 << 20, 64 << 20};
    o->shm = o->tcp = o->plot = o->ceilings = true;
    o->wait_spin_us = -1;
    o->cks_mask = 3;
    o->tcp_req_max_mib = 16;
    o->region = 256ull << 20;
    o->secs = 0.6;
    o->lookups = 3000; /* ~0.2 s: enough samples for a stable p50 on a noisy VM */
    memcpy(o->sizes, full_sizes, sizeof(full_sizes));
    o->nsizes = 4;
    memcpy(o->depths, full_depths, sizeof(full_depths));
    o->ndepths = 4;
    memcpy(o->reqs, full_reqs, sizeof(full_reqs));
    o->nreqs = 3;
    if (quick) { /* ~2 minutes: 16 KiB / 256 KiB / 2 MiB, K 1/4/16 */
        o->region = 64ull << 20;
        o->secs = 0.25;
        o->lookups = 1000;
        o->nsizes = 3;
        o->depths[0] = 1, o->depths[1] = 4, o->depths[2] = 16;
        o->ndepths = 3;
        o->reqs[0] = 1 << 20, o->reqs[1] = 8 << 20;
        o->nreqs = 2;
        o->tcp_req_max_mib = 8;
    }
    if (smoke) { /* ctest: small, bounded, checks bytes, asserts no speed */
        o->tcp = o->plot = o->ceilings = false;
        o->region = 16ull << 20;
        o->sizes[0] = 256 << 10;
        o->nsizes = 1;
        o->depths[0] = 4;
        o->ndepths = 1;
        o->reqs[0] = 1 << 20;
        o->nreqs = 1;
        o->cks_mask = 2;
        o->smoke_fetches = 48;
    }
}

int e2e_parse(int argc, char **argv, e2e_opts_t *o)
{
    static const struct option lo[] = {
        {"quick", 0, 0, 'q'},   {"smoke", 0, 0, 'S'},     {"path", 1, 0, 'p'},
        {"sizes", 1, 0, 'z'},   {"depths", 1, 0, 'd'},    {"req-mib", 1, 0, 'r'},
        {"region-mib", 1, 0, 'R'}, {"secs", 1, 0, 's'},   {"cks", 1, 0, 'c'},
        {"lookups", 1, 0, 'l'}, {"no-ceilings", 0, 0, 'C'}, {"no-plot", 0, 0, 'P'},
        {"out", 1, 0, 'o'},     {"help", 0, 0, 'h'},      {"diag-keep-ms", 1, 0, 'k'}, {"steady", 1, 0, 'y'}, {"hint", 0, 0, 'H'},
        {"wait-fd", 0, 0, 'W'}, {"wait-spin-us", 1, 0, 'U'},
        {0, 0, 0, 0}};
    uint64_t v[E2E_MAX_LIST];
    int ch, n;
    bool quick = false, smoke = false;
    for (int i = 1; i < argc; i++) { /* presets first, then overrides */
        quick |= !strcmp(argv[i], "--quick");
        smoke |= !strcmp(argv[i], "--smoke");
    }
    defaults(o, quick, smoke);
    o->quick = quick;
    o->smoke = smoke;
    while ((ch = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'q': case 'S': break;
        case 'p':
            o->shm = !strcmp(optarg, "shm") || !strcmp(optarg, "both");
            o->tcp = !strcmp(optarg, "tcp") || !strcmp(optarg, "both");
            if (!o->shm && !o->tcp)
                return fprintf(stderr, "e2e: bad --path '%s'\n", optarg), -1;
            break;
        case 'z':
            if ((n = parse_list(optarg, v, E2E_MAX_LIST, 1024)) <= 0)
                return fprintf(stderr, "e2e: bad --sizes '%s'\n", optarg), -1;
            for (int i = 0; i < n; i++) {
                if (v[i] % 4096 || v[i] > (64u << 20))
                    return fprintf(stderr, "e2e: bad block size %llu KiB (4 KiB multiple, <= 64 MiB)\n",
                                   (unsigned long long)v[i] / 1024), -1;
                o->sizes[i] = (uint32_t)v[i];
            }
            o->nsizes = n;
            break;
        case 'd':
            if ((n = parse_list(optarg, v, E2E_MAX_LIST, 1)) <= 0)
                return fprintf(stderr, "e2e: bad --depths '%s'\n", optarg), -1;
            for (int i = 0; i < n; i++)
                if ((o->depths[i] = (uint32_t)v[i]) > 256)
                    return fprintf(stderr, "e2e: --depths at most 256\n"), -1;
            o->ndepths = n;
            break;
        case 'r':
            if ((n = parse_list(optarg, o->reqs, E2E_MAX_LIST, 1u << 20)) <= 0)
                return fprintf(stderr, "e2e: bad --req-mib '%s'\n", optarg), -1;
            o->nreqs = n;
            break;
        case 'R':
            o->region = strtoull(optarg, NULL, 10) << 20;
            if (o->region < (8u << 20) || o->region > (8ull << 30))
                return fprintf(stderr, "e2e: --region-mib 8..8192\n"), -1;
            break;
        case 's':
            o->secs = atof(optarg);
            if (!(o->secs > 0 && o->secs < 600))
                return fprintf(stderr, "e2e: bad --secs\n"), -1;
            break;
        case 'c':
            o->cks_mask = !strcmp(optarg, "off") ? 1 : !strcmp(optarg, "on") ? 2
                         : !strcmp(optarg, "both") ? 3 : 0;
            if (!o->cks_mask)
                return fprintf(stderr, "e2e: bad --cks '%s'\n", optarg), -1;
            break;
        case 'l':
            o->lookups = atoi(optarg);
            if (o->lookups < 1 || o->lookups > 100000)
                return fprintf(stderr, "e2e: bad --lookups\n"), -1;
            break;
        case 'k':
            o->diag_keep_ms = (uint32_t)strtoul(optarg, NULL, 10);
            if (o->diag_keep_ms < 3 || o->diag_keep_ms > 600000)
                return fprintf(stderr, "e2e: --diag-keep-ms 3..600000\n"), -1;
            break;
        case 'y':
            o->steady = atof(optarg);
            if (!(o->steady >= 0 && o->steady < 600))
                return fprintf(stderr, "e2e: bad --steady\n"), -1;
            break;
        case 'H': o->hint = true; break;
        case 'W': o->wait_fd = true; break;
        case 'U':
            o->wait_spin_us = atoi(optarg);
            if (o->wait_spin_us < 0 || o->wait_spin_us > 10000)
                return fprintf(stderr, "e2e: bad --wait-spin-us (0..10000)\n"), -1;
            break;
        case 'C': o->ceilings = false; break;
        case 'P': o->plot = false; break;
        case 'o': snprintf(o->out, sizeof(o->out), "%s", optarg); break;
        default: usage(); return -1;
        }
    }
    if (optind != argc)
        return usage(), -1;
    return 0;
}

