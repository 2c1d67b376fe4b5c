/*
 * Tool execution for one turn (see toolexec.h). Parallelism uses a few
 * short-lived threads per turn that claim jobs from a shared counter; they
 * post "started" and "done" notices to a queue the caller's thread drains,
 * so the sink sees events from one thread only, in the order tools
 * actually start and finish. A single job (the common case) runs inline
 * with no thread at all.
 */
#include "agent/toolexec.h"
#include "core/error.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define RECEIVED_QUOTE_MAX 500

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Cuts s to at most max bytes on a UTF-8 boundary. Returns the new length. */
static size_t utf8_cut(const char *s, size_t len, size_t max)
{
    if (len <= max)
        return len;
    while (max > 0 && ((unsigned char)s[max] & 0xC0) == 0x80)
        max--;
    return max;
}

static void fail(loom__tool_job *job, const char *stage, const char *error,
                 const char *output, size_t max_error)
{
    size_t elen = strlen(error), cut = utf8_cut(error, elen, max_error);

    job->done = 1;
    job->failed = 1;
    job->stage = stage;
    free(job->error);
    free(job->output);
    job->error = strndup(error, cut);
    if (output) {
        job->output = strdup(output);
    } else if (cut < elen) {
        if (asprintf(&job->output, "Error: %s... [error truncated: %zu of "
                     "%zu bytes shown]", job->error ? job->error : "",
                     cut, elen) < 0)
            job->output = NULL;
    } else if (asprintf(&job->output, "Error: %s", error) < 0) {
        job->output = NULL;
    }
}

void loom__tool_job_prepare(loom__tool_job *job, const loom_tool *tool,
                            const char *available,
                            const loom__tool_exec_opts *opts)
{
    const char *name = job->call->name ? job->call->name : "";
    const char *raw = job->call->arguments ? job->call->arguments : "";
    char *msg = NULL, *out = NULL;
    json_error_t jerr;

    job->tool = tool;
    if (!tool) {
        if (asprintf(&msg, "Unknown tool '%s'. Available tools: %s.", name,
                     available && *available ? available : "none") >= 0)
            fail(job, "lookup", msg, NULL, opts->max_error);
        goto done;
    }
    /* Models send "" for tools without arguments: that means {}. So does
     * "{}" itself, the usual case, which needs no parser. */
    raw += strspn(raw, " \t\r\n");
    job->args = *raw && strcmp(raw, "{}") != 0
                    ? json_loads(raw, JSON_DECODE_ANY, &jerr)
                    : json_object();
    if (!job->args) {
        size_t rlen = strlen(job->call->arguments);
        int q = (int)utf8_cut(job->call->arguments, rlen, RECEIVED_QUOTE_MAX);
        if (asprintf(&msg, "invalid JSON in the arguments of '%s': %s",
                     name, jerr.text) >= 0 &&
            asprintf(&out, "Error: The arguments for tool '%s' are not "
                     "valid JSON (%s). Received: %.*s%s. Call the tool "
                     "again with a JSON object.", name, jerr.text, q,
                     job->call->arguments, (size_t)q < rlen ? "..." : "") >=
                0)
            fail(job, "arguments", msg, out, opts->max_error);
        goto done;
    }
    if (loom_schema_validate(tool->parameters, job->args, &msg) != 0) {
        char *m = msg;
        msg = NULL;
        if (asprintf(&msg, "invalid arguments for '%s': %s", name,
                     m ? m : loom_error_last()) >= 0 &&
            asprintf(&out, "Error: Invalid arguments for tool '%s': %s",
                     name, m ? m : loom_error_last()) >= 0)
            fail(job, "validation", msg, out, opts->max_error);
        free(m);
        goto done;
    }
done:
    free(msg);
    free(out);
}

