/*
 * A tool call abandoned at its timeout is owned: it holds a reference on
 * its registry, so the program that ran it frees everything it holds and
 * exits at once, without waiting for the call, and the call frees the
 * registry (and its tool's payload) itself if it ends first.
 *
 * Each test runs this binary again as a child (a small program of its
 * own: "--child exit" or "--child last") whose run abandons a tool that
 * overruns its 50 ms timeout, and checks the child's exit status and
 * that its stderr has no sanitizer report: the suite's ASan pass runs the
 * child with LeakSanitizer, so a registry or payload leaked at exit, or
 * freed under the running call, fails here.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "loom/run.h"
#include "mock_provider.h"
#include "testutil.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* How long the tool runs past its release: seconds over its timeout. */
#define OVERRUN_MS 2000
#define TIMEOUT_MS 50

/* ---- the child ------------------------------------------------------- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int released; /* the tool may go on (never, in "exit" mode) */
static int started;  /* the tool began */
static int finished; /* the tool returned */
static int freed;    /* its payload was freed */
static pthread_t main_thread;
static int freed_off_main; /* freed on another thread than main's */

/* The tool's payload: heap memory the registry owns, so that a registry
 * never freed shows as a leak. */
typedef struct {
    char *note;
} slow_payload;

static void slow_free(void *payload)
{
    slow_payload *p = payload;

    free(p->note);
    free(p);
    pthread_mutex_lock(&mu);
    freed = 1;
    freed_off_main = !pthread_equal(pthread_self(), main_thread);
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

/* Waits to be released (ignoring its cancel flag, as a stuck tool does),
 * then works on for OVERRUN_MS and returns using its payload. */
static int slow_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    slow_payload *p = payload;
    struct timespec ts = {OVERRUN_MS / 1000, (OVERRUN_MS % 1000) * 1000000L};

    (void)args;
    (void)ctx;
    pthread_mutex_lock(&mu);
    started = 1;
    pthread_cond_broadcast(&cv);
    while (!released)
        pthread_cond_wait(&cv, &mu);
    pthread_mutex_unlock(&mu);
    while (nanosleep(&ts, &ts) != 0)
        ;
    pthread_mutex_lock(&mu);
    finished = 1;
    pthread_mutex_unlock(&mu);
    return loom_buf_puts(out, p->note);
}

/* Waits (30 s at most) until *flag is set. 0, or 1 at the deadline. */
static int wait_flag(const int *flag)
{
    struct timespec until;
    int e = 0;

    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30;
    while (!*flag && e == 0)
        e = pthread_cond_timedwait(&cv, &mu, &until);
    return !*flag;
}

/*
 * Runs one turn whose only call overruns its timeout and frees the run,
 * the provider and the caller's registry reference. Then, in "exit"
 * mode, returns while the call still runs (the process exits under it);
 * in "last" mode, lets the call finish and waits for it to free the
 * registry. Exit status: 0 when all went as it should, else the step
 * that failed.
 */
static int child(const char *mode)
{
    static const mock_answer a[] = {
        {.calls = {{"c1", "slow", "{}"}}, .ncalls = 1}, {.text = "done"}};
    static const char want[] = "Error: tool 'slow' did not finish within "
                               "its timeout of 50 ms and was abandoned";
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_tool tool = {0};
    loom_tool_registry *reg = NULL;
    loom_messages hist = {0};
    const loom_messages *added;
    loom_run *run = NULL;
    mock_provider m;
    slow_payload *p = calloc(1, sizeof(*p));
    int last = strcmp(mode, "last") == 0, rc;

    main_thread = pthread_self();
    if (!p || !(p->note = strdup("slow result")) ||
        loom_tool_registry_new(&reg) != 0)
        return 10;
    tool.name = "slow";
    tool.description = "Takes its time.";
    tool.execute = slow_exec;
    tool.payload = p;
    tool.free_payload = slow_free;
    if (loom_tool_registry_add(reg, &tool) != 0)
        return 11;
    mock_init(&m, a, 2, 0);
    ro.provider = &m.base;
    ro.upstream_model = "m";
    ro.tools = reg;
    ro.tool_timeout_ms = TIMEOUT_MS;
    if (loom_messages_add(&hist, LOOM_ROLE_USER, "go") != 0 ||
        loom_run_new(&run, &ro, &hist) != 0)
        return 12;
    rc = loom_run_execute(run);
    added = loom_run_messages(run);
    /* The run answered, the call's result being the timeout. */
    if (rc != 0 || strcmp(loom_run_text(run), "done") != 0 || added->len != 3 ||
        strcmp(added->items[1].content, want) != 0)
        return 13;
    loom_run_free(run);
    loom_messages_free(&hist);
    mock_clear(&m);
    loom_tool_registry_free(reg);
    pthread_mutex_lock(&mu);
    /* The call was abandoned, not finished: the registry is its now. */
    if (!started || finished || freed) {
        pthread_mutex_unlock(&mu);
        return 14;
    }
    if (!last) {
        pthread_mutex_unlock(&mu);
        return 0;
    }
    released = 1;
    pthread_cond_broadcast(&cv);
    rc = wait_flag(&freed) ? 15 : !freed_off_main ? 16 : !finished ? 17 : 0;
    pthread_mutex_unlock(&mu);
    return rc;
}

/* ---- the tests ------------------------------------------------------- */

/* Runs this binary as `--child mode`, stderr to a file. Returns its exit
 * status; *err gets its stderr (caller frees). */
static int run_child(const char *mode, char **err)
{
    char self[4096];
    char *path = test_tmp_path(mode);
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    pid_t pid;
    int status;

    assert_non_null(path);
    assert_true(n > 0);
    self[n] = '\0';
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || dup2(fd, 2) < 0)
            _exit(120);
        execl(self, self, "--child", mode, (char *)NULL);
        _exit(121);
    }
    status = test_wait_pid(pid, 60000);
    if (status < 0)
        kill(pid, SIGKILL);
    *err = test_read_file(path, NULL);
    unlink(path);
    free(path);
    return status;
}

static void check_clean(const char *mode)
{
    char *err = NULL;
    int status = run_child(mode, &err);

    if (status != 0 || (err && strstr(err, "Sanitizer")))
        print_error("child %s: status %d, stderr:\n%s\n", mode, status,
                    err ? err : "(none)");
    assert_int_equal(status, 0);
    assert_non_null(err);
    assert_null(strstr(err, "Sanitizer"));
    assert_null(strstr(err, "runtime error"));
    free(err);
}

/* The run ends and the process exits while the call still runs: nothing
 * waits for it, and nothing leaks (the call's thread still holds it). */
static void test_exit_while_running(void **state)
{
    (void)state;
    check_clean("exit");
}

/* The call outlives the run and the caller's registry reference by
 * seconds, then frees the registry and the payload itself. */
static void test_last_call_out_frees(void **state)
{
    (void)state;
    check_clean("last");
}

int main(int argc, char **argv)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_exit_while_running),
        cmocka_unit_test(test_last_call_out_frees),
    };

    if (argc == 3 && strcmp(argv[1], "--child") == 0)
        return child(argv[2]);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
