/*
 * options.c -- the kvpeerd option table and everything generated from it:
 * INI parsing (libinih), KVPEER_<NAME> variables, flags, --help and
 * --print-config. Node options keep the defaults of kvp_config_init() (the
 * table's default text is NULL for them), so SPEC §8 lives in one place.
 */
#include "options.h"

#include <ctype.h>
#include <errno.h>
#include <ini.h>
#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <netdb.h>
#include <sys/stat.h>
#include <unistd.h>

typedef enum opt_type {
    OPT_U32,   /* uint32_t */
    OPT_U64,   /* uint64_t */
    OPT_BOOL8, /* uint8_t 0/1 (kvp_config_t flags) */
    OPT_BOOL,  /* bool */
    OPT_STR,   /* char * (owned) */
    OPT_LEVEL, /* int: error|warn|info|debug|trace, text kept in log_level_s */
} opt_type_t;

enum {
    F_SIZE = 1,   /* integer accepts K/M/G suffixes (binary) */
    F_NOFILE = 2, /* not allowed in the config file (--config itself) */
    F_RUNTIME = 4, /* SIGHUP applies it to the running daemon (kvp_node_reconfigure) */
};

typedef struct opt {
    const char *name;
    opt_type_t type;
    unsigned flags;
    size_t off; /* into kvpd_settings_t */
    uint64_t min, max;
    const char *def; /* NULL: keep the kvp_config_init() default */
    const char *doc;
} opt_t;

#define S(f) offsetof(kvpd_settings_t, f)
#define C(f) offsetof(kvpd_settings_t, cfg.f)
#define MS(f, lo, doc) {#f, OPT_U32, F_RUNTIME, C(f), lo, UINT32_MAX, NULL, doc}

