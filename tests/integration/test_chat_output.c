/*
 * What POST /v1/chat/completions answers, for clients that only know
 * OpenAI's API (docs/openai-compat.md#loom-extensions), end to end with
 * a real server, a SQLite store in a temporary file and the fake
 * upstream:
 *
 * - tool_calls (and finish_reason "tool_calls") hold only the calls the
 *   client must answer; loom's own calls go in loom_tool_calls, unless
 *   the request asks for the inline shape (field or header);
 * - a cancelled stream (a cancel, or the client leaving) ends as a
 *   normal stream: finish_reason "stop", loom_status "cancelled",
 *   [DONE]; the run is stored cancelled;
 * - the non-streamed answer carries the reasoning;
 * - cost everywhere: chat usage, the usage chunk, run objects, the
 *   stored message (the whole turn's tokens beside its cost) and
 *   /metrics; null for a model without prices.
 */
#include "test_server_harness.h"

#define LOOP(resp) "{\"loop\":true,\"responses\":[" resp "]}"
#define HANG                                                                   \
    "{\"text\":[\"Partial \",\"answer\"],\"hang\":true,"                       \
    "\"hang_after_chunks\":2}"
#define WEATHER_TOOL                                                           \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","           \
    "\"description\":\"Weather of a city.\",\"parameters\":{\"type\":"         \
    "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}"
/* One turn calling loom's get_time and the client's get_weather. */
#define MIXED_TURN                                                             \
    "{\"tool_calls\":[{\"id\":\"call_t\",\"name\":\"get_time\","               \
    "\"arguments\":\"{}\"},{\"id\":\"call_w\",\"name\":\"get_weather\","       \
    "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}]}"
#define MIXED_REQUEST(extra)                                                   \
    "{\"model\":\"fake/m\",\"tools\":[\"get_time\"," WEATHER_TOOL "],"         \
    "\"messages\":[{\"role\":\"user\",\"content\":\"time and "                 \
    "weather?\"}]" extra "}"
#define PRICED_MODEL                                                           \
    "  fake/priced:\n"                                                         \
    "    upstream: fake-model\n"                                               \
    "    prices: {input: \"1.00\", output: \"2.00\"}\n"
/* A get_time turn then the answer: 1000 x $1 + 100 x $2 per million
 * tokens = 1200 micro-dollars, then 2400; 3600 for the run. */
#define PRICED_TURNS                                                           \
    LOOP("{\"tool_calls\":[{\"id\":\"call_t\",\"name\":\"get_time\","          \
         "\"arguments\":\"{}\"}],\"usage\":{\"prompt_tokens\":1000,"           \
         "\"completion_tokens\":100,\"total_tokens\":1100}},"                  \
         "{\"text\":[\"It is noon.\"],\"usage\":{\"prompt_tokens\":2000,"      \
         "\"completion_tokens\":200,\"total_tokens\":2200}}")
#define WAIT_LIMIT_MS 60000

/* ---- helpers ------------------------------------------------------------- */

/*
 * The chunks of an OpenAI chat stream: every event "data: <json>\n\n";
 * *done is 1 when the last is "data: [DONE]".
 */
static json_t *chunks_of(const char *body, int *done)
{
    json_t *arr = json_array();
    const char *p = body ? body : "";

    *done = 0;
    while (*p) {
        const char *nl = strstr(p, "\n\n");
        if (!nl)
            fail_msg("unterminated event: %s", p);
        assert_false(*done);
        if (*p != ':') {
            assert_int_equal(strncmp(p, "data: ", 6), 0);
            if (nl - p == 12 && strncmp(p + 6, "[DONE]", 6) == 0) {
                *done = 1;
            } else {
                json_t *j = json_loadb(p + 6, (size_t)(nl - p - 6), 0, NULL);
                if (!j)
                    fail_msg("bad JSON: %.*s", (int)(nl - p), p);
                json_array_append_new(arr, j);
            }
        }
        p = nl + 2;
    }
    return arr;
}

static const json_t *choice_of(const json_t *chunk)
{
    return json_array_get(json_object_get(chunk, "choices"), 0);
}

