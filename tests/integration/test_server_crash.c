/*
 * Crash safety: `loom serve` as a child process on a SQLite file, 50 runs
 * in flight (the fake delays each answer by 0.1 to 5 s), kill -9, then a
 * restart on the same file. The database must open cleanly (PRAGMA
 * integrity_check says ok) and every run that had completed before the
 * kill must be there, whole.
 */
#include "test_server_harness.h"

#include <sqlite3.h>

#define NRUNS 50

/* How many of the runs' conversations hold a stored answer (a turn that
 * reached the store whole). */
static size_t stored_runs(const sh *h, char conv_ids[][64])
{
    size_t n = 0;

    for (int i = 0; i < NRUNS; i++) {
        char path[128];
        sh_resp r;
        json_t *conv, *msgs;
        snprintf(path, sizeof(path), "/v1/conversations/%.63s", conv_ids[i]);
        if (sh_req(h, "GET", path, NULL, NULL, &r) == 200 &&
            (conv = json_loads(r.body, 0, NULL)) != NULL) {
            msgs = json_object_get(conv, "messages");
            if (json_array_size(msgs) == 2)
                n++;
            json_decref(conv);
        }
        sh_resp_free(&r);
    }
    return n;
}

static void test_kill9_and_restart(void **state)
{
    static char run_ids[NRUNS][64], conv_ids[NRUNS][64];
    loom_fake *fake;
    loom_buf script = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    char *cfg_path = test_tmp_path("crash.yaml");
    char *db = test_tmp_path("crash.db");
    char *yaml = NULL;
    int completed[NRUNS] = {0}, ncompleted = 0, st;
    sh_child ch;
    sh h;
    sqlite3 *sq = NULL;
    sqlite3_stmt *stmt = NULL;
    loom_store *store = NULL;
    long long end;
    size_t started;

    (void)state;
    memset(&h, 0, sizeof(h));
    loom_buf_puts(&script, "{\"loop\":true,\"responses\":[");
    for (int i = 0; i < 10; i++)
        loom_buf_printf(&script,
                        "%s{\"delay_ms\":%d,\"text\":[\"done \",\"%d\"]}",
                        i ? "," : "", i < 8 ? 100 + 100 * i : 5000, i);
    loom_buf_puts(&script, "]}");
    fake = fake_start_script(script.ptr);
    loom_buf_free(&script);
    assert_non_null(fake);
    unlink(db);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake: {base_url: '%s', api_key: k, "
                         "retries: {max: 0}}\n"
                         "models:\n"
                         "  fake/m: {upstream: fake-model}\n"
                         "agents:\n"
                         "  a: {model: fake/m, tools: []}\n"
                         "default_agent: a\n"
                         "server:\n"
                         "  listen: 127.0.0.1:0\n"
                         "  db: '%s'\n",
                         fake_base_url(fake), db) > 0);
    assert_int_equal(test_write_file(cfg_path, yaml, strlen(yaml)), 0);
    free(yaml);

    sh_serve(&ch, &h, cfg_path);
    for (int i = 0; i < NRUNS; i++) {
        char body[96];
        json_t *r;
        snprintf(body, sizeof(body),
                 "{\"input\":\"run %d\",\"background\":true}", i);
        r = sh_json(&h, "POST", "/v1/runs", body, 202);
        snprintf(run_ids[i], sizeof(run_ids[i]), "%s", sh_str(r, "id"));
        snprintf(conv_ids[i], sizeof(conv_ids[i]), "%s",
                 sh_str(r, "conversation_id"));
        json_decref(r);
    }
    /* Note which runs completed (and so were stored), then kill while the
     * slow ones are still in flight. */
    end = test_now_ms() + 60000;
    while (ncompleted < 10 && test_now_ms() < end) {
        for (int i = 0; i < NRUNS; i++) {
            char path[128];
            json_t *r;
            if (completed[i])
                continue;
            snprintf(path, sizeof(path), "/v1/runs/%.63s", run_ids[i]);
            r = sh_json(&h, "GET", path, NULL, 200);
            if (!strcmp(sh_str(r, "status"), "completed")) {
                completed[i] = 1;
                ncompleted++;
            }
            json_decref(r);
        }
    }
    assert_true(ncompleted >= 10);
    kill(ch.pid, SIGKILL);
    st = sh_reap(&ch, 20000);
    assert_int_equal(st, 128 + SIGKILL);
    /* Every model call the server made (one per started run, no retries),
     * answered or not: the fake records a request before it answers. */
    started = fake_request_count(fake);
    print_message("killed with %d of %d runs completed, %zu started\n",
                  ncompleted, NRUNS, started);

    /* The file opens cleanly. */
    assert_int_equal(sqlite3_open_v2(db, &sq, SQLITE_OPEN_READWRITE, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_prepare_v2(sq, "PRAGMA integrity_check", -1,
                                        &stmt, NULL),
                     SQLITE_OK);
    assert_int_equal(sqlite3_step(stmt), SQLITE_ROW);
    assert_string_equal((const char *)sqlite3_column_text(stmt, 0), "ok");
    sqlite3_finalize(stmt);
    sqlite3_close(sq);
    assert_int_equal(loom_store_open(&store, db), 0);
    assert_int_equal(loom_store_ping(store), 0);
    loom_store_free(store);

    /* The restarted server has every completed run, whole. */
    sh_serve(&ch, &h, cfg_path);
    json_decref(sh_json(&h, "GET", "/readyz", NULL, 200));
    /* The kill came while a run was in flight: a run had called the model
     * and was not stored, so more runs started than were stored. */
    assert_true(started > stored_runs(&h, conv_ids));
    for (int i = 0; i < NRUNS; i++) {
        char path[128], want[32];
        json_t *conv, *msgs;
        if (!completed[i])
            continue;
        snprintf(path, sizeof(path), "/v1/conversations/%.63s",
                 conv_ids[i]);
        conv = sh_json(&h, "GET", path, NULL, 200);
        msgs = json_object_get(conv, "messages");
        assert_int_equal(json_array_size(msgs), 2);
        snprintf(want, sizeof(want), "run %d", i);
        assert_string_equal(sh_str(json_array_get(msgs, 0), "content"),
                            want);
        assert_memory_equal(sh_str(json_array_get(msgs, 1), "content"),
                            "done ", 5);
        assert_string_equal(sh_str(json_array_get(msgs, 1), "status"), "ok");
        assert_string_equal(sh_str(json_array_get(msgs, 1), "run_id"),
                            run_ids[i]);
        json_decref(conv);
    }
    /* A new run works on the recovered file. */
    {
        json_t *r = sh_json(&h, "POST", "/v1/runs", "{\"input\":\"after\"}",
                            200);
        assert_string_equal(sh_str(r, "status"), "completed");
        json_decref(r);
    }
    sh_serve_end(&ch, fake, cfg_path, db);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_kill9_and_restart),
    };
    int rc;

    curl_global_init(CURL_GLOBAL_DEFAULT);
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
