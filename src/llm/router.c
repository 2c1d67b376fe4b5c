/*
 * The model router (see loom/router.h and docs/routing.md): a
 * loom_provider over a model's deployment and its fallbacks.
 *
 * A router is immutable once built: each deployment is a copy of what the
 * config says about one model (upstream id, capabilities, reasoning and
 * caching options, prices, routing policy) plus the adapter of its
 * provider. The only shared, changing state is the health record, behind
 * its own mutex, so one router can serve concurrent runs. complete()
 * relays the adapter's events to the caller and notes whether any output
 * went through: once it has, a failure is final, because a fallback
 * would repeat or contradict what the caller already showed.
 */
#include "loom/router.h"
#include "core/clock.h"
#include "core/config_internal.h"
#include "core/error.h"
#include "core/fiber.h"
#include "llm/retry.h"
#include "loom/log.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* ---- health ---------------------------------------------------------- */

typedef struct {
    char *name;
    int failures;      /* in a row */
    int64_t until_ms;  /* cooling down before this time; 0: not */
} health_entry;

struct loom_router_health {
    pthread_mutex_t lock;
    int64_t (*now_ms)(void *payload);
    void *payload;
    health_entry *items;
    size_t len, cap;
};

static int64_t monotonic_ms(void *payload)
{
    (void)payload;
    return loom__mono_ms();
}

int loom_router_health_new(loom_router_health **out)
{
    loom_router_health *h;

    if (!out)
        return loom__error_set(LOOM_EINVALID, "router health: NULL out");
    *out = NULL;
    if (!(h = calloc(1, sizeof(*h))))
        return loom__error_oom();
    if (pthread_mutex_init(&h->lock, NULL) != 0) {
        free(h);
        return loom__error_oom();
    }
    h->now_ms = monotonic_ms;
    *out = h;
    return 0;
}

void loom_router_health_free(loom_router_health *h)
{
    if (!h)
        return;
    for (size_t i = 0; i < h->len; i++)
        free(h->items[i].name);
    free(h->items);
    pthread_mutex_destroy(&h->lock);
    free(h);
}

void loom_router_health_set_clock(loom_router_health *h,
                                  int64_t (*now_ms)(void *payload),
                                  void *payload)
{
    if (!h)
        return;
    pthread_mutex_lock(&h->lock);
    h->now_ms = now_ms ? now_ms : monotonic_ms;
    h->payload = now_ms ? payload : NULL;
    pthread_mutex_unlock(&h->lock);
}

/* The entry of name, or NULL. Called with the lock held. */
static health_entry *find_entry(loom_router_health *h, const char *name)
{
    for (size_t i = 0; i < h->len; i++)
        if (strcmp(h->items[i].name, name) == 0)
            return &h->items[i];
    return NULL;
}

static void remove_entry(loom_router_health *h, health_entry *e)
{
    free(e->name);
    *e = h->items[--h->len];
}

/*
 * A new entry for name, making room when the record is full by dropping
 * one whose cooldown is over (or never started). NULL when there is no
 * room or no memory: the failure then goes unrecorded, which only means
 * that deployment is not cooled down. Called with the lock held.
 */
static health_entry *add_entry(loom_router_health *h, const char *name,
                               int64_t now)
{
    health_entry *e;
    char *copy;

    if (h->len >= LOOM_ROUTER_HEALTH_MAX) {
        size_t i;
        for (i = 0; i < h->len && h->items[i].until_ms > now; i++)
            ;
        if (i == h->len)
            return NULL;
        remove_entry(h, &h->items[i]);
    }
    if (h->len == h->cap) {
        size_t cap = h->cap ? h->cap * 2 : 8;
        health_entry *v = realloc(h->items, cap * sizeof(*v));
        if (!v)
            return NULL;
        h->items = v;
        h->cap = cap;
    }
    if (!(copy = strdup(name)))
        return NULL;
    e = &h->items[h->len++];
    e->name = copy;
    e->failures = 0;
    e->until_ms = 0;
    return e;
}

