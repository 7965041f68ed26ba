/*
 * test_ucx_version.c -- this build loads the UCX it was built against, and
 * says so at start-up (issue 30: a second build against UCX 1.22 from PyPI
 * beside Debian's 1.13, found through PKG_CONFIG_PATH, loaded through the
 * binaries' RUNPATH); and the UCX differences kvpeer bridges that the other
 * transport tests do not show: put emulation off, the native tcp put not
 * offered (both skipped on a UCX without the emulation switch).
 *
 * Mutation tried here (makes test_loaded_is_the_build_ucx fail): the 1.22 build's
 * binary run with LD_LIBRARY_PATH=/lib/x86_64-linux-gnu, i.e. Debian's
 * libucp 1.13 picked instead of the wheel's (what a missing RUNPATH does).
 */
#include "testutil.h"
#include "transport/ucx_int.h"
#include "ucx_testlib.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* The library's major.minor are the headers' (UCX keeps its ABI within a
 * minor series only forward: ucp_init merely warns on a mismatch). */
static void test_loaded_is_the_build_ucx(void **state)
{
    unsigned major = 0, minor = 0, release = 0;
    char line[512];

    ucp_get_version(&major, &minor, &release);
    printf("# %s\n", (kvp__ucx_version_describe(line, sizeof(line)), line));
    assert_int_equal(major, UCP_API_MAJOR);
    assert_int_equal(minor, UCP_API_MINOR);
    assert_true(kvp__ucx_version_describe(line, sizeof(line)));
    assert_non_null(strstr(line, "libucp"));
}

/* Creating a transport logs the loaded version once, at INFO. */
typedef struct seen {
    char want[64];
    int info, other;
} seen_t;

static void version_sink(kvp_log_level_t level, const char *prefix, const char *line, void *arg)
{
    seen_t *s = arg;

    if (strncmp(line, s->want, strlen(s->want)) == 0) {
        if (level == KVP_LOG_INFO && strstr(line, "libucp") != NULL)
            s->info++;
        else
            s->other++;
    }
}

static void test_start_up_line(void **state)
{
    unsigned major = 0, minor = 0, release = 0;
    seen_t seen = {.info = 0};

    ucp_get_version(&major, &minor, &release);
    snprintf(seen.want, sizeof(seen.want), "UCX %u.%u.%u loaded from ", major, minor, release);
    int level = kvp__log_level;
    kvp_log_set_level(KVP_LOG_INFO); /* a library logs WARN and up by default */
    kvp_log_set_sink(version_sink, &seen);
    kvp_xport_t *x = ut_xport_new("", "ver");
    kvp_log_set_sink(NULL, NULL);
    kvp_log_set_level((kvp_log_level_t)level);
    assert_non_null(x);
    assert_int_equal(x->ops->close(x, false), KVP_OK);
    assert_int_equal(seen.info, 1);
    assert_int_equal(seen.other, 0);
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* ---------------------------------------------- put emulation (UCX >= 1.21)
 *
 * A sender configured as kvpeer configures UCX (kvp_ucx_config_each) puts
 * into registered caller memory of a same-host kvpeer transport: a path on
 * which UCX has no native put for that memory, so it would emulate it. With
 * the emulation switch that kvpeer sets where UCX has it, the put fails and
 * the memory stays as it was; with emulation left on (the operator's
 * UCX_PROTO_EMULATION_ENABLE=y), the same put lands -- the harness sees a
 * landing when there is one. Skipped on a UCX without the switch (1.13).
 *
 * Mutation tried: kv[6] of ucx_config_keys (ucx_setup.c) left NULL -> the
 * put lands in test_put_never_emulated. */
#define EM_NB 4u
#define EM_BS 4096u

typedef struct raw {
    ucp_context_h ctx;
    ucp_worker_h w;
    ucp_ep_h ep;
    ucp_rkey_h rkey;
    ucp_mem_h own_mh; /* foreign: the memory its own rkey was packed from */
} raw_t;

static void raw_set(const char *k, const char *v, void *arg)
{
    assert_int_equal(kvp__ucx_config_modify(arg, k, v), UCS_OK);
}

static void raw_done(void *req, ucs_status_t status, void *user_data)
{
    *(ucs_status_t *)user_data = status;
}

/* Put one block of 0x5A at the start of the target's region and flush;
 * returns the first failure (or UCS_OK), progressing both sides. */
static ucs_status_t raw_put(raw_t *r, kvp_xport_t *t, uint64_t dst)
{
    static uint8_t src[EM_BS];
    ucs_status_t put_st = UCS_INPROGRESS, flush_st = UCS_INPROGRESS;
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK |
                                               UCP_OP_ATTR_FIELD_USER_DATA,
                               .cb.send = raw_done,
                               .user_data = &put_st};

    memset(src, 0x5A, sizeof(src));
    ucs_status_ptr_t sp = ucp_put_nbx(r->ep, src, sizeof(src), dst, r->rkey, &prm);
    if (UCS_PTR_IS_ERR(sp))
        return UCS_PTR_STATUS(sp);
    if (!UCS_PTR_IS_PTR(sp))
        put_st = UCS_OK;
    prm.user_data = &flush_st;
    ucs_status_ptr_t fp = ucp_ep_flush_nbx(r->ep, &prm);
    if (!UCS_PTR_IS_PTR(fp))
        flush_st = UCS_PTR_STATUS(fp);
    uint64_t end = ut_now_ns() + kvp_test_scaled_ns(5000000000ull);
    while ((put_st == UCS_INPROGRESS || flush_st == UCS_INPROGRESS) && ut_now_ns() < end) {
        ucp_worker_progress(r->w);
        t->ops->progress(t);
    }
    if (UCS_PTR_IS_PTR(sp))
        ucp_request_free(sp);
    if (UCS_PTR_IS_PTR(fp))
        ucp_request_free(fp);
    return put_st != UCS_OK ? put_st : flush_st;
}

