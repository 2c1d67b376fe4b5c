/*
 * loom's HTTP server where reviews found it wrong: each test reproduces
 * one defect and asserts the fixed behaviour, with a real server in this
 * process, a SQLite store in a temporary file and the fake upstream.
 *
 * - A graceful stop answers every request that waits for a run (blocking
 *   runs, non-streamed and held chat streams), not only open streams.
 * - A turn that could not be stored is never acknowledged: blocking
 *   requests get 500 "store_failed", streams end with an error, the run
 *   object says "stored": false, a metric counts it; busy stores are
 *   retried for a bounded time (srv__store_retry crossed both ways).
 * - Store writes never run on the polling thread: with the database's
 *   write lock held by another connection, a run continuing a
 *   conversation still starts streaming, /healthz and conversation reads
 *   still answer, and an unknown conversation is still a 404 before any
 *   stream; a run in a new conversation streams once it is created.
 * - 405 carries Allow and counts under its route in /metrics; HEAD works
 *   wherever GET does.
 * - A chat request that fails after its run started cancels the run.
 * - A cancel that comes while the run is storing its turn is a 409.
 *
 * Waits have generous limits that only fail a test that hangs; nothing
 * asserts how fast something happened.
 */
#include "test_server_harness.h"
#include "core/error.h"
#include "server/srvpriv.h"
#include "store/sqlite_internal.h"

#include <pthread.h>
#include <sqlite3.h>
#include <sys/resource.h>
#include <stdatomic.h>

#define USAGE                                                                \
    "\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":2,"              \
    "\"total_tokens\":12}"
#define HELLO "{\"text\":[\"Hello\",\" world\"]," USAGE "}"
#define LOOP(resp) "{\"loop\":true,\"responses\":[" resp "]}"
#define HANG "{\"text\":[\"Partial \",\"answer\"],\"hang\":true," \
             "\"hang_after_chunks\":2}"
#define CHAT(extra)                                                          \
    "{\"model\":\"fake/m\",\"messages\":[{\"role\":\"user\","              \
    "\"content\":\"hi\"}]" extra "}"
#define WAIT_LIMIT_MS 60000

/* ---- helpers ------------------------------------------------------------- */

/* The value of the metric line starting with `series ` (0 when absent). */
static double metric(const sh *h, const char *series)
{
    return sh_metric(h, series, 0);
}

/* Waits until metric series reaches at least want. */
static void wait_metric(const sh *h, const char *series, double want)
{
    long long end = test_now_ms() + WAIT_LIMIT_MS;

    while (metric(h, series) < want) {
        if (test_now_ms() > end)
            fail_msg("%s stayed below %g", series, want);
        usleep(20 * 1000);
    }
}

/* Another connection to the server's database holding its write lock
 * (as another process would). */
static sqlite3 *lock_db(const sh *h)
{
    sqlite3 *db = NULL;

    assert_int_equal(sqlite3_open(h->db, &db), SQLITE_OK);
    assert_int_equal(sqlite3_exec(db, "BEGIN IMMEDIATE", NULL, NULL, NULL),
                     SQLITE_OK);
    return db;
}

static void unlock_db(sqlite3 *db)
{
    assert_int_equal(sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL),
                     SQLITE_OK);
    sqlite3_close(db);
}

/* A request made on a thread of its own; status is known as soon as the
 * headers are in. */
typedef struct {
    const sh *h;
    const char *method, *path, *body;
    sh_resp r;
    atomic_long head_status; /* 0 until the status line came */
    int curl_rc;
    pthread_t th;
} bg_req;

static size_t bg_header(char *p, size_t sz, size_t n, void *ud)
{
    bg_req *b = ud;
    char line[64];
    size_t len = sz * n < sizeof(line) - 1 ? sz * n : sizeof(line) - 1;
    int code;

    /* Header lines are not NUL-terminated. */
    memcpy(line, p, len);
    line[len] = '\0';
    if (sscanf(line, "HTTP/%*s %d", &code) == 1)
        atomic_store(&b->head_status, code);
    return sh_on_header(p, sz, n, &b->r);
}

static void *bg_main(void *arg)
{
    bg_req *b = arg;
    CURL *e = sh_easy(b->h, b->method, b->path, b->body, NULL, &b->r);

    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, bg_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, b);
    b->curl_rc = (int)curl_easy_perform(e);
    if (b->curl_rc == CURLE_OK)
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &b->r.status);
    curl_easy_cleanup(e);
    return NULL;
}

