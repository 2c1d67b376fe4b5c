/*
 * Research runs (docs/research.md) through the session layer: the
 * supervisor and its researchers talk to loom-fake-upstream, whose script
 * rules answer each request by what it holds (the supervisor's phase
 * notes, a researcher's task), and the researchers search a fake SearXNG
 * on 127.0.0.1 that answers each query with its own page. Scenarios:
 * three researchers in parallel with one failing, a free think_tool, the
 * citations renumbered and checked against the sources really found;
 * the cycle limit; a supervisor that calls no tool in cycle 1; the
 * budget; a clarifying question and the resumed research; a reasoning
 * model (4 cycles, no think_tool); a window below min_context_tokens;
 * citations of a fetched page kept and of an unseen one removed; the
 * time limit reached during a slow researcher.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fake.h"
#include "loom/session.h"
#include "testutil.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the fake SearXNG: one result per query, at a page of its own, and
 * /page.html, an HTML page to fetch ---------------------------------------- */

static enum MHD_Result on_search(void *cls, struct MHD_Connection *c,
                                 const char *url, const char *method,
                                 const char *version, const char *upload_data,
                                 size_t *upload_size, void **con_cls)
{
    const char *q = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "q");
    struct MHD_Response *resp;
    enum MHD_Result r;
    char *body = NULL;

    (void)cls;
    (void)method;
    (void)version;
    (void)upload_data;
    (void)upload_size;
    (void)con_cls;
    if (strcmp(url, "/page.html") == 0) {
        static const char page[] = "<html><head><title>Local page</title>"
                                   "</head><body><p>Local facts.</p>"
                                   "</body></html>";
        resp = MHD_create_response_from_buffer(strlen(page), (void *)page,
                                               MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(resp, "Content-Type", "text/html");
        r = MHD_queue_response(c, 200, resp);
        MHD_destroy_response(resp);
        return r;
    }
    if (asprintf(&body,
                 "{\"results\":[{\"url\":\"https://%s.example.org/page\","
                 "\"title\":\"About %s\",\"content\":\"Facts on %s.\"}]}",
                 q ? q : "none", q ? q : "none", q ? q : "none") < 0)
        return MHD_NO;
    resp = MHD_create_response_from_buffer(strlen(body), body,
                                           MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", "application/json");
    r = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return r;
}

static struct MHD_Daemon *search_start(int *port)
{
    struct sockaddr_in sin;
    const union MHD_DaemonInfo *info;
    struct MHD_Daemon *d;

    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION |
                             MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO,
                         0, NULL, NULL, on_search, NULL, MHD_OPTION_SOCK_ADDR,
                         &sin, MHD_OPTION_END);
    assert_non_null(d);
    info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    assert_non_null(info);
    *port = info->port;
    return d;
}

/* ---- fixtures ------------------------------------------------------------ */

typedef struct {
    loom_fake *fake;
    struct MHD_Daemon *search;
    loom_config *cfg;
    loom_session *s;
    json_t *events;
} fx;

/* A copy of s with every "PORT" replaced by port. */
static char *with_port(const char *s, int port)
{
    char *out = NULL, num[16];
    size_t n = 0, len = strlen(s);
    const char *p;

    snprintf(num, sizeof(num), "%d", port);
    for (p = s; (p = strstr(p, "PORT")) != NULL; p += 4)
        n++;
    out = malloc(len + n * strlen(num) + 1);
    assert_non_null(out);
    out[0] = '\0';
    for (p = s;;) {
        const char *q = strstr(p, "PORT");
        if (!q) {
            strcat(out, p);
            break;
        }
        strncat(out, p, (size_t)(q - p));
        strcat(out, num);
        p = q + 4;
    }
    return out;
}

/* A session over the fake (prices $1/$2 per million tokens), web_search
 * on the fake SearXNG, and `extra` YAML (a research section, models). In
 * the script and extra, PORT is the fake SearXNG's port. */
