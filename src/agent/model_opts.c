/*
 * A model's request options into a run's options (see model_opts.h).
 */
#include "agent/model_opts.h"

void loom__run_options_use_model(loom_run_options *o,
                                 const loom_model_request_options *m)
{
    o->model = m->model;
    o->upstream_model = m->upstream;
    if (!m->capabilities.tools) {
        o->tools = NULL;
        o->client_tools = NULL;
        o->client_tools_len = 0;
        o->tool_choice.kind = LOOM_TOOL_CHOICE_AUTO;
        o->tool_choice.function = NULL;
    }
    if (!m->capabilities.parallel_tool_calls)
        o->parallel_tool_calls = -1;
    if (o->max_output_tokens <= 0)
        o->max_output_tokens = m->max_output_tokens;
    o->thinking_budget = m->thinking_budget;
    o->reasoning_effort = m->reasoning_effort;
    o->prompt_cache = m->prompt_cache;
    o->chain_responses = m->chain_responses;
}
