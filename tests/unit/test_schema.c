/*
 * Unit tests for loom_schema_validate: every supported keyword, valid and
 * invalid, with the exact message a model would read; paths through
 * nested objects and arrays; deterministic ordering; and the limits
 * (nesting depth, path length, long keys, long enum and const values).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "loom/tools.h"

#include <stdlib.h>
#include <string.h>

static json_t *parse(const char *text)
{
    json_error_t err;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &err);

    if (!j)
        fail_msg("bad test JSON '%s': %s", text, err.text);
    return j;
}

/* Validates value against schema; returns the message ("" when valid). */
static char *check(const char *schema_text, const char *value_text, int *rc)
{
    json_t *schema = schema_text ? parse(schema_text) : NULL;
    json_t *value = parse(value_text);
    char *msg = (char *)"sentinel";

    *rc = loom_schema_validate(schema, value, &msg);
    json_decref(schema);
    json_decref(value);
    if (*rc == 0) {
        assert_null(msg);
        msg = strdup("");
    } else {
        assert_int_equal(*rc, LOOM_EINVALID);
        assert_non_null(msg);
        /* The same message is the thread's last error. */
        assert_string_equal(loom_error_last(), msg);
    }
    return msg;
}

static void expect_valid(const char *schema, const char *value)
{
    int rc;
    char *msg = check(schema, value, &rc);

    if (rc != 0)
        fail_msg("expected valid: %s against %s, got \"%s\"", value,
                 schema ? schema : "no schema", msg);
    free(msg);
}

static void expect_error(const char *schema, const char *value,
                         const char *want)
{
    int rc;
    char *msg = check(schema, value, &rc);

    if (rc == 0)
        fail_msg("expected \"%s\": %s against %s was accepted", want, value,
                 schema);
    assert_string_equal(msg, want);
    free(msg);
}

/* A schema with one property "v" whose own schema is t. */
#define PROP(t) "{\"type\": \"object\", \"properties\": {\"v\": " t "}}"

static void test_null_schema_accepts_anything(void **state)
{
    (void)state;
    expect_valid(NULL, "{\"a\": 1}");
    expect_valid(NULL, "[1, 2]");
    expect_valid(NULL, "\"text\"");
    expect_valid("{}", "{\"anything\": [1, {\"x\": null}]}");
    expect_valid("true", "42");
    expect_error("false", "42", "no arguments are allowed");
    expect_error(PROP("false"), "{\"v\": 1}", "`v` is not allowed");
}

static void test_msg_may_be_null(void **state)
{
    json_t *schema = parse("{\"type\": \"object\"}");
    json_t *value = parse("[]");

    (void)state;
    assert_int_equal(loom_schema_validate(schema, value, NULL),
                     LOOM_EINVALID);
    assert_string_equal(loom_error_last(), "arguments must be a JSON object");
    json_decref(schema);
    json_decref(value);
}

static void test_top_level_must_be_object(void **state)
{
    const char *s = "{\"type\": \"object\", \"properties\": {}}";

    (void)state;
    expect_error(s, "[1]", "arguments must be a JSON object");
    expect_error(s, "\"x\"", "arguments must be a JSON object");
    expect_error(s, "null", "arguments must be a JSON object");
    expect_valid(s, "{}");
}

static void test_types(void **state)
{
    (void)state;
    expect_valid(PROP("{\"type\": \"string\"}"), "{\"v\": \"s\"}");
    expect_error(PROP("{\"type\": \"string\"}"), "{\"v\": 5}",
                 "`v` must be a string, got integer");
    expect_valid(PROP("{\"type\": \"number\"}"), "{\"v\": 5}");
    expect_valid(PROP("{\"type\": \"number\"}"), "{\"v\": 5.5}");
    expect_error(PROP("{\"type\": \"number\"}"), "{\"v\": \"5\"}",
                 "`v` must be a number, got string");
    expect_valid(PROP("{\"type\": \"integer\"}"), "{\"v\": -7}");
    expect_error(PROP("{\"type\": \"integer\"}"), "{\"v\": true}",
                 "`v` must be an integer, got boolean");
    expect_valid(PROP("{\"type\": \"boolean\"}"), "{\"v\": false}");
    expect_error(PROP("{\"type\": \"boolean\"}"), "{\"v\": \"true\"}",
                 "`v` must be a boolean, got string");
    expect_valid(PROP("{\"type\": \"object\"}"), "{\"v\": {}}");
    expect_error(PROP("{\"type\": \"object\"}"), "{\"v\": []}",
                 "`v` must be an object, got array");
    expect_valid(PROP("{\"type\": \"array\"}"), "{\"v\": []}");
    expect_error(PROP("{\"type\": \"array\"}"), "{\"v\": {}}",
                 "`v` must be an array, got object");
    expect_valid(PROP("{\"type\": \"null\"}"), "{\"v\": null}");
    expect_error(PROP("{\"type\": \"null\"}"), "{\"v\": 0}",
                 "`v` must be null, got integer");
    /* An unknown type name does not constrain anything. */
    expect_valid(PROP("{\"type\": \"date\"}"), "{\"v\": 0}");
}

