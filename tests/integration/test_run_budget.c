/*
 * Per-run budgets and the call gate (docs/accounts.md "Per-run budgets")
 * through the session layer in front of loom-fake-upstream. The model
 * costs $1 per million prompt tokens and $2 per million output tokens (a
 * prompt token is 1 micro-dollar, an output token 2) and writes at most
 * 1000 tokens, so a call's worst case is its counted prompt plus 2000
 * micro-dollars. Each test crosses one limit: the cost, the tokens, the
 * time, the account gate, and a sub-agent's spending against its
 * parent's budget; the run then makes one last call without tools
 * (its output cut to what is left) or, when even that cannot fit, ends
 * with what was said; either way it completes with finish_reason
 * "budget".
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fake.h"
#include "loom/session.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    loom_fake *fake;
    loom_config *cfg;
    loom_session *s;
    json_t *events;
} fx;

static void fx_open(fx *f, const char *script, const char *agents)
{
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    char *yaml = NULL;

    memset(f, 0, sizeof(*f));
    f->fake = fake_start_script(script);
    assert_non_null(f->fake);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake:\n"
                         "    kind: openai\n"
                         "    base_url: %s\n"
                         "    api_key: k\n"
                         "    retries: {max: 0}\n"
                         "routing: {retries: 0}\n"
                         "models:\n"
                         "  fake/m:\n"
                         "    max_output_tokens: 1000\n"
                         "    prices: {input: 1, output: 2}\n"
                         "agents:\n%s",
                         fake_base_url(f->fake), agents) > 0);
    if (loom_config_load_string(&f->cfg, yaml, "t.yaml") != 0)
        print_error("config: %s\n", loom_error_last());
    assert_non_null(f->cfg);
    free(yaml);
    so.config = f->cfg;
    if (loom_session_new(&f->s, &so) != 0)
        print_error("session: %s\n", loom_error_last());
    assert_non_null(f->s);
    f->events = json_array();
}

static void fx_close(fx *f)
{
    loom_session_free(f->s);
    loom_config_free(f->cfg);
    fake_stop(f->fake);
    json_decref(f->events);
}

static int keep_event(const loom_event *ev, void *payload)
{
    json_array_append_new(payload, loom_event_to_json(ev));
    return 0;
}

/* Runs agent on text with budget and gate (may be NULL); the turn must
 * complete. */
static loom_turn *run_ok(fx *f, const char *agent, const char *text,
                         const loom_run_budget *budget,
                         const loom_call_gate *gate)
{
    loom_turn_options o = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    loom_turn *t = NULL;
    int rc;

    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, text), 0);
    o.agent = agent;
    o.input = &in;
    o.sink = (loom_sink){keep_event, f->events};
    if (budget)
        o.budget = *budget;
    o.call_gate = gate;
    if (loom_turn_new(&t, f->s, &o) != 0)
        print_error("turn: %s\n", loom_error_last());
    assert_non_null(t);
    loom_messages_free(&in);
    rc = loom_turn_execute(t);
    if (rc != 0)
        print_error("turn: %s\n", loom_error_last());
    assert_int_equal(rc, 0);
    assert_int_equal(loom_run_status_get(loom_turn_run(t)), LOOM_RUN_COMPLETED);
    return t;
}

/* The top run's run.completed event. */
static const json_t *completed(const fx *f)
{
    size_t i;
    json_t *e;

    json_array_foreach(f->events, i, e)
    {
        if (!json_object_get(e, "parent_run_id") &&
            strcmp(json_string_value(json_object_get(e, "type")),
                   "run.completed") == 0)
            return e;
    }
    fail_msg("no run.completed");
    return NULL;
}

/* Checks that the run ended on its budget by limit. */
static void assert_budget_end(const fx *f, const loom_turn *t,
                              const char *limit)
{
    const json_t *done = completed(f);

    assert_string_equal(loom_run_finish_reason(loom_turn_run(t)), "budget");
    assert_string_equal(
        json_string_value(json_object_get(done, "finish_reason")), "budget");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(done, "budget"), "limit")),
                        limit);
}

