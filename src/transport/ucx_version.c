/*
 * ucx_version.c -- which UCX this process runs on (issue 30): the start-up
 * log line, once per transport, naming the library version, the file it was
 * loaded from and the headers it was built against.
 *
 * Why: kvpeer is built against Debian's UCX 1.13 and against others (1.22
 * from PyPI, a UCX of one's own through PKG_CONFIG_PATH); a binary whose
 * RUNPATH or LD_LIBRARY_PATH picks another libucp than the one it was
 * compiled for still starts (ucp_init only warns), and then behaves as that
 * other UCX. The line says which one it is, and a mismatch is a WARN.
 *
 * Also here: the differences between UCX versions that kvpeer bridges,
 * decided by what the loaded UCX does, never by its version number.
 */
#include "transport/ucx_int.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

bool kvp__ucx_version_describe(char *buf, size_t cap)
{
    unsigned major = 0, minor = 0, release = 0;
    Dl_info di = {0};

    ucp_get_version(&major, &minor, &release);
    /* The file that defines ucp_get_version is the libucp this process uses. */
    const char *path = dladdr((void *)ucp_get_version, &di) && di.dli_fname ? di.dli_fname : "?";
    bool same = major == UCP_API_MAJOR && minor == UCP_API_MINOR;
    snprintf(buf, cap, "UCX %u.%u.%u loaded from %s (built with UCX %u.%u headers%s)", major,
             minor, release, path, (unsigned)UCP_API_MAJOR, (unsigned)UCP_API_MINOR,
             same ? "" : ": another UCX than the build's, check RUNPATH/LD_LIBRARY_PATH");
    return same;
}

void kvp__ucx_version_log(ucx_xport_t *x)
{
    char line[512];

    KVP_LOG(kvp__ucx_version_describe(line, sizeof(line)) ? KVP_LOG_INFO : KVP_LOG_WARN, PFX(x),
            "%s", line);
}

/* A transport's key through ucp_config_modify. UCX 1.13 keeps a key it does
 * not know and applies it to every transport whose table has that bare name
 * (TX_SEG_SIZE; TCP_TX_SEG_SIZE would be kept and never applied), while UCX
 * 1.22 refuses a key that no table declares under its prefix (Invalid
 * parameter for TX_SEG_SIZE: kvpeer did not start) and applies it with the
 * prefix (uct_config_modify matches TCP_ + TX_SEG_SIZE). So the bare name
 * first, the tcp transport's prefixed name when that is refused. */
int kvp__ucx_config_modify(void *ucp_config, const char *key, const char *value)
{
    static const char *const tcp_keys[] = {"TX_SEG_SIZE", "PUT_ENABLE"};
    ucs_status_t s = ucp_config_modify(ucp_config, key, value);
    char name[64];

    for (size_t i = 0; s != UCS_OK && i < sizeof(tcp_keys) / sizeof(tcp_keys[0]); i++)
        if (strcmp(key, tcp_keys[i]) == 0) {
            snprintf(name, sizeof(name), "TCP_%s", key);
            s = ucp_config_modify(ucp_config, name, value);
        }
    return s;
}

/* Whether the loaded UCX knows ucp key `key` (and takes `value`), asked on a
 * scratch configuration: only a UCX that refuses unknown keys can say so
 * (1.22 does; 1.13 accepts any key, keeps it for its transports and warns
 * "invalid configuration" when none takes it, so there the answer is no). */
bool kvp__ucx_config_has(const char *key, const char *value)
{
    ucp_config_t *c = NULL;

    if (ucp_config_read(NULL, NULL, &c) != UCS_OK)
        return false;
    bool checks = ucp_config_modify(c, "KVPEER_NO_SUCH_KEY", "1") != UCS_OK;
    bool has = checks && ucp_config_modify(c, key, value) == UCS_OK;
    ucp_config_release(c);
    return has;
}
