/*
 * Test helpers shared by the integration tests of accounts
 * (test_server_accounts.c, test_server_jwt.c): requests with a bearer
 * credential, answers checked for status and error code, the fake's tool
 * results, a log file searched, and the checks that a caller sees its
 * own conversations and runs and nobody else's.
 */
#ifndef LOOM_TEST_SERVER_ACCOUNTS_UTIL_H
#define LOOM_TEST_SERVER_ACCOUNTS_UTIL_H

#include "loom/jwt.h"
#include "test_server_harness.h"

/* The memory tool calls the fake answers with (see test_server_memory). */
#define STORE_CALL                                                             \
    "{\"tool_calls\":[{\"id\":\"c1\",\"name\":\"memory_store\","               \
    "\"arguments\":\"{\\\"content\\\":\\\"The PIN is 4321.\\\"}\"}]}"
#define RETRIEVE_CALL                                                          \
    "{\"tool_calls\":[{\"id\":\"c2\",\"name\":\"memory_retrieve\","            \
    "\"arguments\":\"{\\\"query\\\":\\\"PIN\\\"}\"}]}"
#define TEXT(t) "{\"text\":[\"" t "\"]}"

/* A server over the fake with script, its own tools (so the memory tools
 * are there), models fake/m and fake/other, agents a (the default),
 * plain (no tools, no memory), boss (sub-agent kid) and kid, CORS for
 * https://app.example.com, web_search on Tavily at the fake, and auth
 * (the lines of the `auth:` section, indented). */
static inline void accounts_start(sh *h, const char *script, const char *auth)
{
    static int n;
    char name[64], *yaml = NULL;

    memset(h, 0, sizeof(*h));
    h->fake = fake_start_script(script);
    assert_non_null(h->fake);
    snprintf(name, sizeof(name), "accounts-%d.db", n++);
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
                         "  fake/other: {upstream: fake-model}\n"
                         "agents:\n"
                         "  a: {model: fake/m}\n"
                         "  plain: {model: fake/m, tools: [], memory: false}\n"
                         "  boss: {model: fake/m, tools: [], "
                         "sub_agents: [kid]}\n"
                         "  kid: {model: fake/m, tools: []}\n"
                         "default_agent: a\n"
                         "server:\n"
                         "  listen: 127.0.0.1:0\n"
                         "  cors_origins: [https://app.example.com]\n"
                         "tools:\n"
                         "  web_search: {backend: tavily, base_url: %s}\n"
                         "auth:\n"
                         "%s",
                         fake_base_url(h->fake), fake_base_url(h->fake),
                         auth) > 0);
    sh_start_config_tools(h, yaml, 1);
    free(yaml);
}

/* One request with "Authorization: Bearer key" (NULL: none) and an
 * extra header (may be NULL); returns the status, *r filled. */
static inline long call(sh *h, const char *key, const char *extra,
                        const char *method, const char *path, const char *body,
                        sh_resp *r)
{
    return sh_req_auth(h, key, extra, method, path, body, r);
}

/* call() that must answer want; the body as JSON (a new reference). */
static inline json_t *call_json(sh *h, const char *key, const char *extra,
                                const char *method, const char *path,
                                const char *body, long want)
{
    sh_resp r;
    json_t *j;

    if (call(h, key, extra, method, path, body, &r) != want)
        fail_msg("%s %s: status %ld, want %ld: %s", method, path, r.status,
                 want, r.body ? r.body : "");
    j = json_loads(r.body ? r.body : "null", JSON_DECODE_ANY, NULL);
    sh_resp_free(&r);
    assert_non_null(j);
    return j;
}

/* call() that must answer want with an error of code. */
static inline void call_error(sh *h, const char *key, const char *extra,
                              const char *method, const char *path,
                              const char *body, long want, const char *code)
{
    sh_resp r;

    if (call(h, key, extra, method, path, body, &r) != want)
        fail_msg("%s %s: status %ld, want %ld: %s", method, path, r.status,
                 want, r.body ? r.body : "");
    sh_check_error(r.body, code);
    sh_resp_free(&r);
}

