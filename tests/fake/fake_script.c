/*
 * loom-fake-upstream's script side: reading and checking a script file
 * once at start (so a typo fails loudly with exit status 2 instead of
 * serving something odd), the helpers every wire format shares (chunk
 * lists, SSE events, joined strings, tool-call arguments, usage fields,
 * choosing the format), and rendering a script entry into the bytes of
 * an OpenAI Chat Completions answer, streamed or not. The other formats
 * live in fake_anthropic.c, fake_gemini.c and fake_responses.c; the
 * dispatchers at the end pick one. Nothing here does network I/O;
 * fake_upstream.c serves what these functions produce.
 */
#include "fake_upstream.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Where in the script a loading error is ("rules[2]: "), or "". */
static char die_where[48];

void fake_die(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "loom-fake-upstream: %s", die_where);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

/* Reads a whole file of at most FAKE_MAX_FILE bytes; NULL with errno. */
char *fake_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    struct stat st;
    size_t got;

    if (!f)
        return NULL;
    if (fstat(fileno(f), &st) != 0)
        goto fail;
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > FAKE_MAX_FILE) {
        errno = S_ISREG(st.st_mode) ? EFBIG : EINVAL;
        goto fail;
    }
    buf = malloc((size_t)st.st_size + 1);
    if (!buf)
        goto fail;
    got = fread(buf, 1, (size_t)st.st_size, f);
    if (got != (size_t)st.st_size) {
        errno = EIO;
        goto fail;
    }
    buf[got] = '\0';
    *len = got;
    fclose(f);
    return buf;
fail:
    free(buf);
    fclose(f);
    return NULL;
}

/* Strict decimal parse of a long in [lo, hi]; false when it is not one. */
bool fake_parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    long v;

    if (!s || !*s)
        return false;
    errno = 0;
    v = strtol(s, &end, 10);
    while (*end == ' ' || *end == '\n' || *end == '\r' || *end == '\t')
        end++;
    if (errno || *end || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* ---- script loading ---------------------------------------------------- */

static const char *const resp_keys[] = {
    "status",
    "headers",
    "delay_ms",
    "error",
    "body",
    "body_file",
    "content_type",
    "reasoning",
    "text",
    "tool_calls",
    "interleave",
    "usage",
    "finish_reason",
    "model",
    "id",
    "created",
    "chunk_delay_ms",
    "disconnect_after_chunks",
    "hang",
    "hang_after_chunks",
    "stream_error",
    "format",
    "reasoning_kind",
    "signature",
    "redacted_thinking",
    "thought_signature",
    "stream_error_event",
};

static long opt_ms(json_t *o, const char *key, size_t i, long dflt)
{
    json_t *v = json_object_get(o, key);

    if (!v)
        return dflt;
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) > 86400000)
        fake_die("script: responses[%zu].%s must be an integer 0..86400000", i,
                 key);
    return (long)json_integer_value(v);
}

static const char *opt_str(json_t *o, const char *key, size_t i,
                           const char *dflt)
{
    json_t *v = json_object_get(o, key);

    if (!v)
        return dflt;
    if (!json_is_string(v))
        fake_die("script: responses[%zu].%s must be a string", i, key);
    return json_string_value(v);
}

static json_t *opt_strings(json_t *o, const char *key, size_t i)
{
    json_t *v = json_object_get(o, key), *e;
    size_t k;

    if (!v)
        return NULL;
    if (!json_is_array(v))
        fake_die("script: responses[%zu].%s must be an array of strings", i,
                 key);
    json_array_foreach(v, k, e)
    {
        if (!json_is_string(e))
            fake_die("script: responses[%zu].%s[%zu] must be a string", i, key,
                     k);
    }
    return v;
}