/* Request i's body. */
static json_t *body_of(const fx *f, size_t i)
{
    json_t *r = fake_request(f->fake, i), *b;

    assert_non_null(r);
    b = json_incref(json_object_get(r, "body"));
    json_decref(r);
    assert_non_null(b);
    return b;
}

/* The body's output limit (max_tokens), or 0. */
static json_int_t max_tokens_of(const json_t *body)
{
    return json_integer_value(json_object_get(body, "max_tokens"));
}

/* Whether the body may call tools: tools offered and tool_choice not
 * "none". */
static int may_call_tools(const json_t *body)
{
    const char *choice =
        json_string_value(json_object_get(body, "tool_choice"));

    return json_array_size(json_object_get(body, "tools")) > 0 &&
           !(choice && strcmp(choice, "none") == 0);
}

static int has_budget_note(const json_t *body)
{
    char *s = json_dumps(json_object_get(body, "messages"), JSON_COMPACT);
    int yes = s && strstr(s, "reached its budget") != NULL;

    free(s);
    return yes;
}

static const char agent_with_time[] = "  main:\n"
                                      "    model: fake/m\n"
                                      "    system_prompt: You are main.\n"
                                      "    tools: [get_time]\n";

/* A first answer calling get_time with usage (prompt, completion), then
 * the final answer. */
static char *two_turn_script(long prompt, long completion, long delay_ms)
{
    char *s = NULL;

    assert_true(asprintf(&s,
                         "{\"responses\": ["
                         " {\"text\": [\"Let me check.\"], \"delay_ms\": %ld,"
                         "  \"tool_calls\": [{\"id\": \"call_1\", \"name\": "
                         "\"get_time\", \"arguments\": \"{}\"}],"
                         "  \"usage\": {\"prompt_tokens\": %ld, "
                         "\"completion_tokens\": %ld, \"total_tokens\": %ld}},"
                         " {\"text\": [\"It is late.\"],"
                         "  \"usage\": {\"prompt_tokens\": 200, "
                         "\"completion_tokens\": 20, \"total_tokens\": 220}}]}",
                         delay_ms, prompt, completion,
                         prompt + completion) > 0);
    return s;
}

/*
 * The fake's usage puts the spending in output tokens: the prompt counts
 * it reports stay near loom's own, so the token counter's correction
 * (loom_token_counter_observe) keeps the counted prompts small.
 *
 * max_cost_usd $0.003 (3000 micro-dollars): the first call costs 1920,
 * so the next one's worst case (its prompt + 2000) passes the budget.
 * The run's last call goes without tools, with the budget note and its
 * output cut to what is left; the run completes with its answer and the
 * cost stays within the budget.
 */
static void test_cost_budget_last_call(void **state)
{
    loom_run_budget b = {.max_cost_micros = 3000};
    char *script = two_turn_script(20, 950, 0);
    json_t *first, *last;
    loom_turn *t;
    fx f;

    (void)state;
    fx_open(&f, script, agent_with_time);
    t = run_ok(&f, "main", "what time is it?", &b, NULL);
    assert_string_equal(loom_run_text(loom_turn_run(t)), "It is late.");
    assert_budget_end(&f, t, "max_cost_usd");
    assert_int_equal(fake_request_count(f.fake), 2);
    first = body_of(&f, 0);
    last = body_of(&f, 1);
    assert_true(may_call_tools(first));
    assert_int_equal(max_tokens_of(first), 1000);
    assert_false(has_budget_note(first));
    assert_false(may_call_tools(last));
    assert_true(has_budget_note(last));
    /* What is left after 1920 is 1080: the prompt at 1 and the output at
     * 2 each must fit in it. */
    assert_true(max_tokens_of(last) >= LOOM_RUN_BUDGET_MIN_OUTPUT);
    assert_true(max_tokens_of(last) < 540);
    assert_int_equal(loom_run_usage(loom_turn_run(t))->cost_micros, 1920 + 240);
    assert_true(loom_run_usage(loom_turn_run(t))->cost_micros <= 3000);
    json_decref(first);
    json_decref(last);
    loom_turn_free(t);
    fx_close(&f);
    free(script);
}

