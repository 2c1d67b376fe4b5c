/*
 * The Google Gemini adapter (provider kind "gemini"): the Gemini API's
 * POST {base}/v1beta/models/{model}:streamGenerateContent?alt=sse (or
 * :generateContent when not streaming), with the key in x-goog-api-key.
 *
 * This file builds what goes out: the URL, the body (loom's messages as
 * `contents` with roles user/model, system messages as
 * `systemInstruction`, tool results as functionResponse parts, tools as
 * functionDeclarations whose JSON Schema is cut down to the subset Gemini
 * accepts, tool choice as toolConfig, limits and thinking as
 * generationConfig); the provider object, its headers and the call through
 * the attempt loop are what every adapter shares (llm/adapter.c,
 * llm/attempt.c: retries, backoff, classification). Decoding the answer is
 * llm/gemini_stream.c's job.
 *
 * Gemini wants back, on the next request, each thoughtSignature on the
 * part it came on and the ids it gave its calls: the decoder records them
 * in provider_state (format in llm/gemini.h) and the body builder here
 * rebuilds the model's turn from it. A message without that state (from
 * another provider, or an answer that had none) is sent as plain text and
 * calls.
 */
#include "llm/gemini.h"
#include "core/error.h"
#include "llm/adapter.h"
#include "llm/params.h"
#include "llm/parts.h"
#include "loom/buf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    loom__llm_adapter a; /* first; its url is the configured base URL */
    loom__gemini_limits limits;
} gemini_provider;

/* ---- URL ------------------------------------------------------------- */

/* Whether the n bytes at s are an API version: "v" digits, then letters
 * and digits ("v1", "v1beta", "v1alpha", "v1beta1"). */
static int is_version(const char *s, size_t n)
{
    size_t i = 1;

    if (n < 2 || s[0] != 'v' || s[1] < '0' || s[1] > '9')
        return 0;
    while (i < n &&
           ((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'z')))
        i++;
    return i == n;
}

int loom__gemini_url(char **out, const char *base_url, const char *model,
                     int stream)
{
    static const char hex[] = "0123456789ABCDEF";
    const char *base =
        base_url && *base_url ? base_url : LOOM_GEMINI_DEFAULT_BASE_URL;
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    size_t n = strlen(base), seg;
    int rc;

    *out = NULL;
    if (!model || !*model)
        return loom__error_set(LOOM_EINVALID, "request has no model");
    while (n > 0 && base[n - 1] == '/')
        n--;
    seg = n;
    while (seg > 0 && base[seg - 1] != '/')
        seg--;
    rc = loom_buf_put(&b, base, n);
    if (!rc && !is_version(base + seg, n - seg))
        rc = loom_buf_puts(&b, "/v1beta");
    if (!rc)
        rc = loom_buf_puts(&b, strchr(model, '/') ? "/" : "/models/");
    for (const unsigned char *m = (const unsigned char *)model; !rc && *m;
         m++) {
        if ((*m >= 'A' && *m <= 'Z') || (*m >= 'a' && *m <= 'z') ||
            (*m >= '0' && *m <= '9') || strchr("-._~@/", *m))
            rc = loom_buf_putc(&b, (char)*m);
        else
            rc = loom_buf_printf(&b, "%%%c%c", hex[*m >> 4], hex[*m & 15]);
    }
    if (!rc)
        rc = loom_buf_puts(&b, stream ? ":streamGenerateContent?alt=sse"
                                      : ":generateContent");
    if (rc || !(*out = loom_buf_detach(&b))) {
        loom_buf_free(&b);
        return loom__error_oom();
    }
    loom_buf_free(&b);
    return 0;
}

/* ---- schema ---------------------------------------------------------- */

/* Gemini's name for a JSON Schema type, NULL for none it has. */
static const char *gemini_type(const char *t)
{
    static const char *const map[][2] = {
        {"string", "STRING"},   {"number", "NUMBER"}, {"integer", "INTEGER"},
        {"boolean", "BOOLEAN"}, {"array", "ARRAY"},   {"object", "OBJECT"}};

    for (size_t i = 0; t && i < sizeof(map) / sizeof(map[0]); i++)
        if (strcmp(t, map[i][0]) == 0)
            return map[i][1];
    return NULL;
}

