/* Internal: raising errors. See include/loom/common.h for the contract. */
#ifndef LOOM_CORE_ERROR_H
#define LOOM_CORE_ERROR_H

#include "loom/common.h"

/* Records code and a formatted message for this thread; returns code so a
 * caller can write `return loom__error_set(LOOM_EINVALID, "...")`. */
int loom__error_set(int code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Returns LOOM_ENOMEM after recording "out of memory". */
int loom__error_oom(void);

/* An error state: a thread's own, or a fiber's (core/fiber.h). */
typedef struct {
    int code;
    char msg[1024];
} loom__error_state;

/*
 * Makes *slot the calling thread's error state until the next call (NULL:
 * the thread's own); returns the slot in use before. *slot may be NULL:
 * the state is allocated at the first error recorded while the slot is
 * in use, and reads as no error until then, so a fiber that never fails
 * carries no message buffer. The fiber scheduler swaps each fiber's in,
 * so runs sharing a worker thread keep apart.
 */
loom__error_state **loom__error_use(loom__error_state **slot);

/* Frees the state a slot holds and sets it to NULL (no error); the slot
 * must not be in use by any thread. */
void loom__error_release(loom__error_state **slot);

#endif
