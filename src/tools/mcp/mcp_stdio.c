/*
 * The stdio transport of the MCP client: the server is a program loom
 * starts, one JSON-RPC message per line on its stdin and stdout.
 *
 * The program runs in its own process group, so stopping it ends what it
 * started too (npx starts node, which may start more). Its environment
 * is a short list of harmless variables from loom's own (PATH, HOME,
 * locale...) plus the config's env: loom's keys (OPENAI_API_KEY...) reach
 * it only when the config passes them. A reader thread takes stdout
 * line by line (a line that is not JSON is skipped with a log line; one
 * longer than LOOM_MCP_MAX_MESSAGE is dropped), another logs stderr,
 * each line cut and the count bounded. When stdout ends, the server is
 * lost and its requests fail at once.
 *
 * Stopping follows the spec's order: close stdin, give the program a
 * moment, then SIGTERM and SIGKILL to the group. A pipe to the stop
 * thread's poll lets the readers end even when a grandchild keeps the
 * output open.
 *
 * In the 2026-07-28 era a server tells of list changes only on a
 * subscription: a subscriptions/listen request that stays open, whose
 * notifications share stdout with everything else and carry its id as
 * their `_meta` subscriptionId. The reader keeps what is the
 * subscription's own (its acknowledgement, its answer, the server's
 * notifications/cancelled of it, anything tagged with another one) and
 * hands the rest (list_changed) to the core. A subscription the server
 * ends while it runs marks the tool list stale and is opened again with
 * the next message loom sends; a new process (a restart) gets a new one
 * from the core; stopping cancels it (notifications/cancelled) before
 * stdin closes.
 */
#include "core/clock.h"
#include "core/error.h"
#include "loom/buf.h"
#include "loom/log.h"
#include "tools/mcp/mcp_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* Lines of stderr logged per start, and the most of one line shown. */
#define STDERR_LINES_MAX 1000
#define STDERR_LINE_SHOWN 400
/* How long a program has to exit after stdin closes, then after TERM. */
#define EXIT_GRACE_MS 500
#define TERM_GRACE_MS 1000
/* How long sending subscriptions/listen, or its cancellation, may take. */
#define LISTEN_SEND_MS 1000
/* How many times in a row a subscription the server ends is opened again
 * before loom stops following the list (a change told on one starts the
 * count over). */
#define LISTEN_REOPENS 3
/* The `_meta` key naming the subscription a message belongs to. */
#define SUBSCRIPTION_ID "io.modelcontextprotocol/subscriptionId"

/* The variables of loom's environment a server inherits. */
static const char *const inherited[] = {
    "PATH", "HOME", "USER",   "LOGNAME",  "SHELL",      "TERM", "TMPDIR",
    "LANG", "TZ",   "LC_ALL", "LC_CTYPE", "SYSTEMROOT", NULL};

typedef struct {
    loom_mcp_server *s;
    unsigned gen;
    pid_t pid;
    int in_fd, out_fd, err_fd;
    int stop_pipe[2];
    pthread_t reader, errlog;
    int have_reader, have_errlog;
    pthread_mutex_t wmu; /* one writer at a time; in_fd under it */
    atomic_int stopping; /* loom ends it: its end is no failure */
    /* The subscription (2026-07-28): the id of the open
     * subscriptions/listen request, 0 when none is open. */
    _Atomic json_int_t listen_id;
    atomic_int reopen; /* the server ended it: open it with the next send */
    int reopens;       /* times opened again in a row; the reader's */
} stdio_conn;

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* ---- reading ----------------------------------------------------------- */

/*
 * Reads what is there on fd into b, waiting until data or the stop pipe.
 * Returns bytes read, 0 at the end (or stop), -1 on error.
 */
