/*
 * Unit tests of the turn recorder's extras (loom/recorder.h): the tool
 * records of `tool.metric` events, the sources of `citation` events and
 * the run's context summary, as loom_recorder_turn() hands them to the
 * store. Synthetic events go straight into the recorder's sink after a
 * short run made with a scripted model; a longer run whose context engine
 * has to summarise gives a real summary and real tool.metric events,
 * which are then saved and read back through the store. The caps on what
 * the recorder keeps are crossed, with the warning they log.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "loom/log.h"
#include "loom/recorder.h"
#include "loom/store.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- a scripted model ---- */

/*
 * `rounds` answers that each call the tool `big`, then "all done". A
 * request without tools and without streaming is the context engine's
 * summary request (the run's own model writes summaries by default).
 */
typedef struct {
    loom_provider base;
    int rounds, next, summary_calls;
} mock;

static int mock_complete(loom_provider *p, const loom_llm_request *req,
                         loom_llm_event_cb cb, void *payload,
                         loom_llm_response *resp, loom_cancel *cancel)
{
    mock *m = (mock *)p;
    loom_llm_event ev;
    char id[32], args[32];

    (void)cancel;
    memset(&ev, 0, sizeof(ev));
    if (!req->stream && !req->tools_len) {
        m->summary_calls++;
        resp->text = strdup("SUMMARY: big ran");
        resp->finish_reason = strdup("stop");
        return 0;
    }
    if (m->next++ < m->rounds) {
        snprintf(id, sizeof(id), "c%d", m->next);
        /* Arguments differ per round: the run skips repeated calls. */
        snprintf(args, sizeof(args), "{\"round\":%d}", m->next);
        ev.type = LOOM_LLM_TOOL_CALL_DELTA;
        ev.tool_id = id;
        ev.tool_name = "big";
        ev.args_delta = args;
        if (cb(&ev, payload))
            return LOOM_ECANCELED;
        resp->text = strdup("");
        resp->tool_calls = calloc(1, sizeof(loom_tool_call));
        resp->tool_calls_len = 1;
        resp->tool_calls[0].id = strdup(id);
        resp->tool_calls[0].name = strdup("big");
        resp->tool_calls[0].arguments = strdup(args);
        resp->finish_reason = strdup("tool_calls");
    } else {
        ev.type = LOOM_LLM_TEXT;
        ev.text = "all done";
        ev.text_len = strlen(ev.text);
        if (cb(&ev, payload))
            return LOOM_ECANCELED;
        resp->text = strdup("all done");
        resp->finish_reason = strdup("stop");
    }
    resp->usage.prompt_tokens = 10;
    resp->usage.completion_tokens = 1;
    resp->usage.total_tokens = 11;
    return 0;
}

static void mock_free(loom_provider *p)
{
    (void)p;
}

static const loom_provider_vtable mock_vt = {.version =
                                                 LOOM_PROVIDER_VTABLE_VERSION,
                                             .complete = mock_complete,
                                             .free = mock_free};

static int big_exec(const json_t *args, const loom_tool_ctx *ctx, loom_buf *out,
                    void *payload)
{
    char text[3001];

    (void)args;
    (void)ctx;
    (void)payload;
    memset(text, 'b', 3000);
    text[3000] = '\0';
    return loom_buf_puts(out, text);
}

static loom_tool_registry *big_registry(void)
{
    loom_tool_registry *reg;
    loom_tool t;

    assert_int_equal(loom_tool_registry_new(&reg), 0);
    memset(&t, 0, sizeof(t));
    t.name = "big";
    t.description = "returns a lot of text";
    t.execute = big_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    return reg;
}

/* The inner sink: counts what the recorder forwards, keeps the last. */
typedef struct {
    size_t n;
    const json_t *last;
} inner_sink;

static int inner_emit(const loom_event *ev, void *payload)
{
    inner_sink *s = payload;

    s->n++;
    s->last = ev->data;
    return 0;
}

/* Runs rounds tool rounds (then an answer) with rec as the sink. */
static loom_run *run_with(loom_recorder *rec, mock *m, int rounds, long window,
                          loom_tool_registry *reg)
{
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    loom_run *run = NULL;

    memset(m, 0, sizeof(*m));
    m->base.vt = &mock_vt;
    m->rounds = rounds;
    ro.provider = &m->base;
    ro.model = "mock/m";
    ro.upstream_model = "m";
    ro.tools = reg;
    ro.max_iterations = 20;
    ro.max_output_tokens = 200;
    ro.sink = loom_recorder_sink(rec);
    ro.context.window = window;
    ro.context.keep_full_tool_results = 1; /* so summaries are needed */
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "go"), 0);
    assert_int_equal(loom_run_new(&run, &ro, &hist), 0);
    loom_messages_free(&hist);
    assert_int_equal(loom_run_execute(run), 0);
    return run;
}

