/*
 * JSON Web Tokens (loom/jwt.h): the verifier of `auth.mode: jwt`.
 *
 * libjwt (1.10, Debian 12's) decodes a token's header and claims; it is
 * asked to decode first without a key, so that loom, not the token,
 * chooses the key: the header's alg must be one the deployment allows and
 * the key of the matching kind (the HMAC secret for HS256, an RSA key for
 * RS256, an EC P-256 key for ES256), which closes the algorithm-confusion
 * hole of libraries that verify with whatever alg a token claims. Then:
 * - HS256 is checked here with OpenSSL's HMAC, compared in constant time
 *   (CRYPTO_memcmp over the base64url text of the MAC);
 * - RS256 and ES256 by libjwt decoding again with the chosen key as PEM.
 * The JWKS keys are turned into PEM once, when the verifier is made: the
 * JWK's base64url numbers are decoded by OpenSSL and built into an
 * EVP_PKEY with EVP_PKEY_fromdata. Claims are read with jansson from the
 * JSON libjwt gives back.
 *
 * Messages say why a token is refused, never the token itself.
 */
#include "loom/jwt.h"
#include "core/error.h"

#include <errno.h>
#include <jansson.h>
#include <jwt.h>
#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/param_build.h>
#include <openssl/pem.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A JWKS file is read whole, up to this many bytes. */
#define JWKS_FILE_MAX (1L << 20)
/* Bytes of one decoded JWK number (an 8192-bit modulus). */
#define JWK_NUM_MAX 1024
/* RSA moduli shorter than this many bytes (2048 bits) are refused. */
#define RSA_MIN_BYTES 256
#define KID_MAX 256
/* HS256 secrets shorter than the hash (RFC 7518 3.2) are refused. */
#define SECRET_MIN 32

typedef enum { KEY_RSA, KEY_EC } key_kind;

typedef struct {
    key_kind kind;
    char *kid; /* NULL: none */
    char *pem; /* the public key as PEM, for libjwt */
} jwk;

struct loom_jwt_verifier {
    char *secret;
    char *audience;
    char *issuer;
    char *workspace_claim;
    int leeway_seconds;
    jwk keys[LOOM_JWKS_MAX_KEYS];
    size_t nkeys;
};

static int dup_opt(char **dst, const char *s)
{
    if (s && !(*dst = strdup(s)))
        return loom__error_oom();
    return 0;
}

void loom_jwt_verifier_free(loom_jwt_verifier *v)
{
    if (!v)
        return;
    if (v->secret) {
        OPENSSL_cleanse(v->secret, strlen(v->secret));
        free(v->secret);
    }
    free(v->audience);
    free(v->issuer);
    free(v->workspace_claim);
    for (size_t i = 0; i < v->nkeys; i++) {
        free(v->keys[i].kid);
        free(v->keys[i].pem);
    }
    free(v);
}

/* ---- JWKS ---------------------------------------------------------------- */

/* Decodes base64url text s (no padding, as JWK numbers are written) into
 * out (cap bytes): its length, or -1 when s is not base64url or too
 * long. */
static int b64url_decode(const char *s, unsigned char *out, size_t cap)
{
    size_t n = strlen(s), pad = (4 - n % 4) % 4;
    char tmp[JWK_NUM_MAX * 4 / 3 + 8];
    int got;

    if (n == 0 || pad == 3 || n + pad >= sizeof(tmp) ||
        (n + pad) / 4 * 3 > cap + 2)
        return -1;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '+' || c == '/' || c == '=')
            return -1; /* base64, not base64url */
        tmp[i] = c == '-' ? '+' : c == '_' ? '/' : c;
    }
    memset(tmp + n, '=', pad);
    tmp[n + pad] = '\0';
    got = EVP_DecodeBlock(out, (const unsigned char *)tmp, (int)(n + pad));
    /* EVP_DecodeBlock counts the padding as zero bytes. */
    if (got < 0 || (size_t)got < pad || (size_t)got - pad > cap)
        return -1;
    return got - (int)pad;
}

/* The key as PEM (SubjectPublicKeyInfo); NULL when out of memory. */
static char *pem_of(EVP_PKEY *pk)
{
    BIO *b = BIO_new(BIO_s_mem());
    char *data = NULL, *pem = NULL;
    long n;

    if (b && PEM_write_bio_PUBKEY(b, pk) == 1 &&
        (n = BIO_get_mem_data(b, &data)) > 0 && (pem = malloc((size_t)n + 1))) {
        memcpy(pem, data, (size_t)n);
        pem[n] = '\0';
    }
    BIO_free(b);
    return pem;
}

