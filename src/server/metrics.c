/*
 * Metrics in the Prometheus text exposition format (version 0.0.4) for
 * GET /metrics: requests by route template and status, run durations,
 * upstream latency and errors by provider, tool calls by name and
 * outcome, tools the model did not call again after they failed, tokens
 * by model and kind, cost by model, store failures and
 * retries, active runs and streams.
 *
 * Counters live in small families of label sets under one mutex: samples
 * are few per request, so a lock is simpler than per-series atomics and
 * never contended for long. Label values that come from outside (tool
 * names a model invents, model names a client sends) are bounded: a
 * family holds at most MAX_SERIES label sets, and samples past that are
 * counted under the same labels with every value "other". Route labels
 * are templates ("/v1/runs/{id}"), never raw ids.
 *
 * Upstream calls are measured by wrapping each provider: the wrapper
 * times complete() and classifies its failure.
 */
#include "core/clock.h"
#include "core/error.h"
#include "server/srvpriv.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SERIES 1000
#define MAX_LABELS 3

static const double duration_buckets[] = {0.05, 0.1, 0.25, 0.5, 1,  2.5,
                                          5,    10,  30,   60,  120, 300};
#define NBUCKETS (sizeof(duration_buckets) / sizeof(duration_buckets[0]))

typedef struct {
    char *labels; /* rendered: a="x",b="y" */
    double value;
    uint64_t buckets[NBUCKETS];
    uint64_t count;
} series;

typedef struct {
    const char *name;
    const char *help;
    int histogram;
    const char *label_names[MAX_LABELS];
    series *s;
    size_t n, cap;
} family;

enum {
    F_REQUESTS,
    F_REQUEST_SECONDS,
    F_RUNS,
    F_RUN_SECONDS,
    F_UPSTREAM_REQUESTS,
    F_UPSTREAM_SECONDS,
    F_UPSTREAM_ERRORS,
    F_TOOLS,
    F_TOOLS_ABANDONED,
    F_TOKENS,
    F_COST,
    F_STORE_ERRORS,
    F_STORE_RETRIES,
    NFAMILIES
};

struct srv_metrics {
    pthread_mutex_t lock;
    family f[NFAMILIES];
};

/* The families, one or two lines each, as written. */
/* clang-format off */
static const family templates[NFAMILIES] = {
    {"loom_http_requests_total", "HTTP requests by method, route and status",
     0, {"method", "route", "status"}, NULL, 0, 0},
    {"loom_http_request_duration_seconds",
     "HTTP request durations by route (streams last as long as their run)",
     1, {"route", NULL, NULL}, NULL, 0, 0},
    {"loom_runs_total", "Runs ended, by final status", 0,
     {"status", NULL, NULL}, NULL, 0, 0},
    {"loom_run_duration_seconds", "Run durations, start to stored turn", 1,
     {"status", NULL, NULL}, NULL, 0, 0},
    {"loom_upstream_requests_total", "Model calls by provider", 0,
     {"provider", NULL, NULL}, NULL, 0, 0},
    {"loom_upstream_duration_seconds",
     "Model call durations by provider (retries included)", 1,
     {"provider", NULL, NULL}, NULL, 0, 0},
    {"loom_upstream_errors_total", "Failed model calls by provider and kind",
     0, {"provider", "kind", NULL}, NULL, 0, 0},
    {"loom_tool_calls_total",
     "Tool calls by tool and outcome (completed, or the failing stage)", 0,
     {"tool", "outcome", NULL}, NULL, 0, 0},
    {"loom_tools_abandoned_after_error_total",
     "Tools that failed in one turn and that the next model call did not "
     "call again, by tool", 0, {"tool", NULL, NULL}, NULL, 0, 0},
    {"loom_tokens_total", "Tokens by model and kind", 0,
     {"model", "kind", NULL}, NULL, 0, 0},
    {"loom_cost_micros_total",
     "Cost of priced model calls in micro-dollars (1e-6 USD), by model", 0,
     {"model", NULL, NULL}, NULL, 0, 0},
    {"loom_store_errors_total",
     "Store calls of runs that failed after their retries, by operation "
     "(save_turn: a turn not stored)",
     0, {"op", NULL, NULL}, NULL, 0, 0},
    {"loom_store_retries_total",
     "Store calls of runs retried after LOOM_EIO (busy, locked, disk "
     "full), by operation",
     0, {"op", NULL, NULL}, NULL, 0, 0},
};
/* clang-format on */

