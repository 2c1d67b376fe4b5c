/*
 * Unit tests of the run loop's tool hooks and policies, loop tools and
 * tool telemetry (src/agent/toolturn.c, plan.c, toolexec.c) with an
 * in-process mock provider: each test scripts the model's turns and
 * asserts on what the tools were given, what the model read back, the
 * events, the records, and what every request offered. Every limit is
 * crossed: the failure budget, the think allowance (its default too),
 * plan sizes, the seen documents (per call, per run, the schema's
 * maxItems), record counts and sizes, tool timeouts and the cancel grace.
 * No timing assertion: a slow tool waits on a condition the test sets.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "loom/run.h"
#include "mock_provider.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- test tools ---- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int counter_runs;   /* executions of "counter" */
static int flaky_runs;     /* executions of "flaky" */
static int echo_runs;
static char *search_excluded[8]; /* excluded_ids of each search call */
static int nsearch;
static int sleeper_release;  /* set by the test: the sleeper may return */
static int sleeper_started;  /* sleepers that began */
static int sleeper_done;     /* sleepers that returned */
static int sleeper_saw_cancel;
static int regs_made;  /* registries make_tools made */
static int regs_freed; /* ... and the ones freed (their last ref) */

static int echo_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    (void)ctx;
    (void)payload;
    pthread_mutex_lock(&mu);
    echo_runs++;
    pthread_mutex_unlock(&mu);
    return loom_buf_printf(out, "echo:%s",
                           json_string_value(json_object_get(args, "text")));
}

static int counter_exec(const json_t *args, const loom_tool_ctx *ctx,
                        loom_buf *out, void *payload)
{
    char *d = json_dumps(args, JSON_COMPACT | JSON_SORT_KEYS);
    int rc;

    (void)ctx;
    (void)payload;
    pthread_mutex_lock(&mu);
    counter_runs++;
    pthread_mutex_unlock(&mu);
    rc = loom_buf_printf(out, "counted %s", d);
    free(d);
    return rc;
}

static int flaky_exec(const json_t *args, const loom_tool_ctx *ctx,
                      loom_buf *out, void *payload)
{
    (void)args;
    (void)ctx;
    (void)payload;
    pthread_mutex_lock(&mu);
    flaky_runs++;
    pthread_mutex_unlock(&mu);
    loom_buf_puts(out, "flaky broke");
    return LOOM_EIO;
}

/* A search-like tool: reports n documents "<query>-<i>" (or one with an
 * overlong id when query is "long"), costs 1234 micro-dollars, and keeps
 * the excluded_ids it was given. */
static int search_exec(const json_t *args, const loom_tool_ctx *ctx,
                       loom_buf *out, void *payload)
{
    const char *q = json_string_value(json_object_get(args, "query"));
    json_t *ex = json_object_get(args, "excluded_ids");
    json_int_t n = json_integer_value(json_object_get(args, "n"));

    (void)payload;
    pthread_mutex_lock(&mu);
    if (nsearch < 8)
        search_excluded[nsearch++] =
            ex ? json_dumps(ex, JSON_COMPACT) : strdup("none");
    pthread_mutex_unlock(&mu);
    if (!json_object_get(args, "n"))
        n = 2;
    for (json_int_t i = 1; i <= n; i++) {
        json_t *id = strcmp(q, "long") == 0
                         ? json_string("long-id-of-17-chx")
                         : json_sprintf("%s-%d", q, (int)i);
        json_array_append_new(ctx->documents,
                              json_pack("{s:o,s:s}", "id", id, "title", q));
    }
    *ctx->cost_micros = 1234;
    return loom_buf_printf(out, "found %d for %s", (int)n, q);
}

/* Reports `n` documents "<prefix>-<i>" (more than one call may report). */
static int bulk_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    const char *pre = json_string_value(json_object_get(args, "prefix"));
    json_int_t n = json_integer_value(json_object_get(args, "n"));

    (void)payload;
    for (json_int_t i = 0; i < n; i++)
        json_array_append_new(ctx->documents,
                              json_pack("{s:o}", "id",
                                        json_sprintf("%s-%d", pre, (int)i)));
    return loom_buf_printf(out, "bulk %s", pre);
}

/* Waits until the test releases it, ignoring its cancel flag, then
 * writes into its buffers: after its run was freed, when abandoned. */
static int sleeper_exec(const json_t *args, const loom_tool_ctx *ctx,
                        loom_buf *out, void *payload)
{
    int rc;

    (void)args;
    (void)payload;
    pthread_mutex_lock(&mu);
    sleeper_started++;
    while (!sleeper_release)
        pthread_cond_wait(&cv, &mu);
    sleeper_saw_cancel += loom_cancel_is_set(ctx->cancel);
    pthread_mutex_unlock(&mu);
    loom_buf_puts(ctx->summary, "late summary");
    json_array_append_new(ctx->documents, json_pack("{s:s}", "id", "late"));
    *ctx->cost_micros = 7;
    rc = loom_buf_puts(out, "woke up late");
    pthread_mutex_lock(&mu);
    sleeper_done++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    return rc;
}

/* The sleeper's free_payload: its registry is gone, on whichever thread
 * dropped the last reference (a sleeper's, when it was abandoned). */
