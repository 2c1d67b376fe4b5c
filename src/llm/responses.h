/*
 * llm/responses.h: the OpenAI Responses API wire format, without I/O.
 *
 * The adapter (llm/responses.c) moves bytes; what understands them is
 * here so that tests and fuzzers can drive it directly: building the
 * POST /responses body from a loom_llm_request (instructions, input items,
 * chaining with previous_response_id, reasoning items sent back), and
 * decoding the answer (bytes -> SSE events -> event JSON keyed on its
 * "type" -> loom_llm_event), streamed or whole, into the same normalised
 * events as every other adapter.
 *
 * What a response leaves for the next request goes into the assistant
 * message's provider_state under the key "openai-responses":
 *
 *   {"openai-responses": {"id": "resp_..", "store": true|false,
 *     "output": [<reasoning item>, {"type": "message", "id": "msg_.."},
 *                {"type": "function_call", "id": "fc_..",
 *                 "call_id": "call_.."}]}}
 *
 * "output" lists the response's output items in order: reasoning items
 * whole (id, summary, encrypted_content when the API sent it), the others
 * by their ids only (their text and calls are the message's own fields).
 */
#ifndef LOOM_LLM_RESPONSES_H
#define LOOM_LLM_RESPONSES_H

#include "llm/answer.h" /* LOOM_LLM_MAX_* */
#include "loom/buf.h"
#include "loom/llm.h"

#include <jansson.h>

/* The adapter kind, and the provider_state key. */
#define LOOM_RESPONSES_KIND "openai-responses"

/* Default limits of one answer. */
/* (the same for every adapter: llm/answer.h) */
#define LOOM_RESPONSES_MAX_TOOL_CALLS LOOM_LLM_MAX_TOOL_CALLS
#define LOOM_RESPONSES_MAX_ARGS LOOM_LLM_MAX_ARGS /* per tool call */
#define LOOM_RESPONSES_MAX_TEXT LOOM_LLM_MAX_TEXT /* text, and reasoning */
/* Output items of one answer (output_index must stay below it). */
#define LOOM_RESPONSES_MAX_ITEMS 1024
/* Bytes of reasoning items kept in provider_state for the next request. */
#define LOOM_RESPONSES_MAX_STATE ((size_t)4 << 20)

typedef struct {
    size_t max_tool_calls; /* 0: LOOM_RESPONSES_MAX_TOOL_CALLS */
    size_t max_args;       /* 0: LOOM_RESPONSES_MAX_ARGS */
    size_t max_text;       /* 0: LOOM_RESPONSES_MAX_TEXT */
    size_t max_items;      /* 0: LOOM_RESPONSES_MAX_ITEMS */
    size_t max_state;      /* 0: LOOM_RESPONSES_MAX_STATE */
    size_t max_body;       /* a whole JSON body; 0: 3 * max_text + 1 MiB */
} loom__responses_limits;

/*
 * Builds the /responses body for req. *out is a new reference.
 *
 * System messages before the first other message are joined (blank line
 * between) into "instructions"; later ones (the run loop's "limit
 * reached" note) become input messages with role "developer" where they
 * stand. User messages are input messages; an assistant message gives its
 * reasoning items (from its provider_state, when they can be sent back),
 * a message item (when it has text) and one function_call item per call;
 * a tool result is a function_call_output. With req->chain_responses,
 * "store" is true and, when the last assistant message carries a response
 * id in its provider_state, the body has "previous_response_id" and only
 * the messages after that one. Without it, "store" is false and, for a
 * reasoning model (reasoning_effort set), "include" asks for
 * reasoning.encrypted_content so that reasoning can be sent back.
 *
 * LOOM_EINVALID when the model is missing, a tool choice names no function
 * or the temperature is not finite; LOOM_ENOMEM.
 */
int loom__responses_build_body(json_t **out, const loom_llm_request *req);

/*
 * The decoder of a Responses answer (LOOM__LLM_DECODER_DECLARE in
 * llm/answer.h). store says whether the request asked the API to store
 * the response (it decides which reasoning items can be sent back by id
 * alone). Tool calls come in output order. Streamed, each SSE event's
 * data is one JSON event keyed on its "type" (an `event:` line, when
 * present, is only used for data without a type); `data: [DONE]` and
 * events after the terminal one are ignored. feed fails with
 * LOOM_EUPSTREAM for an `error` event or response.failed, LOOM_EPROTO for
 * data that is not a JSON object or an event that contradicts the answer
 * so far. A stream without its terminal event (response.completed,
 * response.incomplete, response.failed or error) is cut off. complete
 * takes a response object (one REASONING per reasoning item, one TEXT per
 * message item, one TOOL_CALL_DELTA per call); an {"error": ...} body or
 * a failed response is LOOM_EUPSTREAM. provider_state is the object
 * above, when there is a response id or an output item.
 */
LOOM__LLM_DECODER_DECLARE(loom__responses_decoder, loom__responses_limits,
                          int store, )

/*
 * The in-stream error kind for an error code: rate_limit_exceeded is
 * LOOM_UPSTREAM_RATE_LIMIT, every other code LOOM_UPSTREAM_STREAM.
 */
loom_upstream_kind loom__responses_code_kind(const char *code);

/*
 * Replaces the limits of an "openai-responses" provider (for tests that
 * cross them without megabytes of input). Not thread-safe against running
 * calls.
 */
void loom__responses_provider_set_limits(loom_provider *p,
                                         const loom__responses_limits *lim);

#endif
