/*
 * Internal API of loom's HTTP server, shared by the endpoint files
 * (api_runs.c, api_misc.c, chat.c, ...) and the machinery under them
 * (server.c: the daemon and the dispatcher; runs.c: the run manager and
 * the event logs; sse.c: streamed responses; metrics.c).
 *
 * Threads. libmicrohttpd runs every connection on one internal polling
 * thread (epoll): handlers, reply helpers and SSE formatters all run
 * there and must never block for long (a store read is fine: in WAL mode
 * it never waits for a writer; a store write may queue behind others and
 * SQLite's busy timeout, so runs write on their worker threads; waiting
 * for a run is not fine: use srv_defer() or srv_reply_sse(), which
 * suspend the connection and resume it when the run has something to
 * say). Runs
 * execute on worker threads of their own. Everything in srv_server is
 * immutable after start except what its own locks guard, so handlers may
 * read the config, the registry and the providers freely.
 *
 * Errors follow loom's rules: 0 or a negative LOOM_E* code with the
 * message in loom_error_last(). Replies are always OpenAI-shaped errors
 * ({"error": {"message", "type", "param", "code"}}) whatever the route.
 */
#ifndef LOOM_SERVER_INTERNAL_H
#define LOOM_SERVER_INTERNAL_H

#include "loom/accounts.h"
#include "loom/buf.h"
#include "loom/config.h"
#include "loom/llm.h"
#include "loom/run.h"
#include "loom/server.h"
#include "loom/session.h"
#include "loom/store.h"
#include "loom/tools.h"

#include <jansson.h>
#include <stdint.h>

/* ---- the server ---------------------------------------------------------- */

typedef struct loom_server srv_server;

/* Borrowed from the server; valid for its whole life. */
const loom_config *srv_config(const srv_server *s);
loom_store *srv_store(const srv_server *s);
const loom_tool_registry *srv_tools(const srv_server *s);

/*
 * The provider named name (the part before '/' of a model name), built
 * once at start and shared by every run: providers are safe to call from
 * several threads at once (llm/openai.c takes one pooled curl handle per
 * call). NULL when no such provider is configured.
 */
loom_provider *srv_provider(srv_server *s, const char *name);

/*
 * Resolves "provider/model" (see loom_config_model: *tmp is filled for a
 * model that is not listed; free it with loom_model_config_clear).
 * LOOM_ENOTFOUND with a message naming what is missing.
 */
int srv_model(srv_server *s, const char *name, const loom_model_config **out,
              loom_model_config *tmp);

/*
 * The agent called name, or with name NULL the config's default_agent
 * (NULL when there is none). NULL when absent.
 */
const loom_agent_config *srv_agent(const srv_server *s, const char *name);

/*
 * The model a run uses when the request names none: the agent's model,
 * else $LOOM_MODEL, else the model of the first configured provider's
 * first listed model, else "<first provider>/gpt-4o-mini". NULL when no
 * provider exists at all. Borrowed (from the config or the environment).
 */
const char *srv_default_model(srv_server *s, const loom_agent_config *agent);
/* The server's session (the turns' settings); borrowed. */
loom_session *srv_session(const srv_server *s);

/* ---- callers (auth.c) ---------------------------------------------------- */

typedef enum {
    SRV_CALLER_ANONYMOUS = 0, /* mode none: whoever the request says */
    SRV_CALLER_KEY,           /* an API key (key below) */
    SRV_CALLER_ADMIN,         /* the admin key (/v1/admin/... only) */
    SRV_CALLER_JWT            /* a token of the identity provider */
} srv_caller_kind;

/* Who made a request, as authenticated before its handler ran. */
typedef struct {
    srv_caller_kind kind;
    /* SRV_CALLER_KEY: the key. SRV_CALLER_JWT: user, workspace and
     * expires_at from the token (id empty, service 0, no models or
     * agents: a token limits neither). */
    loom_key_info key;
} srv_identity;

/* Bytes of an owner id and its NUL (loom_account_owner). */
#define SRV_OWNER_SIZE (LOOM_STORE_USER_ID_MAX + 1)

/* ---- requests and replies ------------------------------------------------ */

#define SRV_MAX_PARAMS 4

/*
 * One HTTP request, as a handler sees it. Fields above the line are for
 * handlers to read; everything is borrowed from the request and lives
 * until the reply has been sent (a deferred handler may keep using it).
 */
