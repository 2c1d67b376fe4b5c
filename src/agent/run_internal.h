/*
 * Internal: the state of a run, shared by the files of the run loop.
 *
 * run.c is the loop (requests, streaming, limits, the context engine);
 * hooks.c runs the tool calls of a turn through the hooks and policies
 * and keeps their telemetry; plan.c holds the loop tools (todo_write,
 * think) and the plan. They share struct loom_run and the few helpers
 * below; nothing outside src/agent/ sees them.
 */
#ifndef LOOM_AGENT_RUN_INTERNAL_H
#define LOOM_AGENT_RUN_INTERNAL_H

#include "agent/citations.h"
#include "agent/toolexec.h"
#include "loom/buf.h"
#include "loom/run.h"

/* Loop tools, by their index in loom_run.loop_tools. */
enum { LOOM__LOOP_TODO = 0, LOOM__LOOP_THINK, LOOM__LOOP_COUNT };

struct loom_run {
    loom_run_options opts;
    char *id;
    char *conversation_id; /* reported in run.started; NULL: none */
    loom_cancel cancel;
    loom_run_status status;
    loom_messages all;   /* system prompt + history + this run's messages */
    loom_messages added; /* this run's messages only */
    loom_tool_def *defs; /* offered: server tools, then client tools */
    const loom_tool **offered; /* the server tools, defs[0..nserver) */
    size_t ndefs;
    size_t nserver;
    loom_tool_call *pending; /* client calls the run ended on */
    size_t npending;
    char *finish_reason;
    char *available; /* offered names, "a, b" */
    loom_tool_choice choice; /* for the next model call */
    char *choice_fn;
    loom_buf text;   /* text of the current turn */
    /* Per tool call of the current turn (by its stream index): the bytes
     * of text streamed before the call's first fragment; SIZE_MAX when
     * the call streamed no fragment. */
    size_t *call_offsets;
    size_t ncall_offsets, capcall_offsets;
    char *final_text;
    loom_usage usage;
    /* Calls that reported usage with and without a known cost: the run's
     * cost is known when every one of them had one. */
    int priced_calls, unpriced_calls;
    char *answered_model; /* the model of the last call, when named */
    int iterations;
    uint64_t seq;
    uint32_t index;
    char *error;
    /* The request text of this run's model calls: run->all only grows
     * during a run, which is the cache's contract. */
    loom_llm_cache *cache;
    /* The context engine (NULL: off). stored[i] says whether run->all's
     * message i is part of the conversation the caller stores (history
     * and this run's messages) rather than loom's own (the system prompt,
     * results made up for interrupted calls, the limit prompt): summary
     * coverage is counted in conversation messages. */
    loom_context *ctx;
    unsigned char *stored;
    size_t nstored, capstored;
    char *summary; /* the newest summary the engine made */
    size_t summary_covers;
    int switched;  /* moved to the context_window_fallback */

    /* ---- tool calls (hooks.c) ---- */
    /* The before/after chain: loom's policies around the caller's hooks. */
    loom_tool_hook *hooks;
    size_t nhooks;
    loom__tool_job *cur;   /* the job the chain is looking at */
    unsigned char *blocked; /* per offered server tool: failed too often */
    int *failures;          /* per offered server tool: failed calls */
    /* The tools of the next request: defs without the blocked ones. */
    loom_tool_def *req_defs;
    size_t nreq_defs;
    int req_defs_stale;
    json_t *succeeded;  /* duplicate key -> call id of its first success */
    json_t *turn_keys;  /* duplicate key -> call id, this turn's calls */
    json_t *seen;       /* document id -> true */
    json_t *documents;  /* the documents, in the order first seen */
    json_t *records;    /* tool call records */
    size_t records_dropped;

    /* ---- loop tools and the plan (plan.c) ---- */
    loom_tool loop_tools[LOOM__LOOP_COUNT];
    int loop_on[LOOM__LOOP_COUNT];
    json_t *plan;        /* the current plan, or NULL */
    int plan_shown;      /* the system message shows the current plan */
    int has_system;      /* run->all.items[0] is loom's system message */
    char *system_prev;   /* the system text the last request carried */
    int think_turns;     /* think-only turns that cost no iteration */

    /* ---- citations (citations.c) ---- */
    loom__citations *cites; /* NULL: citations off */
    json_t *citations;      /* the answer's, for loom_run_citations */

    /* ---- token counting feedback ---- */
    /* The request's tokens as the context engine counted them with the
     * run's token counter (plus the reply's priming); 0: not counted. */
    size_t estimated_prompt;
};

