/*
 * A model's request options into a run's options (see model_opts.h).
 */
#include "agent/model_opts.h"
#include "core/error.h"

#include <stdlib.h>
#include <string.h>

void loom__run_options_use_model(loom_run_options *o,
                                 const loom_model_request_options *m)
{
    o->model = m->model;
    o->upstream_model = m->upstream;
    if (!m->capabilities.tools) {
        o->tools = NULL;
        o->tool_names = NULL;
        o->tool_names_len = 0;
        o->client_tools = NULL;
        o->client_tools_len = 0;
        o->tool_choice.kind = LOOM_TOOL_CHOICE_AUTO;
        o->tool_choice.function = NULL;
    }
    if (!m->capabilities.parallel_tool_calls)
        o->parallel_tool_calls = LOOM_OPT_DEFAULT;
    if (o->max_output_tokens <= 0)
        o->max_output_tokens = m->max_output_tokens;
    o->thinking_budget = m->thinking_budget;
    o->reasoning_effort = m->reasoning_effort;
    o->reasoning = m->capabilities.reasoning;
    o->vision = m->capabilities.vision;
    o->prompt_cache = m->prompt_cache;
    o->chain_responses = m->chain_responses;
}

/* The window of a model: configured, else known from its upstream id. */
static long model_window(const loom_model_config *mc, const char *upstream)
{
    if (mc && mc->context_window > 0)
        return mc->context_window;
    return loom_config_known_context_window(upstream);
}

static size_t count_message(const loom_message *msg, void *payload)
{
    return loom_token_counter_message(payload, msg);
}

static size_t count_tools(const loom_tool_def *tools, size_t n,
                          void *payload)
{
    return loom_token_counter_tools(payload, tools, n);
}

int loom__run_context_setup(loom__run_context *rc, loom_run_options *o,
                            const loom_config *cfg,
                            const loom_router_options *ropts)
{
    const loom_model_config *mc = NULL, *fc = NULL;
    loom_model_config tmp, ftmp;
    const char *counted = o->upstream_model ? o->upstream_model : o->model;
    int rc_;

    memset(rc, 0, sizeof(*rc));
    memset(&tmp, 0, sizeof(tmp));
    memset(&ftmp, 0, sizeof(ftmp));
    if (!o->model || loom_config_model(&mc, &tmp, cfg, o->model) != 0)
        mc = NULL;
    o->context.window = model_window(mc, o->upstream_model);
    /* The id sent upstream decides how it is counted: a configured name
     * may be an alias. */
    if (counted && *counted &&
        (rc_ = loom_token_counter_for_model(&rc->counter, counted)) != 0) {
        loom_model_config_clear(&tmp);
        return rc_;
    }
    if (rc->counter) {
        o->context.counter.message = count_message;
        o->context.counter.tools = count_tools;
        o->context.counter.payload = rc->counter;
        o->context.token_counter = rc->counter;
    }
    if (!mc || !mc->context_window_fallback || o->context.window <= 0) {
        loom_model_config_clear(&tmp);
        return 0;
    }
    if ((rc_ = loom_router_new(&rc->fallback, cfg, mc->context_window_fallback,
                               ropts, &rc->fallback_req)) != 0 ||
        (rc_ = loom_config_model(&fc, &ftmp, cfg,
                                 mc->context_window_fallback)) != 0) {
        loom_model_config_clear(&tmp);
        loom__run_context_free(rc);
        return rc_;
    }
    o->context.fallback_provider = rc->fallback;
    o->context.fallback_model = rc->fallback_req.model;
    o->context.fallback_upstream_model = rc->fallback_req.upstream;
    o->context.fallback_window = model_window(fc, rc->fallback_req.upstream);
    o->context.fallback_max_output_tokens = rc->fallback_req.max_output_tokens;
    loom_model_config_clear(&ftmp);
    loom_model_config_clear(&tmp);
    return 0;
}

/* Whether the agent's few-shot examples go to model (none listed: all). */
static int few_shot_for(const loom_agent_few_shot *fs, const char *model)
{
    if (!fs->models_len)
        return 1;
    for (size_t i = 0; model && i < fs->models_len; i++)
        if (strcmp(fs->models[i], model) == 0)
            return 1;
    return 0;
}

/* The agent's examples as messages in rc, for o's model. */
static int use_few_shot(loom__run_context *rc, loom_run_options *o,
                        const loom_agent_few_shot *fs)
{
    int rc_ = 0;

    if (!fs->examples_len || !few_shot_for(fs, o->model))
        return 0;
    for (size_t i = 0; !rc_ && i < fs->examples_len; i++)
        if ((rc_ = loom_messages_add(&rc->few_shot, LOOM_ROLE_USER,
                                     fs->examples[i].user)) == 0)
            rc_ = loom_messages_add(&rc->few_shot, LOOM_ROLE_ASSISTANT,
                                    fs->examples[i].assistant);
    if (rc_)
        return rc_;
    o->few_shot = rc->few_shot.items;
    o->few_shot_len = rc->few_shot.len;
    return 0;
}

