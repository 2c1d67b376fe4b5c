/*
 * MCP image results end to end: an agent calls the image tool of the
 * stdio fake in tests/mcp/fake_mcp.c through a session, against the fake
 * upstream in each wire format. A model with capabilities.vision gets
 * the image where its API takes one (Chat Completions: a user message
 * after the results; Anthropic: in the tool_result; Responses: in the
 * function_call_output; Gemini: beside the functionResponse), and gets
 * it again when the conversation continues from the store; a model
 * without vision reads only the description.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fake.h"
#include "loom/session.h"
#include "loom/store.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What the fake MCP server's image tool gives. */
#define PNG_B64 "iVBORw0KGgo="
#define SHOWN "[image: image/png, about 9 bytes]"

/* Calls the tool, answers, and answers again on the next turn. */
static const char script[] =
    "{\"responses\": ["
    "{\"tool_calls\": [{\"id\": \"c1\", \"name\": \"shots__image\", "
    "\"arguments\": \"{}\"}]},"
    "{\"text\": [\"a tiny png\"]},"
    "{\"text\": [\"still a png\"]}]}";

typedef struct {
    loom_fake *fake;
    loom_config *cfg;
    loom_store *store;
    loom_session *sess;
    char *db;
} fixture;

static void setup(fixture *f, const char *model)
{
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    const char *url;
    char *yaml = NULL;

    memset(f, 0, sizeof(*f));
    assert_non_null(f->fake = fake_start_script(script));
    url = fake_base_url(f->fake);
    assert_true(
        asprintf(&yaml,
                 "providers:\n"
                 "  fake: {base_url: '%s', api_key: k, retries: {max: 0}}\n"
                 "  resp: {kind: openai-responses, base_url: '%s', api_key: "
                 "k, retries: {max: 0}}\n"
                 "  ant: {kind: anthropic, base_url: '%s', api_key: k, "
                 "retries: {max: 0}}\n"
                 "  gem: {kind: gemini, base_url: '%s', api_key: k, "
                 "retries: {max: 0}}\n"
                 "models:\n"
                 "  fake/eye: {capabilities: {vision: true}}\n"
                 "  fake/blind: {}\n"
                 "  resp/eye: {capabilities: {vision: true}}\n"
                 "  ant/eye: {capabilities: {vision: true}}\n"
                 "  gem/eye: {capabilities: {vision: true}}\n"
                 "mcp_servers:\n"
                 "  shots: {command: '%s', tools: [image]}\n"
                 "agents:\n"
                 "  a: {model: %s, tools: [shots__image]}\n",
                 url, url, url, url, LOOM_FAKE_MCP_BIN, model) > 0);
    if (loom_config_load_string(&f->cfg, yaml, "t.yaml") != 0)
        fail_msg("config: %s", loom_error_last());
    free(yaml);
    f->db = test_tmp_path("mcp-vision.db");
    unlink(f->db);
    assert_int_equal(loom_store_open(&f->store, f->db), 0);
    so.config = f->cfg;
    so.store = f->store;
    assert_int_equal(loom_session_new(&f->sess, &so), 0);
}

static void teardown(fixture *f)
{
    loom_session_free(f->sess);
    loom_store_free(f->store);
    loom_config_free(f->cfg);
    fake_stop(f->fake);
    unlink(f->db);
    free(f->db);
}

/* One turn of agent "a" saying text, continuing conv (NULL: a new one);
 * the conversation's id (caller frees). */
static char *turn(fixture *f, const char *text, const char *conv)
{
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    loom_turn *t;
    char *id;

    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, text), 0);
    to.input = &in;
    to.agent = "a";
    to.conversation_id = conv;
    assert_int_equal(loom_turn_new(&t, f->sess, &to), 0);
    if (loom_turn_execute(t) != 0)
        fail_msg("turn: %s", loom_error_last());
    assert_non_null(id = strdup(loom_turn_conversation_id(t)));
    loom_turn_free(t);
    loom_messages_free(&in);
    return id;
}

