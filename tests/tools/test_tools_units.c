/* test_tools_units.c -- kvpeerd's option table (values, INI lines,
 * precedence, errors) and its Prometheus text rendering, without processes. */
#include "testutil.h"

#include "metrics.h"
#include "options.h"

#include <regex.h>
#include <sys/stat.h>
#include <unistd.h>

/* Error text of one call, captured through a memory stream. */
typedef struct cap {
    char *buf;
    size_t len;
    FILE *f;
} cap_t;

static void cap_open(cap_t *c)
{
    memset(c, 0, sizeof(*c));
    c->f = open_memstream(&c->buf, &c->len);
    assert_non_null(c->f);
}

static const char *cap_text(cap_t *c)
{
    fflush(c->f);
    return c->buf;
}

static void cap_close(cap_t *c)
{
    fclose(c->f);
    free(c->buf);
}

static void test_defaults_follow_config_init(void **state)
{
    kvpd_settings_t s;
    kvp_config_t ref;
    kvpd_settings_init(&s);
    kvp_config_init(&ref);
    assert_int_equal(s.cfg.heartbeat_ms, ref.heartbeat_ms);
    assert_int_equal(s.cfg.dead_after_ms, ref.dead_after_ms);
    assert_int_equal(s.cfg.shutdown_drain_ms, ref.shutdown_drain_ms);
    assert_int_equal(s.cfg.block_size, ref.block_size);
    assert_string_equal(s.listen, "127.0.0.1:0");
    assert_false(s.admin);
    assert_int_equal(s.log_level, KVPD_LOG_INFO);
    kvpd_settings_free(&s);
}

