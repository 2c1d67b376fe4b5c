/*
 * The MCP client's HTTP transports against tests/mcp/fake_mcp_http.c: a
 * session that expires (404) is started again without help, a call that
 * never answers is cancelled at its timeout (notifications/cancelled,
 * its stream closed; in the 2026-07-28 era only the stream closed) and
 * the run goes on, a cancelled run cancels its
 * call, the legacy HTTP+SSE transport (2024-11-05) lists and calls
 * tools and is told of cancellations the same way, and a server started
 * in the background whose list changes gives a run its new tools (in the
 * 2026-07-28 era told on the subscriptions/listen stream, which is opened
 * again when it ends and closed when the server is freed).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/clock.h"
#include "core/fiber.h"
#include "loom/mcp.h"
#include "loom/run.h"
#include "loom/server.h"
#include "loom/store.h"
#include "mock_provider.h"
#include "testutil.h"
#include "tools/mcp/mcp_internal.h"

#include <curl/curl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A running fake: its process, the pipe that stops it, its port. */
typedef struct {
    pid_t pid;
    int in; /* closing it ends the fake */
    int port;
    char log[256];
    char url[128];
} fake_http;

/* Starts the fake with args (NULL-ended; "--legacy", ...). */
static void fake_start(fake_http *f, const char *const *args)
{
    int in[2], out[2];
    char line[32] = {0};
    const char *argv[8] = {LOOM_FAKE_MCP_HTTP_BIN};
    size_t n = 1, got = 0;
    static int started;

    memset(f, 0, sizeof(*f));
    snprintf(f->log, sizeof(f->log), "%s/fake_mcp_http_%d_%d.log",
             test_tmp_dir(), (int)getpid(), ++started);
    unlink(f->log);
    for (size_t i = 0; args && args[i] && n < 7; i++)
        argv[n++] = args[i];
    assert_int_equal(pipe(in), 0);
    assert_int_equal(pipe(out), 0);
    f->pid = fork();
    assert_true(f->pid >= 0);
    if (f->pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        close(in[1]);
        close(out[0]);
        setenv("FAKE_MCP_LOG", f->log, 1);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(in[0]);
    close(out[1]);
    f->in = in[1];
    while (got < sizeof(line) - 1 && read(out[0], line + got, 1) == 1 &&
           line[got] != '\n')
        got++;
    close(out[0]);
    f->port = atoi(line);
    assert_true(f->port > 0);
    snprintf(f->url, sizeof(f->url), "http://127.0.0.1:%d/%s", f->port,
             args && args[0] && strcmp(args[0], "--legacy") == 0 ? "sse"
                                                                 : "mcp");
}

static void fake_stop(fake_http *f)
{
    int status;

    close(f->in);
    waitpid(f->pid, &status, 0);
    unlink(f->log);
}

/* How many lines of the fake's log start with prefix. */
static int log_count(const fake_http *f, const char *prefix)
{
    FILE *fp = fopen(f->log, "r");
    char line[256];
    int n = 0;

    if (!fp)
        return 0;
    while (fgets(line, sizeof(line), fp))
        n += strncmp(line, prefix, strlen(prefix)) == 0;
    fclose(fp);
    return n;
}

/* Waits (10 s at most) until the log has n lines starting with prefix:
 * the fake notes some things (a closed stream) only when it sees them. */
static int wait_log(const fake_http *f, const char *prefix, int n)
{
    struct timespec tick = {0, 20 * 1000000L};

    for (int i = 0; i < 500; i++) {
        if (log_count(f, prefix) >= n)
            return 1;
        nanosleep(&tick, NULL);
    }
    return 0;
}

static loom_mcp_server_config http_config(const fake_http *f)
{
    loom_mcp_server_config c = {0};

    c.name = "web";
    c.url = (char *)f->url;
    c.timeout_ms = 10000;
    c.startup_timeout_ms = 10000;
    return c;
}

/* Starts the fake with args and gives a server for it: the legacy
 * transport when args start with --legacy. */
static loom_mcp_server *fake_server(fake_http *f, const char *const *args)
{
    loom_mcp_server_config c;
    loom_mcp_server *s = NULL;

    fake_start(f, args);
    c = http_config(f);
    if (args && args[0] && strcmp(args[0], "--legacy") == 0)
        c.transport = "sse";
    assert_int_equal(loom_mcp_server_new(&s, &c), 0);
    return s;
}

static const char *const legacy[] = {"--legacy", NULL};

static char *call_text(loom_mcp_server *s, const char *tool, long timeout_ms,
                       int *rc)
{
    json_t *res = NULL, *args = json_pack("{s:s}", "x", "hi");
    loom_buf out = LOOM_BUF_INIT(1 << 16);

    *rc = loom_mcp_server_call(s, tool, args, timeout_ms, NULL, &res);
    json_decref(args);
    if (*rc == 0)
        loom_mcp_result_text(res, &out);
    json_decref(res);
    return loom_buf_detach(&out);
}

/* Calls tool, which must succeed. */
static void call_ok(loom_mcp_server *s, const char *tool)
{
    int rc;
    char *text = call_text(s, tool, 0, &rc);

    assert_int_equal(rc, 0);
    free(text);
}

/* A session that expires is started again and the call succeeds. */
static void test_session_expiry(void **state)
{
    static const char *const args[] = {"--expire-after", "1", NULL};
    fake_http f;
    loom_mcp_server *s = fake_server(&f, args);
    char *text;
    int rc;

    (void)state;
    text = call_text(s, "echo", 0, &rc);
    assert_int_equal(rc, 0);
    assert_string_equal(text, "{\"x\":\"hi\"}");
    free(text);
    assert_int_equal(log_count(&f, "expired"), 1);
    /* The session is gone: a 404, a new initialize, the same call again. */
    text = call_text(s, "echo", 0, &rc);
    assert_int_equal(rc, 0);
    assert_string_equal(text, "{\"x\":\"hi\"}");
    free(text);
    assert_int_equal(log_count(&f, "initialize"), 2);
    loom_mcp_server_free(s);
    fake_stop(&f);
}

/* A call that never answers: cancelled at its timeout, its stream
 * closed, and the server stays in use. */
static void test_timeout(void **state)
{
    fake_http f;
    loom_mcp_server *s = fake_server(&f, NULL);
    char *text;
    int rc;

    (void)state;
    text = call_text(s, "hang", 300, &rc);
    free(text);
    assert_int_equal(rc, LOOM_ETIMEDOUT);
    assert_int_equal(log_count(&f, "cancelled"), 1);
    assert_true(wait_log(&f, "closed", 1));
    text = call_text(s, "echo", 0, &rc);
    assert_int_equal(rc, 0);
    free(text);
    assert_int_equal(log_count(&f, "initialize"), 1);
    loom_mcp_server_free(s);
    assert_true(wait_log(&f, "deleted", 1));
    fake_stop(&f);
}

/* In the 2026-07-28 era a call past its timeout closes its stream, which
 * is how the server is told (no notifications/cancelled). */
static void test_stateless_timeout(void **state)
{
    static const char *const args[] = {"--stateless", NULL};
    fake_http f;
    loom_mcp_server *s = fake_server(&f, args);
    json_t *st;
    char *text;
    int rc;

    (void)state;
    text = call_text(s, "hang", 300, &rc);
    free(text);
    assert_int_equal(rc, LOOM_ETIMEDOUT);
    st = loom_mcp_server_status(s);
    assert_string_equal(
        json_string_value(json_object_get(st, "protocol_version")),
        LOOM_MCP_PROTOCOL_STATELESS);
    json_decref(st);
    assert_true(wait_log(&f, "closed", 1));
    assert_int_equal(log_count(&f, "cancelled"), 0);
    assert_int_equal(log_count(&f, "initialize"), 0);
    text = call_text(s, "echo", 0, &rc);
    assert_int_equal(rc, 0);
    free(text);
    loom_mcp_server_free(s);
    fake_stop(&f);
}

/* A call's sampling answerer: a fixed completion, for sampling only. */
static int sample_answer(loom_mcp_server *s, const char *method,
                         const json_t *params, void *arg, json_t **result)
{
    (void)s;
    (void)arg;
    assert_string_equal(method, "sampling/createMessage");
    assert_int_equal(json_integer_value(json_object_get(params, "maxTokens")),
                     10);
    *result = json_pack("{s:s,s:{s:s,s:s},s:s,s:s}", "role", "assistant",
                        "content", "type", "text", "text", "hi", "model", "p/m",
                        "stopReason", "endTurn");
    return 0;
}

/*
 * 2026-07-28 sampling (docs/mcp.md "Sampling"): a server allowed to
 * sample sees the capability in the request's _meta, and its
 * input_required round trip gets the call's answerer's completion, the
 * requestState echoed; with no answerer (outside a run) the call fails
 * saying why; a server not allowed sees no capability.
 */
static void test_stateless_sampling(void **state)
{
    static const char *const args[] = {"--stateless", NULL};
    loom_mcp_call_options o = {0};
    loom_mcp_server_config c;
    loom_mcp_server *s = NULL;
    loom_buf out = LOOM_BUF_INIT(1 << 16);
    json_t *res = NULL;
    fake_http f;
    char *text;
    int rc;

    (void)state;
    fake_start(&f, args);
    c = http_config(&f);
    c.sampling = "allow";
    assert_int_equal(loom_mcp_server_new(&s, &c), 0);
    o.input = sample_answer;
    assert_int_equal(loom_mcp_server_call_opts(s, "sample", NULL, &o, &res), 0);
    assert_int_equal(loom_mcp_result_text(res, &out), 0);
    assert_string_equal(loom_buf_cstr(&out),
                        "{\"s1\":{\"content\":{\"text\":\"hi\",\"type\":"
                        "\"text\"},\"model\":\"p/m\",\"role\":"
                        "\"assistant\",\"stopReason\":\"endTurn\"},"
                        "\"state\":\"st1\"}");
    json_decref(res);
    loom_buf_free(&out);
    text = call_text(s, "sample", 0, &rc);
    assert_int_equal(rc, LOOM_EUPSTREAM);
    assert_non_null(strstr(loom_error_last(), "sampling is answered only "
                                              "during a run"));
    free(text);
    loom_mcp_server_free(s);
    c.sampling = NULL;
    assert_int_equal(loom_mcp_server_new(&s, &c), 0);
    text = call_text(s, "sample", 0, &rc);
    assert_int_equal(rc, 0);
    assert_string_equal(text, "no sampling capability");
    free(text);
    loom_mcp_server_free(s);
    fake_stop(&f);
}

/* ---- through a run ------------------------------------------------------ */

/* A registry with the tools of the server c (as `web__<tool>`). */
static loom_tool_registry *registry_of(const loom_mcp_server_config *c)
{
    loom_mcp_server_config servers[1] = {*c};
    loom_config *cfg = NULL;
    loom_tool_registry *reg = NULL;

    assert_int_equal(loom_config_load_string(&cfg, "{}", "t"), 0);
    cfg->mcp_servers = servers;
    cfg->mcp_servers_len = 1;
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    assert_int_equal(loom_tools_add_mcp(reg, cfg), 0);
    cfg->mcp_servers = NULL;
    cfg->mcp_servers_len = 0;
    loom_config_free(cfg);
    assert_non_null(loom_tool_registry_get(reg, "web__hang"));
    return reg;
}

/* A registry with the fake's tools (as `web__<tool>`), each call given
 * timeout_ms. */
static loom_tool_registry *fake_registry(const fake_http *f, long timeout_ms)
{
    loom_mcp_server_config c = http_config(f);

    c.timeout_ms = timeout_ms;
    return registry_of(&c);
}

/* A run whose model calls web__hang, then answers "done". */
typedef struct {
    fake_http f;
    loom_tool_registry *reg;
    mock_provider m;
    loom_messages hist;
    loom_run *run;
} hang_run;

static void hang_run_new(hang_run *r, long timeout_ms)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "web__hang", "{}"}}, .ncalls = 1}, {.text = "done"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;

    memset(r, 0, sizeof(*r));
    fake_start(&r->f, NULL);
    r->reg = fake_registry(&r->f, timeout_ms);
    mock_init(&r->m, a, 2, 0);
    ro.provider = &r->m.base;
    ro.upstream_model = "m";
    ro.tools = r->reg;
    assert_int_equal(loom_messages_add(&r->hist, LOOM_ROLE_USER, "go"), 0);
    assert_int_equal(loom_run_new(&r->run, &ro, &r->hist), 0);
}

