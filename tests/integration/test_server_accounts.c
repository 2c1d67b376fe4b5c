/*
 * Accounts through the server (docs/accounts.md): a server in mode keys
 * over the fake upstream, with keys made by loom/accounts.h (as `loom
 * keys` makes them) and by the admin API.
 *
 * Identity: no key, a wrong, malformed, revoked or expired key is 401
 * invalid_api_key; the admin key cannot run inference and an API key
 * cannot administer; operations stay open; repeated failures from one
 * address get 429. Isolation, with two user keys and a service key's two
 * end users: memories (the reported bug: a request naming "alice" does
 * not reach alice's memories), conversations (get, list, delete,
 * continue, by both APIs), runs (get, events, cancel, input) are each
 * 404 for anyone but their owner. A key limited to some agents or
 * models gets 403 for others. The admin API makes, lists, limits and
 * revokes keys, and the audit log says so. CORS answers an allowed
 * origin's preflight only. A non-loopback listen in mode none is
 * refused unless allowed. No key ever shows in the server's log, its
 * answers or the store's audit log.
 */
#include "server_accounts_util.h"

#include "loom/accounts.h"
#include "loom/log.h"

#define ADMIN "adm-0123456789abcdef"

static FILE *g_log;

/* A server in mode keys over the fake with script (accounts_start); extra
 * (may be NULL) is added to the config after the auth section's keys. */
static void start(sh *h, const char *script, const char *extra)
{
    char *auth = NULL;

    assert_true(asprintf(&auth, "  mode: keys\n  admin_key: " ADMIN "\n%s",
                         extra ? extra : "") > 0);
    accounts_start(h, script, auth);
    free(auth);
}

static void key_for(sh *h, const char *user, int service, const char *agent,
                    char key[LOOM_KEY_SIZE])
{
    const char *agents[1] = {agent};
    loom_key_spec spec = {.version = LOOM_KEY_SPEC_VERSION,
                          .user = user,
                          .workspace = "acme",
                          .service = service,
                          .agents = agents,
                          .agents_len = agent ? 1 : 0};

    if (loom_store_key_create(h->store, &spec, key, NULL) != 0)
        fail_msg("key: %s", loom_error_last());
}

/* Who may call what: keys, the admin key, operations, expiry, revoking,
 * and no key in the log or the answers. */
static void test_identity(void **state)
{
    loom_key_spec spec = {
        .version = LOOM_KEY_SPEC_VERSION, .user = "eve", .expires_at = 1000};
    char key[LOOM_KEY_SIZE], bad[LOOM_KEY_SIZE], old[LOOM_KEY_SIZE];
    char v[256];
    sh h;
    sh_resp r;
    json_t *j;

    (void)state;
    start(&h, "{\"responses\":[" TEXT("Hello.") "]}", NULL);
    key_for(&h, "alice", 0, NULL, key);
    assert_int_equal(loom_store_key_create(h.store, &spec, old, NULL), 0);
    memcpy(bad, key, sizeof(bad));
    bad[30] = bad[30] == '0' ? '1' : '0';

    assert_int_equal(call(&h, NULL, NULL, "GET", "/v1/models", NULL, &r), 401);
    sh_check_error(r.body, "invalid_api_key");
    assert_non_null(sh_header(&r, "WWW-Authenticate", v, sizeof(v)));
    sh_resp_free(&r);
    call_error(&h, bad, NULL, "GET", "/v1/models", NULL, 401,
               "invalid_api_key");
    call_error(&h, "sk-not-a-loom-key", NULL, "GET", "/v1/models", NULL, 401,
               "invalid_api_key");
    call_error(&h, old, NULL, "GET", "/v1/models", NULL, 401,
               "invalid_api_key");
    /* The admin key runs nothing; an API key administers nothing. */
    call_error(&h, ADMIN, NULL, "GET", "/v1/models", NULL, 401,
               "invalid_api_key");
    call_error(&h, key, NULL, "GET", "/v1/admin/keys", NULL, 401,
               "invalid_api_key");
    call_error(&h, NULL, NULL, "GET", "/v1/admin/keys", NULL, 401,
               "invalid_api_key");
    /* Operations are open. */
    json_decref(call_json(&h, NULL, NULL, "GET", "/healthz", NULL, 200));
    json_decref(call_json(&h, NULL, NULL, "GET", "/readyz", NULL, 200));

    j = call_json(&h, key, NULL, "POST", "/v1/chat/completions",
                  CHAT("anyone", "Hi"), 200);
    json_decref(j);

    /* Revoked: refused at the next request. */
    assert_int_equal(loom_store_key_revoke(h.store, key, "test", NULL), 0);
    call_error(&h, key, NULL, "GET", "/v1/models", NULL, 401,
               "invalid_api_key");

    sh_free(&h);
    assert_false(file_holds(g_log, key + 20));
    assert_false(file_holds(g_log, bad + 20));
    assert_false(file_holds(g_log, ADMIN));
}

