/*
 * loom-bench research: what a whole research run (docs/research.md) costs
 * loom itself, against the fake upstream with zero delay: 8 supervisor
 * cycles, each sending 5 researchers out in parallel, each researcher
 * making 3 rounds of web_search before writing its report (see
 * bench/README.md, "A research run").
 *
 * loom-fake-upstream runs as another process and answers by rules: the
 * plan, each cycle K ("Research cycle K of") asking for 5 research_agent
 * calls on tasks "topic-K-J", each researcher (matched by its task) 3
 * searches with queries of its own then its report citing [1], and the
 * final report; the searches themselves (SearXNG's JSON API, GETs no rule
 * matches) take the fake's plain answer, one result each. The cycle limit
 * (8) then has the report written: 1 + 8 + 40 x 4 + 1 = 170 model calls
 * and 120 searches per run, one turn of a session made from a YAML
 * config, with no store.
 *
 * Figures per run: loom's CPU time (getrusage of this process, user +
 * system, all threads: the fake's time is in its own process), wall time
 * and the fake's busy time; the process's peak RSS once the runs are
 * done; with --memory (the loom-bench-mem build, bench_mem.c) each run's
 * peak heap above what was live before it, instead.
 *
 * Every run is checked: it completes, its report was written because of
 * the cycle limit after 8 cycles and 40 researchers with none failed, the
 * report is the scripted one, and in timed runs the fake saw exactly the
 * expected requests. A run off script stops the benchmark.
 */
#include "bench.h"
#include "loom/config.h"
#include "loom/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

int loom_bench_research_main(int argc, char **argv);

#define CYCLES 8
#define RESEARCHERS 5
#define ROUNDS 3
#define MODEL_CALLS (1 + CYCLES + CYCLES * RESEARCHERS * (ROUNDS + 1) + 1)
#define SEARCHES (CYCLES * RESEARCHERS * ROUNDS)
#define DEFAULT_RUNS 20
#define DEFAULT_WARMUP 2
#define REPORT "The topics agree [1]."
#define SEARCH_ANSWER                                                          \
    "{\"results\":[{\"url\":\"https://topic.example.org/page\","               \
    "\"title\":\"About the topic\",\"content\":\"Facts.\"}]}"

typedef bench_flags res_opts;

typedef struct {
    loom_config *cfg;
    loom_session *s;
    json_t *kept; /* the last run.completed's data */
} res_bench;

/* ---- the script and the config ---- */

static json_t *rule(const char *field, const char *value, json_t *responses)
{
    return json_pack("{s:{s:s},s:b,s:o}", "match", field, value, "loop", 1,
                     "responses", responses);
}

/* Researcher K-J's rule: ROUNDS searches, then its report. */
static json_t *researcher_rule(int k, int j)
{
    json_t *resps = json_array(), *r;
    char task[32];

    snprintf(task, sizeof(task), "topic-%d-%d", k, j);
    for (int i = 1; i <= ROUNDS; i++) {
        char args[64], id[32];

        snprintf(args, sizeof(args), "{\"query\":\"%s q%d\"}", task, i);
        snprintf(id, sizeof(id), "call_s%d", i);
        json_array_append_new(
            resps, json_pack("{s:[{s:s,s:s,s:s}]}", "tool_calls", "id", id,
                             "name", "web_search", "arguments", args));
    }
    json_array_append_new(resps, json_pack("{s:[s]}", "text", "Found it [1]."));
    r = json_pack("{s:{s:s,s:s},s:b,s:o}", "match", "system",
                  "You are a researcher", "first_user", task, "loop", 1,
                  "responses", resps);
    return r;
}

/* Cycle k's rule: RESEARCHERS research_agent calls at once. */
static json_t *cycle_rule(int k)
{
    json_t *calls = json_array();
    char match[48];

    for (int j = 1; j <= RESEARCHERS; j++) {
        char id[32], args[48];

        snprintf(id, sizeof(id), "call_r%d_%d", k, j);
        snprintf(args, sizeof(args), "{\"task\":\"topic-%d-%d\"}", k, j);
        json_array_append_new(calls,
                              json_pack("{s:s,s:s,s:s}", "id", id, "name",
                                        "research_agent", "arguments", args));
    }
    snprintf(match, sizeof(match), "Research cycle %d of", k);
    return rule("system", match, json_pack("[{s:o}]", "tool_calls", calls));
}

