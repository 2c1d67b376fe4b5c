/*
 * Research runs through the server (docs/research.md, docs/server.md):
 * POST /v1/runs with a `research` object (its settings reach the run; a
 * bad key is a 400 naming it), GET /v1/runs/{id}/report (the markdown
 * report with its Sources list; 404 for an unknown run, another user's,
 * or one that ended without a report; 409 while the run researches), and
 * chat completions with the model agent/deep_research. The fake upstream
 * answers the supervisor's phases and the researchers by rules, and its
 * plain responses stand in for SearXNG (web_search GETs its /search).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "test_server_harness.h"

#define RULES_HEAD                                                             \
    "{\"rules\":["                                                             \
    "{\"match\":{\"system\":\"Write the final report now\"},\"loop\":true,"    \
    " \"responses\":[{\"text\":[\"Alpha holds [1].\"]}]},"                     \
    "{\"match\":{\"system\":\"Research cycle 2 of\"},\"loop\":true,"           \
    " \"responses\":[{\"tool_calls\":[{\"name\":\"generate_report\","          \
    "  \"arguments\":\"{}\"}]}]},"                                             \
    "{\"match\":{\"system\":\"Research cycle 1 of\"},\"loop\":true,"           \
    " \"responses\":[{\"tool_calls\":[{\"id\":\"ra\",\"name\":"                \
    "  "                                                                       \
    "\"research_agent\",\"arguments\":\"{\\\"task\\\":\\\"alpha\\\"}\"}]}]},"  \
    "{\"match\":{\"system\":\"Write the research plan\"},\"loop\":true,"       \
    " \"responses\":[{\"text\":[\"1. Alpha\"]}]},"                             \
    "{\"match\":{\"system\":\"too ambiguous\"},\"loop\":true,"                 \
    " \"responses\":[{\"text\":[\"NO_CLARIFICATION_NEEDED\"]}]},"              \
    "{\"match\":{\"system\":\"You are main\"},\"loop\":true,"                  \
    " \"responses\":[{\"text\":[\"plain answer\"]}]},"

/* The researcher searches, then reports. */
static const char script[] = RULES_HEAD
    "{\"match\":{\"system\":\"You are a researcher\"},\"loop\":true,"
    " \"responses\":[{\"tool_calls\":[{\"name\":\"web_search\","
    "  \"arguments\":\"{\\\"query\\\":\\\"alpha\\\"}\"}]},"
    "  {\"text\":[\"Alpha is so [1].\"]}]}],"
    "\"loop\":true,\"responses\":[{\"body\":\"{\\\"results\\\":[{\\\"url\\\":"
    "\\\"https://alpha.example.org/page\\\",\\\"title\\\":\\\"About alpha\\\","
    "\\\"content\\\":\\\"Facts.\\\"}]}\"}]}";

/* The researcher's model call hangs until the run is cancelled. */
static const char hang_script[] =
    RULES_HEAD "{\"match\":{\"system\":\"You are a researcher\"},"
               " \"responses\":[{\"hang\":true}]}]}";

static void start(sh *h, const char *fake_script)
{
    char *yaml = NULL;

    memset(h, 0, sizeof(*h));
    h->fake = fake_start_script(fake_script);
    assert_non_null(h->fake);
    h->db = test_tmp_path("server-research.db");
    unlink(h->db);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake:\n"
                         "    base_url: %s\n"
                         "    api_key: sk-test\n"
                         "    retries: {max: 0}\n"
                         "routing: {retries: 0}\n"
                         "models:\n"
                         "  fake/m: {context_window: 128000}\n"
                         "tools:\n"
                         "  web_search: {backend: searxng, base_url: %s}\n"
                         "agents:\n"
                         "  main: {model: fake/m, system_prompt: You are "
                         "main., tools: []}\n"
                         "  deep_research: {model: fake/m, research: true}\n"
                         "  deep_research_researcher:\n"
                         "    model: fake/m\n"
                         "    system_prompt: You are a researcher.\n"
                         "    tools: [web_search, web_fetch]\n"
                         "server:\n"
                         "  listen: 127.0.0.1:0\n",
                         fake_base_url(h->fake), fake_base_url(h->fake)) > 0);
    sh_start_config(h, yaml);
    free(yaml);
}

/* The top run's run.completed among a run object's events. */
static const json_t *top_completed(const json_t *run)
{
    const json_t *found = NULL;
    size_t i;
    json_t *e;

    json_array_foreach(json_object_get(run, "events"), i, e)
    {
        if (!strcmp(sh_str(e, "type"), "run.completed") &&
            !json_object_get(e, "parent_run_id"))
            found = e;
    }
    return found;
}

