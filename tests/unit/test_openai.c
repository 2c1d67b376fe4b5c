/*
 * Unit tests of the OpenAI Chat Completions wire code (llm/openai.h) and
 * the retry timing (llm/retry.h): no network. Recorded streams from
 * LOOM_VECTORS_DIR/openai-chat are decoded whole, at every two-piece
 * split and one byte at a time; hand-written streams cover tool calls,
 * reasoning, errors, truncation and every limit; request bodies and error
 * bodies are checked as JSON.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/error.h"
#include "llm/openai.h"
#include "llm/retry.h"
#include "loom/buf.h"

#include <curl/curl.h>
#include <dirent.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- an event collector ---------------------------------------------- */

typedef struct {
    loom_buf text;
    loom_buf reasoning;
    loom_buf args[4]; /* TOOL_CALL_DELTA fragments by index */
    char *ids[4];
    char *names[4];
    int ndeltas;
    int ntool_calls_events;
    loom_tool_call calls[8];
    size_t calls_len;
    int nusage;
    loom_usage usage;
    int nfinish;
    char finish[32];
    int nerror;
    char error[256];
    int last_type; /* type of the last event */
    int abort_on;  /* abort when this event type arrives (-1: never) */
    int events;
} collector;

static void col_init(collector *c)
{
    memset(c, 0, sizeof(*c));
    loom_buf_init(&c->text, LOOM_BUF_UNLIMITED);
    loom_buf_init(&c->reasoning, LOOM_BUF_UNLIMITED);
    for (int i = 0; i < 4; i++)
        loom_buf_init(&c->args[i], LOOM_BUF_UNLIMITED);
    c->abort_on = -1;
    c->last_type = -1;
}

static void col_free(collector *c)
{
    loom_buf_free(&c->text);
    loom_buf_free(&c->reasoning);
    for (int i = 0; i < 4; i++) {
        loom_buf_free(&c->args[i]);
        free(c->ids[i]);
        free(c->names[i]);
    }
    for (size_t i = 0; i < c->calls_len; i++)
        loom_tool_call_clear(&c->calls[i]);
}

static int col_cb(const loom_llm_event *ev, void *payload)
{
    collector *c = payload;

    c->events++;
    c->last_type = (int)ev->type;
    if ((int)ev->type == c->abort_on)
        return 1;
    switch (ev->type) {
    case LOOM_LLM_TEXT:
        assert_true(ev->text_len > 0);
        assert_int_equal(loom_buf_put(&c->text, ev->text, ev->text_len), 0);
        break;
    case LOOM_LLM_REASONING:
        assert_int_equal(loom_buf_put(&c->reasoning, ev->text, ev->text_len),
                         0);
        break;
    case LOOM_LLM_TOOL_CALL_DELTA:
        c->ndeltas++;
        if (ev->tool_index >= 0 && ev->tool_index < 4) {
            int i = ev->tool_index;
            assert_non_null(ev->args_delta);
            assert_int_equal(loom_buf_puts(&c->args[i], ev->args_delta), 0);
            if (ev->tool_id) {
                assert_null(c->ids[i]); /* only on the first fragment */
                c->ids[i] = strdup(ev->tool_id);
            }
            if (ev->tool_name) {
                assert_null(c->names[i]);
                c->names[i] = strdup(ev->tool_name);
            }
        }
        break;
    case LOOM_LLM_TOOL_CALLS:
        c->ntool_calls_events++;
        for (size_t i = 0; i < ev->calls_len && i < 8; i++) {
            c->calls[i].id = strdup(ev->calls[i].id);
            c->calls[i].name = strdup(ev->calls[i].name);
            c->calls[i].arguments = strdup(ev->calls[i].arguments);
            c->calls_len = i + 1;
        }
        break;
    case LOOM_LLM_USAGE:
        c->nusage++;
        c->usage = ev->usage;
        break;
    case LOOM_LLM_FINISH:
        c->nfinish++;
        snprintf(c->finish, sizeof(c->finish), "%s", ev->finish_reason);
        break;
    case LOOM_LLM_ERROR:
        c->nerror++;
        assert_int_equal(ev->error_code, LOOM_EUPSTREAM);
        snprintf(c->error, sizeof(c->error), "%s", ev->error_message);
        break;
    }
    return 0;
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    char tmp[4096];
    size_t n;

    assert_non_null(f);
    while ((n = fread(tmp, 1, sizeof(tmp), f)) > 0)
        assert_int_equal(loom_buf_put(&b, tmp, n), 0);
    fclose(f);
    *len = b.len;
    return loom_buf_detach(&b);
}

/*
 * Decodes data fed in pieces: [0, split) and [split, len), or one byte at
 * a time when split is (size_t)-1. Returns feed/finish's first error.
 */
static int decode(const char *data, size_t len, size_t split, collector *c,
                  loom_llm_response *resp, const loom__openai_limits *lim)
{
    loom__openai_decoder *d;
    int rc = 0;

    assert_int_equal(loom__openai_decoder_new(&d, lim, c ? col_cb : NULL, c),
                     0);
    if (split == (size_t)-1) {
        for (size_t i = 0; i < len && !rc; i++)
            rc = loom__openai_decoder_feed(d, data + i, 1);
    } else {
        rc = loom__openai_decoder_feed(d, data, split);
        if (!rc)
            rc = loom__openai_decoder_feed(d, data + split, len - split);
    }
    if (!rc)
        rc = loom__openai_decoder_finish(d);
    if (resp)
        assert_int_equal(loom__openai_decoder_export(d, resp), 0);
    loom__openai_decoder_free(d);
    return rc;
}

static int decode_str(const char *s, collector *c, loom_llm_response *resp)
{
    return decode(s, strlen(s), strlen(s), c, resp, NULL);
}

/* ---- recorded vectors ------------------------------------------------ */

typedef struct {
    const char *file;
    const char *text;
    long prompt, completion, total;
    const char *finish;
    const char *id;
} vector;

