/*
 * The state `loom research` keeps of a research run and its two
 * renderings: a redrawable screen region for a terminal and plain
 * progress lines otherwise (research_view.h). Text from outside (the
 * plan, tasks, errors) is cleaned once, when it enters the state, so
 * both renderings only ever print what cli_clean() let
 * through.
 */
#include "cli/research_view.h"
#include "cli/clean.h"

#include "core/utf8.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define TASK_SHOWN 100  /* bytes of a task on a plain line */
#define ERROR_SHOWN 200 /* bytes of an error on a plain line */
#define LINE_BYTES 1024 /* a rendered line before it is cut to the width */
#define PLAN_ROWS 6     /* plan lines shown on a terminal at most */

static const char *str(const json_t *data, const char *key)
{
    const char *s = json_string_value(json_object_get(data, key));
    return s ? s : "";
}

void research_view_init(research_view *v, int64_t now_ms)
{
    memset(v, 0, sizeof(*v));
    v->started_ms = now_ms;
}

void research_view_free(research_view *v)
{
    for (size_t i = 0; i < v->nrs; i++) {
        free(v->rs[i].call_id);
        free(v->rs[i].task);
        free(v->rs[i].error);
    }
    free(v->rs);
    free(v->plan);
    free(v->reason);
    memset(v, 0, sizeof(*v));
}

/* The researcher of the research_agent call id (1-based), or 0. */
static size_t researcher_of(const research_view *v, const char *call_id)
{
    for (size_t i = 0; i < v->nrs; i++)
        if (strcmp(v->rs[i].call_id, call_id) == 0)
            return i + 1;
    return 0;
}

static rv_change researcher_started(research_view *v, const loom_event *ev,
                                    int64_t now_ms)
{
    const char *task = str(json_object_get(ev->data, "arguments"), "task");
    rv_researcher *rs, *r;

    if (v->nrs >= RV_MAX_RESEARCHERS)
        return RV_NONE;
    rs = realloc(v->rs, (v->nrs + 1) * sizeof(*rs));
    if (!rs)
        return RV_NONE;
    v->rs = rs;
    r = &rs[v->nrs];
    memset(r, 0, sizeof(*r));
    r->call_id = strdup(str(ev->data, "id"));
    r->task = cli_clean(task, 0);
    if (!r->call_id || !r->task) {
        free(r->call_id);
        free(r->task);
        return RV_NONE;
    }
    r->cycle = v->cycle;
    r->status = RV_RUNNING;
    r->started_ms = now_ms;
    v->last = ++v->nrs;
    return RV_STARTED;
}

static rv_change researcher_ended(research_view *v, const loom_event *ev)
{
    size_t k = researcher_of(v, str(ev->data, "id"));
    rv_researcher *r;

    if (!k)
        return RV_NONE;
    r = &v->rs[k - 1];
    r->seconds =
        json_number_value(json_object_get(ev->data, "duration_ms")) / 1000.0;
    if (ev->type == LOOM_EV_TOOL_COMPLETED) {
        r->status = RV_DONE;
    } else {
        r->status = RV_FAILED;
        free(r->error);
        r->error = cli_clean(str(ev->data, "error"), 0);
    }
    v->last = k;
    return RV_ENDED;
}

/* Every model call of the tree reports its usage once, in its own run:
 * their sum is what the research spent. */
static rv_change add_usage(research_view *v, const json_t *u)
{
    const json_t *cost = json_object_get(u, "cost_micros");

    v->tokens += (long)json_integer_value(json_object_get(u, "total_tokens"));
    v->usages++;
    if (json_is_integer(cost)) {
        v->cost_micros += json_integer_value(cost);
        v->priced++;
    }
    return RV_SPENT;
}

static rv_change add_plan(research_view *v, const char *delta)
{
    char *d = cli_clean(delta, CLI_KEEP_NL), *plan;
    size_t n = d ? strlen(d) : 0;

    if (!n || !(plan = realloc(v->plan, v->plan_len + n + 1))) {
        free(d);
        return RV_NONE;
    }
    memcpy(plan + v->plan_len, d, n + 1);
    v->plan = plan;
    v->plan_len += n;
    free(d);
    return RV_PLAN;
}

