/*
 * Unit tests of the OpenAI Chat Completions wire format of the server
 * (server/chat_format.h), no server involved: request parsing (every
 * field, every wrong type with the param it names, every limit crossed),
 * tool resolution against a registry, the mapping of run failures to
 * OpenAI errors, and the rendering of run events as chunk streams (byte
 * for byte, and framed like the recorded OpenAI stream in
 * LOOM_VECTORS_DIR/openai-chat) and as one chat.completion object, and
 * the same from a turn's logged events without parsing them back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "agent/session_internal.h"
#include "core/utf8.h"
#include "server/chat_format.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers --------------------------------------------------------- */

static json_t *J(const char *text)
{
    json_error_t e;
    json_t *j = json_loads(text, 0, &e);

    if (!j)
        fail_msg("bad test JSON (%s): %s", e.text, text);
    return j;
}

/* 1 when a equals the JSON in text. */
static int json_eq(const json_t *a, const char *text)
{
    json_t *b = J(text);
    int eq = json_equal((json_t *)a, b);

    if (!eq) {
        char *g = json_dumps(a, JSON_COMPACT);
        fprintf(stderr, "got  %s\nwant %s\n", g ? g : "(null)", text);
        free(g);
    }
    json_decref(b);
    return eq;
}

static int parse(loom__chat_request *req, loom__chat_error *err,
                 const char *text)
{
    json_t *body = J(text);
    int rc = loom__chat_request_parse(req, body, err);

    json_decref(body);
    return rc;
}

/* Parses text, expects a 400 naming param with code; returns nothing. */
static void expect_bad(const char *text, const char *param, const char *code)
{
    loom__chat_request req;
    loom__chat_error err;
    int rc = parse(&req, &err, text);

    if (rc != LOOM_EINVALID)
        fail_msg("accepted: %s", text);
    assert_int_equal(err.status, 400);
    assert_string_equal(err.type, "invalid_request_error");
    assert_non_null(err.message);
    assert_true(strlen(err.message) > 10);
    if (param) {
        if (!err.param || strcmp(err.param, param) != 0)
            fail_msg("param %s, want %s, for %s", err.param ? err.param
                                                           : "(null)",
                     param, text);
        /* The message names the field too. */
        assert_non_null(strstr(err.message, param));
    } else {
        assert_null(err.param);
    }
    if (code && (!err.code || strcmp(err.code, code) != 0))
        fail_msg("code %s, want %s, for %s", err.code ? err.code : "(null)",
                 code, text);
    /* The request is left empty. */
    assert_null(req.model);
    assert_int_equal(req.messages.len, 0);
    loom__chat_error_clear(&err);
    loom__chat_request_clear(&req);
}

#define MSGS "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"

/* A body with model and one user message plus extra (",..." or ""). */
static char *body_with(const char *extra)
{
    char *s = NULL;

    assert_true(asprintf(&s, "{\"model\":\"m\"," MSGS "%s}", extra) > 0);
    return s;
}

static void expect_bad_extra(const char *extra, const char *param,
                             const char *code)
{
    char *b = body_with(extra);
    expect_bad(b, param, code);
    free(b);
}

/* A body whose only message is msg. */
static void expect_bad_msg(const char *msg, const char *param,
                           const char *code)
{
    char *s = NULL;
    assert_true(asprintf(&s, "{\"model\":\"m\",\"messages\":[%s]}", msg) > 0);
    expect_bad(s, param, code);
    free(s);
}

/* ---- request parsing ------------------------------------------------- */

static void test_parse_every_field(void **state)
{
    loom__chat_request req;
    loom__chat_error err;
    const loom_message *m;
    (void)state;

    assert_int_equal(
        parse(&req, &err,
              "{\"model\":\"agent/helper\",\"stream\":true,"
              "\"stream_options\":{\"include_usage\":true},"
              "\"messages\":["
              "{\"role\":\"system\",\"content\":\"be brief\"},"
              "{\"role\":\"developer\",\"content\":[{\"type\":\"text\","
              "\"text\":\"dev\"}]},"
              "{\"role\":\"user\",\"name\":\"ann\",\"content\":["
              "{\"type\":\"text\",\"text\":\"part one\"},"
              "{\"type\":\"text\",\"text\":\"part two\"}]},"
              "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
              "{\"id\":\"call_1\",\"type\":\"function\",\"function\":"
              "{\"name\":\"get_weather\",\"arguments\":\"{\\\"c\\\":1}\"}},"
              "{\"id\":\"call_2\",\"function\":{\"name\":\"x\","
              "\"arguments\":\"\"}}]},"
              "{\"role\":\"tool\",\"tool_call_id\":\"call_1\","
              "\"content\":\"sunny\"},"
              "{\"role\":\"tool\",\"tool_call_id\":\"call_9\","
              "\"content\":[{\"type\":\"text\",\"text\":\"?\"}]},"
              "{\"role\":\"assistant\",\"content\":\"It is sunny.\"},"
              "{\"role\":\"user\",\"content\":\"thanks\"}],"
              "\"tools\":[\"get_time\",{\"type\":\"function\",\"function\":"
              "{\"name\":\"get_weather\",\"description\":\"Weather.\","
              "\"parameters\":{\"type\":\"object\"},\"strict\":true}},"
              "{\"type\":\"function\",\"function\":{\"name\":\"bare\"}}],"
              "\"tool_choice\":{\"type\":\"function\",\"function\":"
              "{\"name\":\"get_weather\"}},"
              "\"parallel_tool_calls\":false,\"max_tokens\":100,"
              "\"max_completion_tokens\":200,\"temperature\":0.5,"
              "\"user\":\"u-1\",\"conversation_id\":\"conv_abc\","
              "\"n\":1,\"frobnicate\":{\"x\":[1,2]}}"),
        0);
    assert_string_equal(req.model, "agent/helper");
    assert_int_equal(req.stream, 1);
    assert_int_equal(req.include_usage, 1);
    assert_int_equal(req.messages.len, 8);
    m = req.messages.items;
    assert_int_equal(m[0].role, LOOM_ROLE_SYSTEM);
    assert_string_equal(m[0].content, "be brief");
    assert_int_equal(m[1].role, LOOM_ROLE_SYSTEM); /* developer */
    assert_string_equal(m[1].content, "dev");
    assert_int_equal(m[2].role, LOOM_ROLE_USER);
    assert_string_equal(m[2].content, "part one\npart two");
    assert_int_equal(m[3].role, LOOM_ROLE_ASSISTANT);
    assert_null(m[3].content);
    assert_int_equal(m[3].tool_calls_len, 2);
    assert_string_equal(m[3].tool_calls[0].id, "call_1");
    assert_string_equal(m[3].tool_calls[0].name, "get_weather");
    assert_string_equal(m[3].tool_calls[0].arguments, "{\"c\":1}");
    assert_string_equal(m[3].tool_calls[1].arguments, "{}");
    assert_int_equal(m[4].role, LOOM_ROLE_TOOL);
    assert_string_equal(m[4].tool_call_id, "call_1");
    assert_string_equal(m[4].name, "get_weather"); /* from the call */
    assert_string_equal(m[4].content, "sunny");
    assert_string_equal(m[5].tool_call_id, "call_9");
    assert_null(m[5].name); /* answers no known call */
    assert_string_equal(m[5].content, "?");
    assert_string_equal(m[6].content, "It is sunny.");
    assert_int_equal(m[7].role, LOOM_ROLE_USER);

    assert_int_equal(req.tool_names_len, 1);
    assert_string_equal(req.tool_names[0], "get_time");
    assert_int_equal(req.tool_name_pos[0], 0);
    assert_int_equal(req.client_tools_len, 2);
    assert_string_equal(req.client_tools[0].name, "get_weather");
    assert_string_equal(req.client_tools[0].description, "Weather.");
    assert_string_equal(json_string_value(json_object_get(
                            req.client_tools[0].parameters, "type")),
                        "object");
    assert_int_equal(req.client_tool_pos[0], 1);
    assert_string_equal(req.client_tools[1].name, "bare");
    assert_null(req.client_tools[1].description);
    assert_null(req.client_tools[1].parameters);
    assert_int_equal(req.client_tool_pos[1], 2);
    assert_int_equal(req.has_tool_choice, 1);
    assert_int_equal(req.tool_choice.kind, LOOM_TOOL_CHOICE_FUNCTION);
    assert_string_equal(req.tool_choice.function, "get_weather");
    assert_int_equal(req.parallel_tool_calls, 0);
    assert_int_equal(req.max_tokens, 200); /* max_completion_tokens wins */
    assert_true(req.temperature > 0.49 && req.temperature < 0.51);
    assert_string_equal(req.conversation_id, "conv_abc");
    loom__chat_request_clear(&req);
    loom__chat_error_clear(&err);
}

static void test_parse_defaults_and_nulls(void **state)
{
    loom__chat_request req;
    loom__chat_error err;
    (void)state;

    /* Optional fields given as null count as absent. */
    assert_int_equal(
        parse(&req, &err,
              "{\"model\":\"p/m\"," MSGS ",\"stream\":null,"
              "\"stream_options\":null,\"tools\":null,\"tool_choice\":null,"
              "\"parallel_tool_calls\":null,\"max_tokens\":null,"
              "\"temperature\":null,\"user\":null,"
              "\"conversation_id\":null}"),
        0);
    assert_int_equal(req.stream, 0);
    assert_int_equal(req.include_usage, 0);
    assert_int_equal(req.tool_names_len, 0);
    assert_int_equal(req.client_tools_len, 0);
    assert_null(req.tools_json);
    assert_int_equal(req.has_tool_choice, 0);
    assert_int_equal(req.parallel_tool_calls, -1);
    assert_int_equal(req.max_tokens, 0);
    assert_true(req.temperature < 0);
    assert_null(req.conversation_id);
    loom__chat_request_clear(&req);

    /* The string forms of tool_choice; stream false; temperature 0 and
     * 2 (the ends of the range) and an integer temperature. */
    assert_int_equal(parse(&req, &err,
                           "{\"model\":\"m\"," MSGS ",\"tool_choice\":"
                           "\"required\",\"stream\":false,"
                           "\"temperature\":2}"),
                     0);
    assert_int_equal(req.tool_choice.kind, LOOM_TOOL_CHOICE_REQUIRED);
    assert_true(req.temperature > 1.99);
    loom__chat_request_clear(&req);
    assert_int_equal(parse(&req, &err,
                           "{\"model\":\"m\"," MSGS ",\"tool_choice\":"
                           "\"none\",\"temperature\":0.0}"),
                     0);
    assert_int_equal(req.tool_choice.kind, LOOM_TOOL_CHOICE_NONE);
    assert_true(req.temperature == 0.0);
    loom__chat_request_clear(&req);
    assert_int_equal(parse(&req, &err,
                           "{\"model\":\"m\"," MSGS ",\"tool_choice\":"
                           "\"auto\",\"max_tokens\":7}"),
                     0);
    assert_int_equal(req.has_tool_choice, 1);
    assert_int_equal(req.tool_choice.kind, LOOM_TOOL_CHOICE_AUTO);
    assert_int_equal(req.max_tokens, 7);
    loom__chat_request_clear(&req);
    loom__chat_error_clear(&err);
}

