/*
 * Handoffs end to end (docs/agents.md "Handoffs"): a session from a YAML
 * config with a store, in front of loom-fake-upstream whose rules answer
 * by the system prompt, so each agent gets its own answers. A triage
 * agent hands over to a billing agent on another model; the test checks
 * the requests the fake saw (billing's prompt, tools and model after the
 * transfer), the agent.changed event, the stored messages (which agent
 * wrote each) and that the next turn of the conversation starts with the
 * agent the client names again.
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
#include <unistd.h>

static const char script[] =
    "{\"rules\": ["
    " {\"match\": {\"system\": \"You triage\"},"
    "  \"responses\": ["
    "   {\"tool_calls\": [{\"id\": \"call_t\", \"name\": "
    "\"transfer_to_billing\", \"arguments\": \"{\\\"reason\\\": "
    "\\\"an invoice\\\"}\"}]},"
    "   {\"text\": [\"Triage again.\"]}]},"
    " {\"match\": {\"system\": \"You do billing\", \"tools_include\": "
    "[\"get_time\", \"transfer_to_triage\"]},"
    "  \"responses\": [{\"text\": [\"Billing \", \"here.\"]}]}"
    "]}";

typedef struct {
    loom_fake *fake;
    loom_config *cfg;
    loom_store *store;
    char *path;
    loom_session *s;
} fx;

/* The agents of the first test: triage on fake/a hands over to billing
 * on fake/b. */
static const char agents_yaml[] =
    "agents:\n"
    "  triage:\n"
    "    model: fake/a\n"
    "    system_prompt: You triage requests.\n"
    "    tools: []\n"
    "    handoffs: [billing]\n"
    "  billing:\n"
    "    model: fake/b\n"
    "    description: Answers questions about invoices.\n"
    "    system_prompt: You do billing.\n"
    "    tools: [get_time]\n"
    "    handoffs: [triage]\n";

/* A session over a fake running script_text, with the models fake/a,
 * fake/b and fake/c and the agents of agents (YAML), triage the
 * default. */
static void fx_open_with(fx *f, const char *script_text, const char *agents)
{
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    char yaml[4096];

    memset(f, 0, sizeof(*f));
    assert_non_null(f->fake = fake_start_script(script_text));
    snprintf(yaml, sizeof(yaml),
             "providers:\n"
             "  fake: {base_url: '%s', retries: {max: 0}}\n"
             "models:\n"
             "  fake/a: {upstream: model-a}\n"
             "  fake/b: {upstream: model-b}\n"
             "  fake/c: {upstream: model-c}\n"
             "%s"
             "default_agent: triage\n",
             fake_base_url(f->fake), agents);
    if (loom_config_load_string(&f->cfg, yaml, "t.yaml") != 0)
        fail_msg("config: %s", loom_error_last());
    f->path = test_tmp_path("handoffs.db");
    unlink(f->path);
    assert_int_equal(loom_store_open(&f->store, f->path), 0);
    so.config = f->cfg;
    so.store = f->store;
    assert_int_equal(loom_session_new(&f->s, &so), 0);
}

static void fx_open(fx *f)
{
    fx_open_with(f, script, agents_yaml);
}

static void fx_close(fx *f)
{
    loom_session_free(f->s);
    loom_store_free(f->store);
    loom_config_free(f->cfg);
    fake_stop(f->fake);
    unlink(f->path);
    free(f->path);
}

static int keep_event(const loom_event *ev, void *payload)
{
    json_array_append_new(payload, loom_event_to_json(ev));
    return 0;
}

/* One turn of conversation conv (NULL: a new one) saying text; returns
 * the conversation's id (the caller frees). */
static char *turn(fx *f, const char *conv, const char *text, json_t *events)
{
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    loom_turn *t;
    char *id;

    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, text), 0);
    to.input = &in;
    to.conversation_id = conv;
    to.sink = (loom_sink){keep_event, events};
    if (loom_turn_new(&t, f->s, &to) != 0)
        fail_msg("turn: %s", loom_error_last());
    if (loom_turn_execute(t) != 0)
        fail_msg("turn: %s", loom_error_last());
    assert_true(loom_turn_stored(t));
    assert_non_null(id = strdup(loom_turn_conversation_id(t)));
    loom_turn_free(t);
    loom_messages_free(&in);
    return id;
}

static json_t *event_of(const json_t *events, const char *type)
{
    size_t i;
    json_t *e;

    json_array_foreach(events, i, e)
    {
        if (strcmp(json_string_value(json_object_get(e, "type")), type) == 0)
            return e;
    }
    return NULL;
}

