/*
 * The model router (include/loom/router.h) end to end and in detail.
 *
 * Against the fake upstream, with the real OpenAI adapter: a primary
 * model that answers 429, 5xx, 529, a context-length error or nothing
 * (a timeout) hands over to its fallback, which answers, and the answer
 * names the model; 400, 401, 403 and 404 do not fall back, nor does a
 * failure after output was streamed; a primary that keeps failing is
 * skipped (the fake records no request to it) until its cooldown has
 * passed on a fake clock; router retries; and a whole run whose usage
 * events carry the answering model and the cost, with totals that are
 * the exact sum, down to the recorder's turn and the stored usage rows.
 *
 * With scripted in-process providers (through the router's lookup):
 * how each kind of failure is classified, how a request is fitted to
 * each model (capabilities, reasoning controls, options, max tokens),
 * usage events priced on the way, and the health record's limit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/error.h"
#include "fake.h"
#include "testutil.h"
#include "loom/recorder.h"
#include "loom/router.h"
#include "loom/run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- a clock the tests move ------------------------------------------- */

/*
 * Starts at 0, the monotonic clock's own origin (boot), so the deadlines
 * it stamps (a few seconds at most) are already past on the real clock,
 * however recently the machine booted: test_health_record relies on that
 * when it hands the record back to the real clock.
 */
#define FAKE_CLOCK_START 0
static int64_t fake_now = FAKE_CLOCK_START;

static int64_t fake_clock(void *payload)
{
    (void)payload;
    return fake_now;
}

static int reset_env(void **state)
{
    (void)state;
    unsetenv("OPENAI_API_KEY");
    unsetenv("OPENAI_BASE_URL");
    unsetenv("ANTHROPIC_API_KEY");
    unsetenv("ANTHROPIC_BASE_URL");
    unsetenv("GEMINI_API_KEY");
    unsetenv("GEMINI_BASE_URL");
    fake_now = FAKE_CLOCK_START;
    return 0;
}

static loom_config *load(const char *yaml)
{
    loom_config *cfg = NULL;

    if (loom_config_load_string(&cfg, yaml, "router.yaml") != 0)
        fail_msg("config: %s", loom_error_last());
    return cfg;
}

/* ---- calls -------------------------------------------------------------- */

/* What one call produced: the events the caller saw, and the response. */
typedef struct {
    int rc;
    loom_llm_response resp;
    char text[256]; /* text deltas, joined */
    int usage_events;
    int64_t usage_cost; /* cost_micros of the last usage event */
} call_result;

static int on_event(const loom_llm_event *ev, void *payload)
{
    call_result *c = payload;
    size_t len = strlen(c->text);

    if (ev->type == LOOM_LLM_TEXT && len + ev->text_len < sizeof(c->text)) {
        memcpy(c->text + len, ev->text, ev->text_len);
        c->text[len + ev->text_len] = '\0';
    } else if (ev->type == LOOM_LLM_USAGE) {
        c->usage_events++;
        c->usage_cost = ev->usage.cost_micros;
    }
    return 0;
}

/* One call of router r with a one-message conversation. */
static void call(loom_provider *r, const loom_model_request_options *mo,
                 loom_llm_request *base, call_result *c)
{
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_message msg;

    memset(c, 0, sizeof(*c));
    memset(&msg, 0, sizeof(msg));
    msg.role = LOOM_ROLE_USER;
    msg.content = "hello";
    if (base)
        req = *base;
    req.model = mo->upstream;
    req.messages = &msg;
    req.messages_len = 1;
    c->rc = loom_provider_complete(r, &req, on_event, c, &c->resp, NULL);
}

/* ---- against the fake upstream ------------------------------------------ */

#define OK_B                                                                 \
    "{\"text\":[\"from \",\"b\"],\"usage\":{\"prompt_tokens\":1000,"         \
    "\"completion_tokens\":10,\"total_tokens\":1010}}"

/* Two fakes, "prim" and "back", and a config where prim/a falls back to
 * back/b. extra is added under prim/a. */
typedef struct {
    loom_fake *prim, *back;
    loom_config *cfg;
    loom_router_health *health;
    loom_provider *router;
    loom_model_request_options mo;
} pair;

static void pair_start(pair *p, const char *prim_script,
                       const char *back_script, const char *extra)
{
    char yaml[2048];
    loom_router_options ro = LOOM_ROUTER_OPTIONS_INIT;

    memset(p, 0, sizeof(*p));
    p->prim = fake_start_script(prim_script);
    p->back = fake_start_script(back_script);
    assert_non_null(p->prim);
    assert_non_null(p->back);
    snprintf(yaml, sizeof(yaml),
             "providers:\n"
             "  prim:\n"
             "    base_url: '%s'\n"
             "    retries: {max: 0, base_delay_ms: 1, max_delay_ms: 2}\n"
             "    timeouts: {first_byte_ms: 300, idle_ms: 300}\n"
             "  back:\n"
             "    base_url: '%s'\n"
             "    retries: {max: 0}\n"
             "models:\n"
             "  prim/a:\n"
             "    upstream: model-a\n"
             "    prices: {input: 1, output: 2}\n"
             "    fallbacks: [back/b]\n"
             "%s"
             "  back/b:\n"
             "    upstream: model-b\n"
             "    prices: {input: '0.5', output: 1}\n",
             fake_base_url(p->prim), fake_base_url(p->back),
             extra ? extra : "");
    p->cfg = load(yaml);
    assert_int_equal(loom_router_health_new(&p->health), 0);
    loom_router_health_set_clock(p->health, fake_clock, NULL);
    ro.health = p->health;
    if (loom_router_new(&p->router, p->cfg, "prim/a", &ro, &p->mo) != 0)
        fail_msg("router: %s", loom_error_last());
    /* The config may go: the router copied what it needs. */
    loom_config_free(p->cfg);
    p->cfg = NULL;
}

static void pair_stop(pair *p)
{
    loom_provider_free(p->router);
    loom_router_health_free(p->health);
    fake_stop(p->prim);
    fake_stop(p->back);
}

/* The upstream model id of the fake's request i. */
static void expect_sent_model(loom_fake *f, size_t i, const char *want)
{
    json_t *r = fake_request(f, i);

    assert_non_null(r);
    assert_string_equal(json_string_value(json_object_get(
                            json_object_get(r, "body"), "model")),
                        want);
    json_decref(r);
}