/* Runs one job on the current thread. */
static void run_job(loom__tool_job *job, const loom__tool_exec_opts *opts)
{
    loom_tool_ctx ctx;
    loom_buf out, summary;
    double t0 = now_ms();
    int rc;

    memset(&ctx, 0, sizeof(ctx));
    ctx.call_id = job->call->id;
    ctx.tool_name = job->tool->name;
    ctx.cancel = opts->cancel;
    ctx.settings = opts->settings
                       ? json_object_get(opts->settings, job->tool->name)
                       : NULL;
    loom_buf_init(&out, opts->max_result);
    loom_buf_init(&summary, LOOM_TOOL_SUMMARY_MAX);
    ctx.summary = &summary;
    loom_error_clear();
    rc = job->tool->execute(job->args, &ctx, &out, job->tool->payload);
    job->duration_ms = now_ms() - t0;
    job->output_size = out.len;
    if (rc == LOOM_ETOOLARGE && out.len > 0) {
        /* The tool filled its whole allowance: keep what fits, say so. */
        size_t keep = out.len;
        while (keep > 0 && ((unsigned char)out.ptr[keep - 1] & 0xC0) == 0x80)
            keep--;
        if (keep > 0 && ((unsigned char)out.ptr[keep - 1] & 0xC0) == 0xC0)
            keep--; /* drop a possibly incomplete multi-byte character */
        job->truncated = 1;
        if (asprintf(&job->output, "%.*s\n[output truncated at %zu bytes]",
                     (int)keep, out.ptr, opts->max_result) < 0)
            job->output = NULL;
        job->done = 1;
    } else if (rc < 0) {
        const char *m = out.len ? out.ptr : loom_error_last();
        char *generic = NULL;
        if (!m || !*m) {
            if (asprintf(&generic, "tool '%s' failed without a message (%s)",
                         job->tool->name, loom_error_name(rc)) < 0)
                generic = NULL;
            m = generic ? generic : "tool failed";
        }
        fail(job, "execution", m, NULL, opts->max_error);
        free(generic);
    } else {
        job->output = loom_buf_detach(&out);
        job->done = 1;
    }
    /* A summary stands for a result: a failure has none. */
    if (!job->failed && summary.len)
        job->summary = loom_buf_detach(&summary);
    if (!job->output && job->done)
        job->output = strdup("Error: out of memory while storing the result");
    loom_buf_free(&out);
    loom_buf_free(&summary);
}

typedef struct {
    loom__tool_job *job;
    int done;
} notice;

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    loom__tool_job *jobs;
    size_t n;
    size_t next;  /* next job index to claim */
    notice *queue; /* 2 notices per job at most */
    size_t qhead, qtail;
    const loom__tool_exec_opts *opts;
} pool;

static void post(pool *p, loom__tool_job *job, int done)
{
    pthread_mutex_lock(&p->mu);
    p->queue[p->qtail].job = job;
    p->queue[p->qtail].done = done;
    p->qtail++;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

static void *worker(void *arg)
{
    pool *p = arg;

    for (;;) {
        loom__tool_job *job = NULL;
        pthread_mutex_lock(&p->mu);
        while (p->next < p->n && p->jobs[p->next].done)
            p->next++;
        if (p->next < p->n)
            job = &p->jobs[p->next++];
        pthread_mutex_unlock(&p->mu);
        if (!job)
            return NULL;
        post(p, job, 0);
        run_job(job, p->opts);
        post(p, job, 1);
    }
}

int loom__tools_execute(loom__tool_job *jobs, size_t n, int width,
                        const loom__tool_exec_opts *opts,
                        loom__tool_notice_fn notice_cb, void *payload)
{
    pthread_t *threads = NULL;
    size_t todo = 0, started = 0, finished = 0;
    pool p;
    int rc = 0;

    for (size_t i = 0; i < n; i++)
        todo += !jobs[i].done;
    if (todo == 0)
        return 0;
    if (width < 1)
        width = 1;
    if (todo == 1 || width == 1) {
        for (size_t i = 0; i < n; i++) {
            if (jobs[i].done)
                continue;
            notice_cb(&jobs[i], 0, payload);
            run_job(&jobs[i], opts);
            notice_cb(&jobs[i], 1, payload);
        }
        return 0;
    }
    if ((size_t)width > todo)
        width = (int)todo;
    memset(&p, 0, sizeof(p));
    p.jobs = jobs;
    p.n = n;
    p.opts = opts;
    p.queue = calloc(2 * todo, sizeof(*p.queue));
    threads = calloc((size_t)width, sizeof(*threads));
    if (!p.queue || !threads) {
        rc = loom__error_oom();
        goto fail_rest;
    }
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.cv, NULL);
    for (int i = 0; i < width; i++) {
        if (pthread_create(&threads[started], NULL, worker, &p) != 0)
            break;
        started++;
    }
    if (started == 0) {
        rc = loom__error_set(LOOM_ERROR, "could not start tool threads");
    } else {
        while (finished < todo) {
            notice nt;
            pthread_mutex_lock(&p.mu);
            while (p.qhead == p.qtail)
                pthread_cond_wait(&p.cv, &p.mu);
            nt = p.queue[p.qhead++];
            pthread_mutex_unlock(&p.mu);
            notice_cb(nt.job, nt.done, payload);
            finished += nt.done;
        }
    }
    for (size_t i = 0; i < started; i++)
        pthread_join(threads[i], NULL);
    pthread_cond_destroy(&p.cv);
    pthread_mutex_destroy(&p.mu);
fail_rest:
    for (size_t i = 0; i < n; i++) {
        if (!jobs[i].done) {
            fail(&jobs[i], "execution", loom_error_last(), NULL,
                 opts->max_error);
            notice_cb(&jobs[i], 1, payload);
        }
    }
    free(threads);
    free(p.queue);
    return rc;
}

void loom__tool_job_clear(loom__tool_job *job)
{
    json_decref(job->args);
    free(job->error);
    free(job->output);
    free(job->summary);
    memset(job, 0, sizeof(*job));
}
