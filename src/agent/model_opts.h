/*
 * Internal: what a model entry (through its router) puts into a run's
 * options, the same for `loom run` and `loom serve`.
 */
#ifndef LOOM_AGENT_MODEL_OPTS_H
#define LOOM_AGENT_MODEL_OPTS_H

#include "loom/router.h"
#include "loom/run.h"

/*
 * Applies m to o: the model's names, its request options (reasoning
 * controls, prompt caching, response chaining), and its capabilities (no
 * tools and no tool_choice for a model without function calling; no
 * parallel_tool_calls
 * flag where it is unsupported). max_output_tokens is the model's only
 * when o has none yet (a request's own value wins). Strings stay
 * borrowed from the router that filled m.
 */
void loom__run_options_use_model(loom_run_options *o,
                                 const loom_model_request_options *m);

#endif
