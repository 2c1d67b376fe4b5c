/*
 * Research runs (research.h, docs/research.md): a supervisor that never
 * searches itself, but plans, sends researchers out in parallel, decides
 * when enough is known and has a cited report written.
 *
 * The supervisor is a run of loom's loop: every phase is one of its model
 * calls, shaped by this file's hooks. prepare_call says what the next
 * call is (the clarification check, the plan, a cycle with tool_choice
 * required, the report without tools) and forces the report at the start
 * of a cycle once the time, the cycles or the budget are spent;
 * on_no_tool_calls reads each phase's outcome; on_tools_selected counts
 * the cycle and announces parallel researchers; preprocess_tool_arguments
 * refuses research_agent calls past max_parallel_researchers or the
 * budget; special_tool renumbers a researcher's citations into the run's
 * one numbering and notes failures for the report. The loop does the
 * rest as for any run: streaming, tools in parallel, usage with the
 * researchers', citations checked against the sources really found, the
 * Sources list, storing.
 *
 * Threads: hooks run on the run's thread; research_agent calls run on
 * their own threads and hand their results to special_tool through
 * `done` under the mutex.
 */
#include "agent/research.h"
#include "agent/citations.h"
#include "agent/gate.h"
#include "agent/run_internal.h"
#include "agent/subagent.h"
#include "core/clock.h"
#include "core/error.h"
#include "loom/buf.h"
#include "loom/log.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NOTE_MAX (64 * 1024)
#define TASK_MAX (64 * 1024)
/* Model calls a research run may make at most: its own limits end it
 * long before (cycles, the one retry, free thinking turns). */
#define MAX_CALLS 200

#define NO_CLARIFICATION "NO_CLARIFICATION_NEEDED"

#define SUPERVISOR_PROMPT                                                      \
    "You lead a deep research effort. You never search yourself: you "         \
    "plan, send researchers out with research_agent (one focused task "        \
    "each; several calls in one turn run in parallel), think with "            \
    "think_tool when useful, and call generate_report once the findings "      \
    "answer the question well. Researchers' reports cite their sources "       \
    "as [n]; keep those numbers."

#define REASONING_PROMPT                                                       \
    "You lead a deep research effort. You never search yourself: you "         \
    "send researchers out with research_agent (one focused task each; "        \
    "several calls in one turn run in parallel) and call generate_report "     \
    "once the findings answer the question well. Researchers' reports "        \
    "cite their sources as [n]; keep those numbers."

#define CLARIFY_PROMPT                                                         \
    "Before any research starts: if the request is too ambiguous to "          \
    "research well, write one short clarifying question for the user and "     \
    "nothing else. Otherwise answer exactly " NO_CLARIFICATION "."

#define PLAN_PROMPT                                                            \
    "Write the research plan: the questions to answer and the research "       \
    "tasks that will answer them, as a short numbered list. Do not "           \
    "answer the question yet."

#define CYCLE_PROMPT                                                           \
    "Current date: %s. Research cycle %d of at most %d. Call "                 \
    "research_agent for the tasks still open, or generate_report when "        \
    "the findings suffice."

#define RETRY_PROMPT                                                           \
    "You must call a tool: research_agent to research a task, or "             \
    "generate_report. Call one now."

#define REPORT_PROMPT                                                          \
    "Write the final report now from the researchers' findings above, "        \
    "in markdown, for the user's question. Cite sources with their "           \
    "numbers as [n] right after the claims they support; cite only "           \
    "numbers given above and never invent one. Do not write a list of "        \
    "sources: it is added for you."

typedef enum { PH_CLARIFY = 0, PH_PLAN, PH_CYCLE, PH_REPORT } phase;

/* A research_agent call's outcome, from its thread to special_tool. */
typedef struct done_call {
    struct done_call *next;
    char *call_id;
    char *task;
    char *text;        /* the report; NULL: failed */
    json_t *citations; /* the researcher's cited sources */
} done_call;

struct loom__research {
    loom_session *s; /* borrowed: the turn holds it */
    loom_tool_registry *reg;
    loom_agent_hooks hooks;
    /* settings */
    char *model, *researcher_model;
    int max_cycles, parallel, searches, clarify;
    long report_tokens, time_limit_s, max_tokens;
    int64_t max_cost;
    char **rtools; /* researcher tool names, NULL-ended */
    size_t nrtools;
    int reasoning;
    char *prompt;
    const char *non_iterative[1];
    /* the run's state (its thread) */
    int64_t started_ms;
    phase ph;
    int cycle;   /* cycles counted */
    int retried; /* the one retry of cycle 1 */
    int turn_calls, turn_started, researchers, failed;
    long turn_base; /* the run's tokens when the last turn's calls began */
    int turn_ran;   /* researchers that turn started */
    long biggest_researcher, biggest_call;
    const char *reason;
    char *instructions;
    loom_buf notes;
    /* research_agent outcomes (any thread) */
    pthread_mutex_t mu;
    done_call *done;
    /* Under mu: each researcher started, for the run's status
     * ({call_id, task, status, sources, started_ms, elapsed_ms}), and
     * whether the report is written. */
    json_t *rs;
    int finished;
    /* Kept in the store as it goes (loom__research_keep; store NULL:
     * not kept): the run's id, the run's messages stored so far (up to
     * run->all's index upto, kept_msgs of them), whether the plan is;
     * when resumed, the researchers that had ended (call_id -> their
     * row), whose calls answer from it, and the time run before. */
    loom_store *store;
    char *run_id;
    size_t upto;
    int64_t kept_msgs;
    int plan_kept;
    char *plan_text;
    json_t *replay;
    int64_t elapsed_before;
    int resumed;
};

/* ---- settings ------------------------------------------------------------ */

static const char *const override_keys[] = {"model",
                                            "researcher_model",
                                            "max_cycles",
                                            "max_cycles_reasoning",
                                            "max_parallel_researchers",
                                            "researcher_max_searches",
                                            "report_max_tokens",
                                            "time_limit_s",
                                            "clarify",
                                            "min_context_tokens",
                                            "researcher_tools",
                                            "max_cost_usd",
                                            "max_tokens",
                                            NULL};

/* A positive integer override in [lo, hi], or 0 when absent. */
static int int_key(const json_t *o, const char *key, long lo, long hi,
                   long *out)
{
    const json_t *v = json_object_get(o, key);

    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < lo ||
        json_integer_value(v) > hi)
        return loom__error_set(LOOM_EINVALID,
                               "research.%s: must be an integer from %ld to "
                               "%ld",
                               key, lo, hi);
    *out = (long)json_integer_value(v);
    return 0;
}

