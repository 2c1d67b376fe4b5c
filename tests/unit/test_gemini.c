/*
 * Unit tests of the Gemini wire code (llm/gemini.h): no network. The
 * endpoint URL; the JSON Schema converter, table-driven; request bodies
 * for every message kind, tool choice and generation option, and the
 * recorded requests of LOOM_VECTORS_DIR/gemini rebuilt from the loom
 * request they stand for; the recorded streams decoded whole and at every
 * two-piece split; thoughtSignature and call ids kept in provider_state
 * and sent back byte for byte; usage, finish reasons, errors in and out
 * of a stream, and every limit crossed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/error.h"
#include "llm/gemini.h"
#include "loom/buf.h"
#include "testutil.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- an event collector ---------------------------------------------- */

typedef struct {
    loom_buf text;
    loom_buf reasoning;
    int ndeltas;
    char *delta_ids[8];
    char *delta_names[8];
    char *delta_args[8];
    int ncalls_events;
    size_t calls_len;
    int nusage;
    loom_usage usage;
    int nfinish;
    char finish[64];
    int nerror;
    int closing;   /* a USAGE, TOOL_CALLS or FINISH came */
    int bad_order; /* an event came where it must not */
    int last_type;
    int abort_on; /* abort when this event type arrives (-1: never) */
} collector;

static void col_init(collector *c)
{
    memset(c, 0, sizeof(*c));
    loom_buf_init(&c->text, LOOM_BUF_UNLIMITED);
    loom_buf_init(&c->reasoning, LOOM_BUF_UNLIMITED);
    c->abort_on = -1;
    c->last_type = -1;
}

static void col_free(collector *c)
{
    loom_buf_free(&c->text);
    loom_buf_free(&c->reasoning);
    for (int i = 0; i < 8; i++) {
        free(c->delta_ids[i]);
        free(c->delta_names[i]);
        free(c->delta_args[i]);
    }
}

static int collect(const loom_llm_event *ev, void *payload)
{
    collector *c = payload;

    if (c->last_type == LOOM_LLM_FINISH)
        c->bad_order = 1; /* nothing after FINISH */
    switch (ev->type) {
    case LOOM_LLM_TEXT:
    case LOOM_LLM_REASONING:
    case LOOM_LLM_TOOL_CALL_DELTA:
        if (c->closing)
            c->bad_order = 1;
        break;
    case LOOM_LLM_USAGE:
        if (c->closing)
            c->bad_order = 1; /* USAGE comes first of the closing ones */
        c->closing = 1;
        break;
    case LOOM_LLM_TOOL_CALLS:
        if (c->last_type == LOOM_LLM_TOOL_CALLS ||
            c->last_type == LOOM_LLM_FINISH)
            c->bad_order = 1;
        c->closing = 1;
        break;
    default:
        c->closing = ev->type == LOOM_LLM_FINISH ? 1 : c->closing;
        break;
    }
    c->last_type = (int)ev->type;
    switch (ev->type) {
    case LOOM_LLM_TEXT:
        loom_buf_put(&c->text, ev->text, ev->text_len);
        break;
    case LOOM_LLM_REASONING:
        loom_buf_put(&c->reasoning, ev->text, ev->text_len);
        break;
    case LOOM_LLM_TOOL_CALL_DELTA:
        if (c->ndeltas < 8) {
            c->delta_ids[c->ndeltas] = strdup(ev->tool_id);
            c->delta_names[c->ndeltas] = strdup(ev->tool_name);
            c->delta_args[c->ndeltas] = strdup(ev->args_delta);
        }
        assert_int_equal(ev->tool_index, c->ndeltas);
        c->ndeltas++;
        break;
    case LOOM_LLM_TOOL_CALLS:
        c->ncalls_events++;
        c->calls_len = ev->calls_len;
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
        break;
    }
    return (int)ev->type == c->abort_on;
}

/* Feeds data as a stream cut at split (0 or >= len: whole), ends it and
 * exports into resp. Returns the first error. */
static int decode(const char *data, size_t len, size_t split,
                  const loom__gemini_limits *lim, long turn, collector *c,
                  loom_llm_response *resp)
{
    loom__gemini_decoder *d;
    int rc;

    assert_int_equal(loom__gemini_decoder_new(&d, lim, turn, collect, c), 0);
    if (split == 0 || split >= len) {
        rc = loom__gemini_decoder_feed(d, data, len);
    } else {
        rc = loom__gemini_decoder_feed(d, data, split);
        if (rc == 0)
            rc = loom__gemini_decoder_feed(d, data + split, len - split);
    }
    if (rc == 0)
        rc = loom__gemini_decoder_finish(d);
    if (rc && getenv("LOOM_TEST_VERBOSE"))
        print_message("decode: %s\n", loom_error_last());
    assert_int_equal(loom__gemini_decoder_export(d, resp), 0);
    loom__gemini_decoder_free(d);
    return rc;
}

static int decode_str(const char *s, const loom__gemini_limits *lim,
                      collector *c, loom_llm_response *resp)
{
    return decode(s, strlen(s), 0, lim, 0, c, resp);
}

/* A whole non-streamed body. */
static int decode_body(const char *s, collector *c, loom_llm_response *resp)
{
    loom__gemini_decoder *d;
    int rc;

    assert_int_equal(loom__gemini_decoder_new(&d, NULL, 0, collect, c), 0);
    rc = loom__gemini_decoder_complete(d, s, strlen(s));
    assert_int_equal(loom__gemini_decoder_export(d, resp), 0);
    loom__gemini_decoder_free(d);
    return rc;
}

/* Compares v with the JSON text expect, printing both when they differ. */
static void assert_json(const json_t *v, const char *expect)
{
    json_error_t je;
    json_t *e = json_loads(expect, 0, &je);

    if (!e)
        fail_msg("bad expected JSON (%s): %s", je.text, expect);
    if (!json_equal((json_t *)v, e)) {
        char *got = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
        char *want = json_dumps(e, JSON_COMPACT | JSON_SORT_KEYS);
        print_error("got:  %s\nwant: %s\n", got, want);
        free(got);
        free(want);
        json_decref(e);
        fail();
    }
    json_decref(e);
}

/* ---- URL -------------------------------------------------------------- */

static void test_url(void **state)
{
    static const struct {
        const char *base, *model;
        int stream;
        const char *url;
    } cases[] = {
        {NULL, "gemini-2.0-flash", 1,
         "https://generativelanguage.googleapis.com/v1beta/models/"
         "gemini-2.0-flash:streamGenerateContent?alt=sse"},
        {"", "gemini-2.0-flash", 0,
         "https://generativelanguage.googleapis.com/v1beta/models/"
         "gemini-2.0-flash:generateContent"},
        {"https://generativelanguage.googleapis.com/", "g", 0,
         "https://generativelanguage.googleapis.com/v1beta/models/"
         "g:generateContent"},
        /* A base URL that names the version is not given another. */
        {"https://generativelanguage.googleapis.com/v1beta", "g", 0,
         "https://generativelanguage.googleapis.com/v1beta/models/"
         "g:generateContent"},
        {"https://generativelanguage.googleapis.com/v1beta//", "g", 0,
         "https://generativelanguage.googleapis.com/v1beta/models/"
         "g:generateContent"},
        {"http://127.0.0.1:9/v1", "g", 1,
         "http://127.0.0.1:9/v1/models/g:streamGenerateContent?alt=sse"},
        {"http://proxy/gemini/v1alpha", "g", 0,
         "http://proxy/gemini/v1alpha/models/g:generateContent"},
        {"http://proxy/v1x/api", "g", 0,
         "http://proxy/v1x/api/v1beta/models/g:generateContent"},
        {"http://proxy/vbeta", "g", 0,
         "http://proxy/vbeta/v1beta/models/g:generateContent"},
        /* A full resource name keeps its collection. */
        {NULL, "tunedModels/my-model-1", 0,
         "https://generativelanguage.googleapis.com/v1beta/tunedModels/"
         "my-model-1:generateContent"},
        {"http://h", "models/gemini-pro", 0,
         "http://h/v1beta/models/gemini-pro:generateContent"},
        {"http://h", "a b:c?d#e%", 0,
         "http://h/v1beta/models/a%20b%3Ac%3Fd%23e%25:generateContent"},
    };
    char *url;
    (void)state;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(loom__gemini_url(&url, cases[i].base, cases[i].model,
                                          cases[i].stream),
                         0);
        assert_string_equal(url, cases[i].url);
        free(url);
    }
    assert_int_equal(loom__gemini_url(&url, NULL, "", 1), LOOM_EINVALID);
    assert_null(url);
    assert_int_equal(loom__gemini_url(&url, NULL, NULL, 1), LOOM_EINVALID);
}

/* ---- schema ----------------------------------------------------------- */

