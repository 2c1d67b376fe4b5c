/*
 * The MCP client (loom/mcp.h) against the hostile stdio server in
 * tests/mcp/fake_mcp.c: a garbage stdout line skipped, tools/list paging
 * with cursors that advance, stick or cycle, a call that never answers
 * (timed out, notifications/cancelled sent, the server still used), a
 * server that exits mid-call (the call fails at once, the next one
 * restarts it), an isError result, results mapped to text, results
 * checked against the tool's outputSchema, tool names,
 * the tools offered through a registry, and servers started in the
 * background (loom starts at once, a run waits for the servers it
 * needs, a server that failed is tried again on its next use).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "loom/config.h"
#include "loom/mcp.h"
#include "loom/session.h"
#include "loom/tools.h"
#include "testutil.h"
#include "tools/registry.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A stdio server config for the fake in mode (NULL: default). */
static loom_mcp_server_config fake_config(const char *mode)
{
    static char *args[1];
    loom_mcp_server_config c = {0};

    args[0] = (char *)mode;
    c.name = "fake";
    c.command = LOOM_FAKE_MCP_BIN;
    c.args = mode ? args : NULL;
    c.args_len = mode ? 1 : 0;
    c.timeout_ms = 10000;
    c.startup_timeout_ms = 10000;
    return c;
}

/* log: where the fake notes what it saw (FAKE_MCP_LOG), or NULL. */
static loom_mcp_server *fake_server_log(const char *mode, const char *log)
{
    loom_mcp_server_config c = fake_config(mode);
    loom_mcp_server *s = NULL;

    c.env = log ? json_pack("{s:s}", "FAKE_MCP_LOG", log) : NULL;
    assert_int_equal(loom_mcp_server_new(&s, &c), 0);
    json_decref(c.env);
    return s;
}

static loom_mcp_server *fake_server(const char *mode)
{
    return fake_server_log(mode, NULL);
}

/* The "name" of each tool, joined with ",". */
static char *names_of(const json_t *tools)
{
    static char buf[512];
    const json_t *t;
    size_t i;

    buf[0] = '\0';
    json_array_foreach(tools, i, t)
    {
        if (i)
            strncat(buf, ",", sizeof(buf) - strlen(buf) - 1);
        strncat(buf, json_string_value(json_object_get(t, "name")),
                sizeof(buf) - strlen(buf) - 1);
    }
    return buf;
}

static char *call_text(loom_mcp_server *s, const char *tool, const char *args,
                       int *is_error)
{
    json_t *a = json_loads(args, 0, NULL), *res = NULL;
    loom_buf out = LOOM_BUF_INIT(1 << 20);

    assert_int_equal(loom_mcp_server_call(s, tool, a, 0, NULL, &res), 0);
    *is_error = loom_mcp_result_text(res, &out);
    json_decref(a);
    json_decref(res);
    return loom_buf_detach(&out);
}

/* How many lines of the fake's log start with prefix. */
static int log_count(const char *path, const char *prefix)
{
    FILE *f = fopen(path, "r");
    char line[256];
    int n = 0;

    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        n += strncmp(line, prefix, strlen(prefix)) == 0;
    fclose(f);
    return n;
}

static void test_list_and_call(void **state)
{
    loom_mcp_server *s = fake_server(NULL);
    json_t *tools = NULL, *st;
    char *text;
    int err;

    (void)state;
    assert_int_equal(loom_mcp_server_tools(s, &tools), 0);
    assert_string_equal(names_of(tools), "echo,hang,die,fail,structured,image,"
                                         "a.tool with spaces");
    json_decref(tools);
    text = call_text(s, "echo", "{\"x\": \"hi\", \"a\": 1}", &err);
    assert_string_equal(text, "{\"a\":1,\"x\":\"hi\"}");
    assert_int_equal(err, 0);
    free(text);
    st = loom_mcp_server_status(s);
    assert_string_equal(json_string_value(json_object_get(st, "state")),
                        "ready");
    assert_string_equal(
        json_string_value(json_object_get(st, "protocol_version")),
        "2025-11-25");
    json_decref(st);
    loom_mcp_server_free(s);
}

