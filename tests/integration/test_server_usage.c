/*
 * GET /v1/usage and GET /v1/admin/usage through the server
 * (docs/accounts.md#usage): a server in mode keys over the fake upstream,
 * runs by two user keys (one through a sub-agent, one on a model without
 * prices) and by a service key for two end users, then each caller's
 * sums checked against SQL over the server's store file.
 *
 * Sub-agent calls are counted to the top run's key and user; two users
 * never see each other's usage; a service key sees its end users, one at
 * a time with ?user= or X-Loom-User; the admin sees anyone's and narrows
 * by user, workspace and key; the admin key and API keys each stay on
 * their side. The range is [from, to) in Unix seconds or dates; bad
 * values are 400s naming the parameter. Each limit (rows, groups)
 * answers at it and refuses one past it. In mode none everything is
 * visible and ?user= narrows.
 */
#include "test_server_harness.h"

#include "loom/accounts.h"
#include "store_fixture.h"

#define ADMIN "adm-usage-0123456789"

/* A model answer with its usage (prompt p, completion c tokens). */
#define TEXT(t, p, c)                                                          \
    "{\"text\":[\"" t "\"],\"usage\":{\"prompt_tokens\":" #p                   \
    ",\"completion_tokens\":" #c ",\"total_tokens\":" #p "}}"
#define CALL_KID(p, c)                                                         \
    "{\"tool_calls\":[{\"id\":\"k1\",\"name\":\"kid\",\"arguments\":"          \
    "\"{\\\"task\\\":\\\"count\\\"}\"}],\"usage\":{\"prompt_tokens\":" #p      \
    ",\"completion_tokens\":" #c ",\"total_tokens\":" #p "}}"

/* A server over the fake with script, in mode (keys or none). fake/m is
 * priced at 1 and 2 dollars per million tokens (so a token costs 1 or 2
 * micro-dollars); fake/other has no prices. */
static void start(sh *h, const char *script, const char *mode)
{
    static int n;
    char name[64], *yaml = NULL;

    memset(h, 0, sizeof(*h));
    h->fake = fake_start_script(script);
    assert_non_null(h->fake);
    snprintf(name, sizeof(name), "usage-%d.db", n++);
    h->db = test_tmp_path(name);
    test_db_remove(h->db);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake:\n"
                         "    base_url: %s\n"
                         "    api_key: sk-test\n"
                         "    retries: {max: 0}\n"
                         "models:\n"
                         "  fake/m: {upstream: fake-model, prices: "
                         "{input: 1, output: 2}}\n"
                         "  fake/other: {upstream: fake-model}\n"
                         "agents:\n"
                         "  a: {model: fake/m, tools: [], memory: false}\n"
                         "  boss: {model: fake/m, tools: [], "
                         "sub_agents: [kid]}\n"
                         "  kid: {model: fake/m, tools: []}\n"
                         "default_agent: a\n"
                         "server:\n"
                         "  listen: 127.0.0.1:0\n"
                         "auth:\n"
                         "  mode: %s\n"
                         "  admin_key: " ADMIN "\n",
                         fake_base_url(h->fake), mode) > 0);
    sh_start_config_tools(h, yaml, 1);
    free(yaml);
}

/* A key of user in workspace acme; its id into id (LOOM_KEY_ID_SIZE). */
static void key_for(sh *h, const char *user, int service,
                    char key[LOOM_KEY_SIZE], char *id)
{
    loom_key_spec spec = {.version = LOOM_KEY_SPEC_VERSION,
                          .user = user,
                          .workspace = "acme",
                          .service = service};
    loom_key_info info;

    if (loom_store_key_create(h->store, &spec, key, &info) != 0)
        fail_msg("key: %s", loom_error_last());
    memcpy(id, info.id, LOOM_KEY_ID_SIZE);
    loom_key_info_clear(&info);
}

/* GET path as key (and header extra), which must answer 200. */
static json_t *get(sh *h, const char *key, const char *extra, const char *path)
{
    return sh_json_auth(h, key, extra, "GET", path, NULL, 200);
}

/* GET path as key must answer status with an error of code and param
 * (NULL: not checked). */
static void get_error(sh *h, const char *key, const char *path, long status,
                      const char *code, const char *param)
{
    sh_resp r;
    json_t *j;

    if (sh_req_auth(h, key, NULL, "GET", path, NULL, &r) != status)
        fail_msg("GET %s: status %ld, want %ld: %s", path, r.status, status,
                 r.body ? r.body : "");
    sh_check_error(r.body, code);
    if (param) {
        j = json_loads(r.body, 0, NULL);
        assert_string_equal(sh_str(json_object_get(j, "error"), "param"),
                            param);
        json_decref(j);
    }
    sh_resp_free(&r);
}

