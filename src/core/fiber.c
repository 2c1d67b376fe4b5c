/*
 * The fiber scheduler (see core/fiber.h for the contract).
 *
 * Why ucontext: glibc's makecontext is enough to start a fiber on its own
 * stack, needs no extra dependency, and sanitizers know it (the switches
 * are annotated below for ASan and TSan). The one coroutine library Debian
 * packages for C (libpcl) is a thin, unmaintained wrapper over the same
 * calls. A fiber is entered once with setcontext; every later switch is
 * sigsetjmp/siglongjmp without the signal mask, since swapcontext makes a
 * system call (rt_sigprocmask) per switch: about nine per served request.
 * A fiber whose function returned stays in its trampoline, so a kept
 * stack (below) runs the next function without a new context.
 *
 * Stacks are mmap'd with a guard page below them, so an overflow faults
 * instead of corrupting a neighbour, and only the pages a fiber touches
 * take memory. A worker keeps the stacks of ended fibers for reuse (at most
 * KEEP_STACKS), taken by whichever thread spawns the next fiber on it: the
 * server spawns runs from its own thread, and a stack mapped and unmapped
 * per run cost a page fault per touched page and, for munmap, a TLB
 * shoot-down on every core running the process.
 *
 * A fiber's state (ready, running, parked) and its wake token change under
 * its worker's lock, which no fiber holds across a switch: a waker on any
 * thread takes it, marks the fiber woken and, when the fiber is already
 * parked, queues it and writes the worker's eventfd if the worker sleeps
 * (a busy one looks at its queue before it sleeps). A wake that arrives
 * while the fiber is still on its way to park is kept (woken is set), and
 * the worker queues the fiber again as soon as it has switched out.
 * Timers are a binary heap per worker, touched only by that worker. A
 * fiber's entry stays in the heap while it runs and parks again (a
 * transfer parks with a timer for every chunk it receives): it moves only
 * when a park asks for an earlier deadline, or when it comes to the top
 * and the fiber's deadline turns out to be later (it is put back there)
 * or gone (it is dropped). With thousands of parked fibers, taking the
 * entry out and putting it back per park was two walks of the heap, each
 * step a cache miss on a fiber.
 *
 * A fiber parked with a cancel flag (loom__fiber_park_cancel) is also on
 * its worker's list of such fibers. loom_cancel_set() ends in
 * loom_cancel_notify(), which must stay async-signal-safe and lock-free
 * (a signal handler or a server's ticker cancels runs): it only marks each
 * worker that has such fibers and writes its eventfd; the worker then
 * readies, under its own lock, those whose flag reads set. The live
 * schedulers are a list that notify walks with plain atomic loads,
 * counted in `live_readers`; a scheduler that stops unlinks itself and
 * waits until no walk is under way before its workers go.
 */
/* siglongjmp to another fiber's stack: glibc's checked longjmp (with
 * _FORTIFY_SOURCE) takes a jump to a lower stack for a smashed one. */
#undef _FORTIFY_SOURCE
#include "core/fiber.h"
#include "core/clock.h"
#include "core/error.h"
#include "loom/cancel.h"
#include "loom/pool.h"

#include <curl/curl.h>
#include <errno.h>
#include <sched.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define FIBER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FIBER_ASAN 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define FIBER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FIBER_TSAN 1
#endif
#endif

#ifdef FIBER_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#ifdef FIBER_TSAN
#include <sanitizer/tsan_interface.h>
#endif

#define DEFAULT_STACK ((size_t)256 << 10)
#define DEFAULT_BLOCKING 64
/* Ended fibers (struct, stack, guard page) a worker keeps for reuse. A
 * kept stack still holds the pages its fiber touched (a run touches a few
 * tens of KiB; at worst the whole stack), so the bound caps that memory
 * per worker (64 x 256 KiB = 16 MiB at the very worst) while covering the
 * swings in the number of live fibers of a worker serving a few hundred
 * requests at once: past it, stacks are unmapped as before. */
#define KEEP_STACKS 64
#define MAX_EVENTS 64
/* Descriptors the fibers of one worker can wait on at once
 * (loom__fiber_wait_fd): a server's HTTP loop, a few at most. */
#define FD_WAITS 4
/* Idle connections a worker's curl multi handle keeps for reuse: as many
 * as it has model calls in flight when busy, or each call past the bound
 * connects again (at concurrency 64, 16 kept made one request in three
 * open a new upstream connection: a connect, a close and the upstream's
 * accept per request, bench/serve/README.md). curl's default grows with
 * the transfers it has seen (four per handle added) without bound; this
 * bound keeps what a burst of thousands of streams leaves behind to 64
 * sockets a worker, which a burst of a few hundred fills at once (so the
 * count stays flat from one burst to the next: test_server_soak); curl
 * closes one found idle for over two minutes (the CURLOPT_MAXAGE_CONN
 * default) or closed by the upstream when it next looks for a
 * connection. */
#define KEEP_CONNECTIONS 64

enum { F_READY, F_RUNNING, F_PARKED };
enum { REQ_NONE, REQ_PARK, REQ_YIELD, REQ_DONE, REQ_CALL };

typedef struct worker worker;

/* A fiber's place in a loom__cond's list while it waits there. */
struct loom__cond_waiter {
    loom__fiber *f; /* NULL once a signal took it off the list */
    uint64_t token;
    loom__cond_waiter *prev, *next;
};

struct loom__fiber {
    /* Its first entry (makecontext), until that switches out: about 1
     * KB that a started fiber no longer needs. */
    ucontext_t *ctx;
    sigjmp_buf jb;  /* where it switched out */
    int started;    /* entered once: its trampoline lives (jb) */
    worker *w;
    void (*fn)(void *);
    void *arg;
    /* What it asked its worker to run on the worker's stack (REQ_CALL). */
    void (*call)(void *);
    void *call_arg;
    char *map; /* the mapping: guard page, then the stack */
    size_t map_len;
    int state; /* F_*, under w->lock */
    int req;   /* what the fiber asked of its worker when it switched */
    uint64_t token;
    int woken;
    /* Woken to the front of the ready queue (a caller's loop on the
     * worker, loom_pool_loop_start): under load it answers its events
     * before the runs' next turns, not after them all. */
    int urgent;
    double deadline; /* parked until (monotonic ms); < 0: no timer */
    /* Index in w->heap + 1; 0: not there. An entry's deadline is never
     * later than the fiber's while it is parked with one (see the top). */
    size_t heap_i;
    loom__fiber *next;
    loom__cond_waiter cw; /* one wait at a time */
    /* The flag that ends the current park (loom__fiber_park_cancel), and
     * the fiber's place in w->cancel_head's list while parked with one
     * (under w->lock). */
    const loom_cancel *cancel;
    loom__fiber *cprev, *cnext;
    int clisted;
    /* Its error state: made at its first error, freed when it ends (a
     * stream that never fails carries no message buffer). */
    loom__error_state *err;
#ifdef FIBER_TSAN
    void *tsan;
#endif
};

