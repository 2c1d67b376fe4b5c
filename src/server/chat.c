/*
 * POST /v1/chat/completions: loom behind OpenAI's Chat Completions API
 * (docs/openai-compat.md), so existing SDKs and chat UIs work unchanged.
 *
 * The handler parses the request (chat_format.c), resolves the model (a
 * configured model, or agent/<name>), works out the tools (names given as
 * strings are loom's own and loom runs them; full specs are the
 * client's), and starts a run through the
 * run manager. It never waits on the server thread: a streamed answer
 * drains the run's event log through the chunk formatter as events come
 * (srv_reply_sse); a non-streamed one is deferred until the run ends and
 * then rendered from the whole log (srv_defer). The conversation id is
 * known once the run has started, so it goes out first: in the
 * X-Loom-Conversation-Id header and on the stream's first chunk.
 */
#include "core/error.h"
#include "server/chat_format.h"
#include "server/chat_parts.h"
#include "server/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONV_HEADER "X-Loom-Conversation-Id"

static int reply_chat_error(srv_request *r, const loom__chat_error *e)
{
    return srv_reply_error(r, (unsigned)(e->status ? e->status : 500),
                           e->type, e->param, e->code, "%s",
                           e->message ? e->message : "out of memory");
}

/* ---- model and agent ------------------------------------------------- */

typedef struct {
    const loom_agent_config *agent; /* agent/<name>, else NULL */
    char *model;                    /* "provider/model" for a plain model */
} chat_target;

/* "agent/a, p/m1, p/<model>": what a client may name, for a 404. */
static char *known_models(const loom_config *cfg)
{
    /* The config is loom's own, and already bounded. */
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);

    for (size_t i = 0; i < cfg->agents_len; i++)
        if (loom_buf_printf(&b, "%s" LOOM_AGENT_MODEL_PREFIX "%s",
                            b.len ? ", " : "", cfg->agents[i].name))
            break;
    for (size_t i = 0; i < cfg->models_len; i++)
        if (loom_buf_printf(&b, "%s%s", b.len ? ", " : "",
                            cfg->models[i].name))
            break;
    for (size_t i = 0; i < cfg->providers_len; i++)
        if (loom_buf_printf(&b, "%s%s/<model>", b.len ? ", " : "",
                            cfg->providers[i].name))
            break;
    return loom_buf_detach(&b);
}

static int model_not_found(srv_request *r, const char *name)
{
    char *known = known_models(srv_config(r->srv));
    int rc = srv_reply_error(
        r, 404, "invalid_request_error", "model", "model_not_found",
        "The model `%s` does not exist or you do not have access to it. "
        "Available: %s.", name, known && *known ? known : "(none)");
    free(known);
    return rc;
}

/*
 * Resolves the request's model by loom's one rule for model names
 * (loom_session_resolve_model, docs/routing.md#model-names): an agent
 * ("agent/<name>") or a model whose provider is running. 1 when
 * resolved, 0 when not (the 404 has been sent), < 0 on error.
 */
static int resolve_target(srv_request *r, const char *name, chat_target *t)
{
    const loom_model_config *m = NULL;
    loom_model_config tmp;
    int rc;

    memset(t, 0, sizeof(*t));
    if (!srv_config(r->srv)->providers_len)
        return srv_reply_loom_error(r, SRV_ENOPROVIDER, NULL);
    rc = loom_session_resolve_model(srv_session(r->srv), name, &t->agent,
                                    &t->model);
    if (rc == 0 && t->model) {
        rc = srv_model(r->srv, t->model, &m, &tmp);
        if (rc == 0 && !srv_provider(r->srv, m->provider))
            rc = LOOM_ENOTFOUND;
        loom_model_config_clear(&tmp);
    }
    if (rc == 0)
        return 1;
    free(t->model);
    t->model = NULL;
    if (rc != LOOM_ENOTFOUND && rc != LOOM_EINVALID)
        return rc;
    rc = model_not_found(r, name);
    return rc ? rc : 0;
}

