/*
 * Unit tests of images and files kept with stored messages (schema
 * version 7): a message's parts saved and read back (loom_store_load_history
 * gives the bytes back as base64; loom_store_conversation_get shows the
 * hash and size, never the bytes), the bytes of an image stored once under
 * their SHA-256 however many messages and conversations hold it, a blob
 * deleted with the last conversation that holds it, the limits (a part
 * too large or not base64 refused, nothing written; a history held to the
 * media limits of one request on load). Raw SQLite is used only to look
 * at the file.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "loom/store.h"
#include "store_fixture.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* "hello" in base64, and the SHA-256 of "hello". */
#define HELLO_B64 "aGVsbG8="
#define HELLO_SHA                                                              \
    "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"

static loom_part text_part(const char *s)
{
    return (loom_part){.kind = LOOM_PART_TEXT, .text = (char *)s};
}

static loom_part data_part(loom_part_kind kind, const char *mime,
                           const char *b64)
{
    return (loom_part){.kind = kind, .mime = (char *)mime, .data = (char *)b64};
}

/* Saves one turn into conv: a user message of parts (n) and an answer. */
static int save_parts(loom_store *st, const char *conv, const loom_part *parts,
                      size_t n)
{
    loom_messages in = {0}, out = {0};
    loom_turn_record t = {0};
    int rc;

    assert_int_equal(loom_messages_add_parts(&in, LOOM_ROLE_USER, parts, n), 0);
    assert_int_equal(
        loom_messages_add_assistant(&out, "I see it.", NULL, NULL, 0), 0);
    t.conversation_id = conv;
    t.run_id = "run_parts";
    t.model = "fake/m1";
    t.input = &in;
    t.output = &out;
    t.finish_reason = "stop";
    t.cost = -1;
    rc = loom_store_save_turn(st, &t);
    loom_messages_free(&in);
    loom_messages_free(&out);
    return rc;
}

/* A string of n base64 characters ('A': zero bytes); caller frees. */
static char *zeros_b64(size_t n)
{
    char *s = malloc(n + 1);

    assert_non_null(s);
    memset(s, 'A', n);
    s[n] = '\0';
    return s;
}

static void test_roundtrip(void **state)
{
    char *path = test_db_path("parts_roundtrip.db");
    loom_store *st = test_store_open_ok(path);
    char *conv = test_conversation_create_ok(st);
    loom_part parts[4] = {
        text_part("What is in these?"),
        data_part(LOOM_PART_IMAGE, "image/png", HELLO_B64),
        {.kind = LOOM_PART_IMAGE,
         .url = "https://img.example/cat.jpg",
         .detail = "low"},
        data_part(LOOM_PART_FILE, "application/pdf", "UERG"),
    };
    loom_messages hist = {0};
    json_t *got, *p;
    const loom_message *m;
    char *dump;

    (void)state;
    parts[3].filename = "a.pdf";
    assert_int_equal(save_parts(st, conv, parts, 4), 0);

    /* The history gives every part back, the bytes as base64. */
    assert_int_equal(loom_store_load_history(st, conv, &hist), 0);
    assert_int_equal(hist.len, 2);
    m = &hist.items[0];
    assert_string_equal(m->content, "What is in these?");
    assert_int_equal(m->parts_len, 4);
    assert_int_equal(m->parts[0].kind, LOOM_PART_TEXT);
    assert_string_equal(m->parts[0].text, "What is in these?");
    assert_int_equal(m->parts[1].kind, LOOM_PART_IMAGE);
    assert_string_equal(m->parts[1].data, HELLO_B64);
    assert_string_equal(m->parts[1].mime, "image/png");
    assert_null(m->parts[1].url);
    assert_string_equal(m->parts[2].url, "https://img.example/cat.jpg");
    assert_string_equal(m->parts[2].detail, "low");
    assert_null(m->parts[2].data);
    assert_int_equal(m->parts[3].kind, LOOM_PART_FILE);
    assert_string_equal(m->parts[3].data, "UERG");
    assert_string_equal(m->parts[3].filename, "a.pdf");
    assert_int_equal(hist.items[1].parts_len, 0);
    loom_messages_free(&hist);

    /* The API shows hash and size, never the bytes. */
    got = test_conversation_get_ok(st, conv);
    p = json_object_get(json_array_get(json_object_get(got, "messages"), 0),
                        "parts");
    assert_int_equal(json_array_size(p), 4);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(p, 1), "hash")),
        HELLO_SHA);
    assert_int_equal(
        json_integer_value(json_object_get(json_array_get(p, 1), "bytes")), 5);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(p, 1), "type")),
        "image");
    assert_null(json_object_get(json_array_get(p, 1), "data"));
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(p, 2), "url")),
        "https://img.example/cat.jpg");
    assert_int_equal(
        json_integer_value(json_object_get(json_array_get(p, 3), "bytes")), 3);
    assert_null(json_object_get(
        json_array_get(json_object_get(got, "messages"), 1), "parts"));
    dump = json_dumps(got, 0);
    assert_non_null(dump);
    assert_null(strstr(dump, HELLO_B64));
    free(dump);
    json_decref(got);

    /* The bytes themselves are in blobs, decoded. */
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM blobs"), 2);
    assert_int_equal(
        test_db_int(path, "SELECT bytes FROM blobs WHERE hash = '" HELLO_SHA
                          "' AND data = CAST('hello' AS BLOB)"),
        5);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages "
                                       "WHERE parts LIKE '%" HELLO_B64 "%'"),
                     0);
    free(conv);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

