/*
 * The run loop: one agent answering one turn of a conversation, with as
 * many model calls and tool rounds as it takes.
 *
 * One run is straight-line code on one thread: build the request from the
 * conversation plus the messages of this run, stream the model's answer
 * (emitting deltas as they arrive), and if the model asked for tools, run
 * them (in parallel, bounded), append their results in call order and go
 * round again. A tool failure of any kind becomes a tool result the model
 * can read; it never ends the run. The last permitted model call forbids
 * tool calls (tool_choice none) and carries an instruction to answer from
 * what has been gathered, so a run that reaches its limit still ends with
 * an answer.
 *
 * When the run has a context window (loom_run_context_options), the
 * context engine (context.c) fits each request to it first: the run's
 * full history is kept and stored as it is, and only the request shrinks.
 *
 * The tool calls of a turn go through the tool turn (toolturn.c: hooks,
 * policies, telemetry); the loop tools and the plan shown in the system
 * message are plan.c's. Neither sees the run: this file owns the messages
 * and sends every event, and hands them an emit callback. A turn of
 * non-iterative calls only (think by default) costs no iteration, up to
 * max_think_turns of them.
 *
 * The agent's hooks (loom/agent.h) are asked at fixed points of the loop
 * (the "agent hooks" section below); where a hook is NULL, loom's rule
 * holds, and for on_no_tool_calls and get_model loom's rule is itself a
 * hook (loop_rules.c) that carries out the agent's YAML keys.
 *
 * Ownership: the run owns copies of the history and every message it adds;
 * provider, registry and sink are borrowed from the caller.
 */
#include "loom/run.h"
#include "agent/argrepair.h"
#include "agent/citations.h"
#include "agent/emit.h"
#include "agent/gate.h"
#include "agent/handoff.h"
#include "agent/loop_rules.h"
#include "agent/media_fetch.h"
#include "agent/plan.h"
#include "agent/prompt.h"
#include "agent/review.h"
#include "agent/run_internal.h"
#include "agent/subagent.h"
#include "agent/title.h"
#include "agent/tool_images.h"
#include "agent/toolrules.h"
#include "agent/toolturn.h"
#include "core/error.h"
#include "core/fiber.h"
#include "core/text.h"
#include "core/tokenizer_internal.h"
#include "loom/buf.h"
#include "loom/log.h"
#include "loom/tokenizer.h"
#include "tools/registry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define DEFAULT_MAX_ITERATIONS 10
#define DEFAULT_CONCURRENCY 8
#define DEFAULT_MAX_RESULT (256 * 1024)
#define DEFAULT_MAX_ERROR 2048
/* Bytes of the tool rules' bookkeeping (indices of results to reduce,
 * replaced request texts kept): far more than a run's messages need. */
#define RULES_BUF_MAX ((size_t)16 << 20)

#define LIMIT_PROMPT                                                         \
    "You have reached the limit of %d model calls for this request, so "     \
    "tools are no longer available. Do not call any tools. Write your "      \
    "final answer to the user now, using the information gathered so far, " \
    "and say briefly if anything could not be completed."

#define TOOLS_DISABLED_MESSAGE                                                 \
    "I could not use {tool}: it is not enabled for your account or this "      \
    "request. Enable {tool} in your settings (or ask your administrator to "   \
    "enable it), then ask again."

#define BUDGET_PROMPT                                                          \
    "This request has reached its budget, so tools are no longer "             \
    "available. Do not call any tools. Write your final answer to the user "   \
    "now, using the information gathered so far, and say briefly if "          \
    "anything could not be completed."

#define MANY_RESULTS_PROMPT                                                    \
    "Many tool results came back in the last turn. Keep your summary of "      \
    "the context short: note only what matters for the task and do not "       \
    "repeat the results."

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
    /* A snapshot of opts.tools (tools/registry.h): where the offered
     * server tools come from, taken anew when its tools changed. */
    loom_tool_registry *reg;
    size_t ndefs;
    size_t nserver;
    loom__toolset set;       /* a view of defs and offered for the tool turn */
    loom_tool_call *pending; /* client calls the run ended on */
    size_t npending;
    char *finish_reason;
    char *title;             /* the conversation's title (title_run), or NULL */
    char *available;         /* offered names, "a, b" */
    loom_tool_choice choice; /* for the next model call */
    char *choice_fn;
    loom_buf text; /* text of the current turn */
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
    int switched; /* moved to the context_window_fallback */

    /* The tool calls of each turn: hooks, policies, records (toolturn.c). */
    loom__toolturn *turn;
    /* Calls waiting for approval (approval.c); answered from any thread. */
    loom__approvals *approvals;

    /* The loop tools and the plan (plan.c). */
    loom__plan *plan;
    int loop_on[LOOM__LOOP_COUNT];
    int has_system;    /* run->all.items[0] is loom's system message */
    char *system_prev; /* the system text the last request carried */
    /* A request's messages with the few-shot examples put in. */
    loom_message *sent;
    size_t capsent;
    int think_turns; /* non-iterative turns that cost no iteration */

    /* Citations (citations.c). */
    loom__citations *cites; /* NULL: citations off */
    json_t *citations;      /* the answer's, for loom_run_citations */

    /* The request's tokens as the context engine counted them with the
     * run's token counter (plus the reply's priming); 0: not counted. */
    size_t estimated_prompt;
    /* observe_tokens' unscaled count of the request's tools, and the
     * defs it counted (pointers into the run's toolset, compared as the
     * adapter's request cache compares them): the tools are the same on
     * most calls of a run and cost most of the count. */
    loom_tool_def *obs_defs;
    size_t obs_ndefs;
    size_t obs_tools_raw;
    int obs_cached;
    loom__token_memo obs_memo; /* the messages' counts, call to call */

    /* Images by URL fetched for providers that take only bytes
     * (media_fetch.c); made on the first model call. */
    loom__media_fetcher *media;

    /* The agent's hooks (opts.agent_hooks; NULL: none) and their state
     * for this run (init_state), which free_state gets back. */
    const loom_agent_hooks *hooks;
    void *hook_state;
    int hook_state_set;

    /* Handoffs (handoff.c): the current agent's handoff tools; the
     * handoffs made; the agent a call of this turn handed over to, with
     * its options, applied once the turn's results are in; the counted
     * calls made before the current agent took over; the agent of each
     * message of run->added, and the model that wrote it (NULL: none
     * answered yet), one of model_names. */
    loom__handoffs *handoffs;
    int nhandoffs;
    loom_run_options *next;
    char *next_call;   /* the call that asked for it */
    char *next_reason; /* its "reason", or NULL */
    int counted_base;
    const char **added_agents;
    const char **added_models;
    size_t capadded_agents;
    /* The models the run's calls were answered by, each once (copies;
     * few), and the last call's among them (NULL: no call yet). */
    char **model_names;
    size_t nmodel_names;
    const char *call_model;

    /* Tool rules (toolrules.h): results of tools with `history: summary`
     * that the next model call reads in full and later ones reduced (as
     * size_t indices into run->all), and the request texts they and the
     * special_tool hook replaced (char *), kept for the request cache
     * until the run is freed. */
    loom_buf reduce;
    loom_buf retired;
    /* Sub-agents (subagent.h): where the run sits in its tree (no tree:
     * a bare run), and what its children reported: their usage, model
     * calls with and without a cost, each agent's share (full usage) and
     * the calls that count toward this run's iterations. */
    loom__run_place place;
    loom__agent_tree *tree; /* a reference, or NULL */
    int count_sub_calls;
    size_t tool_calls; /* server tool calls of this run */
    int sub_counted;   /* children's calls counted as iterations */
    int sub_runs;      /* children's reports merged */
    loom_usage kids_usage;
    int kids_priced, kids_unpriced;
    json_t *kids_by_agent;
    int retries;       /* NO_CALLS_GENERATED answered "go on" */
    size_t last_calls; /* tool calls the last model call asked for */
    char *end_note;    /* on_no_tool_calls's text for the answer */
    /* The current call's text streams as this event (prepare_call; 0:
     * message.delta, -1: not at all). */
    int text_event;
    /* Fields the agent's code adds to run.completed (loom__run_complete_with)
     * and the citation markers the answer's check dropped. */
    json_t *completion_extra;
    size_t cites_dropped;
    char *hook_error; /* loom__run_hook_fail: the run fails with it */
    /* The model a get_model hook switched to (alt_name NULL: none yet),
     * and whether the current call uses it. */
    char *alt_name;
    loom_resolved_model alt;
    int use_alt;
    /* Tools that failed in the last turn; those abandoned after it. */
    loom__abandoned abandoned;
    /* The run's budget and the account gate (gate.h): the spend its
     * calls reserve against (NULL: none; made when the run executes),
     * its parent's (a reference, or NULL), what side calls go through,
     * and what ended the run on its budget (NONE: nothing). */
    loom__spend *spend;
    loom__spend *parent_spend;
    loom__gate gate;
    loom__refusal budget_why;
    /* Resuming (loom__run_restore): told after each step; where the
     * run's own messages start in run->all; a restored run sends no
     * run.started and first runs the calls of its last message when
     * they have no results yet. */
    loom__run_step_fn step_fn;
    void *step_payload;
    size_t base_len;
    int resumed;
    int resume_tools;
    /* What the run's spend had when the step it resumes from was kept:
     * carried into the spend it opens. */
    int64_t carry_micros, carry_tokens, carry_ms;
};

/* The model calls that count toward the current agent's limit: not
 * think-only turns within their allowance, nor the calls of the agents
 * that handed over to it; sub-agents' calls do unless the agent says not
 * to (count_sub_agent_calls). */
static int counted(const loom_run *run)
{
    return run->iterations - run->think_turns + run->sub_counted -
           run->counted_base;
}

/* Whether anybody listens: no event payload is built otherwise. */
static int has_sink(const loom_run *run)
{
    return run->opts.sink.emit != NULL;
}

/*
 * A sub-agent's event (its data carries parent_run_id: subagent.c made it
 * so) takes its place in this run's stream: its run_id (the sub-agent
 * run's) becomes the envelope's, and its index, already placed in this
 * run's timeline (the call's index plus the child's), moves the run's up
 * to it, never back. Both leave data. *rid gets the run id's reference,
 * for the caller to drop once the event is sent.
 */
static void place_nested(loom_run *run, loom_event *ev, json_t **rid)
{
    const json_t *ix = json_object_get(ev->data, "index");

    if (json_is_integer(ix) &&
        json_integer_value(ix) > (json_int_t)run->index &&
        json_integer_value(ix) <= (json_int_t)UINT32_MAX)
        run->index = (uint32_t)json_integer_value(ix);
    ev->index = run->index;
    *rid = json_incref(json_object_get(ev->data, "run_id"));
    if (json_is_string(*rid))
        ev->run_id = json_string_value(*rid);
    json_object_del(ev->data, "run_id");
    json_object_del(ev->data, "index");
}

/* Sends one event; a sink's non-zero answer cancels the run. Takes data
 * (NULL: an empty object). seq is the run's own, whoever's event it is. */
static void emit(loom_run *run, loom_event_type type, json_t *data)
{
    loom_event ev;
    json_t *rid = NULL;

    if (!run->opts.sink.emit) {
        json_decref(data);
        return;
    }
    ev.type = type;
    ev.seq = ++run->seq;
    ev.index = run->index;
    ev.run_id = run->id;
    ev.data = data ? data : json_object();
    if (loom_event_depth(&ev) > 0)
        place_nested(run, &ev, &rid);
    if (run->opts.sink.emit(&ev, run->opts.sink.payload) != 0)
        loom_cancel_set(&run->cancel);
    json_decref(ev.data);
    json_decref(rid);
}

/* emit() for the tool turn and the plan. */
static void emit_cb(loom_event_type type, json_t *data, void *payload)
{
    emit(payload, type, data);
}

/* What the tool turn and the plan send events through. */
static loom__emit run_emitter(loom_run *run)
{
    loom__emit e = {has_sink(run) ? emit_cb : NULL, run};

    return e;
}

/*
 * Token counts, then cache_write_tokens when there were any and
 * cost_micros when the cost is known (exact integer micro-dollars, never
 * a float): both are left out otherwise, so runs on providers that
 * report neither send what they always did.
 */
static json_t *usage_json_cost(const loom_usage *u, int cost_known)
{
    pk p = pk_new();

    pk_usage_tokens(&p, u);
    if (u->cache_write_tokens)
        pk_int(&p, "cache_write_tokens", (json_int_t)u->cache_write_tokens);
    if (cost_known)
        pk_int(&p, "cost_micros", (json_int_t)u->cost_micros);
    return pk_done(&p);
}

/* The agent a run's own usage is shown under in by_agent. */
static const char *own_agent(const loom_run *run)
{
    return run->opts.agent ? run->opts.agent : "default";
}

/* Each agent's share (full usage, subagent.h): the children's, and the
 * run's own (its usage less theirs, exactly). NULL when out of memory. */
static json_t *by_agent_full(const loom_run *run)
{
    json_t *by =
        run->kids_by_agent ? json_deep_copy(run->kids_by_agent) : json_object();
    loom_usage own = run->usage;

    own.prompt_tokens -= run->kids_usage.prompt_tokens;
    own.completion_tokens -= run->kids_usage.completion_tokens;
    own.cached_tokens -= run->kids_usage.cached_tokens;
    own.reasoning_tokens -= run->kids_usage.reasoning_tokens;
    own.total_tokens -= run->kids_usage.total_tokens;
    own.cache_write_tokens -= run->kids_usage.cache_write_tokens;
    own.cost_micros -= run->kids_usage.cost_micros;
    if (by && loom__by_agent_add(by, own_agent(run), &own,
                                 run->priced_calls - run->kids_priced,
                                 run->unpriced_calls - run->kids_unpriced)) {
        json_decref(by);
        by = NULL;
    }
    return by;
}

/* The run's usage so far, with its total cost when every call had one;
 * once sub-agents ran, with by_agent, each agent's share. */
static json_t *run_usage_json(const loom_run *run)
{
    json_t *u = usage_json_cost(&run->usage, loom_run_cost_known(run));

    if (u && run->sub_runs) {
        json_t *full = by_agent_full(run);
        json_t *by = full ? loom__by_agent_public(full) : NULL;
        json_decref(full);
        if (!by) {
            json_decref(u);
            return NULL;
        }
        json_object_set_new(u, "by_agent", by);
    }
    return u;
}

/* A model call's usage (the run's own, a review's, a summary's, a
 * repair's) joins the run's; its cost counts when known. */
static void add_usage(loom_run *run, const loom_usage *call, int cost_known)
{
    loom_usage u = *call;

    if (!u.total_tokens && !u.prompt_tokens && !u.completion_tokens)
        return;
    if (!cost_known)
        u.cost_micros = 0;
    loom_usage_add(&run->usage, &u);
    if (cost_known)
        run->priced_calls++;
    else
        run->unpriced_calls++;
}

/*
 * A call besides the loop's own (an argument repair, a review, a context
 * summary): its usage joins the run's and a `usage` event says what it
 * was for (purpose; tool: the tool repaired, or NULL), so the recorder
 * stores a row for every call the run's total counts.
 */
static void side_usage(loom_run *run, const loom_usage *call, int cost_known,
                       const char *purpose, const char *model, const char *tool)
{
    json_t *u;

    add_usage(run, call, cost_known);
    if (!has_sink(run) || (!call->total_tokens && !call->prompt_tokens &&
                           !call->completion_tokens))
        return;
    u = usage_json_cost(call, cost_known);
    json_object_set_new(u, "iteration", json_integer(run->iterations));
    json_object_set_new(u, "purpose", json_string(purpose));
    if (tool)
        json_object_set_new(u, "tool", json_string(tool));
    if (model)
        json_object_set_new(u, "model", json_string(model));
    json_object_set_new(u, "cumulative", run_usage_json(run));
    emit(run, LOOM_EV_USAGE, u);
}

/* {"delta": text}, the text checked as json_pack's "s%" checks it. */
static json_t *delta_json(const char *text, size_t len)
{
    pk p = pk_new();

    pk_set(&p, "delta", json_stringn(text, len));
    return pk_done(&p);
}

