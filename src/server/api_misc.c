/*
 * The small endpoints: models and tools (what a client may ask for),
 * conversations (on top of loom_store_*), and operations (/healthz,
 * /readyz, /metrics). See docs/server.md for the shapes.
 */
#include "server/srvpriv.h"
#include "core/error.h"

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

/* The model object of "provider/model" when it resolves; NULL when not. */
static json_t *model_object(srv_server *s, const char *name)
{
    const loom_model_config *m = NULL;
    loom_model_config tmp;
    json_t *o = NULL;

    memset(&tmp, 0, sizeof(tmp));
    if (!name || srv_model(s, name, &m, &tmp) != 0 ||
        !srv_provider(s, m->provider))
        goto done;
    o = json_pack("{s:s,s:s,s:i,s:s}", "id", m->name, "object", "model",
                  "created", 0, "owned_by", m->provider);
    if (o && m->context_window)
        json_object_set_new(o, "context_window",
                            json_integer(m->context_window));
    if (o && m->max_output_tokens)
        json_object_set_new(o, "max_output_tokens",
                            json_integer(m->max_output_tokens));
done:
    loom_model_config_clear(&tmp);
    return o;
}

/* An agent as a model: "agent/<name>", its model in the "loom" field. */
static json_t *agent_object(srv_server *s, const loom_agent_config *a)
{
    json_t *o = json_pack("{s:s+,s:s,s:i,s:s,s:{s:s,s:s?}}", "id",
                          LOOM_AGENT_MODEL_PREFIX, a->name, "object", "model",
                          "created", 0, "owned_by", "loom", "loom", "agent",
                          a->name, "model", srv_default_model(s, a));
    return o;
}

/* Adds "provider/model" when it resolves and is not listed yet. */
static void add_model(srv_server *s, json_t *data, const char *name)
{
    if (name && !has_id(data, name))
        json_array_append_new(data, model_object(s, name));
}

/* GET /v1/models: the configured models, the agents' models, the
 * default model, then every agent as "agent/<name>", in OpenAI's list
 * shape. In the offline demo the list says so ("loom" field). */
static int list_models(srv_request *r)
{
    srv_server *s = r->srv;
    const loom_config *c = srv_config(s);
    json_t *data = json_array(), *out;

    if (!data)
        return loom__error_oom();
    for (size_t i = 0; i < c->models_len; i++)
        add_model(s, data, c->models[i].name);
    for (size_t i = 0; i < c->agents_len; i++)
        add_model(s, data, c->agents[i].model);
    add_model(s, data, srv_default_model(s, NULL));
    for (size_t i = 0; i < c->agents_len; i++)
        json_array_append_new(data, agent_object(s, &c->agents[i]));
    out = json_pack("{s:s,s:o}", "object", "list", "data", data);
    if (out && s->offline_demo)
        json_object_set_new(out, "loom", json_pack("{s:b}", "offline_demo", 1));
    return srv_reply_json(r, 200, out);
}

/*
 * GET /v1/models/{id}: an agent ("agent/<name>") or a model by its
 * "provider/model" id (listed, or unlisted with a running provider); a
 * bare name, which chat requests resolve to a model, is no model id.
 */
static int get_model(srv_request *r)
{
    const char *id = r->params[0];
    const loom_agent_config *agent = NULL;
    char *model = NULL;
    json_t *o = NULL;

    if (loom_session_resolve_model(srv_session(r->srv), id, &agent, &model) ==
        0)
        o = agent                    ? agent_object(r->srv, agent)
            : strcmp(model, id) == 0 ? model_object(r->srv, id)
                                     : NULL;
    free(model);
    if (!o)
        return srv_reply_error(r, 404, "invalid_request_error", "model",
                               "model_not_found",
                               "The model `%s` does not exist or you do not "
                               "have access to it.",
                               id);
    return srv_reply_json(r, 200, o);
}

/* GET /v1/tools: name, description and schema of every server tool (the
 * MCP servers' as they are now: it waits for one still starting). */
