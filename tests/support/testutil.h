/*
 * Small helpers shared by loom's cmocka tests: files, paths to the wire
 * vectors, per-process temporary paths and waiting for a child process.
 * Failures print why to stderr and return NULL or -1; none of these
 * abort, so a test decides how to fail.
 */
#ifndef LOOM_TESTUTIL_H
#define LOOM_TESTUTIL_H

#include <stddef.h>
#include <sys/types.h>

/* Largest file test_read_file() reads. */
#define TEST_MAX_FILE (256u * 1024 * 1024)

/*
 * Reads a whole file (at most TEST_MAX_FILE bytes) into a NUL-terminated
 * buffer the caller frees; *len (when len is not NULL) gets its size.
 * NULL when the file cannot be read.
 */
char *test_read_file(const char *path, size_t *len);

/* Writes len bytes to path (created or truncated); 0 or -1. */
int test_write_file(const char *path, const void *data, size_t len);

/* Creates a folder and its parents (mode 0755); 0 when it exists after. */
int test_mkdir_p(const char *path);

/* LOOM_VECTORS_DIR "/" rel, a path into the recorded wire vectors
 * (tests/data/vectors); the caller frees. NULL only when memory runs
 * out. */
char *test_vector_path(const char *rel);

/*
 * The temporary folder for tests: $LOOM_TEST_TMP (CTest sets it to
 * <build>/testtmp) or /tmp, created if needed. The string is static.
 */
const char *test_tmp_dir(void);

/*
 * A path in test_tmp_dir() for name, unique to this process:
 * "<tmp>/loom-<pid>-<name>". The same name gives the same path within one
 * process. The file is neither created nor removed; the caller frees.
 */
char *test_tmp_path(const char *name);

/*
 * Waits up to timeout_ms (< 0: forever) for child pid to exit. Returns its
 * exit status (0..255), 128 + N when signal N ended it, or -1 when it is
 * still running at the deadline (or waitpid fails).
 */
int test_wait_pid(pid_t pid, long timeout_ms);

/* Milliseconds on a monotonic clock, for lower-bound time checks. */
long long test_now_ms(void);

#endif
