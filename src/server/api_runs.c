/*
 * loom's native run API:
 *
 *   POST /v1/runs               start a run; with "stream": true the
 *                               answer is the run's event stream (SSE,
 *                               id: = seq), else the final run with all
 *                               its events ("background": true answers
 *                               202 at once)
 *   GET  /v1/runs/{id}          status and result, with the sub-agent
 *                               runs under it; a sub-agent's run from
 *                               the store, scoped to ?user=
 *   GET  /v1/runs/{id}/events   replay, then follow (Last-Event-ID)
 *   GET  /v1/runs/{id}/report   a research run's report, as markdown
 *   POST /v1/runs/{id}/cancel   cancel; answers the run once it ended
 *                               cancelled, 409 when it ended otherwise
 *   POST /v1/runs/{id}/input    approve or deny a call waiting for
 *                               approval (409 when it does not wait)
 *
 * Every answer about a run carries X-Loom-Run-Id and
 * X-Loom-Conversation-Id. A blocking request whose run's turn could not
 * be stored answers 500 "store_failed". See docs/server.md.
 */
#include "core/error.h"
#include "core/utf8.h"
#include "loom/log.h"
#include "loom/store.h"
#include "server/chat_format.h"
#include "server/chat_parts.h"
#include "server/runs_request.h"
#include "server/srvpriv.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MAX_INPUT_MESSAGES 1000

/* ---- request parsing ----------------------------------------------------- */

/* A 400 for param in *err; returns LOOM_EINVALID (or LOOM_ENOMEM). */
static int bad(loom__chat_error *err, const char *param, const char *msg)
{
    return loom__chat_error_set(err, 400, "invalid_request_error",
                                "invalid_value", param, "%s", msg);
}

static int parse_role(const char *s, loom_role *out)
{
    if (!s)
        return -1;
    if (!strcmp(s, "user"))
        *out = LOOM_ROLE_USER;
    else if (!strcmp(s, "system") || !strcmp(s, "developer"))
        *out = LOOM_ROLE_SYSTEM;
    else if (!strcmp(s, "assistant"))
        *out = LOOM_ROLE_ASSISTANT;
    else
        return -1;
    return 0;
}

/* A message of `input` whose content is an array of content parts, as
 * in chat (chat_parts.h); a bad part or a crossed limit fills *err. */
static int add_parts(loom_messages *out, const json_t *content, size_t i,
                     loom_role role, loom__chat_media *totals,
                     loom__chat_error *err, const char **msg)
{
    loom_part *parts = NULL;
    size_t n = 0;
    int rc;

    if (!json_array_size(content)) {
        *msg = "each `input` message needs a non-empty `content`";
        return LOOM_EINVALID;
    }
    if ((rc = loom__chat_parts_parse_in(&parts, &n, content, "input", i, role,
                                        totals, err)) == 0)
        rc = loom_messages_add_parts(out, role, parts, n);
    loom__chat_parts_free(parts, n);
    return rc;
}

/*
 * `input`: a string (one user message) or an array of {role, content}
 * with role user, system (or developer) or assistant and a content that
 * is a string or an array of content parts (text, and in user messages
 * images and files, with the chat API's limits). Fills *msg on a bad
 * value (static text), or *err for a bad part (its param names it).
 */
static int parse_input(const json_t *in, loom_messages *out, const char **msg,
                       loom__chat_error *err)
{
    loom__chat_media totals = {0};
    size_t i;
    json_t *m;

    if (json_is_string(in)) {
        if (!json_string_length(in)) {
            *msg = "`input` must not be empty";
            return LOOM_EINVALID;
        }
        return loom_messages_add(out, LOOM_ROLE_USER, json_string_value(in));
    }
    if (!json_is_array(in) || json_array_size(in) == 0) {
        *msg = "`input` must be a string or a non-empty array of "
               "{role, content} messages";
        return LOOM_EINVALID;
    }
    if (json_array_size(in) > MAX_INPUT_MESSAGES) {
        *msg = "`input` has more than 1000 messages";
        return LOOM_EINVALID;
    }
    json_array_foreach(in, i, m)
    {
        loom_role role;
        const json_t *c = json_object_get(m, "content");
        int rc;
        if (!json_is_object(m) ||
            parse_role(json_string_value(json_object_get(m, "role")),
                       &role) != 0) {
            *msg = "each `input` message needs a role: user, system or "
                   "assistant";
            return LOOM_EINVALID;
        }
        if (json_is_array(c))
            rc = add_parts(out, c, i, role, &totals, err, msg);
        else if (!json_is_string(c)) {
            *msg = "each `input` message needs a `content`: a string or an "
                   "array of content parts";
            return LOOM_EINVALID;
        } else
            rc = loom_messages_add(out, role, json_string_value(c));
        if (rc)
            return rc;
    }
    return 0;
}

