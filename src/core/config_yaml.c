/*
 * Configuration: reading YAML into a loom_config. libyaml reads the text
 * twice: an event pass that checks syntax, the document count and the
 * nesting depth before anything is built, then the document API, whose
 * nodes carry the line numbers every message needs ("loom.yaml:12:
 * agents.helper.max_iterations: ..."). Each mapping with fixed keys is a
 * table of fields (name, type, place in the struct, limits, flags) read
 * by one walker, which reports unknown and duplicate keys, wrong types
 * and out-of-range values; what a type cannot say is a small handler
 * beside its table. The top-level sections are read in a fixed order
 * (providers, routing, models, agents, default_agent, ...) so references
 * are checked as they are read, with the line of the value that refers.
 * ${VAR} interpolation is applied to scalar values (not keys) before they
 * are converted to numbers or booleans. Limits besides the 4 MiB checked
 * by config.c: 64 levels of nesting, 100,000 visited nodes and 16 MiB of
 * scalar text (the last two bound what aliases and ${VAR} expand into).
 *
 * Every error is added to the load's list (config_errors.c) and reading
 * goes on where a mistake can be stepped over: a bad value is skipped
 * (the field keeps its default), an unknown or repeated key too, a bad
 * entry of a list or a named mapping, and the next sibling is read. A
 * limit crossed, a YAML syntax error or a failed allocation stops the
 * load. Checks that compare fields (the reasoning controls against the
 * capabilities, the retry delays, a base URL that depends on the kind)
 * run only when the fields they compare were read without error, so one
 * mistake is not reported twice under other names.
 */
#include "core/config_internal.h"
#include "core/error.h"
#include "loom/buf.h"
#include "loom/config.h"
#include "loom/log.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#define CONFIG_MAX_DEPTH 64
#define CONFIG_MAX_NODES 100000
#define CONFIG_MAX_TEXT ((size_t)16 << 20)
#define KEY_LEN 256 /* dotted key paths in messages (cut when longer) */

#define TIMEOUT_MIN 1L
#define TIMEOUT_MAX 3600000L
#define TOKENS_MAX 1000000000L

/* State of one file being read into cfg. */
typedef struct {
    const char *name; /* file name used in messages */
    yaml_document_t *doc;
    loom_config *cfg;
    loom__config_errors *errs; /* every error found */
    size_t nodes; /* nodes visited; an alias counts every time */
    size_t text;  /* bytes of scalar text produced */
    size_t outer; /* errors before the enclosing section was read */
} loader;

/* One entry of a mapping whose keys the user chooses (names). */
typedef struct {
    const char *name;
    yaml_node_t *key;
    yaml_node_t *value;
} entry;

/* ---- the tables' shape ------------------------------------------------- */

/*
 * A section is a mapping with fixed keys (log, server, a provider, a
 * model, an agent...), described by a table of fields in the order its
 * keys are listed in messages. walk() checks the keys, then reads each
 * field into the struct the section fills (a field's off is its place in
 * it) with the field's type, limits and flags. What a type cannot say is
 * a small handler (T_FN) or a section hook, next to the table that uses
 * it.
 */
typedef enum {
    T_BOOL,    /* int: true/false, yes/no, on/off */
    T_INT,     /* int in [min, max] */
    T_LONG,    /* long in [min, max] */
    T_PRICE,   /* int64_t: dollars per million tokens, exactly */
    T_STR,     /* char *: replaced when given, kept on null */
    T_SECTION, /* a nested section (sub) over the struct at off */
    T_LIST,    /* named entries (list) into an array of the config */
    T_FN,      /* a handler (fn) */
} field_type;

enum {
    F_REQUIRED = 1 << 0,   /* T_STR: absent or null is an error, at the
                              line of the section's key */
    F_EMPTY_NULL = 1 << 1, /* T_STR: "" counts as null (and a missing
                              required value is reported where given) */
    F_NONEMPTY = 1 << 2,   /* T_STR: "" is an error */
    F_LOWER = 1 << 3,      /* T_STR: folded to lower case first */
    F_UPPER = 1 << 4,      /* T_STR: folded to upper case first */
    F_MODEL = 1 << 5,      /* T_STR: a model name that must resolve */
    F_ALWAYS = 1 << 6,     /* T_FN: called with n NULL when absent */
    F_NEGATE = 1 << 7,     /* T_BOOL: the int holds the opposite (a
                              `store_x: false` key into an omit_x field) */
};

#define MAX_FIELDS 40 /* fields of the longest section */
#define PASSES 3      /* fields are read in passes 0, 1 and 2 */

typedef struct field field;
typedef struct section section;
typedef struct list_spec list_spec;

/* A section being read: what hooks and handlers see. */
typedef struct {
    loader *ld;
    const section *sec;
    const yaml_node_t *map;     /* the mapping, or a null node */
    const char *key;            /* its dotted path; NULL at the top */
    size_t line;                /* where a missing key is reported */
    size_t errors0;             /* errors before this section */
    void *obj;                  /* the struct the fields fill */
    yaml_node_t *v[MAX_FIELDS]; /* each field's value; NULL when absent */
} walk_ctx;

/* Reads n (NULL only for F_ALWAYS) at path key into w->obj. */
typedef int (*field_fn)(walk_ctx *w, const field *f, const yaml_node_t *n,
                        const char *key);

struct field {
    const char *name;
    field_type type;
    unsigned flags;
    unsigned pass;               /* read in this pass, then table order */
    size_t off;                  /* where in the section's struct */
    long min, max;               /* T_INT, T_LONG */
    const char *what;            /* T_STR: what a wrong type is told it
                                    must be; default "a string" */
    const char *const *choices;  /* T_STR: the values accepted... */
    int (*valid)(const char *s); /* ...or a test of them */
    const char *expect;          /* what valid accepts, for messages */
    const char *hint;            /* F_REQUIRED: said after the message */
    const section *sub;          /* T_SECTION */
    const list_spec *list;       /* T_LIST */
    field_fn fn;                 /* T_FN */
};

struct section {
    const field *fields;
    size_t len;
    int (*pre)(walk_ctx *w);  /* after the keys, before the fields */
    int (*post)(walk_ctx *w); /* after the fields */
};

/* Named entries (models, agents, http_tools) into an array of the
 * config: items and count are the offsets of the array and its length. */
struct list_spec {
    const char *what; /* names are checked as "<what> name"; NULL: by init */
    int dots;         /* names may hold '.' */
    size_t size, items, count;
    /* Defaults of one entry at obj, before its section is read. */
    int (*init)(loader *ld, const entry *e, const char *key, void *obj);
    const section *sec;
};

/* Table entries: a macro gives the name, type and place of a field, and
 * designators after it add the rest. */
#define AT(T, m) .off = offsetof(T, m)
#define K_BOOL(n, T, m) .name = (n), .type = T_BOOL, AT(T, m)
#define K_INT(n, T, m, lo, hi)                                                 \
    .name = (n), .type = T_INT, AT(T, m), .min = (lo), .max = (hi)
#define K_LONG(n, T, m, lo, hi)                                                \
    .name = (n), .type = T_LONG, AT(T, m), .min = (lo), .max = (hi)
#define K_PRICE(n, T, m) .name = (n), .type = T_PRICE, AT(T, m)
#define K_STR(n, T, m, w) .name = (n), .type = T_STR, AT(T, m), .what = (w)
#define K_SUB(n, s) .name = (n), .type = T_SECTION, .sub = &(s)
#define K_LIST(n, l) .name = (n), .type = T_LIST, .list = &(l)
#define K_FN(n, f) .name = (n), .type = T_FN, .fn = (f)
#define SECTION(fields, pre, post)                                             \
    {                                                                          \
        fields, sizeof(fields) / sizeof(*(fields)), pre, post                  \
    }

/* ---- small helpers ---------------------------------------------------- */

static size_t line_of(const yaml_node_t *n)
{
    return n->start_mark.line + 1;
}

static const char *kind_name(const yaml_node_t *n)
{
    switch (n->type) {
    case YAML_MAPPING_NODE:
        return "a mapping";
    case YAML_SEQUENCE_NODE:
        return "a list";
    default:
        return "a scalar";
    }
}

/* Appends s to the string in dst (cap bytes), cut when full: key paths
 * in messages may be cut but never overflow. Not snprintf, whose intended
 * truncation GCC warns about. */
static void key_append(char *dst, size_t cap, const char *s)
{
    size_t len = strlen(dst), n = strlen(s);

    if (n > cap - 1 - len)
        n = cap - 1 - len;
    memcpy(dst + len, s, n);
    dst[len + n] = '\0';
}

/* "parent.child", or child alone at the top. */
static void join_key(char *dst, size_t cap, const char *parent,
                     const char *child)
{
    dst[0] = '\0';
    if (parent && *parent) {
        key_append(dst, cap, parent);
        key_append(dst, cap, ".");
    }
    key_append(dst, cap, child);
}

/* "parent[i]", for list items. */
static void index_key(char *dst, size_t cap, const char *parent, size_t i)
{
    char num[32];

    snprintf(num, sizeof(num), "[%zu]", i);
    dst[0] = '\0';
    key_append(dst, cap, parent);
    key_append(dst, cap, num);
}

/* Adds the error "<file>:<line>: <key>: <problem>" (no key part when key
 * is NULL or empty) to the load's list. Returns code. */
static int fail_at(const loader *ld, int code, size_t line, const char *key,
                   const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static int fail_at(const loader *ld, int code, size_t line, const char *key,
                   const char *fmt, ...)
{
    char msg[768];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (key && *key)
        return loom__config_errors_add(ld->errs, code, "%s:%zu: %s: %s",
                                       ld->name, line, key, msg);
    return loom__config_errors_add(ld->errs, code, "%s:%zu: %s", ld->name, line,
                                   msg);
}

/* Whether reading may go on past rc: a bad value, key or entry (already
 * in the list) can be skipped; a limit crossed or a failed allocation
 * cannot. */
static int go_on(const loader *ld, int rc)
{
    return rc == LOOM_EINVALID && ld->errs->count > 0;
}

/* A section's keys, for messages. */
static const char *known_names(char *dst, size_t cap, const section *sec)
{
    dst[0] = '\0';
    for (size_t i = 0; i < sec->len; i++)
        loom__config_names_add(dst, cap, sec->fields[i].name);
    return dst;
}

static const char *agent_names(char *dst, size_t cap, const loom_config *cfg)
{
    dst[0] = '\0';
    for (size_t i = 0; i < cfg->agents_len; i++)
        loom__config_names_add(dst, cap, cfg->agents[i].name);
    return cfg->agents_len ? dst : "none";
}

/* ---- reading scalars -------------------------------------------------- */

static yaml_node_t *node_at(const loader *ld, int id)
{
    return yaml_document_get_node(ld->doc, id);
}

/* Counts a visited node against CONFIG_MAX_NODES. */
static int visit(loader *ld, const yaml_node_t *n)
{
    if (++ld->nodes > CONFIG_MAX_NODES)
        return fail_at(ld, LOOM_ETOOLARGE, line_of(n), NULL,
                       "the config expands to more than %d nodes (check "
                       "aliases)",
                       CONFIG_MAX_NODES);
    return 0;
}

/* A plain "", "~" or "null": the key is treated as absent. */
static int is_null(const yaml_node_t *n)
{
    const char *v;
    size_t len;

    if (n->type != YAML_SCALAR_NODE ||
        n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return 0;
    v = (const char *)n->data.scalar.value;
    len = n->data.scalar.length;
    return len == 0 || (len == 1 && v[0] == '~') ||
           (len == 4 &&
            (memcmp(v, "null", 4) == 0 || memcmp(v, "Null", 4) == 0 ||
             memcmp(v, "NULL", 4) == 0));
}

static int is_var_char(char c, int first)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
           (!first && c >= '0' && c <= '9');
}

/*
 * Expands ${VAR} and ${VAR:-default} in a scalar's text into *out; "$${"
 * is a literal "${" and any other '$' is kept, and so is ${user.NAME}. The
 * default (up to the first '}') is used when VAR is unset or empty. Written by
 * hand because neither libyaml nor libc offers it (wordexp(3) would also run
 * commands and split words).
 */
static int interpolate(loader *ld, const yaml_node_t *n, const char *key,
                       char **out)
{
    const char *s = (const char *)n->data.scalar.value;
    size_t len = n->data.scalar.length, i = 0;
    loom_buf b = LOOM_BUF_INIT(CONFIG_MAX_TEXT);
    char *var = NULL, tmp[64];
    int rc = 0;

    *out = NULL;
    if (memchr(s, '\0', len)) {
        rc = fail_at(ld, LOOM_EINVALID, line_of(n), key,
                     "must not contain NUL characters");
        goto cleanup;
    }
    while (i < len) {
        const char *dollar = memchr(s + i, '$', len - i);
        size_t j = dollar ? (size_t)(dollar - s) : len;
        size_t start, end, name_end;
        const char *close, *val;

        if ((rc = loom_buf_put(&b, s + i, j - i)) != 0)
            goto cleanup;
        if ((i = j) >= len)
            break;
        if (i + 2 < len && s[i + 1] == '$' && s[i + 2] == '{') {
            if ((rc = loom_buf_put(&b, "${", 2)) != 0)
                goto cleanup;
            i += 3;
            continue;
        }
        if (i + 1 >= len || s[i + 1] != '{') {
            if ((rc = loom_buf_putc(&b, '$')) != 0)
                goto cleanup;
            i++;
            continue;
        }
        start = i + 2;
        close = memchr(s + start, '}', len - start);
        if (!close) {
            rc = fail_at(ld, LOOM_EINVALID, line_of(n), key,
                         "unterminated '${' (no closing '}'; write '$${' "
                         "for a literal '${')");
            goto cleanup;
        }
        end = (size_t)(close - s);
        /* ${user.NAME} names a user's secret, resolved at each call (an
         * MCP server's headers, docs/mcp.md): kept as written. */
        if (end - start > 5 && strncmp(s + start, "user.", 5) == 0) {
            if ((rc = loom_buf_put(&b, s + i, end + 1 - i)) != 0)
                goto cleanup;
            i = end + 1;
            continue;
        }
        name_end = start;
        while (name_end < end && is_var_char(s[name_end], name_end == start))
            name_end++;
        if (name_end == start ||
            (name_end < end && (s[name_end] != ':' || name_end + 1 >= end ||
                                s[name_end + 1] != '-'))) {
            snprintf(tmp, sizeof(tmp), "%.*s",
                     (int)(end - start < 40 ? end - start : 40), s + start);
            for (char *c = tmp; *c; c++)
                if ((unsigned char)*c < 0x20 || *c == 0x7f)
                    *c = '?';
            rc = fail_at(ld, LOOM_EINVALID, line_of(n), key,
                         "bad variable reference '${%s}' (use ${NAME} or "
                         "${NAME:-default})",
                         tmp);
            goto cleanup;
        }
        if (!(var = strndup(s + start, name_end - start))) {
            rc = loom__error_oom();
            goto cleanup;
        }
        val = getenv(var);
        if (name_end < end) {
            if (!val || !*val) {
                val = NULL;
                rc = loom_buf_put(&b, s + name_end + 2, end - name_end - 2);
            }
        } else if (!val) {
            rc = fail_at(ld, LOOM_EINVALID, line_of(n), key,
                         "environment variable %s is not set (use "
                         "${%s:-default} for a default)",
                         var, var);
            goto cleanup;
        }
        if (!rc && val)
            rc = loom_buf_puts(&b, val);
        free(var);
        var = NULL;
        if (rc)
            goto cleanup;
        i = end + 1;
    }
    if (b.len > CONFIG_MAX_TEXT - ld->text) {
        rc = LOOM_ETOOLARGE;
        goto cleanup;
    }
    ld->text += b.len;
    if (!(*out = loom_buf_detach(&b)))
        rc = loom__error_oom();

cleanup:
    if (rc == LOOM_ETOOLARGE)
        rc = fail_at(ld, LOOM_ETOOLARGE, line_of(n), key,
                     "the config expands to more than %zu MiB of text",
                     CONFIG_MAX_TEXT >> 20);
    free(var);
    loom_buf_free(&b);
    return rc;
}

/* The interpolated text of a scalar; *out NULL for a null. `what` says
 * what was expected, for the wrong-type message. */
static int get_str(loader *ld, const yaml_node_t *n, const char *key,
                   const char *what, char **out)
{
    int rc;

    *out = NULL;
    if ((rc = visit(ld, n)) != 0)
        return rc;
    if (n->type != YAML_SCALAR_NODE)
        return fail_at(ld, LOOM_EINVALID, line_of(n), key, "must be %s, got %s",
                       what, kind_name(n));
    if (is_null(n))
        return 0;
    return interpolate(ld, n, key, out);
}

/* Reads an integer in [min, max] into *out; a null keeps *out. Quoted
 * digits are accepted so "${N}" works in any style. */
static int get_long(loader *ld, const yaml_node_t *n, const char *key, long min,
                    long max, long *out)
{
    char what[96], tmp[64], *s = NULL, *end;
    long v;
    int rc;

    snprintf(what, sizeof(what), "an integer from %ld to %ld", min, max);
    if (!n)
        return 0;
    if ((rc = get_str(ld, n, key, what, &s)) != 0 || !s)
        return rc;
    errno = 0;
    v = strtol(s, &end, 10);
    if (*s == '\0' || *end != '\0' || errno == ERANGE || v < min || v > max ||
        !(s[0] == '-' || s[0] == '+' || (s[0] >= '0' && s[0] <= '9')))
        rc = fail_at(ld, LOOM_EINVALID, line_of(n), key, "must be %s, got '%s'",
                     what, loom__config_shown(tmp, sizeof(tmp), s));
    else
        *out = v;
    free(s);
    return rc;
}

static int get_int(loader *ld, const yaml_node_t *n, const char *key, long min,
                   long max, int *out)
{
    long v = *out;
    int rc = get_long(ld, n, key, min, max, &v);

    if (rc == 0)
        *out = (int)v;
    return rc;
}

/* true/false (also yes/no, on/off, any case); a null keeps *out. */
static int get_bool(loader *ld, const yaml_node_t *n, const char *key, int *out)
{
    static const char *const yes[] = {"true", "yes", "on"};
    static const char *const no[] = {"false", "no", "off"};
    char tmp[64], *s = NULL;
    int rc;

    if (!n)
        return 0;
    if ((rc = get_str(ld, n, key, "true or false", &s)) != 0 || !s)
        return rc;
    for (size_t i = 0; i < 3; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = 1;
            goto cleanup;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = 0;
            goto cleanup;
        }
    }
    rc = fail_at(ld, LOOM_EINVALID, line_of(n), key,
                 "must be true or false, got '%s'",
                 loom__config_shown(tmp, sizeof(tmp), s));

cleanup:
    free(s);
    return rc;
}

