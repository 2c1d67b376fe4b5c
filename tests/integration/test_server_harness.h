/*
 * Shared pieces of the server tests (test_server*.c): an in-process loom
 * server over a temporary SQLite store whose model is the fake upstream,
 * a libcurl client, and a parser for server-sent events. Functions are
 * static inline so each test file takes only what it uses.
 */
#ifndef LOOM_TEST_SERVER_HARNESS_H
#define LOOM_TEST_SERVER_HARNESS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "fake.h"
#include "testutil.h"
#include "loom/server.h"
#include "loom/store.h"
#include "loom/tools.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define SH_MAX_BODY ((size_t)64 << 20)

/* ---- test tools ---------------------------------------------------------- */

/* Sleeps `ms` (default 300), polling the cancel flag. */
static inline int sh_slow_exec(const json_t *args, const loom_tool_ctx *ctx,
                               loom_buf *out, void *payload)
{
    json_int_t ms = json_integer_value(json_object_get(args, "ms"));
    (void)payload;
    if (ms <= 0)
        ms = 300;
    for (json_int_t i = 0; i < ms / 10 && !loom_cancel_is_set(ctx->cancel);
         i++)
        usleep(10 * 1000);
    return loom_buf_printf(out, "slept %lld ms", (long long)ms);
}

static inline loom_tool_registry *sh_tools(void)
{
    loom_tool_registry *reg = NULL;
    json_t *schema = json_pack("{s:s,s:{s:{s:s}}}", "type", "object",
                               "properties", "ms", "type", "integer");
    loom_tool t;

    assert_int_equal(loom_tool_registry_new(&reg), 0);
    assert_int_equal(loom_tools_add_builtins(reg), 0);
    memset(&t, 0, sizeof(t));
    t.name = "slow";
    t.description = "Sleeps a while.";
    t.parameters = schema;
    t.execute = sh_slow_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    json_decref(schema);
    return reg;
}

/* ---- the server ---------------------------------------------------------- */

typedef struct {
    loom_fake *fake;
    loom_config *cfg;
    loom_store *store;
    loom_tool_registry *tools;
    loom_server *srv;
    char *db;
    char base[64];
    int stopped;
} sh;

/*
 * Starts the server of h (whose fake and db are set) from the config
 * text yaml, with a fresh store at h->db and sh_tools(), or with
 * own_tools the server's own registry (the config's tools and the memory
 * tools over the store).
 */
static inline void sh_start_config_tools(sh *h, const char *yaml, int own_tools)
{
    loom_server_options so = LOOM_SERVER_OPTIONS_INIT;

    if (loom_config_load_string(&h->cfg, yaml, "test.yaml") != 0)
        fail_msg("config: %s", loom_error_last());
    if (loom_store_open(&h->store, h->db) != 0)
        fail_msg("store: %s", loom_error_last());
    h->tools = own_tools ? NULL : sh_tools();
    so.config = h->cfg;
    so.store = h->store;
    so.tools = h->tools;
    if (loom_server_new(&h->srv, &so) != 0 || loom_server_start(h->srv) != 0)
        fail_msg("server: %s", loom_error_last());
    snprintf(h->base, sizeof(h->base), "http://127.0.0.1:%d",
             loom_server_port(h->srv));
}

static inline void sh_start_config(sh *h, const char *yaml)
{
    sh_start_config_tools(h, yaml, 0);
}

/*
 * Starts a fake with script (and extra fake arguments, may be NULL), then
 * a server on 127.0.0.1:0 whose `fake` provider points at it. server_yaml
 * (may be NULL) holds extra lines of the server: section, each indented
 * by two spaces ("  max_body_bytes: 1024\n"); models_yaml (may be NULL)
 * extra lines of the models: section, which has fake/m.
 */
