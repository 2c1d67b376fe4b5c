/*
 * loom-fake-upstream: a scriptable stand-in for the model APIs in loom's
 * tests and benchmarks (no real provider is reachable from the machines
 * that run them).
 *
 * It serves either one recorded body verbatim (--replay) or a JSON script
 * of responses consumed in order, or chosen by rules that match what a
 * request contains (--script), can record every request it
 * gets as JSON lines (--record), and can misbehave on purpose: delays,
 * slow chunks, cut connections, hung streams, in-stream errors. Scripted
 * answers come in the wire format of OpenAI Chat Completions, Anthropic
 * Messages, Google Gemini or OpenAI Responses, chosen by the script or by
 * the request path. See docs/fake-upstream.md for the command line and the
 * script format.
 *
 * The HTTP side is libmicrohttpd. By default (--epoll) a few epoll
 * threads serve every connection, so tens of thousands of slow streams
 * cost no thread each: a scripted delay, slow chunk or hang suspends its
 * connection and fake_wait.c's waiter thread resumes it when due or when
 * the client leaves. With --threads it is one thread per connection, where
 * those pauses simply block. Either way streamed bodies come from a
 * content-reader callback that returns MHD_CONTENT_READER_END_WITH_ERROR
 * to cut a connection.
 * The program does not link loomlib: the fake must not share bugs with
 * the code it tests. This file is the server; fake_script.c reads scripts
 * and renders answers.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

#include "fake_upstream.h"

#define FAKE_MAX_BODY (16u * 1024 * 1024) /* request bodies */
#define FAKE_CONN_MEMORY (256u * 1024)    /* MHD per-connection pool */
#define FAKE_SLICE_MS 50                  /* how often waits look up */
#define FAKE_STATS_PATH "/_fake/stats"
#define FAKE_FILES_PATH "/_fake/files/"
#define FAKE_BACKLOG 4096     /* listen(2) queue */
#define FAKE_EPOLL_THREADS 2u /* event mode: MHD threads */

/* Per-connection state; requests on one connection come one at a time. */
typedef struct {
    char *uri;  /* raw request target of the current request */
    char *body; /* request body so far */
    size_t len;
    size_t cap;
    bool started;   /* the handler saw this request's first call */
    bool too_large; /* the body passed FAKE_MAX_BODY */
    bool answered;  /* a response is queued */
    bool counted;   /* counts toward --max-requests when completed */
    bool numbered;  /* recorded and numbered: n and reqbody are set */
    uint64_t n;     /* the request's number */
    json_t *reqbody;         /* its parsed JSON body, or NULL */
    const fake_resp *picked; /* its script answer, once chosen */
    struct MHD_Connection *con;
    fake_wait wait; /* event mode: the pause in progress */
} fake_conn;

/* The outcome of pause_for(). */
typedef enum { PAUSE_DONE, PAUSE_GONE, PAUSE_LATER } pause_result;

static struct {
    /* configuration, fixed before the daemon starts */
    bool replay;
    char *replay_body;
    size_t replay_len;
    int replay_status;
    const char *replay_type;
    fake_script script;
    FILE *record;
    long max_requests; /* 0: no limit */
    bool epoll;        /* event mode: epoll threads, pauses by suspension */
    /* shared state */
    pthread_mutex_t lock; /* nreq, record file */
    uint64_t nreq;
    atomic_uint_fast64_t busy_us;
    atomic_int hanging; /* responses in a hang now (GET /_fake/stats) */
    atomic_long completed;
    atomic_bool stopping;
    int wake[2];
} g = {.lock = PTHREAD_MUTEX_INITIALIZER, .epoll = true, .wake = {-1, -1}};

static void usage(FILE *to)
{
    fprintf(to, "usage: loom-fake-upstream [--port N] [--port-file F]\n"
                "         (--script FILE | --replay FILE [--status N])\n"
                "         [--record FILE] [--max-requests N]"
                " [--max-seconds S] [--exit-on-eof]\n"
                "         [--epoll | --threads]\n");
}

static uint64_t now_us(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Adds the time since *t0 to the busy counter and restarts *t0. */
static void busy_lap(uint64_t *t0)
{
    uint64_t t = now_us();

    atomic_fetch_add(&g.busy_us, t - *t0);
    *t0 = t;
}

static int conn_fd(struct MHD_Connection *con)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(con, MHD_CONNECTION_INFO_CONNECTION_FD);

    return ci ? ci->connect_fd : -1;
}

