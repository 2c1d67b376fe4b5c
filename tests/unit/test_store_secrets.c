/*
 * Secrets at rest in the store (loom/store.h, src/store/secrets.c): MCP
 * OAuth credentials sealed on their way in and opened on their way out,
 * never readable in the database file, kept per server and user,
 * surviving a reopen; the key from the secret set, LOOM_SECRET_KEY or a
 * key file made beside the database with mode 0600; another key fails
 * cleanly (LOOM_EPROTO, nothing given).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "loom/store.h"
#include "store_fixture.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char creds[] =
    "{\"issuer\":\"https://as.example\",\"issuers\":{\"https://as.example\":"
    "{\"access_token\":\"tok-SECRET-123\",\"refresh_token\":\"ref-SECRET\"}}}";

/* A store on a fresh database (its path and its key file's path in
 * *path and *key_file, caller frees), with no secret in the
 * environment. */
static loom_store *fresh(const char *name, char **path, char **key_file)
{
    *path = test_db_path(name);
    assert_int_equal(asprintf(key_file, "%s.key", *path) > 0, 1);
    unlink(*key_file);
    unsetenv(LOOM_STORE_SECRET_ENV);
    return test_store_open_ok(*path);
}

/* Closes st and removes its files. */
static void finish(loom_store *st, char *path, char *key_file)
{
    loom_store_free(st);
    test_db_remove(path);
    unlink(key_file);
    free(key_file);
    free(path);
}

/* Whether the database's files hold needle anywhere. */
static int db_holds(const char *path, const char *needle)
{
    char p[4096];
    const char *suffix[] = {"", "-wal"};
    int found = 0;

    for (size_t i = 0; i < 2; i++) {
        size_t n = 0;
        char *b;
        snprintf(p, sizeof(p), "%s%s", path, suffix[i]);
        if ((b = test_read_file(p, &n))) {
            found |= memmem(b, n, needle, strlen(needle)) != NULL;
            free(b);
        }
    }
    return found;
}