static void load_calls(fake_resp *r, json_t *calls, size_t i)
{
    json_t *c, *args, *e;
    size_t k, m;

    if (!json_is_array(calls))
        fake_die("script: responses[%zu].tool_calls must be an array", i);
    r->ncalls = json_array_size(calls);
    r->calls = calloc(r->ncalls ? r->ncalls : 1, sizeof(*r->calls));
    if (!r->calls)
        fake_die("out of memory");
    json_array_foreach(calls, k, c)
    {
        fake_call *fc = &r->calls[k];
        const char *key;
        json_t *val;

        if (!json_is_object(c))
            fake_die("script: responses[%zu].tool_calls[%zu] must be an object",
                     i, k);
        json_object_foreach(c, key, val)
        {
            if (strcmp(key, "id") && strcmp(key, "name") &&
                strcmp(key, "arguments") && key[0] != '_')
                fake_die("script: responses[%zu].tool_calls[%zu]: unknown "
                         "field \"%s\"",
                         i, k, key);
        }
        fc->id = opt_str(c, "id", i, NULL);
        fc->name = opt_str(c, "name", i, NULL);
        if (!fc->name)
            fake_die("script: responses[%zu].tool_calls[%zu] needs a \"name\"",
                     i, k);
        args = json_object_get(c, "arguments");
        if (!args)
            continue;
        if (json_is_string(args)) {
            fc->frags = malloc(sizeof(*fc->frags));
            if (!fc->frags)
                fake_die("out of memory");
            fc->frags[0] = json_string_value(args);
            fc->nfrags = 1;
            continue;
        }
        if (!json_is_array(args))
            fake_die("script: responses[%zu].tool_calls[%zu].arguments must be "
                     "a string or an array of strings",
                     i, k);
        fc->nfrags = json_array_size(args);
        fc->frags = calloc(fc->nfrags ? fc->nfrags : 1, sizeof(*fc->frags));
        if (!fc->frags)
            fake_die("out of memory");
        json_array_foreach(args, m, e)
        {
            if (!json_is_string(e))
                fake_die(
                    "script: responses[%zu].tool_calls[%zu].arguments[%zu] "
                    "must be a string",
                    i, k, m);
            fc->frags[m] = json_string_value(e);
        }
    }
}

static void load_body_file(fake_resp *r, const char *dir, const char *name,
                           size_t i)
{
    char *path;
    size_t n;

    if (name[0] == '/') {
        path = strdup(name);
    } else {
        n = strlen(dir) + strlen(name) + 2;
        path = malloc(n);
        if (path)
            snprintf(path, n, "%s/%s", dir, name);
    }
    if (!path)
        fake_die("out of memory");
    r->body = fake_read_file(path, &r->body_len);
    if (!r->body)
        fake_die("script: responses[%zu].body_file %s: %s", i, path,
                 strerror(errno));
    if (!r->content_type) {
        n = strlen(path);
        r->content_type = n > 4 && !strcmp(path + n - 4, ".sse")
                              ? "text/event-stream"
                              : "application/json";
    }
    free(path);
}

/* Reads an optional "format" field; FAKE_FMT_AUTO when absent. */
static fake_format opt_format(json_t *o, const char *where, size_t i)
{
    json_t *v = json_object_get(o, "format");
    fake_format f;

    if (!v)
        return FAKE_FMT_AUTO;
    f = json_is_string(v) ? fake_format_parse(json_string_value(v))
                          : FAKE_FMT_AUTO;
    if (f == FAKE_FMT_AUTO)
        fake_die("script: %s%zu%s.format must be one of \"openai-chat\", "
                 "\"anthropic\", \"gemini\", \"openai-responses\"",
                 where ? "responses[" : "top level", where ? i : 0,
                 where ? "]" : "");
    return f;
}

