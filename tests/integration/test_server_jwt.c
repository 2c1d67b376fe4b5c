/*
 * Mode jwt through the server (docs/accounts.md#jwt): a server over the
 * fake upstream that takes tokens signed with an HMAC secret (HS256) or
 * by the keys of a JWKS file (RS256, ES256), made here.
 *
 * Identity: a good token of each algorithm runs; no token, an expired
 * one, a bad signature, the wrong audience or issuer, alg none, an HS256
 * token signed with the public key, an unknown kid and a bad sub are
 * each 401 invalid_api_key saying why; API keys and the admin key run
 * nothing. A token's user is made in the store the first time it is seen
 * (once: the audit log has one user.created). Isolation: two token users
 * (and one user of the same name in another workspace) see only their
 * own conversations and runs. No token shows in the server's log.
 */
#include "server_accounts_util.h"

#include "jwt_tokens.h"
#include "loom/accounts.h"
#include "loom/log.h"

#include <time.h>

#define ADMIN "adm-0123456789abcdef"
#define SECRET "jwt-secret-0123456789abcdef-0123456789"

static FILE *g_log;
static test_key *g_rsa, *g_ec;
static char *g_jwks;

static int setup(void **state)
{
    json_t *keys;

    (void)state;
    g_rsa = test_key_new("RSA");
    g_ec = test_key_new("EC");
    if (!g_rsa || !g_ec)
        return -1;
    keys = json_pack("[o,o]", test_key_jwk(g_rsa, "rsa-1"),
                     test_key_jwk(g_ec, "ec-1"));
    g_jwks = test_jwks_write("server-jwks.json", keys);
    json_decref(keys);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    test_key_free(g_rsa);
    test_key_free(g_ec);
    free(g_jwks);
    return 0;
}

/* A server in mode jwt (audience loom, issuer https://id.test, the
 * workspace in claim "org") over the fake with script. */
static void start(sh *h, const char *script)
{
    char *auth = NULL;

    assert_true(asprintf(&auth,
                         "  mode: jwt\n"
                         "  admin_key: " ADMIN "\n"
                         "  jwt:\n"
                         "    secret: " SECRET "\n"
                         "    jwks_file: %s\n"
                         "    audience: loom\n"
                         "    issuer: https://id.test\n"
                         "    workspace_claim: org\n",
                         g_jwks) > 0);
    accounts_start(h, script, auth);
    free(auth);
}

/* A token for sub in org, good for an hour (or exp_in seconds), signed
 * with alg: HS256 by the secret, RS256 and ES256 by the JWKS's keys. */
static char *token(const char *alg, const char *sub, const char *org,
                   long exp_in, const char *more)
{
    char claims[512];
    const char *key = !strcmp(alg, "HS256")   ? SECRET
                      : !strcmp(alg, "RS256") ? test_key_private_pem(g_rsa)
                      : !strcmp(alg, "ES256") ? test_key_private_pem(g_ec)
                                              : NULL;
    const char *kid = !strcmp(alg, "RS256")   ? "rsa-1"
                      : !strcmp(alg, "ES256") ? "ec-1"
                                              : NULL;
    char *t;

    snprintf(claims, sizeof(claims),
             "{\"sub\": \"%s\", \"org\": \"%s\", \"aud\": \"loom\", "
             "\"iss\": \"https://id.test\", \"exp\": %lld%s}",
             sub, org, (long long)time(NULL) + (exp_in ? exp_in : 3600),
             more ? more : "");
    t = test_jwt_make(alg, key, kid, claims);
    assert_non_null(t);
    return t;
}

/* token is refused with a message holding why. */
static void refused(sh *h, char *tok, const char *why)
{
    sh_resp r;

    assert_int_equal(call(h, tok, NULL, "GET", "/v1/models", NULL, &r), 401);
    sh_check_error(r.body, "invalid_api_key");
    if (!strstr(r.body, why))
        fail_msg("'%s' does not say '%s'", r.body, why);
    sh_resp_free(&r);
    free(tok);
}