static void bg_start(bg_req *b, const sh *h, const char *method,
                     const char *path, const char *body)
{
    memset(b, 0, sizeof(*b));
    b->h = h;
    b->method = method;
    b->path = path;
    b->body = body;
    atomic_init(&b->head_status, 0);
    assert_int_equal(pthread_create(&b->th, NULL, bg_main, b), 0);
}

/* Waits for the status line and returns the status. */
static long bg_status(bg_req *b)
{
    long long end = test_now_ms() + WAIT_LIMIT_MS;

    while (atomic_load(&b->head_status) == 0) {
        if (test_now_ms() > end)
            fail_msg("%s %s: no answer", b->method, b->path);
        usleep(10 * 1000);
    }
    return atomic_load(&b->head_status);
}

static void bg_join(bg_req *b)
{
    pthread_join(b->th, NULL);
}

/* The data of the last SSE event of body (borrowed from *evs). */
static json_t *last_event(const char *body, json_t **evs)
{
    *evs = sh_sse_parse(body, NULL);
    return json_object_get(json_array_get(*evs, json_array_size(*evs) - 1),
                           "data");
}

/* ---- 1. a graceful stop answers waiting requests ------------------------- */

#define NDELTAS 5000
#define NNATIVE 10
#define NCHAT 4

/* 5000 one-character deltas after 800 ms. */
static char *many_deltas_script(void)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);

    assert_int_equal(loom_buf_puts(&b, "{\"loop\":true,\"responses\":[{"
                                       "\"delay_ms\":800,\"text\":["),
                     0);
    for (int i = 0; i < NDELTAS; i++)
        assert_int_equal(loom_buf_puts(&b, i ? ",\"x\"" : "\"x\""), 0);
    assert_int_equal(loom_buf_puts(&b, "]," USAGE "}]}"), 0);
    return loom_buf_detach(&b);
}

/* Starts n requests (native blocking first, then chat: plain, or
 * streamed with stream) and waits until every run is in its model call:
 * each request has been handled and waits (the model waits 800 ms). */
static void start_waiting(sh *h, bg_req *reqs, size_t nnative, size_t n,
                          int stream)
{
    long long end = test_now_ms() + WAIT_LIMIT_MS;

    for (size_t i = 0; i < n; i++) {
        if (i < nnative)
            bg_start(&reqs[i], h, "POST", "/v1/runs", "{\"input\":\"hi\"}");
        else
            bg_start(&reqs[i], h, "POST", "/v1/chat/completions",
                     stream ? CHAT(",\"stream\":true") : CHAT(""));
    }
    while (fake_request_count(h->fake) < n) {
        if (test_now_ms() > end)
            fail_msg("the runs did not all start");
        usleep(10 * 1000);
    }
}

static void check_answered(bg_req *b, size_t i)
{
    bg_join(b);
    if (b->curl_rc != CURLE_OK || b->r.status != 200)
        fail_msg("request %zu: curl %d, status %ld: %.200s", i, b->curl_rc,
                 b->r.status, b->r.body ? b->r.body : "(no body)");
}

/* Blocking requests (no stream open) get their whole answers. */
static void test_stop_answers_waiting_requests(void **state)
{
    bg_req reqs[NNATIVE + NCHAT];
    size_t n = sizeof(reqs) / sizeof(reqs[0]);
    char *script = many_deltas_script();
    sh h;

    (void)state;
    sh_start(&h, script, NULL, "  shutdown_grace_ms: 30000\n");
    free(script);
    start_waiting(&h, reqs, NNATIVE, n, 0);
    sh_stop_server(&h);
    for (size_t i = 0; i < n; i++) {
        json_t *j;
        check_answered(&reqs[i], i);
        j = json_loads(reqs[i].r.body, 0, NULL);
        assert_non_null(j);
        if (i < NNATIVE) {
            assert_string_equal(sh_str(j, "status"), "completed");
            assert_true(json_is_true(json_object_get(j, "stored")));
            assert_int_equal(strlen(sh_str(j, "text")), NDELTAS);
            assert_true(json_array_size(json_object_get(j, "events")) >
                        NDELTAS);
        } else {
            json_t *msg = json_object_get(
                json_array_get(json_object_get(j, "choices"), 0), "message");
            assert_int_equal(strlen(sh_str(msg, "content")), NDELTAS);
        }
        json_decref(j);
        sh_resp_free(&reqs[i].r);
    }
    sh_free(&h);
}

