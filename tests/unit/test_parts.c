/*
 * Tests of content parts (images and files in messages): the loom_part
 * helpers of loom/message.h, the request body of each of the four
 * adapters for a user message with an image by URL, an image as data and
 * a PDF (checked exactly, JSON against JSON), the OpenAI adapter's text
 * body against its JSON body with parts and its cache noticing new parts,
 * and the token estimate that images and files add.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "llm/anthropic.h"
#include "llm/gemini.h"
#include "llm/openai.h"
#include "llm/parts.h"
#include "llm/responses.h"
#include "loom/buf.h"
#include "loom/llm.h"
#include "loom/message.h"
#include "loom/tokenizer.h"

#include <stdlib.h>
#include <string.h>

/* "iVBORw0KGgo=" is the 8-byte PNG signature. */
#define PNG_B64 "iVBORw0KGgo="

/* A user message: text, an image by URL (detail low), an image as data
 * and a PDF as data. */
static void make_messages(loom_messages *m)
{
    loom_part parts[4];

    memset(parts, 0, sizeof(parts));
    parts[0].kind = LOOM_PART_TEXT;
    parts[0].text = "What is in these?";
    parts[1].kind = LOOM_PART_IMAGE;
    parts[1].url = "https://example.com/cat.png?s=1";
    parts[1].detail = "low";
    parts[2].kind = LOOM_PART_IMAGE;
    parts[2].data = PNG_B64;
    parts[2].mime = "image/png";
    parts[3].kind = LOOM_PART_FILE;
    parts[3].data = "JVBERi0=";
    parts[3].mime = "application/pdf";
    parts[3].filename = "a.pdf";
    memset(m, 0, sizeof(*m));
    assert_int_equal(loom_messages_add(m, LOOM_ROLE_SYSTEM, "Be brief."), 0);
    assert_int_equal(loom_messages_add_parts(m, LOOM_ROLE_USER, parts, 4), 0);
}

static void request(loom_llm_request *req, const loom_messages *m)
{
    *req = (loom_llm_request)LOOM_LLM_REQUEST_INIT;
    req->model = "m";
    req->messages = m->items;
    req->messages_len = m->len;
}

static void assert_json(const json_t *got, const char *want)
{
    json_error_t je;
    json_t *w = json_loads(want, 0, &je);
    char *g = json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS);

    assert_non_null(w);
    if (!json_equal(got, w)) {
        char *ws = json_dumps(w, JSON_COMPACT | JSON_SORT_KEYS);
        print_error("got  %s\nwant %s\n", g, ws);
        free(ws);
        fail();
    }
    free(g);
    json_decref(w);
}

static void test_message_parts(void **state)
{
    loom_messages m, copy = {0};
    loom_part text = {.kind = LOOM_PART_TEXT, .text = "only text"};
    loom_part half = {.kind = LOOM_PART_IMAGE, .data = "AAAAAA=="};

    (void)state;
    make_messages(&m);
    /* The text parts become the content; every part is kept in order. */
    assert_string_equal(m.items[1].content, "What is in these?");
    assert_int_equal(m.items[1].parts_len, 4);
    assert_true(loom_message_has_media(&m.items[1]));
    assert_false(loom_message_has_media(&m.items[0]));
    assert_int_equal(loom_messages_append(&copy, &m), 0);
    assert_ptr_not_equal(copy.items[1].parts, m.items[1].parts);
    assert_string_equal(copy.items[1].parts[1].url,
                        "https://example.com/cat.png?s=1");
    assert_string_equal(copy.items[1].parts[3].filename, "a.pdf");
    /* Text alone is a plain message. */
    assert_int_equal(loom_messages_add_parts(&copy, LOOM_ROLE_USER, &text, 1),
                     0);
    assert_string_equal(copy.items[2].content, "only text");
    assert_null(copy.items[2].parts);
    /* Decoded sizes: padding counts. */
    assert_int_equal(loom_part_data_size(&m.items[1].parts[2]), 8);
    assert_int_equal(loom_part_data_size(&half), 4);
    half.data = "AAAAAAA=";
    assert_int_equal(loom_part_data_size(&half), 5);
    half.data = NULL;
    assert_int_equal(loom_part_data_size(&half), 0);
    /* Media types: the part's, else the URL's extension. */
    assert_string_equal(loom__part_mime(&m.items[1].parts[1]), "image/png");
    half.url = "https://x/y.JPG#frag";
    assert_string_equal(loom__part_mime(&half), "image/jpeg");
    half.url = "https://x/y";
    assert_string_equal(loom__part_mime(&half), "image/jpeg");
    half.kind = LOOM_PART_FILE;
    assert_string_equal(loom__part_mime(&half), "application/pdf");
    loom_messages_free(&copy);
    loom_messages_free(&m);
}

