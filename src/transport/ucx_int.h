/*
 * ucx_int.h -- internals of the UCX backend shared by ucx.c (transfers,
 * peers, ops), ucx_setup.c (config, region, blob codec) and ucx_path.c
 * (data-path classification). Not part of any API. Ownership of every object
 * is described at the top of ucx.c.
 */
#ifndef KVP_TRANSPORT_UCX_INT_H
#define KVP_TRANSPORT_UCX_INT_H

#include "transport/pcred.h"
#include "transport/tcpd.h"
#include "transport/ucx.h"

#include <stdatomic.h>
#include <ucp/api/ucp.h>

#define UCX_BLOB_MAGIC 0x5550564Bu /* "KVPU" little-endian */
#define UCX_BLOB_VERSION 6u /* 2: digest trailer; 3: AM data path (older peers would put: refused);
                            * 4: AM blocks in pieces (a v3 consumer drops them: refused);
                            * 5: two workers (AM without RMA, RMA without tcp), secret, probe;
                            * 6: kvpeer's own tcp data stream (tcpd.h) instead of UCX's tcp */
#define UCX_BLOB_HDR 84u
#define UCX_BLOB_DIGEST 8u /* trailer: xxh3-64 of every byte before it */
#define UCX_HOST_MAX 256u
#define UCX_ADDR_MAX 8192u
#define UCX_RKEY_MAX 4096u
/* Same-host proof (ucx_probe.c): a UCX-allocated shm segment of this many
 * u64 cells in the RMA context; a peer that maps it writes its secret into a
 * cell (CAS into an empty one from secret % cells, linear probing). */
#define UCX_PROOF_CELLS 8192u
#define UCX_PROOF_TOMB 1u /* a cell whose mark was taken back (0: never used) */
#define UCX_IDX_BITS 24
#define UCX_IDX_MASK ((1ull << UCX_IDX_BITS) - 1)
#define UCX_PROGRESS_MAX 1024 /* bound of one progress() call */
#define UCX_DEFAULT_ALLOC_PRIO "md:posix,md:sysv,huge,thp,md:*,mmap,heap"
/* UCX's own keepalive is off by default: the control plane's heartbeat
 * (dead-after) is the liveness signal every teardown keys on, and over tcp
 * 1.13's keepalive ep_check exchange, racing endpoints re-created after a
 * partition heals, left wire-ups stuck for good (3 of 15 partition runs with
 * it on; none in 66 post-heal fetches over 35 runs with it off, measured
 * with tests/reliability/partition.py). It does not cure libuct's own
 * crashes under partitions (use after free in the tcp event handler, wire-up
 * assertions): 2 of 15 runs with it on, 3 of 15 off. Errors UCX sees itself
 * (connection reset) still arrive. */
#define UCX_DEFAULT_KEEPALIVE "inf"

/* Active-message data path (ucx_am.c). A block goes as AMs of at most
 * UCX_AM_PIECE_BYTES each, in order, always eager (UCP_AM_SEND_FLAG_EAGER);
 * our handler copies each piece into the slot at its offset or drops it.
 * Why pieces: UCX 1.13 calls a handler only with a whole message, so one AM
 * per block made the consumer's UCX reassemble the block in a buffer of its
 * own and our handler copy all of it only after its last fragment arrived
 * (~130-230 us per 2 MiB block on tcp, on the request's path, issue 17). A
 * piece fits one tcp segment (TX_SEG_SIZE 64K, ucx_setup.c), so UCX delivers
 * it from its receive buffer and the copy into the slot runs while later
 * pieces are on the wire. Rendezvous is never used: its receiver would send RTR/ATS messages
 * back (the consumer must never send on the data path: a send that fails
 * because the source died is what made UCX abort the process) and its
 * receive would be a UCX-owned write into the region that refusal could not
 * stop at once. */
