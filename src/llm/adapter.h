/*
 * llm/adapter.h: the provider object every HTTP model adapter is, written
 * once. An adapter describes itself in a loom__llm_adapter_spec (its URL,
 * the header that carries the key, its fixed headers, how it writes a
 * request body, its answer decoder) and embeds loom__llm_adapter as the
 * first member of its provider struct, after which it keeps only what its
 * wire format needs (its limits). This file makes and frees the provider
 * (header lines from loom's defaults and the config, timeouts, retry
 * policy, connection pool) and does its complete(): build the request
 * through the spec, then send it through the attempt loop
 * (llm/attempt.h), which retries and classifies failures.
 */
#ifndef LOOM_LLM_ADAPTER_H
#define LOOM_LLM_ADAPTER_H

#include "core/http.h"
#include "llm/attempt.h"
#include "loom/buf.h"
#include "loom/llm.h"

#include <jansson.h>

typedef struct loom__llm_adapter loom__llm_adapter;

/* What an adapter is; one static spec per adapter kind. */
typedef struct {
    const char *kind; /* the provider's name when the config gives none */
    /*
     * The URL: the base URL (the config's, else default_base_url; neither:
     * LOOM_EINVALID "no base_url") without trailing '/', then "/" version
     * unless the base already ends with it (NULL: none), then path. With
     * path NULL the adapter URL is the config's base_url as given (NULL
     * when unset) and request_url makes each request's URL.
     */
    const char *default_base_url;
    const char *version;
    const char *path;
    /* The header that carries the config's api_key, after key_prefix
     * ("Bearer "); left out when the config sets that header itself. */
    const char *key_header;
    const char *key_prefix;
    /* Further headers of the adapter's own, sent after the key unless the
     * config sets them: name, value, ..., NULL. May be NULL. */
    const char *const *headers;
    /*
     * The request body: build_json makes it as JSON (sent compact, reals
     * with 15 digits), or, when build_json is NULL, build_text writes its
     * text into *body, an empty buffer of the call's own, or points *body
     * to a buffer of its own (a loom_llm_cache's). Errors as the
     * adapter's body builder says; nothing is sent after one.
     */
    int (*build_json)(json_t **out, const loom_llm_request *req);
    int (*build_text)(const loom__llm_adapter *a, const loom_llm_request *req,
                      loom_buf **body);
    /* Optional: a new string with the URL of req (NULL: the adapter's). */
    int (*request_url)(const loom__llm_adapter *a, const loom_llm_request *req,
                       char **out);
    /* Optional: the number the decoder of req is made with
     * (loom__llm_decoder_args.arg); NULL: 0. */
    long (*decoder_arg)(const loom_llm_request *req);
    /* The largest answer body: a JSON answer, or what one stream reads. */
    size_t (*max_body)(const loom__llm_adapter *a);
    /*
     * Makes the answer decoder of one attempt from a loom__llm_decoder_args
     * payload: a decoder whose first member is a loom__llm_answer
     * (llm/answer.h), through which the loop drives it. This and the two
     * error readers are as loom__llm_decoder_ops says; statuses are
     * retried as loom__llm_status_retryable() says.
     */
    int (*decoder_new)(void **out, void *payload);
    int (*error_from_http)(loom_upstream_error *err, long status,
                           const char *body, size_t len,
                           const char *request_id);
    int (*stream_error_retryable)(const loom_upstream_error *err);
    /* Optional: see loom__llm_attempts_opts.body_retry_after. */
    long (*body_retry_after)(const char *body, size_t len);
} loom__llm_adapter_spec;

/* The part of a provider every adapter has. Read-only after _new. */
struct loom__llm_adapter {
    loom_provider base;
    const loom__llm_adapter_spec *spec;
    loom__llm_decoder_ops ops; /* the loop's view of spec's decoder */
    char *url;                 /* see loom__llm_adapter_spec.path */
    char **lines;              /* the fixed header lines, owned */
    size_t nlines;
    /* The lines of a request: lines, then Accept (unless the config sets
     * it) for a streamed and for a JSON answer; borrowed from lines. */
    const char **stream_headers, **json_headers;
    size_t request_headers_len;
    long connect_ms, first_byte_ms, idle_ms, answer_ms;
    int max_retries;
    long base_delay_ms, max_delay_ms;
    loom__http_pool *pool;
};

/* The payload spec->decoder_new gets, for one attempt. */
typedef struct {
    const loom__llm_adapter *adapter; /* cast to the adapter's own struct */
    long arg;                         /* spec->decoder_arg(req), or 0 */
    loom_llm_event_cb cb;
    void *payload;
} loom__llm_decoder_args;

/*
 * Makes a provider of spec's kind from config: size bytes (the adapter's
 * struct, whose first member is a loom__llm_adapter), zeroed, then the
 * shared part filled in. Header lines, in this order: key_header with the
 * api_key, spec->headers, Content-Type: application/json and User-Agent:
 * loom/<version>, each unless the config sets it (any case); then the
 * config's own headers (strings or integers). *out is the caller's
 * (loom_provider_free). LOOM_EINVALID (no base URL, an api_key with a line
 * break, a header that is not a token name with a one-line value, each
 * message naming the provider); LOOM_ENOMEM.
 */
int loom__llm_adapter_new(loom_provider **out, size_t size,
                          const loom__llm_adapter_spec *spec,
                          const loom_provider_config *config);

/* Whether an adapter can make a request of req: LOOM_EINVALID "request
 * has no model", or "tool choice names no function" (with tools). */
int loom__llm_request_check(const loom_llm_request *req);

/* Appends v as JSON text (compact, reals with 15 digits, any value), as
 * json_dumps() with those flags writes it. LOOM_ENOMEM. */
int loom__llm_put_json_text(loom_buf *b, const json_t *v);

/* Whether name is an HTTP header token and value has no line break: what
 * is checked of every header taken from the config. */
int loom__llm_header_ok(const char *name, const char *value);

/* Whether the config's headers object names this header (any case). */
int loom__llm_config_has_header(const json_t *headers, const char *name);

#endif
