/* loop.c -- the event loop: epoll for fds, one min-heap for named deadlines,
 * an eventfd for cross-thread wakeups, and a timerfd so that the epoll fd
 * itself becomes readable when the nearest deadline passes (caller-driven
 * mode: an embedding that polls kvp_loop_fd() must also wake for timers).
 *
 * Ownership: the loop owns its epoll fd, eventfd, timerfd, the event array
 * and the heap array (pointers to timers embedded in their owners' structs;
 * the loop never frees a timer or an io).
 *
 * Sleeping owner, leading caller (kvp_loop_set_wait_hooks, kvp_loop_lead):
 * an owner thread that releases its lock while it sleeps does not sleep on
 * the epoll fd itself but on an outer epoll fd holding only it, and collects
 * the batch after it has taken its lock back. A thread that took the lock
 * meanwhile may "lead": switch the outer entry off (the sleeping owner is
 * then woken by nothing here) and run rounds on the epoll fd itself, so that
 * the frame it waits for wakes it and nobody else. Two threads never wait on
 * the same epoll fd (the kernel would wake the first, the owner).
 *
 * Why timers carry a sequence number: equal deadlines fire in the order they
 * were armed, so runs on a manual clock are deterministic, and a timer
 * re-armed from inside the timer phase at a deadline already due does not fire
 * again in the same phase (no livelock). */
#include "ctl/ctl.h"

#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#define LOOP_MAX_EVENTS 64

struct kvp_loop {
    const kvp_clock_t *clock;
    bool real_clock;
    int epfd, evfd, tfd;
    kvp_io_t wake_io, timer_io;
    uint64_t tfd_armed; /* deadline the timerfd is armed at; UINT64_MAX = disarmed */
    kvp_timer_t **heap;
    uint32_t heap_len, heap_cap;
    uint64_t next_seq;
    struct epoll_event events[LOOP_MAX_EVENTS];
    int nevents, cur_event; /* the batch being dispatched (io_stop clears later entries) */
    void (*wakeup_cb)(void *arg);
    void *wakeup_arg;
    /* For the epoll-free round (kvp_loop_run_once): fds other than our own
     * eventfd and timerfd, and a wakeup that may be unread. */
    uint32_t n_user_io;
    atomic_bool wake_pending;
    /* kvp_loop_set_wait_hooks: released around a sleeping epoll_wait on
     * ofd (an epoll fd over epfd alone); `leading`: a thread holding the
     * owner's lock runs the rounds and ofd's entry is off (kvp_loop_lead). */
    void (*wait_begin)(void *arg), (*wait_end)(void *arg);
    void *wait_arg;
    int ofd;
    bool leading;
    uint64_t polled_ns; /* kvp_loop_polled */
};

/* ------------------------------------------------------------------ heap */

static bool timer_before(const kvp_timer_t *a, const kvp_timer_t *b)
{
    if (a->deadline_ns != b->deadline_ns)
        return a->deadline_ns < b->deadline_ns;
    return a->seq < b->seq;
}

static void heap_set(kvp_loop_t *l, uint32_t i, kvp_timer_t *t)
{
    l->heap[i] = t;
    t->heap_index = i;
}

static void heap_up(kvp_loop_t *l, uint32_t i)
{
    kvp_timer_t *t = l->heap[i];
    while (i > 0) {
        uint32_t parent = (i - 1) / 2;
        if (!timer_before(t, l->heap[parent]))
            break;
        heap_set(l, i, l->heap[parent]);
        i = parent;
    }
    heap_set(l, i, t);
}

static void heap_down(kvp_loop_t *l, uint32_t i)
{
    kvp_timer_t *t = l->heap[i];
    for (;;) {
        uint32_t c = 2 * i + 1;
        if (c >= l->heap_len)
            break;
        if (c + 1 < l->heap_len && timer_before(l->heap[c + 1], l->heap[c]))
            c++;
        if (!timer_before(l->heap[c], t))
            break;
        heap_set(l, i, l->heap[c]);
        i = c;
    }
    heap_set(l, i, t);
}

static void heap_remove(kvp_loop_t *l, kvp_timer_t *t)
{
    uint32_t i = t->heap_index;
    KVP_ASSERT(i < l->heap_len && l->heap[i] == t);
    t->heap_index = UINT32_MAX;
    kvp_timer_t *last = l->heap[--l->heap_len];
    if (last == t)
        return;
    heap_set(l, i, last);
    heap_up(l, i);
    heap_down(l, last->heap_index);
}

/* Grows the heap so that one more timer fits. Timer arming has no error path
 * in the API (a deadline that cannot be armed is a correctness hole), so an
 * allocation failure here is fatal. The array only grows to the number of
 * simultaneously active timers. */
