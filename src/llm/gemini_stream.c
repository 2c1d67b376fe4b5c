/*
 * The Gemini answer decoder: no I/O, bytes in, events out, so that tests
 * and fuzzers feed it directly and the adapter only moves bytes.
 *
 * A streamed answer (streamGenerateContent?alt=sse) is a series of SSE
 * events, each `data:` one GenerateContentResponse; a non-streamed one is
 * a single such object (or, without alt=sse, a JSON array of them). Both
 * go through the same code. Of the first candidate's parts, text is
 * passed on at once as text, `thought: true` text as reasoning, and each
 * functionCall (Gemini sends a call whole, never in fragments, and several
 * in one turn) as one tool-call fragment with its whole arguments; the
 * complete calls, the usage (the last usageMetadata seen, as every event
 * repeats running counts) and the finish reason come once at the end.
 *
 * Gemini wants its thoughtSignature back on the same part next time, so
 * the decoder also records the turn's parts (see llm/gemini.h): runs of
 * unsigned text are joined, a signed part stays apart, calls keep their
 * place. Every buffer has a limit: text, reasoning, arguments per call,
 * number of calls, that state, SSE line and event.
 */
#include "core/error.h"
#include "core/utf8.h"
#include "llm/answer.h"
#include "llm/attempt.h"
#include "llm/gemini.h"
#include "loom/buf.h"
#include "loom/sse.h"

#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What one part entry costs in the state besides its signature and id:
 * a bound on its JSON text ({"text":[offset,length]},). */
#define PART_COST 48

typedef enum { PART_TEXT, PART_THOUGHT, PART_CALL } part_kind;

/* One part of the model's turn, for provider_state. */
typedef struct {
    part_kind kind;
    size_t off, len; /* TEXT, THOUGHT: a range of text or reasoning */
    size_t call;     /* CALL: index into calls */
    char *sig;       /* thoughtSignature, NULL when none */
} part;

typedef struct {
    char *id;   /* Gemini's, or generated */
    int own_id; /* Gemini gave the id */
    char *name;
    char *args; /* JSON object text */
} call;

struct loom__gemini_decoder {
    loom__llm_answer a; /* first: the part every decoder has */
    loom__gemini_limits lim;
    long turn;
    call *calls; /* as they came; a.calls gets them at the end */
    size_t ncalls, calls_cap;
    part *parts;
    size_t nparts, parts_cap;
    size_t state_bytes;
    int has_state;    /* a signature or an id to send back */
    char *raw_finish; /* Gemini's finishReason, or a blockReason */
    int blocked;      /* the prompt was blocked */
};

/* What the shared part (llm/answer.h) calls back; defined at the end. */
static const loom__llm_answer_kind gemini_kind;

/* The defaults of the limits (loom__llm_answer_kind.limits). */
static size_t limits_of(void *p, size_t *max_text)
{
    loom__gemini_limits *lim = p;
    size_t big =
        loom__llm_limits(&lim->max_tool_calls, &lim->max_args, &lim->max_text);

    *max_text = lim->max_text;
    if (!lim->max_state)
        lim->max_state = LOOM_GEMINI_MAX_STATE;
    /* One event may carry a whole answer, and JSON escaping may double
     * it: leave room, but stay bounded. */
    return 2 * big + lim->max_state + 65536;
}

int loom__gemini_decoder_new(loom__gemini_decoder **out,
                             const loom__gemini_limits *limits, long turn,
                             loom_llm_event_cb cb, void *payload)
{
    void *d = NULL;
    int rc = loom__llm_answer_new(&d, sizeof(**out), &gemini_kind, limits, cb,
                                  payload);

    if ((*out = d) != NULL)
        (*out)->turn = turn;
    return rc;
}

/* ---- the parts of a turn --------------------------------------------- */

static int charge_state(loom__gemini_decoder *d, size_t n)
{
    if (n > d->lim.max_state - d->state_bytes)
        return loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_ETOOLARGE,
                                   "answer state (thought signatures, "
                                   "call ids) passed the limit of %zu "
                                   "bytes",
                                   d->lim.max_state));
    d->state_bytes += n;
    return 0;
}

/*
 * Records a part. A text (or thought) part without a signature joins the
 * previous one of its kind when that one has none either: Gemini accepts
 * split text joined, but a signed part must stay as it came.
 */