static void test_integer_accepts_integral_reals(void **state)
{
    const char *s = "{\"type\": \"object\", \"properties\": "
                    "{\"count\": {\"type\": \"integer\"}}}";

    (void)state;
    expect_valid(s, "{\"count\": 3}");
    expect_valid(s, "{\"count\": 3.0}");
    expect_valid(s, "{\"count\": -2e3}");
    expect_error(s, "{\"count\": 3.5}",
                 "`count` must be an integer, got number");
    expect_error(s, "{\"count\": \"3\"}",
                 "`count` must be an integer, got string");
}

static void test_type_lists(void **state)
{
    const char *s2 = PROP("{\"type\": [\"string\", \"null\"]}");
    const char *s3 = PROP("{\"type\": [\"string\", \"integer\", \"null\"]}");

    (void)state;
    expect_valid(s2, "{\"v\": null}");
    expect_valid(s2, "{\"v\": \"x\"}");
    expect_error(s2, "{\"v\": 5}", "`v` must be a string or null, got integer");
    expect_valid(s3, "{\"v\": 5}");
    expect_error(s3, "{\"v\": 5.5}",
                 "`v` must be a string, an integer or null, got number");
    expect_error(s3, "{\"v\": [1]}",
                 "`v` must be a string, an integer or null, got array");
}

static void test_required(void **state)
{
    const char *s = "{\"type\": \"object\", \"required\": [\"query\"], "
                    "\"properties\": {\"query\": {\"type\": \"string\"}}}";
    const char *untyped = "{\"type\": \"object\", \"required\": [\"q\"]}";
    const char *integer = "{\"type\": \"object\", \"required\": [\"n\"], "
                          "\"properties\": {\"n\": {\"type\": \"integer\"}}}";

    (void)state;
    expect_valid(s, "{\"query\": \"cats\"}");
    expect_error(s, "{}", "`query` is required and must be a string");
    expect_error(s, "{\"Query\": \"cats\"}",
                 "`query` is required and must be a string");
    /* Present but null is not missing; it is the wrong type. */
    expect_error(s, "{\"query\": null}",
                 "`query` must be a string, got null");
    expect_error(untyped, "{}", "`q` is required");
    expect_error(integer, "{}", "`n` is required and must be an integer");
}

static void test_required_checked_in_schema_order(void **state)
{
    const char *s = "{\"type\": \"object\", \"required\": [\"b\", \"a\"], "
                    "\"properties\": {\"a\": {\"type\": \"string\"}, "
                    "\"b\": {\"type\": \"number\"}}}";

    (void)state;
    expect_error(s, "{}", "`b` is required and must be a number");
    expect_error(s, "{\"b\": 1}", "`a` is required and must be a string");
    /* required comes before the properties' own checks. */
    expect_error(s, "{\"b\": \"x\"}", "`a` is required and must be a string");
}

static void test_properties_checked_in_schema_order(void **state)
{
    const char *s = "{\"type\": \"object\", \"properties\": {"
                    "\"first\": {\"type\": \"string\"}, "
                    "\"second\": {\"type\": \"string\"}}}";

    (void)state;
    expect_error(s, "{\"second\": 1, \"first\": 2}",
                 "`first` must be a string, got integer");
    expect_error(s, "{\"second\": 1, \"first\": \"ok\"}",
                 "`second` must be a string, got integer");
}

static void test_enum(void **state)
{
    const char *s = PROP("{\"type\": \"string\", \"enum\": [\"c\", \"f\"]}");
    const char *nums = PROP("{\"enum\": [1, 2.5, null]}");

    (void)state;
    expect_valid(s, "{\"v\": \"c\"}");
    expect_error(s, "{\"v\": \"k\"}", "`v` must be one of: \"c\", \"f\"");
    expect_valid(nums, "{\"v\": 1}");
    expect_valid(nums, "{\"v\": 1.0}");
    expect_valid(nums, "{\"v\": null}");
    expect_error(nums, "{\"v\": 3}", "`v` must be one of: 1, 2.5, null");
}

