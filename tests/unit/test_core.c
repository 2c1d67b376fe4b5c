/*
 * Unit tests of the small core modules every other layer stands on:
 * limited buffers (core/buf.c), the per-thread error state (core/error.c),
 * logging (core/log.c, written to an open_memstream FILE and read back),
 * the owned message structures (core/message.c) and the response and
 * error names of the model interface (llm/provider.c). Limits are crossed
 * by a byte; copies are checked to be deep by changing or freeing the
 * source and reading the copy under ASan.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/error.h"
#include "core/utf8.h"
#include "loom/buf.h"
#include "loom/llm.h"
#include "loom/log.h"

#include <jansson.h>
#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- buf -------------------------------------------------------------- */

/* A snapshot of a buffer, to check that a failed write changed nothing. */
typedef struct {
    char *ptr;
    size_t len, cap, max;
    char content[64];
} buf_snap;

static void snap(buf_snap *s, const loom_buf *b)
{
    s->ptr = b->ptr;
    s->len = b->len;
    s->cap = b->cap;
    s->max = b->max;
    assert_true(b->len < sizeof(s->content));
    memcpy(s->content, loom_buf_cstr(b), b->len + 1);
}

static void assert_unchanged(const buf_snap *s, const loom_buf *b)
{
    assert_ptr_equal(b->ptr, s->ptr);
    assert_int_equal(b->len, s->len);
    assert_int_equal(b->cap, s->cap);
    assert_int_equal(b->max, s->max);
    assert_memory_equal(loom_buf_cstr(b), s->content, s->len + 1);
}

static void test_buf_put_to_the_limit(void **state)
{
    loom_buf b = LOOM_BUF_INIT(8);
    buf_snap s;

    (void)state;
    assert_int_equal(loom_buf_put(&b, "abcde", 5), 0);
    assert_int_equal(loom_buf_put(&b, "fgh", 3), 0); /* exactly 8 */
    assert_int_equal(b.len, 8);
    assert_string_equal(loom_buf_cstr(&b), "abcdefgh");
    /* A limited buffer never holds much more than its limit. */
    assert_true(b.cap <= b.max + 1);

    snap(&s, &b);
    loom_error_clear();
    assert_int_equal(loom_buf_put(&b, "i", 1), LOOM_ETOOLARGE);
    assert_int_equal(loom_error_last_code(), LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "8"));
    assert_unchanged(&s, &b);
    assert_int_equal(loom_buf_puts(&b, "x"), LOOM_ETOOLARGE);
    assert_unchanged(&s, &b);
    assert_int_equal(loom_buf_putc(&b, 'x'), LOOM_ETOOLARGE);
    assert_unchanged(&s, &b);
    assert_int_equal(loom_buf_printf(&b, "%d", 7), LOOM_ETOOLARGE);
    assert_unchanged(&s, &b);
    /* Nothing more always fits. */
    assert_int_equal(loom_buf_put(&b, "", 0), 0);
    assert_int_equal(loom_buf_puts(&b, ""), 0);
    assert_unchanged(&s, &b);
    loom_buf_free(&b);
    assert_null(b.ptr);
    assert_int_equal(b.len, 0);
}

static void test_buf_put_past_the_limit_when_partly_full(void **state)
{
    loom_buf b;
    buf_snap s;

    (void)state;
    loom_buf_init(&b, 10);
    assert_int_equal(loom_buf_puts(&b, "0123456"), 0);
    snap(&s, &b);
    /* 7 + 4 = 11: one byte too many, and nothing of it is kept. */
    assert_int_equal(loom_buf_put(&b, "789A", 4), LOOM_ETOOLARGE);
    assert_unchanged(&s, &b);
    assert_int_equal(loom_buf_printf(&b, "%s", "789A"), LOOM_ETOOLARGE);
    assert_unchanged(&s, &b);
    /* A huge length must not wrap around the limit check. */
    assert_int_equal(loom_buf_put(&b, "x", (size_t)-1), LOOM_ETOOLARGE);
    assert_unchanged(&s, &b);
    assert_int_equal(loom_buf_printf(&b, "%s", "789"), 0);
    assert_string_equal(loom_buf_cstr(&b), "0123456789");
    loom_buf_free(&b);
}

static void test_buf_zero_limit(void **state)
{
    loom_buf b = LOOM_BUF_INIT(0);

    (void)state;
    assert_int_equal(loom_buf_putc(&b, 'a'), LOOM_ETOOLARGE);
    assert_null(b.ptr);
    assert_int_equal(b.len, 0);
    assert_string_equal(loom_buf_cstr(&b), "");
    loom_buf_free(&b);
}

static void test_buf_printf_grows(void **state)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    char expect[32];

    (void)state;
    for (int i = 0; i < 1000; i++)
        assert_int_equal(loom_buf_printf(&b, "%04d,", i), 0);
    assert_int_equal(b.len, 5000);
    assert_int_equal(strlen(loom_buf_cstr(&b)), 5000);
    assert_memory_equal(b.ptr, "0000,0001,", 10);
    snprintf(expect, sizeof(expect), "%04d,", 999);
    assert_string_equal(b.ptr + 4995, expect);
    assert_true(b.cap > b.len);
    loom_buf_free(&b);
}

static void test_buf_byte_at_a_time_to_limit(void **state)
{
    loom_buf b = LOOM_BUF_INIT(100);

    (void)state;
    for (int i = 0; i < 100; i++)
        assert_int_equal(loom_buf_putc(&b, (char)('a' + i % 26)), 0);
    assert_int_equal(b.len, 100);
    assert_true(b.cap <= 101);
    assert_int_equal(loom_buf_putc(&b, 'z'), LOOM_ETOOLARGE);
    assert_int_equal(b.len, 100);
    assert_int_equal(b.ptr[100], '\0');
    loom_buf_free(&b);
}

static void test_buf_binary_content(void **state)
{
    loom_buf b = LOOM_BUF_INIT(16);

    (void)state;
    assert_int_equal(loom_buf_put(&b, "a\0b", 3), 0);
    assert_int_equal(b.len, 3);
    assert_memory_equal(b.ptr, "a\0b\0", 4);
    loom_buf_free(&b);
}