/*
 * A run built in two steps, for a caller that learns the history after
 * the options (the session layer: a bad request fails at once, before the
 * store is read). loom_run_new() is create + begin.
 *
 * loom__run_create checks and applies the options (errors as
 * loom_run_new, but no history is needed). loom__run_begin gives the run
 * its history (copied, not empty) and what the conversation carries from
 * earlier runs (may be NULL; strings borrowed until the run is freed):
 * the context summary with the messages it covers, used unless the
 * options set one, and the plan, used unless the options set one. Once,
 * before loom_run_execute.
 */
typedef struct {
    const char *summary;
    size_t summary_covers;
    const json_t *plan;
} loom__run_carried;

int loom__run_create(loom_run **out, const loom_run_options *opts);
int loom__run_begin(loom_run *run, const loom_messages *history,
                    const loom__run_carried *carried);

/*
 * Ends a run that never executed as failed: emits run.started and a
 * run.failed whose error has code (NULL: the name of rc) and the message
 * of loom_error_last(). For a turn whose store work failed before the
 * model call.
 */
void loom__run_fail(loom_run *run, int rc, const char *code);

/*
 * Event payloads are built with the pk_ helpers below rather than
 * json_pack: the same objects (keys in the same order, and NULL for the
 * whole payload when a value is missing or not UTF-8, as json_pack
 * fails), without parsing a format string per event. And none is built
 * when the run has no sink (see loom__run_has_sink).
 */
typedef struct {
    json_t *o;
    int bad;
} pk;

static inline pk pk_new(void)
{
    pk p;

    p.o = json_object();
    p.bad = !p.o;
    return p;
}

/* o[key] = v, stealing v; key is a literal (ASCII), so not checked. */
static inline void pk_set(pk *p, const char *key, json_t *v)
{
    if (!v) {
        p->bad = 1;
        return;
    }
    if (p->bad || json_object_set_new_nocheck(p->o, key, v) != 0)
        p->bad = 1;
    if (p->bad)
        json_decref(v);
}

/* "s:s": a string, required. */
static inline void pk_str(pk *p, const char *key, const char *s)
{
    pk_set(p, key, s ? json_string(s) : NULL);
}

/* "s:s?": a string, or null. */
static inline void pk_str_or_null(pk *p, const char *key, const char *s)
{
    pk_set(p, key, s ? json_string(s) : json_null());
}

static inline void pk_int(pk *p, const char *key, json_int_t v)
{
    pk_set(p, key, json_integer(v));
}

/* The object, or NULL when a value was refused (json_pack's failure). */
static inline json_t *pk_done(pk *p)
{
    if (!p->bad)
        return p->o;
    json_decref(p->o);
    return NULL;
}

static inline int loom__run_has_sink(const loom_run *run)
{
    return run->opts.sink.emit != NULL;
}

/* Sends one event; a sink's non-zero answer cancels the run. Takes data
 * (NULL: an empty object). */
void loom__run_emit(loom_run *run, loom_event_type type, json_t *data);

/* Adds a message to both the request history and this run's messages. */
int loom__run_add_message(loom_run *run, const loom_messages *one);

/* {id, name, arguments} of a call; NULL when out of memory. */
json_t *loom__run_call_json(const loom_tool_call *c);

int loom__run_is_client_tool(const loom_run *run, const char *name);

/* The offered server tool (or loop tool) of that name, or NULL. */
const loom_tool *loom__run_offered_tool(const loom_run *run,
                                        const char *name);

/* ---- hooks.c ---- */

/* Builds the hook chain and the policies' tables. */
int loom__hooks_init(loom_run *run);
void loom__hooks_free(loom_run *run);

/*
 * Runs the server tool calls of one turn (the assistant message just
 * added) and appends their results in call order. Client calls are left
 * for the client: *client_calls says how many there were. *think_only is
 * set when every call of the turn was a think call.
 */
int loom__run_tools(loom_run *run, const loom_message *assistant,
                    size_t *client_calls, int *think_only);

/* The tools the next request offers (blocked ones left out). */
int loom__run_request_tools(loom_run *run, const loom_tool_def **defs,
                            size_t *n);

/* ---- plan.c ---- */

/* Makes the loop tools' definitions (their schemas are owned by run). */
int loom__loop_tools_init(loom_run *run);
void loom__loop_tools_free(loom_run *run);

/*
 * Validates a plan given by the caller (a stored one) and keeps a copy.
 * LOOM_EINVALID with a message.
 */
int loom__plan_set(loom_run *run, const json_t *plan);

/*
 * Puts the plan section into the system message when planning is on and
 * the plan changed since the last request (or at first). Keeps the text
 * the last request carried alive, as the request cache requires.
 */
int loom__plan_refresh_system(loom_run *run);

/*
 * Executes a loop tool call on the run's thread: job is prepared (its
 * arguments validated) and not done; it ends done.
 */
void loom__loop_tool_execute(loom_run *run, loom__tool_job *job);

#endif