/* The body of the fake's request k. */
static json_t *body(const fixture *f, size_t k)
{
    json_t *r = fake_request(f->fake, k);
    json_t *b = json_incref(json_object_get(r, "body"));

    json_decref(r);
    assert_non_null(b);
    return b;
}

/* How many requests have a body whose compact JSON contains needle. */
static size_t requests_with(const fixture *f, const char *needle)
{
    json_t *all = fake_requests(f->fake), *r;
    size_t i, n = 0;

    json_array_foreach(all, i, r)
    {
        char *s = json_dumps(json_object_get(r, "body"), JSON_COMPACT);
        n += s && strstr(s, needle) != NULL;
        free(s);
    }
    json_decref(all);
    return n;
}

/* The last item of array key of b (borrowed). */
static json_t *last(const json_t *b, const char *key)
{
    const json_t *a = json_object_get(b, key);

    return json_array_get(a, json_array_size(a) - 1);
}

static const char *str_at(const json_t *o, const char *path)
{
    char key[64];
    const char *dot;

    while ((dot = strchr(path, '.')) != NULL) {
        snprintf(key, sizeof(key), "%.*s", (int)(dot - path), path);
        o = key[0] >= '0' && key[0] <= '9'
                ? json_array_get(o, (size_t)atoi(key))
                : json_object_get(o, key);
        path = dot + 1;
    }
    return json_string_value(json_object_get(o, path));
}

/* Where the image is in a request body of each wire format, or NULL. */
static const char *image_in(const char *model, const json_t *b)
{
    if (strcmp(model, "fake/eye") == 0)
        return str_at(last(b, "messages"), "content.1.image_url.url");
    if (strcmp(model, "ant/eye") == 0)
        return str_at(last(b, "messages"), "content.0.content.1.source.data");
    if (strcmp(model, "resp/eye") == 0)
        return str_at(last(b, "input"), "output.1.image_url");
    return str_at(last(b, "contents"), "parts.1.inlineData.data");
}

static void check_vision(const char *model)
{
    const char *want =
        strcmp(model, "fake/eye") == 0 || strcmp(model, "resp/eye") == 0
            ? "data:image/png;base64," PNG_B64
            : PNG_B64;
    fixture f;
    char *conv, *again;
    json_t *b;

    setup(&f, model);
    conv = turn(&f, "show me", NULL);
    assert_int_equal(fake_request_count(f.fake), 2);
    b = body(&f, 1);
    if (!image_in(model, b))
        fail_msg("%s: no image in %s", model,
                 json_dumps(b, JSON_COMPACT | JSON_SORT_KEYS));
    assert_string_equal(image_in(model, b), want);
    json_decref(b);
    /* The tool message is stored with its image: the next turn's
     * request shows it again, and the description once per result. */
    again = turn(&f, "and now?", conv);
    assert_string_equal(again, conv);
    assert_int_equal(fake_request_count(f.fake), 3);
    assert_int_equal(requests_with(&f, PNG_B64), 2);
    free(conv);
    free(again);
    teardown(&f);
}

static void test_openai_chat(void **state)
{
    (void)state;
    check_vision("fake/eye");
}

static void test_anthropic(void **state)
{
    (void)state;
    check_vision("ant/eye");
}

static void test_responses(void **state)
{
    (void)state;
    check_vision("resp/eye");
}

static void test_gemini(void **state)
{
    (void)state;
    check_vision("gem/eye");
}

/* A model without vision reads the description alone. */
static void test_blind(void **state)
{
    fixture f;
    char *conv;

    (void)state;
    setup(&f, "fake/blind");
    conv = turn(&f, "show me", NULL);
    assert_int_equal(fake_request_count(f.fake), 2);
    assert_int_equal(requests_with(&f, SHOWN), 1);
    assert_int_equal(requests_with(&f, PNG_B64), 0);
    free(conv);
    teardown(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_openai_chat), cmocka_unit_test(test_anthropic),
        cmocka_unit_test(test_responses),   cmocka_unit_test(test_gemini),
        cmocka_unit_test(test_blind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
