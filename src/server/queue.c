/*
 * Admission: the run slots (max_concurrent_runs) and the bounded queue
 * of requests waiting for one (docs/server.md "Connections, timeouts and
 * the admission queue").
 *
 * A request that finds every slot taken waits, its connection suspended
 * (no thread waits for it), up to queue_wait_ms; then it gets 503 with
 * Retry-After. At most queue_max wait, and at most queue_max_per_identity
 * of them are one caller's, so one caller cannot fill the queue. Callers
 * are served round-robin: the waiters of each identity form a FIFO, and
 * a freed slot goes to the next identity in turn, so a caller with many
 * waiting cannot starve one with few. Without accounts every request is
 * the same anonymous caller and the queue is a plain FIFO.
 *
 * A freed slot is handed over, never put back while someone waits: the
 * waiter it goes to is marked granted and woken, and the slot stays
 * counted as used until that request's handler, running again, starts
 * its run on it (or gives it back). So a request arriving meanwhile
 * cannot overtake the queue.
 *
 * Locking: the queue's lock is a leaf except for srv__wake (the server's
 * susp_lock), taken under it; nothing takes the queue's lock while
 * holding susp_lock.
 */
#include "core/clock.h"
#include "core/error.h"
#include "server/srvpriv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The waiters of one caller, in arrival order; one of the ring. */
typedef struct srv_qid {
    char *name;
    srv_waiter *head, *tail;
    int n;
    struct srv_qid *prev, *next;
} srv_qid;

struct srv_queue {
    pthread_mutex_t lock;
    int used;                         /* slots taken or handed over */
    int slots;                        /* max_concurrent_runs */
    int max;                          /* queue_max; 0: nobody waits */
    int per_identity;                 /* a caller's share of max */
    long wait_ms;                     /* queue_wait_ms */
    int len;                          /* waiting now */
    srv_waiter *head, *tail;          /* every waiter, in arrival order */
    srv_qid *ring, *ring_tail, *turn; /* identities; turn: served next */
    /* For /metrics. */
    unsigned long long refused_full, refused_identity, timed_out;
};

int srv__queue_new(srv_queue **out, const loom_server_config *sc)
{
    srv_queue *q = calloc(1, sizeof(*q));

    *out = NULL;
    if (!q)
        return loom__error_oom();
    pthread_mutex_init(&q->lock, NULL);
    q->slots = sc->max_concurrent_runs;
    q->max = sc->queue_wait_ms > 0 ? sc->queue_max : 0;
    q->per_identity = sc->queue_max_per_identity;
    if (q->per_identity <= 0)
        q->per_identity = q->max / 4 > 0 ? q->max / 4 : 1;
    q->wait_ms = sc->queue_wait_ms;
    *out = q;
    return 0;
}

void srv__queue_free(srv_queue *q)
{
    if (!q)
        return;
    /* Every request has completed: no waiter is left, nor its identity. */
    pthread_mutex_destroy(&q->lock);
    free(q);
}

/* The identity's bucket, or NULL. */
static srv_qid *find_id(srv_queue *q, const char *name)
{
    for (srv_qid *b = q->ring; b; b = b->next)
        if (!strcmp(b->name, name))
            return b;
    return NULL;
}

static void drop_id(srv_queue *q, srv_qid *b)
{
    if (q->turn == b)
        q->turn = b->next ? b->next : (q->ring != b ? q->ring : NULL);
    if (b->prev)
        b->prev->next = b->next;
    else
        q->ring = b->next;
    if (b->next)
        b->next->prev = b->prev;
    else
        q->ring_tail = b->prev;
    free(b->name);
    free(b);
}

/* Takes w off both lists (and its identity off the ring when it was its
 * last waiter). Lock held, w queued. */
static void unlink_waiter(srv_queue *q, srv_waiter *w)
{
    srv_qid *b = w->id;

    if (w->prev)
        w->prev->next = w->next;
    else
        q->head = w->next;
    if (w->next)
        w->next->prev = w->prev;
    else
        q->tail = w->prev;
    if (w->iprev)
        w->iprev->inext = w->inext;
    else
        b->head = w->inext;
    if (w->inext)
        w->inext->iprev = w->iprev;
    else
        b->tail = w->iprev;
    w->prev = w->next = w->iprev = w->inext = NULL;
    w->id = NULL;
    q->len--;
    if (--b->n == 0)
        drop_id(q, b);
}

/* Hands the slot just freed to the next waiter in turn, or frees it.
 * Lock held. */
static void give_locked(srv_server *s, srv_queue *q)
{
    srv_qid *b = q->turn ? q->turn : q->ring;
    srv_waiter *w;

    if (!b) {
        q->used--;
        return;
    }
    w = b->head;
    /* The next identity is served next time (drop_id moves the turn
     * on by itself when this one empties). */
    q->turn = b->next ? b->next : q->ring;
    unlink_waiter(q, w);
    w->state = SRV_WAIT_GRANTED;
    srv__wake(s, w->susp);
}

/* The caller a request counts as for fairness: a user key's or a token's
 * workspace and user, another key's id; "" for everyone else (no
 * accounts: one anonymous caller). */
