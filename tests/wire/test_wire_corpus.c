/* test_wire_corpus.c -- replays every file of fuzz/wire/corpus/ through the
 * fuzz target's check (fuzz_wire_check.h) as an ordinary test. The corpus
 * directory is argv[1], or the compiled-in KVP_WIRE_CORPUS_DIR. */
#include "testutil.h"
#include "fuzz_wire_check.h"

#include <dirent.h>

static const char *corpus_dir = KVP_WIRE_CORPUS_DIR;

static uint8_t *read_file(const char *path, size_t *len)
{
    FILE *fp = fopen(path, "rb");
    if (fp == NULL)
        return NULL;
    uint8_t *buf = NULL;
    size_t cap = 0, n = 0, got;
    do {
        if (n == cap) {
            cap = cap ? 2 * cap : 4096;
            uint8_t *nb = realloc(buf, cap);
            assert_non_null(nb);
            buf = nb;
        }
        got = fread(buf + n, 1, cap - n, fp);
        n += got;
    } while (got > 0);
    fclose(fp);
    *len = n;
    return buf;
}

static void test_corpus_replay(void **state)
{
    kvp_fuzz_wire_t f;
    assert_int_equal(kvp_fuzz_wire_init(&f), 0);
    DIR *d = opendir(corpus_dir);
    if (d == NULL)
        fail_msg("cannot open corpus %s", corpus_dir);
    size_t files = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        char path[4096];
        size_t len = 0;
        snprintf(path, sizeof(path), "%s/%s", corpus_dir, de->d_name);
        uint8_t *buf = read_file(path, &len);
        assert_non_null(buf);
        if (kvp_fuzz_wire_one(&f, buf, len) != 0)
            fail_msg("corpus file %s fails the check", de->d_name);
        free(buf);
        files++;
    }
    closedir(d);
    /* One seed per type plus malformed ones: all types decoded somewhere. */
    assert_true(files >= 12);
    assert_true(f.frames_ok >= 12);
    assert_true(f.frames_bad >= 1);
    printf("corpus: %zu files, %llu frames decoded, %llu refused\n", files,
           (unsigned long long)f.frames_ok, (unsigned long long)f.frames_bad);
    kvp_fuzz_wire_fini(&f);
    KVP_TEST_ASSERT_NO_LEAKS();
}

int main(int argc, char **argv)
{
    if (argc > 1)
        corpus_dir = argv[1];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_corpus_replay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
