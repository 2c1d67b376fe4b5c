/*
 * One table of run scenarios, each run through loom_run against every
 * provider adapter (OpenAI Chat Completions, OpenAI Responses, Anthropic
 * Messages, Gemini) in front of loom-fake-upstream, which renders the one
 * script of a scenario in the wire format each adapter asks for.
 *
 * Two things are checked per scenario. What the run did must not depend
 * on the provider: the run's events, normalised (ids, seq, timing and
 * usage fields the formats report differently are taken out; event
 * types, order, tool names, arguments, results, the text and reasoning of
 * each turn and the finish are kept), must equal the scenario's expected
 * sequence for all four adapters, and so must the final answer and the
 * messages the run added. And what went over the wire must be each
 * provider's own exact shape: a table of (request, path in the body,
 * expected JSON) per adapter, taken from the requests the fake recorded
 * (thinking blocks and signatures, tool_result folding and is_error,
 * cache_control, thoughtSignature, functionResponse ids,
 * previous_response_id chaining, assistant tool_calls and tool messages).
 *
 * Set LOOM_TEST_VERBOSE=1 to print the normalised events and the request
 * bodies of every run.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fake.h"
#include "loom/buf.h"
#include "loom/run.h"
#include "loom/tools.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ----------------------------------------------------------- */

/* A copy of s with every ' turned into " (the caller frees): JSON in C
 * strings stays readable. */
static char *q(const char *s)
{
    char *r = strdup(s);

    assert_non_null(r);
    for (char *p = r; *p; p++)
        if (*p == '\'')
            *p = '"';
    return r;
}

/* JSON written with ' for " (a new reference; fails the test when bad). */
static json_t *qjson(const char *s)
{
    char *t = q(s);
    json_error_t err;
    json_t *j = json_loads(t, JSON_DECODE_ANY, &err);

    if (!j)
        print_error("bad JSON in the test (%s): %s\n", err.text, t);
    free(t);
    assert_non_null(j);
    return j;
}

static void assert_json_equal(const char *what, const json_t *got,
                              const json_t *want)
{
    char *g, *w;

    if (got && json_equal((json_t *)got, (json_t *)want))
        return;
    g = got ? json_dumps(got, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    w = json_dumps(want, JSON_COMPACT | JSON_ENCODE_ANY);
    fprintf(stderr, "%s\n got:  %s\n want: %s\n", what, g ? g : "(absent)", w);
    free(g);
    free(w);
    fail();
}

static int verbose(void)
{
    return getenv("LOOM_TEST_VERBOSE") != NULL;
}

/* ---- test tools -------------------------------------------------------- */

static int echo_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    (void)ctx;
    (void)payload;
    return loom_buf_printf(out, "echo:%s",
                           json_string_value(json_object_get(args, "text")));
}

static int fail_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    (void)args;
    (void)ctx;
    (void)payload;
    loom_buf_puts(out, "disk on fire");
    return LOOM_ERROR;
}

static loom_tool_registry *make_tools(json_t *echo_schema)
{
    loom_tool_registry *reg;
    loom_tool t;

    assert_int_equal(loom_tool_registry_new(&reg), 0);
    memset(&t, 0, sizeof(t));
    t.name = "echo";
    t.description = "Echoes text back.";
    t.parameters = echo_schema;
    t.execute = echo_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    t.name = "fail";
    t.description = "Always fails.";
    t.parameters = NULL;
    t.execute = fail_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    return reg;
}

/* ---- adapters ---------------------------------------------------------- */

enum { OPENAI, RESPONSES, ANTHROPIC, GEMINI, NADAPTERS };

typedef struct {
    const char *kind;  /* loom_provider_config.kind */
    const char *path;  /* where every request must go */
    const char *query; /* and with what query */
} adapter;

static const adapter adapters[NADAPTERS] = {
    [OPENAI] = {"openai", "/v1/chat/completions", ""},
    [RESPONSES] = {"openai-responses", "/v1/responses", ""},
    [ANTHROPIC] = {"anthropic", "/v1/messages", ""},
    [GEMINI] = {"gemini", "/v1/models/fake-model:streamGenerateContent",
                "alt=sse"},
};

/* ---- scenarios --------------------------------------------------------- */

/*
 * One expectation on the recorded requests: in request req (0-based; -1:
 * every request), the value at path in the body ("messages.2.content": a
 * dot between keys, numbers index arrays; "" is the whole body) equals
 * want (JSON with ' for "), or is absent when want is NULL.
 */
typedef struct {
    int req;
    const char *path;
    const char *want;
} wire_check;

#define WIRE_END                                                               \
    {                                                                          \
        0, NULL, NULL                                                          \
    }

typedef struct {
    const char *name;
    const char *script; /* the fake's script, ' for " */
    /* When set, the user's next message: a second run continues the
     * conversation (the first run's messages, then this), as loom serve
     * does with a stored conversation. */
    const char *followup;
    int max_iterations;
    long thinking_budget;
    const char *reasoning_effort;
    int prompt_cache;
    int chain_responses;
    /* What every adapter's runs must show: the requests (and model calls)
     * of all runs, the last run's text and finish reason, and every run's
     * normalised events one after the other (' for "). */
    int requests;
    const char *text;
    const char *finish_reason;
    const char *events;
    /* Reasoning tokens the run reports where the format has them (Anthropic
     * reports none). */
    long reasoning_tokens;
    const wire_check *wire[NADAPTERS];
} scenario;

/* ---- normalising events ------------------------------------------------ */

/*
 * Call ids differ by provider, Gemini makes its own when the model gives
 * none, and some servers number the calls of every answer from 1 again:
 * each id is replaced by "#t.k", the k-th id turn t shows.
 */
#define MAX_TURNS 32

typedef struct {
    json_t *map;          /* "t:id" -> "#t.k" */
    int count[MAX_TURNS]; /* ids seen per turn */
} idmap;

static const char *norm_id(idmap *m, json_int_t turn, const char *id)
{
    char key[256], val[32];
    json_t *v;

    assert_non_null(id);
    assert_true(turn >= 0 && turn < MAX_TURNS);
    snprintf(key, sizeof(key), "%d:%s", (int)turn, id);
    v = json_object_get(m->map, key);
    if (!v) {
        snprintf(val, sizeof(val), "#%d.%d", (int)turn, ++m->count[turn]);
        v = json_string(val);
        json_object_set_new(m->map, key, v);
    }
    return json_string_value(v);
}

static void set_norm_id(json_t *o, idmap *m, json_int_t turn)
{
    const char *id = json_string_value(json_object_get(o, "id"));

    json_object_set_new(o, "id", json_string(norm_id(m, turn, id)));
}

/*
 * A usage object as [prompt, completion, cached, total]: the counts every
 * format reports alike. Reasoning tokens (Anthropic has none) and cache
 * writes (only Anthropic has them) are checked apart, cost is unset.
 */
static json_t *norm_usage(const json_t *u)
{
    assert_true(json_is_object(u));
    return json_pack(
        "[IIII]", json_integer_value(json_object_get(u, "prompt_tokens")),
        json_integer_value(json_object_get(u, "completion_tokens")),
        json_integer_value(json_object_get(u, "cached_tokens")),
        json_integer_value(json_object_get(u, "total_tokens")));
}

static int is_tool_event(const json_t *e)
{
    const char *t = json_string_value(json_object_get(e, "type"));

    return !strcmp(t, "tool.started") || !strcmp(t, "tool.completed") ||
           !strcmp(t, "tool.failed");
}

/* k of an event's "#t.k" id. */
static long call_ordinal(const json_t *e)
{
    const char *id = json_string_value(json_object_get(e, "id"));
    const char *dot = id ? strchr(id, '.') : NULL;

    assert_non_null(dot);
    return strtol(dot + 1, NULL, 10);
}

/*
 * Tools of one turn run in parallel, so their events interleave as they
 * happen to finish: each run of tool events is put in call order, keeping
 * every call's own events in the order they came (started first).
 */
