/*
 * config.c -- validation of a kvp_config_t before anything is allocated:
 * every refusal names the field (or the system limit) and is kept as the
 * calling thread's last error (kvp_last_error) so bindings and the daemon
 * can show it; the region is checked against the memory the host has and
 * the free space of /dev/shm BEFORE a byte of it is touched (a region larger
 * than memory used to be pre-faulted until the OOM killer ended the
 * process, leaving a shared-memory file behind).
 *
 * Ownership: the last-error text lives in a thread-local buffer; nothing is
 * allocated here.
 */
#include "node/node.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* A pre-shared key shorter than this is refused (brute-forceable). */
#define KVP_PSK_MIN 16u
#define KVP_WAIT_SPIN_MAX_US 10000u /* 10 ms */

static _Thread_local char last_error[512];

void kvp__set_last_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
}

void kvp__clear_last_error(void)
{
    last_error[0] = '\0';
}

KVP_EXPORT const char *kvp_last_error(void)
{
    return last_error;
}

/* Refuse a setting: log it, keep it as the last error. */
#define BAD(...)                                                                                   \
    do {                                                                                           \
        kvp__set_last_error(__VA_ARGS__);                                                          \
        KVP_ERROR(c->name, "invalid configuration: %s", last_error);                               \
        return KVP_ERR_INVALID;                                                                    \
    } while (0)

static bool bad_str(const char *s)
{
    return s != NULL && (s[0] == '\0' || strlen(s) > KVP_WIRE_STR_MAX);
}

/* Bytes the kernel reports as available for new allocations without
 * swapping (MemAvailable), or 0 if unknown. */
uint64_t kvp__mem_available(void)
{
    FILE *f = fopen("/proc/meminfo", "re");
    uint64_t kb = 0;
    char line[128];
    if (f == NULL)
        return 0;
    while (fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &kb) == 1)
            break;
    fclose(f);
    return kb * 1024;
}

/* Free bytes of a file system, or UINT64_MAX if it cannot be asked. */
static uint64_t fs_free(const char *path)
{
    struct statvfs sv;
    if (statvfs(path, &sv) != 0)
        return UINT64_MAX;
    return (uint64_t)sv.f_bavail * sv.f_frsize;
}

/* The region against the host: a region of our own must fit in the memory
 * the kernel says is available (with 10% left for everything else); a
 * UCX-allocated one lives in /dev/shm, so too little free space there means
 * the SPEC §F28 fallback (anonymous memory, emulated puts): said up front. */
static kvp_status_t check_region(const kvp_config_t *c)
{
    uint64_t len = (uint64_t)c->num_blocks * c->block_size;
    if (c->region != NULL) {
        if (c->region_len < len)
            BAD("region_len: %" PRIu64 " B is smaller than num_blocks x block_size = %" PRIu64
                " B",
                c->region_len, len);
        return KVP_OK; /* the embedding's memory: it exists already */
    }
    if (len > SIZE_MAX / 2)
        BAD("num_blocks x block_size = %" PRIu64 " B does not fit in this address space", len);
    uint64_t avail = kvp__mem_available();
    if (avail != 0 && len > avail / 10 * 9)
        BAD("num_blocks x block_size: the region of %" PRIu64 " B (%u blocks x %u B) exceeds "
            "90%% of the memory available on this host (MemAvailable %" PRIu64
            " B); lower num_blocks or block_size",
            len, c->num_blocks, c->block_size, avail);
    if (c->transport == KVP_TRANSPORT_UCX) {
        uint64_t shm = fs_free("/dev/shm");
        if (shm != UINT64_MAX && len > shm)
            KVP_WARN(c->name,
                     "region of %" PRIu64 " B exceeds the free space of /dev/shm (%" PRIu64
                     " B): UCX cannot place it in shared memory; the node falls back to "
                     "anonymous memory and same-host puts into it are emulated (enlarge "
                     "/dev/shm, e.g. docker --shm-size, or lower num_blocks x block_size)",
                     len, shm);
    }
    return KVP_OK;
}

/* "host:port" / "[v6]:port" on a loopback address (127/8, ::1, a
 * v4-mapped 127/8, or "localhost"); a host name otherwise is not assumed
 * to be loopback (no resolution here). */