static void test_buf_consume(void **state)
{
    loom_buf b = LOOM_BUF_INIT(64);

    (void)state;
    loom_buf_consume(&b, 0); /* empty, never written */
    loom_buf_consume(&b, 5);
    assert_null(b.ptr);
    assert_string_equal(loom_buf_cstr(&b), "");

    assert_int_equal(loom_buf_puts(&b, "hello world"), 0);
    loom_buf_consume(&b, 0);
    assert_string_equal(loom_buf_cstr(&b), "hello world");
    loom_buf_consume(&b, 6);
    assert_int_equal(b.len, 5);
    assert_string_equal(loom_buf_cstr(&b), "world");
    loom_buf_consume(&b, 5); /* exactly all */
    assert_int_equal(b.len, 0);
    assert_string_equal(loom_buf_cstr(&b), "");
    assert_int_equal(loom_buf_puts(&b, "abc"), 0);
    loom_buf_consume(&b, 100); /* more than all */
    assert_int_equal(b.len, 0);
    assert_string_equal(loom_buf_cstr(&b), "");
    /* Room freed by consume can be used again up to the limit. */
    for (int i = 0; i < 64; i++)
        assert_int_equal(loom_buf_putc(&b, 'x'), 0);
    assert_int_equal(loom_buf_putc(&b, 'x'), LOOM_ETOOLARGE);
    loom_buf_consume(&b, 1);
    assert_int_equal(loom_buf_putc(&b, 'y'), 0);
    assert_int_equal(b.ptr[63], 'y');
    loom_buf_free(&b);
}

static void test_buf_clear_keeps_memory(void **state)
{
    loom_buf b = LOOM_BUF_INIT(64);
    char *p;
    size_t cap;

    (void)state;
    loom_buf_clear(&b); /* never written */
    assert_null(b.ptr);
    assert_string_equal(loom_buf_cstr(&b), "");

    assert_int_equal(loom_buf_puts(&b, "something"), 0);
    p = b.ptr;
    cap = b.cap;
    loom_buf_clear(&b);
    assert_ptr_equal(b.ptr, p);
    assert_int_equal(b.cap, cap);
    assert_int_equal(b.len, 0);
    assert_string_equal(loom_buf_cstr(&b), "");
    assert_int_equal(loom_buf_puts(&b, "new"), 0);
    assert_string_equal(loom_buf_cstr(&b), "new");
    loom_buf_free(&b);
}

static void test_buf_detach(void **state)
{
    loom_buf b = LOOM_BUF_INIT(64);
    char *s;

    (void)state;
    /* Empty: a fresh "" the caller frees. */
    s = loom_buf_detach(&b);
    assert_non_null(s);
    assert_string_equal(s, "");
    free(s);
    assert_null(b.ptr);

    assert_int_equal(loom_buf_puts(&b, "owned"), 0);
    s = loom_buf_detach(&b);
    assert_string_equal(s, "owned");
    assert_null(b.ptr);
    assert_int_equal(b.len, 0);
    assert_int_equal(b.cap, 0);
    assert_int_equal(b.max, 64);
    assert_string_equal(loom_buf_cstr(&b), "");
    /* The buffer is usable again, and independent of the detached text. */
    assert_int_equal(loom_buf_puts(&b, "again"), 0);
    assert_string_equal(s, "owned");
    free(s);

    /* Cleared but allocated: detach gives "" too. */
    loom_buf_clear(&b);
    s = loom_buf_detach(&b);
    assert_string_equal(s, "");
    free(s);
    loom_buf_free(&b);
}

static void test_buf_free_and_reuse(void **state)
{
    loom_buf b;

    (void)state;
    loom_buf_init(&b, 4);
    loom_buf_free(&b); /* never written */
    assert_int_equal(loom_buf_puts(&b, "abcd"), 0);
    loom_buf_free(&b);
    assert_null(b.ptr);
    loom_buf_init(&b, 2);
    assert_int_equal(loom_buf_puts(&b, "abc"), LOOM_ETOOLARGE);
    assert_int_equal(loom_buf_puts(&b, "ab"), 0);
    assert_string_equal(loom_buf_cstr(&b), "ab");
    loom_buf_free(&b);
}