static void sleeper_reg_freed(void *payload)
{
    (void)payload;
    pthread_mutex_lock(&mu);
    regs_freed++;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static void add_tool_with(loom_tool_registry *reg, const char *name,
                          loom_tool_execute_fn fn, json_t *schema,
                          void (*free_payload)(void *))
{
    loom_tool t;

    memset(&t, 0, sizeof(t));
    t.name = name;
    t.description = name;
    t.parameters = schema;
    t.execute = fn;
    t.free_payload = free_payload;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    json_decref(schema);
}

static void add_tool(loom_tool_registry *reg, const char *name,
                     loom_tool_execute_fn fn, json_t *schema)
{
    add_tool_with(reg, name, fn, schema, NULL);
}

static loom_tool_registry *make_tools(void)
{
    loom_tool_registry *reg;

    assert_int_equal(loom_tool_registry_new(&reg), 0);
    add_tool(reg, "echo", echo_exec,
             json_pack("{s:s,s:{s:{s:s}},s:[s],s:b}", "type", "object",
                       "properties", "text", "type", "string", "required",
                       "text", "additionalProperties", 0));
    add_tool(reg, "counter", counter_exec,
             json_pack("{s:s}", "type", "object"));
    add_tool(reg, "flaky", flaky_exec, NULL);
    add_tool(reg, "search", search_exec,
             json_pack("{s:s,s:{s:{s:s},s:{s:s},s:{s:s,s:i,s:{s:s,s:i}}},"
                       "s:[s],s:b}",
                       "type", "object", "properties", "query", "type",
                       "string", "n", "type", "integer", "excluded_ids",
                       "type", "array", "maxItems", 3, "items", "type",
                       "string", "maxLength", 16, "required", "query",
                       "additionalProperties", 0));
    add_tool(reg, "bulk", bulk_exec,
             json_pack("{s:s,s:{s:{s:s},s:{s:s}}}", "type", "object",
                       "properties", "prefix", "type", "string", "n",
                       "type", "integer"));
    add_tool_with(reg, "sleeper", sleeper_exec, NULL, sleeper_reg_freed);
    pthread_mutex_lock(&mu);
    regs_made++;
    pthread_mutex_unlock(&mu);
    return reg;
}

static void reset_tools(void)
{
    pthread_mutex_lock(&mu);
    counter_runs = flaky_runs = echo_runs = 0;
    for (int i = 0; i < nsearch; i++)
        free(search_excluded[i]);
    nsearch = 0;
    sleeper_release = sleeper_started = sleeper_done = 0;
    sleeper_saw_cancel = 0;
    pthread_mutex_unlock(&mu);
}

/* ---- harness ---- */

typedef struct {
    mock_provider m;
    loom_tool_registry *reg;
    json_t *events;
    int cancel_on_start; /* the sink cancels the run at tool.started */
    loom_run *run;
    int rc;
} harness;

static int record(const loom_event *ev, void *payload)
{
    harness *h = payload;

    json_array_append_new(h->events, loom_event_to_json(ev));
    return h->cancel_on_start && ev->type == LOOM_EV_TOOL_STARTED;
}

/* Makes the run (its options from ro, or the defaults) and runs it. */
static void run_with(harness *h, const mock_answer *answers, int n,
                     const loom_run_options *ro_in)
{
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};

    if (ro_in)
        ro = *ro_in;
    mock_init(&h->m, answers, n, 0);
    h->reg = make_tools();
    h->events = json_array();
    ro.provider = &h->m.base;
    ro.model = "mock/m";
    ro.upstream_model = "m";
    ro.tools = h->reg;
    ro.sink.emit = record;
    ro.sink.payload = h;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "hi"), 0);
    assert_int_equal(loom_run_new(&h->run, &ro, &hist), 0);
    loom_messages_free(&hist);
    h->rc = loom_run_execute(h->run);
}

static void harness_free(harness *h)
{
    loom_run_free(h->run);
    h->run = NULL;
    /* An abandoned tool holds its own reference: the last one frees. */
    loom_tool_registry_free(h->reg);
    json_decref(h->events);
    mock_clear(&h->m);
}

static int count_type(const harness *h, const char *type)
{
    size_t i;
    json_t *e;
    int n = 0;

    json_array_foreach(h->events, i, e)
    {
        n += strcmp(json_string_value(json_object_get(e, "type")), type) == 0;
    }
    return n;
}

static json_t *nth_type(const harness *h, const char *type, int nth)
{
    size_t i;
    json_t *e;

    json_array_foreach(h->events, i, e)
    {
        if (!strcmp(json_string_value(json_object_get(e, "type")), type) &&
            nth-- == 0)
            return e;
    }
    return NULL;
}

/* The event of that type for call id. */
static json_t *event_of(const harness *h, const char *type, const char *id)
{
    size_t i;
    json_t *e;
    const char *key = strcmp(type, "tool.metric") == 0 ? "call_id" : "id";

    json_array_foreach(h->events, i, e)
    {
        if (!strcmp(json_string_value(json_object_get(e, "type")), type) &&
            !strcmp(json_string_value(json_object_get(e, key)), id))
            return e;
    }
    return NULL;
}

/* The result the model read for call id. */
static const char *result_of(const harness *h, const char *id)
{
    const loom_messages *m = loom_run_messages(h->run);

    for (size_t j = 0; j < m->len; j++)
        if (m->items[j].role == LOOM_ROLE_TOOL &&
            strcmp(m->items[j].tool_call_id, id) == 0)
            return m->items[j].content;
    return NULL;
}

static int has_tool(const char *list, const char *name)
{
    size_t n = strlen(name);

    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0)
            return 1;
        p = end ? end + 1 : NULL;
    }
    return 0;
}

static const char *str_at(const json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

#define THINK_OK "Acknowledged, please continue."

#define assert_contains(hay, needle)                                         \
    do {                                                                     \
        const char *h_ = (hay);                                              \
        if (!h_ || !strstr(h_, (needle)))                                    \
            fail_msg("'%s' not found in '%s'", (needle),                     \
                     h_ ? h_ : "(null)");                                    \
    } while (0)

/* ---- duplicates ---- */

static void test_duplicate_calls(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "counter", "{\"a\":1,\"b\":[1,2]}"}}, .ncalls = 1},
        /* The same arguments, keys in another order and spaced: skipped.
         * Other arguments run. */
        {.calls = {{"c2", "counter", "{ \"b\" : [1,2], \"a\" : 1 }"},
                   {"c3", "counter", "{\"a\":2}"},
                   {"c4", "counter", "{\"a\":2}"}},
         .ncalls = 3},
        {.text = "done"}};
    harness h = {0};
    json_t *ev;
    (void)state;

    reset_tools();
    run_with(&h, a, 3, NULL);
    assert_int_equal(h.rc, 0);
    assert_int_equal(counter_runs, 2);
    assert_contains(result_of(&h, "c2"), "Not run again: 'counter' already "
                                         "succeeded with exactly these "
                                         "arguments earlier in this run "
                                         "(call c1)");
    assert_string_equal(result_of(&h, "c3"), "counted {\"a\":2}");
    /* A repeat within one turn is skipped too. */
    assert_contains(result_of(&h, "c4"), "repeats call c3 of this turn");
    ev = event_of(&h, "tool.completed", "c2");
    assert_non_null(ev);
    assert_true(json_is_true(json_object_get(ev, "skipped")));
    assert_null(json_object_get(event_of(&h, "tool.completed", "c3"),
                                "skipped"));
    assert_null(event_of(&h, "tool.started", "c2"));
    assert_string_equal(str_at(event_of(&h, "tool.metric", "c2"), "status"),
                        "skipped");
    assert_string_equal(str_at(event_of(&h, "tool.metric", "c3"), "status"),
                        "success");
    harness_free(&h);
}

/* A failed call is no success: the same call runs again. */
static void test_failed_call_is_not_duplicate(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "flaky", "{}"}}, .ncalls = 1},
        {.calls = {{"c2", "flaky", "{}"}}, .ncalls = 1},
        {.text = "done"}};
    harness h = {0};
    (void)state;

    reset_tools();
    run_with(&h, a, 3, NULL);
    assert_int_equal(h.rc, 0);
    assert_int_equal(flaky_runs, 2);
    assert_string_equal(result_of(&h, "c2"), "Error: flaky broke");
    harness_free(&h);
}

/* ---- failure budget ---- */

