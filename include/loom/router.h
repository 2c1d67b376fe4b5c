/*
 * loom/router.h: models as the config describes them, behind one
 * loom_provider: per-model request options, fallbacks with cooldowns,
 * and what each call cost.
 *
 * A router is built from a model name ("provider/model"). It holds the
 * model's deployment (its provider's adapter, upstream id and request
 * options) and those of its `fallbacks`, in order. complete() asks the
 * first deployment that is not cooling down; when that fails with a
 * failure another model may not share (429, 5xx, overload, a timeout, a
 * dropped connection, or a prompt too long for its context window)
 * before any output reached the caller, it tries the next one. Other
 * failures (400, 401, ...) and failures after output are returned as
 * they are. A deployment that fails `failures_before_cooldown` times in
 * a row is skipped for `cooldown_ms` (unless every deployment is cooling
 * down). The response names the model that answered
 * (loom_llm_response.model) and, when that model has prices, the cost of
 * the call in micro-dollars (usage.cost_micros, cost_known). See
 * docs/routing.md.
 *
 * Threads: a router may serve any number of calls at once (its adapters
 * do); its health record is shared under a mutex, and so may be shared
 * by many routers.
 */
#ifndef LOOM_ROUTER_H
#define LOOM_ROUTER_H

#include "common.h"
#include "config.h"
#include "llm.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The cost of one call's usage at prices, in micro-dollars (1e-6 USD),
 * into *out. prompt_tokens include cached_tokens (billed at cached_input)
 * and cache_write_tokens (billed at cache_write); the rest of the prompt
 * at input. completion_tokens include reasoning_tokens (billed at
 * reasoning); the rest at output. Unset optional prices bill at input or
 * output (see loom_model_prices); counts below 0 count as 0, and parts
 * larger than their whole are cut to it. Each kind's tokens times its
 * price is summed exactly (integers, no floating point), then divided by
 * one million once and rounded half up: the cost is the exact amount to
 * the nearest micro-dollar. LOOM_ENOTFOUND when prices are not set (the
 * cost is unknown), LOOM_ETOOLARGE when it does not fit in 63 bits,
 * LOOM_EINVALID for NULL; *out is 0 then.
 */
int loom_cost_compute(int64_t *out, const loom_usage *usage,
                      const loom_model_prices *prices);

/*
 * What bounds one call's cost: the highest prices of any model the call
 * may reach (input: the highest of input, cached input and cache-write
 * prices; output: of output and reasoning prices) and the most output
 * tokens it may write. A budget reserves a call's worst case from it
 * before the call (loom/run.h loom_call_gate).
 */
typedef struct {
    int priced;      /* every model the call may reach has prices */
    int64_t input;   /* micro-dollars per million prompt tokens */
    int64_t output;  /* micro-dollars per million output tokens */
    long max_output; /* the call's output limit; 0: none known */
} loom_call_bound;

/*
 * Fills *out for req sent to p. A router (loom_router_new) answers for
 * its model and its fallbacks: max_output is req->max_tokens cut to each
 * model's max_output_tokens (else that), the largest over them, 0 when
 * one of them has no limit at all. Any other provider: unpriced, and
 * max_output is req->max_tokens. LOOM_EINVALID for NULL arguments.
 */
int loom_provider_call_bound(loom_provider *p, const loom_llm_request *req,
                             loom_call_bound *out);

/* ---- health: failures and cooldowns ------------------------------------ */

/*
 * The record of which deployments ("provider/model") are failing: for
 * each, the failures in a row and until when it is cooling down. Only
 * failing deployments are kept, at most LOOM_ROUTER_HEALTH_MAX; past that
 * an entry whose cooldown is over makes room, and without one the new
 * failure is not recorded (it then never cools down).
 */
typedef struct loom_router_health loom_router_health;

#define LOOM_ROUTER_HEALTH_MAX 1024

/* An empty record on the monotonic clock. LOOM_ENOMEM. */
int loom_router_health_new(loom_router_health **out);

/* NULL is a no-op. No router may be using it. */
void loom_router_health_free(loom_router_health *h);

/*
 * Replaces the clock (milliseconds, never going back): tests move time
 * by hand. NULL restores the monotonic clock. Not while calls run.
 */