/* A timer: the deadline is kept beside its fiber, so that the heap's
 * comparisons read the heap only (with thousands of parked fibers, each
 * read of a fiber's own deadline was a cache miss). */
typedef struct {
    double deadline;
    loom__fiber *f;
} heap_ent;

struct worker {
    loom__sched *s;
    pthread_t th;
    pthread_mutex_t lock; /* ready queue and fiber states */
    loom__fiber *rq_head, *rq_tail;
    int efd, ep;
    sigjmp_buf main_jb; /* the worker loop, while a fiber runs */
    loom__fiber *cur;
    heap_ent *heap;
    size_t nheap, capheap;
    CURLM *multi;
    double curl_at;     /* when curl wants its timeout action; < 0: never */
    loom__fiber *spare; /* ended fibers kept for their stacks; under lock */
    int nspare;
    loom__fiber *cancel_head; /* parked with a cancel flag; under lock */
    atomic_int ncancel;       /* how many (read by loom_cancel_notify) */
    atomic_int cancel_check;  /* a flag was set: look at the list */
    /* About to wait or waiting in epoll_wait (see kick). */
    atomic_int asleep;
    /* Fibers alive on it (spawned, not yet returned): where the next
     * one goes (pick_worker). */
    atomic_int live;
    /* Descriptors waited on (loom__fiber_wait_fd); only this worker
     * touches them. fd < 0: a free slot. */
    struct {
        int fd;
        loom__fiber *f; /* NULL: nobody waits now */
        uint64_t token;
    } fdw[FD_WAITS];
#ifdef FIBER_ASAN
    const void *main_bottom;
    size_t main_size;
#endif
#ifdef FIBER_TSAN
    void *tsan_main;
#endif
};

typedef struct job {
    void (*fn)(void *);
    void *arg;
    struct job *next;
} job;

struct loom__sched {
    worker *w;
    int nw;
    size_t stack_size;
    atomic_uint next_w;
    atomic_long fibers;
    atomic_int stopping;
    /* blocking work */
    pthread_mutex_t bl_lock;
    pthread_cond_t bl_cv;
    job *bl_head, *bl_tail;
    int bl_max, bl_threads, bl_idle, bl_queued;
    /* The stopper's and each blocking thread's: a blocking job that never
     * ends must not hang the stop, so those threads are detached and the
     * last one out frees s. */
    atomic_int refs;
    _Atomic(loom__sched *) live_next; /* in the live list */
};

static _Thread_local worker *tl_worker;

/* The live schedulers (see the top): changed under live_mu, walked by
 * loom_cancel_notify without it. */
static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(loom__sched *) live_head;
static atomic_int live_readers;

static size_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);

    return p > 0 ? (size_t)p : 4096;
}

/* ---- switching ----------------------------------------------------------- */

#ifdef FIBER_TSAN
#define TSAN_FIBER(x) (x)
#else
#define TSAN_FIBER(x) NULL
#endif

/*
 * Saves the caller's context in from and goes on at to (or enters fresh,
 * a fiber's first entry); returns when something jumps back to from.
 * TSan's state switches to tsan_to between the save and the jump: it
 * finds a jump buffer in the state that saved it. A function of its
 * own, so that no caller's local lives across the sigsetjmp that returns
 * twice.
 */
__attribute__((noinline)) static void jump(sigjmp_buf *from, sigjmp_buf *to,
                                           ucontext_t *fresh, void *tsan_to)
{
    if (sigsetjmp(*from, 0) != 0)
        return;
#ifdef FIBER_TSAN
    __tsan_switch_to_fiber(tsan_to, 0);
#else
    (void)tsan_to;
#endif
    if (fresh)
        setcontext(fresh);
    else
        siglongjmp(*to, 1);
}

/* From the worker's own context into f. */
static void switch_in(worker *w, loom__fiber *f)
{
    /* A first entry's context, freed once back (after the sanitizer's
     * switch is complete). */
    ucontext_t *first = NULL;
#ifdef FIBER_ASAN
    void *fake = NULL;
    size_t pg = page_size();
    __sanitizer_start_switch_fiber(&fake, f->map + pg, f->map_len - pg);
#endif
    w->cur = f;
    loom__error_use(&f->err);
    if (f->started) {
        jump(&w->main_jb, &f->jb, NULL, TSAN_FIBER(f->tsan));
    } else {
        f->started = 1;
        first = f->ctx;
        f->ctx = NULL;
        jump(&w->main_jb, NULL, first, TSAN_FIBER(f->tsan));
    }
    loom__error_use(NULL);
    w->cur = NULL;
#ifdef FIBER_ASAN
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
    free(first);
}

/* From fiber f back to its worker's context, having set f->req. */
static void switch_out(loom__fiber *f)
{
    worker *w = f->w;
#ifdef FIBER_ASAN
    /* Its fake stack is kept also when its function returned: the
     * trampoline goes on there with the next one (a stack unmapped
     * instead leaves it behind, with detect_stack_use_after_return). */
    void *fake = NULL;
    __sanitizer_start_switch_fiber(&fake, w->main_bottom, w->main_size);
#endif
    jump(&f->jb, &w->main_jb, NULL, TSAN_FIBER(w->tsan_main));
#ifdef FIBER_ASAN
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#endif
}

/* A fiber's life: its function, then the next one given to its kept
 * stack (fiber_prepare), and so on until the stack is unmapped. Fibers
 * never move between workers. */
static void trampoline(void)
{
    worker *w = tl_worker;
    loom__fiber *f = w->cur;

#ifdef FIBER_ASAN
    __sanitizer_finish_switch_fiber(NULL, &w->main_bottom, &w->main_size);
#endif
    for (;;) {
        f->fn(f->arg);
        f->req = REQ_DONE;
        switch_out(f);
    }
}

/* ---- timers (worker only) ------------------------------------------------ */

static int heap_less(worker *w, size_t a, size_t b)
{
    return w->heap[a].deadline < w->heap[b].deadline;
}

