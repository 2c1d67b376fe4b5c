/*
 * `loom keys`: API keys from a terminal, on the store's file directly
 * (loom/accounts.h), also while a server uses it: SQLite in WAL mode lets
 * both read at once, a write waits for the other's (busy timeout), and a
 * write that still finds the file busy is retried for a few seconds. A
 * key revoked here is refused by the server at its next request.
 *
 * `create` prints the new key as the last line of stdout (or, with
 * --json, the key's JSON with a "key" field): the only time it is shown.
 */
#include "cli/cli.h"
#include "core/clock.h"
#include "loom/accounts.h"
#include "loom/limits.h"

#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_NAMES LOOM_KEY_ALLOW_MAX
#define BUSY_TRIES 20 /* times 250 ms, on top of SQLite's own wait */

static const char keys_usage[] =
    "usage: loom keys create --db PATH --user NAME [--workspace W] "
    "[--service]\n"
    "                        [--rpm N] [--tpm N] [--max-concurrent N]\n"
    "                        [--budget-usd X] [--budget-period "
    "day|month|total]\n"
    "                        [--budget-allow-unpriced]\n"
    "                        [--models LIST] [--agents LIST] [--expires "
    "DATE] [--json]\n"
    "       loom keys list --db PATH [--workspace W] [--user NAME] [--json]\n"
    "       loom keys revoke --db PATH ID_OR_KEY\n"
    "       loom keys limits --db PATH --workspace W [--user NAME] [--rpm N]\n"
    "                        [--tpm N] [--max-concurrent N] [--budget-usd X]\n"
    "                        [--budget-period day|month|total]\n"
    "                        [--budget-allow-unpriced]\n"
    "\n"
    "create: makes an API key and prints it as the last line (the only\n"
    "time it is shown). LIST is comma-separated (provider/model names,\n"
    "agent names); DATE is YYYY-MM-DD or YYYY-MM-DDTHH:MM:SSZ (UTC).\n"
    "Limits are stored with the key; see docs/accounts.md.\n"
    "list: the keys (never their secrets). revoke: by id or whole key.\n"
    "limits: replaces the limits of a user (--user) or of a workspace\n"
    "(a limit left out is none).\n"
    "Works on the database of a running server.\n"
    "Exit codes: 0 done, 1 the store failed or no such key, 2 usage.\n";

typedef struct {
    const char *db, *user, *workspace, *models, *agents, *expires, *period;
    const char *rpm, *tpm, *max_concurrent, *budget;
    int service, json, unpriced;
    const char *arg; /* revoke's ID_OR_KEY */
} keys_args;

/* Prints "loom keys: <message>" and the usage; CLI_USAGE. */
#define usage_error(...) cli_usage_error("keys", keys_usage, __VA_ARGS__)

/* Options after the subcommand; CLI_OK or CLI_USAGE (printed). */
static int parse(int argc, char **argv, keys_args *a)
{
    static const struct {
        const char *name;
        size_t off;
    } opts[] = {
        {"--db", offsetof(keys_args, db)},
        {"--user", offsetof(keys_args, user)},
        {"--workspace", offsetof(keys_args, workspace)},
        {"--models", offsetof(keys_args, models)},
        {"--agents", offsetof(keys_args, agents)},
        {"--expires", offsetof(keys_args, expires)},
        {"--budget-period", offsetof(keys_args, period)},
        {"--rpm", offsetof(keys_args, rpm)},
        {"--tpm", offsetof(keys_args, tpm)},
        {"--max-concurrent", offsetof(keys_args, max_concurrent)},
        {"--budget-usd", offsetof(keys_args, budget)},
    };

    for (int i = 2; i < argc; i++) {
        size_t k;
        if (!strcmp(argv[i], "--service")) {
            a->service = 1;
            continue;
        }
        if (!strcmp(argv[i], "--json")) {
            a->json = 1;
            continue;
        }
        if (!strcmp(argv[i], "--budget-allow-unpriced")) {
            a->unpriced = 1;
            continue;
        }
        for (k = 0; k < sizeof(opts) / sizeof(*opts); k++)
            if (!strcmp(argv[i], opts[k].name))
                break;
        if (k < sizeof(opts) / sizeof(*opts)) {
            if (i + 1 >= argc)
                return usage_error("%s needs a value", argv[i]);
            *(const char **)((char *)a + opts[k].off) = argv[++i];
        } else if (argv[i][0] == '-' || a->arg) {
            return usage_error("unexpected argument '%s'", argv[i]);
        } else {
            a->arg = argv[i];
        }
    }
    if (!a->db)
        return usage_error("%s is required", "--db PATH");
    return CLI_OK;
}

