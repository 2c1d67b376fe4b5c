/*
 * The "openai" provider end to end against loom-fake-upstream: what loom
 * sends, streamed and non-streamed answers, retries (and when not to
 * retry), the connect timeout, cancellation, limits, and the HTTP
 * client's connection reuse and error-body cap (the first-byte and idle
 * timeouts of every adapter: test_provider_timeouts.c). Time checks are
 * lower bounds or generous upper bounds only, so a loaded machine cannot
 * make them flaky.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/fiber.h"
#include "core/http.h"
#include "fake.h"
#include "llm/openai.h"
#include "loom/buf.h"
#include "loom/llm.h"
#include "on_fiber.h"
#include "provider_harness.h"
#include "testutil.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef provider_ctx ctx;

/* Starts a fake with script and a provider in front of it. base_url NULL:
 * the fake's. */
static ctx *setup(const char *script, const char *base_url, int retries)
{
    loom_fake *f = script ? fake_start_script(script) : NULL;

    assert_true(!script || f);
    return provider_start(f, base_url, "openai", "openai", "sk-test",
                          json_pack("{s:s}", "X-Extra", "v1"), "gpt-test",
                          retries);
}

/* ---- happy paths ----------------------------------------------------- */

static void test_stream_text(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"Hel\",\"lo\"],\"usage\":"
                   "{\"prompt_tokens\":3,\"completion_tokens\":2,"
                   "\"total_tokens\":5}}]}",
                   NULL, 2);
    json_t *r, *h, *b;

    (void)state;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "Hello");
    assert_string_equal(loom_buf_cstr(&c->events_text), "Hello");
    assert_string_equal(c->resp.finish_reason, "stop");
    assert_non_null(c->resp.response_id);
    assert_int_equal(c->resp.usage.prompt_tokens, 3);
    assert_int_equal(c->resp.usage.completion_tokens, 2);
    assert_int_equal(c->resp.usage.total_tokens, 5);
    assert_int_equal(c->resp.error.attempts, 1);
    assert_int_equal(c->resp.output_started, 1);

    /* what loom sent */
    assert_int_equal(fake_request_count(c->fake), 1);
    r = fake_request(c->fake, 0);
    assert_non_null(r);
    assert_string_equal(json_string_value(json_object_get(r, "method")),
                        "POST");
    assert_string_equal(json_string_value(json_object_get(r, "path")),
                        "/v1/chat/completions");
    h = json_object_get(r, "headers");
    assert_string_equal(json_string_value(json_object_get(h, "authorization")),
                        "Bearer sk-test");
    assert_string_equal(json_string_value(json_object_get(h, "content-type")),
                        "application/json");
    assert_string_equal(json_string_value(json_object_get(h, "accept")),
                        "text/event-stream");
    assert_string_equal(json_string_value(json_object_get(h, "x-extra")), "v1");
    assert_memory_equal(json_string_value(json_object_get(h, "user-agent")),
                        "loom/", 5);
    assert_null(json_object_get(h, "expect"));
    b = json_object_get(r, "body");
    assert_string_equal(json_string_value(json_object_get(b, "model")),
                        "gpt-test");
    assert_true(json_is_true(json_object_get(b, "stream")));
    assert_true(json_is_true(json_object_get(
        json_object_get(b, "stream_options"), "include_usage")));
    assert_string_equal(
        json_string_value(json_object_get(
            json_array_get(json_object_get(b, "messages"), 0), "content")),
        "Hi");
    assert_null(json_object_get(b, "tools"));
    json_decref(r);
    provider_stop(c);
}

static void test_no_api_key(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"ok\"]}]}", NULL, 0);
    json_t *r;

    (void)state;
    c->cfg.api_key = NULL;
    provider_reconfigure(c);
    assert_int_equal(provider_run(c, NULL), 0);
    r = fake_request(c->fake, 0);
    assert_null(
        json_object_get(json_object_get(r, "headers"), "authorization"));
    json_decref(r);
    provider_stop(c);
}

static void test_config_headers(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"ok\"]}]}", NULL, 0);
    char url[256];
    json_t *r, *h;

    (void)state;
    /* a configured Authorization replaces the key's; a trailing slash in
     * base_url is ignored */
    snprintf(url, sizeof(url), "%s/", fake_base_url(c->fake));
    c->cfg.base_url = url;
    json_decref(c->cfg.headers);
    c->cfg.headers =
        json_pack("{s:s,s:i}", "Authorization", "Token abc", "X-Num", 7);
    provider_reconfigure(c);
    assert_int_equal(provider_run(c, NULL), 0);
    r = fake_request(c->fake, 0);
    h = json_object_get(r, "headers");
    assert_string_equal(json_string_value(json_object_get(r, "path")),
                        "/v1/chat/completions");
    assert_string_equal(json_string_value(json_object_get(h, "authorization")),
                        "Token abc");
    assert_string_equal(json_string_value(json_object_get(h, "x-num")), "7");
    json_decref(r);
    provider_stop(c);
}

