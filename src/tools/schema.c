/*
 * Tool argument validation against a JSON Schema subset.
 *
 * The model's arguments are checked before a tool runs, and the first
 * problem found is reported in a sentence the model can act on, naming the
 * offending value by its path in backticks (`query`, `filters.since`,
 * `items[2].count`). Messages are stable (tests and prompts rely on them)
 * and checks run in a fixed order so the same input always gives the same
 * message: type, then enum/const, then the keywords of the value's kind;
 * for objects `required` in schema order, then `properties` in schema
 * order, then additional properties in the value's order.
 *
 * Only the subset documented in loom/tools.h is understood; other keywords
 * (pattern, format, $ref, ...) are ignored, so an unsupported schema is
 * lenient rather than wrong. Recursion is bounded (MAX_DEPTH levels) so a
 * hostile or cyclic-looking input fails with a message, never a crash.
 */
#include "core/error.h"
#include "core/utf8.h"
#include "loom/tools.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEPTH 64
/* A path longer than this is cut short in messages; keys come from the
 * model and may be long. */
#define MAX_KEY_SHOWN 64
#define MAX_PATH_LEN 512
/* Enum lists and const values are cut short in messages past these. */
#define MAX_VALUE_SHOWN 1024
#define MAX_ENUM_SHOWN 2048

enum {
    T_STRING = 1 << 0,
    T_NUMBER = 1 << 1,
    T_INTEGER = 1 << 2,
    T_BOOLEAN = 1 << 3,
    T_OBJECT = 1 << 4,
    T_ARRAY = 1 << 5,
    T_NULL = 1 << 6
};

static const struct {
    const char *name;
    const char *phrase; /* "must be <phrase>" */
    int bit;
} type_names[] = {
    {"string", "a string", T_STRING},
    {"number", "a number", T_NUMBER},
    {"integer", "an integer", T_INTEGER},
    {"boolean", "a boolean", T_BOOLEAN},
    {"object", "an object", T_OBJECT},
    {"array", "an array", T_ARRAY},
    {"null", "null", T_NULL},
};

#define NTYPES (sizeof(type_names) / sizeof(type_names[0]))

typedef struct {
    char path[MAX_PATH_LEN + 8];
    size_t len;
    loom_buf msg;
    int oom;
} vctx;