static void fx_open(fx *f, const char *script, const char *extra)
{
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    char *yaml = NULL, *sc, *ex;
    int port = 0;

    memset(f, 0, sizeof(*f));
    f->search = search_start(&port);
    sc = with_port(script, port);
    ex = with_port(extra ? extra
                         : "models:\n"
                           "  fake/m:\n"
                           "    context_window: 128000\n"
                           "    prices: {input: 1, output: 2}\n",
                   port);
    f->fake = fake_start_script(sc);
    assert_non_null(f->fake);
    free(sc);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake:\n"
                         "    kind: openai\n"
                         "    base_url: %s\n"
                         "    api_key: k\n"
                         "    retries: {max: 0}\n"
                         "routing: {retries: 0}\n"
                         "tools:\n"
                         "  web_search:\n"
                         "    backend: searxng\n"
                         "    base_url: http://127.0.0.1:%d\n"
                         "%s",
                         fake_base_url(f->fake), port, ex) > 0);
    free(ex);
    if (loom_config_load_string(&f->cfg, yaml, "t.yaml") != 0)
        print_error("config: %s\n", loom_error_last());
    assert_non_null(f->cfg);
    free(yaml);
    so.config = f->cfg;
    so.default_model = "fake/m";
    if (loom_session_new(&f->s, &so) != 0)
        print_error("session: %s\n", loom_error_last());
    assert_non_null(f->s);
    f->events = json_array();
}

static void fx_close(fx *f)
{
    loom_session_free(f->s);
    loom_config_free(f->cfg);
    fake_stop(f->fake);
    MHD_stop_daemon(f->search);
    json_decref(f->events);
}

static int keep_event(const loom_event *ev, void *payload)
{
    json_array_append_new(payload, loom_event_to_json(ev));
    return 0;
}

/* Runs deep_research on text (after history, may be NULL) with the
 * research overrides (JSON text, may be NULL); loom_turn_execute's
 * answer. */
static int research(fx *f, const loom_messages *history, const char *text,
                    const char *overrides, loom_turn **out)
{
    loom_turn_options o = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    json_t *ov = overrides ? json_loads(overrides, 0, NULL) : NULL;
    int rc;

    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, text), 0);
    o.agent = "deep_research";
    o.input = &in;
    o.history = history;
    o.research = ov;
    o.sink = (loom_sink){keep_event, f->events};
    json_array_clear(f->events);
    if (loom_turn_new(out, f->s, &o) != 0)
        print_error("turn: %s\n", loom_error_last());
    assert_non_null(*out);
    loom_messages_free(&in);
    json_decref(ov);
    rc = loom_turn_execute(*out);
    return rc;
}

/* The research run's own events (researchers' come nested, with
 * parent_run_id). */
static int top_of(const json_t *e, const char *type)
{
    return !json_object_get(e, "parent_run_id") &&
           strcmp(json_string_value(json_object_get(e, "type")), type) == 0;
}

static const json_t *last_event(const json_t *events, const char *type)
{
    const json_t *found = NULL;
    size_t i;
    json_t *e;

    json_array_foreach(events, i, e)
    {
        if (top_of(e, type))
            found = e;
    }
    return found;
}

static size_t count_events(const json_t *events, const char *type)
{
    size_t i, n = 0;
    json_t *e;

    json_array_foreach(events, i, e)
    {
        n += (size_t)top_of(e, type);
    }
    return n;
}

static const char *completed_str(const json_t *events, const char *key)
{
    return json_string_value(
        json_object_get(last_event(events, "run.completed"), key));
}

static json_int_t research_int(const json_t *events, const char *key)
{
    return json_integer_value(json_object_get(
        json_object_get(last_event(events, "run.completed"), "research"), key));
}

/* Nested events of type for a tool (the researchers' calls). */
static size_t nested(const json_t *events, const char *type, const char *tool)
{
    size_t i, n = 0;
    json_t *e;

    json_array_foreach(events, i, e)
    {
        const char *t = json_string_value(json_object_get(e, "type"));
        const char *name = json_string_value(json_object_get(e, "name"));
        n += json_object_get(e, "parent_run_id") && strcmp(t, type) == 0 &&
             name && strcmp(name, tool) == 0;
    }
    return n;
}

