/*
 * `loom serve` routes every run through its model's router: a failing
 * primary falls back to the next model and the answer, the usage rows and
 * the stored message name the model that answered; a cooldown started by
 * one run is seen by the next (one failure record for the server); the
 * model's request options (reasoning effort, max output tokens) reach the
 * upstream; and a bare model name goes to the default model's provider
 * even with several providers configured.
 */
#include "test_server_harness.h"

typedef struct {
    sh h;           /* h.fake is the primary */
    loom_fake *second;
} rt;

/* Two fakes, providers p1 (primary) and p2; models_yaml under models:. */
static void rt_start(rt *t, const char *primary, const char *second,
                     const char *models_yaml)
{
    static int n;
    loom_server_options so = LOOM_SERVER_OPTIONS_INIT;
    char name[64], *yaml = NULL;

    memset(t, 0, sizeof(*t));
    t->h.fake = fake_start_script(primary);
    t->second = fake_start_script(second);
    assert_non_null(t->h.fake);
    assert_non_null(t->second);
    snprintf(name, sizeof(name), "routing-%d.db", n++);
    t->h.db = test_tmp_path(name);
    unlink(t->h.db);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  p1:\n"
                         "    base_url: %s\n"
                         "    api_key: sk-1\n"
                         "    retries: {max: 0}\n"
                         "  p2:\n"
                         "    base_url: %s\n"
                         "    api_key: sk-2\n"
                         "    retries: {max: 0}\n"
                         "%s"
                         "server:\n"
                         "  listen: 127.0.0.1:0\n",
                         fake_base_url(t->h.fake), fake_base_url(t->second),
                         models_yaml) > 0);
    if (loom_config_load_string(&t->h.cfg, yaml, "routing.yaml") != 0)
        fail_msg("config: %s", loom_error_last());
    free(yaml);
    if (loom_store_open(&t->h.store, t->h.db) != 0)
        fail_msg("store: %s", loom_error_last());
    t->h.tools = sh_tools();
    so.config = t->h.cfg;
    so.store = t->h.store;
    so.tools = t->h.tools;
    if (loom_server_new(&t->h.srv, &so) != 0 ||
        loom_server_start(t->h.srv) != 0)
        fail_msg("server: %s", loom_error_last());
    snprintf(t->h.base, sizeof(t->h.base), "http://127.0.0.1:%d",
             loom_server_port(t->h.srv));
}

static void rt_free(rt *t)
{
    sh_free(&t->h);
    fake_stop(t->second);
}

static size_t nrequests(const loom_fake *f)
{
    json_t *r = fake_requests(f);
    size_t n = json_array_size(r);

    json_decref(r);
    return n;
}

/* The first event of type in a run object's events, or NULL. */
static json_t *event_of(json_t *run, const char *type)
{
    json_t *evs = json_object_get(run, "events"), *e;
    size_t i;

    json_array_foreach(evs, i, e) {
        if (strcmp(sh_str(e, "type"), type) == 0)
            return e;
    }
    return NULL;
}

#define FAILING                                                              \
    "{\"responses\":[{\"status\":503,\"error\":{\"message\":\"down\","       \
    "\"type\":\"server_error\"}},{\"status\":503,\"error\":{\"message\":"    \
    "\"down\",\"type\":\"server_error\"}}]}"