/* The first call leaves 10 micro-dollars: not even the shortest last
 * call fits, so the run ends with what the model said, without another
 * call. */
static void test_cost_budget_cannot_fit(void **state)
{
    loom_run_budget b = {.max_cost_micros = 3000};
    char *script = two_turn_script(20, 1485, 0);
    loom_turn *t;
    fx f;

    (void)state;
    fx_open(&f, script, agent_with_time);
    t = run_ok(&f, "main", "what time is it?", &b, NULL);
    assert_int_equal(fake_request_count(f.fake), 1);
    assert_string_equal(loom_run_text(loom_turn_run(t)), "Let me check.");
    assert_budget_end(&f, t, "max_cost_usd");
    assert_int_equal(loom_run_usage(loom_turn_run(t))->cost_micros, 2990);
    loom_turn_free(t);
    fx_close(&f);
    free(script);
}

/* max_tokens 3000: after 2500 tokens the next call's worst case (its
 * prompt + 1000) passes it; the last call's output is cut to what is
 * left. The agent's own larger limit does not loosen the request's. */
static void test_token_budget(void **state)
{
    static const char agent[] = "  main:\n"
                                "    model: fake/m\n"
                                "    system_prompt: You are main.\n"
                                "    tools: [get_time]\n"
                                "    max_tokens: 100000\n";
    loom_run_budget b = {.max_tokens = 3000};
    char *script = two_turn_script(20, 2480, 0);
    json_t *last;
    loom_turn *t;
    fx f;

    (void)state;
    fx_open(&f, script, agent);
    t = run_ok(&f, "main", "what time is it?", &b, NULL);
    assert_budget_end(&f, t, "max_tokens");
    assert_int_equal(fake_request_count(f.fake), 2);
    last = body_of(&f, 1);
    assert_false(may_call_tools(last));
    assert_true(max_tokens_of(last) >= LOOM_RUN_BUDGET_MIN_OUTPUT);
    assert_true(max_tokens_of(last) < 500);
    assert_true(loom_run_usage(loom_turn_run(t))->total_tokens <= 3000);
    json_decref(last);
    loom_turn_free(t);
    fx_close(&f);
    free(script);
}

/* The agent's max_seconds: 1, and the first answer takes longer than
 * that to come: the next call is the last, without tools, and not cut
 * (no cost or token limit). */
static void test_time_budget(void **state)
{
    static const char agent[] = "  main:\n"
                                "    model: fake/m\n"
                                "    system_prompt: You are main.\n"
                                "    tools: [get_time]\n"
                                "    max_seconds: 1\n";
    char *script = two_turn_script(10, 10, 1100);
    json_t *last;
    loom_turn *t;
    fx f;

    (void)state;
    fx_open(&f, script, agent);
    t = run_ok(&f, "main", "what time is it?", NULL, NULL);
    assert_budget_end(&f, t, "max_seconds");
    assert_string_equal(loom_run_text(loom_turn_run(t)), "It is late.");
    assert_int_equal(fake_request_count(f.fake), 2);
    last = body_of(&f, 1);
    assert_false(may_call_tools(last));
    assert_true(has_budget_note(last));
    assert_int_equal(max_tokens_of(last), 1000);
    json_decref(last);
    loom_turn_free(t);
    fx_close(&f);
    free(script);
}

/* ---- the account gate ---------------------------------------------------- */

#define GATE_MAX 16

/* A test gate: refuses the reserves whose number (from 1) is in refuse
 * (0-ended), and records every reserve and settle. */