/* Requests to the fake whose body holds needle. */
static size_t requests_holding(const loom_fake *fk, const char *needle)
{
    json_t *reqs = fake_requests(fk);
    size_t i, n = 0;
    json_t *r;

    json_array_foreach(reqs, i, r)
    {
        char *body = json_dumps(json_object_get(r, "body"), JSON_COMPACT);
        n += body && strstr(body, needle);
        free(body);
    }
    json_decref(reqs);
    return n;
}

/* ---- scripts ------------------------------------------------------------ */

/* Rules: the supervisor's later phases first (their requests hold the
 * earlier phases' notes too), then the plan, then the researchers. */
#define R_REPORT(text)                                                         \
    "{\"match\":{\"system\":\"Write the final report now\"},"                  \
    "\"responses\":[{\"text\":[\"" text "\"]}]}"
#define R_PLAN                                                                 \
    "{\"match\":{\"system\":\"Write the research plan\"},"                     \
    "\"responses\":[{\"text\":[\"1. A 2. B 3. C\"]}]}"
#define R_RESEARCHER(task, text)                                               \
    "{\"match\":{\"system\":\"You are a researcher\",\"first_user\":\"" task   \
    "\"},\"responses\":["                                                      \
    "{\"tool_calls\":[{\"name\":\"web_search\",\"arguments\":"                 \
    "\"{\\\"query\\\":\\\"" task "\\\"}\"}]},"                                 \
    "{\"text\":[\"" text "\"]}]}"
#define CALL_RESEARCH(id, task)                                                \
    "{\"id\":\"" id "\",\"name\":\"research_agent\",\"arguments\":"            \
    "\"{\\\"task\\\":\\\"" task "\\\"}\"}"
#define CALL_REPORT "{\"name\":\"generate_report\",\"arguments\":\"{}\"}"

static const char three_script[] = "{\"rules\":[" R_REPORT(
    "Alpha holds [1] and beta too [2]; also "
    "[9].") ","
            "{\"match\":{\"system\":"
            "\"Research cycle 2 of\"},"
            "\"responses\":[{\"tool_"
            "calls\":[" CALL_REPORT "]}]},"
            "{\"match\":{\"system\":"
            "\"Research cycle 1 "
            "of\"},\"responses\":["
            "{\"tool_calls\":[{\"name\":"
            "\"think_tool\","
            "\"arguments\":"
            "\"{\\\"thought\\\":"
            "\\\"three tasks at "
            "once\\\"}\"}]},"
            "{\"tool_calls\":"
            "[" CALL_RESEARCH(
                "ra",
                "alp"
                "ha") "," CALL_RESEARCH("rb",
                                        "beta") "," CALL_RESEARCH("rc",
                                                                  "gamma") "],"
                                                                           "\"i"
                                                                           "nte"
                                                                           "rle"
                                                                           "ave"
                                                                           "\""
                                                                           ":tr"
                                                                           "ue}"
                                                                           "]}"
                                                                           "," R_PLAN
                                                                           "," R_RESEARCHER("alpha", "Alpha is so [1].") "," R_RESEARCHER(
                                                                               "beta",
                                                                               "Beta is "
                                                                               "so [1].") ","
                                                                                          "{\"match\":{\"first_user\":\"gamma\"},\"loop\":true,"
                                                                                          "\"responses\":[{\"status\":500,\"error\":{\"message\":\"gamma broke\"}}]}"
                                                                                          "]}";

