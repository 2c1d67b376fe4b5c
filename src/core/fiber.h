/*
 * core/fiber.h: runs as fibers on a fixed pool of worker threads.
 *
 * A scheduler owns N worker threads. Each runs many fibers (a stack and a
 * saved context each, switched with swapcontext), a ready queue, an epoll
 * loop with an eventfd for wake-ups from other threads, the timers of its
 * parked fibers, and one curl multi handle that every transfer made on its
 * fibers joins (core/http.c). Code on a fiber reads as plain sequential
 * code: where it would block, it parks instead, and its worker runs other
 * fibers meanwhile. A bounded pool of plain threads runs the work that
 * blocks in ways a fiber cannot park on (a tool calling read(2)).
 *
 * Fibers never move between workers, so thread-local storage and pthread
 * mutexes behave as usual on them, with two rules: never park while holding
 * a mutex (another fiber of the same worker would block the whole worker
 * on it), and per-run state must not live in thread-local storage (fibers
 * share their worker's). loom's own error state follows each fiber.
 *
 * The one waiting primitive is loom__cond: a condition variable that parks
 * the caller when it is a fiber and waits on a pthread condition when it is
 * not, so the same library code serves the server (on fibers), the CLI and
 * embedders (on their own threads).
 */
#ifndef LOOM_CORE_FIBER_H
#define LOOM_CORE_FIBER_H

#include "loom/cancel.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* On a helper of a function that stays on a fiber's stack while a model
 * streams (the run loop, the router, the adapter): the helper's locals get
 * their own frame, gone before the call that streams, instead of widening
 * the caller's for the whole stream. A stream's fiber touches its stack
 * pages for as long as it lives (4 KiB of memory each). */
#define LOOM_NOINLINE __attribute__((noinline))

typedef struct loom__sched loom__sched;
typedef struct loom__fiber loom__fiber;

typedef struct {
    int workers;       /* worker threads; 0: the number of cores */
    size_t stack_size; /* bytes per fiber stack; 0: 256 KiB */
    int blocking_max;  /* threads for blocking work; 0: 64 */
} loom__sched_opts;

/* Starts a scheduler and its workers. 0, LOOM_ENOMEM or LOOM_ERROR. */
int loom__sched_start(loom__sched **out, const loom__sched_opts *opts);

/*
 * Stops s: waits until every fiber has returned, then joins the workers.
 * Blocking work still running (a tool call abandoned at its timeout)
 * ends on its own; its threads free what is left of s after it. Must not
 * be called on one of s's fibers or threads. NULL: no-op.
 */
void loom__sched_stop(loom__sched *s);

/* The number of worker threads of s. */
int loom__sched_workers(const loom__sched *s);

/* Fibers alive on s (spawned, not yet returned). */
long loom__sched_fibers(const loom__sched *s);

/*
 * Runs fn(arg) on a new fiber of s: on the caller's worker when the
 * caller is one of s's fibers and `here` is set, else on the next worker
 * in turn. 0, or LOOM_ENOMEM (fn never runs then).
 */
int loom__fiber_spawn(loom__sched *s, void (*fn)(void *), void *arg, int here);

/*
 * Runs fn(arg) on one of s's threads for blocking work, at most
 * blocking_max at once; later ones queue. 0, or LOOM_ENOMEM (fn never
 * runs then).
 */
int loom__sched_blocking(loom__sched *s, void (*fn)(void *), void *arg);

/* The fiber the caller runs on, NULL when it is a plain thread. */
loom__fiber *loom__fiber_self(void);

/* The scheduler of the caller's fiber, NULL off a fiber. */
loom__sched *loom__fiber_sched(void);

/*
 * Parking, for waits built on fibers (loom__cond, the HTTP client).
 * loom__fiber_arm() starts a wait and returns its token; a waker then
 * calls loom__fiber_wake(f, token) (from any thread), and
 * loom__fiber_park() returns once that happened (1) or the monotonic ms
 * `until` passed (0; until < 0: no limit). A wake with an old token is
 * ignored, and a wake that comes before the park makes it return at once.
 * Only on a fiber; a waker must not use f after the fiber's wait ended.
 */
