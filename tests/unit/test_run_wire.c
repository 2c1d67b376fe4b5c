/*
 * The modules wired into the run loop: review after tool turns, citation
 * numbers for tool documents and the answer's markers checked, the token
 * counter corrected by reported usage, the run's user given to every tool
 * call (also to one abandoned at its timeout), and the agent config keys
 * that turn them on (loom__run_agent_setup). The model is a scripted
 * mock provider that records what each request carried.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "agent/model_opts.h"
#include "loom/config.h"
#include "loom/run.h"
#include "loom/tokenizer.h"
#include "mock_provider.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAXCALLS 8

/* ---- the mock model ------------------------------------------------------ */

/* The scripted model: answer k is a[k] (text, or one call "call_1"); past
 * what a test sets, an empty answer. Every call reports 5 completion
 * tokens and, as prompt tokens, the counter's estimate of the request
 * times ratio (0: a fixed 10). */
typedef struct {
    mock_provider mock;
    mock_answer a[MAXCALLS];
    loom_token_counter *counter;
    double ratio;
} mockp;

static void wire_usage(const loom_llm_request *req, loom_usage *usage,
                       void *payload)
{
    const mockp *m = payload;

    if (m->counter && m->ratio > 0) {
        size_t est = loom_token_counter_request(
            m->counter, req->messages, req->messages_len, req->tools,
            req->tools_len);
        usage->prompt_tokens = (int64_t)((double)est * m->ratio);
    } else {
        usage->prompt_tokens = 10;
    }
    usage->completion_tokens = 5;
    usage->total_tokens = usage->prompt_tokens + 5;
}

static void wire_init(mockp *m)
{
    memset(m, 0, sizeof(*m));
    mock_init(&m->mock, m->a, MAXCALLS, 0);
    m->mock.base.name = (char *)"mock";
    m->mock.usage = wire_usage;
    m->mock.usage_payload = m;
}

/* Answer k calls tool with arguments {}. */
static void wire_call(mockp *m, int k, const char *tool)
{
    m->a[k].calls[0][0] = "call_1";
    m->a[k].calls[0][1] = tool;
    m->a[k].calls[0][2] = "{}";
    m->a[k].ncalls = 1;
}

/* ---- tools and the sink -------------------------------------------------- */

static int search_exec(const json_t *args, const loom_tool_ctx *ctx,
                       loom_buf *out, void *payload)
{
    (void)args;
    (void)payload;
    if (ctx->documents) {
        json_array_append_new(ctx->documents,
                              json_pack("{s:s,s:s,s:s}", "id", "ws_aaa",
                                        "url", "https://a/", "title", "A"));
        json_array_append_new(ctx->documents,
                              json_pack("{s:s,s:s,s:s}", "id", "ws_bbb",
                                        "url", "https://b/", "title", "B"));
    }
    return loom_buf_puts(out, "two results: A, B");
}

/* Answers with what the call was given about its user. */
static int whoami_exec(const json_t *args, const loom_tool_ctx *ctx,
                       loom_buf *out, void *payload)
{
    const char *key = json_string_value(
        json_object_get(ctx->user_keys, "tavily"));

    (void)args;
    (void)payload;
    return loom_buf_printf(out, "user=%s key=%s",
                           ctx->user_id ? ctx->user_id : "(none)",
                           key ? key : "(none)");
}

/* Overruns its timeout, then reads its user: the run that abandoned it
 * is gone by then (ASan would see a use after free). */
static atomic_int slow_saw_user;

static int slow_user_exec(const json_t *args, const loom_tool_ctx *ctx,
                          loom_buf *out, void *payload)
{
    (void)args;
    (void)payload;
    for (int i = 0; i < 100; i++)
        usleep(10 * 1000);
    atomic_store(&slow_saw_user,
                 ctx->user_id && strcmp(ctx->user_id, "u-slow") == 0 &&
                     json_is_string(json_object_get(ctx->user_keys, "k"))
                     ? 1 : -1);
    return loom_buf_puts(out, "late");
}

/* slow_user's free_payload: counts the registries gone, on whichever
 * thread dropped the last reference. */
static pthread_mutex_t freed_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t freed_cv = PTHREAD_COND_INITIALIZER;
static int regs_freed;

static void slow_reg_freed(void *payload)
{
    (void)payload;
    pthread_mutex_lock(&freed_mu);
    regs_freed++;
    pthread_cond_broadcast(&freed_cv);
    pthread_mutex_unlock(&freed_mu);
}

