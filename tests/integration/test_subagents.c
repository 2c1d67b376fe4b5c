/*
 * Sub-agents (docs/agents.md "Sub-agents") through the session layer in
 * front of loom-fake-upstream, whose script rules answer each agent by
 * its system prompt or task, since parallel children call it in no fixed
 * order: a parent calling two children in parallel, one of which fails;
 * a child calling a grandchild, and a call past max_depth refused; the
 * sub-agents' calls counted toward the parent's iterations; exact usage
 * sums with each agent's share; cancelling the parent mid-tree aborts
 * every upstream request below it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fake.h"
#include "loom/session.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- fixtures ------------------------------------------------------------ */

typedef struct {
    loom_fake *fake;
    loom_config *cfg;
    loom_session *s;
    json_t *events;
} fx;

/* Providers and prices ($1 and $2 per million tokens: a prompt token
 * costs 1 micro-dollar, a completion token 2), then the agents; so
 * gives the session's other options. */
static void fx_open_with(fx *f, const char *script, const char *agents,
                         loom_session_options so)
{
    char *yaml = NULL;

    memset(f, 0, sizeof(*f));
    f->fake = fake_start_script(script);
    assert_non_null(f->fake);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake:\n"
                         "    kind: openai\n"
                         "    base_url: %s\n"
                         "    api_key: k\n"
                         "    retries: {max: 0}\n"
                         "routing: {retries: 0}\n"
                         "models:\n"
                         "  fake/m:\n"
                         "    prices: {input: 1, output: 2}\n"
                         "agents:\n%s",
                         fake_base_url(f->fake), agents) > 0);
    if (loom_config_load_string(&f->cfg, yaml, "t.yaml") != 0)
        print_error("config: %s\n", loom_error_last());
    assert_non_null(f->cfg);
    free(yaml);
    so.config = f->cfg;
    if (loom_session_new(&f->s, &so) != 0)
        print_error("session: %s\n", loom_error_last());
    assert_non_null(f->s);
    f->events = json_array();
}

static void fx_open(fx *f, const char *script, const char *agents)
{
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;

    fx_open_with(f, script, agents, so);
}

static void fx_close(fx *f)
{
    loom_session_free(f->s);
    loom_config_free(f->cfg);
    fake_stop(f->fake);
    json_decref(f->events);
}

static int keep_event(const loom_event *ev, void *payload)
{
    json_array_append_new(payload, loom_event_to_json(ev));
    return 0;
}

/* Runs agent on text to its end, which must complete with answer. */
static int run_turn(fx *f, const char *agent, const char *text,
                    loom_turn **out);

static loom_turn *run_ok(fx *f, const char *agent, const char *text,
                         const char *answer)
{
    loom_turn *t = NULL;
    int rc = run_turn(f, agent, text, &t);

    if (rc != 0)
        print_error("turn: %s\n", loom_error_last());
    assert_int_equal(rc, 0);
    assert_string_equal(loom_run_text(loom_turn_run(t)), answer);
    return t;
}

/* Runs agent on text to its end; returns loom_turn_execute's answer. */
static int run_turn(fx *f, const char *agent, const char *text, loom_turn **out)
{
    loom_turn_options o = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    int rc;

    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, text), 0);
    o.agent = agent;
    o.input = &in;
    o.sink = (loom_sink){keep_event, f->events};
    if (loom_turn_new(out, f->s, &o) != 0)
        print_error("turn: %s\n", loom_error_last());
    assert_non_null(*out);
    loom_messages_free(&in);
    rc = loom_turn_execute(*out);
    return rc;
}

/* The first event of the top run (not one nested from a sub-agent) of
 * type whose field key is val (NULL: any). */
static const json_t *find_event(const json_t *events, const char *type,
                                const char *key, const char *val)
{
    size_t i;
    json_t *e;

    json_array_foreach(events, i, e)
    {
        const char *v = key ? json_string_value(json_object_get(e, key)) : "";
        if (json_object_get(e, "parent_run_id"))
            continue;
        if (strcmp(json_string_value(json_object_get(e, "type")), type) == 0 &&
            (!key || (v && strcmp(v, val) == 0)))
            return e;
    }
    return NULL;
}

static json_int_t geti(const json_t *o, const char *path1, const char *path2)
{
    const json_t *v = json_object_get(o, path1);

    if (path2)
        v = json_object_get(v, path2);
    if (!json_is_integer(v))
        print_error("no integer at %s.%s\n", path1, path2 ? path2 : "");
    assert_true(json_is_integer(v));
    return json_integer_value(v);
}

/* The text of every message of a recorded request, joined. */
static char *request_text(const json_t *req)
{
    char *s =
        json_dumps(json_object_get(json_object_get(req, "body"), "messages"),
                   JSON_COMPACT);
    assert_non_null(s);
    return s;
}