static void test_three_researchers_one_failing(void **state)
{
    fx f;
    loom_turn *t = NULL;
    const json_t *branch, *done;
    const char *text;
    size_t i;
    json_t *e;
    int saw_thought = 0;

    (void)state;
    fx_open(&f, three_script, NULL);
    assert_int_equal(research(&f, NULL, "Compare alpha, beta, gamma",
                              "{\"clarify\":false}", &t),
                     0);
    done = last_event(f.events, "run.completed");
    assert_non_null(done);
    assert_string_equal(completed_str(f.events, "report_reason"), "requested");
    /* think_tool cost no cycle: the research, then the report. */
    assert_int_equal(research_int(f.events, "cycles"), 2);
    assert_int_equal(research_int(f.events, "researchers"), 3);
    assert_int_equal(research_int(f.events, "failed"), 1);
    branch = last_event(f.events, "research.branch");
    assert_non_null(branch);
    assert_int_equal(json_integer_value(json_object_get(branch, "researchers")),
                     3);
    assert_non_null(last_event(f.events, "research.plan"));
    assert_int_equal(count_events(f.events, "research.cycle"), 3);
    json_array_foreach(f.events, i, e)
    {
        const char *d = json_string_value(json_object_get(e, "delta"));
        if (d && strstr(d, "three tasks at once") &&
            strcmp(json_string_value(json_object_get(e, "type")),
                   "reasoning.delta") == 0)
            saw_thought = 1;
    }
    assert_true(saw_thought);
    /* The failing researcher is a failed call and a note. */
    assert_non_null(last_event(f.events, "tool.failed"));
    text = loom_run_text(loom_turn_run(t));
    assert_non_null(strstr(text, "A researcher failed on \"gamma\""));
    /* Citations: alpha's source is [1], beta's [2]; [9] named none. */
    assert_non_null(strstr(text, "Alpha holds [1] and beta too [2]"));
    assert_null(strstr(text, "[9]"));
    assert_int_equal(
        json_integer_value(json_object_get(done, "citations_dropped")), 1);
    assert_non_null(strstr(text, "## Sources"));
    assert_non_null(
        strstr(text, "[1] About alpha - https://alpha.example.org/page"));
    assert_non_null(
        strstr(text, "[2] About beta - https://beta.example.org/page"));
    assert_int_equal(count_events(f.events, "citation"), 2);
    /* The researchers' events come nested in the run's stream. */
    assert_true(nested(f.events, "tool.completed", "web_search") >= 2);
    /* The supervisor read beta's report in the run's numbering. */
    assert_true(requests_holding(f.fake, "Beta is so [2].") > 0);
    assert_true(requests_holding(f.fake, "Alpha is so [1].") > 0);
    loom_turn_free(t);
    fx_close(&f);
}

static const char loop_script[] = "{\"rules\":[" R_REPORT(
    "Done [1].") ","
                 "{\"match\":{\"system\":\"Research cycle\"},\"loop\":true,"
                 "\"responses\":[{\"tool_calls\":[" CALL_RESEARCH(
                     "r", "alpha") "]}]}," R_PLAN ","
                                   "{\"match\":{\"system\":\"You are a "
                                   "researcher\"},\"loop\":true,"
                                   "\"responses\":[{\"text\":[\"Nothing "
                                   "found.\"],\"usage\":"
                                   "{\"prompt_tokens\":400,\"completion_"
                                   "tokens\":100,\"total_tokens\":500}"
                                   "}]}"
                                   "]}";

static void test_cycle_limit(void **state)
{
    fx f;
    loom_turn *t = NULL;

    (void)state;
    fx_open(&f, loop_script, NULL);
    assert_int_equal(
        research(&f, NULL, "q", "{\"clarify\":false,\"max_cycles\":2}", &t), 0);
    assert_string_equal(completed_str(f.events, "report_reason"),
                        "cycle_limit");
    assert_int_equal(research_int(f.events, "cycles"), 2);
    assert_int_equal(research_int(f.events, "researchers"), 2);
    loom_turn_free(t);
    fx_close(&f);
}

static void test_budget(void **state)
{
    fx f;
    loom_turn *t = NULL;

    (void)state;
    fx_open(&f, loop_script, NULL);
    /* The first researcher spends 500 tokens: a second would pass 800. */
    assert_int_equal(research(&f, NULL, "q",
                              "{\"clarify\":false,\"max_tokens\":800,"
                              "\"report_max_tokens\":100}",
                              &t),
                     0);
    assert_string_equal(completed_str(f.events, "report_reason"), "budget");
    assert_int_equal(research_int(f.events, "researchers"), 1);
    loom_turn_free(t);
    fx_close(&f);
}

static const char silent_script[] =
    "{\"rules\":["
    "{\"match\":{\"system\":\"Research cycle\"},\"loop\":true,"
    "\"responses\":[{\"text\":[\"I know the answer.\"]}]}," R_PLAN "]}";

