/*
 * The backend-neutral front of accounts (see loom/accounts.h): names and
 * limits checked, keys made and parsed, secrets hashed and compared, and
 * the audit entries written. A backend (sqlite_accounts.c) only stores
 * rows.
 *
 * A key's secret never leaves this file except in the caller's key_out
 * at creation: the store gets HMAC-SHA256(pepper, secret), messages name
 * at most the key's id, and the bytes of a key being checked are
 * compared only through the hash, in constant time (CRYPTO_memcmp). An
 * unknown id costs the same hash as a known one, so timing does not tell
 * the two apart either.
 */
#include "core/clock.h"
#include "core/error.h"
#include "loom/limits.h"
#include "store/store_internal.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#define KEY_PREFIX "lk_"
#define ID_HEX 16     /* 8 random bytes */
#define SECRET_HEX 48 /* 24 random bytes */
/* Bytes of a model or agent name a key may be limited to. */
#define ALLOW_NAME_MAX 128

static const char *const period_names[] = {"total", "day", "month"};

int loom_budget_period_parse(const char *s)
{
    for (int i = 0; s && i < 3; i++)
        if (!strcmp(s, period_names[i]))
            return i;
    return -1;
}

const char *loom_budget_period_name(loom_budget_period p)
{
    return (unsigned)p < 3 ? period_names[p] : "total";
}

int loom_account_name_valid(const char *s)
{
    size_t n = s ? strlen(s) : 0;

    if (n == 0 || n > LOOM_ACCOUNT_NAME_MAX)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
              (*s >= '0' && *s <= '9') || strchr("_-.@:+=", *s)))
            return 0;
    return 1;
}

void loom_key_info_clear(loom_key_info *k)
{
    if (!k)
        return;
    free(k->user);
    free(k->workspace);
    json_decref(k->models);
    json_decref(k->agents);
    memset(k, 0, sizeof(*k));
}

/* A time or a limit: null for zero. */
static json_t *or_null(int64_t v)
{
    return v ? json_integer((json_int_t)v) : json_null();
}

json_t *loom_limits_json(const loom_limits *l)
{
    return json_pack(
        "{s:o,s:o,s:o,s:o,s:s?,s:b}", "rpm", or_null(l->rpm), "tpm",
        or_null(l->tpm), "max_concurrent", or_null(l->max_concurrent),
        "budget_micros", or_null(l->budget_micros), "budget_period",
        l->budget_micros ? loom_budget_period_name(l->budget_period) : NULL,
        "budget_allow_unpriced", l->budget_allow_unpriced != 0);
}

json_t *loom_key_info_json(const loom_key_info *k)
{
    return json_pack("{s:s,s:s,s:s,s:s,s:b,s:I,s:o,s:o,s:O?,s:O?,s:o}", "id",
                     k->id, "object", "api_key", "user", k->user, "workspace",
                     k->workspace, "service", k->service, "created_at",
                     (json_int_t)k->created_at, "expires_at",
                     or_null(k->expires_at), "revoked_at",
                     or_null(k->revoked_at), "models", k->models, "agents",
                     k->agents, "limits", loom_limits_json(&k->limits));
}

/* ---- keys as text -------------------------------------------------------- */

