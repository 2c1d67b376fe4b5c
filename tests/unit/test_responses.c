/*
 * Unit tests of the OpenAI Responses wire code (llm/responses.h): no
 * network. The recorded streams of LOOM_VECTORS_DIR/openai-responses are
 * decoded whole, at every two-piece split and one byte at a time, as
 * recorded (no `event:` lines) and as the API and the fake upstream send
 * them (with `event:` lines). Hand-written streams cover reasoning items,
 * parallel function calls, events that servers leave out, terminal
 * statuses, errors, truncation and every limit; request bodies are
 * checked as JSON for every message kind, tool choice, option, and the
 * provider_state round trip (reasoning items sent back, chaining).
 *
 * Streams are written with ' for " (see q()) to stay readable.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/error.h"
#include "llm/openai.h"
#include "llm/responses.h"
#include "loom/buf.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers --------------------------------------------------------- */

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

/*
 * A stream of the given events (written with '), each as `data: <json>`
 * and a blank line; with event_lines, an `event: <type>` line before each
 * (as the API and the fake send them). NULL-terminated list.
 */
static char *stream_of(const char *const *evs, int event_lines)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);

    for (size_t i = 0; evs[i]; i++) {
        char *j = q(evs[i]);
        json_t *o = json_loads(j, 0, NULL);
        const char *type = json_string_value(json_object_get(o, "type"));
        if (event_lines && type)
            assert_int_equal(loom_buf_printf(&b, "event: %s\n", type), 0);
        assert_int_equal(loom_buf_printf(&b, "data: %s\n\n", j), 0);
        json_decref(o);
        free(j);
    }
    return loom_buf_detach(&b);
}

/* data with an `event: <type>` line added before each `data: {` line. */
static char *add_event_lines(const char *data)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    const char *p = data, *nl;

    while (*p) {
        nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) + 1 : strlen(p);
        if (!strncmp(p, "data: {", 7)) {
            json_t *o = json_loadb(p + 6, n - 6, 0, NULL);
            const char *t = json_string_value(json_object_get(o, "type"));
            assert_non_null(t);
            assert_int_equal(loom_buf_printf(&b, "event: %s\n", t), 0);
            json_decref(o);
        }
        assert_int_equal(loom_buf_put(&b, p, n), 0);
        p += n;
    }
    return loom_buf_detach(&b);
}

#define MAX_EVENTS 512

typedef struct {
    loom_buf text;
    loom_buf reasoning;
    loom_buf args[4]; /* TOOL_CALL_DELTA fragments by index */
    char *ids[4];
    char *names[4];
    int ndeltas;
    int ntool_calls_events;
    loom_tool_call calls[8];
    size_t calls_len;
    int nusage;
    loom_usage usage;
    int nfinish;
    char finish[32];
    int types[MAX_EVENTS]; /* every event's type, in order */
    int events;
    int abort_on; /* abort when this event type arrives (-1: never) */
} collector;

static void col_init(collector *c)
{
    memset(c, 0, sizeof(*c));
    loom_buf_init(&c->text, LOOM_BUF_UNLIMITED);
    loom_buf_init(&c->reasoning, LOOM_BUF_UNLIMITED);
    for (int i = 0; i < 4; i++)
        loom_buf_init(&c->args[i], LOOM_BUF_UNLIMITED);
    c->abort_on = -1;
}

static void col_free(collector *c)
{
    loom_buf_free(&c->text);
    loom_buf_free(&c->reasoning);
    for (int i = 0; i < 4; i++) {
        loom_buf_free(&c->args[i]);
        free(c->ids[i]);
        free(c->names[i]);
    }
    for (size_t i = 0; i < c->calls_len; i++)
        loom_tool_call_clear(&c->calls[i]);
}

static int col_cb(const loom_llm_event *ev, void *payload)
{
    collector *c = payload;

    if (c->events < MAX_EVENTS)
        c->types[c->events] = (int)ev->type;
    c->events++;
    if ((int)ev->type == c->abort_on)
        return 1;
    switch (ev->type) {
    case LOOM_LLM_TEXT:
        assert_true(ev->text_len > 0);
        assert_int_equal(loom_buf_put(&c->text, ev->text, ev->text_len), 0);
        break;
    case LOOM_LLM_REASONING:
        assert_true(ev->text_len > 0);
        assert_int_equal(loom_buf_put(&c->reasoning, ev->text, ev->text_len),
                         0);
        break;
    case LOOM_LLM_TOOL_CALL_DELTA:
        c->ndeltas++;
        assert_true(ev->tool_index >= 0 && ev->tool_index < 4);
        assert_non_null(ev->args_delta);
        assert_int_equal(loom_buf_puts(&c->args[ev->tool_index],
                                       ev->args_delta),
                         0);
        if (ev->tool_id) {
            assert_null(c->ids[ev->tool_index]); /* first fragment only */
            c->ids[ev->tool_index] = strdup(ev->tool_id);
        }
        if (ev->tool_name) {
            assert_null(c->names[ev->tool_index]);
            c->names[ev->tool_index] = strdup(ev->tool_name);
        }
        break;
    case LOOM_LLM_TOOL_CALLS:
        c->ntool_calls_events++;
        for (size_t i = 0; i < ev->calls_len && i < 8; i++) {
            c->calls[i].id = strdup(ev->calls[i].id);
            c->calls[i].name = strdup(ev->calls[i].name);
            c->calls[i].arguments = strdup(ev->calls[i].arguments);
            c->calls_len = i + 1;
        }
        break;
    case LOOM_LLM_USAGE:
        c->nusage++;
        c->usage = ev->usage;
        break;
    case LOOM_LLM_FINISH:
        c->nfinish++;
        snprintf(c->finish, sizeof(c->finish), "%s", ev->finish_reason);
        break;
    default:
        break;
    }
    return 0;
}

/*
 * Decodes data fed in pieces: [0, split) and [split, len), or one byte at
 * a time when split is (size_t)-1. Returns feed/finish's first error;
 * exports into resp (when not NULL) and copies the decoder's error.
 */
static int decode_lim(const char *data, size_t len, size_t split,
                      collector *c, loom_llm_response *resp,
                      const loom__responses_limits *lim, int store,
                      loom_upstream_error *err)
{
    loom__responses_decoder *d;
    int rc = 0;

    assert_int_equal(
        loom__responses_decoder_new(&d, lim, store, c ? col_cb : NULL, c), 0);
    if (split == (size_t)-1) {
        for (size_t i = 0; i < len && !rc; i++)
            rc = loom__responses_decoder_feed(d, data + i, 1);
    } else {
        rc = loom__responses_decoder_feed(d, data, split);
        if (!rc)
            rc = loom__responses_decoder_feed(d, data + split, len - split);
    }
    if (!rc)
        rc = loom__responses_decoder_finish(d);
    if (err) {
        const loom_upstream_error *de = loom__responses_decoder_error(d);
        err->kind = de->kind;
        err->type = de->type ? strdup(de->type) : NULL;
        err->message = de->message ? strdup(de->message) : NULL;
    }
    if (resp)
        assert_int_equal(loom__responses_decoder_export(d, resp), 0);
    loom__responses_decoder_free(d);
    return rc;
}

static int decode(const char *data, size_t split, collector *c,
                  loom_llm_response *resp)
{
    return decode_lim(data, strlen(data), split, c, resp, NULL, 0, NULL);
}

/* Asserts that the provider_state text equals the JSON written with '. */
static void assert_state(const char *state, const char *expect)
{
    char *e = q(expect);
    json_t *a = json_loads(state ? state : "null", JSON_DECODE_ANY, NULL);
    json_t *b = json_loads(e, 0, NULL);

    assert_non_null(b);
    if (!json_equal(a, b)) {
        fprintf(stderr, "state: %s\nwant:  %s\n", state ? state : "NULL", e);
        fail();
    }
    json_decref(a);
    json_decref(b);
    free(e);
}