typedef struct srv_request {
    srv_server *srv;
    const char *method;  /* "GET", "POST", ... */
    const char *path;    /* decoded path, no query string */
    const char *route;   /* the matched template ("/v1/runs/{id}") */
    const char *params[SRV_MAX_PARAMS]; /* {…} segments, in order */
    size_t nparams;
    const char *body;    /* NUL-terminated; "" when there is none */
    size_t body_len;
    json_t *json;        /* the body parsed as JSON, or NULL (borrowed) */
    const char *json_error; /* why a non-empty body did not parse, or NULL */
    const srv_identity *who; /* the caller; never NULL in a handler */
    /* ---- private to server.c ---- */
    struct srv_conn *conn_;
} srv_request;

/* A query-string argument ("?limit=10"), decoded; NULL when absent. */
const char *srv_query(const srv_request *r, const char *key);

/*
 * The integer query argument key, lo to hi, into *out (left alone when
 * absent). 1: go on; 0: a 400 `invalid_value` naming key was answered.
 */
int srv_query_long(srv_request *r, const char *key, long lo, long hi,
                   long *out);

/*
 * Adds to the next reply the rate-limit headers (Retry-After,
 * retry-after-ms, x-ratelimit-*) of the upstream error that failed a
 * run: failure is a run.failed event's data, whose error.headers holds
 * them. Names and values are checked again (an embedder's provider may
 * have filled them); others are left out.
 */
void srv_pass_rate_headers(srv_request *r, const json_t *failure);

/* A request header (case-insensitive name); NULL when absent. */
const char *srv_header(const srv_request *r, const char *name);

/*
 * Adds a header to whatever reply this request sends next (JSON, error,
 * SSE or deferred). Name and value are copied; a value with a line
 * break is refused (LOOM_EINVALID).
 */
int srv_set_header(srv_request *r, const char *name, const char *value);

/* Names the run a request is about, for the request log line. */
void srv_request_set_run(srv_request *r, const char *run_id);

/*
 * Replies with status and body as compact JSON. Takes body (even on
 * failure). Returns 0 or LOOM_ENOMEM / LOOM_ERROR (the dispatcher then
 * closes the connection).
 */
int srv_reply_json(srv_request *r, unsigned status, json_t *body);

/*
 * Replies with status and text (len bytes of JSON, made with malloc) as
 * the body, sent as it is: takes text (even on failure). For an answer
 * written as text in the first place. Errors as srv_reply_json.
 */
int srv_reply_json_text(srv_request *r, unsigned status, char *text,
                        size_t len);

/* Replies with text bytes of content type ctype (copied). */
int srv_reply_text(srv_request *r, unsigned status, const char *ctype,
                   const char *text, size_t len);

/*
 * Replies with an OpenAI-shaped error:
 * {"error": {"message": <fmt...>, "type": type, "param": param | null,
 * "code": code | null}}. type NULL means "invalid_request_error" for 4xx
 * and "server_error" for 5xx.
 */
int srv_reply_error(srv_request *r, unsigned status, const char *type,
                    const char *param, const char *code, const char *fmt,
                    ...) __attribute__((format(printf, 6, 7)));

/*
 * Isolation (docs/accounts.md#isolation). A request is isolated when an
 * API key or a token authenticated it (modes keys and jwt): it sees only
 * what its owner id owns. In mode none nothing is isolated and owner ids are
 * the requests' `user` fields, as before accounts.
 */
int srv_isolated(const srv_request *r);
/* The same for an identity (NULL: not isolated). */
int srv_identity_isolated(const srv_identity *who);

/*
 * The owner id of what this request makes and reads, into *owner: the
 * request's user (request_user, NULL: anonymous) when not isolated; the
 * key's workspace/user for a user key; for a service key its
 * workspace/user/<end user>, the end user being request_user (a body's
 * `user`) or else the X-Loom-User header (neither: the service itself).
 * out holds it when it is made. 1: go on; 0: a 400 for a bad end user
 * was answered.
 */
int srv_request_owner(srv_request *r, const char *request_user,
                      char out[SRV_OWNER_SIZE], const char **owner);

