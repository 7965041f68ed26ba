/*
 * kvpeer_http.c -- the CLI's HTTP client for kvpeerd's endpoints (libcurl,
 * one request per call, one overall deadline) and a Prometheus text-format
 * parser. Only talks to addresses the operator names.
 */
#include "kvpeer_cli.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* ---------------------------------------------------------- admin token */

/* Issue 27: kvpeerd's /admin/ routes need "Authorization: Bearer <token>".
 * The token is the one the demo or the bench made for its own daemons
 * (cli_admin_token_make), else the first line of $KVPEER_ADMIN_TOKEN_FILE
 * (the operator's, the file kvpeerd's admin_token_file names). */
static char g_admin_token[520];
static pthread_mutex_t g_token_lock = PTHREAD_MUTEX_INITIALIZER;

static void admin_token_from_env(void)
{
    const char *path = getenv("KVPEER_ADMIN_TOKEN_FILE");
    FILE *f = path && path[0] ? fopen(path, "r") : NULL;
    if (f == NULL)
        return;
    if (fgets(g_admin_token, sizeof(g_admin_token), f) == NULL)
        g_admin_token[0] = '\0';
    g_admin_token[strcspn(g_admin_token, "\r\n \t")] = '\0';
    fclose(f);
}

/* "Authorization: Bearer <token>" into hdr, or "" when there is none. */
static void admin_auth_header(char *hdr, size_t cap)
{
    pthread_mutex_lock(&g_token_lock);
    if (g_admin_token[0] == '\0')
        admin_token_from_env();
    if (g_admin_token[0] != '\0')
        snprintf(hdr, cap, "Authorization: Bearer %s", g_admin_token);
    else
        hdr[0] = '\0';
    pthread_mutex_unlock(&g_token_lock);
}

int cli_admin_token_make(const char *dir, char *path, size_t cap)
{
    uint8_t rnd[24];
    char tok[2 * sizeof(rnd) + 1];
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
        return -1;
    for (size_t i = 0; i < sizeof(rnd); i++)
        snprintf(tok + 2 * i, 3, "%02x", rnd[i]);
    if ((size_t)snprintf(path, cap, "%s/admin.token", dir) >= cap)
        return -1;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -1;
    /* an old file of another mode keeps it through O_TRUNC: make it 0600 */
    int ok = fchmod(fd, 0600) == 0 && dprintf(fd, "%s\n", tok) == (int)strlen(tok) + 1;
    if (close(fd) != 0 || !ok)
        return -1;
    pthread_mutex_lock(&g_token_lock);
    snprintf(g_admin_token, sizeof(g_admin_token), "%s", tok);
    pthread_mutex_unlock(&g_token_lock);
    return 0;
}

/* ------------------------------------------------------------ transport */

/* The HTTP client is libcurl (Debian libcurl4-openssl-dev): one easy handle
 * per request, an overall deadline, the body collected into one buffer. */

typedef struct body_buf {
    char *p;
    size_t len, cap;
    bool too_big;
} body_buf_t;

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
    body_buf_t *b = arg;
    size_t n = size * nmemb;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *np = cap > HTTP_MAX_BODY + 1 ? NULL : realloc(b->p, cap);
        if (np == NULL) {
            b->too_big = true;
            return 0; /* aborts the transfer */
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
    return n;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

int cli_http_request(const char *hostport, const char *method, const char *path,
                     int timeout_ms, cli_http_resp_t *out, char *err, size_t errcap)
{
    char url[2048];
    body_buf_t b = {0};
    int n = snprintf(url, sizeof(url), "http://%s%s", hostport, path);
    if (n < 0 || (size_t)n >= sizeof(url)) {
        snprintf(err, errcap, "request too long");
        return -1;
    }
    pthread_once(&curl_once, curl_init_once);
    CURL *c = curl_easy_init();
    if (c == NULL) {
        snprintf(err, errcap, "libcurl: cannot create a handle");
        return -1;
    }
    char cerr[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (strcmp(method, "POST") == 0) { /* an empty body, Content-Length: 0 */
        curl_easy_setopt(c, CURLOPT_POST, 1L);
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, 0L);
    }
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout_ms > 0 ? timeout_ms : 1));
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "kvpeer/" KVP_VERSION_STRING);
    curl_easy_setopt(c, CURLOPT_NOPROXY, "*"); /* operator endpoints: never via a proxy */
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
    struct curl_slist *hdrs = NULL;
    char auth[600];
    if (strncmp(path, "/admin/", 7) == 0) {
        admin_auth_header(auth, sizeof(auth));
        if (auth[0] && (hdrs = curl_slist_append(NULL, auth)) != NULL)
            curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    }
    CURLcode rc = curl_easy_perform(c);
    curl_slist_free_all(hdrs);
    long status = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(c);
    if (rc != CURLE_OK) {
        snprintf(err, errcap, "%s %s %s: %s", hostport, method, path,
                 b.too_big ? "response too large" : cerr[0] ? cerr : curl_easy_strerror(rc));
        free(b.p);
        return -1;
    }
    if (b.p == NULL && (b.p = calloc(1, 1)) == NULL) {
        snprintf(err, errcap, "out of memory");
        return -1;
    }
    out->status = (int)status;
    out->body = b.p;
    out->len = b.len;
    return 0;
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