static const vector vectors[] = {
    {"stream-emits-content-logprobs-events-1.sse",
     "{\"city\":\"San Francisco\",\"units\":\"f\"}", 17, 10, 27, "stop",
     "chatcmpl-9tZXFsqeQOozn5YU8I6SbjkmDnN76"},
    {"stream-is-robust-against-leading-newline-chunks-1.sse",
     "\n\n{\"city\":\"San Francisco\",\"units\":\"c\"}", 17, 10, 27, "stop",
     "chatcmpl-9tZXEmwtoDf6vqCqEWSvDP8jx9OXe"},
    {"stream-works-1.sse", "{\"city\":\"San Francisco\",\"units\":\"c\"}", 17,
     10, 27, "stop", "chatcmpl-9tZXEmwtoDf6vqCqEWSvDP8jx9OXe"},
};

static void check_vector(const vector *v, const char *data, size_t len,
                         size_t split)
{
    loom_llm_response resp = {0};
    collector c;

    col_init(&c);
    assert_int_equal(decode(data, len, split, &c, &resp, NULL), 0);
    assert_string_equal(loom_buf_cstr(&c.text), v->text);
    assert_string_equal(resp.text, v->text);
    assert_null(resp.reasoning);
    assert_int_equal(c.nusage, 1);
    assert_int_equal(c.usage.prompt_tokens, v->prompt);
    assert_int_equal(c.usage.completion_tokens, v->completion);
    assert_int_equal(c.usage.total_tokens, v->total);
    assert_int_equal(resp.usage.prompt_tokens, v->prompt);
    assert_int_equal(resp.usage.completion_tokens, v->completion);
    assert_int_equal(resp.usage.total_tokens, v->total);
    assert_int_equal(c.nfinish, 1);
    assert_int_equal(c.last_type, LOOM_LLM_FINISH);
    assert_string_equal(c.finish, v->finish);
    assert_string_equal(resp.finish_reason, v->finish);
    assert_string_equal(resp.response_id, v->id);
    assert_int_equal(resp.output_started, 1);
    assert_int_equal(resp.tool_calls_len, 0);
    assert_int_equal(c.ntool_calls_events, 0);
    loom_llm_response_clear(&resp);
    col_free(&c);
}

static void test_vectors(void **state)
{
    char dir[1024], path[2048];
    struct dirent *de;
    size_t seen = 0;
    DIR *dp;

    (void)state;
    snprintf(dir, sizeof(dir), "%s/openai-chat", LOOM_VECTORS_DIR);
    dp = opendir(dir);
    assert_non_null(dp);
    while ((de = readdir(dp)) != NULL) {
        const vector *v = NULL;
        size_t len;
        char *data;

        if (!strstr(de->d_name, ".sse"))
            continue;
        for (size_t i = 0; i < sizeof(vectors) / sizeof(vectors[0]); i++)
            if (strcmp(vectors[i].file, de->d_name) == 0)
                v = &vectors[i];
        if (!v)
            fail_msg("no expectations for vector %s", de->d_name);
        seen++;
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        data = read_file(path, &len);
        check_vector(v, data, len, len);
        check_vector(v, data, len, (size_t)-1);
        for (size_t k = 0; k <= len; k++)
            check_vector(v, data, len, k);
        free(data);
    }
    closedir(dp);
    assert_int_equal(seen, sizeof(vectors) / sizeof(vectors[0]));
}

/* ---- hand-written streams -------------------------------------------- */

#define CHUNK(delta, finish)                                                   \
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\","               \
    "\"choices\":[{\"index\":0,\"delta\":" delta ",\"finish_reason\":" finish  \
    "}]}\n\n"