static const char *str_at(const json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

/* The names of the tools a Chat Completions body offers, "a,b". */
static void tool_names(const json_t *body, char *out, size_t cap)
{
    size_t i;
    json_t *t;

    out[0] = '\0';
    json_array_foreach(json_object_get(body, "tools"), i, t)
    {
        size_t len = strlen(out);
        snprintf(out + len, cap - len, "%s%s", i ? "," : "",
                 str_at(json_object_get(t, "function"), "name"));
    }
}

static void test_handoff_through_session(void **state)
{
    fx f;
    json_t *events = json_array(), *ev, *req, *body, *conv, *msgs;
    char *id, *again, names[256];

    (void)state;
    fx_open(&f);
    id = turn(&f, NULL, "Why was I charged twice?", events);

    /* The events: the change between triage's turn and billing's. */
    assert_non_null(ev = event_of(events, "agent.changed"));
    assert_string_equal(str_at(ev, "from"), "triage");
    assert_string_equal(str_at(ev, "to"), "billing");
    assert_string_equal(str_at(ev, "reason"), "an invoice");
    assert_string_equal(str_at(ev, "model"), "fake/b");
    assert_string_equal(str_at(event_of(events, "run.started"), "agent"),
                        "triage");
    assert_string_equal(str_at(event_of(events, "run.completed"), "text"),
                        "Billing here.");

    /* What the fake saw: triage's request, then billing's. */
    assert_int_equal(fake_request_count(f.fake), 2);
    req = fake_request(f.fake, 0);
    body = json_object_get(req, "body");
    assert_string_equal(str_at(body, "model"), "model-a");
    tool_names(body, names, sizeof(names));
    assert_string_equal(names, "transfer_to_billing");
    assert_string_equal(
        str_at(
            json_object_get(json_array_get(json_object_get(body, "tools"), 0),
                            "function"),
            "description"),
        "Answers questions about invoices.");
    json_decref(req);
    req = fake_request(f.fake, 1);
    body = json_object_get(req, "body");
    assert_string_equal(str_at(body, "model"), "model-b");
    tool_names(body, names, sizeof(names));
    assert_string_equal(names, "get_time,transfer_to_triage");
    assert_string_equal(
        str_at(json_array_get(json_object_get(body, "messages"), 0), "content"),
        "You do billing.");
    json_decref(req);

    /* The stored messages say who wrote them. */
    assert_int_equal(loom_store_conversation_get(f.store, id, &conv), 0);
    msgs = json_object_get(conv, "messages");
    assert_int_equal(json_array_size(msgs), 4);
    assert_string_equal(str_at(json_array_get(msgs, 0), "role"), "user");
    assert_null(json_object_get(json_array_get(msgs, 0), "agent"));
    assert_string_equal(str_at(json_array_get(msgs, 1), "agent"), "triage");
    assert_string_equal(str_at(json_array_get(msgs, 2), "role"), "tool");
    assert_string_equal(str_at(json_array_get(msgs, 2), "content"),
                        "Transferred to billing.");
    assert_string_equal(str_at(json_array_get(msgs, 3), "agent"), "billing");
    assert_string_equal(str_at(json_array_get(msgs, 3), "content"),
                        "Billing here.");
    json_decref(conv);

    /* The handoff lasted for its run: the next turn is triage's again. */
    json_array_clear(events);
    again = turn(&f, id, "And now?", events);
    assert_string_equal(again, id);
    assert_null(event_of(events, "agent.changed"));
    assert_string_equal(str_at(event_of(events, "run.completed"), "text"),
                        "Triage again.");
    req = fake_request(f.fake, 2);
    assert_string_equal(str_at(json_object_get(req, "body"), "model"),
                        "model-a");
    json_decref(req);
    assert_int_equal(loom_store_conversation_get(f.store, id, &conv), 0);
    msgs = json_object_get(conv, "messages");
    assert_int_equal(json_array_size(msgs), 6);
    assert_string_equal(str_at(json_array_get(msgs, 5), "agent"), "triage");
    json_decref(conv);

    free(again);
    free(id);
    json_decref(events);
    fx_close(&f);
}

/* Triage answers on fake/a and hands over; billing answers on fake/b;
 * every answer reports usage. */
static const char script_usage[] =
    "{\"rules\": ["
    " {\"match\": {\"system\": \"You triage\"},"
    "  \"responses\": ["
    "   {\"tool_calls\": [{\"id\": \"call_t\", \"name\": "
    "\"transfer_to_billing\", \"arguments\": \"{}\"}],"
    "    \"usage\": {\"prompt_tokens\": 10, \"completion_tokens\": 1,"
    " \"total_tokens\": 11}}]},"
    " {\"match\": {\"system\": \"You do billing\"},"
    "  \"responses\": [{\"text\": [\"Billing here.\"],"
    "    \"usage\": {\"prompt_tokens\": 20, \"completion_tokens\": 2,"
    " \"total_tokens\": 22}}]}"
    "]}";

/* The usage row of the model call `iteration` of a stored
 * conversation. */
static const json_t *usage_row(const json_t *conv, int iteration)
{
    size_t i;
    json_t *u;

    json_array_foreach(json_object_get(conv, "usage"), i, u)
    {
        if (json_integer_value(json_object_get(u, "iteration")) == iteration)
            return u;
    }
    fail_msg("no usage row for iteration %d", iteration);
    return NULL;
}

/* Message i of msgs has want at key. */
static void assert_msg(const json_t *msgs, size_t i, const char *key,
                       const char *want)
{
    assert_string_equal(str_at(json_array_get(msgs, i), key), want);
}

/* Opens f on script_text and agents and runs one turn of a new
 * conversation, which must hand over; its events go to events and
 * *conv gets the stored conversation (the caller frees both). Returns
 * its messages. */
static json_t *handoff_turn(fx *f, const char *script_text, const char *agents,
                            json_t *events, json_t **conv)
{
    char *id;

    fx_open_with(f, script_text, agents);
    id = turn(f, NULL, "Why was I charged twice?", events);
    assert_non_null(event_of(events, "agent.changed"));
    assert_int_equal(loom_store_conversation_get(f->store, id, conv), 0);
    free(id);
    return json_object_get(*conv, "messages");
}

/* Each stored assistant message and usage row names the model of the
 * agent that wrote it: triage's on fake/a, billing's on fake/b. */
static void test_handoff_stores_each_model(void **state)
{
    fx f;
    json_t *events = json_array(), *conv, *msgs;

    (void)state;
    msgs = handoff_turn(&f, script_usage, agents_yaml, events, &conv);
    assert_int_equal(json_array_size(msgs), 4);
    assert_msg(msgs, 1, "agent", "triage");
    assert_msg(msgs, 1, "model", "fake/a");
    assert_msg(msgs, 3, "agent", "billing");
    assert_msg(msgs, 3, "model", "fake/b");
    assert_int_equal(json_array_size(json_object_get(conv, "usage")), 2);
    assert_string_equal(str_at(usage_row(conv, 1), "model"), "fake/a");
    assert_string_equal(str_at(usage_row(conv, 1), "agent"), "triage");
    assert_string_equal(str_at(usage_row(conv, 2), "model"), "fake/b");
    assert_string_equal(str_at(usage_row(conv, 2), "agent"), "billing");
    /* The conversation names the model of its last answer. */
    assert_string_equal(str_at(conv, "model"), "fake/b");
    json_decref(conv);

    json_decref(events);
    fx_close(&f);
}

/* Triage answers without a tool first (a retry), then, on its
 * model_after_retries model, hands over; billing has the same rule
 * and must start fresh, on its own model, with its own retry. */
static const char script_retries[] =
    "{\"rules\": ["
    " {\"match\": {\"system\": \"You triage\"},"
    "  \"responses\": ["
    "   {\"text\": [\"Let me see.\"]},"
    "   {\"tool_calls\": [{\"id\": \"call_t\", \"name\": "
    "\"transfer_to_billing\", \"arguments\": \"{}\"}]}]},"
    " {\"match\": {\"system\": \"You do billing\"},"
    "  \"responses\": [{\"text\": [\"Billing \"]},"
    "   {\"text\": [\"here.\"]}]}"
    "]}";

static const char agents_retries[] =
    "agents:\n"
    "  triage:\n"
    "    model: fake/a\n"
    "    system_prompt: You triage requests.\n"
    "    tools: []\n"
    "    handoffs: [billing]\n"
    "    retry_without_tool_calls: {max: 1}\n"
    "    model_after_retries: {retries: 1, model: fake/c}\n"
    "  billing:\n"
    "    model: fake/b\n"
    "    system_prompt: You do billing.\n"
    "    tools: [get_time]\n"
    "    retry_without_tool_calls: {max: 1}\n"
    "    model_after_retries: {retries: 1, model: fake/c}\n";

/* The upstream model of request i the fake saw. */
static void assert_request_model(fx *f, size_t i, const char *model)
{
    json_t *req = fake_request(f->fake, i);

    assert_non_null(req);
    assert_string_equal(str_at(json_object_get(req, "body"), "model"), model);
    json_decref(req);
}

static void test_handoff_starts_retries_fresh(void **state)
{
    fx f;
    json_t *events = json_array(), *conv, *msgs;

    (void)state;
    msgs = handoff_turn(&f, script_retries, agents_retries, events, &conv);

    /* Triage: its model, then (after one retry) its retry model.
     * Billing: its own model until its own retry, then the retry
     * model; the run ends after billing's one permitted retry. */
    assert_int_equal(fake_request_count(f.fake), 4);
    assert_request_model(&f, 0, "model-a");
    assert_request_model(&f, 1, "model-c");
    assert_request_model(&f, 2, "model-b");
    assert_request_model(&f, 3, "model-c");
    assert_string_equal(str_at(event_of(events, "run.completed"), "text"),
                        "here.");

    /* Each answer is stored with the model that wrote it. */
    assert_int_equal(json_array_size(msgs), 6);
    assert_msg(msgs, 1, "content", "Let me see.");
    assert_msg(msgs, 1, "model", "fake/a");
    assert_msg(msgs, 2, "model", "fake/c");
    assert_msg(msgs, 4, "content", "Billing ");
    assert_msg(msgs, 4, "model", "fake/b");
    assert_msg(msgs, 5, "model", "fake/c");
    json_decref(conv);

    json_decref(events);
    fx_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_handoff_through_session),
        cmocka_unit_test(test_handoff_stores_each_model),
        cmocka_unit_test(test_handoff_starts_retries_fresh),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
