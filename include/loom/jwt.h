/*
 * loom/jwt.h: checking JSON Web Tokens an identity provider signed
 * (`auth.mode: jwt`, docs/accounts.md#jwt).
 *
 * A verifier holds the keys a deployment trusts: an HMAC secret for
 * HS256, and the RSA and EC P-256 keys of a JWKS file for RS256 and
 * ES256. A token is accepted when its header names one of those
 * algorithms with a key of the matching kind (so an HS256 token is never
 * checked against a public key, and "none" never passes), its signature
 * holds, and its claims say it is current and meant for this server:
 * `exp` (required) and `nbf` within the leeway, `aud` and `iss` equal to
 * the configured ones when those are set, `sub` a user name, and the
 * workspace claim (when configured) a workspace name. libjwt decodes the
 * token; the signature is checked with OpenSSL (HMAC compared in constant
 * time) or by libjwt with the key as PEM.
 *
 * A verifier does not change after loom_jwt_verifier_new, so any number
 * of threads may verify at once.
 */
#ifndef LOOM_JWT_H
#define LOOM_JWT_H

#include "accounts.h"
#include "common.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bytes of a token at most. */
#define LOOM_JWT_MAX 16384
/* Keys a JWKS file may hold at most. */
#define LOOM_JWKS_MAX_KEYS 64

/* What a verifier trusts. Zero is the default for every field. */
typedef struct {
    unsigned version;
    const char *secret;    /* HS256 key; NULL: HS256 refused */
    const char *jwks_file; /* RS256/ES256 keys; NULL: refused */
    const char *audience;  /* NULL: aud not checked */
    const char *issuer;    /* NULL: iss not checked */
    /* The claim naming the caller's workspace; NULL: every user is in
     * LOOM_ACCOUNT_DEFAULT_WORKSPACE. */
    const char *workspace_claim;
    int leeway_seconds; /* clock skew allowed on exp and nbf */
} loom_jwt_options;

#define LOOM_JWT_OPTIONS_VERSION 1
#define LOOM_JWT_OPTIONS_INIT                                                  \
    {                                                                          \
        .version = LOOM_JWT_OPTIONS_VERSION                                    \
    }

typedef struct loom_jwt_verifier loom_jwt_verifier;

/*
 * Makes a verifier: copies the options and reads the JWKS file (its RSA
 * keys and EC keys on P-256 that are for signatures; others are left
 * out). LOOM_EINVALID for options without a key, a secret shorter than
 * 32 bytes, an unreadable file, a file that is not a JWKS or holds no
 * usable key (the message says which); LOOM_ENOMEM.
 */
int loom_jwt_verifier_new(loom_jwt_verifier **out, const loom_jwt_options *o);

void loom_jwt_verifier_free(loom_jwt_verifier *v);

/* Who a token names. */
typedef struct {
    char user[LOOM_ACCOUNT_NAME_MAX + 1];
    char workspace[LOOM_ACCOUNT_NAME_MAX + 1];
    int64_t expires_at; /* Unix ms */
} loom_jwt_identity;

/*
 * Checks token at time now (Unix ms): 0 and *out filled when accepted.
 * Else LOOM_EINVALID, whose message says why (malformed, an algorithm
 * not accepted, no key for its kid, a bad signature, expired, not yet
 * valid, wrong audience or issuer, a missing or invalid sub or
 * workspace) but never holds the token; LOOM_ENOMEM.
 */
int loom_jwt_verify(const loom_jwt_verifier *v, const char *token, int64_t now,
                    loom_jwt_identity *out);

#ifdef __cplusplus
}
#endif
#endif
