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
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#ifndef LOOM_VERSION
#define LOOM_VERSION "0.0.0"
#endif

static _Thread_local loom__error_state own;
static _Thread_local loom__error_state **cur;

/* What a slot holds when its state could not be allocated: the error
 * then recorded was lost, and reads as running out of memory. Never
 * written. */
static loom__error_state nomem = {LOOM_ENOMEM, "out of memory"};

/* The state to read: the slot's (NULL: none yet, no error), or the
 * thread's own. */
static const loom__error_state *state_read(void)
{
    return cur ? *cur : &own;
}

/* The state to write: the slot's, allocated at its first error; NULL
 * when it cannot be (the slot then reads as out of memory). */
static loom__error_state *state_write(void)
{
    loom__error_state *es;

    if (!cur)
        return &own;
    es = *cur;
    if (!es || es == &nomem) {
        es = calloc(1, sizeof(*es));
        *cur = es ? es : &nomem;
    }
    return es;
}

loom__error_state **loom__error_use(loom__error_state **slot)
{
    loom__error_state **was = cur;

    cur = slot;
    return was;
}

void loom__error_release(loom__error_state **slot)
{
    if (*slot != &nomem)
        free(*slot);
    *slot = NULL;
}

int loom__error_set(int code, const char *fmt, ...)
{
    loom__error_state *es = state_write();
    va_list ap;

    if (!es)
        return code;
    va_start(ap, fmt);
    vsnprintf(es->msg, sizeof(es->msg), fmt, ap);
    va_end(ap);
    es->code = code;
    return code;
}

int loom__error_oom(void)
{
    return loom__error_set(LOOM_ENOMEM, "out of memory");
}

const char *loom_error_last(void)
{
    const loom__error_state *es = state_read();

    return es ? es->msg : "";
}

int loom_error_last_code(void)
{
    const loom__error_state *es = state_read();

    return es ? es->code : 0;
}

void loom_error_clear(void)
{
    loom__error_state *es = cur ? *cur : &own;

    if (es == &nomem) {
        *cur = NULL;
    } else if (es) {
        es->code = 0;
        es->msg[0] = '\0';
    }
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
