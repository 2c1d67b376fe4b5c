/*
 * Tests of loom-fake-upstream itself, through libcurl (not through loom's
 * HTTP code, which these fakes exist to test). Every behaviour the docs
 * promise is exercised: replay, generated streams and answers, errors,
 * cut and hung connections, recording, looping, exhaustion, stats, the
 * body size limit, the exit conditions and argument checking. Every fake
 * is stopped with fake_stop_check(), so under ASan a leak in the fake
 * fails the test that caused it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h> /* needs the four headers above */

#include <fcntl.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "fake.h"
#include "testutil.h"

extern char **environ;

/* ---- HTTP through libcurl ----------------------------------------------- */

typedef struct {
    CURLcode rc;
    long status;
    char *body;
    size_t len;
    char ctype[128];
    char retry_after[64];
    char custom[64]; /* value of "X-Fake-Test" */
} http_res;

typedef struct {
    const char *method;  /* NULL: GET, or POST when body is set */
    const char *path;    /* appended to the base URL */
    const char *body;    /* NULL: none */
    size_t body_len;     /* 0: strlen(body) */
    const char *headers; /* "A: b\nC: d", or NULL */
    long timeout_ms;     /* 0: 60 s */
    bool chunked;        /* send the body with chunked encoding */
    bool root;           /* path is from the server root, not /v1 */
} http_req;

static size_t on_data(char *p, size_t size, size_t n, void *ud)
{
    http_res *r = ud;
    char *b = realloc(r->body, r->len + size * n + 1);

    if (!b)
        return 0;
    memcpy(b + r->len, p, size * n);
    r->body = b;
    r->len += size * n;
    r->body[r->len] = '\0';
    return size * n;
}

static void header_value(const char *line, size_t n, const char *name,
                         char *out, size_t outlen)
{
    size_t k = strlen(name);

    if (n <= k + 1 || strncasecmp(line, name, k) || line[k] != ':')
        return;
    line += k + 1;
    n -= k + 1;
    while (n && *line == ' ')
        line++, n--;
    while (n && (line[n - 1] == '\r' || line[n - 1] == '\n'))
        n--;
    snprintf(out, outlen, "%.*s", (int)n, line);
}

static size_t on_header(char *p, size_t size, size_t n, void *ud)
{
    http_res *r = ud;

    header_value(p, size * n, "retry-after", r->retry_after,
                 sizeof(r->retry_after));
    header_value(p, size * n, "x-fake-test", r->custom, sizeof(r->custom));
    return size * n;
}

typedef struct {
    const char *data;
    size_t len, off;
} upload;

static size_t on_read(char *p, size_t size, size_t n, void *ud)
{
    upload *u = ud;
    size_t k = size * n;

    if (k > u->len - u->off)
        k = u->len - u->off;
    memcpy(p, u->data + u->off, k);
    u->off += k;
    return k;
}

/* Runs one request on handle h (reused for keep-alive when given). */
static void http_on(CURL *h, const loom_fake *f, const http_req *q, http_res *r)
{
    struct curl_slist *hdrs = NULL;
    char url[512], line[256];
    const char *s, *e;
    upload up = {0};
    char *ct = NULL;

    memset(r, 0, sizeof(*r));
    if (q->root)
        snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", fake_port(f),
                 q->path);
    else
        snprintf(url, sizeof(url), "%s%s", fake_base_url(f),
                 q->path ? q->path : "/chat/completions");
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS,
                     q->timeout_ms ? q->timeout_ms : 60000L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    for (s = q->headers; s && *s; s = *e ? e + 1 : e) {
        e = strchr(s, '\n');
        if (!e)
            e = s + strlen(s);
        snprintf(line, sizeof(line), "%.*s", (int)(e - s), s);
        hdrs = curl_slist_append(hdrs, line);
    }
    if (q->body) {
        up.data = q->body;
        up.len = q->body_len ? q->body_len : strlen(q->body);
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(h, CURLOPT_READDATA, &up);
        if (q->chunked) {
            hdrs = curl_slist_append(hdrs, "Transfer-Encoding: chunked");
        } else {
            curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE,
                             (curl_off_t)up.len);
            /* Wait for the verdict on a large body before sending it. */
            hdrs = curl_slist_append(hdrs, "Expect: 100-continue");
            curl_easy_setopt(h, CURLOPT_EXPECT_100_TIMEOUT_MS, 60000L);
        }
    }
    if (q->method)
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, q->method);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    r->rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
    curl_easy_getinfo(h, CURLINFO_CONTENT_TYPE, &ct);
    if (ct)
        snprintf(r->ctype, sizeof(r->ctype), "%s", ct);
    curl_slist_free_all(hdrs);
}

static void http(const loom_fake *f, const http_req *q, http_res *r)
{
    CURL *h = curl_easy_init();

    assert_non_null(h);
    http_on(h, f, q, r);
    curl_easy_cleanup(h);
}

/* POSTs a chat body to /chat/completions. */
static void post(const loom_fake *f, const char *body, http_res *r)
{
    http_req q = {.body = body, .headers = "Content-Type: application/json"};

    http(f, &q, r);
}

