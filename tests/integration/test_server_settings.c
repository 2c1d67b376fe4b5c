/*
 * Per-user settings through the server (docs/accounts.md "Per-user
 * settings"): GET and PUT /v1/me/settings with two users' keys (each
 * sees and changes only their own; keys and secrets answered masked,
 * never whole, and sealed in the database), every check with its 400 and
 * the size limits crossed by one, and what a run of the user follows:
 * their own Tavily key for web_search (a user without one gets the error
 * that tells them to add it), memory off (no memory tools offered), the
 * personal instructions in the system prompt, and the default agent. In
 * mode none: the anonymous user's settings and a named user's, apart.
 */
#include "server_accounts_util.h"

#include "loom/accounts.h"
#include "loom/log.h"

#define ADMIN "adm-0123456789abcdef"
#define TVLY "tvly-abcdefgh12345678"
#define SECRET "tracker-secret-0042"

static void start(sh *h, const char *script, int keys)
{
    accounts_start(h, script,
                   keys ? "  mode: keys\n  admin_key: " ADMIN "\n"
                        : "  mode: none\n");
}

static void key_for(sh *h, const char *user, char key[LOOM_KEY_SIZE])
{
    loom_key_spec spec = {.version = LOOM_KEY_SPEC_VERSION, .user = user};

    if (loom_store_key_create(h->store, &spec, key, NULL) != 0)
        fail_msg("key: %s", loom_error_last());
}

/* PUT /v1/me/settings body as key (NULL: none; extra: a header) must
 * answer want; a 400 must name param. The body, as JSON. */
static json_t *put(sh *h, const char *key, const char *extra, const char *body,
                   long want, const char *param)
{
    sh_resp r;
    json_t *j;

    if (call(h, key, extra, "PUT", "/v1/me/settings", body, &r) != want)
        fail_msg("PUT %s: status %ld, want %ld: %s", body, r.status, want,
                 r.body ? r.body : "");
    j = json_loads(r.body, 0, NULL);
    assert_non_null(j);
    if (param) {
        sh_check_error(r.body, "invalid_value");
        assert_string_equal(sh_str(json_object_get(j, "error"), "param"),
                            param);
    }
    assert_null(strstr(r.body, TVLY));
    assert_null(strstr(r.body, SECRET));
    sh_resp_free(&r);
    return j;
}

/* pre, n copies of c, then post. */
static char *body_with(const char *pre, size_t n, char c, const char *post)
{
    size_t a = strlen(pre), b = strlen(post);
    char *out = malloc(a + n + b + 1);

    memcpy(out, pre, a);
    memset(out + a, c, n);
    memcpy(out + a + n, post, b + 1);
    return out;
}