static void hex(char *out, const unsigned char *in, size_t n)
{
    static const char digits[] = "0123456789abcdef";

    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

static int is_hex(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

/* Splits "lk_<id>_<secret>": 0 with id (LOOM_KEY_ID_SIZE) and *secret
 * pointing into key, or -1 when it has not that shape. */
static int key_parse(const char *key, char id[LOOM_KEY_ID_SIZE],
                     const char **secret)
{
    size_t p = strlen(KEY_PREFIX);

    if (!key || strlen(key) != LOOM_KEY_SIZE - 1 ||
        strncmp(key, KEY_PREFIX, p) != 0 || !is_hex(key + p, ID_HEX) ||
        key[p + ID_HEX] != '_' || !is_hex(key + p + ID_HEX + 1, SECRET_HEX))
        return -1;
    memcpy(id, key + p, ID_HEX);
    id[ID_HEX] = '\0';
    *secret = key + p + ID_HEX + 1;
    return 0;
}

static int id_valid(const char *id)
{
    return id && strlen(id) == ID_HEX && is_hex(id, ID_HEX);
}

/* HMAC-SHA256(pepper, secret). */
static int key_hash(const unsigned char pepper[LOOM__STORE_PEPPER_SIZE],
                    const char *secret,
                    unsigned char out[LOOM__STORE_KEY_HASH_SIZE])
{
    unsigned int n = 0;

    if (!HMAC(EVP_sha256(), pepper, LOOM__STORE_PEPPER_SIZE,
              (const unsigned char *)secret, strlen(secret), out, &n) ||
        n != LOOM__STORE_KEY_HASH_SIZE)
        return loom__error_set(LOOM_ERROR, "cannot hash a key");
    return 0;
}

int loom_secret_equal(const char *a, const char *b)
{
    unsigned char ha[SHA256_DIGEST_LENGTH], hb[SHA256_DIGEST_LENGTH];

    if (!a || !b)
        return 0;
    SHA256((const unsigned char *)a, strlen(a), ha);
    SHA256((const unsigned char *)b, strlen(b), hb);
    return CRYPTO_memcmp(ha, hb, sizeof(ha)) == 0;
}

int loom_account_owner(char *out, const char *workspace, const char *user,
                       const char *end_user)
{
    unsigned char h[SHA256_DIGEST_LENGTH];
    char full[3 * 128 + 3];
    size_t n;

    out[0] = '\0';
    if (!loom_account_name_valid(workspace) || !loom_account_name_valid(user) ||
        (end_user &&
         (!*end_user || strlen(end_user) > 128 || strpbrk(end_user, "/~"))))
        return loom__error_set(LOOM_EINVALID, "not a valid owner");
    n = (size_t)snprintf(full, sizeof(full), "%s/%s%s%s", workspace, user,
                         end_user ? "/" : "", end_user ? end_user : "");
    if (n <= LOOM_STORE_USER_ID_MAX) {
        memcpy(out, full, n + 1);
        return 0;
    }
    SHA256((const unsigned char *)full, n, h);
    out[0] = '~';
    hex(out + 1, h, sizeof(h));
    return 0;
}

/* ---- checks -------------------------------------------------------------- */

static int check_store(loom_store *st)
{
    return st ? 0 : loom__error_set(LOOM_EINVALID, "store: NULL store");
}

static int check_limits(const loom_limits *l)
{
    if (l->rpm < 0 || l->tpm < 0 || l->max_concurrent < 0 ||
        l->budget_micros < 0)
        return loom__error_set(LOOM_EINVALID,
                               "limits must be zero (none) or positive");
    if ((unsigned)l->budget_period > LOOM_BUDGET_MONTH ||
        (unsigned)l->budget_allow_unpriced > 1)
        return loom__error_set(LOOM_EINVALID,
                               "budget_period must be day, month or total, "
                               "budget_allow_unpriced 0 or 1");
    return 0;
}

/* A list of model or agent names as JSON text (NULL for none: any). */
static int allow_list(const char *what, const char *const *names, size_t n,
                      char **out)
{
    json_t *a;

    *out = NULL;
    if (!n)
        return 0;
    if (!names || n > LOOM_KEY_ALLOW_MAX)
        return loom__error_set(LOOM_EINVALID, "a key names at most %d %s",
                               LOOM_KEY_ALLOW_MAX, what);
    if (!(a = json_array()))
        return loom__error_oom();
    for (size_t i = 0; i < n; i++) {
        size_t len = names[i] ? strlen(names[i]) : 0;
        int ok = len > 0 && len <= ALLOW_NAME_MAX;
        for (size_t j = 0; ok && j < len; j++)
            ok = (unsigned char)names[i][j] > ' ' && names[i][j] != ',';
        if (!ok) {
            json_decref(a);
            return loom__error_set(LOOM_EINVALID,
                                   "%s: a name has 1 to %d characters, "
                                   "without blanks or commas",
                                   what, ALLOW_NAME_MAX);
        }
        json_array_append_new(a, json_string(names[i]));
    }
    *out = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    return *out ? 0 : loom__error_oom();
}

/* ---- keys ---------------------------------------------------------------- */

int loom_store_key_create(loom_store *st, const loom_key_spec *spec,
                          char key_out[LOOM_KEY_SIZE], loom_key_info *out)
{
    unsigned char pepper[LOOM__STORE_PEPPER_SIZE], raw[8 + 24];
    char secret[SECRET_HEX + 1];
    loom__store_key k;
    json_t *detail = NULL;
    char *models = NULL, *agents = NULL, *detail_text = NULL;
    int rc;

    if (out)
        memset(out, 0, sizeof(*out));
    if (key_out)
        key_out[0] = '\0';
    if ((rc = check_store(st)) != 0)
        return rc;
    if (!spec || !key_out)
        return loom__error_set(LOOM_EINVALID, "keys: no spec or no out");
    memset(&k, 0, sizeof(k));
    k.user = spec->user;
    k.workspace =
        spec->workspace ? spec->workspace : LOOM_ACCOUNT_DEFAULT_WORKSPACE;
    if (!loom_account_name_valid(k.user))
        return loom__error_set(LOOM_EINVALID,
                               "user: 1 to %d characters of A-Z a-z 0-9 "
                               "_ - . @ : + =",
                               LOOM_ACCOUNT_NAME_MAX);
    if (!loom_account_name_valid(k.workspace))
        return loom__error_set(LOOM_EINVALID,
                               "workspace: 1 to %d characters of A-Z a-z "
                               "0-9 _ - . @ : + =",
                               LOOM_ACCOUNT_NAME_MAX);
    if (spec->expires_at < 0)
        return loom__error_set(LOOM_EINVALID, "expires_at is negative");
    if ((rc = check_limits(&spec->limits)) != 0 ||
        (rc = allow_list("models", spec->models, spec->models_len, &models)) !=
            0 ||
        (rc = allow_list("agents", spec->agents, spec->agents_len, &agents)) !=
            0)
        goto cleanup;
    if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw)) {
        rc = loom__error_set(LOOM_ERROR, "no random bytes for a key");
        goto cleanup;
    }
    hex(k.id, raw, 8);
    hex(secret, raw + 8, 24);
    if ((rc = st->vt->key_pepper(st, 1, pepper)) != 0 ||
        (rc = key_hash(pepper, secret, k.hash)) != 0)
        goto cleanup;
    k.service = spec->service != 0;
    k.created_at = loom__unix_ms();
    k.expires_at = spec->expires_at;
    k.models = models;
    k.agents = agents;
    k.limits = spec->limits;
    if (!k.limits.budget_micros)
        k.limits.budget_period = LOOM_BUDGET_TOTAL;
    detail = json_pack("{s:b,s:o,s:o?,s:o?,s:o}", "service", k.service,
                       "expires_at", or_null(k.expires_at), "models",
                       models ? json_loads(models, 0, NULL) : NULL, "agents",
                       agents ? json_loads(agents, 0, NULL) : NULL, "limits",
                       loom_limits_json(&k.limits));
    if (!detail || !(detail_text = json_dumps(detail, JSON_COMPACT))) {
        rc = loom__error_oom();
        goto cleanup;
    }
    k.audit =
        (loom__store_audit){k.created_at,  spec->actor ? spec->actor : "api",
                            "key.created", k.id,
                            k.workspace,   k.user,
                            detail_text};
    if ((rc = st->vt->key_insert(st, &k)) != 0)
        goto cleanup;
    snprintf(key_out, LOOM_KEY_SIZE, KEY_PREFIX "%s_%s", k.id, secret);
    if (out)
        rc = st->vt->key_get(st, k.id, out, NULL);
cleanup:
    OPENSSL_cleanse(secret, sizeof(secret));
    OPENSSL_cleanse(raw, sizeof(raw));
    json_decref(detail);
    free(detail_text);
    free(models);
    free(agents);
    return rc;
}

