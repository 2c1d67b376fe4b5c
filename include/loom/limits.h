/*
 * loom/limits.h: rate limits, concurrency and budgets, counted exactly
 * under concurrency (docs/accounts.md "Limits", "Budgets").
 *
 * A request counts against several scopes at once: its API key, the
 * key's user and the user's workspace, each with its own loom_limits.
 * The limiter is the one interface every counter goes through:
 *
 * - admit: before a request starts a run, counts it against every
 *   scope's requests per minute, checks the tokens of the last minute
 *   and the budget left, and takes a slot of every scope's concurrent
 *   runs; all of it or nothing (a refused request counts nowhere). The
 *   lease it returns is the request's until loom_limiter_release.
 * - reserve: before each model call, its worst-case cost is reserved
 *   against every budget of the lease's scopes, all or none; settle
 *   replaces it with the real cost (added to the stored spend) and
 *   counts the call's tokens per minute. However many calls run at once,
 *   the spend plus what is reserved never passes a budget.
 *
 * This implementation keeps the counters of a minute and the
 * reservations in process (one mutex; a request costs a few hash
 * lookups) and the spend in the store (loom_store_spend_*), so it
 * survives a restart; it is exact for one server process per store. A
 * limiter shared by several instances (Redis counters, PostgreSQL spend)
 * implements the same functions behind the same opaque handles; callers
 * do not change.
 *
 * Windows: a minute is the last 60 whole seconds, counted in one-second
 * steps (a request counts until the second it was made is 60 s old).
 * Budget periods are UTC days and months, or the whole life of the
 * scope ("total").
 */
#ifndef LOOM_LIMITS_H
#define LOOM_LIMITS_H

#include "accounts.h"
#include "common.h"
#include "store.h"

#include <jansson.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Scopes a request counts against, at most. */
#define LOOM_LIMIT_SCOPES_MAX 4
/* Bytes of a scope name, at most, with its NUL. */
#define LOOM_LIMIT_SCOPE_SIZE 160

/* One account a request counts against. */
typedef struct {
    /* "key:<id>", "user:<workspace>/<name>", "workspace:<id>" (any text
     * of 1 to LOOM_LIMIT_SCOPE_SIZE - 1 bytes); copied. */
    const char *name;
    loom_limits limits;
} loom_limit_scope;

/* What refused a request or a call. */
typedef enum {
    LOOM_LIMIT_OK = 0,
    LOOM_LIMIT_REQUESTS,   /* requests per minute */
    LOOM_LIMIT_TOKENS,     /* tokens per minute */
    LOOM_LIMIT_CONCURRENT, /* runs at once */
    LOOM_LIMIT_BUDGET,     /* the budget is spent or reserved */
    LOOM_LIMIT_UNPRICED    /* a model without prices under a budget */
} loom_limit_kind;

/*
 * The state of the tightest scope, for the x-ratelimit-* headers, and
 * why a request or call was refused. A limit of 0 means no scope has
 * one; times are milliseconds from now.
 */
typedef struct {
    loom_limit_kind refused;   /* LOOM_LIMIT_OK: let through */
    size_t scope;              /* the scope that refused (its index) */
    int64_t retry_after_ms;    /* refused for a rate: when it may pass */
    long requests_limit;       /* the rpm of the scope with fewest left */
    long requests_remaining;   /* after this request */
    int64_t requests_reset_ms; /* until its window is empty again */
    long tokens_limit;         /* likewise for tpm */
    long tokens_remaining;
    int64_t tokens_reset_ms;
    int64_t budget_micros; /* refused for a budget: that budget */
    /* Refused for a budget, the first time in this scope's period: the
     * caller writes "budget.exhausted" to the audit log. */
    int exhausted_first;
} loom_limit_status;

typedef struct loom_limiter loom_limiter;
typedef struct loom_limit_lease loom_limit_lease;
typedef struct loom_limit_reservation loom_limit_reservation;

/*
 * A limiter whose spend is kept in st (borrowed; it must outlive the
 * limiter; NULL: spend in memory only, lost at exit). LOOM_ENOMEM.
 */
int loom_limiter_new(loom_limiter **out, loom_store *st);

/* NULL is a no-op. Every lease must have been released. */
void loom_limiter_free(loom_limiter *l);

