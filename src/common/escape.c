/*
 * escape.c -- kvp_escape: make a peer-supplied string (peer id, instance id,
 * URL, anything from the wire) safe for one log line or one line of an HTTP
 * page (issue 27: "a %0a in a URL or a newline in a peer id forges log lines
 * and /peers entries").
 *
 * Always escaped as \xNN: C0 controls (0x00-0x1f: newline, CR, ESC), DEL,
 * every byte of a C1 control (U+0080-U+009F: CSI is a terminal escape),
 * U+2028/U+2029 (line breaks to JSON/JS readers), the bidi overrides
 * (U+202A-U+202E, U+2066-U+2069: text shown in another order than stored),
 * and every byte that is not part of well-formed UTF-8 (RFC 3629: no
 * overlongs, surrogates or code points above U+10FFFF). Flags add '\\' (so
 * that an escape in the output is never ambiguous), '"' and ' ' (a bare
 * key=value field). Valid printable UTF-8 passes unchanged.
 */
#include "common.h"

#include <string.h>

/* Length of the well-formed UTF-8 sequence at s (1..4), or 0 if s does not
 * start one (the Unicode Standard, table 3-7). */
static size_t utf8_len(const uint8_t *s, size_t n)
{
    uint8_t c = s[0];
    size_t len;
    uint8_t lo = 0x80, hi = 0xbf; /* bounds of the second byte */
    if (c >= 0xc2 && c <= 0xdf)
        len = 2;
    else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0)
            lo = 0xa0;
        else if (c == 0xed)
            hi = 0x9f; /* no surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0)
            lo = 0x90;
        else if (c == 0xf4)
            hi = 0x8f; /* <= U+10FFFF */
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return len;
}

/* A well-formed multi-byte sequence that still must not pass: C1 controls,
 * line/paragraph separators, bidi overrides and isolates. */
static bool utf8_unsafe(const uint8_t *s, size_t len)
{
    if (len == 2)
        return s[0] == 0xc2 && s[1] <= 0x9f;
    if (len == 3 && s[0] == 0xe2 && s[1] == 0x80)
        return s[2] >= 0xa8 && s[2] <= 0xae; /* U+2028..U+202E */
    if (len == 3 && s[0] == 0xe2 && s[1] == 0x81)
        return s[2] >= 0xa6 && s[2] <= 0xa9; /* U+2066..U+2069 */
    return false;
}

static bool byte_escaped(uint8_t c, uint32_t flags)
{
    return c < 0x20 || c == 0x7f || (c == '\\' && (flags & KVP_ESCAPE_BACKSLASH)) ||
           (c == '"' && (flags & KVP_ESCAPE_QUOTE)) || (c == ' ' && (flags & KVP_ESCAPE_SPACE));
}

KVP_EXPORT size_t kvp_escape(char *dst, size_t cap, const void *src, size_t len, uint32_t flags)
{
    static const char hex[] = "0123456789abcdef";
    const uint8_t *s = src;
    size_t o = 0, i = 0;
    if (cap == 0)
        return 0;
    while (i < len) {
        size_t n = s[i] < 0x80 ? 1 : utf8_len(s + i, len - i);
        bool esc = n == 0 || (n == 1 ? byte_escaped(s[i], flags) : utf8_unsafe(s + i, n));
        if (n == 0)
            n = 1; /* a stray byte: escape it alone, resync at the next */
        size_t need = esc ? 4 * n : n;
        if (o + need >= cap)
            break; /* never a cut escape or a cut sequence */
        for (size_t k = 0; k < n; k++, i++) {
            if (esc) {
                dst[o++] = '\\';
                dst[o++] = 'x';
                dst[o++] = hex[s[i] >> 4];
                dst[o++] = hex[s[i] & 15];
            } else
                dst[o++] = (char)s[i];
        }
    }
    dst[o] = '\0';
    return o;
}