/* Key id with its secret checked: 0, or LOOM_ENOTFOUND ("unknown key"). */
static int key_check(loom_store *st, const char *key, loom_key_info *out)
{
    static const unsigned char zero[LOOM__STORE_PEPPER_SIZE];
    unsigned char pepper[LOOM__STORE_PEPPER_SIZE];
    unsigned char want[LOOM__STORE_KEY_HASH_SIZE],
        got[LOOM__STORE_KEY_HASH_SIZE];
    char id[LOOM_KEY_ID_SIZE];
    const char *secret;
    int rc, found;

    memset(out, 0, sizeof(*out));
    memset(want, 0, sizeof(want));
    if (key_parse(key, id, &secret) != 0)
        return loom__error_set(LOOM_ENOTFOUND, "malformed key");
    rc = st->vt->key_pepper(st, 0, pepper);
    if (rc == LOOM_ENOTFOUND)
        memcpy(pepper, zero, sizeof(pepper));
    else if (rc != 0)
        return rc;
    rc = st->vt->key_get(st, id, out, want);
    if (rc != 0 && rc != LOOM_ENOTFOUND)
        return rc;
    found = rc == 0;
    /* The same work whether the id exists or not. */
    if ((rc = key_hash(pepper, secret, got)) != 0)
        goto fail;
    if (CRYPTO_memcmp(want, got, sizeof(got)) != 0 || !found) {
        rc = loom__error_set(LOOM_ENOTFOUND, "unknown key (id %s)", id);
        goto fail;
    }
    return 0;
fail:
    loom_key_info_clear(out);
    return rc;
}

