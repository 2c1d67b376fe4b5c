/*
 * Unit tests of the JWT verifier (loom/jwt.h) with tokens made here
 * (tests/support/jwt_tokens.c: OpenSSL keys, libjwt signing): HS256,
 * RS256 and ES256 accepted; every refusal (bad signature, a tampered
 * claim, expired, not yet valid, no exp, wrong aud or iss, alg none,
 * HS256 signed with the public key (algorithm confusion), an unknown
 * kid, several keys and no kid, a bad sub or workspace, malformed and
 * oversized tokens); the leeway; kid selection among several keys; and
 * the JWKS and secret checks made when the verifier is built.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/clock.h"
#include "core/error.h"
#include "jwt_tokens.h"
#include "loom/jwt.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SECRET "0123456789abcdef0123456789abcdef-hs256"

static test_key *g_rsa1, *g_rsa2, *g_ec;
static char *g_jwks;    /* rsa1 (kid r1), rsa2 (kid r2), ec (kid e1) */
static long long g_now; /* Unix seconds */

static int setup(void **state)
{
    json_t *keys;

    (void)state;
    g_rsa1 = test_key_new("RSA");
    g_rsa2 = test_key_new("RSA");
    g_ec = test_key_new("EC");
    if (!g_rsa1 || !g_rsa2 || !g_ec)
        return -1;
    keys = json_pack("[o,o,o]", test_key_jwk(g_rsa1, "r1"),
                     test_key_jwk(g_rsa2, "r2"), test_key_jwk(g_ec, "e1"));
    g_jwks = test_jwks_write("jwks.json", keys);
    json_decref(keys);
    g_now = loom__unix_ms() / 1000;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    test_key_free(g_rsa1);
    test_key_free(g_rsa2);
    test_key_free(g_ec);
    free(g_jwks);
    return 0;
}

/* A verifier of the test keys: the secret, the JWKS, or both. */
static loom_jwt_verifier *verifier(int secret, int jwks, const char *aud,
                                   const char *iss, const char *ws_claim)
{
    loom_jwt_options o = LOOM_JWT_OPTIONS_INIT;
    loom_jwt_verifier *v = NULL;

    o.secret = secret ? SECRET : NULL;
    o.jwks_file = jwks ? g_jwks : NULL;
    o.audience = aud;
    o.issuer = iss;
    o.workspace_claim = ws_claim;
    o.leeway_seconds = 60;
    assert_int_equal(loom_jwt_verifier_new(&v, &o), 0);
    return v;
}

/* Claims for alice valid for an hour, plus extra ("" or ", ..."). */
static char *claims(const char *extra)
{
    static char buf[1024];

    snprintf(buf, sizeof(buf), "{\"sub\": \"alice\", \"exp\": %lld%s}",
             g_now + 3600, extra);
    return buf;
}

/* Checks that v refuses token with a message holding why. */
static void refused(loom_jwt_verifier *v, char *token, const char *why)
{
    loom_jwt_identity id;

    assert_non_null(token);
    assert_int_equal(loom_jwt_verify(v, token, g_now * 1000, &id),
                     LOOM_EINVALID);
    if (!strstr(loom_error_last(), why))
        fail_msg("'%s' does not say '%s'", loom_error_last(), why);
    if (*token)
        assert_null(strstr(loom_error_last(), token));
    assert_string_equal(id.user, "");
    free(token);
}

static void accepted(loom_jwt_verifier *v, char *token, const char *user,
                     const char *ws)
{
    loom_jwt_identity id;

    assert_non_null(token);
    if (loom_jwt_verify(v, token, g_now * 1000, &id) != 0)
        fail_msg("refused: %s", loom_error_last());
    assert_string_equal(id.user, user);
    assert_string_equal(id.workspace, ws);
    free(token);
}

