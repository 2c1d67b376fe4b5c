/*
 * A hostile MCP server for tests, speaking stdio: one JSON-RPC message a
 * line. It behaves well enough to be used and badly where a test asks:
 *
 *   loom-fake-mcp [MODE]
 *
 * MODE picks tools/list's paging: "pages" (three pages, cursors that
 * advance), "stuck" (the same cursor again and again), "cycle" (a cursor
 * that comes back), "results" (one page of the tools that check results
 * against their outputSchema, below), "form" (elicit alone), "sample"
 * (sample alone), "stateless" (below), anything
 * else one page. It always writes a line that is not JSON to stdout
 * first, and a line to stderr. Its tools:
 *   echo        the arguments back as text
 *   hang        never answers
 *   die         exits at once, mid-call
 *   fail        a result with isError
 *   structured  structuredContent and no content
 *   image       an image and a resource link
 *   resource    an embedded text resource
 * and, listed in "results" mode with an outputSchema ({answer: integer}):
 *   typed       structuredContent that fits it
 *   mistyped    structuredContent that does not
 *   untyped     text only, no structuredContent
 * and, listed in "form" mode:
 *   elicit      asks the client to fill in a form
 *               (elicitation/create: name, a required string; age, an
 *               integer defaulting to 30; or, when the argument x is
 *               given, the params it holds as JSON text: {message,
 *               requestedSchema}) and answers with the client's answer
 *               as JSON, or "no elicitation capability" when the client
 *               declared none
 *   roots       (not listed) asks the client for roots/list and answers
 *               with its answer as JSON, or "no roots capability"
 * and, listed in "sample" mode:
 *   sample      asks the client to sample (sampling/createMessage: a
 *               system prompt "You are sampled.", the user message x,
 *               maxTokens max_tokens (default 100), stop sequence "END")
 *               and answers with the client's answer (or error) as JSON,
 *               or "no sampling capability" when the client declared none
 *               (unless force is true: it asks all the same)
 * In "stateless" mode it speaks 2026-07-28: server/discover says
 * tools.listChanged, and subscriptions/listen is acknowledged and kept
 * open (the last one only), its notifications tagged with its id in
 * `_meta` (io.modelcontextprotocol/subscriptionId). Its tools there:
 *   echo, hang, die  as above
 *   change      adds the tool "added" and says so with
 *               notifications/tools/list_changed on the subscription
 *               only (nothing when none is open), before its answer
 *   unlisten    ends the subscription with its result, as a server that
 *               shuts down does
 *   stray       notifications/tools/list_changed tagged with a
 *               subscription that is not open
 * When FAKE_MCP_LOG names a file, it appends "start" when it starts,
 * "cancelled <id>" for each notifications/cancelled and "listen <id>"
 * for each subscriptions/listen, so a test can check what loom sent.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *mode = "";
/* "stateless" mode: the open subscription's id (-1: none), and whether
 * "change" was called. */
static long long listen_id = -1;
static int changed;
/* The capabilities the client declared in initialize. */
static json_t *client_caps;

/* Appends "what" (and " id" when id >= 0) to $FAKE_MCP_LOG. */
static void note(const char *what, long long id)
{
    const char *path = getenv("FAKE_MCP_LOG");
    FILE *f = path ? fopen(path, "a") : NULL;

    if (!f)
        return;
    if (id >= 0)
        fprintf(f, "%s %lld\n", what, id);
    else
        fprintf(f, "%s\n", what);
    fclose(f);
}

static void send_msg(json_t *msg)
{
    char *text = json_dumps(msg, JSON_COMPACT);

    if (text) {
        fputs(text, stdout);
        fputc('\n', stdout);
        fflush(stdout);
    }
    free(text);
    json_decref(msg);
}

static void answer(const json_t *id, json_t *result)
{
    send_msg(json_pack("{s:s,s:O,s:o}", "jsonrpc", "2.0", "id", id, "result",
                       result));
}

static json_t *tool(const char *name)
{
    return json_pack("{s:s,s:s,s:{s:s,s:{s:{s:s}}}}", "name", name,
                     "description", "a test tool", "inputSchema", "type",
                     "object", "properties", "x", "type", "string");
}

