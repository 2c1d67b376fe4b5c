/*
 * GET /v1/runs/{id} and sub-agents (docs/server.md): a run whose agent
 * called two sub-agents (one failing) shows them as its children (id,
 * agent, status, usage, parent_call_id), each child is readable with its
 * own id from the store (its parent, its messages) by the same user, and
 * another user, or none, gets a 404 for it; a `user` that is not an
 * in-memory run's is a 404 too.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_server_harness.h"

static const char script[] =
    "{\"rules\": ["
    " {\"match\": {\"system\": \"You are main\"}, \"responses\": ["
    "   {\"tool_calls\": ["
    "     {\"id\": \"call_r\", \"name\": \"researcher\","
    "      \"arguments\": \"{\\\"task\\\":\\\"find apples\\\"}\"},"
    "     {\"id\": \"call_w\", \"name\": \"writer\","
    "      \"arguments\": \"{\\\"task\\\":\\\"write pears\\\"}\"}],"
    "    \"usage\": {\"prompt_tokens\": 100, \"completion_tokens\": 10,"
    "              \"total_tokens\": 110}},"
    "   {\"text\": [\"Main: 5 apples.\"],"
    "    \"usage\": {\"prompt_tokens\": 100, \"completion_tokens\": 10,"
    "              \"total_tokens\": 110}}]},"
    " {\"match\": {\"system\": \"You research\"}, \"responses\": ["
    "   {\"text\": [\"5 apples\"],"
    "    \"usage\": {\"prompt_tokens\": 10, \"completion_tokens\": 5,"
    "              \"total_tokens\": 15}}]},"
    " {\"match\": {\"system\": \"You write\"}, \"responses\": ["
    "   {\"status\": 400, \"error\": {\"message\": \"pears are banned\","
    "    \"type\": \"invalid_request_error\"}}]},"
    " {\"match\": {\"system\": \"You lead\"}, \"responses\": ["
    "   {\"tool_calls\": [{\"id\": \"call_s\", \"name\": \"scout\","
    "     \"arguments\": \"{\\\"task\\\":\\\"look\\\"}\"}],"
    "    \"usage\": {\"prompt_tokens\": 7, \"completion_tokens\": 1,"
    "              \"total_tokens\": 8}},"
    "   {\"text\": [\"Lead done.\"],"
    "    \"usage\": {\"prompt_tokens\": 7, \"completion_tokens\": 1,"
    "              \"total_tokens\": 8}}]},"
    " {\"match\": {\"system\": \"You scout\"}, \"responses\": ["
    "   {\"text\": [\"scouted\"],"
    "    \"usage\": {\"prompt_tokens\": 30, \"completion_tokens\": 3,"
    "              \"total_tokens\": 33}}]}"
    "]}";

static void start(sh *h)
{
    char *yaml = NULL;

    memset(h, 0, sizeof(*h));
    h->fake = fake_start_script(script);
    assert_non_null(h->fake);
    h->db = test_tmp_path("server-subagents.db");
    unlink(h->db);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake:\n"
                         "    base_url: %s\n"
                         "    api_key: sk-test\n"
                         "    retries: {max: 0}\n"
                         "routing: {retries: 0}\n"
                         "models:\n"
                         "  fake/m: {prices: {input: 1, output: 2}}\n"
                         "  fake/r: {upstream: model-r,"
                         " prices: {input: 3, output: 4}}\n"
                         "agents:\n"
                         "  main:\n"
                         "    model: fake/m\n"
                         "    system_prompt: You are main.\n"
                         "    tools: []\n"
                         "    sub_agents: [researcher, writer]\n"
                         "  researcher:\n"
                         "    model: fake/m\n"
                         "    system_prompt: You research.\n"
                         "    tools: []\n"
                         "  writer:\n"
                         "    model: fake/m\n"
                         "    system_prompt: You write.\n"
                         "    tools: []\n"
                         "  lead:\n"
                         "    model: fake/m\n"
                         "    system_prompt: You lead.\n"
                         "    tools: []\n"
                         "    sub_agents: [scout]\n"
                         "  scout:\n"
                         "    model: fake/r\n"
                         "    system_prompt: You scout.\n"
                         "    tools: []\n"
                         "server:\n"
                         "  listen: 127.0.0.1:0\n",
                         fake_base_url(h->fake)) > 0);
    sh_start_config(h, yaml);
    free(yaml);
}

static json_int_t usage_int(const json_t *run, const char *key)
{
    return json_integer_value(
        json_object_get(json_object_get(run, "usage"), key));
}

/* The child of kids called by call_id (must be there). */
static const json_t *child_by_call(const json_t *kids, const char *call_id)
{
    size_t i;
    json_t *k;

    json_array_foreach(kids, i, k)
    {
        if (strcmp(sh_str(k, "parent_call_id"), call_id) == 0)
            return k;
    }
    fail_msg("no child for call %s", call_id);
    return NULL;
}