static void test_enum_message_matches_spec_example(void **state)
{
    const char *s = "{\"type\": \"object\", \"properties\": {\"unit\": "
                    "{\"type\": \"string\", \"enum\": [\"c\", \"f\"]}}}";

    (void)state;
    expect_error(s, "{\"unit\": \"kelvin\"}",
                 "`unit` must be one of: \"c\", \"f\"");
}

static void test_long_enum_is_cut(void **state)
{
    json_t *schema = json_pack("{s:s, s:{s:{s:[]}}}", "type", "object",
                               "properties", "v", "enum");
    json_t *opts = json_object_get(
        json_object_get(json_object_get(schema, "properties"), "v"), "enum");
    json_t *value = parse("{\"v\": \"nope\"}");
    char *msg = NULL;
    size_t n;

    (void)state;
    for (int i = 0; i < 300; i++) {
        char opt[16];

        snprintf(opt, sizeof(opt), "opt%06d", i);
        json_array_append_new(opts, json_string(opt));
    }
    assert_int_equal(loom_schema_validate(schema, value, &msg),
                     LOOM_EINVALID);
    assert_non_null(msg);
    n = strlen(msg);
    assert_true(strncmp(msg, "`v` must be one of: \"opt000000\", "
                        "\"opt000001\", ", 40) == 0);
    assert_string_equal(msg + n - 5, ", ...");
    assert_true(n < 2048 + 100);
    assert_null(strstr(msg, "opt000299"));
    free(msg);
    json_decref(schema);
    json_decref(value);
}

static void test_const(void **state)
{
    const char *s = PROP("{\"const\": \"yes\"}");
    const char *obj = PROP("{\"const\": {\"a\": [1, 2]}}");

    (void)state;
    expect_valid(s, "{\"v\": \"yes\"}");
    expect_error(s, "{\"v\": \"no\"}", "`v` must be \"yes\"");
    expect_valid(obj, "{\"v\": {\"a\": [1, 2]}}");
    expect_error(obj, "{\"v\": {\"a\": [2, 1]}}", "`v` must be {\"a\":[1,2]}");
}

static void test_long_const_is_cut(void **state)
{
    char *big = malloc(5001);
    json_t *schema, *value = parse("{\"v\": \"x\"}");
    char *msg = NULL;

    (void)state;
    memset(big, 'z', 5000);
    big[5000] = '\0';
    schema = json_pack("{s:{s:{s:s}}}", "properties", "v", "const", big);
    assert_int_equal(loom_schema_validate(schema, value, &msg),
                     LOOM_EINVALID);
    /* "`v` must be " + '"' + 1023 z's + "..." */
    assert_int_equal(strlen(msg), strlen("`v` must be ") + 1024 + 3);
    assert_true(strncmp(msg, "`v` must be \"zzz", 16) == 0);
    assert_string_equal(msg + strlen(msg) - 4, "z...");
    free(msg);
    free(big);
    json_decref(schema);
    json_decref(value);
}

static void test_minimum_maximum(void **state)
{
    const char *s = "{\"type\": \"object\", \"properties\": {\"count\": "
                    "{\"type\": \"integer\", \"minimum\": 1, "
                    "\"maximum\": 10}}}";
    const char *r = PROP("{\"type\": \"number\", \"minimum\": 0.5, "
                         "\"maximum\": 2.25}");

    (void)state;
    expect_valid(s, "{\"count\": 1}");
    expect_valid(s, "{\"count\": 10}");
    expect_error(s, "{\"count\": 11}", "`count` must be at most 10");
    expect_error(s, "{\"count\": 0}", "`count` must be at least 1");
    expect_error(s, "{\"count\": 10.5}",
                 "`count` must be an integer, got number");
    expect_valid(r, "{\"v\": 0.5}");
    expect_error(r, "{\"v\": 0.25}", "`v` must be at least 0.5");
    expect_error(r, "{\"v\": 3}", "`v` must be at most 2.25");
}

