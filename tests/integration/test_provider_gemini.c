/*
 * The "gemini" provider end to end against loom-fake-upstream (which
 * speaks Gemini for a path with /models/...:streamGenerateContent or
 * :generateContent): what loom sends (URL, x-goog-api-key, body),
 * streamed and non-streamed answers, parallel calls, reasoning with its
 * thoughtSignature sent back exactly on the next request, errors and
 * retries (429/5xx and RetryInfo honoured, 4xx not, never after output),
 * errors inside the stream, a dropped connection, cancellation,
 * limits; then whole runs through loom_run: a tool loop with two parallel
 * calls, a failing tool and reasoning, and the iteration limit. Time
 * checks are lower bounds or generous upper bounds only.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fake.h"
#include "llm/gemini.h"
#include "loom/buf.h"
#include "loom/llm.h"
#include "loom/run.h"
#include "provider_harness.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef provider_ctx ctx;

/* A fake (a script's or a replay) and a "gemini" provider in front of
 * it. */
static ctx *setup_fake(loom_fake *fake, int retries)
{
    assert_non_null(fake);
    return provider_start(fake, NULL, "gem", "gemini", "gk-test",
                          json_pack("{s:s}", "X-Extra", "v1"), "gemini-test",
                          retries);
}

static ctx *setup(const char *script, int retries)
{
    return setup_fake(fake_start_script(script), retries);
}

/* ---- happy paths ----------------------------------------------------- */

static void test_stream_text(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"Hel\",\"lo\"],\"usage\":"
                   "{\"prompt_tokens\":3,\"completion_tokens\":2,"
                   "\"total_tokens\":5}}]}",
                   2);
    json_t *r, *h;

    (void)state;
    loom_messages_free(&c->msgs);
    assert_int_equal(loom_messages_add(&c->msgs, LOOM_ROLE_SYSTEM, "Be kind."),
                     0);
    assert_int_equal(loom_messages_add(&c->msgs, LOOM_ROLE_USER, "Hi"), 0);
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "Hello");
    assert_string_equal(loom_buf_cstr(&c->events_text), "Hello");
    assert_string_equal(c->resp.finish_reason, "stop");
    assert_string_equal(c->resp.response_id, "fake-response-1");
    assert_int_equal(c->resp.usage.prompt_tokens, 3);
    assert_int_equal(c->resp.usage.completion_tokens, 2);
    assert_int_equal(c->resp.usage.total_tokens, 5);
    assert_int_equal(c->resp.error.attempts, 1);
    assert_true(c->resp.output_started);
    assert_null(c->resp.provider_state);

    assert_int_equal(fake_request_count(c->fake), 1);
    r = fake_request(c->fake, 0);
    assert_string_equal(json_string_value(json_object_get(r, "method")),
                        "POST");
    assert_string_equal(json_string_value(json_object_get(r, "path")),
                        "/v1/models/gemini-test:streamGenerateContent");
    assert_string_equal(json_string_value(json_object_get(r, "query")),
                        "alt=sse");
    h = json_object_get(r, "headers");
    assert_string_equal(json_string_value(json_object_get(h, "x-goog-api-key")),
                        "gk-test");
    assert_null(json_object_get(h, "authorization"));
    assert_string_equal(json_string_value(json_object_get(h, "content-type")),
                        "application/json");
    assert_string_equal(json_string_value(json_object_get(h, "accept")),
                        "text/event-stream");
    assert_string_equal(json_string_value(json_object_get(h, "x-extra")), "v1");
    assert_memory_equal(json_string_value(json_object_get(h, "user-agent")),
                        "loom/", 5);
    assert_json(json_object_get(r, "body"),
                "{\"systemInstruction\":{\"parts\":[{\"text\":\"Be kind.\"}]},"
                "\"contents\":[{\"role\":\"user\",\"parts\":[{\"text\":"
                "\"Hi\"}]}],\"generationConfig\":{}}");
    json_decref(r);
    provider_stop(c);
}

