/* test_fake_threads.c -- transports of one fabric driven by different
 * threads (two nodes with their own owner threads): every fake call takes
 * the fabric's lock, so TSan sees no race in the fake's bookkeeping.
 * Mutation: drop the lock in fake_write/fake_progress -> TSan reports.
 * Run with UCX_MEM_EVENTS=no (set by CMakeLists.txt): libucm, linked through
 * kvpeer, hooks madvise, and under TSan that hook crashes at thread exit. */
#include "testutil.h"

#include "transport/fake.h"

#include <pthread.h>
#include <sched.h>

#define TBS 4096u
#define TNB 16u
#define ROUNDS 300

typedef struct side {
    kvp_xport_t *x;
    kvp_xpeer_id_t peer;
    unsigned char *region;
    uint64_t done, errors;
    kvp_status_t last_error;
} side_t;

static int g_finished;

/* No cmocka assertion off the main thread (it longjmps): count errors. */
static void *drive(void *arg)
{
    side_t *s = arg;
    kvp_xport_t *x = s->x;
    kvp_xfer_result_t r[4];
    size_t n;
    for (uint32_t i = 0; i < ROUNDS; i++) {
        kvp_xfer_block_t b = {i % TNB, 1, (i * 7) % TNB, 1};
        kvp_xfer_id_t id;
        kvp_status_t st = x->ops->write(x, s->peer, &b, 1, &id);
        if (st != KVP_OK) {
            s->errors++;
            s->last_error = st;
        }
        x->ops->progress(x);
        if (x->ops->poll(x, s->peer, r, 4, &n) == KVP_OK)
            s->done += n;
        else
            s->errors++;
    }
    for (int spin = 0; s->done < ROUNDS && spin < 1000; spin++) {
        x->ops->progress(x);
        if (x->ops->poll(x, s->peer, r, 4, &n) == KVP_OK)
            s->done += n;
        else
            s->errors++;
    }
    __atomic_add_fetch(&g_finished, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void test_two_owner_threads(void **state)
{
    kvp_manual_clock_t clk;
    kvp_manual_clock_init(&clk, 1);
    kvp_fake_fabric_t *fab;
    assert_int_equal(kvp_fake_fabric_create(&clk.clock, &fab), KVP_OK);
    side_t side[2] = {{0}};
    kvp_layout_t lay = {TNB, TBS};
    for (int i = 0; i < 2; i++) {
        kvp_fake_config_t fc = {.fabric = fab, .default_delay_ns = 0};
        assert_int_equal(kvp_fake_create(&fc, &side[i].x), KVP_OK);
        side[i].region = kvp__calloc(TNB, TBS);
        assert_non_null(side[i].region);
        assert_int_equal(
            side[i].x->ops->register_region(side[i].x, side[i].region, TNB * TBS, &lay, NULL),
            KVP_OK);
    }
    for (int i = 0; i < 2; i++) {
        const void *blob;
        size_t len;
        assert_int_equal(side[1 - i].x->ops->local_blob(side[1 - i].x, &blob, &len), KVP_OK);
        assert_int_equal(side[i].x->ops->add_peer(side[i].x, blob, len, &lay, &side[i].peer),
                         KVP_OK);
    }
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, drive, &side[i]), 0);
    /* a third thread (the simulator's view) progresses the whole fabric */
    while (__atomic_load_n(&g_finished, __ATOMIC_ACQUIRE) < 2) {
        (void)kvp_fake_fabric_progress(fab);
        (void)kvp_fake_fabric_next_event_ns(fab);
        sched_yield();
    }
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(side[i].last_error, KVP_OK);
        assert_int_equal(side[i].errors, 0);
        assert_int_equal(side[i].done, ROUNDS);
        kvp_fake_counters_t c;
        kvp_fake_get_counters(side[i].x, &c);
        assert_int_equal(c.blocks_landed, ROUNDS);
    }
    assert_int_equal(kvp_fake_violations(fab, NULL), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(side[i].x->ops->close(side[i].x, false), KVP_OK);
    assert_int_equal(kvp_fake_fabric_destroy(fab), KVP_OK);
    for (int i = 0; i < 2; i++)
        kvp__free(side[i].region);
    KVP_TEST_ASSERT_NO_LEAKS();
}

static const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_two_owner_threads),
};

int main(void)
{
    return cmocka_run_group_tests(tests, NULL, NULL);
}
