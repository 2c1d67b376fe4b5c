/*
 * The "openai-responses" provider end to end against loom-fake-upstream
 * (which speaks the Responses format on /v1/responses): what loom sends,
 * streamed and non-streamed answers, parallel calls, reasoning items sent
 * back exactly, chaining with previous_response_id, retries (and when not
 * to retry), in-stream errors, disconnects, timeouts and cancellation; and
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
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    loom_fake *fake;
    loom_provider_config cfg;
    loom_provider *p;
    loom_messages msgs;
    loom_llm_request req;
    loom_llm_response resp;
    loom_buf text;
    loom_buf reasoning;
    int ncalls_events;
} ctx;

static int on_event(const loom_llm_event *ev, void *payload)
{
    ctx *c = payload;

    if (ev->type == LOOM_LLM_TEXT)
        loom_buf_put(&c->text, ev->text, ev->text_len);
    else if (ev->type == LOOM_LLM_REASONING)
        loom_buf_put(&c->reasoning, ev->text, ev->text_len);
    else if (ev->type == LOOM_LLM_TOOL_CALLS)
        c->ncalls_events++;
    return 0;
}

/* A copy of s with every ' turned into " (the caller frees). */
static char *q(const char *s)
{
    char *r = strdup(s);

    assert_non_null(r);
    for (char *p = r; *p; p++)
        if (*p == '\'')
            *p = '"';
    return r;
}

/* Starts a fake with the script text and a provider before it. */
static ctx *setup_json(const char *script, int retries)
{
    ctx *c = calloc(1, sizeof(*c));

    assert_non_null(c);
    c->fake = fake_start_script(script);
    assert_non_null(c->fake);
    c->cfg.name = "oai";
    c->cfg.kind = "openai-responses";
    c->cfg.base_url = (char *)fake_base_url(c->fake);
    c->cfg.api_key = "sk-test";
    c->cfg.headers = json_pack("{s:s}", "X-Extra", "v1");
    c->cfg.connect_timeout_ms = 5000;
    c->cfg.first_byte_timeout_ms = 30000;
    c->cfg.idle_timeout_ms = 30000;
    c->cfg.max_retries = retries;
    c->cfg.retry_base_delay_ms = 10;
    c->cfg.retry_max_delay_ms = 50;
    assert_int_equal(loom_provider_new(&c->p, &c->cfg), 0);
    assert_int_equal(loom_messages_add(&c->msgs, LOOM_ROLE_USER, "Hi"), 0);
    c->req = (loom_llm_request)LOOM_LLM_REQUEST_INIT;
    c->req.model = "gpt-test";
    c->req.messages = c->msgs.items;
    c->req.messages_len = c->msgs.len;
    loom_buf_init(&c->text, LOOM_BUF_UNLIMITED);
    loom_buf_init(&c->reasoning, LOOM_BUF_UNLIMITED);
    return c;
}

/* setup_json() with a script written with ' for ". */
static ctx *setup(const char *script, int retries)
{
    char *s = q(script);
    ctx *c = setup_json(s, retries);

    free(s);
    return c;
}

static void reconfigure(ctx *c)
{
    loom_provider_free(c->p);
    assert_int_equal(loom_provider_new(&c->p, &c->cfg), 0);
}

static int run(ctx *c, loom_cancel *cancel)
{
    int rc;

    c->req.messages = c->msgs.items;
    c->req.messages_len = c->msgs.len;
    loom_llm_response_clear(&c->resp);
    loom_buf_clear(&c->text);
    loom_buf_clear(&c->reasoning);
    c->ncalls_events = 0;
    rc = loom_provider_complete(c->p, &c->req, on_event, c, &c->resp, cancel);
    if (getenv("LOOM_TEST_VERBOSE"))
        fprintf(stderr, "  rc %s: %s\n", loom_error_name(rc),
                rc ? loom_error_last() : "");
    return rc;
}

static void teardown(ctx *c)
{
    loom_provider_free(c->p);
    json_decref(c->cfg.headers);
    loom_messages_free(&c->msgs);
    loom_llm_response_clear(&c->resp);
    loom_buf_free(&c->text);
    loom_buf_free(&c->reasoning);
    assert_int_equal(fake_stop_check(c->fake), 0);
    free(c);
}

/* The body loom sent in request i (a new reference). */
static json_t *sent_body(ctx *c, size_t i)
{
    json_t *r = fake_request(c->fake, i), *b;

    assert_non_null(r);
    b = json_incref(json_object_get(r, "body"));
    json_decref(r);
    assert_non_null(b);
    return b;
}

