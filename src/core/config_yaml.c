/*
 * Configuration: reading YAML into a loom_config. libyaml reads the text
 * twice: an event pass that checks syntax, the document count and the
 * nesting depth before anything is built, then the document API, whose
 * nodes carry the line numbers every message needs ("loom.yaml:12:
 * agents.helper.max_iterations: ..."). The known sections are walked in a
 * fixed order (providers, models, agents, default_agent) so references
 * are checked as they are read, with the line of the value that refers.
 * ${VAR} interpolation is applied to scalar values (not keys) before they
 * are converted to numbers or booleans. Limits besides the 4 MiB checked
 * by config.c: 64 levels of nesting, 100,000 visited nodes and 16 MiB of
 * scalar text (the last two bound what aliases and ${VAR} expand into).
 */
#include "core/config_internal.h"
#include "core/error.h"
#include "loom/buf.h"
#include "loom/config.h"
#include "loom/log.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
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
    size_t nodes; /* nodes visited; an alias counts every time */
    size_t text;  /* bytes of scalar text produced */
} loader;

/* One entry of a mapping whose keys the user chooses (names). */
typedef struct {
    const char *name;
    yaml_node_t *key;
    yaml_node_t *value;
} entry;

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

/* Raises code with "<file>:<line>: <key>: <problem>" (no key part when key
 * is NULL or empty). Returns code. */
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
        return loom__error_set(code, "%s:%zu: %s: %s", ld->name, line, key,
                               msg);
    return loom__error_set(code, "%s:%zu: %s", ld->name, line, msg);
}

static const char *known_names(char *dst, size_t cap, const char *const *names,
                               size_t n)
{
    dst[0] = '\0';
    for (size_t i = 0; i < n; i++)
        loom__config_names_add(dst, cap, names[i]);
    return n ? dst : "none";
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
 * is a literal "${" and any other '$' is kept. The default (up to the
 * first '}') is used when VAR is unset or empty. Written by hand because
 * neither libyaml nor libc offers it (wordexp(3) would also run commands
 * and split words).
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
 * Reads a mapping with a fixed set of keys (known, NULL-terminated) into
 * vals, in the same order (NULL for a key not given). Unknown and
 * duplicate keys are errors. A null node is an empty mapping.
 */
static int read_fields(loader *ld, const yaml_node_t *map, const char *key,
                       const char *const *known, yaml_node_t **vals)
{
    char list[512], tmp[64];
    size_t n = 0;
    int rc;

    while (known[n])
        vals[n++] = NULL;
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

        if ((rc = key_text(ld, k, key, &name)) != 0)
            return rc;
        for (i = 0; i < n && strcmp(known[i], name) != 0; i++)
            ;
        if (i == n)
            return fail_at(ld, LOOM_EINVALID, line_of(k), key,
                           "unknown key '%s' (known: %s)",
                           loom__config_shown(tmp, sizeof(tmp), name),
                           known_names(list, sizeof(list), known, n));
        if (vals[i])
            return fail_at(ld, LOOM_EINVALID, line_of(k), key,
                           "duplicate key '%s'", name);
        vals[i] = node_at(ld, p->value);
    }
    return 0;
}

/*
 * The entries of a mapping whose keys are names the user picks (providers,
 * agents, headers...): keys are checked to be strings and unique. *out is
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
    for (size_t i = 0; i < n; i++) {
        yaml_node_pair_t *p = map->data.mapping.pairs.start + i;
        char tmp[64];

        v[i].key = node_at(ld, p->key);
        v[i].value = node_at(ld, p->value);
        if ((rc = key_text(ld, v[i].key, key, &v[i].name)) != 0)
            goto cleanup;
        if (json_object_get(seen, v[i].name)) {
            rc = fail_at(ld, LOOM_EINVALID, line_of(v[i].key), key,
                         "duplicate key '%s'",
                         loom__config_shown(tmp, sizeof(tmp), v[i].name));
            goto cleanup;
        }
        if (json_object_set_new(seen, v[i].name, json_true()) != 0) {
            rc = loom__error_oom();
            goto cleanup;
        }
    }
    *out = v;
    *len = n;
    v = NULL;

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

/* ---- the sections ----------------------------------------------------- */

static void lower(char *s)
{
    for (; s && *s; s++)
        if (*s >= 'A' && *s <= 'Z')
            *s = (char)(*s - 'A' + 'a');
}

/* Both are stored in lower case ("warning" stays "warning", which
 * loom_log_level_parse accepts) so callers can compare with strcmp. */
static int parse_log(loader *ld, const yaml_node_t *n)
{
    static const char *const known[] = {"level", "format", NULL};
    yaml_node_t *v[2];
    char tmp[64];
    loom_config *cfg = ld->cfg;
    int rc;

    if ((rc = read_fields(ld, n, "log", known, v)) != 0)
        return rc;
    if (v[0]) {
        rc = get_str(ld, v[0], "log.level", "a log level", &cfg->log_level);
        if (rc != 0)
            return rc;
        lower(cfg->log_level);
        if (cfg->log_level && loom_log_level_parse(cfg->log_level) < 0)
            return fail_at(
                ld, LOOM_EINVALID, line_of(v[0]), "log.level",
                "must be debug, info, warn, error or off, got "
                "'%s'",
                loom__config_shown(tmp, sizeof(tmp), cfg->log_level));
    }
    if (v[1]) {
        rc = get_str(ld, v[1], "log.format", "text or json", &cfg->log_format);
        if (rc != 0)
            return rc;
        lower(cfg->log_format);
        if (cfg->log_format && strcmp(cfg->log_format, "text") != 0 &&
            strcmp(cfg->log_format, "json") != 0)
            return fail_at(
                ld, LOOM_EINVALID, line_of(v[1]), "log.format",
                "must be text or json, got '%s'",
                loom__config_shown(tmp, sizeof(tmp), cfg->log_format));
    }
    return 0;
}

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