/* The recorded requests whose messages contain needle. */
static size_t requests_with(const loom_fake *fk, const char *needle,
                            json_t **last)
{
    json_t *reqs = fake_requests(fk), *r;
    size_t i, n = 0;

    if (last)
        *last = NULL;
    json_array_foreach(reqs, i, r)
    {
        char *t = request_text(r);
        if (strstr(t, needle)) {
            n++;
            if (last) {
                json_decref(*last);
                *last = json_incref(r);
            }
        }
        free(t);
    }
    json_decref(reqs);
    return n;
}

/* ---- scenarios ----------------------------------------------------------- */

static const char two_children_script[] =
    "{\"rules\": ["
    " {\"match\": {\"system\": \"You are main\"}, \"responses\": ["
    "   {\"tool_calls\": ["
    "     {\"id\": \"call_r\", \"name\": \"researcher\","
    "      \"arguments\": \"{\\\"task\\\":\\\"find apples\\\"}\"},"
    "     {\"id\": \"call_w\", \"name\": \"writer\","
    "      \"arguments\": \"{\\\"task\\\":\\\"write pears\\\","
    "\\\"context\\\":\\\"be brief\\\"}\"}],"
    "    \"usage\": {\"prompt_tokens\": 100, \"completion_tokens\": 10,"
    "              \"total_tokens\": 110}},"
    "   {\"text\": [\"Main: 5 apples.\"],"
    "    \"usage\": {\"prompt_tokens\": 100, \"completion_tokens\": 10,"
    "              \"total_tokens\": 110}}]},"
    " {\"match\": {\"first_user\": \"find apples\"}, \"responses\": ["
    "   {\"text\": [\"5 \", \"apples\"],"
    "    \"usage\": {\"prompt_tokens\": 10, \"completion_tokens\": 5,"
    "              \"total_tokens\": 15}}]},"
    " {\"match\": {\"first_user\": \"write pears\"}, \"responses\": ["
    "   {\"status\": 400, \"error\": {\"message\": \"pears are banned\","
    "    \"type\": \"invalid_request_error\"}}]}"
    "]}";

static const char two_children_agents[] =
    "  main:\n"
    "    model: fake/m\n"
    "    system_prompt: You are main.\n"
    "    tools: []\n"
    "    sub_agents: [researcher, writer]\n"
    "  researcher:\n"
    "    model: fake/m\n"
    "    description: Finds facts.\n"
    "    system_prompt: You research.\n"
    "    tools: []\n"
    "  writer:\n"
    "    model: fake/m\n"
    "    system_prompt: You write.\n"
    "    tools: []\n";

/*
 * Two children in parallel: the researcher answers, the writer's model
 * call fails. The parent's model reads one result and one error and
 * answers; its usage is its own plus the researcher's, to the token and
 * micro-dollar, with each agent's share.
 */
static void test_parallel_children_one_failing(void **state)
{
    fx f;
    loom_turn *t;
    const json_t *ok, *failed, *done, *by;
    json_t *req = NULL, *reqs;
    char *txt;

    (void)state;
    fx_open(&f, two_children_script, two_children_agents);
    t = run_ok(&f, "main", "apples and pears?", "Main: 5 apples.");

    ok = find_event(f.events, "tool.completed", "id", "call_r");
    if (!ok || getenv("LOOM_TEST_VERBOSE")) {
        char *all = json_dumps(f.events, JSON_COMPACT);
        print_message("events: %s\n", all);
        free(all);
    }
    assert_non_null(ok);
    assert_string_equal(json_string_value(json_object_get(ok, "name")),
                        "researcher");
    failed = find_event(f.events, "tool.failed", "id", "call_w");
    assert_non_null(failed);
    txt = json_dumps(failed, JSON_COMPACT);
    assert_non_null(strstr(txt, "agent 'writer' failed"));
    assert_non_null(strstr(txt, "pears are banned"));
    free(txt);

    /* The children saw their system prompt and one user message. */
    assert_int_equal(requests_with(f.fake, "You research.", &req), 1);
    txt = request_text(req);
    assert_non_null(strstr(txt, "find apples"));
    assert_null(strstr(txt, "apples and pears"));
    free(txt);
    json_decref(req);
    assert_int_equal(requests_with(f.fake,
                                   "write pears\\n\\nContext:\\nbe "
                                   "brief",
                                   NULL),
                     1);
    /* The parent's second call read the answer and the failure. */
    reqs = fake_requests(f.fake);
    assert_int_equal(json_array_size(reqs), 4);
    json_decref(reqs);
    assert_int_equal(requests_with(f.fake, "pears are banned", &req), 1);
    txt = request_text(req);
    assert_non_null(strstr(txt, "5 apples"));
    assert_non_null(strstr(txt, "agent 'writer' failed"));
    free(txt);
    json_decref(req);

    done = find_event(f.events, "run.completed", NULL, NULL);
    assert_non_null(done);
    assert_int_equal(geti(done, "usage", "prompt_tokens"), 210);
    assert_int_equal(geti(done, "usage", "completion_tokens"), 25);
    assert_int_equal(geti(done, "usage", "total_tokens"), 235);
    assert_int_equal(geti(done, "usage", "cost_micros"), 210 + 2 * 25);
    by = json_object_get(json_object_get(done, "usage"), "by_agent");
    assert_int_equal(json_object_size(by), 3);
    assert_int_equal(geti(by, "main", "prompt_tokens"), 200);
    assert_int_equal(geti(by, "main", "cost_micros"), 240);
    assert_int_equal(geti(by, "researcher", "total_tokens"), 15);
    assert_int_equal(geti(by, "researcher", "cost_micros"), 20);
    assert_int_equal(geti(by, "writer", "total_tokens"), 0);
    /* No model call of the writer had a price: no cost for its share. */
    assert_null(json_object_get(json_object_get(by, "writer"), "cost_micros"));
    assert_int_equal(loom_run_usage(loom_turn_run(t))->cost_micros, 260);
    loom_turn_free(t);
    fx_close(&f);
}