static void test_hs256(void **state)
{
    loom_jwt_verifier *v = verifier(1, 0, NULL, NULL, NULL);
    loom_jwt_identity id;
    char *t = test_jwt_make("HS256", SECRET, NULL, claims(""));

    (void)state;
    assert_int_equal(loom_jwt_verify(v, t, g_now * 1000, &id), 0);
    assert_string_equal(id.user, "alice");
    assert_string_equal(id.workspace, "default");
    assert_int_equal(id.expires_at, (g_now + 3600) * 1000);
    /* One character of the signature changed. */
    t[strlen(t) - 2] = t[strlen(t) - 2] == 'A' ? 'B' : 'A';
    refused(v, t, "bad signature");
    refused(v, test_jwt_make("HS256", SECRET "-other", NULL, claims("")),
            "bad signature");
    /* RS256 and ES256 need a JWKS. */
    refused(
        v,
        test_jwt_make("RS256", test_key_private_pem(g_rsa1), "r1", claims("")),
        "no auth.jwt.jwks_file");
    loom_jwt_verifier_free(v);
}

static void test_times(void **state)
{
    loom_jwt_verifier *v = verifier(1, 0, NULL, NULL, NULL);
    char c[256];

    (void)state;
    snprintf(c, sizeof(c), "{\"sub\": \"alice\", \"exp\": %lld}", g_now - 61);
    refused(v, test_jwt_make("HS256", SECRET, NULL, c), "expired");
    /* Within the leeway (60 s) it still passes. */
    snprintf(c, sizeof(c), "{\"sub\": \"alice\", \"exp\": %lld}", g_now - 30);
    accepted(v, test_jwt_make("HS256", SECRET, NULL, c), "alice", "default");
    snprintf(c, sizeof(c), "{\"sub\": \"alice\", \"exp\": %lld, \"nbf\": %lld}",
             g_now + 3600, g_now + 120);
    refused(v, test_jwt_make("HS256", SECRET, NULL, c), "not valid yet");
    snprintf(c, sizeof(c), "{\"sub\": \"alice\", \"exp\": %lld, \"nbf\": %lld}",
             g_now + 3600, g_now + 30);
    accepted(v, test_jwt_make("HS256", SECRET, NULL, c), "alice", "default");
    refused(v, test_jwt_make("HS256", SECRET, NULL, "{\"sub\": \"alice\"}"),
            "it has no exp");
    refused(v,
            test_jwt_make("HS256", SECRET, NULL,
                          "{\"sub\": \"alice\", \"exp\": \"tomorrow\"}"),
            "exp is not a number");
    loom_jwt_verifier_free(v);
}

static void test_audience_issuer(void **state)
{
    loom_jwt_verifier *v =
        verifier(1, 0, "loom", "https://id.example.com", NULL);
    char extra[256];

    (void)state;
    snprintf(extra, sizeof(extra),
             ", \"aud\": \"loom\", \"iss\": \"https://id.example.com\"");
    accepted(v, test_jwt_make("HS256", SECRET, NULL, claims(extra)), "alice",
             "default");
    snprintf(extra, sizeof(extra),
             ", \"aud\": [\"other\", \"loom\"], "
             "\"iss\": \"https://id.example.com\"");
    accepted(v, test_jwt_make("HS256", SECRET, NULL, claims(extra)), "alice",
             "default");
    snprintf(extra, sizeof(extra),
             ", \"aud\": \"other\", "
             "\"iss\": \"https://id.example.com\"");
    refused(v, test_jwt_make("HS256", SECRET, NULL, claims(extra)), "audience");
    snprintf(extra, sizeof(extra), ", \"iss\": \"https://id.example.com\"");
    refused(v, test_jwt_make("HS256", SECRET, NULL, claims(extra)), "audience");
    snprintf(extra, sizeof(extra),
             ", \"aud\": \"loom\", \"iss\": \"https://evil.example.com\"");
    refused(v, test_jwt_make("HS256", SECRET, NULL, claims(extra)), "issuer");
    refused(v,
            test_jwt_make("HS256", SECRET, NULL, claims(", \"aud\": \"loom\"")),
            "issuer");
    loom_jwt_verifier_free(v);
}