static void heap_reserve(kvp_loop_t *l)
{
    if (l->heap_len < l->heap_cap)
        return;
    uint32_t cap = l->heap_cap ? l->heap_cap * 2 : 64;
    kvp_timer_t **h = kvp__realloc(l->heap, (size_t)cap * sizeof(*h));
    KVP_ASSERT(h != NULL);
    l->heap = h;
    l->heap_cap = cap;
}

/* ----------------------------------------------------------------- timerfd */

static void loop_arm_tfd(kvp_loop_t *l)
{
    if (!l->real_clock)
        return;
    uint64_t d = l->heap_len ? l->heap[0]->deadline_ns : UINT64_MAX;
    if (d == l->tfd_armed)
        return;
    struct itimerspec its;
    memset(&its, 0, sizeof(its));
    if (d != UINT64_MAX) {
        uint64_t at = d ? d : 1; /* 0 would disarm */
        its.it_value.tv_sec = (time_t)(at / KVP_NSEC_PER_SEC);
        its.it_value.tv_nsec = (long)(at % KVP_NSEC_PER_SEC);
    }
    if (timerfd_settime(l->tfd, TFD_TIMER_ABSTIME, &its, NULL) == 0)
        l->tfd_armed = d;
}

static void loop_on_tfd(kvp_io_t *io, uint32_t events)
{
    kvp_loop_t *l = io->data;
    uint64_t n;
    while (read(l->tfd, &n, sizeof(n)) == (ssize_t)sizeof(n))
        ;
    l->tfd_armed = UINT64_MAX; /* expired: re-arm at the end of run_once */
}

static void loop_on_wake(kvp_io_t *io, uint32_t events)
{
    kvp_loop_t *l = io->data;
    uint64_t n;
    atomic_store(&l->wake_pending, false); /* before the read: a later write sets it again */
    while (read(l->evfd, &n, sizeof(n)) == (ssize_t)sizeof(n))
        ;
    if (l->wakeup_cb)
        l->wakeup_cb(l->wakeup_arg);
}

/* ------------------------------------------------------------ create/destroy */

static kvp_status_t loop_open_fds(kvp_loop_t *l)
{
    l->epfd = epoll_create1(EPOLL_CLOEXEC);
    l->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    l->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (l->epfd < 0 || l->evfd < 0 || l->tfd < 0) {
        KVP_ERROR(NULL, "loop: cannot create epoll/eventfd/timerfd: %s", strerror(errno));
        return KVP_ERR_IO;
    }
    kvp_status_t st = kvp_io_start(l, &l->wake_io, l->evfd, EPOLLIN, loop_on_wake, l);
    if (st == KVP_OK)
        st = kvp_io_start(l, &l->timer_io, l->tfd, EPOLLIN, loop_on_tfd, l);
    return st;
}

static void loop_close_fds(kvp_loop_t *l)
{
    if (l->ofd >= 0)
        close(l->ofd);
    if (l->wake_io.active)
        kvp_io_stop(l, &l->wake_io);
    if (l->timer_io.active)
        kvp_io_stop(l, &l->timer_io);
    if (l->tfd >= 0)
        close(l->tfd);
    if (l->evfd >= 0)
        close(l->evfd);
    if (l->epfd >= 0)
        close(l->epfd);
}

kvp_status_t kvp_loop_create(const kvp_clock_t *clock, kvp_loop_t **out)
{
    kvp_loop_t *l = kvp__calloc(1, sizeof(*l));
    if (!l)
        return KVP_ERR_NOMEM;
    l->clock = clock ? clock : kvp_clock_real();
    l->real_clock = (l->clock == kvp_clock_real());
    l->epfd = l->evfd = l->tfd = l->ofd = -1;
    l->tfd_armed = UINT64_MAX;
    kvp_status_t st = loop_open_fds(l);
    if (st != KVP_OK)
        goto err_fds;
    *out = l;
    return KVP_OK;

err_fds:
    loop_close_fds(l);
    kvp__free(l);
    return st;
}

void kvp_loop_destroy(kvp_loop_t *loop)
{
    if (!loop)
        return;
    KVP_ASSERT(loop->heap_len == 0); /* every timer must have been stopped */
    loop_close_fds(loop);
    kvp__free(loop->heap);
    kvp__free(loop);
}

const kvp_clock_t *kvp_loop_clock(const kvp_loop_t *loop)
{
    return loop->clock;
}

uint64_t kvp_loop_now(const kvp_loop_t *loop)
{
    return kvp_clock_now(loop->clock);
}

int kvp_loop_fd(const kvp_loop_t *loop)
{
    return loop->epfd;
}

void kvp_loop_set_wakeup_cb(kvp_loop_t *loop, void (*cb)(void *arg), void *arg)
{
    loop->wakeup_cb = cb;
    loop->wakeup_arg = arg;
}

