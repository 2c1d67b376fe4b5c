/*
 * loom-bench: loom's own cost per loop iteration, against the fake
 * upstream with zero delay (see bench/README.md for what is measured).
 *
 * It starts loom-fake-upstream with a looping script (--tool-iters
 * answers, 5 by default, that each call the no-op tool `noop` with "{}",
 * then one text answer) and runs that conversation through libloom
 * in-process, exactly as an embedder would: one provider of kind "openai"
 * pointed at the fake, a registry holding `noop`, loom_run_new and
 * loom_run_execute per run, and a sink that only counts events. One run
 * is therefore --tool-iters + 1 model calls. Each run is timed on its
 * own; GET /_fake/stats is read between runs (outside the timed span) to
 * learn how long the fake itself was busy producing the run's answers,
 * and that is subtracted. What is left is loom's own time plus loopback
 * TCP and the fake's HTTP library, which busy_us does not see, so it is
 * an upper bound on loom's cost.
 *
 * --iterations-only skips the stats reads and the clock so that a
 * callgrind run counts nothing but the loop (warm-up included; run it at
 * two run counts and take the difference to cancel start-up costs).
 * --print-script hands the same script to the peers in bench/peers, and
 * --table renders everyone's --json results for bench/run.sh.
 *
 * The bench is not a test: it asserts nothing about speed. It does check
 * that every run went as scripted (status, model calls, final text, and
 * requests seen by the fake) and fails loudly otherwise, so a broken loop
 * can never produce a flattering number.
 */
#include "bench.h"
#include "loom/run.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Subcommands, each in its own bench/ file. */
int loom_bench_context_main(int argc, char **argv);  /* context_bench.c */
int loom_bench_fanout_main(int argc, char **argv);   /* fanout_bench.c */
int loom_bench_research_main(int argc, char **argv); /* research_bench.c */

#define DEFAULT_RUNS 1000
#define DEFAULT_WARMUP 50
#define DEFAULT_TOOL_ITERS 5
#define MAX_TOOL_ITERS 1000L
#define FINAL_TEXT "Done: the no-op tool ran."

typedef struct {
    const char *fake_bin; /* NULL: look next to this binary */
    long runs;
    long warmup;
    long tool_iters;
    int iterations_only;
    int json;
    int print_script;
    int table_from; /* argv index of the first --table file, 0: none */
} bench_opts;

/* ---- the fake upstream ---- */

/*
 * The conversation, as a fake script: tool_iters answers with one call of
 * `noop`, then the final text. Every answer carries usage, so the adapter
 * parses the usage chunk as it would with OpenAI. Caller frees.
 */
static char *make_script(long tool_iters)
{
    json_t *resps = json_array(), *root;
    char *s;
    long i;

    for (i = 0; i < tool_iters; i++) {
        char id[32], args[32];

        /* Arguments differ from call to call: loom does not run a call
         * that repeats an earlier success, and every call must run. */
        snprintf(id, sizeof(id), "call_noop_%ld", i + 1);
        snprintf(args, sizeof(args), "{\"n\":%ld}", i + 1);
        json_array_append_new(
            resps,
            json_pack("{s:[{s:s,s:s,s:s}],s:{s:i,s:i,s:i}}", "tool_calls", "id",
                      id, "name", "noop", "arguments", args, "usage",
                      "prompt_tokens", 40 + 10 * (int)i, "completion_tokens", 5,
                      "total_tokens", 45 + 10 * (int)i));
    }
    json_array_append_new(
        resps, json_pack("{s:[s,s],s:{s:i,s:i,s:i}}", "text", "Done: ",
                         "the no-op tool ran.", "usage", "prompt_tokens",
                         40 + 10 * (int)tool_iters, "completion_tokens", 7,
                         "total_tokens", 47 + 10 * (int)tool_iters));
    root = json_pack("{s:b,s:o}", "loop", 1, "responses", resps);
    s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}

/* ---- the loop under test ---- */

static int noop_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    (void)args;
    (void)ctx;
    (void)payload;
    return loom_buf_puts(out, "ok");
}