static const char openai_user[] =
    "{\"role\":\"user\",\"content\":["
    "{\"type\":\"text\",\"text\":\"What is in these?\"},"
    "{\"type\":\"image_url\",\"image_url\":{\"url\":"
    "\"https://example.com/cat.png?s=1\",\"detail\":\"low\"}},"
    "{\"type\":\"image_url\",\"image_url\":{\"url\":"
    "\"data:image/png;base64," PNG_B64 "\"}},"
    "{\"type\":\"file\",\"file\":{\"filename\":\"a.pdf\",\"file_data\":"
    "\"data:application/pdf;base64,JVBERi0=\"}}]}";

static void test_openai_body(void **state)
{
    loom_llm_request req;
    loom_llm_cache *cache = NULL;
    loom_buf text = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    loom_messages m;
    json_t *body;
    char *dumped;

    (void)state;
    make_messages(&m);
    request(&req, &m);
    assert_int_equal(loom__openai_build_body(&body, &req), 0);
    assert_json(json_array_get(json_object_get(body, "messages"), 1),
                openai_user);
    /* The text the adapter sends is the JSON body, byte for byte. */
    dumped = json_dumps(body, JSON_COMPACT | JSON_REAL_PRECISION(15));
    assert_int_equal(loom__openai_body_text(&text, &req, NULL, NULL), 0);
    assert_string_equal(text.ptr, dumped);
    /* With a cache too, and a message whose parts change is sent anew. */
    assert_int_equal(loom_llm_cache_new(&cache), 0);
    assert_int_equal(loom__openai_body_text(&text, &req, cache, &req), 0);
    assert_string_equal(text.ptr, dumped);
    for (size_t i = 0; i < m.items[1].parts_len; i++)
        loom_part_clear(&m.items[1].parts[i]);
    free(m.items[1].parts);
    m.items[1].parts = NULL;
    m.items[1].parts_len = 0;
    {
        loom_part img = {.kind = LOOM_PART_IMAGE, .url = "https://e/x.gif"};
        loom_messages more = {0};
        assert_int_equal(
            loom_messages_add_parts(&more, LOOM_ROLE_USER, &img, 1), 0);
        loom_message_clear(&m.items[1]);
        m.items[1] = more.items[0];
        free(more.items);
    }
    request(&req, &m);
    assert_int_equal(loom__openai_body_text(&text, &req, cache, &req), 0);
    assert_non_null(strstr(text.ptr, "https://e/x.gif"));
    assert_null(strstr(text.ptr, "cat.png"));
    free(dumped);
    json_decref(body);
    loom_buf_free(&text);
    loom_llm_cache_free(cache);
    loom_messages_free(&m);
}

static void test_responses_body(void **state)
{
    loom_llm_request req;
    loom_messages m;
    json_t *body;

    (void)state;
    make_messages(&m);
    request(&req, &m);
    assert_int_equal(loom__responses_build_body(&body, &req), 0);
    assert_json(json_array_get(json_object_get(body, "input"), 0),
                "{\"type\":\"message\",\"role\":\"user\",\"content\":["
                "{\"type\":\"input_text\",\"text\":\"What is in these?\"},"
                "{\"type\":\"input_image\",\"detail\":\"low\",\"image_url\":"
                "\"https://example.com/cat.png?s=1\"},"
                "{\"type\":\"input_image\",\"detail\":\"auto\",\"image_url\":"
                "\"data:image/png;base64," PNG_B64 "\"},"
                "{\"type\":\"input_file\",\"filename\":\"a.pdf\",\"file_data\":"
                "\"data:application/pdf;base64,JVBERi0=\"}]}");
    json_decref(body);
    loom_messages_free(&m);
}

