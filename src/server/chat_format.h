/*
 * Internal: the OpenAI Chat Completions wire format of POST
 * /v1/chat/completions, without any I/O (docs/openai-compat.md).
 *
 * Two halves. Requests: an OpenAI request body becomes a
 * loom__chat_request (messages, tools split into loom's own tools named
 * as strings and the client's full specs, tool choice, limits), or a
 * loom__chat_error in OpenAI's shape naming the field at fault. Responses:
 * a loom__chat_fmt turns a run's events, one at a time, into the bytes of
 * an OpenAI chat.completion.chunk stream, or collects them into one
 * chat.completion object with loom's tool_events. The server (chat.c)
 * glues the two to the run manager; everything here is testable alone.
 */
#ifndef LOOM_SERVER_CHAT_FORMAT_H
#define LOOM_SERVER_CHAT_FORMAT_H

#include "loom/buf.h"
#include "loom/config.h"
#include "loom/llm.h"
#include "loom/run.h"
#include "loom/session.h"
#include "loom/tools.h"

#include <jansson.h>
#include <stdarg.h>

/* Tools one request may list (OpenAI's own limit). */
#define LOOM__CHAT_MAX_TOOLS 128
/* Messages one request may hold. */
#define LOOM__CHAT_MAX_MESSAGES 4096
/* Content parts of one message. */
#define LOOM__CHAT_MAX_PARTS 256

/*
 * An error as OpenAI reports it: {"error": {"message", "type", "param",
 * "code"}} with an HTTP status. message and param are owned (param may be
 * NULL); type and code point to static strings (code may be NULL).
 */
typedef struct {
    int status;
    char *message;
    const char *type;
    char *param;
    const char *code;
} loom__chat_error;

/* Fills *err (cleared first). Returns LOOM_EINVALID, or LOOM_ENOMEM when
 * the message cannot be built (err->message is then NULL, which
 * loom__chat_error_json renders as "out of memory"). */