/* The reported bug: under mode keys, a request naming "alice" does not
 * read alice's memories; a service key's end users are kept apart. */
static void test_memory_isolation(void **state)
{
    char alice[LOOM_KEY_SIZE], mallory[LOOM_KEY_SIZE], svc[LOOM_KEY_SIZE];
    char *res;
    sh h;

    (void)state;
    start(&h,
          "{\"responses\":[" STORE_CALL
          "," TEXT("Noted.") "," RETRIEVE_CALL "," TEXT(
              "Nothing.") "," RETRIEVE_CALL
                          "," TEXT("4321.") "," STORE_CALL "," TEXT(
                              "Noted.") "," RETRIEVE_CALL
                                        "," TEXT("Nothing.") "," RETRIEVE_CALL
                                                             "," TEXT(
                                                                 "4321.") "]}",
          NULL);
    key_for(&h, "alice", 0, NULL, alice);
    key_for(&h, "mallory", 0, NULL, mallory);
    key_for(&h, "backend", 1, NULL, svc);

    json_decref(call_json(&h, alice, NULL, "POST", "/v1/chat/completions",
                          CHAT("alice", "My PIN is 4321."), 200));
    /* Mallory names alice: nothing of hers. */
    json_decref(call_json(&h, mallory, NULL, "POST", "/v1/chat/completions",
                          CHAT("alice", "What is my PIN?"), 200));
    res = tool_result(&h, 3);
    assert_null(strstr(res, "4321"));
    free(res);
    /* Alice, whatever her request calls her, has it. */
    json_decref(call_json(&h, alice, NULL, "POST", "/v1/chat/completions",
                          CHAT("someone", "What is my PIN?"), 200));
    res = tool_result(&h, 5);
    assert_non_null(strstr(res, "4321"));
    free(res);

    /* A service key: end user u1 stores, u2 finds nothing, u1 finds it. */
    json_decref(call_json(&h, svc, NULL, "POST", "/v1/chat/completions",
                          CHAT("u1", "My PIN is 4321."), 200));
    json_decref(call_json(&h, svc, NULL, "POST", "/v1/chat/completions",
                          CHAT("u2", "What is my PIN?"), 200));
    res = tool_result(&h, 9);
    assert_null(strstr(res, "4321"));
    free(res);
    json_decref(call_json(&h, svc, NULL, "POST", "/v1/chat/completions",
                          CHAT("u1", "What is my PIN?"), 200));
    res = tool_result(&h, 11);
    assert_non_null(strstr(res, "4321"));
    free(res);
    sh_free(&h);
}

static void test_object_isolation(void **state)
{
    char alice[LOOM_KEY_SIZE], bob[LOOM_KEY_SIZE], svc[LOOM_KEY_SIZE];
    char run[64], conv[64], srun[64], sconv[64];
    sh h;
    json_t *j;

    (void)state;
    start(&h,
          "{\"responses\":[" TEXT("One.") "," TEXT("Two.") "," TEXT(
              "Three.") "]}",
          NULL);
    key_for(&h, "alice", 0, NULL, alice);
    key_for(&h, "bob", 0, NULL, bob);
    key_for(&h, "backend", 1, NULL, svc);

    j = call_json(&h, alice, NULL, "POST", "/v1/runs",
                  "{\"input\":\"Hi\",\"user\":\"bob\"}", 200);
    snprintf(run, sizeof(run), "%s", sh_str(j, "id"));
    snprintf(conv, sizeof(conv), "%s", sh_str(j, "conversation_id"));
    json_decref(j);
    check_hidden(&h, bob, NULL, run, conv);
    check_seen(&h, alice, NULL, run, conv);

    j = call_json(&h, svc, NULL, "POST", "/v1/runs",
                  "{\"input\":\"Hi\",\"user\":\"u1\"}", 200);
    snprintf(srun, sizeof(srun), "%s", sh_str(j, "id"));
    snprintf(sconv, sizeof(sconv), "%s", sh_str(j, "conversation_id"));
    json_decref(j);
    check_hidden(&h, svc, "X-Loom-User: u2", srun, sconv);
    check_hidden(&h, svc, NULL, srun, sconv);
    check_hidden(&h, alice, "X-Loom-User: u1", srun, sconv);
    check_seen(&h, svc, "X-Loom-User: u1", srun, sconv);
    /* A bad end user is a 400 where it names the caller. */
    call_error(&h, svc, "X-Loom-User: a/b", "GET", "/v1/conversations", NULL,
               400, "invalid_value");

    /* The owner continues and deletes. */
    {
        char body[256], path[128];
        snprintf(body, sizeof(body),
                 "{\"input\":\"more\",\"conversation_id\":\"%s\"}", conv);
        json_decref(call_json(&h, alice, NULL, "POST", "/v1/runs", body, 200));
        snprintf(path, sizeof(path), "/v1/conversations/%s", conv);
        json_decref(call_json(&h, alice, NULL, "DELETE", path, NULL, 200));
    }
    sh_free(&h);
}