/* Waits (30 s at most) until `n` registries in all were freed. */
static void wait_regs_freed(int n)
{
    struct timespec until;
    int e = 0;

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30;
    pthread_mutex_lock(&freed_mu);
    while (regs_freed < n && e == 0)
        e = pthread_cond_timedwait(&freed_cv, &freed_mu, &until);
    assert_int_equal(regs_freed, n);
    pthread_mutex_unlock(&freed_mu);
}

typedef struct {
    json_t *events;
} sinkst;

static int sink(const loom_event *ev, void *payload)
{
    sinkst *s = payload;

    json_array_append_new(s->events, loom_event_to_json(ev));
    return 0;
}

static size_t count_events(const json_t *events, const char *type)
{
    size_t i, n = 0;
    json_t *e;

    json_array_foreach(events, i, e)
        n += strcmp(json_string_value(json_object_get(e, "type")), type) == 0;
    return n;
}

static json_t *first_event(const json_t *events, const char *type)
{
    size_t i;
    json_t *e;

    json_array_foreach(events, i, e)
        if (strcmp(json_string_value(json_object_get(e, "type")), type) == 0)
            return e;
    return NULL;
}

static loom_tool_registry *registry(void)
{
    loom_tool_registry *reg;
    loom_tool t1 = {.version = LOOM_TOOL_VERSION,
                    .name = "search",
                    .description = "Searches.",
                    .execute = search_exec};
    loom_tool t2 = {.version = LOOM_TOOL_VERSION,
                    .name = "whoami",
                    .description = "Says who.",
                    .execute = whoami_exec};
    loom_tool t3 = {.version = LOOM_TOOL_VERSION,
                    .name = "slow_user",
                    .description = "Slow.",
                    .execute = slow_user_exec,
                    .free_payload = slow_reg_freed};

    assert_int_equal(loom_tool_registry_new(&reg), 0);
    assert_int_equal(loom_tool_registry_add(reg, &t1), 0);
    assert_int_equal(loom_tool_registry_add(reg, &t2), 0);
    assert_int_equal(loom_tool_registry_add(reg, &t3), 0);
    return reg;
}

/* ---- review and citations ------------------------------------------------ */

static void test_review_and_citations(void **state)
{
    mockp m;
    loom_tool_registry *reg = registry();
    loom_run_options o = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    loom_run *run;
    sinkst s = {json_array()};
    const json_t *cites;
    json_t *rev, *done;

    (void)state;
    wire_init(&m);
    wire_call(&m, 0, "search");
    m.a[1].text = "```json\n{\"complete\":false,\"gaps\":[\"B's date\"],"
                   "\"next_step\":\"gather_more\",\"note\":\"Check B.\"}\n```";
    m.a[2].text = "Tokyo has 14M [1,2] and [9].";
    o.provider = &m.mock.base;
    o.upstream_model = "m";
    o.tools = reg;
    o.review.enabled = 1;
    o.citations = 1;
    o.sink.emit = sink;
    o.sink.payload = &s;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "tokyo?"), 0);
    assert_int_equal(loom_run_new(&run, &o, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);
    /* Grouped markers split, the one naming no source dropped. */
    assert_string_equal(loom_run_text(run), "Tokyo has 14M [1][2] and.");
    assert_int_equal(m.mock.next, 3);
    /* The review call read the transcript with the tool's result. */
    assert_non_null(strstr(m.mock.seen[1].last_content, "two results"));
    /* The next turn: the result annotated, the review's note last. */
    assert_non_null(strstr(m.mock.seen[2].first_tool,
                           "two results: A, B\n\nCitation numbers"));
    assert_non_null(strstr(m.mock.seen[2].first_tool,
                           "[1] ws_aaa\n[2] ws_bbb"));
    assert_non_null(strstr(m.mock.seen[2].last_content, "gather_more"));
    assert_int_equal(m.mock.seen[2].nsystem, 1);
    assert_int_equal(count_events(s.events, "review"), 1);
    rev = first_event(s.events, "review");
    assert_int_equal(json_integer_value(json_object_get(rev, "iteration")),
                     1);
    assert_string_equal(json_string_value(json_object_get(rev, "status")),
                        "ok");
    assert_int_equal(count_events(s.events, "citation"), 2);
    cites = loom_run_citations(run);
    assert_int_equal(json_array_size(cites), 2);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(cites, 1), "id")), "ws_bbb");
    done = first_event(s.events, "run.completed");
    assert_int_equal(json_array_size(json_object_get(done, "citations")), 2);
    /* Three calls, the review's included, each with its usage event (the
     * rows the store keeps add up to the run's total). */
    assert_int_equal(loom_run_usage(run)->total_tokens, 45);
    {
        json_int_t sum = 0;
        size_t k;
        json_t *e;
        int reviews = 0;
        json_array_foreach(s.events, k, e)
        {
            const char *purpose;
            if (strcmp(json_string_value(json_object_get(e, "type")),
                       "usage") != 0)
                continue;
            sum += json_integer_value(json_object_get(e, "total_tokens"));
            purpose = json_string_value(json_object_get(e, "purpose"));
            reviews += purpose && strcmp(purpose, "review") == 0;
        }
        assert_int_equal(sum, 45);
        assert_int_equal(reviews, 1);
    }
    /* The note is loom's, not the conversation's; the annotation is. */
    {
        const loom_messages *ad = loom_run_messages(run);
        int annotated = 0;
        for (size_t k = 0; k < ad->len; k++) {
            assert_false(ad->items[k].role == LOOM_ROLE_SYSTEM);
            if (ad->items[k].role == LOOM_ROLE_TOOL)
                annotated = strstr(ad->items[k].content, "[1] ws_aaa") != 0;
        }
        assert_true(annotated);
    }
    loom_run_free(run);
    loom_messages_free(&hist);
    loom_tool_registry_free(reg);
    json_decref(s.events);
    mock_clear(&m.mock);
}

