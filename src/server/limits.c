/*
 * The server's side of limits and budgets (docs/accounts.md "Limits",
 * "Budgets"): which scopes a request counts against, its admission
 * before a run starts, the call gate that reserves each model call's
 * worst case, and the answers past a limit, in OpenAI's shapes.
 *
 * A request with an API key counts against three scopes: the key
 * ("key:<id>"), its user ("user:<workspace>/<name>") and the user's
 * workspace ("workspace:<id>"), each with its own limits (the key's from
 * the key, the others' from the store: loom_store_account_limits). The
 * counting itself is loom/limits.h's; this file turns its status into
 * headers (x-ratelimit-*, on every answer to a request that reached
 * admission) and errors (429 rate_limit_exceeded with Retry-After, 429
 * insufficient_quota), and writes "budget.exhausted" to the audit log
 * the first time a budget refuses something in its period.
 */
#include "core/clock.h"
#include "core/error.h"
#include "loom/log.h"
#include "server/srvpriv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- headers ------------------------------------------------------------- */

/* A duration as OpenAI writes it: "17ms", "1.5s", "6m0s". */
static void duration(char *out, size_t n, int64_t ms)
{
    if (ms < 0)
        ms = 0;
    if (ms < 1000)
        snprintf(out, n, "%lldms", (long long)ms);
    else if (ms < 60000 && ms % 1000 == 0)
        snprintf(out, n, "%llds", (long long)(ms / 1000));
    else if (ms < 60000)
        snprintf(out, n, "%.3gs", (double)ms / 1000.0);
    else
        snprintf(out, n, "%lldm%llds", (long long)(ms / 60000),
                 (long long)((ms % 60000 + 999) / 1000));
}

static void header_long(srv_request *r, const char *name, long v)
{
    char buf[32];

    snprintf(buf, sizeof(buf), "%ld", v);
    srv_set_header(r, name, buf);
}

static void header_duration(srv_request *r, const char *name, int64_t ms)
{
    char buf[48];

    duration(buf, sizeof(buf), ms);
    srv_set_header(r, name, buf);
}

/* The x-ratelimit-* headers of each kind that has a limit. */
static void rate_headers(srv_request *r, const loom_limit_status *st)
{
    if (!r)
        return;
    if (st->requests_limit) {
        header_long(r, "x-ratelimit-limit-requests", st->requests_limit);
        header_long(r, "x-ratelimit-remaining-requests",
                    st->requests_remaining);
        header_duration(r, "x-ratelimit-reset-requests", st->requests_reset_ms);
    }
    if (st->tokens_limit) {
        header_long(r, "x-ratelimit-limit-tokens", st->tokens_limit);
        header_long(r, "x-ratelimit-remaining-tokens", st->tokens_remaining);
        header_duration(r, "x-ratelimit-reset-tokens", st->tokens_reset_ms);
    }
}

static void retry_headers(srv_request *r, int64_t ms)
{
    char buf[32];

    if (!r)
        return;
    if (ms < 1)
        ms = 1;
    snprintf(buf, sizeof(buf), "%lld", (long long)((ms + 999) / 1000));
    srv_set_header(r, "Retry-After", buf);
    snprintf(buf, sizeof(buf), "%lld", (long long)ms);
    srv_set_header(r, "retry-after-ms", buf);
}

/* ---- scopes -------------------------------------------------------------- */

/* What a scope is, for messages: "API key 3f9a...", "user acme/alice". */
static void scope_label(char *out, size_t n, const char *scope)
{
    static const struct {
        const char *prefix, *label;
    } kinds[] = {
        {"key:", "API key "}, {"user:", "user "}, {"workspace:", "workspace "}};

    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        size_t p = strlen(kinds[i].prefix);
        if (!strncmp(scope, kinds[i].prefix, p)) {
            snprintf(out, n, "%s%s", kinds[i].label, scope + p);
            return;
        }
    }
    snprintf(out, n, "%s", scope);
}