static const char tree_script[] =
    "{\"rules\": ["
    " {\"match\": {\"system\": \"You are main\"}, \"responses\": ["
    "   {\"tool_calls\": [{\"id\": \"c1\", \"name\": \"researcher\","
    "     \"arguments\": \"{\\\"task\\\":\\\"dig\\\"}\"}],"
    "    \"usage\": {\"prompt_tokens\": 7, \"completion_tokens\": 1,"
    "              \"total_tokens\": 8}},"
    "   {\"text\": [\"main done\"],"
    "    \"usage\": {\"prompt_tokens\": 7, \"completion_tokens\": 1,"
    "              \"total_tokens\": 8}}]},"
    " {\"match\": {\"system\": \"You research\"}, \"responses\": ["
    "   {\"tool_calls\": [{\"id\": \"c2\", \"name\": \"fetcher\","
    "     \"arguments\": \"{\\\"task\\\":\\\"fetch it\\\"}\"}],"
    "    \"usage\": {\"prompt_tokens\": 5, \"completion_tokens\": 1,"
    "              \"total_tokens\": 6}},"
    "   {\"text\": [\"research done\"],"
    "    \"usage\": {\"prompt_tokens\": 5, \"completion_tokens\": 1,"
    "              \"total_tokens\": 6}}]},"
    " {\"match\": {\"system\": \"You fetch\"}, \"responses\": ["
    "   {\"tool_calls\": [{\"id\": \"c3\", \"name\": \"fetcher\","
    "     \"arguments\": \"{\\\"task\\\":\\\"deeper\\\"}\"}],"
    "    \"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 1,"
    "              \"total_tokens\": 4}},"
    "   {\"text\": [\"fetched\"],"
    "    \"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 1,"
    "              \"total_tokens\": 4}}]}"
    "]}";

static const char tree_agents[] = "  main:\n"
                                  "    model: fake/m\n"
                                  "    system_prompt: You are main.\n"
                                  "    tools: []\n"
                                  "    sub_agents: [researcher]\n"
                                  "    max_depth: 2\n"
                                  "    max_iterations: 5\n"
                                  "  researcher:\n"
                                  "    model: fake/m\n"
                                  "    system_prompt: You research.\n"
                                  "    tools: []\n"
                                  "    sub_agents: [fetcher]\n"
                                  "  fetcher:\n"
                                  "    model: fake/m\n"
                                  "    system_prompt: You fetch.\n"
                                  "    tools: []\n"
                                  "    sub_agents: [fetcher]\n";

/*
 * main -> researcher -> fetcher, whose call of itself would be depth 3
 * with max_depth 2: refused with an error its model reads. Usage sums
 * over the three levels; the children's calls count toward main's
 * iterations, so main's second call is its last (no tools offered).
 */