/*
 * 1 when the request may see a thing whose owner id is object_owner
 * (NULL: anonymous), its end user named as in srv_request_owner. When
 * isolated, only its own; else anything, unless request_user is given
 * (GET /v1/runs/{id}?user=, an approval's `user`), which must then be
 * the thing's. Every route that shows, changes or follows a stored or
 * running thing asks this one function, and answers 404 when it says 0.
 */
int srv_owns(srv_request *r, const char *object_owner,
             const char *request_user);

/*
 * Whom the request's model calls are counted to (loom_usage_account,
 * docs/accounts.md#usage), its end user named as in srv_request_owner
 * (which has checked it): with an API key, the key, its workspace and
 * user and a service key's end user; else request_user as the user.
 * The strings are borrowed from r and request_user.
 */
void srv_request_account(srv_request *r, const char *request_user,
                         loom_usage_account *out);

/* Returned by srv_run_start() for a key not allowed the run's model or
 * agent: 403 `model_not_allowed` / `agent_not_allowed`. */
#define SRV_EMODEL_NOT_ALLOWED (-102)
#define SRV_EAGENT_NOT_ALLOWED (-103)

/* 0 when who may run model with agent (NULL: none), else
 * SRV_EMODEL_NOT_ALLOWED or SRV_EAGENT_NOT_ALLOWED. Only API keys are
 * limited; anything else is allowed. */
int srv_identity_allows(const srv_identity *who, const char *model,
                        const char *agent);

/* Returned by srv_run_start() past a limit of the caller (loom/limits.h):
 * 429 `rate_limit_exceeded` of type "requests" (requests per minute,
 * concurrent runs) or "tokens" (tokens per minute), with Retry-After;
 * 429 `insufficient_quota` for a budget used up; 403 `model_not_priced`
 * for a model without prices under a budget that does not allow it. */
#define SRV_ERATE_REQUESTS (-104)
#define SRV_ERATE_TOKENS (-105)
#define SRV_EQUOTA (-106)
#define SRV_EUNPRICED (-107)

/* Replies 429 insufficient_quota: a budget refused the run's first model
 * call, before anything was said. */
int srv_reply_quota(srv_request *r, const char *detail);

/* Returned by srv_run_start() when max_concurrent_runs are busy and the
 * request cannot wait for a slot. */
#define SRV_EBUSY (-100)
/*
 * Returned by srv_run_start() when max_concurrent_runs are busy and the
 * request now waits for a slot (docs/server.md, the admission queue).
 * Pass it on to srv_reply_loom_error(), which then answers nothing: the
 * handler runs again once the request has a slot, or the request gets
 * 503 when its wait is over. A handler must do nothing before starting
 * its run that it cannot do twice.
 */
#define SRV_EQUEUED (-108)
/* Returned by srv_run_start() when the server has no model provider at
 * all (an embedder's config without one): a 503 `no_provider`, the
 * server's problem and not the client's. */
#define SRV_ENOPROVIDER (-101)

/*
 * Replies for a failed call whose code is rc and whose message is in
 * loom_error_last(): LOOM_ENOTFOUND 404 (code "not_found"),
 * LOOM_EINVALID / LOOM_EPROTO 400, LOOM_ETOOLARGE 413, SRV_EBUSY 503 with
 * Retry-After (code "server_busy"), LOOM_EUPSTREAM 502, LOOM_ETIMEDOUT
 * 504, anything else 500; SRV_EQUEUED nothing (see there). param may be
 * NULL.
 */
int srv_reply_loom_error(srv_request *r, int rc, const char *param);

/*
 * The request's body is a JSON object with only the fields in known (a
 * NULL-ended list): 1, else 0 after the 400 (invalid_json or
 * unknown_parameter naming the field).
 */
int srv_body_only_known(srv_request *r, const char *const *known);

/* ---- routes -------------------------------------------------------------- */

/*
 * A handler answers one request: it calls exactly one srv_reply_*,
 * srv_defer() or srv_reply_sse() and returns 0, or returns a negative
 * code without replying (the dispatcher then answers 500 with
 * loom_error_last()). Runs on the server thread.
 */
typedef int (*srv_handler)(srv_request *r);

typedef struct srv_router srv_router;

