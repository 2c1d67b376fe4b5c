/*
 * The OpenAI Chat Completions wire format of /v1/chat/completions (see
 * chat_format.h and docs/openai-compat.md): request parsing with errors
 * that name the field at fault, and the rendering of a run's events as
 * an OpenAI chunk stream or one chat.completion object.
 *
 * The shapes follow what OpenAI sends (as recorded from its API):
 * compact JSON, `data: <json>\n\n` per
 * event, a role chunk first, a finish chunk with an empty delta, a usage
 * chunk with `choices: []`, `data: [DONE]`. loom's additions ride inside
 * that shape where official SDKs ignore them: `conversation_id` at the top
 * of the role chunk, `tool_output` and `reasoning_content` inside deltas,
 * `tool_events` beside a non-streamed answer.
 */
#include "server/chat_format.h"
#include "core/error.h"
#include "core/text.h"
#include "core/utf8.h"
#include "server/chat_parts.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PARAM_MAX 192
#define MAX_CONVERSATION_ID 128

/* ---- errors ---------------------------------------------------------- */

void loom__chat_error_clear(loom__chat_error *err)
{
    if (!err)
        return;
    free(err->message);
    free(err->param);
    memset(err, 0, sizeof(*err));
}

int loom__chat_error_set(loom__chat_error *err, int status, const char *type,
                         const char *code, const char *param,
                         const char *fmt, ...)
{
    va_list ap;
    char *msg = NULL;

    loom__chat_error_clear(err);
    va_start(ap, fmt);
    if (vasprintf(&msg, fmt, ap) < 0)
        msg = NULL;
    va_end(ap);
    err->status = status;
    err->type = type;
    err->code = code;
    err->message = msg;
    err->param = param ? strdup(param) : NULL;
    if (!msg || (param && !err->param))
        return loom__error_oom();
    return LOOM_EINVALID;
}

json_t *loom__chat_error_json(const loom__chat_error *err)
{
    const char *msg = err->message ? err->message : "out of memory";

    /* The message may quote the request's bytes (a JSON syntax error
     * does), which need not be UTF-8. */
    return json_pack("{s:{s:o,s:s,s:s?,s:s?}}", "error", "message",
                     loom__json_text(msg, strlen(msg)), "type",
                     err->type ? err->type : "server_error", "param",
                     err->param, "code", err->code);
}

static int field_is(const json_t *o, const char *k, const char *v)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s && strcmp(s, v) == 0;
}

int loom__chat_error_from_failure(loom__chat_error *err, const json_t *data)
{
    const json_t *e = json_object_get(data, "error");
    const char *msg = json_string_value(json_object_get(e, "message"));
    const char *kind = json_string_value(json_object_get(e, "kind"));
    const char *code = json_string_value(json_object_get(e, "code"));
    int http = (int)json_integer_value(json_object_get(e, "http_status"));

    if (!msg || !*msg)
        msg = "the run failed";
    if (code && strcmp(code, "store_failed") == 0)
        return loom__chat_error_set(err, 500, "server_error", "store_failed",
                                    NULL, "%s", msg);
    /* An image loom fetched for the provider (Gemini): refused by loom's
     * network policy or not an image, else not fetched. */
    if (code && strcmp(code, "image_url_refused") == 0)
        return loom__chat_error_set(err, 400, "invalid_request_error", code,
                                    NULL, "%s", msg);
    if (code && strcmp(code, "image_fetch_failed") == 0)
        return loom__chat_error_set(err, 502, "upstream_error", code, NULL,
                                    "%s", msg);
    if (field_is(data, "status", "cancelled") ||
        (code && strcmp(code, "cancelled") == 0))
        return loom__chat_error_set(err, 503, "server_error", "cancelled",
                                    NULL, "%s", msg);
    if (kind && strcmp(kind, "rate_limit") == 0)
        return loom__chat_error_set(err, 429, "rate_limit_error",
                                    "rate_limit_exceeded", NULL, "%s", msg);
    if ((kind && strcmp(kind, "timeout") == 0) ||
        (code && strcmp(code, "ETIMEDOUT") == 0))
        return loom__chat_error_set(err, 504, "timeout", "upstream_timeout",
                                    NULL, "%s", msg);
    if (kind && (strcmp(kind, "authentication") == 0 ||
                 strcmp(kind, "permission") == 0))
        return loom__chat_error_set(err, 502, "upstream_error",
                                    "upstream_auth_failed", NULL, "%s", msg);
    if (kind && http >= 400 && http < 500)
        return loom__chat_error_set(
            err, http,
            http == 404 ? "not_found_error" : "invalid_request_error",
            "upstream_error", NULL, "%s", msg);
    if (kind || (code && (strcmp(code, "EUPSTREAM") == 0 ||
                          strcmp(code, "EPROTO") == 0 ||
                          strcmp(code, "EIO") == 0)))
        return loom__chat_error_set(err, 502, "upstream_error",
                                    "upstream_error", NULL, "%s", msg);
    return loom__chat_error_set(err, 500, "server_error", NULL, NULL, "%s",
                                msg);
}

/* ---- request parsing ------------------------------------------------- */

static const char *type_word(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a decimal";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a value";
}

static int bad_type(loom__chat_error *err, const char *param,
                    const char *expected, const json_t *got)
{
    return loom__chat_error_set(
        err, 400, "invalid_request_error", "invalid_type", param,
        "Invalid type for '%s': expected %s, but got %s instead.", param,
        expected, type_word(got));
}

int loom__chat_bad_type(loom__chat_error *err, const char *param,
                        const char *expected, const json_t *got)
{
    return bad_type(err, param, expected, got);
}

static int missing(loom__chat_error *err, const char *param)
{
    return loom__chat_error_set(err, 400, "invalid_request_error",
                                "missing_required_parameter", param,
                                "Missing required parameter: '%s'.", param);
}

int loom__chat_bad_value(loom__chat_error *err, const char *param,
                         const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return loom__chat_error_set(err, 400, "invalid_request_error",
                                "invalid_value", param,
                                "Invalid value for '%s': %s", param, msg);
}

const json_t *loom__chat_opt(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_null(v) ? NULL : v;
}

/* Sets *out to a string field; absent -> NULL (or an error if required). */
static int get_string(const char **out, const json_t *o, const char *key,
                      const char *param, int required, loom__chat_error *err)
{
    const json_t *v = loom__chat_opt(o, key);

    *out = NULL;
    if (!v)
        return required ? missing(err, param) : 0;
    if (!json_is_string(v))
        return bad_type(err, param, "a string", v);
    *out = json_string_value(v);
    return 0;
}

/* "messages[i].field" (field NULL: "messages[i]") into buf, a
 * parameter's name for an error: made only when one is reported (a
 * message's five names cost 4k instructions, the whole parse of a
 * one-message request 13k). */
static const char *msg_param(char buf[PARAM_MAX], size_t i, const char *field)
{
    if (field)
        snprintf(buf, PARAM_MAX, "messages[%zu].%s", i, field);
    else
        snprintf(buf, PARAM_MAX, "messages[%zu]", i);
    return buf;
}

/* get_string of messages[i]'s field key. */
static int get_msg_string(const char **out, const json_t *m, size_t i,
                          const char *key, int required, loom__chat_error *err)
{
    const json_t *v = loom__chat_opt(m, key);
    char param[PARAM_MAX];

    *out = NULL;
    if (v && json_is_string(v)) {
        *out = json_string_value(v);
        return 0;
    }
    if (!v && !required)
        return 0;
    return get_string(out, m, key, msg_param(param, i, key), required, err);
}

static int get_bool(int *out, const json_t *o, const char *key,
                    const char *param, loom__chat_error *err)
{
    const json_t *v = loom__chat_opt(o, key);

    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return bad_type(err, param, "a boolean", v);
    *out = json_is_true(v);
    return 0;
}

/*
 * Message content: a string, or an array of content parts
 * (chat_parts.h). Text parts alone are joined with newlines into *out;
 * with an image or file among them the parts go to *parts (n of them)
 * and *out is NULL. *out is NULL when the content is absent or null. The
 * caller frees both.
 */
