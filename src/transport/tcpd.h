/*
 * tcpd.h -- kvpeer's own tcp data stream (issue 27). Internal to the
 * transport layer; the UCX backend uses it for every peer its shared-memory
 * lanes do not reach (the am-tcp path).
 *
 * Why not UCX's tcp transport: libuct's tcp receiver executes a PUT_REQ
 * frame from any connected socket by copying its payload to the address the
 * frame names (uct_tcp_ep_handle_put_req), whatever the UCP features, rkeys
 * or kvpeer sessions say, and asserts (aborts) on frames it finds too long.
 * A host that could reach UCX's tcp port could overwrite or crash a node
 * without any key. kvpeer's stream runs no code of anyone else on bytes from
 * the network; nothing it reads is ever written anywhere but through the
 * consumer's landing rule (ucx_am.c: a piece lands only in a slot expected
 * at that generation from that source, else it is dropped).
 *
 * Wire (little-endian hosts; one direction only: source -> consumer; the
 * consumer never writes on it):
 *   preface  magic u32 "KVTP" | version u32 | dst_token u64 | src_token u64
 *   piece*   magic u32 "KVTD" | slot u32 | gen u32 | off u32 | len u32 | zero u32
 *            | len bytes   (0 < len <= KVP_TCPD_PIECE_MAX)
 * dst_token is the consumer's secret (random per incarnation, in its blob,
 * which leaves a node only after authentication, SPEC §4): a connection whose
 * preface does not carry it within preauth_timeout_ms is closed, and so is
 * one that breaks the framing. src_token is the source's secret: the
 * consumer lands a piece only into a slot expecting that source.
 *
 * Doors (the listener faces every host that reaches it): unauthenticated
 * connections are capped in total and per source address and closed at a
 * deadline; authenticated ones are capped; EMFILE backs off with a reserve
 * fd (as libuv and nginx do) and logs at a bounded rate.
 *
 * Threading: one owner thread (the transport's); nothing blocks.
 */
#ifndef KVP_TRANSPORT_TCPD_H
#define KVP_TRANSPORT_TCPD_H

#include "common/common.h"

#include <netinet/in.h>
#include <sys/socket.h>

#define KVP_TCPD_PREFACE_MAGIC 0x5054564bu /* "KVTP" */
#define KVP_TCPD_PIECE_MAGIC 0x4454564bu   /* "KVTD" */
#define KVP_TCPD_VERSION 1u
#define KVP_TCPD_PIECE_MAX ((uint32_t)256 << 10)

typedef struct kvp_tcpd kvp_tcpd_t;
typedef struct kvp_tcpd_out kvp_tcpd_out_t;

typedef struct kvp_tcpd_piece {
    uint32_t magic, slot, gen, off, len, zero;
} kvp_tcpd_piece_t;

typedef struct kvp_tcpd_preface {
    uint32_t magic, version;
    uint64_t dst_token, src_token;
} kvp_tcpd_preface_t;

/* Where a consumer's stream listens (in its blob). family 0: none. */
typedef struct kvp_tcpd_addr {
    uint8_t family; /* 4 or 6 */
    uint16_t port;
    uint8_t ip[16]; /* v4: first 4 bytes */
} kvp_tcpd_addr_t;

typedef struct kvp_tcpd_cbs {
    void *arg;
    /* A whole piece arrived on a connection that proved our token and named
     * src_token. The callback decides whether it lands. */
    void (*land)(void *arg, uint64_t src_token, const kvp_tcpd_piece_t *h, const uint8_t *data);
    /* A queued piece left our memory (ok) or never will (!ok). */
    void (*sent)(void *arg, void *cookie, bool ok);
    /* An outgoing stream failed (before its pieces' sent(!ok) calls). */
    void (*failed)(void *arg, void *owner, const char *why);
} kvp_tcpd_cbs_t;

typedef struct kvp_tcpd_config {
    const char *log_prefix;
    const char *listen_addr;  /* "host:port" of the control plane (port ignored); NULL: 127.0.0.1 */
    uint16_t port;            /* 0: ephemeral */
    uint64_t token;           /* ours (non-zero) */
    uint32_t max_preauth;          /* 0: 16 */
    uint32_t max_preauth_per_addr; /* 0: 4 */
    uint32_t max_open;             /* authenticated streams; 0: 256 */
    uint32_t preauth_timeout_ms;   /* 0: 3000 */
    uint32_t connect_timeout_ms;   /* 0: 2000 */
} kvp_tcpd_config_t;

typedef struct kvp_tcpd_stats {
    uint64_t accepted, authenticated, open;
    uint64_t refused_preauth_cap, refused_addr_cap, refused_open_cap;
    uint64_t closed_bad_preface, closed_timeout, closed_proto, accept_emfile;
    uint64_t pieces_in, bytes_in, pieces_out, bytes_out;
} kvp_tcpd_stats_t;

kvp_status_t kvp__tcpd_open(const kvp_tcpd_config_t *cfg, const kvp_tcpd_cbs_t *cbs,
                            kvp_tcpd_t **out);
/* Closes every stream (queued pieces: sent(!ok)) and the listener. */
void kvp__tcpd_close(kvp_tcpd_t *t);
void kvp__tcpd_local_addr(const kvp_tcpd_t *t, kvp_tcpd_addr_t *a);
/* Readable (level) when progress() has work: for the transport's epoll. */
int kvp__tcpd_fd(const kvp_tcpd_t *t);
/* Accept, read, land, write, time out. Returns whether anything happened. */
bool kvp__tcpd_progress(kvp_tcpd_t *t);
void kvp__tcpd_stats(const kvp_tcpd_t *t, kvp_tcpd_stats_t *st);

/* A stream to a consumer. A wildcard address in `a` is replaced by
 * `fallback_host` (numeric; the address its control connection came from).
 * Connects in the background; pieces sent before it is up wait. NULL on a
 * bad address or no memory (logged). */
kvp_tcpd_out_t *kvp__tcpd_connect(kvp_tcpd_t *t, const kvp_tcpd_addr_t *a,
                                  const char *fallback_host, uint64_t dst_token, void *owner);
/* Queue one piece (data must stay valid until sent(cookie)). KVP_OK, or the
 * stream's failure (nothing queued). */
kvp_status_t kvp__tcpd_send(kvp_tcpd_out_t *o, const kvp_tcpd_piece_t *h, const uint8_t *data,
                            void *cookie);
/* Write what the socket takes now (after a batch of sends). */
void kvp__tcpd_kick(kvp_tcpd_out_t *o);
/* Close it: queued pieces get sent(!ok) before this returns; freed. */
void kvp__tcpd_out_close(kvp_tcpd_out_t *o);

#endif /* KVP_TRANSPORT_TCPD_H */