/* ---- recorded vectors ------------------------------------------------ */

typedef struct {
    const char *file;
    const char *text;
    const char *reasoning;
    long prompt, completion, total, reasoning_tokens;
    const char *id;
    const char *state;
} vector;

static const vector vectors[] = {
    {"stream-standard-text-works-1.sse", "Hello world", NULL, 10, 2, 12, 0,
     "resp_test_1",
     "{'openai-responses':{'id':'resp_test_1','store':false,'output':"
     "[{'type':'message','id':'msg_1'}]}}"},
    {"stream-reasoning-works-1.sse", "The answer is 42",
     "Chain: Step 1. Step 2.", 0, 6, 6, 2, "resp_reason_1",
     "{'openai-responses':{'id':'resp_reason_1','store':false,'output':"
     "[{'type':'reasoning','id':'r1','summary':[]},"
     "{'type':'message','id':'msg_2'}]}}"},
};

static void check_vector(const vector *v, const char *data, size_t len,
                         size_t split)
{
    loom_llm_response resp = {0};
    collector c;

    col_init(&c);
    assert_int_equal(decode_lim(data, len, split, &c, &resp, NULL, 0, NULL),
                     0);
    assert_string_equal(loom_buf_cstr(&c.text), v->text);
    assert_string_equal(resp.text, v->text);
    if (v->reasoning) {
        assert_string_equal(loom_buf_cstr(&c.reasoning), v->reasoning);
        assert_string_equal(resp.reasoning, v->reasoning);
    } else {
        assert_null(resp.reasoning);
    }
    assert_int_equal(c.nusage, 1);
    assert_int_equal(resp.usage.prompt_tokens, v->prompt);
    assert_int_equal(resp.usage.completion_tokens, v->completion);
    assert_int_equal(resp.usage.total_tokens, v->total);
    assert_int_equal(resp.usage.reasoning_tokens, v->reasoning_tokens);
    assert_int_equal(resp.usage.cached_tokens, 0);
    assert_int_equal(c.nfinish, 1);
    assert_int_equal(c.types[c.events - 1], LOOM_LLM_FINISH);
    assert_int_equal(c.types[c.events - 2], LOOM_LLM_USAGE);
    assert_string_equal(resp.finish_reason, "stop");
    assert_string_equal(resp.response_id, v->id);
    assert_int_equal(resp.output_started, 1);
    assert_int_equal(resp.tool_calls_len, 0);
    assert_int_equal(c.ntool_calls_events, 0);
    assert_state(resp.provider_state, v->state);
    loom_llm_response_clear(&resp);
    col_free(&c);
}

static void test_vectors(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(vectors) / sizeof(vectors[0]); i++) {
        char *rel, *path, *data, *ev;
        size_t len;

        assert_true(asprintf(&rel, "openai-responses/%s", vectors[i].file) >
                    0);
        path = test_vector_path(rel);
        data = test_read_file(path, &len);
        assert_non_null(data);
        ev = add_event_lines(data);
        assert_true(strlen(ev) > len);
        for (int pass = 0; pass < 2; pass++) {
            const char *s = pass ? ev : data;
            size_t n = strlen(s);
            for (size_t split = 0; split <= n; split++)
                check_vector(&vectors[i], s, n, split);
            check_vector(&vectors[i], s, n, (size_t)-1);
        }
        free(ev);
        free(data);
        free(path);
        free(rel);
    }
}

/* ---- reasoning, text and parallel calls ------------------------------- */

static const char *const tool_stream[] = {
    "{'type':'response.created','sequence_number':0,'response':{'id':"
    "'resp_A','status':'in_progress','output':[],'usage':null}}",
    "{'type':'response.in_progress','response':{'id':'resp_A','status':"
    "'in_progress'}}",
    "{'type':'response.output_item.added','output_index':0,'item':{'id':"
    "'rs_A','type':'reasoning','summary':[]}}",
    "{'type':'response.reasoning_summary_part.added','item_id':'rs_A',"
    "'output_index':0,'summary_index':0,'part':{'type':'summary_text',"
    "'text':''}}",
    "{'type':'response.reasoning_summary_text.delta','item_id':'rs_A',"
    "'output_index':0,'summary_index':0,'delta':'Need the'}",
    "{'type':'response.reasoning_summary_text.delta','item_id':'rs_A',"
    "'output_index':0,'summary_index':0,'delta':' weather.'}",
    "{'type':'response.reasoning_summary_text.delta','item_id':'rs_A',"
    "'output_index':0,'summary_index':1,'delta':'And time.'}",
    "{'type':'response.output_item.done','output_index':0,'item':{'id':"
    "'rs_A','type':'reasoning','summary':[{'type':'summary_text','text':"
    "'Need the weather.'},{'type':'summary_text','text':'And time.'}],"
    "'encrypted_content':'gAAAenc=='}}",
    "{'type':'response.output_item.added','output_index':1,'item':{'id':"
    "'msg_A','type':'message','role':'assistant','status':'in_progress',"
    "'content':[]}}",
    "{'type':'response.output_text.delta','item_id':'msg_A','output_index':"
    "1,'content_index':0,'delta':'Check'}",
    "{'type':'response.output_text.delta','item_id':'msg_A','output_index':"
    "1,'content_index':0,'delta':'ing.'}",
    "{'type':'response.output_text.done','item_id':'msg_A','output_index':"
    "1,'content_index':0,'text':'Checking.'}",
    "{'type':'response.output_item.done','output_index':1,'item':{'id':"
    "'msg_A','type':'message','role':'assistant','status':'completed',"
    "'content':[{'type':'output_text','text':'Checking.','annotations':"
    "[]}]}}",
    "{'type':'response.output_item.added','output_index':2,'item':{'id':"
    "'fc_1','type':'function_call','status':'in_progress','call_id':"
    "'call_1','name':'get_weather','arguments':''}}",
    "{'type':'response.function_call_arguments.delta','item_id':'fc_1',"
    "'output_index':2,'delta':'{\\'city\\':'}",
    "{'type':'response.function_call_arguments.delta','item_id':'fc_1',"
    "'output_index':2,'delta':'\\'Paris\\'}'}",
    "{'type':'response.function_call_arguments.done','item_id':'fc_1',"
    "'output_index':2,'arguments':'{\\'city\\':\\'Paris\\'}'}",
    "{'type':'response.output_item.done','output_index':2,'item':{'id':"
    "'fc_1','type':'function_call','status':'completed','call_id':'call_1',"
    "'name':'get_weather','arguments':'{\\'city\\':\\'Paris\\'}'}}",
    "{'type':'response.output_item.added','output_index':3,'item':{'id':"
    "'fc_2','type':'function_call','call_id':'call_2','name':'get_time',"
    "'arguments':''}}",
    "{'type':'response.function_call_arguments.delta','item_id':'fc_2',"
    "'output_index':3,'delta':'{\\'tz\\':\\'CET\\'}'}",
    "{'type':'response.output_item.done','output_index':3,'item':{'id':"
    "'fc_2','type':'function_call','call_id':'call_2','name':'get_time',"
    "'arguments':'{\\'tz\\':\\'CET\\'}'}}",
    "{'type':'response.completed','response':{'id':'resp_A','status':"
    "'completed','output':[{'id':'rs_A','type':'reasoning','summary':[{"
    "'type':'summary_text','text':'Need the weather.'}],"
    "'encrypted_content':'gAAAenc=='},{'id':'msg_A','type':'message',"
    "'role':'assistant','content':[{'type':'output_text','text':"
    "'Checking.'}]},{'id':'fc_1','type':'function_call','call_id':'call_1',"
    "'name':'get_weather','arguments':'{\\'city\\':\\'Paris\\'}'},{'id':"
    "'fc_2','type':'function_call','call_id':'call_2','name':'get_time',"
    "'arguments':'{\\'tz\\':\\'CET\\'}'}],'usage':{'input_tokens':20,"
    "'input_tokens_details':{'cached_tokens':8},'output_tokens':30,"
    "'output_tokens_details':{'reasoning_tokens':12},'total_tokens':50}}}",
    NULL};