static int vprintf_helper(loom_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int vprintf_helper(loom_buf *b, const char *fmt, ...)
{
    va_list ap;
    int rc;

    va_start(ap, fmt);
    rc = loom_buf_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

static void test_buf_vprintf(void **state)
{
    loom_buf b = LOOM_BUF_INIT(6);

    (void)state;
    assert_int_equal(vprintf_helper(&b, "%s=%d", "a", 42), 0);
    assert_string_equal(loom_buf_cstr(&b), "a=42");
    assert_int_equal(vprintf_helper(&b, "%s", "xyz"), LOOM_ETOOLARGE);
    assert_string_equal(loom_buf_cstr(&b), "a=42");
    assert_int_equal(vprintf_helper(&b, "%c%c", '!', '?'), 0);
    assert_string_equal(loom_buf_cstr(&b), "a=42!?");
    loom_buf_free(&b);
}

/* ---- error ------------------------------------------------------------ */

static void test_error_set_and_clear(void **state)
{
    (void)state;
    loom_error_clear();
    assert_int_equal(loom_error_last_code(), 0);
    assert_string_equal(loom_error_last(), "");

    assert_int_equal(loom__error_set(LOOM_ENOTFOUND, "no %s named '%s'",
                                     "agent", "x"),
                     LOOM_ENOTFOUND);
    assert_int_equal(loom_error_last_code(), LOOM_ENOTFOUND);
    assert_string_equal(loom_error_last(), "no agent named 'x'");

    /* The last error wins. */
    assert_int_equal(loom__error_oom(), LOOM_ENOMEM);
    assert_int_equal(loom_error_last_code(), LOOM_ENOMEM);
    assert_string_equal(loom_error_last(), "out of memory");

    loom_error_clear();
    assert_int_equal(loom_error_last_code(), 0);
    assert_string_equal(loom_error_last(), "");
}

static void test_error_long_message_is_cut(void **state)
{
    char *big = malloc(5001);
    size_t n;

    (void)state;
    assert_non_null(big);
    memset(big, 'm', 5000);
    big[5000] = '\0';
    assert_int_equal(loom__error_set(LOOM_ERROR, "%s", big), LOOM_ERROR);
    n = strlen(loom_error_last());
    assert_true(n > 0 && n < 5000);
    assert_memory_equal(loom_error_last(), big, n);
    free(big);
    loom_error_clear();
}

static void test_error_names(void **state)
{
    static const struct {
        int code;
        const char *name;
    } names[] = {
        {LOOM_OK, "OK"},           {LOOM_ERROR, "ERROR"},
        {LOOM_ENOMEM, "ENOMEM"},   {LOOM_ENOTFOUND, "ENOTFOUND"},
        {LOOM_ETIMEDOUT, "ETIMEDOUT"}, {LOOM_ECANCELED, "ECANCELED"},
        {LOOM_ETOOLARGE, "ETOOLARGE"}, {LOOM_EUPSTREAM, "EUPSTREAM"},
        {LOOM_EPROTO, "EPROTO"},   {LOOM_EINVALID, "EINVALID"},
        {LOOM_EEXISTS, "EEXISTS"}, {LOOM_EIO, "EIO"},
    };

    (void)state;
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        assert_string_equal(loom_error_name(names[i].code), names[i].name);
    /* Unknown codes still get a name. */
    assert_non_null(loom_error_name(-1000));
    assert_non_null(loom_error_name(7));
}

/* Ids: the prefix, 24 lowercase hex digits, never twice the same, and
 * one made in a later millisecond sorts after an earlier one (new rows
 * land at the end of the store's indexes). */
static void test_id_new(void **state)
{
    char a[LOOM_ID_SIZE], b[LOOM_ID_SIZE];
    long n = 0;

    (void)state;
    assert_int_equal(loom_id_new(a, "conv_"), 0);
    assert_int_equal(strlen(a), 5 + 24);
    assert_int_equal(strncmp(a, "conv_", 5), 0);
    assert_int_equal(strspn(a + 5, "0123456789abcdef"), 24);
    /* Until the clock's millisecond moves on (the first 12 digits);
     * within one, ids differ in their random part. */
    do {
        assert_int_equal(loom_id_new(b, "conv_"), 0);
        assert_string_not_equal(a, b);
    } while (strncmp(a, b, 5 + 12) == 0 && ++n < 100000000L);
    assert_true(strcmp(b, a) > 0);
    assert_int_equal(loom_id_new(a, "a_prefix_far_too_long_"), LOOM_EINVALID);
}

/* A child made by fork() never makes the ids its parent makes, though
 * both hold the same block of random bytes when it forks. */
static void test_id_fork(void **state)
{
    char a[LOOM_ID_SIZE], b[LOOM_ID_SIZE], child[LOOM_ID_SIZE] = "";
    int fds[2], status = 0;
    pid_t pid;

    (void)state;
    assert_int_equal(loom_id_new(a, "run_"), 0);
    assert_int_equal(pipe(fds), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        ssize_t n = -1;
        close(fds[0]);
        if (loom_id_new(b, "run_") == 0)
            n = write(fds[1], b, strlen(b) + 1);
        _exit(n > 0 ? 0 : 1);
    }
    close(fds[1]);
    assert_true(read(fds[0], child, sizeof(child)) > 0);
    close(fds[0]);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_int_equal(status, 0);
    assert_int_equal(loom_id_new(b, "run_"), 0);
    /* The random parts (after the prefix and the 12 digits of time). */
    assert_string_not_equal(child + 4 + 12, b + 4 + 12);
    assert_string_not_equal(child + 4 + 12, a + 4 + 12);
}

static void test_version(void **state)
{
    unsigned major, minor, patch;
    char rest;

    (void)state;
    assert_non_null(loom_version());
    assert_int_equal(sscanf(loom_version(), "%u.%u.%u%c", &major, &minor,
                            &patch, &rest),
                     3);
}

typedef struct {
    int code_seen_first; /* what the thread saw before raising its own */
    char msg_seen_first[64];
    int code_after;
    char msg_after[64];
} thread_report;

static void *error_thread(void *arg)
{
    thread_report *r = arg;

    r->code_seen_first = loom_error_last_code();
    snprintf(r->msg_seen_first, sizeof(r->msg_seen_first), "%s",
             loom_error_last());
    loom__error_set(LOOM_ETIMEDOUT, "thread error");
    r->code_after = loom_error_last_code();
    snprintf(r->msg_after, sizeof(r->msg_after), "%s", loom_error_last());
    return NULL;
}

static void test_error_is_per_thread(void **state)
{
    thread_report r;
    pthread_t t;

    (void)state;
    memset(&r, 0, sizeof(r));
    loom__error_set(LOOM_EINVALID, "main error");
    assert_int_equal(pthread_create(&t, NULL, error_thread, &r), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    /* The thread started clean and did not see ours ... */
    assert_int_equal(r.code_seen_first, 0);
    assert_string_equal(r.msg_seen_first, "");
    assert_int_equal(r.code_after, LOOM_ETIMEDOUT);
    assert_string_equal(r.msg_after, "thread error");
    /* ... and we do not see the thread's. */
    assert_int_equal(loom_error_last_code(), LOOM_EINVALID);
    assert_string_equal(loom_error_last(), "main error");
    loom_error_clear();
}

/* ---- log -------------------------------------------------------------- */

typedef struct {
    FILE *f;
    char *data;
    size_t len;
} memlog;

static void memlog_open(memlog *m)
{
    memset(m, 0, sizeof(*m));
    m->f = open_memstream(&m->data, &m->len);
    assert_non_null(m->f);
}

/* The text written so far (valid until the next write). */
static const char *memlog_text(memlog *m)
{
    assert_int_equal(fflush(m->f), 0);
    return m->data ? m->data : "";
}

static void memlog_close(memlog *m)
{
    fclose(m->f);
    free(m->data);
    memset(m, 0, sizeof(*m));
}

static size_t count_lines(const char *s)
{
    size_t n = 0;

    for (; *s; s++)
        if (*s == '\n')
            n++;
    return n;
}

static int log_teardown(void **state)
{
    (void)state;
    loom_log_set(NULL, LOOM_LOG_OFF, LOOM_LOG_TEXT);
    return 0;
}

/* Runs first of the log tests: nothing has called loom_log_set yet. */
static void test_log_off_by_default(void **state)
{
    (void)state;
    for (int l = LOOM_LOG_DEBUG; l <= LOOM_LOG_OFF; l++)
        assert_false(loom_log_enabled((loom_log_level)l));
    loom_log(LOOM_LOG_ERROR, "goes nowhere %d", 1);
}

static void test_log_off_writes_nothing(void **state)
{
    memlog m;

    (void)state;
    memlog_open(&m);
    loom_log_set(m.f, LOOM_LOG_OFF, LOOM_LOG_TEXT);
    for (int l = LOOM_LOG_DEBUG; l < LOOM_LOG_OFF; l++) {
        assert_false(loom_log_enabled((loom_log_level)l));
        loom_log((loom_log_level)l, "hidden");
    }
    assert_string_equal(memlog_text(&m), "");

    /* A NULL stream is off whatever the level. */
    loom_log_set(NULL, LOOM_LOG_DEBUG, LOOM_LOG_TEXT);
    assert_false(loom_log_enabled(LOOM_LOG_ERROR));
    loom_log(LOOM_LOG_ERROR, "hidden");
    assert_string_equal(memlog_text(&m), "");
    memlog_close(&m);
}

static void test_log_level_filter(void **state)
{
    memlog m;
    const char *t;

    (void)state;
    memlog_open(&m);
    loom_log_set(m.f, LOOM_LOG_WARN, LOOM_LOG_TEXT);
    assert_false(loom_log_enabled(LOOM_LOG_DEBUG));
    assert_false(loom_log_enabled(LOOM_LOG_INFO));
    assert_true(loom_log_enabled(LOOM_LOG_WARN));
    assert_true(loom_log_enabled(LOOM_LOG_ERROR));
    assert_false(loom_log_enabled(LOOM_LOG_OFF));
    loom_debug("d-record");
    loom_info("i-record");
    loom_warn("w-record");
    loom_log(LOOM_LOG_ERROR, "e-record");
    t = memlog_text(&m);
    assert_int_equal(count_lines(t), 2);
    assert_null(strstr(t, "d-record"));
    assert_null(strstr(t, "i-record"));
    assert_non_null(strstr(t, "w-record"));
    assert_non_null(strstr(t, "e-record"));
    assert_true(strstr(t, "w-record") < strstr(t, "e-record"));

    loom_log_set(m.f, LOOM_LOG_DEBUG, LOOM_LOG_TEXT);
    assert_true(loom_log_enabled(LOOM_LOG_DEBUG));
    loom_debug("d2-record");
    t = memlog_text(&m);
    assert_int_equal(count_lines(t), 3);
    assert_non_null(strstr(t, "d2-record"));
    memlog_close(&m);
}

static void test_log_text_format(void **state)
{
    static const char *const levels[] = {"debug", "info", "warn", "error"};
    memlog m;
    regex_t re;
    const char *t;
    char *copy, *line, *save = NULL;
    int i = 0;

    (void)state;
    assert_int_equal(
        regcomp(&re,
                "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}"
                "\\.[0-9]{3}Z (debug|info |warn |error) msg [0-9]+ x$",
                REG_EXTENDED | REG_NOSUB),
        0);
    memlog_open(&m);
    loom_log_set(m.f, LOOM_LOG_DEBUG, LOOM_LOG_TEXT);
    for (int l = LOOM_LOG_DEBUG; l < LOOM_LOG_OFF; l++)
        loom_log((loom_log_level)l, "msg %d %s", l, "x");
    t = memlog_text(&m);
    assert_int_equal(count_lines(t), 4);
    assert_int_equal(t[strlen(t) - 1], '\n');
    copy = strdup(t);
    assert_non_null(copy);
    for (line = strtok_r(copy, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save), i++) {
        if (regexec(&re, line, 0, NULL, 0) != 0)
            fail_msg("bad log line: '%s'", line);
        assert_non_null(strstr(line, levels[i]));
    }
    assert_int_equal(i, 4);
    free(copy);
    regfree(&re);
    memlog_close(&m);
}

static void test_log_json_format(void **state)
{
    static const char *const levels[] = {"debug", "info", "warn", "error"};
    memlog m;
    regex_t re;
    const char *t;
    char *copy, *line, *save = NULL;
    int i = 0;

    (void)state;
    assert_int_equal(regcomp(&re,
                             "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:"
                             "[0-9]{2}\\.[0-9]{3}Z$",
                             REG_EXTENDED | REG_NOSUB),
                     0);
    memlog_open(&m);
    loom_log_set(m.f, LOOM_LOG_DEBUG, LOOM_LOG_JSON);
    /* Quotes, backslashes and a newline must stay inside one JSON line. */
    for (int l = LOOM_LOG_DEBUG; l < LOOM_LOG_OFF; l++)
        loom_log((loom_log_level)l, "say \"%d\"\\\nnext", l);
    t = memlog_text(&m);
    assert_int_equal(count_lines(t), 4);
    copy = strdup(t);
    assert_non_null(copy);
    for (line = strtok_r(copy, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save), i++) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        char expect[64];

        if (!o)
            fail_msg("not JSON (%s): '%s'", je.text, line);
        assert_true(json_is_object(o));
        assert_int_equal(json_object_size(o), 3);
        assert_string_equal(json_string_value(json_object_get(o, "level")),
                            levels[i]);
        snprintf(expect, sizeof(expect), "say \"%d\"\\\nnext", i);
        assert_string_equal(json_string_value(json_object_get(o, "msg")),
                            expect);
        assert_non_null(json_string_value(json_object_get(o, "ts")));
        assert_int_equal(
            regexec(&re, json_string_value(json_object_get(o, "ts")), 0,
                    NULL, 0),
            0);
        json_decref(o);
    }
    assert_int_equal(i, 4);
    free(copy);
    regfree(&re);
    memlog_close(&m);
}

static void test_log_long_message(void **state)
{
    char *big = malloc(10001);
    memlog m;
    const char *t, *msg;
    json_t *o;

    (void)state;
    assert_non_null(big);
    memset(big, 'q', 10000);
    big[10000] = '\0';
    memlog_open(&m);
    loom_log_set(m.f, LOOM_LOG_INFO, LOOM_LOG_JSON);
    loom_info("%s", big);
    t = memlog_text(&m);
    /* Still exactly one well-formed record, with a prefix of the text. */
    assert_int_equal(count_lines(t), 1);
    o = json_loads(t, JSON_DISABLE_EOF_CHECK, NULL);
    assert_non_null(o);
    msg = json_string_value(json_object_get(o, "msg"));
    assert_non_null(msg);
    assert_true(strlen(msg) > 0 && strlen(msg) <= 10000);
    assert_memory_equal(msg, big, strlen(msg));
    json_decref(o);
    memlog_close(&m);
    free(big);
}

#define LOG_THREADS 4
#define LOG_LINES 200

static void *log_thread(void *arg)
{
    int id = (int)(intptr_t)arg;

    for (int i = 0; i < LOG_LINES; i++)
        loom_info("thread %d line %d %s", id, i,
                  "padding-padding-padding-padding-padding-padding");
    return NULL;
}

/* Records from concurrent threads never interleave inside a line. */
static void test_log_threads_whole_lines(void **state)
{
    pthread_t t[LOG_THREADS];
    memlog m;
    char *copy, *line, *save = NULL;
    int n = 0;

    (void)state;
    memlog_open(&m);
    loom_log_set(m.f, LOOM_LOG_INFO, LOOM_LOG_JSON);
    for (int i = 0; i < LOG_THREADS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, log_thread,
                                        (void *)(intptr_t)i),
                         0);
    for (int i = 0; i < LOG_THREADS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    copy = strdup(memlog_text(&m));
    assert_non_null(copy);
    for (line = strtok_r(copy, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save), n++) {
        json_t *o = json_loads(line, 0, NULL);
        if (!o)
            fail_msg("torn line: '%s'", line);
        json_decref(o);
    }
    assert_int_equal(n, LOG_THREADS * LOG_LINES);
    free(copy);
    memlog_close(&m);
}

static void test_log_level_parse(void **state)
{
    (void)state;
    assert_int_equal(loom_log_level_parse("debug"), LOOM_LOG_DEBUG);
    assert_int_equal(loom_log_level_parse("info"), LOOM_LOG_INFO);
    assert_int_equal(loom_log_level_parse("warn"), LOOM_LOG_WARN);
    assert_int_equal(loom_log_level_parse("error"), LOOM_LOG_ERROR);
    assert_int_equal(loom_log_level_parse("off"), LOOM_LOG_OFF);
    assert_int_equal(loom_log_level_parse("verbose"), -1);
    assert_int_equal(loom_log_level_parse(""), -1);
    assert_int_equal(loom_log_level_parse("infox"), -1);
    assert_int_equal(loom_log_level_parse("inf"), -1);
}

/* ---- messages --------------------------------------------------------- */

static void test_messages_add_copies(void **state)
{
    loom_messages m = {0};
    char text[] = "hello";

    (void)state;
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_SYSTEM, "be brief"), 0);
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_USER, text), 0);
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_ASSISTANT, NULL), 0);
    text[0] = 'J'; /* the message keeps its own copy */
    assert_int_equal(m.len, 3);
    assert_int_equal(m.items[0].role, LOOM_ROLE_SYSTEM);
    assert_string_equal(m.items[0].content, "be brief");
    assert_int_equal(m.items[1].role, LOOM_ROLE_USER);
    assert_string_equal(m.items[1].content, "hello");
    assert_ptr_not_equal(m.items[1].content, text);
    assert_null(m.items[2].content);
    assert_null(m.items[1].reasoning);
    assert_null(m.items[1].tool_calls);
    assert_int_equal(m.items[1].tool_calls_len, 0);
    assert_null(m.items[1].tool_call_id);
    assert_null(m.items[1].name);
    loom_messages_free(&m);
    assert_null(m.items);
    assert_int_equal(m.len, 0);
    assert_int_equal(m.cap, 0);
    loom_messages_free(&m); /* twice is fine */
}