static const char interleaved[] = CHUNK(
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{"
    "\"index\":0,\"id\":\"call_a\",\"type\":\"function\",\"function\":"
    "{\"name\":\"get_weather\",\"arguments\":\"\"}}]}",
    "null")
    CHUNK("{\"tool_calls\":[{\"index\":1,\"id\":\"call_b\",\"type\":"
          "\"function\",\"function\":{\"name\":\"get_time\",\"arguments\":"
          "\"{\\\"tz\\\"\"}}]}",
          "null")
        CHUNK("{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":"
              "\"{\\\"city\\\":\"}}]}",
              "null")
            CHUNK("{\"tool_calls\":[{\"index\":1,\"function\":{\"arguments\":"
                  "\":\\\"UTC\\\"}\"}}]}",
                  "null") CHUNK("{\"tool_calls\":[{\"index\":0,\"function\":{"
                                "\"arguments\":"
                                "\"\\\"Paris\\\"}\"}}]}",
                                "null")
                CHUNK("{}",
                      "\"tool_calls\"") "data: "
                                        "{\"id\":\"c1\",\"choices\":[],"
                                        "\"usage\":{\"prompt_tokens\":5,"
                                        "\"completion_tokens\":7,\"total_"
                                        "tokens\":12,\"prompt_tokens_details\":"
                                        "{\"cached_tokens\":3},\"completion_"
                                        "tokens_details\":"
                                        "{\"reasoning_tokens\":2}}}\n\n"
                                        "data: [DONE]\n\n";

static void check_interleaved(size_t split)
{
    loom_llm_response resp = {0};
    collector c;

    col_init(&c);
    assert_int_equal(
        decode(interleaved, strlen(interleaved), split, &c, &resp, NULL), 0);
    assert_int_equal(c.ndeltas, 5);
    assert_string_equal(c.ids[0], "call_a");
    assert_string_equal(c.names[0], "get_weather");
    assert_string_equal(c.ids[1], "call_b");
    assert_string_equal(c.names[1], "get_time");
    assert_string_equal(loom_buf_cstr(&c.args[0]), "{\"city\":\"Paris\"}");
    assert_string_equal(loom_buf_cstr(&c.args[1]), "{\"tz\":\"UTC\"}");
    assert_int_equal(c.ntool_calls_events, 1);
    assert_int_equal(c.calls_len, 2);
    assert_string_equal(c.calls[0].id, "call_a");
    assert_string_equal(c.calls[0].name, "get_weather");
    assert_string_equal(c.calls[0].arguments, "{\"city\":\"Paris\"}");
    assert_string_equal(c.calls[1].id, "call_b");
    assert_string_equal(c.calls[1].name, "get_time");
    assert_string_equal(c.calls[1].arguments, "{\"tz\":\"UTC\"}");
    assert_int_equal(resp.tool_calls_len, 2);
    assert_string_equal(resp.tool_calls[0].id, "call_a");
    assert_string_equal(resp.tool_calls[1].arguments, "{\"tz\":\"UTC\"}");
    assert_string_equal(resp.finish_reason, "tool_calls");
    assert_string_equal(c.finish, "tool_calls");
    assert_int_equal(c.last_type, LOOM_LLM_FINISH);
    assert_string_equal(resp.text, "");
    assert_int_equal(resp.output_started, 1);
    assert_int_equal(resp.usage.prompt_tokens, 5);
    assert_int_equal(resp.usage.completion_tokens, 7);
    assert_int_equal(resp.usage.total_tokens, 12);
    assert_int_equal(resp.usage.cached_tokens, 3);
    assert_int_equal(resp.usage.reasoning_tokens, 2);
    loom_llm_response_clear(&resp);
    col_free(&c);
}

static void test_tool_calls_interleaved(void **state)
{
    (void)state;
    check_interleaved(strlen(interleaved));
    check_interleaved((size_t)-1);
    for (size_t k = 0; k < strlen(interleaved); k += 7)
        check_interleaved(k);
}

static void test_tool_calls_quirks(void **state)
{
    /* Every call at index 0 (distinct ids), arguments as an object, no id
     * at all, and empty arguments. */
    const char *s =
        CHUNK("{\"tool_calls\":[{\"index\":0,\"id\":\"x1\",\"function\":{"
              "\"name\":\"a\",\"arguments\":\"{}\"}}]}",
              "null")
            CHUNK("{\"tool_calls\":[{\"index\":0,\"id\":\"x2\",\"function\":{"
                  "\"name\":\"b\",\"arguments\":{\"k\":1}}}]}",
                  "null")
                CHUNK("{\"tool_calls\":[{\"function\":{\"name\":\"c\"}}]}",
                      "null") CHUNK("{}", "\"tool_calls\"") "data: [DONE]\n\n";
    loom_llm_response resp = {0};
    collector c;

    (void)state;
    col_init(&c);
    assert_int_equal(decode_str(s, &c, &resp), 0);
    assert_int_equal(resp.tool_calls_len, 2);
    assert_string_equal(resp.tool_calls[0].id, "x1");
    assert_string_equal(resp.tool_calls[0].name, "a");
    assert_string_equal(resp.tool_calls[0].arguments, "{}");
    assert_string_equal(resp.tool_calls[1].id, "x2");
    /* the nameless, idless third fragment belongs to the last call */
    assert_string_equal(resp.tool_calls[1].name, "b");
    assert_string_equal(resp.tool_calls[1].arguments, "{\"k\":1}");
    loom_llm_response_clear(&resp);
    col_free(&c);

    s = CHUNK("{\"tool_calls\":[{\"index\":0,\"function\":{\"name\":\"f\"}}]}",
              "\"tool_calls\"") "data: [DONE]\n\n";
    col_init(&c);
    assert_int_equal(decode_str(s, &c, &resp), 0);
    assert_int_equal(resp.tool_calls_len, 1);
    assert_string_equal(resp.tool_calls[0].id, "call_0");
    assert_string_equal(resp.tool_calls[0].arguments, "{}");
    loom_llm_response_clear(&resp);
    col_free(&c);

    /* a call that never got a name cannot be run */
    s = CHUNK("{\"tool_calls\":[{\"index\":0,\"id\":\"q\",\"function\":{"
              "\"arguments\":\"{}\"}}]}",
              "\"tool_calls\"") "data: [DONE]\n\n";
    col_init(&c);
    assert_int_equal(decode_str(s, &c, &resp), LOOM_EPROTO);
    assert_non_null(strstr(loom_error_last(), "no name"));
    assert_int_equal(resp.tool_calls_len, 0);
    loom_llm_response_clear(&resp);
    col_free(&c);

    s = CHUNK("{\"tool_calls\":[{\"index\":-1,\"function\":{\"name\":\"f\"}}]}",
              "null");
    col_init(&c);
    assert_int_equal(decode_str(s, &c, NULL), LOOM_EPROTO);
    col_free(&c);
}

static void test_reasoning(void **state)
{
    const char *s = CHUNK("{\"reasoning_content\":\"think \"}", "null")
        CHUNK("{\"reasoning\":\"more\"}", "null")
            CHUNK("{\"content\":\"answer\"}", "null")
                CHUNK("{}", "\"stop\"") "data: [DONE]\n\n";
    loom_llm_response resp = {0};
    collector c;

    (void)state;
    col_init(&c);
    assert_int_equal(decode_str(s, &c, &resp), 0);
    assert_string_equal(loom_buf_cstr(&c.reasoning), "think more");
    assert_string_equal(resp.reasoning, "think more");
    assert_string_equal(resp.text, "answer");
    assert_int_equal(c.nusage, 0);
    loom_llm_response_clear(&resp);
    col_free(&c);

    /* reasoning alone counts as output */
    s = CHUNK("{\"reasoning\":\"r\"}", "null");
    col_init(&c);
    assert_int_equal(decode_str(s, &c, &resp), LOOM_EUPSTREAM);
    assert_int_equal(resp.output_started, 1);
    assert_string_equal(resp.reasoning, "r");
    loom_llm_response_clear(&resp);
    col_free(&c);
}

static void test_stream_error(void **state)
{
    const char *s = CHUNK(
        "{\"content\":\"Hel\"}",
        "null") "data: {\"error\":{\"message\":\"model overloaded\",\"type\":"
                "\"server_error\"}}\n\n";
    loom__openai_decoder *d;
    loom_llm_response resp = {0};
    collector c;

    (void)state;
    col_init(&c);
    assert_int_equal(loom__openai_decoder_new(&d, NULL, col_cb, &c), 0);
    assert_int_equal(loom__openai_decoder_feed(d, s, strlen(s)),
                     LOOM_EUPSTREAM);
    assert_int_equal(loom__openai_decoder_error(d)->kind, LOOM_UPSTREAM_STREAM);
    assert_string_equal(loom__openai_decoder_error(d)->message,
                        "model overloaded");
    assert_string_equal(loom__openai_decoder_error(d)->type, "server_error");
    /* the decoder stays failed */
    assert_int_equal(loom__openai_decoder_finish(d), LOOM_EUPSTREAM);
    assert_int_equal(loom__openai_decoder_export(d, &resp), 0);
    loom__openai_decoder_free(d);
    assert_string_equal(resp.text, "Hel");
    assert_int_equal(c.nerror, 1);
    assert_string_equal(c.error, "model overloaded");
    assert_int_equal(c.nfinish, 0);
    loom_llm_response_clear(&resp);
    col_free(&c);

    /* `event: error` with a plain message, and with text that is no JSON */
    s = "event: error\ndata: {\"message\":\"quota\"}\n\n";
    col_init(&c);
    assert_int_equal(loom__openai_decoder_new(&d, NULL, col_cb, &c), 0);
    assert_int_equal(loom__openai_decoder_feed(d, s, strlen(s)),
                     LOOM_EUPSTREAM);
    assert_string_equal(loom__openai_decoder_error(d)->message, "quota");
    loom__openai_decoder_free(d);
    col_free(&c);

    s = "event: error\ndata: upstream went away\n\n";
    col_init(&c);
    assert_int_equal(loom__openai_decoder_new(&d, NULL, col_cb, &c), 0);
    assert_int_equal(loom__openai_decoder_feed(d, s, strlen(s)),
                     LOOM_EUPSTREAM);
    assert_string_equal(loom__openai_decoder_error(d)->message,
                        "upstream went away");
    loom__openai_decoder_free(d);
    col_free(&c);
}

static void test_truncated(void **state)
{
    const char *s = CHUNK("{\"content\":\"Hel\"}", "null");
    loom__openai_decoder *d;
    loom_llm_response resp = {0};
    collector c;

    (void)state;
    col_init(&c);
    assert_int_equal(loom__openai_decoder_new(&d, NULL, col_cb, &c), 0);
    assert_int_equal(loom__openai_decoder_feed(d, s, strlen(s)), 0);
    assert_int_equal(loom__openai_decoder_done(d), 0);
    assert_int_equal(loom__openai_decoder_finish(d), LOOM_EUPSTREAM);
    assert_int_equal(loom__openai_decoder_error(d)->kind,
                     LOOM_UPSTREAM_CONNECTION);
    assert_string_equal(loom__openai_decoder_error(d)->message,
                        "stream ended before the answer was complete");
    assert_int_equal(loom__openai_decoder_export(d, &resp), 0);
    loom__openai_decoder_free(d);
    assert_string_equal(resp.text, "Hel");
    assert_null(resp.finish_reason);
    assert_int_equal(resp.output_started, 1);
    loom_llm_response_clear(&resp);
    col_free(&c);

    /* a finish reason without [DONE] is a complete answer (and the last
     * event may lack its blank line) */
    s = CHUNK(
        "{\"content\":\"Hi\"}",
        "null") "data: "
                "{\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":"
                "\"length\"}]}";
    col_init(&c);
    assert_int_equal(decode_str(s, &c, &resp), 0);
    assert_string_equal(resp.finish_reason, "length");
    assert_int_equal(c.nfinish, 1);
    loom_llm_response_clear(&resp);
    col_free(&c);

    /* nothing after [DONE] counts, not even garbage */
    s = CHUNK("{\"content\":\"A\"}", "\"stop\"") "data: [DONE]\n\n"
                                                 "data: {nonsense\n\n";
    col_init(&c);
    assert_int_equal(decode_str(s, &c, &resp), 0);
    assert_string_equal(resp.text, "A");
    loom_llm_response_clear(&resp);
    col_free(&c);
}

static void test_malformed(void **state)
{
    const char *bad[] = {
        "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}\n\n",
        "data: [1,2]\n\n",
        "data: not json\n\n",
        "data: {\"choices\":{}}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":{}}}]}"
        "\n\n",
    };
    collector c;

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        col_init(&c);
        assert_int_equal(decode_str(bad[i], &c, NULL), LOOM_EPROTO);
        col_free(&c);
        /* Why, in jansson's words when the text is not JSON. */
        if (i == 1)
            assert_string_equal(loom_error_last(),
                                "malformed chunk (not an object): [1,2]");
        if (i == 2)
            assert_non_null(strstr(loom_error_last(),
                                   "malformed chunk ('[' or '{' expected near "
                                   "'not'): not json"));
    }
    /* pings, comments and other events are ignored */
    col_init(&c);
    assert_int_equal(
        decode_str(": keepalive\n\nevent: ping\ndata: {}\n\n" CHUNK(
                       "{\"content\":\"ok\"}", "\"stop\""),
                   &c, NULL),
        0);
    assert_string_equal(loom_buf_cstr(&c.text), "ok");
    col_free(&c);
}