/* One price, exactly (loom_price_parse); a null keeps *out. */
static int get_dollars(loader *ld, const yaml_node_t *n, const char *key,
                       const char *expected, int64_t *out)
{
    char tmp[64], why[256], *s = NULL;
    int rc;

    if (!n)
        return 0;
    if ((rc = get_str(ld, n, key, expected, &s)) != 0 || !s)
        return rc;
    if (loom_price_parse(out, s) != 0) {
        snprintf(why, sizeof(why), "%s", loom_error_last());
        rc = fail_at(ld, LOOM_EINVALID, line_of(n), key, "%s, got '%s'", why,
                     loom__config_shown(tmp, sizeof(tmp), s));
    }
    free(s);
    return rc;
}

static int get_price(loader *ld, const yaml_node_t *n, const char *key,
                     int64_t *out)
{
    return get_dollars(ld, n, key, "a price in dollars per million tokens",
                       out);
}

/* ---- reading mappings ------------------------------------------------- */

/* The key node's text; mapping keys must be plain strings without NUL. */
static int key_text(loader *ld, const yaml_node_t *k, const char *key,
                    const char **out)
{
    int rc;

    if ((rc = visit(ld, k)) != 0)
        return rc;
    if (k->type != YAML_SCALAR_NODE)
        return fail_at(ld, LOOM_EINVALID, line_of(k), key,
                       "keys must be strings, got %s", kind_name(k));
    if (strlen((const char *)k->data.scalar.value) != k->data.scalar.length)
        return fail_at(ld, LOOM_EINVALID, line_of(k), key,
                       "keys must not contain NUL characters");
    *out = (const char *)k->data.scalar.value;
    return 0;
}

/*
 * Checks a section's keys: each must be one of its fields, given once.
 * vals gets each field's value in table order (NULL for a key not
 * given). A null node is an empty mapping. An unknown key is skipped and
 * a repeated one keeps its first value, both reported; a node that is
 * not a mapping is an error.
 */
static int read_fields(loader *ld, const yaml_node_t *map, const char *key,
                       const section *sec, yaml_node_t **vals)
{
    char list[512], tmp[64];
    int rc;

    for (size_t i = 0; i < sec->len; i++)
        vals[i] = NULL;
    if ((rc = visit(ld, map)) != 0 || is_null(map))
        return rc;
    if (map->type != YAML_MAPPING_NODE)
        return fail_at(ld, LOOM_EINVALID, line_of(map), key,
                       "must be a mapping, got %s", kind_name(map));
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start;
         p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *k = node_at(ld, p->key);
        const char *name;
        size_t i;

        if ((rc = key_text(ld, k, key, &name)) != 0) {
            if (go_on(ld, rc))
                continue;
            return rc;
        }
        for (i = 0; i < sec->len && strcmp(sec->fields[i].name, name) != 0; i++)
            ;
        if (i == sec->len)
            fail_at(ld, LOOM_EINVALID, line_of(k), key,
                    "unknown key '%s' (known: %s)",
                    loom__config_shown(tmp, sizeof(tmp), name),
                    known_names(list, sizeof(list), sec));
        else if (vals[i])
            fail_at(ld, LOOM_EINVALID, line_of(k), key, "duplicate key '%s'",
                    name);
        else
            vals[i] = node_at(ld, p->value);
    }
    return 0;
}

/*
 * The entries of a mapping whose keys are names the user picks (providers,
 * agents, headers...): keys are checked to be strings and unique; an entry
 * whose key is not, or repeats one, is reported and left out. *out is
 * malloc'd (NULL when empty). A null node is an empty mapping.
 */
static int read_entries(loader *ld, const yaml_node_t *map, const char *key,
                        entry **out, size_t *len)
{
    json_t *seen = NULL;
    entry *v = NULL;
    size_t n = 0;
    int rc;

    *out = NULL;
    *len = 0;
    if ((rc = visit(ld, map)) != 0 || is_null(map))
        return rc;
    if (map->type != YAML_MAPPING_NODE)
        return fail_at(ld, LOOM_EINVALID, line_of(map), key,
                       "must be a mapping, got %s", kind_name(map));
    n = (size_t)(map->data.mapping.pairs.top - map->data.mapping.pairs.start);
    if (n == 0)
        return 0;
    /* A jansson object as a hash set keeps duplicate checks linear. */
    if (!(v = calloc(n, sizeof(*v))) || !(seen = json_object())) {
        rc = loom__error_oom();
        goto cleanup;
    }
    for (size_t i = 0, kept = 0; i < n; i++) {
        yaml_node_pair_t *p = map->data.mapping.pairs.start + i;
        entry *e = &v[kept];
        char tmp[64];

        e->key = node_at(ld, p->key);
        e->value = node_at(ld, p->value);
        if ((rc = key_text(ld, e->key, key, &e->name)) != 0) {
            if (go_on(ld, rc))
                continue;
            goto cleanup;
        }
        if (json_object_get(seen, e->name)) {
            fail_at(ld, LOOM_EINVALID, line_of(e->key), key,
                    "duplicate key '%s'",
                    loom__config_shown(tmp, sizeof(tmp), e->name));
            continue;
        }
        if (json_object_set_new(seen, e->name, json_true()) != 0) {
            rc = loom__error_oom();
            goto cleanup;
        }
        *len = ++kept;
    }
    rc = 0;
    if (*len > 0) {
        *out = v;
        v = NULL;
    }

cleanup:
    json_decref(seen);
    free(v);
    return rc;
}

/* ---- free-form settings (headers, tools) ------------------------------ */

/* Whether a plain scalar's text is a JSON-representable number. */
static json_t *plain_number(const char *s)
{
    const char *p = s;
    char *end;
    int digits = 0, other = 0;

    if (*p == '-' || *p == '+')
        p++;
    for (; *p; p++) {
        if (*p >= '0' && *p <= '9')
            digits = 1;
        else if (*p == '.' || *p == 'e' || *p == 'E' || *p == '-' || *p == '+')
            other = 1;
        else
            return NULL;
    }
    if (!digits)
        return NULL;
    if (!other) {
        long long v;
        errno = 0;
        v = strtoll(s, &end, 10);
        if (*end == '\0' && errno != ERANGE)
            return json_integer(v);
    }
    {
        double d;
        errno = 0;
        d = strtod(s, &end);
        if (*end == '\0' && isfinite(d))
            return json_real(d);
    }
    return NULL;
}

/*
 * Converts a node to JSON. Plain scalars follow YAML 1.2's core schema
 * (null, true/false, integers, floats, else a string) after
 * interpolation; quoted scalars are strings. depth is the node's nesting
 * level from the top of the file, checked again here because aliases can
 * nest deeper than the text does.
 */
static int to_json(loader *ld, const yaml_node_t *n, const char *key, int depth,
                   json_t **out)
{
    json_t *v = NULL, *item = NULL;
    entry *es = NULL;
    size_t len = 0;
    char sub[KEY_LEN], *s = NULL;
    int rc = 0;

    *out = NULL;
    if (n->type != YAML_SCALAR_NODE && depth > CONFIG_MAX_DEPTH)
        return fail_at(ld, LOOM_ETOOLARGE, line_of(n), key,
                       "nesting deeper than %d levels", CONFIG_MAX_DEPTH);
    if (n->type == YAML_SCALAR_NODE) {
        if ((rc = visit(ld, n)) != 0)
            return rc;
        if (is_null(n)) {
            *out = json_null();
            return 0;
        }
        if ((rc = interpolate(ld, n, key, &s)) != 0)
            return rc;
        if (n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE) {
            if (strcmp(s, "true") == 0 || strcmp(s, "True") == 0 ||
                strcmp(s, "TRUE") == 0)
                v = json_true();
            else if (strcmp(s, "false") == 0 || strcmp(s, "False") == 0 ||
                     strcmp(s, "FALSE") == 0)
                v = json_false();
            else
                v = plain_number(s);
        }
        if (!v && !(v = json_string(s)))
            rc = fail_at(ld, LOOM_EINVALID, line_of(n), key,
                         "is not valid UTF-8");
        free(s);
        *out = v;
        return rc;
    }
    if (n->type == YAML_SEQUENCE_NODE) {
        size_t i = 0;

        if ((rc = visit(ld, n)) != 0)
            return rc;
        if (!(v = json_array()))
            return loom__error_oom();
        for (yaml_node_item_t *it = n->data.sequence.items.start;
             it < n->data.sequence.items.top; it++, i++) {
            index_key(sub, sizeof(sub), key, i);
            rc = to_json(ld, node_at(ld, *it), sub, depth + 1, &item);
            if (rc != 0)
                goto cleanup;
            if (json_array_append_new(v, item) != 0) {
                rc = loom__error_oom();
                goto cleanup;
            }
        }
        *out = v;
        return 0;
    }
    if ((rc = read_entries(ld, n, key, &es, &len)) != 0)
        return rc;
    if (!(v = json_object())) {
        rc = loom__error_oom();
        goto cleanup;
    }
    for (size_t i = 0; i < len; i++) {
        join_key(sub, sizeof(sub), key, es[i].name);
        if ((rc = to_json(ld, es[i].value, sub, depth + 1, &item)) != 0)
            goto cleanup;
        if (json_object_set_new(v, es[i].name, item) != 0) {
            rc = loom__error_oom();
            goto cleanup;
        }
    }
    *out = v;
    v = NULL;

cleanup:
    free(es);
    if (rc)
        json_decref(v);
    return rc;
}

/* ---- the walker --------------------------------------------------------- */

/*
 * Checks a name against loom's rule ([a-zA-Z0-9_-]{1,64}, and '.' too
 * when dots): 0, or LOOM_EINVALID at line and key naming what it is.
 */
static int check_name(const loader *ld, size_t line, const char *key,
                      const char *name, int dots, const char *what)
{
    char tmp[64];

    if (name && loom__config_valid_name(name, dots))
        return 0;
    return fail_at(ld, LOOM_EINVALID, line, key,
                   "'%s' is not a valid %s name (%s)",
                   name ? loom__config_shown(tmp, sizeof(tmp), name) : "null",
                   what, dots ? "[a-zA-Z0-9_.-]{1,64}" : "[a-zA-Z0-9_-]{1,64}");
}