static void heap_swap(worker *w, size_t a, size_t b)
{
    heap_ent t = w->heap[a];

    w->heap[a] = w->heap[b];
    w->heap[b] = t;
    w->heap[a].f->heap_i = a + 1;
    w->heap[b].f->heap_i = b + 1;
}

static void heap_fix(worker *w, size_t i)
{
    while (i > 0 && heap_less(w, i, (i - 1) / 2)) {
        heap_swap(w, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < w->nheap && heap_less(w, l, m))
            m = l;
        if (r < w->nheap && heap_less(w, r, m))
            m = r;
        if (m == i)
            return;
        heap_swap(w, i, m);
        i = m;
    }
}

static int heap_add(worker *w, loom__fiber *f)
{
    if (w->nheap == w->capheap) {
        size_t c = w->capheap ? w->capheap * 2 : 64;
        heap_ent *h = realloc(w->heap, c * sizeof(*h));
        if (!h)
            return -1;
        w->heap = h;
        w->capheap = c;
    }
    w->heap[w->nheap].deadline = f->deadline;
    w->heap[w->nheap].f = f;
    f->heap_i = ++w->nheap;
    heap_fix(w, w->nheap - 1);
    return 0;
}

static void heap_remove(worker *w, loom__fiber *f)
{
    size_t i = f->heap_i - 1;

    f->heap_i = 0;
    if (i != --w->nheap) {
        w->heap[i] = w->heap[w->nheap];
        w->heap[i].f->heap_i = i + 1;
        heap_fix(w, i);
    }
}

/* Makes sure f, parking with a deadline, is woken by then: its entry is
 * added, or moved up when it was later; one that is earlier stays (the
 * top of the heap puts it back). 0, or -1 when out of memory. */
static int timer_set(worker *w, loom__fiber *f)
{
    size_t i = f->heap_i - 1;

    if (!f->heap_i)
        return heap_add(w, f);
    if (f->deadline < w->heap[i].deadline) {
        w->heap[i].deadline = f->deadline;
        heap_fix(w, i);
    }
    return 0;
}

/* ---- queues -------------------------------------------------------------- */

/* Writes w's eventfd: its epoll_wait returns. */
static void kick_always(worker *w)
{
    uint64_t one = 1;

    (void)!write(w->efd, &one, sizeof(one));
}

/*
 * Wakes w after a fiber was queued on it (under w->lock): only a worker
 * that is asleep, or on its way there, needs the eventfd, and one write
 * is enough until it wakes up. A busy worker looks at its queue before
 * it sleeps: it sets asleep first and then reads the queue under the
 * lock, so either it sees the fiber or this sees asleep set.
 */
static void kick(worker *w)
{
    if (tl_worker != w && atomic_exchange(&w->asleep, 0))
        kick_always(w);
}

/* Queues f as ready; w->lock held. */
static void push_ready(worker *w, loom__fiber *f)
{
    f->state = F_READY;
    f->next = NULL;
    if (w->rq_tail)
        w->rq_tail->next = f;
    else
        w->rq_head = f;
    w->rq_tail = f;
}

/* Queues woken f as ready: at the front when urgent; w->lock held. */
static void push_woken(worker *w, loom__fiber *f)
{
    if (!f->urgent || !w->rq_head) {
        push_ready(w, f);
        return;
    }
    f->state = F_READY;
    f->next = w->rq_head;
    w->rq_head = f;
}

/* Queues parked f as ready, off the cancel list; w->lock held. */
static void unpark(worker *w, loom__fiber *f)
{
    if (f->clisted) {
        if (f->cprev)
            f->cprev->cnext = f->cnext;
        else
            w->cancel_head = f->cnext;
        if (f->cnext)
            f->cnext->cprev = f->cprev;
        f->cprev = f->cnext = NULL;
        f->clisted = 0;
        atomic_fetch_sub(&w->ncancel, 1);
    }
    push_woken(w, f);
}

/* Parks f; w->lock held. On w's cancel list when it waits on a flag. */
static void park_locked(worker *w, loom__fiber *f)
{
    f->state = F_PARKED;
    if (!f->cancel)
        return;
    f->cprev = NULL;
    f->cnext = w->cancel_head;
    if (w->cancel_head)
        w->cancel_head->cprev = f;
    w->cancel_head = f;
    f->clisted = 1;
    atomic_fetch_add(&w->ncancel, 1);
}

/* Readies the fibers of w parked on a flag that is now set. */
static void wake_cancelled(worker *w)
{
    loom__fiber *f, *next;

    pthread_mutex_lock(&w->lock);
    for (f = w->cancel_head; f; f = next) {
        next = f->cnext;
        if (loom_cancel_is_set(f->cancel)) {
            f->woken = 1;
            unpark(w, f);
        }
    }
    pthread_mutex_unlock(&w->lock);
}

static loom__fiber *pop_ready(worker *w)
{
    loom__fiber *f;

    pthread_mutex_lock(&w->lock);
    f = w->rq_head;
    if (f) {
        w->rq_head = f->next;
        if (!w->rq_head)
            w->rq_tail = NULL;
        f->state = F_RUNNING;
    }
    pthread_mutex_unlock(&w->lock);
    return f;
}

/* ---- fibers -------------------------------------------------------------- */

static void fiber_free(loom__fiber *f)
{
    if (!f)
        return;
#ifdef FIBER_TSAN
    if (f->tsan)
        __tsan_destroy_fiber(f->tsan);
#endif
    if (f->map)
        munmap(f->map, f->map_len);
    free(f->ctx);
    loom__error_release(&f->err);
    free(f);
}

static loom__fiber *fiber_new(loom__sched *s)
{
    size_t pg = page_size();
    loom__fiber *f = calloc(1, sizeof(*f));

    if (!f)
        return NULL;
    f->map_len = ((s->stack_size + pg - 1) / pg) * pg + pg;
    f->map =
        mmap(NULL, f->map_len, PROT_READ | PROT_WRITE,
             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        free(f);
        return NULL;
    }
    if (mprotect(f->map, pg, PROT_NONE) != 0) {
        fiber_free(f);
        return NULL;
    }
    return f;
}

/* getcontext() apart, so that no local of the caller lives across a call
 * that returns twice (it never does here: makecontext follows). */
__attribute__((noinline)) static int get_context(ucontext_t *c)
{
    return getcontext(c);
}

/* Sets f up to start fn(arg) on w; w's thread or before it owns f. A
 * kept fiber (started) is already in its trampoline, on w. */
