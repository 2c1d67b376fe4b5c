/*
 * Tool call approval through the server (docs/server.md, POST
 * /v1/runs/{id}/input): a run whose tool needs approval pauses with an
 * approval.required event, survives its streaming client leaving, and
 * goes on when approved (or reads the denial's reason); the endpoint's
 * 400, 404 (unknown run, another user's run) and 409 (a call that does
 * not wait, an answer given twice); an agent's approval_timeout_ms denies
 * a call nobody answers. The fake upstream plays the model; the test
 * waits on events, never on time.
 */
#include "test_server_harness.h"

#define USAGE                                                                  \
    "\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":2,"                 \
    "\"total_tokens\":12}"
/* The model calls get_time once, then answers. */
#define SCRIPT                                                                 \
    "{\"loop\":true,\"responses\":["                                           \
    "{\"tool_calls\":[{\"id\":\"c1\",\"name\":\"get_time\","                   \
    "\"arguments\":\"{}\"}]," USAGE "},"                                       \
    "{\"text\":[\"Hello\",\" world\"]," USAGE "}]}"

/* A server playing script whose get_time needs approval, with agents
 * (YAML lines, then default_agent) and server lines (may be ""). */
static void start_with(sh *h, const char *script, const char *agents,
                       const char *server)
{
    static int n;
    char name[64], *yaml = NULL;

    memset(h, 0, sizeof(*h));
    h->fake = fake_start_script(script);
    assert_non_null(h->fake);
    snprintf(name, sizeof(name), "approval-%d.db", n++);
    h->db = test_tmp_path(name);
    unlink(h->db);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake: {base_url: %s, api_key: sk-test, "
                         "retries: {max: 0}}\n"
                         "models:\n"
                         "  fake/m: {upstream: fake-model}\n"
                         "tools:\n"
                         "  get_time: {approval: required}\n"
                         "agents:\n%s"
                         "server:\n"
                         "  listen: 127.0.0.1:0\n%s",
                         fake_base_url(h->fake), agents, server) > 0);
    sh_start_config(h, yaml);
    free(yaml);
}

/* Agent `a` asks for get_time; `quick` waits 1 ms for approval. */
static void start(sh *h)
{
    start_with(h, SCRIPT,
               "  a: {model: fake/m, tools: [get_time]}\n"
               "  quick: {model: fake/m, tools: [get_time], "
               "approval_timeout_ms: 1}\n"
               "default_agent: a\n",
               "");
}

/* main delegates to helper, whose get_time call c1 needs approval. */
#define TREE_SCRIPT                                                            \
    "{\"rules\":["                                                             \
    "{\"match\":{\"system\":\"You are main\"},\"responses\":["                 \
    "{\"tool_calls\":[{\"id\":\"call_h\",\"name\":\"helper\","                 \
    "\"arguments\":\"{\\\"task\\\":\\\"time one\\\"}\"}]},"                    \
    "{\"text\":[\"Main: done\"]}]},"                                           \
    "{\"match\":{\"first_user\":\"time one\"},\"responses\":["                 \
    "{\"tool_calls\":[{\"id\":\"c1\",\"name\":\"get_time\","                   \
    "\"arguments\":\"{}\"}]},"                                                 \
    "{\"text\":[\"Helper: answered\"]}]}]}"

/* Agent main has the sub-agent helper, whose get_time needs approval. */
static void start_tree(sh *h)
{
    start_with(h, TREE_SCRIPT,
               "  main: {model: fake/m, system_prompt: You are main.,"
               " tools: [], sub_agents: [helper]}\n"
               "  helper: {model: fake/m, system_prompt: You help.,"
               " tools: [get_time]}\n"
               "default_agent: main\n",
               "");
}

/* Reads path's stream until a run asks for approval, then leaves;
 * copies the run's id, and the id of the run that asks into asker (may
 * be NULL). */