/* "name@index,..." of the calls under key across every delta. */
static void calls_of(const json_t *chunks, const char *key, char *out,
                     size_t size)
{
    const json_t *c, *call;
    size_t i, k, n = 0;

    out[0] = '\0';
    json_array_foreach(chunks, i, c)
    {
        json_array_foreach(
            json_object_get(json_object_get(choice_of(c), "delta"), key), k,
            call)
        {
            n += (size_t)snprintf(
                out + n, size - n, "%s%s@%lld", n ? "," : "",
                json_string_value(
                    json_object_get(json_object_get(call, "function"), "name")),
                (long long)json_integer_value(json_object_get(call, "index")));
            assert_true(n < size);
        }
    }
}

/* The calls of a stream under tool_calls and loom_tool_calls, as
 * calls_of gives them; *done as chunks_of. Returns the chunks. */
static json_t *expect_calls(const char *body, const char *client,
                            const char *server)
{
    char got[256];
    int done;
    json_t *chunks = chunks_of(body, &done);

    assert_true(done);
    calls_of(chunks, "tool_calls", got, sizeof(got));
    assert_string_equal(got, client);
    calls_of(chunks, "loom_tool_calls", got, sizeof(got));
    assert_string_equal(got, server);
    return chunks;
}

/* The last chunk with a choice, whose finish_reason ends the message. */
static const json_t *finish_chunk(const json_t *chunks)
{
    for (size_t i = json_array_size(chunks); i-- > 0;)
        if (choice_of(json_array_get(chunks, i)))
            return json_array_get(chunks, i);
    return NULL;
}

static json_t *post_chat(const sh *h, const char *body, const char *header,
                         long want_status, sh_resp *r)
{
    struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: "
                                                    "application/json");
    json_t *j = NULL;

    if (header)
        hd = curl_slist_append(hd, header);
    if (sh_req(h, "POST", "/v1/chat/completions", body, hd, r) != want_status)
        fail_msg("status %ld, want %ld: %s", r->status, want_status,
                 r->body ? r->body : "");
    curl_slist_free_all(hd);
    if (!strstr(body, "\"stream\":true"))
        j = json_loads(r->body ? r->body : "", 0, NULL);
    return j;
}

/* ---- 1. server calls apart from the client's ----------------------------- */

static void test_server_calls_apart(void **state)
{
    sh h;
    sh_resp r;
    json_t *chunks, *o, *msg, *ev;
    int outputs = 0;
    size_t i;
    const json_t *c;
    (void)state;

    sh_start(&h, LOOP(MIXED_TURN), NULL, NULL);

    /* Streamed, the default: the client's call alone in tool_calls. */
    post_chat(&h, MIXED_REQUEST(",\"stream\":true"), NULL, 200, &r);
    chunks = expect_calls(r.body, "get_weather@0", "get_time@0");
    json_array_foreach(chunks, i, c)
    {
        const json_t *out = json_object_get(
            json_object_get(choice_of(c), "delta"), "tool_output");
        if (out) {
            assert_string_equal(sh_str(out, "tool_call_id"), "call_t");
            outputs++;
        }
    }
    assert_int_equal(outputs, 1);
    assert_string_equal(
        sh_str(choice_of(finish_chunk(chunks)), "finish_reason"), "tool_calls");
    json_decref(chunks);
    sh_resp_free(&r);

    /* The inline (seed-compatible) shape, by header or by field; the
     * header wins over the field. */
    post_chat(&h, MIXED_REQUEST(",\"stream\":true"),
              "X-Loom-Server-Tool-Calls: inline", 200, &r);
    json_decref(expect_calls(r.body, "get_time@0,get_weather@1", ""));
    sh_resp_free(&r);
    post_chat(&h,
              MIXED_REQUEST(",\"stream\":true,"
                            "\"loom_server_tool_calls\":\"inline\""),
              NULL, 200, &r);
    json_decref(expect_calls(r.body, "get_time@0,get_weather@1", ""));
    sh_resp_free(&r);
    post_chat(&h,
              MIXED_REQUEST(",\"stream\":true,"
                            "\"loom_server_tool_calls\":\"inline\""),
              "X-Loom-Server-Tool-Calls: separate", 200, &r);
    json_decref(expect_calls(r.body, "get_weather@0", "get_time@0"));
    sh_resp_free(&r);

    /* Not streamed: the same rule; loom's call is in tool_events. */
    o = post_chat(&h, MIXED_REQUEST(""), NULL, 200, &r);
    msg = json_object_get(choice_of(o), "message");
    assert_int_equal(json_array_size(json_object_get(msg, "tool_calls")), 1);
    assert_string_equal(
        sh_str(json_object_get(
                   json_array_get(json_object_get(msg, "tool_calls"), 0),
                   "function"),
               "name"),
        "get_weather");
    assert_string_equal(sh_str(choice_of(o), "finish_reason"), "tool_calls");
    ev = json_object_get(o, "tool_events");
    assert_string_equal(sh_str(json_array_get(ev, 0), "type"), "tool_call");
    assert_string_equal(
        sh_str(json_object_get(json_object_get(json_array_get(ev, 0), "value"),
                               "function"),
               "name"),
        "get_time");
    json_decref(o);
    sh_resp_free(&r);

    /* A bad mode is a 400 naming the field. */
    json_decref(post_chat(&h, MIXED_REQUEST(""),
                          "X-Loom-Server-Tool-Calls: both", 400, &r));
    sh_check_error(r.body, "invalid_value");
    sh_resp_free(&r);
    json_decref(post_chat(&h, MIXED_REQUEST(",\"loom_server_tool_calls\":1"),
                          NULL, 400, &r));
    sh_resp_free(&r);
    sh_free(&h);
}