/* foreign: a stock UCX over tcp that never emulates a put (it takes the
 * native tcp put or nothing), aimed at the node's AM worker (the only one on
 * tcp) with an rkey packed from its own memory (the region's rkey belongs to
 * the RMA context, which has no tcp; a tcp put ignores the rkey anyway);
 * else UCX configured exactly as kvpeer's, over shared memory only (no self,
 * no tcp), aimed at the RMA worker with the region's rkey. */
static void raw_open(raw_t *r, const kvp_ucx_blob_parts_t *bp, bool foreign)
{
    kvp_ucx_config_t cfg;
    ucp_config_t *c = NULL;

    kvp_ucx_config_default(&cfg);
    cfg.tls = "sysv,posix";
    assert_int_equal(ucp_config_read(NULL, NULL, &c), UCS_OK);
    if (foreign) {
        assert_int_equal(ucp_config_modify(c, "TLS", "tcp"), UCS_OK);
        assert_int_equal(ucp_config_modify(c, "PROTO_EMULATION_ENABLE", "n"), UCS_OK);
    } else {
        kvp_ucx_config_each(&cfg, raw_set, c);
    }
    ucp_params_t prm = {.field_mask = UCP_PARAM_FIELD_FEATURES, .features = UCP_FEATURE_RMA};
    assert_int_equal(ucp_init(&prm, c, &r->ctx), UCS_OK);
    ucp_config_release(c);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    assert_int_equal(ucp_worker_create(r->ctx, &wp, &r->w), UCS_OK);
    ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                          .address = foreign ? bp->worker_addr : bp->rma_worker_addr,
                          .err_mode = foreign ? UCP_ERR_HANDLING_MODE_NONE
                                              : UCP_ERR_HANDLING_MODE_PEER};
    assert_int_equal(ucp_ep_create(r->w, &ep, &r->ep), UCS_OK);
    r->own_mh = NULL;
    if (!foreign) {
        assert_int_equal(ucp_ep_rkey_unpack(r->ep, bp->rkey, &r->rkey), UCS_OK);
        return;
    }
    static uint8_t own[EM_BS] __attribute__((aligned(4096)));
    ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                             UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                               .address = own,
                               .length = sizeof(own)};
    void *pk;
    size_t pl;
    assert_int_equal(ucp_mem_map(r->ctx, &mp, &r->own_mh), UCS_OK);
    assert_int_equal(ucp_rkey_pack(r->ctx, r->own_mh, &pk, &pl), UCS_OK);
    assert_int_equal(ucp_ep_rkey_unpack(r->ep, pk, &r->rkey), UCS_OK);
    ucp_rkey_buffer_release(pk);
}

