/* test_wire_reject.c -- every decoder rejection rule (SPEC §4, §9), one test
 * per rule: KVP_ERR_PROTO and a `why` naming the rule. Frames are valid
 * encodings of the wt_sample messages with one field patched. */
#include "wire_testutil.h"
#include "wire/wire_int.h" /* kvp__wire_type_info: per-type limits */

static const kvp_wire_ctx_t ctx_post = {.handshake_done = true, .peer_num_blocks = 4096};
static const kvp_wire_ctx_t ctx_pre = {.handshake_done = false, .peer_num_blocks = 0};

/* Payload offsets of the sample frames (header 8, epochs 32). */
enum {
    OFF_BODY = 8 + 32,
    OFF_HELLO_MAJOR = 8,
    OFF_HELLO_PEER_ID = 12,
    OFF_LIST_N = OFF_BODY + 16,      /* LOOKUP, LOOKUP_RESP */
    OFF_LIST_FIRST = OFF_LIST_N + 4, /* first key / result */
    OFF_FETCH_N = OFF_BODY + 20,     /* FETCH, FETCH_DONE */
    OFF_FETCH_STATUS = OFF_BODY + 16,
    OFF_FETCH_FIRST = OFF_FETCH_N + 4,
    OFF_ACK_BLOB_LEN = OFF_BODY + 16,
};

static uint8_t frame[4096];

static int setup(void **state)
{
    kvp_wire_scratch_t *s = NULL;
    assert_int_equal(kvp_wire_scratch_create(&s), KVP_OK);
    *state = s;
    return 0;
}

static int teardown(void **state)
{
    kvp_wire_scratch_destroy(*state);
    KVP_TEST_ASSERT_NO_LEAKS();
    return 0;
}

/* Encode the sample of `type` into `frame`; returns its length. */
static size_t enc_sample(uint16_t type)
{
    wt_sample_t s;
    size_t len;
    wt_sample(&s, type);
    assert_int_equal(kvp_wire_encode(&s.m, frame, sizeof(frame), &len), KVP_OK);
    return len;
}

static void set_payload_len(uint32_t len)
{
    wt_put32(frame, len);
}

/* Decoding frame[0..len) must fail with KVP_ERR_PROTO, a why containing
 * `sub`, and leave *msg untouched. */
static void expect_reject(void **state, const kvp_wire_ctx_t *ctx, size_t len, const char *sub)
{
    kvp_msg_t m;
    char why[160] = "";
    memset(&m, 0xA5, sizeof(m));
    kvp_status_t rc = kvp_wire_decode(ctx, frame, len, *state, &m, why, sizeof(why));
    if (rc != KVP_ERR_PROTO || strstr(why, sub) == NULL)
        fail_msg("want PROTO with \"%s\", got %d \"%s\"", sub, rc, why);
    for (size_t i = 0; i < sizeof(m); i++)
        assert_int_equal(((uint8_t *)&m)[i], 0xA5);
}

/* The same rule must already fire in the resumable header step. */
static void expect_hdr_reject(const kvp_wire_ctx_t *ctx, const char *sub)
{
    kvp_frame_hdr_t hdr = {0, 0, 0};
    char why[160] = "";
    assert_int_equal(kvp_wire_parse_hdr(ctx, frame, KVP_WIRE_HDR_LEN, &hdr), KVP_ERR_PROTO);
    assert_int_equal(hdr.length, 0); /* out-param untouched */
    assert_int_equal(kvp_wire_parse_hdr_why(ctx, frame, KVP_WIRE_HDR_LEN, &hdr, why, sizeof(why)),
                     KVP_ERR_PROTO);
    if (strstr(why, sub) == NULL)
        fail_msg("header: want \"%s\", got \"%s\"", sub, why);
}

static void test_reject_unknown_type(void **state)
{
    size_t len = enc_sample(KVP_MSG_PING);
    uint16_t bad[] = {0, 13, 200, 0xFFFF};
    for (size_t i = 0; i < KVP_ARRAY_SIZE(bad); i++) {
        wt_put16(frame + 4, bad[i]);
        expect_hdr_reject(&ctx_post, "unknown type");
        expect_reject(state, &ctx_post, len, "unknown type");
    }
}

