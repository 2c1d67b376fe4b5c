/*
 * Unit tests of src/agent/review.c, the automatic review: the transcript
 * the reviewer reads (request, calls, result excerpts, and what is left
 * out when it does not fit), the lenient parser (bare JSON, fences,
 * prose; wrong types refused), the note shown to the model, the `review`
 * event data, and whole review calls through an in-process mock provider
 * (a valid review, a fenced one, garbage, a failing provider, an empty or
 * too long answer, cancellation). Every limit of the module is crossed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "agent/review.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---- */

static char *repeat(const char *unit, size_t times)
{
    size_t u = strlen(unit);
    char *s = malloc(u * times + 1);

    assert_non_null(s);
    for (size_t i = 0; i < times; i++)
        memcpy(s + i * u, unit, u);
    s[u * times] = '\0';
    return s;
}

/* Valid UTF-8, by jansson's rules. */
static int valid_utf8(const char *s)
{
    json_t *j = json_string(s);

    json_decref(j);
    return j != NULL;
}

static size_t count_of(const char *hay, const char *needle)
{
    size_t n = 0;

    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

/* ---- mock provider ---- */

typedef struct {
    loom_provider base;
    const char *answer; /* text of the answer */
    int fail_rc;        /* returned instead, with an upstream message */
    const char *fail_message; /* NULL: "upstream overloaded" */
    const char *model;  /* resp->model */
    int calls;
    /* what the last request carried */
    char *model_seen, *system_seen, *user_seen;
    size_t nmsg, ntools;
    long max_tokens;
    int stream;
} mock_provider;

static int mock_complete(loom_provider *p, const loom_llm_request *req,
                         loom_llm_event_cb cb, void *payload,
                         loom_llm_response *resp, loom_cancel *cancel)
{
    mock_provider *m = (mock_provider *)p;
    loom_llm_event ev;

    m->calls++;
    free(m->model_seen);
    free(m->system_seen);
    free(m->user_seen);
    m->model_seen = strdup(req->model);
    m->nmsg = req->messages_len;
    m->ntools = req->tools_len;
    m->max_tokens = req->max_tokens;
    m->stream = req->stream;
    m->system_seen = strdup(req->messages[0].content);
    m->user_seen = req->messages_len > 1 ? strdup(req->messages[1].content)
                                         : NULL;
    assert_int_equal(req->messages[0].role, LOOM_ROLE_SYSTEM);
    resp->usage.prompt_tokens = 100;
    resp->usage.completion_tokens = 20;
    resp->usage.total_tokens = 120;
    resp->usage.cost_micros = 42;
    resp->cost_known = 1;
    if (m->model)
        resp->model = strdup(m->model);
    if (loom_cancel_is_set(cancel))
        return LOOM_ECANCELED;
    if (m->fail_rc) {
        resp->error.kind = LOOM_UPSTREAM_SERVER;
        resp->error.http_status = 503;
        resp->error.message = strdup(m->fail_message ? m->fail_message
                                                     : "upstream overloaded");
        return m->fail_rc;
    }
    memset(&ev, 0, sizeof(ev));
    ev.type = LOOM_LLM_TEXT;
    ev.text = m->answer ? m->answer : "";
    ev.text_len = strlen(ev.text);
    if (cb(&ev, payload))
        return LOOM_ECANCELED;
    resp->text = strdup(ev.text);
    resp->finish_reason = strdup("stop");
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

static void mock_init(mock_provider *m, const char *answer)
{
    memset(m, 0, sizeof(*m));
    m->base.vt = &mock_vt;
    m->base.name = (char *)"mock";
    m->answer = answer;
}

static void mock_clear(mock_provider *m)
{
    free(m->model_seen);
    free(m->system_seen);
    free(m->user_seen);
}

/* A small run: request, one call, its result, one more call. */
static loom_messages sample_run(void)
{
    loom_messages ms = {0};
    loom_tool_call c1 = {(char *)"call_1", (char *)"web_search",
                         (char *)"{\"query\": \"tokyo population\"}"};
    loom_tool_call c2 = {(char *)"call_2", (char *)"web_fetch",
                         (char *)"{\"url\": \"https://stat.example/\"}"};

    assert_int_equal(loom_messages_add(&ms, LOOM_ROLE_SYSTEM, "be brief"), 0);
    assert_int_equal(loom_messages_add(&ms, LOOM_ROLE_USER, "old question"),
                     0);
    assert_int_equal(loom_messages_add(&ms, LOOM_ROLE_ASSISTANT, "old"), 0);
    assert_int_equal(
        loom_messages_add(&ms, LOOM_ROLE_USER, "How many live in Tokyo?"), 0);
    assert_int_equal(loom_messages_add_assistant(&ms, "Let me search.", NULL,
                                                 &c1, 1),
                     0);
    assert_int_equal(loom_messages_add_tool_result(
                         &ms, "call_1", "web_search",
                         "results:\n\n  1. Tokyo   has\t14 million"),
                     0);
    assert_int_equal(loom_messages_add(&ms, LOOM_ROLE_SYSTEM, "a note"), 0);
    assert_int_equal(loom_messages_add_assistant(&ms, NULL, NULL, &c2, 1),
                     0);
    assert_int_equal(
        loom_messages_add_tool_result(&ms, "call_2", "web_fetch", "page"), 0);
    return ms;
}

/* ---- the transcript ---- */

static void test_transcript(void **state)
{
    loom_messages ms = sample_run();
    char *t = NULL;

    (void)state;
    assert_int_equal(loom__review_transcript(&t, ms.items, ms.len, 0), 0);
    assert_string_equal(
        t, "The user's request:\n"
           "How many live in Tokyo?\n\n"
           "What the assistant has done so far:\n"
           "- The assistant wrote: Let me search.\n"
           "- It called web_search with {\"query\": \"tokyo population\"}\n"
           "- Result of web_search (37 bytes): results: 1. Tokyo has 14 "
           "million\n"
           "- It called web_fetch with {\"url\": \"https://stat.example/\"}\n"
           "- Result of web_fetch (4 bytes): page\n");
    free(t);

    /* Nothing done yet; no user message at all. */
    assert_int_equal(loom__review_transcript(&t, ms.items, 4, 0), 0);
    assert_non_null(strstr(t, "so far:\nnothing yet.\n"));
    free(t);
    assert_int_equal(loom__review_transcript(&t, ms.items, 1, 0), 0);
    assert_string_equal(t, "The user's request:\n(none)\n\nWhat the assistant "
                           "has done so far:\nnothing yet.\n");
    free(t);
    loom_messages_free(&ms);
}

/* Each excerpt at and past its limit. */
static void test_transcript_excerpts(void **state)
{
    loom_messages ms = {0};
    char *goal = repeat("g", LOOM_REVIEW_GOAL_MAX + 1);
    char *args = repeat("a", LOOM_REVIEW_ARGS_MAX + 1);
    char *text = repeat("\xc3\xa9", LOOM_REVIEW_TEXT_MAX); /* 2x bytes */
    char *result = repeat("r ", LOOM_REVIEW_RESULT_MAX);
    char *fit = repeat("f", LOOM_REVIEW_RESULT_MAX);
    char *t = NULL, *want;
    loom_tool_call c = {(char *)"call_1", (char *)"tool", args};
    const char *p;

    (void)state;
    assert_int_equal(loom_messages_add(&ms, LOOM_ROLE_USER, goal), 0);
    assert_int_equal(loom_messages_add_assistant(&ms, text, NULL, &c, 1), 0);
    assert_int_equal(
        loom_messages_add_tool_result(&ms, "call_1", "tool", result), 0);
    assert_int_equal(
        loom_messages_add_tool_result(&ms, "call_1", "tool", fit), 0);
    assert_int_equal(loom__review_transcript(&t, ms.items, ms.len, 1 << 20),
                     0);
    assert_true(valid_utf8(t));
    /* The request: cut to its limit, "..." included. */
    want = repeat("g", LOOM_REVIEW_GOAL_MAX - 3);
    p = strstr(t, want);
    assert_non_null(p);
    assert_memory_equal(p + LOOM_REVIEW_GOAL_MAX - 3, "...\n", 4);
    free(want);
    /* The arguments: cut. */
    want = repeat("a", LOOM_REVIEW_ARGS_MAX - 3);
    p = strstr(t, want);
    assert_non_null(p);
    assert_memory_equal(p + LOOM_REVIEW_ARGS_MAX - 3, "...\n", 4);
    free(want);
    /* The text: cut on a character. */
    p = strstr(t, "wrote: ") + 7;
    assert_true(strchr(p, '\n') - p <= LOOM_REVIEW_TEXT_MAX);
    assert_memory_equal(strstr(p, "...\n") - 2, "\xc3\xa9", 2);
    /* A result of spaces collapsed, cut; one exactly at the limit kept. */
    p = strstr(t, "(1200 bytes): ") + 14;
    assert_int_equal(strchr(p, '\n') - p, LOOM_REVIEW_RESULT_MAX);
    assert_memory_equal(p + LOOM_REVIEW_RESULT_MAX - 5, " r...", 5);
    assert_non_null(strstr(t, fit));
    free(t);

    /* Exactly at the limits: not cut. */
    goal[LOOM_REVIEW_GOAL_MAX] = '\0';
    free(ms.items[0].content);
    ms.items[0].content = strdup(goal);
    assert_int_equal(loom__review_transcript(&t, ms.items, 1, 0), 0);
    assert_non_null(strstr(t, goal));
    assert_null(strstr(t, "..."));
    free(t);

    loom_messages_free(&ms);
    free(goal);
    free(args);
    free(text);
    free(result);
    free(fit);
}

/* Steps that do not fit: the newest kept, the others counted. */
static void test_transcript_budget(void **state)
{
    loom_messages ms = {0};
    char *t = NULL, id[16], out[32];
    size_t full;

    (void)state;
    assert_int_equal(loom_messages_add(&ms, LOOM_ROLE_USER, "goal"), 0);
    for (int i = 0; i < 40; i++) {
        snprintf(id, sizeof(id), "c%d", i);
        snprintf(out, sizeof(out), "output number %02d", i);
        assert_int_equal(loom_messages_add_tool_result(&ms, id, "t", out), 0);
    }
    assert_int_equal(loom__review_transcript(&t, ms.items, ms.len, 0), 0);
    full = strlen(t);
    assert_null(strstr(t, "left out"));
    free(t);
    /* Exactly enough for all (with the room kept for the count line). */
    assert_int_equal(loom__review_transcript(&t, ms.items, ms.len, full + 64),
                     0);
    assert_null(strstr(t, "left out"));
    free(t);
    /* One byte less: the oldest step goes. */
    assert_int_equal(
        loom__review_transcript(&t, ms.items, ms.len, full + 63), 0);
    assert_non_null(strstr(t, "(1 earlier step left out)\n"));
    assert_null(strstr(t, "output number 00"));
    assert_non_null(strstr(t, "output number 01"));
    assert_true(strlen(t) <= full + 63);
    free(t);
    /* Room for a few: many left out, the newest kept. */
    assert_int_equal(loom__review_transcript(&t, ms.items, ms.len, 300), 0);
    assert_true(strlen(t) <= 300);
    assert_non_null(strstr(t, "earlier steps left out)\n"));
    assert_non_null(strstr(t, "output number 39\n"));
    assert_non_null(strstr(t, "goal"));
    free(t);
    /* Too small even for the request: the head, within the limit. */
    assert_int_equal(loom__review_transcript(&t, ms.items, ms.len, 30), 0);
    assert_int_equal(strlen(t), 30);
    free(t);
    loom_messages_free(&ms);
}

/* ---- the parser ---- */

#define GOOD "{\"complete\": false, \"gaps\": [\"the 2023 figure\"], " \
             "\"next_step\": \"gather_more\", \"note\": \"Search stats.\"}"

typedef struct {
    const char *name;
    const char *in;
    int rc;
    const char *why; /* in the error message */
    int complete;
    loom__review_step step;
    size_t gaps;
} parse_case;

static const parse_case parse_cases[] = {
    {"bare", GOOD, 0, NULL, 0, LOOM__REVIEW_GATHER_MORE, 1},
    {"fenced", "```json\n" GOOD "\n```", 0, NULL, 0,
     LOOM__REVIEW_GATHER_MORE, 1},
    {"fenced no tag", "```\n" GOOD "\n```\n", 0, NULL, 0,
     LOOM__REVIEW_GATHER_MORE, 1},
    {"prose around", "Here is my review:\n" GOOD "\nHope this helps {.", 0,
     NULL, 0, LOOM__REVIEW_GATHER_MORE, 1},
    {"brace before", "Looking at {the results}: " GOOD, 0, NULL, 0,
     LOOM__REVIEW_GATHER_MORE, 1},
    {"complete proceed",
     "{\"complete\":true,\"gaps\":[],\"next_step\":\"proceed\","
     "\"note\":\"\"}",
     0, NULL, 1, LOOM__REVIEW_PROCEED, 0},
    {"step forgiven",
     "{\"complete\":false,\"next_step\":\" Gather-More \",\"note\":\"n\"}", 0,
     NULL, 0, LOOM__REVIEW_GATHER_MORE, 0},
    {"step spaced",
     "{\"complete\":false,\"next_step\":\"gather more\",\"note\":\"n\"}", 0,
     NULL, 0, LOOM__REVIEW_GATHER_MORE, 0},
    {"replan", "{\"complete\":false,\"next_step\":\"REPLAN\",\"note\":\"n\","
               "\"gaps\":null,\"extra\":[1,2]}",
     0, NULL, 0, LOOM__REVIEW_REPLAN, 0},
    {"garbage", "I think it is fine.", LOOM_EPROTO, "no JSON object", 0, 0,
     0},
    {"empty", "", LOOM_EPROTO, "no JSON object", 0, 0, 0},
    {"array", "[" GOOD "]", 0, NULL, 0, LOOM__REVIEW_GATHER_MORE, 1},
    {"bad json", "{\"complete\": false, \"note\": }", LOOM_EPROTO,
     "no JSON object", 0, 0, 0},
    {"complete string",
     "{\"complete\":\"no\",\"next_step\":\"proceed\",\"note\":\"n\"}",
     LOOM_EPROTO, "\"complete\"", 0, 0, 0},
    {"complete missing", "{\"next_step\":\"proceed\",\"note\":\"n\"}",
     LOOM_EPROTO, "\"complete\"", 0, 0, 0},
    {"unknown step",
     "{\"complete\":true,\"next_step\":\"stop\",\"note\":\"n\"}", LOOM_EPROTO,
     "\"next_step\"", 0, 0, 0},
    {"long step",
     "{\"complete\":true,\"next_step\":\"proceed                           "
     "        \",\"note\":\"n\"}",
     LOOM_EPROTO, "\"next_step\"", 0, 0, 0},
    {"step number", "{\"complete\":true,\"next_step\":1,\"note\":\"n\"}",
     LOOM_EPROTO, "\"next_step\"", 0, 0, 0},
    {"note missing", "{\"complete\":true,\"next_step\":\"proceed\"}",
     LOOM_EPROTO, "\"note\"", 0, 0, 0},
    {"note object",
     "{\"complete\":true,\"next_step\":\"proceed\",\"note\":{}}", LOOM_EPROTO,
     "\"note\"", 0, 0, 0},
    {"gaps string",
     "{\"complete\":true,\"next_step\":\"proceed\",\"note\":\"\",\"gaps\":"
     "\"x\"}",
     LOOM_EPROTO, "\"gaps\"", 0, 0, 0},
    {"gaps numbers",
     "{\"complete\":true,\"next_step\":\"proceed\",\"note\":\"\",\"gaps\":"
     "[\"a\",1]}",
     LOOM_EPROTO, "\"gaps\"", 0, 0, 0},
    /* The first object that parses is the one taken. */
    {"first object wins", "{} then " GOOD, LOOM_EPROTO, "\"complete\"", 0, 0,
     0},
};

static void test_parse_table(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(parse_cases) / sizeof(parse_cases[0]);
         i++) {
        const parse_case *k = &parse_cases[i];
        loom__review r;
        int rc = loom__review_parse(&r, k->in, strlen(k->in));
        if (rc != k->rc)
            fail_msg("%s: rc %d, want %d (%s)", k->name, rc, k->rc,
                     loom_error_last());
        if (rc) {
            if (!strstr(loom_error_last(), k->why))
                fail_msg("%s: message '%s' lacks '%s'", k->name,
                         loom_error_last(), k->why);
            assert_null(r.note);
            assert_null(r.gaps);
            continue;
        }
        if (r.complete != k->complete || r.next_step != k->step ||
            r.gaps_len != k->gaps)
            fail_msg("%s: complete %d step %d gaps %zu", k->name, r.complete,
                     (int)r.next_step, r.gaps_len);
        assert_non_null(r.note);
        loom__review_clear(&r);
    }
    loom__review_clear(NULL);
}

static void test_parse_limits(void **state)
{
    loom__review r;
    char *note, *gap, *in, *pre;
    int n;

    (void)state;
    /* The note: exactly at the limit kept, one byte more cut (on a
     * character, "..." included). */
    note = repeat("n", LOOM_REVIEW_NOTE_MAX);
    n = asprintf(&in, "{\"complete\":false,\"next_step\":\"replan\","
                      "\"note\":\"%s\"}", note);
    assert_true(n > 0);
    assert_int_equal(loom__review_parse(&r, in, strlen(in)), 0);
    assert_string_equal(r.note, note);
    assert_false(r.note_cut);
    loom__review_clear(&r);
    free(in);
    free(note);
    note = repeat("\xc3\xa9", LOOM_REVIEW_NOTE_MAX / 2 + 1);
    n = asprintf(&in, "{\"complete\":false,\"next_step\":\"replan\","
                      "\"note\":\"%s\"}", note);
    assert_int_equal(loom__review_parse(&r, in, strlen(in)), 0);
    assert_true(r.note_cut);
    assert_true(strlen(r.note) <= LOOM_REVIEW_NOTE_MAX);
    assert_true(strlen(r.note) >= LOOM_REVIEW_NOTE_MAX - 1);
    assert_true(valid_utf8(r.note));
    assert_string_equal(r.note + strlen(r.note) - 3, "...");
    loom__review_clear(&r);
    free(in);
    free(note);

    /* Gaps: the limit kept, the rest counted; a long gap cut. */
    gap = repeat("g", LOOM_REVIEW_GAP_MAX + 1);
    n = asprintf(&in, "{\"complete\":false,\"next_step\":\"proceed\","
                      "\"note\":\"n\",\"gaps\":[\"%s\",\"2\",\"3\",\"4\","
                      "\"5\",\"6\",\"7\",\"8\",\"9\"]}", gap);
    assert_int_equal(loom__review_parse(&r, in, strlen(in)), 0);
    assert_int_equal(r.gaps_len, LOOM_REVIEW_GAPS_MAX);
    assert_int_equal(r.gaps_dropped, 9 - LOOM_REVIEW_GAPS_MAX);
    assert_int_equal(strlen(r.gaps[0]), LOOM_REVIEW_GAP_MAX);
    assert_string_equal(r.gaps[LOOM_REVIEW_GAPS_MAX - 1], "8");
    loom__review_clear(&r);
    free(in);
    n = asprintf(&in, "{\"complete\":false,\"next_step\":\"proceed\","
                      "\"note\":\"n\",\"gaps\":[\"%.*s\",\"2\",\"3\",\"4\","
                      "\"5\",\"6\",\"7\",\"8\"]}", LOOM_REVIEW_GAP_MAX, gap);
    assert_int_equal(loom__review_parse(&r, in, strlen(in)), 0);
    assert_int_equal(r.gaps_len, LOOM_REVIEW_GAPS_MAX);
    assert_int_equal(r.gaps_dropped, 0);
    assert_memory_equal(r.gaps[0], gap, LOOM_REVIEW_GAP_MAX);
    assert_int_equal(strlen(r.gaps[0]), LOOM_REVIEW_GAP_MAX);
    loom__review_clear(&r);
    free(in);
    free(gap);

    /* Braces that do not start JSON: the attempts run out. */
    pre = repeat("{x ", LOOM_REVIEW_PARSE_ATTEMPTS - 1);
    n = asprintf(&in, "%s%s", pre, GOOD);
    assert_int_equal(loom__review_parse(&r, in, strlen(in)), 0);
    loom__review_clear(&r);
    free(in);
    free(pre);
    pre = repeat("{x ", LOOM_REVIEW_PARSE_ATTEMPTS);
    n = asprintf(&in, "%s%s", pre, GOOD);
    assert_int_equal(loom__review_parse(&r, in, strlen(in)), LOOM_EPROTO);
    free(in);
    free(pre);
    (void)n;
}

/* ---- the note ---- */

static void test_note(void **state)
{
    const char *in = "{\"complete\":false,\"gaps\":[\"the 2023 figure\","
                     "\"a second source\"],\"next_step\":\"gather_more\","
                     "\"note\":\"Search the statistics bureau.\"}";
    loom__review r;
    char *note = NULL, *big;
    char *gaps[LOOM_REVIEW_GAPS_MAX];

    (void)state;
    assert_int_equal(loom__review_parse(&r, in, strlen(in)), 0);
    assert_int_equal(loom__review_note(&note, &r), 0);
    assert_string_equal(note,
                        "[Automatic review of the work so far, written by a "
                        "reviewer model, not by the user]\n"
                        "Request fully answered: no\n"
                        "Suggested next step: gather_more (gather more "
                        "information with your tools before you answer)\n"
                        "Gaps:\n"
                        "- the 2023 figure\n"
                        "- a second source\n"
                        "Note: Search the statistics bureau.");
    free(note);
    loom__review_clear(&r);

    /* No gaps, no note: the verdict alone. */
    memset(&r, 0, sizeof(r));
    r.complete = 1;
    r.next_step = LOOM__REVIEW_PROCEED;
    assert_int_equal(loom__review_note(&note, &r), 0);
    assert_non_null(strstr(note, "answered: yes\n"));
    assert_non_null(strstr(note, "proceed (continue"));
    assert_null(strstr(note, "Gaps"));
    assert_null(strstr(note, "Note:"));
    free(note);
    r.next_step = LOOM__REVIEW_REPLAN;
    assert_int_equal(loom__review_note(&note, &r), 0);
    assert_non_null(strstr(note, "replan (change your approach"));
    free(note);

    /* Everything at its limit: the note stays bounded. */
    big = repeat("x", LOOM_REVIEW_GAP_MAX);
    for (int i = 0; i < LOOM_REVIEW_GAPS_MAX; i++)
        gaps[i] = big;
    r.gaps = gaps;
    r.gaps_len = LOOM_REVIEW_GAPS_MAX;
    r.note = repeat("y", LOOM_REVIEW_NOTE_MAX);
    assert_int_equal(loom__review_note(&note, &r), 0);
    assert_int_equal(count_of(note, "\n- "), LOOM_REVIEW_GAPS_MAX);
    assert_true(strlen(note) < 4096);
    free(note);
    free(r.note);
    free(big);
}

/* ---- whole reviews ---- */

static loom__review_options options(mock_provider *m)
{
    loom__review_options o = LOOM__REVIEW_OPTIONS_INIT;

    o.provider = &m->base;
    o.model = "reviewer-1";
    return o;
}

static void test_run_valid(void **state)
{
    loom_messages ms = sample_run();
    mock_provider m;
    loom__review_options o;
    loom__review_outcome out;
    json_t *ev;

    (void)state;
    mock_init(&m, "```json\n" GOOD "\n```");
    m.model = "mock/reviewer-1";
    o = options(&m);
    assert_int_equal(loom__review_run(&out, &o, ms.items, ms.len, NULL), 0);
    assert_true(out.ok);
    assert_int_equal(out.review.next_step, LOOM__REVIEW_GATHER_MORE);
    assert_string_equal(out.review.note, "Search stats.");
    assert_null(out.reason);
    /* What was sent: the prompt, the transcript, no tools, one answer. */
    assert_int_equal(m.calls, 1);
    assert_string_equal(m.model_seen, "reviewer-1");
    assert_int_equal(m.nmsg, 2);
    assert_int_equal(m.ntools, 0);
    assert_int_equal(m.stream, 0);
    assert_int_equal(m.max_tokens, LOOM_REVIEW_DEFAULT_MAX_TOKENS);
    assert_string_equal(m.system_seen, LOOM_REVIEW_PROMPT);
    assert_non_null(strstr(m.user_seen, "How many live in Tokyo?"));
    assert_non_null(strstr(m.user_seen, "web_fetch"));
    /* Usage and the answering model are kept. */
    assert_int_equal(out.usage.total_tokens, 120);
    assert_true(out.cost_known);
    assert_string_equal(out.model, "mock/reviewer-1");

    ev = loom__review_event_json(&out, 2);
    assert_non_null(ev);
    assert_int_equal(json_integer_value(json_object_get(ev, "iteration")), 2);
    assert_string_equal(json_string_value(json_object_get(ev, "status")),
                        "ok");
    assert_true(json_is_false(json_object_get(ev, "complete")));
    assert_string_equal(json_string_value(json_object_get(ev, "next_step")),
                        "gather_more");
    assert_string_equal(json_string_value(json_array_get(
                            json_object_get(ev, "gaps"), 0)),
                        "the 2023 figure");
    assert_string_equal(json_string_value(json_object_get(ev, "note")),
                        "Search stats.");
    assert_string_equal(json_string_value(json_object_get(ev, "model")),
                        "mock/reviewer-1");
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(ev, "usage"), "cost_micros")),
                     42);
    assert_null(json_object_get(ev, "reason"));
    assert_null(json_object_get(ev, "gaps_dropped"));
    assert_null(json_object_get(ev, "note_cut"));
    json_decref(ev);
    loom__review_outcome_clear(&out);

    /* Options: another prompt, max tokens and transcript size. */
    o.prompt = "judge";
    o.max_tokens = 77;
    o.max_transcript = 120;
    assert_int_equal(loom__review_run(&out, &o, ms.items, ms.len, NULL), 0);
    assert_true(out.ok);
    assert_string_equal(m.system_seen, "judge");
    assert_int_equal(m.max_tokens, 77);
    assert_true(strlen(m.user_seen) <= 120);
    loom__review_outcome_clear(&out);
    loom__review_outcome_clear(NULL);
    mock_clear(&m);
    loom_messages_free(&ms);
}