void loom_router_health_set_clock(loom_router_health *h,
                                  int64_t (*now_ms)(void *payload),
                                  void *payload);

/*
 * Records one outcome of deployment name: a success forgets its
 * failures; a failure counts one more, and the count reaching
 * policy->failures_before_cooldown starts a cooldown of
 * policy->cooldown_ms (none when 0). After a cooldown one more failure
 * starts the next; a success clears the record.
 */
void loom_router_health_note(loom_router_health *h, const char *name,
                             int failed, const loom_routing_policy *policy);

/* 1 when name is cooling down now (*until_ms, when given, says until
 * when on the record's clock), else 0. */
int loom_router_health_cooling(loom_router_health *h, const char *name,
                               int64_t *until_ms);

/* Deployments on record (failing or cooling down). */
size_t loom_router_health_size(loom_router_health *h);

/* ---- routers ------------------------------------------------------------ */

/*
 * What a run puts in each request for the model it asked for (the router
 * fits the request to each fallback itself). Strings are borrowed from
 * the router that filled this: valid until it is freed.
 */
typedef struct {
    const char *model;    /* "provider/model" */
    const char *upstream; /* its upstream id */
    long max_output_tokens; /* 0: unset */
    /* Reasoning controls; unset (0, NULL) unless capabilities.reasoning. */
    long thinking_budget;
    const char *reasoning_effort;
    int prompt_cache;
    int chain_responses;
    loom_model_capabilities capabilities;
} loom_model_request_options;

/* Finds the adapter of a provider by name; NULL when there is none. */
typedef loom_provider *(*loom_provider_lookup_fn)(const char *provider,
                                                  void *payload);

typedef struct {
    unsigned version;
    /* Shared failure record; NULL: the router keeps its own. Borrowed:
     * it must outlive the router. */
    loom_router_health *health;
    /* Adapters to use (borrowed: they must outlive the router), e.g. a
     * server's, so connections are shared. NULL: the router builds one
     * per provider with loom_provider_new and owns them. */
    loom_provider_lookup_fn lookup;
    void *lookup_payload;
} loom_router_options;

#define LOOM_ROUTER_OPTIONS_VERSION 1
#define LOOM_ROUTER_OPTIONS_INIT                                               \
    {                                                                          \
        .version = LOOM_ROUTER_OPTIONS_VERSION                                 \
    }

/*
 * Builds the router of model_name (listed under `models`, or an unlisted
 * "provider/model" whose provider exists) with its fallbacks. Everything
 * it needs from cfg is copied: cfg may be freed after. opts may be NULL
 * (the defaults). When req_out is given it gets the model's request
 * options. The provider's name is model_name. LOOM_ENOTFOUND when the
 * model, a fallback or a provider does not resolve, LOOM_EINVALID for an
 * adapter that cannot be built (an unknown kind) or bad options,
 * LOOM_ENOMEM.
 */
int loom_router_new(loom_provider **out, const loom_config *cfg,
                    const char *model_name, const loom_router_options *opts,
                    loom_model_request_options *req_out);

/*
 * The one rule for a model name a user gives (`loom run -m`, a chat
 * request's `model`; docs/routing.md#model-names):
 * - "provider/model" is that model (listed under `models`, or unlisted
 *   with an existing provider);
 * - a bare name ("gpt-4o") is the listed model whose name after its
 *   provider, or whose upstream id, it is (the first in the file), else
 *   that model of default_model's provider (NULL default_model: the first
 *   provider's).
 * *out (caller frees) is the "provider/model" to give loom_router_new.
 * LOOM_ENOTFOUND when the name does not resolve (the message says what
 * is known: listed models and providers), LOOM_EINVALID for NULL
 * arguments or an empty name, LOOM_ENOMEM. "agent/<name>" is not a model:
 * the session layer resolves it first (loom_session_resolve_model).
 */
int loom_router_resolve_name(char **out, const loom_config *cfg,
                             const char *name, const char *default_model);

/*
 * loom_router_new with its own adapters and health record: what a
 * program that runs one model at a time (loom run) needs.
 */
int loom_model_provider_new(loom_provider **out, const loom_config *cfg,
                            const char *model_name,
                            loom_model_request_options *req_out);

#ifdef __cplusplus
}
#endif
#endif
