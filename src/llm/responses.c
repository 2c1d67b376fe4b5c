/*
 * The OpenAI Responses API adapter (provider kind "openai-responses"):
 * POST {base_url}/responses, streamed.
 *
 * This file builds the request body from loom's provider-neutral request
 * and does the I/O through the attempt loop every HTTP adapter shares
 * (llm/attempt.c: retries before output starts, Retry-After, errors);
 * decoding the answer is llm/responses_stream.c's job, which does no I/O.
 *
 * The body differs from Chat Completions in shape more than in content:
 * the leading system messages become "instructions", the conversation is
 * a list of input items (messages, function_call, function_call_output),
 * tools are flat ({type, name, description, parameters, strict}), and two
 * things make a conversation cheaper or possible at all on reasoning
 * models. Chaining (loom_llm_request.chain_responses, seed 003 "Responses
 * API Optimization"): the API stores each response, and the next request
 * names it by previous_response_id and sends only what came after it.
 * Reasoning items: without chaining nothing is stored ("store": false),
 * so the reasoning items a response produced are kept in the assistant
 * message's provider_state (with their encrypted_content, which the
 * request asks for on reasoning models) and sent back on the next
 * request, where the API needs them beside the calls they led to.
 */
#include "llm/responses.h"
#include "core/error.h"
#include "core/http.h"
#include "llm/attempt.h"
#include "llm/openai.h"
#include "loom/buf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- request body ---------------------------------------------------- */

/* Appends item to arr, stealing it; -1 when item is NULL or on OOM. */
static int append(json_t *arr, json_t *item)
{
    return item ? json_array_append_new(arr, item) : -1;
}

/* Sets o[key] = v, stealing v; -1 when v is NULL or on OOM. */
static int put(json_t *o, const char *key, json_t *v)
{
    return v ? json_object_set_new(o, key, v) : -1;
}

/*
 * The object under "openai-responses" in an assistant message's
 * provider_state, borrowed from *root (which the caller releases), or
 * NULL when it has none (another provider's message, say) or the text is
 * not a JSON object: the message is then sent as plain text and calls.
 */
static const json_t *own_state(const loom_message *m, json_t **root)
{
    json_t *st;

    *root = NULL;
    if (m->role != LOOM_ROLE_ASSISTANT || !m->provider_state)
        return NULL;
    *root = json_loads(m->provider_state, 0, NULL);
    st = json_object_get(*root, LOOM_RESPONSES_KIND);
    if (!json_is_object(st)) {
        json_decref(*root);
        *root = NULL;
        return NULL;
    }
    return st;
}