static void test_run_skipped(void **state)
{
    loom_messages ms = sample_run();
    mock_provider m;
    loom__review_options o;
    loom__review_outcome out;
    char *long_answer;
    json_t *ev;

    (void)state;
    /* Garbage: skipped with the parser's reason and the answer's head. */
    mock_init(&m, "Looks good to me!");
    o = options(&m);
    assert_int_equal(loom__review_run(&out, &o, ms.items, ms.len, NULL), 0);
    assert_false(out.ok);
    assert_non_null(strstr(out.reason, "no JSON object"));
    assert_string_equal(out.answer, "Looks good to me!");
    assert_int_equal(out.usage.total_tokens, 120);
    ev = loom__review_event_json(&out, 3);
    assert_string_equal(json_string_value(json_object_get(ev, "status")),
                        "skipped");
    assert_non_null(
        strstr(json_string_value(json_object_get(ev, "reason")), "JSON"));
    assert_string_equal(json_string_value(json_object_get(ev, "answer")),
                        "Looks good to me!");
    assert_null(json_object_get(ev, "note"));
    assert_non_null(json_object_get(ev, "usage"));
    assert_null(json_object_get(ev, "model"));
    json_decref(ev);
    loom__review_outcome_clear(&out);

    /* Wrong types: skipped, saying which member. */
    m.answer = "{\"complete\": \"yes\", \"next_step\": \"proceed\", "
               "\"note\": \"\"}";
    assert_int_equal(loom__review_run(&out, &o, ms.items, ms.len, NULL), 0);
    assert_false(out.ok);
    assert_non_null(strstr(out.reason, "\"complete\""));
    loom__review_outcome_clear(&out);

    /* Only blanks. */
    m.answer = " \n\t";
    assert_int_equal(loom__review_run(&out, &o, ms.items, ms.len, NULL), 0);
    assert_false(out.ok);
    assert_string_equal(out.reason, "the reviewer returned no text");
    assert_null(out.answer);
    loom__review_outcome_clear(&out);

    /* The provider fails: skipped with its message, never fatal. */
    m.fail_rc = LOOM_EUPSTREAM;
    assert_int_equal(loom__review_run(&out, &o, ms.items, ms.len, NULL), 0);
    assert_false(out.ok);
    assert_string_equal(out.reason,
                        "the review call failed: upstream overloaded");
    assert_null(out.answer);
    loom__review_outcome_clear(&out);
    /* An upstream message that is not UTF-8 still makes a valid event. */
    m.fail_message = "bad \xff\xfe bytes";
    assert_int_equal(loom__review_run(&out, &o, ms.items, ms.len, NULL), 0);
    assert_string_equal(out.reason, "the review call failed: bad ?? bytes");
    ev = loom__review_event_json(&out, 1);
    assert_non_null(ev);
    json_decref(ev);
    loom__review_outcome_clear(&out);
    m.fail_rc = 0;

    /* The answer's size: at the limit read, one byte past skipped. */
    o.max_answer = strlen(GOOD);
    m.answer = GOOD;
    assert_int_equal(loom__review_run(&out, &o, ms.items, ms.len, NULL), 0);
    assert_true(out.ok);
    loom__review_outcome_clear(&out);
    o.max_answer = strlen(GOOD) - 1;
    assert_int_equal(loom__review_run(&out, &o, ms.items, ms.len, NULL), 0);
    assert_false(out.ok);
    assert_non_null(strstr(out.reason, "more than"));
    loom__review_outcome_clear(&out);

    /* The default answer limit, and the head kept of a long answer. */
    o.max_answer = 0;
    long_answer = repeat("z", LOOM_REVIEW_DEFAULT_MAX_ANSWER + 1);
    m.answer = long_answer;
    assert_int_equal(loom__review_run(&out, &o, ms.items, ms.len, NULL), 0);
    assert_false(out.ok);
    assert_int_equal(strlen(out.answer), LOOM_REVIEW_EXCERPT_MAX);
    loom__review_outcome_clear(&out);
    long_answer[LOOM_REVIEW_DEFAULT_MAX_ANSWER] = '\0';
    assert_int_equal(loom__review_run(&out, &o, ms.items, ms.len, NULL), 0);
    assert_false(out.ok);
    assert_non_null(strstr(out.reason, "no JSON object"));
    loom__review_outcome_clear(&out);
    free(long_answer);
    mock_clear(&m);
    loom_messages_free(&ms);
}

