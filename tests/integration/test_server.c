/*
 * loom's HTTP server end to end: a real server in this process, a real
 * SQLite store in a temporary file, the fake upstream as the model and
 * libcurl (or a raw socket) as the client. One test per endpoint or rule:
 * the native run API (blocking, streamed, background, cancel, resume with
 * Last-Event-ID, a sub-agent's events nested), conversations, models,
 * tools, operations, a 405's Allow header, every limit crossed (body
 * size, concurrent runs, read timeout, connections, SSE keep-alive,
 * finished runs kept, event log size), a client that goes away
 * mid-stream, and the graceful stop.
 */
#include "test_server_harness.h"

#include "core/utf8.h"
#include "store_fixture.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <sys/time.h>

#define USAGE                                                                \
    "\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":2,"              \
    "\"total_tokens\":12}"
#define HELLO "{\"text\":[\"Hello\",\" world\"]," USAGE "}"
#define LOOP(resp) "{\"loop\":true,\"responses\":[" resp "]}"
#define HANG "{\"text\":[\"Partial \",\"answer\"],\"hang\":true," \
             "\"hang_after_chunks\":3}"

/* Field of run.started in a run's events (borrowed). */
static json_t *started_data(json_t *events)
{
    json_t *first = json_array_get(events, 0);

    assert_string_equal(sh_str(first, "type"), "run.started");
    return first;
}

/* Checks seqs are 1..n in order. */
static void check_seqs(json_t *events, int from_sse)
{
    size_t i;
    json_t *e;

    json_array_foreach(events, i, e)
    {
        json_t *d = from_sse ? json_object_get(e, "data") : e;
        assert_int_equal(json_integer_value(json_object_get(d, "seq")),
                         (json_int_t)i + 1);
        if (from_sse) {
            assert_int_equal(json_integer_value(json_object_get(e, "id")),
                             (json_int_t)i + 1);
            assert_string_equal(sh_str(e, "event"), sh_str(d, "type"));
        }
    }
}

/* ---- meta endpoints ------------------------------------------------------ */

static void test_health_models_tools(void **state)
{
    sh h;
    sh_resp r;
    json_t *j, *data, *m;
    size_t i;
    int found_slow = 0, found_time = 0;

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, NULL);
    j = sh_json(&h, "GET", "/healthz", NULL, 200);
    assert_string_equal(sh_str(j, "status"), "ok");
    json_decref(j);
    j = sh_json(&h, "GET", "/readyz", NULL, 200);
    assert_string_equal(sh_str(j, "status"), "ready");
    json_decref(j);

    j = sh_json(&h, "GET", "/v1/models", NULL, 200);
    assert_string_equal(sh_str(j, "object"), "list");
    data = json_object_get(j, "data");
    /* fake/m, then the agents a and plain (test_server_models.c). */
    assert_int_equal(json_array_size(data), 3);
    assert_string_equal(sh_str(json_array_get(data, 0), "id"), "fake/m");
    assert_string_equal(sh_str(json_array_get(data, 0), "owned_by"), "fake");
    json_decref(j);

    j = sh_json(&h, "GET", "/v1/tools", NULL, 200);
    json_array_foreach(json_object_get(j, "data"), i, m)
    {
        if (!strcmp(sh_str(m, "name"), "slow")) {
            found_slow = 1;
            assert_string_equal(sh_str(m, "description"), "Sleeps a while.");
            assert_string_equal(
                sh_str(json_object_get(m, "parameters"), "type"), "object");
        }
        found_time |= !strcmp(sh_str(m, "name"), "get_time");
    }
    assert_true(found_slow && found_time);
    json_decref(j);

    assert_int_equal(sh_req(&h, "GET", "/v1/nothing", NULL, NULL, &r), 404);
    sh_check_error(r.body, "not_found");
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "DELETE", "/v1/runs", NULL, NULL, &r), 405);
    sh_check_error(r.body, "method_not_allowed");
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "GET", "/v1/runs/", NULL, NULL, &r), 404);
    sh_resp_free(&r);
    sh_free(&h);
}

/* A 405 names every method its path has, in the order the routes were
 * made, GET with HEAD. */
static void test_405_allow(void **state)
{
    sh h;
    sh_resp r;
    char allow[128];

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, NULL);
    assert_int_equal(sh_req(&h, "PUT", "/v1/conversations/c1", "{}", NULL, &r),
                     405);
    assert_non_null(sh_header(&r, "Allow", allow, sizeof(allow)));
    assert_string_equal(allow, "GET, HEAD, DELETE, PATCH");
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "PUT", "/v1/admin/keys", "{}", NULL, &r), 405);
    assert_non_null(sh_header(&r, "Allow", allow, sizeof(allow)));
    assert_string_equal(allow, "POST, GET, HEAD");
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "GET", "/v1/runs/r1/nothing", NULL, NULL, &r),
                     404);
    assert_null(sh_header(&r, "Allow", allow, sizeof(allow)));
    sh_resp_free(&r);
    sh_free(&h);
}

/* ---- runs ---------------------------------------------------------------- */

static void test_run_blocking(void **state)
{
    sh h;
    sh_resp r;
    json_t *run, *events, *first, *last, *conv, *msgs, *again;
    char hv[128], path[128];

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, NULL);
    assert_int_equal(
        sh_req(&h, "POST", "/v1/runs", "{\"input\":\"hi\"}", NULL, &r), 200);
    run = json_loads(r.body, 0, NULL);
    assert_non_null(run);
    /* Byte for byte what srv_reply_json writes of the object (the logged
     * events are spliced in as their last member). */
    {
        char *dump = loom__json_compact_dumps(run, 15, NULL);
        void *it = json_object_iter(run), *at = NULL;
        assert_non_null(dump);
        assert_string_equal(dump, r.body);
        free(dump);
        for (; it; it = json_object_iter_next(run, it))
            at = it;
        assert_string_equal(json_object_iter_key(at), "events");
    }
    assert_string_equal(sh_str(run, "object"), "run");
    assert_string_equal(sh_str(run, "status"), "completed");
    assert_string_equal(sh_str(run, "text"), "Hello world");
    assert_string_equal(sh_str(run, "agent"), "a");
    assert_string_equal(sh_str(run, "model"), "fake/m");
    assert_string_equal(sh_str(run, "finish_reason"), "stop");
    assert_true(json_is_null(json_object_get(run, "error")));
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(run, "usage"), "total_tokens")),
                     12);
    assert_non_null(sh_header(&r, "X-Loom-Run-Id", hv, sizeof(hv)));
    assert_string_equal(hv, sh_str(run, "id"));
    assert_non_null(sh_header(&r, "X-Loom-Conversation-Id", hv, sizeof(hv)));
    assert_string_equal(hv, sh_str(run, "conversation_id"));
    sh_resp_free(&r);

    events = json_object_get(run, "events");
    check_seqs(events, 0);
    first = started_data(events);
    assert_string_equal(sh_str(first, "run_id"), sh_str(run, "id"));
    assert_string_equal(sh_str(first, "conversation_id"),
                        sh_str(run, "conversation_id"));
    last = json_array_get(events, json_array_size(events) - 1);
    assert_string_equal(sh_str(last, "type"), "run.completed");

    /* The turn is stored before the answer is sent. */
    snprintf(path, sizeof(path), "/v1/conversations/%s",
             sh_str(run, "conversation_id"));
    conv = sh_json(&h, "GET", path, NULL, 200);
    msgs = json_object_get(conv, "messages");
    assert_int_equal(json_array_size(msgs), 2);
    assert_string_equal(sh_str(json_array_get(msgs, 0), "role"), "user");
    assert_string_equal(sh_str(json_array_get(msgs, 0), "content"), "hi");
    assert_string_equal(sh_str(json_array_get(msgs, 1), "content"),
                        "Hello world");
    assert_string_equal(sh_str(json_array_get(msgs, 1), "status"), "ok");
    assert_string_equal(sh_str(json_array_get(msgs, 1), "run_id"),
                        sh_str(run, "id"));
    json_decref(conv);

    /* GET /v1/runs/{id}: the result, events only when asked. */
    snprintf(path, sizeof(path), "/v1/runs/%s", sh_str(run, "id"));
    again = sh_json(&h, "GET", path, NULL, 200);
    assert_string_equal(sh_str(again, "status"), "completed");
    assert_string_equal(sh_str(again, "text"), "Hello world");
    assert_null(json_object_get(again, "events"));
    json_decref(again);
    snprintf(path, sizeof(path), "/v1/runs/%s?events=true", sh_str(run, "id"));
    again = sh_json(&h, "GET", path, NULL, 200);
    assert_true(json_equal(json_object_get(again, "events"), events));
    json_decref(again);
    json_decref(run);
    sh_free(&h);
}

