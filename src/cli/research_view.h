/*
 * What `loom research` shows of a research run (docs/research.md "On a
 * terminal"): a state built from the run's events (the plan, each cycle,
 * each researcher with its task, status, sources found and elapsed time,
 * the tokens and cost spent so far), and two ways to show it. On a
 * terminal, research_view_render() turns the state into at most a
 * screenful of lines that the command redraws in place on stderr; else
 * research_view_plain() prints one plain line per change, as it happens.
 *
 * Everything that came from outside (the plan, tasks, errors: model
 * output) is stored cleaned by cli_clean() (clean.h): no control
 * character or escape sequence of it reaches the terminal.
 *
 * Not thread-safe: the caller serialises research_view_apply() and the
 * renderers (the sink is called one event at a time; a ticking redraw
 * needs the caller's lock).
 */
#ifndef LOOM_CLI_RESEARCH_VIEW_H
#define LOOM_CLI_RESEARCH_VIEW_H

#include "loom/run.h"

#include <stdint.h>
#include <stdio.h>

/* Researchers a view keeps (later ones are counted, not shown). */
#define RV_MAX_RESEARCHERS 4096

typedef enum { RV_RUNNING, RV_DONE, RV_FAILED } rv_status;

/* One research_agent call of the run. */
typedef struct {
    char *call_id;
    char *task;  /* cleaned, one line */
    char *error; /* cleaned, one line; when failed */
    int cycle;   /* the supervisor cycle that started it */
    rv_status status;
    long sources;       /* documents its searches and fetches found */
    int64_t started_ms; /* the caller's clock, at tool.started */
    double seconds;     /* when ended: the call's duration */
} rv_researcher;

/* What an event changed, for research_view_plain(). */
typedef enum {
    RV_NONE,      /* nothing shown changed */
    RV_SPENT,     /* usage or sources: counters only */
    RV_PLAN,      /* more plan text */
    RV_CYCLE,     /* a supervisor cycle starts */
    RV_BRANCH,    /* researchers of a cycle run in parallel */
    RV_STARTED,   /* a researcher starts: v->last */
    RV_ENDED,     /* a researcher ends: v->last */
    RV_WRITING,   /* the report is being written */
    RV_COMPLETED, /* the run completed (v->needs_input: asked) */
    RV_FAILED_RUN /* the run failed or was cancelled */
} rv_change;

typedef struct {
    char *plan;                  /* cleaned, newlines kept */
    size_t plan_len, plan_shown; /* plan_shown: what plain printed */
    int plan_closed;             /* plain printed a line after the plan */
    int cycle, max_cycles;
    int branch_cycle, branch_researchers; /* the last research.branch */
    rv_researcher *rs;
    size_t nrs;
    size_t last; /* the researcher of the last change (1-based) */
    long tokens;
    long long cost_micros;
    int usages, priced; /* model calls so far, those with a price */
    int cited;
    int writing; /* the report is being written */
    int ended;   /* the run completed or failed */
    int needs_input;
    int run_failed; /* 1: the run failed, 2: it was cancelled */
    char *reason;   /* report_reason, cleaned */
    long cycles_done, researchers, failed; /* from run.completed */
    int64_t started_ms; /* the caller's clock when the view began */
} research_view;

/* A view at now_ms (the caller's monotonic clock, in ms). */
void research_view_init(research_view *v, int64_t now_ms);
void research_view_free(research_view *v);

/*
 * Takes one event of the run's stream (its own and its researchers',
 * nested) into the view at now_ms. Returns what changed.
 */
rv_change research_view_apply(research_view *v, const loom_event *ev,
                              int64_t now_ms);

/*
 * The view as lines for a terminal cols wide and at most rows lines: a
 * status line (cycle, researchers, tokens, cost, elapsed), the plan's
 * first lines, then each cycle with its researchers (status, task,
 * sources, elapsed); the oldest cycle lines give way when they do not
 * fit. Each line is at most cols - 1 characters, without a newline.
 * Returns the number of lines; *out (caller frees with
 * research_view_lines_free) holds them; 0 with *out NULL when out of
 * memory or rows < 1.
 */
size_t research_view_render(const research_view *v, int64_t now_ms, int cols,
                            int rows, char ***out);
void research_view_lines_free(char **lines, size_t n);

/* Prints the plain line(s) of change c to f (nothing for RV_NONE and
 * RV_SPENT): the plan as it comes, a line per cycle with what was spent,
 * per branch, per researcher started or ended, and the summary. */
void research_view_plain(research_view *v, rv_change c, FILE *f);

/* Prints what was spent ("150000 tokens, $0.2000": the cost when every
 * model call had a price) to f. */
void research_view_spent(const research_view *v, FILE *f);

#endif