/* Where field f lives in the struct being filled. */
static void *at(const walk_ctx *w, const field *f)
{
    return (char *)w->obj + f->off;
}

/* The value given for the field called name, NULL when absent. */
static const yaml_node_t *given(const walk_ctx *w, const char *name)
{
    for (size_t i = 0; i < w->sec->len; i++)
        if (strcmp(w->sec->fields[i].name, name) == 0)
            return w->v[i];
    return NULL;
}

static int in_list(const char *s, const char *const *v)
{
    for (; *v; v++)
        if (strcmp(*v, s) == 0)
            return 1;
    return 0;
}

/* "a, b or c", for messages. */
static const char *choice_text(char *dst, size_t cap, const char *const *v)
{
    dst[0] = '\0';
    for (size_t i = 0; v[i]; i++) {
        if (i > 0)
            key_append(dst, cap, v[i + 1] ? ", " : " or ");
        key_append(dst, cap, v[i]);
    }
    return dst;
}

static void fold_case(char *s, unsigned flags)
{
    for (; *s; s++) {
        if ((flags & F_LOWER) && *s >= 'A' && *s <= 'Z')
            *s = (char)(*s - 'A' + 'a');
        else if ((flags & F_UPPER) && *s >= 'a' && *s <= 'z')
            *s = (char)(*s - 'a' + 'A');
    }
}

/*
 * A T_STR field: the text replaces what the struct holds when given, a
 * null keeps it (a default, or NULL). Checked in this order: required,
 * not empty, the accepted values (after folding case), and for F_MODEL
 * that the name resolves.
 */
static int read_str(walk_ctx *w, const field *f, const yaml_node_t *n,
                    const char *key)
{
    char **dst = at(w, f), *s = NULL, tmp[64], why[512];
    int rc;

    if (n &&
        (rc = get_str(w->ld, n, key, f->what ? f->what : "a string", &s)) != 0)
        return rc;
    if (s && !*s && (f->flags & F_EMPTY_NULL)) {
        free(s);
        s = NULL;
    }
    if (!s) {
        if ((f->flags & F_REQUIRED) && !*dst)
            return fail_at(
                w->ld, LOOM_EINVALID,
                n && (f->flags & F_EMPTY_NULL) ? line_of(n) : w->line, w->key,
                "missing required key '%s'%s", f->name, f->hint ? f->hint : "");
        return 0;
    }
    fold_case(s, f->flags);
    if ((f->flags & F_NONEMPTY) && !*s)
        rc =
            fail_at(w->ld, LOOM_EINVALID, line_of(n), key, "must not be empty");
    else if ((f->choices && !in_list(s, f->choices)) ||
             (f->valid && !f->valid(s)))
        rc = fail_at(
            w->ld, LOOM_EINVALID, line_of(n), key, "must be %s, got '%s'",
            f->choices ? choice_text(why, sizeof(why), f->choices) : f->expect,
            loom__config_shown(tmp, sizeof(tmp), s));
    else if ((f->flags & F_MODEL) &&
             loom__config_model_unresolved(w->ld->cfg, s, why, sizeof(why)))
        rc = fail_at(w->ld, LOOM_EINVALID, line_of(n), key, "%s", why);
    else
        rc = 0;
    if (rc) {
        free(s);
        return rc;
    }
    free(*dst);
    *dst = s;
    return 0;
}

static int walk(loader *ld, const yaml_node_t *map, const char *key,
                size_t line, const section *sec, void *obj);
static int walk_list(loader *ld, const yaml_node_t *n, const char *key,
                     const list_spec *list, void *base);

/* Reads field f from n (NULL when absent) at path key. */
static int read_field(walk_ctx *w, const field *f, const yaml_node_t *n,
                      const char *key)
{
    switch (f->type) {
    case T_BOOL:
        if (f->flags & F_NEGATE) {
            int *dst = at(w, f), v = !*dst, rc = get_bool(w->ld, n, key, &v);
            if (rc == 0)
                *dst = !v;
            return rc;
        }
        return get_bool(w->ld, n, key, at(w, f));
    case T_INT:
        return get_int(w->ld, n, key, f->min, f->max, at(w, f));
    case T_LONG:
        return get_long(w->ld, n, key, f->min, f->max, at(w, f));
    case T_PRICE:
        return get_price(w->ld, n, key, at(w, f));
    case T_STR:
        return read_str(w, f, n, key);
    case T_SECTION:
        return n ? walk(w->ld, n, key, line_of(n), f->sub, at(w, f)) : 0;
    case T_LIST:
        return n ? walk_list(w->ld, n, key, f->list, w->ld->cfg) : 0;
    case T_FN:
        return n || (f->flags & F_ALWAYS) ? f->fn(w, f, n, key) : 0;
    }
    return 0;
}

/* Whether no error was found since the enclosing section began: the
 * hooks compare fields, which is only sound when all were read. */
static int clean(const walk_ctx *w)
{
    return w->ld->errs->count == w->ld->outer;
}

/*
 * Reads the mapping map (path key; line is where a missing key is
 * reported) into obj as section sec says: the keys first (unknown and
 * duplicate keys are errors), then the pre hook, the fields pass by pass
 * in table order, and the post hook. A field in error is skipped and the
 * next one read; the hooks run only when nothing failed since the
 * enclosing section began. LOOM_EINVALID when anything failed here.
 */
static int walk(loader *ld, const yaml_node_t *map, const char *key,
                size_t line, const section *sec, void *obj)
{
    walk_ctx w = {ld, sec, map, key, line, ld->errs->count, obj, {0}};
    size_t outer = ld->outer;
    char sub[KEY_LEN];
    int rc;

    if (sec->len > MAX_FIELDS)
        return loom__error_set(LOOM_ERROR, "%s: config table too long",
                               key ? key : "top level");
    if ((rc = read_fields(ld, map, key, sec, w.v)) != 0 ||
        (sec->pre && clean(&w) && (rc = sec->pre(&w)) != 0))
        return rc;
    ld->outer = w.errors0;
    for (unsigned pass = 0; pass < PASSES; pass++) {
        for (size_t i = 0; i < sec->len; i++) {
            if (sec->fields[i].pass != pass)
                continue;
            join_key(sub, sizeof(sub), key, sec->fields[i].name);
            rc = read_field(&w, &sec->fields[i], w.v[i], sub);
            if (rc != 0 && !go_on(ld, rc)) {
                ld->outer = outer;
                return rc;
            }
        }
    }
    ld->outer = outer;
    if (sec->post && clean(&w) && (rc = sec->post(&w)) != 0)
        return rc;
    return ld->errs->count > w.errors0 ? LOOM_EINVALID : 0;
}

/*
 * Reads named entries (path key) into the array list describes in the
 * struct at base (the config, or an agent), each name checked, set to
 * its defaults by init and read as list->sec says. An entry with a bad
 * name is left out; one with a bad setting is kept (so what refers to it
 * still resolves) and the next one read.
 */
static int walk_list(loader *ld, const yaml_node_t *n, const char *key,
                     const list_spec *list, void *base)
{
    char *cfg = base, *items, sub[KEY_LEN];
    size_t *count = (size_t *)(void *)(cfg + list->count);
    entry *es = NULL;
    size_t len = 0, errors0 = ld->errs->count;
    int rc;

    if ((rc = read_entries(ld, n, key, &es, &len)) != 0 || len == 0)
        goto cleanup;
    if (!(items = calloc(len, list->size))) {
        rc = loom__error_oom();
        goto cleanup;
    }
    memcpy(cfg + list->items, &items, sizeof(items));
    for (size_t i = 0; i < len; i++) {
        void *obj = items + *count * list->size;

        if (list->what &&
            (rc = check_name(ld, line_of(es[i].key), key, es[i].name,
                             list->dots, list->what)) != 0)
            continue;
        /* Counted before reading so a half-built entry is freed too. */
        (*count)++;
        join_key(sub, sizeof(sub), key, es[i].name);
        if ((rc = list->init(ld, &es[i], sub, obj)) != 0) {
            if (!go_on(ld, rc))
                goto cleanup;
            /* init refuses a name before it allocates: drop the entry. */
            (*count)--;
            memset(obj, 0, list->size);
            continue;
        }
        rc = walk(ld, es[i].value, sub, line_of(es[i].key), list->sec, obj);
        if (rc != 0 && !go_on(ld, rc))
            goto cleanup;
    }
    rc = ld->errs->count > errors0 ? LOOM_EINVALID : 0;

cleanup:
    free(es);
    return rc;
}

/* Items of a list, 0 when n is not one. */
static size_t seq_len(const yaml_node_t *n)
{
    if (n->type != YAML_SEQUENCE_NODE)
        return 0;
    return (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
}

/* Judges one item s (NULL for a null) of a list of strings at path key;
 * repeat is set when an earlier item was the same. */
typedef int (*item_check)(walk_ctx *w, const yaml_node_t *item, const char *key,
                          const char *s, int repeat);

/*
 * A list of strings (what: "tool names") into *items (malloc'd) and
 * *len, each item read as item_what and judged by check; an item in
 * error is left out and the next one read. When lines is not NULL,
 * *lines (malloc'd) gets each kept item's line. A null keeps them.
 */
static int read_strings(walk_ctx *w, const yaml_node_t *n, const char *key,
                        const char *what, const char *item_what,
                        item_check check, char ***items, size_t *len,
                        size_t **lines)
{
    loader *ld = w->ld;
    json_t *seen = NULL;
    char sub[KEY_LEN], *s = NULL;
    size_t i = 0, errors0 = ld->errs->count;
    int rc;

    if ((rc = visit(ld, n)) != 0 || is_null(n))
        return rc;
    if (n->type != YAML_SEQUENCE_NODE)
        return fail_at(ld, LOOM_EINVALID, line_of(n), key,
                       "must be a list of %s, got %s", what, kind_name(n));
    if (seq_len(n) == 0)
        return 0;
    /* A jansson object as a hash set keeps repeat checks linear. */
    if (!(*items = calloc(seq_len(n), sizeof(**items))) ||
        (lines && !(*lines = calloc(seq_len(n), sizeof(**lines)))) ||
        !(seen = json_object())) {
        rc = loom__error_oom();
        goto cleanup;
    }
    for (yaml_node_item_t *it = n->data.sequence.items.start;
         it < n->data.sequence.items.top; it++, i++) {
        yaml_node_t *item = node_at(ld, *it);

        index_key(sub, sizeof(sub), key, i);
        if ((rc = get_str(ld, item, sub, item_what, &s)) != 0 ||
            (rc = check(w, item, sub, s,
                        s && json_object_get(seen, s) != NULL)) != 0) {
            if (!go_on(ld, rc))
                goto cleanup;
            free(s);
            s = NULL;
            continue;
        }
        if (json_object_set_new_nocheck(seen, s, json_true()) != 0) {
            rc = loom__error_oom();
            goto cleanup;
        }
        if (lines)
            (*lines)[*len] = line_of(item);
        (*items)[(*len)++] = s;
        s = NULL;
    }
    rc = ld->errs->count > errors0 ? LOOM_EINVALID : 0;

cleanup:
    free(s);
    json_decref(seen);
    return rc;
}

/* ---- log, routing, server ----------------------------------------------- */

/* Both log settings are stored in lower case ("warning" stays "warning",
 * which loom_log_level_parse accepts) so callers can compare with
 * strcmp. */
static int log_level_ok(const char *s)
{
    return loom_log_level_parse(s) >= 0;
}

static const char *const log_formats[] = {"text", "json", NULL};

static const field log_fields[] = {
    {K_STR("level", loom_config, log_level, "a log level"), .flags = F_LOWER,
     .valid = log_level_ok, .expect = "debug, info, warn, error or off"},
    {K_STR("format", loom_config, log_format, "text or json"), .flags = F_LOWER,
     .choices = log_formats},
};
static const section log_section = SECTION(log_fields, NULL, NULL);

/* A routing policy (`routing:` at the top or in a model) over what the
 * struct holds: keys left out keep their value, so a model's policy
 * starts from the top-level one. */
static const field routing_fields[] = {
    {K_INT("retries", loom_routing_policy, retries, 0, 10)},
    {K_LONG("cooldown_ms", loom_routing_policy, cooldown_ms, 0, TIMEOUT_MAX)},
    {K_INT("failures_before_cooldown", loom_routing_policy,
           failures_before_cooldown, 1, 1000)},
};
static const section routing_section = SECTION(routing_fields, NULL, NULL);

/* "HOST:PORT": a non-empty host without spaces or '/', and a port
 * 0..65535 ("[::1]:80" keeps its brackets). */
static int valid_listen(const char *s)
{
    const char *colon = strrchr(s, ':');
    char *end;
    long port;

    if (!colon || colon == s || strpbrk(s, " \t/"))
        return 0;
    errno = 0;
    port = strtol(colon + 1, &end, 10);
    return colon[1] >= '0' && colon[1] <= '9' && *end == '\0' && errno == 0 &&
           port >= 0 && port <= 65535;
}

/* An origin as browsers send it: http(s)://host[:port], nothing after. */
static int origin_ok(walk_ctx *w, const yaml_node_t *item, const char *key,
                     const char *s, int repeat)
{
    const char *host = NULL;
    char tmp[64];

    (void)repeat;
    if (s && !strncmp(s, "https://", 8))
        host = s + 8;
    else if (s && !strncmp(s, "http://", 7))
        host = s + 7;
    if (host && *host && strlen(s) < 256 && !strpbrk(host, " \t\r\n/@?#*"))
        return 0;
    return fail_at(w->ld, LOOM_EINVALID, line_of(item), key,
                   "'%s' is not an origin (http://host[:port] or "
                   "https://host[:port], nothing after)",
                   s ? loom__config_shown(tmp, sizeof(tmp), s) : "null");
}

static int read_cors_origins(walk_ctx *w, const field *f, const yaml_node_t *n,
                             const char *key)
{
    loom_server_config *sc = w->obj;

    (void)f;
    return read_strings(w, n, key, "origins", "an origin", origin_ok,
                        &sc->cors_origins, &sc->cors_origins_len, NULL);
}

/* The server section (loom serve). Each limit has a floor that keeps the
 * server usable (a 1 KiB body, one run) and a ceiling against typos. */
#define S loom_server_config
static const field server_fields[] = {
    {K_STR("listen", S, listen, "HOST:PORT"), .valid = valid_listen,
     .expect = "HOST:PORT (port 0..65535)"},
    {K_STR("db", S, db, "a path"), .flags = F_NONEMPTY},
    {K_STR("secret_key", S, secret_key, "a string"), .flags = F_NONEMPTY},
    {K_LONG("max_body_bytes", S, max_body_bytes, 1024, 1L << 30)},
    {K_INT("max_concurrent_runs", S, max_concurrent_runs, 1, 100000)},
    {K_INT("queue_max", S, queue_max, 0, 1000000)},
    {K_INT("queue_max_per_identity", S, queue_max_per_identity, 0, 1000000)},
    {K_LONG("queue_wait_ms", S, queue_wait_ms, 0, TIMEOUT_MAX)},
    {K_INT("max_connections", S, max_connections, 1, 1000000)},
    {K_INT("max_connections_per_address", S, max_connections_per_address, 0,
           1000000)},
    {K_LONG("header_timeout_ms", S, header_timeout_ms, 1000, TIMEOUT_MAX)},
    {K_INT("connection_memory_kb", S, connection_memory_kb, 16, 1024)},
    {K_LONG("keepalive_ms", S, keepalive_ms, 10, TIMEOUT_MAX)},
    {K_LONG("read_timeout_ms", S, read_timeout_ms, 1000, TIMEOUT_MAX)},
    {K_LONG("shutdown_grace_ms", S, shutdown_grace_ms, 0, TIMEOUT_MAX)},
    {K_INT("keep_finished_runs", S, keep_finished_runs, 0, 1000000)},
    {K_LONG("max_run_events_bytes", S, max_run_events_bytes, 4096, 1L << 32)},
    {K_FN("cors_origins", read_cors_origins)},
    {K_BOOL("ui", S, ui)},
    {K_STR("public_url", S, public_url, "a URL"),
     .valid = loom__config_valid_url, .expect = "an http:// or https:// URL"},
    {K_BOOL("fibers", S, fibers)},
    {K_INT("workers", S, workers, 0, 4096)},
    {K_INT("tool_threads", S, tool_threads, 1, 100000)},
    {K_INT("fiber_stack_kb", S, fiber_stack_kb, 256, 65536)},
};
#undef S
static const section server_section = SECTION(server_fields, NULL, NULL);

/* The auth section (docs/accounts.md). */
#define J loom_jwt_config
static const field jwt_fields[] = {
    {K_STR("secret", J, secret, "a string"), .flags = F_EMPTY_NULL},
    {K_STR("jwks_file", J, jwks_file, "a path"), .flags = F_EMPTY_NULL},
    {K_STR("audience", J, audience, "a string"), .flags = F_EMPTY_NULL},
    {K_STR("issuer", J, issuer, "a string"), .flags = F_EMPTY_NULL},
    {K_STR("workspace_claim", J, workspace_claim, "a claim name"),
     .flags = F_EMPTY_NULL},
    {K_INT("leeway_seconds", J, leeway_seconds, 0, 600)},
};
#undef J
static const section jwt_section = SECTION(jwt_fields, NULL, NULL);

/* Mode jwt needs a key to check tokens with. */
static int auth_check(walk_ctx *w)
{
    const loom_auth_config *a = w->obj;
    const yaml_node_t *mode = given(w, "mode");

    if (!a->mode || strcmp(a->mode, "jwt") != 0 || a->jwt.secret ||
        a->jwt.jwks_file)
        return 0;
    return fail_at(w->ld, LOOM_EINVALID, mode ? line_of(mode) : w->line, w->key,
                   "mode jwt needs jwt.secret (HS256) or jwt.jwks_file "
                   "(RS256, ES256)");
}

static const char *const auth_modes[] = {"none", "keys", "jwt", NULL};
static const field auth_fields[] = {
    {K_STR("mode", loom_auth_config, mode, "none, keys or jwt"),
     .flags = F_LOWER, .choices = auth_modes},
    {K_BOOL("allow_unauthenticated", loom_auth_config, allow_unauthenticated)},
    {K_STR("admin_key", loom_auth_config, admin_key, "a string"),
     .flags = F_EMPTY_NULL},
    {K_SUB("jwt", jwt_section), AT(loom_auth_config, jwt)},
};
static const section auth_section = SECTION(auth_fields, NULL, auth_check);

/* ---- providers ---------------------------------------------------------- */

/* Header names are HTTP tokens; values may not break the header line. */
static int valid_header_name(const char *s)
{
    if (!*s)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
              (*s >= '0' && *s <= '9') || strchr("!#$%&'*+-.^_`|~", *s)))
            return 0;
    return 1;
}