int srv_runs_request_parse(srv_runs_request *q, const json_t *b,
                           const char *json_error, loom__chat_error *err)
{
    static const char *const known[] = {
        "agent", "model", "input", "conversation_id", "stream", "background",
        "system", "max_iterations", "max_tokens", "temperature", "tools",
        "user",
        /* sampling and output, as the chat API takes them */
        "top_p", "seed", "presence_penalty", "frequency_penalty", "stop",
        "response_format", "reasoning_effort", "verbosity", "logit_bias",
        "metadata", "service_tier",
        /* a research agent's settings (docs/research.md) */
        "research",
        /* title a new conversation (docs/server.md) */
        "title",
        /* the run's own budget (docs/accounts.md) */
        "budget", NULL};
    const srv_run_spec init = SRV_RUN_SPEC_INIT;
    const json_t *v;
    const char *key, *msg = NULL;
    json_t *val;
    int rc;

    memset(q, 0, sizeof(*q));
    memset(err, 0, sizeof(*err));
    q->spec = init;
    /* The same code as the chat API's for a body that is not an object. */
    if (json_error)
        return loom__chat_error_set(
            err, 400, "invalid_request_error", "invalid_json", NULL,
            "We could not parse the JSON body of your request: %s.",
            json_error);
    if (!json_is_object(b))
        return loom__chat_error_set(err, 400, "invalid_request_error",
                                    "invalid_json", NULL,
                                    "The request body must be a JSON object.");
    json_object_foreach((json_t *)b, key, val)
    {
        size_t i;
        for (i = 0; known[i] && strcmp(known[i], key); i++)
            ;
        if (!known[i])
            return loom__chat_error_set(err, 400, "invalid_request_error",
                                        "unknown_parameter", key,
                                        "unknown parameter '%s'", key);
    }
#define STR_FIELD(name, dst)                                                   \
    if ((v = json_object_get(b, name)) && !json_is_null(v)) {                  \
        if (!json_is_string(v) || !json_string_length(v))                      \
            return bad(err, name, "`" name "` must be a non-empty string");    \
        (dst) = json_string_value(v);                                          \
    }
    STR_FIELD("agent", q->spec.agent);
    STR_FIELD("model", q->spec.model);
    STR_FIELD("conversation_id", q->spec.conversation_id);
    STR_FIELD("system", q->spec.system_prompt);
    STR_FIELD("user", q->spec.user_id);
#undef STR_FIELD
    if (q->spec.user_id && !loom__chat_user_valid(q->spec.user_id))
        return bad(err, "user",
                   "`user` must be 1 to 128 characters of A-Z, a-z, 0-9 "
                   "and " LOOM__CHAT_USER_PUNCT);
    _Static_assert(LOOM__CHAT_USER_MAX == 128, "the message above");
    if ((v = json_object_get(b, "stream")) && !json_is_null(v)) {
        if (!json_is_boolean(v))
            return bad(err, "stream", "`stream` must be true or false");
        q->stream = json_is_true(v);
    }
    if ((v = json_object_get(b, "background")) && !json_is_null(v)) {
        if (!json_is_boolean(v))
            return bad(err, "background", "`background` must be true or false");
        q->spec.background = json_is_true(v);
        q->background_set = 1;
    }
    if ((v = json_object_get(b, "title")) && !json_is_null(v)) {
        if (!json_is_boolean(v))
            return bad(err, "title", "`title` must be true or false");
        q->spec.title = json_is_true(v);
    }
    if ((v = json_object_get(b, "max_iterations")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1 ||
            json_integer_value(v) > 1000)
            return bad(err, "max_iterations",
                       "`max_iterations` must be an integer from 1 to 1000");
        q->spec.max_iterations = (int)json_integer_value(v);
    }
    if ((v = json_object_get(b, "max_tokens")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1)
            return bad(err, "max_tokens",
                       "`max_tokens` must be a positive integer");
        q->spec.max_tokens = (long)json_integer_value(v);
    }
    if ((v = json_object_get(b, "temperature")) && !json_is_null(v)) {
        if (!json_is_number(v) || json_number_value(v) < 0 ||
            json_number_value(v) > 2)
            return bad(err, "temperature",
                       "`temperature` must be a number from 0 to 2");
        q->spec.temperature = json_number_value(v);
    }
    if ((v = json_object_get(b, "tools")) && !json_is_null(v)) {
        size_t i;
        json_t *t;
        if (!json_is_array(v) || json_array_size(v) > SRV_RUNS_MAX_TOOLS)
            return bad(err, "tools", "`tools` must be an array of tool names");
        json_array_foreach(v, i, t)
        {
            if (!json_is_string(t))
                return bad(err, "tools",
                           "`tools` must be an array of tool names");
            q->tool_names[i] = json_string_value(t);
        }
        q->spec.tool_names = q->tool_names;
        q->spec.tool_names_len = json_array_size(v);
        q->spec.tool_names_set = 1;
    }
    /* Its keys are checked when the run starts (loom_turn_new). */
    if ((v = json_object_get(b, "research")) && !json_is_null(v)) {
        if (!json_is_object(v))
            return bad(err, "research",
                       "`research` must be an object of research settings");
        q->spec.research = v;
    }
    if ((rc = loom__chat_budget_parse(&q->spec.budget,
                                      json_object_get(b, "budget"), "budget",
                                      err)) != 0)
        return rc;
    if (!(v = json_object_get(b, "input")))
        return bad(err, "input", "`input` is required");
    if ((rc = parse_input(v, &q->input, &msg, err)) != 0 ||
        /* the sampling and output parameters (chat_params.c) */
        (rc = loom__chat_params_parse(&q->params, b, err)) != 0) {
        srv_runs_request_clear(q);
        /* A bad part has filled *err already (its param names it). */
        return msg ? bad(err, "input", msg) : rc;
    }
    q->spec.input = &q->input;
    q->spec.params = &q->params;
    return 0;
}

