/*
 * Unit tests of the system prompt's assembly (prompt.c) and of how a run
 * sends it (run.c): the order of its sections, usage rules only for the
 * tools offered, descriptions from the agent's registry, the memories
 * section's bounds, the text kept at one address while it is unchanged,
 * and few-shot examples sent after the system messages, only for the
 * models an agent lists, and never kept with the run's messages.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "agent/model_opts.h"
#include "agent/prompt.h"
#include "loom/run.h"
#include "mock_provider.h"

#include <stdlib.h>
#include <string.h>

#define NO_PLAN                                                                \
    "<plan>\nNo plan exists yet. For a request of several steps, create "      \
    "one with todo_write first.\n</plan>"

/* ---- the assembly ------------------------------------------------------ */

static void test_order(void **state)
{
    static const loom_tool_def tools[] = {
        {.name = "alpha"}, {.name = "beta"}, {.name = "gamma"}};
    static const loom_agent_tool_doc docs[] = {
        {"beta", "Beta, described anew.", "registry beta"},
        {"delta", NULL, "registry delta"}};
    json_t *settings = json_pack(
        "{s:{s:s}, s:{s:s}, s:{s:s}, s:{s:i}}", "alpha", "selection_rule",
        "settings alpha", "beta", "selection_rule", "settings beta", "delta",
        "selection_rule", "not offered", "gamma", "timeout_ms", 5);
    loom__prompt_parts p = {.base = "You are terse.",
                            .tools = tools,
                            .ntools = 3,
                            .tool_settings = settings,
                            .docs = docs,
                            .ndocs = 2,
                            .memories = "<memories>\nM\n</memories>"};
    loom__plan *plan;
    char *text;

    (void)state;
    assert_int_equal(loom__plan_new(&plan), 0);
    p.plan = plan;
    assert_int_equal(loom__prompt_system_text(&text, &p), 0);
    assert_string_equal(text, "You are terse.\n\n"
                              "<tool_usage>\n"
                              "- alpha: settings alpha\n"
                              "- beta: registry beta\n"
                              "</tool_usage>\n\n"
                              "<memories>\nM\n</memories>\n\n" NO_PLAN);
    free(text);
    /* Each part may be missing; no section starts with a blank line. */
    p.base = NULL;
    p.plan = NULL;
    p.memories = NULL;
    assert_int_equal(loom__prompt_system_text(&text, &p), 0);
    assert_string_equal(text, "<tool_usage>\n- alpha: settings alpha\n"
                              "- beta: registry beta\n</tool_usage>");
    free(text);
    p.ntools = 0;
    assert_int_equal(loom__prompt_system_text(&text, &p), 0);
    assert_string_equal(text, "");
    free(text);
    p.plan = plan;
    assert_int_equal(loom__prompt_system_text(&text, &p), 0);
    assert_string_equal(text, NO_PLAN);
    free(text);
    assert_ptr_equal(loom__prompt_doc(docs, 2, "delta"), &docs[1]);
    assert_null(loom__prompt_doc(docs, 2, "alpha"));
    loom__plan_free(plan);
    json_decref(settings);
}

static json_t *memories(int n, size_t len)
{
    json_t *a = json_array();
    char *s = malloc(len + 1);

    for (int i = 0; i < n; i++) {
        memset(s, 'a' + i % 26, len);
        s[len] = '\0';
        json_array_append_new(a, json_pack("{s:s}", "content", s));
    }
    free(s);
    return a;
}

/* At most LOOM__PROMPT_MEMORIES_MAX memories and _BYTES of them, quoted;
 * the section says how many more there are. */