/* Records the failure message (first one wins). Returns LOOM_EINVALID. */
static int fail(vctx *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int fail(vctx *c, const char *fmt, ...)
{
    va_list ap;

    if (c->msg.len == 0) {
        va_start(ap, fmt);
        if (loom_buf_vprintf(&c->msg, fmt, ap) == LOOM_ENOMEM)
            c->oom = 1;
        va_end(ap);
    }
    return LOOM_EINVALID;
}

/*
 * Appends a path segment: ".key" (or "key" at the root) or "[i]". Returns
 * the previous length so the caller can pop it. A path that would pass
 * MAX_PATH_LEN ends in "..." instead; messages stay readable and bounded.
 */
static size_t path_push_key(vctx *c, const char *key)
{
    size_t old = c->len, klen = strlen(key), room;
    int cut = 0;

    if (klen > MAX_KEY_SHOWN) {
        /* Do not split a UTF-8 sequence. */
        klen = loom__utf8_cut(key, klen, MAX_KEY_SHOWN);
        cut = 1;
    }
    if (c->len >= MAX_PATH_LEN)
        return old;
    room = MAX_PATH_LEN - c->len;
    if (klen + 1 + (cut ? 3 : 0) > room) {
        memcpy(c->path + c->len, "...", 4);
        c->len = MAX_PATH_LEN;
        return old;
    }
    if (c->len)
        c->path[c->len++] = '.';
    memcpy(c->path + c->len, key, klen);
    c->len += klen;
    if (cut) {
        memcpy(c->path + c->len, "...", 3);
        c->len += 3;
    }
    c->path[c->len] = '\0';
    return old;
}

static size_t path_push_index(vctx *c, size_t i)
{
    size_t old = c->len;
    char seg[32];
    int n = snprintf(seg, sizeof(seg), "[%zu]", i);

    if (c->len >= MAX_PATH_LEN)
        return old;
    if ((size_t)n > MAX_PATH_LEN - c->len) {
        memcpy(c->path + c->len, "...", 4);
        c->len = MAX_PATH_LEN;
        return old;
    }
    memcpy(c->path + c->len, seg, (size_t)n + 1);
    c->len += (size_t)n;
    return old;
}

static void path_pop(vctx *c, size_t old)
{
    c->len = old;
    c->path[old] = '\0';
}

/*
 * The subject of a message: "`path`" or, at the root, "arguments". Written
 * into a caller buffer so it can be used as a %s argument.
 */
static const char *subject(const vctx *c, char *buf, size_t size)
{
    if (c->len == 0)
        snprintf(buf, size, "arguments");
    else
        snprintf(buf, size, "`%s`", c->path);
    return buf;
}

#define SUBJECT_SIZE (MAX_PATH_LEN + 16)

/* The type bits a schema allows, 0 when it does not constrain the type. */
static int schema_types(const json_t *schema)
{
    const json_t *t = json_object_get(schema, "type");
    int bits = 0;

    if (json_is_string(t)) {
        for (size_t i = 0; i < NTYPES; i++)
            if (strcmp(json_string_value(t), type_names[i].name) == 0)
                bits |= type_names[i].bit;
    } else if (json_is_array(t)) {
        size_t j;
        const json_t *v;

        json_array_foreach(t, j, v) {
            if (!json_is_string(v))
                continue;
            for (size_t i = 0; i < NTYPES; i++)
                if (strcmp(json_string_value(v), type_names[i].name) == 0)
                    bits |= type_names[i].bit;
        }
    }
    return bits;
}

/* "a string", "a string or null", "a string, an integer or null". */
static void types_phrase(int bits, char *buf, size_t size)
{
    size_t n = 0, total = 0, len = 0;

    for (size_t i = 0; i < NTYPES; i++)
        if (bits & type_names[i].bit)
            total++;
    buf[0] = '\0';
    for (size_t i = 0; i < NTYPES; i++) {
        const char *sep;
        int w;

        if (!(bits & type_names[i].bit))
            continue;
        n++;
        sep = n == 1 ? "" : n == total ? " or " : ", ";
        w = snprintf(buf + len, size - len, "%s%s", sep, type_names[i].phrase);
        if (w < 0 || (size_t)w >= size - len)
            return;
        len += (size_t)w;
    }
}

static int is_integral(const json_t *v)
{
    double d;

    if (json_is_integer(v))
        return 1;
    if (!json_is_real(v))
        return 0;
    d = json_real_value(v);
    return isfinite(d) && d == floor(d);
}

static int value_matches(const json_t *v, int bits)
{
    switch (json_typeof(v)) {
    case JSON_STRING: return bits & T_STRING;
    case JSON_INTEGER: return bits & (T_INTEGER | T_NUMBER);
    case JSON_REAL:
        return (bits & T_NUMBER) || ((bits & T_INTEGER) && is_integral(v));
    case JSON_TRUE:
    case JSON_FALSE: return bits & T_BOOLEAN;
    case JSON_OBJECT: return bits & T_OBJECT;
    case JSON_ARRAY: return bits & T_ARRAY;
    case JSON_NULL: return bits & T_NULL;
    }
    return 0;
}

static const char *value_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "array";
    case JSON_NULL: return "null";
    }
    return "unknown";
}

/* Numbers compare by value (1 equals 1.0); everything else structurally. */
static int values_equal(const json_t *a, const json_t *b)
{
    if (json_is_number(a) && json_is_number(b)) {
        if (json_is_integer(a) && json_is_integer(b))
            return json_integer_value(a) == json_integer_value(b);
        return json_number_value(a) == json_number_value(b);
    }
    return json_equal((json_t *)a, (json_t *)b);
}