static const char *const tool_state =
    "{'openai-responses':{'id':'resp_A','store':false,'output':["
    "{'type':'reasoning','id':'rs_A','summary':[{'type':'summary_text',"
    "'text':'Need the weather.'},{'type':'summary_text','text':"
    "'And time.'}],'encrypted_content':'gAAAenc=='},"
    "{'type':'message','id':'msg_A'},"
    "{'type':'function_call','id':'fc_1','call_id':'call_1'},"
    "{'type':'function_call','id':'fc_2','call_id':'call_2'}]}}";

static void check_tools(const char *data, size_t split)
{
    loom_llm_response resp = {0};
    collector c;
    int n;

    col_init(&c);
    assert_int_equal(decode(data, split, &c, &resp), 0);
    assert_string_equal(loom_buf_cstr(&c.reasoning),
                        "Need the weather.\n\nAnd time.");
    assert_string_equal(resp.reasoning, "Need the weather.\n\nAnd time.");
    assert_string_equal(resp.text, "Checking.");
    assert_string_equal(loom_buf_cstr(&c.text), "Checking.");
    /* deltas: the first fragment of each call has its id and name */
    assert_string_equal(c.ids[0], "call_1");
    assert_string_equal(c.names[0], "get_weather");
    assert_string_equal(loom_buf_cstr(&c.args[0]), "{\"city\":\"Paris\"}");
    assert_string_equal(c.ids[1], "call_2");
    assert_string_equal(c.names[1], "get_time");
    assert_string_equal(loom_buf_cstr(&c.args[1]), "{\"tz\":\"CET\"}");
    assert_int_equal(c.ndeltas, 5);
    /* closing events: USAGE, TOOL_CALLS, FINISH, once each, last */
    n = c.events;
    assert_int_equal(c.types[n - 3], LOOM_LLM_USAGE);
    assert_int_equal(c.types[n - 2], LOOM_LLM_TOOL_CALLS);
    assert_int_equal(c.types[n - 1], LOOM_LLM_FINISH);
    assert_int_equal(c.ntool_calls_events, 1);
    assert_int_equal(c.calls_len, 2);
    assert_string_equal(c.calls[0].id, "call_1");
    assert_string_equal(c.calls[1].arguments, "{\"tz\":\"CET\"}");
    assert_string_equal(c.finish, "tool_calls");
    assert_int_equal(resp.tool_calls_len, 2);
    assert_string_equal(resp.tool_calls[0].name, "get_weather");
    assert_string_equal(resp.tool_calls[0].arguments, "{\"city\":\"Paris\"}");
    assert_string_equal(resp.tool_calls[1].id, "call_2");
    assert_int_equal(resp.usage.prompt_tokens, 20);
    assert_int_equal(resp.usage.cached_tokens, 8);
    assert_int_equal(resp.usage.completion_tokens, 30);
    assert_int_equal(resp.usage.reasoning_tokens, 12);
    assert_int_equal(resp.usage.total_tokens, 50);
    assert_string_equal(resp.response_id, "resp_A");
    /* the item's final form wins over the terminal repetition */
    assert_state(resp.provider_state, tool_state);
    loom_llm_response_clear(&resp);
    col_free(&c);
}

static void test_tool_calls(void **state)
{
    char *data = stream_of(tool_stream, 0);
    char *ev = stream_of(tool_stream, 1);
    size_t n = strlen(data);

    (void)state;
    for (size_t split = 0; split <= n; split++)
        check_tools(data, split);
    check_tools(data, (size_t)-1);
    check_tools(ev, strlen(ev) / 2);
    check_tools(ev, (size_t)-1);
    free(data);
    free(ev);
}

/* Items known only from their final form, or only from the terminal
 * response, are emitted once; streamed ones are not emitted again. */
static void test_reconcile(void **state)
{
    static const char *const evs[] = {
        "{'type':'response.created','response':{'id':'resp_R'}}",
        /* a message with no deltas: only its done */
        "{'type':'response.output_item.done','output_index':0,'item':{'id':"
        "'msg_R','type':'message','content':[{'type':'output_text','text':"
        "'Hi. '},{'type':'refusal','refusal':'No.'}]}}",
        /* a call with no added and no deltas */
        "{'type':'response.output_item.done','output_index':1,'item':{'id':"
        "'fc_R','type':'function_call','call_id':'call_R','name':'f',"
        "'arguments':'{\\'a\\':1}'}}",
        /* a call whose deltas disagree with its final arguments */
        "{'type':'response.output_item.added','output_index':2,'item':{"
        "'type':'function_call','call_id':'call_S','name':'g'}}",
        "{'type':'response.function_call_arguments.delta','output_index':2,"
        "'delta':'{\\'b\\''}",
        "{'type':'response.function_call_arguments.done','output_index':2,"
        "'arguments':'{\\'b\\':2}'}",
        /* a reasoning item and a call only in the terminal response; a
         * hosted tool item that loom ignores */
        "{'type':'response.completed','response':{'id':'resp_R','status':"
        "'completed','output':[{'id':'msg_R','type':'message','content':[{"
        "'type':'output_text','text':'Hi. '}]},{'id':'fc_R','type':"
        "'function_call','call_id':'call_R','name':'f','arguments':"
        "'{\\'a\\':1}'},{'type':'function_call','call_id':'call_S','name':"
        "'g','arguments':'{\\'b\\':2}'},{'id':'rs_R','type':'reasoning',"
        "'summary':[],'content':[{'type':'reasoning_text','text':'Hmm.'}]},"
        "{'id':'ws_1','type':'web_search_call','status':'completed'},{'id':"
        "'fc_T','type':'function_call','call_id':'call_T','name':'h'}]}}",
        NULL};
    char *data = stream_of(evs, 0);
    loom_llm_response resp = {0};
    collector c;

    (void)state;
    col_init(&c);
    assert_int_equal(decode(data, strlen(data), &c, &resp), 0);
    assert_string_equal(resp.text, "Hi. No.");
    assert_string_equal(loom_buf_cstr(&c.text), "Hi. No.");
    assert_string_equal(resp.reasoning, "Hmm.");
    assert_int_equal(resp.tool_calls_len, 3);
    assert_string_equal(resp.tool_calls[0].id, "call_R");
    assert_string_equal(resp.tool_calls[0].arguments, "{\"a\":1}");
    assert_string_equal(loom_buf_cstr(&c.args[0]), "{\"a\":1}");
    assert_string_equal(c.names[0], "f");
    /* the final arguments win; the fragments already passed on stay */
    assert_string_equal(resp.tool_calls[1].arguments, "{\"b\":2}");
    assert_string_equal(loom_buf_cstr(&c.args[1]), "{\"b\"");
    assert_string_equal(resp.tool_calls[2].id, "call_T");
    assert_string_equal(resp.tool_calls[2].arguments, "{}");
    assert_string_equal(resp.finish_reason, "tool_calls");
    /* no usage in the answer: no USAGE event */
    assert_int_equal(c.nusage, 0);
    assert_state(resp.provider_state,
                 "{'openai-responses':{'id':'resp_R','store':false,'output':"
                 "[{'type':'message','id':'msg_R'},{'type':'function_call',"
                 "'id':'fc_R','call_id':'call_R'},{'type':'function_call',"
                 "'call_id':'call_S'},{'type':'reasoning','id':'rs_R',"
                 "'summary':[]},{'type':'function_call','id':'fc_T',"
                 "'call_id':'call_T'}]}}");
    loom_llm_response_clear(&resp);
    col_free(&c);
    free(data);
}