static void order_tool_events(json_t *out)
{
    size_t i = 0, n = json_array_size(out);

    while (i < n) {
        size_t j = i;
        while (j < n && is_tool_event(json_array_get(out, j)))
            j++;
        /* insertion sort of [i, j): stable, and the runs are short */
        for (size_t k = i + 1; k < j; k++) {
            json_t *e = json_incref(json_array_get(out, k));
            size_t m = k;
            while (m > i &&
                   call_ordinal(json_array_get(out, m - 1)) > call_ordinal(e)) {
                json_array_set(out, m, json_array_get(out, m - 1));
                m--;
            }
            json_array_set_new(out, m, e);
        }
        i = j > i ? j : i + 1;
    }
}

/*
 * The run's events as the scenarios state them: seq and run_id checked,
 * then dropped; deltas of one kind and turn joined into one event whose
 * "delta" is the turn's whole text; ids as "#t.k"; arguments parsed (each
 * format spells the same object its own way); durations dropped; usage as
 * norm_usage() gives it; tool.metric events left out.
 */
static json_t *normalise(const json_t *events, const char *run_id)
{
    json_t *out = json_array(), *e;
    idmap ids = {json_object(), {0}};
    size_t i;

    json_array_foreach(events, i, e)
    {
        const char *type = json_string_value(json_object_get(e, "type"));
        json_t *n, *last = json_array_get(out, json_array_size(out) - 1);
        json_int_t turn;

        assert_int_equal(json_integer_value(json_object_get(e, "seq")),
                         (json_int_t)i + 1);
        assert_string_equal(json_string_value(json_object_get(e, "run_id")),
                            run_id);
        /* Telemetry (timing, sizes) is tested in test_hooks.c. */
        if (!strcmp(type, "tool.metric"))
            continue;
        if ((!strcmp(type, "message.delta") ||
             !strcmp(type, "reasoning.delta")) &&
            last &&
            !strcmp(json_string_value(json_object_get(last, "type")), type) &&
            json_equal(json_object_get(last, "index"),
                       json_object_get(e, "index"))) {
            char *joined = NULL;
            assert_true(
                asprintf(&joined, "%s%s",
                         json_string_value(json_object_get(last, "delta")),
                         json_string_value(json_object_get(e, "delta"))) > 0);
            json_object_set_new(last, "delta", json_string(joined));
            free(joined);
            continue;
        }
        turn = json_integer_value(json_object_get(e, "index"));
        n = json_deep_copy(e);
        json_object_del(n, "seq");
        json_object_del(n, "run_id");
        json_object_del(n, "duration_ms");
        if (!strcmp(type, "tool_calls")) {
            json_t *c;
            size_t k;
            json_array_foreach(json_object_get(n, "calls"), k, c)
            {
                const char *args =
                    json_string_value(json_object_get(c, "arguments"));
                json_t *parsed = json_loads(args, JSON_DECODE_ANY, NULL);
                set_norm_id(c, &ids, turn);
                if (parsed)
                    json_object_set_new(c, "arguments", parsed);
            }
        } else if (is_tool_event(n)) {
            set_norm_id(n, &ids, turn);
        } else if (!strcmp(type, "usage")) {
            json_t *u = norm_usage(n);
            json_t *it = json_incref(json_object_get(n, "iteration"));
            json_decref(n);
            n = json_pack("{s:s,s:O,s:o,s:o}", "type", "usage", "index",
                          json_object_get(e, "index"), "iteration", it,
                          "tokens", u);
        } else if (!strcmp(type, "run.completed") ||
                   !strcmp(type, "run.failed")) {
            json_object_set_new(n, "usage",
                                norm_usage(json_object_get(n, "usage")));
        }
        json_array_append_new(out, n);
    }
    order_tool_events(out);
    json_decref(ids.map);
    return out;
}

/*
 * The messages the run added, in a form every adapter must agree on:
 * role, content, whether there was reasoning and what, calls (name and
 * parsed arguments), results (id as "#t.k", t counting the assistant
 * messages, name, content). provider_state is the adapter's own and left
 * out.
 */
static json_t *norm_messages(const loom_messages *m)
{
    json_t *out = json_array();
    idmap ids = {json_object(), {0}};
    json_int_t turn = -1;

    for (size_t i = 0; i < m->len; i++) {
        const loom_message *x = &m->items[i];
        json_t *o = json_pack("{s:s}", "role", loom_role_name(x->role));

        turn += x->role == LOOM_ROLE_ASSISTANT;
        if (x->content)
            json_object_set_new(o, "content", json_string(x->content));
        if (x->reasoning)
            json_object_set_new(o, "reasoning", json_string(x->reasoning));
        if (x->tool_calls_len) {
            json_t *calls = json_array();
            for (size_t k = 0; k < x->tool_calls_len; k++) {
                const loom_tool_call *c = &x->tool_calls[k];
                json_t *args = json_loads(c->arguments, 0, NULL);
                json_array_append_new(
                    calls,
                    json_pack("{s:s,s:s,s:o}", "id", norm_id(&ids, turn, c->id),
                              "name", c->name, "arguments",
                              args ? args : json_string(c->arguments)));
            }
            json_object_set_new(o, "tool_calls", calls);
        }
        if (x->tool_call_id)
            json_object_set_new(
                o, "tool_call_id",
                json_string(norm_id(&ids, turn, x->tool_call_id)));
        if (x->name)
            json_object_set_new(o, "name", json_string(x->name));
        json_array_append_new(out, o);
    }
    json_decref(ids.map);
    return out;
}

/* ---- running one scenario on one adapter ------------------------------ */

typedef struct {
    loom_fake *fake;
    loom_provider_config pc;
    loom_provider *provider;
    loom_tool_registry *reg;
    json_t *schema;
    loom_messages conversation; /* what the next run is given */
    json_t *events;     /* the current run's events, from loom_event_to_json */
    json_t *all_events; /* every run's, normalised, one after the other */
    json_t *all_messages; /* every run's added messages, normalised */
    int iterations;       /* summed over the runs */
    loom_usage usage;     /* summed over the runs */
    loom_run *run;        /* the last run */
} harness;

static int record(const loom_event *ev, void *payload)
{
    harness *h = payload;

    json_array_append_new(h->events, loom_event_to_json(ev));
    return 0;
}

static void harness_start(harness *h, const scenario *s, int a)
{
    char *script = q(s->script);

    memset(h, 0, sizeof(*h));
    h->fake = fake_start_script(script);
    free(script);
    assert_non_null(h->fake);
    h->pc.name = "fake";
    h->pc.kind = (char *)adapters[a].kind;
    h->pc.base_url = (char *)fake_base_url(h->fake);
    h->pc.api_key = "test-key";
    h->pc.headers = json_object();
    h->pc.connect_timeout_ms = 5000;
    h->pc.first_byte_timeout_ms = 30000;
    h->pc.idle_timeout_ms = 30000;
    h->pc.max_retries = 0; /* a scenario never needs one */
    assert_int_equal(loom_provider_new(&h->provider, &h->pc), 0);
    h->schema =
        json_pack("{s:s,s:{s:{s:s}},s:[s]}", "type", "object", "properties",
                  "text", "type", "string", "required", "text");
    h->reg = make_tools(h->schema);
    h->all_events = json_array();
    h->all_messages = json_array();
}

/*
 * One run over the conversation so far plus the user's message; then the
 * run's messages join the conversation, as a server keeps them, and its
 * events and messages are normalised onto the harness's lists.
 */
static void run_turn(harness *h, const scenario *s, int a, const char *user)
{
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    json_t *norm;
    int rc;

    loom_run_free(h->run);
    h->run = NULL;
    h->events = json_array();
    ro.provider = h->provider;
    ro.model = "fake/fake-model";
    ro.upstream_model = "fake-model";
    ro.tools = h->reg;
    ro.system_prompt = "Be brief.";
    ro.max_iterations = s->max_iterations;
    ro.parallel_tool_calls = 1;
    ro.temperature = -1.0;
    ro.thinking_budget = s->thinking_budget;
    ro.reasoning_effort = s->reasoning_effort;
    ro.prompt_cache = s->prompt_cache;
    ro.chain_responses = s->chain_responses;
    ro.sink.emit = record;
    ro.sink.payload = h;
    assert_int_equal(loom_messages_add(&h->conversation, LOOM_ROLE_USER, user),
                     0);
    assert_int_equal(loom_run_new(&h->run, &ro, &h->conversation), 0);
    rc = loom_run_execute(h->run);
    if (rc)
        print_error("%s on %s: %s\n", s->name, adapters[a].kind,
                    loom_run_error(h->run));
    assert_int_equal(rc, 0);
    assert_int_equal(loom_run_status_get(h->run), LOOM_RUN_COMPLETED);
    h->iterations += loom_run_iterations(h->run);
    loom_usage_add(&h->usage, loom_run_usage(h->run));
    assert_int_equal(
        loom_messages_append(&h->conversation, loom_run_messages(h->run)), 0);
    norm = normalise(h->events, loom_run_id(h->run));
    json_array_extend(h->all_events, norm);
    json_decref(norm);
    norm = norm_messages(loom_run_messages(h->run));
    json_array_extend(h->all_messages, norm);
    json_decref(norm);
    json_decref(h->events);
    h->events = NULL;
}