/* How many messages GET /v1/conversations/{id} shows. */
static size_t stored_messages(const sh *h, const char *id)
{
    char path[128];
    json_t *conv;
    size_t n;

    snprintf(path, sizeof(path), "/v1/conversations/%s", id);
    conv = sh_json(h, "GET", path, NULL, 200);
    n = json_array_size(json_object_get(conv, "messages"));
    json_decref(conv);
    return n;
}

/* A model's answer with a member nested to the JSON parser's depth
 * limit, parsed on a run's fiber with the smallest stack the config
 * allows: answered, and the server still up (64 KiB of stack crashed
 * it). */
static void test_deep_upstream_json(void **state)
{
    enum { DEPTH = 2040 };
    sh h;
    json_t *script, *ans, *msg;
    char *body, *text;
    size_t at;

    (void)state;
    body = malloc(2 * DEPTH + 512);
    assert_non_null(body);
    at = (size_t)sprintf(body, "{\"id\":\"x\",\"object\":\"chat.completion\","
                               "\"model\":\"m\",\"choices\":[{\"index\":0,"
                               "\"message\":{\"role\":\"assistant\","
                               "\"content\":\"Hi there.\"},\"finish_reason\":"
                               "\"stop\"}]," USAGE ",\"extra\":");
    memset(body + at, '[', DEPTH);
    memset(body + at + DEPTH, ']', DEPTH);
    strcpy(body + at + 2 * DEPTH, "}");
    script = json_pack("{s:b,s:[{s:s}]}", "loop", 1, "responses", "body", body);
    assert_non_null(script);
    text = json_dumps(script, 0);
    assert_non_null(text);
    sh_start(&h, text, NULL, "  fiber_stack_kb: 256\n");
    ans = sh_json(&h, "POST", "/v1/chat/completions",
                  "{\"model\":\"fake/m\",\"messages\":[{\"role\":"
                  "\"user\",\"content\":\"hi\"}]}",
                  200);
    msg = json_object_get(json_array_get(json_object_get(ans, "choices"), 0),
                          "message");
    assert_string_equal(sh_str(msg, "content"), "Hi there.");
    json_decref(ans);
    json_decref(sh_json(&h, "GET", "/healthz", NULL, 200));
    sh_free(&h);
    free(text);
    json_decref(script);
    free(body);
}

/* With server.fibers off, libmicrohttpd polls on a thread of its own and
 * each run gets a thread: the same answers, stored, and the same stop. */
static void test_threads_without_fibers(void **state)
{
    sh h;
    json_t *run;

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, "  fibers: false\n");
    for (int i = 0; i < 3; i++) {
        run = sh_json(&h, "POST", "/v1/runs", "{\"input\":\"hi\"}", 200);
        assert_string_equal(sh_str(run, "status"), "completed");
        assert_string_equal(sh_str(run, "text"), "Hello world");
        assert_int_equal(stored_messages(&h, sh_str(run, "conversation_id")),
                         2);
        json_decref(run);
    }
    sh_stop_server(&h);
    sh_free(&h);
}

static void test_run_stream(void **state)
{
    sh h;
    sh_resp r;
    json_t *evs, *d;
    char hv[128];
    size_t n;

    (void)state;
    sh_start(&h,
             LOOP("{\"tool_calls\":[{\"id\":\"c1\",\"name\":\"get_time\","
                  "\"arguments\":\"{}\"}]," USAGE "}," HELLO),
             NULL, NULL);
    assert_int_equal(sh_req(&h, "POST", "/v1/runs",
                            "{\"input\":\"time?\",\"stream\":true}", NULL, &r),
                     200);
    assert_non_null(sh_header(&r, "Content-Type", hv, sizeof(hv)));
    assert_non_null(strstr(hv, "text/event-stream"));
    evs = sh_sse_parse(r.body, NULL);
    n = json_array_size(evs);
    assert_true(n >= 8);
    check_seqs(evs, 1);
    /* The first event carries both ids, before any model output. */
    d = json_object_get(json_array_get(evs, 0), "data");
    assert_string_equal(sh_ev_type(evs, 0), "run.started");
    assert_non_null(sh_header(&r, "X-Loom-Run-Id", hv, sizeof(hv)));
    assert_string_equal(sh_str(d, "run_id"), hv);
    assert_non_null(sh_header(&r, "X-Loom-Conversation-Id", hv, sizeof(hv)));
    assert_string_equal(sh_str(d, "conversation_id"), hv);
    assert_string_equal(sh_ev_type(evs, 1), "usage");
    assert_string_equal(sh_ev_type(evs, 2), "tool_calls");
    assert_string_equal(sh_ev_type(evs, 3), "tool.started");
    assert_string_equal(sh_ev_type(evs, 4), "tool.completed");
    assert_string_equal(sh_ev_type(evs, n - 1), "run.completed");
    assert_string_equal(
        sh_str(json_object_get(json_array_get(evs, n - 1), "data"), "text"),
        "Hello world");
    json_decref(evs);
    sh_resp_free(&r);
    sh_free(&h);
}

static int raw_connect(const sh *h);

/* An HTTP/1.0 client gets the stream without chunks, read through the
 * response's block a piece at a time: an answer many times the block
 * arrives whole, and the connection closes after it. */
static void test_run_stream_http10(void **state)
{
    static const char req_head[] = "POST /v1/runs HTTP/1.0\r\n"
                                   "Host: x\r\nContent-Type: "
                                   "application/json\r\nContent-Length: ";
    static const char body[] = "{\"input\":\"hi\",\"stream\":true}";
    loom_buf script = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    loom_buf want = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    loom_buf got = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    char req[256], buf[4096], *text;
    json_t *evs, *last;
    ssize_t n;
    sh h;
    int fd, i;

    (void)state;
    assert_int_equal(loom_buf_puts(&script, "{\"loop\":true,\"responses\":"
                                            "[{\"text\":["),
                     0);
    for (i = 0; i < 60; i++) {
        char piece[80];
        snprintf(piece, sizeof(piece),
                 "piece %02d of a long answer, for an HTTP/1.0 client. ", i);
        assert_int_equal(
            loom_buf_printf(&script, "%s\"%s\"", i ? "," : "", piece), 0);
        assert_int_equal(loom_buf_puts(&want, piece), 0);
    }
    assert_int_equal(loom_buf_puts(&script, "]," USAGE "}]}"), 0);
    sh_start(&h, loom_buf_cstr(&script), NULL, NULL);
    fd = raw_connect(&h);
    snprintf(req, sizeof(req), "%s%zu\r\n\r\n%s", req_head, strlen(body), body);
    assert_int_equal(send(fd, req, strlen(req), MSG_NOSIGNAL),
                     (ssize_t)strlen(req));
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0)
        assert_int_equal(loom_buf_put(&got, buf, (size_t)n), 0);
    assert_int_equal(n, 0); /* closed by the server, not timed out */
    close(fd);
    text = strstr(loom_buf_cstr(&got), "\r\n\r\n");
    assert_non_null(text);
    assert_memory_equal(loom_buf_cstr(&got) + 8, " 200", 4);
    assert_null(strstr(loom_buf_cstr(&got), "Transfer-Encoding"));
    assert_true(strlen(text) > 4 * 1024);
    evs = sh_sse_parse(text + 4, NULL);
    check_seqs(evs, 1);
    last = json_array_get(evs, json_array_size(evs) - 1);
    assert_string_equal(sh_ev_type(evs, json_array_size(evs) - 1),
                        "run.completed");
    assert_string_equal(sh_str(json_object_get(last, "data"), "text"),
                        loom_buf_cstr(&want));
    json_decref(evs);
    loom_buf_free(&got);
    loom_buf_free(&want);
    loom_buf_free(&script);
    sh_free(&h);
}

