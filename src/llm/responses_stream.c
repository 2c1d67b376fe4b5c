/*
 * The OpenAI Responses answer decoder: no I/O, bytes in, events out
 * (nghttp2's model), so that tests and fuzzers feed it directly and the
 * adapter (llm/responses.c) only moves bytes.
 *
 * A streamed answer is Server-Sent Events whose data are JSON events keyed
 * on their "type" field. The API adds an `event:` line with the same name
 * and some recordings lack it, so the line is not relied on. An answer is
 * a list of output items (reasoning, message, function_call), each opened
 * by response.output_item.added, filled by deltas that name it by
 * output_index (or item_id), and closed by response.output_item.done;
 * the terminal event (response.completed, .incomplete or .failed) repeats
 * the whole response. Servers and recordings leave out some events (a
 * reasoning item's .done, say), so each item is tracked in a slot by its
 * output_index and the terminal response is reconciled against the slots:
 * an item whose deltas never came has its text emitted from its final
 * form, one whose deltas came is not emitted twice. Function-call
 * arguments are passed on as they stream and handed over whole, once,
 * with the usage and the finish reason, when the answer ends.
 *
 * Reasoning items are kept (id, summary, encrypted_content) for the
 * assistant message's provider_state, so that the next request can send
 * them back (see llm/responses.h). A non-streamed response object goes
 * through the same reconciliation, so both paths emit the same events.
 * Every buffer has a limit: text, reasoning, arguments per call, number of
 * calls and of output items, kept reasoning state, SSE line and event.
 * Event JSON is parsed with jansson: unlike Chat Completions, where the
 * decoder's cost per chunk mattered (llm/openai_stream.c), a Responses
 * answer is not on loom's measured hot path.
 */
#include "core/error.h"
#include "llm/openai.h"
#include "llm/responses.h"
#include "loom/buf.h"
#include "loom/sse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
    IT_NONE = 0, /* a slot no event has described yet */
    IT_MESSAGE,
    IT_REASONING,
    IT_CALL,
    IT_OTHER /* a hosted tool call, say: not loom's business */
} item_kind;

/* One output item, at its output_index. */
typedef struct {
    item_kind kind;
    char *id;       /* the item's id, NULL when none was given */
    int done;       /* its final form was seen */
    int got_output; /* its text or reasoning was emitted */
    int has_call;   /* IT_CALL: its call was started */
    size_t call;    /* IT_CALL: position in calls */
    json_t *keep;   /* IT_REASONING: what provider_state keeps of it */
    size_t keep_bytes;
} item_slot;

typedef struct {
    char *call_id;
    char *name;
    loom_buf args;
    int done;
} call_slot;

struct loom__responses_decoder {
    loom__responses_limits lim;
    int store;
    loom_llm_event_cb cb;
    void *payload;
    loom_sse_parser *sse;

    loom_buf text;
    loom_buf reasoning;
    int has_reasoning;
    /* The reasoning part the last delta belonged to: a delta of another
     * part (summaries come in several) is set off by a blank line. */
    size_t rslot;
    long rpart;

    item_slot *items; /* by output_index */
    size_t items_len;
    call_slot *calls; /* in order of appearance */
    size_t ncalls, calls_cap;
    size_t state_bytes; /* sum of the kept reasoning items */

    loom_tool_call *out; /* the complete calls, built at the end */
    size_t out_len;
    loom_usage usage;
    int has_usage;
    char *finish_reason;
    char *response_id;

    int output_started;
    int ended;  /* closing events emitted */
    int failed; /* the error that stopped the decoder, 0 while fine */
    loom_upstream_error error;
};

/* Token counts beyond this are nonsense from a broken server; clamping
 * keeps sums of them (usage totals over a run) from overflowing. */
#define MAX_TOKEN_COUNT 1000000000000L

static int fail(loom__responses_decoder *d, int rc)
{
    d->failed = rc;
    return rc;
}

static int emit(loom__responses_decoder *d, const loom_llm_event *ev)
{
    if (d->cb && d->cb(ev, d->payload) != 0)
        return fail(d, loom__error_set(LOOM_ECANCELED,
                                       "canceled by the event callback"));
    return 0;
}

static int on_sse(const loom_sse_event *ev, void *payload);

