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
 * A call of the answer tool (a response format, llm/anthropic.h) is no
 * call: its input is the answer's text, streamed as it comes when the
 * tool was forced alone, else kept until the end, where it is the text
 * only if no real tool was called beside it.
 *
 * A non-streamed message object is decoded into the same events so the
 * adapter has one path for both. Every buffer has a limit (text, thinking,
 * arguments per call, number of calls and blocks, signatures, SSE line and
 * event). Each event is small and rare next to the model's time, so
 * jansson reads it whole; there is no fast path as in the OpenAI decoder.
 */
#include "core/error.h"
#include "llm/answer.h"
#include "llm/anthropic.h"
#include "llm/attempt.h"
#include "loom/buf.h"
#include "loom/sse.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What a content block is. B_NONE: not started. */
enum {
    B_NONE = 0,
    B_TEXT,
    B_THINKING,
    B_REDACTED,
    B_TOOL,
    B_ANSWER, /* the answer tool's call (LOOM_ANTHROPIC_ANSWER_TOOL) */
    B_OTHER
};

typedef struct {
    int type;
    size_t call;   /* B_TOOL: the call's position among the calls */
    char *id;      /* B_TOOL */
    char *name;    /* B_TOOL */
    /* tool: arguments; thinking: its text; redacted: data; answer: the
     * input kept (BESIDE) */
    loom_buf data;
    loom_buf sig;  /* thinking: the signature */
} block;

struct loom__anthropic_decoder {
    loom__llm_answer a; /* first: the part every decoder has */
    loom__anthropic_limits lim;
    block *blocks; /* by wire index; never-started ones have B_NONE */
    size_t nblocks;
    size_t ncalls;
    size_t state_bytes; /* signatures and redacted data so far */
    int answer_mode;    /* LOOM__ANTHROPIC_ANSWER_* */
    /* The answer tool's call, once it started: its block's index + 1 (a
     * pointer would not survive blocks growing), 0 before. */
    size_t answer;
    size_t answer_len; /* bytes of it passed on as text (FORCED) */
    int answered;      /* the answer's text was emitted */
    long in_tokens, out_tokens, cache_write, cache_read;
};

/* What the shared part (llm/answer.h) calls back; defined at the end. */
static const loom__llm_answer_kind anthropic_kind;

/* The defaults of the limits (loom__llm_answer_kind.limits). */
static size_t limits_of(void *p, size_t *max_text)
{
    loom__anthropic_limits *lim = p;
    size_t big =
        loom__llm_limits(&lim->max_tool_calls, &lim->max_args, &lim->max_text);

    *max_text = lim->max_text;
    if (!lim->max_blocks)
        lim->max_blocks = LOOM_ANTHROPIC_MAX_BLOCKS;
    if (!lim->max_state)
        lim->max_state = LOOM_ANTHROPIC_MAX_STATE;
    if (lim->max_state > big)
        big = lim->max_state;
    /* One event carries one delta, or (redacted thinking) one block's
     * data; JSON escaping may double it: leave room, but stay bounded. */
    return 2 * big + 65536;
}

int loom__anthropic_decoder_new(loom__anthropic_decoder **out,
                                const loom__anthropic_limits *limits,
                                loom_llm_event_cb cb, void *payload)
{
    void *d = NULL;
    int rc = loom__llm_answer_new(&d, sizeof(**out), &anthropic_kind, limits,
                                  cb, payload);

    *out = d;
    return rc;
}

