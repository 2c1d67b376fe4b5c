/*
 * loom/pool.h: a fixed pool of worker threads that runs turns as fibers.
 *
 * A server with thousands of runs waiting on model streams gives each a
 * fiber (a small stack of its own) on one of a few worker threads instead
 * of a thread: the run's code stays straight-line, and where it waits (a
 * model call, a sub-agent, an approval, a tool call) its fiber parks and
 * the worker runs others. Tool calls that may block a thread run on the
 * pool's bounded set of tool threads; sub-agents and researchers run as
 * fibers beside their parent. Threads that are not the pool's (the CLI's,
 * an embedder's) run the same library code as before.
 *
 * Thread-safe. Code run on the pool must not keep per-run state in
 * thread-local storage, nor wait while holding a mutex another run may
 * need (the worker thread would block with it).
 */
#ifndef LOOM_POOL_H
#define LOOM_POOL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_pool loom_pool;

#define LOOM_POOL_OPTIONS_VERSION 1

/* Zero means the default for every field. */
typedef struct {
    unsigned version;   /* 0 or LOOM_POOL_OPTIONS_VERSION */
    int workers;        /* worker threads; 0: the number of cores */
    int tool_threads;   /* threads for tool calls that block; 0: 64 */
    size_t stack_bytes; /* stack per fiber (touched pages only); 0: 256 KiB */
} loom_pool_options;

/* Starts a pool (opts may be NULL). 0, LOOM_ENOMEM, or LOOM_ERROR when
 * threads cannot start or the version is unknown. */
int loom_pool_new(loom_pool **out, const loom_pool_options *opts);

/*
 * Runs fn(payload) on a fiber of the pool: called from one of the pool's
 * workers (a fiber, or a loop's step below), on that worker unless it
 * has more than one fiber over the least busy worker; else on the least
 * busy worker. 0, or LOOM_ENOMEM (fn is then never called and the caller
 * keeps payload).
 */
int loom_pool_spawn(loom_pool *p, void (*fn)(void *payload), void *payload);

typedef struct loom_pool_loop loom_pool_loop;

/*
 * Drives an event loop of the caller's (a library that polls its own
 * descriptors one step at a time, such as libmicrohttpd in its external
 * mode) from one of p's workers, so the loop and the runs it starts share
 * that thread instead of waking each other across threads.
 * step(payload) runs on the worker thread's own stack, as on a plain
 * thread (a wait there blocks the worker): at once, then whenever fd is
 * readable, loom_pool_loop_wake() was called, or the milliseconds step
 * returned last have passed (< 0: no time limit; 0: again once the
 * worker's other fibers had their turn). *out is set before step first
 * runs. 0, LOOM_ENOMEM, or LOOM_EIO when epoll refuses fd.
 */
int loom_pool_loop_start(loom_pool_loop **out, loom_pool *p, int fd,
                         long (*step)(void *payload), void *payload);

/* Has step called soon; from any thread. */
void loom_pool_loop_wake(loom_pool_loop *l);

/* Ends the loop and frees l once step has returned for the last time
 * (it is never called again). Not from one of p's workers. NULL: no-op. */
void loom_pool_loop_stop(loom_pool_loop *l);

/* The number of worker threads. */
int loom_pool_workers(const loom_pool *p);

/* Waits until every fiber started on p has returned (stop its loops
 * first: a loop runs until loom_pool_loop_stop), then stops and
 * frees it; a tool call still blocking a tool thread (abandoned at its
 * timeout) ends on its own. Not from one of p's fibers. NULL: no-op. */
void loom_pool_free(loom_pool *p);

#ifdef __cplusplus
}
#endif
#endif
