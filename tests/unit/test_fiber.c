/*
 * Tests of the fiber scheduler (core/fiber.h): many fibers on few
 * workers, a parent waiting for children on the same worker, kept stacks
 * running the next fibers, wake-ups from plain threads, timers in
 * deadline order and across parks, per-fiber error state, work run on
 * the worker's own stack, waits on a descriptor, a caller's loop driven
 * from a worker, where a spawned fiber goes, and the bound on blocking
 * work.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/fiber.h"
#include "loom/pool.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static loom__sched *start(int workers, int blocking)
{
    loom__sched_opts o = {0};
    loom__sched *s = NULL;

    o.workers = workers;
    o.blocking_max = blocking;
    o.stack_size = 64 << 10;
    assert_int_equal(loom__sched_start(&s, &o), 0);
    return s;
}

/* ---- many fibers --------------------------------------------------------- */

static atomic_int counter;

static void yielder(void *arg)
{
    (void)arg;
    assert_non_null(loom__fiber_self());
    for (int i = 0; i < 10; i++) {
        atomic_fetch_add(&counter, 1);
        loom__fiber_yield();
    }
}

static void test_many_fibers(void **state)
{
    loom__sched *s = start(2, 0);

    (void)state;
    atomic_store(&counter, 0);
    for (int i = 0; i < 3000; i++)
        assert_int_equal(loom__fiber_spawn(s, yielder, NULL, 0), 0);
    loom__sched_stop(s);
    assert_int_equal(atomic_load(&counter), 30000);
    assert_null(loom__fiber_self());
}

/* ---- a parent waits for its children on one worker ----------------------- */

typedef struct {
    pthread_mutex_t mu;
    loom__cond cv;
    int done, want;
    int ok;
} family;

static void child(void *arg)
{
    family *fa = arg;

    loom__fiber_yield();
    pthread_mutex_lock(&fa->mu);
    fa->done++;
    loom__cond_signal(&fa->cv);
    pthread_mutex_unlock(&fa->mu);
}

static void parent(void *arg)
{
    family *fa = arg;

    for (int i = 0; i < fa->want; i++)
        assert_int_equal(loom__fiber_spawn(loom__fiber_sched(), child, fa, 1),
                         0);
    pthread_mutex_lock(&fa->mu);
    while (fa->done < fa->want)
        assert_int_equal(loom__cond_wait(&fa->cv, &fa->mu, -1), 0);
    fa->ok = 1;
    pthread_mutex_unlock(&fa->mu);
}

static void test_parent_waits_on_one_worker(void **state)
{
    loom__sched *s = start(1, 0);
    family fa = {.want = 200};

    (void)state;
    pthread_mutex_init(&fa.mu, NULL);
    assert_int_equal(loom__cond_init(&fa.cv), 0);
    assert_int_equal(loom__fiber_spawn(s, parent, &fa, 0), 0);
    loom__sched_stop(s);
    assert_int_equal(fa.done, 200);
    assert_true(fa.ok);
    loom__cond_destroy(&fa.cv);
    pthread_mutex_destroy(&fa.mu);
}

/* ---- kept stacks run the next fiber ------------------------------------- */

typedef struct {
    pthread_mutex_t mu;
    loom__cond cv;
    int turn, started, ended;
} relay;