/* The fake's script. Caller frees; NULL when out of memory. */
static char *make_script(void)
{
    json_t *rules = json_array(), *root;
    char *s;

    /* Later phases first: their requests hold the earlier ones' text. */
    json_array_append_new(rules, rule("system", "Write the final report now",
                                      json_pack("[{s:[s]}]", "text", REPORT)));
    for (int k = CYCLES; k >= 1; k--)
        json_array_append_new(rules, cycle_rule(k));
    json_array_append_new(rules,
                          rule("system", "Write the research plan",
                               json_pack("[{s:[s]}]", "text",
                                         "1. Each topic\n2. What they share")));
    for (int k = 1; k <= CYCLES; k++)
        for (int j = 1; j <= RESEARCHERS; j++)
            json_array_append_new(rules, researcher_rule(k, j));
    root = json_pack("{s:o,s:b,s:[{s:s}]}", "rules", rules, "loop", 1,
                     "responses", "body", SEARCH_ANSWER);
    s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}

/* The session's config: the fake as an OpenAI provider (and SearXNG), no
 * retries, the research section. */
static char *make_config(int port)
{
    char *yaml = NULL;

    if (asprintf(&yaml,
                 "providers:\n"
                 "  fake:\n"
                 "    kind: openai\n"
                 "    base_url: http://127.0.0.1:%d/v1\n"
                 "    api_key: sk-bench\n"
                 "    retries: {max: 0}\n"
                 "routing: {retries: 0}\n"
                 "models:\n"
                 "  fake/fake-model: {context_window: 128000}\n"
                 "tools:\n"
                 "  web_search: {backend: searxng, base_url: "
                 "\"http://127.0.0.1:%d\"}\n"
                 "research:\n"
                 "  max_cycles: %d\n"
                 "  max_parallel_researchers: %d\n"
                 "  researcher_max_searches: %d\n"
                 "  clarify: false\n",
                 port, port, CYCLES, RESEARCHERS, ROUNDS) < 0)
        return NULL;
    return yaml;
}

/* ---- the run under test ---- */

static int keep_completed(const loom_event *ev, void *payload)
{
    res_bench *b = payload;

    if (ev->type == LOOM_EV_RUN_COMPLETED && loom_event_depth(ev) == 0) {
        json_decref(b->kept);
        b->kept = json_incref(ev->data);
    }
    return 0;
}

/* Whether the run went as scripted. 1, or 0 with a message. */
static int run_ok(const res_bench *b, const loom_run *run)
{
    const json_t *r = json_object_get(b->kept, "research");
    const char *reason =
        json_string_value(json_object_get(b->kept, "report_reason"));

    if (!r || !reason || strcmp(reason, "cycle_limit") != 0 ||
        json_integer_value(json_object_get(r, "cycles")) != CYCLES ||
        json_integer_value(json_object_get(r, "researchers")) !=
            CYCLES * RESEARCHERS ||
        json_integer_value(json_object_get(r, "failed")) != 0) {
        char *s = b->kept ? json_dumps(b->kept, JSON_COMPACT) : NULL;
        fprintf(stderr, "loom-bench research: run off script: %s\n",
                s ? s : "no run.completed");
        free(s);
        return 0;
    }
    if (strncmp(loom_run_text(run), REPORT, strlen(REPORT)) != 0) {
        fprintf(stderr, "loom-bench research: report off script: %.200s\n",
                loom_run_text(run));
        return 0;
    }
    return 1;
}

/* One research turn, checked. 0 when it went as scripted. */
static int run_once(void *arg)
{
    res_bench *b = arg;
    loom_turn_options o = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    const loom_run *run;
    loom_turn *t = NULL;
    int rc;

    rc = loom_messages_add(&in, LOOM_ROLE_USER,
                           "What do the forty topics share?");
    o.agent = LOOM_RESEARCH_AGENT;
    o.input = &in;
    o.sink.emit = keep_completed;
    o.sink.payload = b;
    json_decref(b->kept);
    b->kept = NULL;
    if (rc == 0)
        rc = loom_turn_new(&t, b->s, &o);
    loom_messages_free(&in);
    if (rc == 0)
        rc = loom_turn_execute(t);
    run = t ? loom_turn_run(t) : NULL;
    if (rc != 0 || !run) {
        fprintf(stderr, "loom-bench research: turn failed: %s\n",
                run && *loom_run_error(run) ? loom_run_error(run)
                                            : loom_error_last());
        rc = -1;
    } else if (!run_ok(b, run)) {
        rc = -1;
    }
    loom_turn_free(t);
    return rc;
}