/* ---- 2. a stop is not a failure ------------------------------------------ */

typedef struct {
    const sh *h;
    sh_resp *r;
    char run_id[96];
    int leave; /* 1: the client leaves at the first chunk, else cancels */
} stopper;

/* Takes the body; at the first chunk, cancels the run or leaves. */
static size_t stop_on_first_chunk(char *p, size_t sz, size_t n, void *ud)
{
    stopper *s = ud;
    const char *id;
    size_t got = sh_on_body(p, sz, n, s->r);

    if (s->run_id[0] || !s->r->body ||
        !(id = strstr(s->r->body, "\"id\":\"chatcmpl-")))
        return got;
    id += strlen("\"id\":\"chatcmpl-");
    snprintf(s->run_id, sizeof(s->run_id), "run_%.*s", (int)strcspn(id, "\""),
             id);
    if (s->leave)
        return 0;
    {
        char path[160];
        sh_resp cr;
        snprintf(path, sizeof(path), "/v1/runs/%s/cancel", s->run_id);
        assert_int_equal(sh_req(s->h, "POST", path, NULL, NULL, &cr), 200);
        sh_resp_free(&cr);
    }
    return got;
}

/* Streams a chat on a hanging model and stops it at its first chunk. */
static void stream_and_stop(const sh *h, stopper *s, sh_resp *r)
{
    static const char body[] =
        "{\"model\":\"fake/m\",\"stream\":true,\"stream_options\":"
        "{\"include_usage\":true},\"messages\":[{\"role\":\"user\","
        "\"content\":\"hi\"}]}";
    struct curl_slist *hd =
        curl_slist_append(NULL, "Content-Type: application/json");
    CURL *e;
    CURLcode rc;

    memset(r, 0, sizeof(*r));
    s->h = h;
    s->r = r;
    e = sh_easy(h, "POST", "/v1/chat/completions", body, hd, r);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, stop_on_first_chunk);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, s);
    rc = curl_easy_perform(e);
    assert_int_equal(rc, s->leave ? CURLE_WRITE_ERROR : CURLE_OK);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r->status);
    curl_easy_cleanup(e);
    curl_slist_free_all(hd);
    assert_int_equal(r->status, 200);
    assert_true(s->run_id[0] != '\0');
}

/* The run object says cancelled and stored, the turn is stored so. */
static void expect_stored_cancelled(const sh *h, const char *run_id)
{
    json_t *run = sh_wait_run(h, run_id, WAIT_LIMIT_MS), *conv;
    char path[200];

    assert_string_equal(sh_str(run, "status"), "cancelled");
    assert_true(json_is_true(json_object_get(run, "stored")));
    snprintf(path, sizeof(path), "/v1/conversations/%s",
             sh_str(run, "conversation_id"));
    conv = sh_json(h, "GET", path, NULL, 200);
    assert_string_equal(sh_str(sh_last_message(conv), "status"), "cancelled");
    json_decref(conv);
    json_decref(run);
}

