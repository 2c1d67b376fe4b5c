/*
 * The small endpoints: models and tools (what a client may ask for),
 * conversations (on top of loom_store_*), and operations (/healthz,
 * /readyz, /metrics). See docs/server.md for the shapes.
 */
#include "server/srvpriv.h"
#include "core/error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_PAGE 20
#define MAX_PAGE 100

/* ---- models and tools ---------------------------------------------------- */

static int has_id(const json_t *data, const char *id)
{
    size_t i;
    json_t *m;

    json_array_foreach(data, i, m)
    {
        if (!strcmp(json_string_value(json_object_get(m, "id")), id))
            return 1;
    }
    return 0;
}

/* Adds "provider/model" when it resolves and is not listed yet. */
static void add_model(srv_server *s, json_t *data, const char *name)
{
    const loom_model_config *m = NULL;
    loom_model_config tmp;
    json_t *o;

    memset(&tmp, 0, sizeof(tmp));
    if (!name || has_id(data, name) || srv_model(s, name, &m, &tmp) != 0)
        goto done;
    o = json_pack("{s:s,s:s,s:i,s:s}", "id", m->name, "object", "model",
                  "created", 0, "owned_by", m->provider);
    if (o && m->context_window)
        json_object_set_new(o, "context_window",
                            json_integer(m->context_window));
    if (o && m->max_output_tokens)
        json_object_set_new(o, "max_output_tokens",
                            json_integer(m->max_output_tokens));
    json_array_append_new(data, o);
done:
    loom_model_config_clear(&tmp);
}

/* GET /v1/models: the configured models, the agents' models and the
 * default model, in OpenAI's list shape. */
static int list_models(srv_request *r)
{
    srv_server *s = r->srv;
    const loom_config *c = srv_config(s);
    json_t *data = json_array();

    if (!data)
        return loom__error_oom();
    for (size_t i = 0; i < c->models_len; i++)
        add_model(s, data, c->models[i].name);
    for (size_t i = 0; i < c->agents_len; i++)
        add_model(s, data, c->agents[i].model);
    add_model(s, data, srv_default_model(s, NULL));
    return srv_reply_json(r, 200, json_pack("{s:s,s:o}", "object", "list",
                                            "data", data));
}

/* GET /v1/tools: name, description and schema of every server tool. */
static int list_tools(srv_request *r)
{
    const loom_tool_registry *reg = srv_tools(r->srv);
    json_t *data = json_array();

    if (!data)
        return loom__error_oom();
    for (size_t i = 0; i < loom_tool_registry_count(reg); i++) {
        const loom_tool *t = loom_tool_registry_at(reg, i);
        json_t *params = t->parameters
                             ? json_deep_copy(t->parameters)
                             : json_pack("{s:s,s:{}}", "type", "object",
                                         "properties");
        json_array_append_new(
            data, json_pack("{s:s,s:s,s:s?,s:o}", "object", "tool", "name",
                            t->name, "description", t->description,
                            "parameters", params));
    }
    return srv_reply_json(r, 200, json_pack("{s:s,s:o}", "object", "list",
                                            "data", data));
}

/* ---- conversations ------------------------------------------------------- */

static int list_conversations(srv_request *r)
{
    const char *ls = srv_query(r, "limit"), *after = srv_query(r, "after");
    long limit = DEFAULT_PAGE;
    json_t *out = NULL;
    char *end;
    int rc;

    if (ls) {
        errno = 0;
        limit = strtol(ls, &end, 10);
        if (errno || *end || !*ls || limit < 1 || limit > MAX_PAGE)
            return srv_reply_error(r, 400, NULL, "limit", "invalid_value",
                                   "limit must be an integer from 1 to %d",
                                   MAX_PAGE);
    }
    if (after && !*after)
        after = NULL;
    rc = loom_store_conversation_list(srv_store(r->srv), after, (int)limit,
                                      &out);
    if (rc != 0)
        return srv_reply_loom_error(r, rc, after ? "after" : NULL);
    json_object_set_new(out, "object", json_string("list"));
    return srv_reply_json(r, 200, out);
}

static int get_conversation(srv_request *r)
{
    json_t *out = NULL;
    int rc = loom_store_conversation_get(srv_store(r->srv), r->params[0],
                                         &out);

    if (rc != 0)
        return srv_reply_loom_error(r, rc, "id");
    json_object_set_new(out, "object", json_string("conversation"));
    return srv_reply_json(r, 200, out);
}

static int delete_conversation(srv_request *r)
{
    int rc = loom_store_conversation_delete(srv_store(r->srv), r->params[0]);

    if (rc != 0)
        return srv_reply_loom_error(r, rc, "id");
    return srv_reply_json(r, 200,
                          json_pack("{s:s,s:s,s:b}", "id", r->params[0],
                                    "object", "conversation.deleted",
                                    "deleted", 1));
}

/* ---- operations ---------------------------------------------------------- */

static int healthz(srv_request *r)
{
    return srv_reply_json(r, 200, json_pack("{s:s}", "status", "ok"));
}

static int readyz(srv_request *r)
{
    if (loom_store_ping(srv_store(r->srv)) != 0)
        return srv_reply_error(r, 503, NULL, NULL, "store_unavailable",
                               "the store does not answer: %s",
                               loom_error_last());
    if (atomic_load(&r->srv->draining))
        return srv_reply_error(r, 503, NULL, NULL, "shutting_down",
                               "the server is shutting down");
    return srv_reply_json(r, 200, json_pack("{s:s}", "status", "ready"));
}

static int metrics(srv_request *r)
{
    char *text = srv__metrics_render(r->srv);
    int rc;

    if (!text)
        return loom__error_oom();
    rc = srv_reply_text(r, 200, "text/plain; version=0.0.4; charset=utf-8",
                        text, strlen(text));
    free(text);
    return rc;
}

int srv__api_misc_routes(srv_router *rt)
{
    int rc;

    if ((rc = srv_route(rt, "GET", "/v1/models", list_models)) ||
        (rc = srv_route(rt, "GET", "/v1/tools", list_tools)) ||
        (rc = srv_route(rt, "GET", "/v1/conversations",
                        list_conversations)) ||
        (rc = srv_route(rt, "GET", "/v1/conversations/{id}",
                        get_conversation)) ||
        (rc = srv_route(rt, "DELETE", "/v1/conversations/{id}",
                        delete_conversation)) ||
        (rc = srv_route(rt, "GET", "/healthz", healthz)) ||
        (rc = srv_route(rt, "GET", "/readyz", readyz)) ||
        (rc = srv_route(rt, "GET", "/metrics", metrics)))
        return rc;
    return 0;
}
