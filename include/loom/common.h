/*
 * loom/common.h: error codes and the per-thread error message.
 *
 * Every libloom function that can fail returns 0 on success or a negative
 * LOOM_E* code, and leaves a human-readable message that
 * loom_error_last() returns on the same thread (libgit2's model). Only a few
 * codes are meant to be handled by callers; everything else is LOOM_ERROR
 * with a message.
 */
#ifndef LOOM_COMMON_H
#define LOOM_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    LOOM_OK = 0,
    LOOM_ERROR = -1,      /* generic failure; see the message */
    LOOM_ENOMEM = -2,     /* out of memory */
    LOOM_ENOTFOUND = -3,  /* a named thing does not exist */
    LOOM_ETIMEDOUT = -4,  /* a time limit passed */
    LOOM_ECANCELED = -5,  /* cancelled by the caller */
    LOOM_ETOOLARGE = -6,  /* a size limit passed */
    LOOM_EUPSTREAM = -7,  /* the model provider answered with an error */
    LOOM_EPROTO = -8,     /* malformed data from outside (wire, file) */
    LOOM_EINVALID = -9,   /* bad argument or configuration */
    LOOM_EEXISTS = -10,   /* the name is already taken */
    LOOM_EIO = -11        /* a system call or the network failed */
} loom_error_code;

/*
 * The message of the last error raised on this thread, or "" when none.
 * The pointer is valid until the next loom call on this thread.
 */
const char *loom_error_last(void);

/* The last error code raised on this thread (0 when none). */
int loom_error_last_code(void);

/* Forgets the last error on this thread. */
void loom_error_clear(void);

/* A constant name for an error code ("ETIMEDOUT"); never NULL. */
const char *loom_error_name(int code);

/* loom's version string, "MAJOR.MINOR.PATCH". */
const char *loom_version(void);

/*
 * A yes/no option whose zero value means "the default": options structs
 * are zero-initialised, so a field that is not set must not read as no.
 */
typedef enum { LOOM_OPT_DEFAULT = 0, LOOM_OPT_ON, LOOM_OPT_OFF } loom_opt_bool;

/* Bytes of an id loom makes (prefix of at most 7 bytes, 24 hex digits,
 * NUL), and the longest id a caller may choose. */
#define LOOM_ID_SIZE 32
#define LOOM_ID_MAX 128

/*
 * Fills id with prefix + 24 hex digits: "run_...", "conv_...". The first
 * 12 are the current time in milliseconds since the epoch, so ids made
 * later sort later (new rows land at the end of the store's indexes);
 * the other 12 are random (48 bits from the kernel, which each thread
 * draws a block at a time; a child made by fork() draws its own).
 * LOOM_EINVALID for a prefix over 7 bytes, LOOM_EIO when the kernel gives
 * no randomness.
 */
int loom_id_new(char id[LOOM_ID_SIZE], const char *prefix);

#ifdef __cplusplus
}
#endif
#endif