/* Chat streams held until their run's first output get the whole
 * stream, to [DONE]. */
static void test_stop_answers_held_streams(void **state)
{
    bg_req reqs[NCHAT];
    size_t n = sizeof(reqs) / sizeof(reqs[0]);
    char *script = many_deltas_script();
    sh h;

    (void)state;
    sh_start(&h, script, NULL, "  shutdown_grace_ms: 30000\n");
    free(script);
    start_waiting(&h, reqs, 0, n, 1);
    sh_stop_server(&h);
    for (size_t i = 0; i < n; i++) {
        json_t *evs, *last;
        check_answered(&reqs[i], i);
        last = last_event(reqs[i].r.body, &evs);
        assert_true(json_is_string(last));
        assert_string_equal(json_string_value(last), "[DONE]");
        /* role chunk, 5000 deltas, finish chunk, [DONE] */
        assert_true(json_array_size(evs) >= NDELTAS + 3);
        json_decref(evs);
        sh_resp_free(&reqs[i].r);
    }
    sh_free(&h);
}

/* ---- 2. a turn that could not be stored is never acknowledged ------------ */

static void check_unstored_run(const sh *h, const char *run_id)
{
    char path[128];
    json_t *run, *err;

    snprintf(path, sizeof(path), "/v1/runs/%s", run_id);
    run = sh_json(h, "GET", path, NULL, 200);
    assert_string_equal(sh_str(run, "status"), "failed");
    assert_true(json_is_false(json_object_get(run, "stored")));
    assert_true(json_is_string(json_object_get(run, "store_error")));
    err = json_object_get(run, "error");
    assert_string_equal(sh_str(err, "code"), "store_failed");
    json_decref(run);
}

/* A streamed chat completion whose turn cannot be stored: its answer
 * streams, then an error event (store_failed) and no [DONE]. */
static void chat_stream_unstored(const sh *h, const char *body, sh_resp *r)
{
    json_t *evs, *last;

    assert_int_equal(sh_req(h, "POST", "/v1/chat/completions", body, NULL, r),
                     200);
    assert_non_null(strstr(r->body, "Hello"));
    assert_null(strstr(r->body, "[DONE]"));
    last = last_event(r->body, &evs);
    assert_string_equal(sh_str(json_object_get(last, "error"), "code"),
                        "store_failed");
    json_decref(evs);
}