#define UCX_AM_ID_DATA 0x4b56u /* "KV" */
#define UCX_AM_MAGIC 0x4d41564bu /* "KVAM" */
#define UCX_AM_PIECE_BYTES ((uint32_t)60 << 10) /* + UCP/UCT headers < 64 KiB */
typedef struct ucx_am_hdr {
    uint32_t magic;
    uint32_t slot, gen; /* destination slot in the consumer's region and its generation */
    uint32_t off, len;  /* this piece: bytes [off, off + len) of the block */
    uint32_t zero;      /* 0 */
    uint64_t src_token; /* the source transport's secret (random per incarnation, in its blob) */
    uint64_t dst_token; /* the consumer transport's secret: without it the piece is dropped */
} ucx_am_hdr_t;

/* Consumer side: one entry per slot of our region. */
enum { ACC_IDLE = 0, ACC_EXPECT = 1 };
typedef struct ucx_acc {
    uint64_t token;  /* source token expected (0: any source) */
    uint64_t peer;   /* kvp_xpeer_id_t that expect() named (0: any) */
    uint32_t gen;
    uint32_t next;   /* bytes landed since expect(): pieces arrive in order */
    uint8_t state;   /* ACC_*: written only by ucx_acc_set_state (ucx_am.c) */
} ucx_acc_t;

enum { XF_FREE = 0, XF_LIVE, XF_RETIRED, XF_DETACHED };
enum { REGION_NONE = 0, REGION_UCX, REGION_MMAP, REGION_CALLER };

typedef struct ucx_peer ucx_peer_t;

typedef struct ucx_xfer {
    kvp_list_t link; /* free list, peer->running/done, x->retired, x->detached */
    kvp_xfer_id_t id;
    ucx_peer_t *peer; /* counted in peer->refs while not FREE */
    struct ucx_xport *x;
    uint32_t pending; /* UCX requests still owned by UCX */
    uint8_t where;
    ucs_status_t first_err; /* first failed put/flush (or post) */
    uint64_t err_seq;       /* peer->err_seq when posted */
    /* AM path: one header per block, owned by the record (UCX 1.13 has no
     * COPY_HEADER flag: a header must live until its send completed, i.e.
     * until pending == 0). Grown on demand, kept across reuse. */
    ucx_am_hdr_t *hdrs;
    uint32_t hdr_cap;
} ucx_xfer_t;

struct ucx_peer {
    kvp_list_t link;    /* x->peers (live), x->zombies (removed), x->closing */
    kvp_list_t running; /* LIVE records with pending > 0 */
    kvp_list_t done;    /* LIVE records with pending == 0, not yet polled */
    struct ucx_xport *x;
    kvp_xpeer_id_t id;
    ucp_ep_h ep;     /* AM context: kvpeer's AM data path (never RMA) */
    ucp_ep_h ep_rma; /* RMA context (shm/RDMA, never tcp): direct puts; NULL when unreachable */
    ucp_rkey_h rkey; /* the peer's region, unpacked on ep_rma; NULL without it */
    void *close_req_rma; /* ucp_ep_close_nbx request of ep_rma, owned until complete */
    void *close_req; /* ucp_ep_close_nbx request, owned until complete */
    uint64_t rbase;
    uint8_t *rptr; /* direct shm: the peer's whole region, mapped here contiguously by
                    * ucp_rkey_ptr (checked at both ends); valid while rkey is; else NULL */
    kvp_layout_t layout;
    uint64_t refs;       /* records (LIVE, RETIRED or DETACHED) pointing here */
    uint64_t err_seq;    /* bumped by every endpoint error */
    kvp_status_t status; /* KVP_OK, KVP_ERR_TRANSPORT (ep error), KVP_ERR_CLOSED (fenced) */
    ucs_status_t ep_err;
    kvp_data_path_t path;    /* how OUR puts reach the peer */
    kvp_data_path_t inbound; /* how the peer's puts reach US: decides fence proof */
    bool same_host, removed, rkey_ptr_ok;
    bool proven;           /* it wrote its secret into our probe segment: shares our memory */
    uint64_t mark_ours;    /* what we write into its probe segment (our secret, bound) */
    uint64_t mark_theirs;  /* what it must write into ours (its secret, bound) */
    uint64_t *mark_cell;   /* where ours is in its segment (cleared at close), or NULL */
    uint64_t mark_put;     /* what that cell holds: mark_ours, or its pending form */
    ucp_rkey_h probe_rk;   /* keeps that mapping while mark_cell is set */
    bool use_am;           /* our writes to it go as AM (path != direct shm) */
    /* am-tcp (issue 27): our writes to it go over kvpeer's own stream
     * (tcpd.h), never UCX's tcp; p->ep is then NULL. */
    kvp_tcpd_out_t *out;
    uint64_t token;        /* its secret (from its blob): expected in its AM headers */
    uint64_t dst_token;    /* = token: the consumer secret we put in our headers */
    char lanes[192];
    /* issue 29 item 4, direct-cma (ucx_cma.c). Source side: the consumer's
     * blob says it takes direct-cma writes (blob flag 2); its region length
     * (blob); where our mark sits in its address space; its process as the
     * kernel names it (SO_PEERCRED of its pcred listener) and a pidfd on it
     * (-1: no direct-cma to it). */
    bool cma_offered; /* its blob: bit 1, it takes direct-cma writes (consumer role) */
    bool cma_src;     /* its blob: bit 2, it writes direct-cma where offered (source role) */
    uint64_t rlen;
    uint64_t mark_raddr;
    int cma_pid, cma_pidfd;
    struct ucx_probe *probe;    /* data-path probe still owned by UCX, or NULL */
    uint64_t probe_deadline_ns; /* real clock */
};