/* A cancel ends the stream as a normal one; so does the client leaving
 * (nobody reads that end); both runs are stored cancelled. */
static void test_stop_is_not_a_failure(void **state)
{
    sh h;
    sh_resp r;
    stopper s;
    json_t *chunks;
    const json_t *fin, *last;
    int done;
    (void)state;

    sh_start(&h, LOOP(HANG), NULL, NULL);
    memset(&s, 0, sizeof(s));
    stream_and_stop(&h, &s, &r);
    /* No error event: the finish chunk, the usage chunk, [DONE]. */
    assert_null(strstr(r.body, "\"error\""));
    chunks = chunks_of(r.body, &done);
    assert_true(done);
    fin = finish_chunk(chunks);
    assert_string_equal(sh_str(choice_of(fin), "finish_reason"), "stop");
    assert_string_equal(sh_str(fin, "loom_status"), "cancelled");
    last = json_array_get(chunks, json_array_size(chunks) - 1);
    assert_int_equal(json_array_size(json_object_get(last, "choices")), 0);
    assert_non_null(json_object_get(last, "usage"));
    json_decref(chunks);
    sh_resp_free(&r);
    expect_stored_cancelled(&h, s.run_id);

    memset(&s, 0, sizeof(s));
    s.leave = 1;
    stream_and_stop(&h, &s, &r);
    sh_resp_free(&r);
    expect_stored_cancelled(&h, s.run_id);
    sh_free(&h);
}

/* ---- 3. reasoning when not streaming ------------------------------------- */

static void test_reasoning_not_streamed(void **state)
{
    sh h;
    sh_resp r;
    json_t *o, *msg, *ev;
    (void)state;

    sh_start(&h,
             "{\"responses\":[{\"reasoning\":[\"Need \",\"the time.\"],"
             "\"tool_calls\":[{\"id\":\"call_t\",\"name\":\"get_time\","
             "\"arguments\":\"{}\"}]},{\"reasoning\":[\"Got it.\"],"
             "\"text\":[\"Noon.\"]}]}",
             NULL, NULL);
    o = post_chat(&h,
                  "{\"model\":\"fake/m\",\"tools\":[\"get_time\"],"
                  "\"messages\":[{\"role\":\"user\",\"content\":\"time?\"}]}",
                  NULL, 200, &r);
    msg = json_object_get(choice_of(o), "message");
    assert_string_equal(sh_str(msg, "content"), "Noon.");
    assert_string_equal(sh_str(msg, "reasoning_content"), "Got it.");
    /* Each turn's reasoning in tool_events, in order. */
    ev = json_object_get(o, "tool_events");
    assert_string_equal(sh_str(json_array_get(ev, 0), "type"), "reasoning");
    assert_string_equal(sh_str(json_array_get(ev, 0), "value"),
                        "Need the time.");
    assert_string_equal(sh_str(json_array_get(ev, 1), "type"), "tool_call");
    assert_string_equal(sh_str(json_array_get(ev, 2), "type"), "tool_output");
    assert_string_equal(sh_str(json_array_get(ev, 3), "type"), "reasoning");
    assert_string_equal(sh_str(json_array_get(ev, 3), "value"), "Got it.");
    json_decref(o);
    sh_resp_free(&r);
    sh_free(&h);
}

/* ---- 4. cost everywhere -------------------------------------------------- */

static const json_t *usage_of(const json_t *o)
{
    return json_object_get(o, "usage");
}

