/*
 * A research run resumes after kill -9 (docs/research.md "Resuming after
 * a stop"): `loom serve` runs as a child process on a SQLite file; a
 * research run (background by default) sends two researchers out in
 * cycle 1; once the first has finished and the second's model call
 * hangs in the fake, the server is killed with SIGKILL and started
 * again on the same file. The run must complete without the finished
 * researcher, the plan or cycle 1 being asked of the model again (the
 * fake's record counts the requests), its event ids must go on from
 * the stored ones without a gap or a repeat (also for a client that
 * reconnects with Last-Event-ID), and the report must cite the sources
 * of both researchers.
 */
#include "test_server_harness.h"

/* A researcher's requests hold its task as their user message. */
#define ALPHA "\"content\":\"alpha topic\""
#define BETA "\"content\":\"beta topic\""

/* The supervisor's phases by the note of each call (later calls hold
 * earlier notes too: the newest note's rule comes first); the
 * researchers by their task; the search backend (SearXNG JSON) as the
 * plain responses. beta's second call hangs until the kill; after the
 * restart it searches again and reports. */
static const char script[] =
    "{\"rules\":["
    "{\"match\":{\"system\":\"Write the final report now\"},\"loop\":true,"
    " \"responses\":[{\"text\":[\"Alpha holds [1]. Beta holds [2].\"]}]},"
    "{\"match\":{\"system\":\"Research cycle 2 of\"},\"loop\":true,"
    " \"responses\":[{\"tool_calls\":[{\"name\":\"generate_report\","
    "  \"arguments\":\"{}\"}]}]},"
    "{\"match\":{\"system\":\"Research cycle 1 of\"},\"loop\":true,"
    " \"responses\":[{\"tool_calls\":["
    "  {\"id\":\"ra\",\"name\":\"research_agent\","
    "   \"arguments\":\"{\\\"task\\\":\\\"alpha topic\\\"}\"},"
    "  {\"id\":\"rb\",\"name\":\"research_agent\","
    "   \"arguments\":\"{\\\"task\\\":\\\"beta topic\\\"}\"}]}]},"
    "{\"match\":{\"system\":\"Write the research plan\"},\"loop\":true,"
    " \"responses\":[{\"text\":[\"1. Alpha 2. Beta\"]}]},"
    "{\"match\":{\"system\":\"You are a researcher\","
    "  \"first_user\":\"alpha topic\"},"
    " \"responses\":[{\"tool_calls\":[{\"name\":\"web_search\","
    "  \"arguments\":\"{\\\"query\\\":\\\"alpha\\\"}\"}]},"
    "  {\"text\":[\"Alpha is so [1].\"]}]},"
    "{\"match\":{\"system\":\"You are a researcher\","
    "  \"first_user\":\"beta topic\"},"
    " \"responses\":[{\"tool_calls\":[{\"name\":\"web_search\","
    "  \"arguments\":\"{\\\"query\\\":\\\"beta\\\"}\"}]},"
    "  {\"hang\":true},"
    "  {\"tool_calls\":[{\"name\":\"web_search\","
    "  \"arguments\":\"{\\\"query\\\":\\\"beta\\\"}\"}]},"
    "  {\"text\":[\"Beta is so [2].\"]}]}],"
    "\"loop\":true,\"responses\":[{\"body\":\"{\\\"results\\\":["
    "{\\\"url\\\":\\\"https://alpha.example.org/a\\\",\\\"title\\\":"
    "\\\"About alpha\\\",\\\"content\\\":\\\"A.\\\"},"
    "{\\\"url\\\":\\\"https://beta.example.org/b\\\",\\\"title\\\":"
    "\\\"About beta\\\",\\\"content\\\":\\\"B.\\\"}]}\"}]}";

/* Recorded model requests whose last message contains needle. */
static size_t last_with(const loom_fake *f, const char *needle)
{
    json_t *reqs = fake_requests(f), *q;
    size_t i, n = 0;

    json_array_foreach(reqs, i, q)
    {
        const json_t *msgs =
            json_object_get(json_object_get(q, "body"), "messages");
        const char *c = json_string_value(json_object_get(
            json_array_get(msgs, json_array_size(msgs) - 1), "content"));
        n += c && strstr(c, needle) != NULL;
    }
    json_decref(reqs);
    return n;
}

