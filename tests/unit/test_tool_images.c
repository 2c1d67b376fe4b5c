/*
 * Tests of the images a tool gives with its result (loom_tool_ctx.images)
 * for a model that sees: the run's checks of them (tool_images.h: base64
 * data, an image/ type, the count and size limits) and where each of the
 * four adapters puts them in the request body (Anthropic: image blocks
 * in the tool_result; Responses: input_image in the function_call_output;
 * Gemini: inlineData beside the functionResponse; Chat Completions: a
 * user message after the turn's last result, which the adapter's request
 * cache moves when another result joins the turn).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "agent/tool_images.h"
#include "llm/anthropic.h"
#include "llm/gemini.h"
#include "llm/openai.h"
#include "llm/responses.h"
#include "loom/buf.h"
#include "loom/llm.h"
#include "loom/message.h"
#include "loom/tools.h"

#include <stdlib.h>
#include <string.h>

/* The 8-byte PNG signature. */
#define PNG_B64 "iVBORw0KGgo="
#define SHOWN "[image: image/png, about 8 bytes]"

static void assert_json(const json_t *got, const char *want)
{
    json_error_t je;
    json_t *w = json_loads(want, 0, &je);

    if (!w)
        fail_msg("bad expected JSON: %s", je.text);
    if (!json_equal(got, w)) {
        char *g = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS);
        char *ws = json_dumps(w, JSON_COMPACT | JSON_SORT_KEYS);
        print_error("got  %s\nwant %s\n", g, ws);
        free(g);
        free(ws);
        fail();
    }
    json_decref(w);
}

/* A user's question, an assistant turn calling shot (c1) and echo (c2),
 * the result of c1 with an image and, with both, that of c2. */
static void make_turn(loom_messages *m, int both)
{
    loom_tool_call calls[2] = {{"c1", "shot", "{}"}, {"c2", "echo", "{}"}};
    loom_part img = {
        .kind = LOOM_PART_IMAGE, .data = PNG_B64, .mime = "image/png"};
    loom_message *r;

    memset(m, 0, sizeof(*m));
    assert_int_equal(loom_messages_add(m, LOOM_ROLE_USER, "look"), 0);
    assert_int_equal(loom_messages_add_assistant(m, NULL, NULL, calls, 2), 0);
    assert_int_equal(loom_messages_add_tool_result(m, "c1", "shot", SHOWN), 0);
    r = &m->items[m->len - 1];
    assert_non_null(r->parts = calloc(1, sizeof(*r->parts)));
    assert_int_equal(loom_part_copy(&r->parts[0], &img), 0);
    r->parts_len = 1;
    if (both)
        assert_int_equal(loom_messages_add_tool_result(m, "c2", "echo", "ok"),
                         0);
}

static void request(loom_llm_request *req, const loom_messages *m)
{
    *req = (loom_llm_request)LOOM_LLM_REQUEST_INIT;
    req->model = "m";
    req->messages = m->items;
    req->messages_len = m->len;
}

/* ---- the run's checks -------------------------------------------------- */

static json_t *image(const char *data, const char *mime)
{
    return json_pack("{s:s,s:s}", "data", data, "mime", mime);
}

static void test_checks(void **state)
{
    json_t *imgs = json_array();
    loom_part *parts = NULL;
    size_t n = 0, dropped = 0;
    char *big;
    size_t big_len = ((size_t)LOOM_TOOL_IMAGE_MAX_BYTES / 3 + 1) * 4;

    (void)state;
    assert_int_equal(loom__tool_images_parts(NULL, &parts, &n, &dropped), 0);
    assert_null(parts);
    assert_int_equal(n, 0);
    /* Left out: not base64, not an image type, a bad type, no data, too
     * big; the others kept in order, at most LOOM_TOOL_IMAGES_MAX. */
    assert_non_null(big = malloc(big_len + 1));
    memset(big, 'A', big_len);
    big[big_len] = '\0';
    json_array_append_new(imgs, image("not base64!", "image/png"));
    json_array_append_new(imgs, image(PNG_B64, "text/plain"));
    json_array_append_new(imgs, image(PNG_B64, "image/svg+xml"));
    json_array_append_new(imgs, json_pack("{s:s}", "mime", "image/png"));
    json_array_append_new(imgs, image(big, "image/png"));
    for (int i = 0; i < LOOM_TOOL_IMAGES_MAX + 1; i++)
        json_array_append_new(imgs, image(i ? PNG_B64 : "AAAA", "image/gif"));
    assert_int_equal(loom__tool_images_parts(imgs, &parts, &n, &dropped), 0);
    assert_int_equal(n, LOOM_TOOL_IMAGES_MAX);
    assert_int_equal(dropped, 6);
    assert_int_equal(parts[0].kind, LOOM_PART_IMAGE);
    assert_string_equal(parts[0].data, "AAAA");
    assert_string_equal(parts[1].data, PNG_B64);
    assert_string_equal(parts[1].mime, "image/gif");
    for (size_t i = 0; i < n; i++)
        loom_part_clear(&parts[i]);
    free(parts);
    /* Only bad ones: none. */
    json_array_clear(imgs);
    json_array_append_new(imgs, image("A===", "image/png"));
    assert_int_equal(loom__tool_images_parts(imgs, &parts, &n, &dropped), 0);
    assert_null(parts);
    assert_int_equal(dropped, 1);
    free(big);
    json_decref(imgs);
}

/* ---- the adapters ------------------------------------------------------ */