/* "budget.exhausted" in the audit log (once per scope and period). */
static void note_exhausted(srv_admission *a, const loom_limit_status *st,
                           const char *model)
{
    loom_store *store = srv_store(a->s);
    const char *scope = a->scopes[st->scope];
    json_t *detail;

    loom_info("budget: %s has used its budget of %lld micro-dollars", scope,
              (long long)st->budget_micros);
    if (!store || !st->exhausted_first)
        return;
    detail = json_pack("{s:s,s:I,s:s?}", "scope", scope, "budget_micros",
                       (json_int_t)st->budget_micros, "model", model);
    if (loom_store_audit_add(store, "server", "budget.exhausted",
                             a->key_id[0] ? a->key_id : NULL, a->workspace,
                             a->user, detail) != 0)
        loom_warn("budget: cannot write the audit log: %s", loom_error_last());
    json_decref(detail);
}

/* ---- the call gate ------------------------------------------------------- */

static int gate_reserve(void *payload, const char *model, int64_t worst_micros,
                        long worst_tokens, void **ticket)
{
    srv_admission *a = payload;
    loom_limit_reservation *res = NULL;
    loom_limit_status st;
    int rc;

    (void)worst_tokens;
    *ticket = NULL;
    rc = loom_limiter_reserve(a->s->limiter, a->lease, loom__unix_ms(),
                              worst_micros, &st, &res);
    if (rc != 0) {
        /* A spend that cannot be read cannot be checked: no call. */
        loom_warn("budget: %s", loom_error_last());
        atomic_fetch_add(&a->refused, 1);
        return 1;
    }
    if (st.refused) {
        if (st.refused == LOOM_LIMIT_BUDGET)
            note_exhausted(a, &st, model);
        else
            loom_info("budget: %s allows no model without prices (%s)",
                      a->scopes[st.scope], model ? model : "?");
        atomic_fetch_add(&a->refused, 1);
        return 1;
    }
    atomic_fetch_add(&a->granted, 1);
    *ticket = res;
    return 0;
}

static void gate_settle(void *payload, void *ticket, int64_t real_micros,
                        long real_tokens)
{
    srv_admission *a = payload;

    if (loom_limiter_settle(a->s->limiter, ticket, loom__unix_ms(), real_micros,
                            real_tokens) != 0)
        loom_warn("budget: a call's spend was not stored: %s",
                  loom_error_last());
}

/* ---- admission ----------------------------------------------------------- */

void srv__admission_init(srv_admission *a, srv_server *s)
{
    memset(a, 0, sizeof(*a));
    a->s = s;
    a->gate.payload = a;
    atomic_init(&a->granted, 0);
    atomic_init(&a->refused, 0);
}

void srv__admission_release(srv_admission *a)
{
    if (a->lease)
        loom_limiter_release(a->s->limiter, a->lease);
    a->lease = NULL;
    free(a->scopes);
    a->scopes = NULL;
}

/* 1 when a scope with a budget refuses models without prices. */
static int budget_refuses_unpriced(const loom_limit_scope *sc, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (sc[i].limits.budget_micros > 0 &&
            !sc[i].limits.budget_allow_unpriced)
            return 1;
    return 0;
}

/* 0 when model has prices (or no such model is configured: the gate
 * decides), else SRV_EUNPRICED. */
static int check_priced(srv_server *s, const char *model)
{
    const loom_model_config *m = NULL;
    loom_model_config tmp;
    int priced;

    if (!model || srv_model(s, model, &m, &tmp) != 0)
        return 0;
    priced = m->prices.set;
    loom_model_config_clear(&tmp);
    return priced ? 0
                  : loom__error_set(SRV_EUNPRICED,
                                    "the model '%s' has no prices, and a "
                                    "budget of this API key allows none "
                                    "without them",
                                    model);
}

