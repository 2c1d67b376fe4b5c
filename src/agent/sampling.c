/*
 * Model calls a running tool makes for its run: loom_tool_sample
 * (loom/tools.h), which answers an MCP server's sampling/createMessage
 * with the run's model.
 *
 * The call runs on the tool's thread, which may outlive its run (a call
 * abandoned past its timeout), so it uses nothing the run owns. What it
 * needs comes with the call's host (subagent.h), which the call's thread
 * owns: the tree, whose reference keeps the session alive; the run's
 * model by name, resolved anew to a provider of the session's; and a
 * reference on the run's spend, so the run's budget holds for the call.
 * Its usage goes back to the run as a usage event of the call with a
 * purpose, which the run counts among its side calls (toolturn.h
 * on_usage). A call the run has abandoned has nobody left to tell: its
 * cost is then only in the spend.
 */
#include "agent/gate.h"
#include "agent/session_internal.h"
#include "agent/subagent.h"
#include "agent/toolexec.h"
#include "core/error.h"
#include "loom/log.h"
#include "loom/tools.h"

#include <stdlib.h>
#include <string.h>

/* ---- the request ------------------------------------------------------- */

/*
 * Appends one sampling message (role user or assistant; content a block
 * or an array of them: text, or an image as base64 data) to m. Other
 * content (audio, tool use and results) is refused: LOOM_EINVALID.
 */
static int add_sampling_message(loom_messages *m, const json_t *msg)
{
    const char *role = json_string_value(json_object_get(msg, "role"));
    const json_t *content = json_object_get(msg, "content"), *c;
    size_t n = json_is_array(content) ? json_array_size(content) : 1, i;
    loom_part *parts;
    int rc = 0;

    if (!role || (strcmp(role, "user") != 0 && strcmp(role, "assistant") != 0))
        return loom__error_set(LOOM_EINVALID,
                               "a sampling message's role must be user or "
                               "assistant");
    if (!json_is_array(content) && !json_is_object(content))
        return loom__error_set(LOOM_EINVALID,
                               "a sampling message needs content");
    if (!(parts = calloc(n ? n : 1, sizeof(*parts))))
        return loom__error_oom();
    for (i = 0; i < n && !rc; i++) {
        const char *type;
        c = json_is_array(content) ? json_array_get(content, i) : content;
        type = json_string_value(json_object_get(c, "type"));
        /* Borrowed: loom_messages_add_parts copies them. */
        if (type && strcmp(type, "text") == 0 &&
            json_is_string(json_object_get(c, "text"))) {
            parts[i].kind = LOOM_PART_TEXT;
            parts[i].text =
                (char *)json_string_value(json_object_get(c, "text"));
        } else if (type && strcmp(type, "image") == 0 &&
                   json_is_string(json_object_get(c, "data"))) {
            parts[i].kind = LOOM_PART_IMAGE;
            parts[i].data =
                (char *)json_string_value(json_object_get(c, "data"));
            parts[i].mime =
                (char *)json_string_value(json_object_get(c, "mimeType"));
        } else {
            rc = loom__error_set(LOOM_EINVALID,
                                 "sampling content of type '%.40s' is not "
                                 "supported (text and images are)",
                                 type ? type : "?");
        }
    }
    if (!rc)
        rc = loom_messages_add_parts(
            m, strcmp(role, "user") == 0 ? LOOM_ROLE_USER : LOOM_ROLE_ASSISTANT,
            parts, n);
    free(parts);
    return rc;
}

/* The request of a sampling/createMessage's params into req, its
 * messages into m and its stop sequences into p (both borrow from
 * params); max_tokens capped at cap. LOOM_EINVALID says what is wrong. */