static void harness_free(harness *h)
{
    loom_run_free(h->run);
    loom_messages_free(&h->conversation);
    loom_provider_free(h->provider);
    loom_tool_registry_free(h->reg);
    json_decref(h->schema);
    json_decref(h->all_events);
    json_decref(h->all_messages);
    json_decref(h->pc.headers);
    assert_int_equal(fake_stop_check(h->fake), 0);
}

/* ---- checking the wire ------------------------------------------------- */

/* The value at path ("a.0.b") under v, borrowed; NULL when absent. */
static json_t *at_path(json_t *v, const char *path)
{
    char *copy = strdup(path), *save = NULL, *seg;

    assert_non_null(copy);
    for (seg = strtok_r(copy, ".", &save); seg && v;
         seg = strtok_r(NULL, ".", &save)) {
        if (json_is_array(v))
            v = json_array_get(v, strtoul(seg, NULL, 10));
        else
            v = json_object_get(v, seg);
    }
    free(copy);
    return v;
}

static void check_one(const scenario *s, int a, json_t *reqs, size_t r,
                      const wire_check *c)
{
    json_t *body = json_object_get(json_array_get(reqs, r), "body");
    json_t *got = at_path(body, c->path);
    char what[256];

    snprintf(what, sizeof(what), "%s on %s: request %zu, \"%s\"", s->name,
             adapters[a].kind, r, c->path);
    if (!c->want) {
        if (got) {
            char *g = json_dumps(got, JSON_COMPACT | JSON_ENCODE_ANY);
            fprintf(stderr, "%s\n got:  %s\n want: (absent)\n", what, g);
            free(g);
            fail();
        }
        return;
    }
    {
        json_t *want = qjson(c->want);
        assert_json_equal(what, got, want);
        json_decref(want);
    }
}

static void check_wire(const scenario *s, int a, json_t *reqs)
{
    size_t n = json_array_size(reqs);

    for (size_t r = 0; r < n; r++) {
        json_t *req = json_array_get(reqs, r);
        assert_string_equal(json_string_value(json_object_get(req, "path")),
                            adapters[a].path);
        assert_string_equal(json_string_value(json_object_get(req, "query")),
                            adapters[a].query);
        assert_non_null(json_object_get(req, "body"));
    }
    for (const wire_check *c = s->wire[a]; c && c->path; c++) {
        if (c->req >= 0) {
            assert_true((size_t)c->req < n);
            check_one(s, a, reqs, (size_t)c->req, c);
        } else {
            for (size_t r = 0; r < n; r++)
                check_one(s, a, reqs, r, c);
        }
    }
}

/* ---- the scenarios ----------------------------------------------------- */

/*
 * (1) Two calls in one turn (their fragments interleaved where the format
 * allows it), one more in the next, then the answer. Prompt caching is on
 * (Anthropic breakpoints); Responses is not chained, so every request
 * carries the whole conversation.
 */
static const wire_check tool_loop_openai[] = {
    {-1, "stream", "true"},
    {-1, "stream_options", "{'include_usage':true}"},
    {-1, "tool_choice", "'auto'"},
    {-1, "parallel_tool_calls", "true"},
    {-1, "tools.1.function.name", "'fail'"},
    {2, "messages",
     "[{'role':'system','content':'Be brief.'},"
     "{'role':'user','content':'question'},"
     "{'role':'assistant','content':'Let me look.','tool_calls':["
     "{'id':'call_a','type':'function','function':{'name':'echo',"
     "'arguments':'{\\'text\\':\\'one\\'}'}},"
     "{'id':'call_b','type':'function','function':{'name':'echo',"
     "'arguments':'{\\'text\\':\\'two\\'}'}}]},"
     "{'role':'tool','tool_call_id':'call_a','content':'echo:one'},"
     "{'role':'tool','tool_call_id':'call_b','content':'echo:two'},"
     "{'role':'assistant','content':null,'tool_calls':["
     "{'id':'call_c','type':'function','function':{'name':'echo',"
     "'arguments':'{\\'text\\':\\'three\\'}'}}]},"
     "{'role':'tool','tool_call_id':'call_c','content':'echo:three'}]"},
    WIRE_END};

static const wire_check tool_loop_responses[] = {
    {-1, "store", "false"},
    {-1, "previous_response_id", NULL},
    {-1, "instructions", "'Be brief.'"},
    {-1, "tool_choice", "'auto'"},
    {-1, "parallel_tool_calls", "true"},
    {0, "input", "[{'type':'message','role':'user','content':'question'}]"},
    /* not chained: the whole conversation every time, the items of an
     * answer with the ids the API gave them */
    {2, "input",
     "[{'type':'message','role':'user','content':'question'},"
     "{'type':'message','id':'msg_fake_1','role':'assistant','status':"
     "'completed','content':[{'type':'output_text','text':'Let me look.',"
     "'annotations':[]}]},"
     "{'type':'function_call','id':'fc_fake_1_1','call_id':'call_a',"
     "'name':'echo','arguments':'{\\'text\\':\\'one\\'}'},"
     "{'type':'function_call','id':'fc_fake_1_2','call_id':'call_b',"
     "'name':'echo','arguments':'{\\'text\\':\\'two\\'}'},"
     "{'type':'function_call_output','call_id':'call_a','output':"
     "'echo:one'},"
     "{'type':'function_call_output','call_id':'call_b','output':"
     "'echo:two'},"
     "{'type':'function_call','id':'fc_fake_2_1','call_id':'call_c',"
     "'name':'echo','arguments':'{\\'text\\':\\'three\\'}'},"
     "{'type':'function_call_output','call_id':'call_c','output':"
     "'echo:three'}]"},
    WIRE_END};

static const wire_check tool_loop_anthropic[] = {
    {-1, "stream", "true"},
    {-1, "tool_choice", "{'type':'auto'}"},
    {-1, "thinking", NULL},
    /* prompt_cache: breakpoints on the last tool, the system prompt and
     * the last two user turns */
    {-1, "tools.0.cache_control", NULL},
    {-1, "tools.1.cache_control", "{'type':'ephemeral'}"},
    {-1, "system",
     "[{'type':'text','text':'Be brief.','cache_control':"
     "{'type':'ephemeral'}}]"},
    {0, "messages",
     "[{'role':'user','content':[{'type':'text','text':'question',"
     "'cache_control':{'type':'ephemeral'}}]}]"},
    {2, "messages",
     "[{'role':'user','content':[{'type':'text','text':'question'}]},"
     "{'role':'assistant','content':["
     "{'type':'text','text':'Let me look.'},"
     "{'type':'tool_use','id':'call_a','name':'echo','input':"
     "{'text':'one'}},"
     "{'type':'tool_use','id':'call_b','name':'echo','input':"
     "{'text':'two'}}]},"
     "{'role':'user','content':["
     "{'type':'tool_result','tool_use_id':'call_a','content':'echo:one'},"
     "{'type':'tool_result','tool_use_id':'call_b','content':'echo:two',"
     "'cache_control':{'type':'ephemeral'}}]},"
     "{'role':'assistant','content':["
     "{'type':'tool_use','id':'call_c','name':'echo','input':"
     "{'text':'three'}}]},"
     "{'role':'user','content':["
     "{'type':'tool_result','tool_use_id':'call_c','content':'echo:three',"
     "'cache_control':{'type':'ephemeral'}}]}]"},
    WIRE_END};