/* A whole non-negative number into *out; 0, or -1 when it is not one. */
static int number(const char *s, long *out)
{
    char *end;
    long v;

    if (!s)
        return 0;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || !*s || *end || v < 0)
        return -1;
    *out = v;
    return 0;
}

/* "a,b,c" into names (pointing into buf, a copy); the count, or -1. */
static int split(const char *list, char *buf, size_t cap, const char **names)
{
    size_t len = list ? strlen(list) : 0;
    char *save = NULL;
    int n = 0;

    if (!list)
        return 0;
    if (len >= cap)
        return -1;
    memcpy(buf, list, len + 1);
    for (char *p = strtok_r(buf, ",", &save); p;
         p = strtok_r(NULL, ",", &save)) {
        if (n == MAX_NAMES)
            return -1;
        names[n++] = p;
    }
    return n;
}

/* Runs op until it is not a busy store (LOOM_EIO), a few seconds. */
#define RETRY_BUSY(rc, call)                                                   \
    for (int try_ = 0; try_ < BUSY_TRIES; try_++) {                            \
        if (((rc) = (call)) != LOOM_EIO)                                       \
            break;                                                             \
        usleep(250 * 1000);                                                    \
    }

/* The limit options into *l; CLI_OK or CLI_USAGE (printed). */
static int limits_of(const keys_args *a, loom_limits *l)
{
    double usd = 0;
    int p = 0;

    if (number(a->rpm, &l->rpm) || number(a->tpm, &l->tpm) ||
        number(a->max_concurrent, &l->max_concurrent))
        return usage_error("%s", "--rpm, --tpm and --max-concurrent take a "
                                 "whole number");
    if (a->budget) {
        char *end;
        usd = strtod(a->budget, &end);
        if (*end || !*a->budget || !(usd >= 0) || usd > 1e9)
            return usage_error("--budget-usd '%s' is not an amount", a->budget);
        l->budget_micros = (int64_t)llround(usd * 1e6);
    }
    if (a->period && (p = loom_budget_period_parse(a->period)) < 0)
        return usage_error("--budget-period '%s': day, month or total",
                           a->period);
    l->budget_period = (loom_budget_period)p;
    l->budget_allow_unpriced = a->unpriced;
    return CLI_OK;
}

/* `limits`: a user's or a workspace's limits. */
static int set_limits(loom_store *st, const keys_args *a)
{
    loom_limits l;
    int rc;

    memset(&l, 0, sizeof(l));
    if (!a->workspace)
        return usage_error("%s is required", "--workspace W");
    if ((rc = limits_of(a, &l)) != CLI_OK)
        return rc;
    RETRY_BUSY(rc, loom_store_account_set_limits(st, a->workspace, a->user, &l,
                                                 "cli"));
    if (rc == LOOM_EINVALID)
        return usage_error("%s", loom_error_last());
    if (rc) {
        fprintf(stderr, "loom keys: %s\n", loom_error_last());
        return CLI_FAILED;
    }
    if (a->user)
        printf("limits of user %s in workspace %s set\n", a->user,
               a->workspace);
    else
        printf("limits of workspace %s set\n", a->workspace);
    return CLI_OK;
}

