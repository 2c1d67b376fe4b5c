/*
 * A research run resumes after kill -9 (docs/research.md "Resuming after
 * a stop"): `loom serve` runs as a child process on a SQLite file; a
 * research run (background by default) sends two researchers out in
 * cycle 1; once the first has finished and the second's model call
 * hangs in the fake, the server is killed with SIGKILL and started
 * again on the same file. The run must complete without the finished
 * researcher, the plan or cycle 1 being asked of the model again (the
 * fake's record counts the requests), its event ids must go on from
 * the stored ones without a gap or a repeat (also for a client that
 * reconnects with Last-Event-ID), and the report must cite the sources
 * of both researchers. The conversation's stored usage rows add up to
 * the run's usage (the supervisor's calls from before the kill included,
 * the call the kill cut short counting as nothing). A run whose budget
 * the calls before the kill nearly spent keeps it after the restart: no
 * more researchers, the report written from what exists.
 */
#include "test_server_harness.h"

#include <sqlite3.h>

/* A researcher's requests hold its task as their user message. */
#define ALPHA "\"content\":\"alpha topic\""
#define BETA "\"content\":\"beta topic\""
#define GAMMA "\"content\":\"gamma topic\""

/* A response's usage: prompt, completion and total tokens. */
#define USAGE(p, c, t)                                                         \
    "\"usage\":{\"prompt_tokens\":" #p ",\"completion_tokens\":" #c            \
    ",\"total_tokens\":" #t "}"

/* The supervisor's phases by the note of each call (later calls hold
 * earlier notes too: the newest note's rule comes first), with the
 * usage of each (SUP: the plan and cycle 1, CYCLE2, REPORT); the
 * researchers by their task (each call RES); the search backend
 * (SearXNG JSON) as the plain responses. beta's second call hangs until
 * the kill; after the restart it searches again and reports. Cycle 2
 * calls CYCLE2_CALL: generate_report, or a third researcher, gamma. */
#define SCRIPT(SUP, CYCLE2_CALL, CYCLE2, REPORT, RES)                          \
    "{\"rules\":["                                                             \
    "{\"match\":{\"system\":\"Write the final report now\"},\"loop\":true,"    \
    " \"responses\":[{\"text\":[\"Alpha holds [1]. Beta holds [2].\"]," REPORT \
    "}]},"                                                                     \
    "{\"match\":{\"system\":\"Research cycle 3 of\"},\"loop\":true,"           \
    " \"responses\":[{\"tool_calls\":[{\"name\":\"generate_report\","          \
    "  \"arguments\":\"{}\"}]," SUP "}]},"                                     \
    "{\"match\":{\"system\":\"Research cycle 2 of\"},\"loop\":true,"           \
    " \"responses\":[{\"tool_calls\":[" CYCLE2_CALL "]," CYCLE2 "}]},"         \
    "{\"match\":{\"system\":\"Research cycle 1 of\"},\"loop\":true,"           \
    " \"responses\":[{\"tool_calls\":["                                        \
    "  {\"id\":\"ra\",\"name\":\"research_agent\","                            \
    "   \"arguments\":\"{\\\"task\\\":\\\"alpha topic\\\"}\"},"                \
    "  {\"id\":\"rb\",\"name\":\"research_agent\","                            \
    "   \"arguments\":\"{\\\"task\\\":\\\"beta topic\\\"}\"}]," SUP "}]},"     \
    "{\"match\":{\"system\":\"Write the research plan\"},\"loop\":true,"       \
    " \"responses\":[{\"text\":[\"1. Alpha 2. Beta\"]," SUP "}]},"             \
    "{\"match\":{\"system\":\"You are a researcher\","                         \
    "  \"first_user\":\"alpha topic\"},"                                       \
    " \"responses\":[{\"tool_calls\":[{\"name\":\"web_search\","               \
    "  \"arguments\":\"{\\\"query\\\":\\\"alpha\\\"}\"}]," RES "},"            \
    "  {\"text\":[\"Alpha is so [1].\"]," RES "}]},"                           \
    "{\"match\":{\"system\":\"You are a researcher\","                         \
    "  \"first_user\":\"beta topic\"},"                                        \
    " \"responses\":[{\"tool_calls\":[{\"name\":\"web_search\","               \
    "  \"arguments\":\"{\\\"query\\\":\\\"beta\\\"}\"}]," RES "},"             \
    "  {\"hang\":true},"                                                       \
    "  {\"tool_calls\":[{\"name\":\"web_search\","                             \
    "  \"arguments\":\"{\\\"query\\\":\\\"beta\\\"}\"}]," RES "},"             \
    "  {\"text\":[\"Beta is so [2].\"]," RES "}]},"                            \
    "{\"match\":{\"system\":\"You are a researcher\","                         \
    "  \"first_user\":\"gamma topic\"},\"loop\":true,"                         \
    " \"responses\":[{\"text\":[\"Gamma is so.\"]," RES "}]}],"                \
    "\"loop\":true,\"responses\":[{\"body\":\"{\\\"results\\\":["              \
    "{\\\"url\\\":\\\"https://alpha.example.org/a\\\",\\\"title\\\":"          \
    "\\\"About alpha\\\",\\\"content\\\":\\\"A.\\\"},"                         \
    "{\\\"url\\\":\\\"https://beta.example.org/b\\\",\\\"title\\\":"           \
    "\\\"About beta\\\",\\\"content\\\":\\\"B.\\\"}]}\"}]}"