static void test_fallback_answers_and_is_recorded(void **state)
{
    rt t;
    json_t *run, *conv, *u, *msgs, *last;
    char path[128];

    (void)state;
    rt_start(&t, FAILING,
             "{\"responses\":[{\"text\":[\"from the fallback\"],"
             "\"usage\":{\"prompt_tokens\":1000,\"completion_tokens\":100,"
             "\"total_tokens\":1100}}]}",
             "models:\n"
             "  p1/m: {fallbacks: [p2/m2]}\n"
             "  p2/m2:\n"
             "    upstream: second-model\n"
             "    prices: {input: \"1.00\", output: \"2.00\"}\n");
    run = sh_json(&t.h, "POST", "/v1/runs",
                  "{\"model\":\"p1/m\",\"input\":\"hi\",\"tools\":[]}", 200);
    assert_string_equal(sh_str(run, "status"), "completed");
    assert_string_equal(sh_str(run, "text"), "from the fallback");
    /* The answering model is in the events... */
    u = event_of(run, "usage");
    assert_non_null(u);
    assert_string_equal(sh_str(u, "model"), "p2/m2");
    /* 1000 x $1 + 100 x $2 per million tokens = 1200 micro-dollars. */
    assert_int_equal(json_integer_value(json_object_get(u, "cost_micros")),
                     1200);
    assert_string_equal(sh_str(event_of(run, "run.completed"), "model"),
                        "p2/m2");
    /* ...the usage rows and the stored message. */
    snprintf(path, sizeof(path), "/v1/conversations/%s",
             sh_str(run, "conversation_id"));
    conv = sh_json(&t.h, "GET", path, NULL, 200);
    u = json_array_get(json_object_get(conv, "usage"), 0);
    assert_string_equal(sh_str(u, "model"), "p2/m2");
    assert_int_equal(json_integer_value(json_object_get(u, "cost_micros")),
                     1200);
    msgs = json_object_get(conv, "messages");
    last = json_array_get(msgs, json_array_size(msgs) - 1);
    assert_string_equal(sh_str(last, "role"), "assistant");
    assert_string_equal(sh_str(last, "model"), "p2/m2");
    assert_string_equal(sh_str(last, "content"), "from the fallback");
    /* The fallback was asked with its own upstream id. */
    {
        json_t *reqs = fake_requests(t.second);
        assert_string_equal(
            sh_str(json_object_get(json_array_get(reqs, 0), "body"),
                   "model"),
            "second-model");
        json_decref(reqs);
    }
    json_decref(conv);
    json_decref(run);
    rt_free(&t);
}

static void test_cooldown_shared_by_runs(void **state)
{
    rt t;
    json_t *run;

    (void)state;
    rt_start(&t, FAILING,
             "{\"responses\":[{\"text\":[\"one\"]},{\"text\":[\"two\"]}]}",
             "models:\n"
             "  p1/m:\n"
             "    fallbacks: [p2/m2]\n"
             "    routing: {failures_before_cooldown: 1, "
             "cooldown_ms: 600000}\n"
             "  p2/m2: {}\n");
    run = sh_json(&t.h, "POST", "/v1/runs",
                  "{\"model\":\"p1/m\",\"input\":\"a\",\"tools\":[]}", 200);
    assert_string_equal(sh_str(run, "text"), "one");
    json_decref(run);
    assert_int_equal(nrequests(t.h.fake), 1);
    /* A second run, with a router of its own, skips the cooling primary. */
    run = sh_json(&t.h, "POST", "/v1/runs",
                  "{\"model\":\"p1/m\",\"input\":\"b\",\"tools\":[]}", 200);
    assert_string_equal(sh_str(run, "text"), "two");
    json_decref(run);
    assert_int_equal(nrequests(t.h.fake), 1);
    assert_int_equal(nrequests(t.second), 2);
    rt_free(&t);
}