/* The fields of the formats other than Chat. */
static void load_format_fields(fake_resp *r, json_t *o, size_t i,
                               fake_format dflt)
{
    const char *kind, *ev;
    size_t k;

    r->format = opt_format(o, "responses", i);
    if (r->format == FAKE_FMT_AUTO)
        r->format = dflt;
    kind = opt_str(o, "reasoning_kind", i, "summary");
    if (strcmp(kind, "summary") && strcmp(kind, "text"))
        fake_die("script: responses[%zu].reasoning_kind must be \"summary\" "
                 "or \"text\"",
                 i);
    r->reasoning_text = !strcmp(kind, "text");
    ev = opt_str(o, "stream_error_event", i, "error");
    if (strcmp(ev, "error") && strcmp(ev, "response.failed"))
        fake_die("script: responses[%zu].stream_error_event must be "
                 "\"error\" or \"response.failed\"",
                 i);
    r->failed_event = !strcmp(ev, "response.failed");
    r->signature = opt_str(o, "signature", i, NULL);
    r->redacted_thinking = opt_str(o, "redacted_thinking", i, NULL);
    r->thought_signature = opt_str(o, "thought_signature", i, NULL);
    /* Gemini carries arguments as objects: check them now when the
     * format is known (with auto-detection, a request gets a 500). */
    if (r->format != FAKE_FMT_GEMINI)
        return;
    for (k = 0; k < r->ncalls; k++) {
        json_t *a = fake_call_args(&r->calls[k]);

        if (!a)
            fake_die("script: responses[%zu].tool_calls[%zu].arguments must "
                     "join into a JSON object for gemini",
                     i, k);
        json_decref(a);
    }
}

static void load_resp(fake_resp *r, json_t *o, size_t i, const char *dir,
                      fake_format dflt)
{
    const char *key;
    json_t *v;
    size_t k;

    if (!json_is_object(o))
        fake_die("script: responses[%zu] must be an object", i);
    json_object_foreach(o, key, v)
    {
        bool known = key[0] == '_';

        for (k = 0; !known && k < sizeof(resp_keys) / sizeof(*resp_keys); k++)
            known = !strcmp(key, resp_keys[k]);
        if (!known)
            fake_die("script: responses[%zu]: unknown field \"%s\"", i, key);
    }
    v = json_object_get(o, "status");
    if (v && (!json_is_integer(v) || json_integer_value(v) < 100 ||
              json_integer_value(v) > 599))
        fake_die("script: responses[%zu].status must be an integer 100..599",
                 i);
    r->status = v ? (int)json_integer_value(v) : 0;
    r->headers = json_object_get(o, "headers");
    if (r->headers) {
        if (!json_is_object(r->headers))
            fake_die("script: responses[%zu].headers must be an object", i);
        json_object_foreach(r->headers, key, v)
        {
            if (!json_is_string(v) || strpbrk(json_string_value(v), "\r\n"))
                fake_die("script: responses[%zu].headers.%s must be a one-line "
                         "string",
                         i, key);
        }
    }
    r->delay_ms = opt_ms(o, "delay_ms", i, 0);
    r->chunk_delay_ms = opt_ms(o, "chunk_delay_ms", i, 0);
    r->disconnect_after = opt_ms(o, "disconnect_after_chunks", i, -1);
    r->hang_after = opt_ms(o, "hang_after_chunks", i, 0);
    v = json_object_get(o, "hang");
    if (v && !json_is_boolean(v))
        fake_die("script: responses[%zu].hang must be a boolean", i);
    r->hang = json_is_true(v);
    v = json_object_get(o, "interleave");
    if (v && !json_is_boolean(v))
        fake_die("script: responses[%zu].interleave must be a boolean", i);
    r->interleave = json_is_true(v);
    r->error = json_object_get(o, "error");
    if (r->error && !json_is_object(r->error))
        fake_die("script: responses[%zu].error must be an object", i);
    r->stream_error = json_object_get(o, "stream_error");
    if (r->stream_error && !json_is_object(r->stream_error))
        fake_die("script: responses[%zu].stream_error must be an object", i);
    r->usage = json_object_get(o, "usage");
    if (r->usage && !json_is_object(r->usage))
        fake_die("script: responses[%zu].usage must be an object", i);
    r->content_type = opt_str(o, "content_type", i, NULL);
    if (r->content_type && strpbrk(r->content_type, "\r\n"))
        fake_die("script: responses[%zu].content_type must be one line", i);
    r->finish_reason = opt_str(o, "finish_reason", i, NULL);
    r->model = opt_str(o, "model", i, "fake-model");
    r->id = opt_str(o, "id", i, NULL);
    v = json_object_get(o, "created");
    if (v && !json_is_integer(v))
        fake_die("script: responses[%zu].created must be an integer", i);
    r->created = v ? json_integer_value(v) : FAKE_CREATED;
    r->reasoning = opt_strings(o, "reasoning", i);
    r->text = opt_strings(o, "text", i);
    v = json_object_get(o, "tool_calls");
    if (v)
        load_calls(r, v, i);
    load_format_fields(r, o, i, dflt);

    if (json_object_get(o, "body") && json_object_get(o, "body_file"))
        fake_die("script: responses[%zu] has both body and body_file", i);
    if (r->error &&
        (json_object_get(o, "body") || json_object_get(o, "body_file")))
        fake_die("script: responses[%zu] has both error and a body", i);
    v = json_object_get(o, "body");
    if (v) {
        if (!json_is_string(v))
            fake_die("script: responses[%zu].body must be a string", i);
        r->body_len = json_string_length(v);
        r->body = malloc(r->body_len + 1);
        if (!r->body)
            fake_die("out of memory");
        memcpy(r->body, json_string_value(v), r->body_len + 1);
        r->has_body = true;
        if (!r->content_type)
            r->content_type = "application/json";
    }
    v = json_object_get(o, "body_file");
    if (v) {
        if (!json_is_string(v))
            fake_die("script: responses[%zu].body_file must be a string", i);
        load_body_file(r, dir, json_string_value(v), i);
        r->has_body = true;
    }
}