static void test_exclusive_bounds(void **state)
{
    const char *s = PROP("{\"type\": \"number\", \"exclusiveMinimum\": 0, "
                         "\"exclusiveMaximum\": 10}");
    const char *draft4 = PROP("{\"minimum\": 0, \"exclusiveMinimum\": true, "
                              "\"maximum\": 1, \"exclusiveMaximum\": true}");

    (void)state;
    expect_valid(s, "{\"v\": 0.001}");
    expect_valid(s, "{\"v\": 9.999}");
    expect_error(s, "{\"v\": 0}", "`v` must be greater than 0");
    expect_error(s, "{\"v\": -1}", "`v` must be greater than 0");
    expect_error(s, "{\"v\": 10}", "`v` must be less than 10");
    expect_valid(draft4, "{\"v\": 0.5}");
    expect_error(draft4, "{\"v\": 0}", "`v` must be greater than 0");
    expect_error(draft4, "{\"v\": 1}", "`v` must be less than 1");
}

static void test_string_length_in_code_points(void **state)
{
    const char *s = "{\"type\": \"object\", \"properties\": {\"name\": "
                    "{\"type\": \"string\", \"minLength\": 3, "
                    "\"maxLength\": 5}}}";
    const char *one = PROP("{\"maxLength\": 1}");
    const char *min1 = PROP("{\"minLength\": 1}");

    (void)state;
    expect_valid(s, "{\"name\": \"abc\"}");
    expect_error(s, "{\"name\": \"ab\"}",
                 "`name` must be at least 3 characters long");
    expect_error(s, "{\"name\": \"abcdef\"}",
                 "`name` must be at most 5 characters long");
    /* 5 code points, 10 bytes: counts as 5. */
    expect_valid(s, "{\"name\": \"\u00e9\u00e9\u00e9\u00e9\u00e9\"}");
    /* 2 code points (a 4-byte emoji and one letter). */
    expect_error(s, "{\"name\": \"\\ud83d\\ude00a\"}",
                 "`name` must be at least 3 characters long");
    expect_error(one, "{\"v\": \"ab\"}",
                 "`v` must be at most 1 character long");
    expect_error(min1, "{\"v\": \"\"}",
                 "`v` must be at least 1 character long");
}

static void test_array_items_count(void **state)
{
    const char *s = "{\"type\": \"object\", \"properties\": {\"tags\": "
                    "{\"type\": \"array\", \"minItems\": 1, "
                    "\"maxItems\": 5}}}";
    const char *two = PROP("{\"minItems\": 2}");

    (void)state;
    expect_valid(s, "{\"tags\": [1]}");
    expect_valid(s, "{\"tags\": [1, 2, 3, 4, 5]}");
    expect_error(s, "{\"tags\": [1, 2, 3, 4, 5, 6]}",
                 "`tags` must have at most 5 items");
    expect_error(s, "{\"tags\": []}", "`tags` must have at least 1 item");
    expect_error(two, "{\"v\": [0]}", "`v` must have at least 2 items");
}

static void test_array_items_schema(void **state)
{
    const char *s = "{\"type\": \"object\", \"properties\": {\"tags\": "
                    "{\"type\": \"array\", \"items\": {\"type\": "
                    "\"string\"}}}}";

    (void)state;
    expect_valid(s, "{\"tags\": [\"a\", \"b\"]}");
    expect_error(s, "{\"tags\": [\"a\", \"b\", 3]}",
                 "`tags[2]` must be a string, got integer");
    expect_error(s, "{\"tags\": [\"a\", \"b\", 3, 4]}",
                 "`tags[2]` must be a string, got integer");
}

static void test_arrays_of_objects(void **state)
{
    const char *s =
        "{\"type\": \"object\", \"properties\": {\"items\": {\"type\": "
        "\"array\", \"items\": {\"type\": \"object\", \"required\": "
        "[\"name\"], \"properties\": {\"name\": {\"type\": \"string\"}, "
        "\"count\": {\"type\": \"integer\", \"maximum\": 10}}, "
        "\"additionalProperties\": false}}}}";

    (void)state;
    expect_valid(s, "{\"items\": [{\"name\": \"a\", \"count\": 1}]}");
    expect_error(s, "{\"items\": [{\"name\": \"a\"}, {\"name\": \"b\"}, "
                    "{\"name\": \"c\", \"count\": 11}]}",
                 "`items[2].count` must be at most 10");
    expect_error(s, "{\"items\": [{\"count\": 1}]}",
                 "`items[0].name` is required and must be a string");
    expect_error(s, "{\"items\": [{\"name\": \"a\", \"colour\": 1}]}",
                 "unexpected property `items[0].colour`");
    expect_error(s, "{\"items\": [[]]}",
                 "`items[0]` must be an object, got array");
}

