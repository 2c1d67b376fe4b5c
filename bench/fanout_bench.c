/*
 * loom-bench fanout: loom's own cost per model call when a parent agent
 * fans out to sub-agents (docs/agents.md "Sub-agents"), against the fake
 * upstream with zero delay; the single-agent loop (loop_bench.c) is the
 * yardstick (see bench/README.md, "The fan-out").
 *
 * It starts loom-fake-upstream with a script of rules, since parallel
 * children call it in no fixed order: the parent (matched by its system
 * prompt) first asks for --children calls of the `worker` agent at once,
 * each with its own task "task-NN", then answers; worker NN (matched by
 * its task, the first user message) calls the built-in get_time
 * --child-tools times, one call per model call, then answers. A run is one
 * turn of a session made from a YAML config, as `loom run` and `loom
 * serve` make theirs, with no store: 1 + children * (child_tools + 1) + 1
 * model calls (26 by default). --single runs one worker as the top turn
 * instead (child_tools + 1 model calls, same session path, no sub-agent),
 * which separates what the sub-agent path costs from what the session
 * costs.
 *
 * Figures per run: wall time, the process's CPU time (all threads; the
 * fake is another process) and the fake's busy time. Children overlap, so
 * wall minus busy is not loom's own time here: the CPU time per model call
 * is the comparable time figure, and callgrind's instruction count
 * (--iterations-only at two run counts) the exact one. --memory (in the
 * loom-bench-mem build, bench_mem.c) gives each run's peak heap instead;
 * run.sh turns it into memory per child run by comparing --children 8
 * with --children 0. (Peak RSS cannot: the process's high-water mark is
 * set at start-up, loading the tokenizer's vocabulary, not by the runs.)
 *
 * Every run is checked: the turn completes with the parent's scripted
 * answer, every tool call (the parent's worker calls and the children's
 * get_time calls, merged into the parent's records) succeeded, and in
 * timed runs the fake saw exactly the expected requests. A run off script
 * stops the benchmark. Nothing is asserted about speed.
 */
#include "bench.h"
#include "loom/config.h"
#include "loom/session.h"
#include "loom/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int loom_bench_fanout_main(int argc, char **argv);

#define DEFAULT_RUNS 200
#define DEFAULT_WARMUP 20
#define DEFAULT_CHILDREN 8
#define DEFAULT_CHILD_TOOLS 2
#define MAX_CHILDREN 64L
#define MAX_CHILD_TOOLS 4L
#define PARENT_PROMPT "You are the parent. Split the work among workers."
#define WORKER_PROMPT "You are a worker. Do the one task you are given."

typedef struct {
    bench_flags c; /* the flags every such subcommand takes */
    long children;
    long child_tools;
    int single;
} fan_opts;

typedef struct {
    loom_config *cfg;
    loom_session *s;
    unsigned long counts[LOOM_EV__COUNT];
    long calls_per_run;
    long tool_calls_per_run;
    char final_text[64];
    const fan_opts *o;
} fan_bench;

/* ---- the script and the config ---- */

static json_t *usage_obj(int prompt, int completion)
{
    return json_pack("{s:i,s:i,s:i}", "prompt_tokens", prompt,
                     "completion_tokens", completion, "total_tokens",
                     prompt + completion);
}

/* Worker k's rule: child_tools get_time calls, then its answer. */
static json_t *worker_rule(long k, long child_tools)
{
    json_t *resps = json_array();
    char task[32], text[32];
    long i;

    snprintf(task, sizeof(task), "task-%02ld", k);
    snprintf(text, sizeof(text), "worker %02ld done", k);
    for (i = 0; i < child_tools; i++) {
        /* Arguments differ from call to call (a repeat of a success is
         * not run again), and all mean UTC, which needs no zone file. */
        static const char *const utc[MAX_CHILD_TOOLS] = {
            "{}", "{\"timezone\":\"UTC\"}", "{\"timezone\":\"\"}",
            "{\"timezone\":null}"};
        char id[32];

        snprintf(id, sizeof(id), "call_time_%ld", i + 1);
        json_array_append_new(
            resps, json_pack("{s:[{s:s,s:s,s:s}],s:o}", "tool_calls", "id", id,
                             "name", "get_time", "arguments", utc[i], "usage",
                             usage_obj(60 + 20 * (int)i, 5)));
    }
    json_array_append_new(resps,
                          json_pack("{s:[s],s:o}", "text", text, "usage",
                                    usage_obj(60 + 20 * (int)child_tools, 4)));
    return json_pack("{s:{s:s},s:b,s:o}", "match", "first_user", task, "loop",
                     1, "responses", resps);
}