static void test_grandchild_and_depth_limit(void **state)
{
    fx f;
    loom_turn *t;
    const json_t *done, *by, *recs;
    json_t *req = NULL;
    char *txt;

    (void)state;
    fx_open(&f, tree_script, tree_agents);
    t = run_ok(&f, "main", "go", "main done");

    /* The fetcher's second call read the refusal. */
    assert_int_equal(requests_with(f.fake, "may nest 2 deep", &req), 1);
    txt = request_text(req);
    assert_non_null(strstr(txt, "You fetch."));
    assert_non_null(strstr(txt, "would be at depth 3"));
    free(txt);
    json_decref(req);
    /* The researcher read the fetcher's answer. */
    assert_int_equal(requests_with(f.fake, "fetched", NULL), 1);

    done = find_event(f.events, "run.completed", NULL, NULL);
    assert_int_equal(geti(done, "usage", "prompt_tokens"), 2 * (7 + 5 + 3));
    assert_int_equal(geti(done, "usage", "completion_tokens"), 6);
    assert_int_equal(geti(done, "usage", "cost_micros"), 30 + 12);
    by = json_object_get(json_object_get(done, "usage"), "by_agent");
    assert_int_equal(geti(by, "main", "total_tokens"), 16);
    assert_int_equal(geti(by, "researcher", "total_tokens"), 12);
    assert_int_equal(geti(by, "fetcher", "total_tokens"), 8);
    assert_int_equal(geti(by, "fetcher", "cost_micros"), 6 + 4);

    /* researcher: 2 model calls + 1 tool call + fetcher's 2 + 1: main's
     * second call counts 1 + 6 of its 5: its last, tools forbidden. */
    assert_int_equal(requests_with(f.fake, "research done", &req), 1);
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(req, "body"), "tool_choice")),
                        "none");
    json_decref(req);
    /* The children's tool records joined main's, marked with their
     * agent. */
    recs = loom_run_tool_records(loom_turn_run(t));
    assert_int_equal(json_array_size(recs), 3);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(recs, 1), "agent")),
        "researcher");
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(recs, 2), "agent")),
        "fetcher");
    loom_turn_free(t);
    fx_close(&f);
}

static int hanging(const loom_fake *fk);

/* main calls a researcher and a writer; the researcher calls a writer. */
#define HANG_AGENTS                                                            \
    "  main:\n"                                                                \
    "    model: fake/m\n"                                                      \
    "    system_prompt: You are main.\n"                                       \
    "    tools: []\n"                                                          \
    "    sub_agents: [researcher, writer]\n"                                   \
    "  researcher:\n"                                                          \
    "    model: fake/m\n"                                                      \
    "    system_prompt: You research.\n"                                       \
    "    tools: []\n"                                                          \
    "    sub_agents: [writer]\n"                                               \
    "  writer:\n"                                                              \
    "    model: fake/m\n"                                                      \
    "    system_prompt: You write.\n"                                          \
    "    tools: []\n"

/* ---- nested events ------------------------------------------------------- */

static const char *sget(const json_t *o, const char *key)
{
    const char *v = json_string_value(json_object_get(o, key));

    return v ? v : "";
}

/*
 * The stream's rules (docs/events.md "Nested events"): seq strictly
 * increasing, index never decreasing, every sub-agent's event with its
 * run_id, parent_run_id, parent_call_id, agent and depth.
 */
static void check_stream(const json_t *events)
{
    json_int_t seq = 0, index = 0;
    size_t i;
    json_t *e;

    json_array_foreach(events, i, e)
    {
        assert_true(geti(e, "seq", NULL) > seq);
        assert_true(geti(e, "index", NULL) >= index);
        seq = geti(e, "seq", NULL);
        index = geti(e, "index", NULL);
        if (!json_object_get(e, "parent_run_id"))
            continue;
        assert_true(*sget(e, "run_id"));
        assert_string_not_equal(sget(e, "run_id"), sget(e, "parent_run_id"));
        assert_true(*sget(e, "parent_call_id"));
        assert_true(*sget(e, "agent"));
        assert_true(geti(e, "depth", NULL) >= 1);
    }
}

/* The text of the tool.delta events of the top run's call `call`,
 * joined (a static buffer). */
static const char *call_deltas(const json_t *events, const char *call)
{
    static char text[256];
    size_t i;
    json_t *e;

    text[0] = '\0';
    json_array_foreach(events, i, e)
    {
        if (!json_object_get(e, "parent_run_id") &&
            strcmp(sget(e, "type"), "tool.delta") == 0 &&
            strcmp(sget(e, "call_id"), call) == 0)
            strncat(text, sget(e, "delta"), sizeof(text) - strlen(text) - 1);
    }
    return text;
}

/* How many events of agent's have type (NULL: any); each is checked to
 * be of run run_id (when not NULL), at depth, under call parent_call. */
static size_t count_nested(const json_t *events, const char *agent,
                           const char *type, const char *run_id, int depth,
                           const char *parent_call)
{
    size_t i, n = 0;
    json_t *e;

    json_array_foreach(events, i, e)
    {
        if (!json_object_get(e, "parent_run_id") ||
            strcmp(sget(e, "agent"), agent) != 0)
            continue;
        if (run_id)
            assert_string_equal(sget(e, "run_id"), run_id);
        assert_int_equal(geti(e, "depth", NULL), depth);
        assert_string_equal(sget(e, "parent_call_id"), parent_call);
        n += !type || strcmp(sget(e, "type"), type) == 0;
    }
    return n;
}

/* The first nested event of agent of type. */
static const json_t *nested_event(const json_t *events, const char *agent,
                                  const char *type)
{
    size_t i;
    json_t *e;

    json_array_foreach(events, i, e)
    {
        if (json_object_get(e, "parent_run_id") &&
            strcmp(sget(e, "agent"), agent) == 0 &&
            strcmp(sget(e, "type"), type) == 0)
            return e;
    }
    return NULL;
}

