/*
 * Tests of loom-fake-upstream itself, through libcurl (not through loom's
 * HTTP code, which these fakes exist to test). Every behaviour the docs
 * promise is exercised: replay, generated streams and answers in the four
 * wire formats (the other formats compared with the recorded vectors),
 * choosing the format by path or script, errors,
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
#include <pthread.h>
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

/* The threads of process pid (its /proc status), or -1. */
static long proc_threads(pid_t pid)
{
    char path[64], line[256];
    long n = -1;
    FILE *fp;

    snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
    fp = fopen(path, "r");
    while (fp && n < 0 && fgets(line, sizeof(line), fp))
        if (!strncmp(line, "Threads:", 8))
            n = strtol(line + 8, NULL, 10);
    if (fp)
        fclose(fp);
    return n;
}

/* Event mode (the default): 300 slow streams open at once are served by
 * the same few threads, and every one of them ends whole. */
static void test_many_slow_streams_few_threads(void **state)
{
    enum { NSTREAMS = 300 };
    loom_fake *f = start("{\"loop\":true,\"responses\":[{\"text\":[\"a\","
                         "\"b\",\"c\"],\"chunk_delay_ms\":50}]}");
    CURLM *m = curl_multi_init();
    CURL *h[NSTREAMS];
    http_res r[NSTREAMS];
    char url[256];
    long long end = test_now_ms() + 120000;
    long threads = -1;
    int running = 1, i;

    (void)state;
    snprintf(url, sizeof(url), "%s/chat/completions", fake_base_url(f));
    memset(r, 0, sizeof(r));
    for (i = 0; i < NSTREAMS; i++) {
        h[i] = curl_easy_init();
        curl_easy_setopt(h[i], CURLOPT_URL, url);
        curl_easy_setopt(h[i], CURLOPT_POSTFIELDS, stream_req);
        curl_easy_setopt(h[i], CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(h[i], CURLOPT_WRITEDATA, &r[i]);
        curl_multi_add_handle(m, h[i]);
    }
    while (running && test_now_ms() < end) {
        curl_multi_perform(m, &running);
        /* Once every stream is in, count the fake's threads once. */
        if (threads < 0 && fake_request_count(f) == NSTREAMS)
            threads = proc_threads(fake_pid(f));
        curl_multi_poll(m, NULL, 0, 20, NULL);
    }
    assert_int_equal(running, 0);
    assert_true(threads > 0);
    assert_true(threads <= 8); /* main, waiter, the epoll threads */
    for (i = 0; i < NSTREAMS; i++) {
        assert_non_null(strstr(r[i].body, "\"c\""));
        assert_non_null(strstr(r[i].body, "[DONE]"));
        curl_multi_remove_handle(m, h[i]);
        curl_easy_cleanup(h[i]);
        free_res(&r[i]);
    }
    curl_multi_cleanup(m);
    stop(f);
}

/* --threads keeps the first design (a thread per connection): delays
 * still apply and a hang still ends when its client leaves. */
static void test_threads_mode(void **state)
{
    static const char script[] =
        "{\"responses\":[{\"delay_ms\":100,\"chunk_delay_ms\":50,"
        "\"text\":[\"a\",\"b\"]},{\"hang\":true}]}";
    char *path = test_tmp_path("threads-script.json");
    const char *args[] = {"--threads", "--script", path, NULL};
    loom_fake *f;
    long long t0;
    http_res r;
    json_t *st;

    (void)state;
    assert_int_equal(test_write_file(path, script, strlen(script)), 0);
    f = fake_start_argv(args);
    assert_non_null(f);
    t0 = test_now_ms();
    post(f, stream_req, &r); /* 100 ms, then 5 chunks 50 ms apart */
    assert_int_equal(r.rc, CURLE_OK);
    assert_true(test_now_ms() - t0 >= 350);
    assert_non_null(strstr(r.body, "[DONE]"));
    free_res(&r);
    http(f, &(http_req){.body = stream_req, .timeout_ms = 300}, &r);
    assert_int_equal(r.rc, CURLE_OPERATION_TIMEDOUT);
    free_res(&r);
    /* The client is gone: the hang leaves the count (polled, bounded). */
    for (int i = 0; i < 600; i++) {
        json_int_t hanging;

        http(f, &(http_req){.path = "/_fake/stats", .root = true}, &r);
        st = json_loads(r.body, 0, NULL);
        free_res(&r);
        hanging = json_integer_value(json_object_get(st, "hanging"));
        json_decref(st);
        if (hanging == 0)
            break;
        assert_true(i < 599);
        usleep(10000);
    }
    stop(f);
    unlink(path);
    free(path);
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

/* ---- other wire formats: helpers ---------------------------------------- */

/*
 * Splits an SSE body into its events, strictly: each is an optional
 * `event: NAME` line and one `data: ` line, every line ending in eol ("\n"
 * or "\r\n") and every event in a blank line. Returns a JSON array of
 * {"event": NAME (absent without the line), "data": parsed JSON or
 * "[DONE]"}; fails the test on anything else.
 */
static json_t *sse_parse(const char *body, size_t len, const char *eol)
{
    size_t el = strlen(eol);
    json_t *out = json_array();
    const char *p = body, *end = body + len;
    char sep[8];

    snprintf(sep, sizeof(sep), "%s%s", eol, eol);
    while (p < end) {
        const char *e = memmem(p, (size_t)(end - p), sep, 2 * el), *d, *nl;
        json_t *ev = json_object(), *o;
        json_error_t err;

        if (!e)
            fail_msg("event without its blank line: %.*s", (int)(end - p), p);
        if (!strncmp(p, "event: ", 7)) {
            nl = memmem(p, (size_t)(e - p), eol, el);
            assert_non_null(nl);
            json_object_set_new(ev, "event",
                                json_stringn(p + 7, (size_t)(nl - p - 7)));
            p = nl + el;
        }
        if (strncmp(p, "data: ", 6))
            fail_msg("not a data line: %.*s", (int)(e - p), p);
        d = p + 6;
        assert_null(memchr(d, '\n', (size_t)(e - d)));
        assert_null(memchr(d, '\r', (size_t)(e - d)));
        if (e - d == 6 && !strncmp(d, "[DONE]", 6)) {
            o = json_string("[DONE]");
        } else {
            o = json_loadb(d, (size_t)(e - d), 0, &err);
            if (!o)
                fail_msg("bad event json: %s: %.*s", err.text, (int)(e - d), d);
        }
        json_object_set_new(ev, "data", o);
        json_array_append_new(out, ev);
        p = e + 2 * el;
    }
    return out;
}

/* A recorded vector parsed with sse_parse(). */
static json_t *vector_events(const char *rel, const char *eol)
{
    char *path = test_vector_path(rel);
    size_t len;
    char *body = test_read_file(path, &len);
    json_t *ev;

    assert_non_null(body);
    ev = sse_parse(body, len, eol);
    free(body);
    free(path);
    return ev;
}

/* The value at a dotted path ("a.0.b": key, array index, key); borrowed,
 * NULL when absent. */
static json_t *jp(json_t *j, const char *path)
{
    char buf[256], *save = NULL, *seg;

    snprintf(buf, sizeof(buf), "%s", path);
    for (seg = strtok_r(buf, ".", &save); seg && j;
         seg = strtok_r(NULL, ".", &save)) {
        if (json_is_array(j))
            j = json_array_get(j, strtoul(seg, NULL, 10));
        else
            j = json_object_get(j, seg);
    }
    return j;
}

static void check_str(json_t *j, const char *path, const char *want)
{
    const char *got = json_string_value(jp(j, path));

    if (!got || strcmp(got, want))
        fail_msg("%s: want \"%s\", got %s", path, want,
                 got ? got : "(not a string)");
}

static void check_int(json_t *j, const char *path, json_int_t want)
{
    json_t *v = jp(j, path);

    if (!json_is_integer(v) || json_integer_value(v) != want)
        fail_msg("%s: want %lld, got %lld%s", path, (long long)want,
                 (long long)json_integer_value(v),
                 json_is_integer(v) ? "" : " (not an integer)");
}

static void check_json(json_t *got, json_t *want)
{
    if (!json_equal(got, want)) {
        char *a = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS);
        char *b = json_dumps(want, JSON_COMPACT | JSON_SORT_KEYS);

        fail_msg("json differs:\n got  %s\n want %s", a, b);
    }
}

/* Event i's data (borrowed). */
static json_t *ev_data(json_t *evs, size_t i)
{
    return json_object_get(json_array_get(evs, i), "data");
}

/* The names of events: the `event:` line, else data.type, else the data
 * string ("[DONE]"); a new array. */
static json_t *ev_names(json_t *evs)
{
    json_t *out = json_array(), *e, *n;
    size_t i;

    json_array_foreach(evs, i, e)
    {
        n = json_object_get(e, "event");
        if (!n)
            n = json_object_get(json_object_get(e, "data"), "type");
        if (!n)
            n = json_object_get(e, "data");
        json_array_append(out, n);
    }
    return out;
}

/* A comma-separated list as a JSON array of strings. */
static json_t *list(const char *csv)
{
    json_t *out = json_array();
    const char *p = csv, *c;

    while (*p) {
        c = strchr(p, ',');
        if (!c)
            c = p + strlen(p);
        json_array_append_new(out, json_stringn(p, (size_t)(c - p)));
        p = *c ? c + 1 : c;
    }
    return out;
}

static bool in_list(const char *s, const char *const *l)
{
    for (; l && *l; l++)
        if (!strcmp(s, *l))
            return true;
    return false;
}

/*
 * True when a and b have the same structure: the same JSON types (any
 * number, any boolean), objects with the same keys (values under a key in
 * skip are not compared), arrays both empty or both not (elements
 * compared pairwise).
 */
static bool same_shape(json_t *a, json_t *b, const char *const *skip)
{
    const char *k;
    json_t *v;
    size_t i;

    if (json_is_number(a) && json_is_number(b))
        return true;
    if (json_is_boolean(a) && json_is_boolean(b))
        return true;
    if (json_typeof(a) != json_typeof(b))
        return false;
    if (json_is_object(a)) {
        if (json_object_size(a) != json_object_size(b))
            return false;
        json_object_foreach(a, k, v)
        {
            json_t *w = json_object_get(b, k);

            if (!w || (!in_list(k, skip) && !same_shape(v, w, skip)))
                return false;
        }
    } else if (json_is_array(a)) {
        if (!json_array_size(a) != !json_array_size(b))
            return false;
        for (i = 0; i < json_array_size(a) && i < json_array_size(b); i++)
            if (!same_shape(json_array_get(a, i), json_array_get(b, i), skip))
                return false;
    }
    return true;
}

static void check_shape(json_t *got, json_t *want, const char *const *skip)
{
    if (!same_shape(got, want, skip)) {
        char *a = json_dumps(got, JSON_COMPACT);
        char *b = json_dumps(want, JSON_COMPACT);

        fail_msg("shape differs:\n got  %s\n want %s", a, b);
    }
}

/*
 * Checks that the recorded event names `want` are, in order, a
 * subsequence of `got` whose other names are all in `extra`; returns the
 * index in got of each of want's events (a new array).
 */
static json_t *check_names_sub(json_t *got, json_t *want,
                               const char *const *extra)
{
    json_t *map = json_array();
    size_t i, j = 0;

    for (i = 0; i < json_array_size(got); i++) {
        const char *g = json_string_value(json_array_get(got, i));

        if (j < json_array_size(want) &&
            !strcmp(g, json_string_value(json_array_get(want, j)))) {
            json_array_append_new(map, json_integer((json_int_t)i));
            j++;
        } else if (!in_list(g, extra)) {
            fail_msg("unexpected event %zu: %s", i, g);
        }
    }
    if (j != json_array_size(want))
        fail_msg("recorded event %zu (%s) missing", j,
                 json_string_value(json_array_get(want, j)));
    return map;
}

/* POSTs body to path from the server root. */
static void post_to(const loom_fake *f, const char *path, const char *body,
                    http_res *r)
{
    http_req q = {.path = path,
                  .body = body,
                  .headers = "Content-Type: application/json",
                  .root = true};

    http(f, &q, r);
    assert_int_equal(r->rc, CURLE_OK);
}

/* Parses a JSON answer body (fails the test if it is not JSON). */
static json_t *body_json(const http_res *r)
{
    json_error_t err;
    json_t *o = json_loadb(r->body, r->len, 0, &err);

    if (!o)
        fail_msg("answer is not JSON: %s: %s", err.text, r->body);
    return o;
}

#define ANTHROPIC_PATH "/v1/messages"
#define GEMINI_SSE_PATH "/v1beta/models/m:streamGenerateContent?alt=sse"
#define GEMINI_ARRAY_PATH "/v1beta/models/m:streamGenerateContent"
#define GEMINI_ONE_PATH "/v1beta/models/m:generateContent"
#define RESPONSES_PATH "/v1/responses"

static const char *const no_skip[] = {NULL};

/* ---- Anthropic Messages --------------------------------------------------
 */

/* Compares a stream with a recorded one event by event: the same names in
 * the same order and equal data, except message_delta's usage (ours has
 * every usage field, the recordings only output_tokens). */
static void check_like_anthropic_vector(json_t *got, const char *rel)
{
    json_t *want = vector_events(rel, "\n"), *gn = ev_names(got),
           *wn = ev_names(want);
    size_t i;

    check_json(gn, wn);
    for (i = 0; i < json_array_size(want); i++) {
        json_t *g = ev_data(got, i), *w = ev_data(want, i);

        if (!strcmp(json_string_value(json_array_get(wn, i)),
                    "message_delta")) {
            check_int(g, "usage.output_tokens",
                      json_integer_value(jp(w, "usage.output_tokens")));
            g = json_copy(g);
            w = json_copy(w);
            json_object_del(g, "usage");
            json_object_del(w, "usage");
            check_json(g, w);
            json_decref(g);
            json_decref(w);
        } else {
            check_json(g, w);
        }
    }
    json_decref(gn);
    json_decref(wn);
    json_decref(want);
}

static void test_anthropic_stream_like_vectors(void **state)
{
    loom_fake *f = start(
        "{\"responses\":[{\"id\":\"msg_4QpJur2dWWDjF6C758FbBw5vm12BaVipnK\","
        "\"model\":\"claude-opus-4-8\",\"text\":[\"Hello\",\" there\",\"!\"],"
        "\"usage\":{\"input_tokens\":11,\"output_tokens\":6}},"
        "{\"id\":\"msg_019Q1hrJbZG26Fb9BQhrkHEr\",\"model\":\"claude-opus-4-"
        "8\","
        "\"text\":[\"I\",\"'ll check the current weather in Paris for you.\"],"
        "\"tool_calls\":[{\"id\":\"toolu_01NRLabsLyVHZPKxbKvkfSMn\","
        "\"name\":\"get_weather\",\"arguments\":[\"{\\\"locati\","
        "\"on\\\": \\\"P\",\"ar\",\"is\\\"}\"]}],"
        "\"usage\":{\"input_tokens\":377,\"cache_creation_input_tokens\":0,"
        "\"cache_read_input_tokens\":0,\"output_tokens\":65,"
        "\"service_tier\":\"standard\"}}]}");
    http_res r;
    json_t *ev;

    (void)state;
    post_to(f, ANTHROPIC_PATH, "{\"model\":\"m\",\"stream\":true}", &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.ctype, "text/event-stream");
    ev = sse_parse(r.body, r.len, "\n");
    check_like_anthropic_vector(ev, "anthropic/basic_response.sse");
    /* message_delta carries the whole usage */
    check_int(ev_data(ev, json_array_size(ev) - 2), "usage.input_tokens", 11);
    json_decref(ev);
    free_res(&r);

    post_to(f, ANTHROPIC_PATH, "{\"model\":\"m\",\"stream\":true}", &r);
    ev = sse_parse(r.body, r.len, "\n");
    check_like_anthropic_vector(ev, "anthropic/tool_use_response.sse");
    json_decref(ev);
    free_res(&r);
    stop(f);
}

static const char *anthropic_full =
    "{\"reasoning\":[\"Hmm\",\", weather.\"],\"signature\":\"sig-1\","
    "\"redacted_thinking\":\"EmwKAhgB\",\"text\":[\"Checking.\"],"
    "\"tool_calls\":[{\"id\":\"toolu_a\",\"name\":\"get_weather\","
    "\"arguments\":[\"{\\\"city\\\":\",\"\\\"Paris\\\"}\"]},"
    "{\"name\":\"get_time\",\"arguments\":\"{\\\"tz\\\":\\\"CET\\\"}\"}],"
    "\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":20,"
    "\"total_tokens\":120,\"prompt_tokens_details\":{\"cached_tokens\":30}}}";

static void test_anthropic_reasoning_tools_usage(void **state)
{
    char script[2048];
    loom_fake *f;
    http_res r;
    json_t *ev, *names, *want;
    char args[2][64] = {"", ""};
    size_t i;

    (void)state;
    snprintf(script, sizeof(script),
             "{\"responses\":[%s,{\"reasoning\":[\"x\"],"
             "\"finish_reason\":\"length\"}]}",
             anthropic_full);
    f = start(script);
    post_to(f, ANTHROPIC_PATH, "{\"stream\":true}", &r);
    ev = sse_parse(r.body, r.len, "\n");
    names = ev_names(ev);
    want = list("message_start,"
                "content_block_start,ping,content_block_delta,"
                "content_block_delta,content_block_delta,content_block_stop,"
                "content_block_start,content_block_stop,"
                "content_block_start,content_block_delta,content_block_stop,"
                "content_block_start,content_block_delta,content_block_delta,"
                "content_block_delta,content_block_stop,"
                "content_block_start,content_block_delta,content_block_delta,"
                "content_block_stop,message_delta,message_stop");
    check_json(names, want);
    check_str(ev_data(ev, 0), "message.id", "msg_fake_1");
    check_str(ev_data(ev, 0), "message.model", "fake-model");
    /* OpenAI usage translated: input_tokens leaves the cached ones out */
    check_int(ev_data(ev, 0), "message.usage.input_tokens", 70);
    check_int(ev_data(ev, 0), "message.usage.cache_read_input_tokens", 30);
    check_int(ev_data(ev, 0), "message.usage.cache_creation_input_tokens", 0);
    check_int(ev_data(ev, 0), "message.usage.output_tokens", 1);
    check_str(ev_data(ev, 1), "content_block.type", "thinking");
    check_str(ev_data(ev, 3), "delta.type", "thinking_delta");
    check_str(ev_data(ev, 4), "delta.thinking", ", weather.");
    check_str(ev_data(ev, 5), "delta.type", "signature_delta");
    check_str(ev_data(ev, 5), "delta.signature", "sig-1");
    check_str(ev_data(ev, 7), "content_block.type", "redacted_thinking");
    check_str(ev_data(ev, 7), "content_block.data", "EmwKAhgB");
    check_int(ev_data(ev, 7), "index", 1);
    check_str(ev_data(ev, 10), "delta.text", "Checking.");
    check_int(ev_data(ev, 10), "index", 2);
    check_str(ev_data(ev, 12), "content_block.type", "tool_use");
    check_str(ev_data(ev, 12), "content_block.id", "toolu_a");
    check_str(ev_data(ev, 12), "content_block.name", "get_weather");
    assert_int_equal(
        json_object_size(jp(ev_data(ev, 12), "content_block.input")), 0);
    check_str(ev_data(ev, 17), "content_block.id", "toolu_fake_2");
    check_int(ev_data(ev, 17), "index", 4);
    for (i = 13; i < 21; i++) {
        json_t *d = ev_data(ev, i);
        json_int_t idx = json_integer_value(jp(d, "index"));

        if (strcmp(json_string_value(jp(d, "type")), "content_block_delta"))
            continue;
        check_str(d, "delta.type", "input_json_delta");
        strncat(args[idx - 3], json_string_value(jp(d, "delta.partial_json")),
                sizeof(args[0]) - strlen(args[idx - 3]) - 1);
    }
    assert_string_equal(args[0], "{\"city\":\"Paris\"}");
    assert_string_equal(args[1], "{\"tz\":\"CET\"}");
    check_str(ev_data(ev, 21), "delta.stop_reason", "tool_use");
    assert_true(json_is_null(jp(ev_data(ev, 21), "delta.stop_sequence")));
    check_int(ev_data(ev, 21), "usage.output_tokens", 20);
    check_int(ev_data(ev, 21), "usage.input_tokens", 70);
    check_int(ev_data(ev, 21), "usage.cache_read_input_tokens", 30);
    json_decref(names);
    json_decref(want);
    json_decref(ev);
    free_res(&r);

    /* A generated signature, "length" as max_tokens, zero usage. */
    post_to(f, ANTHROPIC_PATH, "{\"stream\":true}", &r);
    ev = sse_parse(r.body, r.len, "\n");
    names = ev_names(ev);
    want = list("message_start,content_block_start,ping,content_block_delta,"
                "content_block_delta,content_block_stop,message_delta,"
                "message_stop");
    check_json(names, want);
    check_str(ev_data(ev, 4), "delta.signature", "fake_signature_2");
    check_str(ev_data(ev, 6), "delta.stop_reason", "max_tokens");
    check_int(ev_data(ev, 6), "usage.output_tokens", 0);
    check_int(ev_data(ev, 0), "message.usage.input_tokens", 0);
    json_decref(names);
    json_decref(want);
    json_decref(ev);
    free_res(&r);
    stop(f);
}

static void test_anthropic_non_streamed(void **state)
{
    char script[2048];
    loom_fake *f;
    http_res r;
    json_t *o, *want;

    (void)state;
    snprintf(script, sizeof(script), "{\"responses\":[%s,{}]}", anthropic_full);
    f = start(script);
    post_to(f, ANTHROPIC_PATH, "{\"model\":\"m\"}", &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.ctype, "application/json");
    o = body_json(&r);
    want = json_loads(
        "{\"id\":\"msg_fake_1\",\"type\":\"message\",\"role\":\"assistant\","
        "\"model\":\"fake-model\",\"content\":["
        "{\"type\":\"thinking\",\"thinking\":\"Hmm, weather.\","
        "\"signature\":\"sig-1\"},"
        "{\"type\":\"redacted_thinking\",\"data\":\"EmwKAhgB\"},"
        "{\"type\":\"text\",\"text\":\"Checking.\"},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_a\",\"name\":\"get_weather\","
        "\"input\":{\"city\":\"Paris\"}},"
        "{\"type\":\"tool_use\",\"id\":\"toolu_fake_2\",\"name\":\"get_time\","
        "\"input\":{\"tz\":\"CET\"}}],"
        "\"stop_reason\":\"tool_use\",\"stop_sequence\":null,"
        "\"usage\":{\"input_tokens\":70,\"output_tokens\":20,"
        "\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":30}}",
        0, NULL);
    check_json(o, want);
    json_decref(want);
    json_decref(o);
    free_res(&r);

    post_to(f, ANTHROPIC_PATH, "{}", &r);
    o = body_json(&r);
    check_str(o, "stop_reason", "end_turn");
    assert_int_equal(json_array_size(jp(o, "content")), 0);
    check_int(o, "usage.input_tokens", 0);
    json_decref(o);
    free_res(&r);
    stop(f);
}