static void test_run_input_and_conversation(void **state)
{
    sh h;
    json_t *a, *b, *reqs, *msgs;
    char body[256];

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, NULL);
    a = sh_json(&h, "POST", "/v1/runs",
                "{\"agent\":\"plain\",\"input\":[{\"role\":\"system\","
                "\"content\":\"Use French.\"},{\"role\":\"user\","
                "\"content\":\"one\"}]}",
                200);
    assert_string_equal(sh_str(a, "agent"), "plain");
    snprintf(body, sizeof(body),
             "{\"agent\":\"plain\",\"input\":\"two\","
             "\"conversation_id\":\"%s\"}",
             sh_str(a, "conversation_id"));
    b = sh_json(&h, "POST", "/v1/runs", body, 200);
    assert_string_equal(sh_str(b, "conversation_id"),
                        sh_str(a, "conversation_id"));
    reqs = fake_requests(h.fake);
    assert_int_equal(json_array_size(reqs), 2);
    msgs = json_object_get(json_object_get(json_array_get(reqs, 0), "body"),
                           "messages");
    assert_int_equal(json_array_size(msgs), 3);
    assert_string_equal(sh_str(json_array_get(msgs, 0), "content"),
                        "Be brief.");
    assert_string_equal(sh_str(json_array_get(msgs, 1), "content"),
                        "Use French.");
    /* The second turn sees the first from the store. */
    msgs = json_object_get(json_object_get(json_array_get(reqs, 1), "body"),
                           "messages");
    assert_int_equal(json_array_size(msgs), 5);
    assert_string_equal(sh_str(json_array_get(msgs, 2), "content"), "one");
    assert_string_equal(sh_str(json_array_get(msgs, 3), "role"), "assistant");
    assert_string_equal(sh_str(json_array_get(msgs, 3), "content"),
                        "Hello world");
    assert_string_equal(sh_str(json_array_get(msgs, 4), "content"), "two");
    json_decref(reqs);
    assert_int_equal(stored_messages(&h, sh_str(a, "conversation_id")), 5);
    json_decref(a);
    json_decref(b);
    sh_free(&h);
}

static void expect_400(sh *h, const char *body, const char *code,
                       const char *param)
{
    sh_resp r;
    json_t *j;

    if (sh_req(h, "POST", "/v1/runs", body, NULL, &r) != 400)
        fail_msg("%s: status %ld: %s", body, r.status, r.body);
    sh_check_error(r.body, code);
    j = json_loads(r.body, 0, NULL);
    if (param)
        assert_string_equal(sh_str(json_object_get(j, "error"), "param"),
                            param);
    json_decref(j);
    sh_resp_free(&r);
}

static void test_run_bad_requests(void **state)
{
    sh h;
    sh_resp r;

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, NULL);
    expect_400(&h, "{not json", "invalid_json", NULL);
    expect_400(&h, "[1]", "invalid_json", NULL);
    expect_400(&h, "{\"input\":\"x\",\"strem\":true}", "unknown_parameter",
               "strem");
    expect_400(&h, "{}", "invalid_value", "input");
    expect_400(&h, "{\"input\":\"\"}", "invalid_value", "input");
    expect_400(&h, "{\"input\":[]}", "invalid_value", "input");
    expect_400(&h, "{\"input\":[{\"role\":\"robot\",\"content\":\"x\"}]}",
               "invalid_value", "input");
    expect_400(&h, "{\"input\":[{\"role\":\"user\"}]}", "invalid_value",
               "input");
    expect_400(&h, "{\"input\":\"x\",\"stream\":\"yes\"}", "invalid_value",
               "stream");
    expect_400(&h, "{\"input\":\"x\",\"max_iterations\":0}", "invalid_value",
               "max_iterations");
    expect_400(&h, "{\"input\":\"x\",\"tools\":[\"nope\"]}", "invalid_value",
               NULL);
    assert_int_equal(sh_req(&h, "POST", "/v1/runs",
                            "{\"input\":\"x\",\"agent\":\"ghost\"}", NULL,
                            &r),
                     404);
    sh_check_error(r.body, "not_found");
    assert_non_null(strstr(r.body, "ghost"));
    sh_resp_free(&r);
    assert_int_equal(
        sh_req(&h, "POST", "/v1/runs",
               "{\"input\":\"x\",\"conversation_id\":\"conv_nope\"}", NULL,
               &r),
        404);
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "POST", "/v1/runs",
                            "{\"input\":\"x\",\"model\":\"nope/x\"}", NULL,
                            &r),
                     404);
    sh_resp_free(&r);
    /* Nothing reached the model, and no conversation was created. */
    assert_int_equal(fake_request_count(h.fake), 0);
    {
        json_t *l = sh_json(&h, "GET", "/v1/conversations", NULL, 200);
        assert_int_equal(json_array_size(json_object_get(l, "data")), 0);
        json_decref(l);
    }
    sh_free(&h);
}

/* POSTs body to path and expects a 400 invalid_json whose message holds
 * want. */
static void expect_bad_json(const sh *h, const char *path, const char *body,
                            const char *want)
{
    sh_resp r;
    json_t *j;
    const char *msg;

    if (sh_req(h, "POST", path, body, NULL, &r) != 400)
        fail_msg("%s: status %ld: %s", path, r.status, r.body);
    sh_check_error(r.body, "invalid_json");
    j = json_loads(r.body, 0, NULL);
    msg = sh_str(json_object_get(j, "error"), "message");
    if (!strstr(msg, want))
        fail_msg("%s: \"%s\" lacks \"%s\"", path, msg, want);
    json_decref(j);
    sh_resp_free(&r);
}

/* Bodies that are not JSON get the same code from both APIs, and a
 * message saying where: invalid UTF-8, \u0000 in a string, a lone
 * surrogate. */
static void test_bad_json_offsets(void **state)
{
    static const char *const paths[] = {"/v1/runs", "/v1/chat/completions"};
    sh h;

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, NULL);
    for (size_t i = 0; i < 2; i++) {
        expect_bad_json(&h, paths[i], "{\"input\":\"x\xff\"}",
                        "unable to decode byte 0xff");
        expect_bad_json(&h, paths[i], "{\"input\":\"x\xff\"}",
                        "at byte offset 11 (line 1, column 11)");
        expect_bad_json(&h, paths[i], "{\"input\":\"x\\u0000\"}",
                        "\\u0000 is not allowed in a string, at byte "
                        "offset 18");
        expect_bad_json(&h, paths[i], "{\"input\":\"\\ud800\"}",
                        "invalid Unicode '\\uD800'");
        expect_bad_json(&h, paths[i], "{\"input\":\"\\ud800\"}",
                        "at byte offset 17");
        expect_bad_json(&h, paths[i], "{\"input\":", "byte offset 9");
        expect_bad_json(&h, paths[i], "[1]", "must be a JSON object");
    }
    assert_int_equal(fake_request_count(h.fake), 0);
    sh_free(&h);
}

static void test_background_and_cancel(void **state)
{
    sh h;
    sh_resp r;
    json_t *run, *done, *conv, *last;
    char path[128];

    (void)state;
    sh_start(&h, LOOP(HANG), NULL, NULL);
    assert_int_equal(sh_req(&h, "POST", "/v1/runs",
                            "{\"input\":\"x\",\"background\":true}", NULL, &r),
                     202);
    run = json_loads(r.body, 0, NULL);
    sh_resp_free(&r);
    assert_string_equal(sh_str(run, "status"), "running");
    assert_true(json_is_true(json_object_get(run, "background")));
    /* Wait until the model has started answering. */
    while (fake_request_count(h.fake) < 1)
        usleep(10 * 1000);
    snprintf(path, sizeof(path), "/v1/runs/%s/cancel", sh_str(run, "id"));
    done = sh_json(&h, "POST", path, NULL, 200);
    assert_string_equal(sh_str(done, "status"), "cancelled");
    json_decref(done);
    assert_int_equal(sh_req(&h, "POST", path, NULL, NULL, &r), 409);
    sh_check_error(r.body, "run_not_active");
    sh_resp_free(&r);
    assert_int_equal(
        sh_req(&h, "POST", "/v1/runs/run_nope/cancel", NULL, NULL, &r), 404);
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "GET", "/v1/runs/run_nope", NULL, NULL, &r),
                     404);
    sh_resp_free(&r);

    snprintf(path, sizeof(path), "/v1/conversations/%s",
             sh_str(run, "conversation_id"));
    conv = sh_json(&h, "GET", path, NULL, 200);
    last = sh_last_message(conv);
    assert_string_equal(sh_str(last, "role"), "assistant");
    assert_string_equal(sh_str(last, "status"), "cancelled");
    json_decref(conv);
    json_decref(run);
    sh_free(&h);
}

/*
 * A sub-agent's events come nested in its parent's run, under the run's
 * own seq: the stream and its replay carry them with the child's run_id
 * and where it hangs, and end with the top run's run.completed.
 */
