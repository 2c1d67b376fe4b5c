/*
 * Cancelling runs that wait on a fiber of loom serve's worker pool: the
 * cancel wakes the parked fiber at once instead of at a poll tick.
 *
 * - A run whose model stream hangs after its first chunk is cancelled:
 *   it ends "cancelled" long before any timer of its own would end it
 *   (the provider's idle timeout is 20 s, the backstop of a parked
 *   transfer 30 s; the test waits 10 s at most), and the fake upstream
 *   sees the client close the hanging connection.
 * - With one worker, the cancelled run's worker then serves another run.
 *
 * Waits have generous limits that only fail a test that hangs or a
 * cancel that is not woken; nothing asserts how fast something happened.
 */
#include "test_server_harness.h"

#define USAGE                                                                  \
    "\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":2,"                 \
    "\"total_tokens\":12}"
/* The first request hangs after its first text (the role chunk, then
 * "Partial "); the next ones answer. */
#define SCRIPT                                                                 \
    "{\"responses\":["                                                         \
    "{\"text\":[\"Partial \",\"answer\"],\"hang\":true,"                       \
    "\"hang_after_chunks\":2},"                                                \
    "{\"text\":[\"Hello\"]," USAGE "}]}"

/* The fake's responses hanging now. */
static long hanging(const sh *h)
{
    json_t *st = fake_stats(h->fake);
    long n;

    assert_non_null(st);
    n = (long)json_integer_value(json_object_get(st, "hanging"));
    json_decref(st);
    return n;
}

/* Waits (10 s at most) until the fake has n responses hanging. */
static void wait_hanging(const sh *h, long n)
{
    long long end = test_now_ms() + 10000;

    while (hanging(h) != n) {
        if (test_now_ms() > end)
            fail_msg("the fake does not have %ld hanging responses", n);
        usleep(10 * 1000);
    }
}

/* Follows the run's events until its first text has come. */
static void wait_text(const sh *h, const char *id, const char *text)
{
    sh_abort_ctx a = {{0}, text};
    char path[128];
    CURL *e;

    snprintf(path, sizeof(path), "/v1/runs/%s/events", id);
    e = sh_easy(h, "GET", path, NULL, NULL, &a.r);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sh_abort_on);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &a);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 10L);
    assert_int_equal(curl_easy_perform(e), CURLE_WRITE_ERROR);
    curl_easy_cleanup(e);
    sh_resp_free(&a.r);
}

/* POST /v1/runs/{id}/cancel, which answers once the run has ended: an
 * answer within limit_s seconds, its status. */
static void cancel_within(const sh *h, const char *id, long limit_s)
{
    char path[128];
    sh_resp r = {0};
    json_t *done;
    long status = 0;
    CURL *e;

    snprintf(path, sizeof(path), "/v1/runs/%s/cancel", id);
    e = sh_easy(h, "POST", path, NULL, NULL, &r);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, limit_s);
    assert_int_equal(curl_easy_perform(e), CURLE_OK);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(e);
    if (status != 200)
        fail_msg("cancel: %ld %s", status, r.body ? r.body : "");
    done = json_loads(r.body, 0, NULL);
    assert_non_null(done);
    assert_string_equal(sh_str(done, "status"), "cancelled");
    json_decref(done);
    sh_resp_free(&r);
}

static void test_cancel_wakes_parked_run(void **state)
{
    sh h;
    sh_resp r;
    json_t *run, *other;

    (void)state;
    sh_start(&h, SCRIPT, NULL, "  workers: 1\n");
    assert_int_equal(sh_req(&h, "POST", "/v1/runs",
                            "{\"input\":\"x\",\"background\":true}", NULL, &r),
                     202);
    run = json_loads(r.body, 0, NULL);
    sh_resp_free(&r);
    assert_non_null(run);
    /* The run's transfer is parked on the worker once its first text
     * came: the fake hangs. */
    wait_hanging(&h, 1);
    wait_text(&h, sh_str(run, "id"), "Partial ");
    /* The run ends well before its idle timeout (20 s) would end it. */
    cancel_within(&h, sh_str(run, "id"), 10);
    /* The transfer left the worker's multi handle: the fake saw the
     * client close its connection. */
    wait_hanging(&h, 0);
    /* The one worker serves the next run. */
    other = sh_json(&h, "POST", "/v1/runs", "{\"input\":\"y\"}", 200);
    assert_string_equal(sh_str(other, "status"), "completed");
    assert_string_equal(sh_str(other, "text"), "Hello");
    json_decref(other);
    json_decref(run);
    sh_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cancel_wakes_parked_run),
    };
    int rc;

    curl_global_init(CURL_GLOBAL_DEFAULT);
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