static void test_nested_paths(void **state)
{
    const char *s =
        "{\"type\": \"object\", \"properties\": {\"filters\": {\"type\": "
        "\"object\", \"required\": [\"since\"], \"properties\": "
        "{\"since\": {\"type\": \"string\"}, \"range\": {\"type\": "
        "\"object\", \"properties\": {\"max\": {\"type\": \"number\", "
        "\"maximum\": 5}}}}}}}";

    (void)state;
    expect_error(s, "{\"filters\": {}}",
                 "`filters.since` is required and must be a string");
    expect_error(s, "{\"filters\": {\"since\": 2024}}",
                 "`filters.since` must be a string, got integer");
    expect_error(s, "{\"filters\": {\"since\": \"x\", \"range\": "
                    "{\"max\": 6}}}",
                 "`filters.range.max` must be at most 5");
    expect_error(s, "{\"filters\": \"today\"}",
                 "`filters` must be an object, got string");
}

static void test_additional_properties(void **state)
{
    const char *closed = "{\"type\": \"object\", \"properties\": "
                         "{\"a\": {}}, \"additionalProperties\": false}";
    const char *nested = "{\"type\": \"object\", \"properties\": "
                         "{\"filters\": {\"type\": \"object\", "
                         "\"additionalProperties\": false}}}";
    const char *typed = "{\"type\": \"object\", \"properties\": "
                        "{\"a\": {}}, \"additionalProperties\": "
                        "{\"type\": \"number\"}}";
    const char *open = "{\"type\": \"object\", \"properties\": {\"a\": {}}}";

    (void)state;
    expect_valid(closed, "{\"a\": 1}");
    expect_error(closed, "{\"a\": 1, \"foo\": 2}", "unexpected property `foo`");
    expect_error(nested, "{\"filters\": {\"foo\": 1}}",
                 "unexpected property `filters.foo`");
    expect_valid(typed, "{\"a\": \"s\", \"x\": 1, \"y\": 2.5}");
    expect_error(typed, "{\"a\": \"s\", \"x\": \"one\"}",
                 "`x` must be a number, got string");
    expect_valid(open, "{\"a\": 1, \"foo\": 2}");
}

static void test_long_key_is_cut_in_message(void **state)
{
    const char *closed = "{\"type\": \"object\", \"properties\": {}, "
                         "\"additionalProperties\": false}";
    char key[201], want[128];
    json_t *schema = parse(closed), *value = json_object();
    char *msg = NULL;

    (void)state;
    memset(key, 'k', 200);
    key[200] = '\0';
    json_object_set_new(value, key, json_true());
    assert_int_equal(loom_schema_validate(schema, value, &msg),
                     LOOM_EINVALID);
    snprintf(want, sizeof(want), "unexpected property `%.64s...`", key);
    assert_string_equal(msg, want);
    free(msg);
    json_decref(schema);
    json_decref(value);
}

static void test_long_path_is_cut(void **state)
{
    char key[61];
    json_t *schema = json_pack("{s:s}", "type", "integer");
    json_t *value = json_string("deep");
    char *msg = NULL, *want;

    (void)state;
    memset(key, 'k', 60);
    key[60] = '\0';
    /* Ten levels of 60-character keys: the path would be 609 bytes. */
    for (int i = 0; i < 10; i++) {
        schema = json_pack("{s:s, s:{s:o}}", "type", "object", "properties",
                           key, schema);
        value = json_pack("{s:o}", key, value);
    }
    assert_int_equal(loom_schema_validate(schema, value, &msg),
                     LOOM_EINVALID);
    /* Eight whole segments (60 + 7 * 61 = 487 bytes), then "...". */
    want = malloc(1024);
    strcpy(want, "`");
    for (int i = 0; i < 8; i++) {
        if (i)
            strcat(want, ".");
        strcat(want, key);
    }
    strcat(want, "...` must be an integer, got string");
    assert_string_equal(msg, want);
    free(want);
    free(msg);
    json_decref(schema);
    json_decref(value);
}

/* n levels: n nested object schemas and a value nested just as deep. */
static void nested_objects(int n, json_t **schema, json_t **value)
{
    *schema = json_pack("{s:s}", "type", "object");
    *value = json_object();
    for (int i = 1; i < n; i++) {
        *schema = json_pack("{s:s, s:{s:o}}", "type", "object",
                            "properties", "a", *schema);
        *value = json_pack("{s:o}", "a", *value);
    }
}