static void test_non_streamed(void **state)
{
    ctx *c = setup("{\"responses\":[{\"reasoning\":[\"Think\",\"ing.\"],"
                   "\"text\":[\"The sky\",\" is blue.\"],\"tool_calls\":"
                   "[{\"name\":\"look\",\"arguments\":\"{\\\"at\\\":"
                   "\\\"sky\\\"}\"}],\"thought_signature\":\"c2ln\","
                   "\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":5,"
                   "\"completion_tokens_details\":{\"reasoning_tokens\":2},"
                   "\"total_tokens\":12}}]}",
                   0);
    json_t *r;

    (void)state;
    c->req.stream = 0;
    c->req.max_tokens = 100;
    assert_int_equal(provider_run(c, NULL), 0);
    r = fake_request(c->fake, 0);
    assert_string_equal(json_string_value(json_object_get(r, "path")),
                        "/v1/models/gemini-test:generateContent");
    assert_string_equal(json_string_value(json_object_get(r, "query")), "");
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(r, "headers"), "accept")),
                        "application/json");
    assert_json(json_object_get(json_object_get(r, "body"), "generationConfig"),
                "{\"maxOutputTokens\":100}");
    json_decref(r);
    assert_string_equal(c->resp.text, "The sky is blue.");
    assert_string_equal(c->resp.reasoning, "Thinking.");
    assert_string_equal(loom_buf_cstr(&c->events_reasoning), "Thinking.");
    assert_int_equal(c->resp.tool_calls_len, 1);
    assert_string_equal(c->resp.tool_calls[0].id, "call_0_0");
    assert_string_equal(c->resp.tool_calls[0].arguments, "{\"at\":\"sky\"}");
    assert_string_equal(c->resp.finish_reason, "tool_calls");
    assert_int_equal(c->resp.usage.prompt_tokens, 7);
    assert_int_equal(c->resp.usage.completion_tokens, 5);
    assert_int_equal(c->resp.usage.reasoning_tokens, 2);
    assert_string_equal(c->resp.provider_state,
                        "{\"gemini\":{\"parts\":[{\"text\":[0,16]},{\"call\":"
                        "0,\"thoughtSignature\":\"c2ln\"}]}}");
    provider_stop(c);
}

/* Two calls in one turn, one with Gemini's id; the signature on the first
 * goes back on the next request, the results by name and id. */
static void test_parallel_calls_state_round_trip(void **state)
{
    ctx *c = setup("{\"responses\":[{\"tool_calls\":["
                   "{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":"
                   "\\\"Paris\\\"}\"},"
                   "{\"id\":\"fc-2\",\"name\":\"get_time\",\"arguments\":"
                   "\"{\\\"tz\\\":\\\"CET\\\"}\"}],"
                   "\"thought_signature\":\"c2lnbmF0dXJl/+=\"},"
                   "{\"text\":[\"Sunny, 12:00.\"]}]}",
                   0);
    json_t *params =
        json_pack("{s:s,s:{s:{s:s}},s:[s]}", "type", "object", "properties",
                  "city", "type", "string", "required", "city");
    loom_tool_def tools[2] = {{"get_weather", "Weather.", params},
                              {"get_time", "Time.", NULL}};
    json_t *b;

    (void)state;
    c->req.tools = tools;
    c->req.tools_len = 2;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_int_equal(c->resp.tool_calls_len, 2);
    assert_int_equal(c->ndeltas, 2);
    assert_string_equal(c->resp.tool_calls[0].id, "call_0_0");
    assert_string_equal(c->resp.tool_calls[0].name, "get_weather");
    assert_string_equal(c->resp.tool_calls[1].id, "fc-2");
    assert_string_equal(c->resp.finish_reason, "tool_calls");
    assert_non_null(c->resp.provider_state);
    b = provider_sent_body(c->fake, 0);
    assert_json(json_object_get(b, "tools"),
                "[{\"functionDeclarations\":[{\"name\":\"get_weather\","
                "\"description\":\"Weather.\",\"parameters\":{\"type\":"
                "\"OBJECT\",\"properties\":{\"city\":{\"type\":\"STRING\"}},"
                "\"required\":[\"city\"]}},{\"name\":\"get_time\","
                "\"description\":\"Time.\"}]}]");
    json_decref(b);

    provider_add_answer(c);
    assert_int_equal(loom_messages_add_tool_result(&c->msgs, "call_0_0",
                                                   "get_weather", "sunny"),
                     0);
    assert_int_equal(
        loom_messages_add_tool_result(&c->msgs, "fc-2", "get_time", "12:00"),
        0);
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "Sunny, 12:00.");
    b = provider_sent_body(c->fake, 1);
    assert_json(json_object_get(b, "contents"),
                "[{\"role\":\"user\",\"parts\":[{\"text\":\"Hi\"}]},"
                "{\"role\":\"model\",\"parts\":["
                "{\"functionCall\":{\"name\":\"get_weather\",\"args\":"
                "{\"city\":\"Paris\"}},\"thoughtSignature\":"
                "\"c2lnbmF0dXJl/+=\"},"
                "{\"functionCall\":{\"name\":\"get_time\",\"args\":{\"tz\":"
                "\"CET\"},\"id\":\"fc-2\"}}]},"
                "{\"role\":\"user\",\"parts\":["
                "{\"functionResponse\":{\"name\":\"get_weather\",\"response\":"
                "{\"result\":\"sunny\"}}},"
                "{\"functionResponse\":{\"name\":\"get_time\",\"response\":"
                "{\"result\":\"12:00\"},\"id\":\"fc-2\"}}]}]");
    json_decref(b);
    json_decref(params);
    provider_stop(c);
}

