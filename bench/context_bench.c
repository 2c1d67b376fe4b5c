/*
 * `loom-bench context`: what the context engine costs per model call on a
 * long conversation (see bench/RESULTS-context.md).
 *
 * It builds a conversation of --turns turns (default 200), each a user
 * message, an assistant turn calling two tools, their results and an
 * answer, then a current user message. Each simulated run makes one
 * engine (as loom_run does) and does --iters model calls (default 10):
 * fit, then append the round the model asked for, as the loop does. The
 * first fit of a run counts every message (cold); the later ones reuse
 * the counts and only count the new round. Each fit is timed on its own,
 * on the wall clock (CLOCK_MONOTONIC) and in CPU time of the thread
 * (CLOCK_THREAD_CPUTIME_ID, which a busy machine's scheduling does not
 * inflate); only the fit is timed, with the crude default counter, so
 * what is measured is the engine and not a tokenizer.
 *
 * Three windows: one the conversation fits in (layout "full"), one that
 * forces older results to be reduced and turns to be dropped, and a small
 * one that drops most of the history. No summary model is set: a summary
 * is a model call, whose cost is the model's.
 *
 * Like the loop bench, it asserts nothing about speed, but every fit is
 * checked to fit its limit, so a broken engine cannot post a figure.
 */
#include "loom/context.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int loom_bench_context_main(int argc, char **argv);

#define DEFAULT_TURNS 200
#define DEFAULT_RUNS 200
#define DEFAULT_ITERS 10
#define MAX_TURNS 100000L
#define MAX_RUNS 1000000L

typedef struct {
    const char *name;
    long window;
} scenario;

static const scenario scenarios[] = {
    {"fits (1M window)", 1000000},
    {"trimmed (128k window)", 128000},
    {"trimmed (32k window)", 32000},
};

