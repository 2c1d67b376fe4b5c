/*
 * Stateless clients of POST /v1/chat/completions
 * (docs/openai-compat.md#stateless-clients), end to end with a real
 * server, a SQLite store in a temporary file and the fake upstream.
 * Clients such as Open WebUI and the Agents SDK resend the whole history
 * and no conversation id: a request whose messages extend a stored
 * conversation of the same user (in the form the client saw it) goes on
 * in that conversation, and the model gets the stored history, with
 * loom's own tool calls and results the client never had. Each test
 * asserts on the conversation id answered, on the store, and on what the
 * fake upstream received.
 */
#include "test_server_harness.h"

#define LOOP(resp) "{\"loop\":true,\"responses\":[" resp "]}"
#define GET_TIME(id)                                                           \
    "{\"id\":\"" id "\",\"name\":\"get_time\",\"arguments\":\"{}\"}"
#define WEATHER_TOOL                                                           \
    "{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","           \
    "\"description\":\"Weather of a city.\",\"parameters\":{\"type\":"         \
    "\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}"
#define USER(text) "{\"role\":\"user\",\"content\":\"" text "\"}"
#define ANSWER(text) "{\"role\":\"assistant\",\"content\":\"" text "\"}"
/* A chat request of the plain model with loom's get_time. */
#define REQUEST(extra, msgs)                                                   \
    "{\"model\":\"fake/m\",\"tools\":[\"get_time\"]" extra                     \
    ",\"messages\":[" msgs "]}"

static sh H;

/* ---- helpers ------------------------------------------------------------- */

typedef struct {
    char conv[160]; /* the X-Loom-Conversation-Id answered */
    char *content;  /* the answer's text (streamed: every delta joined) */
    json_t *calls;  /* non-streamed: message.tool_calls (may be NULL) */
} answer;

static void answer_free(answer *a)
{
    free(a->content);
    json_decref(a->calls);
    memset(a, 0, sizeof(*a));
}

/* Joins the content deltas of a chat stream. */
static char *stream_content(const char *body)
{
    json_t *evs = sh_sse_parse(body, NULL), *ev;
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    size_t i;

    loom_buf_puts(&b, "");
    json_array_foreach(evs, i, ev)
    {
        const char *s = json_string_value(json_object_get(
            json_object_get(
                json_array_get(
                    json_object_get(json_object_get(ev, "data"), "choices"), 0),
                "delta"),
            "content"));
        if (s)
            loom_buf_puts(&b, s);
    }
    json_decref(evs);
    return loom_buf_detach(&b);
}

/* POSTs body (hdr: one extra header line, may be NULL); expects 200. */
static void chat(const char *body, const char *hdr, answer *a)
{
    struct curl_slist *hl = NULL;
    sh_resp r;

    memset(a, 0, sizeof(*a));
    hl = curl_slist_append(hl, "Content-Type: application/json");
    if (hdr)
        hl = curl_slist_append(hl, hdr);
    if (sh_req(&H, "POST", "/v1/chat/completions", body, hl, &r) != 200)
        fail_msg("status %ld: %s", r.status, r.body ? r.body : "");
    curl_slist_free_all(hl);
    assert_non_null(
        sh_header(&r, "X-Loom-Conversation-Id", a->conv, sizeof(a->conv)));
    if (strstr(body, "\"stream\":true")) {
        a->content = stream_content(r.body);
    } else {
        json_t *o = json_loads(r.body, 0, NULL), *msg;
        assert_non_null(o);
        msg = json_object_get(json_array_get(json_object_get(o, "choices"), 0),
                              "message");
        a->content =
            strdup(sh_str(msg, "content") ? sh_str(msg, "content") : "");
        a->calls = json_incref(json_object_get(msg, "tool_calls"));
        json_decref(o);
    }
    sh_resp_free(&r);
}

/* POSTs body with hdr (may be NULL); expects a 400 code naming param. */
static void chat_refused(const char *body, const char *hdr, const char *code,
                         const char *param)
{
    struct curl_slist *hl = NULL;
    json_t *j;
    sh_resp r;

    hl = curl_slist_append(hl, "Content-Type: application/json");
    if (hdr)
        hl = curl_slist_append(hl, hdr);
    assert_int_equal(sh_req(&H, "POST", "/v1/chat/completions", body, hl, &r),
                     400);
    curl_slist_free_all(hl);
    sh_check_error(r.body, code);
    j = json_loads(r.body, 0, NULL);
    assert_string_equal(sh_str(json_object_get(j, "error"), "param"), param);
    json_decref(j);
    sh_resp_free(&r);
}

/*
 * "role:content|..." of the messages of the last request the fake got;
 * an assistant's calls as "(id,id)" after its role, a tool result as
 * "tool(id)" (its content, the time, is checked to be there).
 */