static void test_schema_table(void **state)
{
    static const struct {
        const char *in, *out;
    } cases[] = {
        /* Unsupported keywords are dropped; required keeps properties. */
        {"{\"type\":\"object\",\"$schema\":\"x\",\"additionalProperties\":"
         "false,\"properties\":{\"a\":{\"type\":\"string\"}},"
         "\"required\":[\"a\",\"zz\",1]}",
         "{\"type\":\"OBJECT\",\"properties\":{\"a\":{\"type\":\"STRING\"}},"
         "\"required\":[\"a\"]}"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},"
         "\"required\":[\"zz\"]}",
         "{\"type\":\"OBJECT\",\"properties\":{\"a\":{\"type\":\"STRING\"}}}"},
        /* Type lists. */
        {"{\"type\":[\"string\",\"null\"],\"description\":\"d\"}",
         "{\"type\":\"STRING\",\"description\":\"d\",\"nullable\":true}"},
        {"{\"type\":[\"string\",\"integer\"],\"description\":\"d\"}",
         "{\"anyOf\":[{\"type\":\"STRING\"},{\"type\":\"INTEGER\"}],"
         "\"description\":\"d\"}"},
        {"{\"type\":[\"null\",\"number\",\"boolean\"],\"minimum\":1}",
         "{\"anyOf\":[{\"type\":\"NUMBER\",\"minimum\":1},"
         "{\"type\":\"BOOLEAN\"}],\"nullable\":true}"},
        {"{\"type\":\"null\"}", "{\"type\":\"STRING\",\"nullable\":true}"},
        {"{\"type\":\"weird\"}", "{\"type\":\"STRING\"}"},
        /* anyOf / oneOf / allOf. */
        {"{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"null\"}],"
         "\"description\":\"n\"}",
         "{\"type\":\"INTEGER\",\"description\":\"n\",\"nullable\":true}"},
        {"{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"number\"}]}",
         "{\"anyOf\":[{\"type\":\"STRING\"},{\"type\":\"NUMBER\"}]}"},
        {"{\"anyOf\":[{\"type\":\"string\",\"description\":\"inner\"}],"
         "\"description\":\"outer\"}",
         "{\"type\":\"STRING\",\"description\":\"inner\"}"},
        {"{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
         "\"string\"}}}],\"description\":\"wrapped\"}",
         "{\"type\":\"OBJECT\",\"properties\":{\"a\":{\"type\":\"STRING\"}},"
         "\"description\":\"wrapped\"}"},
        {"{\"allOf\":[{\"type\":\"string\"},{\"minLength\":1}]}",
         "{\"type\":\"STRING\"}"},
        /* Type given wins over a union. */
        {"{\"type\":\"integer\",\"anyOf\":[{\"minimum\":1}]}",
         "{\"type\":\"INTEGER\"}"},
        /* Formats: only the ones Gemini accepts, for their type. */
        {"{\"type\":\"string\",\"format\":\"date-time\",\"pattern\":\"^a\","
         "\"default\":\"x\",\"examples\":[\"y\"]}",
         "{\"type\":\"STRING\",\"format\":\"date-time\"}"},
        {"{\"type\":\"string\",\"format\":\"email\"}", "{\"type\":\"STRING\"}"},
        {"{\"type\":\"number\",\"format\":\"int32\"}", "{\"type\":\"NUMBER\"}"},
        {"{\"type\":\"number\",\"format\":\"double\"}",
         "{\"type\":\"NUMBER\",\"format\":\"double\"}"},
        {"{\"type\":\"integer\",\"format\":\"int64\",\"minimum\":1,"
         "\"maximum\":9.5,\"exclusiveMinimum\":0,\"multipleOf\":2}",
         "{\"type\":\"INTEGER\",\"format\":\"int64\",\"minimum\":1,"
         "\"maximum\":9.5}"},
        {"{\"type\":\"integer\",\"minimum\":\"1\"}", "{\"type\":\"INTEGER\"}"},
        /* Arrays. */
        {"{\"type\":\"array\",\"items\":{\"type\":\"string\",\"enum\":[\"a\","
         "\"b\"]},\"minItems\":1,\"maxItems\":3,\"uniqueItems\":true}",
         "{\"type\":\"ARRAY\",\"items\":{\"type\":\"STRING\",\"enum\":[\"a\","
         "\"b\"]},\"minItems\":1,\"maxItems\":3}"},
        {"{\"type\":\"array\",\"minItems\":-1}",
         "{\"type\":\"ARRAY\",\"items\":{\"type\":\"STRING\"}}"},
        {"{\"type\":\"array\",\"items\":[{\"type\":\"integer\"},"
         "{\"type\":\"string\"}]}",
         "{\"type\":\"ARRAY\",\"items\":{\"type\":\"INTEGER\"}}"},
        /* Enums: strings only; null makes it nullable; const. */
        {"{\"enum\":[\"x\",null]}",
         "{\"type\":\"STRING\",\"enum\":[\"x\"],\"nullable\":true}"},
        {"{\"type\":\"integer\",\"enum\":[1,2]}", "{\"type\":\"INTEGER\"}"},
        {"{\"type\":\"string\",\"enum\":[\"a\",1]}", "{\"type\":\"STRING\"}"},
        {"{\"const\":\"fixed\"}", "{\"type\":\"STRING\",\"enum\":[\"fixed\"]}"},
        {"{\"const\":3}", "{\"type\":\"STRING\"}"},
        /* No type: inferred from the shape, else STRING. */
        {"{\"$ref\":\"#/$defs/X\",\"description\":\"r\"}",
         "{\"type\":\"STRING\",\"description\":\"r\"}"},
        {"{\"properties\":{\"x\":{\"type\":\"boolean\"}}}",
         "{\"type\":\"OBJECT\",\"properties\":{\"x\":{\"type\":\"BOOLEAN\"}}}"},
        {"{\"items\":{\"type\":\"number\"}}",
         "{\"type\":\"ARRAY\",\"items\":{\"type\":\"NUMBER\"}}"},
        {"{}", "{\"type\":\"STRING\"}"},
        {"true", "{\"type\":\"STRING\"}"},
        /* Strings and objects keep their bounds and title. */
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":5,\"title\":"
         "\"T\"}",
         "{\"type\":\"STRING\",\"minLength\":2,\"maxLength\":5,\"title\":"
         "\"T\"}"},
        {"{\"type\":\"object\",\"properties\":{},\"minProperties\":1,"
         "\"maxProperties\":4}",
         "{\"type\":\"OBJECT\",\"minProperties\":1,\"maxProperties\":4}"},
        /* Nested. */
        {"{\"type\":\"object\",\"nullable\":true,\"properties\":{\"n\":"
         "{\"type\":[\"number\",\"null\"],\"minimum\":0},\"l\":{\"type\":"
         "\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"k\":"
         "{\"type\":\"string\",\"format\":\"enum\",\"enum\":[\"a\"]}},"
         "\"additionalProperties\":{\"type\":\"string\"}}}}}",
         "{\"type\":\"OBJECT\",\"nullable\":true,\"properties\":{\"n\":"
         "{\"type\":\"NUMBER\",\"minimum\":0,\"nullable\":true},\"l\":"
         "{\"type\":\"ARRAY\",\"items\":{\"type\":\"OBJECT\",\"properties\":"
         "{\"k\":{\"type\":\"STRING\",\"format\":\"enum\",\"enum\":[\"a\"]}}"
         "}}}}"},
    };
    (void)state;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *in = json_loads(cases[i].in, JSON_DECODE_ANY, NULL), *out;
        assert_non_null(in);
        print_message("schema %zu: %s\n", i, cases[i].in);
        assert_int_equal(loom__gemini_schema(&out, in), 0);
        assert_json(out, cases[i].out);
        json_decref(out);
        json_decref(in);
    }
}

/* Schemas nested n levels below the root (arrays of arrays). */
static json_t *nested(int n)
{
    json_t *s = json_pack("{s:s}", "type", "string");

    for (int i = 0; i < n; i++)
        s = json_pack("{s:s,s:o}", "type", "array", "items", s);
    return s;
}

static void test_schema_depth(void **state)
{
    json_t *s = nested(LOOM_GEMINI_MAX_SCHEMA_DEPTH), *out = NULL;
    (void)state;

    assert_int_equal(loom__gemini_schema(&out, s), 0);
    assert_non_null(out);
    json_decref(out);
    json_decref(s);
    s = nested(LOOM_GEMINI_MAX_SCHEMA_DEPTH + 1);
    assert_int_equal(loom__gemini_schema(&out, s), LOOM_EINVALID);
    assert_null(out);
    assert_non_null(strstr(loom_error_last(), "deeper"));
    json_decref(s);
}

/* ---- request bodies ---------------------------------------------------- */

static json_t *body_of(const loom_llm_request *req)
{
    json_t *b = NULL;

    assert_int_equal(loom__gemini_build_body(&b, req), 0);
    assert_non_null(b);
    return b;
}

static json_t *divide_schema(void)
{
    return json_pack("{s:s,s:{s:{s:s},s:{s:s}}}", "type", "object",
                     "properties", "denominator", "type", "number", "numerator",
                     "type", "number");
}

/* Compares the body loom builds for req (and its URL) with the recorded
 * request vectors/gemini/<name>.request.json. */
static void check_request_vector(const char *name, const loom_llm_request *req)
{
    char rel[128];
    char *path, *text, *url;
    json_t *rec, *body;
    const char *want_url;
    size_t n;

    snprintf(rel, sizeof(rel), "gemini/%s.request.json", name);
    path = test_vector_path(rel);
    text = test_read_file(path, NULL);
    assert_non_null(text);
    rec = json_loads(text, 0, NULL);
    assert_non_null(rec);
    body = body_of(req);
    if (!json_equal(body, json_object_get(rec, "body"))) {
        char *got = json_dumps(body, JSON_SORT_KEYS | JSON_COMPACT);
        char *want = json_dumps(json_object_get(rec, "body"),
                                JSON_SORT_KEYS | JSON_COMPACT);
        print_error("%s\ngot:  %s\nwant: %s\n", name, got, want);
        free(got);
        free(want);
        fail();
    }
    assert_int_equal(loom__gemini_url(&url, NULL, req->model, req->stream), 0);
    want_url = json_string_value(json_object_get(rec, "url"));
    n = strlen(want_url);
    assert_true(strlen(url) > n);
    assert_string_equal(url + strlen(url) - n, want_url);
    free(url);
    json_decref(body);
    json_decref(rec);
    free(text);
    free(path);
}