static void until_asked(sh *h, const char *path, const char *body, char *run_id,
                        char *asker)
{
    sh_abort_ctx a;
    json_t *evs;
    CURL *e;

    memset(&a, 0, sizeof(a));
    a.until = "\"type\":\"approval.required\"";
    e = sh_easy(h, body ? "POST" : "GET", path, body, NULL, &a.r);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sh_abort_on);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &a);
    assert_int_equal(curl_easy_perform(e), CURLE_WRITE_ERROR);
    curl_easy_cleanup(e);
    evs = sh_sse_parse(a.r.body, NULL);
    snprintf(run_id, 64, "%s",
             sh_str(json_object_get(json_array_get(evs, 0), "data"), "run_id"));
    if (asker)
        snprintf(
            asker, 64, "%s",
            sh_str(json_object_get(
                       json_array_get(evs, json_array_size(evs) - 1), "data"),
                   "run_id"));
    json_decref(evs);
    sh_resp_free(&a.r);
}

static void expect(const sh *h, const char *path, const char *body, long status,
                   const char *code)
{
    sh_resp r;

    assert_int_equal(sh_req(h, "POST", path, body, NULL, &r), status);
    sh_check_error(r.body, code);
    sh_resp_free(&r);
}

/* The streaming client leaves at approval.required; the run waits, the
 * endpoint refuses what it must, then an approval lets it finish. */
static void test_approve_after_disconnect(void **state)
{
    sh h;
    char run_id[64], path[128];
    json_t *run, *ok;

    (void)state;
    start(&h);
    until_asked(&h, "/v1/runs", "{\"input\":\"time?\",\"stream\":true}", run_id,
                NULL);
    snprintf(path, sizeof(path), "/v1/runs/%s/input", run_id);
    expect(&h, path, "{\"call_id\":\"c1\"}", 400, "invalid_value");
    expect(&h, path, "{\"call_id\":\"c1\",\"approve\":\"yes\"}", 400,
           "invalid_value");
    expect(&h, path, "{\"call_id\":\"c1\",\"approve\":true,\"x\":1}", 400,
           "unknown_parameter");
    expect(&h, path, "[1]", 400, "invalid_json");
    expect(&h, "/v1/runs/run_nosuch/input",
           "{\"call_id\":\"c1\",\"approve\":true}", 404, "not_found");
    /* The run has no user: another user's answer finds no run. */
    expect(&h, path, "{\"call_id\":\"c1\",\"approve\":true,\"user\":\"bob\"}",
           404, "not_found");
    expect(&h, path, "{\"call_id\":\"c9\",\"approve\":true}", 409,
           "not_waiting");
    /* Still waiting once the server has seen its client leave. */
    sh_streams_closed(&h);
    snprintf(path, sizeof(path), "/v1/runs/%s", run_id);
    run = sh_json(&h, "GET", path, NULL, 200);
    assert_string_equal(sh_str(run, "status"), "running");
    json_decref(run);
    snprintf(path, sizeof(path), "/v1/runs/%s/input", run_id);
    ok =
        sh_json(&h, "POST", path, "{\"call_id\":\"c1\",\"approve\":true}", 200);
    assert_true(json_is_true(json_object_get(ok, "approved")));
    assert_string_equal(sh_str(ok, "call_id"), "c1");
    json_decref(ok);
    run = sh_wait_run(&h, run_id, 20000);
    assert_string_equal(sh_str(run, "status"), "completed");
    assert_string_equal(sh_str(run, "text"), "Hello world");
    json_decref(run);
    expect(&h, path, "{\"call_id\":\"c1\",\"approve\":true}", 409,
           "not_waiting");
    sh_free(&h);
}

/* A background run of a user, followed through its events, is denied
 * with a reason the model reads. */