/* The minimal sink: counts events, as a server's would at least look. */
static int count_event(const loom_event *ev, void *payload)
{
    unsigned long *counts = payload;

    counts[ev->type]++;
    return 0;
}

typedef struct {
    loom_provider *provider;
    loom_tool_registry *tools;
    loom_messages history;
    unsigned long counts[LOOM_EV__COUNT];
    long calls_per_run;
} bench_loop;

/* One run, checked against the script. 0 when it went as scripted. */
static int run_once(bench_loop *b)
{
    loom_run_options o = LOOM_RUN_OPTIONS_INIT;
    loom_run *run = NULL;
    int rc;

    o.provider = b->provider;
    o.model = "fake/fake-model";
    o.upstream_model = "fake-model";
    o.tools = b->tools;
    o.max_iterations = (int)b->calls_per_run + 1;
    o.sink.emit = count_event;
    o.sink.payload = b->counts;
    rc = loom_run_new(&run, &o, &b->history);
    if (rc == 0)
        rc = loom_run_execute(run);
    if (rc != 0) {
        fprintf(stderr, "loom-bench: run failed: %s\n", loom_error_last());
    } else if (loom_run_iterations(run) != b->calls_per_run ||
               strcmp(loom_run_text(run), FINAL_TEXT) != 0) {
        fprintf(stderr,
                "loom-bench: run went off script: %d model calls (want "
                "%ld), text \"%s\"\n",
                loom_run_iterations(run), b->calls_per_run,
                loom_run_text(run));
        rc = -1;
    } else if (!bench_tool_records_ok(loom_run_tool_records(run),
                                      b->calls_per_run - 1)) {
        rc = -1;
    }
    loom_run_free(run);
    return rc;
}

static int loop_open(bench_loop *b, int port, long tool_iters)
{
    loom_provider_config pc;
    json_t *params;
    loom_tool t;
    char url[64];
    int rc;

    memset(b, 0, sizeof(*b));
    b->calls_per_run = tool_iters + 1;
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1", port);
    memset(&pc, 0, sizeof(pc));
    pc.name = "fake";
    pc.kind = "openai";
    pc.base_url = url;
    pc.api_key = "sk-bench";
    pc.headers = json_object();
    pc.connect_timeout_ms = 5000;
    pc.first_byte_timeout_ms = 30000;
    pc.idle_timeout_ms = 30000;
    pc.max_retries = 0; /* a retry would hide a failure inside a timing */
    pc.retry_base_delay_ms = 100;
    pc.retry_max_delay_ms = 1000;
    rc = loom_provider_new(&b->provider, &pc);
    json_decref(pc.headers);
    if (rc != 0)
        goto fail;
    if ((rc = loom_tool_registry_new(&b->tools)) != 0)
        goto fail;
    params = json_pack("{s:s,s:{s:{s:s}}}", "type", "object", "properties", "n",
                       "type", "integer");
    memset(&t, 0, sizeof(t));
    t.name = "noop";
    t.description = "Does nothing and says ok.";
    t.parameters = params;
    t.execute = noop_exec;
    rc = loom_tool_registry_add(b->tools, &t);
    json_decref(params); /* the registry keeps its own reference */
    if (rc != 0)
        goto fail;
    rc = loom_messages_add(&b->history, LOOM_ROLE_USER,
                           "Call the noop tool five times, then say done.");
    if (rc != 0)
        goto fail;
    return 0;
fail:
    fprintf(stderr, "loom-bench: setup: %s\n", loom_error_last());
    return -1;
}

static void loop_close(bench_loop *b)
{
    loom_messages_free(&b->history);
    loom_tool_registry_free(b->tools);
    loom_provider_free(b->provider);
}

/* ---- figures ---- */

static void print_summary(const char *what, bench_summary s)
{
    printf("  %-28s p50 %9.1f  p99 %9.1f  mean %9.1f  min %9.1f  "
           "max %9.1f\n",
           what, s.p50, s.p99, s.mean, s.min, s.max);
}

/* ---- --print-script and --table ---- */

/* Result files are one JSON line each; anything bigger is not ours. */
#define RESULT_MAX (64 * 1024)
#define GOAL_US 100.0

