/*
 * A misbehaving MCP server over HTTP for the MCP client's transport
 * tests: the Streamable HTTP transport of 2025-11-25 (sessions), or with
 * --legacy the HTTP+SSE transport of 2024-11-05.
 *
 *   loom-fake-mcp-http [--legacy | --stateless] [--expire-after N]
 *                      [--max-seconds S]
 *
 * It listens on 127.0.0.1 at a port the system picks, prints the port on
 * a line of stdout, and exits by itself after S seconds (default 60).
 * server/discover gets "method not found" (an old server), except with
 * --stateless, which speaks 2026-07-28 (no handshake, no session; its
 * discover says tools.listChanged, and subscriptions/listen opens a
 * stream whose first message acknowledges it). Its tools:
 *   echo    the arguments back as text
 *   hang    never answers (an event stream that stays open)
 *   change  adds the tool "added" and says so with
 *           notifications/tools/list_changed, sent before its answer on
 *           the answer's own event stream (the legacy stream in --legacy
 *           mode), so a client has it when the call returns; with
 *           --stateless on the subscriptions/listen stream instead
 *   unlisten  (not listed; --stateless) ends the subscriptions/listen
 *           stream with its result, as a server that shuts down does
 *   sample  (not listed; --stateless) without inputResponses, an
 *           input_required result asking for sampling/createMessage
 *           (key s1, requestState "st1"), or "no sampling capability"
 *           when the request's _meta does not declare it; with them, a
 *           text of {"s1": the client's answer, "state": requestState}
 *
 * Streamable HTTP (POST /mcp): initialize gives a session id; a request
 * with any other id gets 404. --expire-after N forgets the session after
 * N tools/call answers, so the next request gets 404. GET /mcp is the
 * listening stream; DELETE /mcp ends the session.
 *
 * Legacy (--legacy): GET /sse opens the event stream, whose first event
 * is `endpoint` naming /messages?sessionId=...; each POST there is
 * accepted (202) and its answer goes on the stream as a `message` event.
 *
 * When FAKE_MCP_LOG names a file, it appends a line for what a test
 * checks: "initialize", "expired", "call <id>" (a hang call arrived),
 * "cancelled <id>" (a
 * notifications/cancelled), "closed <id>" (the stream of call <id> was
 * closed by the client), "deleted", "auth <method> <Authorization>" (a
 * tools/list or tools/call, "-" without the header), "listen <id>" (a
 * subscriptions/listen stream opened), "unlisten <id>" (it ended or the
 * client closed it).
 */
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <time.h>
#include <unistd.h>

#define MAX_BODY (1u << 20)
#define SLICE_MS 50
#define QUEUE_MAX 256

static int legacy;
static int stateless;
static long expire_after = -1;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static char session[32];       /* the live session, "" when none */
static unsigned sessions;      /* how many were made */
static long calls;             /* tools/call answers in this session */
static int changed;            /* "change" was called */
static char *queue[QUEUE_MAX]; /* events for the open stream */
static size_t queued;
static long long listen_id = -1; /* the last subscriptions/listen's id */
/* A queued event that starts with this ends its stream once sent. */
#define LAST_EVENT '\x01'

static atomic_int stopping;

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

/* Notes the Authorization header a request of method came with:
 * "auth <method> <value>" ("-" for none). */
static void note_auth(struct MHD_Connection *con, const char *method)
{
    const char *a =
        MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Authorization");
    char line[512];

    snprintf(line, sizeof(line), "auth %s %s", method, a ? a : "-");
    note(line, -1);
}

/* Queues an SSE event (event name, data) for the open stream; last: the
 * stream ends after it. */
