/*
 * The OpenAI Responses API adapter (provider kind "openai-responses"):
 * POST {base_url}/responses, streamed.
 *
 * This file builds the request body from loom's provider-neutral request;
 * the provider object, its headers and the I/O through the attempt loop
 * are what every HTTP adapter shares (llm/adapter.c, llm/attempt.c:
 * retries before output starts, Retry-After, errors);
 * decoding the answer is llm/responses_stream.c's job, which does no I/O.
 *
 * The body differs from Chat Completions in shape more than in content:
 * the leading system messages become "instructions", the conversation is
 * a list of input items (messages, function_call, function_call_output),
 * tools are flat ({type, name, description, parameters, strict}), and two
 * things make a conversation cheaper or possible at all on reasoning
 * models. Chaining (loom_llm_request.chain_responses):
 * the API stores each response, and the next request
 * names it by previous_response_id and sends only what came after it.
 * Reasoning items: without chaining nothing is stored ("store": false),
 * so the reasoning items a response produced are kept in the assistant
 * message's provider_state (with their encrypted_content, which the
 * request asks for on reasoning models) and sent back on the next
 * request, where the API needs them beside the calls they led to.
 */
#include "llm/responses.h"
#include "core/error.h"
#include "llm/adapter.h"
#include "llm/openai.h"
#include "llm/params.h"
#include "llm/parts.h"
#include "loom/buf.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- request body ---------------------------------------------------- */

