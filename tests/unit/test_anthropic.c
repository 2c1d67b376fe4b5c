/*
 * Unit tests of the Anthropic Messages wire code (llm/anthropic.h): no
 * network. Recorded streams from LOOM_VECTORS_DIR/anthropic are decoded
 * whole, at every two-piece split and one byte at a time; hand-written
 * streams and message objects cover thinking with signatures, redacted
 * thinking, parallel tool calls, cache usage, errors, truncation and
 * every limit; request bodies are compared as JSON for every message
 * kind, tool choice, thinking and caching option, and the provider_state
 * of an answer is sent back unchanged.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/error.h"
#include "llm/anthropic.h"
#include "loom/buf.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- an event collector ---------------------------------------------- */

#define NSLOTS 8

typedef struct {
    loom_buf text;
    loom_buf reasoning;
    loom_buf args[NSLOTS]; /* TOOL_CALL_DELTA fragments by tool_index */
    char *ids[NSLOTS];
    char *names[NSLOTS];
    loom_buf order; /* one letter per event: T R D C U F E */
    loom_tool_call calls[NSLOTS];
    size_t calls_len;
    loom_usage usage;
    char finish[32];
    char error[256];
    int abort_on; /* abort when this event type arrives (-1: never) */
} collector;

static void col_init(collector *c)
{
    memset(c, 0, sizeof(*c));
    loom_buf_init(&c->text, LOOM_BUF_UNLIMITED);
    loom_buf_init(&c->reasoning, LOOM_BUF_UNLIMITED);
    loom_buf_init(&c->order, LOOM_BUF_UNLIMITED);
    for (int i = 0; i < NSLOTS; i++)
        loom_buf_init(&c->args[i], LOOM_BUF_UNLIMITED);
    c->abort_on = -1;
}

static void col_free(collector *c)
{
    loom_buf_free(&c->text);
    loom_buf_free(&c->reasoning);
    loom_buf_free(&c->order);
    for (int i = 0; i < NSLOTS; i++) {
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
    static const char letters[] = "TRDCUFE";

    loom_buf_putc(&c->order, letters[ev->type]);
    switch (ev->type) {
    case LOOM_LLM_TEXT:
        loom_buf_put(&c->text, ev->text, ev->text_len);
        break;
    case LOOM_LLM_REASONING:
        loom_buf_put(&c->reasoning, ev->text, ev->text_len);
        break;
    case LOOM_LLM_TOOL_CALL_DELTA:
        assert_true(ev->tool_index >= 0 && ev->tool_index < NSLOTS);
        assert_non_null(ev->args_delta);
        loom_buf_puts(&c->args[ev->tool_index], ev->args_delta);
        if (ev->tool_id) {
            assert_null(c->ids[ev->tool_index]);
            c->ids[ev->tool_index] = strdup(ev->tool_id);
        }
        if (ev->tool_name)
            c->names[ev->tool_index] = strdup(ev->tool_name);
        break;
    case LOOM_LLM_TOOL_CALLS:
        assert_true(ev->calls_len <= NSLOTS);
        for (size_t i = 0; i < ev->calls_len; i++) {
            c->calls[i].id = strdup(ev->calls[i].id);
            c->calls[i].name = strdup(ev->calls[i].name);
            c->calls[i].arguments = strdup(ev->calls[i].arguments);
        }
        c->calls_len = ev->calls_len;
        break;
    case LOOM_LLM_USAGE:
        c->usage = ev->usage;
        break;
    case LOOM_LLM_FINISH:
        snprintf(c->finish, sizeof(c->finish), "%s", ev->finish_reason);
        break;
    case LOOM_LLM_ERROR:
        snprintf(c->error, sizeof(c->error), "%s", ev->error_message);
        break;
    }
    return (int)ev->type == c->abort_on;
}

/* Feeds data whole (split 0), in two pieces at split, or one byte at a
 * time (split SIZE_MAX) to a decoder told the answer mode, ends the stream
 * and exports into resp (zeroed by the caller). Returns the first error. */
static int decode_as(int mode, const char *data, size_t len, size_t split,
                     collector *c, loom_llm_response *resp,
                     const loom__anthropic_limits *lim)
{
    loom__anthropic_decoder *d;
    int rc = 0;

    assert_int_equal(loom__anthropic_decoder_new(&d, lim, col_cb, c), 0);
    loom__anthropic_decoder_set_answer(d, mode);
    if (split == SIZE_MAX) {
        for (size_t i = 0; !rc && i < len; i++)
            rc = loom__anthropic_decoder_feed(d, data + i, 1);
    } else if (split == 0) {
        rc = loom__anthropic_decoder_feed(d, data, len);
    } else {
        rc = loom__anthropic_decoder_feed(d, data, split);
        if (!rc)
            rc = loom__anthropic_decoder_feed(d, data + split, len - split);
    }
    if (!rc)
        rc = loom__anthropic_decoder_finish(d);
    if (resp)
        assert_int_equal(loom__anthropic_decoder_export(d, resp), 0);
    loom__anthropic_decoder_free(d);
    return rc;
}

static int decode(const char *data, size_t len, size_t split, collector *c,
                  loom_llm_response *resp, const loom__anthropic_limits *lim)
{
    return decode_as(LOOM__ANTHROPIC_ANSWER_NONE, data, len, split, c, resp,
                     lim);
}

static int decode_str(const char *s, collector *c, loom_llm_response *resp,
                      const loom__anthropic_limits *lim)
{
    return decode(s, strlen(s), 0, c, resp, lim);
}

/* A whole message object, to a decoder told the answer mode. */
static int complete_as(int mode, const char *s, collector *c,
                       loom_llm_response *resp,
                       const loom__anthropic_limits *lim)
{
    loom__anthropic_decoder *d;
    int rc;

    assert_int_equal(loom__anthropic_decoder_new(&d, lim, col_cb, c), 0);
    loom__anthropic_decoder_set_answer(d, mode);
    rc = loom__anthropic_decoder_complete(d, s, strlen(s));
    if (resp)
        assert_int_equal(loom__anthropic_decoder_export(d, resp), 0);
    loom__anthropic_decoder_free(d);
    return rc;
}

static int complete_str(const char *s, collector *c, loom_llm_response *resp,
                        const loom__anthropic_limits *lim)
{
    return complete_as(LOOM__ANTHROPIC_ANSWER_NONE, s, c, resp, lim);
}

/* Asserts that the JSON text got equals the JSON text want. */
static void assert_json_text(const char *got, const char *want)
{
    json_t *g = got ? json_loads(got, JSON_DECODE_ANY, NULL) : NULL;
    json_t *w = json_loads(want, JSON_DECODE_ANY, NULL);

    assert_non_null(w);
    if (!g || !json_equal(g, w)) {
        fprintf(stderr, "got:  %s\nwant: %s\n", got ? got : "(null)", want);
        fail();
    }
    json_decref(g);
    json_decref(w);
}

/* Asserts that v equals the JSON text want. */
static void assert_json(const json_t *v, const char *want)
{
    char *s = v ? json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;

    assert_json_text(s, want);
    free(s);
}

/* Server-Sent Events framing for one event. */
#define EV(name, data) "event: " name "\ndata: " data "\n\n"

/* ---- recorded vectors ------------------------------------------------ */

typedef struct {
    const char *file;
    const char *text;
    const char *finish;
    long prompt, completion;
    const char *call_name; /* NULL: no call */
    const char *call_args;
    const char *call_id;
    const char *response_id;
} vector_case;

static const vector_case vectors[] = {
    {"anthropic/basic_response.sse", "Hello there!", "stop", 11, 6, NULL, NULL,
     NULL, "msg_4QpJur2dWWDjF6C758FbBw5vm12BaVipnK"},
    {"anthropic/tool_use_response.sse",
     "I'll check the current weather in Paris for you.", "tool_calls", 377, 65,
     "get_weather", "{\"location\": \"Paris\"}",
     "toolu_01NRLabsLyVHZPKxbKvkfSMn", "msg_019Q1hrJbZG26Fb9BQhrkHEr"},
};

static void check_vector(const vector_case *v, const char *data, size_t len,
                         size_t split)
{
    loom_llm_response resp = {0};
    collector c;

    col_init(&c);
    assert_int_equal(decode(data, len, split, &c, &resp, NULL), 0);
    assert_string_equal(loom_buf_cstr(&c.text), v->text);
    assert_string_equal(resp.text, v->text);
    assert_null(resp.reasoning);
    assert_string_equal(resp.finish_reason, v->finish);
    assert_string_equal(c.finish, v->finish);
    assert_string_equal(resp.response_id, v->response_id);
    assert_int_equal(resp.usage.prompt_tokens, v->prompt);
    assert_int_equal(resp.usage.completion_tokens, v->completion);
    assert_int_equal(resp.usage.total_tokens, v->prompt + v->completion);
    assert_int_equal(resp.usage.cached_tokens, 0);
    assert_int_equal(resp.usage.cache_write_tokens, 0);
    assert_null(resp.provider_state); /* no thinking: nothing to keep */
    if (v->call_name) {
        assert_int_equal(resp.tool_calls_len, 1);
        assert_string_equal(resp.tool_calls[0].name, v->call_name);
        assert_string_equal(resp.tool_calls[0].arguments, v->call_args);
        assert_string_equal(resp.tool_calls[0].id, v->call_id);
        assert_string_equal(loom_buf_cstr(&c.args[0]), v->call_args);
        assert_string_equal(c.ids[0], v->call_id);
        assert_string_equal(c.names[0], v->call_name);
        /* USAGE, TOOL_CALLS, FINISH close the answer, in that order. */
        assert_string_equal(loom_buf_cstr(&c.order) + c.order.len - 3, "UCF");
    } else {
        assert_int_equal(resp.tool_calls_len, 0);
        assert_string_equal(loom_buf_cstr(&c.order), "TTTUF");
    }
    loom_llm_response_clear(&resp);
    col_free(&c);
}

static void test_vectors(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(vectors) / sizeof(vectors[0]); i++) {
        char *path = test_vector_path(vectors[i].file);
        size_t len;
        char *data = test_read_file(path, &len);

        assert_non_null(data);
        check_vector(&vectors[i], data, len, 0);
        check_vector(&vectors[i], data, len, SIZE_MAX);
        for (size_t k = 1; k < len; k++)
            check_vector(&vectors[i], data, len, k);
        free(data);
        free(path);
    }
}

