/*
 * The events a running tool sends to its run (loom_tool_progress,
 * loom_tool_delta, loom__tool_ctx_event; src/agent/toolexec.c): they
 * reach the run's thread in the order sent, with the call's id and tool,
 * before the call's tool.completed; an abandoned call's are dropped; the
 * bound on a call's pending events is crossed (oldest dropped, `dropped`
 * counted on the next one, deltas joined); the agent's on_tool_progress
 * hook sees each step. Tools that must wait do so on a condition the
 * test sets, never on time.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "agent/toolturn.h"
#include "loom/run.h"
#include "mock_provider.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- synchronisation between the test, its tools and its sink -------- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int got_first; /* the sink holds the tool's first event */
static int sent_all;  /* the tool sent the rest */
static int release;   /* the test lets a waiting tool return */
static int tool_done; /* the waiting tool returned */
static int late_rc;   /* what an abandoned call's late event got */

static void set_flag(int *flag)
{
    pthread_mutex_lock(&mu);
    *flag = 1;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static void wait_flag(const int *flag)
{
    pthread_mutex_lock(&mu);
    while (!*flag)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
}

/* ---- tools ------------------------------------------------------------ */

/* Progress, three deltas, progress, then its result. */
static int steps_exec(const json_t *args, const loom_tool_ctx *ctx,
                      loom_buf *out, void *payload)
{
    (void)args;
    (void)payload;
    loom_tool_progress(ctx, "Searching", "SEARCH", "running");
    loom_tool_delta(ctx, "hello", 5);
    loom_tool_delta(ctx, " ", 1);
    loom_tool_delta(ctx, "world", 5);
    loom_tool_progress(ctx, "Done", NULL, "done");
    return loom_buf_puts(out, "steps done");
}

/* Sends one event, waits to be released (the run abandons it meanwhile),
 * then tries another. */
static int late_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    (void)args;
    (void)payload;
    loom_tool_progress(ctx, "before", NULL, NULL);
    wait_flag(&release);
    late_rc = loom__tool_ctx_event(
        ctx, LOOM_EV_TOOL_PROGRESS,
        json_pack("{s:s,s:n,s:n}", "label", "after", "icon", "status"));
    set_flag(&tool_done);
    return loom_buf_puts(out, "late");
}

/* Sends p0, waits until the sink holds it, then floods: 100 more steps
 * and three deltas, more than the bound keeps. */
static int flood_exec(const json_t *args, const loom_tool_ctx *ctx,
                      loom_buf *out, void *payload)
{
    char label[16];

    (void)args;
    (void)payload;
    loom_tool_progress(ctx, "p0", NULL, NULL);
    wait_flag(&got_first);
    for (int i = 1; i <= 100; i++) {
        snprintf(label, sizeof(label), "p%d", i);
        loom_tool_progress(ctx, label, NULL, NULL);
    }
    loom_tool_delta(ctx, "a", 1);
    loom_tool_delta(ctx, "b", 1);
    loom_tool_delta(ctx, "c", 1);
    set_flag(&sent_all);
    return loom_buf_puts(out, "flooded");
}

static int burst_rc; /* what the burst tool's structural events got */

/* Sends p0, waits until the sink holds it, then floods as a busy
 * sub-agent would: 100 steps with a usage event after each of the first
 * 80, then a run.completed larger than the byte bound. */
static int burst_exec(const json_t *args, const loom_tool_ctx *ctx,
                      loom_buf *out, void *payload)
{
    char label[16], *big = malloc(LOOM__TOOL_EVENT_BYTES_MAX + 100);

    (void)args;
    (void)payload;
    if (!big)
        return LOOM_ENOMEM;
    loom_tool_progress(ctx, "p0", NULL, NULL);
    wait_flag(&got_first);
    for (int i = 1; i <= 100; i++) {
        snprintf(label, sizeof(label), "p%d", i);
        loom_tool_progress(ctx, label, NULL, NULL);
        if (i <= 80)
            burst_rc |= loom__tool_ctx_event(ctx, LOOM_EV_USAGE,
                                             json_pack("{s:i}", "n", i));
    }
    memset(big, 'x', LOOM__TOOL_EVENT_BYTES_MAX + 99);
    big[LOOM__TOOL_EVENT_BYTES_MAX + 99] = '\0';
    burst_rc |= loom__tool_ctx_event(ctx, LOOM_EV_RUN_COMPLETED,
                                     json_pack("{s:s}", "text", big));
    free(big);
    set_flag(&sent_all);
    return loom_buf_puts(out, "burst");
}

