/*
 * tcpd_int.h -- internals of kvpeer's own tcp data stream shared by tcpd.c
 * (progress, open, close), tcpd_in.c (the listener and receiving) and
 * tcpd_out.c (sending). See tcpd.h for the wire and why. Not an API.
 */
#ifndef KVP_TRANSPORT_TCPD_INT_H
#define KVP_TRANSPORT_TCPD_INT_H

#include "transport/tcpd.h"

#include <sys/uio.h>

#define TCPD_BACKOFF_NS (100 * KVP_NSEC_PER_MSEC) /* listener paused after EMFILE */
#define TCPD_CHECK_NS (50 * KVP_NSEC_PER_MSEC)    /* deadline scan period */
#define TCPD_READ_BUDGET ((size_t)4 << 20)        /* bytes per connection per progress */
#define TCPD_IOV 32

enum { K_LISTEN = 1, K_IN = 2, K_OUT = 3 };
enum { IN_PREAUTH = 0, IN_HDR, IN_DATA, IN_DEAD };
enum { OUT_CONNECTING = 0, OUT_OPEN, OUT_FAILED };

typedef struct tcpd_in {
    uint8_t kind; /* K_IN: first, as in every epoll target */
    uint8_t state;
    kvp_list_t link; /* t->preauth, t->open or t->dead_ins */
    int fd;
    uint64_t deadline_ns;
    struct sockaddr_storage peer;
    uint64_t src_token;
    uint32_t got; /* bytes of the current unit (preface, header or data) */
    kvp_tcpd_preface_t pre;
    kvp_tcpd_piece_t hdr;
    uint8_t *buf; /* KVP_TCPD_PIECE_MAX, once authenticated */
} tcpd_in_t;

typedef struct tcpd_q {
    kvp_tcpd_piece_t h;
    const uint8_t *data;
    void *cookie;
} tcpd_q_t;

struct kvp_tcpd_out {
    uint8_t kind; /* K_OUT */
    uint8_t state;
    kvp_list_t link; /* t->outs or t->dead_outs */
    kvp_tcpd_t *t;
    int fd;
    void *owner;
    uint64_t deadline_ns; /* connect */
    uint32_t events;      /* registered epoll events */
    kvp_tcpd_preface_t pre;
    uint32_t pre_sent;
    tcpd_q_t *q; /* ring: q[(qhead + i) % qcap], i < qlen */
    size_t qcap, qhead, qlen;
    size_t head_off; /* bytes of the head entry (header + data) already written */
    char name[64];
};

struct kvp_tcpd {
    uint8_t kind; /* K_LISTEN */
    char prefix[64];
    kvp_tcpd_config_t cfg;
    kvp_tcpd_cbs_t cbs;
    int lfd, epfd, reserve_fd;
    bool paused;
    uint64_t resume_ns, next_check_ns;
    kvp_list_t preauth, open, outs, dead_ins, dead_outs;
    uint32_t n_preauth, n_open;
    kvp_tcpd_addr_t local;
    kvp_ratelimit_t rl;
    kvp_tcpd_stats_t st;
};


/* tcpd.c */
uint64_t kvp__tcpd_now_ns(void);
/* The one writer of an inbound / outbound stream's state: each allowed
 * move checked against a table (issue 31; UCX does so for its tcp
 * endpoints). */
void kvp__tcpd_in_set_state(tcpd_in_t *c, uint8_t to);
void kvp__tcpd_out_set_state(kvp_tcpd_out_t *o, uint8_t to);
void kvp__tcpd_addr_str(const struct sockaddr_storage *ss, char *buf, size_t cap);
int kvp__tcpd_ep_set(kvp_tcpd_t *t, int op, int fd, uint32_t events, void *ptr);
/* tcpd_in.c */
void kvp__tcpd_in_close(kvp_tcpd_t *t, tcpd_in_t *c, const char *why);
void kvp__tcpd_in_read(kvp_tcpd_t *t, tcpd_in_t *c);
void kvp__tcpd_on_accept(kvp_tcpd_t *t);
/* tcpd_out.c */
void kvp__tcpd_out_fail(kvp_tcpd_out_t *o, const char *why);
void kvp__tcpd_out_connected(kvp_tcpd_out_t *o);
void kvp__tcpd_out_write(kvp_tcpd_out_t *o);

#endif /* KVP_TRANSPORT_TCPD_INT_H */
