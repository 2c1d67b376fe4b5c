/*
 * Test support: signing keys and JSON Web Tokens made in the tests
 * (OpenSSL makes the keys, libjwt signs), and the JWKS of public keys,
 * for the JWT verifier's unit tests and the server's integration tests.
 */
#ifndef LOOM_TEST_JWT_TOKENS_H
#define LOOM_TEST_JWT_TOKENS_H

#include <jansson.h>

/* A key pair: RSA 2048 ("RSA") or EC P-256 ("EC"). */
typedef struct test_key test_key;

test_key *test_key_new(const char *type);
void test_key_free(test_key *k);

/* Its private key as PEM (borrowed), and its public key as a JWK (new
 * reference) with kid (NULL: none), "use": "sig" and no alg. */
const char *test_key_private_pem(const test_key *k);
const char *test_key_public_pem(const test_key *k);
json_t *test_key_jwk(const test_key *k, const char *kid);

/*
 * A token of claims (a JSON object's text) signed with alg ("HS256",
 * "RS256", "ES256", "none") by key (the HMAC secret for HS256, a private
 * PEM otherwise; NULL for none), with kid in its header when not NULL.
 * Caller frees; NULL on failure.
 */
char *test_jwt_make(const char *alg, const char *key, const char *kid,
                    const char *claims);

/* Writes {"keys": [jwks...]} to a new temporary file; the path (caller
 * frees). */
char *test_jwks_write(const char *name, json_t *keys);

#endif