static void test_anthropic_body(void **state)
{
    loom_llm_request req;
    loom_messages m;
    json_t *body;

    (void)state;
    make_messages(&m);
    request(&req, &m);
    assert_int_equal(loom__anthropic_build_body(&body, &req), 0);
    assert_json(
        json_object_get(body, "messages"),
        "[{\"role\":\"user\",\"content\":["
        "{\"type\":\"text\",\"text\":\"What is in these?\"},"
        "{\"type\":\"image\",\"source\":{\"type\":\"url\",\"url\":"
        "\"https://example.com/cat.png?s=1\"}},"
        "{\"type\":\"image\",\"source\":{\"type\":\"base64\",\"media_type\":"
        "\"image/png\",\"data\":\"" PNG_B64 "\"}},"
        "{\"type\":\"document\",\"source\":{\"type\":\"base64\","
        "\"media_type\":\"application/pdf\",\"data\":\"JVBERi0=\"}}]}]");
    json_decref(body);
    loom_messages_free(&m);
}

static void test_gemini_body(void **state)
{
    loom_llm_request req;
    loom_messages m;
    json_t *body;

    (void)state;
    make_messages(&m);
    request(&req, &m);
    assert_int_equal(loom__gemini_build_body(&body, &req), 0);
    assert_json(json_object_get(body, "contents"),
                "[{\"role\":\"user\",\"parts\":["
                "{\"text\":\"What is in these?\"},"
                "{\"fileData\":{\"mimeType\":\"image/png\",\"fileUri\":"
                "\"https://example.com/cat.png?s=1\"}},"
                "{\"inlineData\":{\"mimeType\":\"image/png\",\"data\":"
                "\"" PNG_B64 "\"}},"
                "{\"inlineData\":{\"mimeType\":\"application/pdf\",\"data\":"
                "\"JVBERi0=\"}}]}]");
    json_decref(body);
    loom_messages_free(&m);
}

/* An empty text part is left out where the API refuses one. */
static void test_empty_text_part(void **state)
{
    loom_part parts[2] = {{.kind = LOOM_PART_TEXT, .text = ""},
                          {.kind = LOOM_PART_IMAGE, .url = "https://e/a.webp"}};
    loom_messages m = {0};
    json_t *a, *g, *o;

    (void)state;
    assert_int_equal(loom_messages_add_parts(&m, LOOM_ROLE_USER, parts, 2), 0);
    a = loom__parts_anthropic(&m.items[0]);
    g = loom__parts_gemini(&m.items[0]);
    o = loom__parts_openai(&m.items[0]);
    assert_int_equal(json_array_size(a), 1);
    assert_int_equal(json_array_size(g), 1);
    assert_int_equal(json_array_size(o), 2);
    assert_json(json_array_get(g, 0), "{\"fileData\":{\"mimeType\":"
                                      "\"image/webp\",\"fileUri\":"
                                      "\"https://e/a.webp\"}}");
    json_decref(a);
    json_decref(g);
    json_decref(o);
    loom_messages_free(&m);
}

/* Images and files add their estimate to a message's count and to a
 * request's. */
static void test_tokens(void **state)
{
    loom_token_counter *c = NULL;
    loom_messages m;
    loom_message plain = {0};
    size_t with, without;

    (void)state;
    make_messages(&m);
    assert_int_equal(loom_token_counter_for_model(&c, "gpt-4o"), 0);
    plain.role = LOOM_ROLE_USER;
    plain.content = m.items[1].content;
    with = loom_token_counter_message(c, &m.items[1]);
    without = loom_token_counter_message(c, &plain);
    /* low detail 85, default 765, a small PDF 1,500. */
    assert_int_equal(with - without, 85 + 765 + 1500);
    assert_int_equal(loom_token_counter_request(c, m.items, m.len, NULL, 0) -
                         loom_token_counter_request(c, m.items, 1, NULL, 0) -
                         loom_token_counter_message(c, &m.items[1]),
                     0);
    loom_token_counter_free(c);
    assert_int_equal(loom_token_counter_for_model(&c, "claude-sonnet-4"), 0);
    with = loom_token_counter_message(c, &m.items[1]);
    without = loom_token_counter_message(c, &plain);
    assert_int_equal(with - without, 1600 + 1600 + 1500);
    loom_token_counter_free(c);
    loom_messages_free(&m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_message_parts),
        cmocka_unit_test(test_openai_body),
        cmocka_unit_test(test_responses_body),
        cmocka_unit_test(test_anthropic_body),
        cmocka_unit_test(test_gemini_body),
        cmocka_unit_test(test_empty_text_part),
        cmocka_unit_test(test_tokens),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