static void test_tokens(void **state)
{
    char *alice = token("HS256", "alice", "acme", 0, NULL), *t;
    char key[LOOM_KEY_SIZE];
    loom_key_spec spec = {.version = LOOM_KEY_SPEC_VERSION, .user = "k"};
    json_t *j, *users, *audit, *e;
    size_t i, created = 0;
    sh h;

    (void)state;
    start(&h, "{\"responses\":[" TEXT("One.") "," TEXT("Two.") "," TEXT(
                  "Three.") "," TEXT("Four.") "]}");
    json_decref(call_json(&h, alice, NULL, "POST", "/v1/chat/completions",
                          CHAT("x", "Hi"), 200));
    json_decref(call_json(&h, alice, NULL, "GET", "/v1/models", NULL, 200));
    t = token("RS256", "bob", "acme", 0, NULL);
    json_decref(call_json(&h, t, NULL, "POST", "/v1/chat/completions",
                          CHAT("x", "Hi"), 200));
    free(t);
    t = token("ES256", "carol", "globex", 0, NULL);
    json_decref(call_json(&h, t, NULL, "POST", "/v1/chat/completions",
                          CHAT("x", "Hi"), 200));
    free(t);

    /* API keys and the admin key run nothing in mode jwt. */
    assert_int_equal(loom_store_key_create(h.store, &spec, key, NULL), 0);
    call_error(&h, key, NULL, "GET", "/v1/models", NULL, 401,
               "invalid_api_key");
    call_error(&h, ADMIN, NULL, "GET", "/v1/models", NULL, 401,
               "invalid_api_key");
    call_error(&h, alice, NULL, "GET", "/v1/admin/users", NULL, 401,
               "invalid_api_key");

    /* Token users are made once, on first sight. */
    users = call_json(&h, ADMIN, NULL, "GET", "/v1/admin/users", NULL, 200);
    j = json_object_get(users, "data");
    assert_int_equal(json_array_size(j), 4); /* and the key's k */
    assert_string_equal(sh_str(json_array_get(j, 0), "workspace"), "acme");
    assert_string_equal(sh_str(json_array_get(j, 0), "name"), "alice");
    assert_string_equal(sh_str(json_array_get(j, 2), "workspace"), "default");
    assert_string_equal(sh_str(json_array_get(j, 3), "workspace"), "globex");
    assert_string_equal(sh_str(json_array_get(j, 3), "name"), "carol");
    json_decref(users);
    audit = call_json(&h, ADMIN, NULL, "GET", "/v1/admin/audit", NULL, 200);
    json_array_foreach(json_object_get(audit, "data"), i, e)
    {
        if (!strcmp(sh_str(e, "action"), "user.created")) {
            assert_string_equal(sh_str(e, "actor"), "jwt");
            created++;
        }
    }
    assert_int_equal(created, 3);
    json_decref(audit);

    sh_free(&h);
    assert_false(file_holds(g_log, strrchr(alice, '.') + 1));
    free(alice);
}

/* Claims for alice in acme that pass but for what more (appended) or
 * the time (exp: hours from now, negative: past) change. */
static char *alice_claims(int exp_hours, const char *more)
{
    static char buf[512];

    snprintf(buf, sizeof(buf),
             "{\"sub\": \"alice\", \"org\": \"acme\", \"aud\": \"loom\", "
             "\"iss\": \"https://id.test\", \"exp\": %lld%s}",
             (long long)time(NULL) + exp_hours * 3600L, more);
    return buf;
}

/* Every refusal, each a 401 invalid_api_key saying why. Two servers: ten
 * failures from one address in a minute would make the rest 429. */
static void test_refusals(void **state)
{
    char *t;
    sh h;

    (void)state;
    start(&h, "{\"responses\":[]}");
    call_error(&h, NULL, NULL, "GET", "/v1/models", NULL, 401,
               "invalid_api_key");
    refused(&h, token("HS256", "alice", "acme", -120, NULL), "expired");
    refused(&h, token("HS256", "alice", "acme", 0, ", \"nbf\": 99999999999"),
            "not valid yet");
    t = token("HS256", "alice", "acme", 0, NULL);
    t[strlen(t) - 3] = t[strlen(t) - 3] == 'x' ? 'y' : 'x';
    refused(&h, t, "bad signature");
    /* A claim changed after signing (the old signature kept). */
    t = token("RS256", "alice", "acme", 0, NULL);
    {
        char *other = token("RS256", "root", "acme", 0, NULL), forged[4096];
        snprintf(forged, sizeof(forged), "%.*s%s",
                 (int)(strrchr(other, '.') - other), other, strrchr(t, '.'));
        free(other);
        free(t);
        refused(&h, strdup(forged), "bad signature");
    }
    refused(&h,
            test_jwt_make("HS256", SECRET, NULL,
                          "{\"sub\": \"alice\", \"org\": \"acme\", "
                          "\"aud\": [\"other\"], \"iss\": \"https://id.test\", "
                          "\"exp\": 99999999999}"),
            "audience");
    sh_free(&h);

    start(&h, "{\"responses\":[]}");
    refused(&h,
            test_jwt_make("HS256", SECRET, NULL,
                          "{\"sub\": \"alice\", \"org\": \"acme\", "
                          "\"aud\": \"loom\", \"iss\": \"https://evil.test\", "
                          "\"exp\": 99999999999}"),
            "issuer");
    refused(&h, test_jwt_make("none", NULL, NULL, alice_claims(1, "")),
            "algorithm none");
    /* HS256 "signed" with the RSA public key: the secret is not that. */
    refused(&h,
            test_jwt_make("HS256", test_key_public_pem(g_rsa), "rsa-1",
                          alice_claims(1, "")),
            "bad signature");
    refused(&h,
            test_jwt_make("RS256", test_key_private_pem(g_rsa), "rsa-9",
                          alice_claims(1, "")),
            "kid");
    refused(&h, token("HS256", "a/b", "acme", 0, NULL), "sub");
    refused(&h, token("HS256", "alice", "a b", 0, NULL), "org");
    refused(&h, strdup("lk_0123456789abcdef_00"), "malformed");
    sh_free(&h);
}

