/*
 * Secrets at rest (core/seal.h): AES-256-GCM, the sealed bytes being the
 * 12-byte nonce, the ciphertext and the 16-byte tag, and the derivation
 * of a key from a secret text and a purpose.
 */
#include "core/seal.h"
#include "core/error.h"

#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdlib.h>
#include <string.h>

int loom__seal_key(unsigned char key[LOOM_SEAL_KEY_SIZE], const char *purpose,
                   const char *secret)
{
    EVP_MD_CTX *d = EVP_MD_CTX_new();
    unsigned int n = 0;
    int ok = d && EVP_DigestInit_ex(d, EVP_sha256(), NULL) == 1 &&
             EVP_DigestUpdate(d, purpose, strlen(purpose) + 1) == 1 &&
             EVP_DigestUpdate(d, secret, strlen(secret)) == 1 &&
             EVP_DigestFinal_ex(d, key, &n) == 1 && n == LOOM_SEAL_KEY_SIZE;

    EVP_MD_CTX_free(d);
    return ok ? 0 : loom__error_set(LOOM_ERROR, "deriving a key failed");
}

#define NONCE 12
#define TAG 16

int loom__seal(const unsigned char key[LOOM_SEAL_KEY_SIZE], const char *plain,
               unsigned char **out, size_t *out_len)
{
    size_t n = strlen(plain);
    unsigned char *b = malloc(NONCE + n + TAG);
    EVP_CIPHER_CTX *x = EVP_CIPHER_CTX_new();
    int len = 0, ok;

    ok = b && x && RAND_bytes(b, NONCE) == 1 &&
         EVP_EncryptInit_ex(x, EVP_aes_256_gcm(), NULL, key, b) == 1 &&
         EVP_EncryptUpdate(x, b + NONCE, &len, (const unsigned char *)plain,
                           (int)n) == 1 &&
         EVP_EncryptFinal_ex(x, b + NONCE + len, &len) == 1 &&
         EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_GCM_GET_TAG, TAG, b + NONCE + n) == 1;
    EVP_CIPHER_CTX_free(x);
    if (!ok) {
        free(b);
        return b ? loom__error_set(LOOM_ERROR, "sealing failed")
                 : loom__error_oom();
    }
    *out = b;
    *out_len = NONCE + n + TAG;
    return 0;
}

int loom__unseal(const unsigned char key[LOOM_SEAL_KEY_SIZE],
                 const unsigned char *in, size_t n, char **plain)
{
    EVP_CIPHER_CTX *x;
    char *p;
    int len = 0, ok;

    *plain = NULL;
    if (n < NONCE + TAG)
        return loom__error_set(LOOM_EPROTO, "sealed data too short");
    if (!(p = malloc(n - NONCE - TAG + 1)) || !(x = EVP_CIPHER_CTX_new())) {
        free(p);
        return loom__error_oom();
    }
    ok = EVP_DecryptInit_ex(x, EVP_aes_256_gcm(), NULL, key, in) == 1 &&
         EVP_DecryptUpdate(x, (unsigned char *)p, &len, in + NONCE,
                           (int)(n - NONCE - TAG)) == 1 &&
         EVP_CIPHER_CTX_ctrl(x, EVP_CTRL_GCM_SET_TAG, TAG,
                             (void *)(in + n - TAG)) == 1 &&
         EVP_DecryptFinal_ex(x, (unsigned char *)p + len, &len) == 1;
    EVP_CIPHER_CTX_free(x);
    if (!ok) {
        free(p);
        return loom__error_set(LOOM_EPROTO,
                               "sealed data does not open with this key "
                               "(another key, or damaged)");
    }
    p[n - NONCE - TAG] = '\0';
    *plain = p;
    return 0;
}
