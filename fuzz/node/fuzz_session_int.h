/*
 * fuzz_session_int.h -- internals shared by the two halves of the session
 * fuzzer: fuzz_session_world.c (the world: input cursor, the raw fake peer,
 * ticks, oracles, setup/teardown) and fuzz_session_run.c (the op table and
 * the interpreter). See fuzz_session_run.c for the design.
 */
#ifndef KVP_FUZZ_SESSION_INT_H
#define KVP_FUZZ_SESSION_INT_H

#include "fuzz_session.h"

#include "node/node.h"
#include "transport/fake.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FZ_NODE "n0:7000"
#define FZ_PEER "peer:1"
#define FZ_BLOCKS 16u
#define FZ_BS 4096u
#define FZ_ITEMS 6u
#define FZ_RECS 8u
#define FZ_NODE_OPS 48u
#define FZ_MAX_OPS 256u
#define FZ_MAX_VIRTUAL_NS (30ull * KVP_NSEC_PER_SEC)
#define FZ_MS KVP_NSEC_PER_MSEC

/* A FETCH the node sent to the fake peer (the peer may write into its
 * destinations and answer it). */
typedef struct fz_fetch {
    uint64_t req, round;
    uint32_t n;
    uint32_t slot[FZ_ITEMS], gen[FZ_ITEMS];
    int32_t src[FZ_ITEMS]; /* peer slot written into item i, -1 = none */
    bool closed;           /* we answered it: an honest peer writes no more */
} fz_fetch_t;

typedef struct fz_lookup {
    uint64_t req, round;
    uint32_t n;
} fz_lookup_t;

/* A node-side operation (caller-owned buffers live here until teardown). */
typedef struct fz_nop {
    uint64_t op_id;
    int type; /* KVP_EV_LOOKUP / KVP_EV_LOAD */
    uint32_t events;
    uint8_t results[FZ_ITEMS];
    int32_t bstat[FZ_ITEMS];
} fz_nop_t;

typedef struct fz {
    kvp_manual_clock_t mc;
    kvp_fake_fabric_t *fab;
    kvp_fake_net_t *net;
    kvp_config_t cfg;
    kvp_node_seams_t seams;
    kvp_node_t *node;
    uint64_t fingerprint;
    /* the fake peer */
    kvp_loop_t *ploop;
    kvp_ctl_t *pctl;
    kvp_xport_t *px;
    uint8_t *pregion;
    kvp_link_t *link;
    kvp_xpeer_id_t pxpeer;
    kvp_epoch_t old_src, old_dst;
    bool have_old;
    int epoch_mode; /* next send: 0 live, 1 old incarnation, 2 swapped, 3 forged */
    uint8_t forged[32];
    fz_fetch_t fetch[FZ_RECS];
    uint32_t n_fetch;
    fz_lookup_t look[FZ_RECS];
    uint32_t n_look;
    uint64_t sent_req[FZ_RECS], sent_round[FZ_RECS]; /* our FETCHes to the node */
    uint32_t n_sent;
    /* node-side ops */
    fz_nop_t nop[FZ_NODE_OPS];
    uint32_t n_nop;
    /* input cursor */
    const uint8_t *in;
    size_t len, pos;
    int verbose;
    kvp_fuzz_session_result_t *res;
    bool failed;
} fz_t;

/* Keys from argument bytes: concatenated buffer + lengths. */
typedef struct fz_keys {
    uint8_t buf[FZ_ITEMS * KVP_WIRE_KEY_MAX];
    uint32_t len[FZ_ITEMS];
    kvp_key_t key[FZ_ITEMS];
    uint32_t n;
} fz_keys_t;

/* fuzz_session_world.c: input cursor, the fake peer, the world */
uint8_t fz_u8(fz_t *z);
uint32_t fz_u32(fz_t *z);
/* Request ids and rounds: mostly small (collisions), sometimes huge. */
uint64_t fz_small(fz_t *z);
void fz_fail(fz_t *z, const char *fmt, const char *arg);
uint32_t fz_key(uint32_t k, uint8_t *out);
void fz_block(uint32_t k, uint8_t *buf, size_t len);
void fz_keys(fz_t *z, fz_keys_t *ks, uint32_t n);
fz_nop_t *fz_nop_new(fz_t *z);
/* Send from the fake peer with the epochs z->epoch_mode asks for. */
void peer_send(fz_t *z, const kvp_msg_t *m);
void peer_flush_writes(fz_t *z);
void fz_tick(fz_t *z, uint64_t ns);
void fz_advance(fz_t *z, uint64_t ns, uint64_t step);
void fz_check(fz_t *z);
void fz_config(fz_t *z, uint8_t conf);
int fz_setup(fz_t *z, uint8_t conf);
void fz_teardown(fz_t *z);

#endif