/* Asserts json equals the JSON written with '. */
static void assert_json(const json_t *j, const char *expect)
{
    char *e = q(expect);
    json_t *b = json_loads(e, 0, NULL);

    assert_non_null(b);
    if (!json_equal((json_t *)j, b)) {
        char *s = json_dumps(j, JSON_COMPACT);
        fprintf(stderr, "got:  %s\nwant: %s\n", s ? s : "NULL", e);
        free(s);
        fail();
    }
    json_decref(b);
    free(e);
}

/* Appends the answer in c->resp as an assistant message with its state. */
static void keep_answer(ctx *c)
{
    loom_message *m;

    assert_int_equal(loom_messages_add_assistant(
                         &c->msgs, c->resp.text, c->resp.reasoning,
                         c->resp.tool_calls, c->resp.tool_calls_len),
                     0);
    m = &c->msgs.items[c->msgs.len - 1];
    if (c->resp.provider_state)
        m->provider_state = strdup(c->resp.provider_state);
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
    assert_int_equal(run(c, NULL), 0);
    assert_string_equal(c->resp.text, "Hello");
    assert_string_equal(loom_buf_cstr(&c->text), "Hello");
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
    assert_json(b, "{'model':'gpt-test','input':[{'type':'message','role':"
                   "'user','content':'Hi'}],'store':false,'stream':true}");
    json_decref(r);
    teardown(c);
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
    assert_int_equal(run(c, NULL), 0);
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
    teardown(c);
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
    assert_int_equal(run(c, NULL), 0);
    assert_string_equal(c->resp.text, "Let me check.");
    assert_int_equal(c->ncalls_events, 1);
    assert_int_equal(c->resp.tool_calls_len, 2);
    assert_string_equal(c->resp.tool_calls[0].id, "call_a");
    assert_string_equal(c->resp.tool_calls[0].arguments,
                        "{\"city\":\"Paris\"}");
    assert_string_equal(c->resp.tool_calls[1].name, "get_time");
    assert_string_equal(c->resp.tool_calls[1].arguments, "{\"tz\":\"UTC\"}");
    assert_string_equal(c->resp.finish_reason, "tool_calls");
    b = sent_body(c, 0);
    assert_json(json_object_get(b, "tools"),
                "[{'type':'function','name':'get_weather','description':"
                "'Weather','parameters':{'type':'object','properties':{}},"
                "'strict':false},{'type':'function','name':'get_time',"
                "'parameters':{'type':'object','properties':{}},'strict':"
                "false}]");
    assert_string_equal(json_string_value(json_object_get(b, "tool_choice")),
                        "auto");
    assert_true(json_is_true(json_object_get(b, "parallel_tool_calls")));
    json_decref(b);
    teardown(c);
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
    char *s = q(sse), *text;
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

    assert_int_equal(run(c, NULL), 0);
    assert_string_equal(c->resp.reasoning, "Need it.");
    assert_int_equal(c->resp.usage.reasoning_tokens, 15);
    assert_int_equal(c->resp.tool_calls_len, 1);
    keep_answer(c);
    assert_int_equal(
        loom_messages_add_tool_result(&c->msgs, "call_1", "lookup", "42"), 0);
    assert_int_equal(run(c, NULL), 0);
    assert_string_equal(c->resp.text, "Done.");
    assert_string_equal(c->resp.reasoning, "Found it.");
    assert_string_equal(loom_buf_cstr(&c->reasoning), "Found it.");

    b = sent_body(c, 0);
    assert_json(json_object_get(b, "include"),
                "['reasoning.encrypted_content']");
    assert_json(json_object_get(b, "reasoning"), "{'effort':'low'}");
    assert_true(json_is_false(json_object_get(b, "store")));
    json_decref(b);
    b = sent_body(c, 1);
    assert_json(json_object_get(b, "input"),
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
    keep_answer(c);
    assert_int_equal(loom_messages_add(&c->msgs, LOOM_ROLE_USER, "More"), 0);
    assert_int_equal(run(c, NULL), 0);
    assert_string_equal(c->resp.reasoning, "Summary");
    b = sent_body(c, 2);
    assert_json(json_array_get(json_object_get(b, "input"), 4),
                "{'type':'message','role':'assistant','content':'Done.'}");
    assert_int_equal(json_array_size(json_object_get(b, "input")), 6);
    json_decref(b);
    teardown(c);
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
    assert_int_equal(run(c, NULL), 0);
    assert_string_equal(c->resp.response_id, "resp_fake_1");
    keep_answer(c);
    assert_int_equal(loom_messages_add(&c->msgs, LOOM_ROLE_USER, "Again"), 0);
    assert_int_equal(run(c, NULL), 0);
    assert_string_equal(c->resp.text, "Two.");
    assert_string_equal(c->resp.response_id, "resp_fake_2");
    b = sent_body(c, 0);
    assert_json(b, "{'model':'gpt-test','input':[{'type':'message','role':"
                   "'user','content':'Hi'},{'type':'message','role':"
                   "'developer','content':'late'}],'store':true,"
                   "'stream':true}");
    json_decref(b);
    b = sent_body(c, 1);
    assert_json(b, "{'model':'gpt-test','previous_response_id':"
                   "'resp_fake_1','input':[{'type':'message','role':'user',"
                   "'content':'Again'}],'store':true,'stream':true}");
    json_decref(b);
    teardown(c);
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
    assert_int_equal(run(c, NULL), 0);
    assert_string_equal(c->resp.text, "ok");
    assert_int_equal(c->resp.error.attempts, 3);
    assert_int_equal(fake_request_count(c->fake), 3);
    teardown(c);

    /* out of retries: the last error, with the attempts */
    c = setup("{'loop':true,'responses':[{'status':500,'error':{'message':"
              "'boom','type':'server_error'}}]}",
              1);
    assert_int_equal(run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_SERVER);
    assert_int_equal(c->resp.error.http_status, 500);
    assert_int_equal(c->resp.error.attempts, 2);
    assert_string_equal(c->resp.error.message, "boom");
    assert_non_null(strstr(loom_error_last(), "oai: 500 server: boom"));
    assert_non_null(strstr(loom_error_last(), "after 2 attempts"));
    teardown(c);
}

static void test_4xx_not_retried(void **state)
{
    ctx *c = setup("{'responses':[{'status':400,'error':{'message':"
                   "'Previous response not found','type':"
                   "'invalid_request_error','code':"
                   "'previous_response_not_found'}},{'text':['no']}]}",
                   3);

    (void)state;
    assert_int_equal(run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_BAD_REQUEST);
    assert_string_equal(c->resp.error.type, "invalid_request_error");
    assert_string_equal(c->resp.error.message, "Previous response not found");
    assert_int_equal(c->resp.error.attempts, 1);
    assert_int_equal(fake_request_count(c->fake), 1);
    teardown(c);
}

static void test_stream_errors(void **state)
{
    /* after output: kept, not retried */
    ctx *c = setup("{'responses':[{'text':['par'],'stream_error':{"
                   "'message':'boom'}},{'text':['never']}]}",
                   2);

    (void)state;
    assert_int_equal(run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_STREAM);
    assert_string_equal(c->resp.error.type, "server_error");
    assert_string_equal(c->resp.error.message, "boom");
    assert_string_equal(c->resp.text, "par");
    assert_int_equal(c->resp.output_started, 1);
    assert_int_equal(fake_request_count(c->fake), 1);
    teardown(c);

    /* response.failed, rate limited */
    c = setup("{'responses':[{'text':['x'],'stream_error':{'message':"
              "'tpm','code':'rate_limit_exceeded'},'stream_error_event':"
              "'response.failed'}]}",
              2);
    assert_int_equal(run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_RATE_LIMIT);
    assert_string_equal(c->resp.error.message, "tpm");
    assert_non_null(strstr(loom_error_last(), "oai: rate_limit: tpm"));
    teardown(c);

    /* a server_error before any output is retried */
    c = setup("{'responses':[{'stream_error':{'message':'transient'}},"
              "{'text':['ok']}]}",
              2);
    assert_int_equal(run(c, NULL), 0);
    assert_string_equal(c->resp.text, "ok");
    assert_int_equal(c->resp.error.attempts, 2);
    teardown(c);

    /* another code before any output is not */
    c = setup("{'responses':[{'stream_error':{'message':'too long','code':"
              "'context_length_exceeded'}},{'text':['ok']}]}",
              2);
    assert_int_equal(run(c, NULL), LOOM_EUPSTREAM);
    assert_string_equal(c->resp.error.type, "context_length_exceeded");
    assert_int_equal(fake_request_count(c->fake), 1);
    teardown(c);
}

static void test_disconnect(void **state)
{
    /* cut after response.created, .in_progress, the item and its part:
     * nothing was shown, so it is retried */
    ctx *c = setup("{'responses':[{'text':['a','b','c'],"
                   "'disconnect_after_chunks':4},{'text':['ok']}]}",
                   2);

    (void)state;
    assert_int_equal(run(c, NULL), 0);
    assert_string_equal(c->resp.text, "ok");
    assert_int_equal(fake_request_count(c->fake), 2);
    teardown(c);

    /* cut after two text deltas: shown, so not retried */
    c = setup("{'responses':[{'text':['a','b','c'],"
              "'disconnect_after_chunks':6},{'text':['never']}]}",
              2);
    assert_int_equal(run(c, NULL), LOOM_EUPSTREAM);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_CONNECTION);
    assert_string_equal(c->resp.text, "ab");
    assert_int_equal(fake_request_count(c->fake), 1);
    teardown(c);
}