static void test_callback_abort(void **state)
{
    collector c;

    (void)state;
    col_init(&c);
    c.abort_on = LOOM_LLM_TEXT;
    assert_int_equal(
        decode_str(CHUNK("{\"content\":\"x\"}", "\"stop\""), &c, NULL),
        LOOM_ECANCELED);
    col_free(&c);
    col_init(&c);
    c.abort_on = LOOM_LLM_FINISH;
    assert_int_equal(
        decode_str(CHUNK("{\"content\":\"x\"}", "\"stop\""), &c, NULL),
        LOOM_ECANCELED);
    col_free(&c);
}

/* ---- limits ---------------------------------------------------------- */

static void test_limit_tool_calls(void **state)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    collector c;
    int i;

    (void)state;
    for (i = 0; i < LOOM_OPENAI_MAX_TOOL_CALLS; i++)
        assert_int_equal(
            loom_buf_printf(&b,
                            "data: {\"choices\":[{\"index\":0,\"delta\":{"
                            "\"tool_calls\":[{\"index\":%d,\"id\":\"c%d\","
                            "\"function\":{\"name\":\"f\",\"arguments\":"
                            "\"{}\"}}]}}]}\n\n",
                            i, i),
            0);
    assert_int_equal(loom_buf_puts(&b, CHUNK("{}", "\"tool_calls\"")), 0);
    col_init(&c);
    assert_int_equal(decode(b.ptr, b.len, b.len, &c, NULL, NULL), 0);
    assert_int_equal(c.ntool_calls_events, 1);
    col_free(&c);

    /* one more call passes the limit */
    loom_buf_clear(&b);
    for (i = 0; i <= LOOM_OPENAI_MAX_TOOL_CALLS; i++)
        assert_int_equal(
            loom_buf_printf(&b,
                            "data: {\"choices\":[{\"index\":0,\"delta\":{"
                            "\"tool_calls\":[{\"index\":%d,\"id\":\"c%d\","
                            "\"function\":{\"name\":\"f\"}}]}}]}\n\n",
                            i, i),
            0);
    col_init(&c);
    assert_int_equal(decode(b.ptr, b.len, b.len, &c, NULL, NULL),
                     LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "tool calls"));
    col_free(&c);

    /* and so do calls without an index */
    loom_buf_clear(&b);
    for (i = 0; i <= LOOM_OPENAI_MAX_TOOL_CALLS; i++)
        assert_int_equal(
            loom_buf_printf(&b,
                            "data: {\"choices\":[{\"index\":0,\"delta\":{"
                            "\"tool_calls\":[{\"id\":\"c%d\","
                            "\"function\":{\"name\":\"f\"}}]}}]}\n\n",
                            i),
            0);
    col_init(&c);
    assert_int_equal(decode(b.ptr, b.len, b.len, &c, NULL, NULL),
                     LOOM_ETOOLARGE);
    col_free(&c);
    loom_buf_free(&b);
}