static void test_fallback_answers(void **state)
{
    static const char *const primary[] = {
        /* rate limited */
        "{\"responses\":[{\"status\":429,\"error\":{\"message\":\"Rate "
        "limit reached\",\"type\":\"rate_limit_error\"}}]}",
        /* server errors */
        "{\"responses\":[{\"status\":500,\"error\":{\"message\":\"boom\"}}]}",
        "{\"responses\":[{\"status\":503,\"error\":{\"message\":\"down\"}}]}",
        /* Anthropic's overloaded */
        "{\"responses\":[{\"status\":529,\"error\":{\"type\":"
        "\"overloaded_error\",\"message\":\"Overloaded\"}}]}",
        /* too long for this model's context window */
        "{\"responses\":[{\"status\":400,\"error\":{\"message\":\"This "
        "model's maximum context length is 8192 tokens. However, your "
        "messages resulted in 9000 tokens.\",\"type\":"
        "\"invalid_request_error\",\"code\":\"context_length_exceeded\"}}]}",
        /* no answer at all: the first-byte timeout */
        "{\"responses\":[{\"hang\":true}]}",
    };

    (void)state;
    for (size_t i = 0; i < sizeof(primary) / sizeof(primary[0]); i++) {
        pair p;
        call_result c;

        pair_start(&p, primary[i], "{\"responses\":[" OK_B "]}", NULL);
        assert_string_equal(p.mo.model, "prim/a");
        assert_string_equal(p.mo.upstream, "model-a");
        call(p.router, &p.mo, NULL, &c);
        if (c.rc != 0)
            fail_msg("case %zu: %s", i, loom_error_last());
        /* The fallback answered, and the response says so. */
        assert_string_equal(c.resp.text, "from b");
        assert_string_equal(c.text, "from b");
        assert_string_equal(c.resp.model, "back/b");
        /* Priced at b's prices: 1000 * 0.5 + 10 * 1 = 510 */
        assert_int_equal(c.resp.cost_known, 1);
        assert_int_equal(c.resp.usage.cost_micros, 510);
        assert_int_equal(c.usage_cost, 510);
        assert_int_equal(c.resp.error.attempts, 2);
        assert_int_equal(fake_request_count(p.prim), 1);
        assert_int_equal(fake_request_count(p.back), 1);
        /* Each model got its own upstream id. */
        expect_sent_model(p.prim, 0, "model-a");
        expect_sent_model(p.back, 0, "model-b");
        loom_llm_response_clear(&c.resp);
        pair_stop(&p);
    }
}

static void test_client_errors_do_not_fall_back(void **state)
{
    static const int statuses[] = {400, 401, 403, 404, 422};

    (void)state;
    for (size_t i = 0; i < sizeof(statuses) / sizeof(statuses[0]); i++) {
        char script[256];
        pair p;
        call_result c;

        snprintf(script, sizeof(script),
                 "{\"responses\":[{\"status\":%d,\"error\":{\"message\":"
                 "\"no\",\"type\":\"invalid_request_error\"}}]}",
                 statuses[i]);
        pair_start(&p, script, "{\"responses\":[" OK_B "]}", NULL);
        call(p.router, &p.mo, NULL, &c);
        assert_int_equal(c.rc, LOOM_EUPSTREAM);
        assert_int_equal(c.resp.error.http_status, statuses[i]);
        assert_string_equal(c.resp.model, "prim/a");
        assert_int_equal(fake_request_count(p.prim), 1);
        assert_int_equal(fake_request_count(p.back), 0);
        /* And the primary is not counted as unwell. */
        assert_int_equal(loom_router_health_size(p.health), 0);
        loom_llm_response_clear(&c.resp);
        pair_stop(&p);
    }
}

static void test_no_fallback_after_output(void **state)
{
    pair p;
    call_result c;

    (void)state;
    /* The role chunk, one text chunk, then the connection drops. */
    pair_start(&p,
               "{\"responses\":[{\"text\":[\"partial\",\" more\"],"
               "\"disconnect_after_chunks\":2}]}",
               "{\"responses\":[" OK_B "]}", NULL);
    call(p.router, &p.mo, NULL, &c);
    assert_int_equal(c.rc, LOOM_EUPSTREAM);
    assert_int_equal(c.resp.error.kind, LOOM_UPSTREAM_CONNECTION);
    assert_string_equal(c.text, "partial");
    assert_string_equal(c.resp.model, "prim/a");
    assert_int_equal(fake_request_count(p.back), 0);
    loom_llm_response_clear(&c.resp);
    pair_stop(&p);
}

static void test_every_model_fails(void **state)
{
    pair p;
    call_result c;

    (void)state;
    pair_start(&p,
               "{\"responses\":[{\"status\":500,\"error\":{\"message\":"
               "\"a down\"}}]}",
               "{\"responses\":[{\"status\":503,\"error\":{\"message\":"
               "\"b down\"}}]}",
               NULL);
    call(p.router, &p.mo, NULL, &c);
    assert_int_equal(c.rc, LOOM_EUPSTREAM);
    assert_int_equal(c.resp.error.http_status, 503);
    assert_int_equal(c.resp.error.attempts, 2);
    assert_string_equal(c.resp.model, "back/b");
    assert_non_null(strstr(loom_error_last(), "b down"));
    assert_non_null(strstr(loom_error_last(), "every model of prim/a "
                                              "failed"));
    loom_llm_response_clear(&c.resp);
    pair_stop(&p);
}