void loom_router_health_note(loom_router_health *h, const char *name,
                             int failed, const loom_routing_policy *policy)
{
    health_entry *e;
    int64_t now;

    if (!h || !name || !policy)
        return;
    pthread_mutex_lock(&h->lock);
    now = h->now_ms(h->payload);
    e = find_entry(h, name);
    if (!failed) {
        if (e)
            remove_entry(h, e);
    } else if (e || (e = add_entry(h, name, now)) != NULL) {
        if (e->failures < INT32_MAX)
            e->failures++;
        if (e->failures >= policy->failures_before_cooldown &&
            policy->cooldown_ms > 0)
            e->until_ms = now + policy->cooldown_ms;
    }
    pthread_mutex_unlock(&h->lock);
}

int loom_router_health_cooling(loom_router_health *h, const char *name,
                               int64_t *until_ms)
{
    health_entry *e;
    int cooling = 0;

    if (until_ms)
        *until_ms = 0;
    if (!h || !name)
        return 0;
    pthread_mutex_lock(&h->lock);
    e = find_entry(h, name);
    if (e && e->until_ms > h->now_ms(h->payload)) {
        cooling = 1;
        if (until_ms)
            *until_ms = e->until_ms;
    }
    pthread_mutex_unlock(&h->lock);
    return cooling;
}

size_t loom_router_health_size(loom_router_health *h)
{
    size_t n;

    if (!h)
        return 0;
    pthread_mutex_lock(&h->lock);
    n = h->len;
    pthread_mutex_unlock(&h->lock);
    return n;
}

/* ---- the router ------------------------------------------------------- */

/* One model the router may ask: a copy of its config and its adapter. */
typedef struct {
    char *name;     /* "provider/model" */
    char *upstream;
    char *provider_name;
    loom_provider *provider;
    int owned;      /* the router built provider and frees it */
    loom_model_capabilities caps;
    char *effort;
    long budget;
    int prompt_cache, chain_responses;
    long max_output_tokens;
    loom_model_prices prices;
    loom_routing_policy routing;
    long base_delay_ms, max_delay_ms; /* the provider's backoff */
} deployment;

typedef struct {
    loom_provider base;
    deployment *deps;
    size_t ndeps;
    loom_router_health *health;
    int own_health;
} router;

/* What a failure means for routing. */
typedef enum {
    FAIL_FINAL = 0, /* return it: another model would fail the same way */
    FAIL_HEALTH,    /* the deployment is unwell: count it, try the next */
    FAIL_CONTEXT    /* too long for this model: try the next, not again */
} fail_class;

/*
 * Providers say "too long for the context window" in their own words and
 * codes (OpenAI context_length_exceeded, Anthropic "prompt is too long",
 * Gemini "input token count ... exceeds the maximum number of tokens",
 * vLLM "maximum context length"); matched case-insensitively in the type
 * and the message.
 */
static int is_context_error(const loom_upstream_error *e)
{
    static const char *const marks[] = {
        "context_length_exceeded", "context length", "context_length",
        "context window", "prompt is too long", "input is too long",
        "too many tokens", "maximum number of tokens", "reduce the length"};

    for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]); i++)
        if ((e->type && strcasestr(e->type, marks[i])) ||
            (e->message && strcasestr(e->message, marks[i])))
            return 1;
    return 0;
}