/* An EVP_PKEY of type name from the parameters in bld; NULL on failure. */
static EVP_PKEY *from_params(const char *name, OSSL_PARAM_BLD *bld)
{
    OSSL_PARAM *params = bld ? OSSL_PARAM_BLD_to_param(bld) : NULL;
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_name(NULL, name, NULL);
    EVP_PKEY *pk = NULL;

    if (!params || !ctx || EVP_PKEY_fromdata_init(ctx) != 1 ||
        EVP_PKEY_fromdata(ctx, &pk, EVP_PKEY_PUBLIC_KEY, params) != 1)
        pk = NULL;
    EVP_PKEY_CTX_free(ctx);
    OSSL_PARAM_free(params);
    return pk;
}

/* The RSA key of JWK k, or NULL with *why set. */
static EVP_PKEY *rsa_key(const json_t *k, const char **why)
{
    unsigned char n[JWK_NUM_MAX], e[16];
    const char *ns = json_string_value(json_object_get(k, "n"));
    const char *es = json_string_value(json_object_get(k, "e"));
    int nl = ns ? b64url_decode(ns, n, sizeof(n)) : -1;
    int el = es ? b64url_decode(es, e, sizeof(e)) : -1;
    BIGNUM *bn = NULL, *be = NULL;
    OSSL_PARAM_BLD *bld = NULL;
    EVP_PKEY *pk = NULL;

    if (nl <= 0 || el <= 0) {
        *why = "its n or e is not base64url";
        return NULL;
    }
    if (nl < RSA_MIN_BYTES + (n[0] == 0)) {
        *why = "its modulus is shorter than 2048 bits";
        return NULL;
    }
    if ((bn = BN_bin2bn(n, nl, NULL)) && (be = BN_bin2bn(e, el, NULL)) &&
        (bld = OSSL_PARAM_BLD_new()) &&
        OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, bn) == 1 &&
        OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, be) == 1)
        pk = from_params("RSA", bld);
    if (!pk)
        *why = "OpenSSL does not take it as an RSA key";
    OSSL_PARAM_BLD_free(bld);
    BN_free(bn);
    BN_free(be);
    return pk;
}

/* The EC P-256 key of JWK k, or NULL with *why set. */
static EVP_PKEY *ec_key(const json_t *k, const char **why)
{
    unsigned char pub[65];
    const char *crv = json_string_value(json_object_get(k, "crv"));
    const char *xs = json_string_value(json_object_get(k, "x"));
    const char *ys = json_string_value(json_object_get(k, "y"));
    OSSL_PARAM_BLD *bld = NULL;
    EVP_PKEY *pk = NULL;

    if (!crv || strcmp(crv, "P-256") != 0) {
        *why = "its curve is not P-256";
        return NULL;
    }
    pub[0] = 4; /* an uncompressed point: 04 || x || y */
    if (!xs || !ys || b64url_decode(xs, pub + 1, 32) != 32 ||
        b64url_decode(ys, pub + 33, 32) != 32) {
        *why = "its x or y is not 32 bytes of base64url";
        return NULL;
    }
    if ((bld = OSSL_PARAM_BLD_new()) &&
        OSSL_PARAM_BLD_push_utf8_string(bld, OSSL_PKEY_PARAM_GROUP_NAME,
                                        "prime256v1", 0) == 1 &&
        OSSL_PARAM_BLD_push_octet_string(bld, OSSL_PKEY_PARAM_PUB_KEY, pub,
                                         sizeof(pub)) == 1)
        pk = from_params("EC", bld);
    if (!pk)
        *why = "its point is not on P-256";
    OSSL_PARAM_BLD_free(bld);
    return pk;
}

/* Adds JWK k (entry i of the file) to v, or leaves it out when it is not
 * a signing key loom uses. LOOM_EINVALID for a broken one, LOOM_ENOMEM. */