static void test_store_failure_reported(void **state)
{
    sh h;
    sh_resp r;
    json_t *run, *evs, *last, *conv;
    char body[256], run_id[64], conv_id[64], new_id[64];
    double errors;

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, NULL);
    loom_session_set_store_retry_ms(h.srv->session, 200);
    /* A conversation stored while the store still writes. */
    run = sh_json(&h, "POST", "/v1/runs", "{\"input\":\"first\"}", 200);
    assert_true(json_is_true(json_object_get(run, "stored")));
    assert_true(json_is_null(json_object_get(run, "store_error")));
    snprintf(conv_id, sizeof(conv_id), "%s", sh_str(run, "conversation_id"));
    json_decref(run);

    /* From now on every write fails (LOOM_EIO), reads still work. */
    assert_int_equal(
        loom__store_sqlite_exec_all(h.store, "PRAGMA query_only = 1"), 0);

    /* A blocking run continuing it: its turn cannot be saved. */
    snprintf(body, sizeof(body),
             "{\"input\":\"second\",\"conversation_id\":\"%s\"}", conv_id);
    assert_int_equal(sh_req(&h, "POST", "/v1/runs", body, NULL, &r), 500);
    sh_check_error(r.body, "store_failed");
    assert_non_null(sh_header(&r, "X-Loom-Run-Id", run_id, sizeof(run_id)));
    assert_non_null(strstr(r.body, run_id));
    sh_resp_free(&r);
    check_unstored_run(&h, run_id);
    assert_true(metric(&h, "loom_store_errors_total{op=\"save_turn\"}") >= 1);
    /* Retried before giving up (200 ms of 50, 100 ms waits). */
    assert_true(metric(&h, "loom_store_retries_total{op=\"save_turn\"}") >= 2);

    /* The same streamed: no run.completed, a store_failed run.failed. */
    snprintf(body, sizeof(body),
             "{\"input\":\"third\",\"conversation_id\":\"%s\","
             "\"stream\":true}",
             conv_id);
    assert_int_equal(sh_req(&h, "POST", "/v1/runs", body, NULL, &r), 200);
    assert_null(strstr(r.body, "run.completed"));
    last = last_event(r.body, &evs);
    assert_string_equal(sh_str(last, "type"), "run.failed");
    assert_string_equal(sh_str(json_object_get(last, "error"), "code"),
                        "store_failed");
    assert_non_null(strstr(r.body, "Hello world"));
    json_decref(evs);
    sh_resp_free(&r);

    /* A new conversation cannot even be created: the run fails before
     * its model call. */
    errors = metric(&h, "loom_store_errors_total{op=\"create_conversation\"}");
    assert_int_equal(
        sh_req(&h, "POST", "/v1/runs", "{\"input\":\"new\"}", NULL, &r), 500);
    sh_check_error(r.body, "store_failed");
    assert_non_null(sh_header(&r, "X-Loom-Run-Id", run_id, sizeof(run_id)));
    sh_resp_free(&r);
    check_unstored_run(&h, run_id);
    assert_true(
        metric(&h, "loom_store_errors_total{op=\"create_conversation\"}") ==
        errors + 1);

    /* Chat, not streamed: 500 store_failed. */
    assert_int_equal(
        sh_req(&h, "POST", "/v1/chat/completions", CHAT(""), NULL, &r), 500);
    sh_check_error(r.body, "store_failed");
    sh_resp_free(&r);
    /* Chat, streamed, continuing the conversation: the answer streams,
     * then an error event and no [DONE]. */
    snprintf(body, sizeof(body),
             "{\"model\":\"fake/m\",\"stream\":true,\"conversation_id\":"
             "\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
             conv_id);
    chat_stream_unstored(&h, body, &r);
    sh_resp_free(&r);

    /* Chat, streamed, a new conversation: created with the turn's save,
     * so the same; the id its first chunk named is not in the store. */
    chat_stream_unstored(&h,
                         "{\"model\":\"fake/m\",\"stream\":true,"
                         "\"messages\":[{\"role\":\"user\","
                         "\"content\":\"new\"}]}",
                         &r);
    assert_non_null(
        sh_header(&r, "X-Loom-Conversation-Id", new_id, sizeof(new_id)));
    sh_resp_free(&r);
    snprintf(body, sizeof(body), "/v1/conversations/%s", new_id);
    assert_int_equal(sh_req(&h, "GET", body, NULL, NULL, &r), 404);
    sh_resp_free(&r);

    /* The conversation holds only the first turn. */
    snprintf(body, sizeof(body), "/v1/conversations/%s", conv_id);
    conv = sh_json(&h, "GET", body, NULL, 200);
    assert_int_equal(json_array_size(json_object_get(conv, "messages")), 2);
    json_decref(conv);

    /* Writable again: stored again. */
    assert_int_equal(
        loom__store_sqlite_exec_all(h.store, "PRAGMA query_only = 0"), 0);
    run = sh_json(&h, "POST", "/v1/runs", "{\"input\":\"again\"}", 200);
    assert_string_equal(sh_str(run, "status"), "completed");
    assert_true(json_is_true(json_object_get(run, "stored")));
    json_decref(run);
    sh_free(&h);
}

/* srv__store_retry on its own: retried while LOOM_EIO, within its time. */
typedef struct {
    int calls;
    int fail_times; /* < 0: always */
    int code;
} retry_op;

static int flaky(void *arg)
{
    retry_op *o = arg;

    o->calls++;
    if (o->fail_times < 0 || o->calls <= o->fail_times)
        return loom__error_set(o->code, "flaky store (call %d)", o->calls);
    return 0;
}

