/*
 * Users and memory through `loom serve`: a server that builds its own
 * tool registry registers the memory tools; a chat request with `user`
 * stores a memory (the model's scripted memory_store call) that a later
 * conversation of the same user retrieves; a request without a user, or
 * for an agent with `memory: false`, is not offered the memory tools; a
 * bad `user` is refused by both APIs, and the runs API takes one too.
 * The agent options (planning, review, citations) reach the run.
 */
#include "test_server_harness.h"

/* A server over the fake with script, building its own tools (so.tools
 * NULL: the config's, plus the memory tools over the store). */
static void mem_start(sh *h, const char *script)
{
    static int n;
    loom_server_options so = LOOM_SERVER_OPTIONS_INIT;
    char name[64], *yaml = NULL;

    memset(h, 0, sizeof(*h));
    h->fake = fake_start_script(script);
    assert_non_null(h->fake);
    snprintf(name, sizeof(name), "memory-%d.db", n++);
    h->db = test_tmp_path(name);
    unlink(h->db);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake:\n"
                         "    base_url: %s\n"
                         "    api_key: sk-test\n"
                         "    retries: {max: 0}\n"
                         "models:\n"
                         "  fake/m: {upstream: fake-model}\n"
                         "agents:\n"
                         "  a: {model: fake/m}\n"
                         "  nomem: {model: fake/m, memory: false}\n"
                         "  full: {model: fake/m, planning: true, "
                         "review: true, citations: true}\n"
                         "default_agent: a\n"
                         "server:\n"
                         "  listen: 127.0.0.1:0\n",
                         fake_base_url(h->fake)) > 0);
    if (loom_config_load_string(&h->cfg, yaml, "memory.yaml") != 0)
        fail_msg("config: %s", loom_error_last());
    free(yaml);
    if (loom_store_open(&h->store, h->db) != 0)
        fail_msg("store: %s", loom_error_last());
    so.config = h->cfg;
    so.store = h->store;
    so.tools = NULL;
    if (loom_server_new(&h->srv, &so) != 0 || loom_server_start(h->srv) != 0)
        fail_msg("server: %s", loom_error_last());
    snprintf(h->base, sizeof(h->base), "http://127.0.0.1:%d",
             loom_server_port(h->srv));
}

/* The body of the fake's request i (a new reference), or fails. */
static json_t *upstream_body(const sh *h, size_t i)
{
    json_t *reqs = fake_requests(h->fake), *body;

    if (i >= json_array_size(reqs))
        fail_msg("the fake got %zu requests, not %zu",
                 json_array_size(reqs), i + 1);
    body = json_incref(json_object_get(json_array_get(reqs, i), "body"));
    json_decref(reqs);
    assert_non_null(body);
    return body;
}

/* 1 when upstream request i offered the tool called name. */
static int offered(const sh *h, size_t i, const char *name)
{
    json_t *body = upstream_body(h, i), *t;
    size_t k;
    int found = 0;

    json_array_foreach(json_object_get(body, "tools"), k, t) {
        const char *n = json_string_value(
            json_object_get(json_object_get(t, "function"), "name"));
        found |= n && strcmp(n, name) == 0;
    }
    json_decref(body);
    return found;
}

/* The content of the first tool message of upstream request i. */
static char *tool_result(const sh *h, size_t i)
{
    json_t *body = upstream_body(h, i), *m;
    char *out = NULL;
    size_t k;

    json_array_foreach(json_object_get(body, "messages"), k, m) {
        if (!out && strcmp(sh_str(m, "role"), "tool") == 0)
            out = strdup(sh_str(m, "content"));
    }
    json_decref(body);
    assert_non_null(out);
    return out;
}

#define STORE_CALL                                                           \
    "{\"tool_calls\":[{\"id\":\"c1\",\"name\":\"memory_store\","             \
    "\"arguments\":\"{\\\"content\\\":\\\"Alice drinks green tea.\\\"}\"}]}"
#define RETRIEVE_CALL                                                        \
    "{\"tool_calls\":[{\"id\":\"c2\",\"name\":\"memory_retrieve\","          \
    "\"arguments\":\"{\\\"query\\\":\\\"tea\\\"}\"}]}"

