/*
 * MCP forms through the server (docs/mcp.md "Elicitation", POST
 * /v1/runs/{id}/input): a streamed run whose MCP tool asks for a form
 * emits mcp.elicitation, survives its client leaving, refuses an answer
 * that does not fit the schema (400) and goes on with the one that does,
 * the server getting it with the schema's default filled in; an answer
 * given twice is 409. A streamed background run asks too, and its form
 * is answered by whoever follows the run again; a form nobody answers
 * within the agent's approval_timeout_ms is cancelled. A background run
 * that is not streamed declines without asking. The fake upstream plays
 * the model and loom-fake-mcp the server; the test waits on events,
 * never on time.
 */
#include "test_server_harness.h"

#include "loom/mcp.h"

/* The model calls fake__elicit once, then answers. */
#define SCRIPT                                                                 \
    "{\"loop\":true,\"responses\":["                                           \
    "{\"tool_calls\":[{\"id\":\"c1\",\"name\":\"fake__elicit\","               \
    "\"arguments\":\"{}\"}]},"                                                 \
    "{\"text\":[\"thanks\"]}]}"

/* A server whose MCP servers know someone may be asked, as `loom serve`
 * makes them. */
static void start(sh *h)
{
    static int n;
    loom_server_options so = LOOM_SERVER_OPTIONS_INIT;
    loom_mcp_setup setup = {0};
    char name[64], *yaml = NULL;

    memset(h, 0, sizeof(*h));
    h->fake = fake_start_script(SCRIPT);
    assert_non_null(h->fake);
    snprintf(name, sizeof(name), "elicit-%d.db", n++);
    h->db = test_tmp_path(name);
    unlink(h->db);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake: {base_url: %s, api_key: sk-test, "
                         "retries: {max: 0}}\n"
                         "models:\n"
                         "  fake/m: {upstream: fake-model}\n"
                         "mcp_servers:\n"
                         "  fake: {command: %s, args: [form]}\n"
                         "agents:\n"
                         "  a: {model: fake/m, tools: [fake__elicit]}\n"
                         "  quick: {model: fake/m, tools: [fake__elicit], "
                         "approval_timeout_ms: 1}\n"
                         "default_agent: a\n"
                         "server:\n"
                         "  listen: 127.0.0.1:0\n",
                         fake_base_url(h->fake), LOOM_FAKE_MCP_BIN) > 0);
    if (loom_config_load_string(&h->cfg, yaml, "test.yaml") != 0)
        fail_msg("config: %s", loom_error_last());
    free(yaml);
    if (loom_store_open(&h->store, h->db) != 0)
        fail_msg("store: %s", loom_error_last());
    setup.elicitation = 1;
    assert_int_equal(loom_tools_new_from_config_with(&h->tools, h->cfg, &setup),
                     0);
    so.config = h->cfg;
    so.store = h->store;
    so.tools = h->tools;
    if (loom_server_new(&h->srv, &so) != 0 || loom_server_start(h->srv) != 0)
        fail_msg("server: %s", loom_error_last());
    snprintf(h->base, sizeof(h->base), "http://127.0.0.1:%d",
             loom_server_port(h->srv));
}

static void expect(const sh *h, const char *path, const char *body, long status,
                   const char *code)
{
    sh_resp r;

    assert_int_equal(sh_req(h, "POST", path, body, NULL, &r), status);
    sh_check_error(r.body, code);
    sh_resp_free(&r);
}

/* The output of the run's tool.completed (its events), or "". */
static const char *tool_output(const json_t *run)
{
    const json_t *ev;
    const char *out = "";
    size_t i;

    json_array_foreach(json_object_get(run, "events"), i, ev)
    {
        if (!strcmp(sh_str(ev, "type"), "tool.completed"))
            out = sh_str(ev, "output");
    }
    return out;
}

/* How many events of type the run has. */
static size_t count(const json_t *run, const char *type)
{
    const json_t *ev;
    size_t i, n = 0;

    json_array_foreach(json_object_get(run, "events"), i, ev)
    {
        n += !strcmp(sh_str(ev, "type"), type);
    }
    return n;
}

/* Waits for run_id to end completed; returns it with its events. */
static json_t *finished(const sh *h, const char *run_id)
{
    char path[128];
    json_t *run = sh_wait_run(h, run_id, 20000);

    assert_string_equal(sh_str(run, "status"), "completed");
    json_decref(run);
    snprintf(path, sizeof(path), "/v1/runs/%s?events=true", run_id);
    return sh_json(h, "GET", path, NULL, 200);
}

/* Reads the stream of method path (body) until its mcp.elicitation event,
 * then leaves; the event's run id and elicitation id go to run_id, id. */
static void read_until_form(const sh *h, const char *method, const char *path,
                            const char *body, char run_id[64], char id[64])
{
    sh_abort_ctx a;
    json_t *evs, *ev;
    CURL *e;

    memset(&a, 0, sizeof(a));
    a.until = "\"type\":\"mcp.elicitation\"";
    e = sh_easy(h, method, path, body, NULL, &a.r);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sh_abort_on);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &a);
    assert_int_equal(curl_easy_perform(e), CURLE_WRITE_ERROR);
    curl_easy_cleanup(e);
    evs = sh_sse_parse(a.r.body, NULL);
    ev = json_object_get(json_array_get(evs, json_array_size(evs) - 1), "data");
    assert_string_equal(sh_str(ev, "type"), "mcp.elicitation");
    assert_string_equal(sh_str(ev, "server"), "fake");
    assert_string_equal(sh_str(ev, "message"), "Who are you?");
    snprintf(run_id, 64, "%s", sh_str(ev, "run_id"));
    snprintf(id, 64, "%s", sh_str(ev, "elicitation_id"));
    json_decref(evs);
    sh_resp_free(&a.r);
}

