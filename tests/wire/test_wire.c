/* test_wire.c -- wire layer: names and epochs, encode -> decode round trip of
 * every type (field by field), exact sizing, encoder rejections, and
 * resumable decoding at every byte split. Rejections by the decoder are in
 * test_wire_reject.c. */
#include "wire_testutil.h"

static const kvp_wire_ctx_t ctx_post = {.handshake_done = true, .peer_num_blocks = 4096};

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

/* ------------------------------------------------------------ names, epochs */

static void test_type_names(void **state)
{
    assert_string_equal(kvp_msg_type_str(KVP_MSG_HELLO), "HELLO");
    assert_string_equal(kvp_msg_type_str(KVP_MSG_HELLO_ACK), "HELLO_ACK");
    assert_string_equal(kvp_msg_type_str(KVP_MSG_ABORT_ACK), "ABORT_ACK");
    assert_string_equal(kvp_msg_type_str(0), "UNKNOWN");
    assert_string_equal(kvp_msg_type_str(13), "UNKNOWN");
    assert_string_equal(kvp_msg_type_str(0xFFFF), "UNKNOWN");
}

static void test_bye_reasons(void **state)
{
    assert_string_equal(kvp_bye_reason_str(KVP_BYE_GRACEFUL), "graceful");
    assert_string_equal(kvp_bye_reason_str(KVP_BYE_ABORT_ACK_TIMEOUT), "abort-ack-timeout");
    assert_string_equal(kvp_bye_reason_str(KVP_BYE_TRANSPORT), "transport");
    assert_string_equal(kvp_bye_reason_str(999), "unknown");
    assert_false(kvp_bye_reason_is_fault(KVP_BYE_GRACEFUL));
    assert_false(kvp_bye_reason_is_fault(KVP_BYE_SHUTDOWN));
    assert_false(kvp_bye_reason_is_fault(KVP_BYE_IDLE));
    uint16_t faults[] = {KVP_BYE_PROTOCOL, KVP_BYE_ABORT_ACK_TIMEOUT, KVP_BYE_DEAD,
                         KVP_BYE_DUPLICATE, KVP_BYE_INCOMPATIBLE, KVP_BYE_AUTH, KVP_BYE_LIMIT,
                         KVP_BYE_TRANSPORT, 999};
    for (size_t i = 0; i < KVP_ARRAY_SIZE(faults); i++)
        assert_true(kvp_bye_reason_is_fault(faults[i]));
}

static void test_epochs(void **state)
{
    kvp_epoch_t a, b, z;
    memset(&z, 0, sizeof(z));
    assert_true(kvp_epoch_is_zero(&z));
    assert_int_equal(kvp_epoch_new(&a), KVP_OK);
    assert_int_equal(kvp_epoch_new(&b), KVP_OK);
    assert_false(kvp_epoch_is_zero(&a));
    assert_false(kvp_epoch_eq(&a, &b));
    assert_true(kvp_epoch_eq(&a, &a));
    z.b[15] = 1; /* one non-zero byte anywhere makes it non-zero */
    assert_false(kvp_epoch_is_zero(&z));
}

/* Each of the scratch's two allocations can fail; nothing leaks and the
 * out-param stays untouched. */
static void test_scratch_alloc_failure(void **state)
{
    for (uint64_t n = 1; n <= 2; n++) {
        kvp_wire_scratch_t *s = (kvp_wire_scratch_t *)&n;
        kvp_alloc_fail_at(n, false);
        assert_int_equal(kvp_wire_scratch_create(&s), KVP_ERR_NOMEM);
        kvp_alloc_fail_at(0, false);
        assert_ptr_equal(s, (kvp_wire_scratch_t *)&n);
        KVP_TEST_ASSERT_NO_LEAKS();
    }
    kvp_wire_scratch_destroy(NULL);
}

/* ------------------------------------------------------------ round trip */

static void assert_keys_eq(const kvp_key_t *a, const kvp_key_t *b)
{
    assert_int_equal(a->len, b->len);
    assert_memory_equal(a->data, b->data, a->len);
}

