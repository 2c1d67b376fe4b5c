/*
 * Helpers shared by the cmocka tests (see testutil.h). Kept free of cmocka
 * so that any test or support file can use them.
 */
#include "testutil.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef LOOM_VECTORS_DIR
#define LOOM_VECTORS_DIR "tests/data/vectors"
#endif

char *test_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    struct stat st;

    if (!f) {
        fprintf(stderr, "test_read_file %s: %s\n", path, strerror(errno));
        return NULL;
    }
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode) ||
        (unsigned long long)st.st_size > TEST_MAX_FILE) {
        fprintf(stderr,
                "test_read_file %s: not a regular file under the "
                "size limit\n",
                path);
        goto done;
    }
    buf = malloc((size_t)st.st_size + 1);
    if (!buf)
        goto done;
    if (fread(buf, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
        fprintf(stderr, "test_read_file %s: short read\n", path);
        free(buf);
        buf = NULL;
        goto done;
    }
    buf[st.st_size] = '\0';
    if (len)
        *len = (size_t)st.st_size;
done:
    fclose(f);
    return buf;
}

int test_write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    int rc = 0;

    if (!f) {
        fprintf(stderr, "test_write_file %s: %s\n", path, strerror(errno));
        return -1;
    }
    if (len && fwrite(data, 1, len, f) != len)
        rc = -1;
    if (fclose(f) != 0)
        rc = -1;
    if (rc)
        fprintf(stderr, "test_write_file %s: write failed\n", path);
    return rc;
}

int test_mkdir_p(const char *path)
{
    char *p = strdup(path), *s;
    int rc = 0;

    if (!p)
        return -1;
    for (s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST)
            rc = -1;
        *s = '/';
    }
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        rc = -1;
    free(p);
    if (rc)
        fprintf(stderr, "test_mkdir_p %s: %s\n", path, strerror(errno));
    return rc;
}

static char *join2(const char *a, const char *b)
{
    size_t n = strlen(a) + strlen(b) + 2;
    char *out = malloc(n);

    if (out)
        snprintf(out, n, "%s/%s", a, b);
    return out;
}

char *test_vector_path(const char *rel)
{
    return join2(LOOM_VECTORS_DIR, rel);
}

const char *test_tmp_dir(void)
{
    const char *dir = getenv("LOOM_TEST_TMP");

    if (!dir || !*dir)
        dir = "/tmp";
    test_mkdir_p(dir);
    return dir;
}

char *test_tmp_path(const char *name)
{
    const char *dir = test_tmp_dir();
    size_t n = strlen(dir) + strlen(name) + 40;
    char *out = malloc(n);

    if (out)
        snprintf(out, n, "%s/loom-%ld-%s", dir, (long)getpid(), name);
    return out;
}

long long test_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int test_wait_pid(pid_t pid, long timeout_ms)
{
    long long end = test_now_ms() + (timeout_ms < 0 ? 0 : timeout_ms);
    int st;

    for (;;) {
        pid_t r = waitpid(pid, &st, timeout_ms < 0 ? 0 : WNOHANG);

        if (r == pid)
            break;
        if (r < 0 && errno != EINTR)
            return -1;
        if (r == 0) {
            struct timespec ts = {0, 10 * 1000000L};

            if (test_now_ms() >= end)
                return -1;
            nanosleep(&ts, NULL);
        }
    }
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    return WIFSIGNALED(st) ? 128 + WTERMSIG(st) : -1;
}
