/*
 * The "anthropic" provider end to end against loom-fake-upstream (which
 * speaks Anthropic Messages on /v1/messages): what loom sends (path,
 * headers, body), streamed and non-streamed answers, parallel tool calls,
 * thinking sent back unchanged on the next request, retries (429, 529,
 * in-stream overloaded_error, drops; never after output; never on other
 * 4xx), cancellation, limits, and a whole run through loom_run
 * with tools. Time checks are lower bounds or generous upper bounds only.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fake.h"
#include "llm/anthropic.h"
#include "loom/buf.h"
#include "loom/llm.h"
#include "loom/run.h"
#include "provider_harness.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef provider_ctx ctx;

static ctx *setup(const char *script, int retries)
{
    loom_fake *f = fake_start_script(script);

    assert_non_null(f);
    return provider_start(
        f, NULL, "claude", "anthropic", "sk-ant-test",
        json_pack("{s:s}", "anthropic-beta", "interleaved-thinking-2025-05-14"),
        "claude-test", retries);
}

/* ---- happy paths ------------------------------------------------------- */

static void test_stream_text(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"Hel\",\"lo\"],\"usage\":"
                   "{\"input_tokens\":3,\"output_tokens\":2,"
                   "\"cache_creation_input_tokens\":5,"
                   "\"cache_read_input_tokens\":4}}]}",
                   2);
    json_t *r, *h, *b;

    (void)state;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "Hello");
    assert_string_equal(loom_buf_cstr(&c->events_text), "Hello");
    assert_string_equal(loom_buf_cstr(&c->order), "TTUF");
    assert_string_equal(c->resp.finish_reason, "stop");
    assert_string_equal(c->resp.response_id, "msg_fake_1");
    assert_int_equal(c->resp.usage.prompt_tokens, 12);
    assert_int_equal(c->resp.usage.cached_tokens, 4);
    assert_int_equal(c->resp.usage.cache_write_tokens, 5);
    assert_int_equal(c->resp.usage.completion_tokens, 2);
    assert_int_equal(c->resp.usage.total_tokens, 14);
    assert_null(c->resp.provider_state);
    assert_int_equal(c->resp.error.attempts, 1);

    r = fake_request(c->fake, 0);
    assert_string_equal(json_string_value(json_object_get(r, "path")),
                        "/v1/messages");
    h = json_object_get(r, "headers");
    assert_string_equal(json_string_value(json_object_get(h, "x-api-key")),
                        "sk-ant-test");
    assert_string_equal(
        json_string_value(json_object_get(h, "anthropic-version")),
        "2023-06-01");
    assert_string_equal(json_string_value(json_object_get(h, "anthropic-beta")),
                        "interleaved-thinking-2025-05-14");
    assert_string_equal(json_string_value(json_object_get(h, "accept")),
                        "text/event-stream");
    assert_string_equal(json_string_value(json_object_get(h, "content-type")),
                        "application/json");
    assert_null(json_object_get(h, "authorization"));
    b = json_object_get(r, "body");
    assert_json(b, "{\"model\":\"claude-test\",\"max_tokens\":4096,"
                   "\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                   "\"text\",\"text\":\"Hi\"}]}],\"stream\":true}");
    json_decref(r);
    provider_stop(c);
}

static void test_non_streamed(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"Hel\",\"lo\"],"
                   "\"tool_calls\":[{\"id\":\"toolu_1\",\"name\":\"f\","
                   "\"arguments\":\"{\\\"a\\\":1}\"}],"
                   "\"usage\":{\"input_tokens\":3,\"output_tokens\":2}}]}",
                   0);
    json_t *r;

    (void)state;
    c->req.stream = 0;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "Hello");
    assert_int_equal(c->resp.tool_calls_len, 1);
    assert_string_equal(c->resp.tool_calls[0].id, "toolu_1");
    assert_string_equal(c->resp.tool_calls[0].arguments, "{\"a\":1}");
    assert_string_equal(c->resp.finish_reason, "tool_calls");
    assert_int_equal(c->resp.usage.total_tokens, 5);
    assert_string_equal(loom_buf_cstr(&c->order), "TDUCF");
    r = fake_request(c->fake, 0);
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(r, "headers"), "accept")),
                        "application/json");
    assert_null(json_object_get(json_object_get(r, "body"), "stream"));
    json_decref(r);
    provider_stop(c);
}