typedef struct {
    int refuse[4];
    int reserves, settles, held;
    char models[GATE_MAX][64];
    int64_t worst[GATE_MAX], real[GATE_MAX];
    long worst_tokens[GATE_MAX], real_tokens[GATE_MAX];
    int ids[GATE_MAX];
} test_gate;

static int gate_reserve(void *payload, const char *model, int64_t worst_micros,
                        long worst_tokens, void **ticket)
{
    test_gate *g = payload;
    int n = ++g->reserves;

    assert_true(n <= GATE_MAX);
    snprintf(g->models[n - 1], sizeof(g->models[0]), "%s", model);
    g->worst[n - 1] = worst_micros;
    g->worst_tokens[n - 1] = worst_tokens;
    for (int i = 0; g->refuse[i]; i++)
        if (g->refuse[i] == n)
            return 1;
    g->ids[n - 1] = n;
    *ticket = &g->ids[n - 1];
    g->held++;
    return 0;
}

static void gate_settle(void *payload, void *ticket, int64_t real_micros,
                        long real_tokens)
{
    test_gate *g = payload;
    int n = *(int *)ticket;

    g->settles++;
    g->held--;
    g->real[n - 1] = real_micros;
    g->real_tokens[n - 1] = real_tokens;
}

/*
 * The gate lets the first call go and refuses the second: the run makes
 * its last call without tools (the third reserve, let go) and completes.
 * Every call let go is settled to its real cost, which its worst case
 * bounds.
 */
static void test_gate_refuses_mid_run(void **state)
{
    test_gate g = {.refuse = {2, 0}};
    loom_call_gate gate = {gate_reserve, gate_settle, &g};
    char *script = two_turn_script(100, 10, 0);
    json_t *last;
    loom_turn *t;
    fx f;

    (void)state;
    fx_open(&f, script, agent_with_time);
    t = run_ok(&f, "main", "what time is it?", NULL, &gate);
    assert_budget_end(&f, t, "call_gate");
    assert_string_equal(loom_run_text(loom_turn_run(t)), "It is late.");
    assert_int_equal(g.reserves, 3);
    assert_int_equal(g.settles, 2);
    assert_int_equal(g.held, 0);
    assert_string_equal(g.models[0], "fake/m");
    assert_int_equal(g.real[0], 120);
    assert_int_equal(g.real_tokens[0], 110);
    assert_int_equal(g.real[2], 240);
    assert_int_equal(g.real_tokens[2], 220);
    for (int i = 0; i < 3; i++) {
        /* The prompt at 1 plus 1000 output tokens at 2. */
        assert_true(g.worst[i] > 2000);
        assert_int_equal(g.worst_tokens[i] + 1000, g.worst[i]);
    }
    last = body_of(&f, 1);
    assert_false(may_call_tools(last));
    json_decref(last);
    loom_turn_free(t);
    fx_close(&f);
    free(script);
}

/* The gate refuses every call after the first: the run ends with what
 * was said. */
static void test_gate_refuses_all(void **state)
{
    test_gate g = {.refuse = {2, 3, 0}};
    loom_call_gate gate = {gate_reserve, gate_settle, &g};
    char *script = two_turn_script(100, 10, 0);
    loom_turn *t;
    fx f;

    (void)state;
    fx_open(&f, script, agent_with_time);
    t = run_ok(&f, "main", "what time is it?", NULL, &gate);
    assert_budget_end(&f, t, "call_gate");
    assert_string_equal(loom_run_text(loom_turn_run(t)), "Let me check.");
    assert_int_equal(fake_request_count(f.fake), 1);
    assert_int_equal(g.reserves, 3);
    assert_int_equal(g.settles, 1);
    assert_int_equal(g.held, 0);
    loom_turn_free(t);
    fx_close(&f);
    free(script);
}

/* ---- sub-agents ---------------------------------------------------------- */