static int is_null_schema(const json_t *s)
{
    const char *t = loom__llm_jstr(s, "type");

    return t && strcmp(t, "null") == 0;
}

/* description, title and nullable, which every schema may have. */
static int put_common(json_t *o, const json_t *s, int nullable)
{
    const char *keys[] = {"description", "title"};
    int bad = 0;

    for (size_t i = 0; i < 2; i++) {
        const json_t *v = json_object_get(s, keys[i]);
        if (json_is_string(v) && !json_object_get(o, keys[i]))
            bad |= loom__llm_put(o, keys[i], json_copy((json_t *)v));
    }
    if (nullable)
        bad |= loom__llm_put(o, "nullable", json_true());
    return bad ? loom__error_oom() : 0;
}

/* Copies the non-negative integers s[keys] (counts and lengths). */
static int put_counts(json_t *o, const json_t *s, const char *const *keys,
                      size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_object_get(s, keys[i]);
        if (json_is_integer(v) && json_integer_value(v) >= 0 &&
            loom__llm_put(o, keys[i], json_copy((json_t *)v)))
            return loom__error_oom();
    }
    return 0;
}

static int convert(json_t **out, const json_t *s, int depth,
                   const char *force_type);

/*
 * Converts each member (members an array of schemas, or, with types set,
 * s once per type in that array) into out's anyOf, "null" left out.
 */
static int put_any_of(json_t *o, const json_t *s, const json_t *members,
                      const json_t *types, int depth)
{
    json_t *arr = json_array(), *c = NULL;
    const json_t *list = types ? types : members;
    size_t i;
    json_t *x;
    int rc = 0;

    if (!arr || json_object_set_new(o, "anyOf", arr))
        return loom__error_oom();
    json_array_foreach(list, i, x)
    {
        if (types) {
            if (!gemini_type(json_string_value(x)))
                continue;
            rc = convert(&c, s, depth + 1, json_string_value(x));
            /* The outer schema carries these once. */
            json_object_del(c, "description");
            json_object_del(c, "title");
        } else {
            if (is_null_schema(x))
                continue;
            rc = convert(&c, x, depth + 1, NULL);
        }
        if (rc || json_array_append_new(arr, c))
            return rc ? rc : loom__error_oom();
    }
    return 0;
}

static int put_enum(json_t *o, const json_t *s, int *nullable)
{
    const json_t *e = json_object_get(s, "enum");
    const json_t *k = json_object_get(s, "const");
    json_t *arr, *x;
    size_t i;

    if (!json_is_array(e)) {
        if (!json_is_string(k))
            return 0;
        return loom__llm_put(o, "enum",
                             json_pack("[o]", json_copy((json_t *)k)))
                   ? loom__error_oom()
                   : 0;
    }
    /* Gemini's enum lists strings; any other value drops it. */
    json_array_foreach(e, i, x)
    {
        if (!json_is_string(x) && !json_is_null(x))
            return 0;
    }
    if (!(arr = json_array()) || json_object_set_new(o, "enum", arr))
        return loom__error_oom();
    json_array_foreach(e, i, x)
    {
        if (json_is_null(x))
            *nullable = 1;
        else if (json_array_append_new(arr, json_copy(x)))
            return loom__error_oom();
    }
    if (!json_array_size(arr))
        json_object_del(o, "enum");
    return 0;
}

static int put_format(json_t *o, const json_t *s, const char *type)
{
    static const char *const ok[][2] = {
        {"STRING", "date-time"}, {"STRING", "enum"},   {"NUMBER", "float"},
        {"NUMBER", "double"},    {"INTEGER", "int32"}, {"INTEGER", "int64"}};
    const char *f = loom__llm_jstr(s, "format");

    for (size_t i = 0; f && i < sizeof(ok) / sizeof(ok[0]); i++)
        if (strcmp(type, ok[i][0]) == 0 && strcmp(f, ok[i][1]) == 0)
            return loom__llm_put(o, "format", json_string(f))
                       ? loom__error_oom()
                       : 0;
    return 0;
}

