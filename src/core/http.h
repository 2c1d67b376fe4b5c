/*
 * core/http.h: loom's internal HTTP client, a thin layer over libcurl's
 * multi interface that every model provider shares.
 *
 * One call sends one request and drives the transfer itself in a
 * curl_multi_poll loop with a short tick, so that it can enforce what
 * libcurl does not offer directly (a first-byte timeout and an idle
 * timeout measured on response body bytes) and notice a loom_cancel flag
 * within a tick. Body bytes of a successful (2xx) answer are handed to a
 * callback as they arrive (a streaming decoder sits there); the body of an
 * error answer is kept, up to a limit, for the caller to parse.
 *
 * Connections are reused: a pool keeps idle (easy, multi) handle pairs,
 * and the connection cache lives in the multi handle, so sequential calls
 * through one pool find their keep-alive connection. DNS and TLS sessions
 * are shared between the pairs of a pool through a CURLSH.
 */
#ifndef LOOM_CORE_HTTP_H
#define LOOM_CORE_HTTP_H

#include "core/text.h"
#include "loom/buf.h"
#include "loom/cancel.h"
#include "loom/common.h"

#include <stddef.h>

/* A pool of reusable connections; thread-safe. */
typedef struct loom__http_pool loom__http_pool;

/*
 * Receives len bytes of a 2xx body. A non-zero return aborts the transfer
 * and loom__http_perform() returns that value (keep it negative LOOM_E*,
 * with a message already set).
 */
typedef int (*loom__http_body_cb)(const char *data, size_t len, void *payload);

/* Default size of a 2xx body kept in memory; past it, the call fails. */
#define LOOM_HTTP_MAX_BODY ((size_t)64 << 20)
/* Default size of an error body kept in memory; past it, it is cut. */
#define LOOM_HTTP_MAX_ERROR_BODY ((size_t)1 << 20)
/* Longest response header value kept; longer ones are cut. */
#define LOOM_HTTP_MAX_HEADER 1024
/* Poll tick: the latency of noticing cancellation, the slack of timers. */
#define LOOM_HTTP_TICK_MS 20

typedef struct {
    const char *method; /* "GET" or "POST"; NULL: POST when body is set */
    const char *url;
    const char *const *headers; /* "Name: value" lines */
    size_t headers_len;
    const char *body; /* request body, may be NULL */
    size_t body_len;
    long connect_timeout_ms;    /* 0: curl's default (300 s) */
    long first_byte_timeout_ms; /* 0: none; from sending to 1st body byte */
    long idle_timeout_ms;       /* 0: none; longest gap between body bytes */
    size_t max_error_body;      /* 0: LOOM_HTTP_MAX_ERROR_BODY */
    size_t max_body;            /* 2xx, no on_body; 0: LOOM_HTTP_MAX_BODY */
    loom__http_body_cb on_body; /* NULL: the 2xx body is kept in `body` */
    void *payload;
    loom_cancel *cancel; /* may be NULL */
} loom__http_request;

/* Why a transfer did not complete; set with a non-zero return. */
typedef enum {
    LOOM_HTTP_FAIL_NONE = 0,
    LOOM_HTTP_FAIL_CONNECT,   /* no answer: refused, reset, empty reply */
    LOOM_HTTP_FAIL_TRUNCATED, /* the answer started, then the link broke */
    LOOM_HTTP_FAIL_TIMEOUT_CONNECT,
    LOOM_HTTP_FAIL_TIMEOUT_FIRST_BYTE,
    LOOM_HTTP_FAIL_TIMEOUT_IDLE,
    LOOM_HTTP_FAIL_CANCELED, /* the cancel flag was set */
    LOOM_HTTP_FAIL_CALLBACK, /* on_body returned non-zero */
    LOOM_HTTP_FAIL_OTHER
} loom__http_failure;

/* A header to pass on: its name in lower case, and its value. */
typedef struct {
    char name[LOOM__RATE_HEADER_NAME_MAX + 1];
    char value[LOOM__RATE_HEADER_VALUE_MAX + 1];
} loom__http_rate_header;

/* What came back. Zero it before the call; free with _response_clear. */
typedef struct {
    long status;          /* HTTP status, 0 when none arrived */
    char *request_id;     /* x-request-id or request-id, NULL when absent */
    char *retry_after;    /* Retry-After, NULL when absent */
    char *retry_after_ms; /* retry-after-ms, NULL when absent */
    char *content_type;   /* NULL when absent */
    /* The headers to pass on (loom__text_is_rate_header), in arrival
     * order; past LOOM__RATE_HEADERS_MAX (or out of memory) they are not
     * kept. On the heap, rate_len of them (NULL when none came): a
     * response lives in the frame of a model call, on a fiber's stack. */
    loom__http_rate_header *rate;
    size_t rate_len;
    loom_buf body;        /* error body, or 2xx body without on_body */
    int body_truncated;   /* the error body was longer than the limit */
    size_t body_bytes;    /* body bytes received in all */
    long new_connections; /* connections opened (0: one was reused) */
    loom__http_failure failure;
} loom__http_response;

/* Makes a pool. LOOM_ENOMEM, LOOM_ERROR when libcurl fails to start. */
int loom__http_pool_new(loom__http_pool **out);

/* Closes every pooled connection. No call may be running. NULL: no-op. */
void loom__http_pool_free(loom__http_pool *pool);

/*
 * Sends req and waits for the whole answer, passing 2xx body bytes to
 * req->on_body as they arrive. Any complete HTTP answer returns 0, whatever
 * its status (look at resp->status). Otherwise returns, with a message and
 * resp->failure set:
 *   LOOM_ETIMEDOUT  a timeout passed (the message names which)
 *   LOOM_ECANCELED  req->cancel was set
 *   LOOM_EIO        connection failure or truncated answer (curl's message)
 *   LOOM_ETOOLARGE  a 2xx body kept in memory passed req->max_body
 *   the value on_body returned, when it aborted
 * resp keeps what arrived (status, headers, body bytes) in every case.
 */
int loom__http_perform(loom__http_pool *pool, const loom__http_request *req,
                       loom__http_response *resp);

/* Frees what resp holds and zeroes it. */
void loom__http_response_clear(loom__http_response *resp);

#endif