static json_int_t total(const json_t *out, const char *k)
{
    return json_integer_value(
        json_object_get(json_object_get(out, "total"), k));
}

static json_int_t gint(const json_t *g, const char *k)
{
    return json_integer_value(json_object_get(g, k));
}

/* Each sum of out's total equals SQL's over the rows `where` selects. */
static void check_sums(const sh *h, const json_t *out, const char *where)
{
    static const char *const cols[][2] = {
        {"calls", "count(*)"},
        {"unpriced_calls", "coalesce(sum(cost_micros IS NULL), 0)"},
        {"prompt_tokens", "coalesce(sum(prompt_tokens), 0)"},
        {"completion_tokens", "coalesce(sum(completion_tokens), 0)"},
        {"total_tokens", "coalesce(sum(total_tokens), 0)"},
        {"cost_micros", "coalesce(sum(cost_micros), 0)"}};
    char q[512];

    for (size_t i = 0; i < sizeof(cols) / sizeof(cols[0]); i++) {
        snprintf(q, sizeof(q), "SELECT %s FROM usage WHERE %s", cols[i][1],
                 where);
        if (total(out, cols[i][0]) != test_db_int(h->db, q))
            fail_msg("%s: %lld, SQL says %lld (%s)", cols[i][0],
                     (long long)total(out, cols[i][0]), test_db_int(h->db, q),
                     where);
    }
}

/* The script of the scenario below, call by call. */
static const char scenario[] =
    "{\"responses\":[" CALL_KID(10, 1) "," TEXT("Three.", 20, 2) "," TEXT(
        "It is three.", 30,
        3) "," TEXT("Bob.", 40,
                    4) "," TEXT("For u1.", 50,
                                5) "," TEXT("For u2.", 60,
                                            6) "," TEXT("u1 again.", 70,
                                                        7) "," TEXT("Unpriced.",
                                                                    80, 8) "]}";

typedef struct {
    sh h;
    char alice[LOOM_KEY_SIZE], bob[LOOM_KEY_SIZE], svc[LOOM_KEY_SIZE];
    char alice_id[LOOM_KEY_ID_SIZE], bob_id[LOOM_KEY_ID_SIZE],
        svc_id[LOOM_KEY_ID_SIZE];
} world;

/* Alice runs boss (which runs kid) and a chat on the unpriced model; bob
 * one chat; the service one run for u1, one for u2 and one more for u1
 * named by X-Loom-User. */
static void make_world(world *w)
{
    sh *h = &w->h;

    start(h, scenario, "keys");
    key_for(h, "alice", 0, w->alice, w->alice_id);
    key_for(h, "bob", 0, w->bob, w->bob_id);
    key_for(h, "svc", 1, w->svc, w->svc_id);
    json_decref(sh_json_auth(h, w->alice, NULL, "POST", "/v1/runs",
                             "{\"input\":\"Count.\",\"agent\":\"boss\"}", 200));
    json_decref(sh_json_auth(h, w->bob, NULL, "POST", "/v1/runs",
                             "{\"input\":\"Mine.\",\"user\":\"alice\"}", 200));
    json_decref(sh_json_auth(h, w->svc, NULL, "POST", "/v1/runs",
                             "{\"input\":\"One.\",\"user\":\"u1\"}", 200));
    json_decref(sh_json_auth(h, w->svc, NULL, "POST", "/v1/runs",
                             "{\"input\":\"Two.\",\"user\":\"u2\"}", 200));
    json_decref(sh_json_auth(h, w->svc, "X-Loom-User: u1", "POST", "/v1/runs",
                             "{\"input\":\"Again.\"}", 200));
    json_decref(sh_json_auth(
        h, w->alice, NULL, "POST", "/v1/chat/completions",
        "{\"model\":\"fake/other\",\"messages\":[{\"role\":\"user\","
        "\"content\":\"Cheap?\"}]}",
        200));
    assert_int_equal(test_db_int(h->db, "SELECT count(*) FROM usage"), 8);
}

/* A user key sees its user's calls, its sub-agent's included, by every
 * grouping; another user's never. */
