/*
 * The server's front door under pressure (docs/server.md "Connections,
 * timeouts and the admission queue"): a slow-loris from one address does
 * not keep anyone else out, the header timeout cuts a silent half-open
 * connection but no stream or body that takes longer, and past
 * max_concurrent_runs requests wait in a bounded, fair queue, then get
 * 503 with Retry-After. Asynchronous clients are one curl multi handle
 * driven in the test's thread; nothing is timed.
 */
#include "test_server_harness.h"

#include "loom/accounts.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>

#define USAGE                                                                  \
    "\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7,"                  \
    "\"total_tokens\":12}"
#define HELLO "{\"text\":[\"Hello\",\" world\"]," USAGE "}"
#define HANG                                                                   \
    "{\"text\":[\"Partial \",\"answer\"],\"hang\":true,"                       \
    "\"hang_after_chunks\":3}"
#define TEXT(t) "{\"text\":[\"" t "\"]," USAGE "}"
#define ADMIN "adm-0123456789abcdef"

/* ---- raw sockets --------------------------------------------------------- */

/* A connection to the server from the loopback address `from`
 * ("127.0.0.1", "127.0.0.2", ...: all of 127/8 is loopback). */
static int connect_from(const sh *h, const char *from)
{
    struct sockaddr_in a;
    struct timeval tv = {30, 0};
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    assert_true(fd >= 0);
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    assert_int_equal(inet_pton(AF_INET, from, &a.sin_addr), 1);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    a.sin_port = htons((uint16_t)loom_server_port(h->srv));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

static void send_all(int fd, const char *text)
{
    assert_int_equal(send(fd, text, strlen(text), MSG_NOSIGNAL),
                     (ssize_t)strlen(text));
}

/* Reads until the server closes; 1 when it did (0 when it did not within
 * the socket's 30 s). The answer, if any, is kept in buf. */
static int read_to_close(int fd, char *buf, size_t cap)
{
    size_t len = 0;
    ssize_t n;
    char sink[512];

    for (;;) {
        n = recv(fd, len + 1 < cap ? buf + len : sink,
                 len + 1 < cap ? cap - len - 1 : sizeof(sink), 0);
        if (n <= 0)
            break;
        if (len + 1 < cap)
            len += (size_t)n;
    }
    if (cap)
        buf[len < cap ? len : cap - 1] = '\0';
    return n == 0;
}

/* ---- requests from another address, and asynchronous ones --------------- */

/* GET path from the address `from`; the status (0: no answer). */
static long get_from(const sh *h, const char *from, const char *path)
{
    sh_resp r;
    CURL *e;
    char iface[64];
    long status = 0;

    memset(&r, 0, sizeof(r));
    e = sh_easy(h, "GET", path, NULL, NULL, &r);
    snprintf(iface, sizeof(iface), "host!%s", from);
    curl_easy_setopt(e, CURLOPT_INTERFACE, iface);
    curl_easy_setopt(e, CURLOPT_TIMEOUT, 20L);
    if (curl_easy_perform(e) == CURLE_OK)
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(e);
    sh_resp_free(&r);
    return status;
}

typedef struct {
    sh_resp r;
    CURL *e;
    struct curl_slist *hdrs;
    int done;
} async_req;

/* Starts POST /v1/runs with body on m, as the caller with key (NULL:
 * none). */
static void async_post(const sh *h, CURLM *m, async_req *a, const char *key,
                       const char *body)
{
    char auth[256];

    memset(a, 0, sizeof(*a));
    a->hdrs = curl_slist_append(NULL, "Content-Type: application/json");
    if (key) {
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", key);
        a->hdrs = curl_slist_append(a->hdrs, auth);
    }
    a->e = sh_easy(h, "POST", "/v1/runs", NULL, a->hdrs, &a->r);
    curl_easy_setopt(a->e, CURLOPT_COPYPOSTFIELDS, body);
    curl_easy_setopt(a->e, CURLOPT_PRIVATE, a);
    curl_multi_add_handle(m, a->e);
}

static void async_free(CURLM *m, async_req *a)
{
    if (a->e) {
        curl_multi_remove_handle(m, a->e);
        curl_easy_cleanup(a->e);
    }
    curl_slist_free_all(a->hdrs);
    sh_resp_free(&a->r);
    memset(a, 0, sizeof(*a));
}

/* Moves every transfer on m a step (waiting up to 20 ms for one). */
static void pump(CURLM *m)
{
    CURLMsg *msg;
    int running, left;

    assert_int_equal(curl_multi_perform(m, &running), CURLM_OK);
    while ((msg = curl_multi_info_read(m, &left)) != NULL) {
        async_req *a = NULL;
        if (msg->msg != CURLMSG_DONE)
            continue;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&a);
        if (msg->data.result == CURLE_OK)
            curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE,
                              &a->r.status);
        a->done = 1;
    }
    curl_multi_poll(m, NULL, 0, 20, NULL);
}