static void test_messages_add_tool_result(void **state)
{
    loom_messages m = {0};
    char id[] = "call_1", name[] = "get_time", content[] = "12:00";

    (void)state;
    assert_int_equal(loom_messages_add_tool_result(&m, id, name, content), 0);
    memset(id, 'x', sizeof(id) - 1);
    memset(name, 'x', sizeof(name) - 1);
    memset(content, 'x', sizeof(content) - 1);
    assert_int_equal(m.len, 1);
    assert_int_equal(m.items[0].role, LOOM_ROLE_TOOL);
    assert_string_equal(m.items[0].tool_call_id, "call_1");
    assert_string_equal(m.items[0].name, "get_time");
    assert_string_equal(m.items[0].content, "12:00");
    loom_messages_free(&m);
}

static void test_messages_add_assistant(void **state)
{
    loom_messages m = {0};
    loom_tool_call calls[2];
    const loom_message *a;

    (void)state;
    calls[0].id = strdup("call_a");
    calls[0].name = strdup("get_time");
    calls[0].arguments = strdup("{\"tz\":\"UTC\"}");
    calls[1].id = strdup("call_b");
    calls[1].name = strdup("echo");
    calls[1].arguments = strdup("{}");
    assert_int_equal(loom_messages_add_assistant(&m, "text", "thinking",
                                                 calls, 2),
                     0);
    /* The caller's calls are still its own: free them now. */
    loom_tool_call_clear(&calls[0]);
    loom_tool_call_clear(&calls[1]);
    assert_null(calls[0].id);

    a = &m.items[0];
    assert_int_equal(a->role, LOOM_ROLE_ASSISTANT);
    assert_string_equal(a->content, "text");
    assert_string_equal(a->reasoning, "thinking");
    assert_int_equal(a->tool_calls_len, 2);
    assert_string_equal(a->tool_calls[0].id, "call_a");
    assert_string_equal(a->tool_calls[0].name, "get_time");
    assert_string_equal(a->tool_calls[0].arguments, "{\"tz\":\"UTC\"}");
    assert_string_equal(a->tool_calls[1].id, "call_b");
    assert_string_equal(a->tool_calls[1].name, "echo");
    assert_string_equal(a->tool_calls[1].arguments, "{}");

    /* Only tool calls, no text. */
    assert_int_equal(loom_messages_add_assistant(&m, NULL, NULL, NULL, 0), 0);
    assert_null(m.items[1].content);
    assert_null(m.items[1].reasoning);
    assert_null(m.items[1].tool_calls);
    assert_int_equal(m.items[1].tool_calls_len, 0);

    loom_message_clear(&m.items[1]);
    assert_null(m.items[1].content);
    assert_int_equal(m.items[1].tool_calls_len, 0);
    loom_messages_free(&m);
}