static void test_anthropic_errors(void **state)
{
    loom_fake *f = start(
        "{\"format\":\"anthropic\",\"responses\":["
        "{\"status\":429,\"error\":{\"message\":\"slow down\"}},"
        "{\"status\":529,\"error\":{\"message\":\"Overloaded\"}},"
        "{\"status\":400,\"error\":{\"type\":\"my_type\",\"message\":\"m\"}},"
        "{\"text\":[\"par\",\"tial\"],\"stream_error\":{}},"
        "{\"tool_calls\":[{\"name\":\"t\"}],\"stream_error\":"
        "{\"type\":\"api_error\",\"message\":\"boom\"}},"
        "{\"tool_calls\":[{\"name\":\"t\",\"arguments\":\"{broken\"}]}]}");
    http_res r;
    json_t *o, *ev, *names, *want;

    (void)state;
    post_to(f, ANTHROPIC_PATH, "{\"stream\":true}", &r);
    assert_int_equal(r.status, 429);
    assert_string_equal(r.ctype, "application/json");
    o = body_json(&r);
    want = json_loads("{\"type\":\"error\",\"error\":{\"type\":"
                      "\"rate_limit_error\",\"message\":\"slow down\"}}",
                      0, NULL);
    check_json(o, want);
    json_decref(want);
    json_decref(o);
    free_res(&r);

    post_to(f, ANTHROPIC_PATH, "{\"stream\":true}", &r);
    assert_int_equal(r.status, 529);
    o = body_json(&r);
    check_str(o, "error.type", "overloaded_error");
    json_decref(o);
    free_res(&r);

    post_to(f, ANTHROPIC_PATH, "{}", &r);
    assert_int_equal(r.status, 400);
    o = body_json(&r);
    check_str(o, "type", "error");
    check_str(o, "error.type", "my_type");
    json_decref(o);
    free_res(&r);

    /* In-stream: the text so far, then `event: error`, then nothing. */
    post_to(f, ANTHROPIC_PATH, "{\"stream\":true}", &r);
    assert_int_equal(r.status, 200);
    ev = sse_parse(r.body, r.len, "\n");
    names = ev_names(ev);
    want = list("message_start,content_block_start,ping,content_block_delta,"
                "content_block_delta,error");
    check_json(names, want);
    check_str(ev_data(ev, 5), "type", "error");
    check_str(ev_data(ev, 5), "error.type", "overloaded_error");
    check_str(ev_data(ev, 5), "error.message", "Overloaded");
    json_decref(names);
    json_decref(want);
    json_decref(ev);
    free_res(&r);

    post_to(f, ANTHROPIC_PATH, "{\"stream\":true}", &r);
    ev = sse_parse(r.body, r.len, "\n");
    names = ev_names(ev);
    want = list("message_start,error");
    check_json(names, want);
    check_str(ev_data(ev, 1), "error.type", "api_error");
    check_str(ev_data(ev, 1), "error.message", "boom");
    json_decref(names);
    json_decref(want);
    json_decref(ev);
    free_res(&r);

    /* Arguments that are no JSON object cannot be an input object. */
    post_to(f, ANTHROPIC_PATH, "{}", &r);
    assert_int_equal(r.status, 500);
    o = body_json(&r);
    check_str(o, "type", "error");
    check_str(o, "error.type", "fake_bad_arguments");
    json_decref(o);
    free_res(&r);
    stop(f);
}

