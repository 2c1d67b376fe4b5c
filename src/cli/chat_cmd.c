/*
 * `loom chat`: an interactive chat on a terminal, on the same sessions
 * and store as `loom serve`, so every conversation persists and shows in
 * `loom conversations` (conversations_cmd.c) and the server's API.
 *
 * On a terminal (stdin and stdout both) lines are read with libedit (line
 * editing, a bounded history file kept across sessions), the answer
 * streams as it comes with the model's reasoning dimmed, running tools on
 * a spinner line and each tool's outcome, the plan and the sources the
 * answer cites (printer.c, spinner.c). Everything from outside is
 * cleaned before it reaches the terminal (clean.h). Lines starting with
 * '/' are commands (chat_line.c). Ctrl-C during an answer cancels that
 * turn (it is stored as cancelled) and gives the prompt back; Ctrl-C at
 * an empty prompt, or Ctrl-D, leaves.
 *
 * Without a terminal every line read is one message and its answer is
 * written to stdout, nothing else: no prompt, spinner or color.
 */
#include "cli/chat_line.h"
#include "cli/clean.h"
#include "cli/cli.h"
#include "cli/served.h"
#include "cli/spinner.h"
#include "loom/session.h"
#include "loom/store.h"

#include <errno.h>
#include <getopt.h>
#include <histedit.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define LINE_MAX_BYTES (1024 * 1024) /* a piped line past this is refused */
#define HISTORY_LINES 1000           /* the history file keeps these */

static const char chat_usage[] =
    "usage: loom chat [options]\n"
    "\n"
    "Chats with an agent on the terminal. Conversations are stored (the\n"
    "same database as `loom serve`) and listed by `loom conversations`.\n"
    "Type /help in the chat for its commands. Without a terminal, each\n"
    "line of stdin is a message and each answer a block on stdout.\n"
    "\n"
    "options:\n"
    "  -c, --config FILE        config file (default: $LOOM_CONFIG, else\n"
    "                           the environment alone)\n"
    "  -a, --agent NAME         agent from the config (default: the\n"
    "                           config's default_agent)\n"
    "  -m, --model NAME         provider/model, a bare name or agent/NAME\n"
    "  -d, --db PATH            SQLite database (default: the config's\n"
    "                           server.db, ./data/loom.db)\n"
    "  -C, --conversation ID    continue the conversation ID\n"
    "      --continue           continue the most recently updated\n"
    "                           conversation (a new one when none)\n"
    "      --user ID            chat as this user (their conversations,\n"
    "                           memories)\n"
    "      --approve-all        approve every tool call that needs approval\n"
    "      --log-level LEVEL    debug, info, warn (default), error, off\n"
    "      --log-format FORMAT  text (default) or json\n"
    "  -h, --help               this help\n"
    "\n"
    "exit codes: 0 done, 1 a conversation was not found (or, without a\n"
    "terminal, a turn failed), 2 usage or config error, 130 interrupted\n";

typedef struct {
    const char *config, *agent, *model, *db, *conversation, *user;
    const char *log_level, *log_format;
    int cont, approve_all;
} chat_args;

/* The chat going on. */
typedef struct {
    const chat_args *a;
    loom_session *session;
    loom_store *store;
    const loom_config *cfg;
    char *agent; /* NULL: the config's default agent */
    char *model; /* NULL: the agent's, else the session's default */
    char *conv;  /* NULL: the next message starts a conversation */
    int interactive;
    cli_spinner *spin; /* on a terminal */
    int failed;        /* without a terminal: a turn failed */
} chat;

/* A signal at the prompt: el_gets returns with it. */
static volatile sig_atomic_t prompt_signal;

static void on_prompt_signal(int sig)
{
    prompt_signal = sig;
}

/* Signals at the prompt interrupt the read (no SA_RESTART). */
static void catch_prompt_signals(void)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_prompt_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