static void test_api(void **state)
{
    char alice[LOOM_KEY_SIZE], bob[LOOM_KEY_SIZE], *b, *db;
    size_t len;
    json_t *j;
    sh h;

    (void)state;
    start(&h, "{\"responses\":[]}", 1);
    key_for(&h, "alice", alice);
    key_for(&h, "bob", bob);

    j = put(&h, alice, NULL,
            "{\"web_search_keys\": {\"tavily\": \"" TVLY "\"},"
            " \"memory\": false, \"instructions\": \"Answer in French.\","
            " \"default_agent\": \"plain\","
            " \"secrets\": {\"tracker\": \"" SECRET "\"}}",
            200, NULL);
    assert_string_equal(sh_str(j, "object"), "user_settings");
    assert_string_equal(sh_str(json_object_get(j, "web_search_keys"), "tavily"),
                        "tvly-…5678");
    assert_string_equal(sh_str(json_object_get(j, "secrets"), "tracker"),
                        "tracker-…0042");
    assert_true(json_is_false(json_object_get(j, "memory")));
    assert_string_equal(sh_str(j, "instructions"), "Answer in French.");
    assert_string_equal(sh_str(j, "default_agent"), "plain");
    json_decref(j);

    /* Bob has none; alice's are kept as she left them. */
    j = call_json(&h, bob, NULL, "GET", "/v1/me/settings", NULL, 200);
    assert_int_equal(json_object_size(json_object_get(j, "web_search_keys")),
                     0);
    assert_true(json_is_true(json_object_get(j, "memory")));
    assert_true(json_is_null(json_object_get(j, "instructions")));
    json_decref(j);
    j = call_json(&h, alice, NULL, "GET", "/v1/me/settings", NULL, 200);
    assert_string_equal(sh_str(j, "instructions"), "Answer in French.");
    json_decref(j);

    /* A change keeps what it does not name; null removes. */
    j = put(&h, alice, NULL,
            "{\"secrets\": {\"tracker\": null, \"other\": \"short\"},"
            " \"default_agent\": null}",
            200, NULL);
    assert_string_equal(sh_str(json_object_get(j, "secrets"), "other"), "…");
    assert_null(json_object_get(json_object_get(j, "secrets"), "tracker"));
    assert_true(json_is_null(json_object_get(j, "default_agent")));
    assert_string_equal(sh_str(json_object_get(j, "web_search_keys"), "tavily"),
                        "tvly-…5678");
    json_decref(j);

    /* Checks: each a 400 naming the member, nothing changed. */
    json_decref(put(&h, alice, NULL, "{\"colour\": \"blue\"}", 400, "colour"));
    json_decref(put(&h, alice, NULL,
                    "{\"web_search_keys\": {\"google\": \"k\"}}", 400,
                    "web_search_keys.google"));
    json_decref(put(&h, alice, NULL,
                    "{\"web_search_keys\": {\"tavily\": \"a b\"}}", 400,
                    "web_search_keys.tavily"));
    json_decref(put(&h, alice, NULL, "{\"web_search_keys\": \"k\"}", 400,
                    "web_search_keys"));
    json_decref(put(&h, alice, NULL, "{\"memory\": \"no\"}", 400, "memory"));
    json_decref(
        put(&h, alice, NULL, "{\"instructions\": 7}", 400, "instructions"));
    json_decref(put(&h, alice, NULL, "{\"secrets\": {\"a-b\": \"v\"}}", 400,
                    "secrets.a-b"));
    json_decref(put(&h, alice, NULL, "{\"secrets\": {\"a\": \"x\\ny\"}}", 400,
                    "secrets.a"));
    json_decref(put(&h, alice, NULL, "{\"default_agent\": \"nobody\"}", 400,
                    "default_agent"));
    call_error(&h, alice, NULL, "PUT", "/v1/me/settings", "[1]", 400,
               "invalid_json");
    /* Limits, crossed by one. */
    {
        static const struct {
            const char *pre, *post, *param;
            size_t max;
        } lim[] = {
            {"{\"instructions\": \"", "\"}", "instructions",
             LOOM_SETTINGS_INSTRUCTIONS_MAX},
            {"{\"web_search_keys\": {\"brave\": \"", "\"}}",
             "web_search_keys.brave", LOOM_SETTINGS_KEY_MAX},
            {"{\"secrets\": {\"big\": \"", "\"}}", "secrets.big",
             LOOM_SETTINGS_SECRET_MAX},
        };
        for (size_t i = 0; i < sizeof(lim) / sizeof(lim[0]); i++) {
            b = body_with(lim[i].pre, lim[i].max, 'x', lim[i].post);
            json_decref(put(&h, alice, NULL, b, 200, NULL));
            free(b);
            b = body_with(lim[i].pre, lim[i].max + 1, 'x', lim[i].post);
            json_decref(put(&h, alice, NULL, b, 400, lim[i].param));
            free(b);
        }
    }
    {
        /* alice has 2 secrets (other, big): 30 more make 32, 31 make 33. */
        char body[4096];
        size_t n = 0;
        n += (size_t)snprintf(body + n, sizeof(body) - n, "{\"secrets\": {");
        for (int i = 0; i < 31; i++)
            n += (size_t)snprintf(body + n, sizeof(body) - n,
                                  "%s\"s%d\": \"v\"", i ? ", " : "", i);
        snprintf(body + n, sizeof(body) - n, "}}");
        json_decref(put(&h, alice, NULL, body, 400, "secrets"));
        memcpy(strstr(body, ", \"s30\": \"v\""), "}}", 3);
        j = put(&h, alice, NULL, body, 200, NULL);
        assert_int_equal(json_object_size(json_object_get(j, "secrets")), 32);
        json_decref(j);
    }
    /* Nothing of a refused change was kept. */
    j = call_json(&h, alice, NULL, "GET", "/v1/me/settings", NULL, 200);
    assert_true(json_is_false(json_object_get(j, "memory")));
    assert_null(
        json_object_get(json_object_get(j, "web_search_keys"), "google"));
    json_decref(j);
    /* Without a key: 401. */
    call_error(&h, NULL, NULL, "GET", "/v1/me/settings", NULL, 401,
               "invalid_api_key");

    /* Sealed at rest: the database (and its log) never holds a key or a
     * secret. */
    sh_stop_server(&h);
    for (int i = 0, read = 0; i < 2 || !read; i++) {
        assert_true(i < 2);
        char path[512];
        snprintf(path, sizeof(path), "%s%s", h.db, i ? "-wal" : "");
        if (!(db = test_read_file(path, &len)))
            continue;
        read++;
        assert_null(memmem(db, len, TVLY, strlen(TVLY)));
        assert_null(memmem(db, len, "Answer in French", 16));
        assert_null(memmem(db, len, "tracker-secret", 14));
        free(db);
    }
    sh_free(&h);
}

