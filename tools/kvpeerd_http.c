/*
 * kvpeerd_http.c -- the kvpeerd HTTP server (libmicrohttpd). Routes and
 * response texts: docs/API.md. Read-only routes here; /admin/ routes in
 * kvpeerd_admin.c.
 *
 * Threads (issue 27): one thread per connection, so that an admin request
 * blocked on its kvp event (up to its timeout_ms) never stalls /healthz or
 * /metrics -- an epoll loop on one thread would need every blocking handler
 * rewritten around MHD_suspend_connection. What keeps the threads bounded
 * a total connection cap (http_max_conns; ours, kvpeerd_http_cap.c: past it the
 * connection waiting longest for its request is cut, so slow clients cannot
 * hold it shut), a cap per client address (http_max_per_ip: libmicrohttpd's,
 * and ours per IPv6 /64 in kvpeerd_http_cap.c) and libmicrohttpd's
 * idle timeout (http_idle_ms) that closes a connection sending nothing
 * (slowloris); poll() instead of
 * select(), so a descriptor above 1023 is served. An authenticated admin
 * request lifts the timeout for itself: its handler bounds its own wait.
 * Every string a client or a peer chose is escaped (kvpd_esc) in the access
 * line, in error bodies and in /peers, /held and /healthz.
 */
#include "kvpeerd_http.h"
#include "metrics.h"

#include <microhttpd.h>
#include <arpa/inet.h>
#include <stdarg.h>
#include <errno.h>
#include <netdb.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int kvpd_http_param_u64(struct MHD_Connection *c, const char *name, int required, uint64_t def,
                        uint64_t max, uint64_t *out, kvpd_buf_t *err)
{
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    char *end;
    if (v == NULL || v[0] == '\0') {
        if (required) {
            kvpd_buf_printf(err, "missing parameter %s\n", name);
            return -1;
        }
        *out = def;
        return 0;
    }
    if (v[0] < '0' || v[0] > '9') {
        kvpd_buf_printf(err, "parameter %s: '%s' is not a non-negative integer\n", name,
                        kvpd_escq(v).s);
        return -1;
    }
    unsigned long long x = strtoull(v, &end, 10);
    if (*end != '\0' || x > max) {
        kvpd_buf_printf(err, "parameter %s: '%s' is not an integer in 0..%llu\n", name,
                        kvpd_escq(v).s, (unsigned long long)max);
        return -1;
    }
    *out = x;
    return 0;
}

/* 200 while the node's progress thread keeps completing rounds (at least
 * every few hundred ms); 503 once it has been stuck for longer than
 * max(5 s, 4 x dead-after), e.g. inside the transport, so that a supervisor
 * restarts a daemon whose peers already consider it dead. Never waits on
 * the node thread. */
static int get_healthz(kvpd_t *d, struct MHD_Connection *c, kvpd_buf_t *out)
{
    uint64_t stall = kvp_node_stall_ms(d->node);
    uint64_t limit = 4ull * atomic_load(&d->dead_after_ms);
    if (limit < 5000)
        limit = 5000;
    if (stall > limit) {
        kvpd_buf_printf(out, "stalled: the node thread has not progressed for %llu ms\n",
                        (unsigned long long)stall);
        return MHD_HTTP_SERVICE_UNAVAILABLE;
    }
    /* Up, but not everything it was told to reach is reachable: say so
     * (200, so a supervisor does not restart us for a peer's fault). */
    kvp_peer_state_t *ps = NULL;
    uint32_t n = 0, bad = 0, wanted = 0;
    if (kvpd_states_snapshot(d->node, &ps, &n) == KVP_OK) {
        for (uint32_t i = 0; i < n; i++) {
            if (!ps[i].wanted)
                continue;
            wanted++;
            bad += strcmp(ps[i].state, "ready") != 0;
        }
        if (bad > 0) {
            kvpd_buf_printf(out, "degraded: %u of %u wanted peers not ready\n", bad, wanted);
            for (uint32_t i = 0; i < n; i++)
                if (ps[i].wanted && strcmp(ps[i].state, "ready") != 0)
                    kvpd_buf_printf(out, "peer=%s state=%s error=\"%s\"\n",
                                    kvpd_esc(ps[i].peer).s, ps[i].state,
                                    kvpd_escq(ps[i].last_error).s);
        }
        free(ps);
        if (bad > 0)
            return MHD_HTTP_OK;
    }
    kvpd_buf_printf(out, "ok\n");
    return MHD_HTTP_OK;
}