void srv_runs_request_clear(srv_runs_request *q)
{
    loom_messages_free(&q->input);
    loom_llm_params_clear(&q->params);
    q->spec.input = NULL;
    q->spec.params = NULL;
}

/* ---- answers ------------------------------------------------------------- */

static void set_run_headers(srv_request *r, srv_run *run)
{
    srv_request_set_run(r, srv_run_id(run));
    srv_set_header(r, "X-Loom-Run-Id", srv_run_id(run));
    srv_set_header(r, "X-Loom-Conversation-Id", srv_run_conversation_id(run));
}

static int reply_run(srv_request *r, srv_run *run)
{
    json_t *o = srv_run_to_json(run, 0);

    if (!o)
        return loom__error_oom();
    return srv_reply_json(r, 200, o);
}

/*
 * reply_run with the events of an ended run, as srv_reply_json writes
 * srv_run_to_json(run, 1) byte for byte: its events
 * are the object's last member, and a logged event's text is what its
 * JSON dumps to (loom_turn_event_json), so the texts are spliced after
 * the rest of the object rather than parsed back and dumped again.
 */
static int reply_ended_run_with_events(srv_request *r, srv_run *run)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    json_t *o = srv_run_to_json(run, 0);
    const srv_event *e;
    uint64_t seq = 0;
    size_t len = 0;
    char *text = o ? loom__json_compact_dumps(o, 15, &len) : NULL;
    int rc;

    json_decref(o);
    if (!text)
        return loom__error_oom();
    /* Without its closing brace. */
    rc = loom_buf_put(&b, text, len - 1);
    free(text);
    if (!rc)
        rc = loom_buf_puts(&b, ",\"events\":[");
    while (!rc && (e = srv_run_next_event(run, seq)) != NULL) {
        if (seq && (rc = loom_buf_puts(&b, ",")) != 0)
            break;
        rc = loom_buf_put(&b, e->text, e->text_len);
        seq = e->seq;
    }
    if (!rc)
        rc = loom_buf_puts(&b, "]}");
    if (rc) {
        loom_buf_free(&b);
        return rc;
    }
    len = b.len;
    return srv_reply_json_text(r, 200, loom_buf_detach(&b), len);
}