static const wire_check tool_loop_gemini[] = {
    {-1, "systemInstruction", "{'parts':[{'text':'Be brief.'}]}"},
    {-1, "toolConfig", NULL}, /* auto is Gemini's default */
    {-1, "tools.0.functionDeclarations.0.name", "'echo'"},
    {-1, "tools.0.functionDeclarations.1",
     "{'name':'fail','description':'Always fails.'}"},
    /* the calls keep the ids the model gave, the signature stays on the
     * first call's part; each result names its call by name and id, the
     * results of a turn in one user turn */
    {2, "contents",
     "[{'role':'user','parts':[{'text':'question'}]},"
     "{'role':'model','parts':[{'text':'Let me look.'},"
     "{'functionCall':{'name':'echo','args':{'text':'one'},'id':"
     "'call_a'},'thoughtSignature':'c2lnLXBhcg=='},"
     "{'functionCall':{'name':'echo','args':{'text':'two'},'id':"
     "'call_b'}}]},"
     "{'role':'user','parts':["
     "{'functionResponse':{'name':'echo','response':{'result':"
     "'echo:one'},'id':'call_a'}},"
     "{'functionResponse':{'name':'echo','response':{'result':"
     "'echo:two'},'id':'call_b'}}]},"
     "{'role':'model','parts':["
     "{'functionCall':{'name':'echo','args':{'text':'three'},'id':"
     "'call_c'}}]},"
     "{'role':'user','parts':["
     "{'functionResponse':{'name':'echo','response':{'result':"
     "'echo:three'},'id':'call_c'}}]}]"},
    WIRE_END};

static const scenario sc_tool_loop = {
    .name = "tool loop with parallel calls",
    .script =
        "{'responses':["
        "{'text':['Let me look.'],'interleave':true,"
        "'thought_signature':'c2lnLXBhcg==','tool_calls':["
        "{'id':'call_a','name':'echo','arguments':['{\\'text\\':','\\'one\\'}']"
        "},"
        "{'id':'call_b','name':'echo','arguments':'{\\'text\\':\\'two\\'}'}],"
        "'usage':{'prompt_tokens':20,'completion_tokens':8,'total_tokens':28}},"
        "{'tool_calls':[{'id':'call_c','name':'echo','arguments':"
        "['{\\'text\\'',':\\'three\\'}']}],"
        "'usage':{'prompt_tokens':40,'completion_tokens':4,'total_tokens':44,"
        "'prompt_tokens_details':{'cached_tokens':16}}},"
        "{'text':['All ','done.'],"
        "'usage':{'prompt_tokens':50,'completion_tokens':3,'total_tokens':53}}"
        "]}",
    .max_iterations = 5,
    .prompt_cache = 1,
    .requests = 3,
    .text = "All done.",
    .finish_reason = "stop",
    .events =
        "[{'type':'run.started','index':0,'agent':null,'model':"
        "'fake/fake-model','max_iterations':5,'tools':2},"
        "{'type':'message.delta','index':0,'delta':'Let me look.'},"
        "{'type':'usage','index':0,'iteration':1,'tokens':[20,8,0,28]},"
        "{'type':'tool_calls','index':0,'calls':["
        "{'id':'#0.1','name':'echo','arguments':{'text':'one'},'text_offset':"
        "12},"
        "{'id':'#0.2','name':'echo','arguments':{'text':'two'},"
        "'text_offset':12}]},"
        "{'type':'tool.started','index':0,'id':'#0.1','name':'echo','arguments'"
        ":"
        "{'text':'one'}},"
        "{'type':'tool.completed','index':0,'id':'#0.1','name':'echo','output':"
        "'echo:one','truncated':false,'output_size':8},"
        "{'type':'tool.started','index':0,'id':'#0.2','name':'echo','arguments'"
        ":"
        "{'text':'two'}},"
        "{'type':'tool.completed','index':0,'id':'#0.2','name':'echo','output':"
        "'echo:two','truncated':false,'output_size':8},"
        "{'type':'usage','index':1,'iteration':2,'tokens':[40,4,16,44]},"
        "{'type':'tool_calls','index':1,'calls':["
        "{'id':'#1.1','name':'echo','arguments':{'text':'three'},"
        "'text_offset':0}]},"
        "{'type':'tool.started','index':1,'id':'#1.1','name':'echo','arguments'"
        ":"
        "{'text':'three'}},"
        "{'type':'tool.completed','index':1,'id':'#1.1','name':'echo','output':"
        "'echo:three','truncated':false,'output_size':10},"
        "{'type':'message.delta','index':2,'delta':'All done.'},"
        "{'type':'usage','index':2,'iteration':3,'tokens':[50,3,0,53]},"
        "{'type':'run.completed','index':2,'status':'completed','text':"
        "'All done.','iterations':3,'finish_reason':'stop','usage':"
        "[110,15,16,125]}]",
    .reasoning_tokens = 0,
    .wire = {tool_loop_openai, tool_loop_responses, tool_loop_anthropic,
             tool_loop_gemini}};

/* The run loop's note on its last permitted call (agent/run.c). */
#define LIMIT_NOTE(n)                                                          \
    "You have reached the limit of " #n " model calls for this request, "      \
    "so tools are no longer available. Do not call any tools. Write your "     \
    "final answer to the user now, using the information gathered so "         \
    "far, and say briefly if anything could not be completed."

/*
 * (2) A tool fails beside one that works; the model reads "Error: ..." and
 * recovers with another call. The model gives no call ids (Gemini makes
 * its own; the fake numbers the calls of every answer from 1 again, as
 * some servers do), and Responses chains.
 */
static const wire_check tool_error_openai[] = {
    {1, "messages",
     "[{'role':'system','content':'Be brief.'},"
     "{'role':'user','content':'question'},"
     "{'role':'assistant','content':'Trying both.','tool_calls':["
     "{'id':'call_fake_1','type':'function','function':{'name':'fail',"
     "'arguments':'{}'}},"
     "{'id':'call_fake_2','type':'function','function':{'name':'echo',"
     "'arguments':'{\\'text\\':\\'x\\'}'}}]},"
     "{'role':'tool','tool_call_id':'call_fake_1','content':"
     "'Error: disk on fire'},"
     "{'role':'tool','tool_call_id':'call_fake_2','content':'echo:x'}]"},
    {2, "messages.5",
     "{'role':'assistant','content':'The disk failed; echoing.',"
     "'tool_calls':[{'id':'call_fake_1','type':'function','function':"
     "{'name':'echo','arguments':'{\\'text\\':\\'y\\'}'}}]}"},
    {2, "messages.6",
     "{'role':'tool','tool_call_id':'call_fake_1','content':'echo:y'}"},
    {2, "messages.7", NULL},
    WIRE_END};

static const wire_check tool_error_responses[] = {
    {-1, "store", "true"},
    {-1, "include", NULL},
    {-1, "instructions", "'Be brief.'"},
    {0, "previous_response_id", NULL},
    {0, "input", "[{'type':'message','role':'user','content':'question'}]"},
    /* chained: the previous response by id, then only what came after */
    {1, "previous_response_id", "'resp_fake_1'"},
    {1, "input",
     "[{'type':'function_call_output','call_id':'call_fake_1','output':"
     "'Error: disk on fire'},"
     "{'type':'function_call_output','call_id':'call_fake_2','output':"
     "'echo:x'}]"},
    {2, "previous_response_id", "'resp_fake_2'"},
    {2, "input",
     "[{'type':'function_call_output','call_id':'call_fake_1','output':"
     "'echo:y'}]"},
    WIRE_END};

static const wire_check tool_error_anthropic[] = {
    /* no prompt_cache: no breakpoint anywhere */
    {-1, "system", "[{'type':'text','text':'Be brief.'}]"},
    {-1, "tools.0.cache_control", NULL},
    {-1, "tools.1.cache_control", NULL},
    {-1, "tool_choice", "{'type':'auto'}"},
    /* both results in one user turn, the failed one flagged */
    {1, "messages",
     "[{'role':'user','content':[{'type':'text','text':'question'}]},"
     "{'role':'assistant','content':["
     "{'type':'text','text':'Trying both.'},"
     "{'type':'tool_use','id':'toolu_fake_1','name':'fail','input':{}},"
     "{'type':'tool_use','id':'toolu_fake_2','name':'echo','input':"
     "{'text':'x'}}]},"
     "{'role':'user','content':["
     "{'type':'tool_result','tool_use_id':'toolu_fake_1','content':"
     "'Error: disk on fire','is_error':true},"
     "{'type':'tool_result','tool_use_id':'toolu_fake_2','content':"
     "'echo:x'}]}]"},
    {2, "messages.3",
     "{'role':'assistant','content':["
     "{'type':'text','text':'The disk failed; echoing.'},"
     "{'type':'tool_use','id':'toolu_fake_1','name':'echo','input':"
     "{'text':'y'}}]}"},
    {2, "messages.4",
     "{'role':'user','content':[{'type':'tool_result','tool_use_id':"
     "'toolu_fake_1','content':'echo:y'}]}"},
    {2, "messages.5", NULL},
    WIRE_END};

