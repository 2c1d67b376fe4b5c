/*
 * bench.h: what loom-bench's subcommands share (bench/bench_util.c): the
 * fake upstream as a child process, its GET /_fake/stats counters on a
 * connection of their own, the clock, and summaries of samples. See
 * bench/README.md for what the benchmarks measure.
 */
#ifndef LOOM_BENCH_H
#define LOOM_BENCH_H

#include <curl/curl.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>
#include <time.h>

/* The stats answer is a small JSON object; anything longer is wrong. */
#define BENCH_STATS_MAX 4096

typedef struct {
    pid_t pid;
    int port;
    char script[64];
} bench_fake;

typedef struct {
    CURL *easy;
    char url[96];
    char body[BENCH_STATS_MAX + 1];
    size_t len;
    int overflow;
} bench_stats_reader;

typedef struct {
    long requests;
    long long busy_us;
} bench_fake_stats;

typedef struct {
    double p50, p99, mean, min, max;
} bench_summary;

/* The fake binary: given, else $LOOM_FAKE_BIN, else next to (or above)
 * this binary. Caller frees; NULL when not found. */
char *bench_find_fake(const char *given);

/*
 * Starts the fake binary bin answering from script (the JSON text of a
 * fake script, written to a temporary file) and reads its "listening"
 * line into f->port. 0, or -1 with a message on stderr (nothing left
 * running).
 */
int bench_fake_start(bench_fake *f, const char *bin, const char *script);

/* Stops the fake and removes its script file; safe to call twice. */
void bench_fake_stop(bench_fake *f);

/* A keep-alive connection for GET /_fake/stats. 0, or -1. */
int bench_stats_open(bench_stats_reader *s, int port);

/* Reads the fake's request count and busy time. 0, or -1 with a message
 * on stderr. */
int bench_stats_read(bench_stats_reader *s, bench_fake_stats *out);

void bench_stats_close(bench_stats_reader *s);

/* Microseconds on clock (CLOCK_MONOTONIC, CLOCK_PROCESS_CPUTIME_ID...). */
double bench_now_us(clockid_t clock);

/* Nearest-rank percentiles, mean, min and max of v (sorted in place). */
bench_summary bench_summarize(double *v, size_t n);

/* {p50, p99, mean, min, max}; NULL when out of memory. */
json_t *bench_summary_json(bench_summary s);

/* Parses a decimal integer in [min, max] into *out. 0, or -1. */
int bench_parse_long(const char *s, long min, long max, long *out);

#define BENCH_MAX_RUNS 1000000L

/* The options every subcommand takes: --fake PATH, --runs N (1 up to
 * BENCH_MAX_RUNS), --warmup N (0 up). 1 when a with its value v (NULL:
 * none) was one of them and valid (stored), else 0. */
int bench_common_arg(const char *a, const char *v, const char **fake,
                     long *runs, long *warmup);

/* The flags of a subcommand that runs the same turn many times
 * (fanout, research): bench_parse_args reads them. */
typedef struct {
    const char *fake_bin; /* --fake PATH, NULL: bench_find_fake's default */
    long runs, warmup;    /* --runs N, --warmup N */
    int json;             /* --json: one JSON object */
    int memory;           /* --memory: peak heap (loom-bench-mem) */
    int iterations_only;  /* --iterations-only: no clock, no stats */
    int print_script;     /* --print-script: the fake's script, then exit */
} bench_flags;

/*
 * A subcommand's own flags for bench_parse_args: a (its value v, NULL:
 * none) read into arg when it is one: 1 (a flag alone), 2 (v taken too),
 * else 0 (not one of them, or a bad value).
 */
typedef int (*bench_arg_fn)(const char *a, const char *v, void *arg);

/*
 * Reads argv[1..] of `loom-bench <name>` into o (runs and warmup start
 * as given, the rest zero) and, through extra (may be NULL), the
 * subcommand's own flags. usage prints the subcommand's help to a file.
 * 0; 1 when done (--help: usage on stdout); -1 on a bad argument (said
 * on stderr with the usage).
 */
int bench_parse_args(bench_flags *o, const char *name, long runs, long warmup,
                     int argc, char **argv, void (*usage)(FILE *),
                     bench_arg_fn extra, void *arg);

/* One run of a benchmark's turn: 0, or -1 with a message on stderr. */
typedef int (*bench_run_fn)(void *arg);

/* n calls of run(arg) (warm-up, or runs without a clock): 0, or -1 at
 * the first that failed. */
int bench_repeat(long n, bench_run_fn run, void *arg);

/*
 * The timed runs of `loom-bench <name>`: n calls of run(arg), each one's
 * wall time, CPU time of the process (user + system, all threads, read
 * by cpu_us; NULL: CLOCK_PROCESS_CPUTIME_ID) and the fake's (on port)
 * busy time in µs into wall[i], cpu[i] and busy[i]. Each run must make
 * want requests to the fake, else it is said and the measure fails.
 * 0, or -1.
 */
int bench_measure(const char *name, int port, long n, long want,
                  bench_run_fn run, void *arg, double (*cpu_us)(void),
                  double *wall, double *cpu, double *busy);

/*
 * Runs with heap accounting (loom-bench-mem): n calls of run(arg), each
 * one's peak heap above what was live when it started into peak[i].
 * 0, or -1.
 */
int bench_measure_memory(long n, bench_run_fn run, void *arg, double *peak);

/*
 * Whether a run's tool records (loom_run_tool_records) are want calls
 * that all ran and succeeded (a call skipped as a repeat, or failed, would
 * make the run cheaper than the work it stands for). 1, or 0 with a
 * message on stderr.
 */
int bench_tool_records_ok(const json_t *records, long want);

/*
 * Heap accounting (bench_mem.c), in the loom-bench-mem build only:
 * enabled() is 1 there, 0 in loom-bench (where the others answer 0).
 * live: bytes of heap blocks allocated and not freed, every thread;
 * reset_peak: sets the high-water mark to live and returns it; peak: the
 * highest live since.
 */
int bench_mem_enabled(void);
long bench_mem_live(void);
long bench_mem_reset_peak(void);
long bench_mem_peak(void);

#endif