/* The flush posted on a new endpoint (see connect_timeout_ms). Owned by UCX
 * until its callback; names its peer by id, so it may outlive the peer. */
typedef struct ucx_probe {
    struct ucx_xport *x;
    kvp_xpeer_id_t peer;
} ucx_probe_t;

typedef struct ucx_xport {
    kvp_xport_t base;
    char prefix[64];
    char host_id[UCX_HOST_MAX];
    const kvp_clock_t *clock;
    /* Two contexts (issue 27): ctx/worker have UCP_FEATURE_RMA and only
     * same-host (shm, cma, self) or RDMA transports, never tcp: the region
     * and the probe segment are mapped here. ctx_am/worker_am have AM+WAKEUP
     * and NO RMA (UCX installs no software put/get handlers there): kvpeer's
     * AM data path, tcp and shm. Both efds sit in epfd (event_fd()). */
    ucp_context_h ctx;
    ucp_worker_h worker;
    ucp_context_h ctx_am;
    ucp_worker_h worker_am;
    int efd, efd_am, epfd;
    char net_devices[128]; /* UCX_NET_DEVICES of the AM context ("" = UCX's default) */
    /* same-host proof segment (ucx_probe.c) */
    ucp_mem_h probe_memh;
    uint64_t *probe_cells; /* UCX_PROOF_CELLS, in shm */
    /* region */
    int region_kind;
    void *region;
    size_t region_len;
    kvp_layout_t layout;
    ucp_mem_h memh;
    uint8_t *blob;
    size_t blob_len;
    /* peers */
    kvp_list_t peers, zombies, closing;
    kvp_xpeer_id_t next_peer;
    /* transfers */
    ucx_xfer_t *pool;
    uint32_t pool_cap;
    kvp_list_t free_list, retired, detached;
    uint64_t next_seq;
    kvp_xport_stats_t st;
    bool destroying; /* set before ucp_worker_destroy: callbacks only count down */
    uint32_t errored; /* endpoint errors not yet answered by a FORCE close */
    uint64_t connect_timeout_ns;
    kvp_ratelimit_t rl_blob; /* refused blobs (50 lines/s): a hostile peer can send one per connection */
    uint32_t probes; /* probes still owned by UCX (teardown waits for them) */
    /* AM path */
    bool shm_enabled;  /* our config keeps UCX shm transports (with error handling) */
    char tls[64];      /* the effective UCX_TLS ("" = UCX's default), for logs */
    bool legacy_put;   /* bench only: ucp_put_nbx on every path (the old emulated put) */
    uint64_t token;    /* ours: random per incarnation (libsodium), sent only in the blob */
    uint64_t bind_next; /* issue 27: the next add_peer's connection binding (0: none) */
    char next_host[64]; /* the numeric address the next add_peer's blob came from ("" unknown) */
    kvp_tcpd_t *tcpd;   /* kvpeer's own tcp data stream: listener and streams */
    ucx_acc_t *acc;    /* consumer side: layout.num_blocks entries, from register_region */
    kvp_pcred_t *pcred; /* issue 27 item 8: same-host processes (pcred.h); NULL: no exit proof */
    /* issue 29 item 4 (ucx_cma.c): direct-cma allowed here (KVPEER_UCX_CMA
     * not 0, no Yama restriction); cma_in: our blob offers it (caller memory,
     * shm on, pcred and probe segment present: bit 1); cma_out: our blob
     * says we write direct-cma where offered (shm on, pcred: bit 2) */
    bool cma_ok, cma_in, cma_out;
    kvp_helper_t *cma_helper; /* the second half of a big direct-cma write (ucx_cma.c) */
    kvp_ratelimit_t rl_cma;
    /* the direct-cma writer (ucx_cma_writer.c), started at the first write:
     * its writes queued or running, then done, under cma_lock; cma_efd, in
     * epfd, readable while a done one waits for kvp__ucx_cma_pump, exactly
     * when cma_signalled (both changed under cma_lock; the flag read
     * without it first, so a round with nothing done makes no syscall) */
    pthread_t cma_thread;
    pthread_mutex_t cma_lock;
    pthread_cond_t cma_cv; /* a write queued, a slice returned, stop */
    kvp_list_t cma_jobs, cma_done;
    struct cma_job *cma_running; /* the write the writer is in (a slice of) */
    size_t cma_gate;             /* slices the writer may start (SIZE_MAX: any; tests) */
    bool cma_writer_on, cma_writer_off, cma_stop;
    int cma_efd;
    _Atomic bool cma_signalled;
    size_t cma_slice; /* the writer's slice in bytes (KVPEER_CMA_SLICE_KIB; SIZE_MAX: whole) */
    int cma_nice;     /* the writer's and its helper's nice above ours (KVPEER_CMA_NICE; 10) */
} ucx_xport_t;