static inline void sh_start_models(sh *h, const char *script,
                                   const char *const *fake_args,
                                   const char *server_yaml,
                                   const char *models_yaml)
{
    static int n;
    char name[64], *yaml = NULL;
    char *script_path = NULL;

    memset(h, 0, sizeof(*h));
    if (fake_args) {
        const char *args[32];
        size_t i = 0;
        snprintf(name, sizeof(name), "script-%d.json", n);
        script_path = test_tmp_path(name);
        assert_int_equal(
            test_write_file(script_path, script, strlen(script)), 0);
        args[i++] = "--script";
        args[i++] = script_path;
        for (size_t k = 0; fake_args[k] && i < 30; k++)
            args[i++] = fake_args[k];
        args[i] = NULL;
        h->fake = fake_start_argv(args);
    } else {
        h->fake = fake_start_script(script);
    }
    assert_non_null(h->fake);
    snprintf(name, sizeof(name), "server-%d.db", n++);
    h->db = test_tmp_path(name);
    unlink(h->db);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake:\n"
                         "    base_url: %s\n"
                         "    api_key: sk-test\n"
                         "    retries: {max: 0}\n"
                         "    timeouts: {first_byte_ms: 20000, "
                         "idle_ms: 20000}\n"
                         "models:\n"
                         "  fake/m: {upstream: fake-model}\n"
                         "%s"
                         "agents:\n"
                         "  a: {model: fake/m, tools: [get_time, slow]}\n"
                         "  plain: {model: fake/m, tools: [], "
                         "system_prompt: Be brief.}\n"
                         "default_agent: a\n"
                         "server:\n"
                         "  listen: 127.0.0.1:0\n"
                         "%s",
                         fake_base_url(h->fake), models_yaml ? models_yaml : "",
                         server_yaml ? server_yaml : "") > 0);
    sh_start_config(h, yaml);
    free(yaml);
    if (script_path) {
        unlink(script_path);
        free(script_path);
    }
}

static inline void sh_start(sh *h, const char *script,
                            const char *const *fake_args,
                            const char *server_yaml)
{
    sh_start_models(h, script, fake_args, server_yaml, NULL);
}

/* Stops the server (gracefully) if still running. */
static inline void sh_stop_server(sh *h)
{
    if (!h->stopped)
        loom_server_stop(h->srv);
    h->stopped = 1;
}

static inline void sh_free(sh *h)
{
    char wal[600];

    loom_server_free(h->srv);
    loom_store_free(h->store);
    loom_tool_registry_free(h->tools);
    loom_config_free(h->cfg);
    fake_stop(h->fake);
    unlink(h->db);
    snprintf(wal, sizeof(wal), "%s-wal", h->db);
    unlink(wal);
    snprintf(wal, sizeof(wal), "%s-shm", h->db);
    unlink(wal);
    free(h->db);
}

/* ---- the client ---------------------------------------------------------- */

typedef struct {
    long status;
    char *body;
    size_t len;
    char *headers; /* raw header block, lower-cased names as sent */
    size_t hlen;
    double secs;
} sh_resp;

static inline size_t sh_on_body(char *p, size_t sz, size_t n, void *ud)
{
    sh_resp *r = ud;
    size_t len = sz * n;
    char *nb;

    if (r->len + len > SH_MAX_BODY)
        return 0;
    nb = realloc(r->body, r->len + len + 1);
    if (!nb)
        return 0;
    memcpy(nb + r->len, p, len);
    r->len += len;
    nb[r->len] = '\0';
    r->body = nb;
    return len;
}

static inline size_t sh_on_header(char *p, size_t sz, size_t n, void *ud)
{
    sh_resp *r = ud;
    size_t len = sz * n;
    char *nb = realloc(r->headers, r->hlen + len + 1);

    if (!nb)
        return 0;
    memcpy(nb + r->hlen, p, len);
    r->hlen += len;
    nb[r->hlen] = '\0';
    r->headers = nb;
    return len;
}

static inline void sh_resp_free(sh_resp *r)
{
    free(r->body);
    free(r->headers);
    memset(r, 0, sizeof(*r));
}