void loom__anthropic_decoder_set_answer(loom__anthropic_decoder *d, int mode)
{
    d->answer_mode = mode;
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

/* Sets *out to the count o[key] (see loom__llm_count) when it is a
 * number; leaves it alone otherwise. */
static void count_of(const json_t *o, const char *key, long *out)
{
    const json_t *v = json_object_get(o, key);

    if (json_is_number(v))
        *out = loom__llm_count(v);
}

/* message_start carries the first counts, message_delta the final ones
 * (output_tokens always; the others when the server repeats them). */
static void read_usage(loom__anthropic_decoder *d, const json_t *u)
{
    loom_usage *t = &d->a.usage;

    if (!json_is_object(u))
        return;
    count_of(u, "input_tokens", &d->in_tokens);
    count_of(u, "output_tokens", &d->out_tokens);
    count_of(u, "cache_creation_input_tokens", &d->cache_write);
    count_of(u, "cache_read_input_tokens", &d->cache_read);
    /* Anthropic's input_tokens leave out what the cache wrote and read:
     * loom's prompt tokens are every token of the prompt. */
    t->prompt_tokens = d->in_tokens + d->cache_write + d->cache_read;
    t->completion_tokens = d->out_tokens;
    t->cached_tokens = d->cache_read;
    t->cache_write_tokens = d->cache_write;
    t->total_tokens = t->prompt_tokens + t->completion_tokens;
    d->a.has_usage = 1;
}

static int dup_into(char **dst, const char *src)
{
    free(*dst);
    *dst = strdup(src);
    return *dst ? 0 : loom__error_oom();
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
    if ((rc = loom__llm_answer_text(&d->a, LOOM_LLM_REASONING, s, len)) != 0)
        return rc;
    if (loom_buf_put(&b->data, s, len) != 0)
        return loom__llm_answer_fail(&d->a, loom__error_oom());
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
        return loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_ETOOLARGE,
                                   "thinking signatures and redacted "
                                   "data passed the limit of %zu bytes",
                                   d->lim.max_state));
    if (loom_buf_put(buf, s, len) != 0)
        return loom__llm_answer_fail(&d->a, loom__error_oom());
    d->state_bytes += len;
    return 0;
}

/* Appends a fragment of a call's arguments and passes it on. */
static int add_args(loom__anthropic_decoder *d, block *b, const char *s,
                    size_t len, int first)
{
    int rc;

    if (!len && !first)
        return 0;
    if ((rc = loom__llm_answer_args(&d->a, &b->data, b->call, s, len)) != 0)
        return rc;
    return loom__llm_answer_call_delta(&d->a, b->call, first ? b->id : NULL,
                                       first ? b->name : NULL, len ? s : "");
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
        return loom__llm_answer_fail(
            &d->a,
            loom__error_set(LOOM_EPROTO, "content block with a bad index"));
    if ((unsigned long long)v >= d->lim.max_blocks)
        return loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_ETOOLARGE,
                                   "answer has more than %zu content "
                                   "blocks",
                                   d->lim.max_blocks));
    i = (size_t)v;
    if (i >= d->nblocks) {
        block *nb;
        if (!start)
            goto not_started;
        if (!(nb = realloc(d->blocks, (i + 1) * sizeof(*nb))))
            return loom__llm_answer_fail(&d->a, loom__error_oom());
        memset(nb + d->nblocks, 0, (i + 1 - d->nblocks) * sizeof(*nb));
        d->blocks = nb;
        d->nblocks = i + 1;
    }
    if (start && d->blocks[i].type != B_NONE)
        return loom__llm_answer_fail(
            &d->a,
            loom__error_set(LOOM_EPROTO, "content block %zu started twice", i));
    if (!start && d->blocks[i].type == B_NONE)
        goto not_started;
    *out = &d->blocks[i];
    return 0;

not_started:
    return loom__llm_answer_fail(
        &d->a,
        loom__error_set(LOOM_EPROTO, "content block %zu was not started", i));
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
        return loom__llm_answer_fail(&d->a, loom__error_oom());
    rc = add_args(d, b, s, strlen(s), 1);
    free(s);
    return rc;
}

/*
 * A piece of the answer tool's input: the answer's text, passed on at
 * once when the tool was forced alone, else kept until the end
 * (answer_close).
 */
static int answer_piece(loom__anthropic_decoder *d, block *b, const char *s,
                        size_t len)
{
    if (!len)
        return 0;
    if (d->answer_mode == LOOM__ANTHROPIC_ANSWER_FORCED) {
        d->answer_len += len;
        return loom__llm_answer_text(&d->a, LOOM_LLM_TEXT, s, len);
    }
    if (loom_buf_put(&b->data, s, len) == 0)
        return 0;
    return loom__llm_answer_fail(
        &d->a, len > b->data.max - b->data.len
                   ? loom__error_set(LOOM_ETOOLARGE,
                                     "answer text passed the limit of %zu "
                                     "bytes",
                                     b->data.max)
                   : loom__error_oom());
}