static void push_event(const char *event, const char *data, int last)
{
    size_t n = strlen(event) + strlen(data) + 32;
    char *e = malloc(n);

    if (!e)
        return;
    snprintf(e, n, "%sevent: %s\ndata: %s\n\n", last ? "\x01" : "", event,
             data);
    pthread_mutex_lock(&mu);
    if (queued < QUEUE_MAX)
        queue[queued++] = e;
    else
        free(e);
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static void push(const char *event, const char *data)
{
    push_event(event, data, 0);
}

static void push_msg(json_t *msg)
{
    char *text = json_dumps(msg, JSON_COMPACT);

    if (text)
        push("message", text);
    free(text);
    json_decref(msg);
}

/* The `_meta` that tags a message of subscription id. */
static json_t *subscription_meta(long long id)
{
    return json_pack("{s:I}", "io.modelcontextprotocol/subscriptionId",
                     (json_int_t)id);
}

/* --stateless: the list change goes on the subscription's stream. */
static void push_list_changed(void)
{
    long long id;

    pthread_mutex_lock(&mu);
    id = listen_id;
    pthread_mutex_unlock(&mu);
    push_msg(json_pack("{s:s,s:s,s:{s:o}}", "jsonrpc", "2.0", "method",
                       "notifications/tools/list_changed", "params", "_meta",
                       subscription_meta(id)));
}

/* --stateless: the subscription's result, which ends its stream. */
static void push_unlisten(void)
{
    json_t *m;
    char *text;
    long long id;

    pthread_mutex_lock(&mu);
    id = listen_id;
    pthread_mutex_unlock(&mu);
    m = json_pack("{s:s,s:I,s:{s:s,s:o}}", "jsonrpc", "2.0", "id",
                  (json_int_t)id, "result", "resultType", "complete", "_meta",
                  subscription_meta(id));
    text = m ? json_dumps(m, JSON_COMPACT) : NULL;
    if (text)
        push_event("message", text, 1);
    free(text);
    json_decref(m);
}

static json_t *tool(const char *name)
{
    return json_pack("{s:s,s:s,s:{s:s}}", "name", name, "description",
                     "a test tool", "inputSchema", "type", "object");
}

static json_t *result_for(const json_t *id, json_t *result)
{
    return json_pack("{s:s,s:O,s:o}", "jsonrpc", "2.0", "id", id, "result",
                     result);
}

static json_t *text_result(const char *text)
{
    return json_pack("{s:[{s:s,s:s}]}", "content", "type", "text", "text",
                     text);
}

/* The 2026-07-28 sample tool (see the top): an MRTR round trip. */
static json_t *sample(const json_t *params)
{
    const json_t *in = json_object_get(params, "inputResponses");
    const json_t *caps =
        json_object_get(json_object_get(params, "_meta"),
                        "io.modelcontextprotocol/clientCapabilities");
    json_t *r, *got;
    char *text;

    if (!in && !json_object_get(caps, "sampling"))
        return text_result("no sampling capability");
    if (!in)
        return json_pack("{s:s,s:{s:{s:s,s:{s:[{s:s,s:{s:s,s:s}}],s:i}}},s:s}",
                         "resultType", "input_required", "inputRequests", "s1",
                         "method", "sampling/createMessage", "params",
                         "messages", "role", "user", "content", "type", "text",
                         "text", "Say hi", "maxTokens", 10, "requestState",
                         "st1");
    got = json_pack("{s:O*,s:O*}", "s1", json_object_get(in, "s1"), "state",
                    json_object_get(params, "requestState"));
    text = got ? json_dumps(got, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    r = text_result(text ? text : "?");
    free(text);
    json_decref(got);
    return r;
}

/*
 * The answer to request msg (NULL: none, or never: *hang set), and in
 * *before a notification to send ahead of it (NULL: none). Updates the
 * fake's state.
 */
static json_t *handle(const json_t *msg, int *hang, json_t **before)
{
    const char *method = json_string_value(json_object_get(msg, "method"));
    const json_t *id = json_object_get(msg, "id");
    const json_t *params = json_object_get(msg, "params");
    const char *name = json_string_value(json_object_get(params, "name"));
    json_t *tools;

    *hang = 0;
    *before = NULL;
    if (!method || !id)
        return NULL;
    if (strcmp(method, "initialize") == 0) {
        note("initialize", -1);
        return result_for(
            id, json_pack("{s:s,s:{s:{s:b}},s:{s:s,s:s}}", "protocolVersion",
                          legacy ? "2024-11-05" : "2025-11-25", "capabilities",
                          "tools", "listChanged", 1, "serverInfo", "name",
                          "fake-http", "version", "1"));
    }
    if (strcmp(method, "tools/list") == 0) {
        tools =
            json_pack("[o,o,o]", tool("echo"), tool("hang"), tool("change"));
        pthread_mutex_lock(&mu);
        if (changed)
            json_array_append_new(tools, tool("added"));
        pthread_mutex_unlock(&mu);
        return result_for(id, json_pack("{s:o}", "tools", tools));
    }
    if (strcmp(method, "tools/call") == 0 && name &&
        strcmp(name, "hang") == 0) {
        note("call", (long long)json_integer_value(id));
        *hang = 1;
        return NULL;
    }
    if (stateless && strcmp(method, "tools/call") == 0 && name &&
        strcmp(name, "sample") == 0)
        return result_for(id, sample(params));
    if (stateless && strcmp(method, "tools/call") == 0 && name &&
        strcmp(name, "unlisten") == 0) {
        push_unlisten();
        return result_for(id, text_result("unlistened"));
    }
    if (strcmp(method, "tools/call") == 0) {
        char *args = json_dumps(json_object_get(params, "arguments"),
                                JSON_COMPACT | JSON_SORT_KEYS);
        json_t *r = result_for(id, text_result(args ? args : "{}"));
        free(args);
        pthread_mutex_lock(&mu);
        calls++;
        if (name && strcmp(name, "change") == 0)
            changed = 1;
        pthread_mutex_unlock(&mu);
        if (name && strcmp(name, "change") == 0 && stateless)
            push_list_changed();
        else if (name && strcmp(name, "change") == 0)
            *before = json_pack("{s:s,s:s}", "jsonrpc", "2.0", "method",
                                "notifications/tools/list_changed");
        return r;
    }
    if (strcmp(method, "ping") == 0)
        return result_for(id, json_object());
    if (stateless && strcmp(method, "server/discover") == 0)
        return result_for(id, json_pack("{s:[s],s:{s:{s:b}},s:{s:s,s:s}}",
                                        "supportedVersions", "2026-07-28",
                                        "capabilities", "tools", "listChanged",
                                        1, "serverInfo", "name", "fake-http",
                                        "version", "1"));
    return json_pack("{s:s,s:O,s:{s:i,s:s}}", "jsonrpc", "2.0", "id", id,
                     "error", "code", -32601, "message", "Method not found");
}

/* A notification of the client: notes cancellations. */
static void on_note(const json_t *msg)
{
    const char *method = json_string_value(json_object_get(msg, "method"));

    if (method && strcmp(method, "notifications/cancelled") == 0)
        note("cancelled", (long long)json_integer_value(json_object_get(
                              json_object_get(msg, "params"), "requestId")));
}

/* ---- event streams ------------------------------------------------------ */

typedef struct {
    long long call;   /* the call it hangs for, -1: the session's stream */
    long long listen; /* the subscriptions/listen it answers, or -1 */
    char *pending;    /* an event being written */
    size_t off;
    int last; /* the stream ends once pending is written */
} stream;

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};

    nanosleep(&ts, NULL);
}

