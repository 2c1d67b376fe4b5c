/*
 * web_search's documents through the run loop: the tool reports the
 * results the model was shown (loom_tool_ctx.documents), the run adds
 * them to its seen documents and gives their ids back as excluded_ids on
 * the next search, so the backend's same answer shows new results. A
 * fake SearXNG on 127.0.0.1 answers every query with the same four
 * results; an in-process mock model makes the calls.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "loom/run.h"
#include "tools/web_search.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the fake SearXNG */

static char *answer_body;

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c,
                                  const char *url, const char *method,
                                  const char *version,
                                  const char *upload_data,
                                  size_t *upload_size, void **con_cls)
{
    struct MHD_Response *resp;
    enum MHD_Result r;

    (void)cls;
    (void)url;
    (void)method;
    (void)version;
    (void)upload_data;
    (void)upload_size;
    (void)con_cls;
    resp = MHD_create_response_from_buffer(strlen(answer_body), answer_body,
                                           MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(resp, "Content-Type", "application/json");
    r = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return r;
}

static struct MHD_Daemon *srv_start(int *port)
{
    struct sockaddr_in sin;
    const union MHD_DaemonInfo *info;
    struct MHD_Daemon *d;

    memset(&sin, 0, sizeof(sin));
    sin.sin_family = AF_INET;
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION |
                             MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO,
                         0, NULL, NULL, on_request, NULL,
                         MHD_OPTION_SOCK_ADDR, &sin, MHD_OPTION_END);
    assert_non_null(d);
    info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    assert_non_null(info);
    *port = info->port;
    return d;
}

/* ---- the mock model: one web_search call per turn, then an answer */

static const char *const queries[] = {"{\"query\":\"first\"}",
                                      "{\"query\":\"second\"}"};

typedef struct {
    loom_provider base;
    int next;
} mock;

static int mock_complete(loom_provider *p, const loom_llm_request *req,
                         loom_llm_event_cb cb, void *payload,
                         loom_llm_response *resp, loom_cancel *cancel)
{
    mock *m = (mock *)p;
    int turn = m->next++;

    (void)req;
    (void)cb;
    (void)payload;
    (void)cancel;
    if (turn < 2) {
        char id[16];
        snprintf(id, sizeof(id), "s%d", turn + 1);
        resp->tool_calls = calloc(1, sizeof(loom_tool_call));
        resp->tool_calls_len = 1;
        resp->tool_calls[0].id = strdup(id);
        resp->tool_calls[0].name = strdup("web_search");
        resp->tool_calls[0].arguments = strdup(queries[turn]);
        resp->finish_reason = strdup("tool_calls");
    } else {
        resp->text = strdup("done");
        resp->finish_reason = strdup("stop");
    }
    return 0;
}

static void mock_free(loom_provider *p)
{
    (void)p;
}

static const loom_provider_vtable mock_vt = {.version =
                                                 LOOM_PROVIDER_VTABLE_VERSION,
                                             .complete = mock_complete,
                                             .free = mock_free};

static const char *result_of(loom_run *run, const char *id)
{
    const loom_messages *m = loom_run_messages(run);

    for (size_t j = 0; j < m->len; j++)
        if (m->items[j].role == LOOM_ROLE_TOOL &&
            strcmp(m->items[j].tool_call_id, id) == 0)
            return m->items[j].content;
    return NULL;
}

static void test_seen_results_are_excluded(void **state)
{
    json_t *results = json_array(), *root, *settings, *docs1, *docs2;
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_tool_registry *reg;
    loom_messages hist = {0};
    const json_t *records, *docs;
    char base[64], id[LOOM_WEB_SEARCH_ID_SIZE];
    struct MHD_Daemon *d;
    loom_run *run;
    mock m;
    int port;
    (void)state;

    for (int i = 1; i <= 4; i++)
        json_array_append_new(
            results, json_pack("{s:o, s:s, s:s}", "url",
                               json_sprintf("https://s%d.example/", i),
                               "title", "T", "content", "C"));
    root = json_pack("{s:s, s:o}", "query", "q", "results", results);
    answer_body = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    d = srv_start(&port);
    snprintf(base, sizeof(base), "http://127.0.0.1:%d", port);
    settings = json_pack("{s:{s:s, s:s, s:i}}", "web_search", "backend",
                         "searxng", "base_url", base, "max_results", 2);

    assert_int_equal(loom_tool_registry_new(&reg), 0);
    assert_int_equal(loom__tools_add_web_search(reg), 0);
    memset(&m, 0, sizeof(m));
    m.base.vt = &mock_vt;
    ro.provider = &m.base;
    ro.upstream_model = "m";
    ro.tools = reg;
    ro.tool_settings = settings;
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "hi"), 0);
    assert_int_equal(loom_run_new(&run, &ro, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);

    /* The first search showed results 1 and 2, the second 3 and 4. */
    assert_int_equal(loom__web_search_documents(&docs1, result_of(run, "s1")),
                     0);
    assert_int_equal(loom__web_search_documents(&docs2, result_of(run, "s2")),
                     0);
    assert_int_equal(json_array_size(docs1), 2);
    assert_int_equal(json_array_size(docs2), 2);
    loom__web_search_url_id("https://s3.example/", id);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(docs2, 0), "id")),
        id);
    assert_non_null(strstr(result_of(run, "s2"),
                           "2 results were left out because their ids are "
                           "in excluded_ids"));
    /* The run keeps all four, as the tool described them. */
    docs = loom_run_documents(run);
    assert_int_equal(json_array_size(docs), 4);
    assert_true(json_equal(json_array_get(docs, 0),
                           json_array_get(docs1, 0)));
    assert_true(json_equal(json_array_get(docs, 3),
                           json_array_get(docs2, 1)));
    records = loom_run_tool_records(run);
    assert_int_equal(json_array_size(records), 2);
    assert_int_equal(json_array_size(json_object_get(
                         json_array_get(records, 1), "documents")),
                     2);
    assert_int_equal(json_integer_value(json_object_get(
                         json_array_get(records, 1), "excluded_ids_added")),
                     2);

    json_decref(docs1);
    json_decref(docs2);
    loom_run_free(run);
    loom_messages_free(&hist);
    loom_tool_registry_free(reg);
    json_decref(settings);
    MHD_stop_daemon(d);
    free(answer_body);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seen_results_are_excluded),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