static int add_key(loom_jwt_verifier *v, const json_t *k, size_t i,
                   const char *file)
{
    const char *kty = json_string_value(json_object_get(k, "kty"));
    const char *use = json_string_value(json_object_get(k, "use"));
    const char *alg = json_string_value(json_object_get(k, "alg"));
    const char *kid = json_string_value(json_object_get(k, "kid"));
    const char *why = NULL;
    EVP_PKEY *pk = NULL;
    jwk *out = &v->keys[v->nkeys];

    if (!json_is_object(k) || !kty)
        return loom__error_set(LOOM_EINVALID,
                               "auth.jwt.jwks_file %s: key %zu has no kty",
                               file, i);
    if (use && strcmp(use, "sig") != 0)
        return 0;
    if (!strcmp(kty, "RSA") && (!alg || !strcmp(alg, "RS256"))) {
        out->kind = KEY_RSA;
        pk = rsa_key(k, &why);
    } else if (!strcmp(kty, "EC") && (!alg || !strcmp(alg, "ES256"))) {
        out->kind = KEY_EC;
        pk = ec_key(k, &why);
        /* Another curve (P-384, ...) is for an algorithm loom refuses. */
        if (!pk && !strcmp(why, "its curve is not P-256"))
            return 0;
    } else {
        return 0; /* oct, OKP, or an algorithm loom does not accept */
    }
    if (!pk)
        return loom__error_set(LOOM_EINVALID,
                               "auth.jwt.jwks_file %s: key %zu (%s): %s", file,
                               i, kid ? kid : "no kid", why);
    if (v->nkeys == LOOM_JWKS_MAX_KEYS) {
        EVP_PKEY_free(pk);
        return loom__error_set(LOOM_EINVALID,
                               "auth.jwt.jwks_file %s: more than %d keys", file,
                               LOOM_JWKS_MAX_KEYS);
    }
    out->pem = pem_of(pk);
    EVP_PKEY_free(pk);
    if (!out->pem ||
        (kid && strlen(kid) <= KID_MAX && !(out->kid = strdup(kid)))) {
        free(out->pem);
        out->pem = NULL;
        return loom__error_oom();
    }
    v->nkeys++;
    return 0;
}

static int load_jwks(loom_jwt_verifier *v, const char *file)
{
    json_error_t err;
    struct stat sb;
    json_t *root, *keys, *k;
    size_t i;
    int rc = 0;

    if (stat(file, &sb) != 0 || !S_ISREG(sb.st_mode))
        return loom__error_set(LOOM_EINVALID,
                               "auth.jwt.jwks_file %s: no such file", file);
    if (sb.st_size > JWKS_FILE_MAX)
        return loom__error_set(LOOM_EINVALID,
                               "auth.jwt.jwks_file %s: larger than %ld bytes",
                               file, JWKS_FILE_MAX);
    if (!(root = json_load_file(file, JSON_REJECT_DUPLICATES, &err)))
        return loom__error_set(LOOM_EINVALID,
                               "auth.jwt.jwks_file %s: not JSON (line %d: %s)",
                               file, err.line, err.text);
    if (!json_is_array(keys = json_object_get(root, "keys")))
        rc = loom__error_set(LOOM_EINVALID,
                             "auth.jwt.jwks_file %s: not a JWKS (no \"keys\" "
                             "array)",
                             file);
    json_array_foreach(keys, i, k)
    {
        if (rc == 0)
            rc = add_key(v, k, i, file);
    }
    json_decref(root);
    if (rc == 0 && v->nkeys == 0)
        rc = loom__error_set(LOOM_EINVALID,
                             "auth.jwt.jwks_file %s: no RSA or EC P-256 "
                             "signing key in it",
                             file);
    return rc;
}

int loom_jwt_verifier_new(loom_jwt_verifier **out, const loom_jwt_options *o)
{
    loom_jwt_verifier *v;
    int rc;

    *out = NULL;
    if (!o || o->version != LOOM_JWT_OPTIONS_VERSION)
        return loom__error_set(LOOM_EINVALID, "jwt: bad options version");
    if (!o->secret && !o->jwks_file)
        return loom__error_set(LOOM_EINVALID,
                               "auth.jwt needs a secret (HS256) or a "
                               "jwks_file (RS256, ES256)");
    if (o->secret && strlen(o->secret) < SECRET_MIN)
        return loom__error_set(LOOM_EINVALID,
                               "auth.jwt.secret is shorter than %d bytes "
                               "(HS256 needs at least 256 bits)",
                               SECRET_MIN);
    if (o->leeway_seconds < 0)
        return loom__error_set(LOOM_EINVALID,
                               "auth.jwt.leeway_seconds is negative");
    if (!(v = calloc(1, sizeof(*v))))
        return loom__error_oom();
    v->leeway_seconds = o->leeway_seconds;
    if ((rc = dup_opt(&v->secret, o->secret)) != 0 ||
        (rc = dup_opt(&v->audience, o->audience)) != 0 ||
        (rc = dup_opt(&v->issuer, o->issuer)) != 0 ||
        (rc = dup_opt(&v->workspace_claim, o->workspace_claim)) != 0 ||
        (o->jwks_file && (rc = load_jwks(v, o->jwks_file)) != 0)) {
        loom_jwt_verifier_free(v);
        return rc;
    }
    *out = v;
    return 0;
}