static void hang_run_free(hang_run *r)
{
    loom_run_free(r->run);
    loom_messages_free(&r->hist);
    mock_clear(&r->m);
    loom_tool_registry_free(r->reg);
    fake_stop(&r->f);
}

/* The run's call times out; the model reads the error and answers. */
static void test_run_goes_on(void **state)
{
    hang_run r;

    (void)state;
    hang_run_new(&r, 300);
    assert_int_equal(loom_run_execute(r.run), 0);
    assert_string_equal(loom_run_text(r.run), "done");
    assert_non_null(strstr(r.m.seen[1].first_tool, "no answer"));
    assert_int_equal(log_count(&r.f, "cancelled"), 1);
    hang_run_free(&r);
}

/* Cancels the run once the fake has the call. */
static void *cancel_main(void *arg)
{
    hang_run *r = arg;

    if (wait_log(&r->f, "call", 1))
        loom_run_cancel(r->run);
    return NULL;
}

/* A run cancelled during a call tells the server. */
static void test_run_cancelled(void **state)
{
    hang_run r;
    pthread_t th;
    int rc;

    (void)state;
    hang_run_new(&r, 60000);
    assert_int_equal(pthread_create(&th, NULL, cancel_main, &r), 0);
    rc = loom_run_execute(r.run);
    pthread_join(th, NULL);
    assert_int_equal(rc, LOOM_ECANCELED);
    assert_true(wait_log(&r.f, "cancelled", 1));
    assert_true(wait_log(&r.f, "closed", 1));
    hang_run_free(&r);
}

