/* test_ctl_loop.c -- the event loop: timer ordering on a manual clock, fd
 * events, stopping an io from another io's callback, cross-thread wakeup,
 * and that the idle loop sleeps (no busy polling). */
#include "ctl_testlib.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/epoll.h>
#include <unistd.h>

typedef struct fired {
    const char *order[16];
    int n;
} fired_t;

typedef struct tt {
    kvp_timer_t t;
    fired_t *f;
    kvp_loop_t *loop;
    bool rearm;
} tt_t;

static void tt_cb(kvp_timer_t *t)
{
    tt_t *x = t->data;
    x->f->order[x->f->n++] = t->name;
    if (x->rearm) {
        x->rearm = false;
        kvp_timer_start(x->loop, t, kvp_loop_now(x->loop)); /* due now: must wait a round */
    }
}

static void test_timers_order(void **state)
{
    kvp_manual_clock_t mc;
    kvp_manual_clock_init(&mc, 1000);
    kvp_loop_t *loop;
    assert_int_equal(kvp_loop_create(&mc.clock, &loop), KVP_OK);
    fired_t f = {0};
    tt_t a = {.f = &f, .loop = loop}, b = {.f = &f, .loop = loop}, c = {.f = &f, .loop = loop},
         d = {.f = &f, .loop = loop};
    kvp_timer_init(&a.t, "a", tt_cb, &a);
    kvp_timer_init(&b.t, "b", tt_cb, &b);
    kvp_timer_init(&c.t, "c", tt_cb, &c);
    kvp_timer_init(&d.t, "d", tt_cb, &d);
    kvp_timer_start(loop, &c.t, 3000);
    kvp_timer_start(loop, &a.t, 2000);
    kvp_timer_start(loop, &b.t, 2000); /* same deadline as a: fires after a (armed later) */
    kvp_timer_start(loop, &d.t, 5000);
    kvp_timer_stop(loop, &d.t);
    assert_false(kvp_timer_active(&d.t));
    assert_int_equal(kvp_loop_next_deadline(loop), 2000);
    assert_int_equal(kvp_loop_run_once(loop, 0), 0); /* nothing due at 1000 */
    kvp_manual_clock_set(&mc, 2500);
    a.rearm = true;
    assert_int_equal(kvp_loop_run_once(loop, 0), 2);
    assert_int_equal(f.n, 2);
    assert_string_equal(f.order[0], "a");
    assert_string_equal(f.order[1], "b");
    assert_true(kvp_timer_active(&a.t)); /* re-armed at "now": not fired in the same round */
    kvp_manual_clock_set(&mc, 10000);
    assert_int_equal(kvp_loop_run_once(loop, 0), 2);
    assert_string_equal(f.order[2], "a"); /* re-armed at 2500 */
    assert_string_equal(f.order[3], "c"); /* 3000 */
    kvp_loop_destroy(loop);
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* Many timers with pseudo-random deadlines fire in deadline order. */
static void ord_cb(kvp_timer_t *t)
{
    uint64_t *last = t->data;
    assert_true(t->deadline_ns >= *last);
    *last = t->deadline_ns;
}

static void test_timers_heap(void **state)
{
    kvp_manual_clock_t mc;
    kvp_manual_clock_init(&mc, 0);
    kvp_loop_t *loop;
    assert_int_equal(kvp_loop_create(&mc.clock, &loop), KVP_OK);
    enum { N = 500 };
    static kvp_timer_t ts[N];
    uint64_t last = 0;
    kvp_rng_t r;
    kvp_rng_seed(&r, 7);
    for (int i = 0; i < N; i++) {
        kvp_timer_init(&ts[i], "t", ord_cb, &last);
        kvp_timer_start(loop, &ts[i], 1 + kvp_rng_below(&r, 100000));
    }
    for (int i = 0; i < N; i += 3)
        kvp_timer_stop(loop, &ts[i]);
    for (int i = 1; i < N; i += 7)
        kvp_timer_start(loop, &ts[i], 1 + kvp_rng_below(&r, 100000)); /* re-arm */
    int active = 0;
    for (int i = 0; i < N; i++)
        active += kvp_timer_active(&ts[i]);
    assert_true(active > N / 2);
    kvp_manual_clock_set(&mc, 200000);
    int fired = kvp_loop_run_once(loop, 0);
    assert_int_equal(fired, active);
    assert_int_equal(kvp_loop_next_deadline(loop), UINT64_MAX);
    kvp_loop_destroy(loop);
    KVP_TEST_ASSERT_NO_LEAKS();
}

typedef struct fdctx {
    kvp_loop_t *loop;
    kvp_io_t io[2];
    int fds[2][2];
    int hits[2];
} fdctx_t;

static void fd_cb(kvp_io_t *io, uint32_t events)
{
    fdctx_t *x = io->data;
    int i = io == &x->io[0] ? 0 : 1;
    char b[16];
    assert_true(events & EPOLLIN);
    assert_true(read(io->fd, b, sizeof(b)) > 0);
    x->hits[i]++;
    /* stopping the other io from this callback must forget its pending event */
    kvp_io_stop(x->loop, &x->io[1 - i]);
}

static void test_fd_events(void **state)
{
    kvp_manual_clock_t mc;
    kvp_manual_clock_init(&mc, 0);
    fdctx_t x;
    memset(&x, 0, sizeof(x));
    assert_int_equal(kvp_loop_create(&mc.clock, &x.loop), KVP_OK);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(pipe(x.fds[i]), 0);
        assert_int_equal(kvp_io_start(x.loop, &x.io[i], x.fds[i][0], EPOLLIN, fd_cb, &x), KVP_OK);
    }
    assert_int_equal(kvp_loop_run_once(x.loop, 0), 0);
    assert_int_equal(write(x.fds[0][1], "a", 1), 1);
    assert_int_equal(write(x.fds[1][1], "b", 1), 1);
    assert_int_equal(kvp_loop_run_once(x.loop, 100), 1); /* one ran, it stopped the other */
    assert_int_equal(x.hits[0] + x.hits[1], 1);
    for (int i = 0; i < 2; i++) {
        kvp_io_stop(x.loop, &x.io[i]);
        close(x.fds[i][0]);
        close(x.fds[i][1]);
    }
    kvp_loop_destroy(x.loop);
    KVP_TEST_ASSERT_NO_LEAKS();
}