#define REPORT_CALL "{\"name\":\"generate_report\",\"arguments\":\"{}\"}"
#define GAMMA_CALL                                                             \
    "{\"id\":\"rc\",\"name\":\"research_agent\","                              \
    "\"arguments\":\"{\\\"task\\\":\\\"gamma topic\\\"}\"}"

/* Supervisor calls of 110 tokens, researchers' of 55: 4 supervisor
 * calls, alpha's 2 and beta's 2 after the restart make 660 (beta's first
 * call before the kill is not counted: its researcher runs again). */
static const char script[] =
    SCRIPT(USAGE(100, 10, 110), REPORT_CALL, USAGE(100, 10, 110),
           USAGE(100, 10, 110), USAGE(50, 5, 55));
#define SCRIPT_TOKENS 660

/* Under a run budget of 20000 tokens: the plan and cycle 1 spend 1000
 * each, each researcher's call 1000, so cycle 2 starts at 6000; it
 * spends 12400 and asks for gamma, whose 2000 (the most a researcher
 * spent) would pass the budget: the report is written, its output cut
 * to what is left of the budget (1600 minus its prompt, about 1100
 * tokens). Were the 4000 spent before the kill forgotten, the report's
 * output would not be cut. */
static const char budget_script[] =
    SCRIPT(USAGE(900, 100, 1000), GAMMA_CALL, USAGE(11400, 1000, 12400),
           USAGE(90, 10, 100), USAGE(900, 100, 1000));
#define BUDGET_TOKENS 20000
#define REPORT_MAX 1000

/* Recorded model requests whose last message contains needle. */
static size_t last_with(const loom_fake *f, const char *needle)
{
    json_t *reqs = fake_requests(f), *q;
    size_t i, n = 0;

    json_array_foreach(reqs, i, q)
    {
        const json_t *msgs =
            json_object_get(json_object_get(q, "body"), "messages");
        const char *c = json_string_value(json_object_get(
            json_array_get(msgs, json_array_size(msgs) - 1), "content"));
        n += c && strstr(c, needle) != NULL;
    }
    json_decref(reqs);
    return n;
}

/* Whether the run's events hold the top run's tool.completed of call. */
static int call_done(const json_t *run, const char *call)
{
    const json_t *e;
    size_t i;

    json_array_foreach(json_object_get(run, "events"), i, e)
    {
        if (!strcmp(sh_str(e, "type"), "tool.completed") &&
            !json_object_get(e, "parent_run_id") && sh_str(e, "id") &&
            !strcmp(sh_str(e, "id"), call))
            return 1;
    }
    return 0;
}

/* Polls the run until researcher ra has ended and rb's call hangs in the
 * fake; returns the run (with its events). */
static json_t *wait_mid_cycle(const sh *h, const loom_fake *f, const char *path)
{
    long long end = test_now_ms() + 60000;

    for (;;) {
        json_t *run = sh_json(h, "GET", path, NULL, 200), *st = fake_stats(f);
        int hanging = (int)json_integer_value(json_object_get(st, "hanging"));
        json_decref(st);
        if (call_done(run, "ra") && hanging == 1)
            return run;
        json_decref(run);
        if (test_now_ms() > end)
            fail_msg("the run never reached the middle of cycle 1");
        usleep(20 * 1000);
    }
}

/* The researcher entry of task in a run's research status. */
static const json_t *researcher(const json_t *run, const char *task)
{
    const json_t *r;
    size_t i;

    json_array_foreach(
        json_object_get(json_object_get(run, "research"), "researchers"), i, r)
    {
        if (!strcmp(sh_str(r, "task"), task))
            return r;
    }
    return NULL;
}