/* A tool whose outputSchema asks for {answer: integer}. */
static json_t *typed_tool(const char *name)
{
    json_t *t = tool(name);

    json_object_set_new(t, "outputSchema",
                        json_pack("{s:s,s:{s:{s:s}},s:[s]}", "type", "object",
                                  "properties", "answer", "type", "integer",
                                  "required", "answer"));
    return t;
}

static json_t *list_page(const char *cursor)
{
    const char *next = NULL;
    json_t *page, *tools = json_array();

    if (strcmp(mode, "pages") == 0) {
        json_array_append_new(tools,
                              tool(!cursor                     ? "one"
                                   : strcmp(cursor, "p2") == 0 ? "two"
                                                               : "three"));
        next = !cursor ? "p2" : strcmp(cursor, "p2") == 0 ? "p3" : NULL;
    } else if (strcmp(mode, "stuck") == 0) {
        json_array_append_new(tools, tool(cursor ? "again" : "first"));
        next = "same";
    } else if (strcmp(mode, "cycle") == 0) {
        json_array_append_new(tools, tool(cursor ? cursor : "start"));
        next = !cursor || strcmp(cursor, "y") == 0 ? "x" : "y";
    } else if (strcmp(mode, "results") == 0) {
        const char *names[] = {"typed", "mistyped", "untyped"};
        for (size_t i = 0; i < sizeof(names) / sizeof(*names); i++)
            json_array_append_new(tools, typed_tool(names[i]));
        json_array_append_new(tools, tool("resource"));
    } else if (strcmp(mode, "form") == 0) {
        json_array_append_new(tools, tool("elicit"));
    } else if (strcmp(mode, "sample") == 0) {
        json_array_append_new(tools, tool("sample"));
    } else if (strcmp(mode, "stateless") == 0) {
        const char *names[] = {"echo",     "hang",  "die",  "change",
                               "unlisten", "stray", "added"};
        for (size_t i = 0; i < sizeof(names) / sizeof(*names) - !changed; i++)
            json_array_append_new(tools, tool(names[i]));
    } else {
        const char *names[] = {"echo",
                               "hang",
                               "die",
                               "fail",
                               "structured",
                               "image",
                               "a.tool with spaces"};
        for (size_t i = 0; i < sizeof(names) / sizeof(*names); i++)
            json_array_append_new(tools, tool(names[i]));
    }
    page = json_pack("{s:o}", "tools", tools);
    if (next)
        json_object_set_new(page, "nextCursor", json_string(next));
    return page;
}

static json_t *text_result(const char *text, int error)
{
    return json_pack("{s:[{s:s,s:s}],s:b}", "content", "type", "text", "text",
                     text, "isError", error);
}

/* Reads stdin until the answer to the request id comes, which it gives
 * (NULL at the end of input); other messages are dropped. */
static json_t *await_answer(const char *id)
{
    char line[1 << 16];

    while (fgets(line, sizeof(line), stdin)) {
        json_t *msg = json_loads(line, 0, NULL);
        const char *got = json_string_value(json_object_get(msg, "id"));
        if (got && strcmp(got, id) == 0 && !json_object_get(msg, "method"))
            return msg;
        json_decref(msg);
    }
    return NULL;
}

/* Asks the client method (id rid, params) when it declared cap (or
 * cap is NULL), and answers the call id with the client's answer as
 * JSON. */
