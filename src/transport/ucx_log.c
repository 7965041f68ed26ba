/*
 * ucx_log.c -- UCX's own log lines go through kvpeer's log (issue 27).
 *
 * UCX prints its warnings and errors itself, to stderr, byte for byte. Some
 * carry what another party chose: an address, a worker name from a peer's
 * blob, an environment variable's name (measured: `UCX_X<ESC>[31m` in the
 * environment reached the terminal as a colour escape). Every kvpeer log
 * line is escaped (kvp_escape) and goes to the process's sink (kvpeerd's
 * log file, kvp_set_log_callback); UCX's lines now take the same road: a
 * handler pushed in front of UCX's default one formats the line, hands it
 * to kvp__log with the prefix "ucx" at the matching level, and stops UCX's
 * own printing. UCX's handler stack is global, so the handler is pushed
 * once per process (the first UCX node) and stays: UCX calls it only for
 * lines its own UCX_LOG_LEVEL lets through (default WARN).
 */
#include "transport/ucx_int.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <ucs/debug/log_def.h>

static kvp_log_level_t level_of(ucs_log_level_t l)
{
    if (l <= UCS_LOG_LEVEL_ERROR)
        return KVP_LOG_ERROR;
    if (l == UCS_LOG_LEVEL_WARN)
        return KVP_LOG_WARN;
    if (l <= UCS_LOG_LEVEL_INFO)
        return KVP_LOG_INFO;
    return KVP_LOG_DEBUG;
}

static ucs_log_func_rc_t ucx_log_handler(const char *file, unsigned line, const char *function,
                                         ucs_log_level_t level,
                                         const ucs_log_component_config_t *comp,
                                         const char *fmt, va_list ap)
{
    (void)line;
    (void)function;
    (void)comp;
    kvp_log_level_t lv = level_of(level);
    if ((int)lv > kvp__log_level)
        return UCS_LOG_FUNC_RC_STOP;
    char msg[512];
    va_list cp;
    va_copy(cp, ap);
    vsnprintf(msg, sizeof(msg), fmt, cp);
    va_end(cp);
    const char *base = file ? strrchr(file, '/') : NULL;
    kvp__log(lv, "ucx", "%s (%s)", msg, base ? base + 1 : (file ? file : "?"));
    return UCS_LOG_FUNC_RC_STOP;
}

static void push_handler(void)
{
    ucs_log_push_handler(ucx_log_handler);
}

void kvp__ucx_log_install(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, push_handler);
}