static void test_store_retry(void **state)
{
    sh h;
    retry_op o;
    long long t0;

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, NULL);
    /* Busy twice, then it works. */
    loom_session_set_store_retry_ms(h.srv->session, 30000);
    o = (retry_op){0, 2, LOOM_EIO};
    assert_int_equal(srv__store_retry(h.srv, flaky, &o, "test_op"), 0);
    assert_int_equal(o.calls, 3);
    assert_true(metric(&h, "loom_store_retries_total{op=\"test_op\"}") == 2);
    /* Other errors are not retried. */
    o = (retry_op){0, -1, LOOM_ENOTFOUND};
    assert_int_equal(srv__store_retry(h.srv, flaky, &o, "test_op"),
                     LOOM_ENOTFOUND);
    assert_int_equal(o.calls, 1);
    /* Past the limit it gives up with the last error. */
    loom_session_set_store_retry_ms(h.srv->session, 300);
    o = (retry_op){0, -1, LOOM_EIO};
    t0 = test_now_ms();
    assert_int_equal(srv__store_retry(h.srv, flaky, &o, "test_op"),
                     LOOM_EIO);
    assert_true(test_now_ms() - t0 >= 300);
    assert_true(o.calls >= 3); /* 50 + 100 + 150 ms of waits */
    assert_non_null(strstr(loom_error_last(), "flaky store"));
    sh_free(&h);
}

/* ---- 3. store writes stay off the polling thread ------------------------- */

static void test_store_writes_off_polling_thread(void **state)
{
    sh h;
    sh_resp r;
    sqlite3 *lock;
    bg_req fresh, cont;
    json_t *run, *evs, *last, *conv;
    char body[256], conv_id[64], path[128];

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, NULL);
    run = sh_json(&h, "POST", "/v1/runs", "{\"input\":\"first\"}", 200);
    snprintf(conv_id, sizeof(conv_id), "%s", sh_str(run, "conversation_id"));
    json_decref(run);

    /* Another writer holds the database: every write waits for it. */
    lock = lock_db(&h);
    /* A run in a new conversation waits for its conversation to be
     * created (its stream starts once it is)... */
    bg_start(&fresh, &h, "POST", "/v1/runs",
             "{\"input\":\"new\",\"stream\":true}");
    /* ...one continuing a conversation only reads: it streams at once. */
    snprintf(body, sizeof(body),
             "{\"input\":\"more\",\"conversation_id\":\"%s\","
             "\"stream\":true}",
             conv_id);
    bg_start(&cont, &h, "POST", "/v1/runs", body);
    assert_int_equal(bg_status(&cont), 200);
    /* The polling thread is free: other requests answer meanwhile. */
    assert_int_equal(sh_req(&h, "GET", "/healthz", NULL, NULL, &r), 200);
    sh_resp_free(&r);
    snprintf(path, sizeof(path), "/v1/conversations/%s", conv_id);
    conv = sh_json(&h, "GET", path, NULL, 200);
    assert_int_equal(json_array_size(json_object_get(conv, "messages")), 2);
    json_decref(conv);
    conv = sh_json(&h, "GET", "/v1/conversations", NULL, 200);
    json_decref(conv);
    /* An unknown conversation is still refused before any stream. */
    assert_int_equal(
        sh_req(&h, "POST", "/v1/runs",
               "{\"input\":\"x\",\"stream\":true,\"conversation_id\":"
               "\"conv_000000000000000000000000\"}",
               NULL, &r),
        404);
    sh_check_error(r.body, "not_found");
    sh_resp_free(&r);
    assert_int_equal(
        sh_req(&h, "POST", "/v1/chat/completions",
               "{\"model\":\"fake/m\",\"stream\":true,\"conversation_id\":"
               "\"conv_000000000000000000000000\",\"messages\":[{\"role\":"
               "\"user\",\"content\":\"x\"}]}",
               NULL, &r),
        404);
    sh_resp_free(&r);
    /* All that while, the new conversation could not be created (its
     * worker waits, well within SQLite's 5 s and the 10 s of retries). */
    assert_int_equal(atomic_load(&fresh.head_status), 0);
    unlock_db(lock);
    assert_int_equal(bg_status(&fresh), 200);

    /* Both runs went on once the store was free, and are stored. */
    bg_join(&fresh);
    bg_join(&cont);
    last = last_event(fresh.r.body, &evs);
    assert_string_equal(sh_str(last, "type"), "run.completed");
    json_decref(evs);
    last = last_event(cont.r.body, &evs);
    assert_string_equal(sh_str(last, "type"), "run.completed");
    json_decref(evs);
    conv = sh_json(&h, "GET", path, NULL, 200);
    assert_int_equal(json_array_size(json_object_get(conv, "messages")), 4);
    json_decref(conv);
    evs = sh_sse_parse(fresh.r.body, NULL);
    snprintf(path, sizeof(path), "/v1/conversations/%s",
             sh_str(json_object_get(json_array_get(evs, 0), "data"),
                    "conversation_id"));
    json_decref(evs);
    conv = sh_json(&h, "GET", path, NULL, 200);
    assert_int_equal(json_array_size(json_object_get(conv, "messages")), 2);
    json_decref(conv);
    sh_resp_free(&fresh.r);
    sh_resp_free(&cont.r);
    sh_free(&h);
}

