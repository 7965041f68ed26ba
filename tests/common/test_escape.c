/* test_escape.c -- kvp_escape (issue 27): what a peer or a client sends
 * never reaches a log line or a page raw, and the library's log sink applies
 * it to every line. */
#include "testutil.h"

static const char *esc(const char *s, size_t len, uint32_t flags)
{
    static char out[512];
    size_t n = kvp_escape(out, sizeof(out), s, len, flags);
    assert_int_equal(n, strlen(out));
    return out;
}
#define ESC(lit, flags) esc((lit), sizeof(lit) - 1, (flags))

static void test_escape_controls(void **state)
{
    (void)state;
    assert_string_equal(ESC("127.0.0.1:7000", 0), "127.0.0.1:7000");
    assert_string_equal(ESC("a\nb\rc\x1b[31md", 0), "a\\x0ab\\x0dc\\x1b[31md");
    assert_string_equal(ESC("\x7f\t", 0), "\\x7f\\x09");
    assert_string_equal(ESC("nul\0end", 0), "nul\\x00end");
    /* the flags add backslash, quote and space; without them they pass */
    assert_string_equal(ESC("a\\b \"c\"", 0), "a\\b \"c\"");
    assert_string_equal(ESC("a\\b \"c\"", KVP_ESCAPE_BACKSLASH), "a\\x5cb \"c\"");
    assert_string_equal(ESC("a\\b \"c\"", KVP_ESCAPE_BACKSLASH | KVP_ESCAPE_QUOTE),
                        "a\\x5cb \\x22c\\x22");
    assert_string_equal(ESC("x ready=1", KVP_ESCAPE_SPACE), "x\\x20ready=1");
}

static void test_escape_utf8(void **state)
{
    (void)state;
    /* well-formed printable UTF-8 passes */
    assert_string_equal(ESC("h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80", 0),
                        "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80");
    /* C1 CSI (U+009B), line separator, RLO override, isolate */
    assert_string_equal(ESC("\xc2\x9b" "31m", 0), "\\xc2\\x9b31m");
    assert_string_equal(ESC("\xe2\x80\xa8", 0), "\\xe2\\x80\\xa8");
    assert_string_equal(ESC("\xe2\x80\xae", 0), "\\xe2\\x80\\xae");
    assert_string_equal(ESC("\xe2\x81\xa6", 0), "\\xe2\\x81\\xa6");
    /* ill-formed: stray continuation, overlong '/', surrogate, > U+10FFFF,
     * truncated sequence at the end, invalid lead bytes */
    assert_string_equal(ESC("\x80", 0), "\\x80");
    assert_string_equal(ESC("\xc0\xaf", 0), "\\xc0\\xaf");
    assert_string_equal(ESC("\xed\xa0\x80", 0), "\\xed\\xa0\\x80");
    assert_string_equal(ESC("\xf4\x90\x80\x80", 0), "\\xf4\\x90\\x80\\x80");
    assert_string_equal(ESC("ok\xe2\x82", 0), "ok\\xe2\\x82");
    assert_string_equal(ESC("\xff\xfe", 0), "\\xff\\xfe");
    /* a bad lead resyncs at the next byte: the ASCII after it survives */
    assert_string_equal(ESC("\xe2" "A", 0), "\\xe2A");
}

static void test_escape_truncation(void **state)
{
    (void)state;
    char out[8];
    /* "ab" + \x0a (4) = 6 fits in 7; the next escape would not: stops whole */
    assert_int_equal(kvp_escape(out, sizeof(out), "ab\n\n", 4, 0), 6);
    assert_string_equal(out, "ab\\x0a");
    /* a UTF-8 sequence is never cut */
    assert_int_equal(kvp_escape(out, 4, "ab\xe2\x82\xac", 5, 0), 2);
    assert_string_equal(out, "ab");
    assert_int_equal(kvp_escape(out, 1, "abc", 3, 0), 0);
    assert_string_equal(out, "");
    assert_int_equal(kvp_escape(out, 0, "abc", 3, 0), 0); /* cap 0: nothing written */
}

/* Every byte value, alone: the output is one line of printable ASCII or
 * well-formed UTF-8, and never holds a control byte. */
static void test_escape_every_byte(void **state)
{
    (void)state;
    char out[16];
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        size_t n = kvp_escape(out, sizeof(out), &c, 1, KVP_ESCAPE_BACKSLASH);
        for (size_t i = 0; i < n; i++)
            assert_true((unsigned char)out[i] >= 0x20 && (unsigned char)out[i] < 0x7f);
        assert_int_equal(n, b >= 0x20 && b < 0x7f && b != '\\' ? 1 : 4);
    }
}

/* The library's sink gets the escaped line: a peer id with a newline and an
 * ANSI escape cannot start a second line or recolour the terminal. */
static void test_escape_log_sink(void **state)
{
    (void)state;
    kvp_test_logcap_t cap;
    kvp_test_logcap_start(&cap);
    KVP_ERROR("n1", "peer %s: refused", "evil\n2026-01-01T00:00:00Z ERROR [n1] forged\x1b[2J");
    assert_int_equal(cap.count[KVP_LOG_ERROR], 1);
    assert_null(strchr(cap.last[KVP_LOG_ERROR], '\n'));
    assert_null(strchr(cap.last[KVP_LOG_ERROR], '\x1b'));
    assert_non_null(strstr(cap.last[KVP_LOG_ERROR], "evil\\x0a2026"));
    assert_non_null(strstr(cap.last[KVP_LOG_ERROR], "forged\\x1b[2J: refused"));
    kvp_test_logcap_stop();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_escape_controls),   cmocka_unit_test(test_escape_utf8),
        cmocka_unit_test(test_escape_truncation), cmocka_unit_test(test_escape_every_byte),
        cmocka_unit_test(test_escape_log_sink),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