static void test_config_invalid(void **state)
{
    loom_provider_config cfg = {0};
    loom_provider *p = NULL;
    const char *bad[] = {"{\"Bad Name\":\"x\"}", "{\"X-A\":\"a\\r\\nb\"}",
                         "{\"X-A\":true}", "{\"X:A\":\"x\"}"};

    (void)state;
    cfg.name = "p";
    cfg.kind = "openai";
    cfg.base_url = "http://127.0.0.1:1/v1";
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cfg.headers = json_loads(bad[i], 0, NULL);
        assert_non_null(cfg.headers);
        assert_int_equal(loom_provider_new(&p, &cfg), LOOM_EINVALID);
        assert_null(p);
        assert_non_null(strstr(loom_error_last(), "provider 'p'"));
        json_decref(cfg.headers);
    }
    cfg.headers = NULL;
    cfg.api_key = "sk\nx";
    assert_int_equal(loom_provider_new(&p, &cfg), LOOM_EINVALID);
    cfg.api_key = NULL;
    cfg.base_url = NULL;
    assert_int_equal(loom_provider_new(&p, &cfg), LOOM_EINVALID);
}

static void test_tool_calls_streamed(void **state)
{
    ctx *c = setup("{\"responses\":[{\"interleave\":true,\"tool_calls\":["
                   "{\"id\":\"call_a\",\"name\":\"get_weather\",\"arguments\":"
                   "[\"{\\\"city\\\":\",\"\\\"Paris\\\"}\"]},"
                   "{\"id\":\"call_b\",\"name\":\"get_time\",\"arguments\":"
                   "[\"{\\\"tz\\\":\",\"\\\"UTC\\\"}\"]}]}]}",
                   NULL, 0);

    (void)state;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_int_equal(c->resp.tool_calls_len, 2);
    assert_string_equal(c->resp.tool_calls[0].id, "call_a");
    assert_string_equal(c->resp.tool_calls[0].name, "get_weather");
    assert_string_equal(c->resp.tool_calls[0].arguments,
                        "{\"city\":\"Paris\"}");
    assert_string_equal(c->resp.tool_calls[1].id, "call_b");
    assert_string_equal(c->resp.tool_calls[1].arguments, "{\"tz\":\"UTC\"}");
    assert_string_equal(c->resp.finish_reason, "tool_calls");
    provider_stop(c);
}

static void test_non_streamed(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"Hel\",\"lo\"],\"reasoning\":"
                   "[\"hm\"],\"tool_calls\":[{\"id\":\"c1\",\"name\":\"f\","
                   "\"arguments\":[\"{}\"]}],\"usage\":{\"prompt_tokens\":4,"
                   "\"completion_tokens\":1,\"total_tokens\":5}}]}",
                   NULL, 0);
    json_t *r, *h, *b;

    (void)state;
    c->req.stream = 0;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "Hello");
    assert_string_equal(c->resp.reasoning, "hm");
    assert_int_equal(c->resp.tool_calls_len, 1);
    assert_string_equal(c->resp.tool_calls[0].name, "f");
    assert_int_equal(c->resp.usage.total_tokens, 5);
    r = fake_request(c->fake, 0);
    h = json_object_get(r, "headers");
    b = json_object_get(r, "body");
    assert_string_equal(json_string_value(json_object_get(h, "accept")),
                        "application/json");
    assert_null(json_object_get(b, "stream"));
    assert_null(json_object_get(b, "stream_options"));
    json_decref(r);
    provider_stop(c);
}

static void test_stream_answered_with_json(void **state)
{
    /* a server that ignores "stream": true */
    ctx *c = setup("{\"responses\":[{\"content_type\":\"application/json\","
                   "\"body\":\"{\\\"id\\\":\\\"x\\\",\\\"choices\\\":[{"
                   "\\\"index\\\":0,\\\"message\\\":{\\\"content\\\":"
                   "\\\"plain\\\"},\\\"finish_reason\\\":\\\"stop\\\"}]}\"}]}",
                   NULL, 0);

    (void)state;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "plain");
    assert_string_equal(c->resp.finish_reason, "stop");
    provider_stop(c);
}

/* ---- errors and retries ---------------------------------------------- */

static void test_429_retry_after(void **state)
{
    ctx *c = setup("{\"responses\":[{\"status\":429,\"headers\":{"
                   "\"Retry-After\":\"1\"},\"error\":{\"message\":\"slow "
                   "down\",\"type\":\"rate_limit\"}},{\"text\":[\"ok\"]}]}",
                   NULL, 2);
    long long t0 = test_now_ms();

    (void)state;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_true(test_now_ms() - t0 >= 950);
    assert_string_equal(c->resp.text, "ok");
    assert_int_equal(c->resp.error.attempts, 2);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_NONE);
    assert_int_equal(fake_request_count(c->fake), 2);
    provider_stop(c);
}

static void test_retry_after_ms(void **state)
{
    /* retry-after-ms wins over Retry-After */
    ctx *c = setup("{\"responses\":[{\"status\":429,\"headers\":{"
                   "\"retry-after-ms\":\"300\",\"Retry-After\":\"40\"},"
                   "\"error\":{\"message\":\"x\"}},{\"text\":[\"ok\"]}]}",
                   NULL, 1);
    long long t0 = test_now_ms(), dt;

    (void)state;
    assert_int_equal(provider_run(c, NULL), 0);
    dt = test_now_ms() - t0;
    assert_true(dt >= 290);
    assert_true(dt < 30000);
    assert_int_equal(fake_request_count(c->fake), 2);
    provider_stop(c);
}

