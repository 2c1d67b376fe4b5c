/*
 * Models and agents as a client sees them (issue 11, "agents are
 * models"): GET /v1/models lists every agent as agent/<name> with its
 * model in the "loom" field; GET /v1/models/{id} answers ids with
 * slashes and 404s in OpenAI's shape; a chat naming an agent runs it
 * (prompt and tools), one naming a model runs no agent and is stored so;
 * bare names follow the one rule of docs/routing.md#model-names.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_server_harness.h"

#define HELLO "{\"text\":[\"hello\"]}"
#define LOOP(r) "{\"loop\":true,\"responses\":[" r "]}"

/* The object of data whose id is id, or NULL. */
static json_t *find_id(json_t *data, const char *id)
{
    size_t i;
    json_t *m;

    json_array_foreach(data, i, m)
    {
        if (!strcmp(sh_str(m, "id"), id))
            return m;
    }
    return NULL;
}

static void test_models_list_agents(void **state)
{
    sh h;
    sh_resp r;
    json_t *j, *m, *loom;

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, NULL);
    j = sh_json(&h, "GET", "/v1/models", NULL, 200);
    m = find_id(json_object_get(j, "data"), "agent/plain");
    assert_non_null(m);
    assert_string_equal(sh_str(m, "object"), "model");
    assert_string_equal(sh_str(m, "owned_by"), "loom");
    loom = json_object_get(m, "loom");
    assert_string_equal(sh_str(loom, "agent"), "plain");
    assert_string_equal(sh_str(loom, "model"), "fake/m");
    assert_non_null(find_id(json_object_get(j, "data"), "agent/a"));
    assert_non_null(find_id(json_object_get(j, "data"), "fake/m"));
    assert_null(json_object_get(j, "loom")); /* not the offline demo */
    json_decref(j);

    /* Ids with slashes: an agent, a listed model, an unlisted one. */
    j = sh_json(&h, "GET", "/v1/models/agent/plain", NULL, 200);
    assert_string_equal(sh_str(j, "id"), "agent/plain");
    assert_string_equal(sh_str(json_object_get(j, "loom"), "model"), "fake/m");
    json_decref(j);
    j = sh_json(&h, "GET", "/v1/models/agent%2Fplain", NULL, 200);
    assert_string_equal(sh_str(j, "id"), "agent/plain");
    json_decref(j);
    j = sh_json(&h, "GET", "/v1/models/fake/m", NULL, 200);
    assert_string_equal(sh_str(j, "owned_by"), "fake");
    json_decref(j);
    j = sh_json(&h, "GET", "/v1/models/fake/org/x", NULL, 200);
    assert_string_equal(sh_str(j, "id"), "fake/org/x");
    json_decref(j);

    /* Unknown ids: OpenAI's 404. */
    assert_int_equal(
        sh_req(&h, "GET", "/v1/models/agent/nobody", NULL, NULL, &r), 404);
    sh_check_error(r.body, "model_not_found");
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "GET", "/v1/models/nope/m", NULL, NULL, &r),
                     404);
    sh_check_error(r.body, "model_not_found");
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "GET", "/v1/models/bare", NULL, NULL, &r), 404);
    sh_check_error(r.body, "model_not_found");
    sh_resp_free(&r);
    sh_free(&h);
}

/* The conversation the chat answer names, from the store. */
static json_t *chat_conversation(const sh *h, const char *body)
{
    sh_resp r;
    char path[256], conv[128];

    assert_int_equal(sh_req(h, "POST", "/v1/chat/completions", body, NULL, &r),
                     200);
    assert_non_null(
        sh_header(&r, "x-loom-conversation-id", conv, sizeof(conv)));
    snprintf(path, sizeof(path), "/v1/conversations/%s", conv);
    sh_resp_free(&r);
    return sh_json(h, "GET", path, NULL, 200);
}

/* The first message the fake received in request i. */
static json_t *first_message(json_t *reqs, size_t i)
{
    json_t *body = json_object_get(json_array_get(reqs, i), "body");

    return json_array_get(json_object_get(body, "messages"), 0);
}

