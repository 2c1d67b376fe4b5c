/*
 * Internal: what a model entry (through its router) puts into a run's
 * options, the same for `loom run` and `loom serve`.
 */
#ifndef LOOM_AGENT_MODEL_OPTS_H
#define LOOM_AGENT_MODEL_OPTS_H

#include "loom/config.h"
#include "loom/router.h"
#include "loom/run.h"
#include "loom/tokenizer.h"

/*
 * Applies m to o: the model's names, its request options (reasoning
 * controls, prompt caching, response chaining), and its capabilities
 * (reasoning: the run opens the reasoning view early; vision: tools may
 * give images with their results; no
 * tools and no tool_choice for a model without function calling; no
 * parallel_tool_calls flag where it is unsupported). max_output_tokens is
 * the model's only when o has none yet (a request's own value wins).
 * Strings stay borrowed from the router that filled m.
 */
void loom__run_options_use_model(loom_run_options *o,
                                 const loom_model_request_options *m);

/* What a run's context engine needs that the caller must keep alive: the
 * router of the model's context_window_fallback, and the model's token
 * counter. */
typedef struct {
    loom_provider *fallback;
    loom_model_request_options fallback_req;
    loom_token_counter *counter;
    loom_provider *review;  /* the agent's review_model, or NULL */
    loom_model_request_options review_req;
    loom_messages few_shot; /* the agent's examples, for its model */
    /* The tool settings merged with the agent's tool_options, or NULL
     * (the config's are used as they are). */
    json_t *tool_settings;
    /* The routers of the tools' repair_arguments models. */
    loom_provider **side;
    loom_model_request_options *side_req;
    loom_run_side_model *models;
    size_t nmodels;
} loom__run_context;

/*
 * The tool settings an agent's turns see: global (the config's `tools`
 * object) with, per tool, the keys of agent_opts (the agent's
 * `tool_options`) put over that tool's. *out is a new object, or NULL
 * when agent_opts is NULL or empty (global is then used as it is).
 * LOOM_ENOMEM.
 */
int loom__tool_settings_merge(json_t **out, const json_t *global,
                              const json_t *agent_opts);

/*
 * Turns the context engine on for o's model (o->model set, see above):
 * its window is the model's `context_window`, else the known window of
 * its upstream id (loom_config_known_context_window), else the engine
 * stays off. The engine counts with the model's token counter
 * (loom_token_counter_for_model on o->upstream_model, else o->model),
 * kept in *rc and set as o->context.counter and o->context.token_counter,
 * so the run corrects its estimate with the usage the provider reports.
 * A `context_window_fallback` gets a router of its own (built
 * with ropts, which may be NULL), kept in *rc until
 * loom__run_context_free. LOOM_ENOTFOUND when the fallback does not
 * resolve, LOOM_ENOMEM.
 */
int loom__run_context_setup(loom__run_context *rc, loom_run_options *o,
                            const loom_config *cfg,
                            const loom_router_options *ropts);

/*
 * Applies an agent's run options to o (agent may be NULL: only the
 * side models below): planning, think, tool_timeout_ms, review,
 * citations, limit_prompt, many_results_prompt, tools_disabled_message,
 * the tool-description registry, the few_shot examples when o->model is
 * one the agent lists for them (kept in *rc), its tool_options merged
 * over o->tool_settings (kept in *rc), retry_without_tool_calls and
 * model_after_retries (o->retry; the model is resolved by the run's
 * resolve_model) and non_iterative_tools. Every `repair_arguments`
 * model of the tool settings gets a router of its own, kept in *rc and
 * listed in o->models.
 * A review_model gets a router of its own (built with ropts, which may be
 * NULL), kept in *rc; call after loom__run_context_setup, which clears
 * *rc. Errors as loom_router_new (LOOM_ENOTFOUND for a model that does
 * not resolve).
 */
int loom__run_agent_setup(loom__run_context *rc, loom_run_options *o,
                          const loom_config *cfg,
                          const loom_agent_config *agent,
                          const loom_router_options *ropts);

void loom__run_context_free(loom__run_context *rc);

#endif
