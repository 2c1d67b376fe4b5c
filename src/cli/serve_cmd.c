/*
 * `loom serve`: the HTTP server (include/loom/server.h) from the command
 * line. It loads the config (or the environment alone), opens the store,
 * starts the server and prints one line, "listening HOST:PORT", on stdout
 * once it accepts connections (scripts and tests read the port from it).
 * SIGTERM or SIGINT stops it gracefully: no new connections, running
 * runs get shutdown_grace_ms to finish, then they are cancelled and
 * stored. A second signal exits at once.
 */
#include "cli/cli.h"
#include "cli/served.h"
#include "loom/log.h"
#include "loom/run.h"
#include "loom/server.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>



static const char serve_usage[] =
    "usage: loom serve [options]\n"
    "\n"
    "Serves loom's HTTP API: the OpenAI-compatible /v1/chat/completions,\n"
    "the native run API (/v1/runs, with server-sent events),\n"
    "conversations, /healthz, /readyz and /metrics.\n"
    "\n"
    "options:\n"
    "  -c, --config FILE        config file (default: $LOOM_CONFIG, else\n"
    "                           the environment alone)\n"
    "  -l, --listen HOST:PORT   address to listen on (default: the\n"
    "                           config's server.listen, 127.0.0.1:8080);\n"
    "                           port 0 picks a free port\n"
    "  -d, --db PATH            SQLite database (default: the config's\n"
    "                           server.db, ./data/loom.db)\n"
    "      --log-level LEVEL    debug, info (default), warn, error, off\n"
    "      --log-format FORMAT  text (default) or json\n"
    "  -h, --help               this help\n"
    "\n"
    "Prints \"listening HOST:PORT\" on stdout once it accepts connections.\n"
    "SIGTERM or SIGINT stops it gracefully (see server.shutdown_grace_ms);\n"
    "a second signal exits at once.\n"
    "\n"
    "exit codes: 0 stopped cleanly, 1 could not start, 2 usage or config\n"
    "error\n";

static loom_server *volatile current_server;
static volatile sig_atomic_t signals_seen;

static void on_signal(int sig)
{
    (void)sig;
    if (++signals_seen > 1)
        _exit(CLI_INTERRUPTED);
    if (current_server)
        loom_server_request_stop(current_server);
}

typedef struct {
    const char *config, *listen, *db, *log_level, *log_format;
} serve_args;

static int parse_args(serve_args *a, int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"listen", required_argument, NULL, 'l'},
        {"db", required_argument, NULL, 'd'},
        {"log-level", required_argument, NULL, 'L'},
        {"log-format", required_argument, NULL, 'F'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    int c;

    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":c:l:d:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c': a->config = optarg; break;
        case 'l': a->listen = optarg; break;
        case 'd': a->db = optarg; break;
        case 'L': a->log_level = optarg; break;
        case 'F': a->log_format = optarg; break;
        case 'h':
            fputs(serve_usage, stdout);
            return -1;
        default:
            return cli_getopt_fail("serve", c, argv, serve_usage);
        }
    }
    if (optind < argc)
        return cli_usage_error("serve", serve_usage, "unexpected argument '%s'",
                               argv[optind]);
    if (cli_check_log_args("serve", a->log_level, a->log_format) != 0)
        return CLI_USAGE;
    if ((a->listen && !*a->listen) || (a->db && !*a->db)) {
        fprintf(stderr, "loom serve: --listen and --db need a value\n");
        return CLI_USAGE;
    }
    return 0;
}

/* The host part of "HOST:PORT". */
static void host_of(char *dst, size_t cap, const char *listen)
{
    const char *colon = strrchr(listen, ':');
    size_t n = colon ? (size_t)(colon - listen) : strlen(listen);

    if (n >= cap)
        n = cap - 1;
    memcpy(dst, listen, n);
    dst[n] = '\0';
}

/*
 * No provider. A config file that was given and names none is a mistake:
 * CLI_USAGE. The environment alone without a key is a fresh machine: the
 * offline demo, as `loom run` does, said plainly; *cfg becomes the
 * demo's config (the environment's server settings are its defaults;
 * --listen and --db still apply) and *fake_pid the fake's.
 */
