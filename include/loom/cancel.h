/*
 * loom/cancel.h: a cancellation flag shared between threads.
 *
 * A run owns one; the HTTP client polls it so an upstream request is
 * aborted promptly, and tools may poll it too. Setting it is async-signal
 * safe (a lock-free atomic store and eventfd writes), so a SIGINT handler
 * may cancel a run. A run parked on a loom_pool fiber (waiting for a model
 * call, a retry, a tool, an approval) is woken at once by the set.
 *
 * A flag may follow another (`parent`, set before anyone polls it): it
 * reads as set once either is, so a sub-agent's run stops when the tool
 * call that started it is cancelled, and so on down a tree of runs. The
 * parent must outlive the flag.
 *
 * C++ has no <stdatomic.h> before C++23, so a C++ includer sees the flag
 * as std::atomic<int>, which GCC and Clang lay out as C's atomic_int.
 */
#ifndef LOOM_CANCEL_H
#define LOOM_CANCEL_H

#ifdef __cplusplus
#include <atomic>
#else
#include <stdatomic.h>
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_cancel {
#ifdef __cplusplus
    std::atomic<int> flag;
#else
    atomic_int flag;
#endif
    const struct loom_cancel *parent; /* NULL: none */
} loom_cancel;

#define LOOM_CANCEL_INIT { 0 }

/*
 * Wakes the fibers of every loom_pool that are parked on a flag that now
 * reads set, so they see it at once (loom_cancel_set calls it after the
 * store). Async-signal-safe and lock-free; cheap when no pool exists.
 */
void loom_cancel_notify(void);

static inline void loom_cancel_set(loom_cancel *c)
{
    if (!c)
        return;
#ifdef __cplusplus
    c->flag.store(1);
#else
    atomic_store(&c->flag, 1);
#endif
    loom_cancel_notify();
}

static inline int loom_cancel_is_set(const loom_cancel *c)
{
    for (; c; c = c->parent)
#ifdef __cplusplus
        if (c->flag.load())
#else
        if (atomic_load((atomic_int *)&c->flag))
#endif
            return 1;
    return 0;
}

#ifdef __cplusplus
}
#endif
#endif
