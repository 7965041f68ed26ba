/*
 * ucx_cma.c -- direct-cma (issue 29 item 4): a same-host source writes the
 * blocks straight into a consumer region that UCX did not allocate (an
 * embedding's memory, e.g. vLLM's mmap of /dev/shm files), with one copy
 * from its own memory: process_vm_writev(2), what UCX's `cma` transport
 * does, but called by kvpeer (docs/DESIGN.md "direct-cma" says why not
 * UCX's: its cma endpoint writes into the pid the PEER's worker address
 * names, and a put into memory UCX did not allocate is emulated by UCX
 * over active messages, which aborts the target when the source dies).
 *
 * Who may be written into, and where (every rule checked here):
 *   - only a consumer whose blob (authenticated, HELLO_ACK) offers it (bit
 *     1: its region is not UCX shared memory, shm transports on, its pcred
 *     listener and probe segment exist, direct-cma allowed there), from a
 *     source whose blob says it writes direct-cma (bit 2) and that marked
 *     the consumer's probe segment. That mark is written pending (a value
 *     the consumer does not take as proof) and made final only once the
 *     checks below passed (ucx.c, add_peer): the consumer then sees the
 *     source proven and trusts its FETCH_DONE without seeing blocks land,
 *     so from then on every write to it is direct-cma or refused (nothing
 *     written), never our AM path (an AM block could land after the
 *     commit). A source that fails them (the consumer in another network
 *     namespace sharing /dev/shm, another uid, Yama) leaves the mark
 *     pending and writes by AM: never proven, it is waited for to land;
 *   - only a process the kernel names: the pid of the consumer's pcred
 *     listener from SO_PEERCRED on our own connection to it (pcred.c; same
 *     uid, same pid namespace), never the pid in its blob; a pidfd taken on
 *     it, then process_vm_readv of OUR mark at the place of the consumer's
 *     probe segment where we wrote it (its address from the blob): that
 *     process maps the very segment we share with the consumer, and the
 *     pidfd, still not readable after the read, names that process;
 *   - only while the consumer is PROVEN same host (its mark, bound to this
 *     control connection, in our probe segment: kvp__ucx_peer_proven), so a
 *     relayed blob of another node gets no write (refused);
 *   - only while its pidfd is not readable (the process has not exited),
 *     checked right before each process_vm_writev. The window left: the
 *     process exits, is reaped and its pid reused by another process of
 *     our uid between that poll and the syscall (microseconds; the write
 *     then goes to the addresses of the consumer's region in that process,
 *     or fails with EFAULT);
 *   - only inside [region, region + len) of the blob and slots below its
 *     num_blocks: checked for every block before the first syscall, so a
 *     refused write wrote nothing.
 * A syscall that fails (EFAULT: the region unmapped; ESRCH: gone; EPERM)
 * or writes short fails the transfer (FAILED, its outcome unknown to the
 * consumer): never a crash, never a retry.
 *
 * A write goes to the transport's writer thread (ucx_cma_writer.c): the
 * node thread goes on serving its other peers while it is written. A write
 * (or slice) of KVP_HELPER_SPLIT_BYTES or more is split in two halves of its
 * blocks, the second written by the helper thread (helper.c) at the same
 * time: one process_vm_writev stream copies at ~2/3 of what two do here
 * (docs/DESIGN.md "direct-cma"). Every rule above holds for each half (the
 * bounds before either starts, the pidfd before each syscall); the write is
 * done once both returned, and fails once if either failed.
 * KVPEER_HELPER_THREAD=0: one stream.
 *
 * The consumer cannot fence or refuse such a write: it is treated exactly
 * as direct shm (inbound DIRECT_CMA: not refusable, no fence proof,
 * FETCH_DONE trusted only from a proven peer, quarantined slots released
 * by FETCH_DONE / ABORT_ACK, the process-exit proof or the hold cap).
 */
#include "transport/ucx_int.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

/* The writer's nice, relative to the node's: its bulk copies give way to the threads that answer
 * peers (the node threads of both sides) and to the engine's own
 * (python/bench/serve_fairness.py: another peer's LOOKUP p99 at the source
 * 1.1 -> 0.08 ms while a consumer fetches; cma_bench the same at 0 and 10;
 * docs/DESIGN.md "The writer's priority"). */
#define KVP_CMA_NICE_DEFAULT 10

#define CMA_IOV 256 /* iovecs per process_vm_writev (the kernel takes up to 1024) */

