/*
 * The OpenAI Chat Completions answer decoder: no I/O, bytes in, events out
 * (nghttp2's model), so that tests and fuzzers feed it directly and the
 * adapter only moves bytes.
 *
 * A streamed body goes through the SSE parser; each `data:` payload is one
 * chat.completion.chunk. Text and reasoning deltas are passed on at once.
 * Tool calls arrive in fragments keyed by `index` (id, type and name only
 * on a call's first fragment, arguments split anywhere, several calls
 * interleaved), so they are assembled in slots by index and handed over
 * whole, once, when the answer ends. Usage is kept and emitted once at the
 * end too, because some servers repeat running totals on every chunk and a
 * consumer summing USAGE events must not count them twice.
 *
 * A non-streamed chat.completion is decoded into the same events so the
 * adapter has one path for both. Every buffer has a limit (text,
 * reasoning, arguments per call, number of calls, SSE line and event).
 */
#include "core/error.h"
#include "llm/openai.h"
#include "loom/buf.h"
#include "loom/sse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *id;
    char *name;
    loom_buf args;
    int present;
} call_slot;

struct loom__openai_decoder {
    loom__openai_limits lim;
    loom_llm_event_cb cb;
    void *payload;
    loom_sse_parser *sse;

    loom_buf text;
    loom_buf reasoning;
    int has_reasoning;
    call_slot *slots; /* by upstream index; gaps have present == 0 */
    size_t slots_len;
    size_t ncalls;
    loom_tool_call *calls; /* the complete calls, built at the end */
    size_t calls_len;
    loom_usage usage;
    int has_usage;
    char *finish_reason;
    char *response_id;

    int output_started;
    int positional; /* a whole message: each call is its own, in order */
    int saw_done;   /* data: [DONE] */
    int ended;      /* closing events emitted */
    int failed;     /* the error that stopped the decoder, 0 while fine */
    loom_upstream_error error;
};

void loom__upstream_error_clear(loom_upstream_error *err)
{
    int attempts = err->attempts;

    free(err->type);
    free(err->message);
    free(err->request_id);
    memset(err, 0, sizeof(*err));
    err->attempts = attempts;
}

static int fail(loom__openai_decoder *d, int rc)
{
    d->failed = rc;
    return rc;
}

static int emit(loom__openai_decoder *d, const loom_llm_event *ev)
{
    if (d->cb && d->cb(ev, d->payload) != 0)
        return fail(d, loom__error_set(LOOM_ECANCELED,
                                       "canceled by the event callback"));
    return 0;
}

static int on_sse(const loom_sse_event *ev, void *payload);

int loom__openai_decoder_new(loom__openai_decoder **out,
                             const loom__openai_limits *limits,
                             loom_llm_event_cb cb, void *payload)
{
    loom_sse_options opts = LOOM_SSE_OPTIONS_INIT;
    loom__openai_decoder *d;
    size_t big;
    int rc;

    *out = NULL;
    d = calloc(1, sizeof(*d));
    if (!d)
        return loom__error_oom();
    if (limits)
        d->lim = *limits;
    if (!d->lim.max_tool_calls)
        d->lim.max_tool_calls = LOOM_OPENAI_MAX_TOOL_CALLS;
    if (!d->lim.max_args)
        d->lim.max_args = LOOM_OPENAI_MAX_ARGS;
    if (!d->lim.max_text)
        d->lim.max_text = LOOM_OPENAI_MAX_TEXT;
    d->cb = cb;
    d->payload = payload;
    loom_buf_init(&d->text, d->lim.max_text);
    loom_buf_init(&d->reasoning, d->lim.max_text);
    /* One chunk may carry a whole answer (some servers do not split), and
     * JSON escaping may double it: leave room, but stay bounded. */
    big = d->lim.max_text > d->lim.max_args ? d->lim.max_text : d->lim.max_args;
    opts.max_line = opts.max_event = 2 * big + 65536;
    if ((rc = loom_sse_parser_new(&d->sse, &opts, on_sse, d)) != 0) {
        free(d);
        return rc;
    }
    *out = d;
    return 0;
}

static void free_calls(loom_tool_call *calls, size_t n)
{
    for (size_t i = 0; i < n; i++)
        loom_tool_call_clear(&calls[i]);
    free(calls);
}