/* Writes the server's config (the fake's model priced at $1 and $2 per
 * million input and output tokens) as *cfg_path, its store *db (files
 * named after name). */
static void write_config(const loom_fake *fake, const char *name,
                         char **cfg_path, char **db)
{
    char *yaml = NULL, file[64];

    snprintf(file, sizeof(file), "%s.yaml", name);
    *cfg_path = test_tmp_path(file);
    snprintf(file, sizeof(file), "%s.db", name);
    *db = test_tmp_path(file);
    unlink(*db);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake: {base_url: '%s', api_key: k, "
                         "retries: {max: 0}}\n"
                         "routing: {retries: 0}\n"
                         "models:\n"
                         "  fake/m: {context_window: 128000, "
                         "prices: {input: 1, output: 2}}\n"
                         "tools:\n"
                         "  web_search: {backend: searxng, base_url: '%s'}\n"
                         "agents:\n"
                         "  deep_research: {model: fake/m, research: true}\n"
                         "  deep_research_researcher:\n"
                         "    model: fake/m\n"
                         "    system_prompt: You are a researcher.\n"
                         "    tools: [web_search, web_fetch]\n"
                         "    citations: true\n"
                         "server:\n"
                         "  listen: 127.0.0.1:0\n"
                         "  db: '%s'\n",
                         fake_base_url(fake), fake_base_url(fake), *db) > 0);
    assert_int_equal(test_write_file(*cfg_path, yaml, strlen(yaml)), 0);
    free(yaml);
}

/* A server that runs a research run and is killed. */
typedef struct {
    sh h;
    sh_child ch;
    loom_fake *fake;
    char *cfg_path, *db;
    char id[64], conv[64]; /* the run's ids */
    json_t *before;        /* the run before the kill, with its events */
} killed;

/*
 * Starts the fake with rules (a script) and loom serve (files named after
 * name), posts body (a research run of user ann), waits for the middle of cycle
 * 1 (alpha done, beta's call hanging), kills the server with SIGKILL and
 * starts it again; returns the run once it has ended, with its events.
 * sh_serve_end(&k->ch, k->fake, k->cfg_path, k->db) ends it.
 */
static json_t *kill_and_resume(killed *k, const char *rules, const char *name,
                               const char *body)
{
    sh_child *ch = &k->ch;
    sh *h = &k->h;
    json_t *run, **before = &k->before;
    const json_t *rs;
    char path[160], *id = k->id, *conv = k->conv;

    memset(k, 0, sizeof(*k));
    k->fake = fake_start_script(rules);
    assert_non_null(k->fake);
    write_config(k->fake, name, &k->cfg_path, &k->db);
    sh_serve(ch, h, k->cfg_path);
    /* Background by default: the run's id comes back at once. */
    run = sh_json(h, "POST", "/v1/runs", body, 202);
    assert_true(json_is_true(json_object_get(run, "background")));
    snprintf(id, 64, "%s", sh_str(run, "id"));
    snprintf(conv, 64, "%s", sh_str(run, "conversation_id"));
    json_decref(run);
    snprintf(path, sizeof(path), "/v1/runs/%s?events=true&user=ann", id);

    *before = wait_mid_cycle(h, k->fake, path);
    /* Where the run is: cycle 1 of 8, alpha done, beta running. */
    rs = json_object_get(*before, "research");
    assert_string_equal(sh_str(rs, "phase"), "research");
    assert_int_equal(json_integer_value(json_object_get(rs, "cycle")), 1);
    assert_int_equal(json_integer_value(json_object_get(rs, "max_cycles")), 8);
    assert_string_equal(sh_str(researcher(*before, "alpha topic"), "status"),
                        "completed");
    assert_int_equal(json_integer_value(json_object_get(
                         researcher(*before, "alpha topic"), "sources")),
                     2);
    assert_string_equal(sh_str(researcher(*before, "beta topic"), "status"),
                        "running");
    assert_int_equal(fake_requests_with(k->fake, ALPHA), 2);
    assert_int_equal(fake_requests_with(k->fake, BETA), 2);

    kill(ch->pid, SIGKILL);
    assert_int_equal(sh_reap(ch, 20000), 128 + SIGKILL);

    /* Started again on the same file, the run resumes by itself. */
    sh_serve(ch, h, k->cfg_path);
    run = sh_wait_run(h, id, 60000);
    json_decref(run);
    run = sh_json(h, "GET", path, NULL, 200);
    assert_string_equal(sh_str(run, "status"), "completed");
    rs = json_object_get(run, "research");
    assert_string_equal(sh_str(rs, "phase"), "done");
    assert_true(json_is_true(json_object_get(rs, "resumed")));
    return run;
}