/* Loads rule k: {"match", "responses", "loop"}. */
static void load_rule(fake_rule *ru, json_t *o, size_t k, const char *dir,
                      fake_format dflt)
{
    const char *key;
    json_t *v, *arr;
    size_t i;

    if (!json_is_object(o))
        fake_die("script: rules[%zu] must be an object", k);
    json_object_foreach(o, key, v)
    {
        if (strcmp(key, "match") && strcmp(key, "responses") &&
            strcmp(key, "loop") && key[0] != '_')
            fake_die("script: rules[%zu]: unknown field \"%s\"", k, key);
    }
    fake_match_load(&ru->match, json_object_get(o, "match"), k);
    v = json_object_get(o, "loop");
    if (v && !json_is_boolean(v))
        fake_die("script: rules[%zu].loop must be a boolean", k);
    ru->loop = json_is_true(v);
    arr = json_object_get(o, "responses");
    if (!json_is_array(arr) || !json_array_size(arr))
        fake_die("script: rules[%zu] needs a non-empty \"responses\" array", k);
    ru->n = json_array_size(arr);
    ru->resp = calloc(ru->n, sizeof(*ru->resp));
    if (!ru->resp)
        fake_die("out of memory");
    snprintf(die_where, sizeof(die_where), "rules[%zu]: ", k);
    json_array_foreach(arr, i, v)
    {
        load_resp(&ru->resp[i], v, i, dir, dflt);
    }
    die_where[0] = '\0';
}

static void load_rules(fake_script *sc, json_t *rules, const char *dir)
{
    json_t *v;
    size_t k;

    if (!rules)
        return;
    if (!json_is_array(rules))
        fake_die("script: rules must be an array");
    sc->nrules = json_array_size(rules);
    sc->rules = calloc(sc->nrules ? sc->nrules : 1, sizeof(*sc->rules));
    if (!sc->rules)
        fake_die("out of memory");
    json_array_foreach(rules, k, v)
    {
        load_rule(&sc->rules[k], v, k, dir, sc->format);
    }
}

/* Frees the owned parts of n responses and the array. */
static void free_resps(fake_resp *resp, size_t n)
{
    size_t i, k;

    for (i = 0; i < n; i++) {
        for (k = 0; k < resp[i].ncalls; k++)
            free(resp[i].calls[k].frags);
        free(resp[i].calls);
        free(resp[i].body);
    }
    free(resp);
}