static void test_model_request_options_reach_upstream(void **state)
{
    rt t;
    json_t *run, *reqs, *body;

    (void)state;
    rt_start(&t,
             "{\"responses\":[{\"text\":[\"ok\"]},{\"text\":[\"ok\"]}]}",
             "{\"responses\":[]}",
             "models:\n"
             "  p1/thinker:\n"
             "    upstream: o-thinker\n"
             "    max_output_tokens: 777\n"
             "    capabilities: {reasoning: true}\n"
             "    reasoning: {effort: high}\n"
             "  p1/plain: {capabilities: {tools: false}}\n");
    run = sh_json(&t.h, "POST", "/v1/runs",
                  "{\"model\":\"p1/thinker\",\"input\":\"think\"}", 200);
    json_decref(run);
    /* A request's own max_tokens wins over the model's. */
    run = sh_json(&t.h, "POST", "/v1/runs",
                  "{\"model\":\"p1/plain\",\"input\":\"x\",\"max_tokens\":5}",
                  200);
    json_decref(run);
    reqs = fake_requests(t.h.fake);
    body = json_object_get(json_array_get(reqs, 0), "body");

    assert_string_equal(sh_str(body, "model"), "o-thinker");
    assert_non_null(json_object_get(body, "reasoning_effort"));
    assert_string_equal(sh_str(body, "reasoning_effort"), "high");
    assert_int_equal(
        json_integer_value(json_object_get(body, "max_completion_tokens")) +
            json_integer_value(json_object_get(body, "max_tokens")),
        777);
    /* o-thinker is of no family known to refuse max_tokens. */
    assert_int_equal(json_integer_value(json_object_get(body, "max_tokens")),
                     777);
    assert_null(json_object_get(body, "max_completion_tokens"));
    assert_non_null(json_object_get(body, "tools"));
    body = json_object_get(json_array_get(reqs, 1), "body");
    /* A model without function calling is offered no tools. */
    assert_null(json_object_get(body, "tools"));
    assert_null(json_object_get(body, "reasoning_effort"));
    assert_int_equal(
        json_integer_value(json_object_get(body, "max_completion_tokens")) +
            json_integer_value(json_object_get(body, "max_tokens")),
        5);
    assert_int_equal(json_integer_value(json_object_get(body, "max_tokens")),
                     5);
    assert_null(json_object_get(body, "max_completion_tokens"));
    json_decref(reqs);
    rt_free(&t);
}

static void test_bare_model_goes_to_default_provider(void **state)
{
    rt t;
    json_t *resp, *reqs;

    (void)state;
    rt_start(&t, "{\"responses\":[{\"text\":[\"primary here\"]}]}",
             "{\"responses\":[]}", "");
    resp = sh_json(&t.h, "POST", "/v1/chat/completions",
                   "{\"model\":\"some-model\",\"messages\":[{\"role\":"
                   "\"user\",\"content\":\"hi\"}]}",
                   200);
    assert_string_equal(
        sh_str(json_object_get(json_array_get(json_object_get(resp,
                                                               "choices"),
                                               0),
                               "message"),
               "content"),
        "primary here");
    json_decref(resp);
    reqs = fake_requests(t.h.fake);
    assert_string_equal(
        sh_str(json_object_get(json_array_get(reqs, 0), "body"), "model"),
        "some-model");
    json_decref(reqs);
    assert_int_equal(nrequests(t.second), 0);
    rt_free(&t);
}


static void test_context_window_and_fallback(void **state)
{
    rt t;
    json_t *run, *ctx, *reqs;
    char *body, *big;
    size_t n = 40000;

    (void)state;
    rt_start(&t, "{\"responses\":[{\"text\":[\"small\"]}]}",
             "{\"responses\":[{\"text\":[\"big\"]}]}",
             "models:\n"
             "  p1/small:\n"
             "    context_window: 4000\n"
             "    max_output_tokens: 500\n"
             "    context_window_fallback: p2/big\n"
             "  p2/big: {context_window: 200000}\n"
             "  p1/gpt-4o-mini: {}\n");
    /* A listed model without a window gets the known one of its id. */
    run = sh_json(&t.h, "POST", "/v1/runs",
                  "{\"model\":\"p1/gpt-4o-mini\",\"input\":\"hi\","
                  "\"tools\":[]}",
                  200);
    ctx = event_of(run, "context");
    assert_non_null(ctx);
    assert_int_equal(json_integer_value(json_object_get(ctx, "window")),
                     128000);
    json_decref(run);
    /* The configured window; a question that cannot fit it moves the run
     * to the model's context_window_fallback. */
    big = malloc(n + 1);
    assert_non_null(big);
    for (size_t i = 0; i < n; i++)
        big[i] = i % 5 == 4 ? ' ' : 'x';
    big[n] = '\0';
    assert_true(asprintf(&body,
                         "{\"model\":\"p1/small\",\"input\":\"%s\","
                         "\"tools\":[]}",
                         big) > 0);
    run = sh_json(&t.h, "POST", "/v1/runs", body, 200);
    ctx = event_of(run, "context");
    assert_non_null(ctx);
    assert_non_null(json_object_get(ctx, "switched"));
    assert_string_equal(
        sh_str(json_object_get(ctx, "switched"), "from"), "p1/small");
    assert_string_equal(
        sh_str(json_object_get(ctx, "switched"), "to"), "p2/big");
    /* The request was fitted to the larger window, the question whole. */
    assert_int_equal(json_integer_value(json_object_get(ctx, "window")),
                     200000);
    assert_null(json_object_get(ctx, "warnings"));
    assert_string_equal(sh_str(run, "text"), "big");
    reqs = fake_requests(t.second);
    assert_int_equal(json_array_size(reqs), 1);
    json_decref(reqs);
    /* The small model was asked only by the first run. */
    assert_int_equal(nrequests(t.h.fake), 1);
    json_decref(run);
    free(body);
    free(big);
    rt_free(&t);
}