static const wire_check tool_error_gemini[] = {
    /* calls without ids: results matched by name only, the error as the
     * result text */
    {1, "contents",
     "[{'role':'user','parts':[{'text':'question'}]},"
     "{'role':'model','parts':[{'text':'Trying both.'},"
     "{'functionCall':{'name':'fail','args':{}}},"
     "{'functionCall':{'name':'echo','args':{'text':'x'}}}]},"
     "{'role':'user','parts':["
     "{'functionResponse':{'name':'fail','response':{'result':"
     "'Error: disk on fire'}}},"
     "{'functionResponse':{'name':'echo','response':{'result':"
     "'echo:x'}}}]}]"},
    {2, "contents.3",
     "{'role':'model','parts':[{'text':'The disk failed; echoing.'},"
     "{'functionCall':{'name':'echo','args':{'text':'y'}}}]}"},
    {2, "contents.4",
     "{'role':'user','parts':[{'functionResponse':{'name':'echo',"
     "'response':{'result':'echo:y'}}}]}"},
    {2, "contents.5", NULL},
    WIRE_END};

static const scenario sc_tool_error = {
    .name = "tool error and recovery",
    .script = "{'responses':["
              "{'text':['Trying both.'],'tool_calls':["
              "{'name':'fail','arguments':'{}'},"
              "{'name':'echo','arguments':['{\\'text\\'',':\\'x\\'}']}]},"
              "{'text':['The disk failed; ','echoing.'],'tool_calls':["
              "{'name':'echo','arguments':'{\\'text\\':\\'y\\'}'}]},"
              "{'text':['Recovered: ','echo:y.']}]}",
    .max_iterations = 5,
    .chain_responses = 1,
    .requests = 3,
    .text = "Recovered: echo:y.",
    .finish_reason = "stop",
    .events =
        "[{'type':'run.started','index':0,'agent':null,'model':"
        "'fake/fake-model','max_iterations':5,'tools':2},"
        "{'type':'message.delta','index':0,'delta':'Trying both.'},"
        "{'type':'tool_calls','index':0,'calls':["
        "{'id':'#0.1','name':'fail','arguments':{},'text_offset':12},"
        "{'id':'#0.2','name':'echo','arguments':{'text':'x'},"
        "'text_offset':12}]},"
        "{'type':'tool.started','index':0,'id':'#0.1','name':'fail',"
        "'arguments':{}},"
        "{'type':'tool.failed','index':0,'id':'#0.1','name':'fail','stage':"
        "'execution','error':'disk on fire','output':'Error: disk on fire'},"
        "{'type':'tool.started','index':0,'id':'#0.2','name':'echo',"
        "'arguments':{'text':'x'}},"
        "{'type':'tool.completed','index':0,'id':'#0.2','name':'echo','output':"
        "'echo:x','truncated':false,'output_size':6},"
        "{'type':'message.delta','index':1,'delta':'The disk failed; "
        "echoing.'},"
        "{'type':'tool_calls','index':1,'calls':["
        "{'id':'#1.1','name':'echo','arguments':{'text':'y'},"
        "'text_offset':25}]},"
        "{'type':'tool.started','index':1,'id':'#1.1','name':'echo',"
        "'arguments':{'text':'y'}},"
        "{'type':'tool.completed','index':1,'id':'#1.1','name':'echo','output':"
        "'echo:y','truncated':false,'output_size':6},"
        "{'type':'message.delta','index':2,'delta':'Recovered: echo:y.'},"
        "{'type':'run.completed','index':2,'status':'completed','text':"
        "'Recovered: echo:y.','iterations':3,'finish_reason':'stop','usage':"
        "[0,0,0,0]}]",
    .reasoning_tokens = 0,
    .wire = {tool_error_openai, tool_error_responses, tool_error_anthropic,
             tool_error_gemini}};

/*
 * (3) The model thinks before it calls a tool and before it answers: each
 * format's reasoning (Chat reasoning_content, Responses reasoning items,
 * Anthropic thinking blocks with signatures and a redacted block, Gemini
 * thought parts and a thoughtSignature) is reported as reasoning deltas,
 * and what the provider needs back goes back unchanged.
 */
static const wire_check reasoning_openai[] = {
    {-1, "reasoning_effort", "'low'"},
    /* reasoning from earlier turns is not sent back */
    {1, "messages.2",
     "{'role':'assistant','content':'Echoing.','tool_calls':["
     "{'id':'call_r','type':'function','function':{'name':'echo',"
     "'arguments':'{\\'text\\':\\'hi\\'}'}}]}"},
    {1, "messages.3",
     "{'role':'tool','tool_call_id':'call_r','content':'echo:hi'}"},
    WIRE_END};

static const wire_check reasoning_responses[] = {
    {-1, "reasoning", "{'effort':'low'}"},
    {-1, "store", "false"},
    {-1, "include", "['reasoning.encrypted_content']"},
    {-1, "previous_response_id", NULL},
    /* not stored and no encrypted content: the reasoning item cannot go
     * back, so the items after it go without their ids */
    {1, "input",
     "[{'type':'message','role':'user','content':'question'},"
     "{'type':'message','role':'assistant','content':'Echoing.'},"
     "{'type':'function_call','call_id':'call_r','name':'echo',"
     "'arguments':'{\\'text\\':\\'hi\\'}'},"
     "{'type':'function_call_output','call_id':'call_r','output':"
     "'echo:hi'}]"},
    WIRE_END};

static const wire_check reasoning_anthropic[] = {
    {-1, "thinking", "{'type':'enabled','budget_tokens':1024}"},
    {-1, "max_tokens", "5120"},
    {-1, "temperature", NULL},
    /* the thinking and redacted blocks go back first and byte for byte */
    {1, "messages",
     "[{'role':'user','content':[{'type':'text','text':'question',"
     "'cache_control':{'type':'ephemeral'}}]},"
     "{'role':'assistant','content':["
     "{'type':'thinking','thinking':'The user wants an echo.',"
     "'signature':'c2lnLTE/+=='},"
     "{'type':'redacted_thinking','data':'UkVEQUNURUQ='},"
     "{'type':'text','text':'Echoing.'},"
     "{'type':'tool_use','id':'call_r','name':'echo','input':"
     "{'text':'hi'}}]},"
     "{'role':'user','content':[{'type':'tool_result','tool_use_id':"
     "'call_r','content':'echo:hi','cache_control':{'type':"
     "'ephemeral'}}]}]"},
    WIRE_END};

static const wire_check reasoning_gemini[] = {
    {-1, "generationConfig",
     "{'thinkingConfig':{'thinkingBudget':1024,'includeThoughts':true}}"},
    /* the signature on the part it came on, the same bytes; thoughts
     * themselves do not go back */
    {1, "contents.1",
     "{'role':'model','parts':[{'text':'Echoing.'},"
     "{'functionCall':{'name':'echo','args':{'text':'hi'},'id':'call_r'},"
     "'thoughtSignature':'dGhvdWdodC0x/+=='}]}"},
    {1, "contents.2",
     "{'role':'user','parts':[{'functionResponse':{'name':'echo',"
     "'response':{'result':'echo:hi'},'id':'call_r'}}]}"},
    WIRE_END};