static ssize_t read_some(stdio_conn *c, int fd, char *buf, size_t cap)
{
    for (;;) {
        struct pollfd fds[2] = {{fd, POLLIN, 0}, {c->stop_pipe[0], POLLIN, 0}};
        ssize_t n;

        if (poll(fds, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (fds[1].revents)
            return 0;
        n = read(fd, buf, cap);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        return n;
    }
}

static int on_subscription(stdio_conn *c, const json_t *msg);

static void handle_line(stdio_conn *c, const char *line, size_t len)
{
    json_error_t err;
    json_t *msg;

    while (len && (line[len - 1] == '\r' || line[len - 1] == ' '))
        len--;
    if (!len)
        return;
    if ((line[0] != '{' && line[0] != '[') ||
        !(msg = json_loadb(line, len, JSON_REJECT_DUPLICATES, &err))) {
        loom_warn("mcp %s: skipped a stdout line that is not JSON-RPC "
                  "(%zu bytes)",
                  loom__mcp_config(c->s)->name, len);
        return;
    }
    if (on_subscription(c, msg)) {
        json_decref(msg);
        return;
    }
    loom__mcp_dispatch(c->s, c->gen, msg);
}

static void *reader_main(void *arg)
{
    stdio_conn *c = arg;
    loom_buf line = LOOM_BUF_INIT(LOOM_MCP_MAX_MESSAGE);
    char chunk[65536];
    int skipping = 0;
    ssize_t n;

    while ((n = read_some(c, c->out_fd, chunk, sizeof(chunk))) > 0) {
        size_t start = 0;
        for (size_t i = 0; i < (size_t)n; i++) {
            if (chunk[i] != '\n')
                continue;
            if (!skipping && loom_buf_put(&line, chunk + start, i - start) == 0)
                handle_line(c, loom_buf_cstr(&line), line.len);
            else if (!skipping)
                skipping = 1;
            if (skipping)
                loom_warn("mcp %s: dropped a message larger than %zu bytes",
                          loom__mcp_config(c->s)->name, LOOM_MCP_MAX_MESSAGE);
            skipping = 0;
            loom_buf_clear(&line);
            start = i + 1;
        }
        if (!skipping && start < (size_t)n &&
            loom_buf_put(&line, chunk + start, (size_t)n - start) != 0) {
            skipping = 1;
            loom_buf_clear(&line);
        }
    }
    loom_buf_free(&line);
    /* A server loom stops is no failure: only its end of its own is. */
    if (!atomic_load(&c->stopping))
        loom__mcp_lost(c->s, c->gen,
                       "the server closed its output (it exited or "
                       "crashed)");
    return NULL;
}

static void *errlog_main(void *arg)
{
    stdio_conn *c = arg;
    char chunk[4096], shown[STDERR_LINE_SHOWN + 1];
    size_t have = 0, lines = 0;
    ssize_t n;

    while ((n = read_some(c, c->err_fd, chunk, sizeof(chunk))) > 0) {
        for (ssize_t i = 0; i < n; i++) {
            int end = chunk[i] == '\n';
            if (!end && have < STDERR_LINE_SHOWN)
                shown[have++] =
                    (chunk[i] >= 0 && chunk[i] < 32) ? '?' : chunk[i];
            if (!end)
                continue;
            shown[have] = '\0';
            if (++lines <= STDERR_LINES_MAX && have)
                loom_info("mcp %s: stderr: %s", loom__mcp_config(c->s)->name,
                          shown);
            else if (lines == STDERR_LINES_MAX + 1)
                loom_info("mcp %s: stderr: more lines not logged",
                          loom__mcp_config(c->s)->name);
            have = 0;
        }
    }
    return NULL;
}

/* ---- starting ---------------------------------------------------------- */

static int env_add(char ***envp, size_t *len, const char *name,
                   const char *value)
{
    size_t n = strlen(name) + strlen(value) + 2;
    char *kv = malloc(n), **grown;

    if (!kv || !(grown = realloc(*envp, (*len + 2) * sizeof(**envp)))) {
        free(kv);
        return loom__error_oom();
    }
    snprintf(kv, n, "%s=%s", name, value);
    *envp = grown;
    (*envp)[(*len)++] = kv;
    (*envp)[*len] = NULL;
    return 0;
}

static void env_free(char **envp, size_t len)
{
    for (size_t i = 0; i < len; i++)
        free(envp[i]);
    free(envp);
}

/* The inherited variables, then the config's (which win). */
static int build_env(const loom_mcp_server_config *cfg, char ***out,
                     size_t *len)
{
    const char *key;
    const json_t *v;
    int rc = 0;

    *out = NULL;
    *len = 0;
    for (size_t i = 0; inherited[i] && rc == 0; i++) {
        const char *val = getenv(inherited[i]);
        if (val && !json_object_get(cfg->env, inherited[i]))
            rc = env_add(out, len, inherited[i], val);
    }
    json_object_foreach((json_t *)cfg->env, key, v)
    {
        if (rc == 0 && json_is_string(v))
            rc = env_add(out, len, key, json_string_value(v));
    }
    if (rc == 0 && !*out && !(*out = calloc(1, sizeof(**out))))
        rc = loom__error_oom();
    return rc;
}

static int spawn(stdio_conn *c, const loom_mcp_server_config *cfg)
{
    int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    sigset_t none, deflt;
    char **argv = NULL, **envp = NULL;
    size_t envlen = 0;
    int rc = 0, e;

    if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) ||
        pipe2(err, O_CLOEXEC)) {
        rc = loom__error_set(LOOM_EIO, "pipe: %s", strerror(errno));
        goto done;
    }
    if (!(argv = calloc(cfg->args_len + 2, sizeof(*argv)))) {
        rc = loom__error_oom();
        goto done;
    }
    argv[0] = cfg->command;
    for (size_t i = 0; i < cfg->args_len; i++)
        argv[i + 1] = cfg->args[i];
    if ((rc = build_env(cfg, &envp, &envlen)) != 0)
        goto done;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, err[1], 2);
    if (cfg->cwd)
        posix_spawn_file_actions_addchdir_np(&fa, cfg->cwd);
    sigemptyset(&none);
    sigemptyset(&deflt);
    sigaddset(&deflt, SIGPIPE);
    sigaddset(&deflt, SIGINT);
    sigaddset(&deflt, SIGTERM);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &deflt);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP |
                                        POSIX_SPAWN_SETSIGMASK |
                                        POSIX_SPAWN_SETSIGDEF);
    e = posix_spawnp(&c->pid, cfg->command, &fa, &attr, argv, envp);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (e != 0) {
        c->pid = -1;
        rc = loom__error_set(LOOM_EUPSTREAM, "cannot start '%s'%s%s: %s",
                             cfg->command, cfg->cwd ? " in " : "",
                             cfg->cwd ? cfg->cwd : "", strerror(e));
        goto done;
    }
    c->in_fd = in[1];
    c->out_fd = out[0];
    c->err_fd = err[0];
    in[1] = out[0] = err[0] = -1;
    fcntl(c->in_fd, F_SETFL, fcntl(c->in_fd, F_GETFL) | O_NONBLOCK);