static int get_metrics(kvpd_t *d, struct MHD_Connection *c, kvpd_buf_t *out)
{
    kvp_status_t st = kvpd_metrics_render(d->node, out);
    if (st != KVP_OK) {
        kvpd_buf_free(out);
        kvpd_buf_printf(out, "metrics unavailable: %s\n", kvp_status_str(st));
        return MHD_HTTP_INTERNAL_SERVER_ERROR;
    }
    uint64_t cut, refused;
    kvpd_hcap_totals(d, &cut, &refused);
    kvpd_buf_printf(out,
                    "# HELP kvpeer_http_cut_total HTTP connections closed at the cap "
                    "(http_max_conns), each the one waiting longest without a request\n"
                    "# TYPE kvpeer_http_cut_total counter\nkvpeer_http_cut_total %llu\n"
                    "# HELP kvpeer_http_addr_refused_total HTTP connections refused past "
                    "their client address's cap (http_max_per_ip; IPv6: per /64)\n"
                    "# TYPE kvpeer_http_addr_refused_total counter\n"
                    "kvpeer_http_addr_refused_total %llu\n",
                    (unsigned long long)cut, (unsigned long long)refused);
    return MHD_HTTP_OK;
}

static int get_held(kvpd_t *d, struct MHD_Connection *c, kvpd_buf_t *out)
{
    kvp_held_item_t *h = NULL;
    uint32_t n = 0;
    kvp_status_t st = kvpd_held_snapshot(d->node, &h, &n);
    if (st != KVP_OK) {
        kvpd_buf_printf(out, "held unavailable: %s\n", kvp_status_str(st));
        return MHD_HTTP_INTERNAL_SERVER_ERROR;
    }
    for (uint32_t i = 0; i < n; i++) {
        unsigned long long age = (unsigned long long)h[i].age_ms;
        if (h[i].kind == 1)
            kvpd_buf_printf(out, "retained id=%llu peer=%s age_ms=%llu\n",
                            (unsigned long long)h[i].id, kvpd_esc(h[i].peer).s, age);
        else
            kvpd_buf_printf(out, "%s slot=%u peer=%s age_ms=%llu\n",
                            h[i].kind == 2 ? "quarantined" : "suspect", h[i].slot,
                            kvpd_esc(h[i].peer).s, age);
    }
    free(h);
    return MHD_HTTP_OK;
}

/* One line per known peer: wanted ones and those with a session, with the
 * state, failed attempts and last error; session details when there is one. */
static int get_peers(kvpd_t *d, struct MHD_Connection *c, kvpd_buf_t *out)
{
    kvp_peer_info_t *p = NULL;
    kvp_peer_state_t *ps = NULL;
    uint32_t n = 0, ns = 0;
    kvp_status_t st = kvpd_peers_snapshot(d->node, &p, &n);
    if (st == KVP_OK && (st = kvpd_states_snapshot(d->node, &ps, &ns)) != KVP_OK)
        free(p);
    if (st != KVP_OK) {
        kvpd_buf_printf(out, "peers unavailable: %s\n", kvp_status_str(st));
        return MHD_HTTP_INTERNAL_SERVER_ERROR;
    }
    for (uint32_t k = 0; k < ns; k++) {
        const kvp_peer_info_t *pi = NULL;
        for (uint32_t i = 0; i < n && pi == NULL; i++)
            if (strcmp(p[i].peer, ps[k].peer) == 0)
                pi = &p[i];
        kvpd_buf_printf(out, "peer=%s state=%s wanted=%u failures=%u", kvpd_esc(ps[k].peer).s,
                        ps[k].state, ps[k].wanted, ps[k].failures);
        if (pi != NULL)
            kvpd_buf_printf(out, " instance=%s path=%s ready=%u probation=%u rtt_us=%llu",
                            pi->instance[0] ? kvpd_esc(pi->instance).s : "-",
                            pi->data_path[0] ? kvpd_esc(pi->data_path).s : "-", pi->ready ? 1u : 0u,
                            pi->probation ? 1u : 0u, (unsigned long long)(pi->rtt_ns / 1000));
        else
            kvpd_buf_printf(out, " ready=0");
        kvpd_buf_printf(out, " last_error=\"%s\"\n", kvpd_escq(ps[k].last_error).s);
    }
    free(p);
    free(ps);
    return MHD_HTTP_OK;
}

