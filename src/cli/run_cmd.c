/*
 * `loom run "question"`: one run of an agent from the terminal, and
 * `loom config check FILE`.
 *
 * The agent comes from --agent (or the config's default_agent); without
 * one, the default agent offers every built-in tool. The model comes from
 * --model, else the agent's, else $LOOM_MODEL, else a default for the
 * first provider the environment gives (openai/gpt-4o-mini,
 * anthropic/claude-sonnet-4-5, gemini/gemini-2.5-flash). The model is
 * reached through the router (loom/router.h): its fallbacks, request
 * options and prices apply. With no provider at all (no *_API_KEY, no
 * config) the run goes to the offline demo (offline.c) and says so on
 * stderr.
 *
 * Ctrl-C cancels the run cleanly (the upstream request is aborted and the
 * command exits 130); a second Ctrl-C exits at once.
 */
#include "cli/cli.h"
#include "cli/mcp_store.h"
#include "loom/log.h"
#include "loom/session.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_QUESTION (8 * 1024 * 1024)

static const char run_usage[] =
    "usage: loom run [options] \"question\"\n"
    "       echo \"question\" | loom run [options] -\n"
    "\n"
    "Runs an agent once: streams the answer to stdout and reports tool\n"
    "calls on stderr.\n"
    "\n"
    "options:\n"
    "  -c, --config FILE        config file (default: $LOOM_CONFIG, else\n"
    "                           the environment alone)\n"
    "  -a, --agent NAME         agent from the config (default: the\n"
    "                           config's default_agent, else every\n"
    "                           built-in tool)\n"
    "  -m, --model NAME         provider/model (openai/gpt-4o-mini), a bare\n"
    "                           name (gpt-4o: the default model's provider)\n"
    "                           or agent/NAME (docs/routing.md)\n"
    "  -n, --max-iterations N   model calls at most (default 10)\n"
    "  -s, --system TEXT        system prompt (overrides the agent's)\n"
    "      --json               print every event as a JSON line on stdout\n"
    "      --approve-all        approve every tool call that needs approval\n"
    "                           (else asked on the terminal; denied without\n"
    "                           one)\n"
    "      --log-level LEVEL    debug, info, warn (default), error, off\n"
    "      --log-format FORMAT  text (default) or json\n"
    "  -h, --help               this help\n"
    "\n"
    "exit codes: 0 done, 1 the run failed, 2 usage or config error,\n"
    "130 interrupted\n";

static const char config_usage[] =
    "usage: loom config check FILE\n"
    "\n"
    "Validates a config file (syntax, keys, types, references, tool names)\n"
    "without running anything. Exit 0 when valid, 2 otherwise.\n";

static loom_turn *volatile current_turn;
static cli_printer *volatile current_printer;
static volatile sig_atomic_t interrupts;

static void on_sigint(int sig)
{
    cli_printer *p = current_printer;
    ssize_t n;

    (void)sig;
    if (++interrupts > 1) {
        /* The answer's line ends, as on a cancel that finishes. */
        if (p && !p->json && p->wrote_text && !p->ended_nl) {
            n = write(STDOUT_FILENO, "\n", 1);
            (void)n;
        }
        _exit(CLI_INTERRUPTED);
    }
    if (current_turn)
        loom_turn_cancel(current_turn);
}

/*
 * Prints a config's errors (one per line) on stderr, each line after
 * "loom: config: ". A message that does not start with the file's name
 * (where, e.g. "loom.yaml") gets it in front, as a session's errors about
 * the config have always been shown.
 */
static void print_config_errors(const char *where, const char *text)
{
    size_t wlen = strlen(where);
    const char *p = text;

    if (wlen && (strncmp(text, where, wlen) != 0 || text[wlen] != ':'))
        fprintf(stderr, "loom: config: %s: ", where);
    else
        fputs("loom: config: ", stderr);
    for (;;) {
        const char *nl = strchr(p, '\n');

        if (!nl) {
            fprintf(stderr, "%s\n", p);
            break;
        }
        fprintf(stderr, "%.*s\nloom: config: ", (int)(nl - p), p);
        p = nl + 1;
    }
}