static void test_alg_none_and_confusion(void **state)
{
    loom_jwt_verifier *jwks = verifier(0, 1, NULL, NULL, NULL);
    loom_jwt_verifier *both = verifier(1, 1, NULL, NULL, NULL);
    char *t;

    (void)state;
    refused(jwks, test_jwt_make("none", NULL, NULL, claims("")),
            "algorithm none");
    refused(both, test_jwt_make("none", NULL, NULL, claims("")),
            "algorithm none");
    /* A token that passes with "none" stripped of its signature. */
    t = test_jwt_make("RS256", test_key_private_pem(g_rsa1), "r1", claims(""));
    *(strrchr(t, '.') + 1) = '\0';
    refused(jwks, t, "bad signature");
    /* HS256 with the RSA public key (as PEM) for its secret: the classic
     * confusion. */
    refused(
        jwks,
        test_jwt_make("HS256", test_key_public_pem(g_rsa1), "r1", claims("")),
        "HS256 tokens are not accepted");
    refused(
        both,
        test_jwt_make("HS256", test_key_public_pem(g_rsa1), "r1", claims("")),
        "bad signature");
    /* Algorithms loom does not take. */
    refused(both, test_jwt_make("HS512", SECRET, NULL, claims("")),
            "algorithm HS512");
    refused(
        both,
        test_jwt_make("RS512", test_key_private_pem(g_rsa1), "r1", claims("")),
        "algorithm RS512");
    loom_jwt_verifier_free(jwks);
    loom_jwt_verifier_free(both);
}

static void test_kid_selection(void **state)
{
    loom_jwt_verifier *v = verifier(0, 1, NULL, NULL, NULL);
    char *t, *other, forged[4096];
    const char *sig;

    (void)state;
    accepted(
        v,
        test_jwt_make("RS256", test_key_private_pem(g_rsa2), "r2", claims("")),
        "alice", "default");
    accepted(
        v,
        test_jwt_make("RS256", test_key_private_pem(g_rsa1), "r1", claims("")),
        "alice", "default");
    /* Signed by r2 but naming r1. */
    refused(
        v,
        test_jwt_make("RS256", test_key_private_pem(g_rsa2), "r1", claims("")),
        "bad signature");
    refused(
        v,
        test_jwt_make("RS256", test_key_private_pem(g_rsa2), "r9", claims("")),
        "no key of the JWKS has its kid");
    /* The EC key's kid with an RSA algorithm. */
    refused(
        v,
        test_jwt_make("RS256", test_key_private_pem(g_rsa2), "e1", claims("")),
        "no key of the JWKS has its kid");
    refused(
        v,
        test_jwt_make("RS256", test_key_private_pem(g_rsa2), NULL, claims("")),
        "names no key (kid) and the JWKS has several");
    /* The only EC key serves a token without a kid. ES256 signatures
     * are R || S (64 bytes, 86 base64url characters), as RFC 7518 says. */
    t = test_jwt_make("ES256", test_key_private_pem(g_ec), NULL, claims(""));
    assert_non_null(t);
    sig = strrchr(t, '.') + 1;
    assert_int_equal(strlen(sig), 86);
    accepted(v, t, "alice", "default");
    accepted(
        v, test_jwt_make("ES256", test_key_private_pem(g_ec), "e1", claims("")),
        "alice", "default");
    /* Another token's header and claims with this one's signature. */
    t = test_jwt_make("RS256", test_key_private_pem(g_rsa1), "r1", claims(""));
    other = test_jwt_make("RS256", test_key_private_pem(g_rsa1), "r1",
                          "{\"sub\": \"mallory\", \"exp\": 99999999999}");
    assert_non_null(t);
    assert_non_null(other);
    snprintf(forged, sizeof(forged), "%.*s%s",
             (int)(strrchr(other, '.') - other), other, strrchr(t, '.'));
    free(other);
    free(t);
    refused(v, strdup(forged), "bad signature");
    loom_jwt_verifier_free(v);
}