static int fiber_prepare(worker *w, loom__fiber *f, void (*fn)(void *),
                         void *arg)
{
    size_t pg = page_size();

    if (!f->started) {
        if (!f->ctx && !(f->ctx = malloc(sizeof(*f->ctx))))
            return -1;
        if (get_context(f->ctx) != 0)
            return -1;
        f->ctx->uc_stack.ss_sp = f->map + pg;
        f->ctx->uc_stack.ss_size = f->map_len - pg;
        f->ctx->uc_link = NULL;
        makecontext(f->ctx, trampoline, 0);
    }
    f->w = w;
    f->fn = fn;
    f->arg = arg;
    f->token = 0;
    f->woken = 0;
    f->urgent = 0;
    f->deadline = -1;
    f->heap_i = 0;
    f->req = REQ_NONE;
    f->cancel = NULL;
    loom__error_release(&f->err);
#ifdef FIBER_TSAN
    if (!f->tsan)
        f->tsan = __tsan_create_fiber(0);
#endif
    return 0;
}

/* f's function returned: its stack is kept for the next fiber of w (it
 * stays in its trampoline), or unmapped. */
static void fiber_ended(worker *w, loom__fiber *f)
{
    loom__error_release(&f->err);
    pthread_mutex_lock(&w->lock);
    if (w->nspare < KEEP_STACKS) {
        f->next = w->spare;
        w->spare = f;
        w->nspare++;
        f = NULL;
    }
    pthread_mutex_unlock(&w->lock);
    fiber_free(f);
    atomic_fetch_sub(&w->live, 1);
    atomic_fetch_sub(&w->s->fibers, 1);
}

/*
 * Where a fiber spawned without `here` goes: the worker with the fewest
 * live fibers (the next in turn among equals), except that a caller on
 * one of s's workers (a fiber, or code its loop runs, such as a server's
 * request handlers) keeps it unless its own worker has more than one
 * fiber over that least. At one request at a time a server's run then
 * starts on the worker that took the request and answers there, without
 * handing the request to another thread and the answer back (each hand-
 * off wakes a sleeping thread: tens of microseconds on a virtual
 * machine), while many requests still spread over every worker.
 */
static worker *pick_worker(loom__sched *s)
{
    unsigned start = atomic_fetch_add(&s->next_w, 1);
    worker *best = NULL;
    int least = 0;

    for (int i = 0; i < s->nw; i++) {
        worker *w = &s->w[(start + (unsigned)i) % (unsigned)s->nw];
        int n = atomic_load(&w->live);
        if (!best || n < least) {
            best = w;
            least = n;
        }
    }
    if (tl_worker && tl_worker->s == s &&
        atomic_load(&tl_worker->live) <= least + 1)
        return tl_worker;
    return best;
}

int loom__fiber_spawn(loom__sched *s, void (*fn)(void *), void *arg, int here)
{
    worker *w;
    loom__fiber *f = NULL;

    if (here && tl_worker && tl_worker->s == s && tl_worker->cur)
        w = tl_worker;
    else
        w = pick_worker(s);
    pthread_mutex_lock(&w->lock);
    if (w->spare) {
        f = w->spare;
        w->spare = f->next;
        w->nspare--;
    }
    pthread_mutex_unlock(&w->lock);
    if (!f && !(f = fiber_new(s)))
        return loom__error_oom();
    if (fiber_prepare(w, f, fn, arg) != 0) {
        fiber_free(f);
        return loom__error_set(LOOM_ERROR, "cannot make a fiber context");
    }
    atomic_fetch_add(&s->fibers, 1);
    atomic_fetch_add(&w->live, 1);
    pthread_mutex_lock(&w->lock);
    push_ready(w, f);
    pthread_mutex_unlock(&w->lock);
    kick(w);
    return 0;
}

loom__fiber *loom__fiber_self(void)
{
    return tl_worker ? tl_worker->cur : NULL;
}

loom__sched *loom__fiber_sched(void)
{
    return tl_worker && tl_worker->cur ? tl_worker->s : NULL;
}

uint64_t loom__fiber_arm(void)
{
    loom__fiber *f = loom__fiber_self();
    uint64_t token;

    pthread_mutex_lock(&f->w->lock);
    token = ++f->token;
    f->woken = 0;
    pthread_mutex_unlock(&f->w->lock);
    return token;
}

int loom__fiber_park(double until)
{
    return loom__fiber_park_cancel(until, NULL);
}

int loom__fiber_park_cancel(double until, const loom_cancel *cancel)
{
    loom__fiber *f = loom__fiber_self();

    f->deadline = until;
    f->cancel = cancel;
    f->req = REQ_PARK;
    switch_out(f);
    f->cancel = NULL;
    return f->woken;
}

void loom__fiber_wake(loom__fiber *f, uint64_t token)
{
    worker *w = f->w;
    int queued = 0;

    pthread_mutex_lock(&w->lock);
    if (token == f->token && !f->woken) {
        f->woken = 1;
        if (f->state == F_PARKED) {
            unpark(w, f);
            queued = 1;
        }
    }
    pthread_mutex_unlock(&w->lock);
    if (queued)
        kick(w);
}

void loom__fiber_yield(void)
{
    loom__fiber *f = loom__fiber_self();

    if (!f)
        return;
    f->req = REQ_YIELD;
    switch_out(f);
}

