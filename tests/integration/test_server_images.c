/*
 * Images through the server: a chat request with an image by URL and one
 * as data goes to a model of each provider kind (Chat Completions,
 * Responses, Anthropic, Gemini), all played by one fake upstream, and the
 * fake must receive each image in its provider's shape; a model whose
 * config lacks capabilities.vision gets a 400 and the fake no request;
 * a limit crossed is a 400 before any model call; a chat continued by
 * conversation_id sends the stored image again; the native runs API
 * takes the same parts in its input; for Gemini loom fetches an image
 * given by URL itself, through the SSRF guard (the fake serves the
 * files; an address in a private range is refused).
 */
#include "test_server_harness.h"

#define PNG_B64 "iVBORw0KGgo="

/* The content of chat_body() as a Chat Completions upstream gets it. */
#define CHAT_PARTS                                                             \
    "[{\"type\":\"text\",\"text\":\"what?\"},"                                 \
    "{\"type\":\"image_url\",\"image_url\":{\"url\":"                          \
    "\"https://img.example/cat.png\",\"detail\":\"low\"}},"                    \
    "{\"type\":\"image_url\",\"image_url\":{\"url\":"                          \
    "\"data:image/png;base64," PNG_B64 "\"}}]"

/* One fake behind four providers, one of each kind, each with a model
 * that sees; fake/blind does not. */
static void start(sh *h, const char *script)
{
    static int n;
    char name[64], *yaml = NULL;
    const char *url;

    memset(h, 0, sizeof(*h));
    h->fake = fake_start_script(script);
    assert_non_null(h->fake);
    url = fake_base_url(h->fake);
    snprintf(name, sizeof(name), "images-%d.db", n++);
    h->db = test_tmp_path(name);
    unlink(h->db);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake: {base_url: %s, api_key: k}\n"
                         "  resp: {kind: openai-responses, base_url: %s, "
                         "api_key: k}\n"
                         "  ant: {kind: anthropic, base_url: %s, api_key: k}\n"
                         "  gem: {kind: gemini, base_url: %s, api_key: k}\n"
                         "models:\n"
                         "  fake/eye: {capabilities: {vision: true}}\n"
                         "  fake/blind: {}\n"
                         "  resp/eye: {capabilities: {vision: true}}\n"
                         "  ant/eye: {capabilities: {vision: true}}\n"
                         "  gem/eye: {capabilities: {vision: true}}\n"
                         "agents:\n"
                         "  looker: {model: fake/blind, tools: []}\n"
                         "tools:\n"
                         "  web_fetch: {allow_hosts: ['127.0.0.1:%d']}\n"
                         "server:\n"
                         "  listen: 127.0.0.1:0\n",
                         url, url, url, url, fake_port(h->fake)) > 0);
    sh_start_config(h, yaml);
    free(yaml);
}

/* A chat body for model: a text part, an image by url, one as data. */
static char *chat_body_url(const char *model, const char *url)
{
    char *s = NULL;

    assert_true(asprintf(&s,
                         "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\","
                         "\"content\":[{\"type\":\"text\",\"text\":\"what?\"},"
                         "{\"type\":\"image_url\",\"image_url\":{\"url\":"
                         "\"%s\",\"detail\":\"low\"}},"
                         "{\"type\":\"image_url\",\"image_url\":{\"url\":"
                         "\"data:image/png;base64," PNG_B64 "\"}}]}]}",
                         model, url) > 0);
    return s;
}

/* The same with the image at https://img.example/cat.png. */
static char *chat_body(const char *model)
{
    return chat_body_url(model, "https://img.example/cat.png");
}

/* The URL of the fake's file name (GET /_fake/files/<name>). */
static char *file_url(const sh *h, const char *name)
{
    char *s = NULL;

    assert_true(asprintf(&s, "http://127.0.0.1:%d/_fake/files/%s",
                         fake_port(h->fake), name) > 0);
    return s;
}

static void assert_json_is(const json_t *got, const char *want)
{
    json_t *w = json_loads(want, 0, NULL);

    assert_non_null(w);
    if (!json_equal(got, w)) {
        char *g = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS);
        fail_msg("got %s\nwant %s", g, want);
    }
    json_decref(w);
}