static void test_parallel_tool_calls(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"Both.\"],\"tool_calls\":["
                   "{\"id\":\"toolu_1\",\"name\":\"get_weather\",\"arguments\":"
                   "[\"{\\\"city\\\":\",\"\\\"Paris\\\"}\"]},"
                   "{\"id\":\"toolu_2\",\"name\":\"get_time\",\"arguments\":"
                   "[\"{\\\"tz\\\":\",\"\\\"CET\\\"}\"]}]}]}",
                   0);

    (void)state;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_int_equal(c->resp.tool_calls_len, 2);
    assert_string_equal(c->resp.tool_calls[0].name, "get_weather");
    assert_string_equal(c->resp.tool_calls[0].arguments,
                        "{\"city\":\"Paris\"}");
    assert_string_equal(c->resp.tool_calls[1].id, "toolu_2");
    assert_string_equal(c->resp.tool_calls[1].arguments, "{\"tz\":\"CET\"}");
    assert_string_equal(c->resp.finish_reason, "tool_calls");
    /* text, per call a start fragment and two argument fragments, then
     * the closing events */
    assert_string_equal(loom_buf_cstr(&c->order), "TDDDDDDUCF");
    provider_stop(c);
}

static const char thinking_script[] =
    "{\"responses\":["
    "{\"reasoning\":[\"Let me \",\"think.\"],\"signature\":\"sig-1\","
    "\"redacted_thinking\":\"REDACTED\",\"text\":[\"Checking.\"],"
    "\"tool_calls\":[{\"id\":\"toolu_1\",\"name\":\"get_weather\","
    "\"arguments\":[\"{\\\"city\\\":\",\"\\\"Paris\\\"}\"]},"
    "{\"id\":\"toolu_2\",\"name\":\"get_time\",\"arguments\":\"{}\"}],"
    "\"usage\":{\"input_tokens\":20,\"output_tokens\":9}},"
    "{\"text\":[\"Sunny.\"]}]}";

static const char thinking_turn[] =
    "{\"role\":\"assistant\",\"content\":["
    "{\"type\":\"thinking\",\"thinking\":\"Let me think.\",\"signature\":"
    "\"sig-1\"},"
    "{\"type\":\"redacted_thinking\",\"data\":\"REDACTED\"},"
    "{\"type\":\"text\",\"text\":\"Checking.\"},"
    "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"get_weather\","
    "\"input\":{\"city\":\"Paris\"}},"
    "{\"type\":\"tool_use\",\"id\":\"toolu_2\",\"name\":\"get_time\","
    "\"input\":{}}]}";

/* A thinking answer, then its state sent back with the tool results. */
static void thinking_round_trip(int stream)
{
    ctx *c = setup(thinking_script, 0);
    loom_tool_def tool = {"get_weather", "Weather.", NULL};
    json_t *b;

    c->req.stream = stream;
    c->req.thinking_budget = 1024;
    c->req.tools = &tool;
    c->req.tools_len = 1;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.reasoning, "Let me think.");
    assert_string_equal(c->resp.text, "Checking.");
    assert_int_equal(c->resp.tool_calls_len, 2);
    assert_non_null(c->resp.provider_state);
    b = provider_sent_body(c->fake, 0);
    assert_json(json_object_get(b, "thinking"),
                "{\"type\":\"enabled\",\"budget_tokens\":1024}");
    assert_json(json_object_get(b, "max_tokens"), "5120");
    json_decref(b);

    provider_add_answer(c);
    assert_int_equal(loom_messages_add_tool_result(&c->msgs, "toolu_1",
                                                   "get_weather", "sunny"),
                     0);
    assert_int_equal(
        loom_messages_add_tool_result(&c->msgs, "toolu_2", "get_time", "noon"),
        0);
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "Sunny.");
    assert_null(c->resp.provider_state);
    b = provider_sent_body(c->fake, 1);
    assert_json(json_array_get(json_object_get(b, "messages"), 1),
                thinking_turn);
    assert_json(json_array_get(json_object_get(b, "messages"), 2),
                "{\"role\":\"user\",\"content\":["
                "{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\","
                "\"content\":\"sunny\"},"
                "{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_2\","
                "\"content\":\"noon\"}]}");
    assert_non_null(json_object_get(b, "thinking"));
    json_decref(b);
    provider_stop(c);
}