static void test_memories(void **state)
{
    json_t *m = json_pack("[{s:s}]", "content", "Says \"hi\"\nthen leaves");
    char *text;
    const char *p;
    int lines = 0;

    (void)state;
    assert_int_equal(loom__prompt_memories(&text, m, 1), 0);
    assert_non_null(strstr(text, "\n- \"Says \\\"hi\\\"\\nthen leaves\"\n"
                                 "</memories>"));
    assert_true(strncmp(text, "<memories>\n", 11) == 0);
    free(text);
    json_decref(m);

    m = memories(25, 3);
    assert_int_equal(loom__prompt_memories(&text, m, 30), 0);
    for (p = text; (p = strstr(p, "\n- \"")) != NULL; p++)
        lines++;
    assert_int_equal(lines, LOOM__PROMPT_MEMORIES_MAX);
    assert_non_null(strstr(text, "\"ttt\"\n(10 more memories are not shown "
                                 "here; memory_retrieve finds them.)\n"
                                 "</memories>"));
    free(text);
    json_decref(m);

    /* 1,000 bytes each: four fit in 4 KiB. */
    m = memories(10, 1000);
    assert_int_equal(loom__prompt_memories(&text, m, 10), 0);
    lines = 0;
    for (p = text; (p = strstr(p, "\n- \"")) != NULL; p++)
        lines++;
    assert_int_equal(lines, 4);
    assert_non_null(strstr(text, "(6 more memories are not shown"));
    free(text);
    json_decref(m);

    /* One too long for the section is still announced. */
    m = memories(1, 5000);
    assert_int_equal(loom__prompt_memories(&text, m, 1), 0);
    assert_null(strstr(text, "aaaa"));
    assert_non_null(strstr(text, "(1 more memory is not shown here"));
    free(text);
    json_decref(m);

    m = json_array();
    assert_int_equal(loom__prompt_memories(&text, m, 0), 0);
    assert_null(text);
    json_decref(m);
}

/* ---- a run ------------------------------------------------------------- */

/* What each request carried, seen through the mock's usage callback. */
typedef struct {
    int n;
    const char *system[MOCK_MAX_TURNS]; /* the system text's address */
    json_t *reqs; /* [{"system", "roles", "contents", "tools"}] */
} seen;

static const char *role_letter(loom_role r)
{
    switch (r) {
    case LOOM_ROLE_SYSTEM:
        return "s";
    case LOOM_ROLE_USER:
        return "u";
    case LOOM_ROLE_ASSISTANT:
        return "a";
    default:
        return "t";
    }
}

static void on_request(const loom_llm_request *req, loom_usage *u,
                       void *payload)
{
    seen *s = payload;
    json_t *r =
        json_pack("{s:s, s:[], s:{}}", "roles", "", "contents", "tools");
    char roles[64] = "";

    (void)u;
    for (size_t i = 0; i < req->messages_len && i < 63; i++) {
        strcat(roles, role_letter(req->messages[i].role));
        json_array_append_new(json_object_get(r, "contents"),
                              json_string(req->messages[i].content
                                              ? req->messages[i].content
                                              : ""));
    }
    json_object_set_new(r, "roles", json_string(roles));
    for (size_t i = 0; i < req->tools_len; i++)
        json_object_set_new(json_object_get(r, "tools"), req->tools[i].name,
                            json_string(req->tools[i].description));
    s->system[s->n++] =
        req->messages_len && req->messages[0].role == LOOM_ROLE_SYSTEM
            ? req->messages[0].content
            : NULL;
    json_array_append_new(s->reqs, r);
}

static int echo_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    (void)args;
    (void)ctx;
    (void)payload;
    return loom_buf_puts(out, "echoed");
}

static loom_tool_registry *make_tools(void)
{
    loom_tool_registry *reg;
    loom_tool t;

    assert_int_equal(loom_tool_registry_new(&reg), 0);
    memset(&t, 0, sizeof(t));
    t.execute = echo_exec;
    t.name = "echo";
    t.description = "echoes text";
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "other";
    t.description = "another tool";
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "hidden";
    t.description = "not offered";
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    return reg;
}

typedef struct {
    mock_provider mock;
    loom_tool_registry *reg;
    loom_run *run;
    seen s;
} harness;

static void run_with(harness *h, const mock_answer *a, int n,
                     loom_run_options *ro, const loom_messages *history)
{
    loom_messages hist = {0};

    memset(&h->s, 0, sizeof(h->s));
    h->s.reqs = json_array();
    mock_init(&h->mock, a, n, MOCK_STREAM_CALLS);
    h->mock.usage = on_request;
    h->mock.usage_payload = &h->s;
    h->reg = make_tools();
    ro->provider = &h->mock.base;
    ro->model = "mock/m";
    ro->upstream_model = "m";
    ro->tools = h->reg;
    if (!history) {
        assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "hi"), 0);
        history = &hist;
    }
    assert_int_equal(loom_run_new(&h->run, ro, history), 0);
    loom_messages_free(&hist);
    assert_int_equal(loom_run_execute(h->run), 0);
}