void fake_script_load(fake_script *sc, const char *path)
{
    json_error_t jerr;
    char *text, *dir, *slash;
    size_t len, i;
    const char *key;
    json_t *v, *arr;

    text = fake_read_file(path, &len);
    if (!text)
        fake_die("script %s: %s", path, strerror(errno));
    sc->root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    free(text);
    if (!sc->root)
        fake_die("script %s:%d:%d: %s", path, jerr.line, jerr.column,
                 jerr.text);
    if (!json_is_object(sc->root))
        fake_die("script %s: must be a JSON object", path);
    json_object_foreach(sc->root, key, v)
    {
        if (strcmp(key, "loop") && strcmp(key, "responses") &&
            strcmp(key, "format") && strcmp(key, "rules") && key[0] != '_')
            fake_die("script %s: unknown field \"%s\"", path, key);
    }
    sc->format = opt_format(sc->root, NULL, 0);
    v = json_object_get(sc->root, "loop");
    if (v && !json_is_boolean(v))
        fake_die("script %s: loop must be a boolean", path);
    sc->loop = json_is_true(v);
    arr = json_object_get(sc->root, "responses");
    if (!arr && json_object_get(sc->root, "rules")) {
        arr = json_array(); /* rules alone: no plain answers */
        if (json_object_set_new(sc->root, "responses", arr))
            fake_die("out of memory");
    }
    if (!json_is_array(arr))
        fake_die("script %s: needs a \"responses\" array", path);
    sc->n = json_array_size(arr);
    if (sc->loop && !sc->n)
        fake_die("script %s: loop needs at least one response", path);
    sc->resp = calloc(sc->n ? sc->n : 1, sizeof(*sc->resp));
    dir = strdup(path);
    if (!sc->resp || !dir)
        fake_die("out of memory");
    slash = strrchr(dir, '/');
    if (slash == dir)
        dir[1] = '\0';
    else if (slash)
        *slash = '\0';
    else /* path is not empty, so dir has room for "." */
        memcpy(dir, ".", 2);
    json_array_foreach(arr, i, v)
    {
        load_resp(&sc->resp[i], v, i, dir, sc->format);
    }
    load_rules(sc, json_object_get(sc->root, "rules"), dir);
    free(dir);
    if (pthread_mutex_init(&sc->lock, NULL))
        fake_die("cannot create a mutex");
}

void fake_script_free(fake_script *sc)
{
    size_t k;

    free_resps(sc->resp, sc->n);
    for (k = 0; k < sc->nrules; k++)
        free_resps(sc->rules[k].resp, sc->rules[k].n);
    free(sc->rules);
    json_decref(sc->root);
    pthread_mutex_destroy(&sc->lock);
}

/* Takes the next slot of a cursor under the script's lock. */
static size_t take(fake_script *sc, size_t *cursor)
{
    size_t i;

    pthread_mutex_lock(&sc->lock);
    i = (*cursor)++;
    pthread_mutex_unlock(&sc->lock);
    return i;
}

const fake_resp *fake_script_pick(fake_script *sc, json_t *body, uint64_t n,
                                  char *why, size_t n_why)
{
    size_t k, i;

    for (k = 0; k < sc->nrules; k++) {
        fake_rule *ru = &sc->rules[k];

        if (!fake_match_request(&ru->match, body))
            continue;
        i = take(sc, &ru->next);
        if (i < ru->n || ru->loop)
            return &ru->resp[i % ru->n];
        snprintf(why, n_why,
                 "fake upstream: rules[%zu] exhausted after %zu responses", k,
                 ru->n);
        return NULL;
    }
    if (sc->nrules)
        n = (uint64_t)take(sc, &sc->plain_next) + 1;
    if (n > sc->n && !sc->loop) {
        snprintf(why, n_why,
                 "fake upstream: script exhausted after %zu responses", sc->n);
        return NULL;
    }
    return &sc->resp[(n - 1) % sc->n];
}

/* ---- rendering --------------------------------------------------------- */

void fake_stream_free(void *cls)
{
    fake_stream *s = cls;
    size_t i;

    if (!s)
        return;
    for (i = 0; i < s->n; i++)
        free(s->chunk[i]);
    free(s->chunk);
    free(s->len);
    free(s);
}

/* Appends a chunk it takes ownership of (freed on failure). */
int fake_stream_take(fake_stream *s, char *data, size_t len)
{
    if (!data)
        return -1;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        char **c = realloc(s->chunk, cap * sizeof(*c));
        size_t *l;

        if (c)
            s->chunk = c;
        l = c ? realloc(s->len, cap * sizeof(*l)) : NULL;
        if (!l) {
            free(data);
            return -1;
        }
        s->len = l;
        s->cap = cap;
    }
    s->chunk[s->n] = data;
    s->len[s->n++] = len;
    return 0;
}