static void test_each_provider_gets_the_images(void **state)
{
    static const char *const models[] = {"fake/eye", "resp/eye", "ant/eye",
                                         "gem/eye"};
    json_t *resp, *reqs, *body;
    sh h;

    (void)state;
    start(&h, "{\"responses\":[{\"text\":[\"a cat\"]},{\"text\":[\"a cat\"]},"
              "{\"text\":[\"a cat\"]},{\"text\":[\"a cat\"]},"
              "{\"text\":[\"a gif\"]}]}");
    for (size_t i = 0; i < 4; i++) {
        /* loom fetches Gemini's image itself: one it can reach. */
        char *u = file_url(&h, "cat.png");
        char *b = i == 3 ? chat_body_url(models[i], u) : chat_body(models[i]);
        free(u);
        resp = sh_json(&h, "POST", "/v1/chat/completions", b, 200);
        assert_string_equal(
            sh_str(json_object_get(
                       json_array_get(json_object_get(resp, "choices"), 0),
                       "message"),
                   "content"),
            "a cat");
        json_decref(resp);
        free(b);
    }
    /* An image alone, no text: stored and answered all the same. */
    resp = sh_json(&h, "POST", "/v1/chat/completions",
                   "{\"model\":\"fake/eye\",\"messages\":[{\"role\":"
                   "\"user\",\"content\":[{\"type\":\"image_url\","
                   "\"image_url\":{\"url\":\"https://img.example/a.gif\"}}]}]}",
                   200);
    json_decref(resp);
    reqs = fake_requests(h.fake);
    assert_int_equal(json_array_size(reqs), 5);
    body = json_object_get(json_array_get(reqs, 4), "body");
    assert_json_is(
        json_object_get(json_array_get(json_object_get(body, "messages"), 0),
                        "content"),
        "[{\"type\":\"image_url\",\"image_url\":{\"url\":"
        "\"https://img.example/a.gif\"}}]");
    body = json_object_get(json_array_get(reqs, 0), "body");
    assert_json_is(
        json_object_get(json_array_get(json_object_get(body, "messages"), 0),
                        "content"),
        CHAT_PARTS);
    body = json_object_get(json_array_get(reqs, 1), "body");
    assert_json_is(
        json_object_get(json_array_get(json_object_get(body, "input"), 0),
                        "content"),
        "[{\"type\":\"input_text\",\"text\":\"what?\"},"
        "{\"type\":\"input_image\",\"detail\":\"low\",\"image_url\":"
        "\"https://img.example/cat.png\"},"
        "{\"type\":\"input_image\",\"detail\":\"auto\",\"image_url\":"
        "\"data:image/png;base64," PNG_B64 "\"}]");
    body = json_object_get(json_array_get(reqs, 2), "body");
    assert_json_is(
        json_object_get(json_array_get(json_object_get(body, "messages"), 0),
                        "content"),
        "[{\"type\":\"text\",\"text\":\"what?\"},"
        "{\"type\":\"image\",\"source\":{\"type\":\"url\",\"url\":"
        "\"https://img.example/cat.png\"}},"
        "{\"type\":\"image\",\"source\":{\"type\":\"base64\","
        "\"media_type\":\"image/png\",\"data\":\"" PNG_B64 "\"}}]");
    body = json_object_get(json_array_get(reqs, 3), "body");
    assert_json_is(
        json_object_get(json_array_get(json_object_get(body, "contents"), 0),
                        "parts"),
        "[{\"text\":\"what?\"},"
        "{\"inlineData\":{\"mimeType\":\"image/png\",\"data\":\"" PNG_B64
        "\"}},"
        "{\"inlineData\":{\"mimeType\":\"image/png\",\"data\":\"" PNG_B64
        "\"}}]");
    json_decref(reqs);
    sh_free(&h);
}

static void test_refused_before_any_model_call(void **state)
{
    json_t *resp, *err, *reqs;
    char *b;
    sh h;

    (void)state;
    start(&h, "{\"responses\":[]}");
    /* A model without vision; an agent whose model has none. */
    b = chat_body("fake/blind");
    resp = sh_json(&h, "POST", "/v1/chat/completions", b, 400);
    err = json_object_get(resp, "error");
    assert_string_equal(sh_str(err, "code"), "model_not_vision");
    assert_string_equal(sh_str(err, "param"), "messages[0].content");
    assert_non_null(strstr(sh_str(err, "message"), "fake/blind"));
    assert_non_null(strstr(sh_str(err, "message"), "capabilities.vision"));
    json_decref(resp);
    free(b);
    b = chat_body("agent/looker");
    resp = sh_json(&h, "POST", "/v1/chat/completions", b, 400);
    assert_string_equal(sh_str(json_object_get(resp, "error"), "code"),
                        "model_not_vision");
    json_decref(resp);
    free(b);
    /* A model that sees, but a part crossing a limit. */
    resp = sh_json(&h, "POST", "/v1/chat/completions",
                   "{\"model\":\"fake/eye\",\"messages\":[{\"role\":\"user\","
                   "\"content\":[{\"type\":\"image_url\",\"image_url\":"
                   "{\"url\":\"data:image/bmp;base64,AAAA\"}}]}]}",
                   400);
    assert_string_equal(sh_str(json_object_get(resp, "error"), "param"),
                        "messages[0].content[0].image_url.url");
    json_decref(resp);
    /* None of them reached the upstream. */
    reqs = fake_requests(h.fake);
    assert_int_equal(json_array_size(reqs), 0);
    json_decref(reqs);
    sh_free(&h);
}