static int serve_offline(loom_config **cfg, int *fake_pid)
{
    if ((*cfg)->path) {
        fprintf(stderr,
                "loom serve: config %s names no model provider (and "
                "OPENAI_API_KEY, ANTHROPIC_API_KEY and GEMINI_API_KEY are "
                "not set): add one under providers:\n",
                (*cfg)->path);
        return CLI_USAGE;
    }
    fprintf(stderr,
            "loom serve: no model provider is configured (OPENAI_API_KEY, "
            "ANTHROPIC_API_KEY and GEMINI_API_KEY are not set and no config "
            "names one): serving the OFFLINE DEMO, whose model is loom's "
            "built-in fake (" CLI_OFFLINE_MODEL "); /readyz and /v1/models "
            "say offline_demo.\n"
            "loom serve: set one of them (and OPENAI_BASE_URL for another "
            "OpenAI-compatible server) or pass --config to use a real "
            "model.\n");
    loom_config_free(*cfg);
    *cfg = NULL;
    /* The longest the fake takes; it also ends with this process. */
    return cli_offline_start(cfg, fake_pid, 31536000) != 0 ? CLI_FAILED : 0;
}

int cli_serve(int argc, char **argv)
{
    loom_server_options so = LOOM_SERVER_OPTIONS_INIT;
    serve_args a;
    loom_config *cfg = NULL;
    loom_server *srv = NULL;
    const char *listen;
    char host[256];
    struct sigaction sa;
    cli_served sv;
    loom_mcp_setup setup;
    int rc, fake_pid = -1;

    memset(&a, 0, sizeof(a));
    memset(&sv, 0, sizeof(sv));
    memset(&setup, 0, sizeof(setup));
    if ((rc = parse_args(&a, argc, argv)) != 0)
        return rc < 0 ? CLI_OK : rc;
    if ((rc = cli_load_config(&cfg, a.config)) != 0)
        return rc;
    cli_setup_log(cfg, a.log_level ? a.log_level
                       : cfg->log_level ? NULL : "info",
                  a.log_format);
    /* Every client connection and upstream stream is a descriptor: the
     * soft limit (often 1,024) would cap loom far below max_connections.
     * The server logs what the limit allows once it listens. */
    if (loom_server_raise_fd_limit(NULL) != 0)
        loom_warn("cannot raise the open files limit: %s", loom_error_last());
    if (cfg->providers_len == 0 && (rc = serve_offline(&cfg, &fake_pid)) != 0)
        goto done;
    so.offline_demo = fake_pid > 0;
    listen = a.listen ? a.listen : cfg->server.listen;
    /* Every MCP server, failed ones too, for /readyz. */
    if (loom_mcp_set_new(&setup.servers) != 0) {
        fprintf(stderr, "loom serve: %s\n", loom_error_last());
        rc = CLI_FAILED;
        goto done;
    }
    /* Streamed runs forward MCP forms to their clients. */
    setup.elicitation = 1;
    /* loom starts at once: servers start beside it, runs wait for the
     * ones they need. */
    setup.background = 1;
    /* With accounts, each caller's own OAuth tokens (docs/mcp.md). */
    setup.per_user = cfg->auth.mode && (!strcmp(cfg->auth.mode, "keys") ||
                                        !strcmp(cfg->auth.mode, "jwt"));
    /* The set is sv's from here. */
    if ((rc = cli_served_open(&sv, cfg, a.db, "serve", &setup)) != 0)
        goto done;
    so.config = cfg;
    so.store = sv.store;
    so.tools = sv.tools;
    so.listen = listen;
    so.mcp_servers = sv.servers;
    if (loom_server_new(&srv, &so) != 0) {
        fprintf(stderr, "loom serve: %s\n", loom_error_last());
        rc = CLI_USAGE;
        goto done;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &sa, NULL);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    current_server = srv;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if ((rc = loom_server_start(srv)) != 0) {
        fprintf(stderr, "loom serve: %s\n", loom_error_last());
        rc = rc == LOOM_EINVALID ? CLI_USAGE : CLI_FAILED;
        goto done;
    }
    host_of(host, sizeof(host), listen);
    printf("listening %s:%d\n", host, loom_server_port(srv));
    fflush(stdout);
    loom_server_wait(srv);
    loom_server_stop(srv);
    rc = CLI_OK;

done:
    current_server = NULL;
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    loom_server_free(srv);
    cli_served_close(&sv);
    cli_offline_stop(fake_pid);
    loom_config_free(cfg);
    return rc;
}
