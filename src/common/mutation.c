/* mutation.c -- the test-only mutation switch (see common.h). */
#include "common.h"

int kvp__mutation = KVP_MUT_NONE;

const char *kvp_mutation_str(int m)
{
    static const char *const names[KVP_MUT_COUNT] = {
        "none",           "cancel-immediate-at-close", "unpin-at-close", "release-quarantine-at-once",
        "accept-stale-epoch", "skip-suspect-verify",   "skip-checksum",
        "ucx-emulated-put",   "am-skip-await",        "exit-proof-alive",
        "ext-held-as-reusable", "ext-unpublish-pinned", /* issue 29 */
        "wanted-hit", /* issue 29 step 2 */
    };
    return m >= 0 && m < KVP_MUT_COUNT ? names[m] : "?";
}