static int get_content(char **out, loom_part **parts, size_t *n,
                       const json_t *m, size_t i, loom_role role,
                       loom__chat_media *totals, loom__chat_error *err)
{
    const json_t *c = loom__chat_opt(m, "content");
    loom_message joined = {0};
    char param[PARAM_MAX];
    int rc;

    *out = NULL;
    *parts = NULL;
    *n = 0;
    if (!c)
        return 0;
    if (json_is_string(c)) {
        *out = strdup(json_string_value(c));
        return *out ? 0 : loom__error_oom();
    }
    msg_param(param, i, "content");
    if (!json_is_array(c))
        return bad_type(err, param, "a string or an array of content parts", c);
    if (json_array_size(c) > LOOM__CHAT_MAX_PARTS)
        return loom__chat_error_set(
            err, 400, "invalid_request_error", "array_above_max_length", param,
            "Invalid '%s': array too long. Expected an array with maximum "
            "length %d, but got an array with length %zu instead.",
            param, LOOM__CHAT_MAX_PARTS, json_array_size(c));
    if ((rc = loom__chat_parts_parse(parts, n, c, i, role, totals, err)))
        return rc;
    joined.parts = *parts;
    joined.parts_len = *n;
    if (loom_message_has_media(&joined))
        return 0;
    /* Text only: one string, as a plain content. */
    {
        loom_messages tmp = {0};
        rc = loom_messages_add_parts(&tmp, role, *parts, *n);
        if (!rc) {
            *out = tmp.items[0].content ? tmp.items[0].content : strdup("");
            tmp.items[0].content = NULL;
            if (!*out)
                rc = loom__error_oom();
        }
        loom_messages_free(&tmp);
    }
    loom__chat_parts_free(*parts, *n);
    *parts = NULL;
    *n = 0;
    return rc;
}

static int parse_tool_calls(loom_tool_call **out, size_t *n,
                            const json_t *arr, size_t i,
                            loom__chat_error *err)
{
    char param[PARAM_MAX];
    const json_t *tc;
    size_t j;
    int rc = 0;

    *out = NULL;
    *n = 0;
    snprintf(param, sizeof(param), "messages[%zu].tool_calls", i);
    if (!json_is_array(arr))
        return bad_type(err, param, "an array", arr);
    if (json_array_size(arr) == 0)
        return 0;
    if (json_array_size(arr) > LOOM__CHAT_MAX_TOOLS)
        return loom__chat_error_set(
            err, 400, "invalid_request_error", "array_above_max_length",
            param,
            "Invalid '%s': array too long. Expected an array with maximum "
            "length %d, but got an array with length %zu instead.",
            param, LOOM__CHAT_MAX_TOOLS, json_array_size(arr));
    *out = calloc(json_array_size(arr), sizeof(**out));
    if (!*out)
        return loom__error_oom();
    json_array_foreach(arr, j, tc)
    {
        const char *id, *type, *name, *args;
        const json_t *fn;
        char pp[PARAM_MAX];
        snprintf(pp, sizeof(pp), "messages[%zu].tool_calls[%zu]", i, j);
        if (!json_is_object(tc))
            return bad_type(err, pp, "an object", tc);
        snprintf(pp, sizeof(pp), "messages[%zu].tool_calls[%zu].id", i, j);
        if ((rc = get_string(&id, tc, "id", pp, 1, err)) != 0)
            return rc;
        snprintf(pp, sizeof(pp), "messages[%zu].tool_calls[%zu].type", i, j);
        if ((rc = get_string(&type, tc, "type", pp, 0, err)) != 0)
            return rc;
        if (type && strcmp(type, "function") != 0)
            return loom__chat_bad_value(err, pp,
                                        "'%s' is not supported; expected "
                                        "'function'.",
                                        type);
        snprintf(pp, sizeof(pp), "messages[%zu].tool_calls[%zu].function", i,
                 j);
        fn = loom__chat_opt(tc, "function");
        if (!fn)
            return missing(err, pp);
        if (!json_is_object(fn))
            return bad_type(err, pp, "an object", fn);
        snprintf(pp, sizeof(pp),
                 "messages[%zu].tool_calls[%zu].function.name", i, j);
        if ((rc = get_string(&name, fn, "name", pp, 1, err)) != 0)
            return rc;
        snprintf(pp, sizeof(pp),
                 "messages[%zu].tool_calls[%zu].function.arguments", i, j);
        if ((rc = get_string(&args, fn, "arguments", pp, 0, err)) != 0)
            return rc;
        (*n)++;
        if (!((*out)[j].id = strdup(id)) ||
            !((*out)[j].name = strdup(name)) ||
            !((*out)[j].arguments = strdup(args && *args ? args : "{}")))
            return loom__error_oom();
    }
    return 0;
}

/* The name of the call that tool_call_id answers, from earlier messages. */
static const char *call_name(const loom_messages *m, const char *id)
{
    for (size_t i = m->len; i-- > 0;) {
        const loom_message *msg = &m->items[i];
        for (size_t j = 0; j < msg->tool_calls_len; j++)
            if (msg->tool_calls[j].id &&
                strcmp(msg->tool_calls[j].id, id) == 0)
                return msg->tool_calls[j].name;
    }
    return NULL;
}

static int parse_message(loom__chat_request *req, const json_t *m, size_t i,
                         loom__chat_media *totals, loom__chat_error *err)
{
    char param[PARAM_MAX];
    const char *role, *name, *call_id;
    char *content = NULL;
    loom_part *parts = NULL;
    size_t nparts = 0;
    loom_tool_call *calls = NULL;
    size_t ncalls = 0;
    loom_role r;
    int rc;

    if (!json_is_object(m))
        return bad_type(err, msg_param(param, i, NULL), "an object", m);
    if ((rc = get_msg_string(&role, m, i, "role", 1, err)) != 0)
        return rc;
    if (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0)
        r = LOOM_ROLE_SYSTEM;
    else if (strcmp(role, "user") == 0)
        r = LOOM_ROLE_USER;
    else if (strcmp(role, "assistant") == 0)
        r = LOOM_ROLE_ASSISTANT;
    else if (strcmp(role, "tool") == 0)
        r = LOOM_ROLE_TOOL;
    else
        return loom__chat_bad_value(
            err, msg_param(param, i, "role"),
            "'%s'. Supported values are: 'system', "
            "'developer', 'user', 'assistant' and 'tool'.",
            role);
    if ((rc = get_msg_string(&name, m, i, "name", 0, err)) != 0)
        return rc;
    if ((rc = get_content(&content, &parts, &nparts, m, i, r, totals, err)))
        return rc;
    switch (r) {
    case LOOM_ROLE_ASSISTANT:
        if (loom__chat_opt(m, "tool_calls") &&
            (rc = parse_tool_calls(&calls, &ncalls,
                                   loom__chat_opt(m, "tool_calls"), i, err)) !=
                0)
            goto cleanup;
        if (!content && !ncalls) {
            rc = missing(err, msg_param(param, i, "content"));
            goto cleanup;
        }
        rc = loom_messages_add_assistant(&req->messages, content, NULL, calls,
                                         ncalls);
        break;
    case LOOM_ROLE_TOOL:
        if ((rc = get_msg_string(&call_id, m, i, "tool_call_id", 1, err)))
            goto cleanup;
        if (!content) {
            rc = missing(err, msg_param(param, i, "content"));
            goto cleanup;
        }
        rc = loom_messages_add_tool_result(
            &req->messages, call_id, call_name(&req->messages, call_id),
            content);
        break;
    default:
        if (nparts) {
            rc = loom_messages_add_parts(&req->messages, r, parts, nparts);
            break;
        }
        if (!content) {
            rc = missing(err, msg_param(param, i, "content"));
            goto cleanup;
        }
        rc = loom_messages_add(&req->messages, r, content);
        break;
    }
cleanup:
    loom__chat_parts_free(parts, nparts);
    for (size_t k = 0; calls && k < ncalls; k++)
        loom_tool_call_clear(&calls[k]);
    free(calls);
    free(content);
    return rc;
}

static int too_many(loom__chat_error *err, const char *param, size_t max,
                    size_t got)
{
    return loom__chat_error_set(
        err, 400, "invalid_request_error", "array_above_max_length", param,
        "Invalid '%s': array too long. Expected an array with maximum "
        "length %zu, but got an array with length %zu instead.",
        param, max, got);
}