static void test_request_vectors(void **state)
{
    loom_messages msgs = {0};
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    json_t *params = divide_schema();
    loom_tool_def tool = {"customDivide", "Custom divide function", params};
    loom_tool_call call = {"call_0_0", "customDivide",
                           "{\"numerator\":100,\"denominator\":2}"};
    (void)state;

    assert_int_equal(
        loom_messages_add(&msgs, LOOM_ROLE_USER, "why is the sky blue?"), 0);
    req.messages = msgs.items;
    req.messages_len = msgs.len;
    req.model = "gemini-2.0-flash";
    check_request_vector("text-0", &req);
    req.model = "custom-gemini-2.0-flash";
    check_request_vector("error-0", &req);
    loom_messages_free(&msgs);

    assert_int_equal(
        loom_messages_add(&msgs, LOOM_ROLE_USER, "what is the result of 100/2"),
        0);
    req.model = "gemini-2.0-flash";
    req.messages = msgs.items;
    req.messages_len = msgs.len;
    req.tools = &tool;
    req.tools_len = 1;
    check_request_vector("function-calling-0", &req);
    /* The second request of the loop: the model's call (no id from
     * Gemini, so none goes back), then the user's next question. */
    assert_int_equal(loom_messages_add_assistant(&msgs, NULL, NULL, &call, 1),
                     0);
    assert_int_equal(
        loom_messages_add(&msgs, LOOM_ROLE_USER, "what is the result of 50/2?"),
        0);
    req.messages = msgs.items;
    req.messages_len = msgs.len;
    check_request_vector("function-calling-1", &req);
    loom_messages_free(&msgs);
    json_decref(params);
}

static void test_body_messages(void **state)
{
    loom_messages msgs = {0};
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_tool_call calls[2] = {{"c1", "get_weather", "{\"city\":\"Paris\"}"},
                               {"c2", "get_time", "not json"}};
    loom_tool_call late = {"c3", "get_weather", "[1]"};
    json_t *b;
    (void)state;

    assert_int_equal(loom_messages_add(&msgs, LOOM_ROLE_SYSTEM, "Be brief."),
                     0);
    assert_int_equal(loom_messages_add(&msgs, LOOM_ROLE_USER, "Hi \xff!"), 0);
    assert_int_equal(loom_messages_add(&msgs, LOOM_ROLE_USER, ""), 0);
    assert_int_equal(loom_messages_add_assistant(&msgs, "Checking.",
                                                 "private thoughts", calls, 2),
                     0);
    /* Results of one turn go back together, each named after its call. */
    assert_int_equal(
        loom_messages_add_tool_result(&msgs, "c2", "wrong_name",
                                      "{\"time\":\"12:00\",\"n\":[1,2]}"),
        0);
    assert_int_equal(loom_messages_add_tool_result(&msgs, "c1", NULL, "sunny"),
                     0);
    assert_int_equal(loom_messages_add(&msgs, LOOM_ROLE_SYSTEM, "Also: calm."),
                     0);
    assert_int_equal(loom_messages_add_assistant(&msgs, "", NULL, &late, 1), 0);
    assert_int_equal(
        loom_messages_add_tool_result(&msgs, "c3", NULL, "[\"a\"]"), 0);
    /* A result whose call is not in the history keeps its own name. */
    assert_int_equal(loom_messages_add_tool_result(&msgs, "zz", "orphan", "42"),
                     0);
    assert_int_equal(loom_messages_add(&msgs, LOOM_ROLE_USER, "Thanks"), 0);
    assert_int_equal(loom_messages_add_assistant(&msgs, "", NULL, NULL, 0), 0);
    assert_int_equal(loom_messages_add_tool_result(&msgs, "yy", NULL, NULL), 0);
    req.model = "m";
    req.messages = msgs.items;
    req.messages_len = msgs.len;
    b = body_of(&req);
    assert_json(
        b, "{\"systemInstruction\":{\"parts\":[{\"text\":\"Be brief.\"},"
           "{\"text\":\"Also: calm.\"}]},"
           "\"contents\":["
           "{\"role\":\"user\",\"parts\":[{\"text\":\"Hi \\ufffd!\"}]},"
           "{\"role\":\"model\",\"parts\":[{\"text\":\"Checking.\"},"
           "{\"functionCall\":{\"name\":\"get_weather\",\"args\":{\"city\":"
           "\"Paris\"}}},{\"functionCall\":{\"name\":\"get_time\",\"args\":"
           "{}}}]},"
           "{\"role\":\"user\",\"parts\":["
           "{\"functionResponse\":{\"name\":\"get_time\",\"response\":"
           "{\"time\":\"12:00\",\"n\":[1,2]}}},"
           "{\"functionResponse\":{\"name\":\"get_weather\",\"response\":"
           "{\"result\":\"sunny\"}}}]},"
           "{\"role\":\"model\",\"parts\":[{\"functionCall\":{\"name\":"
           "\"get_weather\",\"args\":{}}}]},"
           "{\"role\":\"user\",\"parts\":["
           "{\"functionResponse\":{\"name\":\"get_weather\",\"response\":"
           "{\"result\":\"[\\\"a\\\"]\"}}},"
           "{\"functionResponse\":{\"name\":\"orphan\",\"response\":"
           "{\"result\":\"42\"}}}]},"
           "{\"role\":\"user\",\"parts\":[{\"text\":\"Thanks\"}]},"
           "{\"role\":\"user\",\"parts\":[{\"functionResponse\":{\"name\":"
           "\"unknown_tool\",\"response\":{\"result\":\"\"}}}]}],"
           "\"generationConfig\":{}}");
    json_decref(b);
    loom_messages_free(&msgs);
}

static void test_body_tools_and_choice(void **state)
{
    loom_messages msgs = {0};
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    json_t *params = divide_schema();
    json_t *empty = json_pack("{s:s,s:{}}", "type", "object", "properties");
    json_t *deep = nested(LOOM_GEMINI_MAX_SCHEMA_DEPTH + 1);
    loom_tool_def tools[3] = {{"div", "Divides.", params},
                              {"now", NULL, empty},
                              {"ping", "Pings.", NULL}};
    static const char *const decls =
        "\"tools\":[{\"functionDeclarations\":["
        "{\"name\":\"div\",\"description\":\"Divides.\",\"parameters\":"
        "{\"type\":\"OBJECT\",\"properties\":{\"denominator\":{\"type\":"
        "\"NUMBER\"},\"numerator\":{\"type\":\"NUMBER\"}}}},"
        "{\"name\":\"now\"},{\"name\":\"ping\",\"description\":\"Pings.\"}"
        "]}]";
    char want[1024];
    json_t *b = NULL;
    (void)state;

    assert_int_equal(loom_messages_add(&msgs, LOOM_ROLE_USER, "q"), 0);
    req.model = "m";
    req.messages = msgs.items;
    req.messages_len = msgs.len;
    req.tools = tools;
    req.tools_len = 3;
    /* parallel_tool_calls has no Gemini counterpart. */
    req.parallel_tool_calls = 1;
    b = body_of(&req);
    snprintf(want, sizeof(want),
             "{\"contents\":[{\"role\":\"user\",\"parts\":[{\"text\":\"q\"}]}"
             "],\"generationConfig\":{},%s}",
             decls);
    assert_json(b, want);
    json_decref(b);

    req.tool_choice.kind = LOOM_TOOL_CHOICE_NONE;
    b = body_of(&req);
    assert_json(json_object_get(b, "toolConfig"),
                "{\"functionCallingConfig\":{\"mode\":\"NONE\"}}");
    json_decref(b);
    req.tool_choice.kind = LOOM_TOOL_CHOICE_REQUIRED;
    b = body_of(&req);
    assert_json(json_object_get(b, "toolConfig"),
                "{\"functionCallingConfig\":{\"mode\":\"ANY\"}}");
    json_decref(b);
    req.tool_choice.kind = LOOM_TOOL_CHOICE_FUNCTION;
    req.tool_choice.function = "div";
    b = body_of(&req);
    assert_json(json_object_get(b, "toolConfig"),
                "{\"functionCallingConfig\":{\"mode\":\"ANY\","
                "\"allowedFunctionNames\":[\"div\"]}}");
    json_decref(b);
    req.tool_choice.function = "";
    assert_int_equal(loom__gemini_build_body(&b, &req), LOOM_EINVALID);
    assert_null(b);
    /* Without tools, a tool choice sends nothing. */
    req.tools_len = 0;
    b = body_of(&req);
    assert_null(json_object_get(b, "toolConfig"));
    assert_null(json_object_get(b, "tools"));
    json_decref(b);

    /* A schema too deep fails the request, naming the tool. */
    tools[0].parameters = deep;
    req.tools_len = 1;
    req.tool_choice.kind = LOOM_TOOL_CHOICE_AUTO;
    assert_int_equal(loom__gemini_build_body(&b, &req), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "'div'"));
    req.model = "";
    assert_int_equal(loom__gemini_build_body(&b, &req), LOOM_EINVALID);
    json_decref(params);
    json_decref(empty);
    json_decref(deep);
    loom_messages_free(&msgs);
}

static void test_body_generation(void **state)
{
    loom_messages msgs = {0};
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    json_t *b;
    (void)state;

    assert_int_equal(loom_messages_add(&msgs, LOOM_ROLE_USER, "q"), 0);
    req.model = "m";
    req.messages = msgs.items;
    req.messages_len = msgs.len;
    req.max_tokens = 256;
    req.temperature = 0.7;
    req.thinking_budget = 1024;
    /* Not Gemini's: not sent. */
    req.reasoning_effort = "high";
    req.prompt_cache = 1;
    req.chain_responses = 1;
    b = body_of(&req);
    assert_json(json_object_get(b, "generationConfig"),
                "{\"maxOutputTokens\":256,\"temperature\":0.7,"
                "\"thinkingConfig\":{\"thinkingBudget\":1024,"
                "\"includeThoughts\":true}}");
    assert_int_equal(json_object_size(b), 2);
    json_decref(b);
    req.max_tokens = 0;
    req.temperature = 0.0;
    req.thinking_budget = -1;
    b = body_of(&req);
    assert_json(json_object_get(b, "generationConfig"),
                "{\"temperature\":0.0}");
    json_decref(b);
    assert_int_equal(loom__gemini_turn(&req), 0);
    loom_messages_free(&msgs);
}