static int add_part(loom__gemini_decoder *d, part_kind kind, size_t off,
                    size_t len, size_t call_index, const char *sig)
{
    part *p;
    int rc;

    if (kind != PART_CALL && !sig && d->nparts) {
        p = &d->parts[d->nparts - 1];
        if (p->kind == kind && !p->sig && p->off + p->len == off) {
            p->len += len;
            return 0;
        }
    }
    if ((rc = charge_state(d, PART_COST + (sig ? strlen(sig) : 0))) != 0)
        return rc;
    if (d->nparts == d->parts_cap) {
        size_t cap = d->parts_cap ? 2 * d->parts_cap : 8;
        part *np = realloc(d->parts, cap * sizeof(*np));
        if (!np)
            return loom__llm_answer_fail(&d->a, loom__error_oom());
        d->parts = np;
        d->parts_cap = cap;
    }
    p = &d->parts[d->nparts];
    memset(p, 0, sizeof(*p));
    p->kind = kind;
    p->off = off;
    p->len = len;
    p->call = call_index;
    if (sig) {
        if (!(p->sig = strdup(sig)))
            return loom__llm_answer_fail(&d->a, loom__error_oom());
        d->has_state = 1;
    }
    d->nparts++;
    return 0;
}

/* ---- decoding -------------------------------------------------------- */

/* A count from o[key] (see loom__llm_count). */
static long count_of(const json_t *o, const char *key)
{
    return loom__llm_count(json_object_get(o, key));
}

static int add_text(loom__gemini_decoder *d, int thought, const char *s,
                    size_t len, const char *sig)
{
    loom_llm_event_type type = thought ? LOOM_LLM_REASONING : LOOM_LLM_TEXT;
    size_t off = thought ? d->a.reasoning.len : d->a.text.len;
    int rc;

    /* The part first: text kept is text passed on, also when the state
     * passes its limit here. Unsigned thoughts are not sent back: no part
     * for them. */
    if ((!thought || sig) && (len || sig) &&
        (rc = add_part(d, thought ? PART_THOUGHT : PART_TEXT, off, len, 0,
                       sig)) != 0)
        return rc;
    if ((rc = loom__llm_answer_keep(&d->a, type, s, len)) != 0)
        return rc;
    return len ? loom__llm_answer_pass(&d->a, type, s, len) : 0;
}

static int add_call(loom__gemini_decoder *d, const json_t *fc, const char *sig)
{
    const char *name = loom__llm_jstr(fc, "name"),
               *id = loom__llm_jstr(fc, "id");
    const json_t *args = json_object_get(fc, "args");
    char gen[64];
    call *c;
    int rc;

    if (!name || !*name)
        return loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_EPROTO, "functionCall %zu has no name",
                                   d->ncalls));
    if (args && !json_is_object(args) && !json_is_null(args))
        return loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_EPROTO,
                                   "functionCall %zu: args is not an "
                                   "object",
                                   d->ncalls));
    if (d->ncalls >= d->lim.max_tool_calls)
        return loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_ETOOLARGE,
                                   "answer has more than %zu tool calls",
                                   d->lim.max_tool_calls));
    if (id && !*id)
        id = NULL;
    if (id && (rc = charge_state(d, strlen(id))) != 0)
        return rc;
    if (d->ncalls == d->calls_cap) {
        size_t cap = d->calls_cap ? 2 * d->calls_cap : 4;
        call *nc = realloc(d->calls, cap * sizeof(*nc));
        if (!nc)
            return loom__llm_answer_fail(&d->a, loom__error_oom());
        d->calls = nc;
        d->calls_cap = cap;
    }
    c = &d->calls[d->ncalls];
    memset(c, 0, sizeof(*c));
    d->ncalls++;
    snprintf(gen, sizeof(gen), "call_%ld_%zu", d->turn, d->ncalls - 1);
    c->own_id = id != NULL;
    c->id = strdup(id ? id : gen);
    c->name = strdup(name);
    c->args = json_is_object(args)
                  ? json_dumps(args, JSON_COMPACT | JSON_REAL_PRECISION(17))
                  : strdup("{}");
    if (!c->id || !c->name || !c->args)
        return loom__llm_answer_fail(&d->a, loom__error_oom());
    if (strlen(c->args) > d->lim.max_args)
        return loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_ETOOLARGE,
                                   "tool call %zu: arguments passed the "
                                   "limit of %zu bytes",
                                   d->ncalls - 1, d->lim.max_args));
    if (id)
        d->has_state = 1;
    if ((rc = add_part(d, PART_CALL, 0, 0, d->ncalls - 1, sig)) != 0)
        return rc;
    return loom__llm_answer_call_delta(&d->a, d->ncalls - 1, c->id, c->name,
                                       c->args);
}

