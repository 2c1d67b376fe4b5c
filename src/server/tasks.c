/*
 * Tasks: work a handler hands to a thread of its own (an OAuth exchange
 * with another server, anything that may take seconds), with a request
 * that waits for it without blocking the server thread (srv_defer_task,
 * http.c). A task is a flag and at most one waiter: finishing it wakes
 * the waiting request's suspended connection, which then answers on the
 * server thread. The request that goes away first stops watching, so a
 * late finish never touches a connection that is gone.
 */
#include "core/error.h"
#include "server/srvpriv.h"

#include <stdatomic.h>
#include <stdlib.h>

struct srv_task {
    atomic_int refs;
    pthread_mutex_t mu;
    int finished;
    srv_server *s;    /* the waiter's server */
    srv_susp *waiter; /* the request waiting, NULL for none */
};

int srv_task_new(srv_task **out)
{
    srv_task *t = calloc(1, sizeof(*t));

    *out = t;
    if (!t)
        return loom__error_oom();
    atomic_init(&t->refs, 1);
    pthread_mutex_init(&t->mu, NULL);
    return 0;
}

void srv_task_ref(srv_task *t)
{
    atomic_fetch_add(&t->refs, 1);
}

void srv_task_unref(srv_task *t)
{
    if (!t || atomic_fetch_sub(&t->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&t->mu);
    free(t);
}

void srv_task_finish(srv_task *t)
{
    pthread_mutex_lock(&t->mu);
    t->finished = 1;
    if (t->waiter)
        srv__wake(t->s, t->waiter);
    pthread_mutex_unlock(&t->mu);
}

int srv_task_finished(srv_task *t)
{
    int f;

    pthread_mutex_lock(&t->mu);
    f = t->finished;
    pthread_mutex_unlock(&t->mu);
    return f;
}

void srv__task_watch(srv_task *t, srv_server *s, srv_susp *sp)
{
    pthread_mutex_lock(&t->mu);
    t->s = s;
    t->waiter = sp;
    pthread_mutex_unlock(&t->mu);
}

void srv__task_unwatch(srv_task *t)
{
    pthread_mutex_lock(&t->mu);
    t->waiter = NULL;
    pthread_mutex_unlock(&t->mu);
}
