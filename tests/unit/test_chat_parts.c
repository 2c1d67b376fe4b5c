/*
 * Tests of the content parts of chat requests (server/chat_parts.c
 * through loom__chat_request_parse): images by URL and as data, PDF
 * files, text parts beside them; every malformed part a 400 naming it;
 * each limit (images per request, bytes per image, bytes per request)
 * just kept and just crossed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "server/chat_parts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* {"model": "m", "messages": [{"role": role, "content": parts}]}, parts
 * stolen. */
static json_t *body_of(const char *role, json_t *parts)
{
    return json_pack("{s:s,s:[{s:s,s:o}]}", "model", "m", "messages", "role",
                     role, "content", parts);
}

static json_t *image(const char *url)
{
    return json_pack("{s:s,s:{s:s}}", "type", "image_url", "image_url", "url",
                     url);
}

/* An image part whose data URL holds n base64 'A's (n / 4 * 3 bytes). */
static json_t *image_of_size(size_t n)
{
    static const char prefix[] = "data:image/png;base64,";
    char *url = malloc(sizeof(prefix) + n);
    json_t *v;

    assert_non_null(url);
    memcpy(url, prefix, sizeof(prefix) - 1);
    memset(url + sizeof(prefix) - 1, 'A', n);
    url[sizeof(prefix) - 1 + n] = '\0';
    v = image(url);
    free(url);
    return v;
}

/* Parses body (stolen); on success req holds the request. */
static int parse_body(loom__chat_request *req, loom__chat_error *err,
                      json_t *body)
{
    int rc;

    assert_non_null(body);
    rc = loom__chat_request_parse(req, body, err);
    json_decref(body);
    return rc;
}

/* Expects body (stolen) to be a 400 naming param with code. */
static void refused(json_t *body, const char *param, const char *code)
{
    loom__chat_request req;
    loom__chat_error err;

    assert_int_equal(parse_body(&req, &err, body), LOOM_EINVALID);
    assert_int_equal(err.status, 400);
    assert_non_null(err.param);
    if (strcmp(err.param, param) != 0 || strcmp(err.code, code) != 0)
        fail_msg("got %s %s (%s), want %s %s", err.param, err.code, err.message,
                 param, code);
    assert_null(req.messages.items);
    loom__chat_error_clear(&err);
}

static void test_good_parts(void **state)
{
    loom__chat_request req;
    loom__chat_error err;
    const loom_message *m;
    json_t *parts = json_loads(
        "[{\"type\":\"text\",\"text\":\"look\"},"
        "{\"type\":\"image_url\",\"image_url\":{\"url\":"
        "\"https://e.com/a.png\",\"detail\":\"high\"}},"
        "{\"type\":\"image_url\",\"image_url\":"
        "\"data:image/jpeg;base64,/9j/4A==\"},"
        "{\"type\":\"text\",\"text\":\"and read\"},"
        "{\"type\":\"file\",\"file\":{\"filename\":\"r.pdf\",\"file_data\":"
        "\"data:application/pdf;base64,JVBERi0=\"}}]",
        0, NULL);

    (void)state;
    assert_int_equal(parse_body(&req, &err, body_of("user", parts)), 0);
    assert_int_equal(req.messages.len, 1);
    m = &req.messages.items[0];
    assert_string_equal(m->content, "look\nand read");
    assert_int_equal(m->parts_len, 5);
    assert_int_equal(m->parts[1].kind, LOOM_PART_IMAGE);
    assert_string_equal(m->parts[1].url, "https://e.com/a.png");
    assert_string_equal(m->parts[1].detail, "high");
    assert_null(m->parts[1].data);
    assert_string_equal(m->parts[2].mime, "image/jpeg");
    assert_string_equal(m->parts[2].data, "/9j/4A==");
    assert_null(m->parts[2].url);
    assert_int_equal(m->parts[4].kind, LOOM_PART_FILE);
    assert_string_equal(m->parts[4].filename, "r.pdf");
    assert_string_equal(m->parts[4].mime, "application/pdf");
    assert_string_equal(m->parts[4].data, "JVBERi0=");
    loom__chat_request_clear(&req);

    /* Text parts alone stay one plain string. */
    parts = json_loads("[{\"type\":\"text\",\"text\":\"a\"},"
                       "{\"type\":\"text\",\"text\":\"b\"}]",
                       0, NULL);
    assert_int_equal(parse_body(&req, &err, body_of("user", parts)), 0);
    assert_string_equal(req.messages.items[0].content, "a\nb");
    assert_null(req.messages.items[0].parts);
    loom__chat_request_clear(&req);
}