void kvp_loop_wakeup(kvp_loop_t *loop)
{
    uint64_t one = 1;
    /* EAGAIN means the counter is already non-zero: a wakeup is pending. */
    ssize_t r = write(loop->evfd, &one, sizeof(one));
    (void)r;
    atomic_store(&loop->wake_pending, true); /* after the write: see kvp_loop_run_once */
}

/* ---------------------------------------------------------------------- io */

kvp_status_t kvp_io_start(kvp_loop_t *loop, kvp_io_t *io, int fd, uint32_t events, kvp_io_cb cb,
                          void *data)
{
    struct epoll_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.events = events;
    ev.data.ptr = io;
    if (epoll_ctl(loop->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        KVP_ERROR(NULL, "loop: epoll add fd %d: %s", fd, strerror(errno));
        return KVP_ERR_IO;
    }
    io->fd = fd;
    io->events = events;
    io->cb = cb;
    io->data = data;
    io->active = true;
    if (io != &loop->wake_io && io != &loop->timer_io)
        loop->n_user_io++;
    return KVP_OK;
}

kvp_status_t kvp_io_modify(kvp_loop_t *loop, kvp_io_t *io, uint32_t events)
{
    KVP_ASSERT(io->active);
    if (events == io->events)
        return KVP_OK;
    struct epoll_event ev;
    memset(&ev, 0, sizeof(ev));
    ev.events = events;
    ev.data.ptr = io;
    if (epoll_ctl(loop->epfd, EPOLL_CTL_MOD, io->fd, &ev) != 0) {
        KVP_ERROR(NULL, "loop: epoll mod fd %d: %s", io->fd, strerror(errno));
        return KVP_ERR_IO;
    }
    io->events = events;
    return KVP_OK;
}

static kvp_status_t loop_outer_ctl(kvp_loop_t *l, int op, uint32_t events)
{
    struct epoll_event ev = {.events = events, .data.ptr = NULL};
    if (epoll_ctl(l->ofd, op, l->epfd, &ev) != 0) {
        KVP_ERROR(NULL, "loop: outer epoll %s: %s", op == EPOLL_CTL_ADD ? "add" : "mod",
                  strerror(errno));
        return KVP_ERR_IO;
    }
    return KVP_OK;
}

kvp_status_t kvp_loop_set_wait_hooks(kvp_loop_t *loop, void (*begin)(void *arg),
                                     void (*end)(void *arg), void *arg)
{
    if (begin != NULL && loop->ofd < 0) {
        loop->ofd = epoll_create1(EPOLL_CLOEXEC);
        if (loop->ofd < 0) {
            KVP_ERROR(NULL, "loop: outer epoll: %s", strerror(errno));
            return KVP_ERR_IO;
        }
        kvp_status_t st = loop_outer_ctl(loop, EPOLL_CTL_ADD, EPOLLIN);
        if (st != KVP_OK) {
            close(loop->ofd);
            loop->ofd = -1;
            return st;
        }
    }
    loop->wait_begin = begin;
    loop->wait_end = end;
    loop->wait_arg = arg;
    return KVP_OK;
}

kvp_status_t kvp_loop_lead(kvp_loop_t *loop, bool on)
{
    if (loop->ofd < 0 || loop->leading == on) /* no hooks; or stuck leading (below) */
        return on ? KVP_ERR_STATE : KVP_OK;
    /* Off: the epoll fd's readiness no longer reaches the sleeping owner.
     * On again: what is ready now wakes it at once (EPOLL_CTL_MOD re-polls),
     * and so does the timerfd armed for the nearest deadline later. */
    kvp_status_t st = loop_outer_ctl(loop, EPOLL_CTL_MOD, on ? 0 : EPOLLIN);
    if (st == KVP_OK)
        loop->leading = on;
    /* A failure to stop leading (MOD of an existing entry does not fail in
     * practice) leaves `leading` set: the owner then sleeps on the epoll fd
     * itself without releasing its lock -- slower (nobody can lead or take a
     * fast path), never wrong. */
    return st;
}

void kvp_io_stop(kvp_loop_t *loop, kvp_io_t *io)
{
    if (!io->active)
        return;
    epoll_ctl(loop->epfd, EPOLL_CTL_DEL, io->fd, NULL);
    io->active = false;
    if (io != &loop->wake_io && io != &loop->timer_io)
        loop->n_user_io--;
    /* The owner may free io right after this: forget it in the batch being
     * dispatched so a later entry does not call into freed memory. */
    for (int i = loop->cur_event + 1; i < loop->nevents; i++)
        if (loop->events[i].data.ptr == io)
            loop->events[i].data.ptr = NULL;
}

/* ------------------------------------------------------------------ timers */

void kvp_timer_init(kvp_timer_t *t, const char *name, kvp_timer_cb cb, void *data)
{
    memset(t, 0, sizeof(*t));
    t->name = name;
    t->cb = cb;
    t->data = data;
    t->heap_index = UINT32_MAX;
}

void kvp_timer_start(kvp_loop_t *loop, kvp_timer_t *t, uint64_t deadline_ns)
{
    t->deadline_ns = deadline_ns;
    t->seq = loop->next_seq++;
    if (t->heap_index != UINT32_MAX) {
        /* Re-armed: moved in place. Timers fire in (deadline, seq) order, a
         * total order, so the heap's layout never shows: as remove + insert. */
        heap_up(loop, t->heap_index);
        heap_down(loop, t->heap_index);
    } else {
        heap_reserve(loop);
        heap_set(loop, loop->heap_len++, t);
        heap_up(loop, t->heap_index);
    }
    if (loop->heap[0] == t && deadline_ns < loop->tfd_armed)
        loop_arm_tfd(loop);
}

void kvp_timer_stop(kvp_loop_t *loop, kvp_timer_t *t)
{
    if (t->heap_index != UINT32_MAX)
        heap_remove(loop, t);
}

bool kvp_timer_active(const kvp_timer_t *t)
{
    return t->heap_index != UINT32_MAX;
}

uint64_t kvp_loop_next_deadline(const kvp_loop_t *loop)
{
    return loop->heap_len ? loop->heap[0]->deadline_ns : UINT64_MAX;
}

uint64_t kvp_loop_polled(const kvp_loop_t *loop)
{
    return loop->polled_ns;
}

/* ------------------------------------------------------------------- run */

static int loop_fire_timers(kvp_loop_t *l)
{
    uint64_t now = kvp_loop_now(l);
    uint64_t seq_limit = l->next_seq; /* timers armed from here on wait for the next round */
    int n = 0;
    while (l->heap_len) {
        kvp_timer_t *t = l->heap[0];
        if (t->deadline_ns > now || t->seq >= seq_limit)
            break;
        heap_remove(l, t);
        t->cb(t);
        n++;
    }
    return n;
}

static int loop_wait_ms(const kvp_loop_t *l, int timeout_ms)
{
    if (timeout_ms == 0 || l->heap_len == 0)
        return timeout_ms;
    uint64_t now = kvp_loop_now(l), d = l->heap[0]->deadline_ns;
    if (d <= now)
        return 0;
    if (!l->real_clock)
        return timeout_ms; /* a manual clock does not move while we sleep */
    uint64_t ms = (d - now + KVP_NSEC_PER_MSEC - 1) / KVP_NSEC_PER_MSEC;
    if (timeout_ms > 0 && ms > (uint64_t)timeout_ms)
        return timeout_ms;
    return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

int kvp_loop_run_once(kvp_loop_t *loop, int timeout_ms)
{
    int wait = loop_wait_ms(loop, timeout_ms);
    int n = 0;
    /* A non-blocking round on a manual clock with no fd but our own (the
     * fake network and the fake transport have none; the timerfd is armed
     * only on the real clock) has nothing epoll could report unless a
     * wakeup was written: skip the syscall (the simulator runs ~10^4 such
     * rounds per seed). A wakeup written while we skip is seen next round. */
    if (wait != 0 && loop->wait_begin != NULL && !loop->leading) {
        /* Sleeping: the owner's lock is released, so another thread may run
         * the owner's work meanwhile (and stop and free ios). Only the outer
         * fd is waited on; the batch is collected after the lock is back,
         * also after a timeout: input may have come while we waited for the
         * lock (a leader had switched the outer entry off), and
         * kvp_loop_polled must mean "read up to here". */
        struct epoll_event outer;
        loop->wait_begin(loop->wait_arg);
        (void)epoll_wait(loop->ofd, &outer, 1, wait);
        loop->wait_end(loop->wait_arg);
        n = epoll_wait(loop->epfd, loop->events, LOOP_MAX_EVENTS, 0);
    } else if (wait != 0 || loop->real_clock || loop->n_user_io != 0 ||
               atomic_load(&loop->wake_pending)) {
        n = epoll_wait(loop->epfd, loop->events, LOOP_MAX_EVENTS, wait);
    }
    if (n < 0)
        n = 0; /* EINTR: fall through to the timers */
    loop->polled_ns = kvp_loop_now(loop); /* (a skipped poll had nothing to read) */
    int ran = 0;
    loop->nevents = n;
    for (loop->cur_event = 0; loop->cur_event < n; loop->cur_event++) {
        kvp_io_t *io = loop->events[loop->cur_event].data.ptr;
        if (!io || !io->active)
            continue;
        io->cb(io, loop->events[loop->cur_event].events);
        ran++;
    }
    loop->nevents = 0;
    loop->cur_event = 0;
    ran += loop_fire_timers(loop);
    loop_arm_tfd(loop);
    return ran;
}