int loom__responses_decoder_new(loom__responses_decoder **out,
                                const loom__responses_limits *limits, int store,
                                loom_llm_event_cb cb, void *payload)
{
    loom_sse_options opts = LOOM_SSE_OPTIONS_INIT;
    loom__responses_decoder *d;
    size_t big;
    int rc;

    *out = NULL;
    if (!(d = calloc(1, sizeof(*d))))
        return loom__error_oom();
    if (limits)
        d->lim = *limits;
    if (!d->lim.max_tool_calls)
        d->lim.max_tool_calls = LOOM_RESPONSES_MAX_TOOL_CALLS;
    if (!d->lim.max_args)
        d->lim.max_args = LOOM_RESPONSES_MAX_ARGS;
    if (!d->lim.max_text)
        d->lim.max_text = LOOM_RESPONSES_MAX_TEXT;
    if (!d->lim.max_items)
        d->lim.max_items = LOOM_RESPONSES_MAX_ITEMS;
    if (!d->lim.max_state)
        d->lim.max_state = LOOM_RESPONSES_MAX_STATE;
    d->store = store;
    d->cb = cb;
    d->payload = payload;
    d->rslot = (size_t)-1;
    loom_buf_init(&d->text, d->lim.max_text);
    loom_buf_init(&d->reasoning, d->lim.max_text);
    /* The terminal event repeats the whole answer (text, reasoning,
     * arguments, encrypted reasoning), escaped: leave room for all of it,
     * but stay bounded. */
    big = d->lim.max_text > d->lim.max_args ? d->lim.max_text : d->lim.max_args;
    opts.max_line = opts.max_event = 4 * big + d->lim.max_state + 65536;
    if ((rc = loom_sse_parser_new(&d->sse, &opts, on_sse, d)) != 0) {
        free(d);
        return rc;
    }
    *out = d;
    return 0;
}

void loom__responses_decoder_free(loom__responses_decoder *d)
{
    if (!d)
        return;
    loom_sse_parser_free(d->sse);
    loom_buf_free(&d->text);
    loom_buf_free(&d->reasoning);
    for (size_t i = 0; i < d->items_len; i++) {
        free(d->items[i].id);
        json_decref(d->items[i].keep);
    }
    free(d->items);
    for (size_t i = 0; i < d->ncalls; i++) {
        free(d->calls[i].call_id);
        free(d->calls[i].name);
        loom_buf_free(&d->calls[i].args);
    }
    free(d->calls);
    for (size_t i = 0; i < d->out_len; i++)
        loom_tool_call_clear(&d->out[i]);
    free(d->out);
    free(d->finish_reason);
    free(d->response_id);
    loom__upstream_error_clear(&d->error);
    free(d);
}

/* ---- small JSON readers ---------------------------------------------- */