static void harness_free(harness *h)
{
    loom_run_free(h->run);
    loom_tool_registry_free(h->reg);
    json_decref(h->s.reqs);
    mock_clear(&h->mock);
}

static const char *req_str(const harness *h, int k, const char *key)
{
    return json_string_value(
        json_object_get(json_array_get(h->s.reqs, k), key));
}

static const char *req_content(const harness *h, int k, int i)
{
    return json_string_value(json_array_get(
        json_object_get(json_array_get(h->s.reqs, k), "contents"), i));
}

static const char *req_tool(const harness *h, int k, const char *name)
{
    return json_string_value(json_object_get(
        json_object_get(json_array_get(h->s.reqs, k), "tools"), name));
}

#define PLAN_ARGS                                                              \
    "{\"goal\":\"Say "                                                         \
    "hi\",\"tasks\":[{\"id\":\"a\",\"description\":\"Greet\"}]}"

/* The model sees the prompt, the rules of the tools offered, the
 * memories and the plan, in that order; the registry's description
 * replaces the tool's; the text keeps its address until the plan
 * changes it. */
static void test_run_system_text(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "echo", "{}"}}, .ncalls = 1},
        {.calls = {{"c2", "todo_write", PLAN_ARGS}}, .ncalls = 1},
        {.text = "done"}};
    static const char *const names[] = {"echo", "other"};
    static const loom_agent_tool_doc docs[] = {
        {"echo", "Echoes, as the registry says.", NULL},
        {"other", NULL, "Use other for anything else."},
        {"hidden", NULL, "Never shown."}};
    json_t *settings = json_pack("{s:{s:s}, s:{s:s}}", "echo", "selection_rule",
                                 "Use echo to repeat.", "hidden",
                                 "selection_rule", "Not offered.");
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;

    (void)state;
    ro.system_prompt = "Be brief.";
    ro.tool_names = names;
    ro.tool_names_len = 2;
    ro.tool_settings = settings;
    ro.tool_docs = docs;
    ro.tool_docs_len = 3;
    ro.memories = "<memories>\n- \"likes tea\"\n</memories>";
    ro.planning = 1;
    run_with(&h, a, 3, &ro, NULL);
    assert_int_equal(h.s.n, 3);
    assert_string_equal(req_str(&h, 0, "roles"), "su");
    assert_string_equal(req_content(&h, 0, 0),
                        "Be brief.\n\n"
                        "<tool_usage>\n"
                        "- echo: Use echo to repeat.\n"
                        "- other: Use other for anything else.\n"
                        "</tool_usage>\n\n"
                        "<memories>\n- \"likes tea\"\n</memories>\n\n" NO_PLAN);
    assert_string_equal(req_tool(&h, 0, "echo"),
                        "Echoes, as the registry says.");
    assert_string_equal(req_tool(&h, 0, "other"), "another tool");
    assert_null(req_tool(&h, 0, "hidden"));
    /* Unchanged: the same text at the same address. */
    assert_ptr_equal(h.s.system[0], h.s.system[1]);
    /* The plan changed it: a new text, the same head. */
    assert_ptr_not_equal(h.s.system[1], h.s.system[2]);
    assert_true(strncmp(req_content(&h, 2, 0), req_content(&h, 0, 0),
                        strlen(req_content(&h, 0, 0)) - strlen(NO_PLAN)) == 0);
    assert_non_null(
        strstr(req_content(&h, 2, 0), "</memories>\n\n<plan>\nGoal: Say hi\n"));
    harness_free(&h);
    json_decref(settings);
}