/*
 * A mapping of strings into the json_t * object at the field: names
 * judged by valid (what: what a name must be), null values as "", line
 * breaks in values refused when one_line is set.
 */
static int read_map(walk_ctx *w, const field *f, const yaml_node_t *n,
                    const char *key, int (*valid)(const char *),
                    const char *what, int one_line)
{
    json_t *headers = *(json_t **)at(w, f);
    entry *es = NULL;
    size_t len = 0;
    char sub[KEY_LEN], tmp[64], *s = NULL;
    int rc;

    if ((rc = read_entries(w->ld, n, key, &es, &len)) != 0)
        return rc;
    for (size_t i = 0; i < len; i++) {
        join_key(sub, sizeof(sub), key, es[i].name);
        free(s);
        s = NULL;
        if (!valid(es[i].name)) {
            rc =
                fail_at(w->ld, LOOM_EINVALID, line_of(es[i].key), key,
                        "'%s' is not a valid %s",
                        loom__config_shown(tmp, sizeof(tmp), es[i].name), what);
            continue;
        }
        if ((rc = get_str(w->ld, es[i].value, sub, "a string", &s)) != 0) {
            if (go_on(w->ld, rc))
                continue;
            goto cleanup;
        }
        if (!s && !(s = strdup(""))) {
            rc = loom__error_oom();
            goto cleanup;
        }
        if (one_line && strpbrk(s, "\r\n"))
            rc = fail_at(w->ld, LOOM_EINVALID, line_of(es[i].value), sub,
                         "header values must not contain line breaks");
        else if (json_object_set_new(headers, es[i].name, json_string(s)) != 0)
            rc = fail_at(w->ld, LOOM_EINVALID, line_of(es[i].value), sub,
                         "is not valid UTF-8");
    }
    rc = 0;

cleanup:
    free(s);
    free(es);
    return rc;
}

/* `headers: {Name: value}` into the json_t * object at the field. */
static int read_headers(walk_ctx *w, const field *f, const yaml_node_t *n,
                        const char *key)
{
    return read_map(w, f, n, key, valid_header_name, "HTTP header name", 1);
}

/* providers.X.kind: one of the wire formats config.c knows. */
static int read_kind(walk_ctx *w, const field *f, const yaml_node_t *n,
                     const char *key)
{
    loom_provider_config *p = w->obj;
    char tmp[64], *s = NULL;
    int rc;

    (void)f;
    if ((rc = get_str(w->ld, n, key, "a string", &s)) != 0 || !s)
        return rc;
    if (!loom__config_kind_known(s, NULL)) {
        rc = fail_at(w->ld, LOOM_EINVALID, line_of(n), key,
                     "must be one of: %s, got '%s'", loom__config_kind_names(),
                     loom__config_shown(tmp, sizeof(tmp), s));
        free(s);
        return rc;
    }
    free(p->kind);
    p->kind = s;
    return 0;
}

/* providers.X.base_url (read after kind, also when absent): providers
 * with one public endpoint may leave it out; "openai" is any
 * OpenAI-compatible server, so it names its own. Whether it is missing
 * is only known when the kind was read without error. */
static int read_base_url(walk_ctx *w, const field *f, const yaml_node_t *n,
                         const char *key)
{
    loom_provider_config *p = w->obj;
    const char *default_url = NULL;
    int rc;

    if ((rc = read_str(w, f, n, key)) != 0)
        return rc;
    loom__config_kind_known(p->kind, &default_url);
    if (!p->base_url && default_url && !(p->base_url = strdup(default_url)))
        return loom__error_oom();
    if (!p->base_url)
        return w->ld->errs->count > w->errors0
                   ? LOOM_EINVALID
                   : fail_at(w->ld, LOOM_EINVALID, w->line, w->key,
                             "missing required key 'base_url' (kind %s)",
                             p->kind);
    loom__config_strip_slashes(p->base_url);
    return 0;
}

/* Without max_delay_ms, a long base delay raises the cap. */
static int retries_check(walk_ctx *w)
{
    loom_provider_config *p = w->obj;
    const yaml_node_t *max = given(w, "max_delay_ms");
    char key[KEY_LEN];

    if (!max && p->retry_max_delay_ms < p->retry_base_delay_ms)
        p->retry_max_delay_ms = p->retry_base_delay_ms;
    if (p->retry_max_delay_ms >= p->retry_base_delay_ms)
        return 0;
    join_key(key, sizeof(key), w->key, "max_delay_ms");
    return fail_at(w->ld, LOOM_EINVALID, line_of(max), key,
                   "must be at least base_delay_ms (%ld), got %ld",
                   p->retry_base_delay_ms, p->retry_max_delay_ms);
}

#define URL_RULE                                                               \
    .valid = loom__config_valid_url, .expect = "an http:// or https:// URL"

#define P loom_provider_config
static const field timeout_fields[] = {
    {K_LONG("connect_ms", P, connect_timeout_ms, TIMEOUT_MIN, TIMEOUT_MAX)},
    {K_LONG("first_byte_ms", P, first_byte_timeout_ms, TIMEOUT_MIN,
            TIMEOUT_MAX)},
    {K_LONG("idle_ms", P, idle_timeout_ms, TIMEOUT_MIN, TIMEOUT_MAX)},
    {K_LONG("answer_ms", P, answer_timeout_ms, TIMEOUT_MIN, TIMEOUT_MAX)},
};
static const section timeout_section = SECTION(timeout_fields, NULL, NULL);

static const field retry_fields[] = {
    {K_INT("max", P, max_retries, 0, 10)},
    {K_LONG("base_delay_ms", P, retry_base_delay_ms, 0, TIMEOUT_MAX)},
    {K_LONG("max_delay_ms", P, retry_max_delay_ms, 0, TIMEOUT_MAX)},
};
static const section retry_section = SECTION(retry_fields, NULL, retries_check);

static const field provider_fields[] = {
    {K_FN("kind", read_kind)},
    {K_FN("base_url", read_base_url), AT(P, base_url), .flags = F_ALWAYS,
     .what = "a URL", URL_RULE},
    {K_STR("api_key", P, api_key, "a string"), .flags = F_EMPTY_NULL},
    {K_FN("headers", read_headers), AT(P, headers)},
    {K_SUB("timeouts", timeout_section)},
    {K_SUB("retries", retry_section)},
};
#undef P
static const section provider_section = SECTION(provider_fields, NULL, NULL);

/* Providers are read one at a time and installed into the config,
 * replacing one of the same name: that is how the file overrides the
 * environment. */
static int read_providers(walk_ctx *w, const field *f, const yaml_node_t *n,
                          const char *key)
{
    loader *ld = w->ld;
    loom_provider_config p;
    entry *es = NULL;
    size_t len = 0;
    char sub[KEY_LEN];
    int rc;

    (void)f;
    memset(&p, 0, sizeof(p));
    if ((rc = read_entries(ld, n, key, &es, &len)) != 0)
        return rc;
    for (size_t i = 0; i < len; i++) {
        join_key(sub, sizeof(sub), key, es[i].name);
        if (check_name(ld, line_of(es[i].key), key, es[i].name, 1,
                       "provider") != 0)
            continue;
        /* One with a bad setting is installed all the same, so models
         * naming it are not reported as well. */
        if ((rc = loom__config_provider_init(&p, es[i].name)) != 0 ||
            ((rc = walk(ld, es[i].value, sub, line_of(es[i].key),
                        &provider_section, &p)) != 0 &&
             !go_on(ld, rc)) ||
            (rc = loom__config_provider_install(ld->cfg, &p)) != 0)
            goto cleanup;
    }

cleanup:
    loom__config_provider_clear(&p);
    free(es);
    return rc;
}

/* ---- models ------------------------------------------------------------- */

/* Reasoning controls need the model to say it supports them
 * (capabilities.reasoning). */
static int reasoning_check(walk_ctx *w)
{
    const loom_model_config *m = w->obj;

    if ((given(w, "effort") || given(w, "thinking_budget")) &&
        !m->capabilities.reasoning)
        return fail_at(w->ld, LOOM_EINVALID, w->line, w->key,
                       "reasoning controls need capabilities.reasoning: "
                       "true");
    return 0;
}

/* Both main prices are needed: a missing one would be billed as free,
 * which is never what a typo meant. */
static int prices_check(walk_ctx *w)
{
    loom_model_prices *pr = w->obj;
    const yaml_node_t *in = given(w, "input"), *out = given(w, "output");

    if (is_null(w->map))
        return 0;
    if (!in || is_null(in) || !out || is_null(out))
        return fail_at(w->ld, LOOM_EINVALID, w->line, w->key,
                       "missing required key '%s' (input and output are "
                       "both required; write 0 for free)",
                       !in || is_null(in) ? "input" : "output");
    pr->set = 1;
    return 0;
}

/* A model name of a list resolves and is listed once. */
static int model_ok(walk_ctx *w, const yaml_node_t *item, const char *key,
                    const char *s, int repeat)
{
    char why[512], tmp[64];

    if (!s)
        return fail_at(w->ld, LOOM_EINVALID, line_of(item), key,
                       "must be a model name, got null");
    if (loom__config_model_unresolved(w->ld->cfg, s, why, sizeof(why)))
        return fail_at(w->ld, LOOM_EINVALID, line_of(item), key, "%s", why);
    if (repeat)
        return fail_at(w->ld, LOOM_EINVALID, line_of(item), key,
                       "'%s' is listed twice",
                       loom__config_shown(tmp, sizeof(tmp), s));
    return 0;
}

/* A fallback resolves, is not the model itself and is listed once. */
static int fallback_ok(walk_ctx *w, const yaml_node_t *item, const char *key,
                       const char *s, int repeat)
{
    const loom_model_config *m = w->obj;
    int rc = model_ok(w, item, key, s, repeat);

    if (rc == 0 && strcmp(s, m->name) == 0)
        rc = fail_at(w->ld, LOOM_EINVALID, line_of(item), key,
                     "a model cannot be its own fallback");
    return rc;
}

