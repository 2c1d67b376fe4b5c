/*
 * The OpenAI Chat Completions adapter (provider kind "openai"): any server
 * that speaks POST {base_url}/chat/completions, which includes OpenAI,
 * Azure-style gateways, vLLM, llama.cpp's server, Ollama and most proxies.
 *
 * This file builds the request body and reads error answers. The provider
 * object (headers, timeouts) and the sending are what every HTTP adapter
 * shares (llm/adapter.c), through the attempt loop (llm/attempt.c), which
 * classifies failures into loom_upstream_error and retries: only while
 * nothing has reached the caller's callback (a retried answer would show
 * text twice), on 408, 409, 429, 5xx, a connection that failed or
 * dropped, and a connect timeout; the server's retry-after-ms /
 * Retry-After wins over loom's backoff, up to LOOM_RETRY_MAX_HONOURED_MS.
 * Decoding the answer is llm/openai_stream.c's job, which does no I/O.
 */
#include "llm/openai.h"
#include "core/error.h"
#include "core/utf8.h"
#include "llm/adapter.h"
#include "llm/params.h"
#include "llm/parts.h"
#include "loom/buf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    loom__llm_adapter a; /* first: the part every adapter has */
    loom__openai_limits limits;
} openai_provider;

/* ---- request body ---------------------------------------------------- */

static json_t *tool_call_json(const loom_tool_call *c)
{
    const char *args = c->arguments && *c->arguments ? c->arguments : "{}";
    json_t *fn = json_object();

    if (!fn || loom__llm_put(fn, "name", loom__llm_json_string(c->name)) ||
        loom__llm_put(fn, "arguments", loom__llm_json_string(args))) {
        json_decref(fn);
        return NULL;
    }
    return json_pack("{s:o,s:s,s:o}", "id", loom__llm_json_string(c->id),
                     "type", "function", "function", fn);
}