int loom__research_check_overrides(const json_t *o)
{
    const char *key;
    json_t *v;
    long x;
    int rc = 0;

    if (!o)
        return 0;
    if (!json_is_object(o))
        return loom__error_set(LOOM_EINVALID, "research: must be an object");
    json_object_foreach((json_t *)o, key, v)
    {
        size_t i = 0;
        while (override_keys[i] && strcmp(override_keys[i], key) != 0)
            i++;
        if (!override_keys[i])
            return loom__error_set(LOOM_EINVALID,
                                   "research.%s: unknown key (see "
                                   "docs/research.md)",
                                   key);
    }
    if ((rc = int_key(o, "max_cycles", 1, 100, &x)) ||
        (rc = int_key(o, "max_cycles_reasoning", 1, 100, &x)) ||
        (rc = int_key(o, "max_parallel_researchers", 1, 64, &x)) ||
        (rc = int_key(o, "researcher_max_searches", 1, 50, &x)) ||
        (rc = int_key(o, "report_max_tokens", 100, 1000000000L, &x)) ||
        (rc = int_key(o, "time_limit_s", 1, 7L * 86400, &x)) ||
        (rc = int_key(o, "min_context_tokens", 0, 1000000000L, &x)) ||
        (rc = int_key(o, "max_tokens", 0, 1L << 40, &x)))
        return rc;
    v = json_object_get(o, "clarify");
    if (v && !json_is_boolean(v))
        return loom__error_set(LOOM_EINVALID, "research.clarify: must be "
                                              "true or false");
    v = json_object_get(o, "max_cost_usd");
    if (v && (!json_is_number(v) || json_number_value(v) < 0))
        return loom__error_set(LOOM_EINVALID, "research.max_cost_usd: must "
                                              "be a number of dollars >= 0");
    for (const char *const *k =
             (const char *const[]){"model", "researcher_model", NULL};
         *k; k++)
        if ((v = json_object_get(o, *k)) && !json_is_string(v))
            return loom__error_set(LOOM_EINVALID,
                                   "research.%s: must be a model name", *k);
    v = json_object_get(o, "researcher_tools");
    if (v) {
        size_t i;
        json_t *t;
        if (!json_is_array(v))
            return loom__error_set(LOOM_EINVALID, "research.researcher_tools:"
                                                  " must be a list of tool "
                                                  "names");
        json_array_foreach(v, i, t) if (
            !json_is_string(t)) return loom__error_set(LOOM_EINVALID,
                                                       "research.researcher_"
                                                       "tools[%zu]: must be "
                                                       "a tool name",
                                                       i);
    }
    return 0;
}

static int dup_opt(char **out, const char *s)
{
    *out = NULL;
    return s && !(*out = strdup(s)) ? loom__error_oom() : 0;
}

/* The researcher's tools: web_search, web_fetch and the extra ones. */
static int researcher_tools(loom__research *r, const loom_research_config *c,
                            const json_t *o)
{
    const json_t *list = json_object_get(o, "researcher_tools");
    size_t n = list ? json_array_size(list) : c->researcher_tools_len;

    if (!n)
        return 0;
    if (!(r->rtools = calloc(n + 3, sizeof(*r->rtools))))
        return loom__error_oom();
    r->rtools[r->nrtools++] = strdup("web_search");
    r->rtools[r->nrtools++] = strdup("web_fetch");
    for (size_t i = 0; i < n; i++)
        r->rtools[r->nrtools++] =
            strdup(list ? json_string_value(json_array_get(list, i))
                        : c->researcher_tools[i]);
    for (size_t i = 0; i < r->nrtools; i++)
        if (!r->rtools[i])
            return loom__error_oom();
    return 0;
}

static int settings(loom__research *r, const loom_research_config *c,
                    const json_t *o, const loom_run_budget *b, long window)
{
    long cycles = c->max_cycles, cycles_r = c->max_cycles_reasoning;
    long par = c->max_parallel_researchers, srch = c->researcher_max_searches;
    long min_ctx = c->min_context_tokens;
    const json_t *v;
    int rc;

    r->report_tokens = c->report_max_tokens;
    r->time_limit_s = c->time_limit_s;
    r->max_tokens = c->max_tokens;
    r->max_cost = c->max_cost_micros;
    r->clarify = c->clarify;
    if ((rc = loom__research_check_overrides(o)) != 0)
        return rc;
    (void)int_key(o, "max_cycles", 1, 100, &cycles);
    (void)int_key(o, "max_cycles_reasoning", 1, 100, &cycles_r);
    (void)int_key(o, "max_parallel_researchers", 1, 64, &par);
    (void)int_key(o, "researcher_max_searches", 1, 50, &srch);
    (void)int_key(o, "report_max_tokens", 100, 1000000000L, &r->report_tokens);
    (void)int_key(o, "time_limit_s", 1, 7L * 86400, &r->time_limit_s);
    (void)int_key(o, "min_context_tokens", 0, 1000000000L, &min_ctx);
    (void)int_key(o, "max_tokens", 0, 1L << 40, &r->max_tokens);
    if ((v = json_object_get(o, "clarify")))
        r->clarify = json_is_true(v);
    if ((v = json_object_get(o, "max_cost_usd")))
        r->max_cost = (int64_t)(json_number_value(v) * 1e6 + 0.5);
    /* The run's own budget (a request's, an agent's) holds as well: the
     * tighter one is the research's, so the report is written from what
     * exists before the run's budget would refuse a call. */
    if (b->max_tokens > 0 && (!r->max_tokens || b->max_tokens < r->max_tokens))
        r->max_tokens = b->max_tokens;
    if (b->max_cost_micros > 0 &&
        (!r->max_cost || b->max_cost_micros < r->max_cost))
        r->max_cost = b->max_cost_micros;
    r->max_cycles = (int)(r->reasoning ? cycles_r : cycles);
    r->parallel = (int)par;
    r->searches = (int)srch;
    if (window > 0 && window < min_ctx)
        return loom__error_set(LOOM_EINVALID,
                               "research needs a model with a context window "
                               "of at least %ld tokens (research."
                               "min_context_tokens); this one has %ld",
                               min_ctx, window);
    v = json_object_get(o, "model");
    if ((rc = dup_opt(&r->model, v ? json_string_value(v) : c->model)) != 0)
        return rc;
    v = json_object_get(o, "researcher_model");
    if ((rc = dup_opt(&r->researcher_model,
                      v ? json_string_value(v) : c->researcher_model)) != 0)
        return rc;
    return researcher_tools(r, c, o);
}

/* ---- kept in the store -------------------------------------------------- */

static const char *phase_name(const loom__research *r)
{
    static const char *const names[] = {"clarify", "plan", "research",
                                        "report"};

    return r->finished ? "done" : names[r->ph];
}

typedef struct {
    loom_store *st;
    loom_store_research_write *w;
} put_arg;

static int op_put(void *arg)
{
    put_arg *a = arg;

    return loom_store_research_put(a->st, a->w);
}

/* Writes w for the run (retrying a busy store); 0, or the error, which
 * is logged: the run goes on, and would resume from the step before. */
static int put(loom__research *r, loom_store_research_write *w)
{
    put_arg a = {r->store, w};
    int rc;

    w->run_id = r->run_id;
    if ((rc = loom_session_store_retry(r->s, op_put, &a, "save_research")))
        loom_warn("research run %s: cannot store its progress: %s", r->run_id,
                  loom_error_last());
    return rc;
}

