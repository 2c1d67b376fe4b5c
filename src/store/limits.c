/*
 * The limiter (loom/limits.h): rate limits, concurrent runs and budget
 * reservations in process, the spend in the store.
 *
 * One mutex guards every counter, so a request's checks and counts over
 * all its scopes are one atomic step: two requests never both take the
 * last request of a minute, the last run slot or the last micro-dollars
 * of a budget. The work under the lock is a few hash lookups and sums
 * over 60 one-second buckets; store I/O happens under it only to read a
 * scope's spend the first time it is needed in a budget period (a read,
 * which in WAL mode waits for no writer). Writing a settled spend to the
 * store happens outside the lock: the in-process spend is what the
 * checks read, and the store's is the same sum (additions commute).
 *
 * A scope's state stays while a lease or reservation holds it; idle
 * ones are swept once the table holds SCOPES_MAX of them (their spend is
 * read again from the store when next needed).
 */
#include "loom/limits.h"

#include "core/error.h"
#include "loom/log.h"
#include "store/store_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WINDOW 60        /* seconds in a minute's window */
#define BUCKETS 4096     /* hash buckets */
#define SCOPES_MAX 65536 /* scope states kept before idle ones go */

/* Counts per second over the last WINDOW seconds. */
typedef struct {
    int64_t sec[WINDOW]; /* the second each slot counts; 0: none */
    long n[WINDOW];
} window;

typedef struct entry {
    struct entry *next;
    uint64_t hash;
    window req, tok;
    long running;   /* concurrent runs */
    long holds;     /* leases and reservations that point here */
    int64_t used_s; /* the last second it was used */
    /* The budget, for the period it was last used in. */
    int loaded;
    loom_budget_period period;
    int64_t period_start;
    int64_t spent, reserved;
    int exhausted_noted;
    char name[LOOM_LIMIT_SCOPE_SIZE];
} entry;

struct loom_limiter {
    pthread_mutex_t lock;
    loom_store *st;
    entry *buckets[BUCKETS];
    size_t count;
};

struct loom_limit_lease {
    size_t n;
    entry *e[LOOM_LIMIT_SCOPES_MAX];
    loom_limits lim[LOOM_LIMIT_SCOPES_MAX];
};

struct loom_limit_reservation {
    size_t n;
    entry *e[LOOM_LIMIT_SCOPES_MAX];
    int charged[LOOM_LIMIT_SCOPES_MAX]; /* a budget counts this call */
    loom_budget_period period[LOOM_LIMIT_SCOPES_MAX];
    int64_t period_start[LOOM_LIMIT_SCOPES_MAX];
    int64_t worst; /* < 0: unpriced */
};

/* ---- windows ------------------------------------------------------------- */

static long win_sum(const window *w, int64_t now_s)
{
    long sum = 0;

    for (int i = 0; i < WINDOW; i++)
        if (w->sec[i] > now_s - WINDOW && w->sec[i] <= now_s)
            sum += w->n[i];
    return sum;
}

static void win_add(window *w, int64_t now_s, long v)
{
    int i = (int)(now_s % WINDOW);

    if (w->sec[i] != now_s) {
        w->sec[i] = now_s;
        w->n[i] = 0;
    }
    w->n[i] += v;
}

/* The count in second s of the window (0 when the slot is another's). */
static long win_at(const window *w, int64_t s)
{
    int i = (int)(s % WINDOW);

    return w->sec[i] == s ? w->n[i] : 0;
}

/* Milliseconds from now_ms until the window holds less than limit
 * (0: it does). */
static int64_t win_free_ms(const window *w, int64_t now_ms, long limit)
{
    int64_t now_s = now_ms / 1000;
    long sum = win_sum(w, now_s);

    for (int64_t s = now_s - WINDOW + 1; s <= now_s && sum >= limit; s++) {
        sum -= win_at(w, s);
        if (sum < limit)
            return (s + WINDOW) * 1000 - now_ms;
    }
    return sum >= limit ? WINDOW * 1000 : 0;
}