static void test_thinking_round_trip_stream(void **state)
{
    (void)state;
    thinking_round_trip(1);
}

static void test_thinking_round_trip_json(void **state)
{
    (void)state;
    thinking_round_trip(0);
}

/* ---- errors and retries ------------------------------------------------ */

static void test_429_retried(void **state)
{
    ctx *c = setup("{\"responses\":[{\"status\":429,\"headers\":"
                   "{\"retry-after-ms\":\"20\"},\"error\":{\"message\":"
                   "\"slow down\"}},{\"text\":[\"ok\"]}]}",
                   2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "ok");
    assert_int_equal(c->resp.error.attempts, 2);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_NONE);
    assert_int_equal(fake_request_count(c->fake), 2);
    provider_stop(c);
}

static void test_529_exhausted(void **state)
{
    ctx *c = setup("{\"loop\":true,\"responses\":[{\"status\":529,"
                   "\"headers\":{\"request-id\":\"req_529\"},"
                   "\"error\":{\"message\":\"Overloaded\"}}]}",
                   2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_SERVER);
    assert_int_equal(c->resp.error.http_status, 529);
    assert_string_equal(c->resp.error.type, "overloaded_error");
    assert_string_equal(c->resp.error.message, "Overloaded");
    assert_string_equal(c->resp.error.request_id, "req_529");
    assert_int_equal(c->resp.error.attempts, 3);
    assert_int_equal(fake_request_count(c->fake), 3);
    assert_non_null(strstr(loom_error_last(), "claude: 529 server: "
                                              "Overloaded (request req_529)"
                                              " after 3 attempts"));
    provider_stop(c);
}

typedef struct {
    int status;
    loom_upstream_kind kind;
    const char *type;
} status_case;

static void test_4xx_not_retried(void **state)
{
    static const status_case cases[] = {
        {400, LOOM_UPSTREAM_BAD_REQUEST, "invalid_request_error"},
        {401, LOOM_UPSTREAM_AUTH, "authentication_error"},
        {403, LOOM_UPSTREAM_PERMISSION, "permission_error"},
        {404, LOOM_UPSTREAM_NOT_FOUND, "not_found_error"},
        {413, LOOM_UPSTREAM_TOO_LARGE, "request_too_large"},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char script[256];
        ctx *c;
        snprintf(script, sizeof(script),
                 "{\"loop\":true,\"responses\":[{\"status\":%d,\"error\":"
                 "{\"message\":\"no\"}}]}",
                 cases[i].status);
        c = setup(script, 2);
        assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
        assert_int_equal(c->resp.error.kind, cases[i].kind);
        assert_string_equal(c->resp.error.type, cases[i].type);
        assert_int_equal(c->resp.error.attempts, 1);
        assert_int_equal(fake_request_count(c->fake), 1);
        provider_stop(c);
    }
}

static void test_stream_error_before_output(void **state)
{
    /* overloaded_error in the stream before any output: retried */
    ctx *c = setup("{\"responses\":[{\"stream_error\":{}},"
                   "{\"text\":[\"ok\"]}]}",
                   2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "ok");
    assert_int_equal(fake_request_count(c->fake), 2);
    provider_stop(c);

    /* another error type is not */
    c = setup("{\"responses\":[{\"stream_error\":{\"type\":"
              "\"invalid_request_error\",\"message\":\"bad\"}},"
              "{\"text\":[\"ok\"]}]}",
              2);
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_STREAM);
    assert_int_equal(fake_request_count(c->fake), 1);
    provider_stop(c);
}

static void test_stream_error_after_output(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"par\"],\"stream_error\":"
                   "{\"message\":\"Overloaded\"}},{\"text\":[\"ok\"]}]}",
                   2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_STREAM);
    assert_string_equal(c->resp.error.type, "overloaded_error");
    assert_string_equal(c->resp.text, "par");
    assert_true(c->resp.output_started);
    assert_non_null(strchr(loom_buf_cstr(&c->order), 'E'));
    assert_int_equal(fake_request_count(c->fake), 1);
    provider_stop(c);
}