/* ---- terminal statuses and errors ------------------------------------ */

static void test_incomplete(void **state)
{
    static const char *const evs[] = {
        "{'type':'response.output_item.added','output_index':0,'item':{"
        "'type':'function_call','call_id':'c1','name':'f'}}",
        "{'type':'response.output_item.done','output_index':0,'item':{"
        "'type':'function_call','call_id':'c1','name':'f','arguments':"
        "'{}'}}",
        "{'type':'response.output_item.added','output_index':1,'item':{"
        "'type':'function_call','call_id':'c2','name':'g'}}",
        "{'type':'response.function_call_arguments.delta','output_index':1,"
        "'delta':'{\\'x'}",
        "{'type':'response.incomplete','response':{'id':'resp_I','status':"
        "'incomplete','incomplete_details':{'reason':'max_output_tokens'},"
        "'output':[],'usage':{'input_tokens':5,'output_tokens':7}}}",
        NULL};
    static const char *const filtered[] = {
        "{'type':'response.output_text.delta','output_index':0,'delta':"
        "'Some'}",
        "{'type':'response.incomplete','response':{'status':'incomplete',"
        "'incomplete_details':{'reason':'content_filter'}}}",
        NULL};
    char *data = stream_of(evs, 1);
    loom_llm_response resp = {0};
    collector c;

    (void)state;
    col_init(&c);
    assert_int_equal(decode(data, strlen(data), &c, &resp), 0);
    assert_string_equal(resp.finish_reason, "length");
    /* the call cut by the limit is left out, the whole one kept */
    assert_int_equal(resp.tool_calls_len, 1);
    assert_string_equal(resp.tool_calls[0].id, "c1");
    assert_int_equal(resp.usage.total_tokens, 12); /* input + output */
    loom_llm_response_clear(&resp);
    col_free(&c);
    free(data);

    data = stream_of(filtered, 0);
    col_init(&c);
    assert_int_equal(decode(data, strlen(data), &c, &resp), 0);
    assert_string_equal(resp.finish_reason, "content_filter");
    assert_string_equal(resp.text, "Some");
    assert_null(resp.response_id);
    assert_null(resp.provider_state);
    loom_llm_response_clear(&resp);
    col_free(&c);
    free(data);
}

static void test_errors(void **state)
{
    static const struct {
        const char *ev;
        loom_upstream_kind kind;
        const char *type;
        const char *message;
    } cases[] = {
        {"{'type':'error','code':'server_error','message':'boom','param':"
         "null,'sequence_number':3}",
         LOOM_UPSTREAM_STREAM, "server_error", "boom"},
        {"{'type':'error','code':'rate_limit_exceeded','message':'slow "
         "down'}",
         LOOM_UPSTREAM_RATE_LIMIT, "rate_limit_exceeded", "slow down"},
        {"{'type':'error','error':{'type':'invalid_request_error','code':"
         "null,'message':'bad'}}",
         LOOM_UPSTREAM_STREAM, "invalid_request_error", "bad"},
        {"{'type':'error'}", LOOM_UPSTREAM_STREAM, NULL,
         "error event without a message"},
        {"{'error':{'message':'plain','type':'server_error'}}",
         LOOM_UPSTREAM_STREAM, "server_error", "plain"},
        {"{'type':'response.failed','response':{'id':'resp_F','status':"
         "'failed','error':{'code':'server_error','message':'The model "
         "failed'}}}",
         LOOM_UPSTREAM_STREAM, "server_error", "The model failed"},
        {"{'type':'response.failed','response':{'status':'failed','error':"
         "{'code':'rate_limit_exceeded','message':'tpm'}}}",
         LOOM_UPSTREAM_RATE_LIMIT, "rate_limit_exceeded", "tpm"},
        {"{'type':'response.failed','response':{'status':'failed'}}",
         LOOM_UPSTREAM_STREAM, NULL, "the response failed"},
        {"{'type':'response.completed','response':{'status':'cancelled'}}",
         LOOM_UPSTREAM_STREAM, NULL, "the response was cancelled"},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *evs[] = {
            "{'type':'response.output_item.added','output_index':0,'item':{"
            "'type':'function_call','call_id':'c1','name':'f'}}",
            "{'type':'response.output_item.done','output_index':0,'item':{"
            "'type':'function_call','call_id':'c1','name':'f'}}",
            "{'type':'response.output_text.delta','output_index':1,'delta':"
            "'par'}",
            cases[i].ev,
            "{'type':'response.output_text.delta','output_index':1,'delta':"
            "'after'}",
            NULL};
        char *data = stream_of(evs, (int)(i & 1));
        loom_upstream_error err = {0};
        loom_llm_response resp = {0};
        collector c;

        col_init(&c);
        assert_int_equal(decode_lim(data, strlen(data), strlen(data), &c,
                                    &resp, NULL, 0, &err),
                         LOOM_EUPSTREAM);
        assert_int_equal(err.kind, cases[i].kind);
        if (cases[i].type)
            assert_string_equal(err.type, cases[i].type);
        else
            assert_null(err.type);
        assert_string_equal(err.message, cases[i].message);
        assert_string_equal(loom_error_last(), cases[i].message);
        /* the partial answer stays; no call of it may be run */
        assert_string_equal(resp.text, "par");
        assert_int_equal(resp.output_started, 1);
        assert_int_equal(resp.tool_calls_len, 0);
        assert_null(resp.finish_reason);
        assert_null(resp.provider_state);
        assert_int_equal(c.nfinish, 0);
        loom_llm_response_clear(&resp);
        loom__upstream_error_clear(&err);
        col_free(&c);
        free(data);
    }
    assert_int_equal(loom__responses_code_kind(NULL), LOOM_UPSTREAM_STREAM);
    assert_int_equal(loom__responses_code_kind("rate_limit_exceeded"),
                     LOOM_UPSTREAM_RATE_LIMIT);
    assert_int_equal(loom__responses_code_kind("server_error"),
                     LOOM_UPSTREAM_STREAM);
}

static void test_truncated(void **state)
{
    static const char *const evs[] = {
        "{'type':'response.created','response':{'id':'resp_T'}}",
        "{'type':'response.output_text.delta','output_index':0,'delta':"
        "'Hel'}",
        NULL};
    char *data = stream_of(evs, 1), *done;
    loom_upstream_error err = {0};
    loom_llm_response resp = {0};
    collector c;

    (void)state;
    col_init(&c);
    assert_int_equal(decode_lim(data, strlen(data), 5, &c, &resp, NULL, 0,
                                &err),
                     LOOM_EUPSTREAM);
    assert_int_equal(err.kind, LOOM_UPSTREAM_CONNECTION);
    assert_string_equal(resp.text, "Hel");
    assert_string_equal(resp.response_id, "resp_T");
    assert_null(resp.finish_reason);
    loom_llm_response_clear(&resp);
    loom__upstream_error_clear(&err);
    col_free(&c);
    /* [DONE] is not an end: only the terminal event is */
    assert_true(asprintf(&done, "%sdata: [DONE]\n\n", data) > 0);
    assert_int_equal(decode_lim(done, strlen(done), 0, NULL, NULL, NULL, 0,
                                &err),
                     LOOM_EUPSTREAM);
    assert_int_equal(err.kind, LOOM_UPSTREAM_CONNECTION);
    loom__upstream_error_clear(&err);
    free(done);
    /* nothing at all */
    assert_int_equal(decode("", 0, NULL, NULL), LOOM_EUPSTREAM);
    free(data);
}