/* Loads the file at path, or prints every error of it (0 or CLI_USAGE). */
static int load_file(loom_config **out, const char *path)
{
    char *errors = NULL;

    if (loom_config_load_report(out, path, &errors) == 0)
        return 0;
    /* Every message of a load names its file. */
    print_config_errors("", errors ? errors : loom_error_last());
    free(errors);
    return CLI_USAGE;
}

int cli_load_config(loom_config **out, const char *path)
{
    if (!path || !*path)
        path = getenv("LOOM_CONFIG");
    if (path && *path)
        return load_file(out, path);
    if (loom_config_from_env(out) != 0) {
        fprintf(stderr, "loom: config: %s\n", loom_error_last());
        return CLI_USAGE;
    }
    return 0;
}

int cli_check_log_args(const char *cmd, const char *level, const char *format)
{
    if (level && loom_log_level_parse(level) < 0) {
        fprintf(stderr, "loom %s: unknown log level '%s'\n", cmd, level);
        return CLI_USAGE;
    }
    if (format && strcmp(format, "text") && strcmp(format, "json")) {
        fprintf(stderr, "loom %s: --log-format is text or json\n", cmd);
        return CLI_USAGE;
    }
    return 0;
}

void cli_setup_log(const loom_config *cfg, const char *level_arg,
                   const char *format_arg)
{
    cli_setup_log_to(stderr, cfg, level_arg, format_arg);
}

void cli_setup_log_to(FILE *out, const loom_config *cfg, const char *level_arg,
                      const char *format_arg)
{
    const char *lv = level_arg ? level_arg : cfg ? cfg->log_level : NULL;
    const char *fm = format_arg ? format_arg : cfg ? cfg->log_format : NULL;
    int level = lv ? loom_log_level_parse(lv) : LOOM_LOG_WARN;

    loom_log_set(out, level < 0 ? LOOM_LOG_WARN : (loom_log_level)level,
                 fm && !strcmp(fm, "json") ? LOOM_LOG_JSON : LOOM_LOG_TEXT);
}

int cli_config(int argc, char **argv)
{
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    loom_session *session = NULL;
    loom_config *cfg = NULL;
    int rc;

    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(config_usage, stdout);
        return CLI_OK;
    }
    if (argc != 3 || strcmp(argv[1], "check") != 0) {
        fputs(config_usage, stderr);
        return CLI_USAGE;
    }
    if (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) {
        fputs(config_usage, stdout);
        return CLI_OK;
    }
    if ((rc = load_file(&cfg, argv[2])) != 0)
        return rc;
    /* A session checks what a run would: tools, agents' tool names. */
    so.config = cfg;
    if (loom_session_new(&session, &so) != 0) {
        print_config_errors(argv[2], loom_error_last());
        rc = CLI_USAGE;
    } else {
        printf("%s: ok (%zu providers, %zu models, %zu agents)\n", argv[2],
               cfg->providers_len, cfg->models_len, cfg->agents_len);
        rc = CLI_OK;
    }
    loom_session_free(session);
    loom_config_free(cfg);
    return rc;
}

/* Reads the question from stdin ("-" or no argument with a pipe). */
static char *read_stdin(void)
{
    loom_buf b = LOOM_BUF_INIT(MAX_QUESTION);
    char chunk[8192];
    size_t n;

    while ((n = fread(chunk, 1, sizeof(chunk), stdin)) > 0) {
        if (loom_buf_put(&b, chunk, n) != 0) {
            fprintf(stderr, "loom: the question is larger than %d bytes\n",
                    MAX_QUESTION);
            loom_buf_free(&b);
            return NULL;
        }
    }
    while (b.len && (b.ptr[b.len - 1] == '\n' || b.ptr[b.len - 1] == '\r'))
        b.ptr[--b.len] = '\0';
    return loom_buf_detach(&b);
}

