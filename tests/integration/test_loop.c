/*
 * The run loop end to end: libloom's OpenAI adapter against the fake
 * upstream, one test per rule of the loop. Each test scripts the model,
 * runs a real run over HTTP, and asserts on the events, the final text,
 * usage, and the requests the fake recorded (what loom actually sent).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fake.h"
#include "loom/run.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- test tools ---- */

static int echo_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    (void)ctx;
    (void)payload;
    return loom_buf_printf(out, "echo:%s",
                           json_string_value(json_object_get(args, "text")));
}

static int fail_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    (void)args;
    (void)ctx;
    (void)payload;
    loom_buf_puts(out, "disk on fire");
    return LOOM_ERROR;
}

/* Waits until all three parallel calls have started (proving they run at
 * once), then sleeps its own duration. */
static pthread_mutex_t meet_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t meet_cv = PTHREAD_COND_INITIALIZER;
static int meet_count;

static int wait_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    int ms = (int)json_integer_value(json_object_get(args, "ms"));
    struct timespec deadline;
    int met = 1;
    (void)ctx;
    (void)payload;

    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 10;
    pthread_mutex_lock(&meet_mu);
    meet_count++;
    pthread_cond_broadcast(&meet_cv);
    while (meet_count < 3 && met)
        met = pthread_cond_timedwait(&meet_cv, &meet_mu, &deadline) == 0;
    pthread_mutex_unlock(&meet_mu);
    usleep((useconds_t)ms * 1000);
    return loom_buf_printf(out, "waited %d ms%s", ms,
                           met ? "" : " alone");
}

/*
 * How far the run under test has got, for a canceller waiting to cancel
 * at a known point: the bytes of answer text streamed so far and whether
 * the hang tool has started. Reset by setup_run().
 */
static pthread_mutex_t progress_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t progress_cv = PTHREAD_COND_INITIALIZER;
static size_t progress_text;
static int progress_hang_started;

static int hang_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    (void)args;
    (void)payload;
    pthread_mutex_lock(&progress_mu);
    progress_hang_started = 1;
    pthread_cond_broadcast(&progress_cv);
    pthread_mutex_unlock(&progress_mu);
    /* A well-behaved long tool: polls the run's cancel flag. */
    for (int i = 0; i < 1000 && !loom_cancel_is_set(ctx->cancel); i++)
        usleep(10 * 1000);
    return loom_buf_puts(out, "stopped");
}

static loom_tool_registry *make_tools(void)
{
    loom_tool_registry *reg;
    json_t *echo = json_pack("{s:s,s:{s:{s:s}},s:[s],s:b}", "type", "object",
                             "properties", "text", "type", "string",
                             "required", "text", "additionalProperties", 0);
    json_t *wait = json_pack("{s:s,s:{s:{s:s}}}", "type", "object",
                             "properties", "ms", "type", "integer");
    loom_tool t;

    assert_int_equal(loom_tool_registry_new(&reg), 0);
    memset(&t, 0, sizeof(t));
    t.name = "echo";
    t.description = "Echoes text back.";
    t.parameters = echo;
    t.execute = echo_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "fail";
    t.description = "Always fails.";
    t.parameters = NULL;
    t.execute = fail_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "wait";
    t.description = "Waits.";
    t.parameters = wait;
    t.execute = wait_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "hang";
    t.description = "Runs until cancelled.";
    t.parameters = NULL;
    t.execute = hang_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    json_decref(echo);
    json_decref(wait);
    return reg;
}

/* ---- harness ---- */

typedef struct {
    loom_fake *fake;
    loom_provider_config pc;
    loom_provider *provider;
    loom_tool_registry *reg;
    json_t *events;
    loom_run *run;
    int rc;
    double elapsed_s;
} harness;