static void test_key_file_round_trip(void **state)
{
    char *key_file = NULL, *path = NULL;
    loom_store *st = fresh("secrets1.db", &path, &key_file);
    char *json = NULL;
    struct stat sb;

    (void)state;
    assert_int_equal(
        loom_store_mcp_credentials_load(st, "tracker", NULL, &json),
        LOOM_ENOTFOUND);
    assert_null(json);
    /* No key file until a secret is needed. */
    assert_int_equal(stat(key_file, &sb), -1);
    assert_int_equal(
        loom_store_mcp_credentials_save(st, "tracker", NULL, creds), 0);
    assert_int_equal(stat(key_file, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    assert_int_equal(
        loom_store_mcp_credentials_load(st, "tracker", NULL, &json), 0);
    assert_string_equal(json, creds);
    free(json);
    /* Another server, another user: nothing of theirs. */
    assert_int_equal(loom_store_mcp_credentials_load(st, "other", NULL, &json),
                     LOOM_ENOTFOUND);
    assert_int_equal(
        loom_store_mcp_credentials_load(st, "tracker", "alice", &json),
        LOOM_ENOTFOUND);
    assert_int_equal(
        loom_store_mcp_credentials_save(st, "tracker", "alice", "{\"a\":1}"),
        0);
    /* A save replaces. */
    assert_int_equal(loom_store_mcp_credentials_save(st, "tracker", NULL,
                                                     "{\"issuers\":{}}"),
                     0);
    loom_store_free(st);
    assert_false(db_holds(path, "tok-SECRET-123"));
    assert_false(db_holds(path, "issuers"));
    /* Reopened: the same key file opens them. */
    st = test_store_open_ok(path);
    assert_int_equal(
        loom_store_mcp_credentials_load(st, "tracker", NULL, &json), 0);
    assert_string_equal(json, "{\"issuers\":{}}");
    free(json);
    assert_int_equal(
        loom_store_mcp_credentials_load(st, "tracker", "alice", &json), 0);
    assert_string_equal(json, "{\"a\":1}");
    free(json);
    finish(st, path, key_file);
}

static void test_wrong_key_fails_cleanly(void **state)
{
    char *key_file = NULL, *path = NULL;
    loom_store *st = fresh("secrets2.db", &path, &key_file);
    char *json = NULL;
    struct stat sb;

    (void)state;
    assert_int_equal(loom_store_set_secret(st, "the first secret, long enough"),
                     0);
    assert_int_equal(
        loom_store_mcp_credentials_save(st, "tracker", NULL, creds), 0);
    /* A configured secret makes no key file. */
    assert_int_equal(stat(key_file, &sb), -1);
    loom_store_free(st);

    st = test_store_open_ok(path);
    assert_int_equal(loom_store_set_secret(st, "another secret altogether"), 0);
    json = (char *)"untouched";
    assert_int_equal(
        loom_store_mcp_credentials_load(st, "tracker", NULL, &json),
        LOOM_EPROTO);
    assert_null(json);
    assert_non_null(strstr(loom_error_last(), "do not open"));
    assert_null(strstr(loom_error_last(), "SECRET"));
    /* The environment's secret comes after the one set... */
    setenv(LOOM_STORE_SECRET_ENV, "the first secret, long enough", 1);
    assert_int_equal(
        loom_store_mcp_credentials_load(st, "tracker", NULL, &json),
        LOOM_EPROTO);
    /* ...and before the key file. */
    assert_int_equal(loom_store_set_secret(st, NULL), 0);
    assert_int_equal(
        loom_store_mcp_credentials_load(st, "tracker", NULL, &json), 0);
    assert_string_equal(json, creds);
    free(json);
    unsetenv(LOOM_STORE_SECRET_ENV);
    /* Without either, the key file is made and the row does not open. */
    assert_int_equal(
        loom_store_mcp_credentials_load(st, "tracker", NULL, &json),
        LOOM_EPROTO);
    assert_int_equal(stat(key_file, &sb), 0);
    finish(st, path, key_file);
}

static void test_bad_key_file(void **state)
{
    char *key_file = NULL, *path = NULL;
    loom_store *st = fresh("secrets3.db", &path, &key_file);
    char *json = NULL;

    (void)state;
    assert_int_equal(test_write_file(key_file, "short\n", 6), 0);
    assert_int_equal(
        loom_store_mcp_credentials_save(st, "tracker", NULL, creds),
        LOOM_EPROTO);
    assert_non_null(strstr(loom_error_last(), "is not a key"));
    assert_int_equal(
        loom_store_mcp_credentials_load(st, "tracker", NULL, &json),
        LOOM_ENOTFOUND);
    assert_int_equal(loom_store_mcp_credentials_save(st, "", NULL, creds),
                     LOOM_EINVALID);
    finish(st, path, key_file);
}

/* A user's settings are kept a moment after being read: a save through
 * the same store shows at once, users never see each other's, and a save
 * by another process sharing the file shows within about a second (the
 * test waits for it up to a minute). */
static void test_settings_cached(void **state)
{
    char *key_file = NULL, *path = NULL;
    loom_store *st = fresh("secrets4.db", &path, &key_file), *other;
    char *json = NULL;
    int i;

    (void)state;
    assert_int_equal(loom_store_user_settings_load(st, "alice", &json),
                     LOOM_ENOTFOUND);
    /* Each save shows in the next read, and bob still has none. */
    for (i = 1; i <= 2; i++) {
        char want[32];
        snprintf(want, sizeof(want), "{\"model\":\"a%d\"}", i);
        assert_int_equal(loom_store_user_settings_save(st, "alice", want), 0);
        assert_int_equal(loom_store_user_settings_load(st, "alice", &json), 0);
        assert_string_equal(json, want);
        free(json);
        assert_int_equal(loom_store_user_settings_load(st, "bob", &json),
                         LOOM_ENOTFOUND);
    }

    /* Another store on the same file (as another process would be). */
    other = test_store_open_ok(path);
    assert_int_equal(
        loom_store_user_settings_save(other, "bob", "{\"model\":\"b1\"}"), 0);
    for (i = 0; i < 600; i++) {
        int rc = loom_store_user_settings_load(st, "bob", &json);
        if (rc == 0)
            break;
        assert_int_equal(rc, LOOM_ENOTFOUND);
        usleep(100000);
    }
    assert_true(i < 600);
    assert_string_equal(json, "{\"model\":\"b1\"}");
    free(json);
    loom_store_free(other);
    finish(st, path, key_file);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_file_round_trip),
        cmocka_unit_test(test_wrong_key_fails_cleanly),
        cmocka_unit_test(test_bad_key_file),
        cmocka_unit_test(test_settings_cached),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
