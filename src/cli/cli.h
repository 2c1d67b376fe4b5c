/*
 * The loom command's internals: each subcommand is a function taking its
 * own argv; shared pieces (config loading, the offline fake upstream, the
 * event printers) live beside them.
 */
#ifndef LOOM_CLI_H
#define LOOM_CLI_H

#include "loom/config.h"
#include "loom/run.h"
#include "loom/session.h"

#include <signal.h>

/* Exit codes of the loom command. */
#define CLI_OK 0
#define CLI_FAILED 1
#define CLI_USAGE 2
#define CLI_INTERRUPTED 130

int cli_run(int argc, char **argv);
int cli_config(int argc, char **argv);
int cli_serve(int argc, char **argv);
int cli_tokens(int argc, char **argv);
int cli_mcp(int argc, char **argv);
int cli_keys(int argc, char **argv);
int cli_research(int argc, char **argv);
int cli_chat(int argc, char **argv);
int cli_conversations(int argc, char **argv);

/*
 * A usage error of `loom <cmd>`: prints "loom <cmd>: <message>", a blank
 * line and help (the command's usage text) on stderr. Returns CLI_USAGE.
 */
int cli_usage_error(const char *cmd, const char *help, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * The usage error for c, what getopt_long returned for the option just
 * read (argv[optind - 1]) with opterr 0 and an optstring starting with
 * ':': ':' is an option missing its value, anything else an unknown
 * option. help: the command's usage text. Returns CLI_USAGE.
 */
int cli_getopt_fail(const char *cmd, int c, char **argv, const char *help);

/*
 * Loads the config: path (may be NULL: $LOOM_CONFIG, else the environment
 * alone). Prints the error and returns CLI_USAGE on failure.
 */
int cli_load_config(loom_config **out, const char *path);

/*
 * Opens the session of so (its config set), or prints the config's errors
 * and returns CLI_USAGE.
 */
int cli_session_new(loom_session **out, const loom_session_options *so);

/*
 * The question of `loom <cmd>`: argv[optind..] joined by spaces, or stdin
 * when an argument is "-" or none is given and stdin is not a terminal.
 * *out (caller frees) is the question; CLI_USAGE (message and usage
 * printed) when there is none or it is too large.
 */
int cli_question(char **out, int argc, char **argv, const char *cmd,
                 const char *usage);

/* Checks --log-level and --log-format of `loom <cmd>` (either may be
 * NULL): 0, or CLI_USAGE with the message printed. */
int cli_check_log_args(const char *cmd, const char *level, const char *format);

/* Applies the config's log settings unless the command line set them. */
void cli_setup_log(const loom_config *cfg, const char *level_arg,
                   const char *format_arg);
/* The same, the records going to out instead of stderr. */
void cli_setup_log_to(FILE *out, const loom_config *cfg, const char *level_arg,
                      const char *format_arg);

/*
 * The offline demo: starts the fake upstream with a scripted conversation
 * (for at most max_seconds, and never past this process's life) and
 * builds a config whose `offline` provider points at it (its one listed
 * model, so the default: CLI_OFFLINE_MODEL). Returns 0 and the fake's
 * pid, or -1 (message printed).
 */
#define CLI_OFFLINE_MODEL "offline/fake-model"
int cli_offline_start(loom_config **out, int *pid, long max_seconds);
void cli_offline_stop(int pid);

/* Sinks. */
typedef struct {
    int json;        /* --json: one JSON object per line on stdout */
    int tty;         /* stderr is a terminal: live tool lines */
    int color;
    /* Read by the SIGINT handler too (a second Ctrl-C ends the line). */
    volatile sig_atomic_t ended_nl; /* the answer so far ends with '\n' */
    volatile sig_atomic_t wrote_text;
    /* Answers approval.required (docs/agents.md "Approval and progress"):
     * the turn to answer, and --approve-all. */
    loom_turn *turn;
    int approve_all;
    /* stdout is a terminal: the answer is cleaned of control characters
     * and escape sequences (clean.h) before it is written. */
    int clean;
    /*
     * `loom chat` on a terminal: reasoning shown dimmed, the plan and the
     * answer's sources shown; spin (may be NULL): tools that run are
     * shown on its line instead of a line each as they start.
     */
    int chat;
    struct cli_spinner *spin;
    int reasoning; /* the last text written was reasoning */
    int cited;     /* sources shown so far */
} cli_printer;

int cli_printer_emit(const loom_event *ev, void *payload);

/* Whether there is a terminal to ask the person on (stdin, else
 * /dev/tty): approvals and MCP forms are asked there. */
int cli_has_terminal(void);

/* A printer for --json (json) and --approve-all (approve_all), its
 * terminal settings from stderr, stdout and $NO_COLOR. */
void cli_printer_init(cli_printer *p, int json, int approve_all);

/*
 * Executes turn with Ctrl-C and SIGTERM cancelling it (its whole tree of
 * runs; a second Ctrl-C exits at once, ending p's answer line). Returns
 * CLI_OK, CLI_INTERRUPTED (cancelled by a signal) or CLI_FAILED; a
 * failure or cancellation is said on stderr unless p->json.
 */
int cli_turn_execute(loom_turn *turn, cli_printer *p);

/*
 * Opens the store at db, else cfg's server.db (what `loom serve` uses),
 * or says why not ("loom <cmd>: ...") and returns CLI_FAILED.
 */
int cli_open_store(loom_store **out, const loom_config *cfg, const char *db,
                   const char *cmd);

/*
 * A research turn (to: its options, agent a research agent; its sink
 * and research settings are set here, no clarifying question) with the
 * progress of `loom research` on stderr (redrawn in place on a terminal,
 * the log written above it with log_level and log_format) and the report
 * on stdout (cleaned on a terminal). Ctrl-C cancels it as
 * cli_turn_execute does. *out (caller frees) is the turn once made.
 * Returns a CLI_* code.
 */
int cli_research_turn(loom_session *session, loom_turn_options *to,
                      const char *log_level, const char *log_format,
                      loom_turn **out);

#endif
