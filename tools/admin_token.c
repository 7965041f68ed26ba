/*
 * admin_token.c -- the bearer token of kvpeerd's admin API (issue 27: "with
 * --admin every mutating route is open to whoever reaches the port").
 *
 * The token lives in a file only its owner may read (like an ssh key): a
 * regular file with no group or other permission bits, holding one line of
 * 16..512 printable ASCII characters without spaces (`openssl rand -hex 32`
 * writes one). Only its BLAKE2b digest is kept; a request's token is hashed
 * the same way and the digests are compared in constant time (libsodium), so
 * neither the token's bytes nor its length leak through timing.
 */
#include "options.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { TOKEN_MIN = 16, TOKEN_MAX = 512 };

void kvpd_admin_token_digest(const void *tok, size_t len, uint8_t out[KVPD_TOKEN_DIGEST])
{
    crypto_generichash(out, KVPD_TOKEN_DIGEST, tok, len, NULL, 0);
}

bool kvpd_admin_token_check(const uint8_t want[KVPD_TOKEN_DIGEST], const char *header)
{
    static const char scheme[] = "Bearer ";
    uint8_t got[KVPD_TOKEN_DIGEST];
    if (header == NULL || strncasecmp(header, scheme, sizeof(scheme) - 1) != 0)
        return false;
    const char *tok = header + sizeof(scheme) - 1;
    kvpd_admin_token_digest(tok, strlen(tok), got);
    return sodium_memcmp(got, want, KVPD_TOKEN_DIGEST) == 0;
}

/* The file's text, one line, checked; 0 or -1 with the reason in *why. */
static int token_read(int fd, char *buf, size_t *len, const char **why)
{
    ssize_t n = read(fd, buf, TOKEN_MAX + 2);
    if (n < 0) {
        *why = strerror(errno);
        return -1;
    }
    size_t t = (size_t)n;
    while (t > 0 && (buf[t - 1] == '\n' || buf[t - 1] == '\r' || buf[t - 1] == ' ' ||
                     buf[t - 1] == '\t'))
        t--;
    if (t < TOKEN_MIN || t > TOKEN_MAX) {
        *why = "must hold one token of 16..512 characters (e.g. openssl rand -hex 32)";
        return -1;
    }
    for (size_t i = 0; i < t; i++) {
        if (buf[i] <= ' ' || buf[i] > '~') {
            *why = "the token must be printable ASCII without spaces, on one line";
            return -1;
        }
    }
    *len = t;
    return 0;
}

int kvpd_admin_token_load(const char *path, uint8_t out[KVPD_TOKEN_DIGEST], FILE *err)
{
    char buf[TOKEN_MAX + 2];
    size_t len = 0;
    struct stat sb;
    const char *why = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0)
        why = strerror(errno);
    else if (fstat(fd, &sb) != 0)
        why = strerror(errno);
    else if (!S_ISREG(sb.st_mode))
        why = "not a regular file";
    else if ((sb.st_mode & (S_IRWXG | S_IRWXO)) != 0)
        why = "readable or writable by group or others (chmod 600 it)";
    else
        token_read(fd, buf, &len, &why);
    if (fd >= 0)
        close(fd);
    if (why != NULL) {
        fprintf(err, "kvpeerd: admin_token_file %s: %s\n", path, why);
        sodium_memzero(buf, sizeof(buf));
        return -1;
    }
    kvpd_admin_token_digest(buf, len, out);
    sodium_memzero(buf, sizeof(buf));
    return 0;
}
