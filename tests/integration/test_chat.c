/*
 * POST /v1/chat/completions end to end: loom's server in-process
 * (loom/server.h) with a temporary SQLite store, the fake upstream as the
 * model, and libcurl as the client. Each test scripts the model, sends
 * OpenAI-shaped requests, and asserts on the HTTP answer (status, headers,
 * the chunk stream event by event or the chat.completion object) and on
 * what loom sent upstream (the fake's recorded requests).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fake.h"
#include "loom/server.h"
#include "loom/store.h"
#include "loom/tools.h"
#include "testutil.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define MODEL "fake/fake-model"

/* ---- the server under test -------------------------------------------- */

static int echo_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    (void)ctx;
    (void)payload;
    return loom_buf_printf(out, "echo:%s",
                           json_string_value(json_object_get(args, "text")));
}

typedef struct {
    loom_fake *fake;
    loom_config *cfg;
    loom_store *store;
    loom_tool_registry *reg;
    json_t *echo_schema;
    loom_server *srv;
    char *db;
    int port;
} harness;

static harness H;
/* The provider's timeouts for the next start(); NULL: the usual ones. */
static const char *H_timeouts;

static void start(const char *script)
{
    static int n;
    char *yaml = NULL, name[64];
    loom_server_options so = LOOM_SERVER_OPTIONS_INIT;
    loom_tool t;

    memset(&H, 0, sizeof(H));
    H.fake = fake_start_script(script);
    assert_non_null(H.fake);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake:\n"
                         "    kind: openai\n"
                         "    base_url: %s\n"
                         "    api_key: sk-test\n"
                         "    timeouts: %s\n"
                         "    retries: {max: 0}\n"
                         "models:\n"
                         "  " MODEL ":\n"
                         "    upstream: fake-model\n"
                         "agents:\n"
                         "  helper:\n"
                         "    model: " MODEL "\n"
                         "    system_prompt: You are the helper.\n"
                         "    tools: [echo]\n",
                         fake_base_url(H.fake),
                         H_timeouts ? H_timeouts
                                    : "{connect_ms: 5000, first_byte_ms: "
                                      "20000, idle_ms: 20000}") > 0);
    assert_int_equal(loom_config_load_string(&H.cfg, yaml, "test.yaml"), 0);
    free(yaml);
    snprintf(name, sizeof(name), "chat-%d.db", ++n);
    H.db = test_tmp_path(name);
    unlink(H.db);
    assert_int_equal(loom_store_open(&H.store, H.db), 0);

    assert_int_equal(loom_tool_registry_new(&H.reg), 0);
    H.echo_schema = json_pack("{s:s,s:{s:{s:s}},s:[s]}", "type", "object",
                              "properties", "text", "type", "string",
                              "required", "text");
    memset(&t, 0, sizeof(t));
    t.name = "echo";
    t.description = "Echoes text back.";
    t.parameters = H.echo_schema;
    t.execute = echo_exec;
    assert_int_equal(loom_tool_registry_add(H.reg, &t), 0);
    assert_int_equal(loom_tools_add_builtins(H.reg), 0);

    so.config = H.cfg;
    so.store = H.store;
    so.tools = H.reg;
    so.listen = "127.0.0.1:0";
    assert_int_equal(loom_server_new(&H.srv, &so), 0);
    assert_int_equal(loom_server_start(H.srv), 0);
    H.port = loom_server_port(H.srv);
    assert_true(H.port > 0);
}

static void stop(void)
{
    char *p = NULL;

    loom_server_free(H.srv);
    loom_store_free(H.store);
    loom_tool_registry_free(H.reg);
    json_decref(H.echo_schema);
    loom_config_free(H.cfg);
    assert_int_equal(fake_stop_check(H.fake), 0);
    unlink(H.db);
    assert_true(asprintf(&p, "%s-wal", H.db) > 0);
    unlink(p);
    free(p);
    assert_true(asprintf(&p, "%s-shm", H.db) > 0);
    unlink(p);
    free(p);
    free(H.db);
    memset(&H, 0, sizeof(H));
}

/* ---- the client ------------------------------------------------------- */

typedef struct {
    long status;
    loom_buf body;
    char ctype[128];
    char conv[160];
    int conv_headers; /* X-Loom-Conversation-Id headers seen */
    /* Rate-limit headers passed on from the upstream, and one that is
     * not to be ("" when absent). */
    char retry_after[32], retry_after_ms[32], remaining[32], cookie[32];
} reply;

static size_t on_body(char *p, size_t sz, size_t n, void *ud)
{
    reply *r = ud;
    return loom_buf_put(&r->body, p, sz * n) == 0 ? sz * n : 0;
}

/* Copies a header's value (trimmed) when its name matches. */
static int header_value(const char *line, size_t len, const char *name,
                        char *out, size_t size)
{
    size_t nl = strlen(name), v, e = len;

    if (len <= nl || strncasecmp(line, name, nl) != 0 || line[nl] != ':')
        return 0;
    for (v = nl + 1; v < len && line[v] == ' '; v++)
        ;
    while (e > v && (line[e - 1] == '\r' || line[e - 1] == '\n'))
        e--;
    snprintf(out, size, "%.*s", (int)(e - v), line + v);
    return 1;
}

static size_t on_header(char *p, size_t sz, size_t n, void *ud)
{
    reply *r = ud;

    if (header_value(p, sz * n, "X-Loom-Conversation-Id", r->conv,
                     sizeof(r->conv)))
        r->conv_headers++;
    header_value(p, sz * n, "Content-Type", r->ctype, sizeof(r->ctype));
    header_value(p, sz * n, "Retry-After", r->retry_after,
                 sizeof(r->retry_after));
    header_value(p, sz * n, "retry-after-ms", r->retry_after_ms,
                 sizeof(r->retry_after_ms));
    header_value(p, sz * n, "x-ratelimit-remaining-requests", r->remaining,
                 sizeof(r->remaining));
    header_value(p, sz * n, "Set-Cookie", r->cookie, sizeof(r->cookie));
    return sz * n;
}