/* A stream of n chunks, each carrying piece as `field` (in the delta). */
static void big_stream(loom_buf *b, const char *field, const char *piece, int n,
                       int tool)
{
    for (int i = 0; i < n; i++) {
        if (tool)
            assert_int_equal(
                loom_buf_printf(b,
                                "data: {\"choices\":[{\"index\":0,\"delta\":"
                                "{\"tool_calls\":[{\"index\":0,\"id\":\"c\","
                                "\"function\":{\"name\":\"f\",\"arguments\":"
                                "\"%s\"}}]}}]}\n\n",
                                piece),
                0);
        else
            assert_int_equal(
                loom_buf_printf(b,
                                "data: {\"choices\":[{\"index\":0,\"delta\":"
                                "{\"%s\":\"%s\"}}]}\n\n",
                                field, piece),
                0);
    }
    assert_int_equal(loom_buf_puts(b, CHUNK("{}", "\"stop\"")), 0);
}

static void test_limit_args(void **state)
{
    size_t piece_len = 64 * 1024;
    char *piece = malloc(piece_len + 1);
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    loom_llm_response resp = {0};
    collector c;
    int n = (int)(LOOM_OPENAI_MAX_ARGS / piece_len);

    (void)state;
    memset(piece, 'a', piece_len);
    piece[piece_len] = '\0';
    /* exactly the limit passes */
    big_stream(&b, NULL, piece, n, 1);
    col_init(&c);
    assert_int_equal(decode(b.ptr, b.len, b.len, &c, &resp, NULL), 0);
    assert_int_equal(strlen(resp.tool_calls[0].arguments),
                     LOOM_OPENAI_MAX_ARGS);
    loom_llm_response_clear(&resp);
    col_free(&c);
    /* one more fragment does not */
    loom_buf_clear(&b);
    big_stream(&b, NULL, piece, n + 1, 1);
    col_init(&c);
    assert_int_equal(decode(b.ptr, b.len, b.len, &c, &resp, NULL),
                     LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "arguments"));
    assert_int_equal(resp.tool_calls_len, 0);
    loom_llm_response_clear(&resp);
    col_free(&c);
    loom_buf_free(&b);
    free(piece);
}

static void test_limit_text(void **state)
{
    size_t piece_len = 1 << 20;
    char *piece = malloc(piece_len + 1);
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    loom_llm_response resp = {0};
    int n = (int)(LOOM_OPENAI_MAX_TEXT / piece_len);

    (void)state;
    memset(piece, 'x', piece_len);
    piece[piece_len] = '\0';
    big_stream(&b, "content", piece, n, 0);
    assert_int_equal(decode(b.ptr, b.len, b.len, NULL, &resp, NULL), 0);
    assert_int_equal(strlen(resp.text), LOOM_OPENAI_MAX_TEXT);
    loom_llm_response_clear(&resp);
    loom_buf_clear(&b);
    big_stream(&b, "content", piece, n + 1, 0);
    assert_int_equal(decode(b.ptr, b.len, b.len, NULL, &resp, NULL),
                     LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "text"));
    /* what came before the limit is kept */
    assert_int_equal(strlen(resp.text), LOOM_OPENAI_MAX_TEXT);
    loom_llm_response_clear(&resp);
    loom_buf_clear(&b);
    big_stream(&b, "reasoning_content", piece, n + 1, 0);
    assert_int_equal(decode(b.ptr, b.len, b.len, NULL, NULL, NULL),
                     LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "reasoning"));
    loom_buf_free(&b);
    free(piece);
}

static void test_limit_custom(void **state)
{
    loom__openai_limits lim = {2, 4, 8, 0};
    const char *s = CHUNK("{\"content\":\"12345678\"}", "\"stop\"");
    collector c;

    (void)state;
    col_init(&c);
    assert_int_equal(decode(s, strlen(s), strlen(s), &c, NULL, &lim), 0);
    col_free(&c);
    s = CHUNK("{\"content\":\"123456789\"}", "null");
    col_init(&c);
    assert_int_equal(decode(s, strlen(s), strlen(s), &c, NULL, &lim),
                     LOOM_ETOOLARGE);
    col_free(&c);
    s = CHUNK("{\"tool_calls\":[{\"index\":2,\"function\":{\"name\":\"f\"}}]}",
              "null");
    col_init(&c);
    assert_int_equal(decode(s, strlen(s), strlen(s), &c, NULL, &lim),
                     LOOM_ETOOLARGE);
    col_free(&c);
}

/* ---- non-streamed answers -------------------------------------------- */

