/*
 * What loom-bench's subcommands share (declared in bench.h): the fake
 * upstream as a child process, its stats counters, the clock, summaries.
 */
#include "bench.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* The fake binary: --fake, $LOOM_FAKE_BIN, or next to (or above) us. */
char *bench_find_fake(const char *given)
{
    const char *env = getenv("LOOM_FAKE_BIN");
    const char *rel[] = {"/loom-fake-upstream", "/../loom-fake-upstream"};
    char self[PATH_MAX], *slash, *p;
    ssize_t n;
    size_t i;

    if (given)
        return strdup(given);
    if (env && *env)
        return strdup(env);
    n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return NULL;
    self[n] = '\0';
    if ((slash = strrchr(self, '/')) == NULL)
        return NULL;
    *slash = '\0';
    for (i = 0; i < sizeof(rel) / sizeof(rel[0]); i++) {
        if (asprintf(&p, "%s%s", self, rel[i]) < 0)
            return NULL;
        if (access(p, X_OK) == 0)
            return p;
        free(p);
    }
    return NULL;
}

void bench_fake_stop(bench_fake *f)
{
    if (f->pid > 0) {
        kill(f->pid, SIGTERM);
        waitpid(f->pid, NULL, 0);
        f->pid = -1;
    }
    if (f->script[0]) {
        unlink(f->script);
        f->script[0] = '\0';
    }
}

/* Spawns the fake with the script and reads its "listening" line. */
int bench_fake_start(bench_fake *f, const char *bin, const char *script)
{
    posix_spawn_file_actions_t fa;
    char line[128];
    int fds[2] = {-1, -1}, fd, rc;
    size_t len = strlen(script);
    FILE *in = NULL;

    f->pid = -1;
    f->port = 0;
    snprintf(f->script, sizeof(f->script), "/tmp/loom-bench-XXXXXX");
    fd = mkstemp(f->script);
    if (fd < 0) {
        f->script[0] = '\0';
        fprintf(stderr, "loom-bench: mkstemp: %s\n", strerror(errno));
        return -1;
    }
    rc = write(fd, script, len) == (ssize_t)len ? 0 : -1;
    close(fd);
    if (rc != 0 || pipe(fds) != 0) {
        fprintf(stderr, "loom-bench: cannot write the script\n");
        goto fail;
    }
    /* An hour at most, so a killed bench leaves nothing behind for long. */
    char *args[] = {(char *)bin,     "--script", f->script,
                    "--max-seconds", "3600",     NULL};
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    rc = posix_spawn(&f->pid, bin, &fa, NULL, args, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0) {
        f->pid = -1;
        close(fds[0]);
        fprintf(stderr, "loom-bench: cannot start %s: %s\n", bin, strerror(rc));
        goto fail;
    }
    in = fdopen(fds[0], "r");
    if (!in) {
        close(fds[0]);
        goto fail;
    }
    if (!fgets(line, sizeof(line), in) ||
        sscanf(line, "listening 127.0.0.1:%d", &f->port) != 1 || f->port <= 0) {
        fprintf(stderr, "loom-bench: %s did not start\n", bin);
        goto fail;
    }
    fclose(in);
    return 0;
fail:
    if (in)
        fclose(in);
    bench_fake_stop(f);
    return -1;
}

/* ---- GET /_fake/stats, on its own keep-alive connection ---- */

static size_t stats_write(char *data, size_t size, size_t nmemb, void *ud)
{
    bench_stats_reader *s = ud;
    size_t n = size * nmemb;

    if (n > BENCH_STATS_MAX - s->len) {
        s->overflow = 1;
        return 0;
    }
    memcpy(s->body + s->len, data, n);
    s->len += n;
    s->body[s->len] = '\0';
    return n;
}

