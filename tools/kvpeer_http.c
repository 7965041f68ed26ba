/*
 * kvpeer_http.c -- a tiny blocking HTTP/1.1 client (one request per TCP
 * connection, "Connection: close") for kvpeerd's local endpoints, and a
 * Prometheus text-format parser. Only talks to addresses the operator names;
 * every read and write is bounded by one overall deadline.
 */
#include "kvpeer_cli.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HTTP_MAX_BODY (64u << 20) /* a /metrics page is a few KiB; refuse absurd ones */

uint64_t cli_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void cli_sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000l};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

unsigned cli_time_scale(void)
{
    const char *s = getenv("KVPEER_TEST_TIME_SCALE");
    long v = s ? strtol(s, NULL, 10) : 1;
    return v >= 1 && v <= 100 ? (unsigned)v : 1u;
}

int cli_parse_size(const char *s, uint64_t *out)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || s[0] == '-')
        return -1;
    unsigned shift = 0;
    if (*end == 'k' || *end == 'K')
        shift = 10;
    else if (*end == 'm' || *end == 'M')
        shift = 20;
    else if (*end == 'g' || *end == 'G')
        shift = 30;
    if (shift != 0) {
        end++;
        if (*end == 'i' || *end == 'I')
            end++;
        if (*end == 'b' || *end == 'B')
            end++;
    }
    if (*end != '\0' || (shift && v > (~0ull >> shift)))
        return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

/* ------------------------------------------------------------ transport */

static int remaining_ms(uint64_t deadline)
{
    uint64_t now = cli_now_ns();
    return now >= deadline ? 0 : (int)((deadline - now) / 1000000ull) + 1;
}

static int wait_fd(int fd, short ev, uint64_t deadline)
{
    for (;;) {
        struct pollfd p = {.fd = fd, .events = ev};
        int ms = remaining_ms(deadline);
        if (ms == 0)
            return -1;
        int r = poll(&p, 1, ms);
        if (r > 0)
            return 0;
        if (r < 0 && errno != EINTR)
            return -1;
    }
}

static int split_hostport(const char *hp, char *host, size_t cap, char *port, size_t pcap)
{
    const char *c = strrchr(hp, ':');
    if (c == NULL || c == hp || (size_t)(c - hp) >= cap || strlen(c + 1) >= pcap || !c[1])
        return -1;
    memcpy(host, hp, (size_t)(c - hp));
    host[c - hp] = '\0';
    strcpy(port, c + 1);
    return 0;
}

static int connect_to(const char *hostport, uint64_t deadline, char *err, size_t errcap)
{
    char host[256], port[16];
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    if (split_hostport(hostport, host, sizeof(host), port, sizeof(port)) != 0) {
        snprintf(err, errcap, "bad address '%s' (want HOST:PORT)", hostport);
        return -1;
    }
    int rc = getaddrinfo(host, port, &hints, &ai);
    if (rc != 0) {
        snprintf(err, errcap, "%s: %s", hostport, gai_strerror(rc));
        return -1;
    }
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        goto fail_ai;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0 && errno != EINPROGRESS)
        goto fail_fd;
    int soerr = 0;
    socklen_t sl = sizeof(soerr);
    if (wait_fd(fd, POLLOUT, deadline) != 0) {
        errno = ETIMEDOUT;
        goto fail_fd;
    }
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) != 0 || soerr != 0) {
        errno = soerr ? soerr : errno;
        goto fail_fd;
    }
    freeaddrinfo(ai);
    return fd;
fail_fd:
    rc = errno;
    close(fd);
    errno = rc;
fail_ai:
    snprintf(err, errcap, "%s: connect: %s", hostport, strerror(errno));
    freeaddrinfo(ai);
    return -1;
}

static int send_all(int fd, const char *buf, size_t len, uint64_t deadline)
{
    while (len > 0) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n > 0) {
            buf += n;
            len -= (size_t)n;
        } else if (n < 0 && errno == EINTR) {
            continue;
        } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (wait_fd(fd, POLLOUT, deadline) != 0)
                return -1;
        } else {
            return -1;
        }
    }
    return 0;
}