static void test_reject_type_before_handshake(void **state)
{
    uint16_t post_only[] = {KVP_MSG_PING, KVP_MSG_PONG, KVP_MSG_LOOKUP, KVP_MSG_LOOKUP_RESP,
                            KVP_MSG_FETCH, KVP_MSG_FETCH_DONE, KVP_MSG_ABORT, KVP_MSG_ABORT_ACK};
    for (size_t i = 0; i < KVP_ARRAY_SIZE(post_only); i++) {
        size_t len = enc_sample(post_only[i]);
        expect_hdr_reject(&ctx_pre, "before handshake");
        expect_reject(state, &ctx_pre, len, "before handshake");
    }
}

static void test_reject_over_type_limit(void **state)
{
    size_t len = enc_sample(KVP_MSG_PING);
    set_payload_len((uint32_t)(len - 8 + 1)); /* PING max is 48 */
    expect_hdr_reject(&ctx_post, "type limit");
    enc_sample(KVP_MSG_HELLO);
    set_payload_len(1025);
    expect_hdr_reject(&ctx_pre, "type limit");
    enc_sample(KVP_MSG_BYE);
    set_payload_len(2 * 16 + 2 + 1 + KVP_WIRE_COMPAT_MAX + 1);
    expect_hdr_reject(&ctx_post, "type limit");
}

/* Minor 1: BYE INCOMPATIBLE may carry 1..KVP_WIRE_COMPAT_MAX printable
 * bytes of compat string, nothing else does; the encoder keeps the same rules
 * and kvp_wire_compat_for_bye makes any string sendable. */
static void bye_frame(uint16_t reason, const char *s, size_t n)
{
    uint8_t *p = frame + KVP_WIRE_HDR_LEN + 2 * KVP_WIRE_EPOCH_LEN;
    enc_sample(KVP_MSG_BYE);
    p[0] = (uint8_t)reason;
    p[1] = (uint8_t)(reason >> 8);
    p[2] = (uint8_t)n;
    memcpy(p + 3, s, n);
    set_payload_len((uint32_t)(2 * KVP_WIRE_EPOCH_LEN + 3 + n));
}

static void test_bye_compat_rules(void **state)
{
    size_t flen = KVP_WIRE_HDR_LEN + 2 * KVP_WIRE_EPOCH_LEN;
    kvp_msg_t m;
    char why[160] = "";
    char s41[KVP_WIRE_COMPAT_MAX + 1];
    memset(s41, 'c', sizeof(s41));
    bye_frame(KVP_BYE_INCOMPATIBLE, s41, KVP_WIRE_COMPAT_MAX);
    assert_int_equal(kvp_wire_decode(&ctx_post, frame, flen + 3 + KVP_WIRE_COMPAT_MAX, *state, &m,
                                     why, sizeof(why)), KVP_OK);
    assert_int_equal(strlen(m.u.bye.compat), KVP_WIRE_COMPAT_MAX);
    bye_frame(KVP_BYE_INCOMPATIBLE, s41, KVP_WIRE_COMPAT_MAX + 1);
    expect_reject(state, &ctx_post, flen + 3 + KVP_WIRE_COMPAT_MAX + 1, "type limit");
    bye_frame(KVP_BYE_INCOMPATIBLE, "", 0);
    expect_reject(state, &ctx_post, flen + 3, "compat string length 0");
    bye_frame(KVP_BYE_INCOMPATIBLE, "a\x7f" "b", 3);
    expect_reject(state, &ctx_post, flen + 3 + 3, "not printable");
    bye_frame(KVP_BYE_DEAD, "model", 5);
    expect_reject(state, &ctx_post, flen + 3 + 5, "compat string with reason");
    /* Without a string: a minor-0 BYE, decoded with compat "". */
    enc_sample(KVP_MSG_BYE);
    set_payload_len(2 * KVP_WIRE_EPOCH_LEN + 2);
    assert_int_equal(kvp_wire_decode(&ctx_post, frame, flen + 2, *state, &m, why, sizeof(why)),
                     KVP_OK);
    assert_string_equal(m.u.bye.compat, "");
    /* The encoder refuses what the decoder would. */
    wt_sample_t s;
    size_t len;
    wt_sample(&s, KVP_MSG_BYE);
    s.m.u.bye.reason = KVP_BYE_DEAD;
    assert_int_equal(kvp_wire_encode(&s.m, frame, sizeof(frame), &len), KVP_ERR_INVALID);
    wt_sample(&s, KVP_MSG_BYE);
    s.m.u.bye.compat[2] = '\n';
    assert_int_equal(kvp_wire_encode(&s.m, frame, sizeof(frame), &len), KVP_ERR_INVALID);
    wt_sample(&s, KVP_MSG_BYE);
    memset(s.m.u.bye.compat, 'x', sizeof(s.m.u.bye.compat)); /* no NUL */
    assert_int_equal(kvp_wire_encode(&s.m, frame, sizeof(frame), &len), KVP_ERR_INVALID);
    /* Any string becomes sendable: cut with "...", bytes outside ASCII -> '?'. */
    char out[KVP_WIRE_COMPAT_MAX + 1];
    kvp_wire_compat_for_bye("m\xc3\xa9\tx", out);
    assert_string_equal(out, "m???x");
    kvp_wire_compat_for_bye("0123456789012345678901234567890123456789-and-more", out);
    assert_string_equal(out, "0123456789012345678901234567890123456...");
    kvp_wire_compat_for_bye(NULL, out);
    assert_string_equal(out, "");
}