/* The researcher entry of call_id in r->rs (mu held), or NULL. */
static json_t *entry(loom__research *r, const char *call_id)
{
    size_t i;
    json_t *e;

    json_array_foreach(r->rs, i, e)
    {
        const char *id = json_string_value(json_object_get(e, "call_id"));
        if (id && call_id && strcmp(id, call_id) == 0)
            return e;
    }
    return NULL;
}

/* Writes a researcher's row: e (its entry) with what more holds. */
static void put_researcher(loom__research *r, const json_t *e, json_t *more)
{
    loom_store_research_write w;
    json_t *row = json_deep_copy(e);
    char *text;

    memset(&w, 0, sizeof(w));
    if (row)
        json_object_del(row, "started_ms");
    if (row && more)
        json_object_update(row, more);
    json_decref(more);
    if (!row || !(text = json_dumps(row, JSON_COMPACT))) {
        json_decref(row);
        return;
    }
    w.researcher = text;
    (void)put(r, &w);
    free(text);
    json_decref(row);
}

/* A research_agent call accepted (the run's thread): its researcher is
 * running. */
static void track_start(loom__research *r, const loom_tool_call *call)
{
    json_t *a = json_loads(call->arguments ? call->arguments : "{}", 0, NULL);
    const char *task = json_string_value(json_object_get(a, "task"));
    json_t *e, *copy = NULL;

    pthread_mutex_lock(&r->mu);
    if (!(e = entry(r, call->id))) {
        e = json_pack("{s:s,s:s,s:s,s:i,s:I,s:I}", "call_id",
                      call->id ? call->id : "", "task", task ? task : "",
                      "status", "running", "sources", 0, "started_ms",
                      (json_int_t)loom__mono_ms(), "elapsed_ms", (json_int_t)0);
        if (e && json_array_append_new(r->rs, e) != 0)
            e = NULL;
    } else {
        (void)json_object_set_new(e, "status", json_string("running"));
        (void)json_object_set_new(e, "started_ms",
                                  json_integer(loom__mono_ms()));
    }
    if (e && r->store && !json_object_get(r->replay, call->id ? call->id : ""))
        copy = json_deep_copy(e);
    pthread_mutex_unlock(&r->mu);
    json_decref(a);
    if (copy)
        put_researcher(r, copy, NULL);
    json_decref(copy);
}

/* A researcher ended (its call's thread): its entry says how, and its
 * row keeps its result, citations, documents and report (usage). */
static void track_end(loom__research *r, const loom_tool_ctx *ctx,
                      const char *task, const loom_run *run, int ok,
                      const char *result)
{
    const json_t *docs = run ? loom_run_documents(run) : NULL;
    const json_t *cites = run ? loom_run_citations(run) : NULL;
    const json_t *report = ctx->host ? ctx->host->report : NULL;
    json_t *e, *copy = NULL;

    pthread_mutex_lock(&r->mu);
    if ((e = entry(r, ctx->call_id))) {
        (void)json_object_set_new(e, "status",
                                  json_string(ok ? "completed" : "failed"));
        (void)json_object_set_new(
            e, "sources", json_integer((json_int_t)json_array_size(docs)));
        (void)json_object_set_new(
            e, "elapsed_ms",
            json_integer(loom__mono_ms() -
                         json_integer_value(json_object_get(e, "started_ms"))));
        if (r->store)
            copy = json_deep_copy(e);
    }
    pthread_mutex_unlock(&r->mu);
    if (!copy)
        return;
    put_researcher(r, copy,
                   json_pack("{s:s,s:s,s:O?,s:O?,s:O?}", "task", task, "result",
                             result ? result : "", "citations", cites,
                             "documents", docs, "report", report));
    json_decref(copy);
}

static void keep_done_text(loom__research *r, const char *call_id,
                           const char *task, const char *text,
                           const json_t *citations);

/*
 * A resumed run's call whose researcher had ended before the stop: it
 * answers from the researcher's row (no model call), as the researcher
 * did: its result, report (usage) and documents. 1 when so (*rc: the
 * call's answer), 0 when the call must run.
 */
static int replay(loom__research *r, const char *task, const loom_tool_ctx *ctx,
                  loom_buf *out, int *rc)
{
    const json_t *row =
        json_object_get(r->replay, ctx->call_id ? ctx->call_id : "");
    const json_t *docs, *d, *report;
    const char *result;
    int ok;
    json_t *e;
    size_t i;

    if (!row)
        return 0;
    ok =
        !strcmp(json_string_value(json_object_get(row, "status")), "completed");
    result = json_string_value(json_object_get(row, "result"));
    loom_buf_clear(out);
    *rc = loom_buf_printf(out, "%s", result ? result : "");
    report = json_object_get(row, "report");
    if (ctx->host && json_is_object(report)) {
        loom_usage u;
        int priced, unpriced;
        json_decref(ctx->host->report);
        ctx->host->report = json_deep_copy(report);
        /* What it spent before the stop is spent: the run's budget
         * counts it again, as the run's usage does. */
        loom__usage_from_full(json_object_get(report, "usage"), &u, &priced,
                              &unpriced);
        if (ctx->host->spend)
            loom__spend_carry(ctx->host->spend, u.cost_micros, u.total_tokens,
                              0);
    }
    docs = json_object_get(row, "documents");
    json_array_foreach(docs, i, d)
    {
        if (!ctx->documents ||
            json_array_size(ctx->documents) >= LOOM_TOOL_DOCUMENTS_MAX)
            break;
        json_array_append(ctx->documents, (json_t *)d);
    }
    keep_done_text(r, ctx->call_id, task, ok ? result : NULL,
                   json_object_get(row, "citations"));
    pthread_mutex_lock(&r->mu);
    if ((e = entry(r, ctx->call_id))) {
        (void)json_object_set_new(e, "status",
                                  json_string(ok ? "completed" : "failed"));
        (void)json_object_set(e, "sources", json_object_get(row, "sources"));
        (void)json_object_set(e, "elapsed_ms",
                              json_object_get(row, "elapsed_ms"));
    }
    pthread_mutex_unlock(&r->mu);
    if (!*rc && !ok)
        *rc = LOOM_ERROR;
    return 1;
}

/* ---- the tools ----------------------------------------------------------- */

static void done_free(done_call *d)
{
    if (!d)
        return;
    free(d->call_id);
    free(d->task);
    free(d->text);
    json_decref(d->citations);
    free(d);
}

/* Hands a call's outcome to special_tool (best effort: without it the
 * result stays as the researcher wrote it): text NULL, failed. */
