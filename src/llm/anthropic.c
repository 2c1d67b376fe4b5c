/*
 * The Anthropic Messages adapter (provider kind "anthropic"): POST
 * {base_url}/v1/messages with x-api-key and anthropic-version headers.
 *
 * This file maps loom's provider-neutral request onto the Messages API
 * and does the parts with I/O: the body, the headers, and the call through
 * the attempt loop that every adapter shares (llm/attempt.c: retries
 * before output only, Retry-After honoured). Decoding the answer is
 * llm/anthropic_stream.c's job, which does no I/O.
 *
 * The mapping has to bridge a few differences (docs/providers.md says
 * them for users): Anthropic has one system prompt and no system role in
 * the conversation, so leading system messages become `system` and later
 * ones (the run loop's "limit reached" note) user text; roles must
 * alternate and the results of one turn's tool calls must come back in one
 * user turn, so consecutive messages of a role are folded into one turn
 * with tool_result blocks first; thinking blocks come back from the
 * answer's provider_state unchanged and in their place; prompt-cache
 * breakpoints go on the tools, the system prompt and the last two user
 * turns (the API allows four).
 */
#include "llm/anthropic.h"
#include "core/error.h"
#include "core/http.h"
#include "llm/attempt.h"
#include "llm/openai.h" /* the shared HTTP error parser */
#include "loom/log.h"

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
    /* The lines of a request: headers, then Accept unless the config has
     * one; for a streamed and for a JSON answer. */
    const char **stream_headers, **json_headers;
    size_t request_headers_len;
    long connect_ms, first_byte_ms, idle_ms;
    int max_retries;
    long base_delay_ms, max_delay_ms;
    loom__anthropic_limits limits;
    loom__http_pool *pool;
} anthropic_provider;

/* ---- request body ---------------------------------------------------- */

#define ERROR_PREFIX "Error: "

static json_t *text_block(const char *s)
{
    return json_pack("{s:s,s:o}", "type", "text", "text",
                     loom__llm_json_string(s));
}

/*
 * Tool use ids must match [a-zA-Z0-9_-]+; a call made by another
 * provider (after a fallback) may have any id. The same mapping is applied
 * to the tool_use block and to its tool_result, so they still pair.
 */
static json_t *tool_id(const char *id)
{
    char *s;
    json_t *j;

    if (!id || !*id)
        return json_string("toolu_loom");
    if (!(s = strdup(id)))
        return NULL;
    for (char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
              (*p >= '0' && *p <= '9') || *p == '_' || *p == '-'))
            *p = '_';
    j = json_string(s);
    free(s);
    return j;
}

/* A call's arguments as the input object the API wants: {} when they are
 * not a JSON object (a model may produce anything). */
static json_t *tool_input(const char *args)
{
    json_t *j = args && *args ? json_loads(args, 0, NULL) : NULL;

    if (json_is_object(j))
        return j;
    json_decref(j);
    return json_object();
}

static json_t *tool_use_block(const loom_tool_call *c)
{
    return json_pack("{s:s,s:o,s:o,s:o}", "type", "tool_use", "id",
                     tool_id(c->id), "name", loom__llm_json_string(c->name),
                     "input", tool_input(c->arguments));
}

static int is_type(const json_t *block, const char *type)
{
    const char *t = json_string_value(json_object_get(block, "type"));

    return t && strcmp(t, type) == 0;
}

/*
 * Appends a block (stolen; NULL is a failed allocation) to the last turn
 * when it has this role, else to a new turn: consecutive messages of one
 * role become one turn. A tool_result goes after the turn's other
 * tool_results but before its text, as the API requires.
 */