static void test_parse_wrong_types(void **state)
{
    (void)state;
    /* The body itself. */
    expect_bad("[]", NULL, "invalid_json");
    expect_bad("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
               "model", "missing_required_parameter");
    expect_bad("{\"model\":5," MSGS "}", "model", "invalid_type");
    expect_bad("{\"model\":\"\"," MSGS "}", "model", "invalid_value");
    expect_bad("{\"model\":\"m\"}", "messages",
               "missing_required_parameter");
    expect_bad("{\"model\":\"m\",\"messages\":\"hi\"}", "messages",
               "invalid_type");
    expect_bad("{\"model\":\"m\",\"messages\":[]}", "messages",
               "empty_array");

    /* Messages. */
    expect_bad_msg("5", "messages[0]", "invalid_type");
    expect_bad("{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
               "\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\"},"
               "{\"role\":7,\"content\":\"c\"}]}",
               "messages[2].role", "invalid_type");
    expect_bad_msg("{\"content\":\"x\"}", "messages[0].role",
                   "missing_required_parameter");
    expect_bad_msg("{\"role\":\"robot\",\"content\":\"x\"}",
                   "messages[0].role", "invalid_value");
    expect_bad_msg("{\"role\":\"function\",\"content\":\"x\"}",
                   "messages[0].role", "invalid_value");
    expect_bad_msg("{\"role\":\"user\",\"content\":5}",
                   "messages[0].content", "invalid_type");
    expect_bad_msg("{\"role\":\"user\",\"content\":{}}",
                   "messages[0].content", "invalid_type");
    expect_bad_msg("{\"role\":\"user\"}", "messages[0].content",
                   "missing_required_parameter");
    expect_bad_msg("{\"role\":\"system\",\"content\":null}",
                   "messages[0].content", "missing_required_parameter");
    expect_bad_msg("{\"role\":\"user\",\"content\":\"x\",\"name\":5}",
                   "messages[0].name", "invalid_type");
    expect_bad_msg("{\"role\":\"user\",\"content\":[\"x\"]}",
                   "messages[0].content[0]", "invalid_type");
    expect_bad_msg("{\"role\":\"user\",\"content\":[{\"text\":\"x\"}]}",
                   "messages[0].content[0].type",
                   "missing_required_parameter");
    expect_bad_msg("{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                   "\"text\":\"a\"},{\"type\":\"input_audio\","
                   "\"input_audio\":{\"data\":\"AAAA\"}}]}",
                   "messages[0].content[1].type", "unsupported_value");
    expect_bad_msg("{\"role\":\"user\",\"content\":[{\"type\":\"text\","
                   "\"text\":5}]}",
                   "messages[0].content[0].text", "invalid_type");
    expect_bad_msg("{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}",
                   "messages[0].content[0].text",
                   "missing_required_parameter");
    expect_bad_msg("{\"role\":\"assistant\"}", "messages[0].content",
                   "missing_required_parameter");
    expect_bad_msg("{\"role\":\"assistant\",\"content\":null,"
                   "\"tool_calls\":[]}",
                   "messages[0].content", "missing_required_parameter");
    expect_bad_msg("{\"role\":\"assistant\",\"tool_calls\":\"x\"}",
                   "messages[0].tool_calls", "invalid_type");
    expect_bad_msg("{\"role\":\"assistant\",\"tool_calls\":[5]}",
                   "messages[0].tool_calls[0]", "invalid_type");
    expect_bad_msg("{\"role\":\"assistant\",\"tool_calls\":[{\"function\":"
                   "{\"name\":\"f\",\"arguments\":\"{}\"}}]}",
                   "messages[0].tool_calls[0].id",
                   "missing_required_parameter");
    expect_bad_msg("{\"role\":\"assistant\",\"tool_calls\":[{\"id\":1,"
                   "\"function\":{\"name\":\"f\"}}]}",
                   "messages[0].tool_calls[0].id", "invalid_type");
    expect_bad_msg("{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\","
                   "\"type\":\"custom\",\"function\":{\"name\":\"f\"}}]}",
                   "messages[0].tool_calls[0].type", "invalid_value");
    expect_bad_msg("{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\","
                   "\"type\":5,\"function\":{\"name\":\"f\"}}]}",
                   "messages[0].tool_calls[0].type", "invalid_type");
    expect_bad_msg("{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\"}]}",
                   "messages[0].tool_calls[0].function",
                   "missing_required_parameter");
    expect_bad_msg("{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\","
                   "\"function\":\"f\"}]}",
                   "messages[0].tool_calls[0].function", "invalid_type");
    expect_bad_msg("{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\","
                   "\"function\":{\"name\":5}}]}",
                   "messages[0].tool_calls[0].function.name",
                   "invalid_type");
    expect_bad_msg("{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\","
                   "\"function\":{\"arguments\":\"{}\"}}]}",
                   "messages[0].tool_calls[0].function.name",
                   "missing_required_parameter");
    expect_bad_msg("{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\","
                   "\"function\":{\"name\":\"f\",\"arguments\":{}}}]}",
                   "messages[0].tool_calls[0].function.arguments",
                   "invalid_type");
    expect_bad_msg("{\"role\":\"tool\",\"content\":\"x\"}",
                   "messages[0].tool_call_id", "missing_required_parameter");
    expect_bad_msg("{\"role\":\"tool\",\"tool_call_id\":5,\"content\":\"x\"}",
                   "messages[0].tool_call_id", "invalid_type");
    expect_bad_msg("{\"role\":\"tool\",\"tool_call_id\":\"c\"}",
                   "messages[0].content", "missing_required_parameter");

    /* Options. */
    expect_bad_extra(",\"stream\":\"yes\"", "stream", "invalid_type");
    expect_bad_extra(",\"stream\":1", "stream", "invalid_type");
    expect_bad_extra(",\"stream_options\":true", "stream_options",
                     "invalid_type");
    expect_bad_extra(",\"stream_options\":{\"include_usage\":\"y\"}",
                     "stream_options.include_usage", "invalid_type");
    expect_bad_extra(",\"parallel_tool_calls\":\"no\"",
                     "parallel_tool_calls", "invalid_type");
    expect_bad_extra(",\"max_tokens\":\"10\"", "max_tokens", "invalid_type");
    expect_bad_extra(",\"max_tokens\":1.5", "max_tokens", "invalid_type");
    expect_bad_extra(",\"max_tokens\":0", "max_tokens", "invalid_value");
    expect_bad_extra(",\"max_completion_tokens\":[]",
                     "max_completion_tokens", "invalid_type");
    expect_bad_extra(",\"max_completion_tokens\":-3",
                     "max_completion_tokens", "invalid_value");
    expect_bad_extra(",\"temperature\":\"hot\"", "temperature",
                     "invalid_type");
    expect_bad_extra(",\"temperature\":2.5", "temperature", "invalid_value");
    expect_bad_extra(",\"temperature\":-0.1", "temperature",
                     "invalid_value");
    expect_bad_extra(",\"user\":5", "user", "invalid_type");
    expect_bad_extra(",\"conversation_id\":5", "conversation_id",
                     "invalid_type");
    expect_bad_extra(",\"conversation_id\":\"\"", "conversation_id",
                     "invalid_value");

    /* Tools. */
    expect_bad_extra(",\"tools\":\"get_time\"", "tools", "invalid_type");
    expect_bad_extra(",\"tools\":[5]", "tools[0]", "invalid_type");
    expect_bad_extra(",\"tools\":[\"get_time\",true]", "tools[1]",
                     "invalid_type");
    expect_bad_extra(",\"tools\":[\"no spaces\"]", "tools[0]",
                     "invalid_value");
    expect_bad_extra(",\"tools\":[\"\"]", "tools[0]", "invalid_value");
    expect_bad_extra(",\"tools\":[{\"function\":{\"name\":\"f\"}}]",
                     "tools[0].type", "missing_required_parameter");
    expect_bad_extra(",\"tools\":[{\"type\":5,\"function\":{\"name\":\"f\"}}]",
                     "tools[0].type", "invalid_type");
    expect_bad_extra(",\"tools\":[{\"type\":\"web_search\"}]",
                     "tools[0].type", "invalid_value");
    expect_bad_extra(",\"tools\":[{\"type\":\"function\"}]",
                     "tools[0].function", "missing_required_parameter");
    expect_bad_extra(",\"tools\":[{\"type\":\"function\",\"function\":[]}]",
                     "tools[0].function", "invalid_type");
    expect_bad_extra(",\"tools\":[\"a\",{\"type\":\"function\",\"function\":"
                     "{\"name\":7}}]",
                     "tools[1].function.name", "invalid_type");
    expect_bad_extra(",\"tools\":[{\"type\":\"function\",\"function\":"
                     "{\"description\":\"d\"}}]",
                     "tools[0].function.name", "missing_required_parameter");
    expect_bad_extra(",\"tools\":[{\"type\":\"function\",\"function\":"
                     "{\"name\":\"a.b\"}}]",
                     "tools[0].function.name", "invalid_value");
    expect_bad_extra(",\"tools\":[{\"type\":\"function\",\"function\":"
                     "{\"name\":\"f\",\"description\":[]}}]",
                     "tools[0].function.description", "invalid_type");
    expect_bad_extra(",\"tools\":[{\"type\":\"function\",\"function\":"
                     "{\"name\":\"f\",\"parameters\":\"{}\"}}]",
                     "tools[0].function.parameters", "invalid_type");

    /* tool_choice. */
    expect_bad_extra(",\"tool_choice\":5", "tool_choice", "invalid_type");
    expect_bad_extra(",\"tool_choice\":\"sometimes\"", "tool_choice",
                     "invalid_value");
    expect_bad_extra(",\"tool_choice\":{\"function\":{\"name\":\"f\"}}",
                     "tool_choice.type", "missing_required_parameter");
    expect_bad_extra(",\"tool_choice\":{\"type\":\"file_search\"}",
                     "tool_choice.type", "invalid_value");
    expect_bad_extra(",\"tool_choice\":{\"type\":\"function\"}",
                     "tool_choice.function", "missing_required_parameter");
    expect_bad_extra(",\"tool_choice\":{\"type\":\"function\","
                     "\"function\":\"f\"}",
                     "tool_choice.function", "invalid_type");
    expect_bad_extra(",\"tool_choice\":{\"type\":\"function\","
                     "\"function\":{\"name\":1}}",
                     "tool_choice.function.name", "invalid_type");
}

/* loom_budget: each limit read (dollars into micro-dollars), null and
 * absent are none; a wrong type, value or key is a 400 naming it. */
static void test_parse_budget(void **state)
{
    loom__chat_request req;
    loom__chat_error err;

    (void)state;
    assert_int_equal(parse(&req, &err,
                           "{\"model\":\"m\"," MSGS ",\"loom_budget\":"
                           "{\"max_cost_usd\":0.05,\"max_tokens\":20000,"
                           "\"max_seconds\":60}}"),
                     0);
    assert_int_equal(req.budget.max_cost_micros, 50000);
    assert_int_equal(req.budget.max_tokens, 20000);
    assert_int_equal(req.budget.max_seconds, 60);
    loom__chat_request_clear(&req);
    assert_int_equal(parse(&req, &err,
                           "{\"model\":\"m\"," MSGS ",\"loom_budget\":"
                           "{\"max_tokens\":null}}"),
                     0);
    assert_int_equal(req.budget.max_tokens, 0);
    assert_int_equal(req.budget.max_cost_micros, 0);
    loom__chat_request_clear(&req);
    expect_bad("{\"model\":\"m\"," MSGS ",\"loom_budget\":5}", "loom_budget",
               "invalid_type");
    expect_bad("{\"model\":\"m\"," MSGS
               ",\"loom_budget\":{\"max_cost_usd\":0}}",
               "loom_budget.max_cost_usd", "invalid_value");
    expect_bad("{\"model\":\"m\"," MSGS
               ",\"loom_budget\":{\"max_tokens\":1.5}}",
               "loom_budget.max_tokens", "invalid_type");
    expect_bad("{\"model\":\"m\"," MSGS ",\"loom_budget\":{\"max_seconds\":0}}",
               "loom_budget.max_seconds", "invalid_value");
    expect_bad("{\"model\":\"m\"," MSGS ",\"loom_budget\":{\"max_dollars\":1}}",
               "loom_budget.max_dollars", "unknown_parameter");
}