static void test_failure_budget(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "flaky", "{}"}}, .ncalls = 1},
        {.calls = {{"c2", "flaky", "{\"x\":1}"}}, .ncalls = 1},
        {.calls = {{"c3", "flaky", "{\"x\":2}"}}, .ncalls = 1},
        /* Blocked now: the model calls it anyway. */
        {.calls = {{"c4", "flaky", "{\"x\":3}"}, {"c5", "echo",
                                                  "{\"text\":\"ok\"}"}},
         .ncalls = 2},
        {.text = "done"}};
    harness h = {0};
    json_t *m;
    (void)state;

    reset_tools();
    run_with(&h, a, 5, NULL);
    assert_int_equal(h.rc, 0);
    assert_int_equal(flaky_runs, 3);
    /* Two failures: still offered; the third blocks it. */
    assert_true(has_tool(h.m.seen[0].tools, "flaky"));
    assert_true(has_tool(h.m.seen[2].tools, "flaky"));
    assert_false(has_tool(h.m.seen[3].tools, "flaky"));
    assert_false(has_tool(h.m.seen[4].tools, "flaky"));
    assert_true(has_tool(h.m.seen[4].tools, "echo"));
    assert_string_equal(result_of(&h, "c2"), "Error: flaky broke");
    assert_contains(result_of(&h, "c3"), "Error: flaky broke\n[loom: tool "
                                         "'flaky' has now failed 3 times in "
                                         "this run and is blocked");
    assert_contains(result_of(&h, "c4"), "Error: tool 'flaky' is blocked: "
                                         "it failed 3 times in this run.");
    assert_string_equal(result_of(&h, "c5"), "echo:ok");
    assert_string_equal(str_at(event_of(&h, "tool.failed", "c4"), "stage"),
                        "blocked");
    m = event_of(&h, "tool.metric", "c4");
    assert_string_equal(str_at(m, "status"), "blocked");
    assert_string_equal(str_at(json_object_get(m, "error"), "stage"),
                        "blocked");
    m = event_of(&h, "tool.metric", "c1");
    assert_string_equal(str_at(m, "status"), "error");
    assert_string_equal(str_at(json_object_get(m, "error"), "code"), "EIO");
    assert_string_equal(str_at(json_object_get(m, "error"), "message"),
                        "flaky broke");
    harness_free(&h);
}

/* Calls of one turn count together; failures of validation do not. */
static void test_failure_budget_parallel(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "echo", "{}"}, {"c2", "echo", "{}"},
                   {"c3", "echo", "{}"}},
         .ncalls = 3},
        {.calls = {{"c4", "flaky", "{\"i\":1}"}, {"c5", "flaky", "{\"i\":2}"},
                   {"c6", "flaky", "{\"i\":3}"}},
         .ncalls = 3},
        {.text = "done"}};
    harness h = {0};
    (void)state;

    reset_tools();
    run_with(&h, a, 3, NULL);
    assert_int_equal(h.rc, 0);
    /* Three invalid calls of echo: the model's fault, not the tool's. */
    assert_true(has_tool(h.m.seen[1].tools, "echo"));
    assert_false(has_tool(h.m.seen[2].tools, "flaky"));
    assert_int_equal(flaky_runs, 3);
    harness_free(&h);
}

/* ---- hooks ---- */

static pthread_t test_thread;
static int hooks_off_thread;

static loom_hook_action before_a(loom_tool_hook_call *hc, void *payload)
{
    const char *t = json_string_value(json_object_get(hc->arguments, "text"));

    (void)payload;
    hooks_off_thread += !pthread_equal(pthread_self(), test_thread);
    assert_non_null(hc->run);
    assert_int_equal(hc->iteration, 1);
    if (strcmp(hc->tool_name, "echo") != 0 || !t)
        return LOOM_HOOK_CONTINUE;
    if (strcmp(t, "skip") == 0) {
        loom_buf_puts(hc->text, "skipped by the test");
        return LOOM_HOOK_SKIP;
    }
    if (strcmp(t, "block") == 0) {
        loom_buf_puts(hc->text, "not allowed here");
        return LOOM_HOOK_BLOCK;
    }
    if (strcmp(t, "rewrite") == 0) {
        hc->new_arguments = json_pack("{s:s}", "text", "rewritten");
        return LOOM_HOOK_REWRITE;
    }
    if (strcmp(t, "bad") == 0) {
        hc->new_arguments = json_pack("{s:i}", "text", 5);
        return LOOM_HOOK_REWRITE;
    }
    return LOOM_HOOK_CONTINUE;
}

/* The second hook sees what the first left. */
static loom_hook_action before_b(loom_tool_hook_call *hc, void *payload)
{
    const char *t = json_string_value(json_object_get(hc->arguments, "text"));
    int *seen_rewritten = payload;

    if (t && strcmp(t, "rewritten") == 0)
        (*seen_rewritten)++;
    /* Never reached for skipped or blocked calls. */
    assert_true(!t || (strcmp(t, "skip") != 0 && strcmp(t, "block") != 0));
    return LOOM_HOOK_CONTINUE;
}

static loom_hook_action after_a(loom_tool_hook_call *hc, void *payload)
{
    (void)payload;
    hooks_off_thread += !pthread_equal(pthread_self(), test_thread);
    if (strcmp(hc->result, "echo:after") == 0) {
        loom_buf_puts(hc->text, "result rewritten");
        return LOOM_HOOK_REWRITE;
    }
    if (hc->failed && strcmp(hc->tool_name, "flaky") == 0) {
        loom_buf_printf(hc->text, "hidden failure of %s", hc->call_id);
        return LOOM_HOOK_REWRITE;
    }
    return LOOM_HOOK_CONTINUE;
}

static void test_hooks(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "echo", "{\"text\":\"skip\"}"},
                   {"c2", "echo", "{\"text\":\"block\"}"},
                   {"c3", "echo", "{\"text\":\"rewrite\"}"},
                   {"c4", "echo", "{\"text\":\"bad\"}"},
                   {"c5", "echo", "{\"text\":\"after\"}"},
                   {"c6", "flaky", "{}"},
                   {"c7", "echo", "{\"text\":\"plain\"}"}},
         .ncalls = 7},
        {.text = "done"}};
    int seen_rewritten = 0;
    loom_tool_hook hooks[2] = {{before_a, after_a, NULL},
                               {before_b, NULL, &seen_rewritten}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h = {0};
    json_t *ev;
    (void)state;

    reset_tools();
    test_thread = pthread_self();
    hooks_off_thread = 0;
    ro.hooks = hooks;
    ro.hooks_len = 2;
    run_with(&h, a, 2, &ro);
    assert_int_equal(h.rc, 0);
    assert_int_equal(hooks_off_thread, 0);
    assert_int_equal(seen_rewritten, 1);
    /* rewrite, after and plain ran; skip, block and bad did not. */
    assert_int_equal(echo_runs, 3);
    assert_string_equal(result_of(&h, "c1"), "skipped by the test");
    assert_string_equal(result_of(&h, "c2"), "Error: not allowed here");
    assert_string_equal(result_of(&h, "c3"), "echo:rewritten");
    assert_contains(result_of(&h, "c4"), "a before-tool hook gave arguments "
                                         "that do not fit the schema of "
                                         "'echo': `text` must be a string");
    assert_string_equal(result_of(&h, "c5"), "result rewritten");
    assert_string_equal(result_of(&h, "c6"), "hidden failure of c6");
    assert_string_equal(result_of(&h, "c7"), "echo:plain");
    /* Events show what the model reads; started shows the arguments the
     * tool got. */
    assert_true(json_is_true(
        json_object_get(event_of(&h, "tool.completed", "c1"), "skipped")));
    assert_string_equal(str_at(event_of(&h, "tool.failed", "c2"), "stage"),
                        "blocked");
    assert_string_equal(str_at(event_of(&h, "tool.failed", "c4"), "stage"),
                        "hook");
    ev = event_of(&h, "tool.started", "c3");
    assert_string_equal(
        str_at(json_object_get(ev, "arguments"), "text"), "rewritten");
    assert_string_equal(str_at(event_of(&h, "tool.completed", "c5"),
                               "output"),
                        "result rewritten");
    assert_string_equal(str_at(event_of(&h, "tool.failed", "c6"), "output"),
                        "hidden failure of c6");
    assert_string_equal(str_at(event_of(&h, "tool.metric", "c2"), "status"),
                        "blocked");
    assert_string_equal(str_at(event_of(&h, "tool.metric", "c1"), "status"),
                        "skipped");
    /* The record holds the arguments the tool was given. */
    assert_string_equal(str_at(json_object_get(event_of(&h, "tool.metric",
                                                        "c3"),
                                               "arguments"),
                               "text"),
                        "rewritten");
    harness_free(&h);
}