static void identity_of(const srv_request *r, char *out, size_t size)
{
    const srv_identity *who = r->who;
    const loom_key_info *k = &who->key;

    out[0] = '\0';
    if ((who->kind == SRV_CALLER_JWT ||
         (who->kind == SRV_CALLER_KEY && !k->service)) &&
        k->user)
        snprintf(out, size, "u:%s/%s", k->workspace ? k->workspace : "",
                 k->user);
    else if (who->kind == SRV_CALLER_KEY)
        snprintf(out, size, "k:%s", k->id);
}

int srv__slot_take(srv_server *s, srv_request *r)
{
    srv_queue *q = s->queue;
    srv_waiter *w = r ? srv__request_waiter(r) : NULL;
    char name[2 * LOOM_ACCOUNT_NAME_MAX + 8];
    srv_qid *b;
    int rc = 0;

    if (r)
        identity_of(r, name, sizeof(name));
    pthread_mutex_lock(&q->lock);
    if (w && w->state == SRV_WAIT_GRANTED) {
        w->state = SRV_WAIT_NONE; /* the slot handed over is its */
        goto out;
    }
    if (q->used < q->slots) {
        q->used++;
        goto out;
    }
    if (!w || q->max == 0) {
        rc = loom__error_set(SRV_EBUSY,
                             "%d runs are already running, the most this "
                             "server allows (max_concurrent_runs); retry "
                             "later",
                             q->used);
        goto out;
    }
    if (q->len >= q->max) {
        q->refused_full++;
        rc = loom__error_set(SRV_EBUSY,
                             "%d runs are running and %d requests wait for "
                             "one, the most this server allows "
                             "(max_concurrent_runs, queue_max); retry later",
                             q->used, q->len);
        goto out;
    }
    b = find_id(q, name);
    if (name[0] && b && b->n >= q->per_identity) {
        q->refused_identity++;
        rc = loom__error_set(SRV_EBUSY,
                             "%d of your requests already wait for a run "
                             "slot, the most one caller may "
                             "(queue_max_per_identity); retry later",
                             b->n);
        goto out;
    }
    if (!b) {
        if (!(b = calloc(1, sizeof(*b))) || !(b->name = strdup(name))) {
            free(b);
            rc = loom__error_oom();
            goto out;
        }
        b->prev = q->ring_tail;
        if (q->ring_tail)
            q->ring_tail->next = b;
        else
            q->ring = b;
        q->ring_tail = b;
    }
    w->susp = srv__request_susp(r);
    w->deadline = loom__mono_ms() + q->wait_ms;
    w->state = SRV_WAIT_QUEUED;
    w->enqueued = 1;
    w->id = b;
    w->prev = q->tail;
    if (q->tail)
        q->tail->next = w;
    else
        q->head = w;
    q->tail = w;
    w->iprev = b->tail;
    if (b->tail)
        b->tail->inext = w;
    else
        b->head = w;
    b->tail = w;
    b->n++;
    q->len++;
    rc = loom__error_set(SRV_EQUEUED, "waiting for a run slot");
out:
    pthread_mutex_unlock(&q->lock);
    return rc;
}

void srv__slot_give(srv_server *s)
{
    pthread_mutex_lock(&s->queue->lock);
    give_locked(s, s->queue);
    pthread_mutex_unlock(&s->queue->lock);
}

void srv__queue_leave(srv_server *s, srv_waiter *w)
{
    srv_queue *q = s->queue;

    pthread_mutex_lock(&q->lock);
    if (w->state == SRV_WAIT_QUEUED)
        unlink_waiter(q, w);
    else if (w->state == SRV_WAIT_GRANTED)
        give_locked(s, q); /* handed over but not used: pass it on */
    w->state = SRV_WAIT_NONE;
    w->enqueued = 0;
    pthread_mutex_unlock(&q->lock);
}

int srv__queue_state(srv_server *s, const srv_waiter *w)
{
    int st;

    pthread_mutex_lock(&s->queue->lock);
    st = w->state;
    pthread_mutex_unlock(&s->queue->lock);
    return st;
}

void srv__queue_expire(srv_server *s, int all)
{
    srv_queue *q = s->queue;
    long long now = loom__mono_ms();

    pthread_mutex_lock(&q->lock);
    /* Everyone waits the same time: the oldest expire first. */
    while (q->head && (all || q->head->deadline <= now)) {
        srv_waiter *w = q->head;
        unlink_waiter(q, w);
        w->state = SRV_WAIT_EXPIRED;
        if (!all)
            q->timed_out++;
        srv__wake(s, w->susp);
    }
    pthread_mutex_unlock(&q->lock);
}

void srv__queue_stats(srv_server *s, srv_queue_stats *out)
{
    srv_queue *q = s->queue;

    pthread_mutex_lock(&q->lock);
    out->waiting = q->len;
    out->max = q->max;
    out->refused_full = q->refused_full;
    out->refused_identity = q->refused_identity;
    out->timed_out = q->timed_out;
    pthread_mutex_unlock(&q->lock);
}