typedef struct {
    int n;
    double last;
    char message[64];
} progress_seen;

static void note_progress(const json_t *params, void *arg)
{
    progress_seen *p = arg;

    p->n++;
    p->last = json_number_value(json_object_get(params, "progress"));
    snprintf(p->message, sizeof(p->message), "%s",
             json_string_value(json_object_get(params, "message")));
}

/* A call asks for progress (a progressToken) and its callback gets each
 * notifications/progress of the server, in order, before its result. */
static void test_progress(void **state)
{
    loom_mcp_server *s = fake_server(NULL);
    loom_mcp_call_options o = {0};
    progress_seen seen = {0};
    json_t *res = NULL;
    loom_buf out;

    (void)state;
    o.on_progress = note_progress;
    o.progress_arg = &seen;
    assert_int_equal(loom_mcp_server_call_opts(s, "progress", NULL, &o, &res),
                     0);
    loom_buf_init(&out, 4096);
    assert_int_equal(loom_mcp_result_text(res, &out), 0);
    assert_string_equal(loom_buf_cstr(&out), "done");
    assert_int_equal(seen.n, 3);
    assert_true(seen.last == 3);
    assert_string_equal(seen.message, "last step");
    loom_buf_free(&out);
    json_decref(res);
    loom_mcp_server_free(s);
}

/* Roots from config are declared and given on roots/list as file://
 * URIs (a path made one, a relative one from the working directory);
 * without roots the capability is not declared. */
static void test_roots(void **state)
{
    loom_mcp_server_config c = fake_config(NULL);
    char *roots[] = {"/srv/my docs", "file:///tmp/x/", "rel"};
    loom_mcp_server *s = NULL;
    json_t *got, *r;
    char *text, cwd[1024], want[1200];
    int err;

    (void)state;
    s = fake_server(NULL);
    text = call_text(s, "roots", "{}", &err);
    assert_string_equal(text, "no roots capability");
    free(text);
    loom_mcp_server_free(s);

    c.roots = roots;
    c.roots_len = 3;
    assert_int_equal(loom_mcp_server_new(&s, &c), 0);
    text = call_text(s, "roots", "{}", &err);
    got = json_loads(text, 0, NULL);
    assert_non_null(got);
    r = json_object_get(got, "roots");
    assert_int_equal(json_array_size(r), 3);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(r, 0), "uri")),
        "file:///srv/my%20docs");
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(r, 0), "name")),
        "my%20docs");
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(r, 1), "uri")),
        "file:///tmp/x/");
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(r, 1), "name")), "x");
    assert_non_null(getcwd(cwd, sizeof(cwd)));
    snprintf(want, sizeof(want), "file://%s/rel", cwd);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(r, 2), "uri")), want);
    json_decref(got);
    free(text);
    loom_mcp_server_free(s);
}

static void test_paging(void **state)
{
    static const struct {
        const char *mode, *names;
    } cases[] = {
        {"pages", "one,two,three"},
        {"stuck", "first,again"},
        {"cycle", "start,x,y"},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        loom_mcp_server *s = fake_server(cases[i].mode);
        json_t *tools = NULL;
        assert_int_equal(loom_mcp_server_tools(s, &tools), 0);
        assert_string_equal(names_of(tools), cases[i].names);
        json_decref(tools);
        loom_mcp_server_free(s);
    }
}

static void test_allow_list(void **state)
{
    loom_mcp_server_config c = fake_config(NULL);
    char *allow[] = {"fail", "echo", "absent"};
    loom_mcp_server *s = NULL;
    json_t *tools = NULL;

    (void)state;
    c.tools = allow;
    c.tools_len = 3;
    assert_int_equal(loom_mcp_server_new(&s, &c), 0);
    assert_int_equal(loom_mcp_server_tools(s, &tools), 0);
    assert_string_equal(names_of(tools), "echo,fail");
    json_decref(tools);
    loom_mcp_server_free(s);
}