#define PFX(x) ((x)->base.log_prefix)

static inline ucx_xport_t *ucx_of(kvp_xport_t *x)
{
    return (ucx_xport_t *)x;
}

/* A parsed, validated blob; pointers borrow from the blob bytes. */
typedef struct ucx_blob_view {
    uint32_t flags;
    kvp_layout_t layout;
    uint64_t base, len;
    uint64_t secret, probe_base;
    kvp_tcpd_addr_t tcpd; /* where its data stream listens */
    const uint8_t *host, *addr, *rkey, *rma_addr, *probe_rkey;
    size_t host_len, addr_len, rkey_len, rma_addr_len, probe_rkey_len;
} ucx_blob_view_t;

/* ucx_setup.c */
void kvp__ucx_host_id_default(char *buf, size_t cap);
kvp_status_t kvp__ucx_blob_view(const uint8_t *b, size_t len, ucx_blob_view_t *v);
/* The blob parsed and its layout checked against `expect` (and our block
 * size); refusals logged, rate-limited. */
kvp_status_t kvp__ucx_blob_accept(ucx_xport_t *x, const void *blob, size_t len,
                                  const kvp_layout_t *expect, ucx_blob_view_t *v);
kvp_status_t kvp__ucx_register_region(kvp_xport_t *xp, void *base, size_t len,
                                      const kvp_layout_t *layout, void **base_out);
kvp_status_t kvp__ucx_local_blob(kvp_xport_t *xp, const void **blob, size_t *len);
void kvp__ucx_region_release(ucx_xport_t *x);
kvp_status_t kvp__ucx_ucp_open(ucx_xport_t *x, const kvp_ucx_config_t *cfg);