/* ---- calls from a fiber ------------------------------------------------- */

/* A call that hangs on a fiber, and another fiber of the same worker. */
typedef struct {
    fake_http f;
    loom_mcp_server *s;
    loom_cancel cancel;
    pthread_mutex_t mu;
    loom__cond cv;
    int hang_done, hang_rc;
    int other_done, other_saw_hang_done;
} fiber_case;

static void hang_fiber(void *arg)
{
    fiber_case *c = arg;
    json_t *res = NULL, *args = json_object();
    int rc = loom_mcp_server_call(c->s, "hang", args, 60000, &c->cancel, &res);

    json_decref(args);
    json_decref(res);
    pthread_mutex_lock(&c->mu);
    c->hang_rc = rc;
    c->hang_done = 1;
    loom__cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void other_fiber(void *arg)
{
    fiber_case *c = arg;

    pthread_mutex_lock(&c->mu);
    c->other_saw_hang_done = c->hang_done;
    c->other_done = 1;
    loom__cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/*
 * With one worker, a call waiting on a slow server (args: the fake's)
 * leaves the worker free: another fiber runs to its end while the call
 * still waits; the call then ends when cancelled.
 */
static void call_on_fiber_frees_worker(const char *const *args)
{
    loom__sched_opts o = {0};
    loom__sched *sched = NULL;
    fiber_case c;
    double until;

    memset(&c, 0, sizeof(c));
    pthread_mutex_init(&c.mu, NULL);
    assert_int_equal(loom__cond_init(&c.cv), 0);
    c.s = fake_server(&c.f, args);
    o.workers = 1;
    assert_int_equal(loom__sched_start(&sched, &o), 0);
    assert_int_equal(loom__fiber_spawn(sched, hang_fiber, &c, 0), 0);
    assert_true(wait_log(&c.f, "call", 1));
    assert_int_equal(loom__fiber_spawn(sched, other_fiber, &c, 0), 0);
    /* Ten seconds at most for the other fiber: the call waits a minute. */
    until = loom__mono_ms_exact() + 10000.0;
    pthread_mutex_lock(&c.mu);
    while (!c.other_done && loom__mono_ms_exact() < until)
        loom__cond_wait(&c.cv, &c.mu, until);
    assert_true(c.other_done);
    assert_false(c.other_saw_hang_done);
    assert_false(c.hang_done);
    pthread_mutex_unlock(&c.mu);
    loom_cancel_set(&c.cancel);
    loom__sched_stop(sched);
    assert_int_equal(c.hang_rc, LOOM_ECANCELED);
    assert_true(wait_log(&c.f, "cancelled", 1));
    loom_mcp_server_free(c.s);
    fake_stop(&c.f);
    loom__cond_destroy(&c.cv);
    pthread_mutex_destroy(&c.mu);
}

static void test_call_on_fiber_frees_worker(void **state)
{
    (void)state;
    call_on_fiber_frees_worker(NULL);
}

/* ---- the legacy HTTP+SSE transport ------------------------------------- */

static void test_legacy_sse(void **state)
{
    fake_http f;
    loom_mcp_server *s = fake_server(&f, legacy);
    json_t *tools = NULL, *st;
    char *text;
    int rc;

    (void)state;
    assert_int_equal(loom_mcp_server_tools(s, &tools), 0);
    assert_int_equal(json_array_size(tools), 3);
    json_decref(tools);
    st = loom_mcp_server_status(s);
    assert_string_equal(json_string_value(json_object_get(st, "transport")),
                        "sse");
    assert_string_equal(
        json_string_value(json_object_get(st, "protocol_version")),
        "2024-11-05");
    json_decref(st);
    text = call_text(s, "echo", 0, &rc);
    assert_int_equal(rc, 0);
    assert_string_equal(text, "{\"x\":\"hi\"}");
    free(text);
    /* No answer in time: the server is told, and stays in use. */
    text = call_text(s, "hang", 300, &rc);
    free(text);
    assert_int_equal(rc, LOOM_ETIMEDOUT);
    assert_int_equal(log_count(&f, "cancelled"), 1);
    text = call_text(s, "echo", 0, &rc);
    assert_int_equal(rc, 0);
    free(text);
    assert_int_equal(log_count(&f, "initialize"), 1);
    loom_mcp_server_free(s);
    fake_stop(&f);
}

static void test_legacy_call_on_fiber_frees_worker(void **state)
{
    (void)state;
    call_on_fiber_frees_worker(legacy);
}

/* The stream ends (the server went away): calls fail at once, and a
 * server back at the same place is used again. */
static void test_legacy_stream_lost(void **state)
{
    fake_http f;
    loom_mcp_server *s = fake_server(&f, legacy);
    char *text;
    int rc;

    (void)state;
    text = call_text(s, "echo", 0, &rc);
    assert_int_equal(rc, 0);
    free(text);
    fake_stop(&f);
    text = call_text(s, "echo", 0, &rc);
    free(text);
    assert_int_equal(rc, LOOM_EUPSTREAM);
    loom_mcp_server_free(s);
}

/* ---- /readyz ------------------------------------------------------------ */

static size_t take_body(char *p, size_t size, size_t n, void *arg)
{
    return loom_buf_put(arg, p, size * n) == 0 ? size * n : 0;
}

/* /readyz of a server with a working MCP server and one that cannot
 * start: ready, and each server's state said. */
static void test_readyz(void **state)
{
    loom_server_options so = LOOM_SERVER_OPTIONS_INIT;
    loom_mcp_setup setup = {0};
    loom_config *cfg = NULL;
    loom_store *store = NULL;
    loom_tool_registry *reg = NULL;
    loom_server *srv = NULL;
    loom_buf body = LOOM_BUF_INIT(1 << 16);
    char yaml[512], url[64], *db = test_tmp_path("readyz.db");
    json_t *o, *web, *bad;
    fake_http f;
    CURL *e;
    long status = 0;

    (void)state;
    fake_start(&f, NULL);
    snprintf(yaml, sizeof(yaml),
             "mcp_servers:\n"
             "  web: {url: '%s'}\n"
             "  bad: {command: /nonexistent/loom-mcp}\n",
             f.url);
    assert_int_equal(loom_config_load_string(&cfg, yaml, "t.yaml"), 0);
    assert_int_equal(loom_store_open(&store, db), 0);
    assert_int_equal(loom_mcp_set_new(&setup.servers), 0);
    assert_int_equal(loom_tools_new_from_config_with(&reg, cfg, &setup), 0);
    so.config = cfg;
    so.store = store;
    so.tools = reg;
    so.listen = "127.0.0.1:0";
    so.mcp_servers = setup.servers;
    assert_int_equal(loom_server_new(&srv, &so), 0);
    assert_int_equal(loom_server_start(srv), 0);
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/readyz",
             loom_server_port(srv));
    e = curl_easy_init();
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, take_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &body);
    assert_int_equal(curl_easy_perform(e), CURLE_OK);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(e);
    /* One server failed: loom is ready all the same. */
    assert_int_equal(status, 200);
    o = json_loads(loom_buf_cstr(&body), 0, NULL);
    assert_string_equal(json_string_value(json_object_get(o, "status")),
                        "ready");
    web = json_array_get(json_object_get(o, "mcp_servers"), 0);
    bad = json_array_get(json_object_get(o, "mcp_servers"), 1);
    assert_string_equal(json_string_value(json_object_get(web, "name")), "web");
    assert_string_equal(json_string_value(json_object_get(web, "state")),
                        "ready");
    assert_string_equal(
        json_string_value(json_object_get(web, "protocol_version")),
        "2025-11-25");
    assert_int_equal(json_integer_value(json_object_get(web, "tools")), 3);
    assert_string_equal(json_string_value(json_object_get(bad, "state")),
                        "failed");
    assert_non_null(strstr(json_string_value(json_object_get(bad, "error")),
                           "/nonexistent/loom-mcp"));
    assert_null(json_object_get(bad, "tools"));
    json_decref(o);
    loom_buf_free(&body);
    loom_server_free(srv);
    loom_tool_registry_free(reg);
    loom_mcp_set_free(setup.servers);
    loom_store_free(store);
    loom_config_free(cfg);
    unlink(db);
    free(db);
    fake_stop(&f);
}