/*
 * main -> researcher -> fetcher: every event of the tree is in main's one
 * stream, in order; the researcher's carry depth 1 and main's call c1,
 * the fetcher's depth 2, the researcher's run and its call c2. main's
 * call streams the researcher's answer as tool.delta, and the
 * researcher's call the fetcher's. The usage events of the three add up
 * to run.completed's usage, exactly.
 */
static void test_nested_events(void **state)
{
    fx f;
    loom_turn *t;
    const json_t *rs, *fs, *calls, *done, *last;
    const char *main_id, *res_id;
    json_int_t total = 0;
    size_t i;
    json_t *e;

    (void)state;
    fx_open(&f, tree_script, tree_agents);
    t = run_ok(&f, "main", "go", "main done");
    main_id = loom_run_id(loom_turn_run(t));
    check_stream(f.events);

    rs = nested_event(f.events, "researcher", "run.started");
    assert_non_null(rs);
    assert_string_equal(sget(rs, "parent_run_id"), main_id);
    res_id = sget(rs, "run_id");
    fs = nested_event(f.events, "fetcher", "run.started");
    assert_non_null(fs);
    assert_string_equal(sget(fs, "parent_run_id"), res_id);
    /* Each event of a run says so, and where it hangs in the tree. */
    assert_int_equal(
        count_nested(f.events, "researcher", "run.completed", res_id, 1, "c1"),
        1);
    assert_int_equal(
        count_nested(f.events, "researcher", "usage", res_id, 1, "c1"), 2);
    assert_int_equal(count_nested(f.events, "fetcher", "run.completed",
                                  sget(fs, "run_id"), 2, "c2"),
                     1);
    assert_int_equal(count_nested(f.events, "fetcher", "usage", NULL, 2, "c2"),
                     2);
    /* The fetcher's refused call is the fetcher's own tool.failed. */
    assert_int_equal(
        count_nested(f.events, "fetcher", "tool.failed", NULL, 2, "c2"), 1);

    /* The answers stream to the calls that asked for them. */
    assert_string_equal(call_deltas(f.events, "c1"), "research done");
    assert_int_equal(
        count_nested(f.events, "researcher", "tool.delta", res_id, 1, "c1"), 1);
    assert_string_equal(
        sget(nested_event(f.events, "researcher", "tool.delta"), "delta"),
        "fetched");

    /* Children sit inside their call's position: from main's tool_calls
     * index on, and main's answer after all of them. */
    calls = find_event(f.events, "tool_calls", NULL, NULL);
    assert_true(geti(rs, "index", NULL) >= geti(calls, "index", NULL));
    assert_true(geti(fs, "index", NULL) >= geti(rs, "index", NULL));
    last = json_array_get(f.events, json_array_size(f.events) - 1);
    done = find_event(f.events, "run.completed", NULL, NULL);
    assert_ptr_equal(last, done);
    assert_string_equal(sget(done, "run_id"), main_id);

    /* Usage as it happens, nested, sums to the total. */
    json_array_foreach(f.events, i, e)
    {
        if (strcmp(sget(e, "type"), "usage") == 0)
            total += geti(e, "total_tokens", NULL);
    }
    assert_int_equal(total, geti(done, "usage", "total_tokens"));
    assert_int_equal(total, 36);
    loom_turn_free(t);
    fx_close(&f);
}

/*
 * Two children in parallel: their events interleave as they come, each
 * with its call; the failing writer's run.failed is in the stream, and
 * main's tool.completed for the researcher comes after the researcher's
 * own run.completed.
 */
static void test_parallel_nested_grouped(void **state)
{
    fx f;
    loom_turn *t;
    const json_t *rdone, *wfail, *ok;

    (void)state;
    fx_open(&f, two_children_script, two_children_agents);
    t = run_ok(&f, "main", "apples and pears?", "Main: 5 apples.");
    check_stream(f.events);
    assert_true(count_nested(f.events, "researcher", NULL, NULL, 1, "call_r") >
                0);
    assert_true(count_nested(f.events, "writer", NULL, NULL, 1, "call_w") > 0);
    rdone = nested_event(f.events, "researcher", "run.completed");
    assert_non_null(rdone);
    assert_string_equal(sget(rdone, "text"), "5 apples");
    wfail = nested_event(f.events, "writer", "run.failed");
    assert_non_null(wfail);
    assert_non_null(strstr(sget(json_object_get(wfail, "error"), "message"),
                           "pears are banned"));
    ok = find_event(f.events, "tool.completed", "id", "call_r");
    assert_true(geti(ok, "seq", NULL) > geti(rdone, "seq", NULL));
    assert_string_equal(call_deltas(f.events, "call_r"), "5 apples");
    assert_string_equal(call_deltas(f.events, "call_w"), "");
    loom_turn_free(t);
    fx_close(&f);
}

