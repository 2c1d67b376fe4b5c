/*
 * loom/cancel.h: a cancellation flag shared between threads.
 *
 * A run owns one; the HTTP client polls it so an upstream request is
 * aborted promptly, and tools may poll it too. Setting it is async-signal
 * safe (a lock-free atomic store), so a SIGINT handler may cancel a run.
 */
#ifndef LOOM_CANCEL_H
#define LOOM_CANCEL_H

#include <stdatomic.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    atomic_int flag;
} loom_cancel;

#define LOOM_CANCEL_INIT { 0 }

static inline void loom_cancel_set(loom_cancel *c)
{
    if (c)
        atomic_store(&c->flag, 1);
}

static inline int loom_cancel_is_set(const loom_cancel *c)
{
    return c && atomic_load((atomic_int *)&c->flag);
}

#ifdef __cplusplus
}
#endif
#endif