/* ---- Gemini -------------------------------------------------------------- */

/* A script entry replaying a recorded Gemini stream's content: its texts
 * (or function calls), id, model and final usage. */
static json_t *gemini_entry_from(json_t *vec)
{
    json_t *last = ev_data(vec, json_array_size(vec) - 1), *texts, *calls;
    json_t *e, *part;
    size_t i;

    texts = json_array();
    calls = json_array();
    json_array_foreach(vec, i, e)
    {
        part = jp(json_object_get(e, "data"), "candidates.0.content.parts.0");
        if (json_object_get(part, "text")) {
            json_array_append(texts, json_object_get(part, "text"));
        } else {
            char *args = json_dumps(jp(part, "functionCall.args"),
                                    JSON_COMPACT | JSON_SORT_KEYS);

            json_array_append_new(calls,
                                  json_pack("{s:O,s:s}", "name",
                                            jp(part, "functionCall.name"),
                                            "arguments", args));
            free(args);
        }
    }
    e = json_pack("{s:O,s:O,s:O}", "id", jp(last, "responseId"), "model",
                  jp(last, "modelVersion"), "usage", jp(last, "usageMetadata"));
    if (json_array_size(texts))
        json_object_set(e, "text", texts);
    if (json_array_size(calls))
        json_object_set(e, "tool_calls", calls);
    json_decref(texts);
    json_decref(calls);
    return e;
}