static fail_class classify(int rc, const loom_upstream_error *e)
{
    if (rc == LOOM_ETIMEDOUT)
        return FAIL_HEALTH;
    if (rc != LOOM_EUPSTREAM)
        return FAIL_FINAL;
    switch (e->kind) {
    case LOOM_UPSTREAM_RATE_LIMIT:
    case LOOM_UPSTREAM_SERVER: /* Anthropic's 529 overloaded too */
    case LOOM_UPSTREAM_TIMEOUT:
    case LOOM_UPSTREAM_CONNECTION:
        return FAIL_HEALTH;
    case LOOM_UPSTREAM_TOO_LARGE:
        return FAIL_CONTEXT;
    case LOOM_UPSTREAM_BAD_REQUEST:
    case LOOM_UPSTREAM_UNPROCESSABLE:
        return is_context_error(e) ? FAIL_CONTEXT : FAIL_FINAL;
    case LOOM_UPSTREAM_STREAM:
        /* An error event inside a stream: Anthropic sends overload that
         * way once the response has begun. */
        if ((e->type && strcasestr(e->type, "overloaded")) ||
            (e->message && strcasestr(e->message, "overloaded")))
            return FAIL_HEALTH;
        return is_context_error(e) ? FAIL_CONTEXT : FAIL_FINAL;
    default:
        return FAIL_FINAL;
    }
}

/* Relays the adapter's events, noting output and pricing usage. */
typedef struct {
    loom_llm_event_cb cb;
    void *payload;
    const deployment *d;
    int output;
} relay;

/* A usage event with its cost, when the deployment has prices. Its own
 * frame: the copy is not on the fiber's stack for every text chunk. */
LOOM_NOINLINE static int relay_usage(relay *r, const loom_llm_event *ev)
{
    loom_llm_event copy;
    int64_t cost;

    if (!r->d->prices.set ||
        loom_cost_compute(&cost, &ev->usage, &r->d->prices) != 0)
        return r->cb ? r->cb(ev, r->payload) : 0;
    copy = *ev;
    copy.usage.cost_micros = cost;
    return r->cb ? r->cb(&copy, r->payload) : 0;
}

static int relay_event(const loom_llm_event *ev, void *payload)
{
    relay *r = payload;

    switch (ev->type) {
    case LOOM_LLM_TEXT:
    case LOOM_LLM_REASONING:
    case LOOM_LLM_TOOL_CALL_DELTA:
    case LOOM_LLM_TOOL_CALLS:
        r->output = 1;
        break;
    case LOOM_LLM_USAGE:
        return relay_usage(r, ev);
    default:
        break;
    }
    return r->cb ? r->cb(ev, r->payload) : 0;
}

/*
 * The request as deployment d takes it. What the model cannot take is
 * left out (tools, parallel_tool_calls, reasoning controls). The caller's
 * request was built for the first deployment, so its options win there;
 * a fallback's own configured options win on it.
 */
static void fit_request(loom_llm_request *sub, const loom_llm_request *req,
                        const deployment *d, int primary)
{
    *sub = *req;
    sub->model = d->upstream;
    if (!d->caps.tools) {
        sub->tools = NULL;
        sub->tools_len = 0;
        sub->tool_choice.kind = LOOM_TOOL_CHOICE_AUTO;
        sub->tool_choice.function = NULL;
    }
    if (!d->caps.tools || !d->caps.parallel_tool_calls)
        sub->parallel_tool_calls = -1;
    /* The configured field, else the adapter's guess by the model's id. */
    sub->max_completion_tokens = d->caps.max_completion_tokens > 0    ? 1
                                 : d->caps.max_completion_tokens == 0 ? -1
                                                                      : 0;
    if (!d->caps.reasoning) {
        sub->thinking_budget = 0;
        sub->reasoning_effort = NULL;
    } else if (primary) {
        if (!sub->thinking_budget)
            sub->thinking_budget = d->budget;
        if (!sub->reasoning_effort)
            sub->reasoning_effort = d->effort;
    } else {
        if (d->budget)
            sub->thinking_budget = d->budget;
        if (d->effort)
            sub->reasoning_effort = d->effort;
    }
    if (!primary) {
        sub->prompt_cache = d->prompt_cache;
        sub->chain_responses = d->chain_responses;
    }
    if (d->max_output_tokens > 0 &&
        (sub->max_tokens <= 0 || sub->max_tokens > d->max_output_tokens))
        sub->max_tokens = d->max_output_tokens;
}