static void raw_close(raw_t *r)
{
    ucp_rkey_destroy(r->rkey);
    ucp_request_param_t prm = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                               .flags = UCP_EP_CLOSE_FLAG_FORCE};
    void *req = ucp_ep_close_nbx(r->ep, &prm);
    while (UCS_PTR_IS_PTR(req) && ucp_request_check_status(req) == UCS_INPROGRESS)
        ucp_worker_progress(r->w);
    if (UCS_PTR_IS_PTR(req))
        ucp_request_free(req);
    if (r->own_mh != NULL)
        ucp_mem_unmap(r->ctx, r->own_mh);
    ucp_worker_destroy(r->w);
    ucp_cleanup(r->ctx);
}

/* Returns how many bytes of the target's first block the put changed. */
static size_t put_into_caller_memory(ucs_status_t *st, const char *target_tls, bool foreign)
{
    static const kvp_layout_t layout = {EM_NB, EM_BS};
    size_t len = (size_t)EM_NB * EM_BS, changed = 0;
    uint8_t *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void *base = NULL;
    const void *blob = NULL;
    size_t blen = 0;
    kvp_ucx_blob_parts_t bp;
    raw_t r;

    assert_true(mem != MAP_FAILED);
    kvp_xport_t *t = ut_xport_new(target_tls, "target");
    assert_non_null(t);
    assert_int_equal(t->ops->register_region(t, mem, len, &layout, &base), KVP_OK);
    assert_int_equal(t->ops->local_blob(t, &blob, &blen), KVP_OK);
    assert_int_equal(kvp_ucx_blob_parse(blob, blen, &bp), KVP_OK);
    raw_open(&r, &bp, foreign);
    *st = raw_put(&r, t, bp.region_base);
    raw_close(&r);
    for (size_t i = 0; i < EM_BS; i++)
        changed += mem[i] != 0;
    assert_int_equal(t->ops->close(t, true), KVP_OK);
    munmap(mem, len);
    return changed;
}