/* A registry whose server (the fake f) starts in the background; cfg
 * and the registry to free. */
static loom_tool_registry *background_registry(const fake_http *f,
                                               loom_config **cfg)
{
    loom_mcp_server_config servers[1] = {http_config(f)};
    loom_tool_registry *reg = NULL;
    loom_mcp_setup setup = {0};

    assert_int_equal(loom_config_load_string(cfg, "{}", "t"), 0);
    (*cfg)->mcp_servers = servers;
    (*cfg)->mcp_servers_len = 1;
    setup.background = 1;
    assert_int_equal(loom_tools_new_from_config_with(&reg, *cfg, &setup), 0);
    (*cfg)->mcp_servers = NULL;
    (*cfg)->mcp_servers_len = 0;
    return reg;
}

/* A run over reg offering web__* whose model calls web__change, then
 * answers "done"; m (to clear) has what each model call was offered. */
static void change_run(loom_tool_registry *reg, mock_provider *m)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "web__change", "{}"}}, .ncalls = 1},
        {.text = "done"}};
    static const char *const names[] = {"web__*"};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    loom_run *run = NULL;

    mock_init(m, a, 2, 0);
    ro.provider = &m->base;
    ro.upstream_model = "m";
    ro.tools = reg;
    ro.tool_names = names;
    ro.tool_names_len = 1;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "go"), 0);
    assert_int_equal(loom_run_new(&run, &ro, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);
    assert_string_equal(loom_run_text(run), "done");
    assert_string_equal(m->seen[0].tools, "web__echo,web__hang,web__change");
    loom_run_free(run);
    loom_messages_free(&hist);
}