/* Thoughts stream as reasoning; the signature on the last text part goes
 * back on that part, the thoughts themselves do not. */
static void test_reasoning_round_trip(void **state)
{
    ctx *c = setup("{\"responses\":[{\"reasoning\":[\"Let me\",\" think.\"],"
                   "\"text\":[\"The answer\",\" is 4.\"],"
                   "\"thought_signature\":\"U0lHTkFUVVJF\",\"usage\":"
                   "{\"prompt_tokens\":10,\"completion_tokens\":9,"
                   "\"completion_tokens_details\":{\"reasoning_tokens\":4}}},"
                   "{\"text\":[\"Yes.\"]}]}",
                   0);
    json_t *b;

    (void)state;
    c->req.thinking_budget = 2048;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.reasoning, "Let me think.");
    assert_string_equal(loom_buf_cstr(&c->events_reasoning), "Let me think.");
    assert_string_equal(c->resp.text, "The answer is 4.");
    assert_int_equal(c->resp.usage.reasoning_tokens, 4);
    assert_int_equal(c->resp.usage.completion_tokens, 9);
    assert_int_equal(c->resp.usage.total_tokens, 19);
    b = provider_sent_body(c->fake, 0);
    assert_json(json_object_get(b, "generationConfig"),
                "{\"thinkingConfig\":{\"thinkingBudget\":2048,"
                "\"includeThoughts\":true}}");
    json_decref(b);

    provider_add_answer(c);
    assert_int_equal(loom_messages_add(&c->msgs, LOOM_ROLE_USER, "Sure?"), 0);
    assert_int_equal(provider_run(c, NULL), 0);
    b = provider_sent_body(c->fake, 1);
    assert_json(json_array_get(json_object_get(b, "contents"), 1),
                "{\"role\":\"model\",\"parts\":[{\"text\":\"The answer\"},"
                "{\"text\":\" is 4.\",\"thoughtSignature\":"
                "\"U0lHTkFUVVJF\"}]}");
    json_decref(b);
    provider_stop(c);
}

static void test_stream_answered_with_json(void **state)
{
    /* A proxy that ignores alt=sse answers with the JSON array form. */
    ctx *c = setup("{\"responses\":[{\"content_type\":\"application/json\","
                   "\"body\":\"[{\\\"candidates\\\":[{\\\"content\\\":"
                   "{\\\"parts\\\":[{\\\"text\\\":\\\"a\\\"}]}}]},"
                   "{\\\"candidates\\\":[{\\\"content\\\":{\\\"parts\\\":"
                   "[{\\\"text\\\":\\\"b\\\"}]},\\\"finishReason\\\":"
                   "\\\"STOP\\\"}]}]\"}]}",
                   0);

    (void)state;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "ab");
    assert_string_equal(c->resp.finish_reason, "stop");
    provider_stop(c);
}