static int record(const loom_event *ev, void *payload)
{
    harness *h = payload;
    json_array_append_new(h->events, loom_event_to_json(ev));
    if (ev->type == LOOM_EV_MESSAGE_DELTA) {
        pthread_mutex_lock(&progress_mu);
        progress_text +=
            strlen(json_string_value(json_object_get(ev->data, "delta")));
        pthread_cond_broadcast(&progress_cv);
        pthread_mutex_unlock(&progress_mu);
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* short: 400 ms first-byte and idle timeouts, no retries. */
static void setup_run(harness *h, const char *script, loom_run_options *in,
                      int short_timeouts)
{
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    char url[128];

    memset(h, 0, sizeof(*h));
    pthread_mutex_lock(&progress_mu);
    progress_text = 0;
    progress_hang_started = 0;
    pthread_mutex_unlock(&progress_mu);
    h->fake = fake_start_script(script);
    assert_non_null(h->fake);
    snprintf(url, sizeof(url), "%s", fake_base_url(h->fake));
    h->pc.name = "fake";
    h->pc.kind = "openai";
    h->pc.base_url = strdup(url);
    h->pc.api_key = "sk-test";
    h->pc.headers = json_object();
    h->pc.connect_timeout_ms = 2000;
    h->pc.first_byte_timeout_ms = 5000;
    h->pc.idle_timeout_ms = 5000;
    h->pc.max_retries = 2;
    h->pc.retry_base_delay_ms = 50;
    h->pc.retry_max_delay_ms = 200;
    if (short_timeouts) {
        h->pc.first_byte_timeout_ms = 400;
        h->pc.idle_timeout_ms = 400;
        h->pc.max_retries = 0;
    }
    assert_int_equal(loom_provider_new(&h->provider, &h->pc), 0);
    h->reg = make_tools();
    h->events = json_array();
    if (in)
        ro = *in;
    ro.temperature = -1.0;
    ro.provider = h->provider;
    ro.model = "fake/fake-model";
    ro.upstream_model = "fake-model";
    ro.tools = h->reg;
    ro.sink.emit = record;
    ro.sink.payload = h;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "question"),
                     0);
    assert_int_equal(loom_run_new(&h->run, &ro, &hist), 0);
    loom_messages_free(&hist);
}

static void go(harness *h)
{
    double t0 = now_s();
    h->rc = loom_run_execute(h->run);
    h->elapsed_s = now_s() - t0;
}

static void run_script(harness *h, const char *script, loom_run_options *in)
{
    setup_run(h, script, in, 0);
    go(h);
}

static void harness_free(harness *h)
{
    loom_run_free(h->run);
    loom_provider_free(h->provider);
    loom_tool_registry_free(h->reg);
    json_decref(h->events);
    json_decref(h->pc.headers);
    free(h->pc.base_url);
    fake_stop(h->fake);
}

static int count_type(const harness *h, const char *type)
{
    size_t i;
    json_t *e;
    int n = 0;

    json_array_foreach(h->events, i, e)
    {
        n += !strcmp(json_string_value(json_object_get(e, "type")), type);
    }
    return n;
}

static json_t *nth_type(const harness *h, const char *type, int nth)
{
    size_t i;
    json_t *e;

    json_array_foreach(h->events, i, e)
    {
        if (!strcmp(json_string_value(json_object_get(e, "type")), type) &&
            nth-- == 0)
            return e;
    }
    return NULL;
}

/* The messages array loom sent in request i (borrowed from reqs). */
static json_t *sent_messages(json_t *reqs, size_t i)
{
    return json_object_get(
        json_object_get(json_array_get(reqs, i), "body"), "messages");
}

static const char *msg_field(json_t *msgs, size_t i, const char *key)
{
    return json_string_value(json_object_get(json_array_get(msgs, i), key));
}

/* ---- tests ---- */

