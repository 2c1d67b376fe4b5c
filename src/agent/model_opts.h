/*
 * Internal: what a model entry (through its router) puts into a run's
 * options, the same for `loom run` and `loom serve`.
 */
#ifndef LOOM_AGENT_MODEL_OPTS_H
#define LOOM_AGENT_MODEL_OPTS_H

#include "loom/config.h"
#include "loom/router.h"
#include "loom/run.h"

/*
 * Applies m to o: the model's names, its request options (reasoning
 * controls, prompt caching, response chaining), and its capabilities (no
 * tools and no tool_choice for a model without function calling; no
 * parallel_tool_calls flag where it is unsupported). max_output_tokens is
 * the model's only when o has none yet (a request's own value wins).
 * Strings stay borrowed from the router that filled m.
 */
void loom__run_options_use_model(loom_run_options *o,
                                 const loom_model_request_options *m);

/* What a run's context engine needs that the caller must keep alive: the
 * router of the model's context_window_fallback. */
typedef struct {
    loom_provider *fallback;
    loom_model_request_options fallback_req;
} loom__run_context;

/*
 * Turns the context engine on for o's model (o->model set, see above):
 * its window is the model's `context_window`, else the known window of
 * its upstream id (loom_config_known_context_window), else the engine
 * stays off. A `context_window_fallback` gets a router of its own (built
 * with ropts, which may be NULL), kept in *rc until
 * loom__run_context_free. LOOM_ENOTFOUND when the fallback does not
 * resolve, LOOM_ENOMEM.
 */
int loom__run_context_setup(loom__run_context *rc, loom_run_options *o,
                            const loom_config *cfg,
                            const loom_router_options *ropts);
void loom__run_context_free(loom__run_context *rc);

#endif