static void test_cooldown(void **state)
{
    pair p;
    call_result c;
    int64_t until;

    (void)state;
    pair_start(&p,
               "{\"responses\":["
               "{\"status\":500,\"error\":{\"message\":\"one\"}},"
               "{\"status\":502,\"error\":{\"message\":\"two\"}},"
               "{\"text\":[\"from a\"],\"usage\":{\"prompt_tokens\":10,"
               "\"completion_tokens\":1,\"total_tokens\":11}},"
               "{\"status\":500,\"error\":{\"message\":\"three\"}}]}",
               "{\"loop\":true,\"responses\":[" OK_B "]}",
               "    routing: {failures_before_cooldown: 2, "
               "cooldown_ms: 1000}\n");

    /* First failure: fallback, not yet cooling. */
    call(p.router, &p.mo, NULL, &c);
    assert_int_equal(c.rc, 0);
    assert_string_equal(c.resp.model, "back/b");
    assert_int_equal(loom_router_health_cooling(p.health, "prim/a", NULL), 0);
    loom_llm_response_clear(&c.resp);

    /* Second in a row: cooling for 1000 ms from now. */
    call(p.router, &p.mo, NULL, &c);
    assert_int_equal(c.rc, 0);
    assert_string_equal(c.resp.model, "back/b");
    assert_int_equal(loom_router_health_cooling(p.health, "prim/a", &until),
                     1);
    assert_true(until == fake_now + 1000);
    loom_llm_response_clear(&c.resp);
    assert_int_equal(fake_request_count(p.prim), 2);

    /* Skipped while cooling: the primary gets no request. */
    call(p.router, &p.mo, NULL, &c);
    assert_int_equal(c.rc, 0);
    assert_string_equal(c.resp.model, "back/b");
    assert_int_equal(c.resp.error.attempts, 1);
    loom_llm_response_clear(&c.resp);
    fake_now += 999;
    call(p.router, &p.mo, NULL, &c);
    assert_string_equal(c.resp.model, "back/b");
    loom_llm_response_clear(&c.resp);
    assert_int_equal(fake_request_count(p.prim), 2);
    assert_int_equal(fake_request_count(p.back), 4);

    /* The cooldown over, the primary is asked again, and answers: its
     * record is cleared. */
    fake_now += 1;
    call(p.router, &p.mo, NULL, &c);
    assert_int_equal(c.rc, 0);
    assert_string_equal(c.resp.model, "prim/a");
    assert_string_equal(c.resp.text, "from a");
    /* 10 * 1 + 1 * 2 */
    assert_int_equal(c.resp.usage.cost_micros, 12);
    loom_llm_response_clear(&c.resp);
    assert_int_equal(fake_request_count(p.prim), 3);
    assert_int_equal(loom_router_health_size(p.health), 0);

    /* One failure after a success does not cool it down. */
    call(p.router, &p.mo, NULL, &c);
    assert_string_equal(c.resp.model, "back/b");
    assert_int_equal(loom_router_health_cooling(p.health, "prim/a", NULL), 0);
    loom_llm_response_clear(&c.resp);
    pair_stop(&p);
}

static void test_router_retries(void **state)
{
    pair p;
    call_result c;

    (void)state;
    /* The provider does not retry; the router retries prim/a once. */
    pair_start(&p,
               "{\"responses\":["
               "{\"status\":500,\"error\":{\"message\":\"once\"}},"
               "{\"text\":[\"from a\"]}]}",
               "{\"responses\":[" OK_B "]}", "    routing: {retries: 1}\n");
    call(p.router, &p.mo, NULL, &c);
    assert_int_equal(c.rc, 0);
    assert_string_equal(c.resp.model, "prim/a");
    assert_string_equal(c.text, "from a");
    assert_int_equal(c.resp.error.attempts, 2);
    assert_int_equal(fake_request_count(p.prim), 2);
    assert_int_equal(fake_request_count(p.back), 0);
    /* No usage: the cost is 0, still known. */
    assert_int_equal(c.resp.cost_known, 1);
    assert_int_equal(c.resp.usage.cost_micros, 0);
    loom_llm_response_clear(&c.resp);
    pair_stop(&p);

    /* A context-length error is not retried on the same model. */
    pair_start(&p,
               "{\"responses\":[{\"status\":400,\"error\":{\"message\":"
               "\"prompt is too long: 210000 tokens > 200000 maximum\"}}]}",
               "{\"responses\":[" OK_B "]}", "    routing: {retries: 3}\n");
    call(p.router, &p.mo, NULL, &c);
    assert_int_equal(c.rc, 0);
    assert_string_equal(c.resp.model, "back/b");
    assert_int_equal(fake_request_count(p.prim), 1);
    /* Nor counted against the model's health. */
    assert_int_equal(loom_router_health_size(p.health), 0);
    loom_llm_response_clear(&c.resp);
    pair_stop(&p);
}

/* ---- a whole run -------------------------------------------------------- */

static int echo_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    (void)args;
    (void)ctx;
    (void)payload;
    return loom_buf_puts(out, "echoed");
}

static int collect(const loom_event *ev, void *payload)
{
    json_array_append_new((json_t *)payload, loom_event_to_json(ev));
    return 0;
}

static json_t *nth_event(json_t *evs, const char *type, int nth)
{
    size_t i;
    json_t *e;

    json_array_foreach(evs, i, e)
    {
        if (!strcmp(json_string_value(json_object_get(e, "type")), type) &&
            nth-- == 0)
            return e;
    }
    return NULL;
}

static json_int_t int_at(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);

    if (!json_is_integer(v))
        fail_msg("'%s' is not an integer", k);
    return json_integer_value(v);
}

/*
 * Iteration 1: prim/a is rate limited and back/b answers with a tool
 * call; iteration 2: prim/a answers. Every usage event names its model
 * and cost; the totals are the exact sums.
 */