static const char *stream_req =
    "{\"model\":\"m\",\"stream\":true,\"messages\":[]}";
static const char *stream_usage_req =
    "{\"model\":\"m\",\"stream\":true,"
    "\"stream_options\":{\"include_usage\":true},\"messages\":[]}";

/*
 * Splits an SSE body into its events: a JSON array holding each data
 * payload parsed, or the string "[DONE]". Fails the test on any event
 * that is not `data: <json>\n\n`.
 */
static json_t *sse_events(const char *body, size_t len)
{
    json_t *out = json_array();
    const char *p = body, *end = body + len;

    while (p < end) {
        const char *e = strstr(p, "\n\n");
        json_error_t err;
        json_t *o;

        assert_non_null(e);
        assert_int_equal(strncmp(p, "data: ", 6), 0);
        p += 6;
        if ((size_t)(e - p) == 6 && !strncmp(p, "[DONE]", 6)) {
            json_array_append_new(out, json_string("[DONE]"));
        } else {
            o = json_loadb(p, (size_t)(e - p), 0, &err);
            if (!o)
                fail_msg("bad event json: %s: %.*s", err.text, (int)(e - p), p);
            json_array_append_new(out, o);
        }
        p = e + 2;
    }
    return out;
}

static json_t *delta_of(json_t *ev)
{
    return json_object_get(json_array_get(json_object_get(ev, "choices"), 0),
                           "delta");
}

static const char *finish_of(json_t *ev)
{
    return json_string_value(json_object_get(
        json_array_get(json_object_get(ev, "choices"), 0), "finish_reason"));
}

static void free_res(http_res *r)
{
    free(r->body);
    r->body = NULL;
    r->len = 0;
}

static loom_fake *start(const char *script)
{
    loom_fake *f = fake_start_script(script);

    assert_non_null(f);
    return f;
}

static void stop(loom_fake *f)
{
    assert_int_equal(fake_stop_check(f), 0);
}

/* Runs the fake binary with args; returns its exit status. */
static int run_fake(const char *const *args)
{
    const char *argv[16];
    posix_spawn_file_actions_t fa;
    size_t n = 0;
    pid_t pid;
    int rc;

    argv[n++] = LOOM_FAKE_BIN;
    while (args[n - 1] && n < 15) {
        argv[n] = args[n - 1];
        n++;
    }
    argv[n] = NULL;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY,
                                     0);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY,
                                     0);
    rc = posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    assert_int_equal(rc, 0);
    return test_wait_pid(pid, 60000);
}

/* ---- replay -------------------------------------------------------------- */

static void test_replay_is_byte_identical(void **state)
{
    char *path = test_vector_path("openai-chat/stream-works-1.sse");
    size_t len;
    char *want = test_read_file(path, &len);
    loom_fake *f = fake_start_replay(path, 0);
    http_res r;
    int i;

    (void)state;
    assert_non_null(want);
    assert_non_null(f);
    /* Any path and method, as often as asked. */
    for (i = 0; i < 2; i++) {
        http_req q = {.path = i ? "/anything?x=1" : "/chat/completions",
                      .body = i ? NULL : stream_req};

        http(f, &q, &r);
        assert_int_equal(r.rc, CURLE_OK);
        assert_int_equal(r.status, 200);
        assert_string_equal(r.ctype, "text/event-stream");
        assert_int_equal(r.len, len);
        assert_memory_equal(r.body, want, len);
        free_res(&r);
    }
    assert_int_equal(fake_request_count(f), 2);
    stop(f);
    free(want);
    free(path);
}

static void test_replay_status(void **state)
{
    char *path = test_vector_path("gemini/error-0.sse");
    size_t len;
    char *want = test_read_file(path, &len);
    loom_fake *f = fake_start_replay(path, 0);
    http_res r;

    (void)state;
    assert_non_null(want);
    assert_non_null(f);
    http(f, &(http_req){.path = "beta/models/x:streamGenerateContent"}, &r);
    assert_int_equal(r.rc, CURLE_OK);
    assert_int_equal(r.status, 404); /* from error-0.status */
    assert_int_equal(r.len, len);
    assert_memory_equal(r.body, want, len);
    free_res(&r);
    stop(f);

    /* An explicit status wins over the .status file. */
    f = fake_start_replay(path, 503);
    assert_non_null(f);
    http(f, &(http_req){0}, &r);
    assert_int_equal(r.status, 503);
    free_res(&r);
    stop(f);
    free(want);
    free(path);
}

/* ---- generated answers -------------------------------------------------- */

static const char *tools_script =
    "{\"loop\":true,\"responses\":[{"
    "\"reasoning\":[\"Think\",\"ing\"],"
    "\"text\":[\"Let me \",\"check.\"],"
    "\"interleave\":true,"
    "\"tool_calls\":["
    "{\"id\":\"call_a\",\"name\":\"get_weather\","
    "\"arguments\":[\"{\\\"city\\\":\",\"\\\"Paris\\\"\",\"}\"]},"
    "{\"id\":\"call_b\",\"name\":\"get_time\","
    "\"arguments\":[\"{\\\"tz\\\":\\\"CET\\\"}\"]}],"
    "\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":5,"
    "\"total_tokens\":15,\"prompt_tokens_details\":{\"cached_tokens\":4},"
    "\"completion_tokens_details\":{\"reasoning_tokens\":2}}}]}";