void loom__openai_decoder_free(loom__openai_decoder *d)
{
    if (!d)
        return;
    loom_sse_parser_free(d->sse);
    loom_buf_free(&d->text);
    loom_buf_free(&d->reasoning);
    for (size_t i = 0; i < d->slots_len; i++) {
        free(d->slots[i].id);
        free(d->slots[i].name);
        loom_buf_free(&d->slots[i].args);
    }
    free(d->slots);
    free_calls(d->calls, d->calls_len);
    free(d->finish_reason);
    free(d->response_id);
    loom__upstream_error_clear(&d->error);
    free(d);
}

int loom__openai_decoder_output_started(const loom__openai_decoder *d)
{
    return d->output_started;
}

int loom__openai_decoder_done(const loom__openai_decoder *d)
{
    return d->ended;
}

const loom_upstream_error *
loom__openai_decoder_error(const loom__openai_decoder *d)
{
    return &d->error;
}

static const char *str_of(const json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

/* Token counts beyond this are nonsense from a broken server; clamping
 * keeps sums of them (usage totals over a run) from overflowing. */
#define MAX_TOKEN_COUNT 1000000000000L

/* A non-negative count from o[key], clamped; 0 when absent or not a
 * number. */
static long num_of(const json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    double r;

    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        return i < 0 ? 0 : i > MAX_TOKEN_COUNT ? MAX_TOKEN_COUNT : (long)i;
    }
    if (json_is_real(v)) {
        r = json_real_value(v);
        /* NaN fails both comparisons and lands on 0. */
        return r >= 1.0 ? r < (double)MAX_TOKEN_COUNT ? (long)r
                                                       : MAX_TOKEN_COUNT
                        : 0;
    }
    return 0;
}

static int dup_into(char **dst, const char *src, size_t len)
{
    free(*dst);
    *dst = strndup(src, len);
    return *dst ? 0 : loom__error_oom();
}

/* An error inside the stream (a chunk with "error", or `event: error`). */
static int stream_error(loom__openai_decoder *d, const char *data, size_t len,
                        const json_t *obj)
{
    loom_llm_event ev = {0};
    const json_t *err = json_object_get(obj, "error");
    const char *msg = NULL, *type = NULL;

    loom__upstream_error_clear(&d->error);
    d->error.kind = LOOM_UPSTREAM_STREAM;
    if (json_is_object(err)) {
        msg = str_of(err, "message");
        type = str_of(err, "type");
        if (!type)
            type = str_of(err, "code");
    } else if (json_is_string(err)) {
        msg = json_string_value(err);
    } else if (json_is_object(obj)) {
        msg = str_of(obj, "message");
        type = str_of(obj, "type");
    }
    if (msg)
        d->error.message = strdup(msg);
    else
        d->error.message = strndup(data, len > LOOM_OPENAI_MAX_ERROR_TEXT
                                             ? LOOM_OPENAI_MAX_ERROR_TEXT
                                             : len);
    if (type)
        d->error.type = strdup(type);
    if (!d->error.message || (type && !d->error.type))
        return fail(d, loom__error_oom());
    ev.type = LOOM_LLM_ERROR;
    ev.error_code = LOOM_EUPSTREAM;
    ev.error_message = d->error.message;
    if (d->cb)
        d->cb(&ev, d->payload);
    return fail(d, loom__error_set(LOOM_EUPSTREAM, "stream error: %s",
                                   d->error.message));
}

static int add_text(loom__openai_decoder *d, loom_llm_event_type type,
                    const char *s, size_t len)
{
    loom_buf *b = type == LOOM_LLM_TEXT ? &d->text : &d->reasoning;
    loom_llm_event ev = {0};

    if (!len)
        return 0;
    if (len > b->max - b->len)
        return fail(
            d, loom__error_set(LOOM_ETOOLARGE,
                               "answer %s passed the limit of "
                               "%zu bytes",
                               type == LOOM_LLM_TEXT ? "text" : "reasoning",
                               b->max));
    if (loom_buf_put(b, s, len) != 0)
        return fail(d, loom__error_oom());
    if (type == LOOM_LLM_REASONING)
        d->has_reasoning = 1;
    d->output_started = 1;
    ev.type = type;
    ev.text = s;
    ev.text_len = len;
    return emit(d, &ev);
}

static int add_json_text(loom__openai_decoder *d, loom_llm_event_type type,
                         const json_t *v)
{
    if (!json_is_string(v))
        return 0;
    return add_text(d, type, json_string_value(v), json_string_length(v));
}

/* Finds the slot a fragment belongs to (see the file comment), making it
 * when new. */
