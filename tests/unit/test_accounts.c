/*
 * Unit tests of accounts in the store (loom/accounts.h) on its SQLite
 * backend: making keys (shape, names, lists and limits checked), checking
 * them (right key, wrong secret, malformed, unknown, revoked, expired),
 * revoking by id and by the whole key, changing limits, the audit log of
 * every change, the lists of keys, users and workspaces, and that the
 * secret is never stored nor listed (the whole database file is searched
 * for it). Also the conversation owner the store keeps from creation and
 * the owner-scoped conversation list the server's isolation rests on.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/clock.h"
#include "loom/accounts.h"
#include "loom/store.h"
#include "store_fixture.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *g_path;
static loom_store *g_st;

static int setup(void **state)
{
    (void)state;
    g_path = test_db_path("accounts.db");
    g_st = test_store_open_ok(g_path);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    loom_store_free(g_st);
    test_db_remove(g_path);
    free(g_path);
    return 0;
}

static void make_key(const loom_key_spec *spec, char key[LOOM_KEY_SIZE],
                     loom_key_info *info)
{
    int rc = loom_store_key_create(g_st, spec, key, info);

    if (rc)
        fail_msg("key_create: %s", loom_error_last());
}

static void simple_key(const char *user, const char *ws,
                       char key[LOOM_KEY_SIZE])
{
    loom_key_spec spec = {.version = LOOM_KEY_SPEC_VERSION,
                          .user = user,
                          .workspace = ws,
                          .actor = "test"};
    make_key(&spec, key, NULL);
}

/* 1 when the bytes of s occur anywhere in the database files. */
static int db_holds(const char *s)
{
    const char *suffix[] = {"", "-wal"};
    int found = 0;

    for (int i = 0; i < 2 && !found; i++) {
        char path[1024];
        size_t len = 0;
        char *data;
        snprintf(path, sizeof(path), "%s%s", g_path, suffix[i]);
        if (!(data = test_read_file(path, &len)))
            continue;
        found = memmem(data, len, s, strlen(s)) != NULL;
        free(data);
    }
    return found;
}

static void test_create_and_verify(void **state)
{
    const char *models[] = {"openai/gpt-4o-mini"}, *agents[] = {"helper"};
    loom_key_spec spec = {.version = LOOM_KEY_SPEC_VERSION,
                          .user = "alice",
                          .workspace = "acme",
                          .service = 1,
                          .models = models,
                          .models_len = 1,
                          .agents = agents,
                          .agents_len = 1,
                          .limits = {.rpm = 60,
                                     .tpm = 1000,
                                     .max_concurrent = 2,
                                     .budget_micros = 5000000,
                                     .budget_period = LOOM_BUDGET_DAY}};
    char key[LOOM_KEY_SIZE];
    loom_key_info made, got;

    (void)state;
    make_key(&spec, key, &made);
    assert_int_equal(strlen(key), LOOM_KEY_SIZE - 1);
    assert_int_equal(strncmp(key, "lk_", 3), 0);
    assert_int_equal(key[19], '_');
    assert_memory_equal(key + 3, made.id, 16);
    assert_string_equal(made.user, "alice");
    assert_string_equal(made.workspace, "acme");
    assert_true(made.service);
    assert_int_equal(made.limits.rpm, 60);
    assert_int_equal(made.limits.budget_period, LOOM_BUDGET_DAY);

    assert_int_equal(loom_store_key_verify(g_st, key, loom__unix_ms(), &got),
                     0);
    assert_string_equal(got.id, made.id);
    assert_string_equal(json_string_value(json_array_get(got.models, 0)),
                        "openai/gpt-4o-mini");
    assert_string_equal(json_string_value(json_array_get(got.agents, 0)),
                        "helper");
    assert_int_equal(got.limits.tpm, 1000);
    assert_int_equal(got.limits.max_concurrent, 2);
    assert_int_equal(got.limits.budget_micros, 5000000);
    loom_key_info_clear(&got);

    /* The secret is nowhere in the file; the id is. */
    assert_false(db_holds(key + 20));
    assert_true(db_holds(made.id));
    loom_key_info_clear(&made);
}