/* A sub-agent's run, read from the store, is its top run's owner's. */
static void test_stored_child_run(void **state)
{
    char alice[LOOM_KEY_SIZE], bob[LOOM_KEY_SIZE], path[128];
    const char *kid;
    sh h;
    json_t *run, *j;

    (void)state;
    start(&h,
          "{\"responses\":[{\"tool_calls\":[{\"id\":\"k1\",\"name\":"
          "\"kid\",\"arguments\":\"{\\\"task\\\":\\\"count\\\"}\"}]}," TEXT(
              "Three.") "," TEXT("It is three.") "]}",
          NULL);
    key_for(&h, "alice", 0, NULL, alice);
    key_for(&h, "bob", 0, NULL, bob);
    run = call_json(&h, alice, NULL, "POST", "/v1/runs",
                    "{\"input\":\"Count.\",\"agent\":\"boss\"}", 200);
    snprintf(path, sizeof(path), "/v1/runs/%s", sh_str(run, "id"));
    json_decref(run);
    run = call_json(&h, alice, NULL, "GET", path, NULL, 200);
    kid = sh_str(json_array_get(json_object_get(run, "children"), 0), "id");
    assert_non_null(kid);
    snprintf(path, sizeof(path), "/v1/runs/%s", kid);
    j = call_json(&h, alice, NULL, "GET", path, NULL, 200);
    assert_string_equal(sh_str(j, "agent"), "kid");
    json_decref(j);
    call_error(&h, bob, NULL, "GET", path, NULL, 404, "not_found");
    call_error(&h, bob, NULL, "GET", "/v1/runs/run_nothing", NULL, 404,
               "not_found");
    json_decref(run);
    sh_free(&h);
}

static void test_allowed_agents_and_models(void **state)
{
    const char *models[1] = {"fake/other"};
    loom_key_spec spec = {.version = LOOM_KEY_SPEC_VERSION,
                          .user = "m",
                          .models = models,
                          .models_len = 1};
    char plain[LOOM_KEY_SIZE], other[LOOM_KEY_SIZE];
    sh h;

    (void)state;
    start(&h, "{\"responses\":[" TEXT("Fine.") "," TEXT("Fine.") "]}", NULL);
    key_for(&h, "p", 0, "plain", plain);
    assert_int_equal(loom_store_key_create(h.store, &spec, other, NULL), 0);
    call_error(&h, plain, NULL, "POST", "/v1/runs", "{\"input\":\"Hi\"}", 403,
               "agent_not_allowed");
    call_error(&h, plain, NULL, "POST", "/v1/chat/completions", CHAT("x", "Hi"),
               403, "agent_not_allowed");
    json_decref(call_json(&h, plain, NULL, "POST", "/v1/runs",
                          "{\"input\":\"Hi\",\"agent\":\"plain\"}", 200));
    call_error(&h, other, NULL, "POST", "/v1/runs", "{\"input\":\"Hi\"}", 403,
               "model_not_allowed");
    json_decref(call_json(&h, other, NULL, "POST", "/v1/runs",
                          "{\"input\":\"Hi\",\"model\":\"fake/other\"}", 200));
    sh_free(&h);
}

