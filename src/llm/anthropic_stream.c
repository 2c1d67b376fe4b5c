/*
 * The Anthropic Messages answer decoder: no I/O, bytes in, events out
 * (nghttp2's model), so that tests and fuzzers feed it directly and the
 * adapter only moves bytes.
 *
 * A streamed answer is SSE: message_start (id, first usage), then content
 * blocks, each content_block_start / _delta... / _stop under its own
 * index, then message_delta (stop reason, final usage) and message_stop;
 * ping may come anywhere and `event: error` ends the stream with an error.
 * Text and thinking deltas are passed on at once. A tool_use block's input
 * arrives as input_json_delta fragments of its JSON text, assembled per
 * block index and handed over whole, once, at the end, with every other
 * call in block order, as the OpenAI decoder does. Thinking and
 * redacted_thinking blocks, with their signatures, are kept as they came:
 * the API wants them back unchanged on the next request of a tool loop, so
 * the decoder writes them, with the order of every block, into the
 * answer's provider_state. Usage is kept and emitted once at the end.
 *
 * A non-streamed message object is decoded into the same events so the
 * adapter has one path for both. Every buffer has a limit (text, thinking,
 * arguments per call, number of calls and blocks, signatures, SSE line and
 * event). Each event is small and rare next to the model's time, so
 * jansson reads it whole; there is no fast path as in the OpenAI decoder.
 */
#include "core/error.h"
#include "llm/anthropic.h"
#include "llm/openai.h" /* loom__upstream_error_clear, error text cut */
#include "loom/buf.h"
#include "loom/sse.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What a content block is. B_NONE: not started. */
enum { B_NONE = 0, B_TEXT, B_THINKING, B_REDACTED, B_TOOL, B_OTHER };

typedef struct {
    int type;
    size_t call;   /* B_TOOL: the call's position among the calls */
    char *id;      /* B_TOOL */
    char *name;    /* B_TOOL */
    loom_buf data; /* tool: arguments; thinking: its text; redacted: data */
    loom_buf sig;  /* thinking: the signature */
} block;

struct loom__anthropic_decoder {
    loom__anthropic_limits lim;
    loom_llm_event_cb cb;
    void *payload;
    loom_sse_parser *sse;

    loom_buf text;
    loom_buf reasoning;
    int has_reasoning;
    block *blocks; /* by wire index; never-started ones have B_NONE */
    size_t nblocks;
    size_t ncalls;
    size_t state_bytes;    /* signatures and redacted data so far */
    loom_tool_call *calls; /* the complete calls, built at the end */
    size_t calls_len;
    long in_tokens, out_tokens, cache_write, cache_read;
    int has_usage;
    char *stop_reason;
    char *response_id;
    char *state; /* provider_state text, built at the end */

    int output_started;
    int ended;  /* closing events emitted */
    int failed; /* the error that stopped the decoder, 0 while fine */
    loom_upstream_error error;
};

static int fail(loom__anthropic_decoder *d, int rc)
{
    d->failed = rc;
    return rc;
}

static int emit(loom__anthropic_decoder *d, const loom_llm_event *ev)
{
    if (d->cb && d->cb(ev, d->payload) != 0)
        return fail(d, loom__error_set(LOOM_ECANCELED,
                                       "canceled by the event callback"));
    return 0;
}

static int on_sse(const loom_sse_event *ev, void *payload);