/* Checks the events of tools_script; with_usage: the usage chunk. */
static void check_tool_stream(json_t *ev, bool with_usage)
{
    /* role, 2 reasoning, 2 text, 2 heads + 4 fragments, finish, [usage],
     * [DONE] */
    static const int order[] = {0, 1, 0, 1, 0, 0}; /* call index by step */
    size_t n = json_array_size(ev), i, k = 0;
    char args[2][64] = {"", ""};
    json_t *e, *d, *tc;

    assert_int_equal(n, with_usage ? 14 : 13);
    d = delta_of(json_array_get(ev, 0));
    assert_string_equal(json_string_value(json_object_get(d, "role")),
                        "assistant");
    assert_string_equal(
        json_string_value(json_object_get(delta_of(json_array_get(ev, 1)),
                                          "reasoning_content")),
        "Think");
    assert_string_equal(json_string_value(json_object_get(
                            delta_of(json_array_get(ev, 4)), "content")),
                        "check.");
    for (i = 5; i < 11; i++, k++) {
        const char *frag;
        json_int_t idx;

        e = json_array_get(ev, i);
        assert_string_equal(json_string_value(json_object_get(e, "object")),
                            "chat.completion.chunk");
        assert_null(finish_of(e));
        tc = json_array_get(json_object_get(delta_of(e), "tool_calls"), 0);
        assert_non_null(tc);
        idx = json_integer_value(json_object_get(tc, "index"));
        assert_int_equal(idx, order[k]);
        if (k < 2) { /* the first delta of each call */
            assert_string_equal(json_string_value(json_object_get(tc, "id")),
                                idx ? "call_b" : "call_a");
            assert_string_equal(json_string_value(json_object_get(tc, "type")),
                                "function");
            assert_string_equal(json_string_value(json_object_get(
                                    json_object_get(tc, "function"), "name")),
                                idx ? "get_time" : "get_weather");
        } else {
            assert_null(json_object_get(tc, "id"));
            assert_null(
                json_object_get(json_object_get(tc, "function"), "name"));
        }
        frag = json_string_value(
            json_object_get(json_object_get(tc, "function"), "arguments"));
        assert_non_null(frag);
        strncat(args[idx], frag, sizeof(args[idx]) - strlen(args[idx]) - 1);
    }
    assert_string_equal(args[0], "{\"city\":\"Paris\"}");
    assert_string_equal(args[1], "{\"tz\":\"CET\"}");
    e = json_array_get(ev, 11);
    assert_string_equal(finish_of(e), "tool_calls");
    assert_int_equal(json_object_size(delta_of(e)), 0);
    for (i = 0; i < 12; i++) {
        e = json_array_get(ev, i);
        assert_string_equal(
            json_string_value(json_object_get(e, "id")),
            json_string_value(json_object_get(json_array_get(ev, 0), "id")));
        /* OpenAI sends "usage": null on every chunk when asked for usage */
        assert_int_equal(json_object_get(e, "usage") != NULL, with_usage);
    }
    if (with_usage) {
        e = json_array_get(ev, 12);
        assert_int_equal(json_array_size(json_object_get(e, "choices")), 0);
        assert_int_equal(json_integer_value(json_object_get(
                             json_object_get(e, "usage"), "total_tokens")),
                         15);
        assert_int_equal(json_integer_value(json_object_get(
                             json_object_get(json_object_get(e, "usage"),
                                             "prompt_tokens_details"),
                             "cached_tokens")),
                         4);
    }
    assert_string_equal(json_string_value(json_array_get(ev, n - 1)), "[DONE]");
}

static void test_stream_interleaved_tool_calls(void **state)
{
    loom_fake *f = start(tools_script);
    http_res r;
    json_t *ev;

    (void)state;
    post(f, stream_usage_req, &r);
    assert_int_equal(r.rc, CURLE_OK);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.ctype, "text/event-stream");
    ev = sse_events(r.body, r.len);
    check_tool_stream(ev, true);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(ev, 0), "id")),
        "chatcmpl-fake-1");
    json_decref(ev);
    free_res(&r);

    /* Without stream_options.include_usage: no usage chunk at all. */
    post(f, stream_req, &r);
    assert_int_equal(r.rc, CURLE_OK);
    ev = sse_events(r.body, r.len);
    check_tool_stream(ev, false);
    json_decref(ev);
    free_res(&r);
    stop(f);
}

