/*
 * The "openai-responses" provider end to end against loom-fake-upstream
 * (which speaks the Responses format on /v1/responses): what loom sends,
 * streamed and non-streamed answers, parallel calls, reasoning items sent
 * back exactly, chaining with previous_response_id, retries (and when not
 * to retry), in-stream errors, disconnects and cancellation; and
 * a whole run through loom_run with this adapter. Time checks are lower
 * bounds only, so a loaded machine cannot make them flaky.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fake.h"
#include "llm/responses.h"
#include "loom/buf.h"
#include "loom/llm.h"
#include "loom/run.h"
#include "loom/tools.h"
#include "provider_harness.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef provider_ctx ctx;

/* Starts a fake with the script text and a provider before it. */
static ctx *setup_json(const char *script, int retries)
{
    loom_fake *f = fake_start_script(script);

    assert_non_null(f);
    return provider_start(f, NULL, "oai", "openai-responses", "sk-test",
                          json_pack("{s:s}", "X-Extra", "v1"), "gpt-test",
                          retries);
}

/* setup_json() with a script written with ' for ". */
static ctx *setup(const char *script, int retries)
{
    char *s = provider_quotes(script);
    ctx *c = setup_json(s, retries);

    free(s);
    return c;
}

/* Asserts json equals the JSON written with '. */
static void assert_qjson(const json_t *j, const char *expect)
{
    char *e = provider_quotes(expect);

    assert_json(j, e);
    free(e);
}

/* ---- happy paths ----------------------------------------------------- */

static void test_stream_text(void **state)
{
    ctx *c = setup("{'responses':[{'text':['Hel','lo'],'usage':{"
                   "'input_tokens':3,'output_tokens':2,"
                   "'input_tokens_details':{'cached_tokens':1}}}]}",
                   2);
    json_t *r, *h, *b;

    (void)state;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "Hello");
    assert_string_equal(loom_buf_cstr(&c->events_text), "Hello");
    assert_string_equal(c->resp.finish_reason, "stop");
    assert_string_equal(c->resp.response_id, "resp_fake_1");
    assert_int_equal(c->resp.usage.prompt_tokens, 3);
    assert_int_equal(c->resp.usage.completion_tokens, 2);
    assert_int_equal(c->resp.usage.total_tokens, 5);
    assert_int_equal(c->resp.usage.cached_tokens, 1);
    assert_int_equal(c->resp.error.attempts, 1);
    assert_null(c->resp.reasoning);
    assert_non_null(strstr(c->resp.provider_state,
                           "\"openai-responses\":{\"id\":\"resp_fake_1\""));
    assert_non_null(strstr(c->resp.provider_state, "msg_fake_1"));

    r = fake_request(c->fake, 0);
    assert_string_equal(json_string_value(json_object_get(r, "path")),
                        "/v1/responses");
    h = json_object_get(r, "headers");
    assert_string_equal(json_string_value(json_object_get(h, "authorization")),
                        "Bearer sk-test");
    assert_string_equal(json_string_value(json_object_get(h, "accept")),
                        "text/event-stream");
    assert_string_equal(json_string_value(json_object_get(h, "content-type")),
                        "application/json");
    assert_string_equal(json_string_value(json_object_get(h, "x-extra")), "v1");
    b = json_object_get(r, "body");
    assert_qjson(b, "{'model':'gpt-test','input':[{'type':'message','role':"
                    "'user','content':'Hi'}],'store':false,'stream':true}");
    json_decref(r);
    assert_int_equal(provider_stop(c), 0);
}