static int parse_messages(loom__chat_request *req, const json_t *body,
                          loom__chat_error *err)
{
    const json_t *msgs = loom__chat_opt(body, "messages"), *m;
    loom__chat_media totals = {0};
    size_t i;
    int rc;

    if (!msgs)
        return missing(err, "messages");
    if (!json_is_array(msgs))
        return bad_type(err, "messages", "an array", msgs);
    if (json_array_size(msgs) == 0)
        return loom__chat_error_set(
            err, 400, "invalid_request_error", "empty_array", "messages",
            "Invalid 'messages': empty array. Expected an array with "
            "minimum length 1, but got an empty array instead.");
    if (json_array_size(msgs) > LOOM__CHAT_MAX_MESSAGES)
        return too_many(err, "messages", LOOM__CHAT_MAX_MESSAGES,
                        json_array_size(msgs));
    json_array_foreach(msgs, i, m)
    {
        if ((rc = parse_message(req, m, i, &totals, err)) != 0)
            return rc;
    }
    return 0;
}

static int grow_tools(loom__chat_request *req, size_t n)
{
    req->tool_names = calloc(n, sizeof(*req->tool_names));
    req->tool_name_pos = calloc(n, sizeof(*req->tool_name_pos));
    req->client_tools = calloc(n, sizeof(*req->client_tools));
    req->client_tool_pos = calloc(n, sizeof(*req->client_tool_pos));
    if (!req->tool_names || !req->tool_name_pos || !req->client_tools ||
        !req->client_tool_pos)
        return loom__error_oom();
    return 0;
}

static int parse_client_tool(loom__chat_request *req, const json_t *t,
                             size_t i, loom__chat_error *err)
{
    char param[PARAM_MAX];
    const char *type, *name, *desc;
    const json_t *fn, *params;
    loom_tool_def *d;
    int rc;

    snprintf(param, sizeof(param), "tools[%zu].type", i);
    if ((rc = get_string(&type, t, "type", param, 1, err)) != 0)
        return rc;
    if (strcmp(type, "function") != 0)
        return loom__chat_bad_value(
            err, param, "'%s' is not supported; expected 'function'.", type);
    snprintf(param, sizeof(param), "tools[%zu].function", i);
    fn = loom__chat_opt(t, "function");
    if (!fn)
        return missing(err, param);
    if (!json_is_object(fn))
        return bad_type(err, param, "an object", fn);
    snprintf(param, sizeof(param), "tools[%zu].function.name", i);
    if ((rc = get_string(&name, fn, "name", param, 1, err)) != 0)
        return rc;
    if (!loom__text_is_name(name, 0))
        return loom__chat_bad_value(
            err, param,
            "'%s'. A tool name is 1 to 64 of a-z, A-Z, 0-9, "
            "'_' and '-'.",
            name);
    snprintf(param, sizeof(param), "tools[%zu].function.description", i);
    if ((rc = get_string(&desc, fn, "description", param, 0, err)) != 0)
        return rc;
    snprintf(param, sizeof(param), "tools[%zu].function.parameters", i);
    params = loom__chat_opt(fn, "parameters");
    if (params && !json_is_object(params))
        return bad_type(err, param, "an object", params);
    /* t lives in req->tools_json: the def may point into it. */
    d = &req->client_tools[req->client_tools_len];
    req->client_tool_pos[req->client_tools_len] = i;
    req->client_tools_len++;
    d->name = name;
    d->description = desc;
    d->parameters = params;
    return 0;
}

static int parse_tools(loom__chat_request *req, const json_t *body,
                       loom__chat_error *err)
{
    const json_t *tools = loom__chat_opt(body, "tools");
    json_t *t;
    char param[PARAM_MAX];
    size_t i;
    int rc;

    if (!tools)
        return 0;
    if (!json_is_array(tools))
        return bad_type(err, "tools", "an array", tools);
    if (json_array_size(tools) > LOOM__CHAT_MAX_TOOLS)
        return too_many(err, "tools", LOOM__CHAT_MAX_TOOLS,
                        json_array_size(tools));
    if (json_array_size(tools) == 0)
        return 0;
    if ((rc = grow_tools(req, json_array_size(tools))) != 0)
        return rc;
    if (!(req->tools_json = json_deep_copy(tools)))
        return loom__error_oom();
    json_array_foreach(req->tools_json, i, t)
    {
        snprintf(param, sizeof(param), "tools[%zu]", i);
        if (json_is_string(t)) {
            const char *name = json_string_value(t);
            if (!loom__text_is_name(name, 0))
                return loom__chat_bad_value(
                    err, param,
                    "'%s'. A tool name is 1 to 64 of a-z, "
                    "A-Z, 0-9, '_' and '-'.",
                    name);
            req->tool_name_pos[req->tool_names_len] = i;
            if (!(req->tool_names[req->tool_names_len++] = strdup(name)))
                return loom__error_oom();
        } else if (json_is_object(t)) {
            if ((rc = parse_client_tool(req, t, i, err)) != 0)
                return rc;
        } else {
            return bad_type(err, param,
                            "a tool name (string) or a tool object", t);
        }
    }
    return 0;
}

static int parse_tool_choice(loom__chat_request *req, const json_t *body,
                             loom__chat_error *err)
{
    const json_t *tc = loom__chat_opt(body, "tool_choice"), *fn;
    const char *type, *name;
    int rc;

    if (!tc)
        return 0;
    req->has_tool_choice = 1;
    if (json_is_string(tc)) {
        const char *s = json_string_value(tc);
        if (strcmp(s, "auto") == 0)
            req->tool_choice.kind = LOOM_TOOL_CHOICE_AUTO;
        else if (strcmp(s, "none") == 0)
            req->tool_choice.kind = LOOM_TOOL_CHOICE_NONE;
        else if (strcmp(s, "required") == 0)
            req->tool_choice.kind = LOOM_TOOL_CHOICE_REQUIRED;
        else
            return loom__chat_bad_value(
                err, "tool_choice",
                "'%s'. Supported values are: 'none', 'auto' "
                "and 'required', or an object naming a "
                "function.",
                s);
        return 0;
    }
    if (!json_is_object(tc))
        return bad_type(err, "tool_choice", "a string or an object", tc);
    if ((rc = get_string(&type, tc, "type", "tool_choice.type", 1, err)))
        return rc;
    if (strcmp(type, "function") != 0)
        return loom__chat_bad_value(
            err, "tool_choice.type",
            "'%s' is not supported; expected 'function'.", type);
    fn = loom__chat_opt(tc, "function");
    if (!fn)
        return missing(err, "tool_choice.function");
    if (!json_is_object(fn))
        return bad_type(err, "tool_choice.function", "an object", fn);
    if ((rc = get_string(&name, fn, "name", "tool_choice.function.name", 1,
                         err)) != 0)
        return rc;
    req->tool_choice.kind = LOOM_TOOL_CHOICE_FUNCTION;
    if (!(req->tool_choice.function = strdup(name)))
        return loom__error_oom();
    return 0;
}

static int get_max_tokens(long *out, const json_t *body, const char *key,
                          loom__chat_error *err)
{
    const json_t *v = loom__chat_opt(body, key);

    if (!v)
        return 0;
    if (!json_is_integer(v))
        return bad_type(err, key, "an integer", v);
    if (json_integer_value(v) < 1)
        return loom__chat_bad_value(err, key,
                                    "%lld. Expected a value of at least 1.",
                                    (long long)json_integer_value(v));
    *out = json_integer_value(v) > 0x7fffffff
               ? 0x7fffffff
               : (long)json_integer_value(v);
    return 0;
}

int loom__chat_user_valid(const char *s)
{
    size_t n = 0;

    if (!s || !*s)
        return 0;
    for (; s[n]; n++) {
        unsigned char c = (unsigned char)s[n];
        if (n >= LOOM__CHAT_USER_MAX)
            return 0;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || strchr(LOOM__CHAT_USER_PUNCT, c)))
            return 0;
    }
    return 1;
}