/* Calls without an events channel do nothing (and do not crash). */
static void test_no_channel(void **state)
{
    loom_tool_ctx ctx;

    (void)state;
    memset(&ctx, 0, sizeof(ctx));
    loom_tool_progress(NULL, "x", NULL, NULL);
    loom_tool_progress(&ctx, "x", NULL, NULL);
    loom_tool_delta(&ctx, "x", 1);
    assert_int_equal(
        loom__tool_ctx_event(&ctx, LOOM_EV_TOOL_PROGRESS, json_object()),
        LOOM_ENOTFOUND);
}

/* ---- a tool turn without a run ---------------------------------------- */

typedef struct {
    loom_tool_registry *reg;
    loom__plan *plan;
    const loom_tool *offered[4];
    loom_tool_def defs[4];
    loom__toolset set;
    json_t *settings;
    json_t *events; /* {type, ...data} of each event, in order */
    int gate;       /* the sink waits for sent_all on the first progress */
    loom_cancel cancel;
    loom__toolturn *t;
} fixture;

static void on_event(loom_event_type type, json_t *data, void *payload)
{
    fixture *f = payload;
    json_t *e = json_pack("{s:s}", "type", loom_event_type_name(type));

    json_object_update(e, data);
    json_array_append_new(f->events, e);
    json_decref(data);
    if (f->gate && type == LOOM_EV_TOOL_PROGRESS) {
        f->gate = 0;
        set_flag(&got_first);
        wait_flag(&sent_all);
    }
}

static void add(loom_tool_registry *reg, const char *name,
                loom_tool_execute_fn fn)
{
    loom_tool t = {0};

    t.name = name;
    t.description = name;
    t.execute = fn;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
}

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof(*f));
    loom__toolturn_options o;

    assert_non_null(f);
    assert_int_equal(loom_tool_registry_new(&f->reg), 0);
    add(f->reg, "steps", steps_exec);
    add(f->reg, "late", late_exec);
    add(f->reg, "flood", flood_exec);
    add(f->reg, "burst", burst_exec);
    assert_int_equal(loom__plan_new(&f->plan), 0);
    for (size_t i = 0; i < 4; i++) {
        f->offered[i] = loom_tool_registry_at(f->reg, i);
        f->defs[i].name = f->offered[i]->name;
        f->defs[i].description = f->offered[i]->description;
    }
    f->set.offered = f->offered;
    f->set.nserver = 4;
    f->set.defs = f->defs;
    f->set.ndefs = 4;
    f->set.available = "steps, late, flood, burst";
    f->settings = json_pack("{s:{s:i}}", "late", "timeout_ms", 1);
    f->events = json_array();
    memset(&o, 0, sizeof(o));
    o.tools = &f->set;
    o.plan = f->plan;
    o.registry = f->reg;
    o.settings = f->settings;
    o.cancel = &f->cancel;
    o.max_result = 4096;
    o.max_error = 1024;
    o.concurrency = 4;
    o.emit.fn = on_event;
    o.emit.payload = f;
    assert_int_equal(loom__toolturn_new(&f->t, &o), 0);
    got_first = sent_all = release = tool_done = 0;
    late_rc = burst_rc = 0;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;

    loom__toolturn_free(f->t);
    loom__plan_free(f->plan);
    loom_tool_registry_free(f->reg);
    json_decref(f->settings);
    json_decref(f->events);
    free(f);
    return 0;
}

/* Runs one call of tool; returns the job (the caller frees it). */
static loom__tool_job *run_one(fixture *f, loom_tool_call *c, loom_message *m,
                               const char *tool)
{
    loom__tool_job *jobs;
    size_t n = 0;

    memset(c, 0, sizeof(*c));
    memset(m, 0, sizeof(*m));
    c->id = (char *)"call_1";
    c->name = (char *)tool;
    c->arguments = (char *)"{}";
    m->role = LOOM_ROLE_ASSISTANT;
    m->tool_calls = c;
    m->tool_calls_len = 1;
    assert_int_equal(loom__toolturn_run(f->t, m, 1, &jobs, &n), 0);
    assert_int_equal(n, 1);
    return jobs;
}

static const char *ev_type(const fixture *f, size_t i)
{
    return json_string_value(
        json_object_get(json_array_get(f->events, i), "type"));
}