static const scenario sc_reasoning = {
    .name = "reasoning before a call and before the answer",
    .script =
        "{'responses':["
        "{'reasoning':['The user wants ','an echo.'],'signature':'c2lnLTE/+==',"
        "'redacted_thinking':'UkVEQUNURUQ=','thought_signature':"
        "'dGhvdWdodC0x/+==','text':['Echoing.'],'tool_calls':["
        "{'id':'call_r','name':'echo','arguments':'{\\'text\\':\\'hi\\'}'}],"
        "'usage':{'prompt_tokens':30,'completion_tokens':20,'total_tokens':50,"
        "'completion_tokens_details':{'reasoning_tokens':12}}},"
        "{'reasoning':['It "
        "echoed.'],'signature':'c2lnLTI=','thought_signature':"
        "'dGhvdWdodC0y','text':['It said ','hi.'],"
        "'usage':{'prompt_tokens':60,'completion_tokens':9,'total_tokens':69,"
        "'completion_tokens_details':{'reasoning_tokens':5}}}]}",
    .max_iterations = 5,
    .thinking_budget = 1024,
    .reasoning_effort = "low",
    .prompt_cache = 1,
    .requests = 2,
    .text = "It said hi.",
    .finish_reason = "stop",
    .events =
        "[{'type':'run.started','index':0,'agent':null,'model':"
        "'fake/fake-model','max_iterations':5,'tools':2},"
        "{'type':'reasoning.delta','index':0,'delta':'The user wants an "
        "echo.'},"
        "{'type':'message.delta','index':0,'delta':'Echoing.'},"
        "{'type':'usage','index':0,'iteration':1,'tokens':[30,20,0,50]},"
        "{'type':'tool_calls','index':0,'calls':["
        "{'id':'#0.1','name':'echo','arguments':{'text':'hi'},"
        "'text_offset':8}]},"
        "{'type':'tool.started','index':0,'id':'#0.1','name':'echo',"
        "'arguments':{'text':'hi'}},"
        "{'type':'tool.completed','index':0,'id':'#0.1','name':'echo','output':"
        "'echo:hi','truncated':false,'output_size':7},"
        "{'type':'reasoning.delta','index':1,'delta':'It echoed.'},"
        "{'type':'message.delta','index':1,'delta':'It said hi.'},"
        "{'type':'usage','index':1,'iteration':2,'tokens':[60,9,0,69]},"
        "{'type':'run.completed','index':1,'status':'completed','text':"
        "'It said hi.','iterations':2,'finish_reason':'stop','usage':"
        "[90,29,0,119]}]",
    .reasoning_tokens = 17,
    .wire = {reasoning_openai, reasoning_responses, reasoning_anthropic,
             reasoning_gemini}};

/*
 * (4) The model keeps calling tools until the limit: the last permitted
 * call still declares the tools but forbids calls (tool_choice none),
 * carries the limit note where each format puts a late system message,
 * and the run ends with the answer. Not chained ((7) is).
 */
static const wire_check limit_openai[] = {
    {0, "tool_choice", "'auto'"},
    {1, "tool_choice", "'auto'"},
    {2, "tool_choice", "'none'"},
    {2, "tools.0.function.name", "'echo'"},
    {2, "messages.6", "{'role':'system','content':'" LIMIT_NOTE(3) "'}"},
    {2, "messages.7", NULL},
    WIRE_END};

static const wire_check limit_responses[] = {
    {0, "tool_choice", "'auto'"},
    {1, "tool_choice", "'auto'"},
    {2, "tool_choice", "'none'"},
    {2, "tools.0.name", "'echo'"},
    {-1, "store", "false"},
    {2, "input.6",
     "{'type':'message','role':'developer','content':'" LIMIT_NOTE(3) "'}"},
    {2, "input.7", NULL},
    WIRE_END};

static const wire_check limit_anthropic[] = {
    {0, "tool_choice", "{'type':'auto'}"},
    {1, "tool_choice", "{'type':'auto'}"},
    {2, "tool_choice", "{'type':'none'}"},
    {2, "tools.0.name", "'echo'"},
    {2, "tools.1.name", "'fail'"},
    {2, "tools.2", NULL},
    /* the note is user text after the results, in their turn */
    {2, "messages.4",
     "{'role':'user','content':[{'type':'tool_result','tool_use_id':"
     "'toolu_fake_1','content':'echo:2'},{'type':'text','text':'" LIMIT_NOTE(
         3) "'}]}"},
    {2, "messages.5", NULL},
    WIRE_END};

static const wire_check limit_gemini[] = {
    {0, "toolConfig", NULL},
    {1, "toolConfig", NULL},
    {2, "toolConfig", "{'functionCallingConfig':{'mode':'NONE'}}"},
    {2, "tools.0.functionDeclarations.0.name", "'echo'"},
    {2, "systemInstruction",
     "{'parts':[{'text':'Be brief.'},{'text':'" LIMIT_NOTE(3) "'}]}"},
    {2, "contents.4",
     "{'role':'user','parts':[{'functionResponse':{'name':'echo',"
     "'response':{'result':'echo:2'}}}]}"},
    {2, "contents.5", NULL},
    WIRE_END};

static const scenario sc_limit = {
    .name = "iteration limit",
    .script =
        "{'responses':["
        "{'tool_calls':[{'name':'echo','arguments':'{\\'text\\':\\'1\\'}'}]},"
        "{'text':['Again.'],'tool_calls':[{'name':'echo','arguments':"
        "'{\\'text\\':\\'2\\'}'}]},"
        "{'text':['Found ','1 and 2.']}]}",
    .max_iterations = 3,
    .requests = 3,
    .text = "Found 1 and 2.",
    .finish_reason = "stop",
    .events =
        "[{'type':'run.started','index':0,'agent':null,'model':"
        "'fake/fake-model','max_iterations':3,'tools':2},"
        "{'type':'tool_calls','index':0,'calls':["
        "{'id':'#0.1','name':'echo','arguments':{'text':'1'},"
        "'text_offset':0}]},"
        "{'type':'tool.started','index':0,'id':'#0.1','name':'echo',"
        "'arguments':{'text':'1'}},"
        "{'type':'tool.completed','index':0,'id':'#0.1','name':'echo','output':"
        "'echo:1','truncated':false,'output_size':6},"
        "{'type':'message.delta','index':1,'delta':'Again.'},"
        "{'type':'tool_calls','index':1,'calls':["
        "{'id':'#1.1','name':'echo','arguments':{'text':'2'},"
        "'text_offset':6}]},"
        "{'type':'tool.started','index':1,'id':'#1.1','name':'echo',"
        "'arguments':{'text':'2'}},"
        "{'type':'tool.completed','index':1,'id':'#1.1','name':'echo','output':"
        "'echo:2','truncated':false,'output_size':6},"
        "{'type':'message.delta','index':2,'delta':'Found 1 and 2.'},"
        "{'type':'run.completed','index':2,'status':'completed','text':"
        "'Found 1 and 2.','iterations':3,'finish_reason':'stop','usage':"
        "[0,0,0,0]}]",
    .reasoning_tokens = 0,
    .wire = {limit_openai, limit_responses, limit_anthropic, limit_gemini}};

/*
 * (5) The model calls a tool even on the last permitted call (it ignored
 * tool_choice none): the call is not run, and the run ends with the text
 * that came with it.
 */
static const wire_check limit_ignored_openai[] = {{1, "tool_choice", "'none'"},
                                                  WIRE_END};
static const wire_check limit_ignored_responses[] = {
    {1, "tool_choice", "'none'"}, WIRE_END};
static const wire_check limit_ignored_anthropic[] = {
    {1, "tool_choice", "{'type':'none'}"}, WIRE_END};
static const wire_check limit_ignored_gemini[] = {
    {1, "toolConfig", "{'functionCallingConfig':{'mode':'NONE'}}"}, WIRE_END};