static void test_no_tool_calls_in_cycle_one(void **state)
{
    fx f;
    loom_turn *t = NULL;

    (void)state;
    fx_open(&f, silent_script, NULL);
    assert_int_not_equal(research(&f, NULL, "q", "{\"clarify\":false}", &t), 0);
    assert_int_equal(loom_turn_status(t), LOOM_RUN_FAILED);
    assert_non_null(strstr(loom_run_error(loom_turn_run(t)),
                           "called no tool in its first cycle"));
    /* The plan, the cycle and its one retry. */
    assert_int_equal(count_events(f.events, "research.cycle"), 2);
    loom_turn_free(t);
    fx_close(&f);
}

static const char clarify_script[] = "{\"rules\":[" R_REPORT(
    "France it is [1].") ","
                         "{\"match\":{\"system\":\"Research cycle 2 of\"},"
                         "\"responses\":[{\"tool_calls\":[" CALL_REPORT "]}]},"
                         "{\"match\":{\"system\":\"Research cycle 1 "
                         "of\"},\"responses\":["
                         "{\"tool_calls\":[" CALL_RESEARCH(
                             "r", "france") "]}]}," R_PLAN ","
                                            "{\"match\":{\"system\":\"too "
                                            "ambiguous\"},"
                                            "\"responses\":[{\"text\":[\"Which "
                                            "country?\"]}]}," R_RESEARCHER(
                                                "france",
                                                "France is so [1].") "]}";

static void test_clarification_then_resume(void **state)
{
    fx f;
    loom_turn *t = NULL;
    loom_messages history = {0};
    const char *text;

    (void)state;
    fx_open(&f, clarify_script, NULL);
    assert_int_equal(research(&f, NULL, "Best tax rules?", NULL, &t), 0);
    assert_string_equal(completed_str(f.events, "status"), "needs_input");
    assert_string_equal(loom_run_text(loom_turn_run(t)), "Which country?");
    assert_null(last_event(f.events, "research.plan"));
    loom_turn_free(t);
    /* The answer resumes it: no second question. */
    assert_int_equal(
        loom_messages_add(&history, LOOM_ROLE_USER, "Best tax rules?"), 0);
    assert_int_equal(
        loom_messages_add(&history, LOOM_ROLE_ASSISTANT, "Which country?"), 0);
    assert_int_equal(research(&f, &history, "France", NULL, &t), 0);
    assert_string_equal(completed_str(f.events, "status"), "completed");
    text = loom_run_text(loom_turn_run(t));
    assert_non_null(strstr(text, "France it is [1]."));
    assert_non_null(strstr(text, "https://france.example.org/page"));
    loom_messages_free(&history);
    loom_turn_free(t);
    fx_close(&f);
}

/* A reasoning model: no think_tool offered (the rule matches only the
 * two tools), 4 cycles. */
static const char reasoning_script[] = "{\"rules\":[" R_REPORT(
    "Done.") ","
             "{\"match\":{\"system\":\"Research cycle\",\"tools\":"
             "[\"research_agent\",\"generate_report\"]},\"loop\":true,"
             "\"responses\":[{\"tool_calls\":[" CALL_RESEARCH(
                 "r",
                 "alpha") "]}]}," R_PLAN ","
                          "{\"match\":{\"system\":\"You are a "
                          "researcher\"},\"loop\":true,"
                          "\"responses\":[{\"text\":[\"Nothing found.\"]}]}"
                          "]}";

static void test_reasoning_model(void **state)
{
    fx f;
    loom_turn *t = NULL;

    (void)state;
    fx_open(&f, reasoning_script,
            "models:\n"
            "  fake/m:\n"
            "    context_window: 128000\n"
            "    capabilities: {reasoning: true}\n");
    assert_int_equal(research(&f, NULL, "q", "{\"clarify\":false}", &t), 0);
    assert_string_equal(completed_str(f.events, "report_reason"),
                        "cycle_limit");
    assert_int_equal(research_int(f.events, "max_cycles"), 4);
    assert_int_equal(research_int(f.events, "cycles"), 4);
    loom_turn_free(t);
    fx_close(&f);
}