/* The start of the answer tool's call; a second one is ignored. An empty
 * input is none, as streamed starts say: the deltas bring it. */
static int answer_start(loom__anthropic_decoder *d, block *b,
                        const json_t *input)
{
    char *s;
    int rc;

    if (d->answer) {
        b->type = B_OTHER;
        return 0;
    }
    b->type = B_ANSWER;
    d->answer = (size_t)(b - d->blocks) + 1;
    loom_buf_init(&b->data, d->lim.max_text);
    if (!input || (json_is_object(input) && json_object_size(input) == 0))
        return 0;
    if (!(s = json_dumps(input, JSON_COMPACT | JSON_ENCODE_ANY)))
        return loom__llm_answer_fail(&d->a, loom__error_oom());
    rc = answer_piece(d, b, s, strlen(s));
    free(s);
    return rc;
}

/* content_block_start, or one block of a whole message. */
static int block_start(loom__anthropic_decoder *d, const json_t *jidx,
                       const json_t *cb)
{
    const char *type = loom__llm_jstr(cb, "type");
    const char *id, *name;
    block *b;
    int rc;

    if (!json_is_object(cb) || !type)
        return loom__llm_answer_fail(
            &d->a,
            loom__error_set(LOOM_EPROTO, "content block without a type"));
    if ((rc = block_at(d, jidx, 1, &b)) != 0)
        return rc;
    if (strcmp(type, "text") == 0) {
        b->type = B_TEXT;
        return loom__llm_answer_text(
            &d->a, LOOM_LLM_TEXT, loom__llm_jstr(cb, "text"),
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
    name = loom__llm_jstr(cb, "name");
    if (d->answer_mode && name && strcmp(name, LOOM_ANTHROPIC_ANSWER_TOOL) == 0)
        return answer_start(d, b, json_object_get(cb, "input"));
    if (d->ncalls >= d->lim.max_tool_calls)
        return loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_ETOOLARGE,
                                   "answer has more than %zu tool calls",
                                   d->lim.max_tool_calls));
    b->type = B_TOOL;
    b->call = d->ncalls++;
    loom_buf_init(&b->data, d->lim.max_args);
    id = loom__llm_jstr(cb, "id");
    if ((id && *id && dup_into(&b->id, id)) ||
        (name && *name && dup_into(&b->name, name)))
        return loom__llm_answer_fail(&d->a, LOOM_ENOMEM);
    return whole_input(d, b, json_object_get(cb, "input"));
}

static int block_delta(loom__anthropic_decoder *d, const json_t *jidx,
                       const json_t *delta)
{
    const char *type = loom__llm_jstr(delta, "type"), *s;
    block *b;
    int rc;

    if ((rc = block_at(d, jidx, 0, &b)) != 0)
        return rc;
    if (!type)
        return loom__llm_answer_fail(
            &d->a,
            loom__error_set(LOOM_EPROTO, "content block delta without a type"));
    if (strcmp(type, "text_delta") == 0)
        return loom__llm_answer_text(
            &d->a, LOOM_LLM_TEXT, loom__llm_jstr(delta, "text"),
            json_string_length(json_object_get(delta, "text")));
    if (strcmp(type, "thinking_delta") == 0 && b->type == B_THINKING)
        return add_thinking(d, b, json_object_get(delta, "thinking"));
    if (strcmp(type, "signature_delta") == 0 && b->type == B_THINKING)
        return add_state(d, &b->sig, json_object_get(delta, "signature"));
    if (strcmp(type, "input_json_delta") == 0 && b->type == B_ANSWER) {
        s = loom__llm_jstr(delta, "partial_json");
        return answer_piece(
            d, b, s ? s : "",
            s ? json_string_length(json_object_get(delta, "partial_json")) : 0);
    }
    if (strcmp(type, "input_json_delta") == 0 && b->type == B_TOOL) {
        s = loom__llm_jstr(delta, "partial_json");
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
        case B_ANSWER: /* where the answer's text stood */
            if (!d->answered)
                continue;
            it = json_pack("{s:s}", "type", "text");
            break;
        case B_TOOL:
            it = json_pack("{s:s,s:s}", "type", "tool_use", "id",
                           d->a.calls[b->call].id);
            break;
        default:
            continue;
        }
        bad = json_array_append_new(content, it) != 0;
    }
    if (!bad && any) {
        st = json_pack("{s:{s:o}}", "anthropic", "content", content);
        content = NULL;
        bad = !st || !(d->a.state = json_dumps(st, JSON_COMPACT));
    }
    json_decref(content);
    json_decref(st);
    return bad ? loom__llm_answer_fail(&d->a, loom__error_oom()) : 0;
}