static void test_messages_append_deep(void **state)
{
    loom_messages src = {0}, dst = {0};
    loom_tool_call call = {"c1", "f", "{\"a\":1}"};
    char buf[32];

    (void)state;
    /* Past the first allocation, so the list has to grow. */
    for (int i = 0; i < 20; i++) {
        snprintf(buf, sizeof(buf), "m%d", i);
        assert_int_equal(loom_messages_add(&src, LOOM_ROLE_USER, buf), 0);
    }
    assert_int_equal(loom_messages_add_assistant(&src, "a", "r", &call, 1),
                     0);
    assert_int_equal(loom_messages_add_tool_result(&src, "c1", "f", "ok"), 0);
    assert_int_equal(loom_messages_add(&dst, LOOM_ROLE_SYSTEM, "first"), 0);

    assert_int_equal(loom_messages_append(&dst, &src), 0);
    assert_int_equal(dst.len, 23);
    assert_true(dst.cap >= dst.len);
    /* Freed first: dst must not share a byte with it (ASan checks). */
    loom_messages_free(&src);
    assert_string_equal(dst.items[0].content, "first");
    for (int i = 0; i < 20; i++) {
        snprintf(buf, sizeof(buf), "m%d", i);
        assert_string_equal(dst.items[1 + i].content, buf);
        assert_int_equal(dst.items[1 + i].role, LOOM_ROLE_USER);
    }
    assert_int_equal(dst.items[21].role, LOOM_ROLE_ASSISTANT);
    assert_string_equal(dst.items[21].reasoning, "r");
    assert_int_equal(dst.items[21].tool_calls_len, 1);
    assert_string_equal(dst.items[21].tool_calls[0].id, "c1");
    assert_string_equal(dst.items[21].tool_calls[0].arguments, "{\"a\":1}");
    assert_int_equal(dst.items[22].role, LOOM_ROLE_TOOL);
    assert_string_equal(dst.items[22].tool_call_id, "c1");
    assert_string_equal(dst.items[22].name, "f");

    /* Appending an empty list changes nothing. */
    assert_int_equal(loom_messages_append(&dst, &src), 0);
    assert_int_equal(dst.len, 23);
    loom_messages_free(&dst);
}

