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
#include "llm/gemini.h"
#include "loom/buf.h"
#include "loom/sse.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Token counts beyond this are nonsense from a broken server; clamping
 * keeps sums of them (usage totals over a run) from overflowing. */
#define MAX_TOKEN_COUNT 1000000000000L
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
    loom__gemini_limits lim;
    loom_llm_event_cb cb;
    void *payload;
    long turn;
    loom_sse_parser *sse;

    loom_buf text;
    loom_buf reasoning;
    int has_reasoning;
    call *calls;
    size_t ncalls, calls_cap;
    part *parts;
    size_t nparts, parts_cap;
    size_t state_bytes;
    int has_state; /* a signature or an id to send back */
    loom_usage usage;
    int has_usage;
    char *raw_finish; /* Gemini's finishReason, or a blockReason */
    int blocked;      /* the prompt was blocked */
    char *finish_reason;
    char *response_id;
    loom_tool_call *out_calls; /* built at the end */
    char *state;               /* provider_state text, built at the end */

    int output_started;
    int ended;  /* closing events emitted */
    int failed; /* the error that stopped the decoder, 0 while fine */
    loom_upstream_error error;
};

static int fail(loom__gemini_decoder *d, int rc)
{
    d->failed = rc;
    return rc;
}

static int emit(loom__gemini_decoder *d, const loom_llm_event *ev)
{
    if (d->cb && d->cb(ev, d->payload) != 0)
        return fail(d, loom__error_set(LOOM_ECANCELED,
                                       "canceled by the event callback"));
    return 0;
}

static void clear_error(loom_upstream_error *err)
{
    int attempts = err->attempts;

    free(err->type);
    free(err->message);
    free(err->request_id);
    memset(err, 0, sizeof(*err));
    err->attempts = attempts;
}

static int on_sse(const loom_sse_event *ev, void *payload);

int loom__gemini_decoder_new(loom__gemini_decoder **out,
                             const loom__gemini_limits *limits, long turn,
                             loom_llm_event_cb cb, void *payload)
{
    loom_sse_options opts = LOOM_SSE_OPTIONS_INIT;
    loom__gemini_decoder *d;
    size_t big;
    int rc;

    *out = NULL;
    d = calloc(1, sizeof(*d));
    if (!d)
        return loom__error_oom();
    if (limits)
        d->lim = *limits;
    if (!d->lim.max_tool_calls)
        d->lim.max_tool_calls = LOOM_GEMINI_MAX_TOOL_CALLS;
    if (!d->lim.max_args)
        d->lim.max_args = LOOM_GEMINI_MAX_ARGS;
    if (!d->lim.max_text)
        d->lim.max_text = LOOM_GEMINI_MAX_TEXT;
    if (!d->lim.max_state)
        d->lim.max_state = LOOM_GEMINI_MAX_STATE;
    d->cb = cb;
    d->payload = payload;
    d->turn = turn;
    loom_buf_init(&d->text, d->lim.max_text);
    loom_buf_init(&d->reasoning, d->lim.max_text);
    /* One event may carry a whole answer, and JSON escaping may double
     * it: leave room, but stay bounded. */
    big = d->lim.max_text > d->lim.max_args ? d->lim.max_text : d->lim.max_args;
    opts.max_line = opts.max_event = 2 * big + d->lim.max_state + 65536;
    if ((rc = loom_sse_parser_new(&d->sse, &opts, on_sse, d)) != 0) {
        free(d);
        return rc;
    }
    *out = d;
    return 0;
}

void loom__gemini_decoder_free(loom__gemini_decoder *d)
{
    if (!d)
        return;
    loom_sse_parser_free(d->sse);
    loom_buf_free(&d->text);
    loom_buf_free(&d->reasoning);
    for (size_t i = 0; i < d->ncalls; i++) {
        free(d->calls[i].id);
        free(d->calls[i].name);
        free(d->calls[i].args);
    }
    free(d->calls);
    for (size_t i = 0; i < d->nparts; i++)
        free(d->parts[i].sig);
    free(d->parts);
    if (d->out_calls) {
        for (size_t i = 0; i < d->ncalls; i++)
            loom_tool_call_clear(&d->out_calls[i]);
        free(d->out_calls);
    }
    free(d->raw_finish);
    free(d->finish_reason);
    free(d->response_id);
    free(d->state);
    clear_error(&d->error);
    free(d);
}