/*
 * The end of the answer tool's call: its input ("{}" when it had none) is
 * the answer's text unless real tools were called beside it (then the
 * model answers after they ran), and the tool use that ended the answer
 * is a stop.
 */
static int answer_close(loom__anthropic_decoder *d)
{
    block *b = d->answer ? &d->blocks[d->answer - 1] : NULL;
    int rc;

    if (!b || d->ncalls)
        return 0;
    if (d->answer_mode == LOOM__ANTHROPIC_ANSWER_BESIDE && b->data.len)
        rc = loom__llm_answer_text(&d->a, LOOM_LLM_TEXT,
                                   loom_buf_cstr(&b->data), b->data.len);
    else if (!d->answer_len && !b->data.len)
        rc = loom__llm_answer_text(&d->a, LOOM_LLM_TEXT, "{}", 2);
    else
        rc = 0;
    if (rc)
        return rc;
    d->answered = 1;
    if (d->a.finish_reason && strcmp(d->a.finish_reason, "tool_calls") == 0 &&
        dup_into(&d->a.finish_reason, "stop"))
        return loom__llm_answer_fail(&d->a, LOOM_ENOMEM);
    return 0;
}

/* Builds the complete calls and the state; emits USAGE, TOOL_CALLS and
 * FINISH. */
static int close_answer(void *owner)
{
    loom__anthropic_decoder *d = owner;
    char gen[48];
    int rc;

    d->a.ended = 1;
    if (loom__llm_answer_calls(&d->a, d->ncalls))
        return LOOM_ENOMEM;
    d->a.calls_len = d->ncalls;
    for (size_t i = 0; i < d->nblocks; i++) {
        block *b = &d->blocks[i];

        if (b->type != B_TOOL)
            continue;
        if (!b->name)
            return loom__llm_answer_fail(
                &d->a, loom__error_set(LOOM_EPROTO, "tool call %zu has no name",
                                       b->call));
        snprintf(gen, sizeof(gen), "toolu_loom_%zu", b->call);
        if (loom__llm_answer_take_call(&d->a, &d->a.calls[b->call], &b->id,
                                       &b->name, &b->data, gen))
            return LOOM_ENOMEM;
    }
    if ((rc = answer_close(d)) != 0 || (rc = build_state(d)) != 0)
        return rc;
    return loom__llm_answer_close(&d->a);
}

/* Keeps the stop reason, by loom's name for it. */
static int keep_stop_reason(loom__anthropic_decoder *d, const json_t *v)
{
    const char *s = json_string_value(v);

    if (!s || !*s)
        return 0;
    return dup_into(&d->a.finish_reason, loom__anthropic_finish_reason(s))
               ? loom__llm_answer_fail(&d->a, LOOM_ENOMEM)
               : 0;
}

static int keep_id(loom__anthropic_decoder *d, const json_t *msg)
{
    const char *id = loom__llm_jstr(msg, "id");

    if (!id || d->a.response_id)
        return 0;
    return dup_into(&d->a.response_id, id)
               ? loom__llm_answer_fail(&d->a, LOOM_ENOMEM)
               : 0;
}