int srv__metrics_new(srv_metrics **out)
{
    srv_metrics *m = calloc(1, sizeof(*m));

    *out = NULL;
    if (!m)
        return loom__error_oom();
    pthread_mutex_init(&m->lock, NULL);
    memcpy(m->f, templates, sizeof(templates));
    *out = m;
    return 0;
}

void srv__metrics_free(srv_metrics *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < NFAMILIES; i++) {
        for (size_t j = 0; j < m->f[i].n; j++)
            free(m->f[i].s[j].labels);
        free(m->f[i].s);
    }
    pthread_mutex_destroy(&m->lock);
    free(m);
}

/* Appends a label value escaped as the exposition format wants. */
static void put_escaped(loom_buf *b, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\')
            loom_buf_puts(b, "\\\\");
        else if (*v == '"')
            loom_buf_puts(b, "\\\"");
        else if (*v == '\n')
            loom_buf_puts(b, "\\n");
        else
            loom_buf_putc(b, *v);
    }
}

/* Renders family f's labels with values vals (NULL values as ""). */
static char *render_labels(const family *f, const char *const *vals)
{
    loom_buf b = LOOM_BUF_INIT(4096);

    for (size_t i = 0; i < MAX_LABELS && f->label_names[i]; i++) {
        loom_buf_printf(&b, "%s%s=\"", i ? "," : "", f->label_names[i]);
        put_escaped(&b, vals[i] ? vals[i] : "");
        loom_buf_putc(&b, '"');
    }
    return loom_buf_detach(&b);
}

/* Whether r is what render_labels writes for vals: compared in place,
 * so a sample of a known series renders nothing. */
static int labels_match(const family *f, const char *r, const char *const *vals)
{
    for (size_t i = 0; i < MAX_LABELS && f->label_names[i]; i++) {
        const char *v = vals[i] ? vals[i] : "";
        size_t n = strlen(f->label_names[i]);
        if (i && *r++ != ',')
            return 0;
        if (strncmp(r, f->label_names[i], n) != 0 || r[n] != '=' ||
            r[n + 1] != '"')
            return 0;
        for (r += n + 2; *v; v++) {
            const char *e = *v == '\\'   ? "\\\\"
                            : *v == '"'  ? "\\\""
                            : *v == '\n' ? "\\n"
                                         : NULL;
            if (!e && *r++ != *v)
                return 0;
            if (e && (r[0] != e[0] || r[1] != e[1]))
                return 0;
            r += e ? 2 : 0;
        }
        if (*r++ != '"')
            return 0;
    }
    return *r == '\0';
}

/* The series of f with these label values, created if new; lock held.
 * NULL when out of memory. */
static series *get_series(family *f, const char *const *vals)
{
    static const char *const other[MAX_LABELS] = {"other", "other", "other"};
    char *labels;
    series *s;

    for (size_t i = 0; i < f->n; i++)
        if (labels_match(f, f->s[i].labels, vals))
            return &f->s[i];
    labels = render_labels(f, vals);
    if (!labels)
        return NULL;
    for (size_t i = 0; i < f->n; i++) {
        if (strcmp(f->s[i].labels, labels) == 0) {
            free(labels);
            return &f->s[i];
        }
    }
    if (f->n >= MAX_SERIES) {
        free(labels);
        if (vals == other)
            return NULL;
        return get_series(f, other);
    }
    if (f->n == f->cap) {
        size_t c = f->cap ? f->cap * 2 : 16;
        series *ns = realloc(f->s, c * sizeof(*ns));
        if (!ns) {
            free(labels);
            return NULL;
        }
        f->s = ns;
        f->cap = c;
    }
    s = &f->s[f->n++];
    memset(s, 0, sizeof(*s));
    s->labels = labels;
    return s;
}

static void add(srv_metrics *m, int fam, double v, const char *a,
                const char *b, const char *c)
{
    const char *vals[MAX_LABELS] = {a, b, c};
    family *f = &m->f[fam];
    series *s;

    pthread_mutex_lock(&m->lock);
    if ((s = get_series(f, vals)) != NULL) {
        if (f->histogram) {
            for (size_t i = 0; i < NBUCKETS; i++)
                if (v <= duration_buckets[i])
                    s->buckets[i]++;
            s->count++;
        }
        s->value += v;
    }
    pthread_mutex_unlock(&m->lock);
}

void srv__metrics_request(srv_metrics *m, const char *method,
                          const char *route, unsigned status, double secs)
{
    char st[16];

    snprintf(st, sizeof(st), "%u", status);
    add(m, F_REQUESTS, 1, method, route, st);
    add(m, F_REQUEST_SECONDS, secs, route, NULL, NULL);
}