/* {"type": "message", "role": role, "content": text} */
static json_t *text_item(const char *role, const char *text)
{
    json_t *o = json_pack("{s:s,s:s}", "type", "message", "role", role);

    if (o && put(o, "content", loom__llm_json_string(text))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* An assistant message item; with an id, in the output form the API gave
 * it in (the id pairs it with the reasoning item before it). */
static json_t *assistant_text_item(const char *text, const char *id)
{
    json_t *o;

    if (!id)
        return text_item("assistant", text);
    o = json_pack("{s:s,s:s,s:s,s:s,s:[{s:s,s:o,s:[]}]}", "type", "message",
                  "id", id, "role", "assistant", "status", "completed",
                  "content", "type", "output_text", "text",
                  loom__llm_json_string(text), "annotations");
    return o;
}

static json_t *call_item(const loom_tool_call *c, const char *id)
{
    const char *args = c->arguments && *c->arguments ? c->arguments : "{}";
    json_t *o = json_pack("{s:s}", "type", "function_call");

    if (o && ((id && put(o, "id", json_string(id))) ||
              put(o, "call_id", loom__llm_json_string(c->id)) ||
              put(o, "name", loom__llm_json_string(c->name)) ||
              put(o, "arguments", loom__llm_json_string(args)))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/*
 * Whether a kept reasoning item can go back: with its encrypted_content
 * anywhere, by its id alone only when the response was stored.
 */
static int reasoning_sendable(const json_t *e, int stored)
{
    return json_is_string(json_object_get(e, "encrypted_content")) ||
           (stored && json_is_string(json_object_get(e, "id")));
}

/* A kept reasoning item as an input item: only the fields the API
 * takes back. */
static json_t *reasoning_item(const json_t *e)
{
    const json_t *summary = json_object_get(e, "summary");
    const json_t *id = json_object_get(e, "id");
    const json_t *enc = json_object_get(e, "encrypted_content");
    json_t *o = json_pack("{s:s}", "type", "reasoning");

    if (o &&
        ((json_is_string(id) && put(o, "id", json_copy((json_t *)id))) ||
         put(o, "summary",
             json_is_array(summary) ? json_deep_copy(summary) : json_array()) ||
         (json_is_string(enc) &&
          put(o, "encrypted_content", json_copy((json_t *)enc))))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/*
 * The input items of an assistant message: in the order its response had
 * them (provider_state "output"), reasoning items that can be sent back,
 * the message text and the calls, carrying their item ids when every
 * reasoning item goes back too (an id pairs an item with the reasoning
 * before it; a lone half is refused); then whatever the state does not
 * list (a message from another provider lists nothing).
 */
static int assistant_items(json_t *input, const loom_message *m)
{
    json_t *root;
    const json_t *st = own_state(m, &root), *output, *e;
    int stored, ids = 1, sent_text = 0, bad = 0;
    int has_text = m->content && *m->content;
    unsigned char *used = NULL;
    size_t i;

    output = json_object_get(st, "output");
    stored = json_is_true(json_object_get(st, "store"));
    if (m->tool_calls_len && !(used = calloc(m->tool_calls_len, 1))) {
        json_decref(root);
        return -1;
    }
    json_array_foreach(output, i, e)
    {
        const char *type = json_string_value(json_object_get(e, "type"));
        if (type && !strcmp(type, "reasoning") &&
            !reasoning_sendable(e, stored))
            ids = 0;
    }
    json_array_foreach(output, i, e)
    {
        const char *type = json_string_value(json_object_get(e, "type"));
        const char *id =
            ids ? json_string_value(json_object_get(e, "id")) : NULL;
        const char *cid = json_string_value(json_object_get(e, "call_id"));

        if (bad || !type)
            continue;
        if (!strcmp(type, "reasoning") && reasoning_sendable(e, stored)) {
            bad = append(input, reasoning_item(e));
        } else if (!strcmp(type, "message") && has_text && !sent_text) {
            bad = append(input, assistant_text_item(m->content, id));
            sent_text = 1;
        } else if (!strcmp(type, "function_call") && cid) {
            for (size_t k = 0; k < m->tool_calls_len; k++) {
                if (used[k] || !m->tool_calls[k].id ||
                    strcmp(m->tool_calls[k].id, cid))
                    continue;
                bad = append(input, call_item(&m->tool_calls[k], id));
                used[k] = 1;
                break;
            }
        }
    }
    if (!bad && has_text && !sent_text)
        bad = append(input, assistant_text_item(m->content, NULL));
    for (size_t k = 0; !bad && k < m->tool_calls_len; k++)
        if (!used[k])
            bad = append(input, call_item(&m->tool_calls[k], NULL));
    free(used);
    json_decref(root);
    return bad;
}

static int message_items(json_t *input, const loom_message *m)
{
    json_t *o;

    switch (m->role) {
    case LOOM_ROLE_ASSISTANT:
        return assistant_items(input, m);
    case LOOM_ROLE_TOOL:
        o = json_pack("{s:s}", "type", "function_call_output");
        if (o && (put(o, "call_id", loom__llm_json_string(m->tool_call_id)) ||
                  put(o, "output", loom__llm_json_string(m->content)))) {
            json_decref(o);
            o = NULL;
        }
        return append(input, o);
    case LOOM_ROLE_SYSTEM:
        /* A system message amid the conversation (the run loop's "limit
         * reached" note) stays where it is, with the authority of the
         * instructions: the API's developer role. */
        return append(input, text_item("developer", m->content));
    default:
        return append(input, text_item("user", m->content));
    }
}

static json_t *tool_json(const loom_tool_def *t)
{
    json_t *o = json_pack("{s:s}", "type", "function");

    if (o && (put(o, "name", loom__llm_json_string(t->name)) ||
              (t->description &&
               put(o, "description", loom__llm_json_string(t->description))) ||
              put(o, "parameters",
                  t->parameters ? json_deep_copy(t->parameters)
                                : json_pack("{s:s,s:{}}", "type", "object",
                                            "properties")) ||
              put(o, "strict", json_false()))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *tool_choice_json(const loom_tool_choice *tc)
{
    json_t *o;

    switch (tc->kind) {
    case LOOM_TOOL_CHOICE_NONE:
        return json_string("none");
    case LOOM_TOOL_CHOICE_REQUIRED:
        return json_string("required");
    case LOOM_TOOL_CHOICE_FUNCTION:
        o = json_pack("{s:s}", "type", "function");
        if (o && put(o, "name", loom__llm_json_string(tc->function))) {
            json_decref(o);
            return NULL;
        }
        return o;
    default:
        return json_string("auto");
    }
}

/*
 * Where a chained request continues: the position of the last assistant
 * message and its response id (a new string), when it has one and the API
 * stored that response; else *id is NULL and everything is sent (an
 * unstored response cannot be named: previous_response_not_found).
 */
static int chain_point(const loom_llm_request *req, size_t *at, char **id)
{
    json_t *root;
    const json_t *st;
    const char *s;

    *id = NULL;
    for (size_t i = req->messages_len; i-- > 0;) {
        if (req->messages[i].role != LOOM_ROLE_ASSISTANT)
            continue;
        st = own_state(&req->messages[i], &root);
        s = json_string_value(json_object_get(st, "id"));
        if (s && *s && json_is_true(json_object_get(st, "store")) &&
            !(*id = strdup(s))) {
            json_decref(root);
            return -1;
        }
        *at = i;
        json_decref(root);
        break;
    }
    return 0;
}

/*
 * Whether the response is to be stored (and the request chained). With
 * chaining every one is, but the run loop's last permitted call: its
 * "limit reached" note (a system message after the tool results, with
 * tool_choice none) holds for that call only. Stored, it would stay in
 * the API's copy of the conversation, and the next run, chaining from the
 * answer, would read again that tools are no longer available. That call
 * goes unchained and unstored, and chain_point() then finds nothing to
 * chain from at its answer.
 */
static int stores(const loom_llm_request *req)
{
    size_t n = req->messages_len;

    if (!req->chain_responses)
        return 0;
    return !(n >= 2 && req->messages[n - 1].role == LOOM_ROLE_SYSTEM &&
             req->messages[n - 2].role == LOOM_ROLE_TOOL &&
             req->tool_choice.kind == LOOM_TOOL_CHOICE_NONE);
}

/* The leading system messages joined by blank lines, or NULL. */
static int instructions(const loom_llm_request *req, size_t *leading,
                        loom_buf *b)
{
    size_t i;

    for (i = 0;
         i < req->messages_len && req->messages[i].role == LOOM_ROLE_SYSTEM;
         i++) {
        const char *c = req->messages[i].content;
        if (!c || !*c)
            continue;
        if ((b->len && loom_buf_put(b, "\n\n", 2)) || loom_buf_puts(b, c))
            return -1;
    }
    *leading = i;
    return 0;
}

int loom__responses_build_body(json_t **out, const loom_llm_request *req)
{
    loom_buf instr = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    json_t *body = NULL, *input, *arr;
    size_t leading = 0, start, at = 0;
    char *prev = NULL;
    int store = stores(req);
    int bad = 0;

    *out = NULL;
    if (!req->model || !*req->model)
        return loom__error_set(LOOM_EINVALID, "request has no model");
    if (req->tools_len && req->tool_choice.kind == LOOM_TOOL_CHOICE_FUNCTION &&
        (!req->tool_choice.function || !*req->tool_choice.function))
        return loom__error_set(LOOM_EINVALID, "tool choice names no function");
    if (req->temperature >= 0 && !isfinite(req->temperature))
        return loom__error_set(LOOM_EINVALID, "temperature is not finite");
    if (instructions(req, &leading, &instr) ||
        (store && chain_point(req, &at, &prev)) || !(body = json_object())) {
        bad = 1;
        goto cleanup;
    }
    start = prev && at + 1 > leading ? at + 1 : leading;
    bad |= put(body, "model", loom__llm_json_string(req->model));
    if (instr.len)
        bad |= put(body, "instructions",
                   loom__llm_json_string(loom_buf_cstr(&instr)));
    if (prev)
        bad |= put(body, "previous_response_id", loom__llm_json_string(prev));
    bad |= put(body, "input", input = json_array());
    for (size_t i = start; !bad && i < req->messages_len; i++)
        bad |= message_items(input, &req->messages[i]);
    if (!bad && req->tools_len) {
        bad |= put(body, "tools", arr = json_array());
        for (size_t i = 0; !bad && i < req->tools_len; i++)
            bad |= append(arr, tool_json(&req->tools[i]));
        bad |= put(body, "tool_choice", tool_choice_json(&req->tool_choice));
        if (req->parallel_tool_calls >= 0)
            bad |= put(body, "parallel_tool_calls",
                       json_boolean(req->parallel_tool_calls));
    }
    if (req->max_tokens > 0)
        bad |= put(body, "max_output_tokens", json_integer(req->max_tokens));
    if (req->temperature >= 0)
        bad |= put(body, "temperature", json_real(req->temperature));
    if (req->reasoning_effort && *req->reasoning_effort)
        bad |= put(body, "reasoning",
                   json_pack("{s:s}", "effort", req->reasoning_effort));
    bad |= put(body, "store", json_boolean(store));
    /* Reasoning can only come back from an unstored response with its
     * encrypted content; only reasoning models have any to give (others
     * refuse the include). */
    if (!store && req->reasoning_effort && *req->reasoning_effort)
        bad |= put(body, "include",
                   json_pack("[s]", "reasoning.encrypted_content"));
    if (req->stream)
        bad |= put(body, "stream", json_true());

cleanup:
    loom_buf_free(&instr);
    free(prev);
    if (bad) {
        json_decref(body);
        return loom__error_oom();
    }
    *out = body;
    return 0;
}

/* ---- the adapter ----------------------------------------------------- */

typedef struct {
    loom_provider base;
    char *url;
    /* The header lines of a request: fixed ones, then Accept for a
     * streamed or a JSON answer unless the config sets Accept. */
    char **lines;
    size_t nlines;
    const char **stream_headers, **json_headers;
    size_t request_headers_len;
    long connect_ms, first_byte_ms, idle_ms;
    int max_retries;
    long base_delay_ms, max_delay_ms;
    loom__responses_limits limits;
    loom__http_pool *pool;
} responses_provider;

void loom__responses_provider_set_limits(loom_provider *base,
                                         const loom__responses_limits *lim)
{
    ((responses_provider *)base)->limits = *lim;
}

static size_t max_body(const responses_provider *p)
{
    size_t text =
        p->limits.max_text ? p->limits.max_text : LOOM_RESPONSES_MAX_TEXT;

    return p->limits.max_body ? p->limits.max_body
                              : 3 * text + ((size_t)1 << 20);
}

/* What the decoder of one attempt is made with. */
typedef struct {
    const responses_provider *p;
    int store;
    loom_llm_event_cb cb;
    void *payload;
} call_ctx;

static int dec_new(void **out, void *payload)
{
    call_ctx *c = payload;
    loom__responses_decoder *d;
    int rc = loom__responses_decoder_new(&d, &c->p->limits, c->store, c->cb,
                                         c->payload);

    *out = rc ? NULL : d;
    return rc;
}

static void dec_free(void *d)
{
    loom__responses_decoder_free(d);
}

static int dec_feed(void *d, const char *data, size_t len)
{
    return loom__responses_decoder_feed(d, data, len);
}

static int dec_finish(void *d)
{
    return loom__responses_decoder_finish(d);
}

static int dec_complete(void *d, const char *body, size_t len)
{
    return loom__responses_decoder_complete(d, body, len);
}

static int dec_started(const void *d)
{
    return loom__responses_decoder_output_started(d);
}

static const loom_upstream_error *dec_error(const void *d)
{
    return loom__responses_decoder_error(d);
}

static int dec_export(void *d, loom_llm_response *resp)
{
    return loom__responses_decoder_export(d, resp);
}

/* An in-stream server_error before any output is worth another try;
 * other in-stream errors (a bad request found late) are not. */
static int stream_error_retryable(const loom_upstream_error *err)
{
    return err->type && !strcmp(err->type, "server_error");
}

static const loom__llm_decoder_ops responses_ops = {
    dec_new,
    dec_free,
    dec_feed,
    dec_finish,
    dec_complete,
    dec_started,
    dec_error,
    dec_export,
    loom__openai_error_from_http,
    loom__openai_status_retryable,
    stream_error_retryable,
};

static int responses_complete(loom_provider *base, const loom_llm_request *req,
                              loom_llm_event_cb cb, void *payload,
                              loom_llm_response *resp, loom_cancel *cancel)
{
    responses_provider *p = (responses_provider *)base;
    loom__http_request hreq = {0};
    loom__llm_attempts_opts o = {0};
    call_ctx ctx = {p, stores(req), cb, payload};
    json_t *body = NULL;
    char *text = NULL;
    int rc;

    resp->error.attempts = 0;
    if ((rc = loom__responses_build_body(&body, req)) != 0)
        goto cleanup;
    /* Compact, as OpenAI's SDKs send it; reals with the precision a
     * temperature needs and no more. */
    if (!(text = json_dumps(body, JSON_COMPACT | JSON_REAL_PRECISION(15)))) {
        rc = loom__error_oom();
        goto cleanup;
    }
    hreq.method = "POST";
    hreq.url = p->url;
    hreq.headers = req->stream ? p->stream_headers : p->json_headers;
    hreq.headers_len = p->request_headers_len;
    hreq.body = text;
    hreq.body_len = strlen(text);
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
    o.ops = &responses_ops;
    o.payload = &ctx;
    rc = loom__llm_attempts(&o, resp);

cleanup:
    if (!resp->text && !(resp->text = strdup("")) && rc == 0)
        rc = loom__error_oom();
    json_decref(body);
    free(text);
    return rc;
}

static void responses_free(loom_provider *base)
{
    responses_provider *p = (responses_provider *)base;

    loom__http_pool_free(p->pool);
    for (size_t i = 0; i < p->nlines; i++)
        free(p->lines[i]);
    free(p->lines);
    free(p->stream_headers);
    free(p->json_headers);
    free(p->url);
    free(p->base.name);
    free(p);
}

static const loom_provider_vtable responses_vtable = {responses_complete,
                                                      responses_free};

/* ---- headers --------------------------------------------------------- */

static int add_line(responses_provider *p, const char *name, const char *prefix,
                    const char *value)
{
    char *line;

    if (asprintf(&line, "%s: %s%s", name, prefix, value) < 0)
        return loom__error_oom();
    p->lines[p->nlines++] = line;
    return 0;
}

/*
 * The same headers as the "openai" provider (docs/providers.md): loom's
 * defaults (Authorization: Bearer with a key, Content-Type, User-Agent),
 * each unless the config names it, then the config's own.
 */
static int build_headers(responses_provider *p, const loom_provider_config *c,
                         const char *name)
{
    const json_t *h = json_is_object(c->headers) ? c->headers : NULL;
    const char *k;
    json_t *v;
    char ua[64], num[32];
    int rc = 0;

    if (!(p->lines = calloc(json_object_size(h) + 3, sizeof(*p->lines))))
        return loom__error_oom();
    if (c->api_key && *c->api_key &&
        !loom__llm_config_has_header(h, "Authorization")) {
        if (strpbrk(c->api_key, "\r\n"))
            return loom__error_set(
                LOOM_EINVALID, "provider '%s': api_key has a line break", name);
        if ((rc = add_line(p, "Authorization", "Bearer ", c->api_key)))
            return rc;
    }
    if (!loom__llm_config_has_header(h, "Content-Type") &&
        (rc = add_line(p, "Content-Type", "", "application/json")))
        return rc;
    snprintf(ua, sizeof(ua), "loom/%s", loom_version());
    if (!loom__llm_config_has_header(h, "User-Agent") &&
        (rc = add_line(p, "User-Agent", "", ua)))
        return rc;
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
        if ((rc = add_line(p, k, "", s)))
            return rc;
    }
    p->stream_headers = calloc(p->nlines + 1, sizeof(char *));
    p->json_headers = calloc(p->nlines + 1, sizeof(char *));
    if (!p->stream_headers || !p->json_headers)
        return loom__error_oom();
    for (size_t i = 0; i < p->nlines; i++)
        p->stream_headers[i] = p->json_headers[i] = p->lines[i];
    p->request_headers_len = p->nlines;
    if (!loom__llm_config_has_header(h, "Accept")) {
        p->stream_headers[p->nlines] = "Accept: text/event-stream";
        p->json_headers[p->nlines] = "Accept: application/json";
        p->request_headers_len++;
    }
    return 0;
}

int loom_provider_responses_new(loom_provider **out,
                                const loom_provider_config *config)
{
    const char *name = config->name ? config->name : LOOM_RESPONSES_KIND;
    responses_provider *p;
    size_t n;
    int rc;

    *out = NULL;
    if (!config->base_url || !*config->base_url)
        return loom__error_set(LOOM_EINVALID, "provider '%s': no base_url",
                               name);
    if (!(p = calloc(1, sizeof(*p))))
        return loom__error_oom();
    p->base.vt = &responses_vtable;
    n = strlen(config->base_url);
    while (n > 0 && config->base_url[n - 1] == '/')
        n--;
    if (!(p->base.name = strdup(name)) ||
        asprintf(&p->url, "%.*s/responses", (int)n, config->base_url) < 0) {
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
    responses_free(&p->base);
    return rc;
}