static void test_retry_after_too_long(void **state)
{
    ctx *c = setup("{\"responses\":[{\"status\":429,\"headers\":{"
                   "\"Retry-After\":\"120\",\"x-request-id\":\"req_9\"},"
                   "\"error\":{\"message\":\"quota\",\"type\":\"tokens\"}},"
                   "{\"text\":[\"ok\"]}]}",
                   NULL, 2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(fake_request_count(c->fake), 1);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_RATE_LIMIT);
    assert_int_equal(c->resp.error.http_status, 429);
    assert_string_equal(c->resp.error.message, "quota");
    assert_string_equal(c->resp.error.type, "tokens");
    assert_string_equal(c->resp.error.request_id, "req_9");
    assert_string_equal(loom_error_last(),
                        "openai: 429 rate_limit: quota (request req_9)");
    provider_stop(c);
}

/* The error's rate-limit headers are kept for a server to pass on: only
 * those, names in lower case, a value past the limit left out. */
static void test_rate_headers_kept(void **state)
{
    char long_value[LOOM__RATE_HEADER_VALUE_MAX + 2], script[1024];
    const json_t *h;
    ctx *c;

    (void)state;
    memset(long_value, '7', sizeof(long_value) - 1);
    long_value[sizeof(long_value) - 1] = '\0';
    snprintf(script, sizeof(script),
             "{\"responses\":[{\"status\":429,\"headers\":{"
             "\"Retry-After\":\"120\",\"X-RateLimit-Reset-Tokens\":"
             "\"6m0s\",\"x-ratelimit-remaining-requests\":\"0\","
             "\"x-ratelimit-long\":\"%s\",\"x-request-id\":\"req_9\","
             "\"Set-Cookie\":\"a=b\"},\"error\":{\"message\":\"quota\"}}]}",
             long_value);
    c = setup(script, NULL, 0);
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    h = c->resp.error.headers;
    assert_non_null(h);
    assert_int_equal(json_object_size(h), 3);
    assert_string_equal(json_string_value(json_object_get(h, "retry-after")),
                        "120");
    assert_string_equal(
        json_string_value(json_object_get(h, "x-ratelimit-reset-tokens")),
        "6m0s");
    assert_string_equal(
        json_string_value(json_object_get(h, "x-ratelimit-remaining-requests")),
        "0");
    provider_stop(c);
}

static void test_500_then_ok(void **state)
{
    ctx *c = setup("{\"responses\":[{\"status\":500,\"error\":{\"message\":"
                   "\"oops\"}},{\"status\":503,\"body\":\"busy\"},"
                   "{\"text\":[\"ok\"]}]}",
                   NULL, 2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "ok");
    assert_int_equal(c->resp.error.attempts, 3);
    assert_int_equal(fake_request_count(c->fake), 3);
    provider_stop(c);
}

static void test_retries_exhausted(void **state)
{
    ctx *c = setup("{\"loop\":true,\"responses\":[{\"status\":502,\"body\":"
                   "\"bad gateway\"}]}",
                   NULL, 2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(fake_request_count(c->fake), 3);
    assert_int_equal(c->resp.error.attempts, 3);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_SERVER);
    assert_string_equal(c->resp.error.message, "bad gateway");
    assert_non_null(strstr(loom_error_last(), "after 3 attempts"));
    assert_string_equal(c->resp.text, "");
    provider_stop(c);
}

static void test_max_retries_zero(void **state)
{
    ctx *c = setup("{\"responses\":[{\"status\":500,\"error\":{\"message\":"
                   "\"oops\"}},{\"text\":[\"ok\"]}]}",
                   NULL, 0);

    (void)state;
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(fake_request_count(c->fake), 1);
    assert_int_equal(c->resp.error.attempts, 1);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_SERVER);
    provider_stop(c);
}

static void test_401_not_retried(void **state)
{
    ctx *c = setup("{\"responses\":[{\"status\":401,\"error\":{\"message\":"
                   "\"Incorrect API key provided\",\"type\":"
                   "\"invalid_request_error\"}},{\"text\":[\"ok\"]}]}",
                   NULL, 2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(fake_request_count(c->fake), 1);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_AUTH);
    assert_int_equal(c->resp.error.http_status, 401);
    assert_string_equal(c->resp.error.message, "Incorrect API key provided");
    assert_string_equal(c->resp.error.type, "invalid_request_error");
    assert_non_null(strstr(loom_error_last(), "401 authentication: "
                                              "Incorrect API key provided"));
    provider_stop(c);
}

static void test_stream_error_after_output(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"Hel\"],\"stream_error\":"
                   "{\"message\":\"overloaded\",\"type\":\"server_error\"}},"
                   "{\"text\":[\"ok\"]}]}",
                   NULL, 2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(fake_request_count(c->fake), 1);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_STREAM);
    assert_string_equal(c->resp.error.message, "overloaded");
    assert_string_equal(c->resp.text, "Hel");
    assert_int_equal(c->resp.output_started, 1);
    provider_stop(c);
}

static void test_disconnect_after_output(void **state)
{
    /* chunk 0 is the role chunk, chunk 1 "a": cut after them */
    ctx *c = setup("{\"responses\":[{\"text\":[\"a\",\"b\",\"c\"],"
                   "\"disconnect_after_chunks\":2},{\"text\":[\"ok\"]}]}",
                   NULL, 2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(fake_request_count(c->fake), 1);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_CONNECTION);
    assert_string_equal(c->resp.text, "a");
    assert_int_equal(c->resp.output_started, 1);
    assert_null(c->resp.finish_reason);
    provider_stop(c);
}