static void test_config(void **state)
{
    ctx *c = setup("{\"loop\":true,\"responses\":[{\"text\":[\"ok\"]}]}", 0);
    loom_provider *p = NULL;
    json_t *r, *h;

    (void)state;
    /* No key: no key header. */
    c->cfg.api_key = NULL;
    provider_reconfigure(c);
    assert_int_equal(provider_run(c, NULL), 0);
    r = fake_request(c->fake, 0);
    assert_null(
        json_object_get(json_object_get(r, "headers"), "x-goog-api-key"));
    json_decref(r);
    /* A configured header replaces loom's own. */
    c->cfg.api_key = "gk-test";
    json_object_set_new(c->cfg.headers, "X-Goog-Api-Key", json_string("mine"));
    json_object_set_new(c->cfg.headers, "Accept", json_string("*/*"));
    provider_reconfigure(c);
    assert_int_equal(provider_run(c, NULL), 0);
    r = fake_request(c->fake, 1);
    h = json_object_get(r, "headers");
    assert_string_equal(json_string_value(json_object_get(h, "x-goog-api-key")),
                        "mine");
    assert_string_equal(json_string_value(json_object_get(h, "accept")), "*/*");
    json_decref(r);
    /* Bad headers and keys are refused at once. */
    json_object_set_new(c->cfg.headers, "Bad Name", json_string("x"));
    assert_int_equal(loom_provider_new(&p, &c->cfg), LOOM_EINVALID);
    assert_null(p);
    json_object_del(c->cfg.headers, "Bad Name");
    json_object_del(c->cfg.headers, "X-Goog-Api-Key");
    c->cfg.api_key = "a\nb";
    assert_int_equal(loom_provider_new(&p, &c->cfg), LOOM_EINVALID);
    /* No base_url: Google's. A model is needed. */
    c->cfg.api_key = "gk-test";
    c->cfg.base_url = NULL;
    assert_int_equal(loom_provider_new(&p, &c->cfg), 0);
    c->req.model = NULL;
    loom_llm_response_clear(&c->resp);
    assert_int_equal(
        loom_provider_complete(p, &c->req, NULL, NULL, &c->resp, NULL),
        LOOM_EINVALID);
    assert_string_equal(c->resp.text, "");
    loom_provider_free(p);
    c->cfg.base_url = (char *)fake_base_url(c->fake);
    provider_stop(c);
}

/* ---- errors and retries ------------------------------------------------ */

static void test_429_retried(void **state)
{
    ctx *c = setup("{\"responses\":[{\"status\":429,\"error\":{\"message\":"
                   "\"Resource has been exhausted\"}},{\"text\":[\"ok\"]}]}",
                   2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "ok");
    assert_int_equal(c->resp.error.attempts, 2);
    assert_int_equal(fake_request_count(c->fake), 2);
    provider_stop(c);
}

static void test_retry_info_honoured(void **state)
{
    ctx *c = setup("{\"responses\":[{\"status\":429,\"error\":{\"message\":"
                   "\"quota\",\"details\":[{\"@type\":\"type.googleapis.com/"
                   "google.rpc.RetryInfo\",\"retryDelay\":\"0.4s\"}]}},"
                   "{\"text\":[\"ok\"]}]}",
                   2);
    long long t0 = test_now_ms();

    (void)state;
    assert_int_equal(provider_run(c, NULL), 0);
    /* The body's delay, not the 10-50 ms backoff. */
    assert_true(test_now_ms() - t0 >= 390);
    assert_int_equal(fake_request_count(c->fake), 2);
    provider_stop(c);
}

static void test_retry_info_too_long(void **state)
{
    ctx *c = setup("{\"responses\":[{\"status\":429,\"error\":{\"message\":"
                   "\"quota\",\"details\":[{\"@type\":\"type.googleapis.com/"
                   "google.rpc.RetryInfo\",\"retryDelay\":\"120s\"}]}},"
                   "{\"text\":[\"ok\"]}]}",
                   2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(fake_request_count(c->fake), 1);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_RATE_LIMIT);
    assert_string_equal(c->resp.error.type, "RESOURCE_EXHAUSTED");
    assert_string_equal(c->resp.error.message, "quota");
    provider_stop(c);
}