static void test_nested_events(void **state)
{
    sh h;
    sh_resp r;
    json_t *evs, *again, *last;
    char *yaml = NULL, path[160];
    const char *top;
    size_t i, n, nested = 0;
    json_t *e;

    (void)state;
    memset(&h, 0, sizeof(h));
    h.fake = fake_start_script(
        "{\"rules\":["
        " {\"match\":{\"system\":\"You are main\"},\"responses\":["
        "  {\"tool_calls\":[{\"id\":\"c1\",\"name\":\"helper\","
        "    \"arguments\":\"{\\\"task\\\":\\\"dig\\\"}\"}]},"
        "  {\"text\":[\"main done\"]}]},"
        " {\"match\":{\"system\":\"You help\"},\"responses\":["
        "  {\"text\":[\"helped\"]," USAGE "}]}]}");
    assert_non_null(h.fake);
    h.db = test_tmp_path("nested.db");
    unlink(h.db);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake: {base_url: %s, api_key: sk-test, "
                         "retries: {max: 0}}\n"
                         "models:\n"
                         "  fake/m: {upstream: fake-model}\n"
                         "agents:\n"
                         "  main: {model: fake/m, system_prompt: You are "
                         "main., tools: [], sub_agents: [helper]}\n"
                         "  helper: {model: fake/m, system_prompt: You "
                         "help., tools: []}\n"
                         "default_agent: main\n"
                         "server:\n"
                         "  listen: 127.0.0.1:0\n",
                         fake_base_url(h.fake)) > 0);
    sh_start_config(&h, yaml);
    free(yaml);

    assert_int_equal(sh_req(&h, "POST", "/v1/runs",
                            "{\"input\":\"go\",\"stream\":true}", NULL, &r),
                     200);
    evs = sh_sse_parse(r.body, NULL);
    sh_resp_free(&r);
    n = json_array_size(evs);
    check_seqs(evs, 1);
    top = sh_str(json_object_get(json_array_get(evs, 0), "data"), "run_id");
    json_array_foreach(evs, i, e)
    {
        json_t *d = json_object_get(e, "data");
        if (!json_object_get(d, "parent_run_id"))
            continue;
        nested++;
        assert_string_not_equal(sh_str(d, "run_id"), top);
        assert_string_equal(sh_str(d, "parent_run_id"), top);
        assert_string_equal(sh_str(d, "parent_call_id"), "c1");
        assert_string_equal(sh_str(d, "agent"), "helper");
    }
    /* run.started, message.delta, usage, run.completed at least. */
    assert_true(nested >= 4);
    last = json_object_get(json_array_get(evs, n - 1), "data");
    assert_string_equal(sh_str(last, "type"), "run.completed");
    assert_string_equal(sh_str(last, "run_id"), top);
    assert_string_equal(sh_str(last, "text"), "main done");

    /* The replay is the same stream. */
    snprintf(path, sizeof(path), "/v1/runs/%s/events", top);
    assert_int_equal(sh_req(&h, "GET", path, NULL, NULL, &r), 200);
    again = sh_sse_parse(r.body, NULL);
    sh_resp_free(&r);
    assert_true(json_equal(again, evs));
    json_decref(again);
    json_decref(evs);
    sh_free(&h);
}

static void test_events_resume(void **state)
{
    sh h;
    sh_resp r;
    json_t *run, *events, *evs;
    struct curl_slist *hdr = NULL;
    char path[160];
    size_t n;

    (void)state;
    sh_start(&h,
             LOOP("{\"text\":[\"a\",\"b\",\"c\",\"d\",\"e\",\"f\"],"
                  "\"chunk_delay_ms\":30," USAGE "}"),
             NULL, NULL);
    run = sh_json(&h, "POST", "/v1/runs", "{\"input\":\"x\"}", 200);
    events = json_object_get(run, "events");
    n = json_array_size(events);
    assert_true(n >= 8);

    /* Last-Event-ID: 3 gives exactly the events after 3. */
    snprintf(path, sizeof(path), "/v1/runs/%s/events", sh_str(run, "id"));
    hdr = curl_slist_append(hdr, "Last-Event-ID: 3");
    assert_int_equal(sh_req(&h, "GET", path, NULL, hdr, &r), 200);
    curl_slist_free_all(hdr);
    evs = sh_sse_parse(r.body, NULL);
    assert_int_equal(json_array_size(evs), n - 3);
    for (size_t i = 0; i < n - 3; i++) {
        json_t *e = json_array_get(evs, i);
        assert_int_equal(json_integer_value(json_object_get(e, "id")),
                         (json_int_t)i + 4);
        assert_true(json_equal(json_object_get(e, "data"),
                               json_array_get(events, i + 3)));
    }
    json_decref(evs);
    sh_resp_free(&r);

    /* After the last one: an empty stream that ends at once. */
    snprintf(path, sizeof(path), "/v1/runs/%s/events?after=%zu",
             sh_str(run, "id"), n);
    assert_int_equal(sh_req(&h, "GET", path, NULL, NULL, &r), 200);
    evs = sh_sse_parse(r.body, NULL);
    assert_int_equal(json_array_size(evs), 0);
    json_decref(evs);
    sh_resp_free(&r);

    snprintf(path, sizeof(path), "/v1/runs/%s/events?after=x",
             sh_str(run, "id"));
    assert_int_equal(sh_req(&h, "GET", path, NULL, NULL, &r), 400);
    sh_resp_free(&r);
    json_decref(run);

    /* Live: follow a background run from the start, as it streams. */
    assert_int_equal(sh_req(&h, "POST", "/v1/runs",
                            "{\"input\":\"x\",\"background\":true}", NULL, &r),
                     202);
    run = json_loads(r.body, 0, NULL);
    sh_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/runs/%s/events", sh_str(run, "id"));
    assert_int_equal(sh_req(&h, "GET", path, NULL, NULL, &r), 200);
    evs = sh_sse_parse(r.body, NULL);
    assert_int_equal(json_array_size(evs), n);
    check_seqs(evs, 1);
    assert_string_equal(sh_ev_type(evs, n - 1), "run.completed");
    json_decref(evs);
    sh_resp_free(&r);
    json_decref(run);
    sh_free(&h);
}

/* ---- a client that goes away --------------------------------------------- */

/* Run id and conversation id from an SSE body's run.started. */
static void ids_from_stream(const char *body, char *run_id,
                            char *conv_id)
{
    json_t *evs = sh_sse_parse(body, NULL);
    json_t *d = json_object_get(json_array_get(evs, 0), "data");

    assert_string_equal(sh_ev_type(evs, 0), "run.started");
    snprintf(run_id, 64, "%s", sh_str(d, "run_id"));
    snprintf(conv_id, 64, "%s", sh_str(d, "conversation_id"));
    json_decref(evs);
}

static void test_disconnect_cancels(void **state)
{
    static const char *const args[] = {"--max-requests", "1", NULL};
    sh h;
    sh_abort_ctx a;
    CURL *e;
    CURLcode rc;
    json_t *run, *conv, *last, *reqs;
    char run_id[64], conv_id[64], path[128];
    long long t0;
    int st;

    (void)state;
    sh_start(&h, LOOP(HANG), args, NULL);
    memset(&a, 0, sizeof(a));
    a.until = "\"delta\":\"answer\"";
    e = sh_easy(&h, "POST", "/v1/runs", "{\"input\":\"x\",\"stream\":true}",
                NULL, &a.r);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sh_abort_on);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &a);
    rc = curl_easy_perform(e);
    curl_easy_cleanup(e);
    t0 = test_now_ms();
    assert_int_equal(rc, CURLE_WRITE_ERROR);
    ids_from_stream(a.r.body, run_id, conv_id);
    sh_resp_free(&a.r);

    /* The fake exits once its one request ended: loom aborted it. */
    st = fake_wait_exit(h.fake, 20000);
    print_message("upstream request ended %lld ms after the client left\n",
                  test_now_ms() - t0);
    assert_int_equal(st, 0);
    reqs = fake_requests(h.fake);
    assert_int_equal(json_array_size(reqs), 1);
    json_decref(reqs);

    run = sh_wait_run(&h, run_id, 20000);
    assert_string_equal(sh_str(run, "status"), "cancelled");
    json_decref(run);
    snprintf(path, sizeof(path), "/v1/conversations/%s", conv_id);
    conv = sh_json(&h, "GET", path, NULL, 200);
    last = sh_last_message(conv);
    assert_string_equal(sh_str(last, "role"), "assistant");
    assert_string_equal(sh_str(last, "content"), "Partial answer");
    assert_string_equal(sh_str(last, "status"), "cancelled");
    json_decref(conv);
    sh_free(&h);
}