done:
    for (int i = 0; i < 2; i++) {
        close_fd(&in[i]);
        close_fd(&out[i]);
        close_fd(&err[i]);
    }
    free(argv);
    env_free(envp, envlen);
    return rc;
}

static void stdio_free(void *impl);
static void stdio_stop(void *impl);

static int stdio_open(loom_mcp_server *s, unsigned gen, void **impl)
{
    stdio_conn *c = calloc(1, sizeof(*c));
    int rc;

    *impl = NULL;
    if (!c)
        return loom__error_oom();
    c->s = s;
    c->gen = gen;
    c->pid = -1;
    c->in_fd = c->out_fd = c->err_fd = -1;
    c->stop_pipe[0] = c->stop_pipe[1] = -1;
    pthread_mutex_init(&c->wmu, NULL);
    if (pipe2(c->stop_pipe, O_CLOEXEC)) {
        rc = loom__error_set(LOOM_EIO, "pipe: %s", strerror(errno));
        goto fail;
    }
    if ((rc = spawn(c, loom__mcp_config(s))) != 0)
        goto fail;
    if (pthread_create(&c->reader, NULL, reader_main, c) != 0) {
        rc = loom__error_set(LOOM_ERROR, "cannot start a reader thread");
        goto fail;
    }
    c->have_reader = 1;
    if (pthread_create(&c->errlog, NULL, errlog_main, c) == 0)
        c->have_errlog = 1;
    *impl = c;
    return 0;

fail:
    stdio_stop(c);
    stdio_free(c);
    return rc;
}

/* ---- writing ----------------------------------------------------------- */

/* Writes all of data to the non-blocking fd by deadline, without a
 * SIGPIPE reaching the process (the signal is blocked in this thread and
 * a pending one taken back). */