static int find_slot(loom__openai_decoder *d, const json_t *tc, const char *id,
                     size_t *out)
{
    json_t *jidx = json_object_get(tc, "index");
    size_t i;

    if (jidx && !json_is_null(jidx)) {
        json_int_t v = json_integer_value(jidx);
        if (!json_is_integer(jidx) || v < 0)
            return fail(
                d, loom__error_set(LOOM_EPROTO, "tool call with a bad index"));
        if ((uint64_t)v >= d->lim.max_tool_calls)
            goto too_many;
        i = (size_t)v;
        /* Some servers send every call at index 0; a different id in a
         * used slot is a new call. */
        if (i < d->slots_len && d->slots[i].present && id && d->slots[i].id &&
            strcmp(id, d->slots[i].id) != 0)
            i = d->slots_len;
    } else if (d->positional || !d->slots_len ||
               (id && (!d->slots[d->slots_len - 1].id ||
                       strcmp(id, d->slots[d->slots_len - 1].id) != 0))) {
        i = d->slots_len;
    } else {
        i = d->slots_len - 1;
    }
    if (i >= d->slots_len || !d->slots[i].present) {
        if (i >= d->lim.max_tool_calls || d->ncalls >= d->lim.max_tool_calls)
            goto too_many;
    }
    if (i >= d->slots_len) {
        call_slot *s = realloc(d->slots, (i + 1) * sizeof(*s));
        if (!s)
            return fail(d, loom__error_oom());
        memset(s + d->slots_len, 0, (i + 1 - d->slots_len) * sizeof(*s));
        for (size_t k = d->slots_len; k <= i; k++)
            loom_buf_init(&s[k].args, d->lim.max_args);
        d->slots = s;
        d->slots_len = i + 1;
    }
    *out = i;
    return 0;

too_many:
    return fail(d, loom__error_set(LOOM_ETOOLARGE,
                                   "answer has more than %zu tool calls",
                                   d->lim.max_tool_calls));
}

static int tool_fragment(loom__openai_decoder *d, const json_t *tc)
{
    const json_t *fn = json_object_get(tc, "function");
    const json_t *jargs = json_object_get(fn, "arguments");
    const char *id = str_of(tc, "id"), *name = str_of(fn, "name");
    const char *args = "";
    char *dumped = NULL;
    size_t idx = 0, args_len = 0;
    loom_llm_event ev = {0};
    call_slot *s;
    int rc;

    if (!json_is_object(tc))
        return fail(d, loom__error_set(LOOM_EPROTO,
                                       "tool call delta is not an object"));
    if (id && !*id)
        id = NULL;
    if (name && !*name)
        name = NULL;
    if ((rc = find_slot(d, tc, id, &idx)) != 0)
        return rc;
    if (json_is_string(jargs)) {
        args = json_string_value(jargs);
        args_len = json_string_length(jargs);
    } else if (jargs && !json_is_null(jargs)) {
        /* Some servers (Ollama) send the arguments as an object. */
        dumped = json_dumps(jargs, JSON_COMPACT);
        if (!dumped)
            return fail(d, loom__error_oom());
        args = dumped;
        args_len = strlen(dumped);
    }
    s = &d->slots[idx];
    if (!s->present) {
        s->present = 1;
        d->ncalls++;
    }
    if (id && !s->id) {
        if ((rc = dup_into(&s->id, id, strlen(id))) != 0)
            goto out;
        ev.tool_id = s->id;
    }
    if (name && !s->name) {
        if ((rc = dup_into(&s->name, name, strlen(name))) != 0)
            goto out;
        ev.tool_name = s->name;
    }
    if (args_len > s->args.max - s->args.len) {
        rc = loom__error_set(LOOM_ETOOLARGE,
                             "tool call %zu: arguments passed the limit "
                             "of %zu bytes",
                             idx, s->args.max);
        goto out;
    }
    if (loom_buf_put(&s->args, args, args_len) != 0) {
        rc = loom__error_oom();
        goto out;
    }
    d->output_started = 1;
    ev.type = LOOM_LLM_TOOL_CALL_DELTA;
    ev.tool_index = (int)idx;
    ev.args_delta = args;
    rc = emit(d, &ev);
    free(dumped);
    return rc;

out:
    free(dumped);
    return fail(d, rc);
}