static void test_stream_sequential_tool_calls(void **state)
{
    loom_fake *f = start("{\"responses\":[{\"tool_calls\":["
                         "{\"name\":\"a\",\"arguments\":[\"{\",\"}\"]},"
                         "{\"name\":\"b\",\"arguments\":\"{}\"}]}]}");
    static const int order[] = {0, 0, 0, 1, 1};
    http_res r;
    json_t *ev, *d, *tc;
    size_t i;

    (void)state;
    post(f, stream_req, &r);
    ev = sse_events(r.body, r.len);
    /* role, a head, 2 fragments, b head, 1 fragment, finish, [DONE] */
    assert_int_equal(json_array_size(ev), 8);
    d = delta_of(json_array_get(ev, 0));
    assert_true(json_is_null(json_object_get(d, "content")));
    for (i = 0; i < 5; i++) {
        tc = json_array_get(
            json_object_get(delta_of(json_array_get(ev, i + 1)), "tool_calls"),
            0);
        assert_int_equal(json_integer_value(json_object_get(tc, "index")),
                         order[i]);
    }
    tc = json_array_get(
        json_object_get(delta_of(json_array_get(ev, 4)), "tool_calls"), 0);
    assert_string_equal(json_string_value(json_object_get(tc, "id")),
                        "call_fake_2");
    assert_string_equal(finish_of(json_array_get(ev, 6)), "tool_calls");
    json_decref(ev);
    free_res(&r);
    stop(f);
}

static void test_non_streaming(void **state)
{
    loom_fake *f = start(tools_script);
    json_t *o, *msg, *calls, *usage;
    http_res r;

    (void)state;
    post(f, "{\"model\":\"m\",\"messages\":[]}", &r);
    assert_int_equal(r.rc, CURLE_OK);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.ctype, "application/json");
    o = json_loadb(r.body, r.len, 0, NULL);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(o, "object")),
                        "chat.completion");
    assert_string_equal(json_string_value(json_object_get(o, "id")),
                        "chatcmpl-fake-1");
    assert_string_equal(json_string_value(json_object_get(o, "model")),
                        "fake-model");
    msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0),
                          "message");
    assert_string_equal(json_string_value(json_object_get(msg, "role")),
                        "assistant");
    assert_string_equal(json_string_value(json_object_get(msg, "content")),
                        "Let me check.");
    assert_string_equal(
        json_string_value(json_object_get(msg, "reasoning_content")),
        "Thinking");
    calls = json_object_get(msg, "tool_calls");
    assert_int_equal(json_array_size(calls), 2);
    assert_string_equal(
        json_string_value(json_object_get(
            json_object_get(json_array_get(calls, 0), "function"),
            "arguments")),
        "{\"city\":\"Paris\"}");
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(calls, 1), "id")),
        "call_b");
    assert_string_equal(finish_of(o), "tool_calls");
    usage = json_object_get(o, "usage");
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(usage, "completion_tokens_details"),
                         "reasoning_tokens")),
                     2);
    json_decref(o);
    free_res(&r);
    stop(f);
}

static void test_plain_text_answer_defaults(void **state)
{
    loom_fake *f = start("{\"responses\":[{\"text\":[\"hi\"],"
                         "\"model\":\"m1\",\"id\":\"x-1\","
                         "\"finish_reason\":\"length\"},{}]}");
    http_res r;
    json_t *o, *msg;

    (void)state;
    post(f, "{}", &r);
    o = json_loadb(r.body, r.len, 0, NULL);
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(o, "id")), "x-1");
    assert_string_equal(json_string_value(json_object_get(o, "model")), "m1");
    assert_string_equal(finish_of(o), "length");
    assert_null(json_object_get(o, "usage"));
    msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0),
                          "message");
    assert_null(json_object_get(msg, "tool_calls"));
    assert_null(json_object_get(msg, "reasoning_content"));
    json_decref(o);
    free_res(&r);

    /* An empty entry: an empty answer that stops. */
    post(f, "{}", &r);
    o = json_loadb(r.body, r.len, 0, NULL);
    assert_string_equal(finish_of(o), "stop");
    assert_string_equal(json_string_value(json_object_get(o, "id")),
                        "chatcmpl-fake-2");
    json_decref(o);
    free_res(&r);
    stop(f);
}

/* ---- errors and misbehaviour ------------------------------------------- */

static void test_error_with_retry_after(void **state)
{
    loom_fake *f = start(
        "{\"responses\":[{\"status\":429,\"headers\":{\"Retry-After\":\"7\","
        "\"X-Fake-Test\":\"yes\"},\"error\":{\"message\":\"Rate limit\","
        "\"type\":\"rate_limit_error\",\"code\":\"rate_limit_exceeded\"}},"
        "{\"error\":{\"message\":\"boom\",\"type\":\"server_error\"}}]}");
    http_res r;
    json_t *o, *err;

    (void)state;
    post(f, stream_req, &r);
    assert_int_equal(r.rc, CURLE_OK);
    assert_int_equal(r.status, 429);
    assert_string_equal(r.retry_after, "7");
    assert_string_equal(r.custom, "yes");
    assert_string_equal(r.ctype, "application/json");
    o = json_loadb(r.body, r.len, 0, NULL);
    err = json_object_get(o, "error");
    assert_string_equal(json_string_value(json_object_get(err, "message")),
                        "Rate limit");
    assert_string_equal(json_string_value(json_object_get(err, "code")),
                        "rate_limit_exceeded");
    json_decref(o);
    free_res(&r);

    post(f, stream_req, &r); /* no status: 500 */
    assert_int_equal(r.status, 500);
    assert_non_null(strstr(r.body, "boom"));
    free_res(&r);
    stop(f);
}