static void nested_arrays(int n, json_t **schema, json_t **value)
{
    *schema = json_pack("{s:s}", "type", "integer");
    *value = json_integer(1);
    for (int i = 1; i < n; i++) {
        *schema = json_pack("{s:s, s:o}", "type", "array", "items", *schema);
        *value = json_pack("[o]", *value);
    }
}

static void test_depth_limit(void **state)
{
    json_t *schema, *value;
    char *msg = NULL;

    (void)state;
    nested_objects(64, &schema, &value);
    assert_int_equal(loom_schema_validate(schema, value, &msg), 0);
    json_decref(schema);
    json_decref(value);

    nested_objects(65, &schema, &value);
    assert_int_equal(loom_schema_validate(schema, value, &msg),
                     LOOM_EINVALID);
    assert_string_equal(msg,
                        "arguments are nested too deeply (more than 64 "
                        "levels)");
    free(msg);
    json_decref(schema);
    json_decref(value);

    nested_arrays(64, &schema, &value);
    assert_int_equal(loom_schema_validate(schema, value, &msg), 0);
    json_decref(schema);
    json_decref(value);

    /* Far deeper than the limit: an error, not a stack overflow. */
    nested_arrays(1000, &schema, &value);
    assert_int_equal(loom_schema_validate(schema, value, &msg),
                     LOOM_EINVALID);
    assert_string_equal(msg,
                        "arguments are nested too deeply (more than 64 "
                        "levels)");
    free(msg);
    json_decref(schema);
    json_decref(value);
}

static void test_pattern_and_unknown_keywords_ignored(void **state)
{
    (void)state;
    expect_valid(PROP("{\"type\": \"string\", \"pattern\": \"^[0-9]+$\", "
                      "\"format\": \"date\", \"$ref\": \"#/x\"}"),
                 "{\"v\": \"letters\"}");
}

static void test_keywords_apply_without_type(void **state)
{
    (void)state;
    /* Without "type", each keyword applies to values of its kind. */
    expect_error(PROP("{\"maximum\": 3, \"maxLength\": 2}"), "{\"v\": 4}",
                 "`v` must be at most 3");
    expect_error(PROP("{\"maximum\": 3, \"maxLength\": 2}"),
                 "{\"v\": \"abc\"}", "`v` must be at most 2 characters long");
    expect_valid(PROP("{\"maximum\": 3, \"maxLength\": 2}"), "{\"v\": true}");
}

static void test_root_non_object_schemas(void **state)
{
    (void)state;
    expect_error("{\"type\": \"integer\"}", "\"x\"",
                 "arguments must be an integer, got string");
    expect_error("{\"type\": \"array\", \"maxItems\": 1}", "[1, 2]",
                 "arguments must have at most 1 item");
    expect_error("{\"type\": \"array\", \"items\": {\"type\": \"string\"}}",
                 "[\"a\", 1]", "`[1]` must be a string, got integer");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_null_schema_accepts_anything),
        cmocka_unit_test(test_msg_may_be_null),
        cmocka_unit_test(test_top_level_must_be_object),
        cmocka_unit_test(test_types),
        cmocka_unit_test(test_integer_accepts_integral_reals),
        cmocka_unit_test(test_type_lists),
        cmocka_unit_test(test_required),
        cmocka_unit_test(test_required_checked_in_schema_order),
        cmocka_unit_test(test_properties_checked_in_schema_order),
        cmocka_unit_test(test_enum),
        cmocka_unit_test(test_enum_message_matches_spec_example),
        cmocka_unit_test(test_long_enum_is_cut),
        cmocka_unit_test(test_const),
        cmocka_unit_test(test_long_const_is_cut),
        cmocka_unit_test(test_minimum_maximum),
        cmocka_unit_test(test_exclusive_bounds),
        cmocka_unit_test(test_string_length_in_code_points),
        cmocka_unit_test(test_array_items_count),
        cmocka_unit_test(test_array_items_schema),
        cmocka_unit_test(test_arrays_of_objects),
        cmocka_unit_test(test_nested_paths),
        cmocka_unit_test(test_additional_properties),
        cmocka_unit_test(test_long_key_is_cut_in_message),
        cmocka_unit_test(test_long_path_is_cut),
        cmocka_unit_test(test_depth_limit),
        cmocka_unit_test(test_pattern_and_unknown_keywords_ignored),
        cmocka_unit_test(test_keywords_apply_without_type),
        cmocka_unit_test(test_root_non_object_schemas),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