static void test_multi_iteration(void **state)
{
    harness h;
    json_t *reqs, *msgs;
    (void)state;

    run_script(&h,
               "{\"responses\":["
               "{\"text\":[\"Checking. \"],\"tool_calls\":[{\"id\":\"c1\","
               "\"name\":\"echo\",\"arguments\":[\"{\\\"te\",\"xt\\\":\","
               "\"\\\"one\\\"}\"]}],\"usage\":{\"prompt_tokens\":10,"
               "\"completion_tokens\":5,\"total_tokens\":15}},"
               "{\"tool_calls\":[{\"id\":\"c2\",\"name\":\"echo\","
               "\"arguments\":\"{\\\"text\\\":\\\"two\\\"}\"}],"
               "\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":5,"
               "\"total_tokens\":25}},"
               "{\"text\":[\"All \",\"done.\"],\"usage\":{\"prompt_tokens\":"
               "30,\"completion_tokens\":3,\"total_tokens\":33}}]}",
               NULL);
    assert_int_equal(h.rc, 0);
    assert_string_equal(loom_run_text(h.run), "All done.");
    assert_int_equal(loom_run_iterations(h.run), 3);
    assert_int_equal(loom_run_usage(h.run)->prompt_tokens, 60);
    assert_int_equal(loom_run_usage(h.run)->completion_tokens, 13);
    assert_int_equal(loom_run_usage(h.run)->total_tokens, 73);
    assert_int_equal(count_type(&h, "usage"), 3);
    assert_int_equal(count_type(&h, "tool.completed"), 2);
    assert_int_equal(count_type(&h, "message.delta"), 3);

    reqs = fake_requests(h.fake);
    assert_int_equal(json_array_size(reqs), 3);
    /* Every request streams, asks for usage, and offers the tools. */
    for (size_t i = 0; i < 3; i++) {
        json_t *body = json_object_get(json_array_get(reqs, i), "body");
        assert_true(json_is_true(json_object_get(body, "stream")));
        assert_int_equal(json_array_size(json_object_get(body, "tools")), 4);
        assert_string_equal(
            json_string_value(json_object_get(body, "model")), "fake-model");
    }
    /* The third request carries the whole loop, results matched by id. */
    msgs = sent_messages(reqs, 2);
    assert_int_equal(json_array_size(msgs), 5);
    assert_string_equal(msg_field(msgs, 0, "role"), "user");
    assert_string_equal(msg_field(msgs, 1, "role"), "assistant");
    assert_string_equal(msg_field(msgs, 1, "content"), "Checking. ");
    assert_string_equal(msg_field(msgs, 2, "role"), "tool");
    assert_string_equal(msg_field(msgs, 2, "tool_call_id"), "c1");
    assert_string_equal(msg_field(msgs, 2, "content"), "echo:one");
    assert_string_equal(msg_field(msgs, 4, "tool_call_id"), "c2");
    assert_string_equal(msg_field(msgs, 4, "content"), "echo:two");
    /* Arguments streamed in fragments were joined before they were sent
     * back. */
    assert_string_equal(
        json_string_value(json_object_get(
            json_object_get(json_array_get(json_object_get(
                                               json_array_get(msgs, 1),
                                               "tool_calls"),
                                           0),
                            "function"),
            "arguments")),
        "{\"text\":\"one\"}");
    json_decref(reqs);
    harness_free(&h);
}

static void test_parallel_tools(void **state)
{
    harness h;
    json_t *reqs, *msgs;
    (void)state;

    meet_count = 0;
    run_script(&h,
               "{\"responses\":["
               "{\"interleave\":true,\"tool_calls\":["
               "{\"id\":\"a\",\"name\":\"wait\",\"arguments\":[\"{\\\"ms\\\"\","
               "\":300}\"]},"
               "{\"id\":\"b\",\"name\":\"wait\",\"arguments\":[\"{\\\"ms\\\"\","
               "\":10}\"]},"
               "{\"id\":\"c\",\"name\":\"wait\",\"arguments\":[\"{\\\"ms\\\"\","
               "\":150}\"]}]},"
               "{\"text\":[\"ok\"]}]}",
               NULL);
    assert_int_equal(h.rc, 0);
    assert_int_equal(count_type(&h, "tool.started"), 3);
    assert_int_equal(count_type(&h, "tool.completed"), 3);
    reqs = fake_requests(h.fake);
    msgs = sent_messages(reqs, 1);
    /* All three ran at once (none waited alone), and the results went
     * back in call order whatever order they finished in. */
    assert_string_equal(msg_field(msgs, 2, "tool_call_id"), "a");
    assert_string_equal(msg_field(msgs, 2, "content"), "waited 300 ms");
    assert_string_equal(msg_field(msgs, 3, "tool_call_id"), "b");
    assert_string_equal(msg_field(msgs, 3, "content"), "waited 10 ms");
    assert_string_equal(msg_field(msgs, 4, "tool_call_id"), "c");
    assert_string_equal(msg_field(msgs, 4, "content"), "waited 150 ms");
    /* The interleaved call deltas were assembled per call. */
    assert_int_equal(json_array_size(json_object_get(
                         json_array_get(msgs, 1), "tool_calls")),
                     3);
    json_decref(reqs);
    harness_free(&h);
}

static const char *tool_result_sent(harness *h, size_t req, size_t msg)
{
    static char buf[4096];
    json_t *reqs = fake_requests(h->fake);
    const char *s = msg_field(sent_messages(reqs, req), msg, "content");
    snprintf(buf, sizeof(buf), "%s", s ? s : "(null)");
    json_decref(reqs);
    return buf;
}