static void test_admin_api(void **state)
{
    char path[128], id[32], *text, secret[49], secret2[49];
    const char *key;
    sh h;
    json_t *made, *j, *e;
    size_t i;

    (void)state;
    start(&h, "{\"responses\":[" TEXT("Hi.") "]}", NULL);
    made = call_json(&h, ADMIN, NULL, "POST", "/v1/admin/keys",
                     "{\"user\":\"zoe\",\"workspace\":\"lab\",\"rpm\":30,"
                     "\"budget_usd\":1.5,\"budget_period\":\"day\","
                     "\"budget_allow_unpriced\":true,\"agents\":[\"a\"]}",
                     201);
    key = sh_str(made, "key");
    assert_non_null(key);
    snprintf(id, sizeof(id), "%s", sh_str(made, "id"));
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(made, "limits"), "budget_micros")),
                     1500000);
    json_decref(call_json(&h, key, NULL, "POST", "/v1/runs",
                          "{\"input\":\"Hi\"}", 200));
    call_error(&h, ADMIN, NULL, "POST", "/v1/admin/keys", "{\"rpm\":1}", 400,
               "invalid_value");
    call_error(&h, ADMIN, NULL, "POST", "/v1/admin/keys",
               "{\"user\":\"z\",\"color\":1}", 400, "unknown_parameter");

    j = call_json(&h, ADMIN, NULL, "GET", "/v1/admin/keys?workspace=lab", NULL,
                  200);
    assert_int_equal(json_array_size(json_object_get(j, "data")), 1);
    json_decref(j);
    snprintf(path, sizeof(path), "/v1/admin/keys/%s", id);
    json_decref(call_json(&h, ADMIN, NULL, "PATCH", path, "{\"rpm\":60}", 200));
    j = call_json(&h, ADMIN, NULL, "DELETE", path, NULL, 200);
    assert_false(json_is_null(json_object_get(j, "revoked_at")));
    json_decref(j);
    call_error(&h, key, NULL, "POST", "/v1/runs", "{\"input\":\"Hi\"}", 401,
               "invalid_api_key");
    call_error(&h, ADMIN, NULL, "DELETE", "/v1/admin/keys/ffffffffffffffff",
               NULL, 404, "not_found");

    j = call_json(&h, ADMIN, NULL, "GET", "/v1/admin/users", NULL, 200);
    assert_string_equal(
        sh_str(json_array_get(json_object_get(j, "data"), 0), "name"), "zoe");
    json_decref(j);
    j = call_json(&h, ADMIN, NULL, "GET", "/v1/admin/workspaces", NULL, 200);
    assert_string_equal(
        sh_str(json_array_get(json_object_get(j, "data"), 0), "id"), "lab");
    json_decref(j);
    j = call_json(&h, ADMIN, NULL, "GET", "/v1/admin/audit", NULL, 200);
    {
        const char *want[] = {"key.revoked", "key.limits_changed",
                              "key.created"};
        assert_int_equal(json_array_size(json_object_get(j, "data")), 3);
        json_array_foreach(json_object_get(j, "data"), i, e)
        {
            assert_string_equal(sh_str(e, "action"), want[i]);
            assert_string_equal(sh_str(e, "actor"), "admin");
        }
    }
    text = json_dumps(j, 0);
    assert_null(strstr(text, key + 20));
    free(text);
    json_decref(j);
    /* Revoking by the whole key in the path: the log line masks it. */
    {
        char k2[LOOM_KEY_SIZE], p2[128];
        key_for(&h, "yann", 0, NULL, k2);
        snprintf(p2, sizeof(p2), "/v1/admin/keys/%s", k2);
        json_decref(call_json(&h, ADMIN, NULL, "DELETE", p2, NULL, 200));
        memcpy(secret2, k2 + 20, sizeof(secret2));
    }
    memcpy(secret, key + 20, sizeof(secret));
    json_decref(made);
    /* Each request's log line is written once it completed: all are
     * once the server is freed. */
    sh_free(&h);
    assert_true(file_holds(g_log, "DELETE /v1/admin/keys/lk_"));
    assert_false(file_holds(g_log, secret));
    assert_false(file_holds(g_log, secret2));
}

/* Past ten failed checks in a minute, an address gets 429, good key or
 * not, and the log says so once, without the keys. */
static void test_failures_slowed(void **state)
{
    char key[LOOM_KEY_SIZE], bad[LOOM_KEY_SIZE];
    sh h;
    sh_resp r;
    char v[64];

    (void)state;
    start(&h, "{\"responses\":[]}", NULL);
    key_for(&h, "alice", 0, NULL, key);
    memcpy(bad, key, sizeof(bad));
    bad[40] = bad[40] == 'a' ? 'b' : 'a';
    for (int i = 0; i < 10; i++)
        call_error(&h, bad, NULL, "GET", "/v1/models", NULL, 401,
                   "invalid_api_key");
    assert_int_equal(call(&h, key, NULL, "GET", "/v1/models", NULL, &r), 429);
    sh_check_error(r.body, "rate_limit_exceeded");
    assert_non_null(sh_header(&r, "Retry-After", v, sizeof(v)));
    sh_resp_free(&r);
    /* Operations are not slowed. */
    json_decref(call_json(&h, NULL, NULL, "GET", "/healthz", NULL, 200));
    sh_free(&h);
    assert_true(file_holds(g_log, "failed API key checks from 127.0.0.1"));
    assert_false(file_holds(g_log, bad + 20));
    assert_false(file_holds(g_log, key + 20));
}