static void test_non_streamed(void **state)
{
    ctx *c = setup("{'responses':[{'text':['Hel','lo'],'reasoning':['hm'],"
                   "'tool_calls':[{'id':'c1','name':'f','arguments':"
                   "['{}']}],'usage':{'prompt_tokens':4,"
                   "'completion_tokens':1}}]}",
                   0);
    json_t *r;

    (void)state;
    c->req.stream = 0;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "Hello");
    assert_string_equal(c->resp.reasoning, "hm");
    assert_int_equal(c->resp.tool_calls_len, 1);
    assert_string_equal(c->resp.tool_calls[0].id, "c1");
    assert_string_equal(c->resp.finish_reason, "tool_calls");
    assert_int_equal(c->resp.usage.total_tokens, 5);
    r = fake_request(c->fake, 0);
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(r, "headers"), "accept")),
                        "application/json");
    assert_null(json_object_get(json_object_get(r, "body"), "stream"));
    json_decref(r);
    assert_int_equal(provider_stop(c), 0);
}

static void test_parallel_calls(void **state)
{
    ctx *c = setup("{'responses':[{'text':['Let me check.'],'tool_calls':["
                   "{'id':'call_a','name':'get_weather','arguments':"
                   "['{\\'city\\':','\\'Paris\\'}']},"
                   "{'id':'call_b','name':'get_time','arguments':"
                   "'{\\'tz\\':\\'UTC\\'}'}]}]}",
                   0);
    loom_tool_def tools[2] = {{"get_weather", "Weather", NULL},
                              {"get_time", NULL, NULL}};
    json_t *b;

    (void)state;
    c->req.tools = tools;
    c->req.tools_len = 2;
    c->req.parallel_tool_calls = 1;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "Let me check.");
    assert_int_equal(c->ncalls_events, 1);
    assert_int_equal(c->resp.tool_calls_len, 2);
    assert_string_equal(c->resp.tool_calls[0].id, "call_a");
    assert_string_equal(c->resp.tool_calls[0].arguments,
                        "{\"city\":\"Paris\"}");
    assert_string_equal(c->resp.tool_calls[1].name, "get_time");
    assert_string_equal(c->resp.tool_calls[1].arguments, "{\"tz\":\"UTC\"}");
    assert_string_equal(c->resp.finish_reason, "tool_calls");
    b = provider_sent_body(c->fake, 0);
    assert_qjson(json_object_get(b, "tools"),
                 "[{'type':'function','name':'get_weather','description':"
                 "'Weather','parameters':{'type':'object','properties':{}},"
                 "'strict':false},{'type':'function','name':'get_time',"
                 "'parameters':{'type':'object','properties':{}},'strict':"
                 "false}]");
    assert_string_equal(json_string_value(json_object_get(b, "tool_choice")),
                        "auto");
    assert_true(json_is_true(json_object_get(b, "parallel_tool_calls")));
    json_decref(b);
    assert_int_equal(provider_stop(c), 0);
}

/*
 * A reasoning model without storage: the reasoning item (with its
 * encrypted content) comes back on the next request exactly, before the
 * call it led to, and the items keep their ids.
 */