/* `fallbacks: [provider/model, ...]`, at most LOOM_MODEL_MAX_FALLBACKS. */
static int read_fallbacks(walk_ctx *w, const field *f, const yaml_node_t *n,
                          const char *key)
{
    loom_model_config *m = w->obj;

    (void)f;
    if (seq_len(n) > LOOM_MODEL_MAX_FALLBACKS)
        return fail_at(w->ld, LOOM_EINVALID, line_of(n), key,
                       "at most %d fallbacks, got %zu",
                       LOOM_MODEL_MAX_FALLBACKS, seq_len(n));
    return read_strings(w, n, key, "model names", "a model name", fallback_ok,
                        &m->fallbacks, &m->fallbacks_len, NULL);
}

/* context_window_fallback: a model that resolves, not the model itself;
 * null is none. Whether its window is larger is checked when a run uses
 * it. */
static int read_window_fallback(walk_ctx *w, const field *f,
                                const yaml_node_t *n, const char *key)
{
    loom_model_config *m = w->obj;
    char tmp[64];
    int rc = read_str(w, f, n, key);

    if (rc == 0 && m->context_window_fallback &&
        strcmp(m->context_window_fallback, m->name) == 0)
        rc = fail_at(w->ld, LOOM_EINVALID, line_of(n), key,
                     "'%s' cannot be its own context window fallback",
                     loom__config_shown(tmp, sizeof(tmp), m->name));
    return rc;
}

/* A model's key is provider/model with a defined provider; the model id
 * sent upstream defaults to the part after the provider. */
static int model_init(loader *ld, const entry *e, const char *key, void *obj)
{
    loom_model_config *m = obj;
    size_t plen = loom__config_provider_part(e->name);
    char tmp[64], known[256];

    loom__config_model_defaults(m, ld->cfg);
    if (plen == 0)
        return fail_at(ld, LOOM_EINVALID, line_of(e->key), "models",
                       "'%s' is not of the form provider/model",
                       loom__config_shown(tmp, sizeof(tmp), e->name));
    if (!loom__config_find_provider_n(ld->cfg, e->name, plen))
        return fail_at(
            ld, LOOM_EINVALID, line_of(e->key), key,
            "provider '%.*s' is not defined (providers: %s)",
            (int)(plen < 64 ? plen : 64), e->name,
            loom__config_provider_names(known, sizeof(known), ld->cfg));
    if (!(m->name = strdup(e->name)) ||
        !(m->provider = strndup(e->name, plen)) ||
        !(m->upstream = strdup(e->name + plen + 1)))
        return loom__error_oom();
    return 0;
}

static const char *const efforts[] = {"minimal", "low", "medium", "high", NULL};

#define M loom_model_config
static const field capability_fields[] = {
    {K_BOOL("tools", loom_model_capabilities, tools)},
    {K_BOOL("parallel_tool_calls", loom_model_capabilities,
            parallel_tool_calls)},
    {K_BOOL("reasoning", loom_model_capabilities, reasoning)},
    {K_BOOL("vision", loom_model_capabilities, vision)},
    {K_BOOL("max_completion_tokens", loom_model_capabilities,
            max_completion_tokens)},
};
static const section capability_section =
    SECTION(capability_fields, NULL, NULL);

/* `reasoning: {effort, thinking_budget}`, into the model itself. */
static const field reasoning_fields[] = {
    {K_STR("effort", M, reasoning_effort, "a reasoning effort"),
     .choices = efforts},
    {K_LONG("thinking_budget", M, thinking_budget, 1, TOKENS_MAX)},
};
static const section reasoning_section =
    SECTION(reasoning_fields, reasoning_check, NULL);

static const field price_fields[] = {
    {K_PRICE("input", loom_model_prices, input)},
    {K_PRICE("cached_input", loom_model_prices, cached_input)},
    {K_PRICE("cache_write", loom_model_prices, cache_write)},
    {K_PRICE("output", loom_model_prices, output)},
    {K_PRICE("reasoning", loom_model_prices, reasoning)},
};
static const section price_section = SECTION(price_fields, prices_check, NULL);

static const field model_fields[] = {
    {K_STR("upstream", M, upstream, "a string"), .flags = F_NONEMPTY},
    {K_LONG("context_window", M, context_window, 0, TOKENS_MAX)},
    {K_LONG("max_output_tokens", M, max_output_tokens, 0, TOKENS_MAX)},
    {K_SUB("capabilities", capability_section), AT(M, capabilities)},
    {K_SUB("reasoning", reasoning_section)},
    {K_BOOL("prompt_cache", M, prompt_cache)},
    {K_BOOL("chain_responses", M, chain_responses)},
    {K_SUB("prices", price_section), AT(M, prices)},
    {K_FN("fallbacks", read_fallbacks)},
    {K_SUB("routing", routing_section), AT(M, routing)},
    {K_FN("context_window_fallback", read_window_fallback),
     AT(M, context_window_fallback), .what = "a model name", .flags = F_MODEL},
};
static const section model_section = SECTION(model_fields, NULL, NULL);
static const list_spec model_list = {NULL,
                                     0,
                                     sizeof(M),
                                     offsetof(loom_config, models),
                                     offsetof(loom_config, models_len),
                                     model_init,
                                     &model_section};
#undef M

/* ---- agents ------------------------------------------------------------- */

/* A tool name, or a pattern: a name's start and '*' (`files__*`, the
 * tools of MCP server files), resolved against the registry later. */
static int tool_ok(walk_ctx *w, const yaml_node_t *item, const char *key,
                   const char *s, int repeat)
{
    size_t n = s ? strlen(s) : 0;
    char prefix[65];
    int rc;

    if (n > 1 && n <= 65 && s[n - 1] == '*' && !strchr(s, '?')) {
        memcpy(prefix, s, n - 1);
        prefix[n - 1] = '\0';
        rc = loom__config_valid_name(prefix, 0)
                 ? 0
                 : check_name(w->ld, line_of(item), key, s, 0, "tool");
    } else {
        rc = check_name(w->ld, line_of(item), key, s, 0, "tool");
    }

    if (rc == 0 && repeat)
        rc = fail_at(w->ld, LOOM_EINVALID, line_of(item), key,
                     "tool '%s' is listed twice", s);
    return rc;
}

/* `tools: [name, ...]`: this list instead of every registered tool; null
 * is as if absent. */
static int read_agent_tools(walk_ctx *w, const field *f, const yaml_node_t *n,
                            const char *key)
{
    loom_agent_config *a = w->obj;
    int rc;

    (void)f;
    if (is_null(n))
        return 0;
    rc = read_strings(w, n, key, "tool names", "a tool name", tool_ok,
                      &a->tools, &a->tools_len, &a->tools_lines);
    if (rc == 0 || go_on(w->ld, rc))
        a->tools_all = 0;
    return rc;
}

/* tool_choice, read after tools. Tool names themselves are checked by
 * the caller, who has the registry; what can be checked here is
 * consistency with `tools`, when they were read without error. */
static int read_tool_choice(walk_ctx *w, const field *f, const yaml_node_t *n,
                            const char *key)
{
    loom_agent_config *a = w->obj;
    char *s = NULL, tmp[64];
    int rc;

    (void)f;
    rc = get_str(w->ld, n, key, "auto, none, required or a tool name", &s);
    if (rc != 0 || !s)
        return rc;
    if (loom_tool_choice_parse(&a->tool_choice, s) != 0)
        rc = fail_at(w->ld, LOOM_EINVALID, line_of(n), key,
                     "must be auto, none, required or a tool name, got '%s'",
                     loom__config_shown(tmp, sizeof(tmp), s));
    else if (a->tools_all || w->ld->errs->count > w->errors0)
        rc = 0;
    else if (a->tool_choice.kind == LOOM_TOOL_CHOICE_REQUIRED &&
             a->tools_len == 0)
        rc = fail_at(w->ld, LOOM_EINVALID, line_of(n), key,
                     "'required' needs at least one tool, but tools is "
                     "empty");
    else if (a->tool_choice.kind == LOOM_TOOL_CHOICE_FUNCTION) {
        size_t i = 0;

        while (i < a->tools_len && strcmp(a->tools[i], s) != 0)
            i++;
        if (i == a->tools_len)
            rc = fail_at(w->ld, LOOM_EINVALID, line_of(n), key,
                         "tool '%s' is not in this agent's tools", s);
    }
    free(s);
    return rc;
}

/* A list of tool names where null is as if absent and an empty list
 * is a set of none: *set says it was given. */
static int read_tool_set(walk_ctx *w, const yaml_node_t *n, const char *key,
                         char ***items, size_t *len, int *set)
{
    int rc;

    if (is_null(n))
        return 0;
    rc = read_strings(w, n, key, "tool names", "a tool name", tool_ok, items,
                      len, NULL);
    if (rc == 0 || go_on(w->ld, rc))
        *set = 1;
    return rc;
}

/* `data_policy.tools: [name, ...]`: only these tools' calls are stored;
 * null is as if absent. */
static int read_policy_tools(walk_ctx *w, const field *f, const yaml_node_t *n,
                             const char *key)
{
    loom_agent_data_policy *p = w->obj;

    (void)f;
    return read_tool_set(w, n, key, &p->tools, &p->tools_len, &p->tools_set);
}

#define P loom_agent_data_policy
static const field data_policy_fields[] = {
    {K_BOOL("store_text", P, omit_text), .flags = F_NEGATE},
    {K_BOOL("store_tool_calls", P, omit_tool_calls), .flags = F_NEGATE},
    {K_BOOL("store_tool_results", P, omit_tool_results), .flags = F_NEGATE},
    {K_FN("tools", read_policy_tools)},
};
static const section data_policy_section =
    SECTION(data_policy_fields, NULL, NULL);
#undef P

/* `many_results_prompt` given: after defaults to 2 (0 would be off). */
static int many_results_init(walk_ctx *w)
{
    ((loom_agent_many_results *)w->obj)->after = 2;
    return 0;
}

#define M loom_agent_many_results
static const field many_results_fields[] = {
    {K_INT("after", M, after, 1, 1000)},
    {K_STR("prompt", M, prompt, "a string"), .flags = F_EMPTY_NULL},
};
static const section many_results_section =
    SECTION(many_results_fields, many_results_init, NULL);
#undef M

/* ---- files an agent names (tool_descriptions, few_shot) ------------------ */

static int check_events(const char *name, const char *data, size_t len);
static int yaml_fail(const char *name, const yaml_parser_t *p, const char *data,
                     size_t len);

/* Reads the root of a file an agent names with that file's own loader,
 * whose messages name the file and its lines. */
typedef int (*file_fn)(loader *sub, const yaml_node_t *root, void *obj);

/*
 * A path given in the config: relative to the config file's directory
 * (the working directory for a config given as text). NULL when out of
 * memory.
 */
static char *config_relative(const loader *ld, const char *given)
{
    const char *cfg = ld->cfg->path, *slash = cfg ? strrchr(cfg, '/') : NULL;
    char *out;

    if (given[0] == '/' || !slash)
        return strdup(given);
    if (asprintf(&out, "%.*s%s", (int)(slash - cfg + 1), cfg, given) < 0)
        return NULL;
    return out;
}

/*
 * The file the string n (at key) names, at most LOOM_AGENT_FILE_MAX
 * bytes of YAML, read by fn into obj; *given gets the path as written.
 * A file that cannot be read or parsed is an error at n's line that
 * names it; what fn finds wrong names the file and its own lines.
 */
static int read_agent_file(walk_ctx *w, const yaml_node_t *n, const char *key,
                           char **given, file_fn fn, void *obj)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_AGENT_FILE_MAX);
    yaml_parser_t parser;
    yaml_document_t doc;
    const yaml_node_t *root;
    char *path = NULL, why[640];
    loader sub;
    int parser_ok = 0, doc_ok = 0, rc;

    if ((rc = get_str(w->ld, n, key, "a file path", given)) != 0 || !*given)
        return rc;
    if (!**given)
        return fail_at(w->ld, LOOM_EINVALID, line_of(n), key,
                       "must not be empty");
    if (!(path = config_relative(w->ld, *given)))
        return loom__error_oom();
    rc = loom__config_read_file(&b, path, LOOM_AGENT_FILE_MAX, "this file");
    if (rc == 0)
        rc = check_events(path, loom_buf_cstr(&b), b.len);
    if (rc == 0 && !(parser_ok = yaml_parser_initialize(&parser)))
        rc = loom__error_oom();
    if (rc == 0) {
        yaml_parser_set_input_string(
            &parser, (const unsigned char *)loom_buf_cstr(&b), b.len);
        if (!(doc_ok = yaml_parser_load(&parser, &doc)))
            rc = yaml_fail(path, &parser, loom_buf_cstr(&b), b.len);
    }
    if (rc == LOOM_ENOMEM)
        goto cleanup;
    if (rc) {
        snprintf(why, sizeof(why), "%s", loom_error_last());
        rc = fail_at(w->ld, LOOM_EINVALID, line_of(n), key, "%s%s", why,
                     rc == LOOM_ENOTFOUND && (*given)[0] != '/'
                         ? " (a relative path is read from the config "
                           "file's directory)"
                         : "");
        goto cleanup;
    }
    root = yaml_document_get_root_node(&doc);
    if (!root || is_null(root)) {
        rc = fail_at(w->ld, LOOM_EINVALID, line_of(n), key, "%s: is empty",
                     path);
        goto cleanup;
    }
    sub = *w->ld;
    sub.name = path;
    sub.doc = &doc;
    sub.nodes = 0;
    sub.text = 0;
    rc = fn(&sub, root, obj);

cleanup:
    if (doc_ok)
        yaml_document_delete(&doc);
    if (parser_ok)
        yaml_parser_delete(&parser);
    loom_buf_free(&b);
    free(path);
    return rc;
}

#define D loom_agent_tool_doc
static const field tool_doc_fields[] = {
    {K_STR("description", D, description, "a string"), .flags = F_EMPTY_NULL},
    {K_STR("selection_rule", D, selection_rule, "a string"),
     .flags = F_EMPTY_NULL},
};
#undef D
static const section tool_doc_section = SECTION(tool_doc_fields, NULL, NULL);

static int tool_doc_init(loader *ld, const entry *e, const char *key, void *obj)
{
    (void)ld;
    (void)key;
    return (((loom_agent_tool_doc *)obj)->name = strdup(e->name))
               ? 0
               : loom__error_oom();
}