/*
 * Registers handler for method on a path template. A template is a
 * literal path whose segments may be "{name}" (one non-empty segment,
 * handed over in r->params in order, at most SRV_MAX_PARAMS); the last
 * may be "{name...}", which takes the rest of the path, slashes and all
 * (model ids: "agent/researcher", "p/org/model"). Literal
 * routes win over templated ones. A path that matches with another method
 * gets 405; no match gets 404. LOOM_EEXISTS for a duplicate.
 */
int srv_route(srv_router *rt, const char *method, const char *tmpl,
              srv_handler handler);

/*
 * Registers the OpenAI-compatible routes (POST /v1/chat/completions).
 * Implemented by chat.c; server.c calls it once at start.
 */
void srv_chat_routes(srv_router *rt);

/* ---- runs ---------------------------------------------------------------- */

typedef struct srv_run srv_run;

/*
 * What to run. Everything is borrowed for the call (srv_run_start copies
 * what it keeps). Start from SRV_RUN_SPEC_INIT.
 */
typedef struct {
    const char *agent;  /* agent name; NULL: default_agent, or none */
    int no_agent;       /* no agent at all, not even default_agent */
    const char *model;  /* "provider/model"; NULL: the agent's, or
                           srv_default_model() */
    const char *system_prompt; /* overrides the agent's; NULL: agent's */
    /*
     * The conversation so far. NULL: loaded from the store when
     * conversation_id is set (the native API); non-NULL: used as is and
     * not loaded (the chat API, whose clients send the whole history).
     */
    const loom_messages *history;
    const loom_messages *input; /* this turn's new messages; not empty */
    const char *conversation_id; /* NULL: a new conversation is created */
    /* That new conversation is created with the run's save, not before
     * (loom_turn_options.create_with_save): for a run whose answer is the
     * first place its conversation's id is given. */
    int create_with_save;
    /* Its model calls ask for whole answers (loom_turn_options): for a
     * run whose client reads only the finished answer. */
    int whole_answers;
    /* Server tools offered: NULL with tool_names_set 0: the agent's
     * (every registered tool without an agent). */
    const char *const *tool_names;
    size_t tool_names_len;
    int tool_names_set;
    /* Client tools (run by the client, see loom_run_options). The defs
     * point into client_tools_json, which the run keeps a reference to. */
    const loom_tool_def *client_tools;
    size_t client_tools_len;
    json_t *client_tools_json;
    loom_tool_choice tool_choice; /* used when tool_choice_set */
    int tool_choice_set;
    int parallel_tool_calls; /* -1: the agent's */
    long max_tokens;         /* 0: the model's max_output_tokens */
    double temperature;      /* < 0: unset */
    int max_iterations;      /* 0: the agent's */
    int background;          /* a client going away does not cancel it */
    /* Its client reads its events as they come and may answer its
     * mcp.elicitation events (loom_turn_options.elicitation). */
    int elicitation;
    /* The client's sampling and output parameters; NULL: none. Check
     * them first with srv_run_check_params. */
    const loom_llm_params *params;
    /* The user the run is for (loom__chat_user_valid), or NULL: anonymous.
     * Without one the memory tools are not offered. With an identity,
     * the owner id (srv_request_owner). */
    const char *user_id;
    /* The caller (NULL: anyone). With an API key, the run's model and
     * agent must be the key's (SRV_EMODEL_NOT_ALLOWED, ...) and a
     * conversation it continues must be user_id's (else LOOM_ENOTFOUND,
     * as for an unknown one). */
    const srv_identity *who;
    /* A research agent's settings for this run (loom_turn_options
     * .research), or NULL. */
    const json_t *research;
    /* Title a new conversation (loom_turn_options.title). */
    int title;
    /* The run's own budget (loom_turn_options.budget); zero: none. */
    loom_run_budget budget;
    /* The request that starts the run: the caller's limits set their
     * x-ratelimit-* headers on its answer. NULL: none. */
    srv_request *request;
    /* Resuming the stored research run run_id (srv__runs_resume);
     * conversation_id is its conversation. NULL, 0: a new run. */
    const char *run_id;
    int resume;
    /* The caller's own settings (srv_user_settings), or NULL: read by
     * srv_run_start for user_id. */
    const json_t *user_settings;
    /* Whom its model calls are counted to (srv_request_account). */
    loom_usage_account account;
} srv_run_spec;

#define SRV_RUN_SPEC_INIT                                                      \
    {                                                                          \
        .parallel_tool_calls = -1, .temperature = -1.0                         \
    }