static void test_parse_text(void **state)
{
    loom__chat_request req;
    loom__chat_error err;
    const char *ok = "{\"model\":\"m\"," MSGS "}";
    (void)state;

    assert_int_equal(loom__chat_request_parse_text(&req, "{\"model\":", 9,
                                                   &err),
                     LOOM_EINVALID);
    assert_int_equal(err.status, 400);
    assert_string_equal(err.code, "invalid_json");
    assert_non_null(strstr(err.message, "could not parse"));
    assert_non_null(strstr(err.message, "at byte offset 9"));
    loom__chat_error_clear(&err);
    assert_int_equal(loom__chat_request_parse_text(&req, "", 0, &err),
                     LOOM_EINVALID);
    assert_string_equal(err.code, "invalid_json");
    loom__chat_error_clear(&err);
    assert_int_equal(loom__chat_request_parse_text(&req, NULL, 0, &err),
                     LOOM_EINVALID);
    loom__chat_error_clear(&err);
    /* Valid JSON that is not an object. */
    assert_int_equal(loom__chat_request_parse_text(&req, "[1]", 3, &err),
                     LOOM_EINVALID);
    assert_string_equal(err.code, "invalid_json");
    loom__chat_error_clear(&err);
    assert_int_equal(loom__chat_request_parse_text(&req, ok, strlen(ok),
                                                   &err),
                     0);
    assert_string_equal(req.model, "m");
    assert_int_equal(req.messages.len, 1);
    loom__chat_request_clear(&req);
}

/* n copies of item, comma-separated, in a JSON array. */
static char *repeat(const char *item, size_t n)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);

    assert_int_equal(loom_buf_putc(&b, '['), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(loom_buf_printf(&b, "%s%s", i ? "," : "", item), 0);
    assert_int_equal(loom_buf_putc(&b, ']'), 0);
    return loom_buf_detach(&b);
}

static void test_parse_limits(void **state)
{
    loom__chat_request req;
    loom__chat_error err;
    char *arr, *body;
    (void)state;

    /* Messages: the limit passes, one more fails. */
    for (size_t n = LOOM__CHAT_MAX_MESSAGES; n <= LOOM__CHAT_MAX_MESSAGES + 1;
         n++) {
        arr = repeat("{\"role\":\"user\",\"content\":\"x\"}", n);
        assert_true(asprintf(&body, "{\"model\":\"m\",\"messages\":%s}",
                             arr) > 0);
        if (n == LOOM__CHAT_MAX_MESSAGES) {
            assert_int_equal(parse(&req, &err, body), 0);
            assert_int_equal(req.messages.len, n);
            loom__chat_request_clear(&req);
        } else {
            expect_bad(body, "messages", "array_above_max_length");
        }
        free(arr);
        free(body);
    }
    /* Tools. */
    for (size_t n = LOOM__CHAT_MAX_TOOLS; n <= LOOM__CHAT_MAX_TOOLS + 1;
         n++) {
        arr = repeat("\"get_time\"", n);
        assert_true(asprintf(&body, ",\"tools\":%s", arr) > 0);
        if (n == LOOM__CHAT_MAX_TOOLS) {
            char *b = body_with(body);
            assert_int_equal(parse(&req, &err, b), 0);
            assert_int_equal(req.tool_names_len, n);
            loom__chat_request_clear(&req);
            free(b);
        } else {
            expect_bad_extra(body, "tools", "array_above_max_length");
        }
        free(arr);
        free(body);
    }
    /* Content parts of one message. */
    for (size_t n = LOOM__CHAT_MAX_PARTS; n <= LOOM__CHAT_MAX_PARTS + 1;
         n++) {
        arr = repeat("{\"type\":\"text\",\"text\":\"p\"}", n);
        assert_true(asprintf(&body,
                             "{\"model\":\"m\",\"messages\":[{\"role\":"
                             "\"user\",\"content\":%s}]}",
                             arr) > 0);
        if (n == LOOM__CHAT_MAX_PARTS) {
            assert_int_equal(parse(&req, &err, body), 0);
            assert_int_equal(strlen(req.messages.items[0].content),
                             2 * n - 1);
            loom__chat_request_clear(&req);
        } else {
            expect_bad(body, "messages[0].content",
                       "array_above_max_length");
        }
        free(arr);
        free(body);
    }
    /* Tool calls of one assistant message. */
    arr = repeat("{\"id\":\"c\",\"function\":{\"name\":\"f\"}}",
                 LOOM__CHAT_MAX_TOOLS + 1);
    assert_true(asprintf(&body,
                         "{\"role\":\"assistant\",\"tool_calls\":%s}",
                         arr) > 0);
    expect_bad_msg(body, "messages[0].tool_calls", "array_above_max_length");
    free(arr);
    free(body);
    /* Tool names: 64 characters pass, 65 fail. */
    {
        char name[80], extra[128];
        memset(name, 'a', 64);
        name[64] = '\0';
        snprintf(extra, sizeof(extra), ",\"tools\":[\"%s\"]", name);
        body = body_with(extra);
        assert_int_equal(parse(&req, &err, body), 0);
        loom__chat_request_clear(&req);
        free(body);
        name[64] = 'a';
        name[65] = '\0';
        snprintf(extra, sizeof(extra), ",\"tools\":[\"%s\"]", name);
        expect_bad_extra(extra, "tools[0]", "invalid_value");
    }
    /* conversation_id: 128 characters pass, 129 fail. */
    {
        char id[140], extra[200];
        memset(id, 'c', 128);
        id[128] = '\0';
        snprintf(extra, sizeof(extra), ",\"conversation_id\":\"%s\"", id);
        body = body_with(extra);
        assert_int_equal(parse(&req, &err, body), 0);
        assert_int_equal(strlen(req.conversation_id), 128);
        loom__chat_request_clear(&req);
        free(body);
        id[128] = 'c';
        id[129] = '\0';
        snprintf(extra, sizeof(extra), ",\"conversation_id\":\"%s\"", id);
        expect_bad_extra(extra, "conversation_id", "invalid_value");
    }
}

/* ---- tool resolution ------------------------------------------------- */

static int noop_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    (void)args;
    (void)ctx;
    (void)payload;
    return loom_buf_puts(out, "ok");
}

static loom_tool_registry *registry(void)
{
    loom_tool_registry *reg;
    const char *names[] = {"get_time", "web_search", "web_fetch"};
    loom_tool t;

    assert_int_equal(loom_tool_registry_new(&reg), 0);
    for (size_t i = 0; i < 3; i++) {
        memset(&t, 0, sizeof(t));
        t.name = names[i];
        t.description = "d";
        t.execute = noop_exec;
        assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    }
    return reg;
}

static loom__chat_request cur_req;

static int resolve(const char *extra, const char *const *agent, size_t nagent,
                   int agent_all, const char ***names, size_t *n, int *all,
                   loom__chat_error *err, loom_tool_registry *reg)
{
    loom__chat_error perr;
    char *body = body_with(extra);

    /* The names are borrowed from the request: keep it until the next
     * call (or resolve_done). */
    loom__chat_request_clear(&cur_req);
    assert_int_equal(parse(&cur_req, &perr, body), 0);
    free(body);
    return loom__chat_server_tools(names, n, all, &cur_req, reg, agent,
                                   nagent, agent_all, err);
}

static void test_server_tools(void **state)
{
    loom_tool_registry *reg = registry();
    const char *agent[] = {"web_fetch", "get_time"};
    const char **names;
    loom__chat_error err;
    size_t n;
    int all;
    (void)state;

    /* A plain model: only the names the request gives. */
    assert_int_equal(resolve(",\"tools\":[\"web_search\",\"get_time\","
                             "\"web_search\"]",
                             NULL, 0, 0, &names, &n, &all, &err, reg),
                     0);
    assert_int_equal(all, 0);
    assert_int_equal(n, 2);
    assert_string_equal(names[0], "web_search");
    assert_string_equal(names[1], "get_time");
    free(names);
    /* No tools at all. */
    assert_int_equal(resolve("", NULL, 0, 0, &names, &n, &all, &err, reg), 0);
    assert_int_equal(n, 0);
    assert_null(names);
    /* An agent's tools, then the request's, without duplicates. */
    assert_int_equal(resolve(",\"tools\":[\"get_time\",\"web_search\"]",
                             agent, 2, 0, &names, &n, &all, &err, reg),
                     0);
    assert_int_equal(n, 3);
    assert_string_equal(names[0], "web_fetch");
    assert_string_equal(names[1], "get_time");
    assert_string_equal(names[2], "web_search");
    free(names);
    /* An agent with every tool. */
    assert_int_equal(resolve(",\"tools\":[\"get_time\"]", NULL, 0, 1, &names,
                             &n, &all, &err, reg),
                     0);
    assert_int_equal(all, 1);
    assert_null(names);

    /* An unknown name: 400 naming its position and listing the tools. */
    assert_int_equal(resolve(",\"tools\":[{\"type\":\"function\",\"function\":"
                             "{\"name\":\"mine\"}},\"get_time\",\"nope\"]",
                             NULL, 0, 0, &names, &n, &all, &err, reg),
                     LOOM_EINVALID);
    assert_int_equal(err.status, 400);
    assert_string_equal(err.param, "tools[2]");
    assert_string_equal(err.code, "unknown_tool");
    assert_non_null(strstr(err.message, "'nope'"));
    assert_non_null(
        strstr(err.message, "Available tools: get_time, web_search, "
                            "web_fetch."));
    loom__chat_error_clear(&err);

    /* A client tool may not take a server tool's name... */
    assert_int_equal(resolve(",\"tools\":[\"web_search\",{\"type\":"
                             "\"function\",\"function\":{\"name\":"
                             "\"web_search\"}}]",
                             NULL, 0, 0, &names, &n, &all, &err, reg),
                     LOOM_EINVALID);
    assert_string_equal(err.param, "tools[1].function.name");
    loom__chat_error_clear(&err);
    /* ...an agent's tool's name either... */
    assert_int_equal(resolve(",\"tools\":[{\"type\":\"function\","
                             "\"function\":{\"name\":\"web_fetch\"}}]",
                             agent, 2, 0, &names, &n, &all, &err, reg),
                     LOOM_EINVALID);
    assert_string_equal(err.param, "tools[0].function.name");
    loom__chat_error_clear(&err);
    /* ...but may when loom does not offer that tool here. */
    assert_int_equal(resolve(",\"tools\":[{\"type\":\"function\","
                             "\"function\":{\"name\":\"web_fetch\"}}]",
                             NULL, 0, 0, &names, &n, &all, &err, reg),
                     0);
    free(names);
    /* Every registered tool is offered with agent_all. */
    assert_int_equal(resolve(",\"tools\":[{\"type\":\"function\","
                             "\"function\":{\"name\":\"get_time\"}}]",
                             NULL, 0, 1, &names, &n, &all, &err, reg),
                     LOOM_EINVALID);
    loom__chat_error_clear(&err);
    /* Two client tools of one name. */
    assert_int_equal(resolve(",\"tools\":[{\"type\":\"function\","
                             "\"function\":{\"name\":\"f\"}},{\"type\":"
                             "\"function\",\"function\":{\"name\":\"f\"}}]",
                             NULL, 0, 0, &names, &n, &all, &err, reg),
                     LOOM_EINVALID);
    assert_string_equal(err.param, "tools[1].function.name");
    assert_non_null(strstr(err.message, "twice"));
    loom__chat_error_clear(&err);

    /* tool_choice must name an offered tool, server or client. */
    assert_int_equal(resolve(",\"tools\":[\"get_time\"],\"tool_choice\":"
                             "{\"type\":\"function\",\"function\":{\"name\":"
                             "\"web_search\"}}",
                             NULL, 0, 0, &names, &n, &all, &err, reg),
                     LOOM_EINVALID);
    assert_string_equal(err.param, "tool_choice.function.name");
    loom__chat_error_clear(&err);
    free(names);
    assert_int_equal(resolve(",\"tools\":[{\"type\":\"function\","
                             "\"function\":{\"name\":\"f\"}}],\"tool_choice\":"
                             "{\"type\":\"function\",\"function\":{\"name\":"
                             "\"f\"}}",
                             NULL, 0, 0, &names, &n, &all, &err, reg),
                     0);
    free(names);
    assert_int_equal(resolve(",\"tool_choice\":{\"type\":\"function\","
                             "\"function\":{\"name\":\"get_time\"}}",
                             agent, 2, 0, &names, &n, &all, &err, reg),
                     0);
    free(names);
    loom__chat_request_clear(&cur_req);
    loom_tool_registry_free(reg);
}

