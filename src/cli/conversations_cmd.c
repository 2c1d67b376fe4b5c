/*
 * `loom conversations`: the stored conversations (`loom chat`'s, and
 * those the server keeps), newest first: id, title, when last updated
 * and how many messages, or the store's JSON with --json; --search finds
 * titles. Titles come from models: they are cleaned before they reach a
 * terminal.
 */
#include "cli/clean.h"
#include "cli/cli.h"
#include "loom/store.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define LIST_DEFAULT 20
#define LIST_MAX 100
#define TITLE_SHOWN 60 /* characters of a title in the table */

static const char conversations_usage[] =
    "usage: loom conversations [options]\n"
    "\n"
    "Lists the stored conversations, most recently updated first: id,\n"
    "last update, messages and title. `loom chat -C ID` continues one.\n"
    "\n"
    "options:\n"
    "  -c, --config FILE    config file (for its server.db)\n"
    "  -d, --db PATH        SQLite database (default: the config's\n"
    "                       server.db, ./data/loom.db)\n"
    "  -s, --search TEXT    only those whose title holds TEXT (any case)\n"
    "  -n, --limit N        at most N (1 to 100, default 20)\n"
    "      --user ID        only this user's\n"
    "      --json           the store's JSON: {\"data\": [...], "
    "\"has_more\",\n"
    "                       \"next\"}\n"
    "  -h, --help           this help\n"
    "\n"
    "exit codes: 0 listed, 1 the store failed, 2 usage or config error\n";

typedef struct {
    const char *config, *db, *search, *user;
    int limit, json;
} list_args;

static int parse_args(list_args *a, int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"db", required_argument, NULL, 'd'},
        {"search", required_argument, NULL, 's'},
        {"limit", required_argument, NULL, 'n'},
        {"user", required_argument, NULL, 'U'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    char *end;
    int c;

    optind = 1;
    opterr = 0;
    a->limit = LIST_DEFAULT;
    while ((c = getopt_long(argc, argv, ":c:d:s:n:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            a->config = optarg;
            break;
        case 'd':
            a->db = optarg;
            break;
        case 's':
            a->search = optarg;
            break;
        case 'U':
            a->user = optarg;
            break;
        case 'j':
            a->json = 1;
            break;
        case 'n':
            a->limit = (int)strtol(optarg, &end, 10);
            if (*end || a->limit < 1 || a->limit > LIST_MAX) {
                fprintf(stderr,
                        "loom conversations: --limit must be a "
                        "number from 1 to %d, got '%s'\n",
                        LIST_MAX, optarg);
                return CLI_USAGE;
            }
            break;
        case 'h':
            fputs(conversations_usage, stdout);
            return -1;
        default:
            return cli_getopt_fail("conversations", c, argv,
                                   conversations_usage);
        }
    }
    if (optind < argc)
        return cli_usage_error("conversations", conversations_usage,
                               "unexpected argument '%s'", argv[optind]);
    if ((a->db && !*a->db) || (a->user && !*a->user)) {
        fprintf(stderr, "loom conversations: --db and --user need a value\n");
        return CLI_USAGE;
    }
    return 0;
}

/* One row of the table: id, updated (local time), messages, title. */
static void row(const json_t *c, int clean)
{
    json_int_t ms = json_integer_value(json_object_get(c, "updated_at"));
    const char *t = json_string_value(json_object_get(c, "title"));
    time_t secs = (time_t)(ms / 1000);
    char when[32] = "?", *title = clean ? cli_clean(t, 0) : NULL;
    struct tm tm;
    size_t i, chars = 0;

    if (localtime_r(&secs, &tm))
        strftime(when, sizeof(when), "%Y-%m-%d %H:%M", &tm);
    if (clean)
        t = title;
    if (!t)
        t = "";
    for (i = 0; t[i]; i++)
        if (((unsigned char)t[i] & 0xC0) != 0x80 && ++chars > TITLE_SHOWN)
            break;
    printf("%-29s  %s  %8lld  %.*s%s\n",
           json_string_value(json_object_get(c, "id")), when,
           (long long)json_integer_value(json_object_get(c, "message_count")),
           (int)i, t, t[i] ? "..." : "");
    free(title);
}

int cli_conversations(int argc, char **argv)
{
    list_args a;
    loom_config *cfg = NULL;
    loom_store *store = NULL;
    json_t *list = NULL, *c;
    size_t i;
    int rc;

    memset(&a, 0, sizeof(a));
    if ((rc = parse_args(&a, argc, argv)) != 0)
        return rc < 0 ? CLI_OK : rc;
    if ((rc = cli_load_config(&cfg, a.config)) != 0)
        return rc;
    cli_setup_log(cfg, NULL, NULL);
    if ((rc = cli_open_store(&store, cfg, a.db, "conversations")) != 0)
        goto done;
    if (loom_store_conversation_search(store, a.user, a.search, NULL, a.limit,
                                       &list) != 0) {
        fprintf(stderr, "loom conversations: %s\n", loom_error_last());
        rc = CLI_FAILED;
        goto done;
    }
    if (a.json) {
        char *s = json_dumps(list, JSON_COMPACT);
        if (s)
            puts(s);
        free(s);
    } else {
        int clean = isatty(STDOUT_FILENO);
        if (json_array_size(json_object_get(list, "data")))
            printf("%-29s  %-16s  %8s  %s\n", "ID", "UPDATED", "MESSAGES",
                   "TITLE");
        json_array_foreach(json_object_get(list, "data"), i, c)
        {
            row(c, clean);
        }
        if (json_is_true(json_object_get(list, "has_more")))
            printf("(more: --limit up to %d, or --search)\n", LIST_MAX);
    }
    rc = CLI_OK;
done:
    json_decref(list);
    loom_store_free(store);
    loom_config_free(cfg);
    return rc;
}
