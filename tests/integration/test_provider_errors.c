/*
 * How each provider adapter maps upstream failures, table-driven: one row
 * per (adapter, failure) gives what the fake answers and what loom must
 * make of it: the return code (a LOOM_E* code), the upstream error's
 * kind, HTTP status and type, whether it was retried (counted as requests
 * at the fake: a retried failure that keeps failing is seen 1 + retries
 * times, one that is not retried once), and the text kept when the error
 * came after output.
 *
 * Rows the per-provider tests (test_provider_{openai,responses,anthropic,
 * gemini}.c) already cover are not repeated here: OpenAI Chat 401, 429,
 * 5xx, in-stream error after output; Responses 400, 429, 5xx, `error`
 * events before and after output, response.failed (rate limited) after
 * output; Anthropic 400, 401, 403, 404, 413, 429, 529, overloaded_error
 * in the stream before and after text; Gemini 400, 404, 429, 503, in-
 * stream 503 and 400 before output and 503 after.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fake.h"
#include "loom/llm.h"
#include "provider_harness.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RETRIES 2

typedef struct {
    const char *name;
    const char *kind;   /* the adapter */
    const char *script; /* the fake's script, ' for " */
    int rc;             /* what complete() returns */
    loom_upstream_kind ukind;
    int http_status;
    const char *type;      /* resp.error.type; NULL: none */
    const char *message;   /* resp.error.message */
    int requests;          /* 1: not retried; 1 + RETRIES: retried */
    const char *text;      /* text kept */
    const char *reasoning; /* reasoning kept; NULL: none */
} error_case;

#define NOT_RETRIED 1
#define RETRIED (1 + RETRIES)

