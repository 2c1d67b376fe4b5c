/*
 * A client's request parameters (loom_llm_params, llm/params.c): which
 * provider kind refuses which, with the message naming parameter and
 * provider; their copy; and the request body each adapter builds with
 * them (OpenAI as is, in the tree and the text builder alike; Anthropic,
 * Gemini and Responses translated); and the field that carries
 * max_tokens to OpenAI's reasoning models.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "llm/anthropic.h"
#include "llm/gemini.h"
#include "llm/openai.h"
#include "llm/responses.h"
#include "loom/common.h"
#include "loom/llm.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* Every parameter, as the chat API would parse them. */
static void fill(loom_llm_params *p)
{
    memset(p, 0, sizeof(*p));
    p->set = LOOM_PARAM_TOP_P | LOOM_PARAM_SEED | LOOM_PARAM_PRESENCE_PENALTY |
             LOOM_PARAM_FREQUENCY_PENALTY;
    p->top_p = 0.5;
    p->seed = 42;
    p->presence_penalty = 0.25;
    p->frequency_penalty = -0.5;
    p->stop[0] = strdup("END");
    p->stop[1] = strdup("STOP");
    p->stop_len = 2;
    p->format = LOOM_FORMAT_JSON_SCHEMA;
    p->format_name = strdup("answer");
    p->format_description = strdup("The answer");
    p->format_schema = json_loads("{\"type\":\"object\",\"properties\":{"
                                  "\"a\":{\"type\":\"string\"}},"
                                  "\"additionalProperties\":false}",
                                  0, NULL);
    p->format_strict = 1;
    p->reasoning_effort = strdup("low");
    p->verbosity = strdup("high");
    p->user = strdup("u-1");
    p->extra = json_loads("{\"logit_bias\":{\"50256\":-100},\"metadata\":{"
                          "\"k\":\"v\"},\"service_tier\":\"flex\"}",
                          0, NULL);
}

/* Every parameter kind takes: fill() with the others unset. */
static void fill_for(loom_llm_params *p, const char *kind)
{
    fill(p);
    while (loom_llm_params_refused(p, kind)) {
        const char *n = loom_llm_params_refused(p, kind);
        if (strcmp(n, "seed") == 0)
            p->set &= ~LOOM_PARAM_SEED;
        else if (strcmp(n, "presence_penalty") == 0)
            p->set &= ~LOOM_PARAM_PRESENCE_PENALTY;
        else if (strcmp(n, "frequency_penalty") == 0)
            p->set &= ~LOOM_PARAM_FREQUENCY_PENALTY;
        else if (strcmp(n, "stop") == 0) {
            for (; p->stop_len > 0; p->stop_len--)
                free(p->stop[p->stop_len - 1]);
        } else if (strcmp(n, "response_format") == 0) {
            p->format = LOOM_FORMAT_UNSET;
        } else if (strcmp(n, "verbosity") == 0) {
            free(p->verbosity);
            p->verbosity = NULL;
        } else {
            assert_int_equal(json_object_del(p->extra, n), 0);
        }
    }
}

static void assert_json(const json_t *got, const char *want)
{
    json_t *w = json_loads(want, JSON_DECODE_ANY, NULL);
    char *g = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS);

    assert_non_null(w);
    if (!json_equal((json_t *)got, w))
        fail_msg("JSON differs:\n got  %s\n want %s", g, want);
    free(g);
    json_decref(w);
}