/* ---- provider_state ---------------------------------------------------- */

/* A turn with thoughts (one signed), split text, a signed call and a call
 * with Gemini's own id. The signature has bytes JSON must escape. */
static const char state_stream[] =
    "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Let me "
    "think\",\"thought\":true}],\"role\":\"model\"}}],\"responseId\":\"r1\"}"
    "\r\n\r\n"
    "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\" more.\","
    "\"thought\":true,\"thoughtSignature\":\"dGhv/dWdo+dA==\"}],\"role\":"
    "\"model\"}}]}\r\n\r\n"
    "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Checking "
    "\"}],\"role\":\"model\"}}]}\r\n\r\n"
    "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"both.\"}],"
    "\"role\":\"model\"}}]}\r\n\r\n"
    "data: {\"candidates\":[{\"content\":{\"parts\":[{\"functionCall\":"
    "{\"name\":\"get_weather\",\"args\":{\"city\":\"Paris\"}},"
    "\"thoughtSignature\":\"s\\\"q\\\\b\\u00e9\\u0001/\"},{\"functionCall\":"
    "{\"id\":\"fc-7\",\"name\":\"get_time\",\"args\":{\"tz\":\"CET\"}}}],"
    "\"role\":\"model\"},\"finishReason\":\"STOP\"}],\"usageMetadata\":"
    "{\"promptTokenCount\":10,\"candidatesTokenCount\":8,"
    "\"thoughtsTokenCount\":5,\"totalTokenCount\":23}}\r\n\r\n";

static void test_state_round_trip(void **state)
{
    loom_llm_response resp = {0};
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_messages msgs = {0};
    collector c;
    json_t *b, *st;
    (void)state;

    col_init(&c);
    assert_int_equal(
        decode(state_stream, sizeof(state_stream) - 1, 0, NULL, 3, &c, &resp),
        0);
    assert_string_equal(resp.reasoning, "Let me think more.");
    assert_string_equal(resp.text, "Checking both.");
    assert_string_equal(resp.finish_reason, "tool_calls");
    assert_string_equal(resp.response_id, "r1");
    assert_int_equal(resp.tool_calls_len, 2);
    /* No id from Gemini: a stable one from the turn and the position. */
    assert_string_equal(resp.tool_calls[0].id, "call_3_0");
    assert_string_equal(resp.tool_calls[0].arguments, "{\"city\":\"Paris\"}");
    assert_string_equal(resp.tool_calls[1].id, "fc-7");
    assert_string_equal(c.delta_ids[0], "call_3_0");
    assert_string_equal(c.delta_names[1], "get_time");
    assert_string_equal(c.delta_args[1], "{\"tz\":\"CET\"}");
    assert_int_equal(resp.usage.completion_tokens, 13);
    assert_int_equal(resp.usage.reasoning_tokens, 5);
    assert_non_null(resp.provider_state);
    st = json_loads(resp.provider_state, 0, NULL);
    assert_json(st, "{\"gemini\":{\"parts\":["
                    "{\"thought\":[12,6],\"thoughtSignature\":"
                    "\"dGhv/dWdo+dA==\"},"
                    "{\"text\":[0,14]},"
                    "{\"call\":0,\"thoughtSignature\":"
                    "\"s\\\"q\\\\b\\u00e9\\u0001/\"},"
                    "{\"call\":1,\"id\":\"fc-7\"}]}}");
    json_decref(st);

    /* The next request sends the turn back as it came. */
    assert_int_equal(loom_messages_add(&msgs, LOOM_ROLE_USER, "q"), 0);
    assert_int_equal(loom_messages_add_assistant(
                         &msgs, resp.text, resp.reasoning, resp.tool_calls, 2),
                     0);
    msgs.items[1].provider_state = strdup(resp.provider_state);
    assert_int_equal(loom_messages_add_tool_result(&msgs, "call_3_0",
                                                   "get_weather", "sunny"),
                     0);
    assert_int_equal(loom_messages_add_tool_result(&msgs, "fc-7", "get_time",
                                                   "{\"time\":\"12:00\"}"),
                     0);
    req.model = "m";
    req.messages = msgs.items;
    req.messages_len = msgs.len;
    assert_int_equal(loom__gemini_turn(&req), 1);
    b = body_of(&req);
    assert_json(
        json_object_get(b, "contents"),
        "[{\"role\":\"user\",\"parts\":[{\"text\":\"q\"}]},"
        "{\"role\":\"model\",\"parts\":["
        "{\"text\":\" more.\",\"thought\":true,\"thoughtSignature\":"
        "\"dGhv/dWdo+dA==\"},"
        "{\"text\":\"Checking both.\"},"
        "{\"functionCall\":{\"name\":\"get_weather\",\"args\":{\"city\":"
        "\"Paris\"}},\"thoughtSignature\":\"s\\\"q\\\\b\\u00e9\\u0001/\"},"
        "{\"functionCall\":{\"name\":\"get_time\",\"args\":{\"tz\":\"CET\"},"
        "\"id\":\"fc-7\"}}]},"
        "{\"role\":\"user\",\"parts\":["
        "{\"functionResponse\":{\"name\":\"get_weather\",\"response\":"
        "{\"result\":\"sunny\"}}},"
        "{\"functionResponse\":{\"name\":\"get_time\",\"response\":"
        "{\"time\":\"12:00\"},\"id\":\"fc-7\"}}]}]");
    json_decref(b);

    /* An edited message no longer fits its state: sent plainly. */
    free(msgs.items[1].content);
    msgs.items[1].content = strdup("Checking all.");
    b = body_of(&req);
    assert_json(json_array_get(json_object_get(b, "contents"), 1),
                "{\"role\":\"model\",\"parts\":[{\"text\":\"Checking all.\"},"
                "{\"functionCall\":{\"name\":\"get_weather\",\"args\":"
                "{\"city\":\"Paris\"}}},{\"functionCall\":{\"name\":"
                "\"get_time\",\"args\":{\"tz\":\"CET\"}}}]}");
    /* ... and its results then carry no id either. */
    assert_null(json_object_get(
        json_object_get(
            json_array_get(
                json_object_get(
                    json_array_get(json_object_get(b, "contents"), 2), "parts"),
                1),
            "functionResponse"),
        "id"));
    json_decref(b);
    loom_messages_free(&msgs);
    loom_llm_response_clear(&resp);
    col_free(&c);
}

/* States that do not fit their message, or are not Gemini's. */
static void test_state_rejected(void **state)
{
    static const char *const states[] = {
        "{\"anthropic\":{\"thinking\":[]}}",
        "not json",
        "{\"gemini\":{\"parts\":{}}}",
        /* text not tiling the content */
        "{\"gemini\":{\"parts\":[{\"text\":[0,2],\"thoughtSignature\":"
        "\"x\"},{\"call\":0}]}}",
        "{\"gemini\":{\"parts\":[{\"text\":[1,4],\"thoughtSignature\":"
        "\"x\"},{\"call\":0}]}}",
        /* a call missing, twice, out of range, id changed */
        "{\"gemini\":{\"parts\":[{\"text\":[0,5],\"thoughtSignature\":"
        "\"x\"}]}}",
        "{\"gemini\":{\"parts\":[{\"text\":[0,5]},{\"call\":0,"
        "\"thoughtSignature\":\"x\"},{\"call\":0}]}}",
        "{\"gemini\":{\"parts\":[{\"text\":[0,5]},{\"call\":1,"
        "\"thoughtSignature\":\"x\"}]}}",
        "{\"gemini\":{\"parts\":[{\"text\":[0,5]},{\"call\":0,\"id\":"
        "\"other\"}]}}",
        /* thought out of the reasoning, two kinds in one entry, bad
         * signature, negative range */
        "{\"gemini\":{\"parts\":[{\"thought\":[0,1],\"thoughtSignature\":"
        "\"x\"},{\"text\":[0,5]},{\"call\":0}]}}",
        "{\"gemini\":{\"parts\":[{\"text\":[0,5],\"call\":0}]}}",
        "{\"gemini\":{\"parts\":[{\"text\":[0,5],\"thoughtSignature\":1},"
        "{\"call\":0}]}}",
        "{\"gemini\":{\"parts\":[{\"text\":[-1,6]},{\"call\":0,"
        "\"thoughtSignature\":\"x\"}]}}",
        "{\"gemini\":{\"parts\":[{\"text\":[0,5,1]},{\"call\":0,"
        "\"thoughtSignature\":\"x\"}]}}",
    };
    loom_tool_call call = {"c1", "f", "{}"};
    loom_messages msgs = {0};
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    json_t *b;
    (void)state;

    assert_int_equal(loom_messages_add(&msgs, LOOM_ROLE_USER, "q"), 0);
    assert_int_equal(
        loom_messages_add_assistant(&msgs, "Hello", NULL, &call, 1), 0);
    req.model = "m";
    req.messages = msgs.items;
    req.messages_len = msgs.len;
    for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++) {
        free(msgs.items[1].provider_state);
        msgs.items[1].provider_state = strdup(states[i]);
        print_message("state %zu: %s\n", i, states[i]);
        b = body_of(&req);
        assert_json(json_array_get(json_object_get(b, "contents"), 1),
                    "{\"role\":\"model\",\"parts\":[{\"text\":\"Hello\"},"
                    "{\"functionCall\":{\"name\":\"f\",\"args\":{}}}]}");
        json_decref(b);
    }
    loom_messages_free(&msgs);
}