/* A chat stores what ran: the agent it named, or no agent for a model. */
static void test_chat_stores_what_ran(void **state)
{
    sh h;
    json_t *conv, *reqs, *first;

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, NULL);
    conv = chat_conversation(&h, "{\"model\":\"fake/m\",\"messages\":[{"
                                 "\"role\":\"user\",\"content\":\"hi\"}]}");
    assert_true(json_is_null(json_object_get(conv, "agent")));
    assert_string_equal(sh_str(conv, "model"), "fake/m");
    json_decref(conv);

    conv = chat_conversation(&h, "{\"model\":\"agent/plain\",\"messages\":[{"
                                 "\"role\":\"user\",\"content\":\"hi\"}]}");
    assert_string_equal(sh_str(conv, "agent"), "plain");
    json_decref(conv);

    /* The agent's prompt went upstream; the plain model's did not. */
    reqs = fake_requests(h.fake);
    assert_int_equal(json_array_size(reqs), 2);
    first = first_message(reqs, 0);
    assert_string_equal(sh_str(first, "role"), "user");
    first = first_message(reqs, 1);
    assert_string_equal(sh_str(first, "role"), "system");
    assert_string_equal(sh_str(first, "content"), "Be brief.");
    json_decref(reqs);
    sh_free(&h);
}

/* Bare names: the listed model they name, by upstream id or by name. */
static void test_chat_bare_listed_name(void **state)
{
    sh h;
    json_t *conv;

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, NULL);
    conv = chat_conversation(&h, "{\"model\":\"fake-model\",\"messages\":[{"
                                 "\"role\":\"user\",\"content\":\"hi\"}]}");
    assert_string_equal(sh_str(conv, "model"), "fake/m");
    json_decref(conv);
    conv = chat_conversation(&h, "{\"model\":\"m\",\"messages\":[{"
                                 "\"role\":\"user\",\"content\":\"hi\"}]}");
    assert_string_equal(sh_str(conv, "model"), "fake/m");
    json_decref(conv);
    sh_free(&h);
}

/* A server without any provider (an embedder's config): runs and chats
 * are the server's problem, a 503 no_provider, not a client error. */
static void test_no_provider_is_503(void **state)
{
    loom_server_options so = LOOM_SERVER_OPTIONS_INIT;
    loom_config *cfg = NULL;
    loom_store *store = NULL;
    loom_server *srv = NULL;
    sh h;
    sh_resp r;
    char *db = test_tmp_path("noprov.db");

    (void)state;
    memset(&h, 0, sizeof(h));
    unlink(db);
    assert_int_equal(loom_config_load_string(
                         &cfg, "server:\n  listen: 127.0.0.1:0\n", "t.yaml"),
                     0);
    assert_int_equal(cfg->providers_len, 0);
    assert_int_equal(loom_store_open(&store, db), 0);
    so.config = cfg;
    so.store = store;
    assert_int_equal(loom_server_new(&srv, &so), 0);
    assert_int_equal(loom_server_start(srv), 0);
    snprintf(h.base, sizeof(h.base), "http://127.0.0.1:%d",
             loom_server_port(srv));
    assert_int_equal(sh_req(&h, "POST", "/v1/chat/completions",
                            "{\"model\":\"gpt-4o\",\"messages\":[{"
                            "\"role\":\"user\",\"content\":\"hi\"}]}",
                            NULL, &r),
                     503);
    sh_check_error(r.body, "no_provider");
    sh_resp_free(&r);
    assert_int_equal(
        sh_req(&h, "POST", "/v1/runs", "{\"input\":\"hi\"}", NULL, &r), 503);
    sh_check_error(r.body, "no_provider");
    sh_resp_free(&r);
    loom_server_free(srv);
    loom_store_free(store);
    loom_config_free(cfg);
    unlink(db);
    free(db);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_models_list_agents),
        cmocka_unit_test(test_chat_stores_what_ran),
        cmocka_unit_test(test_chat_bare_listed_name),
        cmocka_unit_test(test_no_provider_is_503),
    };

    curl_global_init(CURL_GLOBAL_DEFAULT);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