/* Whether the run's events hold the top run's tool.completed of call. */
static int call_done(const json_t *run, const char *call)
{
    const json_t *e;
    size_t i;

    json_array_foreach(json_object_get(run, "events"), i, e)
    {
        if (!strcmp(sh_str(e, "type"), "tool.completed") &&
            !json_object_get(e, "parent_run_id") && sh_str(e, "id") &&
            !strcmp(sh_str(e, "id"), call))
            return 1;
    }
    return 0;
}

/* Polls the run until researcher ra has ended and rb's call hangs in the
 * fake; returns the run (with its events). */
static json_t *wait_mid_cycle(const sh *h, const loom_fake *f, const char *path)
{
    long long end = test_now_ms() + 60000;

    for (;;) {
        json_t *run = sh_json(h, "GET", path, NULL, 200), *st = fake_stats(f);
        int hanging = (int)json_integer_value(json_object_get(st, "hanging"));
        json_decref(st);
        if (call_done(run, "ra") && hanging == 1)
            return run;
        json_decref(run);
        if (test_now_ms() > end)
            fail_msg("the run never reached the middle of cycle 1");
        usleep(20 * 1000);
    }
}

/* The researcher entry of task in a run's research status. */
static const json_t *researcher(const json_t *run, const char *task)
{
    const json_t *r;
    size_t i;

    json_array_foreach(
        json_object_get(json_object_get(run, "research"), "researchers"), i, r)
    {
        if (!strcmp(sh_str(r, "task"), task))
            return r;
    }
    return NULL;
}