static int parse_options(loom__chat_request *req, const json_t *body,
                         loom__chat_error *err)
{
    const json_t *so = loom__chat_opt(body, "stream_options"), *t;
    const char *s;
    int rc;

    if ((rc = get_bool(&req->stream, body, "stream", "stream", err)) != 0)
        return rc;
    if (so && !json_is_object(so))
        return bad_type(err, "stream_options", "an object", so);
    if (so && (rc = get_bool(&req->include_usage, so, "include_usage",
                             "stream_options.include_usage", err)) != 0)
        return rc;
    if ((rc = get_bool(&req->parallel_tool_calls, body,
                       "parallel_tool_calls", "parallel_tool_calls", err)))
        return rc;
    if ((rc = get_max_tokens(&req->max_tokens, body, "max_tokens", err)) ||
        (rc = get_max_tokens(&req->max_tokens, body, "max_completion_tokens",
                             err)))
        return rc;
    t = loom__chat_opt(body, "temperature");
    if (t && !json_is_number(t))
        return bad_type(err, "temperature", "a number", t);
    if (t) {
        double v = json_number_value(t);
        if (v < 0 || v > 2)
            return loom__chat_bad_value(
                err, "temperature", "%g. Expected a value between 0 and 2.", v);
        req->temperature = v;
    }
    if ((rc = get_string(&s, body, "user", "user", 0, err)) != 0)
        return rc;
    if (s) {
        if (!loom__chat_user_valid(s))
            return loom__chat_bad_value(
                err, "user",
                "expected 1 to %d characters of A-Z, a-z, "
                "0-9 and '%s'.",
                LOOM__CHAT_USER_MAX, LOOM__CHAT_USER_PUNCT);
        if (!(req->user = strdup(s)))
            return loom__error_oom();
    }
    if ((rc = get_string(&s, body, "conversation_id", "conversation_id", 0,
                         err)) != 0)
        return rc;
    if (s) {
        if (!*s || strlen(s) > MAX_CONVERSATION_ID)
            return loom__chat_bad_value(err, "conversation_id",
                                        "expected 1 to %d characters.",
                                        MAX_CONVERSATION_ID);
        if (!(req->conversation_id = strdup(s)))
            return loom__error_oom();
    }
    return 0;
}

int loom__chat_server_calls_mode(const char *s)
{
    if (s && strcmp(s, "inline") == 0)
        return 1;
    if (s && strcmp(s, "separate") == 0)
        return 0;
    return -1;
}

/* loom's own request fields that shape the answer. */
static int parse_loom_options(loom__chat_request *req, const json_t *body,
                              loom__chat_error *err)
{
    const char *s;
    int rc, cont = 1;

    if ((rc = get_bool(&cont, body, LOOM__CHAT_CONTINUE_FIELD,
                       LOOM__CHAT_CONTINUE_FIELD, err)) != 0)
        return rc;
    req->no_continue = !cont;
    if ((rc = loom__chat_budget_parse(
             &req->budget, loom__chat_opt(body, LOOM__CHAT_BUDGET_FIELD),
             LOOM__CHAT_BUDGET_FIELD, err)) != 0)
        return rc;
    if ((rc = get_string(&s, body, LOOM__CHAT_SERVER_CALLS_FIELD,
                         LOOM__CHAT_SERVER_CALLS_FIELD, 0, err)) != 0)
        return rc;
    if (s && (req->server_calls_inline = loom__chat_server_calls_mode(s)) < 0)
        return loom__chat_bad_value(err, LOOM__CHAT_SERVER_CALLS_FIELD,
                                    "'%s'. Expected 'separate' or 'inline'.",
                                    s);
    return 0;
}

int loom__chat_request_parse(loom__chat_request *out, const json_t *body,
                             loom__chat_error *err)
{
    const char *model;
    int rc;

    memset(out, 0, sizeof(*out));
    memset(err, 0, sizeof(*err));
    out->parallel_tool_calls = -1;
    out->temperature = -1.0;
    if (!json_is_object(body)) {
        rc = loom__chat_error_set(err, 400, "invalid_request_error",
                                  "invalid_json", NULL,
                                  "The request body must be a JSON object.");
        goto cleanup;
    }
    if ((rc = get_string(&model, body, "model", "model", 1, err)) != 0)
        goto cleanup;
    if (!*model) {
        rc =
            loom__chat_bad_value(err, "model", "''. A model name is required.");
        goto cleanup;
    }
    if (!(out->model = strdup(model))) {
        rc = loom__error_oom();
        goto cleanup;
    }
    if ((rc = parse_messages(out, body, err)) != 0 ||
        (rc = parse_options(out, body, err)) != 0 ||
        (rc = parse_tools(out, body, err)) != 0 ||
        (rc = parse_tool_choice(out, body, err)) != 0 ||
        (rc = loom__chat_params_parse(&out->params, body, err)) != 0 ||
        (rc = parse_loom_options(out, body, err)) != 0)
        goto cleanup;
cleanup:
    if (rc)
        loom__chat_request_clear(out);
    if (rc == LOOM_ENOMEM && !err->status)
        loom__chat_error_set(err, 500, "server_error", NULL, NULL,
                             "out of memory");
    return rc;
}

int loom__chat_request_parse_text(loom__chat_request *out, const char *text,
                                  size_t len, loom__chat_error *err)
{
    json_error_t je;
    json_t *body = text ? json_loadb(text, len, 0, &je)
                        : NULL;
    char why[256];
    int rc;

    if (!body) {
        memset(out, 0, sizeof(*out));
        memset(err, 0, sizeof(*err));
        return loom__chat_error_set(
            err, 400, "invalid_request_error", "invalid_json", NULL,
            "We could not parse the JSON body of your request: %s.",
            text ? loom__json_error_shown(why, sizeof(why), &je)
                 : "empty body");
    }
    rc = loom__chat_request_parse(out, body, err);
    json_decref(body);
    return rc;
}

void loom__chat_request_clear(loom__chat_request *req)
{
    if (!req)
        return;
    free(req->model);
    loom_messages_free(&req->messages);
    for (size_t i = 0; i < req->tool_names_len; i++)
        free(req->tool_names[i]);
    free(req->tool_names);
    free(req->tool_name_pos);
    free(req->client_tools);
    free(req->client_tool_pos);
    json_decref(req->tools_json);
    free(req->tool_choice.function);
    free(req->conversation_id);
    free(req->user);
    loom_llm_params_clear(&req->params);
    memset(req, 0, sizeof(*req));
    req->parallel_tool_calls = -1;
    req->temperature = -1.0;
}

/* ---- tool resolution ------------------------------------------------- */

static int has_name(const char **names, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(names[i], name) == 0)
            return 1;
    return 0;
}

/* Whether reg has name, or an MCP server that reg gets in snapshots
 * claims it (the run offers it when the server does). */
static int known(const loom_tool_registry *reg, const char *name)
{
    return reg && (loom_tool_registry_get(reg, name) != NULL ||
                   loom_tool_registry_claims(reg, name));
}

/* Whether loom offers its own tool called name (list when not all). */
static int offered(const char *name, int all, const loom_tool_registry *reg,
                   const char **list, size_t n)
{
    if (all)
        return known(reg, name);
    return has_name(list, n, name);
}

