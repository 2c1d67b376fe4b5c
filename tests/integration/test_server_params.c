/*
 * Chat Completions parameters through `loom serve`: each one reaches the
 * upstream as the fake records it (as is for an OpenAI-compatible
 * provider, translated for Anthropic), a provider kind that has no field
 * for one answers 400 unsupported_parameter naming parameter and provider
 * before any upstream request, loom refuses what it cannot give for any
 * provider (n above 1, logprobs), a bad type or value is a 400 naming the
 * parameter, and the output limit goes in the exact field each model
 * takes (max_completion_tokens for OpenAI's reasoning models).
 */
#include "test_server_harness.h"

#include "llm/anthropic.h" /* LOOM_ANTHROPIC_ANSWER_TOOL */
#include "loom/buf.h"

#define SCRIPT                                                                 \
    "{\"responses\":[{\"text\":[\"one\"]},{\"text\":[\"two\"]},"               \
    "{\"text\":[\"three\"]},{\"text\":[\"four\"]}]}"

/* A server with providers of every kind, all pointing at one fake that
 * answers with script. */
static void ps_start_script(sh *h, const char *script)
{
    static int n;
    loom_server_options so = LOOM_SERVER_OPTIONS_INIT;
    const char *url;
    char name[64], *yaml = NULL;

    memset(h, 0, sizeof(*h));
    h->fake = fake_start_script(script);
    assert_non_null(h->fake);
    url = fake_base_url(h->fake);
    snprintf(name, sizeof(name), "params-%d.db", n++);
    h->db = test_tmp_path(name);
    unlink(h->db);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake: {base_url: '%s', api_key: k, "
                         "retries: {max: 0}}\n"
                         "  claude: {kind: anthropic, base_url: '%s', "
                         "api_key: k, retries: {max: 0}}\n"
                         "  gem: {kind: gemini, base_url: '%s', api_key: k, "
                         "retries: {max: 0}}\n"
                         "  resp: {kind: openai-responses, base_url: '%s', "
                         "api_key: k, retries: {max: 0}}\n"
                         "models:\n"
                         "  fake/m: {upstream: fake-model}\n"
                         "  fake/o3: {upstream: o3-mini}\n"
                         "  fake/g5:\n"
                         "    upstream: gpt-5\n"
                         "    capabilities: {max_completion_tokens: false}\n"
                         "server:\n"
                         "  listen: 127.0.0.1:0\n",
                         url, url, url, url) > 0);
    if (loom_config_load_string(&h->cfg, yaml, "params.yaml") != 0)
        fail_msg("config: %s", loom_error_last());
    free(yaml);
    if (loom_store_open(&h->store, h->db) != 0)
        fail_msg("store: %s", loom_error_last());
    h->tools = sh_tools();
    so.config = h->cfg;
    so.store = h->store;
    so.tools = h->tools;
    if (loom_server_new(&h->srv, &so) != 0 || loom_server_start(h->srv) != 0)
        fail_msg("server: %s", loom_error_last());
    snprintf(h->base, sizeof(h->base), "http://127.0.0.1:%d",
             loom_server_port(h->srv));
}

static void ps_start(sh *h)
{
    ps_start_script(h, SCRIPT);
}

/* The body of the fake's i-th recorded request (a new reference). */
static json_t *sent_body(const sh *h, size_t i)
{
    json_t *reqs = fake_requests(h->fake);
    json_t *b = json_incref(json_object_get(json_array_get(reqs, i), "body"));

    json_decref(reqs);
    assert_non_null(b);
    return b;
}

static size_t nsent(const sh *h)
{
    json_t *reqs = fake_requests(h->fake);
    size_t n = json_array_size(reqs);

    json_decref(reqs);
    return n;
}

