/*
 * The pure parts of the MCP client's OAuth support
 * (src/tools/mcp/mcp_oauth_util.c): base64url, PKCE S256, form and query
 * encoding, the Bearer challenge, the well-known metadata URLs, the
 * resource, issuer and iss checks, and the sealing of stored credentials.
 * The whole flow is proven by the conformance suite (tests/conformance).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/seal.h"
#include "loom/config.h"
#include "tools/mcp/mcp_internal.h"

#include <stdlib.h>
#include <string.h>

static void test_b64url(void **state)
{
    char out[16];

    (void)state;
    assert_int_equal(loom__b64url((const unsigned char *)"", 0, out, 16), 0);
    assert_string_equal(out, "");
    loom__b64url((const unsigned char *)"f", 1, out, 16);
    assert_string_equal(out, "Zg");
    loom__b64url((const unsigned char *)"fo", 2, out, 16);
    assert_string_equal(out, "Zm8");
    loom__b64url((const unsigned char *)"foo", 3, out, 16);
    assert_string_equal(out, "Zm9v");
    assert_int_equal(loom__b64url((const unsigned char *)"foob", 4, out, 16),
                     6);
    assert_string_equal(out, "Zm9vYg");
    loom__b64url((const unsigned char[]){0xfb, 0xff}, 2, out, 16);
    assert_string_equal(out, "-_8");
    /* too small a buffer */
    assert_int_equal(loom__b64url((const unsigned char *)"foob", 4, out, 6), 0);
}

static void test_pkce(void **state)
{
    char v[LOOM_PKCE_MAX], c[LOOM_PKCE_MAX], again[LOOM_PKCE_MAX];
    char v2[LOOM_PKCE_MAX], c2[LOOM_PKCE_MAX];

    (void)state;
    /* BASE64URL(SHA256(verifier)), computed apart */
    assert_int_equal(loom__pkce_challenge(
                         "loom-pkce-test-verifier-0123456789abcdefghijk", c),
                     0);
    assert_string_equal(c, "sSrCIcAV9XoIVXQrJAQOtUxpRscTh7WWbSaxiHxU9Xs");
    assert_int_equal(loom__pkce_pair(v, c), 0);
    assert_int_equal(strlen(v), 43);
    assert_int_equal(strspn(v, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrs"
                               "tuvwxyz0123456789-_"),
                     43);
    assert_int_equal(loom__pkce_challenge(v, again), 0);
    assert_string_equal(c, again);
    assert_int_equal(loom__pkce_pair(v2, c2), 0);
    assert_string_not_equal(v, v2);
}

static void test_form_and_query(void **state)
{
    loom_buf b;
    char *v;

    (void)state;
    loom_buf_init(&b, 1024);
    assert_int_equal(loom__form_add(&b, "scope", "mcp:read mcp:write"), 0);
    assert_int_equal(loom__form_add(&b, "skip", NULL), 0);
    assert_int_equal(
        loom__form_add(&b, "redirect_uri", "http://127.0.0.1:9/cb?x=1&y"), 0);
    assert_string_equal(loom_buf_cstr(&b),
                        "scope=mcp%3Aread%20mcp%3Awrite&redirect_uri=http%3A%"
                        "2F%2F127.0.0.1%3A9%2Fcb%3Fx%3D1%26y");
    loom_buf_free(&b);

    v = loom__query_param("http://x/cb?code=a%2Fb+c&state=s1#frag", "code");
    assert_string_equal(v, "a/b c");
    free(v);
    v = loom__query_param("http://x/cb?xstate=1&state=s1#frag", "state");
    assert_string_equal(v, "s1");
    free(v);
    assert_null(loom__query_param("http://x/cb?code=1", "state"));
    assert_null(loom__query_param("http://x/cb#state=1", "state"));
}

static void test_www_authenticate(void **state)
{
    json_t *o;

    (void)state;
    o = loom__www_authenticate(
        "Bearer error=\"insufficient_scope\", scope=\"mcp:basic mcp:write\", "
        "resource_metadata=\"http://h/.well-known/oauth-protected-resource/"
        "mcp\", Error_Description=\"a \\\"quoted\\\" word\"");
    assert_non_null(o);
    assert_string_equal(json_string_value(json_object_get(o, "error")),
                        "insufficient_scope");
    assert_string_equal(json_string_value(json_object_get(o, "scope")),
                        "mcp:basic mcp:write");
    assert_string_equal(
        json_string_value(json_object_get(o, "resource_metadata")),
        "http://h/.well-known/oauth-protected-resource/mcp");
    assert_string_equal(
        json_string_value(json_object_get(o, "error_description")),
        "a \"quoted\" word");
    json_decref(o);
    o = loom__www_authenticate("bearer realm=x");
    assert_string_equal(json_string_value(json_object_get(o, "realm")), "x");
    json_decref(o);
    o = loom__www_authenticate("Bearer");
    assert_int_equal(json_object_size(o), 0);
    json_decref(o);
    assert_null(loom__www_authenticate("Basic realm=\"x\""));
    assert_null(loom__www_authenticate("BearerX a=b"));
}