/*
 * The settings of owner (a run's user_id; NULL: the anonymous user) as
 * kept, or NULL when there are none, there is no store, or they cannot be
 * read (logged; the run goes on without them). New reference.
 */
json_t *srv_user_settings(srv_server *s, const char *owner);

/* The agent sp runs with settings: sp's own, else (when sp names no
 * agent, allows one and names no "agent/..." model) the settings'
 * default_agent, else NULL (the config's default). Borrowed. */
const char *srv_settings_agent(const json_t *settings, const srv_run_spec *sp);

/*
 * Starts a run on a worker thread of its own and returns a reference to
 * it (release with srv_run_unref). Before returning it has resolved the
 * agent, model and provider, checked that a conversation it continues
 * exists (a store read), chosen the ids (srv_run_id() and
 * srv_run_conversation_id() are known before any model output) and
 * checked the run's options; it writes nothing. Errors (nothing started,
 * nothing stored): SRV_EBUSY when max_concurrent_runs are running,
 * SRV_EQUEUED when they are and the request now waits for a slot,
 * LOOM_ENOTFOUND for an unknown agent, model or conversation,
 * LOOM_EINVALID for a bad spec, LOOM_EIO from the store; pass them to
 * srv_reply_loom_error(). The worker then creates the new conversation or
 * loads the continued one's history (a run whose store work fails there
 * ends failed with code "store_failed" without calling the model), runs
 * the loop into the run's event log and at the end stores the turn with
 * loom_store_save_turn (also when the run failed or was cancelled),
 * retrying a store that answers LOOM_EIO for SRV_STORE_RETRY_MS.
 * Finished runs stay findable for a while (the last keep_finished_runs
 * of them).
 */
int srv_run_start(srv_run **out, srv_server *s, const srv_run_spec *spec);

/*
 * Whether the model spec would call takes spec->params (see
 * loom_session_check_params). 1: it does, go on. Else the answer is sent
 * (400 unsupported_parameter naming the parameter and the provider, or
 * what the check failed with) and 0 or an error to return is returned.
 */
int srv_run_check_params(srv_request *r, const srv_run_spec *spec);

/* A new reference to the run with this id, or NULL. */
srv_run *srv_run_find(srv_server *s, const char *id);
/* A new reference to the run whose tree holds the run id: that run, or
 * the one with a sub-agent run of that id going on (loom_turn_has_run);
 * NULL when none. */
srv_run *srv_run_find_tree(srv_server *s, const char *id);
void srv_run_ref(srv_run *run);
/* NULL is a no-op. */
void srv_run_unref(srv_run *run);

/* Constant for the run's life. */
const char *srv_run_id(const srv_run *run);
const char *srv_run_conversation_id(const srv_run *run);
const char *srv_run_model_name(const srv_run *run); /* "provider/model" */
const char *srv_run_agent_name(const srv_run *run); /* may be NULL */
int srv_run_background(const srv_run *run);
/* Whether the run is a research run; makes it a background run. */
int srv_run_research(const srv_run *run);
void srv_run_set_background(srv_run *run);
int64_t srv_run_created_ms(const srv_run *run); /* Unix milliseconds */

/*
 * Asks the run to stop (any thread, lock-free); it ends as cancelled,
 * stored so. Returns 1 when the cancel may still take effect (the run
 * had not finished its loop), 0 when it comes too late (the run is
 * storing its turn or has ended: its status will not be cancelled).
 * Even after 1 the run may end otherwise (its loop was finishing): look
 * at srv_run_status() once it ended.
 */
int srv_run_cancel(srv_run *run);

/*
 * The client that owns the run (its stream or blocking request) left:
 * cancels it unless it is a background run or waits for approval, itself
 * or in one of its sub-agent runs (a paused run survives its client;
 * POST /v1/runs/{id}/input answers it). Lock-free apart from the run
 * tree's list of live runs and their approval gates, leaf locks.
 */
void srv_run_leave(srv_run *run);

/* The user the run is for, NULL for anonymous. Constant. */
const char *srv_run_user(const srv_run *run);

/* Answers a call that waits for approval in the run or one of its
 * sub-agent runs, the run run_id when not NULL (loom_turn_approve_in):
 * 0, LOOM_ENOTFOUND when that call does not wait, LOOM_EEXISTS when it
 * waits in several sub-agent runs. */
