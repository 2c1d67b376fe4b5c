/*
 * The agent's loop keys end to end: a session turn of a YAML agent with
 * retry_without_tool_calls and model_after_retries against the fake
 * upstream, whose rules answer by what the request holds (the retry note,
 * a system message). Asserts on the requests the fake saw (the model
 * of each, the note), the events (which model answered) and the answer.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fake.h"
#include "loom/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char script[] =
    "{\"rules\": ["
    "  {\"match\": {\"system\": \"Use web_search first.\"},"
    "   \"responses\": [{\"text\": [\"Found: 42.\"],"
    "                    \"usage\": {\"prompt_tokens\": 7,"
    "                              \"completion_tokens\": 2,"
    "                              \"total_tokens\": 9}}]}"
    " ],"
    " \"responses\": [{\"text\": [\"I guess 41.\"],"
    "                  \"usage\": {\"prompt_tokens\": 5,"
    "                            \"completion_tokens\": 3,"
    "                            \"total_tokens\": 8}}]}";

static int keep(const loom_event *ev, void *payload)
{
    json_array_append_new(payload, loom_event_to_json(ev));
    return 0;
}

/* The body of recorded request i (a new reference). */
static json_t *body_of(const loom_fake *f, size_t i)
{
    json_t *r = fake_request(f, i), *b;

    assert_non_null(r);
    b = json_incref(json_object_get(r, "body"));
    json_decref(r);
    assert_non_null(b);
    return b;
}

/* The nth event of type (from 0), or NULL. */
static json_t *nth_event(json_t *events, const char *type, int nth)
{
    size_t i;
    json_t *e;

    json_array_foreach(events, i, e)
    {
        if (strcmp(json_string_value(json_object_get(e, "type")), type) == 0 &&
            nth-- == 0)
            return e;
    }
    return NULL;
}

static void test_retry_then_cheaper_model(void **state)
{
    loom_fake *f = fake_start_script(script);
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    json_t *events = json_array(), *b, *msgs, *last;
    char *yaml = NULL;
    loom_config *cfg;
    loom_session *s;
    loom_turn *t;

    (void)state;
    assert_non_null(f);
    assert_true(
        asprintf(&yaml,
                 "providers:\n"
                 "  p: {kind: openai, base_url: '%s', api_key: k}\n"
                 "models:\n"
                 "  p/big: {upstream: big-1}\n"
                 "  p/small: {upstream: small-1}\n"
                 "agents:\n"
                 "  researcher:\n"
                 "    model: p/big\n"
                 "    tools: [get_time]\n"
                 "    retry_without_tool_calls:\n"
                 "      {max: 1, prompt: 'Use web_search first.'}\n"
                 "    model_after_retries: {retries: 1, model: p/small}\n",
                 fake_base_url(f)) > 0);
    if (loom_config_load_string(&cfg, yaml, "t.yaml") != 0)
        fail_msg("config: %s", loom_error_last());
    so.config = cfg;
    assert_int_equal(loom_session_new(&s, &so), 0);
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "the answer?"), 0);
    to.input = &in;
    to.agent = "researcher";
    to.sink = (loom_sink){keep, events};
    if (loom_turn_new(&t, s, &to) != 0)
        fail_msg("turn: %s", loom_error_last());
    if (loom_turn_execute(t) != 0)
        fail_msg("run: %s", loom_error_last());

    assert_string_equal(loom_run_text(loom_turn_run(t)), "Found: 42.");
    assert_int_equal(fake_request_count(f), 2);
    b = body_of(f, 0);
    assert_string_equal(json_string_value(json_object_get(b, "model")),
                        "big-1");
    json_decref(b);
    /* The retry: the first answer kept, the note last, the cheaper
     * model. */
    b = body_of(f, 1);
    assert_string_equal(json_string_value(json_object_get(b, "model")),
                        "small-1");
    msgs = json_object_get(b, "messages");
    last = json_array_get(msgs, json_array_size(msgs) - 1);
    assert_string_equal(json_string_value(json_object_get(last, "content")),
                        "Use web_search first.");
    assert_string_equal(
        json_string_value(json_object_get(
            json_array_get(msgs, json_array_size(msgs) - 2), "content")),
        "I guess 41.");
    json_decref(b);
    /* Which model answered each call, and the run's usage. */
    assert_string_equal(json_string_value(json_object_get(
                            nth_event(events, "usage", 1), "model")),
                        "p/small");
    assert_string_equal(json_string_value(json_object_get(
                            nth_event(events, "run.completed", 0), "model")),
                        "p/small");
    assert_int_equal(loom_run_usage(loom_turn_run(t))->total_tokens, 17);

    loom_turn_free(t);
    loom_messages_free(&in);
    loom_session_free(s);
    loom_config_free(cfg);
    json_decref(events);
    free(yaml);
    assert_int_equal(fake_stop_check(f), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_retry_then_cheaper_model),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