/* ---- signatures ---------------------------------------------------------- */

static int refuse(const char *why)
{
    return loom__error_set(LOOM_EINVALID, "the token is not accepted: %s", why);
}

/* HS256: the MAC of everything before the last '.' against what follows
 * it, as base64url text compared in constant time. */
static int hmac_ok(const loom_jwt_verifier *v, const char *token)
{
    const char *dot = strrchr(token, '.');
    unsigned char mac[EVP_MAX_MD_SIZE];
    char b64[64];
    unsigned int n = 0;
    int len;

    if (!dot ||
        !HMAC(EVP_sha256(), v->secret, (int)strlen(v->secret),
              (const unsigned char *)token, (size_t)(dot - token), mac, &n))
        return 0;
    len = EVP_EncodeBlock((unsigned char *)b64, mac, (int)n);
    while (len > 0 && b64[len - 1] == '=')
        len--;
    for (int i = 0; i < len; i++)
        b64[i] = b64[i] == '+' ? '-' : b64[i] == '/' ? '_' : b64[i];
    return strlen(dot + 1) == (size_t)len &&
           CRYPTO_memcmp(dot + 1, b64, (size_t)len) == 0;
}

/* The key of kind for kid (NULL: the only key of that kind), or NULL
 * with the refusal set. */
static const jwk *pick_key(const loom_jwt_verifier *v, key_kind kind,
                           const char *kid)
{
    const jwk *found = NULL;
    size_t count = 0;

    for (size_t i = 0; i < v->nkeys; i++) {
        const jwk *k = &v->keys[i];
        if (k->kind != kind)
            continue;
        if (kid ? k->kid && !strcmp(k->kid, kid) : !count)
            found = k;
        count++;
    }
    if (kid && !found)
        refuse("no key of the JWKS has its kid (and the algorithm's key "
               "type)");
    else if (!kid && count > 1)
        refuse("it names no key (kid) and the JWKS has several");
    else if (!found)
        refuse("the JWKS has no key for its algorithm");
    return kid || count == 1 ? found : NULL;
}

/* Whether the signature of token (alg as its header says) holds. */
static int signature_ok(const loom_jwt_verifier *v, const char *token,
                        jwt_alg_t alg, const char *kid)
{
    const jwk *k;
    jwt_t *j = NULL;
    int rc;

    if (alg == JWT_ALG_HS256) {
        if (!v->secret)
            return refuse("HS256 tokens are not accepted here (no "
                          "auth.jwt.secret)");
        return hmac_ok(v, token) ? 0 : refuse("bad signature");
    }
    if (!v->nkeys)
        return refuse("RS256 and ES256 tokens are not accepted here (no "
                      "auth.jwt.jwks_file)");
    if (!(k = pick_key(v, alg == JWT_ALG_RS256 ? KEY_RSA : KEY_EC, kid)))
        return LOOM_EINVALID;
    rc = jwt_decode(&j, token, (const unsigned char *)k->pem,
                    (int)strlen(k->pem));
    /* The same header, so the same algorithm: checked again all the same. */
    if (rc == 0 && jwt_get_alg(j) != alg)
        rc = -1;
    jwt_free(j);
    if (rc == ENOMEM)
        return loom__error_oom();
    return rc == 0 ? 0 : refuse("bad signature");
}

/* ---- claims -------------------------------------------------------------- */

/* A NumericDate claim in Unix ms into *ms: 1, 0 when absent, -1 when not
 * a number. */
static int date_claim(const json_t *claims, const char *name, int64_t *ms)
{
    const json_t *c = json_object_get(claims, name);
    double d;

    if (!c)
        return 0;
    if (!json_is_number(c))
        return -1;
    d = json_number_value(c);
    if (d < 0 || d > 1e13)
        return -1;
    *ms = (int64_t)(d * 1000.0);
    return 1;
}

static int audience_ok(const json_t *aud, const char *want)
{
    size_t i;
    json_t *a;

    if (json_is_string(aud))
        return !strcmp(json_string_value(aud), want);
    json_array_foreach(aud, i, a)
    {
        if (json_is_string(a) && !strcmp(json_string_value(a), want))
            return 1;
    }
    return 0;
}