/* The names of the tools request i offered. */
static int offers(const sh *h, size_t i, const char *tool)
{
    json_t *reqs = fake_requests(h->fake), *t;
    const json_t *tools = json_object_get(
        json_object_get(json_array_get(reqs, i), "body"), "tools");
    size_t k;
    int found = 0;

    json_array_foreach(tools, k, t)
    {
        if (!strcmp(sh_str(json_object_get(t, "function"), "name"), tool))
            found = 1;
    }
    json_decref(reqs);
    return found;
}

/* The system prompt of request i, or "". */
static char *system_of(const sh *h, size_t i)
{
    json_t *reqs = fake_requests(h->fake);
    const json_t *m = json_array_get(
        json_object_get(json_object_get(json_array_get(reqs, i), "body"),
                        "messages"),
        0);
    char *out = strdup(
        !strcmp(sh_str(m, "role"), "system") ? sh_str(m, "content") : "");

    json_decref(reqs);
    return out;
}

#define SEARCH_CALL                                                            \
    "{\"tool_calls\":[{\"id\":\"s1\",\"name\":\"web_search\","                 \
    "\"arguments\":\"{\\\"query\\\":\\\"loom\\\"}\"}]}"
#define TAVILY_ANSWER                                                          \
    "{\"body\": \"{\\\"results\\\": [{\\\"title\\\": \\\"Loom\\\", "           \
    "\\\"url\\\": \\\"https://loom.example/\\\", \\\"content\\\": "            \
    "\\\"A loom.\\\"}]}\"}"