/*
 * Names the answering model and prices the call into resp. The error of a
 * failed call (rc) is what the caller must see: a cost that cannot be
 * computed is only logged, and the call's message is kept.
 */
static int finish_response(const deployment *d, loom_llm_response *resp,
                           int rc)
{
    char *saved = NULL;
    int64_t cost;

    free(resp->model);
    if (!(resp->model = strdup(d->name)))
        return loom__error_oom();
    resp->cost_known = 0;
    resp->usage.cost_micros = 0;
    if (!d->prices.set)
        return rc;
    if (rc != 0 && !(saved = strdup(loom_error_last())))
        return loom__error_oom();
    if (loom_cost_compute(&cost, &resp->usage, &d->prices) == 0) {
        resp->usage.cost_micros = cost;
        resp->cost_known = 1;
    } else {
        loom_warn("%s: %s", d->name, loom_error_last());
        if (saved)
            loom__error_set(rc, "%s", saved);
    }
    free(saved);
    return rc;
}

/*
 * The order to try: deployments not cooling down, in config order; when
 * every one is cooling down, all of them (a call that may fail beats one
 * that surely does).
 */
static size_t pick_order(router *r, unsigned char *order)
{
    /* loom_router_new makes at most that many. */
    size_t n = 0, nd = r->ndeps <= LOOM_MODEL_MAX_FALLBACKS + 1
                           ? r->ndeps
                           : LOOM_MODEL_MAX_FALLBACKS + 1;

    for (size_t i = 0; i < nd; i++) {
        if (nd > 1 &&
            loom_router_health_cooling(r->health, r->deps[i].name, NULL)) {
            loom_debug("%s: %s is cooling down: skipped", r->base.name,
                       r->deps[i].name);
            continue;
        }
        order[n++] = (unsigned char)i;
    }
    if (n == 0)
        for (size_t i = 0; i < nd; i++)
            order[n++] = (unsigned char)i;
    return n;
}

/*
 * Tries the deployments in order (see pick_order), each up to 1 +
 * routing.retries times, until one answers or a failure is final. The
 * response is always the last deployment's, named and priced by it.
 */
static int router_complete(loom_provider *base, const loom_llm_request *req,
                           loom_llm_event_cb cb, void *payload,
                           loom_llm_response *resp, loom_cancel *cancel)
{
    router *r = (router *)base;
    /* A byte each (at most LOOM_MODEL_MAX_FALLBACKS + 1 deployments): this
     * frame stays on a fiber's stack while the model streams. */
    unsigned char order[LOOM_MODEL_MAX_FALLBACKS + 1];
    size_t n;
    const deployment *d = NULL;
    char *last_msg = NULL;
    int rc = LOOM_ERROR, attempts = 0;
    unsigned seed = (unsigned)(uintptr_t)&seed ^ (unsigned)time(NULL);

    n = pick_order(r, order);
    for (size_t k = 0; k < n; k++) {
        loom_llm_request sub;
        fail_class fc = FAIL_FINAL;
        relay rl;

        d = &r->deps[order[k]];
        fit_request(&sub, req, d, order[k] == 0);
        for (int t = 0; t <= d->routing.retries; t++) {
            if (k > 0 || t > 0)
                loom_llm_response_clear(resp);
            rl.cb = cb;
            rl.payload = payload;
            rl.d = d;
            rl.output = 0;
            rc = loom_provider_complete(d->provider, &sub, relay_event, &rl,
                                        resp, cancel);
            attempts += resp->error.attempts > 0 ? resp->error.attempts : 1;
            if (rc == 0) {
                loom_router_health_note(r->health, d->name, 0, &d->routing);
                goto done;
            }
            fc = classify(rc, &resp->error);
            if (fc == FAIL_HEALTH)
                loom_router_health_note(r->health, d->name, 1, &d->routing);
            /* Final: the caller gets this answer, partial or not. */
            if (rc == LOOM_ECANCELED || loom_cancel_is_set(cancel) ||
                rl.output || resp->output_started || fc == FAIL_FINAL)
                goto done;
            free(last_msg);
            last_msg = strdup(loom_error_last());
            if (fc == FAIL_CONTEXT || t == d->routing.retries)
                break;
            /* A retry by the router: the adapter's own retries are spent,
             * so wait as the provider would before its next one. */
            {
                long ms = loom__retry_backoff(t + 1, d->base_delay_ms,
                                              d->max_delay_ms, &seed);
                loom_warn("%s: %s; router retry %d of %d in %ld ms",
                          r->base.name, last_msg ? last_msg : "", t + 1,
                          d->routing.retries, ms);
                if ((rc = loom__retry_sleep(ms, cancel)) != 0) {
                    loom__error_set(rc, "%s: cancelled", r->base.name);
                    goto done;
                }
            }
        }
        if (k + 1 < n)
            loom_warn("%s: %s failed (%s); falling back to %s", r->base.name,
                      d->name, last_msg ? last_msg : "",
                      r->deps[order[k + 1]].name);
        else if (n > 1)
            loom__error_set(rc, "%s (every model of %s failed; the last was "
                                "%s)",
                            last_msg ? last_msg : "model call failed",
                            r->base.name, d->name);
    }

done:
    if (d)
        rc = finish_response(d, resp, rc);
    resp->error.attempts = attempts;
    free(last_msg);
    return rc;
}