int loom__anthropic_decoder_new(loom__anthropic_decoder **out,
                                const loom__anthropic_limits *limits,
                                loom_llm_event_cb cb, void *payload)
{
    loom_sse_options opts = LOOM_SSE_OPTIONS_INIT;
    loom__anthropic_decoder *d;
    size_t big;
    int rc;

    *out = NULL;
    if (!(d = calloc(1, sizeof(*d))))
        return loom__error_oom();
    if (limits)
        d->lim = *limits;
    if (!d->lim.max_tool_calls)
        d->lim.max_tool_calls = LOOM_ANTHROPIC_MAX_TOOL_CALLS;
    if (!d->lim.max_args)
        d->lim.max_args = LOOM_ANTHROPIC_MAX_ARGS;
    if (!d->lim.max_text)
        d->lim.max_text = LOOM_ANTHROPIC_MAX_TEXT;
    if (!d->lim.max_blocks)
        d->lim.max_blocks = LOOM_ANTHROPIC_MAX_BLOCKS;
    if (!d->lim.max_state)
        d->lim.max_state = LOOM_ANTHROPIC_MAX_STATE;
    d->cb = cb;
    d->payload = payload;
    loom_buf_init(&d->text, d->lim.max_text);
    loom_buf_init(&d->reasoning, d->lim.max_text);
    /* One event carries one delta, or (redacted thinking) one block's
     * data; JSON escaping may double it: leave room, but stay bounded. */
    big = d->lim.max_text > d->lim.max_args ? d->lim.max_text : d->lim.max_args;
    if (d->lim.max_state > big)
        big = d->lim.max_state;
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

void loom__anthropic_decoder_free(loom__anthropic_decoder *d)
{
    if (!d)
        return;
    loom_sse_parser_free(d->sse);
    loom_buf_free(&d->text);
    loom_buf_free(&d->reasoning);
    for (size_t i = 0; i < d->nblocks; i++) {
        free(d->blocks[i].id);
        free(d->blocks[i].name);
        loom_buf_free(&d->blocks[i].data);
        loom_buf_free(&d->blocks[i].sig);
    }
    free(d->blocks);
    free_calls(d->calls, d->calls_len);
    free(d->stop_reason);
    free(d->response_id);
    free(d->state);
    loom__upstream_error_clear(&d->error);
    free(d);
}

int loom__anthropic_decoder_output_started(const loom__anthropic_decoder *d)
{
    return d->output_started;
}

int loom__anthropic_decoder_done(const loom__anthropic_decoder *d)
{
    return d->ended;
}

const loom_upstream_error *
loom__anthropic_decoder_error(const loom__anthropic_decoder *d)
{
    return &d->error;
}

const char *loom__anthropic_finish_reason(const char *s)
{
    if (!s)
        return NULL;
    if (strcmp(s, "end_turn") == 0 || strcmp(s, "stop_sequence") == 0)
        return "stop";
    if (strcmp(s, "tool_use") == 0)
        return "tool_calls";
    if (strcmp(s, "max_tokens") == 0 ||
        strcmp(s, "model_context_window_exceeded") == 0)
        return "length";
    if (strcmp(s, "refusal") == 0)
        return "content_filter";
    return s; /* pause_turn and future reasons, as they are */
}

/* ---- pieces of an answer ----------------------------------------------- */

static const char *jstr_of(const json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

/* Token counts beyond this are nonsense from a broken server; clamping
 * keeps sums of them (usage totals over a run) from overflowing. */
#define MAX_TOKEN_COUNT 1000000000000L

/* Sets *out to the non-negative count o[key], clamped, when it is a
 * number; leaves it alone otherwise. */
static void count_of(const json_t *o, const char *key, long *out)
{
    const json_t *v = json_object_get(o, key);
    double r;

    if (json_is_integer(v)) {
        json_int_t i = json_integer_value(v);
        *out = i < 0 ? 0 : i > MAX_TOKEN_COUNT ? MAX_TOKEN_COUNT : (long)i;
    } else if (json_is_real(v)) {
        r = json_real_value(v);
        *out = r >= 1.0
                   ? r < (double)MAX_TOKEN_COUNT ? (long)r : MAX_TOKEN_COUNT
                   : 0;
    }
}

/* message_start carries the first counts, message_delta the final ones
 * (output_tokens always; the others when the server repeats them). */
static void read_usage(loom__anthropic_decoder *d, const json_t *u)
{
    if (!json_is_object(u))
        return;
    count_of(u, "input_tokens", &d->in_tokens);
    count_of(u, "output_tokens", &d->out_tokens);
    count_of(u, "cache_creation_input_tokens", &d->cache_write);
    count_of(u, "cache_read_input_tokens", &d->cache_read);
    d->has_usage = 1;
}

static loom_usage usage_of(const loom__anthropic_decoder *d)
{
    loom_usage u = {0};

    /* Anthropic's input_tokens leave out what the cache wrote and read:
     * loom's prompt tokens are every token of the prompt. */
    u.prompt_tokens = d->in_tokens + d->cache_write + d->cache_read;
    u.completion_tokens = d->out_tokens;
    u.cached_tokens = d->cache_read;
    u.cache_write_tokens = d->cache_write;
    u.total_tokens = u.prompt_tokens + u.completion_tokens;
    return u;
}

static int dup_into(char **dst, const char *src)
{
    free(*dst);
    *dst = strdup(src);
    return *dst ? 0 : loom__error_oom();
}

static int add_text(loom__anthropic_decoder *d, loom_llm_event_type type,
                    const char *s, size_t len)
{
    loom_buf *b = type == LOOM_LLM_TEXT ? &d->text : &d->reasoning;
    loom_llm_event ev = {0};

    if (!len)
        return 0;
    if (len > b->max - b->len)
        return fail(
            d, loom__error_set(
                   LOOM_ETOOLARGE, "answer %s passed the limit of %zu bytes",
                   type == LOOM_LLM_TEXT ? "text" : "thinking", b->max));
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

/* Thinking text: a reasoning delta, and kept with its block. */
static int add_thinking(loom__anthropic_decoder *d, block *b, const json_t *v)
{
    const char *s = json_string_value(v);
    size_t len = json_string_length(v);
    int rc;

    if (!s || !len)
        return 0;
    /* The reasoning buffer holds every block's text: its limit bounds
     * the block's too, so this put cannot pass max. */
    if ((rc = add_text(d, LOOM_LLM_REASONING, s, len)) != 0)
        return rc;
    if (loom_buf_put(&b->data, s, len) != 0)
        return fail(d, loom__error_oom());
    return 0;
}

/* A signature or redacted data: counted against max_state. */
static int add_state(loom__anthropic_decoder *d, loom_buf *buf, const json_t *v)
{
    const char *s = json_string_value(v);
    size_t len = json_string_length(v);

    if (!s || !len)
        return 0;
    if (len > d->lim.max_state - d->state_bytes)
        return fail(d, loom__error_set(LOOM_ETOOLARGE,
                                       "thinking signatures and redacted "
                                       "data passed the limit of %zu bytes",
                                       d->lim.max_state));
    if (loom_buf_put(buf, s, len) != 0)
        return fail(d, loom__error_oom());
    d->state_bytes += len;
    return 0;
}

/* Appends a fragment of a call's arguments and passes it on. */
static int add_args(loom__anthropic_decoder *d, block *b, const char *s,
                    size_t len, int first)
{
    loom_llm_event ev = {0};

    if (!len && !first)
        return 0;
    if (len > b->data.max - b->data.len)
        return fail(d, loom__error_set(LOOM_ETOOLARGE,
                                       "tool call %zu: arguments passed the "
                                       "limit of %zu bytes",
                                       b->call, b->data.max));
    if (loom_buf_put(&b->data, s, len) != 0)
        return fail(d, loom__error_oom());
    d->output_started = 1;
    ev.type = LOOM_LLM_TOOL_CALL_DELTA;
    ev.tool_index = (int)b->call;
    if (first) {
        ev.tool_id = b->id;
        ev.tool_name = b->name;
    }
    ev.args_delta = len ? s : "";
    return emit(d, &ev);
}

/*
 * The block at a wire index. With start, a new one (it must not have
 * started before); otherwise one that started.
 */
static int block_at(loom__anthropic_decoder *d, const json_t *jidx, int start,
                    block **out)
{
    json_int_t v;
    size_t i;

    if (!json_is_integer(jidx) || (v = json_integer_value(jidx)) < 0)
        return fail(
            d, loom__error_set(LOOM_EPROTO, "content block with a bad index"));
    if ((unsigned long long)v >= d->lim.max_blocks)
        return fail(d, loom__error_set(LOOM_ETOOLARGE,
                                       "answer has more than %zu content "
                                       "blocks",
                                       d->lim.max_blocks));
    i = (size_t)v;
    if (i >= d->nblocks) {
        block *nb;
        if (!start)
            goto not_started;
        if (!(nb = realloc(d->blocks, (i + 1) * sizeof(*nb))))
            return fail(d, loom__error_oom());
        memset(nb + d->nblocks, 0, (i + 1 - d->nblocks) * sizeof(*nb));
        d->blocks = nb;
        d->nblocks = i + 1;
    }
    if (start && d->blocks[i].type != B_NONE)
        return fail(d, loom__error_set(LOOM_EPROTO,
                                       "content block %zu started twice", i));
    if (!start && d->blocks[i].type == B_NONE)
        goto not_started;
    *out = &d->blocks[i];
    return 0;

not_started:
    return fail(d, loom__error_set(LOOM_EPROTO,
                                   "content block %zu was not started", i));
}

/* A call's input given whole (non-streamed, or a start that has it):
 * its JSON text. An empty object means none, as streaming starts say. */
static int whole_input(loom__anthropic_decoder *d, block *b,
                       const json_t *input)
{
    char *s;
    int rc;

    if (!input || (json_is_object(input) && json_object_size(input) == 0))
        return add_args(d, b, "", 0, 1);
    if (!(s = json_dumps(input, JSON_COMPACT | JSON_ENCODE_ANY)))
        return fail(d, loom__error_oom());
    rc = add_args(d, b, s, strlen(s), 1);
    free(s);
    return rc;
}

/* content_block_start, or one block of a whole message. */
static int block_start(loom__anthropic_decoder *d, const json_t *jidx,
                       const json_t *cb)
{
    const char *type = jstr_of(cb, "type");
    const char *id, *name;
    block *b;
    int rc;

    if (!json_is_object(cb) || !type)
        return fail(
            d, loom__error_set(LOOM_EPROTO, "content block without a type"));
    if ((rc = block_at(d, jidx, 1, &b)) != 0)
        return rc;
    if (strcmp(type, "text") == 0) {
        b->type = B_TEXT;
        return add_text(d, LOOM_LLM_TEXT, jstr_of(cb, "text"),
                        json_string_length(json_object_get(cb, "text")));
    }
    if (strcmp(type, "thinking") == 0) {
        b->type = B_THINKING;
        loom_buf_init(&b->data, d->lim.max_text);
        loom_buf_init(&b->sig, d->lim.max_state);
        if ((rc = add_thinking(d, b, json_object_get(cb, "thinking"))))
            return rc;
        return add_state(d, &b->sig, json_object_get(cb, "signature"));
    }
    if (strcmp(type, "redacted_thinking") == 0) {
        b->type = B_REDACTED;
        loom_buf_init(&b->data, d->lim.max_state);
        return add_state(d, &b->data, json_object_get(cb, "data"));
    }
    if (strcmp(type, "tool_use") != 0) {
        /* server_tool_use, web_search_tool_result, ...: run by the API
         * itself, nothing for loom to do. */
        b->type = B_OTHER;
        return 0;
    }
    if (d->ncalls >= d->lim.max_tool_calls)
        return fail(d, loom__error_set(LOOM_ETOOLARGE,
                                       "answer has more than %zu tool calls",
                                       d->lim.max_tool_calls));
    b->type = B_TOOL;
    b->call = d->ncalls++;
    loom_buf_init(&b->data, d->lim.max_args);
    id = jstr_of(cb, "id");
    name = jstr_of(cb, "name");
    if ((id && *id && dup_into(&b->id, id)) ||
        (name && *name && dup_into(&b->name, name)))
        return fail(d, LOOM_ENOMEM);
    return whole_input(d, b, json_object_get(cb, "input"));
}

static int block_delta(loom__anthropic_decoder *d, const json_t *jidx,
                       const json_t *delta)
{
    const char *type = jstr_of(delta, "type"), *s;
    block *b;
    int rc;

    if ((rc = block_at(d, jidx, 0, &b)) != 0)
        return rc;
    if (!type)
        return fail(d, loom__error_set(LOOM_EPROTO,
                                       "content block delta without a type"));
    if (strcmp(type, "text_delta") == 0)
        return add_text(d, LOOM_LLM_TEXT, jstr_of(delta, "text"),
                        json_string_length(json_object_get(delta, "text")));
    if (strcmp(type, "thinking_delta") == 0 && b->type == B_THINKING)
        return add_thinking(d, b, json_object_get(delta, "thinking"));
    if (strcmp(type, "signature_delta") == 0 && b->type == B_THINKING)
        return add_state(d, &b->sig, json_object_get(delta, "signature"));
    if (strcmp(type, "input_json_delta") == 0 && b->type == B_TOOL) {
        s = jstr_of(delta, "partial_json");
        return add_args(
            d, b, s ? s : "",
            s ? json_string_length(json_object_get(delta, "partial_json")) : 0,
            0);
    }
    /* citations_delta, server tools' input, future kinds: not loom's. */
    return 0;
}

/* The provider_state of the answer: the thinking blocks as they came, and
 * where every text and tool_use block stood between them. */
static int build_state(loom__anthropic_decoder *d)
{
    json_t *content = json_array(), *st = NULL, *it;
    int any = 0, bad = !content;

    for (size_t i = 0; !bad && i < d->nblocks; i++) {
        const block *b = &d->blocks[i];
        switch (b->type) {
        case B_THINKING:
            any = 1;
            it = json_pack("{s:s,s:s%,s:s%}", "type", "thinking", "thinking",
                           loom_buf_cstr(&b->data), b->data.len, "signature",
                           loom_buf_cstr(&b->sig), b->sig.len);
            break;
        case B_REDACTED:
            any = 1;
            it = json_pack("{s:s,s:s%}", "type", "redacted_thinking", "data",
                           loom_buf_cstr(&b->data), b->data.len);
            break;
        case B_TEXT:
            it = json_pack("{s:s}", "type", "text");
            break;
        case B_TOOL:
            it = json_pack("{s:s,s:s}", "type", "tool_use", "id",
                           d->calls[b->call].id);
            break;
        default:
            continue;
        }
        bad = json_array_append_new(content, it) != 0;
    }
    if (!bad && any) {
        st = json_pack("{s:{s:o}}", "anthropic", "content", content);
        content = NULL;
        bad = !st || !(d->state = json_dumps(st, JSON_COMPACT));
    }
    json_decref(content);
    json_decref(st);
    return bad ? fail(d, loom__error_oom()) : 0;
}

/* Builds the complete calls and the state; emits USAGE, TOOL_CALLS and
 * FINISH. */
static int close_answer(loom__anthropic_decoder *d)
{
    loom_llm_event ev = {0};
    int rc;

    d->ended = 1;
    if (d->ncalls && !(d->calls = calloc(d->ncalls, sizeof(*d->calls))))
        return fail(d, loom__error_oom());
    d->calls_len = d->ncalls;
    for (size_t i = 0; i < d->nblocks; i++) {
        block *b = &d->blocks[i];
        loom_tool_call *c;
        char gen[48];

        if (b->type != B_TOOL)
            continue;
        if (!b->name)
            return fail(d,
                        loom__error_set(LOOM_EPROTO,
                                        "tool call %zu has no name", b->call));
        c = &d->calls[b->call];
        /* An id is needed for the result to refer to. */
        snprintf(gen, sizeof(gen), "toolu_loom_%zu", b->call);
        c->id = b->id ? b->id : strdup(gen);
        c->name = b->name;
        b->id = b->name = NULL;
        c->arguments = b->data.len ? loom_buf_detach(&b->data) : strdup("{}");
        if (!c->id || !c->arguments)
            return fail(d, loom__error_oom());
    }
    if ((rc = build_state(d)) != 0)
        return rc;
    if (d->has_usage) {
        ev.type = LOOM_LLM_USAGE;
        ev.usage = usage_of(d);
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
    if (d->stop_reason) {
        memset(&ev, 0, sizeof(ev));
        ev.type = LOOM_LLM_FINISH;
        ev.finish_reason = loom__anthropic_finish_reason(d->stop_reason);
        if ((rc = emit(d, &ev)) != 0)
            return rc;
    }
    return 0;
}

static int keep_stop_reason(loom__anthropic_decoder *d, const json_t *v)
{
    const char *s = json_string_value(v);

    if (!s || !*s)
        return 0;
    return dup_into(&d->stop_reason, s) ? fail(d, LOOM_ENOMEM) : 0;
}

static int keep_id(loom__anthropic_decoder *d, const json_t *msg)
{
    const char *id = jstr_of(msg, "id");

    if (!id || d->response_id)
        return 0;
    return dup_into(&d->response_id, id) ? fail(d, LOOM_ENOMEM) : 0;
}

/* `event: error`, or an error object where an answer was expected. */
static int stream_error(loom__anthropic_decoder *d, const char *data,
                        size_t len, const json_t *obj)
{
    loom_llm_event ev = {0};
    const json_t *err = json_object_get(obj, "error");
    const char *msg = NULL, *type = NULL;

    loom__upstream_error_clear(&d->error);
    d->error.kind = LOOM_UPSTREAM_STREAM;
    if (json_is_object(err)) {
        msg = jstr_of(err, "message");
        type = jstr_of(err, "type");
    } else if (json_is_string(err)) {
        msg = json_string_value(err);
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

static int bad_json(loom__anthropic_decoder *d, const char *what,
                    const json_error_t *je, const char *data, size_t len)
{
    return fail(d, loom__error_set(LOOM_EPROTO, "malformed %s (%s): %.*s", what,
                                   je ? je->text : "not an object",
                                   (int)(len > 120 ? 120 : len), data));
}

/* One streamed event, by its data's type (the `event:` name when the
 * data has none). */
static int stream_event(loom__anthropic_decoder *d, const char *name,
                        const json_t *o)
{
    const char *type = jstr_of(o, "type");
    const json_t *idx = json_object_get(o, "index");
    const json_t *m;
    int rc;

    if (!type)
        type = name;
    if (strcmp(type, "message_start") == 0) {
        m = json_object_get(o, "message");
        read_usage(d, json_object_get(m, "usage"));
        return keep_id(d, m);
    }
    if (strcmp(type, "content_block_start") == 0)
        return block_start(d, idx, json_object_get(o, "content_block"));
    if (strcmp(type, "content_block_delta") == 0) {
        m = json_object_get(o, "delta");
        if (!json_is_object(m))
            return fail(d, loom__error_set(LOOM_EPROTO,
                                           "content_block_delta without a "
                                           "delta"));
        return block_delta(d, idx, m);
    }
    if (strcmp(type, "content_block_stop") == 0) {
        block *b;
        return block_at(d, idx, 0, &b);
    }
    if (strcmp(type, "message_delta") == 0) {
        read_usage(d, json_object_get(o, "usage"));
        rc = keep_stop_reason(
            d, json_object_get(json_object_get(o, "delta"), "stop_reason"));
        return rc;
    }
    if (strcmp(type, "message_stop") == 0)
        return close_answer(d);
    return 0; /* ping, and event types to come */
}

static int on_sse(const loom_sse_event *ev, void *payload)
{
    loom__anthropic_decoder *d = payload;
    json_error_t je;
    json_t *o;
    int rc;

    if (d->failed)
        return d->failed;
    if (d->ended)
        return 0; /* nothing after message_stop belongs to the answer */
    o = json_loadb(ev->data, ev->data_len, 0, &je);
    if (strcmp(ev->event, "error") == 0 ||
        strcmp(jstr_of(o, "type") ? jstr_of(o, "type") : "", "error") == 0) {
        rc = stream_error(d, ev->data, ev->data_len, o);
    } else if (!o) {
        /* A ping's data is never looked at. */
        rc = strcmp(ev->event, "ping") == 0
                 ? 0
                 : bad_json(d, "event", &je, ev->data, ev->data_len);
    } else if (!json_is_object(o)) {
        rc = bad_json(d, "event", NULL, ev->data, ev->data_len);
    } else {
        rc = stream_event(d, ev->event, o);
    }
    json_decref(o);
    return rc;
}

int loom__anthropic_decoder_feed(loom__anthropic_decoder *d, const char *data,
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

int loom__anthropic_decoder_finish(loom__anthropic_decoder *d)
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
    /* A stop reason says the answer is whole, even without
     * message_stop. */
    if (d->stop_reason)
        return close_answer(d);
    loom__upstream_error_clear(&d->error);
    d->error.kind = LOOM_UPSTREAM_CONNECTION;
    d->error.message = strdup("stream ended before the answer was complete");
    if (!d->error.message)
        return fail(d, loom__error_oom());
    return fail(d, loom__error_set(LOOM_EUPSTREAM, "%s", d->error.message));
}

int loom__anthropic_decoder_complete(loom__anthropic_decoder *d,
                                     const char *body, size_t len)
{
    json_error_t je;
    json_t *o, *content, *idx;
    size_t i;
    int rc = 0;

    if (d->failed)
        return d->failed;
    if (!(o = json_loadb(body, len, 0, &je)))
        return bad_json(d, "answer", &je, body, len);
    content = json_object_get(o, "content");
    if (!json_is_object(o)) {
        rc = bad_json(d, "answer", NULL, body, len);
    } else if (strcmp(jstr_of(o, "type") ? jstr_of(o, "type") : "", "error") ==
                   0 ||
               json_is_object(json_object_get(o, "error"))) {
        rc = stream_error(d, body, len, o);
    } else if (!json_is_array(content)) {
        rc = fail(d, loom__error_set(LOOM_EPROTO, "answer has no content"));
    } else {
        read_usage(d, json_object_get(o, "usage"));
        rc = keep_id(d, o);
        for (i = 0; !rc && i < json_array_size(content); i++) {
            if (!(idx = json_integer((json_int_t)i)))
                rc = fail(d, loom__error_oom());
            else
                rc = block_start(d, idx, json_array_get(content, i));
            json_decref(idx);
        }
        if (!rc)
            rc = keep_stop_reason(d, json_object_get(o, "stop_reason"));
        if (!rc)
            rc = close_answer(d);
    }
    json_decref(o);
    return rc;
}

int loom__anthropic_decoder_export(loom__anthropic_decoder *d,
                                   loom_llm_response *resp)
{
    const char *fr = loom__anthropic_finish_reason(d->stop_reason);
    char *text = loom_buf_detach(&d->text);

    if (!text)
        return loom__error_oom();
    free(resp->text);
    resp->text = text;
    free(resp->reasoning);
    resp->reasoning = NULL;
    if (d->has_reasoning && !(resp->reasoning = loom_buf_detach(&d->reasoning)))
        return loom__error_oom();
    resp->usage = usage_of(d);
    free(resp->finish_reason);
    resp->finish_reason = NULL;
    if (fr && !(resp->finish_reason = strdup(fr)))
        return loom__error_oom();
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
        resp->tool_calls = d->calls;
        resp->tool_calls_len = d->calls_len;
        d->calls = NULL;
        d->calls_len = 0;
        resp->provider_state = d->state;
        d->state = NULL;
    }
    return 0;
}