/* The registry file: tool name -> {description, selection_rule}. */
static const list_spec tool_doc_list = {
    "tool",
    0,
    sizeof(loom_agent_tool_doc),
    offsetof(loom_agent_config, tool_docs),
    offsetof(loom_agent_config, tool_docs_len),
    tool_doc_init,
    &tool_doc_section};

static int tool_docs_file(loader *sub, const yaml_node_t *root, void *obj)
{
    return walk_list(sub, root, NULL, &tool_doc_list, obj);
}

/* `tool_descriptions: path`: the agent's tool-description registry. */
static int read_tool_descriptions(walk_ctx *w, const field *f,
                                  const yaml_node_t *n, const char *key)
{
    loom_agent_config *a = w->obj;

    (void)f;
    return read_agent_file(w, n, key, &a->tool_descriptions, tool_docs_file, a);
}

#define E loom_agent_example
static const field example_fields[] = {
    {K_STR("user", E, user, "a string"), .flags = F_REQUIRED | F_NONEMPTY},
    {K_STR("assistant", E, assistant, "a string"),
     .flags = F_REQUIRED | F_NONEMPTY},
};
#undef E
static const section example_section = SECTION(example_fields, NULL, NULL);

/* A few-shot file: a list of {user, assistant} exchanges. */
static int examples_file(loader *sub, const yaml_node_t *root, void *obj)
{
    loom_agent_few_shot *fs = obj;
    size_t n = seq_len(root), i = 0, errors0 = sub->errs->count;
    char key[KEY_LEN];
    int rc;

    if (root->type != YAML_SEQUENCE_NODE || n == 0)
        return fail_at(sub, LOOM_EINVALID, line_of(root), NULL,
                       "must be a list of {user, assistant} exchanges, got "
                       "%s",
                       n == 0 && root->type == YAML_SEQUENCE_NODE
                           ? "an empty list"
                           : kind_name(root));
    if (n > LOOM_AGENT_EXAMPLES_MAX)
        return fail_at(sub, LOOM_EINVALID, line_of(root), NULL,
                       "at most %d exchanges, got %zu", LOOM_AGENT_EXAMPLES_MAX,
                       n);
    if (!(fs->examples = calloc(n, sizeof(*fs->examples))))
        return loom__error_oom();
    for (yaml_node_item_t *it = root->data.sequence.items.start;
         it < root->data.sequence.items.top; it++, i++) {
        yaml_node_t *item = node_at(sub, *it);

        index_key(key, sizeof(key), "", i);
        fs->examples_len++;
        rc = walk(sub, item, key, line_of(item), &example_section,
                  &fs->examples[fs->examples_len - 1]);
        if (rc != 0 && !go_on(sub, rc))
            return rc;
    }
    return sub->errs->count > errors0 ? LOOM_EINVALID : 0;
}

static int read_few_shot_file(walk_ctx *w, const field *f, const yaml_node_t *n,
                              const char *key)
{
    loom_agent_few_shot *fs = w->obj;

    (void)f;
    if (!n)
        return fail_at(w->ld, LOOM_EINVALID, w->line, w->key,
                       "missing required key 'file' (a YAML list of {user, "
                       "assistant} exchanges)");
    return read_agent_file(w, n, key, &fs->file, examples_file, fs);
}

static int read_few_shot_models(walk_ctx *w, const field *f,
                                const yaml_node_t *n, const char *key)
{
    loom_agent_few_shot *fs = w->obj;

    (void)f;
    return read_strings(w, n, key, "model names", "a model name", model_ok,
                        &fs->models, &fs->models_len, NULL);
}

#define FS loom_agent_few_shot
static const field few_shot_fields[] = {
    {K_FN("file", read_few_shot_file), .flags = F_ALWAYS},
    {K_FN("models", read_few_shot_models)},
};
#undef FS
static const section few_shot_section = SECTION(few_shot_fields, NULL, NULL);

/* The prefix of a handoff's tool name; the rest is the agent's name. */
#define HANDOFF_PREFIX "transfer_to_"
#define HANDOFF_NAME_MAX (64 - (sizeof(HANDOFF_PREFIX) - 1))

/* A `handoffs` item: an agent name that makes a tool name
 * (transfer_to_<name>), listed once. Whether the agent exists is checked
 * once every agent is read (check_handoffs). */
static int handoff_ok(walk_ctx *w, const yaml_node_t *item, const char *key,
                      const char *s, int repeat)
{
    char tmp[64];

    if (repeat)
        return fail_at(w->ld, LOOM_EINVALID, line_of(item), key,
                       "agent '%s' is listed twice", s);
    if (!s || !loom__config_valid_name(s, 0) || strlen(s) > HANDOFF_NAME_MAX)
        return fail_at(w->ld, LOOM_EINVALID, line_of(item), key,
                       "'%s' cannot be handed off to: its tool "
                       "transfer_to_<name> needs a name of [a-zA-Z0-9_-], "
                       "1 to %zu bytes",
                       s ? loom__config_shown(tmp, sizeof(tmp), s) : "null",
                       HANDOFF_NAME_MAX);
    return 0;
}

/* `handoffs: [name, ...]`; null is as if absent. */
static int read_handoffs(walk_ctx *w, const field *f, const yaml_node_t *n,
                         const char *key)
{
    loom_agent_config *a = w->obj;

    (void)f;
    return read_strings(w, n, key, "agent names", "an agent name", handoff_ok,
                        &a->handoffs, &a->handoffs_len, &a->handoffs_lines);
}

/* After every agent is read: each handoff names another defined agent. */
static int check_handoffs(walk_ctx *w)
{
    const loom_config *cfg = w->ld->cfg;
    char key[KEY_LEN], sub[KEY_LEN], tmp[64], known[256];
    int rc = 0;

    for (size_t i = 0; i < cfg->agents_len; i++) {
        const loom_agent_config *a = &cfg->agents[i];
        for (size_t j = 0; j < a->handoffs_len; j++) {
            const char *h = a->handoffs[j];
            size_t line = a->handoffs_lines ? a->handoffs_lines[j] : 0;
            int rc2 = 0;
            snprintf(key, sizeof(key), "agents.%s.handoffs", a->name);
            index_key(sub, sizeof(sub), key, j);
            if (strcmp(h, a->name) == 0)
                rc2 = fail_at(w->ld, LOOM_EINVALID, line, sub,
                              "an agent cannot hand off to itself");
            else if (!loom_config_agent(cfg, h))
                rc2 = fail_at(w->ld, LOOM_EINVALID, line, sub,
                              "agent '%s' is not defined under agents "
                              "(agents: %s)",
                              loom__config_shown(tmp, sizeof(tmp), h),
                              agent_names(known, sizeof(known), cfg));
            if (rc2 && !go_on(w->ld, rc2))
                return rc2;
            if (rc2)
                rc = rc2;
        }
    }
    return rc;
}

static int read_tool_settings(loader *ld, const yaml_node_t *n, const char *key,
                              json_t *dst);

/* An agent's `tool_options: {name: {settings}}` (read_tool_settings). */
static int read_tool_options(walk_ctx *w, const field *f, const yaml_node_t *n,
                             const char *key)
{
    loom_agent_config *a = w->obj;

    (void)f;
    if (is_null(n))
        return 0;
    if (!a->tool_options && !(a->tool_options = json_object()))
        return loom__error_oom();
    return read_tool_settings(w->ld, n, key, a->tool_options);
}

/* An entry of `sub_agents`: a tool name (the agent's tool takes its
 * name), listed once; that it names an agent is checked once every agent
 * is read (check_sub_agents). */
static int sub_agent_ok(walk_ctx *w, const yaml_node_t *item, const char *key,
                        const char *s, int repeat)
{
    int rc = check_name(w->ld, line_of(item), key, s, 0, "sub-agent tool");

    if (rc == 0 && repeat)
        rc = fail_at(w->ld, LOOM_EINVALID, line_of(item), key,
                     "agent '%s' is listed twice", s);
    return rc;
}

/* `sub_agents: [name, ...]`; null is as if absent. */
static int read_sub_agents(walk_ctx *w, const field *f, const yaml_node_t *n,
                           const char *key)
{
    loom_agent_config *a = w->obj;

    (void)f;
    if (is_null(n))
        return 0;
    return read_strings(w, n, key, "agent names", "an agent name", sub_agent_ok,
                        &a->sub_agents, &a->sub_agents_len,
                        &a->sub_agents_lines);
}

/* `retry_without_tool_calls` and `model_after_retries` given: their
 * count (each struct's first member, 0 when off) defaults to 1. */
static int count_one_init(walk_ctx *w)
{
    *(int *)w->obj = 1;
    return 0;
}

static const field agent_retry_fields[] = {
    {K_INT("max", loom_agent_retry, max, 1, 100)},
    {K_STR("prompt", loom_agent_retry, prompt, "a string"),
     .flags = F_EMPTY_NULL},
};
static const field model_after_fields[] = {
    {K_INT("retries", loom_agent_model_after, retries, 1, 100)},
    {K_STR("model", loom_agent_model_after, model, "a model name"),
     .flags = F_REQUIRED | F_MODEL},
};
static const section retry_agent_section =
    SECTION(agent_retry_fields, count_one_init, NULL);
static const section model_after_section =
    SECTION(model_after_fields, count_one_init, NULL);

/* `non_iterative_tools: [name, ...]`: turns of only these tools cost no
 * iteration; null is as if absent, [] makes every turn count. */
static int read_non_iterative(walk_ctx *w, const field *f, const yaml_node_t *n,
                              const char *key)
{
    loom_agent_config *a = w->obj;

    (void)f;
    return read_tool_set(w, n, key, &a->non_iterative_tools,
                         &a->non_iterative_tools_len, &a->non_iterative_set);
}

/* `max_cost_usd`: dollars ("0.50"), exactly into micro-dollars. */
static int read_budget_cost(walk_ctx *w, const field *f, const yaml_node_t *n,
                            const char *key)
{
    loom_agent_config *a = w->obj;

    (void)f;
    return get_dollars(w->ld, n, key, "an amount in dollars",
                       &a->budget_cost_micros);
}

static int agent_init(loader *ld, const entry *e, const char *key, void *obj)
{
    loom_agent_config *a = obj;

    (void)ld;
    (void)key;
    a->tools_all = 1;
    a->max_iterations = 10;
    a->parallel_tool_calls = 1;
    a->tool_concurrency = 8;
    a->memory = 1;
    a->count_sub_agent_calls = 1;
    a->max_depth = 3;
    a->max_sub_runs = 50;
    return (a->name = strdup(e->name)) ? 0 : loom__error_oom();
}

#define A loom_agent_config
static const field agent_fields[] = {
    {K_STR("model", A, model, "a model name"), .flags = F_REQUIRED | F_MODEL},
    {K_STR("system_prompt", A, system_prompt, "a string"),
     .flags = F_EMPTY_NULL},
    {K_FN("tools", read_agent_tools)},
    {K_INT("max_iterations", A, max_iterations, 1, 1000)},
    {K_FN("tool_choice", read_tool_choice), .pass = 1},
    {K_BOOL("parallel_tool_calls", A, parallel_tool_calls)},
    {K_INT("tool_concurrency", A, tool_concurrency, 1, 64)},
    {K_BOOL("planning", A, planning)},
    {K_BOOL("think", A, think)},
    {K_LONG("tool_timeout_ms", A, tool_timeout_ms, 1, 86400000L)},
    {K_LONG("approval_timeout_ms", A, approval_timeout_ms, 1, 86400000L)},
    {K_BOOL("review", A, review)},
    {K_STR("review_model", A, review_model, "a model name"), .flags = F_MODEL},
    {K_BOOL("citations", A, citations)},
    {K_BOOL("memory", A, memory)},
    {K_SUB("data_policy", data_policy_section), AT(A, data_policy)},
    {K_STR("limit_prompt", A, limit_prompt, "a string"), .flags = F_EMPTY_NULL},
    {K_SUB("many_results_prompt", many_results_section), AT(A, many_results)},
    {K_FN("tool_descriptions", read_tool_descriptions)},
    {K_SUB("few_shot", few_shot_section), AT(A, few_shot)},
    {K_STR("description", A, description, "a string"), .flags = F_EMPTY_NULL},
    {K_FN("handoffs", read_handoffs)},
    {K_FN("tool_options", read_tool_options)},
    {K_STR("tools_disabled_message", A, tools_disabled_message, "a string"),
     .flags = F_EMPTY_NULL},
    {K_FN("sub_agents", read_sub_agents)},
    {K_BOOL("count_sub_agent_calls", A, count_sub_agent_calls)},
    {K_INT("max_depth", A, max_depth, 1, 16)},
    {K_INT("max_sub_runs", A, max_sub_runs, 1, 10000)},
    {K_SUB("retry_without_tool_calls", retry_agent_section), AT(A, retry)},
    {K_SUB("model_after_retries", model_after_section), AT(A, model_after)},
    {K_FN("non_iterative_tools", read_non_iterative)},
    {K_BOOL("research", A, research)},
    {K_FN("max_cost_usd", read_budget_cost)},
    {K_LONG("max_tokens", A, budget_tokens, 1, 1000000000000L)},
    {K_LONG("max_seconds", A, budget_seconds, 1, 7L * 24 * 3600)},
};
static const section agent_section = SECTION(agent_fields, NULL, NULL);
static const list_spec agent_list = {"agent",
                                     1,
                                     sizeof(A),
                                     offsetof(loom_config, agents),
                                     offsetof(loom_config, agents_len),
                                     agent_init,
                                     &agent_section};
#undef A

static int read_default_agent(walk_ctx *w, const field *f, const yaml_node_t *n,
                              const char *key)
{
    loom_config *cfg = w->ld->cfg;
    char tmp[64], known[256];
    int rc;

    (void)f;
    if ((rc = get_str(w->ld, n, key, "an agent name", &cfg->default_agent)) !=
            0 ||
        !cfg->default_agent)
        return rc;
    if (!loom_config_agent(cfg, cfg->default_agent))
        return fail_at(w->ld, LOOM_EINVALID, line_of(n), key,
                       "agent '%s' is not defined under agents (agents: %s)",
                       loom__config_shown(tmp, sizeof(tmp), cfg->default_agent),
                       agent_names(known, sizeof(known), cfg));
    return 0;
}

/* ---- tools and http_tools ----------------------------------------------- */