/*
 * Images and files go only to a model whose config says it takes them
 * (capabilities.vision, false by default): a model that cannot see would
 * answer as if nothing were attached, or its provider would fail the run
 * after the client waited. 1 when the request may go on, 0 when the 400
 * has been sent, < 0 on error.
 */
static int check_vision(srv_request *r, const loom__chat_request *req,
                        const chat_target *t)
{
    loom__chat_error err;
    int rc;

    memset(&err, 0, sizeof(err));
    rc = loom__chat_media_check(r->srv, &req->messages, t->model, t->agent,
                                req->model, "messages", &err);
    if (rc == LOOM_EINVALID)
        rc = reply_chat_error(r, &err);
    loom__chat_error_clear(&err);
    return rc == 1 ? 1 : rc ? rc : 0;
}

/* ---- streaming and deferred answers ----------------------------------- */

/* The stream never ends on an event: [DONE] waits for the run's end. */
static int sse_format(srv_run *run, const srv_event *ev, loom_buf *out,
                      void *payload)
{
    int rc = loom__chat_fmt_logged(payload, ev, srv_run_id(run), out);

    return rc < 0 ? rc : SRV_SSE_CONTINUE;
}

static void sse_begin(srv_run *run, loom_buf *out, void *payload)
{
    (void)run;
    (void)loom__chat_fmt_begin(payload, out);
}

/* The run has ended and its turn is stored: now [DONE]. */
static void sse_end(srv_run *run, loom_buf *out, void *payload)
{
    (void)run;
    (void)loom__chat_fmt_end(payload, out);
}

static void fmt_free(void *payload)
{
    loom__chat_fmt_free(payload);
}

/*
 * The terminal event rebuilt from the finished run, for a log that lost
 * it (an event log past max_run_events_bytes drops its oldest events).
 */
static json_t *terminal_from_result(srv_run *run, loom_event_type *type)
{
    const loom_run *lr = srv_run_result(run);
    const loom_usage *u;
    const loom_tool_call *calls;
    json_t *d, *pc;
    size_t n = 0;

    if (!lr)
        return NULL;
    u = loom_run_usage(lr);
    d = json_pack("{s:s,s:s?,s:{s:I,s:I,s:I,s:I,s:I,s:I}}", "text",
                  loom_run_text(lr), "finish_reason",
                  loom_run_finish_reason(lr), "usage", "prompt_tokens",
                  (json_int_t)u->prompt_tokens, "completion_tokens",
                  (json_int_t)u->completion_tokens, "cached_tokens",
                  (json_int_t)u->cached_tokens, "reasoning_tokens",
                  (json_int_t)u->reasoning_tokens, "total_tokens",
                  (json_int_t)u->total_tokens, "cache_write_tokens",
                  (json_int_t)u->cache_write_tokens);
    if (d && loom_run_cost_known(lr))
        json_object_set_new(json_object_get(d, "usage"), "cost_micros",
                            json_integer((json_int_t)u->cost_micros));
    if (d && loom_run_status_get(lr) != LOOM_RUN_COMPLETED) {
        *type = LOOM_EV_RUN_FAILED;
        json_object_set_new(
            d, "status",
            json_string(loom_run_status_name(loom_run_status_get(lr))));
        json_object_set_new(d, "error",
                            json_pack("{s:s,s:s}", "code", "ERROR", "message",
                                      loom_run_error(lr)));
        return d;
    }
    *type = LOOM_EV_RUN_COMPLETED;
    calls = loom_run_pending_calls(lr, &n);
    if (d && n && (pc = json_array())) {
        for (size_t i = 0; i < n; i++)
            json_array_append_new(
                pc, json_pack("{s:s,s:s,s:s}", "id", calls[i].id, "name",
                              calls[i].name, "arguments",
                              calls[i].arguments));
        json_object_set_new(d, "pending_tool_calls", pc);
    }
    return d;
}