static void test_run_costs(void **state)
{
    static const char back_script[] =
        "{\"responses\":[{\"tool_calls\":[{\"id\":\"c1\",\"name\":\"echo\","
        "\"arguments\":\"{}\"}],\"usage\":{\"prompt_tokens\":1000,"
        "\"completion_tokens\":50,\"total_tokens\":1050,"
        "\"prompt_tokens_details\":{\"cached_tokens\":200}}}]}";
    static const char prim_script[] =
        "{\"responses\":[{\"status\":429,\"error\":{\"message\":\"slow "
        "down\"}},{\"text\":[\"done\"],\"usage\":{\"prompt_tokens\":1500,"
        "\"completion_tokens\":100,\"total_tokens\":1600,"
        "\"completion_tokens_details\":{\"reasoning_tokens\":40}}}]}";
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_router_options rto = LOOM_ROUTER_OPTIONS_INIT;
    loom_model_request_options mo;
    loom_fake *prim, *back;
    loom_tool_registry *reg = NULL;
    loom_provider *router = NULL;
    loom_recorder *rec = NULL;
    loom_messages hist = {0};
    loom_run *run = NULL;
    loom_config *cfg;
    loom_turn_record turn;
    loom_tool t;
    json_t *evs = json_array(), *u, *done;
    char yaml[2048];

    (void)state;
    prim = fake_start_script(prim_script);
    back = fake_start_script(back_script);
    assert_non_null(prim);
    assert_non_null(back);
    snprintf(yaml, sizeof(yaml),
             "providers:\n"
             "  prim: {base_url: '%s', retries: {max: 0}}\n"
             "  back: {base_url: '%s', retries: {max: 0}}\n"
             "models:\n"
             "  prim/a:\n"
             "    prices: {input: 1, output: 2, reasoning: 4}\n"
             "    fallbacks: [back/b]\n"
             "  back/b:\n"
             "    prices: {input: 0.5, cached_input: 0.25, output: 1}\n",
             fake_base_url(prim), fake_base_url(back));
    cfg = load(yaml);
    rto.health = NULL;
    assert_int_equal(loom_router_new(&router, cfg, "prim/a", &rto, &mo), 0);

    memset(&t, 0, sizeof(t));
    t.name = "echo";
    t.description = "Echoes.";
    t.execute = echo_exec;
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "go"), 0);
    assert_int_equal(loom_recorder_new(&rec, (loom_sink){collect, evs}), 0);
    ro.provider = router;
    ro.model = mo.model;
    ro.upstream_model = mo.upstream;
    ro.tools = reg;
    ro.sink = loom_recorder_sink(rec);
    assert_int_equal(loom_run_new(&run, &ro, &hist), 0);
    if (loom_run_execute(run) != 0)
        fail_msg("run: %s", loom_run_error(run));
    assert_string_equal(loom_run_text(run), "done");

    /* Iteration 1, by back/b: 800 * 0.5 + 200 * 0.25 + 50 * 1
     * = 400 + 50 + 50 = 500 micro-dollars. */
    u = nth_event(evs, "usage", 0);
    assert_non_null(u);
    assert_string_equal(json_string_value(json_object_get(u, "model")),
                        "back/b");
    assert_int_equal(int_at(u, "cost_micros"), 500);
    assert_int_equal(int_at(u, "cached_tokens"), 200);
    assert_int_equal(int_at(json_object_get(u, "cumulative"), "cost_micros"),
                     500);
    /* Iteration 2, by prim/a: 1500 * 1 + 60 * 2 + 40 * 4
     * = 1500 + 120 + 160 = 1780. */
    u = nth_event(evs, "usage", 1);
    assert_non_null(u);
    assert_string_equal(json_string_value(json_object_get(u, "model")),
                        "prim/a");
    assert_int_equal(int_at(u, "cost_micros"), 1780);
    assert_int_equal(int_at(json_object_get(u, "cumulative"), "cost_micros"),
                     2280);
    /* The run's total: the exact sum, in the final event and the run. */
    done = nth_event(evs, "run.completed", 0);
    assert_non_null(done);
    assert_int_equal(int_at(json_object_get(done, "usage"), "cost_micros"),
                     2280);
    assert_string_equal(json_string_value(json_object_get(done, "model")),
                        "prim/a");
    assert_true(loom_run_usage(run)->cost_micros == 2280);
    /* run.started still names the model asked for. */
    assert_string_equal(json_string_value(json_object_get(
                            nth_event(evs, "run.started", 0), "model")),
                        "prim/a");

    /* The recorder turns it into a turn: per-row costs, the total, and
     * the model that answered last. */
    assert_int_equal(loom_recorder_turn(rec, run, &turn), 0);
    assert_int_equal(turn.usage_len, 2);
    assert_true(turn.usage[0].cost == 500 / 1e6);
    assert_true(turn.usage[1].cost == 1780 / 1e6);
    assert_true(turn.cost == 2280 / 1e6);
    assert_string_equal(turn.model, "prim/a");
    assert_string_equal(turn.usage[0].model, "back/b");
    assert_string_equal(turn.usage[1].model, "prim/a");
    assert_int_equal(fake_request_count(prim), 2);
    assert_int_equal(fake_request_count(back), 1);

    /* Stored: each usage row names the model that answered it. */
    {
        char *db = test_tmp_path("router.db"), *conv = NULL;
        loom_store *st = NULL;
        json_t *got, *rows, *msgs;

        unlink(db);
        assert_int_equal(loom_store_open(&st, db), 0);
        assert_int_equal(loom_store_conversation_create(st, &conv), 0);
        turn.conversation_id = conv;
        turn.input = &hist;
        assert_int_equal(loom_store_save_turn(st, &turn), 0);
        assert_int_equal(loom_store_conversation_get(st, conv, &got), 0);
        rows = json_object_get(got, "usage");
        assert_int_equal(json_array_size(rows), 2);
        assert_string_equal(json_string_value(json_object_get(
                                json_array_get(rows, 0), "model")),
                            "back/b");
        assert_true(json_real_value(json_object_get(json_array_get(rows, 0),
                                                    "cost")) == 500 / 1e6);
        assert_string_equal(json_string_value(json_object_get(
                                json_array_get(rows, 1), "model")),
                            "prim/a");
        /* The answer's message names the model that gave it. */
        msgs = json_object_get(got, "messages");
        assert_string_equal(
            json_string_value(json_object_get(
                json_array_get(msgs, json_array_size(msgs) - 1), "model")),
            "prim/a");
        json_decref(got);
        free(conv);
        loom_store_free(st);
        unlink(db);
        free(db);
    }

    loom_run_free(run);
    loom_recorder_free(rec);
    loom_messages_free(&hist);
    loom_tool_registry_free(reg);
    loom_provider_free(router);
    loom_config_free(cfg);
    json_decref(evs);
    fake_stop(prim);
    fake_stop(back);
}

/* A model without prices: no cost anywhere, and the turn's is unknown. */
static void test_run_without_prices(void **state)
{
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_model_request_options mo;
    loom_provider *router = NULL;
    loom_recorder *rec = NULL;
    loom_messages hist = {0};
    loom_run *run = NULL;
    loom_fake *f;
    loom_config *cfg;
    loom_turn_record turn;
    json_t *evs = json_array(), *u;
    char yaml[512];

    (void)state;
    f = fake_start_script("{\"responses\":[{\"text\":[\"hi\"],\"usage\":{"
                          "\"prompt_tokens\":5,\"completion_tokens\":1,"
                          "\"total_tokens\":6}}]}");
    assert_non_null(f);
    /* From the environment alone: OPENAI_BASE_URL. */
    setenv("OPENAI_BASE_URL", fake_base_url(f), 1);
    snprintf(yaml, sizeof(yaml), "%s", "");
    cfg = load(yaml);
    assert_int_equal(loom_model_provider_new(&router, cfg, "openai/gpt-x",
                                             &mo),
                     0);
    assert_string_equal(router->name, "openai/gpt-x");
    assert_string_equal(mo.upstream, "gpt-x");
    assert_int_equal(mo.capabilities.tools, 1);
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "go"), 0);
    assert_int_equal(loom_recorder_new(&rec, (loom_sink){collect, evs}), 0);
    ro.provider = router;
    ro.model = mo.model;
    ro.upstream_model = mo.upstream;
    ro.sink = loom_recorder_sink(rec);
    assert_int_equal(loom_run_new(&run, &ro, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);
    u = nth_event(evs, "usage", 0);
    assert_non_null(u);
    assert_string_equal(json_string_value(json_object_get(u, "model")),
                        "openai/gpt-x");
    assert_null(json_object_get(u, "cost_micros"));
    assert_null(json_object_get(json_object_get(u, "cumulative"),
                                "cost_micros"));
    assert_null(json_object_get(
        json_object_get(nth_event(evs, "run.completed", 0), "usage"),
        "cost_micros"));
    assert_int_equal(loom_recorder_turn(rec, run, &turn), 0);
    assert_true(turn.usage[0].cost < 0);
    assert_true(turn.cost < 0);
    expect_sent_model(f, 0, "gpt-x");
    loom_run_free(run);
    loom_recorder_free(rec);
    loom_messages_free(&hist);
    loom_provider_free(router);
    loom_config_free(cfg);
    json_decref(evs);
    fake_stop(f);
}