static void test_deny_background(void **state)
{
    sh h;
    sh_resp r;
    char run_id[64], path[128];
    json_t *started, *run, *reqs, *msgs;
    const char *last;

    (void)state;
    start(&h);
    started =
        sh_json(&h, "POST", "/v1/runs",
                "{\"input\":\"x\",\"background\":true,\"user\":\"ann\"}", 202);
    snprintf(path, sizeof(path), "/v1/runs/%s/events", sh_str(started, "id"));
    until_asked(&h, path, NULL, run_id, NULL);
    assert_string_equal(run_id, sh_str(started, "id"));
    json_decref(started);
    snprintf(path, sizeof(path), "/v1/runs/%s/input", run_id);
    expect(&h, path, "{\"call_id\":\"c1\",\"approve\":false}", 404,
           "not_found");
    assert_int_equal(
        sh_req(&h, "POST", path,
               "{\"call_id\":\"c1\",\"approve\":false,\"reason\":\"not now\","
               "\"user\":\"ann\"}",
               NULL, &r),
        200);
    sh_resp_free(&r);
    run = sh_wait_run(&h, run_id, 20000);
    assert_string_equal(sh_str(run, "status"), "completed");
    json_decref(run);
    /* The model's second request carries the denial as the result. */
    reqs = fake_requests(h.fake);
    assert_int_equal(json_array_size(reqs), 2);
    msgs = json_object_get(json_object_get(json_array_get(reqs, 1), "body"),
                           "messages");
    last = sh_str(json_array_get(msgs, json_array_size(msgs) - 1), "content");
    assert_non_null(last);
    assert_string_equal(last, "the user denied this call: not now");
    json_decref(reqs);
    sh_free(&h);
}

/* An agent's approval_timeout_ms denies a call nobody answers. */
static void test_timeout(void **state)
{
    sh h;
    json_t *run, *ev, *failed = NULL;
    size_t i;

    (void)state;
    start(&h);
    run = sh_json(&h, "POST", "/v1/runs",
                  "{\"input\":\"x\",\"agent\":\"quick\"}", 200);
    assert_string_equal(sh_str(run, "status"), "completed");
    json_array_foreach(json_object_get(run, "events"), i, ev)
    {
        if (!strcmp(sh_str(ev, "type"), "tool.failed"))
            failed = ev;
    }
    assert_non_null(failed);
    assert_string_equal(sh_str(failed, "code"), "denied");
    assert_string_equal(sh_str(failed, "output"),
                        "the user denied this call: approval timed out");
    json_decref(run);
    sh_free(&h);
}

/*
 * A sub-agent asks for approval: its streaming client leaving does not
 * cancel the tree, and the call id given to the top run's input reaches
 * the child, which runs get_time and answers main.
 */
static void test_child_approve_after_disconnect(void **state)
{
    sh h;
    char run_id[64], child[64], path[128];
    json_t *run, *ok;

    (void)state;
    start_tree(&h);
    until_asked(&h, "/v1/runs", "{\"input\":\"time?\",\"stream\":true}", run_id,
                child);
    assert_string_not_equal(child, run_id);
    sh_streams_closed(&h);
    snprintf(path, sizeof(path), "/v1/runs/%s", run_id);
    run = sh_json(&h, "GET", path, NULL, 200);
    assert_string_equal(sh_str(run, "status"), "running");
    json_decref(run);
    snprintf(path, sizeof(path), "/v1/runs/%s/input", run_id);
    expect(&h, path, "{\"call_id\":\"c1\",\"approve\":true,\"run_id\":\"\"}",
           400, "invalid_value");
    expect(&h, path,
           "{\"call_id\":\"c1\",\"approve\":true,\"run_id\":\"run_no\"}", 409,
           "not_waiting");
    ok =
        sh_json(&h, "POST", path, "{\"call_id\":\"c1\",\"approve\":true}", 200);
    assert_string_equal(sh_str(ok, "id"), run_id);
    assert_true(json_is_true(json_object_get(ok, "approved")));
    json_decref(ok);
    run = sh_wait_run(&h, run_id, 20000);
    assert_string_equal(sh_str(run, "status"), "completed");
    assert_string_equal(sh_str(run, "text"), "Main: done");
    json_decref(run);
    /* get_time ran: main read the helper's answer. */
    assert_int_equal(fake_requests_with(h.fake, "Helper: answered"), 1);
    sh_free(&h);
}