/* POSTs body to /v1/chat/completions; header may be NULL. */
static void post(reply *r, const char *body, const char *header)
{
    CURL *c = curl_easy_init();
    struct curl_slist *h = NULL;
    char url[96];

    memset(r, 0, sizeof(*r));
    loom_buf_init(&r->body, 16u << 20);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1/chat/completions",
             H.port);
    h = curl_slist_append(h, "Content-Type: application/json");
    if (header)
        h = curl_slist_append(h, header);
    assert_non_null(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
    assert_int_equal(curl_easy_perform(c), CURLE_OK);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
}

static void reply_free(reply *r)
{
    loom_buf_free(&r->body);
}

static json_t *reply_json(const reply *r)
{
    json_t *j = json_loads(loom_buf_cstr(&r->body), 0, NULL);

    if (!j)
        fail_msg("not JSON: %s", loom_buf_cstr(&r->body));
    assert_non_null(strstr(r->ctype, "application/json"));
    return j;
}

/* Checks an OpenAI error reply and returns its error object (borrowed
 * from *holder, which the caller frees). */
static json_t *expect_error(const reply *r, long status, const char *type,
                            json_t **holder)
{
    json_t *e;

    if (r->status != status)
        fail_msg("status %ld, want %ld: %s", r->status, status,
                 loom_buf_cstr(&r->body));
    *holder = reply_json(r);
    e = json_object_get(*holder, "error");
    assert_true(json_is_object(e));
    assert_int_equal(json_object_size(e), 4);
    assert_true(json_is_string(json_object_get(e, "message")));
    assert_true(json_object_get(e, "param") != NULL);
    assert_true(json_object_get(e, "code") != NULL);
    assert_string_equal(json_string_value(json_object_get(e, "type")), type);
    return e;
}

/*
 * Splits an SSE body into its data payloads, checking the framing as
 * OpenAI's: every event is exactly "data: <payload>\n\n" (comments, ":
 * ...", are allowed and skipped). Returns an array of chunks (parsed
 * JSON); *done is 1 when the stream ended with "data: [DONE]" as its
 * last event.
 */
static json_t *sse_chunks(const reply *r, int *done)
{
    const char *p = loom_buf_cstr(&r->body), *end = p + r->body.len;
    json_t *arr = json_array();

    assert_non_null(strstr(r->ctype, "text/event-stream"));
    *done = 0;
    while (p < end) {
        const char *nl = strstr(p, "\n\n");
        json_t *j;
        if (!nl)
            fail_msg("unterminated event: %s", p);
        assert_false(*done); /* nothing after [DONE] */
        if (*p == ':') {
            p = nl + 2;
            continue;
        }
        if (strncmp(p, "data: ", 6) != 0)
            fail_msg("not a data line: %.*s", (int)(nl - p), p);
        assert_null(memchr(p, '\n', (size_t)(nl - p)));
        if (nl - p == 12 && strncmp(p + 6, "[DONE]", 6) == 0) {
            *done = 1;
        } else {
            j = json_loadb(p + 6, (size_t)(nl - p - 6), 0, NULL);
            if (!j)
                fail_msg("bad JSON: %.*s", (int)(nl - p), p);
            json_array_append_new(arr, j);
        }
        p = nl + 2;
    }
    return arr;
}

static json_t *delta_of(const json_t *chunk)
{
    return json_object_get(
        json_array_get(json_object_get(chunk, "choices"), 0), "delta");
}

static const char *finish_of(const json_t *chunk)
{
    return json_string_value(json_object_get(
        json_array_get(json_object_get(chunk, "choices"), 0),
        "finish_reason"));
}

/* Every chunk: same id "chatcmpl-...", the chunk object, the model asked
 * for, created; choices[0].index 0 when there is a choice. */
static void check_chunk_envelope(json_t *chunks, const char *model)
{
    const char *id = json_string_value(
        json_object_get(json_array_get(chunks, 0), "id"));
    json_t *c;
    size_t i;

    assert_non_null(id);
    assert_int_equal(strncmp(id, "chatcmpl-", 9), 0);
    json_array_foreach(chunks, i, c)
    {
        json_t *ch = json_object_get(c, "choices");
        assert_null(json_object_get(c, "error"));
        assert_string_equal(json_string_value(json_object_get(c, "id")), id);
        assert_string_equal(json_string_value(json_object_get(c, "object")),
                            "chat.completion.chunk");
        assert_string_equal(json_string_value(json_object_get(c, "model")),
                            model);
        assert_true(json_integer_value(json_object_get(c, "created")) >
                    1600000000);
        assert_true(json_is_array(ch));
        if (json_array_size(ch))
            assert_int_equal(json_integer_value(json_object_get(
                                 json_array_get(ch, 0), "index")),
                             0);
    }
}

/* The role chunk: first, carrying the conversation id of the header. */
static void check_first_chunk(json_t *chunks, const reply *r)
{
    json_t *first = json_array_get(chunks, 0);

    assert_int_equal(json_object_size(delta_of(first)), 2);
    assert_string_equal(
        json_string_value(json_object_get(delta_of(first), "role")),
        "assistant");
    assert_string_equal(
        json_string_value(json_object_get(delta_of(first), "content")), "");
    assert_int_equal(r->conv_headers, 1);
    assert_int_equal(strncmp(r->conv, "conv_", 5), 0);
    assert_string_equal(
        json_string_value(json_object_get(first, "conversation_id")),
        r->conv);
}

/* The text of all content deltas. */
static char *content_of(json_t *chunks)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    json_t *c;
    size_t i;

    loom_buf_puts(&b, "");
    json_array_foreach(chunks, i, c)
    {
        const char *s =
            json_string_value(json_object_get(delta_of(c), "content"));
        if (s)
            loom_buf_puts(&b, s);
    }
    return loom_buf_detach(&b);
}

/* Request i the fake recorded: its body (a new reference). */
static json_t *upstream_body(size_t i)
{
    json_t *req = fake_request(H.fake, i), *body;

    assert_non_null(req);
    body = json_incref(json_object_get(req, "body"));
    json_decref(req);
    assert_non_null(body);
    return body;
}