static const scenario sc_limit_ignored = {
    .name = "iteration limit, the model calls anyway",
    .script =
        "{'responses':["
        "{'tool_calls':[{'name':'echo','arguments':'{\\'text\\':\\'1\\'}'}]},"
        "{'text':['Partial.'],'tool_calls':[{'name':'echo','arguments':"
        "'{\\'text\\':\\'2\\'}'}]}]}",
    .max_iterations = 2,
    .requests = 2,
    .text = "Partial.",
    .finish_reason = "tool_calls",
    .events =
        "[{'type':'run.started','index':0,'agent':null,'model':"
        "'fake/fake-model','max_iterations':2,'tools':2},"
        "{'type':'tool_calls','index':0,'calls':["
        "{'id':'#0.1','name':'echo','arguments':{'text':'1'},"
        "'text_offset':0}]},"
        "{'type':'tool.started','index':0,'id':'#0.1','name':'echo',"
        "'arguments':{'text':'1'}},"
        "{'type':'tool.completed','index':0,'id':'#0.1','name':'echo','output':"
        "'echo:1','truncated':false,'output_size':6},"
        "{'type':'message.delta','index':1,'delta':'Partial.'},"
        "{'type':'run.completed','index':1,'status':'completed','text':"
        "'Partial.','iterations':2,'finish_reason':'tool_calls','usage':"
        "[0,0,0,0]}]",
    .reasoning_tokens = 0,
    .wire = {limit_ignored_openai, limit_ignored_responses,
             limit_ignored_anthropic, limit_ignored_gemini}};

/*
 * (6) A conversation goes on: a second run over the first one's messages
 * and the user's next question, as loom serve runs a stored
 * conversation. What each provider needs back from the earlier answers
 * (thinking blocks, thoughtSignatures, the response to chain from) comes
 * from the stored messages.
 */
static const wire_check followup_openai[] = {
    {2, "messages",
     "[{'role':'system','content':'Be brief.'},"
     "{'role':'user','content':'question'},"
     "{'role':'assistant','content':null,'tool_calls':["
     "{'id':'call_f','type':'function','function':{'name':'echo',"
     "'arguments':'{\\'text\\':\\'a\\'}'}}]},"
     "{'role':'tool','tool_call_id':'call_f','content':'echo:a'},"
     "{'role':'assistant','content':'It is a.'},"
     "{'role':'user','content':'And now?'}]"},
    {-1, "reasoning_effort", "'high'"},
    WIRE_END};

static const wire_check followup_responses[] = {
    {-1, "store", "true"},
    {0, "previous_response_id", NULL},
    {1, "previous_response_id", "'resp_fake_1'"},
    {1, "input",
     "[{'type':'function_call_output','call_id':'call_f','output':"
     "'echo:a'}]"},
    /* the next run chains from the last answer of the first */
    {2, "previous_response_id", "'resp_fake_2'"},
    {2, "input", "[{'type':'message','role':'user','content':'And now?'}]"},
    WIRE_END};

static const wire_check followup_anthropic[] = {
    {-1, "thinking", "{'type':'enabled','budget_tokens':2048}"},
    {2, "messages",
     "[{'role':'user','content':[{'type':'text','text':'question'}]},"
     "{'role':'assistant','content':["
     "{'type':'thinking','thinking':'Need the echo.','signature':"
     "'c2lnLUE='},"
     "{'type':'tool_use','id':'call_f','name':'echo','input':"
     "{'text':'a'}}]},"
     "{'role':'user','content':[{'type':'tool_result','tool_use_id':"
     "'call_f','content':'echo:a'}]},"
     "{'role':'assistant','content':["
     "{'type':'thinking','thinking':'Got it.','signature':'c2lnLUI='},"
     "{'type':'text','text':'It is a.'}]},"
     "{'role':'user','content':[{'type':'text','text':'And now?'}]}]"},
    WIRE_END};

static const wire_check followup_gemini[] = {
    {2, "contents",
     "[{'role':'user','parts':[{'text':'question'}]},"
     "{'role':'model','parts':[{'functionCall':{'name':'echo','args':"
     "{'text':'a'},'id':'call_f'},'thoughtSignature':'dGhvdWdodC1B'}]},"
     "{'role':'user','parts':[{'functionResponse':{'name':'echo',"
     "'response':{'result':'echo:a'},'id':'call_f'}}]},"
     "{'role':'model','parts':[{'text':'It is a.','thoughtSignature':"
     "'dGhvdWdodC1C'}]},"
     "{'role':'user','parts':[{'text':'And now?'}]}]"},
    WIRE_END};

static const scenario sc_followup = {
    .name = "a conversation that goes on",
    .script =
        "{'responses':["
        "{'reasoning':['Need the echo.'],'signature':'c2lnLUE=',"
        "'thought_signature':'dGhvdWdodC1B','tool_calls':[{'id':'call_f',"
        "'name':'echo','arguments':'{\\'text\\':\\'a\\'}'}]},"
        "{'reasoning':['Got it.'],'signature':'c2lnLUI=','thought_signature':"
        "'dGhvdWdodC1C','text':['It is a.']},"
        "{'reasoning':['Same.'],'signature':'c2lnLUM=','text':['Still a.']}]}",
    .followup = "And now?",
    .max_iterations = 5,
    .thinking_budget = 2048,
    .reasoning_effort = "high",
    .chain_responses = 1,
    .requests = 3,
    .text = "Still a.",
    .finish_reason = "stop",
    .events =
        "[{'type':'run.started','index':0,'agent':null,'model':"
        "'fake/fake-model','max_iterations':5,'tools':2},"
        "{'type':'reasoning.delta','index':0,'delta':'Need the echo.'},"
        "{'type':'tool_calls','index':0,'calls':["
        "{'id':'#0.1','name':'echo','arguments':{'text':'a'},"
        "'text_offset':0}]},"
        "{'type':'tool.started','index':0,'id':'#0.1','name':'echo',"
        "'arguments':{'text':'a'}},"
        "{'type':'tool.completed','index':0,'id':'#0.1','name':'echo','output':"
        "'echo:a','truncated':false,'output_size':6},"
        "{'type':'reasoning.delta','index':1,'delta':'Got it.'},"
        "{'type':'message.delta','index':1,'delta':'It is a.'},"
        "{'type':'run.completed','index':1,'status':'completed','text':"
        "'It is a.','iterations':2,'finish_reason':'stop','usage':[0,0,0,0]},"
        "{'type':'run.started','index':0,'agent':null,'model':"
        "'fake/fake-model','max_iterations':5,'tools':2},"
        "{'type':'reasoning.delta','index':0,'delta':'Same.'},"
        "{'type':'message.delta','index':0,'delta':'Still a.'},"
        "{'type':'run.completed','index':0,'status':'completed','text':"
        "'Still a.','iterations':1,'finish_reason':'stop','usage':[0,0,0,0]}]",
    .wire = {followup_openai, followup_responses, followup_anthropic,
             followup_gemini}};

/*
 * (7) The iteration limit, then the conversation goes on. The limit note
 * belongs to the one call it was made for: the next run must not see it
 * (it is not among the stored messages), and a chained Responses
 * conversation must not carry it on through previous_response_id either,
 * so the limited call is neither chained nor stored, and the next run,
 * finding the last answer unstored, sends the whole conversation.
 */
static const wire_check limit_followup_openai[] = {
    {2, "messages.6", "{'role':'system','content':'" LIMIT_NOTE(3) "'}"},
    {3, "messages",
     "[{'role':'system','content':'Be brief.'},"
     "{'role':'user','content':'question'},"
     "{'role':'assistant','content':null,'tool_calls':[{'id':"
     "'call_fake_1','type':'function','function':{'name':'echo',"
     "'arguments':'{\\'text\\':\\'1\\'}'}}]},"
     "{'role':'tool','tool_call_id':'call_fake_1','content':'echo:1'},"
     "{'role':'assistant','content':'Again.','tool_calls':[{'id':"
     "'call_fake_1','type':'function','function':{'name':'echo',"
     "'arguments':'{\\'text\\':\\'2\\'}'}}]},"
     "{'role':'tool','tool_call_id':'call_fake_1','content':'echo:2'},"
     "{'role':'assistant','content':'Found 1 and 2.'},"
     "{'role':'user','content':'And now?'}]"},
    {3, "tool_choice", "'auto'"},
    WIRE_END};