static void test_disconnect_after_chunks(void **state)
{
    loom_fake *f = start("{\"responses\":[{\"text\":[\"a\",\"b\",\"c\"],"
                         "\"disconnect_after_chunks\":2}]}");
    http_res r;
    json_t *ev;

    (void)state;
    post(f, stream_req, &r);
    assert_true(r.rc == CURLE_PARTIAL_FILE || r.rc == CURLE_RECV_ERROR);
    assert_int_equal(r.status, 200);
    ev = sse_events(r.body, r.len);
    assert_int_equal(json_array_size(ev), 2); /* role and "a" */
    json_decref(ev);
    free_res(&r);
    stop(f);
}

static void test_hang_times_out(void **state)
{
    loom_fake *f = start("{\"responses\":[{\"text\":[\"a\"],\"hang\":true,"
                         "\"hang_after_chunks\":1},{\"hang\":true}]}");
    http_res r;
    json_t *ev;

    (void)state;
    http(f, &(http_req){.body = stream_req, .timeout_ms = 300}, &r);
    assert_int_equal(r.rc, CURLE_OPERATION_TIMEDOUT);
    assert_int_equal(r.status, 200); /* headers came before the hang */
    ev = sse_events(r.body, r.len);
    assert_int_equal(json_array_size(ev), 1);
    json_decref(ev);
    free_res(&r);

    /* hang_after_chunks 0, and on a non-streamed answer too. */
    http(f, &(http_req){.body = "{}", .timeout_ms = 300}, &r);
    assert_int_equal(r.rc, CURLE_OPERATION_TIMEDOUT);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.len, 0);
    free_res(&r);
    stop(f);
}

static void test_hang_does_not_block_others(void **state)
{
    loom_fake *f = start("{\"responses\":[{\"hang\":true},{\"text\":"
                         "[\"ok\"]}]}");
    CURLM *m = curl_multi_init();
    CURL *h = curl_easy_init();
    char url[256];
    long long end = test_now_ms() + 60000;
    int running = 1;
    http_res r;

    (void)state;
    snprintf(url, sizeof(url), "%s/chat/completions", fake_base_url(f));
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, stream_req);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &r);
    memset(&r, 0, sizeof(r));
    curl_multi_add_handle(m, h);
    /* Drive the hung request until the fake has it. */
    while (fake_request_count(f) < 1 && test_now_ms() < end) {
        curl_multi_perform(m, &running);
        curl_multi_poll(m, NULL, 0, 20, NULL);
    }
    assert_int_equal(fake_request_count(f), 1);
    {
        http_res r2;

        post(f, stream_req, &r2);
        assert_int_equal(r2.rc, CURLE_OK);
        assert_non_null(strstr(r2.body, "\"ok\""));
        free_res(&r2);
    }
    curl_multi_perform(m, &running);
    assert_int_equal(running, 1); /* still hanging */
    curl_multi_remove_handle(m, h);
    curl_easy_cleanup(h);
    curl_multi_cleanup(m);
    free_res(&r);
    stop(f);
}

static void test_stream_error(void **state)
{
    loom_fake *f = start("{\"responses\":[{\"text\":[\"par\",\"tial\"],"
                         "\"stream_error\":{\"message\":\"overloaded\","
                         "\"type\":\"server_error\"}}]}");
    http_res r;
    json_t *ev, *last;

    (void)state;
    post(f, stream_req, &r);
    assert_int_equal(r.rc, CURLE_OK);
    assert_int_equal(r.status, 200);
    ev = sse_events(r.body, r.len);
    assert_int_equal(json_array_size(ev), 4); /* role, 2 text, error */
    last = json_object_get(json_array_get(ev, 3), "error");
    assert_string_equal(json_string_value(json_object_get(last, "message")),
                        "overloaded");
    json_decref(ev);
    free_res(&r);
    stop(f);
}

static void test_delays_are_applied(void **state)
{
    loom_fake *f = start("{\"responses\":[{\"delay_ms\":300,\"text\":[\"a\"]},"
                         "{\"chunk_delay_ms\":100,\"text\":[\"a\",\"b\"]}]}");
    long long t0;
    http_res r;

    (void)state;
    /* Only lower bounds: a loaded machine can only make these slower. */
    t0 = test_now_ms();
    post(f, "{}", &r);
    assert_int_equal(r.rc, CURLE_OK);
    assert_true(test_now_ms() - t0 >= 300);
    free_res(&r);
    t0 = test_now_ms();
    post(f, stream_req, &r); /* role, a, b, finish, [DONE]: 5 chunks */
    assert_int_equal(r.rc, CURLE_OK);
    assert_true(test_now_ms() - t0 >= 500);
    assert_non_null(strstr(r.body, "[DONE]"));
    free_res(&r);
    stop(f);
}