static void test_plan_carried_to_next_turn(void **state)
{
    rt t;
    json_t *run, *conv, *reqs, *msgs;
    char body[512], path[128], *conv_id, *sys;

    (void)state;
    rt_start(&t,
             "{\"responses\":["
             "{\"tool_calls\":[{\"id\":\"c1\",\"name\":\"todo_write\","
             "\"arguments\":\"{\\\"goal\\\":\\\"Ship the report\\\","
             "\\\"tasks\\\":[{\\\"id\\\":\\\"t1\\\",\\\"description\\\":"
             "\\\"Draft it\\\",\\\"status\\\":\\\"in_progress\\\"}]}\"}]},"
             "{\"text\":[\"planned\"]},{\"text\":[\"carrying on\"]}]}",
             "{\"responses\":[]}",
             "models:\n"
             "  p1/m: {}\n"
             "agents:\n"
             "  planner: {model: p1/m, planning: true, tools: []}\n");
    run = sh_json(&t.h, "POST", "/v1/runs",
                  "{\"agent\":\"planner\",\"input\":\"plan it\"}", 200);
    assert_string_equal(sh_str(run, "text"), "planned");
    conv_id = strdup(sh_str(run, "conversation_id"));
    json_decref(run);
    /* The plan is kept with the conversation... */
    snprintf(path, sizeof(path), "/v1/conversations/%s", conv_id);
    conv = sh_json(&t.h, "GET", path, NULL, 200);
    assert_string_equal(sh_str(json_object_get(conv, "plan"), "goal"),
                        "Ship the report");
    json_decref(conv);
    /* ...and the next turn's system prompt shows it. */
    snprintf(body, sizeof(body),
             "{\"agent\":\"planner\",\"input\":\"go on\","
             "\"conversation_id\":\"%s\"}",
             conv_id);
    run = sh_json(&t.h, "POST", "/v1/runs", body, 200);
    assert_string_equal(sh_str(run, "text"), "carrying on");
    json_decref(run);
    reqs = fake_requests(t.h.fake);
    assert_int_equal(json_array_size(reqs), 3);
    msgs = json_object_get(json_object_get(json_array_get(reqs, 2), "body"),
                           "messages");
    sys = json_dumps(msgs, 0);
    assert_non_null(strstr(sys, "<plan>"));
    assert_non_null(strstr(sys, "Ship the report"));
    free(sys);
    json_decref(reqs);
    free(conv_id);
    rt_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fallback_answers_and_is_recorded),
        cmocka_unit_test(test_cooldown_shared_by_runs),
        cmocka_unit_test(test_model_request_options_reach_upstream),
        cmocka_unit_test(test_bare_model_goes_to_default_provider),
        cmocka_unit_test(test_context_window_and_fallback),
        cmocka_unit_test(test_plan_carried_to_next_turn),
    };

    curl_global_init(CURL_GLOBAL_DEFAULT);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