/*
 * The child's own run id in the path: the denial's reason reaches the
 * child's model; once the child is over its id is unknown here.
 */
static void test_child_deny_by_child_path(void **state)
{
    sh h;
    char run_id[64], child[64], path[128];
    json_t *run, *ok;

    (void)state;
    start_tree(&h);
    run = sh_json(&h, "POST", "/v1/runs",
                  "{\"input\":\"x\",\"background\":true}", 202);
    snprintf(path, sizeof(path), "/v1/runs/%s/events", sh_str(run, "id"));
    json_decref(run);
    until_asked(&h, path, NULL, run_id, child);
    snprintf(path, sizeof(path), "/v1/runs/%s/input", child);
    ok = sh_json(&h, "POST", path,
                 "{\"call_id\":\"c1\",\"approve\":false,"
                 "\"reason\":\"not now\"}",
                 200);
    assert_string_equal(sh_str(ok, "id"), run_id);
    assert_string_equal(sh_str(ok, "run_id"), child);
    json_decref(ok);
    run = sh_wait_run(&h, run_id, 20000);
    assert_string_equal(sh_str(run, "status"), "completed");
    json_decref(run);
    assert_int_equal(
        fake_requests_with(h.fake, "the user denied this call: not now"), 1);
    expect(&h, path, "{\"call_id\":\"c1\",\"approve\":true}", 404, "not_found");
    sh_free(&h);
}

/* asker's get_time needs approval; answerer only answers. */
#define TWO_SCRIPT                                                             \
    "{\"rules\":["                                                             \
    "{\"match\":{\"system\":\"You ask\"},\"responses\":["                      \
    "{\"tool_calls\":[{\"id\":\"c1\",\"name\":\"get_time\","                   \
    "\"arguments\":\"{}\"}]},"                                                 \
    "{\"text\":[\"Asked: done\"]}]},"                                          \
    "{\"match\":{\"system\":\"You answer\"},\"responses\":["                   \
    "{\"text\":[\"Quick\"]}]}]}"

/* With one worker thread, a run waiting for its approval parks: another
 * run completes meanwhile on the same thread, then the first goes on. */
static void test_waiting_run_frees_its_worker(void **state)
{
    sh h;
    char run_id[64], path[128];
    json_t *run, *ok;

    (void)state;
    start_with(&h, TWO_SCRIPT,
               "  asker: {model: fake/m, system_prompt: You ask.,"
               " tools: [get_time]}\n"
               "  answerer: {model: fake/m, system_prompt: You answer.,"
               " tools: []}\n"
               "default_agent: asker\n",
               "  workers: 1\n");
    until_asked(&h, "/v1/runs", "{\"input\":\"time?\",\"stream\":true}", run_id,
                NULL);
    run = sh_json(&h, "POST", "/v1/runs",
                  "{\"input\":\"hi\",\"agent\":\"answerer\"}", 200);
    assert_string_equal(sh_str(run, "status"), "completed");
    assert_string_equal(sh_str(run, "text"), "Quick");
    json_decref(run);
    /* Approved once the server has seen the stream's client leave. */
    sh_streams_closed(&h);
    snprintf(path, sizeof(path), "/v1/runs/%s/input", run_id);
    ok =
        sh_json(&h, "POST", path, "{\"call_id\":\"c1\",\"approve\":true}", 200);
    json_decref(ok);
    run = sh_wait_run(&h, run_id, 20000);
    assert_string_equal(sh_str(run, "status"), "completed");
    assert_string_equal(sh_str(run, "text"), "Asked: done");
    json_decref(run);
    sh_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_approve_after_disconnect),
        cmocka_unit_test(test_waiting_run_frees_its_worker),
        cmocka_unit_test(test_deny_background),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_child_approve_after_disconnect),
        cmocka_unit_test(test_child_deny_by_child_path),
    };
    int rc;

    curl_global_init(CURL_GLOBAL_DEFAULT);
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