/* The text of the first tool message the fake got in request i. */
static inline char *tool_result(const sh *h, size_t i)
{
    json_t *reqs = fake_requests(h->fake), *m;
    json_t *msgs = json_object_get(
        json_object_get(json_array_get(reqs, i), "body"), "messages");
    char *out = NULL;
    size_t k;

    json_array_foreach(msgs, k, m)
    {
        if (!out && !strcmp(sh_str(m, "role"), "tool"))
            out = strdup(sh_str(m, "content"));
    }
    json_decref(reqs);
    if (!out)
        fail_msg("request %zu has no tool message", i);
    return out;
}

/* 1 when the file f holds s. */
static inline int file_holds(FILE *f, const char *s)
{
    long n;
    char *buf;
    int found;

    fflush(f);
    n = ftell(f);
    buf = calloc(1, (size_t)n + 1);
    rewind(f);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fseek(f, 0, SEEK_END);
    found = strstr(buf, s) != NULL;
    free(buf);
    return found;
}

#define CHAT(user, text)                                                       \
    "{\"model\":\"agent/a\",\"user\":\"" user "\",\"messages\":[{\"role\":"    \
    "\"user\",\"content\":\"" text "\"}]}"

/* Every route about a conversation or a run answers 404 to anyone but
 * its owner: another user key, and a service key's other end user. */
static inline void check_hidden(sh *h, const char *key, const char *extra,
                                const char *run, const char *conv)
{
    char path[256], body[512];
    json_t *j;

    snprintf(path, sizeof(path), "/v1/conversations/%s", conv);
    call_error(h, key, extra, "GET", path, NULL, 404, "not_found");
    call_error(h, key, extra, "DELETE", path, NULL, 404, "not_found");
    call_error(h, key, extra, "PATCH", path, "{\"title\":\"mine\"}", 404,
               "not_found");
    snprintf(path, sizeof(path), "/v1/conversations?after=%s", conv);
    call_error(h, key, extra, "GET", path, NULL, 404, "not_found");
    /* Neither the list nor a search by its title shows it. */
    for (int q = 0; q < 2; q++) {
        size_t i;
        json_t *c;
        j = call_json(h, key, extra, "GET",
                      q ? "/v1/conversations?q=Hi" : "/v1/conversations", NULL,
                      200);
        json_array_foreach(json_object_get(j, "data"), i, c)
            assert_string_not_equal(sh_str(c, "id"), conv);
        json_decref(j);
    }
    snprintf(path, sizeof(path), "/v1/runs/%s", run);
    call_error(h, key, extra, "GET", path, NULL, 404, "not_found");
    snprintf(path, sizeof(path), "/v1/runs/%s/events", run);
    call_error(h, key, extra, "GET", path, NULL, 404, "not_found");
    snprintf(path, sizeof(path), "/v1/runs/%s/cancel", run);
    call_error(h, key, extra, "POST", path, NULL, 404, "not_found");
    snprintf(path, sizeof(path), "/v1/runs/%s/input", run);
    call_error(h, key, extra, "POST", path,
               "{\"call_id\":\"c\",\"approve\":true}", 404, "not_found");
    snprintf(body, sizeof(body),
             "{\"input\":\"more\",\"conversation_id\":\"%s\"}", conv);
    call_error(h, key, extra, "POST", "/v1/runs", body, 404, "not_found");
    snprintf(body, sizeof(body),
             "{\"model\":\"agent/a\",\"conversation_id\":\"%s\","
             "\"messages\":[{\"role\":\"user\",\"content\":\"more\"}]}",
             conv);
    call_error(h, key, extra, "POST", "/v1/chat/completions", body, 404,
               "conversation_not_found");
}

/* The owner sees it all. */
static inline void check_seen(sh *h, const char *key, const char *extra,
                              const char *run, const char *conv)
{
    char path[256];
    json_t *j;

    snprintf(path, sizeof(path), "/v1/conversations/%s", conv);
    json_decref(call_json(h, key, extra, "GET", path, NULL, 200));
    j = call_json(h, key, extra, "GET", "/v1/conversations", NULL, 200);
    assert_int_equal(json_array_size(json_object_get(j, "data")), 1);
    json_decref(j);
    j = call_json(h, key, extra, "GET", "/v1/conversations?q=hi", NULL, 200);
    assert_int_equal(json_array_size(json_object_get(j, "data")), 1);
    json_decref(j);
    snprintf(path, sizeof(path), "/v1/runs/%s", run);
    json_decref(call_json(h, key, extra, "GET", path, NULL, 200));
}

#endif