static int put_object(json_t *o, const json_t *s, int depth)
{
    static const char *const counts[] = {"minProperties", "maxProperties"};
    const json_t *props = json_object_get(s, "properties");
    const json_t *req = json_object_get(s, "required");
    json_t *p, *r, *c, *x;
    const char *k;
    size_t i;
    int rc;

    if (json_is_object(props) && json_object_size(props)) {
        if (!(p = json_object()) || json_object_set_new(o, "properties", p))
            return loom__error_oom();
        json_object_foreach((json_t *)props, k, x)
        {
            if ((rc = convert(&c, x, depth + 1, NULL)) != 0)
                return rc;
            if (json_object_set_new(p, k, c))
                return loom__error_oom();
        }
        /* Gemini refuses a required name that is no property. */
        if (!(r = json_array()))
            return loom__error_oom();
        json_array_foreach(req, i, x)
        {
            if (json_is_string(x) && json_object_get(p, json_string_value(x)) &&
                json_array_append_new(r, json_copy(x))) {
                json_decref(r);
                return loom__error_oom();
            }
        }
        if (!json_array_size(r))
            json_decref(r);
        else if (json_object_set_new(o, "required", r))
            return loom__error_oom();
    }
    return put_counts(o, s, counts, 2);
}

static int put_array(json_t *o, const json_t *s, int depth)
{
    static const char *const counts[] = {"minItems", "maxItems"};
    const json_t *items = json_object_get(s, "items");
    json_t *c;
    int rc;

    /* A tuple (items as a list) is described by its first schema. */
    if (json_is_array(items))
        items = json_array_get(items, 0);
    if (items) {
        if ((rc = convert(&c, items, depth + 1, NULL)) != 0)
            return rc;
    } else {
        /* Gemini refuses an array without items. */
        c = json_pack("{s:s}", "type", "STRING");
    }
    if (loom__llm_put(o, "items", c))
        return loom__error_oom();
    return put_counts(o, s, counts, 2);
}

static int convert(json_t **out, const json_t *s, int depth,
                   const char *force_type)
{
    static const char *const lengths[] = {"minLength", "maxLength"};
    const json_t *type, *un;
    const char *t = NULL, *gt;
    json_t *o = NULL;
    int nullable, rc = 0;

    *out = NULL;
    if (depth > LOOM_GEMINI_MAX_SCHEMA_DEPTH)
        return loom__error_set(LOOM_EINVALID,
                               "tool schema is nested deeper than %d levels",
                               LOOM_GEMINI_MAX_SCHEMA_DEPTH);
    if (!json_is_object(s))
        s = NULL; /* true, false, junk: no constraint known */
    nullable = json_is_true(json_object_get(s, "nullable"));
    type = json_object_get(s, "type");
    if (force_type) {
        t = force_type;
    } else if (json_is_string(type)) {
        t = json_string_value(type);
    } else if (json_is_array(type)) {
        size_t i, n = 0;
        json_t *x;
        json_array_foreach(type, i, x)
        {
            const char *xs = json_string_value(x);
            if (xs && strcmp(xs, "null") == 0)
                nullable = 1;
            else if (gemini_type(xs) && !n++)
                t = xs;
        }
        if (n > 1) {
            if (!(o = json_object()) ||
                (rc = put_any_of(o, s, NULL, type, depth)) != 0 ||
                (rc = put_common(o, s, nullable)) != 0)
                goto fail;
            *out = o;
            return 0;
        }
    }
    if (t && strcmp(t, "null") == 0) {
        nullable = 1;
        t = NULL;
    }
    un = json_object_get(s, "anyOf");
    if (!json_is_array(un))
        un = json_object_get(s, "oneOf");
    /* allOf of one schema (how generators attach a description to a
     * reference) is that schema; of more, it cannot be said. */
    if (!json_is_array(un) && json_array_size(json_object_get(s, "allOf")) == 1)
        un = json_object_get(s, "allOf");
    if (!t && json_is_array(un)) {
        size_t i, n = 0, one = 0;
        json_t *x;
        json_array_foreach(un, i, x)
        {
            if (is_null_schema(x))
                nullable = 1;
            else if (!n++)
                one = i;
        }
        if (n == 1) {
            /* Optional[X] and the like: X, nullable. */
            if ((rc = convert(&o, json_array_get(un, one), depth + 1, NULL)) ||
                (rc = put_common(o, s, nullable)))
                goto fail;
            *out = o;
            return 0;
        }
        if (n > 1) {
            if (!(o = json_object()) ||
                (rc = put_any_of(o, s, un, NULL, depth)) != 0 ||
                (rc = put_common(o, s, nullable)) != 0)
                goto fail;
            *out = o;
            return 0;
        }
    }
    if (!t || !gemini_type(t)) {
        if (json_object_get(s, "properties"))
            t = "object";
        else if (json_object_get(s, "items"))
            t = "array";
        else
            t = "string";
    }
    gt = gemini_type(t);
    if (!(o = json_pack("{s:s}", "type", gt))) {
        rc = loom__error_oom();
        goto fail;
    }
    if (strcmp(gt, "STRING") == 0) {
        if ((rc = put_enum(o, s, &nullable)) ||
            (rc = put_counts(o, s, lengths, 2)))
            goto fail;
    } else if (strcmp(gt, "NUMBER") == 0 || strcmp(gt, "INTEGER") == 0) {
        const char *keys[] = {"minimum", "maximum"};
        for (size_t i = 0; i < 2; i++) {
            const json_t *v = json_object_get(s, keys[i]);
            if (json_is_number(v) &&
                loom__llm_put(o, keys[i], json_copy((json_t *)v))) {
                rc = loom__error_oom();
                goto fail;
            }
        }
    } else if (strcmp(gt, "ARRAY") == 0) {
        if ((rc = put_array(o, s, depth)) != 0)
            goto fail;
    } else if (strcmp(gt, "OBJECT") == 0) {
        if ((rc = put_object(o, s, depth)) != 0)
            goto fail;
    }
    if ((rc = put_format(o, s, gt)) || (rc = put_common(o, s, nullable)))
        goto fail;
    *out = o;
    return 0;

fail:
    json_decref(o);
    return rc ? rc : loom__error_oom();
}

