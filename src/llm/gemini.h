/*
 * llm/gemini.h: the Google Gemini generateContent wire format, without
 * I/O.
 *
 * The adapter (llm/gemini.c) moves bytes; what understands them is here so
 * that tests and fuzzers can drive it directly: the endpoint URL, the
 * request body (contents, systemInstruction, functionDeclarations with
 * loom's JSON Schema cut down to the subset Gemini accepts, toolConfig,
 * generationConfig), the answer decoder (SSE or JSON GenerateContentResponse
 * objects -> loom_llm_event) and the error body parser.
 *
 * What a Gemini answer must get back on the next request (thoughtSignature
 * on the very part it came on, the ids Gemini gave its function calls) is
 * kept in the response's provider_state under the key "gemini":
 *
 *   {"gemini": {"parts": [
 *       {"text": [offset, length], "thoughtSignature": "..."},
 *       {"thought": [offset, length], "thoughtSignature": "..."},
 *       {"call": index, "id": "...", "thoughtSignature": "..."}]}}
 *
 * one entry per part of the model's turn in order: "text" a range of the
 * message's content, "thought" a range of its reasoning (only thought
 * parts that carry a signature are kept; the others are not sent back),
 * "call" an index into its tool calls. Signatures and ids are kept byte
 * for byte; text is not repeated. The state is there only when the answer
 * had a signature or an id.
 */
#ifndef LOOM_LLM_GEMINI_H
#define LOOM_LLM_GEMINI_H

#include "llm/answer.h" /* LOOM_LLM_MAX_* */
#include "loom/buf.h"
#include "loom/llm.h"

#include <jansson.h>

/* Default limits of one answer. */
/* (the same for every adapter: llm/answer.h) */
#define LOOM_GEMINI_MAX_TOOL_CALLS LOOM_LLM_MAX_TOOL_CALLS
#define LOOM_GEMINI_MAX_ARGS LOOM_LLM_MAX_ARGS /* per call, as JSON text */
#define LOOM_GEMINI_MAX_TEXT LOOM_LLM_MAX_TEXT /* text, and reasoning */
/* provider_state kept for the next request (signatures, ids, parts). */
#define LOOM_GEMINI_MAX_STATE ((size_t)4 << 20)
/* Upstream error text kept when the body is not JSON. */
#define LOOM_GEMINI_MAX_ERROR_TEXT LOOM_LLM_MAX_ERROR_TEXT
/* Deepest tool schema the converter follows. */
#define LOOM_GEMINI_MAX_SCHEMA_DEPTH 32

/* The base URL when the config gives none; "/v1beta" is added to it. */
#define LOOM_GEMINI_DEFAULT_BASE_URL "https://generativelanguage.googleapis.com"

typedef struct {
    size_t max_tool_calls; /* 0: LOOM_GEMINI_MAX_TOOL_CALLS */
    size_t max_args;       /* 0: LOOM_GEMINI_MAX_ARGS */
    size_t max_text;       /* 0: LOOM_GEMINI_MAX_TEXT */
    size_t max_state;      /* 0: LOOM_GEMINI_MAX_STATE */
    size_t max_body;       /* a JSON body; 0: 2 * max_text + 1 MiB */
} loom__gemini_limits;

/*
 * The endpoint for model: {base}/{version}/models/{model}:generateContent,
 * or :streamGenerateContent?alt=sse when stream is set. base_url NULL or
 * "" is LOOM_GEMINI_DEFAULT_BASE_URL; trailing '/' are ignored; when its
 * last path segment is an API version ("v1beta", "v1", "v1alpha", ...) it
 * is used as is, else "/v1beta" is added. A model with a '/' is a full
 * resource name ("tunedModels/x", "models/x") and gets no "models/".
 * Bytes of the model outside [A-Za-z0-9._~@/-] are percent-encoded. *out
 * is the caller's. LOOM_EINVALID without a model; LOOM_ENOMEM.
 */
