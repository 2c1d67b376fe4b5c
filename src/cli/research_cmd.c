/*
 * `loom research "question"`: a research run (docs/research.md) from the
 * terminal. Progress goes to stderr: the plan, each cycle with the
 * tokens and cost spent so far, each researcher (its task, status, sources
 * found, elapsed time), and a summary; on a terminal as a region redrawn in
 * place, else as plain lines (research_view.c holds both). The report, checked
 * and with its Sources list, goes to stdout (or to
 * --out) once it is whole: what the stream showed while it was written
 * still had the markers the check removes. --json prints the events
 * instead, as `loom run --json` does.
 *
 * A clarifying question is asked on the terminal when stdin is one, and
 * the answer resumes the research in the same conversation; without a
 * terminal the command says so and exits 1 (no report was written).
 */
#include "cli/clean.h"
#include "cli/cli.h"
#include "cli/research_view.h"
#include "core/clock.h"

#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#define ANSWER_MAX 4096
#define TICK_MS 500      /* the ticker's redraws, for the elapsed times */
#define REDRAW_MS 100    /* counters and plan text redraw at most this often */
#define LOG_BUFFER 16384 /* a log record reaches log_write whole */

static const char research_usage[] =
    "usage: loom research [options] \"question\"\n"
    "       echo \"question\" | loom research [options] -\n"
    "\n"
    "Researches a question: a supervisor plans, sends researchers out in\n"
    "parallel to search and read the web, and has a report written that\n"
    "cites its sources. Progress on stderr, the report on stdout.\n"
    "\n"
    "options:\n"
    "  -c, --config FILE        config file (default: $LOOM_CONFIG, else\n"
    "                           the environment alone)\n"
    "  -a, --agent NAME         a research agent (default: deep_research)\n"
    "  -o, --out FILE           write the report to FILE instead of stdout\n"
    "      --no-clarify         never ask a clarifying question first\n"
    "      --json               print every event as a JSON line on stdout\n"
    "      --log-level LEVEL    debug, info, warn (default), error, off\n"
    "      --log-format FORMAT  text (default) or json\n"
    "  -h, --help               this help\n"
    "\n"
    "exit codes: 0 done, 1 the run failed (or a clarifying question went\n"
    "unanswered), 2 usage or config error, 130 interrupted\n";

typedef struct {
    const char *config, *agent, *out, *log_level, *log_format;
    int json, no_clarify;
    char *question;
} research_args;

/* The progress of the run: its view, and on a terminal the region of
 * stderr the view is drawn in, redrawn by the sink and by a ticker thread
 * (elapsed times move while nothing happens), under lock. */
typedef struct {
    cli_printer p; /* --json, approvals */
    research_view v;
    int live;         /* stderr is a terminal: redraw in place */
    int paused;       /* a prompt owns the terminal */
    size_t drawn;     /* lines of the region now on screen */
    int64_t drawn_ms; /* when it was drawn */
    pthread_mutex_t lock;
    pthread_cond_t wake; /* the ticker's, on CLOCK_MONOTONIC */
    pthread_t ticker;
    int ticking, stop;
} progress;

/* Whether stderr is a terminal that can redraw: not TERM=dumb. */
static int can_redraw(void)
{
    const char *term = getenv("TERM");

    return isatty(STDERR_FILENO) && term && *term && strcmp(term, "dumb");
}

/* The terminal's size, 80x24 when it cannot say. */
static void term_size(int *cols, int *rows)
{
    struct winsize ws;

    *cols = 80;
    *rows = 24;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0 &&
        ws.ws_row > 0) {
        *cols = ws.ws_col;
        *rows = ws.ws_row;
    }
}

/*
 * Draws the region (under g->lock): up `up` lines first, then each of the
 * view's lines (for the terminal's size) over what is there, `old` lines
 * of an earlier frame from there on blanked when the new one is shorter,
 * the cursor left under the new lines. Lines are cleared one by one:
 * clearing to the end of the screen from its top left corner would push
 * the screen into tmux's history on each redraw. One write, so the
 * terminal shows no half frame.
 */