/* The value of the gauge `name` in /metrics. */
static long metric(const sh *h, const char *name)
{
    sh_resp r;
    char pat[128];
    const char *p;
    long v;

    assert_int_equal(sh_req(h, "GET", "/metrics", NULL, NULL, &r), 200);
    snprintf(pat, sizeof(pat), "\n%s ", name);
    p = strstr(r.body, pat);
    assert_non_null(p);
    v = strtol(p + strlen(pat), NULL, 10);
    sh_resp_free(&r);
    return v;
}

/* Pumps m until `want` requests wait for a run slot. */
static void until_queued(const sh *h, CURLM *m, long want)
{
    long long end = test_now_ms() + 30000;

    while (metric(h, "loom_runs_queued") != want) {
        if (test_now_ms() > end)
            fail_msg("%ld requests never waited for a slot", want);
        pump(m);
    }
}

/* Pumps m until every request of as[0..n) is done. */
static void until_done(CURLM *m, async_req *as, size_t n)
{
    long long end = test_now_ms() + 60000;

    for (;;) {
        size_t i;
        for (i = 0; i < n && as[i].done; i++)
            ;
        if (i == n)
            return;
        if (test_now_ms() > end)
            fail_msg("a queued request never ended");
        pump(m);
    }
}

static void cancel(const sh *h, const char *key, const json_t *run)
{
    char path[128];

    snprintf(path, sizeof(path), "/v1/runs/%s/cancel", sh_str(run, "id"));
    json_decref(sh_json_auth(h, key, NULL, "POST", path, NULL, 200));
}

static void check_busy(long status, const sh_resp *r)
{
    char hv[32];

    assert_int_equal(status, 503);
    sh_check_error(r->body, "server_busy");
    assert_non_null(sh_header(r, "Retry-After", hv, sizeof(hv)));
    assert_true(atoi(hv) >= 1);
}

/* ---- slow clients -------------------------------------------------------- */

#define LORIS 1100
#define PER_ADDRESS 100

/*
 * One address opens 1,100 connections and sends each a request line and
 * one header, then nothing. Every connection past its 100 is closed at
 * once; its 100 stay held; anyone else (127.0.0.2) still gets /healthz
 * and /metrics, although 1,100 is more than max_connections.
 */
static void test_slowloris(void **state)
{
    static int fds[LORIS];
    sh h;
    int closed = 0;
    long long end;

    (void)state;
    assert_int_equal(loom_server_raise_fd_limit(NULL), 0);
    sh_start(&h, "{\"loop\":true,\"responses\":[" HELLO "]}", NULL,
             "  max_connections: 1024\n"
             "  max_connections_per_address: 100\n"
             "  header_timeout_ms: 60000\n"
             "  read_timeout_ms: 60000\n");
    for (int i = 0; i < LORIS; i++) {
        fds[i] = connect_from(&h, "127.0.0.1");
        send_all(fds[i], "GET /healthz HTTP/1.1\r\nHost: x\r\n");
    }
    /* The server has taken them all once it has closed all but 100. */
    end = test_now_ms() + 30000;
    while (closed < LORIS - PER_ADDRESS) {
        struct pollfd p[LORIS];
        closed = 0;
        for (int i = 0; i < LORIS; i++) {
            p[i].fd = fds[i];
            p[i].events = POLLIN | POLLRDHUP;
            p[i].revents = 0;
        }
        assert_true(poll(p, LORIS, 100) >= 0);
        for (int i = 0; i < LORIS; i++)
            closed += (p[i].revents & (POLLIN | POLLRDHUP | POLLHUP)) != 0;
        if (test_now_ms() > end)
            fail_msg("only %d of the connections were closed", closed);
    }
    print_message("%d connections held, %d closed\n", LORIS - closed, closed);
    assert_int_equal(closed, LORIS - PER_ADDRESS);
    assert_int_equal(get_from(&h, "127.0.0.2", "/healthz"), 200);
    assert_int_equal(get_from(&h, "127.0.0.3", "/metrics"), 200);
    /* The address holding 100 gets no more. */
    assert_int_equal(get_from(&h, "127.0.0.1", "/healthz"), 0);
    for (int i = 0; i < LORIS; i++)
        close(fds[i]);
    sh_free(&h);
}

