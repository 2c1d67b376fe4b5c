/*
 * Event printers for `loom run`. --json writes every event as one JSON
 * object per line on stdout (for scripts). Plain mode streams the answer
 * to stdout as it arrives and reports tools on stderr: as they start and
 * end when stderr is a terminal, one line per finished tool otherwise.
 * In both, a call that waits for approval, the run's or a sub-agent's, is
 * asked about on the terminal (or approved by --approve-all) from the
 * sink, before the run waits; so is a form an MCP server asks to fill in
 * (mcp.elicitation), one prompt per field.
 */
#include "cli/clean.h"
#include "cli/cli.h"
#include "cli/spinner.h"
#include "core/utf8.h"
#include "loom/session.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ARGS_SHOWN 120
#define OUTPUT_SHOWN 160

/* Prints s on one line, at most max bytes (no half character), with
 * newlines flattened and no control character or escape sequence. */
static void print_short(FILE *f, const char *s, size_t max)
{
    char *c = cli_clean(s, 0);
    size_t n = c ? strlen(c) : 0, cut = loom__utf8_cut(c, n, max);

    if (c)
        fwrite(c, 1, cut, f);
    if (cut < n)
        fputs("...", f);
    free(c);
}

static const char *str(const json_t *data, const char *key)
{
    const char *s = json_string_value(json_object_get(data, key));
    return s ? s : "";
}

/* Ends the answer's line on stdout before a line on stderr. */
static void end_text_line(cli_printer *p)
{
    if (p->wrote_text && !p->ended_nl) {
        fputc('\n', stdout);
        fflush(stdout);
        p->ended_nl = 1;
    }
}

/*
 * What a line about ev starts with: nothing for the run's own events;
 * for a sub-agent's, two spaces per level and its agent's name, so a
 * tree of runs reads as one indented log.
 */
static const char *lead(const loom_event *ev, char *buf, size_t size)
{
    int depth = loom_event_depth(ev);

    if (depth == 0)
        return "";
    snprintf(buf, size, "%*s[%s] ", depth > 8 ? 16 : 2 * depth, "",
             str(ev->data, "agent"));
    return buf;
}

/*
 * A tool of the run (or of a sub-agent, in: its lead) starts or ends on
 * the spinner: it shows "name args" while the call runs.
 */
static void spin_tool(cli_printer *p, const loom_event *ev, const char *in)
{
    char key[2 * LOOM_ID_MAX + 2], *label = NULL, *args;
    size_t len = 0;
    FILE *f;

    snprintf(key, sizeof(key), "%s/%s", ev->run_id ? ev->run_id : "",
             str(ev->data, "id"));
    if (ev->type != LOOM_EV_TOOL_STARTED) {
        cli_spinner_remove(p->spin, key);
        return;
    }
    args = json_dumps(json_object_get(ev->data, "arguments"),
                      JSON_COMPACT | JSON_ENCODE_ANY);
    if ((f = open_memstream(&label, &len)) != NULL) {
        fprintf(f, "%s%s ", in, str(ev->data, "name"));
        print_short(f, args, ARGS_SHOWN);
        if (fclose(f) == 0)
            cli_spinner_add(p->spin, key, label);
    }
    free(label);
    free(args);
}