static void test_malformed(void **state)
{
    static const char *const bad[] = {
        "data: {not json\n\n",
        "data: [1,2]\n\n",
        /* arguments for no call */
        "data: {\"type\":\"response.function_call_arguments.delta\","
        "\"output_index\":0,\"delta\":\"x\"}\n\n",
        "data: {\"type\":\"response.output_item.added\",\"output_index\":0,"
        "\"item\":{\"type\":\"message\"}}\n\n"
        "data: {\"type\":\"response.function_call_arguments.delta\","
        "\"output_index\":0,\"delta\":\"x\"}\n\n",
        "data: {\"type\":\"response.output_text.delta\",\"output_index\":-1,"
        "\"delta\":\"x\"}\n\n",
        /* an item that changes its type */
        "data: {\"type\":\"response.output_item.added\",\"output_index\":0,"
        "\"item\":{\"type\":\"message\"}}\n\n"
        "data: {\"type\":\"response.output_item.done\",\"output_index\":0,"
        "\"item\":{\"type\":\"function_call\",\"name\":\"f\"}}\n\n",
        "data: {\"type\":\"response.output_item.added\",\"output_index\":0}"
        "\n\n",
        /* a call without a name */
        "data: {\"type\":\"response.output_item.added\",\"output_index\":0,"
        "\"item\":{\"type\":\"function_call\",\"call_id\":\"c\"}}\n\n"
        "data: {\"type\":\"response.completed\",\"response\":{\"status\":"
        "\"completed\"}}\n\n",
        "data: {\"type\":\"response.completed\"}\n\n",
        "data: {\"type\":\"response.completed\",\"response\":{\"status\":"
        "\"in_progress\"}}\n\n",
    };

    (void)state;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        loom_llm_response resp = {0};
        assert_int_equal(decode(bad[i], strlen(bad[i]), NULL, &resp),
                         LOOM_EPROTO);
        assert_int_equal(resp.tool_calls_len, 0);
        loom_llm_response_clear(&resp);
    }
}

static void test_callback_abort(void **state)
{
    char *data = stream_of(tool_stream, 0);
    int types[] = {LOOM_LLM_REASONING, LOOM_LLM_TEXT,
                   LOOM_LLM_TOOL_CALL_DELTA, LOOM_LLM_USAGE,
                   LOOM_LLM_TOOL_CALLS, LOOM_LLM_FINISH};

    (void)state;
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        loom_llm_response resp = {0};
        collector c;
        col_init(&c);
        c.abort_on = types[i];
        assert_int_equal(decode(data, strlen(data), &c, &resp),
                         LOOM_ECANCELED);
        assert_int_equal(c.types[c.events - 1], types[i]);
        assert_int_equal(resp.tool_calls_len, 0);
        loom_llm_response_clear(&resp);
        col_free(&c);
    }
    free(data);
}

/* ---- limits ---------------------------------------------------------- */

/* n calls of one byte of arguments each, then response.completed. */
static char *calls_stream(size_t n)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);

    for (size_t i = 0; i < n; i++)
        assert_int_equal(
            loom_buf_printf(&b,
                            "data: {\"type\":\"response.output_item.done\","
                            "\"output_index\":%zu,\"item\":{\"type\":"
                            "\"function_call\",\"call_id\":\"c%zu\","
                            "\"name\":\"f\",\"arguments\":\"{}\"}}\n\n",
                            i, i),
            0);
    assert_int_equal(loom_buf_puts(&b, "data: {\"type\":\"response.completed"
                                       "\",\"response\":{}}\n\n"),
                     0);
    return loom_buf_detach(&b);
}

static void test_limits(void **state)
{
    loom__responses_limits lim = {0};
    loom_llm_response resp = {0};
    char *s;

    (void)state;
    /* tool calls: at the limit, and one past it */
    lim.max_tool_calls = 3;
    s = calls_stream(3);
    assert_int_equal(decode_lim(s, strlen(s), 0, NULL, &resp, &lim, 0, NULL),
                     0);
    assert_int_equal(resp.tool_calls_len, 3);
    loom_llm_response_clear(&resp);
    free(s);
    s = calls_stream(4);
    assert_int_equal(decode_lim(s, strlen(s), 0, NULL, NULL, &lim, 0, NULL),
                     LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "more than 3 tool calls"));
    free(s);
    /* output items */
    memset(&lim, 0, sizeof(lim));
    lim.max_items = 4;
    s = calls_stream(4);
    assert_int_equal(decode_lim(s, strlen(s), 0, NULL, NULL, &lim, 0, NULL),
                     0);
    free(s);
    s = calls_stream(5);
    assert_int_equal(decode_lim(s, strlen(s), 0, NULL, NULL, &lim, 0, NULL),
                     LOOM_ETOOLARGE);
    free(s);
    /* arguments of one call */
    memset(&lim, 0, sizeof(lim));
    lim.max_args = 10;
    s = q("data: {'type':'response.output_item.added','output_index':0,"
          "'item':{'type':'function_call','call_id':'c','name':'f'}}\n\n"
          "data: {'type':'response.function_call_arguments.delta',"
          "'output_index':0,'delta':'0123456789'}\n\n"
          "data: {'type':'response.function_call_arguments.delta',"
          "'output_index':0,'delta':'x'}\n\n");
    assert_int_equal(decode_lim(s, strlen(s), 0, NULL, NULL, &lim, 0, NULL),
                     LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "arguments"));
    {
        /* whole arguments in an item's final form count too */
        char *one = q("data: {'type':'response.output_item.done',"
                      "'output_index':0,'item':{'type':'function_call',"
                      "'call_id':'c','name':'f','arguments':'01234567890'}}"
                      "\n\n");
        assert_int_equal(decode_lim(one, strlen(one), 0, NULL, NULL, &lim, 0,
                                    NULL),
                         LOOM_ETOOLARGE);
        free(one);
    }
    /* exactly at the limit is fine (the stream then lacks its end) */
    s[strlen(s) - strlen("data: {\"type\":\"response.function_call_"
                         "arguments.delta\",\"output_index\":0,\"delta\":"
                         "\"x\"}\n\n")] = '\0';
    assert_int_equal(decode_lim(s, strlen(s), 0, NULL, NULL, &lim, 0, NULL),
                     LOOM_EUPSTREAM);
    free(s);
    /* text and reasoning */
    memset(&lim, 0, sizeof(lim));
    lim.max_text = 8;
    s = q("data: {'type':'response.output_text.delta','delta':'12345678'}"
          "\n\ndata: {'type':'response.output_text.delta','delta':'9'}\n\n");
    assert_int_equal(decode_lim(s, strlen(s), 0, NULL, &resp, &lim, 0, NULL),
                     LOOM_ETOOLARGE);
    assert_string_equal(resp.text, "12345678");
    loom_llm_response_clear(&resp);
    free(s);
    s = q("data: {'type':'response.reasoning_text.delta','delta':'1234'}"
          "\n\ndata: {'type':'response.reasoning_text.delta','delta':"
          "'56789'}\n\n");
    assert_int_equal(decode_lim(s, strlen(s), 0, NULL, NULL, &lim, 0, NULL),
                     LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "reasoning"));
    free(s);
    /* one SSE event past the line limit (4 * max_text + state + 64 KiB) */
    memset(&lim, 0, sizeof(lim));
    lim.max_text = 16;
    lim.max_args = 16;
    lim.max_state = 16;
    {
        size_t n = 4 * 16 + 16 + 65536 + 10;
        char *line = malloc(n + 16);
        assert_non_null(line);
        memcpy(line, "data: ", 6);
        memset(line + 6, ' ', n);
        memcpy(line + 6 + n, "\n\n", 3);
        assert_int_equal(decode_lim(line, strlen(line), 0, NULL, NULL, &lim,
                                    0, NULL),
                         LOOM_ETOOLARGE);
        free(line);
    }
    /* kept reasoning state */
    memset(&lim, 0, sizeof(lim));
    lim.max_state = 200;
    for (int pass = 0; pass < 2; pass++) {
        char enc[128];
        size_t n = pass ? 60 : 20;
        memset(enc, 'e', n);
        enc[n] = '\0';
        assert_true(asprintf(&s,
                             "data: {\"type\":\"response.output_item.done\","
                             "\"output_index\":0,\"item\":{\"id\":\"rs\","
                             "\"type\":\"reasoning\",\"summary\":[],"
                             "\"encrypted_content\":\"%s\"}}\n\n"
                             "data: {\"type\":\"response.output_item.done\","
                             "\"output_index\":1,\"item\":{\"id\":\"rs2\","
                             "\"type\":\"reasoning\",\"summary\":[],"
                             "\"encrypted_content\":\"%s\"}}\n\n"
                             "data: {\"type\":\"response.completed\","
                             "\"response\":{}}\n\n",
                             enc, enc) > 0);
        assert_int_equal(decode_lim(s, strlen(s), 0, NULL, NULL, &lim, 0,
                                    NULL),
                         pass ? LOOM_ETOOLARGE : 0);
        free(s);
    }
}