static void test_reject_over_frame_max(void **state)
{
    enc_sample(KVP_MSG_LOOKUP);
    set_payload_len(KVP_WIRE_FRAME_MAX - KVP_WIRE_HDR_LEN + 1);
    expect_hdr_reject(&ctx_post, "frame limit");
    set_payload_len(UINT32_MAX);
    expect_hdr_reject(&ctx_post, "frame limit");
    /* The largest legal frame header passes the header step. */
    kvp_frame_hdr_t hdr;
    set_payload_len(KVP_WIRE_FRAME_MAX - KVP_WIRE_HDR_LEN);
    assert_int_equal(kvp_wire_parse_hdr(&ctx_post, frame, 8, &hdr), KVP_OK);
    assert_int_equal(hdr.length, KVP_WIRE_FRAME_MAX - KVP_WIRE_HDR_LEN);
}

static void test_reject_over_prehs_frame_max(void **state)
{
    enc_sample(KVP_MSG_HELLO_ACK);
    set_payload_len(KVP_WIRE_FRAME_MAX_PREHS - KVP_WIRE_HDR_LEN + 1);
    expect_hdr_reject(&ctx_pre, "pre-handshake frame limit");
    /* After the handshake the same header is judged by the type's limit. */
    expect_hdr_reject(&ctx_post, "type limit");
}

static void test_reject_unknown_major(void **state)
{
    size_t len = enc_sample(KVP_MSG_HELLO);
    wt_put16(frame + OFF_HELLO_MAJOR, KVP_WIRE_MAJOR + 1);
    expect_reject(state, &ctx_pre, len, "major");
    wt_put16(frame + OFF_HELLO_MAJOR, 0);
    expect_reject(state, &ctx_post, len, "major");
}

static void test_reject_list_over_max(void **state)
{
    struct {
        uint16_t type;
        size_t off;
    } lists[] = {{KVP_MSG_LOOKUP, OFF_LIST_N},
                 {KVP_MSG_LOOKUP_RESP, OFF_LIST_N},
                 {KVP_MSG_FETCH, OFF_FETCH_N},
                 {KVP_MSG_FETCH_DONE, OFF_FETCH_N}};
    for (size_t i = 0; i < KVP_ARRAY_SIZE(lists); i++) {
        size_t len = enc_sample(lists[i].type);
        wt_put32(frame + lists[i].off, KVP_WIRE_LIST_MAX + 1);
        expect_reject(state, &ctx_post, len, "list too long");
        wt_put32(frame + lists[i].off, UINT32_MAX);
        expect_reject(state, &ctx_post, len, "list too long");
    }
}

static void test_reject_key_length_zero(void **state)
{
    size_t len = enc_sample(KVP_MSG_LOOKUP);
    frame[OFF_LIST_FIRST] = 0;
    expect_reject(state, &ctx_post, len, "key length 0");
    len = enc_sample(KVP_MSG_FETCH);
    frame[OFF_FETCH_FIRST] = 0;
    expect_reject(state, &ctx_post, len, "key length 0");
}