static void draw_at(progress *g, int64_t now, size_t up, size_t old)
{
    int cols, rows;
    char **lines = NULL, *frame = NULL;
    size_t n, len = 0;
    FILE *f;

    term_size(&cols, &rows);
    n = research_view_render(&g->v, now, cols, rows > 2 ? rows - 1 : 1, &lines);
    if (!lines || !(f = open_memstream(&frame, &len))) {
        research_view_lines_free(lines, n);
        return;
    }
    if (up)
        fprintf(f, "\r\x1b[%zuA", up);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "\x1b[2K%s\n", lines[i]);
    if (old > n) {
        for (size_t i = n; i < old; i++)
            fputs("\x1b[2K\n", f);
        fprintf(f, "\x1b[%zuA", old - n);
    }
    research_view_lines_free(lines, n);
    if (fclose(f) != 0) {
        free(frame);
        return;
    }
    fwrite(frame, 1, len, stderr);
    fflush(stderr);
    free(frame);
    g->drawn = n;
    g->drawn_ms = now;
}

/* Redraws the region over itself. */
static void draw(progress *g, int64_t now)
{
    draw_at(g, now, g->drawn, g->drawn);
}

/*
 * The log's stream while the region is drawn (fopencookie): a record goes
 * where the region was, cleaned, and the region is drawn again under it,
 * so log lines scroll up above the live view instead of tearing it.
 */
static ssize_t log_write(void *cookie, const char *buf, size_t size)
{
    progress *g = cookie;
    char *raw = strndup(buf, size), *text;
    size_t rows = 0, chars = 0, old;
    int cols, trows;

    if (!raw)
        return (ssize_t)size;
    text = cli_clean(raw, CLI_KEEP_NL);
    free(raw);
    if (!text)
        return (ssize_t)size;
    term_size(&cols, &trows);
    for (const char *p = text;; p++) {
        if (!*p || *p == '\n') {
            rows += chars ? (chars + (size_t)cols - 1) / (size_t)cols : 1;
            chars = 0;
            if (!*p || !p[1])
                break;
        } else if (((unsigned char)*p & 0xC0) != 0x80) {
            chars++;
        }
    }
    pthread_mutex_lock(&g->lock);
    if (g->drawn)
        fprintf(stderr, "\r\x1b[%zuA", g->drawn);
    fputs("\x1b[2K", stderr);
    for (const char *p = text; *p; p++) {
        fputc(*p, stderr);
        if (*p == '\n' && p[1])
            fputs("\x1b[2K", stderr);
    }
    if (size && buf[size - 1] != '\n')
        fputc('\n', stderr);
    old = g->drawn > rows ? g->drawn - rows : 0;
    g->drawn = 0;
    if (!g->paused && !g->v.ended)
        draw_at(g, loom__mono_ms(), 0, old);
    fflush(stderr);
    pthread_mutex_unlock(&g->lock);
    free(text);
    return (ssize_t)size;
}

/* A stream for the log that writes through log_write, or NULL. */
static FILE *log_stream(progress *g)
{
    static const cookie_io_functions_t io = {NULL, log_write, NULL, NULL};
    FILE *f = fopencookie(g, "w", io);

    if (f)
        setvbuf(f, NULL, _IOFBF, LOG_BUFFER);
    return f;
}

/* Redraws twice a second while the run goes on. */
static void *tick(void *arg)
{
    progress *g = arg;
    struct timespec at;

    pthread_mutex_lock(&g->lock);
    while (!g->stop) {
        clock_gettime(CLOCK_MONOTONIC, &at);
        at.tv_nsec += TICK_MS * 1000000L;
        at.tv_sec += at.tv_nsec / 1000000000L;
        at.tv_nsec %= 1000000000L;
        pthread_cond_timedwait(&g->wake, &g->lock, &at);
        if (!g->stop && !g->paused && !g->v.ended)
            draw(g, loom__mono_ms());
    }
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

static void start_ticker(progress *g)
{
    pthread_condattr_t ca;

    pthread_mutex_init(&g->lock, NULL);
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->wake, &ca);
    pthread_condattr_destroy(&ca);
    g->ticking = pthread_create(&g->ticker, NULL, tick, g) == 0;
}