/* 500 "store_failed" for a run whose turn is not in the store. */
static int reply_unstored(srv_request *r, srv_run *run)
{
    const char *err = srv_run_store_error(run);

    return srv_reply_error(r, 500, NULL, NULL, "store_failed",
                           "run %s ended (%s) but its turn could not be "
                           "stored: %s",
                           srv_run_id(run),
                           loom_run_status_name(srv_run_status(run)),
                           err ? err : "unknown error");
}

static int done_with_events(srv_request *r, srv_run *run, void *payload)
{
    (void)payload;
    if (srv_run_quota_refused(run))
        return srv_reply_quota(r, NULL);
    if (!srv_run_stored(run))
        return reply_unstored(r, run);
    return reply_ended_run_with_events(r, run);
}

static int reply_not_active(srv_request *r, srv_run *run)
{
    return srv_reply_error(r, 409, NULL, "id", "run_not_active",
                           "run %s has already %s (%s)", srv_run_id(run),
                           srv_run_ended(run) ? "ended" : "finished",
                           srv_run_ended(run)
                               ? loom_run_status_name(srv_run_status(run))
                               : "storing its turn");
}

/* The cancel took effect only if the run ended cancelled: a run that was
 * finishing its last step when the cancel came ends as it would have. */
static int done_cancel(srv_request *r, srv_run *run, void *payload)
{
    (void)payload;
    if (srv_run_status(run) != LOOM_RUN_CANCELLED)
        return reply_not_active(r, run);
    return reply_run(r, run);
}

/*
 * Whether the run's worker is past its store work (the conversation is
 * created or its history loaded): run.started is logged right after, or
 * a run.started and run.failed when that work failed.
 */
static int started(srv_run *run, void *payload)
{
    (void)payload;
    return srv_run_last_seq(run, NULL) > 0;
}

/* A stream, or a background run's 202, goes out once the conversation
 * whose id it names exists: a client may use that id at once. */
static int done_stream(srv_request *r, srv_run *run, void *payload)
{
    srv_sse_options so = SRV_SSE_OPTIONS_INIT;

    (void)payload;
    return srv_reply_sse(r, run, &so);
}

static int done_accepted(srv_request *r, srv_run *run, void *payload)
{
    (void)payload;
    return srv_reply_json(r, 202, srv_run_to_json(run, 0));
}

/*
 * Images and files go only to a model that takes them, as in chat: 1
 * when the input may go on, else the reply's result (a 400 naming the
 * part).
 */
static int check_media(srv_request *r, const srv_runs_request *q)
{
    const loom_agent_config *agent = srv_agent(r->srv, q->spec.agent);
    loom__chat_error err;
    int rc;

    memset(&err, 0, sizeof(err));
    rc = loom__chat_media_check(r->srv, &q->input, q->spec.model, agent,
                                q->spec.agent ? q->spec.agent : "(default)",
                                "input", &err);
    if (rc == 1)
        return 1;
    rc = rc == LOOM_EINVALID && err.code
             ? srv_reply_error(r, (unsigned)err.status, NULL, err.param,
                               err.code, "%s",
                               err.message ? err.message : "out of memory")
             : srv_reply_loom_error(r, rc, "input");
    loom__chat_error_clear(&err);
    return rc;
}