static rv_change ended(research_view *v, const loom_event *ev)
{
    const json_t *r = json_object_get(ev->data, "research");

    v->ended = 1;
    v->writing = 0;
    if (ev->type == LOOM_EV_RUN_FAILED) {
        v->run_failed = strcmp(str(ev->data, "status"), "cancelled") ? 1 : 2;
        return RV_FAILED_RUN;
    }
    if (!strcmp(str(ev->data, "status"), "needs_input")) {
        v->needs_input = 1;
        return RV_COMPLETED;
    }
    free(v->reason);
    v->reason = cli_clean(str(ev->data, "report_reason"), 0);
    v->cycles_done = (long)json_integer_value(json_object_get(r, "cycles"));
    v->researchers =
        (long)json_integer_value(json_object_get(r, "researchers"));
    v->failed = (long)json_integer_value(json_object_get(r, "failed"));
    return RV_COMPLETED;
}

rv_change research_view_apply(research_view *v, const loom_event *ev,
                              int64_t now_ms)
{
    const char *name = str(ev->data, "name");
    int depth = loom_event_depth(ev);

    if (ev->type == LOOM_EV_USAGE)
        return add_usage(v, ev->data);
    if (depth == 1 && ev->type == LOOM_EV_TOOL_METRIC) {
        size_t k = researcher_of(v, str(ev->data, "parent_call_id"));
        if (!k)
            return RV_NONE;
        v->rs[k - 1].sources +=
            (long)json_array_size(json_object_get(ev->data, "documents"));
        v->last = k;
        return RV_SPENT;
    }
    if (depth != 0)
        return RV_NONE;
    switch (ev->type) {
    case LOOM_EV_RESEARCH_PLAN:
        return add_plan(v, str(ev->data, "delta"));
    case LOOM_EV_RESEARCH_CYCLE:
        v->cycle = (int)json_integer_value(json_object_get(ev->data, "cycle"));
        v->max_cycles =
            (int)json_integer_value(json_object_get(ev->data, "max_cycles"));
        return RV_CYCLE;
    case LOOM_EV_RESEARCH_BRANCH:
        v->branch_cycle =
            (int)json_integer_value(json_object_get(ev->data, "cycle"));
        v->branch_researchers =
            (int)json_integer_value(json_object_get(ev->data, "researchers"));
        return RV_BRANCH;
    case LOOM_EV_TOOL_STARTED:
        if (!strcmp(name, "research_agent"))
            return researcher_started(v, ev, now_ms);
        if (!strcmp(name, "generate_report") && !v->writing) {
            v->writing = 1;
            return RV_WRITING;
        }
        return RV_NONE;
    case LOOM_EV_MESSAGE_DELTA:
        /* A report forced without generate_report: its first words. */
        if (v->cycle > 0 && !v->writing) {
            v->writing = 1;
            return RV_WRITING;
        }
        return RV_NONE;
    case LOOM_EV_TOOL_COMPLETED:
    case LOOM_EV_TOOL_FAILED:
        return !strcmp(name, "research_agent") ? researcher_ended(v, ev)
                                               : RV_NONE;
    case LOOM_EV_CITATION:
        v->cited++;
        return RV_SPENT;
    case LOOM_EV_RUN_COMPLETED:
    case LOOM_EV_RUN_FAILED:
        return ended(v, ev);
    default:
        return RV_NONE;
    }
}

/* ---- on a terminal: lines -------------------------------------------- */

typedef struct {
    char **line;
    size_t n, cap;
    int failed;
} lines;

/* Appends a formatted line, cut to cols - 1 characters. */
static void add(lines *ls, int cols, const char *fmt, ...)
{
    char buf[LINE_BYTES], *copy;
    size_t max = cols > 1 ? (size_t)cols - 1 : 1, len, i, chars = 0;
    va_list ap;

    if (ls->failed)
        return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    len = strlen(buf);
    if (len == sizeof(buf) - 1) /* cut: no half character at the end */
        len = loom__utf8_cut(buf, len, len - 1);
    for (i = 0; i < len; i++)
        if (((unsigned char)buf[i] & 0xC0) != 0x80 && ++chars > max)
            break;
    buf[i] = '\0';
    if (ls->n == ls->cap) {
        size_t cap = ls->cap ? 2 * ls->cap : 32;
        char **l = realloc(ls->line, cap * sizeof(*l));
        if (!l) {
            ls->failed = 1;
            return;
        }
        ls->line = l;
        ls->cap = cap;
    }
    if (!(copy = strdup(buf))) {
        ls->failed = 1;
        return;
    }
    ls->line[ls->n++] = copy;
}

void research_view_lines_free(char **l, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(l[i]);
    free(l);
}

/* What was spent, as the status and summary lines show it, in buf. */
static const char *spent(const research_view *v, char *buf, size_t cap)
{
    int n = snprintf(buf, cap, "%ld tokens", v->tokens);

    if (v->usages && v->priced == v->usages && n > 0 && (size_t)n < cap)
        snprintf(buf + n, cap - (size_t)n, ", $%.4f",
                 (double)v->cost_micros / 1e6);
    return buf;
}