static const char sub_script[] =
    "{\"rules\": ["
    " {\"match\": {\"system\": \"You are main\"}, \"responses\": ["
    "   {\"tool_calls\": [{\"id\": \"call_r\", \"name\": \"researcher\","
    "     \"arguments\": \"{\\\"task\\\":\\\"find apples\\\"}\"}],"
    "    \"usage\": {\"prompt_tokens\": 100, \"completion_tokens\": 10,"
    "              \"total_tokens\": 110}},"
    "   {\"text\": [\"Main: 5 apples.\"],"
    "    \"usage\": {\"prompt_tokens\": 100, \"completion_tokens\": 10,"
    "              \"total_tokens\": 110}}]},"
    " {\"match\": {\"first_user\": \"find apples\"}, \"responses\": ["
    "   {\"text\": [\"5 apples\"],"
    "    \"usage\": {\"prompt_tokens\": 20, \"completion_tokens\": 1540,"
    "              \"total_tokens\": 1560}}]}"
    "]}";

static const char sub_agents[] = "  main:\n"
                                 "    model: fake/m\n"
                                 "    system_prompt: You are main.\n"
                                 "    tools: []\n"
                                 "    sub_agents: [researcher]\n"
                                 "    max_cost_usd: 0.005\n"
                                 "  researcher:\n"
                                 "    model: fake/m\n"
                                 "    system_prompt: You research.\n"
                                 "    tools: []\n";

/*
 * The parent's budget is 5000 micro-dollars; its first call costs 120,
 * its sub-agent's 3100, so its next call's worst case (prompt + 2000)
 * no longer fits whole: the last call goes without tools, cut. The
 * child asked the same gate (it inherits it) before its call.
 */
static void test_sub_agent_counts(void **state)
{
    test_gate g = {.refuse = {0}};
    loom_call_gate gate = {gate_reserve, gate_settle, &g};
    json_t *last;
    loom_turn *t;
    fx f;

    (void)state;
    fx_open(&f, sub_script, sub_agents);
    t = run_ok(&f, "main", "apples?", NULL, &gate);
    assert_string_equal(loom_run_text(loom_turn_run(t)), "Main: 5 apples.");
    assert_budget_end(&f, t, "max_cost_usd");
    assert_int_equal(loom_run_usage(loom_turn_run(t))->cost_micros,
                     120 + 3100 + 120);
    assert_int_equal(g.reserves, 3);
    assert_int_equal(g.settles, 3);
    assert_int_equal(g.real[1], 3100);
    assert_int_equal(fake_request_count(f.fake), 3);
    last = body_of(&f, 2);
    assert_true(has_budget_note(last));
    assert_true(max_tokens_of(last) < 1000);
    json_decref(last);
    loom_turn_free(t);
    fx_close(&f);
}

/* Without a budget the same tree runs as it always did: the child's
 * spending ends nothing. */
static void test_sub_agent_no_budget(void **state)
{
    static const char agents[] = "  main:\n"
                                 "    model: fake/m\n"
                                 "    system_prompt: You are main.\n"
                                 "    tools: []\n"
                                 "    sub_agents: [researcher]\n"
                                 "  researcher:\n"
                                 "    model: fake/m\n"
                                 "    system_prompt: You research.\n"
                                 "    tools: []\n";
    loom_turn *t;
    fx f;

    (void)state;
    fx_open(&f, sub_script, agents);
    t = run_ok(&f, "main", "apples?", NULL, NULL);
    assert_string_equal(loom_run_finish_reason(loom_turn_run(t)), "stop");
    assert_null(json_object_get(completed(&f), "budget"));
    loom_turn_free(t);
    fx_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cost_budget_last_call),
        cmocka_unit_test(test_cost_budget_cannot_fit),
        cmocka_unit_test(test_token_budget),
        cmocka_unit_test(test_time_budget),
        cmocka_unit_test(test_gate_refuses_mid_run),
        cmocka_unit_test(test_gate_refuses_all),
        cmocka_unit_test(test_sub_agent_counts),
        cmocka_unit_test(test_sub_agent_no_budget),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