/* No review when the next call is the last (it may not call tools). */
static void test_no_review_before_last_call(void **state)
{
    mockp m;
    loom_tool_registry *reg = registry();
    loom_run_options o = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    loom_run *run;
    sinkst s = {json_array()};

    (void)state;
    wire_init(&m);
    wire_call(&m, 0, "search");
    m.a[1].text = "Done [1].";
    o.provider = &m.mock.base;
    o.upstream_model = "m";
    o.tools = reg;
    o.max_iterations = 2;
    o.review.enabled = 1;
    o.sink.emit = sink;
    o.sink.payload = &s;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "q"), 0);
    assert_int_equal(loom_run_new(&run, &o, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);
    assert_int_equal(m.mock.next, 2);
    assert_int_equal(count_events(s.events, "review"), 0);
    /* Citations off: no numbers, markers left as written. */
    assert_null(strstr(m.mock.seen[1].first_tool, "Citation numbers"));
    assert_null(loom_run_citations(run));
    assert_string_equal(loom_run_text(run), "Done [1].");
    assert_int_equal(count_events(s.events, "citation"), 0);
    loom_run_free(run);
    loom_messages_free(&hist);
    loom_tool_registry_free(reg);
    json_decref(s.events);
    mock_clear(&m.mock);
}

/* A turn that only thought is not reviewed; a later tool turn is. */
static void test_no_review_for_think_turn(void **state)
{
    mockp m;
    loom_tool_registry *reg = registry();
    loom_run_options o = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    loom_run *run;
    sinkst s = {json_array()};

    (void)state;
    wire_init(&m);
    wire_call(&m, 0, "think");
    m.a[0].calls[0][2] = "{\"thought\":\"search first\"}";
    wire_call(&m, 1, "search");
    m.a[2].text = "{\"complete\":true,\"next_step\":\"proceed\","
                   "\"note\":\"ok\"}";
    m.a[3].text = "Answer.";
    o.provider = &m.mock.base;
    o.upstream_model = "m";
    o.tools = reg;
    o.think = 1;
    o.review.enabled = 1;
    o.sink.emit = sink;
    o.sink.payload = &s;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "q"), 0);
    assert_int_equal(loom_run_new(&run, &o, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);
    assert_int_equal(m.mock.next, 4);
    assert_int_equal(count_events(s.events, "review"), 1);
    assert_int_equal(json_integer_value(json_object_get(
                         first_event(s.events, "review"), "iteration")),
                     2);
    assert_string_equal(loom_run_text(run), "Answer.");
    loom_run_free(run);
    loom_messages_free(&hist);
    loom_tool_registry_free(reg);
    json_decref(s.events);
    mock_clear(&m.mock);
}