static void test_timeout_cancels(void **state)
{
    char *log = test_tmp_path("mcp-timeout.log");
    loom_mcp_server *s;
    json_t *res = NULL;
    char *text;
    int err;

    (void)state;
    unlink(log);
    s = fake_server_log(NULL, log);
    assert_int_equal(loom_mcp_server_call(s, "hang", NULL, 200, NULL, &res),
                     LOOM_ETIMEDOUT);
    assert_null(res);
    /* The server reads in order: once echo is answered, it has read the
     * cancellation sent before it. */
    text = call_text(s, "echo", "{}", &err);
    assert_string_equal(text, "{}");
    free(text);
    assert_int_equal(log_count(log, "cancelled "), 1);
    assert_int_equal(log_count(log, "start"), 1);
    loom_mcp_server_free(s);
    unlink(log);
    free(log);
}

static void test_cancel_flag(void **state)
{
    loom_mcp_server *s = fake_server(NULL);
    loom_cancel cancel = LOOM_CANCEL_INIT;
    json_t *res = NULL;

    (void)state;
    loom_cancel_set(&cancel);
    assert_int_equal(
        loom_mcp_server_call(s, "hang", NULL, 60000, &cancel, &res),
        LOOM_ECANCELED);
    loom_mcp_server_free(s);
}

static void test_exit_mid_call_restarts(void **state)
{
    char *log = test_tmp_path("mcp-restart.log");
    loom_mcp_server *s;
    json_t *res = NULL, *st;
    char *text;
    int err;

    (void)state;
    unlink(log);
    s = fake_server_log(NULL, log);
    /* A 60 s timeout: the call must fail because the server died, not
     * because time ran out. */
    assert_int_equal(loom_mcp_server_call(s, "die", NULL, 60000, NULL, &res),
                     LOOM_EUPSTREAM);
    assert_non_null(strstr(loom_error_last(), "closed its output"));
    st = loom_mcp_server_status(s);
    assert_string_equal(json_string_value(json_object_get(st, "state")),
                        "down");
    json_decref(st);
    text = call_text(s, "echo", "{\"x\":\"again\"}", &err);
    assert_string_equal(text, "{\"x\":\"again\"}");
    free(text);
    assert_int_equal(log_count(log, "start"), 2);
    loom_mcp_server_free(s);
    unlink(log);
    free(log);
}

static void test_results(void **state)
{
    loom_mcp_server *s = fake_server(NULL);
    char *text;
    int err;

    (void)state;
    text = call_text(s, "fail", "{}", &err);
    assert_int_equal(err, 1);
    assert_string_equal(text, "the disk is full");
    free(text);
    text = call_text(s, "structured", "{}", &err);
    assert_int_equal(err, 0);
    assert_string_equal(text, "{\"answer\":42}");
    free(text);
    text = call_text(s, "image", "{}", &err);
    assert_string_equal(text, "[image: image/png, about 9 bytes]\n\n"
                              "[resource: file:///tmp/a.txt (a.txt)]");
    free(text);
    loom_mcp_server_free(s);
}

/* A tool of the fake in "results" mode through a registry: its result
 * text, or the failure's words; *rc gets execute's return. */
static char *registry_call(loom_tool_registry *reg, const char *name, int *rc)
{
    const loom_tool *t = loom_tool_registry_get(reg, name);
    loom_buf out = LOOM_BUF_INIT(1 << 16);
    loom_tool_ctx ctx = {0};
    json_t *args = json_object();

    assert_non_null(t);
    *rc = t->execute(args, &ctx, &out, t->payload);
    json_decref(args);
    return loom_buf_detach(&out);
}