static int res_open(res_bench *b, int port)
{
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    char *yaml = make_config(port);
    int rc = -1;

    if (!yaml)
        return -1;
    if (loom_config_load_string(&b->cfg, yaml, "research.yaml") == 0) {
        so.config = b->cfg;
        so.default_model = "fake/fake-model";
        rc = loom_session_new(&b->s, &so);
    }
    if (rc != 0)
        fprintf(stderr, "loom-bench research: setup: %s\n", loom_error_last());
    free(yaml);
    return rc;
}

/* ---- options and figures ---- */

static void usage(FILE *to)
{
    fprintf(to,
            "usage: loom-bench research [--runs N] [--warmup N] [--fake "
            "PATH]\n"
            "                           [--json] [--memory] "
            "[--iterations-only]\n"
            "                           [--print-script]\n"
            "  a research run: %d cycles x %d researchers x %d search "
            "rounds\n"
            "  --runs N           measured runs (default %d)\n"
            "  --warmup N         unmeasured runs first (default %d)\n"
            "  --fake PATH        loom-fake-upstream (default: next to this\n"
            "                     binary, or $LOOM_FAKE_BIN)\n"
            "  --json             print the figures as one JSON object\n"
            "  --memory           each run's peak heap (loom-bench-mem "
            "only)\n"
            "  --iterations-only  no clock, no stats: for callgrind\n"
            "  --print-script     print the fake's script and exit\n",
            CYCLES, RESEARCHERS, ROUNDS, DEFAULT_RUNS, DEFAULT_WARMUP);
}