/* Each chunk equal to the recording's, usageMetadata apart from the last
 * one's (the recordings repeat a prompt count with details each time). */
static void check_like_gemini_vector(json_t *got, json_t *want)
{
    size_t i, n = json_array_size(want);

    assert_int_equal(json_array_size(got), n);
    for (i = 0; i < n; i++) {
        json_t *g = json_copy(ev_data(got, i)),
               *w = json_copy(ev_data(want, i));

        if (i + 1 < n) {
            assert_non_null(json_object_get(g, "usageMetadata"));
            json_object_del(g, "usageMetadata");
            json_object_del(w, "usageMetadata");
        }
        check_json(g, w);
        json_decref(g);
        json_decref(w);
    }
}

static void test_gemini_stream_like_vectors(void **state)
{
    json_t *text = vector_events("gemini/text-0.sse", "\r\n");
    json_t *fc = vector_events("gemini/function-calling-0.sse", "\r\n");
    json_t *sc = json_pack("{s:[oo]}", "responses", gemini_entry_from(text),
                           gemini_entry_from(fc));
    char *script = json_dumps(sc, JSON_COMPACT);
    loom_fake *f = start(script);
    http_res r;
    json_t *ev;

    (void)state;
    post_to(f, "/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse",
            "{\"contents\":[]}", &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.ctype, "text/event-stream");
    ev = sse_parse(r.body, r.len, "\r\n"); /* framed like the recording */
    check_like_gemini_vector(ev, text);
    /* the chunks before the last repeat the prompt count */
    check_int(ev_data(ev, 0), "usageMetadata.promptTokenCount", 6);
    check_int(ev_data(ev, 0), "usageMetadata.totalTokenCount", 6);
    json_decref(ev);
    free_res(&r);

    post_to(f, "/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse",
            "{\"contents\":[]}", &r);
    ev = sse_parse(r.body, r.len, "\r\n");
    check_like_gemini_vector(ev, fc);
    json_decref(ev);
    free_res(&r);
    stop(f);
    free(script);
    json_decref(sc);
    json_decref(text);
    json_decref(fc);
}

static void test_gemini_calls_reasoning_usage(void **state)
{
    loom_fake *f = start(
        "{\"loop\":true,\"responses\":[{\"reasoning\":[\"Think\",\"ing\"],"
        "\"text\":[\"Let me \",\"check.\"],\"thought_signature\":\"c2ln\","
        "\"tool_calls\":[{\"id\":\"fc-1\",\"name\":\"get_weather\","
        "\"arguments\":[\"{\\\"city\\\":\",\"\\\"Paris\\\"}\"]},"
        "{\"name\":\"get_time\"}],"
        "\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":5,"
        "\"total_tokens\":15,\"prompt_tokens_details\":{\"cached_tokens\":4},"
        "\"completion_tokens_details\":{\"reasoning_tokens\":2}}}]}");
    http_res r;
    json_t *ev, *last, *want, *o;

    (void)state;
    post_to(f, GEMINI_SSE_PATH, "{}", &r);
    ev = sse_parse(r.body, r.len, "\r\n");
    /* 2 thoughts, 2 texts, 1 chunk with both calls */
    assert_int_equal(json_array_size(ev), 5);
    check_str(ev_data(ev, 0), "candidates.0.content.parts.0.text", "Think");
    assert_true(json_is_true(
        jp(ev_data(ev, 1), "candidates.0.content.parts.0.thought")));
    assert_null(jp(ev_data(ev, 2), "candidates.0.content.parts.0.thought"));
    check_str(ev_data(ev, 3), "candidates.0.content.parts.0.text", "check.");
    check_str(ev_data(ev, 3), "candidates.0.content.role", "model");
    /* the signature goes on the first call, not on the text */
    assert_null(
        jp(ev_data(ev, 3), "candidates.0.content.parts.0.thoughtSignature"));
    assert_null(jp(ev_data(ev, 3), "candidates.0.finishReason"));
    check_str(ev_data(ev, 3), "responseId", "fake-response-1");
    last = ev_data(ev, 4);
    want = json_loads(
        "{\"candidates\":[{\"content\":{\"parts\":["
        "{\"functionCall\":{\"name\":\"get_weather\",\"args\":{\"city\":"
        "\"Paris\"},\"id\":\"fc-1\"},\"thoughtSignature\":\"c2ln\"},"
        "{\"functionCall\":{\"name\":\"get_time\",\"args\":{}}}],"
        "\"role\":\"model\"},\"finishReason\":\"STOP\"}],"
        "\"modelVersion\":\"fake-model\",\"responseId\":\"fake-response-1\","
        "\"usageMetadata\":{\"promptTokenCount\":10,"
        "\"candidatesTokenCount\":3,\"totalTokenCount\":15,"
        "\"cachedContentTokenCount\":4,\"thoughtsTokenCount\":2}}",
        0, NULL);
    check_json(last, want);
    json_decref(ev);
    free_res(&r);

    /* generateContent: one object with every part. */
    post_to(f, GEMINI_ONE_PATH, "{}", &r);
    assert_string_equal(r.ctype, "application/json");
    o = body_json(&r);
    assert_int_equal(json_array_size(jp(o, "candidates.0.content.parts")), 4);
    check_str(o, "candidates.0.content.parts.0.text", "Thinking");
    assert_true(json_is_true(jp(o, "candidates.0.content.parts.0.thought")));
    check_str(o, "candidates.0.content.parts.1.text", "Let me check.");
    check_json(jp(o, "candidates.0.content.parts.2"),
               jp(want, "candidates.0.content.parts.0"));
    check_json(jp(o, "usageMetadata"), jp(want, "usageMetadata"));
    check_str(o, "candidates.0.finishReason", "STOP");
    json_decref(o);
    free_res(&r);

    /* streamGenerateContent without alt=sse: a JSON array of the chunks. */
    post_to(f, GEMINI_ARRAY_PATH, "{}", &r);
    assert_string_equal(r.ctype, "application/json");
    o = body_json(&r);
    assert_int_equal(json_array_size(o), 5);
    json_object_set_new(want, "responseId", json_string("fake-response-3"));
    check_json(json_array_get(o, 4), want);
    json_decref(o);
    free_res(&r);
    json_decref(want);
    stop(f);
}

static void test_gemini_text_signature_and_finish(void **state)
{
    loom_fake *f =
        start("{\"format\":\"gemini\",\"responses\":["
              "{\"reasoning\":[\"a\"],\"text\":[\"b\",\"c\"],"
              "\"thought_signature\":\"sig\",\"finish_reason\":\"length\","
              "\"usage\":{\"promptTokenCount\":3,\"candidatesTokenCount\":2,"
              "\"totalTokenCount\":5}},"
              "{\"thought_signature\":\"sig\"}]}");
    http_res r;
    json_t *ev, *o;

    (void)state;
    post_to(f, GEMINI_SSE_PATH, "{}", &r);
    ev = sse_parse(r.body, r.len, "\r\n");
    assert_int_equal(json_array_size(ev), 3);
    /* no call: the signature rides on the last text part */
    assert_null(
        jp(ev_data(ev, 1), "candidates.0.content.parts.0.thoughtSignature"));
    check_str(ev_data(ev, 2), "candidates.0.content.parts.0.thoughtSignature",
              "sig");
    check_str(ev_data(ev, 2), "candidates.0.finishReason", "MAX_TOKENS");
    /* native usage verbatim */
    check_int(ev_data(ev, 2), "usageMetadata.candidatesTokenCount", 2);
    check_int(ev_data(ev, 0), "usageMetadata.promptTokenCount", 3);
    json_decref(ev);
    free_res(&r);

    /* An empty entry: one empty text part, STOP, no usage. */
    post_to(f, GEMINI_ONE_PATH, "{}", &r);
    o = body_json(&r);
    check_str(o, "candidates.0.content.parts.0.text", "");
    check_str(o, "candidates.0.content.parts.0.thoughtSignature", "sig");
    check_str(o, "candidates.0.finishReason", "STOP");
    assert_null(json_object_get(o, "usageMetadata"));
    json_decref(o);
    free_res(&r);
    stop(f);
}