/* ---- scripted providers ------------------------------------------------ */

/* A provider that records what it was asked and answers as told. */
typedef struct {
    loom_provider base;
    int calls;
    /* The last request, as it arrived. */
    char model[64];
    size_t tools_len;
    int parallel, prompt_cache, chain;
    long budget, max_tokens;
    char effort[16];
    /* The answer: 0 with text "ok" and usage, or this failure for the
     * next `fails` calls (-1: every call). */
    int fail_rc, fails;
    loom_upstream_kind kind;
    const char *type, *message;
    int output_first; /* emit text before failing */
    loom_usage usage;
} mock;

static int mock_complete(loom_provider *p, const loom_llm_request *req,
                         loom_llm_event_cb cb, void *payload,
                         loom_llm_response *resp, loom_cancel *cancel)
{
    mock *m = (mock *)p;
    loom_llm_event ev;

    (void)cancel;
    m->calls++;
    snprintf(m->model, sizeof(m->model), "%s", req->model);
    m->tools_len = req->tools_len;
    m->parallel = req->parallel_tool_calls;
    m->prompt_cache = req->prompt_cache;
    m->chain = req->chain_responses;
    m->budget = req->thinking_budget;
    m->max_tokens = req->max_tokens;
    snprintf(m->effort, sizeof(m->effort), "%s",
             req->reasoning_effort ? req->reasoning_effort : "");
    resp->error.attempts = 1;
    memset(&ev, 0, sizeof(ev));
    if (m->output_first) {
        ev.type = LOOM_LLM_TEXT;
        ev.text = "x";
        ev.text_len = 1;
        cb(&ev, payload);
        resp->output_started = 1;
    }
    if (m->fail_rc && m->fails != 0) {
        if (m->fails > 0)
            m->fails--;
        resp->error.kind = m->kind;
        resp->error.type = m->type ? strdup(m->type) : NULL;
        resp->error.message = m->message ? strdup(m->message) : NULL;
        resp->text = strdup("");
        resp->usage = m->usage;
        return loom__error_set(m->fail_rc, "mock: %s",
                               m->message ? m->message : "failed");
    }
    ev.type = LOOM_LLM_USAGE;
    ev.usage = m->usage;
    cb(&ev, payload);
    resp->usage = m->usage;
    resp->text = strdup("ok");
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

static mock mocks[2];

static loom_provider *lookup(const char *name, void *payload)
{
    (void)payload;
    if (!strcmp(name, "prim"))
        return &mocks[0].base;
    if (!strcmp(name, "back"))
        return &mocks[1].base;
    return NULL;
}

static loom_provider *mock_router(loom_config **cfg,
                                  loom_router_health **health,
                                  loom_model_request_options *mo,
                                  const char *models)
{
    loom_router_options ro = LOOM_ROUTER_OPTIONS_INIT;
    loom_provider *r = NULL;
    char yaml[2048];

    memset(mocks, 0, sizeof(mocks));
    mocks[0].base.vt = mocks[1].base.vt = &mock_vt;
    mocks[0].base.name = "prim";
    mocks[1].base.name = "back";
    snprintf(yaml, sizeof(yaml),
             "providers:\n"
             "  prim: {base_url: 'http://127.0.0.1:9'}\n"
             "  back: {base_url: 'http://127.0.0.1:9'}\n"
             "models:\n%s",
             models);
    *cfg = load(yaml);
    assert_int_equal(loom_router_health_new(health), 0);
    loom_router_health_set_clock(*health, fake_clock, NULL);
    ro.health = *health;
    ro.lookup = lookup;
    if (loom_router_new(&r, *cfg, "prim/a", &ro, mo) != 0)
        fail_msg("router: %s", loom_error_last());
    return r;
}

static void test_classification(void **state)
{
    static const struct {
        int rc;
        loom_upstream_kind kind;
        const char *type, *message;
        int falls_back, counts;
    } cases[] = {
        {LOOM_EUPSTREAM, LOOM_UPSTREAM_RATE_LIMIT, NULL, "slow", 1, 1},
        {LOOM_EUPSTREAM, LOOM_UPSTREAM_SERVER, NULL, "boom", 1, 1},
        {LOOM_EUPSTREAM, LOOM_UPSTREAM_TIMEOUT, NULL, "408", 1, 1},
        {LOOM_EUPSTREAM, LOOM_UPSTREAM_CONNECTION, NULL, "reset", 1, 1},
        {LOOM_ETIMEDOUT, LOOM_UPSTREAM_TIMEOUT, NULL, "idle", 1, 1},
        /* Overload inside a stream (Anthropic's error event). */
        {LOOM_EUPSTREAM, LOOM_UPSTREAM_STREAM, "overloaded_error",
         "Overloaded", 1, 1},
        /* Context length, in each provider's words. */
        {LOOM_EUPSTREAM, LOOM_UPSTREAM_BAD_REQUEST, "context_length_exceeded",
         "too long", 1, 0},
        {LOOM_EUPSTREAM, LOOM_UPSTREAM_BAD_REQUEST, "invalid_request_error",
         "prompt is too long: 210000 tokens > 200000 maximum", 1, 0},
        {LOOM_EUPSTREAM, LOOM_UPSTREAM_BAD_REQUEST, "INVALID_ARGUMENT",
         "The input token count (1048577) exceeds the maximum number of "
         "tokens allowed (1048576).",
         1, 0},
        {LOOM_EUPSTREAM, LOOM_UPSTREAM_BAD_REQUEST, NULL,
         "This model's maximum context length is 32768 tokens", 1, 0},
        {LOOM_EUPSTREAM, LOOM_UPSTREAM_TOO_LARGE, NULL, "413", 1, 0},
        {LOOM_EUPSTREAM, LOOM_UPSTREAM_STREAM, "error",
         "context window exceeded", 1, 0},
        /* Everything else is final. */
        {LOOM_EUPSTREAM, LOOM_UPSTREAM_BAD_REQUEST, "invalid_request_error",
         "temperature must be at most 2", 0, 0},
        {LOOM_EUPSTREAM, LOOM_UPSTREAM_AUTH, NULL, "bad key", 0, 0},
        {LOOM_EUPSTREAM, LOOM_UPSTREAM_PERMISSION, NULL, "no", 0, 0},
        {LOOM_EUPSTREAM, LOOM_UPSTREAM_NOT_FOUND, NULL, "no model", 0, 0},
        {LOOM_EUPSTREAM, LOOM_UPSTREAM_STREAM, "server_error", "oops", 0, 0},
        {LOOM_EUPSTREAM, LOOM_UPSTREAM_PROTOCOL, NULL, "garbage", 0, 0},
        {LOOM_EPROTO, LOOM_UPSTREAM_PROTOCOL, NULL, "garbage", 0, 0},
        {LOOM_ETOOLARGE, LOOM_UPSTREAM_NONE, NULL, "16 MiB", 0, 0},
        {LOOM_ECANCELED, LOOM_UPSTREAM_NONE, NULL, NULL, 0, 0},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        loom_model_request_options mo;
        loom_router_health *health;
        loom_config *cfg;
        loom_provider *r;
        call_result c;

        r = mock_router(&cfg, &health, &mo,
                        "  prim/a: {fallbacks: [back/b]}\n");
        mocks[0].fail_rc = cases[i].rc;
        mocks[0].fails = -1;
        mocks[0].kind = cases[i].kind;
        mocks[0].type = cases[i].type;
        mocks[0].message = cases[i].message;
        call(r, &mo, NULL, &c);
        if (mocks[1].calls != cases[i].falls_back)
            fail_msg("case %zu (%s): fallback called %d times", i,
                     cases[i].message ? cases[i].message : "", mocks[1].calls);
        if (cases[i].falls_back) {
            assert_int_equal(c.rc, 0);
            assert_string_equal(c.resp.model, "back/b");
        } else {
            assert_int_equal(c.rc, cases[i].rc);
            assert_string_equal(c.resp.model, "prim/a");
        }
        assert_int_equal(loom_router_health_size(health),
                         (size_t)cases[i].counts);
        /* With output already given, nothing falls back. */
        loom_llm_response_clear(&c.resp);
        mocks[0].output_first = 1;
        mocks[1].calls = 0;
        call(r, &mo, NULL, &c);
        assert_int_equal(c.rc, cases[i].rc);
        assert_int_equal(mocks[1].calls, 0);
        loom_llm_response_clear(&c.resp);
        loom_provider_free(r);
        loom_router_health_free(health);
        loom_config_free(cfg);
    }
}

static void test_request_fitting(void **state)
{
    static const loom_tool_def tools[1] = {{"t", "A tool.", NULL}};
    loom_model_request_options mo;
    loom_router_health *health;
    loom_llm_request base = LOOM_LLM_REQUEST_INIT;
    loom_config *cfg;
    loom_provider *r;
    call_result c;

    (void)state;
    r = mock_router(&cfg, &health, &mo,
                    "  prim/a:\n"
                    "    upstream: up-a\n"
                    "    max_output_tokens: 4000\n"
                    "    capabilities: {reasoning: true, "
                    "parallel_tool_calls: false}\n"
                    "    reasoning: {effort: high, thinking_budget: 2048}\n"
                    "    prompt_cache: true\n"
                    "    fallbacks: [back/b, back/c]\n"
                    "  back/b:\n"
                    "    upstream: up-b\n"
                    "    max_output_tokens: 100\n"
                    "    chain_responses: true\n"
                    "  back/c:\n"
                    "    capabilities: {tools: false, reasoning: true}\n"
                    "    reasoning: {effort: low}\n");
    /* What the run is told to send. */
    assert_string_equal(mo.model, "prim/a");
    assert_string_equal(mo.upstream, "up-a");
    assert_int_equal(mo.max_output_tokens, 4000);
    assert_int_equal(mo.thinking_budget, 2048);
    assert_string_equal(mo.reasoning_effort, "high");
    assert_int_equal(mo.prompt_cache, 1);
    assert_int_equal(mo.chain_responses, 0);
    assert_int_equal(mo.capabilities.parallel_tool_calls, 0);
    assert_int_equal(mo.capabilities.reasoning, 1);

    /* The request as the run builds it from those. */
    base.tools = tools;
    base.tools_len = 1;
    base.parallel_tool_calls = 1;
    base.max_tokens = 4000;
    base.thinking_budget = 1000; /* the caller's choice wins on prim/a */
    base.reasoning_effort = NULL;
    base.prompt_cache = 1;
    mocks[0].fail_rc = LOOM_EUPSTREAM;
    mocks[0].fails = -1;
    mocks[0].kind = LOOM_UPSTREAM_SERVER;
    /* back/b fails once, then back/c answers (both on provider back). */
    mocks[1].fail_rc = LOOM_EUPSTREAM;
    mocks[1].fails = 1;
    mocks[1].kind = LOOM_UPSTREAM_RATE_LIMIT;
    call(r, &mo, &base, &c);
    assert_int_equal(c.rc, 0);
    assert_string_equal(c.resp.model, "back/c");
    assert_int_equal(mocks[0].calls, 1);
    assert_int_equal(mocks[1].calls, 2);

    /* prim/a: no parallel_tool_calls; its reasoning, the caller's
     * budget; prompt caching as asked. */
    assert_string_equal(mocks[0].model, "up-a");
    assert_int_equal(mocks[0].tools_len, 1);
    assert_int_equal(mocks[0].parallel, -1);
    assert_int_equal(mocks[0].budget, 1000);
    assert_string_equal(mocks[0].effort, "high");
    assert_int_equal(mocks[0].prompt_cache, 1);
    assert_int_equal(mocks[0].max_tokens, 4000);
    /* back/c was last: no tools (it has none), its own effort, no
     * prompt caching (its own setting), max tokens as asked. */
    assert_string_equal(mocks[1].model, "c");
    assert_int_equal(mocks[1].tools_len, 0);
    assert_int_equal(mocks[1].parallel, -1);
    assert_string_equal(mocks[1].effort, "low");
    assert_int_equal(mocks[1].budget, 1000);
    assert_int_equal(mocks[1].prompt_cache, 0);
    assert_int_equal(mocks[1].chain, 0);
    assert_int_equal(mocks[1].max_tokens, 4000);
    loom_llm_response_clear(&c.resp);

    /* prim/a fails again and back/b answers. */
    mocks[1].calls = 0;
    call(r, &mo, &base, &c);
    assert_int_equal(mocks[1].calls, 1);
    assert_string_equal(c.resp.model, "back/b");
    /* No reasoning controls (not capable), its max tokens, chaining. */
    assert_string_equal(mocks[1].model, "up-b");
    assert_int_equal(mocks[1].budget, 0);
    assert_string_equal(mocks[1].effort, "");
    assert_int_equal(mocks[1].parallel, 1);
    assert_int_equal(mocks[1].max_tokens, 100);
    assert_int_equal(mocks[1].chain, 1);
    assert_int_equal(mocks[1].prompt_cache, 0);
    loom_llm_response_clear(&c.resp);
    loom_provider_free(r);
    loom_router_health_free(health);
    loom_config_free(cfg);
}

static void test_usage_priced(void **state)
{
    loom_model_request_options mo;
    loom_router_health *health;
    loom_config *cfg;
    loom_provider *r;
    call_result c;

    (void)state;
    r = mock_router(&cfg, &health, &mo,
                    "  prim/a:\n"
                    "    prices: {input: 3, cached_input: 0.3, "
                    "cache_write: 3.75, output: 15}\n");
    mocks[0].usage.prompt_tokens = 10000;
    mocks[0].usage.cached_tokens = 6000;
    mocks[0].usage.cache_write_tokens = 2000;
    mocks[0].usage.completion_tokens = 1000;
    mocks[0].usage.total_tokens = 11000;
    call(r, &mo, NULL, &c);
    assert_int_equal(c.rc, 0);
    /* 2000 * 3 + 6000 * 0.3 + 2000 * 3.75 + 1000 * 15 = 30300, in the
     * usage event as it passed and in the response. */
    assert_int_equal(c.usage_events, 1);
    assert_int_equal(c.usage_cost, 30300);
    assert_int_equal(c.resp.usage.cost_micros, 30300);
    assert_int_equal(c.resp.cost_known, 1);
    loom_llm_response_clear(&c.resp);
    /* One model and no fallback: never skipped, even while cooling. */
    mocks[0].fail_rc = LOOM_EUPSTREAM;
    mocks[0].fails = -1;
    mocks[0].kind = LOOM_UPSTREAM_SERVER;
    for (int i = 0; i < 5; i++) {
        call(r, &mo, NULL, &c);
        assert_int_equal(c.rc, LOOM_EUPSTREAM);
        loom_llm_response_clear(&c.resp);
    }
    assert_int_equal(loom_router_health_cooling(health, "prim/a", NULL), 1);
    assert_int_equal(mocks[0].calls, 6);
    loom_provider_free(r);
    loom_router_health_free(health);
    loom_config_free(cfg);
}

/* A cost too large for 63 bits leaves the call unpriced, and a failed
 * call's message as it was. */
static void test_cost_overflow(void **state)
{
    loom_model_request_options mo;
    loom_router_health *health;
    loom_config *cfg;
    loom_provider *r;
    call_result c;

    (void)state;
    r = mock_router(&cfg, &health, &mo,
                    "  prim/a: {prices: {input: 1000000, output: 1}}\n");
    mocks[0].usage.prompt_tokens = 9300000000000L;
    mocks[0].usage.total_tokens = 9300000000000L;
    call(r, &mo, NULL, &c);
    assert_int_equal(c.rc, 0);
    assert_string_equal(c.resp.model, "prim/a");
    assert_int_equal(c.resp.cost_known, 0);
    assert_int_equal(c.resp.usage.cost_micros, 0);
    loom_llm_response_clear(&c.resp);
    mocks[0].fail_rc = LOOM_EUPSTREAM;
    mocks[0].fails = -1;
    mocks[0].kind = LOOM_UPSTREAM_AUTH;
    mocks[0].message = "bad key";
    call(r, &mo, NULL, &c);
    assert_int_equal(c.rc, LOOM_EUPSTREAM);
    assert_int_equal(c.resp.cost_known, 0);
    assert_string_equal(loom_error_last(), "mock: bad key");
    assert_int_equal(loom_error_last_code(), LOOM_EUPSTREAM);
    loom_llm_response_clear(&c.resp);
    loom_provider_free(r);
    loom_router_health_free(health);
    loom_config_free(cfg);
}

/* When every model is cooling down, they are all tried, in order. */
static void test_all_cooling(void **state)
{
    loom_model_request_options mo;
    loom_router_health *health;
    loom_routing_policy pol = {0, 1000, 1};
    loom_config *cfg;
    loom_provider *r;
    call_result c;

    (void)state;
    r = mock_router(&cfg, &health, &mo, "  prim/a: {fallbacks: [back/b]}\n");
    loom_router_health_note(health, "prim/a", 1, &pol);
    loom_router_health_note(health, "back/b", 1, &pol);
    call(r, &mo, NULL, &c);
    assert_int_equal(c.rc, 0);
    assert_string_equal(c.resp.model, "prim/a");
    assert_int_equal(mocks[0].calls, 1);
    assert_int_equal(loom_router_health_cooling(health, "prim/a", NULL), 0);
    loom_llm_response_clear(&c.resp);
    /* Only b cooling: a is asked. */
    assert_int_equal(loom_router_health_cooling(health, "back/b", NULL), 1);
    call(r, &mo, NULL, &c);
    assert_string_equal(c.resp.model, "prim/a");
    assert_int_equal(mocks[0].calls, 2);
    assert_int_equal(mocks[1].calls, 0);
    loom_llm_response_clear(&c.resp);
    /* Only a cooling: b is. */
    fake_now += 1000;
    loom_router_health_note(health, "prim/a", 1, &pol);
    call(r, &mo, NULL, &c);
    assert_string_equal(c.resp.model, "back/b");
    assert_int_equal(mocks[0].calls, 2);
    assert_int_equal(mocks[1].calls, 1);
    loom_llm_response_clear(&c.resp);
    loom_provider_free(r);
    loom_router_health_free(health);
    loom_config_free(cfg);
}

static void test_health_record(void **state)
{
    loom_routing_policy pol = {0, 1000, 2}, never = {0, 0, 1};
    loom_router_health *h;
    char name[32];
    int64_t until;

    (void)state;
    assert_int_equal(loom_router_health_new(&h), 0);
    loom_router_health_set_clock(h, fake_clock, NULL);
    /* N failures in a row, then a cooldown; after it, one failure is
     * enough for the next; a success clears it. */
    loom_router_health_note(h, "p/m", 1, &pol);
    assert_int_equal(loom_router_health_cooling(h, "p/m", NULL), 0);
    loom_router_health_note(h, "p/m", 1, &pol);
    assert_int_equal(loom_router_health_cooling(h, "p/m", &until), 1);
    assert_true(until == fake_now + 1000);
    fake_now += 1000;
    assert_int_equal(loom_router_health_cooling(h, "p/m", NULL), 0);
    loom_router_health_note(h, "p/m", 1, &pol);
    assert_int_equal(loom_router_health_cooling(h, "p/m", NULL), 1);
    loom_router_health_note(h, "p/m", 0, &pol);
    assert_int_equal(loom_router_health_cooling(h, "p/m", NULL), 0);
    assert_int_equal(loom_router_health_size(h), 0);
    /* cooldown_ms 0: never skipped. */
    loom_router_health_note(h, "p/never", 1, &never);
    loom_router_health_note(h, "p/never", 1, &never);
    assert_int_equal(loom_router_health_cooling(h, "p/never", NULL), 0);
    loom_router_health_note(h, "p/never", 0, &never);

    /* The record's limit: full of deployments cooling down, a new
     * failure is not recorded... */
    pol.failures_before_cooldown = 1;
    for (int i = 0; i < LOOM_ROUTER_HEALTH_MAX; i++) {
        snprintf(name, sizeof(name), "p/m%d", i);
        loom_router_health_note(h, name, 1, &pol);
    }
    assert_int_equal(loom_router_health_size(h), LOOM_ROUTER_HEALTH_MAX);
    loom_router_health_note(h, "p/new", 1, &pol);
    assert_int_equal(loom_router_health_size(h), LOOM_ROUTER_HEALTH_MAX);
    assert_int_equal(loom_router_health_cooling(h, "p/new", NULL), 0);
    assert_int_equal(loom_router_health_cooling(h, "p/m7", NULL), 1);
    /* ...until cooldowns are over and make room. */
    fake_now += 1000;
    loom_router_health_note(h, "p/new", 1, &pol);
    assert_int_equal(loom_router_health_size(h), LOOM_ROUTER_HEALTH_MAX);
    assert_int_equal(loom_router_health_cooling(h, "p/new", NULL), 1);
    /* The real clock comes back with NULL. */
    loom_router_health_set_clock(h, NULL, NULL);
    assert_int_equal(loom_router_health_cooling(h, "p/new", NULL), 0);
    loom_router_health_free(h);
    /* NULLs are harmless. */
    loom_router_health_free(NULL);
    loom_router_health_note(NULL, "x", 1, &pol);
    assert_int_equal(loom_router_health_cooling(NULL, "x", NULL), 0);
    assert_int_equal(loom_router_health_size(NULL), 0);
}

static void test_router_errors(void **state)
{
    loom_router_options ro = LOOM_ROUTER_OPTIONS_INIT;
    loom_model_request_options mo;
    loom_provider *r = (loom_provider *)0x1;
    loom_config *cfg;

    (void)state;
    cfg = load("providers:\n"
               "  p: {base_url: 'http://127.0.0.1:9'}\n"
               "  q: {base_url: 'http://127.0.0.1:9'}\n"
               "models:\n"
               "  p/a: {fallbacks: [q/b]}\n");
    assert_int_equal(loom_router_new(&r, cfg, "z/a", NULL, &mo),
                     LOOM_ENOTFOUND);
    assert_null(r);
    assert_null(mo.model);
    assert_int_equal(loom_router_new(&r, cfg, "nothing", NULL, NULL),
                     LOOM_ENOTFOUND);
    assert_int_equal(loom_router_new(&r, NULL, "p/a", NULL, NULL),
                     LOOM_EINVALID);
    assert_int_equal(loom_router_new(NULL, cfg, "p/a", NULL, NULL),
                     LOOM_EINVALID);
    ro.version = 99;
    assert_int_equal(loom_router_new(&r, cfg, "p/a", &ro, NULL),
                     LOOM_EINVALID);
    /* A lookup that does not know a provider. */
    ro.version = LOOM_ROUTER_OPTIONS_VERSION;
    ro.lookup = lookup;
    assert_int_equal(loom_router_new(&r, cfg, "p/a", &ro, NULL),
                     LOOM_ENOTFOUND);
    assert_non_null(strstr(loom_error_last(), "provider 'p'"));
    /* The router's own adapters: p and q each built once. */
    assert_int_equal(loom_model_provider_new(&r, cfg, "p/a", &mo), 0);
    assert_string_equal(r->name, "p/a");
    loom_provider_free(r);
    loom_provider_free(NULL);
    loom_config_free(cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_fallback_answers, reset_env),
        cmocka_unit_test_setup(test_client_errors_do_not_fall_back,
                               reset_env),
        cmocka_unit_test_setup(test_no_fallback_after_output, reset_env),
        cmocka_unit_test_setup(test_every_model_fails, reset_env),
        cmocka_unit_test_setup(test_cooldown, reset_env),
        cmocka_unit_test_setup(test_router_retries, reset_env),
        cmocka_unit_test_setup(test_run_costs, reset_env),
        cmocka_unit_test_setup(test_run_without_prices, reset_env),
        cmocka_unit_test_setup(test_classification, reset_env),
        cmocka_unit_test_setup(test_request_fitting, reset_env),
        cmocka_unit_test_setup(test_usage_priced, reset_env),
        cmocka_unit_test_setup(test_cost_overflow, reset_env),
        cmocka_unit_test_setup(test_all_cooling, reset_env),
        cmocka_unit_test_setup(test_health_record, reset_env),
        cmocka_unit_test_setup(test_router_errors, reset_env),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