static void test_complete_body(void **state)
{
    const char *body =
        "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"choices\":["
        "{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":"
        "\"Let me check.\",\"reasoning_content\":\"hmm\",\"tool_calls\":["
        "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
        "\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}},"
        "{\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":"
        "\"get_time\",\"arguments\":\"{}\"}}]},\"finish_reason\":"
        "\"tool_calls\"}],\"usage\":{\"prompt_tokens\":11,"
        "\"completion_tokens\":4,\"total_tokens\":15,"
        "\"prompt_tokens_details\":{\"cached_tokens\":8}}}";
    loom__openai_decoder *d;
    loom_llm_response resp = {0};
    collector c;

    (void)state;
    col_init(&c);
    assert_int_equal(loom__openai_decoder_new(&d, NULL, col_cb, &c), 0);
    assert_int_equal(loom__openai_decoder_complete(d, body, strlen(body)), 0);
    assert_int_equal(loom__openai_decoder_export(d, &resp), 0);
    loom__openai_decoder_free(d);
    assert_string_equal(resp.text, "Let me check.");
    assert_string_equal(resp.reasoning, "hmm");
    assert_string_equal(resp.response_id, "chatcmpl-1");
    assert_int_equal(resp.tool_calls_len, 2);
    assert_string_equal(resp.tool_calls[0].name, "get_weather");
    assert_string_equal(resp.tool_calls[0].arguments, "{\"city\":\"Paris\"}");
    assert_string_equal(resp.tool_calls[1].id, "call_2");
    assert_string_equal(resp.finish_reason, "tool_calls");
    assert_int_equal(resp.usage.prompt_tokens, 11);
    assert_int_equal(resp.usage.cached_tokens, 8);
    assert_int_equal(resp.usage.total_tokens, 15);
    assert_int_equal(c.ntool_calls_events, 1);
    assert_int_equal(c.ndeltas, 2);
    assert_int_equal(c.nfinish, 1);
    assert_int_equal(c.last_type, LOOM_LLM_FINISH);
    loom_llm_response_clear(&resp);
    col_free(&c);

    /* calls without ids (some local servers) stay distinct */
    body = "{\"choices\":[{\"index\":0,\"message\":{\"tool_calls\":["
           "{\"function\":{\"name\":\"a\",\"arguments\":{\"x\":1}}},"
           "{\"function\":{\"name\":\"b\"}}]},\"finish_reason\":"
           "\"tool_calls\"}]}";
    assert_int_equal(loom__openai_decoder_new(&d, NULL, NULL, NULL), 0);
    assert_int_equal(loom__openai_decoder_complete(d, body, strlen(body)), 0);
    assert_int_equal(loom__openai_decoder_export(d, &resp), 0);
    loom__openai_decoder_free(d);
    assert_int_equal(resp.tool_calls_len, 2);
    assert_string_equal(resp.tool_calls[0].id, "call_0");
    assert_string_equal(resp.tool_calls[0].arguments, "{\"x\":1}");
    assert_string_equal(resp.tool_calls[1].id, "call_1");
    assert_string_equal(resp.tool_calls[1].name, "b");
    assert_string_equal(resp.tool_calls[1].arguments, "{}");
    assert_string_equal(resp.text, "");
    assert_null(resp.reasoning);
    loom_llm_response_clear(&resp);

    /* error object in a 200 body; no choices; not JSON */
    {
        const char *bodies[] = {"{\"error\":{\"message\":\"bad\"}}",
                                "{\"choices\":[]}", "<html>", "[]"};
        const int want[] = {LOOM_EUPSTREAM, LOOM_EPROTO, LOOM_EPROTO,
                            LOOM_EPROTO};
        for (size_t i = 0; i < 4; i++) {
            assert_int_equal(loom__openai_decoder_new(&d, NULL, NULL, NULL), 0);
            assert_int_equal(
                loom__openai_decoder_complete(d, bodies[i], strlen(bodies[i])),
                want[i]);
            loom__openai_decoder_free(d);
        }
    }
}

/* ---- request bodies -------------------------------------------------- */

static json_t *build(const loom_llm_request *req)
{
    json_t *body = NULL;

    assert_int_equal(loom__openai_build_body(&body, req), 0);
    assert_non_null(body);
    return body;
}

static void assert_json(const json_t *got, const char *want)
{
    json_t *w = json_loads(want, 0, NULL);
    char *g = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS);

    assert_non_null(w);
    if (!json_equal((json_t *)got, w))
        fail_msg("JSON differs:\n got  %s\n want %s", g, want);
    free(g);
    json_decref(w);
}

static void test_body_messages(void **state)
{
    loom_messages m = {0};
    loom_tool_call calls[2] = {{"call_1", "get_weather", "{\"city\":\"P\"}"},
                               {"call_2", "get_time", NULL}};
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    json_t *body;

    (void)state;
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_SYSTEM, "Be brief."), 0);
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_USER, "Weather?"), 0);
    assert_int_equal(
        loom_messages_add_assistant(&m, NULL, "thinking", calls, 2), 0);
    assert_int_equal(
        loom_messages_add_tool_result(&m, "call_1", "get_weather", "sunny"), 0);
    assert_int_equal(
        loom_messages_add_tool_result(&m, "call_2", "get_time", "noon"), 0);
    assert_int_equal(loom_messages_add_assistant(&m, "", NULL, NULL, 0), 0);
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_USER, "bad \xff byte"), 0);
    req.model = "gpt-4o-mini";
    req.messages = m.items;
    req.messages_len = m.len;
    body = build(&req);
    assert_json(
        body, "{\"model\":\"gpt-4o-mini\",\"stream\":true,\"stream_options\":"
              "{\"include_usage\":true},\"messages\":["
              "{\"role\":\"system\",\"content\":\"Be brief.\"},"
              "{\"role\":\"user\",\"content\":\"Weather?\"},"
              "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
              "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
              "\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"P\\\"}\"}},"
              "{\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":"
              "\"get_time\",\"arguments\":\"{}\"}}]},"
              "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":"
              "\"sunny\"},"
              "{\"role\":\"tool\",\"tool_call_id\":\"call_2\",\"content\":"
              "\"noon\"},"
              "{\"role\":\"assistant\",\"content\":\"\"},"
              "{\"role\":\"user\",\"content\":\"bad \\ufffd byte\"}]}");
    json_decref(body);

    /* not streaming, with limits */
    req.stream = 0;
    req.max_tokens = 100;
    req.temperature = 0.5;
    req.messages_len = 1;
    body = build(&req);
    assert_json(body, "{\"model\":\"gpt-4o-mini\",\"max_tokens\":100,"
                      "\"temperature\":0.5,\"messages\":[{\"role\":"
                      "\"system\",\"content\":\"Be brief.\"}]}");
    json_decref(body);

    /* no model */
    req.model = NULL;
    assert_int_equal(loom__openai_build_body(&body, &req), LOOM_EINVALID);
    loom_messages_free(&m);
}