/*
 * Renders a number for a message: integers as such, reals with the fewest
 * digits that read back the same ("0.5", not "0.50000000000000000").
 */
static void number_text(const json_t *n, char *buf, size_t size)
{
    double d;

    if (json_is_integer(n)) {
        snprintf(buf, size, "%" JSON_INTEGER_FORMAT, json_integer_value(n));
        return;
    }
    d = json_number_value(n);
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, size, "%.*g", prec, d);
        if (strtod(buf, NULL) == d)
            return;
    }
}

/*
 * Appends a compact JSON rendering of v (an enum or const value), cut to
 * MAX_VALUE_SHOWN bytes plus "..." so one huge value cannot swamp the
 * message.
 */
static int put_json(loom_buf *b, const json_t *v)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    size_t n;
    int rc;

    if (!s)
        return LOOM_ENOMEM;
    n = strlen(s);
    if (n > MAX_VALUE_SHOWN) {
        n = loom__utf8_cut(s, n, MAX_VALUE_SHOWN);
        if ((rc = loom_buf_put(b, s, n)) == 0)
            rc = loom_buf_puts(b, "...");
    } else {
        rc = loom_buf_put(b, s, n);
    }
    free(s);
    return rc;
}

static int fail_enum(vctx *c, const json_t *options)
{
    char subj[SUBJECT_SIZE];
    loom_buf list = LOOM_BUF_INIT(4096);
    size_t i;
    const json_t *o;
    int rc;

    json_array_foreach(options, i, o) {
        /* A very long list is cut rather than failing validation. */
        if (list.len > MAX_ENUM_SHOWN) {
            if (loom_buf_puts(&list, ", ...") == LOOM_ENOMEM)
                c->oom = 1;
            break;
        }
        if ((i && loom_buf_puts(&list, ", ") == LOOM_ENOMEM) ||
            put_json(&list, o) == LOOM_ENOMEM) {
            c->oom = 1;
            break;
        }
    }
    rc = fail(c, "%s must be one of: %s", subject(c, subj, sizeof(subj)),
              loom_buf_cstr(&list));
    loom_buf_free(&list);
    return rc;
}

static int fail_const(vctx *c, const json_t *k)
{
    char subj[SUBJECT_SIZE];
    loom_buf val = LOOM_BUF_INIT(4096);
    int rc;

    if (put_json(&val, k) == LOOM_ENOMEM)
        c->oom = 1;
    rc = fail(c, "%s must be %s", subject(c, subj, sizeof(subj)),
              loom_buf_cstr(&val));
    loom_buf_free(&val);
    return rc;
}

static int check_number(vctx *c, const json_t *schema, const json_t *v)
{
    char subj[SUBJECT_SIZE], num[64];
    const json_t *k;
    double d = json_number_value(v);
    int excl_min = 0, excl_max = 0;

    /* Draft 4 spelled exclusiveMinimum/Maximum as booleans on min/max. */
    if (json_is_true(json_object_get(schema, "exclusiveMinimum")))
        excl_min = 1;
    if (json_is_true(json_object_get(schema, "exclusiveMaximum")))
        excl_max = 1;

    k = json_object_get(schema, "minimum");
    if (json_is_number(k) &&
        (excl_min ? d <= json_number_value(k) : d < json_number_value(k))) {
        number_text(k, num, sizeof(num));
        return fail(c, "%s must be %s %s", subject(c, subj, sizeof(subj)),
                    excl_min ? "greater than" : "at least", num);
    }
    k = json_object_get(schema, "maximum");
    if (json_is_number(k) &&
        (excl_max ? d >= json_number_value(k) : d > json_number_value(k))) {
        number_text(k, num, sizeof(num));
        return fail(c, "%s must be %s %s", subject(c, subj, sizeof(subj)),
                    excl_max ? "less than" : "at most", num);
    }
    k = json_object_get(schema, "exclusiveMinimum");
    if (json_is_number(k) && d <= json_number_value(k)) {
        number_text(k, num, sizeof(num));
        return fail(c, "%s must be greater than %s",
                    subject(c, subj, sizeof(subj)), num);
    }
    k = json_object_get(schema, "exclusiveMaximum");
    if (json_is_number(k) && d >= json_number_value(k)) {
        number_text(k, num, sizeof(num));
        return fail(c, "%s must be less than %s",
                    subject(c, subj, sizeof(subj)), num);
    }
    return 0;
}