static void test_names(void **state)
{
    loom_jwt_verifier *v = verifier(1, 0, NULL, NULL, "org");
    char c[256];

    (void)state;
    accepted(
        v, test_jwt_make("HS256", SECRET, NULL, claims(", \"org\": \"acme\"")),
        "alice", "acme");
    refused(v, test_jwt_make("HS256", SECRET, NULL, claims("")),
            "no \"org\" claim");
    refused(v,
            test_jwt_make("HS256", SECRET, NULL, claims(", \"org\": \"a/b\"")),
            "\"org\" claim is not a valid name");
    snprintf(c, sizeof(c),
             "{\"sub\": \"auth0|123\", \"org\": \"acme\", "
             "\"exp\": %lld}",
             g_now + 60);
    refused(v, test_jwt_make("HS256", SECRET, NULL, c),
            "\"sub\" claim is not a valid name");
    snprintf(c, sizeof(c), "{\"org\": \"acme\", \"exp\": %lld}", g_now + 60);
    refused(v, test_jwt_make("HS256", SECRET, NULL, c), "no \"sub\" claim");
    loom_jwt_verifier_free(v);
}

static void test_malformed(void **state)
{
    loom_jwt_verifier *v = verifier(1, 1, NULL, NULL, NULL);
    char *big = malloc(LOOM_JWT_MAX + 2);

    (void)state;
    refused(v, strdup("not-a-token"), "malformed");
    refused(v, strdup("a.b.c"), "malformed");
    refused(v, strdup(""), "malformed");
    memset(big, 'a', LOOM_JWT_MAX + 1);
    big[LOOM_JWT_MAX + 1] = '\0';
    refused(v, big, "longer than 16 KiB");
    loom_jwt_verifier_free(v);
}

/* The verifier refuses what cannot check a token. */
static void test_options(void **state)
{
    loom_jwt_options o = LOOM_JWT_OPTIONS_INIT;
    loom_jwt_verifier *v = NULL;
    char *p;
    json_t *keys;

    (void)state;
    assert_int_equal(loom_jwt_verifier_new(&v, &o), LOOM_EINVALID);
    o.secret = "short";
    assert_int_equal(loom_jwt_verifier_new(&v, &o), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "shorter than 32 bytes"));
    o.secret = NULL;
    o.jwks_file = "/nonexistent/jwks.json";
    assert_int_equal(loom_jwt_verifier_new(&v, &o), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "no such file"));

    p = test_tmp_path("notjson.json");
    test_write_file(p, "{", 1);
    o.jwks_file = p;
    assert_int_equal(loom_jwt_verifier_new(&v, &o), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "not JSON"));
    free(p);

    keys = json_pack("[{s:s,s:s}]", "kty", "oct", "k", "c2VjcmV0");
    p = test_jwks_write("oct.json", keys);
    o.jwks_file = p;
    assert_int_equal(loom_jwt_verifier_new(&v, &o), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "no RSA or EC P-256"));
    free(p);
    json_decref(keys);

    keys = json_pack("[{s:s,s:s,s:s,s:s}]", "kty", "RSA", "kid", "small", "n",
                     "AQAB", "e", "AQAB");
    p = test_jwks_write("small.json", keys);
    o.jwks_file = p;
    assert_int_equal(loom_jwt_verifier_new(&v, &o), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "shorter than 2048 bits"));
    free(p);
    json_decref(keys);
    assert_null(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hs256),
        cmocka_unit_test(test_times),
        cmocka_unit_test(test_audience_issuer),
        cmocka_unit_test(test_alg_none_and_confusion),
        cmocka_unit_test(test_kid_selection),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_options),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