static const char timeout_script[] =
    "{\"rules\": ["
    " {\"match\": {\"system\": \"You are main\"}, \"responses\": ["
    "   {\"tool_calls\": ["
    "     {\"id\": \"call_r\", \"name\": \"researcher\","
    "      \"arguments\": \"{\\\"task\\\":\\\"dig\\\"}\"},"
    "     {\"id\": \"call_w\", \"name\": \"writer\","
    "      \"arguments\": \"{\\\"task\\\":\\\"write\\\"}\"}]},"
    "   {\"text\": [\"main done\"]}]},"
    " {\"match\": {\"system\": \"You research\"}, \"responses\": ["
    "   {\"tool_calls\": [{\"id\": \"c2\", \"name\": \"writer\","
    "     \"arguments\": \"{\\\"task\\\":\\\"notes\\\"}\"}],"
    "    \"usage\": {\"prompt_tokens\": 5, \"completion_tokens\": 1,"
    "              \"total_tokens\": 6}},"
    "   {\"text\": [\"half \", \"an answer\"], \"hang\": true,"
    "    \"hang_after_chunks\": 3}]},"
    " {\"match\": {\"system\": \"You write\"}, \"loop\": true,"
    "  \"responses\": ["
    "   {\"text\": [\"written\"],"
    "    \"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 1,"
    "              \"total_tokens\": 4}}]}"
    "]}";

/*
 * The researcher overruns main's tool timeout while its second model
 * call hangs after some text: it is stopped, not abandoned, so main's
 * tool.failed says it timed out and carries the researcher's partial
 * answer, and the usage it spent (its first call and its writer's) is
 * counted. Its sibling, a writer, is not affected.
 */
static void test_child_timeout(void **state)
{
    fx f;
    loom_turn *t;
    const json_t *failed, *done, *by;

    (void)state;
    /* The agents end the config: the tools' settings may follow. */
    fx_open(&f, timeout_script,
            HANG_AGENTS "tools:\n  researcher: {timeout_ms: 3000}\n");
    t = run_ok(&f, "main", "go", "main done");
    check_stream(f.events);
    failed = find_event(f.events, "tool.failed", "id", "call_r");
    assert_non_null(failed);
    assert_non_null(strstr(sget(failed, "error"), "timeout of 3000 ms"));
    assert_non_null(strstr(sget(failed, "error"), "agent 'researcher'"));
    assert_non_null(strstr(sget(failed, "output"), "Partial answer: half an "
                                                   "answer"));
    assert_non_null(find_event(f.events, "tool.completed", "id", "call_w"));
    /* The researcher's end is in the stream, and the hang was closed. */
    assert_non_null(nested_event(f.events, "researcher", "run.failed"));
    assert_int_equal(hanging(f.fake), 0);
    /* Its usage and its writer's count; main's calls reported none. */
    done = find_event(f.events, "run.completed", NULL, NULL);
    by = json_object_get(json_object_get(done, "usage"), "by_agent");
    assert_int_equal(geti(by, "researcher", "total_tokens"), 6);
    assert_int_equal(geti(by, "writer", "total_tokens"), 8);
    assert_int_equal(geti(done, "usage", "total_tokens"), 14);
    loom_turn_free(t);
    fx_close(&f);
}

/* The fake's responses hanging now (-1 when it cannot say). */
static int hanging(const loom_fake *fk)
{
    json_t *st = fake_stats(fk);
    int n = st ? (int)json_integer_value(json_object_get(st, "hanging")) : -1;

    json_decref(st);
    return n;
}

static void pause_ms(long ms)
{
    struct timespec ts = {0, ms * 1000000L};

    nanosleep(&ts, NULL);
}

static const char hang_script[] =
    "{\"rules\": ["
    " {\"match\": {\"system\": \"You are main\"}, \"responses\": ["
    "   {\"tool_calls\": ["
    "     {\"id\": \"call_r\", \"name\": \"researcher\","
    "      \"arguments\": \"{\\\"task\\\":\\\"find apples\\\"}\"},"
    "     {\"id\": \"call_w\", \"name\": \"writer\","
    "      \"arguments\": \"{\\\"task\\\":\\\"write pears\\\"}\"}]}]},"
    " {\"match\": {\"system\": \"You research\"}, \"responses\": ["
    "   {\"tool_calls\": [{\"id\": \"c2\", \"name\": \"writer\","
    "     \"arguments\": \"{\\\"task\\\":\\\"deep pears\\\"}\"}]}]},"
    " {\"match\": {\"system\": \"You write\"}, \"loop\": true, \"responses\": ["
    "   {\"text\": [\"never\"], \"hang\": true}]}"
    "]}";

/*
 * main -> researcher -> writer and main -> writer, both writers hanging
 * upstream. Cancelling main ends the whole tree: every hanging upstream
 * request is closed and the turn ends cancelled, within the 2 s.
 */