static int add_block(json_t *turns, const char *role, json_t *blk)
{
    size_t n = json_array_size(turns), at;
    json_t *t = n ? json_array_get(turns, n - 1) : NULL, *content;

    if (!blk)
        return -1;
    if (!t || strcmp(json_string_value(json_object_get(t, "role")), role)) {
        t = json_pack("{s:s,s:[]}", "role", role, "content");
        if (json_array_append_new(turns, t) != 0) {
            json_decref(blk);
            return -1;
        }
    }
    content = json_object_get(t, "content");
    if (!is_type(blk, "tool_result"))
        return json_array_append_new(content, blk);
    for (at = 0; at < json_array_size(content) &&
                 is_type(json_array_get(content, at), "tool_result");
         at++)
        ;
    return json_array_insert_new(content, at, blk);
}

/* The block layout this adapter kept in an assistant message's
 * provider_state (a new reference), or NULL. */
static json_t *state_layout(const loom_message *m)
{
    json_t *root, *content;

    if (m->role != LOOM_ROLE_ASSISTANT || !m->provider_state)
        return NULL;
    root = json_loads(m->provider_state, 0, NULL);
    content = json_object_get(json_object_get(root, "anthropic"), "content");
    if (json_is_array(content))
        json_incref(content);
    else
        content = NULL;
    json_decref(root);
    return content;
}

static int has_thinking(const json_t *layout)
{
    size_t i;
    json_t *b;

    json_array_foreach(layout, i, b)
    {
        if (is_type(b, "thinking") || is_type(b, "redacted_thinking"))
            return 1;
    }
    return 0;
}

/*
 * An assistant message: its thinking blocks sent back verbatim, and its
 * text and tool calls where the layout says they stood; what the layout
 * does not place (a message from another provider has no layout) follows:
 * the text, then the calls in order.
 */
static int add_assistant(json_t *turns, const loom_message *m)
{
    json_t *layout = state_layout(m), *b;
    int text_done = !m->content || !*m->content, rc = 0;
    char *placed = calloc(m->tool_calls_len + 1, 1);
    size_t i;

    if (!placed) {
        json_decref(layout);
        return -1;
    }
    json_array_foreach(layout, i, b)
    {
        const char *id = json_string_value(json_object_get(b, "id"));
        if (rc)
            break;
        if (is_type(b, "thinking") || is_type(b, "redacted_thinking")) {
            rc = add_block(turns, "assistant", json_deep_copy(b));
        } else if (is_type(b, "text") && !text_done) {
            rc = add_block(turns, "assistant", text_block(m->content));
            text_done = 1;
        } else if (is_type(b, "tool_use") && id) {
            for (size_t k = 0; k < m->tool_calls_len; k++) {
                if (placed[k] || !m->tool_calls[k].id ||
                    strcmp(m->tool_calls[k].id, id) != 0)
                    continue;
                placed[k] = 1;
                rc = add_block(turns, "assistant",
                               tool_use_block(&m->tool_calls[k]));
                break;
            }
        }
    }
    if (!rc && !text_done)
        rc = add_block(turns, "assistant", text_block(m->content));
    for (size_t k = 0; !rc && k < m->tool_calls_len; k++)
        if (!placed[k])
            rc = add_block(turns, "assistant",
                           tool_use_block(&m->tool_calls[k]));
    free(placed);
    json_decref(layout);
    return rc;
}

static json_t *tool_result_block(const loom_message *m)
{
    json_t *b = json_pack("{s:s,s:o}", "type", "tool_result", "tool_use_id",
                          tool_id(m->tool_call_id));

    if (b && m->content && *m->content &&
        json_object_set_new(b, "content", loom__llm_json_string(m->content))) {
        json_decref(b);
        return NULL;
    }
    /* loom writes a failed tool's result as "Error: <why>" (see
     * agent/toolexec.c); loom_message has no flag of its own for it. */
    if (b && m->content &&
        strncmp(m->content, ERROR_PREFIX, strlen(ERROR_PREFIX)) == 0 &&
        json_object_set_new(b, "is_error", json_true())) {
        json_decref(b);
        return NULL;
    }
    return b;
}

