/*
 * A one-shot completion: one thread waits until another says its work is
 * done. The store's writer thread (sqlite_writer.c) signals one per
 * queued write once the batch holding it has committed (or failed), and
 * the caller that queued it waits on it before returning, so that nothing
 * it then acknowledges can be lost. This is the only place a caller of
 * the store waits for the writer: a runtime that parks its runs on
 * something other than threads makes this one wait aware of it.
 */
#ifndef LOOM_STORE_COMPLETION_H
#define LOOM_STORE_COMPLETION_H

#include "core/fiber.h"

#include <pthread.h>

typedef struct {
    pthread_mutex_t lock;
    loom__cond cv; /* parks a waiting fiber */
    int done;
} loom__completion;

/* Not done yet. Every init is paired with loom__completion_destroy(). */
void loom__completion_init(loom__completion *c);
/* Returns once c is signalled (at once when it already was). */
void loom__completion_wait(loom__completion *c);
/* Marks c done and wakes its waiter. What the waiter reads of the work
 * must be written before this call; the signaller must not touch c after
 * it, since the waiter may free it as soon as it returns. */
void loom__completion_signal(loom__completion *c);
void loom__completion_destroy(loom__completion *c);

#endif