/* A review whose answer is not the JSON asked for is skipped, never
 * fatal, and leaves no note. */
static void test_review_skipped(void **state)
{
    mockp m;
    loom_tool_registry *reg = registry();
    loom_run_options o = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    loom_run *run;
    sinkst s = {json_array()};
    json_t *rev;

    (void)state;
    wire_init(&m);
    wire_call(&m, 0, "search");
    m.a[1].text = "I think it is fine.";
    m.a[2].text = "Answer.";
    o.provider = &m.mock.base;
    o.upstream_model = "m";
    o.tools = reg;
    o.review.enabled = 1;
    o.sink.emit = sink;
    o.sink.payload = &s;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "q"), 0);
    assert_int_equal(loom_run_new(&run, &o, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);
    rev = first_event(s.events, "review");
    assert_non_null(rev);
    assert_string_equal(json_string_value(json_object_get(rev, "status")),
                        "skipped");
    assert_int_equal(m.mock.seen[2].nsystem, 0);
    assert_string_equal(loom_run_text(run), "Answer.");
    loom_run_free(run);
    loom_messages_free(&hist);
    loom_tool_registry_free(reg);
    json_decref(s.events);
    mock_clear(&m.mock);
}

/* ---- token counting ------------------------------------------------------ */

#define LONG_PROMPT                                                          \
    "You are a careful research assistant. Answer the user's questions "    \
    "with short, precise sentences, and say when you are not sure about "   \
    "something rather than guessing. Prefer primary sources over "          \
    "summaries and name them when you use them."

static void observe_run(const char *model, long window, double ratio,
                        loom_token_counter *tc)
{
    mockp m;
    loom_run_options o = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    loom_run *run;

    wire_init(&m);
    m.a[0].text = "Fine.";
    m.counter = tc;
    m.ratio = ratio;
    o.provider = &m.mock.base;
    o.upstream_model = model;
    o.system_prompt = LONG_PROMPT;
    o.context.window = window;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER,
                                       "How tall is the Tokyo Skytree, and "
                                       "when was it finished?"), 0);
    o.context.token_counter = tc;
    assert_int_equal(loom_run_new(&run, &o, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);
    loom_run_free(run);
    loom_messages_free(&hist);
    mock_clear(&m.mock);
}

/* An estimating counter (an Anthropic model) follows the reported
 * usage, with the context engine on and off. */
static void test_token_counter_observed(void **state)
{
    loom_token_counter *tc = NULL;
    double f0, f1;

    (void)state;
    assert_int_equal(loom_token_counter_for_model(&tc, "claude-wire-up"), 0);
    assert_false(loom_token_counter_is_exact(tc));
    f0 = loom_token_counter_factor(tc);
    observe_run("claude-wire-up", 0, 3.0, tc); /* engine off */
    f1 = loom_token_counter_factor(tc);
    assert_true(f1 > f0);
    loom_token_counter_free(tc);

    assert_int_equal(loom_token_counter_for_model(&tc, "claude-wire-down"),
                     0);
    f0 = loom_token_counter_factor(tc);
    observe_run("claude-wire-down", 0, 0.5, tc);
    assert_true(loom_token_counter_factor(tc) < f0);
    loom_token_counter_free(tc);

    /* An exact counter (an OpenAI model) is not corrected. */
    assert_int_equal(loom_token_counter_for_model(&tc, "gpt-4o"), 0);
    if (loom_token_counter_is_exact(tc)) {
        observe_run("gpt-4o", 0, 3.0, tc);
        assert_true(loom_token_counter_factor(tc) == 1.0);
    }
    loom_token_counter_free(tc);
}

/* With the engine on, its count (made with the counter) is the estimate;
 * the run is set up the way `loom run` and `loom serve` set it up. */