static int parse_args(chat_args *a, int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"agent", required_argument, NULL, 'a'},
        {"model", required_argument, NULL, 'm'},
        {"db", required_argument, NULL, 'd'},
        {"conversation", required_argument, NULL, 'C'},
        {"continue", no_argument, NULL, 'R'},
        {"user", required_argument, NULL, 'U'},
        {"approve-all", no_argument, NULL, 'A'},
        {"log-level", required_argument, NULL, 'L'},
        {"log-format", required_argument, NULL, 'F'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    int c;

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":c:a:m:d:C:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            a->config = optarg;
            break;
        case 'a':
            a->agent = optarg;
            break;
        case 'm':
            a->model = optarg;
            break;
        case 'd':
            a->db = optarg;
            break;
        case 'C':
            a->conversation = optarg;
            break;
        case 'R':
            a->cont = 1;
            break;
        case 'U':
            a->user = optarg;
            break;
        case 'A':
            a->approve_all = 1;
            break;
        case 'L':
            a->log_level = optarg;
            break;
        case 'F':
            a->log_format = optarg;
            break;
        case 'h':
            fputs(chat_usage, stdout);
            return -1;
        default:
            return cli_getopt_fail("chat", c, argv, chat_usage);
        }
    }
    if (optind < argc)
        return cli_usage_error("chat", chat_usage, "unexpected argument '%s'",
                               argv[optind]);
    if (a->cont && a->conversation) {
        fprintf(stderr, "loom chat: --continue and --conversation do not "
                        "go together\n");
        return CLI_USAGE;
    }
    if ((a->db && !*a->db) || (a->user && !*a->user) ||
        (a->conversation && !*a->conversation)) {
        fprintf(stderr, "loom chat: --db, --user and --conversation need a "
                        "value\n");
        return CLI_USAGE;
    }
    return cli_check_log_args("chat", a->log_level, a->log_format);
}

/* Replaces *slot with a copy of s (NULL: none). */
static void set_str(char **slot, const char *s, size_t n)
{
    free(*slot);
    *slot = s ? strndup(s, n) : NULL;
}

/* The model the next turn runs, for display. */
static const char *current_model(const chat *c)
{
    const char *m;

    if (c->model)
        return c->model;
    m = loom_session_default_model(
        c->session, c->agent ? loom_config_agent(c->cfg, c->agent) : NULL);
    return m ? m : "(none)";
}

/* Remembers the conversation a turn started. */
static void adopt(chat *c, const loom_turn *turn)
{
    const char *id = loom_turn_conversation_id(turn);

    if (!c->conv && id && loom_turn_stored(turn))
        set_str(&c->conv, id, strlen(id));
}

/* One message and its answer, in the conversation. */
static int say(chat *c, const char *text, size_t len)
{
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages input = {0};
    loom_turn *turn = NULL;
    cli_printer p;
    char *msg = strndup(text, len);
    int rc;

    if (!msg || loom_messages_add(&input, LOOM_ROLE_USER, msg) != 0) {
        free(msg);
        return CLI_FAILED;
    }
    free(msg);
    cli_printer_init(&p, 0, c->a->approve_all);
    if (c->interactive) {
        p.chat = 1;
        p.spin = c->spin;
    } else {
        p.tty = p.color = 0;
    }
    to.conversation_id = c->conv;
    to.title = !c->conv;
    to.agent = c->agent;
    to.model = c->model;
    to.input = &input;
    to.user_id = c->a->user;
    to.sink.emit = cli_printer_emit;
    to.sink.payload = &p;
    to.elicitation = cli_has_terminal();
    if (loom_turn_new(&turn, c->session, &to) != 0) {
        fprintf(stderr, "loom chat: %s\n", loom_error_last());
        rc = CLI_FAILED;
    } else {
        rc = cli_turn_execute(turn, &p);
        adopt(c, turn);
    }
    if (c->spin)
        cli_spinner_clear(c->spin);
    loom_turn_free(turn);
    loom_messages_free(&input);
    return rc;
}

/* /research QUESTION: the research agent in this conversation. */
static int research(chat *c, const char *text, size_t len)
{
    loom_turn_options to = LOOM_TURN_OPTIONS_INIT;
    loom_messages input = {0};
    loom_turn *turn = NULL;
    char *msg = strndup(text, len);
    int rc;

    if (!msg || loom_messages_add(&input, LOOM_ROLE_USER, msg) != 0) {
        free(msg);
        return CLI_FAILED;
    }
    free(msg);
    to.conversation_id = c->conv;
    to.title = !c->conv;
    to.agent = LOOM_RESEARCH_AGENT;
    to.input = &input;
    to.user_id = c->a->user;
    rc = cli_research_turn(c->session, &to, c->a->log_level, c->a->log_format,
                           &turn);
    if (turn)
        adopt(c, turn);
    loom_turn_free(turn);
    loom_messages_free(&input);
    return rc;
}