/* ---- planning ---- */

static void test_todo_write(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"p1", "todo_write",
                    "{\"goal\":\"Find X\",\"tasks\":["
                    "{\"id\":\"t1\",\"description\":\"search for X\","
                    "\"status\":\"in_progress\",\"tools\":[\"search\"]},"
                    "{\"id\":\"t2\",\"description\":\"write it up\"}]}"}},
         .ncalls = 1},
        {.calls = {{"p2", "todo_write",
                    "{\"goal\":\"Find X\",\"tasks\":["
                    "{\"id\":\"t1\",\"description\":\"search for X\","
                    "\"status\":\"completed\"}]}"}},
         .ncalls = 1},
        {.text = "done"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    const json_t *plan;
    json_t *ev;
    harness h = {0};
    (void)state;

    reset_tools();
    ro.planning = 1;
    ro.system_prompt = "You are a tester.";
    run_with(&h, a, 3, &ro);
    assert_int_equal(h.rc, 0);
    assert_true(has_tool(h.m.seen[0].tools, "todo_write"));
    assert_false(has_tool(h.m.seen[0].tools, "think"));
    assert_string_equal(h.m.seen[0].system,
                        "You are a tester.\n\n<plan>\nNo plan exists yet. "
                        "For a request of several steps, create one with "
                        "todo_write first.\n</plan>");
    assert_string_equal(h.m.seen[1].system,
                        "You are a tester.\n\n<plan>\nGoal: Find X\n"
                        "Tasks:\n"
                        "1. [in_progress] t1: search for X (tools: search)\n"
                        "2. [pending] t2: write it up\n"
                        "Keep the plan current with todo_write as tasks "
                        "start, finish or fail.\n</plan>");
    assert_contains(h.m.seen[2].system, "1. [completed] t1: search for X\n");
    assert_contains(result_of(&h, "p1"), "Plan saved: 2 tasks (1 pending, 1 "
                                         "in progress, 0 completed");
    assert_int_equal(count_type(&h, "plan.updated"), 2);
    ev = nth_type(&h, "plan.updated", 0);
    assert_string_equal(str_at(ev, "call_id"), "p1");
    assert_int_equal(json_integer_value(json_object_get(ev, "iteration")), 1);
    assert_string_equal(
        str_at(json_array_get(json_object_get(json_object_get(ev, "plan"),
                                              "tasks"),
                              1),
               "status"),
        "pending");
    /* The run keeps the last plan for the caller. */
    plan = loom_run_plan(h.run);
    assert_non_null(plan);
    assert_int_equal(json_array_size(json_object_get(plan, "tasks")), 1);
    assert_int_equal(
        json_array_size(json_object_get(
            json_array_get(json_object_get(plan, "tasks"), 0), "tools")),
        0);
    assert_non_null(event_of(&h, "tool.started", "p1"));
    assert_string_equal(str_at(event_of(&h, "tool.metric", "p1"), "status"),
                        "success");
    harness_free(&h);
}

/* "{"goal":..., "tasks":[n tasks with descriptions of dlen chars]}" */
static char *plan_text(int ntasks, size_t dlen, size_t glen, int dup_ids,
                       int ntools)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);

    loom_buf_puts(&b, "{\"goal\":\"");
    for (size_t i = 0; i < glen; i++)
        loom_buf_putc(&b, 'g');
    loom_buf_puts(&b, "\",\"tasks\":[");
    for (int t = 0; t < ntasks; t++) {
        loom_buf_printf(&b, "%s{\"id\":\"t%d\",\"description\":\"",
                        t ? "," : "", dup_ids ? 0 : t);
        for (size_t i = 0; i < dlen; i++)
            loom_buf_putc(&b, 'd');
        loom_buf_puts(&b, "\",\"tools\":[");
        for (int k = 0; k < ntools; k++)
            loom_buf_printf(&b, "%s\"tool%d\"", k ? "," : "", k);
        loom_buf_puts(&b, "]}");
    }
    loom_buf_puts(&b, "]}");
    return loom_buf_detach(&b);
}

