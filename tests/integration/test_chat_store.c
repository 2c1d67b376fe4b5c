/*
 * Integration tests of how chat completions store a new conversation
 * (docs/server.md "A new conversation's store writes"): created with the
 * turn's save, streamed or not. Both leave the same rows (conversation,
 * messages, usage, run, owner); a stream's conversation, named on its
 * first chunk, is not in the store then and is stored (cancelled) under
 * that id when its client leaves; a non-streamed one is not in the store
 * while its model call runs, and is stored (cancelled) when its client
 * leaves then; the conversation a non-streamed answer names goes on; a
 * sub-agent's run, stored before its top turn, creates that conversation
 * first.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "store_fixture.h"
#include "test_server_harness.h"

/* "hold" in the last message: the answer's first chunk, then nothing
 * until the client leaves; else "Hi there." with usage. */
static const char *const SCRIPT =
    "{\"rules\": [{\"match\": {\"last_message\": \"hold\"}, \"loop\": true, "
    "\"responses\": [{\"text\": [\"Hi\", \" there.\"], \"hang\": true, "
    "\"hang_after_chunks\": 2}]}], \"loop\": true, \"responses\": "
    "[{\"text\": [\"Hi\", \" there.\"], \"usage\": {\"prompt_tokens\": 10, "
    "\"completion_tokens\": 2, \"total_tokens\": 12}}]}";

#define BODY(stream, text)                                                     \
    "{\"model\":\"fake/m\",\"user\":\"ann\"," stream "\"messages\":"           \
    "[{\"role\":\"user\",\"content\":\"" text "\"}]}"

/* One completion's conversation id (its X-Loom-Conversation-Id) into id. */
static void complete(const sh *h, const char *body, char *id, size_t cap)
{
    sh_resp r;

    assert_int_equal(sh_req(h, "POST", "/v1/chat/completions", body, NULL, &r),
                     200);
    assert_non_null(sh_header(&r, "X-Loom-Conversation-Id", id, cap));
    sh_resp_free(&r);
}

static void expect_owner(const sh *h, const char *id, const char *owner,
                         long long messages)
{
    loom_conversation_info info;

    memset(&info, 0, sizeof(info));
    assert_int_equal(loom_store_conversation_info(h->store, id, &info), 0);
    assert_string_equal(info.user_id, owner);
    assert_int_equal(info.message_count, messages);
    loom_conversation_info_clear(&info);
}

static void test_same_rows_streamed_or_not(void **state)
{
    char plain[128], streamed[128], body[512];
    sh h;

    (void)state;
    sh_start(&h, SCRIPT, NULL, NULL);
    complete(&h, BODY("", "hello"), plain, sizeof(plain));
    complete(&h, BODY("\"stream\":true,", "hello"), streamed, sizeof(streamed));
    assert_string_not_equal(plain, streamed);
    expect_owner(&h, plain, "ann", 2);
    expect_owner(&h, streamed, "ann", 2);
    test_db_same_conversation(h.db, plain, streamed);

    /* The conversation the answer named goes on. */
    snprintf(body, sizeof(body),
             "{\"model\":\"fake/m\",\"user\":\"ann\",\"conversation_id\":"
             "\"%s\",\"messages\":[{\"role\":\"user\",\"content\":\"more\"}]}",
             plain);
    complete(&h, body, streamed, sizeof(streamed));
    assert_string_equal(streamed, plain);
    expect_owner(&h, plain, "ann", 4);
    sh_free(&h);
}

/* A stream's client looks in the store at its first chunk, then leaves:
 * the model call has not ended (the fake holds it), so its conversation is
 * not stored yet. */
typedef struct {
    sh_resp r;
    const sh *h;
    char id[128];
    int looked, found;
} first_chunk;

static size_t look_at_first(char *p, size_t sz, size_t n, void *ud)
{
    first_chunk *f = ud;
    loom_conversation_info info;

    (void)sh_on_body(p, sz, n, &f->r);
    f->looked = 1;
    memset(&info, 0, sizeof(info));
    if (sh_header(&f->r, "X-Loom-Conversation-Id", f->id, sizeof(f->id)))
        f->found = loom_store_conversation_info(f->h->store, f->id, &info) == 0;
    loom_conversation_info_clear(&info);
    return 0; /* curl closes the connection */
}

/* ... and the cancelled turn is then stored under the id the first chunk
 * named, its conversation with it. */
static void test_stream_created_with_save(void **state)
{
    loom_conversation_info info;
    char path[192];
    long long end;
    first_chunk f;
    json_t *c;
    CURL *e;
    sh h;

    (void)state;
    sh_start(&h, SCRIPT, NULL, NULL);
    memset(&f, 0, sizeof(f));
    f.h = &h;
    e = sh_easy(&h, "POST", "/v1/chat/completions",
                BODY("\"stream\":true,", "hold on"), NULL, &f.r);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, look_at_first);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &f);
    assert_int_equal(curl_easy_perform(e), CURLE_WRITE_ERROR);
    curl_easy_cleanup(e);
    assert_true(f.looked);
    assert_non_null(f.r.body);
    assert_memory_equal(f.r.body, "data: {", 7);
    assert_memory_equal(f.id, "conv_", 5);
    assert_false(f.found);
    sh_resp_free(&f.r);

    end = test_now_ms() + 20000;
    for (;;) {
        memset(&info, 0, sizeof(info));
        if (loom_store_conversation_info(h.store, f.id, &info) == 0)
            break;
        assert_true(test_now_ms() < end);
        usleep(20 * 1000);
    }
    loom_conversation_info_clear(&info);
    expect_owner(&h, f.id, "ann", 2);
    snprintf(path, sizeof(path), "/v1/conversations/%s", f.id);
    c = sh_json(&h, "GET", path, NULL, 200);
    assert_string_equal(sh_str(sh_last_message(c), "status"), "cancelled");
    json_decref(c);
    sh_free(&h);
}