static void deployment_clear(deployment *d)
{
    free(d->name);
    free(d->upstream);
    free(d->provider_name);
    free(d->effort);
    if (d->owned)
        loom_provider_free(d->provider);
    memset(d, 0, sizeof(*d));
}

static void router_free(loom_provider *base)
{
    router *r = (router *)base;

    for (size_t i = 0; i < r->ndeps; i++)
        deployment_clear(&r->deps[i]);
    free(r->deps);
    if (r->own_health)
        loom_router_health_free(r->health);
    free(r->base.name);
    free(r);
}

static const loom_provider_vtable router_vt = {.version =
                                                   LOOM_PROVIDER_VTABLE_VERSION,
                                               .complete = router_complete,
                                               .free = router_free};

static int64_t max_price(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

int loom_provider_call_bound(loom_provider *p, const loom_llm_request *req,
                             loom_call_bound *out)
{
    const router *r;

    if (out)
        memset(out, 0, sizeof(*out));
    if (!p || !req || !out)
        return loom__error_set(LOOM_EINVALID, "call bound: NULL argument");
    out->max_output = req->max_tokens > 0 ? req->max_tokens : 0;
    if (p->vt != &router_vt)
        return 0;
    r = (const router *)p;
    out->priced = r->ndeps > 0;
    out->max_output = 0;
    for (size_t i = 0; i < r->ndeps; i++) {
        const deployment *d = &r->deps[i];
        const loom_model_prices *pr = &d->prices;
        long cap = d->max_output_tokens;

        if (req->max_tokens > 0 && (cap <= 0 || req->max_tokens < cap))
            cap = req->max_tokens;
        if (cap <= 0 || out->max_output < 0)
            out->max_output = -1;
        else if (cap > out->max_output)
            out->max_output = cap;
        if (!pr->set) {
            out->priced = 0;
            continue;
        }
        out->input = max_price(
            out->input,
            max_price(pr->input, max_price(pr->cached_input, pr->cache_write)));
        out->output =
            max_price(out->output, max_price(pr->output, pr->reasoning));
    }
    if (out->max_output < 0)
        out->max_output = 0;
    if (!out->priced)
        out->input = out->output = 0;
    return 0;
}

/* The adapter of provider pc: the caller's, one this router already
 * built, or a new one it owns. */
static int deployment_provider(router *r, deployment *d,
                               const loom_provider_config *pc,
                               const loom_router_options *o)
{
    if (o->lookup) {
        if (!(d->provider = o->lookup(pc->name, o->lookup_payload)))
            return loom__error_set(LOOM_ENOTFOUND,
                                   "model '%s': provider '%s' is not "
                                   "available",
                                   d->name, pc->name);
        return 0;
    }
    int rc;

    for (size_t i = 0; i < r->ndeps; i++) {
        if (r->deps[i].provider &&
            strcmp(r->deps[i].provider_name, pc->name) == 0) {
            d->provider = r->deps[i].provider;
            return 0;
        }
    }
    if ((rc = loom_provider_new(&d->provider, pc)) != 0)
        return rc;
    d->owned = 1;
    return 0;
}

/* Fills d from the config's model name. */
static int deployment_init(router *r, deployment *d, const loom_config *cfg,
                           const char *name, const loom_router_options *o)
{
    const loom_model_config *m = NULL;
    const loom_provider_config *pc;
    loom_model_config tmp;
    int rc;

    memset(d, 0, sizeof(*d));
    if ((rc = loom_config_model(&m, &tmp, cfg, name)) != 0)
        return rc;
    if (!(pc = loom_config_provider(cfg, m->provider))) {
        rc = loom__error_set(LOOM_ENOTFOUND,
                             "model '%s': provider '%s' is not configured",
                             name, m->provider);
        goto cleanup;
    }
    d->name = strdup(m->name);
    d->upstream = strdup(m->upstream);
    d->provider_name = strdup(pc->name);
    d->effort = m->reasoning_effort ? strdup(m->reasoning_effort) : NULL;
    if (!d->name || !d->upstream || !d->provider_name ||
        (m->reasoning_effort && !d->effort)) {
        rc = loom__error_oom();
        goto cleanup;
    }
    d->caps = m->capabilities;
    d->budget = m->capabilities.reasoning ? m->thinking_budget : 0;
    if (!m->capabilities.reasoning) {
        free(d->effort);
        d->effort = NULL;
    }
    d->prompt_cache = m->prompt_cache;
    d->chain_responses = m->chain_responses;
    d->max_output_tokens = m->max_output_tokens;
    d->prices = m->prices;
    d->routing = m->routing;
    if (d->routing.failures_before_cooldown < 1)
        d->routing.failures_before_cooldown = 1;
    if (d->routing.retries < 0)
        d->routing.retries = 0;
    d->base_delay_ms = pc->retry_base_delay_ms;
    d->max_delay_ms = pc->retry_max_delay_ms;
    rc = deployment_provider(r, d, pc, o);

cleanup:
    loom_model_config_clear(&tmp);
    return rc;
}

int loom_router_new(loom_provider **out, const loom_config *cfg,
                    const char *model_name, const loom_router_options *opts,
                    loom_model_request_options *req_out)
{
    loom_router_options defaults = LOOM_ROUTER_OPTIONS_INIT;
    const loom_model_config *m = NULL;
    loom_model_config tmp;
    router *r = NULL;
    size_t n;
    int rc;

    if (out)
        *out = NULL;
    if (req_out)
        memset(req_out, 0, sizeof(*req_out));
    if (!out || !cfg || !model_name)
        return loom__error_set(LOOM_EINVALID, "loom_router_new: NULL "
                                              "argument");
    if (!opts)
        opts = &defaults;
    if (opts->version != LOOM_ROUTER_OPTIONS_VERSION && opts->version != 0)
        return loom__error_set(LOOM_EINVALID, "router options: bad version");
    if ((rc = loom_config_model(&m, &tmp, cfg, model_name)) != 0)
        return rc;
    n = 1 + (m->fallbacks_len < LOOM_MODEL_MAX_FALLBACKS
                 ? m->fallbacks_len
                 : LOOM_MODEL_MAX_FALLBACKS);
    if (!(r = calloc(1, sizeof(*r))) ||
        !(r->deps = calloc(n, sizeof(*r->deps))) ||
        !(r->base.name = strdup(model_name))) {
        rc = loom__error_oom();
        goto fail;
    }
    r->base.vt = &router_vt;
    if (opts->health) {
        r->health = opts->health;
    } else {
        if ((rc = loom_router_health_new(&r->health)) != 0)
            goto fail;
        r->own_health = 1;
    }
    for (size_t i = 0; i < n; i++) {
        rc = deployment_init(r, &r->deps[i], cfg,
                             i == 0 ? model_name : m->fallbacks[i - 1], opts);
        /* Counted first so a half-built deployment is freed too. */
        r->ndeps = i + 1;
        if (rc != 0)
            goto fail;
    }
    if (req_out) {
        const deployment *d = &r->deps[0];
        req_out->model = d->name;
        req_out->upstream = d->upstream;
        req_out->max_output_tokens = d->max_output_tokens;
        req_out->thinking_budget = d->budget;
        req_out->reasoning_effort = d->effort;
        req_out->prompt_cache = d->prompt_cache;
        req_out->chain_responses = d->chain_responses;
        req_out->capabilities = d->caps;
    }
    loom_model_config_clear(&tmp);
    *out = &r->base;
    return 0;

fail:
    loom_model_config_clear(&tmp);
    if (r)
        router_free(&r->base);
    if (req_out)
        memset(req_out, 0, sizeof(*req_out));
    return rc;
}

int loom_model_provider_new(loom_provider **out, const loom_config *cfg,
                            const char *model_name,
                            loom_model_request_options *req_out)
{
    return loom_router_new(out, cfg, model_name, NULL, req_out);
}

/* The listed model a bare name stands for: the first whose name after its
 * provider, or whose upstream id, it is. NULL when none is. */
static const char *listed_bare(const loom_config *cfg, const char *name)
{
    for (size_t i = 0; i < cfg->models_len; i++) {
        const loom_model_config *m = &cfg->models[i];
        const char *slash = strchr(m->name, '/');
        if ((slash && strcmp(slash + 1, name) == 0) ||
            (m->upstream && strcmp(m->upstream, name) == 0))
            return m->name;
    }
    return NULL;
}

/* The provider a bare name goes to: default_model's, else the first. */
static const loom_provider_config *bare_provider(const loom_config *cfg,
                                                 const char *default_model)
{
    size_t plen = default_model ? loom__config_provider_part(default_model) : 0;
    const loom_provider_config *pc =
        plen ? loom__config_find_provider_n(cfg, default_model, plen) : NULL;

    return pc ? pc : cfg->providers_len ? &cfg->providers[0] : NULL;
}

int loom_router_resolve_name(char **out, const loom_config *cfg,
                             const char *name, const char *default_model)
{
    const loom_provider_config *pc;
    const char *listed;
    char why[512], shown[64];

    if (out)
        *out = NULL;
    if (!out || !cfg || !name || !*name)
        return loom__error_set(LOOM_EINVALID, "model name: NULL or empty");
    if (strchr(name, '/')) {
        if (loom__config_model_unresolved(cfg, name, why, sizeof(why)))
            return loom__error_set(LOOM_ENOTFOUND, "%s", why);
        *out = strdup(name);
    } else if ((listed = listed_bare(cfg, name)) != NULL) {
        *out = strdup(listed);
    } else if ((pc = bare_provider(cfg, default_model)) != NULL) {
        if (asprintf(out, "%s/%s", pc->name, name) < 0)
            *out = NULL;
    } else {
        return loom__error_set(
            LOOM_ENOTFOUND,
            "model '%s': no model provider is configured to send it to",
            loom__config_shown(shown, sizeof(shown), name));
    }
    return *out ? 0 : loom__error_oom();
}