static void test_disconnect(void **state)
{
    /* message_start and an empty text block: nothing shown yet */
    ctx *c = setup("{\"responses\":[{\"text\":[\"a\",\"b\"],"
                   "\"disconnect_after_chunks\":2},{\"text\":[\"ok\"]}]}",
                   2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "ok");
    assert_int_equal(fake_request_count(c->fake), 2);
    provider_stop(c);

    /* start, block start, ping, "a": output started, no retry */
    c = setup("{\"responses\":[{\"text\":[\"a\",\"b\"],"
              "\"disconnect_after_chunks\":4},{\"text\":[\"ok\"]}]}",
              2);
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_CONNECTION);
    assert_string_equal(c->resp.text, "a");
    assert_int_equal(fake_request_count(c->fake), 1);
    provider_stop(c);
}

static void test_cancel_during_hang(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"a\"],\"hang\":true,"
                   "\"hang_after_chunks\":4}]}",
                   2);
    (void)state;
    assert_int_equal(provider_run_canceled(c, 200), LOOM_ECANCELED);
    assert_string_equal(c->resp.text, "a");
    assert_int_equal(fake_request_count(c->fake), 1);
    provider_stop(c);
}

static void test_limits(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"0123456789\","
                   "\"0123456789\"]},{\"text\":[\"0123\",\"45678\"]}]}",
                   2);
    loom__anthropic_limits lim = {0};

    (void)state;
    /* a non-streamed body over max_body */
    lim.max_body = 100;
    loom__anthropic_provider_set_limits(c->p, &lim);
    c->req.stream = 0;
    assert_int_equal(provider_run(c, NULL), LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "claude: "));
    /* streamed text over max_text: what came first is kept */
    lim.max_body = 0;
    lim.max_text = 8;
    loom__anthropic_provider_set_limits(c->p, &lim);
    c->req.stream = 1;
    assert_int_equal(provider_run(c, NULL), LOOM_ETOOLARGE);
    assert_string_equal(c->resp.text, "0123");
    assert_int_equal(fake_request_count(c->fake), 2);
    provider_stop(c);
}

/* ---- a whole run ------------------------------------------------------- */