/* ---- bodies ----------------------------------------------------------------
 */

static const char *body_script =
    "{\"responses\":[{\"body_file\":\"v.sse\"},"
    "{\"body_file\":\"v.sse\",\"disconnect_after_chunks\":3},"
    "{\"body\":\"hello\",\"status\":201,"
    "\"content_type\":\"text/plain\","
    "\"headers\":{\"X-Fake-Test\":\"1\"}}]}";

static void test_body_and_body_file(void **state)
{
    char *vec = test_vector_path("openai-chat/stream-works-1.sse");
    char *dir = test_tmp_path("fakedir");
    char path[512], script[512];
    size_t len;
    char *want = test_read_file(vec, &len);
    loom_fake *f;
    http_res r;
    json_t *ev;

    (void)state;
    assert_non_null(want);
    assert_int_equal(test_mkdir_p(dir), 0);
    snprintf(path, sizeof(path), "%s/v.sse", dir);
    assert_int_equal(test_write_file(path, want, len), 0);
    snprintf(script, sizeof(script), "%s/s.json", dir);
    /* body_file relative to the script; chunk options split it into
     * events; body with its own content type and headers */
    assert_int_equal(test_write_file(script, body_script, strlen(body_script)),
                     0);
    f = fake_start_script_file(script);
    assert_non_null(f);
    post(f, stream_req, &r);
    assert_int_equal(r.rc, CURLE_OK);
    assert_string_equal(r.ctype, "text/event-stream");
    assert_int_equal(r.len, len);
    assert_memory_equal(r.body, want, len);
    free_res(&r);

    post(f, stream_req, &r);
    assert_true(r.rc == CURLE_PARTIAL_FILE || r.rc == CURLE_RECV_ERROR);
    ev = sse_events(r.body, r.len);
    assert_int_equal(json_array_size(ev), 3);
    assert_memory_equal(r.body, want, r.len); /* a prefix of the file */
    json_decref(ev);
    free_res(&r);

    post(f, "{}", &r);
    assert_int_equal(r.status, 201);
    assert_string_equal(r.ctype, "text/plain");
    assert_string_equal(r.custom, "1");
    assert_string_equal(r.body, "hello");
    free_res(&r);
    stop(f);
    unlink(path);
    unlink(script);
    rmdir(dir);
    free(dir);
    free(want);
    free(vec);
}

/* ---- recording, loop, exhaustion, stats -------------------------------- */

static void test_record(void **state)
{
    loom_fake *f = start("{\"loop\":true,\"responses\":[{\"text\":[\"x\"]}]}");
    http_req q = {.path = "/chat/completions?alt=sse&k=v",
                  .body = "{\"model\":\"gpt\",\"messages\":[{\"role\":"
                          "\"user\",\"content\":\"hi\"}]}",
                  .headers = "Authorization: Bearer sk-test\n"
                             "X-Custom-Thing: Value 1\n"
                             "Content-Type: application/json"};
    json_t *reqs, *a, *h;
    http_res r;

    (void)state;
    http(f, &q, &r);
    assert_int_equal(r.rc, CURLE_OK);
    free_res(&r);
    http(f, &(http_req){.path = "/_fake/stats", .root = true},
         &r); /* not recorded */
    free_res(&r);
    http(f, &(http_req){.body = "not json \xff\xfe", .method = "PUT"}, &r);
    free_res(&r);

    reqs = fake_requests(f);
    assert_int_equal(json_array_size(reqs), 2);
    a = json_array_get(reqs, 0);
    assert_int_equal(json_integer_value(json_object_get(a, "n")), 1);
    assert_string_equal(json_string_value(json_object_get(a, "method")),
                        "POST");
    assert_string_equal(json_string_value(json_object_get(a, "path")),
                        "/v1/chat/completions");
    assert_string_equal(json_string_value(json_object_get(a, "query")),
                        "alt=sse&k=v");
    h = json_object_get(a, "headers");
    assert_string_equal(json_string_value(json_object_get(h, "authorization")),
                        "Bearer sk-test");
    assert_string_equal(json_string_value(json_object_get(h, "x-custom-thing")),
                        "Value 1");
    assert_string_equal(
        json_string_value(json_object_get(
            json_array_get(
                json_object_get(json_object_get(a, "body"), "messages"), 0),
            "content")),
        "hi");
    assert_null(json_object_get(a, "body_text"));

    a = json_array_get(reqs, 1);
    assert_int_equal(json_integer_value(json_object_get(a, "n")), 2);
    assert_string_equal(json_string_value(json_object_get(a, "method")), "PUT");
    assert_string_equal(json_string_value(json_object_get(a, "query")), "");
    assert_null(json_object_get(a, "body"));
    /* invalid UTF-8 becomes U+FFFD so the record stays valid JSON */
    assert_string_equal(json_string_value(json_object_get(a, "body_text")),
                        "not json \xef\xbf\xbd\xef\xbf\xbd");
    json_decref(reqs);

    a = fake_request(f, 1);
    assert_non_null(a);
    json_decref(a);
    assert_null(fake_request(f, 2));
    stop(f);
}

