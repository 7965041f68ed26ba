/*
 * replay_session.c -- replays every saved input of fuzz/node/corpus/ through
 * the session fuzz harness (fuzz_session_run.c) as an ordinary test: each
 * input must keep every oracle (store check, landing checker, one outcome
 * per op, no leaks). Usage: replay_session <corpus dir> [file...]
 */
#include "testutil.h"

#include "fuzz_session.h"

#include <dirent.h>
#include <sys/stat.h>

static const char *g_dir;

static uint8_t *read_all(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    uint8_t *buf = malloc(1 << 20);
    assert_non_null(buf);
    *len = fread(buf, 1, 1 << 20, f);
    fclose(f);
    return buf;
}

static int replay_one(const char *path)
{
    size_t len = 0;
    uint8_t *buf = read_all(path, &len);
    kvp_fuzz_session_result_t res;
    int verbose = getenv("KVPEER_FUZZ_VERBOSE") != NULL;
    int rc = kvp_fuzz_session_run(buf, len, verbose, &res);
    if (rc != 0)
        print_message("FAIL %s: %s (after %u ops)\n", path, res.why, res.ops);
    else if (verbose)
        print_message("ok %s: %u ops, %u frames, %u loads, %u handshakes\n", path, res.ops,
                      res.frames, res.loads, res.readies);
    free(buf);
    return rc;
}

static void test_replay_corpus(void **state)
{
    DIR *d = opendir(g_dir);
    assert_non_null(d);
    struct dirent *e;
    int files = 0, failed = 0;
    char path[4096];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof(path), "%s/%s", g_dir, e->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        files++;
        failed += replay_one(path) != 0;
    }
    closedir(d);
    print_message("replayed %d inputs, %d failed\n", files, failed);
    assert_true(files > 0);
    assert_int_equal(failed, 0);
    KVP_TEST_ASSERT_NO_LEAKS();
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s <corpus dir> [file...]\n", argv[0]);
        return 2;
    }
    if (argc > 2) { /* explicit files: replay them, exit status only */
        int failed = 0;
        for (int i = 2; i < argc; i++)
            failed += replay_one(argv[i]) != 0;
        return failed ? 1 : 0;
    }
    g_dir = argv[1];
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_replay_corpus)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