static void test_bad_plans(void **state)
{
    char *ok = plan_text(LOOM_PLAN_MAX_TASKS, LOOM_PLAN_TEXT_MAX,
                         LOOM_PLAN_GOAL_MAX, 0, LOOM_PLAN_TASK_TOOLS_MAX);
    char *many = plan_text(LOOM_PLAN_MAX_TASKS + 1, 5, 5, 0, 0);
    char *longd = plan_text(1, LOOM_PLAN_TEXT_MAX + 1, 5, 0, 0);
    char *longg = plan_text(1, 5, LOOM_PLAN_GOAL_MAX + 1, 0, 0);
    char *dups = plan_text(2, 5, 5, 1, 0);
    char *tools = plan_text(1, 5, 5, 0, LOOM_PLAN_TASK_TOOLS_MAX + 1);
    mock_answer a[2];
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h = {0};
    (void)state;

    memset(a, 0, sizeof(a));
    a[0].calls[0][0] = "b1", a[0].calls[0][1] = "todo_write";
    a[0].calls[0][2] = many;
    a[0].calls[1][0] = "b2", a[0].calls[1][1] = "todo_write";
    a[0].calls[1][2] = longd;
    a[0].calls[2][0] = "b3", a[0].calls[2][1] = "todo_write";
    a[0].calls[2][2] = longg;
    a[0].calls[3][0] = "b4", a[0].calls[3][1] = "todo_write";
    a[0].calls[3][2] = dups;
    a[0].calls[4][0] = "b5", a[0].calls[4][1] = "todo_write";
    a[0].calls[4][2] = tools;
    a[0].calls[5][0] = "b6", a[0].calls[5][1] = "todo_write";
    a[0].calls[5][2] = "{\"goal\":\"g\",\"tasks\":[{\"id\":\"a\","
                       "\"description\":\"d\",\"status\":\"done\"}]}";
    a[0].calls[6][0] = "ok", a[0].calls[6][1] = "todo_write";
    a[0].calls[6][2] = ok;
    a[0].ncalls = 7;
    a[1].text = "done";
    reset_tools();
    ro.planning = 1;
    run_with(&h, a, 2, &ro);
    assert_int_equal(h.rc, 0);
    assert_contains(result_of(&h, "b1"), "`tasks` must have at most 50 "
                                         "items");
    assert_contains(result_of(&h, "b2"), "`tasks[0].description` must be at "
                                         "most 500 characters long");
    assert_contains(result_of(&h, "b3"), "`goal` must be at most 1000 "
                                         "characters long");
    assert_contains(result_of(&h, "b4"), "todo_write: the plan was not "
                                         "saved: task id 't0' is used twice");
    assert_contains(result_of(&h, "b5"), "`tasks[0].tools` must have at most "
                                         "16 items");
    assert_contains(result_of(&h, "b6"), "`tasks[0].status` must be one of");
    /* At every limit exactly, the plan is taken. */
    assert_contains(result_of(&h, "ok"), "Plan saved: 50 tasks");
    assert_int_equal(count_type(&h, "plan.updated"), 1);
    assert_int_equal(
        json_array_size(json_object_get(loom_run_plan(h.run), "tasks")), 50);
    /* No system prompt of the agent's own: the plan section alone. */
    assert_true(strncmp(h.m.seen[1].system, "<plan>\nGoal: ggg", 16) == 0);
    harness_free(&h);
    free(ok);
    free(many);
    free(longd);
    free(longg);
    free(dups);
    free(tools);
}

static void test_stored_plan(void **state)
{
    static const mock_answer a[] = {{.text = "done"}};
    json_t *plan = json_pack("{s:s,s:[{s:s,s:s,s:s,s:[]}]}", "goal", "G",
                             "tasks", "id", "t1", "description", "D",
                             "status", "completed", "tools");
    json_t *bad = json_pack("{s:s,s:[]}", "goal", "G", "tasks");
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    loom_run *run = NULL;
    harness h = {0};
    mock_provider m;
    (void)state;

    reset_tools();
    ro.planning = 1;
    ro.plan = plan;
    run_with(&h, a, 1, &ro);
    assert_int_equal(h.rc, 0);
    assert_contains(h.m.seen[0].system, "Goal: G\nTasks:\n1. [completed] "
                                        "t1: D\n");
    assert_true(json_equal((json_t *)loom_run_plan(h.run), plan));
    harness_free(&h);

    /* A plan that breaks the rules is refused. */
    mock_init(&m, NULL, 0, 0);
    ro = (loom_run_options)LOOM_RUN_OPTIONS_INIT;
    ro.provider = &m.base;
    ro.upstream_model = "m";
    ro.planning = 1;
    ro.plan = bad;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "hi"), 0);
    assert_int_equal(loom_run_new(&run, &ro, &hist), LOOM_EINVALID);
    assert_contains(loom_error_last(), "run options: the plan is not valid: "
                                       "`tasks` must have at least 1 item");
    assert_null(run);
    loom_messages_free(&hist);
    json_decref(plan);
    json_decref(bad);
}

/* ---- think ---- */

static void test_think_turns_are_free(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"t1", "think", "{\"thought\":\"first\"}"}}, .ncalls = 1},
        {.calls = {{"t2", "think", "{\"thought\":\"second\"}"},
                   {"t3", "think", "{\"thought\":\"third\"}"}},
         .ncalls = 2},
        /* think with another tool: this turn counts. */
        {.calls = {{"t4", "think", "{\"thought\":\"x\"}"},
                   {"e1", "echo", "{\"text\":\"y\"}"}},
         .ncalls = 2},
        {.calls = {{"e2", "echo", "{\"text\":\"z\"}"}}, .ncalls = 1},
        {.text = "done"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h = {0};
    (void)state;

    reset_tools();
    ro.think = 1;
    ro.max_iterations = 3;
    run_with(&h, a, 5, &ro);
    assert_int_equal(h.rc, 0);
    assert_string_equal(result_of(&h, "t1"), THINK_OK);
    assert_true(has_tool(h.m.seen[0].tools, "think"));
    assert_false(has_tool(h.m.seen[0].tools, "todo_write"));
    /* Five model calls under max_iterations 3: two were free, and the
     * last one forbade tools. */
    assert_int_equal(loom_run_iterations(h.run), 5);
    assert_int_equal(h.m.seen[3].choice, LOOM_TOOL_CHOICE_AUTO);
    assert_int_equal(h.m.seen[4].choice, LOOM_TOOL_CHOICE_NONE);
    assert_int_equal(json_integer_value(json_object_get(
                         nth_type(&h, "run.completed", 0), "think_turns")),
                     2);
    harness_free(&h);
}

static void think_cap(int max_think, int expect_free)
{
    mock_answer a[MOCK_MAX_TURNS];
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    int n = expect_free + 2;
    harness h = {0};

    memset(a, 0, sizeof(a));
    /* A model that only ever thinks. */
    for (int i = 0; i < n; i++) {
        a[i].calls[0][0] = "t";
        a[i].calls[0][1] = "think";
        a[i].calls[0][2] = "{\"thought\":\"hmm\"}";
        a[i].ncalls = 1;
    }
    a[n - 1].ncalls = 0;
    a[n - 1].text = "answer";
    reset_tools();
    ro.think = 1;
    ro.max_iterations = 2;
    ro.max_think_turns = max_think;
    run_with(&h, a, n, &ro);
    assert_int_equal(h.rc, 0);
    /* expect_free free turns, one counted, then the last call. */
    assert_int_equal(loom_run_iterations(h.run), n);
    assert_int_equal(h.m.seen[n - 2].choice, LOOM_TOOL_CHOICE_AUTO);
    assert_int_equal(h.m.seen[n - 1].choice, LOOM_TOOL_CHOICE_NONE);
    assert_string_equal(loom_run_text(h.run), "answer");
    /* The same thought again is no duplicate: think is exempt. */
    for (size_t i = 0; i < loom_run_messages(h.run)->len; i++) {
        const loom_message *msg = &loom_run_messages(h.run)->items[i];
        if (msg->role == LOOM_ROLE_TOOL)
            assert_string_equal(msg->content, THINK_OK);
    }
    harness_free(&h);
}

static void test_think_cap(void **state)
{
    (void)state;
    think_cap(2, 2);
    think_cap(0, LOOM_RUN_DEFAULT_THINK_TURNS);
    think_cap(-1, 0);
}