typedef struct route {
    const char *path;
    const char *method;
    int admin;
    kvpd_http_handler_fn fn;
} route_t;

static const route_t routes[] = {
    {"/metrics", "GET", 0, get_metrics},
    {"/healthz", "GET", 0, get_healthz},
    {"/held", "GET", 0, get_held},
    {"/peers", "GET", 0, get_peers},
    {"/admin/put", "POST", 1, kvpd_admin_put},
    {"/admin/fetch", "POST", 1, kvpd_admin_fetch},
    {"/admin/finish", "POST", 1, kvpd_admin_finish},
    {"/admin/peer", "POST", 1, kvpd_admin_peer},
    {"/admin/verify", "GET", 1, kvpd_admin_verify},
#ifdef KVPD_TEST_ROUTES /* test builds only (tools/CMakeLists.txt) */
    {"/admin/corrupt", "POST", 1, kvpd_admin_corrupt},
#endif
};

enum { HTTP_UNAUTHORIZED = -401 }; /* route(): 401 with WWW-Authenticate */

static int route(kvpd_t *d, struct MHD_Connection *c, const char *url, const char *method,
                 kvpd_buf_t *out)
{
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        const route_t *r = &routes[i];
        if (strcmp(url, r->path) != 0)
            continue;
        if (r->admin && !d->set.admin) {
            kvpd_buf_printf(out, "admin API disabled (start kvpeerd with --admin)\n");
            return MHD_HTTP_FORBIDDEN;
        }
        /* Issue 27: before anything else of the request is looked at. */
        if (r->admin && !kvpd_admin_token_check(d->set.admin_token,
                                                MHD_lookup_connection_value(
                                                    c, MHD_HEADER_KIND,
                                                    MHD_HTTP_HEADER_AUTHORIZATION))) {
            kvpd_buf_printf(out, "admin API: missing or wrong bearer token "
                                 "(Authorization: Bearer <the admin_token_file's token>)\n");
            return HTTP_UNAUTHORIZED;
        }
        if (r->admin) /* trusted caller: its handler bounds its own wait */
            MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, 0u);
        /* HEAD is answered like GET (libmicrohttpd drops the body). */
        if (strcmp(method, r->method) != 0 &&
            !(strcmp(r->method, "GET") == 0 && strcmp(method, "HEAD") == 0)) {
            kvpd_buf_printf(out, "method %s not allowed on %s (use %s)\n", kvpd_esc(method).s,
                            url, r->method); /* url: one of ours */
            return MHD_HTTP_METHOD_NOT_ALLOWED;
        }
        return r->fn(d, c, out);
    }
    kvpd_buf_printf(out, "not found: %s\n", kvpd_esc(url).s);
    return MHD_HTTP_NOT_FOUND;
}

/* One access line per request: DEBUG when it succeeded, INFO when it did
 * not -- at most ACCESS_BURST error lines per second (a flood of 401s or
 * 404s is one line and a count, not a full disk). */
enum { ACCESS_BURST = 20 };
static pthread_mutex_t access_lock = PTHREAD_MUTEX_INITIALIZER;