static double now_us(clockid_t clock)
{
    struct timespec ts;

    clock_gettime(clock, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static char *filler(size_t len, char c)
{
    char *s = malloc(len + 1);

    if (!s)
        return NULL;
    for (size_t i = 0; i < len; i++)
        s[i] = i % 6 == 5 ? ' ' : c;
    s[len] = '\0';
    return s;
}

/* Appends one tool round of two calls, results of `size` bytes. */
static int add_round(loom_messages *m, int *next_id, size_t size)
{
    loom_tool_call calls[2];
    char ids[2][32];
    char *t = filler(size, 'r');
    int rc;

    if (!t)
        return LOOM_ENOMEM;
    for (int i = 0; i < 2; i++) {
        snprintf(ids[i], sizeof(ids[i]), "call_%d", (*next_id)++);
        calls[i].id = ids[i];
        calls[i].name = "web_search";
        calls[i].arguments = "{\"query\":\"context windows\"}";
    }
    rc = loom_messages_add_assistant(m, NULL, NULL, calls, 2);
    for (int i = 0; !rc && i < 2; i++)
        rc = loom_messages_add_tool_result(m, ids[i], "web_search", t);
    free(t);
    return rc;
}

static int build(loom_messages *m, long turns, int *next_id)
{
    char *user = filler(300, 'u'), *answer = filler(600, 'a');
    int rc = user && answer ? 0 : LOOM_ENOMEM;

    if (!rc)
        rc = loom_messages_add(m, LOOM_ROLE_SYSTEM,
                               "You are a research assistant.");
    for (long t = 0; !rc && t < turns; t++) {
        rc = loom_messages_add(m, LOOM_ROLE_USER, user);
        if (!rc)
            rc = add_round(m, next_id, 2000);
        if (!rc)
            rc = loom_messages_add(m, LOOM_ROLE_ASSISTANT, answer);
    }
    if (!rc)
        rc = loom_messages_add(m, LOOM_ROLE_USER, "And now?");
    free(user);
    free(answer);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

typedef struct {
    double p50, p99, mean;
} stats;

static stats summarize(double *v, size_t n)
{
    stats s = {0, 0, 0};

    if (!n)
        return s;
    qsort(v, n, sizeof(*v), cmp_double);
    for (size_t i = 0; i < n; i++)
        s.mean += v[i];
    s.mean /= (double)n;
    s.p50 = v[n / 2];
    s.p99 = v[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1];
    return s;
}

static long parse_num(const char *s, long max)
{
    char *end;
    long v = strtol(s, &end, 10);

    return *s && !*end && v > 0 && v <= max ? v : -1;
}

/* One scenario: `runs` runs of `iters` fits each. */
static int run_scenario(const scenario *sc, long turns, long runs,
                        long iters, int json)
{
    loom_messages conv = {0};
    size_t nw = (size_t)(runs * (iters - 1) + 1);
    double *cold = calloc((size_t)runs, sizeof(double));
    double *warm = calloc(nw, sizeof(double));
    double *cpu = calloc(nw, sizeof(double));
    size_t nwarm = 0, msgs = 0, before = 0, after = 0;
    const char *layout = "";
    int next_id = 0, rc = 1;
    stats sc_cold, sc_warm, sc_cpu;

    if (!cold || !warm || !cpu || build(&conv, turns, &next_id) != 0)
        goto done;
    msgs = conv.len;
    for (long r = 0; r < runs; r++) {
        loom_context_options co = LOOM_CONTEXT_OPTIONS_INIT;
        loom_context *ctx = NULL;
        size_t base = conv.len;

        co.context_window = sc->window;
        co.max_output_tokens = 8192;
        if (loom_context_new(&ctx, &co) != 0)
            goto done;
        for (long it = 0; it < iters; it++) {
            loom_context_result res;
            double c0 = now_us(CLOCK_THREAD_CPUTIME_ID);
            double t0 = now_us(CLOCK_MONOTONIC), t1, c1;
            int frc = loom_context_fit(ctx, &res, conv.items, conv.len,
                                       NULL, 0, NULL);
            t1 = now_us(CLOCK_MONOTONIC);
            c1 = now_us(CLOCK_THREAD_CPUTIME_ID);
            if (frc != 0 || res.tokens_after > res.limit) {
                fprintf(stderr, "loom-bench context: fit failed: %s\n",
                        loom_error_last());
                loom_context_free(ctx);
                goto done;
            }
            if (it == 0)
                cold[r] = t1 - t0;
            else {
                cpu[nwarm] = c1 - c0;
                warm[nwarm++] = t1 - t0;
            }
            before = res.tokens_before;
            after = res.tokens_after;
            layout = loom_context_layout_name(res.layout);
            if (add_round(&conv, &next_id, 2000) != 0) {
                loom_context_free(ctx);
                goto done;
            }
        }
        loom_context_free(ctx);
        /* The next run starts from the same conversation. */
        while (conv.len > base)
            loom_message_clear(&conv.items[--conv.len]);
    }
    sc_cold = summarize(cold, (size_t)runs);
    sc_warm = summarize(warm, nwarm);
    sc_cpu = summarize(cpu, nwarm);
    if (json)
        printf("{\"scenario\":\"%s\",\"window\":%ld,\"messages\":%zu,"
               "\"layout\":\"%s\",\"tokens_before\":%zu,"
               "\"tokens_after\":%zu,\"cold_us\":{\"p50\":%.2f,"
               "\"p99\":%.2f,\"mean\":%.2f},\"per_call_us\":{\"p50\":%.2f,"
               "\"p99\":%.2f,\"mean\":%.2f},\"per_call_cpu_us\":{"
               "\"p50\":%.2f,\"p99\":%.2f,\"mean\":%.2f}}\n",
               sc->name, sc->window, msgs, layout, before, after,
               sc_cold.p50, sc_cold.p99, sc_cold.mean, sc_warm.p50,
               sc_warm.p99, sc_warm.mean, sc_cpu.p50, sc_cpu.p99,
               sc_cpu.mean);
    else
        printf("%s: %zu messages, %s, %zu -> %zu tokens\n"
               "  first fit (wall)    p50 %8.1f  p99 %8.1f  mean %8.1f us\n"
               "  later fits (wall)   p50 %8.1f  p99 %8.1f  mean %8.1f us\n"
               "  later fits (CPU)    p50 %8.1f  p99 %8.1f  mean %8.1f us\n",
               sc->name, msgs, layout, before, after, sc_cold.p50,
               sc_cold.p99, sc_cold.mean, sc_warm.p50, sc_warm.p99,
               sc_warm.mean, sc_cpu.p50, sc_cpu.p99, sc_cpu.mean);
    rc = 0;
done:
    loom_messages_free(&conv);
    free(cold);
    free(warm);
    free(cpu);
    return rc;
}

int loom_bench_context_main(int argc, char **argv)
{
    long turns = DEFAULT_TURNS, runs = DEFAULT_RUNS, iters = DEFAULT_ITERS;
    int json = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--json")) {
            json = 1;
        } else if (v && !strcmp(a, "--turns") &&
                   (turns = parse_num(v, MAX_TURNS)) > 0) {
            i++;
        } else if (v && !strcmp(a, "--runs") &&
                   (runs = parse_num(v, MAX_RUNS)) > 0) {
            i++;
        } else if (v && !strcmp(a, "--iters") &&
                   (iters = parse_num(v, 1000)) > 1) {
            i++;
        } else {
            fprintf(stderr,
                    "usage: loom-bench context [--turns N] [--runs N] "
                    "[--iters N (>= 2)] [--json]\n");
            return 2;
        }
    }
    if (!json)
        printf("context engine, %ld-turn conversation, %ld runs of %ld "
               "model calls (first fit counts every message)\n",
               turns, runs, iters);
    for (size_t i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++)
        if (run_scenario(&scenarios[i], turns, runs, iters, json) != 0)
            return 1;
    return 0;
}