static void keep_done_text(loom__research *r, const char *call_id,
                           const char *task, const char *text,
                           const json_t *citations)
{
    done_call *d = calloc(1, sizeof(*d));

    if (!d || !(d->call_id = strdup(call_id ? call_id : "")) ||
        !(d->task = strdup(task)) || (text && !(d->text = strdup(text)))) {
        done_free(d);
        return;
    }
    if (text && citations)
        d->citations = json_deep_copy(citations);
    pthread_mutex_lock(&r->mu);
    d->next = r->done;
    r->done = d;
    pthread_mutex_unlock(&r->mu);
}

static void keep_done(loom__research *r, const char *call_id, const char *task,
                      const loom_run *run, int ok)
{
    keep_done_text(r, call_id, task, ok ? loom_run_text(run) : NULL,
                   ok ? loom_run_citations(run) : NULL);
}

static done_call *take_done(loom__research *r, const char *call_id)
{
    done_call **p, *d = NULL;

    pthread_mutex_lock(&r->mu);
    for (p = &r->done; *p; p = &(*p)->next)
        if (strcmp((*p)->call_id, call_id ? call_id : "") == 0) {
            d = *p;
            *p = d->next;
            break;
        }
    pthread_mutex_unlock(&r->mu);
    return d;
}

/* research_agent {task}: one researcher sub-agent on the task. */
static int research_agent(const json_t *args, const loom_tool_ctx *ctx,
                          loom_buf *out, void *payload)
{
    loom__research *r = payload;
    const char *task = json_string_value(json_object_get(args, "task"));
    loom_turn_options o = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    loom_turn *t = NULL;
    const loom_run *run;
    int rc, crc;

    if (!task || !*task || strlen(task) > TASK_MAX) {
        loom_buf_clear(out);
        (void)loom_buf_printf(out, "research_agent needs a task (a string "
                                   "of at most 64 KiB)");
        return LOOM_EINVALID;
    }
    if (replay(r, task, ctx, out, &rc))
        return rc;
    if ((rc = loom_messages_add(&in, LOOM_ROLE_USER, task)) != 0)
        return rc;
    o.agent = LOOM_RESEARCHER_AGENT;
    o.model = r->researcher_model;
    o.max_iterations = r->searches + 1;
    o.max_output_tokens = r->report_tokens;
    o.input = &in;
    if (r->nrtools) {
        o.tool_names = (const char *const *)r->rtools;
        o.tool_names_len = r->nrtools;
        o.tool_names_set = 1;
    }
    rc = loom__sub_run(ctx, r->s, 0, &o, out, &t, &crc);
    loom_messages_free(&in);
    if (rc != 0)
        return rc;
    run = loom_turn_run(t);
    if (crc == 0 && run) {
        keep_done(r, ctx->call_id, task, run, 1);
        loom_buf_clear(out);
        rc = loom_buf_printf(out, "%s", loom_run_text(run));
    } else {
        keep_done(r, ctx->call_id, task, run, 0);
        rc = loom__sub_failure(out, LOOM_RESEARCHER_AGENT, t, crc);
    }
    /* A researcher stopped by the run's own stop is not over: it runs
     * again when the run resumes. */
    if (crc != LOOM_ECANCELED && !loom_cancel_is_set(ctx->cancel))
        track_end(r, ctx, task, run, rc == 0, loom_buf_cstr(out));
    loom_turn_free(t);
    return rc;
}

int loom__research_tool_is_agent(const loom_tool *tool)
{
    return tool && tool->execute == research_agent;
}

static int think_tool(const json_t *args, const loom_tool_ctx *ctx,
                      loom_buf *out, void *payload)
{
    (void)args;
    (void)ctx;
    (void)payload;
    return loom_buf_printf(out, "Acknowledged, please continue.");
}

static int generate_report(const json_t *args, const loom_tool_ctx *ctx,
                           loom_buf *out, void *payload)
{
    (void)args;
    (void)ctx;
    (void)payload;
    return loom_buf_printf(out, "The report is written next.");
}

static int add_tool(loom_tool_registry *reg, const char *name, const char *desc,
                    const char *schema, loom_tool_execute_fn fn, void *payload)
{
    loom_tool t = LOOM_TOOL_INIT;
    json_t *params = json_loads(schema, 0, NULL);
    int rc;

    if (!params)
        return loom__error_oom();
    t.name = name;
    t.description = desc;
    t.parameters = params;
    t.execute = fn;
    t.payload = payload;
    rc = loom_tool_registry_add(reg, &t);
    json_decref(params);
    return rc;
}

static int make_tools(loom__research *r)
{
    int rc;

    if ((rc = loom_tool_registry_new(&r->reg)) != 0)
        return rc;
    if ((rc = add_tool(
             r->reg, "research_agent",
             "Sends a researcher out on one focused research task; it "
             "searches and reads the web and returns a report citing its "
             "sources as [n].",
             "{\"type\":\"object\",\"properties\":{\"task\":{\"type\":"
             "\"string\",\"description\":\"The task, with what the "
             "researcher needs to know.\"}},\"required\":[\"task\"]}",
             research_agent, r)) != 0 ||
        (rc = add_tool(r->reg, "generate_report",
                       "Ends the research: the final report is written "
                       "from the findings.",
                       "{\"type\":\"object\",\"properties\":{\"instructions\":"
                       "{\"type\":\"string\",\"description\":\"What the "
                       "report should stress (optional).\"}}}",
                       generate_report, r)) != 0)
        return rc;
    if (r->reasoning)
        return 0;
    return add_tool(r->reg, "think_tool",
                    "Think about the findings and the next step; costs no "
                    "research cycle.",
                    "{\"type\":\"object\",\"properties\":{\"thought\":{"
                    "\"type\":\"string\"}},\"required\":[\"thought\"]}",
                    think_tool, r);
}

/* ---- the hooks ----------------------------------------------------------- */

static loom_run *run_of(const loom_agent_state *st)
{
    /* The hooks of research.c are the run's own code. */
    return (loom_run *)st->run;
}

/* What the run spent so far, and whether one more unit of est tokens
 * would pass the budget. */
static int over_budget(const loom__research *r, const loom_run *run, long more)
{
    const loom_usage *u = loom_run_usage(run);
    long spent = u->total_tokens;

    if (r->max_tokens > 0 && spent + more > r->max_tokens)
        return 1;
    if (r->max_cost > 0 && spent > 0 && loom_run_cost_known(run)) {
        int64_t est = u->cost_micros + u->cost_micros * more / spent;
        if (est > r->max_cost)
            return 1;
    }
    return 0;
}

/* The worst a supervisor call and a researcher may spend, from the
 * biggest seen so far (before any: the report limit). */
static long call_estimate(const loom__research *r)
{
    return r->biggest_call > 0 ? r->biggest_call : r->report_tokens;
}

static long researcher_estimate(const loom__research *r)
{
    return r->biggest_researcher > 0
               ? r->biggest_researcher
               : (long)(r->searches + 1) * r->report_tokens;
}

/*
 * What loom__research_status reads from another thread (the phase, the
 * cycle, the researchers' list, resumed) is written under r->mu; the run's
 * own thread reads them without it.
 */