/* Whether name is a pattern (`prefix*`). */
static int is_pattern(const char *name)
{
    size_t n = strlen(name);

    return n > 1 && name[n - 1] == '*';
}

/* Whether the agent's tool names take name, as itself or by a pattern. */
static int find_tool_name(const loom_run_options *o, const char *name)
{
    for (size_t i = 0; i < o->tool_names_len; i++) {
        const char *t = o->tool_names[i];
        if (strcmp(t, name) == 0 ||
            (is_pattern(t) && strncmp(t, name, strlen(t) - 1) == 0))
            return 1;
    }
    return 0;
}

static int is_server_tool_name(const loom_run *run, const char *name)
{
    for (size_t i = 0; i < run->nserver; i++)
        if (strcmp(run->offered[i]->name, name) == 0)
            return 1;
    return 0;
}

/* Offers server tool t: the agent's registry may describe it anew. */
static void add_def(loom_run *run, const loom_tool *t)
{
    const loom_agent_tool_doc *d =
        loom__prompt_doc(run->opts.tool_docs, run->opts.tool_docs_len, t->name);

    run->defs[run->ndefs].name = t->name;
    run->defs[run->ndefs].description =
        d && d->description ? d->description : t->description;
    run->defs[run->ndefs].parameters = t->parameters;
    run->ndefs++;
}

/* Offers server (or loop, or handoff) tool t. */
static void offer(loom_run *run, const loom_tool *t)
{
    run->offered[run->nserver++] = t;
    add_def(run, t);
}

/* Offers the agent's handoff tools (after its server and loop tools). */
static int offer_handoffs(loom_run *run)
{
    for (size_t i = 0; i < loom__handoffs_count(run->handoffs); i++) {
        const loom_tool *t = loom__handoffs_tool(run->handoffs, i);
        if (is_server_tool_name(run, t->name))
            return loom__error_set(
                LOOM_EINVALID,
                "agent '%s': the tool '%s' takes the name "
                "of a handoff; rename it",
                run->opts.agent ? run->opts.agent : "default", t->name);
        offer(run, t);
    }
    return 0;
}

/*
 * Builds the tool definitions offered to the model: the agent's server
 * tools, the loop tools it has (todo_write, think), its handoffs, then
 * the caller's client tools. A loop tool is on by its flag, or when the
 * agent lists its name and no registered tool has it.
 */
static int build_tools(loom_run *run)
{
    const loom_run_options *o = &run->opts;
    loom_buf names = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    size_t n;
    int rc = 0;

    loom_tool_registry_free(run->reg);
    if ((rc = loom__tool_registry_snapshot(&run->reg, o->tools, o->tool_names,
                                           o->tool_names_len)) != 0)
        return rc;
    n = run->reg ? loom_tool_registry_count(run->reg) : 0;
    run->loop_on[LOOM__LOOP_TODO] = o->planning != 0;
    run->loop_on[LOOM__LOOP_THINK] = o->think != 0;
    /* Every name the agent lists must exist: a typo is a config error.
     * A name (or pattern) of an MCP server started in the background
     * stands even while the server offers no such tool. */
    for (size_t i = 0; o->tool_names && i < o->tool_names_len; i++) {
        int k;
        if ((run->reg && loom_tool_registry_get(run->reg, o->tool_names[i])) ||
            loom_tool_registry_claims(o->tools, o->tool_names[i]))
            continue;
        if ((k = loom__plan_tool_index(run->plan, o->tool_names[i])) >= 0) {
            run->loop_on[k] = 1;
            continue;
        }
        return loom__error_set(LOOM_EINVALID,
                               "agent '%s': unknown tool '%s'",
                               o->agent ? o->agent : "default",
                               o->tool_names[i]);
    }
    if (o->resolve_agent &&
        (rc = loom__handoffs_new(&run->handoffs, o->handoffs,
                                 o->handoffs_len)) != 0)
        return rc;
    n += loom__handoffs_count(run->handoffs);
    run->defs = calloc(n + LOOM__LOOP_COUNT + o->client_tools_len + 1,
                       sizeof(*run->defs));
    run->offered = calloc(n + LOOM__LOOP_COUNT + 1, sizeof(*run->offered));
    if (!run->defs || !run->offered)
        return loom__error_oom();
    n -= loom__handoffs_count(run->handoffs);
    for (size_t i = 0; i < n; i++) {
        const loom_tool *t = loom_tool_registry_at(run->reg, i);
        if (o->tool_names && !find_tool_name(o, t->name))
            continue;
        offer(run, t);
    }
    for (int k = 0; k < LOOM__LOOP_COUNT; k++) {
        const loom_tool *t = loom__plan_tool(run->plan, k);
        if (!run->loop_on[k])
            continue;
        if (is_server_tool_name(run, t->name))
            return loom__error_set(LOOM_EINVALID,
                                   "agent '%s': the registered tool '%s' "
                                   "takes the name of loom's own %s tool; "
                                   "rename it or turn %s off",
                                   o->agent ? o->agent : "default", t->name,
                                   t->name, k == LOOM__LOOP_TODO
                                                ? "planning" : "think");
        offer(run, t);
    }
    if ((rc = offer_handoffs(run)) != 0)
        return rc;
    for (size_t i = 0; i < o->client_tools_len; i++) {
        const char *name = o->client_tools[i].name;
        if (!name || !*name)
            return loom__error_set(LOOM_EINVALID, "a client tool has no name");
        if (is_server_tool_name(run, name))
            return loom__error_set(LOOM_EINVALID,
                                   "tool '%s' is both a server tool and a "
                                   "client tool", name);
        for (size_t j = run->nserver; j < run->ndefs; j++)
            if (strcmp(run->defs[j].name, name) == 0)
                return loom__error_set(LOOM_EINVALID,
                                       "client tool '%s' is given twice",
                                       name);
        run->defs[run->ndefs++] = o->client_tools[i];
    }
    for (size_t i = 0; i < run->ndefs && !rc; i++)
        rc = loom_buf_printf(&names, "%s%s", i ? ", " : "", run->defs[i].name);
    run->available = loom_buf_detach(&names);
    if (!rc && !run->available)
        rc = loom__error_oom();
    run->set.offered = run->offered;
    run->set.nserver = run->nserver;
    run->set.defs = run->defs;
    run->set.ndefs = run->ndefs;
    run->set.available = run->available;
    return rc;
}

static void agent_state(const loom_run *run, loom_agent_state *st);

/* A running call's progress step, for the agent's on_tool_progress. */
static void on_tool_progress(const json_t *progress, void *payload)
{
    loom_run *run = payload;
    loom_agent_state st;

    if (!run->hooks || !run->hooks->on_tool_progress)
        return;
    agent_state(run, &st);
    run->hooks->on_tool_progress(&st, progress, run->hooks->payload);
}

/* ---- handoffs ------------------------------------------------------------ */

/* The tool turn's `own` tools: the current agent's handoffs. */
static int is_handoff(const loom_tool *tool, void *payload)
{
    const loom_run *run = payload;

    return loom__handoffs_target(run->handoffs, tool) != NULL;
}

/*
 * A transfer_to_<agent> call, on the loop's thread: the agent's options
 * are resolved now, so what fails (no such agent, a model that does not
 * resolve, the run's handoff limit, a second handoff in the turn) is the
 * call's error; the switch waits for the turn's results (switch_agent).
 */
static void handoff_call(loom__tool_job *job, void *payload)
{
    loom_run *run = payload;
    const char *to = loom__handoffs_target(run->handoffs, job->tool);
    const char *reason =
        json_string_value(json_object_get(job->args, "reason"));
    loom_run_options *next = NULL;
    char *msg = NULL;
    int rc = 0;

    if (run->next)
        rc = asprintf(&msg,
                      "this turn already handed the conversation to '%s'; "
                      "one handoff per turn",
                      run->next->agent ? run->next->agent : "");
    else if (run->nhandoffs >= LOOM_RUN_MAX_HANDOFFS)
        rc = asprintf(&msg,
                      "this request was handed over %d times already, the "
                      "most one request may be; answer the user yourself",
                      run->nhandoffs);
    else if (!(next = malloc(sizeof(*next))))
        rc = asprintf(&msg, "out of memory");
    else {
        *next = run->opts;
        if (run->opts.resolve_agent(to, next, run->opts.resolve_payload))
            rc = asprintf(&msg, "cannot hand over to '%s': %s", to,
                          loom_error_last());
    }
    if (msg || rc < 0) {
        loom__tool_job_fail(job, "execution", LOOM_EINVALID,
                            msg ? msg : "the handoff failed", NULL,
                            run->opts.max_tool_error);
        free(msg);
        free(next);
        return;
    }
    free(run->next_call);
    free(run->next_reason);
    run->next = next;
    run->next_call = strdup(job->call->id ? job->call->id : "");
    run->next_reason = reason ? strdup(reason) : NULL;
    if (asprintf(&job->output, "Transferred to %s.", to) < 0)
        job->output = NULL;
    job->output_size = job->output ? strlen(job->output) : 0;
    job->done = 1;
}

/* Whether a call needs approval, by the agent's approval_required. */
static loom_approval approval_required(const loom_tool_call *call,
                                       const json_t *args, void *payload)
{
    loom_run *run = payload;
    loom_agent_state st;

    /* Hooks may come and go with handoffs. */
    if (!run->hooks || !run->hooks->approval_required)
        return LOOM_APPROVAL_DEFAULT;
    agent_state(run, &st);
    return run->hooks->approval_required(&st, call, args, run->hooks->payload);
}

/* The agent's preprocess_tool_arguments, for the tool turn. */
static loom_args_action preprocess_args(const loom_tool_call *call,
                                        json_t **args, loom_buf *error,
                                        void *payload)
{
    loom_run *run = payload;
    loom_agent_state st;

    if (!run->hooks || !run->hooks->preprocess_tool_arguments)
        return LOOM_ARGS_DEFAULT;
    agent_state(run, &st);
    return run->hooks->preprocess_tool_arguments(&st, call, args, error,
                                                 run->hooks->payload);
}

/*
 * A tool's repair_arguments, for the tool turn: model (a name of the
 * run's side models, else an upstream id of its own provider) makes
 * arguments of raw. The call's usage joins the run's and a `usage` event
 * (purpose repair_arguments) reports it; a repair that fails leaves
 * *args NULL, and the call fails as its text does not parse.
 */
static void repair_args(const loom_tool *tool, const char *model,
                        const char *raw, json_t **args, void *payload)
{
    loom_run *run = payload;
    loom_provider *p = run->opts.provider;
    const char *up = model;
    loom__repair_outcome out;
    int rc;

    for (size_t i = 0; i < run->opts.models_len; i++)
        if (strcmp(run->opts.models[i].name, model) == 0) {
            p = run->opts.models[i].provider;
            up = run->opts.models[i].upstream_model;
        }
    rc = loom__args_repair(&out, p, up, tool->name, tool->parameters, raw,
                           &run->gate, &run->cancel);
    side_usage(run, &out.usage, out.cost_known, "repair_arguments",
               out.model ? out.model : model, tool->name);
    if (out.args) {
        *args = out.args;
        out.args = NULL;
    } else {
        loom_info("repair_arguments of '%s' with %s: %s", tool->name, model,
                  rc        ? loom_error_last()
                  : out.why ? out.why
                            : "failed");
    }
    loom__repair_outcome_clear(&out);
}

/*
 * A side call a tool call made (loom_tool_sample: an MCP server's
 * sampling request) joins the run's usage, reported as side calls are.
 */
static void tool_side_usage(const json_t *data, const char *tool, void *payload)
{
    const char *purpose = json_string_value(json_object_get(data, "purpose"));
    loom_usage u;
    int priced, unpriced;

    loom__usage_from_full(json_object_get(data, "usage"), &u, &priced,
                          &unpriced);
    side_usage(payload, &u, priced > 0 && !unpriced, purpose ? purpose : "tool",
               json_string_value(json_object_get(data, "model")), tool);
}

/* The tool turn of the run, over the tools build_tools offers. */
static int turn_open(loom_run *run)
{
    const loom_run_options *o = &run->opts;
    loom__toolturn_options to;

    memset(&to, 0, sizeof(to));
    to.run = run;
    to.tools = &run->set;
    to.plan = run->plan;
    to.hooks = o->hooks;
    to.hooks_len = o->hooks_len;
    to.registry = run->reg;
    to.settings = o->tool_settings;
    to.cancel = &run->cancel;
    to.max_result = o->max_tool_result;
    to.max_error = o->max_tool_error;
    to.timeout_ms = o->tool_timeout_ms;
    to.concurrency = o->tool_concurrency;
    to.user_id = o->user_id;
    to.user_keys = o->user_keys;
    to.vision = o->vision;
    to.emit = run_emitter(run);
    /* Always: a handoff may bring hooks that want them. */
    to.on_progress = on_tool_progress;
    to.approval_required = approval_required;
    to.agent_payload = run;
    to.own = is_handoff;
    to.answer = handoff_call;
    to.own_payload = run;
    to.approvals = run->approvals;
    to.approval_timeout_ms = o->approval_timeout_ms;
    /* Always too: the hook is looked up when a call comes. */
    to.preprocess = preprocess_args;
    to.repair = repair_args;
    to.rules_payload = run;
    to.place = &run->place;
    to.on_usage = tool_side_usage;
    to.usage_payload = run;
    return loom__toolturn_new(&run->turn, &to);
}

static int context_open(loom_run *run);
static int reduce_history(loom_run *run);

/* Marks the messages appended to run->all since the last call. */
static int track(loom_run *run, int stored)
{
    if (run->all.len > run->capstored) {
        size_t cap = run->capstored ? run->capstored : 32;
        unsigned char *p;
        while (cap < run->all.len)
            cap *= 2;
        if (!(p = realloc(run->stored, cap)))
            return loom__error_oom();
        run->stored = p;
        run->capstored = cap;
    }
    while (run->nstored < run->all.len)
        run->stored[run->nstored++] = (unsigned char)stored;
    return 0;
}

/*
 * Copies history into run->all, answering any tool call that has no
 * result (a turn cancelled mid-tools, stored as it was): providers refuse
 * an assistant tool call that is not followed by its result.
 */
static int add_history(loom_run *run, const loom_messages *history)
{
    const loom_message *h = history->items;
    size_t n = history->len;

    for (size_t i = 0; i < n; i++) {
        int rc = loom_messages_append(
            &run->all, &(loom_messages){(loom_message *)&h[i], 1, 1});
        size_t end = i + 1;
        if (rc || (rc = track(run, 1)) != 0)
            return rc;
        if (h[i].role != LOOM_ROLE_ASSISTANT || !h[i].tool_calls_len)
            continue;
        while (end < n && h[end].role == LOOM_ROLE_TOOL)
            end++;
        /* The results that are there come first, as they were. */
        for (size_t j = i + 1; j < end; j++)
            if ((rc = loom_messages_append(
                     &run->all,
                     &(loom_messages){(loom_message *)&h[j], 1, 1})) != 0 ||
                (rc = track(run, 1)) != 0)
                return rc;
        for (size_t c = 0; c < h[i].tool_calls_len; c++) {
            const loom_tool_call *call = &h[i].tool_calls[c];
            int found = 0;
            for (size_t j = i + 1; j < end && !found; j++)
                found = h[j].tool_call_id && call->id &&
                        strcmp(h[j].tool_call_id, call->id) == 0;
            if (!found &&
                ((rc = loom_messages_add_tool_result(
                      &run->all, call->id ? call->id : "", call->name,
                      "Error: this tool call was interrupted before it "
                      "returned a result.")) != 0 ||
                 (rc = track(run, 0)) != 0))
                return rc;
        }
        i = end - 1;
    }
    return 0;
}

/* The system message's text for the agent the run is now (prompt.c). */
static int system_text(const loom_run *run, char **text)
{
    loom__prompt_parts p = {
        .base = run->opts.system_prompt,
        .tools = run->defs,
        .ntools = run->nserver,
        .tool_settings = run->opts.tool_settings,
        .docs = run->opts.tool_docs,
        .ndocs = run->opts.tool_docs_len,
        .user_instructions = run->opts.user_instructions,
        .memories = run->opts.memories,
        .plan = run->loop_on[LOOM__LOOP_TODO] ? run->plan : NULL,
    };

    return loom__prompt_system_text(text, &p);
}