/* "role:content|role:content|..." of an upstream request's messages. */
static char *upstream_messages(size_t i)
{
    json_t *body = upstream_body(i), *m;
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    size_t k;

    loom_buf_puts(&b, "");
    json_array_foreach(json_object_get(body, "messages"), k, m)
    {
        const char *c = json_string_value(json_object_get(m, "content"));
        loom_buf_printf(&b, "%s%s:%s", k ? "|" : "",
                        json_string_value(json_object_get(m, "role")),
                        c ? c : "null");
    }
    json_decref(body);
    return loom_buf_detach(&b);
}

/* "a,b" of the tool names an upstream request offered. */
static char *upstream_tools(size_t i)
{
    json_t *body = upstream_body(i), *t;
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    size_t k;

    loom_buf_puts(&b, "");
    json_array_foreach(json_object_get(body, "tools"), k, t)
        loom_buf_printf(&b, "%s%s", k ? "," : "",
                        json_string_value(json_object_get(
                            json_object_get(t, "function"), "name")));
    json_decref(body);
    return loom_buf_detach(&b);
}

static void expect_upstream_messages(size_t i, const char *want)
{
    char *got = upstream_messages(i);
    assert_string_equal(got, want);
    free(got);
}

static void expect_upstream_tools(size_t i, const char *want)
{
    char *got = upstream_tools(i);
    assert_string_equal(got, want);
    free(got);
}

/* ---- tests ------------------------------------------------------------ */

static void test_stream_text_and_usage(void **state)
{
    reply r;
    json_t *chunks, *last, *usage;
    char *text;
    int done;
    (void)state;

    start("{\"loop\":true,\"responses\":[{\"text\":[\"Hel\",\"lo\",\" you\"],"
          "\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3,"
          "\"total_tokens\":15,\"prompt_tokens_details\":"
          "{\"cached_tokens\":5}}}]}");

    /* Without include_usage: no usage chunk. */
    post(&r,
         "{\"model\":\"" MODEL "\",\"stream\":true,\"messages\":[{\"role\":"
         "\"user\",\"content\":\"hi\"}]}",
         NULL);
    assert_int_equal(r.status, 200);
    chunks = sse_chunks(&r, &done);
    assert_true(done);
    check_chunk_envelope(chunks, MODEL);
    check_first_chunk(chunks, &r);
    text = content_of(chunks);
    assert_string_equal(text, "Hello you");
    free(text);
    last = json_array_get(chunks, json_array_size(chunks) - 1);
    assert_string_equal(finish_of(last), "stop");
    assert_int_equal(json_object_size(delta_of(last)), 0);
    for (size_t i = 0; i < json_array_size(chunks); i++)
        assert_null(json_object_get(json_array_get(chunks, i), "usage"));
    /* role chunk + 3 deltas + finish. */
    assert_int_equal(json_array_size(chunks), 5);
    json_decref(chunks);
    reply_free(&r);
    /* A plain model: the request's messages only, no system prompt, no
     * tools; streamed upstream. */
    expect_upstream_messages(0, "user:hi");
    {
        json_t *b = upstream_body(0);
        assert_null(json_object_get(b, "tools"));
        assert_string_equal(json_string_value(json_object_get(b, "model")),
                            "fake-model");
        json_decref(b);
    }

    /* With include_usage: the usage chunk, choices [], before [DONE]. */
    post(&r,
         "{\"model\":\"" MODEL "\",\"stream\":true,\"stream_options\":"
         "{\"include_usage\":true},\"messages\":[{\"role\":\"user\","
         "\"content\":\"hi\"}]}",
         NULL);
    assert_int_equal(r.status, 200);
    chunks = sse_chunks(&r, &done);
    assert_true(done);
    check_chunk_envelope(chunks, MODEL);
    check_first_chunk(chunks, &r);
    last = json_array_get(chunks, json_array_size(chunks) - 1);
    assert_int_equal(json_array_size(json_object_get(last, "choices")), 0);
    usage = json_object_get(last, "usage");
    assert_int_equal(json_integer_value(json_object_get(usage,
                                                        "prompt_tokens")),
                     12);
    assert_int_equal(
        json_integer_value(json_object_get(usage, "completion_tokens")), 3);
    assert_int_equal(json_integer_value(json_object_get(usage,
                                                        "total_tokens")),
                     15);
    assert_int_equal(
        json_integer_value(json_object_get(
            json_object_get(usage, "prompt_tokens_details"),
            "cached_tokens")),
        5);
    assert_string_equal(
        finish_of(json_array_get(chunks, json_array_size(chunks) - 2)),
        "stop");
    json_decref(chunks);
    reply_free(&r);
    stop();
}

#define TOOL_SCRIPT                                                          \
    "{\"responses\":["                                                       \
    "{\"text\":[\"Let me echo.\"],\"tool_calls\":[{\"id\":\"call_1\","     \
    "\"name\":\"echo\",\"arguments\":[\"{\\\"text\\\":\",\"\\\"hi\\\"}\"]}]," \
    "\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":2,"             \
    "\"total_tokens\":12}},"                                                 \
    "{\"text\":[\"Done: \",\"echo:hi\"],\"usage\":{\"prompt_tokens\":20,"  \
    "\"completion_tokens\":3,\"total_tokens\":23,"                          \
    "\"completion_tokens_details\":{\"reasoning_tokens\":1}}}]}"