/* A signature on an empty last text part (how Gemini ends a streamed text
 * turn) goes back on an empty text part after the text. */
static void test_state_text_signature(void **state)
{
    static const char s[] =
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"Hel\"}],"
        "\"role\":\"model\"}}]}\n\n"
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"lo\"}],"
        "\"role\":\"model\"}}]}\n\n"
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"\","
        "\"thoughtSignature\":\"U0lH\"}],\"role\":\"model\"},"
        "\"finishReason\":\"STOP\"}]}\n\n";
    loom_llm_response resp = {0};
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_messages msgs = {0};
    collector c;
    json_t *b;
    (void)state;

    col_init(&c);
    assert_int_equal(decode_str(s, NULL, &c, &resp), 0);
    assert_string_equal(resp.text, "Hello");
    assert_string_equal(resp.finish_reason, "stop");
    assert_string_equal(resp.provider_state,
                        "{\"gemini\":{\"parts\":[{\"text\":[0,5]},{\"text\":"
                        "[5,0],\"thoughtSignature\":\"U0lH\"}]}}");
    assert_int_equal(loom_messages_add(&msgs, LOOM_ROLE_USER, "q"), 0);
    assert_int_equal(
        loom_messages_add_assistant(&msgs, resp.text, NULL, NULL, 0), 0);
    msgs.items[1].provider_state = strdup(resp.provider_state);
    assert_int_equal(loom_messages_add(&msgs, LOOM_ROLE_USER, "more"), 0);
    req.model = "m";
    req.messages = msgs.items;
    req.messages_len = msgs.len;
    b = body_of(&req);
    assert_json(json_array_get(json_object_get(b, "contents"), 1),
                "{\"role\":\"model\",\"parts\":[{\"text\":\"Hello\"},"
                "{\"text\":\"\",\"thoughtSignature\":\"U0lH\"}]}");
    json_decref(b);
    loom_messages_free(&msgs);
    loom_llm_response_clear(&resp);
    col_free(&c);

    /* No signature, no id: no state at all. */
    col_init(&c);
    assert_int_equal(
        decode_str("data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":"
                   "\"x\"}]},\"finishReason\":\"STOP\"}]}\n\n",
                   NULL, &c, &resp),
        0);
    assert_null(resp.provider_state);
    loom_llm_response_clear(&resp);
    col_free(&c);
}

/* ---- recorded vectors -------------------------------------------------- */

/* The text of an SSE vector, joined by reading each data line with
 * jansson: an independent reference for the decoder. */
static char *vector_text(const char *data)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    const char *p = data;

    while ((p = strstr(p, "data: ")) != NULL) {
        const char *end = strstr(p, "\r\n");
        json_t *o = json_loadb(p + 6, (size_t)(end - p - 6), 0, NULL), *x;
        size_t i;
        json_array_foreach(
            json_object_get(
                json_object_get(
                    json_array_get(json_object_get(o, "candidates"), 0),
                    "content"),
                "parts"),
            i, x)
        {
            if (json_object_get(x, "text"))
                loom_buf_puts(&b,
                              json_string_value(json_object_get(x, "text")));
        }
        json_decref(o);
        p = end;
    }
    return loom_buf_detach(&b);
}

static char *read_vector(const char *name, size_t *len)
{
    char *path = test_vector_path(name), *data;

    data = test_read_file(path, len);
    assert_non_null(data);
    free(path);
    return data;
}

static void test_vector_text(void **state)
{
    size_t len;
    char *data = read_vector("gemini/text-0.sse", &len);
    char *want = vector_text(data);
    (void)state;

    assert_true(strlen(want) > 1000);
    for (size_t k = 0; k <= len; k++) {
        loom_llm_response resp = {0};
        collector c;
        col_init(&c);
        assert_int_equal(decode(data, len, k, NULL, 0, &c, &resp), 0);
        assert_string_equal(resp.text, want);
        assert_string_equal(loom_buf_cstr(&c.text), want);
        assert_null(resp.reasoning);
        assert_int_equal(resp.tool_calls_len, 0);
        assert_string_equal(resp.finish_reason, "stop");
        assert_string_equal(resp.response_id, "pdSfaOurIPqAm9IPucqbqA4");
        /* The last usageMetadata wins. */
        assert_int_equal(c.nusage, 1);
        assert_int_equal(resp.usage.prompt_tokens, 6);
        assert_int_equal(resp.usage.completion_tokens, 377);
        assert_int_equal(resp.usage.total_tokens, 383);
        assert_int_equal(c.nfinish, 1);
        assert_int_equal(c.last_type, LOOM_LLM_FINISH);
        assert_false(c.bad_order);
        assert_null(resp.provider_state);
        loom_llm_response_clear(&resp);
        col_free(&c);
    }
    free(want);
    free(data);
}

static void test_vector_function_calls(void **state)
{
    static const struct {
        const char *file, *args;
        long prompt, completion, total;
    } v[] = {
        {"gemini/function-calling-0.sse",
         "{\"denominator\":2,\"numerator\":100}", 21, 6, 27},
        {"gemini/function-calling-1.sse",
         "{\"denominator\":2,\"numerator\":50}", 38, 6, 44},
    };
    (void)state;

    for (size_t i = 0; i < 2; i++) {
        size_t len;
        char *data = read_vector(v[i].file, &len);
        for (size_t k = 0; k <= len; k++) {
            loom_llm_response resp = {0};
            collector c;
            col_init(&c);
            assert_int_equal(decode(data, len, k, NULL, (long)i, &c, &resp), 0);
            assert_string_equal(resp.text, "");
            assert_int_equal(resp.tool_calls_len, 1);
            assert_string_equal(resp.tool_calls[0].name, "customDivide");
            assert_string_equal(resp.tool_calls[0].arguments, v[i].args);
            assert_string_equal(resp.tool_calls[0].id,
                                i ? "call_1_0" : "call_0_0");
            assert_int_equal(c.ndeltas, 1);
            assert_int_equal(c.ncalls_events, 1);
            assert_int_equal(c.calls_len, 1);
            assert_string_equal(resp.finish_reason, "tool_calls");
            assert_int_equal(resp.usage.prompt_tokens, v[i].prompt);
            assert_int_equal(resp.usage.completion_tokens, v[i].completion);
            assert_int_equal(resp.usage.total_tokens, v[i].total);
            assert_false(c.bad_order);
            assert_int_equal(c.last_type, LOOM_LLM_FINISH);
            loom_llm_response_clear(&resp);
            col_free(&c);
        }
        free(data);
    }
}

static void test_vector_error(void **state)
{
    size_t len;
    char *data = read_vector("gemini/error-0.sse", &len);
    char *st = read_vector("gemini/error-0.status", NULL);
    loom_upstream_error err = {0};
    loom_llm_response resp = {0};
    collector c;
    (void)state;

    /* As the HTTP error it is (a 404 with an SSE-framed body). */
    assert_int_equal(
        loom__gemini_error_from_http(&err, atol(st), data, len, "rid-1"), 0);
    assert_int_equal(err.http_status, 404);
    assert_int_equal(err.kind, LOOM_UPSTREAM_NOT_FOUND);
    assert_string_equal(err.type, "NOT_FOUND");
    assert_string_equal(err.request_id, "rid-1");
    assert_true(strncmp(err.message,
                        "models/custom-gemini-2.0-flash is not found for API "
                        "version v1beta",
                        64) == 0);
    free(err.type);
    free(err.message);
    free(err.request_id);
    /* As a stream (a server sending it with status 200), at every split. */
    for (size_t k = 0; k <= len; k++) {
        loom__gemini_decoder *d;
        const loom_upstream_error *de;
        col_init(&c);
        assert_int_equal(loom__gemini_decoder_new(&d, NULL, 0, collect, &c), 0);
        int rc = loom__gemini_decoder_feed(d, data, k);
        if (rc == 0)
            rc = loom__gemini_decoder_feed(d, data + k, len - k);
        if (rc == 0)
            rc = loom__gemini_decoder_finish(d);
        assert_int_equal(rc, LOOM_EUPSTREAM);
        de = loom__gemini_decoder_error(d);
        assert_int_equal(de->kind, LOOM_UPSTREAM_STREAM);
        assert_int_equal(de->http_status, 404);
        assert_string_equal(de->type, "NOT_FOUND");
        assert_false(loom__gemini_stream_error_retryable(de));
        assert_int_equal(c.nerror, 1);
        assert_int_equal(loom__gemini_decoder_export(d, &resp), 0);
        assert_false(resp.output_started);
        loom__gemini_decoder_free(d);
        loom_llm_response_clear(&resp);
        col_free(&c);
    }
    free(st);
    free(data);
}

/* Every vector in the folder has a test above: a new recording must get
 * one. */
static void test_vectors_all_known(void **state)
{
    static const char *const known[] = {"error-0.sse", "function-calling-0.sse",
                                        "function-calling-1.sse", "text-0.sse"};
    char *dir = test_vector_path("gemini");
    DIR *dp = opendir(dir);
    struct dirent *de;
    size_t seen = 0;
    (void)state;

    assert_non_null(dp);
    while ((de = readdir(dp)) != NULL) {
        size_t n = strlen(de->d_name), i;
        if (n < 4 || strcmp(de->d_name + n - 4, ".sse") != 0)
            continue;
        for (i = 0; i < 4 && strcmp(known[i], de->d_name) != 0; i++)
            ;
        if (i == 4)
            fail_msg("no test for vector gemini/%s", de->d_name);
        seen++;
    }
    closedir(dp);
    assert_int_equal(seen, 4);
    free(dir);
}

/* ---- decoding ------------------------------------------------------------ */