static void test_same_image_stored_once(void **state)
{
    char *path = test_db_path("parts_dedup.db");
    loom_store *st = test_store_open_ok(path);
    char *a = test_conversation_create_ok(st);
    char *b = test_conversation_create_ok(st);
    loom_part twice[2] = {
        data_part(LOOM_PART_IMAGE, "image/png", HELLO_B64),
        data_part(LOOM_PART_IMAGE, "image/png", HELLO_B64),
    };

    (void)state;
    assert_int_equal(save_parts(st, a, twice, 2), 0);
    assert_int_equal(save_parts(st, a, twice, 1), 0);
    assert_int_equal(save_parts(st, b, twice, 1), 0);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM blobs"), 1);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM message_blobs"),
                     3);

    /* A blob stays while a message holds it and goes with the last. */
    assert_int_equal(loom_store_conversation_delete(st, a), 0);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM blobs"), 1);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM message_blobs"),
                     1);
    assert_int_equal(loom_store_conversation_delete(st, b), 0);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM blobs"), 0);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM message_blobs"),
                     0);
    free(a);
    free(b);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

static void test_refused_parts_write_nothing(void **state)
{
    char *path = test_db_path("parts_refused.db");
    loom_store *st = test_store_open_ok(path);
    char *conv = test_conversation_create_ok(st);
    /* One byte past the limit: 4 characters are 3 bytes. */
    char *big = zeros_b64(((size_t)LOOM_STORE_PART_MAX_BYTES + 3) / 3 * 4);
    loom_part p = data_part(LOOM_PART_IMAGE, "image/png", big);

    (void)state;
    assert_int_equal(save_parts(st, conv, &p, 1), LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "nothing was saved"));
    p.data = "not base64!";
    assert_int_equal(save_parts(st, conv, &p, 1), LOOM_EINVALID);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages"), 0);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM blobs"), 0);
    free(big);
    free(conv);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

/* 1 when part is the text that stands in for one left out. */
static int left_out(const loom_part *part)
{
    return part->kind == LOOM_PART_TEXT && part->text &&
           strstr(part->text, "left out") != NULL;
}

static void test_history_limits(void **state)
{
    char *path = test_db_path("parts_limits.db");
    loom_store *st = test_store_open_ok(path);
    char *conv = test_conversation_create_ok(st);
    loom_part many[LOOM_STORE_HISTORY_MEDIA_MAX];
    loom_messages hist = {0};
    /* Three images of 8 MiB: two fit in 20 MiB, the oldest does not. */
    char *big = zeros_b64((size_t)LOOM_STORE_PART_MAX_BYTES / 3 * 4);
    loom_part one = data_part(LOOM_PART_IMAGE, "image/png", HELLO_B64);

    (void)state;
    for (size_t i = 0; i < LOOM_STORE_HISTORY_MEDIA_MAX; i++)
        many[i] = one;
    /* Count: one older image, then as many as a history keeps. */
    assert_int_equal(save_parts(st, conv, &one, 1), 0);
    assert_int_equal(save_parts(st, conv, many, LOOM_STORE_HISTORY_MEDIA_MAX),
                     0);
    assert_int_equal(loom_store_load_history(st, conv, &hist), 0);
    assert_int_equal(hist.len, 4);
    assert_int_equal(hist.items[0].parts_len, 1);
    assert_true(left_out(&hist.items[0].parts[0]));
    for (size_t i = 0; i < LOOM_STORE_HISTORY_MEDIA_MAX; i++)
        assert_string_equal(hist.items[2].parts[i].data, HELLO_B64);
    loom_messages_free(&hist);
    assert_int_equal(loom_store_conversation_delete(st, conv), 0);
    free(conv);

    /* Bytes. */
    conv = test_conversation_create_ok(st);
    one.data = big;
    for (int i = 0; i < 3; i++)
        assert_int_equal(save_parts(st, conv, &one, 1), 0);
    assert_int_equal(loom_store_load_history(st, conv, &hist), 0);
    assert_int_equal(hist.len, 6);
    assert_true(left_out(&hist.items[0].parts[0]));
    assert_string_equal(hist.items[2].parts[0].data, big);
    assert_string_equal(hist.items[4].parts[0].data, big);
    loom_messages_free(&hist);
    /* The three hold one blob. */
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM blobs"), 1);
    free(big);
    free(conv);
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_same_image_stored_once),
        cmocka_unit_test(test_refused_parts_write_nothing),
        cmocka_unit_test(test_history_limits),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