static void test_5xx_exhausted(void **state)
{
    ctx *c = setup("{\"loop\":true,\"responses\":[{\"status\":503,\"error\":"
                   "{\"message\":\"The model is overloaded.\"}}]}",
                   2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(c->resp.error.attempts, 3);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_SERVER);
    assert_int_equal(c->resp.error.http_status, 503);
    assert_string_equal(c->resp.error.type, "UNAVAILABLE");
    assert_non_null(strstr(loom_error_last(),
                           "gem: 503 server: The model is overloaded. after 3 "
                           "attempts"));
    assert_int_equal(fake_request_count(c->fake), 3);
    provider_stop(c);
}

static void test_400_not_retried(void **state)
{
    ctx *c = setup("{\"responses\":[{\"status\":400,\"error\":{\"message\":"
                   "\"API key not valid.\"}},{\"text\":[\"ok\"]}]}",
                   2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(fake_request_count(c->fake), 1);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_BAD_REQUEST);
    assert_string_equal(c->resp.error.type, "INVALID_ARGUMENT");
    assert_string_equal(c->resp.error.message, "API key not valid.");
    provider_stop(c);
}

static void test_recorded_404(void **state)
{
    char *path = test_vector_path("gemini/error-0.sse");
    ctx *c = setup_fake(fake_start_replay(path, 0), 2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(fake_request_count(c->fake), 1);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_NOT_FOUND);
    assert_int_equal(c->resp.error.http_status, 404);
    assert_string_equal(c->resp.error.type, "NOT_FOUND");
    assert_non_null(strstr(c->resp.error.message, "is not found"));
    free(path);
    provider_stop(c);
}

static void test_stream_error_before_output(void **state)
{
    ctx *c = setup("{\"responses\":[{\"stream_error\":{\"code\":503,"
                   "\"message\":\"overloaded\"}},{\"text\":[\"ok\"]},"
                   "{\"stream_error\":{\"code\":400,\"message\":\"bad\"}},"
                   "{\"text\":[\"ok\"]}]}",
                   2);

    (void)state;
    /* A 503 inside the stream before any output is retried... */
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "ok");
    assert_int_equal(c->resp.error.attempts, 2);
    /* ... a 400 is not. */
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_STREAM);
    assert_string_equal(c->resp.error.message, "bad");
    assert_string_equal(c->resp.error.type, "INVALID_ARGUMENT");
    assert_int_equal(c->resp.error.attempts, 1);
    assert_int_equal(fake_request_count(c->fake), 3);
    provider_stop(c);
}

static void test_stream_error_after_output(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"Hel\"],\"stream_error\":"
                   "{\"code\":503,\"message\":\"overloaded\"}},"
                   "{\"text\":[\"ok\"]}]}",
                   2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(fake_request_count(c->fake), 1);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_STREAM);
    assert_string_equal(c->resp.error.message, "overloaded");
    assert_string_equal(c->resp.text, "Hel");
    assert_true(c->resp.output_started);
    provider_stop(c);
}

static void test_disconnect_after_output(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"a\",\"b\",\"c\"],"
                   "\"disconnect_after_chunks\":1},{\"text\":[\"ok\"]}]}",
                   2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(fake_request_count(c->fake), 1);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_CONNECTION);
    assert_string_equal(c->resp.text, "a");
    assert_null(c->resp.finish_reason);
    provider_stop(c);
}

static void test_disconnect_before_output(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"a\"],"
                   "\"disconnect_after_chunks\":0},{\"text\":[\"ok\"]}]}",
                   2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_int_equal(fake_request_count(c->fake), 2);
    assert_string_equal(c->resp.text, "ok");
    assert_string_equal(loom_buf_cstr(&c->events_text), "ok");
    provider_stop(c);
}

static void test_cancel(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"a\",\"b\"],\"hang\":true,"
                   "\"hang_after_chunks\":1}]}",
                   2);
    long long t0 = test_now_ms();

    (void)state;
    assert_int_equal(provider_run_canceled(c, 200), LOOM_ECANCELED);
    assert_true(test_now_ms() - t0 < 5000);
    assert_string_equal(c->resp.text, "a");
    assert_int_equal(fake_request_count(c->fake), 1);
    provider_stop(c);
}