static void test_run_errors(void **state)
{
    loom_messages ms = sample_run();
    mock_provider m;
    loom__review_options o = LOOM__REVIEW_OPTIONS_INIT;
    loom__review_outcome out;
    loom_cancel cancel = LOOM_CANCEL_INIT;

    (void)state;
    mock_init(&m, GOOD);
    /* No provider or model: a programming error, not a skip. */
    assert_int_equal(loom__review_run(&out, &o, ms.items, ms.len, NULL),
                     LOOM_EINVALID);
    o.provider = &m.base;
    o.model = "";
    assert_int_equal(loom__review_run(&out, &o, ms.items, ms.len, NULL),
                     LOOM_EINVALID);
    assert_int_equal(loom__review_run(&out, NULL, ms.items, ms.len, NULL),
                     LOOM_EINVALID);
    assert_int_equal(m.calls, 0);
    /* Cancelled: returned, so the run stops. */
    o = options(&m);
    loom_cancel_set(&cancel);
    assert_int_equal(loom__review_run(&out, &o, ms.items, ms.len, &cancel),
                     LOOM_ECANCELED);
    assert_false(out.ok);
    loom__review_outcome_clear(&out);
    mock_clear(&m);
    loom_messages_free(&ms);
}

/* The event of a review whose gaps and note were cut says so. */
static void test_event_cut(void **state)
{
    loom__review_outcome out;
    char *in, *note = repeat("n", LOOM_REVIEW_NOTE_MAX + 1);
    json_t *ev;

    (void)state;
    memset(&out, 0, sizeof(out));
    assert_true(asprintf(&in, "{\"complete\":true,\"next_step\":\"proceed\","
                              "\"note\":\"%s\",\"gaps\":[\"1\",\"2\",\"3\","
                              "\"4\",\"5\",\"6\",\"7\",\"8\",\"9\",\"10\"]}",
                         note) > 0);
    assert_int_equal(loom__review_parse(&out.review, in, strlen(in)), 0);
    out.ok = 1;
    ev = loom__review_event_json(&out, 1);
    assert_int_equal(json_integer_value(json_object_get(ev, "gaps_dropped")),
                     2);
    assert_true(json_is_true(json_object_get(ev, "note_cut")));
    assert_int_equal(json_array_size(json_object_get(ev, "gaps")),
                     LOOM_REVIEW_GAPS_MAX);
    assert_null(json_object_get(json_object_get(ev, "usage"),
                                "cost_micros"));
    json_decref(ev);
    loom__review_outcome_clear(&out);
    free(in);
    free(note);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_transcript),
        cmocka_unit_test(test_transcript_excerpts),
        cmocka_unit_test(test_transcript_budget),
        cmocka_unit_test(test_parse_table),
        cmocka_unit_test(test_parse_limits),
        cmocka_unit_test(test_note),
        cmocka_unit_test(test_run_valid),
        cmocka_unit_test(test_run_skipped),
        cmocka_unit_test(test_run_errors),
        cmocka_unit_test(test_event_cut),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