/*
 * The per-tool keys loom's loop reads (docs/agents.md "Tool rules"),
 * checked where they are written so a typo'd value fails the load with
 * its line; every other key of a tool's settings is the tool's own and
 * stays free-form.
 */
static int check_then_force(loader *ld, const yaml_node_t *n, const char *key)
{
    entry *es = NULL;
    size_t len = 0;
    char sub[KEY_LEN], *s = NULL;
    int rc, has_tool = 0;

    if (n->type == YAML_SCALAR_NODE) {
        if ((rc = get_str(ld, n, key, "a tool name", &s)) != 0)
            return rc;
        rc = check_name(ld, line_of(n), key, s, 0, "tool");
        free(s);
        return rc;
    }
    if (n->type != YAML_MAPPING_NODE)
        return fail_at(ld, LOOM_EINVALID, line_of(n), key,
                       "must be a tool name or {tool, when}, got %s",
                       kind_name(n));
    if ((rc = read_entries(ld, n, key, &es, &len)) != 0)
        return rc;
    for (size_t i = 0; i < len && !rc; i++) {
        join_key(sub, sizeof(sub), key, es[i].name);
        if (strcmp(es[i].name, "tool") != 0 &&
            strcmp(es[i].name, "when") != 0) {
            rc = fail_at(ld, LOOM_EINVALID, line_of(es[i].key), key,
                         "unknown key '%s' (known: tool, when)", es[i].name);
            break;
        }
        if ((rc = get_str(ld, es[i].value, sub, "a name", &s)) == 0)
            rc = check_name(ld, line_of(es[i].value), sub, s, 0,
                            strcmp(es[i].name, "tool") == 0 ? "tool"
                                                            : "argument");
        has_tool |= strcmp(es[i].name, "tool") == 0 && s;
        free(s);
        s = NULL;
    }
    if (!rc && !has_tool)
        rc = fail_at(ld, LOOM_EINVALID, line_of(n), key,
                     "missing required key 'tool'");
    free(es);
    return rc;
}

static int check_repair(loader *ld, const yaml_node_t *n, const char *key)
{
    entry *es = NULL;
    size_t len = 0;
    char sub[KEY_LEN], why[512], *s = NULL;
    int rc;

    if ((rc = read_entries(ld, n, key, &es, &len)) != 0)
        return rc;
    if (len != 1 || strcmp(es[0].name, "model") != 0) {
        rc = fail_at(ld, LOOM_EINVALID, line_of(n), key,
                     "must be {model: provider/model}");
    } else {
        join_key(sub, sizeof(sub), key, "model");
        if ((rc = get_str(ld, es[0].value, sub, "a model name", &s)) == 0 &&
            (!s || loom__config_model_unresolved(ld->cfg, s, why, sizeof(why))))
            rc = fail_at(ld, LOOM_EINVALID, line_of(es[0].value), sub, "%s",
                         s ? why : "must be a model name");
        free(s);
    }
    free(es);
    return rc;
}

static int check_tool_rule(loader *ld, const entry *e, const char *key)
{
    char *s = NULL;
    json_t *b = NULL;
    int rc = 0;

    /* As the settings keep it: true or false, not yes/no or on/off. */
    if (strcmp(e->name, "default_args_on_bad_json") == 0) {
        if ((rc = to_json(ld, e->value, key, 4, &b)) == 0 &&
            !json_is_boolean(b))
            rc = fail_at(ld, LOOM_EINVALID, line_of(e->value), key,
                         "must be true or false");
        json_decref(b);
        return rc;
    }
    if (strcmp(e->name, "repair_arguments") == 0)
        return check_repair(ld, e->value, key);
    if (strcmp(e->name, "then_force") == 0)
        return check_then_force(ld, e->value, key);
    if (strcmp(e->name, "wrap_result") == 0) {
        if ((rc = get_str(ld, e->value, key, "a string", &s)) == 0 &&
            (!s || !strstr(s, "{result}")))
            rc = fail_at(ld, LOOM_EINVALID, line_of(e->value), key,
                         "must be a string holding {result}");
    } else if (strcmp(e->name, "history") == 0) {
        if ((rc = get_str(ld, e->value, key, "full or summary", &s)) == 0 &&
            (!s || (strcmp(s, "full") != 0 && strcmp(s, "summary") != 0)))
            rc = fail_at(ld, LOOM_EINVALID, line_of(e->value), key,
                         "must be full or summary");
    }
    free(s);
    return rc;
}

/* Reads `{name: {settings}}` (the top `tools`, an agent's
 * `tool_options`) into the object dst, free-form but for the loop's
 * keys. */
static int read_tool_settings(loader *ld, const yaml_node_t *n, const char *key,
                              json_t *dst)
{
    entry *es = NULL, *keys = NULL;
    size_t len = 0, nkeys = 0;
    char sub[KEY_LEN], sub2[KEY_LEN];
    json_t *v = NULL;
    size_t errors0;
    int rc;

    if ((rc = read_entries(ld, n, key, &es, &len)) != 0)
        return rc;
    for (size_t i = 0; i < len; i++) {
        errors0 = ld->errs->count;
        join_key(sub, sizeof(sub), key, es[i].name);
        if (check_name(ld, line_of(es[i].key), key, es[i].name, 0, "tool") != 0)
            continue;
        if (is_null(es[i].value)) {
            v = json_object();
        } else if (es[i].value->type != YAML_MAPPING_NODE) {
            fail_at(ld, LOOM_EINVALID, line_of(es[i].value), sub,
                    "must be a mapping of settings, got %s",
                    kind_name(es[i].value));
            continue;
        } else if ((rc = read_entries(ld, es[i].value, sub, &keys, &nkeys)) !=
                   0) {
            if (go_on(ld, rc))
                continue;
            goto cleanup;
        } else {
            /* A bad key is reported once, here, and the tool's settings
             * are left out. */
            for (size_t k = 0; k < nkeys && rc == 0; k++) {
                join_key(sub2, sizeof(sub2), sub, keys[k].name);
                if ((rc = check_tool_rule(ld, &keys[k], sub2)) != 0 &&
                    go_on(ld, rc))
                    rc = 0;
            }
            free(keys);
            keys = NULL;
            if (rc)
                goto cleanup;
            if (ld->errs->count > errors0)
                continue;
            if ((rc = to_json(ld, es[i].value, sub, 3, &v)) != 0) {
                if (go_on(ld, rc))
                    continue;
                goto cleanup;
            }
        }
        if (!v || json_object_set_new(dst, es[i].name, v) != 0) {
            v = NULL;
            rc = loom__error_oom();
            goto cleanup;
        }
        v = NULL;
    }

cleanup:
    free(es);
    return rc;
}

/* `tools: {name: {settings}}`: the tools' settings, kept as JSON. */
static int read_tools(walk_ctx *w, const field *f, const yaml_node_t *n,
                      const char *key)
{
    (void)f;
    return read_tool_settings(w->ld, n, key, w->ld->cfg->tools);
}

/* An allowlist entry as far as the config can tell: one word without
 * spaces, '/' or '@'. src/tools/netguard.c parses it fully when the tool
 * is registered. */
static int host_ok(walk_ctx *w, const yaml_node_t *item, const char *key,
                   const char *s, int repeat)
{
    char tmp[64];

    (void)repeat;
    if (s && *s && strlen(s) < 256 && !strpbrk(s, " \t\r\n/@?#"))
        return 0;
    return fail_at(w->ld, LOOM_EINVALID, line_of(item), key,
                   "'%s' is not a host, host:port, [IPv6]:port or *.domain",
                   s ? loom__config_shown(tmp, sizeof(tmp), s) : "null");
}

static int read_allow_hosts(walk_ctx *w, const field *f, const yaml_node_t *n,
                            const char *key)
{
    loom_http_tool_config *t = w->obj;

    (void)f;
    return read_strings(w, n, key, "hosts", "a host", host_ok, &t->allow_hosts,
                        &t->allow_hosts_len, NULL);
}

/* The parameters schema: a mapping whose `type`, when given, is object;
 * null keeps the default, an empty object schema. */
static int read_http_params(walk_ctx *w, const field *f, const yaml_node_t *n,
                            const char *key)
{
    loom_http_tool_config *t = w->obj;
    const json_t *type;
    int rc;

    (void)f;
    if (is_null(n))
        return 0;
    if (n->type != YAML_MAPPING_NODE)
        return fail_at(w->ld, LOOM_EINVALID, line_of(n), key,
                       "must be a JSON Schema mapping, got %s", kind_name(n));
    json_decref(t->parameters);
    if ((rc = to_json(w->ld, n, key, 3, &t->parameters)) != 0)
        return rc;
    type = json_object_get(t->parameters, "type");
    if (type && !(json_is_string(type) &&
                  strcmp(json_string_value(type), "object") == 0))
        return fail_at(w->ld, LOOM_EINVALID, line_of(n), key,
                       "type must be object: the arguments are a JSON "
                       "object");
    return 0;
}

static int http_tool_init(loader *ld, const entry *e, const char *key,
                          void *obj)
{
    loom_http_tool_config *t = obj;

    (void)ld;
    (void)key;
    t->timeout_ms = 30000;
    t->max_bytes = 1L << 20;
    t->max_chars = 20000;
    if (!(t->name = strdup(e->name)) || !(t->headers = json_object()) ||
        !(t->method = strdup("POST")) ||
        !(t->parameters = json_pack("{s:s}", "type", "object")))
        return loom__error_oom();
    return 0;
}

static const char *const http_methods[] = {"GET",   "POST",   "PUT",
                                           "PATCH", "DELETE", NULL};

#define H loom_http_tool_config
static const field http_tool_fields[] = {
    {K_STR("description", H, description, "a string"),
     .flags = F_REQUIRED | F_EMPTY_NULL,
     .hint = " (the model reads it to decide when to call the tool)"},
    {K_STR("method", H, method, "an HTTP method"), .flags = F_UPPER,
     .choices = http_methods},
    {K_STR("url", H, url, "a URL"), .flags = F_REQUIRED, URL_RULE},
    {K_FN("headers", read_headers), AT(H, headers)},
    {K_FN("parameters", read_http_params)},
    {K_FN("allow_hosts", read_allow_hosts)},
    {K_LONG("timeout_ms", H, timeout_ms, 100, 300000)},
    {K_LONG("max_bytes", H, max_bytes, 1024, 64L << 20)},
    {K_LONG("max_chars", H, max_chars, 100, 10000000)},
};
static const section http_tool_section = SECTION(http_tool_fields, NULL, NULL);
static const list_spec http_tool_list = {"tool",
                                         0,
                                         sizeof(H),
                                         offsetof(loom_config, http_tools),
                                         offsetof(loom_config, http_tools_len),
                                         http_tool_init,
                                         &http_tool_section};
#undef H

/* ---- mcp_servers -------------------------------------------------------- */

static int any_string(walk_ctx *w, const yaml_node_t *item, const char *key,
                      const char *s, int repeat)
{
    (void)w;
    (void)item;
    (void)key;
    (void)s;
    (void)repeat;
    return 0;
}

static int read_mcp_args(walk_ctx *w, const field *f, const yaml_node_t *n,
                         const char *key)
{
    loom_mcp_server_config *m = w->obj;

    (void)f;
    return read_strings(w, n, key, "strings", "a string", any_string, &m->args,
                        &m->args_len, NULL);
}

static int mcp_tool_ok(walk_ctx *w, const yaml_node_t *item, const char *key,
                       const char *s, int repeat)
{
    if (!s || !*s)
        return fail_at(w->ld, LOOM_EINVALID, line_of(item), key,
                       "must be a tool name, got an empty string");
    if (repeat)
        return fail_at(w->ld, LOOM_EINVALID, line_of(item), key,
                       "tool '%s' is listed twice", s);
    return 0;
}

/* `tools:` of a server: the server's own names, as it lists them. */
static int read_mcp_tools(walk_ctx *w, const field *f, const yaml_node_t *n,
                          const char *key)
{
    loom_mcp_server_config *m = w->obj;

    (void)f;
    return read_strings(w, n, key, "tool names", "a tool name", mcp_tool_ok,
                        &m->tools, &m->tools_len, NULL);
}

/* A root: a path or a file:// URI, not empty, not twice. */
static int mcp_root_ok(walk_ctx *w, const yaml_node_t *item, const char *key,
                       const char *s, int repeat)
{
    const char *scheme = s ? strstr(s, "://") : NULL;

    if (!s || !*s || (scheme && strncmp(s, "file://", 7) != 0))
        return fail_at(w->ld, LOOM_EINVALID, line_of(item), key,
                       "must be a path or a file:// URI, got '%s'", s ? s : "");
    if (repeat)
        return fail_at(w->ld, LOOM_EINVALID, line_of(item), key,
                       "root '%s' is listed twice", s);
    return 0;
}

/* `roots:` of a server: paths or file:// URIs. */
static int read_mcp_roots(walk_ctx *w, const field *f, const yaml_node_t *n,
                          const char *key)
{
    loom_mcp_server_config *m = w->obj;

    (void)f;
    return read_strings(w, n, key, "roots", "a path or file:// URI",
                        mcp_root_ok, &m->roots, &m->roots_len, NULL);
}

static int valid_env_name(const char *s)
{
    return *s && !strchr(s, '=');
}

/* `env: {NAME: value}` into the object at the field. */
static int read_mcp_env(walk_ctx *w, const field *f, const yaml_node_t *n,
                        const char *key)
{
    return read_map(w, f, n, key, valid_env_name,
                    "an environment variable name", 0);
}

static const char *const mcp_transports[] = {"stdio", "http", "sse", NULL};
static const char *const mcp_versions[] = {
    "2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05", NULL};