static const error_case cases[] = {
    /* ---- OpenAI Chat Completions ---- */
    {"openai 400", "openai",
     "{'loop':true,'responses':[{'status':400,'error':{'message':'bad "
     "field','type':'invalid_request_error'}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_BAD_REQUEST, 400, "invalid_request_error",
     "bad field", NOT_RETRIED, "", NULL},
    {"openai 403", "openai",
     "{'loop':true,'responses':[{'status':403,'error':{'message':"
     "'forbidden'}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_PERMISSION, 403, NULL, "forbidden",
     NOT_RETRIED, "", NULL},
    {"openai 404", "openai",
     "{'loop':true,'responses':[{'status':404,'error':{'message':'no such "
     "model','code':'model_not_found'}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_NOT_FOUND, 404, "model_not_found",
     "no such model", NOT_RETRIED, "", NULL},
    {"openai 413", "openai",
     "{'loop':true,'responses':[{'status':413,'error':{'message':"
     "'too big'}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_TOO_LARGE, 413, NULL, "too big", NOT_RETRIED,
     "", NULL},
    /* an error inside the stream is never retried, even before output */
    {"openai stream error before output", "openai",
     "{'loop':true,'responses':[{'stream_error':{'message':'overloaded',"
     "'type':'server_error'}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_STREAM, 200, "server_error", "overloaded",
     NOT_RETRIED, "", NULL},

    /* ---- OpenAI Responses ---- */
    {"responses 401", "openai-responses",
     "{'loop':true,'responses':[{'status':401,'error':{'message':'no key',"
     "'type':'invalid_request_error','code':'invalid_api_key'}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_AUTH, 401, "invalid_request_error", "no key",
     NOT_RETRIED, "", NULL},
    {"responses 403", "openai-responses",
     "{'loop':true,'responses':[{'status':403,'error':{'message':"
     "'forbidden'}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_PERMISSION, 403, NULL, "forbidden",
     NOT_RETRIED, "", NULL},
    {"responses 404", "openai-responses",
     "{'loop':true,'responses':[{'status':404,'error':{'message':"
     "'not found','code':'model_not_found'}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_NOT_FOUND, 404, "model_not_found",
     "not found", NOT_RETRIED, "", NULL},
    {"responses 413", "openai-responses",
     "{'loop':true,'responses':[{'status':413,'error':{'message':"
     "'too big'}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_TOO_LARGE, 413, NULL, "too big", NOT_RETRIED,
     "", NULL},
    {"responses response.failed server_error before output", "openai-responses",
     "{'loop':true,'responses':[{'stream_error':{'message':'boom',"
     "'code':'server_error'},'stream_error_event':'response.failed'}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_STREAM, 200, "server_error", "boom", RETRIED,
     "", NULL},
    {"responses response.failed rate limit before output", "openai-responses",
     "{'loop':true,'responses':[{'stream_error':{'message':'tpm',"
     "'code':'rate_limit_exceeded'},'stream_error_event':"
     "'response.failed'}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_RATE_LIMIT, 200, "rate_limit_exceeded",
     "tpm", NOT_RETRIED, "", NULL},
    {"responses response.failed server_error after output", "openai-responses",
     "{'loop':true,'responses':[{'text':['par'],'stream_error':{'message':"
     "'boom','code':'server_error'},'stream_error_event':"
     "'response.failed'}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_STREAM, 200, "server_error", "boom",
     NOT_RETRIED, "par", NULL},
    {"responses error event rate limit before output", "openai-responses",
     "{'loop':true,'responses':[{'stream_error':{'message':'tpm',"
     "'code':'rate_limit_exceeded'}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_RATE_LIMIT, 200, "rate_limit_exceeded",
     "tpm", NOT_RETRIED, "", NULL},

    /* ---- Anthropic Messages ---- */
    {"anthropic 500", "anthropic",
     "{'loop':true,'responses':[{'status':500,'error':{'message':"
     "'Internal server error'}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_SERVER, 500, "api_error",
     "Internal server error", RETRIED, "", NULL},
    {"anthropic api_error in the stream before output", "anthropic",
     "{'loop':true,'responses':[{'stream_error':{'type':'api_error',"
     "'message':'Internal'}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_STREAM, 200, "api_error", "Internal",
     RETRIED, "", NULL},
    {"anthropic rate_limit_error in the stream before output", "anthropic",
     "{'loop':true,'responses':[{'stream_error':{'type':'rate_limit_error',"
     "'message':'slow down'}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_STREAM, 200, "rate_limit_error", "slow down",
     NOT_RETRIED, "", NULL},
    /* thinking is output too: an overload after it is not retried */
    {"anthropic overloaded_error after thinking", "anthropic",
     "{'loop':true,'responses':[{'reasoning':['Hmm.'],'stream_error':{}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_STREAM, 200, "overloaded_error",
     "Overloaded", NOT_RETRIED, "", "Hmm."},

    /* ---- Gemini ---- */
    {"gemini 401", "gemini",
     "{'loop':true,'responses':[{'status':401,'error':{'message':"
     "'API keys are not supported'}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_AUTH, 401, "UNAUTHENTICATED",
     "API keys are not supported", NOT_RETRIED, "", NULL},
    {"gemini 403", "gemini",
     "{'loop':true,'responses':[{'status':403,'error':{'message':"
     "'denied'}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_PERMISSION, 403, "PERMISSION_DENIED",
     "denied", NOT_RETRIED, "", NULL},
    {"gemini 413", "gemini",
     "{'loop':true,'responses':[{'status':413,'error':{'message':"
     "'too big'}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_TOO_LARGE, 413, "UNKNOWN", "too big",
     NOT_RETRIED, "", NULL},
    {"gemini 500", "gemini",
     "{'loop':true,'responses':[{'status':500,'error':{'message':"
     "'An internal error has occurred.'}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_SERVER, 500, "INTERNAL",
     "An internal error has occurred.", RETRIED, "", NULL},
    /* a streaming request's error body comes SSE-framed */
    {"gemini 503 body in SSE framing", "gemini",
     "{'loop':true,'responses':[{'status':503,'content_type':"
     "'text/event-stream','body':'data: {\\'error\\':{\\'code\\':503,"
     "\\'message\\':\\'The model is overloaded.\\',\\'status\\':"
     "\\'UNAVAILABLE\\'}}\\r\\n\\r\\n'}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_SERVER, 503, "UNAVAILABLE",
     "The model is overloaded.", RETRIED, "", NULL},
    {"gemini 400 body in SSE framing", "gemini",
     "{'loop':true,'responses':[{'status':400,'content_type':"
     "'text/event-stream','body':'data: {\\'error\\':{\\'code\\':400,"
     "\\'message\\':\\'Invalid JSON payload\\',\\'status\\':"
     "\\'INVALID_ARGUMENT\\'}}\\r\\n\\r\\n'}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_BAD_REQUEST, 400, "INVALID_ARGUMENT",
     "Invalid JSON payload", NOT_RETRIED, "", NULL},
    {"gemini 500 in the stream before output", "gemini",
     "{'loop':true,'responses':[{'stream_error':{'code':500,'message':"
     "'internal'}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_STREAM, 200, "INTERNAL", "internal", RETRIED,
     "", NULL},
    {"gemini 429 in the stream before output", "gemini",
     "{'loop':true,'responses':[{'stream_error':{'code':429,'message':"
     "'quota'}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_STREAM, 200, "RESOURCE_EXHAUSTED", "quota",
     RETRIED, "", NULL},
    {"gemini 500 in the stream after thoughts", "gemini",
     "{'loop':true,'responses':[{'reasoning':['Hmm.'],'stream_error':"
     "{'code':500,'message':'internal'}}]}",
     LOOM_EUPSTREAM, LOOM_UPSTREAM_STREAM, 200, "INTERNAL", "internal",
     NOT_RETRIED, "", "Hmm."},
};