/* ---- non-streamed answers -------------------------------------------- */

static void test_complete_body(void **state)
{
    char *body = q(
        "{'id':'resp_J','object':'response','status':'completed','error':"
        "null,'output':[{'id':'rs_J','type':'reasoning','summary':[{'type':"
        "'summary_text','text':'A.'},{'type':'summary_text','text':'B.'}],"
        "'encrypted_content':'enc'},{'id':'msg_J','type':'message','role':"
        "'assistant','content':[{'type':'output_text','text':'Hello'}]},{"
        "'id':'fc_J','type':'function_call','call_id':'call_J','name':'f',"
        "'arguments':'{\\'q\\':1}'}],'usage':{'input_tokens':3,"
        "'output_tokens':4,'total_tokens':7}}");
    loom__responses_decoder *d;
    loom_llm_response resp = {0};
    collector c;

    (void)state;
    col_init(&c);
    assert_int_equal(loom__responses_decoder_new(&d, NULL, 1, col_cb, &c), 0);
    assert_int_equal(loom__responses_decoder_complete(d, body, strlen(body)),
                     0);
    assert_true(loom__responses_decoder_done(d));
    assert_int_equal(loom__responses_decoder_export(d, &resp), 0);
    loom__responses_decoder_free(d);
    assert_string_equal(resp.text, "Hello");
    assert_string_equal(resp.reasoning, "A.\n\nB.");
    assert_int_equal(resp.tool_calls_len, 1);
    assert_string_equal(resp.tool_calls[0].arguments, "{\"q\":1}");
    assert_string_equal(c.names[0], "f");
    assert_string_equal(loom_buf_cstr(&c.args[0]), "{\"q\":1}");
    assert_int_equal(c.ndeltas, 1); /* one fragment: id, name, arguments */
    assert_string_equal(resp.finish_reason, "tool_calls");
    assert_int_equal(resp.usage.total_tokens, 7);
    assert_int_equal(c.types[c.events - 1], LOOM_LLM_FINISH);
    assert_state(resp.provider_state,
                 "{'openai-responses':{'id':'resp_J','store':true,'output':"
                 "[{'type':'reasoning','id':'rs_J','summary':[{'type':"
                 "'summary_text','text':'A.'},{'type':'summary_text','text':"
                 "'B.'}],'encrypted_content':'enc'},{'type':'message','id':"
                 "'msg_J'},{'type':'function_call','id':'fc_J','call_id':"
                 "'call_J'}]}}");
    loom_llm_response_clear(&resp);
    col_free(&c);
    free(body);

    /* error bodies and bad ones */
    {
        static const struct {
            const char *body;
            int rc;
        } bad[] = {
            {"{'error':{'message':'nope','code':'server_error'}}",
             LOOM_EUPSTREAM},
            {"{'id':'r','status':'failed','error':{'message':'x','code':"
             "'server_error'}}",
             LOOM_EUPSTREAM},
            {"{'id':'r','status':'queued'}", LOOM_EPROTO},
            {"not json", LOOM_EPROTO},
            {"[]", LOOM_EPROTO},
        };
        for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
            char *b = q(bad[i].body);
            assert_int_equal(
                loom__responses_decoder_new(&d, NULL, 0, NULL, NULL), 0);
            assert_int_equal(loom__responses_decoder_complete(d, b, strlen(b)),
                             bad[i].rc);
            assert_false(loom__responses_decoder_done(d));
            if (bad[i].rc == LOOM_EUPSTREAM)
                assert_int_equal(loom__responses_decoder_error(d)->kind,
                                 LOOM_UPSTREAM_STREAM);
            loom__responses_decoder_free(d);
            free(b);
        }
    }
}

/* ---- request bodies -------------------------------------------------- */

/* Asserts json equals the JSON written with '. */
static void assert_json(const json_t *j, const char *expect)
{
    char *e = q(expect);
    json_error_t je;
    json_t *b = json_loads(e, 0, &je);

    if (!b)
        fprintf(stderr, "bad expectation: %s: %s\n", je.text, e);
    assert_non_null(b);
    if (!json_equal((json_t *)j, b)) {
        char *s = json_dumps(j, JSON_COMPACT);
        fprintf(stderr, "got:  %s\nwant: %s\n", s, e);
        free(s);
        fail();
    }
    json_decref(b);
    free(e);
}

static json_t *build(const loom_llm_request *req)
{
    json_t *body = NULL;

    assert_int_equal(loom__responses_build_body(&body, req), 0);
    assert_non_null(body);
    return body;
}

static void test_body_messages(void **state)
{
    loom_tool_call calls[2] = {{"call_1", "get_weather", "{\"city\":\"P\"}"},
                               {"call_2", "get_time", ""}};
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_messages m = {0};
    json_t *body;

    (void)state;
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_SYSTEM, "Be brief."), 0);
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_SYSTEM, ""), 0);
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_SYSTEM, "Use tools."),
                     0);
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_USER, "Weather? \xff"),
                     0);
    assert_int_equal(
        loom_messages_add_assistant(&m, "Checking.", "thought", calls, 2), 0);
    assert_int_equal(
        loom_messages_add_tool_result(&m, "call_1", "get_weather", "sunny"),
        0);
    assert_int_equal(
        loom_messages_add_tool_result(&m, "call_2", "get_time", NULL), 0);
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_SYSTEM, "Limit."), 0);
    assert_int_equal(loom_messages_add_assistant(&m, NULL, NULL, calls, 1),
                     0);
    assert_int_equal(loom_messages_add_assistant(&m, "", NULL, NULL, 0), 0);
    req.model = "gpt-5";
    req.messages = m.items;
    req.messages_len = m.len;
    body = build(&req);
    assert_json(
        body,
        "{'model':'gpt-5','instructions':'Be brief.\\n\\nUse tools.',"
        "'input':["
        "{'type':'message','role':'user','content':'Weather? \xef\xbf\xbd'},"
        "{'type':'message','role':'assistant','content':'Checking.'},"
        "{'type':'function_call','call_id':'call_1','name':'get_weather',"
        "'arguments':'{\\'city\\':\\'P\\'}'},"
        "{'type':'function_call','call_id':'call_2','name':'get_time',"
        "'arguments':'{}'},"
        "{'type':'function_call_output','call_id':'call_1','output':"
        "'sunny'},"
        "{'type':'function_call_output','call_id':'call_2','output':''},"
        "{'type':'message','role':'developer','content':'Limit.'},"
        "{'type':'function_call','call_id':'call_1','name':'get_weather',"
        "'arguments':'{\\'city\\':\\'P\\'}'}],"
        "'store':false,'stream':true}");
    json_decref(body);
    /* no system message: no instructions; not streamed: no stream */
    req.messages = m.items + 3;
    req.messages_len = 1;
    req.stream = 0;
    body = build(&req);
    assert_json(body, "{'model':'gpt-5','input':[{'type':'message','role':"
                      "'user','content':'Weather? \xef\xbf\xbd'}],"
                      "'store':false}");
    json_decref(body);
    loom_messages_free(&m);
}

