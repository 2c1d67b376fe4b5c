/*
 * The offline demo. With no API key and no config there is no model to
 * talk to, so `loom run` starts the fake upstream (the same program the
 * tests use) with a short scripted conversation: the fake model calls
 * get_time, loom runs it, and the fake model answers. It shows the whole
 * loop working on a fresh machine, and says plainly that it is a demo.
 */
#include "cli/cli.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* The fake upstream's first line: LISTENING then its port. */
#define LISTENING "listening 127.0.0.1:"

static const char demo_script[] =
    "{\"loop\": true, \"responses\": ["
    "{\"tool_calls\": [{\"id\": \"call_demo_1\", \"name\": \"get_time\","
    " \"arguments\": [\"{\\\"timezone\\\":\", \"\\\"UTC\\\"}\"]}],"
    " \"usage\": {\"prompt_tokens\": 52, \"completion_tokens\": 9,"
    " \"total_tokens\": 61}},"
    "{\"text\": [\"This is loom's offline demo: \", \"no model API key was "
    "given, so a fake model answered. \", \"It asked for the get_time tool; "
    "loom ran it on this machine and fed the result back. \", \"Set "
    "OPENAI_API_KEY (and OPENAI_BASE_URL for another OpenAI-compatible "
    "server) to talk to a real model.\\n\"],"
    " \"usage\": {\"prompt_tokens\": 98, \"completion_tokens\": 40,"
    " \"total_tokens\": 138}}]}";

static char *fake_path(void)
{
    char self[PATH_MAX], *slash, *p = NULL;
    const char *env = getenv("LOOM_FAKE_UPSTREAM");
    ssize_t n;

    if (env && *env)
        return strdup(env);
    n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n > 0) {
        self[n] = '\0';
        if ((slash = strrchr(self, '/')) != NULL) {
            *slash = '\0';
            if (asprintf(&p, "%s/loom-fake-upstream", self) >= 0 &&
                access(p, X_OK) == 0)
                return p;
            free(p);
        }
    }
    return strdup("loom-fake-upstream");
}

int cli_offline_start(loom_config **out, int *pid, long max_seconds)
{
    char script[] = "/tmp/loom-demo-XXXXXX";
    char line[128], secs[32], *bin = NULL, *yaml = NULL;
    int fds[2] = {-1, -1}, life[2] = {-1, -1}, fd, port = 0;
    posix_spawn_file_actions_t fa;
    pid_t child;
    FILE *in = NULL;

    *pid = -1;
    *out = NULL;
    fd = mkstemp(script);
    if (fd < 0 || write(fd, demo_script, sizeof(demo_script) - 1) !=
                      (ssize_t)sizeof(demo_script) - 1) {
        fprintf(stderr, "loom: cannot write the demo script: %s\n",
                strerror(errno));
        if (fd >= 0)
            close(fd);
        return -1;
    }
    close(fd);
    bin = fake_path();
    /*
     * The fake's stdin is a pipe whose write end loom holds, close-on-exec,
     * for the rest of its life on purpose: however loom ends (even
     * SIGKILL), the pipe closes and the fake (--exit-on-eof) stops.
     */
    if (!bin || pipe(fds) != 0 || pipe2(life, O_CLOEXEC) != 0)
        goto fail;
    snprintf(secs, sizeof(secs), "%ld", max_seconds);
    char *args[] = {bin,  "--script",      script, "--max-seconds",
                    secs, "--exit-on-eof", NULL};
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&fa, life[0], STDIN_FILENO);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    int rc = posix_spawnp(&child, bin, &fa, NULL, args, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    fds[1] = -1;
    close(life[0]);
    life[0] = -1;
    if (rc != 0) {
        fprintf(stderr, "loom: cannot start %s: %s\n", bin, strerror(rc));
        goto fail;
    }
    *pid = child;
    in = fdopen(fds[0], "r");
    fds[0] = -1;
    if (!in || !fgets(line, sizeof(line), in) ||
        strncmp(line, LISTENING, sizeof(LISTENING) - 1) != 0 ||
        (port = (int)strtol(line + sizeof(LISTENING) - 1, NULL, 10)) <= 0) {
        fprintf(stderr, "loom: the fake upstream (%s) did not start\n", bin);
        goto fail;
    }
    fclose(in);
    in = NULL;
    /* The script was read at start; the fake needs the file no more. */
    unlink(script);
    /* A real config, so the run takes the same path as any other. */
    if (asprintf(&yaml,
                 "providers:\n"
                 "  offline:\n"
                 "    kind: openai\n"
                 "    base_url: http://127.0.0.1:%d/v1\n"
                 "    timeouts: {connect_ms: 5000, first_byte_ms: 30000,"
                 " idle_ms: 30000}\n"
                 "    retries: {max: 0}\n"
                 "models:\n"
                 "  " CLI_OFFLINE_MODEL ": {}\n",
                 port) < 0) {
        yaml = NULL;
        goto fail;
    }
    if (loom_config_load_string(out, yaml, "offline demo") != 0) {
        fprintf(stderr, "loom: offline demo: %s\n", loom_error_last());
        goto fail;
    }
    free(yaml);
    free(bin);
    return 0; /* life[1] stays open: see above */
fail:
    if (life[0] >= 0)
        close(life[0]);
    if (life[1] >= 0)
        close(life[1]);
    if (in)
        fclose(in);
    if (fds[0] >= 0)
        close(fds[0]);
    if (fds[1] >= 0)
        close(fds[1]);
    cli_offline_stop(*pid);
    *pid = -1;
    unlink(script);
    free(yaml);
    free(bin);
    return -1;
}

void cli_offline_stop(int pid)
{
    if (pid <= 0)
        return;
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
}
