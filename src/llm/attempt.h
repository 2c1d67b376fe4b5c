/*
 * llm/attempt.h: what the HTTP model adapters share beyond core/http and
 * llm/retry: the attempt loop (send, decode, classify, retry), the JSON
 * helpers of request bodies (lossy strings), and upstream errors (their
 * kinds by HTTP status, setting and clearing them).
 *
 * Coordination note for adapter authors (gemini, openai-responses, ...):
 * this header was written by the anthropic adapter. Use
 * loom__llm_attempts() for your retry loop instead of writing one (or,
 * better, llm/adapter.h, which drives it for you), and
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
    /* The request: url, headers, body, timeouts, max_body, cancel. The
     * loop sets its on_body and payload (the caller's are replaced). */
    loom__http_request *http;
    int stream;           /* the request asked for a streamed answer */
    size_t max_json_body; /* a JSON answer to a streaming request; 0:
                           * LOOM_HTTP_MAX_BODY */
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

/*
 * The length of the valid UTF-8 sequence at s (n bytes readable), or 0
 * when the bytes there do not start one, by jansson's rules: no overlong
 * form, no surrogate, nothing past U+10FFFF. A NUL-terminated string may
 * pass n = 4: its terminator is no continuation byte, so nothing past it
 * is read. Inline because the OpenAI decoder's fast path checks every
 * string of every chunk with it.
 */
static inline size_t loom__llm_utf8_seq(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    unsigned long cp;
    size_t k;

    if (c < 0x80)
        return 1;
    k = c < 0xC2 ? 0 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF5 ? 4 : 0;
    if (!k || k > n)
        return 0;
    cp = c & (0x7Fu >> k);
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) ||
        (k == 3 && cp < 0x800) || (k == 4 && cp < 0x10000))
        return 0;
    return k;
}


/* Sets o[key] = v, stealing v; -1 when v is NULL (a failed allocation
 * while making it) or on OOM: request builders chain these with |=. */
int loom__llm_put(json_t *o, const char *key, json_t *v);

/* o[key] when it is a string, else NULL (o may be anything, or NULL). */
const char *loom__llm_jstr(const json_t *o, const char *key);

/* ---- upstream errors -------------------------------------------------- */

/* Frees the strings of err and zeroes it (attempts kept). */
void loom__upstream_error_clear(loom_upstream_error *err);

/*
 * Sets *err, cleared first (attempts kept): kind, http_status, a copy of
 * the len bytes at msg ("HTTP <status>" when msg is NULL), and copies of
 * type and request_id when they are not NULL. LOOM_ENOMEM.
 */
int loom__llm_error_set(loom_upstream_error *err, loom_upstream_kind kind,
                        long status, const char *msg, size_t len,
                        const char *type, const char *request_id);

/*
 * The kind for an HTTP status, as every adapter reads it: 400, 401, 403,
 * 404, 408, 409, 413, 422 and 429 their own, other 4xx bad_request, 5xx
 * server, 2xx none, anything else protocol.
 */
loom_upstream_kind loom__llm_status_kind(long status);

/* Whether a status is worth retrying: 408, 409, 429 and 5xx. */
int loom__llm_status_retryable(long status);

#endif