/* The field of the run's own run.completed in its events. */
static const json_t *completed_field(const json_t *run, const char *key)
{
    const json_t *e;
    size_t i;

    json_array_foreach(json_object_get(run, "events"), i, e)
    {
        if (!strcmp(sh_str(e, "type"), "run.completed") &&
            !json_object_get(e, "parent_run_id"))
            return json_object_get(e, key);
    }
    return NULL;
}

/* What the usage rows of conversation conv in the store db add up to. */
static void stored_rows(const char *db, const char *conv, long long *tokens,
                        long long *micros)
{
    sqlite3 *sq = NULL;
    sqlite3_stmt *st = NULL;

    assert_int_equal(sqlite3_open_v2(db, &sq, SQLITE_OPEN_READONLY, NULL),
                     SQLITE_OK);
    assert_int_equal(
        sqlite3_prepare_v2(sq,
                           "SELECT sum(total_tokens), sum(cost_micros) FROM "
                           "usage WHERE conversation_id = ?1",
                           -1, &st, NULL),
        SQLITE_OK);
    sqlite3_bind_text(st, 1, conv, -1, SQLITE_STATIC);
    assert_int_equal(sqlite3_step(st), SQLITE_ROW);
    *tokens = sqlite3_column_int64(st, 0);
    *micros = sqlite3_column_int64(st, 1);
    sqlite3_finalize(st);
    sqlite3_close(sq);
}

static void test_kill9_mid_cycle_resumes(void **state)
{
    char path[160];
    json_t *run, *evs, *e, *conv_row;
    const json_t *u, *row;
    size_t nbefore, i, cites = 0;
    long long rows_tokens = 0, rows_micros = 0;
    int seen_alpha = 0, seen_beta = 0;
    struct curl_slist *hdrs = NULL;
    sh_resp r;
    killed k;

    (void)state;
    run = kill_and_resume(
        &k, script, "resume",
        "{\"agent\":\"deep_research\",\"input\":\"Alpha and beta?\","
        "\"user\":\"ann\",\"research\":{\"clarify\":false}}");
    assert_string_equal(sh_str(researcher(run, "beta topic"), "status"),
                        "completed");

    /* Nothing finished was asked again: the plan, cycle 1 and researcher
     * alpha once each; beta ran again (search and report). */
    assert_int_equal(last_with(k.fake, "Write the research plan"), 1);
    assert_int_equal(last_with(k.fake, "Research cycle 1 of"), 1);
    assert_int_equal(last_with(k.fake, "Research cycle 2 of"), 1);
    assert_int_equal(fake_requests_with(k.fake, ALPHA), 2);

    /* Event ids: 1..N, the ones from before the kill unchanged. */
    evs = json_object_get(run, "events");
    nbefore = json_array_size(json_object_get(k.before, "events"));
    assert_true(json_array_size(evs) > nbefore);
    json_array_foreach(evs, i, e)
    {
        const json_t *b =
            json_array_get(json_object_get(k.before, "events"), i);
        assert_int_equal(json_integer_value(json_object_get(e, "seq")),
                         (json_int_t)i + 1);
        if (b)
            assert_true(json_equal(e, (json_t *)b));
        if (!strcmp(sh_str(e, "type"), "citation") &&
            !json_object_get(e, "parent_run_id")) {
            const char *who = sh_str(e, "researcher");
            cites++;
            seen_alpha |= who && !strcmp(who, "alpha topic");
            seen_beta |= who && !strcmp(who, "beta topic");
        }
    }
    assert_int_equal(cites, 2);
    assert_true(seen_alpha && seen_beta);
    assert_non_null(strstr(sh_str(run, "text"), "https://alpha.example.org/a"));
    assert_non_null(strstr(sh_str(run, "text"), "https://beta.example.org/b"));

    /* A client that saw the events up to the kill gets the rest. */
    snprintf(path, sizeof(path), "Last-Event-ID: %zu", nbefore);
    hdrs = curl_slist_append(NULL, path);
    snprintf(path, sizeof(path), "/v1/runs/%s/events", k.id);
    assert_int_equal(sh_req(&k.h, "GET", path, NULL, hdrs, &r), 200);
    curl_slist_free_all(hdrs);
    evs = sh_sse_parse(r.body, NULL);
    sh_resp_free(&r);
    assert_int_equal(json_array_size(evs),
                     json_array_size(json_object_get(run, "events")) - nbefore);
    json_array_foreach(evs, i, e)
    {
        assert_int_equal(json_integer_value(json_object_get(e, "id")),
                         (json_int_t)(nbefore + i + 1));
    }
    json_decref(evs);

    /* Another user's run is unknown. */
    snprintf(path, sizeof(path), "/v1/runs/%s?user=bob", k.id);
    assert_int_equal(sh_req(&k.h, "GET", path, NULL, NULL, &r), 404);
    sh_resp_free(&r);
    /* The turn is stored in its conversation, with the report. */
    snprintf(path, sizeof(path), "/v1/conversations/%s?user=ann", k.conv);
    conv_row = sh_json(&k.h, "GET", path, NULL, 200);
    assert_string_equal(sh_str(sh_last_message(conv_row), "content"),
                        sh_str(run, "text"));

    /* Usage: every finished call once, the one the kill cut short not at
     * all; the stored rows (as the API shows them and in the store) add
     * up to the run's total, tokens and cost. */
    u = json_object_get(run, "usage");
    assert_int_equal(json_integer_value(json_object_get(u, "total_tokens")),
                     SCRIPT_TOKENS);
    assert_int_equal(json_integer_value(json_object_get(
                         completed_field(run, "usage"), "total_tokens")),
                     SCRIPT_TOKENS);
    json_array_foreach(json_object_get(conv_row, "usage"), i, row)
    {
        rows_tokens += json_integer_value(json_object_get(row, "total_tokens"));
        rows_micros += json_integer_value(json_object_get(row, "cost_micros"));
    }
    assert_int_equal(rows_tokens, SCRIPT_TOKENS);
    assert_int_equal(rows_micros,
                     json_integer_value(json_object_get(u, "cost_micros")));
    assert_true(rows_micros > 0);
    json_decref(conv_row);
    stored_rows(k.db, k.conv, &rows_tokens, &rows_micros);
    assert_int_equal(rows_tokens, SCRIPT_TOKENS);
    assert_int_equal(rows_micros,
                     json_integer_value(json_object_get(u, "cost_micros")));
    json_decref(k.before);
    json_decref(run);

    sh_serve_end(&k.ch, k.fake, k.cfg_path, k.db);
}

