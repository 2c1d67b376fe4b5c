/*
 * Elicitation through a turn (docs/mcp.md "Elicitation"): the fake MCP
 * server's elicit tool asks for a form during a call the model makes
 * through loom-fake-upstream; the turn emits mcp.elicitation and the
 * answer given to the turn (loom_turn_answer_elicitation, what POST
 * /v1/runs/{id}/input calls) reaches the server with the schema's
 * defaults filled in, after a content that does not fit is refused. A
 * turn nobody answers declines at once, and a server whose process has
 * nobody to ask is not told loom can elicit. The test waits on the
 * turn's event log, never on time.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fake.h"
#include "loom/mcp.h"
#include "loom/session.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char script[] =
    "{\"responses\": ["
    " {\"tool_calls\": [{\"id\": \"c1\", \"name\": \"fake__elicit\","
    "   \"arguments\": \"{}\"}]},"
    " {\"text\": [\"done\"]}]}";

typedef struct {
    loom_fake *fake;
    loom_config *cfg;
    loom_tool_registry *tools;
    loom_session *s;
    loom_turn *t;
} fx;

/* elicitation: whether the MCP servers' process has someone to ask. */
static void fx_open(fx *f, int elicitation)
{
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    loom_mcp_setup setup = {0};
    char *yaml = NULL;

    memset(f, 0, sizeof(*f));
    f->fake = fake_start_script(script);
    assert_non_null(f->fake);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake: {kind: openai, base_url: %s, api_key: k,"
                         " retries: {max: 0}}\n"
                         "routing: {retries: 0}\n"
                         "models:\n"
                         "  fake/m: {}\n"
                         "mcp_servers:\n"
                         "  fake: {command: %s, args: [form]}\n"
                         "agents:\n"
                         "  main: {model: fake/m, tools: [fake__elicit]}\n",
                         fake_base_url(f->fake), LOOM_FAKE_MCP_BIN) > 0);
    if (loom_config_load_string(&f->cfg, yaml, "t.yaml") != 0)
        print_error("config: %s\n", loom_error_last());
    assert_non_null(f->cfg);
    free(yaml);
    setup.elicitation = elicitation;
    assert_int_equal(loom_tools_new_from_config_with(&f->tools, f->cfg, &setup),
                     0);
    so.config = f->cfg;
    so.tools = f->tools;
    if (loom_session_new(&f->s, &so) != 0)
        print_error("session: %s\n", loom_error_last());
    assert_non_null(f->s);
}

static void fx_close(fx *f)
{
    loom_turn_free(f->t);
    loom_session_free(f->s);
    loom_tool_registry_free(f->tools);
    loom_config_free(f->cfg);
    fake_stop(f->fake);
}

static const char *sget(const json_t *o, const char *key)
{
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

/* Starts the turn of main on its own thread with the log on;
 * elicitation: whether someone answers its forms. */
static void start_turn(fx *f, int elicitation)
{
    loom_turn_options o = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};

    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "hi"), 0);
    o.agent = "main";
    o.input = &in;
    o.log = 1;
    o.elicitation = elicitation;
    if (loom_turn_start(&f->t, f->s, &o) != 0)
        print_error("turn: %s\n", loom_error_last());
    assert_non_null(f->t);
    loom_messages_free(&in);
}

/* The next logged event of type after *seq (the turn must not end
 * first), a new reference. */
static json_t *wait_event(fx *f, uint64_t *seq, const char *type)
{
    for (;;) {
        const loom_turn_event *e;
        while ((e = loom_turn_next_event(f->t, *seq)) != NULL) {
            *seq = e->seq;
            if (strcmp(e->type_name, type) == 0)
                return loom_turn_event_json(e);
        }
        assert_false(loom_turn_ended(f->t));
        assert_int_equal(loom_turn_wait(f->t, *seq, 20000), 1);
    }
}

/* Waits for the turn's end; the output of its tool call. */
static char *wait_output(fx *f, int *asked)
{
    const loom_turn_event *e;
    uint64_t seq = 0;
    char *out = NULL;

    while (!loom_turn_ended(f->t))
        assert_int_equal(loom_turn_wait(f->t, UINT64_MAX - 1, 20000), 1);
    *asked = 0;
    while ((e = loom_turn_next_event(f->t, seq)) != NULL) {
        seq = e->seq;
        *asked += e->type == LOOM_EV_MCP_ELICITATION;
        if (e->type == LOOM_EV_TOOL_COMPLETED) {
            json_t *j = loom_turn_event_json(e);
            out = strdup(sget(j, "output"));
            json_decref(j);
        }
    }
    assert_int_equal(loom_turn_status(f->t), LOOM_RUN_COMPLETED);
    assert_non_null(out);
    return out;
}