static int check_string(vctx *c, const json_t *schema, const json_t *v)
{
    char subj[SUBJECT_SIZE];
    const json_t *k;
    size_t n = loom__utf8_count(json_string_value(v), json_string_length(v));

    k = json_object_get(schema, "minLength");
    if (json_is_integer(k) && (json_int_t)n < json_integer_value(k))
        return fail(c, "%s must be at least %" JSON_INTEGER_FORMAT
                    " character%s long", subject(c, subj, sizeof(subj)),
                    json_integer_value(k),
                    json_integer_value(k) == 1 ? "" : "s");
    k = json_object_get(schema, "maxLength");
    if (json_is_integer(k) && (json_int_t)n > json_integer_value(k))
        return fail(c, "%s must be at most %" JSON_INTEGER_FORMAT
                    " character%s long", subject(c, subj, sizeof(subj)),
                    json_integer_value(k),
                    json_integer_value(k) == 1 ? "" : "s");
    return 0;
}

static int validate(vctx *c, const json_t *schema, const json_t *v,
                    int depth);

static int check_array(vctx *c, const json_t *schema, const json_t *v,
                       int depth)
{
    char subj[SUBJECT_SIZE];
    const json_t *k, *item;
    size_t n = json_array_size(v), i;
    int rc;

    k = json_object_get(schema, "minItems");
    if (json_is_integer(k) && (json_int_t)n < json_integer_value(k))
        return fail(c, "%s must have at least %" JSON_INTEGER_FORMAT
                    " item%s", subject(c, subj, sizeof(subj)),
                    json_integer_value(k),
                    json_integer_value(k) == 1 ? "" : "s");
    k = json_object_get(schema, "maxItems");
    if (json_is_integer(k) && (json_int_t)n > json_integer_value(k))
        return fail(c, "%s must have at most %" JSON_INTEGER_FORMAT
                    " item%s", subject(c, subj, sizeof(subj)),
                    json_integer_value(k),
                    json_integer_value(k) == 1 ? "" : "s");
    k = json_object_get(schema, "items");
    if (!json_is_object(k) && !json_is_boolean(k))
        return 0;
    json_array_foreach(v, i, item) {
        size_t old = path_push_index(c, i);

        rc = validate(c, k, item, depth + 1);
        path_pop(c, old);
        if (rc)
            return rc;
    }
    return 0;
}