static int deferred_done(srv_request *r, srv_run *run, void *payload)
{
    loom__chat_fmt *f = payload;
    uint64_t last = srv_run_last_seq(run, NULL);
    loom__chat_error e;
    /* Made of an answer under the decoder limits. */
    loom_buf text = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    size_t len;
    int rc;

    /* A budget refused the run's first model call: nothing was said. */
    if (srv_run_quota_refused(run))
        return srv_reply_quota(r, NULL);
    /* An answer the conversation does not hold is no answer. */
    if (!srv_run_stored(run))
        return srv_reply_error(
            r, 500, "server_error", NULL, "store_failed",
            "run %s ended (%s) but its turn could not be stored: %s",
            srv_run_id(run), loom_run_status_name(srv_run_status(run)),
            srv_run_store_error(run) ? srv_run_store_error(run)
                                     : "unknown error");
    for (uint64_t seq = 1; seq <= last; seq++) {
        const srv_event *ev = srv_run_event(run, seq);
        if (ev &&
            (rc = loom__chat_fmt_logged(f, ev, srv_run_id(run), NULL)) != 0)
            return rc;
    }
    if (!loom__chat_fmt_done(f)) {
        loom_event le;
        memset(&le, 0, sizeof(le));
        le.run_id = srv_run_id(run);
        le.data = terminal_from_result(run, &le.type);
        if (!le.data)
            return srv_reply_error(r, 500, "server_error", NULL, NULL,
                                   "the run ended without a result");
        rc = loom__chat_fmt_event(f, &le, NULL);
        json_decref(le.data);
        if (rc)
            return rc;
    }
    if (loom__chat_fmt_failure(f)) {
        memset(&e, 0, sizeof(e));
        rc = loom__chat_error_from_failure(&e, loom__chat_fmt_failure(f));
        srv_pass_rate_headers(r, loom__chat_fmt_failure(f));
        rc = rc == LOOM_EINVALID ? reply_chat_error(r, &e) : rc;
        loom__chat_error_clear(&e);
        return rc;
    }
    /* Written as text once, sent from that buffer. */
    if ((rc = loom__chat_fmt_completion_text(f, &text)) != 0) {
        loom_buf_free(&text);
        return rc;
    }
    len = text.len;
    return srv_reply_json_text(r, 200, loom_buf_detach(&text), len);
}

/* ---- the handler ----------------------------------------------------- */

/* Position after the request's last assistant message (0: none). */
static size_t after_last_assistant(const loom_messages *m)
{
    for (size_t i = m->len; i-- > 0;)
        if (m->items[i].role == LOOM_ROLE_ASSISTANT)
            return i + 1;
    return 0;
}

/* The conversation id from the body or the header; they must agree. */
static int conversation_id(srv_request *r, const loom__chat_request *req,
                           const char **out)
{
    const char *h = srv_header(r, CONV_HEADER);

    *out = req->conversation_id;
    if (h && *h) {
        if (strlen(h) > 128)
            return srv_reply_error(r, 400, "invalid_request_error",
                                   "conversation_id", "invalid_value",
                                   "The " CONV_HEADER " header is longer "
                                   "than 128 characters.");
        if (*out && strcmp(*out, h) != 0)
            return srv_reply_error(
                r, 400, "invalid_request_error", "conversation_id",
                "invalid_value",
                "conversation_id '%s' and the " CONV_HEADER " header '%s' "
                "differ.", *out, h);
        *out = h;
    }
    return 1;
}

/*
 * The X-Loom-Server-Tool-Calls header ("inline" or "separate"): where a
 * stream puts loom's own tool calls; it wins over the request field.
 * 1 when fine, else the 400 has been sent.
 */
static int server_calls_header(srv_request *r, loom__chat_request *req)
{
    const char *h = srv_header(r, LOOM__CHAT_SERVER_CALLS_HEADER);
    int mode;

    if (!h || !*h)
        return 1;
    if ((mode = loom__chat_server_calls_mode(h)) < 0)
        return srv_reply_error(r, 400, "invalid_request_error",
                               LOOM__CHAT_SERVER_CALLS_FIELD, "invalid_value",
                               "The " LOOM__CHAT_SERVER_CALLS_HEADER
                               " header must be 'separate' or 'inline'.");
    req->server_calls_inline = mode;
    return 1;
}