/*
 * A server started in the background: a run that offers its tools by
 * pattern gets them, and after its `change` call (the server says its
 * list changed, then answers) the next model call offers the new tool.
 */
static void test_list_changed(void **state)
{
    loom_config *cfg = NULL;
    loom_tool_registry *reg;
    mock_provider m;
    fake_http f;

    (void)state;
    fake_start(&f, NULL);
    reg = background_registry(&f, &cfg);
    /* Its tools come in snapshots; its names stand meanwhile. */
    assert_null(loom_tool_registry_get(reg, "web__echo"));
    assert_true(loom_tool_registry_claims(reg, "web__echo"));
    assert_true(loom_tool_registry_claims(reg, "web__*"));
    assert_false(loom_tool_registry_claims(reg, "get_time"));
    change_run(reg, &m);
    assert_string_equal(m.seen[1].tools,
                        "web__echo,web__hang,web__change,web__added");
    mock_clear(&m);
    loom_tool_registry_free(reg);
    loom_config_free(cfg);
    fake_stop(&f);
}

/*
 * The 2026-07-28 era: the server's discover says tools.listChanged, so a
 * subscriptions/listen stream is open; its `change` call says the list
 * changed on that stream only (not on the call's answer), and a snapshot
 * taken after that has the new tool.
 */