static void test_token_counter_engine_on(void **state)
{
    loom_config *cfg = NULL;
    loom__run_context rc;
    loom_run_options o = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    loom_run *run;
    mockp m;
    sinkst s = {json_array()};
    double f0;

    (void)state;
    assert_int_equal(
        loom_config_load_string(&cfg,
                                "providers:\n"
                                "  anthropic: {kind: anthropic, base_url: "
                                "'http://127.0.0.1:9', api_key: k}\n"
                                "models:\n"
                                "  anthropic/claude-wire-engine: "
                                "{context_window: 100000}\n",
                                "t.yaml"),
        0);
    wire_init(&m);
    m.a[0].text = "Fine.";
    m.ratio = 2.0;
    o.provider = &m.mock.base;
    o.model = "anthropic/claude-wire-engine";
    o.upstream_model = "claude-wire-engine";
    o.system_prompt = LONG_PROMPT;
    o.sink.emit = sink;
    o.sink.payload = &s;
    assert_int_equal(loom__run_context_setup(&rc, &o, cfg, NULL), 0);
    assert_int_equal(o.context.window, 100000);
    assert_non_null(o.context.token_counter);
    assert_ptr_equal(o.context.counter.payload, o.context.token_counter);
    assert_false(loom_token_counter_is_exact(o.context.token_counter));
    m.counter = o.context.token_counter;
    f0 = loom_token_counter_factor(o.context.token_counter);
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER,
                                       "How tall is the Tokyo Skytree?"), 0);
    assert_int_equal(loom_run_new(&run, &o, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);
    assert_non_null(first_event(s.events, "context"));
    assert_true(loom_token_counter_factor(o.context.token_counter) > f0);
    loom_run_free(run);
    loom__run_context_free(&rc);
    loom_messages_free(&hist);
    loom_config_free(cfg);
    json_decref(s.events);
    mock_clear(&m.mock);
}

/* ---- users --------------------------------------------------------------- */

static void test_user_reaches_tools(void **state)
{
    mockp m;
    loom_tool_registry *reg = registry();
    loom_run_options o = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    loom_run *run;
    json_t *keys = json_pack("{s:s}", "tavily", "tv-123");

    (void)state;
    wire_init(&m);
    wire_call(&m, 0, "whoami");
    m.a[1].text = "ok";
    o.provider = &m.mock.base;
    o.upstream_model = "m";
    o.tools = reg;
    o.user_id = "alice";
    o.user_keys = keys;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "q"), 0);
    assert_int_equal(loom_run_new(&run, &o, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);
    assert_string_equal(m.mock.seen[1].first_tool, "user=alice key=tv-123");
    loom_run_free(run);
    mock_clear(&m.mock);

    /* Anonymous. */
    wire_init(&m);
    wire_call(&m, 0, "whoami");
    m.a[1].text = "ok";
    o.provider = &m.mock.base;
    o.user_id = NULL;
    o.user_keys = NULL;
    assert_int_equal(loom_run_new(&run, &o, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);
    assert_string_equal(m.mock.seen[1].first_tool, "user=(none) key=(none)");
    loom_run_free(run);
    mock_clear(&m.mock);
    loom_messages_free(&hist);
    loom_tool_registry_free(reg);
    json_decref(keys);
}

/* A call abandoned at its timeout has its own copy of the user: it reads
 * it after the run and the caller's strings are gone. */
static void test_user_outlives_run(void **state)
{
    mockp m;
    loom_tool_registry *reg = registry();
    loom_run_options o = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    loom_run *run;
    char *user = strdup("u-slow");
    json_t *keys = json_pack("{s:s}", "k", "v");
    int freed;

    (void)state;
    atomic_store(&slow_saw_user, 0);
    wire_init(&m);
    wire_call(&m, 0, "slow_user");
    m.a[1].text = "gave up";
    o.provider = &m.mock.base;
    o.upstream_model = "m";
    o.tools = reg;
    o.user_id = user;
    o.user_keys = keys;
    o.tool_timeout_ms = 20;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "q"), 0);
    assert_int_equal(loom_run_new(&run, &o, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);
    loom_run_free(run);
    free(user);
    json_decref(keys);
    /* The abandoned call holds the registry: it frees it on its way out,
     * once it has read its user. */
    pthread_mutex_lock(&freed_mu);
    freed = regs_freed;
    pthread_mutex_unlock(&freed_mu);
    loom_tool_registry_free(reg);
    wait_regs_freed(freed + 1);
    assert_int_equal(atomic_load(&slow_saw_user), 1);
    loom_messages_free(&hist);
    mock_clear(&m.mock);
}

/* ---- agent config -------------------------------------------------------- */