/* A chat with an image, continued by conversation_id: the stored image
 * goes to the model again with the history, and the conversation shows
 * it by hash and size, without its bytes. */
static void test_continued_chat_sends_the_image_again(void **state)
{
    json_t *resp, *reqs, *body, *parts;
    char *b, *path, *conv;
    sh h;

    (void)state;
    start(&h, "{\"responses\":[{\"text\":[\"a cat\"]},"
              "{\"text\":[\"still a cat\"]}]}");
    b = chat_body("fake/eye");
    resp = sh_json(&h, "POST", "/v1/chat/completions", b, 200);
    free(b);
    conv = strdup(sh_str(resp, "conversation_id"));
    assert_non_null(conv);
    json_decref(resp);
    assert_true(asprintf(&b,
                         "{\"model\":\"fake/eye\",\"conversation_id\":"
                         "\"%s\",\"messages\":[{\"role\":\"user\","
                         "\"content\":\"and now?\"}]}",
                         conv) > 0);
    resp = sh_json(&h, "POST", "/v1/chat/completions", b, 200);
    free(b);
    json_decref(resp);
    reqs = fake_requests(h.fake);
    assert_int_equal(json_array_size(reqs), 2);
    body = json_object_get(json_array_get(reqs, 1), "body");
    assert_int_equal(json_array_size(json_object_get(body, "messages")), 3);
    assert_json_is(
        json_object_get(json_array_get(json_object_get(body, "messages"), 0),
                        "content"),
        CHAT_PARTS);
    json_decref(reqs);

    assert_true(asprintf(&path, "/v1/conversations/%s", conv) > 0);
    resp = sh_json(&h, "GET", path, NULL, 200);
    parts = json_object_get(
        json_array_get(json_object_get(resp, "messages"), 0), "parts");
    assert_json_is(
        parts,
        "[{\"type\":\"text\",\"text\":\"what?\"},"
        "{\"type\":\"image\",\"url\":\"https://img.example/cat.png\","
        "\"detail\":\"low\"},"
        "{\"type\":\"image\",\"mime\":\"image/png\",\"hash\":"
        "\"4c4b6a3be1314ab86138bef4314dde022e600960d8689a2c8f8631802d20dab6\","
        "\"bytes\":8}]");
    json_decref(resp);
    free(path);
    free(conv);
    sh_free(&h);
}

/* The native runs API takes the same parts in `input`, with the same
 * checks; a part's param names it inside `input`. */
static void test_runs_input_takes_parts(void **state)
{
    json_t *resp, *err, *reqs, *body;
    sh h;

    (void)state;
    start(&h, "{\"responses\":[{\"text\":[\"a cat\"]}]}");
    resp = sh_json(&h, "POST", "/v1/runs",
                   "{\"model\":\"fake/eye\",\"input\":[{\"role\":"
                   "\"user\",\"content\":[{\"type\":\"text\",\"text\":"
                   "\"what?\"},{\"type\":\"image_url\",\"image_url\":"
                   "{\"url\":\"https://img.example/cat.png\",\"detail\":"
                   "\"low\"}},{\"type\":\"image_url\",\"image_url\":"
                   "{\"url\":\"data:image/png;base64," PNG_B64 "\"}}]}]}",
                   200);
    assert_string_equal(sh_str(resp, "status"), "completed");
    json_decref(resp);
    /* A blind model; a bad part; an image in a system message. */
    resp = sh_json(&h, "POST", "/v1/runs",
                   "{\"model\":\"fake/blind\",\"input\":[{\"role\":"
                   "\"user\",\"content\":\"hi\"},{\"role\":\"user\","
                   "\"content\":[{\"type\":\"image_url\",\"image_url\":"
                   "\"https://img.example/cat.png\"}]}]}",
                   400);
    err = json_object_get(resp, "error");
    assert_string_equal(sh_str(err, "code"), "model_not_vision");
    assert_string_equal(sh_str(err, "param"), "input[1].content");
    json_decref(resp);
    resp = sh_json(&h, "POST", "/v1/runs",
                   "{\"model\":\"fake/eye\",\"input\":[{\"role\":"
                   "\"user\",\"content\":[{\"type\":\"text\",\"text\":"
                   "\"x\"},{\"type\":\"image_url\",\"image_url\":{"
                   "\"url\":\"data:image/bmp;base64,AAAA\"}}]}]}",
                   400);
    assert_string_equal(sh_str(json_object_get(resp, "error"), "param"),
                        "input[0].content[1].image_url.url");
    json_decref(resp);
    resp = sh_json(&h, "POST", "/v1/runs",
                   "{\"model\":\"fake/eye\",\"input\":[{\"role\":"
                   "\"system\",\"content\":[{\"type\":\"image_url\","
                   "\"image_url\":\"https://img.example/cat.png\"}]}]}",
                   400);
    assert_string_equal(sh_str(json_object_get(resp, "error"), "param"),
                        "input[0].content[0].type");
    json_decref(resp);
    reqs = fake_requests(h.fake);
    assert_int_equal(json_array_size(reqs), 1);
    body = json_object_get(json_array_get(reqs, 0), "body");
    assert_json_is(
        json_object_get(json_array_get(json_object_get(body, "messages"), 0),
                        "content"),
        CHAT_PARTS);
    json_decref(reqs);
    sh_free(&h);
}