static void test_stateless_list_changed(void **state)
{
    static const char *const args[] = {"--stateless", NULL};
    loom_config *cfg = NULL;
    loom_tool_registry *reg, *snap = NULL;
    mock_provider m;
    fake_http f;
    struct timespec tick = {0, 20 * 1000000L};

    (void)state;
    fake_start(&f, args);
    reg = background_registry(&f, &cfg);
    change_run(reg, &m);
    assert_true(wait_log(&f, "listen", 1));
    /* The notice comes on the stream, apart from the call's answer: the
     * snapshots have the new tool once the client has read it. */
    for (int i = 0; i < 500; i++) {
        assert_int_equal(loom_tool_registry_snapshot(&snap, reg), 0);
        if (loom_tool_registry_get(snap, "web__added"))
            break;
        loom_tool_registry_free(snap);
        snap = NULL;
        nanosleep(&tick, NULL);
    }
    assert_non_null(snap);
    loom_tool_registry_free(snap);
    mock_clear(&m);
    loom_tool_registry_free(reg);
    loom_config_free(cfg);
    fake_stop(&f);
}

/* Waits (10 s at most) until s has been told of n list changes. */
static int wait_changed(loom_mcp_server *s, unsigned n)
{
    struct timespec tick = {0, 20 * 1000000L};

    for (int i = 0; i < 500; i++) {
        if (loom__mcp_lists_changed(s) >= n)
            return 1;
        nanosleep(&tick, NULL);
    }
    return 0;
}

/*
 * A subscription the server ends (its result on the stream) is opened
 * again, with a new request, and the tool list is then stale (a change
 * may have been missed); freeing the server closes it.
 */
static void test_stateless_listen_again(void **state)
{
    static const char *const args[] = {"--stateless", NULL};
    fake_http f;
    loom_mcp_server *s = fake_server(&f, args);

    (void)state;
    call_ok(s, "echo");
    assert_true(wait_log(&f, "listen", 1));
    assert_int_equal(loom__mcp_lists_changed(s), 0);
    call_ok(s, "unlisten");
    assert_true(wait_log(&f, "unlisten", 1));
    assert_true(wait_log(&f, "listen", 2));
    assert_true(wait_changed(s, 1));
    /* Still told of changes on the new stream. */
    call_ok(s, "change");
    assert_true(wait_changed(s, 2));
    loom_mcp_server_free(s);
    assert_true(wait_log(&f, "unlisten", 2));
    fake_stop(&f);
}

static void test_config(void **state)
{
    loom_config *cfg = NULL;

    (void)state;
    assert_int_equal(loom_config_load_string(&cfg,
                                             "mcp_servers:\n"
                                             "  old: {url: 'http://h/sse', "
                                             "transport: sse}\n",
                                             "t.yaml"),
                     0);
    assert_string_equal(cfg->mcp_servers[0].transport, "sse");
    loom_config_free(cfg);
    assert_int_equal(loom_config_load_string(&cfg,
                                             "mcp_servers:\n"
                                             "  old: {command: x, "
                                             "transport: sse}\n",
                                             "t.yaml"),
                     LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "transport sse needs url"));
}

