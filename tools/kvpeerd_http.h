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
#ifdef KVPD_TEST_ROUTES
int kvpd_admin_corrupt(kvpd_t *d, struct MHD_Connection *c, kvpd_buf_t *out);
#endif

#endif