int fake_stream_copy(fake_stream *s, const char *data, size_t len)
{
    char *p = malloc(len + 1);

    if (p) {
        memcpy(p, data, len);
        p[len] = '\0';
    }
    return fake_stream_take(s, p, len);
}

int fake_stream_event(fake_stream *s, const char *event, json_t *obj,
                      const char *eol)
{
    char *js = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    size_t n = 0;
    char *line = NULL;

    json_decref(obj);
    if (js) {
        n = (event ? strlen(event) + 8 : 0) + 6 + strlen(js) + 2 * strlen(eol) +
            1;
        line = malloc(n);
    }
    if (line)
        snprintf(line, n, "%s%s%sdata: %s%s%s", event ? "event: " : "",
                 event ? event : "", event ? "\n" : "", js, eol, eol);
    free(js);
    return fake_stream_take(s, line, line ? n - 1 : 0);
}

/* Appends `data: <compact json>\n\n` and releases obj. */
static int stream_event(fake_stream *s, json_t *obj)
{
    return fake_stream_event(s, NULL, obj, "\n");
}

/*
 * Splits a body into SSE events (each ends after a blank line, "\n\n" or
 * "\r\n\r\n") so the chunk options work on recorded streams too.
 */
int fake_stream_split(fake_stream *s, const char *b, size_t len)
{
    size_t start = 0, i;

    for (i = 0; i < len; i++) {
        bool end =
            b[i] == '\n' && ((i >= 1 && b[i - 1] == '\n') ||
                             (i >= 2 && b[i - 1] == '\r' && b[i - 2] == '\n'));

        if (end || i + 1 == len) {
            if (fake_stream_copy(s, b + start, i + 1 - start))
                return -1;
            start = i + 1;
        }
    }
    return 0;
}

static json_t *chunk_obj(const fake_gen *gn, json_t *delta, const char *finish)
{
    json_t *o =
        json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:o,s:n,s:s?}]}", "id", gn->id,
                  "object", "chat.completion.chunk", "created", gn->r->created,
                  "model", gn->r->model, "choices", "index", 0, "delta", delta,
                  "logprobs", "finish_reason", finish);

    if (o && gn->usage_chunk)
        json_object_set_new(o, "usage", json_null());
    return o;
}

static int emit_delta(fake_stream *s, const fake_gen *gn, const char *key,
                      const char *val)
{
    return stream_event(s, chunk_obj(gn, json_pack("{s:s}", key, val), NULL));
}

static const char *finish_of(const fake_resp *r)
{
    if (r->finish_reason)
        return r->finish_reason;
    return r->ncalls ? "tool_calls" : "stop";
}

const char *fake_call_id(const fake_call *c, size_t k, const char *prefix,
                         char *buf, size_t n)
{
    if (c->id)
        return c->id;
    snprintf(buf, n, "%s%zu", prefix, k + 1);
    return buf;
}

/* The element `step` of call k's deltas: 0 is its head, then fragments. */
static int emit_call_step(fake_stream *s, const fake_gen *gn, size_t k,
                          size_t step)
{
    const fake_call *c = &gn->r->calls[k];
    char cbuf[64];
    const char *cid;
    json_t *tc;

    if (step == 0) {
        cid = fake_call_id(c, k, "call_fake_", cbuf, sizeof(cbuf));
        tc = json_pack("{s:[{s:I,s:s,s:s,s:{s:s,s:s}}]}", "tool_calls", "index",
                       (json_int_t)k, "id", cid, "type", "function", "function",
                       "name", c->name, "arguments", "");
    } else {
        tc = json_pack("{s:[{s:I,s:{s:s}}]}", "tool_calls", "index",
                       (json_int_t)k, "function", "arguments",
                       c->frags[step - 1]);
    }
    return stream_event(s, chunk_obj(gn, tc, NULL));
}