int loom__gemini_schema(json_t **out, const json_t *schema)
{
    return convert(out, schema, 0, NULL);
}

/* ---- request body ---------------------------------------------------- */

/* A message's Gemini state: the parsed provider_state and, when it fits
 * the message, its parts list. */
typedef struct {
    json_t *root;
    const json_t *parts; /* NULL: send the message plainly */
} msg_state;

/* Reads a [offset, length] range that lies within [0, limit]. */
static int read_range(const json_t *r, size_t limit, size_t *off, size_t *len)
{
    json_t *a = json_array_get(r, 0), *b = json_array_get(r, 1);
    json_int_t o, l;

    if (json_array_size(r) != 2 || !json_is_integer(a) || !json_is_integer(b))
        return 0;
    o = json_integer_value(a);
    l = json_integer_value(b);
    if (o < 0 || l < 0 || (uint64_t)o > limit || (uint64_t)l > limit - o)
        return 0;
    *off = (size_t)o;
    *len = (size_t)l;
    return 1;
}

/*
 * Whether parts (a provider_state "parts" list) still describes m: text
 * ranges tile the content in order, thought ranges lie in the reasoning,
 * every call is there once with its id unchanged. Anything else (the
 * message was edited, the state is not ours) sends m plainly.
 */
static int state_fits(const loom_message *m, const json_t *parts)
{
    size_t clen = m->content ? strlen(m->content) : 0;
    size_t rlen = m->reasoning ? strlen(m->reasoning) : 0;
    size_t next = 0, ncalls = 0, i, off, len;
    unsigned char *seen = NULL;
    json_t *e;
    int ok = json_is_array(parts);

    if (ok && m->tool_calls_len && !(seen = calloc(m->tool_calls_len, 1)))
        return 0;
    json_array_foreach(parts, i, e)
    {
        const json_t *text = json_object_get(e, "text");
        const json_t *th = json_object_get(e, "thought");
        const json_t *call = json_object_get(e, "call");
        const json_t *sig = json_object_get(e, "thoughtSignature");
        const json_t *id = json_object_get(e, "id");

        if (!ok)
            break;
        ok = json_is_object(e) && (!sig || json_is_string(sig)) &&
             (text != NULL) + (th != NULL) + (call != NULL) == 1;
        if (ok && text) {
            ok = read_range(text, clen, &off, &len) && off == next;
            next = off + len;
        } else if (ok && th) {
            ok = read_range(th, rlen, &off, &len);
        } else if (ok) {
            json_int_t c = json_integer_value(call);
            ok = json_is_integer(call) && c >= 0 &&
                 (size_t)c < m->tool_calls_len && !seen[c] &&
                 (!id ||
                  (json_is_string(id) && m->tool_calls[c].id &&
                   strcmp(json_string_value(id), m->tool_calls[c].id) == 0));
            if (ok) {
                seen[c] = 1;
                ncalls++;
            }
        }
    }
    free(seen);
    return ok && next == clen && ncalls == m->tool_calls_len;
}