int loom__gemini_decoder_output_started(const loom__gemini_decoder *d)
{
    return d->output_started;
}

int loom__gemini_decoder_done(const loom__gemini_decoder *d)
{
    return d->ended;
}

const loom_upstream_error *
loom__gemini_decoder_error(const loom__gemini_decoder *d)
{
    return &d->error;
}

/* ---- the parts of a turn --------------------------------------------- */

static int charge_state(loom__gemini_decoder *d, size_t n)
{
    if (n > d->lim.max_state - d->state_bytes)
        return fail(d, loom__error_set(LOOM_ETOOLARGE,
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
            return fail(d, loom__error_oom());
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
            return fail(d, loom__error_oom());
        d->has_state = 1;
    }
    d->nparts++;
    return 0;
}

/* ---- decoding -------------------------------------------------------- */

static const char *jstr(const json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

/* A non-negative count from o[key], clamped; 0 when absent or not a
 * number. */
static long count_of(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    double r;

    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        return i < 0 ? 0 : i > MAX_TOKEN_COUNT ? MAX_TOKEN_COUNT : (long)i;
    }
    if (json_is_real(v)) {
        r = json_real_value(v);
        return r >= 1.0
                   ? r < (double)MAX_TOKEN_COUNT ? (long)r : MAX_TOKEN_COUNT
                   : 0;
    }
    return 0;
}

static int add_text(loom__gemini_decoder *d, int thought, const char *s,
                    size_t len, const char *sig)
{
    loom_buf *b = thought ? &d->reasoning : &d->text;
    loom_llm_event ev = {0};
    size_t off = b->len;
    int rc;

    if (len > b->max - b->len)
        return fail(d, loom__error_set(LOOM_ETOOLARGE,
                                       "answer %s passed the limit of %zu "
                                       "bytes",
                                       thought ? "reasoning" : "text", b->max));
    if (len && loom_buf_put(b, s, len) != 0)
        return fail(d, loom__error_oom());
    /* Unsigned thoughts are not sent back: no part for them. */
    if ((!thought || sig) && (len || sig) &&
        (rc = add_part(d, thought ? PART_THOUGHT : PART_TEXT, off, len, 0,
                       sig)) != 0)
        return rc;
    if (!len)
        return 0;
    if (thought)
        d->has_reasoning = 1;
    d->output_started = 1;
    ev.type = thought ? LOOM_LLM_REASONING : LOOM_LLM_TEXT;
    ev.text = s;
    ev.text_len = len;
    return emit(d, &ev);
}

static int add_call(loom__gemini_decoder *d, const json_t *fc, const char *sig)
{
    const char *name = jstr(fc, "name"), *id = jstr(fc, "id");
    const json_t *args = json_object_get(fc, "args");
    loom_llm_event ev = {0};
    char gen[64];
    call *c;
    int rc;

    if (!name || !*name)
        return fail(d,
                    loom__error_set(LOOM_EPROTO, "functionCall %zu has no name",
                                    d->ncalls));
    if (args && !json_is_object(args) && !json_is_null(args))
        return fail(d, loom__error_set(LOOM_EPROTO,
                                       "functionCall %zu: args is not an "
                                       "object",
                                       d->ncalls));
    if (d->ncalls >= d->lim.max_tool_calls)
        return fail(d, loom__error_set(LOOM_ETOOLARGE,
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
            return fail(d, loom__error_oom());
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
        return fail(d, loom__error_oom());
    if (strlen(c->args) > d->lim.max_args)
        return fail(d, loom__error_set(LOOM_ETOOLARGE,
                                       "tool call %zu: arguments passed the "
                                       "limit of %zu bytes",
                                       d->ncalls - 1, d->lim.max_args));
    if (id)
        d->has_state = 1;
    if ((rc = add_part(d, PART_CALL, 0, 0, d->ncalls - 1, sig)) != 0)
        return rc;
    d->output_started = 1;
    ev.type = LOOM_LLM_TOOL_CALL_DELTA;
    ev.tool_index = (int)(d->ncalls - 1);
    ev.tool_id = c->id;
    ev.tool_name = c->name;
    ev.args_delta = c->args;
    return emit(d, &ev);
}

static int read_part(loom__gemini_decoder *d, const json_t *p)
{
    const char *sig = jstr(p, "thoughtSignature");
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
    d->usage.prompt_tokens = count_of(u, "promptTokenCount") +
                             count_of(u, "toolUsePromptTokenCount");
    d->usage.completion_tokens = count_of(u, "candidatesTokenCount") + thoughts;
    d->usage.cached_tokens = count_of(u, "cachedContentTokenCount");
    d->usage.reasoning_tokens = thoughts;
    d->usage.total_tokens = count_of(u, "totalTokenCount");
    if (!json_object_get(u, "totalTokenCount"))
        d->usage.total_tokens =
            d->usage.prompt_tokens + d->usage.completion_tokens;
    d->has_usage = 1;
}

static int keep_finish(loom__gemini_decoder *d, const char *s)
{
    if (!s || !*s || d->raw_finish)
        return 0;
    if (!(d->raw_finish = strdup(s)))
        return fail(d, loom__error_oom());
    return 0;
}

/* An error object inside the answer ({"error": {"code", "message",
 * "status"}}). */
static int stream_error(loom__gemini_decoder *d, const json_t *obj,
                        const char *data, size_t len)
{
    const json_t *err = json_object_get(obj, "error");
    const char *msg = NULL, *type = NULL;
    loom_llm_event ev = {0};

    clear_error(&d->error);
    d->error.kind = LOOM_UPSTREAM_STREAM;
    if (json_is_object(err)) {
        msg = jstr(err, "message");
        type = jstr(err, "status");
        if (json_is_integer(json_object_get(err, "code"))) {
            json_int_t code = json_integer_value(json_object_get(err, "code"));
            d->error.http_status = code > 0 && code < 1000 ? (int)code : 0;
        }
    } else if (json_is_string(err)) {
        msg = json_string_value(err);
    }
    if (msg && *msg)
        d->error.message = strdup(msg);
    else
        d->error.message = strndup(data, len > LOOM_GEMINI_MAX_ERROR_TEXT
                                             ? LOOM_GEMINI_MAX_ERROR_TEXT
                                             : len);
    if (type && *type)
        d->error.type = strdup(type);
    if (!d->error.message || (type && *type && !d->error.type))
        return fail(d, loom__error_oom());
    ev.type = LOOM_LLM_ERROR;
    ev.error_code = LOOM_EUPSTREAM;
    ev.error_message = d->error.message;
    if (d->cb)
        d->cb(&ev, d->payload);
    return fail(d, loom__error_set(LOOM_EUPSTREAM, "stream error: %s",
                                   d->error.message));
}

static int bad_json(loom__gemini_decoder *d, const char *what,
                    const json_error_t *je, const char *data, size_t len)
{
    return fail(d, loom__error_set(LOOM_EPROTO, "malformed %s (%s): %.*s", what,
                                   je ? je->text : "not an object",
                                   (int)(len > 120 ? 120 : len), data));
}

/* One GenerateContentResponse. */
static int read_response(loom__gemini_decoder *d, const json_t *o,
                         const char *data, size_t len)
{
    const json_t *cands = json_object_get(o, "candidates");
    const json_t *fb = json_object_get(o, "promptFeedback");
    const char *id = jstr(o, "responseId");
    const json_t *err = json_object_get(o, "error");
    size_t i;
    json_t *c;
    int rc;

    if (!json_is_object(o))
        return bad_json(d, "answer event", NULL, data, len);
    if (err && !json_is_null(err))
        return stream_error(d, o, data, len);
    if (id && *id && !d->response_id && !(d->response_id = strdup(id)))
        return fail(d, loom__error_oom());
    read_usage(d, json_object_get(o, "usageMetadata"));
    if (json_is_object(fb) && jstr(fb, "blockReason")) {
        d->blocked = 1;
        if ((rc = keep_finish(d, jstr(fb, "blockReason"))) != 0)
            return rc;
    }
    if (cands && !json_is_array(cands))
        return fail(d,
                    loom__error_set(LOOM_EPROTO, "candidates is not an array"));
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
            return fail(d, loom__error_set(LOOM_EPROTO,
                                           "content.parts is not an array"));
        json_array_foreach(parts, k, p)
        {
            if ((rc = read_part(d, p)) != 0)
                return rc;
        }
        if ((rc = keep_finish(d, jstr(c, "finishReason"))) != 0)
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
        return fail(d, loom__error_oom());
    }
    d->state = loom_buf_detach(&b);
    loom_buf_free(&b);
    return d->state ? 0 : fail(d, loom__error_oom());
}

/* Builds the complete calls and the state; emits USAGE, TOOL_CALLS and
 * FINISH. */
static int close_answer(loom__gemini_decoder *d)
{
    loom_llm_event ev = {0};
    char buf[64];
    int rc;

    d->ended = 1;
    /* The state first: it reads the calls' ids before they move. */
    if (d->has_state && (rc = build_state(d)) != 0)
        return rc;
    if (d->ncalls) {
        d->out_calls = calloc(d->ncalls, sizeof(*d->out_calls));
        if (!d->out_calls)
            return fail(d, loom__error_oom());
        for (size_t i = 0; i < d->ncalls; i++) {
            d->out_calls[i].id = d->calls[i].id;
            d->out_calls[i].name = d->calls[i].name;
            d->out_calls[i].arguments = d->calls[i].args;
            d->calls[i].id = d->calls[i].name = d->calls[i].args = NULL;
        }
    }
    if (d->raw_finish &&
        !(d->finish_reason = strdup(finish_name(d, buf, sizeof(buf)))))
        return fail(d, loom__error_oom());
    if (d->has_usage) {
        ev.type = LOOM_LLM_USAGE;
        ev.usage = d->usage;
        if ((rc = emit(d, &ev)) != 0)
            return rc;
    }
    if (d->ncalls) {
        memset(&ev, 0, sizeof(ev));
        ev.type = LOOM_LLM_TOOL_CALLS;
        ev.calls = d->out_calls;
        ev.calls_len = d->ncalls;
        if ((rc = emit(d, &ev)) != 0)
            return rc;
    }
    if (d->finish_reason) {
        memset(&ev, 0, sizeof(ev));
        ev.type = LOOM_LLM_FINISH;
        ev.finish_reason = d->finish_reason;
        if ((rc = emit(d, &ev)) != 0)
            return rc;
    }
    return 0;
}

static int on_sse(const loom_sse_event *ev, void *payload)
{
    loom__gemini_decoder *d = payload;
    json_error_t je;
    json_t *o;
    int rc;

    if (d->failed)
        return d->failed;
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
    o = json_loadb(ev->data, ev->data_len, 0, &je);
    if (!o)
        return bad_json(d, "answer event", &je, ev->data, ev->data_len);
    rc = read_response(d, o, ev->data, ev->data_len);
    json_decref(o);
    return rc;
}

int loom__gemini_decoder_feed(loom__gemini_decoder *d, const char *data,
                              size_t len)
{
    int rc;

    if (d->failed)
        return d->failed;
    if (d->ended)
        return 0;
    rc = loom_sse_parser_feed(d->sse, data, len);
    if (rc && !d->failed)
        d->failed = rc; /* the SSE parser's own limit */
    return rc;
}

int loom__gemini_decoder_finish(loom__gemini_decoder *d)
{
    int rc;

    if (d->failed)
        return d->failed;
    if (d->ended)
        return 0;
    if ((rc = loom_sse_parser_finish(d->sse)) != 0) {
        if (!d->failed)
            d->failed = rc;
        return rc;
    }
    /* The last event of a whole answer has the finishReason. */
    if (d->raw_finish)
        return close_answer(d);
    clear_error(&d->error);
    d->error.kind = LOOM_UPSTREAM_CONNECTION;
    d->error.message = strdup("stream ended before the answer was complete");
    if (!d->error.message)
        return fail(d, loom__error_oom());
    return fail(d, loom__error_set(LOOM_EUPSTREAM, "%s", d->error.message));
}

int loom__gemini_decoder_complete(loom__gemini_decoder *d, const char *body,
                                  size_t len)
{
    json_error_t je;
    json_t *o, *e;
    size_t i;
    int rc = 0;

    if (d->failed)
        return d->failed;
    if (d->ended)
        return 0;
    o = json_loadb(body, len, 0, &je);
    if (!o)
        return bad_json(d, "answer", &je, body, len);
    if (json_is_array(o)) {
        json_array_foreach(o, i, e)
        {
            if ((rc = read_response(d, e, body, len)) != 0)
                break;
        }
    } else if (!json_is_object(o)) {
        rc = bad_json(d, "answer", NULL, body, len);
    } else if (!json_object_get(o, "candidates") &&
               !json_object_get(o, "promptFeedback") &&
               !json_object_get(o, "error")) {
        rc = fail(d, loom__error_set(LOOM_EPROTO, "answer has no candidates"));
    } else {
        rc = read_response(d, o, body, len);
    }
    if (rc == 0)
        rc = close_answer(d);
    json_decref(o);
    return rc;
}

int loom__gemini_decoder_export(loom__gemini_decoder *d,
                                loom_llm_response *resp)
{
    char *text = loom_buf_detach(&d->text);

    if (!text)
        return loom__error_oom();
    free(resp->text);
    resp->text = text;
    free(resp->reasoning);
    resp->reasoning = NULL;
    if (d->has_reasoning && !(resp->reasoning = loom_buf_detach(&d->reasoning)))
        return loom__error_oom();
    resp->usage = d->usage;
    free(resp->finish_reason);
    resp->finish_reason = d->finish_reason;
    d->finish_reason = NULL;
    free(resp->response_id);
    resp->response_id = d->response_id;
    d->response_id = NULL;
    resp->output_started = d->output_started;
    for (size_t i = 0; i < resp->tool_calls_len; i++)
        loom_tool_call_clear(&resp->tool_calls[i]);
    free(resp->tool_calls);
    resp->tool_calls = NULL;
    resp->tool_calls_len = 0;
    free(resp->provider_state);
    resp->provider_state = NULL;
    if (d->ended && !d->failed) {
        resp->tool_calls = d->out_calls;
        resp->tool_calls_len = d->out_calls ? d->ncalls : 0;
        d->out_calls = NULL;
        resp->provider_state = d->state;
        d->state = NULL;
    }
    return 0;
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

/* Keeps at most max bytes of s, not cutting a UTF-8 sequence. */
static char *cut_text(const char *s, size_t len, size_t max)
{
    if (len > max) {
        len = max;
        while (len > 0 && ((unsigned char)s[len] & 0xC0) == 0x80)
            len--;
    }
    return strndup(s, len);
}

int loom__gemini_error_from_http(loom_upstream_error *err, long status,
                                 const char *body, size_t len,
                                 const char *request_id)
{
    json_t *o = error_json(body, len), *e;
    const char *msg = NULL, *type = NULL;
    int rc = 0;

    clear_error(err);
    err->http_status = (int)status;
    err->kind = status >= 200 && status < 300 ? LOOM_UPSTREAM_NONE
                : status == 401               ? LOOM_UPSTREAM_AUTH
                : status == 403               ? LOOM_UPSTREAM_PERMISSION
                : status == 404               ? LOOM_UPSTREAM_NOT_FOUND
                : status == 408               ? LOOM_UPSTREAM_TIMEOUT
                : status == 409               ? LOOM_UPSTREAM_CONFLICT
                : status == 413               ? LOOM_UPSTREAM_TOO_LARGE
                : status == 422               ? LOOM_UPSTREAM_UNPROCESSABLE
                : status == 429               ? LOOM_UPSTREAM_RATE_LIMIT
                : status >= 500               ? LOOM_UPSTREAM_SERVER
                                              : LOOM_UPSTREAM_BAD_REQUEST;
    e = json_object_get(o, "error");
    if (json_is_object(e)) {
        msg = jstr(e, "message");
        type = jstr(e, "status");
    } else if (json_is_string(e)) {
        msg = json_string_value(e);
    } else if (json_is_object(o)) {
        msg = jstr(o, "message");
    }
    if (msg && *msg)
        err->message = strdup(msg);
    else if (body && len)
        err->message = cut_text(body, len, LOOM_GEMINI_MAX_ERROR_TEXT);
    if (!err->message) {
        char s[32];
        snprintf(s, sizeof(s), "HTTP %ld", status);
        err->message = strdup(s);
    }
    if (type && *type)
        err->type = strdup(type);
    if (request_id)
        err->request_id = strdup(request_id);
    if (!err->message || (type && *type && !err->type) ||
        (request_id && !err->request_id))
        rc = loom__error_oom();
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
        const char *type = jstr(x, "@type"), *delay = jstr(x, "retryDelay");
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