void kvp__ucx_cma_open(ucx_xport_t *x)
{
    kvp_list_init(&x->cma_jobs); /* the writer's (ucx_cma_writer.c) */
    kvp_list_init(&x->cma_done);
    x->cma_gate = SIZE_MAX;
    /* KVPEER_CMA_SLICE_KIB: the writer's slice (ucx_cma_writer.c); unset,
     * 0 or not a number: a whole write at once */
    const char *sl = getenv("KVPEER_CMA_SLICE_KIB");
    char *end = NULL;
    unsigned long kib = sl != NULL ? strtoul(sl, &end, 10) : 0;
    x->cma_slice = sl == NULL || end == sl || *end != '\0' || kib == 0 || kib > (1ul << 30)
                       ? SIZE_MAX
                       : (size_t)kib << 10;
    /* KVPEER_CMA_NICE: the writer's and its helper's nice above the
     * node's, 0..19 (0: the node's priority); unset: 10; anything else: 10,
     * logged */
    const char *ni = getenv("KVPEER_CMA_NICE");
    long nice = ni != NULL ? strtol(ni, &end, 10) : KVP_CMA_NICE_DEFAULT;
    if (ni != NULL && (end == ni || *end != '\0' || nice < 0 || nice > 19)) {
        KVP_WARN(PFX(x), "KVPEER_CMA_NICE is not a number 0..19: the writer runs at nice +%d",
                 KVP_CMA_NICE_DEFAULT);
        nice = KVP_CMA_NICE_DEFAULT;
    }
    x->cma_nice = (int)nice;
    const char *e = getenv("KVPEER_UCX_CMA");
    kvp_ratelimit_init(&x->rl_cma, KVP_NSEC_PER_SEC, 10);
    x->cma_ok = !(e != NULL && strcmp(e, "0") == 0);
    if (!x->cma_ok) {
        KVP_INFO(PFX(x), "direct-cma off (KVPEER_UCX_CMA=0)");
        return;
    }
    /* No pidfd_open (Linux < 5.3, valgrind 3.19): no process can be proven
     * alive: neither offered nor written (a bound source could only refuse). */
    int self = kvp__pidfd_open((int)getpid());
    if (self < 0) {
        x->cma_ok = false;
        KVP_INFO(PFX(x), "direct-cma off: pidfd_open: %s", strerror(errno));
        return;
    }
    close(self);
    /* Yama: with ptrace_scope >= 1 a same-uid sibling may not write into us
     * unless we name it (PR_SET_PTRACER takes one pid): not offered. */
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
    if (f != NULL) {
        int v = -1;
        if (fscanf(f, "%d", &v) != 1)
            v = -1;
        fclose(f);
        if (v != 0) {
            x->cma_ok = false;
            KVP_INFO(PFX(x), "direct-cma off: kernel.yama.ptrace_scope=%d (same-host writes "
                             "into memory UCX did not allocate go by active messages)", v);
        }
    }
}

uint32_t kvp__ucx_cma_flags(ucx_xport_t *x)
{
    x->cma_out = x->cma_ok && x->shm_enabled && x->pcred != NULL;
    x->cma_in = x->cma_out && x->region_kind != REGION_UCX && x->region_kind != REGION_NONE &&
                x->probe_cells != NULL;
    return (x->cma_in ? 2u : 0u) | (x->cma_out ? 4u : 0u);
}

bool kvp__ucx_cma_bound(const ucx_xport_t *x, const ucx_peer_t *p)
{
    return x->cma_out && p->cma_offered && p->mark_cell != NULL;
}

/* Readable pidfd: the process exited (or the poll failed: treated alike). */
static bool cma_exited(int pidfd)
{
    struct pollfd pf = {.fd = pidfd, .events = POLLIN};
    return poll(&pf, 1, 0) != 0;
}