/* `event: error`, or an error object where an answer was expected. */
static int stream_error(loom__anthropic_decoder *d, const char *data,
                        size_t len, const json_t *obj)
{
    const json_t *err = json_object_get(obj, "error");
    const char *msg = NULL, *type = NULL;

    if (json_is_object(err)) {
        msg = loom__llm_jstr(err, "message");
        type = loom__llm_jstr(err, "type");
    } else if (json_is_string(err)) {
        msg = json_string_value(err);
    }
    return loom__llm_answer_error(&d->a, LOOM_UPSTREAM_STREAM, 0, msg, type,
                                  data, len, 1);
}

/* One streamed event, by its data's type (the `event:` name when the
 * data has none). */
static int stream_event(loom__anthropic_decoder *d, const char *name,
                        const json_t *o)
{
    const char *type = loom__llm_jstr(o, "type");
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
            return loom__llm_answer_fail(
                &d->a,
                loom__error_set(LOOM_EPROTO, "content_block_delta without a "
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
    json_t *o;
    int rc;

    if (d->a.failed)
        return d->a.failed;
    if (d->a.ended)
        return 0; /* nothing after message_stop belongs to the answer */
    o = json_loadb(ev->data, ev->data_len, 0, NULL);
    if (strcmp(ev->event, "error") == 0 ||
        strcmp(loom__llm_jstr(o, "type") ? loom__llm_jstr(o, "type") : "",
               "error") == 0) {
        rc = stream_error(d, ev->data, ev->data_len, o);
    } else if (!o) {
        /* A ping's data is never looked at. */
        rc = strcmp(ev->event, "ping") == 0
                 ? 0
                 : loom__llm_answer_bad_json(&d->a, "event", ev->data,
                                             ev->data_len);
    } else if (!json_is_object(o)) {
        rc = loom__llm_answer_bad_json(&d->a, "event", ev->data, ev->data_len);
    } else {
        rc = stream_event(d, ev->event, o);
    }
    json_decref(o);
    return rc;
}

/* A whole JSON body (loom__llm_answer_kind.complete). */
static int complete(void *owner, const json_t *o, const char *body, size_t len)
{
    loom__anthropic_decoder *d = owner;
    const json_t *content = json_object_get(o, "content");
    const char *type = loom__llm_jstr(o, "type");
    json_t *idx;
    int rc;

    if ((type && strcmp(type, "error") == 0) ||
        json_is_object(json_object_get(o, "error")))
        return stream_error(d, body, len, o);
    if (!json_is_array(content))
        return loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_EPROTO, "answer has no content"));
    read_usage(d, json_object_get(o, "usage"));
    rc = keep_id(d, o);
    for (size_t i = 0; !rc && i < json_array_size(content); i++) {
        if (!(idx = json_integer((json_int_t)i)))
            return loom__llm_answer_fail(&d->a, loom__error_oom());
        rc = block_start(d, idx, json_array_get(content, i));
        json_decref(idx);
    }
    if (!rc)
        rc = keep_stop_reason(d, json_object_get(o, "stop_reason"));
    return rc ? rc : close_answer(d);
}

/* Frees what is this decoder's own (loom__llm_answer_free() does the
 * rest). */
static void release(void *owner)
{
    loom__anthropic_decoder *d = owner;

    for (size_t i = 0; i < d->nblocks; i++) {
        free(d->blocks[i].id);
        free(d->blocks[i].name);
        loom_buf_free(&d->blocks[i].data);
        loom_buf_free(&d->blocks[i].sig);
    }
    free(d->blocks);
}

/* A stop reason says the answer is whole, even without message_stop. */
static const loom__llm_answer_kind anthropic_kind = {
    .on_sse = on_sse,
    .close = close_answer,
    .complete = complete,
    .release = release,
    .cut_what = "answer",
    .reasoning_name = "thinking",
    .lim_offset = offsetof(loom__anthropic_decoder, lim),
    .lim_size = sizeof(loom__anthropic_limits),
    .limits = limits_of,
};

LOOM__LLM_DECODER_API(loom__anthropic_decoder)
