/*
 * MCP tools as loom tools: names, results as text, and the registration
 * of every configured server's tools (loom_tools_add_mcp, loom/mcp.h).
 *
 * Each registered tool's payload holds a reference to its server, so the
 * server lives as long as the registry (and any call still running on
 * it). Servers are started and listed either before the registry is
 * used (their tools are then in it), or, for loom serve and loom run, in
 * the background: each server is then a source of the registry
 * (tools/registry.h) whose tools a snapshot takes, waiting for the
 * listing when its run needs them, listing again after the server said
 * its list changed, and trying again after a failure. The schema goes to
 * the model as the server wrote it. A call's failure (timeout, dead
 * server, JSON-RPC error), a result with isError and one that breaks the
 * tool's outputSchema all fail the tool call with the server's (or the
 * check's) words, which the run shows the model as a failed execution.
 * Image content is described in the text, and for a model that sees
 * (loom_tool_ctx.images) also given as images.
 */
#include "core/error.h"
#include "core/fiber.h"
#include "loom/log.h"
#include "tools/mcp/mcp_internal.h"
#include "tools/registry.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NAME_MAX_LEN 64
#define HASH_LEN 8
/* Room kept in a result for the cut note. */
#define CUT_RESERVE 100

/* ---- names ------------------------------------------------------------- */