/* A blocking (non-streamed) run is cancelled too when its client leaves. */
static void test_disconnect_blocking_cancels(void **state)
{
    static const char *const args[] = {"--max-requests", "1", NULL};
    sh h;
    sh_resp r;
    CURL *e;
    CURLcode rc;
    json_t *list, *conv, *last;
    char path[128];

    (void)state;
    sh_start(&h, LOOP(HANG), args, NULL);
    memset(&r, 0, sizeof(r));
    e = sh_easy(&h, "POST", "/v1/runs", "{\"input\":\"x\"}", NULL, &r);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 700L);
    rc = curl_easy_perform(e);
    curl_easy_cleanup(e);
    assert_int_equal(rc, CURLE_OPERATION_TIMEDOUT);
    sh_resp_free(&r);
    assert_int_equal(fake_wait_exit(h.fake, 20000), 0);
    /* The cancelled turn is stored. */
    for (int i = 0; i < 1000; i++) {
        list = sh_json(&h, "GET", "/v1/conversations", NULL, 200);
        if (json_integer_value(json_object_get(
                json_array_get(json_object_get(list, "data"), 0),
                "message_count")) >= 2)
            break;
        json_decref(list);
        list = NULL;
        usleep(20 * 1000);
    }
    assert_non_null(list);
    snprintf(path, sizeof(path), "/v1/conversations/%s",
             sh_str(json_array_get(json_object_get(list, "data"), 0), "id"));
    conv = sh_json(&h, "GET", path, NULL, 200);
    last = sh_last_message(conv);
    assert_string_equal(sh_str(last, "status"), "cancelled");
    json_decref(conv);
    json_decref(list);
    sh_free(&h);
}

/* ---- limits -------------------------------------------------------------- */

typedef struct {
    const char *data;
    size_t len, off;
} upload;

static size_t read_upload(char *buf, size_t sz, size_t n, void *ud)
{
    upload *u = ud;
    size_t want = sz * n, left = u->len - u->off;

    if (want > left)
        want = left;
    if (want > 100)
        want = 100; /* several chunks */
    memcpy(buf, u->data + u->off, want);
    u->off += want;
    return want;
}

/* A {"input": "xxx..."} body of exactly len bytes. */
static char *body_of(size_t len)
{
    static const char head[] = "{\"input\":\"", tail[] = "\"}";
    char *b = malloc(len + 1);
    size_t fill = len - strlen(head) - strlen(tail);

    memcpy(b, head, strlen(head));
    memset(b + strlen(head), 'x', fill);
    memcpy(b + strlen(head) + fill, tail, strlen(tail) + 1);
    return b;
}

static void test_body_limit(void **state)
{
    sh h;
    sh_resp r;
    char *at = body_of(1024), *over = body_of(1025);
    struct curl_slist *hdr = NULL;
    upload u;
    CURL *e;

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, "  max_body_bytes: 1024\n");
    assert_int_equal(sh_req(&h, "POST", "/v1/runs", at, NULL, &r), 200);
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "POST", "/v1/runs", over, NULL, &r), 413);
    sh_check_error(r.body, "request_too_large");
    sh_resp_free(&r);

    /* Chunked, so the size is only known as it arrives. */
    u.data = over;
    u.len = strlen(over);
    u.off = 0;
    memset(&r, 0, sizeof(r));
    e = sh_easy(&h, "POST", "/v1/runs", NULL, NULL, &r);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, NULL);
    hdr = curl_slist_append(hdr, "Transfer-Encoding: chunked");
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_READFUNCTION, read_upload);
    curl_easy_setopt(e, CURLOPT_READDATA, &u);
    assert_int_equal(curl_easy_perform(e), CURLE_OK);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r.status);
    assert_int_equal(r.status, 413);
    sh_check_error(r.body, "request_too_large");
    curl_easy_cleanup(e);
    curl_slist_free_all(hdr);
    sh_resp_free(&r);
    /* Only the run at the limit reached the model. */
    assert_int_equal(fake_request_count(h.fake), 1);
    free(at);
    free(over);
    sh_free(&h);
}

/* Headers live in libmicrohttpd's per-connection memory (32 KiB). */
static void test_header_limit(void **state)
{
    sh h;
    sh_resp r;
    struct curl_slist *hdr = NULL;
    char *big = malloc(70 * 1024 + 16);

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, NULL);
    memcpy(big, "X-Big: ", 7);
    memset(big + 7, 'a', 20 * 1024);
    big[7 + 20 * 1024] = '\0';
    hdr = curl_slist_append(hdr, big);
    assert_int_equal(sh_req(&h, "GET", "/healthz", NULL, hdr, &r), 200);
    sh_resp_free(&r);
    curl_slist_free_all(hdr);
    hdr = NULL;
    memset(big + 7, 'a', 70 * 1024);
    big[7 + 70 * 1024] = '\0';
    hdr = curl_slist_append(hdr, big);
    assert_int_equal(sh_req(&h, "POST", "/v1/runs", "{\"input\":\"x\"}",
                            hdr, &r),
                     431);
    sh_resp_free(&r);
    curl_slist_free_all(hdr);
    free(big);
    assert_int_equal(fake_request_count(h.fake), 0);
    sh_free(&h);
}

/* A request with a header "X-Big: aaa..." of len letters, on a streamed
 * run: its status (the events end with run.completed when 200). */
static long big_header_run(const sh *h, size_t len, const char *body)
{
    struct curl_slist *hdr = NULL;
    char *big = malloc(len + 8);
    sh_resp r;
    json_t *evs;
    long status;

    memcpy(big, "X-Big: ", 7);
    memset(big + 7, 'a', len);
    big[7 + len] = '\0';
    hdr = curl_slist_append(hdr, big);
    status = sh_req(h, "POST", "/v1/runs", body, hdr, &r);
    if (status == 200 && strstr(body, "\"stream\":true")) {
        evs = sh_sse_parse(r.body, NULL);
        assert_string_equal(sh_ev_type(evs, json_array_size(evs) - 1),
                            "run.completed");
        json_decref(evs);
    }
    sh_resp_free(&r);
    curl_slist_free_all(hdr);
    free(big);
    return status;
}

/* server.connection_memory_kb bounds a request's headers (docs/server.md:
 * up to the pool less 1 KiB are served), not its body. */
static void test_connection_memory(void **state)
{
    static const char stream[] = "{\"input\":\"x\",\"stream\":true}";
    sh h;
    sh_resp r;
    char *body;
    size_t len = (4u << 20) - 1024, fill;

    (void)state;
    /* The default, 32 KiB. */
    sh_start(&h, LOOP(HELLO), NULL, NULL);
    assert_int_equal(big_header_run(&h, 31 * 1024 - 200, stream), 200);
    assert_int_equal(big_header_run(&h, 33 * 1024, stream), 431);
    sh_free(&h);

    /* The floor, with a body near max_body_bytes read through it. */
    sh_start(&h, LOOP(HELLO), NULL, "  connection_memory_kb: 16\n");
    assert_int_equal(big_header_run(&h, 15 * 1024 - 200, stream), 200);
    assert_int_equal(big_header_run(&h, 17 * 1024, stream), 431);
    body = malloc(len + 1);
    memcpy(body, "{\"input\":\"", 10);
    for (fill = 10; fill + 2 < len; fill++)
        body[fill] = fill % 6 == 0 ? ' ' : 'w';
    memcpy(body + len - 2, "\"}", 3);
    assert_int_equal(sh_req(&h, "POST", "/v1/runs", body, NULL, &r), 200);
    sh_resp_free(&r);
    free(body);
    assert_int_equal(fake_request_count(h.fake), 2);
    sh_free(&h);

    /* Raised for clients with larger headers. */
    sh_start(&h, LOOP(HELLO), NULL, "  connection_memory_kb: 96\n");
    assert_int_equal(big_header_run(&h, 90 * 1024, stream), 200);
    sh_free(&h);
}

static void test_busy_503(void **state)
{
    sh h;
    sh_resp r;
    json_t *a, *b, *c;
    char hv[32], path[128];

    (void)state;
    /* No admission queue: past the slots, 503 at once. */
    sh_start(&h, "{\"responses\":[" HANG "," HANG "," HELLO "]}", NULL,
             "  max_concurrent_runs: 2\n  queue_max: 0\n");
    a = sh_json(&h, "POST", "/v1/runs",
                "{\"input\":\"x\",\"background\":true}", 202);
    b = sh_json(&h, "POST", "/v1/runs",
                "{\"input\":\"x\",\"background\":true}", 202);
    assert_int_equal(sh_req(&h, "POST", "/v1/runs",
                            "{\"input\":\"x\",\"stream\":true}", NULL, &r),
                     503);
    sh_check_error(r.body, "server_busy");
    assert_non_null(sh_header(&r, "Retry-After", hv, sizeof(hv)));
    assert_string_equal(hv, "1");
    sh_resp_free(&r);
    /* The refused run created nothing. */
    c = sh_json(&h, "GET", "/v1/conversations", NULL, 200);
    assert_int_equal(json_array_size(json_object_get(c, "data")), 2);
    json_decref(c);
    while (fake_request_count(h.fake) < 2)
        usleep(10 * 1000);
    snprintf(path, sizeof(path), "/v1/runs/%s/cancel", sh_str(a, "id"));
    json_decref(sh_json(&h, "POST", path, NULL, 200));
    snprintf(path, sizeof(path), "/v1/runs/%s/cancel", sh_str(b, "id"));
    json_decref(sh_json(&h, "POST", path, NULL, 200));
    /* Slots free again. */
    c = sh_json(&h, "POST", "/v1/runs", "{\"input\":\"x\"}", 200);
    assert_string_equal(sh_str(c, "text"), "Hello world");
    json_decref(a);
    json_decref(b);
    json_decref(c);
    sh_free(&h);
}