void kvp__ucx_cma_add_peer(ucx_xport_t *x, ucx_peer_t *p, int lpid)
{
    if (!kvp__ucx_cma_bound(x, p) || p->cma_pidfd >= 0)
        return;
    const char *why = NULL;
    int fd = lpid > 0 && p->mark_raddr != 0 ? kvp__pidfd_open(lpid) : -1;
    if (fd < 0) {
        /* Our mark stays pending (ucx.c): it never sees us proven, so it
         * waits for our writes to land, and they go by active messages. */
        KVP_WARN(PFX(x), "peer %llu: direct-cma impossible (%s): our writes to it go by active "
                 "messages", (unsigned long long)p->id,
                 lpid <= 0 ? "no pid from its unix listener (another network namespace?)"
                           : strerror(errno));
        return;
    }
    uint64_t got = 0;
    struct iovec l = {.iov_base = &got, .iov_len = sizeof(got)};
    struct iovec r = {.iov_base = (void *)(uintptr_t)p->mark_raddr, .iov_len = sizeof(got)};
    ssize_t n = process_vm_readv(lpid, &l, 1, &r, 1, 0);
    int err = errno;
    if (n != (ssize_t)sizeof(got))
        why = err == EPERM ? "the kernel does not let us write into its process (ptrace "
                             "access: another uid, not dumpable, or a Yama scope)"
                           : "its process does not map its probe segment where its blob says";
    else if (got != p->mark_put)
        why = "the process behind its listener does not hold our mark";
    else if (cma_exited(fd))
        why = "its process exited";
    if (why != NULL) {
        KVP_WARN(PFX(x), "peer %llu: direct-cma impossible (%s): our writes to it go by active "
                 "messages", (unsigned long long)p->id, why);
        close(fd);
        return;
    }
    p->cma_pid = lpid;
    p->cma_pidfd = fd;
    KVP_DEBUG(PFX(x), "peer %llu: direct-cma target pid %d (SO_PEERCRED, pidfd)",
              (unsigned long long)p->id, lpid);
}

void kvp__ucx_cma_remove_peer(ucx_peer_t *p)
{
    kvp__ucx_cma_drop(p->x, p, NULL, true); /* before its pidfd goes: nothing more written */
    if (p->cma_pidfd >= 0)
        close(p->cma_pidfd);
    p->cma_pidfd = -1;
}

int kvp__ucx_cma_ready(ucx_xport_t *x, ucx_peer_t *p)
{
    if (p->cma_pidfd < 0 || !kvp__ucx_peer_proven(x, p))
        return -1;
    return cma_exited(p->cma_pidfd) ? -1 : 1;
}

/* Every block inside the consumer's region (its blob): slot below its
 * num_blocks, bytes inside [rbase, rbase + rlen). */
static bool cma_bounds_ok(const ucx_peer_t *p, const kvp_xfer_block_t *blocks, size_t n,
                          size_t bs)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t off = (uint64_t)blocks[i].dst_slot * bs;
        if (blocks[i].dst_slot >= p->layout.num_blocks || off + bs > p->rlen ||
            p->rbase + off + bs < p->rbase)
            return false;
    }
    return true;
}

/* One thread's share of a write: blocks [0, n) in syscalls of up to CMA_IOV
 * runs of adjacent (src, dst) slots. Reads only what is fixed while the
 * write is posted (our region, the peer's pid, pidfd and rbase), writes only
 * its own res: safe on any thread. Stops at the first failed or short
 * syscall. */
typedef struct cma_part {
    const ucx_xport_t *x;
    const ucx_peer_t *p;
    const kvp_xfer_block_t *blocks;
    size_t n;
    kvp_cma_res_t res;
} cma_part_t;

static void cma_part_fail(kvp_cma_res_t *res, int err, size_t done, size_t want)
{
    res->err = err;
    res->fail_done = done;
    res->fail_want = want;
    res->failed = true;
}

static void cma_write_part(void *arg)
{
    cma_part_t *w = arg;
    const size_t bs = w->x->layout.block_size;
    struct iovec lv[CMA_IOV], rv[CMA_IOV];
    for (size_t i = 0; i < w->n;) {
        size_t k = 0, want = 0;
        while (i < w->n && k < CMA_IOV) {
            const kvp_xfer_block_t *b = &w->blocks[i];
            size_t run = 1;
            while (i + run < w->n && b[run].src_slot == b->src_slot + run &&
                   b[run].dst_slot == b->dst_slot + run)
                run++;
            lv[k].iov_base = (uint8_t *)w->x->region + (size_t)b->src_slot * bs;
            rv[k].iov_base = (void *)(uintptr_t)(w->p->rbase + (uint64_t)b->dst_slot * bs);
            lv[k].iov_len = rv[k].iov_len = run * bs;
            want += run * bs;
            k++;
            i += run;
        }
        /* Right before each syscall: the process is still the one we proved
         * (its pidfd not readable), so its pid is not anyone else's. */
        if (cma_exited(w->p->cma_pidfd)) {
            cma_part_fail(&w->res, ESRCH, 0, want);
            return;
        }
        ssize_t got = process_vm_writev(w->p->cma_pid, lv, (unsigned long)k, rv,
                                        (unsigned long)k, 0);
        int err = got < 0 ? errno : 0;
        w->res.syscalls++;
        if (got > 0) {
            w->res.bytes += (uint64_t)got;
            w->res.posted++; /* something reached its memory */
        }
        if (got != (ssize_t)want) {
            cma_part_fail(&w->res, err, got > 0 ? (size_t)got : 0, want);
            return;
        }
    }
}