/* Memories alone make a system message. */
static void test_run_memories_only(void **state)
{
    static const mock_answer a[] = {{.text = "ok"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    harness h;

    (void)state;
    ro.memories = "<memories>\n- \"x\"\n</memories>";
    run_with(&h, a, 1, &ro, NULL);
    assert_string_equal(req_str(&h, 0, "roles"), "su");
    assert_string_equal(req_content(&h, 0, 0), ro.memories);
    harness_free(&h);
}

/* Examples follow the system messages (the summary too) and come before
 * the conversation in every request; they are never the run's. */
static void test_run_few_shot(void **state)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "echo", "{}"}}, .ncalls = 1}, {.text = "done"}};
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_messages shots = {0}, hist = {0};
    const loom_messages *added;
    harness h;

    (void)state;
    assert_int_equal(loom_messages_add(&shots, LOOM_ROLE_USER, "Q1"), 0);
    assert_int_equal(loom_messages_add(&shots, LOOM_ROLE_ASSISTANT, "A1"), 0);
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "earlier"), 0);
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_ASSISTANT, "reply"), 0);
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "hi"), 0);
    ro.system_prompt = "Sys.";
    ro.few_shot = shots.items;
    ro.few_shot_len = shots.len;
    ro.context.window = 100000;
    ro.context.summary = "They talked.";
    ro.context.summary_covers = 2;
    ro.context.no_summary = 1;
    run_with(&h, a, 2, &ro, &hist);
    assert_string_equal(req_str(&h, 0, "roles"), "ssuau");
    assert_string_equal(req_content(&h, 0, 0), "Sys.");
    assert_non_null(strstr(req_content(&h, 0, 1), "They talked."));
    assert_string_equal(req_content(&h, 0, 2), "Q1");
    assert_string_equal(req_content(&h, 0, 3), "A1");
    assert_string_equal(req_content(&h, 0, 4), "hi");
    assert_string_equal(req_str(&h, 1, "roles"), "ssuauat");
    added = loom_run_messages(h.run);
    for (size_t i = 0; i < added->len; i++)
        assert_true(added->items[i].content == NULL ||
                    (strcmp(added->items[i].content, "Q1") != 0 &&
                     strcmp(added->items[i].content, "A1") != 0));
    harness_free(&h);
    loom_messages_free(&shots);
    loom_messages_free(&hist);
}

/* An agent's examples go to the models it lists only (none: all). */
static void test_few_shot_models(void **state)
{
    loom_agent_example ex[] = {{"Q", "A"}};
    char *models[] = {"p/m"};
    loom_agent_config agent;
    loom__run_context rc;
    loom_run_options o = LOOM_RUN_OPTIONS_INIT;

    (void)state;
    memset(&agent, 0, sizeof(agent));
    agent.few_shot.examples = ex;
    agent.few_shot.examples_len = 1;
    agent.few_shot.models = models;
    agent.few_shot.models_len = 1;
    memset(&rc, 0, sizeof(rc));
    o.model = "p/m";
    assert_int_equal(loom__run_agent_setup(&rc, &o, NULL, &agent, NULL), 0);
    assert_int_equal(o.few_shot_len, 2);
    assert_int_equal(o.few_shot[0].role, LOOM_ROLE_USER);
    assert_string_equal(o.few_shot[0].content, "Q");
    assert_int_equal(o.few_shot[1].role, LOOM_ROLE_ASSISTANT);
    assert_string_equal(o.few_shot[1].content, "A");
    loom__run_context_free(&rc);

    o = (loom_run_options)LOOM_RUN_OPTIONS_INIT;
    o.model = "p/other";
    assert_int_equal(loom__run_agent_setup(&rc, &o, NULL, &agent, NULL), 0);
    assert_int_equal(o.few_shot_len, 0);
    assert_null(o.few_shot);
    loom__run_context_free(&rc);

    agent.few_shot.models_len = 0;
    assert_int_equal(loom__run_agent_setup(&rc, &o, NULL, &agent, NULL), 0);
    assert_int_equal(o.few_shot_len, 2);
    loom__run_context_free(&rc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order),
        cmocka_unit_test(test_memories),
        cmocka_unit_test(test_run_system_text),
        cmocka_unit_test(test_run_memories_only),
        cmocka_unit_test(test_run_few_shot),
        cmocka_unit_test(test_few_shot_models),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