static void test_stream_server_tool(void **state)
{
    reply r;
    json_t *chunks, *c, *calls, *out, *last;
    int done, at_calls = -1, at_output = -1, at_text = -1;
    size_t i;
    (void)state;

    start(TOOL_SCRIPT);
    /* The seed-compatible shape, loom's own calls in tool_calls too
     * (test_chat_output.c checks the default, loom_tool_calls). */
    post(&r,
         "{\"model\":\"" MODEL "\",\"stream\":true,\"stream_options\":"
         "{\"include_usage\":true},\"tools\":[\"echo\"],\"messages\":"
         "[{\"role\":\"user\",\"content\":\"echo hi\"}]}",
         "X-Loom-Server-Tool-Calls: inline");
    assert_int_equal(r.status, 200);
    chunks = sse_chunks(&r, &done);
    assert_true(done);
    check_chunk_envelope(chunks, MODEL);
    check_first_chunk(chunks, &r);
    json_array_foreach(chunks, i, c)
    {
        json_t *d = delta_of(c);
        if (json_object_get(d, "tool_calls")) {
            /* Exactly one consolidated tool_calls delta. */
            assert_int_equal(at_calls, -1);
            at_calls = (int)i;
        }
        if (json_object_get(d, "tool_output"))
            at_output = (int)i;
        if (json_is_string(json_object_get(d, "content")) &&
            strcmp(json_string_value(json_object_get(d, "content")),
                   "Done: ") == 0)
            at_text = (int)i;
    }
    assert_true(at_calls > 0 && at_output > at_calls && at_text > at_output);
    calls = json_object_get(delta_of(json_array_get(chunks, at_calls)),
                            "tool_calls");
    assert_int_equal(json_array_size(calls), 1);
    c = json_array_get(calls, 0);
    assert_int_equal(json_integer_value(json_object_get(c, "index")), 0);
    assert_string_equal(json_string_value(json_object_get(c, "id")),
                        "call_1");
    assert_string_equal(json_string_value(json_object_get(c, "type")),
                        "function");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(c, "function"),
                                          "name")),
        "echo");
    /* The arguments whole, not fragments. */
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(c, "function"),
                                          "arguments")),
        "{\"text\":\"hi\"}");
    out = json_object_get(delta_of(json_array_get(chunks, at_output)),
                          "tool_output");
    assert_string_equal(
        json_string_value(json_object_get(out, "tool_call_id")), "call_1");
    assert_string_equal(json_string_value(json_object_get(out, "name")),
                        "echo");
    assert_string_equal(json_string_value(json_object_get(out, "output")),
                        "echo:hi");
    {
        char *text = content_of(chunks);
        assert_string_equal(text, "Let me echo.Done: echo:hi");
        free(text);
    }
    /* The loop answered its own call: finish "stop"; usage sums both
     * model calls. */
    assert_string_equal(
        finish_of(json_array_get(chunks, json_array_size(chunks) - 2)),
        "stop");
    last = json_array_get(chunks, json_array_size(chunks) - 1);
    {
        /* With loom's extension fields; no prices: cost unknown. */
        json_t *want = json_pack(
            "{s:i,s:i,s:i,s:{s:i},s:i,s:i,s:i,s:n}", "prompt_tokens", 30,
            "completion_tokens", 5, "total_tokens", 35,
            "completion_tokens_details", "reasoning_tokens", 1, "cached_tokens",
            0, "reasoning_tokens", 1, "cache_write_tokens", 0, "cost_micros");
        assert_true(json_equal(json_object_get(last, "usage"), want));
        json_decref(want);
    }
    json_decref(chunks);
    reply_free(&r);

    /* Upstream: the name was expanded into a full spec; the second call
     * carries the tool's result. */
    {
        json_t *b = upstream_body(0);
        json_t *t = json_array_get(json_object_get(b, "tools"), 0);
        json_t *fn = json_object_get(t, "function");
        assert_string_equal(json_string_value(json_object_get(t, "type")),
                            "function");
        assert_string_equal(json_string_value(json_object_get(fn, "name")),
                            "echo");
        assert_string_equal(
            json_string_value(json_object_get(fn, "description")),
            "Echoes text back.");
        assert_true(json_equal(json_object_get(fn, "parameters"),
                               H.echo_schema));
        json_decref(b);
    }
    expect_upstream_tools(0, "echo");
    expect_upstream_messages(1, "user:echo hi|assistant:Let me echo.|"
                                "tool:echo:hi");
    stop();
}

static void test_nonstream_tool_events(void **state)
{
    reply r;
    json_t *o, *ev, *msg, *u, *v;
    (void)state;

    start(TOOL_SCRIPT);
    post(&r,
         "{\"model\":\"" MODEL "\",\"tools\":[\"echo\"],\"messages\":"
         "[{\"role\":\"user\",\"content\":\"echo hi\"}]}",
         NULL);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.conv_headers, 1);
    o = reply_json(&r);
    assert_string_equal(json_string_value(json_object_get(o, "object")),
                        "chat.completion");
    assert_int_equal(
        strncmp(json_string_value(json_object_get(o, "id")), "chatcmpl-", 9),
        0);
    assert_string_equal(json_string_value(json_object_get(o, "model")),
                        MODEL);
    assert_string_equal(
        json_string_value(json_object_get(o, "conversation_id")), r.conv);
    msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0),
                          "message");
    assert_string_equal(json_string_value(json_object_get(msg, "role")),
                        "assistant");
    assert_string_equal(json_string_value(json_object_get(msg, "content")),
                        "Done: echo:hi");
    assert_null(json_object_get(msg, "tool_calls"));
    assert_string_equal(
        json_string_value(json_object_get(
            json_array_get(json_object_get(o, "choices"), 0),
            "finish_reason")),
        "stop");
    u = json_object_get(o, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")),
                     30);
    assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")),
                     35);
    /* text, tool_call, tool_output, text: the whole loop in order. */
    ev = json_object_get(o, "tool_events");
    assert_int_equal(json_array_size(ev), 4);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(ev, 0), "type")),
                        "text");
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(ev, 0), "value")),
                        "Let me echo.");
    v = json_object_get(json_array_get(ev, 1), "value");
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(ev, 1), "type")),
                        "tool_call");
    assert_string_equal(json_string_value(json_object_get(v, "id")),
                        "call_1");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(v, "function"),
                                          "arguments")),
        "{\"text\":\"hi\"}");
    v = json_object_get(json_array_get(ev, 2), "value");
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(ev, 2), "type")),
                        "tool_output");
    assert_string_equal(json_string_value(json_object_get(v, "output")),
                        "echo:hi");
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(ev, 3), "value")),
                        "Done: echo:hi");
    json_decref(o);
    reply_free(&r);
    stop();
}

