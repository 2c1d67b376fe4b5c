/*
 * Test support: keys, tokens and JWKS files (jwt_tokens.h).
 */
#include "jwt_tokens.h"
#include "testutil.h"

#include <jwt.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <stdlib.h>
#include <string.h>

struct test_key {
    EVP_PKEY *pk;
    char *priv, *pub;
};

/* The PEM a write function makes of pk (caller frees). */
static char *pem(EVP_PKEY *pk, int priv)
{
    BIO *b = BIO_new(BIO_s_mem());
    char *data = NULL, *out = NULL;
    long n;
    int ok = priv ? PEM_write_bio_PrivateKey(b, pk, NULL, NULL, 0, NULL, NULL)
                  : PEM_write_bio_PUBKEY(b, pk);

    if (ok == 1 && (n = BIO_get_mem_data(b, &data)) > 0 &&
        (out = malloc((size_t)n + 1))) {
        memcpy(out, data, (size_t)n);
        out[n] = '\0';
    }
    BIO_free(b);
    return out;
}

test_key *test_key_new(const char *type)
{
    test_key *k = calloc(1, sizeof(*k));

    if (!k)
        return NULL;
    k->pk = !strcmp(type, "RSA")
                ? EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)2048)
                : EVP_PKEY_Q_keygen(NULL, NULL, "EC", "P-256");
    if (!k->pk || !(k->priv = pem(k->pk, 1)) || !(k->pub = pem(k->pk, 0))) {
        test_key_free(k);
        return NULL;
    }
    return k;
}

void test_key_free(test_key *k)
{
    if (!k)
        return;
    EVP_PKEY_free(k->pk);
    free(k->priv);
    free(k->pub);
    free(k);
}

const char *test_key_private_pem(const test_key *k)
{
    return k->priv;
}

const char *test_key_public_pem(const test_key *k)
{
    return k->pub;
}

/* base64url of n bytes, no padding, as a new JSON string. */
static json_t *b64url(const unsigned char *in, size_t n)
{
    char *out = malloc(4 * ((n + 2) / 3) + 1);
    json_t *s;
    int len;

    if (!out)
        return NULL;
    len = EVP_EncodeBlock((unsigned char *)out, in, (int)n);
    while (len > 0 && out[len - 1] == '=')
        len--;
    out[len] = '\0';
    for (int i = 0; i < len; i++)
        out[i] = out[i] == '+' ? '-' : out[i] == '/' ? '_' : out[i];
    s = json_string(out);
    free(out);
    return s;
}

/* The big-number parameter name of k as base64url. */
static json_t *bn_param(const test_key *k, const char *name)
{
    BIGNUM *bn = NULL;
    unsigned char buf[1024];
    json_t *s = NULL;
    int n;

    if (EVP_PKEY_get_bn_param(k->pk, name, &bn) == 1 &&
        (n = BN_bn2bin(bn, buf)) > 0)
        s = b64url(buf, (size_t)n);
    BN_free(bn);
    return s;
}

json_t *test_key_jwk(const test_key *k, const char *kid)
{
    json_t *j = json_object();

    if (EVP_PKEY_is_a(k->pk, "RSA")) {
        json_object_set_new(j, "kty", json_string("RSA"));
        json_object_set_new(j, "n", bn_param(k, OSSL_PKEY_PARAM_RSA_N));
        json_object_set_new(j, "e", bn_param(k, OSSL_PKEY_PARAM_RSA_E));
    } else {
        unsigned char pub[65];
        size_t n = 0;
        EVP_PKEY_set_utf8_string_param(
            k->pk, OSSL_PKEY_PARAM_EC_POINT_CONVERSION_FORMAT, "uncompressed");
        EVP_PKEY_get_octet_string_param(k->pk, OSSL_PKEY_PARAM_PUB_KEY, pub,
                                        sizeof(pub), &n);
        json_object_set_new(j, "kty", json_string("EC"));
        json_object_set_new(j, "crv", json_string("P-256"));
        json_object_set_new(j, "x", b64url(pub + 1, 32));
        json_object_set_new(j, "y", b64url(pub + 33, 32));
    }
    json_object_set_new(j, "use", json_string("sig"));
    if (kid)
        json_object_set_new(j, "kid", json_string(kid));
    return j;
}

char *test_jwt_make(const char *alg, const char *key, const char *kid,
                    const char *claims)
{
    jwt_t *j = NULL;
    char *out = NULL;
    jwt_alg_t a = jwt_str_alg(alg);

    if (jwt_new(&j) != 0)
        return NULL;
    if (jwt_add_grants_json(j, claims) == 0 &&
        (!kid || jwt_add_header(j, "kid", kid) == 0) &&
        jwt_set_alg(j, a, (const unsigned char *)key,
                    key ? (int)strlen(key) : 0) == 0)
        out = jwt_encode_str(j);
    jwt_free(j);
    return out;
}

char *test_jwks_write(const char *name, json_t *keys)
{
    json_t *root = json_pack("{s:O}", "keys", keys);
    char *path = test_tmp_path(name), *text = json_dumps(root, 0);

    test_write_file(path, text, strlen(text));
    free(text);
    json_decref(root);
    return path;
}