/* ---- thinking, parallel calls, state ----------------------------------- */

static const char thinking_stream[] = EV(
    "message_start",
    "{\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":"
    "\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"c\","
    "\"usage\":{\"input_tokens\":5,\"cache_creation_input_tokens\":100,"
    "\"cache_read_input_tokens\":200,\"output_tokens\":1}}}")
    EV("content_block_start",
       "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":"
       "{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}")
        EV("ping", "{\"type\": \"ping\"}") EV(
            "content_block_delta",
            "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
            "\"thinking_delta\",\"thinking\":\"Let me \"}}")
            EV("content_block_delta",
               "{\"type\":\"content_block_delta\","
               "\"index\":0,\"delta\":{\"type\":"
               "\"thinking_delta\",\"thinking\":\"think."
               "\"}}") EV("content_block_delta",
                          "{\"type\":\"content_block_"
                          "delta\",\"index\":0,"
                          "\"delta\":{\"type\":"
                          "\"signature_delta\","
                          "\"signature\":\"EqQBsig==\"}"
                          "}") EV("content_block_stop",
                                  "{\"type\":\"content_block_stop\","
                                  "\"index\":0}")
                EV("content_block_start", "{\"type\":\"content_block_start\","
                                          "\"index\":1,\"content_block\":"
                                          "{\"type\":\"redacted_thinking\","
                                          "\"data\":\"EmwKAhgBredacted\"}}")
                    EV("content_block_stop",
                       "{\"type\":\"content_block_stop\","
                       "\"index\":1}") EV("content_block_start",
                                          "{\"type\":\"content_block_start\","
                                          "\"index\":2,"
                                          "\"content_block\":"
                                          "{\"type\":\"text\",\"text\":\"\"}}")
                        EV("content_block_delta",
                           "{\"type\":\"content_block_delta\",\"index\":2,"
                           "\"delta\":{\"type\":"
                           "\"text_delta\",\"text\":\"Checking both.\"}}")
                            EV("content_block_stop",
                               "{\"type\":\"content_"
                               "block_stop\",\"index\":"
                               "2}") EV("content_block_start",
                                        "{\"type\":\"content_block_start\","
                                        "\"index\":3,"
                                        "\"content_block\":"
                                        "{\"type\":\"tool_use\",\"id\":\"toolu_"
                                        "A\","
                                        "\"name\":\"get_weather\","
                                        "\"input\":{}}}")
                                EV("content_block_delta",
                                   "{\"type\":\"content_block_delta\","
                                   "\"index\":3,\"delta\":{\"type\":"
                                   "\"input_json_delta\",\"partial_json\":\"\"}"
                                   "}") EV("content_block_delta",
                                           "{\"type\":\"content_block_delta\","
                                           "\"index\":3,\"delta\":{\"type\":"
                                           "\"input_json_delta\",\"partial_"
                                           "json\":\"{\\\"city\\\":\"}}")
                                    EV("content_block_delta",
                                       "{\"type\":\"content_block_delta\","
                                       "\"index\":3,\"delta\":{\"type\":"
                                       "\"input_json_delta\",\"partial_json\":"
                                       "\"\\\"Paris\\\"}\"}}")
                                        EV("content_block_stop",
                                           "{\"type\":\"content_block_stop\","
                                           "\"index\":3}")
                                            EV("content_block_start",
                                               "{\"type\":\"content_block_"
                                               "start\",\"index\":4,\"content_"
                                               "block\":"
                                               "{\"type\":\"tool_use\",\"id\":"
                                               "\"toolu_B\",\"name\":\"get_"
                                               "time\","
                                               "\"input\":{}}}")
                                                EV("content_block_delta",
                                                   "{\"type\":\"content_block_"
                                                   "delta\",\"index\":4,"
                                                   "\"delta\":{\"type\":"
                                                   "\"input_json_delta\","
                                                   "\"partial_json\":\"{"
                                                   "\\\"tz\\\":\\\"CET\\\"}\"}"
                                                   "}") EV("content_block_stop",
                                                           "{\"type\":"
                                                           "\"content_block_"
                                                           "stop\",\"index\":"
                                                           "4}")
                                                    EV("message_delta",
                                                       "{\"type\":\"message_"
                                                       "delta\",\"delta\":{"
                                                       "\"stop_reason\":\"tool_"
                                                       "use\","
                                                       "\"stop_sequence\":null}"
                                                       ",\"usage\":{\"output_"
                                                       "tokens\":42}}")
                                                        EV("message_stop",
                                                           "{\"type\":"
                                                           "\"message_stop\"}");

/* The same answer, not streamed. */
static const char thinking_message[] =
    "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\","
    "\"model\":\"c\",\"content\":["
    "{\"type\":\"thinking\",\"thinking\":\"Let me think.\",\"signature\":"
    "\"EqQBsig==\"},"
    "{\"type\":\"redacted_thinking\",\"data\":\"EmwKAhgBredacted\"},"
    "{\"type\":\"text\",\"text\":\"Checking both.\"},"
    "{\"type\":\"tool_use\",\"id\":\"toolu_A\",\"name\":\"get_weather\","
    "\"input\":{\"city\":\"Paris\"}},"
    "{\"type\":\"tool_use\",\"id\":\"toolu_B\",\"name\":\"get_time\","
    "\"input\":{\"tz\":\"CET\"}}],"
    "\"stop_reason\":\"tool_use\",\"stop_sequence\":null,\"usage\":"
    "{\"input_tokens\":5,\"cache_creation_input_tokens\":100,"
    "\"cache_read_input_tokens\":200,\"output_tokens\":42}}";

static const char thinking_state[] =
    "{\"anthropic\":{\"content\":["
    "{\"type\":\"thinking\",\"thinking\":\"Let me think.\",\"signature\":"
    "\"EqQBsig==\"},"
    "{\"type\":\"redacted_thinking\",\"data\":\"EmwKAhgBredacted\"},"
    "{\"type\":\"text\"},{\"type\":\"tool_use\",\"id\":\"toolu_A\"},"
    "{\"type\":\"tool_use\",\"id\":\"toolu_B\"}]}}";

static void check_thinking_answer(const collector *c,
                                  const loom_llm_response *r)
{
    assert_string_equal(r->text, "Checking both.");
    assert_string_equal(r->reasoning, "Let me think.");
    assert_string_equal(loom_buf_cstr(&c->reasoning), "Let me think.");
    assert_string_equal(r->finish_reason, "tool_calls");
    assert_string_equal(r->response_id, "msg_1");
    assert_int_equal(r->tool_calls_len, 2);
    assert_string_equal(r->tool_calls[0].id, "toolu_A");
    assert_string_equal(r->tool_calls[0].name, "get_weather");
    assert_string_equal(r->tool_calls[0].arguments, "{\"city\":\"Paris\"}");
    assert_string_equal(r->tool_calls[1].id, "toolu_B");
    assert_string_equal(r->tool_calls[1].name, "get_time");
    assert_string_equal(r->tool_calls[1].arguments, "{\"tz\":\"CET\"}");
    assert_int_equal(c->calls_len, 2);
    assert_string_equal(c->calls[1].arguments, "{\"tz\":\"CET\"}");
    assert_string_equal(c->ids[1], "toolu_B");
    assert_string_equal(loom_buf_cstr(&c->args[0]), "{\"city\":\"Paris\"}");
    /* prompt = input + cache writes + cache reads */
    assert_int_equal(r->usage.prompt_tokens, 305);
    assert_int_equal(r->usage.completion_tokens, 42);
    assert_int_equal(r->usage.total_tokens, 347);
    assert_int_equal(r->usage.cached_tokens, 200);
    assert_int_equal(r->usage.cache_write_tokens, 100);
    assert_int_equal(r->usage.reasoning_tokens, 0);
    assert_int_equal(c->usage.prompt_tokens, 305);
    assert_true(r->output_started);
    assert_json_text(r->provider_state, thinking_state);
}