static void test_disconnect_before_output(void **state)
{
    /* only the role chunk (no text) came: safe to retry */
    ctx *c = setup("{\"responses\":[{\"text\":[\"a\"],"
                   "\"disconnect_after_chunks\":1},{\"text\":[\"ok\"]}]}",
                   NULL, 2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_int_equal(fake_request_count(c->fake), 2);
    assert_string_equal(c->resp.text, "ok");
    assert_string_equal(loom_buf_cstr(&c->events_text), "ok");
    provider_stop(c);
}

/*
 * A port nothing listens on, held for as long as *fd stays open: a TCP
 * socket bound to 127.0.0.1:0 and never listening, so a connect there is
 * refused, and no other socket (without SO_REUSEADDR on both) can take
 * the port meanwhile. The caller closes *fd.
 */
static int refusing_port(int *fd)
{
    struct sockaddr_in sa;
    socklen_t len = sizeof(sa);

    *fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(*fd >= 0);
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(*fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(getsockname(*fd, (struct sockaddr *)&sa, &len), 0);
    return ntohs(sa.sin_port);
}

static void test_connection_refused(void **state)
{
    char url[64];
    ctx *c;
    int fd;

    (void)state;
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1", refusing_port(&fd));
    c = setup(NULL, url, 2);
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_CONNECTION);
    assert_int_equal(c->resp.error.attempts, 3);
    assert_int_equal(c->resp.error.http_status, 0);
    assert_non_null(c->resp.error.message);
    assert_non_null(strstr(loom_error_last(), "openai: connection: "));
    assert_string_equal(c->resp.text, "");
    provider_stop(c);
    close(fd);
}

/* ---- timeouts and cancellation --------------------------------------- */

/*
 * A listening socket whose accept queue is full and never drained: the
 * kernel drops further SYNs, so a new connect hangs. Returns the port;
 * the descriptors are closed by the caller.
 */
static int stuck_listener(int fds[4])
{
    struct sockaddr_in sa;
    socklen_t len = sizeof(sa);
    int port;

    fds[0] = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fds[0] >= 0);
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fds[0], (struct sockaddr *)&sa, sizeof(sa)), 0);
    assert_int_equal(listen(fds[0], 0), 0);
    assert_int_equal(getsockname(fds[0], (struct sockaddr *)&sa, &len), 0);
    port = ntohs(sa.sin_port);
    for (int i = 1; i < 4; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        assert_true(fds[i] >= 0);
        connect(fds[i], (struct sockaddr *)&sa, sizeof(sa));
    }
    return port;
}

static void test_connect_timeout(void **state)
{
    char url[64];
    int fds[4];
    long long t0;
    ctx *c;

    (void)state;
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1", stuck_listener(fds));
    c = setup(NULL, url, 1);
    c->cfg.connect_timeout_ms = 200;
    provider_reconfigure(c);
    t0 = test_now_ms();
    assert_int_equal(provider_run(c, NULL), LOOM_ETIMEDOUT);
    assert_true(test_now_ms() - t0 >= 2 * 190);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_TIMEOUT);
    /* a connect timeout is retried: nothing was sent */
    assert_int_equal(c->resp.error.attempts, 2);
    assert_non_null(strstr(loom_error_last(), "connect timeout"));
    provider_stop(c);
    for (int i = 0; i < 4; i++)
        close(fds[i]);
}

static void test_slow_chunks_within_idle(void **state)
{
    /* gaps shorter than the idle timeout are fine, whatever the total */
    ctx *c = setup("{\"responses\":[{\"text\":[\"a\",\"b\",\"c\"],"
                   "\"chunk_delay_ms\":150}]}",
                   NULL, 0);

    (void)state;
    c->cfg.idle_timeout_ms = 2000;
    c->cfg.first_byte_timeout_ms = 2000;
    provider_reconfigure(c);
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "abc");
    provider_stop(c);
}

static void test_cancel_during_hang(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"a\"],\"hang\":true,"
                   "\"hang_after_chunks\":2}]}",
                   NULL, 2);
    long long t0 = test_now_ms();

    (void)state;
    assert_int_equal(provider_run_canceled(c, 200), LOOM_ECANCELED);
    assert_true(test_now_ms() - t0 < 5000);
    assert_string_equal(c->resp.text, "a"); /* what came is kept */
    assert_int_equal(fake_request_count(c->fake), 1);
    provider_stop(c);
}

static void test_cancel_during_backoff(void **state)
{
    ctx *c = setup("{\"responses\":[{\"status\":429,\"headers\":{"
                   "\"Retry-After\":\"30\"},\"error\":{\"message\":\"x\"}},"
                   "{\"text\":[\"ok\"]}]}",
                   NULL, 2);
    long long t0 = test_now_ms();

    (void)state;
    assert_int_equal(provider_run_canceled(c, 200), LOOM_ECANCELED);
    assert_true(test_now_ms() - t0 < 20000);
    assert_int_equal(fake_request_count(c->fake), 1);
    provider_stop(c);
}