static void assert_hello_eq(const kvp_msg_hello_t *a, const kvp_msg_hello_t *b)
{
    assert_int_equal(a->major, b->major);
    assert_int_equal(a->minor, b->minor);
    assert_string_equal(a->peer_id, b->peer_id);
    assert_string_equal(a->instance_id, b->instance_id);
    assert_memory_equal(a->epoch.b, b->epoch.b, KVP_WIRE_EPOCH_LEN);
    assert_int_equal(a->num_blocks, b->num_blocks);
    assert_int_equal(a->block_size, b->block_size);
    assert_int_equal(a->fingerprint, b->fingerprint);
    assert_int_equal(a->hash_seed, b->hash_seed);
    assert_memory_equal(a->nonce, b->nonce, KVP_WIRE_NONCE_LEN);
    assert_int_equal(a->flags, b->flags);
}

static void assert_lists_eq(const kvp_msg_t *a, const kvp_msg_t *b)
{
    switch (a->type) {
    case KVP_MSG_LOOKUP:
        assert_int_equal(a->u.lookup.request_id, b->u.lookup.request_id);
        assert_int_equal(a->u.lookup.round, b->u.lookup.round);
        assert_int_equal(a->u.lookup.n, b->u.lookup.n);
        for (uint32_t i = 0; i < a->u.lookup.n; i++)
            assert_keys_eq(&a->u.lookup.keys[i], &b->u.lookup.keys[i]);
        break;
    case KVP_MSG_LOOKUP_RESP:
        assert_int_equal(a->u.lookup_resp.request_id, b->u.lookup_resp.request_id);
        assert_int_equal(a->u.lookup_resp.round, b->u.lookup_resp.round);
        assert_int_equal(a->u.lookup_resp.n, b->u.lookup_resp.n);
        assert_memory_equal(a->u.lookup_resp.results, b->u.lookup_resp.results, a->u.lookup_resp.n);
        break;
    case KVP_MSG_FETCH:
        assert_int_equal(a->u.fetch.request_id, b->u.fetch.request_id);
        assert_int_equal(a->u.fetch.round, b->u.fetch.round);
        assert_int_equal(a->u.fetch.flags, b->u.fetch.flags);
        assert_int_equal(a->u.fetch.n, b->u.fetch.n);
        for (uint32_t i = 0; i < a->u.fetch.n; i++) {
            assert_keys_eq(&a->u.fetch.items[i].key, &b->u.fetch.items[i].key);
            assert_int_equal(a->u.fetch.items[i].dst_slot, b->u.fetch.items[i].dst_slot);
            assert_int_equal(a->u.fetch.items[i].dst_gen, b->u.fetch.items[i].dst_gen);
        }
        break;
    case KVP_MSG_FETCH_DONE:
        assert_int_equal(a->u.fetch_done.request_id, b->u.fetch_done.request_id);
        assert_int_equal(a->u.fetch_done.round, b->u.fetch_done.round);
        assert_int_equal(a->u.fetch_done.status, b->u.fetch_done.status);
        assert_int_equal(a->u.fetch_done.n, b->u.fetch_done.n);
        for (uint32_t i = 0; i < a->u.fetch_done.n; i++) {
            assert_int_equal(a->u.fetch_done.blocks[i].ok, b->u.fetch_done.blocks[i].ok);
            assert_int_equal(a->u.fetch_done.blocks[i].digest.lo, b->u.fetch_done.blocks[i].digest.lo);
            assert_int_equal(a->u.fetch_done.blocks[i].digest.hi, b->u.fetch_done.blocks[i].digest.hi);
        }
        break;
    }
}