static void stop_ticker(progress *g)
{
    pthread_mutex_lock(&g->lock);
    g->stop = 1;
    pthread_cond_signal(&g->wake);
    pthread_mutex_unlock(&g->lock);
    if (g->ticking)
        pthread_join(g->ticker, NULL);
    pthread_cond_destroy(&g->wake);
    pthread_mutex_destroy(&g->lock);
}

/* An event on a terminal: the region redrawn at once when something
 * started or ended, at most every REDRAW_MS for counters and plan text;
 * at the run's end the last frame stays, with the summary under it. */
static void live(progress *g, const loom_event *ev)
{
    int64_t now = loom__mono_ms();
    rv_change c;

    pthread_mutex_lock(&g->lock);
    c = research_view_apply(&g->v, ev, now);
    if (c == RV_COMPLETED || c == RV_FAILED_RUN) {
        draw(g, now);
        g->drawn = 0;
        research_view_plain(&g->v, c, stderr);
        fflush(stderr);
    } else if (c != RV_NONE && !g->paused &&
               ((c != RV_SPENT && c != RV_PLAN) ||
                now - g->drawn_ms >= REDRAW_MS)) {
        draw(g, now);
    }
    pthread_mutex_unlock(&g->lock);
}

static int emit(const loom_event *ev, void *payload)
{
    progress *g = payload;
    int rc;

    if (ev->type == LOOM_EV_APPROVAL_REQUIRED && loom_event_depth(ev) == 0 &&
        !g->p.json) {
        /* The prompt goes under the region, which stays as it is. */
        if (g->live) {
            pthread_mutex_lock(&g->lock);
            g->paused = 1;
            g->drawn = 0;
            pthread_mutex_unlock(&g->lock);
        }
        rc = cli_printer_emit(ev, &g->p);
        if (g->live) {
            pthread_mutex_lock(&g->lock);
            g->paused = 0;
            pthread_mutex_unlock(&g->lock);
        }
        return rc;
    }
    if (g->p.json) {
        research_view_apply(&g->v, ev, loom__mono_ms());
        return cli_printer_emit(ev, &g->p);
    }
    if (g->live) {
        live(g, ev);
        return 0;
    }
    research_view_plain(&g->v, research_view_apply(&g->v, ev, loom__mono_ms()),
                        stderr);
    fflush(stderr);
    return 0;
}

/*
 * Starts showing the progress in g (--json: json): on a terminal the
 * region and its ticker, the log (log_level, log_format over cfg's)
 * written above the region. Returns the log's stream for
 * progress_end(), or NULL.
 */
static FILE *progress_begin(progress *g, const loom_config *cfg, int json,
                            const char *log_level, const char *log_format)
{
    FILE *log = NULL;

    cli_printer_init(&g->p, json, 0);
    research_view_init(&g->v, loom__mono_ms());
    if ((g->live = !json && can_redraw())) {
        start_ticker(g);
        if ((log = log_stream(g)))
            cli_setup_log_to(log, cfg, log_level, log_format);
    }
    return log;
}

/* Stops the ticker and puts the log back on stderr; the view stays. */
static void progress_end(progress *g, const loom_config *cfg, FILE *log,
                         const char *log_level, const char *log_format)
{
    if (log) {
        cli_setup_log(cfg, log_level, log_format);
        fclose(log);
    }
    if (g->live)
        stop_ticker(g);
}

static int parse_args(research_args *a, int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"agent", required_argument, NULL, 'a'},
        {"out", required_argument, NULL, 'o'},
        {"no-clarify", no_argument, NULL, 'N'},
        {"json", no_argument, NULL, 'j'},
        {"log-level", required_argument, NULL, 'L'},
        {"log-format", required_argument, NULL, 'F'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    int c;

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":c:a:o:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            a->config = optarg;
            break;
        case 'a':
            a->agent = optarg;
            break;
        case 'o':
            a->out = optarg;
            break;
        case 'N':
            a->no_clarify = 1;
            break;
        case 'j':
            a->json = 1;
            break;
        case 'L':
            a->log_level = optarg;
            break;
        case 'F':
            a->log_format = optarg;
            break;
        case 'h':
            fputs(research_usage, stdout);
            return -1;
        default:
            return cli_getopt_fail("research", c, argv, research_usage);
        }
    }
    if (cli_check_log_args("research", a->log_level, a->log_format) != 0)
        return CLI_USAGE;
    return cli_question(&a->question, argc, argv, "research", research_usage);
}