/* Read until EOF (the server closes: we asked for Connection: close). */
static int recv_all(int fd, char **out, size_t *outlen, uint64_t deadline)
{
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap + 1);
    if (buf == NULL)
        return -1;
    for (;;) {
        if (len == cap) {
            char *nb = cap >= HTTP_MAX_BODY ? NULL : realloc(buf, cap * 2 + 1);
            if (nb == NULL)
                goto fail;
            buf = nb;
            cap *= 2;
        }
        ssize_t n = recv(fd, buf + len, cap - len, 0);
        if (n > 0) {
            len += (size_t)n;
        } else if (n == 0) {
            break;
        } else if (errno == EINTR) {
            continue;
        } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
            if (wait_fd(fd, POLLIN, deadline) != 0)
                goto fail;
        } else {
            goto fail;
        }
    }
    buf[len] = '\0';
    *out = buf;
    *outlen = len;
    return 0;
fail:
    free(buf);
    return -1;
}

/* Split a raw response into status and body (dechunks if needed). */
static int parse_response(char *raw, size_t len, cli_http_resp_t *out)
{
    int status = 0;
    if (sscanf(raw, "HTTP/1.%*d %d", &status) != 1)
        return -1;
    char *hdr_end = strstr(raw, "\r\n\r\n");
    if (hdr_end == NULL)
        return -1;
    *hdr_end = '\0';
    char *body = hdr_end + 4;
    size_t blen = len - (size_t)(body - raw);
    bool chunked = strcasestr(raw, "transfer-encoding: chunked") != NULL;
    char *res = malloc(blen + 1);
    if (res == NULL)
        return -1;
    size_t rlen = 0;
    if (!chunked) {
        memcpy(res, body, blen);
        rlen = blen;
    } else {
        char *p = body, *end = body + blen;
        while (p < end) {
            char *e = NULL;
            unsigned long n = strtoul(p, &e, 16);
            char *nl = strstr(p, "\r\n");
            if (e == p || nl == NULL || n == 0 || (size_t)(end - (nl + 2)) < n)
                break;
            memcpy(res + rlen, nl + 2, n);
            rlen += n;
            p = nl + 2 + n + 2;
        }
    }
    res[rlen] = '\0';
    out->status = status;
    out->body = res;
    out->len = rlen;
    return 0;
}

int cli_http_request(const char *hostport, const char *method, const char *path,
                     int timeout_ms, cli_http_resp_t *out, char *err, size_t errcap)
{
    uint64_t deadline = cli_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    char req[2048], *raw = NULL;
    size_t rawlen = 0;
    int n = snprintf(req, sizeof(req),
                     "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: kvpeer\r\n"
                     "Content-Length: 0\r\nConnection: close\r\n\r\n",
                     method, path, hostport);
    if (n < 0 || (size_t)n >= sizeof(req)) {
        snprintf(err, errcap, "request too long");
        return -1;
    }
    int fd = connect_to(hostport, deadline, err, errcap);
    if (fd < 0)
        return -1;
    if (send_all(fd, req, (size_t)n, deadline) != 0 || recv_all(fd, &raw, &rawlen, deadline) != 0) {
        snprintf(err, errcap, "%s %s %s: %s", hostport, method, path,
                 remaining_ms(deadline) == 0 ? "timed out" : strerror(errno));
        close(fd);
        return -1;
    }
    close(fd);
    int rc = parse_response(raw, rawlen, out);
    free(raw);
    if (rc != 0)
        snprintf(err, errcap, "%s %s %s: malformed HTTP response", hostport, method, path);
    return rc;
}

void cli_http_free(cli_http_resp_t *r)
{
    free(r->body);
    r->body = NULL;
}

int cli_http_call(const char *hostport, const char *method, const char *path, int timeout_ms,
                  char **body, char *err, size_t errcap)
{
    cli_http_resp_t r;
    if (cli_http_request(hostport, method, path, timeout_ms, &r, err, errcap) != 0)
        return -1;
    if (r.status != 200) {
        char *nl = strchr(r.body, '\n');
        if (nl)
            *nl = '\0';
        snprintf(err, errcap, "%s %s %s: HTTP %d %s", hostport, method, path, r.status, r.body);
        cli_http_free(&r);
        return -1;
    }
    *body = r.body;
    return 0;
}

/* ------------------------------------------------------------ Prometheus */

/* Parse one sample line in place: `name{labels} value [ts]`. */
static int parse_sample(char *line, cli_sample_t *s)
{
    char *p = line;
    while (*p && *p != '{' && *p != ' ' && *p != '\t')
        p++;
    if (p == line)
        return -1;
    s->labels = "";
    if (*p == '{') {
        *p++ = '\0';
        s->labels = p;
        bool inq = false;
        for (; *p && (inq || *p != '}'); p++) {
            if (*p == '\\' && inq && p[1])
                p++;
            else if (*p == '"')
                inq = !inq;
        }
        if (*p != '}')
            return -1;
        *p++ = '\0';
    } else {
        *p++ = '\0';
    }
    s->name = line;
    char *end = NULL;
    s->value = strtod(p, &end);
    return end == p ? -1 : 0;
}

