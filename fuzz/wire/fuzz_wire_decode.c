/*
 * fuzz_wire_decode.c -- libFuzzer target for the wire decoder: parse_hdr +
 * decode under both contexts, and decode(encode(m)) == m for every frame
 * that decodes (fuzz_wire_check.h, shared with the corpus replay test).
 */
#include "fuzz_wire_check.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static kvp_fuzz_wire_t f;
    static int ready;
    if (!ready) {
        if (kvp_fuzz_wire_init(&f) != 0)
            abort();
        ready = 1; /* kept for the process: libFuzzer has no teardown hook */
    }
    if (kvp_fuzz_wire_one(&f, data, size) != 0)
        abort();
    return 0;
}