/* Field-by-field comparison (independent of kvp_wire_msg_eq). */
static void assert_msg_fields_eq(const kvp_msg_t *a, const kvp_msg_t *b)
{
    assert_int_equal(a->type, b->type);
    assert_int_equal(a->flags, b->flags);
    assert_memory_equal(a->src_epoch.b, b->src_epoch.b, KVP_WIRE_EPOCH_LEN);
    assert_memory_equal(a->dst_epoch.b, b->dst_epoch.b, KVP_WIRE_EPOCH_LEN);
    switch (a->type) {
    case KVP_MSG_HELLO: assert_hello_eq(&a->u.hello, &b->u.hello); break;
    case KVP_MSG_AUTH: assert_memory_equal(a->u.auth.mac, b->u.auth.mac, KVP_WIRE_MAC_LEN); break;
    case KVP_MSG_HELLO_ACK:
        assert_memory_equal(a->u.hello_ack.acked_epoch.b, b->u.hello_ack.acked_epoch.b,
                            KVP_WIRE_EPOCH_LEN);
        assert_int_equal(a->u.hello_ack.blob_len, b->u.hello_ack.blob_len);
        assert_memory_equal(a->u.hello_ack.blob, b->u.hello_ack.blob, a->u.hello_ack.blob_len);
        break;
    case KVP_MSG_PING:
    case KVP_MSG_PONG:
        assert_int_equal(a->u.ping.seq, b->u.ping.seq);
        assert_int_equal(a->u.ping.sent_ns, b->u.ping.sent_ns);
        break;
    case KVP_MSG_BYE:
        assert_int_equal(a->u.bye.reason, b->u.bye.reason);
        assert_string_equal(a->u.bye.compat, b->u.bye.compat);
        break;
    case KVP_MSG_ABORT:
    case KVP_MSG_ABORT_ACK:
        assert_int_equal(a->u.abort.request_id, b->u.abort.request_id);
        assert_int_equal(a->u.abort.round, b->u.abort.round);
        break;
    default: assert_lists_eq(a, b); break;
    }
    assert_true(kvp_wire_msg_eq(a, b));
}

static void roundtrip_one(kvp_wire_scratch_t *s, const kvp_msg_t *m)
{
    uint8_t buf[2048];
    size_t len = 0;
    char why[128] = "";
    kvp_msg_t out;
    size_t want = kvp_wire_encoded_size(m);
    assert_true(want > 0);
    assert_int_equal(kvp_wire_encode(m, buf, sizeof(buf), &len), KVP_OK);
    assert_int_equal(len, want); /* encoded_size is exact */
    assert_int_equal(kvp_wire_decode(&ctx_post, buf, len, s, &out, why, sizeof(why)), KVP_OK);
    assert_msg_fields_eq(m, &out);
}

static void test_roundtrip_every_type(void **state)
{
    for (size_t i = 0; i < KVP_ARRAY_SIZE(wt_all_types); i++) {
        wt_sample_t s;
        wt_sample(&s, wt_all_types[i]);
        roundtrip_one(*state, &s.m);
    }
}

static void test_roundtrip_handshake_types_before_handshake(void **state)
{
    const kvp_wire_ctx_t pre = {.handshake_done = false, .peer_num_blocks = 0};
    uint16_t types[] = {KVP_MSG_HELLO, KVP_MSG_AUTH, KVP_MSG_HELLO_ACK, KVP_MSG_BYE};
    for (size_t i = 0; i < KVP_ARRAY_SIZE(types); i++) {
        wt_sample_t s;
        uint8_t buf[512];
        size_t len;
        kvp_msg_t out;
        wt_sample(&s, types[i]);
        assert_int_equal(kvp_wire_encode(&s.m, buf, sizeof(buf), &len), KVP_OK);
        assert_int_equal(kvp_wire_decode(&pre, buf, len, *state, &out, NULL, 0), KVP_OK);
        assert_msg_fields_eq(&s.m, &out);
    }
}

/* Edge values: empty lists (the terminal FETCH), empty blob, max-length
 * strings, all-ones integers. */