void srv__metrics_run(srv_metrics *m, const char *status, double secs)
{
    add(m, F_RUNS, 1, status, NULL, NULL);
    add(m, F_RUN_SECONDS, secs, status, NULL, NULL);
}

void srv__metrics_upstream(srv_metrics *m, const char *provider, double secs,
                           const char *error_kind)
{
    add(m, F_UPSTREAM_REQUESTS, 1, provider, NULL, NULL);
    add(m, F_UPSTREAM_SECONDS, secs, provider, NULL, NULL);
    if (error_kind)
        add(m, F_UPSTREAM_ERRORS, 1, provider, error_kind, NULL);
}

void srv__metrics_tool(srv_metrics *m, const char *tool, const char *outcome)
{
    add(m, F_TOOLS, 1, tool ? tool : "", outcome ? outcome : "failed", NULL);
}

void srv__metrics_tools_abandoned(srv_metrics *m, const char *tool, long n)
{
    if (n > 0)
        add(m, F_TOOLS_ABANDONED, (double)n, tool ? tool : "", NULL, NULL);
}

void srv__metrics_tokens(srv_metrics *m, const char *model, const char *kind,
                         long n)
{
    if (n > 0)
        add(m, F_TOKENS, (double)n, model ? model : "", kind, NULL);
}

void srv__metrics_cost(srv_metrics *m, const char *model, long long micros)
{
    if (micros >= 0)
        add(m, F_COST, (double)micros, model ? model : "", NULL, NULL);
}

void srv__metrics_store_error(srv_metrics *m, const char *op)
{
    add(m, F_STORE_ERRORS, 1, op, NULL, NULL);
}

void srv__metrics_store_retry(srv_metrics *m, const char *op)
{
    add(m, F_STORE_RETRIES, 1, op, NULL, NULL);
}

static void render_value(loom_buf *b, double v)
{
    if (v == floor(v) && fabs(v) < 1e15)
        loom_buf_printf(b, "%.0f", v);
    else
        loom_buf_printf(b, "%.6g", v);
}

static void render_family(loom_buf *b, const family *f)
{
    loom_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", f->name, f->help,
                    f->name, f->histogram ? "histogram" : "counter");
    for (size_t i = 0; i < f->n; i++) {
        const series *s = &f->s[i];
        if (!f->histogram) {
            loom_buf_printf(b, "%s{%s} ", f->name, s->labels);
            render_value(b, s->value);
            loom_buf_putc(b, '\n');
            continue;
        }
        for (size_t k = 0; k < NBUCKETS; k++)
            loom_buf_printf(b, "%s_bucket{%s,le=\"%g\"} %llu\n", f->name,
                            s->labels, duration_buckets[k],
                            (unsigned long long)s->buckets[k]);
        loom_buf_printf(b, "%s_bucket{%s,le=\"+Inf\"} %llu\n", f->name,
                        s->labels, (unsigned long long)s->count);
        loom_buf_printf(b, "%s_sum{%s} %.6f\n", f->name, s->labels, s->value);
        loom_buf_printf(b, "%s_count{%s} %llu\n", f->name, s->labels,
                        (unsigned long long)s->count);
    }
}

/* What the store wrote: its commits, group commits (batched / batches:
 * writes a commit) and the WAL's checkpoints and restarts (docs/store.md,
 * "Group commit and checkpoints"). */
static void render_store(loom_buf *b, loom_store *st)
{
    loom_store_stats ss;

    if (!st || loom_store_stats_get(st, &ss) != 0)
        return;
    loom_buf_printf(
        b,
        "# HELP loom_store_commits_total Store transactions committed\n"
        "# TYPE loom_store_commits_total counter\n"
        "loom_store_commits_total %llu\n"
        "# HELP loom_store_batches_total Group commits of queued writes "
        "(turns)\n"
        "# TYPE loom_store_batches_total counter\n"
        "loom_store_batches_total %llu\n"
        "# HELP loom_store_batched_writes_total Writes committed in group "
        "commits\n"
        "# TYPE loom_store_batched_writes_total counter\n"
        "loom_store_batched_writes_total %llu\n"
        "# HELP loom_store_wal_pages Pages in the write-ahead log\n"
        "# TYPE loom_store_wal_pages gauge\n"
        "loom_store_wal_pages %lld\n"
        "# HELP loom_store_checkpoints_total Checkpoints that copied "
        "write-ahead log pages into the database\n"
        "# TYPE loom_store_checkpoints_total counter\n"
        "loom_store_checkpoints_total %llu\n"
        "# HELP loom_store_wal_restarts_total Times the write-ahead log "
        "started over\n"
        "# TYPE loom_store_wal_restarts_total counter\n"
        "loom_store_wal_restarts_total %llu\n"
        "# HELP loom_store_wal_restart_wait_seconds_total Time writes "
        "waited for the write-ahead log to start over\n"
        "# TYPE loom_store_wal_restart_wait_seconds_total counter\n"
        "loom_store_wal_restart_wait_seconds_total %.6f\n",
        (unsigned long long)ss.commits, (unsigned long long)ss.batches,
        (unsigned long long)ss.batched, (long long)ss.wal_pages,
        (unsigned long long)ss.checkpoints, (unsigned long long)ss.wal_restarts,
        ss.wal_restart_seconds);
}