/* Milliseconds until everything counted has left the window. */
static int64_t win_reset_ms(const window *w, int64_t now_ms)
{
    int64_t now_s = now_ms / 1000;

    for (int64_t s = now_s; s > now_s - WINDOW; s--)
        if (win_at(w, s))
            return (s + WINDOW) * 1000 - now_ms;
    return 0;
}

/* ---- the table ----------------------------------------------------------- */

static uint64_t hash_of(const char *s)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */

    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

/* Frees the idle states: nothing holds them and their windows are
 * empty. Under the lock. */
static void sweep(loom_limiter *l, int64_t now_s)
{
    for (size_t b = 0; b < BUCKETS; b++) {
        entry **pp = &l->buckets[b];
        while (*pp) {
            entry *e = *pp;
            if (!e->holds && !e->running && e->used_s <= now_s - WINDOW) {
                *pp = e->next;
                free(e);
                l->count--;
            } else {
                pp = &e->next;
            }
        }
    }
}

/* The state of name, made when new; NULL when out of memory. */
static entry *lookup(loom_limiter *l, const char *name, int64_t now_s)
{
    uint64_t h = hash_of(name);
    entry **head = &l->buckets[h % BUCKETS], *e;

    for (e = *head; e; e = e->next)
        if (e->hash == h && !strcmp(e->name, name))
            break;
    if (!e) {
        if (l->count >= SCOPES_MAX)
            sweep(l, now_s);
        if (!(e = calloc(1, sizeof(*e))))
            return NULL;
        e->hash = h;
        snprintf(e->name, sizeof(e->name), "%s", name);
        e->next = *head;
        *head = e;
        l->count++;
    }
    e->used_s = now_s;
    return e;
}

/* ---- budgets ------------------------------------------------------------- */

int64_t loom_budget_period_start(loom_budget_period p, int64_t now_ms)
{
    time_t t = (time_t)(now_ms / 1000);
    struct tm tm;

    if (p == LOOM_BUDGET_TOTAL || !gmtime_r(&t, &tm))
        return 0;
    tm.tm_hour = tm.tm_min = tm.tm_sec = 0;
    if (p == LOOM_BUDGET_MONTH)
        tm.tm_mday = 1;
    return (int64_t)timegm(&tm) * 1000;
}

/* Brings e's budget to the period of now_ms under lim (reading its spend
 * from the store once per period). Under the lock. */
static int budget_ready(loom_limiter *l, entry *e, const loom_limits *lim,
                        int64_t now_ms)
{
    int64_t start = loom_budget_period_start(lim->budget_period, now_ms);
    int64_t spent = 0;
    int rc;

    if (e->loaded && e->period == lim->budget_period &&
        e->period_start == start)
        return 0;
    if (l->st && (rc = loom_store_spend_get(l->st, e->name, lim->budget_period,
                                            start, &spent)) != 0)
        return rc;
    e->loaded = 1;
    e->period = lim->budget_period;
    e->period_start = start;
    e->spent = spent;
    e->reserved = 0;
    e->exhausted_noted = 0;
    return 0;
}

/* Fills st for a budget refusal by scope i. */
static void refuse_budget(loom_limit_status *st, size_t i, entry *e,
                          loom_limit_kind why, int64_t budget)
{
    st->refused = why;
    st->scope = i;
    st->budget_micros = budget;
    st->exhausted_first = why == LOOM_LIMIT_BUDGET && !e->exhausted_noted;
    if (why == LOOM_LIMIT_BUDGET)
        e->exhausted_noted = 1;
}

/* ---- the limiter --------------------------------------------------------- */

int loom_limiter_new(loom_limiter **out, loom_store *st)
{
    loom_limiter *l = calloc(1, sizeof(*l));

    *out = NULL;
    if (!l)
        return loom__error_oom();
    pthread_mutex_init(&l->lock, NULL);
    l->st = st;
    *out = l;
    return 0;
}

void loom_limiter_free(loom_limiter *l)
{
    if (!l)
        return;
    for (size_t b = 0; b < BUCKETS; b++)
        for (entry *e = l->buckets[b], *next; e; e = next) {
            next = e->next;
            free(e);
        }
    pthread_mutex_destroy(&l->lock);
    free(l);
}

/* The rate headers' state: the scope with the fewest requests (tokens)
 * left. Under the lock, after this request was counted. */