static void test_refused_per_kind(void **state)
{
    loom_llm_params p;
    const char *param = "x";

    (void)state;
    fill(&p);
    assert_null(loom_llm_params_refused(&p, "openai"));
    assert_string_equal(loom_llm_params_refused(&p, "anthropic"), "seed");
    assert_string_equal(loom_llm_params_refused(&p, "openai-responses"),
                        "seed");
    assert_string_equal(loom_llm_params_refused(&p, "gemini"), "verbosity");
    /* An embedder's kind takes none. */
    assert_string_equal(loom_llm_params_refused(&p, "mine"), "top_p");
    assert_null(loom_llm_params_refused(NULL, "gemini"));

    assert_int_equal(loom_llm_params_check(&p, "claude", "anthropic", &param),
                     LOOM_EINVALID);
    assert_string_equal(param, "seed");
    assert_string_equal(loom_error_last(),
                        "seed is not supported by provider 'claude' "
                        "(anthropic)");
    assert_int_equal(loom_llm_params_check(&p, "o", "openai", &param), 0);
    assert_null(param);

    /* One at a time: what each kind refuses. */
    loom_llm_params_clear(&p);
    p.extra = json_pack("{s:{s:i}}", "logit_bias", "1", 5);
    assert_string_equal(loom_llm_params_refused(&p, "anthropic"), "logit_bias");
    assert_string_equal(loom_llm_params_refused(&p, "gemini"), "logit_bias");
    assert_string_equal(loom_llm_params_refused(&p, "openai-responses"),
                        "logit_bias");
    loom_llm_params_clear(&p);
    p.stop[0] = strdup("x");
    p.stop_len = 1;
    assert_null(loom_llm_params_refused(&p, "anthropic"));
    assert_null(loom_llm_params_refused(&p, "gemini"));
    assert_string_equal(loom_llm_params_refused(&p, "openai-responses"),
                        "stop");
    loom_llm_params_clear(&p);
    p.format = LOOM_FORMAT_JSON_OBJECT;
    assert_null(loom_llm_params_refused(&p, "anthropic"));
    assert_null(loom_llm_params_refused(&p, "gemini"));
    /* user is loom's too: never refused. */
    loom_llm_params_clear(&p);
    p.user = strdup("u");
    assert_null(loom_llm_params_refused(&p, "gemini"));
    assert_null(loom_llm_params_refused(&p, "mine"));
    /* An extra no kind knows. */
    loom_llm_params_clear(&p);
    p.extra = json_pack("{s:b}", "mystery", 1);
    assert_string_equal(loom_llm_params_refused(&p, "openai"), "mystery");
    loom_llm_params_clear(&p);
    assert_int_equal(loom_llm_params_any(&p), 0);
}

/* Anthropic's response format is a forced tool: not with thinking, and
 * only for a schema of an object. */
static void test_anthropic_format_refusals(void **state)
{
    loom_llm_params p;
    const char *param = NULL;

    (void)state;
    memset(&p, 0, sizeof(p));
    p.format = LOOM_FORMAT_JSON_SCHEMA;
    p.format_name = strdup("a");
    p.format_schema = json_pack("{s:s}", "type", "object");
    assert_null(loom_llm_params_refused(&p, "anthropic"));
    p.reasoning_effort = strdup("low");
    assert_int_equal(loom_llm_params_check(&p, "claude", "anthropic", &param),
                     LOOM_EINVALID);
    assert_string_equal(param, "response_format");
    assert_string_equal(loom_error_last(),
                        "response_format is not supported by provider "
                        "'claude' (anthropic) together with "
                        "reasoning_effort: the answer is a forced tool call, "
                        "which the API does not take with thinking");
    /* Other kinds take both. */
    assert_null(loom_llm_params_refused(&p, "openai"));
    free(p.reasoning_effort);
    p.reasoning_effort = NULL;
    json_object_set_new(p.format_schema, "type", json_string("array"));
    assert_int_equal(loom_llm_params_check(&p, "claude", "anthropic", &param),
                     LOOM_EINVALID);
    assert_string_equal(param, "response_format");
    assert_non_null(strstr(loom_error_last(), "anything but an object"));
    assert_null(loom_llm_params_refused(&p, "gemini"));
    /* A schema that says no type is an object's. */
    json_object_del(p.format_schema, "type");
    assert_null(loom_llm_params_refused(&p, "anthropic"));
    loom_llm_params_clear(&p);
}

static void test_copy(void **state)
{
    loom_llm_params p, c;

    (void)state;
    fill(&p);
    assert_int_equal(loom_llm_params_copy(&c, &p), 0);
    loom_llm_params_clear(&p);
    assert_int_equal(c.set, LOOM_PARAM_TOP_P | LOOM_PARAM_SEED |
                                LOOM_PARAM_PRESENCE_PENALTY |
                                LOOM_PARAM_FREQUENCY_PENALTY);
    assert_int_equal(c.stop_len, 2);
    assert_string_equal(c.stop[1], "STOP");
    assert_string_equal(c.format_name, "answer");
    assert_string_equal(c.verbosity, "high");
    assert_non_null(json_object_get(c.extra, "metadata"));
    assert_int_equal(loom_llm_params_any(&c), 1);
    loom_llm_params_clear(&c);
    assert_int_equal(loom_llm_params_copy(&c, NULL), 0);
    assert_int_equal(loom_llm_params_any(&c), 0);
}