static void test_roundtrip_edges(void **state)
{
    wt_sample_t s;
    uint16_t list_types[] = {KVP_MSG_LOOKUP, KVP_MSG_LOOKUP_RESP, KVP_MSG_FETCH,
                             KVP_MSG_FETCH_DONE};
    for (size_t i = 0; i < KVP_ARRAY_SIZE(list_types); i++) {
        wt_sample(&s, list_types[i]);
        switch (list_types[i]) {
        case KVP_MSG_LOOKUP: s.m.u.lookup.n = 0; break;
        case KVP_MSG_LOOKUP_RESP: s.m.u.lookup_resp.n = 0; break;
        case KVP_MSG_FETCH: s.m.u.fetch.n = 0; break;
        case KVP_MSG_FETCH_DONE: s.m.u.fetch_done.n = 0; break;
        }
        roundtrip_one(*state, &s.m);
    }
    wt_sample(&s, KVP_MSG_HELLO_ACK);
    s.m.u.hello_ack.blob = NULL;
    s.m.u.hello_ack.blob_len = 0;
    roundtrip_one(*state, &s.m);
    wt_sample(&s, KVP_MSG_HELLO);
    memset(s.m.u.hello.peer_id, 'p', KVP_WIRE_STR_MAX);
    s.m.u.hello.peer_id[KVP_WIRE_STR_MAX] = '\0';
    memset(s.m.u.hello.instance_id, 'i', KVP_WIRE_STR_MAX);
    s.m.u.hello.instance_id[KVP_WIRE_STR_MAX] = '\0';
    s.m.u.hello.fingerprint = UINT64_MAX;
    s.m.u.hello.num_blocks = UINT32_MAX;
    roundtrip_one(*state, &s.m);
    wt_sample(&s, KVP_MSG_FETCH_DONE);
    s.m.u.fetch_done.status = INT32_MIN;
    s.m.flags = 0xFFFF;
    roundtrip_one(*state, &s.m);
}

/* Issue 19: the LOOKUP modes travel in the header flags (PREFIX on LOOKUP
 * and echoed on LOOKUP_RESP; RENEW with no keys), the router hint in the
 * FETCH flags; each survives encode -> decode bit for bit, at the header
 * bytes 6..7 (little-endian) where older peers ignore it. */
static void test_roundtrip_lookup_modes_and_hint(void **state)
{
    uint16_t modes[] = {KVP_LOOKUP_F_PREFIX, KVP_LOOKUP_F_RENEW,
                        KVP_LOOKUP_F_PREFIX | KVP_LOOKUP_F_RENEW};
    for (size_t i = 0; i < KVP_ARRAY_SIZE(modes); i++) {
        wt_sample_t s;
        uint8_t buf[2048];
        size_t len = 0;
        wt_sample(&s, KVP_MSG_LOOKUP);
        s.m.flags = modes[i];
        if (modes[i] & KVP_LOOKUP_F_RENEW)
            s.m.u.lookup.n = 0; /* a lease heartbeat carries no keys */
        roundtrip_one(*state, &s.m);
        assert_int_equal(kvp_wire_encode(&s.m, buf, sizeof(buf), &len), KVP_OK);
        assert_int_equal(buf[6] | buf[7] << 8, modes[i]);
        wt_sample(&s, KVP_MSG_LOOKUP_RESP);
        s.m.flags = modes[i];
        roundtrip_one(*state, &s.m);
    }
    wt_sample_t f;
    kvp_msg_t out;
    uint8_t buf[2048];
    size_t len = 0;
    wt_sample(&f, KVP_MSG_FETCH);
    f.m.u.fetch.flags = KVP_FETCH_HINT;
    roundtrip_one(*state, &f.m);
    assert_int_equal(kvp_wire_encode(&f.m, buf, sizeof(buf), &len), KVP_OK);
    assert_int_equal(kvp_wire_decode(&ctx_post, buf, len, *state, &out, NULL, 0), KVP_OK);
    assert_int_equal(out.u.fetch.flags, KVP_FETCH_HINT);
}