static void test_timeouts(void **state)
{
    ctx *c = setup("{'responses':[{'delay_ms':3000,'text':['late']}]}", 0);
    long long t0;

    (void)state;
    c->cfg.first_byte_timeout_ms = 300;
    reconfigure(c);
    t0 = test_now_ms();
    assert_int_equal(run(c, NULL), LOOM_ETIMEDOUT);
    assert_true(test_now_ms() - t0 >= 250);
    assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_TIMEOUT);
    teardown(c);

    /* idle: the stream stops after the first text delta */
    c = setup("{'responses':[{'text':['a','b'],'hang':true,"
              "'hang_after_chunks':5}]}",
              0);
    c->cfg.idle_timeout_ms = 300;
    reconfigure(c);
    assert_int_equal(run(c, NULL), LOOM_ETIMEDOUT);
    assert_string_equal(c->resp.text, "a");
    teardown(c);
}

static void *cancel_after(void *arg)
{
    usleep(200 * 1000);
    loom_cancel_set(arg);
    return NULL;
}

static void test_cancel(void **state)
{
    ctx *c = setup("{'responses':[{'text':['a','b'],'hang':true,"
                   "'hang_after_chunks':5}]}",
                   2);
    loom_cancel cancel = LOOM_CANCEL_INIT;
    pthread_t th;

    (void)state;
    assert_int_equal(pthread_create(&th, NULL, cancel_after, &cancel), 0);
    assert_int_equal(run(c, &cancel), LOOM_ECANCELED);
    pthread_join(th, NULL);
    assert_string_equal(c->resp.text, "a");
    assert_int_equal(fake_request_count(c->fake), 1);
    teardown(c);
}