static void test_usage(void **state)
{
    loom_llm_response resp = {0};
    collector c;
    (void)state;

    col_init(&c);
    assert_int_equal(
        decode_str("data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":"
                   "\"a\"}]},\"finishReason\":\"STOP\"}],\"usageMetadata\":{"
                   "\"promptTokenCount\":100,\"toolUsePromptTokenCount\":7,"
                   "\"candidatesTokenCount\":20,\"thoughtsTokenCount\":30,"
                   "\"cachedContentTokenCount\":64,\"totalTokenCount\":157}}"
                   "\n\n",
                   NULL, &c, &resp),
        0);
    assert_int_equal(resp.usage.prompt_tokens, 107);
    assert_int_equal(resp.usage.completion_tokens, 50);
    assert_int_equal(resp.usage.cached_tokens, 64);
    assert_int_equal(resp.usage.reasoning_tokens, 30);
    assert_int_equal(resp.usage.total_tokens, 157);
    assert_int_equal(c.usage.prompt_tokens, 107);
    loom_llm_response_clear(&resp);
    col_free(&c);

    /* No total: the sum; junk counts: 0; huge: clamped. */
    col_init(&c);
    assert_int_equal(
        decode_str("data: {\"candidates\":[{\"finishReason\":\"STOP\"}],"
                   "\"usageMetadata\":{\"promptTokenCount\":5,"
                   "\"candidatesTokenCount\":2.0,\"thoughtsTokenCount\":-4,"
                   "\"cachedContentTokenCount\":\"9\"}}\n\n"
                   "data: {\"usageMetadata\":{\"promptTokenCount\":5,"
                   "\"candidatesTokenCount\":3,\"totalTokenCount\":"
                   "99999999999999999}}\n\n",
                   NULL, &c, &resp),
        0);
    assert_int_equal(resp.usage.prompt_tokens, 5);
    assert_int_equal(resp.usage.completion_tokens, 3);
    assert_int_equal(resp.usage.cached_tokens, 0);
    assert_int_equal(resp.usage.total_tokens, 1000000000000L);
    assert_int_equal(c.nusage, 1);
    loom_llm_response_clear(&resp);
    col_free(&c);

    /* Without usageMetadata, no USAGE event. */
    col_init(&c);
    assert_int_equal(decode_str("data: {\"candidates\":[{\"finishReason\":"
                                "\"STOP\"}]}\n\n",
                                NULL, &c, &resp),
                     0);
    assert_int_equal(c.nusage, 0);
    assert_int_equal(c.nfinish, 1);
    loom_llm_response_clear(&resp);
    col_free(&c);
}

static void test_finish_reasons(void **state)
{
    static const struct {
        const char *gemini;
        int call;
        const char *loom;
    } cases[] = {
        {"STOP", 0, "stop"},
        {"STOP", 1, "tool_calls"},
        {"MAX_TOKENS", 0, "length"},
        {"MAX_TOKENS", 1, "length"},
        {"SAFETY", 0, "content_filter"},
        {"RECITATION", 0, "content_filter"},
        {"BLOCKLIST", 0, "content_filter"},
        {"PROHIBITED_CONTENT", 0, "content_filter"},
        {"SPII", 0, "content_filter"},
        {"IMAGE_SAFETY", 0, "content_filter"},
        {"MALFORMED_FUNCTION_CALL", 0, "malformed_function_call"},
        {"OTHER", 0, "other"},
    };
    char s[512];
    (void)state;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        loom_llm_response resp = {0};
        collector c;
        col_init(&c);
        snprintf(s, sizeof(s),
                 "data: {\"candidates\":[{\"content\":{\"parts\":[%s]},"
                 "\"finishReason\":\"%s\"}]}\n\n",
                 cases[i].call
                     ? "{\"functionCall\":{\"name\":\"f\",\"args\":{}}}"
                     : "{\"text\":\"t\"}",
                 cases[i].gemini);
        assert_int_equal(decode_str(s, NULL, &c, &resp), 0);
        assert_string_equal(resp.finish_reason, cases[i].loom);
        assert_string_equal(c.finish, cases[i].loom);
        loom_llm_response_clear(&resp);
        col_free(&c);
    }
}

static void test_blocked_prompt(void **state)
{
    loom_llm_response resp = {0};
    collector c;
    (void)state;

    col_init(&c);
    assert_int_equal(
        decode_str("data: {\"promptFeedback\":{\"blockReason\":\"SAFETY\"},"
                   "\"usageMetadata\":{\"promptTokenCount\":4,"
                   "\"totalTokenCount\":4}}\n\n",
                   NULL, &c, &resp),
        0);
    assert_string_equal(resp.finish_reason, "content_filter");
    assert_string_equal(resp.text, "");
    assert_int_equal(resp.usage.prompt_tokens, 4);
    loom_llm_response_clear(&resp);
    col_free(&c);
}

static void test_parts_and_candidates(void **state)
{
    /* Several calls in one event; other candidates and unknown parts
     * ignored; args null is {}; a call id "" is none. */
    static const char many[] =
        "data: {\"candidates\":[{\"index\":1,\"content\":{\"parts\":"
        "[{\"text\":\"other\"}]}},{\"index\":0,\"content\":{\"parts\":"
        "[{\"inlineData\":{\"data\":\"AA==\"}},{\"text\":\"A\"},"
        "{\"functionCall\":{\"name\":\"f\",\"args\":{\"x\":1.5}}},"
        "{\"functionCall\":{\"name\":\"g\",\"id\":\"\",\"args\":null}},"
        "{\"functionCall\":{\"name\":\"h\"}}]},\"finishReason\":"
        "\"STOP\"}]}\n\n";
    loom_llm_response resp = {0};
    collector c;
    (void)state;

    col_init(&c);
    assert_int_equal(decode(many, sizeof(many) - 1, 0, NULL, 7, &c, &resp), 0);
    assert_string_equal(resp.text, "A");
    assert_int_equal(resp.tool_calls_len, 3);
    assert_string_equal(resp.tool_calls[0].arguments, "{\"x\":1.5}");
    assert_string_equal(resp.tool_calls[1].id, "call_7_1");
    assert_string_equal(resp.tool_calls[1].arguments, "{}");
    assert_string_equal(resp.tool_calls[2].id, "call_7_2");
    assert_string_equal(resp.tool_calls[2].arguments, "{}");
    assert_null(resp.provider_state);
    assert_int_equal(c.ndeltas, 3);
    loom_llm_response_clear(&resp);
    col_free(&c);

    /* A proxy's [DONE], comments and other event types are ignored. */
    col_init(&c);
    assert_int_equal(
        decode_str(": keep-alive\n\nevent: ping\ndata: {}\n\n"
                   "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":"
                   "\"ok\"}]},\"finishReason\":\"STOP\"}]}\n\ndata: [DONE]\n\n",
                   NULL, &c, &resp),
        0);
    assert_string_equal(resp.text, "ok");
    loom_llm_response_clear(&resp);
    col_free(&c);
}

static void test_protocol_errors(void **state)
{
    static const char *const bad[] = {
        "data: {not json\n\n",
        "data: [1,2]\n\n",
        "data: {\"candidates\":{}}\n\n",
        "data: {\"candidates\":[{\"content\":{\"parts\":{}}}]}\n\n",
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"functionCall\":"
        "{\"args\":{}}}]}}]}\n\n",
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"functionCall\":"
        "{\"name\":\"f\",\"args\":[1]}}]}}]}\n\n",
    };
    (void)state;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        loom_llm_response resp = {0};
        collector c;
        col_init(&c);
        assert_int_equal(decode_str(bad[i], NULL, &c, &resp), LOOM_EPROTO);
        assert_int_equal(resp.tool_calls_len, 0);
        loom_llm_response_clear(&resp);
        col_free(&c);
    }
}

static void test_stream_end(void **state)
{
    loom__gemini_decoder *d;
    loom_llm_response resp = {0};
    collector c;
    (void)state;

    /* Cut before the finishReason: the connection dropped; the calls seen
     * are not handed over, the text is. */
    col_init(&c);
    assert_int_equal(
        decode_str("data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":"
                   "\"par\"},{\"functionCall\":{\"name\":\"f\",\"args\":{}}}]}"
                   "}]}\n\n",
                   NULL, &c, &resp),
        LOOM_EUPSTREAM);
    assert_string_equal(resp.text, "par");
    assert_int_equal(resp.tool_calls_len, 0);
    assert_null(resp.finish_reason);
    assert_true(resp.output_started);
    assert_int_equal(c.nfinish, 0);
    loom_llm_response_clear(&resp);
    col_free(&c);

    col_init(&c);
    assert_int_equal(loom__gemini_decoder_new(&d, NULL, 0, collect, &c), 0);
    assert_int_equal(loom__gemini_decoder_finish(d), LOOM_EUPSTREAM);
    assert_int_equal(loom__gemini_decoder_error(d)->kind,
                     LOOM_UPSTREAM_CONNECTION);
    assert_false(loom__gemini_decoder_output_started(d));
    assert_false(loom__gemini_decoder_done(d));
    loom__gemini_decoder_free(d);
    col_free(&c);

    /* The last event without its blank line still counts. */
    col_init(&c);
    assert_int_equal(loom__gemini_decoder_new(&d, NULL, 0, collect, &c), 0);
    assert_int_equal(
        loom__gemini_decoder_feed(
            d, "data: {\"candidates\":[{\"finishReason\":\"STOP\"}]}",
            strlen("data: {\"candidates\":[{\"finishReason\":\"STOP\"}]}")),
        0);
    assert_int_equal(loom__gemini_decoder_finish(d), 0);
    assert_true(loom__gemini_decoder_done(d));
    assert_int_equal(loom__gemini_decoder_finish(d), 0);
    assert_int_equal(c.nfinish, 1);
    loom__gemini_decoder_free(d);
    col_free(&c);
}