static void test_small_window_refused(void **state)
{
    fx f;
    loom_turn_options o = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    loom_turn *t = NULL;

    (void)state;
    fx_open(&f, silent_script,
            "models:\n"
            "  fake/m:\n"
            "    context_window: 8000\n");
    assert_int_equal(loom_messages_add(&in, LOOM_ROLE_USER, "q"), 0);
    o.agent = "deep_research";
    o.input = &in;
    assert_int_equal(loom_turn_new(&t, f.s, &o), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "at least 50000 tokens"));
    assert_non_null(strstr(loom_error_last(), "this one has 8000"));
    assert_null(t);
    loom_messages_free(&in);
    fx_close(&f);
}

/* The researcher answers after 1.2 s, past the 1 s time limit: the next
 * cycle's start writes the report instead. */
static const char slow_script[] = "{\"rules\":[" R_REPORT(
    "In time [1].") ","
                    "{\"match\":{\"system\":\"Research cycle\"},\"loop\":true,"
                    "\"responses\":[{\"tool_calls\":[" CALL_RESEARCH(
                        "r", "slow") "]}]}," R_PLAN ","
                                     "{\"match\":{\"system\":\"You are a "
                                     "researcher\"},\"loop\":true,"
                                     "\"responses\":[{\"text\":[\"Slow "
                                     "facts.\"],\"delay_ms\":1200}]}]}";

static void test_time_limit(void **state)
{
    fx f;
    loom_turn *t = NULL;

    (void)state;
    fx_open(&f, slow_script, NULL);
    assert_int_equal(
        research(&f, NULL, "q", "{\"clarify\":false,\"time_limit_s\":1}", &t),
        0);
    assert_string_equal(completed_str(f.events, "report_reason"), "time_limit");
    assert_int_equal(research_int(f.events, "cycles"), 1);
    assert_int_equal(research_int(f.events, "researchers"), 1);
    assert_non_null(strstr(loom_run_text(loom_turn_run(t)), "In time"));
    loom_turn_free(t);
    fx_close(&f);
}

/* The researcher writes a little, then its model call hangs past the
 * research_agent call's timeout (the supervisor's tool_timeout_ms). */
static const char stuck_script[] = "{\"rules\":[" R_REPORT(
    "Nothing [1].") ","
                    "{\"match\":{\"system\":\"Research cycle 2 of\"},"
                    "\"responses\":[{\"tool_calls\":[" CALL_REPORT "]}]},"
                    "{\"match\":{\"system\":\"Research cycle 1 "
                    "of\"},\"responses\":["
                    "{\"tool_calls\":[" CALL_RESEARCH(
                        "r",
                        "stuck") "]}]}," R_PLAN ","
                                 "{\"match\":{\"system\":\"You are a "
                                 "researcher\"},\"responses\":["
                                 "{\"text\":[\"half a report\"],\"hang\":true,"
                                 "\"hang_after_chunks\":2}]}]}";

/* A researcher past its timeout is stopped like any sub-agent, not
 * abandoned: the failed call carries its partial report, its run ends
 * in the stream and its request is closed. */
static void test_researcher_timeout_grace(void **state)
{
    fx f;
    loom_turn *t = NULL;
    const json_t *failed;
    json_t *st;
    const char *err, *out;
    size_t i, ended = 0;
    json_t *e;

    (void)state;
    fx_open(&f, stuck_script,
            "agents:\n"
            "  deep_research: {model: fake/m, research: true, "
            "tool_timeout_ms: 1000}\n"
            "models:\n"
            "  fake/m:\n"
            "    context_window: 128000\n");
    assert_int_equal(research(&f, NULL, "q", "{\"clarify\":false}", &t), 0);
    failed = last_event(f.events, "tool.failed");
    assert_non_null(failed);
    err = json_string_value(json_object_get(failed, "error"));
    out = json_string_value(json_object_get(failed, "output"));
    assert_non_null(strstr(err, "timeout of 1000 ms and was stopped"));
    assert_non_null(strstr(out, "Partial answer: half a report"));
    /* The researcher's own end is in the stream. */
    json_array_foreach(f.events, i, e)
    {
        ended += json_object_get(e, "parent_run_id") &&
                 !strcmp(json_string_value(json_object_get(e, "type")),
                         "run.failed");
    }
    assert_int_equal(ended, 1);
    assert_int_equal(research_int(f.events, "failed"), 1);
    st = fake_stats(f.fake);
    assert_int_equal(json_integer_value(json_object_get(st, "hanging")), 0);
    json_decref(st);
    loom_turn_free(t);
    fx_close(&f);
}