static int sampling_request(const json_t *params, long cap, loom_messages *m,
                            loom_llm_params *p, loom_llm_request *req)
{
    const json_t *msgs = json_object_get(params, "messages"), *v;
    const json_t *stop = json_object_get(params, "stopSequences");
    const json_t *max = json_object_get(params, "maxTokens");
    const json_t *temp = json_object_get(params, "temperature");
    const char *system =
        json_string_value(json_object_get(params, "systemPrompt"));
    size_t i;
    int rc;

    if (json_object_get(params, "tools"))
        return loom__error_set(LOOM_EINVALID,
                               "tools in sampling requests are not supported "
                               "(loom does not declare sampling.tools)");
    if (!json_is_array(msgs) || !json_array_size(msgs))
        return loom__error_set(LOOM_EINVALID,
                               "a sampling request needs messages");
    if (stop &&
        (!json_is_array(stop) || json_array_size(stop) > LOOM_LLM_MAX_STOP))
        return loom__error_set(LOOM_EINVALID,
                               "stopSequences must be a list of at most %d "
                               "strings",
                               LOOM_LLM_MAX_STOP);
    if (system && *system &&
        (rc = loom_messages_add(m, LOOM_ROLE_SYSTEM, system)) != 0)
        return rc;
    json_array_foreach(msgs, i, v)
    {
        if ((rc = add_sampling_message(m, v)) != 0)
            return rc;
    }
    json_array_foreach(stop, i, v)
    {
        if (!json_is_string(v) || !*json_string_value(v))
            return loom__error_set(LOOM_EINVALID,
                                   "stopSequences must be non-empty strings");
        p->stop[p->stop_len++] = (char *)json_string_value(v);
    }
    req->messages = m->items;
    req->messages_len = m->len;
    req->max_tokens = cap;
    if (json_is_integer(max) && json_integer_value(max) >= 1 &&
        json_integer_value(max) < cap)
        req->max_tokens = (long)json_integer_value(max);
    if (json_is_number(temp) && json_number_value(temp) >= 0)
        req->temperature = json_number_value(temp);
    if (p->stop_len)
        req->params = p;
    req->stream = 0;
    return 0;
}

/* MCP's stopReason for a finish reason ("stop", "length"...). */
static const char *stop_reason(const char *finish)
{
    if (!finish || strcmp(finish, "stop") == 0)
        return "endTurn";
    if (strcmp(finish, "length") == 0)
        return "maxTokens";
    return finish;
}

/* ---- the call ---------------------------------------------------------- */

/* Stops the call when the run is cancelled (payload: its cancel). */
static int on_model_event(const loom_llm_event *ev, void *payload)
{
    (void)ev;
    return loom_cancel_is_set(payload);
}

/*
 * Makes req with the model of the call's run (see the top) and sends its
 * usage to the run as a side call of purpose. resp->model is the model
 * that answered, the run's when the provider does not say.
 * LOOM_ENOTFOUND when the call has no run.
 */
static int run_model_call(const loom_tool_ctx *ctx, const char *purpose,
                          const loom_llm_request *req, loom_llm_response *resp)
{
    const loom__tool_host *h = ctx ? ctx->host : NULL;
    loom_provider *owned = NULL, *use = NULL;
    loom_model_request_options mreq;
    loom_llm_request r = *req;
    loom__gate gate = {0};
    json_t *ev;
    int rc;

    if (!h || !h->tree || !h->model || !ctx->events)
        return loom__error_set(LOOM_ENOTFOUND,
                               "the call has no run to make a model call "
                               "for");
    if ((rc = loom__session_model(loom__agent_tree_session(h->tree), h->model,
                                  &owned, &use, &mreq)) != 0)
        return rc;
    r.model = mreq.upstream;
    gate.spend = h->spend;
    rc = loom__gated_complete(&gate, use, &r, on_model_event, ctx->cancel, resp,
                              ctx->cancel);
    if (!rc && !resp->model && !(resp->model = strdup(h->model)))
        rc = loom__error_oom();
    ev = json_pack("{s:s,s:s,s:o}", "purpose", purpose, "model",
                   resp->model ? resp->model : h->model, "usage",
                   loom__usage_full(&resp->usage, resp->cost_known != 0,
                                    resp->cost_known == 0));
    /* Dropped when the run no longer listens: see the top. */
    if (ev)
        loom__tool_ctx_event(ctx, LOOM_EV_USAGE, ev);
    loom_provider_free(owned);
    return rc;
}

int loom_tool_sample(const loom_tool_ctx *ctx, const json_t *params,
                     long max_tokens, json_t **result)
{
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_llm_response resp;
    loom_llm_params p;
    loom_messages m = {0};
    int rc;

    *result = NULL;
    memset(&p, 0, sizeof(p));
    memset(&resp, 0, sizeof(resp));
    if ((rc = sampling_request(
             params, max_tokens > 0 ? max_tokens : LOOM_MCP_SAMPLING_MAX_TOKENS,
             &m, &p, &req)) == 0 &&
        (rc = run_model_call(ctx, "mcp_sampling", &req, &resp)) == 0 &&
        !(*result = json_pack("{s:s,s:{s:s,s:s},s:s,s:s}", "role", "assistant",
                              "content", "type", "text", "text",
                              resp.text ? resp.text : "", "model", resp.model,
                              "stopReason", stop_reason(resp.finish_reason))))
        rc = loom__error_oom();
    if (rc == 0)
        loom_debug("sampled %ld tokens of %s for tool %s",
                   resp.usage.completion_tokens, resp.model,
                   ctx->tool_name ? ctx->tool_name : "?");
    loom_llm_response_clear(&resp);
    loom_messages_free(&m);
    return rc;
}