static void test_reasoning_sent_back(void **state)
{
    static const char *const sse =
        "event: response.created\n"
        "data: {'type':'response.created','response':{'id':'resp_R1',"
        "'status':'in_progress'}}\n\n"
        "event: response.output_item.added\n"
        "data: {'type':'response.output_item.added','output_index':0,"
        "'item':{'id':'rs_1','type':'reasoning','summary':[]}}\n\n"
        "event: response.reasoning_summary_text.delta\n"
        "data: {'type':'response.reasoning_summary_text.delta','item_id':"
        "'rs_1','output_index':0,'summary_index':0,'delta':'Need it.'}\n\n"
        "event: response.output_item.done\n"
        "data: {'type':'response.output_item.done','output_index':0,"
        "'item':{'id':'rs_1','type':'reasoning','summary':[{'type':"
        "'summary_text','text':'Need it.'}],'encrypted_content':"
        "'gAAAA-opaque=='}}\n\n"
        "event: response.output_item.added\n"
        "data: {'type':'response.output_item.added','output_index':1,"
        "'item':{'id':'fc_1','type':'function_call','call_id':'call_1',"
        "'name':'lookup','arguments':''}}\n\n"
        "event: response.function_call_arguments.delta\n"
        "data: {'type':'response.function_call_arguments.delta',"
        "'output_index':1,'item_id':'fc_1','delta':'{}'}\n\n"
        "event: response.output_item.done\n"
        "data: {'type':'response.output_item.done','output_index':1,"
        "'item':{'id':'fc_1','type':'function_call','call_id':'call_1',"
        "'name':'lookup','arguments':'{}'}}\n\n"
        "event: response.completed\n"
        "data: {'type':'response.completed','response':{'id':'resp_R1',"
        "'status':'completed','output':[],'usage':{'input_tokens':9,"
        "'output_tokens':20,'output_tokens_details':{"
        "'reasoning_tokens':15},'total_tokens':29}}}\n\n";
    json_t *script, *resps, *b;
    char *s = provider_quotes(sse), *text;
    ctx *c;

    (void)state;
    /* the first answer verbatim; then the fake's own reasoning answers */
    script = json_pack("{s:[{s:s,s:s}]}", "responses", "body", s,
                       "content_type", "text/event-stream");
    resps = json_object_get(script, "responses");
    json_array_append_new(
        resps, json_pack("{s:[s,s],s:s,s:[s]}", "reasoning", "Found", " it.",
                         "reasoning_kind", "text", "text", "Done."));
    json_array_append_new(resps, json_pack("{s:[s,s],s:[s]}", "reasoning",
                                           "Sum", "mary", "text", "Again."));
    text = json_dumps(script, JSON_COMPACT);
    json_decref(script);
    free(s);
    c = setup_json(text, 0);
    free(text);
    c->req.reasoning_effort = "low";

    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.reasoning, "Need it.");
    assert_int_equal(c->resp.usage.reasoning_tokens, 15);
    assert_int_equal(c->resp.tool_calls_len, 1);
    provider_add_answer(c);
    assert_int_equal(
        loom_messages_add_tool_result(&c->msgs, "call_1", "lookup", "42"), 0);
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "Done.");
    assert_string_equal(c->resp.reasoning, "Found it.");
    assert_string_equal(loom_buf_cstr(&c->events_reasoning), "Found it.");

    b = provider_sent_body(c->fake, 0);
    assert_qjson(json_object_get(b, "include"),
                 "['reasoning.encrypted_content']");
    assert_qjson(json_object_get(b, "reasoning"), "{'effort':'low'}");
    assert_true(json_is_false(json_object_get(b, "store")));
    json_decref(b);
    b = provider_sent_body(c->fake, 1);
    assert_qjson(json_object_get(b, "input"),
                 "[{'type':'message','role':'user','content':'Hi'},"
                 "{'type':'reasoning','id':'rs_1','summary':[{'type':"
                 "'summary_text','text':'Need it.'}],'encrypted_content':"
                 "'gAAAA-opaque=='},"
                 "{'type':'function_call','id':'fc_1','call_id':'call_1',"
                 "'name':'lookup','arguments':'{}'},"
                 "{'type':'function_call_output','call_id':'call_1',"
                 "'output':'42'}]");
    json_decref(b);

    /* the fake's reasoning item has no encrypted content and was not
     * stored: it cannot go back, and the message goes without its id */
    provider_add_answer(c);
    assert_int_equal(loom_messages_add(&c->msgs, LOOM_ROLE_USER, "More"), 0);
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.reasoning, "Summary");
    b = provider_sent_body(c->fake, 2);
    assert_qjson(json_array_get(json_object_get(b, "input"), 4),
                 "{'type':'message','role':'assistant','content':'Done.'}");
    assert_int_equal(json_array_size(json_object_get(b, "input")), 6);
    json_decref(b);
    assert_int_equal(provider_stop(c), 0);
}

/* Chaining: the second request names the first response and sends only
 * what came after it. */
