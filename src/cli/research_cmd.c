/*
 * `loom research "question"`: a research run (docs/research.md) from the
 * terminal. Progress goes to stderr as plain lines: the plan, each cycle
 * with the tokens and cost spent so far, each researcher as it starts and
 * ends (its task, status, sources found, elapsed time), and a summary.
 * The report, checked and with its Sources list, goes to stdout (or to
 * --out) once it is whole: what the stream showed while it was written
 * still had the markers the check removes. --json prints the events
 * instead, as `loom run --json` does.
 *
 * A clarifying question is asked on the terminal when stdin is one, and
 * the answer resumes the research in the same conversation; without a
 * terminal the command says so and exits 1 (no report was written).
 */
#include "cli/cli.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TASK_SHOWN 100
#define ERROR_SHOWN 200
#define MAX_RESEARCHERS 4096
#define ANSWER_MAX 4096

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

/* One research_agent call of the run. */
typedef struct {
    char *call_id;
    long sources; /* documents its researcher's tools added */
} researcher;

typedef struct {
    cli_printer p; /* --json, approvals */
    researcher *rs;
    size_t nrs;
    long tokens;
    long long cost_micros;
    int usages, priced; /* model calls so far, those with a price */
    int plan_started, plan_nl, needs_input, cited;
} progress;

static const char *str(const json_t *data, const char *key)
{
    const char *s = json_string_value(json_object_get(data, key));
    return s ? s : "";
}

/* Prints s on one line, at most max bytes, with newlines flattened. */
static void print_short(const char *s, size_t max)
{
    size_t n = 0;

    for (; *s && n < max; s++, n++)
        fputc(*s == '\n' || *s == '\r' ? ' ' : *s, stderr);
    if (*s)
        fputs("...", stderr);
}

/* Ends the plan's text with a newline before another line. */
static void end_plan(progress *g)
{
    if (g->plan_started && !g->plan_nl) {
        fputc('\n', stderr);
        g->plan_nl = 1;
    }
}

/* The spending so far, as the cycle and summary lines show it. */
static void print_spent(const progress *g)
{
    fprintf(stderr, "%ld tokens", g->tokens);
    if (g->usages && g->priced == g->usages)
        fprintf(stderr, ", $%.4f", (double)g->cost_micros / 1e6);
}

/* The researcher of the research_agent call id (1-based number), or 0. */
static size_t researcher_of(const progress *g, const char *call_id)
{
    for (size_t i = 0; i < g->nrs; i++)
        if (strcmp(g->rs[i].call_id, call_id) == 0)
            return i + 1;
    return 0;
}

static void researcher_started(progress *g, const loom_event *ev)
{
    const char *task = str(json_object_get(ev->data, "arguments"), "task");
    researcher *rs;
    char *id;

    if (g->nrs >= MAX_RESEARCHERS)
        return;
    rs = realloc(g->rs, (g->nrs + 1) * sizeof(*rs));
    if (!rs)
        return;
    g->rs = rs;
    if (!(id = strdup(str(ev->data, "id"))))
        return;
    g->rs[g->nrs].call_id = id;
    g->rs[g->nrs].sources = 0;
    g->nrs++;
    fprintf(stderr, "researcher %zu: started: ", g->nrs);
    print_short(task, TASK_SHOWN);
    fputc('\n', stderr);
}

static void researcher_ended(progress *g, const loom_event *ev)
{
    size_t k = researcher_of(g, str(ev->data, "id"));
    double s =
        json_number_value(json_object_get(ev->data, "duration_ms")) / 1000.0;

    if (!k)
        return;
    if (ev->type == LOOM_EV_TOOL_COMPLETED) {
        fprintf(stderr, "researcher %zu: done in %.1f s, %ld source%s\n", k, s,
                g->rs[k - 1].sources, g->rs[k - 1].sources == 1 ? "" : "s");
        return;
    }
    fprintf(stderr, "researcher %zu: failed in %.1f s: ", k, s);
    print_short(str(ev->data, "error"), ERROR_SHOWN);
    fputc('\n', stderr);
}

/* Every model call of the tree reports its usage once, in its own run:
 * their sum is what the research spent. */
static void add_usage(progress *g, const json_t *u)
{
    const json_t *cost = json_object_get(u, "cost_micros");

    g->tokens += (long)json_integer_value(json_object_get(u, "total_tokens"));
    g->usages++;
    if (json_is_integer(cost)) {
        g->cost_micros += json_integer_value(cost);
        g->priced++;
    }
}

static void summary(progress *g, const loom_event *ev)
{
    const json_t *r = json_object_get(ev->data, "research");
    const char *reason = str(ev->data, "report_reason");
    long failed = (long)json_integer_value(json_object_get(r, "failed"));

    if (!strcmp(str(ev->data, "status"), "needs_input")) {
        g->needs_input = 1;
        return;
    }
    fprintf(stderr, "report%s%s%s: %lld cycle%s, %lld researchers",
            *reason ? " (" : "", reason, *reason ? ")" : "",
            json_integer_value(json_object_get(r, "cycles")),
            json_integer_value(json_object_get(r, "cycles")) == 1 ? "" : "s",
            json_integer_value(json_object_get(r, "researchers")));
    if (failed)
        fprintf(stderr, " (%ld failed)", failed);
    fprintf(stderr, ", %d source%s cited; ", g->cited,
            g->cited == 1 ? "" : "s");
    print_spent(g);
    fputc('\n', stderr);
}

