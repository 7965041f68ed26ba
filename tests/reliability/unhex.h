/* unhex.h -- the node's blob, given on the command line in hex, for the
 * foreign-worker attackers (foreign_ucx.c, foreign_uct.c). */
#ifndef KVP_TESTS_UNHEX_H
#define KVP_TESTS_UNHEX_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static inline int unhex(const char *h, uint8_t *out, size_t cap, size_t *len)
{
    size_t n = strlen(h);
    if (n % 2 || n / 2 > cap)
        return -1;
    for (size_t i = 0; i < n / 2; i++) {
        unsigned v;
        if (sscanf(h + 2 * i, "%2x", &v) != 1)
            return -1;
        out[i] = (uint8_t)v;
    }
    *len = n / 2;
    return 0;
}

#endif