static loom_message user_msg = {.role = LOOM_ROLE_USER, .content = "hi"};

static void test_openai_body(void **state)
{
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_buf text = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    loom_llm_params p;
    json_t *body = NULL;
    char *dumped;

    (void)state;
    fill(&p);
    req.model = "gpt-4o";
    req.messages = &user_msg;
    req.messages_len = 1;
    req.stream = 0;
    req.params = &p;
    assert_int_equal(loom__openai_build_body(&body, &req), 0);
    assert_json(
        body,
        "{\"model\":\"gpt-4o\",\"messages\":[{\"role\":\"user\",\"content\":"
        "\"hi\"}],\"reasoning_effort\":\"low\",\"top_p\":0.5,\"seed\":42,"
        "\"presence_penalty\":0.25,\"frequency_penalty\":-0.5,"
        "\"stop\":[\"END\",\"STOP\"],\"response_format\":{\"type\":"
        "\"json_schema\",\"json_schema\":{\"name\":\"answer\","
        "\"description\":\"The answer\",\"schema\":{\"type\":\"object\","
        "\"properties\":{\"a\":{\"type\":\"string\"}},"
        "\"additionalProperties\":false},\"strict\":true}},"
        "\"verbosity\":\"high\",\"user\":\"u-1\",\"logit_bias\":{\"50256\":"
        "-100},\"metadata\":{\"k\":\"v\"},\"service_tier\":\"flex\"}");
    /* The text builder writes the same bytes. */
    assert_int_equal(loom__openai_body_text(&text, &req, NULL, NULL), 0);
    dumped = json_dumps(body, JSON_COMPACT | JSON_REAL_PRECISION(15));
    assert_string_equal(loom_buf_cstr(&text), dumped);
    free(dumped);
    json_decref(body);
    /* json_object */
    p.format = LOOM_FORMAT_JSON_OBJECT;
    assert_int_equal(loom__openai_build_body(&body, &req), 0);
    assert_json(json_object_get(body, "response_format"),
                "{\"type\":\"json_object\"}");
    json_decref(body);
    loom_buf_free(&text);
    loom_llm_params_clear(&p);
}

/* The field each model takes its output limit in, exactly. */
static void test_openai_max_tokens_field(void **state)
{
    static const struct {
        const char *model;
        int field; /* loom_llm_request.max_completion_tokens */
        const char *want;
    } cases[] = {
        {"gpt-4o", 0, "max_tokens"},
        {"o1", 0, "max_completion_tokens"},
        {"o3-mini", 0, "max_completion_tokens"},
        {"o4-mini-2025-04-16", 0, "max_completion_tokens"},
        {"gpt-5", 0, "max_completion_tokens"},
        {"gpt-5-mini", 0, "max_completion_tokens"},
        {"gpt-4o", 1, "max_completion_tokens"},
        {"gpt-5", -1, "max_tokens"},
    };
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_buf text = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    json_t *body, *want;

    (void)state;
    req.messages = &user_msg;
    req.messages_len = 1;
    req.max_tokens = 300;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *other = strcmp(cases[i].want, "max_tokens") == 0
                                ? "max_completion_tokens"
                                : "max_tokens";
        req.model = cases[i].model;
        req.max_completion_tokens = cases[i].field;
        assert_int_equal(loom__openai_build_body(&body, &req), 0);
        assert_int_equal(
            json_integer_value(json_object_get(body, cases[i].want)), 300);
        assert_null(json_object_get(body, other));
        json_decref(body);
        assert_int_equal(loom__openai_body_text(&text, &req, NULL, NULL), 0);
        assert_non_null(body = json_loads(loom_buf_cstr(&text), 0, NULL));
        want = json_object_get(body, cases[i].want);
        assert_int_equal(json_integer_value(want), 300);
        assert_null(json_object_get(body, other));
        json_decref(body);
    }
    loom_buf_free(&text);
}