/* /cost: the conversation's stored usage rows, summed. */
static void cost(chat *c)
{
    json_t *conv = NULL;
    chat_cost sum;
    char line[256];

    if (!c->conv) {
        puts("no conversation yet: nothing spent");
        return;
    }
    if (loom_store_conversation_get(c->store, c->conv, &conv) != 0) {
        fprintf(stderr, "loom chat: %s\n", loom_error_last());
        return;
    }
    memset(&sum, 0, sizeof(sum));
    chat_cost_add(&sum, json_object_get(conv, "usage"));
    chat_cost_format(&sum, line, sizeof(line));
    printf("%s: %s\n", c->conv, line);
    json_decref(conv);
}

/* /agent [NAME] */
static void agent_cmd(chat *c, const chat_command *cmd)
{
    if (!cmd->arg_len) {
        printf("agent: %s (agents:", c->agent ? c->agent : "(default)");
        for (size_t i = 0; i < c->cfg->agents_len; i++)
            printf(" %s", c->cfg->agents[i].name);
        puts(c->cfg->agents_len ? ")" : " none configured)");
        return;
    }
    set_str(&c->agent, cmd->arg, cmd->arg_len);
    if (!loom_config_agent(c->cfg, c->agent)) {
        fprintf(stderr, "loom chat: no agent named '%s' in the config\n",
                c->agent);
        set_str(&c->agent, NULL, 0);
        return;
    }
    printf("agent: %s, model %s\n", c->agent, current_model(c));
}

/*
 * Uses the model name from now on: a model, or agent/NAME (that agent
 * with its model). 0, or -1 with the reason said.
 */
static int use_model(chat *c, const char *name, size_t len)
{
    const loom_agent_config *ag = NULL;
    char *n = strndup(name, len), *model = NULL;
    int rc = -1;

    if (!n)
        return -1;
    if (loom_session_resolve_model(c->session, n, &ag, &model) != 0) {
        fprintf(stderr, "loom chat: %s\n", loom_error_last());
    } else if (ag) {
        set_str(&c->agent, ag->name, strlen(ag->name));
        set_str(&c->model, NULL, 0);
        rc = 0;
    } else {
        free(c->model);
        c->model = model;
        model = NULL;
        rc = 0;
    }
    free(model);
    free(n);
    return rc;
}

/* /model [NAME] */
static void model_cmd(chat *c, const chat_command *cmd)
{
    if (!cmd->arg_len || use_model(c, cmd->arg, cmd->arg_len) == 0)
        printf("agent: %s, model %s\n", c->agent ? c->agent : "(default)",
               current_model(c));
}

/*
 * Does what a line asks. Returns 1 to leave, else 0; a turn that failed
 * without a terminal is counted; one cancelled by a signal there leaves
 * with CLI_INTERRUPTED in *rc.
 */
static int handle(chat *c, const char *line, int *rc)
{
    chat_command cmd;
    int r = CLI_OK;

    chat_parse(line, &cmd);
    switch (cmd.verb) {
    case CHAT_EMPTY:
        break;
    case CHAT_SAY:
        r = say(c, cmd.arg, cmd.arg_len);
        break;
    case CHAT_RESEARCH:
        r = research(c, cmd.arg, cmd.arg_len);
        break;
    case CHAT_NEW:
        set_str(&c->conv, NULL, 0);
        puts("new conversation");
        break;
    case CHAT_AGENT:
        agent_cmd(c, &cmd);
        break;
    case CHAT_MODEL:
        model_cmd(c, &cmd);
        break;
    case CHAT_COST:
        cost(c);
        break;
    case CHAT_HELP:
        fputs(chat_help, stdout);
        break;
    case CHAT_EXIT:
        return 1;
    case CHAT_UNKNOWN:
        fprintf(stderr, "loom chat: unknown command %.*s (/help lists them)\n",
                (int)cmd.arg_len, cmd.arg);
        break;
    case CHAT_BAD:
        fprintf(stderr, "loom chat: %s\n", cmd.error);
        break;
    }
    fflush(stdout);
    if (r == CLI_INTERRUPTED && !c->interactive) {
        *rc = CLI_INTERRUPTED;
        return 1;
    }
    if (r != CLI_OK && r != CLI_INTERRUPTED)
        c->failed = 1;
    return 0;
}