/*
 * Makes the system message's text from its parts (prompt.c: the agent's
 * prompt, tool rules, memories, the plan) and puts it in when it changed:
 * the first one when the run has no message yet, later ones in place of
 * the one before (a run's first message cannot become a system one).
 * An unchanged text keeps its pointer, and the request cache knows
 * messages by their pointers: the text the last request carried stays
 * allocated until the next change, so the new one can never take its
 * address.
 */
static int refresh_system(loom_run *run)
{
    char *text = NULL;
    int rc;

    if ((rc = system_text(run, &text)) != 0)
        return rc;
    if (run->has_system) {
        if (strcmp(text, run->all.items[0].content) == 0) {
            free(text);
            return 0;
        }
        free(run->system_prev);
        run->system_prev = run->all.items[0].content;
        run->all.items[0].content = text;
        return 0;
    }
    if (*text && run->all.len == 0) {
        if ((rc = loom_messages_add(&run->all, LOOM_ROLE_SYSTEM, text)) == 0 &&
            (rc = track(run, 0)) == 0)
            run->has_system = 1;
    }
    free(text);
    return rc;
}

/* Zero fields of o get their defaults. */
static void options_defaults(loom_run_options *o)
{
    if (o->max_iterations <= 0)
        o->max_iterations = DEFAULT_MAX_ITERATIONS;
    if (o->tool_concurrency <= 0)
        o->tool_concurrency = DEFAULT_CONCURRENCY;
    if (o->max_tool_result == 0)
        o->max_tool_result = DEFAULT_MAX_RESULT;
    if (o->max_tool_error == 0)
        o->max_tool_error = DEFAULT_MAX_ERROR;
    if (o->max_think_turns == 0)
        o->max_think_turns = LOOM_RUN_DEFAULT_THINK_TURNS;
    if (o->tool_timeout_ms == 0)
        o->tool_timeout_ms = LOOM_RUN_DEFAULT_TOOL_TIMEOUT_MS;
    if (o->approval_timeout_ms == 0)
        o->approval_timeout_ms = LOOM_RUN_DEFAULT_APPROVAL_TIMEOUT_MS;
}

int loom__run_create(loom_run **out, const loom_run_options *opts)
{
    loom_run *run;
    int rc;

    *out = NULL;
    if (!opts ||
        (opts->version != LOOM_RUN_OPTIONS_VERSION && opts->version != 0))
        return loom__error_set(LOOM_EINVALID, "run options: bad version");
    if (!opts->provider || !opts->upstream_model)
        return loom__error_set(LOOM_EINVALID,
                               "run options: a provider and a model are "
                               "required");
    if (!opts->provider->vt ||
        (opts->provider->vt->version != 0 &&
         opts->provider->vt->version != LOOM_PROVIDER_VTABLE_VERSION))
        return loom__error_set(LOOM_EINVALID,
                               "run options: the provider's vtable has an "
                               "unknown version");
    if (opts->agent_hooks && opts->agent_hooks->version != 0 &&
        opts->agent_hooks->version != LOOM_AGENT_HOOKS_VERSION)
        return loom__error_set(LOOM_EINVALID,
                               "run options: the agent hooks have an unknown "
                               "version");
    if (opts->run_id && (!*opts->run_id || strlen(opts->run_id) > LOOM_ID_MAX))
        return loom__error_set(LOOM_EINVALID,
                               "run options: a run_id has 1 to %d bytes",
                               LOOM_ID_MAX);
    run = calloc(1, sizeof(*run));
    if (!run)
        return loom__error_oom();
    run->opts = *opts;
    run->hooks = opts->agent_hooks;
    options_defaults(&run->opts);
    run->opts.plan = NULL; /* borrowed: a copy is kept (loom__plan_set) */
    run->opts.run_id = NULL;
    run->opts.conversation_id = NULL;
    if (opts->run_id)
        run->id = strdup(opts->run_id);
    else if ((run->id = malloc(LOOM_ID_SIZE)) != NULL &&
             (rc = loom_id_new(run->id, "run_")) != 0)
        goto fail;
    if (!run->id || (opts->conversation_id &&
                     !(run->conversation_id = strdup(opts->conversation_id)))) {
        rc = loom__error_oom();
        goto fail;
    }
    loom_buf_init(&run->text, LOOM_BUF_UNLIMITED);
    loom_buf_init(&run->reduce, RULES_BUF_MAX);
    loom_buf_init(&run->retired, RULES_BUF_MAX);
    run->choice = opts->tool_choice;
    if (opts->tool_choice.function &&
        !(run->choice_fn = strdup(opts->tool_choice.function))) {
        rc = loom__error_oom();
        goto fail;
    }
    run->choice.function = run->choice_fn;
    if ((rc = loom__plan_new(&run->plan)) != 0 ||
        (rc = loom__approvals_new(&run->approvals)) != 0 ||
        (rc = build_tools(run)) != 0 || (rc = turn_open(run)) != 0)
        goto fail;
    if (opts->plan && (rc = loom__plan_set(run->plan, opts->plan)) != 0)
        goto fail;
    if (run->choice.kind == LOOM_TOOL_CHOICE_FUNCTION &&
        !loom__toolset_server(&run->set, run->choice.function) &&
        !loom__toolset_is_client(&run->set, run->choice.function)) {
        rc = loom__error_set(LOOM_EINVALID,
                             "tool_choice names '%s', which is not offered "
                             "(available: %s)",
                             run->choice.function ? run->choice.function : "",
                             run->available);
        goto fail;
    }
    if ((rc = refresh_system(run)) != 0)
        goto fail;
    *out = run;
    return 0;
fail:
    loom_run_free(run);
    return rc;
}

int loom__run_begin(loom_run *run, const loom_messages *history,
                    const loom__run_carried *carried)
{
    int rc;

    if (!history || history->len == 0)
        return loom__error_set(LOOM_EINVALID, "run: the conversation is empty");
    if (carried && carried->plan && !loom__plan_get(run->plan) &&
        (rc = loom__plan_set(run->plan, carried->plan)) != 0)
        return rc;
    if (carried && carried->summary && !run->opts.context.summary) {
        run->opts.context.summary = carried->summary;
        run->opts.context.summary_covers = carried->summary_covers;
    }
    if (carried && carried->memories && !run->opts.memories) {
        run->opts.memories = carried->memories;
        if ((rc = refresh_system(run)) != 0)
            return rc;
    }
    if ((rc = add_history(run, history)) != 0 ||
        (rc = reduce_history(run)) != 0)
        return rc;
    if (run->opts.citations &&
        ((rc = loom__citations_new(&run->cites, 0)) != 0 ||
         (rc = loom__citations_seed(run->cites, history->items,
                                    history->len)) != 0))
        return rc;
    if (run->opts.context.window > 0 && (rc = context_open(run)) != 0)
        return rc;
    run->base_len = run->all.len;
    return 0;
}

int loom_run_new(loom_run **out, const loom_run_options *opts,
                 const loom_messages *history)
{
    loom_run *run;
    int rc;

    *out = NULL;
    if (!history || history->len == 0)
        return loom__error_set(LOOM_EINVALID, "run: the conversation is empty");
    if ((rc = loom__run_create(&run, opts)) != 0)
        return rc;
    if ((rc = loom__run_begin(run, history, NULL)) != 0) {
        loom_run_free(run);
        return rc;
    }
    *out = run;
    return 0;
}

/* Grows run->added_agents and run->added_models to hold one more. */
static int grow_added(loom_run *run)
{
    size_t cap = run->capadded_agents ? run->capadded_agents * 2 : 16;
    const char **p;

    if (run->added.len < run->capadded_agents)
        return 0;
    if (!(p = realloc(run->added_agents, cap * sizeof(*p))))
        return loom__error_oom();
    run->added_agents = p;
    if (!(p = realloc(run->added_models, cap * sizeof(*p))))
        return loom__error_oom();
    run->added_models = p;
    run->capadded_agents = cap;
    return 0;
}

/* Adds a message to both the request history and this run's messages,
 * noting the agent that is running and the model of the last call. */
static int add_message(loom_run *run, const loom_messages *one)
{
    int rc = loom_messages_append(&run->all, one);

    if (!rc)
        rc = track(run, 1);
    if (!rc)
        rc = grow_added(run);
    if (rc)
        return rc;
    run->added_agents[run->added.len] = run->opts.agent;
    run->added_models[run->added.len] = run->call_model;
    return loom_messages_append(&run->added, one);
}

/* Makes name the last call's model (run->call_model), kept in
 * run->model_names. */
static int note_call_model(loom_run *run, const char *name)
{
    char **p;

    for (size_t i = 0; i < run->nmodel_names; i++)
        if (strcmp(run->model_names[i], name) == 0) {
            run->call_model = run->model_names[i];
            return 0;
        }
    if (!(p = realloc(run->model_names, (run->nmodel_names + 1) * sizeof(*p))))
        return loom__error_oom();
    run->model_names = p;
    if (!(p[run->nmodel_names] = strdup(name)))
        return loom__error_oom();
    run->call_model = p[run->nmodel_names++];
    return 0;
}

/* Most calls one answer may carry whose text offset is kept; adapters
 * refuse far fewer (128 for OpenAI). */
#define MAX_CALL_OFFSETS 4096

/* Notes where in the turn's text call `index` first appeared. */
static int note_call_offset(loom_run *run, int index)
{
    size_t i = (size_t)index;

    if (index < 0 || i >= MAX_CALL_OFFSETS)
        return 0;
    if (i >= run->capcall_offsets) {
        size_t cap = run->capcall_offsets ? run->capcall_offsets : 8;
        size_t *p;
        while (cap <= i)
            cap *= 2;
        p = realloc(run->call_offsets, cap * sizeof(*p));
        if (!p)
            return loom__error_oom();
        run->call_offsets = p;
        run->capcall_offsets = cap;
    }
    while (run->ncall_offsets <= i)
        run->call_offsets[run->ncall_offsets++] = SIZE_MAX;
    if (run->call_offsets[i] == SIZE_MAX)
        run->call_offsets[i] = run->text.len;
    return 0;
}

static int on_llm_event(const loom_llm_event *ev, void *payload)
{
    loom_run *run = payload;

    switch (ev->type) {
    case LOOM_LLM_TEXT:
        if (loom_buf_put(&run->text, ev->text, ev->text_len) != 0)
            return LOOM_ENOMEM;
        if (has_sink(run) && run->text_event >= 0)
            emit(run,
                 run->text_event ? (loom_event_type)run->text_event
                                 : LOOM_EV_MESSAGE_DELTA,
                 delta_json(ev->text, ev->text_len));
        break;
    case LOOM_LLM_REASONING:
        if (has_sink(run))
            emit(run, LOOM_EV_REASONING_DELTA,
                 delta_json(ev->text, ev->text_len));
        break;
    case LOOM_LLM_TOOL_CALL_DELTA:
        if (note_call_offset(run, ev->tool_index) != 0)
            return LOOM_ENOMEM;
        break;
    default:
        break;
    }
    return loom_cancel_is_set(&run->cancel);
}

/* Every call needs an id to be answered; models rarely omit it. */
static int ensure_call_ids(loom_tool_call *calls, size_t n, int iteration)
{
    for (size_t i = 0; i < n; i++) {
        if (calls[i].id && *calls[i].id)
            continue;
        free(calls[i].id);
        if (asprintf(&calls[i].id, "call_loom_%d_%zu", iteration, i) < 0) {
            calls[i].id = NULL;
            return loom__error_oom();
        }
    }
    return 0;
}

/* The first event of every run. */
static void emit_started(loom_run *run)
{
    const loom_run_options *o = &run->opts;
    pk p;

    run->status = LOOM_RUN_RUNNING;
    if (!has_sink(run))
        return;
    p = pk_new();
    pk_str_or_null(&p, "agent", o->agent);
    pk_str_or_null(&p, "model", o->model ? o->model : o->upstream_model);
    pk_int(&p, "max_iterations", o->max_iterations);
    pk_int(&p, "tools", (int)run->ndefs);
    if (run->conversation_id)
        pk_str(&p, "conversation_id", run->conversation_id);
    emit(run, LOOM_EV_RUN_STARTED, pk_done(&p));
}

/* Ends the run failed (or cancelled) with run.failed; code NULL: the
 * name of rc. */
static void finish_failed_code(loom_run *run, int rc, const char *code,
                               const loom_llm_response *resp)
{
    json_t *err;
    int cancelled = rc == LOOM_ECANCELED || loom_cancel_is_set(&run->cancel);

    run->status = cancelled ? LOOM_RUN_CANCELLED : LOOM_RUN_FAILED;
    free(run->error);
    run->error = strdup(cancelled ? "run cancelled" : loom_error_last());
    err = json_pack("{s:s,s:s}", "code",
                    cancelled ? "cancelled"
                    : code    ? code
                              : loom_error_name(rc),
                    "message", run->error ? run->error : "");
    if (!cancelled && resp && resp->error.kind != LOOM_UPSTREAM_NONE) {
        json_object_set_new(
            err, "kind",
            json_string(loom_upstream_kind_name(resp->error.kind)));
        if (resp->error.http_status)
            json_object_set_new(err, "http_status",
                                json_integer(resp->error.http_status));
        if (resp->error.request_id)
            json_object_set_new(err, "request_id",
                                json_string(resp->error.request_id));
        json_object_set_new(err, "attempts",
                            json_integer(resp->error.attempts));
        /* A copy: the event outlives the response. */
        if (resp->error.headers)
            json_object_set_new(err, "headers",
                                json_deep_copy(resp->error.headers));
    }
    emit(run, LOOM_EV_RUN_FAILED,
         json_pack("{s:s,s:o,s:s,s:i,s:o,s:s*}", "status",
                   loom_run_status_name(run->status), "error", err, "text",
                   run->final_text ? run->final_text : "", "iterations",
                   run->iterations, "usage", run_usage_json(run), "model",
                   run->answered_model));
}

/* A run whose model call failed; when an image fetch for the provider
 * made it fail, the code says which way (media_fetch.h). */
LOOM_NOINLINE static void finish_failed(loom_run *run, int rc,
                                        const loom_llm_response *resp)
{
    finish_failed_code(run, rc, loom__media_fetch_failure(run->media), resp);
}

void loom__run_fail(loom_run *run, int rc, const char *code)
{
    emit_started(run);
    finish_failed_code(run, rc, code, NULL);
}

/* Keeps what the model had said when a turn breaks off. */
LOOM_NOINLINE static void keep_partial(loom_run *run)
{
    free(run->final_text);
    run->final_text = strdup(loom_buf_cstr(&run->text));
    if (run->text.len) {
        loom_message m = {0};
        m.role = LOOM_ROLE_ASSISTANT;
        m.content = run->text.ptr;
        (void)add_message(run, &(loom_messages){&m, 1, 1});
    }
}

/* ---- the context engine -------------------------------------------------- */

/* Leading system messages of run->all: the engine counts after them. */
static size_t leading_system(const loom_run *run)
{
    size_t k = 0;

    while (k < run->all.len && run->all.items[k].role == LOOM_ROLE_SYSTEM)
        k++;
    return k;
}

/* The engine's coverage (messages after the leading system ones) of the
 * first `conv` conversation messages. */
static size_t covers_from_conv(const loom_run *run, size_t conv)
{
    size_t i = 0, seen = 0, lead = leading_system(run);

    if (conv == 0)
        return 0;
    for (; i < run->nstored && seen < conv; i++)
        seen += run->stored[i];
    return i > lead ? i - lead : 0;
}

/* The conversation messages that the engine's coverage spans. */
static size_t conv_from_covers(const loom_run *run, size_t covers)
{
    size_t end = leading_system(run) + covers, n = 0;

    for (size_t i = 0; i < end && i < run->nstored; i++)
        n += run->stored[i];
    return n;
}

/*
 * Makes the run's engine for its current model. A summary the engine
 * already holds (a switch to the fallback) is carried over; otherwise the
 * stored one from the options is used.
 */