static int read_part(loom__gemini_decoder *d, const json_t *p)
{
    const char *sig = loom__llm_jstr(p, "thoughtSignature");
    const json_t *fc = json_object_get(p, "functionCall");
    const json_t *text = json_object_get(p, "text");

    if (!json_is_object(p))
        return 0;
    if (sig && !*sig)
        sig = NULL;
    if (json_is_object(fc))
        return add_call(d, fc, sig);
    if (json_is_string(text))
        return add_text(d, json_is_true(json_object_get(p, "thought")),
                        json_string_value(text), json_string_length(text), sig);
    /* A signature on a part loom does not read (no text, no call) is kept
     * on an empty text part so that it still goes back. */
    if (sig)
        return add_text(d, 0, "", 0, sig);
    return 0; /* inlineData, executableCode, ...: not loom's */
}

static void read_usage(loom__gemini_decoder *d, const json_t *u)
{
    long thoughts;

    if (!json_is_object(u))
        return;
    thoughts = count_of(u, "thoughtsTokenCount");
    d->a.usage.prompt_tokens = count_of(u, "promptTokenCount") +
                               count_of(u, "toolUsePromptTokenCount");
    d->a.usage.completion_tokens =
        count_of(u, "candidatesTokenCount") + thoughts;
    d->a.usage.cached_tokens = count_of(u, "cachedContentTokenCount");
    d->a.usage.reasoning_tokens = thoughts;
    d->a.usage.total_tokens = count_of(u, "totalTokenCount");
    if (!json_object_get(u, "totalTokenCount"))
        d->a.usage.total_tokens =
            d->a.usage.prompt_tokens + d->a.usage.completion_tokens;
    d->a.has_usage = 1;
}

static int keep_finish(loom__gemini_decoder *d, const char *s)
{
    if (!s || !*s || d->raw_finish)
        return 0;
    if (!(d->raw_finish = strdup(s)))
        return loom__llm_answer_fail(&d->a, loom__error_oom());
    return 0;
}

/* An error object inside the answer ({"error": {"code", "message",
 * "status"}}). */
static int stream_error(loom__gemini_decoder *d, const json_t *obj,
                        const char *data, size_t len)
{
    const json_t *err = json_object_get(obj, "error");
    const json_t *jcode = json_object_get(err, "code");
    const char *msg = NULL, *type = NULL;
    json_int_t code = json_is_integer(jcode) ? json_integer_value(jcode) : 0;

    if (json_is_object(err)) {
        msg = loom__llm_jstr(err, "message");
        type = loom__llm_jstr(err, "status");
    } else if (json_is_string(err)) {
        msg = json_string_value(err);
    }
    return loom__llm_answer_error(
        &d->a, LOOM_UPSTREAM_STREAM, code > 0 && code < 1000 ? (int)code : 0,
        msg && *msg ? msg : NULL, type && *type ? type : NULL, data, len, 1);
}