static void test_user_keys(void **state)
{
    world w;
    char q[256];
    json_t *out;
    const json_t *g;

    (void)state;
    make_world(&w);
    /* The kid's call is in alice's rows, under her key. */
    snprintf(q, sizeof(q),
             "SELECT count(*) FROM usage WHERE agent = 'kid' AND user_id = "
             "'acme/alice' AND key_id = '%s' AND workspace = 'acme' AND "
             "user_name = 'alice'",
             w.alice_id);
    assert_int_equal(test_db_int(w.h.db, q), 1);

    out = get(&w.h, w.alice, NULL, "/v1/usage");
    assert_string_equal(sh_str(out, "object"), "usage");
    assert_true(json_is_null(json_object_get(out, "from")));
    assert_int_equal(total(out, "calls"), 4);
    assert_int_equal(total(out, "prompt_tokens"), 10 + 20 + 30 + 80);
    /* Priced calls only: (10 + 2) + (20 + 4) + (30 + 6) micro-dollars. */
    assert_int_equal(total(out, "cost_micros"), 72);
    assert_int_equal(total(out, "unpriced_calls"), 1);
    check_sums(&w.h, out, "user_id = 'acme/alice'");
    json_decref(out);

    /* `user` is a label for a user key: still alice's. */
    out = get(&w.h, w.alice, NULL, "/v1/usage?user=bob");
    assert_int_equal(total(out, "calls"), 4);
    json_decref(out);

    out = get(&w.h, w.alice, NULL, "/v1/usage?group_by=agent");
    assert_int_equal(gint(test_usage_group(out, "agent", "boss"), "calls"), 2);
    assert_int_equal(gint(test_usage_group(out, "agent", "kid"), "calls"), 1);
    assert_int_equal(gint(test_usage_group(out, "agent", NULL), "calls"), 1);
    assert_int_equal(json_array_size(json_object_get(out, "data")), 3);
    json_decref(out);

    out = get(&w.h, w.alice, NULL, "/v1/usage?group_by=key,model");
    assert_int_equal(json_array_size(json_object_get(out, "group_by")), 2);
    g = test_usage_group(out, "model", "fake/other");
    assert_string_equal(sh_str(g, "key_id"), w.alice_id);
    assert_int_equal(gint(g, "unpriced_calls"), 1);
    assert_int_equal(gint(g, "cost_micros"), 0);
    assert_int_equal(gint(test_usage_group(out, "model", "fake/m"), "calls"),
                     3);
    assert_int_equal(
        gint(test_usage_group(out, "model", "fake/m"), "cost_micros"), 72);
    json_decref(out);

    out = get(&w.h, w.alice, NULL, "/v1/usage?group_by=user");
    assert_int_equal(json_array_size(json_object_get(out, "data")), 1);
    g = test_usage_group(out, "user_id", "acme/alice");
    assert_string_equal(sh_str(g, "workspace"), "acme");
    assert_string_equal(sh_str(g, "user"), "alice");
    assert_true(json_is_null(json_object_get(g, "end_user")));
    json_decref(out);

    /* Bob: his one call, though his request named alice. */
    out = get(&w.h, w.bob, NULL, "/v1/usage?group_by=user");
    assert_int_equal(total(out, "calls"), 1);
    assert_int_equal(total(out, "prompt_tokens"), 40);
    assert_non_null(test_usage_group(out, "user_id", "acme/bob"));
    check_sums(&w.h, out, "user_id = 'acme/bob'");
    json_decref(out);
    sh_free(&w.h);
}

/* A service key sees its end users, all or one. */
static void test_service_key(void **state)
{
    world w;
    json_t *out;

    (void)state;
    make_world(&w);
    out = get(&w.h, w.svc, NULL, "/v1/usage?group_by=user");
    assert_int_equal(total(out, "calls"), 3);
    assert_int_equal(json_array_size(json_object_get(out, "data")), 2);
    assert_int_equal(gint(test_usage_group(out, "end_user", "u1"), "calls"), 2);
    assert_int_equal(gint(test_usage_group(out, "end_user", "u2"), "calls"), 1);
    assert_string_equal(
        sh_str(test_usage_group(out, "end_user", "u2"), "user_id"),
        "acme/svc/u2");
    check_sums(&w.h, out, "workspace = 'acme' AND user_name = 'svc'");
    json_decref(out);

    out = get(&w.h, w.svc, NULL, "/v1/usage?user=u1");
    assert_int_equal(total(out, "calls"), 2);
    assert_int_equal(total(out, "prompt_tokens"), 50 + 70);
    json_decref(out);
    out = get(&w.h, w.svc, "X-Loom-User: u2", "/v1/usage");
    assert_int_equal(total(out, "calls"), 1);
    assert_int_equal(total(out, "prompt_tokens"), 60);
    json_decref(out);
    out = get(&w.h, w.svc, NULL, "/v1/usage?user=nobody");
    assert_int_equal(total(out, "calls"), 0);
    json_decref(out);
    get_error(&w.h, w.svc, "/v1/usage?user=a%2Fb", 400, "invalid_value",
              "user");
    /* The admin's filters are not a key's. */
    get_error(&w.h, w.svc, "/v1/usage?key=x", 400, "invalid_value", "key");
    get_error(&w.h, w.alice, "/v1/usage?workspace=acme", 400, "invalid_value",
              "workspace");
    sh_free(&w.h);
}