static int context_open(loom_run *run)
{
    const loom_run_context_options *c = &run->opts.context;
    loom_context_options co = LOOM_CONTEXT_OPTIONS_INIT;
    loom_context *ctx = NULL;
    char *carried = NULL;
    size_t covers = 0;
    int rc;

    co.context_window = run->switched ? c->fallback_window : c->window;
    /* With a larger model to move to, the user's message is not cut. */
    co.no_user_cut = !run->switched && c->fallback_provider &&
                     c->fallback_window > c->window;
    co.max_output_tokens = run->opts.max_output_tokens;
    co.margin = c->margin;
    co.counter = c->counter;
    co.keep_full_tool_results = c->keep_full_tool_results;
    co.tool_result_share = c->tool_result_share;
    if (!c->no_summary) {
        co.summary_provider =
            c->summary_provider ? c->summary_provider : run->opts.provider;
        co.summary_model = c->summary_model ? c->summary_model
                                            : run->opts.upstream_model;
    }
    co.summary_prompt = c->summary_prompt;
    co.summary_max_tokens = c->summary_max_tokens;
    if (run->ctx && loom_context_summary(run->ctx, &covers)) {
        if (!(carried = strdup(loom_context_summary(run->ctx, NULL))))
            return loom__error_oom();
        co.summary = carried;
        co.summary_covers = covers;
    } else if (c->summary && *c->summary) {
        co.summary = c->summary;
        co.summary_covers = covers_from_conv(run, c->summary_covers);
    }
    rc = loom_context_new(&ctx, &co);
    free(carried);
    if (rc)
        return rc;
    loom_context_free(run->ctx);
    run->ctx = ctx;
    loom__context_set_gate(ctx, &run->gate);
    return 0;
}

/*
 * Moves the run to its context_window_fallback, when it has one with a
 * larger window and has not moved yet. Returns 1 when it moved, 0 when
 * it cannot, or an error.
 */
static int context_switch(loom_run *run)
{
    const loom_run_context_options *c = &run->opts.context;
    loom_run_options *o = &run->opts;
    int rc;

    if (run->switched || !c->fallback_provider ||
        !c->fallback_upstream_model || c->fallback_window <= c->window)
        return 0;
    o->provider = c->fallback_provider;
    o->upstream_model = c->fallback_upstream_model;
    o->model = c->fallback_model ? c->fallback_model
                                 : c->fallback_upstream_model;
    if (c->fallback_max_output_tokens > 0 &&
        (o->max_output_tokens <= 0 ||
         o->max_output_tokens > c->fallback_max_output_tokens))
        o->max_output_tokens = c->fallback_max_output_tokens;
    run->switched = 1;
    if ((rc = context_open(run)) != 0)
        return rc;
    return 1;
}

/* The engine counts with the run's token counter (model_opts.c). */
static int c_is_token_counter(const loom_run_context_options *c)
{
    return c->token_counter && c->counter.message &&
           c->counter.payload == (void *)c->token_counter;
}

/* What loom_token_counter_request() gives for req, the tools counted
 * once for as long as the request's tool defs stay the same, and each
 * message once for as long as it stays the same at its place. */
static size_t estimate_request(loom_run *run, const loom_token_counter *tc,
                               const loom_llm_request *req)
{
    size_t n = req->tools ? req->tools_len : 0;

    if (!run->obs_cached || run->obs_ndefs != n ||
        (n && memcmp(run->obs_defs, req->tools, n * sizeof(*req->tools)))) {
        loom_tool_def *d =
            n ? realloc(run->obs_defs, n * sizeof(*d)) : run->obs_defs;
        if (!d && n) /* no cache: count it all this time */
            return loom_token_counter_request(tc, req->messages,
                                              req->messages_len, req->tools, n);
        if (n)
            memcpy(d, req->tools, n * sizeof(*d));
        run->obs_defs = d;
        run->obs_ndefs = n;
        run->obs_tools_raw = loom__token_counter_tools_raw(tc, req->tools, n);
        run->obs_cached = 1;
    }
    return loom__token_counter_request_memo(tc, &run->obs_memo, req->messages,
                                            req->messages_len,
                                            run->obs_tools_raw, n);
}

/*
 * Feeds the provider's reported prompt tokens back to an estimating
 * token counter, so the model's correction factor follows what the
 * provider counts. Not after a switch to the fallback model, whose
 * tokenizer the counter is not for.
 */
LOOM_NOINLINE static void observe_tokens(loom_run *run,
                                         const loom_llm_request *req,
                                         const loom_llm_response *resp)
{
    loom_token_counter *tc = run->opts.context.token_counter;
    size_t est = run->estimated_prompt;

    if (!tc || run->switched || resp->usage.prompt_tokens <= 0 ||
        loom_token_counter_is_exact(tc))
        return;
    if (!est)
        est = estimate_request(run, tc, req);
    if (est && est != (size_t)-1)
        loom_token_counter_observe(tc, est,
                                   (size_t)resp->usage.prompt_tokens);
}

/*
 * Fits the request to the window: req gets the engine's messages, the
 * summary call's usage joins the run's, a new summary is kept for
 * loom_run_summary, and a `context` event says what was done.
 */
static int context_fit(loom_run *run, loom_llm_request *req)
{
    loom_context_result r;
    const char *from = loom_run_model(run);
    char *why = NULL;
    json_t *data;
    int rc;

    rc = loom_context_fit(run->ctx, &r, run->all.items, run->all.len,
                          req->tools, req->tools_len, &run->cancel);
    if (rc == LOOM_ETOOLARGE) {
        int moved;
        if (!(why = strdup(loom_error_last())))
            return loom__error_oom();
        if ((moved = context_switch(run)) < 0) {
            free(why);
            return moved;
        }
        if (moved) {
            loom_info("context: %s; switching from %s to %s", why, from,
                      loom_run_model(run));
            rc = loom_context_fit(run->ctx, &r, run->all.items,
                                  run->all.len, req->tools, req->tools_len,
                                  &run->cancel);
        } else {
            loom__error_set(rc, "%s", why);
        }
    }
    if (rc) {
        free(why);
        return rc;
    }
    side_usage(run, &r.summary_usage, r.summary_cost_known, "context_summary",
               NULL, NULL);
    if (r.summary_created) {
        free(run->summary);
        if (!(run->summary = strdup(r.summary))) {
            free(why);
            return loom__error_oom();
        }
        run->summary_covers = conv_from_covers(run, r.summary_covers);
    }
    req->messages = r.messages;
    req->messages_len = r.messages_len;
    /* The engine counted the request with the run's token counter: its
     * count, with the 3 tokens that prime the reply, is the estimate
     * loom_token_counter_request() would give. */
    run->estimated_prompt =
        c_is_token_counter(&run->opts.context) ? r.tokens_after + 3 : 0;
    if (has_sink(run) && (data = loom_context_result_json(&r)) != NULL) {
        json_t *sum = json_object_get(data, "summary");
        json_object_set_new(data, "iteration",
                            json_integer(run->iterations + 1));
        if (sum)
            json_object_set_new(
                sum, "covers",
                json_integer((json_int_t)conv_from_covers(run,
                                                          r.summary_covers)));
        if (why) {
            json_t *sw = json_pack("{s:s,s:s,s:s}", "from", from, "to",
                                   loom_run_model(run), "reason", why);
            if (sw)
                json_object_set_new(data, "switched", sw);
        }
        emit(run, LOOM_EV_CONTEXT, data);
    }
    free(why);
    return 0;
}

/*
 * Reviews the turn whose tool results were just added: the review's usage
 * joins the run's, a `review` event reports it, and a parsed review's
 * note goes into the next request as loom's own system message. Only
 * cancellation and running out of memory are returned.
 */
static int review_turn(loom_run *run)
{
    const loom_run_options *o = &run->opts;
    loom__review_options ro = LOOM__REVIEW_OPTIONS_INIT;
    loom__review_outcome out;
    char *note = NULL;
    int rc;

    ro.provider = o->review.provider ? o->review.provider : o->provider;
    ro.model = o->review.model ? o->review.model : o->upstream_model;
    ro.max_tokens = o->review.max_tokens;
    ro.prompt = o->review.prompt;
    ro.gate = &run->gate;
    rc = loom__review_run(&out, &ro, run->all.items, run->all.len,
                          &run->cancel);
    if (!rc)
        side_usage(run, &out.usage, out.cost_known, "review", NULL, NULL);
    if (!rc && has_sink(run))
        emit(run, LOOM_EV_REVIEW,
             loom__review_event_json(&out, run->iterations));
    if (!rc && out.ok &&
        (rc = loom__review_note(&note, &out.review)) == 0 &&
        (rc = loom_messages_add(&run->all, LOOM_ROLE_SYSTEM, note)) == 0)
        rc = track(run, 0);
    free(note);
    loom__review_outcome_clear(&out);
    return rc;
}

/* The first user message's text, or NULL. */
static const char *first_user_text(const loom_run *run)
{
    for (size_t i = 0; i < run->all.len; i++)
        if (run->all.items[i].role == LOOM_ROLE_USER)
            return run->all.items[i].content;
    return NULL;
}

/*
 * Titles the conversation once the run has answered: the call's usage
 * joins the run's and a `conversation.title` event carries the title. A
 * call that fails leaves a title from the user's words (title.h); only
 * cancellation and running out of memory are returned.
 */
LOOM_NOINLINE static int title_run(loom_run *run)
{
    const loom_run_options *o = &run->opts;
    loom__title_outcome out;
    int rc;

    rc = loom__title_run(&out, &run->gate,
                         o->title.provider ? o->title.provider : o->provider,
                         o->title.model ? o->title.model : o->upstream_model,
                         first_user_text(run), run->final_text, &run->cancel);
    side_usage(run, &out.usage, out.cost_known, "title", NULL, NULL);
    if (!rc && out.title) {
        free(run->title);
        run->title = out.title;
        out.title = NULL;
        if (has_sink(run))
            emit(run, LOOM_EV_CONVERSATION_TITLE,
                 json_pack("{s:s}", "title", run->title));
    }
    loom__title_outcome_clear(&out);
    /* The answer stands when the title is cancelled. */
    return rc == LOOM_ECANCELED ? 0 : rc;
}

/* Keeps the sources a checked answer cites and emits their events. */
static int emit_citations(loom_run *run, const loom__citations_checked *ck)
{
    json_decref(run->citations);
    if (!(run->citations = loom__citations_used_json(run->cites, ck)))
        return loom__error_oom();
    for (size_t i = 0; has_sink(run) && i < ck->numbers_len; i++)
        emit(run, LOOM_EV_CITATION,
             loom__citation_json(run->cites, ck->numbers[i]));
    return 0;
}

/* Adds the instruction to answer now, before the last permitted call:
 * the agent's limit_prompt, else the built-in one. */
static int add_limit_prompt(loom_run *run)
{
    char *p = NULL;
    int rc = 0;

    if (run->opts.limit_prompt && *run->opts.limit_prompt)
        p = strdup(run->opts.limit_prompt);
    else if (asprintf(&p, LIMIT_PROMPT, run->opts.max_iterations) < 0)
        p = NULL;
    if (!p || (rc = loom_messages_add(&run->all, LOOM_ROLE_SYSTEM, p)) ||
        (rc = track(run, 0))) {
        free(p);
        return rc ? rc : loom__error_oom();
    }
    free(p);
    return 0;
}

/* Whether the conversation so far holds a tool call. */
static int holds_tool_calls(const loom_run *run)
{
    for (size_t i = 0; i < run->all.len; i++)
        if (run->all.items[i].tool_calls_len ||
            run->all.items[i].role == LOOM_ROLE_TOOL)
            return 1;
    return 0;
}

/*
 * Puts the agent's example exchanges into the request after its leading
 * system messages (the system prompt, the summary): they are loom's own,
 * outside run->all, so they are never stored, summarised or dropped. The
 * array is rebuilt at each call over the same message structs' strings,
 * so the request cache sees the same pointers in the same places.
 */
static int add_few_shot(loom_run *run, loom_llm_request *req)
{
    size_t n = req->messages_len + run->opts.few_shot_len, lead = 0;

    if (!run->opts.few_shot_len)
        return 0;
    if (n > run->capsent) {
        loom_message *p = realloc(run->sent, n * sizeof(*p));
        if (!p)
            return loom__error_oom();
        run->sent = p;
        run->capsent = n;
    }
    while (lead < req->messages_len &&
           req->messages[lead].role == LOOM_ROLE_SYSTEM)
        lead++;
    memcpy(run->sent, req->messages, lead * sizeof(*run->sent));
    memcpy(run->sent + lead, run->opts.few_shot,
           run->opts.few_shot_len * sizeof(*run->sent));
    memcpy(run->sent + lead + run->opts.few_shot_len, req->messages + lead,
           (req->messages_len - lead) * sizeof(*run->sent));
    req->messages = run->sent;
    req->messages_len = n;
    return 0;
}

/*
 * Fills the next model call's request: the messages (fitted to the
 * context window), the tools (still declared on a call that may not use
 * them, `last`, unless no_tools and the conversation holds no tool call)
 * and the options: the agent's model's, or the one get_model chose.
 */
static int prepare_request(loom_run *run, loom_llm_request *req, int last,
                           int no_tools, int limit_injected)
{
    const loom_run_options *o = &run->opts;
    int rc;

    if ((rc = refresh_system(run)) != 0 ||
        (rc = loom__toolturn_request_tools(run->turn, &req->tools,
                                           &req->tools_len)) != 0)
        return rc;
    if (no_tools && !holds_tool_calls(run)) {
        req->tools = NULL;
        req->tools_len = 0;
    }
    req->messages = run->all.items;
    req->messages_len = run->all.len;
    if ((run->ctx && (rc = context_fit(run, req)) != 0) ||
        (rc = add_few_shot(run, req)) != 0)
        return rc;
    req->model = run->use_alt ? run->alt.upstream_model : o->upstream_model;
    if (req->tools_len) {
        /* The last permitted call still declares the tools (the
         * history holds calls of them, which Anthropic and Gemini
         * reject without their declarations) but forbids new calls.
         * Tools blocked for their failures are left out. */
        req->tool_choice = run->choice;
        if (last) {
            req->tool_choice.kind = LOOM_TOOL_CHOICE_NONE;
            req->tool_choice.function = NULL;
        }
        if (o->parallel_tool_calls != LOOM_OPT_DEFAULT)
            req->parallel_tool_calls = o->parallel_tool_calls == LOOM_OPT_ON;
    }
    req->max_tokens = o->max_output_tokens;
    if (o->temperature_set)
        req->temperature = o->temperature;
    req->stream = !o->whole_answers;
    req->cache = run->cache;
    req->thinking_budget =
        run->use_alt ? run->alt.thinking_budget : o->thinking_budget;
    req->reasoning_effort =
        run->use_alt ? run->alt.reasoning_effort : o->reasoning_effort;
    req->params = o->params;
    req->prompt_cache = o->prompt_cache;
    /* The limit note holds for this call only: a chained (stored)
     * response would keep it in the API's copy of the conversation,
     * where the next run, chaining from the answer, would read again
     * that tools are no longer available. */
    req->chain_responses = limit_injected ? 0 : o->chain_responses;
    if (!run->media &&
        (rc = loom__media_fetcher_new(
             &run->media, json_object_get(o->tool_settings, "web_fetch"),
             &run->cancel)) != 0)
        return rc;
    req->media_fetch = loom__media_fetch;
    req->media_fetch_payload = run->media;
    return 0;
}

static void hook_usage(loom_run *run, loom_usage *u);

/*
 * A model call's usage joins the run's, and a `usage` event reports it
 * (naming the model that answered when it is not the agent's). The
 * messages of the call are stored with that model (run->call_model).
 */
LOOM_NOINLINE static int account_call(loom_run *run, loom_llm_response *resp)
{
    /* Which model answered: a router may have fallen back, a get_model
     * hook may have switched; else the agent's (a handoff changes it). */
    const char *answered = resp->model    ? resp->model
                           : run->use_alt ? run->alt.model
                                          : NULL;
    const char *model = answered ? answered : loom_run_model(run);
    int rc;

    free(run->answered_model);
    run->answered_model = answered ? strdup(answered) : NULL;
    if (answered && !run->answered_model)
        return loom__error_oom();
    if (model && (rc = note_call_model(run, model)) != 0)
        return rc;
    if (!resp->usage.total_tokens && !resp->usage.prompt_tokens &&
        !resp->usage.completion_tokens)
        return 0;
    hook_usage(run, &resp->usage);
    if (!resp->cost_known)
        resp->usage.cost_micros = 0;
    add_usage(run, &resp->usage, resp->cost_known);
    if (has_sink(run)) {
        json_t *u = usage_json_cost(&resp->usage, resp->cost_known);
        json_object_set_new(u, "iteration", json_integer(run->iterations));
        if (answered)
            json_object_set_new(u, "model", json_string(answered));
        json_object_set_new(u, "cumulative", run_usage_json(run));
        emit(run, LOOM_EV_USAGE, u);
    }
    return 0;
}