/*
 * Admits a request at now_ms (Unix ms) against scopes[0..n) (n at most
 * LOOM_LIMIT_SCOPES_MAX). Refused (0, *lease NULL, st->refused set):
 * a scope's requests of the last minute reached its rpm, its tokens its
 * tpm, its runs its max_concurrent, or its budget is used up (spent and
 * reserved) or, with no more than a micro-dollar left, cannot pay for a
 * call. Admitted (0, *lease set): the request counts against every
 * scope's rpm and holds one of its concurrent runs until released. st is
 * filled either way. LOOM_EINVALID for bad scopes, LOOM_EIO from the
 * store (a spend not read yet), LOOM_ENOMEM.
 */
int loom_limiter_admit(loom_limiter *l, const loom_limit_scope *scopes,
                       size_t n, int64_t now_ms, loom_limit_status *st,
                       loom_limit_lease **lease);

/*
 * Ends a request: its concurrent-run slots are free again. Every
 * reservation of the lease must be settled first. NULL is a no-op.
 */
void loom_limiter_release(loom_limiter *l, loom_limit_lease *lease);

/*
 * Reserves worst_micros (a model call's worst-case cost; < 0: the model
 * has no prices) against every budget of the lease's scopes, in the
 * budget period of now_ms, all or none. Refused (0, *out NULL,
 * st->refused LOOM_LIMIT_BUDGET or LOOM_LIMIT_UNPRICED): a budget's
 * spend plus what is reserved plus worst_micros would pass it, or the
 * model has no prices and a scope with a budget does not allow unpriced
 * models (loom_limits.budget_allow_unpriced; an unpriced call then
 * counts nothing against it). Granted: 0 and *out, to settle exactly
 * once. LOOM_EIO, LOOM_ENOMEM.
 */
int loom_limiter_reserve(loom_limiter *l, loom_limit_lease *lease,
                         int64_t now_ms, int64_t worst_micros,
                         loom_limit_status *st, loom_limit_reservation **out);

/*
 * Replaces the reservation with the call's real cost (real_micros < 0:
 * unknown, counted as the reserved amount when it was priced, else
 * nothing), which is added to the stored spend of every budget it was
 * reserved against, and counts real_tokens against every scope's tokens
 * per minute at now_ms. Frees res. 0, or the store's error (the
 * in-process counters are settled even then: the spend missing from the
 * store is logged by the caller). NULL res: 0.
 */
int loom_limiter_settle(loom_limiter *l, loom_limit_reservation *res,
                        int64_t now_ms, int64_t real_micros, long real_tokens);

/* The start of the budget period of now_ms (Unix ms, UTC): the day's or
 * the month's first millisecond, 0 for total. */
int64_t loom_budget_period_start(loom_budget_period p, int64_t now_ms);

/* ---- the spend in the store ---------------------------------------------- */

/*
 * The micro-dollars spent by scope in the budget period (period and its
 * start, loom_budget_period_start) into *out: 0 when nothing is stored.
 */
int loom_store_spend_get(loom_store *st, const char *scope,
                         loom_budget_period period, int64_t period_start,
                         int64_t *out);

/* Adds micros (>= 0) to scope's spend in that period, at now (Unix ms). */
int loom_store_spend_add(loom_store *st, const char *scope,
                         loom_budget_period period, int64_t period_start,
                         int64_t micros, int64_t now);

/* {"data": [{"scope", "period", "period_start", "spent_micros",
 * "updated_at"}]} by scope, newest period first; scope_prefix (may be
 * NULL) narrows it to the scopes that start with it. */
int loom_store_spend_list(loom_store *st, const char *scope_prefix,
                          json_t **out);

/* ---- limits of users and workspaces ---------------------------------------
 */

/*
 * The limits of user (in workspace) and of workspace: zero for none, and
 * for a user or workspace that is not stored. Either out may be NULL.
 */
int loom_store_account_limits(loom_store *st, const char *workspace,
                              const char *user, loom_limits *user_out,
                              loom_limits *workspace_out);

/*
 * Replaces the limits of user in workspace (user NULL: of the workspace
 * itself) and writes "user.limits_changed" or "workspace.limits_changed"
 * (old and new limits) to the audit log, by actor (NULL: "api").
 * LOOM_ENOTFOUND when no such user or workspace; LOOM_EINVALID for a
 * bad name or limit.
 */
int loom_store_account_set_limits(loom_store *st, const char *workspace,
                                  const char *user, const loom_limits *limits,
                                  const char *actor);

/*
 * Writes one audit log entry: action ("budget.exhausted", ...), by actor
 * (NULL: "api"), about key_id, workspace and user (each may be NULL),
 * with detail (an object, or NULL; not taken).
 */
int loom_store_audit_add(loom_store *st, const char *actor, const char *action,
                         const char *key_id, const char *workspace,
                         const char *user, const json_t *detail);

#ifdef __cplusplus
}
#endif
#endif