/* One GenerateContentResponse. */
static int read_response(loom__gemini_decoder *d, const json_t *o,
                         const char *data, size_t len)
{
    const json_t *cands = json_object_get(o, "candidates");
    const json_t *fb = json_object_get(o, "promptFeedback");
    const char *id = loom__llm_jstr(o, "responseId");
    const json_t *err = json_object_get(o, "error");
    size_t i;
    json_t *c;
    int rc;

    if (!json_is_object(o))
        return loom__llm_answer_bad_json(&d->a, "answer event", data, len);
    if (err && !json_is_null(err))
        return stream_error(d, o, data, len);
    if (id && *id && !d->a.response_id && !(d->a.response_id = strdup(id)))
        return loom__llm_answer_fail(&d->a, loom__error_oom());
    read_usage(d, json_object_get(o, "usageMetadata"));
    if (json_is_object(fb) && loom__llm_jstr(fb, "blockReason")) {
        d->blocked = 1;
        if ((rc = keep_finish(d, loom__llm_jstr(fb, "blockReason"))) != 0)
            return rc;
    }
    if (cands && !json_is_array(cands))
        return loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_EPROTO, "candidates is not an array"));
    json_array_foreach(cands, i, c)
    {
        const json_t *idx = json_object_get(c, "index");
        const json_t *parts =
            json_object_get(json_object_get(c, "content"), "parts");
        size_t k;
        json_t *p;

        /* Only the first candidate is loom's (candidateCount is never
         * sent). */
        if (!json_is_object(c) ||
            (json_is_integer(idx) && json_integer_value(idx) != 0))
            continue;
        if (parts && !json_is_array(parts))
            return loom__llm_answer_fail(
                &d->a,
                loom__error_set(LOOM_EPROTO, "content.parts is not an array"));
        json_array_foreach(parts, k, p)
        {
            if ((rc = read_part(d, p)) != 0)
                return rc;
        }
        if ((rc = keep_finish(d, loom__llm_jstr(c, "finishReason"))) != 0)
            return rc;
        break;
    }
    return 0;
}

/* loom's finish reason for Gemini's. */
static const char *finish_name(const loom__gemini_decoder *d, char *buf,
                               size_t size)
{
    static const char *const filtered[] = {"SAFETY",
                                           "RECITATION",
                                           "BLOCKLIST",
                                           "PROHIBITED_CONTENT",
                                           "SPII",
                                           "IMAGE_SAFETY",
                                           "IMAGE_PROHIBITED_CONTENT",
                                           "IMAGE_RECITATION",
                                           "LANGUAGE",
                                           "OTHER_BLOCK"};
    const char *r = d->raw_finish;
    size_t i;

    if (d->blocked)
        return "content_filter";
    if (strcmp(r, "STOP") == 0)
        return d->ncalls ? "tool_calls" : "stop";
    if (strcmp(r, "MAX_TOKENS") == 0)
        return "length";
    for (i = 0; i < sizeof(filtered) / sizeof(filtered[0]); i++)
        if (strcmp(r, filtered[i]) == 0)
            return "content_filter";
    /* Anything else (MALFORMED_FUNCTION_CALL, OTHER, ...) lower-cased. */
    for (i = 0; r[i] && i + 1 < size; i++)
        buf[i] = (r[i] >= 'A' && r[i] <= 'Z') ? (char)(r[i] - 'A' + 'a') : r[i];
    buf[i] = '\0';
    return buf;
}

static int put_range(loom_buf *b, const char *key, size_t off, size_t len)
{
    return loom_buf_printf(b, "{\"%s\":[%zu,%zu]", key, off, len);
}

static int put_jstring(loom_buf *b, const char *s)
{
    json_t *j = json_string(s);
    char *t = j ? json_dumps(j, JSON_ENCODE_ANY) : NULL;
    int rc = t ? loom_buf_puts(b, t) : loom__error_oom();

    free(t);
    json_decref(j);
    return rc;
}

/* The provider_state text (see llm/gemini.h). Signatures and ids came from
 * jansson, so they are valid UTF-8 and dump as they were. */
static int build_state(loom__gemini_decoder *d)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    int rc = loom_buf_puts(&b, "{\"gemini\":{\"parts\":[");

    for (size_t i = 0; !rc && i < d->nparts; i++) {
        const part *p = &d->parts[i];
        if (i && (rc = loom_buf_putc(&b, ',')) != 0)
            break;
        if (p->kind == PART_CALL) {
            const call *c = &d->calls[p->call];
            rc = loom_buf_printf(&b, "{\"call\":%zu", p->call);
            if (!rc && c->own_id && !(rc = loom_buf_puts(&b, ",\"id\":")))
                rc = put_jstring(&b, c->id);
        } else {
            rc = put_range(&b, p->kind == PART_TEXT ? "text" : "thought",
                           p->off, p->len);
        }
        if (!rc && p->sig &&
            !(rc = loom_buf_puts(&b, ",\"thoughtSignature\":")))
            rc = put_jstring(&b, p->sig);
        if (!rc)
            rc = loom_buf_putc(&b, '}');
    }
    if (!rc)
        rc = loom_buf_puts(&b, "]}}");
    if (rc) {
        loom_buf_free(&b);
        return loom__llm_answer_fail(&d->a, loom__error_oom());
    }
    d->a.state = loom_buf_detach(&b);
    loom_buf_free(&b);
    return d->a.state ? 0 : loom__llm_answer_fail(&d->a, loom__error_oom());
}

