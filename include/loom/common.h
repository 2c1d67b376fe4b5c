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

#ifdef __cplusplus
}
#endif
#endif