/* ---- run failures as OpenAI errors ------------------------------------ */

static void expect_failure(const char *data, int status, const char *type,
                           const char *code)
{
    loom__chat_error e;
    json_t *d = J(data), *ej;

    memset(&e, 0, sizeof(e));
    assert_int_equal(loom__chat_error_from_failure(&e, d), LOOM_EINVALID);
    if (e.status != status)
        fail_msg("status %d, want %d for %s", e.status, status, data);
    assert_string_equal(e.type, type);
    if (code)
        assert_string_equal(e.code, code);
    else
        assert_null(e.code);
    /* The message is the run's, and the JSON has OpenAI's four keys. */
    ej = loom__chat_error_json(&e);
    assert_int_equal(json_object_size(json_object_get(ej, "error")), 4);
    assert_true(json_is_null(
        json_object_get(json_object_get(ej, "error"), "param")));
    assert_string_equal(
        json_string_value(
            json_object_get(json_object_get(ej, "error"), "message")),
        json_string_value(json_object_get(json_object_get(d, "error"),
                                          "message")));
    json_decref(ej);
    json_decref(d);
    loom__chat_error_clear(&e);
}

static void test_error_from_failure(void **state)
{
    (void)state;
    expect_failure("{\"status\":\"failed\",\"error\":{\"code\":\"EUPSTREAM\","
                   "\"message\":\"fake: 429 rate_limit: slow down\","
                   "\"kind\":\"rate_limit\",\"http_status\":429}}",
                   429, "rate_limit_error", "rate_limit_exceeded");
    expect_failure("{\"status\":\"failed\",\"error\":{\"code\":\"EUPSTREAM\","
                   "\"message\":\"fake: 500 server: boom\","
                   "\"kind\":\"server\",\"http_status\":500}}",
                   502, "upstream_error", "upstream_error");
    expect_failure("{\"status\":\"failed\",\"error\":{\"code\":\"EUPSTREAM\","
                   "\"message\":\"fake: 503 server: down\","
                   "\"kind\":\"server\",\"http_status\":503}}",
                   502, "upstream_error", "upstream_error");
    expect_failure("{\"status\":\"failed\",\"error\":{\"code\":\"ETIMEDOUT\","
                   "\"message\":\"fake: timeout: no first byte\","
                   "\"kind\":\"timeout\"}}",
                   504, "timeout", "upstream_timeout");
    expect_failure("{\"status\":\"failed\",\"error\":{\"code\":\"ETIMEDOUT\","
                   "\"message\":\"too slow\"}}",
                   504, "timeout", "upstream_timeout");
    expect_failure("{\"status\":\"failed\",\"error\":{\"code\":\"EUPSTREAM\","
                   "\"message\":\"fake: 400 bad_request: context too long\","
                   "\"kind\":\"bad_request\",\"http_status\":400}}",
                   400, "invalid_request_error", "upstream_error");
    expect_failure("{\"status\":\"failed\",\"error\":{\"code\":\"EUPSTREAM\","
                   "\"message\":\"fake: 404 not_found: no model\","
                   "\"kind\":\"not_found\",\"http_status\":404}}",
                   404, "not_found_error", "upstream_error");
    expect_failure("{\"status\":\"failed\",\"error\":{\"code\":\"EUPSTREAM\","
                   "\"message\":\"fake: 401 authentication: bad key\","
                   "\"kind\":\"authentication\",\"http_status\":401}}",
                   502, "upstream_error", "upstream_auth_failed");
    expect_failure("{\"status\":\"failed\",\"error\":{\"code\":\"EIO\","
                   "\"message\":\"fake: connection: refused\","
                   "\"kind\":\"connection\"}}",
                   502, "upstream_error", "upstream_error");
    expect_failure("{\"status\":\"failed\",\"error\":{\"code\":\"EPROTO\","
                   "\"message\":\"bad body\"}}",
                   502, "upstream_error", "upstream_error");
    expect_failure("{\"status\":\"cancelled\",\"error\":{\"code\":"
                   "\"cancelled\",\"message\":\"run cancelled\"}}",
                   503, "server_error", "cancelled");
    expect_failure("{\"status\":\"failed\",\"error\":{\"code\":\"ERROR\","
                   "\"message\":\"agent: unknown tool\"}}",
                   500, "server_error", NULL);
}

/* ---- rendering ------------------------------------------------------- */

/* A formatter for the tests; client: the client's one tool, or NULL. */
static loom__chat_fmt *fmt_with(int include_usage, const char *conv,
                                int server_calls_inline,
                                const loom_tool_def *client)
{
    loom__chat_fmt_opts o;
    loom__chat_fmt *f;

    memset(&o, 0, sizeof(o));
    o.id = "chatcmpl-abc";
    o.model = "agent/helper";
    o.created = 1700000000;
    o.include_usage = include_usage;
    o.conversation_id = conv;
    o.server_calls_inline = server_calls_inline;
    o.client_tools = client;
    o.client_tools_len = client != NULL;
    assert_int_equal(loom__chat_fmt_new(&f, &o), 0);
    return f;
}

/* The seed-compatible shape, every call in tool_calls, which the tests
 * below were written for; test_stream_server_calls_apart checks the
 * default. */
static loom__chat_fmt *new_fmt(int include_usage, const char *conv)
{
    return fmt_with(include_usage, conv, 1, NULL);
}

/* Feeds one event of type with data text to f; returns what it wrote. */
static char *feed(loom__chat_fmt *f, loom_event_type type, uint32_t index,
                  const char *data)
{
    static uint64_t seq;
    loom_buf out = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    loom_event ev;
    char *s;

    ev.type = type;
    ev.seq = ++seq;
    ev.index = index;
    ev.run_id = "run_abc";
    ev.data = J(data);
    assert_int_equal(loom__chat_fmt_event(f, &ev, &out), 0);
    json_decref(ev.data);
    s = strdup(loom_buf_cstr(&out));
    loom_buf_free(&out);
    return s;
}

/* Feeds an event whose bytes do not matter. */
static void feed_only(loom__chat_fmt *f, loom_event_type type, uint32_t index,
                      const char *data)
{
    free(feed(f, type, index, data));
}

static void expect_feed(loom__chat_fmt *f, loom_event_type type,
                        uint32_t index, const char *data, const char *want)
{
    char *got = feed(f, type, index, data);
    assert_string_equal(got, want);
    free(got);
}

static void expect_end(loom__chat_fmt *f, const char *want)
{
    loom_buf b = LOOM_BUF_INIT(4096);

    assert_int_equal(loom__chat_fmt_end(f, &b), 0);
    assert_string_equal(loom_buf_cstr(&b), want);
    /* Only the first call writes. */
    loom_buf_clear(&b);
    assert_int_equal(loom__chat_fmt_end(f, &b), 0);
    assert_int_equal(b.len, 0);
    loom_buf_free(&b);
}

#define HEAD                                                                 \
    "data: {\"id\":\"chatcmpl-abc\",\"object\":\"chat.completion.chunk\","   \
    "\"created\":1700000000,\"model\":\"agent/helper\",\"choices\":"
#define DELTA(d) HEAD "[{\"index\":0,\"delta\":" d ",\"logprobs\":null,"    \
                      "\"finish_reason\":null}]}\n\n"

static const char *const tool_calls_1 =
    "{\"calls\":[{\"id\":\"call_1\",\"name\":\"get_time\",\"arguments\":"
    "\"{\\\"tz\\\":\\\"UTC\\\"}\"},{\"id\":\"call_2\",\"name\":\"fail\","
    "\"arguments\":\"\"}]}";

static void test_stream_bytes(void **state)
{
    loom__chat_fmt *f = new_fmt(1, "conv_1");
    char *s;
    (void)state;

    /* The first event, whatever it is, brings the role chunk, with the
     * conversation id. run.started itself says nothing more. */
    expect_feed(f, LOOM_EV_RUN_STARTED, 0,
                "{\"agent\":\"helper\",\"conversation_id\":\"conv_1\"}",
                HEAD "[{\"index\":0,\"delta\":{\"role\":\"assistant\","
                     "\"content\":\"\"},\"logprobs\":null,"
                     "\"finish_reason\":null}],"
                     "\"conversation_id\":\"conv_1\"}\n\n");
    /* begin after the start is a no-op. */
    {
        loom_buf b = LOOM_BUF_INIT(1024);
        assert_int_equal(loom__chat_fmt_begin(f, &b), 0);
        assert_int_equal(b.len, 0);
        loom_buf_free(&b);
    }
    expect_feed(f, LOOM_EV_MESSAGE_DELTA, 0,
                "{\"delta\":\"Let me \\\"check\\\".\"}",
                DELTA("{\"content\":\"Let me \\\"check\\\".\"}"));
    expect_feed(f, LOOM_EV_MESSAGE_DELTA, 0, "{\"delta\":\"\"}", "");
    expect_feed(f, LOOM_EV_REASONING_DELTA, 0, "{\"delta\":\"hmm\"}",
                DELTA("{\"reasoning_content\":\"hmm\"}"));
    /* One consolidated tool_calls delta; empty arguments become {}. */
    expect_feed(f, LOOM_EV_TOOL_CALLS, 0, tool_calls_1,
                DELTA("{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\","
                      "\"type\":\"function\",\"function\":{\"name\":"
                      "\"get_time\",\"arguments\":\"{\\\"tz\\\":"
                      "\\\"UTC\\\"}\"}},{\"index\":1,\"id\":\"call_2\","
                      "\"type\":\"function\",\"function\":{\"name\":"
                      "\"fail\",\"arguments\":\"{}\"}}]}"));
    expect_feed(f, LOOM_EV_TOOL_STARTED, 0,
                "{\"id\":\"call_1\",\"name\":\"get_time\",\"arguments\":{}}",
                "");
    expect_feed(f, LOOM_EV_TOOL_COMPLETED, 0,
                "{\"id\":\"call_1\",\"name\":\"get_time\",\"output\":"
                "\"12:00\",\"truncated\":false,\"output_size\":5,"
                "\"duration_ms\":0.1}",
                DELTA("{\"tool_output\":{\"tool_call_id\":\"call_1\","
                      "\"name\":\"get_time\",\"output\":\"12:00\"}}"));
    expect_feed(f, LOOM_EV_TOOL_FAILED, 0,
                "{\"id\":\"call_2\",\"name\":\"fail\",\"stage\":"
                "\"execution\",\"error\":\"x\",\"output\":\"Error: x\","
                "\"duration_ms\":0.1}",
                DELTA("{\"tool_output\":{\"tool_call_id\":\"call_2\","
                      "\"name\":\"fail\",\"output\":\"Error: x\"}}"));
    expect_feed(f, LOOM_EV_USAGE, 0,
                "{\"prompt_tokens\":5,\"completion_tokens\":2}", "");
    /* The next turn's calls continue the index. */
    expect_feed(f, LOOM_EV_TOOL_CALLS, 1,
                "{\"calls\":[{\"id\":\"call_3\",\"name\":\"get_time\","
                "\"arguments\":\"{}\"}]}",
                DELTA("{\"tool_calls\":[{\"index\":2,\"id\":\"call_3\","
                      "\"type\":\"function\",\"function\":{\"name\":"
                      "\"get_time\",\"arguments\":\"{}\"}}]}"));
    expect_feed(f, LOOM_EV_MESSAGE_DELTA, 2, "{\"delta\":\"Noon.\"}",
                DELTA("{\"content\":\"Noon.\"}"));
    /* The end: finish chunk, usage chunk summing the run, [DONE]. The
     * loop answered its own calls, so the message finished: "stop". */
    expect_feed(f, LOOM_EV_RUN_COMPLETED, 2,
                "{\"status\":\"completed\",\"text\":\"Noon.\","
                "\"iterations\":3,\"finish_reason\":\"stop\",\"usage\":"
                "{\"prompt_tokens\":30,\"completion_tokens\":9,"
                "\"cached_tokens\":4,\"reasoning_tokens\":0,"
                "\"total_tokens\":39}}",
                HEAD "[{\"index\":0,\"delta\":{},\"logprobs\":null,"
                     "\"finish_reason\":\"stop\"}]}\n\n" HEAD
                     "[],\"usage\":{\"prompt_tokens\":30,"
                     "\"completion_tokens\":9,\"total_tokens\":39,"
                     "\"prompt_tokens_details\":{\"cached_tokens\":4},"
                     "\"cached_tokens\":4,\"reasoning_tokens\":0,"
                     "\"cache_write_tokens\":0,\"cost_micros\":null}}\n\n");
    assert_int_equal(loom__chat_fmt_done(f), 1);
    assert_null(loom__chat_fmt_failure(f));
    /* Nothing after the end. */
    s = feed(f, LOOM_EV_MESSAGE_DELTA, 2, "{\"delta\":\"late\"}");
    assert_string_equal(s, "");
    free(s);
    /* [DONE] once the run has ended (and its turn is stored). */
    expect_end(f, "data: [DONE]\n\n");
    loom__chat_fmt_free(f);
}