static const char *ev_str(const fixture *f, size_t i, const char *key)
{
    return json_string_value(
        json_object_get(json_array_get(f->events, i), key));
}

/* Steps and deltas come in order, with the call's id and tool, between
 * tool.started and tool.completed. */
static void test_order(void **state)
{
    fixture *f = *state;
    loom_tool_call c;
    loom_message m;
    loom__tool_job *jobs = run_one(f, &c, &m, "steps");
    size_t n = json_array_size(f->events), i = 1;
    char text[64] = "";

    assert_string_equal(jobs[0].output, "steps done");
    assert_string_equal(ev_type(f, 0), "tool.started");
    assert_string_equal(ev_type(f, i), "tool.progress");
    assert_string_equal(ev_str(f, i, "call_id"), "call_1");
    assert_string_equal(ev_str(f, i, "tool"), "steps");
    assert_string_equal(ev_str(f, i, "label"), "Searching");
    assert_string_equal(ev_str(f, i, "icon"), "SEARCH");
    assert_string_equal(ev_str(f, i, "status"), "running");
    /* Deltas the run had not emitted yet may have been joined. */
    for (i++; i < n && strcmp(ev_type(f, i), "tool.delta") == 0; i++) {
        assert_string_equal(ev_str(f, i, "call_id"), "call_1");
        strcat(text, ev_str(f, i, "delta"));
    }
    assert_string_equal(text, "hello world");
    assert_string_equal(ev_type(f, i), "tool.progress");
    assert_string_equal(ev_str(f, i, "label"), "Done");
    assert_true(
        json_is_null(json_object_get(json_array_get(f->events, i), "icon")));
    assert_string_equal(ev_type(f, i + 1), "tool.completed");
    assert_string_equal(ev_type(f, i + 2), "tool.metric");
    assert_int_equal(n, i + 3);
    /* The record keeps the steps (stored with the turn). */
    {
        const json_t *rec = json_array_get(loom__toolturn_records(f->t), 0);
        const json_t *p = json_object_get(rec, "progress");
        const json_t *steps = json_object_get(p, "steps");
        assert_string_equal(json_string_value(json_object_get(p, "type")),
                            "PROGRESS");
        assert_int_equal(json_array_size(steps), 2);
        assert_string_equal(json_string_value(json_object_get(
                                json_array_get(steps, 1), "status")),
                            "done");
        assert_null(json_object_get(p, "steps_dropped"));
    }
    loom__toolturn_jobs_free(jobs, 1);
}

/* A call abandoned for its timeout sends nothing more. */
static void test_abandoned_dropped(void **state)
{
    fixture *f = *state;
    loom_tool_call c;
    loom_message m;
    loom__tool_job *jobs = run_one(f, &c, &m, "late");
    size_t i;
    json_t *e;

    assert_true(jobs[0].abandoned);
    assert_int_equal(jobs[0].code, LOOM_ETIMEDOUT);
    set_flag(&release);
    wait_flag(&tool_done);
    assert_int_equal(late_rc, LOOM_ENOTFOUND);
    json_array_foreach(f->events, i, e)
    {
        const char *label = json_string_value(json_object_get(e, "label"));
        assert_true(!label || strcmp(label, "after") != 0);
    }
    loom__toolturn_jobs_free(jobs, 1);
}

/* Past the bound the oldest pending steps go, the next one kept says how
 * many, and deltas pending together are joined. */
static void test_bound(void **state)
{
    fixture *f = *state;
    loom_tool_call c;
    loom_message m;
    loom__tool_job *jobs;
    size_t i = 1, n;
    char want[16];

    f->gate = 1;
    jobs = run_one(f, &c, &m, "flood");
    n = json_array_size(f->events);
    assert_string_equal(jobs[0].output, "flooded");
    assert_string_equal(ev_type(f, 0), "tool.started");
    assert_string_equal(ev_str(f, 1, "label"), "p0");
    assert_null(json_object_get(json_array_get(f->events, 1), "dropped"));
    /* 100 steps and a delta for 64 places: p1..p37 dropped. */
    assert_int_equal(LOOM__TOOL_EVENTS_PENDING_MAX, 64);
    assert_string_equal(ev_str(f, 2, "label"), "p38");
    assert_int_equal(json_integer_value(json_object_get(
                         json_array_get(f->events, 2), "dropped")),
                     37);
    for (i = 3; i <= 64; i++) {
        snprintf(want, sizeof(want), "p%zu", i + 36);
        assert_string_equal(ev_str(f, i, "label"), want);
        assert_null(json_object_get(json_array_get(f->events, i), "dropped"));
    }
    assert_string_equal(ev_type(f, 65), "tool.delta");
    assert_string_equal(ev_str(f, 65, "delta"), "abc");
    assert_string_equal(ev_type(f, 66), "tool.completed");
    assert_int_equal(n, 68);
    /* The record keeps the first steps it was given, and counts the
     * rest: p0 and p38..p68 kept, p69..p100 counted. */
    {
        const json_t *p = json_object_get(
            json_array_get(loom__toolturn_records(f->t), 0), "progress");
        assert_int_equal(json_array_size(json_object_get(p, "steps")),
                         LOOM__TOOL_PROGRESS_STEPS_MAX);
        assert_int_equal(
            json_integer_value(json_object_get(p, "steps_dropped")),
            64 - LOOM__TOOL_PROGRESS_STEPS_MAX);
    }
    loom__toolturn_jobs_free(jobs, 1);
}