/* Sends one synthetic event of type with data through the recorder. */
static void feed(loom_recorder *rec, loom_event_type type, json_t *data)
{
    loom_sink s = loom_recorder_sink(rec);
    loom_event ev;

    memset(&ev, 0, sizeof(ev));
    ev.type = type;
    ev.run_id = "run_synthetic";
    ev.data = data;
    assert_int_equal(s.emit(&ev, s.payload), 0);
}

/* ---- tests ---- */

static void test_nothing_recorded(void **state)
{
    loom_tool_registry *reg = big_registry();
    loom_recorder *rec;
    loom_turn_record turn;
    loom_run *run;
    mock m;

    (void)state;
    assert_int_equal(loom_recorder_new(&rec, (loom_sink){NULL, NULL}), 0);
    run = run_with(rec, &m, 0, 0, reg);
    memset(&turn, 0xff, sizeof(turn));
    assert_int_equal(loom_recorder_turn(rec, run, &turn), 0);
    assert_null(turn.tool_records);
    assert_null(turn.citations);
    assert_null(turn.summary);
    assert_int_equal(turn.summary_covers, 0);
    assert_int_equal(m.summary_calls, 0);
    loom_run_free(run);
    loom_recorder_free(rec);
    loom_tool_registry_free(reg);
}

static void test_synthetic_events(void **state)
{
    loom_tool_registry *reg = big_registry();
    json_t *metric, *cite1, *cite2, *want_metric, *want_cites, *odd;
    inner_sink inner = {0, NULL};
    loom_recorder *rec;
    loom_turn_record turn;
    loom_run *run;
    size_t before;
    mock m;

    (void)state;
    assert_int_equal(loom_recorder_new(&rec, (loom_sink){inner_emit, &inner}),
                     0);
    run = run_with(rec, &m, 0, 0, reg);
    before = inner.n;
    assert_true(before >= 2); /* run.started ... run.completed */

    metric =
        json_pack("{s:s,s:s,s:i,s:{s:i},s:f,s:s,s:n,s:I,s:[]}", "call_id",
                  "call_9", "tool", "web_search", "iteration", 1, "arguments",
                  "q", 1, "duration_ms", 12.5, "status", "success", "error",
                  "result_size", (json_int_t)2048, "documents");
    cite1 = json_pack("{s:i,s:s,s:s,s:s,s:n,s:s}", "number", 1, "id", "ws_1",
                      "url", "https://a.example/", "title", "A", "published",
                      "tool_call_id", "call_9");
    cite2 = json_pack("{s:i,s:n,s:s,s:s,s:n,s:n}", "number", 2, "id", "url",
                      "https://b.example/", "title", "", "published",
                      "tool_call_id");
    odd = json_string("not an object");
    assert_non_null(metric);
    assert_non_null(cite1);
    assert_non_null(cite2);
    want_metric = json_pack("[O]", metric);
    want_cites = json_pack("[O,O]", cite1, cite2);

    feed(rec, LOOM_EV_TOOL_METRIC, metric);
    /* Forwarded unchanged to the inner sink. */
    assert_int_equal(inner.n, before + 1);
    assert_ptr_equal(inner.last, metric);
    feed(rec, LOOM_EV_CITATION, cite1);
    feed(rec, LOOM_EV_CITATION, cite2);
    /* Data that is not an object is forwarded, not kept. */
    feed(rec, LOOM_EV_TOOL_METRIC, odd);
    feed(rec, LOOM_EV_CITATION, odd);
    assert_int_equal(inner.n, before + 5);
    /* The events' data is borrowed for the call: the recorder holds its
     * own references. */
    json_decref(metric);
    json_decref(cite1);
    json_decref(cite2);
    json_decref(odd);

    assert_int_equal(loom_recorder_turn(rec, run, &turn), 0);
    assert_non_null(turn.tool_records);
    assert_true(json_equal(turn.tool_records, want_metric));
    assert_non_null(turn.citations);
    assert_true(json_equal(turn.citations, want_cites));
    assert_null(turn.summary);
    assert_string_equal(turn.run_id, loom_run_id(run));
    json_decref(want_metric);
    json_decref(want_cites);
    loom_run_free(run);
    loom_recorder_free(rec);
    loom_tool_registry_free(reg);
}