/* Builds the complete calls and the state; emits USAGE, TOOL_CALLS and
 * FINISH. */
static int close_answer(void *owner)
{
    loom__gemini_decoder *d = owner;
    char buf[64];
    int rc;

    d->a.ended = 1;
    /* The state first: it reads the calls' ids before they move. */
    if (d->has_state && (rc = build_state(d)) != 0)
        return rc;
    if (loom__llm_answer_calls(&d->a, d->ncalls))
        return LOOM_ENOMEM;
    d->a.calls_len = d->ncalls;
    for (size_t i = 0; i < d->ncalls; i++) {
        d->a.calls[i].id = d->calls[i].id;
        d->a.calls[i].name = d->calls[i].name;
        d->a.calls[i].arguments = d->calls[i].args;
        d->calls[i].id = d->calls[i].name = d->calls[i].args = NULL;
    }
    if (d->raw_finish &&
        !(d->a.finish_reason = strdup(finish_name(d, buf, sizeof(buf)))))
        return loom__llm_answer_fail(&d->a, loom__error_oom());
    return loom__llm_answer_close(&d->a);
}

static int on_sse(const loom_sse_event *ev, void *payload)
{
    loom__gemini_decoder *d = payload;
    json_t *o;
    int rc;

    if (d->a.failed)
        return d->a.failed;
    if (strcmp(ev->event, "error") == 0) {
        o = json_loadb(ev->data, ev->data_len, 0, NULL);
        rc = stream_error(d, o, ev->data, ev->data_len);
        json_decref(o);
        return rc;
    }
    if (strcmp(ev->event, "message") != 0)
        return 0; /* pings and other events of proxies */
    /* Gemini sends no end marker; a proxy that adds OpenAI's is ignored. */
    if (ev->data_len == 6 && memcmp(ev->data, "[DONE]", 6) == 0)
        return 0;
    o = json_loadb(ev->data, ev->data_len, 0, NULL);
    if (!o)
        return loom__llm_answer_bad_json(&d->a, "answer event", ev->data,
                                         ev->data_len);
    rc = read_response(d, o, ev->data, ev->data_len);
    json_decref(o);
    return rc;
}

/* The end of a stream that did not end the answer. */
static int end(void *owner)
{
    loom__gemini_decoder *d = owner;

    /* The last event of a whole answer has the finishReason. */
    if (d->raw_finish)
        return close_answer(d);
    return loom__llm_answer_cut(&d->a, "answer");
}

/* A whole JSON body (loom__llm_answer_kind.complete). */
static int complete(void *owner, const json_t *o, const char *body, size_t len)
{
    loom__gemini_decoder *d = owner;
    const json_t *e;
    size_t i;
    int rc = 0;

    if (json_is_array(o)) {
        json_array_foreach(o, i, e)
        {
            if ((rc = read_response(d, e, body, len)) != 0)
                break;
        }
    } else if (!json_object_get(o, "candidates") &&
               !json_object_get(o, "promptFeedback") &&
               !json_object_get(o, "error")) {
        rc = loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_EPROTO, "answer has no candidates"));
    } else {
        rc = read_response(d, o, body, len);
    }
    return rc ? rc : close_answer(d);
}

/* ---- errors ---------------------------------------------------------- */

/*
 * The JSON of an error body: the body itself, or the first `data:` line's
 * payload when it is SSE-framed (a streaming request's error), or the
 * first element of an array (streamGenerateContent without alt=sse).
 * NULL when none is JSON. A new reference.
 */
