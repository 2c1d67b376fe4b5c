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

#endif
