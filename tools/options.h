/*
 * options.h -- kvpeerd settings: one option table (name, type, default, doc,
 * where the value lives) from which the INI config file, KVPEER_<NAME>
 * environment variables, command-line flags, --help and --print-config all
 * come. Precedence: defaults < config file < environment < flags.
 */
#ifndef KVPD_OPTIONS_H
#define KVPD_OPTIONS_H

#include "kvpeer.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

enum { KVPD_PSK_MAX = 256 };

typedef enum kvpd_log_level {
    KVPD_LOG_ERROR = 0,
    KVPD_LOG_WARN = 1,
    KVPD_LOG_INFO = 2,
    KVPD_LOG_DEBUG = 3,
    KVPD_LOG_TRACE = 4,
} kvpd_log_level_t;

/* Everything the daemon is configured with. Owns every string field (heap,
 * freed by kvpd_settings_free). `cfg` is the node configuration; its string
 * and psk pointers are set by kvpd_settings_load to borrow from this struct,
 * so `cfg` is valid while the settings live. */
typedef struct kvpd_settings {
    kvp_config_t cfg;
    char *config;      /* config file path ("" = none) */
    char *listen;      /* -> cfg.listen_addr */
    char *peer_id;     /* "" = NULL in cfg */
    char *instance_id; /* "" = NULL in cfg */
    char *name;        /* "" = NULL in cfg */
    char *compat;
    char *psk_hex;
    char *psk_file;
    char *peers;       /* comma list of host:port */
    char *http;        /* "" = no HTTP server */
    char *ready_file;  /* "" = none */
    char *log_file;    /* "" = stderr; reopened on SIGHUP (logrotate) */
    char *transport;   /* only "ucx" */
    char *log_level_s;
    bool admin;
    int log_level; /* kvpd_log_level_t */
    uint8_t psk[KVPD_PSK_MAX];
    uint32_t psk_len;
    /* issue 27 (HTTP door): the admin API's bearer token and the HTTP caps */
    char *admin_token_file;  /* required with admin (admin_token.c) */
    uint8_t admin_token[32]; /* its digest (KVPD_TOKEN_DIGEST), never the token */
    uint32_t http_max_conns, http_max_per_ip, http_idle_ms;
    /* issue 28: peers from a DNS name (kvpeerd_dns.c) */
    char *peers_dns;                /* "name:port", "" = off */
    uint32_t peers_dns_interval_ms; /* re-resolve period */
    uint32_t peers_dns_max;         /* addresses kept from one answer */
} kvpd_settings_t;

/* Result of kvpd_settings_load. */
enum {
    KVPD_LOAD_RUN = 0,  /* start the daemon */
    KVPD_LOAD_EXIT = 1, /* --help / --print-config done: exit 0 */
    KVPD_LOAD_ERROR = 2 /* message written: exit 2 */
};

void kvpd_settings_init(kvpd_settings_t *s);
void kvpd_settings_free(kvpd_settings_t *s);

/* Fill `s` (initialised) from the config file (--config FILE or
 * KVPEER_CONFIG), KVPEER_<NAME> variables and argv, then check it. --help and
 * --print-config write to `out`; every error is one line on `err` naming the
 * option and where its value came from (file and line, variable, flag). */
int kvpd_settings_load(kvpd_settings_t *s, int argc, char **argv, FILE *out, FILE *err);

/* Set one option by name from text; `origin` names where it came from (for
 * the error message). Returns 0, or -1 after writing one line to `err`. */
int kvpd_settings_set(kvpd_settings_t *s, const char *name, const char *value,
                      const char *origin, FILE *err);

/* Apply an INI file (sections optional and ignored; keys = option names). */
int kvpd_settings_load_file(kvpd_settings_t *s, const char *path, FILE *err);

/* Every option, one "name = value" line (INI syntax; the psk is redacted). */
void kvpd_settings_print(const kvpd_settings_t *s, FILE *out);
void kvpd_settings_help(FILE *out);
/* True if SIGHUP applies option `name` to the running daemon (timings,
 * limits, the PSK for new sessions, peers, log level and file); false if a
 * change needs a restart (or `name` is unknown). */
bool kvpd_option_runtime(const char *name);
/* After a reload that the node accepted: the runtime options' values of
 * `src` become `dst`'s (strings swapped: kvpd_settings_free(src) frees the
 * old ones); the restart-only options of `dst` stay as they run. */
void kvpd_settings_keep_runtime(kvpd_settings_t *dst, kvpd_settings_t *src);

/* ------------------------------------------- admin token (admin_token.c) */

enum { KVPD_TOKEN_DIGEST = 32 };
/* Read the admin bearer token from `path` (a regular file with no group or
 * other permission bits, one line of 16..512 printable characters) into its
 * digest. 0, or -1 after one line on `err` naming the file and the reason. */
int kvpd_admin_token_load(const char *path, uint8_t out[KVPD_TOKEN_DIGEST], FILE *err);
void kvpd_admin_token_digest(const void *tok, size_t len, uint8_t out[KVPD_TOKEN_DIGEST]);
/* True if `header` (an Authorization header value, may be NULL) is
 * "Bearer <token>" for the token whose digest is `want` (constant time). */
bool kvpd_admin_token_check(const uint8_t want[KVPD_TOKEN_DIGEST], const char *header);

#endif