/* The error of a refused admission, with its message and headers. */
static int refusal(srv_admission *a, srv_request *r, const loom_limit_scope *sc,
                   const loom_limit_status *st)
{
    char who[LOOM_LIMIT_SCOPE_SIZE + 16];
    const loom_limits *l = &sc[st->scope].limits;

    scope_label(who, sizeof(who), sc[st->scope].name);
    switch (st->refused) {
    case LOOM_LIMIT_REQUESTS:
    case LOOM_LIMIT_TOKENS: {
        int tokens = st->refused == LOOM_LIMIT_TOKENS;
        retry_headers(r, st->retry_after_ms);
        return loom__error_set(
            tokens ? SRV_ERATE_TOKENS : SRV_ERATE_REQUESTS,
            "Rate limit reached for %s per minute (%s) of %s: limit %ld. "
            "Please try again in %llds.",
            tokens ? "tokens" : "requests", tokens ? "TPM" : "RPM", who,
            tokens ? l->tpm : l->rpm,
            (long long)(st->retry_after_ms + 999) / 1000);
    }
    case LOOM_LIMIT_CONCURRENT:
        retry_headers(r, st->retry_after_ms);
        return loom__error_set(SRV_ERATE_REQUESTS,
                               "Rate limit reached for concurrent runs of "
                               "%s: limit %ld. Please try again once one of "
                               "them has ended.",
                               who, l->max_concurrent);
    default:
        note_exhausted(a, st, NULL);
        return loom__error_set(SRV_EQUOTA,
                               "the budget of %s (%lld micro-dollars per "
                               "%s) is used up",
                               who, (long long)l->budget_micros,
                               loom_budget_period_name(l->budget_period));
    }
}

int srv__admit(srv_admission *a, const srv_run_spec *sp, const char *model)
{
    const srv_identity *who = sp->who;
    loom_store *store = srv_store(a->s);
    loom_limit_scope sc[3];
    loom_limit_status st;
    loom_limits ul, wl;
    size_t n = 0;
    int rc;

    /* A token (mode jwt) has no key: its user's and workspace's limits
     * hold all the same. */
    if (!srv_identity_isolated(who))
        return 0;
    if (!a->scopes &&
        !(a->scopes = calloc(LOOM_LIMIT_SCOPES_MAX, sizeof(*a->scopes))))
        return loom__error_oom();
    snprintf(a->key_id, sizeof(a->key_id), "%s", who->key.id);
    snprintf(a->workspace, sizeof(a->workspace), "%s", who->key.workspace);
    snprintf(a->user, sizeof(a->user), "%s", who->key.user);
    memset(&ul, 0, sizeof(ul));
    memset(&wl, 0, sizeof(wl));
    if (store && (rc = loom_store_account_limits(store, a->workspace, a->user,
                                                 &ul, &wl)) != 0)
        return rc;
    if (who->kind == SRV_CALLER_KEY) {
        snprintf(a->scopes[n], LOOM_LIMIT_SCOPE_SIZE, "key:%s", a->key_id);
        sc[n++].limits = who->key.limits;
    }
    snprintf(a->scopes[n], LOOM_LIMIT_SCOPE_SIZE, "user:%s/%s", a->workspace,
             a->user);
    sc[n++].limits = ul;
    snprintf(a->scopes[n], LOOM_LIMIT_SCOPE_SIZE, "workspace:%s", a->workspace);
    sc[n++].limits = wl;
    for (size_t i = 0; i < n; i++)
        sc[i].name = a->scopes[i];
    a->nscopes = n;
    if (budget_refuses_unpriced(sc, n) && (rc = check_priced(a->s, model)) != 0)
        return rc;
    if ((rc = loom_limiter_admit(a->s->limiter, sc, n, loom__unix_ms(), &st,
                                 &a->lease)) != 0)
        return rc;
    rate_headers(sp->request, &st);
    if (st.refused)
        return refusal(a, sp->request, sc, &st);
    /* The gate asks only where a budget or tokens per minute count. */
    for (size_t i = 0; i < n; i++)
        if (sc[i].limits.budget_micros > 0 || sc[i].limits.tpm > 0) {
            a->gate.reserve = gate_reserve;
            a->gate.settle = gate_settle;
        }
    return 0;
}

int srv_reply_quota(srv_request *r, const char *detail)
{
    return srv_reply_error(
        r, 429, "insufficient_quota", NULL, "insufficient_quota",
        "You exceeded your current quota: %s.",
        detail && *detail ? detail : "a budget of this API key is used up");
}