static void test_thinking_stream(void **state)
{
    size_t len = strlen(thinking_stream);

    (void)state;
    for (size_t k = 0; k < len; k += 7) {
        loom_llm_response resp = {0};
        collector c;
        col_init(&c);
        assert_int_equal(decode(thinking_stream, len, k, &c, &resp, NULL), 0);
        check_thinking_answer(&c, &resp);
        /* the empty first input_json_delta is not an event */
        assert_string_equal(loom_buf_cstr(&c.order), "RRTDDDDDUCF");
        loom_llm_response_clear(&resp);
        col_free(&c);
    }
}

static void test_thinking_message(void **state)
{
    loom_llm_response resp = {0};
    collector c;

    (void)state;
    col_init(&c);
    assert_int_equal(complete_str(thinking_message, &c, &resp, NULL), 0);
    check_thinking_answer(&c, &resp);
    assert_string_equal(loom_buf_cstr(&c.order), "RTDDUCF");
    loom_llm_response_clear(&resp);
    col_free(&c);
}

/* ---- request bodies ----------------------------------------------------- */

static json_t *build(const loom_llm_request *req)
{
    json_t *body = NULL;

    assert_int_equal(loom__anthropic_build_body(&body, req), 0);
    assert_non_null(body);
    return body;
}

static void test_state_round_trip(void **state)
{
    loom_llm_response resp = {0};
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_messages m = {0};
    collector c;
    json_t *body;

    (void)state;
    col_init(&c);
    assert_int_equal(decode_str(thinking_stream, &c, &resp, NULL), 0);
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_USER, "Weather?"), 0);
    assert_int_equal(loom_messages_add_assistant(&m, resp.text, resp.reasoning,
                                                 resp.tool_calls,
                                                 resp.tool_calls_len),
                     0);
    m.items[1].provider_state = strdup(resp.provider_state);
    assert_int_equal(
        loom_messages_add_tool_result(&m, "toolu_A", "get_weather", "sunny"),
        0);
    assert_int_equal(
        loom_messages_add_tool_result(&m, "toolu_B", "get_time", "noon"), 0);
    req.model = "claude-x";
    req.messages = m.items;
    req.messages_len = m.len;
    req.thinking_budget = 2048;
    body = build(&req);
    /* The thinking blocks go back unchanged, in their place. */
    assert_json(json_object_get(body, "messages"),
                "[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                "\"text\":\"Weather?\"}]},"
                "{\"role\":\"assistant\",\"content\":["
                "{\"type\":\"thinking\",\"thinking\":\"Let me think.\","
                "\"signature\":\"EqQBsig==\"},"
                "{\"type\":\"redacted_thinking\",\"data\":"
                "\"EmwKAhgBredacted\"},"
                "{\"type\":\"text\",\"text\":\"Checking both.\"},"
                "{\"type\":\"tool_use\",\"id\":\"toolu_A\",\"name\":"
                "\"get_weather\",\"input\":{\"city\":\"Paris\"}},"
                "{\"type\":\"tool_use\",\"id\":\"toolu_B\",\"name\":"
                "\"get_time\",\"input\":{\"tz\":\"CET\"}}]},"
                "{\"role\":\"user\",\"content\":["
                "{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_A\","
                "\"content\":\"sunny\"},"
                "{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_B\","
                "\"content\":\"noon\"}]}]");
    /* thinking stays on: the loop's last assistant turn has its thinking */
    assert_json(json_object_get(body, "thinking"),
                "{\"type\":\"enabled\",\"budget_tokens\":2048}");
    json_decref(body);

    /* Another provider's state (or none) is not read: plain blocks, and
     * thinking is off for a loop it cannot continue. */
    free(m.items[1].provider_state);
    m.items[1].provider_state =
        strdup("{\"gemini\":{\"parts\":[]},\"anthropic\":7}");
    body = build(&req);
    assert_json(json_array_get(json_object_get(body, "messages"), 1),
                "{\"role\":\"assistant\",\"content\":["
                "{\"type\":\"text\",\"text\":\"Checking both.\"},"
                "{\"type\":\"tool_use\",\"id\":\"toolu_A\",\"name\":"
                "\"get_weather\",\"input\":{\"city\":\"Paris\"}},"
                "{\"type\":\"tool_use\",\"id\":\"toolu_B\",\"name\":"
                "\"get_time\",\"input\":{\"tz\":\"CET\"}}]}");
    assert_null(json_object_get(body, "thinking"));
    json_decref(body);

    /* A state whose layout names a call the message no longer has, and
     * a message with a call the layout does not name: both still sent. */
    free(m.items[1].provider_state);
    m.items[1].provider_state = strdup(
        "{\"anthropic\":{\"content\":[{\"type\":\"tool_use\",\"id\":"
        "\"toolu_B\"},{\"type\":\"thinking\",\"thinking\":\"t\","
        "\"signature\":\"s\"},{\"type\":\"tool_use\",\"id\":\"gone\"}]}}");
    body = build(&req);
    assert_json(json_array_get(json_object_get(body, "messages"), 1),
                "{\"role\":\"assistant\",\"content\":["
                "{\"type\":\"tool_use\",\"id\":\"toolu_B\",\"name\":"
                "\"get_time\",\"input\":{\"tz\":\"CET\"}},"
                "{\"type\":\"thinking\",\"thinking\":\"t\","
                "\"signature\":\"s\"},"
                "{\"type\":\"text\",\"text\":\"Checking both.\"},"
                "{\"type\":\"tool_use\",\"id\":\"toolu_A\",\"name\":"
                "\"get_weather\",\"input\":{\"city\":\"Paris\"}}]}");
    json_decref(body);
    loom_messages_free(&m);
    loom_llm_response_clear(&resp);
    col_free(&c);
}

/* A conversation with every message kind. */
static void make_conversation(loom_messages *m)
{
    loom_tool_call calls[2] = {
        {"call.1/x", "echo", "{\"text\":\"a\"}"},
        {"c2", "fail", "not json"},
    };

    memset(m, 0, sizeof(*m));
    assert_int_equal(loom_messages_add(m, LOOM_ROLE_SYSTEM, "S1"), 0);
    assert_int_equal(loom_messages_add(m, LOOM_ROLE_SYSTEM, "S2"), 0);
    assert_int_equal(loom_messages_add(m, LOOM_ROLE_USER, "Hi"), 0);
    assert_int_equal(loom_messages_add_assistant(m, "Sure", "hmm", calls, 2),
                     0);
    assert_int_equal(
        loom_messages_add_tool_result(m, "call.1/x", "echo", "echo:a"), 0);
    assert_int_equal(
        loom_messages_add_tool_result(m, "c2", "fail", "Error: disk on fire"),
        0);
    assert_int_equal(loom_messages_add(m, LOOM_ROLE_SYSTEM, "limit reached"),
                     0);
    assert_int_equal(loom_messages_add(m, LOOM_ROLE_USER, "and?"), 0);
    assert_int_equal(loom_messages_add_assistant(m, "Done.", NULL, NULL, 0), 0);
    assert_int_equal(loom_messages_add(m, LOOM_ROLE_USER, "bye"), 0);
}

static const char conversation_json[] =
    "[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi\"}]},"
    "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":"
    "\"Sure\"},{\"type\":\"tool_use\",\"id\":\"call_1_x\",\"name\":\"echo\","
    "\"input\":{\"text\":\"a\"}},{\"type\":\"tool_use\",\"id\":\"c2\","
    "\"name\":\"fail\",\"input\":{}}]},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
    "\"tool_use_id\":\"call_1_x\",\"content\":\"echo:a\"},"
    "{\"type\":\"tool_result\",\"tool_use_id\":\"c2\",\"content\":"
    "\"Error: disk on fire\",\"is_error\":true},"
    "{\"type\":\"text\",\"text\":\"limit reached\"},"
    "{\"type\":\"text\",\"text\":\"and?\"}]},"
    "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":"
    "\"Done.\"}]},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"bye\"}]}]";

static json_t *echo_schema(void)
{
    return json_pack("{s:s,s:{s:{s:s}}}", "type", "object", "properties",
                     "text", "type", "string");
}