static void test_stream_without_usage(void **state)
{
    loom__chat_fmt *f = new_fmt(0, NULL);
    loom_buf b = LOOM_BUF_INIT(4096);
    (void)state;

    /* begin: the role chunk, without conversation_id when there is none. */
    assert_int_equal(loom__chat_fmt_begin(f, &b), 0);
    assert_string_equal(loom_buf_cstr(&b),
                        DELTA("{\"role\":\"assistant\",\"content\":\"\"}"));
    loom_buf_free(&b);
    expect_feed(f, LOOM_EV_MESSAGE_DELTA, 0, "{\"delta\":\"Hi\"}",
                DELTA("{\"content\":\"Hi\"}"));
    /* A length cut passes through; no usage chunk. */
    expect_feed(f, LOOM_EV_RUN_COMPLETED, 0,
                "{\"status\":\"completed\",\"text\":\"Hi\",\"finish_reason\":"
                "\"length\",\"usage\":{\"prompt_tokens\":1}}",
                HEAD "[{\"index\":0,\"delta\":{},\"logprobs\":null,"
                     "\"finish_reason\":\"length\"}]}\n\n");
    expect_end(f, "data: [DONE]\n\n");
    loom__chat_fmt_free(f);
}

static void test_stream_client_tools(void **state)
{
    loom__chat_fmt *f = new_fmt(0, NULL);
    char *s;
    (void)state;

    s = feed(f, LOOM_EV_RUN_STARTED, 0, "{}");
    free(s);
    expect_feed(f, LOOM_EV_TOOL_CALLS, 0,
                "{\"calls\":[{\"id\":\"c1\",\"name\":\"my_fn\","
                "\"arguments\":\"{\\\"a\\\":1}\"}]}",
                DELTA("{\"tool_calls\":[{\"index\":0,\"id\":\"c1\","
                      "\"type\":\"function\",\"function\":{\"name\":"
                      "\"my_fn\",\"arguments\":\"{\\\"a\\\":1}\"}}]}"));
    expect_feed(f, LOOM_EV_RUN_COMPLETED, 0,
                "{\"status\":\"completed\",\"text\":\"\",\"finish_reason\":"
                "\"tool_calls\",\"usage\":{},\"pending_tool_calls\":[{\"id\":"
                "\"c1\",\"name\":\"my_fn\",\"arguments\":\"{\\\"a\\\":1}\"}]}",
                HEAD "[{\"index\":0,\"delta\":{},\"logprobs\":null,"
                     "\"finish_reason\":\"tool_calls\"}]}\n\n");
    expect_end(f, "data: [DONE]\n\n");
    loom__chat_fmt_free(f);
}

static void test_stream_failure(void **state)
{
    loom__chat_fmt *f = new_fmt(1, "conv_9");
    char *s;
    (void)state;

    s = feed(f, LOOM_EV_MESSAGE_DELTA, 0, "{\"delta\":\"par\"}");
    assert_non_null(strstr(s, "\"conversation_id\":\"conv_9\""));
    free(s);
    /* An error event in OpenAI's shape, and no [DONE]. */
    expect_feed(f, LOOM_EV_RUN_FAILED, 0,
                "{\"status\":\"failed\",\"error\":{\"code\":\"EUPSTREAM\","
                "\"message\":\"fake: 500 server: boom\",\"kind\":\"server\","
                "\"http_status\":500},\"text\":\"par\",\"usage\":{}}",
                "data: {\"error\":{\"message\":\"fake: 500 server: boom\","
                "\"type\":\"upstream_error\",\"param\":null,\"code\":"
                "\"upstream_error\"}}\n\n");
    assert_int_equal(loom__chat_fmt_done(f), 1);
    assert_non_null(loom__chat_fmt_failure(f));
    s = feed(f, LOOM_EV_RUN_COMPLETED, 0, "{\"text\":\"x\"}");
    assert_string_equal(s, "");
    free(s);
    /* No [DONE] after an error. */
    expect_end(f, "");
    {
        json_t *o;
        assert_int_equal(loom__chat_fmt_completion(f, &o), LOOM_EINVALID);
        assert_null(o);
    }
    loom__chat_fmt_free(f);
}

static void test_stream_end_without_result(void **state)
{
    loom__chat_fmt *f = new_fmt(0, NULL);
    char *s;
    (void)state;

    s = feed(f, LOOM_EV_MESSAGE_DELTA, 0, "{\"delta\":\"a\"}");
    free(s);
    /* The log ended without run.completed: an error, not [DONE]. */
    expect_end(f, "data: {\"error\":{\"message\":\"the run ended without "
                  "a result\",\"type\":\"server_error\",\"param\":null,"
                  "\"code\":null}}\n\n");
    assert_int_equal(loom__chat_fmt_done(f), 1);
    assert_non_null(loom__chat_fmt_failure(f));
    loom__chat_fmt_free(f);
}

/*
 * The SSE framing of a stream, as a list of event shapes: each event is
 * "data: <json>\n\n" (nothing else on the wire), and each shape lists the
 * top-level keys in order (minus the ones only one side has) and what the
 * choice holds. Applied to OpenAI's recorded stream and to loom's, the two
 * must agree event kind by event kind.
 */
static char *framing(const char *wire, size_t len)
{
    loom_buf shape = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    const char *p = wire, *end = wire + len;

    while (p < end) {
        const char *nl = strstr(p, "\n\n");
        json_t *o, *c, *ch;
        const char *k;
        json_t *v;
        assert_non_null(nl);
        assert_memory_equal(p, "data: ", 6);
        /* One line per event: no newline inside the data. */
        assert_null(memchr(p, '\n', (size_t)(nl - p)));
        if ((size_t)(nl - p) == 12 && memcmp(p + 6, "[DONE]", 6) == 0) {
            loom_buf_puts(&shape, "[DONE];");
            p = nl + 2;
            assert_true(p == end); /* [DONE] is last */
            break;
        }
        o = json_loadb(p + 6, (size_t)(nl - p - 6), 0, NULL);
        assert_non_null(o);
        json_object_foreach(o, k, v)
        {
            if (strcmp(k, "system_fingerprint") == 0 ||
                strcmp(k, "conversation_id") == 0)
                continue;
            loom_buf_printf(&shape, "%s,", k);
        }
        assert_string_equal(json_string_value(json_object_get(o, "object")),
                            "chat.completion.chunk");
        ch = json_object_get(o, "choices");
        assert_true(json_is_array(ch));
        if (json_array_size(ch) == 0) {
            assert_true(json_is_object(json_object_get(o, "usage")));
            loom_buf_puts(&shape, "usage;");
        } else {
            c = json_array_get(ch, 0);
            assert_int_equal(json_integer_value(json_object_get(c, "index")),
                             0);
            v = json_object_get(c, "delta");
            if (json_object_get(v, "role"))
                loom_buf_printf(&shape, "role:%s:%s;",
                                json_string_value(json_object_get(v, "role")),
                                json_string_value(
                                    json_object_get(v, "content")));
            else if (json_object_size(v) == 0)
                loom_buf_printf(&shape, "finish:%s;",
                                json_string_value(
                                    json_object_get(c, "finish_reason")));
            else if (json_object_get(v, "content"))
                loom_buf_puts(&shape, "content;");
            else
                loom_buf_puts(&shape, "other;");
        }
        json_decref(o);
        p = nl + 2;
    }
    return loom_buf_detach(&shape);
}

/* Collapses runs of identical event shapes (the content chunks), so
 * streams of any length compare. */
static void squeeze(char *s)
{
    char *prev = s, *cur;

    if (!(cur = strchr(s, ';')))
        return;
    cur++;
    while (*cur) {
        char *end = strchr(cur, ';');
        size_t plen = (size_t)(cur - prev), clen;
        assert_non_null(end);
        clen = (size_t)(end + 1 - cur);
        if (clen == plen && memcmp(prev, cur, clen) == 0) {
            memmove(cur, end + 1, strlen(end + 1) + 1);
        } else {
            prev = cur;
            cur = end + 1;
        }
    }
}

static void test_stream_framing_matches_openai(void **state)
{
    char *path = test_vector_path("openai-chat/stream-works-1.sse");
    size_t len = 0;
    char *wire = test_read_file(path, &len);
    loom__chat_fmt *f = new_fmt(1, "conv_1");
    loom_buf ours = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    json_t *chunk;
    char *a, *b;
    loom_event ev;
    const char *words[] = {"{\"", "city", "\":\"", "San", " Francisco"};
    (void)state;

    assert_non_null(wire);
    memset(&ev, 0, sizeof(ev));
    ev.run_id = "run_abc";
    for (size_t i = 0; i < 5; i++) {
        ev.type = LOOM_EV_MESSAGE_DELTA;
        ev.data = json_pack("{s:s}", "delta", words[i]);
        assert_int_equal(loom__chat_fmt_event(f, &ev, &ours), 0);
        json_decref(ev.data);
    }
    ev.type = LOOM_EV_RUN_COMPLETED;
    ev.data = J("{\"text\":\"x\",\"finish_reason\":\"stop\",\"usage\":"
                "{\"prompt_tokens\":17,\"completion_tokens\":10,"
                "\"total_tokens\":27}}");
    assert_int_equal(loom__chat_fmt_event(f, &ev, &ours), 0);
    json_decref(ev.data);
    assert_int_equal(loom__chat_fmt_end(f, &ours), 0);

    a = framing(wire, len);
    b = framing(ours.ptr, ours.len);
    squeeze(a);
    squeeze(b);
    /* OpenAI's role chunk also has "refusal": null; both have the role
     * and an empty content. */
    assert_string_equal(b, a);
    assert_non_null(strstr(a, "role:assistant:;"));
    assert_non_null(strstr(a, "finish:stop;"));

    /* The usage chunks are identical but for id, created and model, and
     * loom's extension fields in usage. */
    {
        /* The line that holds the usage chunk. */
        const char *u = strstr(ours.ptr, "\"choices\":[]"), *line = u;
        while (line > ours.ptr && line[-1] != '\n')
            line--;
        chunk = json_loadb(line + 6, (size_t)(strchr(u, '\n') - line - 6),
                           0, NULL);
    }
    assert_non_null(chunk);
    assert_true(json_is_null(
        json_object_get(json_object_get(chunk, "usage"), "cost_micros")));
    json_object_del(json_object_get(chunk, "usage"), "cached_tokens");
    json_object_del(json_object_get(chunk, "usage"), "reasoning_tokens");
    json_object_del(json_object_get(chunk, "usage"), "cache_write_tokens");
    json_object_del(json_object_get(chunk, "usage"), "cost_micros");
    assert_true(json_eq(json_object_get(chunk, "usage"),
                        "{\"prompt_tokens\":17,\"completion_tokens\":10,"
                        "\"total_tokens\":27}"));
    json_decref(chunk);
    free(a);
    free(b);
    loom_buf_free(&ours);
    loom__chat_fmt_free(f);
    free(wire);
    free(path);
}