static void test_chaining(void **state)
{
    ctx *c = setup("{'responses':[{'text':['One.']},{'text':['Two.']}]}", 0);
    json_t *b;

    (void)state;
    c->req.chain_responses = 1;
    assert_int_equal(loom_messages_add(&c->msgs, LOOM_ROLE_SYSTEM, "late"),
                     0);
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.response_id, "resp_fake_1");
    provider_add_answer(c);
    assert_int_equal(loom_messages_add(&c->msgs, LOOM_ROLE_USER, "Again"), 0);
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "Two.");
    assert_string_equal(c->resp.response_id, "resp_fake_2");
    b = provider_sent_body(c->fake, 0);
    assert_qjson(b, "{'model':'gpt-test','input':[{'type':'message','role':"
                    "'user','content':'Hi'},{'type':'message','role':"
                    "'developer','content':'late'}],'store':true,"
                    "'stream':true}");
    json_decref(b);
    b = provider_sent_body(c->fake, 1);
    assert_qjson(b, "{'model':'gpt-test','previous_response_id':"
                    "'resp_fake_1','input':[{'type':'message','role':'user',"
                    "'content':'Again'}],'store':true,'stream':true}");
    json_decref(b);
    assert_int_equal(provider_stop(c), 0);
}

/* ---- errors and retries ---------------------------------------------- */

static void test_retries(void **state)
{
    ctx *c = setup("{'responses':[{'status':429,'headers':{'Retry-After':"
                   "'0'},'error':{'message':'slow down','type':'requests',"
                   "'code':'rate_limit_exceeded'}},{'status':503,'error':{"
                   "'message':'busy'}},{'text':['ok']}]}",
                   2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "ok");
    assert_int_equal(c->resp.error.attempts, 3);
    assert_int_equal(fake_request_count(c->fake), 3);
    assert_int_equal(provider_stop(c), 0);

    /* out of retries: the last error, with the attempts */
    c = setup("{'loop':true,'responses':[{'status':500,'error':{'message':"
              "'boom','type':'server_error'}}]}",
              1);
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_SERVER);
    assert_int_equal(c->resp.error.http_status, 500);
    assert_int_equal(c->resp.error.attempts, 2);
    assert_string_equal(c->resp.error.message, "boom");
    assert_non_null(strstr(loom_error_last(), "oai: 500 server: boom"));
    assert_non_null(strstr(loom_error_last(), "after 2 attempts"));
    assert_int_equal(provider_stop(c), 0);
}

static void test_4xx_not_retried(void **state)
{
    ctx *c = setup("{'responses':[{'status':400,'error':{'message':"
                   "'Previous response not found','type':"
                   "'invalid_request_error','code':"
                   "'previous_response_not_found'}},{'text':['no']}]}",
                   3);

    (void)state;
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_BAD_REQUEST);
    assert_string_equal(c->resp.error.type, "invalid_request_error");
    assert_string_equal(c->resp.error.message, "Previous response not found");
    assert_int_equal(c->resp.error.attempts, 1);
    assert_int_equal(fake_request_count(c->fake), 1);
    assert_int_equal(provider_stop(c), 0);
}

static void test_stream_errors(void **state)
{
    /* after output: kept, not retried */
    ctx *c = setup("{'responses':[{'text':['par'],'stream_error':{"
                   "'message':'boom'}},{'text':['never']}]}",
                   2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_STREAM);
    assert_string_equal(c->resp.error.type, "server_error");
    assert_string_equal(c->resp.error.message, "boom");
    assert_string_equal(c->resp.text, "par");
    assert_int_equal(c->resp.output_started, 1);
    assert_int_equal(fake_request_count(c->fake), 1);
    assert_int_equal(provider_stop(c), 0);

    /* response.failed, rate limited */
    c = setup("{'responses':[{'text':['x'],'stream_error':{'message':"
              "'tpm','code':'rate_limit_exceeded'},'stream_error_event':"
              "'response.failed'}]}",
              2);
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_RATE_LIMIT);
    assert_string_equal(c->resp.error.message, "tpm");
    assert_non_null(strstr(loom_error_last(), "oai: rate_limit: tpm"));
    assert_int_equal(provider_stop(c), 0);

    /* a server_error before any output is retried */
    c = setup("{'responses':[{'stream_error':{'message':'transient'}},"
              "{'text':['ok']}]}",
              2);
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "ok");
    assert_int_equal(c->resp.error.attempts, 2);
    assert_int_equal(provider_stop(c), 0);

    /* another code before any output is not */
    c = setup("{'responses':[{'stream_error':{'message':'too long','code':"
              "'context_length_exceeded'}},{'text':['ok']}]}",
              2);
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_string_equal(c->resp.error.type, "context_length_exceeded");
    assert_int_equal(fake_request_count(c->fake), 1);
    assert_int_equal(provider_stop(c), 0);
}