static void test_body_tools(void **state)
{
    json_t *params = json_loads("{\"type\":\"object\",\"properties\":{"
                                "\"city\":{\"type\":\"string\"}}}",
                                0, NULL);
    loom_tool_def tools[2] = {{"get_weather", "Weather now", params},
                              {"noargs", NULL, NULL}};
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    const char *tools_json =
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"description\":\"Weather now\",\"parameters\":{\"type\":"
        "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"noargs\","
        "\"parameters\":{\"type\":\"object\",\"properties\":{}}}}]";
    struct {
        loom_tool_choice_kind kind;
        char *fn;
        int parallel;
        const char *choice;
    } cases[] = {
        {LOOM_TOOL_CHOICE_AUTO, NULL, -1, "\"auto\""},
        {LOOM_TOOL_CHOICE_NONE, NULL, 0, "\"none\""},
        {LOOM_TOOL_CHOICE_REQUIRED, NULL, 1, "\"required\""},
        {LOOM_TOOL_CHOICE_FUNCTION, "get_weather", 1,
         "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}}"},
    };
    char want[2048];
    json_t *body;

    (void)state;
    req.model = "m";
    req.stream = 0;
    req.tools = tools;
    req.tools_len = 2;
    for (size_t i = 0; i < 4; i++) {
        req.tool_choice.kind = cases[i].kind;
        req.tool_choice.function = cases[i].fn;
        req.parallel_tool_calls = cases[i].parallel;
        snprintf(want, sizeof(want),
                 "{\"model\":\"m\",\"messages\":[],\"tools\":%s,"
                 "\"tool_choice\":%s%s}",
                 tools_json, cases[i].choice,
                 cases[i].parallel < 0    ? ""
                 : cases[i].parallel == 0 ? ",\"parallel_tool_calls\":false"
                                          : ",\"parallel_tool_calls\":true");
        body = build(&req);
        assert_json(body, want);
        json_decref(body);
    }
    /* no tools: neither tool_choice nor parallel_tool_calls */
    req.tools_len = 0;
    body = build(&req);
    assert_json(body, "{\"model\":\"m\",\"messages\":[]}");
    json_decref(body);
    /* a function choice without a name */
    req.tools_len = 2;
    req.tool_choice.kind = LOOM_TOOL_CHOICE_FUNCTION;
    req.tool_choice.function = NULL;
    assert_int_equal(loom__openai_build_body(&body, &req), LOOM_EINVALID);
    json_decref(params);
}

/* ---- error bodies ---------------------------------------------------- */

static int err_from(loom_upstream_error *e, long status, const char *body)
{
    return loom__openai_error_from_http(e, status, body, strlen(body), NULL);
}

static void test_error_mapping(void **state)
{
    static const struct {
        long status;
        loom_upstream_kind kind;
        int retry;
    } st[] = {
        {400, LOOM_UPSTREAM_BAD_REQUEST, 0},
        {401, LOOM_UPSTREAM_AUTH, 0},
        {403, LOOM_UPSTREAM_PERMISSION, 0},
        {404, LOOM_UPSTREAM_NOT_FOUND, 0},
        {408, LOOM_UPSTREAM_TIMEOUT, 1},
        {409, LOOM_UPSTREAM_CONFLICT, 1},
        {413, LOOM_UPSTREAM_TOO_LARGE, 0},
        {422, LOOM_UPSTREAM_UNPROCESSABLE, 0},
        {429, LOOM_UPSTREAM_RATE_LIMIT, 1},
        {500, LOOM_UPSTREAM_SERVER, 1},
        {502, LOOM_UPSTREAM_SERVER, 1},
        {503, LOOM_UPSTREAM_SERVER, 1},
        {529, LOOM_UPSTREAM_SERVER, 1},
        {418, LOOM_UPSTREAM_BAD_REQUEST, 0},
        {302, LOOM_UPSTREAM_PROTOCOL, 0},
        {200, LOOM_UPSTREAM_NONE, 0},
    };
    const char *openai =
        "{\"error\":{\"message\":\"Rate limit reached\",\"type\":"
        "\"requests\",\"param\":null,\"code\":\"rate_limit_exceeded\"}}";
    loom_upstream_error e = {0};
    char raw[800];

    (void)state;
    for (size_t i = 0; i < sizeof(st) / sizeof(st[0]); i++) {
        assert_int_equal(loom__openai_status_kind(st[i].status), st[i].kind);
        assert_int_equal(loom__openai_status_retryable(st[i].status),
                         st[i].retry);
        assert_int_equal(loom__openai_error_from_http(&e, st[i].status, openai,
                                                      strlen(openai),
                                                      "req_123"),
                         0);
        assert_int_equal(e.kind, st[i].kind);
        assert_int_equal(e.http_status, st[i].status);
        assert_string_equal(e.message, "Rate limit reached");
        assert_string_equal(e.type, "requests");
        assert_string_equal(e.request_id, "req_123");
    }
    /* code when there is no type */
    assert_int_equal(err_from(&e, 401,
                              "{\"error\":{\"message\":\"bad key\","
                              "\"code\":\"invalid_api_key\"}}"),
                     0);
    assert_string_equal(e.message, "bad key");
    assert_string_equal(e.type, "invalid_api_key");
    assert_null(e.request_id);
    /* vLLM, FastAPI, plain string error */
    assert_int_equal(err_from(&e, 400,
                              "{\"object\":\"error\",\"message\":"
                              "\"too long\",\"type\":"
                              "\"BadRequestError\"}"),
                     0);
    assert_string_equal(e.message, "too long");
    assert_string_equal(e.type, "BadRequestError");
    assert_int_equal(err_from(&e, 422, "{\"detail\":\"Not Found\"}"), 0);
    assert_string_equal(e.message, "Not Found");
    assert_int_equal(err_from(&e, 422, "{\"detail\":[{\"loc\":[\"body\"]}]}"),
                     0);
    assert_string_equal(e.message, "[{\"loc\":[\"body\"]}]");
    assert_int_equal(err_from(&e, 500, "{\"error\":\"boom\"}"), 0);
    assert_string_equal(e.message, "boom");
    /* raw text, cut at 500 bytes */
    assert_int_equal(err_from(&e, 502, "Bad Gateway\n"), 0);
    assert_string_equal(e.message, "Bad Gateway");
    assert_null(e.type);
    memset(raw, 'z', sizeof(raw));
    assert_int_equal(
        loom__openai_error_from_http(&e, 503, raw, sizeof(raw), NULL), 0);
    assert_int_equal(strlen(e.message), LOOM_OPENAI_MAX_ERROR_TEXT);
    /* empty body */
    assert_int_equal(loom__openai_error_from_http(&e, 504, "", 0, NULL), 0);
    assert_string_equal(e.message, "HTTP 504");
    assert_int_equal(e.kind, LOOM_UPSTREAM_SERVER);
    loom__upstream_error_clear(&e);
}