int loom__chat_server_tools(const char ***names, size_t *len, int *all,
                            const loom__chat_request *req,
                            const loom_tool_registry *reg,
                            const char *const *agent_tools,
                            size_t agent_tools_len, int agent_all,
                            loom__chat_error *err)
{
    size_t cap = agent_tools_len + req->tool_names_len, n = 0;
    const char **list = NULL;
    char param[PARAM_MAX];
    int rc = 0;

    *names = NULL;
    *len = 0;
    *all = agent_all;
    memset(err, 0, sizeof(*err));
    for (size_t i = 0; i < req->tool_names_len; i++) {
        if (known(reg, req->tool_names[i]))
            continue;
        char *avail = reg ? loom_tool_registry_names(reg) : NULL;
        snprintf(param, sizeof(param), "tools[%zu]", req->tool_name_pos[i]);
        rc = loom__chat_error_set(
            err, 400, "invalid_request_error", "unknown_tool", param,
            "Unknown tool '%s'. Available tools: %s.", req->tool_names[i],
            avail && *avail ? avail : "(none)");
        free(avail);
        return rc;
    }
    if (!agent_all && cap) {
        list = calloc(cap, sizeof(*list));
        if (!list)
            return loom__error_oom();
        for (size_t i = 0; i < agent_tools_len; i++)
            if (!has_name(list, n, agent_tools[i]))
                list[n++] = agent_tools[i];
        for (size_t i = 0; i < req->tool_names_len; i++)
            if (!has_name(list, n, req->tool_names[i]))
                list[n++] = req->tool_names[i];
    }
    for (size_t i = 0; i < req->client_tools_len; i++) {
        const char *name = req->client_tools[i].name;
        int server = offered(name, agent_all, reg, list, n);
        int twice = 0;
        for (size_t j = 0; j < i; j++)
            twice |= strcmp(req->client_tools[j].name, name) == 0;
        if (!server && !twice)
            continue;
        snprintf(param, sizeof(param), "tools[%zu].function.name",
                 req->client_tool_pos[i]);
        rc = loom__chat_error_set(
            err, 400, "invalid_request_error", "invalid_value", param,
            server ? "Tool '%s' is one of loom's own tools; give it by name "
                     "(as a string) or rename your function."
                   : "Tool '%s' is given twice.",
            name);
        goto cleanup;
    }
    if (req->has_tool_choice &&
        req->tool_choice.kind == LOOM_TOOL_CHOICE_FUNCTION) {
        const char *fn = req->tool_choice.function;
        int found = offered(fn, agent_all, reg, list, n);
        for (size_t i = 0; !found && i < req->client_tools_len; i++)
            found = strcmp(req->client_tools[i].name, fn) == 0;
        if (!found) {
            rc = loom__chat_error_set(
                err, 400, "invalid_request_error", "invalid_value",
                "tool_choice.function.name",
                "Invalid value for 'tool_choice.function.name': tool '%s' "
                "is not among the tools offered.", fn);
            goto cleanup;
        }
    }
    *names = list;
    *len = n;
    list = NULL;
cleanup:
    free(list);
    return rc;
}

/* ---- rendering ------------------------------------------------------- */

void loom__chat_completion_id(char *out, size_t size, const char *run_id)
{
    const char *s = run_id ? run_id : "";

    if (strncmp(s, "run_", 4) == 0)
        s += 4;
    snprintf(out, size, "chatcmpl-%s", s);
}

struct loom__chat_fmt {
    char *id;
    char *model;
    /* Every chunk's head, {"id":...,"model":... (no closing brace), as
     * compact JSON, made for the first chunk; NULL when it could not be
     * made (out of memory, an id or model not UTF-8): a chunk then fails
     * as building it would. */
    char *head;
    size_t head_len;
    char *conversation_id;
    long long created;
    int include_usage;
    int started;
    int done;  /* run.completed or run.failed went through */
    int ended; /* loom__chat_fmt_end was called */
    size_t call_index; /* running index of tool calls across the stream */
    size_t loom_call_index; /* the same for loom_tool_calls */
    json_t *client_tools;   /* names of the client's tools (strings) */
    int server_calls_inline;
    /* For the non-streamed answer. What this turn said and reasoned so
     * far, as the inside of a JSON string literal: a logged delta's
     * literal goes in as it is (its escapes do not depend on what is
     * around them); read back once when flushed. */
    json_t *tool_events;
    loom_buf turn_text;
    loom_buf turn_reasoning;
    json_t *pending;      /* pending client calls, from run.completed */
    char *text;           /* final text */
    char *reasoning;      /* the final turn's reasoning, NULL when none */
    char *finish_reason;
    loom_usage usage;
    int cost_known;  /* usage.cost_micros is the run's cost */
    int cancelled;   /* the run was cancelled (ends as a normal answer) */
    json_t *failure; /* run.failed data, not when cancelled */
};

int loom__chat_fmt_new(loom__chat_fmt **out, const loom__chat_fmt_opts *o)
{
    loom__chat_fmt *f = calloc(1, sizeof(*f));

    *out = NULL;
    if (!f)
        return loom__error_oom();
    f->created = o->created;
    f->include_usage = o->include_usage;
    f->server_calls_inline = o->server_calls_inline;
    loom_buf_init(&f->turn_text, LOOM_BUF_UNLIMITED);
    loom_buf_init(&f->turn_reasoning, LOOM_BUF_UNLIMITED);
    f->id = strdup(o->id ? o->id : "chatcmpl-loom");
    f->model = strdup(o->model ? o->model : "");
    f->tool_events = json_array();
    f->client_tools = json_array();
    for (size_t i = 0; f->client_tools && i < o->client_tools_len; i++)
        if (json_array_append_new(f->client_tools,
                                  json_string(o->client_tools[i].name))) {
            json_decref(f->client_tools);
            f->client_tools = NULL;
        }
    if (!f->id || !f->model || !f->tool_events || !f->client_tools ||
        (o->conversation_id &&
         !(f->conversation_id = strdup(o->conversation_id)))) {
        loom__chat_fmt_free(f);
        return loom__error_oom();
    }
    *out = f;
    return 0;
}

void loom__chat_fmt_free(loom__chat_fmt *f)
{
    if (!f)
        return;
    free(f->id);
    free(f->model);
    free(f->head);
    free(f->conversation_id);
    json_decref(f->tool_events);
    json_decref(f->client_tools);
    loom_buf_free(&f->turn_text);
    loom_buf_free(&f->turn_reasoning);
    json_decref(f->pending);
    free(f->text);
    free(f->reasoning);
    free(f->finish_reason);
    json_decref(f->failure);
    free(f);
}

int loom__chat_fmt_done(const loom__chat_fmt *f)
{
    return f->done;
}

const json_t *loom__chat_fmt_failure(const loom__chat_fmt *f)
{
    return f->failure;
}

json_t *loom__chat_usage_json(const loom_usage *u)
{
    json_t *o = json_pack("{s:I,s:I,s:I}", "prompt_tokens",
                          (json_int_t)u->prompt_tokens, "completion_tokens",
                          (json_int_t)u->completion_tokens, "total_tokens",
                          (json_int_t)(u->total_tokens
                                           ? u->total_tokens
                                           : u->prompt_tokens +
                                                 u->completion_tokens));
    if (o && u->cached_tokens)
        json_object_set_new(o, "prompt_tokens_details",
                            json_pack("{s:I}", "cached_tokens",
                                      (json_int_t)u->cached_tokens));
    if (o && u->reasoning_tokens)
        json_object_set_new(o, "completion_tokens_details",
                            json_pack("{s:I}", "reasoning_tokens",
                                      (json_int_t)u->reasoning_tokens));
    return o;
}