/* Appends item to arr, stealing it; -1 when item is NULL or on OOM. */
static int append(json_t *arr, json_t *item)
{
    return item ? json_array_append_new(arr, item) : -1;
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

    if (o && loom__llm_put(o, "content", loom__llm_json_string(text))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* A user message item of m's text, images and files. */
static json_t *parts_item(const loom_message *m)
{
    json_t *o = json_pack("{s:s,s:s}", "type", "message", "role", "user");

    if (o && loom__llm_put(o, "content", loom__parts_responses(m))) {
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

    if (o && ((id && loom__llm_put(o, "id", json_string(id))) ||
              loom__llm_put(o, "call_id", loom__llm_json_string(c->id)) ||
              loom__llm_put(o, "name", loom__llm_json_string(c->name)) ||
              loom__llm_put(o, "arguments", loom__llm_json_string(args)))) {
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
        ((json_is_string(id) &&
          loom__llm_put(o, "id", json_copy((json_t *)id))) ||
         loom__llm_put(o, "summary",
                       json_is_array(summary) ? json_deep_copy(summary)
                                              : json_array()) ||
         (json_is_string(enc) &&
          loom__llm_put(o, "encrypted_content", json_copy((json_t *)enc))))) {
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
        const char *type = loom__llm_jstr(e, "type");
        if (type && !strcmp(type, "reasoning") &&
            !reasoning_sendable(e, stored))
            ids = 0;
    }
    json_array_foreach(output, i, e)
    {
        const char *type = loom__llm_jstr(e, "type");
        const char *id = ids ? loom__llm_jstr(e, "id") : NULL;
        const char *cid = loom__llm_jstr(e, "call_id");

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

/* The output of a tool result with images: its text as input_text (none
 * when empty), then the images as input_image items. */
static json_t *tool_output_media(const loom_message *m)
{
    json_t *arr = loom__parts_responses(m);

    if (arr && m->content && *m->content &&
        json_array_insert_new(arr, 0,
                              json_pack("{s:s,s:o}", "type", "input_text",
                                        "text",
                                        loom__llm_json_string(m->content)))) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

static int message_items(json_t *input, const loom_message *m)
{
    json_t *o;

    switch (m->role) {
    case LOOM_ROLE_ASSISTANT:
        return assistant_items(input, m);
    case LOOM_ROLE_TOOL:
        o = json_pack("{s:s}", "type", "function_call_output");
        if (o && (loom__llm_put(o, "call_id",
                                loom__llm_json_string(m->tool_call_id)) ||
                  loom__llm_put(o, "output",
                                loom_message_has_media(m)
                                    ? tool_output_media(m)
                                    : loom__llm_json_string(m->content)))) {
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
        if (loom_message_has_media(m))
            return append(input, parts_item(m));
        return append(input, text_item("user", m->content));
    }
}

static json_t *tool_json(const loom_tool_def *t)
{
    json_t *o = json_pack("{s:s}", "type", "function");

    if (o &&
        (loom__llm_put(o, "name", loom__llm_json_string(t->name)) ||
         (t->description &&
          loom__llm_put(o, "description",
                        loom__llm_json_string(t->description))) ||
         loom__llm_put(o, "parameters",
                       t->parameters ? json_deep_copy(t->parameters)
                                     : json_pack("{s:s,s:{}}", "type", "object",
                                                 "properties")) ||
         loom__llm_put(o, "strict", json_false()))) {
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
        if (o &&
            loom__llm_put(o, "name", loom__llm_json_string(tc->function))) {
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
        s = loom__llm_jstr(st, "id");
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
    const char *effort =
        loom__params_effort(req->params, req->reasoning_effort);
    loom_buf instr = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    json_t *body = NULL, *input;
    size_t leading = 0, start, at = 0;
    char *prev = NULL;
    int store = req->chain_responses != 0;
    int bad = 0, rc;

    *out = NULL;
    if ((rc = loom__llm_request_check(req)) != 0)
        return rc;
    if (req->temperature >= 0 && !isfinite(req->temperature))
        return loom__error_set(LOOM_EINVALID, "temperature is not finite");
    if (instructions(req, &leading, &instr) ||
        (store && chain_point(req, &at, &prev)) || !(body = json_object())) {
        bad = 1;
        goto cleanup;
    }
    start = prev && at + 1 > leading ? at + 1 : leading;
    bad |= loom__llm_put(body, "model", loom__llm_json_string(req->model));
    if (instr.len)
        bad |= loom__llm_put(body, "instructions",
                             loom__llm_json_string(loom_buf_cstr(&instr)));
    if (prev)
        bad |= loom__llm_put(body, "previous_response_id",
                             loom__llm_json_string(prev));
    bad |= loom__llm_put(body, "input", input = json_array());
    for (size_t i = start; !bad && i < req->messages_len; i++)
        bad |= message_items(input, &req->messages[i]);
    if (!bad && req->tools_len)
        bad |= loom__openai_put_tools(body, req, tool_json, tool_choice_json);
    if (req->max_tokens > 0)
        bad |= loom__llm_put(body, "max_output_tokens",
                             json_integer(req->max_tokens));
    if (req->temperature >= 0)
        bad |= loom__llm_put(body, "temperature", json_real(req->temperature));
    if (effort)
        bad |= loom__llm_put(body, "reasoning",
                             json_pack("{s:s}", "effort", effort));
    bad |= loom__params_put_responses(body, req->params);
    bad |= loom__llm_put(body, "store", json_boolean(store));
    /* Reasoning can only come back from an unstored response with its
     * encrypted content; only reasoning models have any to give (others
     * refuse the include). */
    if (!store && effort)
        bad |= loom__llm_put(body, "include",
                             json_pack("[s]", "reasoning.encrypted_content"));
    if (req->stream)
        bad |= loom__llm_put(body, "stream", json_true());

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
    loom__llm_adapter a; /* first: the part every adapter has */
    loom__responses_limits limits;
} responses_provider;

void loom__responses_provider_set_limits(loom_provider *base,
                                         const loom__responses_limits *lim)
{
    ((responses_provider *)base)->limits = *lim;
}

static size_t max_body(const loom__llm_adapter *a)
{
    const responses_provider *p = (const responses_provider *)a;
    size_t text =
        p->limits.max_text ? p->limits.max_text : LOOM_RESPONSES_MAX_TEXT;

    return p->limits.max_body ? p->limits.max_body
                              : 3 * text + ((size_t)1 << 20);
}

/* What the decoder of req is made with: whether the API stores it. */
static long decoder_arg(const loom_llm_request *req)
{
    return req->chain_responses != 0;
}

static int dec_new(void **out, void *payload)
{
    const loom__llm_decoder_args *x = payload;
    const responses_provider *p = (const responses_provider *)x->adapter;
    loom__responses_decoder *d = NULL;
    int rc = loom__responses_decoder_new(&d, &p->limits, (int)x->arg, x->cb,
                                         x->payload);

    *out = d;
    return rc;
}

/* An in-stream server_error before any output is worth another try;
 * other in-stream errors (a bad request found late) are not. */
static int stream_error_retryable(const loom_upstream_error *err)
{
    return err->type && !strcmp(err->type, "server_error");
}

/* The same headers as the "openai" provider (docs/providers.md). */
static const loom__llm_adapter_spec responses_spec = {
    .kind = LOOM_RESPONSES_KIND,
    .path = "/responses",
    .key_header = "Authorization",
    .key_prefix = "Bearer ",
    .build_json = loom__responses_build_body,
    .decoder_arg = decoder_arg,
    .max_body = max_body,
    .decoder_new = dec_new,
    .error_from_http = loom__openai_error_from_http,
    .stream_error_retryable = stream_error_retryable,
};

int loom_provider_responses_new(loom_provider **out,
                                const loom_provider_config *config)
{
    return loom__llm_adapter_new(out, sizeof(responses_provider),
                                 &responses_spec, config);
}