static void test_loop(void **state)
{
    loom_fake *f = start("{\"loop\":true,\"responses\":[{\"body\":\"A\"},"
                         "{\"body\":\"B\"}]}");
    const char *want = "ABABA";
    CURL *h = curl_easy_init();
    http_res r;
    int i;

    (void)state;
    for (i = 0; i < 5; i++) {
        http_on(h, f, &(http_req){.body = "{}"}, &r);
        assert_int_equal(r.rc, CURLE_OK);
        assert_int_equal(r.len, 1);
        assert_int_equal(r.body[0], want[i]);
        free_res(&r);
    }
    curl_easy_cleanup(h);
    stop(f);
}

static void test_script_exhausted(void **state)
{
    loom_fake *f = start("{\"responses\":[{\"body\":\"A\"}]}");
    http_res r;
    json_t *o;

    (void)state;
    post(f, "{}", &r);
    assert_int_equal(r.status, 200);
    free_res(&r);
    post(f, stream_req, &r);
    assert_int_equal(r.status, 500);
    o = json_loadb(r.body, r.len, 0, NULL);
    assert_non_null(strstr(json_string_value(json_object_get(
                               json_object_get(o, "error"), "message")),
                           "exhausted"));
    json_decref(o);
    free_res(&r);
    assert_int_equal(fake_request_count(f), 2);
    stop(f);
}

static void test_stats(void **state)
{
    loom_fake *f = start("{\"responses\":["
                         "{\"delay_ms\":1500,\"text\":[\"a\"]},"
                         "{\"text\":[\"b\"]},{\"text\":[\"c\"]}]}");
    http_req sq = {.path = "/_fake/stats", .root = true};
    http_res r;
    json_t *o;
    int i;

    (void)state;
    for (i = 0; i < 3; i++) {
        post(f, stream_req, &r);
        assert_int_equal(r.status, 200);
        free_res(&r);
    }
    for (i = 0; i < 2; i++) { /* reading stats counts nothing */
        http(f, &sq, &r);
        assert_int_equal(r.status, 200);
        o = json_loadb(r.body, r.len, 0, NULL);
        assert_non_null(o);
        assert_int_equal(json_integer_value(json_object_get(o, "requests")), 3);
        assert_true(json_is_integer(json_object_get(o, "busy_us")));
        /* a 1.5 s delay was scripted; it is not busy time */
        assert_true(json_integer_value(json_object_get(o, "busy_us")) <
                    1500000);
        json_decref(o);
        free_res(&r);
    }
    assert_int_equal(fake_request_count(f), 3);
    stop(f);
}

static void test_keep_alive_many_requests(void **state)
{
    loom_fake *f = start("{\"loop\":true,\"responses\":[{\"text\":[\"a\"]}]}");
    CURL *h = curl_easy_init();
    long conns = 0;
    http_res r;
    int i;

    (void)state;
    for (i = 0; i < 300; i++) {
        http_on(h, f, &(http_req){.body = stream_req}, &r);
        assert_int_equal(r.rc, CURLE_OK);
        assert_int_equal(r.status, 200);
        free_res(&r);
        if (i) {
            curl_easy_getinfo(h, CURLINFO_NUM_CONNECTS, &conns);
            assert_int_equal(conns, 0); /* the connection was reused */
        }
    }
    curl_easy_cleanup(h);
    assert_int_equal(fake_request_count(f), 300);
    stop(f);
}

/* ---- limits ----------------------------------------------------------------
 */

static void test_body_limit(void **state)
{
    loom_fake *f = start("{\"loop\":true,\"responses\":[{\"body\":\"ok\"}]}");
    size_t max = 16u * 1024 * 1024;
    char *big = malloc(max + 1);
    json_t *rec;
    http_res r;

    (void)state;
    assert_non_null(big);
    memset(big, 'x', max + 1);
    /* exactly the limit: accepted */
    http(f, &(http_req){.body = big, .body_len = max}, &r);
    assert_int_equal(r.rc, CURLE_OK);
    assert_int_equal(r.status, 200);
    free_res(&r);
    rec = fake_request(f, 0);
    assert_int_equal(json_string_length(json_object_get(rec, "body_text")),
                     max);
    json_decref(rec);
    /* one byte more, declared: refused before the body is read */
    http(f, &(http_req){.body = big, .body_len = max + 1}, &r);
    assert_int_equal(r.rc, CURLE_OK);
    assert_int_equal(r.status, 413);
    free_res(&r);
    /* one byte more, chunked: refused at the end */
    http(f, &(http_req){.body = big, .body_len = max + 1, .chunked = true}, &r);
    assert_int_equal(r.rc, CURLE_OK);
    assert_int_equal(r.status, 413);
    free_res(&r);
    rec = fake_request(f, 2);
    assert_true(json_is_true(json_object_get(rec, "body_too_large")));
    json_decref(rec);
    free(big);
    stop(f);
}

/* ---- process behaviour ------------------------------------------------- */

