/*
 * The loom command: dispatches to subcommands. Every subcommand answers
 * --help, and the exit codes are the same everywhere: 0 done, 1 the run
 * failed, 2 usage or config error, 130 interrupted.
 */
#include "cli/cli.h"
#include "loom/common.h"

#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: loom <command> [options]\n"
    "\n"
    "loom runs LLM agents: it calls a model, runs the tools the model asks\n"
    "for, feeds the results back and repeats until the model answers.\n"
    "\n"
    "commands:\n"
    "  run \"question\"       run an agent once and print its answer\n"
    "  research \"question\"  research a question: a cited report\n"
    "  chat                 chat on the terminal; conversations are kept\n"
    "  conversations        list the stored conversations\n"
    "  serve                serve the HTTP API (OpenAI-compatible and "
    "native)\n"
    "  config check FILE    validate a config file without running\n"
    "  tokens [FILE|-]      count the tokens of a file as a model does\n"
    "  mcp list|call        list the MCP servers' tools, or call one\n"
    "  keys create|list|revoke  API keys of a server's store\n"
    "  version              print loom's version\n"
    "\n"
    "Run `loom <command> --help` for a command's options.\n"
    "Environment: OPENAI_API_KEY, OPENAI_BASE_URL (any OpenAI-compatible\n"
    "server), LOOM_CONFIG (config file). With no key and no config, loom\n"
    "runs against its built-in fake model and says so.\n";

static const char version_usage[] =
    "usage: loom version\n"
    "\n"
    "Prints loom's version (the same as `loom --version`).\n";

int cli_usage_error(const char *cmd, const char *help, const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "loom %s: ", cmd);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n\n%s", help);
    return CLI_USAGE;
}

int cli_getopt_fail(const char *cmd, int c, char **argv, const char *help)
{
    return cli_usage_error(cmd, help,
                           c == ':' ? "option '%s' needs a value"
                                    : "unknown option '%s'",
                           argv[optind - 1]);
}

/* `loom version`: takes no options but --help. */
static int version(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(version_usage, stdout);
        return CLI_OK;
    }
    if (argc > 1) {
        return cli_usage_error("version", version_usage,
                               "unexpected argument '%s'", argv[1]);
    }
    printf("loom %s\n", loom_version());
    return CLI_OK;
}

int main(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : NULL;

    if (!cmd) {
        fputs(usage, stderr);
        return CLI_USAGE;
    }
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        fputs(usage, stdout);
        return CLI_OK;
    }
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version"))
        return version(argc - 1, argv + 1);
    if (!strcmp(cmd, "run"))
        return cli_run(argc - 1, argv + 1);
    if (!strcmp(cmd, "research"))
        return cli_research(argc - 1, argv + 1);
    if (!strcmp(cmd, "chat"))
        return cli_chat(argc - 1, argv + 1);
    if (!strcmp(cmd, "conversations"))
        return cli_conversations(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve"))
        return cli_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "config"))
        return cli_config(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokens"))
        return cli_tokens(argc - 1, argv + 1);
    if (!strcmp(cmd, "mcp"))
        return cli_mcp(argc - 1, argv + 1);
    if (!strcmp(cmd, "keys"))
        return cli_keys(argc - 1, argv + 1);
    fprintf(stderr, "loom: unknown command '%s'\n\n%s", cmd, usage);
    return CLI_USAGE;
}