static void test_run_children(void **state)
{
    sh h;
    json_t *run, *got, *child;
    const json_t *kids, *r, *w;
    char path[256], hv[128], *rid;
    sh_resp resp;

    (void)state;
    start(&h);
    run = sh_json(&h, "POST", "/v1/runs",
                  "{\"agent\":\"main\",\"input\":\"apples and pears?\","
                  "\"user\":\"ann\"}",
                  200);
    assert_string_equal(sh_str(run, "text"), "Main: 5 apples.");

    /* The run in memory, with its children from the store. */
    snprintf(path, sizeof(path), "/v1/runs/%s", sh_str(run, "id"));
    got = sh_json(&h, "GET", path, NULL, 200);
    assert_string_equal(sh_str(got, "status"), "completed");
    kids = json_object_get(got, "children");
    assert_int_equal(json_array_size(kids), 2);
    r = child_by_call(kids, "call_r");
    w = child_by_call(kids, "call_w");
    assert_string_equal(sh_str(r, "agent"), "researcher");
    assert_string_equal(sh_str(r, "status"), "completed");
    assert_int_equal(usage_int(r, "total_tokens"), 15);
    assert_int_equal(usage_int(r, "cost_micros"), 20);
    assert_string_equal(sh_str(w, "agent"), "writer");
    assert_string_equal(sh_str(w, "status"), "failed");
    /* The parent's total is its own calls plus its children's. */
    assert_int_equal(usage_int(got, "cost_micros"), 240 + 20);
    rid = strdup(sh_str(r, "id"));
    json_decref(got);

    /* The same run for its user; another user's `user` finds none. */
    snprintf(path, sizeof(path), "/v1/runs/%s?user=ann", sh_str(run, "id"));
    json_decref(sh_json(&h, "GET", path, NULL, 200));
    snprintf(path, sizeof(path), "/v1/runs/%s?user=bob", sh_str(run, "id"));
    json_decref(sh_json(&h, "GET", path, NULL, 404));

    /* A child is a run of its own, from the store, for the same user. */
    snprintf(path, sizeof(path), "/v1/runs/%s?user=ann", rid);
    memset(&resp, 0, sizeof(resp));
    assert_int_equal(sh_req(&h, "GET", path, NULL, NULL, &resp), 200);
    assert_string_equal(sh_header(&resp, "X-Loom-Run-Id", hv, sizeof(hv)), rid);
    assert_string_equal(
        sh_header(&resp, "X-Loom-Conversation-Id", hv, sizeof(hv)),
        sh_str(run, "conversation_id"));
    child = json_loads(resp.body, 0, NULL);
    assert_non_null(child);
    sh_resp_free(&resp);
    assert_string_equal(sh_str(child, "parent_run_id"), sh_str(run, "id"));
    assert_string_equal(sh_str(child, "parent_call_id"), "call_r");
    assert_string_equal(sh_str(child, "agent"), "researcher");
    assert_int_equal(json_integer_value(json_object_get(child, "depth")), 1);
    assert_string_equal(
        sh_str(json_array_get(json_object_get(child, "messages"), 0),
               "content"),
        "find apples");
    assert_string_equal(
        sh_str(json_array_get(json_object_get(child, "messages"), 1),
               "content"),
        "5 apples");
    json_decref(child);

    /* Another user, or no user, gets a 404 for it. */
    snprintf(path, sizeof(path), "/v1/runs/%s?user=bob", rid);
    json_decref(sh_json(&h, "GET", path, NULL, 404));
    snprintf(path, sizeof(path), "/v1/runs/%s", rid);
    json_decref(sh_json(&h, "GET", path, NULL, 404));
    free(rid);
    json_decref(run);
    sh_free(&h);
}

/* body holds the metrics line line (name, labels, value, newline). */
static void assert_metric(const char *body, const char *line)
{
    if (!strstr(body, line))
        fail_msg("/metrics lack %s in:\n%s", line, body);
}

/* /metrics counts a sub-agent's tokens and cost under the model it
 * ran on (scout on fake/r), not its parent's (lead on fake/m). */
static void test_metrics_by_child_model(void **state)
{
    sh h;
    json_t *run;
    sh_resp r;

    (void)state;
    start(&h);
    run = sh_json(&h, "POST", "/v1/runs",
                  "{\"agent\":\"lead\",\"input\":\"look around\"}", 200);
    assert_string_equal(sh_str(run, "text"), "Lead done.");
    json_decref(run);
    assert_int_equal(sh_req(&h, "GET", "/metrics", NULL, NULL, &r), 200);
    assert_metric(r.body,
                  "loom_tokens_total{model=\"fake/m\",kind=\"prompt\"} 14\n");
    assert_metric(r.body, "loom_tokens_total{model=\"fake/m\","
                          "kind=\"completion\"} 2\n");
    assert_metric(r.body,
                  "loom_tokens_total{model=\"fake/r\",kind=\"prompt\"} 30\n");
    assert_metric(r.body, "loom_tokens_total{model=\"fake/r\","
                          "kind=\"completion\"} 3\n");
    /* 14 * 1 + 2 * 2 and 30 * 3 + 3 * 4 micro-dollars. */
    assert_metric(r.body, "loom_cost_micros_total{model=\"fake/m\"} 18\n");
    assert_metric(r.body, "loom_cost_micros_total{model=\"fake/r\"} 102\n");
    sh_resp_free(&r);
    sh_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_run_children),
        cmocka_unit_test(test_metrics_by_child_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