/* The tool.calls event: the turn's calls and where each appeared in its
 * text. */
static void emit_calls(loom_run *run, const loom_message *assistant)
{
    size_t n = assistant->tool_calls_len;
    size_t text_len = assistant->content ? strlen(assistant->content) : 0;
    json_t *calls = json_array();

    for (size_t i = 0; calls && i < n; i++) {
        json_t *c = loom__tool_call_json(&assistant->tool_calls[i]);
        size_t off = i < run->ncall_offsets ? run->call_offsets[i] : SIZE_MAX;
        /* Where in the turn's text the call appeared (its text
         * offset); the end of the text when it streamed no delta. */
        json_object_set_new(
            c, "text_offset",
            json_integer((json_int_t)(off == SIZE_MAX ? text_len : off)));
        json_array_append_new(calls, c);
    }
    emit(run, LOOM_EV_TOOL_CALLS,
         calls ? json_pack("{s:o}", "calls", calls) : NULL);
}

/* Appends the results of a turn's server calls, in call order, each
 * matched to its call id; with citations, the model reads the numbers of
 * the documents a result brought. The images a successful call gave (a
 * model that sees: loom_run_options.vision) are the message's parts. */
static int add_results(loom_run *run, const loom__tool_job *jobs, size_t n)
{
    int rc = 0;

    for (size_t i = 0; i < n; i++) {
        loom_message m = {0};
        char *note = NULL, *shown = NULL;
        size_t dropped = 0;
        int rc2 = 0;
        m.role = LOOM_ROLE_TOOL;
        m.tool_call_id = jobs[i].call->id;
        m.name = jobs[i].call->name;
        m.content = jobs[i].output ? jobs[i].output : "Error: no result";
        m.summary = jobs[i].summary;
        if (run->cites && !jobs[i].failed && jobs[i].documents &&
            (rc2 = loom__citations_annotate(run->cites, jobs[i].documents,
                                            jobs[i].call->id, &note)) == 0 &&
            note) {
            if (asprintf(&shown, "%s\n\n%s", m.content, note) < 0) {
                shown = NULL;
                rc2 = loom__error_oom();
            }
            m.content = shown;
        }
        if (!rc2 && !jobs[i].failed && jobs[i].images &&
            (rc2 = loom__tool_images_parts(jobs[i].images, &m.parts,
                                           &m.parts_len, &dropped)) == 0 &&
            dropped)
            loom_info("tool '%s': %zu images not shown to the model (more "
                      "than %d, over %d bytes, or not base64 image data)",
                      m.name, dropped, LOOM_TOOL_IMAGES_MAX,
                      LOOM_TOOL_IMAGE_MAX_BYTES);
        if (!rc2)
            rc2 = add_message(run, &(loom_messages){&m, 1, 1});
        if (!rc2 && jobs[i].tool &&
            loom__rules_history_summary(run->opts.tool_settings,
                                        jobs[i].tool->name)) {
            size_t at = run->all.len - 1;
            rc2 = loom_buf_put(&run->reduce, &at, sizeof(at));
        }
        free(note);
        free(shown);
        for (size_t k = 0; k < m.parts_len; k++)
            loom_part_clear(&m.parts[k]);
        free(m.parts);
        if (rc2 && !rc)
            rc = rc2;
    }
    return rc;
}

/*
 * A child's report (loom__run_report) joins the run: its usage (to the
 * total and to each agent's share) and, unless the agent says not to,
 * its calls toward the iteration count.
 */
static int merge_report(loom_run *run, const json_t *report)
{
    const json_t *by = json_object_get(report, "by_agent");
    const char *agent;
    json_t *v;
    loom_usage u;
    int priced, unpriced;

    if (!run->kids_by_agent && !(run->kids_by_agent = json_object()))
        return loom__error_oom();
    loom__usage_from_full(json_object_get(report, "usage"), &u, &priced,
                          &unpriced);
    loom_usage_add(&run->usage, &u);
    loom_usage_add(&run->kids_usage, &u);
    run->priced_calls += priced;
    run->unpriced_calls += unpriced;
    run->kids_priced += priced;
    run->kids_unpriced += unpriced;
    json_object_foreach((json_t *)by, agent, v)
    {
        loom_usage a;
        int p, q;
        loom__usage_from_full(v, &a, &p, &q);
        if (loom__by_agent_add(run->kids_by_agent, agent, &a, p, q) != 0)
            return loom__error_oom();
    }
    if (run->count_sub_calls)
        run->sub_counted +=
            (int)json_integer_value(json_object_get(report, "calls"));
    run->sub_runs++;
    return 0;
}

/* Copies the client calls of a turn into run->pending. */
static int keep_pending(loom_run *run, const loom_message *assistant)
{
    size_t n = assistant->tool_calls_len;

    run->pending = calloc(n, sizeof(*run->pending));
    if (!run->pending)
        return loom__error_oom();
    for (size_t i = 0; i < n; i++) {
        const loom_tool_call *c = &assistant->tool_calls[i];
        loom_tool_call *p = &run->pending[run->npending];
        if (!loom__toolset_is_client(&run->set, c->name))
            continue;
        run->npending++;
        if (!(p->id = strdup(c->id)) || !(p->name = strdup(c->name)) ||
            !(p->arguments = strdup(c->arguments ? c->arguments : "{}")))
            return loom__error_oom();
    }
    return 0;
}

/*
 * Replaces the content of run->all's message i (loom's request copy;
 * what is stored does not change) with text, which the run takes. The
 * old text stays allocated until the run is freed: the request cache
 * knows messages by their pointers, so a new text must never take an
 * old one's address.
 */
static int replace_content(loom_run *run, size_t i, char *text)
{
    char *old = run->all.items[i].content;

    if (old && loom_buf_put(&run->retired, &old, sizeof(old)) != 0) {
        free(text);
        return loom__error_oom();
    }
    run->all.items[i].content = text;
    return 0;
}

/* The next model call must call name (then_force, special_tool); a
 * name not offered is ignored. */
static int force_tool(loom_run *run, const char *name)
{
    char *fn;

    if (!loom__toolset_server(&run->set, name) &&
        !loom__toolset_is_client(&run->set, name)) {
        loom_warn("agent '%s': tool '%s' is not offered and cannot be forced",
                  run->opts.agent ? run->opts.agent : "default", name);
        return 0;
    }
    if (!(fn = strdup(name)))
        return loom__error_oom();
    free(run->choice_fn);
    run->choice_fn = fn;
    run->choice.kind = LOOM_TOOL_CHOICE_FUNCTION;
    run->choice.function = fn;
    return 0;
}

/*
 * The agent's special_tool hook on one ended call: the result it writes
 * replaces the job's, the tool it names is forced, and the messages of
 * a copy of the request conversation it changed replace run->all's.
 */
static int special_tool(loom_run *run, loom__tool_job *job)
{
    loom_buf force = LOOM_BUF_INIT(LOOM__NAME_MAX + 1);
    loom_buf result = LOOM_BUF_INIT(run->opts.max_tool_result);
    loom_messages copy = {0};
    loom_special_tool out;
    loom_agent_state st;
    int rc;

    if ((rc = loom_messages_append(&copy, &run->all)) != 0)
        return rc;
    out.force_tool = &force;
    out.result = &result;
    out.messages = &copy;
    agent_state(run, &st);
    run->hooks->special_tool(&st, job->call, job->failed,
                             job->output ? job->output : "", &out,
                             run->hooks->payload);
    if (result.len) {
        free(job->output);
        job->output = loom_buf_detach(&result);
    }
    if (force.len)
        rc = force_tool(run, loom_buf_cstr(&force));
    for (size_t i = 0; !rc && i < copy.len && i < run->all.len; i++) {
        const char *a = run->all.items[i].content;
        char *b = copy.items[i].content;
        if (a == b || (a && b && strcmp(a, b) == 0))
            continue;
        rc = replace_content(run, i, b);
        copy.items[i].content = NULL;
    }
    loom_messages_free(&copy);
    loom_buf_free(&force);
    loom_buf_free(&result);
    return rc;
}

/*
 * The turn's calls have ended; before the model reads their results,
 * each tool's rules apply to a call that succeeded (wrap_result,
 * then_force; toolrules.h), then the agent's special_tool hook to every
 * call.
 */
static int after_calls(loom_run *run, loom__tool_job *jobs, size_t nj)
{
    const json_t *set = run->opts.tool_settings;
    int rc = 0;

    for (size_t i = 0; i < nj && !rc; i++) {
        loom__tool_job *job = &jobs[i];
        const char *force;
        char *wrapped = NULL;

        if (job->tool && !job->failed && job->output) {
            if ((rc = loom__rules_wrap(&wrapped, set, job->tool->name,
                                       job->output)) != 0)
                break;
            if (wrapped) {
                free(job->output);
                job->output = wrapped;
            }
            force = loom__rules_then_force(set, job->tool->name, job->args);
            if (force && (rc = force_tool(run, force)) != 0)
                break;
        }
        if (run->hooks && run->hooks->special_tool)
            rc = special_tool(run, job);
    }
    return rc;
}

/*
 * Notes the turn's failed tools, so that the next model call can be
 * checked for abandoning them (loop_rules.h), and counts its
 * non-iterative calls into *nfree.
 */
static int note_turn(loom_run *run, const loom__tool_job *jobs, size_t n,
                     size_t *nfree)
{
    int rc = 0;

    *nfree = 0;
    for (size_t i = 0; i < n; i++) {
        *nfree += (size_t)loom__loop_non_iterative(
            &run->opts, jobs[i].call->name,
            jobs[i].loop == LOOM__LOOP_THINK + 1);
        if (jobs[i].failed && !rc)
            rc = loom__abandoned_failed(&run->abandoned, jobs[i].call->name);
    }
    return rc;
}

/*
 * Results of tools with `history: summary` that a model call has read:
 * later calls read them reduced (the tool's summary, else a
 * placeholder). The conversation the caller stores keeps them whole.
 */
LOOM_NOINLINE static int reduce_read_results(loom_run *run)
{
    const size_t *at = (const size_t *)(const void *)run->reduce.ptr;
    size_t n = run->reduce.len / sizeof(*at);
    int rc = 0;

    for (size_t k = 0; k < n && !rc; k++) {
        const loom_message *m = &run->all.items[at[k]];
        char *r = loom__rules_reduced(m->name ? m->name : "a tool", m->summary);
        rc = r ? replace_content(run, at[k], r) : loom__error_oom();
    }
    loom_buf_clear(&run->reduce);
    return rc;
}

/* The history's results of tools with `history: summary` are read
 * reduced from the start (their summaries are not stored). */
static int reduce_history(loom_run *run)
{
    for (size_t i = 0; i < run->all.len; i++) {
        loom_message *m = &run->all.items[i];
        char *r;
        if (m->role != LOOM_ROLE_TOOL || !m->name ||
            !loom__rules_history_summary(run->opts.tool_settings, m->name))
            continue;
        if (!(r = loom__rules_reduced(m->name, m->summary)))
            return loom__error_oom();
        free(m->content);
        m->content = r;
    }
    return 0;
}

/* The tool of the first call when every call of the turn (nclient
 * client ones among them) ended TOOL_NOT_ENABLED, copied; else NULL. */
static char *all_disabled(const loom__tool_job *jobs, size_t nj, size_t nclient)
{
    for (size_t i = 0; i < nj; i++)
        if (!loom__tool_job_not_enabled(&jobs[i]))
            return NULL;
    return nj && !nclient ? strdup(jobs[0].tool->name) : NULL;
}

/*
 * Runs the tool calls of the turn just added (the last message): the
 * server calls through the tool turn, their results appended; client
 * calls are kept as pending. *nclient says how many client calls there
 * were, *think_only whether every call was of a non-iterative tool,
 * *disabled (the caller frees) the first tool's name when every call was to a
 * tool not enabled.
 */
static int run_tools(loom_run *run, size_t *nclient, int *think_only,
                     char **disabled)
{
    /* The turn's assistant message, by place: appending the results
     * may move the list (it grows as needed), so a pointer into it is
     * taken again after them. */
    size_t at = run->all.len - 1;
    const loom_message *assistant = &run->all.items[at];
    loom__tool_job *jobs = NULL;
    size_t nj = 0, nthink = 0;
    int rc, rc2;

    *nclient = 0;
    for (size_t i = 0; i < assistant->tool_calls_len; i++)
        *nclient += (size_t)loom__toolset_is_client(
            &run->set, assistant->tool_calls[i].name);
    if (has_sink(run))
        emit_calls(run, assistant);
    run->place.index = run->index;
    run->place.agent = run->opts.agent; /* a handoff may have changed it */
    run->place.model = run->use_alt ? run->alt.model : loom_run_model(run);
    rc = loom__toolturn_run(run->turn, assistant, run->iterations, &jobs, &nj);
    if (!jobs)
        return rc;
    run->tool_calls += nj;
    for (size_t i = 0; i < nj; i++)
        if (jobs[i].report && !rc)
            rc = merge_report(run, jobs[i].report);
    rc2 = note_turn(run, jobs, nj, &nthink);
    *think_only = nj > 0 && nthink == nj && *nclient == 0;
    *disabled = all_disabled(jobs, nj, *nclient);
    if (!rc2)
        rc2 = after_calls(run, jobs, nj);
    if (!rc2)
        rc2 = add_results(run, jobs, nj);
    loom__toolturn_jobs_free(jobs, nj);
    if (!rc)
        rc = rc2;
    if (!rc && *nclient)
        rc = keep_pending(run, &run->all.items[at]);
    return rc;
}

/* After a turn of more than many_results_after results (nres), the note
 * asking for a short context summary, for the next call. */
static int add_many_results_note(loom_run *run, size_t nres)
{
    const loom_run_options *o = &run->opts;
    const char *p = o->many_results_prompt && *o->many_results_prompt
                        ? o->many_results_prompt
                        : MANY_RESULTS_PROMPT;
    int rc;

    if (o->many_results_after <= 0 || nres <= (size_t)o->many_results_after)
        return 0;
    if ((rc = loom_messages_add(&run->all, LOOM_ROLE_SYSTEM, p)) != 0)
        return rc;
    return track(run, 0);
}

/* Ends the run with text as its answer, streamed as the model's would
 * be and stored as the assistant's message. */
static int end_with_text(loom_run *run, loom_llm_response *resp,
                         const char *text)
{
    loom_message m = {0};
    int rc;

    run->index++;
    if (has_sink(run) && *text)
        emit(run, LOOM_EV_MESSAGE_DELTA, delta_json(text, strlen(text)));
    m.role = LOOM_ROLE_ASSISTANT;
    m.content = (char *)text;
    if ((rc = add_message(run, &(loom_messages){&m, 1, 1})) != 0)
        return rc;
    free(run->final_text);
    free(resp->finish_reason);
    run->final_text = strdup(text);
    resp->finish_reason = strdup("stop");
    return run->final_text && resp->finish_reason ? 0 : loom__error_oom();
}

/*
 * Every call of the turn was to a tool not enabled for the user (the
 * first is tool): the agent's on_no_tool_calls hook decides. When it
 * goes on, the text it wrote is a system note for the next call. When it
 * ends the run (or there is no hook), the run ends with the text it
 * wrote, else with the agent's tools_disabled_message (or the built-in
 * one), {tool} filled in, as the answer: the model is not asked again.
 */
static int no_calls(loom_run *run, loom_no_calls_reason reason,
                    const loom_tool_call *calls, size_t ncalls,
                    const loom_llm_response *said, int *more);