/* ---- 5. 405 with Allow, HEAD as GET -------------------------------------- */

static long head(const sh *h, const char *path, sh_resp *r)
{
    CURL *e;

    memset(r, 0, sizeof(*r));
    e = sh_easy(h, "GET", path, NULL, NULL, r);
    curl_easy_setopt(e, CURLOPT_NOBODY, 1L);
    if (curl_easy_perform(e) == CURLE_OK)
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r->status);
    curl_easy_cleanup(e);
    return r->status;
}

static void test_allow_and_head(void **state)
{
    sh h;
    sh_resp r;
    json_t *run;
    char v[128], path[128];

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, NULL);
    assert_int_equal(sh_req(&h, "DELETE", "/v1/runs", NULL, NULL, &r), 405);
    sh_check_error(r.body, "method_not_allowed");
    assert_non_null(sh_header(&r, "Allow", v, sizeof(v)));
    assert_string_equal(v, "POST");
    sh_resp_free(&r);
    assert_int_equal(
        sh_req(&h, "PUT", "/v1/conversations/conv_x", "{}", NULL, &r), 405);
    assert_non_null(sh_header(&r, "Allow", v, sizeof(v)));
    assert_string_equal(v, "GET, HEAD, DELETE, PATCH");
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "POST", "/healthz", NULL, NULL, &r), 405);
    assert_non_null(sh_header(&r, "Allow", v, sizeof(v)));
    assert_string_equal(v, "GET, HEAD");
    sh_resp_free(&r);
    /* A 405 counts under its route, not as unmatched. */
    wait_metric(&h,
                "loom_http_requests_total{method=\"DELETE\","
                "route=\"/v1/runs\",status=\"405\"}",
                1);
    wait_metric(&h,
                "loom_http_requests_total{method=\"PUT\",route=\"/v1/"
                "conversations/{id}\",status=\"405\"}",
                1);
    assert_int_equal(metric(&h, "loom_http_requests_total{method=\"DELETE\","
                                "route=\"unmatched\",status=\"405\"}"),
                     0);

    /* HEAD answers like GET, without the body. */
    assert_int_equal(head(&h, "/healthz", &r), 200);
    assert_int_equal(r.len, 0);
    assert_non_null(sh_header(&r, "Content-Type", v, sizeof(v)));
    assert_string_equal(v, "application/json");
    sh_resp_free(&r);
    assert_int_equal(head(&h, "/v1/models", &r), 200);
    sh_resp_free(&r);
    run = sh_json(&h, "POST", "/v1/runs", "{\"input\":\"x\"}", 200);
    snprintf(path, sizeof(path), "/v1/runs/%s", sh_str(run, "id"));
    assert_int_equal(head(&h, path, &r), 200);
    assert_non_null(sh_header(&r, "X-Loom-Run-Id", v, sizeof(v)));
    assert_string_equal(v, sh_str(run, "id"));
    sh_resp_free(&r);
    json_decref(run);
    assert_int_equal(head(&h, "/v1/runs/run_nope", &r), 404);
    sh_resp_free(&r);
    /* Not on a POST-only path. */
    assert_int_equal(head(&h, "/v1/runs", &r), 405);
    assert_non_null(sh_header(&r, "Allow", v, sizeof(v)));
    assert_string_equal(v, "POST");
    sh_resp_free(&r);
    sh_free(&h);
}

/* ---- 6. a chat request that cannot answer cancels its run ---------------- */

static void wait_runs_idle(const sh *h)
{
    long long end = test_now_ms() + WAIT_LIMIT_MS;

    while (srv__runs_active(h->srv) > 0) {
        if (test_now_ms() > end)
            fail_msg("a run without a client is still running");
        usleep(20 * 1000);
    }
}