/* Without a terminal: each line of stdin, in turn. */
static int piped(chat *c)
{
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = CLI_OK;

    while ((n = getline(&line, &cap, stdin)) >= 0) {
        if (n > LINE_MAX_BYTES) {
            fprintf(stderr,
                    "loom chat: a line of %zd bytes is over the "
                    "limit of %d: skipped\n",
                    n, LINE_MAX_BYTES);
            c->failed = 1;
            continue;
        }
        if (handle(c, line, &rc))
            break;
    }
    free(line);
    if (rc == CLI_OK && c->failed)
        rc = CLI_FAILED;
    return rc;
}

static char *prompt(EditLine *el)
{
    (void)el;
    return "> ";
}

/* Makes the folders of path (0700, like the rest of ~/.local/state). */
static void make_parents(const char *path)
{
    char *p = strdup(path);

    for (char *s = p ? p + 1 : NULL; s && *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0700) != 0 && errno != EEXIST)
            break;
        *s = '/';
    }
    free(p);
}

/* Says what the chat is about to continue, or that it starts afresh. */
static void banner(const chat *c)
{
    loom_conversation_info info;
    char *title;

    memset(&info, 0, sizeof(info));
    if (c->conv &&
        loom_store_conversation_info(c->store, c->conv, &info) == 0) {
        title = cli_clean(info.title, 0);
        fprintf(stderr, "loom chat: conversation %s \"%s\" (%lld messages)",
                c->conv, title ? title : "", (long long)info.message_count);
        free(title);
    } else {
        fputs("loom chat: new conversation", stderr);
    }
    loom_conversation_info_clear(&info);
    fprintf(stderr,
            ", agent %s, model %s\n/help for commands, Ctrl-D to "
            "leave\n",
            c->agent ? c->agent : "(default)", current_model(c));
}

/* On a terminal: read with libedit until /exit, Ctrl-D or Ctrl-C at an
 * empty prompt. */
static int interactive(chat *c)
{
    EditLine *el = el_init("loom", stdin, stdout, stderr);
    History *hist = history_init();
    HistEvent he;
    char *path = chat_history_path(getenv("XDG_STATE_HOME"), getenv("HOME"));
    int rc = CLI_OK, n;

    if (!el || !hist || cli_spinner_new(&c->spin, stderr) != 0) {
        fprintf(stderr, "loom chat: cannot set the terminal up\n");
        rc = CLI_FAILED;
        goto done;
    }
    history(hist, &he, H_SETSIZE, HISTORY_LINES);
    history(hist, &he, H_SETUNIQUE, 1);
    if (path) {
        make_parents(path);
        history(hist, &he, H_LOAD, path);
    }
    el_set(el, EL_EDITOR, "emacs");
    el_set(el, EL_PROMPT, prompt);
    el_set(el, EL_HIST, history, hist);
    el_source(el, NULL); /* the user's ~/.editrc */
    banner(c);
    for (;;) {
        const char *line;
        const LineInfo *li;
        int leave;

        prompt_signal = 0;
        catch_prompt_signals();
        line = el_gets(el, &n);
        if (!line) {
            li = el_line(el);
            fputc('\n', stdout);
            /* Ctrl-C on a line being typed drops that line only. */
            if (prompt_signal == SIGINT && li && li->lastchar > li->buffer)
                continue;
            break;
        }
        if (n > 0 && line[strspn(line, " \t\r\n")]) {
            char *entry = strndup(line, strcspn(line, "\r\n"));
            if (entry)
                history(hist, &he, H_ENTER, entry);
            free(entry);
            if (path && history(hist, &he, H_SAVE, path) < 0)
                fprintf(stderr, "loom chat: cannot save the history to %s\n",
                        path);
        }
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        leave = handle(c, line, &rc);
        if (leave)
            break;
    }
    if (c->conv)
        fprintf(stderr, "loom chat: to come back: loom chat -C %s\n", c->conv);
done:
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    cli_spinner_free(c->spin);
    c->spin = NULL;
    if (hist)
        history_end(hist);
    if (el)
        el_end(el);
    free(path);
    return rc;
}

/*
 * The conversation to continue (-C ID, --continue) into c->conv: an
 * unknown id (or another user's) is CLI_FAILED; --continue with none
 * starts a new one.
 */
