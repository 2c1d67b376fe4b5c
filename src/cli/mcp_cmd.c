/*
 * `loom mcp`: the config's MCP servers from a terminal. `list` starts
 * each server and shows its state, protocol version and tools (a server
 * that fails is shown with its error, and the others still listed);
 * `call` calls one tool and prints its result as the model would read
 * it; `login` runs the browser step of OAuth (mcp_login.c). All go
 * through libloom's MCP client (loom/mcp.h), as runs do, with OAuth
 * credentials kept in the store (mcp_store.c).
 */
#include "cli/cli.h"
#include "cli/mcp_store.h"
#include "loom/accounts.h"
#include "loom/mcp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char mcp_usage[] =
    "usage: loom mcp list [--config FILE] [--json]\n"
    "       loom mcp call [--config FILE] [--user NAME [--workspace W]]\n"
    "                     [--db PATH] SERVER TOOL ['{json arguments}']\n"
    "       loom mcp login [--config FILE] [--timeout SECONDS]\n"
    "                      [--user NAME [--workspace W]] [--db PATH] SERVER\n"
    "\n"
    "list: starts each server of the config's mcp_servers and prints its\n"
    "state, protocol version and tools (as offered: SERVER__TOOL).\n"
    "call: calls one tool (the server's name for it) and prints the result.\n"
    "login: authorizes loom for an HTTP server through your browser (prints\n"
    "the URL to open; waits --timeout seconds, default 300) and keeps the\n"
    "tokens, sealed, in the store (server.db, or --db).\n"
    "--user: a user's own credentials (accounts: auth mode keys or jwt), of\n"
    "user NAME of workspace W (default: default), or of the store user id\n"
    "NAME when it has a '/' (a service key's end user: W/USER/END_USER);\n"
    "without it, the server's own (what lists its tools).\n"
    "Exit codes: 0 done, 1 a server or call failed, 2 usage or config.\n";

static const loom_mcp_server_config *find_server(const loom_config *cfg,
                                                 const char *name)
{
    for (size_t i = 0; i < cfg->mcp_servers_len; i++)
        if (strcmp(cfg->mcp_servers[i].name, name) == 0)
            return &cfg->mcp_servers[i];
    return NULL;
}

/* Prints one server (text) or adds it to all (json); 0 when it worked. */
static int list_one(const loom_mcp_server_config *c, json_t *all,
                    const loom_mcp_credentials *creds)
{
    loom_mcp_server *s = NULL;
    json_t *tools = NULL, *st;
    const json_t *t;
    size_t i;
    int rc;

    if ((rc = loom_mcp_server_new(&s, c)) != 0) {
        fprintf(stderr, "loom mcp: %s\n", loom_error_last());
        return rc;
    }
    loom_mcp_server_set_credentials(s, creds);
    rc = loom_mcp_server_tools(s, &tools);
    st = loom_mcp_server_status(s);
    if (all) {
        json_object_set_new(st, "tools",
                            tools ? json_incref(tools) : json_array());
        json_array_append(all, st);
    } else {
        const char *v =
            json_string_value(json_object_get(st, "protocol_version"));
        printf("%s (%s): %s%s%s\n", c->name, c->transport,
               json_string_value(json_object_get(st, "state")),
               v ? ", protocol " : "", v ? v : "");
        if (rc != 0)
            printf("  error: %s\n", loom_error_last());
        json_array_foreach(tools, i, t)
        {
            char name[65];
            const char *d =
                json_string_value(json_object_get(t, "description"));
            loom_mcp_tool_name(name, c->name,
                               json_string_value(json_object_get(t, "name")));
            printf("  %s%s%.100s\n", name, d ? "  " : "", d ? d : "");
        }
    }
    json_decref(st);
    json_decref(tools);
    loom_mcp_server_free(s);
    return rc;
}

static int list(const loom_config *cfg, int as_json,
                const loom_mcp_credentials *creds)
{
    json_t *all = as_json ? json_array() : NULL;
    int failed = 0;

    if (!cfg->mcp_servers_len && !as_json)
        printf("no mcp_servers in the config\n");
    for (size_t i = 0; i < cfg->mcp_servers_len; i++)
        failed |= list_one(&cfg->mcp_servers[i], all, creds) != 0;
    if (all) {
        char *text = json_dumps(all, JSON_INDENT(2));
        if (text)
            puts(text);
        free(text);
        json_decref(all);
    }
    return failed ? CLI_FAILED : CLI_OK;
}