int loom__tool_settings_merge(json_t **out, const json_t *global,
                              const json_t *agent_opts)
{
    const char *name;
    json_t *v, *merged;

    *out = NULL;
    if (!json_object_size(agent_opts))
        return 0;
    if (!(merged = global ? json_deep_copy(global) : json_object()))
        return loom__error_oom();
    json_object_foreach((json_t *)agent_opts, name, v)
    {
        json_t *mine = json_object_get(merged, name);
        int rc = mine ? json_object_update(mine, v)
                      : json_object_set_new(merged, name, json_deep_copy(v));
        if (rc != 0) {
            json_decref(merged);
            return loom__error_oom();
        }
    }
    *out = merged;
    return 0;
}

/* A router for each distinct repair_arguments model of o's tool
 * settings, listed in o->models. */
static int side_models(loom__run_context *rc, loom_run_options *o,
                       const loom_config *cfg, const loom_router_options *ropts)
{
    size_t n = json_object_size(o->tool_settings), k = 0;
    const char *name;
    const json_t *v;
    int rc_;

    if (!n)
        return 0;
    rc->side = calloc(n, sizeof(*rc->side));
    rc->side_req = calloc(n, sizeof(*rc->side_req));
    rc->models = calloc(n, sizeof(*rc->models));
    if (!rc->side || !rc->side_req || !rc->models)
        return loom__error_oom();
    json_object_foreach((json_t *)o->tool_settings, name, v)
    {
        const char *m = json_string_value(
            json_object_get(json_object_get(v, "repair_arguments"), "model"));
        int seen = 0;
        for (size_t i = 0; m && i < k; i++)
            seen |= strcmp(rc->models[i].name, m) == 0;
        if (!m || seen)
            continue;
        if ((rc_ = loom_router_new(&rc->side[k], cfg, m, ropts,
                                   &rc->side_req[k])) != 0)
            return rc_;
        rc->models[k].name = m;
        rc->models[k].provider = rc->side[k];
        rc->models[k].upstream_model = rc->side_req[k].upstream;
        rc->nmodels = ++k;
    }
    o->models = rc->models;
    o->models_len = rc->nmodels;
    return 0;
}

int loom__run_agent_setup(loom__run_context *rc, loom_run_options *o,
                          const loom_config *cfg,
                          const loom_agent_config *agent,
                          const loom_router_options *ropts)
{
    int rc_;

    if (agent &&
        (rc_ = loom__tool_settings_merge(&rc->tool_settings, o->tool_settings,
                                         agent->tool_options)) != 0)
        return rc_;
    if (rc->tool_settings)
        o->tool_settings = rc->tool_settings;
    if ((rc_ = side_models(rc, o, cfg, ropts)) != 0 || !agent)
        return rc_;
    o->planning = agent->planning;
    o->think = agent->think;
    if (agent->tool_timeout_ms > 0)
        o->tool_timeout_ms = agent->tool_timeout_ms;
    if (agent->approval_timeout_ms > 0)
        o->approval_timeout_ms = agent->approval_timeout_ms;
    o->citations = agent->citations;
    o->limit_prompt = agent->limit_prompt;
    o->many_results_after = agent->many_results.after;
    o->many_results_prompt = agent->many_results.prompt;
    o->tool_docs = agent->tool_docs;
    o->tool_docs_len = agent->tool_docs_len;
    if ((rc_ = use_few_shot(rc, o, &agent->few_shot)) != 0)
        return rc_;
    o->tools_disabled_message = agent->tools_disabled_message;
    o->retry.max = agent->retry.max;
    o->retry.prompt = agent->retry.prompt;
    o->retry.model_after = agent->model_after.retries;
    o->retry.model = agent->model_after.model;
    if (agent->non_iterative_set) {
        /* An empty list is none, where NULL would be think. */
        static const char *const none[1] = {NULL};
        o->non_iterative_tools =
            agent->non_iterative_tools_len
                ? (const char *const *)agent->non_iterative_tools
                : none;
        o->non_iterative_tools_len = agent->non_iterative_tools_len;
    }
    o->review.enabled = agent->review;
    if (!agent->review || !agent->review_model)
        return 0;
    if ((rc_ = loom_router_new(&rc->review, cfg, agent->review_model, ropts,
                               &rc->review_req)) != 0)
        return rc_;
    o->review.provider = rc->review;
    o->review.model = rc->review_req.upstream;
    return 0;
}

void loom__run_context_free(loom__run_context *rc)
{
    for (size_t i = 0; i < rc->nmodels; i++)
        loom_provider_free(rc->side[i]);
    free(rc->side);
    free(rc->side_req);
    free(rc->models);
    json_decref(rc->tool_settings);
    loom_provider_free(rc->review);
    loom_provider_free(rc->fallback);
    loom_token_counter_free(rc->counter);
    loom_messages_free(&rc->few_shot);
    memset(rc, 0, sizeof(*rc));
}