int loom_store_key_verify(loom_store *st, const char *key, int64_t now,
                          loom_key_info *out)
{
    int rc;

    if (!out)
        return loom__error_set(LOOM_EINVALID, "keys: no out pointer");
    memset(out, 0, sizeof(*out));
    if ((rc = check_store(st)) != 0 || (rc = key_check(st, key, out)) != 0)
        return rc;
    if (out->revoked_at)
        rc = loom__error_set(LOOM_ENOTFOUND, "revoked key (id %s)", out->id);
    else if (out->expires_at && out->expires_at <= now)
        rc = loom__error_set(LOOM_ENOTFOUND, "expired key (id %s)", out->id);
    if (rc)
        loom_key_info_clear(out);
    return rc;
}

/* The audit entry of a change to key k, now. */
static void audit_of(loom__store_audit *a, const loom_key_info *k,
                     const char *actor, const char *action, const char *detail)
{
    *a = (loom__store_audit){loom__unix_ms(), actor ? actor : "api", action,
                             k->id,           k->workspace,          k->user,
                             detail};
}

int loom_store_key_revoke(loom_store *st, const char *id_or_key,
                          const char *actor, loom_key_info *out)
{
    loom__store_audit a;
    loom_key_info k;
    int rc;

    if (out)
        memset(out, 0, sizeof(*out));
    if ((rc = check_store(st)) != 0)
        return rc;
    memset(&k, 0, sizeof(k));
    if (id_or_key && !strncmp(id_or_key, KEY_PREFIX, strlen(KEY_PREFIX))) {
        if ((rc = key_check(st, id_or_key, &k)) != 0)
            return rc;
    } else if (!id_valid(id_or_key)) {
        return loom__error_set(LOOM_ENOTFOUND,
                               "no such key: give its id (16 hex digits) "
                               "or the whole key");
    } else if ((rc = st->vt->key_get(st, id_or_key, &k, NULL)) != 0) {
        return rc;
    }
    audit_of(&a, &k, actor, "key.revoked", NULL);
    rc = st->vt->key_revoke(st, k.id, &a, out);
    loom_key_info_clear(&k);
    return rc;
}

/* The limits to store (in, without a budget: period total) and the
 * audit detail of the change from old (JSON text, caller frees). */
static int limits_change(const loom_limits *old, const loom_limits *in,
                         loom_limits *l, char **text)
{
    json_t *detail;

    *l = *in;
    if (!l->budget_micros)
        l->budget_period = LOOM_BUDGET_TOTAL;
    detail = json_pack("{s:o,s:o}", "old", loom_limits_json(old), "new",
                       loom_limits_json(l));
    *text = detail ? json_dumps(detail, JSON_COMPACT) : NULL;
    json_decref(detail);
    return *text ? 0 : loom__error_oom();
}

