/*
 * The store's one-shot completion (completion.h): a mutex, a condition
 * variable and a flag. The condition is a loom__cond (core/fiber.h), so a
 * run on a fiber parks while the writer commits, instead of blocking its
 * worker thread and every other run on it.
 */
#include "store/completion.h"

void loom__completion_init(loom__completion *c)
{
    pthread_mutex_init(&c->lock, NULL);
    loom__cond_init(&c->cv);
    c->done = 0;
}

void loom__completion_wait(loom__completion *c)
{
    pthread_mutex_lock(&c->lock);
    while (!c->done)
        loom__cond_wait(&c->cv, &c->lock, -1);
    pthread_mutex_unlock(&c->lock);
}

void loom__completion_signal(loom__completion *c)
{
    pthread_mutex_lock(&c->lock);
    c->done = 1;
    loom__cond_signal(&c->cv);
    pthread_mutex_unlock(&c->lock);
}

void loom__completion_destroy(loom__completion *c)
{
    loom__cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->lock);
}