/*
 * Past both bounds (more events than the count, a single one larger than
 * the bytes) the steps go, and every other event is kept, in order: what
 * a busy sub-agent forwards (its usage, tools and end) is never lost.
 */
static void test_bound_keeps_structural(void **state)
{
    fixture *f = *state;
    loom_tool_call c;
    loom_message m;
    loom__tool_job *jobs;
    size_t i, n, steps = 0, usage = 0;
    int dropped = 0;

    f->gate = 1;
    jobs = run_one(f, &c, &m, "burst");
    n = json_array_size(f->events);
    assert_string_equal(jobs[0].output, "burst");
    assert_int_equal(burst_rc, 0);
    assert_string_equal(ev_type(f, 0), "tool.started");
    for (i = 1; i < n - 3; i++) {
        const json_t *e = json_array_get(f->events, i);
        dropped += (int)json_integer_value(json_object_get(e, "dropped"));
        if (strcmp(ev_type(f, i), "tool.progress") == 0) {
            steps++;
            continue;
        }
        assert_string_equal(ev_type(f, i), "usage");
        assert_int_equal(json_integer_value(json_object_get(e, "n")),
                         (json_int_t)++usage);
    }
    assert_int_equal(usage, 80);
    /* Steps were lost to the bound, and said so (the last ones on the
     * run.completed that made room). */
    dropped += (int)json_integer_value(
        json_object_get(json_array_get(f->events, n - 3), "dropped"));
    assert_true(steps < 101);
    assert_int_equal(dropped + (int)steps, 101);
    assert_string_equal(ev_type(f, n - 3), "run.completed");
    assert_int_equal(strlen(ev_str(f, n - 3, "text")),
                     LOOM__TOOL_EVENT_BYTES_MAX + 99);
    assert_string_equal(ev_type(f, n - 2), "tool.completed");
    assert_string_equal(ev_type(f, n - 1), "tool.metric");
    loom__toolturn_jobs_free(jobs, 1);
}

/* ---- through a run: the agent's on_tool_progress ---------------------- */

static void on_progress(const loom_agent_state *st, const json_t *progress,
                        void *payload)
{
    json_t *seen = payload;

    assert_non_null(st->run);
    json_array_append(seen, (json_t *)progress);
}

static void test_progress_hook(void **state)
{
    static const mock_answer answers[] = {
        {.calls = {{"c1", "steps", "{}"}}, .ncalls = 1},
        {.text = "ok"},
    };
    mock_provider mock;
    loom_tool_registry *reg;
    loom_agent_hooks hooks = LOOM_AGENT_HOOKS_INIT;
    loom_run_options o = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    loom_run *run;
    json_t *seen = json_array();

    (void)state;
    mock_init(&mock, answers, 2, 0);
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    add(reg, "steps", steps_exec);
    hooks.on_tool_progress = on_progress;
    hooks.payload = seen;
    o.provider = &mock.base;
    o.model = "mock/m";
    o.upstream_model = "m";
    o.tools = reg;
    o.agent_hooks = &hooks;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "go"), 0);
    assert_int_equal(loom_run_new(&run, &o, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);
    /* No sink: the hook still sees every step. */
    assert_int_equal(json_array_size(seen), 2);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(seen, 0), "label")),
        "Searching");
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(seen, 1), "call_id")),
        "c1");
    loom_run_free(run);
    loom_messages_free(&hist);
    loom_tool_registry_free(reg);
    mock_clear(&mock);
    json_decref(seen);
}

