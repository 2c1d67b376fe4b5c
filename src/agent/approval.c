/*
 * The approval gate of a run (see approval.h): a short list of waiting
 * calls and their answers under one lock, and a condition the answering
 * thread signals. A waiting fiber is woken by the run's cancel flag
 * itself (loom__cond_wait_cancel); a waiting thread also wakes every
 * POLL_MS to look at it, which a signal handler may set without waking
 * anyone (as the tool hub does, toolexec.c).
 */
#include "agent/approval.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/fiber.h"
#include "core/utf8.h"
#include "loom/common.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define POLL_MS 50.0

typedef struct {
    char *call_id;
    int answer; /* -1 waiting, 0 denied, 1 approved */
    char *reason;
} item;

struct loom__approvals {
    pthread_mutex_t mu;
    loom__cond cv; /* parks a waiter on a fiber */
    item *items;
    size_t n, cap;
};

int loom__approvals_new(loom__approvals **out)
{
    loom__approvals *a = calloc(1, sizeof(*a));

    *out = NULL;
    if (!a)
        return loom__error_oom();
    if (pthread_mutex_init(&a->mu, NULL) != 0 || loom__cond_init(&a->cv) != 0) {
        free(a);
        return loom__error_set(LOOM_ERROR, "could not make the approval "
                                           "gate's lock");
    }
    *out = a;
    return 0;
}

void loom__approvals_free(loom__approvals *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->n; i++) {
        free(a->items[i].call_id);
        free(a->items[i].reason);
    }
    free(a->items);
    loom__cond_destroy(&a->cv);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

int loom__approvals_add(loom__approvals *a, const char *call_id)
{
    int rc = 0;

    pthread_mutex_lock(&a->mu);
    if (a->n == a->cap) {
        size_t c = a->cap ? a->cap * 2 : 4;
        item *p = realloc(a->items, c * sizeof(*p));
        if (!p) {
            rc = loom__error_oom();
            goto out;
        }
        a->items = p;
        a->cap = c;
    }
    if (!(a->items[a->n].call_id = strdup(call_id))) {
        rc = loom__error_oom();
        goto out;
    }
    a->items[a->n].answer = -1;
    a->items[a->n++].reason = NULL;
out:
    pthread_mutex_unlock(&a->mu);
    return rc;
}

int loom__approvals_answer(loom__approvals *a, const char *call_id, int approve,
                           const char *reason)
{
    char *copy = NULL;
    int rc = LOOM_ENOTFOUND;

    if (reason && *reason &&
        !(copy = strndup(reason, loom__utf8_cut(reason, strlen(reason),
                                                LOOM__APPROVAL_REASON_MAX))))
        return loom__error_oom();
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < a->n; i++) {
        item *it = &a->items[i];
        if (it->answer != -1 || strcmp(it->call_id, call_id) != 0)
            continue;
        it->answer = approve ? 1 : 0;
        it->reason = copy;
        copy = NULL;
        rc = 0;
        loom__cond_broadcast(&a->cv);
        break;
    }
    pthread_mutex_unlock(&a->mu);
    free(copy);
    return rc;
}

static size_t waiting_locked(const loom__approvals *a)
{
    size_t w = 0;

    for (size_t i = 0; i < a->n; i++)
        w += a->items[i].answer == -1;
    return w;
}

size_t loom__approvals_waiting(loom__approvals *a)
{
    size_t w;

    pthread_mutex_lock(&a->mu);
    w = waiting_locked(a);
    pthread_mutex_unlock(&a->mu);
    return w;
}

int loom__approvals_has(loom__approvals *a, const char *call_id)
{
    int has = 0;

    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < a->n && !has; i++)
        has = a->items[i].answer == -1 &&
              strcmp(a->items[i].call_id, call_id) == 0;
    pthread_mutex_unlock(&a->mu);
    return has;
}

void loom__approvals_wait(loom__approvals *a, const loom_cancel *cancel,
                          double deadline)
{
    pthread_mutex_lock(&a->mu);
    while (waiting_locked(a) && !loom_cancel_is_set(cancel)) {
        double now = loom__mono_ms_exact(), until = now + POLL_MS;
        if (deadline > 0 && now >= deadline)
            break;
        if (deadline > 0 && deadline < until)
            until = deadline;
        if (loom__cond_wait_cancel(&a->cv, &a->mu, until, cancel) == EINVAL)
            break;
    }
    pthread_mutex_unlock(&a->mu);
}

int loom__approvals_take(loom__approvals *a, const char *call_id, char **reason)
{
    int ans = -1;

    *reason = NULL;
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < a->n; i++) {
        item *it = &a->items[i];
        if (strcmp(it->call_id, call_id) != 0)
            continue;
        ans = it->answer;
        *reason = it->reason;
        free(it->call_id);
        a->items[i] = a->items[--a->n];
        break;
    }
    pthread_mutex_unlock(&a->mu);
    return ans;
}