static void test_kill9_mid_cycle_resumes(void **state)
{
    char *cfg_path = test_tmp_path("resume.yaml");
    char *db = test_tmp_path("resume.db");
    char *yaml = NULL, path[160], id[64], conv[64];
    json_t *run, *before, *evs, *e;
    const json_t *rs;
    size_t alpha_calls, nbefore, i, cites = 0;
    int seen_alpha = 0, seen_beta = 0;
    struct curl_slist *hdrs = NULL;
    loom_fake *fake;
    sh_child ch;
    sh_resp r;
    sh h;

    (void)state;
    memset(&h, 0, sizeof(h));
    fake = fake_start_script(script);
    assert_non_null(fake);
    unlink(db);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake: {base_url: '%s', api_key: k, "
                         "retries: {max: 0}}\n"
                         "routing: {retries: 0}\n"
                         "models:\n"
                         "  fake/m: {context_window: 128000}\n"
                         "tools:\n"
                         "  web_search: {backend: searxng, base_url: '%s'}\n"
                         "agents:\n"
                         "  deep_research: {model: fake/m, research: true}\n"
                         "  deep_research_researcher:\n"
                         "    model: fake/m\n"
                         "    system_prompt: You are a researcher.\n"
                         "    tools: [web_search, web_fetch]\n"
                         "    citations: true\n"
                         "server:\n"
                         "  listen: 127.0.0.1:0\n"
                         "  db: '%s'\n",
                         fake_base_url(fake), fake_base_url(fake), db) > 0);
    assert_int_equal(test_write_file(cfg_path, yaml, strlen(yaml)), 0);
    free(yaml);

    sh_serve(&ch, &h, cfg_path);
    /* Background by default: the run's id comes back at once. */
    run = sh_json(&h, "POST", "/v1/runs",
                  "{\"agent\":\"deep_research\",\"input\":\"Alpha and beta?\","
                  "\"user\":\"ann\",\"research\":{\"clarify\":false}}",
                  202);
    assert_true(json_is_true(json_object_get(run, "background")));
    snprintf(id, sizeof(id), "%s", sh_str(run, "id"));
    snprintf(conv, sizeof(conv), "%s", sh_str(run, "conversation_id"));
    json_decref(run);
    snprintf(path, sizeof(path), "/v1/runs/%s?events=true&user=ann", id);

    before = wait_mid_cycle(&h, fake, path);
    /* Where the run is: cycle 1 of 8, alpha done, beta running. */
    rs = json_object_get(before, "research");
    assert_string_equal(sh_str(rs, "phase"), "research");
    assert_int_equal(json_integer_value(json_object_get(rs, "cycle")), 1);
    assert_int_equal(json_integer_value(json_object_get(rs, "max_cycles")), 8);
    assert_string_equal(sh_str(researcher(before, "alpha topic"), "status"),
                        "completed");
    assert_int_equal(json_integer_value(json_object_get(
                         researcher(before, "alpha topic"), "sources")),
                     2);
    assert_string_equal(sh_str(researcher(before, "beta topic"), "status"),
                        "running");
    alpha_calls = fake_requests_with(fake, ALPHA);
    assert_int_equal(alpha_calls, 2);
    assert_int_equal(fake_requests_with(fake, BETA), 2);

    kill(ch.pid, SIGKILL);
    assert_int_equal(sh_reap(&ch, 20000), 128 + SIGKILL);

    /* Started again on the same file, the run resumes by itself. */
    sh_serve(&ch, &h, cfg_path);
    run = sh_wait_run(&h, id, 60000);
    json_decref(run);
    run = sh_json(&h, "GET", path, NULL, 200);
    assert_string_equal(sh_str(run, "status"), "completed");
    rs = json_object_get(run, "research");
    assert_string_equal(sh_str(rs, "phase"), "done");
    assert_true(json_is_true(json_object_get(rs, "resumed")));
    assert_string_equal(sh_str(researcher(run, "beta topic"), "status"),
                        "completed");

    /* Nothing finished was asked again: the plan, cycle 1 and researcher
     * alpha once each; beta ran again (search and report). */
    assert_int_equal(last_with(fake, "Write the research plan"), 1);
    assert_int_equal(last_with(fake, "Research cycle 1 of"), 1);
    assert_int_equal(last_with(fake, "Research cycle 2 of"), 1);
    assert_int_equal(fake_requests_with(fake, ALPHA), alpha_calls);

    /* Event ids: 1..N, the ones from before the kill unchanged. */
    evs = json_object_get(run, "events");
    nbefore = json_array_size(json_object_get(before, "events"));
    assert_true(json_array_size(evs) > nbefore);
    json_array_foreach(evs, i, e)
    {
        const json_t *b = json_array_get(json_object_get(before, "events"), i);
        assert_int_equal(json_integer_value(json_object_get(e, "seq")),
                         (json_int_t)i + 1);
        if (b)
            assert_true(json_equal(e, (json_t *)b));
        if (!strcmp(sh_str(e, "type"), "citation") &&
            !json_object_get(e, "parent_run_id")) {
            const char *who = sh_str(e, "researcher");
            cites++;
            seen_alpha |= who && !strcmp(who, "alpha topic");
            seen_beta |= who && !strcmp(who, "beta topic");
        }
    }
    assert_int_equal(cites, 2);
    assert_true(seen_alpha && seen_beta);
    assert_non_null(strstr(sh_str(run, "text"), "https://alpha.example.org/a"));
    assert_non_null(strstr(sh_str(run, "text"), "https://beta.example.org/b"));

    /* A client that saw the events up to the kill gets the rest. */
    snprintf(path, sizeof(path), "Last-Event-ID: %zu", nbefore);
    hdrs = curl_slist_append(NULL, path);
    snprintf(path, sizeof(path), "/v1/runs/%s/events", id);
    assert_int_equal(sh_req(&h, "GET", path, NULL, hdrs, &r), 200);
    curl_slist_free_all(hdrs);
    evs = sh_sse_parse(r.body, NULL);
    sh_resp_free(&r);
    assert_int_equal(json_array_size(evs),
                     json_array_size(json_object_get(run, "events")) - nbefore);
    json_array_foreach(evs, i, e)
    {
        assert_int_equal(json_integer_value(json_object_get(e, "id")),
                         (json_int_t)(nbefore + i + 1));
    }
    json_decref(evs);

    /* Another user's run is unknown. */
    snprintf(path, sizeof(path), "/v1/runs/%s?user=bob", id);
    assert_int_equal(sh_req(&h, "GET", path, NULL, NULL, &r), 404);
    sh_resp_free(&r);
    /* The turn is stored in its conversation, with the report. */
    snprintf(path, sizeof(path), "/v1/conversations/%s?user=ann", conv);
    json_decref(before);
    before = sh_json(&h, "GET", path, NULL, 200);
    assert_string_equal(sh_str(sh_last_message(before), "content"),
                        sh_str(run, "text"));
    json_decref(before);
    json_decref(run);

    sh_serve_end(&ch, fake, cfg_path, db);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill9_mid_cycle_resumes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