/* A name claim (sub, the workspace) into out; a refusal when it is
 * missing or not an account name. */
static int name_claim(const json_t *claims, const char *name,
                      char out[LOOM_ACCOUNT_NAME_MAX + 1])
{
    const char *s = json_string_value(json_object_get(claims, name));

    if (!s)
        return loom__error_set(LOOM_EINVALID,
                               "the token is not accepted: it has no \"%s\" "
                               "claim (a string)",
                               name);
    if (!loom_account_name_valid(s))
        return loom__error_set(LOOM_EINVALID,
                               "the token is not accepted: its \"%s\" claim "
                               "is not a valid name (1 to %d characters of "
                               "A-Z a-z 0-9 _ - . @ : + =)",
                               name, LOOM_ACCOUNT_NAME_MAX);
    snprintf(out, LOOM_ACCOUNT_NAME_MAX + 1, "%s", s);
    return 0;
}

static int claims_ok(const loom_jwt_verifier *v, const json_t *claims,
                     int64_t now, loom_jwt_identity *out)
{
    int64_t exp = 0, nbf = 0, leeway = (int64_t)v->leeway_seconds * 1000;
    const char *iss;
    int has, rc;

    if ((has = date_claim(claims, "exp", &exp)) <= 0)
        return refuse(has ? "its exp is not a number" : "it has no exp");
    if (now >= exp + leeway)
        return refuse("it has expired");
    if ((has = date_claim(claims, "nbf", &nbf)) < 0)
        return refuse("its nbf is not a number");
    if (has && now + leeway < nbf)
        return refuse("it is not valid yet (nbf)");
    if (v->audience &&
        !audience_ok(json_object_get(claims, "aud"), v->audience))
        return refuse("it is not for this audience (aud)");
    iss = json_string_value(json_object_get(claims, "iss"));
    if (v->issuer && (!iss || strcmp(iss, v->issuer) != 0))
        return refuse("its issuer (iss) is not the one trusted");
    out->expires_at = exp;
    if ((rc = name_claim(claims, "sub", out->user)) != 0)
        return rc;
    if (v->workspace_claim)
        return name_claim(claims, v->workspace_claim, out->workspace);
    snprintf(out->workspace, sizeof(out->workspace), "%s",
             LOOM_ACCOUNT_DEFAULT_WORKSPACE);
    return 0;
}

int loom_jwt_verify(const loom_jwt_verifier *v, const char *token, int64_t now,
                    loom_jwt_identity *out)
{
    jwt_t *j = NULL;
    json_t *claims = NULL;
    char *text = NULL, *kid = NULL;
    const char *name;
    jwt_alg_t alg;
    int rc;

    memset(out, 0, sizeof(*out));
    if (!v || !token)
        return loom__error_set(LOOM_EINVALID, "jwt: NULL argument");
    if (strnlen(token, LOOM_JWT_MAX + 1) > LOOM_JWT_MAX)
        return refuse("longer than 16 KiB");
    /* Decoded without a key: loom picks the key, not the token. */
    if ((rc = jwt_decode(&j, token, NULL, 0)) != 0)
        return rc == ENOMEM ? loom__error_oom() : refuse("malformed");
    /* Decoded without a key, libjwt reports alg none: the header says. */
    name = jwt_get_header(j, "alg");
    alg = name ? jwt_str_alg(name) : JWT_ALG_INVAL;
    if (jwt_get_header(j, "crit"))
        rc = refuse("it has critical header extensions (crit)");
    else if (alg != JWT_ALG_HS256 && alg != JWT_ALG_RS256 &&
             alg != JWT_ALG_ES256)
        rc = loom__error_set(LOOM_EINVALID,
                             "the token is not accepted: its algorithm %s "
                             "is not (HS256, RS256 and ES256 are)",
                             alg == JWT_ALG_INVAL ? "unknown"
                                                  : jwt_alg_str(alg));
    else if (jwt_get_header(j, "kid") &&
             !(kid = strdup(jwt_get_header(j, "kid"))))
        rc = loom__error_oom();
    else if (!(text = jwt_get_grants_json(j, NULL)) ||
             !(claims = json_loads(text, 0, NULL)) || !json_is_object(claims))
        rc = refuse("its claims are not a JSON object");
    jwt_free(j);
    free(text);
    if (rc == 0 && (rc = signature_ok(v, token, alg, kid)) == 0)
        rc = claims_ok(v, claims, now, out);
    free(kid);
    json_decref(claims);
    if (rc != 0)
        memset(out, 0, sizeof(*out));
    return rc;
}
