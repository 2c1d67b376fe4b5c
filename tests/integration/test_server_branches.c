/*
 * Branches through the server (docs/server.md "Branches", docs/store.md
 * #branches): editing a user message makes a branch whose history is the
 * messages before it, and the edited run sends the model that prefix and
 * the new text; each version of a message lists the conversations holding
 * every version (a branch of a branch, a branch at the first message, the
 * copied messages of a branch included) with the one the conversation
 * shows; lists hold no branches; another user gets a 404 for a branch
 * and for branching another's conversation; a bad fork is a 400; deleting
 * a conversation deletes its branches, and only those.
 */
#include "server_accounts_util.h"

#define ADMIN "adm-0123456789abcdef"

static void key_for(sh *h, const char *user, char key[LOOM_KEY_SIZE])
{
    loom_key_spec spec = {.version = LOOM_KEY_SPEC_VERSION, .user = user};

    if (loom_store_key_create(h->store, &spec, key, NULL) != 0)
        fail_msg("key: %s", loom_error_last());
}

/* Runs text as key on conversation conv (NULL: a new one); the run's id
 * into run (may be NULL) and its conversation's into conv_out (may be
 * NULL). */
static void run_on(sh *h, const char *key, const char *conv, const char *text,
                   char run[64], char conv_out[64])
{
    char body[512];
    json_t *j;

    if (conv)
        snprintf(body, sizeof(body),
                 "{\"input\":\"%s\",\"conversation_id\":\"%s\"}", text, conv);
    else
        snprintf(body, sizeof(body), "{\"input\":\"%s\"}", text);
    j = call_json(h, key, NULL, "POST", "/v1/runs", body, 200);
    assert_string_equal(sh_str(j, "status"), "completed");
    if (run)
        snprintf(run, 64, "%s", sh_str(j, "id"));
    if (conv_out)
        snprintf(conv_out, 64, "%s", sh_str(j, "conversation_id"));
    json_decref(j);
}

static json_t *get_conv(sh *h, const char *key, const char *id)
{
    char path[128];

    snprintf(path, sizeof(path), "/v1/conversations/%s", id);
    return call_json(h, key, NULL, "GET", path, NULL, 200);
}

/* Message i of conversation j. */
static json_t *msg(json_t *j, size_t i)
{
    json_t *m = json_array_get(json_object_get(j, "messages"), i);

    assert_non_null(m);
    return m;
}

/* Branches conversation conv at message mid as key: the branch. */
static json_t *branch(sh *h, const char *key, const char *conv, const char *mid)
{
    char path[128], body[128];

    snprintf(path, sizeof(path), "/v1/conversations/%s/branches", conv);
    snprintf(body, sizeof(body), "{\"from_message\":\"%s\"}", mid);
    return call_json(h, key, NULL, "POST", path, body, 201);
}

/* Message m has exactly the versions given (NULL-ended; none when the
 * list holds one or none) and shows the one at index at. */
static void check_versions(const json_t *m, size_t at, ...)
{
    json_t *v = json_object_get(m, "versions");
    const char *id;
    va_list ap;
    size_t n = 0;

    va_start(ap, at);
    while ((id = va_arg(ap, const char *)) != NULL) {
        assert_non_null(v);
        assert_string_equal(json_string_value(json_array_get(v, n)), id);
        n++;
    }
    va_end(ap);
    if (n < 2) {
        assert_null(v);
        assert_null(json_object_get(m, "version"));
        return;
    }
    assert_int_equal(json_array_size(v), n);
    assert_int_equal(json_integer_value(json_object_get(m, "version")), at);
}

/* The contents of the messages the fake got in its last request, system
 * messages left out, joined by "|". */
static char *last_sent(const sh *h)
{
    json_t *reqs = fake_requests(h->fake), *m;
    json_t *msgs = json_object_get(
        json_object_get(json_array_get(reqs, json_array_size(reqs) - 1),
                        "body"),
        "messages");
    char buf[1024] = "";
    size_t k, n = 0;

    json_array_foreach(msgs, k, m)
    {
        if (strcmp(sh_str(m, "role"), "system"))
            n += (size_t)snprintf(buf + n, sizeof(buf) - n, "%s%s",
                                  n ? "|" : "", sh_str(m, "content"));
    }
    json_decref(reqs);
    return strdup(buf);
}

