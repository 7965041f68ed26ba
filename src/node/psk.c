/*
 * psk.c -- the one pre-shared-key file format (issue 27), read the same way
 * by kvpeerd, the C embedders and the Python/vLLM tier (ctypes):
 *
 *   hex digits, as `openssl rand -hex 32 > psk` writes them, with any
 *   whitespace (a trailing newline) around them; 16..64 bytes of key.
 *
 * The file must be a regular file readable by its owner only: a key that
 * every local user can read is no secret, so a group/world-readable file is
 * refused with the fix (`chmod 600`). The checks run on the opened
 * descriptor (fstat), so a file swapped after the check is not read.
 *
 * Ownership: the caller owns `key` (cap bytes); it is written only on
 * success. The bytes read pass through a stack buffer that is wiped
 * (sodium_memzero) on every path.
 */
#include "node/node.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PSK_MIN 16u  /* bytes; shorter keys are brute-forced */
#define PSK_MAX 64u  /* bytes; 128 hex digits */
#define PSK_FILE_MAX 1024 /* a larger file is not a key file */

static bool psk_space(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\v' || ch == '\f';
}

/* Read the whole (small) file behind fd into buf; -1 with errno set on a
 * read error, -2 if it holds more than cap bytes. */
static ssize_t psk_read_all(int fd, char *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r == 0)
            return (ssize_t)n;
        n += (size_t)r;
        if (n == cap)
            return -2;
    }
}

/* The descriptor's file is a regular file only its owner can read. */
static kvp_status_t psk_check_mode(int fd, const char *path)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        kvp__set_last_error("psk_file %s: %s", path, strerror(errno));
        return KVP_ERR_IO;
    }
    if (!S_ISREG(sb.st_mode)) {
        kvp__set_last_error("psk_file %s: not a regular file", path);
        return KVP_ERR_INVALID;
    }
    if ((sb.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
        kvp__set_last_error("psk_file %s: mode %04o lets group or others read it; a key must be "
                            "readable by its owner only (chmod 600 %s)",
                            path, (unsigned)(sb.st_mode & 07777), path);
        return KVP_ERR_INVALID;
    }
    return KVP_OK;
}

/* Decode the trimmed hex text of buf[0..n) into key. */
static kvp_status_t psk_decode(const char *path, const char *buf, size_t n, uint8_t *key,
                               uint32_t cap, uint32_t *len)
{
    size_t a = 0, b = n, got = 0;
    while (a < b && psk_space(buf[a]))
        a++;
    while (b > a && psk_space(buf[b - 1]))
        b--;
    size_t digits = b - a;
    if (digits % 2 != 0 || digits / 2 < PSK_MIN || digits / 2 > PSK_MAX) {
        kvp__set_last_error("psk_file %s: must hold %u..%u hex digits (%u..%u bytes of key, e.g. "
                            "`openssl rand -hex 32`), found %zu characters",
                            path, 2 * PSK_MIN, 2 * PSK_MAX, PSK_MIN, PSK_MAX, digits);
        return KVP_ERR_INVALID;
    }
    if (digits / 2 > cap) {
        kvp__set_last_error("psk_file %s: %zu bytes of key do not fit the caller's %u", path,
                            digits / 2, cap);
        return KVP_ERR_INVALID;
    }
    if (sodium_hex2bin(key, cap, buf + a, digits, NULL, &got, NULL) != 0 || got != digits / 2) {
        kvp__set_last_error("psk_file %s: not hex (only 0-9, a-f, A-F between the surrounding "
                            "whitespace)",
                            path);
        return KVP_ERR_INVALID;
    }
    *len = (uint32_t)got;
    return KVP_OK;
}

KVP_EXPORT kvp_status_t kvp_psk_load(const char *path, uint8_t *key, uint32_t cap, uint32_t *len)
{
    char buf[PSK_FILE_MAX];
    uint8_t tmp[PSK_MAX];
    kvp_status_t st;
    kvp__clear_last_error();
    if (path == NULL || key == NULL || len == NULL) {
        kvp__set_last_error("kvp_psk_load: path, key and len must not be NULL");
        return KVP_ERR_INVALID;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        kvp__set_last_error("psk_file %s: %s", path, strerror(errno));
        return KVP_ERR_IO;
    }
    st = psk_check_mode(fd, path);
    if (st != KVP_OK)
        goto close_fd;
    ssize_t n = psk_read_all(fd, buf, sizeof(buf));
    if (n < 0) {
        kvp__set_last_error("psk_file %s: %s", path,
                            n == -2 ? "larger than a key file (1 KiB)" : strerror(errno));
        st = n == -2 ? KVP_ERR_INVALID : KVP_ERR_IO;
        goto wipe;
    }
    uint32_t got = 0;
    st = psk_decode(path, buf, (size_t)n, tmp, cap < PSK_MAX ? cap : PSK_MAX, &got);
    if (st == KVP_OK) { /* out-parameters only on success */
        memcpy(key, tmp, got);
        *len = got;
    }
wipe:
    sodium_memzero(buf, sizeof(buf));
    sodium_memzero(tmp, sizeof(tmp));
close_fd:
    close(fd);
    return st;
}