int srv_run_approve(srv_run *run, const char *run_id, const char *call_id,
                    int approve, const char *reason);
/* loom_turn_answer_elicitation on the run's turn. */
int srv_run_answer_elicitation(srv_run *run, const char *id, const char *action,
                               const json_t *content);

/* 1 once the run has ended and its turn has been stored (or failed to). */
int srv_run_ended(srv_run *run);
/*
 * RUNNING until the run ended, then its final status: the loop's, except
 * that a run whose turn could not be stored (or whose store work failed
 * before the model call) is FAILED even when its loop completed.
 */
loom_run_status srv_run_status(srv_run *run);

/* 1 when the run ended and its turn is in the store. */
int srv_run_stored(srv_run *run);
/* 1 when the run's budget refused its first model call (no call went
 * upstream); the run then ended with finish reason "budget". */
int srv_run_quota_refused(srv_run *run);

/* Why an ended run's turn is not in the store; NULL when it is (or the
 * run has not ended). Borrowed from the run. */
const char *srv_run_store_error(srv_run *run);

/* How long a store call answering LOOM_EIO (busy, locked, disk full) is
 * retried, with a backoff of 50 ms doubling up to 1 s. */
#define SRV_STORE_RETRY_MS 10000

/*
 * The loom_run behind it, for reading the result (text, usage, finish
 * reason, pending client calls, messages). Only once srv_run_ended() is
 * 1; NULL before.
 */
const loom_run *srv_run_result(srv_run *run);

/*
 * {"id", "object": "run", "status", "conversation_id", "agent", "model",
 * "background", "created_at", "ended_at", "text", "finish_reason",
 * "error", "usage", "iterations", "stored", "store_error", "events":
 * [...] (with_events)}; status is "running" until the end. New
 * reference, NULL on OOM.
 */
json_t *srv_run_to_json(srv_run *run, int with_events);

/* ---- the event log of a run ---------------------------------------------- */

/* One logged event of a run's turn (loom/session.h's loom_turn_event):
 * serialized once, immutable; json has "conversation_id" on run.started. */
typedef loom_turn_event srv_event;

/* The seq of the last event so far (0: none); *ended (may be NULL) is 1
 * when the run ended, i.e. no event will follow. */
uint64_t srv_run_last_seq(srv_run *run, int *ended);

/* The event with this seq; NULL when seq is 0 or not emitted yet.
 * Borrowed: valid while the caller holds a reference to the run. */
const srv_event *srv_run_event(srv_run *run, uint64_t seq);

/* The first event whose seq is greater than after_seq, or NULL when
 * there is none yet. Borrowed like srv_run_event. Readers walk the log
 * with this: seqs have no gaps unless the log hit max_run_events_bytes
 * (see docs/server.md). */
const srv_event *srv_run_next_event(srv_run *run, uint64_t after_seq);

/*
 * Waits up to timeout_ms (< 0: forever) until an event after after_seq
 * exists or the run ended. 1 when so, 0 at the timeout. For threads other
 * than the server's (tests, tools); handlers use srv_reply_sse/srv_defer.
 */
int srv_run_wait(srv_run *run, uint64_t after_seq, long timeout_ms);

/* ---- replies that wait for a run ----------------------------------------- */

/*
 * Called on the server thread once the run has ended: answers the
 * request with one srv_reply_* like a handler (same return rules).
 */
typedef int (*srv_done_fn)(srv_request *r, srv_run *run, void *payload);

/*
 * Suspends the request until run ends (its turn stored), then calls done
 * on the server thread. Takes a reference to run. If the client goes
 * away first, the run is cancelled (unless it is a background run), the
 * connection is closed and done is not called. free_payload (may be
 * NULL) is called once with payload when the request is over. Returns 0,
 * or an error without having suspended (payload is then not freed: the
 * caller still owns it). The handler returns 0 after a successful call.
 */
int srv_defer(srv_request *r, srv_run *run, srv_done_fn done, void *payload,
              void (*free_payload)(void *payload));

/* Answers whether a deferred request may go on before its run ended. */
typedef int (*srv_ready_fn)(srv_run *run, void *payload);

