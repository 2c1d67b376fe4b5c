/*
 * Test-side control of loom-fake-upstream (see fake.h). The fake is a
 * separate process so that a test talks to it over real sockets exactly as
 * loom talks to a provider, and so that its threads and sleeps never mix
 * with the code under test. It is started with posix_spawn, and its one
 * "listening 127.0.0.1:PORT" line is read from a pipe on its stdout.
 */
#include "fake.h"
#include "core/http.h"
#include "loom/buf.h"
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

#define FAKE_START_TIMEOUT_MS 30000 /* ASan start-up on a busy machine */
#define FAKE_STOP_TIMEOUT_MS 10000
#define FAKE_MAX_ARGS 32

struct loom_fake {
    pid_t pid;
    int port;
    int status; /* exit status once reaped, else -2 */
    char url[64];
    char *script; /* temporary script file, or NULL */
    char *record;
};

static atomic_int seq;

static const char *fake_bin(void)
{
    const char *bin = getenv("LOOM_FAKE_BIN");

    if (bin && *bin)
        return bin;
#ifdef LOOM_FAKE_BIN
    return LOOM_FAKE_BIN;
#else
    return "loom-fake-upstream";
#endif
}

/* A fresh temporary path "<tmp>/loom-<pid>-fake<k>-<what>". */
static char *fresh_path(const char *what)
{
    char name[96];

    snprintf(name, sizeof(name), "fake%d-%s", atomic_fetch_add(&seq, 1), what);
    return test_tmp_path(name);
}

static void free_fake(loom_fake *f)
{
    if (f->script)
        unlink(f->script);
    if (f->record)
        unlink(f->record);
    free(f->script);
    free(f->record);
    free(f);
}

/* Reads the listening line from fd; the port, or -1. */
static int read_port(int fd)
{
    char line[128];
    size_t n = 0;
    long long end = test_now_ms() + FAKE_START_TIMEOUT_MS;
    int port = -1;

    while (n + 1 < sizeof(line)) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        long long left = end - test_now_ms();
        ssize_t r;

        if (left <= 0) {
            fprintf(stderr, "fake: no listening line after %d ms\n",
                    FAKE_START_TIMEOUT_MS);
            return -1;
        }
        if (poll(&p, 1, (int)left) < 0 && errno != EINTR)
            return -1;
        if (!(p.revents & (POLLIN | POLLHUP)))
            continue;
        r = read(fd, line + n, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            fprintf(stderr, "fake: exited before listening\n");
            return -1;
        }
        if (line[n] == '\n')
            break;
        n++;
    }
    line[n] = '\0';
    if (sscanf(line, "listening 127.0.0.1:%d", &port) != 1 || port <= 0) {
        fprintf(stderr, "fake: unexpected first line \"%s\"\n", line);
        return -1;
    }
    return port;
}

/* Spawns the fake with f->record set; takes f (freed on failure). */
static loom_fake *spawn(loom_fake *f, const char *const *args)
{
    const char *argv[FAKE_MAX_ARGS + 8];
    posix_spawn_file_actions_t fa;
    size_t n = 0, i;
    int pipefd[2], rc;

    argv[n++] = fake_bin();
    argv[n++] = "--record";
    argv[n++] = f->record;
    argv[n++] = "--max-seconds";
    argv[n++] = "120";
    for (i = 0; args && args[i]; i++) {
        if (i == FAKE_MAX_ARGS) {
            fprintf(stderr, "fake: more than %d arguments\n", FAKE_MAX_ARGS);
            free_fake(f);
            return NULL;
        }
        argv[n++] = args[i];
    }
    argv[n] = NULL;

    if (pipe2(pipefd, O_CLOEXEC) != 0) {
        fprintf(stderr, "fake: pipe: %s\n", strerror(errno));
        free_fake(f);
        return NULL;
    }
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, pipefd[1], STDOUT_FILENO);
    rc = posix_spawn(&f->pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(pipefd[1]);
    if (rc != 0) {
        fprintf(stderr, "fake: cannot start %s: %s\n", argv[0], strerror(rc));
        close(pipefd[0]);
        free_fake(f);
        return NULL;
    }
    f->port = read_port(pipefd[0]);
    close(pipefd[0]);
    if (f->port < 0) {
        kill(f->pid, SIGKILL);
        test_wait_pid(f->pid, -1);
        free_fake(f);
        return NULL;
    }
    snprintf(f->url, sizeof(f->url), "http://127.0.0.1:%d/v1", f->port);
    return f;
}

static loom_fake *new_fake(void)
{
    loom_fake *f = calloc(1, sizeof(*f));

    if (!f)
        return NULL;
    f->status = -2;
    f->record = fresh_path("record.jsonl");
    if (!f->record) {
        free(f);
        return NULL;
    }
    return f;
}