static void test_answer_after_disconnect(void **state)
{
    sh h;
    json_t *ok, *run;
    char run_id[64], id[64], path[128], body[256];

    (void)state;
    start(&h);
    read_until_form(&h, "POST", "/v1/runs",
                    "{\"input\":\"hi\",\"stream\":true}", run_id, id);

    snprintf(path, sizeof(path), "/v1/runs/%s/input", run_id);
    snprintf(body, sizeof(body),
             "{\"elicitation_id\":\"%s\",\"action\":\"accept\","
             "\"content\":{\"age\":3}}",
             id);
    expect(&h, path, body, 400, "invalid_value");
    snprintf(body, sizeof(body),
             "{\"elicitation_id\":\"%s\",\"action\":\"later\"}", id);
    expect(&h, path, body, 400, "invalid_value");
    snprintf(body, sizeof(body),
             "{\"elicitation_id\":\"%s\",\"action\":\"accept\","
             "\"call_id\":\"c1\"}",
             id);
    expect(&h, path, body, 400, "invalid_value");
    expect(&h, path,
           "{\"elicitation_id\":\"elicit_99\",\"action\":\"decline\"}", 409,
           "not_waiting");
    /* The run still waits once the server has seen its client leave. */
    sh_streams_closed(&h);
    snprintf(body, sizeof(body),
             "{\"elicitation_id\":\"%s\",\"action\":\"accept\","
             "\"content\":{\"name\":\"Ada\"}}",
             id);
    ok = sh_json(&h, "POST", path, body, 200);
    assert_string_equal(sh_str(ok, "action"), "accept");
    assert_string_equal(sh_str(ok, "elicitation_id"), id);
    json_decref(ok);
    expect(&h, path, body, 409, "not_waiting");
    run = finished(&h, run_id);
    assert_string_equal(tool_output(run), "{\"action\":\"accept\",\"content\":"
                                          "{\"age\":30,\"name\":\"Ada\"}}");
    assert_int_equal(count(run, "mcp.elicitation"), 1);
    json_decref(run);
    sh_free(&h);
}

/* A streamed background run asks; its client leaves, and one who
 * follows the run again sees the form and answers it. */
static void test_background_stream_asks(void **state)
{
    sh h;
    json_t *ok, *run;
    char run_id[64], id[64], again_run[64], again_id[64], path[128], body[256];

    (void)state;
    start(&h);
    read_until_form(&h, "POST", "/v1/runs",
                    "{\"input\":\"hi\",\"stream\":true,\"background\":true}",
                    run_id, id);
    sh_streams_closed(&h);
    snprintf(path, sizeof(path), "/v1/runs/%s/events", run_id);
    read_until_form(&h, "GET", path, NULL, again_run, again_id);
    assert_string_equal(again_run, run_id);
    assert_string_equal(again_id, id);
    snprintf(path, sizeof(path), "/v1/runs/%s/input", run_id);
    snprintf(body, sizeof(body),
             "{\"elicitation_id\":\"%s\",\"action\":\"accept\","
             "\"content\":{\"name\":\"Ada\",\"age\":7}}",
             id);
    ok = sh_json(&h, "POST", path, body, 200);
    json_decref(ok);
    run = finished(&h, run_id);
    assert_string_equal(tool_output(run), "{\"action\":\"accept\",\"content\":"
                                          "{\"age\":7,\"name\":\"Ada\"}}");
    json_decref(run);
    sh_free(&h);
}

/* A form nobody answers within the agent's approval_timeout_ms is
 * cancelled, and the run goes on. */
static void test_unanswered_form_cancels(void **state)
{
    sh h;
    sh_resp r;
    json_t *evs, *run;
    char id[64];

    (void)state;
    start(&h);
    assert_int_equal(sh_req(&h, "POST", "/v1/runs",
                            "{\"input\":\"hi\",\"stream\":true,"
                            "\"background\":true,\"agent\":\"quick\"}",
                            NULL, &r),
                     200);
    evs = sh_sse_parse(r.body, NULL);
    snprintf(id, sizeof(id), "%s",
             sh_str(json_object_get(json_array_get(evs, 0), "data"), "run_id"));
    json_decref(evs);
    sh_resp_free(&r);
    run = finished(&h, id);
    assert_int_equal(count(run, "mcp.elicitation"), 1);
    assert_string_equal(tool_output(run), "{\"action\":\"cancel\"}");
    json_decref(run);
    sh_free(&h);
}

/* A background run nobody streams has nobody to ask: the form is
 * declined at once. */
static void test_background_declines(void **state)
{
    sh h;
    json_t *started, *run;

    (void)state;
    start(&h);
    started = sh_json(&h, "POST", "/v1/runs",
                      "{\"input\":\"hi\",\"background\":true}", 202);
    run = finished(&h, sh_str(started, "id"));
    assert_string_equal(tool_output(run), "{\"action\":\"decline\"}");
    assert_int_equal(count(run, "mcp.elicitation"), 0);
    json_decref(run);
    json_decref(started);
    sh_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_answer_after_disconnect),
        cmocka_unit_test(test_background_stream_asks),
        cmocka_unit_test(test_unanswered_form_cancels),
        cmocka_unit_test(test_background_declines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