static int tool_calls(loom__openai_decoder *d, const json_t *arr)
{
    size_t i;
    json_t *tc;
    int rc;

    if (!arr || json_is_null(arr))
        return 0;
    if (!json_is_array(arr))
        return fail(d,
                    loom__error_set(LOOM_EPROTO, "tool_calls is not an array"));
    json_array_foreach(arr, i, tc)
    {
        if ((rc = tool_fragment(d, tc)) != 0)
            return rc;
    }
    return 0;
}

static void read_usage(loom__openai_decoder *d, const json_t *u)
{
    if (!json_is_object(u))
        return;
    d->usage.prompt_tokens = num_of(u, "prompt_tokens");
    d->usage.completion_tokens = num_of(u, "completion_tokens");
    d->usage.total_tokens = num_of(u, "total_tokens");
    if (!json_object_get(u, "total_tokens"))
        d->usage.total_tokens =
            d->usage.prompt_tokens + d->usage.completion_tokens;
    d->usage.cached_tokens =
        num_of(json_object_get(u, "prompt_tokens_details"), "cached_tokens");
    d->usage.reasoning_tokens = num_of(
        json_object_get(u, "completion_tokens_details"), "reasoning_tokens");
    d->has_usage = 1;
}

static int keep_finish(loom__openai_decoder *d, const json_t *v)
{
    if (!json_is_string(v) || d->finish_reason)
        return 0;
    if (!(d->finish_reason = strdup(json_string_value(v))))
        return fail(d, loom__error_oom());
    return 0;
}

/* Text, refusal, reasoning and tool calls of a delta or a message. */
static int message_parts(loom__openai_decoder *d, const json_t *m)
{
    const json_t *r;
    int rc;

    if (!json_is_object(m))
        return 0;
    if ((rc = add_json_text(d, LOOM_LLM_TEXT, json_object_get(m, "content"))))
        return rc;
    /* A refusal is the model's answer to the user: keep it as text. */
    if ((rc = add_json_text(d, LOOM_LLM_TEXT, json_object_get(m, "refusal"))))
        return rc;
    /* vLLM and DeepSeek say reasoning_content, Ollama and others reasoning;
     * a server sending both means the same text. */
    r = json_object_get(m, "reasoning_content");
    if (!json_is_string(r))
        r = json_object_get(m, "reasoning");
    if ((rc = add_json_text(d, LOOM_LLM_REASONING, r)))
        return rc;
    return tool_calls(d, json_object_get(m, "tool_calls"));
}

/* Common fields of a chunk or a completion: id, usage, choices. */
static int answer_object(loom__openai_decoder *d, const json_t *o,
                         const char *part)
{
    const json_t *choices = json_object_get(o, "choices"), *c;
    const char *id = str_of(o, "id");
    size_t i;
    int rc;

    if (id && !d->response_id && dup_into(&d->response_id, id, strlen(id)))
        return fail(d, LOOM_ENOMEM);
    read_usage(d, json_object_get(o, "usage"));
    if (choices && !json_is_array(choices))
        return fail(d, loom__error_set(LOOM_EPROTO, "choices is not an array"));
    json_array_foreach(choices, i, c)
    {
        json_t *ci = json_object_get(c, "index");
        /* Only the first choice is loom's (n is never sent). */
        if (!json_is_object(c) || (ci && json_integer_value(ci) != 0))
            continue;
        if ((rc = message_parts(d, json_object_get(c, part))) != 0)
            return rc;
        if ((rc = keep_finish(d, json_object_get(c, "finish_reason"))))
            return rc;
    }
    return 0;
}