static void test_run_loop(void **state)
{
    static const char script[] =
        "{\"responses\":["
        "{\"reasoning\":[\"Plan.\"],\"signature\":\"sig-A\","
        "\"text\":[\"Calling.\"],\"tool_calls\":["
        "{\"id\":\"toolu_e\",\"name\":\"echo\",\"arguments\":"
        "[\"{\\\"text\\\":\",\"\\\"a\\\"}\"]},"
        "{\"id\":\"toolu_f\",\"name\":\"fail\",\"arguments\":\"{}\"}],"
        "\"usage\":{\"input_tokens\":10,\"output_tokens\":5}},"
        "{\"reasoning\":[\"Again.\"],\"signature\":\"sig-B\","
        "\"tool_calls\":[{\"id\":\"toolu_g\",\"name\":\"echo\","
        "\"arguments\":\"{\\\"text\\\":\\\"b\\\"}\"}],"
        "\"usage\":{\"input_tokens\":20,\"output_tokens\":5,"
        "\"cache_read_input_tokens\":8}},"
        "{\"text\":[\"Final \",\"answer.\"],"
        "\"usage\":{\"input_tokens\":30,\"output_tokens\":2}}]}";
    loom_fake *f = fake_start_script(script);
    loom_provider_config pc;
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_tool_registry *reg = provider_tools();
    loom_provider *p;
    loom_messages hist = {0};
    loom_run *r;
    json_t *b, *msgs, *last;
    const loom_usage *u;

    (void)state;
    assert_non_null(f);
    provider_config(&pc, f, NULL, "claude", "anthropic", "sk-ant-test", NULL,
                    0);
    assert_int_equal(loom_provider_new(&p, &pc), 0);
    ro.provider = p;
    ro.model = "claude/claude-test";
    ro.upstream_model = "claude-test";
    ro.tools = reg;
    ro.system_prompt = "Be brief.";
    ro.max_iterations = 3;
    ro.temperature = -1.0;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "question"), 0);
    assert_int_equal(loom_run_new(&r, &ro, &hist), 0);
    assert_int_equal(loom_run_execute(r), 0);
    assert_string_equal(loom_run_text(r), "Final answer.");
    assert_int_equal(loom_run_iterations(r), 3);
    assert_string_equal(loom_run_finish_reason(r), "stop");
    u = loom_run_usage(r);
    assert_int_equal(u->prompt_tokens, 10 + 28 + 30);
    assert_int_equal(u->cached_tokens, 8);
    assert_int_equal(u->completion_tokens, 12);
    assert_int_equal(fake_request_count(f), 3);

    /* the second call: the first turn with its thinking, both results in
     * one user turn, the failed one flagged */
    {
        json_t *rq = fake_request(f, 1);
        b = json_incref(json_object_get(rq, "body"));
        json_decref(rq);
    }
    assert_json(json_object_get(b, "system"),
                "[{\"type\":\"text\",\"text\":\"Be brief.\"}]");
    msgs = json_object_get(b, "messages");
    assert_int_equal(json_array_size(msgs), 3);
    assert_json(json_array_get(msgs, 1),
                "{\"role\":\"assistant\",\"content\":["
                "{\"type\":\"thinking\",\"thinking\":\"Plan.\","
                "\"signature\":\"sig-A\"},"
                "{\"type\":\"text\",\"text\":\"Calling.\"},"
                "{\"type\":\"tool_use\",\"id\":\"toolu_e\",\"name\":\"echo\","
                "\"input\":{\"text\":\"a\"}},"
                "{\"type\":\"tool_use\",\"id\":\"toolu_f\",\"name\":\"fail\","
                "\"input\":{}}]}");
    assert_json(json_array_get(msgs, 2),
                "{\"role\":\"user\",\"content\":["
                "{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_e\","
                "\"content\":\"echo:a\"},"
                "{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_f\","
                "\"content\":\"Error: disk on fire\",\"is_error\":true}]}");
    assert_int_equal(json_array_size(json_object_get(b, "tools")), 2);
    json_decref(b);

    /* the last call: no tools to offer, so a placeholder nobody may
     * choose; the limit note is user text after the results */
    {
        json_t *rq = fake_request(f, 2);
        b = json_incref(json_object_get(rq, "body"));
        json_decref(rq);
    }
    msgs = json_object_get(b, "messages");
    assert_int_equal(json_array_size(msgs), 5);
    assert_json(
        json_array_get(json_object_get(json_array_get(msgs, 3), "content"), 0),
        "{\"type\":\"thinking\",\"thinking\":\"Again.\","
        "\"signature\":\"sig-B\"}");
    last = json_object_get(json_array_get(msgs, 4), "content");
    assert_int_equal(json_array_size(last), 2);
    assert_json(json_array_get(last, 0),
                "{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_g\","
                "\"content\":\"echo:b\"}");
    assert_non_null(strstr(
        json_string_value(json_object_get(json_array_get(last, 1), "text")),
        "limit of 3 model calls"));
    assert_json(json_object_get(b, "tool_choice"), "{\"type\":\"none\"}");
    /* The real tools stay declared (the history uses them). */
    assert_string_equal(
        json_string_value(json_object_get(
            json_array_get(json_object_get(b, "tools"), 0), "name")),
        "echo");
    json_decref(b);

    loom_run_free(r);
    loom_messages_free(&hist);
    loom_tool_registry_free(reg);
    loom_provider_free(p);
    json_decref(pc.headers);
    assert_int_equal(fake_stop_check(f), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_text),
        cmocka_unit_test(test_non_streamed),
        cmocka_unit_test(test_parallel_tool_calls),
        cmocka_unit_test(test_thinking_round_trip_stream),
        cmocka_unit_test(test_thinking_round_trip_json),
        cmocka_unit_test(test_429_retried),
        cmocka_unit_test(test_529_exhausted),
        cmocka_unit_test(test_4xx_not_retried),
        cmocka_unit_test(test_stream_error_before_output),
        cmocka_unit_test(test_stream_error_after_output),
        cmocka_unit_test(test_disconnect),
        cmocka_unit_test(test_cancel_during_hang),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_run_loop),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