bool kvp__addr_is_loopback(const char *addr)
{
    char host[KVP_WIRE_STR_MAX + 1];
    const char *colon = addr ? strrchr(addr, ':') : NULL;
    size_t n = colon ? (size_t)(colon - addr) : 0;
    if (colon == NULL || n == 0 || n >= sizeof(host))
        return false;
    if (addr[0] == '[' && addr[n - 1] == ']')
        addr++, n -= 2;
    memcpy(host, addr, n);
    host[n] = '\0';
    struct in_addr a4;
    struct in6_addr a6;
    if (inet_pton(AF_INET, host, &a4) == 1)
        return (ntohl(a4.s_addr) >> 24) == 127;
    if (inet_pton(AF_INET6, host, &a6) == 1)
        return IN6_IS_ADDR_LOOPBACK(&a6) ||
               (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
    return strcmp(host, "localhost") == 0;
}

kvp_status_t kvp__config_check_gate(const kvp_config_t *c, bool *loopback)
{
    bool lo = kvp__addr_is_loopback(c->listen_addr);
    if (loopback)
        *loopback = lo;
    if (lo || c->psk_len > 0)
        return KVP_OK;
    if (!c->insecure)
        BAD("listen: %s is not a loopback address and no pre-shared key is set: anyone who "
            "reaches the port could read and overwrite the region. Set psk_file (a key from "
            "`openssl rand -hex 32`, mode 600, the same on every peer), or listen on "
            "127.0.0.1, or set insecure = true to run without authentication",
            c->listen_addr ? c->listen_addr : "(none)");
    KVP_WARN(c->name, "INSECURE: listening on %s without a pre-shared key (insecure = true): "
             "any host that reaches this port can read and overwrite every block; set "
             "psk_file", c->listen_addr);
    return KVP_OK;
}

/* The rules of the settings kvp_node_reconfigure() may change. */
kvp_status_t kvp__config_check_runtime(const kvp_config_t *c)
{
    if ((c->psk == NULL) != (c->psk_len == 0))
        BAD("psk / psk_len: a key needs its length and a length its key");
    if (c->psk != NULL && c->psk_len < KVP_PSK_MIN)
        BAD("psk: %u bytes is too short (at least %u bytes of secret)", c->psk_len,
            (unsigned)KVP_PSK_MIN);
    if (c->heartbeat_ms == 0)
        BAD("heartbeat_ms: must be > 0");
    if (c->dead_after_ms == 0 || c->heartbeat_ms >= c->dead_after_ms)
        BAD("dead_after_ms: %u must be greater than heartbeat_ms (%u)", c->dead_after_ms,
            c->heartbeat_ms);
    if (c->max_sessions == 0)
        BAD("max_sessions: must be > 0");
    if (c->hold_cap_ms == 0)
        BAD("hold_cap_ms: must be > 0");
    if (c->load_timeout_ms == 0)
        BAD("load_timeout_ms: must be > 0");
    if (c->data_port > 65535)
        BAD("data_port: at most 65535 (0 = ephemeral)");
    if (c->max_preauth > 4096 || c->max_preauth_per_addr > 4096)
        BAD("max_preauth / max_preauth_per_addr: at most 4096 (0 = default)");
    if (c->wait_spin_us > KVP_WAIT_SPIN_MAX_US)
        BAD("wait_spin_us: %u is above %u (a spin that long is a busy loop)", c->wait_spin_us,
            (unsigned)KVP_WAIT_SPIN_MAX_US);
    return KVP_OK;
}

kvp_status_t kvp__config_check(const kvp_config_t *c)
{
    long page = sysconf(_SC_PAGESIZE);
    if (c == NULL) {
        kvp__set_last_error("config: NULL");
        return KVP_ERR_INVALID;
    }
    if (c->num_blocks == 0)
        BAD("num_blocks: must be at least 1");
    if (c->block_size == 0 || c->block_size % (uint32_t)page != 0)
        BAD("block_size: %u is not a positive multiple of the page size (%ld)", c->block_size,
            page);
    if (c->transport != KVP_TRANSPORT_UCX && c->transport != KVP_TRANSPORT_FAKE)
        BAD("transport: %d is neither UCX (0) nor FAKE (1)", c->transport);
    if (c->thread_mode != KVP_THREAD_OWN && c->thread_mode != KVP_THREAD_CALLER)
        BAD("thread_mode: %d is neither OWN (0) nor CALLER (1)", c->thread_mode);
    kvp_status_t st = kvp__config_check_runtime(c);
    if (st != KVP_OK)
        return st;
    if (bad_str(c->peer_id))
        BAD("peer_id: empty or longer than %d bytes", KVP_WIRE_STR_MAX);
    if (bad_str(c->instance_id))
        BAD("instance_id: empty or longer than %d bytes", KVP_WIRE_STR_MAX);
    if (c->name && strlen(c->name) > KVP_WIRE_STR_MAX)
        BAD("name: longer than %d bytes", KVP_WIRE_STR_MAX);
    if (bad_str(c->kv_events_endpoint))
        BAD("kv_events_endpoint: empty or longer than %d bytes", KVP_WIRE_STR_MAX);
    if (bad_str(c->kv_events_replay_endpoint) ||
        (c->kv_events_replay_endpoint != NULL && c->kv_events_endpoint == NULL))
        BAD("kv_events_replay_endpoint: empty, too long, or set without kv_events_endpoint");
    if (c->external_slots > 1)
        BAD("external_slots: %u is neither 0 nor 1", c->external_slots);
    if (c->external_slots && c->region == NULL && c->transport == KVP_TRANSPORT_UCX)
        BAD("external_slots: needs region and region_len (the embedding's memory)");
    if (c->external_wanted > 1 || (c->external_wanted && !c->external_slots))
        BAD("external_wanted: %u needs external_slots (0 or 1)", c->external_wanted);
    st = check_region(c);
    if (st == KVP_OK)
        KVP_DEBUG(c->name,
                  "config: %u blocks x %u B, transport %d, thread mode %d, psk %s, heartbeat %u "
                  "ms, dead after %u ms, load timeout %u ms, hold cap %u ms, max sessions %u",
                  c->num_blocks, c->block_size, c->transport, c->thread_mode,
                  c->psk ? "set" : "none", c->heartbeat_ms, c->dead_after_ms,
                  c->load_timeout_ms, c->hold_cap_ms, c->max_sessions);
    return st;
}

void kvp__note_create_failure(kvp_status_t st)
{
    if (last_error[0] == '\0')
        kvp__set_last_error("node creation failed: %s (the log has the cause)",
                            kvp_status_str(st));
}

KVP_EXPORT const char *kvp_version(void)
{
    return KVP_VERSION_STRING;
}