/*
 * Whether thinking is sent. The API refuses it with a forced tool choice,
 * and refuses a tool loop whose last assistant turn (tool results follow
 * it) does not start with its thinking: a turn from another provider, or
 * from a call without thinking, has none to send back. Such calls go
 * without thinking.
 */
static int thinking_on(const loom_llm_request *req)
{
    if (req->thinking_budget <= 0)
        return 0;
    if (req->tools_len && (req->tool_choice.kind == LOOM_TOOL_CHOICE_REQUIRED ||
                           req->tool_choice.kind == LOOM_TOOL_CHOICE_FUNCTION))
        return 0;
    for (size_t i = req->messages_len; i-- > 0;) {
        const loom_message *m = &req->messages[i];
        json_t *layout;
        int ok;
        if (m->role == LOOM_ROLE_TOOL || m->role == LOOM_ROLE_SYSTEM)
            continue;
        if (m->role != LOOM_ROLE_ASSISTANT || !m->tool_calls_len)
            return 1;
        layout = state_layout(m);
        ok = has_thinking(layout);
        json_decref(layout);
        return ok;
    }
    return 1;
}

/* Sets cache_control on a block (the last one of an array when given an
 * array). */
static int mark_cache(json_t *v)
{
    json_t *b =
        json_is_array(v) ? json_array_get(v, json_array_size(v) - 1) : v;

    if (!json_is_object(b))
        return 0;
    return json_object_set_new(b, "cache_control",
                               json_pack("{s:s}", "type", "ephemeral"));
}