void loom__fiber_sleep(long ms)
{
    struct timespec ts;

    if (ms <= 0)
        return;
    if (loom__fiber_self()) {
        double until = loom__mono_ms_exact() + (double)ms;
        (void)loom__fiber_arm();
        while (loom__fiber_park(until) && loom__mono_ms_exact() < until)
            (void)loom__fiber_arm();
        return;
    }
    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (ms % 1000) * 1000000L;
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

void loom__fiber_on_worker(void (*fn)(void *), void *arg)
{
    loom__fiber *f = loom__fiber_self();

    if (!f) {
        fn(arg);
        return;
    }
    f->call = fn;
    f->call_arg = arg;
    f->req = REQ_CALL;
    switch_out(f);
}

/* loom__fiber_wait_fd on a fiber, with the token the caller armed: a
 * wake with it (loom__fiber_wake) also ends the wait. */
static int wait_fd_armed(int fd, double until, uint64_t token)
{
    worker *w = tl_worker;
    loom__fiber *f = loom__fiber_self();
    struct epoll_event ev = {0};
    int i, fresh = 0, woken;

    for (i = 0; i < FD_WAITS && w->fdw[i].fd != fd; i++)
        ;
    if (i == FD_WAITS) {
        for (i = 0; i < FD_WAITS && w->fdw[i].fd >= 0; i++)
            ;
        if (i == FD_WAITS)
            return loom__error_set(LOOM_ERROR,
                                   "more than %d descriptors "
                                   "waited on by one worker",
                                   FD_WAITS);
        fresh = 1;
    }
    /* One-shot: an event after this wait ended is not delivered again
     * and again to a worker that no longer cares; the next wait arms it
     * afresh. */
    ev.events = EPOLLIN | EPOLLONESHOT;
    ev.data.fd = fd;
    if (epoll_ctl(w->ep, fresh ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, fd, &ev) != 0)
        return loom__error_set(LOOM_EIO, "cannot wait on descriptor %d: %s", fd,
                               strerror(errno));
    w->fdw[i].fd = fd;
    w->fdw[i].token = token;
    w->fdw[i].f = f;
    woken = loom__fiber_park(until);
    w->fdw[i].f = NULL;
    return woken;
}

int loom__fiber_wait_fd(int fd, double until)
{
    if (!loom__fiber_self())
        return loom__error_set(LOOM_EINVALID, "waiting on a descriptor "
                                              "off a fiber");
    return wait_fd_armed(fd, until, loom__fiber_arm());
}

void loom__fiber_forget_fd(int fd)
{
    worker *w = tl_worker;

    for (int i = 0; w && i < FD_WAITS; i++)
        if (w->fdw[i].fd == fd) {
            (void)epoll_ctl(w->ep, EPOLL_CTL_DEL, fd, NULL);
            w->fdw[i].fd = -1;
            w->fdw[i].f = NULL;
        }
}

/* An event on a descriptor a fiber of w waits on: that fiber is woken
 * (1). 0: not one of those (a curl socket). */
static int fd_event(worker *w, int fd)
{
    for (int i = 0; i < FD_WAITS; i++)
        if (w->fdw[i].fd == fd) {
            if (w->fdw[i].f)
                loom__fiber_wake(w->fdw[i].f, w->fdw[i].token);
            return 1;
        }
    return 0;
}

void *loom__fiber_multi(void)
{
    return tl_worker && tl_worker->cur ? tl_worker->multi : NULL;
}

/* ---- curl on epoll ------------------------------------------------------- */

static int on_curl_socket(CURL *e, curl_socket_t fd, int what, void *ud,
                          void *sockp)
{
    worker *w = ud;
    struct epoll_event ev = {0};

    (void)e;
    if (what == CURL_POLL_REMOVE) {
        epoll_ctl(w->ep, EPOLL_CTL_DEL, fd, NULL);
        curl_multi_assign(w->multi, fd, NULL);
        return 0;
    }
    ev.events = (what & CURL_POLL_IN ? EPOLLIN : 0) |
                (what & CURL_POLL_OUT ? EPOLLOUT : 0);
    ev.data.fd = fd;
    if (sockp) {
        epoll_ctl(w->ep, EPOLL_CTL_MOD, fd, &ev);
    } else {
        if (epoll_ctl(w->ep, EPOLL_CTL_ADD, fd, &ev) != 0 && errno == EEXIST)
            epoll_ctl(w->ep, EPOLL_CTL_MOD, fd, &ev);
        curl_multi_assign(w->multi, fd, w);
    }
    return 0;
}

static int on_curl_timer(CURLM *m, long ms, void *ud)
{
    worker *w = ud;

    (void)m;
    w->curl_at = ms < 0 ? -1 : loom__mono_ms_exact() + (double)ms;
    return 0;
}

/* Wakes the fibers whose transfers ended. */
static void curl_done(worker *w)
{
    CURLMsg *msg;
    int q;

    while ((msg = curl_multi_info_read(w->multi, &q)) != NULL) {
        loom__fiber_xfer *x = NULL;
        if (msg->msg != CURLMSG_DONE)
            continue;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&x);
        if (!x)
            continue;
        x->done = 1;
        x->result = (int)msg->data.result;
        loom__fiber_wake(x->fiber, x->token);
    }
}

/* ---- the worker loop ----------------------------------------------------- */

/* Runs libcurl's timer action when it is due. */
static void curl_due(worker *w)
{
    int running;

    if (w->curl_at < 0 || loom__mono_ms_exact() < w->curl_at)
        return;
    w->curl_at = -1;
    curl_multi_socket_action(w->multi, CURL_SOCKET_TIMEOUT, 0, &running);
}

static void run_fiber(worker *w, loom__fiber *f)
{
    f->req = REQ_NONE;
    switch_in(w, f);
    while (f->req == REQ_CALL) {
        /* Not on the fiber (w->cur is NULL: waits block the thread), but
         * with its error state. */
        loom__error_state **was = loom__error_use(&f->err);

        f->call(f->call_arg);
        loom__error_use(was);
        f->req = REQ_NONE;
        switch_in(w, f);
    }
    switch (f->req) {
    case REQ_DONE:
        if (f->heap_i)
            heap_remove(w, f);
        fiber_ended(w, f);
        break;
    case REQ_YIELD:
        pthread_mutex_lock(&w->lock);
        push_ready(w, f);
        pthread_mutex_unlock(&w->lock);
        break;
    default: /* REQ_PARK */
        pthread_mutex_lock(&w->lock);
        if (f->woken) {
            push_woken(w, f);
        } else {
            /* On the list (counted) first, then the flag looked at:
             * loom_cancel_notify sets the flag, then reads the count, so
             * one of the two sees the other. */
            park_locked(w, f);
            if (f->cancel && loom_cancel_is_set(f->cancel)) {
                f->woken = 1;
                unpark(w, f);
            } else if (f->deadline >= 0 && timer_set(w, f) != 0) {
                /* Out of memory for the timer: the fiber wakes at once
                 * and its caller waits again (a spurious wake-up). */
                unpark(w, f);
            }
        }
        pthread_mutex_unlock(&w->lock);
        break;
    }
}

/* Wakes the fibers whose timers passed; returns ms to the next one (-1:
 * none). An entry that comes due for a fiber parked until later goes
 * back with that deadline; one for a fiber parked without a timer, or
 * not parked (it sets its timer again when it parks), is dropped. */