static void test_disconnect(void **state)
{
    /* cut after response.created, .in_progress, the item and its part:
     * nothing was shown, so it is retried */
    ctx *c = setup("{'responses':[{'text':['a','b','c'],"
                   "'disconnect_after_chunks':4},{'text':['ok']}]}",
                   2);

    (void)state;
    assert_int_equal(provider_run(c, NULL), 0);
    assert_string_equal(c->resp.text, "ok");
    assert_int_equal(fake_request_count(c->fake), 2);
    assert_int_equal(provider_stop(c), 0);

    /* cut after two text deltas: shown, so not retried */
    c = setup("{'responses':[{'text':['a','b','c'],"
              "'disconnect_after_chunks':6},{'text':['never']}]}",
              2);
    assert_int_equal(provider_run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_CONNECTION);
    assert_string_equal(c->resp.text, "ab");
    assert_int_equal(fake_request_count(c->fake), 1);
    assert_int_equal(provider_stop(c), 0);
}

static void test_cancel(void **state)
{
    ctx *c = setup("{'responses':[{'text':['a','b'],'hang':true,"
                   "'hang_after_chunks':5}]}",
                   2);
    (void)state;
    assert_int_equal(provider_run_canceled(c, 200), LOOM_ECANCELED);
    assert_string_equal(c->resp.text, "a");
    assert_int_equal(fake_request_count(c->fake), 1);
    assert_int_equal(provider_stop(c), 0);
}

static void test_limit(void **state)
{
    ctx *c = setup("{'responses':[{'text':['0123456789','x']}]}", 0);
    loom__responses_limits lim = {0};

    (void)state;
    lim.max_text = 10;
    loom__responses_provider_set_limits(c->p, &lim);
    assert_int_equal(provider_run(c, NULL), LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "oai: answer text larger"));
    assert_string_equal(c->resp.text, "0123456789");
    assert_int_equal(provider_stop(c), 0);
}

/* ---- a whole run ----------------------------------------------------- */

/* The input item of request i that has call_id and type (borrowed). */
static json_t *item_of(json_t *reqs, size_t i, const char *type,
                       const char *call_id)
{
    json_t *input = json_object_get(
        json_object_get(json_array_get(reqs, i), "body"), "input");
    json_t *it;
    size_t k;

    json_array_foreach(input, k, it)
    {
        const char *t = json_string_value(json_object_get(it, "type"));
        const char *c = json_string_value(json_object_get(it, "call_id"));
        if (t && !strcmp(t, type) && c && !strcmp(c, call_id))
            return it;
    }
    return NULL;
}