static void test_body_conversation(void **state)
{
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    json_t *schema = echo_schema(), *body, *msgs;
    loom_tool_def tools[2] = {{"echo", "Echoes.", schema},
                              {"fail", NULL, NULL}};
    loom_messages m;

    (void)state;
    make_conversation(&m);
    req.model = "claude-x";
    req.messages = m.items;
    req.messages_len = m.len;
    req.tools = tools;
    req.tools_len = 2;
    req.temperature = 0.5;
    body = build(&req);
    msgs = json_incref(json_object_get(body, "messages"));
    assert_json(msgs, conversation_json);
    json_object_del(body, "messages");
    assert_json(body,
                "{\"model\":\"claude-x\",\"max_tokens\":4096,"
                "\"system\":[{\"type\":\"text\",\"text\":\"S1\"},"
                "{\"type\":\"text\",\"text\":\"S2\"}],"
                "\"tools\":[{\"name\":\"echo\",\"description\":\"Echoes.\","
                "\"input_schema\":{\"type\":\"object\",\"properties\":"
                "{\"text\":{\"type\":\"string\"}}}},"
                "{\"name\":\"fail\",\"input_schema\":{\"type\":\"object\","
                "\"properties\":{}}}],"
                "\"tool_choice\":{\"type\":\"auto\"},"
                "\"temperature\":0.5,\"stream\":true}");
    json_decref(msgs);
    json_decref(body);

    /* Without tools, the history's tool blocks need a tool list: one
     * that cannot be chosen. */
    req.tools = NULL;
    req.tools_len = 0;
    req.stream = 0;
    req.max_tokens = 123;
    body = build(&req);
    assert_json(json_object_get(body, "messages"), conversation_json);
    assert_json(json_object_get(body, "tools"),
                "[{\"name\":\"loom_no_tools\",\"description\":\"Not "
                "available: no tools can be called now.\",\"input_schema\":"
                "{\"type\":\"object\",\"properties\":{}}}]");
    assert_json(json_object_get(body, "tool_choice"), "{\"type\":\"none\"}");
    assert_json(json_object_get(body, "max_tokens"), "123");
    assert_null(json_object_get(body, "stream"));
    json_decref(body);

    /* No tool blocks, no tools: neither key. */
    req.messages_len = 3;
    body = build(&req);
    assert_null(json_object_get(body, "tools"));
    assert_null(json_object_get(body, "tool_choice"));
    assert_json(json_object_get(body, "messages"),
                "[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                "\"text\":\"Hi\"}]}]");
    json_decref(body);
    json_decref(schema);
    loom_messages_free(&m);
}

static void test_body_edges(void **state)
{
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_tool_call call = {"t1", "echo", "[1,2]"};
    loom_messages m = {0};
    json_t *body;

    (void)state;
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_USER,
                                       "a\xff"
                                       "b"),
                     0);
    assert_int_equal(loom_messages_add_assistant(&m, "", NULL, &call, 1), 0);
    /* a user message between a call and its result: the result still
     * opens the turn */
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_USER, "wait"), 0);
    assert_int_equal(loom_messages_add_tool_result(&m, "t1", "echo", ""), 0);
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_USER, ""), 0);
    req.model = "claude-x";
    req.messages = m.items;
    req.messages_len = m.len;
    body = build(&req);
    assert_json(json_object_get(body, "messages"),
                "[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                "\"text\":\"a\xEF\xBF\xBD"
                "b\"}]},"
                "{\"role\":\"assistant\",\"content\":[{\"type\":"
                "\"tool_use\",\"id\":\"t1\",\"name\":\"echo\",\"input\":{}}]},"
                "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\","
                "\"tool_use_id\":\"t1\"},{\"type\":\"text\",\"text\":"
                "\"wait\"}]}]");
    /* no system messages: no system key */
    assert_null(json_object_get(body, "system"));
    json_decref(body);

    req.model = "";
    assert_int_equal(loom__anthropic_build_body(&body, &req), LOOM_EINVALID);
    assert_null(body);
    loom_messages_free(&m);
}

typedef struct {
    loom_tool_choice_kind kind;
    const char *function;
    int parallel;
    const char *want;
} choice_case;

static void test_body_tool_choice(void **state)
{
    static const choice_case cases[] = {
        {LOOM_TOOL_CHOICE_AUTO, NULL, -1, "{\"type\":\"auto\"}"},
        {LOOM_TOOL_CHOICE_AUTO, NULL, 1, "{\"type\":\"auto\"}"},
        {LOOM_TOOL_CHOICE_AUTO, NULL, 0,
         "{\"type\":\"auto\",\"disable_parallel_tool_use\":true}"},
        {LOOM_TOOL_CHOICE_NONE, NULL, 0, "{\"type\":\"none\"}"},
        {LOOM_TOOL_CHOICE_REQUIRED, NULL, -1, "{\"type\":\"any\"}"},
        {LOOM_TOOL_CHOICE_REQUIRED, NULL, 0,
         "{\"type\":\"any\",\"disable_parallel_tool_use\":true}"},
        {LOOM_TOOL_CHOICE_FUNCTION, "echo", -1,
         "{\"type\":\"tool\",\"name\":\"echo\"}"},
    };
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_tool_def tool = {"echo", "Echoes.", NULL};
    loom_messages m = {0};
    json_t *body;

    (void)state;
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_USER, "Hi"), 0);
    req.model = "claude-x";
    req.messages = m.items;
    req.messages_len = m.len;
    req.tools = &tool;
    req.tools_len = 1;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        req.tool_choice.kind = cases[i].kind;
        req.tool_choice.function = (char *)cases[i].function;
        req.parallel_tool_calls = cases[i].parallel;
        body = build(&req);
        assert_json(json_object_get(body, "tool_choice"), cases[i].want);
        json_decref(body);
    }
    req.tool_choice.kind = LOOM_TOOL_CHOICE_FUNCTION;
    req.tool_choice.function = NULL;
    assert_int_equal(loom__anthropic_build_body(&body, &req), LOOM_EINVALID);
    loom_messages_free(&m);
}

static void test_body_thinking(void **state)
{
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_tool_def tool = {"echo", "Echoes.", NULL};
    loom_tool_call call = {"t1", "echo", "{}"};
    loom_messages m = {0};
    json_t *body;

    (void)state;
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_USER, "Hi"), 0);
    req.model = "claude-x";
    req.messages = m.items;
    req.messages_len = m.len;
    req.temperature = 0.7;

    /* unset: nothing, temperature sent */
    body = build(&req);
    assert_null(json_object_get(body, "thinking"));
    assert_json(json_object_get(body, "temperature"), "0.7");
    json_decref(body);

    /* a budget: thinking, max_tokens above it, no temperature */
    req.thinking_budget = 2000;
    body = build(&req);
    assert_json(json_object_get(body, "thinking"),
                "{\"type\":\"enabled\",\"budget_tokens\":2000}");
    assert_json(json_object_get(body, "max_tokens"), "6096");
    assert_null(json_object_get(body, "temperature"));
    json_decref(body);

    req.max_tokens = 8000;
    body = build(&req);
    assert_json(json_object_get(body, "max_tokens"), "8000");
    json_decref(body);

    req.max_tokens = 2000;
    assert_int_equal(loom__anthropic_build_body(&body, &req), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "thinking budget"));
    req.max_tokens = 0;

    /* a forced tool choice: the API takes no thinking with it */
    req.tools = &tool;
    req.tools_len = 1;
    req.tool_choice.kind = LOOM_TOOL_CHOICE_REQUIRED;
    body = build(&req);
    assert_null(json_object_get(body, "thinking"));
    assert_json(json_object_get(body, "temperature"), "0.7");
    assert_json(json_object_get(body, "max_tokens"), "4096");
    json_decref(body);
    req.tool_choice.kind = LOOM_TOOL_CHOICE_AUTO;

    /* a tool loop whose assistant turn has no thinking to send back */
    assert_int_equal(loom_messages_add_assistant(&m, NULL, NULL, &call, 1), 0);
    assert_int_equal(loom_messages_add_tool_result(&m, "t1", "echo", "x"), 0);
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_SYSTEM, "limit"), 0);
    req.messages = m.items;
    req.messages_len = m.len;
    body = build(&req);
    assert_null(json_object_get(body, "thinking"));
    json_decref(body);

    /* with it, thinking goes on */
    m.items[1].provider_state =
        strdup("{\"anthropic\":{\"content\":[{\"type\":\"redacted_thinking\","
               "\"data\":\"d\"},{\"type\":\"tool_use\",\"id\":\"t1\"}]}}");
    body = build(&req);
    assert_json(json_object_get(body, "thinking"),
                "{\"type\":\"enabled\",\"budget_tokens\":2000}");
    assert_json(json_array_get(json_object_get(body, "messages"), 1),
                "{\"role\":\"assistant\",\"content\":[{\"type\":"
                "\"redacted_thinking\",\"data\":\"d\"},{\"type\":"
                "\"tool_use\",\"id\":\"t1\",\"name\":\"echo\",\"input\":{}}]}");
    json_decref(body);

    /* once the user speaks again, a new turn may think */
    free(m.items[1].provider_state);
    m.items[1].provider_state = NULL;
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_USER, "more"), 0);
    req.messages = m.items;
    req.messages_len = m.len;
    body = build(&req);
    assert_non_null(json_object_get(body, "thinking"));
    json_decref(body);
    loom_messages_free(&m);
}