int cli_question(char **out, int argc, char **argv, const char *cmd,
                 const char *usage)
{
    loom_buf q = LOOM_BUF_INIT(MAX_QUESTION);
    int from_stdin = 0;

    for (int i = optind; i < argc; i++) {
        if (!strcmp(argv[i], "-"))
            from_stdin = 1;
        else if (loom_buf_printf(&q, "%s%s", q.len ? " " : "", argv[i]))
            break;
    }
    if (from_stdin || (optind >= argc && !isatty(STDIN_FILENO))) {
        loom_buf_free(&q);
        *out = read_stdin();
        if (!*out)
            return CLI_USAGE;
    } else {
        *out = loom_buf_detach(&q);
    }
    if (!*out || !**out) {
        fprintf(stderr, "loom %s: no question given\n\n%s", cmd, usage);
        return CLI_USAGE;
    }
    return 0;
}

typedef struct {
    const char *config, *agent, *model, *system, *log_level, *log_format;
    int max_iterations, json, approve_all;
    char *question;
} run_args;

static int parse_args(run_args *a, int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"agent", required_argument, NULL, 'a'},
        {"model", required_argument, NULL, 'm'},
        {"max-iterations", required_argument, NULL, 'n'},
        {"system", required_argument, NULL, 's'},
        {"json", no_argument, NULL, 'j'},
        {"approve-all", no_argument, NULL, 'A'},
        {"log-level", required_argument, NULL, 'L'},
        {"log-format", required_argument, NULL, 'F'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    int c;
    char *end;

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":c:a:m:n:s:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': a->config = optarg; break;
        case 'a': a->agent = optarg; break;
        case 'm': a->model = optarg; break;
        case 's': a->system = optarg; break;
        case 'j': a->json = 1; break;
        case 'A':
            a->approve_all = 1;
            break;
        case 'L': a->log_level = optarg; break;
        case 'F': a->log_format = optarg; break;
        case 'n':
            a->max_iterations = (int)strtol(optarg, &end, 10);
            if (*end || a->max_iterations < 1 || a->max_iterations > 1000) {
                fprintf(stderr, "loom run: --max-iterations must be a "
                                "number from 1 to 1000, got '%s'\n", optarg);
                return CLI_USAGE;
            }
            break;
        case 'h':
            fputs(run_usage, stdout);
            return -1;
        default:
            return cli_getopt_fail("run", c, argv, run_usage);
        }
    }
    if (cli_check_log_args("run", a->log_level, a->log_format) != 0)
        return CLI_USAGE;
    return cli_question(&a->question, argc, argv, "run", run_usage);
}

int cli_session_new(loom_session **out, const loom_session_options *so)
{
    const loom_config *cfg = so->config;

    if (loom_session_new(out, so) == 0)
        return 0;
    print_config_errors(cfg && cfg->path ? cfg->path : "environment",
                        loom_error_last());
    return CLI_USAGE;
}

void cli_printer_init(cli_printer *p, int json, int approve_all)
{
    memset(p, 0, sizeof(*p));
    p->json = json;
    p->tty = isatty(STDERR_FILENO);
    p->color = p->tty && !getenv("NO_COLOR");
    p->ended_nl = 1;
    p->approve_all = approve_all;
    p->clean = isatty(STDOUT_FILENO);
}

int cli_turn_execute(loom_turn *turn, cli_printer *p)
{
    struct sigaction sa;
    int rc;

    p->turn = turn;
    interrupts = 0;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    current_turn = turn;
    current_printer = p;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    rc = loom_turn_execute(turn);
    current_turn = NULL;
    current_printer = NULL;
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);

    if (rc == 0)
        return CLI_OK;
    if (loom_turn_status(turn) == LOOM_RUN_CANCELLED) {
        if (!p->json)
            fputs(p->chat ? "[stopped]\n" : "loom: run cancelled\n", stderr);
        return interrupts ? CLI_INTERRUPTED : CLI_FAILED;
    }
    if (!p->json)
        fprintf(stderr, "loom: run failed: %s\n",
                loom_run_error(loom_turn_run(turn)));
    return CLI_FAILED;
}