static void test_anthropic_body(void **state)
{
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_llm_params p;
    json_t *body = NULL;

    (void)state;
    fill_for(&p, "anthropic");
    req.model = "claude-x";
    req.messages = &user_msg;
    req.messages_len = 1;
    req.stream = 0;
    req.params = &p;
    assert_int_equal(loom__anthropic_build_body(&body, &req), 0);
    assert_json(json_object_get(body, "top_p"), "0.5");
    assert_json(json_object_get(body, "stop_sequences"), "[\"END\",\"STOP\"]");
    assert_json(json_object_get(body, "metadata"), "{\"user_id\":\"u-1\"}");
    /* The effort is a thinking budget (low: 2048), max_tokens above it. */
    assert_json(json_object_get(body, "thinking"),
                "{\"type\":\"enabled\",\"budget_tokens\":2048}");
    assert_true(json_integer_value(json_object_get(body, "max_tokens")) > 2048);
    assert_null(json_object_get(body, "seed"));
    assert_null(json_object_get(body, "stop"));
    json_decref(body);
    loom_llm_params_clear(&p);
}

/* A request with a response format for Anthropic (the answer tool). */
static json_t *anthropic_format_body(loom_llm_request *req,
                                     const loom_llm_params *p,
                                     const loom_tool_def *tools, size_t n,
                                     loom_tool_choice_kind choice)
{
    json_t *body = NULL;

    *req = (loom_llm_request)LOOM_LLM_REQUEST_INIT;
    req->model = "claude-x";
    req->messages = &user_msg;
    req->messages_len = 1;
    req->params = p;
    req->tools = tools;
    req->tools_len = n;
    req->tool_choice.kind = choice;
    req->thinking_budget = 4096; /* the model's: off with a forced tool */
    assert_int_equal(loom__anthropic_build_body(&body, req), 0);
    assert_null(json_object_get(body, "response_format"));
    assert_null(json_object_get(body, "thinking"));
    return body;
}

static void test_anthropic_format_body(void **state)
{
    static const char answer_schema[] =
        "{\"name\":\"" LOOM_ANTHROPIC_ANSWER_TOOL "\","
        "\"description\":\"Give your final answer by calling this tool: its "
        "input is the answer itself, a JSON object (answer): The answer.\","
        "\"input_schema\":{\"type\":\"object\",\"properties\":{\"a\":{"
        "\"type\":\"string\"}},\"additionalProperties\":false}}";
    loom_tool_def tools[] = {{"get_time", "Time.", NULL},
                             {LOOM_ANTHROPIC_ANSWER_TOOL, NULL, NULL}};
    loom_llm_request req;
    loom_llm_params p;
    json_t *body, *want;

    (void)state;
    fill_for(&p, "openai");
    free(p.reasoning_effort);
    p.reasoning_effort = NULL;
    json_object_clear(p.extra);
    /* Alone: the answer tool, forced. */
    want = json_loads(answer_schema, 0, NULL);
    body = anthropic_format_body(&req, &p, NULL, 0, LOOM_TOOL_CHOICE_AUTO);
    assert_int_equal(json_array_size(json_object_get(body, "tools")), 1);
    assert_json(json_array_get(json_object_get(body, "tools"), 0),
                answer_schema);
    assert_json(json_object_get(body, "tool_choice"),
                "{\"type\":\"tool\",\"name\":\"" LOOM_ANTHROPIC_ANSWER_TOOL
                "\"}");
    assert_int_equal(loom__anthropic_answer_mode(&req),
                     LOOM__ANTHROPIC_ANSWER_FORCED);
    json_decref(body);
    /* Beside the run's tools: any tool, the answer's last. */
    body = anthropic_format_body(&req, &p, tools, 1, LOOM_TOOL_CHOICE_AUTO);
    assert_int_equal(json_array_size(json_object_get(body, "tools")), 2);
    assert_string_equal(
        json_string_value(json_object_get(
            json_array_get(json_object_get(body, "tools"), 0), "name")),
        "get_time");
    assert_true(
        json_equal(json_array_get(json_object_get(body, "tools"), 1), want));
    json_decref(want);
    assert_json(json_object_get(body, "tool_choice"), "{\"type\":\"any\"}");
    assert_int_equal(loom__anthropic_answer_mode(&req),
                     LOOM__ANTHROPIC_ANSWER_BESIDE);
    json_decref(body);
    /* Tool choice none: the answer tool alone. */
    body = anthropic_format_body(&req, &p, tools, 1, LOOM_TOOL_CHOICE_NONE);
    assert_int_equal(json_array_size(json_object_get(body, "tools")), 1);
    assert_json(json_object_get(body, "tool_choice"),
                "{\"type\":\"tool\",\"name\":\"" LOOM_ANTHROPIC_ANSWER_TOOL
                "\"}");
    json_decref(body);
    /* A call that must call a real tool has no answer tool. */
    body = anthropic_format_body(&req, &p, tools, 1, LOOM_TOOL_CHOICE_REQUIRED);
    assert_int_equal(json_array_size(json_object_get(body, "tools")), 1);
    assert_json(json_object_get(body, "tool_choice"), "{\"type\":\"any\"}");
    assert_int_equal(loom__anthropic_answer_mode(&req),
                     LOOM__ANTHROPIC_ANSWER_NONE);
    json_decref(body);
    /* json_object: any object. */
    p.format = LOOM_FORMAT_JSON_OBJECT;
    body = anthropic_format_body(&req, &p, NULL, 0, LOOM_TOOL_CHOICE_AUTO);
    assert_json(json_object_get(body, "tools"),
                "[{\"name\":\"" LOOM_ANTHROPIC_ANSWER_TOOL "\","
                "\"description\":\"Give your final answer by calling this "
                "tool: its input is the answer itself, a JSON object.\","
                "\"input_schema\":{\"type\":\"object\"}}]");
    json_decref(body);
    /* The run's own tool of that name is refused. */
    req.tools = tools;
    req.tools_len = 2;
    assert_int_equal(loom__anthropic_build_body(&body, &req), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "loom's own"));
    loom_llm_params_clear(&p);
}