static int count_cache_marks(const json_t *v)
{
    size_t i;
    const char *k;
    json_t *x;
    int n = 0;

    if (json_is_object(v)) {
        if (json_object_get(v, "cache_control"))
            n++;
        json_object_foreach((json_t *)v, k, x)
        {
            n += count_cache_marks(x);
        }
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, x)
        {
            n += count_cache_marks(x);
        }
    }
    return n;
}

static void test_body_prompt_cache(void **state)
{
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    json_t *schema = echo_schema(), *body, *msgs;
    loom_tool_def tools[2] = {{"echo", "Echoes.", schema},
                              {"fail", NULL, NULL}};
    static const char mark[] = "{\"type\":\"ephemeral\"}";
    loom_messages m;

    (void)state;
    make_conversation(&m);
    req.model = "claude-x";
    req.messages = m.items;
    req.messages_len = m.len;
    req.tools = tools;
    req.tools_len = 2;
    body = build(&req);
    assert_int_equal(count_cache_marks(body), 0);
    json_decref(body);

    req.prompt_cache = 1;
    body = build(&req);
    /* tools, system, and the last two user turns: the API's four */
    assert_int_equal(count_cache_marks(body), 4);
    assert_json(
        json_object_get(json_array_get(json_object_get(body, "tools"), 1),
                        "cache_control"),
        mark);
    assert_json(
        json_object_get(json_array_get(json_object_get(body, "system"), 1),
                        "cache_control"),
        mark);
    msgs = json_object_get(body, "messages");
    assert_json(
        json_array_get(json_object_get(json_array_get(msgs, 4), "content"), 0),
        "{\"type\":\"text\",\"text\":\"bye\",\"cache_control\":"
        "{\"type\":\"ephemeral\"}}");
    assert_json(json_object_get(
                    json_array_get(
                        json_object_get(json_array_get(msgs, 2), "content"), 3),
                    "cache_control"),
                mark);
    json_decref(body);

    /* fewer places, fewer marks; no tools, no system */
    req.tools = NULL;
    req.tools_len = 0;
    req.messages = m.items + 2;
    req.messages_len = 1;
    body = build(&req);
    assert_int_equal(count_cache_marks(body), 1);
    json_decref(body);
    json_decref(schema);
    loom_messages_free(&m);
}

/* ---- decoder: usage, finish, errors ------------------------------------ */

static void test_usage_updates(void **state)
{
    /* message_delta repeats input counts in newer API versions: the last
     * value of each field wins */
    static const char s[] =
        EV("message_start",
           "{\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":"
           "{\"input_tokens\":10,\"output_tokens\":1}}}")
            EV("message_delta",
               "{\"type\":\"message_delta\",\"delta\":{\"stop_reason\":"
               "\"max_tokens\"},\"usage\":{\"input_tokens\":12,"
               "\"cache_read_input_tokens\":30,\"output_tokens\":-5}}")
                EV("message_stop", "{\"type\":\"message_stop\"}");
    static const char huge[] =
        EV("message_start",
           "{\"type\":\"message_start\",\"message\":{\"usage\":"
           "{\"input_tokens\":9223372036854775807,\"output_tokens\":1e300}}}")
            EV("message_stop", "{\"type\":\"message_stop\"}");
    loom_llm_response resp = {0};
    collector c;

    (void)state;
    col_init(&c);
    assert_int_equal(decode_str(s, &c, &resp, NULL), 0);
    assert_int_equal(resp.usage.prompt_tokens, 42);
    assert_int_equal(resp.usage.cached_tokens, 30);
    assert_int_equal(resp.usage.completion_tokens, 0); /* negative: 0 */
    assert_string_equal(resp.finish_reason, "length");
    assert_string_equal(loom_buf_cstr(&c.order), "UF");
    assert_string_equal(resp.text, "");
    assert_false(resp.output_started);
    loom_llm_response_clear(&resp);
    col_free(&c);

    /* clamped so that run totals cannot overflow */
    col_init(&c);
    assert_int_equal(decode_str(huge, &c, &resp, NULL), 0);
    assert_int_equal(resp.usage.prompt_tokens, 1000000000000L);
    assert_int_equal(resp.usage.completion_tokens, 1000000000000L);
    assert_null(resp.finish_reason); /* no stop reason: no FINISH */
    assert_string_equal(loom_buf_cstr(&c.order), "U");
    loom_llm_response_clear(&resp);
    col_free(&c);
}

static void test_finish_reasons(void **state)
{
    static const char *const map[][2] = {
        {"end_turn", "stop"},
        {"stop_sequence", "stop"},
        {"tool_use", "tool_calls"},
        {"max_tokens", "length"},
        {"model_context_window_exceeded", "length"},
        {"refusal", "content_filter"},
        {"pause_turn", "pause_turn"},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(map) / sizeof(map[0]); i++)
        assert_string_equal(loom__anthropic_finish_reason(map[i][0]),
                            map[i][1]);
    assert_null(loom__anthropic_finish_reason(NULL));
}

static const char start_and_text[] = EV(
    "message_start",
    "{\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":"
    "{\"input_tokens\":3,\"output_tokens\":1}}}")
    EV("content_block_start",
       "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":"
       "{\"type\":\"text\",\"text\":\"\"}}")
        EV("content_block_delta",
           "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
           "\"text_delta\",\"text\":\"par\"}}");

static void test_stream_error_event(void **state)
{
    static const char s[] =
        EV("message_start",
           "{\"type\":\"message_start\",\"message\":{\"id\":\"m\"}}")
            EV("error", "{\"type\":\"error\",\"error\":{\"type\":"
                        "\"overloaded_error\",\"message\":\"Overloaded\"}}");
    loom__anthropic_decoder *d;
    loom_llm_response resp = {0};
    collector c;

    (void)state;
    col_init(&c);
    assert_int_equal(loom__anthropic_decoder_new(&d, NULL, col_cb, &c), 0);
    assert_int_equal(loom__anthropic_decoder_feed(d, s, strlen(s)),
                     LOOM_EUPSTREAM);
    assert_int_equal(loom__anthropic_decoder_error(d)->kind,
                     LOOM_UPSTREAM_STREAM);
    assert_string_equal(loom__anthropic_decoder_error(d)->type,
                        "overloaded_error");
    assert_string_equal(loom__anthropic_decoder_error(d)->message,
                        "Overloaded");
    assert_true(loom__anthropic_stream_error_retryable(
        loom__anthropic_decoder_error(d)));
    assert_string_equal(c.error, "Overloaded");
    assert_false(loom__anthropic_decoder_output_started(d));
    /* a failed decoder stays failed */
    assert_int_equal(loom__anthropic_decoder_feed(d, "x", 1), LOOM_EUPSTREAM);
    assert_int_equal(loom__anthropic_decoder_finish(d), LOOM_EUPSTREAM);
    loom__anthropic_decoder_free(d);
    col_free(&c);

    /* after output, an error keeps what came (no calls) */
    col_init(&c);
    {
        char buf[2048];
        snprintf(buf, sizeof(buf), "%s%s", start_and_text,
                 EV("error", "{\"type\":\"error\",\"error\":{\"type\":"
                             "\"invalid_request_error\",\"message\":"
                             "\"bad\"}}"));
        assert_int_equal(decode_str(buf, &c, &resp, NULL), LOOM_EUPSTREAM);
    }
    assert_string_equal(resp.text, "par");
    assert_true(resp.output_started);
    assert_null(resp.finish_reason);
    loom_llm_response_clear(&resp);
    col_free(&c);

    /* an error event that is not JSON: its text, cut to 500 bytes */
    {
        char buf[1024];
        col_init(&c);
        memcpy(buf, "event: error\ndata: ", 19);
        memset(buf + 19, 'x', 600);
        memcpy(buf + 619, "\n\n", 3);
        assert_int_equal(loom__anthropic_decoder_new(&d, NULL, col_cb, &c), 0);
        assert_int_equal(loom__anthropic_decoder_feed(d, buf, strlen(buf)),
                         LOOM_EUPSTREAM);
        assert_int_equal(strlen(loom__anthropic_decoder_error(d)->message),
                         500);
        assert_null(loom__anthropic_decoder_error(d)->type);
        loom__anthropic_decoder_free(d);
        col_free(&c);
    }

    {
        loom_upstream_error e = {0};
        e.kind = LOOM_UPSTREAM_STREAM;
        e.type = "api_error";
        assert_true(loom__anthropic_stream_error_retryable(&e));
        e.type = "invalid_request_error";
        assert_false(loom__anthropic_stream_error_retryable(&e));
        e.type = NULL;
        assert_false(loom__anthropic_stream_error_retryable(&e));
    }
}