static int tools_disabled(loom_run *run, loom_llm_response *resp,
                          const char *tool, int *ended)
{
    const char *tmpl = run->opts.tools_disabled_message;
    char *text;
    int go_on = 0, rc;

    if ((rc = no_calls(run, LOOM_NO_CALLS_TOOLS_DISABLED, resp->tool_calls,
                       resp->tool_calls_len, NULL, &go_on)) != 0)
        return rc;
    if (go_on) {
        run->index++;
        return 0;
    }
    /* The hook's text is the answer here, not a note after one. */
    text = run->end_note;
    run->end_note = NULL;
    if (!text)
        text = loom__text_fill(tmpl && *tmpl ? tmpl : TOOLS_DISABLED_MESSAGE,
                               "{tool}", tool);
    if (!text)
        return loom__error_oom();
    rc = end_with_text(run, resp, text);
    free(text);
    *ended = 1;
    return rc;
}

/*
 * The system message for the agent the run now is (opts): its prompt in
 * place of the last agent's, put before the conversation when there was
 * none, taken out when the agent's assembled text (prompt.c) is empty.
 * The text replaced stays allocated as system_prev (see refresh_system).
 */
static int handoff_system(loom_run *run)
{
    char *text = NULL;
    int want, rc;

    if ((rc = system_text(run, &text)) != 0)
        return rc;
    want = *text != 0;
    if (!want) {
        free(text);
        text = NULL;
    }
    if (run->has_system) {
        free(run->system_prev);
        run->system_prev = run->all.items[0].content;
        run->all.items[0].content = NULL;
    }
    if (want && run->has_system) {
        run->all.items[0].content = text;
    } else if (want) {
        /* Appended, then moved to the front with its stored mark. */
        loom_message m;
        rc = loom_messages_add(&run->all, LOOM_ROLE_SYSTEM, text);
        free(text);
        if (rc || (rc = track(run, 0)) != 0)
            return rc;
        m = run->all.items[run->all.len - 1];
        memmove(run->all.items + 1, run->all.items,
                (run->all.len - 1) * sizeof(m));
        run->all.items[0] = m;
        memmove(run->stored + 1, run->stored, run->nstored - 1);
        run->stored[0] = 0;
    } else if (run->has_system) {
        loom_message_clear(&run->all.items[0]);
        memmove(run->all.items, run->all.items + 1,
                --run->all.len * sizeof(run->all.items[0]));
        memmove(run->stored, run->stored + 1, --run->nstored);
    }
    run->has_system = want;
    return 0;
}

/* The agent.changed event of the handoff just made (from: the agent
 * that handed over). */
static void emit_agent_changed(loom_run *run, const char *from)
{
    const loom_run_options *o = &run->opts;
    pk p;

    if (!has_sink(run))
        return;
    p = pk_new();
    pk_str_or_null(&p, "from", from);
    pk_str_or_null(&p, "to", o->agent);
    pk_str(&p, "call_id", run->next_call ? run->next_call : "");
    if (run->next_reason)
        pk_str(&p, "reason", run->next_reason);
    pk_str_or_null(&p, "model", o->model ? o->model : o->upstream_model);
    pk_int(&p, "max_iterations", o->max_iterations);
    pk_int(&p, "tools", (int)run->ndefs);
    pk_int(&p, "handoffs", run->nhandoffs);
    emit(run, LOOM_EV_AGENT_CHANGED, pk_done(&p));
}

LOOM_NOINLINE static void hooks_init(loom_run *run);

/* Drops the handoff a turn asked for. */
static void handoff_drop(loom_run *run)
{
    free(run->next);
    free(run->next_call);
    free(run->next_reason);
    run->next = NULL;
    run->next_call = NULL;
    run->next_reason = NULL;
}

/*
 * Builds the offered tools again, from a new snapshot of the registry,
 * for the run's options as they are now (a handoff's agent, or the same
 * agent whose MCP tools changed). The tool turn's counts of failures in
 * a row start over.
 */
static int rebuild_tools(loom_run *run)
{
    int rc;

    free(run->defs);
    free(run->offered);
    free(run->available);
    loom__handoffs_free(run->handoffs);
    run->defs = NULL;
    run->offered = NULL;
    run->available = NULL;
    run->handoffs = NULL;
    run->ndefs = run->nserver = 0;
    if ((rc = build_tools(run)) != 0)
        return rc;
    loom__toolturn_set_registry(run->turn, run->reg);
    return loom__toolturn_retool(run->turn, run->opts.tool_concurrency,
                                 run->opts.tool_timeout_ms);
}

/*
 * Before a model call: when the tools of an MCP server started in the
 * background changed (it said so, or it became available), the tools
 * offered are built again.
 */
LOOM_NOINLINE static int refresh_tools(loom_run *run)
{
    if (!loom__tool_registry_source_count(run->opts.tools) ||
        loom__tool_registry_generation(run->opts.tools) ==
            loom__tool_registry_built_at(run->reg))
        return 0;
    loom_debug("run %s: the MCP tools changed; offering them anew", run->id);
    return rebuild_tools(run);
}

/*
 * The turn's results are in and a call of it handed over: the run
 * becomes run->next's agent (see loom_run_options.handoffs). What is
 * the run's own (id, conversation, sink, plan, citations, the stored
 * summary) is kept; the tools, system message, context engine and
 * agent hooks are the new agent's; its max_iterations counts from here,
 * and its retries (retry_without_tool_calls) and the model a get_model
 * hook switched to (model_after_retries) start over: nothing of the
 * previous agent's loop state carries over.
 */
static int switch_agent(loom_run *run)
{
    loom_run_options n = *run->next;
    const char *from = run->opts.agent;
    int rc;

    n.run_id = NULL;
    n.conversation_id = NULL;
    n.plan = NULL;
    n.sink = run->opts.sink;
    n.citations = run->opts.citations;
    if (!n.context.summary) {
        n.context.summary = run->opts.context.summary;
        n.context.summary_covers = run->opts.context.summary_covers;
    }
    options_defaults(&n);
    run->opts = n;
    run->choice.kind = LOOM_TOOL_CHOICE_AUTO;
    run->choice.function = NULL;
    run->switched = 0;
    loom__toolturn_set_settings(run->turn, n.tool_settings);
    if ((rc = rebuild_tools(run)) != 0 || (rc = handoff_system(run)) != 0)
        return rc;
    if (n.context.window > 0) {
        if ((rc = context_open(run)) != 0)
            return rc;
    } else {
        loom_context_free(run->ctx);
        run->ctx = NULL;
    }
    if (run->hook_state_set && run->hooks->free_state)
        run->hooks->free_state(run->hook_state, run->hooks->payload);
    run->hook_state = NULL;
    run->hook_state_set = 0;
    run->hooks = n.agent_hooks;
    run->nhandoffs++;
    run->counted_base = run->iterations - run->think_turns + run->sub_counted;
    run->retries = 0;
    run->use_alt = 0;
    free(run->alt_name);
    run->alt_name = NULL;
    memset(&run->alt, 0, sizeof(run->alt));
    emit_agent_changed(run, from);
    handoff_drop(run);
    hooks_init(run);
    return 0;
}

/*
 * The model asked for tools: its message joins the conversation and the
 * calls run. *ended is set when the run ends here (client calls are the
 * caller's to run); otherwise the turn may be reviewed and the loop goes
 * on.
 */
/* Tells the step callback (loom__run_set_step) that a step is done,
 * unless the run is being cancelled: what a cancel cut short is no
 * step. */
static void step(loom_run *run, const char *what)
{
    if (run->step_fn && !loom_cancel_is_set(&run->cancel))
        run->step_fn(run, what, run->step_payload);
}

static int turn_tools(loom_run *run, loom_llm_response *resp, int *ended);

LOOM_NOINLINE static int tool_turn(loom_run *run, loom_llm_response *resp,
                                   int *ended)
{
    loom_message m = {0};
    int rc;

    *ended = 0;
    if ((rc = ensure_call_ids(resp->tool_calls, resp->tool_calls_len,
                              run->iterations)) != 0)
        return rc;
    m.role = LOOM_ROLE_ASSISTANT;
    m.content = resp->text && *resp->text ? resp->text : NULL;
    m.reasoning = resp->reasoning;
    m.provider_state = resp->provider_state;
    m.tool_calls = resp->tool_calls;
    m.tool_calls_len = resp->tool_calls_len;
    if ((rc = add_message(run, &(loom_messages){&m, 1, 1})) != 0)
        return rc;
    /* The turn's text now lives in the stored message. */
    loom_buf_clear(&run->text);
    step(run, "calls");
    return turn_tools(run, resp, ended);
}

/* The tool half of a turn: runs the calls of the last message (resp's)
 * and appends their results. */
static int turn_tools(loom_run *run, loom_llm_response *resp, int *ended)
{
    const loom_run_options *o = &run->opts;
    size_t nclient = 0;
    char *disabled = NULL;
    int think_only = 0, rc;

    *ended = 0;
    rc = run_tools(run, &nclient, &think_only, &disabled);
    if (rc != 0 || disabled) {
        if (!rc)
            rc = tools_disabled(run, resp, disabled, ended);
        free(disabled);
        return rc;
    }
    if (think_only && run->think_turns < o->max_think_turns)
        run->think_turns++;
    if (run->next && !nclient && (rc = switch_agent(run)) != 0)
        return rc;
    if (nclient) {
        /* The client runs its own tools: the run ends here, as the
         * agent it is. */
        handoff_drop(run);
        *ended = 1;
        free(run->final_text);
        run->final_text = strdup(resp->text ? resp->text : "");
        return run->final_text ? 0 : loom__error_oom();
    }
    /* Review, unless the next call is the last (it may not call tools)
     * or the turn only thought. */
    if (o->review.enabled && !think_only &&
        counted(run) + 1 < o->max_iterations && (rc = review_turn(run)) != 0)
        return rc;
    if ((rc = add_many_results_note(run, resp->tool_calls_len)) != 0)
        return rc;
    run->index++;
    step(run, "results");
    return 0;
}

/*
 * The text on_no_tool_calls gave for the end of the run, streamed and
 * appended to text: *joined (caller frees) is the answer's text, NULL
 * when there was none.
 */
static int append_end_note(loom_run *run, const char *text, char **joined)
{
    *joined = NULL;
    if (!run->end_note)
        return 0;
    if (has_sink(run))
        emit(run, LOOM_EV_MESSAGE_DELTA,
             delta_json(run->end_note, strlen(run->end_note)));
    if (asprintf(joined, "%s%s", text, run->end_note) < 0) {
        *joined = NULL;
        return loom__error_oom();
    }
    return 0;
}

/*
 * The "Sources" list of the sources ck cites, in their order of first
 * use, appended to *content (streamed as a delta): *joined is the new
 * text (freeing the one it held), and *content points to it.
 */
static int sources_list(loom_run *run, loom__citations_checked *ck,
                        char **content, char **joined)
{
    loom_buf b = LOOM_BUF_INIT((size_t)1 << 20);
    char *text;
    int rc = loom_buf_printf(&b, "\n\n## Sources\n");

    for (size_t i = 0; !rc && i < ck->numbers_len; i++) {
        const loom__citation_doc *d =
            loom__citations_get(run->cites, ck->numbers[i]);
        if (!d)
            continue;
        rc = loom_buf_printf(&b, "\n[%zu] %s%s%s", d->number,
                             d->title && *d->title ? d->title : "",
                             d->title && *d->title && d->url ? " - " : "",
                             d->url ? d->url
                                    : (d->title && *d->title ? ""
                                       : d->id               ? d->id
                                                             : ""));
    }
    if (!rc && has_sink(run))
        emit(run, LOOM_EV_MESSAGE_DELTA, delta_json(b.ptr, b.len));
    if (!rc && asprintf(&text, "%s%s", *content, loom_buf_cstr(&b)) < 0)
        rc = loom__error_oom();
    loom_buf_free(&b);
    if (rc)
        return rc;
    /* ck->text may be what content points to: keep it until here. */
    free(*joined);
    *joined = text;
    *content = text;
    return 0;
}

/* No tool calls (or tools no longer allowed): the answer, its citations
 * checked once it is whole. */
static int answer(loom_run *run, const loom_llm_response *resp)
{
    loom_message m = {0};
    loom__citations_checked ck;
    size_t nsrc = loom__citations_count(run->cites);
    char *joined = NULL;
    int rc;

    m.role = LOOM_ROLE_ASSISTANT;
    m.content = resp->text ? resp->text : "";
    if ((rc = append_end_note(run, m.content, &joined)) != 0)
        return rc;
    if (joined)
        m.content = joined;
    m.reasoning = resp->reasoning;
    m.provider_state = resp->provider_state;
    memset(&ck, 0, sizeof(ck));
    /* An answer too large to check is kept as it is. */
    if (nsrc &&
        (rc = loom__citations_check(nsrc, m.content, strlen(m.content), 0,
                                    &ck)) != 0 &&
        rc != LOOM_ENOMEM)
        rc = 0;
    if (ck.text)
        m.content = ck.text;
    run->cites_dropped = ck.dropped;
    if (!rc && ck.numbers_len && run->opts.citations_sources_list &&
        (rc = sources_list(run, &ck, &m.content, &joined)) != 0)
        return rc;
    free(run->final_text);
    run->final_text = rc ? NULL : strdup(m.content);
    if (!rc && (!run->final_text ||
                (rc = add_message(run, &(loom_messages){&m, 1, 1})) != 0))
        rc = rc ? rc : loom__error_oom();
    if (!rc && ck.text)
        rc = emit_citations(run, &ck);
    loom__citations_checked_clear(&ck);
    free(joined);
    return rc;
}

LOOM_NOINLINE static void finish_completed(loom_run *run)
{
    pk p = pk_new();
    json_t *done;

    pk_str(&p, "status", "completed");
    pk_str(&p, "text", run->final_text);
    pk_int(&p, "iterations", run->iterations);
    pk_str_or_null(&p, "finish_reason", run->finish_reason);
    pk_set(&p, "usage", run_usage_json(run));
    if (run->answered_model)
        pk_str(&p, "model", run->answered_model);
    done = pk_done(&p);
    run->status = LOOM_RUN_COMPLETED;
    if (run->npending) {
        json_t *pc = json_array();
        for (size_t i = 0; i < run->npending; i++)
            json_array_append_new(pc, loom__tool_call_json(&run->pending[i]));
        json_object_set_new(done, "pending_tool_calls", pc);
    }
    if (run->think_turns)
        json_object_set_new(done, "think_turns",
                            json_integer(run->think_turns));
    if (json_array_size(run->citations))
        json_object_set(done, "citations", run->citations);
    if (run->cites_dropped)
        json_object_set_new(done, "citations_dropped",
                            json_integer((json_int_t)run->cites_dropped));
    if (run->completion_extra)
        json_object_update(done, run->completion_extra);
    emit(run, LOOM_EV_RUN_COMPLETED, done);
}

/* ---- agent hooks --------------------------------------------------------- */

/* The model of the current call: "provider/model" (or the upstream id). */
static const char *call_model_name(const loom_run *run)
{
    return run->use_alt ? run->alt.model : loom_run_model(run);
}

/* What the agent's hooks see of the run now (loom/agent.h). */
static void agent_state(const loom_run *run, loom_agent_state *st)
{
    memset(st, 0, sizeof(*st));
    st->run = run;
    st->agent = run->opts.agent;
    st->iteration = run->iterations;
    st->counted = counted(run);
    st->max_iterations = run->opts.max_iterations;
    st->tool_calls = run->last_calls;
    st->tools_offered = run->ndefs;
    st->retries = run->retries;
    st->model = call_model_name(run);
    st->messages = &run->all;
    st->state = run->hook_state;
}

/* The hooks' init_state, once, before the first model call. */
LOOM_NOINLINE static void hooks_init(loom_run *run)
{
    loom_agent_state st;

    if (!run->hooks || !run->hooks->init_state || run->hook_state_set)
        return;
    agent_state(run, &st);
    run->hook_state = run->hooks->init_state(&st, run->hooks->payload);
    run->hook_state_set = 1;
}

/* The hooks that answer on_no_tool_calls and get_model: the agent's when
 * it has the member, else loom's defaults (loop_rules.c), whose payload
 * is the run's options. */
