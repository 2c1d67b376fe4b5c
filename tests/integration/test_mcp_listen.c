/*
 * The 2026-07-28 era over stdio (tests/mcp/fake_mcp.c in "stateless"
 * mode): a server whose discover says tools.listChanged gets a
 * subscriptions/listen, and a list change it tells only on that
 * subscription (its notifications tagged with the request's id on the
 * shared stdout) gives the next model call the new tool. The
 * subscription is sent again to a restarted process and when the server
 * ends it, a notification of another subscription is not counted, and
 * freeing the server cancels it; a call that times out is cancelled with
 * notifications/cancelled, stdio having no stream per request to close.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "loom/config.h"
#include "loom/mcp.h"
#include "loom/run.h"
#include "loom/tools.h"
#include "mock_provider.h"
#include "testutil.h"
#include "tools/mcp/mcp_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *stateless_args[] = {"stateless"};

/* The fake in "stateless" mode, noting what it sees in log (or not). */
static loom_mcp_server_config stateless_config(const char *log)
{
    loom_mcp_server_config c = {0};

    c.name = "fake";
    c.command = LOOM_FAKE_MCP_BIN;
    c.args = stateless_args;
    c.args_len = 1;
    c.timeout_ms = 10000;
    c.startup_timeout_ms = 10000;
    c.env = log ? json_pack("{s:s}", "FAKE_MCP_LOG", log) : NULL;
    return c;
}

/* The lines of the fake's log that start with prefix: how many, and the
 * number after the last one in *last. */
static int noted(const char *log, const char *prefix, long long *last)
{
    FILE *f = fopen(log, "r");
    char line[256];
    int n = 0;

    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, prefix, strlen(prefix)) == 0) {
            n++;
            if (last)
                *last = atoll(line + strlen(prefix));
        }
    fclose(f);
    return n;
}

static void call_ok(loom_mcp_server *s, const char *tool)
{
    json_t *res = NULL;

    if (loom_mcp_server_call(s, tool, NULL, 0, NULL, &res) != 0)
        fail_msg("%s: %s", tool, loom_error_last());
    json_decref(res);
}

/*
 * Through a run: the model calls fake__change, the server tells of the
 * change on the subscription only (before the call's answer, on the
 * same stdout), and the next model call is offered fake__added.
 */
static void test_model_sees_new_tool(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "fake__change", "{}"}}, .ncalls = 1},
        {.text = "done"}};
    static const char *const names[] = {"fake__*"};
    loom_mcp_server_config servers[1] = {stateless_config(NULL)};
    loom_config *cfg = NULL;
    loom_tool_registry *reg = NULL;
    loom_mcp_setup setup = {0};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    loom_run *run = NULL;
    mock_provider m;

    (void)state;
    assert_int_equal(loom_config_load_string(&cfg, "{}", "t"), 0);
    cfg->mcp_servers = servers;
    cfg->mcp_servers_len = 1;
    setup.background = 1;
    assert_int_equal(loom_tools_new_from_config_with(&reg, cfg, &setup), 0);
    cfg->mcp_servers = NULL;
    cfg->mcp_servers_len = 0;
    mock_init(&m, a, 2, 0);
    ro.provider = &m.base;
    ro.upstream_model = "m";
    ro.tools = reg;
    ro.tool_names = names;
    ro.tool_names_len = 1;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "go"), 0);
    assert_int_equal(loom_run_new(&run, &ro, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);
    assert_string_equal(loom_run_text(run), "done");
    assert_string_equal(m.seen[0].tools, "fake__echo,fake__hang,fake__die,"
                                         "fake__change,fake__unlisten,"
                                         "fake__stray");
    assert_string_equal(m.seen[1].tools, "fake__echo,fake__hang,fake__die,"
                                         "fake__change,fake__unlisten,"
                                         "fake__stray,fake__added");
    loom_run_free(run);
    loom_messages_free(&hist);
    mock_clear(&m);
    loom_tool_registry_free(reg);
    loom_config_free(cfg);
}

/*
 * Through the client: each change is counted once; one tagged with
 * another subscription is not; a restarted process and a subscription
 * the server ended are listened to again (the list stale meanwhile);
 * freeing the server cancels the open subscription.
 */
static void test_listen_again_and_cancel(void **state)
{
    char *log = test_tmp_path("mcp-listen.log");
    loom_mcp_server_config c = stateless_config(log);
    loom_mcp_server *s = NULL;
    json_t *res = NULL, *st;
    long long last = 0, cancelled = 0;

    (void)state;
    unlink(log);
    assert_int_equal(loom_mcp_server_new(&s, &c), 0);
    json_decref(c.env);
    call_ok(s, "echo");
    st = loom_mcp_server_status(s);
    assert_string_equal(
        json_string_value(json_object_get(st, "protocol_version")),
        "2026-07-28");
    json_decref(st);
    /* The fake reads stdin in order: the listen came before the call. */
    assert_int_equal(noted(log, "listen", NULL), 1);
    call_ok(s, "change");
    assert_int_equal(loom__mcp_lists_changed(s), 1);
    call_ok(s, "stray");
    assert_int_equal(loom__mcp_lists_changed(s), 1);

    /* A new process: listened to again, its list stale. */
    assert_int_equal(loom_mcp_server_call(s, "die", NULL, 0, NULL, &res),
                     LOOM_EUPSTREAM);
    call_ok(s, "echo");
    assert_int_equal(noted(log, "start", NULL), 2);
    assert_int_equal(noted(log, "listen", NULL), 2);
    assert_int_equal(loom__mcp_lists_changed(s), 2);
    call_ok(s, "change");
    assert_int_equal(loom__mcp_lists_changed(s), 3);

    /* The server ends it: stale, and opened again with the next call. */
    call_ok(s, "unlisten");
    assert_int_equal(loom__mcp_lists_changed(s), 4);
    call_ok(s, "echo");
    assert_int_equal(noted(log, "listen", &last), 3);
    call_ok(s, "change");
    assert_int_equal(loom__mcp_lists_changed(s), 5);

    loom_mcp_server_free(s);
    assert_int_equal(noted(log, "cancelled", &cancelled), 1);
    assert_int_equal(cancelled, last);
    unlink(log);
    free(log);
}

/*
 * A call of the era that times out over stdio, which has no stream per
 * request to close: the server is sent notifications/cancelled for it.
 */
static void test_timeout_cancels(void **state)
{
    char *log = test_tmp_path("mcp-listen-timeout.log");
    loom_mcp_server_config c = stateless_config(log);
    loom_mcp_server *s = NULL;
    json_t *res = NULL;

    (void)state;
    unlink(log);
    assert_int_equal(loom_mcp_server_new(&s, &c), 0);
    json_decref(c.env);
    assert_int_equal(loom_mcp_server_call(s, "hang", NULL, 200, NULL, &res),
                     LOOM_ETIMEDOUT);
    /* The server reads in order: once echo is answered, it has read the
     * cancellation sent before it. */
    call_ok(s, "echo");
    assert_int_equal(noted(log, "cancelled", NULL), 1);
    loom_mcp_server_free(s);
    unlink(log);
    free(log);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_sees_new_tool),
        cmocka_unit_test(test_listen_again_and_cancel),
        cmocka_unit_test(test_timeout_cancels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