static const wire_check limit_followup_responses[] = {
    {0, "store", "true"},
    {1, "store", "true"},
    {1, "previous_response_id", "'resp_fake_1'"},
    /* the limited call: the whole conversation and the note, unstored */
    {2, "store", "false"},
    {2, "previous_response_id", NULL},
    {2, "tool_choice", "'none'"},
    {2, "input",
     "[{'type':'message','role':'user','content':'question'},"
     "{'type':'function_call','id':'fc_fake_1_1','call_id':'call_fake_1',"
     "'name':'echo','arguments':'{\\'text\\':\\'1\\'}'},"
     "{'type':'function_call_output','call_id':'call_fake_1','output':"
     "'echo:1'},"
     "{'type':'message','id':'msg_fake_2','role':'assistant','status':"
     "'completed','content':[{'type':'output_text','text':'Again.',"
     "'annotations':[]}]},"
     "{'type':'function_call','id':'fc_fake_2_1','call_id':'call_fake_1',"
     "'name':'echo','arguments':'{\\'text\\':\\'2\\'}'},"
     "{'type':'function_call_output','call_id':'call_fake_1','output':"
     "'echo:2'},"
     "{'type':'message','role':'developer','content':'" LIMIT_NOTE(3) "'}]"},
    /* the next run: nothing to chain from (the last answer was not
     * stored), so everything but the note */
    {3, "store", "true"},
    {3, "previous_response_id", NULL},
    {3, "tool_choice", "'auto'"},
    {3, "input",
     "[{'type':'message','role':'user','content':'question'},"
     "{'type':'function_call','id':'fc_fake_1_1','call_id':'call_fake_1',"
     "'name':'echo','arguments':'{\\'text\\':\\'1\\'}'},"
     "{'type':'function_call_output','call_id':'call_fake_1','output':"
     "'echo:1'},"
     "{'type':'message','id':'msg_fake_2','role':'assistant','status':"
     "'completed','content':[{'type':'output_text','text':'Again.',"
     "'annotations':[]}]},"
     "{'type':'function_call','id':'fc_fake_2_1','call_id':'call_fake_1',"
     "'name':'echo','arguments':'{\\'text\\':\\'2\\'}'},"
     "{'type':'function_call_output','call_id':'call_fake_1','output':"
     "'echo:2'},"
     "{'type':'message','id':'msg_fake_3','role':'assistant','status':"
     "'completed','content':[{'type':'output_text','text':"
     "'Found 1 and 2.','annotations':[]}]},"
     "{'type':'message','role':'user','content':'And now?'}]"},
    WIRE_END};

static const wire_check limit_followup_anthropic[] = {
    {2, "tool_choice", "{'type':'none'}"},
    {3, "tool_choice", "{'type':'auto'}"},
    {3, "messages.4",
     "{'role':'user','content':[{'type':'tool_result','tool_use_id':"
     "'toolu_fake_1','content':'echo:2'}]}"},
    {3, "messages.5",
     "{'role':'assistant','content':[{'type':'text','text':"
     "'Found 1 and 2.'}]}"},
    {3, "messages.6",
     "{'role':'user','content':[{'type':'text','text':'And now?'}]}"},
    {3, "messages.7", NULL},
    WIRE_END};

static const wire_check limit_followup_gemini[] = {
    {2, "systemInstruction",
     "{'parts':[{'text':'Be brief.'},{'text':'" LIMIT_NOTE(3) "'}]}"},
    {3, "systemInstruction", "{'parts':[{'text':'Be brief.'}]}"},
    {3, "toolConfig", NULL},
    WIRE_END};

static const scenario sc_limit_followup = {
    .name = "iteration limit, then the conversation goes on",
    .script =
        "{'responses':["
        "{'tool_calls':[{'name':'echo','arguments':'{\\'text\\':\\'1\\'}'}]},"
        "{'text':['Again.'],'tool_calls':[{'name':'echo','arguments':"
        "'{\\'text\\':\\'2\\'}'}]},"
        "{'text':['Found 1 and 2.']},"
        "{'text':['Nothing more.']}]}",
    .followup = "And now?",
    .max_iterations = 3,
    .chain_responses = 1,
    .requests = 4,
    .text = "Nothing more.",
    .finish_reason = "stop",
    .events =
        "[{'type':'run.started','index':0,'agent':null,'model':"
        "'fake/fake-model','max_iterations':3,'tools':2},"
        "{'type':'tool_calls','index':0,'calls':["
        "{'id':'#0.1','name':'echo','arguments':{'text':'1'},"
        "'text_offset':0}]},"
        "{'type':'tool.started','index':0,'id':'#0.1','name':'echo',"
        "'arguments':{'text':'1'}},"
        "{'type':'tool.completed','index':0,'id':'#0.1','name':'echo','output':"
        "'echo:1','truncated':false,'output_size':6},"
        "{'type':'message.delta','index':1,'delta':'Again.'},"
        "{'type':'tool_calls','index':1,'calls':["
        "{'id':'#1.1','name':'echo','arguments':{'text':'2'},"
        "'text_offset':6}]},"
        "{'type':'tool.started','index':1,'id':'#1.1','name':'echo',"
        "'arguments':{'text':'2'}},"
        "{'type':'tool.completed','index':1,'id':'#1.1','name':'echo','output':"
        "'echo:2','truncated':false,'output_size':6},"
        "{'type':'message.delta','index':2,'delta':'Found 1 and 2.'},"
        "{'type':'run.completed','index':2,'status':'completed','text':"
        "'Found 1 and 2.','iterations':3,'finish_reason':'stop','usage':"
        "[0,0,0,0]},"
        "{'type':'run.started','index':0,'agent':null,'model':"
        "'fake/fake-model','max_iterations':3,'tools':2},"
        "{'type':'message.delta','index':0,'delta':'Nothing more.'},"
        "{'type':'run.completed','index':0,'status':'completed','text':"
        "'Nothing more.','iterations':1,'finish_reason':'stop','usage':"
        "[0,0,0,0]}]",
    .wire = {limit_followup_openai, limit_followup_responses,
             limit_followup_anthropic, limit_followup_gemini}};

/* ---- the test ---------------------------------------------------------- */

static void dump(const char *what, const json_t *v)
{
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);

    fprintf(stderr, "%s: %s\n", what, s ? s : "(null)");
    free(s);
}

static void run_on_all(const scenario *s)
{
    json_t *want = qjson(s->events), *first_msgs = NULL;

    for (int a = 0; a < NADAPTERS; a++) {
        harness h;
        json_t *reqs;
        char what[256];

        harness_start(&h, s, a);
        run_turn(&h, s, a, "question");
        if (s->followup)
            run_turn(&h, s, a, s->followup);
        reqs = fake_requests(h.fake);
        if (verbose()) {
            fprintf(stderr, "== %s on %s\n", s->name, adapters[a].kind);
            dump("events", h.all_events);
            dump("messages", h.all_messages);
            for (size_t r = 0; r < json_array_size(reqs); r++)
                dump("request",
                     json_object_get(json_array_get(reqs, r), "body"));
        }
        assert_string_equal(loom_run_text(h.run), s->text);
        assert_string_equal(loom_run_finish_reason(h.run), s->finish_reason);
        assert_int_equal(json_array_size(reqs), (size_t)s->requests);
        assert_int_equal(h.iterations, s->requests);
        snprintf(what, sizeof(what), "%s on %s: events", s->name,
                 adapters[a].kind);
        assert_json_equal(what, h.all_events, want);
        /* The conversation the runs built is the same whoever answered. */
        snprintf(what, sizeof(what), "%s on %s: messages", s->name,
                 adapters[a].kind);
        if (!first_msgs)
            first_msgs = json_incref(h.all_messages);
        else
            assert_json_equal(what, h.all_messages, first_msgs);
        assert_int_equal(h.usage.reasoning_tokens,
                         a == ANTHROPIC ? 0 : s->reasoning_tokens);
        check_wire(s, a, reqs);
        json_decref(reqs);
        harness_free(&h);
    }
    json_decref(first_msgs);
    json_decref(want);
}

static void test_scenario(void **state)
{
    run_on_all(*state);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        {"tool_loop", test_scenario, NULL, NULL, (void *)&sc_tool_loop},
        {"tool_error", test_scenario, NULL, NULL, (void *)&sc_tool_error},
        {"reasoning", test_scenario, NULL, NULL, (void *)&sc_reasoning},
        {"limit", test_scenario, NULL, NULL, (void *)&sc_limit},
        {"limit_ignored", test_scenario, NULL, NULL, (void *)&sc_limit_ignored},
        {"followup", test_scenario, NULL, NULL, (void *)&sc_followup},
        {"limit_followup", test_scenario, NULL, NULL,
         (void *)&sc_limit_followup},
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
