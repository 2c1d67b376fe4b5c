/*
 * The OpenAI Chat Completions adapter (provider kind "openai"): any server
 * that speaks POST {base_url}/chat/completions, which includes OpenAI,
 * Azure-style gateways, vLLM, llama.cpp's server, Ollama and most proxies.
 *
 * This file does the parts with I/O and policy: building the request body
 * and headers, and sending through the attempt loop every HTTP adapter
 * shares (llm/attempt.c), which classifies failures into
 * loom_upstream_error and retries. Retries happen only while nothing has
 * reached the caller's callback (a retried answer would show text twice),
 * on 408, 409, 429, 5xx, a connection that failed or dropped, and a
 * connect timeout; the server's retry-after-ms / Retry-After wins over
 * loom's backoff, up to LOOM_RETRY_MAX_HONOURED_MS. Decoding the answer
 * is llm/openai_stream.c's job, which does no I/O.
 */
#include "llm/openai.h"
#include "core/error.h"
#include "core/http.h"
#include "llm/attempt.h"
#include "loom/buf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef struct {
    loom_provider base;
    char *url;
    char **headers; /* fixed request header lines */
    size_t headers_len;
    int has_accept; /* the config sets Accept itself */
    /* The lines of a request: headers, then Accept unless the config
     * has one; for a streamed and for a JSON answer. */
    const char **stream_headers, **json_headers;
    size_t request_headers_len;
    long connect_ms, first_byte_ms, idle_ms;
    int max_retries;
    long base_delay_ms, max_delay_ms;
    loom__openai_limits limits;
    loom__http_pool *pool;
} openai_provider;

/* ---- request body ---------------------------------------------------- */

/*
 * jansson refuses strings that are not UTF-8, but message content (tool
 * output above all) may hold any bytes: replace each invalid byte with
 * U+FFFD rather than fail the call. Written by hand because jansson has no
 * lossy mode.
 */
static json_t *utf8_string(const char *s)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    json_t *j = json_string((const char *)p);
    size_t i = 0, n, len;

    if (j)
        return j;
    len = strlen((const char *)p);
    while (i < len) {
        unsigned c = p[i];
        unsigned cp = 0;
        n = c < 0x80         ? 1
            : (c >> 5) == 6  ? 2
            : (c >> 4) == 14 ? 3
            : (c >> 3) == 30 ? 4
                             : 0;
        if (n > 1 && i + n <= len) {
            cp = c & (0x7F >> n);
            for (size_t k = 1; k < n; k++) {
                if ((p[i + k] & 0xC0) != 0x80) {
                    n = 0;
                    break;
                }
                cp = (cp << 6) | (p[i + k] & 0x3F);
            }
            if (n && ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) ||
                      (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
                      (cp >= 0xD800 && cp <= 0xDFFF)))
                n = 0;
        } else if (n > 1) {
            n = 0;
        }
        if (n == 0) {
            if (loom_buf_put(&b, "\xEF\xBF\xBD", 3))
                break;
            i++;
        } else {
            if (loom_buf_put(&b, p + i, n))
                break;
            i += n;
        }
    }
    j = i >= len ? json_string(loom_buf_cstr(&b)) : NULL;
    loom_buf_free(&b);
    return j;
}

/* Sets o[key] = v, stealing v; -1 when v is NULL or on OOM. */
static int put(json_t *o, const char *key, json_t *v)
{
    if (!v)
        return -1;
    return json_object_set_new(o, key, v);
}

static json_t *tool_call_json(const loom_tool_call *c)
{
    const char *args = c->arguments && *c->arguments ? c->arguments : "{}";
    json_t *fn = json_object();

    if (!fn || put(fn, "name", utf8_string(c->name)) ||
        put(fn, "arguments", utf8_string(args))) {
        json_decref(fn);
        return NULL;
    }
    return json_pack("{s:o,s:s,s:o}", "id", utf8_string(c->id), "type",
                     "function", "function", fn);
}