static void test_body_options(void **state)
{
    json_t *params = json_pack("{s:s,s:{s:{s:s}}}", "type", "object",
                               "properties", "city", "type", "string");
    loom_tool_def tools[2] = {{"get_weather", "Weather now", params},
                              {"noargs", NULL, NULL}};
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_messages m = {0};
    json_t *body;
    static char weather[] = "get_weather", empty[] = "";
    static const struct {
        loom_tool_choice_kind kind;
        char *fn;
        const char *json;
    } choices[] = {
        {LOOM_TOOL_CHOICE_AUTO, NULL, "'auto'"},
        {LOOM_TOOL_CHOICE_NONE, NULL, "'none'"},
        {LOOM_TOOL_CHOICE_REQUIRED, NULL, "'required'"},
        {LOOM_TOOL_CHOICE_FUNCTION, weather,
         "{'type':'function','name':'get_weather'}"},
    };

    (void)state;
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_USER, "Hi"), 0);
    req.model = "o4-mini";
    req.messages = m.items;
    req.messages_len = m.len;
    req.tools = tools;
    req.tools_len = 2;
    req.parallel_tool_calls = 1;
    req.max_tokens = 500;
    req.temperature = 0.5;
    req.reasoning_effort = "high";
    for (size_t i = 0; i < sizeof(choices) / sizeof(choices[0]); i++) {
        char *want;
        req.tool_choice.kind = choices[i].kind;
        req.tool_choice.function = choices[i].fn;
        body = build(&req);
        assert_true(asprintf(
                        &want,
                        "{'model':'o4-mini','input':[{'type':'message',"
                        "'role':'user','content':'Hi'}],'tools':[{'type':"
                        "'function','name':'get_weather','description':"
                        "'Weather now','parameters':{'type':'object',"
                        "'properties':{'city':{'type':'string'}}},'strict':"
                        "false},{'type':'function','name':'noargs',"
                        "'parameters':{'type':'object','properties':{}},"
                        "'strict':false}],'tool_choice':%s,"
                        "'parallel_tool_calls':true,'max_output_tokens':500,"
                        "'temperature':0.5,'reasoning':{'effort':'high'},"
                        "'store':false,'include':["
                        "'reasoning.encrypted_content'],'stream':true}",
                        choices[i].json) > 0);
        assert_json(body, want);
        free(want);
        json_decref(body);
    }
    /* chaining stores; no include then */
    req.chain_responses = 1;
    req.tools_len = 0;
    req.parallel_tool_calls = 0;
    body = build(&req);
    assert_json(body, "{'model':'o4-mini','input':[{'type':'message','role':"
                      "'user','content':'Hi'}],'max_output_tokens':500,"
                      "'temperature':0.5,'reasoning':{'effort':'high'},"
                      "'store':true,'stream':true}");
    json_decref(body);
    /* what is refused */
    req.model = NULL;
    assert_int_equal(loom__responses_build_body(&body, &req), LOOM_EINVALID);
    assert_null(body);
    req.model = "m";
    req.tools_len = 2;
    req.tool_choice.kind = LOOM_TOOL_CHOICE_FUNCTION;
    req.tool_choice.function = empty;
    assert_int_equal(loom__responses_build_body(&body, &req), LOOM_EINVALID);
    req.tool_choice.kind = LOOM_TOOL_CHOICE_AUTO;
    req.temperature = INFINITY;
    assert_int_equal(loom__responses_build_body(&body, &req), LOOM_EINVALID);
    /* NaN is not >= 0: unset, as in the "openai" adapter */
    req.temperature = NAN;
    body = build(&req);
    assert_null(json_object_get(body, "temperature"));
    json_decref(body);
    loom_messages_free(&m);
    json_decref(params);
}

/*
 * The state a decoded answer leaves is what the next request sends back:
 * reasoning items with their encrypted content, then the items by id.
 */
static void test_state_round_trip(void **state)
{
    char *data = stream_of(tool_stream, 0);
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_llm_response resp = {0};
    loom_messages m = {0};
    loom_message *a;
    json_t *body;

    (void)state;
    assert_int_equal(decode(data, 0, NULL, &resp), 0);
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_USER, "Weather?"), 0);
    assert_int_equal(loom_messages_add_assistant(&m, resp.text, resp.reasoning,
                                                 resp.tool_calls,
                                                 resp.tool_calls_len),
                     0);
    a = &m.items[1];
    a->provider_state = strdup(resp.provider_state);
    assert_int_equal(
        loom_messages_add_tool_result(&m, "call_1", "get_weather", "sunny"),
        0);
    assert_int_equal(
        loom_messages_add_tool_result(&m, "call_2", "get_time", "noon"), 0);
    /* The appends may have moved the list (it grows from 2). */
    a = &m.items[1];
    req.model = "o4-mini";
    req.messages = m.items;
    req.messages_len = m.len;
    req.reasoning_effort = "low";
    body = build(&req);
    assert_json(
        json_object_get(body, "input"),
        "[{'type':'message','role':'user','content':'Weather?'},"
        "{'type':'reasoning','id':'rs_A','summary':[{'type':'summary_text',"
        "'text':'Need the weather.'},{'type':'summary_text','text':"
        "'And time.'}],'encrypted_content':'gAAAenc=='},"
        "{'type':'message','id':'msg_A','role':'assistant','status':"
        "'completed','content':[{'type':'output_text','text':'Checking.',"
        "'annotations':[]}]},"
        "{'type':'function_call','id':'fc_1','call_id':'call_1','name':"
        "'get_weather','arguments':'{\\'city\\':\\'Paris\\'}'},"
        "{'type':'function_call','id':'fc_2','call_id':'call_2','name':"
        "'get_time','arguments':'{\\'tz\\':\\'CET\\'}'},"
        "{'type':'function_call_output','call_id':'call_1','output':"
        "'sunny'},"
        "{'type':'function_call_output','call_id':'call_2','output':"
        "'noon'}]");
    assert_null(json_object_get(body, "previous_response_id"));
    json_decref(body);

    /* an unstored reasoning item without encrypted content cannot go
     * back, and then no item carries its id */
    free(a->provider_state);
    a->provider_state = q(
        "{'anthropic':{'x':1},'openai-responses':{'id':'resp_A','store':"
        "false,'output':[{'type':'reasoning','id':'rs_A','summary':[]},"
        "{'type':'message','id':'msg_A'},{'type':'function_call','id':"
        "'fc_2','call_id':'call_2'}]}}");
    body = build(&req);
    assert_json(json_object_get(body, "input"),
                "[{'type':'message','role':'user','content':'Weather?'},"
                "{'type':'message','role':'assistant','content':"
                "'Checking.'},"
                "{'type':'function_call','call_id':'call_2','name':"
                "'get_time','arguments':'{\\'tz\\':\\'CET\\'}'},"
                "{'type':'function_call','call_id':'call_1','name':"
                "'get_weather','arguments':'{\\'city\\':\\'Paris\\'}'},"
                "{'type':'function_call_output','call_id':'call_1','output':"
                "'sunny'},"
                "{'type':'function_call_output','call_id':'call_2','output':"
                "'noon'}]");
    json_decref(body);

    /* a stored one goes back by its id */
    free(a->provider_state);
    a->provider_state =
        q("{'openai-responses':{'store':true,'output':[{'type':'reasoning',"
          "'id':'rs_A','summary':[]},{'type':'function_call','id':'fc_1',"
          "'call_id':'call_1'}]}}");
    body = build(&req);
    assert_json(json_array_get(json_object_get(body, "input"), 1),
                "{'type':'reasoning','id':'rs_A','summary':[]}");
    assert_json(json_array_get(json_object_get(body, "input"), 2),
                "{'type':'function_call','id':'fc_1','call_id':'call_1',"
                "'name':'get_weather','arguments':"
                "'{\\'city\\':\\'Paris\\'}'}");
    json_decref(body);

    /* another provider's state, or none that parses: plain */
    for (int i = 0; i < 2; i++) {
        free(a->provider_state);
        a->provider_state = strdup(i ? "{\"anthropic\":{\"blocks\":[]}}"
                                     : "not json");
        body = build(&req);
        assert_json(json_array_get(json_object_get(body, "input"), 1),
                    "{'type':'message','role':'assistant','content':"
                    "'Checking.'}");
        assert_int_equal(json_array_size(json_object_get(body, "input")), 6);
        json_decref(body);
    }
    loom_llm_response_clear(&resp);
    loom_messages_free(&m);
    free(data);
}