static void tool_line(cli_printer *p, const loom_event *ev)
{
    const char *name = str(ev->data, "name");
    double ms = json_number_value(json_object_get(ev->data, "duration_ms"));
    const char *on = p->color ? "\033[2m" : "",
               *off = p->color ? "\033[0m" : "";
    char buf[96];
    const char *in = lead(ev, buf, sizeof(buf));

    if (p->spin) {
        /* The spinner's line goes under the text, not over it. */
        end_text_line(p);
        spin_tool(p, ev, in);
        if (ev->type == LOOM_EV_TOOL_STARTED)
            return;
    }
    end_text_line(p);
    switch (ev->type) {
    case LOOM_EV_TOOL_STARTED: {
        char *args = json_dumps(json_object_get(ev->data, "arguments"),
                                JSON_COMPACT | JSON_ENCODE_ANY);
        fprintf(stderr, "%s%s> %s ", on, in, name);
        print_short(stderr, args, ARGS_SHOWN);
        fprintf(stderr, "%s\n", off);
        free(args);
        break;
    }
    case LOOM_EV_TOOL_COMPLETED:
        fprintf(stderr, "%s%s< %s ok (%.0f ms): ", on, in, name, ms);
        print_short(stderr, str(ev->data, "output"), OUTPUT_SHOWN);
        fprintf(stderr, "%s\n", off);
        break;
    case LOOM_EV_TOOL_FAILED:
        fprintf(stderr, "%s%s! %s failed (%s): ", p->color ? "\033[33m" : "",
                in, *name ? name : "?", str(ev->data, "stage"));
        print_short(stderr, str(ev->data, "error"), OUTPUT_SHOWN);
        fprintf(stderr, "%s\n", off);
        break;
    default:
        break;
    }
    fflush(stderr);
}

/* A sub-agent's run ended: its answer, or why it failed, on stderr (the
 * answer on stdout is the top run's alone). */
static void child_end_line(cli_printer *p, const loom_event *ev)
{
    const char *on = p->color ? "\033[2m" : "",
               *off = p->color ? "\033[0m" : "";
    char buf[96];
    const char *in = lead(ev, buf, sizeof(buf));

    end_text_line(p);
    if (ev->type == LOOM_EV_RUN_COMPLETED) {
        fprintf(stderr, "%s%s= answered: ", on, in);
        print_short(stderr, str(ev->data, "text"), OUTPUT_SHOWN);
    } else {
        fprintf(stderr, "%s%s! %s: ", p->color ? "\033[33m" : "", in,
                str(ev->data, "status"));
        print_short(stderr, str(json_object_get(ev->data, "error"), "message"),
                    OUTPUT_SHOWN);
    }
    fprintf(stderr, "%s\n", off);
    fflush(stderr);
}

/* One JSON line on stdout (--json). */
static void print_json(const loom_event *ev)
{
    json_t *o = loom_event_to_json(ev);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;

    if (s) {
        fputs(s, stdout);
        fputc('\n', stdout);
        fflush(stdout);
    }
    free(s);
    json_decref(o);
}

/* Reads one line from f into buf (cap bytes) without its newline; 0 at
 * end of input. */
static int read_line(FILE *f, char *buf, size_t cap)
{
    size_t n;

    if (!fgets(buf, (int)cap, f))
        return 0;
    n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        buf[--n] = '\0';
    return 1;
}

/* The terminal to ask on: stdin when it is one, else /dev/tty; NULL
 * when there is none. Close it unless it is stdin. */
static FILE *open_terminal(void)
{
    return isatty(STDIN_FILENO) ? stdin : fopen("/dev/tty", "r");
}

int cli_has_terminal(void)
{
    FILE *in = open_terminal();

    if (in && in != stdin)
        fclose(in);
    return in != NULL;
}

/* Tries this many times to get a form right before declining it. */
#define FORM_TRIES 3

/*
 * Reads the value of one field of a form (schema: its property schema)
 * from line: a string as it is, a number or integer parsed, a boolean
 * from y/yes/true or n/no/false. NULL when line does not parse.
 */
static json_t *field_value(const json_t *schema, const char *line)
{
    const char *type = json_string_value(json_object_get(schema, "type"));
    char *end = NULL;

    if (type && strcmp(type, "boolean") == 0) {
        if (!strcmp(line, "y") || !strcmp(line, "yes") || !strcmp(line, "true"))
            return json_true();
        if (!strcmp(line, "n") || !strcmp(line, "no") || !strcmp(line, "false"))
            return json_false();
        return NULL;
    }
    if (type && strcmp(type, "integer") == 0) {
        long long v = strtoll(line, &end, 10);
        return end && end != line && !*end ? json_integer(v) : NULL;
    }
    if (type && strcmp(type, "number") == 0) {
        double v = strtod(line, &end);
        return end && end != line && !*end ? json_real(v) : NULL;
    }
    return json_string(line);
}