static void test_research_run_and_report(void **state)
{
    sh h;
    json_t *run;
    const json_t *done;
    char path[160], ctype[128];
    sh_resp r;

    (void)state;
    start(&h, script);
    run = sh_json(&h, "POST", "/v1/runs",
                  "{\"agent\":\"deep_research\",\"input\":\"Tell me of alpha\","
                  "\"user\":\"ann\",\"background\":false,"
                  "\"research\":{\"max_cycles\":3}}",
                  200);
    assert_string_equal(sh_str(run, "status"), "completed");
    done = top_completed(run);
    assert_non_null(done);
    /* The request's settings reached the run. */
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(done, "research"), "max_cycles")),
                     3);
    assert_string_equal(sh_str(done, "report_reason"), "requested");

    snprintf(path, sizeof(path), "/v1/runs/%s/report", sh_str(run, "id"));
    assert_int_equal(sh_req(&h, "GET", path, NULL, NULL, &r), 200);
    assert_non_null(sh_header(&r, "content-type", ctype, sizeof(ctype)));
    assert_non_null(strstr(ctype, "text/markdown"));
    assert_non_null(strstr(r.body, "Alpha holds [1]."));
    assert_non_null(strstr(r.body, "## Sources"));
    assert_non_null(
        strstr(r.body, "[1] About alpha - https://alpha.example.org/page"));
    assert_string_equal(r.body, sh_str(run, "text"));
    sh_resp_free(&r);

    /* The same for its user; another user's or an unknown run: 404. */
    snprintf(path, sizeof(path), "/v1/runs/%s/report?user=ann",
             sh_str(run, "id"));
    assert_int_equal(sh_req(&h, "GET", path, NULL, NULL, &r), 200);
    sh_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/runs/%s/report?user=bob",
             sh_str(run, "id"));
    assert_int_equal(sh_req(&h, "GET", path, NULL, NULL, &r), 404);
    sh_check_error(r.body, "not_found");
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "GET",
                            "/v1/runs/run_000000000000000000000000/report",
                            NULL, NULL, &r),
                     404);
    sh_check_error(r.body, "not_found");
    sh_resp_free(&r);
    json_decref(run);

    /* A run that is not a research run has no report. */
    run = sh_json(&h, "POST", "/v1/runs",
                  "{\"agent\":\"main\",\"input\":\"hi\"}", 200);
    snprintf(path, sizeof(path), "/v1/runs/%s/report", sh_str(run, "id"));
    assert_int_equal(sh_req(&h, "GET", path, NULL, NULL, &r), 404);
    sh_check_error(r.body, "no_report");
    sh_resp_free(&r);
    json_decref(run);
    sh_free(&h);
}

static void test_bad_research_settings(void **state)
{
    sh h;
    sh_resp r;
    json_t *j;

    (void)state;
    start(&h, script);
    assert_int_equal(sh_req(&h, "POST", "/v1/runs",
                            "{\"agent\":\"deep_research\",\"input\":\"q\","
                            "\"research\":{\"max_cyclez\":2}}",
                            NULL, &r),
                     400);
    j = json_loads(r.body, 0, NULL);
    assert_non_null(j);
    assert_string_equal(sh_str(json_object_get(j, "error"), "param"),
                        "research");
    assert_non_null(strstr(sh_str(json_object_get(j, "error"), "message"),
                           "research.max_cyclez"));
    json_decref(j);
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "POST", "/v1/runs",
                            "{\"agent\":\"deep_research\",\"input\":\"q\","
                            "\"research\":{\"max_cycles\":0}}",
                            NULL, &r),
                     400);
    assert_non_null(strstr(r.body, "research.max_cycles"));
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "POST", "/v1/runs",
                            "{\"agent\":\"deep_research\",\"input\":\"q\","
                            "\"research\":[1]}",
                            NULL, &r),
                     400);
    j = json_loads(r.body, 0, NULL);
    assert_string_equal(sh_str(json_object_get(j, "error"), "param"),
                        "research");
    json_decref(j);
    sh_resp_free(&r);
    /* No model was called for any of them. */
    assert_int_equal(fake_request_count(h.fake), 0);
    sh_free(&h);
}

static void test_report_not_ready_then_none(void **state)
{
    sh h;
    sh_resp r;
    json_t *run, *ended;
    char path[160];

    (void)state;
    start(&h, hang_script);
    run = sh_json(&h, "POST", "/v1/runs",
                  "{\"agent\":\"deep_research\",\"input\":\"q\","
                  "\"background\":true,\"research\":{\"clarify\":false}}",
                  202);
    /* Its researcher hangs until the cancel: the run is researching. */
    snprintf(path, sizeof(path), "/v1/runs/%s/report", sh_str(run, "id"));
    assert_int_equal(sh_req(&h, "GET", path, NULL, NULL, &r), 409);
    sh_check_error(r.body, "report_not_ready");
    sh_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/runs/%s/cancel", sh_str(run, "id"));
    json_decref(sh_json(&h, "POST", path, NULL, 200));
    ended = sh_wait_run(&h, sh_str(run, "id"), 30000);
    assert_string_equal(sh_str(ended, "status"), "cancelled");
    snprintf(path, sizeof(path), "/v1/runs/%s/report", sh_str(run, "id"));
    assert_int_equal(sh_req(&h, "GET", path, NULL, NULL, &r), 404);
    sh_check_error(r.body, "no_report");
    sh_resp_free(&r);
    json_decref(ended);
    json_decref(run);
    sh_free(&h);
}

static void test_chat_completions_agent_model(void **state)
{
    sh h;
    json_t *c;
    const char *text;

    (void)state;
    start(&h, script);
    c = sh_json(&h, "POST", "/v1/chat/completions",
                "{\"model\":\"agent/deep_research\",\"messages\":"
                "[{\"role\":\"user\",\"content\":\"Tell me of alpha\"}]}",
                200);
    text = json_string_value(json_object_get(
        json_object_get(json_array_get(json_object_get(c, "choices"), 0),
                        "message"),
        "content"));
    assert_non_null(text);
    assert_non_null(strstr(text, "Alpha holds [1]."));
    assert_non_null(
        strstr(text, "[1] About alpha - https://alpha.example.org/page"));
    json_decref(c);
    sh_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_research_run_and_report),
        cmocka_unit_test(test_bad_research_settings),
        cmocka_unit_test(test_report_not_ready_then_none),
        cmocka_unit_test(test_chat_completions_agent_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