int bench_stats_open(bench_stats_reader *s, int port)
{
    memset(s, 0, sizeof(*s));
    snprintf(s->url, sizeof(s->url), "http://127.0.0.1:%d/_fake/stats", port);
    s->easy = curl_easy_init();
    if (!s->easy)
        return -1;
    curl_easy_setopt(s->easy, CURLOPT_URL, s->url);
    curl_easy_setopt(s->easy, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(s->easy, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(s->easy, CURLOPT_WRITEFUNCTION, stats_write);
    curl_easy_setopt(s->easy, CURLOPT_WRITEDATA, s);
    return 0;
}

int bench_stats_read(bench_stats_reader *s, bench_fake_stats *out)
{
    json_t *o;
    json_error_t err;
    CURLcode cc;
    int rc = -1;

    s->len = 0;
    s->overflow = 0;
    s->body[0] = '\0';
    cc = curl_easy_perform(s->easy);
    if (cc != CURLE_OK) {
        fprintf(stderr, "loom-bench: stats: %s\n",
                s->overflow ? "answer too long" : curl_easy_strerror(cc));
        return -1;
    }
    o = json_loads(s->body, 0, &err);
    if (json_is_integer(json_object_get(o, "requests")) &&
        json_is_integer(json_object_get(o, "busy_us"))) {
        out->requests =
            (long)json_integer_value(json_object_get(o, "requests"));
        out->busy_us = json_integer_value(json_object_get(o, "busy_us"));
        rc = 0;
    } else {
        fprintf(stderr, "loom-bench: stats: unexpected answer: %s\n", s->body);
    }
    json_decref(o);
    return rc;
}

void bench_stats_close(bench_stats_reader *s)
{
    if (s->easy)
        curl_easy_cleanup(s->easy);
    s->easy = NULL;
}

double bench_now_us(clockid_t clock)
{
    struct timespec ts;

    clock_gettime(clock, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

/* Nearest-rank percentiles, mean, min and max of v (sorted in place). */
bench_summary bench_summarize(double *v, size_t n)
{
    bench_summary s = {0, 0, 0, 0, 0};
    double sum = 0;
    size_t i;

    if (n == 0)
        return s;
    qsort(v, n, sizeof(*v), cmp_double);
    for (i = 0; i < n; i++)
        sum += v[i];
    s.p50 = v[(size_t)ceil(0.50 * (double)n) - 1];
    s.p99 = v[(size_t)ceil(0.99 * (double)n) - 1];
    s.mean = sum / (double)n;
    s.min = v[0];
    s.max = v[n - 1];
    return s;
}

json_t *bench_summary_json(bench_summary s)
{
    return json_pack("{s:f,s:f,s:f,s:f,s:f}", "p50", s.p50, "p99", s.p99,
                     "mean", s.mean, "min", s.min, "max", s.max);
}

int bench_parse_long(const char *s, long min, long max, long *out)
{
    char *end;
    long v;

    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

int bench_tool_records_ok(const json_t *records, long want)
{
    const json_t *r;
    size_t i;

    if ((long)json_array_size(records) != want) {
        fprintf(stderr, "loom-bench: %zu tool records in a run, want %ld\n",
                json_array_size(records), want);
        return 0;
    }
    json_array_foreach(records, i, r)
    {
        const char *st = json_string_value(json_object_get(r, "status"));

        if (!st || strcmp(st, "success") != 0) {
            char *d = json_dumps(r, JSON_COMPACT);

            fprintf(stderr, "loom-bench: a tool call did not run: %s\n",
                    d ? d : "?");
            free(d);
            return 0;
        }
    }
    return 1;
}

int bench_common_arg(const char *a, const char *v, const char **fake,
                     long *runs, long *warmup)
{
    if (!v)
        return 0;
    if (!strcmp(a, "--fake")) {
        *fake = v;
        return 1;
    }
    if (!strcmp(a, "--runs"))
        return bench_parse_long(v, 1, BENCH_MAX_RUNS, runs) == 0;
    if (!strcmp(a, "--warmup"))
        return bench_parse_long(v, 0, BENCH_MAX_RUNS, warmup) == 0;
    return 0;
}

int bench_parse_args(bench_flags *o, const char *name, long runs, long warmup,
                     int argc, char **argv, void (*usage)(FILE *),
                     bench_arg_fn extra, void *arg)
{
    memset(o, 0, sizeof(*o));
    o->runs = runs;
    o->warmup = warmup;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int took;

        if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "--memory")) {
            o->memory = 1;
        } else if (!strcmp(a, "--iterations-only")) {
            o->iterations_only = 1;
        } else if (!strcmp(a, "--print-script")) {
            o->print_script = 1;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 1;
        } else if (bench_common_arg(a, v, &o->fake_bin, &o->runs, &o->warmup)) {
            i++;
        } else if (extra && (took = extra(a, v, arg)) > 0) {
            i += took - 1;
        } else {
            fprintf(stderr, "loom-bench %s: bad argument: %s%s%s\n", name, a,
                    v ? " " : "", v ? v : "");
            usage(stderr);
            return -1;
        }
    }
    return 0;
}

int bench_repeat(long n, bench_run_fn run, void *arg)
{
    for (long i = 0; i < n; i++)
        if (run(arg) != 0)
            return -1;
    return 0;
}

/* CPU time of the process, in µs: bench_measure's default clock. */
static double process_cpu_us(void)
{
    return bench_now_us(CLOCK_PROCESS_CPUTIME_ID);
}

int bench_measure(const char *name, int port, long n, long want,
                  bench_run_fn run, void *arg, double (*cpu_us)(void),
                  double *wall, double *cpu, double *busy)
{
    bench_stats_reader sr;
    bench_fake_stats before, after;
    int rc = -1;

    if (!cpu_us)
        cpu_us = process_cpu_us;
    if (bench_stats_open(&sr, port) != 0)
        return -1;
    if (bench_stats_read(&sr, &before) != 0)
        goto done;
    for (long i = 0; i < n; i++) {
        double t0 = bench_now_us(CLOCK_MONOTONIC), c0 = cpu_us();
        int r = run(arg);
        double c1 = cpu_us(), t1 = bench_now_us(CLOCK_MONOTONIC);

        if (r != 0 || bench_stats_read(&sr, &after) != 0)
            goto done;
        if (after.requests - before.requests != want) {
            fprintf(stderr,
                    "loom-bench %s: the fake saw %ld requests in a run, "
                    "want %ld\n",
                    name, after.requests - before.requests, want);
            goto done;
        }
        wall[i] = t1 - t0;
        cpu[i] = c1 - c0;
        busy[i] = (double)(after.busy_us - before.busy_us);
        before = after;
    }
    rc = 0;
done:
    bench_stats_close(&sr);
    return rc;
}

int bench_measure_memory(long n, bench_run_fn run, void *arg, double *peak)
{
    for (long i = 0; i < n; i++) {
        long base = bench_mem_reset_peak();

        if (run(arg) != 0)
            return -1;
        peak[i] = (double)(bench_mem_peak() - base);
    }
    return 0;
}