/*
 * The X-Loom-Continue header ("on" or "off"): whether a request without a
 * conversation id may continue the stored conversation its messages
 * extend; it wins over the request field. 1 when fine, else the 400 has
 * been sent.
 */
static int continue_header(srv_request *r, loom__chat_request *req)
{
    const char *h = srv_header(r, LOOM__CHAT_CONTINUE_HEADER);

    if (!h || !*h)
        return 1;
    if (strcmp(h, "on") == 0 || strcmp(h, "off") == 0) {
        req->no_continue = strcmp(h, "off") == 0;
        return 1;
    }
    return srv_reply_error(r, 400, "invalid_request_error",
                           LOOM__CHAT_CONTINUE_FIELD, "invalid_value",
                           "The " LOOM__CHAT_CONTINUE_HEADER
                           " header must be 'on' or 'off'.");
}

/*
 * A client that resends its whole history without a conversation id
 * (docs/openai-compat.md#stateless-clients): when the messages up to its
 * last assistant message are exactly, in the client's form, a stored
 * conversation of the same owner (srv_request_owner), that conversation
 * goes on. *found
 * (caller frees) is its id and *skip how many of the messages it holds;
 * both are left alone when none matches. A store read, which in WAL mode
 * never waits for writers. 0, or the store's error.
 */
static int find_continued(srv_request *r, const loom__chat_request *req,
                          const char *owner, char **found, size_t *skip)
{
    loom_store *st = srv_store(r->srv);
    size_t at = after_last_assistant(&req->messages);
    loom_messages prefix;
    int rc;

    if (!st || req->no_continue || at == 0 || at == req->messages.len)
        return 0;
    prefix.items = req->messages.items;
    prefix.len = prefix.cap = at;
    rc = loom_store_conversation_match(st, owner, &prefix, found);
    if (rc == 0)
        *skip = at;
    return rc == LOOM_ENOTFOUND ? 0 : rc;
}

/*
 * A stream's status is held back until the run has output: a run that
 * fails first (an upstream 429, say) then gets a plain error reply with
 * the matching status, as OpenAI itself answers, so SDKs raise their
 * typed errors (RateLimitError) for streams too.
 */
typedef struct {
    loom__chat_fmt *f;
} held_stream;

static void held_free(void *payload)
{
    held_stream *h = payload;

    if (h) {
        loom__chat_fmt_free(h->f);
        free(h);
    }
}

/* Whether the log holds anything beyond the run's start and usage. */
static int output_seen(srv_run *run)
{
    const srv_event *ev;
    uint64_t seq = 0;

    while ((ev = srv_run_next_event(run, seq)) != NULL) {
        switch (ev->type) {
        case LOOM_EV_RUN_STARTED:
        case LOOM_EV_USAGE:
        case LOOM_EV_RUN_FAILED:
        case LOOM_EV_RUN_COMPLETED:
            break;
        default:
            return 1;
        }
        seq = ev->seq;
    }
    return 0;
}

static int held_ready(srv_run *run, void *payload)
{
    (void)payload;
    return output_seen(run);
}

static int held_done(srv_request *r, srv_run *run, void *payload)
{
    held_stream *h = payload;
    srv_sse_options o = SRV_SSE_OPTIONS_INIT;

    /* A cancelled run ends as a normal stream, output or not; one whose
     * first model call a budget refused is a 429 (deferred_done). */
    if (srv_run_ended(run) && !output_seen(run) &&
        (srv_run_quota_refused(run) ||
         (srv_run_status(run) != LOOM_RUN_COMPLETED &&
          srv_run_status(run) != LOOM_RUN_CANCELLED)))
        return deferred_done(r, run, h->f);
    o.format = sse_format;
    o.begin = sse_begin;
    o.end = sse_end;
    o.payload = h->f;
    o.free_payload = fmt_free;
    h->f = NULL; /* the stream's now, also on failure */
    return srv_reply_sse(r, run, &o);
}

