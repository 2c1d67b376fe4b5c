/*
 * loom/accounts.h: workspaces, users and their API keys, in the store.
 *
 * A workspace holds users; a user holds API keys. A key reads
 * `lk_<id>_<secret>`: the id (16 hex digits) names it in lists and logs,
 * the secret (48 hex digits, 192 random bits) is shown once, when the key
 * is made, and never kept: the store keeps HMAC-SHA256(pepper, secret),
 * the pepper being 32 random bytes the store makes once and keeps apart
 * from the keys (auth_secrets). A key is checked by recomputing that HMAC
 * and comparing in constant time. Revoking or expiring a key takes effect
 * at the next request that uses it (every check reads the store).
 *
 * A key is a user key (its user is the caller) or a service key (a
 * backend acting for its own end users; see docs/accounts.md). Keys,
 * users and workspaces carry limits (requests and tokens per minute,
 * concurrent runs, a budget per day, month or in total); they are stored
 * and listed here, and counted by loom/limits.h.
 *
 * Every change to a key is written to the audit log in the same
 * transaction: created, revoked, limits changed.
 *
 * Names (users, workspaces) are 1 to LOOM_ACCOUNT_NAME_MAX bytes of
 * A-Z a-z 0-9 _ - . @ : + = (no '/', which the server uses to join them).
 */
#ifndef LOOM_ACCOUNTS_H
#define LOOM_ACCOUNTS_H

#include "common.h"
#include "store.h"

#include <jansson.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_ACCOUNT_NAME_MAX 64
/* The workspace of a key made without one. */
#define LOOM_ACCOUNT_DEFAULT_WORKSPACE "default"
/* Bytes of a key as text: "lk_" + 16 + "_" + 48, and the NUL. */
#define LOOM_KEY_SIZE 69
/* Bytes of a key id ("3f9a0c1b2d4e5f60") and the NUL. */
#define LOOM_KEY_ID_SIZE 17
/* Models or agents a key may be limited to, at most. */
#define LOOM_KEY_ALLOW_MAX 100

typedef enum {
    LOOM_BUDGET_TOTAL = 0, /* the budget is for the key's whole life */
    LOOM_BUDGET_DAY,       /* per UTC day */
    LOOM_BUDGET_MONTH      /* per UTC month */
} loom_budget_period;

/* "total", "day", "month"; -1 for anything else. */
int loom_budget_period_parse(const char *s);
const char *loom_budget_period_name(loom_budget_period p);

/* Limits; zero means none for every field. */
typedef struct {
    long rpm;              /* requests per minute */
    long tpm;              /* tokens per minute */
    long max_concurrent;   /* runs at once */
    int64_t budget_micros; /* micro-dollars per budget_period */
    loom_budget_period budget_period;
    /* Under the budget, calls to a model without prices are let through
     * (and cost it nothing); else they are refused. */
    int budget_allow_unpriced;
} loom_limits;

/* What a new key is. Zero is the default for every field. */
typedef struct {
    unsigned version;
    const char *user;      /* required: a name (see above) */
    const char *workspace; /* NULL: LOOM_ACCOUNT_DEFAULT_WORKSPACE */
    int service;           /* a service key (docs/accounts.md) */
    int64_t expires_at;    /* Unix ms; 0: never */
    /* Models ("provider/model") and agents it may use; none: any. */
    const char *const *models;
    size_t models_len;
    const char *const *agents;
    size_t agents_len;
    loom_limits limits;
    /* Who makes it, for the audit log ("cli", "admin"); NULL: "api". */
    const char *actor;
} loom_key_spec;

#define LOOM_KEY_SPEC_VERSION 1

/* A key as stored (never its secret). Strings and JSON owned. */
typedef struct {
    char id[LOOM_KEY_ID_SIZE];
    char *user;
    char *workspace;
    int service;
    int64_t created_at; /* Unix ms */
    int64_t expires_at; /* 0: never */
    int64_t revoked_at; /* 0: not revoked */
    json_t *models;     /* array of names, or NULL: any */
    json_t *agents;     /* array of names, or NULL: any */
    loom_limits limits;
} loom_key_info;