static int expire(worker *w)
{
    double now = loom__mono_ms_exact(), next = -1;
    int ms;

    while (w->nheap && w->heap[0].deadline <= now) {
        loom__fiber *f = w->heap[0].f;
        int parked;
        pthread_mutex_lock(&w->lock);
        parked = f->state == F_PARKED;
        if (parked && f->deadline >= 0 && f->deadline <= now)
            unpark(w, f);
        pthread_mutex_unlock(&w->lock);
        if (parked && f->deadline > now) {
            w->heap[0].deadline = f->deadline;
            heap_fix(w, 0);
        } else {
            heap_remove(w, f);
        }
    }
    if (w->nheap)
        next = w->heap[0].deadline;
    if (w->curl_at >= 0 && (next < 0 || w->curl_at < next))
        next = w->curl_at;
    if (next < 0)
        return -1;
    ms = (int)(next - now + 0.999);
    return ms < 0 ? 0 : ms;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    loom__sched *s = w->s;
    struct epoll_event evs[MAX_EVENTS];
    int running;

    tl_worker = w;
#ifdef FIBER_TSAN
    w->tsan_main = __tsan_get_current_fiber();
#endif
    for (;;) {
        loom__fiber *f;
        int timeout, n, ready;
        /* Only the fibers ready now: one that yields runs again after the
         * events are looked at. */
        pthread_mutex_lock(&w->lock);
        f = w->rq_tail;
        pthread_mutex_unlock(&w->lock);
        if (f) {
            loom__fiber *g;
            while ((g = pop_ready(w)) != NULL) {
                run_fiber(w, g);
                if (g == f)
                    break;
            }
        }
        if (atomic_load(&s->stopping) && atomic_load(&s->fibers) == 0)
            break;
        if (atomic_exchange(&w->cancel_check, 0))
            wake_cancelled(w);
        /* A transfer a fiber just started asks libcurl's timer for 0
         * ms: run it now, not after a poll that only finds it due. */
        curl_due(w);
        curl_done(w);
        timeout = expire(w);
        atomic_store(&w->asleep, 1);
        pthread_mutex_lock(&w->lock);
        ready = w->rq_head != NULL;
        pthread_mutex_unlock(&w->lock);
        if (ready) {
            atomic_store(&w->asleep, 0);
            timeout = 0;
        } else if (atomic_load(&s->stopping) && (timeout < 0 || timeout > 50))
            timeout = 50; /* looks at the fiber count again */
        n = epoll_wait(w->ep, evs, MAX_EVENTS, timeout);
        atomic_store(&w->asleep, 0);
        for (int i = 0; i < n; i++) {
            int fd = evs[i].data.fd, mask = 0;
            if (fd == w->efd) {
                uint64_t v;
                (void)!read(w->efd, &v, sizeof(v));
                continue;
            }
            if (fd_event(w, fd))
                continue;
            if (evs[i].events & (EPOLLIN | EPOLLHUP))
                mask |= CURL_CSELECT_IN;
            if (evs[i].events & EPOLLOUT)
                mask |= CURL_CSELECT_OUT;
            if (evs[i].events & EPOLLERR)
                mask |= CURL_CSELECT_ERR;
            curl_multi_socket_action(w->multi, fd, mask, &running);
        }
        curl_due(w);
        curl_done(w);
        (void)expire(w);
    }
    tl_worker = NULL;
    return NULL;
}

/* ---- blocking work ------------------------------------------------------- */

static void sched_unref(loom__sched *s)
{
    if (atomic_fetch_sub(&s->refs, 1) != 1)
        return;
    pthread_cond_destroy(&s->bl_cv);
    pthread_mutex_destroy(&s->bl_lock);
    free(s->w);
    free(s);
}

static void *blocking_main(void *arg)
{
    loom__sched *s = arg;
    job *j;

    pthread_mutex_lock(&s->bl_lock);
    for (;;) {
        while (!s->bl_head && !atomic_load(&s->stopping)) {
            s->bl_idle++;
            pthread_cond_wait(&s->bl_cv, &s->bl_lock);
            s->bl_idle--;
        }
        if (!(j = s->bl_head))
            break;
        s->bl_head = j->next;
        if (!s->bl_head)
            s->bl_tail = NULL;
        s->bl_queued--;
        pthread_mutex_unlock(&s->bl_lock);
        j->fn(j->arg);
        free(j);
        pthread_mutex_lock(&s->bl_lock);
    }
    pthread_mutex_unlock(&s->bl_lock);
    sched_unref(s);
    return NULL;
}

/* Starts a blocking thread; s->bl_lock held. 0, or -1. */
static int blocking_thread(loom__sched *s)
{
    pthread_attr_t attr;
    pthread_t th;
    int rc;

    if (pthread_attr_init(&attr) != 0)
        return -1;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    atomic_fetch_add(&s->refs, 1);
    rc = pthread_create(&th, &attr, blocking_main, s);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        atomic_fetch_sub(&s->refs, 1);
        return -1;
    }
    s->bl_threads++;
    return 0;
}

int loom__sched_blocking(loom__sched *s, void (*fn)(void *), void *arg)
{
    job *j = calloc(1, sizeof(*j));

    if (!j)
        return loom__error_oom();
    j->fn = fn;
    j->arg = arg;
    pthread_mutex_lock(&s->bl_lock);
    /* A thread more unless enough idle ones are there for the queue. */
    if (s->bl_idle <= s->bl_queued && s->bl_threads < s->bl_max)
        (void)blocking_thread(s);
    if (s->bl_threads == 0) {
        /* No thread would ever take it. */
        pthread_mutex_unlock(&s->bl_lock);
        free(j);
        return loom__error_set(LOOM_ERROR, "cannot start a thread");
    }
    if (s->bl_tail)
        s->bl_tail->next = j;
    else
        s->bl_head = j;
    s->bl_tail = j;
    s->bl_queued++;
    pthread_cond_signal(&s->bl_cv);
    pthread_mutex_unlock(&s->bl_lock);
    return 0;
}

/* ---- the scheduler ------------------------------------------------------- */

static void live_add(loom__sched *s)
{
    pthread_mutex_lock(&live_mu);
    atomic_store(&s->live_next, atomic_load(&live_head));
    atomic_store(&live_head, s);
    pthread_mutex_unlock(&live_mu);
}

/* Takes s off the live list (if there) and waits until no
 * loom_cancel_notify still looks at it. */
static void live_remove(loom__sched *s)
{
    _Atomic(loom__sched *) *at;

    pthread_mutex_lock(&live_mu);
    for (at = &live_head; atomic_load(at); at = &atomic_load(at)->live_next)
        if (atomic_load(at) == s) {
            atomic_store(at, atomic_load(&s->live_next));
            break;
        }
    pthread_mutex_unlock(&live_mu);
    while (atomic_load(&live_readers) > 0)
        sched_yield();
}