static const char *str_of(const json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

/* A non-negative count from o[key], clamped; 0 when absent or not one. */
static long count_of(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    json_int_t i;
    double r;

    if (json_is_integer(v)) {
        i = json_integer_value(v);
        return i < 0 ? 0 : i > MAX_TOKEN_COUNT ? MAX_TOKEN_COUNT : (long)i;
    }
    if (json_is_real(v)) {
        r = json_real_value(v);
        /* NaN fails both comparisons and lands on 0. */
        return r >= 1.0
                   ? r < (double)MAX_TOKEN_COUNT ? (long)r : MAX_TOKEN_COUNT
                   : 0;
    }
    return 0;
}

static int set_str(char **dst, const char *src)
{
    char *s;

    if (!src)
        return 0;
    if (!(s = strdup(src)))
        return loom__error_oom();
    free(*dst);
    *dst = s;
    return 0;
}

/* ---- emitting -------------------------------------------------------- */

static int emit_text(loom__responses_decoder *d, const char *s, size_t len)
{
    loom_llm_event ev = {0};
    int rc;

    if (!len)
        return 0;
    if ((rc = loom_buf_put(&d->text, s, len)) != 0)
        return fail(d, rc == LOOM_ETOOLARGE
                           ? loom__error_set(rc,
                                             "answer text larger than %zu "
                                             "bytes",
                                             d->lim.max_text)
                           : rc);
    d->output_started = 1;
    ev.type = LOOM_LLM_TEXT;
    ev.text = s;
    ev.text_len = len;
    return emit(d, &ev);
}

static int put_reasoning(loom__responses_decoder *d, const char *s, size_t len)
{
    loom_llm_event ev = {0};
    int rc;

    if ((rc = loom_buf_put(&d->reasoning, s, len)) != 0)
        return fail(d, rc == LOOM_ETOOLARGE
                           ? loom__error_set(rc,
                                             "reasoning larger than %zu "
                                             "bytes",
                                             d->lim.max_text)
                           : rc);
    d->has_reasoning = 1;
    d->output_started = 1;
    ev.type = LOOM_LLM_REASONING;
    ev.text = s;
    ev.text_len = len;
    return emit(d, &ev);
}

/*
 * Emits a reasoning delta of part `part` of the item in slot. A delta of
 * another part than the last one (several summaries, or another item)
 * comes after a blank line, so that the parts do not run together.
 */
static int emit_reasoning(loom__responses_decoder *d, size_t slot, long part,
                          const char *s, size_t len)
{
    int rc;

    if (!len)
        return 0;
    if (d->reasoning.len && (slot != d->rslot || part != d->rpart) &&
        (rc = put_reasoning(d, "\n\n", 2)) != 0)
        return rc;
    d->rslot = slot;
    d->rpart = part;
    return put_reasoning(d, s, len);
}

/* ---- output items ---------------------------------------------------- */

static item_kind kind_of(const char *type)
{
    if (!type)
        return IT_NONE;
    if (!strcmp(type, "message"))
        return IT_MESSAGE;
    if (!strcmp(type, "reasoning"))
        return IT_REASONING;
    if (!strcmp(type, "function_call"))
        return IT_CALL;
    return IT_OTHER;
}

/* The slot at output_index idx, made when new. */
static int slot_at(loom__responses_decoder *d, json_int_t idx, size_t *out)
{
    item_slot *p;
    size_t n;

    if (idx < 0)
        return fail(d,
                    loom__error_set(LOOM_EPROTO, "negative output_index %lld",
                                    (long long)idx));
    if ((unsigned long long)idx >= d->lim.max_items)
        return fail(d, loom__error_set(LOOM_ETOOLARGE,
                                       "more than %zu output items",
                                       d->lim.max_items));
    n = (size_t)idx;
    if (n >= d->items_len) {
        if (!(p = realloc(d->items, (n + 1) * sizeof(*p))))
            return fail(d, loom__error_oom());
        memset(p + d->items_len, 0, (n + 1 - d->items_len) * sizeof(*p));
        d->items = p;
        d->items_len = n + 1;
    }
    *out = n;
    return 0;
}

/*
 * The slot an event is about: by its output_index, else by its item_id.
 * *found is 0 when the event names neither (or an id no slot has).
 */
static int slot_of(loom__responses_decoder *d, const json_t *ev, size_t *out,
                   int *found)
{
    const json_t *idx = json_object_get(ev, "output_index");
    const char *id = str_of(ev, "item_id");
    int rc;

    *found = 0;
    if (json_is_integer(idx)) {
        if ((rc = slot_at(d, json_integer_value(idx), out)) != 0)
            return rc;
        *found = 1;
        if (id && !d->items[*out].id &&
            (rc = set_str(&d->items[*out].id, id)) != 0)
            return fail(d, rc);
        return 0;
    }
    for (size_t i = 0; id && i < d->items_len; i++) {
        if (d->items[i].id && !strcmp(d->items[i].id, id)) {
            *out = i;
            *found = 1;
            break;
        }
    }
    return 0;
}

/* Appends args to call k and passes them on. */
static int args_append(loom__responses_decoder *d, size_t k, const char *s,
                       size_t len)
{
    call_slot *c = &d->calls[k];
    loom_llm_event ev = {0};
    int rc;

    if (!len)
        return 0;
    if ((rc = loom_buf_put(&c->args, s, len)) != 0)
        return fail(d, rc == LOOM_ETOOLARGE
                           ? loom__error_set(rc,
                                             "arguments of tool call %zu "
                                             "larger than %zu bytes",
                                             k, d->lim.max_args)
                           : rc);
    d->output_started = 1;
    ev.type = LOOM_LLM_TOOL_CALL_DELTA;
    ev.tool_index = (int)k;
    ev.args_delta = s;
    return emit(d, &ev);
}

/* Starts a call for the function_call item in slot; its first fragment
 * carries the id, the name and the arguments the item already has. */
static int call_new(loom__responses_decoder *d, size_t slot, const json_t *item)
{
    const char *args = str_of(item, "arguments");
    loom_llm_event ev = {0};
    call_slot *c;
    size_t k = d->ncalls;
    char gen[32];
    int rc;

    if (k >= d->lim.max_tool_calls)
        return fail(d,
                    loom__error_set(LOOM_ETOOLARGE, "more than %zu tool calls",
                                    d->lim.max_tool_calls));
    if (k == d->calls_cap) {
        size_t cap = d->calls_cap ? d->calls_cap * 2 : 4;
        call_slot *p = realloc(d->calls, cap * sizeof(*p));
        if (!p)
            return fail(d, loom__error_oom());
        d->calls = p;
        d->calls_cap = cap;
    }
    c = &d->calls[k];
    memset(c, 0, sizeof(*c));
    loom_buf_init(&c->args, d->lim.max_args);
    d->ncalls++;
    d->items[slot].kind = IT_CALL;
    d->items[slot].has_call = 1;
    d->items[slot].call = k;
    /* A call needs an id for its result to refer to. */
    snprintf(gen, sizeof(gen), "call_%zu", k);
    if ((rc = set_str(&c->call_id, str_of(item, "call_id")
                                       ? str_of(item, "call_id")
                                   : str_of(item, "id") ? str_of(item, "id")
                                                        : gen)) != 0 ||
        (rc = set_str(&c->name, str_of(item, "name"))) != 0)
        return fail(d, rc);
    if (args && (rc = loom_buf_puts(&c->args, args)) != 0)
        return fail(d, rc == LOOM_ETOOLARGE
                           ? loom__error_set(rc,
                                             "arguments of tool call %zu "
                                             "larger than %zu bytes",
                                             k, d->lim.max_args)
                           : rc);
    d->output_started = 1;
    ev.type = LOOM_LLM_TOOL_CALL_DELTA;
    ev.tool_index = (int)k;
    ev.tool_id = c->call_id;
    ev.tool_name = c->name;
    ev.args_delta = args ? args : "";
    return emit(d, &ev);
}

/*
 * The final arguments of call k: taken as they are when none streamed,
 * else they replace what streamed when they differ (the final form is the
 * API's word; the fragments already passed on cannot be taken back).
 */
static int args_final(loom__responses_decoder *d, size_t k, const char *args)
{
    call_slot *c = &d->calls[k];
    size_t len;
    int rc;

    if (!args)
        return 0;
    len = strlen(args);
    if (!c->args.len)
        return args_append(d, k, args, len);
    if (c->args.len == len && !memcmp(c->args.ptr, args, len))
        return 0;
    loom_buf_clear(&c->args);
    if ((rc = loom_buf_put(&c->args, args, len)) != 0)
        return fail(d, rc == LOOM_ETOOLARGE
                           ? loom__error_set(rc,
                                             "arguments of tool call %zu "
                                             "larger than %zu bytes",
                                             k, d->lim.max_args)
                           : rc);
    return 0;
}

/* Keeps what the next request needs of a reasoning item. */
static int keep_reasoning(loom__responses_decoder *d, size_t slot,
                          const json_t *item)
{
    item_slot *s = &d->items[slot];
    const json_t *summary = json_object_get(item, "summary");
    const char *enc = str_of(item, "encrypted_content");
    json_t *k = json_object();
    size_t bytes;

    if (!k || json_object_set_new(k, "type", json_string("reasoning")) ||
        (s->id && json_object_set_new(k, "id", json_string(s->id))) ||
        json_object_set_new(k, "summary",
                            json_is_array(summary) ? json_deep_copy(summary)
                                                   : json_array()) ||
        (enc &&
         json_object_set_new(k, "encrypted_content", json_string(enc)))) {
        json_decref(k);
        return fail(d, loom__error_oom());
    }
    bytes = json_dumpb(k, NULL, 0, JSON_COMPACT);
    if (d->state_bytes - s->keep_bytes + bytes > d->lim.max_state) {
        json_decref(k);
        return fail(d, loom__error_set(LOOM_ETOOLARGE,
                                       "reasoning items larger than %zu "
                                       "bytes",
                                       d->lim.max_state));
    }
    d->state_bytes = d->state_bytes - s->keep_bytes + bytes;
    json_decref(s->keep);
    s->keep = k;
    s->keep_bytes = bytes;
    return 0;
}

/* Emits the text parts of a message item (output_text, refusal). */
static int message_text(loom__responses_decoder *d, const json_t *item)
{
    const json_t *parts = json_object_get(item, "content"), *p;
    const char *t;
    size_t i;
    int rc;

    json_array_foreach(parts, i, p)
    {
        t = str_of(p, "text");
        if (!t)
            t = str_of(p, "refusal");
        if (t && (rc = emit_text(d, t, strlen(t))) != 0)
            return rc;
    }
    return 0;
}

/* Emits the reasoning of a reasoning item: its summaries, else its
 * reasoning text. */
static int reasoning_text(loom__responses_decoder *d, size_t slot,
                          const json_t *item)
{
    const json_t *parts = json_object_get(item, "summary"), *p;
    long base = 0;
    const char *t;
    size_t i;
    int rc;

    if (!json_array_size(parts)) {
        parts = json_object_get(item, "content");
        base = 1L << 20;
    }
    json_array_foreach(parts, i, p)
    {
        if ((t = str_of(p, "text")) &&
            (rc = emit_reasoning(d, slot, base + (long)i, t, strlen(t))) != 0)
            return rc;
    }
    return 0;
}

/*
 * Settles the kind of the item in slot from an event's item type: a slot
 * may be first seen by a delta, but an item never changes its type.
 */
static int set_kind(loom__responses_decoder *d, size_t slot, const json_t *item)
{
    item_slot *s = &d->items[slot];
    item_kind kind = kind_of(str_of(item, "type"));
    int rc;

    if ((rc = set_str(&s->id, str_of(item, "id"))) != 0)
        return fail(d, rc);
    if (kind == IT_NONE || kind == s->kind)
        return 0;
    if (s->kind != IT_NONE)
        return fail(d,
                    loom__error_set(LOOM_EPROTO,
                                    "output item %zu changed its type", slot));
    s->kind = kind;
    return 0;
}

/* response.output_item.added: a function call starts here. */
static int item_added(loom__responses_decoder *d, size_t slot,
                      const json_t *item)
{
    int rc;

    if ((rc = set_kind(d, slot, item)) != 0)
        return rc;
    if (d->items[slot].kind == IT_CALL && !d->items[slot].has_call)
        return call_new(d, slot, item);
    return 0;
}

/* Marks the item in slot (and its call) whole. */
static int item_done_mark(loom__responses_decoder *d, size_t slot)
{
    item_slot *s = &d->items[slot];

    s->got_output = 1;
    s->done = 1;
    if (s->kind == IT_CALL && s->has_call)
        d->calls[s->call].done = 1;
    return 0;
}

/* An item's final form (output_item.done, or the terminal response). */
static int item_done(loom__responses_decoder *d, size_t slot,
                     const json_t *item)
{
    size_t k;
    int rc;

    if (d->items[slot].done)
        return 0;
    if ((rc = set_kind(d, slot, item)) != 0)
        return rc;
    switch (d->items[slot].kind) {
    case IT_MESSAGE:
        if (!d->items[slot].got_output && (rc = message_text(d, item)) != 0)
            return rc;
        break;
    case IT_REASONING:
        if ((rc = keep_reasoning(d, slot, item)) != 0 ||
            (!d->items[slot].got_output &&
             (rc = reasoning_text(d, slot, item)) != 0))
            return rc;
        break;
    case IT_CALL:
        /* Without an output_item.added before, the call starts here. */
        if (!d->items[slot].has_call) {
            if ((rc = call_new(d, slot, item)) != 0)
                return rc;
            break;
        }
        k = d->items[slot].call;
        if (!d->calls[k].name &&
            (rc = set_str(&d->calls[k].name, str_of(item, "name"))) != 0)
            return fail(d, rc);
        if ((rc = args_final(d, k, str_of(item, "arguments"))) != 0)
            return rc;
        break;
    default:
        break;
    }
    return item_done_mark(d, slot);
}

/* ---- the end of an answer -------------------------------------------- */

static int take_usage(loom__responses_decoder *d, const json_t *u)
{
    if (!json_is_object(u))
        return 0;
    d->usage.prompt_tokens = count_of(u, "input_tokens");
    d->usage.completion_tokens = count_of(u, "output_tokens");
    d->usage.total_tokens =
        json_object_get(u, "total_tokens")
            ? count_of(u, "total_tokens")
            : d->usage.prompt_tokens + d->usage.completion_tokens;
    d->usage.cached_tokens =
        count_of(json_object_get(u, "input_tokens_details"), "cached_tokens");
    d->usage.reasoning_tokens = count_of(
        json_object_get(u, "output_tokens_details"), "reasoning_tokens");
    d->has_usage = 1;
    return 0;
}

/* Builds the complete calls and emits USAGE, TOOL_CALLS and FINISH. */
static int close_answer(loom__responses_decoder *d)
{
    loom_llm_event ev = {0};
    size_t n = 0;
    int rc;

    d->ended = 1;
    if (d->ncalls && !(d->out = calloc(d->ncalls, sizeof(*d->out))))
        return fail(d, loom__error_oom());
    for (size_t k = 0; k < d->ncalls; k++) {
        call_slot *c = &d->calls[k];
        loom_tool_call *t;

        /* An incomplete answer may end inside a call: leave it out. */
        if (!c->done)
            continue;
        if (!c->name || !*c->name)
            return fail(d, loom__error_set(LOOM_EPROTO,
                                           "tool call %zu has no name", k));
        t = &d->out[n++];
        d->out_len = n;
        /* The ids stay: provider_state lists the calls by them. */
        t->id = strdup(c->call_id);
        t->name = strdup(c->name);
        /* No arguments at all means none: "{}" is what a tool expects. */
        t->arguments = c->args.len ? loom_buf_detach(&c->args) : strdup("{}");
        if (!t->id || !t->name || !t->arguments)
            return fail(d, loom__error_oom());
    }
    if (d->has_usage) {
        ev.type = LOOM_LLM_USAGE;
        ev.usage = d->usage;
        if ((rc = emit(d, &ev)) != 0)
            return rc;
    }
    if (d->out_len) {
        memset(&ev, 0, sizeof(ev));
        ev.type = LOOM_LLM_TOOL_CALLS;
        ev.calls = d->out;
        ev.calls_len = d->out_len;
        if ((rc = emit(d, &ev)) != 0)
            return rc;
    }
    memset(&ev, 0, sizeof(ev));
    ev.type = LOOM_LLM_FINISH;
    ev.finish_reason = d->finish_reason;
    return emit(d, &ev);
}

loom_upstream_kind loom__responses_code_kind(const char *code)
{
    if (code && !strcmp(code, "rate_limit_exceeded"))
        return LOOM_UPSTREAM_RATE_LIMIT;
    return LOOM_UPSTREAM_STREAM;
}

/*
 * An error the answer carries: an `error` event ({"code", "message"} at
 * the top, or inside "error"), a failed response's "error", or an
 * {"error": ...} body.
 */
static int upstream_error(loom__responses_decoder *d, const json_t *e,
                          const char *fallback)
{
    const json_t *inner = json_object_get(e, "error");
    const char *code, *msg, *type;

    if (json_is_object(inner))
        e = inner;
    code = str_of(e, "code");
    type = str_of(e, "type");
    msg = str_of(e, "message");
    loom__upstream_error_clear(&d->error);
    d->error.kind = loom__responses_code_kind(code);
    d->error.message = strdup(msg && *msg ? msg : fallback);
    if (code || (type && strcmp(type, "error")))
        d->error.type = strdup(code ? code : type);
    if (!d->error.message ||
        ((code || (type && strcmp(type, "error"))) && !d->error.type))
        return fail(d, loom__error_oom());
    return fail(d, loom__error_set(LOOM_EUPSTREAM, "%s", d->error.message));
}

/* The item in output slot i of a final response: by its id when a slot
 * has it, else by its position. */
static int final_slot(loom__responses_decoder *d, size_t i, const json_t *item,
                      size_t *out)
{
    const char *id = str_of(item, "id");

    for (size_t k = 0; id && k < d->items_len; k++) {
        if (d->items[k].id && !strcmp(d->items[k].id, id)) {
            *out = k;
            return 0;
        }
    }
    return slot_at(d, (json_int_t)i, out);
}

/*
 * A response object that ended the answer (a terminal event's, or a whole
 * body): reconciles its output with what streamed, then ends the answer
 * as its status says.
 */
static int terminal(loom__responses_decoder *d, const json_t *r,
                    const char *event)
{
    const json_t *output = json_object_get(r, "output"), *item;
    const char *status = str_of(r, "status");
    const char *why;
    size_t i, slot;
    int rc;

    if (!json_is_object(r))
        return fail(d,
                    loom__error_set(LOOM_EPROTO, "%s without a response object",
                                    event ? event : "answer"));
    if ((rc = set_str(&d->response_id, str_of(r, "id"))) != 0)
        return fail(d, rc);
    take_usage(d, json_object_get(r, "usage"));
    if (!status && event)
        status = !strcmp(event, "response.failed")       ? "failed"
                 : !strcmp(event, "response.incomplete") ? "incomplete"
                                                         : "completed";
    if (!status)
        status = "completed";
    if (!strcmp(status, "failed"))
        return upstream_error(d, json_object_get(r, "error"),
                              "the response failed");
    if (!strcmp(status, "cancelled"))
        return upstream_error(d, NULL, "the response was cancelled");
    if (strcmp(status, "completed") && strcmp(status, "incomplete"))
        return fail(d,
                    loom__error_set(LOOM_EPROTO,
                                    "answer ended with status '%s'", status));
    json_array_foreach(output, i, item)
    {
        if (!json_is_object(item))
            continue;
        if ((rc = final_slot(d, i, item, &slot)) != 0 ||
            (rc = item_done(d, slot, item)) != 0)
            return rc;
    }
    if (!strcmp(status, "completed")) {
        /* Every call of a completed answer is whole. */
        for (size_t k = 0; k < d->ncalls; k++)
            d->calls[k].done = 1;
        why = d->ncalls ? "tool_calls" : "stop";
    } else {
        why = str_of(json_object_get(r, "incomplete_details"), "reason");
        why =
            why && !strcmp(why, "content_filter") ? "content_filter" : "length";
    }
    if ((rc = set_str(&d->finish_reason, why)) != 0)
        return fail(d, rc);
    return close_answer(d);
}

/* ---- events ---------------------------------------------------------- */

/* A delta event for a slot: output_index / item_id, made when new. */
static int delta_slot(loom__responses_decoder *d, const json_t *ev,
                      item_kind kind, size_t *slot, int *found)
{
    int rc;

    if ((rc = slot_of(d, ev, slot, found)) != 0)
        return rc;
    if (*found) {
        if (d->items[*slot].kind == IT_NONE)
            d->items[*slot].kind = kind;
        d->items[*slot].got_output = 1;
    }
    return 0;
}

static int on_event(loom__responses_decoder *d, const json_t *o,
                    const char *name)
{
    const char *type = str_of(o, "type");
    const char *delta = str_of(o, "delta");
    size_t slot = 0;
    int found, rc;

    if (!type) {
        /* A bare {"error": ...} (or an `event: error` without a type). */
        if (json_is_object(json_object_get(o, "error")) ||
            (name && !strcmp(name, "error")))
            return upstream_error(d, o, "error event without a message");
        return 0;
    }
    if (!strcmp(type, "response.output_text.delta") ||
        !strcmp(type, "response.refusal.delta")) {
        if ((rc = delta_slot(d, o, IT_MESSAGE, &slot, &found)) != 0)
            return rc;
        return delta ? emit_text(d, delta, strlen(delta)) : 0;
    }
    if (!strcmp(type, "response.reasoning_summary_text.delta") ||
        !strcmp(type, "response.reasoning_text.delta")) {
        int summary = !strcmp(type, "response.reasoning_summary_text.delta");
        const json_t *idx =
            json_object_get(o, summary ? "summary_index" : "content_index");
        long part = json_is_integer(idx) ? (long)json_integer_value(idx) : 0;
        if ((rc = delta_slot(d, o, IT_REASONING, &slot, &found)) != 0)
            return rc;
        if (!summary)
            part += 1L << 20;
        return delta ? emit_reasoning(d, found ? slot : (size_t)-2, part, delta,
                                      strlen(delta))
                     : 0;
    }
    if (!strcmp(type, "response.function_call_arguments.delta") ||
        !strcmp(type, "response.function_call_arguments.done")) {
        if ((rc = slot_of(d, o, &slot, &found)) != 0)
            return rc;
        if (!found || d->items[slot].kind != IT_CALL ||
            !d->items[slot].has_call)
            return fail(d,
                        loom__error_set(LOOM_EPROTO,
                                        "%s for an unknown tool call", type));
        if (!strcmp(type, "response.function_call_arguments.delta"))
            return delta ? args_append(d, d->items[slot].call, delta,
                                       strlen(delta))
                         : 0;
        if (!d->calls[d->items[slot].call].name &&
            (rc = set_str(&d->calls[d->items[slot].call].name,
                          str_of(o, "name"))) != 0)
            return fail(d, rc);
        return args_final(d, d->items[slot].call, str_of(o, "arguments"));
    }
    if (!strcmp(type, "response.output_item.added") ||
        !strcmp(type, "response.output_item.done")) {
        const json_t *item = json_object_get(o, "item");
        if (!json_is_object(item))
            return fail(
                d, loom__error_set(LOOM_EPROTO, "%s without an item", type));
        if ((rc = slot_of(d, o, &slot, &found)) != 0)
            return rc;
        if (!found && (rc = slot_at(d, (json_int_t)d->items_len, &slot)))
            return rc;
        if (!strcmp(type, "response.output_item.done"))
            return item_done(d, slot, item);
        return item_added(d, slot, item);
    }
    if (!strcmp(type, "response.created") ||
        !strcmp(type, "response.in_progress") ||
        !strcmp(type, "response.queued")) {
        rc = set_str(&d->response_id,
                     str_of(json_object_get(o, "response"), "id"));
        return rc ? fail(d, rc) : 0;
    }
    if (!strcmp(type, "response.completed") ||
        !strcmp(type, "response.incomplete") ||
        !strcmp(type, "response.failed"))
        return terminal(d, json_object_get(o, "response"), type);
    if (!strcmp(type, "error"))
        return upstream_error(d, o, "error event without a message");
    /* Content parts, annotations, hosted tools: nothing for loom. */
    return 0;
}

static int on_sse(const loom_sse_event *ev, void *payload)
{
    loom__responses_decoder *d = payload;
    json_error_t je;
    json_t *o;
    int rc;

    if (d->ended || d->failed)
        return d->failed;
    if (ev->data_len == 6 && !memcmp(ev->data, "[DONE]", 6))
        return 0;
    o = json_loadb(ev->data, ev->data_len, 0, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        return fail(
            d, loom__error_set(LOOM_EPROTO, "malformed event (%s): %.*s",
                               o ? "not an object" : je.text,
                               (int)(ev->data_len > 120 ? 120 : ev->data_len),
                               ev->data));
    }
    rc = on_event(d, o, ev->event);
    json_decref(o);
    return rc;
}

int loom__responses_decoder_feed(loom__responses_decoder *d, const char *data,
                                 size_t len)
{
    int rc;

    if (d->failed)
        return d->failed;
    /* After the terminal event (a [DONE] may follow): nothing to read. */
    if (d->ended)
        return 0;
    rc = loom_sse_parser_feed(d->sse, data, len);
    if (rc && !d->failed) {
        if (rc == LOOM_ETOOLARGE)
            rc = loom__error_set(rc, "stream event larger than the limit");
        fail(d, rc);
    }
    return rc;
}

int loom__responses_decoder_finish(loom__responses_decoder *d)
{
    int rc;

    if (d->failed)
        return d->failed;
    if (!d->ended && (rc = loom_sse_parser_finish(d->sse)) != 0)
        return d->failed ? d->failed : fail(d, rc);
    if (d->ended)
        return 0;
    loom__upstream_error_clear(&d->error);
    d->error.kind = LOOM_UPSTREAM_CONNECTION;
    d->error.message = strdup("stream ended before the response was "
                              "complete");
    if (!d->error.message)
        return fail(d, loom__error_oom());
    return fail(d, loom__error_set(LOOM_EUPSTREAM, "%s", d->error.message));
}

int loom__responses_decoder_complete(loom__responses_decoder *d,
                                     const char *body, size_t len)
{
    json_error_t je;
    json_t *o, *e;
    int rc;

    if (d->failed)
        return d->failed;
    o = json_loadb(body, len, 0, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        return fail(d, loom__error_set(LOOM_EPROTO,
                                       "malformed answer (%s): "
                                       "%.*s",
                                       o ? "not an object" : je.text,
                                       (int)(len > 120 ? 120 : len), body));
    }
    e = json_object_get(o, "error");
    if (json_is_object(e) && !json_object_get(o, "status"))
        rc = upstream_error(d, o, "error answer without a message");
    else
        rc = terminal(d, o, NULL);
    json_decref(o);
    return rc;
}

int loom__responses_decoder_output_started(const loom__responses_decoder *d)
{
    return d->output_started;
}

int loom__responses_decoder_done(const loom__responses_decoder *d)
{
    return d->ended;
}

const loom_upstream_error *
loom__responses_decoder_error(const loom__responses_decoder *d)
{
    return &d->error;
}

/* The provider_state object (see llm/responses.h), or NULL with *rc 0
 * when there is nothing to keep. */
static json_t *state_json(const loom__responses_decoder *d, int *rc)
{
    json_t *root = NULL, *st = json_object(), *out = json_array(), *e;
    int bad = !st || !out;

    *rc = 0;
    for (size_t i = 0; !bad && i < d->items_len; i++) {
        const item_slot *s = &d->items[i];
        e = NULL;
        if (s->kind == IT_REASONING && s->keep)
            e = json_incref(s->keep);
        else if (s->kind == IT_MESSAGE && s->id)
            e = json_pack("{s:s,s:s}", "type", "message", "id", s->id);
        else if (s->kind == IT_CALL && s->has_call && d->calls[s->call].done) {
            const char *cid = d->calls[s->call].call_id;
            e = s->id ? json_pack("{s:s,s:s,s:s}", "type", "function_call",
                                  "id", s->id, "call_id", cid)
                      : json_pack("{s:s,s:s}", "type", "function_call",
                                  "call_id", cid);
        } else {
            continue;
        }
        bad = !e || json_array_append_new(out, e);
    }
    if (!bad && !d->response_id && !json_array_size(out)) {
        json_decref(st);
        json_decref(out);
        return NULL;
    }
    if (!bad && d->response_id)
        bad = json_object_set_new(st, "id", json_string(d->response_id));
    bad = bad || json_object_set_new(st, "store", json_boolean(d->store)) ||
          json_object_set(st, "output", out);
    json_decref(out);
    if (!bad && (root = json_object()) &&
        json_object_set_new(root, LOOM_RESPONSES_KIND, st) == 0)
        return root;
    json_decref(root);
    if (!root)
        json_decref(st);
    *rc = loom__error_oom();
    return NULL;
}

int loom__responses_decoder_export(loom__responses_decoder *d,
                                   loom_llm_response *resp)
{
    char *text = loom_buf_detach(&d->text);
    json_t *st = NULL;
    int rc = 0;

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
    free(resp->provider_state);
    resp->provider_state = NULL;
    if (d->ended && !d->failed && (st = state_json(d, &rc)) != NULL) {
        resp->provider_state = json_dumps(st, JSON_COMPACT);
        json_decref(st);
        if (!resp->provider_state)
            return loom__error_oom();
    } else if (rc) {
        return rc;
    }
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
        resp->tool_calls = d->out;
        resp->tool_calls_len = d->out_len;
        d->out = NULL;
        d->out_len = 0;
    }
    return 0;
}