/* A server is a command or a URL, never both, and the transport agrees. */
static int mcp_server_check(walk_ctx *w)
{
    loom_mcp_server_config *m = w->obj;
    const char *want;

    if (w->ld->errs->count > w->errors0)
        return 0;
    if (m->command && m->url)
        return fail_at(w->ld, LOOM_EINVALID, line_of(given(w, "url")), w->key,
                       "give either command (stdio) or url (http), not both");
    if (!m->command && !m->url)
        return fail_at(w->ld, LOOM_EINVALID, w->line, w->key,
                       "needs command (a program speaking MCP on stdio) or "
                       "url (a Streamable HTTP endpoint)");
    want = m->command ? "stdio" : "http";
    /* sse: the legacy HTTP+SSE transport (2024-11-05), also a URL. */
    if (m->url && m->transport && strcmp(m->transport, "sse") == 0)
        want = "sse";
    if (m->transport && strcmp(m->transport, want) != 0)
        return fail_at(w->ld, LOOM_EINVALID, line_of(given(w, "transport")),
                       w->key, "transport %s needs %s", m->transport,
                       m->command ? "url, not command" : "command, not url");
    if (!m->transport && !(m->transport = strdup(want)))
        return loom__error_oom();
    if (m->url && (m->args_len || m->cwd || json_object_size(m->env)))
        return fail_at(w->ld, LOOM_EINVALID, w->line, w->key,
                       "args, env and cwd are for a command (stdio)");
    if (m->command && json_object_size(m->headers))
        return fail_at(w->ld, LOOM_EINVALID, line_of(given(w, "headers")),
                       w->key, "headers are for a url (http)");
    if (m->command && given(w, "oauth"))
        return fail_at(w->ld, LOOM_EINVALID, line_of(given(w, "oauth")), w->key,
                       "oauth is for a url (http)");
    if (m->oauth.client_secret && !m->oauth.client_id)
        return fail_at(w->ld, LOOM_EINVALID, line_of(given(w, "oauth")), w->key,
                       "oauth client_secret needs client_id");
    return 0;
}

static int mcp_server_init(loader *ld, const entry *e, const char *key,
                           void *obj)
{
    loom_mcp_server_config *m = obj;

    (void)ld;
    (void)key;
    m->timeout_ms = 60000;
    m->startup_timeout_ms = 30000;
    m->sampling_max_tokens = LOOM_MCP_SAMPLING_MAX_TOKENS;
    if (!(m->name = strdup(e->name)) || !(m->env = json_object()) ||
        !(m->headers = json_object()))
        return loom__error_oom();
    return 0;
}

static int scope_ok(walk_ctx *w, const yaml_node_t *item, const char *key,
                    const char *s, int repeat)
{
    if (!s || !*s || strpbrk(s, " \"\\"))
        return fail_at(w->ld, LOOM_EINVALID, line_of(item), key,
                       "must be an OAuth scope (no spaces or quotes), got "
                       "'%s'",
                       s ? s : "");
    if (repeat)
        return fail_at(w->ld, LOOM_EINVALID, line_of(item), key,
                       "scope '%s' is listed twice", s);
    return 0;
}

/* `oauth: {scopes: [...]}` of an HTTP server. */
static int read_oauth_scopes(walk_ctx *w, const field *f, const yaml_node_t *n,
                             const char *key)
{
    loom_mcp_oauth_config *o = w->obj;

    (void)f;
    return read_strings(w, n, key, "scopes", "a scope", scope_ok, &o->scopes,
                        &o->scopes_len, NULL);
}

static const char *const oauth_methods[] = {"client_secret_basic",
                                            "client_secret_post", "none",
                                            "private_key_jwt", NULL};
static const char *const oauth_grants[] = {"authorization_code",
                                           "client_credentials", NULL};
static const char *const oauth_algs[] = {"ES256", "RS256", NULL};

#define O loom_mcp_oauth_config
static const field mcp_oauth_fields[] = {
    {K_BOOL("enabled", O, disabled), .flags = F_NEGATE},
    {K_STR("client_id", O, client_id, "a client id"), .flags = F_NONEMPTY},
    {K_STR("client_secret", O, client_secret, "a secret"), .flags = F_NONEMPTY},
    {K_STR("auth_method", O, auth_method, "a token endpoint auth method"),
     .choices = oauth_methods},
    {K_STR("client_metadata_url", O, client_metadata_url, "a URL"), URL_RULE},
    {K_STR("client_name", O, client_name, "a name"), .flags = F_NONEMPTY},
    {K_FN("scopes", read_oauth_scopes)},
    {K_STR("grant_type", O, grant_type, "a grant type"),
     .choices = oauth_grants},
    {K_STR("private_key", O, private_key, "a PEM private key"),
     .flags = F_NONEMPTY},
    {K_STR("signing_alg", O, signing_alg, "ES256 or RS256"),
     .choices = oauth_algs},
};
static const section mcp_oauth_section = SECTION(mcp_oauth_fields, NULL, NULL);
#undef O

static const char *const mcp_sampling[] = {"allow", "deny", NULL};

#define S loom_mcp_server_config
static const field mcp_server_fields[] = {
    {K_STR("command", S, command, "a program"), .flags = F_NONEMPTY},
    {K_FN("args", read_mcp_args)},
    {K_FN("env", read_mcp_env), AT(S, env)},
    {K_STR("cwd", S, cwd, "a directory"), .flags = F_NONEMPTY},
    {K_STR("url", S, url, "a URL"), URL_RULE},
    {K_FN("headers", read_headers), AT(S, headers)},
    {K_STR("transport", S, transport, "stdio, http or sse"), .flags = F_LOWER,
     .choices = mcp_transports},
    {K_FN("tools", read_mcp_tools)},
    {K_LONG("timeout_ms", S, timeout_ms, 100, 86400000L)},
    {K_LONG("startup_timeout_ms", S, startup_timeout_ms, 100, 600000L)},
    {K_STR("protocol_version", S, protocol_version, "an MCP protocol version"),
     .choices = mcp_versions},
    {K_SUB("oauth", mcp_oauth_section), AT(S, oauth)},
    {K_FN("roots", read_mcp_roots)},
    {K_STR("sampling", S, sampling, "allow or deny"), .flags = F_LOWER,
     .choices = mcp_sampling},
    {K_LONG("sampling_max_tokens", S, sampling_max_tokens, 1, TOKENS_MAX)},
};
static const section mcp_server_section =
    SECTION(mcp_server_fields, NULL, mcp_server_check);
static const list_spec mcp_server_list = {
    "MCP server",
    0,
    sizeof(S),
    offsetof(loom_config, mcp_servers),
    offsetof(loom_config, mcp_servers_len),
    mcp_server_init,
    &mcp_server_section};
#undef S

/* ---- research ----------------------------------------------------------- */

/* `researcher_tools:` tool names offered to researchers besides web_search
 * and web_fetch. */
static int read_researcher_tools(walk_ctx *w, const field *f,
                                 const yaml_node_t *n, const char *key)
{
    loom_research_config *r = w->obj;

    (void)f;
    return read_strings(w, n, key, "tool names", "a tool name", mcp_tool_ok,
                        &r->researcher_tools, &r->researcher_tools_len, NULL);
}

#define R loom_research_config
static const field research_fields[] = {
    {K_STR("model", R, model, "a model name"), .flags = F_MODEL},
    {K_STR("researcher_model", R, researcher_model, "a model name"),
     .flags = F_MODEL},
    {K_INT("max_cycles", R, max_cycles, 1, 100)},
    {K_INT("max_cycles_reasoning", R, max_cycles_reasoning, 1, 100)},
    {K_INT("max_parallel_researchers", R, max_parallel_researchers, 1, 64)},
    {K_INT("researcher_max_searches", R, researcher_max_searches, 1, 50)},
    {K_LONG("report_max_tokens", R, report_max_tokens, 100, TOKENS_MAX)},
    {K_LONG("time_limit_s", R, time_limit_s, 1, 7L * 86400)},
    {K_BOOL("clarify", R, clarify)},
    {K_LONG("min_context_tokens", R, min_context_tokens, 0, TOKENS_MAX)},
    {K_FN("researcher_tools", read_researcher_tools)},
    {K_PRICE("max_cost_usd", R, max_cost_micros)},
    {K_LONG("max_tokens", R, max_tokens, 0, 1L << 40)},
};
#undef R
static const section research_section = SECTION(research_fields, NULL, NULL);

/* ---- the document ------------------------------------------------------- */

/* The top-level keys. Sections refer to those read before them, hence
 * the passes: providers and routing first (models start from the
 * routing policy), then models, agents, default_agent and the tools, and
 * the server last. */
static const field top_fields[] = {
    {K_SUB("log", log_section)},
    {K_FN("providers", read_providers)},
    {K_LIST("models", model_list), .pass = 1},
    {K_LIST("agents", agent_list), .pass = 1},
    {K_FN("default_agent", read_default_agent), .pass = 1},
    {K_FN("tools", read_tools), .pass = 1},
    {K_SUB("server", server_section), AT(loom_config, server), .pass = 2},
    {K_SUB("routing", routing_section), AT(loom_config, routing)},
    {K_LIST("http_tools", http_tool_list), .pass = 1},
    {K_LIST("mcp_servers", mcp_server_list), .pass = 1},
    {K_SUB("research", research_section), AT(loom_config, research), .pass = 1},
    {K_SUB("auth", auth_section), AT(loom_config, auth)},
};

/*
 * Every agent's sub_agents must name agents of the config (any order in
 * the file, itself included: a cycle is bounded by max_depth when it
 * runs). Each unknown name is one error at its line.
 */
static int check_sub_agents(walk_ctx *w)
{
    loader *ld = w->ld;
    const loom_config *cfg = ld->cfg;
    char key[KEY_LEN], sub[KEY_LEN], tmp[64], known[256];
    int rc = 0;

    for (size_t i = 0; i < cfg->agents_len; i++) {
        const loom_agent_config *a = &cfg->agents[i];
        for (size_t j = 0; j < a->sub_agents_len; j++) {
            int r;
            if (loom_config_agent(cfg, a->sub_agents[j]))
                continue;
            snprintf(key, sizeof(key), "agents.%s.sub_agents", a->name);
            index_key(sub, sizeof(sub), key, j);
            r = fail_at(ld, LOOM_EINVALID,
                        a->sub_agents_lines ? a->sub_agents_lines[j] : 0, sub,
                        "agent '%s' is not defined under agents (agents: %s)",
                        loom__config_shown(tmp, sizeof(tmp), a->sub_agents[j]),
                        agent_names(known, sizeof(known), cfg));
            if (!go_on(ld, r))
                return r;
            rc = rc ? rc : r;
        }
    }
    return rc;
}

/* After every agent is read: what agents name of other agents. */
static int check_agent_refs(walk_ctx *w)
{
    int rc = check_handoffs(w), rc2;

    if (rc && !go_on(w->ld, rc))
        return rc;
    rc2 = check_sub_agents(w);
    return rc ? rc : rc2;
}

static const section top_section = SECTION(top_fields, NULL, check_agent_refs);

static int parse_document(loader *ld)
{
    yaml_node_t *root = yaml_document_get_root_node(ld->doc);

    if (!root || is_null(root))
        return 0;
    if (root->type != YAML_MAPPING_NODE)
        return fail_at(ld, LOOM_EINVALID, line_of(root), NULL,
                       "the top level must be a mapping, got %s",
                       kind_name(root));
    return walk(ld, root, NULL, line_of(root), &top_section, ld->cfg);
}

/* ---- the YAML layer --------------------------------------------------- */

/* The 1-based line of byte offset off in data. */
static size_t line_at(const char *data, size_t len, size_t off)
{
    size_t line = 1;

    for (size_t i = 0; i < off && i < len; i++)
        if (data[i] == '\n')
            line++;
    return line;
}

static int yaml_fail(const char *name, const yaml_parser_t *p, const char *data,
                     size_t len)
{
    size_t line;

    if (p->error == YAML_MEMORY_ERROR)
        return loom__error_oom();
    if (p->error == YAML_READER_ERROR)
        return loom__error_set(LOOM_EINVALID, "%s:%zu: %s", name,
                               line_at(data, len, p->problem_offset),
                               p->problem ? p->problem : "unreadable input");
    line = p->problem_mark.line + 1;
    if (p->context)
        return loom__error_set(LOOM_EINVALID,
                               "%s:%zu: %s (%s started on line %zu)", name,
                               line, p->problem ? p->problem : "syntax error",
                               p->context, p->context_mark.line + 1);
    return loom__error_set(LOOM_EINVALID, "%s:%zu: %s", name, line,
                           p->problem ? p->problem : "syntax error");
}

/*
 * The event pass: syntax, one document at most, and nesting depth, all
 * checked before the document API builds anything.
 */
static int check_events(const char *name, const char *data, size_t len)
{
    yaml_parser_t p;
    yaml_event_t ev;
    int depth = 0, docs = 0, rc = 0, done = 0;

    if (!yaml_parser_initialize(&p))
        return loom__error_oom();
    yaml_parser_set_input_string(&p, (const unsigned char *)data, len);
    while (!done && rc == 0) {
        if (!yaml_parser_parse(&p, &ev)) {
            rc = yaml_fail(name, &p, data, len);
            break;
        }
        switch (ev.type) {
        case YAML_DOCUMENT_START_EVENT:
            if (++docs > 1)
                rc = loom__error_set(LOOM_EINVALID,
                                     "%s:%zu: only one YAML document is "
                                     "allowed",
                                     name, ev.start_mark.line + 1);
            break;
        case YAML_SEQUENCE_START_EVENT:
        case YAML_MAPPING_START_EVENT:
            if (++depth > CONFIG_MAX_DEPTH)
                rc = loom__error_set(
                    LOOM_ETOOLARGE, "%s:%zu: nesting deeper than %d levels",
                    name, ev.start_mark.line + 1, CONFIG_MAX_DEPTH);
            break;
        case YAML_SEQUENCE_END_EVENT:
        case YAML_MAPPING_END_EVENT:
            depth--;
            break;
        case YAML_STREAM_END_EVENT:
            done = 1;
            break;
        default:
            break;
        }
        yaml_event_delete(&ev);
    }
    yaml_parser_delete(&p);
    return rc;
}

/*
 * Reads the YAML text into cfg, over what cfg already holds, every error
 * into errs (config_internal.h says which stop the reading). On error cfg
 * may be half filled: the caller frees it.
 */
int loom__config_parse_yaml(loom_config *cfg, const char *data, size_t len,
                            const char *name, loom__config_errors *errs)
{
    yaml_parser_t parser;
    yaml_document_t doc;
    loader ld;
    int doc_ok = 0, rc;

    if ((rc = check_events(name, data, len)) != 0)
        return rc;
    if (!yaml_parser_initialize(&parser))
        return loom__error_oom();
    yaml_parser_set_input_string(&parser, (const unsigned char *)data, len);
    if (!(doc_ok = yaml_parser_load(&parser, &doc))) {
        rc = yaml_fail(name, &parser, data, len);
        goto cleanup;
    }
    memset(&ld, 0, sizeof(ld));
    ld.name = name;
    ld.doc = &doc;
    ld.cfg = cfg;
    ld.errs = errs;
    rc = parse_document(&ld);

cleanup:
    if (doc_ok)
        yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return rc;
}