static double elapsed_s(const rv_researcher *r, int64_t now_ms)
{
    return r->status == RV_RUNNING ? (double)(now_ms - r->started_ms) / 1000.0
                                   : r->seconds;
}

static void status_line(const research_view *v, int64_t now_ms, int cols,
                        lines *ls)
{
    static const char *const names[] = {"running", "done", "failed"};
    char phase[64], who[128] = "", money[64];
    size_t count[3] = {0, 0, 0};
    int n = 0;

    for (size_t i = 0; i < v->nrs; i++)
        count[v->rs[i].status]++;
    if (v->ended)
        snprintf(phase, sizeof(phase), "%s",
                 v->needs_input       ? "a question"
                 : v->run_failed == 2 ? "cancelled"
                 : v->run_failed      ? "failed"
                                      : "done");
    else if (v->writing)
        snprintf(phase, sizeof(phase), "writing the report");
    else if (v->cycle)
        snprintf(phase, sizeof(phase), "cycle %d/%d", v->cycle, v->max_cycles);
    else
        snprintf(phase, sizeof(phase), "planning");
    if (v->nrs) {
        n = snprintf(who, sizeof(who), ", %zu researcher%s (", v->nrs,
                     v->nrs == 1 ? "" : "s");
        for (int s = 0, first = 1; s < 3 && n > 0; s++) {
            if (!count[s])
                continue;
            n += snprintf(who + n, sizeof(who) - (size_t)n, "%s%zu %s",
                          first ? "" : ", ", count[s], names[s]);
            first = 0;
        }
        snprintf(who + n, sizeof(who) - (size_t)n, ")");
    }
    add(ls, cols, "research: %s%s, %s, %.0f s", phase, who,
        spent(v, money, sizeof(money)),
        (double)(now_ms - v->started_ms) / 1000.0);
}

/* The plan's lines (non-empty ones), at most max of them with a last one
 * counting the rest when they do not fit. */
static void plan_lines(const research_view *v, int cols, size_t max, lines *ls)
{
    const char *p = v->plan;
    size_t total = 0, shown = 0;

    if (!p || max < 2)
        return;
    for (const char *q = p; *q; q++)
        if (*q != '\n' && (q == p || q[-1] == '\n'))
            total++;
    add(ls, cols, "plan:");
    while (*p) {
        const char *nl = strchr(p, '\n');
        size_t len = nl ? (size_t)(nl - p) : strlen(p);
        if (len) {
            if (shown + 1 == max - 1 && total > max - 1) {
                add(ls, cols, "  (%zu more lines)", total - shown);
                return;
            }
            add(ls, cols, "  %.*s", (int)len, p);
            shown++;
        }
        p += len + (nl != NULL);
    }
}

/* The cycles and their researchers, oldest first. */
static void cycle_lines(const research_view *v, int64_t now_ms, int cols,
                        lines *ls)
{
    static const char *const names[] = {"[running]", "[done]", "[failed]"};

    for (int c = 0; c <= v->cycle; c++) {
        size_t in = 0;
        for (size_t i = 0; i < v->nrs; i++)
            in += v->rs[i].cycle == c;
        if (c > 0 && in)
            add(ls, cols, "cycle %d/%d: %zu researcher%s", c, v->max_cycles, in,
                in == 1 ? "" : "s");
        else if (c > 0)
            add(ls, cols, "cycle %d/%d", c, v->max_cycles);
        for (size_t i = 0; i < v->nrs; i++) {
            const rv_researcher *r = &v->rs[i];
            if (r->cycle != c)
                continue;
            add(ls, cols, "  %-9s %6.1f s %4ld source%s  %zu: %s%s%s",
                names[r->status], elapsed_s(r, now_ms), r->sources,
                r->sources == 1 ? " " : "s", i + 1, r->task,
                r->error ? " -- " : "", r->error ? r->error : "");
        }
    }
    if (v->writing)
        add(ls, cols, "writing the report");
}