static void read_state(msg_state *st, const loom_message *m)
{
    const json_t *parts;

    memset(st, 0, sizeof(*st));
    if (m->role != LOOM_ROLE_ASSISTANT || !m->provider_state)
        return;
    st->root = json_loads(m->provider_state, 0, NULL);
    parts = json_object_get(json_object_get(st->root, "gemini"), "parts");
    if (state_fits(m, parts))
        st->parts = parts;
}

/* A call's arguments as the object Gemini wants ({} when they are not
 * one: the model's own mistake, nothing to send back). */
static json_t *args_object(const char *args)
{
    json_t *o = args ? json_loads(args, 0, NULL) : NULL;

    if (json_is_object(o))
        return o;
    json_decref(o);
    return json_object();
}

static json_t *function_call_part(const loom_tool_call *c, const char *id)
{
    json_t *fc = json_object(), *part;

    if (!fc || loom__llm_put(fc, "name", loom__llm_json_string(c->name)) ||
        loom__llm_put(fc, "args", args_object(c->arguments)) ||
        (id && loom__llm_put(fc, "id", json_string(id)))) {
        json_decref(fc);
        return NULL;
    }
    part = json_object();
    if (!part || json_object_set_new(part, "functionCall", fc)) {
        json_decref(part);
        return NULL;
    }
    return part;
}

/* {"text": s[off, off + len)}, lossy. */
static json_t *text_part(const char *s, size_t off, size_t len)
{
    char *sub = strndup(s ? s + off : "", s ? len : 0);
    json_t *part =
        sub ? json_pack("{s:o}", "text", loom__llm_json_string(sub)) : NULL;

    free(sub);
    return part;
}

/* The model's turn from its state (st->parts fits m). */
static int model_parts_from_state(json_t *arr, const loom_message *m,
                                  const json_t *parts)
{
    size_t i, off, len;
    json_t *e;

    json_array_foreach(parts, i, e)
    {
        const json_t *sig = json_object_get(e, "thoughtSignature");
        const json_t *text = json_object_get(e, "text");
        const json_t *th = json_object_get(e, "thought");
        json_t *part;

        if (text) {
            read_range(text, m->content ? strlen(m->content) : 0, &off, &len);
            if (!len && !sig)
                continue;
            part = text_part(m->content, off, len);
        } else if (th) {
            read_range(th, m->reasoning ? strlen(m->reasoning) : 0, &off, &len);
            part = text_part(m->reasoning, off, len);
            if (part && loom__llm_put(part, "thought", json_true())) {
                json_decref(part);
                part = NULL;
            }
        } else {
            size_t c = (size_t)json_integer_value(json_object_get(e, "call"));
            part =
                function_call_part(&m->tool_calls[c], loom__llm_jstr(e, "id"));
        }
        if (part && sig &&
            loom__llm_put(part, "thoughtSignature", json_copy((json_t *)sig))) {
            json_decref(part);
            part = NULL;
        }
        if (!part || json_array_append_new(arr, part))
            return loom__error_oom();
    }
    return 0;
}

