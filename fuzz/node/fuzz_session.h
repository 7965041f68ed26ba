/*
 * fuzz_session.h -- the session-layer fuzz harness (issue 9): one LIVE node
 * (caller-driven, fake data transport, fake control network, manual clock)
 * and one raw fake peer built from the ctl layer itself. The fuzz input is
 * decoded as a sequence of operations (frames the fake peer sends with
 * fields taken from the input, stale or forged epochs, writes into the
 * node's region for slots the node's FETCH named, virtual time, local puts,
 * node-side lookups / fetches / cancels, connection kills, transport
 * scripts). The op format is documented in fuzz_session_run.c.
 *
 * Oracles checked by kvp_fuzz_session_run (any violation is a failure):
 *   - kvp_store_check() on the node's store after every op;
 *   - the fake fabric's landing checker: zero violations (I1, I2);
 *   - at most one KVP_EV_LOAD / KVP_EV_LOOKUP event per op id (I4);
 *   - kvp_alloc_live() == 0 after teardown (nothing leaks);
 *   - ASan / UBSan / KVP_ASSERT abort the process by themselves.
 *
 * Used by the libFuzzer target (fuzz_session.c) and by the corpus replay
 * test (replay_session.c). Not thread-safe: one run at a time.
 */
#ifndef KVP_FUZZ_SESSION_H
#define KVP_FUZZ_SESSION_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvp_fuzz_session_result {
    char why[256];    /* first oracle that failed ("" when ok) */
    uint32_t ops;     /* ops executed */
    uint32_t frames;  /* frames the fake peer sent */
    uint32_t loads;   /* load events seen */
    uint32_t readies; /* handshakes the fake peer completed */
} kvp_fuzz_session_result_t;

/* Run one input from scratch (fresh world, torn down before returning).
 * Returns 0 if every oracle held, -1 otherwise (res->why says which).
 * `verbose` echoes the library's log lines and each op to stderr. */
int kvp_fuzz_session_run(const uint8_t *data, size_t size, int verbose,
                         kvp_fuzz_session_result_t *res);

#endif