static void http_access_log(int code, const char *method, const char *url)
{
    static uint64_t window, in_window, suppressed;
    if (code < 400) {
        kvpd_log(KVPD_LOG_DEBUG, "http", "method=%s path=%s code=%d", kvpd_esc(method).s,
                 kvpd_esc(url).s, code);
        return;
    }
    uint64_t now = kvpd_now_ms() / 1000, sup = 0;
    pthread_mutex_lock(&access_lock);
    if (now != window) {
        window = now;
        in_window = 0;
    }
    bool emit = in_window++ < ACCESS_BURST;
    if (emit) {
        sup = suppressed;
        suppressed = 0;
    } else
        suppressed++;
    pthread_mutex_unlock(&access_lock);
    if (emit)
        kvpd_log(KVPD_LOG_INFO, "http", "method=%s path=%s code=%d%s%.0llu",
                 kvpd_esc(method).s, kvpd_esc(url).s, code, sup ? " suppressed=" : "",
                 (unsigned long long)sup);
}

/* libmicrohttpd's own messages (refused connections, timeouts, bad
 * requests): escaped, and at most ACCESS_BURST a second like access lines. */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    static uint64_t window, in_window;
    char text[512];
    (void)cls;
    uint64_t now = kvpd_now_ms() / 1000;
    pthread_mutex_lock(&access_lock);
    if (now != window) {
        window = now;
        in_window = 0;
    }
    bool emit = in_window++ < ACCESS_BURST;
    pthread_mutex_unlock(&access_lock);
    if (!emit)
        return;
    vsnprintf(text, sizeof(text), fmt, ap);
    text[strcspn(text, "\n")] = '\0';
    kvpd_log(KVPD_LOG_WARN, "http_server", "msg=\"%s\"", kvpd_escq(text).s);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    static int started;
    kvpd_t *d = cls;
    kvpd_buf_t out = {0};
    if (*con_cls == NULL) { /* headers only so far: wait for the (ignored) body */
        *con_cls = &started;
        return MHD_YES;
    }
    if (*upload_data_size != 0) {
        *upload_data_size = 0;
        return MHD_YES;
    }
    kvpd_hcap_request(d, c, true); /* the whole request is in: never cut from here */
    kvpd_ops_lock(d);
    d->http_active++;
    kvpd_ops_unlock(d);
    int code = route(d, c, url, method, &out);
    if (strncmp(url, "/admin/", 7) == 0) /* the idle timeout again for what follows */
        MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT,
                                  (unsigned int)((d->set.http_idle_ms + 999) / 1000));
    bool unauth = code == HTTP_UNAUTHORIZED;
    if (unauth)
        code = MHD_HTTP_UNAUTHORIZED;
    if (out.oom) { /* all-or-nothing: never a truncated body */
        kvpd_buf_free(&out);
        code = MHD_HTTP_INTERNAL_SERVER_ERROR;
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer(out.len, out.p ? out.p : (char *)"", MHD_RESPMEM_MUST_COPY);
    kvpd_buf_free(&out);
    if (r == NULL)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                            strcmp(url, "/metrics") == 0 ? "text/plain; version=0.0.4; charset=utf-8"
                                                         : "text/plain; charset=utf-8");
    if (unauth)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE,
                                "Bearer realm=\"kvpeerd admin\"");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)code, r);
    MHD_destroy_response(r);
    kvpd_ops_lock(d);
    d->http_active--;
    kvpd_ops_unlock(d);
    http_access_log(code, method, url);
    return ret;
}

/* host:port or [v6]:port -> host (brackets removed) and port text. */
static int split_hostport(const char *hp, char *host, size_t cap, const char **port)
{
    const char *colon = strrchr(hp, ':');
    if (colon == NULL)
        return -1;
    bool v6 = hp[0] == '[';
    size_t hl = (size_t)(colon - hp) - (v6 ? 2 : 0);
    if (hl >= cap || (v6 && colon[-1] != ']'))
        return -1;
    memcpy(host, hp + (v6 ? 1 : 0), hl);
    host[hl] = '\0';
    *port = colon + 1;
    return 0;
}

/* Our own listening socket (so a bind error names the address and the
 * reason; IPv4 and IPv6 alike); handed to libmicrohttpd. -1 on error, logged. */