static void test_run_loop(void **state)
{
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_provider_config pc;
    loom_provider *p;
    loom_tool_registry *reg = provider_tools();
    loom_messages hist = {0};
    loom_fake *fake;
    loom_run *run_;
    json_t *reqs, *body, *input, *last;
    char *script;

    (void)state;
    /* two parallel calls (one fails) after some reasoning, one more call,
     * then the iteration limit forces the answer */
    script = provider_quotes(
        "{'responses':["
        "{'reasoning':['Two lookups.'],'tool_calls':["
        "{'id':'c1','name':'echo','arguments':['{\\'text\\':','"
        "\\'a\\'}']},{'id':'c2','name':'fail','arguments':'{}'}],"
        "'usage':{'input_tokens':10,'output_tokens':5}},"
        "{'tool_calls':[{'id':'c3','name':'echo','arguments':"
        "'{\\'text\\':\\'b\\'}'}],'usage':{'input_tokens':20,"
        "'output_tokens':5}},"
        "{'text':['Final ','answer.'],'usage':{'input_tokens':30,"
        "'output_tokens':2}}]}");
    fake = fake_start_script(script);
    free(script);
    assert_non_null(fake);
    provider_config(&pc, fake, NULL, "oai", "openai-responses", NULL, NULL, 0);
    assert_int_equal(loom_provider_new(&p, &pc), 0);
    ro.provider = p;
    ro.model = "oai/gpt-test";
    ro.upstream_model = "gpt-test";
    ro.tools = reg;
    ro.system_prompt = "You are terse.";
    ro.max_iterations = 3;
    ro.temperature = -1.0;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "question"),
                     0);
    assert_int_equal(loom_run_new(&run_, &ro, &hist), 0);
    assert_int_equal(loom_run_execute(run_), 0);
    assert_string_equal(loom_run_text(run_), "Final answer.");
    assert_string_equal(loom_run_finish_reason(run_), "stop");
    assert_int_equal(loom_run_iterations(run_), 3);
    assert_int_equal(loom_run_usage(run_)->prompt_tokens, 60);
    assert_int_equal(loom_run_usage(run_)->completion_tokens, 12);
    /* the first assistant message keeps its reasoning and its state */
    assert_string_equal(loom_run_messages(run_)->items[0].reasoning,
                        "Two lookups.");
    assert_non_null(strstr(loom_run_messages(run_)->items[0].provider_state,
                           "resp_fake_1"));

    reqs = fake_requests(fake);
    assert_int_equal(json_array_size(reqs), 3);
    body = json_object_get(json_array_get(reqs, 0), "body");
    assert_string_equal(
        json_string_value(json_object_get(body, "instructions")),
        "You are terse.");
    assert_int_equal(json_array_size(json_object_get(body, "tools")), 2);
    /* request 2: both calls and both results, the error as text */
    assert_qjson(item_of(reqs, 1, "function_call", "c1"),
                 "{'type':'function_call','call_id':'c1','name':'echo',"
                 "'arguments':'{\\'text\\':\\'a\\'}'}");
    assert_non_null(item_of(reqs, 1, "function_call", "c2"));
    assert_string_equal(json_string_value(json_object_get(
                            item_of(reqs, 1, "function_call_output", "c1"),
                            "output")),
                        "echo:a");
    assert_string_equal(json_string_value(json_object_get(
                            item_of(reqs, 1, "function_call_output", "c2"),
                            "output")),
                        "Error: disk on fire");
    /* request 3: tool_choice none, the limit note last (developer) */
    body = json_object_get(json_array_get(reqs, 2), "body");
    assert_string_equal(
        json_string_value(json_object_get(body, "tool_choice")), "none");
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(reqs, 2), "path")),
        "/v1/responses");
    input = json_object_get(body, "input");
    assert_string_equal(json_string_value(json_object_get(
                            item_of(reqs, 2, "function_call_output", "c3"),
                            "output")),
                        "echo:b");
    last = json_array_get(input, json_array_size(input) - 1);
    assert_string_equal(json_string_value(json_object_get(last, "role")),
                        "developer");
    assert_non_null(strstr(json_string_value(json_object_get(last, "content")),
                           "limit of 3 model calls"));
    json_decref(reqs);

    loom_run_free(run_);
    loom_messages_free(&hist);
    loom_tool_registry_free(reg);
    loom_provider_free(p);
    json_decref(pc.headers);
    assert_int_equal(fake_stop_check(fake), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_text),
        cmocka_unit_test(test_non_streamed),
        cmocka_unit_test(test_parallel_calls),
        cmocka_unit_test(test_reasoning_sent_back),
        cmocka_unit_test(test_chaining),
        cmocka_unit_test(test_retries),
        cmocka_unit_test(test_4xx_not_retried),
        cmocka_unit_test(test_stream_errors),
        cmocka_unit_test(test_disconnect),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_limit),
        cmocka_unit_test(test_run_loop),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