static int start_run(srv_request *r)
{
    char owner[SRV_OWNER_SIZE];
    json_t *settings;
    srv_runs_request q;
    loom__chat_error err;
    srv_run *run = NULL;
    int rc;

    if ((rc = srv_runs_request_parse(&q, r->json, r->json_error, &err))) {
        rc = rc == LOOM_EINVALID
                 ? srv_reply_error(r, (unsigned)err.status, err.type, err.param,
                                   err.code, "%s", err.message)
                 : srv_reply_loom_error(r, rc, NULL);
        loom__chat_error_clear(&err);
        return rc;
    }
    srv_request_account(r, q.spec.user_id, &q.spec.account);
    if ((rc = srv_request_owner(r, q.spec.user_id, owner, &q.spec.user_id)) !=
        1) {
        srv_runs_request_clear(&q);
        return rc;
    }
    /* The caller's default agent counts for the media check too. */
    settings = srv_user_settings(r->srv, q.spec.user_id);
    q.spec.user_settings = settings;
    q.spec.agent = srv_settings_agent(settings, &q.spec);
    if ((rc = srv_run_check_params(r, &q.spec)) != 1 ||
        (rc = check_media(r, &q)) != 1) {
        srv_runs_request_clear(&q);
        json_decref(settings);
        return rc;
    }
    q.spec.who = r->who;
    q.spec.request = r;
    /* Only a client that reads the events as they come sees a form to
     * fill in: other runs decline them at once (docs/mcp.md). A streamed
     * background run keeps its forms open after its client leaves: one
     * who follows it again (GET /v1/runs/{id}/events) may answer. */
    q.spec.elicitation = q.stream;
    rc = srv_run_start(&run, r->srv, &q.spec);
    srv_runs_request_clear(&q);
    json_decref(settings);
    /* A bad research setting's message names it: research.<key>. */
    if (rc == LOOM_EINVALID && q.spec.research &&
        !strncmp(loom_error_last(), "research", 8))
        return srv_reply_loom_error(r, rc, "research");
    if (rc != 0)
        return srv_reply_loom_error(r, rc, NULL);
    set_run_headers(r, run);
    /* A research run goes on in the background unless asked not to. */
    if (!q.stream && !q.background_set && srv_run_research(run)) {
        q.spec.background = 1;
        srv_run_set_background(run);
    }
    if (q.stream)
        rc = srv_defer_until(r, run, started, done_stream, NULL, NULL);
    else if (q.spec.background)
        rc = srv_defer_until(r, run, started, done_accepted, NULL, NULL);
    else
        rc = srv_defer(r, run, done_with_events, NULL, NULL);
    if (rc != 0)
        srv_run_cancel(run);
    srv_run_unref(run);
    return rc;
}

/* The run named by the path, or a 404 reply (NULL): also a run the
 * caller does not own (srv_owns, its end user named by request_user or
 * the X-Loom-User header). */
static srv_run *path_run(srv_request *r, const char *request_user)
{
    srv_run *run = srv_run_find(r->srv, r->params[0]);

    if (run && !srv_owns(r, srv_run_user(run), request_user)) {
        srv_run_unref(run);
        run = NULL;
    }
    if (!run) {
        srv_reply_error(r, 404, NULL, "id", "not_found",
                        "no run with id '%s' (runs are kept in memory for a "
                        "while after they end)",
                        r->params[0]);
        return NULL;
    }
    set_run_headers(r, run);
    return run;
}

static int reply_no_run(srv_request *r)
{
    return srv_reply_error(r, 404, NULL, "id", "not_found",
                           "no run with id '%s' (runs are kept in memory for "
                           "a while after they end)",
                           r->params[0]);
}

/*
 * A sub-agent's run, which only the store knows. Scoped to `user`:
 * another user's run is a 404, as an unknown one. A top-level run is
 * served from memory only, as ever: once forgotten it is a 404 (its
 * conversation stays).
 */
static int reply_stored_run(srv_request *r, const char *user)
{
    json_t *o = NULL;
    int rc;

    if (!r->srv->store)
        return reply_no_run(r);
    rc = loom_store_run_get(r->srv->store, r->params[0], user, &o);
    if (rc == LOOM_ENOTFOUND || rc == LOOM_EINVALID)
        return reply_no_run(r);
    if (rc != 0)
        return srv_reply_loom_error(r, rc, NULL);
    if (json_is_null(json_object_get(o, "parent_run_id"))) {
        json_decref(o);
        return reply_no_run(r);
    }
    srv_request_set_run(r, r->params[0]);
    srv_set_header(r, "X-Loom-Run-Id", r->params[0]);
    srv_set_header(r, "X-Loom-Conversation-Id",
                   json_string_value(json_object_get(o, "conversation_id")));
    return srv_reply_json(r, 200, o);
}