/* The parent's rule: one answer calling every worker, then its text. */
static json_t *parent_rule(long children, const char *final_text)
{
    json_t *resps = json_array(), *calls = json_array();
    long k;

    for (k = 1; k <= children; k++) {
        char id[32], args[64];

        snprintf(id, sizeof(id), "call_worker_%02ld", k);
        snprintf(args, sizeof(args), "{\"task\":\"task-%02ld\"}", k);
        json_array_append_new(calls,
                              json_pack("{s:s,s:s,s:s}", "id", id, "name",
                                        "worker", "arguments", args));
    }
    if (children > 0)
        json_array_append_new(resps,
                              json_pack("{s:o,s:o}", "tool_calls", calls,
                                        "usage", usage_obj(80, 10 * children)));
    else
        json_decref(calls);
    json_array_append_new(resps,
                          json_pack("{s:[s],s:o}", "text", final_text, "usage",
                                    usage_obj(80 + 20 * children, 6)));
    return json_pack("{s:{s:s},s:b,s:o}", "match", "system", PARENT_PROMPT,
                     "loop", 1, "responses", resps);
}

/* The fake's script (rules only: every request matches one). Caller
 * frees; NULL when out of memory. */
static char *make_script(const fan_opts *o, const char *final_text)
{
    json_t *rules = json_array(), *root;
    long k, workers = o->children > 0 ? o->children : 1;
    char *s;

    json_array_append_new(rules, parent_rule(o->children, final_text));
    for (k = 1; k <= workers; k++)
        json_array_append_new(rules, worker_rule(k, o->child_tools));
    root = json_pack("{s:o}", "rules", rules);
    s = root ? json_dumps(root, JSON_COMPACT) : NULL;
    json_decref(root);
    return s;
}

/* The session's config: the fake as an OpenAI provider, no retries, the
 * parent offering the worker, the worker offering get_time. */
static char *make_config(const fan_opts *o, int port)
{
    long conc = o->children > 0 ? o->children : 1;
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
                 "  fake/fake-model: {}\n"
                 "agents:\n"
                 "  parent:\n"
                 "    model: fake/fake-model\n"
                 "    system_prompt: %s\n"
                 "    tools: []\n"
                 "    memory: false\n"
                 "    sub_agents: [worker]\n"
                 "    max_iterations: 1000\n"
                 "    tool_concurrency: %ld\n"
                 "    max_sub_runs: %ld\n"
                 "  worker:\n"
                 "    model: fake/fake-model\n"
                 "    description: Does one task with the clock and "
                 "reports.\n"
                 "    system_prompt: %s\n"
                 "    tools: [get_time]\n"
                 "    memory: false\n"
                 "    max_iterations: %ld\n",
                 port, PARENT_PROMPT, conc, conc, WORKER_PROMPT,
                 o->child_tools + 2) < 0)
        return NULL;
    return yaml;
}

/* ---- the turn under test ---- */

static int count_event(const loom_event *ev, void *payload)
{
    unsigned long *counts = payload;

    counts[ev->type]++;
    return 0;
}