/* Two token users, and a user of the same name in another workspace,
 * see only their own. */
static void test_isolation(void **state)
{
    char *alice = token("HS256", "alice", "acme", 0, NULL);
    char *bob = token("ES256", "bob", "acme", 0, NULL);
    char *alice2 = token("RS256", "alice", "globex", 0, NULL);
    char run[64], conv[64];
    sh h;
    json_t *j;

    (void)state;
    start(&h,
          "{\"responses\":[{\"text\":[\"One.\"],\"usage\":{"
          "\"prompt_tokens\":3,\"completion_tokens\":1}}," TEXT("Two.") "]}");
    j = call_json(&h, alice, NULL, "POST", "/v1/runs",
                  "{\"input\":\"Hi\",\"user\":\"bob\"}", 200);
    snprintf(run, sizeof(run), "%s", sh_str(j, "id"));
    snprintf(conv, sizeof(conv), "%s", sh_str(j, "conversation_id"));
    json_decref(j);
    check_hidden(&h, bob, NULL, run, conv);
    check_hidden(&h, alice2, NULL, run, conv);
    check_seen(&h, alice, NULL, run, conv);
    /* Usage: the token's user's own call, counted without a key. */
    j = call_json(&h, alice, NULL, "GET", "/v1/usage?group_by=user,key", NULL,
                  200);
    assert_int_equal(json_array_size(json_object_get(j, "data")), 1);
    assert_string_equal(
        sh_str(json_array_get(json_object_get(j, "data"), 0), "user_id"),
        "acme/alice");
    assert_true(json_is_null(json_object_get(
        json_array_get(json_object_get(j, "data"), 0), "key_id")));
    json_decref(j);
    j = call_json(&h, bob, NULL, "GET", "/v1/usage", NULL, 200);
    assert_int_equal(json_integer_value(
                         json_object_get(json_object_get(j, "total"), "calls")),
                     0);
    json_decref(j);
    sh_free(&h);
    free(alice);
    free(bob);
    free(alice2);
}

/* A token's user is held to the limits set on it (there is no key). */
static void test_user_limits(void **state)
{
    char *alice = token("HS256", "alice", "acme", 0, NULL);
    sh h;

    (void)state;
    start(&h, "{\"responses\":[" TEXT("One.") "]}");
    json_decref(call_json(&h, alice, NULL, "GET", "/v1/models", NULL, 200));
    json_decref(call_json(&h, ADMIN, NULL, "PATCH",
                          "/v1/admin/users/acme/alice", "{\"rpm\": 1}", 200));
    json_decref(call_json(&h, alice, NULL, "POST", "/v1/chat/completions",
                          CHAT("x", "Hi"), 200));
    call_error(&h, alice, NULL, "POST", "/v1/chat/completions", CHAT("x", "Hi"),
               429, "rate_limit_exceeded");
    sh_free(&h);
    free(alice);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tokens),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_isolation),
        cmocka_unit_test(test_user_limits),
    };
    int rc;

    g_log = tmpfile();
    loom_log_set(g_log, LOOM_LOG_DEBUG, LOOM_LOG_TEXT);
    rc = cmocka_run_group_tests(tests, setup, teardown);
    fclose(g_log);
    return rc;
}
