/*
 * Users' own settings (loom/accounts.h, docs/accounts.md "Per-user
 * settings"): what they may hold, how a change is checked and merged,
 * and how they are shown with every secret masked.
 *
 * The store keeps a user's settings as one sealed JSON text
 * (secrets.c), so the keys in them are never in the database in clear.
 * A change is checked whole before anything is merged, so a bad change
 * leaves the kept settings as they were. A kept member is never null:
 * null in a change removes it, so readers (the memory switch,
 * loom_memory_enabled) see only values of their type.
 */
#include "core/error.h"
#include "loom/accounts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The web-search backends that take a key (tools/web_search.c). */
static const char *const backends[] = {"tavily", "brave", "exa", NULL};

static int listed(const char *const *list, const char *s)
{
    for (size_t i = 0; list[i]; i++)
        if (!strcmp(list[i], s))
            return 1;
    return 0;
}

/* Names the member a change got wrong (into bad_field, may be NULL). */
static void name_field(char *bad_field, const char *field)
{
    if (bad_field)
        snprintf(bad_field, LOOM_SETTINGS_FIELD_SIZE, "%s", field);
}

/* A refusal of field, the message "settings: <field>..." (fmt follows
 * the field's %s); bad_field must be in scope. */
#define BAD(field, fmt, ...)                                                   \
    (name_field(bad_field, field),                                             \
     loom__error_set(LOOM_EINVALID, "settings: %s" fmt, field, __VA_ARGS__))

/* 1 when every byte of s is printable ASCII other than a space. */
static int key_text(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s <= ' ' || (unsigned char)*s >= 0x7f)
            return 0;
    return 1;
}

/* 1 when s has no control character (a header value may hold it). */
static int secret_text(const char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < ' ' || (unsigned char)*s == 0x7f)
            return 0;
    return 1;
}

static int name_text(const char *s)
{
    size_t n = strlen(s);

    if (n == 0 || n > LOOM_SETTINGS_SECRET_NAME_MAX)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
              (*s >= '0' && *s <= '9') || *s == '_'))
            return 0;
    return 1;
}

/* Checks one map (web_search_keys or secrets) of a change. */
static int check_map(const char *member, const json_t *m, int keys,
                     char *bad_field)
{
    char field[LOOM_SETTINGS_FIELD_SIZE];
    const char *name;
    json_t *v;

    if (json_is_null(m))
        return 0;
    if (!json_is_object(m))
        return BAD(member, " must be an object (or null)%s", "");
    json_object_foreach((json_t *)m, name, v)
    {
        const char *s = json_string_value(v);
        size_t n = s ? strlen(s) : 0;

        snprintf(field, sizeof(field), "%s.%.64s", member, name);
        if (keys && !listed(backends, name))
            return BAD(field,
                       ": %s is not a web_search backend that "
                       "takes a key (tavily, brave, exa)",
                       "the name");
        if (!keys && !name_text(name))
            return BAD(field,
                       ": %s is 1 to 64 characters of A-Z a-z "
                       "0-9 _",
                       "a secret's name");
        if (json_is_null(v))
            continue;
        if (!s || n == 0)
            return BAD(field,
                       " must be a non-empty string (or null to "
                       "remove it)%s",
                       "");
        if (keys && (n > LOOM_SETTINGS_KEY_MAX || !key_text(s)))
            return BAD(field,
                       ": %s is at most 512 printable "
                       "characters without spaces",
                       "a key");
        if (!keys && (n > LOOM_SETTINGS_SECRET_MAX || !secret_text(s)))
            return BAD(field,
                       ": %s is at most 4096 bytes without "
                       "control characters",
                       "a secret");
    }
    return 0;
}

/* Checks a whole change. */
static int check(const json_t *change, char *bad_field)
{
    const char *member;
    json_t *v;
    int rc;

    if (!json_is_object(change))
        return BAD("", "%s must be a JSON object", "the body");
    json_object_foreach((json_t *)change, member, v)
    {
        if (!strcmp(member, "web_search_keys") || !strcmp(member, "secrets")) {
            if ((rc = check_map(member, v, member[0] == 'w', bad_field)) != 0)
                return rc;
        } else if (!strcmp(member, "memory")) {
            if (!json_is_boolean(v) && !json_is_null(v))
                return BAD(member, " must be true or false%s", "");
        } else if (!strcmp(member, "instructions")) {
            if (!json_is_string(v) && !json_is_null(v))
                return BAD(member, " must be a string%s", "");
            if (json_string_length(v) > LOOM_SETTINGS_INSTRUCTIONS_MAX)
                return BAD(member, ": %s are at most 4000 bytes",
                           "the instructions");
        } else if (!strcmp(member, "default_agent")) {
            if (!json_is_null(v) &&
                (!json_is_string(v) || json_string_length(v) == 0 ||
                 json_string_length(v) > 64))
                return BAD(member,
                           " must be an agent's name (or "
                           "null)%s",
                           "");
        } else {
            char field[LOOM_SETTINGS_FIELD_SIZE];
            snprintf(field, sizeof(field), "%.80s", member);
            return BAD(field, ": %s",
                       "an unknown member (web_search_keys, "
                       "memory, instructions, default_agent, "
                       "secrets)");
        }
    }
    return 0;
}