static void test_unknown_tool(void **state)
{
    harness h;
    (void)state;

    run_script(&h,
               "{\"responses\":[{\"tool_calls\":[{\"id\":\"c1\",\"name\":"
               "\"search_web\",\"arguments\":\"{}\"}]},"
               "{\"text\":[\"sorry\"]}]}",
               NULL);
    assert_int_equal(h.rc, 0);
    assert_string_equal(tool_result_sent(&h, 1, 2),
                        "Error: Unknown tool 'search_web'. Available tools: "
                        "echo, fail, wait, hang.");
    assert_string_equal(json_string_value(json_object_get(
                            nth_type(&h, "tool.failed", 0), "stage")),
                        "lookup");
    assert_string_equal(loom_run_text(h.run), "sorry");
    harness_free(&h);
}

static void test_bad_json(void **state)
{
    harness h;
    (void)state;

    run_script(&h,
               "{\"responses\":[{\"tool_calls\":[{\"id\":\"c1\",\"name\":"
               "\"echo\",\"arguments\":\"{\\\"text\\\": 'single'}\"}]},"
               "{\"text\":[\"retrying\"]}]}",
               NULL);
    assert_int_equal(h.rc, 0);
    assert_non_null(strstr(tool_result_sent(&h, 1, 2), "not valid JSON"));
    assert_non_null(strstr(tool_result_sent(&h, 1, 2),
                           "Received: {\"text\": 'single'}"));
    assert_string_equal(json_string_value(json_object_get(
                            nth_type(&h, "tool.failed", 0), "stage")),
                        "arguments");
    harness_free(&h);
}

static void test_schema_violation(void **state)
{
    harness h;
    (void)state;

    run_script(&h,
               "{\"responses\":[{\"tool_calls\":[{\"id\":\"c1\",\"name\":"
               "\"echo\",\"arguments\":\"{\\\"txt\\\":1}\"}]},"
               "{\"text\":[\"ok\"]}]}",
               NULL);
    assert_int_equal(h.rc, 0);
    assert_non_null(strstr(tool_result_sent(&h, 1, 2),
                           "Invalid arguments for tool 'echo'"));
    assert_non_null(strstr(tool_result_sent(&h, 1, 2), "`text`"));
    assert_string_equal(json_string_value(json_object_get(
                            nth_type(&h, "tool.failed", 0), "stage")),
                        "validation");
    harness_free(&h);
}

static void test_tool_error(void **state)
{
    harness h;
    (void)state;

    run_script(&h,
               "{\"responses\":[{\"tool_calls\":[{\"id\":\"c1\",\"name\":"
               "\"fail\",\"arguments\":\"\"}]},{\"text\":[\"it failed\"]}]}",
               NULL);
    assert_int_equal(h.rc, 0);
    assert_string_equal(tool_result_sent(&h, 1, 2), "Error: disk on fire");
    assert_string_equal(json_string_value(json_object_get(
                            nth_type(&h, "tool.failed", 0), "stage")),
                        "execution");
    assert_string_equal(loom_run_text(h.run), "it failed");
    harness_free(&h);
}

static void test_limit_reached(void **state)
{
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;
    json_t *reqs, *last;
    (void)state;

    ro.max_iterations = 3;
    run_script(&h,
               "{\"loop\":false,\"responses\":["
               "{\"tool_calls\":[{\"id\":\"c1\",\"name\":\"echo\","
               "\"arguments\":\"{\\\"text\\\":\\\"1\\\"}\"}]},"
               "{\"tool_calls\":[{\"id\":\"c2\",\"name\":\"echo\","
               "\"arguments\":\"{\\\"text\\\":\\\"2\\\"}\"}]},"
               "{\"text\":[\"Here is what I found.\"]}]}",
               &ro);
    assert_int_equal(h.rc, 0);
    assert_string_equal(loom_run_text(h.run), "Here is what I found.");
    reqs = fake_requests(h.fake);
    assert_int_equal(json_array_size(reqs), 3);
    last = json_object_get(json_array_get(reqs, 2), "body");
    /* The last permitted call forbids tool calls, and says why. */
    assert_non_null(json_object_get(last, "tools"));
    assert_string_equal(
        json_string_value(json_object_get(last, "tool_choice")), "none");
    {
        json_t *msgs = json_object_get(last, "messages");
        size_t n = json_array_size(msgs);
        assert_string_equal(msg_field(msgs, n - 1, "role"), "system");
        assert_non_null(strstr(msg_field(msgs, n - 1, "content"),
                               "limit of 3 model calls"));
    }
    json_decref(reqs);
    harness_free(&h);
}