static void test_truncated(void **state)
{
    loom__anthropic_decoder *d;
    loom_llm_response resp = {0};
    collector c;
    char buf[4096];

    (void)state;
    /* no message_stop, no stop reason: the connection dropped */
    col_init(&c);
    assert_int_equal(loom__anthropic_decoder_new(&d, NULL, col_cb, &c), 0);
    assert_int_equal(
        loom__anthropic_decoder_feed(d, start_and_text, strlen(start_and_text)),
        0);
    assert_int_equal(loom__anthropic_decoder_finish(d), LOOM_EUPSTREAM);
    assert_int_equal(loom__anthropic_decoder_error(d)->kind,
                     LOOM_UPSTREAM_CONNECTION);
    assert_false(loom__anthropic_decoder_done(d));
    assert_int_equal(loom__anthropic_decoder_export(d, &resp), 0);
    assert_string_equal(resp.text, "par");
    loom__anthropic_decoder_free(d);
    loom_llm_response_clear(&resp);
    col_free(&c);

    /* a call cut before message_stop is never handed over */
    col_init(&c);
    snprintf(buf, sizeof(buf), "%s",
             EV("content_block_start",
                "{\"type\":\"content_block_start\",\"index\":0,"
                "\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\","
                "\"name\":\"n\",\"input\":{}}}"));
    assert_int_equal(decode_str(buf, &c, &resp, NULL), LOOM_EUPSTREAM);
    assert_int_equal(resp.tool_calls_len, 0);
    assert_true(resp.output_started);
    assert_int_equal(c.calls_len, 0);
    loom_llm_response_clear(&resp);
    col_free(&c);

    /* a stop reason without message_stop is a whole answer; what comes
     * after message_stop is not */
    col_init(&c);
    snprintf(buf, sizeof(buf), "%s%s", start_and_text,
             EV("message_delta", "{\"type\":\"message_delta\",\"delta\":"
                                 "{\"stop_reason\":\"end_turn\"}}"));
    assert_int_equal(decode_str(buf, &c, &resp, NULL), 0);
    assert_string_equal(resp.finish_reason, "stop");
    loom_llm_response_clear(&resp);
    col_free(&c);

    col_init(&c);
    snprintf(buf, sizeof(buf), "%s%s%s", start_and_text,
             EV("message_stop", "{\"type\":\"message_stop\"}"),
             EV("content_block_delta", "garbage"));
    assert_int_equal(decode_str(buf, &c, &resp, NULL), 0);
    assert_string_equal(resp.text, "par");
    loom_llm_response_clear(&resp);
    col_free(&c);
}

static void test_malformed(void **state)
{
    static const char *const bad[] = {
        /* not JSON */
        EV("message_start", "{\"type\":"),
        /* not an object */
        EV("message_start", "[1]"),
        /* a delta before its block */
        EV("content_block_delta",
           "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":"
           "{\"type\":\"text_delta\",\"text\":\"x\"}}"),
        /* a stop before its block */
        EV("content_block_stop", "{\"type\":\"content_block_stop\","
                                 "\"index\":2}"),
        /* a block started twice */
        EV("content_block_start",
           "{\"type\":\"content_block_start\",\"index\":0,"
           "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}")
            EV("content_block_start",
               "{\"type\":\"content_block_start\",\"index\":0,"
               "\"content_block\":{\"type\":\"text\",\"text\":\"\"}}"),
        /* bad indexes */
        EV("content_block_start",
           "{\"type\":\"content_block_start\",\"index\":-1,"
           "\"content_block\":{\"type\":\"text\"}}"),
        EV("content_block_start",
           "{\"type\":\"content_block_start\",\"index\":\"0\","
           "\"content_block\":{\"type\":\"text\"}}"),
        /* a block without a type, a delta without a delta */
        EV("content_block_start",
           "{\"type\":\"content_block_start\",\"index\":0,"
           "\"content_block\":{}}"),
        EV("content_block_start",
           "{\"type\":\"content_block_start\",\"index\":0,"
           "\"content_block\":{\"type\":\"text\"}}")
            EV("content_block_delta",
               "{\"type\":\"content_block_delta\",\"index\":0}"),
        /* a call without a name */
        EV("content_block_start",
           "{\"type\":\"content_block_start\",\"index\":0,"
           "\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\","
           "\"input\":{}}}") EV("message_stop", "{\"type\":\"message_stop\"}"),
    };
    static const char ok[] =
        /* a ping's data is not read; unknown events and deltas pass */
        "event: ping\ndata: not json\n\n" EV(
            "content_block_start",
            "{\"type\":\"content_block_start\",\"index\":0,\"content_block\":"
            "{\"type\":\"server_tool_use\",\"id\":\"s\",\"name\":\"web\"}}")
            EV("content_block_delta",
               "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":{"
               "\"type\":"
               "\"input_json_delta\",\"partial_json\":\"{}\"}}")
                EV("content_block_start", "{\"type\":\"content_block_start\","
                                          "\"index\":1,\"content_block\":"
                                          "{\"type\":\"text\",\"text\":\"a\"}}")
                    EV("content_block_delta",
                       "{\"type\":\"content_block_delta\",\"index\":1,"
                       "\"delta\":{\"type\":"
                       "\"citations_delta\",\"citation\":{}}}")
                        EV("future_event", "{\"type\":\"future_event\"}") EV(
                            "message_delta",
                            "{\"type\":\"message_delta\",\"delta\":"
                            "{\"stop_reason\":\"end_turn\"}}")
                            EV("message_stop", "{\"type\":\"message_stop\"}");
    loom_llm_response resp = {0};
    collector c;

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        col_init(&c);
        assert_int_equal(decode_str(bad[i], &c, NULL, NULL), LOOM_EPROTO);
        col_free(&c);
    }
    col_init(&c);
    assert_int_equal(decode_str(ok, &c, &resp, NULL), 0);
    assert_string_equal(resp.text, "a");
    assert_int_equal(resp.tool_calls_len, 0); /* server tools are not ours */
    loom_llm_response_clear(&resp);
    col_free(&c);
}

static void test_complete_errors(void **state)
{
    loom_llm_response resp = {0};
    collector c;

    (void)state;
    col_init(&c);
    assert_int_equal(
        complete_str("{\"type\":\"error\",\"error\":{\"type\":"
                     "\"overloaded_error\",\"message\":\"Overloaded\"}}",
                     &c, NULL, NULL),
        LOOM_EUPSTREAM);
    assert_string_equal(c.error, "Overloaded");
    col_free(&c);
    col_init(&c);
    assert_int_equal(complete_str("not json", &c, NULL, NULL), LOOM_EPROTO);
    assert_int_equal(complete_str("{\"type\":\"message\"}", &c, NULL, NULL),
                     LOOM_EPROTO);
    assert_int_equal(complete_str("[]", &c, NULL, NULL), LOOM_EPROTO);
    col_free(&c);

    /* a message with nothing in it */
    col_init(&c);
    assert_int_equal(complete_str("{\"type\":\"message\",\"content\":[],"
                                  "\"stop_reason\":\"end_turn\"}",
                                  &c, &resp, NULL),
                     0);
    assert_string_equal(resp.text, "");
    assert_string_equal(resp.finish_reason, "stop");
    assert_string_equal(loom_buf_cstr(&c.order), "F"); /* no usage given */
    loom_llm_response_clear(&resp);
    col_free(&c);
}

static void test_callback_abort(void **state)
{
    loom_llm_response resp = {0};
    collector c;

    (void)state;
    col_init(&c);
    c.abort_on = LOOM_LLM_TOOL_CALL_DELTA;
    assert_int_equal(decode_str(thinking_stream, &c, &resp, NULL),
                     LOOM_ECANCELED);
    assert_int_equal(resp.tool_calls_len, 0);
    assert_null(resp.provider_state);
    loom_llm_response_clear(&resp);
    col_free(&c);
    col_init(&c);
    c.abort_on = LOOM_LLM_FINISH;
    assert_int_equal(complete_str(thinking_message, &c, &resp, NULL),
                     LOOM_ECANCELED);
    loom_llm_response_clear(&resp);
    col_free(&c);
}

/* ---- limits -------------------------------------------------------------- */