static void test_gemini_body(void **state)
{
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_llm_params p;
    json_t *body = NULL;

    (void)state;
    fill_for(&p, "gemini");
    req.model = "gemini-2.5-flash";
    req.messages = &user_msg;
    req.messages_len = 1;
    req.stream = 0;
    req.params = &p;
    assert_int_equal(loom__gemini_build_body(&body, &req), 0);
    assert_json(
        json_object_get(body, "generationConfig"),
        "{\"thinkingConfig\":{\"thinkingBudget\":2048,\"includeThoughts\":"
        "true},\"topP\":0.5,\"seed\":42,\"presencePenalty\":0.25,"
        "\"frequencyPenalty\":-0.5,\"stopSequences\":[\"END\",\"STOP\"],"
        "\"responseMimeType\":\"application/json\",\"responseJsonSchema\":{"
        "\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},"
        "\"additionalProperties\":false}}");
    json_decref(body);
    /* json_object: JSON, no schema. */
    p.format = LOOM_FORMAT_JSON_OBJECT;
    assert_int_equal(loom__gemini_build_body(&body, &req), 0);
    assert_json(json_object_get(json_object_get(body, "generationConfig"),
                                "responseMimeType"),
                "\"application/json\"");
    assert_null(json_object_get(json_object_get(body, "generationConfig"),
                                "responseJsonSchema"));
    json_decref(body);
    loom_llm_params_clear(&p);
}

static void test_responses_body(void **state)
{
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_llm_params p;
    json_t *body = NULL;

    (void)state;
    fill_for(&p, "openai-responses");
    req.model = "gpt-5";
    req.messages = &user_msg;
    req.messages_len = 1;
    req.stream = 0;
    req.params = &p;
    assert_int_equal(loom__responses_build_body(&body, &req), 0);
    assert_json(json_object_get(body, "top_p"), "0.5");
    assert_json(json_object_get(body, "reasoning"), "{\"effort\":\"low\"}");
    assert_json(
        json_object_get(body, "text"),
        "{\"format\":{\"type\":\"json_schema\",\"name\":\"answer\","
        "\"description\":\"The answer\",\"schema\":{\"type\":\"object\","
        "\"properties\":{\"a\":{\"type\":\"string\"}},"
        "\"additionalProperties\":false},\"strict\":true},\"verbosity\":"
        "\"high\"}");
    assert_json(json_object_get(body, "user"), "\"u-1\"");
    assert_json(json_object_get(body, "metadata"), "{\"k\":\"v\"}");
    assert_json(json_object_get(body, "service_tier"), "\"flex\"");
    assert_null(json_object_get(body, "seed"));
    assert_null(json_object_get(body, "logit_bias"));
    json_decref(body);
    loom_llm_params_clear(&p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refused_per_kind),
        cmocka_unit_test(test_copy),
        cmocka_unit_test(test_openai_body),
        cmocka_unit_test(test_openai_max_tokens_field),
        cmocka_unit_test(test_anthropic_body),
        cmocka_unit_test(test_anthropic_format_refusals),
        cmocka_unit_test(test_anthropic_format_body),
        cmocka_unit_test(test_gemini_body),
        cmocka_unit_test(test_responses_body),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
