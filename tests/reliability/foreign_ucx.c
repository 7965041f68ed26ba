/*
 * foreign_ucx.c -- a foreign UCX worker against a kvpeer node's data plane
 * (issue 27). Not a kvpeer node: its own ucp context with RMA and AM, no
 * session, no key. It is given the node's real address blob (stronger than
 * a real attacker, who would have to guess the worker address from the port
 * numbers) and tries, on the worker named by MODE:
 *   put   one block of 0x66 into slot 0 and slot 1 of the region (rkey from
 *         the blob on the RMA worker; on the AM worker one the attacker packs
 *         itself: software-emulated put ignores rkeys);
 *   get   64 KiB from the region base into a buffer filled with 0xEE;
 *         reports how many bytes changed (block data read back);
 *   oob   a put far outside the region and one into page 0 (what crashed
 *         kvpeerd with SIGSEGV in ucp_put_handler); AM worker only;
 *   am    kvpeer's own data AM id with a made-up header (no secret); AM
 *         worker only.
 * Usage: foreign_ucx BLOB_HEX am|rma [WAIT_MS]
 * Output, one line each: "connect ok|fail <status>", "rkey blob|own|fail",
 * "put <completed|timeout|error:...>", "get <...> <changed-bytes>",
 * "oob <...>", "am <...>", then "done". UCX_TLS from the environment picks
 * the attacker's transports. Exits without tearing UCX down (_exit): an
 * attacker leaves requests behind.
 */
#include "transport/ucx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#include "unhex.h"

static ucp_worker_h worker;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Wait for a request; "completed", "timeout" or "error:<status>". The
 * request is abandoned on timeout (never freed: UCX still owns it). */
static const char *wait_req(ucs_status_ptr_t r, unsigned ms)
{
    static char buf[96];
    if (r == NULL)
        return "completed";
    if (UCS_PTR_IS_ERR(r)) {
        snprintf(buf, sizeof(buf), "error:%s", ucs_status_string(UCS_PTR_STATUS(r)));
        return buf;
    }
    uint64_t end = now_ms() + ms;
    while (now_ms() < end) {
        ucp_worker_progress(worker);
        ucs_status_t s = ucp_request_check_status(r);
        if (s != UCS_INPROGRESS) {
            ucp_request_free(r);
            if (s == UCS_OK)
                return "completed";
            snprintf(buf, sizeof(buf), "error:%s", ucs_status_string(s));
            return buf;
        }
        usleep(100);
    }
    return "timeout";
}


static void err_cb(void *arg, ucp_ep_h ep, ucs_status_t st)
{
    (void)arg;
    (void)ep;
    printf("ep_error %s\n", ucs_status_string(st));
}