static void test_cancel_before_start(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"ok\"]}]}", NULL, 2);
    loom_cancel cancel = LOOM_CANCEL_INIT;

    (void)state;
    loom_cancel_set(&cancel);
    assert_int_equal(provider_run(c, &cancel), LOOM_ECANCELED);
    assert_int_equal(fake_request_count(c->fake), 0);
    provider_stop(c);
}

static void test_callback_abort(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"a\",\"b\"]},"
                   "{\"text\":[\"ok\"]}]}",
                   NULL, 2);

    (void)state;
    c->abort_on_text = 1;
    assert_int_equal(provider_run(c, NULL), LOOM_ECANCELED);
    assert_int_equal(fake_request_count(c->fake), 1);
    provider_stop(c);
}

/* ---- limits ---------------------------------------------------------- */

static void test_non_streamed_body_limit(void **state)
{
    ctx *c = setup("{\"responses\":[{\"text\":[\"0123456789"
                   "0123456789012345678901234567890123456789\"]},"
                   "{\"content_type\":\"application/json\",\"body\":"
                   "\"{\\\"choices\\\":[{\\\"index\\\":0,"
                   "\\\"message\\\":{\\\"content\\\":\\\"0123456789"
                   "0123456789012345678901234567890123456789012345678901"
                   "234567890123456789\\\"}}]}\"}]}",
                   NULL, 0);
    loom__openai_limits lim = {0, 0, 0, 100};

    (void)state;
    loom__openai_provider_set_limits(c->p, &lim);
    c->req.stream = 0;
    assert_int_equal(provider_run(c, NULL), LOOM_ETOOLARGE);
    /* the same limit holds when a streamed call gets JSON back */
    c->req.stream = 1;
    assert_int_equal(provider_run(c, NULL), LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "100 bytes"));
    assert_int_equal(fake_request_count(c->fake), 2);
    provider_stop(c);
}

static void test_stream_text_limit(void **state)
{
    ctx *c =
        setup("{\"responses\":[{\"text\":[\"0123\",\"45678\"]}]}", NULL, 2);
    loom__openai_limits lim = {0, 0, 8, 0};

    (void)state;
    loom__openai_provider_set_limits(c->p, &lim);
    assert_int_equal(provider_run(c, NULL), LOOM_ETOOLARGE);
    assert_string_equal(c->resp.text, "0123");
    assert_int_equal(fake_request_count(c->fake), 1);
    provider_stop(c);
}

static void test_error_body_cap(void **state)
{
    size_t big = LOOM_HTTP_MAX_ERROR_BODY + 512 * 1024;
    loom_buf script = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    loom__http_pool *pool;
    loom__http_request hreq = {0};
    loom__http_response hr = {0};
    char url[256], *fill = malloc(big + 1);
    loom_fake *f;
    ctx *c;

    (void)state;
    memset(fill, 'e', big);
    fill[big] = '\0';
    assert_int_equal(loom_buf_printf(&script,
                                     "{\"loop\":true,\"responses\":[{"
                                     "\"status\":400,\"body\":\"%s\"}]}",
                                     fill),
                     0);
    free(fill);
    f = fake_start_script(script.ptr);
    assert_non_null(f);
    loom_buf_free(&script);

    /* the HTTP client keeps 1 MiB of it */
    assert_int_equal(loom__http_pool_new(&pool), 0);
    snprintf(url, sizeof(url), "%s/chat/completions", fake_base_url(f));
    hreq.url = url;
    hreq.body = "{}";
    hreq.body_len = 2;
    assert_int_equal(loom__http_perform(pool, &hreq, &hr), 0);
    assert_int_equal(hr.status, 400);
    assert_int_equal(hr.body.len, LOOM_HTTP_MAX_ERROR_BODY);
    assert_int_equal(hr.body_truncated, 1);
    loom__http_response_clear(&hr);
    loom__http_pool_free(pool);

    /* the provider reports its head */
    c = setup(NULL, fake_base_url(f), 0);
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_BAD_REQUEST);
    assert_int_equal(strlen(c->resp.error.message), LOOM_OPENAI_MAX_ERROR_TEXT);
    provider_stop(c);
    fake_stop(f);
}

/* ---- the HTTP client itself ------------------------------------------ */

static const char *const json_hdrs[] = {"Content-Type: application/json"};
static const char json_body[] = "{\"stream\":false}";

/* A fake that answers "ok" to every request, a pool, and a request to the
 * fake's chat/completions (url holds that URL) posting json_body. */
static loom_fake *http_start(loom__http_pool **pool, loom__http_request *hreq,
                             char *url, size_t url_size)
{
    loom_fake *f = fake_start_script("{\"loop\":true,\"responses\":[{"
                                     "\"text\":[\"ok\"]}]}");

    assert_non_null(f);
    assert_int_equal(loom__http_pool_new(pool), 0);
    snprintf(url, url_size, "%s/chat/completions", fake_base_url(f));
    memset(hreq, 0, sizeof(*hreq));
    hreq->url = url;
    hreq->headers = json_hdrs;
    hreq->headers_len = 1;
    hreq->body = json_body;
    hreq->body_len = strlen(json_body);
    return f;
}