/* Parks until the plain thread gives it its turn. */
static void relay_runner(void *arg)
{
    relay *r = arg;

    pthread_mutex_lock(&r->mu);
    r->started++;
    loom__cond_broadcast(&r->cv);
    while (r->turn < r->started)
        assert_int_equal(loom__cond_wait(&r->cv, &r->mu, -1), 0);
    r->ended++;
    loom__cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

/* One fiber after another on one worker, each woken from a plain thread
 * while the worker sleeps: the stacks of ended fibers are entered again
 * for the next ones, which park and wake like fresh ones. */
static void test_kept_stacks_run_again(void **state)
{
    loom__sched *s = start(1, 0);
    relay r = {0};

    (void)state;
    pthread_mutex_init(&r.mu, NULL);
    assert_int_equal(loom__cond_init(&r.cv), 0);
    for (int i = 1; i <= 100; i++) {
        assert_int_equal(loom__fiber_spawn(s, relay_runner, &r, 0), 0);
        pthread_mutex_lock(&r.mu);
        while (r.started < i)
            loom__cond_wait(&r.cv, &r.mu, -1);
        r.turn = i;
        loom__cond_broadcast(&r.cv);
        while (r.ended < i)
            loom__cond_wait(&r.cv, &r.mu, -1);
        pthread_mutex_unlock(&r.mu);
    }
    loom__sched_stop(s);
    assert_int_equal(r.started, 100);
    assert_int_equal(r.ended, 100);
    loom__cond_destroy(&r.cv);
    pthread_mutex_destroy(&r.mu);
}

/* ---- wake-ups from a plain thread ---------------------------------------- */

typedef struct {
    pthread_mutex_t mu;
    loom__cond cv;
    int waiting, go, seen;
} gate;

static void gate_waiter(void *arg)
{
    gate *g = arg;

    pthread_mutex_lock(&g->mu);
    g->waiting++;
    loom__cond_broadcast(&g->cv);
    while (!g->go)
        loom__cond_wait(&g->cv, &g->mu, -1);
    g->seen++;
    pthread_mutex_unlock(&g->mu);
}

static void test_cross_thread_wake(void **state)
{
    loom__sched *s = start(2, 0);
    gate g = {0};

    (void)state;
    pthread_mutex_init(&g.mu, NULL);
    assert_int_equal(loom__cond_init(&g.cv), 0);
    for (int i = 0; i < 50; i++)
        assert_int_equal(loom__fiber_spawn(s, gate_waiter, &g, 0), 0);
    /* This thread waits off a fiber on the same cond the fibers use. */
    pthread_mutex_lock(&g.mu);
    while (g.waiting < 50)
        loom__cond_wait(&g.cv, &g.mu, -1);
    g.go = 1;
    loom__cond_broadcast(&g.cv);
    pthread_mutex_unlock(&g.mu);
    loom__sched_stop(s);
    assert_int_equal(g.seen, 50);
    loom__cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
}

/* A signal wakes exactly one fiber waiter per call until all are out. */
static void test_signal_wakes_each(void **state)
{
    loom__sched *s = start(2, 0);
    gate g = {0};

    (void)state;
    pthread_mutex_init(&g.mu, NULL);
    assert_int_equal(loom__cond_init(&g.cv), 0);
    for (int i = 0; i < 20; i++)
        assert_int_equal(loom__fiber_spawn(s, gate_waiter, &g, 0), 0);
    pthread_mutex_lock(&g.mu);
    while (g.waiting < 20)
        loom__cond_wait(&g.cv, &g.mu, -1);
    g.go = 1;
    pthread_mutex_unlock(&g.mu);
    for (;;) {
        pthread_mutex_lock(&g.mu);
        if (g.seen == 20) {
            pthread_mutex_unlock(&g.mu);
            break;
        }
        loom__cond_signal(&g.cv);
        pthread_mutex_unlock(&g.mu);
        loom__fiber_yield(); /* no-op here: off a fiber */
    }
    loom__sched_stop(s);
    assert_int_equal(g.seen, 20);
    loom__cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
}

/* ---- timers -------------------------------------------------------------- */

static pthread_mutex_t order_mu = PTHREAD_MUTEX_INITIALIZER;
static int order[8];
static int norder;
static double base;

/* Sleeps until base + 20 * its number, then notes the number. */
static void sleeper(void *arg)
{
    int n = (int)(intptr_t)arg;
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    loom__cond cv;

    assert_int_equal(loom__cond_init(&cv), 0);
    pthread_mutex_lock(&mu);
    while (loom__cond_wait(&cv, &mu, base + 20.0 * n) != ETIMEDOUT)
        ;
    pthread_mutex_unlock(&mu);
    loom__cond_destroy(&cv);
    pthread_mutex_lock(&order_mu);
    order[norder++] = n;
    pthread_mutex_unlock(&order_mu);
}

static void test_timers_in_deadline_order(void **state)
{
    loom__sched *s = start(1, 0);

    (void)state;
    norder = 0;
    base = loom__mono_ms_exact() + 200;
    /* Spawned in one order, woken in the order of their deadlines. */
    assert_int_equal(loom__fiber_spawn(s, sleeper, (void *)(intptr_t)3, 0), 0);
    assert_int_equal(loom__fiber_spawn(s, sleeper, (void *)(intptr_t)1, 0), 0);
    assert_int_equal(loom__fiber_spawn(s, sleeper, (void *)(intptr_t)2, 0), 0);
    loom__sched_stop(s);
    assert_int_equal(norder, 3);
    assert_int_equal(order[0], 1);
    assert_int_equal(order[1], 2);
    assert_int_equal(order[2], 3);
}

static void napper(void *arg)
{
    (void)arg;
    loom__fiber_sleep(5);
    atomic_fetch_add(&counter, 1);
}

/* Sleeping fibers park: 100 of them on one worker all wake. */
static void test_sleep_parks(void **state)
{
    loom__sched *s = start(1, 0);

    (void)state;
    atomic_store(&counter, 0);
    for (int i = 0; i < 100; i++)
        assert_int_equal(loom__fiber_spawn(s, napper, NULL, 0), 0);
    loom__sched_stop(s);
    assert_int_equal(atomic_load(&counter), 100);
}

/* A fiber's timer across parks: parked with a far deadline and woken by
 * another fiber, then parked with a nearer one, it still times out then;
 * parked with a near deadline and woken early, then parked until later,
 * it sleeps to the later deadline. */
static loom__fiber *rearm_self;
static uint64_t rearm_token;
static int rearm_woken[4];
static double rearm_late[2];

static void rearm_waker(void *arg)
{
    (void)arg;
    loom__fiber_wake(rearm_self, rearm_token);
}

/* Parks until `until`, woken first by another fiber of the worker. */
static int park_woken(double until)
{
    rearm_token = loom__fiber_arm();
    assert_int_equal(
        loom__fiber_spawn(loom__fiber_sched(), rearm_waker, NULL, 1), 0);
    return loom__fiber_park(until);
}

/* Parks until now + ms, woken by nothing; *late: how long after. */
static int park_alone(double ms, double *late)
{
    double until = loom__mono_ms_exact() + ms;
    int woken;

    (void)loom__fiber_arm();
    woken = loom__fiber_park(until);
    *late = loom__mono_ms_exact() - until;
    return woken;
}

static void rearm_parker(void *arg)
{
    (void)arg;
    rearm_self = loom__fiber_self();
    rearm_woken[0] = park_woken(loom__mono_ms_exact() + 600000.0);
    rearm_woken[1] = park_alone(30, &rearm_late[0]);
    rearm_woken[2] = park_woken(loom__mono_ms_exact() + 20);
    rearm_woken[3] = park_alone(80, &rearm_late[1]);
}

static void test_timer_across_parks(void **state)
{
    loom__sched *s = start(1, 0);

    (void)state;
    assert_int_equal(loom__fiber_spawn(s, rearm_parker, NULL, 0), 0);
    loom__sched_stop(s);
    assert_int_equal(rearm_woken[0], 1);
    assert_int_equal(rearm_woken[1], 0);
    assert_true(rearm_late[0] >= 0);
    assert_int_equal(rearm_woken[2], 1);
    assert_int_equal(rearm_woken[3], 0);
    assert_true(rearm_late[1] >= 0);
}

static int timed_rc = -1;
static double timed_late;

static void timed_waiter(void *arg)
{
    pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    loom__cond cv;
    double until = loom__mono_ms_exact() + 30;

    (void)arg;
    assert_int_equal(loom__cond_init(&cv), 0);
    pthread_mutex_lock(&mu);
    timed_rc = loom__cond_wait(&cv, &mu, until);
    timed_late = loom__mono_ms_exact() - until;
    pthread_mutex_unlock(&mu);
    loom__cond_destroy(&cv);
}

static void test_cond_wait_times_out(void **state)
{
    loom__sched *s = start(1, 0);

    (void)state;
    assert_int_equal(loom__fiber_spawn(s, timed_waiter, NULL, 0), 0);
    loom__sched_stop(s);
    assert_int_equal(timed_rc, ETIMEDOUT);
    assert_true(timed_late >= 0); /* never before its time */
}

/* ---- cancel flags wake parked fibers ------------------------------------- */

/* A fiber parked on a cancel flag (child of parent): another thread sets
 * the parent once the fiber is about to park; a cond waiter too. */
typedef struct {
    loom_cancel parent, child;
    pthread_mutex_t mu;
    loom__cond cv;
    int parking;        /* the fibers said they are about to wait */
    int parked, conded; /* what park / cond_wait returned, -1 before */
} cancel_case;

static void cancel_parker(void *arg)
{
    cancel_case *c = arg;
    int woken;

    pthread_mutex_lock(&c->mu);
    c->parking++;
    loom__cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    (void)loom__fiber_arm();
    /* A minute: the flag wakes it long before (returns 1), a lost wake
     * would time out (0). */
    woken = loom__fiber_park_cancel(loom__mono_ms_exact() + 60000.0, &c->child);
    pthread_mutex_lock(&c->mu);
    c->parked = woken;
    pthread_mutex_unlock(&c->mu);
}

static void cancel_conder(void *arg)
{
    cancel_case *c = arg;
    double until = loom__mono_ms_exact() + 60000.0;
    int rc = 0;

    pthread_mutex_lock(&c->mu);
    c->parking++;
    loom__cond_broadcast(&c->cv);
    while (!loom_cancel_is_set(&c->child) && rc == 0)
        rc = loom__cond_wait_cancel(&c->cv, &c->mu, until, &c->child);
    c->conded = rc;
    pthread_mutex_unlock(&c->mu);
}

static void test_cancel_wakes_parked(void **state)
{
    loom__sched *s = start(1, 0);
    cancel_case c;

    (void)state;
    memset(&c, 0, sizeof(c));
    c.child.parent = &c.parent;
    c.parked = c.conded = -1;
    pthread_mutex_init(&c.mu, NULL);
    assert_int_equal(loom__cond_init(&c.cv), 0);
    assert_int_equal(loom__fiber_spawn(s, cancel_parker, &c, 0), 0);
    assert_int_equal(loom__fiber_spawn(s, cancel_conder, &c, 0), 0);
    pthread_mutex_lock(&c.mu);
    while (c.parking < 2)
        loom__cond_wait(&c.cv, &c.mu, -1);
    pthread_mutex_unlock(&c.mu);
    loom_cancel_set(&c.parent);
    loom__sched_stop(s);
    assert_int_equal(c.parked, 1);
    assert_int_equal(c.conded, 0);
    loom__cond_destroy(&c.cv);
    pthread_mutex_destroy(&c.mu);
}

/* A flag set before the park: the park returns at once. */
typedef struct {
    loom_cancel c;
    int woken;
} early_case;

static void set_then_park(void *arg)
{
    early_case *t = arg;

    loom_cancel_set(&t->c);
    (void)loom__fiber_arm();
    t->woken = loom__fiber_park_cancel(-1, &t->c);
}

static void test_cancel_before_park(void **state)
{
    loom__sched *s = start(1, 0);
    early_case t = {LOOM_CANCEL_INIT, -1};

    (void)state;
    assert_int_equal(loom__fiber_spawn(s, set_then_park, &t, 0), 0);
    loom__sched_stop(s);
    assert_int_equal(t.woken, 1);
}

/* ---- error state per fiber ----------------------------------------------- */

static atomic_int err_ok;

static void err_fiber(void *arg)
{
    const char *mine = arg;

    loom__error_set(LOOM_ERROR, "%s", mine);
    for (int i = 0; i < 5; i++)
        loom__fiber_yield();
    if (strcmp(loom_error_last(), mine) == 0)
        atomic_fetch_add(&err_ok, 1);
}

static void test_error_state_per_fiber(void **state)
{
    loom__sched *s = start(1, 0);

    (void)state;
    atomic_store(&err_ok, 0);
    loom__error_set(LOOM_ERROR, "the test thread's");
    assert_int_equal(loom__fiber_spawn(s, err_fiber, "first", 0), 0);
    assert_int_equal(loom__fiber_spawn(s, err_fiber, "second", 0), 0);
    loom__sched_stop(s);
    assert_int_equal(atomic_load(&err_ok), 2);
    assert_string_equal(loom_error_last(), "the test thread's");
}

/* C: on the kept stack of A, which failed (one worker: B took a fresh
 * stack while A ran, so C gets A's). */
static void clean_check(void *arg)
{
    (void)arg;
    if (loom_error_last_code() != 0 || loom_error_last()[0] != '\0')
        return;
    loom__error_set(LOOM_ETIMEDOUT, "late");
    if (loom_error_last_code() != LOOM_ETIMEDOUT)
        return;
    loom_error_clear();
    if (loom_error_last_code() == 0 && loom_error_last()[0] == '\0')
        atomic_fetch_add(&err_ok, 1);
}

static void clean_spawner(void *arg)
{
    if (loom__fiber_spawn(arg, clean_check, NULL, 1) != 0)
        atomic_fetch_sub(&err_ok, 100);
}

static void clean_failer(void *arg)
{
    loom__error_set(LOOM_ERROR, "A failed");
    if (loom__fiber_spawn(arg, clean_spawner, arg, 1) != 0)
        atomic_fetch_sub(&err_ok, 100);
}

/* A fiber starts with no error, also on the kept stack of one that
 * recorded one (a fiber's state is made at its first error and dropped
 * when it ends), and loom_error_clear clears its own. */
static void test_error_state_fresh_on_kept_stack(void **state)
{
    loom__sched *s = start(1, 0);

    (void)state;
    atomic_store(&err_ok, 0);
    assert_int_equal(loom__fiber_spawn(s, clean_failer, s, 0), 0);
    loom__sched_stop(s);
    assert_int_equal(atomic_load(&err_ok), 1);
}

/* ---- work on the worker's stack ------------------------------------------ */

typedef struct {
    pthread_t fiber_thread, fn_thread;
    loom__fiber *fn_self, *after_self;
    int deep_sum;
    int others_before, others_after;
    char msg[64];
} on_worker_check;

static atomic_int others;

/* Deeper than a fiber's whole stack in these tests (64 KiB): on the fiber
 * it would run into the guard page. */
static void deep_work(void *arg)
{
    on_worker_check *c = arg;
    volatile char big[200 << 10];

    memset((char *)big, 1, sizeof(big));
    c->deep_sum = big[0] + big[sizeof(big) - 1];
    c->fn_self = loom__fiber_self();
    c->fn_thread = pthread_self();
    /* Waits block the thread: the worker's other fiber does not run. */
    c->others_before = atomic_load(&others);
    loom__fiber_sleep(20);
    c->others_after = atomic_load(&others);
    loom__error_set(LOOM_EINVALID, "set on the worker's stack");
}

static void on_worker_fiber(void *arg)
{
    on_worker_check *c = arg;

    c->fiber_thread = pthread_self();
    loom__fiber_on_worker(deep_work, c);
    c->after_self = loom__fiber_self();
    snprintf(c->msg, sizeof(c->msg), "%s", loom_error_last());
}

static void busy_other(void *arg)
{
    (void)arg;
    for (int i = 0; i < 50; i++) {
        atomic_fetch_add(&others, 1);
        loom__fiber_sleep(1);
    }
}

/* loom__fiber_on_worker runs fn on the worker's own stack, as a plain
 * thread would (no fiber, waits block), with the fiber's error state,
 * and the fiber goes on after it; off a fiber it runs fn where it is. */
static void test_on_worker(void **state)
{
    loom__sched *s = start(1, 0);
    on_worker_check c, here;

    (void)state;
    memset(&c, 0, sizeof(c));
    memset(&here, 0, sizeof(here));
    atomic_store(&others, 0);
    assert_int_equal(loom__fiber_spawn(s, busy_other, NULL, 0), 0);
    assert_int_equal(loom__fiber_spawn(s, on_worker_fiber, &c, 0), 0);
    loom__sched_stop(s);
    assert_int_equal(c.deep_sum, 2);
    assert_null(c.fn_self);
    assert_true(pthread_equal(c.fn_thread, c.fiber_thread));
    assert_int_equal(c.others_before, c.others_after);
    assert_non_null(c.after_self);
    assert_string_equal(c.msg, "set on the worker's stack");
    assert_int_equal(atomic_load(&others), 50);

    loom_error_clear();
    loom__fiber_on_worker(deep_work, &here);
    assert_int_equal(here.deep_sum, 2);
    assert_true(pthread_equal(here.fn_thread, pthread_self()));
    assert_string_equal(loom_error_last(), "set on the worker's stack");
}

/* ---- waiting on a descriptor --------------------------------------------- */

typedef struct {
    int fd;
    int ready, timed_out, again;
    char got;
} fd_check;

static void fd_waiter(void *arg)
{
    fd_check *c = arg;

    c->ready = loom__fiber_wait_fd(c->fd, loom__mono_ms_exact() + 60000);
    if (read(c->fd, &c->got, 1) != 1)
        c->got = 0;
    /* Nothing more written: the wait ends at its deadline. */
    c->timed_out = loom__fiber_wait_fd(c->fd, loom__mono_ms_exact() + 20);
    /* Forgotten, then waited on again: armed afresh. */
    loom__fiber_forget_fd(c->fd);
    c->again = loom__fiber_wait_fd(c->fd, 0);
    loom__fiber_forget_fd(c->fd);
}

/* loom__fiber_wait_fd parks a fiber until its descriptor is readable (1,
 * here written by a plain thread) or its deadline passed (0), and is
 * refused off a fiber. */
static void test_wait_fd(void **state)
{
    loom__sched *s = start(1, 0);
    fd_check c;
    int p[2];

    (void)state;
    memset(&c, 0, sizeof(c));
    assert_int_equal(pipe(p), 0);
    c.fd = p[0];
    assert_int_equal(loom__fiber_spawn(s, fd_waiter, &c, 0), 0);
    assert_int_equal(write(p[1], "x", 1), 1);
    loom__sched_stop(s);
    assert_int_equal(c.ready, 1);
    assert_int_equal(c.got, 'x');
    assert_int_equal(c.timed_out, 0);
    /* until 0 is already past: 0, nothing written. */
    assert_int_equal(c.again, 0);
    assert_int_equal(loom__fiber_wait_fd(p[0], -1), LOOM_EINVALID);
    close(p[0]);
    close(p[1]);
}

/* ---- a caller's loop on a worker ----------------------------------------- */

typedef struct {
    int fd;
    atomic_int calls, bytes, next, on_fiber;
} loop_check;

static long loop_step_fn(void *arg)
{
    loop_check *c = arg;
    char b[16];
    ssize_t n;

    atomic_fetch_add(&c->calls, 1);
    /* On the worker's stack, not the loop's fiber. */
    atomic_fetch_add(&c->on_fiber, loom__fiber_self() != NULL);
    while ((n = read(c->fd, b, sizeof(b))) > 0)
        atomic_fetch_add(&c->bytes, (int)n);
    return atomic_load(&c->next);
}

/* Waits (for at most 20 s) until *v reaches at_least. */
static void wait_for(atomic_int *v, int at_least)
{
    for (int i = 0; i < 20000 && atomic_load(v) < at_least; i++)
        loom__fiber_sleep(1);
    assert_true(atomic_load(v) >= at_least);
}

/* loom_pool_loop_start calls step at once, when its descriptor is
 * readable, when woken, and again after the ms step asked for; after
 * loom_pool_loop_stop, never. */
static void test_pool_loop(void **state)
{
    loom_pool_options po = {LOOM_POOL_OPTIONS_VERSION, 1, 0, 64 << 10};
    loom_pool *pool = NULL;
    loom_pool_loop *l = NULL;
    loop_check c;
    int p[2], was;

    (void)state;
    memset(&c, 0, sizeof(c));
    assert_int_equal(pipe(p), 0);
    assert_int_equal(fcntl(p[0], F_SETFL, O_NONBLOCK), 0);
    c.fd = p[0];
    atomic_store(&c.next, -1);
    assert_int_equal(loom_pool_new(&pool, &po), 0);
    assert_int_equal(loom_pool_loop_start(&l, pool, p[0], loop_step_fn, &c), 0);
    assert_non_null(l);
    wait_for(&c.calls, 1);
    assert_int_equal(write(p[1], "abc", 3), 3);
    wait_for(&c.bytes, 3);
    was = atomic_load(&c.calls);
    loom_pool_loop_wake(l);
    wait_for(&c.calls, was + 1);
    /* Called again on its own, every 2 ms. */
    atomic_store(&c.next, 2);
    was = atomic_load(&c.calls);
    loom_pool_loop_wake(l);
    wait_for(&c.calls, was + 4);
    loom_pool_loop_stop(l);
    was = atomic_load(&c.calls);
    assert_int_equal(write(p[1], "d", 1), 1);
    loom__fiber_sleep(20);
    assert_int_equal(atomic_load(&c.calls), was);
    assert_int_equal(atomic_load(&c.on_fiber), 0);
    loom_pool_free(pool);
    close(p[0]);
    close(p[1]);
}

/* Wakes from plain threads, from fibers on the loop's worker and the
 * other, and from inside the step itself are never lost: the step here
 * never asks for a timer and its descriptor never becomes readable, so
 * a lost wake leaves the loop waiting for good, and the step never sees
 * the last count posted before a wake. */
#define WAKERS 3
#define WAKES 3000

static atomic_int posted, seen, self_wakes, wakers_done;
static loom_pool_loop *wake_loop;

static long wake_step(void *arg)
{
    (void)arg;
    /* Now and then the step wakes its own loop (a run resuming a
     * connection from the loop's worker does that), before it notes
     * what it saw: the step that wake brings sees one more. */
    if (atomic_load(&posted) % 97 == 0 && atomic_load(&self_wakes) < 20) {
        atomic_fetch_add(&self_wakes, 1);
        atomic_fetch_add(&posted, 1);
        loom_pool_loop_wake(wake_loop);
    }
    atomic_store(&seen, atomic_load(&posted));
    return -1;
}

static void post_wakes(void)
{
    for (int i = 0; i < WAKES; i++) {
        atomic_fetch_add(&posted, 1);
        loom_pool_loop_wake(wake_loop);
        if (i % 50 == 0) {
            if (loom__fiber_self())
                loom__fiber_yield();
            else
                sched_yield();
        }
    }
    atomic_fetch_add(&wakers_done, 1);
}

static void wake_fiber(void *arg)
{
    (void)arg;
    post_wakes();
}

static void *wake_thread(void *arg)
{
    (void)arg;
    post_wakes();
    return NULL;
}

static void test_pool_loop_wakes_not_lost(void **state)
{
    loom_pool_options po = {LOOM_POOL_OPTIONS_VERSION, 2, 0, 64 << 10};
    loom_pool *pool = NULL;
    pthread_t th[WAKERS];
    int p[2], last;

    (void)state;
    atomic_store(&posted, 0);
    atomic_store(&seen, -1);
    atomic_store(&self_wakes, 0);
    atomic_store(&wakers_done, 0);
    assert_int_equal(pipe(p), 0);
    assert_int_equal(loom_pool_new(&pool, &po), 0);
    assert_int_equal(
        loom_pool_loop_start(&wake_loop, pool, p[0], wake_step, NULL), 0);
    for (int i = 0; i < WAKERS; i++) {
        assert_int_equal(pthread_create(&th[i], NULL, wake_thread, NULL), 0);
        assert_int_equal(loom_pool_spawn(pool, wake_fiber, NULL), 0);
    }
    for (int i = 0; i < WAKERS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 20000 && atomic_load(&wakers_done) < 2 * WAKERS; i++)
        loom__fiber_sleep(1);
    assert_int_equal(atomic_load(&wakers_done), 2 * WAKERS);
    for (int i = 0; i < 20000 && atomic_load(&seen) != atomic_load(&posted);
         i++)
        loom__fiber_sleep(1);
    last = atomic_load(&posted);
    assert_int_equal(atomic_load(&seen), last);
    assert_true(last >= 2 * WAKERS * WAKES);
    loom_pool_loop_stop(wake_loop);
    loom_pool_free(pool);
    close(p[0]);
    close(p[1]);
}

/* A loop's step runs before the worker's other ready fibers take their
 * next turn: here a fiber of the same worker writes to the loop's
 * descriptor, and the step sees it before the other yielding fibers
 * have all had another turn (at the back of the queue it would come
 * after them all). */
#define URGENT_BUSY 40

static atomic_int turns, turns_at_write, turns_at_step;
static int urgent_fd[2];

static long urgent_step(void *arg)
{
    char b;

    (void)arg;
    if (read(urgent_fd[0], &b, 1) == 1)
        atomic_store(&turns_at_step, atomic_load(&turns));
    return -1;
}

static void urgent_busy(void *arg)
{
    int writer = arg != NULL;

    for (int i = 0; i < 100; i++) {
        atomic_fetch_add(&turns, 1);
        if (writer && i == 5) {
            assert_int_equal(write(urgent_fd[1], "x", 1), 1);
            atomic_store(&turns_at_write, atomic_load(&turns));
        }
        loom__fiber_yield();
    }
}

static void test_pool_loop_first(void **state)
{
    loom_pool_options po = {LOOM_POOL_OPTIONS_VERSION, 1, 0, 64 << 10};
    loom_pool *pool = NULL;
    loom_pool_loop *l = NULL;
    static int one = 1;

    (void)state;
    atomic_store(&turns, 0);
    atomic_store(&turns_at_step, -1);
    assert_int_equal(pipe(urgent_fd), 0);
    assert_int_equal(fcntl(urgent_fd[0], F_SETFL, O_NONBLOCK), 0);
    assert_int_equal(loom_pool_new(&pool, &po), 0);
    assert_int_equal(
        loom_pool_loop_start(&l, pool, urgent_fd[0], urgent_step, NULL), 0);
    for (int i = 0; i < URGENT_BUSY; i++)
        assert_int_equal(
            loom_pool_spawn(pool, urgent_busy, i == 0 ? &one : NULL), 0);
    for (int i = 0; i < 20000 && atomic_load(&turns_at_step) < 0; i++)
        loom__fiber_sleep(1);
    loom_pool_loop_stop(l);
    loom_pool_free(pool);
    close(urgent_fd[0]);
    close(urgent_fd[1]);
    assert_true(atomic_load(&turns_at_step) >= atomic_load(&turns_at_write));
    assert_true(atomic_load(&turns_at_step) - atomic_load(&turns_at_write) <
                URGENT_BUSY);
}

/* ---- where a spawned fiber goes ------------------------------------------ */

typedef struct {
    loom__sched *s;
    int crowd; /* fibers the placer first starts beside itself */
    pthread_t placer, child;
    atomic_int child_ran, release;
} place_check;

static void place_child(void *arg)
{
    place_check *c = arg;

    c->child = pthread_self();
    atomic_store(&c->child_ran, 1);
}

static void place_crowd(void *arg)
{
    place_check *c = arg;

    while (!atomic_load(&c->release))
        loom__fiber_sleep(1);
}

static void placer(void *arg)
{
    place_check *c = arg;

    c->placer = pthread_self();
    for (int i = 0; i < c->crowd; i++)
        assert_int_equal(loom__fiber_spawn(c->s, place_crowd, c, 1), 0);
    assert_int_equal(loom__fiber_spawn(c->s, place_child, c, 0), 0);
    while (!atomic_load(&c->child_ran))
        loom__fiber_sleep(1);
    atomic_store(&c->release, 1);
}

/* A fiber spawned from a worker stays on it (no hand-off to another
 * thread) while that worker is no busier than the least busy one plus
 * one fiber, and goes to the least busy worker past that. */
static void test_spawn_stays_or_spreads(void **state)
{
    for (int crowd = 0; crowd <= 3; crowd += 3) {
        loom__sched *s = start(2, 0);
        place_check c;

        (void)state;
        memset(&c, 0, sizeof(c));
        c.s = s;
        c.crowd = crowd;
        assert_int_equal(loom__fiber_spawn(s, placer, &c, 0), 0);
        loom__sched_stop(s);
        assert_int_equal(atomic_load(&c.child_ran), 1);
        if (crowd == 0)
            assert_true(pthread_equal(c.placer, c.child));
        else
            assert_false(pthread_equal(c.placer, c.child));
    }
}

/* ---- blocking work ------------------------------------------------------- */

static atomic_int bl_active, bl_max;
static pthread_mutex_t bl_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t bl_cv = PTHREAD_COND_INITIALIZER;
static int bl_ran, bl_off_fiber;

static void blocking_job(void *arg)
{
    int now = atomic_fetch_add(&bl_active, 1) + 1, was;

    (void)arg;
    was = atomic_load(&bl_max);
    while (now > was && !atomic_compare_exchange_weak(&bl_max, &was, now))
        ;
    atomic_fetch_sub(&bl_active, 1);
    pthread_mutex_lock(&bl_mu);
    bl_ran++;
    bl_off_fiber += loom__fiber_self() == NULL;
    pthread_cond_signal(&bl_cv);
    pthread_mutex_unlock(&bl_mu);
}

static void test_blocking_is_bounded(void **state)
{
    loom__sched *s = start(1, 2);

    (void)state;
    for (int i = 0; i < 40; i++)
        assert_int_equal(loom__sched_blocking(s, blocking_job, NULL), 0);
    pthread_mutex_lock(&bl_mu);
    while (bl_ran < 40)
        pthread_cond_wait(&bl_cv, &bl_mu);
    pthread_mutex_unlock(&bl_mu);
    loom__sched_stop(s);
    assert_int_equal(bl_off_fiber, 40);
    assert_true(atomic_load(&bl_max) <= 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_many_fibers),
        cmocka_unit_test(test_parent_waits_on_one_worker),
        cmocka_unit_test(test_kept_stacks_run_again),
        cmocka_unit_test(test_cross_thread_wake),
        cmocka_unit_test(test_signal_wakes_each),
        cmocka_unit_test(test_timers_in_deadline_order),
        cmocka_unit_test(test_sleep_parks),
        cmocka_unit_test(test_timer_across_parks),
        cmocka_unit_test(test_cond_wait_times_out),
        cmocka_unit_test(test_cancel_wakes_parked),
        cmocka_unit_test(test_cancel_before_park),
        cmocka_unit_test(test_error_state_per_fiber),
        cmocka_unit_test(test_error_state_fresh_on_kept_stack),
        cmocka_unit_test(test_on_worker),
        cmocka_unit_test(test_wait_fd),
        cmocka_unit_test(test_pool_loop),
        cmocka_unit_test(test_pool_loop_first),
        cmocka_unit_test(test_pool_loop_wakes_not_lost),
        cmocka_unit_test(test_spawn_stays_or_spreads),
        cmocka_unit_test(test_blocking_is_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