static void test_reject_key_length_over_64(void **state)
{
    size_t len = enc_sample(KVP_MSG_LOOKUP);
    frame[OFF_LIST_FIRST] = KVP_WIRE_KEY_MAX + 1;
    expect_reject(state, &ctx_post, len, "key length 65");
    frame[OFF_LIST_FIRST] = 255;
    expect_reject(state, &ctx_post, len, "key length 255");
    len = enc_sample(KVP_MSG_FETCH);
    frame[OFF_FETCH_FIRST] = KVP_WIRE_KEY_MAX + 1;
    expect_reject(state, &ctx_post, len, "key length 65");
}

static void test_reject_empty_peer_id(void **state)
{
    size_t len = enc_sample(KVP_MSG_HELLO);
    frame[OFF_HELLO_PEER_ID] = 0;
    expect_reject(state, &ctx_pre, len, "string length 0 (peer_id)");
}

static void test_reject_empty_instance_id(void **state)
{
    size_t len = enc_sample(KVP_MSG_HELLO);
    size_t off = OFF_HELLO_PEER_ID + 1 + frame[OFF_HELLO_PEER_ID];
    frame[off] = 0;
    expect_reject(state, &ctx_pre, len, "string length 0 (instance_id)");
}

/* On the wire a string cannot exceed 255 (u8 length); the decoder's other
 * string rule is no embedded NUL, which would rename the peer. */
static void test_reject_string_with_nul(void **state)
{
    size_t len = enc_sample(KVP_MSG_HELLO);
    frame[OFF_HELLO_PEER_ID + 3] = 0;
    expect_reject(state, &ctx_pre, len, "string contains NUL (peer_id)");
}

static void test_reject_blob_over_max(void **state)
{
    size_t len = enc_sample(KVP_MSG_HELLO_ACK);
    wt_put32(frame + OFF_ACK_BLOB_LEN, KVP_WIRE_BLOB_MAX + 1);
    expect_reject(state, &ctx_pre, len, "blob too large");
}

static void test_reject_truncated_payload(void **state)
{
    size_t len = enc_sample(KVP_MSG_PING);
    set_payload_len((uint32_t)(len - 8 - 1));
    expect_reject(state, &ctx_post, len - 1, "truncated payload");
    len = enc_sample(KVP_MSG_HELLO);
    set_payload_len((uint32_t)(len - 8 - 1));
    expect_reject(state, &ctx_pre, len - 1, "truncated payload");
    len = enc_sample(KVP_MSG_LOOKUP); /* the last key cut short */
    set_payload_len((uint32_t)(len - 8 - 1));
    expect_reject(state, &ctx_post, len - 1, "truncated payload");
}

/* Every proper prefix of every type's payload is refused as truncated. Each
 * prefix sits in a heap buffer of exactly its size, so a read past the end
 * is also caught by ASan/valgrind. */
static void test_reject_every_truncation(void **state)
{
    for (size_t t = 0; t < KVP_ARRAY_SIZE(wt_all_types); t++) {
        size_t len = enc_sample(wt_all_types[t]);
        for (size_t cut = 8; cut < len; cut++) {
            if (wt_all_types[t] == KVP_MSG_BYE && cut == 8 + 2 * KVP_WIRE_EPOCH_LEN + 2)
                continue; /* BYE without its optional compat string: valid */
            uint8_t *buf = malloc(cut);
            kvp_msg_t m;
            char why[160] = "";
            assert_non_null(buf);
            memcpy(buf, frame, cut);
            wt_put32(buf, (uint32_t)(cut - 8));
            assert_int_equal(kvp_wire_decode(&ctx_post, buf, cut, *state, &m, why, sizeof(why)),
                             KVP_ERR_PROTO);
            if (!strstr(why, "truncated") && !strstr(why, "missing epoch") &&
                !strstr(why, "exceeds payload"))
                fail_msg("%s cut at %zu: unexpected reason \"%s\"",
                         kvp_msg_type_str(wt_all_types[t]), cut, why);
            free(buf);
        }
    }
}