/*
 * The stream's next bytes: queued events (the session's stream only),
 * else a comment every slice, so a client that went away is noticed.
 */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    stream *st = cls;
    size_t n;

    (void)pos;
    if (atomic_load(&stopping) || (st->last && !st->pending))
        return MHD_CONTENT_READER_END_OF_STREAM;
    if (!st->pending && st->call < 0) {
        pthread_mutex_lock(&mu);
        if (queued) {
            st->pending = queue[0];
            memmove(queue, queue + 1, --queued * sizeof(*queue));
            st->off = 0;
            if (*st->pending == LAST_EVENT) {
                st->last = 1;
                st->off = 1;
            }
        }
        pthread_mutex_unlock(&mu);
    }
    if (!st->pending) {
        sleep_ms(SLICE_MS);
        n = max < 3 ? max : 3;
        memcpy(buf, ":\n\n", n);
        return (ssize_t)n;
    }
    n = strlen(st->pending + st->off);
    if (n > max)
        n = max;
    memcpy(buf, st->pending + st->off, n);
    st->off += n;
    if (!st->pending[st->off]) {
        free(st->pending);
        st->pending = NULL;
    }
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    stream *st = cls;

    if (st->call >= 0)
        note("closed", st->call);
    if (st->listen >= 0)
        note("unlisten", st->listen);
    free(st->pending);
    free(st);
}