static void test_agent_keys(void **state)
{
    loom_config *cfg = NULL;
    const loom_agent_config *a, *b;
    loom__run_context rc;
    loom_run_options o = LOOM_RUN_OPTIONS_INIT;

    (void)state;
    if (loom_config_load_string(
            &cfg,
            "providers: {p: {base_url: 'http://127.0.0.1:9', api_key: k}}\n"
            "models:\n"
            "  p/m: {}\n"
            "  p/small: {upstream: small-1}\n"
            "agents:\n"
            "  a: {model: p/m, review: true, review_model: p/small,\n"
            "      citations: true, memory: false, planning: true,\n"
            "      think: true, tool_timeout_ms: 1234,\n"
            "      limit_prompt: 'Answer now.',\n"
            "      many_results_prompt: {after: 3, prompt: Short.}}\n"
            "  b: {model: p/m}\n"
            "  c: {model: p/m, many_results_prompt: {}}\n",
            "t.yaml") != 0)
        fail_msg("config: %s", loom_error_last());
    a = loom_config_agent(cfg, "a");
    b = loom_config_agent(cfg, "b");
    assert_true(a->review);
    assert_string_equal(a->review_model, "p/small");
    assert_true(a->citations);
    assert_false(a->memory);
    assert_false(b->review);
    assert_null(b->review_model);
    assert_false(b->citations);
    assert_true(b->memory);

    memset(&rc, 0, sizeof(rc));
    assert_int_equal(loom__run_agent_setup(&rc, &o, cfg, a, NULL), 0);
    assert_true(o.planning);
    assert_true(o.think);
    assert_int_equal(o.tool_timeout_ms, 1234);
    assert_true(o.citations);
    assert_true(o.review.enabled);
    assert_non_null(o.review.provider);
    assert_string_equal(o.review.model, "small-1");
    assert_string_equal(o.limit_prompt, "Answer now.");
    assert_int_equal(o.many_results_after, 3);
    assert_string_equal(o.many_results_prompt, "Short.");
    loom__run_context_free(&rc);

    o = (loom_run_options)LOOM_RUN_OPTIONS_INIT;
    assert_int_equal(loom__run_agent_setup(&rc, &o, cfg, b, NULL), 0);
    assert_false(o.review.enabled);
    assert_null(o.review.provider);
    assert_int_equal(o.tool_timeout_ms, 0);
    assert_null(o.limit_prompt);
    assert_int_equal(o.many_results_after, 0);
    loom__run_context_free(&rc);
    /* The key given: after 2 and the built-in prompt. */
    o = (loom_run_options)LOOM_RUN_OPTIONS_INIT;
    assert_int_equal(
        loom__run_agent_setup(&rc, &o, cfg, loom_config_agent(cfg, "c"), NULL),
        0);
    assert_int_equal(o.many_results_after, 2);
    assert_null(o.many_results_prompt);
    loom__run_context_free(&rc);
    loom_config_free(cfg);

    /* A reviewer model that does not resolve is a config error. */
    assert_int_not_equal(
        loom_config_load_string(
            &cfg,
            "providers: {p: {base_url: 'http://127.0.0.1:9', api_key: k}}\n"
            "agents:\n"
            "  a: {model: p/m, review: true, review_model: q/x}\n",
            "t.yaml"),
        0);
    assert_non_null(strstr(loom_error_last(), "agents.a.review_model"));
    assert_int_not_equal(
        loom_config_load_string(
            &cfg,
            "providers: {p: {base_url: 'http://127.0.0.1:9', api_key: k}}\n"
            "agents:\n"
            "  a: {model: p/m, citations: maybe}\n",
            "t.yaml"),
        0);
    assert_non_null(strstr(loom_error_last(), "agents.a.citations"));
    assert_int_not_equal(
        loom_config_load_string(
            &cfg,
            "providers: {p: {base_url: 'http://127.0.0.1:9', api_key: k}}\n"
            "agents:\n"
            "  a: {model: p/m, many_results_prompt: {after: 0}}\n",
            "t.yaml"),
        0);
    assert_non_null(
        strstr(loom_error_last(), "agents.a.many_results_prompt.after"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_review_and_citations),
        cmocka_unit_test(test_no_review_before_last_call),
        cmocka_unit_test(test_no_review_for_think_turn),
        cmocka_unit_test(test_review_skipped),
        cmocka_unit_test(test_token_counter_observed),
        cmocka_unit_test(test_token_counter_engine_on),
        cmocka_unit_test(test_user_reaches_tools),
        cmocka_unit_test(test_user_outlives_run),
        cmocka_unit_test(test_agent_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