static int chat_stream(fake_stream *s, const fake_gen *gn)
{
    const fake_resp *r = gn->r;
    size_t k, step, maxsteps = 0;
    json_t *v, *role;
    bool more;

    role = json_pack("{s:s,s:o}", "role", "assistant", "content",
                     r->ncalls && !r->text ? json_null() : json_string(""));
    if (stream_event(s, chunk_obj(gn, role, NULL)))
        return -1;
    json_array_foreach(r->reasoning, k, v)
    {
        if (emit_delta(s, gn, "reasoning_content", json_string_value(v)))
            return -1;
    }
    json_array_foreach(r->text, k, v)
    {
        if (emit_delta(s, gn, "content", json_string_value(v)))
            return -1;
    }
    if (r->stream_error)
        return stream_event(s, json_pack("{s:O}", "error", r->stream_error));
    if (r->interleave) {
        for (k = 0; k < r->ncalls; k++)
            if (r->calls[k].nfrags + 1 > maxsteps)
                maxsteps = r->calls[k].nfrags + 1;
        for (step = 0; step < maxsteps; step++) {
            for (k = 0; k < r->ncalls; k++) {
                more = step <= r->calls[k].nfrags;
                if (more && emit_call_step(s, gn, k, step))
                    return -1;
            }
        }
    } else {
        for (k = 0; k < r->ncalls; k++)
            for (step = 0; step <= r->calls[k].nfrags; step++)
                if (emit_call_step(s, gn, k, step))
                    return -1;
    }
    if (stream_event(s, chunk_obj(gn, json_object(), finish_of(r))))
        return -1;
    if (gn->usage_chunk &&
        stream_event(s, json_pack("{s:s,s:s,s:I,s:s,s:[],s:O}", "id", gn->id,
                                  "object", "chat.completion.chunk", "created",
                                  r->created, "model", r->model, "choices",
                                  "usage", r->usage)))
        return -1;
    return fake_stream_copy(s, "data: [DONE]\n\n", 14);
}

json_t *fake_join(json_t *arr, const char **strs, size_t n)
{
    size_t total = 0, i, len;
    char *buf, *p;
    json_t *out;

    if (arr)
        n = json_array_size(arr);
    for (i = 0; i < n; i++)
        total +=
            arr ? json_string_length(json_array_get(arr, i)) : strlen(strs[i]);
    buf = p = malloc(total + 1);
    if (!buf)
        return NULL;
    for (i = 0; i < n; i++) {
        const char *src =
            arr ? json_string_value(json_array_get(arr, i)) : strs[i];

        len = arr ? json_string_length(json_array_get(arr, i)) : strlen(src);
        memcpy(p, src, len);
        p += len;
    }
    out = json_stringn(buf, total);
    free(buf);
    return out;
}

static json_t *chat_message(const fake_gen *gn)
{
    const fake_resp *r = gn->r;
    json_t *msg, *calls, *out;
    char cbuf[64];
    const char *cid;
    size_t k;

    msg = json_pack("{s:s,s:o}", "role", "assistant", "content",
                    r->text     ? fake_join(r->text, NULL, 0)
                    : r->ncalls ? json_null()
                                : json_string(""));
    if (msg && r->reasoning)
        json_object_set_new(msg, "reasoning_content",
                            fake_join(r->reasoning, NULL, 0));
    if (msg && r->ncalls) {
        calls = json_array();
        for (k = 0; k < r->ncalls; k++) {
            const fake_call *c = &r->calls[k];

            cid = fake_call_id(c, k, "call_fake_", cbuf, sizeof(cbuf));
            json_array_append_new(
                calls,
                json_pack("{s:s,s:s,s:{s:s,s:o}}", "id", cid, "type",
                          "function", "function", "name", c->name, "arguments",
                          fake_join(NULL, c->frags, c->nfrags)));
        }
        json_object_set_new(msg, "tool_calls", calls);
    }
    if (msg)
        json_object_set_new(msg, "refusal", json_null());
    out = json_pack("{s:s,s:s,s:I,s:s,s:[{s:i,s:o,s:n,s:s}]}", "id", gn->id,
                    "object", "chat.completion", "created", r->created, "model",
                    r->model, "choices", "index", 0, "message", msg, "logprobs",
                    "finish_reason", finish_of(r));
    if (out && r->usage)
        json_object_set(out, "usage", r->usage);
    return out;
}