int cli_run(int argc, char **argv)
{
    run_args a;
    loom_config *cfg = NULL;
    loom_session *session = NULL;
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages input = {0};
    loom_turn *turn = NULL;
    cli_printer printer;
    int rc, fake_pid = -1;
    const char *agent = NULL;
    loom_tool_registry *tools = NULL;
    cli_mcp_store ms;
    int ms_ready = 0;

    memset(&a, 0, sizeof(a));
    if ((rc = parse_args(&a, argc, argv)) != 0) {
        free(a.question);
        return rc < 0 ? CLI_OK : rc;
    }
    if ((rc = cli_load_config(&cfg, a.config)) != 0)
        goto done;
    cli_setup_log(cfg, a.log_level, a.log_format);
    agent = a.agent;
    if (cfg->providers_len == 0 && !a.model) {
        fprintf(stderr,
                "loom: no model provider is configured (OPENAI_API_KEY, "
                "ANTHROPIC_API_KEY and GEMINI_API_KEY are not set and no "
                "config names one): running the OFFLINE DEMO against "
                "loom's built-in fake model.\n"
                "loom: set one of them (and OPENAI_BASE_URL for another "
                "OpenAI-compatible server) or pass --config to use a real "
                "model.\n");
        /* No provider means no agent either (an agent needs a model). */
        agent = NULL;
        loom_config_free(cfg);
        cfg = NULL;
        if (cli_offline_start(&cfg, &fake_pid, 600) != 0) {
            rc = CLI_FAILED;
            goto done;
        }
        so.default_model = CLI_OFFLINE_MODEL;
    }
    so.config = cfg;
    if (cfg->mcp_servers_len) {
        /* MCP servers keep their OAuth credentials in the store. */
        cli_mcp_store_init(&ms, cfg, NULL);
        ms_ready = 1;
        /* A form a server asks to fill in needs someone to ask. */
        ms.setup.elicitation = cli_has_terminal();
        /* The run waits only for the servers its agent uses. */
        ms.setup.background = 1;
        if (loom_tools_new_from_config_with(&tools, cfg, &ms.setup) != 0) {
            print_config_errors(cfg->path ? cfg->path : "environment",
                                loom_error_last());
            rc = CLI_USAGE;
            goto done;
        }
        so.tools = tools;
    }
    if ((rc = cli_session_new(&session, &so)) != 0)
        goto done;
    if (agent && !loom_config_agent(cfg, agent)) {
        fprintf(stderr, "loom run: no agent named '%s' in the config\n", agent);
        rc = CLI_USAGE;
        goto done;
    }
    if (loom_messages_add(&input, LOOM_ROLE_USER, a.question) != 0) {
        rc = CLI_FAILED;
        goto done;
    }

    cli_printer_init(&printer, a.json, a.approve_all);

    to.agent = agent;
    to.model = a.model;
    to.input = &input;
    to.system_prompt = a.system;
    to.max_iterations = a.max_iterations;
    to.sink.emit = cli_printer_emit;
    to.sink.payload = &printer;
    to.elicitation = cli_has_terminal();
    if (loom_turn_new(&turn, session, &to) != 0) {
        fprintf(stderr, "loom run: %s\n", loom_error_last());
        rc = CLI_USAGE;
        goto done;
    }
    rc = cli_turn_execute(turn, &printer);
done:
    loom_turn_free(turn);
    loom_messages_free(&input);
    loom_session_free(session);
    loom_tool_registry_free(tools);
    if (ms_ready)
        cli_mcp_store_free(&ms);
    cli_offline_stop(fake_pid);
    loom_config_free(cfg);
    free(a.question);
    return rc;
}