static void test_output_schema(void **state)
{
    loom_mcp_server_config servers[1] = {fake_config("results")};
    loom_config cfg = {0};
    loom_tool_registry *reg = NULL;
    char *text;
    int rc;

    (void)state;
    cfg.mcp_servers = servers;
    cfg.mcp_servers_len = 1;
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    assert_int_equal(loom_tools_add_mcp(reg, &cfg), 0);
    text = registry_call(reg, "fake__typed", &rc);
    assert_int_equal(rc, 0);
    assert_string_equal(text, "{\"answer\":42}");
    free(text);
    /* A result that breaks the schema fails the call, with the reason. */
    text = registry_call(reg, "fake__mistyped", &rc);
    assert_int_equal(rc, LOOM_ERROR);
    assert_non_null(strstr(text, "does not match the tool's outputSchema"));
    assert_non_null(strstr(text, "`answer` must be an integer"));
    assert_string_equal(loom_error_last(), text);
    free(text);
    text = registry_call(reg, "fake__untyped", &rc);
    assert_int_equal(rc, LOOM_ERROR);
    assert_non_null(strstr(text, "has no structuredContent"));
    free(text);
    /* An embedded resource: its URI, then its text. */
    text = registry_call(reg, "fake__resource", &rc);
    assert_int_equal(rc, 0);
    assert_string_equal(text, "[resource: file:///tmp/b.txt]\nhello");
    free(text);
    loom_tool_registry_free(reg);
}

static void test_result_check(void **state)
{
    json_t *schema = json_pack("{s:s,s:{s:{s:s}}}", "type", "object",
                               "properties", "n", "type", "integer");
    json_t *ok = json_pack("{s:{s:i}}", "structuredContent", "n", 1);
    json_t *failed = json_pack("{s:b}", "isError", 1);
    char *msg = NULL;

    (void)state;
    assert_int_equal(loom_mcp_result_check(schema, ok, &msg), 0);
    assert_null(msg);
    /* No schema, or a failed call: nothing to check. */
    assert_int_equal(loom_mcp_result_check(NULL, failed, &msg), 0);
    assert_int_equal(loom_mcp_result_check(schema, failed, &msg), 0);
    assert_null(msg);
    json_object_set_new(json_object_get(ok, "structuredContent"), "n",
                        json_string("1"));
    assert_int_equal(loom_mcp_result_check(schema, ok, &msg), LOOM_EINVALID);
    assert_non_null(strstr(msg, "`n` must be an integer"));
    free(msg);
    json_decref(schema);
    json_decref(ok);
    json_decref(failed);
}

static void test_result_cut(void **state)
{
    json_t *res = json_pack("{s:[{s:s,s:s}]}", "content", "type", "text",
                            "text", "0123456789");
    loom_buf out = LOOM_BUF_INIT(104);

    (void)state;
    /* 104 bytes with 100 kept for the note: 4 bytes of text fit. */
    assert_int_equal(loom_mcp_result_text(res, &out), 0);
    assert_string_equal(loom_buf_cstr(&out), "0123\n[cut: 6 more bytes]");
    loom_buf_free(&out);
    json_decref(res);
}

static void test_names(void **state)
{
    char name[65], again[65];
    char long_tool[100];

    (void)state;
    loom_mcp_tool_name(name, "files", "read_file");
    assert_string_equal(name, "files__read_file");
    loom_mcp_tool_name(name, "fake", "a.tool with spaces");
    assert_string_equal(name, "fake__a_tool_with_spaces");
    memset(long_tool, 'x', sizeof(long_tool) - 1);
    long_tool[sizeof(long_tool) - 1] = '\0';
    loom_mcp_tool_name(name, "files", long_tool);
    assert_int_equal(strlen(name), 64);
    assert_memory_equal(name, "files__xxx", 10);
    assert_int_equal(name[55], '_');
    loom_mcp_tool_name(again, "files", long_tool);
    assert_string_equal(name, again);
    long_tool[98] = 'y';
    loom_mcp_tool_name(again, "files", long_tool);
    assert_string_not_equal(name, again);
}

