/*
 * The timed pauses of loom-fake-upstream's event mode (--epoll).
 *
 * In event mode libmicrohttpd serves every connection from a few epoll
 * threads, so a scripted delay, a slow chunk or a hang must not sleep in a
 * callback: the callback suspends its connection (MHD_suspend_connection)
 * and registers a wait here, and one waiter thread resumes the connection
 * when the wait is due or when the client goes away (EPOLLRDHUP on the
 * client's socket, watched by the waiter's own epoll instance, for pauses
 * over FAKE_WATCH_MS). MHD then calls the callback again, which reads the
 * outcome from its fake_wait.
 * Pending waits sit in a binary min-heap ordered by due time (a hang is due
 * never, UINT64_MAX), under one lock. A suspended connection must be
 * resumed before MHD_stop_daemon: fake_waiter_stop resumes every pending
 * wait as gone, and any wait begun after that is resumed at once.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "fake_upstream.h"

/* Shorter pauses are not watched for the client leaving: they end soon
 * anyway, and the write after them finds the client gone. This saves two
 * epoll_ctl calls per chunk of a slow stream. */
#define FAKE_WATCH_MS 250

static struct {
    pthread_mutex_t lock; /* everything below */
    fake_wait **heap;     /* pending waits, earliest due first */
    size_t n, cap;
    int ep;      /* waiter's epoll: client sockets and efd */
    int efd;     /* eventfd: wakes the waiter (new earliest wait, quit) */
    bool closed; /* fake_waiter_stop ran: no new pauses */
    bool quit;
    pthread_t thread;
} W = {.lock = PTHREAD_MUTEX_INITIALIZER, .ep = -1, .efd = -1};

static uint64_t mono_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

static void heap_swap(size_t a, size_t b)
{
    fake_wait *t = W.heap[a];

    W.heap[a] = W.heap[b];
    W.heap[b] = t;
    W.heap[a]->heap_i = a;
    W.heap[b]->heap_i = b;
}

/* Restores the heap order around index i after its due time changed. */
static void heap_fix(size_t i)
{
    while (i > 0 && W.heap[(i - 1) / 2]->due > W.heap[i]->due) {
        heap_swap(i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    for (;;) {
        size_t l = 2 * i + 1, m = i;

        if (l < W.n && W.heap[l]->due < W.heap[m]->due)
            m = l;
        if (l + 1 < W.n && W.heap[l + 1]->due < W.heap[m]->due)
            m = l + 1;
        if (m == i)
            return;
        heap_swap(i, m);
        i = m;
    }
}

static void heap_remove(fake_wait *w)
{
    size_t i = w->heap_i;

    W.n--;
    if (i != W.n) {
        W.heap[i] = W.heap[W.n];
        W.heap[i]->heap_i = i;
        heap_fix(i);
    }
    w->heap_i = SIZE_MAX;
}

/* Sets the outcome of w and resumes its connection; under the lock. */
static void end_wait(fake_wait *w, bool gone)
{
    if (w->count)
        atomic_fetch_sub(w->count, 1);
    w->count = NULL;
    w->gone = gone;
    w->state = FAKE_WAIT_DONE;
    MHD_resume_connection(w->con);
}

/* Ends a pending wait; under the lock. */
static void finish(fake_wait *w, bool gone)
{
    if (w->heap_i != SIZE_MAX)
        heap_remove(w);
    if (w->fd >= 0)
        epoll_ctl(W.ep, EPOLL_CTL_DEL, w->fd, NULL);
    end_wait(w, gone);
}

static void wake(void)
{
    uint64_t one = 1;
    ssize_t r = write(W.efd, &one, sizeof(one));

    (void)r;
}

static void *waiter(void *arg)
{
    struct epoll_event evs[64];

    (void)arg;
    for (;;) {
        struct timespec ts, *timeout = NULL;
        int nev;
        uint64_t now;

        pthread_mutex_lock(&W.lock);
        if (W.quit) {
            pthread_mutex_unlock(&W.lock);
            return NULL;
        }
        if (W.n && W.heap[0]->due != UINT64_MAX) {
            uint64_t left;

            now = mono_us();
            left = W.heap[0]->due <= now ? 0 : W.heap[0]->due - now;
            ts = fake_timespec_us(left);
            timeout = &ts;
        }
        pthread_mutex_unlock(&W.lock);
        nev = epoll_pwait2(W.ep, evs, 64, timeout, NULL);
        if (nev < 0 && errno != EINTR)
            fake_die("epoll_pwait2: %s", strerror(errno));
        pthread_mutex_lock(&W.lock);
        for (int i = 0; i < nev; i++) {
            fake_wait *w = evs[i].data.ptr;

            if (!w) {
                uint64_t v;
                ssize_t r = read(W.efd, &v, sizeof(v));

                (void)r;
            } else if (w->state == FAKE_WAIT_PENDING) {
                finish(w, true); /* the client left */
            }
        }
        now = mono_us();
        while (W.n && W.heap[0]->due <= now)
            finish(W.heap[0], false);
        pthread_mutex_unlock(&W.lock);
    }
}

void fake_waiter_start(void)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    int err;

    W.ep = epoll_create1(EPOLL_CLOEXEC);
    W.efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (W.ep < 0 || W.efd < 0 ||
        epoll_ctl(W.ep, EPOLL_CTL_ADD, W.efd, &ev) != 0)
        fake_die("waiter: %s", strerror(errno));
    err = pthread_create(&W.thread, NULL, waiter, NULL);
    if (err)
        fake_die("waiter thread: %s", strerror(err));
}

void fake_waiter_stop(void)
{
    pthread_mutex_lock(&W.lock);
    W.closed = true;
    while (W.n)
        finish(W.heap[0], true);
    W.quit = true;
    wake();
    pthread_mutex_unlock(&W.lock);
    pthread_join(W.thread, NULL);
    close(W.ep);
    close(W.efd);
    free(W.heap);
}

void fake_wait_begin(fake_wait *w, struct MHD_Connection *con, int fd,
                     uint64_t due)
{
    uint64_t now = mono_us();
    bool first;

    /* Suspended before it is registered, so the waiter never resumes a
     * connection that is not suspended yet. */
    MHD_suspend_connection(con);
    pthread_mutex_lock(&W.lock);
    w->con = con;
    w->fd = due > now + (uint64_t)FAKE_WATCH_MS * 1000u ? fd : -1;
    w->heap_i = SIZE_MAX;
    if (W.closed) {
        end_wait(w, true);
        pthread_mutex_unlock(&W.lock);
        return;
    }
    if (W.n == W.cap) {
        size_t cap = W.cap ? W.cap * 2 : 1024;
        fake_wait **h = realloc(W.heap, cap * sizeof(*h));

        if (!h)
            fake_die("out of memory");
        W.heap = h;
        W.cap = cap;
    }
    w->state = FAKE_WAIT_PENDING;
    w->due = due;
    w->heap_i = W.n;
    W.heap[W.n++] = w;
    heap_fix(w->heap_i);
    if (w->fd >= 0) {
        struct epoll_event ev = {.events = EPOLLRDHUP, .data.ptr = w};

        if (epoll_ctl(W.ep, EPOLL_CTL_ADD, fd, &ev) != 0)
            w->fd = -1; /* cannot watch it: the wait only times out */
    }
    first = w->heap_i == 0;
    pthread_mutex_unlock(&W.lock);
    if (first)
        wake();
}