static void test_set_values_and_errors(void **state)
{
    kvpd_settings_t s;
    cap_t c;
    kvpd_settings_init(&s);
    cap_open(&c);
    assert_int_equal(kvpd_settings_set(&s, "block_size", "256K", "t", c.f), 0);
    assert_int_equal(s.cfg.block_size, 256 * 1024);
    assert_int_equal(kvpd_settings_set(&s, "max-inflight-bytes-per-peer", "2GiB", "t", c.f), 0);
    assert_true(s.cfg.max_inflight_bytes_per_peer == 2ull << 30);
    assert_int_equal(kvpd_settings_set(&s, "hash_seed", "0x10", "t", c.f), 0);
    assert_true(s.cfg.hash_seed == 16);
    assert_int_equal(kvpd_settings_set(&s, "ADMIN", "yes", "t", c.f), 0);
    assert_true(s.admin);
    assert_int_equal(kvpd_settings_set(&s, "log_level", "DEBUG", "t", c.f), 0);
    assert_int_equal(s.log_level, KVPD_LOG_DEBUG);
    assert_string_equal(cap_text(&c), "");
    /* Each bad value: refused, one line naming the origin and the option. */
    const char *bad[][2] = {{"heartbeat_ms", "12x"},    {"heartbeat_ms", "-1"},
                            {"num_blocks", "0"},        {"num_blocks", "99999999999"},
                            {"heartbeat_ms", ""},       {"admin", "maybe"},
                            {"log_level", "verbose"},   {"block_size", "4Q"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(kvpd_settings_set(&s, bad[i][0], bad[i][1], "origin-x", c.f), -1);
        assert_non_null(strstr(cap_text(&c), "origin-x"));
        assert_non_null(strstr(cap_text(&c), bad[i][0]));
    }
    assert_int_equal(kvpd_settings_set(&s, "no_such", "1", "origin-y", c.f), -1);
    assert_non_null(strstr(cap_text(&c), "unknown option 'no_such'"));
    assert_int_equal(s.cfg.num_blocks, 1024); /* failed sets changed nothing */
    cap_close(&c);
    kvpd_settings_free(&s);
}

static char *write_ini(const char *text)
{
    char *path = strdup("/tmp/kvpd-unit-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void test_ini_names_key_and_line(void **state)
{
    kvpd_settings_t s;
    cap_t c;
    char *ok = write_ini("; c\n[node]\nnum_blocks = 77 ; inline\n[x]\nadmin = true\n");
    char *bad = write_ini("[node]\nnum_blocks = 8\n\ndead_after_msx = 9\n");
    char *syn = write_ini("num_blocks = 8\nnot ini at all\n");
    kvpd_settings_init(&s);
    cap_open(&c);
    assert_int_equal(kvpd_settings_load_file(&s, ok, c.f), 0);
    assert_int_equal(s.cfg.num_blocks, 77);
    assert_true(s.admin);
    assert_int_equal(kvpd_settings_load_file(&s, bad, c.f), -1);
    assert_non_null(strstr(cap_text(&c), "line 4: unknown option 'dead_after_msx'"));
    assert_int_equal(kvpd_settings_load_file(&s, syn, c.f), -1);
    assert_non_null(strstr(cap_text(&c), "line 2: syntax error"));
    cap_close(&c);
    kvpd_settings_free(&s);
    unlink(ok), unlink(bad), unlink(syn);
    free(ok), free(bad), free(syn);
}

static void test_precedence_file_env_flags(void **state)
{
    kvpd_settings_t s;
    cap_t c, o;
    char *ini = write_ini("num_blocks = 10\nheartbeat_ms = 100\nload_timeout_ms = 7000\n");
    char *tok = write_ini("0123456789abcdef0123456789abcdef\n"); /* mkstemp: mode 0600 */
    char tokarg[64];
    snprintf(tokarg, sizeof(tokarg), "--admin_token_file=%s", tok);
    char *argv[] = {"kvpeerd", "--config", ini, "--heartbeat-ms=300", "--admin", tokarg, NULL};
    setenv("KVPEER_NUM_BLOCKS", "20", 1);
    setenv("KVPEER_HEARTBEAT_MS", "200", 1);
    kvpd_settings_init(&s);
    cap_open(&c), cap_open(&o);
    assert_int_equal(kvpd_settings_load(&s, 6, argv, o.f, c.f), KVPD_LOAD_RUN);
    assert_int_equal(s.cfg.num_blocks, 20);         /* env over file */
    assert_int_equal(s.cfg.heartbeat_ms, 300);      /* flag over env */
    assert_int_equal(s.cfg.load_timeout_ms, 7000);  /* file over default */
    assert_true(s.admin);
    assert_string_equal(s.cfg.listen_addr, "127.0.0.1:0");
    assert_null(s.cfg.psk);
    kvpd_settings_free(&s);
    /* An unknown flag is refused before anything is applied. */
    char *argv2[] = {"kvpeerd", "--heartbeat_ms", "300", "--frobnicate", NULL};
    kvpd_settings_init(&s);
    assert_int_equal(kvpd_settings_load(&s, 4, argv2, o.f, c.f), KVPD_LOAD_ERROR);
    assert_non_null(strstr(cap_text(&c), "unknown option '--frobnicate'"));
    kvpd_settings_free(&s);
    unsetenv("KVPEER_NUM_BLOCKS");
    unsetenv("KVPEER_HEARTBEAT_MS");
    cap_close(&c), cap_close(&o);
    unlink(ini);
    free(ini);
    unlink(tok);
    free(tok);
}

/* Issue 27: --admin needs a token file that only its owner can read; the
 * check accepts exactly "Bearer <token>". */
static void test_admin_token_file(void **state)
{
    kvpd_settings_t s;
    cap_t c, o;
    uint8_t dg[KVPD_TOKEN_DIGEST];
    char *tok = write_ini("0123456789abcdef0123456789abcdef\n");
    char *shortt = write_ini("tooshort\n");
    char *spaced = write_ini("0123456789abcdef 0123456789abcdef\n");
    char arg[128];
    cap_open(&c), cap_open(&o);
    /* --admin without a token file: refused, and the message says what to do */
    char *argv[] = {"kvpeerd", "--admin", NULL, NULL};
    kvpd_settings_init(&s);
    assert_int_equal(kvpd_settings_load(&s, 2, argv, o.f, c.f), KVPD_LOAD_ERROR);
    assert_non_null(strstr(cap_text(&c), "admin_token_file"));
    kvpd_settings_free(&s);
    /* group- or world-readable: refused */
    chmod(tok, 0640);
    snprintf(arg, sizeof(arg), "--admin_token_file=%s", tok);
    argv[2] = arg;
    kvpd_settings_init(&s);
    assert_int_equal(kvpd_settings_load(&s, 3, argv, o.f, c.f), KVPD_LOAD_ERROR);
    assert_non_null(strstr(cap_text(&c), "group or others"));
    kvpd_settings_free(&s);
    chmod(tok, 0600);
    kvpd_settings_init(&s);
    assert_int_equal(kvpd_settings_load(&s, 3, argv, o.f, c.f), KVPD_LOAD_RUN);
    memcpy(dg, s.admin_token, sizeof(dg));
    kvpd_settings_free(&s);
    assert_true(kvpd_admin_token_check(dg, "Bearer 0123456789abcdef0123456789abcdef"));
    assert_true(kvpd_admin_token_check(dg, "bearer 0123456789abcdef0123456789abcdef"));
    assert_false(kvpd_admin_token_check(dg, "Bearer 0123456789abcdef0123456789abcdee"));
    assert_false(kvpd_admin_token_check(dg, "Bearer 0123456789abcdef0123456789abcdef0"));
    assert_false(kvpd_admin_token_check(dg, "0123456789abcdef0123456789abcdef"));
    assert_false(kvpd_admin_token_check(dg, "Bearer "));
    assert_false(kvpd_admin_token_check(dg, NULL));
    /* too short, or not one word: refused; a missing file names the error */
    const char *bad[] = {shortt, spaced, "/nonexistent/kvpd-token"};
    for (int i = 0; i < 3; i++) {
        kvpd_settings_init(&s);
        assert_int_equal(kvpd_admin_token_load(bad[i], dg, c.f), -1);
        assert_non_null(strstr(cap_text(&c), bad[i]));
        kvpd_settings_free(&s);
    }
    assert_non_null(strstr(cap_text(&c), "No such file"));
    cap_close(&c), cap_close(&o);
    unlink(tok), unlink(shortt), unlink(spaced);
    free(tok), free(shortt), free(spaced);
}

static void test_psk_hex_and_redaction(void **state)
{
    kvpd_settings_t s;
    cap_t c, o;
    char *argv[] = {"kvpeerd", "--psk", "00ff10112233445566778899aabbccdd", "--print-config",
                    NULL};
    kvpd_settings_init(&s);
    cap_open(&c), cap_open(&o);
    assert_int_equal(kvpd_settings_load(&s, 4, argv, o.f, c.f), KVPD_LOAD_EXIT);
    assert_int_equal(s.psk_len, 16);
    assert_int_equal(s.psk[1], 0xff);
    assert_non_null(strstr(cap_text(&o), "; psk = (set, 16 bytes, redacted)"));
    assert_null(strstr(cap_text(&o), "00ff10"));
    assert_non_null(strstr(cap_text(&o), "\nshutdown_drain_ms = 3000\n"));
    cap_close(&c), cap_close(&o);
    kvpd_settings_free(&s);
}

/* --------------------------------------------------------------- metrics */

/* Prometheus text format, line by line: HELP then TYPE once per family,
 * then only samples of that family; `name{l="v",...} value`. */
static void check_exposition(const char *text)
{
    regex_t sample;
    const char *re = "^([a-zA-Z_:][a-zA-Z0-9_:]*)"
                     "(\\{[a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\\\]|\\\\.)*\""
                     "(,[a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\\\]|\\\\.)*\")*\\})? "
                     "[-+]?[0-9]+(\\.[0-9]+)?([eE][-+]?[0-9]+)?$";
    char family[128] = "", line[1024];
    int typed = 0;
    assert_int_equal(regcomp(&sample, re, REG_EXTENDED | REG_NOSUB), 0);
    assert_true(strlen(text) > 0 && text[strlen(text) - 1] == '\n');
    for (const char *p = text; *p;) {
        size_t n = strcspn(p, "\n");
        snprintf(line, sizeof(line), "%.*s", (int)n, p);
        p += n + 1;
        if (strncmp(line, "# HELP ", 7) == 0) {
            assert_int_equal(sscanf(line + 7, "%127s", family), 1);
            typed = 0;
        } else if (strncmp(line, "# TYPE ", 7) == 0) {
            char name[128], type[32];
            assert_int_equal(sscanf(line + 7, "%127s %31s", name, type), 2);
            assert_string_equal(name, family);
            assert_false(typed);
            typed = 1;
        } else {
            if (regexec(&sample, line, 0, NULL, 0) != 0)
                fail_msg("not a sample line: '%s'", line);
            assert_true(typed);
            assert_int_equal(strncmp(line, family, strlen(family)), 0);
            char c = line[strlen(family)];
            assert_true(c == ' ' || c == '{' || c == '_'); /* _sum/_count */
        }
    }
    regfree(&sample);
}

static void test_metrics_text_format(void **state)
{
    kvp_stats_t st;
    kvp_peer_info_t peers[2];
    kvpd_buf_t b = {0};
    memset(&st, 0, sizeof(st));
    memset(peers, 0, sizeof(peers));
    st.slots_free = 60;
    st.slots_ready = 4;
    st.blocks_in = 12345;
    st.transfer_latency_ns_sum = 1500000;
    st.transfers_done = 3;
    snprintf(peers[0].peer, sizeof(peers[0].peer), "10.0.0.1:7400");
    snprintf(peers[0].data_path, sizeof(peers[0].data_path), "tcp");
    snprintf(peers[1].peer, sizeof(peers[1].peer), "we\"ird\\peer\n");
    peers[1].rtt_ns = 250000;
    kvpd_metrics_format(&b, &st, peers, 2);
    assert_false(b.oom);
    check_exposition(b.p);
    assert_non_null(strstr(b.p, "\nkvpeer_blocks_in_total 12345\n"));
    assert_non_null(strstr(b.p, "\nkvpeer_slots{state=\"free\"} 60\n"));
    assert_non_null(strstr(b.p, "\nkvpeer_transfer_latency_seconds_sum 0.001500000\n"));
    /* issue 27: controls and backslashes first as \xNN (kvp_escape), then
     * the format's own escapes: the page holds no raw newline of the peer's */
    assert_non_null(strstr(b.p, "peer=\"we\\\"ird\\\\x5cpeer\\\\x0a\""));
    assert_non_null(strstr(b.p, "data_path=\"tcp\"} 1\n"));
    assert_non_null(strstr(b.p, "kvpeer_up 1\n"));
    kvpd_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_follow_config_init),
        cmocka_unit_test(test_set_values_and_errors),
        cmocka_unit_test(test_ini_names_key_and_line),
        cmocka_unit_test(test_precedence_file_env_flags),
        cmocka_unit_test(test_admin_token_file), cmocka_unit_test(test_psk_hex_and_redaction),
        cmocka_unit_test(test_metrics_text_format),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