/* The admin sees anyone's; each key stays on its side. */
static void test_admin(void **state)
{
    world w;
    char path[128];
    json_t *out;

    (void)state;
    make_world(&w);
    out = get(&w.h, ADMIN, NULL, "/v1/admin/usage");
    assert_int_equal(total(out, "calls"), 8);
    check_sums(&w.h, out, "1");
    json_decref(out);
    out = get(&w.h, ADMIN, NULL, "/v1/admin/usage?user=alice&workspace=acme");
    check_sums(&w.h, out, "user_id = 'acme/alice'");
    assert_int_equal(total(out, "calls"), 4);
    json_decref(out);
    out = get(&w.h, ADMIN, NULL, "/v1/admin/usage?workspace=elsewhere");
    assert_int_equal(total(out, "calls"), 0);
    json_decref(out);
    snprintf(path, sizeof(path), "/v1/admin/usage?key=%s&group_by=user",
             w.svc_id);
    out = get(&w.h, ADMIN, NULL, path);
    assert_int_equal(total(out, "calls"), 3);
    assert_int_equal(json_array_size(json_object_get(out, "data")), 2);
    json_decref(out);
    out = get(&w.h, ADMIN, NULL,
              "/v1/admin/usage?group_by=workspace,user,key,model,agent");
    assert_int_equal(json_array_size(json_object_get(out, "data")), 6);
    check_sums(&w.h, out, "1");
    json_decref(out);
    /* The admin key runs nothing, not even /v1/usage; a key administers
     * nothing, not even usage. */
    get_error(&w.h, ADMIN, "/v1/usage", 401, "invalid_api_key", NULL);
    get_error(&w.h, w.alice, "/v1/admin/usage", 401, "invalid_api_key", NULL);
    get_error(&w.h, NULL, "/v1/usage", 401, "invalid_api_key", NULL);
    sh_free(&w.h);
}

/* [from, to) in seconds or dates, and what is refused. */
static void test_range(void **state)
{
    world w;
    char path[128];
    long long now = (long long)time(NULL);
    json_t *out;

    (void)state;
    make_world(&w);
    /* The rows' times: alice's first three, then the rest a day later. */
    test_db_exec(w.h.db, "UPDATE usage SET created_at = 1767225600000 "
                         "WHERE id <= 3");
    test_db_exec(w.h.db, "UPDATE usage SET created_at = 1767312000000 "
                         "WHERE id > 3");
    out =
        get(&w.h, ADMIN, NULL, "/v1/admin/usage?from=2026-01-01&to=2026-01-02");
    assert_int_equal(total(out, "calls"), 3);
    assert_int_equal(json_integer_value(json_object_get(out, "from")),
                     1767225600);
    assert_int_equal(json_integer_value(json_object_get(out, "to")),
                     1767312000);
    json_decref(out);
    out = get(&w.h, ADMIN, NULL, "/v1/admin/usage?from=1767312000");
    assert_int_equal(total(out, "calls"), 5);
    json_decref(out);
    out = get(
        &w.h, ADMIN, NULL,
        "/v1/admin/usage?from=2026-01-01T00:00:01Z&to=2026-01-02T00:00:01Z");
    assert_int_equal(total(out, "calls"), 5);
    json_decref(out);
    out = get(&w.h, w.alice, NULL, "/v1/usage?to=1767225600");
    assert_int_equal(total(out, "calls"), 0);
    json_decref(out);
    out = get(&w.h, ADMIN, NULL, "/v1/admin/usage?from=0&to=0");
    assert_int_equal(total(out, "calls"), 0);
    json_decref(out);
    snprintf(path, sizeof(path), "/v1/admin/usage?from=%lld", now + 86400);
    out = get(&w.h, ADMIN, NULL, path);
    assert_int_equal(total(out, "calls"), 0);
    json_decref(out);

    get_error(&w.h, ADMIN, "/v1/admin/usage?from=yesterday", 400,
              "invalid_value", "from");
    get_error(&w.h, w.alice, "/v1/usage?to=2026-02-30", 400, "invalid_value",
              "to");
    get_error(&w.h, w.alice, "/v1/usage?from=-5", 400, "invalid_value", "from");
    get_error(&w.h, w.alice, "/v1/usage?from=253402300800", 400,
              "invalid_value", "from");
    get_error(&w.h, w.alice, "/v1/usage?from=2026-01-01T00:00:00", 400,
              "invalid_value", "from");
    get_error(&w.h, w.alice, "/v1/usage?from=1767312000&to=1767225600", 400,
              "invalid_value", "to");
    get_error(&w.h, w.alice, "/v1/usage?group_by=model,model", 400,
              "invalid_value", "group_by");
    get_error(&w.h, w.alice, "/v1/usage?group_by=colour", 400, "invalid_value",
              "group_by");
    get_error(&w.h, w.alice, "/v1/usage?group_by=model,", 400, "invalid_value",
              "group_by");
    sh_free(&w.h);
}