static void test_http_reuse(void **state)
{
    const char *body = json_body;
    loom__http_pool *pool;
    loom__http_request hreq;
    loom__http_response hr = {0};
    char url[256];
    loom_fake *f = http_start(&pool, &hreq, url, sizeof(url));

    (void)state;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(loom__http_perform(pool, &hreq, &hr), 0);
        assert_int_equal(hr.status, 200);
        assert_non_null(strstr(loom_buf_cstr(&hr.body), "chat.completion"));
        assert_non_null(hr.content_type);
        /* the first call connects, the next ones reuse it */
        assert_int_equal(hr.new_connections, i == 0 ? 1 : 0);
        loom__http_response_clear(&hr);
    }
    /* GET, with the body kept in memory */
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/_fake/stats", fake_port(f));
    hreq.method = "GET";
    hreq.body = NULL;
    hreq.body_len = 0;
    assert_int_equal(loom__http_perform(pool, &hreq, &hr), 0);
    assert_int_equal(hr.status, 200);
    assert_non_null(strstr(loom_buf_cstr(&hr.body), "\"requests\":"));
    loom__http_response_clear(&hr);
    hreq.method = NULL;
    hreq.body = body;
    hreq.body_len = strlen(body);
    snprintf(url, sizeof(url), "%s/chat/completions", fake_base_url(f));
    /* a 2xx body kept in memory has a limit too */
    hreq.max_body = 10;
    assert_int_equal(loom__http_perform(pool, &hreq, &hr), LOOM_ETOOLARGE);
    loom__http_response_clear(&hr);
    loom__http_pool_free(pool);
    fake_stop(f);
}

/* Many model calls at once on one worker, twice: the second wave reuses
 * the connections of the first (a worker keeps as many idle connections
 * as a busy server has calls in flight, so pass-through at concurrency 64
 * does not connect again for every few requests). */
#define WAVE 48

typedef struct {
    pthread_mutex_t mu;
    loom__cond cv;
    int left;
} wave_count;

typedef struct {
    loom__http_pool *pool;
    loom__http_request hreq;
    long new_connections;
    int rc, status;
    wave_count *count;
} wave_call;

static void wave_call_run(void *arg)
{
    wave_call *c = arg;
    loom__http_response hr = {0};

    c->rc = loom__http_perform(c->pool, &c->hreq, &hr);
    c->status = (int)hr.status;
    c->new_connections = hr.new_connections;
    loom__http_response_clear(&hr);
    pthread_mutex_lock(&c->count->mu);
    if (--c->count->left == 0)
        loom__cond_broadcast(&c->count->cv);
    pthread_mutex_unlock(&c->count->mu);
}

static void test_http_reuse_wave(void **state)
{
    loom__http_pool *pool;
    loom__http_request hreq;
    char url[256];
    loom_fake *f;
    static wave_call calls[WAVE];
    wave_count count = {.mu = PTHREAD_MUTEX_INITIALIZER};
    long connects[2] = {0, 0};

    (void)state;
    f = fake_start_script("{\"loop\":true,\"responses\":[{"
                          "\"text\":[\"ok\"],\"delay_ms\":300}]}");
    assert_non_null(f);
    assert_int_equal(loom__http_pool_new(&pool), 0);
    snprintf(url, sizeof(url), "%s/chat/completions", fake_base_url(f));
    memset(&hreq, 0, sizeof(hreq));
    hreq.url = url;
    hreq.headers = json_hdrs;
    hreq.headers_len = 1;
    hreq.body = json_body;
    hreq.body_len = strlen(json_body);
    assert_int_equal(loom__cond_init(&count.cv), 0);
    for (int wave = 0; wave < 2; wave++) {
        count.left = WAVE;
        for (int i = 0; i < WAVE; i++) {
            calls[i] = (wave_call){pool, hreq, -1, -1, 0, &count};
            assert_int_equal(loom__fiber_spawn(loom__fiber_sched(),
                                               wave_call_run, &calls[i], 1),
                             0);
        }
        pthread_mutex_lock(&count.mu);
        while (count.left > 0)
            loom__cond_wait(&count.cv, &count.mu, -1);
        pthread_mutex_unlock(&count.mu);
        for (int i = 0; i < WAVE; i++) {
            assert_int_equal(calls[i].rc, 0);
            assert_int_equal(calls[i].status, 200);
            connects[wave] += calls[i].new_connections;
        }
    }
    /* All at once: one connection each, then none. */
    assert_int_equal(connects[0], WAVE);
    assert_int_equal(connects[1], 0);
    loom__cond_destroy(&count.cv);
    loom__http_pool_free(pool);
    fake_stop(f);
}

/* A URL libcurl cannot parse fails as before, from libcurl (the handle
 * is given URLs parsed by loom, core/http.c set_url), and the pair that
 * refused it then serves a good URL. */
static void test_http_bad_url(void **state)
{
    loom__http_pool *pool;
    loom__http_request hreq;
    loom__http_response hr = {0};
    char url[256];
    loom_fake *f = http_start(&pool, &hreq, url, sizeof(url));

    (void)state;
    hreq.url = "http://exa mple.invalid/v1";
    assert_int_equal(loom__http_perform(pool, &hreq, &hr), LOOM_EIO);
    assert_int_equal(hr.failure, LOOM_HTTP_FAIL_OTHER);
    assert_int_equal(hr.status, 0);
    assert_non_null(strstr(loom_error_last(), "http: "));
    loom__http_response_clear(&hr);
    hreq.url = url;
    assert_int_equal(loom__http_perform(pool, &hreq, &hr), 0);
    assert_int_equal(hr.status, 200);
    assert_non_null(strstr(loom_buf_cstr(&hr.body), "chat.completion"));
    loom__http_response_clear(&hr);
    loom__http_pool_free(pool);
    fake_stop(f);
}