static int create_key(loom_store *st, const keys_args *a)
{
    static char mbuf[8192], abuf[8192];
    const char *models[MAX_NAMES], *agents[MAX_NAMES];
    loom_key_spec spec = {.version = LOOM_KEY_SPEC_VERSION, .actor = "cli"};
    char key[LOOM_KEY_SIZE];
    loom_key_info info;
    int nm, na, rc;

    if (!a->user)
        return usage_error("%s is required", "--user NAME");
    spec.user = a->user;
    spec.workspace = a->workspace;
    spec.service = a->service;
    if ((rc = limits_of(a, &spec.limits)) != CLI_OK)
        return rc;
    if ((nm = split(a->models, mbuf, sizeof(mbuf), models)) < 0 ||
        (na = split(a->agents, abuf, sizeof(abuf), agents)) < 0)
        return usage_error("%s", "--models and --agents take at most 100 "
                                 "comma-separated names");
    spec.models = models;
    spec.models_len = (size_t)nm;
    spec.agents = agents;
    spec.agents_len = (size_t)na;
    if (a->expires && (spec.expires_at = loom__date_ms(a->expires)) <= 0)
        return usage_error("--expires '%s' is not YYYY-MM-DD or "
                           "YYYY-MM-DDTHH:MM:SSZ",
                           a->expires);
    RETRY_BUSY(rc, loom_store_key_create(st, &spec, key, &info));
    if (rc == LOOM_EINVALID)
        return usage_error("%s", loom_error_last());
    if (rc) {
        fprintf(stderr, "loom keys: %s\n", loom_error_last());
        return CLI_FAILED;
    }
    if (a->json) {
        json_t *o = loom_key_info_json(&info);
        json_object_set_new(o, "key", json_string(key));
        json_dumpf(o, stdout, JSON_INDENT(2));
        fputc('\n', stdout);
        json_decref(o);
    } else {
        printf("key id %s for %s in workspace %s%s\n", info.id, info.user,
               info.workspace, info.service ? " (service key)" : "");
        printf("%s\n", key);
    }
    loom_key_info_clear(&info);
    memset(key, 0, sizeof(key));
    return CLI_OK;
}

static int list_keys(loom_store *st, const keys_args *a)
{
    json_t *out = NULL, *k;
    size_t i;
    int rc;

    RETRY_BUSY(rc, loom_store_key_list(st, a->workspace, a->user, &out));
    if (rc) {
        fprintf(stderr, "loom keys: %s\n", loom_error_last());
        return rc == LOOM_EINVALID ? CLI_USAGE : CLI_FAILED;
    }
    if (a->json) {
        json_dumpf(out, stdout, JSON_INDENT(2));
        fputc('\n', stdout);
    } else {
        json_array_foreach(json_object_get(out, "data"), i, k)
        {
            printf(
                "%s  %s/%s%s%s\n", json_string_value(json_object_get(k, "id")),
                json_string_value(json_object_get(k, "workspace")),
                json_string_value(json_object_get(k, "user")),
                json_is_true(json_object_get(k, "service")) ? " service" : "",
                json_is_null(json_object_get(k, "revoked_at")) ? ""
                                                               : " revoked");
        }
    }
    json_decref(out);
    return CLI_OK;
}

static int revoke_key(loom_store *st, const keys_args *a)
{
    loom_key_info info;
    int rc;

    if (!a->arg)
        return usage_error("%s", "revoke needs the key's id or the key");
    RETRY_BUSY(rc, loom_store_key_revoke(st, a->arg, "cli", &info));
    if (rc) {
        fprintf(stderr, "loom keys: %s\n", loom_error_last());
        return CLI_FAILED;
    }
    printf("revoked key %s (%s/%s)\n", info.id, info.workspace, info.user);
    loom_key_info_clear(&info);
    return CLI_OK;
}

int cli_keys(int argc, char **argv)
{
    const char *sub = argc > 1 ? argv[1] : NULL;
    keys_args a;
    loom_store *st = NULL;
    int rc;

    if (!sub || !strcmp(sub, "--help") || !strcmp(sub, "-h")) {
        fputs(keys_usage, sub ? stdout : stderr);
        return sub ? CLI_OK : CLI_USAGE;
    }
    if (strcmp(sub, "create") && strcmp(sub, "list") && strcmp(sub, "revoke") &&
        strcmp(sub, "limits"))
        return usage_error("unknown subcommand '%s'", sub);
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(keys_usage, stdout);
            return CLI_OK;
        }
    memset(&a, 0, sizeof(a));
    if ((rc = parse(argc, argv, &a)) != CLI_OK)
        return rc;
    if (strcmp(sub, "revoke") && a.arg)
        return usage_error("unexpected argument '%s'", a.arg);
    if (loom_store_open(&st, a.db) != 0) {
        fprintf(stderr, "loom keys: %s\n", loom_error_last());
        return CLI_FAILED;
    }
    rc = !strcmp(sub, "create")   ? create_key(st, &a)
         : !strcmp(sub, "list")   ? list_keys(st, &a)
         : !strcmp(sub, "limits") ? set_limits(st, &a)
                                  : revoke_key(st, &a);
    loom_store_free(st);
    return rc;
}