/* The row and group limits, at them and one past them. */
static void test_limits(void **state)
{
    sh h;
    json_t *out;

    (void)state;
    start(&h, "{\"responses\":[]}", "keys");
    /* LOOM_STORE_USAGE_ROWS_MAX rows in LOOM_STORE_USAGE_GROUPS_MAX
     * models, written behind the server's back. */
    test_db_exec(h.db,
                 "INSERT INTO conversations (id, created_at, updated_at) "
                 "VALUES ('conv_bulk', 1, 1);"
                 "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 "
                 "FROM n WHERE i < 200000) "
                 "INSERT INTO usage (conversation_id, model, iteration, "
                 "prompt_tokens, completion_tokens, cached_tokens, "
                 "reasoning_tokens, total_tokens, cost_micros, created_at) "
                 "SELECT 'conv_bulk', 'm' || (i % 10000), 1, 2, 1, 0, 0, 3, "
                 "5, 1000 FROM n;");
    out = get(&h, ADMIN, NULL, "/v1/admin/usage?group_by=model");
    assert_int_equal(json_array_size(json_object_get(out, "data")), 10000);
    assert_int_equal(total(out, "calls"), 200000);
    assert_int_equal(total(out, "cost_micros"), 1000000);
    json_decref(out);
    /* One more call, in a model of its own, a day later. */
    test_db_exec(h.db,
                 "INSERT INTO usage (conversation_id, model, iteration, "
                 "prompt_tokens, completion_tokens, cached_tokens, "
                 "reasoning_tokens, total_tokens, cost_micros, created_at) "
                 "VALUES ('conv_bulk', 'extra', 1, 2, 1, 0, 0, 3, 5, "
                 "86401000);");
    get_error(&h, ADMIN, "/v1/admin/usage?group_by=model", 400,
              "usage_too_large", NULL);
    get_error(&h, ADMIN, "/v1/admin/usage", 400, "usage_too_large", NULL);
    out = get(&h, ADMIN, NULL, "/v1/admin/usage?from=86400");
    assert_int_equal(total(out, "calls"), 1);
    json_decref(out);
    out = get(&h, ADMIN, NULL, "/v1/admin/usage?to=86400&group_by=model");
    assert_int_equal(total(out, "calls"), 200000);
    json_decref(out);
    sh_free(&h);
}

/* Mode none: everyone's usage, narrowed by ?user=. */
static void test_mode_none(void **state)
{
    sh h;
    json_t *out;
    const json_t *g;

    (void)state;
    start(&h,
          "{\"responses\":[" TEXT("Hi carol.", 5, 1) "," TEXT("Hi.", 7, 1) "]}",
          "none");
    json_decref(sh_json(&h, "POST", "/v1/runs",
                        "{\"input\":\"Hi.\",\"user\":\"carol\"}", 200));
    json_decref(sh_json(&h, "POST", "/v1/runs", "{\"input\":\"Hi.\"}", 200));
    out = sh_json(&h, "GET", "/v1/usage?group_by=user", NULL, 200);
    assert_int_equal(total(out, "calls"), 2);
    g = test_usage_group(out, "user_id", "carol");
    assert_string_equal(sh_str(g, "user"), "carol");
    assert_true(json_is_null(json_object_get(g, "workspace")));
    assert_int_equal(
        gint(test_usage_group(out, "user_id", NULL), "prompt_tokens"), 7);
    json_decref(out);
    out = sh_json(&h, "GET", "/v1/usage?user=carol", NULL, 200);
    assert_int_equal(total(out, "calls"), 1);
    assert_int_equal(total(out, "prompt_tokens"), 5);
    json_decref(out);
    sh_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_user_keys), cmocka_unit_test(test_service_key),
        cmocka_unit_test(test_admin),     cmocka_unit_test(test_range),
        cmocka_unit_test(test_limits),    cmocka_unit_test(test_mode_none),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