static int check_object(vctx *c, const json_t *schema, const json_t *v,
                        int depth)
{
    char subj[SUBJECT_SIZE], phrase[128];
    const json_t *req, *props, *addl, *name, *sub, *pv;
    const char *key;
    size_t i, old;
    int rc;

    props = json_object_get(schema, "properties");
    if (!json_is_object(props))
        props = NULL;

    req = json_object_get(schema, "required");
    json_array_foreach(req, i, name) {
        if (!json_is_string(name) ||
            json_object_get(v, json_string_value(name)))
            continue;
        old = path_push_key(c, json_string_value(name));
        sub = props ? json_object_get(props, json_string_value(name)) : NULL;
        types_phrase(json_is_object(sub) ? schema_types(sub) : 0, phrase,
                     sizeof(phrase));
        if (phrase[0])
            rc = fail(c, "%s is required and must be %s",
                      subject(c, subj, sizeof(subj)), phrase);
        else
            rc = fail(c, "%s is required", subject(c, subj, sizeof(subj)));
        path_pop(c, old);
        return rc;
    }

    if (props) {
        json_object_foreach((json_t *)props, key, sub) {
            if (!(pv = json_object_get(v, key)))
                continue;
            old = path_push_key(c, key);
            rc = validate(c, sub, pv, depth + 1);
            path_pop(c, old);
            if (rc)
                return rc;
        }
    }

    addl = json_object_get(schema, "additionalProperties");
    if (!json_is_false(addl) && !json_is_object(addl))
        return 0;
    json_object_foreach((json_t *)v, key, pv) {
        if (props && json_object_get(props, key))
            continue;
        old = path_push_key(c, key);
        if (json_is_false(addl))
            rc = fail(c, "unexpected property `%s`", c->path);
        else
            rc = validate(c, addl, pv, depth + 1);
        path_pop(c, old);
        if (rc)
            return rc;
    }
    return 0;
}

static int validate(vctx *c, const json_t *schema, const json_t *v,
                    int depth)
{
    char subj[SUBJECT_SIZE], phrase[128];
    const json_t *k;
    int bits, rc;

    if (depth > MAX_DEPTH)
        return fail(c, "arguments are nested too deeply (more than %d "
                    "levels)", MAX_DEPTH);
    /* Boolean schemas: true accepts anything, false nothing. */
    if (json_is_true(schema))
        return 0;
    if (json_is_false(schema))
        return c->len ? fail(c, "%s is not allowed",
                             subject(c, subj, sizeof(subj)))
                      : fail(c, "no arguments are allowed");
    if (!json_is_object(schema))
        return 0;

    bits = schema_types(schema);
    if (bits && !value_matches(v, bits)) {
        if (c->len == 0 && bits == T_OBJECT)
            return fail(c, "arguments must be a JSON object");
        types_phrase(bits, phrase, sizeof(phrase));
        return fail(c, "%s must be %s, got %s",
                    subject(c, subj, sizeof(subj)), phrase, value_kind(v));
    }

    k = json_object_get(schema, "enum");
    if (json_is_array(k)) {
        size_t i;
        const json_t *o;
        int found = 0;

        json_array_foreach(k, i, o) {
            if (values_equal(o, v)) {
                found = 1;
                break;
            }
        }
        if (!found)
            return fail_enum(c, k);
    }
    k = json_object_get(schema, "const");
    if (k && !values_equal(k, v))
        return fail_const(c, k);

    switch (json_typeof(v)) {
    case JSON_INTEGER:
    case JSON_REAL: rc = check_number(c, schema, v); break;
    case JSON_STRING: rc = check_string(c, schema, v); break;
    case JSON_ARRAY: rc = check_array(c, schema, v, depth); break;
    case JSON_OBJECT: rc = check_object(c, schema, v, depth); break;
    default: rc = 0; break;
    }
    return rc;
}

int loom_schema_validate(const json_t *schema, const json_t *value,
                         char **msg)
{
    vctx *c;
    int rc;

    if (msg)
        *msg = NULL;
    if (!schema)
        return 0;
    if (!value)
        return loom__error_set(LOOM_EINVALID, "value must not be NULL");
    /* The path buffer is a bit large for the stack of a tool thread. */
    c = calloc(1, sizeof(*c));
    if (!c)
        return loom__error_oom();
    loom_buf_init(&c->msg, 8192);

    rc = validate(c, schema, value, 1);
    if (c->oom) {
        rc = loom__error_oom();
        goto cleanup;
    }
    if (rc == 0)
        goto cleanup;
    loom__error_set(LOOM_EINVALID, "%s", loom_buf_cstr(&c->msg));
    if (msg && !(*msg = loom_buf_detach(&c->msg)))
        rc = loom__error_oom();

cleanup:
    loom_buf_free(&c->msg);
    free(c);
    return rc;
}
