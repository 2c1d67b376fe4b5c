/*
 * Per-thread error state. Each thread keeps its last code and message in
 * thread-local storage so concurrent runs and tool threads never see each
 * other's errors; a fiber (core/fiber.h) brings its own state in while it
 * runs, so runs sharing a worker thread do not either.
 */
#include "core/error.h"

#include <errno.h>
#include <pthread.h>
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

/*
 * Random bytes for ids, drawn from the kernel a block at a time. Ids are
 * no secrets (every object is checked against its owner), so each thread
 * keeps a block and takes 6 bytes of it per id, instead of a getrandom()
 * call per id. A child made by fork() must never draw the bytes its
 * parent draws too: forks counts the forks this process came out of
 * (its pthread_atfork handler runs in the child, before any other thread
 * exists), and a block drawn before the newest one is thrown away. When
 * the handler cannot be registered, every id draws its own bytes.
 */
#define RANDOM_BLOCK 252

typedef struct {
    unsigned char bytes[RANDOM_BLOCK];
    size_t used;         /* bytes of it already taken */
    unsigned long forks; /* the process's fork count when drawn */
} random_block;

static _Thread_local random_block block = {.used = RANDOM_BLOCK};
static unsigned long forks;
static int buffered; /* the fork handler is registered */
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void after_fork_child(void)
{
    forks++;
}

static void fork_handler(void)
{
    buffered = pthread_atfork(NULL, NULL, after_fork_child) == 0;
}

/* Fills out with n bytes from the kernel; LOOM_EIO when it gives none. */
static int kernel_random(unsigned char *out, size_t n)
{
    size_t got = 0;

    while (got < n) {
        ssize_t r = getrandom(out + got, n - got, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return loom__error_set(LOOM_EIO, "getrandom: %s", strerror(errno));
        }
        got += (size_t)r;
    }
    return 0;
}

/* n (at most RANDOM_BLOCK) random bytes into out, from the thread's
 * block. */
static int id_random(unsigned char *out, size_t n)
{
    int rc;

    pthread_once(&fork_once, fork_handler);
    if (!buffered)
        return kernel_random(out, n);
    if (block.forks != forks || block.used + n > RANDOM_BLOCK) {
        if ((rc = kernel_random(block.bytes, RANDOM_BLOCK)) != 0)
            return rc;
        block.used = 0;
        block.forks = forks;
    }
    memcpy(out, block.bytes + block.used, n);
    block.used += n;
    return 0;
}

int loom_id_new(char id[LOOM_ID_SIZE], const char *prefix)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[12];
    size_t plen = strlen(prefix);
    int rc;

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
    if ((rc = id_random(raw + 6, sizeof(raw) - 6)) != 0)
        return rc;
    memcpy(id, prefix, plen);
    for (size_t i = 0; i < sizeof(raw); i++) {
        id[plen + 2 * i] = hex[raw[i] >> 4];
        id[plen + 2 * i + 1] = hex[raw[i] & 15];
    }
    id[plen + 2 * sizeof(raw)] = '\0';
    return 0;
}