/* Writes the report to path, or stdout when path is NULL: cleaned of
 * control characters and escape sequences when stdout is a terminal (the
 * report holds model output), else as it is. */
static int write_report(const char *path, const char *report)
{
    FILE *f = path ? fopen(path, "w") : stdout;
    char *clean = !path && isatty(STDOUT_FILENO)
                      ? cli_clean(report, CLI_KEEP_NL | CLI_KEEP_TAB)
                      : NULL;
    const char *text = clean ? clean : report;
    size_t n = strlen(text);
    int bad;

    if (!f) {
        fprintf(stderr, "loom research: cannot write %s: %m\n", path);
        return CLI_FAILED;
    }
    bad = fwrite(text, 1, n, f) != n ||
          (n && text[n - 1] != '\n' && fputc('\n', f) == EOF);
    free(clean);
    if (path)
        bad |= fclose(f) != 0;
    else
        bad |= fflush(stdout) != 0;
    if (bad) {
        fprintf(stderr, "loom research: cannot write %s\n",
                path ? path : "the report");
        return CLI_FAILED;
    }
    if (path)
        fprintf(stderr, "report written to %s\n", path);
    return CLI_OK;
}

/*
 * The clarifying question of the last turn (shown cleaned of control
 * characters, as all model text here): asked on the terminal, the
 * answer (caller frees) read from it; NULL when stdin is no terminal or
 * nothing was typed (the question and what to do are then said).
 */
static char *ask(const char *text)
{
    char line[ANSWER_MAX], *question = cli_clean(text, CLI_KEEP_NL);
    size_t n;

    if (!question)
        return NULL;
    if (!isatty(STDIN_FILENO)) {
        fprintf(stderr,
                "loom research: a clarifying question needs an answer: "
                "%s\nloom research: ask again with the answer in the "
                "question, or with --no-clarify\n",
                question);
        free(question);
        return NULL;
    }
    fprintf(stderr, "%s\nanswer: ", question);
    fflush(stderr);
    free(question);
    if (!fgets(line, sizeof(line), stdin))
        return NULL;
    n = strlen(line);
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = '\0';
    return n ? strdup(line) : NULL;
}

/*
 * Runs the research: one turn, and when it ends on a clarifying question
 * answered on the terminal, a second one in the same conversation.
 */
static int research(loom_session *session, const research_args *a, progress *g,
                    const json_t *overrides)
{
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages input = {0}, history = {0};
    loom_turn *turn = NULL;
    char *answer = NULL;
    int rc;

    if (loom_messages_add(&input, LOOM_ROLE_USER, a->question) != 0)
        return CLI_FAILED;
    to.agent = a->agent;
    to.input = &input;
    to.research = overrides;
    to.sink.emit = emit;
    to.sink.payload = g;
    if (loom_turn_new(&turn, session, &to) != 0) {
        fprintf(stderr, "loom research: %s\n", loom_error_last());
        rc = CLI_USAGE;
        goto done;
    }
    rc = cli_turn_execute(turn, &g->p);
    if (rc == CLI_OK && g->v.needs_input) {
        const char *q = loom_run_text(loom_turn_run(turn));
        if (a->json || !(answer = ask(q))) {
            rc = CLI_FAILED;
            goto done;
        }
        if (loom_messages_add(&history, LOOM_ROLE_USER, a->question) != 0 ||
            loom_messages_add(&history, LOOM_ROLE_ASSISTANT, q) != 0) {
            rc = CLI_FAILED;
            goto done;
        }
        loom_turn_free(turn);
        turn = NULL;
        loom_messages_free(&input);
        if (loom_messages_add(&input, LOOM_ROLE_USER, answer) != 0) {
            rc = CLI_FAILED;
            goto done;
        }
        to.history = &history;
        if (g->live)
            pthread_mutex_lock(&g->lock);
        g->v.needs_input = 0;
        g->v.ended = 0; /* the ticker draws again */
        if (g->live)
            pthread_mutex_unlock(&g->lock);
        if (loom_turn_new(&turn, session, &to) != 0) {
            fprintf(stderr, "loom research: %s\n", loom_error_last());
            rc = CLI_FAILED;
            goto done;
        }
        rc = cli_turn_execute(turn, &g->p);
    }
    if (rc == CLI_OK && g->v.needs_input)
        rc = CLI_FAILED; /* asked twice: no report */
    else if (rc == CLI_OK && (a->out || !a->json))
        rc = write_report(a->out, loom_run_text(loom_turn_run(turn)));
done:
    free(answer);
    loom_turn_free(turn);
    loom_messages_free(&input);
    loom_messages_free(&history);
    return rc;
}