static void test_think_limits_and_names(void **state)
{
    char *big = malloc(LOOM_THINK_MAX + 32), *ok = malloc(LOOM_THINK_MAX + 32);
    static const char *names[] = {"echo", "think"};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_tool_registry *reg;
    loom_messages hist = {0};
    loom_run *run = NULL;
    mock_answer a[2];
    harness h = {0};
    mock_provider m;
    int n;
    (void)state;

    n = snprintf(big, 32, "{\"thought\":\"");
    memset(big + n, 'x', LOOM_THINK_MAX + 1);
    strcpy(big + n + LOOM_THINK_MAX + 1, "\"}");
    memcpy(ok, big, (size_t)n + LOOM_THINK_MAX);
    strcpy(ok + n + LOOM_THINK_MAX, "\"}");
    memset(a, 0, sizeof(a));
    a[0].calls[0][0] = "big", a[0].calls[0][1] = "think";
    a[0].calls[0][2] = big;
    a[0].calls[1][0] = "ok", a[0].calls[1][1] = "think";
    a[0].calls[1][2] = ok;
    a[0].ncalls = 2;
    a[1].text = "done";
    reset_tools();
    /* Listing think offers it when no registered tool has the name. */
    ro.tool_names = names;
    ro.tool_names_len = 2;
    run_with(&h, a, 2, &ro);
    assert_int_equal(h.rc, 0);
    assert_string_equal(h.m.seen[0].tools, "echo,think");
    assert_contains(result_of(&h, "big"), "`thought` must be at most 20000 "
                                          "characters long");
    assert_string_equal(result_of(&h, "ok"), THINK_OK);
    harness_free(&h);
    free(big);
    free(ok);

    /* A registered tool named think cannot stand beside loom's. */
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    add_tool(reg, "think", echo_exec, NULL);
    mock_init(&m, NULL, 0, 0);
    ro = (loom_run_options)LOOM_RUN_OPTIONS_INIT;
    ro.provider = &m.base;
    ro.upstream_model = "m";
    ro.tools = reg;
    ro.think = 1;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "hi"), 0);
    assert_int_equal(loom_run_new(&run, &ro, &hist), LOOM_EINVALID);
    assert_contains(loom_error_last(), "the registered tool 'think' takes "
                                       "the name of loom's own think tool");
    /* Listed, the registered one is used and loom's stays off. */
    ro.think = 0;
    ro.tool_names = names + 1;
    ro.tool_names_len = 1;
    assert_int_equal(loom_run_new(&run, &ro, &hist), 0);
    loom_run_free(run);
    loom_messages_free(&hist);
    loom_tool_registry_free(reg);
}

/* ---- seen documents ---- */

static void test_seen_documents(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"s1", "search", "{\"query\":\"a\"}"}}, .ncalls = 1},
        {.calls = {{"s2", "search", "{\"query\":\"b\",\"n\":1}"}},
         .ncalls = 1},
        /* The model's own ids come first; maxItems 3 leaves room for two
         * seen ones, the newest. */
        {.calls = {{"s3", "search",
                    "{\"query\":\"c\",\"excluded_ids\":[\"own\"]}"}},
         .ncalls = 1},
        /* An id longer than the schema's maxLength 16 is never passed. */
        {.calls = {{"s4", "search", "{\"query\":\"long\",\"n\":1}"}},
         .ncalls = 1},
        {.calls = {{"s5", "search", "{\"query\":\"d\",\"n\":0}"},
                   {"e1", "echo", "{\"text\":\"no ids for me\"}"}},
         .ncalls = 2},
        {.text = "done"}};
    const json_t *docs;
    json_t *m;
    harness h = {0};
    (void)state;

    reset_tools();
    run_with(&h, a, 6, NULL);
    assert_int_equal(h.rc, 0);
    assert_int_equal(nsearch, 5);
    assert_string_equal(search_excluded[0], "none");
    assert_string_equal(search_excluded[1], "[\"a-2\",\"a-1\"]");
    assert_string_equal(search_excluded[2], "[\"own\",\"b-1\",\"a-2\"]");
    assert_string_equal(search_excluded[3], "[\"c-2\",\"c-1\",\"b-1\"]");
    assert_string_equal(search_excluded[4], "[\"c-2\",\"c-1\",\"b-1\"]");
    /* A tool without excluded_ids is left alone. */
    assert_string_equal(str_at(json_object_get(event_of(&h, "tool.started",
                                                        "e1"),
                                               "arguments"),
                               "text"),
                        "no ids for me");
    assert_int_equal(json_object_size(json_object_get(
                         event_of(&h, "tool.started", "e1"), "arguments")),
                     1);
    docs = loom_run_documents(h.run);
    assert_int_equal(json_array_size(docs), 6);
    assert_string_equal(str_at(json_array_get(docs, 0), "id"), "a-1");
    assert_string_equal(str_at(json_array_get(docs, 0), "title"), "a");
    assert_string_equal(str_at(json_array_get(docs, 5), "id"),
                        "long-id-of-17-chx");
    m = event_of(&h, "tool.metric", "s1");
    assert_int_equal(json_array_size(json_object_get(m, "documents")), 2);
    assert_int_equal(json_integer_value(json_object_get(m, "cost_micros")),
                     1234);
    assert_null(json_object_get(m, "excluded_ids_added"));
    m = event_of(&h, "tool.metric", "s3");
    assert_int_equal(
        json_integer_value(json_object_get(m, "excluded_ids_added")), 2);
    /* The record shows the model's arguments, not loom's additions. */
    assert_string_equal(
        str_at(json_object_get(m, "arguments"), "query"), "c");
    assert_int_equal(json_array_size(json_object_get(
                         json_object_get(m, "arguments"), "excluded_ids")),
                     1);
    /* The tool got them all (tool.started). */
    assert_int_equal(json_array_size(json_object_get(
                         json_object_get(event_of(&h, "tool.started", "s3"),
                                         "arguments"),
                         "excluded_ids")),
                     3);
    harness_free(&h);
}

static void test_document_limits(void **state)
{
    static const mock_answer a[] = {
        /* One call reports 150: 100 are taken. */
        {.calls = {{"b0", "bulk", "{\"prefix\":\"x\",\"n\":150}"}},
         .ncalls = 1},
        /* Ten more calls of 95 new ones each pass the run's 1000. */
        {.calls = {{"", "bulk", "{\"prefix\":\"p%d\",\"n\":95}"}}, .many = 10},
        {.text = "done"}};
    const json_t *docs;
    harness h = {0};
    size_t total = 0;
    (void)state;

    reset_tools();
    run_with(&h, a, 3, NULL);
    assert_int_equal(h.rc, 0);
    assert_int_equal(json_array_size(json_object_get(
                         event_of(&h, "tool.metric", "b0"), "documents")),
                     LOOM_TOOL_DOCUMENTS_MAX);
    docs = loom_run_documents(h.run);
    assert_int_equal(json_array_size(docs), LOOM_RUN_MAX_DOCUMENTS);
    assert_string_equal(str_at(json_array_get(docs, 99), "id"), "x-99");
    for (int i = 0; i < 10; i++) {
        char id[16];
        snprintf(id, sizeof(id), "m%d", i);
        total += json_array_size(json_object_get(
            event_of(&h, "tool.metric", id), "documents"));
    }
    assert_int_equal(total, LOOM_RUN_MAX_DOCUMENTS - LOOM_TOOL_DOCUMENTS_MAX);
    harness_free(&h);
}