static void test_client_tools(void **state)
{
    reply r;
    json_t *o, *msg, *call, *chunks, *c;
    int done, seen = 0;
    size_t i;
    (void)state;

    start("{\"responses\":["
          "{\"tool_calls\":[{\"id\":\"call_w\",\"name\":\"get_weather\","
          "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}]},"
          "{\"text\":[\"Sunny in Paris.\"]},"
          "{\"tool_calls\":[{\"id\":\"call_s\",\"name\":\"get_weather\","
          "\"arguments\":\"{}\"}]}]}");
#define WEATHER_TOOL                                                         \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","        \
    "\"description\":\"Weather of a city.\",\"parameters\":{\"type\":"      \
    "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}"
    post(&r,
         "{\"model\":\"" MODEL "\",\"tools\":[" WEATHER_TOOL "],"
         "\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"}]}",
         NULL);
    assert_int_equal(r.status, 200);
    o = reply_json(&r);
    /* loom did not run it: the call goes back to the client. */
    assert_string_equal(
        json_string_value(json_object_get(
            json_array_get(json_object_get(o, "choices"), 0),
            "finish_reason")),
        "tool_calls");
    msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0),
                          "message");
    assert_true(json_is_null(json_object_get(msg, "content")));
    assert_int_equal(json_array_size(json_object_get(msg, "tool_calls")), 1);
    call = json_array_get(json_object_get(msg, "tool_calls"), 0);
    assert_string_equal(json_string_value(json_object_get(call, "id")),
                        "call_w");
    assert_string_equal(json_string_value(json_object_get(call, "type")),
                        "function");
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(call, "function"),
                                          "arguments")),
        "{\"city\":\"Paris\"}");
    json_decref(o);
    reply_free(&r);
    /* Upstream saw the client's spec as given. */
    {
        json_t *b = upstream_body(0);
        json_t *fn = json_object_get(
            json_array_get(json_object_get(b, "tools"), 0), "function");
        assert_string_equal(
            json_string_value(json_object_get(fn, "description")),
            "Weather of a city.");
        assert_non_null(json_object_get(
            json_object_get(json_object_get(fn, "parameters"), "properties"),
            "city"));
        json_decref(b);
    }

    /* The follow-up with the result is plain history. */
    post(&r,
         "{\"model\":\"" MODEL "\",\"tools\":[" WEATHER_TOOL "],"
         "\"messages\":[{\"role\":\"user\",\"content\":\"weather?\"},"
         "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":"
         "\"call_w\",\"type\":\"function\",\"function\":{\"name\":"
         "\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
         "{\"role\":\"tool\",\"tool_call_id\":\"call_w\",\"content\":"
         "\"sunny, 24C\"}]}",
         NULL);
    assert_int_equal(r.status, 200);
    o = reply_json(&r);
    msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0),
                          "message");
    assert_string_equal(json_string_value(json_object_get(msg, "content")),
                        "Sunny in Paris.");
    json_decref(o);
    reply_free(&r);
    expect_upstream_messages(1, "user:weather?|assistant:null|"
                                "tool:sunny, 24C");
    {
        json_t *b = upstream_body(1);
        json_t *m1 = json_array_get(json_object_get(b, "messages"), 1);
        json_t *m2 = json_array_get(json_object_get(b, "messages"), 2);
        assert_string_equal(
            json_string_value(json_object_get(
                json_array_get(json_object_get(m1, "tool_calls"), 0), "id")),
            "call_w");
        assert_string_equal(
            json_string_value(json_object_get(m2, "tool_call_id")),
            "call_w");
        json_decref(b);
    }

    /* Streamed: the call as a tool_calls delta, finish "tool_calls". */
    post(&r,
         "{\"model\":\"" MODEL "\",\"stream\":true,\"tools\":[" WEATHER_TOOL
         "],\"messages\":[{\"role\":\"user\",\"content\":\"and here?\"}]}",
         NULL);
    assert_int_equal(r.status, 200);
    chunks = sse_chunks(&r, &done);
    assert_true(done);
    check_chunk_envelope(chunks, MODEL);
    json_array_foreach(chunks, i, c)
    {
        json_t *tc = json_object_get(delta_of(c), "tool_calls");
        assert_null(json_object_get(delta_of(c), "tool_output"));
        if (tc) {
            seen++;
            assert_string_equal(
                json_string_value(json_object_get(json_array_get(tc, 0),
                                                  "id")),
                "call_s");
        }
    }
    assert_int_equal(seen, 1);
    assert_string_equal(
        finish_of(json_array_get(chunks, json_array_size(chunks) - 1)),
        "tool_calls");
    json_decref(chunks);
    reply_free(&r);
    stop();
}