static void test_reject_trailing_bytes(void **state)
{
    for (size_t t = 0; t < KVP_ARRAY_SIZE(wt_all_types); t++) {
        size_t len = enc_sample(wt_all_types[t]);
        if (len - 8 + 1 > kvp__wire_type_info(wt_all_types[t])->max)
            continue;
        frame[len] = 0;
        set_payload_len((uint32_t)(len - 8 + 1));
        expect_reject(state, &ctx_post, len + 1, "trailing bytes");
    }
}

static void test_reject_frame_length_mismatch(void **state)
{
    size_t len = enc_sample(KVP_MSG_PING);
    expect_reject(state, &ctx_post, len - 1, "length mismatch");
    expect_reject(state, &ctx_post, len + 1, "length mismatch");
    expect_reject(state, &ctx_post, 7, "truncated header");
}

static void test_reject_missing_epochs(void **state)
{
    uint16_t types[] = {KVP_MSG_AUTH, KVP_MSG_HELLO_ACK, KVP_MSG_PING, KVP_MSG_BYE,
                        KVP_MSG_LOOKUP, KVP_MSG_ABORT_ACK};
    for (size_t i = 0; i < KVP_ARRAY_SIZE(types); i++) {
        enc_sample(types[i]);
        set_payload_len(0);
        expect_reject(state, &ctx_post, 8, "missing epoch");
        set_payload_len(20); /* source epoch present, target cut */
        expect_reject(state, &ctx_post, 28, "missing epoch (target)");
    }
}

static void test_reject_zero_epochs(void **state)
{
    for (size_t t = 1; t < KVP_ARRAY_SIZE(wt_all_types); t++) { /* all but HELLO */
        size_t len = enc_sample(wt_all_types[t]);
        memset(frame + 8, 0, 16);
        expect_reject(state, &ctx_post, len, "zero epoch (source)");
        len = enc_sample(wt_all_types[t]);
        memset(frame + 24, 0, 16);
        expect_reject(state, &ctx_post, len, "zero epoch (target)");
    }
    size_t len = enc_sample(KVP_MSG_HELLO_ACK);
    memset(frame + OFF_BODY, 0, 16);
    expect_reject(state, &ctx_pre, len, "zero epoch (acked epoch)");
}

static void test_reject_zero_hello_epoch(void **state)
{
    size_t len = enc_sample(KVP_MSG_HELLO);
    size_t off = OFF_HELLO_PEER_ID + 1 + frame[OFF_HELLO_PEER_ID];
    off += 1 + frame[off];
    memset(frame + off, 0, KVP_WIRE_EPOCH_LEN);
    expect_reject(state, &ctx_pre, len, "zero epoch (hello epoch)");
}

static void test_reject_fetch_dst_slot_out_of_range(void **state)
{
    /* The sample's last item targets slot 33. */
    kvp_wire_ctx_t ctx = {.handshake_done = true, .peer_num_blocks = 33};
    size_t len = enc_sample(KVP_MSG_FETCH);
    expect_reject(state, &ctx, len, "dst_slot 33 out of range");
    kvp_msg_t m;
    ctx.peer_num_blocks = 34; /* boundary: the highest slot is fine */
    assert_int_equal(kvp_wire_decode(&ctx, frame, len, *state, &m, NULL, 0), KVP_OK);
}

static void test_reject_fetch_without_layout(void **state)
{
    kvp_wire_ctx_t ctx = {.handshake_done = true, .peer_num_blocks = 0};
    size_t len = enc_sample(KVP_MSG_FETCH);
    expect_reject(state, &ctx, len, "num_blocks 0");
    wt_sample_t s; /* even the empty, terminal FETCH */
    wt_sample(&s, KVP_MSG_FETCH);
    s.m.u.fetch.n = 0;
    assert_int_equal(kvp_wire_encode(&s.m, frame, sizeof(frame), &len), KVP_OK);
    expect_reject(state, &ctx, len, "num_blocks 0");
}

/* A declared count larger than the payload could hold is refused before
 * any entry is decoded into scratch. */
