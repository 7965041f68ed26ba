/*
 * fuzz_session.c -- libFuzzer target: a live node fed structure-aware frame
 * sequences by a raw fake peer (fuzz_session_run.c). Any broken oracle
 * aborts, so libFuzzer saves the input as a crash artifact. Replay an
 * artifact verbosely with: fuzz_session <file> (KVPEER_FUZZ_VERBOSE=1).
 */
#include "fuzz_session.h"

#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_fuzz_session_result_t res;
    int verbose = getenv("KVPEER_FUZZ_VERBOSE") != NULL;
    if (kvp_fuzz_session_run(data, size, verbose, &res) != 0) {
        fprintf(stderr, "fuzz_session: oracle failed after %u ops: %s\n", res.ops, res.why);
        abort();
    }
    return 0;
}