int main(int argc, char **argv)
{
    static uint8_t blob[KVP_UCX_BLOB_MAX];
    size_t blen = 0;
    kvp_ucx_blob_parts_t bp;
    ucp_context_h ctx;
    ucp_config_t *cfg;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 3 || unhex(argv[1], blob, sizeof(blob), &blen) != 0 ||
        kvp_ucx_blob_parse(blob, blen, &bp) != KVP_OK) {
        fprintf(stderr, "usage: %s BLOB_HEX am|rma [WAIT_MS]\n", argv[0]);
        return 2;
    }
    bool rma = strcmp(argv[2], "rma") == 0;
    unsigned wait_ms = argc > 3 ? (unsigned)atoi(argv[3]) : 1500;
    if (ucp_config_read(NULL, NULL, &cfg) != UCS_OK)
        return 3;
    ucp_params_t prm = {.field_mask = UCP_PARAM_FIELD_FEATURES,
                        .features = UCP_FEATURE_RMA | UCP_FEATURE_AM};
    if (ucp_init(&prm, cfg, &ctx) != UCS_OK)
        return 3;
    ucp_config_release(cfg);
    ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
                              .thread_mode = UCS_THREAD_MODE_SINGLE};
    if (ucp_worker_create(ctx, &wp, &worker) != UCS_OK)
        return 3;
    ucp_ep_h ep;
    ucp_ep_params_t ep_prm = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = rma ? bp.rma_worker_addr : bp.worker_addr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = err_cb, .arg = NULL},
    };
    /* On the RMA worker the strongest same-host attacker uses error mode
     * NONE: shared-memory lanes need no peer-failure support then. */
    if (rma)
        ep_prm.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    ucs_status_t s = ucp_ep_create(worker, &ep_prm, &ep);
    if (s != UCS_OK) {
        printf("connect fail %s\ndone\n", ucs_status_string(s));
        _exit(0);
    }
    printf("connect ok\n");
    /* the rkey: the blob's (stronger), else our own (rma_sw ignores it) */
    ucp_rkey_h rkey = NULL;
    static uint8_t own[4096] __attribute__((aligned(4096)));
    /* Only on the RMA worker: UCX 1.13 crashes in the attacker itself
     * (uct_rkey_release inside ucp_ep_rkey_unpack) unpacking the region's
     * shm rkey on an endpoint without that memory domain. */
    if (rma && ucp_ep_rkey_unpack(ep, bp.rkey, &rkey) == UCS_OK) {
        printf("rkey blob\n");
    } else {
        ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
                                                 UCP_MEM_MAP_PARAM_FIELD_LENGTH,
                                   .address = own,
                                   .length = sizeof(own)};
        ucp_mem_h mh;
        void *pk;
        size_t pl;
        if (ucp_mem_map(ctx, &mp, &mh) == UCS_OK && ucp_rkey_pack(ctx, mh, &pk, &pl) == UCS_OK &&
            ucp_ep_rkey_unpack(ep, pk, &rkey) == UCS_OK)
            printf("rkey own\n");
        else {
            printf("rkey fail\ndone\n");
            _exit(0);
        }
    }
    const size_t bs = bp.layout.block_size;
    uint8_t *buf = malloc(bs > 65536 ? bs : 65536);
    ucp_request_param_t rp = {.op_attr_mask = 0};

    /* put: slots 0 and 1 */
    memset(buf, 0x66, bs);
    const char *r1 = wait_req(ucp_put_nbx(ep, buf, bs, bp.region_base, rkey, &rp), wait_ms);
    char r1s[96];
    snprintf(r1s, sizeof(r1s), "%s", r1);
    const char *r2 = wait_req(ucp_put_nbx(ep, buf, bs, bp.region_base + bs, rkey, &rp), wait_ms);
    const char *rf = wait_req(ucp_ep_flush_nbx(ep, &rp), wait_ms);
    printf("put %s %s flush=%s\n", r1s, r2, rf);

    /* get: 64 KiB from the region base */
    size_t glen = 65536 < bp.region_len ? 65536 : (size_t)bp.region_len;
    memset(buf, 0xEE, glen);
    const char *rg = wait_req(ucp_get_nbx(ep, buf, glen, bp.region_base, rkey, &rp), wait_ms);
    size_t changed = 0;
    for (size_t i = 0; i < glen; i++)
        changed += buf[i] != 0xEE;
    printf("get %s %zu\n", rg, changed);

    if (rma) { /* a direct shm put outside the segment kills the PUTTER (UCX-NOTES §1) */
        printf("done\n");
        _exit(0);
    }
    /* out of the region: far past its end, and page 0 */
    memset(buf, 0x77, 4096);
    char ro[96];
    snprintf(ro, sizeof(ro), "%s",
             wait_req(ucp_put_nbx(ep, buf, 4096, bp.region_base + bp.region_len + (64u << 20),
                                  rkey, &rp),
                      wait_ms));
    const char *rz = wait_req(ucp_put_nbx(ep, buf, 4096, 0x10, rkey, &rp), wait_ms);
    printf("oob %s %s\n", ro, rz);

    /* kvpeer's data AM id with a header that lacks the node's secret */
    uint8_t hdr[40] = {0};
    uint32_t magic = 0x4d41564bu, len = 4096;
    memcpy(hdr, &magic, 4);
    memcpy(hdr + 16, &len, 4); /* slot 0, gen 0, off 0, len 4096 */
    ucp_request_param_t ap = {.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
                              .flags = UCP_AM_SEND_FLAG_EAGER};
    printf("am %s\n", wait_req(ucp_am_send_nbx(ep, 0x4b56u, hdr, sizeof(hdr), buf, 4096, &ap),
                               wait_ms));
    ucp_worker_progress(worker);
    printf("done\n");
    _exit(0);
}