/* The monotonic time ms milliseconds from now; UINT64_MAX (never) when
 * ms < 0. */
static uint64_t after_ms(long ms)
{
    return ms < 0 ? UINT64_MAX : now_us() + (uint64_t)ms * 1000u;
}

/*
 * Waits until end (CLOCK_MONOTONIC µs; UINT64_MAX: forever). Returns true
 * early when the server is stopping or the peer on fd (when fd >= 0) has
 * gone away, so a scripted pause never outlives its client or the
 * process.
 */
static bool wait_or_gone(int fd, uint64_t end)
{
    for (;;) {
        uint64_t t = now_us(), slice = (uint64_t)FAKE_SLICE_MS * 1000u;
        struct pollfd p = {.fd = fd, .events = POLLRDHUP};
        struct timespec ts;

        if (atomic_load(&g.stopping))
            return true;
        if (t >= end)
            return false;
        if (end - t < slice)
            slice = end - t;
        ts = fake_timespec_us(slice);
        if (fd < 0) {
            nanosleep(&ts, NULL);
        } else if (ppoll(&p, 1, &ts, NULL) > 0 &&
                   (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) {
            return true;
        }
    }
}

/*
 * Pauses the current request of connection c until due (CLOCK_MONOTONIC
 * µs; UINT64_MAX: until the client leaves). With a thread per connection
 * it blocks and returns PAUSE_DONE, or PAUSE_GONE when it ended early
 * (client gone, server stopping). In event mode the first call suspends the
 * connection and returns PAUSE_LATER: the caller returns (0 from a content
 * reader, MHD_YES from the access handler without an answer) and MHD calls it
 * again once the pause is over; that call returns its outcome.
 */
static pause_result pause_until(fake_conn *c, uint64_t due)
{
    int fd = conn_fd(c->con);

    if (!g.epoll)
        return wait_or_gone(fd, due) ? PAUSE_GONE : PAUSE_DONE;
    if (c->wait.state == FAKE_WAIT_DONE) {
        c->wait.state = FAKE_WAIT_IDLE;
        return c->wait.gone ? PAUSE_GONE : PAUSE_DONE;
    }
    if (c->wait.state == FAKE_WAIT_PENDING)
        return PAUSE_LATER; /* called again before the suspension held */
    fake_wait_begin(&c->wait, c->con, fd, due);
    return PAUSE_LATER;
}

/* pause_until() ms milliseconds from now (until the client leaves when
 * ms < 0). */
static pause_result pause_for(fake_conn *c, long ms)
{
    return pause_until(c, after_ms(ms));
}

static void load_replay(const char *path, long status)
{
    size_t n = strlen(path), slen;
    const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
    char *spath, *stext;
    long st;

    g.replay = true;
    g.replay_body = fake_read_file(path, &g.replay_len);
    if (!g.replay_body)
        fake_die("replay %s: %s", path, strerror(errno));
    g.replay_type = n > 4 && !strcmp(path + n - 4, ".sse") ? "text/event-stream"
                                                           : "application/json";
    g.replay_status = status > 0 ? (int)status : 200;
    if (status > 0)
        return;
    if (!dot || (slash && dot < slash))
        dot = path + n;
    slen = (size_t)(dot - path) + sizeof(".status");
    spath = malloc(slen);
    if (!spath)
        fake_die("out of memory");
    snprintf(spath, slen, "%.*s.status", (int)(dot - path), path);
    stext = fake_read_file(spath, &n);
    if (stext) {
        if (!fake_parse_long(stext, 100, 599, &st))
            fake_die("replay %s: not an HTTP status", spath);
        g.replay_status = (int)st;
    } else if (errno != ENOENT) {
        fake_die("replay %s: %s", spath, strerror(errno));
    }
    free(stext);
    free(spath);
}

/* ---- requests ---------------------------------------------------------- */

/* json_stringn, with invalid UTF-8 bytes turned into U+FFFD so the
 * record file stays valid JSON whatever a client sends. */
static json_t *text_json(const char *s, size_t len)
{
    json_t *j = json_stringn(s, len);
    char *buf, *p;
    size_t i = 0;

    if (j || !s)
        return j;
    buf = p = malloc(len * 3 + 1);
    if (!buf)
        return NULL;
    while (i < len) {
        unsigned char c = (unsigned char)s[i];
        size_t n = c < 0x80         ? 1
                   : (c >> 5) == 6  ? 2
                   : (c >> 4) == 14 ? 3
                   : (c >> 3) == 30 ? 4
                                    : 0;

        if (n && i + n <= len) {
            json_t *one = json_stringn(s + i, n);

            if (one) {
                json_decref(one);
                memcpy(p, s + i, n);
                p += n;
                i += n;
                continue;
            }
        }
        memcpy(p, "\xef\xbf\xbd", 3);
        p += 3;
        i++;
    }
    j = json_stringn(buf, (size_t)(p - buf));
    free(buf);
    return j;
}

static enum MHD_Result add_header(void *cls, enum MHD_ValueKind kind,
                                  const char *key, const char *value)
{
    json_t *hdrs = cls, *old;
    char name[256];
    size_t i;

    (void)kind;
    for (i = 0; key[i] && i + 1 < sizeof(name); i++)
        name[i] = (char)(key[i] >= 'A' && key[i] <= 'Z' ? key[i] + 32 : key[i]);
    name[i] = '\0';
    if (!value)
        value = "";
    old = json_object_get(hdrs, name);
    if (old) {
        size_t n = json_string_length(old) + strlen(value) + 3;
        char *both = malloc(n);

        if (both) {
            snprintf(both, n, "%s, %s", json_string_value(old), value);
            json_object_set_new(hdrs, name, text_json(both, strlen(both)));
            free(both);
        }
    } else {
        json_object_set_new(hdrs, name, text_json(value, strlen(value)));
    }
    return MHD_YES;
}

/*
 * Builds the record object of the current request (with "n" still 0) and
 * returns the parsed JSON body through *body (new reference, or NULL).
 */
static json_t *make_record(struct MHD_Connection *con, fake_conn *c,
                           const char *method, json_t **body)
{
    const char *uri = c->uri ? c->uri : "/";
    const char *q = strchr(uri, '?');
    size_t plen = q ? (size_t)(q - uri) : strlen(uri);
    json_t *rec, *hdrs = json_object();

    MHD_get_connection_values(con, MHD_HEADER_KIND, add_header, hdrs);
    rec = json_pack("{s:i,s:s,s:o,s:o,s:o}", "n", 0, "method", method, "path",
                    text_json(uri, plen), "query",
                    text_json(q ? q + 1 : "", q ? strlen(q + 1) : 0), "headers",
                    hdrs);
    *body = NULL;
    if (!rec)
        return NULL;
    if (c->too_large) {
        json_object_set_new(rec, "body_too_large", json_true());
        return rec;
    }
    if (c->len)
        *body = json_loadb(c->body, c->len, JSON_DECODE_ANY, NULL);
    if (*body)
        json_object_set(rec, "body", *body);
    else
        json_object_set_new(rec, "body_text",
                            text_json(c->body ? c->body : "", c->len));
    return rec;
}

/* Numbers the request, appends its record line; returns its number. */
static uint64_t record_request(json_t *rec)
{
    uint64_t n;
    char *line;

    pthread_mutex_lock(&g.lock);
    n = ++g.nreq;
    if (g.record && rec) {
        json_object_set_new(rec, "n", json_integer((json_int_t)n));
        line = json_dumps(rec, JSON_COMPACT);
        if (line) {
            fputs(line, g.record);
            fputc('\n', g.record);
            fflush(g.record);
            free(line);
        }
    }
    pthread_mutex_unlock(&g.lock);
    return n;
}

static enum MHD_Result queue(struct MHD_Connection *con, fake_conn *c,
                             int status, struct MHD_Response *resp,
                             const fake_resp *r, const char *ctype)
{
    enum MHD_Result ret;
    const char *key;
    json_t *v;
    bool has_ctype = false;

    if (!resp)
        return MHD_NO;
    if (r && r->headers) {
        json_object_foreach(r->headers, key, v)
        {
            has_ctype = has_ctype || !strcasecmp(key, "content-type");
            MHD_add_response_header(resp, key, json_string_value(v));
        }
    }
    if (!has_ctype && ctype)
        MHD_add_response_header(resp, "Content-Type", ctype);
    ret = MHD_queue_response(con, (unsigned int)status, resp);
    MHD_destroy_response(resp);
    c->answered = true;
    return ret;
}

static struct MHD_Response *buffer_response(json_t *obj)
{
    char *s = obj ? json_dumps(obj, JSON_COMPACT) : NULL;

    json_decref(obj);
    if (!s)
        return NULL;
    return MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
}

static enum MHD_Result answer_stats(struct MHD_Connection *con, fake_conn *c)
{
    json_t *o;

    pthread_mutex_lock(&g.lock);
    o = json_pack("{s:I,s:I,s:i}", "requests", (json_int_t)g.nreq, "busy_us",
                  (json_int_t)atomic_load(&g.busy_us), "hanging",
                  atomic_load(&g.hanging));
    pthread_mutex_unlock(&g.lock);
    return queue(con, c, 200, buffer_response(o), NULL, "application/json");
}

/*
 * GET /_fake/files/<name>: fixed files for the clients that fetch a URL
 * they were given (loom fetching an image for Gemini), not recorded as
 * requests. cat.png (the 8 bytes of PNG's signature, image/png),
 * page.html (text/html),
 * redirect.png (302 to cat.png), private.png (302 to 10.0.0.1); any
 * other name is a 404.
 */
static enum MHD_Result answer_file(struct MHD_Connection *con, fake_conn *c,
                                   const char *name)
{
    static const char png[] = "\x89PNG\r\n\x1a\n";
    struct MHD_Response *resp;
    const char *type = "image/png", *body = png, *to = NULL;
    size_t len = sizeof(png) - 1;
    int status = 200;

    if (!strcmp(name, "page.html"))
        type = "text/html", body = "<p>no image</p>", len = strlen(body);
    else if (!strcmp(name, "redirect.png"))
        to = "cat.png";
    else if (!strcmp(name, "private.png"))
        to = "http://10.0.0.1/cat.png";
    else if (strcmp(name, "cat.png") != 0)
        status = 404, type = "text/plain", body = "no such file",
        len = strlen(body);
    if (to)
        status = 302, type = "text/plain", body = "", len = 0;
    resp = MHD_create_response_from_buffer(len, (void *)body,
                                           MHD_RESPMEM_PERSISTENT);
    if (resp && to)
        MHD_add_response_header(resp, "Location", to);
    return queue(con, c, status, resp, NULL, type);
}

/*
 * Content reader of prepared bodies. Delays, cuts and hangs happen only
 * at chunk boundaries; MHD calls this again only after what it returned
 * was sent, so a client sees each chunk when it is produced.
 */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    fake_stream *s = cls;
    fake_conn *c = s->owner;
    uint64_t t0 = now_us();
    size_t n;

    (void)pos;
    if (s->off == 0) {
        size_t hang_at = s->hang_after < s->n ? s->hang_after : s->n;
        size_t cut_at = s->disconnect_after < s->n ? s->disconnect_after : s->n;

        if (s->hang_after != SIZE_MAX && s->cur == hang_at) {
            busy_lap(&t0);
            if (!g.epoll) {
                atomic_fetch_add(&g.hanging, 1);
                wait_or_gone(s->fd, UINT64_MAX);
                atomic_fetch_sub(&g.hanging, 1);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            if (c->wait.state != FAKE_WAIT_DONE) { /* the hang starts */
                atomic_fetch_add(&g.hanging, 1);
                c->wait.count = &g.hanging; /* the waiter takes it off */
            }
            if (pause_for(c, -1) == PAUSE_LATER)
                return 0;
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (s->disconnect_after != SIZE_MAX && s->cur == cut_at)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (s->cur == s->n)
            return MHD_CONTENT_READER_END_OF_STREAM;
        if (s->chunk_delay_ms) {
            pause_result pr;

            busy_lap(&t0);
            /* A fixed schedule: chunk k is due k + 1 delays after the
             * first call, however late the ones before went out (a busy
             * CPU, a client slow to read), so the pace is the script's
             * whoever the client is. */
            if (s->due_for != s->cur) {
                s->due = (s->due_for == SIZE_MAX ? t0 : s->due) +
                         (uint64_t)s->chunk_delay_ms * 1000u;
                s->due_for = s->cur;
            }
            pr = pause_until(c, s->due);
            if (pr == PAUSE_LATER)
                return 0;
            if (pr == PAUSE_GONE)
                return MHD_CONTENT_READER_END_WITH_ERROR;
            t0 = now_us();
        }
    }
    n = s->len[s->cur] - s->off;
    if (n > max)
        n = max;
    memcpy(buf, s->chunk[s->cur] + s->off, n);
    s->off += n;
    if (s->off == s->len[s->cur]) {
        s->cur++;
        s->off = 0;
    }
    busy_lap(&t0);
    return (ssize_t)n;
}

/* True when the query string has the parameter alt=sse. */
static bool query_alt_sse(const char *q)
{
    const char *p;

    for (p = q; p && *p; p = strchr(p, '&') ? strchr(p, '&') + 1 : NULL)
        if (!strncmp(p, "alt=sse", 7) && (p[7] == '&' || !p[7]))
            return true;
    return false;
}

/* The generated-answer context of request n: format, id, streaming. */
static void gen_init(fake_gen *gn, const fake_resp *r, fake_format fmt,
                     uint64_t n)
{
    static const char *const prefix[] = {
        [FAKE_FMT_CHAT] = "chatcmpl-fake-",
        [FAKE_FMT_ANTHROPIC] = "msg_fake_",
        [FAKE_FMT_GEMINI] = "fake-response-",
        [FAKE_FMT_RESPONSES] = "resp_fake_",
    };

    memset(gn, 0, sizeof(*gn));
    gn->r = r;
    gn->fmt = fmt;
    gn->n = n;
    snprintf(gn->idbuf, sizeof(gn->idbuf), "%s%" PRIu64, prefix[fmt], n);
    gn->id = r && r->id ? r->id : gn->idbuf;
}

/* The error body of a failure the fake itself reports, in fmt's shape. */
static struct MHD_Response *fake_failure(fake_format fmt, int status,
                                         const char *msg, const char *type)
{
    struct MHD_Response *resp;
    json_t *e;

    if (fmt == FAKE_FMT_CHAT || fmt == FAKE_FMT_RESPONSES)
        return buffer_response(fake_error_body(msg, type));
    e = json_pack("{s:s,s:s}", "message", msg, "type", type);
    if (!e)
        return NULL;
    resp = buffer_response(fake_render_error(fmt, status, e));
    json_decref(e);
    return resp;
}

/* Answers request n from the script; *t0 is its busy-time stopwatch. */
static enum MHD_Result answer_script(struct MHD_Connection *con, fake_conn *c,
                                     uint64_t n, json_t *reqbody, uint64_t *t0)
{
    const fake_resp *r;
    struct MHD_Response *resp;
    fake_stream *s;
    fake_gen gn;
    const char *ctype = "application/json";
    const char *uri = c->uri ? c->uri : "/";
    const char *q = strchr(uri, '?');
    char *path = strndup(uri, q ? (size_t)(q - uri) : strlen(uri));
    fake_format fmt;
    bool stream, chunky;
    int status;
    int rc = 0;
    char msg[128];

    if (!path)
        return MHD_NO;
    fmt = fake_format_of_path(path);
    free(path);
    if (!c->picked)
        c->picked = fake_script_pick(&g.script, reqbody, n, msg, sizeof(msg));
    r = c->picked;
    if (!r) {
        if (g.script.format != FAKE_FMT_AUTO)
            fmt = g.script.format;
        return queue(con, c, 500,
                     fake_failure(fmt, 500, msg, "fake_script_exhausted"), NULL,
                     ctype);
    }
    if (r->format != FAKE_FMT_AUTO) /* the script's default is in it */
        fmt = r->format;
    if (fmt == FAKE_FMT_GEMINI) {
        /* Gemini says it by the method: streamGenerateContent. */
        stream = strstr(uri, ":streamGenerateContent") &&
                 (!q || strstr(uri, ":streamGenerateContent") < q);
    } else {
        stream = json_is_true(json_object_get(reqbody, "stream"));
    }
    if (r->delay_ms) {
        busy_lap(t0);
        if (pause_for(c, r->delay_ms) == PAUSE_LATER)
            return MHD_YES; /* answered when MHD calls again */
        *t0 = now_us();
    }
    status = r->status ? r->status : r->error ? 500 : 200;
    chunky = r->chunk_delay_ms || r->disconnect_after >= 0 || r->hang;
    gen_init(&gn, r, fmt, n);
    gn.sse = query_alt_sse(q ? q + 1 : NULL);
    gn.usage_chunk =
        fmt == FAKE_FMT_CHAT && r->usage &&
        json_is_true(json_object_get(json_object_get(reqbody, "stream_options"),
                                     "include_usage"));
    /* Formats that carry arguments as objects cannot send broken ones. */
    if (!r->error && !r->has_body && r->ncalls &&
        (fmt == FAKE_FMT_GEMINI || (fmt == FAKE_FMT_ANTHROPIC && !stream)) &&
        !fake_args_ok(r))
        return queue(con, c, 500,
                     fake_failure(fmt, 500,
                                  "fake upstream: tool call arguments are not "
                                  "a JSON object",
                                  "fake_bad_arguments"),
                     NULL, ctype);

    /* Loading gave every body a content type. */
    if (r->content_type)
        ctype = r->content_type;
    else if (!r->error && !r->has_body && stream &&
             (fmt != FAKE_FMT_GEMINI || gn.sse))
        ctype = "text/event-stream";
    if (!chunky && !(stream && !r->error && !r->has_body)) {
        if (r->has_body)
            resp = MHD_create_response_from_buffer(r->body_len, r->body,
                                                   MHD_RESPMEM_PERSISTENT);
        else if (r->error)
            resp = buffer_response(fake_render_error(fmt, status, r->error));
        else
            resp = buffer_response(fake_render_message(&gn));
        return queue(con, c, status, resp, r, ctype);
    }

    s = calloc(1, sizeof(*s));
    if (!s)
        return MHD_NO;
    if (r->has_body) {
        rc = fake_stream_split(s, r->body, r->body_len);
    } else if (r->error || !stream) {
        json_t *o = r->error ? fake_render_error(fmt, status, r->error)
                             : fake_render_message(&gn);
        char *js = o ? json_dumps(o, JSON_COMPACT) : NULL;

        json_decref(o);
        rc = fake_stream_take(s, js, js ? strlen(js) : 0);
    } else {
        rc = fake_render_stream(s, &gn);
    }
    if (rc) {
        fake_stream_free(s);
        return MHD_NO;
    }
    s->fd = conn_fd(con);
    s->owner = c;
    s->chunk_delay_ms = r->chunk_delay_ms;
    s->due_for = SIZE_MAX;
    s->disconnect_after =
        r->disconnect_after < 0 ? SIZE_MAX : (size_t)r->disconnect_after;
    s->hang_after = r->hang ? (size_t)r->hang_after : SIZE_MAX;
    resp = MHD_create_response_from_callback(
        MHD_SIZE_UNKNOWN, 64 * 1024, stream_reader, s, fake_stream_free);
    if (!resp)
        fake_stream_free(s);
    return queue(con, c, status, resp, r, ctype);
}

/*
 * The access handler. MHD calls it once when the headers are in, once per
 * piece of body, and once more at the end of the body; the answer goes out
 * on that last call (or on the first, for a declared oversized body).
 */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *con,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls)
{
    fake_conn *c = *con_cls;
    enum MHD_Result ret;
    json_t *rec;
    uint64_t t0;

    (void)cls;
    (void)version;
    if (!c)
        return MHD_NO;
    c->con = con;
    if (c->answered) {
        *upload_size = 0;
        return MHD_YES;
    }
    if (!c->started) {
        const char *cl = MHD_lookup_connection_value(
            con, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);

        c->started = true;
        if (!cl || strtoull(cl, NULL, 10) <= FAKE_MAX_BODY)
            return MHD_YES;
        c->too_large = true;
    } else if (*upload_size) {
        size_t add = *upload_size;

        *upload_size = 0;
        if (c->too_large || add > FAKE_MAX_BODY - c->len) {
            c->too_large = true;
            return MHD_YES;
        }
        if (c->len + add + 1 > c->cap) {
            size_t cap = c->cap ? c->cap : 4096;
            char *p;

            while (cap < c->len + add + 1)
                cap *= 2;
            p = realloc(c->body, cap);
            if (!p)
                return MHD_NO;
            c->body = p;
            c->cap = cap;
        }
        memcpy(c->body + c->len, upload, add);
        c->len += add;
        c->body[c->len] = '\0';
        return MHD_YES;
    }

    t0 = now_us();
    if (!strcmp(method, "GET") && !strcmp(url, FAKE_STATS_PATH))
        return answer_stats(con, c);
    if (!strcmp(method, "GET") &&
        !strncmp(url, FAKE_FILES_PATH, strlen(FAKE_FILES_PATH)))
        return answer_file(con, c, url + strlen(FAKE_FILES_PATH));
    if (!c->numbered) { /* else called again after a pause */
        rec = make_record(con, c, method, &c->reqbody);
        c->n = record_request(rec);
        json_decref(rec);
        c->counted = c->numbered = true;
        if (c->too_large && !g.replay) { /* it still uses up a plain slot */
            char why[128];

            (void)fake_script_pick(&g.script, NULL, c->n, why, sizeof(why));
        }
    }
    if (c->too_large)
        ret = queue(con, c, 413,
                    buffer_response(fake_error_body(
                        "fake upstream: request body over 16 MiB",
                        "invalid_request_error")),
                    NULL, "application/json");
    else if (g.replay)
        ret = queue(con, c, g.replay_status,
                    MHD_create_response_from_buffer(g.replay_len, g.replay_body,
                                                    MHD_RESPMEM_PERSISTENT),
                    NULL, g.replay_type);
    else
        ret = answer_script(con, c, c->n, c->reqbody, &t0);
    busy_lap(&t0);
    return ret;
}

/* Each request starts here: remember its raw target, reset the state. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *con)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(con, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    fake_conn *c = ci ? ci->socket_context : NULL;

    (void)cls;
    if (!c)
        return NULL;
    free(c->uri);
    c->uri = strdup(uri ? uri : "/");
    if (c->cap > 1024 * 1024) {
        free(c->body);
        c->body = NULL;
        c->cap = 0;
    }
    c->len = 0;
    c->started = c->too_large = c->answered = c->counted = false;
    c->numbered = false;
    c->picked = NULL;
    json_decref(c->reqbody);
    c->reqbody = NULL;
    return c;
}

static void on_conn(void *cls, struct MHD_Connection *con, void **socket_ctx,
                    enum MHD_ConnectionNotificationCode code)
{
    fake_conn *c = *socket_ctx;

    (void)cls;
    (void)con;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        *socket_ctx = calloc(1, sizeof(fake_conn));
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && c) {
        free(c->uri);
        free(c->body);
        json_decref(c->reqbody);
        free(c);
        *socket_ctx = NULL;
    }
}

static void on_done(void *cls, struct MHD_Connection *con, void **con_cls,
                    enum MHD_RequestTerminationCode toe)
{
    fake_conn *c = *con_cls;

    (void)cls;
    (void)con;
    (void)toe;
    if (!c || !c->counted)
        return;
    c->counted = false;
    if (g.max_requests &&
        atomic_fetch_add(&g.completed, 1) + 1 >= g.max_requests) {
        ssize_t w = write(g.wake[1], "x", 1);
        (void)w;
    }
}

static void write_port_file(const char *path, unsigned port)
{
    size_t n = strlen(path) + 8;
    char *tmp = malloc(n);
    FILE *f;

    if (!tmp)
        fake_die("out of memory");
    snprintf(tmp, n, "%s.tmp", path);
    f = fopen(tmp, "w");
    if (!f || fprintf(f, "%u\n", port) < 0 || fclose(f) != 0 ||
        rename(tmp, path) != 0)
        fake_die("port file %s: %s", path, strerror(errno));
    free(tmp);
}

/*
 * Raises the soft limit on open files to the hard one, so thousands of
 * concurrent streams fit, and returns the connection limit for MHD: what
 * the limit leaves after a margin for the listening socket, the record
 * file, epoll and the like.
 */
static unsigned raise_nofile(void)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 1000;
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            getrlimit(RLIMIT_NOFILE, &rl);
    }
    if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > 1000000)
        return 1000000;
    return rl.rlim_cur > 64 ? (unsigned)rl.rlim_cur - 32 : 32;
}