static const opt_t opts[] = {
    {"config", OPT_STR, F_NOFILE, S(config), 0, 0, "", "INI config file (flag or KVPEER_CONFIG)"},
    {"listen", OPT_STR, 0, S(listen), 0, 0, "127.0.0.1:0",
     "control listen address host:port (port 0 = ephemeral)"},
    {"peer_id", OPT_STR, 0, S(peer_id), 0, 0, "", "advertised peer id (empty = bound address)"},
    {"instance_id", OPT_STR, 0, S(instance_id), 0, 0, "",
     "instance id shared by the ranks of one engine (empty = peer id)"},
    {"name", OPT_STR, 0, S(name), 0, 0, "", "log prefix (empty = peer id)"},
    {"peers", OPT_STR, F_RUNTIME, S(peers), 0, 0, "", "peers to connect at start, comma list of host:port"},
    {"http", OPT_STR, 0, S(http), 0, 0, "",
     "HTTP address host:port for /metrics etc. (empty = off, port 0 = ephemeral)"},
    {"admin", OPT_BOOL, 0, S(admin), 0, 1, "false", "serve the /admin/ endpoints (tests, demo)"},
    {"log_file", OPT_STR, F_RUNTIME, S(log_file), 0, 0, "",
     "append log lines to this file instead of stderr; reopened on SIGHUP"},
    {"ready_file", OPT_STR, 0, S(ready_file), 0, 0, "",
     "write 'peer=<id> http=<host:port>' here once up (empty = none)"},
    {"log_level", OPT_LEVEL, F_RUNTIME, S(log_level), 0, 0, "info", "error|warn|info|debug|trace or 0..4 (daemon and library)"},
    {"transport", OPT_STR, 0, S(transport), 0, 0, "ucx", "data transport (only ucx)"},
    {"num_blocks", OPT_U32, 0, C(num_blocks), 1, 1u << 30, NULL, "slots in the region"},
    {"block_size", OPT_U32, F_SIZE, C(block_size), 1, 1u << 30, NULL,
     "bytes per block, a multiple of the page size (K/M suffixes)"},
    {"compat", OPT_STR, 0, S(compat), 0, 0, "", "compatibility string (fingerprint source)"},
    {"hash_seed", OPT_U64, 0, C(hash_seed), 0, UINT64_MAX, NULL, "checksum/fingerprint seed"},
    {"psk", OPT_STR, F_RUNTIME, S(psk_hex), 0, 0, "",
     "pre-shared key, hex (empty = none); as a flag every local user sees it in "
     "/proc/PID/cmdline: use psk_file"},
    {"psk_file", OPT_STR, F_RUNTIME, S(psk_file), 0, 0, "",
     "file holding the pre-shared key: 32..128 hex digits (openssl rand -hex 32), "
     "mode 600"},
    {"verify_checksums", OPT_BOOL8, 0, C(verify_checksums), 0, 1, NULL, "verify block checksums"},
    {"huge_pages", OPT_BOOL8, 0, C(huge_pages), 0, 1, NULL, "map the region with huge pages"},
    MS(heartbeat_ms, 1, "PING interval on idle sessions"),
    MS(dead_after_ms, 1, "session dead after this long without a frame"),
    MS(handshake_timeout_ms, 1, "connected but not ready"),
    MS(lookup_pending_ms, 1, "FILLING keys answered MISS after this"),
    MS(supply_pin_ms, 1, "lookup-pinned supply never fetched is unpinned"),
    MS(pin_lease_ms, 0, "lease of lookup pins, renewed by the requester (0 = supply_pin_ms)"),
    MS(load_timeout_ms, 1, "abort a fetch"),
    MS(abort_resend_ms, 1, "ABORT re-sent this often"),
    MS(abort_ack_timeout_ms, 1, "then escalate"),
    MS(parked_demand_ms, 1, "WAIT_FOR_SUPPLY demand parked this long"),
    MS(hold_cap_ms, 1, "retained transfers / quarantined slots force-released after"),
    {"suspect_period_ms", OPT_U64, 0, C(suspect_period_ms), 0, UINT64_MAX, NULL,
     "re-verify suspect slots on acquire this long (0 = 10 x hold cap)"},
    MS(idle_session_ms, 1, "close sessions with no work"),
    MS(shutdown_drain_ms, 0, "bounded drain at shutdown (rolling restarts)"),
    {"max_sessions", OPT_U32, F_RUNTIME, C(max_sessions), 1, UINT32_MAX, NULL, "sessions cap"},
    {"max_pins", OPT_U32, 0, C(max_pins), 0, UINT32_MAX, NULL, "pins cap (0 = 4 x num_blocks)"},
    {"max_retained", OPT_U32, 0, C(max_retained), 1, UINT32_MAX, NULL, "retained transfers cap"},
    {"max_quarantined", OPT_U32, F_RUNTIME, C(max_quarantined), 0, UINT32_MAX, NULL,
     "quarantined slots cap (0 = 25% of the region)"},
    {"max_inflight_bytes_per_peer", OPT_U64, F_SIZE | F_RUNTIME, C(max_inflight_bytes_per_peer), 1,
     UINT64_MAX, NULL, "bytes in flight per peer (K/M/G suffixes)"},
    MS(backoff_min_ms, 1, "redial backoff, first"),
    MS(backoff_max_ms, 1, "redial backoff, cap"),
    /* issue 27: the HTTP door */
    {"admin_token_file", OPT_STR, 0, S(admin_token_file), 0, 0, "",
     "bearer token of the /admin/ routes, one line, file mode 0600 (required with admin)"},
    {"http_max_conns", OPT_U32, 0, S(http_max_conns), 1, 4096, "128",
     "HTTP connections at once (one thread each; past it the longest-waiting is cut)"},
    {"http_max_per_ip", OPT_U32, 0, S(http_max_per_ip), 1, 4096, "32",
     "HTTP connections at once from one client address"},
    {"http_idle_ms", OPT_U32, 0, S(http_idle_ms), 1000, 3600000, "5000",
     "an HTTP connection silent this long is closed (whole seconds, rounded up)"},
    /* issue 27: per-peer budgets (0 = the library's default, kvpeer.h) */
    {"max_supply_pins_per_peer", OPT_U32, F_RUNTIME, C(max_supply_pins_per_peer), 0, UINT32_MAX,
     NULL, "slots one peer's lookups may hold pinned (0 = num_blocks/4, at least min(64, num_blocks/2))"},
    {"max_supply_pins", OPT_U32, F_RUNTIME, C(max_supply_pins), 0, UINT32_MAX, NULL,
     "slots all peers' lookups may hold pinned (0 = num_blocks/2)"},
    {"max_lookup_rounds_per_peer", OPT_U32, F_RUNTIME, C(max_lookup_rounds_per_peer), 0, UINT32_MAX,
     NULL, "live lookup/fetch rounds of one peer (0 = 1024)"},
    {"max_lookup_bytes_per_peer", OPT_U64, F_SIZE | F_RUNTIME, C(max_lookup_bytes_per_peer), 0,
     UINT64_MAX, NULL, "memory of one peer's live rounds (0 = 16M; K/M/G suffixes)"},
    MS(max_lease_ms, 0, "total lifetime of a lookup's pin lease, renewals included (0 = 4 x the lease)"),
    {"max_quarantined_per_peer", OPT_U32, F_RUNTIME, C(max_quarantined_per_peer), 0, UINT32_MAX, NULL,
     "quarantined slots of one faulty peer past which it is served from FREE slots only "
     "(0 = num_blocks/8)"},
    {"max_wanted_peers", OPT_U32, F_RUNTIME, C(max_wanted_peers), 0, UINT32_MAX, NULL,
     "peers added by config or /admin/peer (0 = max_sessions)"},
    {"max_lookup_keys_per_sec", OPT_U32, F_RUNTIME, C(max_lookup_keys_per_sec), 0, UINT32_MAX,
     NULL, "keys one peer's LOOKUPs may have looked up per second (0 = no limit)"},
    /* issue 27: the control plane's gate */
    {"insecure", OPT_BOOL8, 0, C(insecure), 0, 1, NULL,
     "allow a listen address beyond loopback without a psk (anyone reaching the port can "
     "read and overwrite the region; logged loudly, kvpeer_insecure 1)"},
    {"max_preauth", OPT_U32, F_RUNTIME, C(max_preauth), 1, 4096, NULL,
     "connections not yet authenticated, in all"},
    {"max_preauth_per_addr", OPT_U32, F_RUNTIME, C(max_preauth_per_addr), 1, 4096, NULL,
     "connections not yet authenticated, from one source address"},
    MS(preauth_timeout_ms, 1, "a connection must authenticate within this (<= handshake_timeout_ms)"),
    {"data_port", OPT_U32, 0, C(data_port), 0, 65535, NULL,
     "port of the tcp data stream on the listen host (0 = ephemeral; fix it for firewall rules)"},
    /* issue 28: peers from a DNS name (a Kubernetes headless service) */
    {"peers_dns", OPT_STR, 0, S(peers_dns), 0, 0, "",
     "name:port resolving to many peers, re-resolved every peers_dns_interval_ms (empty = off)"},
    {"peers_dns_interval_ms", OPT_U32, 0, S(peers_dns_interval_ms), 100, 86400000, "30000",
     "how often peers_dns is resolved again"},
    {"peers_dns_max", OPT_U32, 0, S(peers_dns_max), 1, 65536, "64",
     "addresses of one peers_dns answer wanted, at most (max_wanted_peers caps too)"},
};
#define N_OPTS (sizeof(opts) / sizeof(opts[0]))