int loom_store_key_set_limits(loom_store *st, const char *id,
                              const loom_limits *limits, const char *actor)
{
    loom__store_audit a;
    loom_key_info k;
    loom_limits l;
    char *text = NULL;
    int rc;

    if ((rc = check_store(st)) != 0)
        return rc;
    if (!limits)
        return loom__error_set(LOOM_EINVALID, "keys: no limits");
    if ((rc = check_limits(limits)) != 0)
        return rc;
    if (!id_valid(id))
        return loom__error_set(LOOM_ENOTFOUND, "no key with id '%s'",
                               id ? id : "");
    if ((rc = st->vt->key_get(st, id, &k, NULL)) != 0)
        return rc;
    if ((rc = limits_change(&k.limits, limits, &l, &text)) == 0) {
        audit_of(&a, &k, actor, "key.limits_changed", text);
        rc = st->vt->key_set_limits(st, k.id, &l, &a);
    }
    free(text);
    loom_key_info_clear(&k);
    return rc;
}

/* ---- lists --------------------------------------------------------------- */

/* NULL, or a valid name (else LOOM_EINVALID naming what). */
static int check_filter(const char *name, const char *what)
{
    if (name && !loom_account_name_valid(name))
        return loom__error_set(LOOM_EINVALID, "%s: not a valid name", what);
    return 0;
}

int loom_store_key_list(loom_store *st, const char *workspace, const char *user,
                        json_t **out)
{
    int rc;

    if (!out)
        return loom__error_set(LOOM_EINVALID, "keys: no out pointer");
    *out = NULL;
    if ((rc = check_store(st)) != 0 ||
        (rc = check_filter(workspace, "workspace")) != 0 ||
        (rc = check_filter(user, "user")) != 0)
        return rc;
    return st->vt->key_list(st, workspace, user, out);
}

int loom_store_user_list(loom_store *st, const char *workspace, json_t **out)
{
    int rc;

    if (!out)
        return loom__error_set(LOOM_EINVALID, "users: no out pointer");
    *out = NULL;
    if ((rc = check_store(st)) != 0 ||
        (rc = check_filter(workspace, "workspace")) != 0)
        return rc;
    return st->vt->user_list(st, workspace, out);
}

int loom_store_user_ensure(loom_store *st, const char *workspace,
                           const char *user, const char *actor, int *created)
{
    loom__store_audit a = {0};
    int made = 0, rc;

    if (created)
        *created = 0;
    if ((rc = check_store(st)) != 0)
        return rc;
    if (!loom_account_name_valid(workspace) || !loom_account_name_valid(user))
        return loom__error_set(LOOM_EINVALID,
                               "users: a user and a workspace are names of "
                               "1 to %d characters of A-Z a-z 0-9 "
                               "_ - . @ : + =",
                               LOOM_ACCOUNT_NAME_MAX);
    a.at = loom__unix_ms();
    a.actor = actor ? actor : "api";
    a.action = "user.created";
    a.workspace = workspace;
    a.user = user;
    rc = st->vt->user_ensure(st, &a, &made);
    if (rc == 0 && created)
        *created = made;
    return rc;
}

int loom_store_workspace_list(loom_store *st, json_t **out)
{
    int rc;

    if (!out)
        return loom__error_set(LOOM_EINVALID, "workspaces: no out pointer");
    *out = NULL;
    if ((rc = check_store(st)) != 0)
        return rc;
    return st->vt->workspace_list(st, out);
}

int loom_store_audit_list(loom_store *st, int limit, json_t **out)
{
    int rc;

    if (!out)
        return loom__error_set(LOOM_EINVALID, "audit: no out pointer");
    *out = NULL;
    if ((rc = check_store(st)) != 0)
        return rc;
    if (limit < 1 || limit > 1000)
        return loom__error_set(
            LOOM_EINVALID, "limit must be between 1 and 1000, got %d", limit);
    return st->vt->audit_list(st, limit, out);
}

/* ---- limits of users and workspaces, spend, audit (loom/limits.h) -------- */