static void test_runs_follow_settings(void **state)
{
    char alice[LOOM_KEY_SIZE], bob[LOOM_KEY_SIZE], *sys, *res;
    json_t *reqs, *j;
    sh h;

    (void)state;
    unsetenv("TAVILY_API_KEY");
    /* alice: search (the fake answers as Tavily too), then text; bob:
     * search refused for want of a key, then text; alice's default agent. */
    start(&h,
          "{\"responses\":[" SEARCH_CALL "," TAVILY_ANSWER
          "," TEXT("Found it.") "," SEARCH_CALL
                                "," TEXT("No key.") "," TEXT("Plain.") "]}",
          1);
    key_for(&h, "alice", alice);
    key_for(&h, "bob", bob);
    json_decref(put(&h, alice, NULL,
                    "{\"web_search_keys\": {\"tavily\": \"" TVLY "\"},"
                    " \"memory\": false,"
                    " \"instructions\": \"Answer in French.\"}",
                    200, NULL));

    json_decref(call_json(&h, alice, NULL, "POST", "/v1/runs",
                          "{\"input\": \"Search loom\"}", 200));
    reqs = fake_requests(h.fake);
    /* The search went out with alice's own key. */
    assert_string_equal(
        sh_str(json_object_get(json_array_get(reqs, 1), "headers"),
               "authorization"),
        "Bearer " TVLY);
    json_decref(reqs);
    assert_false(offers(&h, 0, "memory_store"));
    assert_false(offers(&h, 0, "memory_retrieve"));
    assert_true(offers(&h, 0, "web_search"));
    sys = system_of(&h, 0);
    assert_non_null(strstr(sys, "<user_instructions>"));
    assert_non_null(strstr(sys, "Answer in French."));
    free(sys);

    /* Bob: no key of his own, none configured: the advice is true now. */
    json_decref(call_json(&h, bob, NULL, "POST", "/v1/runs",
                          "{\"input\": \"Search loom\"}", 200));
    res = tool_result(&h, 4);
    assert_non_null(strstr(res, "add your own Tavily key in your user "
                                "settings (key name \"tavily\")"));
    free(res);
    assert_true(offers(&h, 3, "memory_store"));
    sys = system_of(&h, 3);
    assert_null(strstr(sys, "Answer in French."));
    free(sys);

    /* A default agent of her own for a run naming none. */
    json_decref(
        put(&h, alice, NULL, "{\"default_agent\": \"plain\"}", 200, NULL));
    j = call_json(&h, alice, NULL, "POST", "/v1/runs", "{\"input\": \"Hi\"}",
                  200);
    assert_string_equal(sh_str(j, "agent"), "plain");
    json_decref(j);
    sh_free(&h);
}

/* Mode none: the anonymous user's settings, and a named user's apart. */
static void test_mode_none(void **state)
{
    json_t *j;
    char *sys;
    sh h;

    (void)state;
    start(&h, "{\"responses\":[" TEXT("One.") "," TEXT("Two.") "]}", 0);
    json_decref(
        put(&h, NULL, NULL, "{\"instructions\": \"Be brief.\"}", 200, NULL));
    json_decref(put(&h, NULL, "X-Loom-User: carol",
                    "{\"instructions\": \"Be verbose.\"}", 200, NULL));
    j = call_json(&h, NULL, NULL, "GET", "/v1/me/settings", NULL, 200);
    assert_string_equal(sh_str(j, "instructions"), "Be brief.");
    json_decref(j);
    j = call_json(&h, NULL, NULL, "GET", "/v1/me/settings?user=carol", NULL,
                  200);
    assert_string_equal(sh_str(j, "instructions"), "Be verbose.");
    json_decref(j);
    call_error(&h, NULL, "X-Loom-User: a/b", "GET", "/v1/me/settings", NULL,
               400, "invalid_value");
    json_decref(call_json(&h, NULL, NULL, "POST", "/v1/runs",
                          "{\"input\": \"Hi\"}", 200));
    sys = system_of(&h, 0);
    assert_non_null(strstr(sys, "Be brief."));
    free(sys);
    json_decref(call_json(&h, NULL, NULL, "POST", "/v1/runs",
                          "{\"input\": \"Hi\", \"user\": \"carol\"}", 200));
    sys = system_of(&h, 1);
    assert_non_null(strstr(sys, "Be verbose."));
    assert_null(strstr(sys, "Be brief."));
    free(sys);
    sh_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_api),
        cmocka_unit_test(test_runs_follow_settings),
        cmocka_unit_test(test_mode_none),
    };

    loom_log_set(stderr, LOOM_LOG_WARN, LOOM_LOG_TEXT);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