static const char *const level_names[] = {"error", "warn", "info", "debug", "trace"};

static void *field(kvpd_settings_t *s, const opt_t *o)
{
    return (char *)s + o->off;
}

static const void *cfield(const kvpd_settings_t *s, const opt_t *o)
{
    return (const char *)s + o->off;
}

/* Option names are matched with '-' and '_' equivalent, case-insensitive. */
static const opt_t *opt_find(const char *name, size_t len)
{
    for (size_t i = 0; i < N_OPTS; i++) {
        const char *n = opts[i].name;
        size_t j = 0;
        for (; j < len && n[j]; j++) {
            char a = name[j] == '-' ? '_' : (char)tolower((unsigned char)name[j]);
            if (a != n[j])
                break;
        }
        if (j == len && n[j] == '\0')
            return &opts[i];
    }
    return NULL;
}

/* Unsigned integer with an optional binary K/M/G suffix (F_SIZE). */
static int parse_uint(const opt_t *o, const char *v, uint64_t *out, const char **why)
{
    char *end;
    while (isspace((unsigned char)*v))
        v++;
    if (*v == '\0' || *v == '-' || !isdigit((unsigned char)*v)) {
        *why = "is not a non-negative integer";
        return -1;
    }
    errno = 0;
    int base = (v[0] == '0' && (v[1] == 'x' || v[1] == 'X')) ? 16 : 10;
    unsigned long long x = strtoull(v, &end, base);
    if (errno != 0) {
        *why = "is out of range";
        return -1;
    }
    unsigned shift = 0;
    if ((o->flags & F_SIZE) && *end) {
        switch (toupper((unsigned char)*end)) {
        case 'K': shift = 10; end++; break;
        case 'M': shift = 20; end++; break;
        case 'G': shift = 30; end++; break;
        default: break;
        }
        if (shift && *end == 'i')
            end++;
        if (shift && (*end == 'B' || *end == 'b'))
            end++;
    }
    while (isspace((unsigned char)*end))
        end++;
    if (*end != '\0') {
        *why = (o->flags & F_SIZE) ? "is not an integer (K/M/G suffixes allowed)"
                                   : "is not an integer";
        return -1;
    }
    if (shift && x > (UINT64_MAX >> shift)) {
        *why = "is out of range";
        return -1;
    }
    x <<= shift;
    if (x < o->min || x > o->max) {
        *why = "is out of range";
        return -1;
    }
    *out = x;
    return 0;
}