/* The largest lists: LIST_MAX keys of KEY_MAX bytes. */
static void test_roundtrip_list_max(void **state)
{
    uint32_t n = KVP_WIRE_LIST_MAX;
    static uint8_t keybytes[KVP_WIRE_KEY_MAX];
    kvp_fetch_item_t *items = calloc(n, sizeof(*items));
    assert_non_null(items);
    memset(keybytes, 0x5A, sizeof(keybytes));
    for (uint32_t i = 0; i < n; i++)
        items[i] = (kvp_fetch_item_t){{keybytes, KVP_WIRE_KEY_MAX}, i % 4096, i};
    wt_sample_t s;
    wt_sample(&s, KVP_MSG_FETCH);
    s.m.u.fetch.n = n;
    s.m.u.fetch.items = items;
    size_t want = kvp_wire_encoded_size(&s.m);
    assert_int_equal(want, 8 + 32 + 24 + (size_t)n * (1 + KVP_WIRE_KEY_MAX + 8));
    uint8_t *buf = malloc(want);
    size_t len;
    kvp_msg_t out;
    assert_int_equal(kvp_wire_encode(&s.m, buf, want, &len), KVP_OK);
    assert_int_equal(kvp_wire_decode(&ctx_post, buf, len, *state, &out, NULL, 0), KVP_OK);
    assert_true(kvp_wire_msg_eq(&s.m, &out));
    free(buf);
    free(items);
}

/* ------------------------------------------------------------ encoder */

static void expect_encode_invalid(const kvp_msg_t *m)
{
    uint8_t buf[1024];
    size_t len = 12345;
    assert_int_equal(kvp_wire_encode(m, buf, sizeof(buf), &len), KVP_ERR_INVALID);
    assert_int_equal(len, 12345); /* out-param untouched on error */
    assert_int_equal(kvp_wire_encoded_size(m), 0);
}

static void test_encode_rejects_bad_keys(void **state)
{
    wt_sample_t s;
    wt_sample(&s, KVP_MSG_LOOKUP);
    s.keys[2].len = 0;
    expect_encode_invalid(&s.m);
    s.keys[2].len = KVP_WIRE_KEY_MAX + 1;
    expect_encode_invalid(&s.m);
    wt_sample(&s, KVP_MSG_FETCH);
    s.items[1].key.len = 0;
    expect_encode_invalid(&s.m);
    s.items[1].key.len = KVP_WIRE_KEY_MAX + 1;
    expect_encode_invalid(&s.m);
    wt_sample(&s, KVP_MSG_LOOKUP);
    s.m.u.lookup.keys = NULL;
    expect_encode_invalid(&s.m);
}

static void test_encode_rejects_long_lists(void **state)
{
    wt_sample_t s;
    wt_sample(&s, KVP_MSG_LOOKUP);
    s.m.u.lookup.n = KVP_WIRE_LIST_MAX + 1; /* n is checked before the array is read */
    expect_encode_invalid(&s.m);
    wt_sample(&s, KVP_MSG_LOOKUP_RESP);
    s.m.u.lookup_resp.n = KVP_WIRE_LIST_MAX + 1;
    expect_encode_invalid(&s.m);
    wt_sample(&s, KVP_MSG_FETCH);
    s.m.u.fetch.n = KVP_WIRE_LIST_MAX + 1;
    expect_encode_invalid(&s.m);
    wt_sample(&s, KVP_MSG_FETCH_DONE);
    s.m.u.fetch_done.n = KVP_WIRE_LIST_MAX + 1;
    expect_encode_invalid(&s.m);
}

static void test_encode_rejects_bad_strings(void **state)
{
    wt_sample_t s;
    wt_sample(&s, KVP_MSG_HELLO);
    s.m.u.hello.peer_id[0] = '\0';
    expect_encode_invalid(&s.m);
    wt_sample(&s, KVP_MSG_HELLO);
    s.m.u.hello.instance_id[0] = '\0';
    expect_encode_invalid(&s.m);
    wt_sample(&s, KVP_MSG_HELLO); /* 256 bytes, no terminator: over 255 */
    memset(s.m.u.hello.peer_id, 'x', sizeof(s.m.u.hello.peer_id));
    expect_encode_invalid(&s.m);
}