int cli_research(int argc, char **argv)
{
    research_args a;
    loom_config *cfg = NULL;
    loom_session *session = NULL;
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    const loom_agent_config *ag;
    json_t *overrides = NULL;
    FILE *log = NULL;
    progress g;
    int rc;

    memset(&a, 0, sizeof(a));
    memset(&g, 0, sizeof(g));
    if ((rc = parse_args(&a, argc, argv)) != 0) {
        free(a.question);
        return rc < 0 ? CLI_OK : rc;
    }
    if (!a.agent)
        a.agent = LOOM_RESEARCH_AGENT;
    if ((rc = cli_load_config(&cfg, a.config)) != 0)
        goto done;
    cli_setup_log(cfg, a.log_level, a.log_format);
    if (cfg->providers_len == 0) {
        fprintf(stderr, "loom research: no model provider is configured "
                        "(set OPENAI_API_KEY, ANTHROPIC_API_KEY or "
                        "GEMINI_API_KEY, or pass --config)\n");
        rc = CLI_USAGE;
        goto done;
    }
    so.config = cfg;
    if ((rc = cli_session_new(&session, &so)) != 0)
        goto done;
    if (!(ag = loom_config_agent(cfg, a.agent)) || !ag->research) {
        fprintf(stderr,
                ag ? "loom research: the agent '%s' is not a research agent "
                     "(research: true)\n"
                   : "loom research: no agent named '%s' in the config\n",
                a.agent);
        rc = CLI_USAGE;
        goto done;
    }
    if (a.no_clarify && !(overrides = json_pack("{s:b}", "clarify", 0))) {
        rc = CLI_FAILED;
        goto done;
    }
    log = progress_begin(&g, cfg, a.json, a.log_level, a.log_format);
    rc = research(session, &a, &g, overrides);
    progress_end(&g, cfg, log, a.log_level, a.log_format);
done:
    research_view_free(&g.v);
    json_decref(overrides);
    loom_session_free(session);
    loom_config_free(cfg);
    free(a.question);
    return rc;
}

int cli_research_turn(loom_session *session, loom_turn_options *to,
                      const char *log_level, const char *log_format,
                      loom_turn **out)
{
    const loom_config *cfg = loom_session_config(session);
    json_t *overrides = json_pack("{s:b}", "clarify", 0);
    FILE *log;
    progress g;
    int rc;

    *out = NULL;
    memset(&g, 0, sizeof(g)); /* research_view_free: a no-op on zeros */
    if (!overrides)
        return CLI_FAILED;
    to->research = overrides;
    to->sink.emit = emit;
    to->sink.payload = &g;
    if (loom_turn_new(out, session, to) != 0) {
        fprintf(stderr, "loom: research: %s\n", loom_error_last());
        rc = CLI_FAILED;
        goto done;
    }
    log = progress_begin(&g, cfg, 0, log_level, log_format);
    rc = cli_turn_execute(*out, &g.p);
    progress_end(&g, cfg, log, log_level, log_format);
    if (rc == CLI_OK)
        rc = write_report(NULL, loom_run_text(loom_turn_run(*out)));
done:
    to->research = NULL;
    to->sink.emit = NULL;
    to->sink.payload = NULL;
    research_view_free(&g.v);
    json_decref(overrides);
    return rc;
}