static int parse_headers(loader *ld, const yaml_node_t *n, const char *key,
                         json_t *headers)
{
    entry *es = NULL;
    size_t len = 0;
    char sub[KEY_LEN], tmp[64], *s = NULL;
    int rc;

    if ((rc = read_entries(ld, n, key, &es, &len)) != 0)
        return rc;
    for (size_t i = 0; i < len; i++) {
        join_key(sub, sizeof(sub), key, es[i].name);
        if (!valid_header_name(es[i].name)) {
            rc = fail_at(ld, LOOM_EINVALID, line_of(es[i].key), key,
                         "'%s' is not a valid HTTP header name",
                         loom__config_shown(tmp, sizeof(tmp), es[i].name));
            goto cleanup;
        }
        if ((rc = get_str(ld, es[i].value, sub, "a string", &s)) != 0)
            goto cleanup;
        if (!s && !(s = strdup(""))) {
            rc = loom__error_oom();
            goto cleanup;
        }
        if (strpbrk(s, "\r\n")) {
            rc = fail_at(ld, LOOM_EINVALID, line_of(es[i].value), sub,
                         "header values must not contain line breaks");
            goto cleanup;
        }
        if (json_object_set_new(headers, es[i].name, json_string(s)) != 0) {
            rc = fail_at(ld, LOOM_EINVALID, line_of(es[i].value), sub,
                         "is not valid UTF-8");
            goto cleanup;
        }
        free(s);
        s = NULL;
    }

cleanup:
    free(s);
    free(es);
    return rc;
}

static int parse_provider(loader *ld, const entry *e, loom_provider_config *p)
{
    static const char *const known[] = {
        "kind", "base_url", "api_key", "headers", "timeouts", "retries", NULL};
    static const char *const tknown[] = {"connect_ms", "first_byte_ms",
                                         "idle_ms", NULL};
    static const char *const rknown[] = {"max", "base_delay_ms", "max_delay_ms",
                                         NULL};
    enum { KIND, URL, KEY, HEADERS, TIMEOUTS, RETRIES, NFIELDS };
    yaml_node_t *v[NFIELDS], *t[3], *r[3];
    char key[KEY_LEN], sub[KEY_LEN], tmp[64], *s = NULL;
    const char *default_url = NULL;
    int rc;

    if ((rc = loom__config_provider_init(p, e->name)) != 0)
        return rc;
    join_key(key, sizeof(key), "providers", e->name);
    if ((rc = read_fields(ld, e->value, key, known, v)) != 0)
        return rc;

    join_key(sub, sizeof(sub), key, "kind");
    if (v[KIND] && (rc = get_str(ld, v[KIND], sub, "a string", &s)) != 0)
        return rc;
    if (s && !loom__config_kind_known(s, NULL)) {
        rc = fail_at(ld, LOOM_EINVALID, line_of(v[KIND]), sub,
                     "must be one of: %s, got '%s'",
                     loom__config_kind_names(),
                     loom__config_shown(tmp, sizeof(tmp), s));
        free(s);
        return rc;
    }
    if (s) {
        free(p->kind);
        p->kind = s;
        s = NULL;
    }
    loom__config_kind_known(p->kind, &default_url);

    join_key(sub, sizeof(sub), key, "base_url");
    if (v[URL] && (rc = get_str(ld, v[URL], sub, "a URL", &p->base_url)) != 0)
        return rc;
    /* Providers with one public endpoint may leave it out; "openai" is
     * any OpenAI-compatible server, so it names its own. */
    if (!p->base_url && default_url &&
        !(p->base_url = strdup(default_url)))
        return loom__error_oom();
    if (!p->base_url)
        return fail_at(ld, LOOM_EINVALID, line_of(e->key), key,
                       "missing required key 'base_url' (kind %s)",
                       p->kind);
    if (!loom__config_valid_url(p->base_url))
        return fail_at(ld, LOOM_EINVALID, line_of(v[URL]), sub,
                       "must be an http:// or https:// URL, got '%s'",
                       loom__config_shown(tmp, sizeof(tmp), p->base_url));
    loom__config_strip_slashes(p->base_url);

    join_key(sub, sizeof(sub), key, "api_key");
    if (v[KEY] && (rc = get_str(ld, v[KEY], sub, "a string", &p->api_key)) != 0)
        return rc;
    if (p->api_key && !*p->api_key) {
        free(p->api_key);
        p->api_key = NULL;
    }

    join_key(sub, sizeof(sub), key, "headers");
    if (v[HEADERS] &&
        (rc = parse_headers(ld, v[HEADERS], sub, p->headers)) != 0)
        return rc;

    join_key(sub, sizeof(sub), key, "timeouts");
    if (v[TIMEOUTS]) {
        long *dst[] = {&p->connect_timeout_ms, &p->first_byte_timeout_ms,
                       &p->idle_timeout_ms};
        char field[KEY_LEN];

        if ((rc = read_fields(ld, v[TIMEOUTS], sub, tknown, t)) != 0)
            return rc;
        for (int i = 0; i < 3; i++) {
            join_key(field, sizeof(field), sub, tknown[i]);
            if ((rc = get_long(ld, t[i], field, TIMEOUT_MIN, TIMEOUT_MAX,
                               dst[i])) != 0)
                return rc;
        }
    }

    join_key(sub, sizeof(sub), key, "retries");
    if (v[RETRIES]) {
        char field[KEY_LEN];

        if ((rc = read_fields(ld, v[RETRIES], sub, rknown, r)) != 0)
            return rc;
        join_key(field, sizeof(field), sub, "max");
        if ((rc = get_int(ld, r[0], field, 0, 10, &p->max_retries)) != 0)
            return rc;
        join_key(field, sizeof(field), sub, "base_delay_ms");
        if ((rc = get_long(ld, r[1], field, 0, TIMEOUT_MAX,
                           &p->retry_base_delay_ms)) != 0)
            return rc;
        join_key(field, sizeof(field), sub, "max_delay_ms");
        if ((rc = get_long(ld, r[2], field, 0, TIMEOUT_MAX,
                           &p->retry_max_delay_ms)) != 0)
            return rc;
        /* Without max_delay_ms, a long base delay raises the cap. */
        if (!r[2] && p->retry_max_delay_ms < p->retry_base_delay_ms)
            p->retry_max_delay_ms = p->retry_base_delay_ms;
        if (p->retry_max_delay_ms < p->retry_base_delay_ms)
            return fail_at(ld, LOOM_EINVALID, line_of(r[2]), field,
                           "must be at least base_delay_ms (%ld), got %ld",
                           p->retry_base_delay_ms, p->retry_max_delay_ms);
    }
    return 0;
}

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
                   what,
                   dots ? "[a-zA-Z0-9_.-]{1,64}" : "[a-zA-Z0-9_-]{1,64}");
}

