/*
 * Per-thread error state. Each thread keeps its last code and message in
 * thread-local storage so concurrent runs and tool threads never see each
 * other's errors.
 */
#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>

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