static void set_phase(loom__research *r, phase ph)
{
    pthread_mutex_lock(&r->mu);
    r->ph = ph;
    pthread_mutex_unlock(&r->mu);
}

static void force_report(loom__research *r, const char *reason)
{
    set_phase(r, PH_REPORT);
    r->reason = reason;
}

static int holds_answer(const loom_messages *m)
{
    for (size_t i = 0; i < m->len; i++)
        if (m->items[i].role == LOOM_ROLE_ASSISTANT)
            return 1;
    return 0;
}

static void prepare_call(const loom_agent_state *st, loom_call_setup *call,
                         void *payload)
{
    loom__research *r = payload;
    loom_run *run = run_of(st);
    char date[32];
    time_t now = time(NULL);
    struct tm tm;

    if (r->turn_ran > 0) {
        /* What the last turn's researchers spent, each: the estimate of
         * the next ones keeps the biggest. */
        long each =
            (loom_run_usage(run)->total_tokens - r->turn_base) / r->turn_ran;
        if (each > r->biggest_researcher)
            r->biggest_researcher = each;
        r->turn_ran = 0;
    }
    if (st->iteration == 0) {
        r->started_ms = loom__mono_ms();
        set_phase(r, r->clarify && !holds_answer(st->messages) ? PH_CLARIFY
                                                               : PH_PLAN);
    }
    if (r->ph == PH_CYCLE && st->iteration > 0) {
        if (loom__mono_ms() - r->started_ms >= r->time_limit_s * 1000)
            force_report(r, "time_limit");
        else if (r->cycle >= r->max_cycles)
            force_report(r, "cycle_limit");
        else if (over_budget(r, run, call_estimate(r)))
            force_report(r, "budget");
    }
    switch (r->ph) {
    case PH_CLARIFY:
        call->tools = 0;
        call->text_event = -1;
        (void)loom_buf_printf(call->note, "%s", CLARIFY_PROMPT);
        return;
    case PH_PLAN:
        call->tools = 0;
        call->text_event = LOOM_EV_RESEARCH_PLAN;
        (void)loom_buf_printf(call->note, "%s", PLAN_PROMPT);
        return;
    case PH_CYCLE:
        gmtime_r(&now, &tm);
        strftime(date, sizeof(date), "%Y-%m-%d", &tm);
        call->tool_required = 1;
        call->text_event = LOOM_EV_REASONING_DELTA;
        (void)loom_buf_printf(call->note, CYCLE_PROMPT, date, r->cycle + 1,
                              r->max_cycles);
        loom__run_emit(run, LOOM_EV_RESEARCH_CYCLE,
                       json_pack("{s:i,s:i}", "cycle", r->cycle + 1,
                                 "max_cycles", r->max_cycles));
        return;
    case PH_REPORT:
        call->tools = 0;
        call->max_output_tokens = r->report_tokens;
        (void)loom_buf_printf(call->note, "%s", REPORT_PROMPT);
        if (r->instructions)
            (void)loom_buf_printf(call->note, "\n\nInstructions: %s",
                                  r->instructions);
        return;
    }
}

/* The run.completed fields of a research run. */
static void complete(loom__research *r, loom_run *run)
{
    (void)loom__run_complete_with(
        run, "research",
        json_pack("{s:i,s:i,s:i,s:i}", "cycles", r->cycle, "max_cycles",
                  r->max_cycles, "researchers", r->researchers, "failed",
                  r->failed));
    if (r->reason)
        (void)loom__run_complete_with(run, "report_reason",
                                      json_string(r->reason));
}

static int on_no_tool_calls(const loom_agent_state *st,
                            loom_no_calls_reason reason,
                            const loom_tool_call *calls, size_t ncalls,
                            loom_buf *message, void *payload)
{
    loom__research *r = payload;
    loom_run *run = run_of(st);
    const char *text = loom__run_turn_text(run);

    (void)calls;
    (void)ncalls;
    if (reason != LOOM_NO_CALLS_GENERATED)
        return 0;
    switch (r->ph) {
    case PH_CLARIFY:
        if (!*text || strstr(text, NO_CLARIFICATION)) {
            set_phase(r, PH_PLAN);
            return 1;
        }
        /* The question is the answer; its text was not streamed. */
        loom__run_emit(run, LOOM_EV_MESSAGE_DELTA,
                       json_pack("{s:s}", "delta", text));
        (void)loom__run_complete_with(run, "status",
                                      json_string("needs_input"));
        (void)loom__run_complete_with(
            run, "research", json_pack("{s:s}", "phase", "clarification"));
        return 0;
    case PH_PLAN:
        free(r->plan_text);
        r->plan_text = strdup(text);
        set_phase(r, PH_CYCLE);
        return 1;
    case PH_CYCLE:
        if (r->cycle == 0 && !r->retried) {
            r->retried = 1;
            (void)loom_buf_printf(message, "%s", RETRY_PROMPT);
            return 1;
        }
        if (r->cycle == 0) {
            loom__run_hook_fail(run, "research failed: the supervisor model "
                                     "called no tool in its first cycle, "
                                     "even when asked again");
            return 0;
        }
        force_report(r, "no_tool_calls");
        return 1;
    case PH_REPORT:
        pthread_mutex_lock(&r->mu);
        r->finished = 1;
        pthread_mutex_unlock(&r->mu);
        complete(r, run);
        if (r->notes.len)
            (void)loom_buf_printf(message, "\n\n## Notes\n%s",
                                  loom_buf_cstr(&r->notes));
        return 0;
    }
    return 0;
}

static void on_tools_selected(const loom_agent_state *st,
                              const loom_tool_call *calls, size_t n,
                              void *payload)
{
    loom__research *r = payload;
    loom_run *run = run_of(st);
    int counts = 0;

    r->turn_calls = 0;
    r->turn_started = 0;
    r->turn_base = loom_run_usage(run)->total_tokens;
    for (size_t i = 0; i < n; i++) {
        const char *name = calls[i].name;
        if (strcmp(name, "research_agent") == 0) {
            r->turn_calls++;
            counts = 1;
        } else if (strcmp(name, "generate_report") == 0) {
            json_t *a = json_loads(
                calls[i].arguments ? calls[i].arguments : "{}", 0, NULL);
            const char *ins =
                json_string_value(json_object_get(a, "instructions"));
            free(r->instructions);
            r->instructions = ins && *ins ? strdup(ins) : NULL;
            json_decref(a);
            counts = 1;
            force_report(r, "requested");
        } else if (strcmp(name, "think_tool") == 0) {
            json_t *a = json_loads(
                calls[i].arguments ? calls[i].arguments : "{}", 0, NULL);
            const char *th = json_string_value(json_object_get(a, "thought"));
            if (th)
                loom__run_emit(run, LOOM_EV_REASONING_DELTA,
                               json_pack("{s:s}", "delta", th));
            json_decref(a);
        } else {
            counts = 1;
        }
    }
    if (counts) {
        pthread_mutex_lock(&r->mu);
        r->cycle++;
        pthread_mutex_unlock(&r->mu);
    }
    if (r->turn_calls > 1)
        loom__run_emit(
            run, LOOM_EV_RESEARCH_BRANCH,
            json_pack("{s:i,s:i,s:i}", "cycle", r->cycle, "researchers",
                      r->turn_calls < r->parallel ? r->turn_calls : r->parallel,
                      "calls", r->turn_calls));
}