/* ucx_probe.c: the same-host proof. */
void kvp__ucx_log_install(void); /* ucx_log.c */
kvp_status_t kvp__ucx_probe_alloc(ucx_xport_t *x);
void kvp__ucx_probe_release(ucx_xport_t *x);
/* Map the peer's probe segment through p->ep_rma and write our secret into
 * it (once, at add_peer); false when it cannot be mapped (not same host).
 * pending: write a form of it the peer does not take as proof, until
 * kvp__ucx_probe_settle (a consumer that offers direct-cma: ucx_cma.c). */
bool kvp__ucx_probe_mark(ucx_xport_t *x, ucx_peer_t *p, const ucx_blob_view_t *v, bool pending);
void kvp__ucx_probe_settle(ucx_peer_t *p);
/* Whether the peer's secret is in our probe segment (cached once true). */
bool kvp__ucx_peer_proven(ucx_xport_t *x, ucx_peer_t *p);
uint64_t kvp__ucx_proof_mark_value(uint64_t secret, uint64_t binding);
void kvp__ucx_probe_unmark(ucx_peer_t *p);
void kvp__ucx_bind_next_peer(kvp_xport_t *xp, uint64_t binding);
/* ucx_exit.c (issue 27 item 8): the source process's exit as proof. */
void kvp__ucx_exit_open(ucx_xport_t *x);
void kvp__ucx_exit_add_peer(ucx_xport_t *x, ucx_peer_t *p, bool marked);
void kvp__ucx_exit_remove_peer(ucx_xport_t *x, ucx_peer_t *p);
bool kvp__ucx_exit_hold(kvp_xport_t *xp, kvp_xpeer_id_t peer);
void kvp__ucx_exit_drop(kvp_xport_t *xp, kvp_xpeer_id_t peer);
bool kvp__ucx_exit_proven(kvp_xport_t *xp, kvp_xpeer_id_t peer);
/* ucx_cma.c (issue 29 item 4): direct-cma, a same-host source's
 * process_vm_writev straight into a consumer region UCX did not allocate. */
void kvp__ucx_cma_open(ucx_xport_t *x);
/* Our blob's direct-cma bits (ucx_setup.c): 2 = we take it, 4 = we write it. */
uint32_t kvp__ucx_cma_flags(ucx_xport_t *x);
/* Source side, at add_peer after our mark and our pcred connection: make
 * the peer's process (the kernel's pid of its listener) our cma target. */
void kvp__ucx_cma_add_peer(ucx_xport_t *x, ucx_peer_t *p, int listener_pid);
void kvp__ucx_cma_remove_peer(ucx_peer_t *p);
void kvp__ucx_cma_close(ucx_xport_t *x);
/* Source side: our writes to p must go direct-cma (it offers it, our blob
 * says we write it, and we marked its probe segment: it will see us proven
 * and trust FETCH_DONE without landing). */
bool kvp__ucx_cma_bound(const ucx_xport_t *x, const ucx_peer_t *p);
/* Whether a write to p (path direct-cma) may go now: 1 yes; -1 no, and
 * nothing may be written (its process exited, not proven, or its process
 * could not be proven at add_peer): the consumer trusts FETCH_DONE without
 * our AM landing, so AM is no fallback. */
int kvp__ucx_cma_ready(ucx_xport_t *x, ucx_peer_t *p);
/* Write blocks into p's region with process_vm_writev: queued for the
 * writer thread (returns 1: r->pending counts it until kvp__ucx_cma_pump
 * folds it into r), or, with no writer, written now on this thread (how
 * many syscalls wrote something). 0: nothing written, r->first_err set
 * (a block outside p's region: nothing is written then). */
size_t kvp__ucx_cma_post(ucx_xport_t *x, ucx_peer_t *p, ucx_xfer_t *r,
                         const kvp_xfer_block_t *blocks, size_t n);
/* What a write did, from any thread; folded into x and r on the node
 * thread by kvp__ucx_cma_fold (how many syscalls wrote something). */