/* One turn, checked against the script. 0 when it went as scripted. */
static int run_once(void *arg)
{
    fan_bench *b = arg;
    loom_turn_options o = LOOM_TURN_OPTIONS_INIT;
    loom_messages in = {0};
    const loom_run *run;
    loom_turn *t = NULL;
    int rc;

    rc = loom_messages_add(&in, LOOM_ROLE_USER,
                           b->o->single ? "task-01"
                                        : "Have the workers do their tasks.");
    o.agent = b->o->single ? "worker" : "parent";
    o.input = &in;
    o.sink.emit = count_event;
    o.sink.payload = b->counts;
    if (rc == 0)
        rc = loom_turn_new(&t, b->s, &o);
    loom_messages_free(&in);
    if (rc == 0)
        rc = loom_turn_execute(t);
    run = t ? loom_turn_run(t) : NULL;
    if (rc != 0 || !run) {
        fprintf(stderr, "loom-bench fanout: turn failed: %s\n",
                run && *loom_run_error(run) ? loom_run_error(run)
                                            : loom_error_last());
        rc = -1;
    } else if (strcmp(loom_run_text(run), b->final_text) != 0) {
        fprintf(stderr,
                "loom-bench fanout: turn went off script: text \"%s\"\n",
                loom_run_text(run));
        rc = -1;
    } else if (!bench_tool_records_ok(loom_run_tool_records(run),
                                      b->tool_calls_per_run)) {
        rc = -1;
    }
    loom_turn_free(t);
    return rc;
}

static int fan_open(fan_bench *b, const fan_opts *o, int port)
{
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    char *yaml = make_config(o, port);
    int rc = -1;

    if (!yaml)
        return -1;
    if (loom_config_load_string(&b->cfg, yaml, "fanout.yaml") != 0)
        goto done;
    so.config = b->cfg;
    if (loom_session_new(&b->s, &so) != 0)
        goto done;
    rc = 0;
done:
    if (rc != 0)
        fprintf(stderr, "loom-bench fanout: setup: %s\n", loom_error_last());
    free(yaml);
    return rc;
}

static void fan_close(fan_bench *b)
{
    loom_session_free(b->s);
    loom_config_free(b->cfg);
}

/* ---- options and figures ---- */

static void usage(FILE *to)
{
    fprintf(to,
            "usage: loom-bench fanout [--runs N] [--warmup N] "
            "[--children N]\n"
            "                         [--child-tools N] [--single] "
            "[--fake PATH]\n"
            "                         [--json] [--iterations-only] "
            "[--print-script]\n"
            "                         [--memory]\n"
            "  --runs N           measured runs (default %d)\n"
            "  --warmup N         unmeasured runs first (default %d)\n"
            "  --children N       sub-agent calls the parent makes at once\n"
            "                     (default %d; 0: the parent answers "
            "alone)\n"
            "  --child-tools N    get_time calls per child, 0..4 (default "
            "%d);\n"
            "                     a child makes N+1 model calls\n"
            "  --single           one worker as the top turn instead (no\n"
            "                     sub-agent): N+1 model calls per run\n"
            "  --fake PATH        loom-fake-upstream (default: next to this\n"
            "                     binary, or $LOOM_FAKE_BIN)\n"
            "  --json             print the figures as one JSON object\n"
            "  --iterations-only  no clock, no stats: for callgrind and "
            "DHAT\n"
            "  --memory           each run's peak heap (loom-bench-mem "
            "only)\n"
            "  --print-script     print the fake's script and exit\n",
            DEFAULT_RUNS, DEFAULT_WARMUP, DEFAULT_CHILDREN,
            DEFAULT_CHILD_TOOLS);
}

/* fanout's own flags (bench_arg_fn). */
static int fan_arg(const char *a, const char *v, void *arg)
{
    fan_opts *o = arg;

    if (!strcmp(a, "--single")) {
        o->single = 1;
        return 1;
    }
    if (v && !strcmp(a, "--children") &&
        bench_parse_long(v, 0, MAX_CHILDREN, &o->children) == 0)
        return 2;
    if (v && !strcmp(a, "--child-tools") &&
        bench_parse_long(v, 0, MAX_CHILD_TOOLS, &o->child_tools) == 0)
        return 2;
    return 0;
}