static void expect_upstream(const char *want)
{
    size_t n = fake_request_count(H.fake);
    json_t *req = fake_request(H.fake, n - 1), *m, *c;
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    size_t i, k;

    assert_true(n > 0);
    loom_buf_puts(&b, "");
    json_array_foreach(
        json_object_get(json_object_get(req, "body"), "messages"), i, m)
    {
        const char *role = sh_str(m, "role");
        loom_buf_printf(&b, "%s%s", i ? "|" : "", role);
        if (strcmp(role, "tool") == 0) {
            assert_true(sh_str(m, "content") && *sh_str(m, "content"));
            loom_buf_printf(&b, "(%s)", sh_str(m, "tool_call_id"));
            continue;
        }
        if (json_array_size(json_object_get(m, "tool_calls"))) {
            json_array_foreach(json_object_get(m, "tool_calls"), k, c)
                loom_buf_printf(&b, "%s%s", k ? "," : "(", sh_str(c, "id"));
            loom_buf_puts(&b, ")");
        }
        loom_buf_printf(&b, ":%s",
                        sh_str(m, "content") ? sh_str(m, "content") : "");
    }
    json_decref(req);
    assert_string_equal(loom_buf_cstr(&b), want);
    loom_buf_free(&b);
}

/* How many conversations the store holds. */
static size_t conversations(void)
{
    json_t *list = NULL;
    size_t n;

    assert_int_equal(loom_store_conversation_list(H.store, NULL, 100, &list),
                     0);
    n = json_array_size(json_object_get(list, "data"));
    json_decref(list);
    return n;
}

/* "role,role,..." of a stored conversation's messages. */
static void expect_stored(const char *conv, const char *want)
{
    json_t *j = NULL, *m;
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    size_t i;

    assert_int_equal(loom_store_conversation_get(H.store, conv, &j), 0);
    loom_buf_puts(&b, "");
    json_array_foreach(json_object_get(j, "messages"), i, m)
        loom_buf_printf(&b, "%s%s", i ? "," : "", sh_str(m, "role"));
    json_decref(j);
    assert_string_equal(loom_buf_cstr(&b), want);
    loom_buf_free(&b);
}

/* ---- tests --------------------------------------------------------------- */

/* The second request resends the first's question and answer: one
 * conversation, and the model sees the first turn's get_time call and
 * result, which the client never had. */
static void test_continues_with_server_tools(void **state)
{
    answer a1, a2, a3;
    (void)state;

    sh_start(&H,
             "{\"responses\":[{\"tool_calls\":[" GET_TIME(
                 "call_t") "]},"
                           "{\"text\":[\"It is noon.\"]},{\"text\":[\"Tomorrow "
                           "too.\"]},"
                           "{\"text\":[\"Bye.\"]}]}",
             NULL, NULL);
    chat(REQUEST("", USER("time?")), NULL, &a1);
    assert_string_equal(a1.content, "It is noon.");
    assert_int_equal(strncmp(a1.conv, "conv_", 5), 0);

    chat(REQUEST("", USER("time?") "," ANSWER("It is noon.") "," USER(
                         "and tomorrow?")),
         NULL, &a2);
    assert_string_equal(a2.conv, a1.conv);
    assert_string_equal(a2.content, "Tomorrow too.");
    expect_upstream("user:time?|assistant(call_t):|tool(call_t)|"
                    "assistant:It is noon.|user:and tomorrow?");
    assert_int_equal(conversations(), 1);
    expect_stored(a1.conv, "user,assistant,tool,assistant,user,assistant");

    /* And on: the third request resends both turns. */
    chat(REQUEST(
             "",
             USER("time?") "," ANSWER("It is noon.") "," USER(
                 "and tomorrow?") "," ANSWER("Tomorrow too.") "," USER("thank"
                                                                       "s")),
         NULL, &a3);
    assert_string_equal(a3.conv, a1.conv);
    expect_upstream("user:time?|assistant(call_t):|tool(call_t)|"
                    "assistant:It is noon.|user:and tomorrow?|"
                    "assistant:Tomorrow too.|user:thanks");
    assert_int_equal(conversations(), 1);
    answer_free(&a1);
    answer_free(&a2);
    answer_free(&a3);
    sh_free(&H);
}

/* A model that speaks before calling loom's tool: a streamed client got
 * every delta ("Let me look. It is noon."), a non-streamed one the last
 * call's text ("It is noon."); each resends what it got, and each is
 * recognised. */