static void test_limit(void **state)
{
    ctx *c = setup("{'responses':[{'text':['0123456789','x']}]}", 0);
    loom__responses_limits lim = {0};

    (void)state;
    lim.max_text = 10;
    loom__responses_provider_set_limits(c->p, &lim);
    assert_int_equal(run(c, NULL), LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "oai: answer text larger"));
    assert_string_equal(c->resp.text, "0123456789");
    teardown(c);
}

/* ---- a whole run ----------------------------------------------------- */

static int echo_exec(const json_t *args, const loom_tool_ctx *tctx,
                     loom_buf *out, void *payload)
{
    (void)tctx;
    (void)payload;
    return loom_buf_printf(out, "echo:%s",
                           json_string_value(json_object_get(args, "text")));
}

static int fail_exec(const json_t *args, const loom_tool_ctx *tctx,
                     loom_buf *out, void *payload)
{
    (void)args;
    (void)tctx;
    (void)payload;
    loom_buf_puts(out, "disk on fire");
    return LOOM_ERROR;
}

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
    loom_provider_config pc = {0};
    loom_provider *p;
    loom_tool_registry *reg;
    loom_messages hist = {0};
    loom_fake *fake;
    loom_run *run_;
    json_t *echo = json_pack("{s:s,s:{s:{s:s}},s:[s]}", "type", "object",
                             "properties", "text", "type", "string",
                             "required", "text");
    json_t *reqs, *body, *input, *last;
    loom_tool t;
    char *script;

    (void)state;
    /* two parallel calls (one fails) after some reasoning, one more call,
     * then the iteration limit forces the answer */
    script = q("{'responses':["
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
    pc.name = "oai";
    pc.kind = "openai-responses";
    pc.base_url = (char *)fake_base_url(fake);
    pc.headers = json_object();
    pc.connect_timeout_ms = 5000;
    pc.first_byte_timeout_ms = 30000;
    pc.idle_timeout_ms = 30000;
    assert_int_equal(loom_provider_new(&p, &pc), 0);
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    memset(&t, 0, sizeof(t));
    t.name = "echo";
    t.description = "Echoes text back.";
    t.parameters = echo;
    t.execute = echo_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "fail";
    t.description = "Always fails.";
    t.parameters = NULL;
    t.execute = fail_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
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
    assert_json(item_of(reqs, 1, "function_call", "c1"),
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
    json_decref(echo);
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
        cmocka_unit_test(test_timeouts),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_limit),
        cmocka_unit_test(test_run_loop),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