/* 0, 1 when done (--help), -1 on a bad argument. */
static int parse_args(fan_opts *o, int argc, char **argv)
{
    o->children = DEFAULT_CHILDREN;
    o->child_tools = DEFAULT_CHILD_TOOLS;
    o->single = 0;
    return bench_parse_args(&o->c, "fanout", DEFAULT_RUNS, DEFAULT_WARMUP, argc,
                            argv, usage, fan_arg, o);
}

static void report(const fan_bench *b, double *wall, double *busy, double *cpu)
{
    const fan_opts *o = b->o;
    size_t n = (size_t)o->c.runs, i;
    bench_summary s_wall, s_busy, s_cpu;
    const char *mode = o->single ? "single" : "fanout";
    loom_token_counter *tc = NULL;
    char counting[64] = "?";

    for (i = 0; i < n; i++)
        cpu[i] /= (double)b->calls_per_run;
    s_wall = bench_summarize(wall, n);
    s_busy = bench_summarize(busy, n);
    s_cpu = bench_summarize(cpu, n);
    /* The runs' prompt estimates tokenise with the vocabulary when one was
     * found (estimate:o200k_base), else from the length (estimate:length):
     * about 24k instructions per model call apart. */
    if (loom_token_counter_for_model(&tc, "fake-model") == 0)
        snprintf(counting, sizeof(counting), "%s",
                 loom_token_counter_method(tc));
    loom_token_counter_free(tc);
    if (o->c.json) {
        json_t *j = json_pack(
            "{s:s,s:s,s:s,s:s,s:I,s:I,s:I,s:I,s:I,s:I,s:{s:o},s:o,s:o}", "name",
            "loom", "mode", mode, "version", loom_version(), "token_counting",
            counting, "runs", (json_int_t)o->c.runs, "warmup",
            (json_int_t)o->c.warmup, "children",
            (json_int_t)(o->single ? 0 : o->children), "child_tools",
            (json_int_t)o->child_tools, "model_calls_per_run",
            (json_int_t)b->calls_per_run, "tool_calls_per_run",
            (json_int_t)b->tool_calls_per_run, "wall_us", "per_run",
            bench_summary_json(s_wall), "fake_busy_us_per_run",
            bench_summary_json(s_busy), "cpu_us_per_call",
            bench_summary_json(s_cpu));
        char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;

        if (s)
            puts(s);
        free(s);
        json_decref(j);
        return;
    }
    printf("loom %s, %s: %ld runs after %ld warm-up, %ld model calls and "
           "%ld tool calls per run, token counting %s\n",
           loom_version(), mode, o->c.runs, o->c.warmup, b->calls_per_run,
           b->tool_calls_per_run, counting);
    printf("microseconds: wall per run p50 %.1f p99 %.1f; fake busy per "
           "run p50 %.1f;\n  loom CPU per model call p50 %.1f p99 %.1f "
           "mean %.1f\n",
           s_wall.p50, s_wall.p99, s_busy.p50, s_cpu.p50, s_cpu.p99,
           s_cpu.mean);
}

/*
 * Runs with heap accounting (loom-bench-mem): each run's peak heap above
 * what was live when it started, and what it left behind. 0, or -1.
 */
