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
#include "llm/answer.h"
#include "llm/attempt.h"
#include "llm/responses.h"
#include "loom/buf.h"
#include "loom/sse.h"

#include <stddef.h>
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
    loom__llm_answer a; /* first: the part every decoder has */
    loom__responses_limits lim;
    int store;
    /* The reasoning part the last delta belonged to: a delta of another
     * part (summaries come in several) is set off by a blank line. */
    size_t rslot;
    long rpart;

    item_slot *items; /* by output_index */
    size_t items_len;
    call_slot *calls; /* in order of appearance; a.calls at the end */
    size_t ncalls, calls_cap;
    size_t state_bytes; /* sum of the kept reasoning items */
};

/* What the shared part (llm/answer.h) calls back; defined at the end. */
static const loom__llm_answer_kind responses_kind;

/* The defaults of the limits (loom__llm_answer_kind.limits). */
static size_t limits_of(void *p, size_t *max_text)
{
    loom__responses_limits *lim = p;
    size_t big =
        loom__llm_limits(&lim->max_tool_calls, &lim->max_args, &lim->max_text);

    *max_text = lim->max_text;
    if (!lim->max_items)
        lim->max_items = LOOM_RESPONSES_MAX_ITEMS;
    if (!lim->max_state)
        lim->max_state = LOOM_RESPONSES_MAX_STATE;
    /* The terminal event repeats the whole answer (text, reasoning,
     * arguments, encrypted reasoning), escaped: leave room for all of it,
     * but stay bounded. */
    return 4 * big + lim->max_state + 65536;
}

int loom__responses_decoder_new(loom__responses_decoder **out,
                                const loom__responses_limits *limits, int store,
                                loom_llm_event_cb cb, void *payload)
{
    void *d = NULL;
    int rc = loom__llm_answer_new(&d, sizeof(**out), &responses_kind, limits,
                                  cb, payload);

    if ((*out = d) != NULL) {
        (*out)->store = store;
        (*out)->rslot = (size_t)-1;
    }
    return rc;
}

/* ---- small JSON readers ---------------------------------------------- */

