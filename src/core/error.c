/*
 * Per-thread error state. Each thread keeps its last code and message in
 * thread-local storage so concurrent runs and tool threads never see each
 * other's errors; a fiber (core/fiber.h) brings its own state in while it
 * runs, so runs sharing a worker thread do not either.
 */
#include "core/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#ifndef LOOM_VERSION
#define LOOM_VERSION "0.0.0"
#endif

static _Thread_local loom__error_state own;
static _Thread_local loom__error_state *cur;

/* The state in use: a fiber's, or the thread's own. */
static loom__error_state *state(void)
{
    return cur ? cur : &own;
}

loom__error_state *loom__error_use(loom__error_state *es)
{
    loom__error_state *was = cur;

    cur = es;
    return was;
}

int loom__error_set(int code, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(state()->msg, sizeof(state()->msg), fmt, ap);
    va_end(ap);
    state()->code = code;
    return code;
}

int loom__error_oom(void)
{
    return loom__error_set(LOOM_ENOMEM, "out of memory");
}

const char *loom_error_last(void)
{
    return state()->msg;
}

int loom_error_last_code(void)
{
    return state()->code;
}

void loom_error_clear(void)
{
    state()->code = 0;
    state()->msg[0] = '\0';
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
    struct timespec now;
    uint64_t ms;

    /* The first 6 bytes: milliseconds since the epoch, big-endian, so
     * that ids made later sort later: a new row's key lands at the end
     * of its B-tree, beside the previous one, instead of on a random
     * page (fewer pages written per commit). The other 6 are random. */
    clock_gettime(CLOCK_REALTIME, &now);
    ms = (uint64_t)now.tv_sec * 1000u + (uint64_t)now.tv_nsec / 1000000u;
    for (int i = 5; i >= 0; i--, ms >>= 8)
        raw[i] = (unsigned char)(ms & 0xff);
    got = 6;
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