uint64_t loom__fiber_arm(void);
int loom__fiber_park(double until);
void loom__fiber_wake(loom__fiber *f, uint64_t token);

/*
 * loom__fiber_park() that also returns (1) as soon as `cancel` (or one
 * of its parents) is set, by loom_cancel_set() from any thread or a
 * signal handler, or was set before the park. cancel NULL: as
 * loom__fiber_park(). The caller looks at the flag again on return.
 */
int loom__fiber_park_cancel(double until, const loom_cancel *cancel);

/*
 * Parks the calling fiber until descriptor fd is readable (1) or the
 * monotonic ms `until` passed (0; until < 0: no limit), its worker
 * polling fd beside its other work meanwhile: for a loop of its own that
 * a fiber drives, such as a server's HTTP daemon. A worker's fibers wait
 * on at most a few descriptors (the slot stays the fd's until
 * loom__fiber_forget_fd); the caller calls that before closing fd.
 * Negative on failure: LOOM_EINVALID off a fiber, LOOM_ERROR with no
 * slot left, LOOM_EIO when epoll refuses fd.
 */
int loom__fiber_wait_fd(int fd, double until);
void loom__fiber_forget_fd(int fd);

/* Lets the other ready fibers of the worker run; no-op off a fiber. */
void loom__fiber_yield(void);

/*
 * Runs fn(arg) on the stack of the caller's worker thread and returns
 * when it has: for deep code that never parks (SQLite writing a b-tree,
 * say), whose frames would otherwise touch pages of the fiber's stack
 * that then stay resident for the fiber's whole life (and its kept
 * stack's). fn runs as if on a plain thread (loom__fiber_self() is NULL,
 * waits block the worker) with the fiber's error state; the worker runs
 * nothing else meanwhile. Off a fiber: fn(arg), here.
 */
void loom__fiber_on_worker(void (*fn)(void *), void *arg);

/* Sleeps ms milliseconds: parks on a fiber, nanosleep off one. */
void loom__fiber_sleep(long ms);

/* The curl multi handle of the caller's worker (a CURLM *), NULL off a
 * fiber. Transfers added to it must set CURLINFO_PRIVATE to a
 * loom__fiber_xfer, which the worker fills and wakes when they end. */
void *loom__fiber_multi(void);

typedef struct {
    loom__fiber *fiber;
    uint64_t token;
    int done;   /* set by the worker when the transfer ended */
    int result; /* its CURLcode */
} loom__fiber_xfer;

/* ---- loom__cond: a condition variable that parks fibers ------------------ */

typedef struct loom__cond_waiter loom__cond_waiter;

typedef struct {
    pthread_cond_t cv;  /* threads wait here (monotonic clock) */
    pthread_mutex_t lk; /* guards the fiber waiters */
    loom__cond_waiter *head, *tail;
} loom__cond;

/* Makes c. 0, or the pthread error. */
int loom__cond_init(loom__cond *c);

/* Frees c; nobody may be waiting. */
void loom__cond_destroy(loom__cond *c);

/*
 * Waits on c with mu held (released while waiting, held again on
 * return) until signalled or until the monotonic ms `until` (< 0: no
 * limit). 0, or ETIMEDOUT. Spurious wake-ups may happen: wait in a loop
 * on the condition, as with pthread_cond_wait.
 */
int loom__cond_wait(loom__cond *c, pthread_mutex_t *mu, double until);

/* loom__cond_wait() that on a fiber also returns (0) once cancel is set
 * (loom__fiber_park_cancel); off a fiber the same as loom__cond_wait(),
 * so a thread keeps looking at the flag at its own ticks. */
int loom__cond_wait_cancel(loom__cond *c, pthread_mutex_t *mu, double until,
                           const loom_cancel *cancel);

/* Wakes one waiter (a fiber first) / every waiter. Any thread; mu need
 * not be held. */
void loom__cond_signal(loom__cond *c);
void loom__cond_broadcast(loom__cond *c);

#endif