/* A transfer held in its body callback until released, on a thread. */
typedef struct {
    loom__http_pool *pool;
    loom__http_request req;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int holding, released, rc;
    loom_buf got;
} held_call;

static int holding_body(const char *data, size_t len, void *payload)
{
    held_call *h = payload;

    pthread_mutex_lock(&h->mu);
    h->holding = 1;
    pthread_cond_broadcast(&h->cv);
    while (!h->released)
        pthread_cond_wait(&h->cv, &h->mu);
    pthread_mutex_unlock(&h->mu);
    return loom_buf_put(&h->got, data, len);
}

static void *held_thread(void *arg)
{
    held_call *h = arg;
    loom__http_response hr = {0};

    h->rc = loom__http_perform(h->pool, &h->req, &hr);
    if (h->rc == 0 && hr.status != 200)
        h->rc = -1;
    loom__http_response_clear(&hr);
    return NULL;
}

/* Performs a non-streamed call to url on pool; its answer's body. */
static char *call_text(loom__http_pool *pool, const char *url)
{
    loom__http_request hreq = {0};
    loom__http_response hr = {0};
    char *text;

    hreq.url = url;
    hreq.headers = json_hdrs;
    hreq.headers_len = 1;
    hreq.body = json_body;
    hreq.body_len = strlen(json_body);
    assert_int_equal(loom__http_perform(pool, &hreq, &hr), 0);
    assert_int_equal(hr.status, 200);
    text = strdup(loom_buf_cstr(&hr.body));
    loom__http_response_clear(&hr);
    return text;
}

/* New pairs copy the pool's last parsed URL (core/http.c set_url): with
 * one transfer held, a call to its URL makes a new pair from the copy,
 * and calls to another URL, then back, each reach their own server. */
static void test_http_new_pairs_urls(void **state)
{
    loom_fake *one = fake_start_script(
        "{\"loop\":true,\"responses\":[{\"text\":[\"one\"]}]}");
    loom_fake *two = fake_start_script(
        "{\"loop\":true,\"responses\":[{\"text\":[\"two\"]}]}");
    char url1[256], url2[256], *text;
    held_call h = {0};
    pthread_t th;

    (void)state;
    assert_non_null(one);
    assert_non_null(two);
    snprintf(url1, sizeof(url1), "%s/chat/completions", fake_base_url(one));
    snprintf(url2, sizeof(url2), "%s/chat/completions", fake_base_url(two));
    assert_int_equal(loom__http_pool_new(&h.pool), 0);
    pthread_mutex_init(&h.mu, NULL);
    pthread_cond_init(&h.cv, NULL);
    loom_buf_init(&h.got, 1 << 20);
    h.req.url = url1;
    h.req.headers = json_hdrs;
    h.req.headers_len = 1;
    h.req.body = json_body;
    h.req.body_len = strlen(json_body);
    h.req.on_body = holding_body;
    h.req.payload = &h;
    assert_int_equal(pthread_create(&th, NULL, held_thread, &h), 0);
    pthread_mutex_lock(&h.mu);
    while (!h.holding)
        pthread_cond_wait(&h.cv, &h.mu);
    pthread_mutex_unlock(&h.mu);
    for (int i = 0; i < 4; i++) {
        text = call_text(h.pool, i % 2 ? url2 : url1);
        assert_non_null(strstr(text, i % 2 ? "two" : "one"));
        assert_null(strstr(text, i % 2 ? "one" : "two"));
        free(text);
    }
    pthread_mutex_lock(&h.mu);
    h.released = 1;
    pthread_cond_broadcast(&h.cv);
    pthread_mutex_unlock(&h.mu);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_int_equal(h.rc, 0);
    assert_non_null(strstr(loom_buf_cstr(&h.got), "one"));
    assert_int_equal(fake_request_count(one), 3);
    assert_int_equal(fake_request_count(two), 2);
    loom_buf_free(&h.got);
    pthread_cond_destroy(&h.cv);
    pthread_mutex_destroy(&h.mu);
    loom__http_pool_free(h.pool);
    fake_stop(one);
    fake_stop(two);
}

/* on_body that parks its fiber on each piece (as a store write does):
 * the bytes that arrive meanwhile are neither lost nor moved under it. */
static int parking_body(const char *data, size_t len, void *payload)
{
    loom_buf *got = payload;

    loom__fiber_sleep(2);
    return loom_buf_put(got, data, len);
}