static int http_listen(const char *hp, int *family)
{
    char host[256];
    const char *port;
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int rc = split_hostport(hp, host, sizeof(host), &port);
    if (rc != 0 || (rc = getaddrinfo(host[0] ? host : NULL, port, &hints, &ai)) != 0) {
        kvpd_log(KVPD_LOG_ERROR, "http_failed", "http=%s error=\"cannot resolve: %s\"", hp,
                 rc ? gai_strerror(rc) : "not host:port");
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
        kvpd_log(KVPD_LOG_ERROR, "http_failed", "http=%s error=\"cannot listen on port %s: %s\"",
                 hp, port, strerror(errno));
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return -1;
    }
    *family = ai->ai_family;
    freeaddrinfo(ai);
    return fd;
}

int kvpd_http_start(kvpd_t *d)
{
    char host[240];
    const char *port;
    int family = AF_INET, fd = http_listen(d->set.http, &family);
    if (fd < 0)
        return -1;
    if (kvpd_hcap_init(d) != 0) {
        close(fd);
        kvpd_log(KVPD_LOG_ERROR, "http_failed", "http=%s error=\"out of memory\"", d->set.http);
        return -1;
    }
    d->http = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
            MHD_USE_ITC | MHD_USE_ERROR_LOG | (family == AF_INET6 ? MHD_USE_IPv6 : 0),
        0, NULL, NULL, on_request, d, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
        MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_NOTIFY_CONNECTION, kvpd_hcap_on_connection, d,
        MHD_OPTION_NOTIFY_COMPLETED, kvpd_hcap_on_completed, d, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned int)(2 * d->set.http_max_conns + KVPD_HTTP_HEADROOM),
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned int)d->set.http_max_per_ip,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)((d->set.http_idle_ms + 999) / 1000),
        MHD_OPTION_END);
    if (d->http == NULL) {
        close(fd);
        kvpd_hcap_free(d);
        kvpd_log(KVPD_LOG_ERROR, "http_failed", "http=%s error=\"cannot start the HTTP server\"",
                 d->set.http);
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    unsigned bound = 0;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        bound = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    split_hostport(d->set.http, host, sizeof(host), &port);
    snprintf(d->http_addr, sizeof(d->http_addr), "%s%s%s:%u", family == AF_INET6 ? "[" : "",
             host[0] ? host : (family == AF_INET6 ? "::" : "0.0.0.0"),
             family == AF_INET6 ? "]" : "", bound);
    kvpd_log(KVPD_LOG_INFO, "http_up", "http=%s admin=%d max_conns=%u max_per_ip=%u idle_ms=%u",
             d->http_addr, d->set.admin ? 1 : 0, d->set.http_max_conns, d->set.http_max_per_ip,
             d->set.http_idle_ms);
    if (d->set.admin && strncmp(host, "127.", 4) != 0 && strcmp(host, "localhost") != 0 &&
        strcmp(host, "::1") != 0)
        kvpd_log(KVPD_LOG_WARN, "admin_exposed",
                 "http=%s note=\"the admin API (put/corrupt/peer) is reachable off-host\"",
                 d->http_addr);
    return 0;
}

void kvpd_http_stop(kvpd_t *d)
{
    if (d->http == NULL)
        return;
    /* Waiters already gave up (kvpd_ops_stop): handlers finish quickly; give
     * their answers a moment to go out before connections are cut. */
    MHD_socket ls = MHD_quiesce_daemon(d->http);
    uint64_t end = kvpd_now_ms() + 2000;
    int active = 1;
    while (active && kvpd_now_ms() < end) {
        kvpd_ops_lock(d);
        active = d->http_active;
        kvpd_ops_unlock(d);
        if (active)
            usleep(10 * 1000);
    }
    usleep(50 * 1000);
    MHD_stop_daemon(d->http);
    if (ls != MHD_INVALID_SOCKET)
        close(ls); /* quiesce handed the listen socket to us */
    d->http = NULL;
    kvpd_hcap_free(d);
}