static void test_request_errors(void **state)
{
    reply r;
    json_t *o, *e;
    (void)state;

    start("{\"loop\":true,\"responses\":[{\"text\":[\"ok\"]}]}");

    /* An unknown tool name: 400 listing what exists. */
    post(&r,
         "{\"model\":\"" MODEL "\",\"tools\":[\"echo\",\"web_serch\"],"
         "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         NULL);
    e = expect_error(&r, 400, "invalid_request_error", &o);
    assert_string_equal(json_string_value(json_object_get(e, "param")),
                        "tools[1]");
    assert_non_null(strstr(json_string_value(json_object_get(e, "message")),
                           "web_serch"));
    assert_non_null(strstr(json_string_value(json_object_get(e, "message")),
                           "Available tools: echo, get_time"));
    assert_int_equal(r.conv_headers, 0);
    json_decref(o);
    reply_free(&r);

    /* Unknown models: 404 in OpenAI's shape. */
    post(&r,
         "{\"model\":\"nope/gpt\",\"messages\":[{\"role\":\"user\","
         "\"content\":\"x\"}]}",
         NULL);
    e = expect_error(&r, 404, "invalid_request_error", &o);
    assert_string_equal(json_string_value(json_object_get(e, "code")),
                        "model_not_found");
    assert_non_null(strstr(json_string_value(json_object_get(e, "message")),
                           "nope/gpt"));
    json_decref(o);
    reply_free(&r);
    post(&r,
         "{\"model\":\"agent/nobody\",\"stream\":true,\"messages\":[{\"role\":"
         "\"user\",\"content\":\"x\"}]}",
         NULL);
    e = expect_error(&r, 404, "invalid_request_error", &o);
    assert_string_equal(json_string_value(json_object_get(e, "code")),
                        "model_not_found");
    assert_non_null(strstr(json_string_value(json_object_get(e, "message")),
                           "agent/helper"));
    json_decref(o);
    reply_free(&r);

    /* Wrong types name the field. */
    post(&r,
         "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\","
         "\"content\":\"a\"},{\"role\":\"assistant\",\"content\":\"b\"},"
         "{\"role\":5,\"content\":\"c\"}]}",
         NULL);
    e = expect_error(&r, 400, "invalid_request_error", &o);
    assert_string_equal(json_string_value(json_object_get(e, "param")),
                        "messages[2].role");
    json_decref(o);
    reply_free(&r);
    post(&r,
         "{\"model\":\"" MODEL "\",\"stream\":\"yes\",\"messages\":[{\"role\":"
         "\"user\",\"content\":\"a\"}]}",
         NULL);
    e = expect_error(&r, 400, "invalid_request_error", &o);
    assert_string_equal(json_string_value(json_object_get(e, "param")),
                        "stream");
    json_decref(o);
    reply_free(&r);
    post(&r, "{\"model\":", NULL);
    e = expect_error(&r, 400, "invalid_request_error", &o);
    json_decref(o);
    reply_free(&r);
    post(&r, "{\"model\":\"" MODEL "\",\"messages\":[]}", NULL);
    e = expect_error(&r, 400, "invalid_request_error", &o);
    assert_string_equal(json_string_value(json_object_get(e, "param")),
                        "messages");
    json_decref(o);
    reply_free(&r);

    /* None of these reached the model. */
    assert_int_equal(fake_request_count(H.fake), 0);

    /* Unknown fields are ignored; a bare model name resolves to the
     * listed model whose upstream id it is. */
    post(&r,
         "{\"model\":\"fake-model\",\"seed\":7,\"logit_bias\":{},"
         "\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
         NULL);
    assert_int_equal(r.status, 200);
    o = reply_json(&r);
    assert_string_equal(json_string_value(json_object_get(o, "model")),
                        "fake-model");
    json_decref(o);
    reply_free(&r);
    assert_int_equal(fake_request_count(H.fake), 1);
    /* An unlisted model of a configured provider; a bare name with one
     * provider configured is that provider's model. */
    post(&r,
         "{\"model\":\"fake/other-model\",\"messages\":[{\"role\":"
         "\"user\",\"content\":\"a\"}]}",
         NULL);
    assert_int_equal(r.status, 200);
    reply_free(&r);
    post(&r,
         "{\"model\":\"gpt-x\",\"stream\":true,\"messages\":[{\"role\":"
         "\"user\",\"content\":\"a\"}]}",
         NULL);
    assert_int_equal(r.status, 200);
    reply_free(&r);
    {
        json_t *b1 = upstream_body(1), *b2 = upstream_body(2);
        assert_string_equal(json_string_value(json_object_get(b1, "model")),
                            "other-model");
        assert_string_equal(json_string_value(json_object_get(b2, "model")),
                            "gpt-x");
        json_decref(b1);
        json_decref(b2);
    }
    stop();
}

static void test_agent(void **state)
{
    reply r;
    json_t *o;
    (void)state;

    start("{\"loop\":true,\"responses\":[{\"text\":[\"hello\"]}]}");
    post(&r,
         "{\"model\":\"agent/helper\",\"tools\":[\"get_time\"],\"messages\":"
         "[{\"role\":\"user\",\"content\":\"hi\"}]}",
         NULL);
    assert_int_equal(r.status, 200);
    o = reply_json(&r);
    assert_string_equal(json_string_value(json_object_get(o, "model")),
                        "agent/helper");
    json_decref(o);
    reply_free(&r);
    /* The agent's system prompt and tools, plus the request's tool. */
    expect_upstream_messages(0, "system:You are the helper.|user:hi");
    expect_upstream_tools(0, "echo,get_time");
    /* Without request tools: the agent's alone. */
    post(&r,
         "{\"model\":\"agent/helper\",\"stream\":true,\"messages\":"
         "[{\"role\":\"user\",\"content\":\"hi\"}]}",
         NULL);
    assert_int_equal(r.status, 200);
    reply_free(&r);
    expect_upstream_tools(1, "echo");
    /* A client tool may not shadow the agent's own. */
    post(&r,
         "{\"model\":\"agent/helper\",\"tools\":[{\"type\":\"function\","
         "\"function\":{\"name\":\"echo\"}}],\"messages\":"
         "[{\"role\":\"user\",\"content\":\"hi\"}]}",
         NULL);
    {
        json_t *e = expect_error(&r, 400, "invalid_request_error", &o);
        assert_string_equal(json_string_value(json_object_get(e, "param")),
                            "tools[0].function.name");
        json_decref(o);
    }
    reply_free(&r);
    stop();
}

static void test_upstream_errors(void **state)
{
    reply r;
    json_t *o, *e, *chunks, *last;
    int done;
    (void)state;

#define RATE_HEADERS                                                           \
    "\"headers\":{\"Retry-After\":\"1\",\"retry-after-ms\":\"1000\","          \
    "\"X-RateLimit-Remaining-Requests\":\"0\",\"Set-Cookie\":\"a=b\"},"
    start("{\"responses\":["
          "{\"status\":429," RATE_HEADERS
          "\"error\":{\"message\":\"Rate limit reached\","
          "\"type\":\"requests\",\"code\":\"rate_limit_exceeded\"}},"
          "{\"status\":429," RATE_HEADERS
          "\"error\":{\"message\":\"Rate limit reached\","
          "\"type\":\"requests\",\"code\":\"rate_limit_exceeded\"}},"
          "{\"status\":500,\"error\":{\"message\":\"The server had an "
          "error\",\"type\":\"server_error\"}},"
          "{\"text\":[\"partial \"],\"stream_error\":{\"message\":"
          "\"exploded\",\"type\":\"server_error\"}}]}");
    /* Not streamed: the upstream's status. */
    post(&r,
         "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\","
         "\"content\":\"x\"}]}",
         NULL);
    e = expect_error(&r, 429, "rate_limit_error", &o);
    assert_string_equal(json_string_value(json_object_get(e, "code")),
                        "rate_limit_exceeded");
    assert_non_null(strstr(json_string_value(json_object_get(e, "message")),
                           "Rate limit reached"));
    assert_int_equal(r.conv_headers, 1);
    /* The upstream's rate-limit headers are passed on, no others. */
    assert_string_equal(r.retry_after, "1");
    assert_string_equal(r.retry_after_ms, "1000");
    assert_string_equal(r.remaining, "0");
    assert_string_equal(r.cookie, "");
    json_decref(o);
    reply_free(&r);

    /* Streamed, failing before any output: the status is held back
     * until the run has output, so this is a plain 429 as OpenAI answers
     * it (SDKs raise RateLimitError), still with the conversation id. */
    post(&r,
         "{\"model\":\"" MODEL "\",\"stream\":true,\"messages\":[{\"role\":"
         "\"user\",\"content\":\"x\"}]}",
         NULL);
    e = expect_error(&r, 429, "rate_limit_error", &o);
    assert_non_null(strstr(json_string_value(json_object_get(e, "message")),
                           "Rate limit reached"));
    assert_int_equal(r.conv_headers, 1);
    assert_string_equal(r.retry_after, "1");
    assert_string_equal(r.remaining, "0");
    json_decref(o);
    reply_free(&r);

    /* An upstream 5xx is a 502 with the upstream's message. */
    post(&r,
         "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\","
         "\"content\":\"x\"}]}",
         NULL);
    e = expect_error(&r, 502, "upstream_error", &o);
    assert_non_null(strstr(json_string_value(json_object_get(e, "message")),
                           "The server had an error"));
    assert_string_equal(r.retry_after, "");
    json_decref(o);
    reply_free(&r);

    /* Streamed, failing after output began: the stream is under way, so
     * the error comes as an error event, and no [DONE]. */
    post(&r,
         "{\"model\":\"" MODEL "\",\"stream\":true,\"messages\":[{\"role\":"
         "\"user\",\"content\":\"x\"}]}",
         NULL);
    assert_int_equal(r.status, 200);
    chunks = sse_chunks(&r, &done);
    assert_false(done);
    last = json_array_get(chunks, json_array_size(chunks) - 1);
    e = json_object_get(last, "error");
    assert_non_null(e);
    assert_non_null(strstr(json_string_value(json_object_get(e, "message")),
                           "exploded"));
    json_decref(chunks);
    reply_free(&r);
    stop();
}

/* Posts body and checks that it fails as an upstream timeout (504) whose
 * message has part (the timeout that ran out). */
static void expect_timeout(const char *body, const char *part)
{
    reply r;
    json_t *o, *e;

    post(&r, body, NULL);
    e = expect_error(&r, 504, "timeout", &o);
    assert_non_null(
        strstr(json_string_value(json_object_get(e, "message")), part));
    json_decref(o);
    reply_free(&r);
}

/*
 * A streamed answer's first chunk must come within the provider's
 * first_byte_ms (400 ms here; the fake takes 1 s), also on a fiber, where
 * the request goes out from the worker's loop after the transfer first
 * looks at its timers.
 */
static void test_first_byte_timeout(void **state)
{
    (void)state;

    H_timeouts = "{connect_ms: 5000, first_byte_ms: 400, idle_ms: 20000}";
    start("{\"responses\":[{\"text\":[\"late\"],\"delay_ms\":1000}]}");
    H_timeouts = NULL;
    expect_timeout("{\"model\":\"" MODEL "\",\"stream\":true,\"messages\":"
                   "[{\"role\":\"user\",\"content\":\"x\"}]}",
                   "within 400 ms");
    stop();
}

/*
 * A client that does not stream reads only the finished answer, so the
 * model is asked for it whole (no "stream" upstream), and the wait for it
 * is the provider's answer_ms, not first_byte_ms (which holds for
 * streams, above). Both are crossed: the fake takes 1 s to answer, past
 * first_byte_ms (400 ms) and within answer_ms (2.5 s), then 5 s, past
 * answer_ms.
 */
static void test_whole_answers(void **state)
{
    reply r;
    json_t *o, *req, *body;
    (void)state;

    H_timeouts = "{connect_ms: 5000, first_byte_ms: 400, idle_ms: 20000, "
                 "answer_ms: 2500}";
    start("{\"responses\":["
          "{\"text\":[\"Hello\",\" world\"],\"delay_ms\":1000},"
          "{\"text\":[\"too late\"],\"delay_ms\":5000}]}");
    H_timeouts = NULL;

    post(&r,
         "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\","
         "\"content\":\"x\"}]}",
         NULL);
    assert_int_equal(r.status, 200);
    o = reply_json(&r);
    assert_string_equal(
        json_string_value(json_object_get(
            json_object_get(json_array_get(json_object_get(o, "choices"), 0),
                            "message"),
            "content")),
        "Hello world");
    json_decref(o);
    reply_free(&r);
    req = fake_request(H.fake, 0);
    body = json_object_get(req, "body");
    assert_true(json_is_object(body));
    assert_null(json_object_get(body, "stream"));
    assert_null(json_object_get(body, "stream_options"));
    json_decref(req);

    expect_timeout("{\"model\":\"" MODEL "\",\"messages\":[{\"role\":"
                   "\"user\",\"content\":\"x\"}]}",
                   "within 2500 ms");
    stop();
}

static void test_conversation_continuity(void **state)
{
    reply r;
    json_t *o, *info;
    char conv[160], hdr[200];
    int done;
    (void)state;

    start("{\"responses\":[{\"text\":[\"one\"]},{\"text\":[\"two\"]},"
          "{\"text\":[\"three\"]},{\"text\":[\"four\"]}]}");
    post(&r,
         "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"system\","
         "\"content\":\"sys\"},{\"role\":\"user\",\"content\":\"first\"}]}",
         NULL);
    assert_int_equal(r.status, 200);
    assert_int_equal(r.conv_headers, 1);
    snprintf(conv, sizeof(conv), "%s", r.conv);
    reply_free(&r);

    /* The id in the body: the stored history, then the new message. */
    {
        char *body = NULL;
        assert_true(asprintf(&body,
                             "{\"model\":\"" MODEL "\",\"conversation_id\":"
                             "\"%s\",\"messages\":[{\"role\":\"user\","
                             "\"content\":\"second\"}]}",
                             conv) > 0);
        post(&r, body, NULL);
        free(body);
    }
    assert_int_equal(r.status, 200);
    assert_string_equal(r.conv, conv);
    o = reply_json(&r);
    assert_string_equal(
        json_string_value(json_object_get(o, "conversation_id")), conv);
    json_decref(o);
    reply_free(&r);
    expect_upstream_messages(1, "system:sys|user:first|assistant:one|"
                                "user:second");

    /* The id in the header, with a client that sends its whole history:
     * only what follows its last assistant message is new. Streamed. */
    snprintf(hdr, sizeof(hdr), "X-Loom-Conversation-Id: %s", conv);
    post(&r,
         "{\"model\":\"" MODEL "\",\"stream\":true,\"messages\":["
         "{\"role\":\"system\",\"content\":\"sys\"},"
         "{\"role\":\"user\",\"content\":\"first\"},"
         "{\"role\":\"assistant\",\"content\":\"one\"},"
         "{\"role\":\"user\",\"content\":\"second\"},"
         "{\"role\":\"assistant\",\"content\":\"two\"},"
         "{\"role\":\"user\",\"content\":\"third\"}]}",
         hdr);
    assert_int_equal(r.status, 200);
    assert_string_equal(r.conv, conv);
    {
        json_t *chunks = sse_chunks(&r, &done);
        assert_true(done);
        assert_string_equal(
            json_string_value(json_object_get(json_array_get(chunks, 0),
                                              "conversation_id")),
            conv);
        json_decref(chunks);
    }
    reply_free(&r);
    expect_upstream_messages(2, "system:sys|user:first|assistant:one|"
                                "user:second|assistant:two|user:third");

    /* Sent the moment the stream said [DONE]: the streamed turn is
     * already stored. */
    post(&r,
         "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\","
         "\"content\":\"fourth\"}]}",
         hdr);
    assert_int_equal(r.status, 200);
    reply_free(&r);
    expect_upstream_messages(3, "system:sys|user:first|assistant:one|"
                                "user:second|assistant:two|user:third|"
                                "assistant:three|user:fourth");
    assert_int_equal(loom_store_conversation_get(H.store, conv, &info), 0);
    assert_int_equal(json_array_size(json_object_get(info, "messages")), 9);
    json_decref(info);

    /* Body and header must agree; an unknown id is a 404. */
    post(&r,
         "{\"model\":\"" MODEL "\",\"conversation_id\":\"conv_other\","
         "\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         hdr);
    {
        json_t *e = expect_error(&r, 400, "invalid_request_error", &o);
        assert_string_equal(json_string_value(json_object_get(e, "param")),
                            "conversation_id");
        json_decref(o);
    }
    reply_free(&r);
    post(&r,
         "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\","
         "\"content\":\"x\"}]}",
         "X-Loom-Conversation-Id: conv_000000000000000000000000");
    {
        json_t *e = expect_error(&r, 404, "invalid_request_error", &o);
        assert_string_equal(json_string_value(json_object_get(e, "code")),
                            "conversation_not_found");
        json_decref(o);
    }
    reply_free(&r);
    /* The header's limit: 128 characters. */
    {
        char big[200];
        memset(big, 0, sizeof(big));
        snprintf(big, sizeof(big), "X-Loom-Conversation-Id: conv_");
        memset(big + strlen(big), 'a', 129 - 5);
        post(&r,
             "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\","
             "\"content\":\"x\"}]}",
             big);
        {
            json_t *e = expect_error(&r, 400, "invalid_request_error", &o);
            assert_string_equal(
                json_string_value(json_object_get(e, "param")),
                "conversation_id");
            json_decref(o);
        }
        reply_free(&r);
        /* 128 characters pass the check (and name no conversation). */
        big[strlen(big) - 1] = '\0';
        post(&r,
             "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\","
             "\"content\":\"x\"}]}",
             big);
        {
            json_t *e = expect_error(&r, 404, "invalid_request_error", &o);
            assert_string_equal(
                json_string_value(json_object_get(e, "code")),
                "conversation_not_found");
            json_decref(o);
        }
        reply_free(&r);
    }
    /* With a conversation, the request must bring something new. */
    post(&r,
         "{\"model\":\"" MODEL "\",\"messages\":[{\"role\":\"user\","
         "\"content\":\"x\"},{\"role\":\"assistant\",\"content\":\"y\"}]}",
         hdr);
    {
        json_t *e = expect_error(&r, 400, "invalid_request_error", &o);
        assert_string_equal(json_string_value(json_object_get(e, "param")),
                            "messages");
        json_decref(o);
    }
    reply_free(&r);
    assert_int_equal(fake_request_count(H.fake), 4);
    stop();
}

static int setup_all(void **state)
{
    (void)state;
    /* The config must come from the test alone. */
    unsetenv("OPENAI_API_KEY");
    unsetenv("OPENAI_BASE_URL");
    unsetenv("LOOM_MODEL");
    curl_global_init(CURL_GLOBAL_ALL);
    return 0;
}

static int teardown_all(void **state)
{
    (void)state;
    curl_global_cleanup();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_text_and_usage),
        cmocka_unit_test(test_stream_server_tool),
        cmocka_unit_test(test_nonstream_tool_events),
        cmocka_unit_test(test_client_tools),
        cmocka_unit_test(test_request_errors),
        cmocka_unit_test(test_agent),
        cmocka_unit_test(test_upstream_errors),
        cmocka_unit_test(test_first_byte_timeout),
        cmocka_unit_test(test_whole_answers),
        cmocka_unit_test(test_conversation_continuity),
    };
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