static int parse_bool(const char *v, bool *out)
{
    static const char *const t[] = {"1", "true", "yes", "on"}, *const f[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, t[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(v, f[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return -1;
}

static int set_str(char **dst, const char *v)
{
    char *c = strdup(v);
    if (c == NULL)
        return -1;
    free(*dst);
    *dst = c;
    return 0;
}

static int opt_apply(kvpd_settings_t *s, const opt_t *o, const char *v, const char **why)
{
    uint64_t x;
    bool b;
    switch (o->type) {
    case OPT_U32:
    case OPT_U64:
        if (parse_uint(o, v, &x, why) != 0)
            return -1;
        if (o->type == OPT_U32)
            *(uint32_t *)field(s, o) = (uint32_t)x;
        else
            *(uint64_t *)field(s, o) = x;
        return 0;
    case OPT_BOOL:
    case OPT_BOOL8:
        if (parse_bool(v, &b) != 0) {
            *why = "is not a boolean (true/false, 1/0, yes/no, on/off)";
            return -1;
        }
        if (o->type == OPT_BOOL)
            *(bool *)field(s, o) = b;
        else
            *(uint8_t *)field(s, o) = b ? 1 : 0;
        return 0;
    case OPT_LEVEL:
        if (v[0] >= '0' && v[0] <= '0' + KVPD_LOG_TRACE && v[1] == '\0') {
            s->log_level = v[0] - '0'; /* numeric, as KVPEER_LOG_LEVEL in kvpeer.h */
            return set_str(&s->log_level_s, level_names[s->log_level]);
        }
        for (int i = 0; i <= KVPD_LOG_TRACE; i++) {
            if (strcasecmp(v, level_names[i]) == 0) {
                s->log_level = i;
                return set_str(&s->log_level_s, level_names[i]);
            }
        }
        *why = "is not one of error|warn|info|debug|trace";
        return -1;
    case OPT_STR:
        if (set_str((char **)field(s, o), v) != 0) {
            *why = "could not be stored (out of memory)";
            return -1;
        }
        return 0;
    }
    return -1;
}

int kvpd_settings_set(kvpd_settings_t *s, const char *name, const char *value,
                      const char *origin, FILE *err)
{
    const opt_t *o = opt_find(name, strlen(name));
    const char *why = "is invalid";
    if (o == NULL) {
        fprintf(err, "kvpeerd: %s: unknown option '%s' (see --help)\n", origin, name);
        return -1;
    }
    if (opt_apply(s, o, value, &why) != 0) {
        fprintf(err, "kvpeerd: %s: %s: value '%s' %s\n", origin, o->name, value, why);
        return -1;
    }
    return 0;
}

void kvpd_settings_init(kvpd_settings_t *s)
{
    const char *why;
    memset(s, 0, sizeof(*s));
    kvp_config_init(&s->cfg);
    for (size_t i = 0; i < N_OPTS; i++) {
        if (opts[i].def != NULL && opt_apply(s, &opts[i], opts[i].def, &why) != 0)
            abort(); /* a table default that does not parse is a bug */
    }
}

void kvpd_settings_free(kvpd_settings_t *s)
{
    for (size_t i = 0; i < N_OPTS; i++) {
        if (opts[i].type == OPT_STR) {
            char **p = field(s, &opts[i]);
            free(*p);
            *p = NULL;
        }
    }
    free(s->log_level_s);
    s->log_level_s = NULL;
    memset(s->psk, 0, sizeof(s->psk));
}

/* ---------------------------------------------------------------- INI file */

typedef struct ini_ctx {
    kvpd_settings_t *s;
    const char *path;
    FILE *fp, *err;
    int line;   /* line most recently read: the handler's line */
    int failed; /* first error already reported */
} ini_ctx_t;

/* inih reader that counts lines, so the handler can name the line. */
static char *ini_read_line(char *str, int num, void *stream)
{
    ini_ctx_t *c = stream;
    char *r = fgets(str, num, c->fp);
    if (r != NULL && strchr(r, '\n') != NULL)
        c->line++;
    else if (r != NULL && feof(c->fp))
        c->line++;
    return r;
}

static int ini_on_value(void *user, const char *section, const char *name, const char *value)
{
    ini_ctx_t *c = user;
    char origin[512];
    const opt_t *o = opt_find(name, strlen(name));
    if (c->failed)
        return 0;
    snprintf(origin, sizeof(origin), "config file %s line %d", c->path, c->line);
    if (o != NULL && (o->flags & F_NOFILE)) {
        fprintf(c->err, "kvpeerd: %s: option '%s' is not allowed in a config file\n", origin,
                name);
        c->failed = 1;
        return 0;
    }
    if (kvpd_settings_set(c->s, name, value, origin, c->err) != 0) {
        c->failed = 1;
        return 0;
    }
    return 1;
}

int kvpd_settings_load_file(kvpd_settings_t *s, const char *path, FILE *err)
{
    ini_ctx_t c = {s, path, NULL, err, 0, 0};
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) {
        fprintf(err, "kvpeerd: config file %s: not a regular file%s\n", path,
                S_ISDIR(sb.st_mode) ? " (a directory)" : "");
        return -1;
    }
    if ((c.fp = fopen(path, "r")) == NULL) {
        fprintf(err, "kvpeerd: config file %s: cannot open: %s\n", path, strerror(errno));
        return -1;
    }
    int r = ini_parse_stream(ini_read_line, &c, ini_on_value, &c);
    fclose(c.fp);
    if (r != 0 && !c.failed)
        fprintf(err, "kvpeerd: config file %s line %d: syntax error (expected name = value)\n",
                path, r);
    return r == 0 ? 0 : -1;
}

/* ------------------------------------------------------------ environment */

static int load_env(kvpd_settings_t *s, FILE *err)
{
    char var[96], origin[128];
    for (size_t i = 0; i < N_OPTS; i++) {
        size_t j = 0;
        j = (size_t)snprintf(var, sizeof(var), "KVPEER_");
        for (const char *p = opts[i].name; *p && j + 1 < sizeof(var); p++)
            var[j++] = (char)toupper((unsigned char)*p);
        var[j] = '\0';
        const char *v = getenv(var);
        if (v == NULL || (opts[i].flags & F_NOFILE))
            continue;
        snprintf(origin, sizeof(origin), "environment %s", var);
        if (kvpd_settings_set(s, opts[i].name, v, origin, err) != 0)
            return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ flags */

typedef struct flag_val {
    const opt_t *o;
    const char *arg; /* argv[i] as given (for messages) */
    const char *value;
} flag_val_t;

static bool is_bool_word(const char *v)
{
    static const char *const w[] = {"true", "false", "yes", "no", "on", "off", "1", "0"};
    for (size_t i = 0; i < sizeof(w) / sizeof(w[0]); i++)
        if (strcasecmp(v, w[i]) == 0)
            return true;
    return false;
}

/* First pass: recognise every flag (unknown -> error), find --config,
 * --help, --print-config. Values are applied after file and environment. */
static int scan_flags(int argc, char **argv, flag_val_t *fv, int *nfv, int *help, int *print,
                      FILE *err)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            *help = *help ? *help : 1;
            continue;
        }
        if (strcmp(a, "--version") == 0 || strcmp(a, "-V") == 0) {
            *help = 2;
            continue;
        }
        if (strcmp(a, "--print-config") == 0 || strcmp(a, "--print_config") == 0) {
            *print = 1;
            continue;
        }
        if (strncmp(a, "--", 2) != 0) {
            fprintf(err, "kvpeerd: unexpected argument '%s' (options are --option value)\n", a);
            return -1;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        const opt_t *o = opt_find(name, eq ? (size_t)(eq - name) : strlen(name));
        if (o == NULL) {
            fprintf(err, "kvpeerd: unknown option '%.*s' (see --help)\n",
                    (int)(eq ? eq - a : (long)strlen(a)), a);
            return -1;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (v == NULL && (o->type == OPT_BOOL || o->type == OPT_BOOL8)) {
            /* bare --admin is true; --admin false / --admin true also work */
            v = "true";
            if (i + 1 < argc && is_bool_word(argv[i + 1]))
                v = argv[++i];
        }
        if (v == NULL) {
            if (i + 1 >= argc) {
                fprintf(err, "kvpeerd: option '%s' needs a value\n", a);
                return -1;
            }
            v = argv[++i];
        }
        fv[(*nfv)++] = (flag_val_t){o, a, v};
    }
    return 0;
}

static int apply_flags(kvpd_settings_t *s, const flag_val_t *fv, int nfv, FILE *err)
{
    char origin[160];
    for (int i = 0; i < nfv; i++) {
        if (fv[i].o->flags & F_NOFILE)
            continue; /* --config: already used */
        snprintf(origin, sizeof(origin), "flag --%s", fv[i].o->name);
        if (fv[i].o->off == S(psk_hex) && fv[i].value[0]) /* issue 27 */
            fprintf(err, "kvpeerd: WARNING: --psk on the command line is readable by every "
                         "local user in /proc/PID/cmdline; put the key in a psk_file (mode 600)\n");
        if (kvpd_settings_set(s, fv[i].o->name, fv[i].value, origin, err) != 0)
            return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ check */

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = (char)tolower((unsigned char)c);
    return (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
}

/* Hex digits (even count) into out; -1 if not hex. */
static int hex_decode(const char *h, size_t n, uint8_t *out)
{
    if (n % 2 != 0)
        return -1;
    for (size_t i = 0; i < n / 2; i++) {
        int hi = hexval(h[2 * i]), lo = hexval(h[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

enum { KVPD_PSK_MIN = 16 }; /* bytes of secret; shorter keys are brute-forced */

static int load_psk(kvpd_settings_t *s, FILE *err)
{
    if (s->psk_hex[0] && s->psk_file[0]) {
        fprintf(err, "kvpeerd: psk and psk_file are both set; give one\n");
        return -1;
    }
    if (s->psk_hex[0]) {
        size_t n = strlen(s->psk_hex);
        if (n % 2 != 0 || n / 2 > KVPD_PSK_MAX || hex_decode(s->psk_hex, n, s->psk) != 0) {
            fprintf(err, "kvpeerd: psk: need an even number of hex digits (at most %d bytes)\n",
                    KVPD_PSK_MAX);
            return -1;
        }
        s->psk_len = (uint32_t)(n / 2);
    } else if (s->psk_file[0]) {
        /* The one file format (kvp_psk_load): hex, mode 600, 16..64 bytes. */
        if (kvp_psk_load(s->psk_file, s->psk, KVPD_PSK_MAX, &s->psk_len) != KVP_OK) {
            fprintf(err, "kvpeerd: %s\n", kvp_last_error());
            return -1;
        }
    }
    if (s->psk_len > 0 && s->psk_len < KVPD_PSK_MIN) {
        fprintf(err, "kvpeerd: %s: %u bytes of key is too short (at least %d bytes, e.g. "
                     "`openssl rand -hex 32`)\n",
                s->psk_hex[0] ? "psk" : "psk_file", s->psk_len, KVPD_PSK_MIN);
        return -1;
    }
    return 0;
}

/* host:port or [v6]:port; `resolve`: the host must resolve now (addresses
 * we bind: a typo is a configuration error, exit 2). */
static int check_addr_ex(const char *what, const char *a, bool empty_ok, bool resolve, FILE *err)
{
    const char *colon = strrchr(a, ':');
    if (a[0] == '\0' && empty_ok)
        return 0;
    bool v6 = a[0] == '[';
    if (colon == NULL || colon == a || colon[1] == '\0' ||
        strspn(colon + 1, "0123456789") != strlen(colon + 1) || atol(colon + 1) > 65535 ||
        (v6 && (colon[-1] != ']' || colon - a < 3)) ||
        (!v6 && memchr(a, ':', (size_t)(colon - a)) != NULL)) {
        fprintf(err, "kvpeerd: %s: '%s' is not host:port (IPv6: [addr]:port)\n", what, a);
        return -1;
    }
    if (!resolve)
        return 0;
    char host[256];
    snprintf(host, sizeof(host), "%.*s", (int)(colon - a - (v6 ? 2 : 0)), a + (v6 ? 1 : 0));
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int rc = getaddrinfo(host[0] ? host : NULL, colon + 1, &hints, &ai);
    if (rc != 0) {
        fprintf(err, "kvpeerd: %s: host '%s' does not resolve: %s\n", what, host,
                gai_strerror(rc));
        return -1;
    }
    freeaddrinfo(ai);
    return 0;
}

static int check_addr(const char *what, const char *a, bool empty_ok, FILE *err)
{
    return check_addr_ex(what, a, empty_ok, false, err);
}

static int check_peers(const char *list, FILE *err)
{
    char buf[300];
    for (const char *p = list; *p;) {
        size_t n = strcspn(p, ",");
        snprintf(buf, sizeof(buf), "%.*s", (int)(n < 299 ? n : 299), p);
        if (check_addr("peers", buf, false, err) != 0)
            return -1;
        p += n;
        if (*p == ',')
            p++;
    }
    return 0;
}

/* Cross-field checks and the final kvp_config_t pointers. */
static int settings_finish(kvpd_settings_t *s, FILE *err)
{
    kvp_config_t *c = &s->cfg;
    long page = sysconf(_SC_PAGESIZE);
    if (c->block_size % (uint32_t)page != 0) {
        fprintf(err, "kvpeerd: block_size: %u is not a multiple of the page size (%ld)\n",
                c->block_size, page);
        return -1;
    }
    if (c->heartbeat_ms >= c->dead_after_ms) {
        fprintf(err, "kvpeerd: heartbeat_ms (%u) must be below dead_after_ms (%u)\n",
                c->heartbeat_ms, c->dead_after_ms);
        return -1;
    }
    if (c->backoff_min_ms > c->backoff_max_ms) {
        fprintf(err, "kvpeerd: backoff_min_ms (%u) must not exceed backoff_max_ms (%u)\n",
                c->backoff_min_ms, c->backoff_max_ms);
        return -1;
    }
    if (strcmp(s->transport, "ucx") != 0) {
        fprintf(err, "kvpeerd: transport: '%s' is not available in the daemon (only ucx)\n",
                s->transport);
        return -1;
    }
    if (check_addr_ex("listen", s->listen, false, true, err) ||
        check_addr_ex("http", s->http, true, true, err) ||
        check_peers(s->peers, err) || check_addr("peers_dns", s->peers_dns, true, err) ||
        load_psk(s, err))
        return -1;
    if (s->admin && s->admin_token_file[0] == '\0') { /* issue 27: no open admin API */
        fprintf(err, "kvpeerd: admin: the admin API needs admin_token_file (a file of mode 0600 "
                     "holding one token, e.g. openssl rand -hex 32); refusing to start\n");
        return -1;
    }
    if (s->admin && kvpd_admin_token_load(s->admin_token_file, s->admin_token, err) != 0)
        return -1;
    c->listen_addr = s->listen;
    c->peer_id = s->peer_id[0] ? s->peer_id : NULL;
    c->instance_id = s->instance_id[0] ? s->instance_id : NULL;
    c->name = s->name[0] ? s->name : NULL;
    c->compat = s->compat;
    c->psk = s->psk_len ? s->psk : NULL;
    c->psk_len = s->psk_len;
    c->transport = KVP_TRANSPORT_UCX;
    c->thread_mode = KVP_THREAD_OWN;
    return 0;
}

int kvpd_settings_load(kvpd_settings_t *s, int argc, char **argv, FILE *out, FILE *err)
{
    int nfv = 0, help = 0, print = 0;
    flag_val_t *fv = calloc((size_t)argc + 1, sizeof(*fv));
    int rc = KVPD_LOAD_ERROR;
    if (fv == NULL || scan_flags(argc, argv, fv, &nfv, &help, &print, err) != 0)
        goto out;
    if (help == 2) {
        fprintf(out, "kvpeerd %s (libkvpeer %s)\n", kvp_version(), kvp_version());
        rc = KVPD_LOAD_EXIT;
        goto out;
    }
    if (help) {
        kvpd_settings_help(out);
        rc = KVPD_LOAD_EXIT;
        goto out;
    }
    const char *cfgpath = getenv("KVPEER_CONFIG");
    for (int i = 0; i < nfv; i++) {
        if (fv[i].o->flags & F_NOFILE)
            cfgpath = fv[i].value;
    }
    if (cfgpath && cfgpath[0] &&
        (set_str(&s->config, cfgpath) != 0 || kvpd_settings_load_file(s, cfgpath, err) != 0))
        goto out;
    if (load_env(s, err) != 0 || apply_flags(s, fv, nfv, err) != 0 || settings_finish(s, err) != 0)
        goto out;
    rc = KVPD_LOAD_RUN;
    if (print) {
        kvpd_settings_print(s, out);
        rc = KVPD_LOAD_EXIT;
    }
out:
    free(fv);
    return rc;
}

/* ------------------------------------------------------- help and dump */

static void opt_value_text(const kvpd_settings_t *s, const opt_t *o, char *buf, size_t cap)
{
    const void *p = cfield(s, o);
    switch (o->type) {
    case OPT_U32: snprintf(buf, cap, "%u", *(const uint32_t *)p); break;
    case OPT_U64: snprintf(buf, cap, "%llu", (unsigned long long)*(const uint64_t *)p); break;
    case OPT_BOOL8: snprintf(buf, cap, "%s", *(const uint8_t *)p ? "true" : "false"); break;
    case OPT_BOOL: snprintf(buf, cap, "%s", *(const bool *)p ? "true" : "false"); break;
    case OPT_LEVEL: snprintf(buf, cap, "%s", level_names[s->log_level]); break;
    case OPT_STR: {
        const char *v = *(char *const *)p;
        snprintf(buf, cap, "%s", v ? v : "");
        break;
    }
    }
}

void kvpd_settings_print(const kvpd_settings_t *s, FILE *out)
{
    char v[512];
    fprintf(out, "; kvpeerd effective configuration\n");
    for (size_t i = 0; i < N_OPTS; i++) {
        opt_value_text(s, &opts[i], v, sizeof(v));
        if (opts[i].off == S(psk_hex) && v[0])
            fprintf(out, "; %s = (set, %u bytes, redacted)\n", opts[i].name, s->psk_len);
        else if (opts[i].flags & F_NOFILE) /* --config itself: not a file key */
            fprintf(out, "; %s = %s\n", opts[i].name, v);
        else
            fprintf(out, "%s = %s\n", opts[i].name, v);
    }
}

void kvpd_settings_help(FILE *out)
{
    kvpd_settings_t d;
    char v[512];
    kvpd_settings_init(&d);
    fprintf(out,
            "usage: kvpeerd [--config FILE] [--option value | --option=value]... [--help] "
            "[--version] [--print-config]\n\n"
            "A kvpeer node as a daemon. Every option can also be set in the INI config file\n"
            "(key = option name, sections optional) or as KVPEER_<NAME> in the environment.\n"
            "Precedence: defaults < config file < environment < flags. Durations in ms.\n"
            "In flags and file keys '-' and '_' are the same (--block-size = block_size).\n"
            "Exit codes: 0 clean shutdown (SIGINT/SIGTERM, after the bounded drain),\n"
            "1 start-up failure, 2 bad configuration.\n\n");
    for (size_t i = 0; i < N_OPTS; i++) {
        opt_value_text(&d, &opts[i], v, sizeof(v));
        fprintf(out, "  --%-28s %s (default: %s)\n", opts[i].name, opts[i].doc,
                v[0] ? v : "\"\"");
    }
    fprintf(out, "  --%-28s %s\n", "help", "this text");
    fprintf(out, "  --%-28s %s\n", "version", "print the version, exit");
    fprintf(out, "  --%-28s %s\n", "print-config", "print every option's effective value, exit");
    kvpd_settings_free(&d);
}

bool kvpd_option_runtime(const char *name)
{
    const opt_t *o = opt_find(name, strlen(name));
    return o != NULL && (o->flags & F_RUNTIME);
}

void kvpd_settings_keep_runtime(kvpd_settings_t *dst, kvpd_settings_t *src)
{
    static const size_t width[] = {[OPT_U32] = sizeof(uint32_t), [OPT_U64] = sizeof(uint64_t),
                                   [OPT_BOOL8] = sizeof(uint8_t), [OPT_BOOL] = sizeof(bool),
                                   [OPT_LEVEL] = sizeof(int)};
    for (size_t i = 0; i < N_OPTS; i++) {
        const opt_t *o = &opts[i];
        if (!(o->flags & F_RUNTIME))
            continue;
        if (o->type == OPT_STR) { /* swap: src frees the old string */
            char **a = field(dst, o), **b = field(src, o), *t = *a;
            *a = *b;
            *b = t;
        } else {
            memcpy(field(dst, o), field(src, o), width[o->type]);
        }
    }
    char *t = dst->log_level_s;
    dst->log_level_s = src->log_level_s;
    src->log_level_s = t;
    memcpy(dst->psk, src->psk, sizeof(dst->psk));
    dst->psk_len = src->psk_len;
    dst->cfg.psk = dst->psk_len ? dst->psk : NULL;
    dst->cfg.psk_len = dst->psk_len;
}