/*
 * Like srv_defer, but done is also called as soon as ready (checked on
 * the server thread whenever the run has a new event) returns non-zero.
 * done may then answer with srv_reply_sse(): a stream whose status is
 * held back until the run has something to say.
 */
int srv_defer_until(srv_request *r, srv_run *run, srv_ready_fn ready,
                    srv_done_fn done, void *payload,
                    void (*free_payload)(void *payload));

/* ---- replies that wait for a task --------------------------------------- */

/*
 * A task (tasks.c): work done on a thread of the handler's (an exchange
 * with another server) that a request waits for without blocking the
 * server thread. Reference counted: srv_task_new gives one; the thread
 * doing the work holds one and calls srv_task_finish once when done.
 */
typedef struct srv_task srv_task;
int srv_task_new(srv_task **out);
void srv_task_ref(srv_task *t);
void srv_task_unref(srv_task *t); /* NULL is a no-op */
/* Marks t finished and wakes the request waiting on it. Any thread. */
void srv_task_finish(srv_task *t);
int srv_task_finished(srv_task *t);

/* Called on the server thread once the task finished: answers the
 * request with one srv_reply_* like a handler (same return rules). */
typedef int (*srv_task_done_fn)(srv_request *r, void *payload);

/*
 * Suspends the request until t is finished, then calls done on the
 * server thread. Takes a reference to t. If the client goes away first,
 * the connection is closed and done is not called (the task goes on).
 * free_payload (may be NULL) is called once with payload when the
 * request is over. Returns 0, or an error without having suspended
 * (payload is then not freed). The handler returns 0 after a successful
 * call.
 */
int srv_defer_task(srv_request *r, srv_task *t, srv_task_done_fn done,
                   void *payload, void (*free_payload)(void *payload));

/* ---- server-sent events -------------------------------------------------- */

#define SRV_SSE_CONTINUE 0
#define SRV_SSE_END 1

/*
 * Formats one event into SSE bytes appended to out. Returns
 * SRV_SSE_CONTINUE, SRV_SSE_END to end the stream after out, or a
 * negative code to cut the connection. Runs on the server thread, once
 * per event, in seq order.
 */
typedef int (*srv_sse_format_fn)(srv_run *run, const srv_event *ev,
                                 loom_buf *out, void *payload);

/* Appends bytes at the start or at the end of a stream (after the run's
 * last event was formatted). */
typedef void (*srv_sse_edge_fn)(srv_run *run, loom_buf *out, void *payload);

typedef struct {
    srv_sse_format_fn format; /* NULL: srv_sse_native */
    srv_sse_edge_fn begin;    /* may be NULL */
    srv_sse_edge_fn end;      /* may be NULL */
    void *payload;
    void (*free_payload)(void *payload); /* may be NULL */
    uint64_t after_seq; /* start after this event (Last-Event-ID) */
    int observer; /* 1: the client going away never cancels the run */
} srv_sse_options;

#define SRV_SSE_OPTIONS_INIT { NULL, NULL, NULL, NULL, NULL, 0, 0 }

/*
 * Answers 200 text/event-stream (plus headers set with srv_set_header)
 * and drains run's event log through o->format: replays the events after
 * o->after_seq, then follows new ones as they come. While nothing
 * happens it sends ": keep-alive\n\n" every keepalive_ms. The stream ends
 * when the formatter says SRV_SSE_END or after the run's last event (and
 * o->end). A client that goes away before the run ended cancels it,
 * unless it is a background run or o->observer is set. Takes a
 * reference to run; the payload is freed (free_payload) when the stream
 * is over, also on failure.
 */
int srv_reply_sse(srv_request *r, srv_run *run, const srv_sse_options *o);

/* The native format: "id: <seq>\nevent: <type>\ndata: <json>\n\n". */
int srv_sse_native(srv_run *run, const srv_event *ev, loom_buf *out,
                   void *payload);

/* ---- test hooks ---------------------------------------------------------- */

/*
 * Fault injection for tests: returns LOOM_ENOMEM (with a message naming
 * point) when a test armed point with srv__fault_arm() and its count is
 * not used up, else 0. In production nothing is armed and this is one
 * atomic load. Points: "chat.started" (chat.c, after its run started),
 * "defer.done" (http.c, instead of a deferred request's done callback).
 */
int srv__fault(const char *point);

#endif
/* API READY */