/* Posts a chat for gem/eye with the image at url, which loom must refuse
 * (400) or fail to fetch (502), naming the URL; want is in the message. */
static void gemini_fetch_fails(const sh *h, const char *url, int status,
                               const char *code, const char *want)
{
    char *b = chat_body_url("gem/eye", url);
    json_t *resp = sh_json(h, "POST", "/v1/chat/completions", b, status);
    const json_t *err = json_object_get(resp, "error");

    assert_string_equal(sh_str(err, "code"), code);
    if (!strstr(sh_str(err, "message"), url) ||
        !strstr(sh_str(err, "message"), want))
        fail_msg("message '%s' should name %s and say '%s'",
                 sh_str(err, "message"), url, want);
    json_decref(resp);
    free(b);
}

/* For Gemini loom fetches an image given by URL itself, through the SSRF
 * guard of web_fetch, and sends its bytes; what it refuses is a 400 and a
 * fetch that fails a 502, both naming the URL, before any model call. */
static void test_gemini_gets_fetched_images(void **state)
{
    json_t *resp, *reqs, *parts;
    char *u, *b;
    sh h;

    (void)state;
    start(&h, "{\"responses\":[{\"text\":[\"a cat\"]}]}");
    /* Redirects are followed, each hop checked. */
    u = file_url(&h, "redirect.png");
    b = chat_body_url("gem/eye", u);
    resp = sh_json(&h, "POST", "/v1/chat/completions", b, 200);
    json_decref(resp);
    free(b);
    free(u);
    reqs = fake_requests(h.fake);
    assert_int_equal(json_array_size(reqs), 1);
    parts = json_object_get(
        json_array_get(
            json_object_get(json_object_get(json_array_get(reqs, 0), "body"),
                            "contents"),
            0),
        "parts");
    assert_json_is(json_array_get(parts, 1),
                   "{\"inlineData\":{\"mimeType\":\"image/png\",\"data\":"
                   "\"" PNG_B64 "\"}}");
    json_decref(reqs);

    /* A private address, directly or by a redirect, is never reached. */
    gemini_fetch_fails(&h, "http://10.1.2.3/cat.png", 400, "image_url_refused",
                       "10.0.0.0/8");
    u = file_url(&h, "private.png");
    gemini_fetch_fails(&h, u, 400, "image_url_refused", "10.0.0.1");
    free(u);
    /* Loopback (only the fake's port is allowlisted); a port not allowed. */
    gemini_fetch_fails(&h, "http://127.0.0.1/cat.png", 400, "image_url_refused",
                       "127.0.0.0/8");
    gemini_fetch_fails(&h, "http://127.0.0.1:9/cat.png", 400,
                       "image_url_refused", "port 9 is not allowed");
    /* Not an image; not there. */
    u = file_url(&h, "page.html");
    gemini_fetch_fails(&h, u, 400, "image_url_refused", "text/html");
    free(u);
    u = file_url(&h, "missing.png");
    gemini_fetch_fails(&h, u, 502, "image_fetch_failed", "HTTP 404");
    free(u);
    /* None of them reached the model. */
    reqs = fake_requests(h.fake);
    assert_int_equal(json_array_size(reqs), 1);
    json_decref(reqs);
    sh_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_provider_gets_the_images),
        cmocka_unit_test(test_refused_before_any_model_call),
        cmocka_unit_test(test_continued_chat_sends_the_image_again),
        cmocka_unit_test(test_runs_input_takes_parts),
        cmocka_unit_test(test_gemini_gets_fetched_images),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
