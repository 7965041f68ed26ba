/*
 * pcred.h -- a same-host peer's process, proven (issue 27 item 8). Internal
 * to the transport layer; the UCX backend uses it for peers whose writes
 * reach our memory directly (direct shm), where no fence exists and the
 * writer's exit is the only early proof (transport.h exit_*).
 *
 * Why a side channel: the control plane is TCP, which carries no peer
 * credentials, and a peer's own claim of its pid is no proof (SPEC §9).
 * SO_PEERCRED on an AF_UNIX connection is the kernel's word for the pid and
 * uid of the process that connected.
 *
 * How: every node listens on an ABSTRACT unix socket named from its
 * per-incarnation secret (kvp__pcred_name: only a peer that got our blob
 * after authentication can compute it; abstract names are per network
 * namespace, so a peer in another netns simply finds nothing). A source
 * that proved itself same-host (it wrote its mark into our probe segment,
 * ucx_probe.c) connects and sends
 *     magic u32 "KVPC" | version u32 (1) | claim u64
 * where claim is derived from its probe mark, i.e. bound to its secret AND
 * to the control connection (kvp__ucx_proof_mark_value): a relay or a
 * replay on another connection matches nothing. The consumer takes the
 * connector's uid and pid from SO_PEERCRED (another uid: refused; pid 0,
 * i.e. another pid namespace: refused), matches the claim to a peer it
 * watches, calls pidfd_open(pid) and THEN checks that the connection is
 * still open: the source holds it until we close it, so if its process had
 * died (and the pid been reused) between connect and pidfd_open, its end
 * would be closed. Then the pidfd is the peer's watch; the connection is
 * closed (the source sees EOF and closes too).
 *
 * Doors: the listener faces every local process of every user in the
 * network namespace. Connections of another uid are closed at accept;
 * pending ones are capped (max_pending: the oldest is closed for a new
 * one) and closed at a deadline, on garbage, when their sender leaves, or
 * on a claim that matches nothing by then. Nothing blocks. A flood from
 * our own uid can still delay a real source's claim past its deadline:
 * that source then gets no proof (its loads wait for the hold cap).
 *
 * A watch lives while its peer is live or a holder (a quarantined load)
 * needs it; at most max_watches pidfds are open. exited() polls the pidfd
 * (readable once the whole process exited, after do_exit tore its mm down;
 * a stopped process is not readable) and is sticky once true.
 *
 * Threading: one owner thread (the transport's).
 */
#ifndef KVP_TRANSPORT_PCRED_H
#define KVP_TRANSPORT_PCRED_H

#include "common/common.h"

#include <sys/types.h>

#define KVP_PCRED_MAGIC 0x4350564bu /* "KVPC" */
#define KVP_PCRED_VERSION 1u
#define KVP_PCRED_NAME_MAX 64

typedef struct kvp_pcred kvp_pcred_t;

typedef struct kvp_pcred_msg {
    uint32_t magic, version;
    uint64_t claim;
} kvp_pcred_msg_t;

typedef struct kvp_pcred_config {
    const char *log_prefix;
    const kvp_clock_t *clock; /* NULL: real */
    uint64_t secret;          /* ours (non-zero): names our listener */
    uint32_t max_pending;     /* unmatched inbound connections; 0: 16 */
    uint32_t max_watches;     /* open pidfds (live and held); 0: 1024 */
    uint32_t timeout_ms;      /* pending and outbound deadline; 0: 5000 */
} kvp_pcred_config_t;

typedef struct kvp_pcred_stats {
    uint64_t accepted, watched;      /* connections; pidfds taken */
    uint64_t refused_cap, refused_uid, refused_pid; /* at accept / creds */
    uint64_t closed_garbage, closed_timeout, closed_dead; /* dead: gone before pidfd_open */
    uint64_t watches;                /* open now */
    uint64_t told, exits_seen;
} kvp_pcred_stats_t;

/* The abstract name (without the leading NUL) of the listener of the node
 * whose secret this is. */
void kvp__pcred_name(uint64_t secret, char buf[KVP_PCRED_NAME_MAX]);
/* The claim a source sends for a probe mark (and the consumer expects). */
uint64_t kvp__pcred_claim(uint64_t mark);

/* Listen. On error (name taken, no unix sockets) nothing is open: the
 * caller runs without exit proofs (logged). */
kvp_status_t kvp__pcred_open(const kvp_pcred_config_t *cfg, kvp_pcred_t **out);
void kvp__pcred_close(kvp_pcred_t *pc); /* every fd and watch; NULL ok */
/* pidfd_open(2) (-1 with errno ENOSYS where the system or valgrind lacks it). */
int kvp__pidfd_open(pid_t pid);
int kvp__pcred_fd(const kvp_pcred_t *pc); /* readable (level) when progress() has work */
bool kvp__pcred_progress(kvp_pcred_t *pc);
void kvp__pcred_stats(const kvp_pcred_t *pc, kvp_pcred_stats_t *st);

/* Consumer side. Watch peer `id` (a transport peer handle) whose source
 * will send `claim`. Unwatch: the peer is gone; the watch stays while held. */
void kvp__pcred_watch(kvp_pcred_t *pc, uint64_t id, uint64_t claim);
void kvp__pcred_unwatch(kvp_pcred_t *pc, uint64_t id);
/* hold: true (one more holder) only when the peer's pidfd is open. */
bool kvp__pcred_hold(kvp_pcred_t *pc, uint64_t id);
void kvp__pcred_drop(kvp_pcred_t *pc, uint64_t id);
bool kvp__pcred_exited(kvp_pcred_t *pc, uint64_t id);

/* Source side: tell the node whose secret is `peer_secret` our `claim`
 * for our peer `id` (connect, send, wait for its close). untell: id gone.
 * Issue 29 item 4: *listener_pid (NULL: not asked) gets the pid of the
 * process that listens there, the kernel's word (SO_PEERCRED of the
 * connected socket: the listener's credentials at listen()), only when it
 * runs under our uid and is visible in our pid namespace; else 0. */
void kvp__pcred_tell(kvp_pcred_t *pc, uint64_t id, uint64_t peer_secret, uint64_t claim,
                     int *listener_pid);
void kvp__pcred_untell(kvp_pcred_t *pc, uint64_t id);

#endif /* KVP_TRANSPORT_PCRED_H */