/*
 * The form comes as mcp.elicitation with the server, its message and
 * schema, an id, and the call it belongs to; content without the
 * required field, or of the wrong type, is refused; the accepted one
 * reaches the server with the default age filled in.
 */
static void test_accept(void **state)
{
    fx f;
    json_t *ev, *bad;
    uint64_t seq = 0;
    char *out, id[64];
    int asked;

    (void)state;
    fx_open(&f, 1);
    start_turn(&f, 1);
    ev = wait_event(&f, &seq, "mcp.elicitation");
    assert_string_equal(sget(ev, "server"), "fake");
    assert_string_equal(sget(ev, "message"), "Who are you?");
    assert_string_equal(sget(ev, "call_id"), "c1");
    assert_string_equal(sget(ev, "tool"), "fake__elicit");
    assert_string_equal(sget(ev, "run_id"), loom_turn_id(f.t));
    assert_string_equal(
        sget(json_object_get(
                 json_object_get(json_object_get(ev, "requestedSchema"),
                                 "properties"),
                 "name"),
             "type"),
        "string");
    snprintf(id, sizeof(id), "%s", sget(ev, "elicitation_id"));
    json_decref(ev);
    assert_true(id[0]);
    bad = json_pack("{s:i}", "age", 4);
    assert_int_equal(loom_turn_answer_elicitation(f.t, id, "accept", bad),
                     LOOM_EINVALID);
    json_decref(bad);
    bad = json_pack("{s:s,s:s}", "name", "Ada", "age", "old");
    assert_int_equal(loom_turn_answer_elicitation(f.t, id, "accept", bad),
                     LOOM_EINVALID);
    json_decref(bad);
    assert_int_equal(loom_turn_answer_elicitation(f.t, id, "maybe", NULL),
                     LOOM_EINVALID);
    assert_int_equal(
        loom_turn_answer_elicitation(f.t, "elicit_99", "decline", NULL),
        LOOM_ENOTFOUND);
    bad = json_pack("{s:s}", "name", "Ada");
    assert_int_equal(loom_turn_answer_elicitation(f.t, id, "accept", bad), 0);
    json_decref(bad);
    /* Answered once only. */
    assert_int_equal(loom_turn_answer_elicitation(f.t, id, "decline", NULL),
                     LOOM_ENOTFOUND);
    out = wait_output(&f, &asked);
    assert_string_equal(out, "{\"action\":\"accept\",\"content\":{\"age\":30,"
                             "\"name\":\"Ada\"}}");
    assert_int_equal(asked, 1);
    free(out);
    fx_close(&f);
}

/* Declined and cancelled forms reach the server as such. */
static void test_decline_and_cancel(void **state)
{
    static const char *const actions[] = {"decline", "cancel"};

    (void)state;
    for (size_t i = 0; i < 2; i++) {
        fx f;
        uint64_t seq = 0;
        json_t *ev;
        char *out, want[64];
        int asked;

        fx_open(&f, 1);
        start_turn(&f, 1);
        ev = wait_event(&f, &seq, "mcp.elicitation");
        assert_int_equal(loom_turn_answer_elicitation(
                             f.t, sget(ev, "elicitation_id"), actions[i], NULL),
                         0);
        json_decref(ev);
        out = wait_output(&f, &asked);
        snprintf(want, sizeof(want), "{\"action\":\"%s\"}", actions[i]);
        assert_string_equal(out, want);
        free(out);
        fx_close(&f);
    }
}

/* A turn nobody answers (a background run) declines without asking. */
static void test_nobody_declines(void **state)
{
    fx f;
    char *out;
    int asked;

    (void)state;
    fx_open(&f, 1);
    start_turn(&f, 0);
    out = wait_output(&f, &asked);
    assert_string_equal(out, "{\"action\":\"decline\"}");
    assert_int_equal(asked, 0);
    free(out);
    fx_close(&f);
}

/* A process with nobody to ask does not declare the capability. */
static void test_not_advertised(void **state)
{
    fx f;
    char *out;
    int asked;

    (void)state;
    fx_open(&f, 0);
    start_turn(&f, 0);
    out = wait_output(&f, &asked);
    assert_string_equal(out, "no elicitation capability");
    assert_int_equal(asked, 0);
    free(out);
    fx_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accept),
        cmocka_unit_test(test_decline_and_cancel),
        cmocka_unit_test(test_nobody_declines),
        cmocka_unit_test(test_not_advertised),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