static int write_all(stdio_conn *c, const char *data, size_t len,
                     int64_t deadline)
{
    sigset_t pipe_set, old, pending;
    int rc = 0, was_pending;

    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
    sigpending(&pending);
    was_pending = sigismember(&pending, SIGPIPE);
    while (len && rc == 0) {
        ssize_t n = c->in_fd >= 0 ? write(c->in_fd, data, len) : -1;
        if (n > 0) {
            data += n;
            len -= (size_t)n;
        } else if (c->in_fd >= 0 && n < 0 &&
                   (errno == EAGAIN || errno == EINTR)) {
            int64_t left = deadline - loom__mono_ms();
            struct pollfd p = {c->in_fd, POLLOUT, 0};
            if (left <= 0)
                rc = loom__error_set(LOOM_ETIMEDOUT,
                                     "the server does not read its input");
            else
                poll(&p, 1, left > 100 ? 100 : (int)left);
        } else {
            rc = loom__error_set(LOOM_EUPSTREAM, "the server's input is "
                                                 "closed (it exited)");
        }
    }
    if (!was_pending) {
        struct timespec zero = {0, 0};
        sigpending(&pending);
        if (sigismember(&pending, SIGPIPE))
            sigtimedwait(&pipe_set, NULL, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return rc;
}

/* Writes msg as one line by deadline. */
static int write_msg(stdio_conn *c, const json_t *msg, int64_t deadline)
{
    char *text = json_dumps(msg, JSON_COMPACT);
    int rc;

    if (!text)
        return loom__error_oom();
    pthread_mutex_lock(&c->wmu);
    rc = write_all(c, text, strlen(text), deadline);
    if (rc == 0)
        rc = write_all(c, "\n", 1, deadline);
    pthread_mutex_unlock(&c->wmu);
    free(text);
    return rc;
}

/* ---- the subscription (2026-07-28) ------------------------------------ */

/*
 * Opens a new subscription: a subscriptions/listen request for
 * toolsListChanged (loom__mcp_listen_request), whose id the reader
 * follows from now on. A failure is logged: the list is then not
 * followed.
 */
static void subscribe(stdio_conn *c)
{
    json_t *msg = loom__mcp_listen_request(c->s);
    int rc = LOOM_ENOMEM;

    if (msg) {
        atomic_store(&c->listen_id,
                     json_integer_value(json_object_get(msg, "id")));
        rc = write_msg(c, msg, loom__mono_ms() + LISTEN_SEND_MS);
        json_decref(msg);
    }
    if (rc != 0) {
        atomic_store(&c->listen_id, 0);
        loom_warn("mcp %s: cannot send subscriptions/listen (%s): its list "
                  "changes are not followed",
                  loom__mcp_config(c->s)->name,
                  msg ? loom_error_last() : "out of memory");
    }
}

/* The server ended the subscription while it runs: a change may now go
 * untold, so the list is stale, and the next send opens it again (a
 * few times in a row at most). Reader thread. */
static void subscription_ended(stdio_conn *c, const char *how)
{
    const char *name = loom__mcp_config(c->s)->name;

    atomic_store(&c->listen_id, 0);
    if (atomic_load(&c->stopping))
        return;
    loom__mcp_list_stale(c->s);
    if (c->reopens++ < LISTEN_REOPENS) {
        loom_debug("mcp %s: the server %s subscriptions/listen; opening it "
                   "again with the next message",
                   name, how);
        atomic_store(&c->reopen, 1);
    } else {
        loom_warn("mcp %s: the server %s subscriptions/listen %d times in a "
                  "row: its list changes are not followed",
                  name, how, c->reopens);
    }
}

/*
 * What of msg is the subscription's own, handled here: its answer (an
 * error refuses it; a result ends it), the server's notifications/cancelled
 * of it (it ends it too), its acknowledgement, and a notification tagged
 * with a subscription that is not the open one (an old one's: skipped).
 * 1 when msg was handled; 0 when it goes to the core (a notification on
 * the subscription, such as list_changed, or anything else).
 */
static int on_subscription(stdio_conn *c, const json_t *msg)
{
    json_int_t listening = atomic_load(&c->listen_id);
    const json_t *id = json_object_get(msg, "id");
    const json_t *params = json_object_get(msg, "params");
    const char *method = json_string_value(json_object_get(msg, "method"));
    const json_t *tag = json_object_get(
        json_object_get(method ? params : json_object_get(msg, "result"),
                        "_meta"),
        SUBSCRIPTION_ID);
    const char *name = loom__mcp_config(c->s)->name;

    if (!method) {
        const json_t *e = json_object_get(msg, "error");
        if (!listening || !json_is_integer(id) ||
            json_integer_value(id) != listening)
            return 0;
        if (!e) {
            subscription_ended(c, "ended");
            return 1;
        }
        atomic_store(&c->listen_id, 0);
        loom__mcp_listen_refused(c->s, e);
        return 1;
    }
    if (id)
        return 0;
    if (strcmp(method, "notifications/cancelled") == 0) {
        const json_t *rid = json_object_get(params, "requestId");
        if (!listening || !json_is_integer(rid) ||
            json_integer_value(rid) != listening)
            return 0;
        subscription_ended(c, "cancelled");
        return 1;
    }
    if (!tag)
        return 0;
    if (!listening || !json_is_integer(tag) ||
        json_integer_value(tag) != listening) {
        loom_debug("mcp %s: skipped %.100s of a subscription that is not open",
                   name, method);
        return 1;
    }
    if (strcmp(method, "notifications/subscriptions/acknowledged") == 0) {
        if (!json_is_true(json_object_get(
                json_object_get(params, "notifications"), "toolsListChanged")))
            loom_info("mcp %s: subscriptions/listen acknowledged without "
                      "toolsListChanged: its list changes are not followed",
                      name);
        return 1;
    }
    c->reopens = 0;
    return 0;
}

/* The transport's listen: a new process's subscription. Its tools may
 * not be the ones listed when it is a restart (no subscription followed
 * them meanwhile): the list is stale then. */
static void stdio_listen(void *impl)
{
    stdio_conn *c = impl;

    if (c->gen > 1)
        loom__mcp_list_stale(c->s);
    subscribe(c);
}

static int stdio_send(void *impl, const json_t *msg, int64_t deadline,
                      loom_cancel *cancel, mcp_pending *p)
{
    stdio_conn *c = impl;

    (void)cancel;
    (void)p;
    if (atomic_exchange(&c->reopen, 0))
        subscribe(c);
    return write_msg(c, msg, deadline);
}

/* ---- stopping ---------------------------------------------------------- */

/* Waits up to ms for the program to exit; 1 when it did. */
static int reaped(stdio_conn *c, long ms)
{
    int64_t until = loom__mono_ms() + ms;

    for (;;) {
        pid_t r = waitpid(c->pid, NULL, WNOHANG);
        if (r == c->pid || (r < 0 && errno != EINTR)) {
            c->pid = -1;
            return 1;
        }
        if (loom__mono_ms() >= until)
            return 0;
        poll(NULL, 0, 10);
    }
}

/* Cancels the open subscription, if any (the spec's way on stdio;
 * closing stdin would end it too, with no word). */
static void cancel_subscription(stdio_conn *c)
{
    json_int_t listening = atomic_exchange(&c->listen_id, 0);
    json_t *n;

    if (!listening)
        return;
    n = json_pack("{s:s,s:s,s:{s:I,s:s}}", "jsonrpc", "2.0", "method",
                  "notifications/cancelled", "params", "requestId", listening,
                  "reason", "the client stops the server");
    if (n && write_msg(c, n, loom__mono_ms() + LISTEN_SEND_MS) != 0)
        loom_debug("mcp %s: cannot cancel subscriptions/listen: %s",
                   loom__mcp_config(c->s)->name, loom_error_last());
    json_decref(n);
}

static void stdio_stop(void *impl)
{
    stdio_conn *c = impl;

    pid_t group;

    if (!c)
        return;
    group = c->pid;
    atomic_store(&c->stopping, 1);
    cancel_subscription(c);
    pthread_mutex_lock(&c->wmu);
    close_fd(&c->in_fd);
    pthread_mutex_unlock(&c->wmu);
    if (c->pid > 0 && !reaped(c, EXIT_GRACE_MS)) {
        kill(-c->pid, SIGTERM);
        if (!reaped(c, TERM_GRACE_MS)) {
            kill(-c->pid, SIGKILL);
            reaped(c, TERM_GRACE_MS * 10L);
        }
    }
    /* What is left of the group (a grandchild) goes too. */
    if (group > 0)
        kill(-group, SIGKILL);
    if (c->stop_pipe[1] >= 0 && write(c->stop_pipe[1], "x", 1) < 0)
        loom_debug("mcp: stop pipe: %s", strerror(errno));
    if (c->have_reader)
        pthread_join(c->reader, NULL);
    if (c->have_errlog)
        pthread_join(c->errlog, NULL);
    c->have_reader = c->have_errlog = 0;
}

static void stdio_free(void *impl)
{
    stdio_conn *c = impl;

    if (!c)
        return;
    close_fd(&c->in_fd);
    close_fd(&c->out_fd);
    close_fd(&c->err_fd);
    close_fd(&c->stop_pipe[0]);
    close_fd(&c->stop_pipe[1]);
    pthread_mutex_destroy(&c->wmu);
    free(c);
}

const mcp_transport loom__mcp_stdio = {"stdio",    stdio_open, stdio_send,
                                       stdio_stop, stdio_free, stdio_listen};