/*
 * With a one-second header timeout, a connection that sends half its
 * headers and goes silent is cut; a streamed run whose chunks come 1.5 s
 * apart completes, and so does a request whose body pauses for as long
 * as that stream takes (its headers were in: read_timeout_ms applies).
 */
static void test_header_timeout(void **state)
{
    static const char body[] = "{\"input\":\"x\"}";
    sh h;
    sh_resp r;
    char head[256], buf[4096];
    int silent, slow;

    (void)state;
    sh_start(&h,
             "{\"responses\":[{\"text\":[\"a\",\"b\",\"c\"],"
             "\"chunk_delay_ms\":1500}," HELLO "]}",
             NULL,
             "  header_timeout_ms: 1000\n"
             "  read_timeout_ms: 60000\n");
    silent = connect_from(&h, "127.0.0.1");
    send_all(silent, "GET /healthz HTTP/1.1\r\nHost: x\r\n");
    slow = connect_from(&h, "127.0.0.1");
    snprintf(head, sizeof(head),
             "POST /v1/runs HTTP/1.1\r\nHost: x\r\n"
             "Content-Type: application/json\r\nContent-Length: %zu\r\n"
             "Connection: close\r\n\r\n%.5s",
             strlen(body), body);
    send_all(slow, head);
    assert_int_equal(sh_req(&h, "POST", "/v1/runs",
                            "{\"input\":\"x\",\"stream\":true}", NULL, &r),
                     200);
    assert_non_null(strstr(r.body, "run.completed"));
    assert_non_null(strstr(r.body, "\"c\""));
    sh_resp_free(&r);
    /* The stream took longer than the header timeout: the silent one is
     * gone, without an answer. */
    assert_int_equal(read_to_close(silent, buf, sizeof(buf)), 1);
    assert_string_equal(buf, "");
    close(silent);
    send_all(slow, body + 5);
    assert_int_equal(read_to_close(slow, buf, sizeof(buf)), 1);
    assert_memory_equal(buf, "HTTP/1.1 200", 12);
    assert_non_null(strstr(buf, "Hello world"));
    close(slow);
    sh_free(&h);
}

/* ---- the admission queue ------------------------------------------------- */

/*
 * One slot, a queue of two: with a run holding the slot, a streamed and a
 * blocking request wait (the server answers meanwhile), a third is
 * refused with 503 and Retry-After, and both complete once the slot is
 * free; a client that leaves while it waits is dropped from the queue.
 */
static void test_queue(void **state)
{
    async_req q[3];
    CURLM *m = curl_multi_init();
    sh h;
    sh_resp r;
    json_t *holder, *j;

    (void)state;
    sh_start(&h, "{\"responses\":[" HANG "," HELLO "," HELLO "]}", NULL,
             "  max_concurrent_runs: 1\n"
             "  queue_max: 2\n"
             "  queue_wait_ms: 600000\n");
    holder = sh_json(&h, "POST", "/v1/runs",
                     "{\"input\":\"x\",\"background\":true}", 202);
    /* One that leaves while it waits is dropped. */
    async_post(&h, m, &q[0], NULL, "{\"input\":\"gone\"}");
    until_queued(&h, m, 1);
    async_free(m, &q[0]);
    until_queued(&h, m, 0);

    async_post(&h, m, &q[0], NULL, "{\"input\":\"s\",\"stream\":true}");
    until_queued(&h, m, 1);
    async_post(&h, m, &q[1], NULL, "{\"input\":\"b\"}");
    until_queued(&h, m, 2);
    check_busy(sh_req(&h, "POST", "/v1/runs", "{\"input\":\"c\"}", NULL, &r),
               &r);
    sh_resp_free(&r);
    assert_int_equal(sh_req(&h, "GET", "/healthz", NULL, NULL, &r), 200);
    sh_resp_free(&r);
    /* Nothing of the waiting ones reached the model yet. */
    assert_true(fake_request_count(h.fake) <= 1);
    cancel(&h, NULL, holder);
    until_done(m, q, 2);
    assert_int_equal(q[0].r.status, 200);
    assert_non_null(strstr(q[0].r.body, "run.completed"));
    assert_non_null(strstr(q[0].r.body, "Hello"));
    assert_int_equal(q[1].r.status, 200);
    j = json_loads(q[1].r.body, 0, NULL);
    assert_non_null(j);
    assert_string_equal(sh_str(j, "status"), "completed");
    assert_string_equal(sh_str(j, "text"), "Hello world");
    json_decref(j);
    assert_int_equal(metric(&h, "loom_runs_queued"), 0);
    async_free(m, &q[0]);
    async_free(m, &q[1]);
    json_decref(holder);
    curl_multi_cleanup(m);
    sh_free(&h);
}