static void test_bad_keys(void **state)
{
    char key[LOOM_KEY_SIZE], bad[LOOM_KEY_SIZE];
    loom_key_info got;
    const char *shapes[] = {"", "lk_", "sk-1234", "lk_0123456789abcdef_",
                            "lk_0123456789ABCDEF_00000000000000000000000000000"
                            "0000000000000000000"};

    (void)state;
    simple_key("bob", NULL, key);
    /* One secret digit changed. */
    memcpy(bad, key, sizeof(bad));
    bad[30] = bad[30] == '0' ? '1' : '0';
    assert_int_equal(loom_store_key_verify(g_st, bad, loom__unix_ms(), &got),
                     LOOM_ENOTFOUND);
    assert_null(strstr(loom_error_last(), bad + 20));
    /* An unknown id. */
    memcpy(bad, key, sizeof(bad));
    bad[5] = bad[5] == '0' ? '1' : '0';
    assert_int_equal(loom_store_key_verify(g_st, bad, loom__unix_ms(), &got),
                     LOOM_ENOTFOUND);
    for (size_t i = 0; i < sizeof(shapes) / sizeof(*shapes); i++)
        assert_int_equal(
            loom_store_key_verify(g_st, shapes[i], loom__unix_ms(), &got),
            LOOM_ENOTFOUND);
    assert_int_equal(loom_store_key_verify(g_st, NULL, 0, &got),
                     LOOM_ENOTFOUND);
}

static void test_bad_specs(void **state)
{
    const char *bad_models[] = {"a b"};
    char key[LOOM_KEY_SIZE];
    loom_key_spec spec = {.version = LOOM_KEY_SPEC_VERSION, .user = "u/x"};

    (void)state;
    assert_int_equal(loom_store_key_create(g_st, &spec, key, NULL),
                     LOOM_EINVALID);
    spec.user = "ok";
    spec.workspace = "";
    assert_int_equal(loom_store_key_create(g_st, &spec, key, NULL),
                     LOOM_EINVALID);
    spec.workspace = NULL;
    spec.limits.rpm = -1;
    assert_int_equal(loom_store_key_create(g_st, &spec, key, NULL),
                     LOOM_EINVALID);
    spec.limits.rpm = 0;
    spec.models = bad_models;
    spec.models_len = 1;
    assert_int_equal(loom_store_key_create(g_st, &spec, key, NULL),
                     LOOM_EINVALID);
    spec.models_len = 0;
    spec.limits.budget_period = (loom_budget_period)7;
    assert_int_equal(loom_store_key_create(g_st, &spec, key, NULL),
                     LOOM_EINVALID);
    /* Nothing was written. */
    assert_int_equal(test_db_int(g_path, "SELECT count(*) FROM api_keys"), 0);
    assert_int_equal(test_db_int(g_path, "SELECT count(*) FROM audit_log"), 0);
}

static void test_revoke_and_expire(void **state)
{
    char k1[LOOM_KEY_SIZE], k2[LOOM_KEY_SIZE], k3[LOOM_KEY_SIZE], id[17];
    loom_key_spec spec = {.version = LOOM_KEY_SPEC_VERSION, .user = "carol"};
    loom_key_info got;

    (void)state;
    simple_key("carol", NULL, k1);
    simple_key("carol", NULL, k2);
    memcpy(id, k1 + 3, 16);
    id[16] = '\0';
    assert_int_equal(loom_store_key_revoke(g_st, id, "test", &got), 0);
    assert_true(got.revoked_at > 0);
    loom_key_info_clear(&got);
    assert_int_equal(loom_store_key_verify(g_st, k1, loom__unix_ms(), &got),
                     LOOM_ENOTFOUND);
    assert_non_null(strstr(loom_error_last(), "revoked"));
    /* Twice: no error, no second entry. */
    assert_int_equal(loom_store_key_revoke(g_st, id, "test", NULL), 0);
    /* By the whole key; a wrong secret revokes nothing. */
    {
        char wrong[LOOM_KEY_SIZE];
        memcpy(wrong, k2, sizeof(wrong));
        wrong[40] = wrong[40] == 'a' ? 'b' : 'a';
        assert_int_equal(loom_store_key_revoke(g_st, wrong, "test", NULL),
                         LOOM_ENOTFOUND);
        assert_int_equal(loom_store_key_verify(g_st, k2, loom__unix_ms(), &got),
                         0);
        loom_key_info_clear(&got);
    }
    assert_int_equal(loom_store_key_revoke(g_st, k2, "test", NULL), 0);
    assert_int_equal(loom_store_key_verify(g_st, k2, loom__unix_ms(), &got),
                     LOOM_ENOTFOUND);
    assert_int_equal(loom_store_key_revoke(g_st, "nope", "test", NULL),
                     LOOM_ENOTFOUND);
    assert_int_equal(
        loom_store_key_revoke(g_st, "0000000000000000", "test", NULL),
        LOOM_ENOTFOUND);
    assert_int_equal(test_db_int(g_path, "SELECT count(*) FROM audit_log "
                                         "WHERE action = 'key.revoked'"),
                     2);

    /* Expiry: valid before, not at or after. */
    spec.expires_at = 2000000000000LL;
    make_key(&spec, k3, NULL);
    assert_int_equal(loom_store_key_verify(g_st, k3, 2000000000000LL - 1, &got),
                     0);
    loom_key_info_clear(&got);
    assert_int_equal(loom_store_key_verify(g_st, k3, 2000000000000LL, &got),
                     LOOM_ENOTFOUND);
    assert_non_null(strstr(loom_error_last(), "expired"));
}