static void test_gemini_errors(void **state)
{
    json_t *rec = vector_events("gemini/error-0.sse", "\r\n");
    loom_fake *f = start(
        "{\"responses\":[{\"status\":404,\"error\":{\"message\":\"no model\"}},"
        "{\"status\":429,\"error\":{\"message\":\"quota\"}},"
        "{\"text\":[\"par\"],\"stream_error\":{\"message\":\"oops\"}},"
        "{\"tool_calls\":[{\"name\":\"t\",\"arguments\":\"[1]\"}]}]}");
    const char *const skip[] = {"message", NULL};
    http_res r;
    json_t *o, *ev, *want;

    (void)state;
    post_to(f, GEMINI_SSE_PATH, "{}", &r);
    assert_int_equal(r.status, 404);
    assert_string_equal(r.ctype, "application/json");
    o = body_json(&r);
    want = json_deep_copy(ev_data(rec, 0));
    json_object_del(json_object_get(want, "error"), "details");
    check_shape(o, want, skip); /* the recording, minus its details */
    check_int(o, "error.code", 404);
    check_str(o, "error.status", "NOT_FOUND");
    check_str(o, "error.message", "no model");
    json_decref(want);
    json_decref(o);
    free_res(&r);

    post_to(f, GEMINI_SSE_PATH, "{}", &r);
    assert_int_equal(r.status, 429);
    o = body_json(&r);
    check_int(o, "error.code", 429);
    check_str(o, "error.status", "RESOURCE_EXHAUSTED");
    json_decref(o);
    free_res(&r);

    /* In-stream: an error object as the next event, status 200. */
    post_to(f, GEMINI_SSE_PATH, "{}", &r);
    assert_int_equal(r.status, 200);
    ev = sse_parse(r.body, r.len, "\r\n");
    assert_int_equal(json_array_size(ev), 2);
    check_str(ev_data(ev, 0), "candidates.0.content.parts.0.text", "par");
    assert_null(jp(ev_data(ev, 0), "candidates.0.finishReason"));
    check_int(ev_data(ev, 1), "error.code", 500);
    check_str(ev_data(ev, 1), "error.status", "INTERNAL");
    check_str(ev_data(ev, 1), "error.message", "oops");
    json_decref(ev);
    free_res(&r);

    /* Arguments that are no JSON object: the fake says so with a 500. */
    post_to(f, GEMINI_SSE_PATH, "{}", &r);
    assert_int_equal(r.status, 500);
    o = body_json(&r);
    check_str(o, "error.status", "INTERNAL");
    check_str(o, "error.type", "fake_bad_arguments");
    json_decref(o);
    free_res(&r);
    stop(f);
    json_decref(rec);
}

/* ---- OpenAI Responses --------------------------------------------------- */

/* Checks what every Responses stream shares: `event:` equal to the data's
 * type, sequence numbers 0, 1, 2... and one response id. */
static void check_responses_stream(json_t *ev, const char *id)
{
    json_t *e;
    size_t i;

    json_array_foreach(ev, i, e)
    {
        json_t *d = json_object_get(e, "data");

        check_str(e, "event", json_string_value(jp(d, "type")));
        check_int(d, "sequence_number", (json_int_t)i);
        if (jp(d, "response"))
            check_str(d, "response.id", id);
    }
}

/* A script entry with a recorded Responses stream's content. */
static json_t *responses_entry_from(json_t *vec, bool reasoning)
{
    json_t *created = jp(ev_data(vec, 0), "response"), *e, *d;
    json_t *texts = json_array(), *thoughts = json_array(), *out;
    json_t *done = NULL;
    size_t i;

    json_array_foreach(vec, i, e)
    {
        const char *type;

        d = json_object_get(e, "data");
        type = json_is_object(d) ? json_string_value(jp(d, "type")) : "";
        if (!strcmp(type, "response.output_text.delta"))
            json_array_append(texts, jp(d, "delta"));
        if (!strcmp(type, "response.reasoning_text.delta"))
            json_array_append(thoughts, jp(d, "delta"));
        if (!strcmp(type, "response.completed"))
            done = jp(d, "response");
    }
    assert_non_null(done);
    out = json_pack("{s:O,s:O,s:O,s:o,s:O}", "id", jp(created, "id"), "model",
                    jp(created, "model"), "created", jp(created, "created_at"),
                    "text", texts, "usage", jp(done, "usage"));
    if (reasoning)
        json_object_set_new(out, "reasoning_kind", json_string("text"));
    if (json_array_size(thoughts))
        json_object_set(out, "reasoning", thoughts);
    json_decref(thoughts);
    return out;
}

static void test_responses_stream_like_vectors(void **state)
{
    json_t *text = vector_events(
        "openai-responses/stream-standard-text-works-1.sse", "\n");
    json_t *rsn =
        vector_events("openai-responses/stream-reasoning-works-1.sse", "\n");
    json_t *sc =
        json_pack("{s:[oo]}", "responses", responses_entry_from(text, false),
                  responses_entry_from(rsn, true));
    char *script = json_dumps(sc, JSON_COMPACT);
    loom_fake *f = start(script);
    /* the recordings (from an SDK's tests) leave these out */
    const char *const text_extra[] = {"response.in_progress",
                                      "response.content_part.done", NULL};
    const char *const rsn_extra[] = {
        "response.in_progress", "response.content_part.done",
        "response.reasoning_text.done", "response.output_item.done", NULL};
    http_res r;
    json_t *ev, *gn, *wn, *map, *last;
    size_t i;

    (void)state;
    post_to(f, RESPONSES_PATH, "{\"stream\":true,\"input\":\"hi\"}", &r);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.ctype, "text/event-stream");
    ev = sse_parse(r.body, r.len, "\n");
    check_responses_stream(ev, "resp_test_1");
    gn = ev_names(ev);
    wn = ev_names(text);
    /* The recording ends with [DONE]; the API does not send one. */
    check_str(wn, "8", "[DONE]");
    json_array_remove(wn, 8);
    map = check_names_sub(gn, wn, text_extra);
    for (i = 0; i < json_array_size(map); i++) {
        json_t *g = ev_data(ev,
                            (size_t)json_integer_value(json_array_get(map, i))),
               *w = ev_data(text, i);

        check_shape(g, w, no_skip);
    }
    last = ev_data(ev, json_array_size(ev) - 1);
    check_json(jp(last, "response.usage"),
               jp(ev_data(text, 7), "response.usage"));
    check_json(jp(last, "response.output.0.content"),
               jp(ev_data(text, 7), "response.output.0.content"));
    check_int(last, "response.created_at", 1723031665);
    check_str(last, "response.model", "gpt-4o-2024-08-06");
    json_decref(map);
    json_decref(gn);
    json_decref(wn);
    json_decref(ev);
    free_res(&r);

    post_to(f, RESPONSES_PATH, "{\"stream\":true}", &r);
    ev = sse_parse(r.body, r.len, "\n");
    check_responses_stream(ev, "resp_reason_1");
    gn = ev_names(ev);
    wn = ev_names(rsn);
    json_array_remove(wn, json_array_size(wn) - 1); /* [DONE] */
    map = check_names_sub(gn, wn, rsn_extra);
    /* the reasoning events, field for field */
    for (i = 1; i < 5; i++) {
        json_t *g = ev_data(ev,
                            (size_t)json_integer_value(json_array_get(map, i))),
               *w = ev_data(rsn, i);

        check_shape(g, w, no_skip);
    }
    last = ev_data(ev, json_array_size(ev) - 1);
    check_json(jp(last, "response.output.0.content"),
               jp(ev_data(rsn, 10), "response.output.0.content"));
    check_json(jp(last, "response.usage"),
               jp(ev_data(rsn, 10), "response.usage"));
    json_decref(map);
    json_decref(gn);
    json_decref(wn);
    json_decref(ev);
    free_res(&r);
    stop(f);
    free(script);
    json_decref(sc);
    json_decref(text);
    json_decref(rsn);
}

static void test_responses_summary_tools_usage(void **state)
{
    loom_fake *f = start(
        "{\"responses\":[{\"reasoning\":[\"Think\",\"ing\"],"
        "\"tool_calls\":[{\"id\":\"call_a\",\"name\":\"get_weather\","
        "\"arguments\":[\"{\\\"city\\\":\",\"\\\"Paris\\\"}\"]},"
        "{\"name\":\"get_time\",\"arguments\":\"{}\"}],"
        "\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":5,"
        "\"total_tokens\":15,\"prompt_tokens_details\":{\"cached_tokens\":4},"
        "\"completion_tokens_details\":{\"reasoning_tokens\":2}}},"
        "{\"text\":[\"cut\"],\"finish_reason\":\"length\"}]}");
    http_res r;
    json_t *ev, *names, *want, *last;

    (void)state;
    post_to(f, RESPONSES_PATH, "{\"stream\":true}", &r);
    ev = sse_parse(r.body, r.len, "\n");
    check_responses_stream(ev, "resp_fake_1");
    names = ev_names(ev);
    want = list("response.created,response.in_progress,"
                "response.output_item.added,"
                "response.reasoning_summary_part.added,"
                "response.reasoning_summary_text.delta,"
                "response.reasoning_summary_text.delta,"
                "response.reasoning_summary_text.done,"
                "response.reasoning_summary_part.done,"
                "response.output_item.done,"
                "response.output_item.added,"
                "response.function_call_arguments.delta,"
                "response.function_call_arguments.delta,"
                "response.function_call_arguments.done,"
                "response.output_item.done,"
                "response.output_item.added,"
                "response.function_call_arguments.delta,"
                "response.function_call_arguments.done,"
                "response.output_item.done,response.completed");
    check_json(names, want);
    check_str(ev_data(ev, 2), "item.type", "reasoning");
    check_str(ev_data(ev, 4), "delta", "Think");
    check_int(ev_data(ev, 4), "summary_index", 0);
    check_str(ev_data(ev, 6), "text", "Thinking");
    check_str(ev_data(ev, 8), "item.summary.0.text", "Thinking");
    check_str(ev_data(ev, 9), "item.type", "function_call");
    check_str(ev_data(ev, 9), "item.call_id", "call_a");
    check_str(ev_data(ev, 9), "item.name", "get_weather");
    check_str(ev_data(ev, 9), "item.arguments", "");
    check_int(ev_data(ev, 9), "output_index", 1);
    check_str(ev_data(ev, 10), "item_id",
              json_string_value(jp(ev_data(ev, 9), "item.id")));
    check_str(ev_data(ev, 11), "delta", "\"Paris\"}");
    check_str(ev_data(ev, 12), "arguments", "{\"city\":\"Paris\"}");
    check_str(ev_data(ev, 13), "item.status", "completed");
    check_str(ev_data(ev, 14), "item.call_id", "call_fake_2");
    check_int(ev_data(ev, 14), "output_index", 2);
    last = ev_data(ev, 18);
    check_str(last, "response.status", "completed");
    assert_int_equal(json_array_size(jp(last, "response.output")), 3);
    check_str(last, "response.output.2.arguments", "{}");
    check_int(last, "response.usage.input_tokens", 10);
    check_int(last, "response.usage.output_tokens", 5);
    check_int(last, "response.usage.total_tokens", 15);
    check_int(last, "response.usage.input_tokens_details.cached_tokens", 4);
    check_int(last, "response.usage.output_tokens_details.reasoning_tokens", 2);
    json_decref(names);
    json_decref(want);
    json_decref(ev);
    free_res(&r);

    /* "length": status incomplete, ended by response.incomplete. */
    post_to(f, RESPONSES_PATH, "{\"stream\":true}", &r);
    ev = sse_parse(r.body, r.len, "\n");
    last = ev_data(ev, json_array_size(ev) - 1);
    check_str(last, "type", "response.incomplete");
    check_str(last, "response.status", "incomplete");
    check_str(last, "response.incomplete_details.reason", "max_output_tokens");
    check_int(last, "response.usage.total_tokens", 0);
    json_decref(ev);
    free_res(&r);
    stop(f);
}