/*
 * The completion written as text is byte for byte the object's compact
 * dump (what srv_reply_json sends for it).
 */
static void assert_text_matches(loom__chat_fmt *f, const json_t *o)
{
    loom_buf text = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    size_t len = 0;
    char *dump = loom__json_compact_dumps(o, 15, &len);

    assert_non_null(dump);
    assert_int_equal(loom__chat_fmt_completion_text(f, &text), 0);
    assert_string_equal(loom_buf_cstr(&text), dump);
    assert_int_equal(text.len, len);
    free(dump);
    loom_buf_free(&text);
}

static void test_completion_object(void **state)
{
    loom__chat_fmt *f = new_fmt(1, "conv_7");
    json_t *o;
    char *s;
    (void)state;

    /* Collect only: out NULL. */
    {
        loom_event ev;
        memset(&ev, 0, sizeof(ev));
        ev.type = LOOM_EV_MESSAGE_DELTA;
        ev.data = J("{\"delta\":\"Let me \"}");
        assert_int_equal(loom__chat_fmt_event(f, &ev, NULL), 0);
        json_decref(ev.data);
    }
    s = feed(f, LOOM_EV_MESSAGE_DELTA, 0, "{\"delta\":\"check.\"}");
    free(s);
    assert_int_equal(loom__chat_fmt_completion(f, &o), LOOM_EINVALID);
    s = feed(f, LOOM_EV_TOOL_CALLS, 0, tool_calls_1);
    free(s);
    s = feed(f, LOOM_EV_TOOL_COMPLETED, 0,
             "{\"id\":\"call_1\",\"name\":\"get_time\",\"output\":\"12:00\"}");
    free(s);
    s = feed(f, LOOM_EV_TOOL_FAILED, 0,
             "{\"id\":\"call_2\",\"name\":\"fail\",\"output\":\"Error: x\"}");
    free(s);
    s = feed(f, LOOM_EV_MESSAGE_DELTA, 1, "{\"delta\":\"It is \"}");
    free(s);
    s = feed(f, LOOM_EV_MESSAGE_DELTA, 1, "{\"delta\":\"noon.\"}");
    free(s);
    s = feed(f, LOOM_EV_RUN_COMPLETED, 1,
             "{\"text\":\"It is noon.\",\"finish_reason\":\"stop\","
             "\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":9,"
             "\"cached_tokens\":0,\"reasoning_tokens\":3,"
             "\"total_tokens\":39}}");
    free(s);
    assert_int_equal(loom__chat_fmt_completion(f, &o), 0);
    assert_text_matches(f, o);
    assert_true(json_eq(
        o, "{\"id\":\"chatcmpl-abc\",\"object\":\"chat.completion\","
           "\"created\":1700000000,\"model\":\"agent/helper\","
           "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
           "\"content\":\"It is noon.\",\"refusal\":null},"
           "\"logprobs\":null,\"finish_reason\":\"stop\"}],"
           "\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":9,"
           "\"total_tokens\":39,\"completion_tokens_details\":"
           "{\"reasoning_tokens\":3},\"cached_tokens\":0,"
           "\"reasoning_tokens\":3,\"cache_write_tokens\":0,"
           "\"cost_micros\":null},"
           "\"tool_events\":["
           "{\"type\":\"text\",\"value\":\"Let me check.\"},"
           "{\"type\":\"tool_call\",\"value\":{\"id\":\"call_1\",\"type\":"
           "\"function\",\"function\":{\"name\":\"get_time\",\"arguments\":"
           "\"{\\\"tz\\\":\\\"UTC\\\"}\"}}},"
           "{\"type\":\"tool_call\",\"value\":{\"id\":\"call_2\",\"type\":"
           "\"function\",\"function\":{\"name\":\"fail\",\"arguments\":"
           "\"{}\"}}},"
           "{\"type\":\"tool_output\",\"value\":{\"tool_call_id\":"
           "\"call_1\",\"name\":\"get_time\",\"output\":\"12:00\"}},"
           "{\"type\":\"tool_output\",\"value\":{\"tool_call_id\":"
           "\"call_2\",\"name\":\"fail\",\"output\":\"Error: x\"}},"
           "{\"type\":\"text\",\"value\":\"It is noon.\"}],"
           "\"conversation_id\":\"conv_7\"}"));
    json_decref(o);
    loom__chat_fmt_free(f);
}

static void test_completion_client_tools(void **state)
{
    loom__chat_fmt *f = new_fmt(0, NULL);
    json_t *o, *msg;
    char *s;
    (void)state;

    s = feed(f, LOOM_EV_TOOL_CALLS, 0,
             "{\"calls\":[{\"id\":\"s1\",\"name\":\"get_time\","
             "\"arguments\":\"{}\"},{\"id\":\"c1\",\"name\":\"my_fn\","
             "\"arguments\":\"{\\\"a\\\":1}\"}]}");
    free(s);
    s = feed(f, LOOM_EV_TOOL_COMPLETED, 0,
             "{\"id\":\"s1\",\"name\":\"get_time\",\"output\":\"t\"}");
    free(s);
    s = feed(f, LOOM_EV_RUN_COMPLETED, 0,
             "{\"text\":\"\",\"finish_reason\":\"tool_calls\",\"usage\":"
             "{\"prompt_tokens\":3,\"completion_tokens\":4,"
             "\"total_tokens\":7},\"pending_tool_calls\":[{\"id\":\"c1\","
             "\"name\":\"my_fn\",\"arguments\":\"{\\\"a\\\":1}\"}]}");
    free(s);
    assert_int_equal(loom__chat_fmt_completion(f, &o), 0);
    assert_text_matches(f, o);
    msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0),
                          "message");
    /* Only the client's call is handed back, as OpenAI would. */
    assert_true(json_eq(
        msg, ("{\"role\":\"assistant\",\"content\":null,\"refusal\":null,"
               "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
               "\"function\":{\"name\":\"my_fn\",\"arguments\":"
               "\"{\\\"a\\\":1}\"}}]}")));
    assert_string_equal(
        json_string_value(json_object_get(
            json_array_get(json_object_get(o, "choices"), 0),
            "finish_reason")),
        "tool_calls");
    assert_null(json_object_get(o, "conversation_id"));
    assert_int_equal(json_array_size(json_object_get(o, "tool_events")), 3);
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(o, "usage"), "total_tokens")),
                     7);
    json_decref(o);
    loom__chat_fmt_free(f);
}

/* A formatter in the default shape, the client owning my_fn. */
static loom__chat_fmt *new_fmt_apart(int include_usage)
{
    static const loom_tool_def client = {"my_fn", "", NULL};

    return fmt_with(include_usage, NULL, 0, &client);
}

/*
 * By default a standard client sees in tool_calls only the calls it must
 * answer (its own tools); loom's own calls go in loom_tool_calls, each
 * list with its own running index.
 */
static void test_stream_server_calls_apart(void **state)
{
    loom__chat_fmt *f = new_fmt_apart(0);
    (void)state;

    feed_only(f, LOOM_EV_RUN_STARTED, 0, "{}");
    /* Only server calls: no tool_calls at all. */
    expect_feed(f, LOOM_EV_TOOL_CALLS, 0, tool_calls_1,
                DELTA("{\"loom_tool_calls\":[{\"index\":0,\"id\":\"call_1\","
                      "\"type\":\"function\",\"function\":{\"name\":"
                      "\"get_time\",\"arguments\":\"{\\\"tz\\\":"
                      "\\\"UTC\\\"}\"}},{\"index\":1,\"id\":\"call_2\","
                      "\"type\":\"function\",\"function\":{\"name\":"
                      "\"fail\",\"arguments\":\"{}\"}}]}"));
    /* A mixed turn: the client's call starts tool_calls at index 0. */
    expect_feed(f, LOOM_EV_TOOL_CALLS, 1,
                "{\"calls\":[{\"id\":\"c1\",\"name\":\"my_fn\","
                "\"arguments\":\"{}\"},{\"id\":\"call_3\",\"name\":"
                "\"get_time\",\"arguments\":\"{}\"}]}",
                DELTA("{\"tool_calls\":[{\"index\":0,\"id\":\"c1\","
                      "\"type\":\"function\",\"function\":{\"name\":"
                      "\"my_fn\",\"arguments\":\"{}\"}}],"
                      "\"loom_tool_calls\":[{\"index\":2,\"id\":\"call_3\","
                      "\"type\":\"function\",\"function\":{\"name\":"
                      "\"get_time\",\"arguments\":\"{}\"}}]}"));
    expect_feed(f, LOOM_EV_RUN_COMPLETED, 1,
                "{\"text\":\"\",\"pending_tool_calls\":[{\"id\":\"c1\","
                "\"name\":\"my_fn\",\"arguments\":\"{}\"}],\"usage\":{}}",
                HEAD "[{\"index\":0,\"delta\":{},\"logprobs\":null,"
                     "\"finish_reason\":\"tool_calls\"}]}\n\n");
    expect_end(f, "data: [DONE]\n\n");
    loom__chat_fmt_free(f);
}

/* The non-streamed answer keeps the final turn's reasoning, and earlier
 * reasoning in tool_events, in order. */
static void test_completion_reasoning(void **state)
{
    loom__chat_fmt *f = new_fmt_apart(0);
    json_t *o, *msg, *ev;
    (void)state;

    feed_only(f, LOOM_EV_REASONING_DELTA, 0, "{\"delta\":\"need time\"}");
    feed_only(f, LOOM_EV_TOOL_CALLS, 0,
              "{\"calls\":[{\"id\":\"call_1\",\"name\":\"get_time\","
              "\"arguments\":\"{}\"}]}");
    feed_only(f, LOOM_EV_REASONING_DELTA, 1, "{\"delta\":\"it is \"}");
    feed_only(f, LOOM_EV_REASONING_DELTA, 1, "{\"delta\":\"noon\"}");
    feed_only(f, LOOM_EV_MESSAGE_DELTA, 1, "{\"delta\":\"Noon.\"}");
    feed_only(f, LOOM_EV_RUN_COMPLETED, 1,
              "{\"text\":\"Noon.\",\"finish_reason\":\"stop\",\"usage\":"
              "{\"prompt_tokens\":10,\"completion_tokens\":4,"
              "\"total_tokens\":14,\"cost_micros\":250}}");
    assert_int_equal(loom__chat_fmt_completion(f, &o), 0);
    assert_text_matches(f, o);
    msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0),
                          "message");
    assert_string_equal(
        json_string_value(json_object_get(msg, "reasoning_content")),
        "it is noon");
    assert_null(json_object_get(msg, "tool_calls"));
    assert_null(json_object_get(o, "loom_status"));
    ev = json_object_get(o, "tool_events");
    assert_true(json_eq(ev, "[{\"type\":\"reasoning\",\"value\":"
                            "\"need time\"},{\"type\":\"tool_call\","
                            "\"value\":{\"id\":\"call_1\",\"type\":"
                            "\"function\",\"function\":{\"name\":"
                            "\"get_time\",\"arguments\":\"{}\"}}},"
                            "{\"type\":\"reasoning\",\"value\":"
                            "\"it is noon\"},{\"type\":\"text\","
                            "\"value\":\"Noon.\"}]"));
    /* A priced run: its cost in usage. */
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(o, "usage"), "cost_micros")),
                     250);
    json_decref(o);
    loom__chat_fmt_free(f);
}

