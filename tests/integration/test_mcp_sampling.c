/*
 * Sampling through a turn (docs/mcp.md "Sampling"): the fake MCP
 * server's sample tool asks the client for a completion during a call
 * the model makes through loom-fake-upstream. With `sampling: allow` the
 * run's model answers it (a rule of the fake's script, picked by the
 * sampling request's system prompt), within sampling_max_tokens, and the
 * call's usage joins the run's: a usage event of purpose mcp_sampling
 * and a stored usage row, the rows adding up to the run's total. Without
 * it the capability is not declared and a request sent all the same
 * gets an error; outside a run (a call made straight to the server, as
 * `loom mcp call` does) it is refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fake.h"
#include "loom/mcp.h"
#include "loom/session.h"
#include "store_fixture.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The top turn's two calls (plain responses) and the sampling call (the
 * rule): 110 + 125 tokens, and 14. */
static const char script_fmt[] =
    "{\"rules\": [{\"match\": {\"system\": \"You are sampled.\"},"
    "  \"loop\": true,"
    "  \"responses\": [{\"text\": [\"a sampled line\"],"
    "   \"usage\": {\"prompt_tokens\": 11, \"completion_tokens\": 3,"
    "    \"total_tokens\": 14}}]}],"
    " \"responses\": ["
    " {\"tool_calls\": [{\"id\": \"c1\", \"name\": \"fake__sample\","
    "   \"arguments\": \"%s\"}],"
    "  \"usage\": {\"prompt_tokens\": 100, \"completion_tokens\": 10,"
    "   \"total_tokens\": 110}},"
    " {\"text\": [\"done\"],"
    "  \"usage\": {\"prompt_tokens\": 120, \"completion_tokens\": 5,"
    "   \"total_tokens\": 125}}]}";

typedef struct {
    loom_fake *fake;
    loom_config *cfg;
    loom_tool_registry *tools;
    loom_store *st;
    char *path;
    loom_session *s;
    loom_turn *t;
} fx;

/* A session whose MCP server "fake" runs in sample mode with extra
 * (its further keys, e.g. ", sampling: allow"); the model's call gives
 * the sample tool args (JSON, escaped for the script). */
static void fx_open(fx *f, const char *extra, const char *args)
{
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    char *yaml = NULL, *script = NULL;

    memset(f, 0, sizeof(*f));
    assert_true(asprintf(&script, script_fmt, args) > 0);
    f->fake = fake_start_script(script);
    free(script);
    assert_non_null(f->fake);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake: {kind: openai, base_url: %s, api_key: k,"
                         " retries: {max: 0}}\n"
                         "routing: {retries: 0}\n"
                         "models:\n"
                         "  fake/m: {prices: {input: 1, output: 2}}\n"
                         "mcp_servers:\n"
                         "  fake: {command: %s, args: [sample]%s}\n"
                         "agents:\n"
                         "  main: {model: fake/m, tools: [fake__sample]}\n",
                         fake_base_url(f->fake), LOOM_FAKE_MCP_BIN, extra) > 0);
    if (loom_config_load_string(&f->cfg, yaml, "t.yaml") != 0)
        print_error("config: %s\n", loom_error_last());
    assert_non_null(f->cfg);
    free(yaml);
    assert_int_equal(loom_tools_new_from_config(&f->tools, f->cfg), 0);
    f->path = test_db_path("mcp_sampling");
    f->st = test_store_open_ok(f->path);
    so.config = f->cfg;
    so.tools = f->tools;
    so.store = f->st;
    if (loom_session_new(&f->s, &so) != 0)
        print_error("session: %s\n", loom_error_last());
    assert_non_null(f->s);
}

static void fx_close(fx *f)
{
    loom_turn_free(f->t);
    loom_session_free(f->s);
    loom_tool_registry_free(f->tools);
    loom_store_free(f->st);
    test_db_remove(f->path);
    free(f->path);
    loom_config_free(f->cfg);
    fake_stop(f->fake);
}