static void test_registry(void **state)
{
    loom_mcp_server_config servers[2] = {fake_config(NULL), {0}};
    loom_config cfg = {0};
    loom_tool_registry *reg = NULL;
    loom_buf out = LOOM_BUF_INIT(1 << 16);
    loom_tool_ctx ctx = {0};
    const loom_tool *t;
    json_t *args = json_pack("{s:s}", "x", "y");

    (void)state;
    /* A server that cannot start is skipped; it stops nothing. */
    servers[1].name = "broken";
    servers[1].command = "/nonexistent/loom-mcp-server";
    cfg.mcp_servers = servers;
    cfg.mcp_servers_len = 2;
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    assert_int_equal(loom_tools_add_mcp(reg, &cfg), 0);
    assert_int_equal(loom_tool_registry_count(reg), 7);
    assert_non_null(loom_tool_registry_get(reg, "fake__a_tool_with_spaces"));
    t = loom_tool_registry_get(reg, "fake__echo");
    assert_non_null(t);
    assert_string_equal(
        json_string_value(json_object_get(t->parameters, "type")), "object");
    assert_int_equal(t->execute(args, &ctx, &out, t->payload), 0);
    assert_string_equal(loom_buf_cstr(&out), "{\"x\":\"y\"}");
    loom_buf_clear(&out);
    t = loom_tool_registry_get(reg, "fake__fail");
    assert_int_equal(t->execute(args, &ctx, &out, t->payload), LOOM_ERROR);
    assert_string_equal(loom_error_last(), "the disk is full");
    loom_buf_free(&out);
    json_decref(args);
    loom_tool_registry_free(reg);
}

/* A session from yaml (the fake's path after "command: "); 0 or the
 * error of loom_session_new. */
static int session_for(const char *agent_tools)
{
    char yaml[2048];
    loom_config *cfg = NULL;
    loom_session *sess = NULL;
    loom_session_options o = LOOM_SESSION_OPTIONS_INIT;
    int rc;

    snprintf(yaml, sizeof(yaml),
             "providers: {p: {base_url: 'http://127.0.0.1:9'}}\n"

             "mcp_servers:\n"
             "  fake: {command: %s, tools: [echo, fail]}\n"
             "  down: {command: /nonexistent/mcp, startup_timeout_ms: 500}\n"
             "agents: {a: {model: p/m, tools: %s}}\n",
             LOOM_FAKE_MCP_BIN, agent_tools);
    if (loom_config_load_string(&cfg, yaml, "t.yaml") != 0)
        fail_msg("%s", loom_error_last());
    o.config = cfg;
    rc = loom_session_new(&sess, &o);
    if (rc == 0)
        assert_non_null(
            loom_tool_registry_get(loom_session_tools(sess), "fake__echo"));
    loom_session_free(sess);
    loom_config_free(cfg);
    return rc;
}

static void test_agent_tool_names(void **state)
{
    (void)state;
    /* Patterns, and the names of a server that is down, stand. */
    assert_int_equal(session_for("[fake__*, down__*, down__read, get_time]"),
                     0);
    assert_int_equal(session_for("[fake__e*]"), 0);
    assert_int_equal(session_for("[fake__hang]"), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "unknown tool 'fake__hang'"));
    assert_int_equal(session_for("[other__*]"), LOOM_EINVALID);
}

/* ---- servers started in the background ---------------------------------- */

/*
 * A gate a gated server waits at before each start: start k of the
 * server reads one word from the FIFO <path>.<k> (k counted in the file
 * <path>.n); "go" starts the fake, anything else makes it exit 1. open()
 * waits for the reader, so the k-th word goes to the k-th start.
 */
typedef struct {
    char path[256];
    char script[1200];
    char *args[2];
    char fifo[280];
    const char *word;
    int said;
    pthread_t th;
} gate;

static void gate_init(gate *g, const char *name)
{
    char file[64], *path, p[300];
    FILE *f;

    memset(g, 0, sizeof(*g));
    snprintf(file, sizeof(file), "mcp_gate_%s", name);
    path = test_tmp_path(file);
    assert_non_null(path);
    snprintf(g->path, sizeof(g->path), "%s", path);
    free(path);
    for (int k = 0; k < 2; k++) {
        snprintf(p, sizeof(p), "%s.%d", g->path, k);
        unlink(p);
        assert_int_equal(mkfifo(p, 0600), 0);
    }
    snprintf(p, sizeof(p), "%s.n", g->path);
    assert_non_null(f = fopen(p, "w"));
    fputs("0\n", f);
    fclose(f);
    snprintf(g->script, sizeof(g->script),
             "read n < '%s.n'; echo $((n + 1)) > '%s.n'; "
             "read x < '%s.'$n && [ \"$x\" = go ] && exec '%s'",
             g->path, g->path, g->path, LOOM_FAKE_MCP_BIN);
    g->args[0] = "-c";
    g->args[1] = g->script;
}