/* Builds the complete calls and emits USAGE, TOOL_CALLS and FINISH. */
static int close_answer(loom__openai_decoder *d)
{
    loom_llm_event ev = {0};
    size_t n = 0;
    int rc;

    d->ended = 1;
    if (d->ncalls) {
        d->calls = calloc(d->ncalls, sizeof(*d->calls));
        if (!d->calls)
            return fail(d, loom__error_oom());
    }
    for (size_t i = 0; i < d->slots_len; i++) {
        call_slot *s = &d->slots[i];
        loom_tool_call *c;
        char gen[32];

        if (!s->present)
            continue;
        if (!s->name)
            return fail(d, loom__error_set(LOOM_EPROTO,
                                           "tool call %zu has no name", i));
        c = &d->calls[n++];
        d->calls_len = n;
        /* A call without an id (some local servers) still needs one for
         * its result to refer to. */
        snprintf(gen, sizeof(gen), "call_%zu", i);
        c->id = s->id ? s->id : strdup(gen);
        c->name = s->name;
        s->id = s->name = NULL;
        /* No arguments at all means none: "{}" is what a tool expects. */
        c->arguments = s->args.len ? loom_buf_detach(&s->args) : strdup("{}");
        if (!c->id || !c->arguments)
            return fail(d, loom__error_oom());
    }
    if (d->has_usage) {
        ev.type = LOOM_LLM_USAGE;
        ev.usage = d->usage;
        if ((rc = emit(d, &ev)) != 0)
            return rc;
    }
    if (d->calls_len) {
        memset(&ev, 0, sizeof(ev));
        ev.type = LOOM_LLM_TOOL_CALLS;
        ev.calls = d->calls;
        ev.calls_len = d->calls_len;
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

static int bad_json(loom__openai_decoder *d, const char *what,
                    const json_error_t *je, const char *data, size_t len)
{
    return fail(d, loom__error_set(LOOM_EPROTO, "malformed %s (%s): %.*s", what,
                                   je ? je->text : "not an object",
                                   (int)(len > 120 ? 120 : len), data));
}

static int on_sse(const loom_sse_event *ev, void *payload)
{
    loom__openai_decoder *d = payload;
    json_error_t je;
    json_t *o;
    int rc;

    if (d->failed)
        return d->failed;
    if (d->saw_done)
        return 0; /* nothing after [DONE] belongs to the answer */
    if (strcmp(ev->event, "error") == 0) {
        o = json_loadb(ev->data, ev->data_len, 0, NULL);
        rc = stream_error(d, ev->data, ev->data_len, o);
        json_decref(o);
        return rc;
    }
    if (strcmp(ev->event, "message") != 0)
        return 0; /* pings and other events of proxies */
    if (ev->data_len == 6 && memcmp(ev->data, "[DONE]", 6) == 0) {
        d->saw_done = 1;
        return close_answer(d);
    }
    o = json_loadb(ev->data, ev->data_len, 0, &je);
    if (!o)
        return bad_json(d, "chunk", &je, ev->data, ev->data_len);
    if (!json_is_object(o))
        rc = bad_json(d, "chunk", NULL, ev->data, ev->data_len);
    else if (json_object_get(o, "error") &&
             !json_is_null(json_object_get(o, "error")))
        rc = stream_error(d, ev->data, ev->data_len, o);
    else
        rc = answer_object(d, o, "delta");
    json_decref(o);
    return rc;
}

int loom__openai_decoder_feed(loom__openai_decoder *d, const char *data,
                              size_t len)
{
    int rc;

    if (d->failed)
        return d->failed;
    if (d->saw_done)
        return 0;
    rc = loom_sse_parser_feed(d->sse, data, len);
    if (rc && !d->failed)
        d->failed = rc; /* the SSE parser's own limit */
    return rc;
}

int loom__openai_decoder_finish(loom__openai_decoder *d)
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
    if (d->ended)
        return 0;
    /* Servers that omit [DONE] still send a finish reason. */
    if (d->finish_reason)
        return close_answer(d);
    loom__upstream_error_clear(&d->error);
    d->error.kind = LOOM_UPSTREAM_CONNECTION;
    d->error.message = strdup("stream ended before the answer was complete");
    if (!d->error.message)
        return fail(d, loom__error_oom());
    return fail(d, loom__error_set(LOOM_EUPSTREAM, "%s", d->error.message));
}

int loom__openai_decoder_complete(loom__openai_decoder *d, const char *body,
                                  size_t len)
{
    json_error_t je;
    json_t *o, *choices;
    int rc;

    if (d->failed)
        return d->failed;
    o = json_loadb(body, len, 0, &je);
    if (!o)
        return bad_json(d, "answer", &je, body, len);
    choices = json_object_get(o, "choices");
    d->positional = 1;
    if (!json_is_object(o))
        rc = bad_json(d, "answer", NULL, body, len);
    else if (json_object_get(o, "error") &&
             !json_is_null(json_object_get(o, "error")))
        rc = stream_error(d, body, len, o);
    else if (!json_is_array(choices) || json_array_size(choices) == 0)
        rc = fail(d, loom__error_set(LOOM_EPROTO, "answer has no choices"));
    else if ((rc = answer_object(d, o, "message")) == 0)
        rc = close_answer(d);
    json_decref(o);
    return rc;
}

int loom__openai_decoder_export(loom__openai_decoder *d,
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
    if (d->ended && !d->failed) {
        resp->tool_calls = d->calls;
        resp->tool_calls_len = d->calls_len;
        d->calls = NULL;
        d->calls_len = 0;
    }
    return 0;
}