static void test_responses_errors_and_non_streamed(void **state)
{
    loom_fake *f = start(
        "{\"format\":\"openai-responses\",\"responses\":["
        "{\"status\":400,\"error\":{\"message\":\"bad\",\"type\":"
        "\"invalid_request_error\",\"param\":\"input\",\"code\":null}},"
        "{\"text\":[\"par\"],\"stream_error\":{\"message\":\"oops\","
        "\"code\":\"server_error\"}},"
        "{\"stream_error\":{\"message\":\"gone\"},"
        "\"stream_error_event\":\"response.failed\"},"
        "{\"reasoning\":[\"r\"],\"reasoning_kind\":\"text\",\"text\":[\"a\","
        "\"b\"],\"tool_calls\":[{\"name\":\"t\",\"arguments\":\"{}\"}],"
        "\"usage\":{\"input_tokens\":7,\"output_tokens\":3}}]}");
    http_res r;
    json_t *o, *ev, *names, *want;

    (void)state;
    post_to(f, "/v1/chat/completions", "{\"stream\":true}", &r);
    assert_int_equal(r.status, 400);
    o = body_json(&r);
    want = json_loads("{\"error\":{\"message\":\"bad\",\"type\":"
                      "\"invalid_request_error\",\"param\":\"input\","
                      "\"code\":null}}",
                      0, NULL);
    check_json(o, want);
    json_decref(want);
    json_decref(o);
    free_res(&r);

    post_to(f, RESPONSES_PATH, "{\"stream\":true}", &r);
    assert_int_equal(r.status, 200);
    ev = sse_parse(r.body, r.len, "\n");
    check_responses_stream(ev, "resp_fake_2");
    names = ev_names(ev);
    want = list("response.created,response.in_progress,"
                "response.output_item.added,response.content_part.added,"
                "response.output_text.delta,error");
    check_json(names, want);
    json_decref(want);
    want = json_loads("{\"type\":\"error\",\"code\":\"server_error\","
                      "\"message\":\"oops\",\"param\":null,"
                      "\"sequence_number\":5}",
                      0, NULL);
    check_json(ev_data(ev, 5), want);
    json_decref(want);
    json_decref(names);
    json_decref(ev);
    free_res(&r);

    post_to(f, RESPONSES_PATH, "{\"stream\":true}", &r);
    ev = sse_parse(r.body, r.len, "\n");
    assert_int_equal(json_array_size(ev), 3);
    check_str(ev_data(ev, 2), "type", "response.failed");
    check_str(ev_data(ev, 2), "response.status", "failed");
    check_str(ev_data(ev, 2), "response.error.message", "gone");
    check_str(ev_data(ev, 2), "response.error.code", "server_error");
    json_decref(ev);
    free_res(&r);

    /* Not streamed: the response object. */
    post_to(f, RESPONSES_PATH, "{}", &r);
    assert_string_equal(r.ctype, "application/json");
    o = body_json(&r);
    check_str(o, "object", "response");
    check_str(o, "id", "resp_fake_4");
    check_str(o, "status", "completed");
    check_str(o, "output.0.type", "reasoning");
    check_str(o, "output.0.content.0.type", "reasoning_text");
    check_str(o, "output.0.content.0.text", "r");
    check_str(o, "output.1.type", "message");
    check_str(o, "output.1.content.0.text", "ab");
    check_str(o, "output.2.type", "function_call");
    check_str(o, "output.2.call_id", "call_fake_1");
    check_int(o, "usage.input_tokens", 7);
    check_int(o, "usage.total_tokens", 10);
    check_int(o, "usage.output_tokens_details.reasoning_tokens", 0);
    json_decref(o);
    free_res(&r);
    stop(f);
}

/* Ids and signatures from the script are sent whole, however long. */
static void test_long_ids_kept(void **state)
{
    char id[1001], script[4096];
    loom_fake *f;
    http_res r;
    json_t *o;

    (void)state;
    memset(id, 'x', sizeof(id) - 1);
    id[sizeof(id) - 1] = '\0';
    snprintf(script, sizeof(script),
             "{\"loop\":true,\"responses\":[{\"id\":\"%s\","
             "\"reasoning\":[\"r\"],\"signature\":\"%s\","
             "\"tool_calls\":[{\"id\":\"%s\",\"name\":\"t\"}]}]}",
             id, id, id);
    f = start(script);
    post_to(f, ANTHROPIC_PATH, "{}", &r);
    o = body_json(&r);
    check_str(o, "id", id);
    check_str(o, "content.0.signature", id);
    check_str(o, "content.1.id", id);
    json_decref(o);
    free_res(&r);
    post_to(f, "/v1/chat/completions", "{}", &r);
    o = body_json(&r);
    check_str(o, "id", id);
    check_str(o, "choices.0.message.tool_calls.0.id", id);
    json_decref(o);
    free_res(&r);
    post_to(f, RESPONSES_PATH, "{}", &r);
    o = body_json(&r);
    check_str(o, "id", id);
    check_str(o, "output.1.call_id", id);
    json_decref(o);
    free_res(&r);
    stop(f);
}

/* ---- choosing the format ------------------------------------------------ */

static void test_format_by_path(void **state)
{
    loom_fake *f = start("{\"loop\":true,\"responses\":[{\"text\":[\"hi\"]}]}");
    http_res r;
    json_t *o, *ev;

    (void)state;
    post_to(f, "/v1/chat/completions", "{}", &r);
    o = body_json(&r);
    check_str(o, "object", "chat.completion");
    json_decref(o);
    free_res(&r);
    post_to(f, "/anthropic/v1/messages", "{}", &r);
    o = body_json(&r);
    check_str(o, "type", "message");
    check_str(o, "content.0.text", "hi");
    json_decref(o);
    free_res(&r);
    post_to(f, "/v1beta/models/gemini-x:generateContent", "{\"stream\":true}",
            &r);
    o = body_json(&r); /* "stream" means nothing to Gemini */
    check_str(o, "candidates.0.content.parts.0.text", "hi");
    json_decref(o);
    free_res(&r);
    post_to(f, "/v1/responses", "{}", &r);
    o = body_json(&r);
    check_str(o, "object", "response");
    json_decref(o);
    free_res(&r);
    post_to(f, "/v1/messages/count_tokens", "{}", &r); /* not messages */
    o = body_json(&r);
    check_str(o, "object", "chat.completion");
    json_decref(o);
    free_res(&r);
    /* alt=sse among other parameters */
    post_to(f, "/v1beta/models/m:streamGenerateContent?key=k&alt=sse", "{}",
            &r);
    assert_string_equal(r.ctype, "text/event-stream");
    ev = sse_parse(r.body, r.len, "\r\n");
    assert_int_equal(json_array_size(ev), 1);
    json_decref(ev);
    free_res(&r);
    stop(f);

    /* The script's format wins over the path, a response's over both. */
    f = start("{\"format\":\"anthropic\",\"responses\":[{\"text\":[\"a\"]},"
              "{\"text\":[\"b\"],\"format\":\"openai-chat\"}]}");
    post_to(f, "/v1/responses", "{}", &r);
    o = body_json(&r);
    check_str(o, "type", "message");
    json_decref(o);
    free_res(&r);
    post_to(f, "/v1/messages", "{}", &r);
    o = body_json(&r);
    check_str(o, "object", "chat.completion");
    json_decref(o);
    free_res(&r);
    /* exhausted: the error in the script's format */
    post_to(f, "/v1/chat/completions", "{}", &r);
    assert_int_equal(r.status, 500);
    o = body_json(&r);
    check_str(o, "type", "error");
    check_str(o, "error.type", "fake_script_exhausted");
    json_decref(o);
    free_res(&r);
    stop(f);

    /* Without a script format, in the path's. */
    f = start("{\"responses\":[]}");
    post_to(f, GEMINI_SSE_PATH, "{}", &r);
    assert_int_equal(r.status, 500);
    o = body_json(&r);
    check_int(o, "error.code", 500);
    check_str(o, "error.status", "INTERNAL");
    check_str(o, "error.type", "fake_script_exhausted");
    json_decref(o);
    free_res(&r);
    stop(f);
}