typedef struct kvp_cma_res {
    size_t posted, syscalls; /* syscalls that wrote something; all syscalls */
    uint64_t bytes;
    int err; /* the first failure's errno (0: a short write) */
    size_t fail_done, fail_want;
    bool failed;
} kvp_cma_res_t;
/* Blocks [0, n) written into p's region, split with *helper when big (NULL:
 * on this thread alone), added to *res; changes nothing of x or p, so any
 * thread may call it while p exists (one thread per helper). */
void kvp__ucx_cma_write_raw(const ucx_xport_t *x, const ucx_peer_t *p,
                            const kvp_xfer_block_t *blocks, size_t n, kvp_helper_t **helper,
                            kvp_cma_res_t *res);
size_t kvp__ucx_cma_fold(ucx_xport_t *x, const ucx_peer_t *p, ucx_xfer_t *r,
                         const kvp_cma_res_t *res);
/* ucx_cma_writer.c. Queue r's write for the writer (r->pending counts it);
 * false: no writer (KVPEER_CMA_WRITER=0, no thread) or no memory. */
bool kvp__ucx_cma_queue(ucx_xport_t *x, ucx_peer_t *p, ucx_xfer_t *r,
                        const kvp_xfer_block_t *blocks, size_t n);
/* The writes the writer finished, folded into their records; true if any
 * (the round then settles them before it sleeps). The transport's pump op. */
bool kvp__ucx_cma_pump(kvp_xport_t *xp);
/* Stop the writes of peer p (NULL: any) or of record r (NULL: any): no
 * slice of them is started any more; each that is not running ends now
 * (its record fails, CANCELED, once its other requests are done), the one
 * running at its slice's return -- waited for here if `wait`. */
void kvp__ucx_cma_drop(ucx_xport_t *x, const ucx_peer_t *p, const ucx_xfer_t *r, bool wait);
/* Drop every write, wait for the running one, join the writer. */
void kvp__ucx_cma_writer_stop(ucx_xport_t *x);
/* Tests: the writer starts at most `slices` more slices (SIZE_MAX: any). */
void kvp__ucx_cma_gate(ucx_xport_t *x, size_t slices);
/* Consumer side: a peer that could write our region directly (the inbound
 * path rule of ucx_path.c / ucx_am.c). */
bool kvp__ucx_inbound_direct(ucx_xport_t *x, ucx_peer_t *p);
/* ucx_netdev.c: UCX_NET_DEVICES for a control listen address. */
kvp_status_t kvp__ucx_net_devices(const char *listen_host, char *buf, size_t cap, bool *all);

/* ucx_path.c: which data path each direction of a peer takes; sets p->path,
 * p->inbound, p->use_am, p->lanes and logs once. */
void kvp__ucx_peer_classify(ucx_xport_t *x, ucx_peer_t *p);

/* ucx.c: one UCX request (or tcpd piece) of r completed with status. */
void kvp__ucx_xfer_step(ucx_xfer_t *r, ucs_status_t status);

/* ucx_am.c */
void kvp__ucx_land(ucx_xport_t *x, const ucx_am_hdr_t *h, const void *data, size_t length);

/* ucx_tcpd.c: kvpeer's own tcp data stream under the UCX backend. */
kvp_status_t kvp__ucx_tcpd_open(ucx_xport_t *x, const kvp_ucx_config_t *cfg);
size_t kvp__ucx_tcpd_post(ucx_xport_t *x, ucx_peer_t *p, ucx_xfer_t *r,
                          const kvp_xfer_block_t *blocks, size_t n);
void kvp__ucx_next_peer_host(kvp_xport_t *xp, const char *host);
kvp_status_t kvp__ucx_am_init(ucx_xport_t *x);
kvp_status_t kvp__ucx_acc_alloc(ucx_xport_t *x);
void kvp__ucx_acc_refuse_peer(ucx_xport_t *x, kvp_xpeer_id_t peer);
/* Post the eager AMs of every block of `blocks`, piece by piece, for transfer r
 * (headers in r); returns how many were posted (the rest was refused). */