static int raw_connect(const sh *h)
{
    struct sockaddr_in a;
    struct timeval tv = {20, 0};
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    assert_true(fd >= 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)loom_server_port(h->srv));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

/* Sends text, then waits for the server to close; returns the ms it
 * took, or -1 when it did not close within 20 s. Any answer bytes are
 * read and dropped. */
static long long cut_after(const sh *h, const char *text)
{
    int fd = raw_connect(h);
    long long t0 = test_now_ms();
    char buf[512];
    ssize_t n;

    assert_int_equal(send(fd, text, strlen(text), MSG_NOSIGNAL),
                     (ssize_t)strlen(text));
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0)
        ;
    close(fd);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return -1;
    return test_now_ms() - t0;
}

static void test_read_timeout(void **state)
{
    sh h;
    long long ms;

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, "  read_timeout_ms: 1000\n");
    /* Half the headers. */
    ms = cut_after(&h, "POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-");
    print_message("half headers cut after %lld ms\n", ms);
    assert_true(ms >= 500);
    /* All the headers, a tenth of the body. */
    ms = cut_after(&h, "POST /v1/runs HTTP/1.1\r\nHost: x\r\n"
                       "Content-Length: 100\r\n\r\n{\"input\":");
    print_message("half body cut after %lld ms\n", ms);
    assert_true(ms >= 500);
    assert_int_equal(fake_request_count(h.fake), 0);
    sh_free(&h);
}

static void test_max_connections(void **state)
{
    static const char req[] = "GET /healthz HTTP/1.1\r\nHost: x\r\n"
                              "Connection: close\r\n\r\n";
    sh h;
    int a, b, c;
    char buf[256];
    ssize_t n;
    struct timeval shortwait = {0, 500 * 1000};

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, "  max_connections: 2\n");
    a = raw_connect(&h);
    b = raw_connect(&h);
    usleep(200 * 1000);
    /* A third connection waits: no answer while two are open. */
    c = raw_connect(&h);
    assert_int_equal(send(c, req, strlen(req), MSG_NOSIGNAL),
                     (ssize_t)strlen(req));
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &shortwait, sizeof(shortwait));
    n = recv(c, buf, sizeof(buf) - 1, 0);
    assert_int_equal(n, -1);
    assert_true(errno == EAGAIN || errno == EWOULDBLOCK);
    /* One slot frees: it is served. */
    close(a);
    shortwait.tv_sec = 20;
    shortwait.tv_usec = 0;
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &shortwait, sizeof(shortwait));
    n = recv(c, buf, sizeof(buf) - 1, 0);
    assert_true(n > 12);
    buf[n] = '\0';
    assert_memory_equal(buf, "HTTP/1.1 200", 12);
    close(b);
    close(c);
    sh_free(&h);
}

static void test_keepalive_comments(void **state)
{
    sh h;
    sh_resp r;
    json_t *evs;
    int comments;

    (void)state;
    sh_start(&h,
             LOOP("{\"delay_ms\":800,\"text\":[\"late\"]," USAGE "}"), NULL,
             "  keepalive_ms: 50\n");
    assert_int_equal(sh_req(&h, "POST", "/v1/runs",
                            "{\"input\":\"x\",\"stream\":true}", NULL, &r),
                     200);
    evs = sh_sse_parse(r.body, &comments);
    print_message("%d keep-alive comments in %.2fs\n", comments, r.secs);
    assert_true(comments >= 2);
    assert_non_null(strstr(r.body, "\n: keep-alive\n\n"));
    assert_string_equal(sh_ev_type(evs, json_array_size(evs) - 1),
                        "run.completed");
    check_seqs(evs, 1);
    json_decref(evs);
    sh_resp_free(&r);

    /* A slow tool keeps the stream idle too. */
    sh_free(&h);
    sh_start(&h,
             LOOP("{\"tool_calls\":[{\"id\":\"c\",\"name\":\"slow\","
                  "\"arguments\":\"{\\\"ms\\\":600}\"}]," USAGE "}," HELLO),
             NULL, "  keepalive_ms: 50\n");
    assert_int_equal(sh_req(&h, "POST", "/v1/runs",
                            "{\"input\":\"x\",\"stream\":true}", NULL, &r),
                     200);
    evs = sh_sse_parse(r.body, &comments);
    assert_true(comments >= 2);
    assert_string_equal(sh_ev_type(evs, json_array_size(evs) - 1),
                        "run.completed");
    json_decref(evs);
    sh_resp_free(&r);
    sh_free(&h);
}

static void test_keep_finished_runs(void **state)
{
    sh h;
    sh_resp r;
    json_t *a, *b;
    char path[128];

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, "  keep_finished_runs: 1\n");
    a = sh_json(&h, "POST", "/v1/runs", "{\"input\":\"x\"}", 200);
    b = sh_json(&h, "POST", "/v1/runs", "{\"input\":\"y\"}", 200);
    snprintf(path, sizeof(path), "/v1/runs/%s", sh_str(a, "id"));
    assert_int_equal(sh_req(&h, "GET", path, NULL, NULL, &r), 404);
    sh_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/runs/%s", sh_str(b, "id"));
    assert_int_equal(sh_req(&h, "GET", path, NULL, NULL, &r), 200);
    sh_resp_free(&r);
    /* The forgotten run is still in the store. */
    snprintf(path, sizeof(path), "/v1/conversations/%s",
             sh_str(a, "conversation_id"));
    json_decref(sh_json(&h, "GET", path, NULL, 200));
    json_decref(a);
    json_decref(b);
    sh_free(&h);
}

static void test_event_log_limit(void **state)
{
    sh h;
    sh_resp r;
    loom_buf script = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    json_t *evs, *last;
    size_t n;

    (void)state;
    loom_buf_puts(&script, "{\"loop\":true,\"responses\":[{\"text\":[");
    for (int i = 0; i < 80; i++)
        loom_buf_printf(&script, "%s\"%0100d\"", i ? "," : "", i);
    loom_buf_puts(&script, "]}]}");
    sh_start(&h, script.ptr, NULL, "  max_run_events_bytes: 4096\n");
    loom_buf_free(&script);
    assert_int_equal(sh_req(&h, "POST", "/v1/runs",
                            "{\"input\":\"x\",\"stream\":true}", NULL, &r),
                     200);
    evs = sh_sse_parse(r.body, NULL);
    n = json_array_size(evs);
    assert_true(n < 40);
    last = json_object_get(json_array_get(evs, n - 1), "data");
    assert_string_equal(sh_str(last, "type"), "run.failed");
    assert_string_equal(sh_str(last, "status"), "cancelled");
    json_decref(evs);
    sh_resp_free(&r);
    sh_free(&h);
}

/* ---- conversations ------------------------------------------------------- */