static int pick_conversation(chat *c)
{
    const chat_args *a = c->a;
    loom_conversation_info info;
    json_t *list = NULL;
    const char *id;
    int rc = CLI_OK;

    memset(&info, 0, sizeof(info));
    if (a->conversation) {
        if (loom_store_conversation_info(c->store, a->conversation, &info) !=
                0 ||
            (a->user && (!info.user_id || strcmp(info.user_id, a->user)))) {
            fprintf(stderr, "loom chat: no conversation '%s'\n",
                    a->conversation);
            rc = CLI_FAILED;
        } else {
            set_str(&c->conv, info.id, strlen(info.id));
        }
        loom_conversation_info_clear(&info);
        return rc;
    }
    if (!a->cont)
        return CLI_OK;
    if (loom_store_conversation_search(c->store, a->user, NULL, NULL, 1,
                                       &list) != 0) {
        fprintf(stderr, "loom chat: %s\n", loom_error_last());
        return CLI_FAILED;
    }
    id = json_string_value(json_object_get(
        json_array_get(json_object_get(list, "data"), 0), "id"));
    if (id)
        set_str(&c->conv, id, strlen(id));
    else
        fprintf(stderr, "loom chat: no conversation to continue: a new one "
                        "starts\n");
    json_decref(list);
    return CLI_OK;
}

int cli_open_store(loom_store **out, const loom_config *cfg, const char *db,
                   const char *cmd)
{
    if (loom_store_open(out, db ? db : cfg->server.db) == 0)
        return 0;
    /* The store's messages name it and its location already. */
    fprintf(stderr, "loom %s: %s\n", cmd, loom_error_last());
    return CLI_FAILED;
}

int cli_chat(int argc, char **argv)
{
    chat_args a;
    chat c;
    loom_config *cfg = NULL;
    loom_session_options so = LOOM_SESSION_OPTIONS_INIT;
    loom_mcp_setup setup;
    cli_served sv;
    char *db = NULL;
    int rc, fake_pid = -1;

    memset(&a, 0, sizeof(a));
    memset(&c, 0, sizeof(c));
    memset(&setup, 0, sizeof(setup));
    memset(&sv, 0, sizeof(sv));
    c.a = &a;
    if ((rc = parse_args(&a, argc, argv)) != 0)
        return rc < 0 ? CLI_OK : rc;
    if ((rc = cli_load_config(&cfg, a.config)) != 0)
        return rc;
    cli_setup_log(cfg, a.log_level, a.log_format);
    if (!(db = strdup(a.db ? a.db : cfg->server.db))) {
        rc = CLI_FAILED;
        goto done;
    }
    if (cfg->providers_len == 0 && !a.model) {
        if (cfg->path) {
            fprintf(stderr, "loom chat: config %s names no model provider\n",
                    cfg->path);
            rc = CLI_USAGE;
            goto done;
        }
        fprintf(stderr, "loom chat: no model provider is configured "
                        "(OPENAI_API_KEY, ANTHROPIC_API_KEY and "
                        "GEMINI_API_KEY are not set): chatting with the "
                        "OFFLINE DEMO, loom's built-in fake model.\n");
        loom_config_free(cfg);
        cfg = NULL;
        if (cli_offline_start(&cfg, &fake_pid, 31536000) != 0) {
            rc = CLI_FAILED;
            goto done;
        }
        so.default_model = CLI_OFFLINE_MODEL;
    }
    /* The store and tools `loom serve` has; MCP forms are asked on the
     * terminal. */
    setup.elicitation = cli_has_terminal();
    if ((rc = cli_served_open(&sv, cfg, db, "chat", &setup)) != 0)
        goto done;
    so.config = cfg;
    so.store = sv.store;
    so.tools = sv.tools;
    if ((rc = cli_session_new(&c.session, &so)) != 0)
        goto done;
    c.store = sv.store;
    c.cfg = cfg;
    if (a.agent && !loom_config_agent(cfg, a.agent)) {
        fprintf(stderr, "loom chat: no agent named '%s' in the config\n",
                a.agent);
        rc = CLI_USAGE;
        goto done;
    }
    set_str(&c.agent, a.agent, a.agent ? strlen(a.agent) : 0);
    if (a.model && use_model(&c, a.model, strlen(a.model)) != 0) {
        rc = CLI_USAGE;
        goto done;
    }
    if ((rc = pick_conversation(&c)) != 0)
        goto done;
    c.interactive = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
    rc = c.interactive ? interactive(&c) : piped(&c);
done:
    free(c.agent);
    free(c.model);
    free(c.conv);
    loom_session_free(c.session);
    cli_served_close(&sv);
    cli_offline_stop(fake_pid);
    loom_config_free(cfg);
    free(db);
    return rc;
}