/* A request that waits past queue_wait_ms gets 503 with Retry-After. */
static void test_queue_wait_over(void **state)
{
    sh h;
    sh_resp r;
    json_t *holder;

    (void)state;
    sh_start(&h, "{\"responses\":[" HANG "," HELLO "]}", NULL,
             "  max_concurrent_runs: 1\n"
             "  queue_wait_ms: 1000\n");
    holder = sh_json(&h, "POST", "/v1/runs",
                     "{\"input\":\"x\",\"background\":true}", 202);
    check_busy(sh_req(&h, "POST", "/v1/runs", "{\"input\":\"y\"}", NULL, &r),
               &r);
    assert_non_null(strstr(r.body, "queue_wait_ms"));
    sh_resp_free(&r);
    assert_true(fake_request_count(h.fake) <= 1);
    cancel(&h, NULL, holder);
    json_decref(holder);
    /* The slot is free again. */
    json_decref(sh_json(&h, "POST", "/v1/runs", "{\"input\":\"z\"}", 200));
    sh_free(&h);
}

/* The server lines of one run slot and a queue of 8, at most 4 of them
 * one caller's, then an auth section in mode keys. */
#define FAIR_SERVER                                                            \
    "  max_concurrent_runs: 1\n"                                               \
    "  queue_max: 8\n"                                                         \
    "  queue_max_per_identity: 4\n"                                            \
    "  queue_wait_ms: 600000\n"                                                \
    "auth:\n"                                                                  \
    "  mode: keys\n"                                                           \
    "  admin_key: " ADMIN "\n"

static void key_for(sh *h, const char *user, char key[LOOM_KEY_SIZE])
{
    loom_key_spec spec = {
        .version = LOOM_KEY_SPEC_VERSION, .user = user, .workspace = "acme"};

    if (loom_store_key_create(h->store, &spec, key, NULL) != 0)
        fail_msg("key: %s", loom_error_last());
}

/*
 * Fairness: alice has four requests waiting, the most one caller may (a
 * fifth is refused although the queue has room); bob's one request,
 * queued after all of hers, runs second, not fifth: a freed slot goes to
 * each caller in turn. With one slot the runs call the model one after
 * the other, so the answer a run got says when it ran.
 */
static void test_queue_fairness(void **state)
{
    async_req q[5];
    CURLM *m = curl_multi_init();
    char alice[LOOM_KEY_SIZE], bob[LOOM_KEY_SIZE];
    sh h;
    sh_resp r;
    json_t *holder, *j;

    (void)state;
    sh_start(&h,
             "{\"responses\":[" HANG "," TEXT("R1") "," TEXT("R2") "," TEXT(
                 "R3") "," TEXT("R4") "," TEXT("R5") "]}",
             NULL, FAIR_SERVER);
    key_for(&h, "alice", alice);
    key_for(&h, "bob", bob);
    holder = sh_json_auth(&h, alice, NULL, "POST", "/v1/runs",
                          "{\"input\":\"x\",\"background\":true}", 202);
    for (int i = 0; i < 4; i++) {
        async_post(&h, m, &q[i], alice, "{\"input\":\"a\"}");
        until_queued(&h, m, i + 1);
    }
    check_busy(sh_req_auth(&h, alice, NULL, "POST", "/v1/runs",
                           "{\"input\":\"a\"}", &r),
               &r);
    assert_non_null(strstr(r.body, "queue_max_per_identity"));
    sh_resp_free(&r);
    async_post(&h, m, &q[4], bob, "{\"input\":\"b\"}");
    until_queued(&h, m, 5);
    cancel(&h, alice, holder);
    until_done(m, q, 5);
    for (int i = 0; i < 5; i++)
        assert_int_equal(q[i].r.status, 200);
    j = json_loads(q[4].r.body, 0, NULL);
    assert_non_null(j);
    assert_string_equal(sh_str(j, "text"), "R2");
    json_decref(j);
    for (int i = 0; i < 5; i++)
        async_free(m, &q[i]);
    json_decref(holder);
    curl_multi_cleanup(m);
    sh_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slowloris),
        cmocka_unit_test(test_header_timeout),
        cmocka_unit_test(test_queue),
        cmocka_unit_test(test_queue_wait_over),
        cmocka_unit_test(test_queue_fairness),
    };

    int rc;

    curl_global_init(CURL_GLOBAL_DEFAULT);
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
