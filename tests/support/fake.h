/*
 * Starting and stopping loom-fake-upstream from a test (see
 * docs/fake-upstream.md for what the fake serves and the script format).
 *
 * Each fake runs as a child process on 127.0.0.1 with a free port, records
 * every request it gets into a temporary file, and exits by itself after
 * 120 seconds so a crashed test leaves no server behind. The binary is
 * $LOOM_FAKE_BIN when set, else the LOOM_FAKE_BIN the build defines.
 * Temporary files live under $LOOM_TEST_TMP (or /tmp) and go away in
 * fake_stop(). Functions that fail print why to stderr.
 */
#ifndef LOOM_TEST_FAKE_H
#define LOOM_TEST_FAKE_H

#include <stddef.h>
#include <sys/types.h>

#include <jansson.h>

typedef struct loom_fake loom_fake;

/*
 * Starts a fake serving script_json (the text of a script: {"loop": ...,
 * "responses": [...]}), written to a temporary file first; relative
 * "body_file" paths would resolve in the temporary folder, so give
 * absolute ones (test_vector_path()). NULL on failure.
 */
loom_fake *fake_start_script(const char *script_json);

/* Starts a fake serving the script file at path (relative "body_file"
 * paths resolve next to it). NULL on failure. */
loom_fake *fake_start_script_file(const char *path);

/* Starts a fake answering every request with the bytes of the file at
 * path; status 0 means the default (path's .status file, else 200). */
loom_fake *fake_start_replay(const char *path, int status);

/*
 * Starts a fake with extra command-line arguments (a NULL-terminated
 * list, e.g. {"--replay", p, "--max-requests", "2", NULL}). They come
 * after "--record <tmp> --max-seconds 120", so they may override those.
 */
loom_fake *fake_start_argv(const char *const *args);

/* "http://127.0.0.1:PORT/v1": the base URL to configure a provider with.
 * Borrowed from f. */
const char *fake_base_url(const loom_fake *f);

int fake_port(const loom_fake *f);

/* GET /_fake/stats as a new JSON object ({requests, busy_us, hanging}),
 * or NULL. */
json_t *fake_stats(const loom_fake *f);
pid_t fake_pid(const loom_fake *f);

/* The record file (one JSON object per request). Borrowed from f. */
const char *fake_record_path(const loom_fake *f);

/*
 * The requests recorded so far, as a new JSON array of objects {"n",
 * "method", "path", "query", "headers", "body" | "body_text"}. A request
 * is recorded before its response body is sent. Never NULL (an empty
 * array when nothing can be read).
 */
json_t *fake_requests(const loom_fake *f);
size_t fake_request_count(const loom_fake *f);

/* Recorded request i (0-based) as a new reference, or NULL. */
json_t *fake_request(const loom_fake *f, size_t i);

/* How many recorded requests have a body whose "messages", as compact
 * JSON, contain needle. */
size_t fake_requests_with(const loom_fake *f, const char *needle);

/*
 * Waits up to timeout_ms for the fake to exit by itself (after
 * --max-requests or --max-seconds). Returns its exit status, or -1 when
 * it is still running. After an exit, fake_stop() only cleans up.
 */
int fake_wait_exit(loom_fake *f, long timeout_ms);

/*
 * Stops the fake (SIGTERM, then SIGKILL after 10 s), reaps it, removes
 * its temporary files and frees f. Returns its exit status: 0 for a clean
 * exit (which under ASan also means no leak), 128 + N when signal N
 * ended it, -1 when f is NULL or the status is unknown.
 */
int fake_stop_check(loom_fake *f);

/* fake_stop_check() without the status; NULL is a no-op. */
void fake_stop(loom_fake *f);

#endif