static void test_limits_and_audit(void **state)
{
    char key[LOOM_KEY_SIZE], id[17];
    loom_limits l = {
        .rpm = 10, .budget_micros = 100, .budget_period = LOOM_BUDGET_MONTH};
    loom_key_info got;
    json_t *log = NULL, *e;

    (void)state;
    simple_key("dave", "ops", key);
    memcpy(id, key + 3, 16);
    id[16] = '\0';
    assert_int_equal(loom_store_key_set_limits(g_st, id, &l, "admin"), 0);
    assert_int_equal(loom_store_key_verify(g_st, key, loom__unix_ms(), &got),
                     0);
    assert_int_equal(got.limits.rpm, 10);
    assert_int_equal(got.limits.budget_period, LOOM_BUDGET_MONTH);
    loom_key_info_clear(&got);
    l.rpm = -5;
    assert_int_equal(loom_store_key_set_limits(g_st, id, &l, "admin"),
                     LOOM_EINVALID);
    assert_int_equal(
        loom_store_key_set_limits(g_st, "ffffffffffffffff", &l, "admin"),
        LOOM_EINVALID);
    l.rpm = 1;
    assert_int_equal(
        loom_store_key_set_limits(g_st, "ffffffffffffffff", &l, "admin"),
        LOOM_ENOTFOUND);

    assert_int_equal(loom_store_audit_list(g_st, 10, &log), 0);
    assert_int_equal(json_array_size(json_object_get(log, "data")), 2);
    e = json_array_get(json_object_get(log, "data"), 0);
    assert_string_equal(json_string_value(json_object_get(e, "action")),
                        "key.limits_changed");
    assert_string_equal(json_string_value(json_object_get(e, "actor")),
                        "admin");
    assert_string_equal(json_string_value(json_object_get(e, "key_id")), id);
    assert_int_equal(
        json_integer_value(json_object_get(
            json_object_get(json_object_get(e, "detail"), "new"), "rpm")),
        10);
    assert_true(json_is_null(json_object_get(
        json_object_get(json_object_get(e, "detail"), "old"), "rpm")));
    e = json_array_get(json_object_get(log, "data"), 1);
    assert_string_equal(json_string_value(json_object_get(e, "action")),
                        "key.created");
    assert_string_equal(json_string_value(json_object_get(e, "workspace")),
                        "ops");
    assert_string_equal(json_string_value(json_object_get(e, "user")), "dave");
    {
        char *text = json_dumps(log, 0);
        assert_null(strstr(text, key + 20));
        free(text);
    }
    json_decref(log);
    assert_int_equal(loom_store_audit_list(g_st, 0, &log), LOOM_EINVALID);
}

static void test_lists(void **state)
{
    char k[LOOM_KEY_SIZE];
    json_t *out = NULL;
    char *text;

    (void)state;
    simple_key("erin", "a", k);
    simple_key("erin", "a", k);
    simple_key("frank", "b", k);
    assert_int_equal(loom_store_key_list(g_st, NULL, NULL, &out), 0);
    assert_int_equal(json_array_size(json_object_get(out, "data")), 3);
    text = json_dumps(out, 0);
    assert_null(strstr(text, k + 20));
    free(text);
    json_decref(out);
    assert_int_equal(loom_store_key_list(g_st, "a", "erin", &out), 0);
    assert_int_equal(json_array_size(json_object_get(out, "data")), 2);
    json_decref(out);
    assert_int_equal(loom_store_key_list(g_st, "b", "erin", &out), 0);
    assert_int_equal(json_array_size(json_object_get(out, "data")), 0);
    json_decref(out);
    assert_int_equal(loom_store_key_list(g_st, "bad/ws", NULL, &out),
                     LOOM_EINVALID);

    assert_int_equal(loom_store_user_list(g_st, NULL, &out), 0);
    assert_int_equal(json_array_size(json_object_get(out, "data")), 2);
    assert_int_equal(
        json_integer_value(json_object_get(
            json_array_get(json_object_get(out, "data"), 0), "keys")),
        2);
    json_decref(out);
    assert_int_equal(loom_store_workspace_list(g_st, &out), 0);
    assert_int_equal(json_array_size(json_object_get(out, "data")), 2);
    assert_string_equal(
        json_string_value(json_object_get(
            json_array_get(json_object_get(out, "data"), 1), "id")),
        "b");
    json_decref(out);
}