/* A header's value (copied into dst), or NULL when absent. */
static inline const char *sh_header(const sh_resp *r, const char *name,
                                    char *dst, size_t cap)
{
    size_t nl = strlen(name);
    const char *p = r->headers;

    while (p && *p) {
        const char *eol = strstr(p, "\r\n");
        size_t ll = eol ? (size_t)(eol - p) : strlen(p);
        if (ll > nl && strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
            const char *v = p + nl + 1;
            size_t vl;
            while (*v == ' ')
                v++;
            vl = (size_t)(p + ll - v);
            if (vl >= cap)
                vl = cap - 1;
            memcpy(dst, v, vl);
            dst[vl] = '\0';
            return dst;
        }
        p = eol ? eol + 2 : NULL;
    }
    return NULL;
}

/* Sets up an easy handle for method path body; hdrs may be NULL. */
static inline CURL *sh_easy(const sh *h, const char *method, const char *path,
                            const char *body, struct curl_slist *hdrs,
                            sh_resp *r)
{
    CURL *e = curl_easy_init();
    char url[512];

    assert_non_null(e);
    snprintf(url, sizeof(url), "%s%s", h->base, path);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sh_on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, sh_on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, r);
    if (body) {
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    if (strcmp(method, "GET") && strcmp(method, "POST"))
        curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    else if (!strcmp(method, "POST") && !body)
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, "");
    if (hdrs)
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, hdrs);
    return e;
}

/* A client that goes away: a body callback (with sh_easy) that closes
 * the connection once the body holds `until`. */
typedef struct {
    sh_resp r;
    const char *until; /* abort once the body holds this */
} sh_abort_ctx;

static inline size_t sh_abort_on(char *p, size_t sz, size_t n, void *ud)
{
    sh_abort_ctx *a = ud;
    size_t len = sh_on_body(p, sz, n, &a->r);

    if (a->r.body && strstr(a->r.body, a->until))
        return 0; /* curl closes the connection */
    return len;
}

/* One request; returns the status (0 when the transfer failed). */
static inline long sh_req(const sh *h, const char *method, const char *path,
                          const char *body, struct curl_slist *hdrs,
                          sh_resp *r)
{
    CURL *e;
    CURLcode rc;
    long long t0 = test_now_ms();

    memset(r, 0, sizeof(*r));
    e = sh_easy(h, method, path, body, hdrs, r);
    rc = curl_easy_perform(e);
    if (rc == CURLE_OK)
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r->status);
    curl_easy_cleanup(e);
    r->secs = (double)(test_now_ms() - t0) / 1000.0;
    return r->status;
}

/* sh_req with "Authorization: Bearer key" (key NULL: none), one more
 * header line, extra (NULL: none), and a body sent as JSON. */
static inline long sh_req_auth(const sh *h, const char *key, const char *extra,
                               const char *method, const char *path,
                               const char *body, sh_resp *r)
{
    struct curl_slist *hdrs = NULL;
    char *auth = NULL;
    long status;

    if (key) {
        /* Any length: JWTs are longer than keys. */
        assert_true(asprintf(&auth, "Authorization: Bearer %s", key) > 0);
        hdrs = curl_slist_append(hdrs, auth);
        free(auth);
    }
    if (extra)
        hdrs = curl_slist_append(hdrs, extra);
    if (body)
        hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
    status = sh_req(h, method, path, body, hdrs, r);
    curl_slist_free_all(hdrs);
    return status;
}

/* sh_json as the caller with key and the header extra (both may be
 * NULL, as in sh_req_auth). */
static inline json_t *sh_json_auth(const sh *h, const char *key,
                                   const char *extra, const char *method,
                                   const char *path, const char *body,
                                   long want_status)
{
    sh_resp r;
    json_error_t err;
    json_t *j;

    if (sh_req_auth(h, key, extra, method, path, body, &r) != want_status)
        fail_msg("%s %s: status %ld, want %ld: %s", method, path, r.status,
                 want_status, r.body ? r.body : "");
    j = json_loads(r.body ? r.body : "", 0, &err);
    if (!j)
        fail_msg("%s %s: not JSON: %s", method, path, r.body ? r.body : "");
    sh_resp_free(&r);
    return j;
}

