/*
 * ucx_path.c -- which data path did UCX select for an endpoint? Parsed from
 * ucp_ep_print_info() (lane lines and put[] RMA lanes) plus whether
 * ucp_rkey_ptr() works on the peer's rkey (the region is UCX-allocated shm we
 * can map). UCX-NOTES §2: a direct put needs both a shm RMA lane AND a
 * UCX-allocated shm region; everything else is software RMA over the AM lane.
 */
#include "transport/ucx_int.h"

#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------- data-path check */

static bool ucx_tl_is_shm(const char *tl)
{
    return !strncmp(tl, "posix", 5) || !strncmp(tl, "sysv", 4) || !strncmp(tl, "xpmem", 5) ||
           !strncmp(tl, "knem", 4) || !strncmp(tl, "cma", 3);
}

static bool ucx_tl_is_rdma(const char *tl)
{
    return !strncmp(tl, "rc", 2) || !strncmp(tl, "dc", 2) || !strncmp(tl, "ud", 2);
}

typedef struct ucx_lane_info {
    char tl[8][40]; /* "posix/memory" per lane index */
    bool am[8], rma[8], ka[8];
} ucx_lane_info_t;

/* Parse ucp_ep_print_info(): "lane[i]: n:tl/dev.k md[..] -> ... am ... keepalive"
 * and "put[i]: ..." (lane i is an RMA lane). */
static void ucx_lanes_parse(char *text, ucx_lane_info_t *li)
{
    char *save = NULL;

    memset(li, 0, sizeof(*li));
    for (char *ln = strtok_r(text, "\n", &save); ln; ln = strtok_r(NULL, "\n", &save)) {
        unsigned i;
        char *s = strstr(ln, "lane[");
        if (s && sscanf(s, "lane[%u]:", &i) == 1 && i < 8) {
            char *c = strchr(s, ':');
            c = c ? strchr(c + 1, ':') : NULL; /* after "n:" */
            if (c && sscanf(c + 1, "%39[^. ]", li->tl[i]) != 1)
                li->tl[i][0] = '\0';
            char *arrow = strstr(s, "->");
            li->am[i] = arrow && strstr(arrow, " am") != NULL;
            li->ka[i] = arrow && strstr(arrow, "keepalive") != NULL;
            continue;
        }
        s = strstr(ln, "put[");
        if (s && sscanf(s, "put[%u]:", &i) == 1 && i < 8)
            li->rma[i] = true;
    }
}

static kvp_data_path_t ucx_path_classify(const ucx_lane_info_t *li, bool rkey_ptr_ok, char *sum,
                                         size_t cap)
{
    kvp_data_path_t path = KVP_PATH_UNKNOWN, am_path = KVP_PATH_UNKNOWN;
    size_t off = 0;

    for (int i = 0; i < 8 && off < cap; i++) {
        if (!li->tl[i][0])
            continue;
        off += (size_t)snprintf(
            sum + off, cap - off, "%s%s%s%s(%s)", off ? " " : "", li->rma[i] ? "rma" : "",
            li->am[i] ? (li->rma[i] ? "+am" : "am") : "", li->ka[i] ? "+ka" : "", li->tl[i]);
        if (li->rma[i] && ucx_tl_is_rdma(li->tl[i]))
            path = KVP_PATH_RDMA;
        else if (li->rma[i] && ucx_tl_is_shm(li->tl[i]) && rkey_ptr_ok && path == KVP_PATH_UNKNOWN)
            path = KVP_PATH_DIRECT_SHM;
        if (li->am[i] && am_path == KVP_PATH_UNKNOWN)
            am_path = !strncmp(li->tl[i], "tcp", 3) ? KVP_PATH_TCP
                      : ucx_tl_is_shm(li->tl[i])    ? KVP_PATH_EMULATED_SHM
                      : ucx_tl_is_rdma(li->tl[i])   ? KVP_PATH_RDMA
                                                    : KVP_PATH_UNKNOWN;
    }
    if (off < cap)
        snprintf(sum + off, cap - off, " rkey_ptr=%s", rkey_ptr_ok ? "ok" : "no");
    return path != KVP_PATH_UNKNOWN ? path : am_path; /* else: rma_am over the AM lane */
}

/* Which lanes did UCX select for this endpoint? Logged once per peer. */
void kvp__ucx_peer_classify(ucx_xport_t *x, ucx_peer_t *p)
{
    char *text = NULL;
    size_t tlen = 0;
    void *ptr = NULL;
    ucx_lane_info_t li;
    FILE *f = open_memstream(&text, &tlen);

    p->rkey_ptr_ok = ucp_rkey_ptr(p->rkey, p->rbase, &ptr) == UCS_OK;
    if (p->rkey_ptr_ok) {
        /* Direct shm: our puts are memcpys into the peer's segment mapped
         * here. Fault that mapping in now, in one batched call, instead of one
         * page fault per 4 KiB inside the first put into each slot (30-60 us
         * each on this VM). Best effort; nothing depends on it. */
        uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
        uintptr_t start = (uintptr_t)ptr & ~(page - 1);
        size_t len = (size_t)p->layout.num_blocks * p->layout.block_size;
        if (madvise((void *)start, len + ((uintptr_t)ptr - start), MADV_POPULATE_WRITE) != 0)
            KVP_DEBUG(PFX(x), "peer %llu: pre-fault of its segment failed",
                      (unsigned long long)p->id);
    }
    if (!f) {
        p->path = p->inbound = KVP_PATH_UNKNOWN;
        snprintf(p->lanes, sizeof(p->lanes), "unknown (open_memstream failed)");
    } else {
        ucp_ep_print_info(p->ep, f);
        fclose(f);
        ucx_lanes_parse(text ? text : (char *)"", &li);
        free(text); /* open_memstream's buffer comes from libc malloc */
        p->path = ucx_path_classify(&li, p->rkey_ptr_ok, p->lanes, sizeof(p->lanes));
        /* The peer's lanes to us mirror ours; whether its puts can be direct
         * depends on OUR region being UCX (shm) allocated. */
        char scratch[sizeof(p->lanes)];
        p->inbound = ucx_path_classify(&li, x->region_kind == REGION_UCX, scratch, sizeof(scratch));
    }
    KVP_INFO(PFX(x), "peer %llu: data path %s [%s]%s", (unsigned long long)p->id,
             kvp_data_path_str(p->path), p->lanes, p->same_host ? " (same host)" : "");
    if (p->same_host && p->path == KVP_PATH_TCP)
        KVP_WARN(PFX(x),
                 "peer %llu is on THIS host but its data path is tcp (%s): shared "
                 "memory unavailable (UCX_TLS, shm error handling or /dev/shm size); "
                 "expect ~20-40x lower bandwidth",
                 (unsigned long long)p->id, p->lanes);
    else if (p->same_host && p->path == KVP_PATH_EMULATED_SHM)
        KVP_WARN(PFX(x),
                 "peer %llu: same-host puts are emulated over shm active messages "
                 "(region not UCX-allocated?) [%s]",
                 (unsigned long long)p->id, p->lanes);
}
