/*
 * The store's one-shot completion (completion.h): a mutex, a condition
 * variable and a flag.
 */
#include "store/completion.h"

void loom__completion_init(loom__completion *c)
{
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->done = 0;
}

void loom__completion_wait(loom__completion *c)
{
    pthread_mutex_lock(&c->lock);
    while (!c->done)
        pthread_cond_wait(&c->cv, &c->lock);
    pthread_mutex_unlock(&c->lock);
}

void loom__completion_signal(loom__completion *c)
{
    pthread_mutex_lock(&c->lock);
    c->done = 1;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->lock);
}

void loom__completion_destroy(loom__completion *c)
{
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->lock);
}