static int model_parts(json_t *arr, const loom_message *m, const msg_state *st)
{
    if (st->parts)
        return model_parts_from_state(arr, m, st->parts);
    if (m->content && *m->content &&
        json_array_append_new(arr,
                              text_part(m->content, 0, strlen(m->content))))
        return loom__error_oom();
    for (size_t i = 0; i < m->tool_calls_len; i++)
        if (json_array_append_new(arr,
                                  function_call_part(&m->tool_calls[i], NULL)))
            return loom__error_oom();
    return 0;
}

/*
 * The call a tool result answers: the nearest earlier assistant message
 * with a call of that id. Gives its name and, when Gemini gave the call an
 * id (the state says so), that id.
 */
static void find_call(const loom_llm_request *req, const msg_state *states,
                      size_t i, const char **name, const char **id)
{
    const char *want = req->messages[i].tool_call_id;

    *name = *id = NULL;
    while (want && i-- > 0) {
        const loom_message *m = &req->messages[i];
        size_t k, c;
        json_t *e;

        if (m->role != LOOM_ROLE_ASSISTANT)
            continue;
        for (c = 0; c < m->tool_calls_len; c++)
            if (m->tool_calls[c].id && strcmp(m->tool_calls[c].id, want) == 0)
                break;
        if (c == m->tool_calls_len)
            continue;
        *name = m->tool_calls[c].name;
        json_array_foreach(states[i].parts, k, e)
        {
            const json_t *call = json_object_get(e, "call");
            if (json_is_integer(call) && (size_t)json_integer_value(call) == c)
                *id = loom__llm_jstr(e, "id");
        }
        return;
    }
}

/*
 * The functionResponse part of a tool result. loom's result is text: a
 * JSON object is sent as the response itself, anything else as
 * {"result": text} (what Google's SDKs do with a plain value).
 */
static json_t *function_response_part(const loom_llm_request *req,
                                      const msg_state *states, size_t i)
{
    const loom_message *m = &req->messages[i];
    const char *name, *id;
    json_t *resp = m->content ? json_loads(m->content, 0, NULL) : NULL;
    json_t *fr;

    if (!json_is_object(resp)) {
        json_decref(resp);
        resp = json_pack("{s:o}", "result", loom__llm_json_string(m->content));
    }
    find_call(req, states, i, &name, &id);
    if (!name)
        name = m->name && *m->name ? m->name : "unknown_tool";
    fr = json_object();
    if (!fr || loom__llm_put(fr, "name", loom__llm_json_string(name))) {
        json_decref(resp);
        json_decref(fr);
        return NULL;
    }
    if (loom__llm_put(fr, "response", resp) ||
        (id && loom__llm_put(fr, "id", json_string(id)))) {
        json_decref(fr);
        return NULL;
    }
    return json_pack("{s:o}", "functionResponse", fr);
}

static json_t *content_json(const char *role, json_t *parts)
{
    json_t *c = parts ? json_object() : NULL;

    if (!c || loom__llm_put(c, "role", json_string(role)) ||
        loom__llm_put(c, "parts", parts)) {
        json_decref(parts);
        json_decref(c);
        return NULL;
    }
    return c;
}

/* m's text, images and files onto arr; images by URL fetched when req
 * says so (loom_llm_request.media_fetch). */
static int media_parts(json_t *arr, const loom_message *m,
                       const loom_llm_request *req)
{
    json_t *parts = NULL;
    int rc = loom__parts_gemini_fetched(&parts, m, req);

    if (!rc && json_array_extend(arr, parts))
        rc = loom__error_oom();
    json_decref(parts);
    return rc;
}