/* Merges map change m into the kept settings' member. */
static int merge_map(json_t *kept, const char *member, const json_t *m)
{
    json_t *dst = json_object_get(kept, member), *v;
    const char *name;

    if (json_is_null(m))
        return json_object_del(kept, member), 0;
    if (!dst) {
        if (!(dst = json_object()) || json_object_set_new(kept, member, dst))
            return loom__error_oom();
    }
    json_object_foreach((json_t *)m, name, v)
    {
        if (json_is_null(v))
            json_object_del(dst, name);
        else if (json_object_set(dst, name, v) != 0)
            return loom__error_oom();
    }
    if (json_object_size(dst) == 0)
        json_object_del(kept, member);
    return 0;
}

static int merge(json_t *kept, const json_t *change)
{
    const char *member;
    json_t *v;
    int rc;

    json_object_foreach((json_t *)change, member, v)
    {
        if (!strcmp(member, "web_search_keys") || !strcmp(member, "secrets")) {
            if ((rc = merge_map(kept, member, v)) != 0)
                return rc;
        } else if (json_is_null(v) ||
                   (json_is_string(v) && json_string_length(v) == 0)) {
            json_object_del(kept, member);
        } else if (json_object_set(kept, member, v) != 0) {
            return loom__error_oom();
        }
    }
    return 0;
}

int loom_user_settings_get(loom_store *st, const char *user_id, json_t **out)
{
    char *text = NULL;
    int rc;

    *out = NULL;
    rc = loom_store_user_settings_load(st, user_id, &text);
    if (rc == LOOM_ENOTFOUND)
        return (*out = json_object()) ? 0 : loom__error_oom();
    if (rc != 0)
        return rc;
    *out = json_loads(text, 0, NULL);
    explicit_bzero(text, strlen(text));
    free(text);
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return loom__error_set(LOOM_EPROTO,
                               "store: the user's settings are not an object");
    }
    return 0;
}

int loom_user_settings_update(loom_store *st, const char *user_id,
                              const json_t *change, json_t **out,
                              char bad_field[LOOM_SETTINGS_FIELD_SIZE])
{
    json_t *kept = NULL, *secrets;
    char *text = NULL;
    int rc;

    if (out)
        *out = NULL;
    if (bad_field)
        bad_field[0] = '\0';
    if ((rc = check(change, bad_field)) != 0 ||
        (rc = loom_user_settings_get(st, user_id, &kept)) != 0 ||
        (rc = merge(kept, change)) != 0)
        goto done;
    secrets = json_object_get(kept, "secrets");
    if (json_object_size(secrets) > LOOM_SETTINGS_SECRETS_MAX) {
        rc = BAD("secrets", ": %s", "at most 32 secrets are kept");
        goto done;
    }
    if (!(text = json_dumps(kept, JSON_COMPACT))) {
        rc = loom__error_oom();
        goto done;
    }
    if ((rc = loom_store_user_settings_save(st, user_id, text)) == 0 && out)
        *out = json_incref(kept);
done:
    if (text) {
        explicit_bzero(text, strlen(text));
        free(text);
    }
    json_decref(kept);
    return rc;
}

/* The masked form of a key or secret. */
static json_t *mask(const char *s)
{
    char buf[32];
    size_t n = strlen(s), pre = 0;

    if (n < 12)
        return json_string("…");
    while (pre < 8 && s[pre] && s[pre] != '-' && s[pre] != '_')
        pre++;
    pre = pre < 8 && (s[pre] == '-' || s[pre] == '_') ? pre + 1 : 0;
    snprintf(buf, sizeof(buf), "%.*s…%s", (int)pre, s, s + n - 4);
    return json_string(buf);
}

static json_t *masked_map(const json_t *m)
{
    json_t *out = json_object(), *v;
    const char *name;

    json_object_foreach((json_t *)m, name, v)
    {
        if (!out ||
            json_object_set_new(out, name, mask(json_string_value(v))) != 0) {
            json_decref(out);
            return NULL;
        }
    }
    return out;
}

json_t *loom_user_settings_view(const json_t *settings)
{
    json_t *memory = json_object_get(settings, "memory");

    return json_pack("{s:o, s:b, s:O?, s:O?, s:o}", "web_search_keys",
                     masked_map(json_object_get(settings, "web_search_keys")),
                     "memory", !json_is_false(memory), "instructions",
                     json_object_get(settings, "instructions"), "default_agent",
                     json_object_get(settings, "default_agent"), "secrets",
                     masked_map(json_object_get(settings, "secrets")));
}