static void test_caps(void **state)
{
    loom_tool_registry *reg = big_registry();
    loom_recorder *rec;
    char *logpath = test_tmp_path("recorder.log"), *log;
    loom_turn_record turn;
    loom_run *run;
    FILE *f;
    mock m;

    (void)state;
    assert_non_null(logpath);
    assert_int_equal(loom_recorder_new(&rec, (loom_sink){NULL, NULL}), 0);
    run = run_with(rec, &m, 0, 0, reg);
    for (int i = 0; i < LOOM_RECORDER_MAX_TOOL_RECORDS + 5; i++) {
        json_t *d = json_pack("{s:i,s:s}", "n", i, "tool", "t");
        feed(rec, LOOM_EV_TOOL_METRIC, d);
        json_decref(d);
    }
    for (int i = 0; i < LOOM_RECORDER_MAX_CITATIONS + 2; i++) {
        json_t *d = json_pack("{s:i}", "number", i + 1);
        feed(rec, LOOM_EV_CITATION, d);
        json_decref(d);
    }
    f = fopen(logpath, "w+");
    assert_non_null(f);
    loom_log_set(f, LOOM_LOG_WARN, LOOM_LOG_TEXT);
    assert_int_equal(loom_recorder_turn(rec, run, &turn), 0);
    loom_log_set(NULL, LOOM_LOG_OFF, LOOM_LOG_TEXT);
    fclose(f);
    /* The first ones are kept, in order. */
    assert_int_equal(json_array_size(turn.tool_records),
                     LOOM_RECORDER_MAX_TOOL_RECORDS);
    assert_int_equal(json_integer_value(json_object_get(
                         json_array_get(turn.tool_records,
                                        LOOM_RECORDER_MAX_TOOL_RECORDS - 1),
                         "n")),
                     LOOM_RECORDER_MAX_TOOL_RECORDS - 1);
    assert_int_equal(json_array_size(turn.citations),
                     LOOM_RECORDER_MAX_CITATIONS);
    /* ... and the rest counted in a warning. */
    log = test_read_file(logpath, NULL);
    assert_non_null(log);
    assert_non_null(strstr(log, "5 tool records past the first 1024"));
    assert_non_null(strstr(log, "2 citations past the first 1000"));
    assert_non_null(strstr(log, loom_run_id(run)));
    free(log);
    unlink(logpath);
    free(logpath);
    loom_run_free(run);
    loom_recorder_free(rec);
    loom_tool_registry_free(reg);
}

/* A run that had to summarise: its summary and real tool records reach
 * the store through the turn. */
static void test_summary_and_records_to_store(void **state)
{
    loom_tool_registry *reg = big_registry();
    char *path = test_tmp_path("recorder.db"), *conv = NULL, *summary = NULL;
    loom_messages input = {0};
    loom_recorder *rec;
    loom_store *st = NULL;
    const char *run_summary;
    size_t run_covers = 0, covers = 0, i;
    json_t *r, *j;
    loom_turn_record turn;
    loom_run *run;
    mock m;

    (void)state;
    assert_non_null(path);
    unlink(path);
    assert_int_equal(loom_recorder_new(&rec, (loom_sink){NULL, NULL}), 0);
    /* limit 4000 - 200 - 80 = 3720 tokens; each result is 750. */
    run = run_with(rec, &m, 8, 4000, reg);
    assert_true(m.summary_calls >= 1);
    run_summary = loom_run_summary(run, &run_covers);
    assert_non_null(run_summary);
    assert_true(run_covers >= 1);

    assert_int_equal(loom_recorder_turn(rec, run, &turn), 0);
    assert_string_equal(turn.summary, "SUMMARY: big ran");
    assert_int_equal(turn.summary_covers, run_covers);
    assert_null(turn.citations);
    assert_int_equal(json_array_size(turn.tool_records), 8);
    json_array_foreach(turn.tool_records, i, r)
    {
        char id[32];
        snprintf(id, sizeof(id), "c%zu", i + 1);
        assert_string_equal(json_string_value(json_object_get(r, "call_id")),
                            id);
        assert_string_equal(json_string_value(json_object_get(r, "tool")),
                            "big");
        assert_string_equal(json_string_value(json_object_get(r, "status")),
                            "success");
    }

    assert_int_equal(loom_store_open(&st, path), 0);
    assert_int_equal(loom_store_conversation_create(st, &conv), 0);
    assert_int_equal(loom_messages_add(&input, LOOM_ROLE_USER, "go"), 0);
    turn.conversation_id = conv;
    turn.input = &input;
    assert_int_equal(loom_store_save_turn(st, &turn), 0);
    assert_int_equal(
        loom_store_conversation_summary(st, conv, &summary, &covers), 0);
    assert_string_equal(summary, "SUMMARY: big ran");
    assert_int_equal(covers, run_covers);
    assert_int_equal(loom_store_conversation_get(st, conv, &j), 0);
    assert_int_equal(json_array_size(json_object_get(j, "tool_records")), 8);
    assert_string_equal(
        json_string_value(json_object_get(
            json_array_get(json_object_get(j, "tool_records"), 7), "run_id")),
        loom_run_id(run));
    json_decref(j);
    free(summary);
    free(conv);
    loom_messages_free(&input);
    loom_store_free(st);
    loom_run_free(run);
    loom_recorder_free(rec);
    loom_tool_registry_free(reg);
    unlink(path);
    {
        char side[4096];
        snprintf(side, sizeof(side), "%s-wal", path);
        unlink(side);
        snprintf(side, sizeof(side), "%s-shm", path);
        unlink(side);
    }
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nothing_recorded),
        cmocka_unit_test(test_synthetic_events),
        cmocka_unit_test(test_caps),
        cmocka_unit_test(test_summary_and_records_to_store),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