static void test_encode_rejects_bad_epochs_and_version(void **state)
{
    wt_sample_t s;
    wt_sample(&s, KVP_MSG_PING);
    memset(&s.m.src_epoch, 0, sizeof(s.m.src_epoch));
    expect_encode_invalid(&s.m);
    wt_sample(&s, KVP_MSG_BYE);
    memset(&s.m.dst_epoch, 0, sizeof(s.m.dst_epoch));
    expect_encode_invalid(&s.m);
    wt_sample(&s, KVP_MSG_HELLO);
    memset(&s.m.u.hello.epoch, 0, sizeof(s.m.u.hello.epoch));
    expect_encode_invalid(&s.m);
    wt_sample(&s, KVP_MSG_HELLO);
    s.m.u.hello.major = KVP_WIRE_MAJOR + 1;
    expect_encode_invalid(&s.m);
    wt_sample(&s, KVP_MSG_HELLO_ACK);
    memset(&s.m.u.hello_ack.acked_epoch, 0, KVP_WIRE_EPOCH_LEN);
    expect_encode_invalid(&s.m);
}

static void test_encode_rejects_bad_values(void **state)
{
    wt_sample_t s;
    wt_sample(&s, KVP_MSG_HELLO_ACK);
    s.m.u.hello_ack.blob_len = KVP_WIRE_BLOB_MAX + 1;
    expect_encode_invalid(&s.m);
    wt_sample(&s, KVP_MSG_LOOKUP_RESP);
    s.results[1] = 2;
    expect_encode_invalid(&s.m);
    wt_sample(&s, KVP_MSG_FETCH_DONE);
    s.blocks[0].ok = 2;
    expect_encode_invalid(&s.m);
    wt_sample(&s, KVP_MSG_FETCH_DONE);
    s.m.u.fetch_done.status = 1;
    expect_encode_invalid(&s.m);
    wt_sample(&s, KVP_MSG_PING);
    s.m.type = 0;
    expect_encode_invalid(&s.m);
    s.m.type = 13;
    expect_encode_invalid(&s.m);
}

static void test_encode_nospace(void **state)
{
    for (size_t i = 0; i < KVP_ARRAY_SIZE(wt_all_types); i++) {
        wt_sample_t s;
        uint8_t buf[1024];
        size_t len = 777;
        wt_sample(&s, wt_all_types[i]);
        size_t need = kvp_wire_encoded_size(&s.m);
        assert_int_equal(kvp_wire_encode(&s.m, buf, need - 1, &len), KVP_ERR_NOSPACE);
        assert_int_equal(kvp_wire_encode(&s.m, NULL, 0, &len), KVP_ERR_NOSPACE);
        assert_int_equal(len, 777);
        assert_int_equal(kvp_wire_encode(&s.m, buf, need, &len), KVP_OK);
        assert_int_equal(len, need);
    }
}

/* ------------------------------------------------------------ resumable */

/* A stream of every sample type (plus, if `big`, a 1024-key LOOKUP),
 * concatenated. Every-split runs on the small stream: splits x stream size
 * would otherwise dominate the suite under valgrind. */
typedef struct stream {
    uint8_t buf[64 * 1024];
    size_t len;
    kvp_msg_t expect[KVP_ARRAY_SIZE(wt_all_types) + 1];
    size_t n;
} stream_t;

static wt_sample_t stream_samples[KVP_ARRAY_SIZE(wt_all_types)];
static kvp_key_t big_keys[1024];
static uint8_t big_keybytes[1024][32];

static void stream_build(stream_t *st, bool big)
{
    st->len = st->n = 0;
    for (size_t i = 0; i < KVP_ARRAY_SIZE(wt_all_types); i++) {
        wt_sample(&stream_samples[i], wt_all_types[i]);
        st->expect[st->n++] = stream_samples[i].m;
    }
    for (int i = 0; i < 1024; i++) {
        memset(big_keybytes[i], i & 0xFF, 32);
        big_keybytes[i][0] = (uint8_t)(i >> 8);
        big_keys[i] = (kvp_key_t){big_keybytes[i], 32};
    }
    if (big) {
        kvp_msg_t m = stream_samples[6].m; /* the LOOKUP sample's epochs */
        m.u.lookup.n = 1024;
        m.u.lookup.keys = big_keys;
        st->expect[st->n++] = m;
    }
    for (size_t i = 0; i < st->n; i++) {
        size_t len;
        assert_int_equal(kvp_wire_encode(&st->expect[i], st->buf + st->len,
                                         sizeof(st->buf) - st->len, &len),
                         KVP_OK);
        st->len += len;
    }
}