static json_t *error_json(const char *body, size_t len)
{
    json_t *o = body && len ? json_loadb(body, len, 0, NULL) : NULL;
    const char *p, *end, *eol;

    if (!o && body && len) {
        for (p = body, end = body + len; p < end; p = eol + 1) {
            eol = memchr(p, '\n', (size_t)(end - p));
            if (!eol)
                eol = end;
            if ((size_t)(eol - p) > 5 && memcmp(p, "data:", 5) == 0) {
                o = json_loadb(p + 5, (size_t)(eol - p - 5), 0, NULL);
                break;
            }
        }
    }
    if (json_is_array(o)) {
        json_t *first = json_incref(json_array_get(o, 0));
        json_decref(o);
        o = first;
    }
    return o;
}

/*
 * The kind for a status: every provider's (loom__llm_status_kind), except
 * for statuses no API answers with, which Gemini's adapter always read as
 * a bad request (1xx, 3xx) or a server error (600 and up).
 */
static loom_upstream_kind status_kind(long status)
{
    loom_upstream_kind k = loom__llm_status_kind(status);

    if (k != LOOM_UPSTREAM_PROTOCOL)
        return k;
    return status >= 500 ? LOOM_UPSTREAM_SERVER : LOOM_UPSTREAM_BAD_REQUEST;
}

int loom__gemini_error_from_http(loom_upstream_error *err, long status,
                                 const char *body, size_t len,
                                 const char *request_id)
{
    json_t *o = error_json(body, len), *e;
    const char *msg = NULL, *type = NULL;
    size_t n = 0;
    int rc;

    e = json_object_get(o, "error");
    if (json_is_object(e)) {
        msg = loom__llm_jstr(e, "message");
        type = loom__llm_jstr(e, "status");
    } else if (json_is_string(e)) {
        msg = json_string_value(e);
    } else if (json_is_object(o)) {
        msg = loom__llm_jstr(o, "message");
    }
    if (msg && *msg) {
        n = strlen(msg);
    } else if (body && len) {
        msg = body;
        n = loom__utf8_cut(body, len, LOOM_GEMINI_MAX_ERROR_TEXT);
    } else {
        msg = NULL; /* "HTTP <status>" */
    }
    rc = loom__llm_error_set(err, status_kind(status), status, msg, n,
                             type && *type ? type : NULL, request_id);
    json_decref(o);
    return rc;
}

long loom__gemini_retry_delay(const char *body, size_t len)
{
    json_t *o = error_json(body, len), *det, *x;
    long ms = -1;
    size_t i;

    det = json_object_get(json_object_get(o, "error"), "details");
    json_array_foreach(det, i, x)
    {
        const char *type = loom__llm_jstr(x, "@type"),
                   *delay = loom__llm_jstr(x, "retryDelay");
        size_t tl = type ? strlen(type) : 0;
        char *end;
        double s;

        if (!delay || tl < 13 || strcmp(type + tl - 13, "rpc.RetryInfo"))
            continue;
        /* A protobuf Duration in JSON: decimal seconds and an "s". */
        s = strtod(delay, &end);
        if (end == delay || strcmp(end, "s") != 0 || !isfinite(s) || s < 0)
            continue;
        ms = s > 1e6 ? 1000000000L : (long)(s * 1000.0 + 0.5);
        break;
    }
    json_decref(o);
    return ms;
}

int loom__gemini_stream_error_retryable(const loom_upstream_error *err)
{
    int s = err->http_status;

    return s == 408 || s == 429 || (s >= 500 && s < 600);
}

/* Frees what is this decoder's own (loom__llm_answer_free() does the
 * rest). */
static void release(void *owner)
{
    loom__gemini_decoder *d = owner;

    for (size_t i = 0; i < d->ncalls; i++) {
        free(d->calls[i].id);
        free(d->calls[i].name);
        free(d->calls[i].args);
    }
    free(d->calls);
    for (size_t i = 0; i < d->nparts; i++)
        free(d->parts[i].sig);
    free(d->parts);
    free(d->raw_finish);
}

static const loom__llm_answer_kind gemini_kind = {
    .on_sse = on_sse,
    .end = end,
    .complete = complete,
    .arrays = 1, /* streamGenerateContent without alt=sse */
    .release = release,
    .reasoning_name = "reasoning",
    .lim_offset = offsetof(loom__gemini_decoder, lim),
    .lim_size = sizeof(loom__gemini_limits),
    .limits = limits_of,
};

LOOM__LLM_DECODER_API(loom__gemini_decoder)