static void test_usage_add(void **state)
{
    loom_usage a = {1, 2, 3, 4, 5, 0, 0};
    loom_usage b = {10, 20, 30, 40, 50, 60, 70};
    loom_usage zero = {0};

    (void)state;
    loom_usage_add(&a, &b);
    assert_int_equal(a.prompt_tokens, 11);
    assert_int_equal(a.completion_tokens, 22);
    assert_int_equal(a.cached_tokens, 33);
    assert_int_equal(a.reasoning_tokens, 44);
    assert_int_equal(a.total_tokens, 55);
    assert_int_equal(a.cache_write_tokens, 60);
    assert_int_equal(a.cost_micros, 70);
    loom_usage_add(&a, &zero);
    assert_int_equal(a.total_tokens, 55);
    assert_int_equal(b.prompt_tokens, 10); /* b untouched */
}

static void test_llm_response_clear(void **state)
{
    loom_llm_response r;
    static const loom_llm_response zero;

    (void)state;
    memset(&r, 0, sizeof(r));
    loom_llm_response_clear(&r); /* empty is fine */
    assert_memory_equal(&r, &zero, sizeof(r));

    r.text = strdup("t");
    r.reasoning = strdup("r");
    r.tool_calls = calloc(2, sizeof(*r.tool_calls));
    assert_non_null(r.tool_calls);
    r.tool_calls_len = 2;
    r.tool_calls[0].id = strdup("i");
    r.tool_calls[0].name = strdup("n");
    r.tool_calls[0].arguments = strdup("{}");
    r.tool_calls[1].name = strdup("m");
    r.usage.total_tokens = 9;
    r.finish_reason = strdup("stop");
    r.response_id = strdup("resp");
    r.output_started = 1;
    r.error.kind = LOOM_UPSTREAM_SERVER;
    r.error.http_status = 500;
    r.error.type = strdup("server_error");
    r.error.message = strdup("boom");
    r.error.request_id = strdup("req");
    r.error.attempts = 3;
    /* Everything is freed (ASan reports a leak otherwise) and zeroed. */
    loom_llm_response_clear(&r);
    assert_memory_equal(&r, &zero, sizeof(r));
}

/* loom__json_compact_size counts what json_dumpb writes, byte for byte. */
static void assert_size_matches(json_t *j)
{
    assert_non_null(j);
    assert_int_equal(loom__json_compact_size(j),
                     json_dumpb(j, NULL, 0, JSON_COMPACT));
    json_decref(j);
}

/* Values jansson can dump, each handed to check (which takes it): every
 * type, every escape, UTF-8 of each length, reals of every shape,
 * containers deeper than the hand-written walkers go. */
static void each_json_sample(void (*check)(json_t *))
{
    static const double reals[] = {0.1,     3.0,   -0.0,      1e100,
                                   1e-5,    1e21,  -2.5e-300, 123456789012.5,
                                   1.0 / 3, 1e300, 42.0,      -7e-7};
    json_t *deep = json_array(), *o;
    char nul[] = "a\0b";

    for (size_t i = 0; i < sizeof(reals) / sizeof(reals[0]); i++)
        check(json_pack("[f]", reals[i]));
    check(json_object());
    check(json_array());
    check(json_pack(
        "{s:s,s:s,s:i,s:I,s:I,s:b,s:b,s:n,s:[],s:{},s:[i,s,{s:[f]}]}", "plain",
        "text", "escaped", "esc\"a\\pe\n\t\r\b\f\x01\x1f\x7f/", "small", -3,
        "big", (json_int_t)INT64_MIN, "pos", (json_int_t)INT64_MAX, "t", 1, "f",
        0, "none", "ea", "eo", "mix", 7, "caf\xc3\xa9 \xf0\x9f\x98\x80", "in",
        "x", 2.5));
    /* Long strings, a byte that needs a look at each place of a word. */
    for (int i = 0; i < 24; i++) {
        char t[40];
        memset(t, 'a', sizeof(t) - 1);
        t[sizeof(t) - 1] = '\0';
        t[i] = "\"\\\n\x01\x7f/~ "[i % 8];
        check(json_pack("[s,s]", t, t + i));
    }
    check(json_pack("[s]", "0123456\xc3\xa9"
                           "890123456789\xe2\x82\xac"));
    o = json_object();
    json_object_set_new(o, "k\"\\\x02 \xc3\xa9", json_stringn(nul, 3));
    check(o);
    for (int i = 0; i < 100; i++)
        deep = json_pack("[o,{s:o}]", deep, "d", json_integer(i));
    check(deep);
}