/* ---- retry timing ---------------------------------------------------- */

static void test_retry_after(void **state)
{
    time_t now = 1700000000; /* 2023-11-14T22:13:20Z */
    char date[64];
    struct tm tm;
    time_t later = now + 7;

    (void)state;
    assert_int_equal(loom__retry_after(NULL, NULL, now), -1);
    assert_int_equal(loom__retry_after(NULL, "1", now), 1000);
    assert_int_equal(loom__retry_after(NULL, " 20 ", now), 20000);
    assert_int_equal(loom__retry_after(NULL, "0", now), 0);
    assert_int_equal(loom__retry_after(NULL, "1.5", now), 1500);
    assert_int_equal(loom__retry_after("250", NULL, now), 250);
    /* retry-after-ms wins */
    assert_int_equal(loom__retry_after("250", "3", now), 250);
    assert_int_equal(loom__retry_after("junk", "3", now), 3000);
    assert_int_equal(loom__retry_after(NULL, "soon", now), -1);
    assert_int_equal(loom__retry_after(NULL, "-5", now), -1);
    /* HTTP dates */
    gmtime_r(&later, &tm);
    strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
    assert_int_equal(loom__retry_after(NULL, date, now), 7000);
    assert_int_equal(
        loom__retry_after(NULL, "Tue, 14 Nov 2023 22:13:30 GMT", now), 10000);
    assert_int_equal(
        loom__retry_after(NULL, "Tue, 14 Nov 2023 22:00:00 GMT", now), 0);
    /* a far date is reported as is, for the caller to refuse */
    assert_true(loom__retry_after(NULL, "Wed, 15 Nov 2023 22:13:20 GMT", now) >
                LOOM_RETRY_MAX_HONOURED_MS);
    assert_true(loom__retry_after(NULL, "3600", now) >
                LOOM_RETRY_MAX_HONOURED_MS);
}

static void test_backoff(void **state)
{
    unsigned seed = 42;

    (void)state;
    for (int i = 0; i < 200; i++) {
        long d1 = loom__retry_backoff(1, 500, 8000, &seed);
        long d3 = loom__retry_backoff(3, 500, 8000, &seed);
        long d9 = loom__retry_backoff(9, 500, 8000, &seed);
        assert_true(d1 >= 250 && d1 <= 500);
        assert_true(d3 >= 1000 && d3 <= 2000);
        assert_true(d9 >= 4000 && d9 <= 8000); /* capped */
    }
    assert_int_equal(loom__retry_backoff(1, 0, 8000, &seed), 0);
    assert_int_equal(loom__retry_backoff(40, 500, 1, &seed) <= 1, 1);
}

static void *cancel_later(void *arg)
{
    struct timespec ts = {0, 100 * 1000000L};

    nanosleep(&ts, NULL);
    loom_cancel_set(arg);
    return NULL;
}

static void test_retry_sleep(void **state)
{
    loom_cancel cancel = LOOM_CANCEL_INIT;
    struct timespec a, b;
    pthread_t th;
    long ms;

    (void)state;
    clock_gettime(CLOCK_MONOTONIC, &a);
    assert_int_equal(loom__retry_sleep(60, &cancel), 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    ms = (b.tv_sec - a.tv_sec) * 1000 + (b.tv_nsec - a.tv_nsec) / 1000000;
    assert_true(ms >= 60);
    /* a 60 s sleep ends when cancelled */
    assert_int_equal(pthread_create(&th, NULL, cancel_later, &cancel), 0);
    assert_int_equal(loom__retry_sleep(60000, &cancel), LOOM_ECANCELED);
    pthread_join(th, NULL);
    clock_gettime(CLOCK_MONOTONIC, &a);
    ms = (a.tv_sec - b.tv_sec) * 1000 + (a.tv_nsec - b.tv_nsec) / 1000000;
    assert_true(ms < 30000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors),
        cmocka_unit_test(test_tool_calls_interleaved),
        cmocka_unit_test(test_tool_calls_quirks),
        cmocka_unit_test(test_reasoning),
        cmocka_unit_test(test_stream_error),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_callback_abort),
        cmocka_unit_test(test_limit_tool_calls),
        cmocka_unit_test(test_limit_args),
        cmocka_unit_test(test_limit_text),
        cmocka_unit_test(test_limit_custom),
        cmocka_unit_test(test_complete_body),
        cmocka_unit_test(test_body_messages),
        cmocka_unit_test(test_body_tools),
        cmocka_unit_test(test_error_mapping),
        cmocka_unit_test(test_retry_after),
        cmocka_unit_test(test_backoff),
        cmocka_unit_test(test_retry_sleep),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