/* Asks one field of a form (name, its schema) on in; adds what the
 * person gives to content (an empty line leaves it out). */
static void ask_field(FILE *in, const char *name, const json_t *schema,
                      int required, json_t *content)
{
    const char *title = json_string_value(json_object_get(schema, "title"));
    const char *type = json_string_value(json_object_get(schema, "type"));
    const json_t *choices = json_object_get(schema, "enum");
    char *def =
        json_object_get(schema, "default")
            ? json_dumps(json_object_get(schema, "default"), JSON_ENCODE_ANY)
            : NULL;
    char *opts = choices ? json_dumps(choices, JSON_COMPACT) : NULL;
    char line[1024];

    for (int i = 0; i < FORM_TRIES; i++) {
        json_t *v;
        fprintf(stderr, "  %s (%s%s%s%s%s)%s: ", title ? title : name,
                type ? type : "string", opts ? ", one of " : "",
                opts ? opts : "", def ? ", default " : "", def ? def : "",
                required ? " *" : "");
        fflush(stderr);
        if (!read_line(in, line, sizeof(line)) || !line[0])
            break;
        if ((v = field_value(schema, line)) != NULL) {
            json_object_set_new(content, name, v);
            break;
        }
        fprintf(stderr, "  that is not a %s\n", type ? type : "value");
    }
    free(def);
    free(opts);
}

/*
 * Answers a form an MCP server asks to fill in (an mcp.elicitation
 * event, the run's or a sub-agent's): the person at the terminal
 * accepts it and gives each field, declines it or cancels it. A form
 * loom refuses (a required field left out, a value out of range) is
 * asked again, up to FORM_TRIES times, then declined. With no terminal
 * it is declined.
 */
static void ask_form(cli_printer *p, const loom_event *ev)
{
    const char *id = str(ev->data, "elicitation_id");
    const json_t *schema = json_object_get(ev->data, "requestedSchema");
    const json_t *props = json_object_get(schema, "properties"), *ps;
    char line[64], buf[96];
    const char *who = lead(ev, buf, sizeof(buf)), *name;
    FILE *in = open_terminal();
    int rc = LOOM_EINVALID;

    end_text_line(p);
    fprintf(stderr, "%s? %s asks: %s\n", who, str(ev->data, "server"),
            str(ev->data, "message"));
    for (int i = 0; in && i < FORM_TRIES && rc == LOOM_EINVALID; i++) {
        json_t *content;
        fprintf(stderr, "%sfill in (y), decline (n) or cancel (c)? [y/n/c] ",
                who);
        fflush(stderr);
        if (!read_line(in, line, sizeof(line)) ||
            (strcmp(line, "y") && strcmp(line, "yes"))) {
            rc = loom_turn_answer_elicitation(
                p->turn, id, !strcmp(line, "c") ? "cancel" : "decline", NULL);
            break;
        }
        content = json_object();
        json_object_foreach((json_t *)props, name, ps)
        {
            const json_t *req = json_object_get(schema, "required"), *r;
            size_t k;
            int required = 0;
            json_array_foreach(req, k, r)
            {
                required |= !strcmp(
                    json_string_value(r) ? json_string_value(r) : "", name);
            }
            ask_field(in, name, ps, required, content);
        }
        rc = loom_turn_answer_elicitation(p->turn, id, "accept", content);
        json_decref(content);
        if (rc == LOOM_EINVALID)
            fprintf(stderr, "%s%s\n", who, loom_error_last());
    }
    if (!in || rc == LOOM_EINVALID) {
        fprintf(stderr, "%s! the form of %s is declined%s\n", who,
                str(ev->data, "server"), in ? "" : ": no terminal to ask");
        rc = loom_turn_answer_elicitation(p->turn, id, "decline", NULL);
    }
    if (in && in != stdin)
        fclose(in);
    if (rc != 0)
        fprintf(stderr, "loom: could not answer %s: %s\n", id,
                loom_error_last());
}

