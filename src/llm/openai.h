/*
 * llm/openai.h: the OpenAI Chat Completions wire format, without I/O.
 *
 * The adapter (llm/openai.c) moves bytes; everything that understands
 * them is here so that tests and fuzzers can drive it directly: building
 * the request body, decoding a streamed answer (bytes -> SSE events ->
 * chunk JSON -> loom_llm_event), parsing a non-streamed answer, and turning
 * an HTTP error body into a loom_upstream_error.
 */
#ifndef LOOM_LLM_OPENAI_H
#define LOOM_LLM_OPENAI_H

#include "llm/answer.h"  /* LOOM_LLM_MAX_* */
#include "llm/attempt.h" /* loom__upstream_error_clear */
#include "loom/buf.h"
#include "loom/llm.h"

#include <jansson.h>

/* Default limits of one answer. */
/* (the same for every adapter: llm/answer.h) */
#define LOOM_OPENAI_MAX_TOOL_CALLS LOOM_LLM_MAX_TOOL_CALLS
#define LOOM_OPENAI_MAX_ARGS LOOM_LLM_MAX_ARGS /* per tool call */
#define LOOM_OPENAI_MAX_TEXT LOOM_LLM_MAX_TEXT /* text, and reasoning */
/* Upstream error text kept when the body is not JSON. */
#define LOOM_OPENAI_MAX_ERROR_TEXT LOOM_LLM_MAX_ERROR_TEXT

typedef struct {
    size_t max_tool_calls; /* 0: LOOM_OPENAI_MAX_TOOL_CALLS */
    size_t max_args;       /* 0: LOOM_OPENAI_MAX_ARGS */
    size_t max_text;       /* 0: LOOM_OPENAI_MAX_TEXT */
    size_t max_body;       /* a non-streamed body; 0: 2 * max_text + 1 MiB */
} loom__openai_limits;

/*
 * Builds the /chat/completions body for req as a jansson value: the
 * reference for loom__openai_body_text(), which the adapter uses. *out is
 * a new reference. LOOM_EINVALID when the model is missing or a tool
 * choice names no function; LOOM_ENOMEM.
 */
int loom__openai_build_body(json_t **out, const loom_llm_request *req);

/*
 * Puts req's tools into body as both OpenAI formats do (Chat Completions,
 * Responses): "tools" (each as tool() makes it), "tool_choice" (as
 * choice() makes it) and "parallel_tool_calls" when the request sets it.
 * tool() and choice() return a new reference, NULL on OOM. -1 on OOM.
 */
int loom__openai_put_tools(json_t *body, const loom_llm_request *req,
                           json_t *(*tool)(const loom_tool_def *t),
                           json_t *(*choice)(const loom_tool_choice *tc));

/*
 * Writes the /chat/completions body for req into out (emptied first): the
 * same text as json_dumps(loom__openai_build_body(req), JSON_COMPACT |
 * JSON_REAL_PRECISION(15)), without building it. With a cache, the
 * messages and tools it already holds text for are not encoded again (see
 * loom_llm_cache in loom/llm.h); owner names the provider using it, and a
 * cache another owner filled is emptied first. Errors as
 * loom__openai_build_body; out is empty after one.
 */
int loom__openai_body_text(loom_buf *out, const loom_llm_request *req,
                           loom_llm_cache *cache, const void *owner);

/* The body buffer a cache keeps for the calls that use it (borrowed). */
loom_buf *loom__openai_cache_body(loom_llm_cache *cache);

/*
 * The decoder of a Chat Completions answer (LOOM__LLM_DECODER_DECLARE in
 * llm/answer.h). Streamed, each `data:` is a chat.completion.chunk (feed:
 * LOOM_EPROTO for one that is not JSON) and `data: [DONE]` ends the
 * answer; a stream that stops before it is whole when it had a finish
 * reason, else cut off. complete takes a chat.completion (one TEXT, one
 * REASONING, one TOOL_CALL_DELTA per call); an {"error":...} body is
 * LOOM_EUPSTREAM. Tool calls come in index order.
 */
LOOM__LLM_DECODER_DECLARE(loom__openai_decoder, loom__openai_limits, )

/*
 * Tests: with on non-zero, every chunk is decoded with jansson, never on
 * the fast path (see llm/openai_stream.c), so both can be compared on the
 * same input. Set it before the first feed().
 */
void loom__openai_decoder_set_jansson_only(loom__openai_decoder *d, int on);

/* How many chunks the fast path decoded (the rest went to jansson). */
size_t loom__openai_decoder_fast_chunks(const loom__openai_decoder *d);

/* How many chunks began from the state of the head they share with the
 * chunks before them (see llm/openai_stream.c chunk_prefix). */
size_t loom__openai_decoder_resumed_chunks(const loom__openai_decoder *d);

/* The kind for an HTTP status (LOOM_UPSTREAM_NONE for 2xx):
 * loom__llm_status_kind(). */
loom_upstream_kind loom__openai_status_kind(long status);

/* Whether a status is worth retrying (408, 409, 429, 5xx):
 * loom__llm_status_retryable(). */
int loom__openai_status_retryable(long status);

/*
 * The message and type of an OpenAI error object o, borrowed from it:
 * error.message and error.type (else error.code) of {"error": {...}},
 * the string of {"error": "..."}, or vLLM's top-level message and type
 * ({"object": "error", ...}); NULL for what it lacks.
 */
void loom__openai_error_fields(const json_t *o, const char **msg,
                               const char **type);

/*
 * Fills *err (cleared first) from an HTTP error answer: kind from status,
 * message from error.message (or "message"/"detail", or the raw body cut
 * to LOOM_OPENAI_MAX_ERROR_TEXT bytes, or the status), type from
 * error.type or error.code, request_id copied. LOOM_ENOMEM.
 */
int loom__openai_error_from_http(loom_upstream_error *err, long status,
                                 const char *body, size_t len,
                                 const char *request_id);

/*
 * Replaces the limits of an "openai" provider (for tests that cross them
 * without megabytes of input). Not thread-safe against running calls.
 */
void loom__openai_provider_set_limits(loom_provider *p,
                                      const loom__openai_limits *limits);

#endif