static uint32_t fnv1a(const char *a, const char *b)
{
    uint32_t h = 2166136261u;

    for (const char *p = a; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    h = (h ^ 0) * 16777619u;
    for (const char *p = b; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    return h;
}

void loom_mcp_tool_name(char out[65], const char *server, const char *tool)
{
    size_t n = 0;
    const char *parts[3] = {server, "__", tool};

    for (int k = 0; k < 3; k++)
        for (const char *p = parts[k]; *p; p++) {
            char ch = *p;
            int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                     (ch >= '0' && ch <= '9') || ch == '_' || ch == '-';
            if (n < NAME_MAX_LEN)
                out[n] = ok ? ch : '_';
            n++;
        }
    if (n <= NAME_MAX_LEN) {
        out[n] = '\0';
        return;
    }
    /* Cut, and a hash of the whole name keeps it unique. */
    snprintf(out + NAME_MAX_LEN - HASH_LEN - 1, HASH_LEN + 2, "_%08x",
             (unsigned)fnv1a(server, tool));
}

/* ---- results ----------------------------------------------------------- */

/* Appends s (len bytes) to out, cut at a character boundary when it does
 * not fit; *cut counts the bytes left out. */
static int put_cut(loom_buf *out, const char *s, size_t len, size_t *cut)
{
    size_t room;
    int rc;

    if (*cut) {
        *cut += len;
        return 0;
    }
    room = out->max > out->len + CUT_RESERVE ? out->max - out->len - CUT_RESERVE
                                             : 0;
    if (len <= room)
        return loom_buf_put(out, s, len);
    while (room && ((unsigned char)s[room] & 0xC0) == 0x80)
        room--;
    if ((rc = loom_buf_put(out, s, room)) != 0)
        return rc;
    *cut = len - room;
    return 0;
}

static int put_str(loom_buf *out, const char *s, size_t *cut)
{
    return put_cut(out, s, strlen(s), cut);
}

static int put_block(loom_buf *out, const json_t *c, size_t *cut)
{
    const char *type = json_string_value(json_object_get(c, "type"));
    const char *mime = json_string_value(json_object_get(c, "mimeType"));
    const json_t *res = json_object_get(c, "resource");
    char line[512];

    if (!type)
        return 0;
    if (strcmp(type, "text") == 0) {
        const json_t *t = json_object_get(c, "text");
        return put_cut(out, json_string_value(t) ? json_string_value(t) : "",
                       json_string_length(t), cut);
    }
    if (strcmp(type, "image") == 0 || strcmp(type, "audio") == 0) {
        size_t b64 = json_string_length(json_object_get(c, "data"));
        snprintf(line, sizeof(line), "[%s: %.100s, about %zu bytes]", type,
                 mime ? mime : "unknown type", b64 / 4 * 3);
        return put_str(out, line, cut);
    }
    if (strcmp(type, "resource_link") == 0) {
        const char *uri = json_string_value(json_object_get(c, "uri"));
        const char *name = json_string_value(json_object_get(c, "name"));
        snprintf(line, sizeof(line), "[resource: %.300s%s%.100s%s]",
                 uri ? uri : "?", name ? " (" : "", name ? name : "",
                 name ? ")" : "");
        return put_str(out, line, cut);
    }
    if (strcmp(type, "resource") == 0 && json_is_object(res)) {
        const char *uri = json_string_value(json_object_get(res, "uri"));
        const json_t *text = json_object_get(res, "text");
        int rc;
        snprintf(line, sizeof(line), "[resource: %.300s]%s", uri ? uri : "?",
                 json_is_string(text) ? "\n" : "");
        if ((rc = put_str(out, line, cut)) != 0 || !json_is_string(text))
            return rc;
        return put_cut(out, json_string_value(text), json_string_length(text),
                       cut);
    }
    snprintf(line, sizeof(line), "[%.40s content]", type);
    return put_str(out, line, cut);
}

int loom_mcp_result_text(const json_t *result, loom_buf *out)
{
    const json_t *content = json_object_get(result, "content");
    const json_t *structured = json_object_get(result, "structuredContent");
    const json_t *c;
    size_t i, cut = 0, start = out->len;
    int rc = 0;
    char note[80];

    json_array_foreach(content, i, c)
    {
        if (out->len > start && (rc = put_str(out, "\n\n", &cut)) != 0)
            return rc;
        if ((rc = put_block(out, c, &cut)) != 0)
            return rc;
    }
    if (out->len == start && structured) {
        char *text = json_dumps(structured, JSON_COMPACT | JSON_ENCODE_ANY);
        if (!text)
            return loom__error_oom();
        rc = put_str(out, text, &cut);
        free(text);
        if (rc)
            return rc;
    }
    if (cut) {
        snprintf(note, sizeof(note), "\n[cut: %zu more bytes]", cut);
        if ((rc = loom_buf_puts(out, note)) != 0)
            return rc;
    }
    return json_is_true(json_object_get(result, "isError")) ? 1 : 0;
}

int loom_mcp_result_check(const json_t *output_schema, const json_t *result,
                          char **msg)
{
    const json_t *structured = json_object_get(result, "structuredContent");
    char *why = NULL;
    int rc;

    *msg = NULL;
    if (!json_is_object(output_schema) ||
        json_is_true(json_object_get(result, "isError")))
        return 0;
    if (!structured) {
        if (!(*msg = strdup("the tool declares an outputSchema but its "
                            "result has no structuredContent")))
            return loom__error_oom();
        return LOOM_EINVALID;
    }
    rc = loom_schema_validate(output_schema, structured, &why);
    if (rc == 0 || rc == LOOM_ENOMEM) {
        free(why);
        return rc;
    }
    rc = asprintf(msg, "the result does not match the tool's outputSchema: %s",
                  why ? why : "it is invalid");
    free(why);
    if (rc < 0) {
        *msg = NULL;
        return loom__error_oom();
    }
    return LOOM_EINVALID;
}

/*
 * The image content of result into images (loom_tool_ctx.images): its
 * base64 data and image/ media type, in order, at most
 * LOOM_TOOL_IMAGES_MAX of them; one past LOOM_TOOL_IMAGE_MAX_BYTES is
 * left out (the text still describes it).
 */
static int give_images(const json_t *result, json_t *images)
{
    const json_t *c;
    size_t i;

    json_array_foreach(json_object_get(result, "content"), i, c)
    {
        const char *type = json_string_value(json_object_get(c, "type"));
        const char *mime = json_string_value(json_object_get(c, "mimeType"));
        const json_t *data = json_object_get(c, "data");
        if (json_array_size(images) >= LOOM_TOOL_IMAGES_MAX)
            break;
        if (!type || strcmp(type, "image") != 0 || !json_is_string(data) ||
            !mime || strncmp(mime, "image/", 6) != 0 ||
            json_string_length(data) / 4 * 3 > LOOM_TOOL_IMAGE_MAX_BYTES)
            continue;
        if (json_array_append_new(
                images, json_pack("{s:O,s:s}", "data", data, "mime", mime)))
            return loom__error_oom();
    }
    return 0;
}

/* ---- tools ------------------------------------------------------------- */

typedef struct {
    loom_mcp_server *server; /* a reference */
    char *tool;              /* the server's name for it */
    json_t *output_schema;   /* its outputSchema (a copy), or NULL */
} mcp_tool;

static void mcp_tool_free(void *payload)
{
    mcp_tool *t = payload;

    if (!t)
        return;
    loom_mcp_server_free(t->server);
    free(t->tool);
    json_decref(t->output_schema);
    free(t);
}

/*
 * A progress notification of the server as a progress step of the call
 * (a tool.progress event): its message, else "N of M" / "N".
 */
static void on_progress(const json_t *params, void *arg)
{
    const loom_tool_ctx *ctx = arg;
    const char *msg = json_string_value(json_object_get(params, "message"));
    const json_t *total = json_object_get(params, "total");
    double done = json_number_value(json_object_get(params, "progress"));
    char label[128];

    if (msg && *msg)
        snprintf(label, sizeof(label), "%s", msg);
    else if (json_is_number(total))
        snprintf(label, sizeof(label), "%g of %g", done,
                 json_number_value(total));
    else
        snprintf(label, sizeof(label), "%g", done);
    loom_tool_progress(ctx, label, NULL, "running");
}

/*
 * A request of the server during a call that asks the caller: an
 * elicitation, put to whoever runs the turn (loom_tool_elicit): a form
 * they fill in, decline or cancel; nobody to ask (a background run, no
 * terminal) declines it. Or a sampling request, which the run's model
 * answers (loom_tool_sample).
 */
static int on_input(loom_mcp_server *s, const char *method,
                    const json_t *params, void *arg, json_t **result)
{
    const loom_tool_ctx *ctx = arg;
    int rc;

    if (strcmp(method, "sampling/createMessage") == 0)
        return loom_tool_sample(
            ctx, params, loom__mcp_config(s)->sampling_max_tokens, result);
    rc = loom_tool_elicit(ctx, loom_mcp_server_name(s),
                          json_string_value(json_object_get(params, "message")),
                          json_object_get(params, "requestedSchema"), result);
    if (rc == LOOM_ENOTFOUND)
        return (*result = json_pack("{s:s}", "action", "decline"))
                   ? 0
                   : LOOM_ENOMEM;
    return rc;
}

/* ---- per-user headers ---------------------------------------------------- */

#define USER_REF "${user."
/* Bytes of a resolved header value at most (a curl header line fits). */
#define USER_VALUE_MAX 8192

/* value with each ${user.NAME} replaced from secrets into *out. */
static int resolve(const loom_mcp_server *s, const char *header,
                   const char *value, const json_t *secrets, json_t **out)
{
    loom_buf b = LOOM_BUF_INIT(USER_VALUE_MAX);
    const char *p = value, *ref, *end;
    int rc = 0;

    *out = NULL;
    while (!rc && (ref = strstr(p, USER_REF)) != NULL) {
        char name[80];
        const char *v;

        if ((rc = loom_buf_put(&b, p, (size_t)(ref - p))) != 0)
            break;
        ref += strlen(USER_REF);
        if (!(end = strchr(ref, '}')) || end == ref ||
            (size_t)(end - ref) >= sizeof(name)) {
            rc = loom__error_set(LOOM_EINVALID,
                                 "MCP server '%s': header %s has a bad "
                                 "${user.NAME} reference",
                                 loom_mcp_server_name(s), header);
            break;
        }
        snprintf(name, sizeof(name), "%.*s", (int)(end - ref), ref);
        if (!(v = json_string_value(json_object_get(secrets, name)))) {
            rc = loom__error_set(
                LOOM_ENOTFOUND,
                "MCP server '%s' needs your own secret '%s' (for its %s "
                "header), and you have none. Tell the user: add it to "
                "your user settings (secrets.%s, PUT /v1/me/settings)",
                loom_mcp_server_name(s), name, header, name);
            break;
        }
        rc = loom_buf_puts(&b, v);
        p = end + 1;
    }
    if (!rc)
        rc = loom_buf_puts(&b, p);
    if (rc == LOOM_ETOOLARGE || (!rc && strpbrk(loom_buf_cstr(&b), "\r\n")))
        rc = loom__error_set(LOOM_EINVALID,
                             "MCP server '%s': your secret does not fit its "
                             "%s header (a line break, or longer than 8 KiB)",
                             loom_mcp_server_name(s), header);
    if (!rc && !(*out = json_string(loom_buf_cstr(&b))))
        rc = loom__error_oom();
    loom_buf_free(&b);
    return rc;
}

int loom_mcp_user_headers(const loom_mcp_server *s, const json_t *secrets,
                          json_t **out)
{
    const json_t *headers = loom__mcp_config(s)->headers, *v;
    const char *name;
    json_t *own = NULL, *value;
    int rc = 0;

    *out = NULL;
    json_object_foreach((json_t *)headers, name, v)
    {
        const char *text = json_string_value(v);
        if (!text || !strstr(text, USER_REF))
            continue;
        if (!own && !(own = json_object()))
            return loom__error_oom();
        if ((rc = resolve(s, name, text, secrets, &value)) != 0 ||
            (rc = json_object_set_new(own, name, value) ? loom__error_oom()
                                                        : 0) != 0) {
            json_decref(own);
            return rc;
        }
    }
    *out = own;
    return 0;
}

static int mcp_tool_execute(const json_t *args, const loom_tool_ctx *ctx,
                            loom_buf *out, void *payload)
{
    mcp_tool *t = payload;
    json_t *result = NULL, *own = NULL;
    loom_mcp_call_options o = {0};
    char *bad = NULL;
    int rc;

    o.timeout_ms =
        (long)json_integer_value(json_object_get(ctx->settings, "timeout_ms"));
    o.cancel = ctx->cancel;
    o.on_progress = on_progress;
    o.progress_arg = (void *)ctx;
    o.input = on_input;
    o.input_arg = (void *)ctx;
    o.elicitation = loom_tool_can_elicit(ctx);
    /* A header naming a user's secret takes the caller's (their
     * settings' secrets, which the server puts in user_keys). */
    rc = loom_mcp_user_headers(
        t->server, json_object_get(ctx->user_keys, "secrets"), &own);
    o.headers = own;
    /* With accounts, the caller's own OAuth tokens, never another's. */
    if (rc == 0 && loom__mcp_per_user(t->server)) {
        o.user = ctx->user_id;
        if (!o.user || !*o.user)
            rc = loom__error_set(LOOM_EINVALID,
                                 "MCP server '%s' is used with each "
                                 "caller's own account, and this call is "
                                 "for no user",
                                 loom_mcp_server_name(t->server));
    }
    if (rc == 0)
        rc = loom_mcp_server_call_opts(t->server, t->tool, args, &o, &result);
    json_decref(own);
    if (rc != 0) {
        loom_buf_clear(out);
        loom_buf_puts(out, loom_error_last());
        return rc;
    }
    if ((rc = loom_mcp_result_check(t->output_schema, result, &bad)) != 0) {
        json_decref(result);
        loom_buf_clear(out);
        if (rc == LOOM_ENOMEM)
            return rc;
        loom_buf_puts(out, bad);
        rc = loom__error_set(LOOM_ERROR, "%s", bad);
        free(bad);
        return rc;
    }
    rc = loom_mcp_result_text(result, out);
    if (rc == 0 && ctx->images)
        rc = give_images(result, ctx->images);
    json_decref(result);
    if (rc == 1) {
        if (!out->len)
            loom_buf_puts(out, "the tool failed and said nothing more");
        return loom__error_set(LOOM_ERROR, "%.*s", 1000, loom_buf_cstr(out));
    }
    return rc;
}

/* Registers one tool of s; a name taken already is logged and skipped. */
static int add_tool(loom_tool_registry *reg, loom_mcp_server *s,
                    const json_t *def)
{
    const char *tname = json_string_value(json_object_get(def, "name"));
    const char *desc = json_string_value(json_object_get(def, "description"));
    const json_t *schema = json_object_get(def, "inputSchema");
    const json_t *output = json_object_get(def, "outputSchema");
    loom_tool tool = LOOM_TOOL_INIT;
    mcp_tool *t = calloc(1, sizeof(*t));
    char name[65], fallback[200];
    json_t *own_schema = NULL;
    int rc;

    if (!t || !(t->tool = strdup(tname)) ||
        (json_is_object(output) &&
         !(t->output_schema = json_deep_copy(output)))) {
        if (t)
            free(t->tool);
        free(t);
        return loom__error_oom();
    }
    loom_mcp_tool_name(name, loom_mcp_server_name(s), tname);
    /* A copy: the registry's tools are read from many threads. */
    schema = own_schema = json_is_object(schema)
                              ? json_deep_copy(schema)
                              : json_pack("{s:s}", "type", "object");
    if (!desc || !*desc) {
        snprintf(fallback, sizeof(fallback), "Tool %.80s of MCP server %.64s",
                 tname, loom_mcp_server_name(s));
        desc = fallback;
    }
    loom__mcp_ref(s);
    t->server = s;
    tool.name = name;
    tool.description = desc;
    tool.parameters = schema;
    tool.execute = mcp_tool_execute;
    tool.payload = t;
    tool.free_payload = mcp_tool_free;
    rc = schema ? loom_tool_registry_add(reg, &tool) : loom__error_oom();
    json_decref(own_schema);
    if (rc != 0) {
        loom_mcp_server_free(s);
        free(t->tool);
        json_decref(t->output_schema);
        free(t);
        if (rc == LOOM_ENOMEM)
            return rc;
        loom_warn("mcp %s: tool '%s' not offered: %s", loom_mcp_server_name(s),
                  name, loom_error_last());
        return 0;
    }
    return 1;
}

/* ---- servers started in the background ---------------------------------- */

/*
 * One server as a source of a registry. Its tools are those of the last
 * listing that succeeded, kept as a registry of their own whose tools
 * snapshots share. A listing is due before the first success and after
 * the server said its list changed; one at a time is made, by the
 * background start or by a snapshot that needs the tools, and the
 * others that need them wait for it. The registries holding the source
 * own it: the last one out waits for the background start to end (it
 * uses the setup's credentials and authorizer, which must outlive the
 * registry) and frees it.
 */
typedef struct {
    loom_mcp_server *server; /* a reference */
    pthread_mutex_t mu;
    loom__cond cv;             /* parks a waiting run on a fiber */
    loom_tool_registry *tools; /* the last listing's; NULL before one */
    unsigned listed_at;        /* lists_changed when it began */
    int listing;               /* a listing is under way */
    unsigned attempts;         /* listings ended, succeeded or not */
    atomic_uint appeared;      /* times tools came where there were none */
    char prefix[NAME_MAX_LEN + 1];
    pthread_t thread; /* the background start */
    int started;      /* it runs, to be joined */
} lazy;

static void lazy_free(void *arg)
{
    lazy *l = arg;

    if (!l)
        return;
    if (l->started)
        pthread_join(l->thread, NULL);
    loom_tool_registry_free(l->tools);
    loom_mcp_server_free(l->server);
    pthread_mutex_destroy(&l->mu);
    loom__cond_destroy(&l->cv);
    free(l);
}

/* Whether a listing is due. Under l->mu. */
static int due(lazy *l)
{
    return !l->tools || loom__mcp_lists_changed(l->server) != l->listed_at;
}

/* Lists the server's tools into a registry of their own. Without l->mu. */
static int list_tools(lazy *l, loom_tool_registry **out)
{
    json_t *defs = NULL;
    const json_t *def;
    size_t i, added = 0;
    int rc;

    *out = NULL;
    if (loom_mcp_server_tools(l->server, &defs) != 0) {
        loom_warn("mcp %s: not available, its tools are not offered: %s",
                  loom_mcp_server_name(l->server), loom_error_last());
        return 0;
    }
    if ((rc = loom_tool_registry_new(out)) != 0) {
        json_decref(defs);
        return rc;
    }
    json_array_foreach(defs, i, def)
    {
        int r = add_tool(*out, l->server, def);
        if (r < 0) {
            json_decref(defs);
            loom_tool_registry_free(*out);
            *out = NULL;
            return r;
        }
        added += r > 0;
    }
    json_decref(defs);
    loom_info("mcp %s: %zu tools offered", loom_mcp_server_name(l->server),
              added);
    return 0;
}

/*
 * Makes the listing that is due, or waits for the one under way; one
 * attempt at most, whatever its outcome (the next use tries again, and
 * the client's backoff makes that quick while the server is down).
 * Under l->mu, which it lets go meanwhile. LOOM_ENOMEM.
 */
static int refresh_locked(lazy *l)
{
    unsigned seen = l->attempts, changes;
    loom_tool_registry *fresh = NULL;
    int rc;

    while (l->listing)
        loom__cond_wait(&l->cv, &l->mu, -1);
    if (l->attempts != seen || !due(l))
        return 0;
    l->listing = 1;
    changes = loom__mcp_lists_changed(l->server);
    pthread_mutex_unlock(&l->mu);
    rc = list_tools(l, &fresh);
    pthread_mutex_lock(&l->mu);
    l->listing = 0;
    l->attempts++;
    if (fresh) {
        if (!l->tools)
            atomic_fetch_add(&l->appeared, 1);
        loom_tool_registry_free(l->tools);
        l->tools = fresh;
        l->listed_at = changes;
    }
    loom__cond_broadcast(&l->cv);
    return rc;
}

static int lazy_add(void *arg, loom_tool_registry *reg, int wait)
{
    lazy *l = arg;
    int rc = 0;

    pthread_mutex_lock(&l->mu);
    if (wait && due(l))
        rc = refresh_locked(l);
    for (size_t i = 0; rc == 0 && i < loom_tool_registry_count(l->tools); i++) {
        rc = loom__tool_registry_share(reg, loom_tool_registry_at(l->tools, i));
        /* A name a fixed tool has: that one is offered (as when the tools
         * were listed at start, where a warning said so). */
        if (rc == LOOM_EEXISTS)
            rc = 0;
    }
    pthread_mutex_unlock(&l->mu);
    return rc;
}

static uint64_t lazy_generation(void *arg)
{
    lazy *l = arg;

    return (uint64_t)loom__mcp_lists_changed(l->server) +
           atomic_load(&l->appeared);
}

/* The background start: the first listing. */
static void *lazy_main(void *arg)
{
    lazy *l = arg;

    pthread_mutex_lock(&l->mu);
    if (refresh_locked(l) != 0)
        loom_warn("mcp %s: %s", loom_mcp_server_name(l->server),
                  loom_error_last());
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* Makes s a source of reg and starts it in the background (takes a
 * reference on s). LOOM_ENOMEM. */
static int add_lazy(loom_tool_registry *reg, loom_mcp_server *s)
{
    lazy *l = calloc(1, sizeof(*l));
    loom__tool_source src = {0};
    int rc;

    if (!l)
        return loom__error_oom();
    atomic_init(&l->appeared, 0);
    pthread_mutex_init(&l->mu, NULL);
    loom__cond_init(&l->cv);
    loom__mcp_ref(s);
    l->server = s;
    loom_mcp_tool_name(l->prefix, loom_mcp_server_name(s), "");
    src.add = lazy_add;
    src.generation = lazy_generation;
    src.free = lazy_free;
    src.arg = l;
    src.prefix = l->prefix;
    /* Without a thread it starts on first use instead. The source's
     * last registry joins it (or lazy_free does, below). */
    l->started = pthread_create(&l->thread, NULL, lazy_main, l) == 0;
    if ((rc = loom__tool_registry_add_source(reg, &src)) != 0)
        lazy_free(l);
    return rc;
}

/* ---- servers started before use ----------------------------------------- */

typedef struct {
    loom_mcp_server *server;
    json_t *tools;
    char error[512];
    pthread_t thread;
    int started;
} discovery;

static void *discover_main(void *arg)
{
    discovery *d = arg;

    if (loom_mcp_server_tools(d->server, &d->tools) != 0)
        snprintf(d->error, sizeof(d->error), "%s", loom_error_last());
    return NULL;
}

int loom_tools_add_mcp(loom_tool_registry *reg, const loom_config *cfg)
{
    return loom_tools_add_mcp_with(reg, cfg, NULL);
}

int loom_tools_add_mcp_with(loom_tool_registry *reg, const loom_config *cfg,
                            const loom_mcp_setup *setup)
{
    discovery *ds;
    int rc = 0;

    if (!cfg->mcp_servers_len)
        return 0;
    if (!(ds = calloc(cfg->mcp_servers_len, sizeof(*ds))))
        return loom__error_oom();
    for (size_t i = 0; i < cfg->mcp_servers_len; i++) {
        if (loom_mcp_server_new(&ds[i].server, &cfg->mcp_servers[i]) != 0) {
            loom_warn("mcp %s: %s", cfg->mcp_servers[i].name,
                      loom_error_last());
            continue;
        }
        if (setup && setup->credentials)
            loom_mcp_server_set_credentials(ds[i].server, setup->credentials);
        if (setup && setup->authorizer)
            loom_mcp_server_set_authorizer(ds[i].server, setup->authorizer);
        if (setup && setup->servers &&
            (rc = loom_mcp_set_add(setup->servers, ds[i].server)) != 0)
            break;
        if (setup) {
            loom_mcp_server_set_elicitation(ds[i].server, setup->elicitation);
            loom_mcp_server_set_per_user(ds[i].server, setup->per_user);
        }
        if (setup && setup->background) {
            if ((rc = add_lazy(reg, ds[i].server)) != 0)
                break;
            continue;
        }
        ds[i].started =
            pthread_create(&ds[i].thread, NULL, discover_main, &ds[i]) == 0;
        if (!ds[i].started)
            discover_main(&ds[i]);
    }
    for (size_t i = 0; i < cfg->mcp_servers_len; i++) {
        const json_t *def;
        size_t j, added = 0;

        if (ds[i].started)
            pthread_join(ds[i].thread, NULL);
        if (!ds[i].server)
            continue;
        if (setup && setup->background) {
            loom_mcp_server_free(ds[i].server);
            continue;
        }
        if (!ds[i].tools)
            loom_warn("mcp %s: not available, its tools are not offered: %s",
                      cfg->mcp_servers[i].name, ds[i].error);
        json_array_foreach(ds[i].tools, j, def)
        {
            int r;
            if (rc != 0)
                break;
            r = add_tool(reg, ds[i].server, def);
            if (r < 0)
                rc = r;
            added += r > 0;
        }
        if (ds[i].tools)
            loom_info("mcp %s: %zu tools offered", cfg->mcp_servers[i].name,
                      added);
        json_decref(ds[i].tools);
        loom_mcp_server_free(ds[i].server);
    }
    free(ds);
    return rc;
}