static int worker_init(worker *w, loom__sched *s)
{
    struct epoll_event ev = {0};

    w->s = s;
    w->efd = w->ep = -1;
    for (int i = 0; i < FD_WAITS; i++)
        w->fdw[i].fd = -1;
    w->curl_at = -1;
    if (pthread_mutex_init(&w->lock, NULL) != 0)
        return -1;
    if ((w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0 ||
        (w->ep = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
        !(w->multi = curl_multi_init()))
        return -1;
    ev.events = EPOLLIN;
    ev.data.fd = w->efd;
    if (epoll_ctl(w->ep, EPOLL_CTL_ADD, w->efd, &ev) != 0)
        return -1;
    curl_multi_setopt(w->multi, CURLMOPT_SOCKETFUNCTION, on_curl_socket);
    curl_multi_setopt(w->multi, CURLMOPT_SOCKETDATA, w);
    curl_multi_setopt(w->multi, CURLMOPT_TIMERFUNCTION, on_curl_timer);
    curl_multi_setopt(w->multi, CURLMOPT_TIMERDATA, w);
    curl_multi_setopt(w->multi, CURLMOPT_MAXCONNECTS, (long)KEEP_CONNECTIONS);
    return 0;
}

static void worker_clear(worker *w)
{
    while (w->spare) {
        loom__fiber *f = w->spare;
        w->spare = f->next;
        fiber_free(f);
    }
    if (w->multi)
        curl_multi_cleanup(w->multi);
    if (w->ep >= 0)
        close(w->ep);
    if (w->efd >= 0)
        close(w->efd);
    free(w->heap);
    pthread_mutex_destroy(&w->lock);
}

int loom__sched_start(loom__sched **out, const loom__sched_opts *opts)
{
    loom__sched *s;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n = opts && opts->workers > 0 ? opts->workers
            : cores > 0               ? (int)cores
                                      : 1;
    int started = 0;

    *out = NULL;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return loom__error_set(LOOM_ERROR, "libcurl failed to start");
    if (!(s = calloc(1, sizeof(*s))) ||
        !(s->w = calloc((size_t)n, sizeof(worker)))) {
        free(s);
        return loom__error_oom();
    }
    s->nw = n;
    s->stack_size = opts && opts->stack_size ? opts->stack_size : DEFAULT_STACK;
    s->bl_max =
        opts && opts->blocking_max > 0 ? opts->blocking_max : DEFAULT_BLOCKING;
    atomic_init(&s->refs, 1);
    pthread_mutex_init(&s->bl_lock, NULL);
    pthread_cond_init(&s->bl_cv, NULL);
    for (int i = 0; i < n; i++) {
        if (worker_init(&s->w[i], s) != 0 ||
            pthread_create(&s->w[i].th, NULL, worker_main, &s->w[i]) != 0) {
            worker_clear(&s->w[i]);
            break;
        }
        started++;
    }
    if (started < n) {
        s->nw = started;
        loom__sched_stop(s);
        return loom__error_set(LOOM_ERROR, "cannot start the fiber workers");
    }
    live_add(s);
    *out = s;
    return 0;
}

void loom__sched_stop(loom__sched *s)
{
    if (!s)
        return;
    atomic_store(&s->stopping, 1);
    for (int i = 0; i < s->nw; i++)
        kick_always(&s->w[i]);
    for (int i = 0; i < s->nw; i++)
        pthread_join(s->w[i].th, NULL);
    /* Cancels reach the fibers until the last one ended. */
    live_remove(s);
    for (int i = 0; i < s->nw; i++)
        worker_clear(&s->w[i]);
    /* Blocking threads end once the queue is empty. */
    pthread_mutex_lock(&s->bl_lock);
    pthread_cond_broadcast(&s->bl_cv);
    pthread_mutex_unlock(&s->bl_lock);
    sched_unref(s);
}

int loom__sched_workers(const loom__sched *s)
{
    return s->nw;
}

long loom__sched_fibers(const loom__sched *s)
{
    return atomic_load(&((loom__sched *)s)->fibers);
}

/* ---- loom__cond ---------------------------------------------------------- */

int loom__cond_init(loom__cond *c)
{
    int rc;

    c->head = c->tail = NULL;
    if ((rc = pthread_mutex_init(&c->lk, NULL)) != 0)
        return rc;
    if ((rc = loom__cond_init_mono(&c->cv)) != 0)
        pthread_mutex_destroy(&c->lk);
    return rc;
}

void loom__cond_destroy(loom__cond *c)
{
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->lk);
}

static void unlink_waiter(loom__cond *c, loom__cond_waiter *n)
{
    if (n->prev)
        n->prev->next = n->next;
    else
        c->head = n->next;
    if (n->next)
        n->next->prev = n->prev;
    else
        c->tail = n->prev;
    n->prev = n->next = NULL;
    n->f = NULL;
}

int loom__cond_wait(loom__cond *c, pthread_mutex_t *mu, double until)
{
    return loom__cond_wait_cancel(c, mu, until, NULL);
}

int loom__cond_wait_cancel(loom__cond *c, pthread_mutex_t *mu, double until,
                           const loom_cancel *cancel)
{
    loom__fiber *f = loom__fiber_self();
    loom__cond_waiter *n;
    int woken;

    if (!f) {
        if (until < 0)
            return pthread_cond_wait(&c->cv, mu);
        return loom__cond_wait_mono(&c->cv, mu, until);
    }
    n = &f->cw;
    n->f = f;
    n->token = loom__fiber_arm();
    n->next = NULL;
    pthread_mutex_lock(&c->lk);
    n->prev = c->tail;
    if (c->tail)
        c->tail->next = n;
    else
        c->head = n;
    c->tail = n;
    pthread_mutex_unlock(&c->lk);
    pthread_mutex_unlock(mu);
    woken = loom__fiber_park_cancel(until, cancel);
    pthread_mutex_lock(&c->lk);
    if (n->f) /* still listed: nobody signalled it */
        unlink_waiter(c, n);
    else
        woken = 1; /* a signal chose it, even if its time was up too */
    pthread_mutex_unlock(&c->lk);
    pthread_mutex_lock(mu);
    return woken ? 0 : ETIMEDOUT;
}

/* Wakes the first fiber waiting on c; c->lk held. 0 when there is none. */
static int wake_one(loom__cond *c)
{
    loom__cond_waiter *n = c->head;
    loom__fiber *f;
    uint64_t token;

    if (!n)
        return 0;
    f = n->f;
    token = n->token;
    unlink_waiter(c, n);
    loom__fiber_wake(f, token);
    return 1;
}

void loom__cond_signal(loom__cond *c)
{
    int fiber;

    pthread_mutex_lock(&c->lk);
    fiber = wake_one(c);
    pthread_mutex_unlock(&c->lk);
    if (!fiber)
        pthread_cond_signal(&c->cv);
}

void loom__cond_broadcast(loom__cond *c)
{
    pthread_mutex_lock(&c->lk);
    while (wake_one(c))
        ;
    pthread_mutex_unlock(&c->lk);
    pthread_cond_broadcast(&c->cv);
}

/* ---- loom/cancel.h: waking the fibers a flag cancels --------------------- */

void loom_cancel_notify(void)
{
    uint64_t one = 1;

    atomic_fetch_add(&live_readers, 1);
    for (loom__sched *s = atomic_load(&live_head); s;
         s = atomic_load(&s->live_next))
        for (int i = 0; i < s->nw; i++) {
            worker *w = &s->w[i];
            if (atomic_load(&w->ncancel) == 0)
                continue;
            atomic_store(&w->cancel_check, 1);
            if (tl_worker != w)
                (void)!write(w->efd, &one, sizeof(one));
        }
    atomic_fetch_sub(&live_readers, 1);
}

/* ---- loom/pool.h: the public face ---------------------------------------- */

struct loom_pool {
    loom__sched *s;
};

int loom_pool_new(loom_pool **out, const loom_pool_options *opts)
{
    loom__sched_opts so = {0};
    loom_pool *p;
    int rc;

    *out = NULL;
    if (opts && opts->version > LOOM_POOL_OPTIONS_VERSION)
        return loom__error_set(LOOM_ERROR,
                               "loom_pool_options version %u "
                               "is unknown",
                               opts->version);
    if (opts) {
        so.workers = opts->workers;
        so.blocking_max = opts->tool_threads;
        so.stack_size = opts->stack_bytes;
    }
    if (!(p = calloc(1, sizeof(*p))))
        return loom__error_oom();
    if ((rc = loom__sched_start(&p->s, &so)) != 0) {
        free(p);
        return rc;
    }
    *out = p;
    return 0;
}

int loom_pool_spawn(loom_pool *p, void (*fn)(void *payload), void *payload)
{
    return loom__fiber_spawn(p->s, fn, payload, 0);
}

struct loom_pool_loop {
    long (*step)(void *);
    void *payload;
    int fd;
    long next; /* what step returned last */
    atomic_int stop;
    /* Set by a wake since the step last began: the loop steps again
     * before it waits. The one wake that sets it also wakes the loop's
     * fiber, with the token of its wait (published before the loop looks
     * at the flag, so either the loop sees the flag or the waker sees the
     * token). No eventfd: a wake from the loop's own worker (a run
     * resuming its connection) is a queue push, and from another worker
     * a kick only when that worker sleeps. */
    atomic_int wanted;
    _Atomic(loom__fiber *) fiber;
    _Atomic uint64_t token;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int ended;
};

static void loop_step(void *arg)
{
    loom_pool_loop *l = arg;

    l->next = l->step(l->payload);
}

/* The loop's fiber. */
static void loop_main(void *arg)
{
    loom_pool_loop *l = arg;
    loom__fiber *self = loom__fiber_self();

    self->urgent = 1;
    atomic_store(&l->fiber, self);
    while (!atomic_load(&l->stop)) {
        double until = -1;
        uint64_t token;
        atomic_store(&l->wanted, 0);
        loom__fiber_on_worker(loop_step, l);
        if (l->next == 0) {
            loom__fiber_yield();
            continue;
        }
        if (l->next > 0)
            until = loom__mono_ms_exact() + (double)l->next;
        token = loom__fiber_arm();
        atomic_store(&l->token, token);
        if (atomic_load(&l->wanted))
            continue;
        if (wait_fd_armed(l->fd, until, token) < 0)
            loom__fiber_sleep(10); /* no slot: polled, never spinning */
    }
    loom__fiber_forget_fd(l->fd);
    pthread_mutex_lock(&l->mu);
    l->ended = 1;
    pthread_cond_broadcast(&l->cv);
    pthread_mutex_unlock(&l->mu);
}

static void loop_free(loom_pool_loop *l)
{
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l);
}