static const char *sget(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

static long long iget(const json_t *o, const char *key)
{
    return (long long)json_integer_value(json_object_get(o, key));
}

/* Runs main to its end; *out (caller frees) the output of its tool
 * call, *sampled (a new reference, or NULL) its usage event of purpose
 * mcp_sampling. */
static void run_turn(fx *f, char **out, json_t **sampled)
{
    loom_turn_options o = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    const loom_turn_event *e;
    uint64_t seq = 0;

    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "hi"), 0);
    o.agent = "main";
    o.input = &in;
    o.log = 1;
    if (loom_turn_start(&f->t, f->s, &o) != 0)
        print_error("turn: %s\n", loom_error_last());
    assert_non_null(f->t);
    loom_messages_free(&in);
    while (!loom_turn_ended(f->t))
        assert_int_equal(loom_turn_wait(f->t, UINT64_MAX - 1, 20000), 1);
    *out = NULL;
    *sampled = NULL;
    while ((e = loom_turn_next_event(f->t, seq)) != NULL) {
        json_t *j = loom_turn_event_json(e);
        assert_non_null(j);
        seq = e->seq;
        if (e->type == LOOM_EV_TOOL_COMPLETED)
            *out = strdup(sget(j, "output"));
        if (e->type == LOOM_EV_USAGE &&
            strcmp(sget(j, "purpose"), "mcp_sampling") == 0) {
            assert_null(*sampled);
            *sampled = json_incref(j);
        }
        json_decref(j);
    }
    assert_int_equal(loom_turn_status(f->t), LOOM_RUN_COMPLETED);
    assert_non_null(*out);
}

/* The request the fake got for the sampling call (a new reference). */
static json_t *sampling_request(fx *f)
{
    json_t *all = fake_requests(f->fake), *r, *found = NULL;
    size_t i;

    json_array_foreach(all, i, r)
    {
        char *text = json_dumps(json_object_get(r, "body"), JSON_COMPACT);
        if (text && strstr(text, "You are sampled.")) {
            assert_null(found);
            found = json_incref(json_object_get(r, "body"));
        }
        free(text);
    }
    json_decref(all);
    assert_non_null(found);
    return found;
}

/* The output limit a request body carries, whichever field holds it. */
static long long max_tokens_of(const json_t *body)
{
    const json_t *v = json_object_get(body, "max_tokens");

    return v ? (long long)json_integer_value(v)
             : iget(body, "max_completion_tokens");
}

/*
 * Allowed: the run's model answers the server, which gets its text, the
 * model and why it stopped; the request carries the server's messages,
 * system prompt, stop sequence and maxTokens; the call's usage is an
 * mcp_sampling usage event naming the tool, in the run's total and in
 * the stored rows, which add up to it.
 */
static void test_allowed(void **state)
{
    fx f;
    json_t *ev, *body, *conv = NULL, *rows, *row;
    char *out;
    const loom_usage *u;
    long long sum_tokens = 0, sum_micros = 0;
    size_t i;

    (void)state;
    fx_open(&f, ", sampling: allow",
            "{\\\"x\\\":\\\"Write a haiku\\\",\\\"max_tokens\\\":50}");
    run_turn(&f, &out, &ev);
    assert_string_equal(out, "{\"content\":{\"text\":\"a sampled line\","
                             "\"type\":\"text\"},\"model\":\"fake/m\","
                             "\"role\":\"assistant\",\"stopReason\":"
                             "\"endTurn\"}");
    free(out);
    body = sampling_request(&f);
    assert_int_equal(max_tokens_of(body), 50);
    assert_string_equal(
        json_string_value(json_array_get(json_object_get(body, "stop"), 0)),
        "END");
    assert_null(json_object_get(body, "tools"));
    {
        char *msgs = json_dumps(json_object_get(body, "messages"), 0);
        assert_non_null(strstr(msgs, "Write a haiku"));
        free(msgs);
    }
    json_decref(body);
    assert_non_null(ev);
    assert_string_equal(sget(ev, "tool"), "fake__sample");
    assert_string_equal(sget(ev, "model"), "fake/m");
    assert_int_equal(iget(ev, "total_tokens"), 14);
    assert_int_equal(iget(ev, "cost_micros"), 11 * 1 + 3 * 2);
    json_decref(ev);
    u = loom_run_usage(loom_turn_run(f.t));
    assert_int_equal(u->total_tokens, 110 + 14 + 125);
    assert_int_equal(loom_store_conversation_get(
                         f.st, loom_turn_conversation_id(f.t), &conv),
                     0);
    rows = json_object_get(conv, "usage");
    assert_int_equal(json_array_size(rows), 3);
    json_array_foreach(rows, i, row)
    {
        sum_tokens += iget(row, "total_tokens");
        sum_micros += iget(row, "cost_micros");
    }
    assert_int_equal(sum_tokens, u->total_tokens);
    assert_int_equal(sum_micros, u->cost_micros);
    assert_int_equal(sum_micros, 100 + 20 + 11 + 6 + 120 + 10);
    json_decref(conv);
    fx_close(&f);
}