static void test_conversations(void **state)
{
    sh h;
    sh_resp r;
    json_t *runs[3], *page, *data, *page2, *del;
    char path[160];

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, NULL);
    for (int i = 0; i < 3; i++) {
        char body[64];
        snprintf(body, sizeof(body), "{\"input\":\"question %d\"}", i);
        runs[i] = sh_json(&h, "POST", "/v1/runs", body, 200);
        /* The conversations so far go a second back: each one is older
         * than the next by a second, whatever the clock's resolution. */
        test_db_exec(h.db, "UPDATE conversations SET updated_at = "
                           "updated_at - 1000");
    }
    page = sh_json(&h, "GET", "/v1/conversations?limit=2", NULL, 200);
    assert_string_equal(sh_str(page, "object"), "list");
    data = json_object_get(page, "data");
    assert_int_equal(json_array_size(data), 2);
    assert_true(json_is_true(json_object_get(page, "has_more")));
    /* Newest first. */
    assert_string_equal(sh_str(json_array_get(data, 0), "id"),
                        sh_str(runs[2], "conversation_id"));
    assert_string_equal(sh_str(json_array_get(data, 0), "title"),
                        "question 2");
    assert_string_equal(sh_str(json_array_get(data, 1), "id"),
                        sh_str(runs[1], "conversation_id"));
    snprintf(path, sizeof(path), "/v1/conversations?limit=2&after=%s",
             sh_str(page, "next"));
    page2 = sh_json(&h, "GET", path, NULL, 200);
    assert_int_equal(json_array_size(json_object_get(page2, "data")), 1);
    assert_false(json_is_true(json_object_get(page2, "has_more")));
    assert_string_equal(
        sh_str(json_array_get(json_object_get(page2, "data"), 0), "id"),
        sh_str(runs[0], "conversation_id"));
    json_decref(page2);
    json_decref(page);
    assert_int_equal(
        sh_req(&h, "GET", "/v1/conversations?limit=0", NULL, NULL, &r), 400);
    sh_check_error(r.body, "invalid_value");
    sh_resp_free(&r);
    assert_int_equal(
        sh_req(&h, "GET", "/v1/conversations?limit=101", NULL, NULL, &r), 400);
    sh_resp_free(&r);
    assert_int_equal(
        sh_req(&h, "GET", "/v1/conversations?limit=2x", NULL, NULL, &r), 400);
    sh_resp_free(&r);

    snprintf(path, sizeof(path), "/v1/conversations/%s",
             sh_str(runs[0], "conversation_id"));
    page = sh_json(&h, "GET", path, NULL, 200);
    assert_string_equal(sh_str(page, "id"),
                        sh_str(runs[0], "conversation_id"));
    assert_int_equal(json_array_size(json_object_get(page, "messages")), 2);
    json_decref(page);
    del = sh_json(&h, "DELETE", path, NULL, 200);
    assert_true(json_is_true(json_object_get(del, "deleted")));
    assert_string_equal(sh_str(del, "object"), "conversation.deleted");
    json_decref(del);
    assert_int_equal(sh_req(&h, "GET", path, NULL, NULL, &r), 404);
    sh_check_error(r.body, "not_found");
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "DELETE", path, NULL, NULL, &r), 404);
    sh_resp_free(&r);
    page = sh_json(&h, "GET", "/v1/conversations", NULL, 200);
    assert_int_equal(json_array_size(json_object_get(page, "data")), 2);
    json_decref(page);
    for (int i = 0; i < 3; i++)
        json_decref(runs[i]);
    sh_free(&h);
}

/* A title is asked for: a short call writes it (markup taken off), a
 * conversation.title event carries it before run.completed, it is
 * stored, its usage is counted; the next turn makes none; a rename
 * stays; a search by title finds it; another conversation keeps the
 * user's words when the title call fails. */
static void test_conversation_titles(void **state)
{
    static const char script[] =
        "{\"rules\":["
        "{\"match\":{\"system\":\"Write a short title\","
        "\"first_user\":\"plan a trip\"},\"loop\":true,\"responses\":["
        "{\"text\":[\"**\\\"Trip to\\tParis\\\"**\\nSure, here it is\"],"
        "\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":4,"
        "\"total_tokens\":34}}]},"
        "{\"match\":{\"system\":\"Write a short title\"},\"loop\":true,"
        "\"responses\":[{\"status\":400,\"error\":"
        "{\"message\":\"down\"}}]},"
        "{\"match\":{\"tools_include\":[\"get_time\"]},\"loop\":true,"
        "\"responses\":[" HELLO "]}]}";
    sh h;
    sh_resp r;
    json_t *run, *events, *e, *conv, *usage, *list, *ren, *again;
    char path[200], body[300];
    size_t i, title_at = 0, done_at = 0;
    long total = 0;

    (void)state;
    sh_start(&h, script, NULL, NULL);
    run = sh_json(&h, "POST", "/v1/runs",
                  "{\"input\":\"plan a trip to Paris\",\"title\":true}", 200);
    assert_string_equal(sh_str(run, "text"), "Hello world");
    events = json_object_get(run, "events");
    json_array_foreach(events, i, e)
    {
        if (!strcmp(sh_str(e, "type"), "conversation.title")) {
            title_at = i;
            assert_string_equal(sh_str(e, "title"), "Trip to Paris");
        }
        if (!strcmp(sh_str(e, "type"), "run.completed"))
            done_at = i;
    }
    assert_true(title_at > 0 && title_at < done_at);
    /* The title call's tokens are the run's: 12 + 34. */
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(run, "usage"), "total_tokens")),
                     46);
    snprintf(path, sizeof(path), "/v1/conversations/%s",
             sh_str(run, "conversation_id"));
    conv = sh_json(&h, "GET", path, NULL, 200);
    assert_string_equal(sh_str(conv, "title"), "Trip to Paris");
    usage = json_object_get(conv, "usage");
    json_array_foreach(usage, i, e) total +=
        (long)json_integer_value(json_object_get(e, "total_tokens"));
    assert_int_equal(total, 46);
    json_decref(conv);

    /* A later turn of the conversation asks for no title. */
    snprintf(body, sizeof(body),
             "{\"input\":\"plan a trip again\",\"title\":true,"
             "\"conversation_id\":\"%s\"}",
             sh_str(run, "conversation_id"));
    again = sh_json(&h, "POST", "/v1/runs", body, 200);
    json_array_foreach(json_object_get(again, "events"), i, e)
        assert_string_not_equal(sh_str(e, "type"), "conversation.title");
    json_decref(again);

    /* Renamed: cleaned, kept by later turns, not moved up the list. */
    ren = sh_json(&h, "PATCH", path, "{\"title\":\"  Paris\\n\\tin May  \"}",
                  200);
    assert_string_equal(sh_str(ren, "title"), "Paris in May");
    json_decref(ren);
    again = sh_json(&h, "POST", "/v1/runs", body, 200);
    json_decref(again);
    conv = sh_json(&h, "GET", path, NULL, 200);
    assert_string_equal(sh_str(conv, "title"), "Paris in May");
    json_decref(conv);

    /* The title call fails: the answer stands, the user's words title
     * it, and nothing says conversation.title. */
    again = sh_json(&h, "POST", "/v1/runs",
                    "{\"input\":\"what is 100% of _x_?\",\"title\":true}", 200);
    assert_string_equal(sh_str(again, "status"), "completed");
    json_array_foreach(json_object_get(again, "events"), i, e)
        assert_string_not_equal(sh_str(e, "type"), "conversation.title");

    /* Search by title: case-insensitive, % and _ taken as they are. */
    list = sh_json(&h, "GET", "/v1/conversations?q=PARIS", NULL, 200);
    assert_int_equal(json_array_size(json_object_get(list, "data")), 1);
    assert_string_equal(
        sh_str(json_array_get(json_object_get(list, "data"), 0), "id"),
        sh_str(run, "conversation_id"));
    json_decref(list);
    list = sh_json(&h, "GET", "/v1/conversations?q=100%25", NULL, 200);
    assert_int_equal(json_array_size(json_object_get(list, "data")), 1);
    assert_string_equal(
        sh_str(json_array_get(json_object_get(list, "data"), 0), "title"),
        "what is 100% of _x_?");
    json_decref(list);
    list = sh_json(&h, "GET", "/v1/conversations?q=%25", NULL, 200);
    assert_int_equal(json_array_size(json_object_get(list, "data")), 1);
    json_decref(list);
    list = sh_json(&h, "GET", "/v1/conversations?q=a_x", NULL, 200);
    assert_int_equal(json_array_size(json_object_get(list, "data")), 0);
    json_decref(list);
    json_decref(again);

    /* Bad renames. */
    assert_int_equal(
        sh_req(&h, "PATCH", path, "{\"title\":\" \\n \"}", NULL, &r), 400);
    sh_check_error(r.body, "invalid_value");
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "PATCH", path, "{\"title\":7}", NULL, &r), 400);
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "PATCH", path, "{\"name\":\"x\"}", NULL, &r),
                     400);
    sh_check_error(r.body, "unknown_parameter");
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "PATCH", "/v1/conversations/conv_nope",
                            "{\"title\":\"x\"}", NULL, &r),
                     404);
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "POST", "/v1/runs",
                            "{\"input\":\"x\",\"title\":1}", NULL, &r),
                     400);
    sh_resp_free(&r);
    json_decref(run);
    sh_free(&h);
}

/* ---- metrics ------------------------------------------------------------- */