static int parse_providers(loader *ld, const yaml_node_t *n)
{
    loom_provider_config p;
    entry *es = NULL;
    size_t len = 0;
    int rc;

    memset(&p, 0, sizeof(p));
    if ((rc = read_entries(ld, n, "providers", &es, &len)) != 0)
        return rc;
    for (size_t i = 0; i < len; i++) {
        if ((rc = check_name(ld, line_of(es[i].key), "providers", es[i].name, 1, "provider")) != 0)
            goto cleanup;
        if ((rc = parse_provider(ld, &es[i], &p)) != 0 ||
            (rc = loom__config_provider_install(ld->cfg, &p)) != 0)
            goto cleanup;
    }

cleanup:
    loom__config_provider_clear(&p);
    free(es);
    return rc;
}

/*
 * A routing policy (`routing:` at the top or in a model) over what *rp
 * holds: keys left out keep their value, so a model's policy starts from
 * the top-level one.
 */
static int parse_routing(loader *ld, const yaml_node_t *n, const char *key,
                         loom_routing_policy *rp)
{
    static const char *const known[] = {"retries", "cooldown_ms",
                                        "failures_before_cooldown", NULL};
    yaml_node_t *v[3];
    char sub[KEY_LEN];
    int rc;

    if ((rc = read_fields(ld, n, key, known, v)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "retries");
    if ((rc = get_int(ld, v[0], sub, 0, 10, &rp->retries)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "cooldown_ms");
    if ((rc = get_long(ld, v[1], sub, 0, TIMEOUT_MAX, &rp->cooldown_ms)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "failures_before_cooldown");
    return get_int(ld, v[2], sub, 1, 1000, &rp->failures_before_cooldown);
}

static int parse_capabilities(loader *ld, const yaml_node_t *n,
                              const char *key, loom_model_capabilities *c)
{
    static const char *const known[] = {"tools", "parallel_tool_calls",
                                        "reasoning", "vision", NULL};
    int *dst[] = {&c->tools, &c->parallel_tool_calls, &c->reasoning,
                  &c->vision};
    yaml_node_t *v[4];
    char sub[KEY_LEN];
    int rc;

    if ((rc = read_fields(ld, n, key, known, v)) != 0)
        return rc;
    for (int i = 0; i < 4; i++) {
        join_key(sub, sizeof(sub), key, known[i]);
        if ((rc = get_bool(ld, v[i], sub, dst[i])) != 0)
            return rc;
    }
    return 0;
}

/* `reasoning: {effort, thinking_budget}`; the model must say it supports
 * reasoning controls (capabilities.reasoning). */
static int parse_reasoning(loader *ld, const yaml_node_t *n, const char *key,
                           loom_model_config *m)
{
    static const char *const known[] = {"effort", "thinking_budget", NULL};
    static const char *const efforts[] = {"minimal", "low", "medium",
                                          "high"};
    yaml_node_t *v[2];
    char sub[KEY_LEN], tmp[64];
    size_t i;
    int rc;

    if ((rc = read_fields(ld, n, key, known, v)) != 0)
        return rc;
    if ((v[0] || v[1]) && !m->capabilities.reasoning)
        return fail_at(ld, LOOM_EINVALID, line_of(n), key,
                       "reasoning controls need capabilities.reasoning: "
                       "true");
    join_key(sub, sizeof(sub), key, "effort");
    if (v[0] &&
        (rc = get_str(ld, v[0], sub, "a reasoning effort",
                      &m->reasoning_effort)) != 0)
        return rc;
    if (m->reasoning_effort) {
        for (i = 0; i < 4 && strcmp(efforts[i], m->reasoning_effort); i++)
            ;
        if (i == 4)
            return fail_at(
                ld, LOOM_EINVALID, line_of(v[0]), sub,
                "must be minimal, low, medium or high, got '%s'",
                loom__config_shown(tmp, sizeof(tmp), m->reasoning_effort));
    }
    join_key(sub, sizeof(sub), key, "thinking_budget");
    return get_long(ld, v[1], sub, 1, TOKENS_MAX, &m->thinking_budget);
}

/* One price, exactly (loom_price_parse); a null keeps *out. */
static int get_price(loader *ld, const yaml_node_t *n, const char *key,
                     int64_t *out)
{
    char tmp[64], why[256], *s = NULL;
    int rc;

    if (!n)
        return 0;
    if ((rc = get_str(ld, n, key, "a price in dollars per million tokens",
                      &s)) != 0 ||
        !s)
        return rc;
    if (loom_price_parse(out, s) != 0) {
        snprintf(why, sizeof(why), "%s", loom_error_last());
        rc = fail_at(ld, LOOM_EINVALID, line_of(n), key, "%s, got '%s'", why,
                     loom__config_shown(tmp, sizeof(tmp), s));
    }
    free(s);
    return rc;
}

static int parse_prices(loader *ld, const yaml_node_t *n, const char *key,
                        loom_model_prices *pr)
{
    static const char *const known[] = {"input", "cached_input",
                                        "cache_write", "output",
                                        "reasoning", NULL};
    int64_t *dst[] = {&pr->input, &pr->cached_input, &pr->cache_write,
                      &pr->output, &pr->reasoning};
    yaml_node_t *v[5];
    char sub[KEY_LEN];
    int rc;

    if ((rc = read_fields(ld, n, key, known, v)) != 0 || is_null(n))
        return rc;
    /* Both main prices are needed: a missing one would be billed as
     * free, which is never what a typo meant. */
    if (!v[0] || is_null(v[0]) || !v[3] || is_null(v[3]))
        return fail_at(ld, LOOM_EINVALID, line_of(n), key,
                       "missing required key '%s' (input and output are "
                       "both required; write 0 for free)",
                       !v[0] || is_null(v[0]) ? "input" : "output");
    for (int i = 0; i < 5; i++) {
        join_key(sub, sizeof(sub), key, known[i]);
        if ((rc = get_price(ld, v[i], sub, dst[i])) != 0)
            return rc;
    }
    pr->set = 1;
    return 0;
}

/* `fallbacks: [provider/model, ...]`: each must resolve, once, and not be
 * the model itself. */
static int parse_fallbacks(loader *ld, const yaml_node_t *n, const char *key,
                           loom_model_config *m)
{
    char sub[KEY_LEN], tmp[64], why[512], *s = NULL;
    size_t count, i = 0;
    int rc;

    if ((rc = visit(ld, n)) != 0 || is_null(n))
        return rc;
    if (n->type != YAML_SEQUENCE_NODE)
        return fail_at(ld, LOOM_EINVALID, line_of(n), key,
                       "must be a list of model names, got %s",
                       kind_name(n));
    count = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (count > LOOM_MODEL_MAX_FALLBACKS)
        return fail_at(ld, LOOM_EINVALID, line_of(n), key,
                       "at most %d fallbacks, got %zu",
                       LOOM_MODEL_MAX_FALLBACKS, count);
    if (count == 0)
        return 0;
    if (!(m->fallbacks = calloc(count, sizeof(*m->fallbacks))))
        return loom__error_oom();
    for (yaml_node_item_t *it = n->data.sequence.items.start;
         it < n->data.sequence.items.top; it++, i++) {
        yaml_node_t *item = node_at(ld, *it);

        index_key(sub, sizeof(sub), key, i);
        if ((rc = get_str(ld, item, sub, "a model name", &s)) != 0)
            return rc;
        if (!s)
            return fail_at(ld, LOOM_EINVALID, line_of(item), sub,
                           "must be a model name, got null");
        if (loom__config_model_unresolved(ld->cfg, s, why, sizeof(why))) {
            free(s);
            return fail_at(ld, LOOM_EINVALID, line_of(item), sub, "%s", why);
        }
        if (strcmp(s, m->name) == 0) {
            free(s);
            return fail_at(ld, LOOM_EINVALID, line_of(item), sub,
                           "a model cannot be its own fallback");
        }
        for (size_t j = 0; j < m->fallbacks_len; j++) {
            if (strcmp(m->fallbacks[j], s) == 0) {
                rc = fail_at(ld, LOOM_EINVALID, line_of(item), sub,
                             "'%s' is listed twice",
                             loom__config_shown(tmp, sizeof(tmp), s));
                free(s);
                return rc;
            }
        }
        m->fallbacks[m->fallbacks_len++] = s;
        s = NULL;
    }
    return 0;
}

/* context_window_fallback: one model that resolves, not the model
 * itself; null is none. Whether its window is larger is checked when a
 * run uses it. */
static int parse_window_fallback(loader *ld, const yaml_node_t *n,
                                 const char *key, loom_model_config *m)
{
    char why[512], tmp[64];
    int rc;

    if ((rc = get_str(ld, n, key, "a model name",
                      &m->context_window_fallback)) != 0)
        return rc;
    if (!m->context_window_fallback)
        return 0; /* null: none */
    if (loom__config_model_unresolved(ld->cfg, m->context_window_fallback,
                                      why, sizeof(why)))
        return fail_at(ld, LOOM_EINVALID, line_of(n), key, "%s", why);
    if (strcmp(m->context_window_fallback, m->name) == 0)
        return fail_at(ld, LOOM_EINVALID, line_of(n), key,
                       "'%s' cannot be its own context window fallback",
                       loom__config_shown(tmp, sizeof(tmp), m->name));
    return 0;
}

static int parse_model(loader *ld, const entry *e, loom_model_config *m)
{
    static const char *const known[] = {
        "upstream",     "context_window", "max_output_tokens",
        "capabilities", "reasoning",      "prompt_cache",
        "chain_responses", "prices",      "fallbacks",
        "routing",      "context_window_fallback", NULL};
    enum { UPSTREAM, WINDOW, MAXOUT, CAPS, REASONING, PCACHE, CHAIN, PRICES,
           FALLBACKS, ROUTING, WINDOW_FALLBACK, NFIELDS };
    yaml_node_t *v[NFIELDS];
    char key[KEY_LEN], sub[KEY_LEN], tmp[64], known_p[256];
    size_t plen = loom__config_provider_part(e->name);
    int rc;

    loom__config_model_defaults(m, ld->cfg);
    join_key(key, sizeof(key), "models", e->name);
    if (plen == 0)
        return fail_at(ld, LOOM_EINVALID, line_of(e->key), "models",
                       "'%s' is not of the form provider/model",
                       loom__config_shown(tmp, sizeof(tmp), e->name));
    if (!loom__config_find_provider_n(ld->cfg, e->name, plen))
        return fail_at(
            ld, LOOM_EINVALID, line_of(e->key), key,
            "provider '%.*s' is not defined (providers: %s)",
            (int)(plen < 64 ? plen : 64), e->name,
            loom__config_provider_names(known_p, sizeof(known_p), ld->cfg));
    if (!(m->name = strdup(e->name)) || !(m->provider = strndup(e->name, plen)))
        return loom__error_oom();
    if ((rc = read_fields(ld, e->value, key, known, v)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "upstream");
    if (v[UPSTREAM] &&
        (rc = get_str(ld, v[UPSTREAM], sub, "a string", &m->upstream)) != 0)
        return rc;
    if (m->upstream && !*m->upstream)
        return fail_at(ld, LOOM_EINVALID, line_of(v[UPSTREAM]), sub,
                       "must not be empty");
    if (!m->upstream && !(m->upstream = strdup(e->name + plen + 1)))
        return loom__error_oom();
    join_key(sub, sizeof(sub), key, "context_window");
    if ((rc = get_long(ld, v[WINDOW], sub, 0, TOKENS_MAX,
                       &m->context_window)))
        return rc;
    join_key(sub, sizeof(sub), key, "max_output_tokens");
    if ((rc = get_long(ld, v[MAXOUT], sub, 0, TOKENS_MAX,
                       &m->max_output_tokens)))
        return rc;
    join_key(sub, sizeof(sub), key, "capabilities");
    if (v[CAPS] &&
        (rc = parse_capabilities(ld, v[CAPS], sub, &m->capabilities)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "reasoning");
    if (v[REASONING] &&
        (rc = parse_reasoning(ld, v[REASONING], sub, m)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "prompt_cache");
    if ((rc = get_bool(ld, v[PCACHE], sub, &m->prompt_cache)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "chain_responses");
    if ((rc = get_bool(ld, v[CHAIN], sub, &m->chain_responses)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "prices");
    if (v[PRICES] && (rc = parse_prices(ld, v[PRICES], sub, &m->prices)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "fallbacks");
    if (v[FALLBACKS] &&
        (rc = parse_fallbacks(ld, v[FALLBACKS], sub, m)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "routing");
    if (v[ROUTING] &&
        (rc = parse_routing(ld, v[ROUTING], sub, &m->routing)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "context_window_fallback");
    if (v[WINDOW_FALLBACK] &&
        (rc = parse_window_fallback(ld, v[WINDOW_FALLBACK], sub, m)) != 0)
        return rc;
    return 0;
}

static int parse_models(loader *ld, const yaml_node_t *n)
{
    loom_config *cfg = ld->cfg;
    entry *es = NULL;
    size_t len = 0;
    int rc;

    if ((rc = read_entries(ld, n, "models", &es, &len)) != 0 || len == 0)
        goto cleanup;
    if (!(cfg->models = calloc(len, sizeof(*cfg->models)))) {
        rc = loom__error_oom();
        goto cleanup;
    }
    for (size_t i = 0; i < len; i++) {
        /* Counted before parsing so a half-built entry is freed too. */
        cfg->models_len++;
        if ((rc = parse_model(ld, &es[i], &cfg->models[i])) != 0)
            goto cleanup;
    }

cleanup:
    free(es);
    return rc;
}

static int parse_agent_tools(loader *ld, const yaml_node_t *n, const char *key,
                             loom_agent_config *a)
{
    json_t *seen = NULL;
    char sub[KEY_LEN], *s = NULL;
    size_t count, i = 0;
    int rc;

    if ((rc = visit(ld, n)) != 0)
        return rc;
    if (n->type != YAML_SEQUENCE_NODE)
        return fail_at(ld, LOOM_EINVALID, line_of(n), key,
                       "must be a list of tool names, got %s", kind_name(n));
    a->tools_all = 0;
    count = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (count == 0)
        return 0;
    if (!(a->tools = calloc(count, sizeof(*a->tools))) ||
        !(seen = json_object())) {
        rc = loom__error_oom();
        goto cleanup;
    }
    for (yaml_node_item_t *it = n->data.sequence.items.start;
         it < n->data.sequence.items.top; it++, i++) {
        yaml_node_t *item = node_at(ld, *it);

        index_key(sub, sizeof(sub), key, i);
        if ((rc = get_str(ld, item, sub, "a tool name", &s)) != 0)
            goto cleanup;
        if ((rc = check_name(ld, line_of(item), sub, s, 0, "tool")) != 0)
            goto cleanup;
        if (json_object_get(seen, s)) {
            rc = fail_at(ld, LOOM_EINVALID, line_of(item), sub,
                         "tool '%s' is listed twice", s);
            goto cleanup;
        }
        if (json_object_set_new(seen, s, json_true()) != 0) {
            rc = loom__error_oom();
            goto cleanup;
        }
        a->tools[a->tools_len++] = s;
        s = NULL;
    }

cleanup:
    free(s);
    json_decref(seen);
    return rc;
}

static int parse_tool_choice(loader *ld, const yaml_node_t *n, const char *key,
                             loom_agent_config *a)
{
    char *s = NULL, tmp[64];
    int rc;

    rc = get_str(ld, n, key, "auto, none, required or a tool name", &s);
    if (rc != 0 || !s)
        return rc;
    if (loom_tool_choice_parse(&a->tool_choice, s) != 0) {
        rc = fail_at(ld, LOOM_EINVALID, line_of(n), key,
                     "must be auto, none, required or a tool name, got '%s'",
                     loom__config_shown(tmp, sizeof(tmp), s));
        goto cleanup;
    }
    /* Tool names themselves are checked by the caller, who has the
     * registry; what can be checked here is consistency with `tools`. */
    if (a->tools_all)
        goto cleanup;
    if (a->tool_choice.kind == LOOM_TOOL_CHOICE_REQUIRED && a->tools_len == 0) {
        rc = fail_at(ld, LOOM_EINVALID, line_of(n), key,
                     "'required' needs at least one tool, but tools is "
                     "empty");
        goto cleanup;
    }
    if (a->tool_choice.kind == LOOM_TOOL_CHOICE_FUNCTION) {
        size_t i;
        for (i = 0; i < a->tools_len; i++)
            if (strcmp(a->tools[i], s) == 0)
                break;
        if (i == a->tools_len)
            rc = fail_at(ld, LOOM_EINVALID, line_of(n), key,
                         "tool '%s' is not in this agent's tools", s);
    }

cleanup:
    free(s);
    return rc;
}

static int parse_agent(loader *ld, const entry *e, loom_agent_config *a)
{
    static const char *const known[] = {"model",
                                        "system_prompt",
                                        "tools",
                                        "max_iterations",
                                        "tool_choice",
                                        "parallel_tool_calls",
                                        "tool_concurrency",
                                        "planning",
                                        "think",
                                        "tool_timeout_ms",
                                        "review",
                                        "review_model",
                                        "citations",
                                        "memory",
                                        NULL};
    enum { MODEL, PROMPT, TOOLS, ITER, CHOICE, PARALLEL, CONC, PLAN, THINK,
           TTIMEOUT, REVIEW, RMODEL, CITES, MEMORY, NFIELDS };
    yaml_node_t *v[NFIELDS];
    char key[KEY_LEN], sub[KEY_LEN], why[512];
    int rc;

    memset(a, 0, sizeof(*a));
    a->tools_all = 1;
    a->max_iterations = 10;
    a->parallel_tool_calls = 1;
    a->tool_concurrency = 8;
    a->memory = 1;
    if (!(a->name = strdup(e->name)))
        return loom__error_oom();
    join_key(key, sizeof(key), "agents", e->name);
    if ((rc = read_fields(ld, e->value, key, known, v)) != 0)
        return rc;

    join_key(sub, sizeof(sub), key, "model");
    if (v[MODEL] &&
        (rc = get_str(ld, v[MODEL], sub, "a model name", &a->model)) != 0)
        return rc;
    if (!a->model)
        return fail_at(ld, LOOM_EINVALID, line_of(e->key), key,
                       "missing required key 'model'");
    if (loom__config_model_unresolved(ld->cfg, a->model, why, sizeof(why)))
        return fail_at(ld, LOOM_EINVALID, line_of(v[MODEL]), sub, "%s", why);

    join_key(sub, sizeof(sub), key, "system_prompt");
    if (v[PROMPT] &&
        (rc = get_str(ld, v[PROMPT], sub, "a string", &a->system_prompt)) != 0)
        return rc;
    if (a->system_prompt && !*a->system_prompt) {
        free(a->system_prompt);
        a->system_prompt = NULL;
    }

    join_key(sub, sizeof(sub), key, "tools");
    if (v[TOOLS] && !is_null(v[TOOLS]) &&
        (rc = parse_agent_tools(ld, v[TOOLS], sub, a)) != 0)
        return rc;

    join_key(sub, sizeof(sub), key, "max_iterations");
    if ((rc = get_int(ld, v[ITER], sub, 1, 1000, &a->max_iterations)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "parallel_tool_calls");
    if ((rc = get_bool(ld, v[PARALLEL], sub, &a->parallel_tool_calls)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "tool_concurrency");
    if ((rc = get_int(ld, v[CONC], sub, 1, 64, &a->tool_concurrency)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "planning");
    if ((rc = get_bool(ld, v[PLAN], sub, &a->planning)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "think");
    if ((rc = get_bool(ld, v[THINK], sub, &a->think)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "tool_timeout_ms");
    if ((rc = get_long(ld, v[TTIMEOUT], sub, 1, 86400000L,
                       &a->tool_timeout_ms)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "review");
    if ((rc = get_bool(ld, v[REVIEW], sub, &a->review)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "review_model");
    if (v[RMODEL] && !is_null(v[RMODEL]) &&
        (rc = get_str(ld, v[RMODEL], sub, "a model name",
                      &a->review_model)) != 0)
        return rc;
    if (a->review_model &&
        loom__config_model_unresolved(ld->cfg, a->review_model, why,
                                      sizeof(why)))
        return fail_at(ld, LOOM_EINVALID, line_of(v[RMODEL]), sub, "%s",
                       why);
    join_key(sub, sizeof(sub), key, "citations");
    if ((rc = get_bool(ld, v[CITES], sub, &a->citations)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "memory");
    if ((rc = get_bool(ld, v[MEMORY], sub, &a->memory)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "tool_choice");
    if (v[CHOICE])
        return parse_tool_choice(ld, v[CHOICE], sub, a);
    return 0;
}

static int parse_agents(loader *ld, const yaml_node_t *n)
{
    loom_config *cfg = ld->cfg;
    entry *es = NULL;
    size_t len = 0;
    int rc;

    if ((rc = read_entries(ld, n, "agents", &es, &len)) != 0 || len == 0)
        goto cleanup;
    if (!(cfg->agents = calloc(len, sizeof(*cfg->agents)))) {
        rc = loom__error_oom();
        goto cleanup;
    }
    for (size_t i = 0; i < len; i++) {
        if ((rc = check_name(ld, line_of(es[i].key), "agents", es[i].name, 1, "agent")) != 0)
            goto cleanup;
        cfg->agents_len++;
        if ((rc = parse_agent(ld, &es[i], &cfg->agents[i])) != 0)
            goto cleanup;
    }

cleanup:
    free(es);
    return rc;
}

static int parse_default_agent(loader *ld, const yaml_node_t *n)
{
    loom_config *cfg = ld->cfg;
    char tmp[64], known[256];
    int rc;

    if ((rc = get_str(ld, n, "default_agent", "an agent name",
                      &cfg->default_agent)) != 0 ||
        !cfg->default_agent)
        return rc;
    if (!loom_config_agent(cfg, cfg->default_agent))
        return fail_at(ld, LOOM_EINVALID, line_of(n), "default_agent",
                       "agent '%s' is not defined under agents (agents: %s)",
                       loom__config_shown(tmp, sizeof(tmp), cfg->default_agent),
                       agent_names(known, sizeof(known), cfg));
    return 0;
}

static int parse_tools(loader *ld, const yaml_node_t *n)
{
    entry *es = NULL;
    size_t len = 0;
    char key[KEY_LEN];
    json_t *v = NULL;
    int rc;

    if ((rc = read_entries(ld, n, "tools", &es, &len)) != 0)
        return rc;
    for (size_t i = 0; i < len; i++) {
        join_key(key, sizeof(key), "tools", es[i].name);
        if ((rc = check_name(ld, line_of(es[i].key), "tools", es[i].name, 0, "tool")) != 0)
            goto cleanup;
        if (is_null(es[i].value)) {
            v = json_object();
        } else if (es[i].value->type != YAML_MAPPING_NODE) {
            rc = fail_at(ld, LOOM_EINVALID, line_of(es[i].value), key,
                         "must be a mapping of settings, got %s",
                         kind_name(es[i].value));
            goto cleanup;
        } else if ((rc = to_json(ld, es[i].value, key, 3, &v)) != 0) {
            goto cleanup;
        }
        if (!v || json_object_set_new(ld->cfg->tools, es[i].name, v) != 0) {
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

/* ---- http_tools -------------------------------------------------------- */

/* An allowlist entry as far as the config can tell: one word without
 * spaces, '/' or '@'. src/tools/netguard.c parses it fully when the tool
 * is registered. */
static int plausible_host(const char *s)
{
    size_t n = strlen(s);

    return n > 0 && n < 256 && !strpbrk(s, " \t\r\n/@?#");
}

static int parse_allow_hosts(loader *ld, const yaml_node_t *n, const char *key,
                             loom_http_tool_config *t)
{
    char sub[KEY_LEN], tmp[64], *s = NULL;
    size_t count, i = 0;
    int rc;

    if ((rc = visit(ld, n)) != 0 || is_null(n))
        return rc;
    if (n->type != YAML_SEQUENCE_NODE)
        return fail_at(ld, LOOM_EINVALID, line_of(n), key,
                       "must be a list of hosts, got %s", kind_name(n));
    count = (size_t)(n->data.sequence.items.top - n->data.sequence.items.start);
    if (count == 0)
        return 0;
    if (!(t->allow_hosts = calloc(count, sizeof(*t->allow_hosts))))
        return loom__error_oom();
    for (yaml_node_item_t *it = n->data.sequence.items.start;
         it < n->data.sequence.items.top; it++, i++) {
        yaml_node_t *item = node_at(ld, *it);

        index_key(sub, sizeof(sub), key, i);
        if ((rc = get_str(ld, item, sub, "a host", &s)) != 0)
            return rc;
        if (!s || !plausible_host(s)) {
            rc = fail_at(ld, LOOM_EINVALID, line_of(item), sub,
                         "'%s' is not a host, host:port, [IPv6]:port or "
                         "*.domain",
                         s ? loom__config_shown(tmp, sizeof(tmp), s) : "null");
            free(s);
            return rc;
        }
        t->allow_hosts[t->allow_hosts_len++] = s;
        s = NULL;
    }
    return 0;
}

/* The parameters schema: a mapping whose `type`, when given, is object. */
static int parse_http_params(loader *ld, const yaml_node_t *n, const char *key,
                             loom_http_tool_config *t)
{
    const json_t *type;
    int rc;

    if (!n || is_null(n)) {
        if (!(t->parameters = json_pack("{s:s}", "type", "object")))
            return loom__error_oom();
        return 0;
    }
    if (n->type != YAML_MAPPING_NODE)
        return fail_at(ld, LOOM_EINVALID, line_of(n), key,
                       "must be a JSON Schema mapping, got %s", kind_name(n));
    if ((rc = to_json(ld, n, key, 3, &t->parameters)) != 0)
        return rc;
    type = json_object_get(t->parameters, "type");
    if (type && !(json_is_string(type) &&
                  strcmp(json_string_value(type), "object") == 0))
        return fail_at(ld, LOOM_EINVALID, line_of(n), key,
                       "type must be object: the arguments are a JSON "
                       "object");
    return 0;
}

static int parse_http_tool(loader *ld, const entry *e,
                           loom_http_tool_config *t)
{
    static const char *const known[] = {
        "description", "method",     "url",       "headers",   "parameters",
        "allow_hosts", "timeout_ms", "max_bytes", "max_chars", NULL};
    enum { DESC, METHOD, URL, HEADERS, PARAMS, ALLOW, TIMEOUT, BYTES, CHARS,
           NFIELDS };
    static const char *const methods[] = {"GET", "POST", "PUT", "PATCH",
                                          "DELETE", NULL};
    yaml_node_t *v[NFIELDS];
    char key[KEY_LEN], sub[KEY_LEN], tmp[64];
    size_t i;
    int rc;

    t->timeout_ms = 30000;
    t->max_bytes = 1L << 20;
    t->max_chars = 20000;
    if (!(t->name = strdup(e->name)) || !(t->headers = json_object()))
        return loom__error_oom();
    join_key(key, sizeof(key), "http_tools", e->name);
    if ((rc = read_fields(ld, e->value, key, known, v)) != 0)
        return rc;

    join_key(sub, sizeof(sub), key, "description");
    if (v[DESC] &&
        (rc = get_str(ld, v[DESC], sub, "a string", &t->description)) != 0)
        return rc;
    if (!t->description || !*t->description)
        return fail_at(ld, LOOM_EINVALID,
                       line_of(v[DESC] ? v[DESC] : e->key), key,
                       "missing required key 'description' (the model "
                       "reads it to decide when to call the tool)");

    join_key(sub, sizeof(sub), key, "method");
    if (v[METHOD] &&
        (rc = get_str(ld, v[METHOD], sub, "an HTTP method", &t->method)) != 0)
        return rc;
    if (!t->method && !(t->method = strdup("POST")))
        return loom__error_oom();
    for (char *c = t->method; *c; c++)
        if (*c >= 'a' && *c <= 'z')
            *c = (char)(*c - 'a' + 'A');
    for (i = 0; methods[i] && strcmp(methods[i], t->method) != 0; i++)
        ;
    if (!methods[i])
        return fail_at(ld, LOOM_EINVALID, line_of(v[METHOD]), sub,
                       "must be GET, POST, PUT, PATCH or DELETE, got '%s'",
                       loom__config_shown(tmp, sizeof(tmp), t->method));

    join_key(sub, sizeof(sub), key, "url");
    if (v[URL] && (rc = get_str(ld, v[URL], sub, "a URL", &t->url)) != 0)
        return rc;
    if (!t->url)
        return fail_at(ld, LOOM_EINVALID, line_of(e->key), key,
                       "missing required key 'url'");
    if (!loom__config_valid_url(t->url))
        return fail_at(ld, LOOM_EINVALID, line_of(v[URL]), sub,
                       "must be an http:// or https:// URL, got '%s'",
                       loom__config_shown(tmp, sizeof(tmp), t->url));

    join_key(sub, sizeof(sub), key, "headers");
    if (v[HEADERS] &&
        (rc = parse_headers(ld, v[HEADERS], sub, t->headers)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "parameters");
    if ((rc = parse_http_params(ld, v[PARAMS], sub, t)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "allow_hosts");
    if (v[ALLOW] && (rc = parse_allow_hosts(ld, v[ALLOW], sub, t)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "timeout_ms");
    if ((rc = get_long(ld, v[TIMEOUT], sub, 100, 300000, &t->timeout_ms)) != 0)
        return rc;
    join_key(sub, sizeof(sub), key, "max_bytes");
    if ((rc = get_long(ld, v[BYTES], sub, 1024, 64L << 20, &t->max_bytes)) !=
        0)
        return rc;
    join_key(sub, sizeof(sub), key, "max_chars");
    return get_long(ld, v[CHARS], sub, 100, 10000000, &t->max_chars);
}

static int parse_http_tools(loader *ld, const yaml_node_t *n)
{
    loom_config *cfg = ld->cfg;
    entry *es = NULL;
    size_t len = 0;
    int rc;

    if ((rc = read_entries(ld, n, "http_tools", &es, &len)) != 0 || len == 0)
        goto cleanup;
    if (!(cfg->http_tools = calloc(len, sizeof(*cfg->http_tools)))) {
        rc = loom__error_oom();
        goto cleanup;
    }
    for (size_t i = 0; i < len; i++) {
        if ((rc = check_name(ld, line_of(es[i].key), "http_tools", es[i].name, 0, "tool")) != 0)
            goto cleanup;
        cfg->http_tools_len++;
        if ((rc = parse_http_tool(ld, &es[i], &cfg->http_tools[i])) != 0)
            goto cleanup;
    }

cleanup:
    free(es);
    return rc;
}

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
    return colon[1] >= '0' && colon[1] <= '9' && *end == '\0' &&
           errno == 0 && port >= 0 && port <= 65535;
}

/*
 * The server section (loom serve). Each limit has a floor that keeps the
 * server usable (a 1 KiB body, one run) and a ceiling against typos.
 */
static int parse_server(loader *ld, const yaml_node_t *n)
{
    static const char *const known[] = {
        "listen", "db", "max_body_bytes", "max_concurrent_runs",
        "max_connections", "keepalive_ms", "read_timeout_ms",
        "shutdown_grace_ms", "keep_finished_runs", "max_run_events_bytes",
        NULL};
    enum { LISTEN, DB, BODY, RUNS, CONNS, KEEPALIVE, READ, GRACE, KEEP,
           EVENTS, NFIELDS };
    loom_server_config *sc = &ld->cfg->server;
    yaml_node_t *v[NFIELDS];
    char tmp[64], *s = NULL;
    int rc;

    if ((rc = read_fields(ld, n, "server", known, v)) != 0)
        return rc;
    if (v[LISTEN]) {
        if ((rc = get_str(ld, v[LISTEN], "server.listen", "HOST:PORT",
                          &s)) != 0)
            return rc;
        if (s && !valid_listen(s)) {
            rc = fail_at(ld, LOOM_EINVALID, line_of(v[LISTEN]),
                         "server.listen",
                         "must be HOST:PORT (port 0..65535), got '%s'",
                         loom__config_shown(tmp, sizeof(tmp), s));
            free(s);
            return rc;
        }
        if (s) {
            free(sc->listen);
            sc->listen = s;
        }
    }
    if (v[DB]) {
        if ((rc = get_str(ld, v[DB], "server.db", "a path", &s)) != 0)
            return rc;
        if (s && !*s) {
            free(s);
            return fail_at(ld, LOOM_EINVALID, line_of(v[DB]), "server.db",
                           "must not be empty");
        }
        if (s) {
            free(sc->db);
            sc->db = s;
        }
    }
    if ((rc = get_long(ld, v[BODY], "server.max_body_bytes", 1024,
                       1L << 30, &sc->max_body_bytes)) != 0 ||
        (rc = get_int(ld, v[RUNS], "server.max_concurrent_runs", 1, 100000,
                      &sc->max_concurrent_runs)) != 0 ||
        (rc = get_int(ld, v[CONNS], "server.max_connections", 1, 1000000,
                      &sc->max_connections)) != 0 ||
        (rc = get_long(ld, v[KEEPALIVE], "server.keepalive_ms", 10,
                       TIMEOUT_MAX, &sc->keepalive_ms)) != 0 ||
        (rc = get_long(ld, v[READ], "server.read_timeout_ms", 1000,
                       TIMEOUT_MAX, &sc->read_timeout_ms)) != 0 ||
        (rc = get_long(ld, v[GRACE], "server.shutdown_grace_ms", 0,
                       TIMEOUT_MAX, &sc->shutdown_grace_ms)) != 0 ||
        (rc = get_int(ld, v[KEEP], "server.keep_finished_runs", 0, 1000000,
                      &sc->keep_finished_runs)) != 0 ||
        (rc = get_long(ld, v[EVENTS], "server.max_run_events_bytes", 4096,
                       1L << 32, &sc->max_run_events_bytes)) != 0)
        return rc;
    return 0;
}

static int parse_document(loader *ld)
{
    /* The top-level keys. */
    static const char *const known[] = {
        "log",   "providers", "models", "agents", "default_agent",
        "tools", "server",    "routing", "http_tools", NULL};
    enum { LOG, PROVIDERS, MODELS, AGENTS, DEFAULT, TOOLS, SERVER, ROUTING,
           HTTP_TOOLS, NFIELDS };
    yaml_node_t *root = yaml_document_get_root_node(ld->doc), *v[NFIELDS];
    int rc;

    if (!root || is_null(root))
        return 0;
    if (root->type != YAML_MAPPING_NODE)
        return fail_at(ld, LOOM_EINVALID, line_of(root), NULL,
                       "the top level must be a mapping, got %s",
                       kind_name(root));
    if ((rc = read_fields(ld, root, NULL, known, v)) != 0)
        return rc;
    /* Order matters: each section may refer to the ones before it. */
    if ((v[LOG] && (rc = parse_log(ld, v[LOG])) != 0) ||
        (v[PROVIDERS] && (rc = parse_providers(ld, v[PROVIDERS])) != 0) ||
        (v[ROUTING] && (rc = parse_routing(ld, v[ROUTING], "routing",
                                           &ld->cfg->routing)) != 0) ||
        (v[MODELS] && (rc = parse_models(ld, v[MODELS])) != 0) ||
        (v[AGENTS] && (rc = parse_agents(ld, v[AGENTS])) != 0) ||
        (v[DEFAULT] && (rc = parse_default_agent(ld, v[DEFAULT])) != 0) ||
        (v[TOOLS] && (rc = parse_tools(ld, v[TOOLS])) != 0) ||
        (v[HTTP_TOOLS] && (rc = parse_http_tools(ld, v[HTTP_TOOLS])) != 0) ||
        (v[SERVER] && (rc = parse_server(ld, v[SERVER])) != 0))
        return rc;
    return 0;
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
 * Reads the YAML text into cfg, over what cfg already holds. On error cfg
 * may be half filled: the caller frees it.
 */
int loom__config_parse_yaml(loom_config *cfg, const char *data, size_t len,
                            const char *name)
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
    rc = parse_document(&ld);

cleanup:
    if (doc_ok)
        yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return rc;
}