static void test_streamed_and_not(void **state)
{
    answer a1, a2;
    (void)state;

    sh_start(&H,
             LOOP("{\"text\":[\"Let me look. \"],\"tool_calls\":[" GET_TIME(
                 "call_t") "]},{\"text\":[\"It is noon.\"]},"
                           "{\"text\":[\"Later.\"]}"),
             NULL, NULL);
    chat(REQUEST(",\"stream\":true", USER("time?")), NULL, &a1);
    assert_string_equal(a1.content, "Let me look. It is noon.");
    chat(REQUEST(",\"stream\":true",
                 USER("time?") "," ANSWER("Let me look. It is noon.") "," USER(
                     "later?")),
         NULL, &a2);
    assert_string_equal(a2.conv, a1.conv);
    expect_upstream("user:time?|assistant(call_t):Let me look. |"
                    "tool(call_t)|assistant:It is noon.|user:later?");
    answer_free(&a1);
    answer_free(&a2);

    /* Not streamed: the answer is the last call's text. Script: the
     * loop starts over at the speaking turn. */
    chat(REQUEST("", USER("clock?")), NULL, &a1);
    assert_string_equal(a1.content, "It is noon.");
    chat(REQUEST("",
                 USER("clock?") "," ANSWER("It is noon.") "," USER("later?")),
         NULL, &a2);
    assert_string_equal(a2.conv, a1.conv);
    expect_upstream("user:clock?|assistant(call_t):Let me look. |"
                    "tool(call_t)|assistant:It is noon.|user:later?");
    assert_int_equal(conversations(), 2);
    answer_free(&a1);
    answer_free(&a2);
    sh_free(&H);
}

/* A conversation is found only for its own user: another user, or an
 * anonymous request, resending the same history starts a new one, and
 * an anonymous conversation is not found for a user. */
static void test_scoped_to_the_user(void **state)
{
    answer alice, bob, anon, again, anon2, user2;
    (void)state;

    sh_start(&H, LOOP("{\"text\":[\"Hello.\"]}"), NULL, NULL);
    chat(REQUEST(",\"user\":\"alice\"", USER("hi")), NULL, &alice);

    chat(REQUEST(",\"user\":\"bob\"",
                 USER("hi") "," ANSWER("Hello.") "," USER("more")),
         NULL, &bob);
    assert_string_not_equal(bob.conv, alice.conv);
    expect_upstream("user:hi|assistant:Hello.|user:more");

    chat(REQUEST("", USER("hi") "," ANSWER("Hello.") "," USER("more")), NULL,
         &anon);
    assert_string_not_equal(anon.conv, alice.conv);
    assert_string_not_equal(anon.conv, bob.conv);

    /* alice herself is recognised. */
    chat(REQUEST(",\"user\":\"alice\"",
                 USER("hi") "," ANSWER("Hello.") "," USER("more")),
         NULL, &again);
    assert_string_equal(again.conv, alice.conv);
    assert_int_equal(conversations(), 3);

    /* An anonymous conversation goes on anonymously only. */
    chat(REQUEST("", USER("hi") "," ANSWER("Hello.") "," USER(
                         "more") "," ANSWER("Hello.") "," USER("again")),
         NULL, &anon2);
    assert_string_equal(anon2.conv, anon.conv);
    chat(
        REQUEST(
            ",\"user\":\"carol\"",
            USER("hi") "," ANSWER("Hello.") "," USER("more") "," ANSWER(
                "Hello.") "," USER("again") "," ANSWER("Hello.") "," USER("once"
                                                                          " mor"
                                                                          "e")),
        NULL, &user2);
    assert_string_not_equal(user2.conv, anon.conv);
    assert_int_equal(conversations(), 4);
    answer_free(&alice);
    answer_free(&bob);
    answer_free(&anon);
    answer_free(&again);
    answer_free(&anon2);
    answer_free(&user2);
    sh_free(&H);
}

/* loom_continue: false, or X-Loom-Continue: off, keeps today's shape: a
 * new conversation holding the whole request. The header wins over the
 * field; bad values are refused. */
static void test_switch_off(void **state)
{
    answer first, off, hoff, on;
    (void)state;

    sh_start(&H, LOOP("{\"text\":[\"Hello.\"]}"), NULL, NULL);
    chat(REQUEST("", USER("hi")), NULL, &first);

    chat(REQUEST(",\"loom_continue\":false",
                 USER("hi") "," ANSWER("Hello.") "," USER("more")),
         NULL, &off);
    assert_string_not_equal(off.conv, first.conv);
    expect_upstream("user:hi|assistant:Hello.|user:more");
    expect_stored(off.conv, "user,assistant,user,assistant");

    chat(REQUEST("", USER("hi") "," ANSWER("Hello.") "," USER("more")),
         "X-Loom-Continue: off", &hoff);
    assert_string_not_equal(hoff.conv, first.conv);
    assert_string_not_equal(hoff.conv, off.conv);

    /* The header wins: on, though the field says false. */
    chat(REQUEST(",\"loom_continue\":false",
                 USER("hi") "," ANSWER("Hello.") "," USER("more")),
         "X-Loom-Continue: on", &on);
    assert_string_equal(on.conv, first.conv);
    assert_int_equal(conversations(), 3);

    chat_refused(REQUEST(",\"loom_continue\":\"no\"", USER("hi")), NULL,
                 "invalid_type", "loom_continue");
    chat_refused(REQUEST("", USER("hi")), "X-Loom-Continue: no",
                 "invalid_value", "loom_continue");
    answer_free(&first);
    answer_free(&off);
    answer_free(&hoff);
    answer_free(&on);
    sh_free(&H);
}

