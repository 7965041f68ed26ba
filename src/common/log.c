/* log.c -- leveled logging with a replaceable sink and rate limiting. */
#include "common.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A library is quiet by default (warnings and errors only); the daemon and
 * embeddings raise it with kvp_set_log_level / KVPEER_LOG_LEVEL. */
int kvp__log_level = KVP_LOG_WARN;

static kvp_log_sink_cb log_sink;
static void *log_sink_arg;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic uint64_t log_counts[KVP_LOG_TRACE + 1];
static _Atomic uint64_t log_suppressed;

static const char *const level_names[] = {"ERROR", "WARN", "INFO", "DEBUG", "TRACE"};

__attribute__((constructor)) static void log_init_from_env(void)
{
    const char *v = getenv("KVPEER_LOG_LEVEL");
    if (v == NULL)
        return;
    if (v[0] >= '0' && v[0] <= '4' && v[1] == '\0') { /* numeric, as kvpeer.h documents */
        kvp__log_level = v[0] - '0';
        return;
    }
    for (int i = 0; i <= KVP_LOG_TRACE; i++) {
        if (strcasecmp(v, level_names[i]) == 0)
            kvp__log_level = i;
    }
}

void kvp_log_set_level(kvp_log_level_t level)
{
    kvp__log_level = (int)level;
}

void kvp_log_set_sink(kvp_log_sink_cb sink, void *arg)
{
    pthread_mutex_lock(&log_lock);
    log_sink = sink;
    log_sink_arg = arg;
    pthread_mutex_unlock(&log_lock);
}

uint64_t kvp_log_count(kvp_log_level_t level)
{
    return atomic_load(&log_counts[level]);
}

uint64_t kvp_log_suppressed(void)
{
    return atomic_load(&log_suppressed);
}

void kvp__log(kvp_log_level_t level, const char *prefix, const char *fmt, ...)
{
    char raw[1024], line[2048];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(raw, sizeof(raw), fmt, ap);
    va_end(ap);
    /* Issue 27: every argument of every call site may hold a peer's bytes
     * (peer ids, instance ids and reasons come from HELLO); escaping the
     * whole line here means no call site can forget it: no newline, ESC or
     * invalid UTF-8 a peer sends reaches stderr or the embedding's logger. */
    kvp_escape(line, sizeof(line), raw, strlen(raw), KVP_ESCAPE_BACKSLASH);
    atomic_fetch_add(&log_counts[level], 1);

    pthread_mutex_lock(&log_lock);
    if (log_sink != NULL) {
        log_sink(level, prefix, line, log_sink_arg);
    } else {
        /* one format for every kvpeer line: ISO-8601 UTC date and time */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        struct tm tm;
        gmtime_r(&ts.tv_sec, &tm);
        fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s [%s] %s\n", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                ts.tv_nsec / 1000000, level_names[level], prefix ? prefix : "kvpeer", line);
    }
    pthread_mutex_unlock(&log_lock);
}

void kvp_ratelimit_init(kvp_ratelimit_t *rl, uint64_t interval_ns, uint32_t burst)
{
    memset(rl, 0, sizeof(*rl));
    rl->interval_ns = interval_ns;
    rl->burst = burst ? burst : 1;
}

bool kvp_ratelimit_allow(kvp_ratelimit_t *rl, uint64_t now_ns, uint64_t *suppressed)
{
    if (rl->emitted == 0 || now_ns - rl->window_start >= rl->interval_ns) {
        rl->window_start = now_ns;
        rl->emitted = 0;
    }
    if (rl->emitted < rl->burst) {
        rl->emitted++;
        *suppressed = rl->suppressed;
        rl->suppressed = 0;
        return true;
    }
    rl->suppressed++;
    atomic_fetch_add(&log_suppressed, 1);
    return false;
}

void kvp__assert_fail(const char *cond, const char *file, int line, const char *func)
{
    fprintf(stderr, "kvpeer: assertion failed: %s (%s:%d %s)\n", cond, file, line, func);
    abort();
}

/* Public: route every library line to the embedding's logger. */
static kvp_log_fn public_fn;

static void public_sink(kvp_log_level_t level, const char *prefix, const char *line, void *arg)
{
    public_fn((int32_t)level, prefix ? prefix : "kvpeer", line, arg);
}

KVP_EXPORT void kvp_set_log_callback(kvp_log_fn fn, void *arg)
{
    pthread_mutex_lock(&log_lock);
    public_fn = fn;
    log_sink = fn ? public_sink : NULL;
    log_sink_arg = arg;
    pthread_mutex_unlock(&log_lock);
}