static const char *need_value(int argc, char **argv, int *i)
{
    if (*i + 1 >= argc)
        fake_die("%s needs a value", argv[*i]);
    return argv[++*i];
}

int main(int argc, char **argv)
{
    const char *script = NULL, *replay = NULL, *record = NULL;
    const char *port_file = NULL;
    long port = 0, status = 0, max_seconds = 300;
    struct sockaddr_in sin;
    struct MHD_Daemon *d;
    const union MHD_DaemonInfo *di;
    sigset_t set;
    uint64_t deadline;
    unsigned bound, conn_limit;
    int i, sfd, exit_on_eof = 0;

    for (i = 1; i < argc; i++) {
        const char *a = argv[i];

        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--port")) {
            if (!fake_parse_long(need_value(argc, argv, &i), 0, 65535, &port))
                fake_die("--port must be 0..65535");
        } else if (!strcmp(a, "--port-file")) {
            port_file = need_value(argc, argv, &i);
        } else if (!strcmp(a, "--script")) {
            script = need_value(argc, argv, &i);
        } else if (!strcmp(a, "--replay")) {
            replay = need_value(argc, argv, &i);
        } else if (!strcmp(a, "--status")) {
            if (!fake_parse_long(need_value(argc, argv, &i), 100, 599, &status))
                fake_die("--status must be 100..599");
        } else if (!strcmp(a, "--record")) {
            record = need_value(argc, argv, &i);
        } else if (!strcmp(a, "--max-requests")) {
            if (!fake_parse_long(need_value(argc, argv, &i), 1, LONG_MAX,
                                 &g.max_requests))
                fake_die("--max-requests must be a positive integer");
        } else if (!strcmp(a, "--exit-on-eof")) {
            exit_on_eof = 1;
        } else if (!strcmp(a, "--epoll")) {
            g.epoll = true;
        } else if (!strcmp(a, "--threads")) {
            g.epoll = false;
        } else if (!strcmp(a, "--max-seconds")) {
            if (!fake_parse_long(need_value(argc, argv, &i), 1, 31536000,
                                 &max_seconds))
                fake_die("--max-seconds must be 1..31536000");
        } else {
            usage(stderr);
            fake_die("unknown argument %s", a);
        }
    }
    if (!script == !replay) {
        usage(stderr);
        fake_die("give exactly one of --script and --replay");
    }
    if (status && !replay)
        fake_die("--status goes with --replay");

    if (script)
        fake_script_load(&g.script, script);
    else
        load_replay(replay, status);
    if (record) {
        g.record = fopen(record, "a");
        if (!g.record)
            fake_die("record file %s: %s", record, strerror(errno));
    }

    /* Signals are read from a signalfd; every thread inherits the mask. */
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    sfd = signalfd(-1, &set, SFD_CLOEXEC);
    if (sfd < 0 || pipe2(g.wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        fprintf(stderr, "loom-fake-upstream: %s\n", strerror(errno));
        return 1;
    }

    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_port = htons((uint16_t)port);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    conn_limit = raise_nofile();
    if (g.epoll)
        fake_waiter_start();
    d = MHD_start_daemon(
        (g.epoll ? MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME
                 : MHD_USE_THREAD_PER_CONNECTION |
                       MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO),
        0, NULL, NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR, &sin,
        MHD_OPTION_NOTIFY_CONNECTION, on_conn, NULL,
        MHD_OPTION_URI_LOG_CALLBACK, on_uri, NULL, MHD_OPTION_NOTIFY_COMPLETED,
        on_done, NULL, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)FAKE_CONN_MEMORY, MHD_OPTION_CONNECTION_LIMIT, conn_limit,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)FAKE_BACKLOG,
        MHD_OPTION_THREAD_POOL_SIZE, g.epoll ? FAKE_EPOLL_THREADS : 0u,
        MHD_OPTION_END);
    if (!d) {
        fprintf(stderr,
                "loom-fake-upstream: cannot listen on "
                "127.0.0.1:%ld\n",
                port);
        return 1;
    }
    di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    bound = di ? di->port : (unsigned)port;
    if (port_file)
        write_port_file(port_file, bound);
    printf("listening 127.0.0.1:%u\n", bound);
    fflush(stdout);

    deadline = now_us() + (uint64_t)max_seconds * 1000000u;
    for (;;) {
        /* With --exit-on-eof, standard input closing (the process that
         * started the fake ended, however it ended) stops it too. */
        struct pollfd p[3] = {{.fd = sfd, .events = POLLIN},
                              {.fd = g.wake[0], .events = POLLIN},
                              {.fd = STDIN_FILENO, .events = POLLIN}};
        uint64_t t = now_us();
        int r;

        if (t >= deadline)
            break;
        r = poll(p, exit_on_eof ? 3 : 2, (int)((deadline - t) / 1000u + 1));
        if (r > 0 || (r < 0 && errno != EINTR))
            break;
    }
    atomic_store(&g.stopping, true);
    if (g.epoll)
        fake_waiter_stop(); /* every suspended connection resumed first */
    MHD_stop_daemon(d);

    close(sfd);
    close(g.wake[0]);
    close(g.wake[1]);
    if (g.record)
        fclose(g.record);
    fake_script_free(&g.script);
    free(g.replay_body);
    return 0;
}