static void test_body_callback_parks(void **state)
{
    loom_fake *f = fake_start_script(
        "{\"loop\":true,\"responses\":[{\"text\":[\"a\",\"b\",\"c\",\"d\","
        "\"e\",\"f\",\"g\",\"h\"],\"chunk_delay_ms\":1}]}");
    const char *hdrs[] = {"Content-Type: application/json"};
    const char *body = "{\"stream\":true}";
    loom__http_pool *pool;
    loom__http_request hreq = {0};
    loom__http_response hr = {0};
    loom_buf got;
    char url[256];

    (void)state;
    assert_non_null(f);
    loom_buf_init(&got, 1 << 20);
    assert_int_equal(loom__http_pool_new(&pool), 0);
    snprintf(url, sizeof(url), "%s/chat/completions", fake_base_url(f));
    hreq.url = url;
    hreq.headers = hdrs;
    hreq.headers_len = 1;
    hreq.body = body;
    hreq.body_len = strlen(body);
    hreq.on_body = parking_body;
    hreq.payload = &got;
    assert_int_equal(loom__http_perform(pool, &hreq, &hr), 0);
    assert_int_equal(hr.status, 200);
    assert_int_equal(got.len, hr.body_bytes);
    assert_non_null(strstr(loom_buf_cstr(&got), "[DONE]"));
    loom__http_response_clear(&hr);
    loom_buf_free(&got);
    loom__http_pool_free(pool);
    fake_stop(f);
}

/* The same on a fiber: the transfer goes through its worker's multi
 * handle and the fiber parks (core/http.c). */
TEST_ON_FIBER(test_stream_text)
TEST_ON_FIBER(test_tool_calls_streamed)
TEST_ON_FIBER(test_non_streamed)
TEST_ON_FIBER(test_429_retry_after)
TEST_ON_FIBER(test_500_then_ok)
TEST_ON_FIBER(test_stream_error_after_output)
TEST_ON_FIBER(test_disconnect_after_output)
TEST_ON_FIBER(test_disconnect_before_output)
TEST_ON_FIBER(test_connection_refused)
TEST_ON_FIBER(test_slow_chunks_within_idle)
TEST_ON_FIBER(test_cancel_during_hang)
TEST_ON_FIBER(test_cancel_during_backoff)
TEST_ON_FIBER(test_cancel_before_start)
TEST_ON_FIBER(test_callback_abort)
TEST_ON_FIBER(test_non_streamed_body_limit)
TEST_ON_FIBER(test_stream_text_limit)
TEST_ON_FIBER(test_error_body_cap)
TEST_ON_FIBER(test_http_reuse)
TEST_ON_FIBER(test_http_reuse_wave)
TEST_ON_FIBER(test_http_bad_url)
TEST_ON_FIBER(test_body_callback_parks)

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_text),
        cmocka_unit_test(test_no_api_key),
        cmocka_unit_test(test_config_headers),
        cmocka_unit_test(test_config_invalid),
        cmocka_unit_test(test_tool_calls_streamed),
        cmocka_unit_test(test_non_streamed),
        cmocka_unit_test(test_stream_answered_with_json),
        cmocka_unit_test(test_429_retry_after),
        cmocka_unit_test(test_retry_after_ms),
        cmocka_unit_test(test_retry_after_too_long),
        cmocka_unit_test(test_rate_headers_kept),
        cmocka_unit_test(test_500_then_ok),
        cmocka_unit_test(test_retries_exhausted),
        cmocka_unit_test(test_max_retries_zero),
        cmocka_unit_test(test_401_not_retried),
        cmocka_unit_test(test_stream_error_after_output),
        cmocka_unit_test(test_disconnect_after_output),
        cmocka_unit_test(test_disconnect_before_output),
        cmocka_unit_test(test_connection_refused),
        cmocka_unit_test(test_connect_timeout),
        cmocka_unit_test(test_slow_chunks_within_idle),
        cmocka_unit_test(test_cancel_during_hang),
        cmocka_unit_test(test_cancel_during_backoff),
        cmocka_unit_test(test_cancel_before_start),
        cmocka_unit_test(test_callback_abort),
        cmocka_unit_test(test_non_streamed_body_limit),
        cmocka_unit_test(test_stream_text_limit),
        cmocka_unit_test(test_error_body_cap),
        cmocka_unit_test(test_http_reuse),
        cmocka_unit_test(test_http_bad_url),
        cmocka_unit_test(test_http_new_pairs_urls),
        cmocka_unit_test(test_stream_text_on_fiber),
        cmocka_unit_test(test_tool_calls_streamed_on_fiber),
        cmocka_unit_test(test_non_streamed_on_fiber),
        cmocka_unit_test(test_429_retry_after_on_fiber),
        cmocka_unit_test(test_500_then_ok_on_fiber),
        cmocka_unit_test(test_stream_error_after_output_on_fiber),
        cmocka_unit_test(test_disconnect_after_output_on_fiber),
        cmocka_unit_test(test_disconnect_before_output_on_fiber),
        cmocka_unit_test(test_connection_refused_on_fiber),
        cmocka_unit_test(test_slow_chunks_within_idle_on_fiber),
        cmocka_unit_test(test_cancel_during_hang_on_fiber),
        cmocka_unit_test(test_cancel_during_backoff_on_fiber),
        cmocka_unit_test(test_cancel_before_start_on_fiber),
        cmocka_unit_test(test_callback_abort_on_fiber),
        cmocka_unit_test(test_non_streamed_body_limit_on_fiber),
        cmocka_unit_test(test_stream_text_limit_on_fiber),
        cmocka_unit_test(test_error_body_cap_on_fiber),
        cmocka_unit_test(test_http_reuse_on_fiber),
        cmocka_unit_test(test_http_reuse_wave_on_fiber),
        cmocka_unit_test(test_http_bad_url_on_fiber),
        cmocka_unit_test(test_body_callback_parks_on_fiber),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