json_t *fake_error_body(const char *msg, const char *type)
{
    return json_pack("{s:{s:s,s:s,s:n,s:n}}", "error", "message", msg, "type",
                     type, "param", "code");
}

/* ---- shared by the formats --------------------------------------------- */

static const struct {
    const char *name;
    fake_format fmt;
} format_names[] = {
    {"openai-chat", FAKE_FMT_CHAT},
    {"anthropic", FAKE_FMT_ANTHROPIC},
    {"gemini", FAKE_FMT_GEMINI},
    {"openai-responses", FAKE_FMT_RESPONSES},
};

fake_format fake_format_parse(const char *name)
{
    size_t i;

    for (i = 0; name && i < sizeof(format_names) / sizeof(*format_names); i++)
        if (!strcmp(name, format_names[i].name))
            return format_names[i].fmt;
    return FAKE_FMT_AUTO;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);

    return n >= k && !memcmp(s + n - k, suffix, k);
}

fake_format fake_format_of_path(const char *path)
{
    if (ends_with(path, "/v1/messages"))
        return FAKE_FMT_ANTHROPIC;
    if (strstr(path, "/models/") &&
        (ends_with(path, ":streamGenerateContent") ||
         ends_with(path, ":generateContent")))
        return FAKE_FMT_GEMINI;
    if (ends_with(path, "/v1/responses"))
        return FAKE_FMT_RESPONSES;
    return FAKE_FMT_CHAT;
}

json_t *fake_call_args(const fake_call *c)
{
    json_t *joined = fake_join(NULL, c->frags, c->nfrags), *o = NULL;

    if (!joined)
        return NULL;
    if (json_string_length(joined) == 0)
        o = json_object();
    else
        o = json_loadb(json_string_value(joined), json_string_length(joined), 0,
                       NULL);
    json_decref(joined);
    if (o && !json_is_object(o)) {
        json_decref(o);
        o = NULL;
    }
    return o;
}

bool fake_args_ok(const fake_resp *r)
{
    size_t k;

    for (k = 0; k < r->ncalls; k++) {
        json_t *a = fake_call_args(&r->calls[k]);

        if (!a)
            return false;
        json_decref(a);
    }
    return true;
}

bool fake_usage_is_openai(json_t *usage)
{
    return json_object_get(usage, "prompt_tokens") ||
           json_object_get(usage, "completion_tokens");
}

json_int_t fake_usage_int(json_t *usage, const char *key, const char *sub,
                          json_int_t dflt)
{
    json_t *v = json_object_get(usage, key);

    if (sub)
        v = json_object_get(v, sub);
    return json_is_integer(v) ? json_integer_value(v) : dflt;
}

/* ---- dispatch ------------------------------------------------------------ */

int fake_render_stream(fake_stream *s, const fake_gen *gn)
{
    switch (gn->fmt) {
    case FAKE_FMT_ANTHROPIC:
        return fake_anthropic_stream(s, gn);
    case FAKE_FMT_GEMINI:
        return fake_gemini_stream(s, gn);
    case FAKE_FMT_RESPONSES:
        return fake_responses_stream(s, gn);
    default:
        return chat_stream(s, gn);
    }
}

json_t *fake_render_message(const fake_gen *gn)
{
    switch (gn->fmt) {
    case FAKE_FMT_ANTHROPIC:
        return fake_anthropic_message(gn);
    case FAKE_FMT_GEMINI:
        return fake_gemini_message(gn);
    case FAKE_FMT_RESPONSES:
        return fake_responses_message(gn);
    default:
        return chat_message(gn);
    }
}

json_t *fake_render_error(fake_format fmt, int status, json_t *error)
{
    switch (fmt) {
    case FAKE_FMT_ANTHROPIC:
        return fake_anthropic_error(status, error);
    case FAKE_FMT_GEMINI:
        return fake_gemini_error(status, error);
    default: /* both OpenAI APIs: the object verbatim */
        return json_pack("{s:O}", "error", error);
    }
}