loom_fake *fake_start_argv(const char *const *args)
{
    loom_fake *f = new_fake();

    return f ? spawn(f, args) : NULL;
}

loom_fake *fake_start_script_file(const char *path)
{
    const char *args[] = {"--script", path, NULL};

    return fake_start_argv(args);
}

loom_fake *fake_start_script(const char *script_json)
{
    loom_fake *f = new_fake();
    const char *args[] = {"--script", NULL, NULL};

    if (!f)
        return NULL;
    f->script = fresh_path("script.json");
    if (!f->script ||
        test_write_file(f->script, script_json, strlen(script_json))) {
        free_fake(f);
        return NULL;
    }
    args[1] = f->script;
    return spawn(f, args);
}

loom_fake *fake_start_replay(const char *path, int status)
{
    const char *args[] = {"--replay", path, NULL, NULL, NULL};
    char st[16];

    if (status > 0) {
        snprintf(st, sizeof(st), "%d", status);
        args[2] = "--status";
        args[3] = st;
    }
    return fake_start_argv(args);
}

const char *fake_base_url(const loom_fake *f)
{
    return f->url;
}

int fake_port(const loom_fake *f)
{
    return f->port;
}

json_t *fake_stats(const loom_fake *f)
{
    loom__http_pool *pool = NULL;
    loom__http_request req = {0};
    loom__http_response resp = {0};
    json_t *j = NULL;
    char url[128];

    snprintf(url, sizeof(url), "http://127.0.0.1:%d/_fake/stats", f->port);
    req.url = url;
    req.method = "GET";
    if (loom__http_pool_new(&pool) == 0 &&
        loom__http_perform(pool, &req, &resp) == 0 && resp.status == 200)
        j = json_loads(loom_buf_cstr(&resp.body), 0, NULL);
    loom__http_response_clear(&resp);
    loom__http_pool_free(pool);
    return j;
}

pid_t fake_pid(const loom_fake *f)
{
    return f->pid;
}

const char *fake_record_path(const loom_fake *f)
{
    return f->record;
}

json_t *fake_requests(const loom_fake *f)
{
    json_t *arr = json_array();
    size_t len = 0;
    char *text = arr ? test_read_file(f->record, &len) : NULL;
    char *line, *nl;

    /* Only whole lines: the fake may be writing the next one. */
    for (line = text;
         text && (nl = memchr(line, '\n', len - (size_t)(line - text)));
         line = nl + 1) {
        json_error_t err;
        json_t *o = json_loadb(line, (size_t)(nl - line), 0, &err);

        if (!o) {
            fprintf(stderr, "fake: bad record line: %s\n", err.text);
            continue;
        }
        json_array_append_new(arr, o);
    }
    free(text);
    return arr;
}

size_t fake_request_count(const loom_fake *f)
{
    json_t *arr = fake_requests(f);
    size_t n = json_array_size(arr);

    json_decref(arr);
    return n;
}

json_t *fake_request(const loom_fake *f, size_t i)
{
    json_t *arr = fake_requests(f);
    json_t *o = json_incref(json_array_get(arr, i));

    json_decref(arr);
    return o;
}

size_t fake_requests_with(const loom_fake *f, const char *needle)
{
    json_t *arr = fake_requests(f), *r;
    size_t i, n = 0;

    json_array_foreach(arr, i, r)
    {
        char *t =
            json_dumps(json_object_get(json_object_get(r, "body"), "messages"),
                       JSON_COMPACT);
        n += t && strstr(t, needle) != NULL;
        free(t);
    }
    json_decref(arr);
    return n;
}

int fake_wait_exit(loom_fake *f, long timeout_ms)
{
    if (f->status == -2) {
        int st = test_wait_pid(f->pid, timeout_ms);

        if (st < 0)
            return -1;
        f->status = st;
    }
    return f->status;
}

int fake_stop_check(loom_fake *f)
{
    int st;

    if (!f)
        return -1;
    if (f->status == -2) {
        kill(f->pid, SIGTERM);
        st = test_wait_pid(f->pid, FAKE_STOP_TIMEOUT_MS);
        if (st < 0) {
            fprintf(stderr, "fake: pid %ld ignored SIGTERM; killing it\n",
                    (long)f->pid);
            kill(f->pid, SIGKILL);
            test_wait_pid(f->pid, -1);
        }
        f->status = st;
    }
    st = f->status;
    if (st != 0)
        fprintf(stderr, "fake: pid %ld exited with status %d\n", (long)f->pid,
                st);
    free_fake(f);
    return st;
}

void fake_stop(loom_fake *f)
{
    if (f)
        fake_stop_check(f);
}