static json_t *message_json(const loom_message *m)
{
    json_t *o = json_object(), *calls;
    int bad = !o;

    if (bad)
        return NULL;
    bad |= put(o, "role", json_string(loom_role_name(m->role)));
    switch (m->role) {
    case LOOM_ROLE_ASSISTANT:
        /* OpenAI wants null, not "", beside tool calls. */
        if ((!m->content || !*m->content) && m->tool_calls_len)
            bad |= put(o, "content", json_null());
        else
            bad |= put(o, "content", utf8_string(m->content));
        if (!m->tool_calls_len)
            break;
        bad |= put(o, "tool_calls", calls = json_array());
        for (size_t i = 0; !bad && i < m->tool_calls_len; i++)
            bad |=
                json_array_append_new(calls, tool_call_json(&m->tool_calls[i]));
        break;
    case LOOM_ROLE_TOOL:
        bad |= put(o, "tool_call_id", utf8_string(m->tool_call_id));
        bad |= put(o, "content", utf8_string(m->content));
        break;
    default:
        bad |= put(o, "content", utf8_string(m->content));
        break;
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
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
    if (put(fn, "parameters", params) ||
        put(fn, "name", utf8_string(t->name)) ||
        (t->description &&
         put(fn, "description", utf8_string(t->description)))) {
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
                         "name", utf8_string(tc->function));
    default:
        return json_string("auto");
    }
}