static void gate_free(gate *g)
{
    char p[300];

    for (int k = 0; k < 2; k++) {
        snprintf(p, sizeof(p), "%s.%d", g->path, k);
        unlink(p);
    }
    snprintf(p, sizeof(p), "%s.n", g->path);
    unlink(p);
}

static void *gate_main(void *arg)
{
    gate *g = arg;
    int fd = open(g->fifo, O_WRONLY);

    if (fd >= 0) {
        if (write(fd, g->word, strlen(g->word)) < 0 || write(fd, "\n", 1) < 0)
            fprintf(stderr, "gate %s: write failed\n", g->fifo);
        close(fd);
    }
    return NULL;
}

/* Says word to the next start of the gated server (on a thread). */
static void gate_say(gate *g, const char *word)
{
    g->word = word;
    snprintf(g->fifo, sizeof(g->fifo), "%s.%d", g->path, g->said++);
    assert_int_equal(pthread_create(&g->th, NULL, gate_main, g), 0);
}

static void gate_said(gate *g)
{
    pthread_join(g->th, NULL);
}

static loom_mcp_server_config gated_config(gate *g, const char *name)
{
    loom_mcp_server_config c = {0};

    gate_init(g, name);
    c.name = (char *)name;
    c.command = "/bin/sh";
    c.args = g->args;
    c.args_len = 2;
    c.timeout_ms = 10000;
    c.startup_timeout_ms = 10000;
    return c;
}

/* Whether a snapshot of reg for names has tool. */
static int snapshot_has(const loom_tool_registry *reg, const char *name,
                        const char *tool)
{
    loom_tool_registry *snap = NULL;
    const char *names[1] = {name};
    int has;

    assert_int_equal(loom__tool_registry_snapshot(&snap, reg, names, 1), 0);
    has = loom_tool_registry_get(snap, tool) != NULL;
    loom_tool_registry_free(snap);
    return has;
}

/* The state of the server named name in set's status. */
static char *state_of(loom_mcp_set *set, const char *name)
{
    json_t *all = loom_mcp_set_status(set), *v;
    size_t i;
    char *state = NULL;

    json_array_foreach(all, i, v)
    {
        if (strcmp(json_string_value(json_object_get(v, "name")), name) == 0)
            state = strdup(json_string_value(json_object_get(v, "state")));
    }
    json_decref(all);
    return state;
}