static void test_callback_abort(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"a\",\"b\"]},"
                   "{\"text\":[\"ok\"]}]}",
                   2);

    (void)state;
    c->abort_on_text = 1;
    assert_int_equal(provider_run(c, NULL), LOOM_ECANCELED);
    assert_int_equal(fake_request_count(c->fake), 1);
    provider_stop(c);
}

/* ---- limits ------------------------------------------------------------ */

static void test_json_body_limit(void **state)
{
    /* 120 bytes of text in a whole body: past 100, within 200. */
    ctx *c = setup("{\"loop\":true,\"responses\":[{\"text\":[\"012345678901"
                   "234567890123456789\"]}]}",
                   0);
    loom__gemini_limits lim = {0, 0, 0, 0, 100};

    (void)state;
    c->req.stream = 0;
    loom__gemini_provider_set_limits(c->p, &lim);
    assert_int_equal(provider_run(c, NULL), LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "gem: "));
    lim.max_body = 400;
    loom__gemini_provider_set_limits(c->p, &lim);
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "012345678901234567890123456789");
    provider_stop(c);
}

static void test_stream_text_limit(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"0123\",\"45678\"]}]}", 2);
    loom__gemini_limits lim = {0, 0, 8, 0, 0};

    (void)state;
    loom__gemini_provider_set_limits(c->p, &lim);
    assert_int_equal(provider_run(c, NULL), LOOM_ETOOLARGE);
    assert_string_equal(c->resp.text, "0123");
    assert_int_equal(fake_request_count(c->fake), 1);
    provider_stop(c);
}

/* ---- whole runs ---------------------------------------------------------- */

typedef struct {
    loom_fake *fake;
    loom_provider_config pc;
    loom_provider *provider;
    loom_tool_registry *reg;
    loom_run *run;
    int rc;
} harness;

static void run_script(harness *h, const char *script, int max_iterations)
{
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};

    memset(h, 0, sizeof(*h));
    h->fake = fake_start_script(script);
    assert_non_null(h->fake);
    provider_config(&h->pc, h->fake, NULL, "gem", "gemini", "gk-test", NULL, 0);
    assert_int_equal(loom_provider_new(&h->provider, &h->pc), 0);
    h->reg = provider_tools();
    ro.provider = h->provider;
    ro.model = "gem/gemini-test";
    ro.upstream_model = "gemini-test";
    ro.tools = h->reg;
    ro.system_prompt = "You are terse.";
    ro.max_iterations = max_iterations;
    ro.thinking_budget = 512;
    ro.temperature = -1.0;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "question"), 0);
    assert_int_equal(loom_run_new(&h->run, &ro, &hist), 0);
    loom_messages_free(&hist);
    h->rc = loom_run_execute(h->run);
}

static void harness_free(harness *h)
{
    loom_run_free(h->run);
    loom_provider_free(h->provider);
    loom_tool_registry_free(h->reg);
    json_decref(h->pc.headers);
    fake_stop(h->fake);
}