#define HOOKS_FOR(run, member, payload_out)                                    \
    ((run)->hooks && (run)->hooks->member                                      \
         ? (*(payload_out) = (run)->hooks->payload, (run)->hooks)              \
         : (*(payload_out) = (void *)&(run)->opts, &loom__loop_default_hooks))

/* A system note for the next model call (loom's own: never stored). */
static int add_note(loom_run *run, const char *text)
{
    int rc = loom_messages_add(&run->all, LOOM_ROLE_SYSTEM, text);

    return rc ? rc : track(run, 0);
}

/*
 * A model call left no tool calls to run, for reason (calls: the turn's,
 * for TOOLS_DISABLED, else NULL): asks on_no_tool_calls. Going on (*more
 * = 1): said's text (the call's answer, may be NULL) joins the
 * conversation, then the hook's message as a system note; an empty one at
 * LIMIT_REACHED is the limit note. Ending (*more = 0): the hook's message
 * is kept for the answer (answer() streams and appends it).
 */
static int no_calls(loom_run *run, loom_no_calls_reason reason,
                    const loom_tool_call *calls, size_t ncalls,
                    const loom_llm_response *said, int *more)
{
    void *payload;
    const loom_agent_hooks *h = HOOKS_FOR(run, on_no_tool_calls, &payload);
    loom_buf msg = LOOM_BUF_INIT(run->opts.max_tool_result);
    loom_agent_state st;
    int rc = 0;

    agent_state(run, &st);
    *more = h->on_no_tool_calls(&st, reason, calls, ncalls, &msg, payload) != 0;
    if (run->hook_error) {
        loom_buf_free(&msg);
        return loom__error_set(LOOM_ERROR, "%s", run->hook_error);
    }
    if (!*more) {
        free(run->end_note);
        run->end_note = NULL;
        if (msg.len && !(run->end_note = loom_buf_detach(&msg)))
            rc = loom__error_oom();
        loom_buf_free(&msg);
        return rc;
    }
    if (reason == LOOM_NO_CALLS_GENERATED)
        run->retries++;
    if (said && said->text && *said->text) {
        loom_message m = {0};
        m.role = LOOM_ROLE_ASSISTANT;
        m.content = said->text;
        m.reasoning = said->reasoning;
        m.provider_state = said->provider_state;
        rc = add_message(run, &(loom_messages){&m, 1, 1});
    }
    if (!rc && msg.len)
        rc = add_note(run, loom_buf_cstr(&msg));
    else if (!rc && reason == LOOM_NO_CALLS_LIMIT_REACHED)
        rc = add_limit_prompt(run);
    loom_buf_free(&msg);
    return rc;
}

/* should_continue (before a model call after the first) or
 * should_send_tools (before each): fn's answer; NULL fn: yes. */
static int hook_yes(const loom_run *run,
                    int (*fn)(const loom_agent_state *, void *))
{
    loom_agent_state st;

    if (!fn)
        return 1;
    agent_state(run, &st);
    return fn(&st, run->hooks->payload) != 0;
}

/*
 * get_model, before each model call: sets run->use_alt when the call
 * goes to another model than the agent's, resolving a new name with
 * resolve_model (none: the run's provider, the name as the upstream id).
 */
LOOM_NOINLINE static int hook_model(loom_run *run)
{
    const loom_run_options *o = &run->opts;
    void *payload;
    const loom_agent_hooks *h = HOOKS_FOR(run, get_model, &payload);
    loom_agent_state st;
    const char *name;
    char *keep;
    int rc;

    run->use_alt = 0;
    agent_state(run, &st);
    name = h->get_model(&st, payload);
    if (!name || !*name || (o->model && strcmp(name, o->model) == 0) ||
        strcmp(name, o->upstream_model) == 0)
        return 0;
    if (run->alt_name && strcmp(name, run->alt_name) == 0) {
        run->use_alt = 1;
        return 0;
    }
    if (!(keep = strdup(name)))
        return loom__error_oom();
    free(run->alt_name);
    run->alt_name = keep;
    memset(&run->alt, 0, sizeof(run->alt));
    if (o->resolve_model) {
        if ((rc = o->resolve_model(&run->alt, keep,
                                   o->resolve_model_payload)) != 0)
            goto fail;
        if (!run->alt.provider || !run->alt.upstream_model) {
            rc = loom__error_set(LOOM_EINVALID,
                                 "model '%s' resolved to no provider", keep);
            goto fail;
        }
        if (!run->alt.model)
            run->alt.model = keep;
    } else {
        run->alt.provider = o->provider;
        run->alt.model = keep;
        run->alt.upstream_model = keep;
        run->alt.thinking_budget = o->thinking_budget;
        run->alt.reasoning_effort = o->reasoning_effort;
    }
    run->use_alt = 1;
    return 0;
fail:
    free(run->alt_name);
    run->alt_name = NULL;
    return rc;
}

/* calculate_usage, on a call's usage before it is counted. */
static void hook_usage(loom_run *run, loom_usage *u)
{
    loom_agent_state st;
    loom_usage call = *u;

    if (!run->hooks || !run->hooks->calculate_usage)
        return;
    agent_state(run, &st);
    run->hooks->calculate_usage(&st, &call, u, run->hooks->payload);
}

/* process_tool_calls: non-zero ends the run with the call's text. */
LOOM_NOINLINE static int hook_process_calls(loom_run *run,
                                            const loom_llm_response *resp)
{
    loom_agent_state st;

    if (!run->hooks || !run->hooks->process_tool_calls)
        return 0;
    agent_state(run, &st);
    return run->hooks->process_tool_calls(&st, resp->tool_calls,
                                          resp->tool_calls_len,
                                          run->hooks->payload) != 0;
}

/* on_tools_selected, before the calls run. */
LOOM_NOINLINE static void hook_tools_selected(loom_run *run,
                                              const loom_llm_response *resp)
{
    loom_agent_state st;

    if (!run->hooks || !run->hooks->on_tools_selected)
        return;
    agent_state(run, &st);
    run->hooks->on_tools_selected(&st, resp->tool_calls, resp->tool_calls_len,
                                  run->hooks->payload);
}

/*
 * prepare_call, before each model call: may take the tools away (never
 * give them back), force a tool call, limit the output, add a note and
 * say where the call's text streams (run->text_event).
 */
LOOM_NOINLINE static int hook_prepare_call(loom_run *run, int *tools_ok,
                                           long *max_tokens)
{
    loom_buf note = LOOM_BUF_INIT(run->opts.max_tool_result);
    loom_call_setup call;
    loom_agent_state st;
    int rc = 0;

    run->text_event = 0;
    if (!run->hooks || !run->hooks->prepare_call)
        return 0;
    memset(&call, 0, sizeof(call));
    call.tools = *tools_ok;
    call.note = &note;
    agent_state(run, &st);
    run->hooks->prepare_call(&st, &call, run->hooks->payload);
    *tools_ok = *tools_ok && call.tools;
    if (*tools_ok && call.tool_required) {
        run->choice.kind = LOOM_TOOL_CHOICE_REQUIRED;
        run->choice.function = NULL;
    }
    *max_tokens = call.max_output_tokens;
    if (call.text_event < 0 ||
        (call.text_event > 0 && call.text_event < LOOM_EV__COUNT))
        run->text_event = call.text_event;
    if (note.len)
        rc = add_note(run, loom_buf_cstr(&note));
    loom_buf_free(&note);
    return rc;
}

/* The run ends on a hook's word: finish reason "stop". */
static int finish_stop(loom_llm_response *resp)
{
    free(resp->finish_reason);
    resp->finish_reason = strdup("stop");
    return resp->finish_reason ? 0 : loom__error_oom();
}

/*
 * should_continue said to stop before a model call: the last call's text
 * (its assistant message's, already in the conversation) is the answer.
 */
LOOM_NOINLINE static int stop_early(loom_run *run, loom_llm_response *resp)
{
    const char *text = "";

    for (size_t i = run->added.len; i-- > 0;)
        if (run->added.items[i].role == LOOM_ROLE_ASSISTANT) {
            if (run->added.items[i].content)
                text = run->added.items[i].content;
            break;
        }
    free(run->final_text);
    if (!(run->final_text = strdup(text)))
        return loom__error_oom();
    return finish_stop(resp);
}

/* ---- the budget --------------------------------------------------------- */

/*
 * The run's spend (gate.h), when it executes: its own when it has a
 * budget (under its parent's, if any) or is a top run with an account
 * gate; else its parent's, if any; else none (calls go unasked).
 */
LOOM_NOINLINE static int spend_open(loom_run *run)
{
    const loom_run_options *o = &run->opts;
    int rc;

    if (!run->spend) {
        if (loom__budget_any(&o->budget) ||
            (o->call_gate && !run->parent_spend)) {
            if ((rc = loom__spend_new(&run->spend, &o->budget,
                                      run->parent_spend ? NULL : o->call_gate,
                                      run->parent_spend)) != 0)
                return rc;
        } else {
            run->spend = loom__spend_ref(run->parent_spend);
        }
    }
    if (run->resumed && run->spend && run->spend != run->parent_spend) {
        loom__spend_carry(run->spend, run->carry_micros, run->carry_tokens,
                          run->carry_ms);
        run->carry_micros = run->carry_tokens = run->carry_ms = 0;
    }
    run->gate.spend = run->spend;
    run->gate.counter = o->context.token_counter;
    run->place.spend = run->spend;
    return 0;
}

static loom_provider *call_provider(const loom_run *run)
{
    return run->use_alt ? run->alt.provider : run->opts.provider;
}

/* Reserves req's worst case: 0 with *why set when refused. */
static int gate_reserve(loom_run *run, loom_llm_request *req, int final,
                        loom__ticket **ticket, loom__refusal *why)
{
    loom_token_counter *tc = run->opts.context.token_counter;
    size_t prompt = 0;

    *ticket = NULL;
    *why = LOOM__REFUSED_NONE;
    if (!run->spend)
        return 0;
    if (tc && !run->switched)
        prompt = estimate_request(run, tc, req);
    if (prompt == (size_t)-1)
        prompt = 0;
    return loom__gate_reserve(&run->gate, call_provider(run),
                              call_model_name(run), req, final, prompt, ticket,
                              why);
}

static void gate_settle(loom__ticket *ticket, const loom_llm_response *resp)
{
    loom__gate_settle(ticket, resp);
}

/*
 * Asks the gate before the next call (req). When it is refused and the
 * call could use tools, the run turns to its budget's last call: a note
 * asks for the answer now, and the request is made again without tools
 * (max_tokens: the prepare_call hook's limit, 0: none) and asked again
 * as a last call. *ticket: the reservation; *tools_ok is cleared for a
 * last call; *refused: nothing fits.
 */
LOOM_NOINLINE static int gate_call(loom_run *run, loom_llm_request *req,
                                   int *tools_ok, long max_tokens,
                                   loom__ticket **ticket, int *refused)
{
    loom__refusal why;
    int rc;

    *refused = 0;
    if ((rc = gate_reserve(run, req, !*tools_ok, ticket, &why)) != 0 || !why)
        return rc;
    run->budget_why = why;
    if (*tools_ok) {
        loom_llm_request again = LOOM_LLM_REQUEST_INIT;
        *tools_ok = 0;
        *req = again;
        if ((rc = add_note(run, BUDGET_PROMPT)) != 0 ||
            (rc = prepare_request(run, req, 1, 1, 1)) != 0)
            return rc;
        if (max_tokens > 0)
            req->max_tokens = max_tokens;
        if ((rc = gate_reserve(run, req, 1, ticket, &why)) != 0 || !why)
            return rc;
    }
    *refused = 1;
    return 0;
}

/* The run ended on its budget: finish reason "budget", and run.completed
 * says which limit. */
static int budget_finish(loom_run *run, loom_llm_response *resp)
{
    json_t *b;

    free(resp->finish_reason);
    if (!(resp->finish_reason = strdup("budget")))
        return loom__error_oom();
    b = json_pack("{s:s}", "limit", loom__refusal_name(run->budget_why));
    return b ? loom__run_complete_with(run, "budget", b) : loom__error_oom();
}

/*
 * Empty reasoning right after run.started for a model that reasons, so
 * a client opens its reasoning view early (seed 001).
 */
LOOM_NOINLINE static void emit_reasoning_open(loom_run *run)
{
    const loom_run_options *o = &run->opts;

    if (has_sink(run) && (o->reasoning || o->thinking_budget > 0 ||
                          (o->reasoning_effort && *o->reasoning_effort)))
        emit(run, LOOM_EV_REASONING_DELTA, delta_json("", 0));
}

/*
 * One model call and what follows it. Returns 0 and sets *more when the
 * loop goes round again; 0 with *more unset when the run has its answer.
 * The helpers that do not lead to the call are LOOM_NOINLINE
 * (core/fiber.h): inlined, their locals widened this frame, which stays
 * on a stream's fiber stack while the answer streams (832 bytes with
 * them, 560 without).
 */
static int iterate(loom_run *run, loom_llm_response *resp, int *limit_injected,
                   int *more)
{
    const loom_run_options *o = &run->opts;
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    /* Non-iterative turns within their allowance cost no iteration. */
    int last = counted(run) + 1 >= o->max_iterations;
    int rc, arc, ended = 0, tools_ok, go, refused;
    long max_tokens = 0;
    loom__ticket *ticket;

    *more = 0;
    if (loom_cancel_is_set(&run->cancel))
        return LOOM_ECANCELED;
    if (run->iterations > 0 &&
        !hook_yes(run, run->hooks ? run->hooks->should_continue : NULL))
        return stop_early(run, resp);
    if ((rc = refresh_tools(run)) != 0)
        return rc;
    if (last && run->iterations > 0 && run->ndefs && !*limit_injected) {
        *limit_injected = 1;
        if ((rc = no_calls(run, LOOM_NO_CALLS_LIMIT_REACHED, NULL, 0, NULL,
                           &go)) != 0)
            return rc;
        if (!go) {
            loom_llm_response_clear(resp);
            return (rc = finish_stop(resp)) != 0 ? rc : answer(run, resp);
        }
    }
    tools_ok = !last &&
               hook_yes(run, run->hooks ? run->hooks->should_send_tools : NULL);
    if ((rc = hook_prepare_call(run, &tools_ok, &max_tokens)) != 0)
        return rc;
    loom_buf_clear(&run->text);
    run->ncall_offsets = 0;
    loom_llm_response_clear(resp);
    if ((rc = hook_model(run)) != 0 ||
        (rc = prepare_request(run, &req, !tools_ok, !last && !tools_ok,
                              *limit_injected)) != 0)
        return rc;
    if (max_tokens > 0)
        req.max_tokens = max_tokens;
    if ((rc = gate_call(run, &req, &tools_ok, max_tokens, &ticket, &refused)) !=
        0)
        return rc;
    if (refused)
        return (rc = stop_early(run, resp)) != 0 ? rc
                                                 : budget_finish(run, resp);
    if (run->budget_why)
        last = 1;
    run->iterations++;
    rc = loom_provider_complete(call_provider(run), &req, on_llm_event, run,
                                resp, &run->cancel);
    gate_settle(ticket, resp);
    if (rc == 0)
        observe_tokens(run, &req, resp);
    run->estimated_prompt = 0;
    /* A forced tool choice applies to one call, then returns to auto. */
    run->choice.kind = LOOM_TOOL_CHOICE_AUTO;
    run->choice.function = NULL;
    if ((arc = account_call(run, resp)) != 0 && rc == 0)
        rc = arc;
    if (rc != 0 || (rc = reduce_read_results(run)) != 0)
        return rc;
    run->last_calls = tools_ok ? resp->tool_calls_len : 0;
    if (!tools_ok)
        loom__abandoned_forget(&run->abandoned);
    else if ((rc = loom__abandoned_check(&run->abandoned, run->id,
                                         resp->tool_calls,
                                         resp->tool_calls_len)) != 0)
        return rc;
    if (last && run->budget_why)
        return (rc = answer(run, resp)) != 0 ? rc : budget_finish(run, resp);
    if (last)
        return answer(run, resp);
    if (!run->last_calls) {
        if ((rc = no_calls(run, LOOM_NO_CALLS_GENERATED, NULL, 0, resp,
                           more)) != 0 ||
            !*more)
            return rc ? rc : answer(run, resp);
        run->index++;
        step(run, "continue");
        return 0;
    }
    if (hook_process_calls(run, resp))
        return (rc = finish_stop(resp)) != 0 ? rc : answer(run, resp);
    hook_tools_selected(run, resp);
    if ((rc = tool_turn(run, resp, &ended)) != 0)
        return rc;
    *more = !ended;
    return 0;
}