/* An event stream for call (-1: none) or subscription listen (-1: none),
 * first written first (NULL: nothing). */
static enum MHD_Result send_stream(struct MHD_Connection *con, long long call,
                                   long long listen, const char *first)
{
    stream *st = calloc(1, sizeof(*st));
    struct MHD_Response *r;
    enum MHD_Result ret;

    if (!st)
        return MHD_NO;
    st->call = call;
    st->listen = listen;
    if (first && !(st->pending = strdup(first))) {
        free(st);
        return MHD_NO;
    }
    r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 1024, stream_read,
                                          st, stream_free);
    if (!r) {
        stream_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    pthread_mutex_lock(&mu);
    if (!legacy && session[0])
        MHD_add_response_header(r, "Mcp-Session-Id", session);
    pthread_mutex_unlock(&mu);
    ret = MHD_queue_response(con, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_text(struct MHD_Connection *con, unsigned status,
                                 const char *type, const char *body,
                                 int with_session)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
    enum MHD_Result ret;
    char sid[sizeof(session)];

    if (!r)
        return MHD_NO;
    if (type)
        MHD_add_response_header(r, "Content-Type", type);
    pthread_mutex_lock(&mu);
    snprintf(sid, sizeof(sid), "%s", session);
    pthread_mutex_unlock(&mu);
    if (with_session && sid[0])
        MHD_add_response_header(r, "Mcp-Session-Id", sid);
    ret = MHD_queue_response(con, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *con, json_t *msg)
{
    char *text = json_dumps(msg, JSON_COMPACT);
    enum MHD_Result ret;

    json_decref(msg);
    if (!text)
        return MHD_NO;
    ret = send_text(con, MHD_HTTP_OK, "application/json", text, 1);
    free(text);
    return ret;
}

/* An answer as an event stream that ends: note (a notification), then
 * msg. Takes both. */
static enum MHD_Result send_events(struct MHD_Connection *con, json_t *note_msg,
                                   json_t *msg)
{
    char *a = json_dumps(note_msg, JSON_COMPACT);
    char *b = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
    char *body = NULL;
    enum MHD_Result ret = MHD_NO;

    json_decref(note_msg);
    json_decref(msg);
    if (a && b &&
        asprintf(&body,
                 "event: message\ndata: %s\n\nevent: message\ndata: "
                 "%s\n\n",
                 a, b) >= 0)
        ret = send_text(con, MHD_HTTP_OK, "text/event-stream", body, 1);
    free(a);
    free(b);
    free(body);
    return ret;
}

/* ---- requests ------------------------------------------------------------ */

typedef struct {
    char *body;
    size_t len;
} upload;

/* Whether the request carries the live session (2025-11-25 mode). */
static int session_ok(struct MHD_Connection *con)
{
    const char *sid =
        MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Mcp-Session-Id");
    int ok;

    pthread_mutex_lock(&mu);
    ok = sid && session[0] && strcmp(sid, session) == 0;
    pthread_mutex_unlock(&mu);
    return ok;
}

/* --stateless: a subscriptions/listen request, answered by a stream that
 * stays open; its first message acknowledges the subscription (and
 * asks the client to come back 200 ms after the stream ends). */
static enum MHD_Result on_listen(struct MHD_Connection *con, json_t *msg)
{
    long long id = json_integer_value(json_object_get(msg, "id"));
    json_t *ack = json_pack(
        "{s:s,s:s,s:{s:O*,s:o}}", "jsonrpc", "2.0", "method",
        "notifications/subscriptions/acknowledged", "params", "notifications",
        json_object_get(json_object_get(msg, "params"), "notifications"),
        "_meta", subscription_meta(id));
    char *text = ack ? json_dumps(ack, JSON_COMPACT) : NULL, *first = NULL;
    enum MHD_Result ret = MHD_NO;

    json_decref(ack);
    json_decref(msg);
    pthread_mutex_lock(&mu);
    listen_id = id;
    pthread_mutex_unlock(&mu);
    note("listen", id);
    if (text &&
        asprintf(&first, "retry: 200\nevent: message\ndata: %s\n\n", text) >= 0)
        ret = send_stream(con, -1, id, first);
    free(text);
    free(first);
    return ret;
}

/* A POST of the Streamable HTTP transport. */
static enum MHD_Result on_post(struct MHD_Connection *con, json_t *msg)
{
    const char *method = json_string_value(json_object_get(msg, "method"));
    json_t *answer, *before;
    int hang;

    if (method && strcmp(method, "initialize") == 0) {
        pthread_mutex_lock(&mu);
        snprintf(session, sizeof(session), "s%u", ++sessions);
        calls = 0;
        pthread_mutex_unlock(&mu);
    } else if (!stateless && method && strcmp(method, "server/discover") != 0 &&
               !session_ok(con)) {
        json_decref(msg);
        return send_text(con, MHD_HTTP_NOT_FOUND, "text/plain",
                         "no such session", 0);
    }
    if (!json_object_get(msg, "id")) {
        on_note(msg);
        json_decref(msg);
        return send_text(con, MHD_HTTP_ACCEPTED, NULL, "", 1);
    }
    if (method &&
        (!strcmp(method, "tools/call") || !strcmp(method, "tools/list")))
        note_auth(con, method);
    if (stateless && method && strcmp(method, "subscriptions/listen") == 0)
        return on_listen(con, msg);
    answer = handle(msg, &hang, &before);
    if (before) {
        json_decref(msg);
        return send_events(con, before, answer);
    }
    if (hang) {
        long long id = json_integer_value(json_object_get(msg, "id"));
        json_decref(msg);
        return send_stream(con, id, -1, NULL);
    }
    json_decref(msg);
    pthread_mutex_lock(&mu);
    if (expire_after >= 0 && calls >= expire_after && session[0]) {
        session[0] = '\0';
        note("expired", -1);
    }
    pthread_mutex_unlock(&mu);
    return send_json(con, answer);
}

/* A POST to the legacy transport's endpoint: the answer goes on the
 * stream. */
static enum MHD_Result on_legacy_post(struct MHD_Connection *con, json_t *msg)
{
    const char *sid =
        MHD_lookup_connection_value(con, MHD_GET_ARGUMENT_KIND, "sessionId");
    json_t *answer, *before;
    int hang;

    pthread_mutex_lock(&mu);
    hang = !sid || strcmp(sid, session) != 0;
    pthread_mutex_unlock(&mu);
    if (hang) {
        json_decref(msg);
        return send_text(con, MHD_HTTP_NOT_FOUND, "text/plain",
                         "no such session", 0);
    }
    if (!json_object_get(msg, "id"))
        on_note(msg);
    else if ((answer = handle(msg, &hang, &before)) != NULL) {
        if (before)
            push_msg(before);
        push_msg(answer);
    }
    json_decref(msg);
    return send_text(con, MHD_HTTP_ACCEPTED, "text/plain", "Accepted", 0);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *con,
                                  const char *url, const char *method,
                                  const char *version, const char *data,
                                  size_t *size, void **ptr)
{
    upload *u = *ptr;
    json_t *msg;

    (void)cls;
    (void)version;
    if (strcmp(method, "POST") == 0) {
        if (!u) {
            if (!(u = calloc(1, sizeof(*u))))
                return MHD_NO;
            *ptr = u;
            return MHD_YES;
        }
        if (*size) {
            char *b;
            if (u->len + *size > MAX_BODY ||
                !(b = realloc(u->body, u->len + *size + 1)))
                return MHD_NO;
            memcpy(b + u->len, data, *size);
            u->body = b;
            u->len += *size;
            *size = 0;
            return MHD_YES;
        }
        msg = json_loadb(u->body ? u->body : "", u->len, 0, NULL);
        if (!msg)
            return send_text(con, MHD_HTTP_BAD_REQUEST, "text/plain",
                             "not JSON", 0);
        if (legacy)
            return strcmp(url, "/messages") == 0
                       ? on_legacy_post(con, msg)
                       : (json_decref(msg),
                          send_text(con, MHD_HTTP_NOT_FOUND, "text/plain",
                                    "not here", 0));
        return on_post(con, msg);
    }
    if (strcmp(method, "GET") == 0 && legacy && strcmp(url, "/sse") == 0) {
        char first[128];
        pthread_mutex_lock(&mu);
        snprintf(session, sizeof(session), "L%u", ++sessions);
        snprintf(first, sizeof(first),
                 "event: endpoint\ndata: /messages?sessionId=%s\n\n", session);
        pthread_mutex_unlock(&mu);
        return send_stream(con, -1, -1, first);
    }
    if (strcmp(method, "GET") == 0 && !legacy && strcmp(url, "/mcp") == 0)
        return session_ok(con) ? send_stream(con, -1, -1, NULL)
                               : send_text(con, MHD_HTTP_NOT_FOUND,
                                           "text/plain", "no such session", 0);
    if (strcmp(method, "DELETE") == 0 && !legacy) {
        note("deleted", -1);
        return send_text(con, MHD_HTTP_OK, "text/plain", "", 0);
    }
    return send_text(con, MHD_HTTP_NOT_FOUND, "text/plain", "not here", 0);
}

static void on_done(void *cls, struct MHD_Connection *con, void **ptr,
                    enum MHD_RequestTerminationCode why)
{
    upload *u = *ptr;

    (void)cls;
    (void)con;
    (void)why;
    if (u) {
        free(u->body);
        free(u);
    }
    *ptr = NULL;
}

int main(int argc, char **argv)
{
    struct sockaddr_in sin;
    struct MHD_Daemon *d;
    const union MHD_DaemonInfo *di;
    long seconds = 60;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--legacy") == 0)
            legacy = 1;
        else if (strcmp(argv[i], "--stateless") == 0)
            stateless = 1;
        else if (strcmp(argv[i], "--expire-after") == 0 && i + 1 < argc)
            expire_after = atol(argv[++i]);
        else if (strcmp(argv[i], "--max-seconds") == 0 && i + 1 < argc)
            seconds = atol(argv[++i]);
    }
    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD, 0,
        NULL, NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR, &sin,
        MHD_OPTION_NOTIFY_COMPLETED, on_done, NULL, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "loom-fake-mcp-http: cannot listen\n");
        return 1;
    }
    di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    printf("%u\n", di ? di->port : 0);
    fflush(stdout);
    /* Standard input closing (the test ended) stops it too. */
    for (long t = 0; t < seconds * 1000 / SLICE_MS; t++) {
        struct timeval tv = {0, SLICE_MS * 1000};
        fd_set r;
        FD_ZERO(&r);
        FD_SET(0, &r);
        if (select(1, &r, NULL, NULL, &tv) > 0) {
            char c;
            if (read(0, &c, 1) <= 0)
                break;
        }
    }
    atomic_store(&stopping, 1);
    MHD_stop_daemon(d);
    return 0;
}