static void assert_jeq(const json_t *got, const char *want)
{
    json_t *w = json_loads(want, JSON_DECODE_ANY, NULL);
    char *g = got ? json_dumps(got, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;

    assert_non_null(w);
    if (!got || !json_equal((json_t *)got, w))
        fail_msg("got %s, want %s", g ? g : "(none)", want);
    free(g);
    json_decref(w);
}

/* A chat request that must fail: status, code and param checked; the
 * message must contain `says` (NULL: not checked). */
static void expect_refused(const sh *h, const char *body, long status,
                           const char *code, const char *param,
                           const char *says)
{
    json_t *j = sh_json(h, "POST", "/v1/chat/completions", body, status);
    json_t *e = json_object_get(j, "error");

    assert_string_equal(sh_str(e, "code"), code);
    assert_string_equal(sh_str(e, "param"), param);
    if (says && !strstr(sh_str(e, "message"), says))
        fail_msg("'%s' not in '%s'", says, sh_str(e, "message"));
    json_decref(j);
}

#define MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

static void test_openai_passes_every_parameter(void **state)
{
    sh h;
    json_t *resp, *b;

    (void)state;
    ps_start(&h);
    resp = sh_json(
        &h, "POST", "/v1/chat/completions",
        "{\"model\":\"fake/m\"," MSGS ",\"top_p\":0.5,\"seed\":7,"
        "\"presence_penalty\":0.5,\"frequency_penalty\":-1,"
        "\"stop\":\"END\",\"response_format\":{\"type\":\"json_schema\","
        "\"json_schema\":{\"name\":\"a\",\"schema\":{\"type\":\"object\"},"
        "\"strict\":true}},\"reasoning_effort\":\"high\","
        "\"verbosity\":\"low\",\"user\":\"u1\",\"logit_bias\":{\"9\":5},"
        "\"metadata\":{\"k\":\"v\"},\"service_tier\":\"flex\",\"n\":1,"
        "\"logprobs\":false,\"max_completion_tokens\":50}",
        200);
    json_decref(resp);
    b = sent_body(&h, 0);
    assert_jeq(json_object_get(b, "top_p"), "0.5");
    assert_jeq(json_object_get(b, "seed"), "7");
    assert_jeq(json_object_get(b, "presence_penalty"), "0.5");
    assert_jeq(json_object_get(b, "frequency_penalty"), "-1.0");
    assert_jeq(json_object_get(b, "stop"), "[\"END\"]");
    assert_jeq(json_object_get(b, "response_format"),
               "{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a\","
               "\"schema\":{\"type\":\"object\"},\"strict\":true}}");
    assert_jeq(json_object_get(b, "reasoning_effort"), "\"high\"");
    assert_jeq(json_object_get(b, "verbosity"), "\"low\"");
    assert_jeq(json_object_get(b, "user"), "\"u1\"");
    assert_jeq(json_object_get(b, "logit_bias"), "{\"9\":5}");
    assert_jeq(json_object_get(b, "metadata"), "{\"k\":\"v\"}");
    assert_jeq(json_object_get(b, "service_tier"), "\"flex\"");
    /* fake-model is no reasoning model: its limit is max_tokens. */
    assert_jeq(json_object_get(b, "max_tokens"), "50");
    assert_null(json_object_get(b, "max_completion_tokens"));
    assert_null(json_object_get(b, "n"));
    json_decref(b);
    sh_free(&h);
}

static void test_anthropic_translates(void **state)
{
    sh h;
    json_t *resp, *b;

    (void)state;
    ps_start(&h);
    resp = sh_json(&h, "POST", "/v1/chat/completions",
                   "{\"model\":\"claude/c\"," MSGS ",\"top_p\":0.9,"
                   "\"stop\":[\"A\",\"B\"],\"user\":\"u2\"}",
                   200);
    json_decref(resp);
    b = sent_body(&h, 0);
    assert_jeq(json_object_get(b, "top_p"), "0.9");
    assert_jeq(json_object_get(b, "stop_sequences"), "[\"A\",\"B\"]");
    assert_jeq(json_object_get(b, "metadata"), "{\"user_id\":\"u2\"}");
    assert_null(json_object_get(b, "stop"));
    json_decref(b);
    sh_free(&h);
}

/* The fake's Anthropic answers: the answer tool called with the JSON in
 * input_json_delta pieces. */
#define ANSWER_SCRIPT                                                          \
    "{\"responses\":[{\"tool_calls\":[{\"name\":\"" LOOM_ANTHROPIC_ANSWER_TOOL \
    "\",\"arguments\":[\"{\\\"city\\\":\",\"\\\"Paris\\\"}\"]}]},"             \
    "{\"tool_calls\":[{\"name\":\"" LOOM_ANTHROPIC_ANSWER_TOOL                 \
    "\",\"arguments\":[\"{\\\"city\\\":\",\"\\\"Ro\",\"me\\\"}\"]}]},"         \
    "{\"tool_calls\":[{\"name\":\"" LOOM_ANTHROPIC_ANSWER_TOOL                 \
    "\",\"arguments\":\"{\\\"n\\\":1}\"}]}]}"

#define CITY_FORMAT                                                            \
    "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{"          \
    "\"name\":\"city\",\"strict\":true,\"schema\":{\"type\":\"object\","       \
    "\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":["           \
    "\"city\"],\"additionalProperties\":false}}}"

/* The answer tool the fake was offered in request i, and the tool
 * choice; the other tools' names are checked against others. */
static void assert_answer_tool(const sh *h, size_t i, const char *schema,
                               const char *choice, const char *others)
{
    json_t *b = sent_body(h, i), *tools = json_object_get(b, "tools");
    json_t *names = json_array(), *t;
    size_t k;

    json_array_foreach(tools, k, t)
    {
        if (strcmp(sh_str(t, "name"), LOOM_ANTHROPIC_ANSWER_TOOL) == 0)
            assert_jeq(json_object_get(t, "input_schema"), schema);
        else
            json_array_append_new(names, json_string(sh_str(t, "name")));
    }
    assert_string_equal(
        sh_str(json_array_get(tools, json_array_size(tools) - 1), "name"),
        LOOM_ANTHROPIC_ANSWER_TOOL);
    assert_jeq(names, others);
    assert_jeq(json_object_get(b, "tool_choice"), choice);
    assert_null(json_object_get(b, "response_format"));
    json_decref(names);
    json_decref(b);
}

/* A non-streamed chat whose answer must be content, finish_reason stop
 * and no tool call. */
static void expect_json_answer(const sh *h, const char *body,
                               const char *content)
{
    json_t *resp = sh_json(h, "POST", "/v1/chat/completions", body, 200);
    json_t *choice = json_array_get(json_object_get(resp, "choices"), 0);
    json_t *msg = json_object_get(choice, "message");

    assert_string_equal(sh_str(msg, "content"), content);
    assert_null(json_object_get(msg, "tool_calls"));
    assert_string_equal(sh_str(choice, "finish_reason"), "stop");
    json_decref(resp);
}

/* Anthropic honours response_format through the answer tool: the client
 * gets the tool's input as the message's content, finish_reason stop,
 * and no tool call, streamed or not, with its own tools or none. */
static void test_anthropic_response_format(void **state)
{
    sh h;
    sh_resp r;
    json_t *evs, *d;
    loom_buf text = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    const char *finish = NULL;
    size_t i;

    (void)state;
    ps_start_script(&h, ANSWER_SCRIPT);
    expect_json_answer(&h, "{\"model\":\"claude/c\"," MSGS "," CITY_FORMAT "}",
                       "{\"city\":\"Paris\"}");
    assert_answer_tool(
        &h, 0,
        "{\"type\":\"object\",\"properties\":{\"city\":{"
        "\"type\":\"string\"}},\"required\":[\"city\"],"
        "\"additionalProperties\":false}",
        "{\"type\":\"tool\",\"name\":\"" LOOM_ANTHROPIC_ANSWER_TOOL "\"}",
        "[]");

    /* Streamed: the pieces as content deltas. */
    assert_int_equal(sh_req(&h, "POST", "/v1/chat/completions",
                            "{\"model\":\"claude/c\",\"stream\":true," MSGS
                            "," CITY_FORMAT "}",
                            NULL, &r),
                     200);
    evs = sh_sse_parse(r.body, NULL);
    for (i = 0; i < json_array_size(evs); i++) {
        json_t *ch = json_array_get(
            json_object_get(json_object_get(json_array_get(evs, i), "data"),
                            "choices"),
            0);
        d = json_object_get(ch, "delta");
        assert_null(json_object_get(d, "tool_calls"));
        if (sh_str(d, "content"))
            loom_buf_puts(&text, sh_str(d, "content"));
        if (sh_str(ch, "finish_reason"))
            finish = sh_str(ch, "finish_reason");
    }
    assert_string_equal(loom_buf_cstr(&text), "{\"city\":\"Rome\"}");
    assert_non_null(finish);
    assert_string_equal(finish, "stop");
    assert_non_null(strstr(r.body, "[DONE]"));
    json_decref(evs);
    sh_resp_free(&r);
    loom_buf_free(&text);

    /* json_object beside the client's own tool: any tool, and the
     * answer's call is the answer. */
    expect_json_answer(&h,
                       "{\"model\":\"claude/c\"," MSGS
                       ",\"response_format\":{\"type\":\"json_object\"},"
                       "\"tools\":[{\"type\":\"function\",\"function\":{"
                       "\"name\":\"lookup\",\"parameters\":{\"type\":"
                       "\"object\"}}}]}",
                       "{\"n\":1}");
    assert_answer_tool(&h, 2, "{\"type\":\"object\"}", "{\"type\":\"any\"}",
                       "[\"lookup\"]");
    assert_int_equal(nsent(&h), 3);
    sh_free(&h);
}

static void test_refused_per_provider(void **state)
{
    sh h;

    (void)state;
    ps_start(&h);
    expect_refused(&h,
                   "{\"model\":\"claude/c\"," MSGS ",\"logit_bias\":{\"1\":1}}",
                   400, "unsupported_parameter", "logit_bias",
                   "logit_bias is not supported by provider 'claude' "
                   "(anthropic)");
    expect_refused(&h,
                   "{\"model\":\"claude/c\"," MSGS
                   ",\"response_format\":{\"type\":\"json_object\"},"
                   "\"reasoning_effort\":\"low\"}",
                   400, "unsupported_parameter", "response_format",
                   "provider 'claude' (anthropic) together with "
                   "reasoning_effort");
    expect_refused(&h, "{\"model\":\"gem/g\"," MSGS ",\"verbosity\":\"low\"}",
                   400, "unsupported_parameter", "verbosity",
                   "verbosity is not supported by provider 'gem' (gemini)");
    expect_refused(&h, "{\"model\":\"resp/r\"," MSGS ",\"stop\":\"x\"}", 400,
                   "unsupported_parameter", "stop",
                   "stop is not supported by provider 'resp' "
                   "(openai-responses)");
    expect_refused(&h, "{\"model\":\"resp/r\"," MSGS ",\"seed\":1}", 400,
                   "unsupported_parameter", "seed", "'resp'");
    /* Nothing reached the upstream. */
    assert_int_equal(nsent(&h), 0);
    sh_free(&h);
}

static void test_refused_by_loom_and_bad_values(void **state)
{
    sh h;

    (void)state;
    ps_start(&h);
    expect_refused(&h, "{\"model\":\"fake/m\"," MSGS ",\"n\":2}", 400,
                   "unsupported_parameter", "n", "one answer per request");
    expect_refused(&h, "{\"model\":\"fake/m\"," MSGS ",\"logprobs\":true}", 400,
                   "unsupported_parameter", "logprobs", NULL);
    expect_refused(&h, "{\"model\":\"fake/m\"," MSGS ",\"top_logprobs\":2}",
                   400, "unsupported_parameter", "top_logprobs", NULL);
    expect_refused(&h, "{\"model\":\"fake/m\"," MSGS ",\"audio\":{}}", 400,
                   "unsupported_parameter", "audio", NULL);
    expect_refused(&h, "{\"model\":\"fake/m\"," MSGS ",\"top_p\":\"x\"}", 400,
                   "invalid_type", "top_p", "top_p");
    expect_refused(&h, "{\"model\":\"fake/m\"," MSGS ",\"top_p\":1.5}", 400,
                   "invalid_value", "top_p", NULL);
    expect_refused(&h, "{\"model\":\"fake/m\"," MSGS ",\"seed\":1.5}", 400,
                   "invalid_type", "seed", NULL);
    expect_refused(&h,
                   "{\"model\":\"fake/m\"," MSGS
                   ",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}",
                   400, "invalid_value", "stop", NULL);
    expect_refused(&h, "{\"model\":\"fake/m\"," MSGS ",\"stop\":[1]}", 400,
                   "invalid_type", "stop[0]", NULL);
    expect_refused(&h,
                   "{\"model\":\"fake/m\"," MSGS
                   ",\"response_format\":{\"type\":\"xml\"}}",
                   400, "invalid_value", "response_format.type", NULL);
    expect_refused(&h,
                   "{\"model\":\"fake/m\"," MSGS
                   ",\"response_format\":{\"type\":\"json_schema\"}}",
                   400, "missing_required_parameter",
                   "response_format.json_schema", NULL);
    expect_refused(&h,
                   "{\"model\":\"fake/m\"," MSGS
                   ",\"response_format\":{\"type\":\"json_schema\","
                   "\"json_schema\":{\"name\":\"a\",\"schema\":[]}}}",
                   400, "invalid_type", "response_format.json_schema.schema",
                   NULL);
    expect_refused(
        &h, "{\"model\":\"fake/m\"," MSGS ",\"reasoning_effort\":\"max\"}", 400,
        "invalid_value", "reasoning_effort", NULL);
    expect_refused(&h,
                   "{\"model\":\"fake/m\"," MSGS ",\"logit_bias\":{\"x\":1}}",
                   400, "invalid_value", "logit_bias.x", NULL);
    expect_refused(&h, "{\"model\":\"fake/m\"," MSGS ",\"metadata\":{\"k\":1}}",
                   400, "invalid_type", "metadata.k", NULL);
    expect_refused(&h,
                   "{\"model\":\"fake/m\"," MSGS ",\"service_tier\":\"gold\"}",
                   400, "invalid_value", "service_tier", NULL);
    assert_int_equal(nsent(&h), 0);
    sh_free(&h);
}

/* The native run API takes the same parameters, with the same checks. */
static void test_runs_api(void **state)
{
    sh h;
    json_t *run, *b, *e;

    (void)state;
    ps_start(&h);
    run = sh_json(&h, "POST", "/v1/runs",
                  "{\"model\":\"fake/m\",\"input\":\"hi\",\"top_p\":0.25,"
                  "\"response_format\":{\"type\":\"json_object\"}}",
                  200);
    json_decref(run);
    b = sent_body(&h, 0);
    assert_jeq(json_object_get(b, "top_p"), "0.25");
    assert_jeq(json_object_get(b, "response_format"),
               "{\"type\":\"json_object\"}");
    json_decref(b);
    run = sh_json(&h, "POST", "/v1/runs",
                  "{\"model\":\"claude/c\",\"input\":\"hi\",\"seed\":3}", 400);
    e = json_object_get(run, "error");
    assert_string_equal(sh_str(e, "code"), "unsupported_parameter");
    assert_string_equal(sh_str(e, "param"), "seed");
    assert_non_null(strstr(sh_str(e, "message"), "provider 'claude'"));
    json_decref(run);
    run = sh_json(&h, "POST", "/v1/runs",
                  "{\"model\":\"fake/m\",\"input\":\"hi\","
                  "\"presence_penalty\":true}",
                  400);
    e = json_object_get(run, "error");
    assert_string_equal(sh_str(e, "code"), "invalid_type");
    assert_string_equal(sh_str(e, "param"), "presence_penalty");
    json_decref(run);
    assert_int_equal(nsent(&h), 1);
    sh_free(&h);
}

/* The output limit in the one field each model takes, whichever name
 * the client used. */
static void test_max_tokens_field(void **state)
{
    static const struct {
        const char *model, *field, *other;
    } cases[] = {
        {"fake/o3", "max_completion_tokens", "max_tokens"},
        {"fake/g5", "max_tokens", "max_completion_tokens"},
        {"fake/m", "max_tokens", "max_completion_tokens"},
    };
    char body[256];
    sh h;

    (void)state;
    ps_start(&h);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *resp, *b;
        snprintf(body, sizeof(body), "{\"model\":\"%s\"," MSGS ",\"%s\":40}",
                 cases[i].model,
                 i % 2 ? "max_completion_tokens" : "max_tokens");
        resp = sh_json(&h, "POST", "/v1/chat/completions", body, 200);
        json_decref(resp);
        b = sent_body(&h, i);
        assert_jeq(json_object_get(b, cases[i].field), "40");
        assert_null(json_object_get(b, cases[i].other));
        json_decref(b);
    }
    sh_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_openai_passes_every_parameter),
        cmocka_unit_test(test_anthropic_translates),
        cmocka_unit_test(test_anthropic_response_format),
        cmocka_unit_test(test_refused_per_provider),
        cmocka_unit_test(test_refused_by_loom_and_bad_values),
        cmocka_unit_test(test_max_tokens_field),
        cmocka_unit_test(test_runs_api),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
