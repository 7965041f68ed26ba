/*
 * ucx_exit.c -- the UCX backend's process-exit proof (issue 27 item 8):
 * glue between its peers and pcred.h.
 *
 * Only for a peer whose puts reach our memory directly (inbound direct shm:
 * no fence, ucx_fence_peer says "NOT a proof") AND that proved it shares
 * our memory (its mark in our probe segment, ucx_probe.c): the process
 * that wrote that mark is the one that maps our region. Its claim on the
 * unix side channel is derived from that very mark (secret + control
 * connection), so the pid SO_PEERCRED gives us is the process that holds
 * the session's secret. A peer in another network namespace, of another
 * user or on a kernel without pidfd_open gets no watch: its loads wait for
 * FETCH_DONE / ABORT_ACK or the hold cap, as before.
 *
 * Limits (docs/DESIGN.md): a source that forked after sending its claim,
 * or shares its mapping with another process, is trusted not to (a key
 * holder can write our region anyway, SPEC §9); the proof is its own
 * process's exit, not its children's.
 */
#include "transport/ucx_int.h"

#include <errno.h>
#include <string.h>
#include <sys/epoll.h>

void kvp__ucx_exit_open(ucx_xport_t *x)
{
    kvp_pcred_config_t c = {.log_prefix = PFX(x), .clock = x->clock, .secret = x->token};
    if (kvp__pcred_open(&c, &x->pcred) != KVP_OK) {
        x->pcred = NULL; /* logged: no exit proof */
        return;
    }
    struct epoll_event ev = {.events = EPOLLIN};
    if (epoll_ctl(x->epfd, EPOLL_CTL_ADD, kvp__pcred_fd(x->pcred), &ev) != 0) {
        KVP_WARN(PFX(x), "epoll for the process-exit side channel: %s (no exit proof)",
                 strerror(errno));
        kvp__pcred_close(x->pcred);
        x->pcred = NULL;
    }
}

/* marked: we wrote our mark into its probe segment (we share its memory):
 * tell it our process. A same-host candidate (an RMA endpoint): watch for
 * its claim; whether it counts is decided at hold (proven, direct shm). */
void kvp__ucx_exit_add_peer(ucx_xport_t *x, ucx_peer_t *p, bool marked)
{
    if (x->pcred == NULL)
        return;
    if (p->ep_rma != NULL && p->mark_theirs != 0)
        kvp__pcred_watch(x->pcred, p->id, kvp__pcred_claim(p->mark_theirs));
    if (marked) {
        int lpid = 0; /* issue 29 item 4: its listener's pid, the kernel's word */
        kvp__pcred_tell(x->pcred, p->id, p->token, kvp__pcred_claim(p->mark_ours), &lpid);
        kvp__ucx_cma_add_peer(x, p, lpid);
    }
}

void kvp__ucx_exit_remove_peer(ucx_xport_t *x, ucx_peer_t *p)
{
    if (x->pcred == NULL)
        return;
    kvp__pcred_unwatch(x->pcred, p->id); /* kept while quarantined loads hold it */
    kvp__pcred_untell(x->pcred, p->id);
}

bool kvp__ucx_exit_hold(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    ucx_xport_t *x = ucx_of(xp);
    ucx_peer_t *p = kvp__ucx_peer_find(x, peer);
    if (x->pcred == NULL || p == NULL ||
        (p->inbound != KVP_PATH_DIRECT_SHM && p->inbound != KVP_PATH_DIRECT_CMA) ||
        !kvp__ucx_peer_proven(x, p))
        return false;
    return kvp__pcred_hold(x->pcred, peer);
}

void kvp__ucx_exit_drop(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    ucx_xport_t *x = ucx_of(xp);
    if (x->pcred != NULL)
        kvp__pcred_drop(x->pcred, peer);
}

bool kvp__ucx_exit_proven(kvp_xport_t *xp, kvp_xpeer_id_t peer)
{
    ucx_xport_t *x = ucx_of(xp);
    return x->pcred != NULL && kvp__pcred_exited(x->pcred, peer);
}