/*
 * GET /v1/runs/{id}[?events=true][&user=U]: a run in memory (with the
 * sub-agent runs stored under it as "children"), else from the store.
 * A `user` given must be the run's.
 */
static int get_run(srv_request *r)
{
    const char *ev = srv_query(r, "events");
    const char *qu = srv_query(r, "user"), *user = NULL;
    char buf[SRV_OWNER_SIZE];
    srv_run *run;
    json_t *o, *kids = NULL;

    /* The caller's owner id with a key; else the `user` asked for. */
    if (srv_request_owner(r, qu, buf, &user) != 1)
        return 0;
    if (!(run = srv_run_find(r->srv, r->params[0])))
        return reply_stored_run(r, user);
    if (!srv_owns(r, srv_run_user(run), qu)) {
        srv_run_unref(run);
        return reply_no_run(r);
    }
    set_run_headers(r, run);
    o = srv_run_to_json(run, ev && !strcmp(ev, "true"));
    srv_run_unref(run);
    if (!o)
        return loom__error_oom();
    /* Children are stored as they end; none when the store cannot say. */
    if (r->srv->store &&
        loom_store_run_children(r->srv->store, r->params[0], &kids) != 0)
        loom_warn("run %s: cannot read its sub-agent runs: %s", r->params[0],
                  loom_error_last());
    json_object_set_new(o, "children", kids ? kids : json_array());
    return srv_reply_json(r, 200, o);
}

/* Whether a logged event's JSON has key (0 also when out of memory). */
static int logged_field(const srv_event *ev, const char *key)
{
    json_t *j = loom_turn_event_json(ev);
    int has = json_object_get(j, key) != NULL;

    json_decref(j);
    return has;
}

/*
 * GET /v1/runs/{id}/report[?user=U]: the report of a research run, as
 * text/markdown with its notes and Sources list. 404 for an unknown run,
 * one the caller may not see (srv_owns), or one that ended without a
 * report (not a research
 * run, failed, cancelled, or ended on a clarifying question); 409
 * report_not_ready while it runs.
 */
static int get_report(srv_request *r)
{
    srv_run *run = path_run(r, srv_query(r, "user"));
    const srv_event *last;
    const char *text;
    int rc;

    if (!run)
        return 0;
    last = srv_run_event(run, srv_run_last_seq(run, NULL));
    if (!srv_run_ended(run))
        rc = srv_reply_error(r, 409, NULL, "id", "report_not_ready",
                             "run %s is still running: its report comes "
                             "when it completes",
                             srv_run_id(run));
    /* The run's last event is its own end; a report was written when it
     * says why. */
    else if (!last || last->type != LOOM_EV_RUN_COMPLETED ||
             !logged_field(last, "report_reason") ||
             !(text = loom_run_text(srv_run_result(run))))
        rc = srv_reply_error(r, 404, NULL, "id", "no_report",
                             "run %s has no report (it is not a research "
                             "run, or it ended %s without one)",
                             srv_run_id(run),
                             loom_run_status_name(srv_run_status(run)));
    else
        rc = srv_reply_text(r, 200, "text/markdown; charset=utf-8", text,
                            strlen(text));
    srv_run_unref(run);
    return rc;
}

/* Last-Event-ID (or ?after=): a seq, 0 when absent; -1 when invalid. */
static long long resume_point(srv_request *r)
{
    const char *s = srv_header(r, "Last-Event-ID");
    unsigned long long v;
    char *end;

    if (!s || !*s)
        s = srv_query(r, "after");
    if (!s || !*s)
        return 0;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (errno || *end || *s < '0' || *s > '9' || v > (1ULL << 62))
        return -1;
    return (long long)v;
}

static int run_events(srv_request *r)
{
    srv_sse_options so = SRV_SSE_OPTIONS_INIT;
    long long after = resume_point(r);
    srv_run *run;
    int rc;

    if (after < 0)
        return srv_reply_error(r, 400, NULL, "Last-Event-ID", "invalid_value",
                               "Last-Event-ID must be an event seq (a "
                               "non-negative integer)");
    if (!(run = path_run(r, NULL)))
        return 0;
    so.after_seq = (uint64_t)after;
    /* Following a run does not own it: leaving does not cancel it. */
    so.observer = 1;
    rc = srv_reply_sse(r, run, &so);
    srv_run_unref(run);
    return rc;
}