static int measure_memory(fan_bench *b)
{
    const fan_opts *o = b->o;
    size_t n = (size_t)o->c.runs;
    double *peak = calloc(n, sizeof(double));
    long start = bench_mem_live();
    bench_summary s;
    int rc = -1;

    if (!peak)
        return -1;
    if (bench_measure_memory(o->c.runs, run_once, b, peak) != 0)
        goto done;
    s = bench_summarize(peak, n);
    if (o->c.json) {
        json_t *j = json_pack(
            "{s:s,s:I,s:I,s:I,s:I,s:o,s:I}", "mode",
            o->single ? "single" : "fanout", "runs", (json_int_t)o->c.runs,
            "children", (json_int_t)(o->single ? 0 : o->children),
            "child_tools", (json_int_t)o->child_tools, "model_calls_per_run",
            (json_int_t)b->calls_per_run, "heap_peak_bytes_per_run",
            bench_summary_json(s), "heap_left_bytes",
            (json_int_t)(bench_mem_live() - start));
        char *t = j ? json_dumps(j, JSON_COMPACT) : NULL;

        if (t)
            puts(t);
        free(t);
        json_decref(j);
    } else {
        printf("%s: %ld runs, %ld children; peak heap per run above what "
               "was live before it: p50 %.0f bytes, max %.0f; left after "
               "all runs: %ld bytes\n",
               o->single ? "single" : "fanout", o->c.runs,
               o->single ? 0 : o->children, s.p50, s.max,
               bench_mem_live() - start);
    }
    rc = 0;
done:
    free(peak);
    return rc;
}

int loom_bench_fanout_main(int argc, char **argv)
{
    fan_opts o;
    fan_bench b;
    bench_fake fake = {.pid = -1};
    char *bin = NULL, *script = NULL;
    double *wall = NULL, *busy = NULL, *cpu = NULL;
    int rc = 1, opened = 0;

    int pa = parse_args(&o, argc, argv);
    if (pa != 0)
        return pa > 0 ? 0 : 2;
    memset(&b, 0, sizeof(b));
    b.o = &o;
    if (o.single) {
        b.calls_per_run = o.child_tools + 1;
        b.tool_calls_per_run = o.child_tools;
        snprintf(b.final_text, sizeof(b.final_text), "worker 01 done");
    } else {
        b.calls_per_run =
            1 + o.children * (o.child_tools + 1) + (o.children > 0 ? 1 : 0);
        b.tool_calls_per_run = o.children * (o.child_tools + 1);
        snprintf(b.final_text, sizeof(b.final_text),
                 "All %ld workers answered.", o.children);
    }
    script = make_script(&o, b.final_text);
    if (!script)
        return 1;
    if (o.c.print_script) {
        puts(script);
        free(script);
        return 0;
    }
    if (!(bin = bench_find_fake(o.c.fake_bin))) {
        fprintf(stderr, "loom-bench fanout: loom-fake-upstream not found; "
                        "pass --fake PATH\n");
        free(script);
        return 2;
    }
    if (bench_fake_start(&fake, bin, script) != 0)
        goto done;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        goto done;
    if (fan_open(&b, &o, fake.port) != 0)
        goto done;
    opened = 1;
    if (bench_repeat(o.c.warmup, run_once, &b) != 0)
        goto done;
    if (o.c.memory) {
        if (!bench_mem_enabled()) {
            fprintf(stderr, "loom-bench fanout: --memory needs the "
                            "loom-bench-mem build\n");
            goto done;
        }
        rc = measure_memory(&b) == 0 ? 0 : 1;
        goto done;
    }
    if (o.c.iterations_only) {
        if (bench_repeat(o.c.runs, run_once, &b) != 0)
            goto done;
        printf("%ld runs, %ld model calls each\n", o.c.runs, b.calls_per_run);
        rc = 0;
        goto done;
    }
    wall = calloc((size_t)o.c.runs, sizeof(double));
    busy = calloc((size_t)o.c.runs, sizeof(double));
    cpu = calloc((size_t)o.c.runs, sizeof(double));
    if (!wall || !busy || !cpu) {
        fprintf(stderr, "loom-bench fanout: out of memory\n");
        goto done;
    }
    if (bench_measure("fanout", fake.port, o.c.runs, b.calls_per_run, run_once,
                      &b, NULL, wall, cpu, busy) != 0)
        goto done;
    report(&b, wall, busy, cpu);
    rc = 0;
done:
    if (opened)
        fan_close(&b);
    else if (b.cfg)
        loom_config_free(b.cfg);
    bench_fake_stop(&fake);
    free(wall);
    free(busy);
    free(cpu);
    free(script);
    free(bin);
    curl_global_cleanup();
    return rc;
}