static int call(const loom_config *cfg, const char *server, const char *tool,
                const char *args_text, const loom_mcp_credentials *creds,
                const char *user)
{
    loom_mcp_call_options o = {0};
    const loom_mcp_server_config *c = find_server(cfg, server);
    loom_mcp_server *s = NULL;
    json_t *args = NULL, *res = NULL;
    loom_buf out = LOOM_BUF_INIT(64 << 20);
    json_error_t err;
    int rc = CLI_FAILED;

    if (!c) {
        fprintf(stderr, "loom mcp: no MCP server '%s' in the config\n", server);
        return CLI_USAGE;
    }
    /* json_is_object is a macro that reads its argument twice. */
    if (args_text)
        args = json_loads(args_text, 0, &err);
    if (args_text && !json_is_object(args)) {
        fprintf(stderr, "loom mcp: the arguments must be a JSON object%s%s\n",
                args ? "" : ": ", args ? "" : err.text);
        json_decref(args);
        return CLI_USAGE;
    }
    if (loom_mcp_server_new(&s, c) == 0)
        loom_mcp_server_set_credentials(s, creds);
    o.user = user;
    if (!s || loom_mcp_server_call_opts(s, tool, args, &o, &res) != 0) {
        fprintf(stderr, "loom mcp: %s\n", loom_error_last());
    } else {
        int is_error = loom_mcp_result_text(res, &out);
        fprintf(is_error ? stderr : stdout, "%s%s\n",
                is_error ? "loom mcp: the tool failed: " : "",
                loom_buf_cstr(&out));
        rc = is_error ? CLI_FAILED : CLI_OK;
    }
    loom_buf_free(&out);
    json_decref(res);
    json_decref(args);
    loom_mcp_server_free(s);
    return rc;
}

/* The store user id of --user NAME and --workspace W into out (NULL
 * when there is no --user); a CLI_ code. */
static int owner_of(const char *user, const char *workspace,
                    char out[LOOM_STORE_USER_ID_MAX + 1], const char **owner)
{
    *owner = NULL;
    if (!user)
        return workspace
                   ? (fputs("loom mcp: --workspace needs --user\n", stderr),
                      CLI_USAGE)
                   : CLI_OK;
    if (strchr(user, '/') && !workspace &&
        strlen(user) <= LOOM_STORE_USER_ID_MAX) {
        snprintf(out, LOOM_STORE_USER_ID_MAX + 1, "%s", user);
    } else if (loom_account_owner(
                   out, workspace ? workspace : LOOM_ACCOUNT_DEFAULT_WORKSPACE,
                   user, NULL) != 0) {
        fprintf(stderr, "loom mcp: --user %s%s%s: not a valid user\n", user,
                workspace ? " --workspace " : "", workspace ? workspace : "");
        return CLI_USAGE;
    }
    *owner = out;
    return CLI_OK;
}

int cli_mcp(int argc, char **argv)
{
    const char *config = NULL, *pos[4] = {NULL};
    const char *user = NULL, *workspace = NULL, *db = NULL, *owner;
    char owner_buf[LOOM_STORE_USER_ID_MAX + 1];
    loom_config *cfg = NULL;
    cli_mcp_store ms;
    int as_json = 0, npos = 0, rc;
    long timeout_s = 300;

    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(mcp_usage, stdout);
            return CLI_OK;
        } else if (!strcmp(argv[i], "--config") && i + 1 < argc) {
            config = argv[++i];
        } else if (!strcmp(argv[i], "--user") && i + 1 < argc) {
            user = argv[++i];
        } else if (!strcmp(argv[i], "--workspace") && i + 1 < argc) {
            workspace = argv[++i];
        } else if (!strcmp(argv[i], "--db") && i + 1 < argc) {
            db = argv[++i];
        } else if (!strcmp(argv[i], "--json")) {
            as_json = 1;
        } else if (!strcmp(argv[i], "--timeout") && i + 1 < argc) {
            char *end;
            timeout_s = strtol(argv[++i], &end, 10);
            if (*end || timeout_s < 1 || timeout_s > 86400) {
                fprintf(stderr, "loom mcp: --timeout takes 1 to 86400 "
                                "seconds\n");
                return CLI_USAGE;
            }
        } else if (npos < 4) {
            pos[npos++] = argv[i];
        } else {
            npos++;
        }
    }
    if (!(npos == 1 && !strcmp(pos[0], "list")) &&
        !(npos == 2 && !strcmp(pos[0], "login")) &&
        !((npos == 3 || npos == 4) && !strcmp(pos[0], "call"))) {
        fputs(mcp_usage, stderr);
        return CLI_USAGE;
    }
    if ((rc = owner_of(user, workspace, owner_buf, &owner)) != CLI_OK)
        return rc;
    if ((rc = cli_load_config(&cfg, config)) != 0)
        return rc;
    cli_setup_log(cfg, NULL, NULL);
    /* OAuth credentials come from, and go to, the store. */
    cli_mcp_store_init(&ms, cfg, NULL);
    ms.db = db;
    rc = !strcmp(pos[0], "list") ? list(cfg, as_json, &ms.credentials)
         : !strcmp(pos[0], "login")
             ? cli_mcp_login(cfg, pos[1], timeout_s, &ms.credentials, owner)
             : call(cfg, pos[1], pos[2], pos[3], &ms.credentials, owner);
    cli_mcp_store_free(&ms);
    loom_config_free(cfg);
    return rc;
}