static void test_json_compact_size(void **state)
{
    json_t *o;

    (void)state;
    each_json_sample(assert_size_matches);
    /* What jansson cannot dump counts 0, as json_dumpb says. */
    o = json_object();
    json_object_set_new(o, "bad", json_stringn_nocheck("\xff\xfe", 2));
    assert_int_equal(loom__json_compact_size(o), 0);
    assert_size_matches(o);
    o = json_string("not a container");
    assert_int_equal(loom__json_compact_size(o), 0);
    json_decref(o);
}

/* loom__json_compact_dumps writes what json_dumps writes, at the default
 * precision and at 15, or fails where it fails. */
static void assert_dump_matches(json_t *j)
{
    static const int precs[] = {0, 15, 17, 3, 1};
    size_t len = 0;

    for (size_t i = 0; i < sizeof(precs) / sizeof(precs[0]); i++) {
        char *want =
            json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION((size_t)precs[i]));
        char *got = loom__json_compact_dumps(j, precs[i], &len);
        if (!want) {
            assert_null(got);
            continue;
        }
        assert_non_null(got);
        assert_string_equal(got, want);
        assert_int_equal(len, strlen(want));
        free(want);
        free(got);
    }
    json_decref(j);
}

static void test_json_compact_dumps(void **state)
{
    json_t *o;

    (void)state;
    each_json_sample(assert_dump_matches);
    o = json_object();
    json_object_set_new(o, "bad", json_stringn_nocheck("\xff\xfe", 2));
    assert_null(loom__json_compact_dumps(o, 15, NULL));
    assert_dump_matches(o);
    /* Past 17 digits jansson writes the text itself. */
    o = json_pack("[f,s]", 1.0 / 3, "\n");
    assert_dump_matches(o);
    o = json_pack("[f]", 1.0 / 3);
    {
        char *want = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(25));
        char *got = loom__json_compact_dumps(o, 25, NULL);
        assert_string_equal(got, want);
        free(want);
        free(got);
    }
    json_decref(o);
    o = json_string("not a container");
    assert_null(loom__json_compact_dumps(o, 0, NULL));
    assert_dump_matches(o);
    /* Every control character and every byte above them. */
    o = json_array();
    for (int c = 1; c < 128; c++) {
        char t[2] = {(char)c, 0};
        json_array_append_new(o, json_string(t));
    }
    assert_dump_matches(o);
}

/* loom__json_put_string appends what json_dumps writes for the string,
 * short or past its stack buffer, and refuses what is not UTF-8 leaving
 * the buffer as it was. */
static void test_json_put_string(void **state)
{
    static const char *const samples[] = {"", "plain",
                                          "q\"b\\s\n\t\r\b\f\x01\x1f\x7f/",
                                          "caf\xc3\xa9 \xf0\x9f\x98\x80"};
    char big[600];
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);

    (void)state;
    memset(big, '\n', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    for (size_t i = 0; i <= sizeof(samples) / sizeof(samples[0]); i++) {
        const char *s =
            i < sizeof(samples) / sizeof(samples[0]) ? samples[i] : big;
        json_t *a = json_pack("[s]", s);
        char *want = json_dumps(a, JSON_COMPACT);
        loom_buf_clear(&b);
        assert_int_equal(loom_buf_puts(&b, "["), 0);
        assert_int_equal(loom__json_put_string(&b, s, strlen(s)), 0);
        assert_int_equal(loom_buf_puts(&b, "]"), 0);
        assert_string_equal(loom_buf_cstr(&b), want);
        free(want);
        json_decref(a);
    }
    loom_buf_clear(&b);
    assert_int_equal(loom_buf_puts(&b, "x"), 0);
    assert_int_equal(loom__json_put_string(&b, "a\xff", 2), LOOM_EINVALID);
    assert_string_equal(loom_buf_cstr(&b), "x");
    loom_buf_free(&b);
}

/* loom__json_put_members appends the members of o as its dump writes
 * them (the deep sample's innermost arrays past the writer's own depth
 * too), at each precision: all of them, or all but one skipped. */
static void assert_members_match(json_t *j)
{
    static const int precs[] = {0, 15, 17, 3};
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    json_t *o = json_is_object(j) ? json_incref(j) : json_pack("{sO}", "v", j);
    const char *first = json_object_iter_key(json_object_iter(o));
    const char *skip[] = {"nothing", first, NULL};
    json_t *less = json_copy(o);

    if (first)
        json_object_del(less, first);
    for (size_t i = 0; i < sizeof(precs) / sizeof(precs[0]); i++) {
        for (int k = 0; k < 2; k++) {
            char *want = loom__json_compact_dumps(k ? less : o, precs[i], NULL);
            loom_buf_clear(&b);
            assert_int_equal(loom_buf_puts(&b, "{"), 0);
            if (!want) {
                assert_int_equal(
                    loom__json_put_members(&b, o, k ? skip : NULL, precs[i]),
                    LOOM_EINVALID);
                assert_string_equal(loom_buf_cstr(&b), "{");
                continue;
            }
            assert_int_equal(
                loom__json_put_members(&b, o, k ? skip : NULL, precs[i]), 0);
            assert_int_equal(loom_buf_puts(&b, "}"), 0);
            /* {,"a":1,"b":2} against {"a":1,"b":2}. */
            if (b.len > 2)
                memmove(b.ptr + 1, b.ptr + 2, b.len-- - 1);
            assert_string_equal(loom_buf_cstr(&b), want);
            free(want);
        }
    }
    loom_buf_free(&b);
    json_decref(less);
    json_decref(o);
    json_decref(j);
}

static void test_json_put_members(void **state)
{
    static const json_int_t ints[] = {0, 7, -1, 10, -99, INT64_MAX, INT64_MIN};
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    char big[3000];
    json_t *o;

    (void)state;
    each_json_sample(assert_members_match);
    assert_members_match(json_string("a scalar"));
    assert_members_match(json_null());
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    assert_members_match(json_pack("{s:s,s:i}", "long", big, "n", 1));
    o = json_object();
    json_object_set_new(o, "bad", json_stringn_nocheck("\xff\xfe", 2));
    assert_members_match(o);
    assert_members_match(json_stringn_nocheck("\xc3", 1));
    /* No object, or past 17 digits (jansson's own writing): refused. */
    o = json_pack("[i]", 1);
    assert_int_equal(loom__json_put_members(&b, o, NULL, 15), LOOM_EINVALID);
    json_decref(o);
    o = json_object();
    assert_int_equal(loom__json_put_members(&b, o, NULL, 18), LOOM_EINVALID);
    json_decref(o);
    assert_int_equal(b.len, 0);
    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        char *want;
        o = json_pack("[I]", ints[i]);
        want = json_dumps(o, JSON_COMPACT);
        loom_buf_clear(&b);
        assert_int_equal(loom_buf_puts(&b, "["), 0);
        assert_int_equal(loom__json_put_int(&b, ints[i]), 0);
        assert_int_equal(loom_buf_puts(&b, "]"), 0);
        assert_string_equal(loom_buf_cstr(&b), want);
        free(want);
        json_decref(o);
    }
    assert_true(loom__json_string_valid("caf\xc3\xa9", 5));
    assert_true(loom__json_string_valid("", 0));
    assert_false(loom__json_string_valid("caf\xc3", 4));
    assert_false(loom__json_string_valid("\xed\xa0\x80", 3));
    loom_buf_free(&b);
}