static loom_args_action preprocess(const loom_agent_state *st,
                                   const loom_tool_call *call, json_t **args,
                                   loom_buf *error, void *payload)
{
    loom__research *r = payload;
    long reserved;

    (void)args;
    if (strcmp(call->name, "research_agent") != 0)
        return LOOM_ARGS_DEFAULT;
    if (r->turn_started >= r->parallel) {
        (void)loom_buf_printf(
            error,
            "not run: at most %d research_agent calls run in one cycle "
            "(max_parallel_researchers). Call it again in the next cycle "
            "if it is still needed.",
            r->parallel);
        return LOOM_ARGS_FAIL;
    }
    reserved = (long)(r->turn_started + 1) * researcher_estimate(r);
    /* A researcher that had ended before a stop answers from its row at
     * no cost: the budget let it run then. */
    if (!json_object_get(r->replay, call->id ? call->id : "") &&
        over_budget(r, st->run, reserved)) {
        (void)loom_buf_printf(error, "not run: the research budget would be "
                                     "passed. The report is written from "
                                     "what was found.");
        force_report(r, "budget");
        return LOOM_ARGS_FAIL;
    }
    r->turn_started++;
    r->turn_ran++;
    r->researchers++;
    track_start(r, call);
    return LOOM_ARGS_DEFAULT;
}

/* Rewrites the researcher's [n] to the run's numbers (map: its sources'
 * numbers by its own). */
static char *renumber(const char *text, const size_t *map, size_t nmap)
{
    loom_buf b = LOOM_BUF_INIT(4 * strlen(text) + 64);
    const char *p = text;

    while (*p) {
        size_t n = 0, k = 0;
        if (*p == '[') {
            while (k < 3 && p[1 + k] >= '0' && p[1 + k] <= '9') {
                n = n * 10 + (size_t)(p[1 + k] - '0');
                k++;
            }
            if (k && p[1 + k] == ']' && n > 0 && n <= nmap && map[n - 1]) {
                if (loom_buf_printf(&b, "[%zu]", map[n - 1]) != 0)
                    break;
                p += k + 2;
                continue;
            }
        }
        if (loom_buf_putc(&b, *p) != 0)
            break;
        p++;
    }
    if (*p) {
        loom_buf_free(&b);
        return NULL;
    }
    return b.ptr ? loom_buf_detach(&b) : strdup("");
}

/* A researcher's result: its sources numbered in the run's map (the
 * annotation after the result shows the same numbers) and its markers
 * rewritten to them; a failure goes to the report's notes. */
static void special_tool(const loom_agent_state *st, const loom_tool_call *call,
                         int failed, const char *result, loom_special_tool *out,
                         void *payload)
{
    loom__research *r = payload;
    struct loom__citations *map = loom__run_citation_map(st->run);
    done_call *d;
    size_t *nums = NULL, nmax = 0, i;
    json_t *c;
    char *text;

    if (strcmp(call->name, "research_agent") != 0)
        return;
    d = take_done(r, call->id);
    if (failed) {
        r->failed++;
        (void)loom_buf_printf(
            &r->notes, "- A researcher failed%s%s%s: %.300s\n",
            d ? " on \"" : "", d ? d->task : "", d ? "\"" : "", result);
        done_free(d);
        return;
    }
    if (!d || !map || !d->text) {
        done_free(d);
        return;
    }
    json_array_foreach(d->citations, i, c)
    {
        size_t n = (size_t)json_integer_value(json_object_get(c, "number"));
        if (n > nmax)
            nmax = n;
    }
    if (nmax && nmax < 1000 && (nums = calloc(nmax, sizeof(*nums)))) {
        json_array_foreach(d->citations, i, c)
        {
            size_t n = (size_t)json_integer_value(json_object_get(c, "number"));
            size_t g = 0;
            /* Which researcher found it, for the citation events. */
            (void)json_object_set_new(c, "researcher", json_string(d->task));
            if (n && loom__citations_add(map, c, call->id, &g) == 0)
                nums[n - 1] = g;
        }
        if ((text = renumber(d->text, nums, nmax))) {
            (void)loom_buf_printf(out->result, "%s", text);
            free(text);
        }
    }
    free(nums);
    done_free(d);
}

/* The biggest researcher and supervisor call so far, for estimates. */
static void calculate_usage(const loom_agent_state *st, const loom_usage *call,
                            loom_usage *out, void *payload)
{
    loom__research *r = payload;

    (void)st;
    (void)out;
    if (call->total_tokens > r->biggest_call)
        r->biggest_call = call->total_tokens;
}

/* ---- making one ---------------------------------------------------------- */

int loom__research_new(loom__research **out, loom_session *s,
                       const loom_config *cfg, const json_t *overrides,
                       loom_run_options *ro)
{
    loom__research *r = calloc(1, sizeof(*r));
    int rc;

    *out = NULL;
    if (!r)
        return loom__error_oom();
    pthread_mutex_init(&r->mu, NULL);
    loom_buf_init(&r->notes, NOTE_MAX);
    if (!(r->rs = json_array())) {
        loom__research_free(r);
        return loom__error_oom();
    }
    r->s = s;
    r->reasoning = ro->reasoning || ro->thinking_budget > 0 ||
                   (ro->reasoning_effort && *ro->reasoning_effort);
    if ((rc = settings(r, &cfg->research, overrides, &ro->budget,
                       ro->context.window)) != 0 ||
        (rc = make_tools(r)) != 0 ||
        !(r->prompt =
              strdup(r->reasoning ? REASONING_PROMPT : SUPERVISOR_PROMPT))) {
        loom__research_free(r);
        return rc ? rc : loom__error_oom();
    }
    r->hooks.version = LOOM_AGENT_HOOKS_VERSION;
    r->hooks.payload = r;
    r->hooks.prepare_call = prepare_call;
    r->hooks.on_no_tool_calls = on_no_tool_calls;
    r->hooks.on_tools_selected = on_tools_selected;
    r->hooks.preprocess_tool_arguments = preprocess;
    r->hooks.special_tool = special_tool;
    r->hooks.calculate_usage = calculate_usage;
    r->non_iterative[0] = "think_tool";
    ro->tools = r->reg;
    ro->tool_names = NULL;
    ro->tool_names_len = 0;
    ro->agent_hooks = &r->hooks;
    ro->system_prompt = r->prompt;
    ro->citations = 1;
    ro->citations_sources_list = 1;
    ro->max_iterations = MAX_CALLS;
    ro->max_think_turns = MAX_CALLS;
    ro->non_iterative_tools = r->non_iterative;
    ro->non_iterative_tools_len = 1;
    ro->tool_concurrency = r->parallel;
    ro->parallel_tool_calls = LOOM_OPT_ON;
    ro->tool_choice.kind = LOOM_TOOL_CHOICE_AUTO;
    ro->tool_choice.function = NULL;
    ro->planning = 0;
    ro->think = 0;
    ro->review.enabled = 0;
    ro->handoffs = NULL;
    ro->handoffs_len = 0;
    ro->retry.max = 0;
    *out = r;
    return 0;
}

