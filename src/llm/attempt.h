/*
 * llm/attempt.h: what the HTTP model adapters share beyond core/http and
 * llm/retry: the attempt loop (send, decode, classify, retry) and lossy
 * JSON strings for request bodies.
 *
 * Coordination note for adapter authors (gemini, openai-responses, ...):
 * this header was written by the anthropic adapter. Use
 * loom__llm_attempts() for your retry loop instead of writing one, and
 * loom__llm_json_string() for strings that may hold bytes that are not
 * UTF-8. If you need the loop to do more, extend loom__llm_decoder_ops
 * with an optional member at the end (NULL keeps today's behaviour) and
 * say so in your report; do not change what the existing members mean.
 *
 * The loop's policy is the OpenAI adapter's (llm/openai.c), unchanged:
 * retries happen only while nothing has reached the caller's callback (a
 * retried answer would show text twice); on a status the adapter calls
 * retryable, a connection that failed or dropped, a connect timeout, and
 * (when the adapter says so) an error event inside the stream; the
 * server's retry-after-ms / Retry-After wins over the backoff, and a
 * server asking for more than LOOM_RETRY_MAX_HONOURED_MS is not retried.
 */
#ifndef LOOM_LLM_ATTEMPT_H
#define LOOM_LLM_ATTEMPT_H

#include "core/http.h"
#include "loom/llm.h"

#include <jansson.h>

/*
 * An adapter's answer decoder, as the loop drives it. A decoder is made
 * fresh for every attempt and does no I/O: bytes in, loom_llm_event out
 * (to the callback the adapter gave it when making it).
 */
typedef struct {
    /* Makes the decoder of one attempt; payload is the options' payload. */
    int (*decoder_new)(void **out, void *payload);
    void (*decoder_free)(void *d);
    /* Streamed body bytes, at any split. Returns 0 or a LOOM_E* code;
     * LOOM_EUPSTREAM means an error the decoder describes in error(). */
    int (*feed)(void *d, const char *data, size_t len);
    /* The streamed body ended cleanly; an early end is LOOM_EUPSTREAM
     * with kind LOOM_UPSTREAM_CONNECTION. */
    int (*finish)(void *d);
    /* A whole JSON body: a non-streamed answer, or a server that answered
     * a streaming request with Content-Type application/json. */
    int (*complete)(void *d, const char *body, size_t len);
    /* Whether any text, reasoning or tool call reached the callback. */
    int (*output_started)(const void *d);
    /* The decoder's error after it returned LOOM_EUPSTREAM (borrowed). */
    const loom_upstream_error *(*error)(const void *d);
    /* Moves what was decoded into resp, after the last attempt, whether
     * it succeeded or not. */
    int (*export_to)(void *d, loom_llm_response *resp);
    /* Fills err (cleared first) from an HTTP error answer. */
    int (*error_from_http)(loom_upstream_error *err, long status,
                           const char *body, size_t len,
                           const char *request_id);
    /* Whether an HTTP status is worth retrying. */
    int (*status_retryable)(long status);
    /* Optional (NULL: never): whether an error event inside the stream
     * (kind LOOM_UPSTREAM_STREAM) is worth retrying when no output has
     * started, e.g. Anthropic's overloaded_error. */
    int (*stream_error_retryable)(const loom_upstream_error *err);
} loom__llm_decoder_ops;

typedef struct {
    const char *name; /* provider name, first in messages and logs */
    loom__http_pool *pool;
    /* The request: url, headers, body, timeouts, max_body, cancel. Its
     * on_body and payload are ignored: the loop sets its own. */
    const loom__http_request *http;
    int stream;           /* the request asked for a streamed answer */
    size_t max_json_body; /* a JSON answer to a streaming request */
    int max_retries;      /* extra attempts after the first */
    long base_delay_ms, max_delay_ms;
    const loom__llm_decoder_ops *ops;
    void *payload; /* for ops->decoder_new */
    /* Optional (NULL: none), added by the gemini adapter: the delay in ms
     * an HTTP error body asks for (Gemini's google.rpc.RetryInfo), -1
     * when none. Used only when the response headers ask for none; more
     * than LOOM_RETRY_MAX_HONOURED_MS is not retried, as for headers. */
    long (*body_retry_after)(const char *body, size_t len);
} loom__llm_attempts_opts;

/*
 * Sends the request, retrying as the file comment says, and moves the
 * last attempt's answer into resp (ops->export_to), also after a failure
 * (partial text, output_started). resp->error.attempts counts the
 * requests made; on an upstream failure resp->error says what happened.
 *
 * Returns 0; LOOM_EUPSTREAM, LOOM_ETIMEDOUT or LOOM_EPROTO with
 * resp->error filled and the thread's message "<name>: <status> <kind>:
 * <message> (request <id>) after <n> attempts"; LOOM_ETOOLARGE with the
 * provider's name before the message; LOOM_ECANCELED (cancel flag, or the
 * event callback returned non-zero); LOOM_ENOMEM.
 */
int loom__llm_attempts(const loom__llm_attempts_opts *o,
                       loom_llm_response *resp);

/*
 * A new JSON string of s (NULL: ""), each byte that is not part of valid
 * UTF-8 replaced by U+FFFD: message content (tool output above all) may
 * hold any bytes, and jansson refuses such strings rather than fail the
 * call. NULL only when out of memory.
 */
json_t *loom__llm_json_string(const char *s);

/* Whether name is an HTTP header token and value has no line break: what
 * every adapter checks on headers taken from the config. */
int loom__llm_header_ok(const char *name, const char *value);

/* Whether the config's headers object names this header (any case). */
int loom__llm_config_has_header(const json_t *headers, const char *name);

#endif