static void test_limits(void **state)
{
    loom__anthropic_limits lim = {0};
    collector c;

    (void)state;
    /* text: "Checking both." is 14 bytes */
    lim.max_text = 14;
    col_init(&c);
    assert_int_equal(decode_str(thinking_stream, &c, NULL, &lim), 0);
    col_free(&c);
    lim.max_text = 13;
    col_init(&c);
    assert_int_equal(decode_str(thinking_stream, &c, NULL, &lim),
                     LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "text"));
    col_free(&c);

    /* thinking: "Let me think." is 13 bytes, the text passes first */
    {
        static const char s[] =
            EV("content_block_start",
               "{\"type\":\"content_block_start\",\"index\":0,"
               "\"content_block\":{\"type\":\"thinking\",\"thinking\":"
               "\"12345\"}}")
                EV("content_block_delta",
                   "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":"
                   "{\"type\":\"thinking_delta\",\"thinking\":\"678\"}}")
                    EV("message_delta", "{\"type\":\"message_delta\",\"delta\":"
                                        "{\"stop_reason\":\"end_turn\"}}");
        lim.max_text = 8;
        col_init(&c);
        assert_int_equal(decode_str(s, &c, NULL, &lim), 0);
        col_free(&c);
        lim.max_text = 7;
        col_init(&c);
        assert_int_equal(decode_str(s, &c, NULL, &lim), LOOM_ETOOLARGE);
        assert_non_null(strstr(loom_error_last(), "thinking"));
        col_free(&c);
    }
    lim.max_text = 0;

    /* arguments: {"city":"Paris"} is 16 bytes */
    lim.max_args = 16;
    col_init(&c);
    assert_int_equal(decode_str(thinking_stream, &c, NULL, &lim), 0);
    col_free(&c);
    lim.max_args = 15;
    col_init(&c);
    assert_int_equal(decode_str(thinking_stream, &c, NULL, &lim),
                     LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "arguments"));
    col_free(&c);
    col_init(&c);
    assert_int_equal(complete_str(thinking_message, &c, NULL, &lim),
                     LOOM_ETOOLARGE);
    col_free(&c);
    lim.max_args = 0;

    /* calls: two in the answer */
    lim.max_tool_calls = 2;
    col_init(&c);
    assert_int_equal(decode_str(thinking_stream, &c, NULL, &lim), 0);
    col_free(&c);
    lim.max_tool_calls = 1;
    col_init(&c);
    assert_int_equal(decode_str(thinking_stream, &c, NULL, &lim),
                     LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "tool calls"));
    col_free(&c);
    lim.max_tool_calls = 0;

    /* blocks: indexes 0..4 */
    lim.max_blocks = 5;
    col_init(&c);
    assert_int_equal(decode_str(thinking_stream, &c, NULL, &lim), 0);
    col_free(&c);
    lim.max_blocks = 4;
    col_init(&c);
    assert_int_equal(decode_str(thinking_stream, &c, NULL, &lim),
                     LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "content blocks"));
    col_free(&c);
    col_init(&c);
    assert_int_equal(complete_str(thinking_message, &c, NULL, &lim),
                     LOOM_ETOOLARGE);
    col_free(&c);
    lim.max_blocks = 0;

    /* state: "EqQBsig==" (9) + "EmwKAhgBredacted" (16) */
    lim.max_state = 25;
    col_init(&c);
    assert_int_equal(decode_str(thinking_stream, &c, NULL, &lim), 0);
    col_free(&c);
    lim.max_state = 24;
    col_init(&c);
    assert_int_equal(decode_str(thinking_stream, &c, NULL, &lim),
                     LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "signatures"));
    col_free(&c);
    col_init(&c);
    assert_int_equal(complete_str(thinking_message, &c, NULL, &lim),
                     LOOM_ETOOLARGE);
    col_free(&c);
}

static void test_sse_line_limit(void **state)
{
    loom__anthropic_limits lim = {0};
    size_t n;
    char *s;
    collector c;

    (void)state;
    /* an event line longer than 2 * the largest limit + 64 KiB */
    lim.max_text = lim.max_args = lim.max_state = 1024;
    n = 2 * 1024 + 65536 + 100;
    s = malloc(n + 32);
    assert_non_null(s);
    memcpy(s, "data: \"", 7);
    memset(s + 7, 'a', n);
    memcpy(s + 7 + n, "\"\n\n", 4);
    col_init(&c);
    assert_int_equal(decode_str(s, &c, NULL, &lim), LOOM_ETOOLARGE);
    col_free(&c);
    free(s);
}

/* ---- HTTP errors, the provider ---------------------------------------- */

typedef struct {
    long status;
    const char *etype;
    loom_upstream_kind kind;
    int retry;
} status_case;

static void test_error_mapping(void **state)
{
    static const status_case cases[] = {
        {400, "invalid_request_error", LOOM_UPSTREAM_BAD_REQUEST, 0},
        {401, "authentication_error", LOOM_UPSTREAM_AUTH, 0},
        {403, "permission_error", LOOM_UPSTREAM_PERMISSION, 0},
        {404, "not_found_error", LOOM_UPSTREAM_NOT_FOUND, 0},
        {413, "request_too_large", LOOM_UPSTREAM_TOO_LARGE, 0},
        {429, "rate_limit_error", LOOM_UPSTREAM_RATE_LIMIT, 1},
        {500, "api_error", LOOM_UPSTREAM_SERVER, 1},
        {529, "overloaded_error", LOOM_UPSTREAM_SERVER, 1},
    };
    loom_upstream_error err = {0};
    char body[256];

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(body, sizeof(body),
                 "{\"type\":\"error\",\"error\":{\"type\":\"%s\","
                 "\"message\":\"m%ld\"},\"request_id\":\"req_1\"}",
                 cases[i].etype, cases[i].status);
        assert_int_equal(loom__anthropic_error_from_http(&err, cases[i].status,
                                                         body, strlen(body),
                                                         "req_hdr"),
                         0);
        assert_int_equal(err.kind, cases[i].kind);
        assert_int_equal(err.http_status, cases[i].status);
        assert_string_equal(err.type, cases[i].etype);
        snprintf(body, sizeof(body), "m%ld", cases[i].status);
        assert_string_equal(err.message, body);
        assert_string_equal(err.request_id, "req_hdr");
        assert_int_equal(loom__anthropic_status_retryable(cases[i].status),
                         cases[i].retry);
    }
    /* a body that is not JSON (a proxy's page): its text */
    assert_int_equal(loom__anthropic_error_from_http(
                         &err, 502, "<html>bad gateway</html>\n", 25, NULL),
                     0);
    assert_int_equal(err.kind, LOOM_UPSTREAM_SERVER);
    assert_string_equal(err.message, "<html>bad gateway</html>");
    assert_null(err.type);
    assert_int_equal(loom__anthropic_error_from_http(&err, 529, "", 0, NULL),
                     0);
    assert_string_equal(err.message, "HTTP 529");
    free(err.type);
    free(err.message);
    free(err.request_id);
}

static void test_provider_url(void **state)
{
    static const char *const cases[][2] = {
        {"http://h:1/v1", "http://h:1/v1/messages"},
        {"http://h:1/v1/", "http://h:1/v1/messages"},
        {"http://h:1", "http://h:1/v1/messages"},
        {"http://h:1/", "http://h:1/v1/messages"},
        {"http://h:1/px/anthropic", "http://h:1/px/anthropic/v1/messages"},
        {NULL, "https://api.anthropic.com/v1/messages"},
    };
    loom_provider_config cfg = {0};
    loom_provider *p;

    (void)state;
    cfg.name = "claude";
    cfg.kind = "anthropic";
    cfg.headers = json_object();
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        cfg.base_url = (char *)cases[i][0];
        assert_int_equal(loom_provider_new(&p, &cfg), 0);
        assert_string_equal(loom__anthropic_provider_url(p), cases[i][1]);
        assert_string_equal(p->name, "claude");
        loom_provider_free(p);
    }
    /* a header value with a line break, an api key with one */
    json_object_set_new(cfg.headers, "anthropic-beta", json_string("a\r\nb"));
    assert_int_equal(loom_provider_new(&p, &cfg), LOOM_EINVALID);
    assert_null(p);
    json_object_clear(cfg.headers);
    cfg.api_key = "k\n";
    assert_int_equal(loom_provider_new(&p, &cfg), LOOM_EINVALID);
    json_decref(cfg.headers);
}

/* ---- the answer tool (response_format) -------------------------------- */

#define ANSWER_START                                                           \
    EV("message_start",                                                        \
       "{\"type\":\"message_start\",\"message\":{\"id\":\"msg_j\",\"type\":"   \
       "\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"c\","    \
       "\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}")
#define ANSWER_TOOL_START(idx, name)                                           \
    EV("content_block_start",                                                  \
       "{\"type\":\"content_block_start\",\"index\":" idx                      \
       ",\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_" idx         \
       "\",\"name\":\"" name "\",\"input\":{}}}")
#define ANSWER_PIECE(idx, json)                                                \
    EV("content_block_delta",                                                  \
       "{\"type\":\"content_block_delta\",\"index\":" idx ",\"delta\":{"       \
       "\"type\":\"input_json_delta\",\"partial_json\":\"" json "\"}}")
#define ANSWER_STOP(idx)                                                       \
    EV("content_block_stop",                                                   \
       "{\"type\":\"content_block_stop\",\"index\":" idx "}")
#define ANSWER_END(reason)                                                     \
    EV("message_delta", "{\"type\":\"message_delta\",\"delta\":{"              \
                        "\"stop_reason\":\"" reason "\"},\"usage\":{"          \
                        "\"output_tokens\":12}}")                              \
    EV("message_stop", "{\"type\":\"message_stop\"}")

/* The forced answer tool's input, in input_json_delta pieces as the API
 * streams them (an empty one first). */
static const char answer_stream[] =
    ANSWER_START ANSWER_TOOL_START("0", LOOM_ANTHROPIC_ANSWER_TOOL)
        EV("ping", "{\"type\": \"ping\"}") ANSWER_PIECE("0", "")
            ANSWER_PIECE("0", "{\\\"city\\\": ")
                ANSWER_PIECE("0", "\\\"Paris\\\", \\\"n\\\"")
                    ANSWER_PIECE("0", ": 2}") ANSWER_STOP("0")
                        ANSWER_END("tool_use");