void loom__research_free(loom__research *r)
{
    if (!r)
        return;
    loom_tool_registry_free(r->reg);
    while (r->done) {
        done_call *d = r->done;
        r->done = d->next;
        done_free(d);
    }
    pthread_mutex_destroy(&r->mu);
    loom_buf_free(&r->notes);
    json_decref(r->rs);
    json_decref(r->replay);
    free(r->run_id);
    free(r->plan_text);
    for (size_t i = 0; i < r->nrtools; i++)
        free(r->rtools[i]);
    free(r->rtools);
    free(r->model);
    free(r->researcher_model);
    free(r->instructions);
    free(r->prompt);
    free(r);
}

/* ---- resuming ------------------------------------------------------------ */

/* A message of the run as JSON (own: the run's, not a note). */
static json_t *message_json(const loom_message *m, int own)
{
    json_t *o =
        json_pack("{s:s,s:s?,s:s?,s:s?,s:s?,s:s?,s:b}", "role",
                  loom_role_name(m->role), "content", m->content, "reasoning",
                  m->reasoning, "provider_state", m->provider_state,
                  "tool_call_id", m->tool_call_id, "name", m->name, "own", own);
    json_t *calls = m->tool_calls_len ? json_array() : NULL;

    for (size_t i = 0; calls && i < m->tool_calls_len; i++) {
        const loom_tool_call *c = &m->tool_calls[i];
        if (json_array_append_new(
                calls, json_pack("{s:s?,s:s?,s:s?}", "id", c->id, "name",
                                 c->name, "arguments", c->arguments)) != 0) {
            json_decref(calls);
            json_decref(o);
            return NULL;
        }
    }
    if (o && calls && json_object_set_new(o, "tool_calls", calls) != 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static int role_of(const char *name, loom_role *out)
{
    static const loom_role roles[] = {LOOM_ROLE_SYSTEM, LOOM_ROLE_USER,
                                      LOOM_ROLE_ASSISTANT, LOOM_ROLE_TOOL};

    for (size_t i = 0; name && i < 4; i++)
        if (strcmp(loom_role_name(roles[i]), name) == 0) {
            *out = roles[i];
            return 0;
        }
    return loom__error_set(LOOM_EPROTO, "research: a stored message has no "
                                        "role");
}

static int set_str(char **dst, const json_t *o, const char *key)
{
    const char *v = json_string_value(json_object_get(o, key));

    free(*dst);
    *dst = v ? strdup(v) : NULL;
    return v && !*dst ? loom__error_oom() : 0;
}

/* Appends the message j (message_json's) to out. */
static int message_add(loom_messages *out, const json_t *j)
{
    const json_t *calls = json_object_get(j, "tool_calls"), *c;
    loom_tool_call *tc = NULL;
    loom_message *m;
    loom_role role = LOOM_ROLE_USER;
    size_t i, n = json_array_size(calls);
    int rc;

    if ((rc = role_of(json_string_value(json_object_get(j, "role")), &role)))
        return rc;
    if (n && !(tc = calloc(n, sizeof(*tc))))
        return loom__error_oom();
    json_array_foreach(calls, i, c)
    {
        tc[i].id = (char *)json_string_value(json_object_get(c, "id"));
        tc[i].name = (char *)json_string_value(json_object_get(c, "name"));
        tc[i].arguments =
            (char *)json_string_value(json_object_get(c, "arguments"));
    }
    rc = n ? loom_messages_add_assistant(
                 out, json_string_value(json_object_get(j, "content")), NULL,
                 tc, n)
           : loom_messages_add(
                 out, role, json_string_value(json_object_get(j, "content")));
    free(tc);
    if (rc)
        return rc;
    m = &out->items[out->len - 1];
    if ((rc = set_str(&m->reasoning, j, "reasoning")) != 0 ||
        (rc = set_str(&m->provider_state, j, "provider_state")) != 0 ||
        (rc = set_str(&m->tool_call_id, j, "tool_call_id")) != 0 ||
        (rc = set_str(&m->name, j, "name")) != 0)
        return rc;
    return 0;
}

/* What the research knows, for the step's state (the run thread). */
static json_t *state_json(loom__research *r, loom_run *run)
{
    json_t *rs, *o;

    pthread_mutex_lock(&r->mu);
    rs = json_deep_copy(r->rs);
    pthread_mutex_unlock(&r->mu);
    o = json_pack("{s:i,s:i,s:i,s:i,s:i,s:I,s:I,s:I,s:s?,s:s?,s:s,s:I,s:o,s:o}",
                  "ph", (int)r->ph, "cycle", r->cycle, "retried", r->retried,
                  "researchers", r->researchers, "failed", r->failed,
                  "biggest_researcher", (json_int_t)r->biggest_researcher,
                  "biggest_call", (json_int_t)r->biggest_call, "turn_base",
                  (json_int_t)r->turn_base, "reason", r->reason, "instructions",
                  r->instructions, "notes", loom_buf_cstr(&r->notes),
                  "elapsed_ms", (json_int_t)(loom__mono_ms() - r->started_ms),
                  "rs", rs, "run", loom__run_snapshot(run));
    return o;
}

/* The step callback (loom__run_set_step): the messages the step added,
 * where the research is and the state to resume from, in one write. */
static void on_step(loom_run *run, const char *what, void *payload)
{
    loom__research *r = payload;
    size_t n = loom__run_all_len(run), k = 0;
    loom_store_research_write w;
    char **texts = NULL, *state = NULL;
    json_t *st = NULL;

    (void)what;
    memset(&w, 0, sizeof(w));
    if (n > r->upto && !(texts = calloc(n - r->upto, sizeof(*texts))))
        goto done;
    for (size_t i = r->upto; i < n; i++) {
        int own = 0;
        const loom_message *m = loom__run_all_at(run, i, &own);
        json_t *j = message_json(m, own);
        texts[k] = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        if (!texts[k++])
            goto done;
    }
    if (!(st = state_json(r, run)) || !(state = json_dumps(st, JSON_COMPACT)))
        goto done;
    w.messages = (const char *const *)texts;
    w.nmessages = k;
    w.first_position = r->kept_msgs;
    w.state = state;
    w.phase = phase_name(r);
    w.cycle = r->cycle;
    w.max_cycles = r->max_cycles;
    if (r->plan_text && !r->plan_kept)
        w.plan = r->plan_text;
    if (put(r, &w) == 0) {
        r->upto = n;
        r->kept_msgs += (int64_t)k;
        r->plan_kept = r->plan_kept || w.plan;
    }
done:
    for (size_t i = 0; i < k; i++)
        free(texts[i]);
    free(texts);
    free(state);
    json_decref(st);
}

int loom__research_keep(loom__research *r, loom_run *run, loom_store *st,
                        const char *run_id)
{
    if (!(r->run_id = strdup(run_id)))
        return loom__error_oom();
    r->store = st;
    r->upto = loom__run_base_len(run);
    loom__run_set_step(run, on_step, r);
    return 0;
}

/* The state's fields back into r; called with r->mu held. */
static void state_read(loom__research *r, const json_t *s)
{
    const char *v;
    int ph = (int)json_integer_value(json_object_get(s, "ph"));

    r->ph = ph >= PH_CLARIFY && ph <= PH_REPORT ? (phase)ph : PH_PLAN;
    r->cycle = (int)json_integer_value(json_object_get(s, "cycle"));
    r->retried = (int)json_integer_value(json_object_get(s, "retried"));
    r->researchers = (int)json_integer_value(json_object_get(s, "researchers"));
    r->failed = (int)json_integer_value(json_object_get(s, "failed"));
    r->biggest_researcher =
        (long)json_integer_value(json_object_get(s, "biggest_researcher"));
    r->biggest_call =
        (long)json_integer_value(json_object_get(s, "biggest_call"));
    r->turn_base = (long)json_integer_value(json_object_get(s, "turn_base"));
    /* reason is static text: the one of the names it can be. */
    v = json_string_value(json_object_get(s, "reason"));
    r->reason = NULL;
    for (const char *const *k =
             (const char *const[]){"requested", "time_limit", "cycle_limit",
                                   "budget", "no_tool_calls", NULL};
         v && *k; k++)
        if (strcmp(*k, v) == 0)
            r->reason = *k;
    (void)set_str(&r->instructions, s, "instructions");
    loom_buf_clear(&r->notes);
    if ((v = json_string_value(json_object_get(s, "notes"))) && *v)
        (void)loom_buf_printf(&r->notes, "%s", v);
    r->elapsed_before =
        (int64_t)json_integer_value(json_object_get(s, "elapsed_ms"));
    r->started_ms = loom__mono_ms() - r->elapsed_before;
    if (json_is_array(json_object_get(s, "rs"))) {
        json_decref(r->rs);
        r->rs = json_deep_copy(json_object_get(s, "rs"));
    }
}

int loom__research_resume(loom__research *r, loom_run *run,
                          const json_t *stored)
{
    const json_t *state = json_object_get(stored, "state");
    const json_t *msgs = json_object_get(stored, "messages"), *m, *row;
    json_t *empty = json_object(), *e;
    loom_messages list = {0};
    unsigned char *own = NULL;
    size_t i, kept = 0;
    int rc = 0;

    if (!empty || !(r->replay = json_object()) ||
        (json_array_size(msgs) && !(own = calloc(json_array_size(msgs), 1)))) {
        rc = loom__error_oom();
        goto done;
    }
    json_array_foreach(msgs, i, m)
    {
        own[i] = json_is_true(json_object_get(m, "own"));
        if ((rc = message_add(&list, m)) != 0)
            goto done;
    }
    if ((rc = loom__run_restore(run,
                                json_is_object(json_object_get(state, "run"))
                                    ? json_object_get(state, "run")
                                    : empty,
                                &list, own,
                                (uint64_t)json_integer_value(
                                    json_object_get(stored, "last_seq")))) != 0)
        goto done;
    /* What the status reads is rewritten under r->mu. */
    pthread_mutex_lock(&r->mu);
    if (json_is_object(state))
        state_read(r, state);
    /* The researchers that ended answer their calls from their rows;
     * those that ran are running no more. */
    json_array_foreach(json_object_get(stored, "researchers"), i, row)
    {
        const char *id = json_string_value(json_object_get(row, "call_id"));
        const char *status = json_string_value(json_object_get(row, "status"));
        if (!id || !status || !strcmp(status, "running"))
            continue;
        if (json_object_set(r->replay, id, (json_t *)row) != 0) {
            pthread_mutex_unlock(&r->mu);
            rc = loom__error_oom();
            goto done;
        }
        kept++;
    }
    json_array_foreach(r->rs, i, e)
    {
        const json_t *done = json_object_get(
            r->replay, json_string_value(json_object_get(e, "call_id")));
        if (done) {
            (void)json_object_set(e, "status", json_object_get(done, "status"));
            (void)json_object_set(e, "sources",
                                  json_object_get(done, "sources"));
            (void)json_object_set(e, "elapsed_ms",
                                  json_object_get(done, "elapsed_ms"));
        } else if (!strcmp(json_string_value(json_object_get(e, "status"))
                               ? json_string_value(json_object_get(e, "status"))
                               : "",
                           "running")) {
            (void)json_object_set_new(e, "status", json_string("interrupted"));
        }
    }
    r->upto = loom__run_all_len(run);
    r->kept_msgs = (int64_t)list.len;
    r->plan_kept = !json_is_null(json_object_get(stored, "plan")) &&
                   json_object_get(stored, "plan");
    r->resumed = 1;
    pthread_mutex_unlock(&r->mu);
    loom__run_emit(run, LOOM_EV_RESEARCH_RESUMED,
                   json_pack("{s:s,s:i,s:i,s:I}", "phase", phase_name(r),
                             "cycle", r->cycle, "max_cycles", r->max_cycles,
                             "researchers_kept", (json_int_t)kept));
done:
    json_decref(empty);
    loom_messages_free(&list);
    free(own);
    return rc;
}

json_t *loom__research_status(loom__research *r)
{
    json_t *list = json_array(), *e, *o;
    int64_t now = loom__mono_ms();
    size_t i;

    pthread_mutex_lock(&r->mu);
    json_array_foreach(r->rs, i, e)
    {
        const char *status = json_string_value(json_object_get(e, "status"));
        json_int_t ms = json_integer_value(json_object_get(e, "elapsed_ms"));
        if (status && !strcmp(status, "running"))
            ms = now - json_integer_value(json_object_get(e, "started_ms"));
        if (list && json_array_append_new(
                        list, json_pack("{s:O,s:O,s:O,s:O,s:I}", "call_id",
                                        json_object_get(e, "call_id"), "task",
                                        json_object_get(e, "task"), "status",
                                        json_object_get(e, "status"), "sources",
                                        json_object_get(e, "sources"),
                                        "elapsed_ms", ms)) != 0) {
            json_decref(list);
            list = NULL;
        }
    }
    o = json_pack("{s:s,s:i,s:i,s:o*,s:b}", "phase", phase_name(r), "cycle",
                  r->cycle, "max_cycles", r->max_cycles, "researchers", list,
                  "resumed", r->resumed);
    pthread_mutex_unlock(&r->mu);
    return o;
}