static void test_put_never_emulated(void **state)
{
    ucs_status_t st = UCS_OK;

    if (!kvp__ucx_config_has("PROTO_EMULATION_ENABLE", "n")) {
        printf("# this UCX has no PROTO_EMULATION_ENABLE: skipped\n");
        skip();
    }
    unsetenv("UCX_PROTO_EMULATION_ENABLE");
    assert_int_equal(put_into_caller_memory(&st, "", false), 0);
    assert_int_not_equal(st, UCS_OK);
    printf("# emulated put refused: %s\n", ucs_status_string(st));
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void test_put_emulated_when_allowed(void **state)
{
    ucs_status_t st = UCS_ERR_NO_MESSAGE;

    if (!kvp__ucx_config_has("PROTO_EMULATION_ENABLE", "n"))
        skip();
    setenv("UCX_PROTO_EMULATION_ENABLE", "y", 1); /* the operator's choice stands */
    size_t changed = put_into_caller_memory(&st, "", false);
    unsetenv("UCX_PROTO_EMULATION_ENABLE");
    assert_int_equal(st, UCS_OK);
    assert_int_equal(changed, EM_BS);
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* ------------------------------------------------ the native tcp put (1.22)
 *
 * UCX 1.22 sends a put over tcp as a zero-copy put whenever the target's tcp
 * interface offers it, and libuct's tcp receiver writes its bytes to the
 * address in the request (and any hand-made PUT_REQ frame, 1.13 too): no
 * rkey, no region, no UCP feature checked (measured: 64 KiB from a foreign
 * worker into a context with only UCP_FEATURE_AM). kvpeer first stopped
 * offering it (TCP_PUT_ENABLE=n); since issue 27's last door neither of its
 * UCX contexts has tcp at all (its own stream carries data between hosts,
 * src/transport/tcpd.h). So a foreign worker limited to tcp cannot even make
 * an endpoint to either worker of a node, whatever UCX_TCP_PUT_ENABLE says.
 *
 * Mutation tried: tcp left in the AM context (ucx_rma_tls(tls, !rma, ...)
 * in ucx_setup.c given the configured list) -> the endpoint to the AM worker
 * is created and this test fails. */
static void foreign_tcp_unreachable(const char *put_enable)
{
    static const kvp_layout_t layout = {EM_NB, EM_BS};
    size_t len = (size_t)EM_NB * EM_BS;
    uint8_t *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void *base = NULL;
    const void *blob = NULL;
    size_t blen = 0;
    kvp_ucx_blob_parts_t bp;
    ucp_config_t *c = NULL;
    ucp_context_h ctx;
    ucp_worker_h w;

    assert_true(mem != MAP_FAILED);
    if (put_enable)
        setenv("UCX_TCP_PUT_ENABLE", put_enable, 1);
    else
        unsetenv("UCX_TCP_PUT_ENABLE");
    kvp_xport_t *t = ut_xport_new("", "target"); /* default transports */
    assert_non_null(t);
    assert_int_equal(t->ops->register_region(t, mem, len, &layout, &base), KVP_OK);
    assert_int_equal(t->ops->local_blob(t, &blob, &blen), KVP_OK);
    assert_int_equal(kvp_ucx_blob_parse(blob, blen, &bp), KVP_OK);
    assert_int_equal(ucp_config_read(NULL, NULL, &c), UCS_OK);
    assert_int_equal(ucp_config_modify(c, "TLS", "tcp"), UCS_OK);
    ucp_params_t prm = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM};
    assert_int_equal(ucp_init(&prm, c, &ctx), UCS_OK);
    ucp_config_release(c);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    assert_int_equal(ucp_worker_create(ctx, &wp, &w), UCS_OK);
    const void *addrs[2] = {bp.worker_addr, bp.rma_worker_addr};
    for (int i = 0; i < 2; i++) {
        ucp_ep_params_t ep = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                                            UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE,
                              .address = addrs[i],
                              .err_mode = UCP_ERR_HANDLING_MODE_NONE};
        ucp_ep_h e = NULL;
        ucs_status_t st = ucp_ep_create(w, &ep, &e);
        printf("# foreign tcp worker -> %s worker (UCX_TCP_PUT_ENABLE=%s): %s\n",
               i == 0 ? "AM" : "RMA", put_enable ? put_enable : "unset",
               ucs_status_string(st));
        assert_int_not_equal(st, UCS_OK);
    }
    ucp_worker_destroy(w);
    ucp_cleanup(ctx);
    unsetenv("UCX_TCP_PUT_ENABLE");
    for (size_t i = 0; i < EM_BS; i++)
        assert_int_equal(mem[i], 0);
    assert_int_equal(t->ops->close(t, true), KVP_OK);
    munmap(mem, len);
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void test_foreign_tcp_put_not_offered(void **state)
{
    (void)state;
    foreign_tcp_unreachable(NULL);
}

static void test_foreign_tcp_put_when_offered(void **state)
{
    (void)state;
    foreign_tcp_unreachable("y"); /* the operator's setting cannot open a tcp door */
}

int main(int argc, char **argv)
{
    (void)argc;
    ut_main_init(argv); /* TSan: UCX's memory hooks off (see ucx_testlib.c) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_loaded_is_the_build_ucx),
        cmocka_unit_test(test_start_up_line),
        cmocka_unit_test(test_put_never_emulated),
        cmocka_unit_test(test_put_emulated_when_allowed),
        cmocka_unit_test(test_foreign_tcp_put_not_offered),
        cmocka_unit_test(test_foreign_tcp_put_when_offered),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