/* The output limit of the report's model request. */
static json_int_t report_max_tokens(const loom_fake *f)
{
    json_t *reqs = fake_requests(f), *q;
    json_int_t n = -1;
    size_t i;

    json_array_foreach(reqs, i, q)
    {
        const json_t *body = json_object_get(q, "body");
        char *text = json_dumps(body, JSON_COMPACT);
        if (text && strstr(text, "Write the final report now")) {
            const json_t *m = json_object_get(body, "max_completion_tokens");
            n = json_integer_value(m ? m : json_object_get(body, "max_tokens"));
        }
        free(text);
    }
    json_decref(reqs);
    return n;
}

static void test_kill9_budget_holds(void **state)
{
    json_t *run;
    const json_t *rs;
    json_int_t cut;
    killed k;

    (void)state;
    run = kill_and_resume(
        &k, budget_script, "budget",
        "{\"agent\":\"deep_research\",\"input\":\"Alpha and beta?\","
        "\"user\":\"ann\",\"budget\":{\"max_tokens\":20000},"
        "\"research\":{\"clarify\":false,\"report_max_tokens\":1000}}");

    /* Gamma was refused: the report is written from alpha and beta. */
    assert_string_equal(
        json_string_value(completed_field(run, "report_reason")), "budget");
    rs = completed_field(run, "research");
    assert_int_equal(json_integer_value(json_object_get(rs, "researchers")), 2);
    assert_int_equal(fake_requests_with(k.fake, GAMMA), 0);
    assert_non_null(strstr(sh_str(run, "text"), "Alpha holds"));
    /* The budget went on from what was spent before the kill: the
     * report's output is cut to what is left of it, and the run stays
     * within it. */
    cut = report_max_tokens(k.fake);
    assert_true(cut >= 16 && cut < REPORT_MAX);
    assert_true(
        json_integer_value(json_object_get(json_object_get(run, "usage"),
                                           "total_tokens")) <= BUDGET_TOKENS);
    json_decref(k.before);
    json_decref(run);

    sh_serve_end(&k.ch, k.fake, k.cfg_path, k.db);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill9_mid_cycle_resumes),
        cmocka_unit_test(test_kill9_budget_holds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