static void test_chaining(void **state)
{
    loom_tool_call call = {"call_1", "f", "{}"};
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_messages m = {0};
    json_t *body;

    (void)state;
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_SYSTEM, "Sys."), 0);
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_USER, "One"), 0);
    assert_int_equal(loom_messages_add_assistant(&m, "A1", NULL, NULL, 0), 0);
    m.items[2].provider_state =
        strdup("{\"openai-responses\":{\"id\":\"resp_1\",\"store\":true,"
               "\"output\":[]}}");
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_USER, "Two"), 0);
    assert_int_equal(loom_messages_add_assistant(&m, NULL, NULL, &call, 1),
                     0);
    m.items[4].provider_state =
        strdup("{\"openai-responses\":{\"id\":\"resp_2\",\"store\":true,"
               "\"output\":[{\"type\":\"function_call\",\"id\":\"fc_1\","
               "\"call_id\":\"call_1\"}]}}");
    assert_int_equal(loom_messages_add_tool_result(&m, "call_1", "f", "ok"),
                     0);
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_SYSTEM, "Limit."), 0);
    req.model = "gpt-5";
    req.messages = m.items;
    req.messages_len = m.len;
    req.chain_responses = 1;
    body = build(&req);
    /* instructions are not carried over by the API: sent every time */
    assert_json(body,
                "{'model':'gpt-5','instructions':'Sys.',"
                "'previous_response_id':'resp_2','input':["
                "{'type':'function_call_output','call_id':'call_1','output':"
                "'ok'},{'type':'message','role':'developer','content':"
                "'Limit.'}],'store':true,'stream':true}");
    json_decref(body);
    /* the first turn's answer: chained from resp_1 */
    req.messages_len = 4;
    body = build(&req);
    assert_json(body, "{'model':'gpt-5','instructions':'Sys.',"
                      "'previous_response_id':'resp_1','input':["
                      "{'type':'message','role':'user','content':'Two'}],"
                      "'store':true,'stream':true}");
    json_decref(body);
    /* the last assistant message has no id (another provider answered):
     * everything, though an earlier one has an id */
    req.messages_len = m.len;
    free(m.items[4].provider_state);
    m.items[4].provider_state = NULL;
    body = build(&req);
    assert_null(json_object_get(body, "previous_response_id"));
    assert_int_equal(json_array_size(json_object_get(body, "input")), 6);
    json_decref(body);
    /* without chaining, ids in the state are not used */
    req.chain_responses = 0;
    req.messages_len = 4;
    body = build(&req);
    assert_null(json_object_get(body, "previous_response_id"));
    assert_int_equal(json_array_size(json_object_get(body, "input")), 3);
    json_decref(body);
    loom_messages_free(&m);
}

/* ---- HTTP error bodies ------------------------------------------------ */

/* The Responses API's error bodies are OpenAI's; the adapter reads them
 * with the same parser. */
static void test_error_bodies(void **state)
{
    static const struct {
        long status;
        const char *body;
        loom_upstream_kind kind;
        int retry;
        const char *type;
        const char *message;
    } cases[] = {
        {400,
         "{'error':{'message':'Previous response with id resp_x not found.',"
         "'type':'invalid_request_error','param':'previous_response_id',"
         "'code':'previous_response_not_found'}}",
         LOOM_UPSTREAM_BAD_REQUEST, 0, "invalid_request_error",
         "Previous response with id resp_x not found."},
        {401, "{'error':{'message':'bad key','code':'invalid_api_key'}}",
         LOOM_UPSTREAM_AUTH, 0, "invalid_api_key", "bad key"},
        {403, "{'error':{'message':'no'}}", LOOM_UPSTREAM_PERMISSION, 0, NULL,
         "no"},
        {404, "{'error':{'message':'model'}}", LOOM_UPSTREAM_NOT_FOUND, 0,
         NULL, "model"},
        {429,
         "{'error':{'message':'Rate limit','type':'requests','code':"
         "'rate_limit_exceeded'}}",
         LOOM_UPSTREAM_RATE_LIMIT, 1, "requests", "Rate limit"},
        {500, "{'error':{'message':'oops','type':'server_error'}}",
         LOOM_UPSTREAM_SERVER, 1, "server_error", "oops"},
        {503, "upstream down", LOOM_UPSTREAM_SERVER, 1, NULL,
         "upstream down"},
    };
    loom_upstream_error e = {0};

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *b = q(cases[i].body);
        assert_int_equal(loom__openai_error_from_http(&e, cases[i].status, b,
                                                      strlen(b), "req_1"),
                         0);
        assert_int_equal(e.kind, cases[i].kind);
        assert_int_equal(loom__openai_status_retryable(cases[i].status),
                         cases[i].retry);
        if (cases[i].type)
            assert_string_equal(e.type, cases[i].type);
        else
            assert_null(e.type);
        assert_string_equal(e.message, cases[i].message);
        assert_string_equal(e.request_id, "req_1");
        free(b);
    }
    loom__upstream_error_clear(&e);
}

static void test_provider_new(void **state)
{
    loom_provider_config cfg = {0};
    loom_provider *p = NULL;

    (void)state;
    cfg.name = "oai";
    cfg.kind = "openai-responses";
    cfg.headers = json_object();
    assert_int_equal(loom_provider_new(&p, &cfg), LOOM_EINVALID);
    assert_null(p);
    cfg.base_url = "http://127.0.0.1:1/v1/";
    json_object_set_new(cfg.headers, "Bad Name", json_string("x"));
    assert_int_equal(loom_provider_new(&p, &cfg), LOOM_EINVALID);
    json_object_clear(cfg.headers);
    json_object_set_new(cfg.headers, "X-Num", json_integer(3));
    assert_int_equal(loom_provider_new(&p, &cfg), 0);
    assert_string_equal(p->name, "oai");
    loom_provider_free(p);
    json_decref(cfg.headers);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors),
        cmocka_unit_test(test_tool_calls),
        cmocka_unit_test(test_reconcile),
        cmocka_unit_test(test_incomplete),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_callback_abort),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_complete_body),
        cmocka_unit_test(test_body_messages),
        cmocka_unit_test(test_body_options),
        cmocka_unit_test(test_state_round_trip),
        cmocka_unit_test(test_chaining),
        cmocka_unit_test(test_error_bodies),
        cmocka_unit_test(test_provider_new),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
