/*
 * kvpeer_cli.h -- internals shared by the files of the `kvpeer` CLI
 * (kvpeer.c: dispatch + operator commands, kvpeer_http.c: HTTP client and
 * Prometheus parser, kvpeer_proc.c: kvpeerd children, kvpeer_demo.c,
 * kvpeer_bench.c). Nothing here is library API.
 */
#ifndef KVPEER_CLI_H
#define KVPEER_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Exit codes: 0 ok / PASS, 1 failure / FAIL, 2 usage error. */
enum { CLI_EXIT_OK = 0, CLI_EXIT_FAIL = 1, CLI_EXIT_USAGE = 2 };

/* ------------------------------------------------------------ HTTP client */

/* One response. `body` is heap memory owned by the response (NUL-terminated);
 * cli_http_free() releases it. status is 0 when no response was read. */
typedef struct cli_http_resp {
    int status;
    char *body;
    size_t len;
} cli_http_resp_t;

/* Blocking HTTP/1.1 request (Connection: close) to "host:port" with an
 * overall deadline. Returns 0 and fills *out (caller frees) or -1 with a
 * one-line reason in err (cap errcap). */
int cli_http_request(const char *hostport, const char *method, const char *path,
                     int timeout_ms, cli_http_resp_t *out, char *err, size_t errcap);
void cli_http_free(cli_http_resp_t *r);
/* GET/POST that must answer 200; on success *body is malloc'd (caller frees). */
int cli_http_call(const char *hostport, const char *method, const char *path, int timeout_ms,
                  char **body, char *err, size_t errcap);

/* kvpeerd's admin token (issue 27): write a fresh random one into
 * dir/admin.token (mode 0600) for daemons this process starts (pass that
 * path as --admin_token_file); every later /admin/ request carries it.
 * Without it, /admin/ requests carry the token of $KVPEER_ADMIN_TOKEN_FILE.
 * 0 / -1 (errno). */
int cli_admin_token_make(const char *dir, char *path, size_t cap);

/* -------------------------------------------------- Prometheus text parser */

/* One sample: name, raw label text (without braces, "" if none), value.
 * Strings point into the metrics object's own copy of the text. */
typedef struct cli_sample {
    const char *name;
    const char *labels;
    double value;
} cli_sample_t;

/* Parsed exposition; owns its text and sample array (cli_metrics_free). */
typedef struct cli_metrics {
    char *text;
    cli_sample_t *s;
    size_t n;
} cli_metrics_t;

/* Parse Prometheus text format 0.0.4 (comments skipped). 0 / -1. */
int cli_metrics_parse(const char *text, cli_metrics_t *out);
void cli_metrics_free(cli_metrics_t *m);
/* Sum of every sample of `name` whose labels contain each `k="v"` of the
 * comma-separated `match` ("" or NULL = all). */
double cli_metric(const cli_metrics_t *m, const char *name, const char *match);
/* Value of label `key` in a raw label text into out (cap); 0 / -1. */
int cli_label(const char *labels, const char *key, char *out, size_t cap);
/* Scrape hostport's /metrics into *out. 0 / -1 (err filled). */
int cli_scrape(const char *hostport, cli_metrics_t *out, char *err, size_t errcap);

/* Find `key=` in a space-separated "k=v k=v" line; copies the value. 0 / -1. */
int cli_kv(const char *line, const char *key, char *out, size_t cap);
/* Same, as an unsigned integer (strtoull); -1 when absent or not a number. */
int cli_kv_u64(const char *line, const char *key, uint64_t *out);

/* ------------------------------------------------------------ kvpeerd kids */

/* Spawn argv[0] with argv, extra environment entries (NULL-terminated
 * "K=V" list, may be NULL), stdout+stderr appended to logpath. The child
 * is registered so cli_children_kill_all() (atexit + fatal signals) reaps
 * it, and gets PR_SET_PDEATHSIG SIGKILL. Returns the pid or -1. */
pid_t cli_spawn(char *const argv[], char *const extra_env[], const char *logpath);
/* Wait for pid with a deadline: returns 1 and the wait status when it
 * exited, 0 on timeout. Unregisters it when reaped. */
int cli_wait(pid_t pid, int timeout_ms, int *wstatus);
/* SIGKILL + reap (also SIGCONT first, so a stopped child dies). */
void cli_kill_reap(pid_t pid);
/* Install atexit + SIGINT/SIGTERM/SIGHUP/SIGQUIT handlers (idempotent). */
void cli_children_guard(void);
/* Kill and reap every registered child (async-signal-safe). */
void cli_children_kill_all(void);
/* An unused TCP port on 127.0.0.1 (bound then closed), or 0. */
int cli_free_port(void);
/* Path of the kvpeerd binary: --kvpeerd value if given, else next to
 * /proc/self/exe, else "kvpeerd" in PATH. Writes into out (cap). */
void cli_find_kvpeerd(const char *given, char *out, size_t cap);
/* Same for a sibling build-tree file relative to our own directory
 * (e.g. "../bench/transport/ucx_bench"); 0 if it exists and is executable. */
int cli_find_sibling(const char *rel, char *out, size_t cap);

/* -------------------------------------------------------------- utilities */

uint64_t cli_now_ns(void);
void cli_sleep_ms(int ms);
/* KVPEER_TEST_TIME_SCALE from the environment (>= 1). */
unsigned cli_time_scale(void);
/* Parse a decimal/size value with optional K/M/G suffix (binary). 0 / -1. */
int cli_parse_size(const char *s, uint64_t *out);

/* ------------------------------------------------------------- commands */

int cli_cmd_demo(int argc, char **argv);
int cli_cmd_bench(int argc, char **argv);

#endif /* KVPEER_CLI_H */