static void test_stream_errors(void **state)
{
    static const char hi[] =
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":"
        "\"Hi\"}]}}]}\n\n";
    static const struct {
        const char *body;
        int status;
        const char *type, *message;
        int retryable;
    } cases[] = {
        {"data: {\"error\":{\"code\":503,\"message\":\"The model is "
         "overloaded.\",\"status\":\"UNAVAILABLE\"}}\n\n",
         503, "UNAVAILABLE", "The model is overloaded.", 1},
        {"data: {\"error\":{\"code\":429,\"message\":\"slow down\","
         "\"status\":\"RESOURCE_EXHAUSTED\"}}\n\n",
         429, "RESOURCE_EXHAUSTED", "slow down", 1},
        {"data: {\"error\":{\"code\":400,\"message\":\"bad\",\"status\":"
         "\"INVALID_ARGUMENT\"}}\n\n",
         400, "INVALID_ARGUMENT", "bad", 0},
        {"data: {\"error\":\"plain\"}\n\n", 0, NULL, "plain", 0},
        {"event: error\ndata: boom\n\n", 0, NULL, "boom", 0},
        {"data: {\"error\":{\"code\":70000}}\n\n", 0, NULL,
         "{\"error\":{\"code\":70000}}", 0},
    };
    (void)state;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        loom__gemini_decoder *d;
        const loom_upstream_error *e;
        loom_llm_response resp = {0};
        collector c;
        col_init(&c);
        assert_int_equal(loom__gemini_decoder_new(&d, NULL, 0, collect, &c), 0);
        /* Some text first: kept, and output has started. */
        assert_int_equal(loom__gemini_decoder_feed(d, hi, strlen(hi)), 0);
        assert_int_equal(
            loom__gemini_decoder_feed(d, cases[i].body, strlen(cases[i].body)),
            LOOM_EUPSTREAM);
        /* Finished: more input gives the same error. */
        assert_int_equal(loom__gemini_decoder_feed(d, "data: {}\n\n", 10),
                         LOOM_EUPSTREAM);
        assert_int_equal(loom__gemini_decoder_finish(d), LOOM_EUPSTREAM);
        e = loom__gemini_decoder_error(d);
        assert_int_equal(e->kind, LOOM_UPSTREAM_STREAM);
        assert_int_equal(e->http_status, cases[i].status);
        if (cases[i].type)
            assert_string_equal(e->type, cases[i].type);
        else
            assert_null(e->type);
        assert_string_equal(e->message, cases[i].message);
        assert_int_equal(loom__gemini_stream_error_retryable(e),
                         cases[i].retryable);
        assert_int_equal(c.nerror, 1);
        assert_int_equal(loom__gemini_decoder_export(d, &resp), 0);
        assert_string_equal(resp.text, "Hi");
        assert_true(resp.output_started);
        loom__gemini_decoder_free(d);
        loom_llm_response_clear(&resp);
        col_free(&c);
    }
}

static void test_complete_bodies(void **state)
{
    loom_llm_response resp = {0};
    collector c;
    (void)state;

    /* generateContent: one object with every part. */
    col_init(&c);
    assert_int_equal(
        decode_body("{\"candidates\":[{\"content\":{\"parts\":[{\"text\":"
                    "\"Thinking.\",\"thought\":true},{\"text\":\"The sky is "
                    "blue.\"},{\"functionCall\":{\"name\":\"f\",\"args\":{}},"
                    "\"thoughtSignature\":\"c2ln\"}],\"role\":\"model\"},"
                    "\"finishReason\":\"STOP\"}],\"usageMetadata\":{"
                    "\"promptTokenCount\":7,\"candidatesTokenCount\":5,"
                    "\"totalTokenCount\":12},\"responseId\":\"x\"}",
                    &c, &resp),
        0);
    assert_string_equal(resp.text, "The sky is blue.");
    assert_string_equal(resp.reasoning, "Thinking.");
    assert_int_equal(resp.tool_calls_len, 1);
    assert_string_equal(resp.finish_reason, "tool_calls");
    assert_int_equal(resp.usage.total_tokens, 12);
    assert_string_equal(resp.provider_state,
                        "{\"gemini\":{\"parts\":[{\"text\":[0,16]},{\"call\":"
                        "0,\"thoughtSignature\":\"c2ln\"}]}}");
    assert_false(c.bad_order);
    assert_int_equal(c.last_type, LOOM_LLM_FINISH);
    loom_llm_response_clear(&resp);
    col_free(&c);

    /* streamGenerateContent without alt=sse: an array of them. */
    col_init(&c);
    assert_int_equal(
        decode_body("[{\"candidates\":[{\"content\":{\"parts\":[{\"text\":"
                    "\"a\"}]}}]},\r\n{\"candidates\":[{\"content\":{\"parts\":"
                    "[{\"text\":\"b\"}]},\"finishReason\":\"MAX_TOKENS\"}]}]",
                    &c, &resp),
        0);
    assert_string_equal(resp.text, "ab");
    assert_string_equal(resp.finish_reason, "length");
    loom_llm_response_clear(&resp);
    col_free(&c);

    col_init(&c);
    assert_int_equal(decode_body("{\"error\":{\"code\":500,\"message\":\"m\","
                                 "\"status\":\"INTERNAL\"}}",
                                 &c, &resp),
                     LOOM_EUPSTREAM);
    loom_llm_response_clear(&resp);
    col_free(&c);
    col_init(&c);
    assert_int_equal(decode_body("[{\"candidates\":[]},{\"error\":{\"code\":"
                                 "500}}]",
                                 &c, &resp),
                     LOOM_EUPSTREAM);
    loom_llm_response_clear(&resp);
    col_free(&c);
    col_init(&c);
    assert_int_equal(decode_body("{\"modelVersion\":\"x\"}", &c, &resp),
                     LOOM_EPROTO);
    loom_llm_response_clear(&resp);
    col_free(&c);
    col_init(&c);
    assert_int_equal(decode_body("<html>", &c, &resp), LOOM_EPROTO);
    loom_llm_response_clear(&resp);
    col_free(&c);
    col_init(&c);
    assert_int_equal(decode_body("42", &c, &resp), LOOM_EPROTO);
    loom_llm_response_clear(&resp);
    col_free(&c);
}

static void test_callback_abort(void **state)
{
    static const char s[] =
        "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"a\"}]}}]}"
        "\n\ndata: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"b\"}"
        "]},\"finishReason\":\"STOP\"}]}\n\n";
    static const int on[] = {LOOM_LLM_TEXT, LOOM_LLM_FINISH};
    (void)state;

    for (size_t i = 0; i < 2; i++) {
        loom_llm_response resp = {0};
        collector c;
        col_init(&c);
        c.abort_on = on[i];
        assert_int_equal(decode_str(s, NULL, &c, &resp), LOOM_ECANCELED);
        loom_llm_response_clear(&resp);
        col_free(&c);
    }
}

/* ---- limits ------------------------------------------------------------ */

/* A stream of one event with parts, then the finishReason. */
static int decode_parts(const char *parts, const loom__gemini_limits *lim)
{
    loom_llm_response resp = {0};
    collector c;
    char *s;
    int rc;

    assert_true(asprintf(&s,
                         "data: {\"candidates\":[{\"content\":{\"parts\":[%s]},"
                         "\"finishReason\":\"STOP\"}]}\n\n",
                         parts) > 0);
    col_init(&c);
    rc = decode_str(s, lim, &c, &resp);
    if (rc == LOOM_ETOOLARGE)
        assert_int_equal(resp.tool_calls_len, 0);
    loom_llm_response_clear(&resp);
    col_free(&c);
    free(s);
    return rc;
}

/* A stream whose first line is line_len bytes (an event loom ignores),
 * then a finishReason. */
static int decode_long_line(size_t line_len, const loom__gemini_limits *lim)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    loom_llm_response resp = {0};
    collector c;
    int rc;

    assert_int_equal(loom_buf_puts(&b, "data: {\"x\":\""), 0);
    while (b.len < line_len - 2)
        assert_int_equal(loom_buf_putc(&b, 'y'), 0);
    assert_int_equal(loom_buf_puts(&b, "\"}"), 0);
    assert_int_equal(b.len, line_len);
    assert_int_equal(loom_buf_puts(&b, "\n\ndata: {\"candidates\":[{"
                                       "\"finishReason\":\"STOP\"}]}\n\n"),
                     0);
    col_init(&c);
    rc = decode(b.ptr, b.len, 0, lim, 0, &c, &resp);
    if (rc == 0)
        assert_string_equal(resp.finish_reason, "stop");
    loom_llm_response_clear(&resp);
    col_free(&c);
    loom_buf_free(&b);
    return rc;
}