static void test_metrics(void **state)
{
    sh h;
    sh_resp r;
    json_t *run;
    char path[128];

    (void)state;
    sh_start(&h,
             "{\"responses\":[{\"tool_calls\":[{\"id\":\"c1\",\"name\":"
             "\"get_time\",\"arguments\":\"{}\"}]," USAGE "}," HELLO ","
             "{\"status\":500,\"error\":{\"message\":\"boom\"}}]}",
             NULL, NULL);
    run = sh_json(&h, "POST", "/v1/runs", "{\"input\":\"x\"}", 200);
    snprintf(path, sizeof(path), "/v1/runs/%s", sh_str(run, "id"));
    json_decref(sh_json(&h, "GET", path, NULL, 200));
    json_decref(run);
    run = sh_json(&h, "POST", "/v1/runs", "{\"input\":\"x\"}", 200);
    assert_string_equal(sh_str(run, "status"), "failed");
    json_decref(run);
    assert_int_equal(sh_req(&h, "GET", "/metrics", NULL, NULL, &r), 200);
#define HAS(s)                                                               \
    do {                                                                     \
        if (!strstr(r.body, s))                                              \
            fail_msg("metrics lack: %s\n%s", s, r.body);                     \
    } while (0)
    HAS("# TYPE loom_http_requests_total counter\n");
    HAS("loom_http_requests_total{method=\"POST\",route=\"/v1/runs\","
        "status=\"200\"} 2\n");
    HAS("loom_http_requests_total{method=\"GET\",route=\"/v1/runs/{id}\","
        "status=\"200\"} 1\n");
    HAS("loom_runs_total{status=\"completed\"} 1\n");
    HAS("loom_runs_total{status=\"failed\"} 1\n");
    HAS("loom_run_duration_seconds_count{status=\"completed\"} 1\n");
    HAS("loom_run_duration_seconds_bucket{status=\"completed\",le=\"+Inf\"} "
        "1\n");
    HAS("loom_upstream_requests_total{provider=\"fake\"} 3\n");
    HAS("loom_upstream_duration_seconds_count{provider=\"fake\"} 3\n");
    HAS("loom_upstream_errors_total{provider=\"fake\",kind=\"server\"} 1\n");
    HAS("loom_tool_calls_total{tool=\"get_time\",outcome=\"completed\"} 1\n");
    HAS("loom_tokens_total{model=\"fake/m\",kind=\"prompt\"} 20\n");
    HAS("loom_tokens_total{model=\"fake/m\",kind=\"completion\"} 4\n");
    HAS("# TYPE loom_runs_active gauge\nloom_runs_active 0\n");
    HAS("loom_streams_active 0\n");
    HAS("# TYPE loom_store_wal_pages gauge\n");
    HAS("# TYPE loom_store_wal_restarts_total counter\n");
#undef HAS
    /* Both runs' turns went through the store's group commit, each in a
     * commit (the conversations were made in commits of their own), and
     * the WAL holds them. */
    assert_true(sh_metric(&h, "loom_store_batched_writes_total", -1) >= 2);
    assert_true(sh_metric(&h, "loom_store_batches_total", -1) >= 1);
    assert_true(sh_metric(&h, "loom_store_commits_total", -1) >=
                sh_metric(&h, "loom_store_batched_writes_total", -1));
    assert_true(sh_metric(&h, "loom_store_wal_pages", -1) > 0);
    assert_true(sh_metric(&h, "loom_store_wal_restarts_total", -1) == 0);
    /* Route labels are templates, never ids. */
    assert_null(strstr(r.body, "route=\"/v1/runs/run_"));
    sh_resp_free(&r);
    sh_free(&h);
}

/* ---- graceful stop ------------------------------------------------------- */

/* Set once stop_thread's graceful stop has returned. */
static atomic_int stop_returned;

static void *stop_thread(void *arg)
{
    sh_stop_server(arg);
    atomic_store(&stop_returned, 1);
    return NULL;
}

static void test_stop_lets_runs_finish(void **state)
{
    sh h;
    sh_resp r;
    json_t *run, *conv = NULL, *last;
    pthread_t th;
    long long end;

    (void)state;
    sh_start(&h, LOOP("{\"delay_ms\":1500,\"text\":[\"done\"]}"), NULL,
             "  shutdown_grace_ms: 20000\n");
    run = sh_json(&h, "POST", "/v1/runs",
                  "{\"input\":\"x\",\"background\":true}", 202);
    while (fake_request_count(h.fake) < 1)
        usleep(10 * 1000);
    atomic_store(&stop_returned, 0);
    assert_int_equal(pthread_create(&th, NULL, stop_thread, &h), 0);
    /* Stopping: no new connections, while the run is still being waited
     * for (the stop has not returned). Waits up to 10 s for the refusal. */
    end = test_now_ms() + 10000;
    while (sh_req(&h, "GET", "/healthz", NULL, NULL, &r) != 0 &&
           test_now_ms() < end) {
        sh_resp_free(&r);
        usleep(10 * 1000);
    }
    assert_int_equal(r.status, 0);
    assert_int_equal(atomic_load(&stop_returned), 0);
    sh_resp_free(&r);
    pthread_join(th, NULL);
    assert_int_equal(loom_store_conversation_get(
                         h.store, sh_str(run, "conversation_id"), &conv),
                     0);
    last = sh_last_message(conv);
    assert_string_equal(sh_str(last, "content"), "done");
    assert_string_equal(sh_str(last, "status"), "ok");
    json_decref(conv);
    json_decref(run);
    sh_free(&h);
}

static void test_stop_cancels_after_grace(void **state)
{
    static const char *const args[] = {"--max-requests", "1", NULL};
    sh h;
    json_t *run, *conv = NULL, *last;

    (void)state;
    sh_start(&h, LOOP(HANG), args, "  shutdown_grace_ms: 300\n");
    run = sh_json(&h, "POST", "/v1/runs",
                  "{\"input\":\"x\",\"background\":true}", 202);
    while (fake_request_count(h.fake) < 1)
        usleep(10 * 1000);
    sh_stop_server(&h);
    /* The upstream request was aborted... */
    assert_int_equal(fake_wait_exit(h.fake, 20000), 0);
    /* ...and the partial turn stored as cancelled. */
    assert_int_equal(loom_store_conversation_get(
                         h.store, sh_str(run, "conversation_id"), &conv),
                     0);
    last = sh_last_message(conv);
    assert_string_equal(sh_str(last, "role"), "assistant");
    assert_string_equal(sh_str(last, "content"), "Partial answer");
    assert_string_equal(sh_str(last, "status"), "cancelled");
    json_decref(conv);
    json_decref(run);
    sh_free(&h);
}

/* A stream open during the stop ends with its run's last event. */
static void test_stop_ends_streams(void **state)
{
    sh h;
    sh_abort_ctx a;
    json_t *evs;
    CURL *e;
    pthread_t th;

    (void)state;
    sh_start(&h, LOOP(HANG), NULL, "  shutdown_grace_ms: 200\n");
    memset(&a, 0, sizeof(a));
    a.until = "\"type\":\"never\"";
    e = sh_easy(&h, "POST", "/v1/runs", "{\"input\":\"x\",\"stream\":true}",
                NULL, &a.r);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sh_abort_on);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &a);
    assert_int_equal(pthread_create(&th, NULL, stop_thread, &h), 0);
    /* The stop may come before or after the run starts; either way the
     * client sees a clean end (a refused connection or a full stream). */
    if (curl_easy_perform(e) == CURLE_OK &&
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &a.r.status) ==
            CURLE_OK &&
        a.r.status == 200) {
        evs = sh_sse_parse(a.r.body, NULL);
        assert_string_equal(sh_ev_type(evs, json_array_size(evs) - 1),
                            "run.failed");
        json_decref(evs);
    }
    curl_easy_cleanup(e);
    pthread_join(th, NULL);
    sh_resp_free(&a.r);
    sh_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_health_models_tools),
        cmocka_unit_test(test_405_allow),
        cmocka_unit_test(test_run_blocking),
        cmocka_unit_test(test_threads_without_fibers),
        cmocka_unit_test(test_deep_upstream_json),
        cmocka_unit_test(test_run_stream),
        cmocka_unit_test(test_run_stream_http10),
        cmocka_unit_test(test_run_input_and_conversation),
        cmocka_unit_test(test_run_bad_requests),
        cmocka_unit_test(test_bad_json_offsets),
        cmocka_unit_test(test_background_and_cancel),
        cmocka_unit_test(test_events_resume),
        cmocka_unit_test(test_disconnect_cancels),
        cmocka_unit_test(test_disconnect_blocking_cancels),
        cmocka_unit_test(test_body_limit),
        cmocka_unit_test(test_header_limit),
        cmocka_unit_test(test_connection_memory),
        cmocka_unit_test(test_busy_503),
        cmocka_unit_test(test_read_timeout),
        cmocka_unit_test(test_max_connections),
        cmocka_unit_test(test_keepalive_comments),
        cmocka_unit_test(test_keep_finished_runs),
        cmocka_unit_test(test_event_log_limit),
        cmocka_unit_test(test_conversations),
        cmocka_unit_test(test_conversation_titles),
        cmocka_unit_test(test_metrics),
        cmocka_unit_test(test_stop_lets_runs_finish),
        cmocka_unit_test(test_stop_cancels_after_grace),
        cmocka_unit_test(test_stop_ends_streams),
        cmocka_unit_test(test_nested_events),
    };
    int rc;

    curl_global_init(CURL_GLOBAL_DEFAULT);
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