static int add_contents(json_t *body, const loom_llm_request *req,
                        const msg_state *states)
{
    json_t *contents = json_array(), *sys = json_array(), *parts;
    json_t *results = NULL; /* the open user turn of tool results */
    int rc = 0;

    if (!contents || !sys || json_object_set_new(body, "contents", contents)) {
        json_decref(sys);
        return loom__error_oom();
    }
    for (size_t i = 0; !rc && i < req->messages_len; i++) {
        const loom_message *m = &req->messages[i];
        if (m->role == LOOM_ROLE_TOOL) {
            json_t *part = function_response_part(req, states, i), *arr, *c;
            if (!part) {
                rc = loom__error_oom();
                break;
            }
            /* The results of one turn go back together in one content. */
            if (!results) {
                arr = json_array();
                c = arr ? content_json("user", arr) : NULL;
                if (!c || json_array_append_new(contents, c)) {
                    json_decref(part);
                    rc = loom__error_oom();
                    break;
                }
                results = arr; /* borrowed from its content */
            }
            if (json_array_append_new(results, part))
                rc = loom__error_oom();
            /* A result's images go beside its functionResponse. */
            else if (loom_message_has_media(m))
                rc = media_parts(results, m, req);
            continue;
        }
        results = NULL;
        /* Gemini refuses empty text parts: empty messages are left out. */
        if (m->role == LOOM_ROLE_SYSTEM) {
            if (m->content && *m->content &&
                json_array_append_new(
                    sys, text_part(m->content, 0, strlen(m->content))))
                rc = loom__error_oom();
            continue;
        }
        if (!(parts = json_array())) {
            rc = loom__error_oom();
            break;
        }
        if (m->role == LOOM_ROLE_ASSISTANT)
            rc = model_parts(parts, m, &states[i]);
        else if (loom_message_has_media(m))
            rc = media_parts(parts, m, req);
        else if (m->content && *m->content &&
                 json_array_append_new(
                     parts, text_part(m->content, 0, strlen(m->content))))
            rc = loom__error_oom();
        if (rc || !json_array_size(parts)) {
            json_decref(parts);
            continue;
        }
        if (json_array_append_new(
                contents,
                content_json(m->role == LOOM_ROLE_ASSISTANT ? "model" : "user",
                             parts)))
            rc = loom__error_oom();
    }
    if (!rc && json_array_size(sys) &&
        loom__llm_put(body, "systemInstruction",
                      json_pack("{s:O}", "parts", sys)))
        rc = loom__error_oom();
    json_decref(sys);
    return rc;
}

static int add_tools(json_t *body, const loom_llm_request *req)
{
    json_t *decls = json_array(), *params, *props, *d;
    const char *mode;
    int rc;

    if (!decls ||
        loom__llm_put(body, "tools",
                      json_pack("[{s:o}]", "functionDeclarations", decls)))
        return loom__error_oom();
    for (size_t i = 0; i < req->tools_len; i++) {
        const loom_tool_def *t = &req->tools[i];
        if (!(d = json_object()) || json_array_append_new(decls, d) ||
            loom__llm_put(d, "name", loom__llm_json_string(t->name)) ||
            (t->description &&
             loom__llm_put(d, "description",
                           loom__llm_json_string(t->description))))
            return loom__error_oom();
        if (!t->parameters)
            continue;
        if ((rc = loom__gemini_schema(&params, t->parameters)) != 0)
            return loom__error_set(rc, "tool '%s': %s", t->name,
                                   loom_error_last());
        /* Gemini refuses an OBJECT without properties: a tool that takes
         * nothing declares no parameters. */
        props = json_object_get(params, "properties");
        if (loom__llm_jstr(params, "type") &&
            strcmp(loom__llm_jstr(params, "type"), "OBJECT") == 0 && !props) {
            json_decref(params);
            continue;
        }
        if (loom__llm_put(d, "parameters", params))
            return loom__error_oom();
    }
    switch (req->tool_choice.kind) {
    case LOOM_TOOL_CHOICE_NONE:
        mode = "NONE";
        break;
    case LOOM_TOOL_CHOICE_REQUIRED:
    case LOOM_TOOL_CHOICE_FUNCTION:
        mode = "ANY";
        break;
    default:
        return 0; /* AUTO is Gemini's default: nothing to send */
    }
    d = json_pack("{s:s}", "mode", mode);
    if (d && req->tool_choice.kind == LOOM_TOOL_CHOICE_FUNCTION &&
        loom__llm_put(d, "allowedFunctionNames",
                      json_pack("[o]", loom__llm_json_string(
                                           req->tool_choice.function)))) {
        json_decref(d);
        d = NULL;
    }
    if (!d || loom__llm_put(body, "toolConfig",
                            json_pack("{s:o}", "functionCallingConfig", d)))
        return loom__error_oom();
    return 0;
}