int loom__chat_error_set(loom__chat_error *err, int status, const char *type,
                         const char *code, const char *param,
                         const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
void loom__chat_error_clear(loom__chat_error *err);
/* {"error": {"message", "type", "param", "code"}}, any invalid UTF-8 in
 * the message replaced with U+FFFD; NULL on OOM. */
json_t *loom__chat_error_json(const loom__chat_error *err);

/*
 * Maps the data of a run.failed event to the error an OpenAI client
 * expects: upstream 429 stays 429 (rate_limit_error), other upstream 4xx
 * keep their status except 401/403 (502: loom's own upstream credentials
 * are at fault, not the client's), upstream 5xx, dropped connections and
 * unreadable answers are 502, time limits 504, anything else 500.
 */
int loom__chat_error_from_failure(loom__chat_error *err, const json_t *data);

/* A 400 invalid_type: "Invalid type for '<param>': expected <expected>,
 * but got <got's type> instead." Returns LOOM_EINVALID (or LOOM_ENOMEM). */
int loom__chat_bad_type(loom__chat_error *err, const char *param,
                        const char *expected, const json_t *got);
/* A 400 invalid_value: "Invalid value for '<param>': <fmt...>". */
int loom__chat_bad_value(loom__chat_error *err, const char *param,
                         const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The value at key of o, NULL when absent or null (null: not given). */
const json_t *loom__chat_opt(const json_t *o, const char *key);

/*
 * Parses the sampling and output parameters of a request body (top_p,
 * seed, stop, response_format, reasoning_effort, verbosity, logit_bias,
 * metadata, service_tier, ...: docs/openai-compat.md) into *out (zeroed
 * first; the caller clears it). Refuses with 400 unsupported_parameter
 * what loom cannot give for any provider (n above 1, logprobs, audio,
 * ...), with invalid_type / invalid_value a bad one, param naming it.
 * LOOM_EINVALID with *err filled (*out is then zero), LOOM_ENOMEM.
 */
int loom__chat_params_parse(loom_llm_params *out, const json_t *body,
                            loom__chat_error *err);

/*
 * A run's budget as a request gives it (docs/accounts.md "Per-run
 * budgets"): v, the field `param` (`loom_budget` of a chat request,
 * `budget` of a native run; NULL or null: none), an object of
 * max_cost_usd (a number of dollars above 0, at most 1,000,000; kept in
 * micro-dollars, rounded to the nearest), max_tokens and max_seconds
 * (integers from 1). Any other key, type or value is LOOM_EINVALID with
 * *err filled, param naming the field ("loom_budget.max_tokens").
 */
int loom__chat_budget_parse(loom_run_budget *out, const json_t *v,
                            const char *param, loom__chat_error *err);

/* The chat request field of a run's budget. */
#define LOOM__CHAT_BUDGET_FIELD "loom_budget"

/* A parsed request. Every pointer is owned by the struct. */
typedef struct {
    char *model;
    int stream;
    int include_usage;       /* stream_options.include_usage */
    loom_messages messages;  /* in order; developer became system */
    char **tool_names;       /* tools given as strings: loom runs them */
    size_t tool_names_len;
    size_t *tool_name_pos;   /* position of each in `tools` (for param) */
    /*
     * Tools given as full specs: the client runs them. Their strings and
     * parameters point into tools_json (a copy of the request's `tools`,
     * independent of the body), which a run may keep a reference to.
     */
    loom_tool_def *client_tools;
    size_t client_tools_len;
    size_t *client_tool_pos;
    json_t *tools_json;
    int has_tool_choice;
    loom_tool_choice tool_choice; /* function owned */
    int parallel_tool_calls; /* -1 unset */
    long max_tokens;         /* 0 unset; max_completion_tokens wins */
    double temperature;      /* < 0 unset */
    char *conversation_id;   /* NULL when none */
    char *user;              /* `user`: the run's user id; NULL when none */
    loom_llm_params params;  /* sampling and output parameters */
    /* loom_server_tool_calls: "inline" streams loom's own calls in
     * tool_calls (the seed-compatible shape), 1; "separate" (default) in
     * loom_tool_calls, 0. */
    int server_calls_inline;
    /* loom_continue: false: never continue a stored conversation the
     * messages extend (docs/openai-compat.md#stateless-clients), 1. */
    int no_continue;
    /* loom_budget: the run's own budget; zero: none. */
    loom_run_budget budget;
} loom__chat_request;

/* The request field and header that choose where a stream puts loom's
 * own (server-run) tool calls. */
#define LOOM__CHAT_SERVER_CALLS_FIELD "loom_server_tool_calls"
#define LOOM__CHAT_SERVER_CALLS_HEADER "X-Loom-Server-Tool-Calls"

/* 1 for "inline", 0 for "separate", -1 for anything else. */
int loom__chat_server_calls_mode(const char *s);

/* The request field (a boolean) and header ("on" or "off") that turn
 * off recognising a stateless client's continuation. */
#define LOOM__CHAT_CONTINUE_FIELD "loom_continue"
#define LOOM__CHAT_CONTINUE_HEADER "X-Loom-Continue"

/* The longest user id a request may give. */
#define LOOM__CHAT_USER_MAX 128
/* The characters of a user id besides ASCII letters and digits. */
#define LOOM__CHAT_USER_PUNCT "_-.@:+="

/*
 * 1 when s is a usable user id (the chat API's `user`, the runs API's
 * `user`): 1 to LOOM__CHAT_USER_MAX bytes of ASCII letters, digits and
 * LOOM__CHAT_USER_PUNCT (room for emails, UUIDs and hashed ids; nothing
 * that needs quoting in logs or the store). Else 0.
 */
int loom__chat_user_valid(const char *s);

/*
 * Parses an OpenAI chat completions body. Unknown fields are ignored,
 * null counts as absent for optional fields. On a bad request returns
 * LOOM_EINVALID with *err filled (status 400, param naming the field, as
 * "messages[2].role"); *out is then empty. LOOM_ENOMEM on OOM.
 */
int loom__chat_request_parse(loom__chat_request *out, const json_t *body,
                             loom__chat_error *err);
/* Same, from the raw body: text that is not a JSON object is a 400. */
int loom__chat_request_parse_text(loom__chat_request *out, const char *text,
                                  size_t len, loom__chat_error *err);
void loom__chat_request_clear(loom__chat_request *req);

/*
 * The server tools a run offers: an agent's (agent_tools, or every
 * registered tool with agent_all) plus the names the request listed. On
 * success *names (caller frees the array, not the strings: they are
 * borrowed from agent_tools, req and reg) holds them in order, without
 * duplicates, and *all is 1 when every registered tool is offered (then
 * *names is NULL). A name the registry lacks is a 400 listing the
 * available tools; a client tool that takes a server tool's name, or two
 * client tools of one name, is a 400 too; so is a tool_choice naming a
 * tool that is not offered.
 */
int loom__chat_server_tools(const char ***names, size_t *len, int *all,
                            const loom__chat_request *req,
                            const loom_tool_registry *reg,
                            const char *const *agent_tools,
                            size_t agent_tools_len, int agent_all,
                            loom__chat_error *err);

/* "chatcmpl-" + the run id without its "run_" prefix, into out. */
void loom__chat_completion_id(char *out, size_t size, const char *run_id);

typedef struct {
    const char *id;              /* "chatcmpl-..." */
    const char *model;           /* the model name the client asked for */
    long long created;           /* Unix seconds */
    int include_usage;           /* stream: send the usage chunk */
    const char *conversation_id; /* may be NULL */
    /*
     * The client's own tools: calls of these names are the client's to
     * answer and go in tool_calls; calls of any other name are loom's
     * (server calls) and go in loom_tool_calls, unless
     * server_calls_inline, which streams them in tool_calls too.
     */
    const loom_tool_def *client_tools;
    size_t client_tools_len;
    int server_calls_inline;
} loom__chat_fmt_opts;

typedef struct loom__chat_fmt loom__chat_fmt;

/* Copies what opts points to. */
int loom__chat_fmt_new(loom__chat_fmt **out, const loom__chat_fmt_opts *opts);
void loom__chat_fmt_free(loom__chat_fmt *f);

/*
 * Streaming: appends to out the SSE bytes (`data: <json>\n\n` each) that
 * ev means for an OpenAI client, and notes what the non-streamed answer
 * needs. The first call, whatever ev is, starts with the role chunk,
 * which carries conversation_id. A turn's tool calls go out as one
 * delta: the client's in tool_calls, loom's in loom_tool_calls (see
 * server_calls_inline), each list with its own running index; their
 * outputs as tool_output deltas. run.completed brings the finish chunk
 * and the usage chunk (include_usage); a cancelled run.failed does too,
 * with finish_reason "stop" and "loom_status": "cancelled" (a user's
 * stop is no failure); any other run.failed a `data: {"error": ...}`
 * event. Events after either add nothing. out may be NULL to only
 * collect.
 */
int loom__chat_fmt_event(loom__chat_fmt *f, const loom_event *ev,
                         loom_buf *out);

/*
 * loom__chat_fmt_event for a logged event of run run_id, as the event
 * loom_turn_event_json(ev) reads back (same bytes, same facts kept),
 * but the text is parsed only for an event the formatter acts on: none
 * of a sub-agent's (ev->depth), nor an event it ignores, nor a delta
 * whose literal the entry notes (ev->delta_len), which goes into the
 * chunk as it is, nor the run's end, whose JSON the entry keeps
 * (ev->json).
 */
int loom__chat_fmt_logged(loom__chat_fmt *f, const loom_turn_event *ev,
                          const char *run_id, loom_buf *out);

/*
 * The end of the stream, once the run has ended (and its turn is
 * stored, so a client that sends its next message on `[DONE]` finds the
 * turn in the conversation): `data: [DONE]` after run.completed or a
 * cancelled run.failed, nothing
 * after run.failed (OpenAI ends an errored stream without it), and when
 * neither went through, the error event of a run that ended without a
 * result. Only the first call writes.
 */
int loom__chat_fmt_end(loom__chat_fmt *f, loom_buf *out);

/* The role chunk alone (the stream's first bytes), if not sent yet. */
int loom__chat_fmt_begin(loom__chat_fmt *f, loom_buf *out);

/* 1 once run.completed or run.failed went through. */
int loom__chat_fmt_done(const loom__chat_fmt *f);

/* The run.failed data seen, or NULL (also after a cancelled run, which
 * ends as a normal answer). Borrowed. */
const json_t *loom__chat_fmt_failure(const loom__chat_fmt *f);

/*
 * Non-streaming: the chat.completion object of a completed (or
 * cancelled: "loom_status": "cancelled") run, with usage (and its
 * extension fields), message.reasoning_content when the final turn
 * reasoned, tool_events (text, reasoning, tool_call and tool_output
 * entries in order) and conversation_id. LOOM_EINVALID before the run
 * ended.
 */
int loom__chat_fmt_completion(loom__chat_fmt *f, json_t **out);

/*
 * The same object as its compact JSON text, appended to out: byte for
 * byte what srv_reply_json writes for loom__chat_fmt_completion's object
 * (loom__json_compact_dumps, precision 15), without building the object
 * and dumping it again. The same errors; out may then hold part of it.
 */
int loom__chat_fmt_completion_text(loom__chat_fmt *f, loom_buf *out);

/* Renders a usage object as OpenAI does (details only when non-zero). */
json_t *loom__chat_usage_json(const loom_usage *u);
/*
 * The same plus loom's extension fields: cached_tokens,
 * reasoning_tokens, cache_write_tokens (always) and cost_micros
 * (integer micro-dollars; null unless cost_known).
 */
json_t *loom__chat_usage_ext_json(const loom_usage *u, int cost_known);

#endif