size_t kvp__ucx_am_post(ucx_xport_t *x, ucx_peer_t *p, ucx_xfer_t *r,
                        const kvp_xfer_block_t *blocks, size_t n, const ucp_request_param_t *prm);
bool kvp__ucx_am_reserve_hdrs(ucx_xfer_t *r, size_t n, size_t block_size);
bool kvp__ucx_inbound_refusable(kvp_xport_t *xp, kvp_xpeer_id_t peer);
bool kvp__ucx_landing_required(kvp_xport_t *xp, kvp_xpeer_id_t peer);
kvp_status_t kvp__ucx_expect(kvp_xport_t *xp, kvp_xpeer_id_t peer, const kvp_xslot_t *slots,
                             size_t n);
void kvp__ucx_refuse(kvp_xport_t *xp, const kvp_xslot_t *slots, size_t n);
bool kvp__ucx_is_landed(kvp_xport_t *xp, kvp_xslot_t s);
/* ucx_peer.c: the peer table (issue 31: ucx.c cut along its seams). */
ucx_peer_t *kvp__ucx_peer_find(ucx_xport_t *x, kvp_xpeer_id_t id);
/* Live, removed or closing: the peer a late UCX callback may still name. */
ucx_peer_t *kvp__ucx_peer_find_any(ucx_xport_t *x, kvp_xpeer_id_t id);
kvp_status_t kvp__ucx_peer_status(kvp_xport_t *xp, kvp_xpeer_id_t peer);
kvp_data_path_t kvp__ucx_peer_path(kvp_xport_t *xp, kvp_xpeer_id_t peer);
/* ucx_xfer.c: the transfer records (pool, WRITE, poll, cancel, retired). */
kvp_status_t kvp__ucx_write(kvp_xport_t *xp, kvp_xpeer_id_t peer, const kvp_xfer_block_t *blocks,
                            size_t n, kvp_xfer_id_t *out);
kvp_status_t kvp__ucx_poll(kvp_xport_t *xp, kvp_xpeer_id_t peer, kvp_xfer_result_t *out,
                           size_t cap, size_t *n_out);
kvp_status_t kvp__ucx_cancel(kvp_xport_t *xp, const kvp_xfer_id_t *ids, size_t n,
                             kvp_cancel_mode_t mode, kvp_xfer_id_t *still_running,
                             size_t *n_running);
kvp_status_t kvp__ucx_poll_retired(kvp_xport_t *xp, kvp_xfer_result_t *out, size_t cap,
                                   size_t *n_out);
kvp_status_t kvp__ucx_force_release_retired(kvp_xport_t *xp, const kvp_xfer_id_t *ids, size_t n);
/* A removed peer's records: LIVE -> RETIRED (on x->retired). */
void kvp__ucx_retire_list(ucx_xport_t *x, kvp_list_t *l);
/* LIVE|RETIRED -> DETACHED while UCX still owns requests (else freed). */
void kvp__ucx_xfer_detach(ucx_xport_t *x, ucx_xfer_t *r);
/* The one writer of r->where (checked against the table in ucx.c's header). */
void kvp__ucx_xfer_set_where(ucx_xfer_t *r, uint8_t to);
const char *kvp__ucx_where_str(uint8_t where);
/* ucx.c: free removed peers no transfer refers to any more (true if any). */
bool kvp__ucx_zombies_reap(ucx_xport_t *x);

/* ucx_version.c (issue 30): the UCX this process loaded. describe() writes
 * "UCX a.b.c loaded from <libucp> (built with UCX x.y headers...)" and says
 * whether the library's major.minor are the headers'; log() logs it once
 * (INFO, or WARN on a mismatch). */
bool kvp__ucx_version_describe(char *buf, size_t cap);
void kvp__ucx_version_log(ucx_xport_t *x);
/* Whether the loaded UCX knows ucp key `key` (a UCX that accepts any key,
 * like 1.13, answers false). */
bool kvp__ucx_config_has(const char *key, const char *value);

#endif