static void test_branches(void **state)
{
    char alice[LOOM_KEY_SIZE], bob[LOOM_KEY_SIZE];
    char body[256], c[64], b1[64], b2[64], b3[64], b1run[64], q1[64], q2[64],
        path[128];
    json_t *j, *root;
    loom_messages hist = {0};
    char *sent;
    sh h;

    (void)state;
    accounts_start(
        &h,
        "{\"responses\":[" TEXT("A1") "," TEXT("A2") "," TEXT("A3") "," TEXT(
            "A2 edited") "," TEXT("A2 third") "," TEXT("A1 other") "]}",
        "  mode: keys\n  admin_key: " ADMIN "\n");
    key_for(&h, "alice", alice);
    key_for(&h, "bob", bob);

    run_on(&h, alice, NULL, "Q1", NULL, c);
    run_on(&h, alice, c, "Q2", NULL, NULL);
    run_on(&h, alice, c, "Q3", NULL, NULL);
    root = get_conv(&h, alice, c);
    assert_int_equal(json_array_size(json_object_get(root, "messages")), 6);
    snprintf(q1, sizeof(q1), "%s", sh_str(msg(root, 0), "id"));
    snprintf(q2, sizeof(q2), "%s", sh_str(msg(root, 2), "id"));
    assert_true(json_is_null(json_object_get(root, "parent_id")));
    json_decref(root);

    /* Edit Q2: the branch holds Q1 and A1, and the run sends them with
     * the new text, never Q2 or what followed it. */
    j = branch(&h, alice, c, q2);
    snprintf(b1, sizeof(b1), "%s", sh_str(j, "id"));
    assert_string_not_equal(b1, c);
    assert_string_equal(sh_str(j, "parent_id"), c);
    assert_string_equal(sh_str(j, "fork_message"), q2);
    assert_int_equal(json_array_size(json_object_get(j, "messages")), 2);
    assert_string_equal(sh_str(msg(j, 0), "content"), "Q1");
    assert_string_not_equal(sh_str(msg(j, 0), "id"), q1);
    assert_string_equal(sh_str(msg(j, 1), "content"), "A1");
    json_decref(j);
    run_on(&h, alice, b1, "Q2 edited", b1run, NULL);
    sent = last_sent(&h);
    assert_string_equal(sent, "Q1|A1|Q2 edited");
    free(sent);
    assert_int_equal(loom_store_load_history(h.store, b1, &hist), 0);
    assert_int_equal(hist.len, 4);
    assert_string_equal(hist.items[2].content, "Q2 edited");
    assert_string_equal(hist.items[3].content, "A2 edited");
    loom_messages_free(&hist);

    /* Both show the two versions of the second question, each its own. */
    j = get_conv(&h, alice, c);
    check_versions(msg(j, 0), 0, NULL);
    check_versions(msg(j, 2), 0, c, b1, NULL);
    check_versions(msg(j, 4), 0, NULL);
    json_decref(j);
    j = get_conv(&h, alice, b1);
    check_versions(msg(j, 0), 0, NULL);
    check_versions(msg(j, 2), 1, c, b1, NULL);
    json_decref(j);

    /* A branch of the branch at its edited message is a third version. */
    root = get_conv(&h, alice, b1);
    j = branch(&h, alice, b1, sh_str(msg(root, 2), "id"));
    snprintf(b2, sizeof(b2), "%s", sh_str(j, "id"));
    json_decref(j);
    json_decref(root);
    run_on(&h, alice, b2, "Q2 third", NULL, NULL);
    sent = last_sent(&h);
    assert_string_equal(sent, "Q1|A1|Q2 third");
    free(sent);
    j = get_conv(&h, alice, b2);
    assert_string_equal(sh_str(j, "parent_id"), b1);
    check_versions(msg(j, 2), 2, c, b1, b2, NULL);
    json_decref(j);
    j = get_conv(&h, alice, b1);
    check_versions(msg(j, 2), 1, c, b1, b2, NULL);
    json_decref(j);

    /* Editing the first message: an empty history; the copies of Q1 in
     * the other branches show that version too. */
    j = branch(&h, alice, c, q1);
    snprintf(b3, sizeof(b3), "%s", sh_str(j, "id"));
    assert_int_equal(json_array_size(json_object_get(j, "messages")), 0);
    json_decref(j);
    run_on(&h, alice, b3, "Q1 other", NULL, NULL);
    sent = last_sent(&h);
    assert_string_equal(sent, "Q1 other");
    free(sent);
    j = get_conv(&h, alice, b3);
    check_versions(msg(j, 0), 1, c, b3, NULL);
    json_decref(j);
    j = get_conv(&h, alice, b2);
    check_versions(msg(j, 0), 0, c, b3, NULL);
    check_versions(msg(j, 2), 2, c, b1, b2, NULL);
    json_decref(j);

    /* Lists and searches hold the root only. */
    j = call_json(&h, alice, NULL, "GET", "/v1/conversations", NULL, 200);
    assert_int_equal(json_array_size(json_object_get(j, "data")), 1);
    assert_string_equal(
        sh_str(json_array_get(json_object_get(j, "data"), 0), "id"), c);
    json_decref(j);
    j = call_json(&h, alice, NULL, "GET", "/v1/conversations?q=Q", NULL, 200);
    assert_int_equal(json_array_size(json_object_get(j, "data")), 1);
    json_decref(j);

    /* Bob sees none of it and may not branch it. */
    check_hidden(&h, bob, NULL, b1run, b1);
    snprintf(path, sizeof(path), "/v1/conversations/%s/branches", c);
    snprintf(body, sizeof(body), "{\"from_message\":\"%s\"}", q2);
    call_error(&h, bob, NULL, "POST", path, body, 404, "not_found");

    /* A bad fork. */
    j = get_conv(&h, alice, c);
    snprintf(body, sizeof(body), "{\"from_message\":\"%s\"}",
             sh_str(msg(j, 1), "id"));
    json_decref(j);
    call_error(&h, alice, NULL, "POST", path, body, 400, "invalid_value");
    snprintf(body, sizeof(body), "{\"from_message\":\"%s\"}",
             sh_str(msg(root = get_conv(&h, alice, b1), 2), "id"));
    json_decref(root);
    /* A message of another conversation (the branch's own). */
    call_error(&h, alice, NULL, "POST", path, body, 400, "invalid_value");
    call_error(&h, alice, NULL, "POST", path, "{}", 400, "invalid_value");
    call_error(&h, alice, NULL, "POST", path, "{\"from_message\":3}", 400,
               "invalid_value");
    call_error(&h, alice, NULL, "POST", path,
               "{\"from_message\":\"m\",\"x\":1}", 400, "unknown_parameter");
    call_error(&h, alice, NULL, "POST",
               "/v1/conversations/conv_000000000000000000000000/branches",
               "{\"from_message\":\"m\"}", 404, "not_found");

    /* Deleting a branch deletes its own branches and nothing else. */
    snprintf(path, sizeof(path), "/v1/conversations/%s", b1);
    json_decref(call_json(&h, alice, NULL, "DELETE", path, NULL, 200));
    snprintf(path, sizeof(path), "/v1/conversations/%s", b2);
    call_error(&h, alice, NULL, "GET", path, NULL, 404, "not_found");
    j = get_conv(&h, alice, c);
    check_versions(msg(j, 2), 0, NULL);
    check_versions(msg(j, 0), 0, c, b3, NULL);
    json_decref(j);
    /* Deleting the root deletes every branch. */
    snprintf(path, sizeof(path), "/v1/conversations/%s", c);
    json_decref(call_json(&h, alice, NULL, "DELETE", path, NULL, 200));
    snprintf(path, sizeof(path), "/v1/conversations/%s", b3);
    call_error(&h, alice, NULL, "GET", path, NULL, 404, "not_found");
    sh_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_branches),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