static void test_forced_choice_then_auto(void **state)
{
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;
    json_t *reqs, *c0, *c1;
    (void)state;

    ro.tool_choice.kind = LOOM_TOOL_CHOICE_FUNCTION;
    ro.tool_choice.function = "echo";
    run_script(&h,
               "{\"responses\":[{\"tool_calls\":[{\"id\":\"c1\",\"name\":"
               "\"echo\",\"arguments\":\"{\\\"text\\\":\\\"x\\\"}\"}]},"
               "{\"text\":[\"ok\"]}]}",
               &ro);
    assert_int_equal(h.rc, 0);
    reqs = fake_requests(h.fake);
    c0 = json_object_get(json_object_get(json_array_get(reqs, 0), "body"),
                         "tool_choice");
    c1 = json_object_get(json_object_get(json_array_get(reqs, 1), "body"),
                         "tool_choice");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(c0, "function"),
                                          "name")),
        "echo");
    assert_string_equal(json_string_value(c1), "auto");
    json_decref(reqs);
    harness_free(&h);
}

static void test_429_then_success(void **state)
{
    harness h;
    (void)state;

    run_script(&h,
               "{\"responses\":[{\"status\":429,\"headers\":{\"Retry-After\":"
               "\"1\"},\"error\":{\"message\":\"Rate limit reached\","
               "\"type\":\"requests\"}},{\"text\":[\"after the wait\"]}]}",
               NULL);
    assert_int_equal(h.rc, 0);
    assert_string_equal(loom_run_text(h.run), "after the wait");
    assert_int_equal(fake_request_count(h.fake), 2);
    /* Retry-After: 1 was honoured (a lower bound cannot flake). */
    assert_true(h.elapsed_s >= 0.95);
    harness_free(&h);
}

static void test_500_before_output_retried(void **state)
{
    harness h;
    (void)state;

    run_script(&h,
               "{\"responses\":[{\"status\":500,\"error\":{\"message\":"
               "\"boom\"}},{\"status\":503,\"error\":{\"message\":\"busy\"}},"
               "{\"text\":[\"third time\"]}]}",
               NULL);
    assert_int_equal(h.rc, 0);
    assert_string_equal(loom_run_text(h.run), "third time");
    assert_int_equal(fake_request_count(h.fake), 3);
    harness_free(&h);
}

static void test_retries_exhausted(void **state)
{
    harness h;
    json_t *f, *err;
    (void)state;

    run_script(&h,
               "{\"loop\":true,\"responses\":[{\"status\":502,\"error\":{"
               "\"message\":\"bad gateway\",\"type\":\"server_error\"},"
               "\"headers\":{\"x-request-id\":\"req_42\"}}]}",
               NULL);
    assert_int_equal(h.rc, LOOM_EUPSTREAM);
    assert_int_equal(loom_run_status_get(h.run), LOOM_RUN_FAILED);
    assert_int_equal(fake_request_count(h.fake), 3); /* 1 + 2 retries */
    f = nth_type(&h, "run.failed", 0);
    err = json_object_get(f, "error");
    assert_int_equal(json_integer_value(json_object_get(err, "http_status")),
                     502);
    assert_string_equal(json_string_value(json_object_get(err, "request_id")),
                        "req_42");
    assert_non_null(strstr(json_string_value(json_object_get(err, "message")),
                           "bad gateway"));
    harness_free(&h);
}

static void test_error_after_output_not_retried(void **state)
{
    harness h;
    (void)state;

    run_script(&h,
               "{\"responses\":[{\"text\":[\"Partial \",\"answer\"],"
               "\"stream_error\":{\"message\":\"server exploded\",\"type\":"
               "\"server_error\"}},{\"text\":[\"never\"]}]}",
               NULL);
    assert_int_equal(h.rc, LOOM_EUPSTREAM);
    assert_int_equal(fake_request_count(h.fake), 1);
    /* What streamed before the error is kept. */
    assert_string_equal(loom_run_text(h.run), "Partial answer");
    assert_non_null(strstr(loom_run_error(h.run), "server exploded"));
    harness_free(&h);
}

