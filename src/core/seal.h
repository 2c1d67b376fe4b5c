/*
 * Internal: secrets at rest. AES-256-GCM with a random nonce seals a
 * text into bytes that only the same key opens (and that show any change
 * made to them); a key is derived from a secret text and a purpose, so
 * one secret serves several uses without their keys being the same.
 * The store keeps MCP OAuth credentials sealed this way.
 */
#ifndef LOOM_CORE_SEAL_H
#define LOOM_CORE_SEAL_H

#include <stddef.h>

/* Bytes of a key. */
#define LOOM_SEAL_KEY_SIZE 32

/* key = SHA-256(purpose, a NUL, secret). LOOM_ERROR when hashing fails. */
int loom__seal_key(unsigned char key[LOOM_SEAL_KEY_SIZE], const char *purpose,
                   const char *secret);

/* *out (caller frees) is the nonce, the ciphertext of plain and the tag;
 * *out_len its length. LOOM_ENOMEM, LOOM_ERROR. */
int loom__seal(const unsigned char key[LOOM_SEAL_KEY_SIZE], const char *plain,
               unsigned char **out, size_t *out_len);

/* The reverse: *plain (caller frees) is the text. LOOM_EPROTO when the
 * key is wrong or the bytes were damaged (nothing is given then). */
int loom__unseal(const unsigned char key[LOOM_SEAL_KEY_SIZE],
                 const unsigned char *in, size_t n, char **plain);

#endif