static json_t *tools_json(const loom_llm_request *req, int placeholder)
{
    json_t *arr = json_array(), *t;
    int bad = !arr;

    if (placeholder && !bad) {
        t = json_pack("{s:s,s:s,s:{s:s,s:{}}}", "name",
                      LOOM_ANTHROPIC_PLACEHOLDER_TOOL, "description",
                      "Not available: no tools can be called now.",
                      "input_schema", "type", "object", "properties");
        bad = json_array_append_new(arr, t) != 0;
    }
    for (size_t i = 0; !bad && i < req->tools_len; i++) {
        const loom_tool_def *d = &req->tools[i];
        t = json_pack("{s:o}", "name", loom__llm_json_string(d->name));
        bad = !t;
        if (!bad && d->description)
            bad = json_object_set_new(t, "description",
                                      loom__llm_json_string(d->description));
        if (!bad)
            bad = json_object_set_new(
                t, "input_schema",
                d->parameters
                    ? json_deep_copy(d->parameters)
                    : json_pack("{s:s,s:{}}", "type", "object", "properties"));
        if (bad)
            json_decref(t);
        else
            bad = json_array_append_new(arr, t) != 0;
    }
    if (bad) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

static json_t *tool_choice_json(const loom_llm_request *req, int placeholder)
{
    json_t *tc;

    if (placeholder)
        return json_pack("{s:s}", "type", "none");
    switch (req->tool_choice.kind) {
    case LOOM_TOOL_CHOICE_NONE:
        return json_pack("{s:s}", "type", "none");
    case LOOM_TOOL_CHOICE_REQUIRED:
        tc = json_pack("{s:s}", "type", "any");
        break;
    case LOOM_TOOL_CHOICE_FUNCTION:
        tc = json_pack("{s:s,s:o}", "type", "tool", "name",
                       loom__llm_json_string(req->tool_choice.function));
        break;
    default:
        tc = json_pack("{s:s}", "type", "auto");
        break;
    }
    if (tc && req->parallel_tool_calls == 0 &&
        json_object_set_new(tc, "disable_parallel_tool_use", json_true())) {
        json_decref(tc);
        return NULL;
    }
    return tc;
}

/* Sets o[key] = v, stealing v; non-zero when v is NULL or on OOM. */
static int put(json_t *o, const char *key, json_t *v)
{
    if (!v)
        return -1;
    return json_object_set_new(o, key, v);
}

int loom__anthropic_build_body(json_t **out, const loom_llm_request *req)
{
    json_t *body = NULL, *system = NULL, *turns = NULL, *tools = NULL;
    int thinking = thinking_on(req), bad = 0, tool_blocks = 0, placeholder;
    long max_tokens = req->max_tokens;
    size_t i = 0, users;

    *out = NULL;
    if (!req->model || !*req->model)
        return loom__error_set(LOOM_EINVALID, "request has no model");
    if (req->tools_len && req->tool_choice.kind == LOOM_TOOL_CHOICE_FUNCTION &&
        (!req->tool_choice.function || !*req->tool_choice.function))
        return loom__error_set(LOOM_EINVALID, "tool choice names no function");
    if (max_tokens <= 0)
        max_tokens = LOOM_ANTHROPIC_DEFAULT_MAX_TOKENS +
                     (thinking ? req->thinking_budget : 0);
    if (thinking && max_tokens <= req->thinking_budget)
        return loom__error_set(LOOM_EINVALID,
                               "max_tokens (%ld) must be above the thinking "
                               "budget (%ld)",
                               max_tokens, req->thinking_budget);
    if (req->temperature >= 0 && !thinking && !isfinite(req->temperature))
        return loom__error_set(LOOM_EINVALID, "temperature is not finite");
    if (!(body = json_object()) || !(system = json_array()) ||
        !(turns = json_array())) {
        bad = 1;
        goto cleanup;
    }
    /* Leading system messages are the system prompt; any later one is
     * user text where it stands (keeps the cached prefix intact). */
    for (; !bad && i < req->messages_len &&
           req->messages[i].role == LOOM_ROLE_SYSTEM;
         i++)
        if (req->messages[i].content && *req->messages[i].content)
            bad = json_array_append_new(
                      system, text_block(req->messages[i].content)) != 0;
    for (; !bad && i < req->messages_len; i++) {
        const loom_message *m = &req->messages[i];
        switch (m->role) {
        case LOOM_ROLE_ASSISTANT:
            tool_blocks |= m->tool_calls_len > 0;
            bad = add_assistant(turns, m) != 0;
            break;
        case LOOM_ROLE_TOOL:
            tool_blocks = 1;
            bad = add_block(turns, "user", tool_result_block(m)) != 0;
            break;
        default: /* user, and system past the start */
            if (m->content && *m->content)
                bad = add_block(turns, "user", text_block(m->content)) != 0;
            break;
        }
    }
    /* The API refuses tool blocks in a request without tools (a run's
     * last call offers none): send one that cannot be chosen. */
    placeholder = !req->tools_len && tool_blocks;
    if (!bad && (req->tools_len || placeholder))
        bad = !(tools = tools_json(req, placeholder));
    if (!bad && req->prompt_cache) {
        if (tools)
            bad |= mark_cache(tools);
        bad |= mark_cache(system);
        /* The last two user turns: this call's end, and where the previous
         * call ended, so its cache entry is found however many blocks the
         * last turn added. */
        users = 0;
        for (size_t k = json_array_size(turns); !bad && users < 2 && k-- > 0;) {
            json_t *t = json_array_get(turns, k);
            if (strcmp(json_string_value(json_object_get(t, "role")), "user"))
                continue;
            users++;
            bad |= mark_cache(json_object_get(t, "content"));
        }
    }
    if (bad)
        goto cleanup;
    bad |= put(body, "model", loom__llm_json_string(req->model));
    bad |= put(body, "max_tokens", json_integer(max_tokens));
    if (json_array_size(system))
        bad |= put(body, "system", json_incref(system));
    bad |= put(body, "messages", json_incref(turns));
    if (tools) {
        bad |= put(body, "tools", json_incref(tools));
        bad |= put(body, "tool_choice", tool_choice_json(req, placeholder));
    }
    if (thinking)
        bad |= put(body, "thinking",
                   json_pack("{s:s,s:I}", "type", "enabled", "budget_tokens",
                             (json_int_t)req->thinking_budget));
    /* With thinking the API takes no temperature but its own. */
    if (req->temperature >= 0 && !thinking)
        bad |= put(body, "temperature", json_real(req->temperature));
    if (req->stream)
        bad |= put(body, "stream", json_true());

cleanup:
    json_decref(system);
    json_decref(turns);
    json_decref(tools);
    if (bad) {
        json_decref(body);
        return loom__error_oom();
    }
    *out = body;
    return 0;
}

/* ---- errors ------------------------------------------------------------ */

int loom__anthropic_error_from_http(loom_upstream_error *err, long status,
                                    const char *body, size_t len,
                                    const char *request_id)
{
    /* {"type":"error","error":{"type","message"}} is what the OpenAI
     * parser reads already (error.type, error.message); 529 is a 5xx. */
    return loom__openai_error_from_http(err, status, body, len, request_id);
}

int loom__anthropic_status_retryable(long status)
{
    return loom__openai_status_retryable(status);
}

int loom__anthropic_stream_error_retryable(const loom_upstream_error *err)
{
    return err->type && (strcmp(err->type, "overloaded_error") == 0 ||
                         strcmp(err->type, "api_error") == 0);
}

/* ---- the adapter ------------------------------------------------------- */

/* What a decoder of one attempt is made with. */
typedef struct {
    const loom__anthropic_limits *limits;
    loom_llm_event_cb cb;
    void *payload;
} decoder_args;

static int op_new(void **out, void *payload)
{
    decoder_args *a = payload;
    loom__anthropic_decoder *d = NULL;
    int rc = loom__anthropic_decoder_new(&d, a->limits, a->cb, a->payload);

    *out = d;
    return rc;
}

static void op_free(void *d)
{
    loom__anthropic_decoder_free(d);
}

static int op_feed(void *d, const char *data, size_t len)
{
    return loom__anthropic_decoder_feed(d, data, len);
}

static int op_finish(void *d)
{
    return loom__anthropic_decoder_finish(d);
}

static int op_complete(void *d, const char *body, size_t len)
{
    return loom__anthropic_decoder_complete(d, body, len);
}

static int op_started(const void *d)
{
    return loom__anthropic_decoder_output_started(d);
}

static const loom_upstream_error *op_error(const void *d)
{
    return loom__anthropic_decoder_error(d);
}

static int op_export(void *d, loom_llm_response *resp)
{
    return loom__anthropic_decoder_export(d, resp);
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
    loom__anthropic_error_from_http,
    loom__anthropic_status_retryable,
    loom__anthropic_stream_error_retryable,
};

void loom__anthropic_provider_set_limits(loom_provider *base,
                                         const loom__anthropic_limits *limits)
{
    ((anthropic_provider *)base)->limits = *limits;
}

const char *loom__anthropic_provider_url(const loom_provider *base)
{
    return ((const anthropic_provider *)base)->url;
}

static size_t max_body(const anthropic_provider *p)
{
    size_t text =
        p->limits.max_text ? p->limits.max_text : LOOM_ANTHROPIC_MAX_TEXT;
    size_t state =
        p->limits.max_state ? p->limits.max_state : LOOM_ANTHROPIC_MAX_STATE;

    return p->limits.max_body ? p->limits.max_body
                              : 2 * (text + state) + ((size_t)1 << 20);
}

static int anthropic_complete(loom_provider *base, const loom_llm_request *req,
                              loom_llm_event_cb cb, void *payload,
                              loom_llm_response *resp, loom_cancel *cancel)
{
    anthropic_provider *p = (anthropic_provider *)base;
    decoder_args da = {&p->limits, cb, payload};
    loom__llm_attempts_opts o = {0};
    loom__http_request hreq = {0};
    json_t *body = NULL;
    char *text = NULL;
    int rc;

    resp->error.attempts = 0;
    if ((rc = loom__anthropic_build_body(&body, req)) != 0)
        goto cleanup;
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
    o.ops = &decoder_ops;
    o.payload = &da;
    rc = loom__llm_attempts(&o, resp);

cleanup:
    if (!resp->text && !(resp->text = strdup("")) && rc == 0)
        rc = loom__error_oom();
    json_decref(body);
    free(text);
    return rc;
}

static void anthropic_free(loom_provider *base)
{
    anthropic_provider *p = (anthropic_provider *)base;

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

static const loom_provider_vtable anthropic_vtable = {anthropic_complete,
                                                      anthropic_free};

static int add_header(anthropic_provider *p, const char *name,
                      const char *value)
{
    char *line;

    if (asprintf(&line, "%s: %s", name, value) < 0)
        return loom__error_oom();
    p->headers[p->headers_len++] = line;
    return 0;
}

/* loom's own headers, each unless the config names it, then the
 * config's (anthropic-beta goes there). */
static int build_headers(anthropic_provider *p, const loom_provider_config *c,
                         const char *name)
{
    const json_t *h = json_is_object(c->headers) ? c->headers : NULL;
    const char *k;
    json_t *v;
    char ua[64], num[32];
    int rc = 0, has_accept = loom__llm_config_has_header(h, "Accept");

    p->headers = calloc(json_object_size(h) + 4, sizeof(*p->headers));
    if (!p->headers)
        return loom__error_oom();
    if (c->api_key && *c->api_key &&
        !loom__llm_config_has_header(h, "x-api-key")) {
        if (strpbrk(c->api_key, "\r\n"))
            return loom__error_set(
                LOOM_EINVALID, "provider '%s': api_key has a line break", name);
        if ((rc = add_header(p, "x-api-key", c->api_key)))
            return rc;
    }
    if (!loom__llm_config_has_header(h, "anthropic-version") &&
        (rc = add_header(p, "anthropic-version", LOOM_ANTHROPIC_VERSION)))
        return rc;
    if (!loom__llm_config_has_header(h, "Content-Type") &&
        (rc = add_header(p, "Content-Type", "application/json")))
        return rc;
    snprintf(ua, sizeof(ua), "loom/%s", loom_version());
    if (!loom__llm_config_has_header(h, "User-Agent") &&
        (rc = add_header(p, "User-Agent", ua)))
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
        if ((rc = add_header(p, k, s)))
            return rc;
    }
    p->stream_headers = calloc(p->headers_len + 1, sizeof(char *));
    p->json_headers = calloc(p->headers_len + 1, sizeof(char *));
    if (!p->stream_headers || !p->json_headers)
        return loom__error_oom();
    for (size_t i = 0; i < p->headers_len; i++)
        p->stream_headers[i] = p->json_headers[i] = p->headers[i];
    p->request_headers_len = p->headers_len;
    if (!has_accept) {
        p->stream_headers[p->headers_len] = "Accept: text/event-stream";
        p->json_headers[p->headers_len] = "Accept: application/json";
        p->request_headers_len++;
    }
    return 0;
}

int loom_provider_anthropic_new(loom_provider **out,
                                const loom_provider_config *config)
{
    const char *name = config->name ? config->name : "anthropic";
    const char *base = config->base_url && *config->base_url
                           ? config->base_url
                           : LOOM_ANTHROPIC_DEFAULT_BASE_URL;
    anthropic_provider *p;
    size_t n;
    int rc, v1;

    *out = NULL;
    if (!(p = calloc(1, sizeof(*p))))
        return loom__error_oom();
    p->base.vt = &anthropic_vtable;
    n = strlen(base);
    while (n > 0 && base[n - 1] == '/')
        n--;
    /* A base URL that already names the version is not given another. */
    v1 = n >= 3 && strncmp(base + n - 3, "/v1", 3) == 0;
    if (!(p->base.name = strdup(name)) ||
        asprintf(&p->url, "%.*s%s", (int)n, base,
                 v1 ? "/messages" : "/v1/messages") < 0) {
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
    anthropic_free(&p->base);
    return rc;
}