static void check_case(const error_case *c)
{
    char *script = provider_quotes(c->script);
    loom_fake *f = fake_start_script(script);
    loom_provider_config pc;
    loom_provider *p = NULL;
    loom_messages msgs = {0};
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_llm_response resp;
    int rc;

    free(script);
    assert_non_null(f);
    provider_config(&pc, f, NULL, "p", c->kind, "test-key", NULL, RETRIES);
    pc.retry_base_delay_ms = 1;
    pc.retry_max_delay_ms = 5;
    assert_int_equal(loom_provider_new(&p, &pc), 0);
    assert_int_equal(loom_messages_add(&msgs, LOOM_ROLE_USER, "Hi"), 0);
    req.model = "fake-model";
    req.messages = msgs.items;
    req.messages_len = msgs.len;
    memset(&resp, 0, sizeof(resp));

    rc = loom_provider_complete(p, &req, NULL, NULL, &resp, NULL);
    if (rc != c->rc || resp.error.kind != c->ukind ||
        (int)fake_request_count(f) != c->requests)
        fprintf(stderr,
                "%s: rc %s (want %s), kind %s (want %s), %zu requests "
                "(want %d): %s\n",
                c->name, loom_error_name(rc), loom_error_name(c->rc),
                loom_upstream_kind_name(resp.error.kind),
                loom_upstream_kind_name(c->ukind), fake_request_count(f),
                c->requests, loom_error_last());
    assert_int_equal(rc, c->rc);
    assert_int_equal(resp.error.kind, c->ukind);
    assert_int_equal(resp.error.http_status, c->http_status);
    if (c->type)
        assert_string_equal(resp.error.type ? resp.error.type : "(null)",
                            c->type);
    else
        assert_null(resp.error.type);
    assert_string_equal(resp.error.message ? resp.error.message : "(null)",
                        c->message);
    /* retried or not, counted where it cannot lie */
    assert_int_equal(fake_request_count(f), (size_t)c->requests);
    assert_int_equal(resp.error.attempts, c->requests);
    assert_string_equal(resp.text ? resp.text : "", c->text);
    if (c->reasoning)
        assert_string_equal(resp.reasoning ? resp.reasoning : "(null)",
                            c->reasoning);
    else
        assert_null(resp.reasoning);
    assert_int_equal(resp.output_started, c->text[0] || c->reasoning);
    /* the message names the provider */
    assert_memory_equal(loom_error_last(), "p: ", 3);

    loom_llm_response_clear(&resp);
    loom_messages_free(&msgs);
    loom_provider_free(p);
    json_decref(pc.headers);
    assert_int_equal(fake_stop_check(f), 0);
}

static void test_case(void **state)
{
    check_case(*state);
}

int main(void)
{
    struct CMUnitTest tests[sizeof(cases) / sizeof(cases[0])];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        memset(&tests[i], 0, sizeof(tests[i]));
        tests[i].name = cases[i].name;
        tests[i].test_func = test_case;
        tests[i].initial_state = (void *)&cases[i];
    }
    return cmocka_run_group_tests(tests, NULL, NULL);
}