static void test_anthropic(void **state)
{
    loom_llm_request req;
    loom_messages m;
    json_t *body;

    (void)state;
    make_turn(&m, 1);
    request(&req, &m);
    assert_int_equal(loom__anthropic_build_body(&body, &req), 0);
    assert_json(json_array_get(json_object_get(body, "messages"), 2),
                "{\"role\":\"user\",\"content\":["
                "{\"type\":\"tool_result\",\"tool_use_id\":\"c1\",\"content\":["
                "{\"type\":\"text\",\"text\":\"" SHOWN "\"},"
                "{\"type\":\"image\",\"source\":{\"type\":\"base64\","
                "\"media_type\":\"image/png\",\"data\":\"" PNG_B64 "\"}}]},"
                "{\"type\":\"tool_result\",\"tool_use_id\":\"c2\","
                "\"content\":\"ok\"}]}");
    json_decref(body);
    loom_messages_free(&m);
}

static void test_responses(void **state)
{
    loom_llm_request req;
    loom_messages m;
    json_t *body, *input;

    (void)state;
    make_turn(&m, 1);
    request(&req, &m);
    assert_int_equal(loom__responses_build_body(&body, &req), 0);
    input = json_object_get(body, "input");
    assert_json(json_array_get(input, json_array_size(input) - 2),
                "{\"type\":\"function_call_output\",\"call_id\":\"c1\","
                "\"output\":[{\"type\":\"input_text\",\"text\":\"" SHOWN
                "\"},{\"type\":\"input_image\",\"detail\":\"auto\","
                "\"image_url\":\"data:image/png;base64," PNG_B64 "\"}]}");
    assert_json(json_array_get(input, json_array_size(input) - 1),
                "{\"type\":\"function_call_output\",\"call_id\":\"c2\","
                "\"output\":\"ok\"}");
    json_decref(body);
    loom_messages_free(&m);
}

static void test_gemini(void **state)
{
    loom_llm_request req;
    loom_messages m;
    json_t *body;

    (void)state;
    make_turn(&m, 1);
    request(&req, &m);
    assert_int_equal(loom__gemini_build_body(&body, &req), 0);
    assert_json(
        json_array_get(json_object_get(body, "contents"), 2),
        "{\"role\":\"user\",\"parts\":["
        "{\"functionResponse\":{\"name\":\"shot\",\"response\":"
        "{\"result\":\"" SHOWN "\"}}},"
        "{\"inlineData\":{\"mimeType\":\"image/png\",\"data\":\"" PNG_B64
        "\"}},"
        "{\"functionResponse\":{\"name\":\"echo\",\"response\":"
        "{\"result\":\"ok\"}}}]}");
    json_decref(body);
    loom_messages_free(&m);
}

static const char openai_images[] =
    "{\"role\":\"user\",\"content\":["
    "{\"type\":\"text\",\"text\":\"The images that tool call c1 (shot) gave "
    "with its result:\"},"
    "{\"type\":\"image_url\",\"image_url\":{\"url\":"
    "\"data:image/png;base64," PNG_B64 "\"}}]}";

/* The text body with and without cache is the JSON body's dump. */
static void assert_openai_text(const loom_llm_request *req,
                               loom_llm_cache *cache, json_t **body_out)
{
    loom_buf text = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    json_t *body;
    char *dumped;

    assert_int_equal(loom__openai_build_body(&body, req), 0);
    dumped = json_dumps(body, JSON_COMPACT | JSON_REAL_PRECISION(15));
    assert_int_equal(loom__openai_body_text(&text, req, NULL, NULL), 0);
    assert_string_equal(text.ptr, dumped);
    assert_int_equal(loom__openai_body_text(&text, req, cache, cache), 0);
    assert_string_equal(text.ptr, dumped);
    free(dumped);
    loom_buf_free(&text);
    *body_out = body;
}

static void test_openai(void **state)
{
    loom_llm_request req;
    loom_llm_cache *cache = NULL;
    loom_messages one, both;
    json_t *body, *msgs;

    (void)state;
    assert_int_equal(loom_llm_cache_new(&cache), 0);
    /* One result: the images follow it. */
    make_turn(&one, 0);
    request(&req, &one);
    assert_openai_text(&req, cache, &body);
    msgs = json_object_get(body, "messages");
    assert_int_equal(json_array_size(msgs), 4);
    assert_json(
        json_array_get(msgs, 2),
        "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"" SHOWN
        "\"}");
    assert_json(json_array_get(msgs, 3), openai_images);
    json_decref(body);
    /* A second result joins the turn: the images move after it, also
     * through the cache that held the first request. */
    make_turn(&both, 1);
    for (size_t i = 0; i < 3; i++) {
        loom_message t = both.items[i];
        both.items[i] = one.items[i];
        one.items[i] = t;
    }
    request(&req, &both);
    assert_openai_text(&req, cache, &body);
    msgs = json_object_get(body, "messages");
    assert_int_equal(json_array_size(msgs), 5);
    assert_string_equal(json_string_value(json_object_get(
                            json_array_get(msgs, 3), "tool_call_id")),
                        "c2");
    assert_json(json_array_get(msgs, 4), openai_images);
    json_decref(body);
    loom_llm_cache_free(cache);
    loom_messages_free(&one);
    loom_messages_free(&both);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checks),    cmocka_unit_test(test_anthropic),
        cmocka_unit_test(test_responses), cmocka_unit_test(test_gemini),
        cmocka_unit_test(test_openai),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