/* The events of the top run and of its researchers, as progress lines. */
static void plain(progress *g, const loom_event *ev)
{
    int depth = loom_event_depth(ev);
    const char *name = str(ev->data, "name");

    if (ev->type == LOOM_EV_USAGE) {
        add_usage(g, ev->data);
        return;
    }
    if (depth == 1 && ev->type == LOOM_EV_TOOL_METRIC) {
        size_t k = researcher_of(g, str(ev->data, "parent_call_id"));
        if (k)
            g->rs[k - 1].sources +=
                (long)json_array_size(json_object_get(ev->data, "documents"));
        return;
    }
    if (depth != 0)
        return;
    switch (ev->type) {
    case LOOM_EV_RESEARCH_PLAN: {
        const char *d = str(ev->data, "delta");
        if (!*d)
            return;
        if (!g->plan_started)
            fputs("plan:\n", stderr);
        g->plan_started = 1;
        fputs(d, stderr);
        g->plan_nl = d[strlen(d) - 1] == '\n';
        return;
    }
    case LOOM_EV_RESEARCH_CYCLE:
        end_plan(g);
        fprintf(stderr, "cycle %lld/%lld: ",
                json_integer_value(json_object_get(ev->data, "cycle")),
                json_integer_value(json_object_get(ev->data, "max_cycles")));
        print_spent(g);
        fputs(" so far\n", stderr);
        return;
    case LOOM_EV_RESEARCH_BRANCH:
        fprintf(stderr, "cycle %lld: %lld researchers in parallel\n",
                json_integer_value(json_object_get(ev->data, "cycle")),
                json_integer_value(json_object_get(ev->data, "researchers")));
        return;
    case LOOM_EV_TOOL_STARTED:
        if (!strcmp(name, "research_agent"))
            researcher_started(g, ev);
        else if (!strcmp(name, "generate_report"))
            fputs("writing the report\n", stderr);
        return;
    case LOOM_EV_TOOL_COMPLETED:
    case LOOM_EV_TOOL_FAILED:
        if (!strcmp(name, "research_agent"))
            researcher_ended(g, ev);
        return;
    case LOOM_EV_CITATION:
        g->cited++;
        return;
    case LOOM_EV_RUN_COMPLETED:
        end_plan(g);
        summary(g, ev);
        return;
    case LOOM_EV_RUN_FAILED:
        end_plan(g);
        return;
    default:
        return;
    }
}

static int emit(const loom_event *ev, void *payload)
{
    progress *g = payload;

    if (ev->type == LOOM_EV_RUN_COMPLETED && loom_event_depth(ev) == 0 &&
        !strcmp(str(ev->data, "status"), "needs_input"))
        g->needs_input = 1;
    if (g->p.json ||
        (ev->type == LOOM_EV_APPROVAL_REQUIRED && loom_event_depth(ev) == 0))
        return cli_printer_emit(ev, &g->p);
    plain(g, ev);
    fflush(stderr);
    return 0;
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
        case ':':
            fprintf(stderr, "loom research: option '%s' needs a value\n\n%s",
                    argv[optind - 1], research_usage);
            return CLI_USAGE;
        default:
            fprintf(stderr, "loom research: unknown option '%s'\n\n%s",
                    argv[optind - 1], research_usage);
            return CLI_USAGE;
        }
    }
    if (cli_check_log_args("research", a->log_level, a->log_format) != 0)
        return CLI_USAGE;
    return cli_question(&a->question, argc, argv, "research", research_usage);
}

/* Writes the report to path, or stdout when path is NULL. */
static int write_report(const char *path, const char *text)
{
    FILE *f = path ? fopen(path, "w") : stdout;
    size_t n = strlen(text);
    int bad;

    if (!f) {
        fprintf(stderr, "loom research: cannot write %s: %m\n", path);
        return CLI_FAILED;
    }
    bad = fwrite(text, 1, n, f) != n ||
          (n && text[n - 1] != '\n' && fputc('\n', f) == EOF);
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
 * The clarifying question of the last turn: asked on the terminal, the
 * answer (caller frees) read from it; NULL when stdin is no terminal or
 * nothing was typed (the question and what to do are then said).
 */
static char *ask(const char *question)
{
    char line[ANSWER_MAX];
    size_t n;

    if (!isatty(STDIN_FILENO)) {
        fprintf(stderr,
                "loom research: a clarifying question needs an answer: "
                "%s\nloom research: ask again with the answer in the "
                "question, or with --no-clarify\n",
                question);
        return NULL;
    }
    fprintf(stderr, "%s\nanswer: ", question);
    fflush(stderr);
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
    if (rc == CLI_OK && g->needs_input) {
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
        g->needs_input = 0;
        if (loom_turn_new(&turn, session, &to) != 0) {
            fprintf(stderr, "loom research: %s\n", loom_error_last());
            rc = CLI_FAILED;
            goto done;
        }
        rc = cli_turn_execute(turn, &g->p);
    }
    if (rc == CLI_OK && g->needs_input)
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
    cli_printer_init(&g.p, a.json, 0);
    rc = research(session, &a, &g, overrides);
done:
    for (size_t i = 0; i < g.nrs; i++)
        free(g.rs[i].call_id);
    free(g.rs);
    json_decref(overrides);
    loom_session_free(session);
    loom_config_free(cfg);
    free(a.question);
    return rc;
}
