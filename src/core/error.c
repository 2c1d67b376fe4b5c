/*
 * Per-thread error state. Each thread keeps its last code and message in
 * thread-local storage so concurrent runs and tool threads never see each
 * other's errors.
 */
#include "core/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#ifndef LOOM_VERSION
#define LOOM_VERSION "0.0.0"
#endif

static _Thread_local int last_code;
static _Thread_local char last_msg[1024];

int loom__error_set(int code, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(last_msg, sizeof(last_msg), fmt, ap);
    va_end(ap);
    last_code = code;
    return code;
}

int loom__error_oom(void)
{
    return loom__error_set(LOOM_ENOMEM, "out of memory");
}

const char *loom_error_last(void)
{
    return last_msg;
}

int loom_error_last_code(void)
{
    return last_code;
}

void loom_error_clear(void)
{
    last_code = 0;
    last_msg[0] = '\0';
}

const char *loom_error_name(int code)
{
    switch (code) {
    case LOOM_OK: return "OK";
    case LOOM_ENOMEM: return "ENOMEM";
    case LOOM_ENOTFOUND: return "ENOTFOUND";
    case LOOM_ETIMEDOUT: return "ETIMEDOUT";
    case LOOM_ECANCELED: return "ECANCELED";
    case LOOM_ETOOLARGE: return "ETOOLARGE";
    case LOOM_EUPSTREAM: return "EUPSTREAM";
    case LOOM_EPROTO: return "EPROTO";
    case LOOM_EINVALID: return "EINVALID";
    case LOOM_EEXISTS: return "EEXISTS";
    case LOOM_EIO: return "EIO";
    default: return "ERROR";
    }
}

const char *loom_version(void)
{
    return LOOM_VERSION;
}

int loom_id_new(char id[LOOM_ID_SIZE], const char *prefix)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[12];
    size_t got = 0, plen = strlen(prefix);

    if (plen + 2 * sizeof(raw) + 1 > LOOM_ID_SIZE)
        return loom__error_set(LOOM_EINVALID, "id prefix too long");
    while (got < sizeof(raw)) {
        ssize_t n = getrandom(raw + got, sizeof(raw) - got, 0);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return loom__error_set(LOOM_EIO, "getrandom: %s", strerror(errno));
        }
        got += (size_t)n;
    }
    memcpy(id, prefix, plen);
    for (size_t i = 0; i < sizeof(raw); i++) {
        id[plen + 2 * i] = hex[raw[i] >> 4];
        id[plen + 2 * i + 1] = hex[raw[i] & 15];
    }
    id[plen + 2 * sizeof(raw)] = '\0';
    return 0;
}