static void test_run_tool_loop(void **state)
{
    harness h;
    json_t *reqs, *body, *contents;
    (void)state;

    run_script(&h,
               "{\"responses\":["
               "{\"reasoning\":[\"Two tools.\"],\"tool_calls\":["
               "{\"name\":\"echo\",\"arguments\":\"{\\\"text\\\":\\\"one\\\"}"
               "\"},{\"name\":\"fail\",\"arguments\":\"{}\"}],"
               "\"thought_signature\":\"c2lnLTE=\",\"usage\":{"
               "\"prompt_tokens\":10,\"completion_tokens\":5,"
               "\"total_tokens\":15}},"
               "{\"text\":[\"All \",\"done.\"],\"usage\":{\"prompt_tokens\":"
               "30,\"completion_tokens\":3,\"total_tokens\":33}}]}",
               5);
    assert_int_equal(h.rc, 0);
    assert_string_equal(loom_run_text(h.run), "All done.");
    assert_string_equal(loom_run_finish_reason(h.run), "stop");
    assert_int_equal(loom_run_iterations(h.run), 2);
    assert_int_equal(loom_run_usage(h.run)->prompt_tokens, 40);
    assert_int_equal(loom_run_usage(h.run)->total_tokens, 48);

    reqs = fake_requests(h.fake);
    assert_int_equal(json_array_size(reqs), 2);
    body = json_object_get(json_array_get(reqs, 0), "body");
    assert_json(json_object_get(body, "systemInstruction"),
                "{\"parts\":[{\"text\":\"You are terse.\"}]}");
    assert_json(json_object_get(body, "generationConfig"),
                "{\"thinkingConfig\":{\"thinkingBudget\":512,"
                "\"includeThoughts\":true}}");
    assert_int_equal(json_array_size(json_object_get(
                         json_array_get(json_object_get(body, "tools"), 0),
                         "functionDeclarations")),
                     2);
    /* The second request: the model's turn with its signature, then both
     * results (the failure as text) in one user turn. */
    body = json_object_get(json_array_get(reqs, 1), "body");
    contents = json_object_get(body, "contents");
    assert_int_equal(json_array_size(contents), 3);
    assert_json(json_array_get(contents, 1),
                "{\"role\":\"model\",\"parts\":["
                "{\"functionCall\":{\"name\":\"echo\",\"args\":{\"text\":"
                "\"one\"}},\"thoughtSignature\":\"c2lnLTE=\"},"
                "{\"functionCall\":{\"name\":\"fail\",\"args\":{}}}]}");
    assert_json(json_array_get(contents, 2),
                "{\"role\":\"user\",\"parts\":["
                "{\"functionResponse\":{\"name\":\"echo\",\"response\":"
                "{\"result\":\"echo:one\"}}},"
                "{\"functionResponse\":{\"name\":\"fail\",\"response\":"
                "{\"result\":\"Error: disk on fire\"}}}]}");
    json_decref(reqs);
    harness_free(&h);
}

static void test_run_iteration_limit(void **state)
{
    harness h;
    json_t *reqs, *last;
    const char *sys;
    (void)state;

    run_script(&h,
               "{\"responses\":["
               "{\"tool_calls\":[{\"name\":\"echo\",\"arguments\":"
               "\"{\\\"text\\\":\\\"1\\\"}\"}]},"
               "{\"text\":[\"Here is what I found.\"]}]}",
               2);
    assert_int_equal(h.rc, 0);
    assert_string_equal(loom_run_text(h.run), "Here is what I found.");
    assert_int_equal(loom_run_iterations(h.run), 2);
    reqs = fake_requests(h.fake);
    assert_int_equal(json_array_size(reqs), 2);
    last = json_object_get(json_array_get(reqs, 1), "body");
    /* The last permitted call forbids calls (mode NONE); the limit note
     * joins the system instruction. */
    assert_non_null(json_object_get(last, "tools"));
    assert_string_equal(
        json_string_value(json_object_get(
            json_object_get(json_object_get(last, "toolConfig"),
                            "functionCallingConfig"),
            "mode")),
        "NONE");
    sys = json_string_value(json_object_get(
        json_array_get(json_object_get(
                           json_object_get(last, "systemInstruction"), "parts"),
                       1),
        "text"));
    assert_non_null(sys);
    assert_non_null(strstr(sys, "limit of 2 model calls"));
    json_decref(reqs);
    harness_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_text),
        cmocka_unit_test(test_non_streamed),
        cmocka_unit_test(test_parallel_calls_state_round_trip),
        cmocka_unit_test(test_reasoning_round_trip),
        cmocka_unit_test(test_stream_answered_with_json),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_429_retried),
        cmocka_unit_test(test_retry_info_honoured),
        cmocka_unit_test(test_retry_info_too_long),
        cmocka_unit_test(test_5xx_exhausted),
        cmocka_unit_test(test_400_not_retried),
        cmocka_unit_test(test_recorded_404),
        cmocka_unit_test(test_stream_error_before_output),
        cmocka_unit_test(test_stream_error_after_output),
        cmocka_unit_test(test_disconnect_after_output),
        cmocka_unit_test(test_disconnect_before_output),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_callback_abort),
        cmocka_unit_test(test_json_body_limit),
        cmocka_unit_test(test_stream_text_limit),
        cmocka_unit_test(test_run_tool_loop),
        cmocka_unit_test(test_run_iteration_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