static void test_cancel_mid_tree(void **state)
{
    fx f;
    loom_turn *t = NULL;
    loom_turn_options o = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    long long deadline, cancelled_at;

    (void)state;
    fx_open(&f, hang_script, HANG_AGENTS);
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "go"), 0);
    o.agent = "main";
    o.input = &in;
    assert_int_equal(loom_turn_start(&t, f.s, &o), 0);
    loom_messages_free(&in);
    /* Waits (polling the fake) until both writers hang upstream. */
    deadline = test_now_ms() + 20000;
    while (hanging(f.fake) < 2 && test_now_ms() < deadline)
        pause_ms(10);
    assert_int_equal(hanging(f.fake), 2);
    cancelled_at = test_now_ms();
    assert_int_equal(loom_turn_cancel(t), 1);
    assert_int_equal(loom_turn_wait(t, UINT64_MAX - 1, 10000), 1);
    while (hanging(f.fake) != 0 && test_now_ms() < cancelled_at + 10000)
        pause_ms(10);
    assert_int_equal(hanging(f.fake), 0);
    assert_true(test_now_ms() - cancelled_at < 2000);
    assert_true(loom_turn_ended(t));
    assert_int_equal(loom_turn_status(t), LOOM_RUN_CANCELLED);
    loom_turn_free(t);
    fx_close(&f);
}

/* An embedder's registry: any agent of a session wrapped as a tool. */
static void test_agent_tool_api(void **state)
{
    fx f;
    loom_tool_registry *reg;
    loom_agent_tool_options ao = LOOM_AGENT_TOOL_OPTIONS_INIT;
    const loom_tool *tool;

    (void)state;
    fx_open(&f, two_children_script, two_children_agents);
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    assert_int_equal(loom_session_agent_tool(reg, f.s, "researcher", NULL), 0);
    tool = loom_tool_registry_get(reg, "researcher");
    assert_non_null(tool);
    assert_string_equal(tool->description, "Finds facts.");
    assert_non_null(json_object_get(
        json_object_get(tool->parameters, "properties"), "task"));
    ao.name = "ask_writer";
    assert_int_equal(loom_session_agent_tool(reg, f.s, "writer", &ao), 0);
    assert_non_null(strstr(
        loom_tool_registry_get(reg, "ask_writer")->description, "'writer'"));
    assert_int_equal(loom_session_agent_tool(reg, f.s, "writer", &ao),
                     LOOM_EEXISTS);
    assert_int_equal(loom_session_agent_tool(reg, f.s, "nobody", NULL),
                     LOOM_ENOTFOUND);
    /* The tools hold the session: it may be freed first. */
    loom_session_free(f.s);
    f.s = NULL;
    loom_tool_registry_free(reg);
    fx_close(&f);
}

/*
 * The agent hooks' on_tool_progress of a run sees its sub-agents' steps
 * too, at any depth, with whose they are: main calls helper, which runs
 * `steps` and then calls fetcher, which runs `steps`. main's hook sees
 * all four steps, each with the run, agent, depth and parent call of
 * the sub-agent that made it; helper's sees its own two as its own and
 * fetcher's two as nested.
 */
static const char progress_script[] =
    "{\"rules\": ["
    " {\"match\": {\"system\": \"You are main\"}, \"responses\": ["
    "   {\"tool_calls\": [{\"id\": \"call_h\", \"name\": \"helper\","
    "     \"arguments\": \"{\\\"task\\\":\\\"help me\\\"}\"}]},"
    "   {\"text\": [\"main done\"]}]},"
    " {\"match\": {\"first_user\": \"help me\"}, \"responses\": ["
    "   {\"tool_calls\": [{\"id\": \"c_s\", \"name\": \"steps\","
    "     \"arguments\": \"{}\"}]},"
    "   {\"tool_calls\": [{\"id\": \"call_f\", \"name\": \"fetcher\","
    "     \"arguments\": \"{\\\"task\\\":\\\"fetch it\\\"}\"}]},"
    "   {\"text\": [\"helped\"]}]},"
    " {\"match\": {\"first_user\": \"fetch it\"}, \"responses\": ["
    "   {\"tool_calls\": [{\"id\": \"c_s2\", \"name\": \"steps\","
    "     \"arguments\": \"{}\"}]},"
    "   {\"text\": [\"fetched\"]}]}"
    "]}";

static const char progress_agents[] = "  main:\n"
                                      "    model: fake/m\n"
                                      "    system_prompt: You are main.\n"
                                      "    tools: []\n"
                                      "    sub_agents: [helper]\n"
                                      "  helper:\n"
                                      "    model: fake/m\n"
                                      "    description: Helps.\n"
                                      "    system_prompt: You help.\n"
                                      "    tools: [steps]\n"
                                      "    sub_agents: [fetcher]\n"
                                      "  fetcher:\n"
                                      "    model: fake/m\n"
                                      "    description: Fetches.\n"
                                      "    system_prompt: You fetch.\n"
                                      "    tools: [steps]\n";