static int cancel_run(srv_request *r)
{
    srv_run *run = path_run(r, NULL);
    int rc;

    if (!run)
        return 0;
    /* Too late once the run's loop is over: it is storing its turn with
     * the status it ended with, or has ended. */
    if (srv_run_ended(run) || !srv_run_cancel(run))
        rc = reply_not_active(r, run);
    else
        rc = srv_defer(r, run, done_cancel, NULL, NULL);
    srv_run_unref(run);
    return rc;
}

/*
 * The answer to a form of an mcp.elicitation event of run (body b:
 * {"elicitation_id", "action", "content"}): 200, 400 for a bad action or
 * content that does not fit the requested schema, 409 when the form does
 * not wait.
 */
static int answer_form(srv_request *r, srv_run *run, const json_t *b)
{
    const json_t *id = json_object_get(b, "elicitation_id");
    const json_t *action = json_object_get(b, "action");
    const json_t *content = json_object_get(b, "content");
    int rc;

    if (json_object_get(b, "call_id") || json_object_get(b, "approve") ||
        json_object_get(b, "reason"))
        return srv_reply_error(r, 400, NULL, "elicitation_id", "invalid_value",
                               "answer either a call (`call_id`, "
                               "`approve`) or a form (`elicitation_id`, "
                               "`action`, `content`)");
    if (!json_string_length(id))
        return srv_reply_error(r, 400, NULL, "elicitation_id", "invalid_value",
                               "`elicitation_id` must be a non-empty string");
    if (!json_is_string(action))
        return srv_reply_error(r, 400, NULL, "action", "invalid_value",
                               "`action` must be accept, decline or cancel");
    rc = srv_run_answer_elicitation(run, json_string_value(id),
                                    json_string_value(action), content);
    if (rc == LOOM_ENOTFOUND)
        return srv_reply_error(r, 409, NULL, "elicitation_id", "not_waiting",
                               "elicitation '%s' of run %s does not wait for "
                               "an answer",
                               json_string_value(id), srv_run_id(run));
    if (rc == LOOM_EINVALID)
        return srv_reply_error(r, 400, NULL,
                               strncmp(loom_error_last(), "`action`", 8) == 0
                                   ? "action"
                                   : "content",
                               "invalid_value", "%s", loom_error_last());
    if (rc != 0)
        return srv_reply_loom_error(r, rc, NULL);
    return srv_reply_json(r, 200,
                          json_pack("{s:s,s:s,s:O,s:O}", "id", srv_run_id(run),
                                    "object", "run.input", "elicitation_id", id,
                                    "action", action));
}

/*
 * The answer to a call waiting for approval: {"call_id", "approve",
 * "reason", "user", "run_id"}, or to a form (answer_form). The path names the
 * run or one of its sub-agent runs going on; the call is looked for in the run
 * named
 * (`run_id`, else a sub-agent run the path names), else in the run and
 * then its sub-agent runs. 400 for a malformed body, 404 for an unknown
 * run or one of another user (the body's `user` must be the run's), 409
 * when that call does not wait (never asked, answered, timed out, run
 * over) or waits in several sub-agent runs and no run is named.
 */