/*
 * Answers a call that waits for approval, the run's or a sub-agent's
 * (its lines indented with its agent's name, its answer given to the run
 * it belongs to): --approve-all approves; else the person at the
 * terminal (stdin when it is one, else /dev/tty) says y or n, and why on
 * a denial; with no terminal the call is denied.
 */
static void ask_approval(cli_printer *p, const loom_event *ev)
{
    const char *id = str(ev->data, "call_id"), *tool = str(ev->data, "tool");
    char *args = json_dumps(json_object_get(ev->data, "arguments"),
                            JSON_COMPACT | JSON_ENCODE_ANY);
    char line[1024], reason[1024] = "", buf[96];
    const char *who = lead(ev, buf, sizeof(buf));
    FILE *in = open_terminal();
    int yes = 0;

    end_text_line(p);
    if (p->approve_all) {
        fprintf(stderr, "%sapproved %s (--approve-all)\n", who, tool);
        yes = 1;
    } else if (!in) {
        fprintf(stderr,
                "%s! %s needs approval and there is no terminal to "
                "ask: denied (use --approve-all)\n",
                who, tool);
        snprintf(reason, sizeof(reason),
                 "no terminal to ask for approval (use --approve-all)");
    } else {
        fprintf(stderr, "%sapprove %s %s? [y/N] ", who, tool,
                args ? args : "{}");
        fflush(stderr);
        yes =
            read_line(in, line, sizeof(line)) &&
            (!strcmp(line, "y") || !strcmp(line, "Y") || !strcmp(line, "yes"));
        if (!yes) {
            fprintf(stderr, "reason (optional): ");
            fflush(stderr);
            if (!read_line(in, reason, sizeof(reason)))
                reason[0] = '\0';
        }
    }
    if (in && in != stdin)
        fclose(in);
    free(args);
    if (loom_turn_approve_in(p->turn, ev->run_id, id, yes,
                             reason[0] ? reason : NULL) != 0)
        fprintf(stderr, "loom: could not answer %s: %s\n", id,
                loom_error_last());
}

/* Writes an answer's (or, dimmed, reasoning's) text to stdout: cleaned
 * on a terminal. */
static void put_text(cli_printer *p, const char *text, size_t n, int dim)
{
    char *c = p->clean ? cli_clean(text, CLI_KEEP_NL | CLI_KEEP_TAB) : NULL;

    if (p->clean && !c)
        return;
    if (c) {
        text = c;
        n = strlen(c);
    }
    if (n) {
        if (dim && p->color)
            fputs("\033[2m", stdout);
        fwrite(text, 1, n, stdout);
        if (dim && p->color)
            fputs("\033[0m", stdout);
        fflush(stdout);
        p->wrote_text = 1;
        p->ended_nl = text[n - 1] == '\n';
    }
    free(c);
}

/* The plan the model saved (plan.updated), on stderr: its goal, then a
 * line per task with a mark for its status. */
static void plan_lines(cli_printer *p, const loom_event *ev)
{
    const json_t *plan = json_object_get(ev->data, "plan"), *t;
    const char *on = p->color ? "\033[2m" : "",
               *off = p->color ? "\033[0m" : "";
    size_t i;

    end_text_line(p);
    fprintf(stderr, "%splan: ", on);
    print_short(stderr, str(plan, "goal"), OUTPUT_SHOWN);
    fprintf(stderr, "%s\n", off);
    json_array_foreach(json_object_get(plan, "tasks"), i, t)
    {
        const char *st = str(t, "status");
        fprintf(stderr, "%s  [%s] ", on,
                !strcmp(st, "completed")     ? "x"
                : !strcmp(st, "in_progress") ? ">"
                : !strcmp(st, "failed")      ? "!"
                : !strcmp(st, "blocked")     ? "-"
                                             : " ");
        print_short(stderr, str(t, "description"), OUTPUT_SHOWN);
        fprintf(stderr, "%s\n", off);
    }
    fflush(stderr);
}