static int list_tools(srv_request *r)
{
    loom_tool_registry *reg = NULL;
    json_t *data = json_array();
    int rc;

    if (!data)
        return loom__error_oom();
    if ((rc = loom_tool_registry_snapshot(&reg, srv_tools(r->srv))) != 0) {
        json_decref(data);
        return rc;
    }
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
    loom_tool_registry_free(reg);
    return srv_reply_json(r, 200, json_pack("{s:s,s:o}", "object", "list",
                                            "data", data));
}

/* ---- conversations ------------------------------------------------------- */

static int list_conversations(srv_request *r)
{
    const char *after = srv_query(r, "after");
    const char *q = srv_query(r, "q");
    const char *who = NULL;
    char owner[SRV_OWNER_SIZE];
    long limit = DEFAULT_PAGE;
    json_t *out = NULL;
    int rc;

    if (!srv_query_long(r, "limit", 1, MAX_PAGE, &limit))
        return 0;
    if (after && !*after)
        after = NULL;
    if ((rc = srv_request_owner(r, NULL, owner, &who)) != 1)
        return rc;
    rc = loom_store_conversation_search(srv_store(r->srv),
                                        srv_isolated(r) ? who : NULL, q, after,
                                        (int)limit, &out);
    if (rc != 0)
        return srv_reply_loom_error(r, rc,
                                    rc == LOOM_ENOTFOUND ? "after" : "q");
    json_object_set_new(out, "object", json_string("list"));
    return srv_reply_json(r, 200, out);
}

/*
 * 0 when the conversation of the path is there for the caller
 * (srv_owns); LOOM_ENOTFOUND, as for an unknown one, when it is not. A
 * store read when isolated.
 */
static int path_conversation(srv_request *r)
{
    loom_conversation_info info;
    int rc, mine;

    if (!srv_isolated(r))
        return 0;
    if ((rc = loom_store_conversation_info(srv_store(r->srv), r->params[0],
                                           &info)) != 0)
        return rc;
    mine = srv_owns(r, info.user_id, NULL);
    loom_conversation_info_clear(&info);
    return mine ? 0
                : loom__error_set(LOOM_ENOTFOUND, "conversation '%s' not found",
                                  r->params[0]);
}

static int get_conversation(srv_request *r)
{
    json_t *out = NULL;
    int rc = path_conversation(r);

    if (rc == 0)
        rc = loom_store_conversation_get(srv_store(r->srv), r->params[0], &out);
    if (rc != 0)
        return srv_reply_loom_error(r, rc, "id");
    json_object_set_new(out, "object", json_string("conversation"));
    return srv_reply_json(r, 200, out);
}

static int delete_conversation(srv_request *r)
{
    int rc = path_conversation(r);

    if (rc == 0)
        rc = loom_store_conversation_delete(srv_store(r->srv), r->params[0]);

    if (rc != 0)
        return srv_reply_loom_error(r, rc, "id");
    return srv_reply_json(r, 200,
                          json_pack("{s:s,s:s,s:b}", "id", r->params[0],
                                    "object", "conversation.deleted",
                                    "deleted", 1));
}

/*
 * POST /v1/conversations/{id}/branches {"from_message": "msg_..."}: a
 * branch of the conversation to edit that user message (its history is
 * the messages before it); the caller then runs its edited message on
 * the branch (POST /v1/runs with its conversation_id). Answers 201 with
 * the branch as GET /v1/conversations/{id} shows it.
 */
static int branch_conversation(srv_request *r)
{
    static const char *const known[] = {"from_message", NULL};
    const json_t *from;
    json_t *out = NULL;
    char *id = NULL;
    int rc;

    if (!srv_body_only_known(r, known))
        return 0;
    from = json_object_get(r->json, "from_message");
    if (!json_is_string(from))
        return srv_reply_error(r, 400, NULL, "from_message", "invalid_value",
                               "`from_message` must be a message id");
    if ((rc = path_conversation(r)) != 0 ||
        (rc = loom_store_conversation_branch(srv_store(r->srv), r->params[0],
                                             json_string_value(from), &id)) !=
            0 ||
        (rc = loom_store_conversation_get(srv_store(r->srv), id, &out)) != 0) {
        free(id);
        return srv_reply_loom_error(
            r, rc, rc == LOOM_ENOTFOUND ? "id" : "from_message");
    }
    free(id);
    json_object_set_new(out, "object", json_string("conversation"));
    return srv_reply_json(r, 201, out);
}