static void rate_status(loom_limit_status *st, entry *const *e,
                        const loom_limit_scope *scopes, size_t n,
                        int64_t now_ms)
{
    int64_t now_s = now_ms / 1000;

    for (size_t i = 0; i < n; i++) {
        const loom_limits *lim = &scopes[i].limits;
        if (lim->rpm > 0) {
            long left = lim->rpm - win_sum(&e[i]->req, now_s);
            if (left < 0)
                left = 0;
            if (!st->requests_limit || left < st->requests_remaining) {
                st->requests_limit = lim->rpm;
                st->requests_remaining = left;
                st->requests_reset_ms = win_reset_ms(&e[i]->req, now_ms);
            }
        }
        if (lim->tpm > 0) {
            long left = lim->tpm - win_sum(&e[i]->tok, now_s);
            if (left < 0)
                left = 0;
            if (!st->tokens_limit || left < st->tokens_remaining) {
                st->tokens_limit = lim->tpm;
                st->tokens_remaining = left;
                st->tokens_reset_ms = win_reset_ms(&e[i]->tok, now_ms);
            }
        }
    }
}

/* Checks scope i (state e) for admission; 1 when it refuses (st says
 * why). Under the lock. */
static int refuses(loom_limiter *l, entry *e, const loom_limit_scope *sc,
                   size_t i, int64_t now_ms, loom_limit_status *st, int *rc)
{
    const loom_limits *lim = &sc->limits;
    int64_t now_s = now_ms / 1000;

    if (lim->rpm > 0 && win_sum(&e->req, now_s) >= lim->rpm) {
        st->refused = LOOM_LIMIT_REQUESTS;
        st->retry_after_ms = win_free_ms(&e->req, now_ms, lim->rpm);
    } else if (lim->tpm > 0 && win_sum(&e->tok, now_s) >= lim->tpm) {
        st->refused = LOOM_LIMIT_TOKENS;
        st->retry_after_ms = win_free_ms(&e->tok, now_ms, lim->tpm);
    } else if (lim->max_concurrent > 0 && e->running >= lim->max_concurrent) {
        st->refused = LOOM_LIMIT_CONCURRENT;
        st->retry_after_ms = 1000;
    } else if (lim->budget_micros > 0) {
        if ((*rc = budget_ready(l, e, lim, now_ms)) != 0)
            return 1;
        if (e->spent + e->reserved >= lim->budget_micros)
            refuse_budget(st, i, e, LOOM_LIMIT_BUDGET, lim->budget_micros);
    }
    if (st->refused)
        st->scope = i;
    return st->refused != LOOM_LIMIT_OK;
}

int loom_limiter_admit(loom_limiter *l, const loom_limit_scope *scopes,
                       size_t n, int64_t now_ms, loom_limit_status *st,
                       loom_limit_lease **lease)
{
    entry *e[LOOM_LIMIT_SCOPES_MAX];
    loom_limit_lease *ls;
    int64_t now_s = now_ms / 1000;
    int rc = 0;

    memset(st, 0, sizeof(*st));
    *lease = NULL;
    if (!l || n > LOOM_LIMIT_SCOPES_MAX || (n && !scopes))
        return loom__error_set(LOOM_EINVALID, "limits: bad scopes");
    for (size_t i = 0; i < n; i++)
        if (!scopes[i].name || !*scopes[i].name ||
            strlen(scopes[i].name) >= LOOM_LIMIT_SCOPE_SIZE)
            return loom__error_set(LOOM_EINVALID, "limits: bad scope name");
    if (!(ls = calloc(1, sizeof(*ls))))
        return loom__error_oom();
    pthread_mutex_lock(&l->lock);
    for (size_t i = 0; i < n; i++) {
        if (!(e[i] = lookup(l, scopes[i].name, now_s))) {
            rc = loom__error_oom();
            goto out;
        }
        if (refuses(l, e[i], &scopes[i], i, now_ms, st, &rc))
            goto out;
    }
    for (size_t i = 0; i < n; i++) {
        win_add(&e[i]->req, now_s, 1);
        e[i]->running++;
        e[i]->holds++;
        ls->e[i] = e[i];
        ls->lim[i] = scopes[i].limits;
    }
    ls->n = n;
    *lease = ls;
    ls = NULL;
out:
    /* The headers tell the state even of a refused request. */
    if (rc == 0)
        rate_status(st, e, scopes, st->refused ? st->scope + 1 : n, now_ms);
    pthread_mutex_unlock(&l->lock);
    free(ls);
    return rc;
}

