/* test_psk.c -- kvp_psk_load, the one PSK file format (issue 27): hex with
 * whitespace around it, 16..64 bytes, a regular file of mode 600; every
 * refusal names the path and (for the mode) the fix, and leaves the caller's
 * buffer untouched. */
#include "testutil.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct psk_fix {
    char dir[64];
    char path[96];
} psk_fix_t;

static int psk_setup(void **state)
{
    psk_fix_t *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    snprintf(f->dir, sizeof(f->dir), "/tmp/kvp_psk_XXXXXX");
    assert_non_null(mkdtemp(f->dir));
    snprintf(f->path, sizeof(f->path), "%s/psk", f->dir);
    *state = f;
    return 0;
}

static int psk_teardown(void **state)
{
    psk_fix_t *f = *state;
    unlink(f->path);
    rmdir(f->dir);
    free(f);
    return 0;
}

static void psk_write(const psk_fix_t *f, const char *text, mode_t mode)
{
    unlink(f->path);
    int fd = open(f->path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    assert_int_equal(chmod(f->path, mode), 0);
}

static const char *K32 = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";

static void test_psk_hex_with_whitespace(void **state)
{
    psk_fix_t *f = *state;
    uint8_t key[64];
    uint32_t len = 0;
    char text[160];
    snprintf(text, sizeof(text), "  \n%s\r\n\n", K32);
    psk_write(f, text, 0600);
    assert_int_equal(kvp_psk_load(f->path, key, sizeof(key), &len), KVP_OK);
    assert_int_equal(len, 32);
    assert_int_equal(key[1], 0x11);
    assert_int_equal(key[31], 0xff);
    psk_write(f, "00112233445566778899aabbccddeeff", 0400); /* 16 bytes, no newline */
    assert_int_equal(kvp_psk_load(f->path, key, sizeof(key), &len), KVP_OK);
    assert_int_equal(len, 16);
}

/* A refused file: KVP_ERR_INVALID, the message holds every needle, the
 * caller's buffer and length untouched. */
static void expect_refused(psk_fix_t *f, const char *text, mode_t mode, const char *n1,
                           const char *n2)
{
    uint8_t key[64];
    uint32_t len = 7;
    memset(key, 0xa5, sizeof(key));
    psk_write(f, text, mode);
    assert_int_equal(kvp_psk_load(f->path, key, sizeof(key), &len), KVP_ERR_INVALID);
    assert_non_null(strstr(kvp_last_error(), f->path));
    if (!strstr(kvp_last_error(), n1) || (n2 && !strstr(kvp_last_error(), n2)))
        fail_msg("'%s' lacks '%s'/'%s'", kvp_last_error(), n1, n2 ? n2 : "");
    assert_int_equal(len, 7);
    for (size_t i = 0; i < sizeof(key); i++)
        assert_int_equal(key[i], 0xa5);
}

static void test_psk_mode_refused(void **state)
{
    psk_fix_t *f = *state;
    expect_refused(f, K32, 0644, "0644", "chmod 600");
    expect_refused(f, K32, 0640, "0640", "chmod 600");
    expect_refused(f, K32, 0604, "0604", "chmod 600");
    expect_refused(f, K32, 0610, "0610", "chmod 600"); /* group x: still the group's */
}

static void test_psk_content_refused(void **state)
{
    psk_fix_t *f = *state;
    expect_refused(f, "abcd\n", 0600, "hex digits", "openssl rand -hex 32");   /* 2 bytes */
    expect_refused(f, "00112233445566778899aabbccddee\n", 0600, "hex digits", NULL); /* 15 */
    expect_refused(f, "00112233445566778899aabbccddeeff0\n", 0600, "hex digits", NULL); /* odd */
    expect_refused(f, "0011223344556677 8899aabbccddeeff0\n", 0600, "not hex", NULL);
    expect_refused(f, "g0112233445566778899aabbccddeeff\n", 0600, "not hex", NULL);
    expect_refused(f, "", 0600, "hex digits", NULL);
    char big[200]; /* 65 bytes: over the 64-byte cap */
    memset(big, 'a', 130);
    big[130] = '\0';
    expect_refused(f, big, 0600, "hex digits", NULL);
    char huge[2048]; /* not a key file */
    memset(huge, ' ', sizeof(huge) - 1);
    huge[sizeof(huge) - 1] = '\0';
    expect_refused(f, huge, 0600, "larger than a key file", NULL);
}

static void test_psk_not_regular_or_missing(void **state)
{
    psk_fix_t *f = *state;
    uint8_t key[64];
    uint32_t len = 0;
    assert_int_equal(chmod(f->dir, 0700), 0);
    assert_int_equal(kvp_psk_load(f->dir, key, sizeof(key), &len), KVP_ERR_INVALID);
    assert_non_null(strstr(kvp_last_error(), "not a regular file"));
    unlink(f->path);
    assert_int_equal(kvp_psk_load(f->path, key, sizeof(key), &len), KVP_ERR_IO);
    assert_non_null(strstr(kvp_last_error(), "No such file"));
    assert_int_equal(kvp_psk_load(NULL, key, sizeof(key), &len), KVP_ERR_INVALID);
    /* A caller buffer smaller than the key: refused, not truncated. */
    psk_write(f, K32, 0600);
    assert_int_equal(kvp_psk_load(f->path, key, 16, &len), KVP_ERR_INVALID);
    assert_non_null(strstr(kvp_last_error(), "do not fit"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_psk_hex_with_whitespace, psk_setup, psk_teardown),
        cmocka_unit_test_setup_teardown(test_psk_mode_refused, psk_setup, psk_teardown),
        cmocka_unit_test_setup_teardown(test_psk_content_refused, psk_setup, psk_teardown),
        cmocka_unit_test_setup_teardown(test_psk_not_regular_or_missing, psk_setup, psk_teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