static void test_resource_check(void **state)
{
    (void)state;
    assert_true(loom__oauth_resource_ok("https://h.example/mcp",
                                        "https://h.example/mcp"));
    assert_true(loom__oauth_resource_ok("https://H.example:443",
                                        "https://h.example/mcp"));
    assert_true(loom__oauth_resource_ok("https://h.example/",
                                        "https://h.example/a/mcp"));
    assert_true(loom__oauth_resource_ok("http://127.0.0.1:5/a",
                                        "http://127.0.0.1:5/a/b"));
    assert_false(loom__oauth_resource_ok("https://evil.example.com/mcp",
                                         "https://h.example/mcp"));
    assert_false(loom__oauth_resource_ok("http://h.example/mcp",
                                         "https://h.example/mcp"));
    assert_false(loom__oauth_resource_ok("https://h.example:8443/mcp",
                                         "https://h.example/mcp"));
    assert_false(loom__oauth_resource_ok("https://h.example/mc",
                                         "https://h.example/mcp"));
    assert_false(loom__oauth_resource_ok("https://h.example/mcp#x",
                                         "https://h.example/mcp"));
    assert_false(loom__oauth_resource_ok(NULL, "https://h.example/mcp"));
}

static void test_metadata_urls(void **state)
{
    char u[3][LOOM_URL_MAX];

    (void)state;
    assert_int_equal(loom__oauth_metadata_urls("https://as.example", u, 3), 2);
    assert_string_equal(u[0], "https://as.example/.well-known/"
                              "oauth-authorization-server");
    assert_string_equal(u[1],
                        "https://as.example/.well-known/openid-configuration");
    assert_int_equal(
        loom__oauth_metadata_urls("https://as.example/tenant1/", u, 3), 3);
    assert_string_equal(u[0], "https://as.example/.well-known/"
                              "oauth-authorization-server/tenant1");
    assert_string_equal(u[1], "https://as.example/.well-known/"
                              "openid-configuration/tenant1");
    assert_string_equal(u[2], "https://as.example/tenant1/.well-known/"
                              "openid-configuration");
    assert_true(loom__oauth_metadata_urls("ftp://as.example", u, 3) < 0);
    assert_true(loom__oauth_metadata_urls("https://as.example/?a", u, 3) < 0);

    assert_int_equal(loom__oauth_prm_urls("http://h:8/mcp?x=1", u, 2), 2);
    assert_string_equal(u[0],
                        "http://h:8/.well-known/oauth-protected-resource/mcp");
    assert_string_equal(u[1],
                        "http://h:8/.well-known/oauth-protected-resource");
    assert_int_equal(loom__oauth_prm_urls("http://h:8/", u, 2), 1);
    assert_string_equal(u[0],
                        "http://h:8/.well-known/oauth-protected-resource");

    /* A path so long that a well-known URL would not fit is refused,
     * never cut. */
    {
        char longurl[LOOM_URL_MAX];
        int n = snprintf(longurl, sizeof(longurl), "https://as.example/");
        memset(longurl + n, 'a', sizeof(longurl) - (size_t)n - 20);
        longurl[sizeof(longurl) - 20] = '\0';
        assert_true(loom__oauth_metadata_urls(longurl, u, 3) < 0);
        assert_true(loom__oauth_prm_urls(longurl, u, 2) < 0);
    }
}

static void test_issuer_checks(void **state)
{
    json_t *promised =
        json_pack("{s:s,s:s,s:b}", "issuer", "http://as:9", "token_endpoint",
                  "http://as:9/token",
                  "authorization_response_iss_parameter_supported", 1);
    json_t *silent = json_pack("{s:s,s:s}", "issuer", "http://as:9",
                               "token_endpoint", "http://as:9/token");
    json_t *no_token = json_pack("{s:s}", "issuer", "http://as:9");

    (void)state;
    assert_true(loom__oauth_as_metadata_ok(silent, "http://as:9"));
    assert_false(loom__oauth_as_metadata_ok(silent, "http://as:9/"));
    assert_false(loom__oauth_as_metadata_ok(silent, "https://attacker"));
    assert_false(loom__oauth_as_metadata_ok(no_token, "http://as:9"));

    assert_true(loom__oauth_iss_ok(promised, "http://as:9", "http://as:9"));
    assert_false(loom__oauth_iss_ok(promised, "http://as:9", NULL));
    assert_false(loom__oauth_iss_ok(promised, "http://as:9", "http://as:9/"));
    assert_false(loom__oauth_iss_ok(promised, "http://as:9", "http://AS:9"));
    assert_true(loom__oauth_iss_ok(silent, "http://as:9", NULL));
    assert_false(loom__oauth_iss_ok(silent, "http://as:9", "https://evil"));
    json_decref(promised);
    json_decref(silent);
    json_decref(no_token);
}