static void test_cors(void **state)
{
    char key[LOOM_KEY_SIZE], v[512];
    sh h;
    sh_resp r;

    (void)state;
    start(&h, "{\"responses\":[]}", NULL);
    key_for(&h, "alice", 0, NULL, key);
    {
        struct curl_slist *hd = NULL;
        hd = curl_slist_append(hd, "Origin: https://app.example.com");
        hd = curl_slist_append(hd, "Access-Control-Request-Method: POST");
        assert_int_equal(
            sh_req(&h, "OPTIONS", "/v1/chat/completions", NULL, hd, &r), 204);
        assert_string_equal(
            sh_header(&r, "Access-Control-Allow-Origin", v, sizeof(v)),
            "https://app.example.com");
        assert_non_null(
            strstr(sh_header(&r, "Access-Control-Allow-Headers", v, sizeof(v)),
                   "Authorization"));
        sh_resp_free(&r);
        curl_slist_free_all(hd);
        /* Another origin gets no preflight answer. */
        hd = curl_slist_append(NULL, "Origin: https://evil.example.com");
        hd = curl_slist_append(hd, "Access-Control-Request-Method: POST");
        assert_int_equal(
            sh_req(&h, "OPTIONS", "/v1/chat/completions", NULL, hd, &r), 405);
        assert_null(sh_header(&r, "Access-Control-Allow-Origin", v, sizeof(v)));
        sh_resp_free(&r);
        curl_slist_free_all(hd);
    }
    /* A plain answer to the allowed origin says it may be read. */
    assert_int_equal(call(&h, key, "Origin: https://app.example.com", "GET",
                          "/v1/models", NULL, &r),
                     200);
    assert_string_equal(
        sh_header(&r, "Access-Control-Allow-Origin", v, sizeof(v)),
        "https://app.example.com");
    sh_resp_free(&r);
    assert_int_equal(call(&h, key, "Origin: https://evil.example.com", "GET",
                          "/v1/models", NULL, &r),
                     200);
    assert_null(sh_header(&r, "Access-Control-Allow-Origin", v, sizeof(v)));
    sh_resp_free(&r);
    sh_free(&h);
}

/* Mode none beyond loopback: refused, unless allowed (then warned). */
static void test_listen_guard(void **state)
{
    loom_server_options so = LOOM_SERVER_OPTIONS_INIT;
    loom_config *cfg = NULL;
    loom_store *st = NULL;
    loom_server *srv = NULL;
    char *db = test_tmp_path("accounts-listen.db");

    (void)state;
    unlink(db);
    assert_int_equal(loom_store_open(&st, db), 0);
    assert_int_equal(loom_config_load_string(
                         &cfg, "server: {listen: \"0.0.0.0:0\"}\n", "l.yaml"),
                     0);
    so.config = cfg;
    so.store = st;
    assert_int_equal(loom_server_new(&srv, &so), 0);
    assert_int_equal(loom_server_start(srv), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "allow_unauthenticated"));
    loom_server_free(srv);
    loom_config_free(cfg);
    assert_int_equal(
        loom_config_load_string(&cfg,
                                "server: {listen: \"0.0.0.0:0\"}\n"
                                "auth: {allow_unauthenticated: true}\n",
                                "l.yaml"),
        0);
    so.config = cfg;
    assert_int_equal(loom_server_new(&srv, &so), 0);
    assert_int_equal(loom_server_start(srv), 0);
    assert_true(file_holds(g_log, "auth.allow_unauthenticated is set"));
    loom_server_free(srv);
    loom_config_free(cfg);
    loom_store_free(st);
    unlink(db);
    free(db);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identity),
        cmocka_unit_test(test_memory_isolation),
        cmocka_unit_test(test_object_isolation),
        cmocka_unit_test(test_stored_child_run),
        cmocka_unit_test(test_allowed_agents_and_models),
        cmocka_unit_test(test_admin_api),
        cmocka_unit_test(test_failures_slowed),
        cmocka_unit_test(test_cors),
        cmocka_unit_test(test_listen_guard),
    };
    int rc;

    g_log = tmpfile();
    loom_log_set(g_log, LOOM_LOG_DEBUG, LOOM_LOG_TEXT);
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    fclose(g_log);
    return rc;
}