static void test_disconnect_mid_stream(void **state)
{
    harness h;
    (void)state;

    run_script(&h,
               "{\"responses\":[{\"text\":[\"one \",\"two \",\"three\"],"
               "\"disconnect_after_chunks\":2},{\"text\":[\"never\"]}]}",
               NULL);
    assert_int_equal(h.rc, LOOM_EUPSTREAM);
    assert_int_equal(loom_run_status_get(h.run), LOOM_RUN_FAILED);
    assert_int_equal(fake_request_count(h.fake), 1);
    assert_non_null(nth_type(&h, "run.failed", 0));
    harness_free(&h);
}

static void test_timeout(void **state)
{
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;
    (void)state;

    setup_run(&h, "{\"responses\":[{\"hang\":true}]}", &ro, 1);
    go(&h);
    assert_int_equal(h.rc, LOOM_ETIMEDOUT);
    assert_int_equal(loom_run_status_get(h.run), LOOM_RUN_FAILED);
    assert_string_equal(
        json_string_value(json_object_get(
            json_object_get(nth_type(&h, "run.failed", 0), "error"),
            "code")),
        "ETIMEDOUT");
    harness_free(&h);
}

/* Cancels h's run once text_bytes of answer text have streamed, or once
 * the hang tool has started (hang_started), or after 60 s at most (then
 * the test's own assertions say what was missing). */
typedef struct {
    harness *h;
    size_t text_bytes;
    int hang_started;
} canceller;

static void *cancel_later(void *arg)
{
    canceller *c = arg;
    struct timespec deadline;

    clock_gettime(CLOCK_REALTIME, &deadline);
    deadline.tv_sec += 60;
    pthread_mutex_lock(&progress_mu);
    while (progress_text < c->text_bytes ||
           (c->hang_started && !progress_hang_started))
        if (pthread_cond_timedwait(&progress_cv, &progress_mu, &deadline))
            break;
    pthread_mutex_unlock(&progress_mu);
    loom_run_cancel(c->h->run);
    return NULL;
}

static void test_cancel_during_stream(void **state)
{
    harness h;
    canceller c;
    pthread_t t;
    (void)state;

    setup_run(&h,
              "{\"responses\":[{\"text\":[\"Some \",\"words\"],\"hang\":true,"
              "\"hang_after_chunks\":3}]}",
              NULL, 0);
    /* Cancel once both chunks are in and the stream hangs. */
    c = (canceller){&h, strlen("Some words"), 0};
    pthread_create(&t, NULL, cancel_later, &c);
    go(&h);
    pthread_join(t, NULL);
    assert_int_equal(h.rc, LOOM_ECANCELED);
    assert_int_equal(loom_run_status_get(h.run), LOOM_RUN_CANCELLED);
    /* The run ends promptly (the hang would last 120 s) with what it had. */
    assert_true(h.elapsed_s < 60);
    assert_string_equal(loom_run_text(h.run), "Some words");
    assert_string_equal(
        json_string_value(json_object_get(nth_type(&h, "run.failed", 0),
                                          "status")),
        "cancelled");
    harness_free(&h);
}

static void test_cancel_during_tool(void **state)
{
    harness h;
    canceller c;
    pthread_t t;
    (void)state;

    setup_run(&h,
              "{\"responses\":[{\"tool_calls\":[{\"id\":\"c1\",\"name\":"
              "\"hang\",\"arguments\":\"{}\"}]},{\"text\":[\"never\"]}]}",
              NULL, 0);
    c = (canceller){&h, 0, 1};
    pthread_create(&t, NULL, cancel_later, &c);
    go(&h);
    pthread_join(t, NULL);
    assert_int_equal(h.rc, LOOM_ECANCELED);
    /* The tool saw the cancel; no further model call was made. */
    assert_int_equal(fake_request_count(h.fake), 1);
    assert_int_equal(loom_run_messages(h.run)->len, 2);
    assert_string_equal(loom_run_messages(h.run)->items[1].content,
                        "stopped");
    harness_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_multi_iteration),
        cmocka_unit_test(test_parallel_tools),
        cmocka_unit_test(test_unknown_tool),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_schema_violation),
        cmocka_unit_test(test_tool_error),
        cmocka_unit_test(test_limit_reached),
        cmocka_unit_test(test_forced_choice_then_auto),
        cmocka_unit_test(test_429_then_success),
        cmocka_unit_test(test_500_before_output_retried),
        cmocka_unit_test(test_retries_exhausted),
        cmocka_unit_test(test_error_after_output_not_retried),
        cmocka_unit_test(test_disconnect_mid_stream),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_cancel_during_stream),
        cmocka_unit_test(test_cancel_during_tool),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
