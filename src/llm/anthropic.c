/*
 * The Anthropic Messages adapter (provider kind "anthropic"): POST
 * {base_url}/v1/messages with x-api-key and anthropic-version headers.
 *
 * This file maps loom's provider-neutral request onto the Messages API
 * builds the body; the provider object, its headers (x-api-key,
 * anthropic-version) and the call through the attempt loop are what every
 * adapter shares (llm/adapter.c, llm/attempt.c: retries before output
 * only, Retry-After honoured). Decoding the answer is
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
 * turns (the API allows four). A response format, which the API has no
 * field for, is a tool the model is made to call, whose input is the
 * answer (LOOM_ANTHROPIC_ANSWER_TOOL in llm/anthropic.h).
 */
#include "llm/anthropic.h"
#include "core/error.h"
#include "llm/adapter.h"
#include "llm/openai.h" /* the shared HTTP error parser */
#include "llm/params.h"
#include "llm/parts.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    loom__llm_adapter a; /* first: the part every adapter has */
    loom__anthropic_limits limits;
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
    const char *t = loom__llm_jstr(block, "type");

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
    if (!t || strcmp(loom__llm_jstr(t, "role"), role)) {
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
        const char *id = loom__llm_jstr(b, "id");
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

/* m's text, images and documents as blocks of the user turn. */
static int add_part_blocks(json_t *turns, const loom_message *m)
{
    json_t *blocks = loom__parts_anthropic(m), *blk;
    size_t i;
    int rc = blocks ? 0 : -1;

    json_array_foreach(blocks, i, blk)
    {
        if (rc || (rc = add_block(turns, "user", json_incref(blk))) != 0)
            break;
    }
    json_decref(blocks);
    return rc;
}

/* The content of a tool result with images: its text as a text block
 * (none when empty), then the images as image blocks. */
static json_t *tool_result_media(const loom_message *m)
{
    json_t *arr = loom__parts_anthropic(m);

    if (arr && m->content && *m->content &&
        json_array_insert_new(arr, 0,
                              json_pack("{s:s,s:o}", "type", "text", "text",
                                        loom__llm_json_string(m->content)))) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

static json_t *tool_result_block(const loom_message *m)
{
    json_t *b = json_pack("{s:s,s:o}", "type", "tool_result", "tool_use_id",
                          tool_id(m->tool_call_id));

    if (b && loom_message_has_media(m)) {
        if (json_object_set_new(b, "content", tool_result_media(m))) {
            json_decref(b);
            return NULL;
        }
    } else if (b && m->content && *m->content &&
               json_object_set_new(b, "content",
                                   loom__llm_json_string(m->content))) {
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

/* ---- the answer tool (response_format) -------------------------------- */

long loom__anthropic_answer_mode(const loom_llm_request *req)
{
    if (!req->params || req->params->format == LOOM_FORMAT_UNSET)
        return LOOM__ANTHROPIC_ANSWER_NONE;
    if (!req->tools_len || req->tool_choice.kind == LOOM_TOOL_CHOICE_NONE)
        return LOOM__ANTHROPIC_ANSWER_FORCED;
    /* This call must call a real tool: the format is for a later one. */
    if (req->tool_choice.kind == LOOM_TOOL_CHOICE_REQUIRED ||
        req->tool_choice.kind == LOOM_TOOL_CHOICE_FUNCTION)
        return LOOM__ANTHROPIC_ANSWER_NONE;
    return LOOM__ANTHROPIC_ANSWER_BESIDE;
}

/* The answer tool's description: a sentence, the schema's name and
 * description (which the request's size limit bounds before this). */
#define ANSWER_DESC_MAX ((size_t)1 << 20)

/*
 * The answer tool: the client's schema as its input_schema (json_object,
 * or json_schema without one: any object). A schema that says no type is
 * an object's (the API wants it said; params.c refused other types).
 */
static json_t *answer_tool_json(const loom_llm_params *p)
{
    loom_buf desc = LOOM_BUF_INIT(ANSWER_DESC_MAX);
    json_t *schema = p->format == LOOM_FORMAT_JSON_SCHEMA && p->format_schema
                         ? json_deep_copy(p->format_schema)
                         : json_object();
    json_t *t = NULL;
    int bad = !schema;

    if (!bad && !json_object_get(schema, "type"))
        bad = json_object_set_new(schema, "type", json_string("object"));
    bad |= loom_buf_puts(&desc, "Give your final answer by calling this "
                                "tool: its input is the answer itself, a "
                                "JSON object");
    if (p->format == LOOM_FORMAT_JSON_SCHEMA && p->format_name)
        bad |= loom_buf_printf(&desc, " (%s)", p->format_name);
    if (p->format == LOOM_FORMAT_JSON_SCHEMA && p->format_description)
        bad |= loom_buf_printf(&desc, ": %s", p->format_description);
    bad |= loom_buf_putc(&desc, '.');
    if (!bad)
        t = json_pack("{s:s,s:o,s:O}", "name", LOOM_ANTHROPIC_ANSWER_TOOL,
                      "description",
                      loom__llm_json_string(loom_buf_cstr(&desc)),
                      "input_schema", schema);
    json_decref(schema);
    loom_buf_free(&desc);
    return t;
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
    if (req->thinking_budget <= 0 ||
        loom__anthropic_answer_mode(req) != LOOM__ANTHROPIC_ANSWER_NONE)
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

/* The tools of a request: the placeholder, or the run's tools (unless
 * only the answer tool is offered) and then the answer tool. */
static json_t *tools_json(const loom_llm_request *req, int placeholder,
                          long mode)
{
    size_t ntools = mode == LOOM__ANTHROPIC_ANSWER_FORCED ? 0 : req->tools_len;
    json_t *arr = json_array(), *t;
    int bad = !arr;

    if (placeholder && !bad) {
        t = json_pack("{s:s,s:s,s:{s:s,s:{}}}", "name",
                      LOOM_ANTHROPIC_PLACEHOLDER_TOOL, "description",
                      "Not available: no tools can be called now.",
                      "input_schema", "type", "object", "properties");
        bad = json_array_append_new(arr, t) != 0;
    }
    for (size_t i = 0; !bad && i < ntools; i++) {
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
    if (!bad && mode != LOOM__ANTHROPIC_ANSWER_NONE)
        bad = json_array_append_new(arr, answer_tool_json(req->params)) != 0;
    if (bad) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

static json_t *tool_choice_json(const loom_llm_request *req, int placeholder,
                                long mode)
{
    json_t *tc;

    if (placeholder)
        return json_pack("{s:s}", "type", "none");
    if (mode == LOOM__ANTHROPIC_ANSWER_FORCED)
        return json_pack("{s:s,s:s}", "type", "tool", "name",
                         LOOM_ANTHROPIC_ANSWER_TOOL);
    /* Beside the run's tools: some tool, the answer's or a real one. */
    switch (mode == LOOM__ANTHROPIC_ANSWER_BESIDE ? LOOM_TOOL_CHOICE_REQUIRED
                                                  : req->tool_choice.kind) {
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

int loom__anthropic_build_body(json_t **out, const loom_llm_request *req)
{
    loom_llm_request budgeted;
    json_t *body = NULL, *system = NULL, *turns = NULL, *tools = NULL;
    int thinking, bad = 0, tool_blocks = 0, placeholder, rc;
    long max_tokens = req->max_tokens, mode = loom__anthropic_answer_mode(req);
    size_t i = 0, users;

    *out = NULL;
    if ((rc = loom__llm_request_check(req)) != 0)
        return rc;
    /* A client's reasoning effort is a thinking budget here. */
    if (req->params && req->params->reasoning_effort) {
        budgeted = *req;
        budgeted.thinking_budget =
            loom__params_effort_budget(req->params->reasoning_effort);
        req = &budgeted;
    }
    for (size_t k = 0; mode && k < req->tools_len; k++)
        if (req->tools[k].name &&
            strcmp(req->tools[k].name, LOOM_ANTHROPIC_ANSWER_TOOL) == 0)
            return loom__error_set(LOOM_EINVALID,
                                   "a tool named '%s' cannot be offered with "
                                   "response_format: the name is loom's own",
                                   LOOM_ANTHROPIC_ANSWER_TOOL);
    thinking = thinking_on(req);
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
            if (loom_message_has_media(m))
                bad = add_part_blocks(turns, m) != 0;
            else if (m->content && *m->content)
                bad = add_block(turns, "user", text_block(m->content)) != 0;
            break;
        }
    }
    /* The API refuses tool blocks in a request without tools (a run's
     * last call offers none): send one that cannot be chosen. */
    placeholder = !req->tools_len && tool_blocks && !mode;
    if (!bad && (req->tools_len || placeholder || mode))
        bad = !(tools = tools_json(req, placeholder, mode));
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
            if (strcmp(loom__llm_jstr(t, "role"), "user"))
                continue;
            users++;
            bad |= mark_cache(json_object_get(t, "content"));
        }
    }
    if (bad)
        goto cleanup;
    bad |= loom__llm_put(body, "model", loom__llm_json_string(req->model));
    bad |= loom__llm_put(body, "max_tokens", json_integer(max_tokens));
    if (json_array_size(system))
        bad |= loom__llm_put(body, "system", json_incref(system));
    bad |= loom__llm_put(body, "messages", json_incref(turns));
    if (tools) {
        bad |= loom__llm_put(body, "tools", json_incref(tools));
        bad |= loom__llm_put(body, "tool_choice",
                             tool_choice_json(req, placeholder, mode));
    }
    if (thinking)
        bad |= loom__llm_put(body, "thinking",
                             json_pack("{s:s,s:I}", "type", "enabled",
                                       "budget_tokens",
                                       (json_int_t)req->thinking_budget));
    /* With thinking the API takes no temperature but its own. */
    if (req->temperature >= 0 && !thinking)
        bad |= loom__llm_put(body, "temperature", json_real(req->temperature));
    bad |= loom__params_put_anthropic(body, req->params);
    if (req->stream)
        bad |= loom__llm_put(body, "stream", json_true());

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
    return loom__llm_status_retryable(status);
}

int loom__anthropic_stream_error_retryable(const loom_upstream_error *err)
{
    return err->type && (strcmp(err->type, "overloaded_error") == 0 ||
                         strcmp(err->type, "api_error") == 0);
}

/* ---- the adapter ------------------------------------------------------- */

static int op_new(void **out, void *payload)
{
    const loom__llm_decoder_args *x = payload;
    const anthropic_provider *p = (const anthropic_provider *)x->adapter;
    loom__anthropic_decoder *d = NULL;
    int rc = loom__anthropic_decoder_new(&d, &p->limits, x->cb, x->payload);

    if (rc == 0)
        loom__anthropic_decoder_set_answer(d, (int)x->arg);
    *out = d;
    return rc;
}

void loom__anthropic_provider_set_limits(loom_provider *base,
                                         const loom__anthropic_limits *limits)
{
    ((anthropic_provider *)base)->limits = *limits;
}

const char *loom__anthropic_provider_url(const loom_provider *base)
{
    return ((const anthropic_provider *)base)->a.url;
}

static size_t max_body(const loom__llm_adapter *a)
{
    const anthropic_provider *p = (const anthropic_provider *)a;
    size_t text =
        p->limits.max_text ? p->limits.max_text : LOOM_ANTHROPIC_MAX_TEXT;
    size_t state =
        p->limits.max_state ? p->limits.max_state : LOOM_ANTHROPIC_MAX_STATE;

    return p->limits.max_body ? p->limits.max_body
                              : 2 * (text + state) + ((size_t)1 << 20);
}

/* anthropic-beta and the like go in the config's headers. */
static const char *const own_headers[] = {"anthropic-version",
                                          LOOM_ANTHROPIC_VERSION, NULL};

static const loom__llm_adapter_spec anthropic_spec = {
    .kind = "anthropic",
    .default_base_url = LOOM_ANTHROPIC_DEFAULT_BASE_URL,
    .version = "v1",
    .path = "/messages",
    .key_header = "x-api-key",
    .key_prefix = "",
    .headers = own_headers,
    .build_json = loom__anthropic_build_body,
    .decoder_arg = loom__anthropic_answer_mode,
    .max_body = max_body,
    .decoder_new = op_new,
    .error_from_http = loom__anthropic_error_from_http,
    .stream_error_retryable = loom__anthropic_stream_error_retryable,
};

int loom_provider_anthropic_new(loom_provider **out,
                                const loom_provider_config *config)
{
    return loom__llm_adapter_new(out, sizeof(anthropic_provider),
                                 &anthropic_spec, config);
}