static void ask_client(const json_t *id, const char *cap, const char *rid,
                       const char *method, json_t *params)
{
    json_t *ans;
    char *text, none[64];

    if (cap && !json_object_get(client_caps, cap)) {
        snprintf(none, sizeof(none), "no %s capability", cap);
        answer(id, text_result(none, 0));
        json_decref(params);
        return;
    }
    send_msg(json_pack("{s:s,s:s,s:s,s:o}", "jsonrpc", "2.0", "id", rid,
                       "method", method, "params", params));
    ans = await_answer(rid);
    text = json_dumps(json_object_get(ans, "error")
                          ? json_object_get(ans, "error")
                          : json_object_get(ans, "result"),
                      JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    answer(id, text_result(text ? text : "no answer", 0));
    free(text);
    json_decref(ans);
}

/* The `_meta` that tags a message of subscription id. */
static json_t *subscription_meta(long long id)
{
    return json_pack("{s:I}", "io.modelcontextprotocol/subscriptionId",
                     (json_int_t)id);
}

/* "stateless": the tool list changed, told on subscription id (none
 * when id < 0). */
static void list_changed(long long id)
{
    if (id >= 0)
        send_msg(json_pack("{s:s,s:s,s:{s:o}}", "jsonrpc", "2.0", "method",
                           "notifications/tools/list_changed", "params",
                           "_meta", subscription_meta(id)));
}

/* "stateless": a subscriptions/listen, acknowledged and kept open. */
static void open_subscription(const json_t *id, const json_t *params)
{
    listen_id = (long long)json_integer_value(id);
    note("listen", listen_id);
    send_msg(json_pack("{s:s,s:s,s:{s:O*,s:o}}", "jsonrpc", "2.0", "method",
                       "notifications/subscriptions/acknowledged", "params",
                       "notifications",
                       json_object_get(params, "notifications"), "_meta",
                       subscription_meta(listen_id)));
}

/* "stateless": the tools about the subscription; 1 when name was one. */
static int subscription_call(const json_t *id, const char *name)
{
    if (strcmp(name, "change") == 0) {
        changed = 1;
        list_changed(listen_id);
    } else if (strcmp(name, "unlisten") == 0 && listen_id >= 0) {
        send_msg(json_pack("{s:s,s:I,s:{s:s,s:o}}", "jsonrpc", "2.0", "id",
                           (json_int_t)listen_id, "result", "resultType",
                           "complete", "_meta", subscription_meta(listen_id)));
        listen_id = -1;
    } else if (strcmp(name, "stray") == 0) {
        list_changed(listen_id + 1000);
    } else {
        return 0;
    }
    answer(id, text_result(name, 0));
    return 1;
}

static void call(const json_t *id, const json_t *params)
{
    const char *name = json_string_value(json_object_get(params, "name"));
    char *args;

    if (!name)
        name = "";
    if (strcmp(name, "hang") == 0)
        return;
    if (strcmp(mode, "stateless") == 0 && subscription_call(id, name))
        return;
    if (strcmp(name, "elicit") == 0) {
        const char *x = json_string_value(
            json_object_get(json_object_get(params, "arguments"), "x"));
        json_t *form = x ? json_loads(x, 0, NULL) : NULL;
        if (form) {
            ask_client(id, "elicitation", "e1", "elicitation/create", form);
            return;
        }
        ask_client(id, "elicitation", "e1", "elicitation/create",
                   json_pack("{s:s,s:{s:s,s:{s:{s:s},s:{s:s,s:i}},s:[s]}}",
                             "message", "Who are you?", "requestedSchema",
                             "type", "object", "properties", "name", "type",
                             "string", "age", "type", "integer", "default", 30,
                             "required", "name"));
        return;
    }
    if (strcmp(name, "sample") == 0) {
        const json_t *a = json_object_get(params, "arguments");
        const json_t *max = json_object_get(a, "max_tokens");
        const char *x = json_string_value(json_object_get(a, "x"));
        int force = json_is_true(json_object_get(a, "force"));
        ask_client(id, force ? NULL : "sampling", "s1",
                   "sampling/createMessage",
                   json_pack("{s:[{s:s,s:{s:s,s:s}}],s:s,s:I,s:[s]}",
                             "messages", "role", "user", "content", "type",
                             "text", "text", x ? x : "Say something.",
                             "systemPrompt", "You are sampled.", "maxTokens",
                             json_is_integer(max) ? json_integer_value(max)
                                                  : (json_int_t)100,
                             "stopSequences", "END"));
        return;
    }
    if (strcmp(name, "roots") == 0) {
        ask_client(id, "roots", "r1", "roots/list", json_object());
        return;
    }
    if (strcmp(name, "die") == 0)
        exit(3);
    if (strcmp(name, "progress") == 0) {
        /* Not listed: three steps on the call's progressToken, if any. */
        const json_t *token =
            json_object_get(json_object_get(params, "_meta"), "progressToken");
        for (int i = 1; token && i <= 3; i++)
            send_msg(json_pack("{s:s,s:s,s:{s:O,s:i,s:i,s:s}}", "jsonrpc",
                               "2.0", "method", "notifications/progress",
                               "params", "progressToken", token, "progress", i,
                               "total", 3, "message",
                               i == 3 ? "last step" : ""));
        answer(id, text_result(token ? "done" : "no token", 0));
    } else if (strcmp(name, "fail") == 0) {
        answer(id, text_result("the disk is full", 1));
    } else if (strcmp(name, "structured") == 0 || strcmp(name, "typed") == 0) {
        answer(id, json_pack("{s:[],s:{s:i}}", "content", "structuredContent",
                             "answer", 42));
    } else if (strcmp(name, "mistyped") == 0) {
        answer(id, json_pack("{s:[{s:s,s:s}],s:{s:s}}", "content", "type",
                             "text", "text", "forty-two", "structuredContent",
                             "answer", "forty-two"));
    } else if (strcmp(name, "untyped") == 0) {
        answer(id, text_result("42", 0));
    } else if (strcmp(name, "resource") == 0) {
        answer(id, json_pack("{s:[{s:s,s:{s:s,s:s,s:s}}]}", "content", "type",
                             "resource", "resource", "uri", "file:///tmp/b.txt",
                             "mimeType", "text/plain", "text", "hello"));
    } else if (strcmp(name, "image") == 0) {
        answer(id, json_pack("{s:[{s:s,s:s,s:s},{s:s,s:s,s:s}]}", "content",
                             "type", "image", "mimeType", "image/png", "data",
                             "iVBORw0KGgo=", "type", "resource_link", "uri",
                             "file:///tmp/a.txt", "name", "a.txt"));
    } else {
        args = json_dumps(json_object_get(params, "arguments"),
                          JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
        answer(id, text_result(args ? args : "null", 0));
        free(args);
    }
}

int main(int argc, char **argv)
{
    char line[1 << 16];

    if (argc > 1)
        mode = argv[1];
    note("start", -1);
    fputs("this line is not JSON\n", stdout);
    fflush(stdout);
    fputs("fake mcp server starting\n", stderr);
    while (fgets(line, sizeof(line), stdin)) {
        json_error_t err;
        json_t *msg = json_loads(line, 0, &err);
        const json_t *id = json_object_get(msg, "id");
        const json_t *params = json_object_get(msg, "params");
        const char *method = json_string_value(json_object_get(msg, "method"));

        if (!method) {
            json_decref(msg);
            continue;
        }
        if (strcmp(method, "initialize") == 0) {
            json_decref(client_caps);
            client_caps = json_incref(json_object_get(params, "capabilities"));
        }
        if (strcmp(method, "initialize") == 0)
            answer(id,
                   json_pack("{s:s,s:{s:{}},s:{s:s,s:s}}", "protocolVersion",
                             "2025-11-25", "capabilities", "tools",
                             "serverInfo", "name", "fake", "version", "1"));
        else if (strcmp(method, "tools/list") == 0)
            answer(id, list_page(json_string_value(
                           json_object_get(params, "cursor"))));
        else if (strcmp(method, "tools/call") == 0)
            call(id, params);
        else if (strcmp(mode, "stateless") == 0 &&
                 strcmp(method, "server/discover") == 0)
            answer(id, json_pack("{s:[s],s:{s:{s:b}},s:{s:s,s:s}}",
                                 "supportedVersions", "2026-07-28",
                                 "capabilities", "tools", "listChanged", 1,
                                 "serverInfo", "name", "fake", "version", "1"));
        else if (strcmp(mode, "stateless") == 0 &&
                 strcmp(method, "subscriptions/listen") == 0)
            open_subscription(id, params);
        else if (strcmp(method, "notifications/cancelled") == 0)
            note("cancelled",
                 json_integer_value(json_object_get(params, "requestId")));
        else if (id)
            send_msg(json_pack("{s:s,s:O,s:{s:i,s:s}}", "jsonrpc", "2.0", "id",
                               id, "error", "code", -32601, "message",
                               "Method not found"));
        json_decref(msg);
    }
    return 0;
}