int loom_store_account_limits(loom_store *st, const char *workspace,
                              const char *user, loom_limits *user_out,
                              loom_limits *workspace_out)
{
    loom_limits u, w;
    int rc;

    if (user_out)
        memset(user_out, 0, sizeof(*user_out));
    if (workspace_out)
        memset(workspace_out, 0, sizeof(*workspace_out));
    if ((rc = check_store(st)) != 0)
        return rc;
    if (!loom_account_name_valid(workspace) ||
        (user && !loom_account_name_valid(user)))
        return loom__error_set(LOOM_EINVALID, "limits: not a valid name");
    if ((rc = st->vt->account_limits(st, workspace, user, &u, &w)) != 0)
        return rc;
    if (user_out)
        *user_out = u;
    if (workspace_out)
        *workspace_out = w;
    return 0;
}

int loom_store_account_set_limits(loom_store *st, const char *workspace,
                                  const char *user, const loom_limits *limits,
                                  const char *actor)
{
    loom_limits u, w, l;
    loom__store_audit a;
    char *text = NULL;
    int rc;

    if ((rc = check_store(st)) != 0)
        return rc;
    if (!limits)
        return loom__error_set(LOOM_EINVALID, "limits: none given");
    if ((rc = check_limits(limits)) != 0)
        return rc;
    if (!loom_account_name_valid(workspace) ||
        (user && !loom_account_name_valid(user)))
        return loom__error_set(LOOM_EINVALID, "limits: not a valid name");
    if ((rc = st->vt->account_limits(st, workspace, user, &u, &w)) != 0 ||
        (rc = limits_change(user ? &u : &w, limits, &l, &text)) != 0)
        return rc;
    a = (loom__store_audit){loom__unix_ms(),
                            actor ? actor : "api",
                            user ? "user.limits_changed"
                                 : "workspace.limits_changed",
                            NULL,
                            workspace,
                            user,
                            text};
    rc = st->vt->account_set_limits(st, workspace, user, &l, &a);
    free(text);
    return rc;
}

int loom_store_audit_add(loom_store *st, const char *actor, const char *action,
                         const char *key_id, const char *workspace,
                         const char *user, const json_t *detail)
{
    loom__store_audit a;
    char *text = NULL;
    int rc;

    if ((rc = check_store(st)) != 0)
        return rc;
    if (!action || !*action)
        return loom__error_set(LOOM_EINVALID, "audit: no action");
    if (detail && !(text = json_dumps(detail, JSON_COMPACT)))
        return loom__error_oom();
    a = (loom__store_audit){loom__unix_ms(),
                            actor ? actor : "api",
                            action,
                            key_id,
                            workspace,
                            user,
                            text};
    rc = st->vt->audit_add(st, &a);
    free(text);
    return rc;
}

/* A spend's scope: loom/limits.h's names. */
static int check_scope(const char *scope)
{
    if (!scope || !*scope || strlen(scope) >= LOOM_LIMIT_SCOPE_SIZE)
        return loom__error_set(LOOM_EINVALID, "spend: bad scope");
    return 0;
}

int loom_store_spend_get(loom_store *st, const char *scope,
                         loom_budget_period period, int64_t period_start,
                         int64_t *out)
{
    int rc;

    *out = 0;
    if ((rc = check_store(st)) != 0 || (rc = check_scope(scope)) != 0)
        return rc;
    return st->vt->spend_get(st, scope, loom_budget_period_name(period),
                             period_start, out);
}

int loom_store_spend_add(loom_store *st, const char *scope,
                         loom_budget_period period, int64_t period_start,
                         int64_t micros, int64_t now)
{
    int rc;

    if ((rc = check_store(st)) != 0 || (rc = check_scope(scope)) != 0)
        return rc;
    if (micros < 0)
        return loom__error_set(LOOM_EINVALID, "spend: negative amount");
    return st->vt->spend_add(st, scope, loom_budget_period_name(period),
                             period_start, micros, now);
}

int loom_store_spend_list(loom_store *st, const char *scope_prefix,
                          json_t **out)
{
    int rc;

    *out = NULL;
    if ((rc = check_store(st)) != 0)
        return rc;
    if (scope_prefix && strlen(scope_prefix) >= LOOM_LIMIT_SCOPE_SIZE)
        return loom__error_set(LOOM_EINVALID, "spend: bad scope");
    return st->vt->spend_list(st, scope_prefix, out);
}