static void test_reject_count_exceeds_payload(void **state)
{
    struct {
        uint16_t type;
        size_t off;
    } lists[] = {{KVP_MSG_LOOKUP, OFF_LIST_N},
                 {KVP_MSG_LOOKUP_RESP, OFF_LIST_N},
                 {KVP_MSG_FETCH, OFF_FETCH_N},
                 {KVP_MSG_FETCH_DONE, OFF_FETCH_N}};
    for (size_t i = 0; i < KVP_ARRAY_SIZE(lists); i++) {
        size_t len = enc_sample(lists[i].type);
        wt_put32(frame + lists[i].off, 1000);
        expect_reject(state, &ctx_post, len, "exceeds payload");
        wt_put32(frame + lists[i].off, KVP_WIRE_LIST_MAX);
        expect_reject(state, &ctx_post, len, "exceeds payload");
    }
}

static void test_reject_bad_values(void **state)
{
    size_t len = enc_sample(KVP_MSG_LOOKUP_RESP);
    frame[OFF_LIST_FIRST] = 2;
    expect_reject(state, &ctx_post, len, "bad lookup result");
    len = enc_sample(KVP_MSG_FETCH_DONE);
    frame[OFF_FETCH_FIRST] = 7;
    expect_reject(state, &ctx_post, len, "bad block ok flag");
    len = enc_sample(KVP_MSG_FETCH_DONE);
    wt_put32(frame + OFF_FETCH_STATUS, 5);
    expect_reject(state, &ctx_post, len, "bad status");
}

/* kvp_wire_peek_hello reads the identity of a HELLO of any major version,
 * within bounds: every truncation is refused, never read past. */
static void test_peek_hello_other_major(void **state)
{
    size_t len = enc_sample(KVP_MSG_HELLO);
    wt_put16(frame + KVP_WIRE_HDR_LEN, KVP_WIRE_MAJOR + 1); /* HELLO: major first; a future one */
    kvp_msg_t m;
    assert_int_equal(kvp_wire_decode(&ctx_pre, frame, len, *state, &m, NULL, 0), KVP_ERR_PROTO);
    kvp_wire_hello_id_t id;
    assert_int_equal(kvp_wire_peek_hello(frame, len, &id), KVP_OK);
    assert_int_equal(id.major, KVP_WIRE_MAJOR + 1);
    assert_int_equal(strlen(id.peer_id), frame[OFF_HELLO_PEER_ID]);
    assert_memory_equal(id.peer_id, frame + OFF_HELLO_PEER_ID + 1, frame[OFF_HELLO_PEER_ID]);
    assert_false(kvp_epoch_is_zero(&id.epoch));
    size_t need = OFF_HELLO_PEER_ID + 1 + frame[OFF_HELLO_PEER_ID];
    need += 1 + frame[need] + KVP_WIRE_EPOCH_LEN;
    for (size_t cut = 0; cut < need; cut++)
        assert_int_equal(kvp_wire_peek_hello(frame, cut, &id), KVP_ERR_PROTO);
    assert_int_equal(kvp_wire_peek_hello(frame, need, &id), KVP_OK);
    len = enc_sample(KVP_MSG_PING); /* not a HELLO */
    assert_int_equal(kvp_wire_peek_hello(frame, len, &id), KVP_ERR_PROTO);
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_reject_unknown_type),
        T(test_reject_type_before_handshake),
        T(test_reject_over_type_limit),
        T(test_bye_compat_rules),
        T(test_reject_over_frame_max),
        T(test_reject_over_prehs_frame_max),
        T(test_reject_unknown_major),
        T(test_reject_list_over_max),
        T(test_reject_key_length_zero),
        T(test_reject_key_length_over_64),
        T(test_reject_empty_peer_id),
        T(test_reject_empty_instance_id),
        T(test_reject_string_with_nul),
        T(test_reject_blob_over_max),
        T(test_reject_truncated_payload),
        T(test_reject_every_truncation),
        T(test_reject_trailing_bytes),
        T(test_reject_frame_length_mismatch),
        T(test_reject_missing_epochs),
        T(test_reject_zero_epochs),
        T(test_reject_zero_hello_epoch),
        T(test_reject_fetch_dst_slot_out_of_range),
        T(test_reject_fetch_without_layout),
        T(test_reject_count_exceeds_payload),
        T(test_reject_bad_values),
        T(test_peek_hello_other_major),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
