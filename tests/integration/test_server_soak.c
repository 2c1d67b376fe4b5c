/*
 * Soak: 2,000 streaming runs through `loom serve` (a child process, so its
 * threads, descriptors and memory are its own) against the fake upstream,
 * in waves of 400 at once; in every wave one client in eight goes away in
 * the middle of its stream. After each wave the test waits until the
 * server is quiet (no run and no stream active, then its thread count
 * unchanged over several polls; bounded), and compares what the server
 * holds with what it held after the first wave: threads, open descriptors
 * (/proc/PID/fd) and resident memory may not grow beyond the slack below.
 * Every run whose stream ended with run.completed must be stored: its
 * conversation has the question and the whole answer. No timing is
 * asserted; the waits are bounded only so that a leak fails instead of
 * hanging.
 */
#include "test_server_harness.h"

#include <dirent.h>

#define WAVES 5
#define PER_WAVE 400
#define QUITTER_EVERY 8 /* one client in 8 leaves mid-stream */

/* How much the server may hold after the last wave beyond what it held
 * after the first: a few threads that a pool may start late, descriptors
 * for the store's files and a spare connection, and memory that fills
 * over the first waves and then stays: the allocator's free lists and
 * SQLite's page cache as the store grows (measured at this commit: about
 * 20 MB over the first three waves, then flat). The table of ended runs
 * is kept at 100 (keep_finished_runs), fewer than one wave, so it is full
 * already at the baseline. Under a sanitizer RSS says nothing (ASan keeps
 * freed memory in quarantine); its leak checker covers memory there. */
#define SLACK_THREADS 4
/* Each of the server's WORKERS keeps up to KEEP_IDLE idle upstream
 * connections for reuse (src/core/fiber.c KEEP_CONNECTIONS): a wave
 * fills them as far as its peak of model calls in flight on the worker
 * went, which under a sanitizer's slowdown may be less in the first wave
 * than in a later one. That bounded pool is allowed on top: a leak of a
 * descriptor per stream, or per client that left, is hundreds a wave. */
#define WORKERS 2
#define KEEP_IDLE 64
#define SLACK_FDS (8 + WORKERS * KEEP_IDLE)
#define SLACK_RSS_KB (32 * 1024)
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CHECK_RSS 0
#else
#define CHECK_RSS 1
#endif

typedef struct {
    sh_abort_ctx a; /* a.until: NULL for a client that stays */
    CURL *e;
    int completed; /* the stream ended with run.completed */
} client;

typedef struct {
    long threads, fds, rss_kb;
} usage;

static usage usage_of(pid_t pid)
{
    usage u = {-1, 0, -1};
    char path[64], line[256];
    FILE *f;
    DIR *d;
    struct dirent *de;

    snprintf(path, sizeof(path), "/proc/%ld/status", (long)pid);
    f = fopen(path, "r");
    assert_non_null(f);
    while (fgets(line, sizeof(line), f)) {
        if (!strncmp(line, "Threads:", 8))
            u.threads = strtol(line + 8, NULL, 10);
        else if (!strncmp(line, "VmRSS:", 6))
            u.rss_kb = strtol(line + 6, NULL, 10);
    }
    fclose(f);
    snprintf(path, sizeof(path), "/proc/%ld/fd", (long)pid);
    d = opendir(path);
    assert_non_null(d);
    while ((de = readdir(d)) != NULL)
        u.fds += de->d_name[0] != '.';
    closedir(d);
    assert_true(u.threads > 0 && u.rss_kb > 0);
    return u;
}

/* The value of a gauge in the server's /metrics, or -1. */
static long gauge(const sh *h, const char *name)
{
    sh_resp r;
    char key[96];
    const char *p;
    long v = -1;

    assert_int_equal(sh_req(h, "GET", "/metrics", NULL, NULL, &r), 200);
    snprintf(key, sizeof(key), "\n%s ", name);
    p = r.body ? strstr(r.body, key) : NULL;
    if (p)
        v = strtol(p + strlen(key), NULL, 10);
    sh_resp_free(&r);
    return v;
}

/* Waits until the server is quiet: no run or stream active, then the
 * same thread count five polls in a row (threads of ended runs take a
 * moment to go). Bounded: a server that never settles fails. */
static usage settle(const sh *h, pid_t pid)
{
    long long end = test_now_ms() + 30000;
    usage u = usage_of(pid);
    int same = 0;

    while (gauge(h, "loom_runs_active") != 0 ||
           gauge(h, "loom_streams_active") != 0) {
        if (test_now_ms() > end)
            fail_msg("runs or streams still active after 30 s");
        usleep(20 * 1000);
    }
    while (same < 5) {
        usage v;

        if (test_now_ms() > end)
            fail_msg("the server's threads did not settle in 30 s");
        usleep(50 * 1000);
        v = usage_of(pid);
        same = v.threads == u.threads ? same + 1 : 0;
        u = v;
    }
    return u;
}

/* Runs one wave of PER_WAVE streams (the wave's w-th); every client that
 * stays must see its run completed. Returns the completed count. */