static int steps_exec(const json_t *args, const loom_tool_ctx *ctx,
                      loom_buf *out, void *payload)
{
    (void)args;
    (void)payload;
    loom_tool_progress(ctx, "Searching", "SEARCH", "running");
    loom_tool_progress(ctx, "Done", NULL, "done");
    return loom_buf_puts(out, "steps done");
}

/* on_tool_progress: keeps a copy of each step in the payload's array
 * (each agent's hooks have their own; each runs on its run's thread). */
static void keep_progress(const loom_agent_state *st, const json_t *progress,
                          void *payload)
{
    (void)st;
    json_array_append_new(payload, json_deep_copy(progress));
}

/* The steps of seen whose agent is agent (NULL: the run's own, with no
 * parent_run_id); each must have call_id and the labels in order. */
static size_t steps_of(const json_t *seen, const char *agent,
                       const char *call_id)
{
    static const char *const labels[] = {"Searching", "Done"};
    size_t i, n = 0;
    json_t *p;

    json_array_foreach(seen, i, p)
    {
        const char *a = sget(p, "agent");
        if (agent ? !a || strcmp(a, agent) != 0
                  : json_object_get(p, "parent_run_id") != NULL)
            continue;
        assert_string_equal(sget(p, "call_id"), call_id);
        assert_string_equal(sget(p, "tool"), "steps");
        assert_true(n < 2);
        assert_string_equal(sget(p, "label"), labels[n]);
        n++;
    }
    return n;
}

static void test_progress_hook_sees_sub_agents(void **state)
{
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    loom_agent_hooks main_hooks = LOOM_AGENT_HOOKS_INIT;
    loom_agent_hooks helper_hooks = LOOM_AGENT_HOOKS_INIT;
    json_t *main_seen = json_array(), *helper_seen = json_array();
    loom_session_agent_hooks per_agent[2];
    loom_tool_registry *reg;
    loom_tool steps = {0};
    const json_t *hs, *fs, *p;
    loom_turn *t;
    fx f;
    size_t i;

    (void)state;
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    steps.name = "steps";
    steps.description = "Reports two steps.";
    steps.execute = steps_exec;
    assert_int_equal(loom_tool_registry_add(reg, &steps), 0);
    main_hooks.on_tool_progress = keep_progress;
    main_hooks.payload = main_seen;
    helper_hooks.on_tool_progress = keep_progress;
    helper_hooks.payload = helper_seen;
    per_agent[0] = (loom_session_agent_hooks){"main", &main_hooks};
    per_agent[1] = (loom_session_agent_hooks){"helper", &helper_hooks};
    so.tools = reg;
    so.agent_hooks = per_agent;
    so.agent_hooks_len = 2;
    fx_open_with(&f, progress_script, progress_agents, so);
    t = run_ok(&f, "main", "go", "main done");
    hs = nested_event(f.events, "helper", "run.started");
    fs = nested_event(f.events, "fetcher", "run.started");
    assert_non_null(hs);
    assert_non_null(fs);

    /* main: no step of its own; helper's and fetcher's, nested. */
    assert_int_equal(json_array_size(main_seen), 4);
    assert_int_equal(steps_of(main_seen, NULL, "c_s"), 0);
    assert_int_equal(steps_of(main_seen, "helper", "c_s"), 2);
    assert_int_equal(steps_of(main_seen, "fetcher", "c_s2"), 2);
    json_array_foreach(main_seen, i, p)
    {
        const json_t *started =
            strcmp(sget(p, "agent"), "helper") == 0 ? hs : fs;
        assert_string_equal(sget(p, "run_id"), sget(started, "run_id"));
        assert_string_equal(sget(p, "parent_run_id"),
                            sget(started, "parent_run_id"));
        assert_string_equal(sget(p, "parent_call_id"),
                            started == hs ? "call_h" : "call_f");
        assert_int_equal(geti(p, "depth", NULL), started == hs ? 1 : 2);
    }
    /* helper: its own two, then fetcher's. */
    assert_int_equal(json_array_size(helper_seen), 4);
    assert_int_equal(steps_of(helper_seen, NULL, "c_s"), 2);
    assert_int_equal(steps_of(helper_seen, "fetcher", "c_s2"), 2);

    loom_turn_free(t);
    fx_close(&f);
    loom_tool_registry_free(reg);
    json_decref(main_seen);
    json_decref(helper_seen);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parallel_children_one_failing),
        cmocka_unit_test(test_grandchild_and_depth_limit),
        cmocka_unit_test(test_nested_events),
        cmocka_unit_test(test_progress_hook_sees_sub_agents),
        cmocka_unit_test(test_parallel_nested_grouped),
        cmocka_unit_test(test_child_timeout),
        cmocka_unit_test(test_cancel_mid_tree),
        cmocka_unit_test(test_agent_tool_api),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