void loom_limiter_release(loom_limiter *l, loom_limit_lease *lease)
{
    if (!l || !lease)
        return;
    pthread_mutex_lock(&l->lock);
    for (size_t i = 0; i < lease->n; i++) {
        lease->e[i]->running--;
        lease->e[i]->holds--;
    }
    pthread_mutex_unlock(&l->lock);
    free(lease);
}

int loom_limiter_reserve(loom_limiter *l, loom_limit_lease *lease,
                         int64_t now_ms, int64_t worst_micros,
                         loom_limit_status *st, loom_limit_reservation **out)
{
    loom_limit_reservation *res;
    int rc = 0;

    memset(st, 0, sizeof(*st));
    *out = NULL;
    if (!l || !lease)
        return loom__error_set(LOOM_EINVALID, "limits: no lease");
    if (!(res = calloc(1, sizeof(*res))))
        return loom__error_oom();
    res->worst = worst_micros;
    pthread_mutex_lock(&l->lock);
    /* Check every budget first, then reserve in all: all or none. */
    for (size_t i = 0; i < lease->n && !st->refused; i++) {
        const loom_limits *lim = &lease->lim[i];
        entry *e = lease->e[i];
        if (lim->budget_micros <= 0)
            continue;
        if ((rc = budget_ready(l, e, lim, now_ms)) != 0)
            goto out;
        if (worst_micros < 0) {
            if (!lim->budget_allow_unpriced)
                refuse_budget(st, i, e, LOOM_LIMIT_UNPRICED,
                              lim->budget_micros);
        } else if (e->spent + e->reserved > lim->budget_micros - worst_micros) {
            refuse_budget(st, i, e, LOOM_LIMIT_BUDGET, lim->budget_micros);
        }
    }
    if (st->refused)
        goto out;
    for (size_t i = 0; i < lease->n; i++) {
        entry *e = lease->e[i];
        res->e[i] = e;
        e->holds++;
        if (lease->lim[i].budget_micros <= 0 || worst_micros < 0)
            continue;
        res->charged[i] = 1;
        res->period[i] = e->period;
        res->period_start[i] = e->period_start;
        e->reserved += worst_micros;
    }
    res->n = lease->n;
    *out = res;
    res = NULL;
out:
    pthread_mutex_unlock(&l->lock);
    free(res);
    return rc;
}

int loom_limiter_settle(loom_limiter *l, loom_limit_reservation *res,
                        int64_t now_ms, int64_t real_micros, long real_tokens)
{
    int64_t now_s = now_ms / 1000, cost;
    int rc = 0;

    if (!l || !res)
        return 0;
    cost = real_micros >= 0 ? real_micros : res->worst;
    pthread_mutex_lock(&l->lock);
    for (size_t i = 0; i < res->n; i++) {
        entry *e = res->e[i];
        if (real_tokens > 0)
            win_add(&e->tok, now_s, real_tokens);
        /* A period that rolled over meanwhile dropped its reservations. */
        if (res->charged[i] && e->period == res->period[i] &&
            e->period_start == res->period_start[i]) {
            e->reserved -= res->worst;
            e->spent += cost;
        }
    }
    pthread_mutex_unlock(&l->lock);
    /* The states are held until here: their names stay valid. */
    for (size_t i = 0; i < res->n; i++) {
        int src;
        if (!res->charged[i] || cost <= 0 || !l->st)
            continue;
        src = loom_store_spend_add(l->st, res->e[i]->name, res->period[i],
                                   res->period_start[i], cost, now_ms);
        if (src && !rc)
            rc = src;
    }
    pthread_mutex_lock(&l->lock);
    for (size_t i = 0; i < res->n; i++)
        res->e[i]->holds--;
    pthread_mutex_unlock(&l->lock);
    free(res);
    return rc;
}