static void test_formats_chunk_options(void **state)
{
    json_t *o;
    loom_fake *f =
        start("{\"responses\":[{\"text\":[\"a\",\"b\"],\"disconnect_after_"
              "chunks\":3},"
              "{\"text\":[\"a\",\"b\"],\"disconnect_after_chunks\":1},"
              "{\"text\":[\"a\"],\"disconnect_after_chunks\":4},"
              "{\"text\":[\"a\"],\"hang\":true,\"hang_after_chunks\":2},"
              "{\"text\":[\"a\"],\"chunk_delay_ms\":1,\"status\":201}]}");
    http_res r;
    json_t *ev;

    (void)state;
    /* message_start, content_block_start, ping; then cut */
    http(f,
         &(http_req){
             .path = ANTHROPIC_PATH, .body = "{\"stream\":true}", .root = true},
         &r);
    assert_true(r.rc == CURLE_PARTIAL_FILE || r.rc == CURLE_RECV_ERROR);
    ev = sse_parse(r.body, r.len, "\n");
    assert_int_equal(json_array_size(ev), 3);
    check_str(json_array_get(ev, 2), "event", "ping");
    json_decref(ev);
    free_res(&r);

    /* a JSON array stream cut after its first element */
    http(f, &(http_req){.path = GEMINI_ARRAY_PATH, .body = "{}", .root = true},
         &r);
    assert_true(r.rc == CURLE_PARTIAL_FILE || r.rc == CURLE_RECV_ERROR);
    assert_int_equal(r.body[0], '[');
    o = json_loadb(r.body + 1, r.len - 1, 0, NULL); /* one element, no ] */
    check_str(o, "candidates.0.content.parts.0.text", "a");
    json_decref(o);
    free_res(&r);

    http(f,
         &(http_req){
             .path = RESPONSES_PATH, .body = "{\"stream\":true}", .root = true},
         &r);
    assert_true(r.rc == CURLE_PARTIAL_FILE || r.rc == CURLE_RECV_ERROR);
    ev = sse_parse(r.body, r.len, "\n");
    assert_int_equal(json_array_size(ev), 4);
    json_decref(ev);
    free_res(&r);

    http(f,
         &(http_req){.path = GEMINI_SSE_PATH,
                     .body = "{}",
                     .root = true,
                     .timeout_ms = 300},
         &r);
    assert_int_equal(r.rc, CURLE_OPERATION_TIMEDOUT);
    assert_int_equal(r.status, 200);
    /* only one chunk exists before the hang point */
    ev = sse_parse(r.body, r.len, "\r\n");
    assert_int_equal(json_array_size(ev), 1);
    json_decref(ev);
    free_res(&r);

    post_to(f, ANTHROPIC_PATH, "{}", &r); /* not streamed: one chunk */
    assert_int_equal(r.status, 201);
    o = body_json(&r);
    check_str(o, "type", "message");
    json_decref(o);
    free_res(&r);
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

/* Fails unless the fake exits with 2 on each of the n scripts. */
static void expect_rejected(const char *const *scripts, size_t n)
{
    char *bad = test_tmp_path("bad-script.json");
    size_t i;

    for (i = 0; i < n; i++) {
        const char *a[] = {"--script", bad, NULL};

        assert_int_equal(test_write_file(bad, scripts[i], strlen(scripts[i])),
                         0);
        if (run_fake(a) != 2)
            fail_msg("script %zu was accepted: %s", i, scripts[i]);
    }
    unlink(bad);
    free(bad);
}

static void test_bad_arguments_exit_2(void **state)
{
    char *vec = test_vector_path("openai-chat/stream-works-1.sse");
    static const char *const scripts[] = {
        "{\"responses\":[",                           /* not JSON */
        "[]",                                         /* not an object */
        "{\"responses\":[{\"txt\":[\"typo\"]}]}",     /* unknown field */
        "{\"responses\":[{\"status\":\"200\"}]}",     /* wrong type */
        "{\"responses\":[{\"text\":\"not array\"}]}", /* wrong type */
        "{\"responses\":[{\"body_file\":\"/nonexistent/x\"}]}",
        "{\"responses\":[{\"tool_calls\":[{\"arguments\":\"{}\"}]}]}",
        "{\"loop\":true,\"responses\":[]}",
        "{\"format\":\"claude\",\"responses\":[]}",
        "{\"responses\":[{\"format\":\"openai\"}]}",
        "{\"responses\":[{\"format\":1}]}",
        "{\"responses\":[{\"reasoning_kind\":\"full\"}]}",
        "{\"responses\":[{\"stream_error_event\":\"failed\"}]}",
        "{\"responses\":[{\"signature\":1}]}",
        "{\"responses\":[{\"redacted_thinking\":[\"x\"]}]}",
        "{\"responses\":[{\"thought_signature\":true}]}",
        /* gemini needs arguments that join into a JSON object */
        "{\"format\":\"gemini\",\"responses\":[{\"tool_calls\":["
        "{\"name\":\"t\",\"arguments\":[\"{\\\"a\\\":\"]}]}]}",
        "{\"responses\":[{\"format\":\"gemini\",\"tool_calls\":["
        "{\"name\":\"t\",\"arguments\":\"[]\"}]}]}",
    };

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
    expect_rejected(scripts, sizeof(scripts) / sizeof(*scripts));
    free(vec);
}

/* ---- rules: answers chosen by what a request contains ------------------ */

/* Four sub-agents, one per wire format, told apart by their task; requests
 * no rule matches take the plain answers. */
static const char *rules_script =
    "{\"rules\":["
    "{\"match\":{\"first_user\":\"count apples\"},"
    "\"responses\":[{\"body\":\"A1\"},{\"body\":\"A2\"},{\"body\":\"A3\"}]},"
    "{\"match\":{\"first_user\":\"count pears\"},"
    "\"responses\":[{\"body\":\"B1\"},{\"body\":\"B2\"},{\"body\":\"B3\"}]},"
    "{\"match\":{\"first_user\":\"count plums\"},"
    "\"responses\":[{\"body\":\"C1\"},{\"body\":\"C2\"},{\"body\":\"C3\"}]},"
    "{\"match\":{\"first_user\":\"count figs\"},"
    "\"responses\":[{\"body\":\"D1\"},{\"body\":\"D2\"},{\"body\":\"D3\"}]}],"
    "\"responses\":[{\"body\":\"P1\"},{\"body\":\"P2\"},{\"body\":\"P3\"}]}";

#define RULE_TURNS 3

/* One client of test_rules_concurrent: it sends its turns in order. */
typedef struct {
    const loom_fake *f;
    pthread_barrier_t *go;
    const char *path;
    const char *turn[RULE_TURNS];
    char got[RULE_TURNS][8];
    CURLcode rc;
} rule_client;

static void *rule_client_run(void *arg)
{
    rule_client *c = arg;
    CURL *h = curl_easy_init();
    size_t t;

    pthread_barrier_wait(c->go);
    c->rc = h ? CURLE_OK : CURLE_FAILED_INIT;
    for (t = 0; h && t < RULE_TURNS; t++) {
        http_req q = {.path = c->path,
                      .body = c->turn[t],
                      .headers = "Content-Type: application/json",
                      .root = true};
        http_res r;

        http_on(h, c->f, &q, &r);
        if (r.rc != CURLE_OK)
            c->rc = r.rc;
        snprintf(c->got[t], sizeof(c->got[t]), "%s", r.body ? r.body : "");
        free_res(&r);
    }
    curl_easy_cleanup(h);
    return NULL;
}

static void test_rules_concurrent(void **state)
{
    static const char *const chat_hist =
        "{\"messages\":[{\"role\":\"system\",\"content\":\"helper\"},"
        "{\"role\":\"user\",\"content\":\"Task: count apples\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":"
        "\"c1\",\"type\":\"function\",\"function\":{\"name\":\"t\","
        "\"arguments\":\"{}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"5\"}]}";
    static const char *const anth_hist =
        "{\"system\":\"helper\",\"messages\":[{\"role\":\"user\",\"content\":"
        "[{\"type\":\"text\",\"text\":\"Task: count pears\"}]},"
        "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_use\",\"id\":"
        "\"u1\",\"name\":\"t\",\"input\":{}}]},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
        "\"tool_use_id\":\"u1\",\"content\":\"5\"}]}]}";
    static const char *const gem_hist =
        "{\"contents\":[{\"role\":\"user\",\"parts\":[{\"text\":"
        "\"Task: count plums\"}]},{\"role\":\"model\",\"parts\":[{"
        "\"functionCall\":{\"name\":\"t\",\"args\":{}}}]},{\"role\":\"user\","
        "\"parts\":[{\"functionResponse\":{\"name\":\"t\",\"response\":{"
        "\"n\":5}}}]}]}";
    static const char *const resp_hist =
        "{\"instructions\":\"helper\",\"input\":[{\"role\":\"user\","
        "\"content\":[{\"type\":\"input_text\",\"text\":\"Task: count "
        "figs\"}]},"
        "{\"type\":\"function_call\",\"call_id\":\"c1\",\"name\":\"t\","
        "\"arguments\":\"{}\"},{\"type\":\"function_call_output\",\"call_id\":"
        "\"c1\",\"output\":\"5\"}]}";
    static const char *const plain =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"something else\"}]}";
    rule_client c[] = {
        {.path = "/v1/chat/completions",
         .turn = {"{\"messages\":[{\"role\":\"user\",\"content\":"
                  "\"Task: count apples\"}]}",
                  chat_hist, chat_hist}},
        {.path = "/v1/messages",
         .turn = {"{\"messages\":[{\"role\":\"user\",\"content\":"
                  "\"Task: count pears\"}]}",
                  anth_hist, anth_hist}},
        {.path = "/v1beta/models/m:generateContent",
         .turn = {gem_hist, gem_hist, gem_hist}},
        {.path = "/v1/responses",
         .turn = {"{\"input\":\"Task: count figs\"}", resp_hist, resp_hist}},
        {.path = "/v1/chat/completions", .turn = {plain, plain, plain}},
    };
    static const char *const want = "ABCDP";
    enum { N = sizeof(c) / sizeof(*c) };
    loom_fake *f = start(rules_script);
    pthread_barrier_t go;
    pthread_t th[N];
    size_t i, t;

    (void)state;
    assert_int_equal(pthread_barrier_init(&go, NULL, N), 0);
    for (i = 0; i < N; i++) {
        c[i].f = f;
        c[i].go = &go;
        assert_int_equal(pthread_create(&th[i], NULL, rule_client_run, &c[i]),
                         0);
    }
    for (i = 0; i < N; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    pthread_barrier_destroy(&go);
    for (i = 0; i < N; i++) {
        assert_int_equal(c[i].rc, CURLE_OK);
        for (t = 0; t < RULE_TURNS; t++) {
            char w[8];

            snprintf(w, sizeof(w), "%c%zu", want[i], t + 1);
            assert_string_equal(c[i].got[t], w);
        }
    }
    assert_int_equal(fake_request_count(f), N * RULE_TURNS);
    stop(f);
}

/* Posts a chat body and checks the answer's body (or, for want NULL,
 * that the script is exhausted). */
static void expect_answer(const loom_fake *f, const char *path,
                          const char *body, const char *want)
{
    http_res r;

    post_to(f, path, body, &r);
    if (want) {
        assert_int_equal(r.status, 200);
        assert_string_equal(r.body, want);
    } else {
        assert_int_equal(r.status, 500);
        assert_non_null(strstr(r.body, "fake_script_exhausted"));
    }
    free_res(&r);
}

static void test_rules_match_fields(void **state)
{
    static const char *const chat = "/v1/chat/completions";
    static const char *const gem = "/v1beta/models/m:generateContent";
    loom_fake *f = start(
        "{\"rules\":["
        "{\"match\":{\"system\":\"reviewer\",\"tools_include\":[\"read\"]},"
        "\"responses\":[{\"body\":\"R\"}]},"
        "{\"match\":{\"tools\":[\"a\",\"b\"]},\"loop\":true,"
        "\"responses\":[{\"body\":\"AB\"}]},"
        "{\"match\":{\"last_message\":\"DONE?\"},\"loop\":true,"
        "\"responses\":[{\"body\":\"L\"}]},"
        "{\"match\":{\"any_message\":\"secret\"},\"loop\":true,"
        "\"responses\":[{\"body\":\"S\"}]}],"
        "\"loop\":true,\"responses\":[{\"body\":\"P\"}]}");

    (void)state;
    /* system prompt and a tool among others */
    expect_answer(f, chat,
                  "{\"messages\":[{\"role\":\"system\",\"content\":\"You are "
                  "a reviewer\"}],\"tools\":[{\"type\":\"function\","
                  "\"function\":{\"name\":\"write\"}},{\"type\":\"function\","
                  "\"function\":{\"name\":\"read\"}}]}",
                  "R");
    expect_answer(f, gem,
                  "{\"systemInstruction\":{\"parts\":[{\"text\":\"reviewer\"}]"
                  "},\"tools\":[{\"functionDeclarations\":[{\"name\":\"write\""
                  "}]}],\"contents\":[]}",
                  "P");
    /* rule 0 has one answer and no loop */
    expect_answer(f, "/v1/messages",
                  "{\"system\":\"reviewer\",\"tools\":[{\"name\":\"read\"}],"
                  "\"messages\":[]}",
                  NULL);
    /* exactly these tools, in any order */
    expect_answer(f, "/v1/responses",
                  "{\"tools\":[{\"type\":\"function\",\"name\":\"b\"},"
                  "{\"type\":\"function\",\"name\":\"a\"}],\"input\":\"x\"}",
                  "AB");
    expect_answer(f, gem,
                  "{\"tools\":[{\"functionDeclarations\":[{\"name\":\"a\"},"
                  "{\"name\":\"b\"},{\"name\":\"c\"}]}],\"contents\":[]}",
                  "P");
    /* the last message, and any message; the first matching rule wins */
    expect_answer(f, chat,
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"secret\"},"
                  "{\"role\":\"user\",\"content\":\"DONE?\"}]}",
                  "L");
    expect_answer(f, chat,
                  "{\"messages\":[{\"role\":\"user\",\"content\":\"DONE?\"},"
                  "{\"role\":\"assistant\",\"content\":\"a secret\"},"
                  "{\"role\":\"user\",\"content\":\"ok\"}]}",
                  "S");
    /* a system message is not a message */
    expect_answer(f, chat,
                  "{\"messages\":[{\"role\":\"system\",\"content\":\"secret\"},"
                  "{\"role\":\"user\",\"content\":\"ok\"}]}",
                  "P");
    expect_answer(f, chat, "not json", "P");
    stop(f);
}

static void test_bad_rules_exit_2(void **state)
{
    static const char *const scripts[] = {
        "{\"rules\":{}}",
        "{\"rules\":[{\"responses\":[{\"body\":\"x\"}]}]}", /* no match */
        "{\"rules\":[{\"match\":{},\"responses\":[{\"body\":\"x\"}]}]}",
        "{\"rules\":[{\"match\":{\"first_usr\":\"x\"},"
        "\"responses\":[{\"body\":\"x\"}]}]}",
        "{\"rules\":[{\"match\":{\"system\":1},"
        "\"responses\":[{\"body\":\"x\"}]}]}",
        "{\"rules\":[{\"match\":{\"tools\":[1]},"
        "\"responses\":[{\"body\":\"x\"}]}]}",
        "{\"rules\":[{\"match\":{\"system\":\"x\"},\"responses\":[]}]}",
        "{\"rules\":[{\"match\":{\"system\":\"x\"},\"lop\":true,"
        "\"responses\":[{\"body\":\"x\"}]}]}",
        "{\"rules\":[{\"match\":{\"system\":\"x\"},"
        "\"responses\":[{\"txt\":[\"typo\"]}]}]}",
    };

    (void)state;
    expect_rejected(scripts, sizeof(scripts) / sizeof(*scripts));
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
        cmocka_unit_test(test_many_slow_streams_few_threads),
        cmocka_unit_test(test_threads_mode),
        cmocka_unit_test(test_stream_error),
        cmocka_unit_test(test_delays_are_applied),
        cmocka_unit_test(test_body_and_body_file),
        cmocka_unit_test(test_record),
        cmocka_unit_test(test_loop),
        cmocka_unit_test(test_script_exhausted),
        cmocka_unit_test(test_rules_concurrent),
        cmocka_unit_test(test_rules_match_fields),
        cmocka_unit_test(test_bad_rules_exit_2),
        cmocka_unit_test(test_stats),
        cmocka_unit_test(test_keep_alive_many_requests),
        cmocka_unit_test(test_body_limit),
        cmocka_unit_test(test_anthropic_stream_like_vectors),
        cmocka_unit_test(test_anthropic_reasoning_tools_usage),
        cmocka_unit_test(test_anthropic_non_streamed),
        cmocka_unit_test(test_anthropic_errors),
        cmocka_unit_test(test_gemini_stream_like_vectors),
        cmocka_unit_test(test_gemini_calls_reasoning_usage),
        cmocka_unit_test(test_gemini_text_signature_and_finish),
        cmocka_unit_test(test_gemini_errors),
        cmocka_unit_test(test_responses_stream_like_vectors),
        cmocka_unit_test(test_responses_summary_tools_usage),
        cmocka_unit_test(test_responses_errors_and_non_streamed),
        cmocka_unit_test(test_long_ids_kept),
        cmocka_unit_test(test_format_by_path),
        cmocka_unit_test(test_formats_chunk_options),
        cmocka_unit_test(test_max_requests_exits),
        cmocka_unit_test(test_max_seconds_and_port_file),
        cmocka_unit_test(test_bad_arguments_exit_2),
    };

    return cmocka_run_group_tests(tests, setup, teardown);
}