json_t *loom__chat_usage_ext_json(const loom_usage *u, int cost_known)
{
    json_t *o = loom__chat_usage_json(u);

    if (o &&
        (json_object_set_new(o, "cached_tokens",
                             json_integer((json_int_t)u->cached_tokens)) ||
         json_object_set_new(o, "reasoning_tokens",
                             json_integer((json_int_t)u->reasoning_tokens)) ||
         json_object_set_new(o, "cache_write_tokens",
                             json_integer((json_int_t)u->cache_write_tokens)) ||
         json_object_set_new(o, "cost_micros",
                             cost_known
                                 ? json_integer((json_int_t)u->cost_micros)
                                 : json_null()))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Appends `data: <compact json>\n\n` and takes o. */
static int put_event(loom_buf *out, json_t *o)
{
    size_t len = 0, mark;
    char *s;
    int rc;

    if (!o)
        return loom__error_oom();
    if (!out) {
        json_decref(o);
        return 0;
    }
    s = loom__json_compact_dumps(o, 0, &len);
    json_decref(o);
    if (!s)
        return loom__error_oom();
    /* All or nothing, as one loom_buf write is. */
    mark = out->len;
    if ((rc = loom_buf_put(out, "data: ", 6)) == 0 &&
        (rc = loom_buf_put(out, s, len)) == 0)
        rc = loom_buf_put(out, "\n\n", 2);
    if (rc && out->ptr) {
        out->len = mark;
        out->ptr[mark] = '\0';
    }
    free(s);
    return rc;
}

static json_t *chunk_head(const loom__chat_fmt *f)
{
    return json_pack("{s:s,s:s,s:I,s:s}", "id", f->id, "object",
                     "chat.completion.chunk", "created",
                     (json_int_t)f->created, "model", f->model);
}

/* A string json_pack takes ("s:s"): NULL or not UTF-8 fails it, which
 * its caller reports as out of memory. */
static int put_packed_string(loom_buf *out, const char *s)
{
    int rc;

    if (!s)
        return loom__error_oom();
    rc = loom__json_put_string(out, s, strlen(s));
    return rc == LOOM_EINVALID ? loom__error_oom() : rc;
}

/* Appends the members every object of the answer starts with, as its
 * compact dump writes them: {"id","object","created","model" (no
 * closing brace). */
static int put_head(const loom__chat_fmt *f, loom_buf *out, const char *object)
{
    char created[32];
    int rc;

    snprintf(created, sizeof(created), "%" JSON_INTEGER_FORMAT,
             (json_int_t)f->created);
    if ((rc = loom_buf_puts(out, "{\"id\":")) == 0 &&
        (rc = put_packed_string(out, f->id)) == 0 &&
        (rc = loom_buf_puts(out, ",\"object\":\"")) == 0 &&
        (rc = loom_buf_puts(out, object)) == 0 &&
        (rc = loom_buf_puts(out, "\",\"created\":")) == 0 &&
        (rc = loom_buf_puts(out, created)) == 0 &&
        (rc = loom_buf_puts(out, ",\"model\":")) == 0)
        rc = put_packed_string(out, f->model);
    return rc;
}

/* f->head: chunk_head()'s text without its closing brace, written as
 * its dump would be; NULL when that fails. */
static void make_head(loom__chat_fmt *f)
{
    /* Every byte of the id and model escaped (\u00XX), and the rest. */
    loom_buf b = LOOM_BUF_INIT(6 * (strlen(f->id) + strlen(f->model)) + 128);
    char *head;

    if (put_head(f, &b, "chat.completion.chunk") == 0) {
        f->head_len = b.len;
        f->head = loom_buf_detach(&b);
        /* Kept for the whole stream: no room beyond the text. */
        if ((head = realloc(f->head, f->head_len + 1)) != NULL)
            f->head = head;
    }
    loom_buf_free(&b);
}

/* A member json_object_set_new would add: left out when s is not UTF-8
 * (json_string refuses it). */
static int put_member_string(loom_buf *out, const char *key, const char *s)
{
    size_t mark = out->len;
    int rc = loom_buf_puts(out, key);

    if (!rc &&
        (rc = loom__json_put_string(out, s, strlen(s))) == LOOM_EINVALID) {
        out->len = mark;
        out->ptr[mark] = '\0';
        rc = 0;
    }
    return rc;
}

/* Appends the rest of a chunk after its delta, as jansson would write
 * the object: the finish reason (a string not UTF-8 fails, as json_pack
 * would), then the conversation (left out when not UTF-8, as
 * json_object_set_new leaves it) and loom_status. */
static int put_chunk_tail(const loom__chat_fmt *f, loom_buf *out,
                          const char *finish, int with_conversation)
{
    int rc = loom_buf_puts(out, ",\"logprobs\":null,\"finish_reason\":");

    if (rc)
        return rc;
    if (!finish)
        rc = loom_buf_puts(out, "null");
    else if ((rc = loom__json_put_string(out, finish, strlen(finish))) ==
             LOOM_EINVALID)
        return loom__error_oom();
    if (!rc)
        rc = loom_buf_puts(out, "}]");
    if (!rc && with_conversation && f->conversation_id)
        rc =
            put_member_string(out, ",\"conversation_id\":", f->conversation_id);
    if (!rc && finish && f->cancelled)
        rc = loom_buf_puts(out, ",\"loom_status\":\"cancelled\"");
    return rc ? rc : loom_buf_puts(out, "}\n\n");
}

/*
 * put_chunk (below) with its delta's compact JSON text: open, then len
 * bytes of d, then close.
 */
static int put_chunk_text(loom__chat_fmt *f, loom_buf *out, const char *open,
                          const char *d, size_t len, const char *close,
                          const char *finish, int with_conversation)
{
    size_t mark;
    int rc;

    if (!f->head)
        make_head(f);
    if (!f->head)
        return loom__error_oom();
    /* All or nothing, as one loom_buf write is. */
    mark = out->len;
    if ((rc = loom_buf_puts(out, "data: ")) == 0 &&
        (rc = loom_buf_put(out, f->head, f->head_len)) == 0 &&
        (rc = loom_buf_puts(out, ",\"choices\":[{\"index\":0,\"delta\":")) ==
            0 &&
        (rc = loom_buf_puts(out, open)) == 0 &&
        (rc = loom_buf_put(out, d, len)) == 0 &&
        (rc = loom_buf_puts(out, close)) == 0)
        rc = put_chunk_tail(f, out, finish, with_conversation);
    if (rc && out->ptr) {
        out->len = mark;
        out->ptr[mark] = '\0';
    }
    return rc;
}

/*
 * One chunk with a single choice; takes delta. finish may be NULL; the
 * finish chunk of a cancelled run says so in loom_status. No out (a
 * completion assembled whole): no chunk to build. Written as text around
 * the delta's JSON, the bytes put_event would write for the object
 * {head..., "choices": [{"index", "delta", "logprobs", "finish_reason"}],
 * "conversation_id", "loom_status"}, without building it for every chunk
 * of a stream.
 */
static int put_chunk(loom__chat_fmt *f, loom_buf *out, json_t *delta,
                     const char *finish, int with_conversation)
{
    size_t len = 0;
    char *d;
    int rc;

    if (!out && delta) {
        json_decref(delta);
        return 0;
    }
    d = delta ? loom__json_compact_dumps(delta, 0, &len) : NULL;
    json_decref(delta);
    if (!d)
        return loom__error_oom();
    rc = put_chunk_text(f, out, "", d, len, "", finish, with_conversation);
    free(d);
    return rc;
}

int loom__chat_fmt_begin(loom__chat_fmt *f, loom_buf *out)
{
    static const char role[] = "{\"role\":\"assistant\",\"content\":\"\"}";

    if (f->started)
        return 0;
    f->started = 1;
    return out ? put_chunk_text(f, out, "", role, sizeof(role) - 1, "", NULL, 1)
               : 0;
}

/* An OpenAI tool call from an event's {id, name, arguments}; with index
 * >= 0 it leads with "index", as a delta does. */
static json_t *call_json(const json_t *c, long long index)
{
    const char *args = json_string_value(json_object_get(c, "arguments"));
    const char *id = json_string_value(json_object_get(c, "id"));
    const char *name = json_string_value(json_object_get(c, "name"));
    json_t *o = index >= 0 ? json_pack("{s:I}", "index", (json_int_t)index)
                           : json_object();

    if (o && (json_object_set_new(o, "id", json_string(id ? id : "")) ||
              json_object_set_new(o, "type", json_string("function")) ||
              json_object_set_new(
                  o, "function",
                  json_pack("{s:s,s:s}", "name", name ? name : "",
                            "arguments", args && *args ? args : "{}")))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *call_value(const json_t *c)
{
    return call_json(c, -1);
}

static json_t *output_value(const json_t *d)
{
    const char *id = json_string_value(json_object_get(d, "id"));
    const char *name = json_string_value(json_object_get(d, "name"));
    const char *output = json_string_value(json_object_get(d, "output"));

    return json_pack("{s:s,s:s,s:s}", "tool_call_id", id ? id : "", "name",
                     name ? name : "", "output", output ? output : "");
}

/* Appends s to b as the inside of its JSON string literal (the form
 * turn_text and turn_reasoning keep). */
static int put_inside(loom_buf *b, const char *s)
{
    size_t mark = b->len;
    int rc = loom__json_put_string(b, s, strlen(s));

    if (rc)
        return rc == LOOM_EINVALID ? loom__error_oom() : rc;
    memmove(b->ptr + mark, b->ptr + mark + 1, b->len - mark - 2);
    b->len -= 2;
    b->ptr[b->len] = '\0';
    return 0;
}

/* The string whose literal's inside b holds (turn_text), read back: a
 * new reference, NULL when out of memory. */
static json_t *inside_value(const loom_buf *b)
{
    loom_buf lit = LOOM_BUF_INIT(b->len + 2);
    json_t *v = NULL;

    if (loom_buf_put(&lit, "\"", 1) == 0 &&
        loom_buf_put(&lit, b->ptr, b->len) == 0 &&
        loom_buf_put(&lit, "\"", 1) == 0)
        v = json_loadb(lit.ptr, lit.len, JSON_DECODE_ANY, NULL);
    loom_buf_free(&lit);
    return v;
}

/* Moves the buffer into a tool_events entry of the type, if not empty. */
static int flush_buf(loom__chat_fmt *f, const char *type, loom_buf *b)
{
    int rc = 0;

    if (b->len)
        rc = json_array_append_new(
            f->tool_events,
            json_pack("{s:s,s:o}", "type", type, "value", inside_value(b)));
    loom_buf_clear(b);
    return rc ? loom__error_oom() : 0;
}

/* Moves what this turn reasoned and said so far into tool_events. */
static int flush_text(loom__chat_fmt *f)
{
    int rc = flush_buf(f, "reasoning", &f->turn_reasoning);

    return rc ? rc : flush_buf(f, "text", &f->turn_text);
}

static int add_event(loom__chat_fmt *f, const char *type, json_t *value)
{
    if (!value ||
        json_array_append_new(f->tool_events,
                              json_pack("{s:s,s:o}", "type", type, "value",
                                        value)))
        return loom__error_oom();
    return 0;
}

static long usage_field(const json_t *u, const char *k)
{
    return (long)json_integer_value(json_object_get(u, k));
}

/* 1 when name is one of the client's own tools. */
static int is_client_tool(const loom__chat_fmt *f, const char *name)
{
    const json_t *v;
    size_t i;

    json_array_foreach(f->client_tools, i, v)
    {
        if (name && strcmp(json_string_value(v), name) == 0)
            return 1;
    }
    return 0;
}

/*
 * A turn's calls as one delta: the client's in tool_calls, loom's own in
 * loom_tool_calls (in tool_calls too when server_calls_inline), so a
 * standard client only sees the calls it must answer. Each list has a
 * running index: one stream is one message to a client that accumulates
 * deltas, so calls of later turns must not merge into earlier ones.
 */
static int on_calls(loom__chat_fmt *f, const json_t *calls, loom_buf *out)
{
    json_t *std = json_array(), *ext = json_array(), *delta = json_object();
    const json_t *c;
    size_t i;
    int rc = 0;

    if (!std || !ext || !delta)
        rc = loom__error_oom();
    json_array_foreach(calls, i, c)
    {
        const char *name = json_string_value(json_object_get(c, "name"));
        int client = f->server_calls_inline || is_client_tool(f, name);
        json_t *v;
        if (rc)
            break;
        v = call_json(
            c, (long long)(client ? f->call_index++ : f->loom_call_index++));
        if (!v || (rc = add_event(f, "tool_call", call_value(c))) != 0 ||
            json_array_append_new(client ? std : ext, v))
            rc = rc ? rc : loom__error_oom();
    }
    if (!rc && json_array_size(std))
        rc = json_object_set(delta, "tool_calls", std) ? loom__error_oom() : 0;
    if (!rc && json_array_size(ext))
        rc = json_object_set(delta, "loom_tool_calls", ext) ? loom__error_oom()
                                                            : 0;
    json_decref(std);
    json_decref(ext);
    if (rc || !json_object_size(delta)) {
        json_decref(delta);
        return rc;
    }
    return put_chunk(f, out, delta, NULL, 0);
}

/*
 * The end of a completed run, or of a cancelled one (f->cancelled: what
 * was said before the stop is the answer): the finish chunk, then the
 * usage chunk.
 */
static int on_completed(loom__chat_fmt *f, const json_t *d, loom_buf *out)
{
    const json_t *u = json_object_get(d, "usage");
    const json_t *pending = json_object_get(d, "pending_tool_calls");
    const char *fr = json_string_value(json_object_get(d, "finish_reason"));
    const char *text = json_string_value(json_object_get(d, "text"));
    int rc;

    f->usage.prompt_tokens = usage_field(u, "prompt_tokens");
    f->usage.completion_tokens = usage_field(u, "completion_tokens");
    f->usage.cached_tokens = usage_field(u, "cached_tokens");
    f->usage.reasoning_tokens = usage_field(u, "reasoning_tokens");
    f->usage.total_tokens = usage_field(u, "total_tokens");
    f->usage.cache_write_tokens = usage_field(u, "cache_write_tokens");
    f->usage.cost_micros =
        (int64_t)json_integer_value(json_object_get(u, "cost_micros"));
    f->cost_known = json_is_integer(json_object_get(u, "cost_micros"));
    if (!f->cancelled && json_array_size(pending)) {
        fr = "tool_calls";
        f->pending = json_incref((json_t *)pending);
    } else if (f->cancelled || !fr || !*fr || strcmp(fr, "tool_calls") == 0) {
        /* The loop answered every call it saw, or the user stopped it
         * (no failure): the message is complete. */
        fr = "stop";
    }
    if (f->turn_reasoning.len) {
        json_t *r = inside_value(&f->turn_reasoning);
        f->reasoning = r ? strdup(json_string_value(r)) : NULL;
        json_decref(r);
    }
    if (!(f->finish_reason = strdup(fr)) ||
        !(f->text = strdup(text ? text : "")) ||
        (f->turn_reasoning.len && !f->reasoning))
        return loom__error_oom();
    if ((rc = flush_text(f)) != 0)
        return rc;
    if ((rc = put_chunk(f, out, json_object(), fr, 0)) != 0)
        return rc;
    if (f->include_usage) {
        json_t *c = chunk_head(f);
        if (!c || json_object_set_new(c, "choices", json_array()) ||
            json_object_set_new(
                c, "usage",
                loom__chat_usage_ext_json(&f->usage, f->cost_known))) {
            json_decref(c);
            return loom__error_oom();
        }
        if ((rc = put_event(out, c)) != 0)
            return rc;
    }
    return 0;
}

static int on_failed(loom__chat_fmt *f, const json_t *d, loom_buf *out)
{
    loom__chat_error e;
    int rc;

    if (field_is(d, "status", "cancelled")) {
        f->cancelled = 1;
        return on_completed(f, d, out);
    }
    memset(&e, 0, sizeof(e));
    f->failure = json_incref((json_t *)d);
    rc = loom__chat_error_from_failure(&e, d);
    if (rc == LOOM_EINVALID)
        rc = put_event(out, loom__chat_error_json(&e));
    loom__chat_error_clear(&e);
    return rc;
}

int loom__chat_fmt_event(loom__chat_fmt *f, const loom_event *ev,
                         loom_buf *out)
{
    const json_t *d = ev->data;
    const char *s;
    int rc;

    /* Sub-agents' events have no place in a chat completion: their
     * calls show as the parent's tool calls and outputs. */
    if (f->done || loom_event_depth(ev) > 0)
        return 0;
    if ((rc = loom__chat_fmt_begin(f, out)) != 0)
        return rc;
    switch (ev->type) {
    case LOOM_EV_MESSAGE_DELTA:
        s = json_string_value(json_object_get(d, "delta"));
        if (!s || !*s)
            return 0;
        if ((rc = put_inside(&f->turn_text, s)) != 0)
            return rc;
        return put_chunk(f, out, json_pack("{s:s}", "content", s), NULL, 0);
    case LOOM_EV_REASONING_DELTA:
        s = json_string_value(json_object_get(d, "delta"));
        if (!s || !*s)
            return 0;
        if ((rc = put_inside(&f->turn_reasoning, s)) != 0)
            return rc;
        return put_chunk(f, out, json_pack("{s:s}", "reasoning_content", s),
                         NULL, 0);
    case LOOM_EV_TOOL_CALLS:
        if ((rc = flush_text(f)) != 0)
            return rc;
        return on_calls(f, json_object_get(d, "calls"), out);
    case LOOM_EV_TOOL_COMPLETED:
    case LOOM_EV_TOOL_FAILED:
        if ((rc = add_event(f, "tool_output", output_value(d))) != 0)
            return rc;
        return put_chunk(f, out,
                         json_pack("{s:o}", "tool_output", output_value(d)),
                         NULL, 0);
    case LOOM_EV_RUN_COMPLETED:
        f->done = 1;
        return on_completed(f, d, out);
    case LOOM_EV_RUN_FAILED:
        f->done = 1;
        return on_failed(f, d, out);
    default:
        return 0;
    }
}

/* Whether loom__chat_fmt_event acts on an event of the type (the
 * cases of its switch). */
static int acts_on(loom_event_type type)
{
    switch (type) {
    case LOOM_EV_MESSAGE_DELTA:
    case LOOM_EV_REASONING_DELTA:
    case LOOM_EV_TOOL_CALLS:
    case LOOM_EV_TOOL_COMPLETED:
    case LOOM_EV_TOOL_FAILED:
    case LOOM_EV_RUN_COMPLETED:
    case LOOM_EV_RUN_FAILED:
        return 1;
    default:
        return 0;
    }
}

/* A delta event's string, given as its JSON literal lit (len bytes,
 * quotes included): what loom__chat_fmt_event does with the string. */
static int on_delta_literal(loom__chat_fmt *f, int reasoning, const char *lit,
                            size_t len, loom_buf *out)
{
    int rc;

    if (len <= 2) /* "" */
        return 0;
    if ((rc = loom_buf_put(reasoning ? &f->turn_reasoning : &f->turn_text,
                           lit + 1, len - 2)) != 0 ||
        !out)
        return rc;
    return put_chunk_text(
        f, out, reasoning ? "{\"reasoning_content\":" : "{\"content\":", lit,
        len, "}", NULL, 0);
}

int loom__chat_fmt_logged(loom__chat_fmt *f, const loom_turn_event *ev,
                          const char *run_id, loom_buf *out)
{
    loom_event le;
    int rc;

    /* What loom__chat_fmt_event decides before it reads the data. */
    if (f->done || ev->depth > 0)
        return 0;
    if ((rc = loom__chat_fmt_begin(f, out)) != 0 || !acts_on(ev->type))
        return rc;
    if (ev->delta_len && (ev->type == LOOM_EV_MESSAGE_DELTA ||
                          ev->type == LOOM_EV_REASONING_DELTA))
        return on_delta_literal(f, ev->type == LOOM_EV_REASONING_DELTA,
                                ev->text + ev->delta_at, ev->delta_len, out);
    memset(&le, 0, sizeof(le));
    /* The formatter reads no real, where the two could differ. */
    le.data =
        ev->json ? json_incref((json_t *)ev->json) : loom_turn_event_json(ev);
    if (!le.data)
        return loom__error_oom();
    le.type = ev->type;
    le.seq = ev->seq;
    le.index = (uint32_t)json_integer_value(json_object_get(le.data, "index"));
    le.run_id = run_id;
    rc = loom__chat_fmt_event(f, &le, out);
    json_decref(le.data);
    return rc;
}

int loom__chat_fmt_end(loom__chat_fmt *f, loom_buf *out)
{
    loom_event ev;
    json_t *d;
    int rc;

    if (f->ended)
        return 0;
    f->ended = 1;
    if (f->done)
        return f->failure || !out ? 0 : loom_buf_puts(out, "data: [DONE]\n\n");
    /* No terminal event went through (events were lost): say so rather
     * than end the stream as if it were complete. */
    d = json_pack("{s:s,s:{s:s,s:s}}", "status", "failed", "error", "code",
                  "ERROR", "message", "the run ended without a result");
    if (!d)
        return loom__error_oom();
    memset(&ev, 0, sizeof(ev));
    ev.type = LOOM_EV_RUN_FAILED;
    ev.data = d;
    rc = loom__chat_fmt_event(f, &ev, out);
    json_decref(d);
    return rc;
}

/* The client's calls the run left pending, as message.tool_calls; NULL
 * when there are none (or out of memory). */
static json_t *pending_calls(const loom__chat_fmt *f)
{
    json_t *calls = NULL, *c;
    size_t i;

    if (json_array_size(f->pending)) {
        calls = json_array();
        json_array_foreach(f->pending, i, c)
            json_array_append_new(calls, call_value(c));
    }
    return calls;
}

int loom__chat_fmt_completion(loom__chat_fmt *f, json_t **out)
{
    json_t *o = NULL, *msg, *calls;

    *out = NULL;
    if (!f->done || !f->text)
        return loom__error_set(LOOM_EINVALID, "the run has not completed");
    calls = pending_calls(f);
    msg = json_pack("{s:s,s:o,s:n}", "role", "assistant", "content",
                    calls && !*f->text ? json_null() : json_string(f->text),
                    "refusal");
    if (msg && f->reasoning)
        json_object_set_new(msg, "reasoning_content",
                            json_string(f->reasoning));
    if (msg && calls)
        json_object_set_new(msg, "tool_calls", calls);
    else
        json_decref(calls);
    if (msg)
        o = json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:o,s:n,s:s}],s:o,s:O}", "id",
                      f->id, "object", "chat.completion", "created",
                      (json_int_t)f->created, "model", f->model, "choices",
                      "index", 0, "message", msg, "logprobs", "finish_reason",
                      f->finish_reason, "usage",
                      loom__chat_usage_ext_json(&f->usage, f->cost_known),
                      "tool_events", f->tool_events);
    if (o && f->conversation_id)
        json_object_set_new(o, "conversation_id",
                            json_string(f->conversation_id));
    if (o && f->cancelled)
        json_object_set_new(o, "loom_status", json_string("cancelled"));
    if (!o)
        return loom__error_oom();
    *out = o;
    return 0;
}