int loom__gemini_url(char **out, const char *base_url, const char *model,
                     int stream);

/*
 * Converts a JSON Schema (a tool's parameters) into a Gemini Schema:
 * types upper-cased ("OBJECT", "STRING", ...); a type list with "null", or
 * an anyOf/oneOf with a {"type": "null"} member, becomes `nullable`; other
 * type lists and anyOf/oneOf become `anyOf` (one member alone is merged
 * in); kept: description, title, nullable, enum (strings only; a string
 * `const` becomes a one-value enum), format (only date-time and enum for
 * strings, float and double for numbers, int32 and int64 for integers),
 * properties, required (names that are properties), items, min/maxItems,
 * min/maxLength, min/maxProperties, minimum, maximum. Everything else
 * ($ref, $defs, $schema, additionalProperties, default, examples, pattern,
 * allOf with more than one member, not, ...) is dropped. A schema without
 * a type gets OBJECT with properties, ARRAY with items, STRING with an
 * enum, else STRING; an array without items gets STRING items. *out is a
 * new reference. LOOM_EINVALID past LOOM_GEMINI_MAX_SCHEMA_DEPTH;
 * LOOM_ENOMEM.
 */
int loom__gemini_schema(json_t **out, const json_t *schema);

/*
 * Builds the generateContent body for req (see docs/providers.md for the
 * mapping). *out is a new reference. LOOM_EINVALID without a model, for a
 * tool choice naming no function or a tool schema too deep; LOOM_ENOMEM.
 */
int loom__gemini_build_body(json_t **out, const loom_llm_request *req);

/* The turn number for generated call ids: the assistant messages of req. */
long loom__gemini_turn(const loom_llm_request *req);

/*
 * The decoder of a Gemini answer (LOOM__LLM_DECODER_DECLARE in
 * llm/answer.h). turn numbers the ids it makes: a function call without
 * Gemini's id gets "call_<turn>_<i>" (i its position in the answer).
 * Each call is one TOOL_CALL_DELTA with the whole arguments. Streamed
 * (alt=sse), each event is a GenerateContentResponse (feed: LOOM_EPROTO
 * for one that is not a JSON object, LOOM_EUPSTREAM for an error object,
 * whose `code` is the error's http_status); a stream that gave no
 * finishReason (nor a blocked prompt) is cut off. complete takes one
 * GenerateContentResponse (generateContent) or an array of them
 * (streamGenerateContent without alt=sse); an error object is
 * LOOM_EUPSTREAM. provider_state is as above.
 */
LOOM__LLM_DECODER_DECLARE(loom__gemini_decoder, loom__gemini_limits,
                          long turn, )

/*
 * Fills *err (cleared first) from an HTTP error answer: kind from status
 * (as for every provider), message from error.message, type from
 * error.status ("RESOURCE_EXHAUSTED"), also when the body is an array of
 * such objects or SSE-framed (`data: {...}`); else the raw body cut to
 * LOOM_GEMINI_MAX_ERROR_TEXT bytes, else "HTTP <status>". LOOM_ENOMEM.
 */
int loom__gemini_error_from_http(loom_upstream_error *err, long status,
                                 const char *body, size_t len,
                                 const char *request_id);

/*
 * The delay an error body asks for, in ms: the retryDelay ("37s",
 * "0.250s") of a google.rpc.RetryInfo in error.details; -1 when none.
 */
long loom__gemini_retry_delay(const char *body, size_t len);

/* Whether an error inside the stream is worth retrying before any
 * output: its code is 408, 429 or 5xx. */
int loom__gemini_stream_error_retryable(const loom_upstream_error *err);

/*
 * Replaces the limits of a "gemini" provider (for tests that cross them
 * without megabytes of input). Not thread-safe against running calls.
 */
void loom__gemini_provider_set_limits(loom_provider *p,
                                      const loom__gemini_limits *limits);

#endif