/* ---- approval ---------------------------------------------------------- */

typedef enum {
    ANS_NONE,
    ANS_APPROVE,
    ANS_DENY,
    ANS_THREAD,
    ANS_CANCEL
} answer_how;

typedef struct {
    mock_provider mock;
    loom_tool_registry *reg;
    loom_run *run;
    json_t *events;
    answer_how how;
    int rc;
    pthread_t th;
    int asked; /* approval.required seen (under mu) */
} approval_run;

static int approval_sink(const loom_event *ev, void *payload)
{
    approval_run *h = payload;
    json_t *e = loom_event_to_json(ev);

    json_array_append_new(h->events, e);
    if (ev->type != LOOM_EV_APPROVAL_REQUIRED)
        return 0;
    if (h->how == ANS_APPROVE)
        assert_int_equal(loom_run_approve(h->run, "c1", 1, NULL), 0);
    else if (h->how == ANS_DENY)
        assert_int_equal(loom_run_approve(h->run, "c1", 0, "too risky"), 0);
    /* A second answer comes too late. */
    if (h->how == ANS_APPROVE || h->how == ANS_DENY)
        assert_int_equal(loom_run_approve(h->run, "c1", 1, NULL),
                         LOOM_ENOTFOUND);
    set_flag(&h->asked);
    return 0;
}

/* Answers from another thread once the run asked (or cancels it). */
static void *answerer(void *arg)
{
    approval_run *h = arg;

    wait_flag(&h->asked);
    assert_int_equal(loom_run_approvals_waiting(h->run), 1);
    if (h->how == ANS_CANCEL)
        loom_run_cancel(h->run);
    else
        assert_int_equal(loom_run_approve(h->run, "c1", 1, "fine"), 0);
    return NULL;
}

static loom_approval hook_requires(const loom_agent_state *st,
                                   const loom_tool_call *call,
                                   const json_t *args, void *payload)
{
    (void)st;
    (void)args;
    (void)payload;
    return strcmp(call->name, "steps") == 0 ? LOOM_APPROVAL_REQUIRED
                                            : LOOM_APPROVAL_DEFAULT;
}

/* One call of "steps" then an answer; settings (may be NULL) say whether
 * it needs approval, hooks may too. */
static void approval_exec(approval_run *h, const char *settings,
                          const loom_agent_hooks *hooks, long timeout_ms)
{
    static const mock_answer answers[] = {
        {.calls = {{"c1", "steps", "{}"}}, .ncalls = 1},
        {.text = "ok"},
    };
    loom_run_options o = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    json_t *set = settings ? json_loads(settings, 0, NULL) : NULL;

    mock_init(&h->mock, answers, 2, 0);
    assert_int_equal(loom_tool_registry_new(&h->reg), 0);
    add(h->reg, "steps", steps_exec);
    h->events = json_array();
    o.provider = &h->mock.base;
    o.model = "mock/m";
    o.upstream_model = "m";
    o.tools = h->reg;
    o.tool_settings = set;
    o.agent_hooks = hooks;
    o.approval_timeout_ms = timeout_ms;
    o.sink.emit = approval_sink;
    o.sink.payload = h;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "go"), 0);
    assert_int_equal(loom_run_new(&h->run, &o, &hist), 0);
    loom_messages_free(&hist);
    if (h->how == ANS_THREAD || h->how == ANS_CANCEL)
        assert_int_equal(pthread_create(&h->th, NULL, answerer, h), 0);
    h->rc = loom_run_execute(h->run);
    if (h->how == ANS_THREAD || h->how == ANS_CANCEL)
        pthread_join(h->th, NULL);
    json_decref(set);
}

static void approval_free(approval_run *h)
{
    loom_run_free(h->run);
    loom_tool_registry_free(h->reg);
    mock_clear(&h->mock);
    json_decref(h->events);
}

/* The first event of type, or NULL. */
static const json_t *find(const approval_run *h, const char *type)
{
    size_t i;
    const json_t *e;

    json_array_foreach(h->events, i, e)
    {
        if (!strcmp(json_string_value(json_object_get(e, "type")), type))
            return e;
    }
    return NULL;
}

static size_t pos(const approval_run *h, const char *type)
{
    const json_t *e = find(h, type);

    for (size_t i = 0; e && i < json_array_size(h->events); i++)
        if (json_array_get(h->events, i) == e)
            return i;
    return (size_t)-1;
}