int cli_metrics_parse(const char *text, cli_metrics_t *out)
{
    cli_metrics_t m = {.text = strdup(text)};
    size_t cap = 0;
    if (m.text == NULL)
        return -1;
    for (char *save = NULL, *line = strtok_r(m.text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        while (*line == ' ' || *line == '\t')
            line++;
        if (*line == '#' || *line == '\0' || *line == '\r')
            continue;
        if (m.n == cap) {
            cap = cap ? cap * 2 : 64;
            cli_sample_t *ns = realloc(m.s, cap * sizeof(*ns));
            if (ns == NULL) {
                cli_metrics_free(&m);
                return -1;
            }
            m.s = ns;
        }
        if (parse_sample(line, &m.s[m.n]) == 0)
            m.n++;
    }
    *out = m;
    return 0;
}

void cli_metrics_free(cli_metrics_t *m)
{
    free(m->text);
    free(m->s);
    memset(m, 0, sizeof(*m));
}

int cli_label(const char *labels, const char *key, char *out, size_t cap)
{
    size_t kl = strlen(key);
    for (const char *p = labels; p && *p;) {
        while (*p == ',' || *p == ' ')
            p++;
        if (strncmp(p, key, kl) == 0 && p[kl] == '=' && p[kl + 1] == '"') {
            const char *v = p + kl + 2, *e = v;
            while (*e && *e != '"')
                e += (*e == '\\' && e[1]) ? 2 : 1;
            size_t n = (size_t)(e - v);
            if (n >= cap)
                return -1;
            memcpy(out, v, n);
            out[n] = '\0';
            return 0;
        }
        p = strchr(p, '"');
        if (p == NULL)
            break;
        p = strchr(p + 1, '"'); /* skip the value */
        if (p == NULL)
            break;
        p++;
    }
    return -1;
}

/* Every `k="v"` of match (comma separated) holds in labels. */
static bool labels_match(const char *labels, const char *match)
{
    if (match == NULL || *match == '\0')
        return true;
    char buf[512], val[256];
    snprintf(buf, sizeof(buf), "%s", match);
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (eq == NULL)
            return false;
        *eq = '\0';
        const char *want = eq + 1;
        size_t wl = strlen(want);
        if (wl >= 2 && want[0] == '"' && want[wl - 1] == '"') {
            ((char *)want)[wl - 1] = '\0';
            want++;
        }
        if (cli_label(labels, kv, val, sizeof(val)) != 0 || strcmp(val, want) != 0)
            return false;
    }
    return true;
}

double cli_metric(const cli_metrics_t *m, const char *name, const char *match)
{
    double sum = 0;
    for (size_t i = 0; i < m->n; i++)
        if (strcmp(m->s[i].name, name) == 0 && labels_match(m->s[i].labels, match))
            sum += m->s[i].value;
    return sum;
}

int cli_scrape(const char *hostport, cli_metrics_t *out, char *err, size_t errcap)
{
    char *body = NULL;
    if (cli_http_call(hostport, "GET", "/metrics", 5000, &body, err, errcap) != 0)
        return -1;
    int rc = cli_metrics_parse(body, out);
    free(body);
    if (rc != 0)
        snprintf(err, errcap, "%s: cannot parse /metrics", hostport);
    return rc;
}

/* ------------------------------------------------------------ k=v lines */

int cli_kv(const char *line, const char *key, char *out, size_t cap)
{
    size_t kl = strlen(key);
    for (const char *p = line; p && *p;) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (strncmp(p, key, kl) == 0 && p[kl] == '=') {
            const char *v = p + kl + 1;
            size_t n = strcspn(v, " \t\r\n");
            if (n >= cap)
                return -1;
            memcpy(out, v, n);
            out[n] = '\0';
            return 0;
        }
        p += strcspn(p, " \t\r\n");
        if (*p == '\n' || *p == '\r')
            break; /* one line only */
    }
    return -1;
}

int cli_kv_u64(const char *line, const char *key, uint64_t *out)
{
    char v[32], *end = NULL;
    if (cli_kv(line, key, v, sizeof(v)) != 0)
        return -1;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0')
        return -1;
    *out = x;
    return 0;
}