static json_t *read_result(const char *path)
{
    char *buf = malloc(RESULT_MAX + 1);
    json_error_t err;
    json_t *j = NULL;
    FILE *f = NULL;
    size_t n;

    if (!buf || !(f = fopen(path, "r"))) {
        fprintf(stderr, "loom-bench: %s: %s\n", path, strerror(errno));
        goto done;
    }
    n = fread(buf, 1, RESULT_MAX + 1, f);
    if (n > RESULT_MAX) {
        fprintf(stderr, "loom-bench: %s: over %d bytes\n", path, RESULT_MAX);
        goto done;
    }
    j = json_loadb(buf, n, 0, &err);
    if (!j)
        fprintf(stderr, "loom-bench: %s:%d: %s\n", path, err.line, err.text);
done:
    if (f)
        fclose(f);
    free(buf);
    return j;
}

/* A figure of a result, "own_us" "per_call" "p50"; NAN when absent. */
static double figure(const json_t *r, const char *a, const char *b,
                     const char *c)
{
    const json_t *v = json_object_get(json_object_get(r, a), b);

    if (c)
        v = json_object_get(v, c);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

/*
 * Prints the results in files (loom's first) as a Markdown table, then the
 * goal's verdict for loom. 0, or -1 when a file is unreadable.
 */
static int print_table(char **files, int n)
{
    json_t **r = calloc((size_t)n, sizeof(*r));
    double loom_p50 = NAN, loom_p99 = NAN;
    int i, rc = -1;

    if (!r)
        return -1;
    for (i = 0; i < n; i++)
        if (!(r[i] = read_result(files[i])))
            goto done;
    printf("| implementation | runs | own µs per model call p50 | p99 | "
           "own µs per run p50 | p99 | wall µs per run p50 | "
           "CPU µs per model call (mean) | own time vs loom (p50) |\n"
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for (i = 0; i < n; i++) {
        const char *name = json_string_value(json_object_get(r[i], "name"));
        const char *ver = json_string_value(json_object_get(r[i], "version"));
        double call50 = figure(r[i], "own_us", "per_call", "p50");

        if (i == 0) {
            loom_p50 = call50;
            loom_p99 = figure(r[i], "own_us", "per_call", "p99");
        }
        printf("| %s (%s) | %" JSON_INTEGER_FORMAT " | %.1f | %.1f | %.1f | "
               "%.1f | %.1f | %.1f | %.1fx |\n",
               name ? name : "?", ver ? ver : "?",
               json_integer_value(json_object_get(r[i], "runs")), call50,
               figure(r[i], "own_us", "per_call", "p99"),
               figure(r[i], "own_us", "per_run", "p50"),
               figure(r[i], "own_us", "per_run", "p99"),
               figure(r[i], "wall_us", "per_run", "p50"),
               figure(r[i], "cpu_us_per_call", "mean", NULL),
               call50 / loom_p50);
    }
    printf("\nGoal: under %.0f µs of loom's own time per iteration (model "
           "call), p50: **%s** (p50 %.1f µs, p99 %.1f µs).\n",
           GOAL_US, loom_p50 < GOAL_US ? "met" : "not met", loom_p50,
           loom_p99);
    rc = 0;
done:
    for (i = 0; i < n; i++)
        json_decref(r[i]);
    free(r);
    return rc;
}

/* ---- main ---- */

static void usage(FILE *to)
{
    fprintf(to,
            "usage: loom-bench [--runs N] [--warmup N] [--tool-iters N]\n"
            "                  [--fake PATH] [--json] [--iterations-only]\n"
            "       loom-bench --print-script [--tool-iters N]\n"
            "       loom-bench --table RESULT.json...\n"
            "       loom-bench context [--help]  (the context engine)\n"
            "       loom-bench fanout [--help]   (a parent and sub-agents)\n"
            "       loom-bench research [--help] (a research run)\n"
            "  --runs N           measured runs (default %d)\n"
            "  --warmup N         unmeasured runs first (default %d)\n"
            "  --tool-iters N     tool calls per run (default %d); a run\n"
            "                     makes N+1 model calls\n"
            "  --fake PATH        loom-fake-upstream (default: next to this\n"
            "                     binary, or $LOOM_FAKE_BIN)\n"
            "  --json             print the figures as one JSON object\n"
            "  --iterations-only  no clock, no stats: for callgrind\n"
            "  --print-script     print the fake's script and exit (the\n"
            "                     peers in bench/peers run the same one)\n"
            "  --table FILE...    render --json results (loom's first) as\n"
            "                     a Markdown table and exit\n",
            DEFAULT_RUNS, DEFAULT_WARMUP, DEFAULT_TOOL_ITERS);
}

static int parse_args(bench_opts *o, int argc, char **argv)
{
    int i;

    o->fake_bin = NULL;
    o->runs = DEFAULT_RUNS;
    o->warmup = DEFAULT_WARMUP;
    o->tool_iters = DEFAULT_TOOL_ITERS;
    o->iterations_only = 0;
    o->json = 0;
    o->print_script = 0;
    o->table_from = 0;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;

        if (!strcmp(a, "--table") && v) {
            o->table_from = i + 1;
            return 0;
        } else if (!strcmp(a, "--print-script")) {
            o->print_script = 1;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "--iterations-only")) {
            o->iterations_only = 1;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (bench_common_arg(a, v, &o->fake_bin, &o->runs, &o->warmup)) {
            i++;
        } else if (v && !strcmp(a, "--tool-iters") &&
                   bench_parse_long(v, 0, MAX_TOOL_ITERS, &o->tool_iters) ==
                       0) {
            i++;
        } else {
            fprintf(stderr, "loom-bench: bad argument: %s%s%s\n", a,
                    v ? " " : "", v ? v : "");
            usage(stderr);
            return -1;
        }
    }
    return 0;
}

static void report(const bench_opts *o, const bench_loop *b, double *own,
                   double *wall, double *busy, double *cpu)
{
    size_t n = (size_t)o->runs, i;
    double calls = (double)b->calls_per_run;
    double *own_call = malloc(n * sizeof(double));
    double *wall_call = malloc(n * sizeof(double));
    bench_summary s_own_call, s_own_run, s_wall_call, s_wall_run, s_busy, s_cpu;

    if (!own_call || !wall_call) {
        free(own_call);
        free(wall_call);
        fprintf(stderr, "loom-bench: out of memory\n");
        return;
    }
    for (i = 0; i < n; i++) {
        own_call[i] = own[i] / calls;
        wall_call[i] = wall[i] / calls;
        cpu[i] /= calls;
    }
    s_own_call = bench_summarize(own_call, n);
    s_own_run = bench_summarize(own, n);
    s_wall_call = bench_summarize(wall_call, n);
    s_wall_run = bench_summarize(wall, n);
    s_busy = bench_summarize(busy, n);
    s_cpu = bench_summarize(cpu, n);
    if (o->json) {
        json_t *j = json_pack(
            "{s:s,s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:{s:o,s:o},s:{s:o,s:o},s:o,"
            "s:o}",
            "name", "loom", "version", loom_version(), "libcurl",
            curl_version_info(CURLVERSION_NOW)->version, "jansson",
            jansson_version_str(), "runs", (json_int_t)o->runs, "warmup",
            (json_int_t)o->warmup, "model_calls_per_run",
            (json_int_t)b->calls_per_run, "tool_calls_per_run",
            (json_int_t)(b->calls_per_run - 1), "own_us", "per_call",
            bench_summary_json(s_own_call), "per_run",
            bench_summary_json(s_own_run), "wall_us", "per_call",
            bench_summary_json(s_wall_call), "per_run",
            bench_summary_json(s_wall_run), "fake_busy_us_per_run",
            bench_summary_json(s_busy), "cpu_us_per_call",
            bench_summary_json(s_cpu));
        char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;

        if (s)
            puts(s);
        free(s);
        json_decref(j);
    } else {
        printf("loom %s, %ld runs after %ld warm-up, %ld model calls per "
               "run (%ld tool calls + final answer)\n",
               loom_version(), o->runs, o->warmup, b->calls_per_run,
               b->calls_per_run - 1);
        printf("microseconds:\n");
        print_summary("own per model call", s_own_call);
        print_summary("own per run", s_own_run);
        print_summary("wall per model call", s_wall_call);
        print_summary("wall per run", s_wall_run);
        print_summary("fake busy per run", s_busy);
        print_summary("loom CPU per model call", s_cpu);
    }
    free(own_call);
    free(wall_call);
}

int main(int argc, char **argv)
{
    bench_opts o;
    bench_fake fake = {.pid = -1};
    bench_stats_reader sr = {0};
    bench_loop b;
    int loop_ok = 0, rc = 1;
    char *bin = NULL, *script = NULL;
    double *own = NULL, *wall = NULL, *busy = NULL, *cpu = NULL;
    long i;

    if (argc > 1 && strcmp(argv[1], "context") == 0)
        return loom_bench_context_main(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "fanout") == 0)
        return loom_bench_fanout_main(argc - 1, argv + 1);
    if (argc > 1 && strcmp(argv[1], "research") == 0)
        return loom_bench_research_main(argc - 1, argv + 1);
    if (parse_args(&o, argc, argv) != 0)
        return 2;
    if (o.table_from)
        return print_table(argv + o.table_from, argc - o.table_from) ? 1 : 0;
    if (o.print_script) {
        script = make_script(o.tool_iters);
        if (!script)
            return 1;
        puts(script);
        free(script);
        return 0;
    }
    bin = bench_find_fake(o.fake_bin);
    if (!bin) {
        fprintf(stderr, "loom-bench: loom-fake-upstream not found; "
                        "pass --fake PATH\n");
        return 2;
    }
    script = make_script(o.tool_iters);
    if (!script || bench_fake_start(&fake, bin, script) != 0)
        goto done;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        goto done;
    if (loop_open(&b, fake.port, o.tool_iters) != 0)
        goto done;
    loop_ok = 1;

    for (i = 0; i < o.warmup; i++)
        if (run_once(&b) != 0)
            goto done;
    if (o.iterations_only) {
        for (i = 0; i < o.runs; i++)
            if (run_once(&b) != 0)
                goto done;
        printf("%ld runs, %ld model calls each\n", o.runs, b.calls_per_run);
        rc = 0;
        goto done;
    }

    own = calloc((size_t)o.runs, sizeof(double));
    wall = calloc((size_t)o.runs, sizeof(double));
    busy = calloc((size_t)o.runs, sizeof(double));
    cpu = calloc((size_t)o.runs, sizeof(double));
    if (!own || !wall || !busy || !cpu ||
        bench_stats_open(&sr, fake.port) != 0) {
        fprintf(stderr, "loom-bench: out of memory\n");
        goto done;
    }
    bench_fake_stats before, after;
    if (bench_stats_read(&sr, &before) != 0)
        goto done;
    for (i = 0; i < o.runs; i++) {
        double t0 = bench_now_us(CLOCK_MONOTONIC);
        double c0 = bench_now_us(CLOCK_PROCESS_CPUTIME_ID);
        int r = run_once(&b);
        double c1 = bench_now_us(CLOCK_PROCESS_CPUTIME_ID);
        double t1 = bench_now_us(CLOCK_MONOTONIC);

        if (r != 0 || bench_stats_read(&sr, &after) != 0)
            goto done;
        if (after.requests - before.requests != b.calls_per_run) {
            fprintf(stderr, "loom-bench: the fake saw %ld requests in a "
                            "run, want %ld\n",
                    after.requests - before.requests, b.calls_per_run);
            goto done;
        }
        wall[i] = t1 - t0;
        busy[i] = (double)(after.busy_us - before.busy_us);
        own[i] = wall[i] - busy[i];
        cpu[i] = c1 - c0;
        before = after;
    }
    report(&o, &b, own, wall, busy, cpu);
    rc = 0;
done:
    bench_stats_close(&sr);
    if (loop_ok)
        loop_close(&b);
    bench_fake_stop(&fake);
    free(own);
    free(wall);
    free(busy);
    free(cpu);
    free(script);
    free(bin);
    curl_global_cleanup();
    return rc;
}