static int handle(srv_request *r, loom__chat_request *req)
{
    static const char *const no_tools[1] = {NULL};
    srv_run_spec spec = SRV_RUN_SPEC_INIT;
    loom__chat_fmt_opts fo;
    loom__chat_fmt *f = NULL;
    loom__chat_error err;
    chat_target t;
    const char **names = NULL;
    const char *conv = NULL;
    char *found = NULL;
    loom_messages history = {0}, input;
    size_t nnames = 0, skip = 0;
    srv_run *run = NULL;
    char id[64], owner[SRV_OWNER_SIZE];
    int all = 0, rc;

    memset(&err, 0, sizeof(err));
    if ((rc = conversation_id(r, req, &conv)) != 1 ||
        (rc = server_calls_header(r, req)) != 1 ||
        (rc = continue_header(r, req)) != 1)
        return rc;
    if ((rc = resolve_target(r, req->model, &t)) != 1)
        return rc;
    if ((rc = check_vision(r, req, &t)) != 1)
        goto cleanup;
    rc = loom__chat_server_tools(
        &names, &nnames, &all, req, srv_tools(r->srv),
        t.agent ? (const char *const *)t.agent->tools : NULL,
        t.agent ? t.agent->tools_len : 0, t.agent ? t.agent->tools_all : 0,
        &err);
    if (rc == LOOM_EINVALID) {
        rc = reply_chat_error(r, &err);
        goto cleanup;
    }
    if (rc)
        goto cleanup;

    if (t.agent) {
        spec.agent = t.agent->name;
    } else {
        /* A plain model is just the model: no agent's prompt, limits or
         * settings, and none is stored as having run. */
        spec.model = t.model;
        spec.no_agent = 1;
        spec.system_prompt = "";
    }
    if (!all) {
        spec.tool_names = nnames ? names : no_tools;
        spec.tool_names_len = nnames;
        spec.tool_names_set = 1;
    }
    spec.client_tools = req->client_tools;
    spec.client_tools_len = req->client_tools_len;
    spec.client_tools_json = req->tools_json;
    if (req->has_tool_choice) {
        spec.tool_choice = req->tool_choice;
        spec.tool_choice_set = 1;
    } else if (!t.agent) {
        /* Not the default agent's choice: it may name a tool not offered. */
        spec.tool_choice.kind = LOOM_TOOL_CHOICE_AUTO;
        spec.tool_choice_set = 1;
    }
    spec.parallel_tool_calls = req->parallel_tool_calls;
    spec.max_tokens = req->max_tokens;
    spec.budget = req->budget;
    spec.temperature = req->temperature;
    if ((rc = srv_request_owner(r, req->user, owner, &spec.user_id)) != 1)
        goto cleanup;
    srv_request_account(r, req->user, &spec.account);
    spec.who = r->who;
    spec.params = &req->params;
    if ((rc = srv_run_check_params(r, &spec)) != 1)
        goto cleanup;
    /*
     * With a conversation, the stored history comes first and only the
     * messages after the request's last assistant message are new: a
     * client may send just the new message or its whole history.
     * Without one, a stateless client's request that continues a
     * stored conversation goes on there (find_continued); any other is
     * the whole conversation and all of it is stored in a new one.
     */
    if (conv) {
        skip = after_last_assistant(&req->messages);
        if (skip == req->messages.len) {
            rc = srv_reply_error(
                r, 400, "invalid_request_error", "messages",
                "invalid_value",
                "With a conversation_id, messages must end with a new "
                "user or tool message after the last assistant message.");
            goto cleanup;
        }
        spec.conversation_id = conv;
    } else if ((rc = find_continued(r, req, spec.user_id, &found, &skip)) !=
               0) {
        rc = srv_reply_loom_error(r, rc, NULL);
        goto cleanup;
    } else if (found) {
        spec.conversation_id = found;
    } else {
        spec.history = &history;
        /* The new conversation is created with the turn's save, one
         * commit a request fewer, streamed or not: a stream names it on
         * its first chunk, and it is in the store once the turn is, as a
         * stored chat completion is (docs/server.md). */
        spec.create_with_save = 1;
    }
    input.items = req->messages.items + skip;
    input.len = input.cap = req->messages.len - skip;
    spec.input = &input;

    /* A client that does not stream reads the finished answer only: the
     * model is asked for it whole, as the client asked loom (fewer bytes
     * to parse, one event instead of one per token). */
    spec.whole_answers = !req->stream;
    spec.request = r;
    rc = srv_run_start(&run, r->srv, &spec);
    if (rc == LOOM_ENOTFOUND && spec.conversation_id) {
        rc = srv_reply_error(r, 404, "invalid_request_error",
                             "conversation_id", "conversation_not_found",
                             "%s", loom_error_last());
        goto cleanup;
    }
    if (rc) {
        rc = srv_reply_loom_error(r, rc, NULL);
        goto cleanup;
    }
    srv_request_set_run(r, srv_run_id(run));
    if ((rc = srv__fault("chat.started")) != 0 ||
        (rc = srv_set_header(r, CONV_HEADER,
                             srv_run_conversation_id(run))) != 0)
        goto cleanup;
    loom__chat_completion_id(id, sizeof(id), srv_run_id(run));
    memset(&fo, 0, sizeof(fo));
    fo.id = id;
    fo.model = req->model;
    fo.created = (long long)(srv_run_created_ms(run) / 1000);
    fo.include_usage = req->stream && req->include_usage;
    fo.conversation_id = srv_run_conversation_id(run);
    fo.client_tools = req->client_tools;
    fo.client_tools_len = req->client_tools_len;
    fo.server_calls_inline = req->server_calls_inline;
    if ((rc = loom__chat_fmt_new(&f, &fo)) != 0)
        goto cleanup;
    if (req->stream) {
        held_stream *h = calloc(1, sizeof(*h));
        if (!h) {
            rc = loom__error_oom();
            goto cleanup;
        }
        h->f = f;
        rc = srv_defer_until(r, run, held_ready, held_done, h, held_free);
        if (rc == 0)
            f = NULL;
        else
            free(h);
    } else {
        rc = srv_defer(r, run, deferred_done, f, fmt_free);
        if (rc == 0)
            f = NULL;
    }
cleanup:
    /* A run this request started and cannot answer for must not go on
     * without a client (chat runs are never background runs). */
    if (rc != 0 && run && !srv_run_background(run))
        srv_run_cancel(run);
    loom__chat_fmt_free(f);
    srv_run_unref(run);
    loom__chat_error_clear(&err);
    free(names);
    free(found);
    free(t.model);
    return rc;
}

static int chat_completions(srv_request *r)
{
    loom__chat_request req;
    loom__chat_error err;
    int rc;

    if (!r->json && r->json_error)
        return srv_reply_error(r, 400, "invalid_request_error", NULL,
                               "invalid_json",
                               "We could not parse the JSON body of your "
                               "request: %s.", r->json_error);
    if (r->json)
        rc = loom__chat_request_parse(&req, r->json, &err);
    else
        rc = loom__chat_request_parse_text(&req, r->body, r->body_len, &err);
    if (rc == LOOM_EINVALID) {
        rc = reply_chat_error(r, &err);
        loom__chat_error_clear(&err);
        return rc;
    }
    loom__chat_error_clear(&err);
    if (rc)
        return rc;
    rc = handle(r, &req);
    loom__chat_request_clear(&req);
    return rc;
}

void srv_chat_routes(srv_router *rt)
{
    (void)srv_route(rt, "POST", "/v1/chat/completions", chat_completions);
}