/* A history that is not exactly a stored conversation is not one: an
 * edited question, an edited answer, a system message added, and a
 * branch from an earlier point of a conversation that went on. */
static void test_diverging_history(void **state)
{
    answer first, second, a;
    const char *const diverging[] = {
        REQUEST("", USER("hi!") "," ANSWER("Hello.") "," USER("more")),
        REQUEST("", USER("hi") "," ANSWER("Hello!") "," USER("more")),
        REQUEST("", "{\"role\":\"system\",\"content\":\"Be kind.\"}," USER(
                        "hi") "," ANSWER("Hello.") "," USER("more")),
    };
    (void)state;

    sh_start(&H, LOOP("{\"text\":[\"Hello.\"]}"), NULL, NULL);
    chat(REQUEST("", USER("hi")), NULL, &first);
    for (size_t i = 0; i < sizeof(diverging) / sizeof(diverging[0]); i++) {
        chat(diverging[i], NULL, &a);
        assert_string_not_equal(a.conv, first.conv);
        answer_free(&a);
    }
    assert_int_equal(conversations(), 4);

    /* The conversation goes on; resending only its first turn then is a
     * branch, which starts a new conversation. */
    chat(REQUEST("", USER("hi") "," ANSWER("Hello.") "," USER("more")), NULL,
         &second);
    assert_string_equal(second.conv, first.conv);
    chat(REQUEST("", USER("hi") "," ANSWER("Hello.") "," USER("other")), NULL,
         &a);
    assert_string_not_equal(a.conv, first.conv);
    expect_upstream("user:hi|assistant:Hello.|user:other");
    assert_int_equal(conversations(), 5);
    answer_free(&a);
    answer_free(&first);
    answer_free(&second);
    sh_free(&H);
}

/* A turn calling loom's get_time and the client's get_weather: the client
 * sees only its own call, answers it, and resends; the conversation goes
 * on with both results before the model. */
static void test_client_tool_round(void **state)
{
    answer a1, a2;
    char body[2048];
    (void)state;

    sh_start(&H,
             "{\"responses\":[{\"tool_calls\":[" GET_TIME(
                 "call_t") ",{\"id\":\"call_w\",\"name\":\"get_weather\","
                           "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}"
                           "]},{\"text\":[\"Noon and sunny.\"]}]}",
             NULL, NULL);
    chat("{\"model\":\"fake/m\",\"tools\":[\"get_time\"," WEATHER_TOOL "],"
         "\"messages\":[" USER("time and weather?") "]}",
         NULL, &a1);
    assert_int_equal(json_array_size(a1.calls), 1);
    assert_string_equal(sh_str(json_array_get(a1.calls, 0), "id"), "call_w");

    /* The client resends its call as it got it (arguments re-serialised,
     * which does not matter) and its result. */
    snprintf(body, sizeof(body),
             "{\"model\":\"fake/m\",\"tools\":[\"get_time\"," WEATHER_TOOL
             "],\"messages\":[" USER(
                 "time and weather?") ","
                                      "{\"role\":\"assistant\",\"content\":"
                                      "null,\"tool_calls\":[{"
                                      "\"id\":\"call_w\",\"type\":\"function\","
                                      "\"function\":{\"name\":"
                                      "\"get_weather\",\"arguments\":\"{"
                                      "\\\"city\\\": "
                                      "\\\"Paris\\\"}\"}}]},"
                                      "{\"role\":\"tool\",\"tool_call_id\":"
                                      "\"call_w\",\"content\":"
                                      "\"sunny\"}]}");
    chat(body, NULL, &a2);
    assert_string_equal(a2.conv, a1.conv);
    assert_string_equal(a2.content, "Noon and sunny.");
    expect_upstream("user:time and weather?|assistant(call_t,call_w):|"
                    "tool(call_t)|tool(call_w)");
    assert_int_equal(conversations(), 1);
    answer_free(&a1);
    answer_free(&a2);
    sh_free(&H);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_continues_with_server_tools),
        cmocka_unit_test(test_streamed_and_not),
        cmocka_unit_test(test_scoped_to_the_user),
        cmocka_unit_test(test_switch_off),
        cmocka_unit_test(test_diverging_history),
        cmocka_unit_test(test_client_tool_round),
    };

    curl_global_init(CURL_GLOBAL_DEFAULT);
    return cmocka_run_group_tests(tests, NULL, NULL);
}