static int input_run(srv_request *r)
{
    static const char *const known[] = {"call_id", "approve", "reason",
                                        "user",    "run_id",  "elicitation_id",
                                        "action",  "content", NULL};
    const json_t *b = r->json, *id, *ok, *why, *who, *in;
    const char *key, *user, *scope;
    json_t *val;
    srv_run *run;
    int rc;

    if (r->json_error || !json_is_object(b))
        return srv_reply_error(r, 400, NULL, NULL, "invalid_json",
                               "the body must be a JSON object: {\"call_id\","
                               " \"approve\": true|false, \"reason\"}");
    json_object_foreach((json_t *)b, key, val)
    {
        size_t i;
        for (i = 0; known[i] && strcmp(known[i], key); i++)
            ;
        if (!known[i])
            return srv_reply_error(r, 400, NULL, key, "unknown_parameter",
                                   "unknown parameter '%s'", key);
    }
    id = json_object_get(b, "call_id");
    ok = json_object_get(b, "approve");
    why = json_object_get(b, "reason");
    who = json_object_get(b, "user");
    in = json_object_get(b, "run_id");
    if (json_object_get(b, "elicitation_id") || json_object_get(b, "action") ||
        json_object_get(b, "content"))
        id = ok = NULL; /* a form's answer: checked by answer_form */
    else if (!json_is_string(id) || !json_string_length(id))
        return srv_reply_error(r, 400, NULL, "call_id", "invalid_value",
                               "`call_id` must be a non-empty string");
    else if (!json_is_boolean(ok))
        return srv_reply_error(r, 400, NULL, "approve", "invalid_value",
                               "`approve` must be true or false");
    if (why && !json_is_null(why) && !json_is_string(why))
        return srv_reply_error(r, 400, NULL, "reason", "invalid_value",
                               "`reason` must be a string");
    if (who && !json_is_null(who) && !json_is_string(who))
        return srv_reply_error(r, 400, NULL, "user", "invalid_value",
                               "`user` must be a string");
    if (in && !json_is_null(in) && !json_string_length(in))
        return srv_reply_error(r, 400, NULL, "run_id", "invalid_value",
                               "`run_id` must be a non-empty string");
    /* A sub-agent's run is found through the run whose tree holds it,
     * under the same owner check as any run. */
    run = srv_run_find_tree(r->srv, r->params[0]);
    if (run && !srv_owns(r, srv_run_user(run), json_string_value(who))) {
        srv_run_unref(run);
        run = NULL;
    }
    if (run)
        set_run_headers(r, run);
    else if (!(run = path_run(r, json_string_value(who))))
        return 0;
    scope = json_string_value(in);
    if (!scope && strcmp(srv_run_id(run), r->params[0]) != 0)
        scope = r->params[0];
    user = srv_run_user(run);
    /* Without accounts, the body's `user` must be the run's. */
    if (!srv_isolated(r) &&
        ((user != NULL) != json_is_string(who) ||
         (user && strcmp(user, json_string_value(who)) != 0))) {
        srv_run_unref(run);
        return srv_reply_error(r, 404, NULL, "id", "not_found",
                               "no run with id '%s' (runs are kept in "
                               "memory for a while after they end)",
                               r->params[0]);
    }
    if (!id) {
        rc = answer_form(r, run, b);
        srv_run_unref(run);
        return rc;
    }
    rc = srv_run_approve(run, scope, json_string_value(id), json_is_true(ok),
                         json_string_value(why));
    if (rc == LOOM_ENOTFOUND)
        rc = srv_reply_error(r, 409, NULL, "call_id", "not_waiting",
                             "call '%s' of run %s does not wait for "
                             "approval",
                             json_string_value(id),
                             scope ? scope : srv_run_id(run));
    else if (rc == LOOM_EEXISTS)
        rc = srv_reply_error(r, 409, NULL, "run_id", "ambiguous_call",
                             "call '%s' waits for approval in several "
                             "sub-agent runs of run %s: name one with "
                             "`run_id`",
                             json_string_value(id), srv_run_id(run));
    else if (rc != 0)
        rc = srv_reply_loom_error(r, rc, NULL);
    else
        rc = srv_reply_json(
            r, 200,
            json_pack("{s:s,s:s,s:s,s:b,s:s*}", "id", srv_run_id(run), "object",
                      "run.input", "call_id", json_string_value(id), "approved",
                      json_is_true(ok), "run_id", scope));
    srv_run_unref(run);
    return rc;
}

int srv__api_runs_routes(srv_router *rt)
{
    int rc;

    if ((rc = srv_route(rt, "POST", "/v1/runs", start_run)) ||
        (rc = srv_route(rt, "GET", "/v1/runs/{id}", get_run)) ||
        (rc = srv_route(rt, "GET", "/v1/runs/{id}/events", run_events)) ||
        (rc = srv_route(rt, "GET", "/v1/runs/{id}/report", get_report)) ||
        (rc = srv_route(rt, "POST", "/v1/runs/{id}/cancel", cancel_run)) ||
        (rc = srv_route(rt, "POST", "/v1/runs/{id}/input", input_run)))
        return rc;
    return 0;
}