static void test_role_names(void **state)
{
    (void)state;
    assert_string_equal(loom_role_name(LOOM_ROLE_SYSTEM), "system");
    assert_string_equal(loom_role_name(LOOM_ROLE_USER), "user");
    assert_string_equal(loom_role_name(LOOM_ROLE_ASSISTANT), "assistant");
    assert_string_equal(loom_role_name(LOOM_ROLE_TOOL), "tool");
    assert_non_null(loom_role_name((loom_role)99));
}

static void test_upstream_kind_names(void **state)
{
    const char *names[LOOM_UPSTREAM_PROTOCOL + 1];

    (void)state;
    assert_string_equal(loom_upstream_kind_name(LOOM_UPSTREAM_NONE), "none");
    assert_string_equal(loom_upstream_kind_name(LOOM_UPSTREAM_RATE_LIMIT),
                        "rate_limit");
    assert_string_equal(loom_upstream_kind_name(LOOM_UPSTREAM_SERVER),
                        "server");
    assert_string_equal(loom_upstream_kind_name(LOOM_UPSTREAM_TIMEOUT),
                        "timeout");
    assert_string_equal(loom_upstream_kind_name(LOOM_UPSTREAM_PROTOCOL),
                        "protocol");
    /* Every kind has its own non-empty name. */
    for (int k = 0; k <= LOOM_UPSTREAM_PROTOCOL; k++) {
        names[k] = loom_upstream_kind_name((loom_upstream_kind)k);
        assert_non_null(names[k]);
        assert_true(names[k][0] != '\0');
        for (int j = 0; j < k; j++)
            assert_string_not_equal(names[j], names[k]);
    }
    assert_non_null(loom_upstream_kind_name((loom_upstream_kind)1000));
}

static void test_provider_new_unknown_kind(void **state)
{
    loom_provider_config cfg;
    loom_provider *p = (loom_provider *)&cfg; /* must be reset to NULL */

    (void)state;
    memset(&cfg, 0, sizeof(cfg));
    cfg.name = "claude";
    cfg.kind = "anthropic-native";
    cfg.base_url = "http://127.0.0.1:1/v1";
    cfg.headers = json_object();
    assert_non_null(cfg.headers);
    loom_error_clear();
    assert_int_equal(loom_provider_new(&p, &cfg), LOOM_EINVALID);
    assert_null(p);
    assert_int_equal(loom_error_last_code(), LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "anthropic-native"));
    json_decref(cfg.headers);
    loom_provider_free(NULL);
}

static void test_provider_new_openai(void **state)
{
    loom_provider_config cfg;
    loom_provider *p = NULL;

    (void)state;
    memset(&cfg, 0, sizeof(cfg));
    cfg.name = "local";
    cfg.kind = "openai";
    cfg.base_url = "http://127.0.0.1:1/v1";
    cfg.headers = json_object();
    assert_non_null(cfg.headers);
    assert_int_equal(loom_provider_new(&p, &cfg), 0);
    assert_non_null(p);
    assert_non_null(p->vt);
    assert_non_null(p->vt->complete);
    assert_string_equal(p->name, "local");
    loom_provider_free(p);
    json_decref(cfg.headers);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        /* First, before any test turns logging on. */
        cmocka_unit_test_teardown(test_log_off_by_default, log_teardown),

        cmocka_unit_test(test_buf_put_to_the_limit),
        cmocka_unit_test(test_buf_put_past_the_limit_when_partly_full),
        cmocka_unit_test(test_buf_zero_limit),
        cmocka_unit_test(test_buf_printf_grows),
        cmocka_unit_test(test_buf_byte_at_a_time_to_limit),
        cmocka_unit_test(test_buf_binary_content),
        cmocka_unit_test(test_buf_consume),
        cmocka_unit_test(test_buf_clear_keeps_memory),
        cmocka_unit_test(test_buf_detach),
        cmocka_unit_test(test_buf_free_and_reuse),
        cmocka_unit_test(test_buf_vprintf),

        cmocka_unit_test(test_error_set_and_clear),
        cmocka_unit_test(test_error_long_message_is_cut),
        cmocka_unit_test(test_error_names),
        cmocka_unit_test(test_id_new),
        cmocka_unit_test(test_id_fork),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_error_is_per_thread),

        cmocka_unit_test_teardown(test_log_off_writes_nothing, log_teardown),
        cmocka_unit_test_teardown(test_log_level_filter, log_teardown),
        cmocka_unit_test_teardown(test_log_text_format, log_teardown),
        cmocka_unit_test_teardown(test_log_json_format, log_teardown),
        cmocka_unit_test_teardown(test_log_long_message, log_teardown),
        cmocka_unit_test_teardown(test_log_threads_whole_lines, log_teardown),
        cmocka_unit_test(test_log_level_parse),

        cmocka_unit_test(test_messages_add_copies),
        cmocka_unit_test(test_messages_add_tool_result),
        cmocka_unit_test(test_messages_add_assistant),
        cmocka_unit_test(test_messages_append_deep),
        cmocka_unit_test(test_usage_add),
        cmocka_unit_test(test_llm_response_clear),
        cmocka_unit_test(test_json_compact_size),
        cmocka_unit_test(test_json_compact_dumps),
        cmocka_unit_test(test_json_put_string),
        cmocka_unit_test(test_json_put_members),
        cmocka_unit_test(test_role_names),
        cmocka_unit_test(test_upstream_kind_names),
        cmocka_unit_test(test_provider_new_unknown_kind),
        cmocka_unit_test(test_provider_new_openai),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