static void test_bad_parts(void **state)
{
    static const struct {
        const char *part, *param, *code;
    } cases[] = {
        {"{\"type\":\"image_url\"}", "messages[0].content[0].image_url",
         "missing_required_parameter"},
        {"{\"type\":\"image_url\",\"image_url\":5}",
         "messages[0].content[0].image_url", "invalid_type"},
        {"{\"type\":\"image_url\",\"image_url\":{}}",
         "messages[0].content[0].image_url.url", "missing_required_parameter"},
        {"{\"type\":\"image_url\",\"image_url\":{\"url\":\"ftp://x/a.png\"}}",
         "messages[0].content[0].image_url.url", "invalid_value"},
        {"{\"type\":\"image_url\",\"image_url\":{\"url\":\"https://x\","
         "\"detail\":\"max\"}}",
         "messages[0].content[0].image_url.detail", "invalid_value"},
        {"{\"type\":\"image_url\",\"image_url\":{\"url\":"
         "\"data:image/png,AAAA\"}}",
         "messages[0].content[0].image_url.url", "invalid_value"},
        {"{\"type\":\"image_url\",\"image_url\":{\"url\":"
         "\"data:;base64,AAAA\"}}",
         "messages[0].content[0].image_url.url", "unsupported_value"},
        {"{\"type\":\"image_url\",\"image_url\":{\"url\":"
         "\"data:image/tiff;base64,AAAA\"}}",
         "messages[0].content[0].image_url.url", "unsupported_value"},
        {"{\"type\":\"image_url\",\"image_url\":{\"url\":"
         "\"data:image/png;base64,AA!A\"}}",
         "messages[0].content[0].image_url.url", "invalid_value"},
        {"{\"type\":\"image_url\",\"image_url\":{\"url\":"
         "\"data:image/png;base64,AAA\"}}",
         "messages[0].content[0].image_url.url", "invalid_value"},
        {"{\"type\":\"image_url\",\"image_url\":{\"url\":"
         "\"data:image/png;base64,\"}}",
         "messages[0].content[0].image_url.url", "invalid_value"},
        {"{\"type\":\"file\",\"file\":{\"file_id\":\"file-1\"}}",
         "messages[0].content[0].file.file_id", "unsupported_parameter"},
        {"{\"type\":\"file\",\"file\":{\"filename\":\"a.pdf\"}}",
         "messages[0].content[0].file.file_data", "missing_required_parameter"},
        {"{\"type\":\"file\",\"file\":{\"file_data\":\"https://x/a.pdf\"}}",
         "messages[0].content[0].file.file_data", "invalid_value"},
        {"{\"type\":\"file\",\"file\":{\"file_data\":"
         "\"data:image/png;base64,AAAA\"}}",
         "messages[0].content[0].file.file_data", "unsupported_value"},
        {"{\"type\":\"file\",\"file\":{\"filename\":5,\"file_data\":"
         "\"data:application/pdf;base64,AAAA\"}}",
         "messages[0].content[0].file.filename", "invalid_type"},
        {"{\"type\":\"input_audio\",\"input_audio\":{}}",
         "messages[0].content[0].type", "unsupported_value"},
    };
    char *long_url;

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        refused(body_of("user",
                        json_pack("[o]", json_loads(cases[i].part, 0, NULL))),
                cases[i].param, cases[i].code);
    /* Images only from the user. */
    refused(body_of("system", json_pack("[o]", image("https://x/a.png"))),
            "messages[0].content[0].type", "unsupported_value");
    refused(body_of("assistant", json_pack("[o]", image("https://x/a.png"))),
            "messages[0].content[0].type", "unsupported_value");
    /* A URL past the longest. */
    long_url = malloc(LOOM__CHAT_MAX_MEDIA_URL + 2);
    assert_non_null(long_url);
    memset(long_url, 'a', LOOM__CHAT_MAX_MEDIA_URL + 1);
    memcpy(long_url, "https://", 8);
    long_url[LOOM__CHAT_MAX_MEDIA_URL + 1] = '\0';
    refused(body_of("user", json_pack("[o]", image(long_url))),
            "messages[0].content[0].image_url.url", "string_above_max_length");
    free(long_url);
}

static void test_count_limit(void **state)
{
    loom__chat_request req;
    loom__chat_error err;
    json_t *a = json_array(), *b = json_array();

    (void)state;
    for (int i = 0; i < LOOM__CHAT_MAX_MEDIA / 2; i++)
        json_array_append_new(a, image("https://x/a.png"));
    for (int i = 0; i < LOOM__CHAT_MAX_MEDIA / 2; i++)
        json_array_append_new(b, image("https://x/b.png"));
    /* The most, over two messages, is accepted. */
    assert_int_equal(
        parse_body(&req, &err,
                   json_pack("{s:s,s:[{s:s,s:O},{s:s,s:O}]}", "model", "m",
                             "messages", "role", "user", "content", a, "role",
                             "user", "content", b)),
        0);
    loom__chat_request_clear(&req);
    /* One more is not; the error names it. */
    json_array_append_new(b, image("https://x/c.png"));
    refused(json_pack("{s:s,s:[{s:s,s:o},{s:s,s:o}]}", "model", "m", "messages",
                      "role", "user", "content", a, "role", "user", "content",
                      b),
            "messages[1].content[16]", "too_many_images");
}

static void test_size_limits(void **state)
{
    /* Base64 characters for the most bytes one image may hold, rounded
     * down to whole groups of 4 (3 bytes). */
    size_t most = LOOM__CHAT_MAX_MEDIA_BYTES / 3 * 4;
    loom__chat_request req;
    loom__chat_error err;

    (void)state;
    assert_int_equal(
        parse_body(&req, &err,
                   body_of("user", json_pack("[o]", image_of_size(most)))),
        0);
    assert_true(loom_part_data_size(&req.messages.items[0].parts[0]) <=
                LOOM__CHAT_MAX_MEDIA_BYTES);
    loom__chat_request_clear(&req);
    refused(body_of("user", json_pack("[o]", image_of_size(most + 4))),
            "messages[0].content[0]", "image_too_large");
    /* Three images each under the limit, together over the total. */
    refused(
        body_of("user", json_pack("[ooo]", image_of_size(most),
                                  image_of_size(most), image_of_size(most))),
        "messages[0].content[2]", "images_too_large");
    /* Two of them fit. */
    assert_int_equal(
        parse_body(&req, &err,
                   body_of("user", json_pack("[oo]", image_of_size(most),
                                             image_of_size(most)))),
        0);
    loom__chat_request_clear(&req);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_parts),
        cmocka_unit_test(test_bad_parts),
        cmocka_unit_test(test_count_limit),
        cmocka_unit_test(test_size_limits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