/* A count from o[key] (see loom__llm_count). */
static long count_of(const json_t *o, const char *key)
{
    return loom__llm_count(json_object_get(o, key));
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

/* Keeps and passes on a text or reasoning delta, with this decoder's
 * words for its limit. */
static int add_text(loom__responses_decoder *d, loom_llm_event_type type,
                    const char *s, size_t len)
{
    const loom_buf *b = type == LOOM_LLM_TEXT ? &d->a.text : &d->a.reasoning;

    if (len > b->max - b->len)
        return loom__llm_answer_fail(
            &d->a,
            loom__error_set(LOOM_ETOOLARGE, "%s larger than %zu bytes",
                            type == LOOM_LLM_TEXT ? "answer text" : "reasoning",
                            d->lim.max_text));
    return loom__llm_answer_text(&d->a, type, s, len);
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
    if (d->a.reasoning.len && (slot != d->rslot || part != d->rpart) &&
        (rc = add_text(d, LOOM_LLM_REASONING, "\n\n", 2)))
        return rc;
    d->rslot = slot;
    d->rpart = part;
    return add_text(d, LOOM_LLM_REASONING, s, len);
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
        return loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_EPROTO, "negative output_index %lld",
                                   (long long)idx));
    if ((unsigned long long)idx >= d->lim.max_items)
        return loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_ETOOLARGE, "more than %zu output items",
                                   d->lim.max_items));
    n = (size_t)idx;
    if (n >= d->items_len) {
        if (!(p = realloc(d->items, (n + 1) * sizeof(*p))))
            return loom__llm_answer_fail(&d->a, loom__error_oom());
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
    const char *id = loom__llm_jstr(ev, "item_id");
    int rc;

    *found = 0;
    if (json_is_integer(idx)) {
        if ((rc = slot_at(d, json_integer_value(idx), out)) != 0)
            return rc;
        *found = 1;
        if (id && !d->items[*out].id &&
            (rc = set_str(&d->items[*out].id, id)) != 0)
            return loom__llm_answer_fail(&d->a, rc);
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

/* Appends to the arguments of call k, under their limit. */
static int args_put(loom__responses_decoder *d, size_t k, const char *s,
                    size_t len)
{
    int rc = loom_buf_put(&d->calls[k].args, s, len);

    if (rc == LOOM_ETOOLARGE)
        rc = loom__error_set(rc,
                             "arguments of tool call %zu larger than %zu "
                             "bytes",
                             k, d->lim.max_args);
    return rc ? loom__llm_answer_fail(&d->a, rc) : 0;
}

/* Appends args to call k and passes them on. */
static int args_append(loom__responses_decoder *d, size_t k, const char *s,
                       size_t len)
{
    int rc;

    if (!len)
        return 0;
    if ((rc = args_put(d, k, s, len)) != 0)
        return rc;
    return loom__llm_answer_call_delta(&d->a, k, NULL, NULL, s);
}

/* Starts a call for the function_call item in slot; its first fragment
 * carries the id, the name and the arguments the item already has. */
static int call_new(loom__responses_decoder *d, size_t slot, const json_t *item)
{
    const char *args = loom__llm_jstr(item, "arguments");
    call_slot *c;
    size_t k = d->ncalls;
    char gen[32];
    int rc;

    if (k >= d->lim.max_tool_calls)
        return loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_ETOOLARGE, "more than %zu tool calls",
                                   d->lim.max_tool_calls));
    if (k == d->calls_cap) {
        size_t cap = d->calls_cap ? d->calls_cap * 2 : 4;
        call_slot *p = realloc(d->calls, cap * sizeof(*p));
        if (!p)
            return loom__llm_answer_fail(&d->a, loom__error_oom());
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
    if ((rc = set_str(&c->call_id, loom__llm_jstr(item, "call_id")
                                       ? loom__llm_jstr(item, "call_id")
                                   : loom__llm_jstr(item, "id")
                                       ? loom__llm_jstr(item, "id")
                                       : gen)) != 0 ||
        (rc = set_str(&c->name, loom__llm_jstr(item, "name"))) != 0)
        return loom__llm_answer_fail(&d->a, rc);
    if (args && (rc = args_put(d, k, args, strlen(args))) != 0)
        return rc;
    return loom__llm_answer_call_delta(&d->a, k, c->call_id, c->name,
                                       args ? args : "");
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

    if (!args)
        return 0;
    len = strlen(args);
    if (!c->args.len)
        return args_append(d, k, args, len);
    if (c->args.len == len && !memcmp(c->args.ptr, args, len))
        return 0;
    loom_buf_clear(&c->args);
    return args_put(d, k, args, len);
}

/* Keeps what the next request needs of a reasoning item. */
static int keep_reasoning(loom__responses_decoder *d, size_t slot,
                          const json_t *item)
{
    item_slot *s = &d->items[slot];
    const json_t *summary = json_object_get(item, "summary");
    const char *enc = loom__llm_jstr(item, "encrypted_content");
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
        return loom__llm_answer_fail(&d->a, loom__error_oom());
    }
    bytes = json_dumpb(k, NULL, 0, JSON_COMPACT);
    if (d->state_bytes - s->keep_bytes + bytes > d->lim.max_state) {
        json_decref(k);
        return loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_ETOOLARGE,
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
        t = loom__llm_jstr(p, "text");
        if (!t)
            t = loom__llm_jstr(p, "refusal");
        if (t && (rc = add_text(d, LOOM_LLM_TEXT, t, strlen(t))) != 0)
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
        if ((t = loom__llm_jstr(p, "text")) &&
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
    item_kind kind = kind_of(loom__llm_jstr(item, "type"));
    int rc;

    if ((rc = set_str(&s->id, loom__llm_jstr(item, "id"))) != 0)
        return loom__llm_answer_fail(&d->a, rc);
    if (kind == IT_NONE || kind == s->kind)
        return 0;
    if (s->kind != IT_NONE)
        return loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_EPROTO,
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
            (rc = set_str(&d->calls[k].name, loom__llm_jstr(item, "name"))) !=
                0)
            return loom__llm_answer_fail(&d->a, rc);
        if ((rc = args_final(d, k, loom__llm_jstr(item, "arguments"))) != 0)
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
    d->a.usage.prompt_tokens = count_of(u, "input_tokens");
    d->a.usage.completion_tokens = count_of(u, "output_tokens");
    d->a.usage.total_tokens =
        json_object_get(u, "total_tokens")
            ? count_of(u, "total_tokens")
            : d->a.usage.prompt_tokens + d->a.usage.completion_tokens;
    d->a.usage.cached_tokens =
        count_of(json_object_get(u, "input_tokens_details"), "cached_tokens");
    d->a.usage.reasoning_tokens = count_of(
        json_object_get(u, "output_tokens_details"), "reasoning_tokens");
    d->a.has_usage = 1;
    return 0;
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
    if (!bad && !d->a.response_id && !json_array_size(out)) {
        json_decref(st);
        json_decref(out);
        return NULL;
    }
    if (!bad && d->a.response_id)
        bad = json_object_set_new(st, "id", json_string(d->a.response_id));
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

/* Builds the state and the complete calls; emits USAGE, TOOL_CALLS and
 * FINISH. */
static int close_answer(loom__responses_decoder *d)
{
    json_t *st;
    char gen[32];
    int rc = 0;

    d->a.ended = 1;
    /* The state first: it lists the calls by their ids, which then move. */
    if ((st = state_json(d, &rc)) != NULL) {
        d->a.state = json_dumps(st, JSON_COMPACT);
        json_decref(st);
        if (!d->a.state)
            rc = loom__error_oom();
    }
    if (rc)
        return loom__llm_answer_fail(&d->a, rc);
    if (loom__llm_answer_calls(&d->a, d->ncalls))
        return LOOM_ENOMEM;
    for (size_t k = 0; k < d->ncalls; k++) {
        call_slot *c = &d->calls[k];

        /* An incomplete answer may end inside a call: leave it out. */
        if (!c->done)
            continue;
        if (!c->name || !*c->name)
            return loom__llm_answer_fail(
                &d->a,
                loom__error_set(LOOM_EPROTO, "tool call %zu has no name", k));
        snprintf(gen, sizeof(gen), "call_%zu", k);
        if (loom__llm_answer_take_call(&d->a, &d->a.calls[d->a.calls_len++],
                                       &c->call_id, &c->name, &c->args, gen))
            return LOOM_ENOMEM;
    }
    return loom__llm_answer_close(&d->a);
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
    code = loom__llm_jstr(e, "code");
    type = loom__llm_jstr(e, "type");
    msg = loom__llm_jstr(e, "message");
    if (!code && type && !strcmp(type, "error"))
        type = NULL; /* the event's own type, not the error's */
    return loom__llm_answer_error(&d->a, loom__responses_code_kind(code), 0,
                                  msg && *msg ? msg : fallback,
                                  code ? code : type, NULL, 0, 0);
}

/* The item in output slot i of a final response: by its id when a slot
 * has it, else by its position. */
static int final_slot(loom__responses_decoder *d, size_t i, const json_t *item,
                      size_t *out)
{
    const char *id = loom__llm_jstr(item, "id");

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
    const char *status = loom__llm_jstr(r, "status");
    const char *why;
    size_t i, slot;
    int rc;

    if (!json_is_object(r))
        return loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_EPROTO, "%s without a response object",
                                   event ? event : "answer"));
    if ((rc = set_str(&d->a.response_id, loom__llm_jstr(r, "id"))) != 0)
        return loom__llm_answer_fail(&d->a, rc);
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
        return loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_EPROTO, "answer ended with status '%s'",
                                   status));
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
        why =
            loom__llm_jstr(json_object_get(r, "incomplete_details"), "reason");
        why =
            why && !strcmp(why, "content_filter") ? "content_filter" : "length";
    }
    if ((rc = set_str(&d->a.finish_reason, why)) != 0)
        return loom__llm_answer_fail(&d->a, rc);
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
    const char *type = loom__llm_jstr(o, "type");
    const char *delta = loom__llm_jstr(o, "delta");
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
        return delta ? add_text(d, LOOM_LLM_TEXT, delta, strlen(delta)) : 0;
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
            return loom__llm_answer_fail(
                &d->a, loom__error_set(LOOM_EPROTO,
                                       "%s for an unknown tool call", type));
        if (!strcmp(type, "response.function_call_arguments.delta"))
            return delta ? args_append(d, d->items[slot].call, delta,
                                       strlen(delta))
                         : 0;
        if (!d->calls[d->items[slot].call].name &&
            (rc = set_str(&d->calls[d->items[slot].call].name,
                          loom__llm_jstr(o, "name"))) != 0)
            return loom__llm_answer_fail(&d->a, rc);
        return args_final(d, d->items[slot].call,
                          loom__llm_jstr(o, "arguments"));
    }
    if (!strcmp(type, "response.output_item.added") ||
        !strcmp(type, "response.output_item.done")) {
        const json_t *item = json_object_get(o, "item");
        if (!json_is_object(item))
            return loom__llm_answer_fail(
                &d->a,
                loom__error_set(LOOM_EPROTO, "%s without an item", type));
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
        rc = set_str(&d->a.response_id,
                     loom__llm_jstr(json_object_get(o, "response"), "id"));
        return rc ? loom__llm_answer_fail(&d->a, rc) : 0;
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
    json_t *o;
    int rc;

    if (d->a.ended || d->a.failed)
        return d->a.failed;
    if (ev->data_len == 6 && !memcmp(ev->data, "[DONE]", 6))
        return 0;
    o = json_loadb(ev->data, ev->data_len, 0, NULL);
    if (!json_is_object(o)) {
        json_decref(o);
        return loom__llm_answer_bad_json(&d->a, "event", ev->data,
                                         ev->data_len);
    }
    rc = on_event(d, o, ev->event);
    json_decref(o);
    return rc;
}

/* A whole JSON body (loom__llm_answer_kind.complete). */
static int complete(void *owner, const json_t *o, const char *body, size_t len)
{
    loom__responses_decoder *d = owner;

    (void)body;
    (void)len;
    if (json_is_object(json_object_get(o, "error")) &&
        !json_object_get(o, "status"))
        return upstream_error(d, o, "error answer without a message");
    return terminal(d, o, NULL);
}

/* Frees what is this decoder's own (loom__llm_answer_free() does the
 * rest). */
static void release(void *owner)
{
    loom__responses_decoder *d = owner;

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
}

/* Only the terminal event ends an answer: a stream without it is cut. */
static const loom__llm_answer_kind responses_kind = {
    .on_sse = on_sse,
    .complete = complete,
    .release = release,
    .cut_what = "response",
    .reasoning_name = "reasoning",
    .sse_limit_msg = "stream event larger than the limit",
    .lim_offset = offsetof(loom__responses_decoder, lim),
    .lim_size = sizeof(loom__responses_limits),
    .limits = limits_of,
};

LOOM__LLM_DECODER_API(loom__responses_decoder)
