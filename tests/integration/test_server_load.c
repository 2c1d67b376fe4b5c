/*
 * Concurrency: 200 streaming runs at once against one in-process server
 * (one libmicrohttpd polling thread), driven by one curl multi handle in
 * one thread. Every stream must be complete (run.started ... run.completed
 * with gapless seqs) and every turn stored intact.
 */
#include "test_server_harness.h"

#define NRUNS 200

typedef struct {
    sh_resp r;
    CURL *e;
} client;

static void test_200_streams(void **state)
{
    static client c[NRUNS];
    sh h;
    CURLM *m;
    int running = 1, done = 0;
    char body[64];
    json_t *list;
    size_t total = 0;
    char *after = NULL;

    (void)state;
    sh_start(&h,
             "{\"loop\":true,\"responses\":[{\"text\":[\"Hello\",\" \","
             "\"world\"],\"chunk_delay_ms\":100,\"usage\":{\"prompt_tokens\":"
             "3,\"completion_tokens\":3,\"total_tokens\":6}}]}",
             NULL, "  max_concurrent_runs: 256\n");
    m = curl_multi_init();
    assert_non_null(m);
    for (int i = 0; i < NRUNS; i++) {
        snprintf(body, sizeof(body), "{\"input\":\"q%d\",\"stream\":true}",
                 i);
        memset(&c[i], 0, sizeof(c[i]));
        c[i].e = sh_easy(&h, "POST", "/v1/runs", body, NULL, &c[i].r);
        curl_easy_setopt(c[i].e, CURLOPT_COPYPOSTFIELDS, body);
        curl_easy_setopt(c[i].e, CURLOPT_PRIVATE, &c[i]);
        curl_multi_add_handle(m, c[i].e);
    }
    while (running) {
        CURLMsg *msg;
        int left;
        assert_int_equal(curl_multi_perform(m, &running), CURLM_OK);
        while ((msg = curl_multi_info_read(m, &left)) != NULL) {
            client *cl = NULL;
            if (msg->msg != CURLMSG_DONE)
                continue;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE,
                              (char **)&cl);
            assert_int_equal(msg->data.result, CURLE_OK);
            curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE,
                              &cl->r.status);
            done++;
        }
        if (running)
            curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    assert_int_equal(done, NRUNS);

    for (int i = 0; i < NRUNS; i++) {
        json_t *evs = sh_sse_parse(c[i].r.body, NULL), *d, *conv = NULL;
        size_t n = json_array_size(evs);
        char want[16];

        assert_int_equal(c[i].r.status, 200);
        assert_true(n >= 6);
        for (size_t k = 0; k < n; k++)
            assert_int_equal(
                json_integer_value(json_object_get(json_array_get(evs, k),
                                                   "id")),
                (json_int_t)k + 1);
        assert_string_equal(sh_ev_type(evs, 0), "run.started");
        assert_string_equal(sh_ev_type(evs, n - 1), "run.completed");
        d = json_object_get(json_array_get(evs, n - 1), "data");
        assert_string_equal(sh_str(d, "text"), "Hello world");
        /* Stored intact: the question and the whole answer. */
        d = json_object_get(json_array_get(evs, 0), "data");
        assert_int_equal(loom_store_conversation_get(
                             h.store, sh_str(d, "conversation_id"), &conv),
                         0);
        assert_int_equal(json_array_size(json_object_get(conv, "messages")),
                         2);
        snprintf(want, sizeof(want), "q%d", i);
        assert_string_equal(
            sh_str(json_array_get(json_object_get(conv, "messages"), 0),
                   "content"),
            want);
        assert_string_equal(sh_str(sh_last_message(conv), "content"),
                            "Hello world");
        assert_string_equal(sh_str(sh_last_message(conv), "status"), "ok");
        json_decref(conv);
        json_decref(evs);
        curl_multi_remove_handle(m, c[i].e);
        curl_easy_cleanup(c[i].e);
        sh_resp_free(&c[i].r);
    }
    curl_multi_cleanup(m);

    /* Exactly NRUNS conversations, walking the pages. */
    do {
        char path[128];
        snprintf(path, sizeof(path), "/v1/conversations?limit=100%s%s",
                 after ? "&after=" : "", after ? after : "");
        list = sh_json(&h, "GET", path, NULL, 200);
        total += json_array_size(json_object_get(list, "data"));
        free(after);
        after = json_is_true(json_object_get(list, "has_more"))
                    ? strdup(sh_str(list, "next"))
                    : NULL;
        json_decref(list);
    } while (after);
    assert_int_equal(total, NRUNS);
    assert_int_equal(fake_request_count(h.fake), NRUNS);
    sh_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_200_streams),
    };
    int rc;

    curl_global_init(CURL_GLOBAL_DEFAULT);
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