void loom_key_info_clear(loom_key_info *k);

/* 1 when s is a valid user or workspace name. */
int loom_account_name_valid(const char *s);

/*
 * Makes a key: its user and workspace are created when new, the key row
 * and an audit entry ("key.created") are written in one transaction.
 * key_out (LOOM_KEY_SIZE bytes) receives the whole key, the only time it
 * exists; *info_out (may be NULL) what is stored. LOOM_EINVALID for a bad
 * name, list or limit (the message names it), LOOM_EIO when the write
 * fails.
 */
int loom_store_key_create(loom_store *st, const loom_key_spec *spec,
                          char key_out[LOOM_KEY_SIZE], loom_key_info *out);

/*
 * Checks key (as a client sent it) at time now (Unix ms): 0 and *out
 * filled when it is a stored key, not revoked and not expired; else
 * LOOM_ENOTFOUND, whose message says why ("malformed", "unknown",
 * "revoked", "expired") but never holds the key. The secret is compared
 * in constant time. A read only.
 */
int loom_store_key_verify(loom_store *st, const char *key, int64_t now,
                          loom_key_info *out);

/*
 * Revokes the key named by id_or_key (its id, or the whole key, whose
 * secret must then match) and writes "key.revoked" to the audit log, by
 * actor (NULL: "api"). *info_out (may be NULL) is the key as revoked.
 * LOOM_ENOTFOUND for no such key; revoking a revoked key changes nothing
 * and is not an error.
 */
int loom_store_key_revoke(loom_store *st, const char *id_or_key,
                          const char *actor, loom_key_info *out);

/*
 * Replaces key id's limits and writes "key.limits_changed" (old and new
 * values) to the audit log. LOOM_ENOTFOUND for no such key.
 */
int loom_store_key_set_limits(loom_store *st, const char *id,
                              const loom_limits *limits, const char *actor);

/*
 * The key as JSON: {"id", "object": "api_key", "user", "workspace",
 * "service", "created_at", "expires_at", "revoked_at", "models",
 * "agents", "limits": {"rpm", "tpm", "max_concurrent", "budget_micros",
 * "budget_period", "budget_allow_unpriced"}} (times in Unix ms or null;
 * a limit of zero is null).
 * New reference, NULL when out of memory.
 */
json_t *loom_key_info_json(const loom_key_info *k);

/* Limits as loom_key_info_json shows them ("limits"). New reference,
 * NULL when out of memory. */
json_t *loom_limits_json(const loom_limits *l);

/*
 * Lists keys, newest first: {"data": [key...]} as loom_key_info_json.
 * workspace and user (may be NULL) narrow the list.
 */
int loom_store_key_list(loom_store *st, const char *workspace, const char *user,
                        json_t **out);

/* {"data": [{"workspace", "name", "created_at", "keys"}]}: the users
 * (of workspace, or all with NULL), by workspace and name. */
int loom_store_user_list(loom_store *st, const char *workspace, json_t **out);

/*
 * Makes user in workspace (and the workspace) when they do not exist yet,
 * writing "user.created" by actor (NULL: "api") to the audit log in the
 * same transaction; *created (may be NULL) says whether it made the user.
 * How an identity provider's users come to exist (auth.mode jwt).
 * LOOM_EINVALID for a bad name, LOOM_EIO when the write fails.
 */
int loom_store_user_ensure(loom_store *st, const char *workspace,
                           const char *user, const char *actor, int *created);

/* {"data": [{"id", "created_at", "users"}]}: the workspaces, by id. */
int loom_store_workspace_list(loom_store *st, json_t **out);