/* j's compact text (precision 15, as srv_reply_json writes it); j
 * NULL fails as json_pack does. */
static int put_dump(loom_buf *out, const json_t *j)
{
    size_t len = 0;
    char *text = j ? loom__json_compact_dumps(j, 15, &len) : NULL;
    int rc;

    if (!text)
        return loom__error_oom();
    rc = loom_buf_put(out, text, len);
    free(text);
    return rc;
}

int loom__chat_fmt_completion_text(loom__chat_fmt *f, loom_buf *out)
{
    json_t *calls, *usage;
    int rc;

    if (!f->done || !f->text)
        return loom__error_set(LOOM_EINVALID, "the run has not completed");
    calls = pending_calls(f);
    usage = loom__chat_usage_ext_json(&f->usage, f->cost_known);
    if ((rc = put_head(f, out, "chat.completion")) == 0 &&
        (rc = loom_buf_puts(out, ",\"choices\":[{\"index\":0,\"message\":"
                                 "{\"role\":\"assistant\",\"content\":")) == 0)
        rc = calls && !*f->text ? loom_buf_puts(out, "null")
                                : put_packed_string(out, f->text);
    if (!rc)
        rc = loom_buf_puts(out, ",\"refusal\":null");
    if (!rc && f->reasoning)
        rc = put_member_string(out, ",\"reasoning_content\":", f->reasoning);
    if (!rc && calls && (rc = loom_buf_puts(out, ",\"tool_calls\":")) == 0)
        rc = put_dump(out, calls);
    if (!rc &&
        (rc = loom_buf_puts(out, "},\"logprobs\":null,\"finish_reason\":")) ==
            0 &&
        (rc = put_packed_string(out, f->finish_reason)) == 0 &&
        (rc = loom_buf_puts(out, "}],\"usage\":")) == 0 &&
        (rc = put_dump(out, usage)) == 0 &&
        (rc = loom_buf_puts(out, ",\"tool_events\":")) == 0)
        rc = put_dump(out, f->tool_events);
    if (!rc && f->conversation_id)
        rc =
            put_member_string(out, ",\"conversation_id\":", f->conversation_id);
    if (!rc && f->cancelled)
        rc = loom_buf_puts(out, ",\"loom_status\":\"cancelled\"");
    if (!rc)
        rc = loom_buf_puts(out, "}");
    json_decref(calls);
    json_decref(usage);
    return rc;
}