static void wake_cb(void *arg)
{
    (*(int *)arg)++;
}

static void *waker(void *arg)
{
    usleep(20000);
    kvp_loop_wakeup(arg);
    return NULL;
}

/* A sleeping run_once(-1) returns on a wakeup from another thread; an idle
 * loop with a far deadline sleeps instead of spinning. */
static void test_wakeup_and_sleep(void **state)
{
    kvp_loop_t *loop;
    assert_int_equal(kvp_loop_create(NULL, &loop), KVP_OK);
    int woke = 0;
    kvp_loop_set_wakeup_cb(loop, wake_cb, &woke);
    kvp_timer_t far;
    kvp_timer_init(&far, "far", NULL, NULL);
    kvp_timer_start(loop, &far, kvp_loop_now(loop) + 60 * KVP_NSEC_PER_SEC);
    pthread_t th;
    uint64_t t0 = kvp_loop_now(loop);
    assert_int_equal(pthread_create(&th, NULL, waker, loop), 0);
    int iters = 0;
    while (!woke && iters < 1000) {
        kvp_loop_run_once(loop, -1);
        iters++;
    }
    pthread_join(th, NULL);
    assert_int_equal(woke, 1);
    assert_true(iters <= 3); /* slept: no busy polling */
    assert_true(kvp_loop_now(loop) - t0 >= 10 * KVP_NSEC_PER_MSEC);
    kvp_timer_stop(loop, &far);
    kvp_loop_destroy(loop);
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* Wait hooks (kvp_loop_set_wait_hooks): while the loop sleeps unlocked,
 * another thread holding the owner's lock may stop an io whose fd is already
 * readable and reuse its memory for another fd. The batch must not reach the
 * reused io (it is collected after the end hook): here the "other thread" is
 * the end hook itself, which runs after the pipe woke the sleeper. */
typedef struct reuse {
    kvp_loop_t *loop;
    kvp_io_t io;
    int old_pipe[2], new_pipe[2];
    int old_hits, new_hits, begins, ends;
} reuse_t;

static void reuse_old_cb(kvp_io_t *io, uint32_t events)
{
    (void)events;
    ((reuse_t *)io->data)->old_hits++;
}

static void reuse_new_cb(kvp_io_t *io, uint32_t events)
{
    (void)events;
    ((reuse_t *)io->data)->new_hits++;
}

static void reuse_begin(void *arg)
{
    ((reuse_t *)arg)->begins++;
}

static void reuse_end(void *arg)
{
    reuse_t *r = arg;
    if (r->ends++ == 0) {
        kvp_io_stop(r->loop, &r->io);
        assert_int_equal(kvp_io_start(r->loop, &r->io, r->new_pipe[0], EPOLLIN, reuse_new_cb, r),
                         KVP_OK);
    }
}

static void test_wait_hooks_stale_batch(void **state)
{
    reuse_t r;
    memset(&r, 0, sizeof(r));
    assert_int_equal(kvp_loop_create(NULL, &r.loop), KVP_OK);
    assert_int_equal(pipe(r.old_pipe), 0);
    assert_int_equal(pipe(r.new_pipe), 0);
    assert_int_equal(kvp_io_start(r.loop, &r.io, r.old_pipe[0], EPOLLIN, reuse_old_cb, &r), KVP_OK);
    assert_int_equal(kvp_loop_set_wait_hooks(r.loop, reuse_begin, reuse_end, &r), KVP_OK);
    assert_int_equal(write(r.old_pipe[1], "a", 1), 1);
    kvp_loop_run_once(r.loop, 100);
    assert_int_equal(r.begins, 1); /* it slept, so the hooks ran */
    assert_int_equal(r.ends, 1);
    assert_int_equal(r.old_hits, 0); /* stopped before dispatch */
    assert_int_equal(r.new_hits, 0); /* the stale event did not reach the reused io */
    kvp_loop_run_once(r.loop, 0);    /* no sleep: no hooks */
    assert_int_equal(r.begins, 1);
    assert_int_equal(write(r.new_pipe[1], "b", 1), 1);
    kvp_loop_run_once(r.loop, 100);
    assert_int_equal(r.new_hits, 1); /* the reused io works */
    kvp_io_stop(r.loop, &r.io);
    for (int i = 0; i < 2; i++) {
        close(r.old_pipe[i]);
        close(r.new_pipe[i]);
    }
    kvp_loop_destroy(r.loop);
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* Leading (kvp_loop_lead): the owner sleeps in run_once(-1) with hooks that
 * release its lock; another thread takes the lock and leads. An fd event the
 * leader's round consumes does not wake the owner; once the leader stops
 * leading, the next event does. */
typedef struct lead {
    kvp_loop_t *loop;
    pthread_mutex_t mu;
    kvp_io_t io;
    int pipe[2];
    atomic_int owner_rounds, hits;
    atomic_bool asleep, stop;
} lead_t;

static void lead_cb(kvp_io_t *io, uint32_t events)
{
    (void)events;
    lead_t *l = io->data;
    char c;
    assert_int_equal(read(l->pipe[0], &c, 1), 1);
    atomic_fetch_add(&l->hits, 1);
}

static void lead_begin(void *arg)
{
    lead_t *l = arg;
    atomic_store(&l->asleep, true);
    pthread_mutex_unlock(&l->mu);
}

static void lead_end(void *arg)
{
    lead_t *l = arg;
    pthread_mutex_lock(&l->mu);
    atomic_store(&l->asleep, false);
}

static void *lead_owner(void *arg)
{
    lead_t *l = arg;
    pthread_mutex_lock(&l->mu);
    while (!atomic_load(&l->stop)) {
        kvp_loop_run_once(l->loop, -1);
        atomic_fetch_add(&l->owner_rounds, 1);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

static bool lead_until(atomic_int *v, int want, double secs)
{
    for (double t = 0; t < secs * kvp_test_time_scale(); t += 0.001) {
        if (atomic_load(v) >= want)
            return true;
        usleep(1000);
    }
    return atomic_load(v) >= want;
}

static void test_lead_keeps_owner_asleep(void **state)
{
    (void)state;
    lead_t l;
    memset(&l, 0, sizeof(l));
    pthread_mutex_init(&l.mu, NULL);
    assert_int_equal(kvp_loop_create(NULL, &l.loop), KVP_OK);
    assert_int_equal(pipe(l.pipe), 0);
    assert_int_equal(kvp_io_start(l.loop, &l.io, l.pipe[0], EPOLLIN, lead_cb, &l), KVP_OK);
    assert_int_equal(kvp_loop_lead(l.loop, true), KVP_ERR_STATE); /* no sleeping owner */
    assert_int_equal(kvp_loop_set_wait_hooks(l.loop, lead_begin, lead_end, &l), KVP_OK);
    pthread_t owner;
    assert_int_equal(pthread_create(&owner, NULL, lead_owner, &l), 0);
    for (int i = 0; i < 5000 && !atomic_load(&l.asleep); i++)
        usleep(1000);
    assert_true(atomic_load(&l.asleep));
    usleep(20000); /* from the begin hook into epoll_wait */
    /* Lead: the leader's round takes the event; the owner is not woken. */
    pthread_mutex_lock(&l.mu);
    assert_int_equal(kvp_loop_lead(l.loop, true), KVP_OK);
    assert_int_equal(kvp_loop_lead(l.loop, true), KVP_ERR_STATE); /* led already */
    assert_int_equal(write(l.pipe[1], "a", 1), 1);
    usleep(50000); /* a woken owner would find the fd still ready (epoll re-checks) */
    assert_int_equal(kvp_loop_run_once(l.loop, 5000), 1);
    assert_int_equal(atomic_load(&l.hits), 1);
    assert_int_equal(kvp_loop_lead(l.loop, false), KVP_OK);
    pthread_mutex_unlock(&l.mu);
    usleep((useconds_t)(100000 * kvp_test_time_scale()));
    assert_int_equal(atomic_load(&l.owner_rounds), 0); /* slept through it */
    /* Leading over: the owner's fds wake it again. */
    assert_int_equal(write(l.pipe[1], "b", 1), 1);
    assert_true(lead_until(&l.hits, 2, 5));
    assert_true(lead_until(&l.owner_rounds, 1, 5));
    atomic_store(&l.stop, true);
    kvp_loop_wakeup(l.loop);
    pthread_join(owner, NULL);
    kvp_io_stop(l.loop, &l.io);
    close(l.pipe[0]);
    close(l.pipe[1]);
    kvp_loop_destroy(l.loop);
    pthread_mutex_destroy(&l.mu);
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* Input that arrives while a sleeper waits for its lock back (its outer
 * wait timed out: a leader had the lock and the outer entry off) is read in
 * that same round, and kvp_loop_polled() is not older than it. Here the end
 * hook writes the pipe, as a peer's frame landing during the lock wait.
 * Mutation: collect the batch only when the outer wait saw something. */
typedef struct late {
    int pipe[2];
    int hits;
    uint64_t written_ns;
} late_t;

static void late_cb(kvp_io_t *io, uint32_t events)
{
    (void)events;
    char c;
    late_t *lt = io->data;
    if (read(lt->pipe[0], &c, 1) == 1)
        lt->hits++;
}

static void late_begin(void *arg)
{
    (void)arg;
}

static void late_end(void *arg)
{
    late_t *lt = arg;
    assert_int_equal(write(lt->pipe[1], "x", 1), 1);
    lt->written_ns = kvp_clock_now(kvp_clock_real());
}

static void test_wait_hooks_input_during_lock_wait(void **state)
{
    kvp_loop_t *loop;
    assert_int_equal(kvp_loop_create(NULL, &loop), KVP_OK);
    late_t lt = {.hits = 0};
    assert_int_equal(pipe(lt.pipe), 0);
    kvp_io_t io;
    assert_int_equal(kvp_io_start(loop, &io, lt.pipe[0], EPOLLIN, late_cb, &lt), KVP_OK);
    assert_int_equal(kvp_loop_set_wait_hooks(loop, late_begin, late_end, &lt), KVP_OK);
    for (int round = 1; round <= 3; round++) {
        kvp_loop_run_once(loop, 1); /* the outer wait times out; the end hook writes */
        assert_int_equal(lt.hits, round);
        assert_true(kvp_loop_polled(loop) >= lt.written_ns); /* read up to after the write */
    }
    kvp_loop_set_wait_hooks(loop, NULL, NULL, NULL);
    kvp_io_stop(loop, &io);
    close(lt.pipe[0]);
    close(lt.pipe[1]);
    kvp_loop_destroy(loop);
    KVP_TEST_ASSERT_NO_LEAKS();
}

/* Real clock: run_once(-1) sleeps until the nearest deadline, and the loop fd
 * becomes readable when it passes (caller-driven embedding). */
static void hit_cb(kvp_timer_t *t)
{
    (*(int *)t->data)++;
}

static void test_deadline_wakes(void **state)
{
    kvp_loop_t *loop;
    assert_int_equal(kvp_loop_create(NULL, &loop), KVP_OK);
    int hits = 0;
    kvp_timer_t t;
    kvp_timer_init(&t, "soon", hit_cb, &hits);
    uint64_t t0 = kvp_loop_now(loop);
    kvp_timer_start(loop, &t, t0 + 30 * KVP_NSEC_PER_MSEC);
    int epfd = kvp_loop_fd(loop);
    int efd = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN};
    assert_int_equal(epoll_ctl(efd, EPOLL_CTL_ADD, epfd, &ev), 0);
    assert_int_equal(epoll_wait(efd, &ev, 1, 5000), 1); /* the loop fd woke us */
    assert_true(kvp_loop_now(loop) - t0 >= 29 * KVP_NSEC_PER_MSEC);
    int iters = 0;
    while (!hits && iters++ < 100)
        kvp_loop_run_once(loop, -1);
    assert_int_equal(hits, 1);
    close(efd);
    kvp_loop_destroy(loop);
    KVP_TEST_ASSERT_NO_LEAKS();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timers_order),   cmocka_unit_test(test_timers_heap),
        cmocka_unit_test(test_fd_events),      cmocka_unit_test(test_wakeup_and_sleep),
        cmocka_unit_test(test_deadline_wakes), cmocka_unit_test(test_wait_hooks_input_during_lock_wait), cmocka_unit_test(test_wait_hooks_stale_batch),
        cmocka_unit_test(test_lead_keeps_owner_asleep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