static void test_seal_round_trip(void **state)
{
    unsigned char key[32], other[32], *sealed = NULL, *sealed2 = NULL;
    const char *text = "{\"access_token\":\"secret-token\"}";
    size_t n = 0, n2 = 0;
    char *plain = NULL;

    (void)state;
    memset(key, 7, sizeof(key));
    memset(other, 8, sizeof(other));
    assert_int_equal(loom__seal(key, text, &sealed, &n), 0);
    assert_int_equal(n, strlen(text) + 28);
    assert_null(memmem(sealed, n, "secret-token", 12));
    assert_int_equal(loom__unseal(key, sealed, n, &plain), 0);
    assert_string_equal(plain, text);
    free(plain);
    /* a fresh nonce each time */
    assert_int_equal(loom__seal(key, text, &sealed2, &n2), 0);
    assert_memory_not_equal(sealed, sealed2, n);
    /* the wrong key, a changed byte, a cut: refused */
    assert_int_equal(loom__unseal(other, sealed, n, &plain), LOOM_EPROTO);
    assert_null(plain);
    sealed[14] ^= 1;
    assert_int_equal(loom__unseal(key, sealed, n, &plain), LOOM_EPROTO);
    assert_int_equal(loom__unseal(key, sealed, 20, &plain), LOOM_EPROTO);
    free(sealed);
    free(sealed2);
}

/* `oauth:` of an HTTP server in the config. */
static void test_config(void **state)
{
    loom_config *cfg = NULL;
    const loom_mcp_oauth_config *o;

    (void)state;
    if (loom_config_load_string(&cfg,
                                "mcp_servers:\n"
                                "  t:\n"
                                "    url: https://mcp.example.com/mcp\n"
                                "    oauth:\n"
                                "      client_id: loom-1\n"
                                "      client_secret: s3\n"
                                "      auth_method: client_secret_post\n"
                                "      scopes: [mcp:read, offline_access]\n"
                                "      grant_type: client_credentials\n"
                                "  u: {url: 'https://u.example/mcp', "
                                "oauth: {enabled: false}}\n"
                                "  v: {url: 'https://v.example/mcp'}\n",
                                "t.yaml") != 0)
        fail_msg("%s", loom_error_last());
    o = &cfg->mcp_servers[0].oauth;
    assert_string_equal(o->client_id, "loom-1");
    assert_string_equal(o->client_secret, "s3");
    assert_string_equal(o->auth_method, "client_secret_post");
    assert_int_equal(o->scopes_len, 2);
    assert_string_equal(o->scopes[1], "offline_access");
    assert_string_equal(o->grant_type, "client_credentials");
    assert_false(o->disabled);
    assert_true(cfg->mcp_servers[1].oauth.disabled);
    assert_null(cfg->mcp_servers[2].oauth.client_id);
    assert_false(cfg->mcp_servers[2].oauth.disabled);
    loom_config_free(cfg);

    assert_int_equal(loom_config_load_string(&cfg,
                                             "mcp_servers:\n"
                                             "  x: {command: a, oauth: "
                                             "{client_id: c}}\n",
                                             "t.yaml"),
                     LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "oauth is for a url"));
    assert_int_equal(loom_config_load_string(&cfg,
                                             "mcp_servers:\n"
                                             "  x: {url: 'http://h/mcp', "
                                             "oauth: {auth_method: magic}}\n",
                                             "t.yaml"),
                     LOOM_EINVALID);
    assert_int_equal(loom_config_load_string(&cfg,
                                             "mcp_servers:\n"
                                             "  x: {url: 'http://h/mcp', "
                                             "oauth: {client_secret: s}}\n",
                                             "t.yaml"),
                     LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "client_secret needs"));
    assert_int_equal(loom_config_load_string(&cfg,
                                             "mcp_servers:\n"
                                             "  x: {url: 'http://h/mcp', "
                                             "oauth: {scopes: ['a b']}}\n",
                                             "t.yaml"),
                     LOOM_EINVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_b64url),
        cmocka_unit_test(test_pkce),
        cmocka_unit_test(test_form_and_query),
        cmocka_unit_test(test_www_authenticate),
        cmocka_unit_test(test_resource_check),
        cmocka_unit_test(test_metadata_urls),
        cmocka_unit_test(test_issuer_checks),
        cmocka_unit_test(test_seal_round_trip),
        cmocka_unit_test(test_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