static void test_cost_everywhere(void **state)
{
    sh h;
    sh_resp r;
    json_t *o, *run, *conv, *chunks;
    const json_t *u, *m;
    char path[200], run_id[96];
    int done;
    (void)state;

    sh_start_models(&h, PRICED_TURNS, NULL, NULL, PRICED_MODEL);

    /* A chat answer: usage with loom's fields and OpenAI's details. */
    o = post_chat(&h,
                  "{\"model\":\"fake/priced\",\"tools\":[\"get_time\"],"
                  "\"messages\":[{\"role\":\"user\",\"content\":\"time?\"}]}",
                  NULL, 200, &r);
    u = usage_of(o);
    assert_int_equal(json_integer_value(json_object_get(u, "prompt_tokens")),
                     3000);
    assert_int_equal(json_integer_value(json_object_get(u, "cost_micros")),
                     3600);
    assert_true(json_is_integer(json_object_get(u, "cached_tokens")));
    assert_true(json_is_integer(json_object_get(u, "reasoning_tokens")));
    assert_true(json_is_integer(json_object_get(u, "cache_write_tokens")));
    snprintf(run_id, sizeof(run_id), "run_%s",
             sh_str(o, "id") + strlen("chatcmpl-"));
    snprintf(path, sizeof(path), "/v1/conversations/%s",
             sh_str(o, "conversation_id"));
    json_decref(o);
    sh_resp_free(&r);

    /* The stored message: the whole turn's tokens beside its cost. */
    conv = sh_json(&h, "GET", path, NULL, 200);
    m = sh_last_message(conv);
    assert_int_equal(json_integer_value(json_object_get(m, "prompt_tokens")),
                     3000);
    assert_int_equal(
        json_integer_value(json_object_get(m, "completion_tokens")), 300);
    assert_int_equal(json_integer_value(json_object_get(m, "cost_micros")),
                     3600);
    json_decref(conv);

    /* The run object. */
    snprintf(path, sizeof(path), "/v1/runs/%s", run_id);
    run = sh_json(&h, "GET", path, NULL, 200);
    assert_int_equal(
        json_integer_value(json_object_get(usage_of(run), "cost_micros")),
        3600);
    assert_int_equal(json_integer_value(
                         json_object_get(usage_of(run), "cache_write_tokens")),
                     0);
    json_decref(run);

    /* The usage chunk of a stream. */
    post_chat(&h,
              "{\"model\":\"fake/priced\",\"stream\":true,\"stream_options\":"
              "{\"include_usage\":true},\"tools\":[\"get_time\"],"
              "\"messages\":[{\"role\":\"user\",\"content\":\"time?\"}]}",
              NULL, 200, &r);
    chunks = chunks_of(r.body, &done);
    assert_true(done);
    u = usage_of(json_array_get(chunks, json_array_size(chunks) - 1));
    assert_int_equal(json_integer_value(json_object_get(u, "cost_micros")),
                     3600);
    json_decref(chunks);
    sh_resp_free(&r);

    /* A blocking run. */
    run = sh_json(&h, "POST", "/v1/runs",
                  "{\"model\":\"fake/priced\",\"input\":\"time?\","
                  "\"tools\":[\"get_time\"]}",
                  200);
    assert_string_equal(sh_str(run, "status"), "completed");
    assert_int_equal(
        json_integer_value(json_object_get(usage_of(run), "cost_micros")),
        3600);
    json_decref(run);

    /* The metric: three priced runs. */
    assert_true(sh_metric(&h, "loom_cost_micros_total{model=\"fake/priced\"}",
                          -1) == 3 * 3600);

    /* A model without prices: cost unknown, null, not 0. */
    o = post_chat(&h,
                  "{\"model\":\"fake/m\",\"tools\":[\"get_time\"],"
                  "\"messages\":[{\"role\":\"user\",\"content\":\"time?\"}]}",
                  NULL, 200, &r);
    assert_true(json_is_null(json_object_get(usage_of(o), "cost_micros")));
    assert_int_equal(
        json_integer_value(json_object_get(usage_of(o), "prompt_tokens")),
        3000);
    json_decref(o);
    sh_resp_free(&r);
    run = sh_json(&h, "POST", "/v1/runs",
                  "{\"model\":\"fake/m\",\"input\":\"time?\","
                  "\"tools\":[\"get_time\"]}",
                  200);
    assert_true(json_is_null(json_object_get(usage_of(run), "cost_micros")));
    json_decref(run);
    assert_true(sh_metric(&h, "loom_cost_micros_total{model=\"fake/m\"}", -1) <
                0);
    sh_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_server_calls_apart),
        cmocka_unit_test(test_stop_is_not_a_failure),
        cmocka_unit_test(test_reasoning_not_streamed),
        cmocka_unit_test(test_cost_everywhere),
    };

    curl_global_init(CURL_GLOBAL_DEFAULT);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