/* An accumulating reader: bytes arrive in chunks; after each chunk it parses
 * as many whole frames as it holds. Returns the number of frames checked. */
static size_t reader_feed(kvp_wire_scratch_t *s, const stream_t *st, uint8_t *acc, size_t *acc_len,
                          const uint8_t *chunk, size_t chunk_len, size_t next)
{
    memcpy(acc + *acc_len, chunk, chunk_len);
    *acc_len += chunk_len;
    size_t off = 0;
    for (;;) {
        kvp_frame_hdr_t hdr;
        kvp_status_t rc = kvp_wire_parse_hdr(&ctx_post, acc + off, *acc_len - off, &hdr);
        if (rc == KVP_ERR_TRUNCATED)
            break;
        assert_int_equal(rc, KVP_OK);
        if (*acc_len - off < hdr.length + KVP_WIRE_HDR_LEN)
            break;
        kvp_msg_t m;
        char why[128] = "";
        rc = kvp_wire_decode(&ctx_post, acc + off, hdr.length + KVP_WIRE_HDR_LEN, s, &m, why,
                             sizeof(why));
        if (rc != KVP_OK)
            fail_msg("frame %zu: %s", next, why);
        assert_true(next < st->n);
        assert_true(kvp_wire_msg_eq(&st->expect[next], &m));
        next++;
        off += hdr.length + KVP_WIRE_HDR_LEN;
    }
    memmove(acc, acc + off, *acc_len - off);
    *acc_len -= off;
    return next;
}

static void test_resumable_every_split(void **state)
{
    static stream_t st;
    static uint8_t acc[sizeof(st.buf)];
    stream_build(&st, false);
    for (size_t split = 0; split <= st.len; split++) {
        size_t acc_len = 0, next = 0;
        next = reader_feed(*state, &st, acc, &acc_len, st.buf, split, next);
        next = reader_feed(*state, &st, acc, &acc_len, st.buf + split, st.len - split, next);
        assert_int_equal(next, st.n);
        assert_int_equal(acc_len, 0);
    }
}

static void test_resumable_byte_at_a_time(void **state)
{
    static stream_t st;
    static uint8_t acc[sizeof(st.buf)];
    stream_build(&st, true);
    size_t acc_len = 0, next = 0;
    for (size_t i = 0; i < st.len; i++)
        next = reader_feed(*state, &st, acc, &acc_len, st.buf + i, 1, next);
    assert_int_equal(next, st.n);
    assert_int_equal(acc_len, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_type_names),
        cmocka_unit_test(test_bye_reasons),
        cmocka_unit_test(test_epochs),
        cmocka_unit_test(test_scratch_alloc_failure),
        cmocka_unit_test_setup_teardown(test_roundtrip_every_type, setup, teardown),
        cmocka_unit_test_setup_teardown(test_roundtrip_handshake_types_before_handshake, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_roundtrip_edges, setup, teardown),
        cmocka_unit_test_setup_teardown(test_roundtrip_list_max, setup, teardown),
        cmocka_unit_test_setup_teardown(test_roundtrip_lookup_modes_and_hint, setup, teardown),
        cmocka_unit_test(test_encode_rejects_bad_keys),
        cmocka_unit_test(test_encode_rejects_long_lists),
        cmocka_unit_test(test_encode_rejects_bad_strings),
        cmocka_unit_test(test_encode_rejects_bad_epochs_and_version),
        cmocka_unit_test(test_encode_rejects_bad_values),
        cmocka_unit_test(test_encode_nospace),
        cmocka_unit_test_setup_teardown(test_resumable_every_split, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resumable_byte_at_a_time, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