static void test_background(void **state)
{
    gate slow, flaky;
    loom_mcp_server_config servers[3];
    loom_config cfg = {0};
    loom_tool_registry *reg = NULL, *all = NULL;
    loom_mcp_setup setup = {0};
    char *st;
    int has = 0;

    (void)state;
    servers[0] = gated_config(&slow, "slow");
    servers[1] = gated_config(&flaky, "flaky");
    servers[2] = fake_config(NULL);
    servers[2].name = "broken";
    servers[2].command = "/nonexistent/loom-mcp-server";
    cfg.mcp_servers = servers;
    cfg.mcp_servers_len = 3;
    assert_int_equal(loom_mcp_set_new(&setup.servers), 0);
    setup.background = 1;
    /* Returns while both gated servers wait at their gates. */
    assert_int_equal(loom_tools_new_from_config_with(&reg, &cfg, &setup), 0);
    assert_null(loom_tool_registry_get(reg, "slow__echo"));
    assert_true(loom_tool_registry_claims(reg, "slow__echo"));
    assert_true(loom_tool_registry_claims(reg, "broken__read"));

    /* A run that needs the slow server waits for it. */
    gate_say(&slow, "go");
    assert_true(snapshot_has(reg, "slow__*", "slow__echo"));
    gate_said(&slow);

    /* The flaky one fails its first start, and is tried again on its
     * next use: the first snapshot may still find the failed start. */
    gate_say(&flaky, "no");
    gate_said(&flaky);
    gate_say(&flaky, "go");
    for (int i = 0; i < 2 && !has; i++)
        has = snapshot_has(reg, "flaky__echo", "flaky__echo");
    assert_true(has);
    gate_said(&flaky);

    /* A broken one adds nothing and fails nothing. */
    assert_false(snapshot_has(reg, "broken__read", "broken__read"));
    st = state_of(setup.servers, "broken");
    assert_string_equal(st, "failed");
    free(st);
    st = state_of(setup.servers, "flaky");
    assert_string_equal(st, "ready");
    free(st);

    assert_int_equal(loom_tool_registry_snapshot(&all, reg), 0);
    assert_non_null(loom_tool_registry_get(all, "slow__echo"));
    assert_non_null(loom_tool_registry_get(all, "flaky__echo"));
    assert_non_null(loom_tool_registry_get(all, "get_time"));
    /* The registry goes first; the snapshot's tools still work. */
    loom_tool_registry_free(reg);
    {
        const loom_tool *t = loom_tool_registry_get(all, "slow__echo");
        loom_buf out = LOOM_BUF_INIT(4096);
        loom_tool_ctx ctx = {0};
        json_t *args = json_pack("{s:s}", "x", "y");
        assert_int_equal(t->execute(args, &ctx, &out, t->payload), 0);
        assert_string_equal(loom_buf_cstr(&out), "{\"x\":\"y\"}");
        json_decref(args);
        loom_buf_free(&out);
    }
    loom_tool_registry_free(all);
    loom_mcp_set_free(setup.servers);
    gate_free(&slow);
    gate_free(&flaky);
}

static void test_config_errors(void **state)
{
    loom_config *cfg = NULL;

    (void)state;
    assert_int_equal(loom_config_load_string(&cfg,
                                             "mcp_servers:\n"
                                             "  x:\n"
                                             "    command: a\n"
                                             "    url: http://h/mcp\n",
                                             "t.yaml"),
                     LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "t.yaml:4: mcp_servers.x: "
                                              "give either command"));
    assert_int_equal(loom_config_load_string(&cfg,
                                             "mcp_servers:\n"
                                             "  x: {url: http://h/mcp, "
                                             "transport: stdio}\n",
                                             "t.yaml"),
                     LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "transport stdio needs"));
    assert_int_equal(loom_config_load_string(&cfg,
                                             "mcp_servers:\n"
                                             "  x: {env: {A: b}}\n",
                                             "t.yaml"),
                     LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "needs command"));
    assert_int_equal(loom_config_load_string(&cfg,
                                             "mcp_servers:\n"
                                             "  x: {command: a, roots: "
                                             "[/srv, \"https://h/d\"]}\n",
                                             "t.yaml"),
                     LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "mcp_servers.x.roots[1]: must "
                                              "be a path or a file:// URI"));
    assert_int_equal(loom_config_load_string(&cfg,
                                             "mcp_servers:\n"
                                             "  x: {command: a, roots: "
                                             "[/srv, \"file:///d\"]}\n",
                                             "t.yaml"),
                     0);
    assert_int_equal(cfg->mcp_servers[0].roots_len, 2);
    assert_string_equal(cfg->mcp_servers[0].roots[1], "file:///d");
    loom_config_free(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_list_and_call),
        cmocka_unit_test(test_paging),
        cmocka_unit_test(test_allow_list),
        cmocka_unit_test(test_timeout_cancels),
        cmocka_unit_test(test_cancel_flag),
        cmocka_unit_test(test_exit_mid_call_restarts),
        cmocka_unit_test(test_results),
        cmocka_unit_test(test_result_cut),
        cmocka_unit_test(test_output_schema),
        cmocka_unit_test(test_result_check),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_registry),
        cmocka_unit_test(test_progress),
        cmocka_unit_test(test_roots),
        cmocka_unit_test(test_agent_tool_names),
        cmocka_unit_test(test_background),
        cmocka_unit_test(test_config_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