/* How many conversations GET /v1/conversations lists. */
static size_t listed(const sh *h)
{
    json_t *l = sh_json(h, "GET", "/v1/conversations", NULL, 200);
    size_t n = json_array_size(json_object_get(l, "data"));

    json_decref(l);
    return n;
}

/* A non-streamed completion's conversation is not in the store while its
 * model call runs; its client leaving then cancels the run, which is
 * stored with its conversation, owner included. */
static void test_plain_created_with_save(void **state)
{
    CURLM *m = curl_multi_init();
    long long end;
    char id[128], path[192];
    json_t *l, *c;
    sh_resp r;
    CURL *e;
    int running = 1;
    sh h;

    (void)state;
    sh_start(&h, SCRIPT, NULL, NULL);
    e = sh_easy(&h, "POST", "/v1/chat/completions", BODY("", "hold on"), NULL,
                &r);
    memset(&r, 0, sizeof(r));
    assert_non_null(m);
    curl_multi_add_handle(m, e);
    end = test_now_ms() + 20000;
    while (fake_request_count(h.fake) < 1 && running) {
        assert_true(test_now_ms() < end);
        curl_multi_perform(m, &running);
        curl_multi_poll(m, NULL, 0, 20, NULL);
    }
    assert_true(running); /* the answer waits for the model */
    assert_int_equal(listed(&h), 0);
    curl_multi_remove_handle(m, e);
    curl_easy_cleanup(e);
    curl_multi_cleanup(m);
    sh_resp_free(&r);

    /* The cancelled turn is stored, its conversation with it. */
    end = test_now_ms() + 20000;
    while (listed(&h) == 0) {
        assert_true(test_now_ms() < end);
        usleep(20 * 1000);
    }
    l = sh_json(&h, "GET", "/v1/conversations", NULL, 200);
    snprintf(id, sizeof(id), "%s",
             sh_str(json_array_get(json_object_get(l, "data"), 0), "id"));
    json_decref(l);
    expect_owner(&h, id, "ann", 2);
    snprintf(path, sizeof(path), "/v1/conversations/%s", id);
    c = sh_json(&h, "GET", path, NULL, 200);
    assert_string_equal(sh_str(sh_last_message(c), "status"), "cancelled");
    json_decref(c);
    sh_free(&h);
}

/* lead calls its sub-agent scout once, then answers. */
static const char *const TREE_SCRIPT =
    "{\"rules\": ["
    " {\"match\": {\"system\": \"You lead\"}, \"responses\": ["
    "   {\"tool_calls\": [{\"id\": \"call_s\", \"name\": \"scout\","
    "     \"arguments\": \"{\\\"task\\\":\\\"look\\\"}\"}]},"
    "   {\"text\": [\"Lead done.\"]}]},"
    " {\"match\": {\"system\": \"You scout\"}, \"responses\": ["
    "   {\"text\": [\"scouted\"]}]}]}";

/* A sub-agent's run is stored while its top turn runs, before that
 * turn's save: it creates the conversation first, with the same owner,
 * and the top turn's save then goes into it; streamed or not. */
static void with_sub_agent(int stream)
{
    char id[128], sql[256], *yaml = NULL;
    sh h;

    memset(&h, 0, sizeof(h));
    h.fake = fake_start_script(TREE_SCRIPT);
    assert_non_null(h.fake);
    h.db = test_tmp_path("chat-store-tree.db");
    unlink(h.db);
    assert_true(asprintf(&yaml,
                         "providers:\n"
                         "  fake:\n"
                         "    base_url: %s\n"
                         "    api_key: sk-test\n"
                         "    retries: {max: 0}\n"
                         "models:\n"
                         "  fake/m: {upstream: fake-model}\n"
                         "agents:\n"
                         "  lead: {model: fake/m, system_prompt: You lead.,"
                         " tools: [scout], sub_agents: [scout]}\n"
                         "  scout: {model: fake/m, system_prompt: You scout.,"
                         " tools: []}\n"
                         "server:\n"
                         "  listen: 127.0.0.1:0\n",
                         fake_base_url(h.fake)) > 0);
    sh_start_config(&h, yaml);
    free(yaml);
    complete(&h,
             stream ? "{\"model\":\"agent/lead\",\"user\":\"ann\","
                      "\"stream\":true,\"messages\":"
                      "[{\"role\":\"user\",\"content\":\"go\"}]}"
                    : "{\"model\":\"agent/lead\",\"user\":\"ann\","
                      "\"messages\":"
                      "[{\"role\":\"user\",\"content\":\"go\"}]}",
             id, sizeof(id));
    expect_owner(&h, id, "ann", 4);
    snprintf(sql, sizeof(sql),
             "SELECT count(*) FROM runs WHERE conversation_id = '%s' AND "
             "user_id = 'ann' AND status = 'completed'",
             id);
    assert_int_equal(test_db_int(h.db, sql), 2);
    sh_free(&h);
}

static void test_plain_with_sub_agent(void **state)
{
    (void)state;
    with_sub_agent(0);
}

static void test_stream_with_sub_agent(void **state)
{
    (void)state;
    with_sub_agent(1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_rows_streamed_or_not),
        cmocka_unit_test(test_stream_created_with_save),
        cmocka_unit_test(test_plain_created_with_save),
        cmocka_unit_test(test_plain_with_sub_agent),
        cmocka_unit_test(test_stream_with_sub_agent),
    };
    int rc;

    curl_global_init(CURL_GLOBAL_DEFAULT);
    rc = cmocka_run_group_tests(tests, NULL, NULL);
    curl_global_cleanup();
    return rc;
}