/* A request whose answer is JSON: returns it (new reference), checks
 * the status. */
static inline json_t *sh_json(const sh *h, const char *method, const char *path,
                              const char *body, long want_status)
{
    return sh_json_auth(h, NULL, NULL, method, path, body, want_status);
}

static inline const char *sh_str(const json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

/* Checks an OpenAI-shaped error body with the given code. */
static inline void sh_check_error(const char *body, const char *code)
{
    json_t *j = json_loads(body ? body : "", 0, NULL), *e;

    assert_non_null(j);
    e = json_object_get(j, "error");
    assert_true(json_is_object(e));
    assert_true(json_is_string(json_object_get(e, "message")));
    assert_true(json_is_string(json_object_get(e, "type")));
    assert_non_null(json_object_get(e, "param"));
    if (code)
        assert_string_equal(sh_str(e, "code"), code);
    json_decref(j);
}

/* ---- server-sent events -------------------------------------------------- */

/*
 * Parses an SSE body into an array of {"id": n|null, "event": s|null,
 * "data": <parsed JSON or string>}; *comments (may be NULL) counts comment
 * lines. Every event's data must be one line here.
 */
static inline json_t *sh_sse_parse(const char *text, int *comments)
{
    json_t *out = json_array(), *cur = NULL;
    const char *p = text ? text : "";

    if (comments)
        *comments = 0;
    while (*p) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char *line = strndup(p, len);

        if (len && line[len - 1] == '\r')
            line[--len] = '\0';
        if (len == 0) {
            if (cur)
                json_array_append_new(out, cur);
            cur = NULL;
        } else if (line[0] == ':') {
            if (comments)
                (*comments)++;
        } else {
            char *colon = strchr(line, ':');
            const char *v = colon ? colon + 1 : "";
            if (colon)
                *colon = '\0';
            if (*v == ' ')
                v++;
            if (!cur)
                cur = json_object();
            if (!strcmp(line, "id"))
                json_object_set_new(cur, "id", json_integer(atoll(v)));
            else if (!strcmp(line, "event"))
                json_object_set_new(cur, "event", json_string(v));
            else if (!strcmp(line, "data")) {
                json_t *d = json_loads(v, JSON_DECODE_ANY, NULL);
                json_object_set_new(cur, "data", d ? d : json_string(v));
            }
        }
        free(line);
        p = eol ? eol + 1 : p + len;
    }
    if (cur)
        json_array_append_new(out, cur);
    return out;
}

/* The event type of SSE event i ("" past the end). */
static inline const char *sh_ev_type(const json_t *evs, size_t i)
{
    const char *t = sh_str(json_array_get(evs, i), "event");
    return t ? t : "";
}

/* Polls GET /v1/runs/{id} until it is no longer running (timeout_ms);
 * returns the run object. */
static inline json_t *sh_wait_run(const sh *h, const char *id,
                                  long timeout_ms)
{
    char path[128];
    long long end = test_now_ms() + timeout_ms;

    snprintf(path, sizeof(path), "/v1/runs/%s", id);
    for (;;) {
        json_t *r = sh_json(h, "GET", path, NULL, 200);
        if (strcmp(sh_str(r, "status"), "running") != 0)
            return r;
        json_decref(r);
        if (test_now_ms() > end)
            fail_msg("run %s still running after %ld ms", id, timeout_ms);
        usleep(20 * 1000);
    }
}

/* The value of /metrics' line "series value" (series: a name, with its
 * labels if any), or absent when there is none. */