static const char *field(const json_t *e, const char *k)
{
    return json_string_value(json_object_get(e, k));
}

static void test_approve(void **state)
{
    approval_run h = {.how = ANS_APPROVE};
    const json_t *e;

    (void)state;
    approval_exec(&h, "{\"steps\":{\"approval\":\"required\"}}", NULL, 0);
    assert_int_equal(h.rc, 0);
    e = find(&h, "approval.required");
    assert_non_null(e);
    assert_string_equal(field(e, "call_id"), "c1");
    assert_string_equal(field(e, "tool"), "steps");
    assert_true(json_is_object(json_object_get(e, "arguments")));
    assert_int_equal(json_integer_value(json_object_get(e, "timeout_ms")),
                     LOOM_RUN_DEFAULT_APPROVAL_TIMEOUT_MS);
    assert_true(pos(&h, "approval.required") < pos(&h, "tool.started"));
    assert_string_equal(field(find(&h, "tool.completed"), "output"),
                        "steps done");
    approval_free(&h);
}

static void test_deny(void **state)
{
    approval_run h = {.how = ANS_DENY};
    const json_t *e, *rec;

    (void)state;
    approval_exec(&h, "{\"steps\":{\"approval\":\"required\"}}", NULL, 0);
    assert_int_equal(h.rc, 0);
    assert_null(find(&h, "tool.started"));
    e = find(&h, "tool.failed");
    assert_string_equal(field(e, "code"), "denied");
    assert_string_equal(field(e, "stage"), "approval");
    assert_string_equal(field(e, "output"),
                        "the user denied this call: too risky");
    /* The model read it. */
    assert_string_equal(h.mock.seen[1].last_content,
                        "the user denied this call: too risky");
    rec = find(&h, "tool.metric");
    assert_string_equal(field(rec, "status"), "denied");
    approval_free(&h);
}

static void test_timeout(void **state)
{
    approval_run h = {.how = ANS_NONE};

    (void)state;
    approval_exec(&h, "{\"steps\":{\"approval\":\"required\"}}", NULL, 1);
    assert_int_equal(h.rc, 0);
    assert_string_equal(field(find(&h, "tool.failed"), "output"),
                        "the user denied this call: approval timed out");
    /* Too late now. */
    assert_int_equal(loom_run_approve(h.run, "c1", 1, NULL), LOOM_ENOTFOUND);
    assert_int_equal(loom_run_approvals_waiting(h.run), 0);
    approval_free(&h);
}

/* The agent's hook asks for approval; another thread answers. */
static void test_hook_and_thread(void **state)
{
    approval_run h = {.how = ANS_THREAD};
    loom_agent_hooks hooks = LOOM_AGENT_HOOKS_INIT;

    (void)state;
    hooks.approval_required = hook_requires;
    approval_exec(&h, NULL, &hooks, -1);
    assert_int_equal(h.rc, 0);
    assert_true(json_is_null(
        json_object_get(find(&h, "approval.required"), "timeout_ms")));
    assert_non_null(find(&h, "tool.completed"));
    approval_free(&h);
}

/* Cancel ends a waiting run at once. */
static void test_cancel_while_waiting(void **state)
{
    approval_run h = {.how = ANS_CANCEL};

    (void)state;
    approval_exec(&h, "{\"steps\":{\"approval\":\"required\"}}", NULL, -1);
    assert_int_equal(h.rc, LOOM_ECANCELED);
    assert_null(find(&h, "tool.started"));
    assert_non_null(find(&h, "run.failed"));
    approval_free(&h);
}

/* A setting that is neither required nor never fails the call. */
static void test_bad_setting(void **state)
{
    approval_run h = {.how = ANS_NONE};

    (void)state;
    approval_exec(&h, "{\"steps\":{\"approval\":true}}", NULL, 0);
    assert_int_equal(h.rc, 0);
    assert_null(find(&h, "approval.required"));
    assert_non_null(strstr(field(find(&h, "tool.failed"), "error"),
                           "tools.steps.approval must be"));
    approval_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_channel),
        cmocka_unit_test_setup_teardown(test_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abandoned_dropped, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_bound, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bound_keeps_structural, setup,
                                        teardown),
        cmocka_unit_test(test_progress_hook),
        cmocka_unit_test(test_approve),
        cmocka_unit_test(test_deny),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_hook_and_thread),
        cmocka_unit_test(test_cancel_while_waiting),
        cmocka_unit_test(test_bad_setting),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