/* The conversation's summary fields, as its list shows them. */
static int get_info(srv_request *r)
{
    loom_conversation_info c;
    int rc = loom_store_conversation_info(srv_store(r->srv), r->params[0], &c);

    if (rc != 0)
        return srv_reply_loom_error(r, rc, "id");
    rc = srv_reply_json(r, 200,
                        json_pack("{s:s,s:s,s:s,s:I,s:I}", "id", c.id, "object",
                                  "conversation", "title", c.title,
                                  "created_at", (json_int_t)c.created_at,
                                  "updated_at", (json_int_t)c.updated_at));
    loom_conversation_info_clear(&c);
    return rc;
}

/* PATCH /v1/conversations/{id} {"title": "..."}: a rename. */
static int patch_conversation(srv_request *r)
{
    static const char *const known[] = {"title", NULL};
    const json_t *title;
    int rc;

    if (!srv_body_only_known(r, known))
        return 0;
    title = json_object_get(r->json, "title");
    if (!json_is_string(title))
        return srv_reply_error(r, 400, NULL, "title", "invalid_value",
                               "`title` must be a string");
    if ((rc = path_conversation(r)) != 0 ||
        (rc = loom_store_conversation_rename(srv_store(r->srv), r->params[0],
                                             json_string_value(title))) != 0)
        return srv_reply_loom_error(r, rc,
                                    rc == LOOM_ENOTFOUND ? "id" : "title");
    return get_info(r);
}

/* ---- operations ---------------------------------------------------------- */

static int healthz(srv_request *r)
{
    return srv_reply_json(r, 200, json_pack("{s:s}", "status", "ok"));
}

/*
 * Ready when the store answers. "capacity" says what the limits allow
 * (connections, streamed runs, the admission queue). The MCP servers are
 * reported (their state, protocol version, tool count, the last error) but
 * never make loom unready: a run goes on without the tools of a server that is
 * down, so turning traffic away for it would only make things worse.
 */
static int readyz(srv_request *r)
{
    json_t *o, *mcp;

    if (loom_store_ping(srv_store(r->srv)) != 0)
        return srv_reply_error(r, 503, NULL, NULL, "store_unavailable",
                               "the store does not answer: %s",
                               loom_error_last());
    if (atomic_load(&r->srv->draining))
        return srv_reply_error(r, 503, NULL, NULL, "shutting_down",
                               "the server is shutting down");
    o = json_pack("{s:s,s:o}", "status", "ready", "capacity",
                  srv__capacity_json(r->srv));
    if (o && r->srv->offline_demo)
        json_object_set_new(o, "offline_demo", json_true());
    if (o && r->srv->mcp_servers) {
        if (!(mcp = loom_mcp_set_status(r->srv->mcp_servers)) ||
            json_object_set_new(o, "mcp_servers", mcp) != 0) {
            json_decref(o);
            o = NULL;
        }
    }
    return o ? srv_reply_json(r, 200, o) : loom__error_oom();
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
        (rc = srv_route(rt, "GET", "/v1/models/{id...}", get_model)) ||
        (rc = srv_route(rt, "GET", "/v1/tools", list_tools)) ||
        (rc = srv_route(rt, "GET", "/v1/conversations", list_conversations)) ||
        (rc = srv_route(rt, "GET", "/v1/conversations/{id}",
                        get_conversation)) ||
        (rc = srv_route(rt, "DELETE", "/v1/conversations/{id}",
                        delete_conversation)) ||
        (rc = srv_route(rt, "PATCH", "/v1/conversations/{id}",
                        patch_conversation)) ||
        (rc = srv_route(rt, "POST", "/v1/conversations/{id}/branches",
                        branch_conversation)) ||
        (rc = srv_route(rt, "GET", "/healthz", healthz)) ||
        (rc = srv_route(rt, "GET", "/readyz", readyz)) ||
        (rc = srv_route(rt, "GET", "/metrics", metrics)))
        return rc;
    return 0;
}