/* Calls web__echo of reg for user (NULL: none) whose secrets are secrets
 * (a JSON text, NULL: none); the call's code, its text into out. */
static int call_user(loom_tool_registry *reg, const char *user,
                     const char *secrets, loom_buf *out)
{
    const loom_tool *t = loom_tool_registry_get(reg, "web__echo");
    json_t *args = json_pack("{s:s}", "x", "hi");
    json_t *keys =
        secrets ? json_pack("{s:o}", "secrets", json_loads(secrets, 0, NULL))
                : NULL;
    loom_tool_ctx ctx;
    int rc;

    memset(&ctx, 0, sizeof(ctx));
    ctx.user_keys = keys;
    ctx.user_id = user;
    loom_buf_clear(out);
    rc = t->execute(args, &ctx, out, t->payload);
    json_decref(args);
    json_decref(keys);
    return rc;
}

static int call_as(loom_tool_registry *reg, const char *secrets, loom_buf *out)
{
    return call_user(reg, NULL, secrets, out);
}

/* A header naming a user's secret: never sent as written (not when the
 * tools are listed at start either), sent with each caller's own value,
 * and a caller without it gets an error saying where to add it. */
static void test_user_headers(void **state)
{
    loom_mcp_server_config c;
    loom_tool_registry *reg;
    loom_buf out = LOOM_BUF_INIT(1 << 16);
    fake_http f;

    (void)state;
    fake_start(&f, NULL);
    c = http_config(&f);
    c.headers = json_pack("{s:s, s:s}", "Authorization", "Bearer ${user.token}",
                          "X-Team", "${user.team}-team");
    reg = registry_of(&c);
    assert_true(wait_log(&f, "auth tools/list -", 1));
    /* The YAML keeps ${user.NAME} as written (no variable of that name). */
    {
        loom_config *c2 = NULL;
        assert_int_equal(loom_config_load_string(
                             &c2,
                             "mcp_servers:\n"
                             "  t: {url: 'http://h/mcp', headers: "
                             "{Authorization: 'Bearer ${user.token}'}}\n",
                             "t.yaml"),
                         0);
        assert_string_equal(json_string_value(json_object_get(
                                c2->mcp_servers[0].headers, "Authorization")),
                            "Bearer ${user.token}");
        loom_config_free(c2);
    }

    assert_int_equal(
        call_as(reg, "{\"token\": \"alice-1\", \"team\": \"red\"}", &out), 0);
    assert_int_equal(log_count(&f, "auth tools/call Bearer alice-1"), 1);
    assert_int_equal(
        call_as(reg, "{\"token\": \"bob-2\", \"team\": \"blue\"}", &out), 0);
    assert_int_equal(log_count(&f, "auth tools/call Bearer bob-2"), 1);
    /* No secret, or not this one: a tool error, nothing sent. */
    assert_int_not_equal(call_as(reg, NULL, &out), 0);
    assert_non_null(
        strstr(loom_buf_cstr(&out), "needs your own secret 'token'"));
    assert_non_null(strstr(loom_buf_cstr(&out),
                           "add it to your user settings (secrets.token"));
    assert_int_not_equal(call_as(reg, "{\"token\": \"carol-3\"}", &out), 0);
    assert_non_null(strstr(loom_buf_cstr(&out), "secret 'team'"));
    assert_int_not_equal(
        call_as(reg, "{\"token\": \"a\\nb\", \"team\": \"x\"}", &out), 0);
    assert_int_equal(log_count(&f, "auth tools/call"), 2);
    assert_int_equal(log_count(&f, "auth tools/call Bearer ${"), 0);

    loom_buf_free(&out);
    loom_tool_registry_free(reg);
    json_decref(c.headers);
    fake_stop(&f);
}

/* ---- per-user OAuth credentials ------------------------------------------ */

/* Credentials kept in memory, per user: an access token each for "" (the
 * server's own), alice and bob; none for anyone else. Saves are counted
 * per user. */
typedef struct {
    int saves[3];
} mem_creds;

static int user_index(const char *user)
{
    return !strcmp(user, "")        ? 0
           : !strcmp(user, "alice") ? 1
           : !strcmp(user, "bob")   ? 2
                                    : -1;
}

static int mem_load(void *arg, const char *server, const char *user,
                    char **json)
{
    static const char *const tokens[] = {"op-tok", "alice-tok", "bob-tok"};
    int i = user_index(user);
    json_t *j;

    (void)arg;
    assert_string_equal(server, "web");
    *json = NULL;
    if (i < 0)
        return LOOM_ENOTFOUND;
    j = json_pack("{s:s,s:{s:{s:s}}}", "issuer", "https://as.test", "issuers",
                  "https://as.test", "access_token", tokens[i]);
    *json = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return 0;
}