static json_t *message_json(const loom_message *m)
{
    json_t *o = json_object(), *calls;
    int bad = !o;

    if (bad)
        return NULL;
    bad |= loom__llm_put(o, "role", json_string(loom_role_name(m->role)));
    switch (m->role) {
    case LOOM_ROLE_ASSISTANT:
        /* OpenAI wants null, not "", beside tool calls. */
        if ((!m->content || !*m->content) && m->tool_calls_len)
            bad |= loom__llm_put(o, "content", json_null());
        else
            bad |=
                loom__llm_put(o, "content", loom__llm_json_string(m->content));
        if (!m->tool_calls_len)
            break;
        bad |= loom__llm_put(o, "tool_calls", calls = json_array());
        for (size_t i = 0; !bad && i < m->tool_calls_len; i++)
            bad |=
                json_array_append_new(calls, tool_call_json(&m->tool_calls[i]));
        break;
    case LOOM_ROLE_TOOL:
        bad |= loom__llm_put(o, "tool_call_id",
                             loom__llm_json_string(m->tool_call_id));
        bad |= loom__llm_put(o, "content", loom__llm_json_string(m->content));
        break;
    default:
        bad |= loom__llm_put(o, "content",
                             loom_message_has_media(m)
                                 ? loom__parts_openai(m)
                                 : loom__llm_json_string(m->content));
        break;
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/*
 * Tool messages cannot hold images in this API, so the images of a run
 * of tool messages (the results of one turn) go in one user message
 * right after its last one: a line naming the call, then its images, for
 * each result that has any. Returns 1 when messages[i] ends such a run
 * and some result of it has images, with *from its first message.
 */
static int images_after(const loom_llm_request *req, size_t i, size_t *from)
{
    const loom_message *m = req->messages;
    int any = 0;
    size_t k = i + 1;

    if (m[i].role != LOOM_ROLE_TOOL ||
        (i + 1 < req->messages_len && m[i + 1].role == LOOM_ROLE_TOOL))
        return 0;
    while (k > 0 && m[k - 1].role == LOOM_ROLE_TOOL)
        any |= loom_message_has_media(&m[--k]);
    *from = k;
    return any;
}

/* The user message of the images of messages[from..to] (images_after). */
static json_t *images_message(const loom_llm_request *req, size_t from,
                              size_t to)
{
    json_t *content = json_array(), *parts;
    char line[256];
    int bad = !content;

    for (size_t k = from; !bad && k <= to; k++) {
        const loom_message *m = &req->messages[k];
        if (!loom_message_has_media(m))
            continue;
        snprintf(line, sizeof(line),
                 "The images that tool call %.100s (%.64s) "
                 "gave with its result:",
                 m->tool_call_id ? m->tool_call_id : "?",
                 m->name ? m->name : "a tool");
        parts = loom__parts_openai(m);
        bad = !parts ||
              json_array_append_new(
                  content, json_pack("{s:s,s:o}", "type", "text", "text",
                                     loom__llm_json_string(line))) ||
              json_array_extend(content, parts);
        json_decref(parts);
    }
    if (bad) {
        json_decref(content);
        return NULL;
    }
    return json_pack("{s:s,s:o}", "role", "user", "content", content);
}

static json_t *tool_json(const loom_tool_def *t)
{
    json_t *fn = json_object(), *params;

    if (!fn)
        return NULL;
    if (t->parameters)
        params = json_deep_copy(t->parameters);
    else
        params = json_pack("{s:s,s:{}}", "type", "object", "properties");
    if (loom__llm_put(fn, "parameters", params) ||
        loom__llm_put(fn, "name", loom__llm_json_string(t->name)) ||
        (t->description &&
         loom__llm_put(fn, "description",
                       loom__llm_json_string(t->description)))) {
        json_decref(fn);
        return NULL;
    }
    return json_pack("{s:s,s:o}", "type", "function", "function", fn);
}

static json_t *tool_choice_json(const loom_tool_choice *tc)
{
    switch (tc->kind) {
    case LOOM_TOOL_CHOICE_NONE:
        return json_string("none");
    case LOOM_TOOL_CHOICE_REQUIRED:
        return json_string("required");
    case LOOM_TOOL_CHOICE_FUNCTION:
        return json_pack("{s:s,s:{s:o}}", "type", "function", "function",
                         "name", loom__llm_json_string(tc->function));
    default:
        return json_string("auto");
    }
}

int loom__openai_put_tools(json_t *body, const loom_llm_request *req,
                           json_t *(*tool)(const loom_tool_def *t),
                           json_t *(*choice)(const loom_tool_choice *tc))
{
    json_t *arr;
    int bad = loom__llm_put(body, "tools", arr = json_array());

    for (size_t i = 0; !bad && i < req->tools_len; i++)
        bad |= json_array_append_new(arr, tool(&req->tools[i]));
    bad |= loom__llm_put(body, "tool_choice", choice(&req->tool_choice));
    if (req->parallel_tool_calls >= 0)
        bad |= loom__llm_put(body, "parallel_tool_calls",
                             json_boolean(req->parallel_tool_calls));
    return bad ? -1 : 0;
}

/* The field that carries max_tokens for req's model. */
static const char *max_tokens_field(const loom_llm_request *req)
{
    int completion = req->max_completion_tokens
                         ? req->max_completion_tokens > 0
                         : loom_config_known_max_completion_tokens(req->model);

    return completion ? "max_completion_tokens" : "max_tokens";
}

int loom__openai_build_body(json_t **out, const loom_llm_request *req)
{
    const char *effort =
        loom__params_effort(req->params, req->reasoning_effort);
    json_t *body = NULL, *arr;
    int bad = 0, rc;

    *out = NULL;
    if ((rc = loom__llm_request_check(req)) != 0)
        return rc;
    if (!(body = json_object()))
        return loom__error_oom();
    bad |= loom__llm_put(body, "model", loom__llm_json_string(req->model));
    bad |= loom__llm_put(body, "messages", arr = json_array());
    for (size_t i = 0; !bad && i < req->messages_len; i++) {
        size_t from;
        bad |= json_array_append_new(arr, message_json(&req->messages[i]));
        if (!bad && images_after(req, i, &from))
            bad |= json_array_append_new(arr, images_message(req, from, i));
    }
    if (!bad && req->tools_len)
        bad |= loom__openai_put_tools(body, req, tool_json, tool_choice_json);
    if (req->max_tokens > 0)
        bad |= loom__llm_put(body, max_tokens_field(req),
                             json_integer(req->max_tokens));
    if (req->temperature >= 0)
        bad |= loom__llm_put(body, "temperature", json_real(req->temperature));
    if (effort)
        bad |= loom__llm_put(body, "reasoning_effort",
                             loom__llm_json_string(effort));
    bad |= loom__params_put_openai(body, req->params);
    if (req->stream) {
        bad |= loom__llm_put(body, "stream", json_true());
        bad |= loom__llm_put(body, "stream_options",
                             json_pack("{s:b}", "include_usage", 1));
    }
    if (bad) {
        json_decref(body);
        return loom__error_oom();
    }
    *out = body;
    return 0;
}

/* ---- request body as text -------------------------------------------- */

/*
 * The adapter writes the body as text directly, into a buffer it reuses,
 * rather than building a jansson tree and dumping it on every call: that
 * took a fifth of loom's time per model call. The text is byte for byte
 * what json_dumps(loom__openai_build_body(), JSON_COMPACT |
 * JSON_REAL_PRECISION(15)) gives (the unit tests compare them), and with
 * a loom_llm_cache the messages already sent and the tools are not
 * encoded again at all.
 */

/*
 * Appends s (NULL: "") as a JSON string: exactly what json_dumps() writes
 * for loom__llm_json_string(s), that is each byte that is not valid UTF-8
 * replaced by U+FFFD, and '"', '\\' and control bytes escaped as jansson
 * escapes them (\b \f \n \r \t, else \u00XX). By hand because jansson has no
 * lossy mode and encodes only values it has built.
 */
static int put_str(loom_buf *b, const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    size_t run = 0, i = 0, n;
    char esc[6];
    int rc;

    if ((rc = loom_buf_putc(b, '"')) != 0)
        return rc;
    for (;;) {
        unsigned c = p[i];
        const char *e = esc;
        size_t elen = 2;

        if (c >= 0x20 && c != '"' && c != '\\' && c < 0x80) {
            i++;
            continue;
        }
        if (c >= 0x80 && (n = loom__llm_utf8_seq(p + i, 4)) != 0) {
            i += n;
            continue;
        }
        /* p[run, i) needs nothing: copy it in one piece. */
        if (i > run && (rc = loom_buf_put(b, p + run, i - run)) != 0)
            return rc;
        if (c == 0)
            break;
        esc[0] = '\\';
        switch (c) {
        case '"':
        case '\\':
            esc[1] = (char)c;
            break;
        case '\b':
            esc[1] = 'b';
            break;
        case '\f':
            esc[1] = 'f';
            break;
        case '\n':
            esc[1] = 'n';
            break;
        case '\r':
            esc[1] = 'r';
            break;
        case '\t':
            esc[1] = 't';
            break;
        default:
            if (c >= 0x80) {
                e = "\xEF\xBF\xBD";
                elen = 3;
            } else {
                /* esc is 6 counted bytes, not a string. */
                memcpy(esc, "\\u00", 4); /* NOLINT(bugprone-not-null-*) */
                esc[4] = hex[c >> 4];
                esc[5] = hex[c & 15];
                elen = 6;
            }
            break;
        }
        if ((rc = loom_buf_put(b, e, elen)) != 0)
            return rc;
        run = ++i;
    }
    return loom_buf_putc(b, '"');
}

static int put_lit(loom_buf *b, const char *s)
{
    return loom_buf_put(b, s, strlen(s));
}

/* The text of loom__parts_openai(m). */
static int put_parts(loom_buf *b, const loom_message *m)
{
    json_t *parts = loom__parts_openai(m);
    int rc = parts ? loom__llm_put_json_text(b, parts) : loom__error_oom();

    json_decref(parts);
    return rc;
}

/* The text of message_json(m). */
static int put_message(loom_buf *b, const loom_message *m)
{
    int rc = put_lit(b, "{\"role\":");

    if (!rc)
        rc = put_str(b, loom_role_name(m->role));
    switch (m->role) {
    case LOOM_ROLE_ASSISTANT:
        if (rc)
            break;
        if ((!m->content || !*m->content) && m->tool_calls_len)
            rc = put_lit(b, ",\"content\":null");
        else if (!(rc = put_lit(b, ",\"content\":")))
            rc = put_str(b, m->content);
        if (!m->tool_calls_len)
            break;
        if (!rc)
            rc = put_lit(b, ",\"tool_calls\":[");
        for (size_t i = 0; !rc && i < m->tool_calls_len; i++) {
            const loom_tool_call *c = &m->tool_calls[i];
            const char *args =
                c->arguments && *c->arguments ? c->arguments : "{}";
            if ((rc = put_lit(b, i ? ",{\"id\":" : "{\"id\":")) ||
                (rc = put_str(b, c->id)) ||
                (rc = put_lit(b, ",\"type\":\"function\",\"function\":"
                                 "{\"name\":")) ||
                (rc = put_str(b, c->name)) ||
                (rc = put_lit(b, ",\"arguments\":")) || (rc = put_str(b, args)))
                break;
            rc = put_lit(b, "}}");
        }
        if (!rc)
            rc = loom_buf_putc(b, ']');
        break;
    case LOOM_ROLE_TOOL:
        if (!rc && !(rc = put_lit(b, ",\"tool_call_id\":")))
            rc = put_str(b, m->tool_call_id);
        if (!rc && !(rc = put_lit(b, ",\"content\":")))
            rc = put_str(b, m->content);
        break;
    default:
        if (!rc && !(rc = put_lit(b, ",\"content\":")))
            rc = loom_message_has_media(m) ? put_parts(b, m)
                                           : put_str(b, m->content);
        break;
    }
    return rc ? rc : loom_buf_putc(b, '}');
}

/* The text of messages[i] and, when it ends a run of tool results with
 * images, of the user message of those images (images_after). */
static int put_entry(loom_buf *b, const loom_llm_request *req, size_t i)
{
    json_t *extra;
    size_t from;
    int rc = put_message(b, &req->messages[i]);

    if (rc || !images_after(req, i, &from))
        return rc;
    if (!(extra = images_message(req, from, i)))
        return loom__error_oom();
    if (!(rc = loom_buf_putc(b, ',')))
        rc = loom__llm_put_json_text(b, extra);
    json_decref(extra);
    return rc;
}

/* The text of the "tools" array (tool_json of each), parameters dumped
 * from the borrowed objects: no copy. */
static int put_tools(loom_buf *b, const loom_tool_def *tools, size_t n)
{
    int rc = loom_buf_putc(b, '[');

    for (size_t i = 0; !rc && i < n; i++) {
        const loom_tool_def *t = &tools[i];
        if ((rc = put_lit(b, i ? ",{\"type\":\"function\",\"function\":"
                                 "{\"parameters\":"
                               : "{\"type\":\"function\",\"function\":"
                                 "{\"parameters\":")))
            break;
        if (t->parameters)
            rc = loom__llm_put_json_text(b, t->parameters);
        else
            rc = put_lit(b, "{\"type\":\"object\",\"properties\":{}}");
        if (rc || (rc = put_lit(b, ",\"name\":")) || (rc = put_str(b, t->name)))
            break;
        if (t->description && ((rc = put_lit(b, ",\"description\":")) ||
                               (rc = put_str(b, t->description))))
            break;
        rc = put_lit(b, "}}");
    }
    return rc ? rc : loom_buf_putc(b, ']');
}

static int put_tool_choice(loom_buf *b, const loom_tool_choice *tc)
{
    int rc;

    switch (tc->kind) {
    case LOOM_TOOL_CHOICE_NONE:
        return put_lit(b, "\"none\"");
    case LOOM_TOOL_CHOICE_REQUIRED:
        return put_lit(b, "\"required\"");
    case LOOM_TOOL_CHOICE_FUNCTION:
        if ((rc = put_lit(b, "{\"type\":\"function\",\"function\":"
                             "{\"name\":")) ||
            (rc = put_str(b, tc->function)))
            return rc;
        return put_lit(b, "}}");
    default:
        return put_lit(b, "\"auto\"");
    }
}

/* What a cache remembers of a message to notice one that changed. */
typedef struct {
    loom_role role;
    const char *content;
    const char *tool_call_id;
    const loom_tool_call *tool_calls;
    size_t tool_calls_len;
    const loom_part *parts;
    int ends_images; /* it ended a run of results with images */
    size_t end;      /* msgs.len just after this message's text */
} cached_msg;

/*
 * The state behind loom_llm_cache (llm.h), for this adapter: the text of
 * the messages sent so far, joined by commas, and of the tools array,
 * each with what it was made from; and the body buffer, reused.
 */
struct loom_llm_cache {
    const void *owner; /* the provider that wrote it */
    loom_buf msgs;
    cached_msg *items;
    size_t len, cap;
    loom_buf tools;
    loom_tool_def *defs; /* what tools was made from */
    size_t ndefs;
    int has_tools;
    loom_buf body;
};

int loom_llm_cache_new(loom_llm_cache **out)
{
    loom_llm_cache *c = calloc(1, sizeof(*c));

    *out = NULL;
    if (!c)
        return loom__error_oom();
    loom_buf_init(&c->msgs, LOOM_BUF_UNLIMITED);
    loom_buf_init(&c->tools, LOOM_BUF_UNLIMITED);
    loom_buf_init(&c->body, LOOM_BUF_UNLIMITED);
    *out = c;
    return 0;
}

static void cache_forget(loom_llm_cache *c)
{
    loom_buf_clear(&c->msgs);
    loom_buf_clear(&c->tools);
    c->len = 0;
    c->has_tools = 0;
}

loom_buf *loom__openai_cache_body(loom_llm_cache *c)
{
    return &c->body;
}

void loom_llm_cache_free(loom_llm_cache *c)
{
    if (!c)
        return;
    loom_buf_free(&c->msgs);
    loom_buf_free(&c->tools);
    loom_buf_free(&c->body);
    free(c->items);
    free(c->defs);
    free(c);
}

/* Whether the text cached for k still stands for messages[i] of req:
 * the same message, still ending (or not) a run of results with images,
 * whose earlier messages are checked before it. */
static int same_msg(const cached_msg *k, const loom_llm_request *req, size_t i)
{
    const loom_message *m = &req->messages[i];
    size_t from;

    return k->role == m->role && k->content == m->content &&
           k->tool_call_id == m->tool_call_id &&
           k->tool_calls == m->tool_calls &&
           k->tool_calls_len == m->tool_calls_len && k->parts == m->parts &&
           k->ends_images == images_after(req, i, &from);
}

/* Brings the cached message text up to req's messages: keeps the longest
 * unchanged prefix, encodes the rest. */
static int cache_messages(loom_llm_cache *c, const loom_llm_request *req)
{
    size_t k = 0;
    int rc;

    while (k < c->len && k < req->messages_len &&
           same_msg(&c->items[k], req, k))
        k++;
    if (k < c->len) {
        c->msgs.len = k ? c->items[k - 1].end : 0;
        if (c->msgs.ptr)
            c->msgs.ptr[c->msgs.len] = '\0';
        c->len = k;
    }
    if (req->messages_len > c->cap) {
        /* Sized to the request, then doubled: a stream's call caches
         * its few messages for as long as it streams. */
        size_t cap = c->cap ? c->cap * 2 : 2;
        cached_msg *items;
        while (cap < req->messages_len)
            cap *= 2;
        if (!(items = realloc(c->items, cap * sizeof(*items))))
            return loom__error_oom();
        c->items = items;
        c->cap = cap;
    }
    for (; c->len < req->messages_len; c->len++) {
        const loom_message *m = &req->messages[c->len];
        cached_msg *it = &c->items[c->len];
        size_t from;
        if ((c->len && (rc = loom_buf_putc(&c->msgs, ','))) ||
            (rc = put_entry(&c->msgs, req, c->len))) {
            /* Forget the message half written. */
            c->msgs.len = c->len ? c->items[c->len - 1].end : 0;
            if (c->msgs.ptr)
                c->msgs.ptr[c->msgs.len] = '\0';
            return rc;
        }
        it->role = m->role;
        it->content = m->content;
        it->tool_call_id = m->tool_call_id;
        it->tool_calls = m->tool_calls;
        it->tool_calls_len = m->tool_calls_len;
        it->parts = m->parts;
        it->ends_images = images_after(req, c->len, &from);
        it->end = c->msgs.len;
    }
    return 0;
}

static int cache_tools(loom_llm_cache *c, const loom_llm_request *req)
{
    size_t n = req->tools_len;
    loom_tool_def *defs;
    int rc;

    if (c->has_tools && c->ndefs == n &&
        memcmp(c->defs, req->tools, n * sizeof(*defs)) == 0)
        return 0;
    c->has_tools = 0;
    loom_buf_clear(&c->tools);
    if (!(defs = realloc(c->defs, n * sizeof(*defs))))
        return loom__error_oom();
    c->defs = defs;
    if ((rc = put_tools(&c->tools, req->tools, n)) != 0)
        return rc;
    memcpy(c->defs, req->tools, n * sizeof(*defs));
    c->ndefs = n;
    c->has_tools = 1;
    return 0;
}

/* The client's parameters as members of the body's object: a few small
 * values, rarely given, so built as JSON and written out. */
static int put_params(loom_buf *out, const loom_llm_params *p)
{
    json_t *o, *v;
    const char *key;
    int rc = 0;

    if (!loom_llm_params_any(p))
        return 0;
    if (!(o = json_object()) || loom__params_put_openai(o, p)) {
        json_decref(o);
        return LOOM_ENOMEM;
    }
    json_object_foreach(o, key, v)
    {
        if ((rc = loom_buf_putc(out, ',')) || (rc = put_str(out, key)) ||
            (rc = loom_buf_putc(out, ':')) ||
            (rc = loom__llm_put_json_text(out, v)))
            break;
    }
    json_decref(o);
    return rc;
}

int loom__openai_body_text(loom_buf *out, const loom_llm_request *req,
                           loom_llm_cache *cache, const void *owner)
{
    const char *effort =
        loom__params_effort(req->params, req->reasoning_effort);
    int rc;

    loom_buf_clear(out);
    if ((rc = loom__llm_request_check(req)) != 0)
        return rc;
    /* json_real() refuses what JSON cannot say: the old builder's OOM. */
    if (req->temperature >= 0 && !isfinite(req->temperature))
        return loom__error_oom();
    if (cache && cache->owner != owner) {
        cache_forget(cache);
        cache->owner = owner;
    }
    if ((rc = put_lit(out, "{\"model\":")) || (rc = put_str(out, req->model)) ||
        (rc = put_lit(out, ",\"messages\":[")))
        goto cleanup;
    if (cache) {
        if ((rc = cache_messages(cache, req)) ||
            (rc = loom_buf_put(out, cache->msgs.ptr ? cache->msgs.ptr : "",
                               cache->msgs.len)))
            goto cleanup;
    } else {
        for (size_t i = 0; i < req->messages_len; i++)
            if ((i && (rc = loom_buf_putc(out, ','))) ||
                (rc = put_entry(out, req, i)))
                goto cleanup;
    }
    if ((rc = loom_buf_putc(out, ']')))
        goto cleanup;
    if (req->tools_len) {
        if ((rc = put_lit(out, ",\"tools\":")))
            goto cleanup;
        if (cache && !(rc = cache_tools(cache, req)))
            rc = loom_buf_put(out, cache->tools.ptr, cache->tools.len);
        else if (!cache)
            rc = put_tools(out, req->tools, req->tools_len);
        if (rc || (rc = put_lit(out, ",\"tool_choice\":")) ||
            (rc = put_tool_choice(out, &req->tool_choice)))
            goto cleanup;
        if (req->parallel_tool_calls >= 0 &&
            (rc = put_lit(out, req->parallel_tool_calls
                                   ? ",\"parallel_tool_calls\":true"
                                   : ",\"parallel_tool_calls\":false")))
            goto cleanup;
    }
    /* Not snprintf: printf's frames, a few KiB deep, are the deepest
     * of a stream's fiber. */
    if (req->max_tokens > 0 &&
        ((rc = put_lit(out, ",\"")) ||
         (rc = put_lit(out, max_tokens_field(req))) ||
         (rc = put_lit(out, "\":")) ||
         (rc = loom__json_put_int(out, (json_int_t)req->max_tokens))))
        goto cleanup;
    if (req->temperature >= 0) {
        json_t *t = json_real(req->temperature);
        rc = !t || put_lit(out, ",\"temperature\":") ||
             loom__llm_put_json_text(out, t);
        json_decref(t);
        if (rc)
            goto cleanup;
    }
    if (effort && ((rc = put_lit(out, ",\"reasoning_effort\":")) ||
                   (rc = put_str(out, effort))))
        goto cleanup;
    if ((rc = put_params(out, req->params)))
        goto cleanup;
    if (req->stream && (rc = put_lit(out, ",\"stream\":true,\"stream_options\":"
                                          "{\"include_usage\":true}")))
        goto cleanup;
    rc = loom_buf_putc(out, '}');

cleanup:
    if (rc) {
        loom_buf_clear(out);
        /* Every failure above is a failed allocation. */
        return loom__error_oom();
    }
    return 0;
}

/* ---- error answers --------------------------------------------------- */

loom_upstream_kind loom__openai_status_kind(long status)
{
    return loom__llm_status_kind(status);
}

int loom__openai_status_retryable(long status)
{
    return loom__llm_status_retryable(status);
}

/* The raw body as a message (*start, length returned): cut on a UTF-8
 * boundary, blanks trimmed. */
static size_t raw_message(const char *body, size_t len, const char **start)
{
    size_t n = loom__utf8_cut(body, len, LOOM_OPENAI_MAX_ERROR_TEXT);

    while (n > 0 && (body[n - 1] == '\n' || body[n - 1] == '\r' ||
                     body[n - 1] == ' ' || body[n - 1] == '\t'))
        n--;
    while (n > 0 && (*body == '\n' || *body == '\r' || *body == ' ')) {
        body++;
        n--;
    }
    *start = body;
    return n;
}

void loom__openai_error_fields(const json_t *o, const char **msg,
                               const char **type)
{
    const json_t *e = json_object_get(o, "error");

    *msg = *type = NULL;
    if (json_is_object(e)) {
        *msg = loom__llm_jstr(e, "message");
        *type = loom__llm_jstr(e, "type");
        if (!*type)
            *type = loom__llm_jstr(e, "code");
    } else if (json_is_string(e)) {
        *msg = json_string_value(e);
    } else if (json_is_object(o)) {
        /* vLLM: {"object": "error", "message": ..} */
        *msg = loom__llm_jstr(o, "message");
        *type = loom__llm_jstr(o, "type");
    }
}

int loom__openai_error_from_http(loom_upstream_error *err, long status,
                                 const char *body, size_t len,
                                 const char *request_id)
{
    json_t *o = body && len ? json_loadb(body, len, 0, NULL) : NULL;
    const json_t *e = json_object_get(o, "error");
    const json_t *detail = json_object_get(o, "detail");
    const char *msg, *type;
    char *dumped = NULL;
    size_t n = 0;
    int rc;

    loom__openai_error_fields(o, &msg, &type);
    /* FastAPI: {"detail": ...}, a string or anything else. */
    if (!msg && detail && !json_is_object(e) && !json_is_string(e))
        msg = json_is_string(detail)
                  ? json_string_value(detail)
                  : (dumped = json_dumps(detail, JSON_COMPACT));
    if (msg && *msg)
        n = strlen(msg);
    else if (body && len)
        n = raw_message(body, len, &msg);
    if (!n)
        msg = NULL; /* "HTTP <status>" */
    rc = loom__llm_error_set(err, loom__llm_status_kind(status), status, msg, n,
                             type && *type ? type : NULL, request_id);
    free(dumped);
    json_decref(o);
    return rc;
}

/* ---- the adapter ----------------------------------------------------- */

void loom__openai_provider_set_limits(loom_provider *base,
                                      const loom__openai_limits *limits)
{
    openai_provider *p = (openai_provider *)base;

    p->limits = *limits;
}

static size_t max_body(const loom__llm_adapter *a)
{
    const openai_provider *p = (const openai_provider *)a;
    size_t text =
        p->limits.max_text ? p->limits.max_text : LOOM_OPENAI_MAX_TEXT;

    return p->limits.max_body ? p->limits.max_body
                              : 2 * text + ((size_t)1 << 20);
}

/* The body as text; with a cache, into its buffer: the body's memory is
 * reused call after call. */
static int build_text(const loom__llm_adapter *a, const loom_llm_request *req,
                      loom_buf **body)
{
    if (req->cache)
        *body = loom__openai_cache_body(req->cache);
    return loom__openai_body_text(*body, req, req->cache, a);
}

/* The decoder as the shared attempt loop (llm/attempt.h) drives it. */
static int op_new(void **out, void *payload)
{
    const loom__llm_decoder_args *x = payload;
    const openai_provider *p = (const openai_provider *)x->adapter;
    loom__openai_decoder *d = NULL;
    int rc = loom__openai_decoder_new(&d, &p->limits, x->cb, x->payload);

    *out = d;
    return rc;
}

static const loom__llm_adapter_spec openai_spec = {
    .kind = "openai",
    .path = "/chat/completions",
    .key_header = "Authorization",
    .key_prefix = "Bearer ",
    .build_text = build_text,
    .max_body = max_body,
    .decoder_new = op_new,
    .error_from_http = loom__openai_error_from_http,
};

int loom_provider_openai_new(loom_provider **out,
                             const loom_provider_config *config)
{
    return loom__llm_adapter_new(out, sizeof(openai_provider), &openai_spec,
                                 config);
}