/* ---- telemetry ---- */

static void test_tool_metric(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "echo", "{\"text\":\"hello\"}"},
                   {"c2", "flaky", "{}"},
                   {"c3", "nope", "{}"},
                   {"c4", "echo", "{\"text\": "}},
         .ncalls = 4},
        {.text = "done"}};
    const json_t *records;
    json_t *m, *err;
    harness h = {0};
    (void)state;

    reset_tools();
    run_with(&h, a, 2, NULL);
    assert_int_equal(h.rc, 0);
    assert_int_equal(count_type(&h, "tool.metric"), 4);
    records = loom_run_tool_records(h.run);
    assert_int_equal(json_array_size(records), 4);
    m = event_of(&h, "tool.metric", "c1");
    assert_string_equal(str_at(m, "tool"), "echo");
    assert_int_equal(json_integer_value(json_object_get(m, "iteration")), 1);
    assert_string_equal(str_at(json_object_get(m, "arguments"), "text"),
                        "hello");
    assert_int_equal(json_integer_value(json_object_get(m, "arguments_size")),
                     16);
    /* Unix milliseconds: after 2020. */
    assert_true(json_integer_value(json_object_get(m, "started_at_ms")) >
                1577836800000LL);
    assert_true(json_is_real(json_object_get(m, "duration_ms")));
    assert_string_equal(str_at(m, "status"), "success");
    assert_true(json_is_null(json_object_get(m, "error")));
    assert_int_equal(json_integer_value(json_object_get(m, "result_size")),
                     strlen("echo:hello"));
    assert_int_equal(json_integer_value(json_object_get(m, "cost_micros")),
                     0);
    assert_true(json_is_array(json_object_get(m, "documents")));
    assert_false(json_is_true(json_object_get(m, "truncated")));
    /* The records are the events' data. */
    for (size_t i = 0; i < 4; i++) {
        json_t *r = json_array_get(records, i);
        json_t *e = event_of(&h, "tool.metric", str_at(r, "call_id"));
        json_t *k;
        const char *key;
        json_object_foreach(r, key, k)
        {
            assert_true(json_equal(k, json_object_get(e, key)));
        }
    }
    err = json_object_get(event_of(&h, "tool.metric", "c3"), "error");
    assert_string_equal(str_at(err, "code"), "ENOTFOUND");
    assert_string_equal(str_at(err, "stage"), "lookup");
    assert_string_equal(str_at(event_of(&h, "tool.metric", "c3"), "tool"),
                        "nope");
    /* Arguments that did not parse show as their text. */
    m = event_of(&h, "tool.metric", "c4");
    assert_string_equal(str_at(m, "arguments"), "{\"text\": ");
    assert_string_equal(str_at(json_object_get(m, "error"), "stage"),
                        "arguments");
    assert_string_equal(str_at(json_object_get(m, "error"), "code"),
                        "EINVALID");
    harness_free(&h);
}

static void test_record_limits(void **state)
{
    char *bigargs = malloc(LOOM_RUN_RECORD_ARGS_MAX + 64);
    mock_answer a[3];
    const char *shown;
    json_t *m;
    harness h = {0};
    int n;
    (void)state;

    n = sprintf(bigargs, "{\"text\":\"");
    memset(bigargs + n, 'y', LOOM_RUN_RECORD_ARGS_MAX);
    strcpy(bigargs + n + LOOM_RUN_RECORD_ARGS_MAX, "\"}");
    memset(a, 0, sizeof(a));
    a[0].calls[0][0] = "big", a[0].calls[0][1] = "echo";
    a[0].calls[0][2] = bigargs;
    a[0].calls[1][0] = "fit", a[0].calls[1][1] = "echo";
    a[0].calls[1][2] = "{\"text\":\"small\"}";
    a[0].ncalls = 2;
    /* More calls than a run keeps records of. */
    a[1].calls[0][1] = "counter";
    a[1].calls[0][2] = "{\"i\":%d}";
    a[1].many = LOOM_RUN_MAX_TOOL_RECORDS;
    a[2].text = "done";
    reset_tools();
    run_with(&h, a, 3, NULL);
    assert_int_equal(h.rc, 0);
    m = event_of(&h, "tool.metric", "big");
    shown = str_at(m, "arguments");
    assert_non_null(shown);
    assert_int_equal(strlen(shown), LOOM_RUN_RECORD_ARGS_MAX + 3);
    assert_string_equal(shown + LOOM_RUN_RECORD_ARGS_MAX, "...");
    assert_int_equal(json_integer_value(json_object_get(m, "arguments_size")),
                     LOOM_RUN_RECORD_ARGS_MAX + 11);
    assert_true(json_is_object(
        json_object_get(event_of(&h, "tool.metric", "fit"), "arguments")));
    assert_int_equal(counter_runs, LOOM_RUN_MAX_TOOL_RECORDS);
    assert_int_equal(count_type(&h, "tool.metric"),
                     LOOM_RUN_MAX_TOOL_RECORDS + 2);
    assert_int_equal(json_array_size(loom_run_tool_records(h.run)),
                     LOOM_RUN_MAX_TOOL_RECORDS);
    harness_free(&h);
    free(bigargs);
}

/* ---- timeouts ---- */

/* Sleepers that began and have not returned: abandoned ones, once their
 * run is over. */
static int sleepers_running(void)
{
    int n;

    pthread_mutex_lock(&mu);
    n = sleeper_started - sleeper_done;
    pthread_mutex_unlock(&mu);
    return n;
}

/*
 * Lets the sleepers return, then waits (30 s at most) until every
 * registry made is freed: the harness dropped its reference while a
 * sleeper still held one, so the sleeper's thread frees it on its way
 * out.
 */
static void release_sleepers(int expect)
{
    struct timespec until;
    int e = 0;

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30;
    pthread_mutex_lock(&mu);
    sleeper_release = 1;
    pthread_cond_broadcast(&cv);
    while (regs_freed < regs_made && e == 0)
        e = pthread_cond_timedwait(&cv, &mu, &until);
    assert_int_equal(regs_freed, regs_made);
    assert_int_equal(sleeper_done, expect);
    pthread_mutex_unlock(&mu);
}