char *srv__metrics_render(srv_server *s)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    srv_metrics *m = s->metrics;
    srv_queue_stats qs;
    size_t nsusp;

    pthread_mutex_lock(&m->lock);
    for (size_t i = 0; i < NFAMILIES; i++)
        render_family(&b, &m->f[i]);
    pthread_mutex_unlock(&m->lock);
    pthread_mutex_lock(&s->susp_lock);
    nsusp = s->nsusp;
    pthread_mutex_unlock(&s->susp_lock);
    loom_buf_printf(&b,
                    "# HELP loom_runs_active Runs executing now\n"
                    "# TYPE loom_runs_active gauge\n"
                    "loom_runs_active %d\n"
                    "# HELP loom_streams_active SSE streams open now\n"
                    "# TYPE loom_streams_active gauge\n"
                    "loom_streams_active %d\n"
                    "# HELP loom_connections_waiting Connections suspended "
                    "waiting for a run\n"
                    "# TYPE loom_connections_waiting gauge\n"
                    "loom_connections_waiting %zu\n",
                    srv__runs_active(s), atomic_load(&s->streams), nsusp);
    srv__queue_stats(s, &qs);
    loom_buf_printf(&b,
                    "# HELP loom_runs_queued Requests waiting for a run "
                    "slot\n"
                    "# TYPE loom_runs_queued gauge\n"
                    "loom_runs_queued %d\n"
                    "# HELP loom_queue_refused_total Requests refused a "
                    "run slot with 503, by why\n"
                    "# TYPE loom_queue_refused_total counter\n"
                    "loom_queue_refused_total{reason=\"queue_full\"} %llu\n"
                    "loom_queue_refused_total{reason=\"identity_full\"} "
                    "%llu\n"
                    "loom_queue_refused_total{reason=\"wait_over\"} %llu\n",
                    qs.waiting, qs.refused_full, qs.refused_identity,
                    qs.timed_out);
    render_store(&b, s->store);
    if (!b.ptr)
        return NULL;
    return loom_buf_detach(&b);
}

/* ---- the measuring provider ---------------------------------------------- */

typedef struct {
    loom_provider base;
    loom_provider *inner;
    srv_metrics *m;
} measured;

static int measured_complete(loom_provider *p, const loom_llm_request *req,
                             loom_llm_event_cb cb, void *payload,
                             loom_llm_response *resp, loom_cancel *cancel)
{
    measured *mp = (measured *)p;
    long long t0 = loom__mono_ms();
    const char *kind = NULL;
    int rc;

    rc = loom_provider_complete(mp->inner, req, cb, payload, resp, cancel);
    if (rc != 0 && rc != LOOM_ECANCELED)
        kind = resp->error.kind != LOOM_UPSTREAM_NONE
                   ? loom_upstream_kind_name(resp->error.kind)
                   : loom_error_name(rc);
    srv__metrics_upstream(mp->m, mp->base.name,
                          (double)(loom__mono_ms() - t0) / 1000.0, kind);
    return rc;
}

static void measured_free(loom_provider *p)
{
    measured *mp = (measured *)p;

    loom_provider_free(mp->inner);
    free(mp->base.name);
    free(mp);
}

static const loom_provider_vtable measured_vt = {
    .version = LOOM_PROVIDER_VTABLE_VERSION,
    .complete = measured_complete,
    .free = measured_free};

int srv__metrics_provider(loom_provider **out, srv_metrics *m,
                          loom_provider *inner)
{
    measured *mp = calloc(1, sizeof(*mp));

    *out = NULL;
    if (!mp || !(mp->base.name = strdup(inner->name ? inner->name : ""))) {
        free(mp);
        loom_provider_free(inner);
        return loom__error_oom();
    }
    mp->base.vt = &measured_vt;
    mp->inner = inner;
    mp->m = m;
    *out = &mp->base;
    return 0;
}