/* This process's CPU time so far (user + system, all threads), in µs. */
static double cpu_us(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

/* The process's peak resident set so far, in KiB. */
static long maxrss_kib(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* Prints j as one line (and frees it). */
static void put_json(json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;

    if (s)
        puts(s);
    free(s);
    json_decref(j);
}

/* Runs with heap accounting: each run's peak heap above what was live
 * before it. 0, or -1. */
static int measure_memory(res_bench *b, const res_opts *o)
{
    size_t n = (size_t)o->runs;
    double *peak = calloc(n, sizeof(double));
    long start = bench_mem_live();
    bench_summary s;

    if (!peak)
        return -1;
    if (bench_measure_memory(o->runs, run_once, b, peak) != 0) {
        free(peak);
        return -1;
    }
    s = bench_summarize(peak, n);
    if (o->json)
        put_json(json_pack("{s:s,s:I,s:o,s:I}", "mode", "research", "runs",
                           (json_int_t)o->runs, "heap_peak_bytes_per_run",
                           bench_summary_json(s), "heap_left_bytes",
                           (json_int_t)(bench_mem_live() - start)));
    else
        printf("research: %ld runs; peak heap per run above what was live "
               "before it: p50 %.0f bytes, max %.0f; left after all runs: "
               "%ld bytes\n",
               o->runs, s.p50, s.max, bench_mem_live() - start);
    free(peak);
    return 0;
}

/* Timed runs: CPU, wall and the fake's busy time of each, checked
 * against the requests the fake saw. 0, or -1. */
static int measure(res_bench *b, const res_opts *o, const bench_fake *fake,
                   long rss_before)
{
    size_t n = (size_t)o->runs;
    double *cpu = calloc(n, sizeof(double)), *wall = calloc(n, sizeof(double)),
           *busy = calloc(n, sizeof(double));
    bench_summary s_cpu, s_wall, s_busy;
    int rc = -1;

    if (!cpu || !wall || !busy)
        goto done;
    if (bench_measure("research", fake->port, o->runs, MODEL_CALLS + SEARCHES,
                      run_once, b, cpu_us, wall, cpu, busy) != 0)
        goto done;
    s_cpu = bench_summarize(cpu, n);
    s_wall = bench_summarize(wall, n);
    s_busy = bench_summarize(busy, n);
    if (o->json) {
        put_json(json_pack(
            "{s:s,s:s,s:s,s:I,s:I,s:i,s:i,s:i,s:i,s:i,s:o,s:o,s:o,s:f,s:I,"
            "s:I}",
            "name", "loom", "mode", "research", "version", loom_version(),
            "runs", (json_int_t)o->runs, "warmup", (json_int_t)o->warmup,
            "cycles", CYCLES, "researchers", CYCLES * RESEARCHERS, "rounds",
            ROUNDS, "model_calls_per_run", MODEL_CALLS, "searches_per_run",
            SEARCHES, "cpu_us_per_run", bench_summary_json(s_cpu),
            "wall_us_per_run", bench_summary_json(s_wall),
            "fake_busy_us_per_run", bench_summary_json(s_busy),
            "cpu_us_per_model_call", s_cpu.mean / MODEL_CALLS,
            "maxrss_kib_before", (json_int_t)rss_before, "maxrss_kib",
            (json_int_t)maxrss_kib()));
    } else {
        printf("loom %s, research: %ld runs after %ld warm-up; %d cycles x "
               "%d researchers x %d rounds = %d model calls and %d "
               "searches per run\n",
               loom_version(), o->runs, o->warmup, CYCLES, RESEARCHERS, ROUNDS,
               MODEL_CALLS, SEARCHES);
        printf("loom CPU per run (user + system, all threads): p50 %.1f ms, "
               "mean %.1f ms, max %.1f ms (%.1f µs per model call)\n",
               s_cpu.p50 / 1000, s_cpu.mean / 1000, s_cpu.max / 1000,
               s_cpu.mean / MODEL_CALLS);
        printf("wall per run p50 %.1f ms; the fake's busy time per run p50 "
               "%.1f ms\n",
               s_wall.p50 / 1000, s_busy.p50 / 1000);
        printf("peak RSS of the process: %ld KiB (%ld KiB before the "
               "first run)\n",
               maxrss_kib(), rss_before);
    }
    rc = 0;
done:
    free(cpu);
    free(wall);
    free(busy);
    return rc;
}

int loom_bench_research_main(int argc, char **argv)
{
    res_opts o;
    res_bench b;
    bench_fake fake = {.pid = -1};
    char *bin = NULL, *script = NULL;
    int rc = 1,
        pa = bench_parse_args(&o, "research", DEFAULT_RUNS, DEFAULT_WARMUP,
                              argc, argv, usage, NULL, NULL);
    long rss_before;

    if (pa != 0)
        return pa > 0 ? 0 : 2;
    memset(&b, 0, sizeof(b));
    if (!(script = make_script()))
        return 1;
    if (o.print_script) {
        puts(script);
        free(script);
        return 0;
    }
    if (!(bin = bench_find_fake(o.fake_bin))) {
        fprintf(stderr, "loom-bench research: loom-fake-upstream not found; "
                        "pass --fake PATH\n");
        free(script);
        return 2;
    }
    if (bench_fake_start(&fake, bin, script) != 0 ||
        curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK ||
        res_open(&b, fake.port) != 0)
        goto done;
    rss_before = maxrss_kib();
    if (bench_repeat(o.warmup, run_once, &b) != 0)
        goto done;
    if (o.memory) {
        if (!bench_mem_enabled())
            fprintf(stderr, "loom-bench research: --memory needs the "
                            "loom-bench-mem build\n");
        else
            rc = measure_memory(&b, &o) == 0 ? 0 : 1;
    } else if (o.iterations_only) {
        rc = bench_repeat(o.runs, run_once, &b) == 0 ? 0 : 1;
        if (rc == 0)
            printf("%ld runs, %d model calls each\n", o.runs, MODEL_CALLS);
    } else {
        rc = measure(&b, &o, &fake, rss_before) == 0 ? 0 : 1;
    }
done:
    json_decref(b.kept);
    loom_session_free(b.s);
    loom_config_free(b.cfg);
    bench_fake_stop(&fake);
    free(script);
    free(bin);
    curl_global_cleanup();
    return rc;
}