/* sampling_max_tokens caps what the server asks for. */
static void test_max_tokens_cap(void **state)
{
    fx f;
    json_t *ev, *body;
    char *out;

    (void)state;
    fx_open(&f, ", sampling: allow, sampling_max_tokens: 20",
            "{\\\"max_tokens\\\":50}");
    run_turn(&f, &out, &ev);
    assert_non_null(strstr(out, "a sampled line"));
    free(out);
    json_decref(ev);
    body = sampling_request(&f);
    assert_int_equal(max_tokens_of(body), 20);
    json_decref(body);
    fx_close(&f);
}

/*
 * Not allowed (the default): the capability is not declared, and a
 * server that asks all the same gets an error, which its tool reports;
 * the model is not called for it.
 */
static void test_denied(void **state)
{
    fx f;
    json_t *ev;
    char *out;

    (void)state;
    fx_open(&f, "", "{}");
    run_turn(&f, &out, &ev);
    assert_string_equal(out, "no sampling capability");
    free(out);
    assert_null(ev);
    fx_close(&f);

    fx_open(&f, ", sampling: deny", "{\\\"force\\\":true}");
    run_turn(&f, &out, &ev);
    assert_string_equal(out, "{\"code\":-32601,\"message\":\"sampling is not "
                             "allowed for this server\"}");
    free(out);
    assert_null(ev);
    assert_int_equal(fake_requests_with(f.fake, "You are sampled."), 0);
    fx_close(&f);
}

/* Outside a run (a call made straight to the server, as `loom mcp call`
 * does) there is no model to sample with: the server is refused. */
static void test_outside_run(void **state)
{
    loom_config *cfg = NULL;
    loom_mcp_server *s = NULL;
    json_t *args = json_object(), *result = NULL;
    loom_buf text = LOOM_BUF_INIT(4096);
    char *yaml = NULL;

    (void)state;
    assert_true(asprintf(&yaml,
                         "mcp_servers:\n"
                         "  fake: {command: %s, args: [sample],"
                         " sampling: allow}\n",
                         LOOM_FAKE_MCP_BIN) > 0);
    assert_int_equal(loom_config_load_string(&cfg, yaml, "t.yaml"), 0);
    free(yaml);
    assert_int_equal(loom_mcp_server_new(&s, &cfg->mcp_servers[0]), 0);
    assert_int_equal(loom_mcp_server_call(s, "sample", args, 0, NULL, &result),
                     0);
    assert_int_equal(loom_mcp_result_text(result, &text), 0);
    assert_string_equal(loom_buf_cstr(&text),
                        "{\"code\":-1,\"message\":\"sampling is answered "
                        "only during a run\"}");
    loom_buf_free(&text);
    json_decref(result);
    json_decref(args);
    loom_mcp_server_free(s);
    loom_config_free(cfg);
}

/* The keys are checked when the config loads. */
static void test_config_keys(void **state)
{
    static const char *const bad[] = {"sampling: maybe",
                                      "sampling_max_tokens: 0"};
    loom_config *cfg = NULL;
    char *yaml = NULL;

    (void)state;
    for (size_t i = 0; i < 2; i++) {
        assert_true(asprintf(&yaml,
                             "mcp_servers:\n"
                             "  fake: {command: x, %s}\n",
                             bad[i]) > 0);
        assert_int_equal(loom_config_load_string(&cfg, yaml, "t.yaml"),
                         LOOM_EINVALID);
        assert_null(cfg);
        free(yaml);
    }
    assert_int_equal(loom_config_load_string(
                         &cfg, "mcp_servers: {fake: {command: x}}\n", "t"),
                     0);
    assert_null(cfg->mcp_servers[0].sampling);
    assert_int_equal(cfg->mcp_servers[0].sampling_max_tokens, 4096);
    loom_config_free(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_allowed),
        cmocka_unit_test(test_max_tokens_cap),
        cmocka_unit_test(test_denied),
        cmocka_unit_test(test_outside_run),
        cmocka_unit_test(test_config_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