/* A cancelled run ends as a normal answer: finish "stop", loom_status
 * "cancelled", usage, then [DONE]; not an error. */
static void test_stream_cancelled(void **state)
{
    loom__chat_fmt *f = new_fmt_apart(1);
    json_t *o;
    (void)state;

    feed_only(f, LOOM_EV_MESSAGE_DELTA, 0, "{\"delta\":\"par\"}");
    expect_feed(f, LOOM_EV_RUN_FAILED, 0,
                "{\"status\":\"cancelled\",\"error\":{\"code\":"
                "\"cancelled\",\"message\":\"run cancelled\"},\"text\":"
                "\"par\",\"usage\":{\"prompt_tokens\":3,"
                "\"completion_tokens\":1,\"total_tokens\":4}}",
                HEAD "[{\"index\":0,\"delta\":{},\"logprobs\":null,"
                     "\"finish_reason\":\"stop\"}],\"loom_status\":"
                     "\"cancelled\"}\n\n" HEAD
                     "[],\"usage\":{\"prompt_tokens\":3,"
                     "\"completion_tokens\":1,\"total_tokens\":4,"
                     "\"cached_tokens\":0,\"reasoning_tokens\":0,"
                     "\"cache_write_tokens\":0,\"cost_micros\":null}}\n\n");
    assert_int_equal(loom__chat_fmt_done(f), 1);
    assert_null(loom__chat_fmt_failure(f));
    expect_end(f, "data: [DONE]\n\n");
    assert_int_equal(loom__chat_fmt_completion(f, &o), 0);
    assert_text_matches(f, o);
    assert_string_equal(json_string_value(json_object_get(o, "loom_status")),
                        "cancelled");
    assert_string_equal(
        json_string_value(json_object_get(
            json_object_get(json_array_get(json_object_get(o, "choices"), 0),
                            "message"),
            "content")),
        "par");
    json_decref(o);
    loom__chat_fmt_free(f);
}

/* Text that jansson would refuse: a conversation id not UTF-8 is left
 * out of the text as of the object, an answer not UTF-8 fails both;
 * before the end there is no completion. Quotes are escaped alike. */
static void test_completion_text_edges(void **state)
{
    loom__chat_fmt *f = new_fmt(0, "conv_\xff");
    loom_buf text = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    loom_event ev;
    json_t *o;
    (void)state;

    assert_int_equal(loom__chat_fmt_completion_text(f, &text), LOOM_EINVALID);
    feed_only(f, LOOM_EV_MESSAGE_DELTA, 0, "{\"delta\":\"Hi \\\"x\\\"\"}");
    feed_only(f, LOOM_EV_RUN_COMPLETED, 0,
              "{\"text\":\"Hi \\\"x\\\"\",\"finish_reason\":\"length\","
              "\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2,"
              "\"total_tokens\":3}}");
    assert_int_equal(loom__chat_fmt_completion(f, &o), 0);
    assert_null(json_object_get(o, "conversation_id"));
    assert_text_matches(f, o);
    json_decref(o);
    loom__chat_fmt_free(f);

    f = new_fmt(0, NULL);
    memset(&ev, 0, sizeof(ev));
    ev.type = LOOM_EV_RUN_COMPLETED;
    ev.run_id = "run_abc";
    ev.data =
        json_pack("{s:o,s:s,s:{s:i}}", "text", json_stringn_nocheck("\xff", 1),
                  "finish_reason", "stop", "usage", "total_tokens", 0);
    assert_int_equal(loom__chat_fmt_event(f, &ev, NULL), 0);
    json_decref(ev.data);
    assert_int_equal(loom__chat_fmt_completion(f, &o), LOOM_ENOMEM);
    assert_int_equal(loom__chat_fmt_completion_text(f, &text), LOOM_ENOMEM);
    loom_buf_free(&text);
    loom__chat_fmt_free(f);
}

/* A model name not UTF-8 (which json_pack refuses) fails every chunk
 * and the completion, as building their objects would, writing nothing. */
static void test_head_not_utf8(void **state)
{
    loom_buf out = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    loom__chat_fmt_opts o;
    loom__chat_fmt *f;
    loom_event ev;
    json_t *c;
    (void)state;

    memset(&o, 0, sizeof(o));
    o.model = "m\xff";
    assert_int_equal(loom__chat_fmt_new(&f, &o), 0);
    assert_int_equal(loom__chat_fmt_begin(f, &out), LOOM_ENOMEM);
    assert_int_equal(out.len, 0);
    /* Its finish chunk fails too; collected without chunks, the answer
     * is known, and cannot be written. */
    memset(&ev, 0, sizeof(ev));
    ev.type = LOOM_EV_RUN_COMPLETED;
    ev.data = J("{\"text\":\"Hi\",\"finish_reason\":\"stop\"}");
    assert_int_equal(loom__chat_fmt_event(f, &ev, &out), LOOM_ENOMEM);
    assert_int_equal(out.len, 0);
    loom__chat_fmt_free(f);
    assert_int_equal(loom__chat_fmt_new(&f, &o), 0);
    assert_int_equal(loom__chat_fmt_event(f, &ev, NULL), 0);
    json_decref(ev.data);
    assert_int_equal(loom__chat_fmt_completion(f, &c), LOOM_ENOMEM);
    assert_int_equal(loom__chat_fmt_completion_text(f, &out), LOOM_ENOMEM);
    loom_buf_free(&out);
    loom__chat_fmt_free(f);
}

static void test_server_calls_mode(void **state)
{
    static const char *const good =
        "{\"model\":\"m\",\"loom_server_tool_calls\":\"inline\","
        "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    static const char *const bad =
        "{\"model\":\"m\",\"loom_server_tool_calls\":\"x\","
        "\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    loom__chat_request req;
    loom__chat_error err;
    (void)state;

    assert_int_equal(loom__chat_server_calls_mode("inline"), 1);
    assert_int_equal(loom__chat_server_calls_mode("separate"), 0);
    assert_int_equal(loom__chat_server_calls_mode("Inline"), -1);
    assert_int_equal(loom__chat_server_calls_mode(NULL), -1);
    assert_int_equal(
        loom__chat_request_parse_text(&req, good, strlen(good), &err), 0);
    assert_int_equal(req.server_calls_inline, 1);
    loom__chat_request_clear(&req);
    loom__chat_error_clear(&err);
    assert_int_equal(
        loom__chat_request_parse_text(&req, bad, strlen(bad), &err),
        LOOM_EINVALID);
    assert_int_equal(err.status, 400);
    assert_string_equal(err.param, "loom_server_tool_calls");
    loom__chat_error_clear(&err);
}

static void test_usage_and_ids(void **state)
{
    loom_usage u = {.prompt_tokens = 10, .completion_tokens = 5};
    json_t *j;
    char id[64];
    (void)state;

    /* total_tokens filled from the parts when the upstream gave none;
     * no details when they are zero. */
    j = loom__chat_usage_json(&u);
    assert_true(json_eq(j, ("{\"prompt_tokens\":10,"
                                "\"completion_tokens\":5,"
                                "\"total_tokens\":15}")));
    json_decref(j);
    u.cached_tokens = 2;
    u.reasoning_tokens = 1;
    u.total_tokens = 16;
    j = loom__chat_usage_json(&u);
    assert_true(json_eq(
        j, ("{\"prompt_tokens\":10,\"completion_tokens\":5,"
             "\"total_tokens\":16,\"prompt_tokens_details\":"
             "{\"cached_tokens\":2},\"completion_tokens_details\":"
             "{\"reasoning_tokens\":1}}")));
    json_decref(j);
    loom__chat_completion_id(id, sizeof(id), "run_0123abcd");
    assert_string_equal(id, "chatcmpl-0123abcd");
    loom__chat_completion_id(id, sizeof(id), "other");
    assert_string_equal(id, "chatcmpl-other");
}

/* ---- logged events ---------------------------------------------------- */

/*
 * loom__chat_fmt_logged (the formatter fed from a turn's event log)
 * against the same events parsed back from their logged text
 * (loom_turn_event_json, then loom__chat_fmt_event, what the server did
 * for every event before): the same chunk bytes event by event, the same
 * end and the same chat.completion text, streamed and not, for deltas
 * whose strings need every kind of escape (quotes, backslash, control
 * characters, U+0000, non-ASCII), deltas whose literal the log entry does
 * not note, and a sub-agent's events, which neither path shows. Also
 * what the log entry notes beside its text (its depth, its delta's
 * literal).
 */

/* The delta's literal is noted: 1 yes, 0 no (parsed), -1 no delta. */
typedef struct {
    loom_event_type type;
    const char *data; /* JSON text; \u0000 allowed */
    int noted;
} logged_case;

#define CHILD ",\"parent_run_id\":\"run_parent\",\"run_id\":\"run_kid\""

static const logged_case cases[] = {
    /* A sub-agent's event first: not even the role chunk. */
    {LOOM_EV_MESSAGE_DELTA, "{\"delta\":\"kid\"" CHILD ",\"depth\":1}", 1},
    {LOOM_EV_RUN_STARTED, "{\"agent\":\"helper\",\"conversation_id\":\"c\"}",
     -1},
    {LOOM_EV_MESSAGE_DELTA, "{\"delta\":\"Say \\\"hi\\\" \\\\ a/b\"}", 1},
    {LOOM_EV_MESSAGE_DELTA,
     "{\"delta\":\"\\t\\n\\r\\b\\f\\u0001\\u001f\\u007f end\"}", 1},
    {LOOM_EV_MESSAGE_DELTA,
     "{\"delta\":\"\\u00e9 \\u65e5\\u672c \\ud83d\\ude00 \\u2028\"}", 1},
    /* A reader takes a string up to its U+0000. */
    {LOOM_EV_MESSAGE_DELTA, "{\"delta\":\"a\\u0000b\"}", 0},
    {LOOM_EV_MESSAGE_DELTA, "{\"delta\":\"\"}", 1},
    /* The same string elsewhere first: the same bytes. */
    {LOOM_EV_MESSAGE_DELTA, "{\"meta\":{\"delta\":\"dup\"},\"delta\":\"dup\"}",
     1},
    {LOOM_EV_MESSAGE_DELTA, "{\"delta\":5}", 0},
    {LOOM_EV_REASONING_DELTA, "{\"delta\":\"think \\\"\\\\\\u0002\"}", 1},
    {LOOM_EV_REASONING_DELTA, "{\"delta\":\"kid thinks\"" CHILD ",\"depth\":2}",
     1},
    /* No depth said: still a sub-agent's. */
    {LOOM_EV_MESSAGE_DELTA, "{\"delta\":\"kid\"" CHILD "}", 1},
    {LOOM_EV_TOOL_CALLS,
     "{\"calls\":[{\"id\":\"k1\",\"name\":\"t\",\"arguments\":\"{}\"}]" CHILD
     ",\"depth\":1}",
     -1},
    {LOOM_EV_TOOL_CALLS,
     "{\"calls\":[{\"id\":\"call_1\",\"name\":\"get_time\",\"arguments\":"
     "\"{\\\"tz\\\":\\\"UTC\\\"}\"}]}",
     -1},
    {LOOM_EV_USAGE, "{\"prompt_tokens\":5,\"completion_tokens\":2}", -1},
    {LOOM_EV_TOOL_COMPLETED,
     "{\"id\":\"call_1\",\"name\":\"get_time\",\"output\":\"12:\\u0000\"}", -1},
    {LOOM_EV_REASONING_DELTA, "{\"delta\":\"then \\u00fc\"}", 1},
    {LOOM_EV_MESSAGE_DELTA, "{\"delta\":\"It is \\\"noon\\\".\\n\"}", 1},
    {LOOM_EV_RUN_COMPLETED,
     "{\"status\":\"completed\",\"text\":\"kid's\",\"usage\":"
     "{\"prompt_tokens\":1}" CHILD ",\"depth\":1}",
     -1},
    {LOOM_EV_RUN_COMPLETED,
     "{\"status\":\"completed\",\"text\":\"It is \\\"noon\\\".\\n\","
     "\"finish_reason\":\"stop\",\"duration_s\":0.30000000000000004,"
     "\"usage\":{\"prompt_tokens\":30,"
     "\"completion_tokens\":9,\"total_tokens\":39,\"cost_micros\":7}}",
     -1},
    /* Nothing after the end. */
    {LOOM_EV_MESSAGE_DELTA, "{\"delta\":\"late\"}", 1},
};