/* A restored run whose last message's calls have no results: runs
 * them as the turn that asked for them would have. */
LOOM_NOINLINE static int resume_tools(loom_run *run, int *more)
{
    const loom_message *a = &run->all.items[run->all.len - 1];
    loom_llm_response resp;
    int rc, ended = 0;

    memset(&resp, 0, sizeof(resp));
    run->resume_tools = 0;
    run->last_calls = a->tool_calls_len;
    resp.text = a->content;
    resp.tool_calls = a->tool_calls;
    resp.tool_calls_len = a->tool_calls_len;
    rc = turn_tools(run, &resp, &ended);
    /* Borrowed from the message. */
    resp.text = NULL;
    resp.tool_calls = NULL;
    resp.tool_calls_len = 0;
    loom_llm_response_clear(&resp);
    *more = !ended;
    return rc;
}

int loom_run_execute(loom_run *run)
{
    loom_llm_response resp;
    int rc = 0, limit_injected = 0, more = 1;

    memset(&resp, 0, sizeof(resp));
    if ((!run->cache && (rc = loom_llm_cache_new(&run->cache)) != 0) ||
        (rc = spend_open(run)) != 0)
        return rc;
    if (run->resumed) {
        run->status = LOOM_RUN_RUNNING;
    } else {
        emit_started(run);
        emit_reasoning_open(run);
    }
    hooks_init(run);
    if (run->resume_tools)
        rc = resume_tools(run, &more);
    while (more && rc == 0)
        rc = iterate(run, &resp, &limit_injected, &more);
    free(run->finish_reason);
    run->finish_reason = resp.finish_reason ? strdup(resp.finish_reason)
                                            : NULL;
    if (rc == 0 && run->opts.title.enabled && run->final_text)
        rc = title_run(run);
    if (rc == 0) {
        finish_completed(run);
    } else {
        /* Keep the message of the failure before other calls reset it. */
        char *msg = strdup(loom_error_last());
        keep_partial(run);
        loom__error_set(rc, "%s", msg ? msg : "run failed");
        free(msg);
        finish_failed(run, rc, &resp);
        if (run->status == LOOM_RUN_CANCELLED)
            rc = loom__error_set(LOOM_ECANCELED, "run cancelled");
        else
            loom__error_set(rc, "%s", run->error ? run->error : "");
    }
    loom_llm_response_clear(&resp);
    return rc;
}

void loom_run_cancel(loom_run *run)
{
    if (run)
        loom_cancel_set(&run->cancel);
}

int loom_run_approve(loom_run *run, const char *call_id, int approve,
                     const char *reason)
{
    int rc;

    if (!run || !call_id)
        return loom__error_set(LOOM_EINVALID, "approve: no run or call id");
    rc = loom__approvals_answer(run->approvals, call_id, approve, reason);
    if (rc == LOOM_ENOTFOUND)
        return loom__error_set(LOOM_ENOTFOUND,
                               "no call '%s' waits for approval in run %s",
                               call_id, run->id);
    return rc;
}

size_t loom_run_approvals_waiting(const loom_run *run)
{
    return run ? loom__approvals_waiting(run->approvals) : 0;
}

int loom__run_approval_waits(const loom_run *run, const char *call_id)
{
    return run && call_id && loom__approvals_has(run->approvals, call_id);
}

loom_run_status loom_run_status_get(const loom_run *run)
{
    return run->status;
}

const char *loom_run_id(const loom_run *run)
{
    return run->id;
}

const char *loom_run_text(const loom_run *run)
{
    return run->final_text ? run->final_text : "";
}

const loom_usage *loom_run_usage(const loom_run *run)
{
    return &run->usage;
}

int loom_run_cost_known(const loom_run *run)
{
    return run->priced_calls > 0 && run->unpriced_calls == 0;
}

int loom_run_iterations(const loom_run *run)
{
    return run->iterations;
}

const loom_messages *loom_run_messages(const loom_run *run)
{
    return &run->added;
}

const char *loom_run_message_agent(const loom_run *run, size_t i)
{
    return i < run->added.len ? run->added_agents[i] : NULL;
}

const char *loom_run_message_model(const loom_run *run, size_t i)
{
    return i < run->added.len ? run->added_models[i] : NULL;
}

const char *loom_run_agent(const loom_run *run)
{
    return run->opts.agent;
}

const loom_tool_call *loom_run_pending_calls(const loom_run *run, size_t *n)
{
    *n = run->npending;
    return run->npending ? run->pending : NULL;
}

const char *loom_run_finish_reason(const loom_run *run)
{
    return run->finish_reason;
}

const char *loom_run_title(const loom_run *run)
{
    return run->title;
}

const char *loom_run_model(const loom_run *run)
{
    return run->opts.model ? run->opts.model : run->opts.upstream_model;
}

const char *loom_run_summary(const loom_run *run, size_t *covers)
{
    if (covers)
        *covers = run->summary ? run->summary_covers : 0;
    return run->summary;
}

const json_t *loom_run_citations(const loom_run *run)
{
    return run->citations;
}

const char *loom_run_error(const loom_run *run)
{
    return run->error ? run->error : "";
}

const json_t *loom_run_plan(const loom_run *run)
{
    return loom__plan_get(run->plan);
}

const json_t *loom_run_tool_records(const loom_run *run)
{
    return loom__toolturn_records(run->turn);
}

const json_t *loom_run_documents(const loom_run *run)
{
    return loom__toolturn_documents(run->turn);
}

const json_t *loom_run_tools_abandoned_after_error(const loom_run *run)
{
    return run->abandoned.counts;
}

void loom_run_free(loom_run *run)
{
    if (!run)
        return;
    loom_messages_free(&run->all);
    loom_messages_free(&run->added);
    loom__spend_free(run->spend);
    loom__spend_free(run->parent_spend);
    free(run->id);
    free(run->conversation_id);
    free(run->defs);
    free(run->offered);
    loom_tool_registry_free(run->reg);
    for (size_t i = 0; i < run->npending; i++)
        loom_tool_call_clear(&run->pending[i]);
    free(run->pending);
    free(run->finish_reason);
    free(run->title);
    free(run->available);
    free(run->choice_fn);
    loom_buf_free(&run->text);
    loom_buf_free(&run->reduce);
    for (size_t i = 0; i < run->retired.len / sizeof(char *); i++)
        free(((char **)(void *)run->retired.ptr)[i]);
    loom_buf_free(&run->retired);
    free(run->call_offsets);
    free(run->final_text);
    free(run->answered_model);
    free(run->error);
    loom_llm_cache_free(run->cache);
    loom_context_free(run->ctx);
    free(run->stored);
    free(run->summary);
    free(run->obs_defs);
    loom__token_memo_free(&run->obs_memo);
    loom__citations_free(run->cites);
    json_decref(run->citations);
    free(run->hook_error);
    json_decref(run->completion_extra);
    loom__toolturn_free(run->turn);
    loom__approvals_free(run->approvals);
    loom__plan_free(run->plan);
    free(run->system_prev);
    free(run->sent);
    loom__media_fetcher_free(run->media);
    loom__agent_tree_free(run->tree);
    json_decref(run->kids_by_agent);
    free(run->end_note);
    free(run->alt_name);
    loom__abandoned_clear(&run->abandoned);
    if (run->hook_state_set && run->hooks->free_state)
        run->hooks->free_state(run->hook_state, run->hooks->payload);
    loom__handoffs_free(run->handoffs);
    handoff_drop(run);
    free(run->added_agents);
    free(run->added_models);
    for (size_t i = 0; i < run->nmodel_names; i++)
        free(run->model_names[i]);
    free(run->model_names);
    free(run);
}

void loom__run_set_place(loom_run *run, loom__agent_tree *tree, int depth,
                         int count_sub_calls, const loom_cancel *parent,
                         loom__spend *spend)
{
    loom__spend_free(run->parent_spend);
    run->parent_spend = loom__spend_ref(spend);
    loom__agent_tree_free(run->tree);
    run->tree = loom__agent_tree_ref(tree);
    run->place.tree = run->tree;
    run->place.depth = depth;
    run->place.run_id = run->id;
    run->place.agent = run->opts.agent;
    run->count_sub_calls = count_sub_calls;
    run->cancel.parent = parent;
}

/* The run's tool records, each marked with the run and agent it is of
 * (a child's records keep what their own run marked). */
static json_t *marked_records(const loom_run *run)
{
    const json_t *recs = loom__toolturn_records(run->turn);
    json_t *out = json_array();
    size_t i;
    json_t *r;

    json_array_foreach(recs, i, r)
    {
        json_t *c = json_copy(r);
        if (!c || !out) {
            json_decref(c);
            json_decref(out);
            return NULL;
        }
        if (!json_object_get(c, "run_id")) {
            json_object_set_new(c, "run_id", json_string(run->id));
            json_object_set_new(c, "agent", json_string(own_agent(run)));
        }
        json_array_append_new(out, c);
    }
    return out;
}

json_t *loom__run_report(const loom_run *run)
{
    json_t *by = by_agent_full(run);
    json_t *recs = run->turn ? marked_records(run) : json_array();
    pk p;

    if (!by || !recs) {
        json_decref(by);
        json_decref(recs);
        return NULL;
    }
    p = pk_new();
    pk_str(&p, "run_id", run->id);
    pk_str(&p, "agent", own_agent(run));
    pk_str(&p, "status", loom_run_status_name(run->status));
    pk_set(
        &p, "usage",
        loom__usage_full(&run->usage, run->priced_calls, run->unpriced_calls));
    pk_set(&p, "by_agent", by);
    pk_int(&p, "calls",
           (json_int_t)run->iterations + (json_int_t)run->tool_calls +
               (json_int_t)run->sub_counted);
    pk_set(&p, "records", recs);
    return pk_done(&p);
}

void loom__run_emit(loom_run *run, loom_event_type type, json_t *data)
{
    emit(run, type, data);
}

struct loom__citations *loom__run_citation_map(const loom_run *run)
{
    return run->cites;
}

int loom__run_complete_with(loom_run *run, const char *key, json_t *value)
{
    if (!value)
        return loom__error_oom();
    if ((!run->completion_extra && !(run->completion_extra = json_object())) ||
        json_object_set_new(run->completion_extra, key, value) != 0) {
        json_decref(value);
        return loom__error_oom();
    }
    return 0;
}

void loom__run_hook_fail(loom_run *run, const char *message)
{
    free(run->hook_error);
    run->hook_error = strdup(message ? message : "failed");
}

const char *loom__run_turn_text(const loom_run *run)
{
    return run->text.ptr ? run->text.ptr : "";
}

/* ---- resuming ------------------------------------------------------------ */

void loom__run_set_step(loom_run *run, loom__run_step_fn fn, void *payload)
{
    run->step_fn = fn;
    run->step_payload = payload;
}

size_t loom__run_base_len(const loom_run *run)
{
    return run->base_len;
}

const loom_message *loom__run_all_at(const loom_run *run, size_t i, int *own)
{
    if (i >= run->all.len)
        return NULL;
    *own = i < run->nstored && run->stored[i];
    return &run->all.items[i];
}

size_t loom__run_all_len(const loom_run *run)
{
    return run->all.len;
}

uint64_t loom__run_seq(const loom_run *run)
{
    return run->seq;
}

/* What the run's spend has spent and how long it has run, or NULL. */
static json_t *spend_json(const loom_run *run)
{
    int64_t micros, tokens, ms;

    if (!run->spend)
        return NULL;
    loom__spend_spent(run->spend, &micros, &tokens, &ms);
    return json_pack("{s:I,s:I,s:I}", "micros", (json_int_t)micros, "tokens",
                     (json_int_t)tokens, "ms", (json_int_t)ms);
}

json_t *loom__run_snapshot(const loom_run *run)
{
    json_t *docs = json_array(), *o;
    size_t n = run->cites ? loom__citations_count(run->cites) : 0;

    for (size_t i = 1; docs && i <= n; i++) {
        const loom__citation_doc *d = loom__citations_get(run->cites, i);
        if (!d ||
            json_array_append_new(
                docs, json_pack("{s:s?,s:s?,s:s?,s:s?,s:s?,s:s?}", "id", d->id,
                                "url", d->url, "title", d->title, "published",
                                d->published, "tool_call_id", d->tool_call_id,
                                "researcher", d->researcher)) != 0) {
            json_decref(docs);
            return NULL;
        }
    }
    o = json_pack(
        "{s:i,s:i,s:i,s:I,s:I,s:o,s:o,s:O?,s:i,s:i,s:o,s:I,s:o*}", "iterations",
        run->iterations, "think_turns", run->think_turns, "retries",
        run->retries, "index", (json_int_t)run->index, "tool_calls",
        (json_int_t)run->tool_calls, "usage",
        loom__usage_full(&run->usage, run->priced_calls, run->unpriced_calls),
        "kids_usage",
        loom__usage_full(&run->kids_usage, run->kids_priced,
                         run->kids_unpriced),
        "kids_by_agent", run->kids_by_agent, "sub_runs", run->sub_runs,
        "sub_counted", run->sub_counted, "citations", docs, "seq",
        (json_int_t)run->seq, "spend", spend_json(run));
    return o;
}

int loom__run_restore(loom_run *run, const json_t *snap,
                      const loom_messages *msgs, const unsigned char *own,
                      uint64_t seq)
{
    const json_t *docs = json_object_get(snap, "citations"), *d, *spend;
    size_t i;
    int rc = 0;

    for (i = 0; i < msgs->len && !rc; i++) {
        const loom_messages one = {(loom_message *)&msgs->items[i], 1, 1};
        if (own[i])
            rc = add_message(run, &one);
        else if ((rc = loom_messages_append(&run->all, &one)) == 0)
            rc = track(run, 0);
    }
    if (rc)
        return rc;
    run->iterations =
        (int)json_integer_value(json_object_get(snap, "iterations"));
    run->think_turns =
        (int)json_integer_value(json_object_get(snap, "think_turns"));
    run->retries = (int)json_integer_value(json_object_get(snap, "retries"));
    run->index = (uint32_t)json_integer_value(json_object_get(snap, "index"));
    run->tool_calls =
        (size_t)json_integer_value(json_object_get(snap, "tool_calls"));
    loom__usage_from_full(json_object_get(snap, "usage"), &run->usage,
                          &run->priced_calls, &run->unpriced_calls);
    loom__usage_from_full(json_object_get(snap, "kids_usage"), &run->kids_usage,
                          &run->kids_priced, &run->kids_unpriced);
    if (json_is_object(json_object_get(snap, "kids_by_agent"))) {
        json_decref(run->kids_by_agent);
        run->kids_by_agent =
            json_deep_copy(json_object_get(snap, "kids_by_agent"));
    }
    run->sub_runs = (int)json_integer_value(json_object_get(snap, "sub_runs"));
    run->sub_counted =
        (int)json_integer_value(json_object_get(snap, "sub_counted"));
    json_array_foreach(docs, i, d)
    {
        size_t num = 0;
        const char *call =
            json_string_value(json_object_get(d, "tool_call_id"));
        if (run->cites &&
            (rc = loom__citations_add(run->cites, d, call, &num)) != 0 &&
            rc != LOOM_EINVALID)
            return rc;
        rc = 0;
    }
    spend = json_object_get(snap, "spend");
    run->carry_micros =
        (int64_t)json_integer_value(json_object_get(spend, "micros"));
    run->carry_tokens =
        (int64_t)json_integer_value(json_object_get(spend, "tokens"));
    run->carry_ms = (int64_t)json_integer_value(json_object_get(spend, "ms"));
    run->seq = seq;
    run->resumed = 1;
    if (run->all.len > run->base_len) {
        const loom_message *last = &run->all.items[run->all.len - 1];
        run->resume_tools =
            last->role == LOOM_ROLE_ASSISTANT && last->tool_calls_len > 0;
    }
    return 0;
}