int loom__openai_build_body(json_t **out, const loom_llm_request *req)
{
    json_t *body = NULL, *arr;
    int bad = 0;

    *out = NULL;
    if (!req->model || !*req->model)
        return loom__error_set(LOOM_EINVALID, "request has no model");
    if (req->tools_len && req->tool_choice.kind == LOOM_TOOL_CHOICE_FUNCTION &&
        (!req->tool_choice.function || !*req->tool_choice.function))
        return loom__error_set(LOOM_EINVALID, "tool choice names no function");
    if (!(body = json_object()))
        return loom__error_oom();
    bad |= put(body, "model", utf8_string(req->model));
    bad |= put(body, "messages", arr = json_array());
    for (size_t i = 0; !bad && i < req->messages_len; i++)
        bad |= json_array_append_new(arr, message_json(&req->messages[i]));
    if (!bad && req->tools_len) {
        bad |= put(body, "tools", arr = json_array());
        for (size_t i = 0; !bad && i < req->tools_len; i++)
            bad |= json_array_append_new(arr, tool_json(&req->tools[i]));
        bad |= put(body, "tool_choice", tool_choice_json(&req->tool_choice));
        if (req->parallel_tool_calls >= 0)
            bad |= put(body, "parallel_tool_calls",
                       json_boolean(req->parallel_tool_calls));
    }
    if (req->max_tokens > 0)
        bad |= put(body, "max_tokens", json_integer(req->max_tokens));
    if (req->temperature >= 0)
        bad |= put(body, "temperature", json_real(req->temperature));
    if (req->reasoning_effort && *req->reasoning_effort)
        bad |=
            put(body, "reasoning_effort", utf8_string(req->reasoning_effort));
    if (req->stream) {
        bad |= put(body, "stream", json_true());
        bad |=
            put(body, "stream_options", json_pack("{s:b}", "include_usage", 1));
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
 * The length of the valid UTF-8 sequence at p, by utf8_string()'s rules
 * (which are jansson's), or 0 when the byte at p is not the start of one.
 * p is NUL-terminated, which no continuation byte matches.
 */
static size_t lossy_seq(const unsigned char *p)
{
    unsigned c = p[0], cp;
    size_t n = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;

    if (!n)
        return 0;
    cp = c & (0x7Fu >> n);
    for (size_t k = 1; k < n; k++) {
        if ((p[k] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[k] & 0x3F);
    }
    if ((n == 2 && cp < 0x80) || (n == 3 && cp < 0x800) ||
        (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n;
}

/*
 * Appends s (NULL: "") as a JSON string: exactly what json_dumps() writes
 * for utf8_string(s), that is each byte that is not valid UTF-8 replaced
 * by U+FFFD, and '"', '\\' and control bytes escaped as jansson escapes
 * them (\b \f \n \r \t, else \u00XX). By hand because jansson has no lossy
 * mode and encodes only values it has built.
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
        if (c >= 0x80 && (n = lossy_seq(p + i)) != 0) {
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
                memcpy(esc, "\\u00", 4);
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
        /* fall through */
    default:
        if (!rc && !(rc = put_lit(b, ",\"content\":")))
            rc = put_str(b, m->content);
        break;
    }
    return rc ? rc : loom_buf_putc(b, '}');
}

static int dump_to_buf(const char *s, size_t len, void *payload)
{
    return loom_buf_put(payload, s, len) ? -1 : 0;
}

/* Appends v as json_dumps() with the body's flags writes it. */
static int put_json(loom_buf *b, const json_t *v)
{
    if (json_dump_callback(v, dump_to_buf, b,
                           JSON_COMPACT | JSON_REAL_PRECISION(15) |
                               JSON_ENCODE_ANY) != 0)
        return loom__error_oom();
    return 0;
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
            rc = put_json(b, t->parameters);
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
    size_t end; /* msgs.len just after this message's text */
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

static int same_msg(const cached_msg *k, const loom_message *m)
{
    return k->role == m->role && k->content == m->content &&
           k->tool_call_id == m->tool_call_id &&
           k->tool_calls == m->tool_calls &&
           k->tool_calls_len == m->tool_calls_len;
}

/* Brings the cached message text up to req's messages: keeps the longest
 * unchanged prefix, encodes the rest. */
static int cache_messages(loom_llm_cache *c, const loom_llm_request *req)
{
    size_t k = 0;
    int rc;

    while (k < c->len && k < req->messages_len &&
           same_msg(&c->items[k], &req->messages[k]))
        k++;
    if (k < c->len) {
        c->msgs.len = k ? c->items[k - 1].end : 0;
        if (c->msgs.ptr)
            c->msgs.ptr[c->msgs.len] = '\0';
        c->len = k;
    }
    if (req->messages_len > c->cap) {
        size_t cap = c->cap ? c->cap : 16;
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
        if ((c->len && (rc = loom_buf_putc(&c->msgs, ','))) ||
            (rc = put_message(&c->msgs, m))) {
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

int loom__openai_body_text(loom_buf *out, const loom_llm_request *req,
                           loom_llm_cache *cache, const void *owner)
{
    char num[48];
    int rc;

    loom_buf_clear(out);
    if (!req->model || !*req->model)
        return loom__error_set(LOOM_EINVALID, "request has no model");
    if (req->tools_len && req->tool_choice.kind == LOOM_TOOL_CHOICE_FUNCTION &&
        (!req->tool_choice.function || !*req->tool_choice.function))
        return loom__error_set(LOOM_EINVALID, "tool choice names no function");
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
                (rc = put_message(out, &req->messages[i])))
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
    if (req->max_tokens > 0) {
        snprintf(num, sizeof(num), ",\"max_tokens\":%" JSON_INTEGER_FORMAT,
                 (json_int_t)req->max_tokens);
        if ((rc = put_lit(out, num)))
            goto cleanup;
    }
    if (req->temperature >= 0) {
        json_t *t = json_real(req->temperature);
        rc = !t || put_lit(out, ",\"temperature\":") || put_json(out, t);
        json_decref(t);
        if (rc)
            goto cleanup;
    }
    if (req->reasoning_effort && *req->reasoning_effort &&
        ((rc = put_lit(out, ",\"reasoning_effort\":")) ||
         (rc = put_str(out, req->reasoning_effort))))
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
    switch (status) {
    case 400:
        return LOOM_UPSTREAM_BAD_REQUEST;
    case 401:
        return LOOM_UPSTREAM_AUTH;
    case 403:
        return LOOM_UPSTREAM_PERMISSION;
    case 404:
        return LOOM_UPSTREAM_NOT_FOUND;
    case 408:
        return LOOM_UPSTREAM_TIMEOUT;
    case 409:
        return LOOM_UPSTREAM_CONFLICT;
    case 413:
        return LOOM_UPSTREAM_TOO_LARGE;
    case 422:
        return LOOM_UPSTREAM_UNPROCESSABLE;
    case 429:
        return LOOM_UPSTREAM_RATE_LIMIT;
    default:
        break;
    }
    if (status >= 200 && status < 300)
        return LOOM_UPSTREAM_NONE;
    if (status >= 500 && status < 600)
        return LOOM_UPSTREAM_SERVER;
    if (status >= 400 && status < 500)
        return LOOM_UPSTREAM_BAD_REQUEST;
    return LOOM_UPSTREAM_PROTOCOL;
}

int loom__openai_status_retryable(long status)
{
    return status == 408 || status == 409 || status == 429 ||
           (status >= 500 && status < 600);
}

/* The raw body as a message: cut on a UTF-8 boundary, blanks trimmed. */
static char *raw_message(const char *body, size_t len)
{
    size_t n = len;

    if (n > LOOM_OPENAI_MAX_ERROR_TEXT) {
        n = LOOM_OPENAI_MAX_ERROR_TEXT;
        while (n > 0 && ((unsigned char)body[n] & 0xC0) == 0x80)
            n--;
    }
    while (n > 0 && (body[n - 1] == '\n' || body[n - 1] == '\r' ||
                     body[n - 1] == ' ' || body[n - 1] == '\t'))
        n--;
    while (n > 0 && (*body == '\n' || *body == '\r' || *body == ' ')) {
        body++;
        n--;
    }
    return n ? strndup(body, n) : NULL;
}

int loom__openai_error_from_http(loom_upstream_error *err, long status,
                                 const char *body, size_t len,
                                 const char *request_id)
{
    json_t *o = body && len ? json_loadb(body, len, 0, NULL) : NULL;
    json_t *e = json_object_get(o, "error"), *detail;
    const char *msg = NULL, *type = NULL;
    char *dumped = NULL;
    int rc = 0;

    loom__upstream_error_clear(err);
    err->kind = loom__openai_status_kind(status);
    err->http_status = (int)status;
    if (json_is_object(e)) {
        msg = json_string_value(json_object_get(e, "message"));
        type = json_string_value(json_object_get(e, "type"));
        if (!type)
            type = json_string_value(json_object_get(e, "code"));
    } else if (json_is_string(e)) {
        msg = json_string_value(e);
    } else if (json_is_object(o)) {
        /* vLLM: {"object":"error","message":..}; FastAPI: {"detail":..} */
        msg = json_string_value(json_object_get(o, "message"));
        type = json_string_value(json_object_get(o, "type"));
        detail = json_object_get(o, "detail");
        if (!msg && json_is_string(detail))
            msg = json_string_value(detail);
        else if (!msg && detail)
            msg = dumped = json_dumps(detail, JSON_COMPACT);
    }
    if (msg && *msg)
        err->message = strdup(msg);
    else if (body && len)
        err->message = raw_message(body, len);
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

static size_t max_body(const openai_provider *p)
{
    size_t text =
        p->limits.max_text ? p->limits.max_text : LOOM_OPENAI_MAX_TEXT;

    return p->limits.max_body ? p->limits.max_body
                              : 2 * text + ((size_t)1 << 20);
}

/* The decoder as the shared attempt loop (llm/attempt.h) drives it. */
typedef struct {
    const loom__openai_limits *limits;
    loom_llm_event_cb cb;
    void *payload;
} decoder_args;

static int op_new(void **out, void *payload)
{
    decoder_args *a = payload;
    loom__openai_decoder *d = NULL;
    int rc = loom__openai_decoder_new(&d, a->limits, a->cb, a->payload);

    *out = d;
    return rc;
}

static void op_free(void *d)
{
    loom__openai_decoder_free(d);
}

static int op_feed(void *d, const char *data, size_t len)
{
    return loom__openai_decoder_feed(d, data, len);
}

static int op_finish(void *d)
{
    return loom__openai_decoder_finish(d);
}

static int op_complete(void *d, const char *body, size_t len)
{
    return loom__openai_decoder_complete(d, body, len);
}

static int op_started(const void *d)
{
    return loom__openai_decoder_output_started(d);
}

static const loom_upstream_error *op_error(const void *d)
{
    return loom__openai_decoder_error(d);
}

static int op_export(void *d, loom_llm_response *resp)
{
    return loom__openai_decoder_export(d, resp);
}

static const loom__llm_decoder_ops decoder_ops = {
    op_new,
    op_free,
    op_feed,
    op_finish,
    op_complete,
    op_started,
    op_error,
    op_export,
    loom__openai_error_from_http,
    loom__openai_status_retryable,
    NULL, /* an error inside the stream is never retried */
};

static int openai_complete(loom_provider *base, const loom_llm_request *req,
                           loom_llm_event_cb cb, void *payload,
                           loom_llm_response *resp, loom_cancel *cancel)
{
    openai_provider *p = (openai_provider *)base;
    decoder_args da = {&p->limits, cb, payload};
    loom__llm_attempts_opts o = {0};
    loom__http_request hreq = {0};
    loom_buf own = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    /* With a cache, its buffer: the body's memory is reused call after
     * call. */
    loom_buf *body = req->cache ? loom__openai_cache_body(req->cache) : &own;
    int rc;

    resp->error.attempts = 0;
    if ((rc = loom__openai_body_text(body, req, req->cache, p)) != 0) {
        if (!resp->text && !(resp->text = strdup("")))
            rc = loom__error_oom();
        goto cleanup;
    }
    hreq.method = "POST";
    hreq.url = p->url;
    hreq.headers = req->stream ? p->stream_headers : p->json_headers;
    hreq.headers_len = p->request_headers_len;
    hreq.body = body->ptr;
    hreq.body_len = body->len;
    hreq.connect_timeout_ms = p->connect_ms;
    hreq.first_byte_timeout_ms = p->first_byte_ms;
    hreq.idle_timeout_ms = p->idle_ms;
    hreq.max_body = max_body(p);
    hreq.cancel = cancel;
    o.name = p->base.name;
    o.pool = p->pool;
    o.http = &hreq;
    o.stream = req->stream;
    o.max_json_body = max_body(p);
    o.max_retries = p->max_retries;
    o.base_delay_ms = p->base_delay_ms;
    o.max_delay_ms = p->max_delay_ms;
    o.ops = &decoder_ops;
    o.payload = &da;
    rc = loom__llm_attempts(&o, resp);

cleanup:
    loom_buf_free(&own);
    return rc;
}

static void openai_free(loom_provider *base)
{
    openai_provider *p = (openai_provider *)base;

    loom__http_pool_free(p->pool);
    for (size_t i = 0; i < p->headers_len; i++)
        free(p->headers[i]);
    free(p->headers);
    free(p->stream_headers);
    free(p->json_headers);
    free(p->url);
    free(p->base.name);
    free(p);
}

static const loom_provider_vtable openai_vtable = {openai_complete,
                                                   openai_free};

static int add_header(openai_provider *p, const char *name, const char *prefix,
                      const char *value)
{
    char *line;

    if (asprintf(&line, "%s: %s%s", name, prefix, value) < 0)
        return loom__error_oom();
    p->headers[p->headers_len++] = line;
    return 0;
}

static int build_headers(openai_provider *p, const loom_provider_config *c,
                         const char *name)
{
    const json_t *h = json_is_object(c->headers) ? c->headers : NULL;
    const char *k;
    json_t *v;
    char ua[64], num[32];
    int rc = 0;

    p->headers = calloc(json_object_size(h) + 3, sizeof(*p->headers));
    if (!p->headers)
        return loom__error_oom();
    if (c->api_key && *c->api_key &&
        !loom__llm_config_has_header(h, "Authorization")) {
        if (strpbrk(c->api_key, "\r\n"))
            return loom__error_set(
                LOOM_EINVALID, "provider '%s': api_key has a line break", name);
        if ((rc = add_header(p, "Authorization", "Bearer ", c->api_key)))
            return rc;
    }
    if (!loom__llm_config_has_header(h, "Content-Type") &&
        (rc = add_header(p, "Content-Type", "", "application/json")))
        return rc;
    snprintf(ua, sizeof(ua), "loom/%s", loom_version());
    if (!loom__llm_config_has_header(h, "User-Agent") &&
        (rc = add_header(p, "User-Agent", "", ua)))
        return rc;
    p->has_accept = loom__llm_config_has_header(h, "Accept");
    json_object_foreach((json_t *)h, k, v)
    {
        const char *s = json_string_value(v);
        if (json_is_integer(v)) {
            snprintf(num, sizeof(num), "%lld",
                     (long long)json_integer_value(v));
            s = num;
        }
        if (!s || !loom__llm_header_ok(k, s))
            return loom__error_set(LOOM_EINVALID,
                                   "provider '%s': header '%s' must be a "
                                   "token name with a one-line string value",
                                   name, k);
        if ((rc = add_header(p, k, "", s)))
            return rc;
    }
    p->stream_headers = calloc(p->headers_len + 1, sizeof(char *));
    p->json_headers = calloc(p->headers_len + 1, sizeof(char *));
    if (!p->stream_headers || !p->json_headers)
        return loom__error_oom();
    for (size_t i = 0; i < p->headers_len; i++)
        p->stream_headers[i] = p->json_headers[i] = p->headers[i];
    p->request_headers_len = p->headers_len;
    if (!p->has_accept) {
        p->stream_headers[p->headers_len] = "Accept: text/event-stream";
        p->json_headers[p->headers_len] = "Accept: application/json";
        p->request_headers_len++;
    }
    return 0;
}

int loom_provider_openai_new(loom_provider **out,
                             const loom_provider_config *config)
{
    const char *name = config->name ? config->name : "openai";
    openai_provider *p;
    size_t n;
    int rc;

    *out = NULL;
    if (!config->base_url || !*config->base_url)
        return loom__error_set(LOOM_EINVALID, "provider '%s': no base_url",
                               name);
    if (!(p = calloc(1, sizeof(*p))))
        return loom__error_oom();
    p->base.vt = &openai_vtable;
    n = strlen(config->base_url);
    while (n > 0 && config->base_url[n - 1] == '/')
        n--;
    if (!(p->base.name = strdup(name)) ||
        asprintf(&p->url, "%.*s/chat/completions", (int)n, config->base_url) <
            0) {
        p->url = NULL;
        rc = loom__error_oom();
        goto fail;
    }
    if ((rc = build_headers(p, config, name)) != 0)
        goto fail;
    p->connect_ms = config->connect_timeout_ms;
    p->first_byte_ms = config->first_byte_timeout_ms;
    p->idle_ms = config->idle_timeout_ms;
    p->max_retries = config->max_retries > 0 ? config->max_retries : 0;
    p->base_delay_ms = config->retry_base_delay_ms;
    p->max_delay_ms = config->retry_max_delay_ms;
    if ((rc = loom__http_pool_new(&p->pool)) != 0)
        goto fail;
    *out = &p->base;
    return 0;

fail:
    openai_free(&p->base);
    return rc;
}