size_t research_view_render(const research_view *v, int64_t now_ms, int cols,
                            int rows, char ***out)
{
    lines head = {0}, plan = {0}, body = {0};
    size_t room, skip = 0, n;
    char **all;

    *out = NULL;
    if (rows < 1)
        return 0;
    status_line(v, now_ms, cols, &head);
    room = (size_t)rows - 1;
    cycle_lines(v, now_ms, cols, &body);
    /* The plan gets up to a third of the room (PLAN_ROWS lines at most),
     * more when the cycles leave it free. */
    n = room / 3 > PLAN_ROWS + 1 ? PLAN_ROWS + 1 : room / 3;
    if (body.n < room && room - body.n > n)
        n = room - body.n > PLAN_ROWS + 1 ? PLAN_ROWS + 1 : room - body.n;
    plan_lines(v, cols, n, &plan);
    room -= plan.n;
    if (body.n > room) {
        /* The oldest lines give way, one more for the line saying so. */
        skip = room ? body.n - room + 1 : body.n;
        if (room) {
            char buf[64];
            snprintf(buf, sizeof(buf), "  (%zu earlier lines)", skip);
            add(&plan, cols, "%s", buf);
        }
    }
    n = head.n + plan.n + (body.n - skip);
    all = head.failed || plan.failed || body.failed
              ? NULL
              : malloc((n ? n : 1) * sizeof(*all));
    if (all) {
        /* A list with no lines has no array: memcpy takes no NULL. */
        if (head.n)
            memcpy(all, head.line, head.n * sizeof(*all));
        if (plan.n)
            memcpy(all + head.n, plan.line, plan.n * sizeof(*all));
        if (body.n > skip)
            memcpy(all + head.n + plan.n, body.line + skip,
                   (body.n - skip) * sizeof(*all));
        for (size_t i = 0; i < skip; i++)
            free(body.line[i]);
        free(head.line);
        free(plan.line);
        free(body.line);
        *out = all;
        return n;
    }
    research_view_lines_free(head.line, head.n);
    research_view_lines_free(plan.line, plan.n);
    research_view_lines_free(body.line, body.n);
    return 0;
}

/* ---- without a terminal: plain lines ---------------------------------- */

void research_view_spent(const research_view *v, FILE *f)
{
    char buf[64];

    fputs(spent(v, buf, sizeof(buf)), f);
}

/* Prints s on one line, at most max bytes (not cutting a character),
 * then "..." when it was longer. */
static void print_short(const char *s, size_t max, FILE *f)
{
    size_t len = strlen(s), n = loom__utf8_cut(s, len, max);

    fwrite(s, 1, n, f);
    if (n < len)
        fputs("...", f);
}

/* Ends the plan's text with a newline before another line. */
static void end_plan(research_view *v, FILE *f)
{
    if (v->plan_shown && !v->plan_closed && v->plan[v->plan_shown - 1] != '\n')
        fputc('\n', f);
    v->plan_closed = 1;
}

static void summary(const research_view *v, FILE *f)
{
    const char *reason = v->reason ? v->reason : "";

    fprintf(f, "report%s%s%s: %ld cycle%s, %ld researchers",
            *reason ? " (" : "", reason, *reason ? ")" : "", v->cycles_done,
            v->cycles_done == 1 ? "" : "s", v->researchers);
    if (v->failed)
        fprintf(f, " (%ld failed)", v->failed);
    fprintf(f, ", %d source%s cited; ", v->cited, v->cited == 1 ? "" : "s");
    research_view_spent(v, f);
    fputc('\n', f);
}

void research_view_plain(research_view *v, rv_change c, FILE *f)
{
    const rv_researcher *r = v->last ? &v->rs[v->last - 1] : NULL;

    switch (c) {
    case RV_PLAN:
        if (!v->plan_shown && v->plan_len)
            fputs("plan:\n", f);
        fputs(v->plan + v->plan_shown, f);
        v->plan_shown = v->plan_len;
        return;
    case RV_CYCLE:
        end_plan(v, f);
        fprintf(f, "cycle %d/%d: ", v->cycle, v->max_cycles);
        research_view_spent(v, f);
        fputs(" so far\n", f);
        return;
    case RV_BRANCH:
        fprintf(f, "cycle %d: %d researchers in parallel\n", v->branch_cycle,
                v->branch_researchers);
        return;
    case RV_STARTED:
        fprintf(f, "researcher %zu: started: ", v->last);
        print_short(r->task, TASK_SHOWN, f);
        fputc('\n', f);
        return;
    case RV_ENDED:
        if (r->status == RV_DONE) {
            fprintf(f, "researcher %zu: done in %.1f s, %ld source%s\n",
                    v->last, r->seconds, r->sources,
                    r->sources == 1 ? "" : "s");
            return;
        }
        fprintf(f, "researcher %zu: failed in %.1f s: ", v->last, r->seconds);
        print_short(r->error ? r->error : "", ERROR_SHOWN, f);
        fputc('\n', f);
        return;
    case RV_WRITING:
        fputs("writing the report\n", f);
        return;
    case RV_COMPLETED:
        end_plan(v, f);
        if (!v->needs_input)
            summary(v, f);
        return;
    case RV_FAILED_RUN:
        end_plan(v, f);
        return;
    default:
        return;
    }
}