static int add_generation_config(json_t *body, const loom_llm_request *req)
{
    json_t *g = json_object();
    int bad = !g || json_object_set_new(body, "generationConfig", g);
    long budget =
        req->params && req->params->reasoning_effort
            ? loom__params_effort_budget(req->params->reasoning_effort)
            : req->thinking_budget;

    if (!bad && req->max_tokens > 0)
        bad |=
            loom__llm_put(g, "maxOutputTokens", json_integer(req->max_tokens));
    if (!bad && req->temperature >= 0)
        bad |= loom__llm_put(g, "temperature", json_real(req->temperature));
    if (!bad && budget > 0)
        bad |=
            loom__llm_put(g, "thinkingConfig",
                          json_pack("{s:I,s:b}", "thinkingBudget",
                                    (json_int_t)budget, "includeThoughts", 1));
    if (!bad)
        bad |= loom__params_put_gemini(g, req->params);
    return bad ? loom__error_oom() : 0;
}

long loom__gemini_turn(const loom_llm_request *req)
{
    long n = 0;

    for (size_t i = 0; i < req->messages_len; i++)
        n += req->messages[i].role == LOOM_ROLE_ASSISTANT;
    return n;
}

int loom__gemini_build_body(json_t **out, const loom_llm_request *req)
{
    msg_state *states = NULL;
    json_t *body = NULL;
    int rc;

    *out = NULL;
    if ((rc = loom__llm_request_check(req)) != 0)
        return rc;
    if (req->messages_len &&
        !(states = calloc(req->messages_len, sizeof(*states))))
        return loom__error_oom();
    for (size_t i = 0; i < req->messages_len; i++)
        read_state(&states[i], &req->messages[i]);
    if (!(body = json_object())) {
        rc = loom__error_oom();
        goto cleanup;
    }
    if ((rc = add_contents(body, req, states)) != 0 ||
        (req->tools_len && (rc = add_tools(body, req)) != 0) ||
        (rc = add_generation_config(body, req)) != 0)
        goto cleanup;
    *out = body;
    body = NULL;

cleanup:
    for (size_t i = 0; i < req->messages_len; i++)
        json_decref(states[i].root);
    free(states);
    json_decref(body);
    return rc;
}

/* ---- the adapter ----------------------------------------------------- */

void loom__gemini_provider_set_limits(loom_provider *base,
                                      const loom__gemini_limits *limits)
{
    gemini_provider *p = (gemini_provider *)base;

    p->limits = *limits;
}

static size_t max_body(const loom__llm_adapter *a)
{
    const gemini_provider *p = (const gemini_provider *)a;
    size_t text =
        p->limits.max_text ? p->limits.max_text : LOOM_GEMINI_MAX_TEXT;

    return p->limits.max_body ? p->limits.max_body
                              : 2 * text + ((size_t)1 << 20);
}

/* The URL names the model, and whether the answer streams. */
static int request_url(const loom__llm_adapter *a, const loom_llm_request *req,
                       char **out)
{
    return loom__gemini_url(out, a->url, req->model, req->stream);
}

/* The decoder of each attempt; arg is the turn (loom__gemini_turn). */
static int op_new(void **out, void *payload)
{
    const loom__llm_decoder_args *x = payload;
    const gemini_provider *p = (const gemini_provider *)x->adapter;
    loom__gemini_decoder *d = NULL;
    int rc =
        loom__gemini_decoder_new(&d, &p->limits, x->arg, x->cb, x->payload);

    *out = d;
    return rc;
}

static const loom__llm_adapter_spec gemini_spec = {
    .kind = "gemini",
    .key_header = "x-goog-api-key",
    .key_prefix = "",
    .build_json = loom__gemini_build_body,
    .request_url = request_url,
    .decoder_arg = loom__gemini_turn,
    .max_body = max_body,
    .decoder_new = op_new,
    .error_from_http = loom__gemini_error_from_http,
    .stream_error_retryable = loom__gemini_stream_error_retryable,
    .body_retry_after = loom__gemini_retry_delay,
};

int loom_provider_gemini_new(loom_provider **out,
                             const loom_provider_config *config)
{
    return loom__llm_adapter_new(out, sizeof(gemini_provider), &gemini_spec,
                                 config);
}