static inline double sh_metric(const sh *h, const char *series, double absent)
{
    sh_resp r;
    double v = absent;
    size_t n = strlen(series);

    assert_int_equal(sh_req(h, "GET", "/metrics", NULL, NULL, &r), 200);
    for (const char *p = r.body; p && *p;) {
        if (!strncmp(p, series, n) && p[n] == ' ') {
            v = strtod(p + n + 1, NULL);
            break;
        }
        p = strchr(p, '\n');
        p = p ? p + 1 : NULL;
    }
    sh_resp_free(&r);
    return v;
}

/* Waits until the server has closed every stream (its client left). */
static inline void sh_streams_closed(const sh *h)
{
    long long end = test_now_ms() + 20000;
    sh_resp r;

    for (;;) {
        assert_int_equal(sh_req(h, "GET", "/metrics", NULL, NULL, &r), 200);
        if (strstr(r.body, "\nloom_streams_active 0\n")) {
            sh_resp_free(&r);
            return;
        }
        sh_resp_free(&r);
        if (test_now_ms() > end)
            fail_msg("a stream is still open after 20 s");
        usleep(20 * 1000);
    }
}

/* The last message of a stored conversation (borrowed from conv). */
static inline json_t *sh_last_message(json_t *conv)
{
    json_t *msgs = json_object_get(conv, "messages");
    size_t n = json_array_size(msgs);

    return n ? json_array_get(msgs, n - 1) : NULL;
}

/* ---- loom serve as a child process ------------------------------------- */

typedef struct {
    pid_t pid;
    int out; /* the child's stdout */
} sh_child;

/* Starts `loom serve -c cfg`, waits for its "listening" line and fills
 * h->base. */
static inline void sh_serve(sh_child *ch, sh *h, const char *cfg)
{
    const char *bin = getenv("LOOM_BIN") ? getenv("LOOM_BIN") : LOOM_BIN;
    int p[2];
    char line[256];
    size_t len = 0;
    long long end = test_now_ms() + 60000;
    unsigned port = 0;

    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    ch->pid = fork();
    assert_true(ch->pid >= 0);
    if (ch->pid == 0) {
        /* Never outlive the test. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(p[1], STDOUT_FILENO);
        execl(bin, bin, "serve", "-c", cfg, "--log-level", "warn",
              (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    ch->out = p[0];
    while (len < sizeof(line) - 1 && !memchr(line, '\n', len)) {
        struct pollfd pf = {ch->out, POLLIN, 0};
        ssize_t n;
        if (test_now_ms() > end)
            fail_msg("loom serve did not say it was listening");
        if (poll(&pf, 1, 100) <= 0)
            continue;
        n = read(ch->out, line + len, sizeof(line) - 1 - len);
        if (n <= 0)
            fail_msg("loom serve exited before listening");
        len += (size_t)n;
        line[len] = '\0';
    }
    line[len] = '\0';
    assert_int_equal(sscanf(line, "listening 127.0.0.1:%u", &port), 1);
    snprintf(h->base, sizeof(h->base), "http://127.0.0.1:%u", port);
}

/* Waits for the child to exit (timeout_ms); its status (test_wait_pid). */
static inline int sh_reap(sh_child *ch, long timeout_ms)
{
    int st = test_wait_pid(ch->pid, timeout_ms);

    close(ch->out);
    return st;
}

/* SIGTERM: the child exits cleanly (under ASan, also without leaks);
 * then the fake stops and the config, the database and its WAL files
 * go (cfg and db are freed). */
static inline void sh_serve_end(sh_child *ch, loom_fake *fake, char *cfg,
                                char *db)
{
    char wal[600];

    kill(ch->pid, SIGTERM);
    assert_int_equal(sh_reap(ch, 30000), 0);
    fake_stop(fake);
    unlink(cfg);
    unlink(db);
    snprintf(wal, sizeof(wal), "%s-wal", db);
    unlink(wal);
    snprintf(wal, sizeof(wal), "%s-shm", db);
    unlink(wal);
    free(cfg);
    free(db);
}

#endif