/* A formatter whose client owns get_time, as the cases' call. */
static loom__chat_fmt *logged_fmt(void)
{
    static const loom_tool_def client = {"get_time", "", NULL};

    return fmt_with(1, "conv_1", 0, &client);
}

/* What the server did with a logged event before loom__chat_fmt_logged:
 * parse it back, then format the event read. */
static int fmt_parsed(loom__chat_fmt *f, const loom_turn_event *e,
                      loom_buf *out)
{
    loom_event le;
    int rc;

    memset(&le, 0, sizeof(le));
    le.data = loom_turn_event_json(e);
    assert_non_null(le.data);
    le.type = e->type;
    le.seq = e->seq;
    le.index = (uint32_t)json_integer_value(json_object_get(le.data, "index"));
    le.run_id = "run_abc";
    rc = loom__chat_fmt_event(f, &le, out);
    json_decref(le.data);
    return rc;
}

/* A run that fails after it said something. */
static const logged_case failed_cases[] = {
    {LOOM_EV_RUN_STARTED, "{\"agent\":\"helper\"}", -1},
    {LOOM_EV_MESSAGE_DELTA, "{\"delta\":\"part\"}", 1},
    {LOOM_EV_RUN_FAILED,
     "{\"status\":\"failed\",\"error\":{\"kind\":\"rate_limit\","
     "\"message\":\"slow \\\"down\\\"\",\"http_status\":429,"
     "\"headers\":{\"retry-after\":\"2\"}}}",
     -1},
};

/* A run the user stopped: a normal answer. */
static const logged_case cancelled_cases[] = {
    {LOOM_EV_MESSAGE_DELTA, "{\"delta\":\"part\"}", 1},
    {LOOM_EV_RUN_FAILED,
     "{\"status\":\"cancelled\",\"text\":\"part\",\"error\":"
     "{\"code\":\"cancelled\",\"message\":\"stopped\"},\"usage\":"
     "{\"prompt_tokens\":3,\"completion_tokens\":1}}",
     -1},
};

/* The log entry of case c (seq), its facts checked. */
static loom_turn_event *entry(const logged_case *c, uint64_t seq)
{
    loom_event ev;
    loom_turn_event *e;
    json_t *back;
    char *dump;

    memset(&ev, 0, sizeof(ev));
    ev.type = c->type;
    ev.seq = seq;
    ev.run_id = "run_abc";
    ev.data = json_loads(c->data, JSON_ALLOW_NUL, NULL);
    assert_non_null(ev.data);
    e = loom__turn_event_of(&ev);
    assert_non_null(e);
    assert_int_equal(e->depth, loom_event_depth(&ev));
    /* The run's own end keeps its JSON: the text is its dump. */
    assert_int_equal(e->json != NULL, (c->type == LOOM_EV_RUN_COMPLETED ||
                                       c->type == LOOM_EV_RUN_FAILED) &&
                                          e->depth == 0);
    if (e->json) {
        dump = loom__json_compact_dumps(e->json, 15, NULL);
        assert_string_equal(dump, e->text);
        free(dump);
    }
    if (c->noted < 0) {
        assert_int_equal(e->delta_len, 0);
    } else if (c->noted) {
        /* The literal is the member's value, bytes for bytes. */
        assert_true(e->delta_len >= 2);
        assert_true(e->delta_at + e->delta_len <= e->text_len);
        back = json_loadb(e->text + e->delta_at, e->delta_len, JSON_DECODE_ANY,
                          NULL);
        assert_non_null(back);
        assert_true(json_equal(back, json_object_get(ev.data, "delta")));
        json_decref(back);
    } else {
        assert_int_equal(e->delta_len, 0);
    }
    json_decref(ev.data);
    return e;
}

static void assert_same_buf(const loom_buf *a, const loom_buf *b)
{
    assert_int_equal(a->len, b->len);
    if (a->len)
        assert_memory_equal(a->ptr, b->ptr, a->len);
}

/* The n cases cs through both paths, streamed (out) or not; the end,
 * the failure and the completion text compared too. The number of
 * events that wrote something. */
static size_t both_ways(const logged_case *cs, size_t n, int streamed)
{
    loom__chat_fmt *fast = logged_fmt(), *slow = logged_fmt();
    loom_buf a = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    const json_t *fa, *fb;
    size_t wrote = 0;
    int rc;

    for (size_t i = 0; i < n; i++) {
        loom_turn_event *e = entry(&cs[i], i + 1);
        loom_buf_clear(&a);
        loom_buf_clear(&b);
        assert_int_equal(
            loom__chat_fmt_logged(fast, e, "run_abc", streamed ? &a : NULL), 0);
        assert_int_equal(fmt_parsed(slow, e, streamed ? &b : NULL), 0);
        assert_same_buf(&a, &b);
        wrote += a.len > 0;
        loom__turn_event_free(e);
    }
    assert_int_equal(loom__chat_fmt_done(fast), loom__chat_fmt_done(slow));
    loom_buf_clear(&a);
    loom_buf_clear(&b);
    assert_int_equal(loom__chat_fmt_end(fast, &a), 0);
    assert_int_equal(loom__chat_fmt_end(slow, &b), 0);
    assert_same_buf(&a, &b);
    fa = loom__chat_fmt_failure(fast);
    fb = loom__chat_fmt_failure(slow);
    assert_true(fa ? fb && json_equal((json_t *)fa, (json_t *)fb) : !fb);
    loom_buf_clear(&a);
    loom_buf_clear(&b);
    /* Not for a failed run (nor one whose end was lost). */
    rc = fa ? LOOM_EINVALID : 0;
    assert_int_equal(loom__chat_fmt_completion_text(fast, &a), rc);
    assert_int_equal(loom__chat_fmt_completion_text(slow, &b), rc);
    assert_same_buf(&a, &b);
    loom_buf_free(&a);
    loom_buf_free(&b);
    loom__chat_fmt_free(fast);
    loom__chat_fmt_free(slow);
    return wrote;
}

#define BOTH_WAYS(cs, streamed)                                                \
    both_ways(cs, sizeof(cs) / sizeof(cs[0]), streamed)

static void test_logged_streamed(void **state)
{
    (void)state;
    assert_true(BOTH_WAYS(cases, 1) >= 8);
    assert_int_equal(BOTH_WAYS(failed_cases, 1), 3);
    assert_int_equal(BOTH_WAYS(cancelled_cases, 1), 2);
    /* A sub-agent's first event says nothing, not even the role. */
    assert_int_equal(both_ways(cases, 1, 1), 0);
}

static void test_logged_completion(void **state)
{
    (void)state;
    assert_int_equal(BOTH_WAYS(cases, 0), 0);
    assert_int_equal(BOTH_WAYS(failed_cases, 0), 0);
    assert_int_equal(BOTH_WAYS(cancelled_cases, 0), 0);
}

/*
 * The completion's text and reasoning entries are what the deltas said,
 * unescaped (the log's literals are kept escaped until then), with a
 * string's U+0000 ending it as a reader sees it.
 */
static void test_logged_turn_text(void **state)
{
    loom__chat_fmt *f = logged_fmt();
    json_t *o, *ev, *msg, *want;
    (void)state;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        loom_turn_event *e = entry(&cases[i], i + 1);
        assert_int_equal(loom__chat_fmt_logged(f, e, "run_abc", NULL), 0);
        loom__turn_event_free(e);
    }
    assert_int_equal(loom__chat_fmt_completion(f, &o), 0);
    ev = json_object_get(o, "tool_events");
    want = json_pack(
        "[{s:s,s:s},{s:s,s:s},{s:s,s:o},{s:s,s:o},{s:s,s:s},{s:s,s:s}]", "type",
        "reasoning", "value", "think \"\\\x02", "type", "text", "value",
        "Say \"hi\" \\ a/b\t\n\r\b\f\x01\x1f\x7f end"
        "\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80 \xe2\x80\xa8"
        "adup",
        "type", "tool_call", "value",
        json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", "call_1", "type", "function",
                  "function", "name", "get_time", "arguments",
                  "{\"tz\":\"UTC\"}"),
        "type", "tool_output", "value",
        json_pack("{s:s,s:s,s:s}", "tool_call_id", "call_1", "name", "get_time",
                  "output", "12:"),
        "type", "reasoning", "value", "then \xc3\xbc", "type", "text", "value",
        "It is \"noon\".\n");
    assert_non_null(want);
    assert_true(json_equal(ev, want));
    msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0),
                          "message");
    assert_string_equal(
        json_string_value(json_object_get(msg, "reasoning_content")),
        "then \xc3\xbc");
    json_decref(want);
    json_decref(o);
    loom__chat_fmt_free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_every_field),
        cmocka_unit_test(test_parse_defaults_and_nulls),
        cmocka_unit_test(test_parse_wrong_types),
        cmocka_unit_test(test_parse_budget),
        cmocka_unit_test(test_parse_text),
        cmocka_unit_test(test_parse_limits),
        cmocka_unit_test(test_server_tools),
        cmocka_unit_test(test_error_from_failure),
        cmocka_unit_test(test_stream_bytes),
        cmocka_unit_test(test_stream_without_usage),
        cmocka_unit_test(test_stream_client_tools),
        cmocka_unit_test(test_stream_failure),
        cmocka_unit_test(test_stream_end_without_result),
        cmocka_unit_test(test_stream_framing_matches_openai),
        cmocka_unit_test(test_completion_object),
        cmocka_unit_test(test_completion_client_tools),
        cmocka_unit_test(test_usage_and_ids),
        cmocka_unit_test(test_stream_server_calls_apart),
        cmocka_unit_test(test_completion_reasoning),
        cmocka_unit_test(test_stream_cancelled),
        cmocka_unit_test(test_completion_text_edges),
        cmocka_unit_test(test_server_calls_mode),
        cmocka_unit_test(test_head_not_utf8),
        cmocka_unit_test(test_logged_streamed),
        cmocka_unit_test(test_logged_completion),
        cmocka_unit_test(test_logged_turn_text),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