static void test_max_requests_exits(void **state)
{
    char *path = test_vector_path("openai-chat/stream-works-1.sse");
    const char *args[] = {"--replay", path, "--max-requests", "2", NULL};
    loom_fake *f = fake_start_argv(args);
    http_res r;

    (void)state;
    assert_non_null(f);
    http(f, &(http_req){.path = "/_fake/stats", .root = true},
         &r); /* not counted */
    free_res(&r);
    http(f, &(http_req){0}, &r);
    assert_int_equal(r.status, 200);
    free_res(&r);
    assert_int_equal(fake_wait_exit(f, 0), -1); /* one to go */
    http(f, &(http_req){0}, &r);
    assert_int_equal(r.status, 200);
    free_res(&r);
    assert_int_equal(fake_wait_exit(f, 60000), 0);
    stop(f);
    free(path);
}

static void test_max_seconds_and_port_file(void **state)
{
    char *path = test_vector_path("openai-chat/stream-works-1.sse");
    char *pf = test_tmp_path("fake-port");
    const char *args[] = {"--replay", path, "--max-seconds", "1", "--port-file",
                          pf,         NULL};
    loom_fake *f = fake_start_argv(args);
    char *text;

    (void)state;
    assert_non_null(f);
    text = test_read_file(pf, NULL);
    assert_non_null(text);
    assert_int_equal(atoi(text), fake_port(f));
    free(text);
    assert_int_equal(fake_wait_exit(f, 60000), 0);
    stop(f);
    unlink(pf);
    free(pf);
    free(path);
}

static void test_bad_arguments_exit_2(void **state)
{
    char *vec = test_vector_path("openai-chat/stream-works-1.sse");
    char *bad = test_tmp_path("bad-script.json");
    static const char *const scripts[] = {
        "{\"responses\":[",                           /* not JSON */
        "[]",                                         /* not an object */
        "{\"responses\":[{\"txt\":[\"typo\"]}]}",     /* unknown field */
        "{\"responses\":[{\"status\":\"200\"}]}",     /* wrong type */
        "{\"responses\":[{\"text\":\"not array\"}]}", /* wrong type */
        "{\"responses\":[{\"body_file\":\"/nonexistent/x\"}]}",
        "{\"responses\":[{\"tool_calls\":[{\"arguments\":\"{}\"}]}]}",
        "{\"loop\":true,\"responses\":[]}",
    };
    size_t i;

    (void)state;
    {
        const char *a[] = {"--bogus", NULL};
        assert_int_equal(run_fake(a), 2);
    }
    {
        const char *a[] = {NULL};
        assert_int_equal(run_fake(a), 2);
    }
    {
        const char *a[] = {"--replay", vec, "--script", vec, NULL};
        assert_int_equal(run_fake(a), 2);
    }
    {
        const char *a[] = {"--replay", "/nonexistent.sse", NULL};
        assert_int_equal(run_fake(a), 2);
    }
    {
        const char *a[] = {"--replay", vec, "--port", "70000", NULL};
        assert_int_equal(run_fake(a), 2);
    }
    {
        const char *a[] = {"--replay", vec, "--max-requests", "0", NULL};
        assert_int_equal(run_fake(a), 2);
    }
    {
        const char *a[] = {"--replay", vec, "--status", NULL};
        assert_int_equal(run_fake(a), 2);
    }
    for (i = 0; i < sizeof(scripts) / sizeof(*scripts); i++) {
        const char *a[] = {"--script", bad, NULL};

        assert_int_equal(test_write_file(bad, scripts[i], strlen(scripts[i])),
                         0);
        if (run_fake(a) != 2)
            fail_msg("script %zu was accepted: %s", i, scripts[i]);
    }
    unlink(bad);
    free(bad);
    free(vec);
}

static int setup(void **state)
{
    (void)state;
    return curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    curl_global_cleanup();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replay_is_byte_identical),
        cmocka_unit_test(test_replay_status),
        cmocka_unit_test(test_stream_interleaved_tool_calls),
        cmocka_unit_test(test_stream_sequential_tool_calls),
        cmocka_unit_test(test_non_streaming),
        cmocka_unit_test(test_plain_text_answer_defaults),
        cmocka_unit_test(test_error_with_retry_after),
        cmocka_unit_test(test_disconnect_after_chunks),
        cmocka_unit_test(test_hang_times_out),
        cmocka_unit_test(test_hang_does_not_block_others),
        cmocka_unit_test(test_stream_error),
        cmocka_unit_test(test_delays_are_applied),
        cmocka_unit_test(test_body_and_body_file),
        cmocka_unit_test(test_record),
        cmocka_unit_test(test_loop),
        cmocka_unit_test(test_script_exhausted),
        cmocka_unit_test(test_stats),
        cmocka_unit_test(test_keep_alive_many_requests),
        cmocka_unit_test(test_body_limit),
        cmocka_unit_test(test_max_requests_exits),
        cmocka_unit_test(test_max_seconds_and_port_file),
        cmocka_unit_test(test_bad_arguments_exit_2),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