int loom_pool_loop_start(loom_pool_loop **out, loom_pool *p, int fd,
                         long (*step)(void *payload), void *payload)
{
    loom_pool_loop *l;
    struct epoll_event ev = {0};
    int rc, ep;

    *out = NULL;
    /* The loop waits on fd in its worker's epoll, from the fiber: a
     * descriptor epoll refuses is refused here, not found there. */
    ev.events = EPOLLIN;
    if ((ep = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
        rc = loom__error_set(LOOM_EIO, "cannot poll descriptor %d: %s", fd,
                             strerror(errno));
        if (ep >= 0)
            close(ep);
        return rc;
    }
    close(ep);
    if (!(l = calloc(1, sizeof(*l))))
        return loom__error_oom();
    l->step = step;
    l->payload = payload;
    l->fd = fd;
    pthread_mutex_init(&l->mu, NULL);
    pthread_cond_init(&l->cv, NULL);
    *out = l; /* before step runs: it may hand l to other threads */
    if ((rc = loom__fiber_spawn(p->s, loop_main, l, 0)) != 0) {
        *out = NULL;
        loop_free(l);
    }
    return rc;
}

void loom_pool_loop_wake(loom_pool_loop *l)
{
    loom__fiber *f;

    if (atomic_exchange(&l->wanted, 1))
        return; /* the loop steps again before it waits */
    /* Not started yet: its first step comes anyway. A stale token (the
     * loop is stepping) is ignored; the loop then sees the flag. */
    if ((f = atomic_load(&l->fiber)) != NULL)
        loom__fiber_wake(f, atomic_load(&l->token));
}

void loom_pool_loop_stop(loom_pool_loop *l)
{
    if (!l)
        return;
    atomic_store(&l->stop, 1);
    loom_pool_loop_wake(l);
    pthread_mutex_lock(&l->mu);
    while (!l->ended)
        pthread_cond_wait(&l->cv, &l->mu);
    pthread_mutex_unlock(&l->mu);
    loop_free(l);
}

int loom_pool_workers(const loom_pool *p)
{
    return loom__sched_workers(p->s);
}

void loom_pool_free(loom_pool *p)
{
    if (!p)
        return;
    loom__sched_stop(p->s);
    free(p);
}