static void test_tool_timeout(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"z1", "sleeper", "{}"}, {"e1", "echo", "{\"text\":\"q\"}"}},
         .ncalls = 2},
        {.text = "done"}};
    json_t *settings = json_pack("{s:{s:i}}", "sleeper", "timeout_ms", 50);
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    json_t *m;
    harness h = {0};
    (void)state;

    reset_tools();
    ro.tool_settings = settings;
    run_with(&h, a, 2, &ro);
    assert_int_equal(h.rc, 0);
    assert_string_equal(loom_run_text(h.run), "done");
    assert_string_equal(result_of(&h, "z1"),
                        "Error: tool 'sleeper' did not finish within its "
                        "timeout of 50 ms and was abandoned");
    assert_string_equal(result_of(&h, "e1"), "echo:q");
    assert_string_equal(str_at(event_of(&h, "tool.failed", "z1"), "stage"),
                        "execution");
    m = event_of(&h, "tool.metric", "z1");
    assert_string_equal(str_at(json_object_get(m, "error"), "code"),
                        "ETIMEDOUT");
    assert_true(json_real_value(json_object_get(m, "duration_ms")) >= 50.0);
    /* The tool still runs, after its run is gone. */
    assert_int_equal(sleepers_running(), 1);
    harness_free(&h);
    release_sleepers(1);
    assert_int_equal(sleeper_saw_cancel, 1);
    json_decref(settings);
}

/* The run's default, when the tool's settings give none. */
static void test_run_default_timeout(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"z1", "sleeper", "{}"}}, .ncalls = 1}, {.text = "done"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h = {0};
    (void)state;

    reset_tools();
    ro.tool_timeout_ms = 30;
    run_with(&h, a, 2, &ro);
    assert_int_equal(h.rc, 0);
    assert_contains(result_of(&h, "z1"), "within its timeout of 30 ms");
    harness_free(&h);
    release_sleepers(1);
}

static void test_timeout_setting_range(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"e1", "echo", "{\"text\":\"a\"}"}}, .ncalls = 1},
        {.text = "done"}};
    const json_t *bad[] = {json_integer(0), json_integer(86400001),
                           json_string("10")};
    (void)state;

    for (size_t i = 0; i < 3; i++) {
        json_t *settings = json_pack("{s:{s:O}}", "echo", "timeout_ms",
                                     bad[i]);
        loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
        harness h = {0};
        reset_tools();
        ro.tool_settings = settings;
        run_with(&h, a, 2, &ro);
        assert_int_equal(h.rc, 0);
        assert_string_equal(result_of(&h, "e1"),
                            "Error: setting tools.echo.timeout_ms must be an "
                            "integer from 1 to 86400000 (milliseconds)");
        assert_int_equal(echo_runs, 0);
        harness_free(&h);
        json_decref(settings);
        json_decref((json_t *)bad[i]);
    }
    {
        /* At the top of the range it runs. */
        json_t *settings = json_pack("{s:{s:i}}", "echo", "timeout_ms",
                                     86400000);
        loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
        harness h = {0};
        reset_tools();
        ro.tool_settings = settings;
        run_with(&h, a, 2, &ro);
        assert_string_equal(result_of(&h, "e1"), "echo:a");
        harness_free(&h);
        json_decref(settings);
    }
}

/* A cancelled run gives its tools LOOM__TOOL_CANCEL_GRACE_MS, then
 * leaves the ones that do not stop. */
static void test_cancel_abandons(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"z1", "sleeper", "{}"}}, .ncalls = 1}, {.text = "done"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h = {0};
    (void)state;

    reset_tools();
    ro.tool_timeout_ms = -1;
    h.cancel_on_start = 1;
    run_with(&h, a, 2, &ro);
    assert_int_equal(h.rc, LOOM_ECANCELED);
    assert_int_equal(loom_run_status_get(h.run), LOOM_RUN_CANCELLED);
    assert_string_equal(result_of(&h, "z1"),
                        "Error: tool 'sleeper' was stopped because the run "
                        "was cancelled");
    assert_string_equal(str_at(json_object_get(event_of(&h, "tool.metric",
                                                        "z1"),
                                               "error"),
                               "code"),
                        "ECANCELED");
    assert_int_equal(sleepers_running(), 1);
    harness_free(&h);
    release_sleepers(1);
    assert_int_equal(sleeper_saw_cancel, 1);
}

/* ---- config ---- */

static void test_config_agent_fields(void **state)
{
    static const char *base = "providers: {p: {base_url: 'http://h'}}\n"
                              "agents:\n  a:\n    model: p/m\n";
    const loom_agent_config *ag;
    loom_config *cfg = NULL;
    char yaml[512];
    (void)state;

    snprintf(yaml, sizeof(yaml), "%s    planning: true\n    think: yes\n"
             "    tool_timeout_ms: 86400000\n", base);
    assert_int_equal(loom_config_load_string(&cfg, yaml, "t.yaml"), 0);
    ag = loom_config_agent(cfg, "a");
    assert_int_equal(ag->planning, 1);
    assert_int_equal(ag->think, 1);
    assert_int_equal(ag->tool_timeout_ms, 86400000);
    loom_config_free(cfg);

    assert_int_equal(loom_config_load_string(&cfg, base, "t.yaml"), 0);
    ag = loom_config_agent(cfg, "a");
    assert_int_equal(ag->planning, 0);
    assert_int_equal(ag->think, 0);
    assert_int_equal(ag->tool_timeout_ms, 0);
    loom_config_free(cfg);

    snprintf(yaml, sizeof(yaml), "%s    tool_timeout_ms: 86400001\n", base);
    assert_int_equal(loom_config_load_string(&cfg, yaml, "t.yaml"),
                     LOOM_EINVALID);
    assert_contains(loom_error_last(), "agents.a.tool_timeout_ms: must be an "
                                       "integer from 1 to 86400000");
    snprintf(yaml, sizeof(yaml), "%s    tool_timeout_ms: 0\n", base);
    assert_int_equal(loom_config_load_string(&cfg, yaml, "t.yaml"),
                     LOOM_EINVALID);
    snprintf(yaml, sizeof(yaml), "%s    planning: maybe\n", base);
    assert_int_equal(loom_config_load_string(&cfg, yaml, "t.yaml"),
                     LOOM_EINVALID);
    assert_contains(loom_error_last(), "agents.a.planning");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_duplicate_calls),
        cmocka_unit_test(test_failed_call_is_not_duplicate),
        cmocka_unit_test(test_failure_budget),
        cmocka_unit_test(test_failure_budget_parallel),
        cmocka_unit_test(test_hooks),
        cmocka_unit_test(test_todo_write),
        cmocka_unit_test(test_bad_plans),
        cmocka_unit_test(test_stored_plan),
        cmocka_unit_test(test_think_turns_are_free),
        cmocka_unit_test(test_think_cap),
        cmocka_unit_test(test_think_limits_and_names),
        cmocka_unit_test(test_seen_documents),
        cmocka_unit_test(test_document_limits),
        cmocka_unit_test(test_tool_metric),
        cmocka_unit_test(test_record_limits),
        cmocka_unit_test(test_tool_timeout),
        cmocka_unit_test(test_run_default_timeout),
        cmocka_unit_test(test_timeout_setting_range),
        cmocka_unit_test(test_cancel_abandons),
        cmocka_unit_test(test_config_agent_fields),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);

    reset_tools();
    return rc;
}
