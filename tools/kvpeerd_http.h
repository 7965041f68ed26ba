/*
 * kvpeerd_http.h -- shared by the kvpeerd HTTP router (kvpeerd_http.c) and
 * the admin handlers (kvpeerd_admin.c).
 */
#ifndef KVPD_HTTP_H
#define KVPD_HTTP_H

#include "kvpeerd.h"
#include "metrics.h"

struct MHD_Connection;

/* A route handler writes the body to `out` and returns the HTTP status. */
typedef int (*kvpd_http_handler_fn)(kvpd_t *d, struct MHD_Connection *c, kvpd_buf_t *out);

/* Query parameter `name` as an integer in 0..max (absent: def, or an error
 * if required). Returns 0, or -1 with a one-line reason in err. */
int kvpd_http_param_u64(struct MHD_Connection *c, const char *name, int required, uint64_t def,
                        uint64_t max, uint64_t *out, kvpd_buf_t *err);

int kvpd_admin_put(kvpd_t *d, struct MHD_Connection *c, kvpd_buf_t *out);
int kvpd_admin_fetch(kvpd_t *d, struct MHD_Connection *c, kvpd_buf_t *out);
int kvpd_admin_finish(kvpd_t *d, struct MHD_Connection *c, kvpd_buf_t *out);
int kvpd_admin_peer(kvpd_t *d, struct MHD_Connection *c, kvpd_buf_t *out);
int kvpd_admin_verify(kvpd_t *d, struct MHD_Connection *c, kvpd_buf_t *out);
/* The connection cap that a slow client cannot hold shut (kvpeerd_http_cap.c):
 * tracks every connection from accept; past http_max_conns open ones, cuts
 * the one that waited longest without a request in a handler, of the client
 * address holding the most. libmicrohttpd's own cap, a backstop, is set at
 * twice http_max_conns plus KVPD_HTTP_HEADROOM, for cut connections still
 * closing (a flood cuts hundreds a second; at http_max_conns + 16, and at
 * twice it + 16 under ASan beside other tests, their closing threads filled
 * it on this 2-core VM and libmicrohttpd refused other clients at accept).
 * init before the HTTP server starts (0 or -1: no memory), free after it
 * stopped. The two callbacks are MHD_OPTION_NOTIFY_CONNECTION's and
 * MHD_OPTION_NOTIFY_COMPLETED's (cls: d); kvpd_hcap_request(.., true) when a
 * whole request is in (headers and body: its handler runs). */
#define KVPD_HTTP_HEADROOM 64
enum MHD_ConnectionNotificationCode;
enum MHD_RequestTerminationCode;
int kvpd_hcap_init(kvpd_t *d);
void kvpd_hcap_free(kvpd_t *d);
void kvpd_hcap_on_connection(void *cls, struct MHD_Connection *mc, void **socket_context,
                             enum MHD_ConnectionNotificationCode code);
void kvpd_hcap_on_completed(void *cls, struct MHD_Connection *mc, void **con_cls,
                            enum MHD_RequestTerminationCode toe);
void kvpd_hcap_request(kvpd_t *d, struct MHD_Connection *mc, bool in_handler);
/* since start: connections cut at the total cap, refused at an address's */
void kvpd_hcap_totals(kvpd_t *d, uint64_t *cut_total, uint64_t *refused_total);

#ifdef KVPD_TEST_ROUTES
int kvpd_admin_corrupt(kvpd_t *d, struct MHD_Connection *c, kvpd_buf_t *out);
#endif

#endif