static int mem_save(void *arg, const char *server, const char *user,
                    const char *json)
{
    mem_creds *m = arg;
    int i = user_index(user);

    (void)server;
    (void)json;
    if (i >= 0)
        m->saves[i]++;
    return 0;
}

/* The fake's tools with per_user on or off and the credentials above. */
static loom_tool_registry *creds_registry(const fake_http *f, int per_user,
                                          mem_creds *m)
{
    loom_mcp_server_config servers[1] = {http_config(f)};
    loom_mcp_credentials cs = {mem_load, mem_save, m};
    loom_mcp_setup setup;
    loom_config *cfg = NULL;
    loom_tool_registry *reg = NULL;

    memset(&setup, 0, sizeof(setup));
    setup.credentials = &cs;
    setup.per_user = per_user;
    assert_int_equal(loom_config_load_string(&cfg, "{}", "t"), 0);
    cfg->mcp_servers = servers;
    cfg->mcp_servers_len = 1;
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    assert_int_equal(loom_tools_add_mcp_with(reg, cfg, &setup), 0);
    cfg->mcp_servers = NULL;
    cfg->mcp_servers_len = 0;
    loom_config_free(cfg);
    assert_non_null(loom_tool_registry_get(reg, "web__echo"));
    return reg;
}

/* With accounts (per_user): the tools are listed with the server's own
 * token; each call carries its caller's own token, alternating callers
 * included (in the session era each user has a session of their own);
 * a caller without credentials never gets another's (no token at all
 * here, where the server does not ask for one); a call for no user is
 * refused. Without accounts every call carries the server's token. */
static void per_user_run(const char *const *args)
{
    loom_buf out = LOOM_BUF_INIT(1 << 16);
    loom_tool_registry *reg;
    mem_creds m = {{0}};
    fake_http f;

    fake_start(&f, args);
    reg = creds_registry(&f, 1, &m);
    assert_int_equal(log_count(&f, "auth tools/list Bearer op-tok"), 1);
    assert_int_equal(call_user(reg, "alice", NULL, &out), 0);
    assert_string_equal(loom_buf_cstr(&out), "{\"x\":\"hi\"}");
    assert_int_equal(call_user(reg, "bob", NULL, &out), 0);
    assert_int_equal(call_user(reg, "alice", NULL, &out), 0);
    assert_int_equal(log_count(&f, "auth tools/call Bearer alice-tok"), 2);
    assert_int_equal(log_count(&f, "auth tools/call Bearer bob-tok"), 1);
    assert_int_equal(call_user(reg, "carol", NULL, &out), 0);
    assert_int_equal(log_count(&f, "auth tools/call -"), 1);
    assert_int_not_equal(call_user(reg, NULL, NULL, &out), 0);
    assert_non_null(strstr(loom_buf_cstr(&out), "for no user"));
    assert_int_equal(log_count(&f, "auth tools/call Bearer op-tok"), 0);
    assert_int_equal(log_count(&f, "auth tools/call"), 4);
    /* Nothing was refreshed or authorized: nothing saved. */
    assert_int_equal(m.saves[0] + m.saves[1] + m.saves[2], 0);
    loom_tool_registry_free(reg);

    reg = creds_registry(&f, 0, &m);
    assert_int_equal(call_user(reg, "alice", NULL, &out), 0);
    assert_int_equal(call_user(reg, NULL, NULL, &out), 0);
    assert_int_equal(log_count(&f, "auth tools/call Bearer op-tok"), 2);
    assert_int_equal(log_count(&f, "auth tools/call Bearer alice-tok"), 2);
    loom_tool_registry_free(reg);
    loom_buf_free(&out);
    fake_stop(&f);
}

static void test_per_user_tokens(void **state)
{
    static const char *const stateless_args[] = {"--stateless", NULL};

    (void)state;
    per_user_run(NULL);
    per_user_run(stateless_args);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_session_expiry),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_stateless_timeout),
        cmocka_unit_test(test_stateless_sampling),
        cmocka_unit_test(test_run_goes_on),
        cmocka_unit_test(test_run_cancelled),
        cmocka_unit_test(test_call_on_fiber_frees_worker),
        cmocka_unit_test(test_legacy_sse),
        cmocka_unit_test(test_legacy_call_on_fiber_frees_worker),
        cmocka_unit_test(test_legacy_stream_lost),
        cmocka_unit_test(test_readyz),
        cmocka_unit_test(test_list_changed),
        cmocka_unit_test(test_stateless_list_changed),
        cmocka_unit_test(test_stateless_listen_again),
        cmocka_unit_test(test_config),
        cmocka_unit_test(test_user_headers),
        cmocka_unit_test(test_per_user_tokens),
    };
    signal(SIGPIPE, SIG_IGN);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
