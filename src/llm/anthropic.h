/*
 * llm/anthropic.h: the Anthropic Messages wire format, without I/O.
 *
 * The adapter (llm/anthropic.c) moves bytes; what understands them is
 * here so that tests and fuzzers can drive it directly: building the
 * /v1/messages body from a loom_llm_request, decoding a streamed answer
 * (bytes -> SSE events -> content blocks -> loom_llm_event) or a whole
 * message object, and turning an HTTP error body into a
 * loom_upstream_error.
 */
#ifndef LOOM_LLM_ANTHROPIC_H
#define LOOM_LLM_ANTHROPIC_H

#include "llm/answer.h" /* LOOM_LLM_MAX_* */
#include "loom/llm.h"

#include <jansson.h>

#define LOOM_ANTHROPIC_DEFAULT_BASE_URL "https://api.anthropic.com"
#define LOOM_ANTHROPIC_VERSION "2023-06-01"
/* max_tokens when the request sets none (the API requires one); with a
 * thinking budget, the budget is added to it. */
#define LOOM_ANTHROPIC_DEFAULT_MAX_TOKENS 4096
/* The tool sent when a request has no tools but its history has tool
 * blocks, which the API refuses without a tool list (tool_choice none). */
#define LOOM_ANTHROPIC_PLACEHOLDER_TOOL "loom_no_tools"

/*
 * The tool that carries a structured answer (response_format: json_schema
 * or json_object). The Messages API has no response format of its own
 * outside a beta, so the request declares this tool with the client's
 * schema (json_object: {"type": "object"}) as its input_schema and makes
 * the model call it, and the decoder turns that call back into the
 * answer's text, with finish reason "stop": the run loop never sees a call
 * of it. A run's own tool of this name is refused.
 */
#define LOOM_ANTHROPIC_ANSWER_TOOL "loom_json_answer"

/* How a request uses the answer tool (loom__anthropic_answer_mode). */
enum {
    /* No response format, or one that this call cannot end in: a real
     * tool must be called (tool choice required or a function). */
    LOOM__ANTHROPIC_ANSWER_NONE = 0,
    /* The answer tool alone, forced (tool_choice {"type": "tool"}): its
     * input is streamed as text as it comes. */
    LOOM__ANTHROPIC_ANSWER_FORCED,
    /* Beside the run's tools, one of them forced (tool_choice {"type":
     * "any"}): the model calls real tools, or answers through this one.
     * The input is kept until the end and is the answer's text only when
     * no real tool was called beside it; otherwise the call is dropped
     * and the model answers again after the tools ran. */
    LOOM__ANTHROPIC_ANSWER_BESIDE
};

/* Default limits of one answer. */
/* (the same for every adapter: llm/answer.h) */
#define LOOM_ANTHROPIC_MAX_TOOL_CALLS LOOM_LLM_MAX_TOOL_CALLS
#define LOOM_ANTHROPIC_MAX_ARGS LOOM_LLM_MAX_ARGS /* per tool call */
#define LOOM_ANTHROPIC_MAX_TEXT LOOM_LLM_MAX_TEXT /* text, and thinking */
#define LOOM_ANTHROPIC_MAX_BLOCKS 1024            /* content blocks */
/* Signatures and redacted thinking data of one answer, together. */
#define LOOM_ANTHROPIC_MAX_STATE ((size_t)16 << 20)

typedef struct {
    size_t max_tool_calls; /* 0: LOOM_ANTHROPIC_MAX_TOOL_CALLS */
    size_t max_args;       /* 0: LOOM_ANTHROPIC_MAX_ARGS */
    size_t max_text;       /* 0: LOOM_ANTHROPIC_MAX_TEXT */
    size_t max_blocks;     /* 0: LOOM_ANTHROPIC_MAX_BLOCKS */
    size_t max_state;      /* 0: LOOM_ANTHROPIC_MAX_STATE */
    size_t max_body;       /* a non-streamed body; 0: 2 * (max_text +
                              max_state) + 1 MiB */
} loom__anthropic_limits;

/*
 * Builds the /v1/messages body for req (see docs/providers.md, "The
 * anthropic provider", for every mapping). *out is a new reference.
 * LOOM_EINVALID when the model is missing, a tool choice names no
 * function, or max_tokens is set but not above the thinking budget;
 * LOOM_ENOMEM.
 */
int loom__anthropic_build_body(json_t **out, const loom_llm_request *req);

/*
 * The decoder of a Messages answer (LOOM__LLM_DECODER_DECLARE in
 * llm/answer.h). Streamed, a call's first fragment, at its
 * content_block_start, carries its id and name, and tool_index is the
 * call's position among the answer's calls; feed fails with
 * LOOM_EUPSTREAM for an `event: error` (kind LOOM_UPSTREAM_STREAM, type
 * e.g. "overloaded_error"), LOOM_EPROTO for an event that is not the
 * expected JSON. message_stop ends the answer; a stream that stops before
 * it is whole when it had a stop reason, else cut off. complete takes a
 * message object (one TEXT per text block, one REASONING per thinking
 * block, one TOOL_CALL_DELTA per call with its whole input); a {"type":
 * "error"} body is LOOM_EUPSTREAM. provider_state is {"anthropic":
 * {"content": [...]}} when the answer had thinking or redacted_thinking
 * blocks, NULL otherwise.
 */
LOOM__LLM_DECODER_DECLARE(loom__anthropic_decoder, loom__anthropic_limits, )

/* The LOOM__ANTHROPIC_ANSWER_* mode of req (see there): NONE without a
 * response format; for the adapter's decoder_arg. */
long loom__anthropic_answer_mode(const loom_llm_request *req);

/*
 * Tells a new decoder, before it is fed, how the request used the answer
 * tool (LOOM__ANTHROPIC_ANSWER_*; the default is NONE, every call a tool
 * call). With FORCED or BESIDE, the first call of
 * LOOM_ANTHROPIC_ANSWER_TOOL is no tool call but the answer's text (its
 * input's JSON text; "{}" when it has none), and the finish reason
 * "tool_calls" that it caused is "stop"; later calls of it are ignored.
 */
void loom__anthropic_decoder_set_answer(loom__anthropic_decoder *d, int mode);

/* The loom finish reason for an Anthropic stop_reason (borrowed, static,
 * or s itself when loom has no name for it). */
const char *loom__anthropic_finish_reason(const char *s);

/*
 * Fills *err (cleared first) from an HTTP error answer: kind from the
 * status (400 bad_request, 401 authentication, 403 permission, 404
 * not_found, 413 too_large, 429 rate_limit, 500 and 529 server, ...),
 * message and type from {"type": "error", "error": {"type", "message"}}
 * (or the raw body cut to 500 bytes, or "HTTP <status>"), request_id
 * copied. LOOM_ENOMEM.
 */
int loom__anthropic_error_from_http(loom_upstream_error *err, long status,
                                    const char *body, size_t len,
                                    const char *request_id);

/* Whether a status is worth retrying (408, 409, 429, 5xx incl. 529). */
int loom__anthropic_status_retryable(long status);

/* Whether an error event inside the stream is worth retrying before any
 * output: overloaded_error and api_error. */
int loom__anthropic_stream_error_retryable(const loom_upstream_error *err);

/*
 * Replaces the limits of an "anthropic" provider (for tests that cross
 * them without megabytes of input). Not thread-safe against running calls.
 */
void loom__anthropic_provider_set_limits(loom_provider *p,
                                         const loom__anthropic_limits *limits);

/* The URL an "anthropic" provider posts to (borrowed). */
const char *loom__anthropic_provider_url(const loom_provider *p);

#endif