/* A source the answer cites (citation), under the answer on stdout. */
static void citation_line(cli_printer *p, const loom_event *ev)
{
    const char *title = str(ev->data, "title"), *url = str(ev->data, "url");

    end_text_line(p);
    if (!p->cited++)
        fputs("sources:\n", stdout);
    printf("  [%lld] ",
           (long long)json_integer_value(json_object_get(ev->data, "number")));
    print_short(stdout, *title ? title : url, OUTPUT_SHOWN);
    if (*title && *url) {
        fputs(" - ", stdout);
        print_short(stdout, url, OUTPUT_SHOWN);
    }
    fputc('\n', stdout);
    fflush(stdout);
}

/* Whether ev shows nothing with p (the spinner's line then stays). */
static int silent(const cli_printer *p, const loom_event *ev)
{
    switch (ev->type) {
    case LOOM_EV_MESSAGE_DELTA:
    case LOOM_EV_REASONING_DELTA:
    case LOOM_EV_PLAN_UPDATED:
    case LOOM_EV_CITATION:
        return p->json ? 0 : loom_event_depth(ev) > 0;
    case LOOM_EV_USAGE:
    case LOOM_EV_TOOL_METRIC:
    case LOOM_EV_CONTEXT:
    case LOOM_EV_TOOL_PROGRESS:
    case LOOM_EV_TOOL_DELTA:
        return !p->json;
    default:
        return 0;
    }
}

static int emit(const loom_event *ev, cli_printer *p);

int cli_printer_emit(const loom_event *ev, void *payload)
{
    cli_printer *p = payload;
    int rc;

    if (!p->spin || silent(p, ev))
        return emit(ev, p);
    cli_spinner_hold(p->spin);
    rc = emit(ev, p);
    cli_spinner_release(p->spin);
    return rc;
}

static int emit(const loom_event *ev, cli_printer *p)
{
    if (ev->type == LOOM_EV_APPROVAL_REQUIRED && p->turn) {
        if (p->json)
            print_json(ev);
        ask_approval(p, ev);
        return 0;
    }
    if (ev->type == LOOM_EV_MCP_ELICITATION && p->turn) {
        if (p->json)
            print_json(ev);
        ask_form(p, ev);
        return 0;
    }

    if (p->json) {
        print_json(ev);
        return 0;
    }
    if (loom_event_depth(ev) > 0) {
        /* A sub-agent's activity goes to stderr, indented: its tools as
         * they end (and start, on a terminal) and how it ended. */
        if (ev->type == LOOM_EV_TOOL_COMPLETED ||
            ev->type == LOOM_EV_TOOL_FAILED ||
            (ev->type == LOOM_EV_TOOL_STARTED && p->tty))
            tool_line(p, ev);
        else if (ev->type == LOOM_EV_RUN_COMPLETED ||
                 ev->type == LOOM_EV_RUN_FAILED)
            child_end_line(p, ev);
        return 0;
    }
    switch (ev->type) {
    case LOOM_EV_MESSAGE_DELTA:
    case LOOM_EV_REASONING_DELTA: {
        json_t *d = json_object_get(ev->data, "delta");
        int reasoning = ev->type == LOOM_EV_REASONING_DELTA;
        if (!json_string_length(d) || (reasoning && !p->chat))
            break;
        /* The answer starts on a line of its own under the reasoning. */
        if (p->reasoning != reasoning)
            end_text_line(p);
        p->reasoning = reasoning;
        put_text(p, json_string_value(d), json_string_length(d), reasoning);
        break;
    }
    case LOOM_EV_PLAN_UPDATED:
        if (p->chat)
            plan_lines(p, ev);
        break;
    case LOOM_EV_CITATION:
        if (p->chat)
            citation_line(p, ev);
        break;
    case LOOM_EV_TOOL_STARTED:
        if (p->tty)
            tool_line(p, ev);
        break;
    case LOOM_EV_TOOL_COMPLETED:
    case LOOM_EV_TOOL_FAILED:
        tool_line(p, ev);
        break;
    case LOOM_EV_RUN_COMPLETED:
    case LOOM_EV_RUN_FAILED:
        if (p->wrote_text && !p->ended_nl) {
            fputc('\n', stdout);
            fflush(stdout);
        }
        break;
    default:
        break;
    }
    return 0;
}