/* The newest limit entries of the audit log, newest first (1..1000):
 * {"data": [{"id", "at", "actor", "action", "key_id", "workspace",
 * "user", "detail"}]}; detail is JSON or null. */
int loom_store_audit_list(loom_store *st, int limit, json_t **out);

/*
 * The store's user id (LOOM_STORE_USER_ID_MAX bytes at most) under which
 * an authenticated caller's conversations, runs and memories are kept:
 * "<workspace>/<user>" for a user, "<workspace>/<user>/<end_user>" for
 * the end user a service key names (end_user NULL: the service itself).
 * When that does not fit, "~" and the SHA-256 of it in hex: '/' and '~'
 * are in no name, so two callers never share an id. workspace and user
 * are account names, end_user a request's user (1 to 128 bytes without
 * '/' or '~'); LOOM_EINVALID otherwise. out has room for
 * LOOM_STORE_USER_ID_MAX + 1 bytes.
 */
int loom_account_owner(char *out, const char *workspace, const char *user,
                       const char *end_user);

/* ---- per-user settings (docs/accounts.md "Per-user settings") ------- */

/* Bytes of the personal instructions at most. */
#define LOOM_SETTINGS_INSTRUCTIONS_MAX 4000
/* Bytes of one web-search key at most (printable ASCII, no spaces). */
#define LOOM_SETTINGS_KEY_MAX 512
/* Named secrets at most, bytes of a name (A-Z a-z 0-9 _) and of a value
 * (no control characters). */
#define LOOM_SETTINGS_SECRETS_MAX 32
#define LOOM_SETTINGS_SECRET_NAME_MAX 64
#define LOOM_SETTINGS_SECRET_MAX 4096
/* Bytes of the name of a field a change got wrong, with its NUL. */
#define LOOM_SETTINGS_FIELD_SIZE 96

/*
 * A user's settings are a JSON object of these members, each optional:
 * "web_search_keys": {"tavily" | "brave" | "exa": key} (the user's own
 * web_search keys, used for that user's runs before the deployment's),
 * "memory": false (no memory tools, no memories in the prompt),
 * "instructions": text added to the system prompt, "default_agent": the
 * agent of a run that names none, and "secrets": {name: value} (what an
 * MCP server's headers may name as ${user.NAME}). They are kept sealed
 * (loom_store_user_settings_save) under the user's owner id.
 */

/* *out (new reference) is user_id's settings as kept, keys whole: {}
 * when there are none. Errors as loom_store_user_settings_load, but for
 * LOOM_ENOTFOUND. */
int loom_user_settings_get(loom_store *st, const char *user_id, json_t **out);

/*
 * Applies change (an object of the members above) to user_id's settings
 * and keeps them: a member given replaces the one kept, null removes it;
 * inside web_search_keys and secrets, each name given is set (null:
 * removed) and the others are kept. Checked first, all or nothing:
 * LOOM_EINVALID with a message for an unknown member, a wrong type, an
 * unknown web-search backend, a bad secret name, or a value past its
 * limit, and bad_field (may be NULL) the member's name ("instructions",
 * "secrets.token"). *out (may be NULL; new reference) is the settings
 * after. The agent is not checked against any configuration.
 */
int loom_user_settings_update(loom_store *st, const char *user_id,
                              const json_t *change, json_t **out,
                              char bad_field[LOOM_SETTINGS_FIELD_SIZE]);

/*
 * The settings as shown to their user: every key and secret masked (the
 * text before its first '-' or '_' when short, an ellipsis and its last
 * four characters; all of it hidden when shorter than 12), the rest as
 * kept, and "memory" always there (true unless turned off). New
 * reference; NULL when out of memory.
 */
json_t *loom_user_settings_view(const json_t *settings);

/*
 * 1 when the two secrets are equal, compared in time that does not
 * depend on where they differ (both are hashed first). NULL equals
 * nothing.
 */
int loom_secret_equal(const char *a, const char *b);

#ifdef __cplusplus
}
#endif
#endif