static void test_secret_equal(void **state)
{
    (void)state;
    assert_true(loom_secret_equal("abc", "abc"));
    assert_false(loom_secret_equal("abc", "abd"));
    assert_false(loom_secret_equal("abc", "abcd"));
    assert_false(loom_secret_equal(NULL, "abc"));
    assert_false(loom_secret_equal("abc", NULL));
}

/* A conversation is its owner's from creation; the owner-scoped list
 * shows only that owner's, and an `after` of another's is not found. */
static void test_conversation_owner(void **state)
{
    loom_conversation_info info;
    json_t *out = NULL;

    (void)state;
    assert_int_equal(
        loom_store_conversation_create_for(g_st, "conv_a1", "w/alice"), 0);
    assert_int_equal(
        loom_store_conversation_create_for(g_st, "conv_a2", "w/alice"), 0);
    assert_int_equal(
        loom_store_conversation_create_for(g_st, "conv_b1", "w/bob"), 0);
    assert_int_equal(loom_store_conversation_create_id(g_st, "conv_n1"), 0);
    assert_int_equal(loom_store_conversation_info(g_st, "conv_a1", &info), 0);
    assert_string_equal(info.user_id, "w/alice");
    loom_conversation_info_clear(&info);
    assert_int_equal(loom_store_conversation_info(g_st, "conv_n1", &info), 0);
    assert_null(info.user_id);
    loom_conversation_info_clear(&info);

    assert_int_equal(
        loom_store_conversation_list_owned(g_st, "w/alice", NULL, 1, &out), 0);
    assert_int_equal(json_array_size(json_object_get(out, "data")), 1);
    assert_true(json_is_true(json_object_get(out, "has_more")));
    {
        const char *next = json_string_value(json_object_get(out, "next"));
        json_t *page = NULL;
        assert_int_equal(loom_store_conversation_list_owned(g_st, "w/alice",
                                                            next, 10, &page),
                         0);
        assert_int_equal(json_array_size(json_object_get(page, "data")), 1);
        assert_false(json_is_true(json_object_get(page, "has_more")));
        json_decref(page);
    }
    json_decref(out);
    assert_int_equal(
        loom_store_conversation_list_owned(g_st, "w/bob", NULL, 10, &out), 0);
    assert_int_equal(json_array_size(json_object_get(out, "data")), 1);
    assert_string_equal(
        json_string_value(json_object_get(
            json_array_get(json_object_get(out, "data"), 0), "id")),
        "conv_b1");
    /* The owner is not shown in the list. */
    assert_null(json_object_get(json_array_get(json_object_get(out, "data"), 0),
                                "user_id"));
    json_decref(out);
    assert_int_equal(
        loom_store_conversation_list_owned(g_st, "w/bob", "conv_a1", 10, &out),
        LOOM_ENOTFOUND);
    assert_int_equal(
        loom_store_conversation_list_owned(g_st, NULL, NULL, 10, &out),
        LOOM_EINVALID);
    assert_int_equal(loom_store_conversation_list(g_st, NULL, 10, &out), 0);
    assert_int_equal(json_array_size(json_object_get(out, "data")), 4);
    json_decref(out);
}

static void test_owner(void **state)
{
    char out[LOOM_STORE_USER_ID_MAX + 1], end[129];

    (void)state;
    assert_int_equal(loom_account_owner(out, "acme", "alice", NULL), 0);
    assert_string_equal(out, "acme/alice");
    assert_int_equal(loom_account_owner(out, "acme", "svc", "bob"), 0);
    assert_string_equal(out, "acme/svc/bob");
    memset(end, 'e', 128);
    end[128] = '\0';
    assert_int_equal(loom_account_owner(out, "acme", "svc", end), 0);
    assert_int_equal(out[0], '~');
    assert_int_equal(strlen(out), 65);
    end[127] = 'f';
    {
        char other[LOOM_STORE_USER_ID_MAX + 1];
        assert_int_equal(loom_account_owner(other, "acme", "svc", end), 0);
        assert_string_not_equal(out, other);
    }
    assert_int_equal(loom_account_owner(out, "acme", "svc", "a/b"),
                     LOOM_EINVALID);
    assert_int_equal(loom_account_owner(out, "acme", "svc", ""), LOOM_EINVALID);
    assert_int_equal(loom_account_owner(out, "a/b", "svc", NULL),
                     LOOM_EINVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_create_and_verify, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_bad_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_specs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_revoke_and_expire, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_limits_and_audit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lists, setup, teardown),
        cmocka_unit_test(test_secret_equal),
        cmocka_unit_test(test_owner),
        cmocka_unit_test_setup_teardown(test_conversation_owner, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