/* A researcher fetches a page (allowed by web_fetch's allow_hosts): the
 * report's [1] names it; its [2] names nothing the run saw, so it is
 * removed, whatever URL the text writes beside it. */
static const char fetch_script[] = "{\"rules\":[" R_REPORT(
    "Fetched facts [1]; see also "
    "https://unseen.example.org/x "
    "[2].") ","
            "{\"match\":{\"system\":"
            "\"Research cycle 2 of\"},"
            "\"responses\":[{\"tool_"
            "calls\":[" CALL_REPORT "]}]},"
            "{\"match\":{\"system\":"
            "\"Research cycle 1 "
            "of\"},\"responses\":["
            "{\"tool_calls\":"
            "[" CALL_RESEARCH("r", "page") "]}]}," R_PLAN ","
                                           "{\"match\":{"
                                           "\"system\":"
                                           "\"You are a "
                                           "researcher\"}"
                                           ",\"responses"
                                           "\":["
                                           "{\"tool_"
                                           "calls\":[{"
                                           "\"name\":"
                                           "\"web_"
                                           "fetch\","
                                           "\"arguments\""
                                           ":"
                                           "\"{"
                                           "\\\"url\\\":"
                                           "\\\"http://"
                                           "127.0.0.1:"
                                           "PORT/"
                                           "page."
                                           "html\\\"}\"}]"
                                           "},"
                                           "{\"text\":["
                                           "\"Local "
                                           "facts [1]; "
                                           "unseen "
                                           "[2].\"]}]}]}";

static void test_citations_fetched_or_nothing(void **state)
{
    fx f;
    loom_turn *t = NULL;
    const json_t *c;
    const char *text;

    (void)state;
    fx_open(&f, fetch_script,
            "  web_fetch:\n"
            "    allow_hosts: [\"127.0.0.1:PORT\"]\n"
            "models:\n"
            "  fake/m:\n"
            "    context_window: 128000\n");
    assert_int_equal(research(&f, NULL, "q", "{\"clarify\":false}", &t), 0);
    text = loom_run_text(loom_turn_run(t));
    assert_non_null(strstr(text, "Fetched facts [1]; see also "
                                 "https://unseen.example.org/x."));
    assert_non_null(strstr(text, "\n[1] Local page - http://127.0.0.1:"));
    assert_null(strstr(text, "[2]"));
    assert_int_equal(
        json_integer_value(json_object_get(
            last_event(f.events, "run.completed"), "citations_dropped")),
        1);
    assert_int_equal(count_events(f.events, "citation"), 1);
    c = last_event(f.events, "citation");
    assert_string_equal(json_string_value(json_object_get(c, "title")),
                        "Local page");
    /* Which researcher found it: its task. */
    assert_string_equal(json_string_value(json_object_get(c, "researcher")),
                        "page");
    assert_non_null(
        strstr(json_string_value(json_object_get(c, "url")), "/page.html"));
    /* The supervisor read the researcher's report with [2] removed. */
    assert_true(requests_holding(f.fake, "Local facts [1]; unseen.") > 0);
    loom_turn_free(t);
    fx_close(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_three_researchers_one_failing),
        cmocka_unit_test(test_cycle_limit),
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_no_tool_calls_in_cycle_one),
        cmocka_unit_test(test_clarification_then_resume),
        cmocka_unit_test(test_reasoning_model),
        cmocka_unit_test(test_small_window_refused),
        cmocka_unit_test(test_citations_fetched_or_nothing),
        cmocka_unit_test(test_time_limit),
        cmocka_unit_test(test_researcher_timeout_grace),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