static void test_limits(void **state)
{
    loom__gemini_limits lim = {0};
    char sig[256], parts[512];
    (void)state;

    lim.max_text = 10;
    assert_int_equal(
        decode_parts("{\"text\":\"01234\"},{\"text\":\"56789\"}", &lim), 0);
    assert_int_equal(
        decode_parts("{\"text\":\"01234\"},{\"text\":\"56789A\"}", &lim),
        LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "text"));
    assert_int_equal(
        decode_parts("{\"text\":\"0123456789\",\"thought\":true}", &lim), 0);
    assert_int_equal(
        decode_parts("{\"text\":\"0123456789A\",\"thought\":true}", &lim),
        LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "reasoning"));

    memset(&lim, 0, sizeof(lim));
    lim.max_tool_calls = 2;
    assert_int_equal(
        decode_parts("{\"functionCall\":{\"name\":\"a\"}},{\"functionCall\":"
                     "{\"name\":\"b\"}}",
                     &lim),
        0);
    assert_int_equal(
        decode_parts("{\"functionCall\":{\"name\":\"a\"}},{\"functionCall\":"
                     "{\"name\":\"b\"}},{\"functionCall\":{\"name\":\"c\"}}",
                     &lim),
        LOOM_ETOOLARGE);

    memset(&lim, 0, sizeof(lim));
    lim.max_args = 10; /* {"a":"12"} is 10 bytes */
    assert_int_equal(
        decode_parts("{\"functionCall\":{\"name\":\"a\",\"args\":{\"a\":"
                     "\"12\"}}}",
                     &lim),
        0);
    assert_int_equal(
        decode_parts("{\"functionCall\":{\"name\":\"a\",\"args\":{\"a\":"
                     "\"123\"}}}",
                     &lim),
        LOOM_ETOOLARGE);

    /* State: 48 bytes per part entry, plus its signature and id. */
    memset(&lim, 0, sizeof(lim));
    lim.max_state = 100;
    memset(sig, 'S', 52);
    sig[52] = '\0';
    snprintf(parts, sizeof(parts),
             "{\"text\":\"x\",\"thoughtSignature\":\"%s\"}", sig);
    assert_int_equal(decode_parts(parts, &lim), 0);
    snprintf(parts, sizeof(parts),
             "{\"text\":\"x\",\"thoughtSignature\":\"%sS\"}", sig);
    assert_int_equal(decode_parts(parts, &lim), LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "state"));
    lim.max_state = 48 + 5;
    assert_int_equal(
        decode_parts("{\"functionCall\":{\"name\":\"a\",\"id\":\"12345\"}}",
                     &lim),
        0);
    assert_int_equal(
        decode_parts("{\"functionCall\":{\"name\":\"a\",\"id\":\"123456\"}}",
                     &lim),
        LOOM_ETOOLARGE);

    /* One SSE line is bounded by the limits: twice the larger of text
     * and arguments, plus the state, plus 64 KiB. */
    memset(&lim, 0, sizeof(lim));
    lim.max_text = lim.max_args = 10;
    lim.max_state = 100;
    assert_int_equal(decode_long_line(2 * 10 + 100 + 65536, &lim), 0);
    assert_int_equal(decode_long_line(2 * 10 + 100 + 65536 + 1, &lim),
                     LOOM_ETOOLARGE);
}

/* ---- HTTP errors -------------------------------------------------------- */

static void test_http_errors(void **state)
{
    static const struct {
        long status;
        const char *body;
        loom_upstream_kind kind;
        const char *type, *message;
    } cases[] = {
        {400,
         "{\"error\":{\"code\":400,\"message\":\"API key not valid.\","
         "\"status\":\"INVALID_ARGUMENT\"}}",
         LOOM_UPSTREAM_BAD_REQUEST, "INVALID_ARGUMENT", "API key not valid."},
        {401,
         "{\"error\":{\"code\":401,\"message\":\"no\",\"status\":"
         "\"UNAUTHENTICATED\"}}",
         LOOM_UPSTREAM_AUTH, "UNAUTHENTICATED", "no"},
        {403,
         "{\"error\":{\"message\":\"denied\",\"status\":"
         "\"PERMISSION_DENIED\"}}",
         LOOM_UPSTREAM_PERMISSION, "PERMISSION_DENIED", "denied"},
        {404,
         "[{\"error\":{\"code\":404,\"message\":\"gone\",\"status\":"
         "\"NOT_FOUND\"}}]",
         LOOM_UPSTREAM_NOT_FOUND, "NOT_FOUND", "gone"},
        {408, "", LOOM_UPSTREAM_TIMEOUT, NULL, "HTTP 408"},
        {409, "{\"error\":{\"message\":\"aborted\",\"status\":\"ABORTED\"}}",
         LOOM_UPSTREAM_CONFLICT, "ABORTED", "aborted"},
        {413, "too big", LOOM_UPSTREAM_TOO_LARGE, NULL, "too big"},
        {422, "{\"message\":\"flat\"}", LOOM_UPSTREAM_UNPROCESSABLE, NULL,
         "flat"},
        {429,
         "data: {\"error\":{\"code\":429,\"message\":\"Resource has been "
         "exhausted\",\"status\":\"RESOURCE_EXHAUSTED\"}}\r\n\r\n",
         LOOM_UPSTREAM_RATE_LIMIT, "RESOURCE_EXHAUSTED",
         "Resource has been exhausted"},
        {500,
         "{\"error\":{\"code\":500,\"message\":\"\",\"status\":"
         "\"INTERNAL\"}}",
         LOOM_UPSTREAM_SERVER, "INTERNAL",
         "{\"error\":{\"code\":500,\"message\":\"\",\"status\":"
         "\"INTERNAL\"}}"},
        {503, NULL, LOOM_UPSTREAM_SERVER, NULL, "HTTP 503"},
        {418, "{\"error\":\"teapot\"}", LOOM_UPSTREAM_BAD_REQUEST, NULL,
         "teapot"},
    };
    loom_upstream_error err = {0};
    char big[1200];
    (void)state;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *b = cases[i].body;
        err.attempts = 3;
        assert_int_equal(loom__gemini_error_from_http(&err, cases[i].status, b,
                                                      b ? strlen(b) : 0, NULL),
                         0);
        assert_int_equal(err.kind, cases[i].kind);
        assert_int_equal(err.http_status, cases[i].status);
        assert_int_equal(err.attempts, 3);
        if (cases[i].type)
            assert_string_equal(err.type, cases[i].type);
        else
            assert_null(err.type);
        assert_string_equal(err.message, cases[i].message);
        assert_null(err.request_id);
    }
    /* A raw body is cut to LOOM_GEMINI_MAX_ERROR_TEXT bytes, not inside a
     * UTF-8 sequence. */
    memset(big, 'x', sizeof(big));
    memcpy(big + LOOM_GEMINI_MAX_ERROR_TEXT - 1, "\xC3\xA9", 2);
    big[sizeof(big) - 1] = '\0';
    assert_int_equal(
        loom__gemini_error_from_http(&err, 502, big, strlen(big), "req-9"), 0);
    assert_int_equal(strlen(err.message), LOOM_GEMINI_MAX_ERROR_TEXT - 1);
    assert_string_equal(err.request_id, "req-9");
    big[LOOM_GEMINI_MAX_ERROR_TEXT - 1] = 'x';
    big[LOOM_GEMINI_MAX_ERROR_TEXT] = 'x';
    assert_int_equal(
        loom__gemini_error_from_http(&err, 502, big, strlen(big), NULL), 0);
    assert_int_equal(strlen(err.message), LOOM_GEMINI_MAX_ERROR_TEXT);
    free(err.type);
    free(err.message);
    free(err.request_id);
}

static void test_retry_delay(void **state)
{
    static const struct {
        const char *body;
        long ms;
    } cases[] = {
        {"{\"error\":{\"code\":429,\"details\":[{\"@type\":\"type.googleapis."
         "com/google.rpc.QuotaFailure\"},{\"@type\":\"type.googleapis.com/"
         "google.rpc.RetryInfo\",\"retryDelay\":\"37s\"}]}}",
         37000},
        {"{\"error\":{\"details\":[{\"@type\":\"type.googleapis.com/google."
         "rpc.RetryInfo\",\"retryDelay\":\"0.250s\"}]}}",
         250},
        {"data: {\"error\":{\"details\":[{\"@type\":\"type.googleapis.com/"
         "google.rpc.RetryInfo\",\"retryDelay\":\"2s\"}]}}\r\n\r\n",
         2000},
        {"{\"error\":{\"details\":[{\"@type\":\"type.googleapis.com/google."
         "rpc.RetryInfo\",\"retryDelay\":\"99999999s\"}]}}",
         1000000000L},
        {"{\"error\":{\"details\":[{\"@type\":\"type.googleapis.com/google."
         "rpc.RetryInfo\",\"retryDelay\":\"5m\"}]}}",
         -1},
        {"{\"error\":{\"details\":[{\"@type\":\"type.googleapis.com/google."
         "rpc.RetryInfo\",\"retryDelay\":\"-1s\"}]}}",
         -1},
        {"{\"error\":{\"details\":[{\"@type\":\"x.ErrorInfo\","
         "\"retryDelay\":\"3s\"}]}}",
         -1},
        {"{\"error\":{\"code\":429}}", -1},
        {"nope", -1},
    };
    (void)state;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_int_equal(
            loom__gemini_retry_delay(cases[i].body, strlen(cases[i].body)),
            cases[i].ms);
    assert_int_equal(loom__gemini_retry_delay(NULL, 0), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_url),
        cmocka_unit_test(test_schema_table),
        cmocka_unit_test(test_schema_depth),
        cmocka_unit_test(test_request_vectors),
        cmocka_unit_test(test_body_messages),
        cmocka_unit_test(test_body_tools_and_choice),
        cmocka_unit_test(test_body_generation),
        cmocka_unit_test(test_state_round_trip),
        cmocka_unit_test(test_state_rejected),
        cmocka_unit_test(test_state_text_signature),
        cmocka_unit_test(test_vector_text),
        cmocka_unit_test(test_vector_function_calls),
        cmocka_unit_test(test_vector_error),
        cmocka_unit_test(test_vectors_all_known),
        cmocka_unit_test(test_usage),
        cmocka_unit_test(test_finish_reasons),
        cmocka_unit_test(test_blocked_prompt),
        cmocka_unit_test(test_parts_and_candidates),
        cmocka_unit_test(test_protocol_errors),
        cmocka_unit_test(test_stream_end),
        cmocka_unit_test(test_stream_errors),
        cmocka_unit_test(test_complete_bodies),
        cmocka_unit_test(test_callback_abort),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_http_errors),
        cmocka_unit_test(test_retry_delay),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