static void check_answer(const collector *c, const loom_llm_response *resp,
                         const char *text)
{
    assert_string_equal(loom_buf_cstr(&c->text), text);
    assert_string_equal(resp->text, text);
    assert_null(strchr(loom_buf_cstr(&c->order), 'D'));
    assert_null(strchr(loom_buf_cstr(&c->order), 'C'));
    assert_int_equal(c->calls_len, 0);
    assert_int_equal(resp->tool_calls_len, 0);
    assert_string_equal(c->finish, "stop");
    assert_string_equal(resp->finish_reason, "stop");
    assert_int_equal(resp->usage.completion_tokens, 12);
    assert_null(resp->provider_state);
}

static void test_answer_stream_forced(void **state)
{
    static const char want[] = "{\"city\": \"Paris\", \"n\": 2}";
    size_t len = strlen(answer_stream);

    (void)state;
    /* Whole, at every split, and one byte at a time. */
    for (size_t split = 0; split < len; split++) {
        collector c;
        loom_llm_response resp = {0};
        col_init(&c);
        assert_int_equal(decode_as(LOOM__ANTHROPIC_ANSWER_FORCED, answer_stream,
                                   len, split, &c, &resp, NULL),
                         0);
        check_answer(&c, &resp, want);
        if (split == 0) /* passed on as the pieces came */
            assert_string_equal(loom_buf_cstr(&c.order), "TTTUF");
        loom_llm_response_clear(&resp);
        col_free(&c);
    }
    {
        collector c;
        loom_llm_response resp = {0};
        col_init(&c);
        assert_int_equal(decode_as(LOOM__ANTHROPIC_ANSWER_FORCED, answer_stream,
                                   len, SIZE_MAX, &c, &resp, NULL),
                         0);
        check_answer(&c, &resp, want);
        loom_llm_response_clear(&resp);
        col_free(&c);
    }
}

/* Beside the run's tools the input is kept and is the text at the end. */
static void test_answer_stream_beside(void **state)
{
    collector c;
    loom_llm_response resp = {0};

    (void)state;
    col_init(&c);
    assert_int_equal(decode_as(LOOM__ANTHROPIC_ANSWER_BESIDE, answer_stream,
                               strlen(answer_stream), 0, &c, &resp, NULL),
                     0);
    check_answer(&c, &resp, "{\"city\": \"Paris\", \"n\": 2}");
    assert_string_equal(loom_buf_cstr(&c.order), "TUF");
    loom_llm_response_clear(&resp);
    col_free(&c);
}

/* A real call beside the answer wins: the answer is dropped (the model
 * answers again after the tool ran); a second answer call is ignored. */
static void test_answer_beside_real_call(void **state)
{
    static const char stream[] =
        ANSWER_START ANSWER_TOOL_START("0", LOOM_ANTHROPIC_ANSWER_TOOL)
            ANSWER_PIECE("0", "{\\\"a\\\":1}") ANSWER_STOP("0")
                ANSWER_TOOL_START("1", "get_time")
                    ANSWER_PIECE("1", "{\\\"tz\\\":\\\"CET\\\"}")
                        ANSWER_STOP("1")
                            ANSWER_TOOL_START("2", LOOM_ANTHROPIC_ANSWER_TOOL)
                                ANSWER_PIECE("2", "{}") ANSWER_STOP("2")
                                    ANSWER_END("tool_use");
    collector c;
    loom_llm_response resp = {0};

    (void)state;
    col_init(&c);
    assert_int_equal(decode_as(LOOM__ANTHROPIC_ANSWER_BESIDE, stream,
                               strlen(stream), 0, &c, &resp, NULL),
                     0);
    assert_string_equal(resp.text, "");
    assert_int_equal(resp.tool_calls_len, 1);
    assert_string_equal(resp.tool_calls[0].name, "get_time");
    assert_string_equal(resp.tool_calls[0].arguments, "{\"tz\":\"CET\"}");
    assert_string_equal(resp.finish_reason, "tool_calls");
    assert_null(strchr(loom_buf_cstr(&c.order), 'T'));
    loom_llm_response_clear(&resp);
    col_free(&c);
}

/* Without a response format the tool is an ordinary call; a cut answer
 * keeps its finish reason; a whole message's input is the text, "{}" when
 * empty. */
static void test_answer_edges(void **state)
{
    static const char cut[] =
        ANSWER_START ANSWER_TOOL_START("0", LOOM_ANTHROPIC_ANSWER_TOOL)
            ANSWER_PIECE("0", "{\\\"a\\\":") ANSWER_STOP("0")
                ANSWER_END("max_tokens");
    static const char message[] =
        "{\"id\":\"msg_2\",\"type\":\"message\",\"role\":\"assistant\","
        "\"content\":[{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":"
        "\"" LOOM_ANTHROPIC_ANSWER_TOOL
        "\",\"input\":{\"a\":[1,2]}}],\"stop_reason\":\"tool_use\","
        "\"usage\":{\"input_tokens\":3,\"output_tokens\":12}}";
    static const char empty[] =
        "{\"id\":\"msg_3\",\"type\":\"message\",\"role\":\"assistant\","
        "\"content\":[{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":"
        "\"" LOOM_ANTHROPIC_ANSWER_TOOL
        "\",\"input\":{}}],\"stop_reason\":\"tool_use\","
        "\"usage\":{\"input_tokens\":3,\"output_tokens\":12}}";
    collector c;
    loom_llm_response resp = {0};

    (void)state;
    col_init(&c);
    assert_int_equal(decode_as(LOOM__ANTHROPIC_ANSWER_NONE, answer_stream,
                               strlen(answer_stream), 0, &c, &resp, NULL),
                     0);
    assert_int_equal(resp.tool_calls_len, 1);
    assert_string_equal(resp.tool_calls[0].name, LOOM_ANTHROPIC_ANSWER_TOOL);
    assert_string_equal(resp.finish_reason, "tool_calls");
    assert_string_equal(resp.text, "");
    loom_llm_response_clear(&resp);
    col_free(&c);

    col_init(&c);
    memset(&resp, 0, sizeof(resp));
    assert_int_equal(decode_as(LOOM__ANTHROPIC_ANSWER_FORCED, cut, strlen(cut),
                               0, &c, &resp, NULL),
                     0);
    assert_string_equal(resp.text, "{\"a\":");
    assert_string_equal(resp.finish_reason, "length");
    loom_llm_response_clear(&resp);
    col_free(&c);

    for (int mode = LOOM__ANTHROPIC_ANSWER_FORCED;
         mode <= LOOM__ANTHROPIC_ANSWER_BESIDE; mode++) {
        col_init(&c);
        memset(&resp, 0, sizeof(resp));
        assert_int_equal(complete_as(mode, message, &c, &resp, NULL), 0);
        check_answer(&c, &resp, "{\"a\":[1,2]}");
        loom_llm_response_clear(&resp);
        col_free(&c);
        col_init(&c);
        memset(&resp, 0, sizeof(resp));
        assert_int_equal(complete_as(mode, empty, &c, &resp, NULL), 0);
        check_answer(&c, &resp, "{}");
        loom_llm_response_clear(&resp);
        col_free(&c);
    }
}

/* The answer kept beside real tools stays under the text limit. */
static void test_answer_limit(void **state)
{
    loom__anthropic_limits lim = {0};
    collector c;

    (void)state;
    lim.max_text = 8;
    col_init(&c);
    assert_int_equal(decode_as(LOOM__ANTHROPIC_ANSWER_BESIDE, answer_stream,
                               strlen(answer_stream), 0, &c, NULL, &lim),
                     LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "limit of 8 bytes"));
    col_free(&c);
    col_init(&c);
    assert_int_equal(decode_as(LOOM__ANTHROPIC_ANSWER_FORCED, answer_stream,
                               strlen(answer_stream), 0, &c, NULL, &lim),
                     LOOM_ETOOLARGE);
    col_free(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors),
        cmocka_unit_test(test_thinking_stream),
        cmocka_unit_test(test_thinking_message),
        cmocka_unit_test(test_state_round_trip),
        cmocka_unit_test(test_body_conversation),
        cmocka_unit_test(test_body_edges),
        cmocka_unit_test(test_body_tool_choice),
        cmocka_unit_test(test_body_thinking),
        cmocka_unit_test(test_body_prompt_cache),
        cmocka_unit_test(test_usage_updates),
        cmocka_unit_test(test_finish_reasons),
        cmocka_unit_test(test_stream_error_event),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_complete_errors),
        cmocka_unit_test(test_callback_abort),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_sse_line_limit),
        cmocka_unit_test(test_error_mapping),
        cmocka_unit_test(test_provider_url),
        cmocka_unit_test(test_answer_stream_forced),
        cmocka_unit_test(test_answer_stream_beside),
        cmocka_unit_test(test_answer_beside_real_call),
        cmocka_unit_test(test_answer_edges),
        cmocka_unit_test(test_answer_limit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