void kvp__ucx_cma_close(ucx_xport_t *x)
{
    kvp__ucx_cma_writer_stop(x); /* its writes dropped, the one running returned */
    kvp__helper_fini(&x->cma_helper);
}

size_t kvp__ucx_cma_post(ucx_xport_t *x, ucx_peer_t *p, ucx_xfer_t *r,
                         const kvp_xfer_block_t *blocks, size_t n)
{
    if (!cma_bounds_ok(p, blocks, n, x->layout.block_size)) {
        r->first_err = UCS_ERR_INVALID_PARAM;
        return 0; /* nothing written */
    }
    if (kvp__ucx_cma_queue(x, p, r, blocks, n))
        return 1; /* the writer's request: the transfer exists */
    /* No writer (or no memory for its job): on this thread, now; with the
     * helper only if no writer may be using it */
    kvp_cma_res_t res = {0};
    kvp__ucx_cma_write_raw(x, p, blocks, n, x->cma_writer_on ? NULL : &x->cma_helper, &res);
    return kvp__ucx_cma_fold(x, p, r, &res);
}

void kvp__ucx_cma_write_raw(const ucx_xport_t *x, const ucx_peer_t *p,
                            const kvp_xfer_block_t *blocks, size_t n, kvp_helper_t **helper,
                            kvp_cma_res_t *res)
{
    const size_t bs = x->layout.block_size;
    size_t h = n >= 2 && n * bs >= KVP_HELPER_SPLIT_BYTES ? n / 2 : n;
    cma_part_t w[2] = {{.x = x, .p = p, .blocks = blocks, .n = h},
                       {.x = x, .p = p, .blocks = blocks + h, .n = n - h}};
    bool split = h < n && helper != NULL &&
                 kvp__helper_post(helper, PFX(x), cma_write_part, &w[1]);
    if (!split) { /* no helper thread: all of it on ours */
        w[0].n = n;
        w[1].n = 0;
    }
    cma_write_part(&w[0]);
    if (split)
        kvp__helper_wait(*helper); /* done only once both halves returned */
    for (int i = 0; i < 2; i++) {
        res->syscalls += w[i].res.syscalls;
        res->bytes += w[i].res.bytes;
        res->posted += w[i].res.posted;
    }
    /* one failure per write: the first half's if both failed */
    const kvp_cma_res_t *f = w[0].res.failed ? &w[0].res : w[1].res.failed ? &w[1].res : NULL;
    if (f != NULL && !res->failed)
        cma_part_fail(res, f->err, f->fail_done, f->fail_want);
}

size_t kvp__ucx_cma_fold(ucx_xport_t *x, const ucx_peer_t *p, ucx_xfer_t *r,
                         const kvp_cma_res_t *res)
{
    x->st.cma_writes += res->syscalls;
    x->st.cma_bytes += res->bytes;
    if (res->failed) {
        x->st.cma_failed++;
        if (r->first_err == UCS_OK)
            r->first_err = res->err == ESRCH ? UCS_ERR_CONNECTION_RESET : UCS_ERR_IO_ERROR;
        KVP_LOG_RL(&x->rl_cma, kvp_clock_now(x->clock), KVP_LOG_WARN, PFX(x),
                   "peer %llu: direct-cma write failed (%s; %zu of %zu bytes): transfer failed",
                   (unsigned long long)p->id, res->err ? strerror(res->err) : "short write",
                   res->fail_done, res->fail_want);
    }
    return res->posted;
}

/* Consumer side: a peer that could write our region without our handler
 * (release rule: conservative). Direct shm into UCX's shared memory, or
 * direct-cma into memory UCX did not allocate when our blob offers it. */
bool kvp__ucx_inbound_direct(ucx_xport_t *x, ucx_peer_t *p)
{
    if (p->inbound == KVP_PATH_DIRECT_SHM || p->inbound == KVP_PATH_DIRECT_CMA)
        return true;
    return (x->region_kind == REGION_UCX || (x->cma_in && p->cma_src)) &&
           kvp__ucx_peer_proven(x, p);
}