static void test_user_memory_round_trip(void **state)
{
    sh h;
    json_t *j;
    char *res;

    (void)state;
    mem_start(&h, "{\"responses\":[" STORE_CALL ","
                  "{\"text\":[\"Noted.\"]}," RETRIEVE_CALL ","
                  "{\"text\":[\"You drink green tea.\"]},"
                  "{\"text\":[\"Hello.\"]},"
                  "{\"text\":[\"Hello again.\"]}]}");
    /* Alice tells it something. */
    j = sh_json(&h, "POST", "/v1/chat/completions",
                "{\"model\":\"agent/a\",\"user\":\"alice@example.com\","
                "\"messages\":[{\"role\":\"user\",\"content\":"
                "\"Remember that I drink green tea.\"}]}",
                200);
    json_decref(j);
    assert_true(offered(&h, 0, "memory_store"));
    assert_true(offered(&h, 0, "memory_retrieve"));
    res = tool_result(&h, 1);
    assert_non_null(strstr(res, "stored"));
    free(res);

    /* A new conversation of hers finds it. */
    j = sh_json(&h, "POST", "/v1/chat/completions",
                "{\"model\":\"agent/a\",\"user\":\"alice@example.com\","
                "\"messages\":[{\"role\":\"user\",\"content\":"
                "\"What do I drink?\"}]}",
                200);
    assert_string_equal(
        sh_str(json_object_get(json_array_get(json_object_get(j, "choices"),
                                              0),
                               "message"),
               "content"),
        "You drink green tea.");
    json_decref(j);
    res = tool_result(&h, 3);
    assert_non_null(strstr(res, "Alice drinks green tea."));
    free(res);

    /* Without a user the memory tools are not offered; the others are. */
    j = sh_json(&h, "POST", "/v1/chat/completions",
                "{\"model\":\"agent/a\",\"messages\":[{\"role\":\"user\","
                "\"content\":\"hi\"}]}",
                200);
    json_decref(j);
    assert_false(offered(&h, 4, "memory_store"));
    assert_false(offered(&h, 4, "memory_retrieve"));
    assert_true(offered(&h, 4, "get_time"));

    /* An agent with memory off does not offer them to a user either
     * (the native runs API, which takes `user` too). */
    j = sh_json(&h, "POST", "/v1/runs",
                "{\"agent\":\"nomem\",\"input\":\"hi\",\"user\":\"alice\"}",
                200);
    assert_string_equal(sh_str(j, "status"), "completed");
    json_decref(j);
    assert_false(offered(&h, 5, "memory_store"));
    assert_true(offered(&h, 5, "get_time"));
    sh_free(&h);
}

static void test_bad_user_refused(void **state)
{
    sh h;
    sh_resp r;
    char body[512], user[200];

    (void)state;
    mem_start(&h, "{\"responses\":[]}");
    assert_int_equal(sh_req(&h, "POST", "/v1/chat/completions",
                            "{\"model\":\"agent/a\",\"user\":\"a b\","
                            "\"messages\":[{\"role\":\"user\","
                            "\"content\":\"hi\"}]}",
                            NULL, &r),
                     400);
    assert_non_null(strstr(r.body, "user"));
    sh_resp_free(&r);
    /* 128 characters pass the check, 129 do not. */
    memset(user, 'u', 129);
    user[129] = '\0';
    snprintf(body, sizeof(body),
             "{\"agent\":\"a\",\"input\":\"hi\",\"user\":\"%s\"}", user);
    assert_int_equal(sh_req(&h, "POST", "/v1/runs", body, NULL, &r), 400);
    sh_check_error(r.body, "invalid_value");
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "POST", "/v1/runs",
                            "{\"agent\":\"a\",\"input\":\"hi\","
                            "\"user\":7}",
                            NULL, &r),
                     400);
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "POST", "/v1/chat/completions",
                            "{\"model\":\"agent/a\",\"user\":\"\","
                            "\"messages\":[{\"role\":\"user\","
                            "\"content\":\"hi\"}]}",
                            NULL, &r),
                     400);
    sh_resp_free(&r);
    user[128] = '\0';
    snprintf(body, sizeof(body),
             "{\"model\":\"agent/a\",\"user\":\"%s\",\"messages\":"
             "[{\"role\":\"user\",\"content\":\"hi\"}]}", user);
    /* Valid: the run starts (and fails upstream: the script is empty). */
    assert_int_not_equal(
        sh_req(&h, "POST", "/v1/chat/completions", body, NULL, &r), 400);
    sh_resp_free(&r);
    sh_free(&h);
}

/* The agent's planning, review and citations reach the run. */
static void test_agent_options_reach_run(void **state)
{
    sh h;
    json_t *run, *evs, *e;
    size_t i;
    int review = 0;

    (void)state;
    mem_start(&h, "{\"responses\":["
                  "{\"tool_calls\":[{\"id\":\"c1\",\"name\":\"get_time\","
                  "\"arguments\":\"{}\"}]},"
                  "{\"text\":[\"{\\\"complete\\\":true,\\\"next_step\\\":"
                  "\\\"proceed\\\",\\\"note\\\":\\\"fine\\\"}\"]},"
                  "{\"text\":[\"It is late.\"]}]}");
    run = sh_json(&h, "POST", "/v1/runs",
                  "{\"agent\":\"full\",\"input\":\"time?\"}", 200);
    assert_string_equal(sh_str(run, "status"), "completed");
    assert_string_equal(sh_str(run, "text"), "It is late.");
    evs = json_object_get(run, "events");
    json_array_foreach(evs, i, e) {
        if (strcmp(sh_str(e, "type"), "review") == 0) {
            review++;
            assert_string_equal(sh_str(e, "status"), "ok");
        }
    }
    assert_int_equal(review, 1);
    json_decref(run);
    /* planning: todo_write offered and the plan section in the system
     * message. */
    assert_true(offered(&h, 0, "todo_write"));
    assert_false(offered(&h, 0, "think"));
    sh_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_user_memory_round_trip),
        cmocka_unit_test(test_bad_user_refused),
        cmocka_unit_test(test_agent_options_reach_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