static void test_chat_failure_cancels_run(void **state)
{
    sh h;
    sh_resp r;

    (void)state;
    /* The model never finishes: only a cancel ends these runs. */
    sh_start(&h, LOOP(HANG), NULL, NULL);

    /* Right after the run started (a reply header that cannot be set). */
    srv__fault_arm("chat.started", 1);
    assert_int_equal(
        sh_req(&h, "POST", "/v1/chat/completions", CHAT(""), NULL, &r), 500);
    sh_resp_free(&r);
    srv__fault_arm(NULL, 0);
    wait_runs_idle(&h);
    wait_metric(&h, "loom_runs_total{status=\"cancelled\"}", 1);

    /* A held stream whose answer cannot start once output came. */
    srv__fault_arm("defer.done", 1);
    assert_int_equal(sh_req(&h, "POST", "/v1/chat/completions",
                            CHAT(",\"stream\":true"), NULL, &r),
                     500);
    sh_resp_free(&r);
    srv__fault_arm(NULL, 0);
    wait_runs_idle(&h);
    wait_metric(&h, "loom_runs_total{status=\"cancelled\"}", 2);
    sh_free(&h);
}

/* ---- 7. a cancel while the turn is being stored -------------------------- */

static void test_cancel_while_storing(void **state)
{
    sh h;
    sh_resp r;
    sqlite3 *lock;
    json_t *run, *done, *got;
    char path[128];
    long st;

    (void)state;
    sh_start(&h, LOOP("{\"delay_ms\":300,\"text\":[\"done\"]," USAGE "}"),
             NULL, NULL);
    run = sh_json(&h, "POST", "/v1/runs",
                  "{\"input\":\"x\",\"background\":true}", 202);
    /* The model call started, so its conversation exists... */
    {
        long long end = test_now_ms() + WAIT_LIMIT_MS;
        while (fake_request_count(h.fake) < 1) {
            if (test_now_ms() > end)
                fail_msg("the run did not start");
            usleep(10 * 1000);
        }
    }
    /* ...and now its turn cannot be written until the lock goes. */
    lock = lock_db(&h);
    wait_metric(&h, "loom_upstream_requests_total{provider=\"fake\"}", 1);
    snprintf(path, sizeof(path), "/v1/runs/%s/cancel", sh_str(run, "id"));
    st = sh_req(&h, "POST", path, NULL, NULL, &r);
    if (st == 200) {
        /* Only if the cancel still reached the loop. */
        done = json_loads(r.body, 0, NULL);
        assert_string_equal(sh_str(done, "status"), "cancelled");
        json_decref(done);
    } else {
        assert_int_equal(st, 409);
        sh_check_error(r.body, "run_not_active");
    }
    sh_resp_free(&r);
    unlock_db(lock);
    got = sh_wait_run(&h, sh_str(run, "id"), WAIT_LIMIT_MS);
    assert_true(json_is_true(json_object_get(got, "stored")));
    if (st == 409)
        assert_string_equal(sh_str(got, "status"), "completed");
    json_decref(got);
    json_decref(run);
    sh_free(&h);
}

/* CPU seconds this process has used, all threads. */
static double cpu_seconds(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
           (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

/*
 * An idle server sleeps: its ticker once waited on the wrong clock and
 * spun a whole core. CPU time, not wall time, is measured: a loaded
 * machine can only make a spinning server look better, never an idle one
 * look busy, so this cannot fail by accident.
 */
static void test_idle_server_does_not_spin(void **state)
{
    sh h;
    double before, used;

    (void)state;
    sh_start(&h, LOOP(HELLO), NULL, NULL);
    before = cpu_seconds();
    sleep(2);
    used = cpu_seconds() - before;
    assert_true(used < 0.5);
    sh_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_answers_waiting_requests),
        cmocka_unit_test(test_stop_answers_held_streams),
        cmocka_unit_test(test_store_failure_reported),
        cmocka_unit_test(test_store_retry),
        cmocka_unit_test(test_store_writes_off_polling_thread),
        cmocka_unit_test(test_allow_and_head),
        cmocka_unit_test(test_chat_failure_cancels_run),
        cmocka_unit_test(test_cancel_while_storing),
        cmocka_unit_test(test_idle_server_does_not_spin),
    };

    curl_global_init(CURL_GLOBAL_DEFAULT);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