static int wave(const sh *h, client *c, int w)
{
    CURLM *m = curl_multi_init();
    int running = 1, done = 0, completed = 0;
    char body[64];

    assert_non_null(m);
    for (int i = 0; i < PER_WAVE; i++) {
        memset(&c[i], 0, sizeof(c[i]));
        snprintf(body, sizeof(body), "{\"input\":\"q%d\",\"stream\":true}",
                 w * PER_WAVE + i);
        c[i].e = sh_easy(h, "POST", "/v1/runs", body, NULL, &c[i].a.r);
        curl_easy_setopt(c[i].e, CURLOPT_COPYPOSTFIELDS, body);
        if (i % QUITTER_EVERY == 0) {
            /* Leaves once the answer has started. */
            c[i].a.until = "message.delta";
            curl_easy_setopt(c[i].e, CURLOPT_WRITEFUNCTION, sh_abort_on);
            curl_easy_setopt(c[i].e, CURLOPT_WRITEDATA, &c[i].a);
        }
        curl_multi_add_handle(m, c[i].e);
    }
    while (running) {
        CURLMsg *msg;
        int left;

        assert_int_equal(curl_multi_perform(m, &running), CURLM_OK);
        while ((msg = curl_multi_info_read(m, &left)) != NULL)
            done += msg->msg == CURLMSG_DONE;
        if (running)
            curl_multi_poll(m, NULL, 0, 100, NULL);
    }
    assert_int_equal(done, PER_WAVE);
    for (int i = 0; i < PER_WAVE; i++) {
        json_t *evs = sh_sse_parse(c[i].a.r.body ? c[i].a.r.body : "", NULL);
        size_t n = json_array_size(evs);

        c[i].completed =
            n > 0 && !strcmp(sh_ev_type(evs, n - 1), "run.completed");
        if (!c[i].a.until && !c[i].completed)
            fail_msg("wave %d, client %d: no run.completed; the stream "
                     "ended after %s",
                     w + 1, i, n ? sh_ev_type(evs, n - 1) : "nothing");
        completed += c[i].completed;
        json_decref(evs);
    }
    curl_multi_cleanup(m);
    return completed;
}

/* Every completed run of the wave is stored: its conversation holds the
 * question and the whole answer. Frees the wave's clients. */
static void check_stored(const sh *h, client *c, int w)
{
    for (int i = 0; i < PER_WAVE; i++) {
        if (c[i].completed) {
            json_t *evs = sh_sse_parse(c[i].a.r.body, NULL), *conv;
            const json_t *d = json_object_get(json_array_get(evs, 0), "data");
            char path[160], want[16];

            snprintf(path, sizeof(path), "/v1/conversations/%s",
                     sh_str(d, "conversation_id"));
            conv = sh_json(h, "GET", path, NULL, 200);
            snprintf(want, sizeof(want), "q%d", w * PER_WAVE + i);
            assert_string_equal(
                sh_str(json_array_get(json_object_get(conv, "messages"), 0),
                       "content"),
                want);
            assert_string_equal(sh_str(sh_last_message(conv), "content"),
                                "Hello soak world");
            json_decref(conv);
            json_decref(evs);
        }
        curl_easy_cleanup(c[i].e);
        sh_resp_free(&c[i].a.r);
    }
}

/* The conversations the server lists (all pages). */
static size_t count_conversations(const sh *h)
{
    char *after = NULL;
    size_t total = 0;

    do {
        char path[160];
        json_t *list;

        snprintf(path, sizeof(path), "/v1/conversations?limit=100%s%s",
                 after ? "&after=" : "", after ? after : "");
        list = sh_json(h, "GET", path, NULL, 200);
        total += json_array_size(json_object_get(list, "data"));
        free(after);
        after = json_is_true(json_object_get(list, "has_more"))
                    ? strdup(sh_str(list, "next"))
                    : NULL;
        json_decref(list);
    } while (after);
    return total;
}

static void test_soak_waves(void **state)
{
    static client c[PER_WAVE];
    loom_fake *fake;
    sh h;
    sh_child ch;
    char *cfg = test_tmp_path("soak.yaml"), *db = test_tmp_path("soak.db");
    char *yaml = NULL;
    usage base = {0}, now;
    int completed = 0;

    (void)state;
    memset(&h, 0, sizeof(h));
    fake = fake_start_script(
        "{\"loop\":true,\"responses\":[{\"text\":[\"Hello\",\" \",\"soak\","
        "\" \",\"world\"],\"chunk_delay_ms\":20,\"usage\":{\"prompt_tokens\":"
        "3,\"completion_tokens\":5,\"total_tokens\":8}}]}");
    assert_non_null(fake);
    unlink(db);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake: {base_url: '%s', api_key: k, "
                         "retries: {max: 0}}\n"
                         "routing: {retries: 0}\n"
                         "server:\n"
                         "  listen: 127.0.0.1:0\n"
                         "  workers: %d\n"
                         "  db: '%s'\n"
                         "  max_concurrent_runs: 1000\n"
                         "  max_connections: 4096\n"
                         "  max_connections_per_address: 0\n"
                         "  keep_finished_runs: 100\n",
                         fake_base_url(fake), WORKERS, db) > 0);
    assert_int_equal(test_write_file(cfg, yaml, strlen(yaml)), 0);
    free(yaml);
    sh_serve(&ch, &h, cfg);

    for (int w = 0; w < WAVES; w++) {
        completed += wave(&h, c, w);
        check_stored(&h, c, w);
        now = settle(&h, ch.pid);
        if (w == 0) {
            base = now;
            continue;
        }
        if (now.threads > base.threads + SLACK_THREADS ||
            now.fds > base.fds + SLACK_FDS ||
            (CHECK_RSS && now.rss_kb > base.rss_kb + SLACK_RSS_KB))
            fail_msg("wave %d: threads %ld, descriptors %ld, RSS %ld KB; "
                     "after wave 1: %ld, %ld, %ld KB",
                     w + 1, now.threads, now.fds, now.rss_kb, base.threads,
                     base.fds, base.rss_kb);
    }
    /* Every completed run is listed too (quitters' runs may be as well). */
    assert_true(completed >= WAVES * (PER_WAVE - PER_WAVE / QUITTER_EVERY));
    assert_true(count_conversations(&h) >= (size_t)completed);
    sh_serve_end(&ch, fake, cfg, db);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_soak_waves),
    };
    int rc;

    curl_global_init(CURL_GLOBAL_DEFAULT);
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
