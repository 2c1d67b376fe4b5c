/*
 * Tests of the context engine (src/agent/context.c) and of its use by the
 * run loop. Property tests generate hundreds of conversations from a
 * seeded PRNG (many tool rounds, parallel calls, huge tool outputs, huge
 * user messages) and check every request the engine makes: it fits the
 * limit by the engine's own count, keeps every tool call with its
 * results, keeps the system prompt, the current user message and the
 * newest round. Targeted tests cross each limit and check the events;
 * the last ones go through loom_run with a mock provider.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "loom/config.h"
#include "loom/context.h"
#include "loom/run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rnd(void)
{
    /* xorshift64*: deterministic, good enough for test shapes */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 2685821657736338717ULL;
}

/* A number in [lo, hi]. */
static size_t between(size_t lo, size_t hi)
{
    return lo + (size_t)(rnd() % (hi - lo + 1));
}

static int chance(int percent)
{
    return (int)(rnd() % 100) < percent;
}

/* A string of len bytes of words (and some multi-byte characters). */
static char *text_of(size_t len, char tag)
{
    char *s = malloc(len + 1);
    assert_non_null(s);
    for (size_t i = 0; i < len; i++)
        s[i] = (i % 7 == 6) ? ' ' : (char)(tag + (char)(i % 3));
    /* A 2-byte UTF-8 character now and then, never split at the end. */
    for (size_t i = 40; i + 2 < len; i += 97) {
        s[i] = (char)0xC3;
        s[i + 1] = (char)0xA9;
    }
    s[len] = '\0';
    return s;
}

static void add_text(loom_messages *m, loom_role role, size_t len, char tag)
{
    char *t = text_of(len, tag);
    assert_int_equal(loom_messages_add(m, role, t), 0);
    free(t);
}

static int ncall_ids;

/* An assistant message with k calls and their results of the given
 * sizes; a result gets a tool summary with probability summary_pct. */
static void add_round(loom_messages *m, size_t k, const size_t *sizes,
                      int summary_pct)
{
    loom_tool_call calls[8];
    char ids[8][32];

    assert_true(k <= 8);
    for (size_t i = 0; i < k; i++) {
        snprintf(ids[i], sizeof(ids[i]), "call_%d", ncall_ids++);
        calls[i].id = ids[i];
        calls[i].name = "search";
        calls[i].arguments = "{\"q\":\"x\"}";
    }
    assert_int_equal(loom_messages_add_assistant(m, NULL, NULL, calls, k),
                     0);
    for (size_t i = 0; i < k; i++) {
        char *t = text_of(sizes[i], 'a');
        assert_int_equal(
            loom_messages_add_tool_result(m, ids[i], "search", t), 0);
        free(t);
        if (chance(summary_pct)) {
            loom_message *last = &m->items[m->len - 1];
            last->summary = strdup("short summary of the search result");
            assert_non_null(last->summary);
        }
    }
}

static size_t count_all(const loom_message *m, size_t n)
{
    size_t t = 0;
    for (size_t i = 0; i < n; i++)
        t += loom_context_count_message(&m[i], NULL);
    return t;
}

/* Every tool message follows its assistant call, in one unit, and every
 * call of an assistant message is answered right after it. */
static void check_pairs(const loom_message *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (m[i].role == LOOM_ROLE_TOOL) {
            size_t j = i;
            int found = 0;
            while (j > 0 && m[j - 1].role == LOOM_ROLE_TOOL)
                j--;
            assert_true(j > 0);
            assert_int_equal(m[j - 1].role, LOOM_ROLE_ASSISTANT);
            for (size_t c = 0; c < m[j - 1].tool_calls_len; c++)
                found |= strcmp(m[j - 1].tool_calls[c].id,
                                m[i].tool_call_id) == 0;
            assert_true(found);
        }
        if (m[i].role == LOOM_ROLE_ASSISTANT) {
            for (size_t c = 0; c < m[i].tool_calls_len; c++) {
                int found = 0;
                for (size_t j = i + 1;
                     j < n && m[j].role == LOOM_ROLE_TOOL; j++)
                    found |= strcmp(m[j].tool_call_id,
                                    m[i].tool_calls[c].id) == 0;
                assert_true(found);
            }
        }
    }
}

/* ---- a mock summary model ------------------------------------------------ */

typedef struct {
    loom_provider base;
    int calls;
    size_t reply_len; /* bytes of summary text; 0 with fail */
    int fail;
    long last_max_tokens;
    int last_stream;
    size_t last_nmsg;
    int saw_prompt; /* the request's system message was the prompt */
    const char *prompt;
} sum_mock;

static int sum_complete(loom_provider *p, const loom_llm_request *req,
                        loom_llm_event_cb cb, void *payload,
                        loom_llm_response *resp, loom_cancel *cancel)
{
    sum_mock *m = (sum_mock *)p;
    (void)cb;
    (void)payload;
    (void)cancel;

    m->calls++;
    m->last_max_tokens = req->max_tokens;
    m->last_stream = req->stream;
    m->last_nmsg = req->messages_len;
    m->saw_prompt = req->messages_len == 2 &&
                    req->messages[0].role == LOOM_ROLE_SYSTEM &&
                    strcmp(req->messages[0].content,
                           m->prompt ? m->prompt
                                     : LOOM_CONTEXT_SUMMARY_PROMPT) == 0 &&
                    req->messages[1].role == LOOM_ROLE_USER;
    if (m->fail) {
        resp->error.kind = LOOM_UPSTREAM_SERVER;
        resp->error.message = strdup("summary model is down");
        return LOOM_EUPSTREAM;
    }
    resp->text = text_of(m->reply_len, 'S');
    resp->usage.prompt_tokens = 100;
    resp->usage.completion_tokens = 10;
    resp->usage.total_tokens = 110;
    return 0;
}

static void sum_free(loom_provider *p)
{
    (void)p;
}

static const loom_provider_vtable sum_vt = {.version =
                                                LOOM_PROVIDER_VTABLE_VERSION,
                                            .complete = sum_complete,
                                            .free = sum_free};

static void sum_init(sum_mock *m, size_t reply_len)
{
    memset(m, 0, sizeof(*m));
    m->base.vt = &sum_vt;
    m->reply_len = reply_len;
}

/* ---- property tests ------------------------------------------------------ */

typedef struct {
    size_t sys;   /* index of the system prompt: 0 */
    size_t user;  /* the current user message */
    size_t round; /* newest round after it, or SIZE_MAX */
} marks;

static void check_request(const loom_context_result *r,
                          const loom_messages *all, const marks *k,
                          const loom_tool_def *tools, size_t ntools)
{
    const loom_message *o = r->messages;
    size_t n = r->messages_len,
           tt = ntools ? loom_context_count_tools(tools, ntools, NULL) : 0;
    int user_seen = 0;

    /* Fits, by the engine's own count, which it reports. */
    assert_int_equal(count_all(o, n) + tt, r->tokens_after);
    assert_true(r->tokens_after <= r->limit);
    check_pairs(o, n);
    /* The system prompt first, as it is. */
    assert_true(n > 0);
    assert_ptr_equal(o[0].content, all->items[k->sys].content);
    /* The summary right after it when there is one. */
    if (r->summary_in_request) {
        assert_int_equal(o[1].role, LOOM_ROLE_SYSTEM);
        assert_non_null(strstr(o[1].content, r->summary));
    }
    /* The current user message: whole, or cut with the warning. */
    for (size_t i = 0; i < n; i++) {
        const char *uc = all->items[k->user].content;
        if (o[i].role != LOOM_ROLE_USER)
            continue;
        if (o[i].content == uc) {
            user_seen = 1;
            assert_false(r->user_cut);
        } else if (r->user_cut && strncmp(o[i].content, uc, 16) == 0 &&
                   strstr(o[i].content, "[message cut to fit")) {
            user_seen = 1;
        }
    }
    assert_true(user_seen);
    /* The newest round, whole: its call and every result. */
    if (k->round != SIZE_MAX) {
        const loom_message *a = &all->items[k->round];
        size_t found = 0;
        for (size_t i = 0; i < n; i++) {
            if (o[i].tool_calls == a->tool_calls)
                found++;
            for (size_t c = 0; c < a->tool_calls_len; c++)
                if (o[i].role == LOOM_ROLE_TOOL &&
                    o[i].tool_call_id ==
                        all->items[k->round + 1 + c].tool_call_id) {
                    found++;
                    /* Never reduced; at most cut to its share. */
                    assert_null(strstr(o[i].content, "[Earlier result"));
                }
        }
        assert_int_equal(found, 1 + a->tool_calls_len);
    }
}

static size_t pick_size(void)
{
    if (chance(4))
        return between(100000, 300000); /* huge */
    if (chance(20))
        return between(3000, 12000);
    return between(10, 2500);
}

static void tool_defs(loom_tool_def *defs, size_t n, json_t *schema)
{
    static const char *const names[] = {"search", "fetch", "calc", "time",
                                        "note"};
    for (size_t i = 0; i < n; i++) {
        defs[i].name = names[i % 5];
        defs[i].description = "a tool that does a thing for the model";
        defs[i].parameters = schema;
    }
}

/* One generated conversation, fitted at every simulated iteration. */
/* How often each outcome was seen over all cases. */
typedef struct {
    int layouts[4];
    int made, user_cut, cut, fits;
} seen_t;

static void property_case(uint64_t seed, seen_t *seen)
{
    loom_messages all = {0};
    loom_context_options co = LOOM_CONTEXT_OPTIONS_INIT;
    loom_context *ctx = NULL;
    loom_context_result r;
    loom_tool_def defs[5];
    json_t *schema = json_pack("{s:s,s:{s:{s:s}}}", "type", "object",
                               "properties", "q", "type", "string");
    sum_mock sm;
    marks k;
    size_t turns, iters, ntools, prev_covers = 0;
    int use_summary, made = 0, failed = 0;

    rng_state = seed * 0x9E3779B97F4A7C15ULL + 1;
    k.sys = 0;
    k.round = SIZE_MAX;
    co.context_window = (long)between(4000, 40000);
    co.max_output_tokens = co.context_window / 8;
    co.keep_full_tool_results = chance(20);
    use_summary = chance(50);
    sum_init(&sm, between(50, 3000));
    if (use_summary) {
        co.summary_provider = &sm.base;
        co.summary_model = "sum";
        sm.fail = chance(10);
    }
    assert_int_equal(loom_context_new(&ctx, &co), 0);
    ntools = between(0, 5);
    tool_defs(defs, ntools, schema);

    add_text(&all, LOOM_ROLE_SYSTEM, between(20, 400), 's');
    turns = between(0, 30);
    for (size_t t = 0; t < turns; t++) {
        size_t rounds = between(0, 3);
        add_text(&all, LOOM_ROLE_USER,
                 chance(3) ? between(20000, 60000) : between(10, 2000), 'u');
        for (size_t j = 0; j < rounds; j++) {
            size_t kk = between(1, 4), sizes[4];
            for (size_t c = 0; c < kk; c++)
                sizes[c] = pick_size();
            add_round(&all, kk, sizes, 30);
        }
        add_text(&all, LOOM_ROLE_ASSISTANT, between(10, 1500), 'r');
    }
    k.user = all.len;
    add_text(&all, LOOM_ROLE_USER,
             chance(10) ? between(100000, 400000) : between(10, 2000), 'U');

    iters = between(1, 12);
    for (size_t it = 0; it < iters; it++) {
        int rc =
            loom_context_fit(ctx, &r, all.items, all.len, defs, ntools, NULL);
        if (rc != 0)
            fail_msg("seed %llu iteration %zu: %s", (unsigned long long)seed,
                     it, loom_error_last());
        check_request(&r, &all, &k, defs, ntools);
        /* A summary is made by one call and reused after it; a new one
         * covers at least as much as the one it replaces. */
        seen->fits++;
        seen->layouts[r.layout]++;
        seen->user_cut += r.user_cut;
        seen->cut += r.cuts_len > 0;
        if (r.summary_created) {
            seen->made++;
            assert_true(r.summary_covers >= prev_covers);
            made++;
        }
        if (r.summary)
            prev_covers = r.summary_covers;
        if (r.summary_in_request)
            assert_int_equal(r.layout, LOOM_CONTEXT_SUMMARY);
        failed += r.summary_error != NULL;
        /* One model call per summary made (or failed), none else. */
        assert_int_equal(sm.calls, made + failed);
        if (!use_summary)
            assert_int_equal(sm.calls, 0);
        if (sm.fail)
            assert_int_equal(made, 0);
        if (co.keep_full_tool_results)
            assert_int_equal(r.reduced, 0);
        /* The model answers with a new round of parallel calls. */
        {
            size_t kk = between(1, 4), sizes[4];
            for (size_t c = 0; c < kk; c++)
                sizes[c] = pick_size();
            k.round = all.len;
            add_round(&all, kk, sizes, 30);
        }
    }
    loom_context_free(ctx);
    loom_messages_free(&all);
    json_decref(schema);
}

static void test_property_requests_fit(void **state)
{
    seen_t seen;
    (void)state;

    memset(&seen, 0, sizeof(seen));
    for (uint64_t seed = 1; seed <= 300; seed++)
        property_case(seed, &seen);
    /* The generator does reach every step, more than once. */
    print_message("%d fits: full %d, reduced %d, trimmed %d, summary %d; "
                  "%d summaries made, %d user cuts, %d with cuts\n",
                  seen.fits, seen.layouts[0], seen.layouts[1], seen.layouts[2],
                  seen.layouts[3], seen.made, seen.user_cut, seen.cut);
    for (int i = 0; i < 4; i++)
        assert_true(seen.layouts[i] > 10);
    assert_true(seen.made > 10);
    assert_true(seen.user_cut > 10);
    assert_true(seen.cut > 10);
}

/* ---- targeted tests ------------------------------------------------------ */

/* Counts message() calls, and counts like the default. */
typedef struct {
    size_t messages, tools;
} counting;

static size_t cnt_message(const loom_message *m, void *payload)
{
    ((counting *)payload)->messages++;
    return loom_context_count_message(m, NULL);
}

static size_t cnt_tools(const loom_tool_def *t, size_t n, void *payload)
{
    ((counting *)payload)->tools++;
    return loom_context_count_tools(t, n, NULL);
}

static void test_counts_are_reused(void **state)
{
    loom_context_options co = LOOM_CONTEXT_OPTIONS_INIT;
    loom_context *ctx;
    loom_context_result r;
    loom_messages all = {0};
    loom_tool_def defs[2];
    counting c = {0, 0};
    size_t sizes[2] = {100, 200};
    char *fresh;
    (void)state;

    co.context_window = 1000000;
    co.counter.message = cnt_message;
    co.counter.tools = cnt_tools;
    co.counter.payload = &c;
    tool_defs(defs, 2, NULL);
    assert_int_equal(loom_context_new(&ctx, &co), 0);
    add_text(&all, LOOM_ROLE_SYSTEM, 50, 's');
    add_text(&all, LOOM_ROLE_USER, 50, 'u');
    for (int it = 0; it < 20; it++) {
        assert_int_equal(
            loom_context_fit(ctx, &r, all.items, all.len, defs, 2, NULL), 0);
        /* Each message counted once over all iterations so far. */
        assert_int_equal(c.messages, all.len);
        assert_int_equal(c.tools, 1);
        assert_int_equal(loom_context_counted(ctx), all.len);
        assert_int_equal(r.layout, LOOM_CONTEXT_FULL);
        /* The request is the conversation itself, message by message. */
        assert_int_equal(r.messages_len, all.len);
        for (size_t i = 0; i < all.len; i++)
            assert_ptr_equal(r.messages[i].content, all.items[i].content);
        add_round(&all, 2, sizes, 0);
    }
    assert_int_equal(
        loom_context_fit(ctx, &r, all.items, all.len, defs, 2, NULL), 0);
    /* A changed message (new content) is counted again, alone. */
    c.messages = 0;
    fresh = strdup("a different question");
    free(all.items[1].content);
    all.items[1].content = fresh;
    assert_int_equal(
        loom_context_fit(ctx, &r, all.items, all.len, defs, 2, NULL), 0);
    assert_int_equal(c.messages, 1);
    /* Same pointer, same length, different bytes: seen by the hash. */
    c.messages = 0;
    fresh[0] = 'A';
    assert_int_equal(
        loom_context_fit(ctx, &r, all.items, all.len, defs, 2, NULL), 0);
    assert_int_equal(c.messages, 1);
    /* Other tools: counted again. */
    assert_int_equal(
        loom_context_fit(ctx, &r, all.items, all.len, defs, 1, NULL), 0);
    assert_int_equal(c.tools, 2);
    assert_int_equal(r.tools_tokens, loom_context_count_tools(defs, 1, NULL));
    loom_context_free(ctx);
    loom_messages_free(&all);
}

static void test_tool_result_cut_marker(void **state)
{
    loom_context_options co = LOOM_CONTEXT_OPTIONS_INIT;
    loom_context *ctx;
    loom_context_result r;
    loom_messages all = {0};
    size_t sizes[2] = {102400, 50};
    const char *first_cut;
    json_t *j;
    (void)state;

    co.context_window = 10000;
    co.max_output_tokens = 1000;
    assert_int_equal(loom_context_new(&ctx, &co), 0);
    add_text(&all, LOOM_ROLE_SYSTEM, 50, 's');
    add_text(&all, LOOM_ROLE_USER, 50, 'u');
    add_round(&all, 2, sizes, 0);
    assert_int_equal(
        loom_context_fit(ctx, &r, all.items, all.len, NULL, 0, NULL), 0);
    /* Limit 10000 - 1000 - 200 = 8800; each of 2 results gets 2200. */
    assert_int_equal(r.limit, 8800);
    assert_int_equal(r.cuts_len, 1);
    assert_int_equal(r.cuts[0].index, 3);
    assert_int_equal(r.cuts[0].bytes, 102400);
    assert_string_equal(r.cuts[0].tool_call_id, all.items[3].tool_call_id);
    assert_true(r.cuts[0].tokens_after <= 2200);
    assert_true(r.cuts[0].tokens_before > 25000);
    first_cut = r.messages[3].content;
    assert_non_null(strstr(first_cut, "[tool result cut to fit the context "
                                      "window: "));
    assert_non_null(strstr(first_cut, " of 102400 bytes shown]"));
    assert_int_equal(strncmp(first_cut, all.items[3].content, 1000), 0);
    /* The small result is untouched. */
    assert_ptr_equal(r.messages[4].content, all.items[4].content);
    assert_int_equal(r.cut_total, 1);
    j = loom_context_result_json(&r);
    assert_int_equal(
        json_integer_value(json_object_get(
            json_array_get(json_object_get(j, "cuts"), 0), "bytes")),
        102400);
    json_decref(j);
    /* Next fit: the same cut, reused (not reported again). */
    assert_int_equal(
        loom_context_fit(ctx, &r, all.items, all.len, NULL, 0, NULL), 0);
    assert_int_equal(r.cuts_len, 0);
    assert_int_equal(r.cut_total, 1);
    assert_ptr_equal(r.messages[3].content, first_cut);
    loom_context_free(ctx);
    loom_messages_free(&all);
}

static void test_share_boundary(void **state)
{
    loom_context_options co = LOOM_CONTEXT_OPTIONS_INIT;
    loom_context *ctx;
    loom_context_result r;
    loom_messages all = {0};
    size_t cap, bytes, sizes[1];
    (void)state;

    co.context_window = 10000;
    co.max_output_tokens = 1000; /* limit 8800, one result: cap 4400 */
    assert_int_equal(loom_context_new(&ctx, &co), 0);
    cap = 4400;
    /* A tool message counts 4 + len/4 + id/4 + name/4 ("search": 2). */
    for (int over = 0; over <= 1; over++) {
        loom_messages_free(&all);
        add_text(&all, LOOM_ROLE_SYSTEM, 10, 's');
        add_text(&all, LOOM_ROLE_USER, 10, 'u');
        ncall_ids = 1000000; /* "call_1000000": 12 bytes, 3 tokens */
        bytes = (cap - 4 - 3 - 2) * 4 + (size_t)over;
        sizes[0] = bytes;
        add_round(&all, 1, sizes, 0);
        assert_int_equal(loom_context_count_message(&all.items[3], NULL),
                         cap + (size_t)over);
        assert_int_equal(
            loom_context_fit(ctx, &r, all.items, all.len, NULL, 0, NULL), 0);
        assert_int_equal(r.cut_total, (size_t)over);
    }
    ncall_ids = 0;
    loom_context_free(ctx);
    loom_messages_free(&all);
}

static void test_older_results_reduced_newest_whole(void **state)
{
    loom_context_options co = LOOM_CONTEXT_OPTIONS_INIT;
    loom_context *ctx;
    loom_context_result r;
    loom_messages all = {0};
    size_t sizes[1] = {6000};
    (void)state;

    co.context_window = 8000;
    co.max_output_tokens = 1000; /* limit 6840 */
    co.reduced_result_bytes = 100;
    assert_int_equal(loom_context_new(&ctx, &co), 0);
    add_text(&all, LOOM_ROLE_SYSTEM, 40, 's');
    add_text(&all, LOOM_ROLE_USER, 40, 'u');
    for (int i = 0; i < 8; i++)
        add_round(&all, 1, sizes, 0);
    /* One older result carries the tool's summary. */
    all.items[3].summary = strdup("TOOL SUMMARY: three hits");
    assert_int_equal(
        loom_context_fit(ctx, &r, all.items, all.len, NULL, 0, NULL), 0);
    assert_int_equal(r.layout, LOOM_CONTEXT_REDUCED);
    assert_int_equal(r.messages_len, all.len);
    /* Oldest first: the first result shows the tool's summary. */
    assert_non_null(strstr(r.messages[3].content, "TOOL SUMMARY: three "
                                                  "hits"));
    assert_non_null(strstr(r.messages[3].content, "[Earlier result of "
                                                  "search"));
    assert_non_null(strstr(r.messages[3].content, "(6000 bytes in full)"));
    /* Another shows the head, at most reduced_result_bytes of it. */
    {
        const char *c = r.messages[5].content;
        const char *body = strchr(c, '\n') + 1;
        assert_non_null(strstr(c, "Beginning"));
        assert_int_equal(strlen(body), 100 + 3); /* + "..." */
        assert_int_equal(strncmp(body, all.items[5].content, 100), 0);
    }
    /* The newest result is whole. */
    assert_ptr_equal(r.messages[all.len - 1].content,
                     all.items[all.len - 1].content);
    assert_true(r.reduced >= 2 && r.reduced <= 7);
    loom_context_free(ctx);

    /* Research agents keep every result whole: turns go instead, and
     * here nothing else can go, so rounds of this turn are dropped. */
    co.keep_full_tool_results = 1;
    assert_int_equal(loom_context_new(&ctx, &co), 0);
    assert_int_equal(
        loom_context_fit(ctx, &r, all.items, all.len, NULL, 0, NULL), 0);
    assert_int_equal(r.reduced, 0);
    assert_int_equal(r.layout, LOOM_CONTEXT_TRIMMED);
    assert_true(r.dropped_rounds >= 1);
    for (size_t i = 0; i < r.messages_len; i++)
        if (r.messages[i].role == LOOM_ROLE_TOOL)
            assert_null(strstr(r.messages[i].content, "[Earlier"));
    check_pairs(r.messages, r.messages_len);
    loom_context_free(ctx);
    loom_messages_free(&all);
}

/* Gives m one image part (a tool's image, loom_tool_ctx.images). */
static void give_image(loom_message *m)
{
    loom_part img = {
        .kind = LOOM_PART_IMAGE, .data = "iVBORw0KGgo=", .mime = "image/png"};

    assert_non_null(m->parts = calloc(1, sizeof(*m->parts)));
    assert_int_equal(loom_part_copy(&m->parts[0], &img), 0);
    m->parts_len = 1;
}

/* A reduced result is shown without its images; a whole one keeps them. */
static void test_reduced_result_drops_images(void **state)
{
    loom_context_options co = LOOM_CONTEXT_OPTIONS_INIT;
    loom_context *ctx;
    loom_context_result r;
    loom_messages all = {0};
    size_t sizes[1] = {6000};
    (void)state;

    co.context_window = 8000;
    co.max_output_tokens = 1000;
    co.reduced_result_bytes = 100;
    assert_int_equal(loom_context_new(&ctx, &co), 0);
    add_text(&all, LOOM_ROLE_SYSTEM, 40, 's');
    add_text(&all, LOOM_ROLE_USER, 40, 'u');
    for (int i = 0; i < 8; i++)
        add_round(&all, 1, sizes, 0);
    give_image(&all.items[3]);
    give_image(&all.items[all.len - 1]);
    assert_int_equal(
        loom_context_fit(ctx, &r, all.items, all.len, NULL, 0, NULL), 0);
    assert_int_equal(r.layout, LOOM_CONTEXT_REDUCED);
    assert_non_null(strstr(r.messages[3].content, "[Earlier result of "));
    assert_null(r.messages[3].parts);
    assert_int_equal(r.messages[3].parts_len, 0);
    assert_ptr_equal(r.messages[all.len - 1].parts,
                     all.items[all.len - 1].parts);
    assert_int_equal(r.messages[all.len - 1].parts_len, 1);
    loom_context_free(ctx);
    loom_messages_free(&all);
}

static void test_old_turns_dropped_oldest_first(void **state)
{
    loom_context_options co = LOOM_CONTEXT_OPTIONS_INIT;
    loom_context *ctx;
    loom_context_result r;
    loom_messages all = {0};
    size_t sizes[2] = {400, 400};
    json_t *j;
    (void)state;

    co.context_window = 4000;
    co.max_output_tokens = 500; /* limit 3420 */
    co.keep_full_tool_results = 1;
    assert_int_equal(loom_context_new(&ctx, &co), 0);
    add_text(&all, LOOM_ROLE_SYSTEM, 40, 's');
    for (int t = 0; t < 10; t++) {
        char q[32];
        snprintf(q, sizeof(q), "question %d", t);
        assert_int_equal(loom_messages_add(&all, LOOM_ROLE_USER, q), 0);
        add_round(&all, 2, sizes, 0);
        add_text(&all, LOOM_ROLE_ASSISTANT, 800, 'r');
    }
    assert_int_equal(loom_messages_add(&all, LOOM_ROLE_USER, "now"), 0);
    assert_int_equal(
        loom_context_fit(ctx, &r, all.items, all.len, NULL, 0, NULL), 0);
    assert_int_equal(r.layout, LOOM_CONTEXT_TRIMMED);
    assert_true(r.dropped_turns > 0 && r.dropped_turns < 10);
    assert_int_equal(r.dropped_rounds, 0);
    assert_int_equal(r.dropped_messages, r.dropped_turns * 5);
    /* The newest turns stay, starting at a user message. */
    assert_int_equal(r.messages[1].role, LOOM_ROLE_USER);
    {
        char q[32];
        snprintf(q, sizeof(q), "question %zu", r.dropped_turns);
        assert_string_equal(r.messages[1].content, q);
    }
    assert_string_equal(r.messages[r.messages_len - 1].content, "now");
    check_pairs(r.messages, r.messages_len);
    j = loom_context_result_json(&r);
    assert_string_equal(json_string_value(json_object_get(j, "layout")),
                        "trimmed");
    assert_int_equal(json_integer_value(json_object_get(j, "dropped_turns")),
                     (json_int_t)r.dropped_turns);
    assert_true(json_integer_value(json_object_get(j, "tokens_before")) >
                json_integer_value(json_object_get(j, "tokens_after")));
    assert_int_equal(json_integer_value(json_object_get(j, "limit")), 3420);
    json_decref(j);
    loom_context_free(ctx);
    loom_messages_free(&all);
}

static void test_user_message_too_large(void **state)
{
    loom_context_options co = LOOM_CONTEXT_OPTIONS_INIT;
    loom_context *ctx;
    loom_context_result r;
    loom_messages all = {0};
    const char *c;
    json_t *j, *w;
    (void)state;

    co.context_window = 4000;
    co.max_output_tokens = 500; /* limit 3420 */
    assert_int_equal(loom_context_new(&ctx, &co), 0);
    add_text(&all, LOOM_ROLE_SYSTEM, 400, 's'); /* 104 tokens */
    add_text(&all, LOOM_ROLE_USER, 300, 'u');
    add_text(&all, LOOM_ROLE_ASSISTANT, 300, 'r');
    add_text(&all, LOOM_ROLE_USER, 40000, 'U');
    assert_int_equal(
        loom_context_fit(ctx, &r, all.items, all.len, NULL, 0, NULL), 0);
    assert_int_equal(r.user_cut, 1);
    assert_int_equal(r.user_tokens_before, 10004);
    assert_true(r.user_tokens_after <= 3420 - 104);
    /* The system prompt, the old turn (the cut leaves room for it: the
     * cut aims a tenth under what the pinned parts leave) and the cut
     * message last. */
    assert_int_equal(r.messages_len, 4);
    assert_int_equal(r.dropped_turns, 0);
    assert_ptr_equal(r.messages[0].content, all.items[0].content);
    assert_ptr_equal(r.messages[1].content, all.items[1].content);
    assert_ptr_equal(r.messages[2].content, all.items[2].content);
    c = r.messages[r.messages_len - 1].content;
    assert_int_equal(strncmp(c, all.items[3].content, 2000), 0);
    assert_non_null(strstr(c, "[message cut to fit the context window: "));
    assert_non_null(strstr(c, " of 40000 bytes shown]"));
    assert_true(r.tokens_after <= r.limit);
    j = loom_context_result_json(&r);
    w = json_array_get(json_object_get(j, "warnings"), 0);
    assert_string_equal(json_string_value(json_object_get(w, "code")),
                        "user_message_too_large");
    assert_int_equal(json_integer_value(json_object_get(w, "tokens")), 10004);
    json_decref(j);
    loom_context_free(ctx);
    loom_messages_free(&all);
}

static void test_nothing_fits_names_sizes(void **state)
{
    loom_context_options co = LOOM_CONTEXT_OPTIONS_INIT;
    loom_context *ctx;
    loom_context_result r;
    loom_messages all = {0};
    const char *msg;
    (void)state;

    co.context_window = 4000;
    co.max_output_tokens = 500; /* limit 3420 */
    assert_int_equal(loom_context_new(&ctx, &co), 0);
    /* The system prompt alone leaves less than 64 tokens. */
    add_text(&all, LOOM_ROLE_SYSTEM, 13428, 's'); /* 3361 tokens */
    add_text(&all, LOOM_ROLE_USER, 400, 'u');
    assert_int_equal(
        loom_context_fit(ctx, &r, all.items, all.len, NULL, 0, NULL),
        LOOM_ETOOLARGE);
    msg = loom_error_last();
    assert_non_null(strstr(msg, "cannot fit the context window"));
    assert_non_null(strstr(msg, "system prompt 3361"));
    assert_non_null(strstr(msg, "current user message 104"));
    assert_non_null(strstr(msg, "limit 3420 (window 4000 - max output 500 "
                                "- margin 80)"));
    /* 7 tokens fewer: 66 are left, the user message is cut to them. */
    free(all.items[0].content);
    all.items[0].content = text_of(13400, 's'); /* 3354 tokens */
    assert_int_equal(
        loom_context_fit(ctx, &r, all.items, all.len, NULL, 0, NULL), 0);
    assert_int_equal(r.user_cut, 1);
    assert_true(r.user_tokens_after <= 66);
    assert_true(r.tokens_after <= 3420);
    /* Tools alone too large. */
    {
        loom_tool_def d[200];
        char want[64];
        tool_defs(d, 200, NULL);
        snprintf(want, sizeof(want), "tools %zu",
                 loom_context_count_tools(d, 200, NULL));
        assert_true(loom_context_count_tools(d, 200, NULL) > 3420);
        assert_int_equal(
            loom_context_fit(ctx, &r, all.items, all.len, d, 200, NULL),
            LOOM_ETOOLARGE);
        assert_non_null(strstr(loom_error_last(), want));
    }
    loom_context_free(ctx);
    loom_messages_free(&all);
}

/* A counter that never lets a cut get under the limit: the engine must
 * stop trying and fail cleanly. */
static size_t stubborn(const loom_message *m, void *payload)
{
    (void)payload;
    if (m->content && strstr(m->content, "cut to fit"))
        return 1000000;
    return loom_context_count_message(m, NULL);
}

static void test_cut_attempts_are_bounded(void **state)
{
    loom_context_options co = LOOM_CONTEXT_OPTIONS_INIT;
    loom_context *ctx;
    loom_context_result r;
    loom_messages all = {0};
    (void)state;

    co.context_window = 4000;
    co.max_output_tokens = 500;
    co.counter.message = stubborn;
    assert_int_equal(loom_context_new(&ctx, &co), 0);
    add_text(&all, LOOM_ROLE_SYSTEM, 40, 's');
    add_text(&all, LOOM_ROLE_USER, 40000, 'U');
    assert_int_equal(
        loom_context_fit(ctx, &r, all.items, all.len, NULL, 0, NULL),
        LOOM_ETOOLARGE);
    /* 16 attempts and the marker alone, then it gave up. */
    assert_true(loom_context_counted(ctx) <= 2 + 16 + 1);
    loom_context_free(ctx);
    loom_messages_free(&all);
}

/* A conversation whose current turn outgrows the window round by round. */
static void grow_rounds(loom_messages *all, int rounds, size_t size)
{
    size_t sizes[1];
    sizes[0] = size;
    for (int i = 0; i < rounds; i++)
        add_round(all, 1, sizes, 0);
}

static void test_summary_made_once_then_reused(void **state)
{
    loom_context_options co = LOOM_CONTEXT_OPTIONS_INIT;
    loom_context *ctx;
    loom_context_result r;
    loom_messages all = {0};
    sum_mock sm;
    const char *first_summary_msg = NULL;
    size_t covers = 0;
    int made = 0, reused = 0;
    json_t *j, *s;
    (void)state;

    sum_init(&sm, 400);
    co.context_window = 8000;
    co.max_output_tokens = 1000; /* limit 6840 */
    co.keep_full_tool_results = 1;
    co.summary_provider = &sm.base;
    co.summary_model = "summariser";
    assert_int_equal(loom_context_new(&ctx, &co), 0);
    add_text(&all, LOOM_ROLE_SYSTEM, 100, 's');
    add_text(&all, LOOM_ROLE_USER, 100, 'u');
    /* 1000-byte results: ~260 tokens a round. The first rounds fit. */
    for (int it = 0; it < 40; it++) {
        assert_int_equal(
            loom_context_fit(ctx, &r, all.items, all.len, NULL, 0, NULL), 0);
        assert_true(r.tokens_after <= r.limit);
        check_pairs(r.messages, r.messages_len);
        if (r.summary_created) {
            made++;
            j = loom_context_result_json(&r);
            s = json_object_get(j, "summary");
            assert_true(json_is_true(json_object_get(s, "created")));
            assert_non_null(json_string_value(json_object_get(s, "text")));
            assert_int_equal(json_integer_value(json_object_get(
                                 json_object_get(s, "usage"), "total_tokens")),
                             110);
            json_decref(j);
            assert_int_equal(r.summary_usage.total_tokens, 110);
            first_summary_msg = r.messages[1].content;
            covers = r.summary_covers;
            /* The user message is kept after the summary. */
            assert_string_equal(r.messages[2].content, all.items[1].content);
        } else if (r.summary_in_request) {
            reused++;
            if (made == 1 && reused < 3) {
                /* Reused as is: the same string, the same coverage. */
                assert_ptr_equal(r.messages[1].content, first_summary_msg);
                assert_int_equal(r.summary_covers, covers);
            }
        }
        assert_int_equal(sm.calls, made);
        grow_rounds(&all, 1, 1000);
    }
    assert_true(made >= 1);
    /* Made once, then reused by several calls before any refresh. */
    assert_true(reused >= 3);
    assert_true(made <= 40 / 4);
    assert_int_equal(sm.last_stream, 0);
    assert_int_equal(sm.last_max_tokens, 855); /* min(1024, 6840 / 8) */
    assert_true(sm.saw_prompt);
    assert_non_null(loom_context_summary(ctx, &covers));
    assert_true(covers > 0);
    loom_context_free(ctx);
    loom_messages_free(&all);
}

static void test_summary_too_long_is_cut(void **state)
{
    loom_context_options co = LOOM_CONTEXT_OPTIONS_INIT;
    loom_context *ctx;
    loom_context_result r;
    loom_messages all = {0};
    sum_mock sm;
    (void)state;

    sum_init(&sm, 20000); /* far past summary_max_tokens */
    co.context_window = 8000;
    co.max_output_tokens = 1000;
    co.keep_full_tool_results = 1;
    co.summary_provider = &sm.base;
    co.summary_max_tokens = 300;
    co.summary_prompt = "Summarise, please.";
    sm.prompt = "Summarise, please.";
    assert_int_equal(loom_context_new(&ctx, &co), 0);
    add_text(&all, LOOM_ROLE_SYSTEM, 100, 's');
    add_text(&all, LOOM_ROLE_USER, 100, 'u');
    grow_rounds(&all, 30, 1000);
    assert_int_equal(
        loom_context_fit(ctx, &r, all.items, all.len, NULL, 0, NULL), 0);
    assert_int_equal(r.summary_created, 1);
    assert_true(sm.saw_prompt);
    assert_int_equal(sm.last_max_tokens, 300);
    assert_true(r.summary_tokens <= 300);
    assert_int_equal(loom_context_count_message(&r.messages[1], NULL),
                     r.summary_tokens);
    assert_non_null(strstr(r.messages[1].content, "[summary cut to fit"));
    loom_context_free(ctx);
    loom_messages_free(&all);
}

static void test_summary_failure_drops_rounds(void **state)
{
    loom_context_options co = LOOM_CONTEXT_OPTIONS_INIT;
    loom_context *ctx;
    loom_context_result r;
    loom_messages all = {0};
    sum_mock sm;
    json_t *j, *w;
    (void)state;

    sum_init(&sm, 0);
    sm.fail = 1;
    co.context_window = 8000;
    co.max_output_tokens = 1000;
    co.keep_full_tool_results = 1;
    co.summary_provider = &sm.base;
    assert_int_equal(loom_context_new(&ctx, &co), 0);
    add_text(&all, LOOM_ROLE_SYSTEM, 100, 's');
    add_text(&all, LOOM_ROLE_USER, 100, 'u');
    grow_rounds(&all, 30, 1000);
    assert_int_equal(
        loom_context_fit(ctx, &r, all.items, all.len, NULL, 0, NULL), 0);
    assert_int_equal(sm.calls, 1);
    assert_null(r.summary);
    assert_string_equal(r.summary_error, "summary model is down");
    assert_int_equal(r.layout, LOOM_CONTEXT_TRIMMED);
    assert_true(r.dropped_rounds > 0);
    assert_true(r.tokens_after <= r.limit);
    check_pairs(r.messages, r.messages_len);
    /* The newest round is the last thing in the request. */
    assert_ptr_equal(r.messages[r.messages_len - 1].content,
                     all.items[all.len - 1].content);
    j = loom_context_result_json(&r);
    w = json_array_get(json_object_get(j, "warnings"), 0);
    assert_string_equal(json_string_value(json_object_get(w, "code")),
                        "summary_failed");
    json_decref(j);
    loom_context_free(ctx);
    loom_messages_free(&all);
}

static void test_stored_summary_used(void **state)
{
    loom_context_options co = LOOM_CONTEXT_OPTIONS_INIT;
    loom_context *ctx;
    loom_context_result r;
    loom_messages all = {0};
    size_t sizes[2] = {100, 100};
    (void)state;

    co.context_window = 100000;
    co.summary = "they talked about cats";
    co.summary_covers = 3; /* ends inside the round 2..4 */
    assert_int_equal(loom_context_new(&ctx, &co), 0);
    add_text(&all, LOOM_ROLE_SYSTEM, 100, 's');
    add_text(&all, LOOM_ROLE_USER, 100, 'u');      /* 1 */
    add_round(&all, 2, sizes, 0);                  /* 2, 3, 4 */
    add_text(&all, LOOM_ROLE_ASSISTANT, 100, 'r'); /* 5 */
    assert_int_equal(loom_messages_add(&all, LOOM_ROLE_USER, "next"), 0);
    assert_int_equal(
        loom_context_fit(ctx, &r, all.items, all.len, NULL, 0, NULL), 0);
    assert_int_equal(r.layout, LOOM_CONTEXT_SUMMARY);
    /* Coverage ending inside a unit moves to its end: 1..4 replaced. */
    assert_int_equal(r.messages_len, 4);
    assert_non_null(strstr(r.messages[1].content, "they talked about cats"));
    assert_ptr_equal(r.messages[2].content, all.items[5].content);
    assert_string_equal(r.messages[3].content, "next");
    assert_int_equal(r.summary_created, 0);
    assert_int_equal(r.dropped_messages, 4);
    check_pairs(r.messages, r.messages_len);
    loom_context_free(ctx);
    loom_messages_free(&all);
}

static void test_bad_options_and_set_window(void **state)
{
    loom_context_options co = LOOM_CONTEXT_OPTIONS_INIT;
    loom_context *ctx = NULL;
    loom_context_result r;
    loom_messages all = {0};
    (void)state;

    assert_int_equal(loom_context_new(&ctx, &co), LOOM_EINVALID);
    co.context_window = 1000;
    co.max_output_tokens = 1000;
    assert_int_equal(loom_context_new(&ctx, &co), LOOM_EINVALID);
    co.max_output_tokens = 0;
    co.tool_result_share = 1.5;
    assert_int_equal(loom_context_new(&ctx, &co), LOOM_EINVALID);
    co.tool_result_share = 0;
    co.version = 99;
    assert_int_equal(loom_context_new(&ctx, &co), LOOM_EINVALID);
    co.version = LOOM_CONTEXT_OPTIONS_VERSION;
    assert_int_equal(loom_context_new(&ctx, &co), 0);
    /* Defaults: max output min(4096, 1000/4), margin max(16, 1000/50). */
    add_text(&all, LOOM_ROLE_USER, 40, 'u');
    assert_int_equal(
        loom_context_fit(ctx, &r, all.items, all.len, NULL, 0, NULL), 0);
    assert_int_equal(r.max_output_tokens, 250);
    assert_int_equal(r.margin, 20);
    assert_int_equal(r.limit, 730);
    assert_int_equal(loom_context_set_window(ctx, 100, 200), LOOM_EINVALID);
    assert_int_equal(loom_context_set_window(ctx, 100000, 8000), 0);
    assert_int_equal(
        loom_context_fit(ctx, &r, all.items, all.len, NULL, 0, NULL), 0);
    assert_int_equal(r.limit, 100000 - 8000 - 2000);
    assert_string_equal(loom_context_layout_name(LOOM_CONTEXT_SUMMARY),
                        "summary");
    loom_context_free(ctx);
    loom_context_free(NULL);
    loom_messages_free(&all);
}

/* ---- through the run loop ------------------------------------------------ */

/*
 * A scripted model for loom_run: `rounds` answers that each call the tool
 * `big` (whose output is large), then a text answer. A request without
 * tools and without streaming is a summary request (the run's own model
 * writes summaries by default) and gets a summary.
 */
typedef struct {
    loom_provider base;
    int rounds, next, calls, summary_calls;
    long total;      /* usage reported, summaries included */
    size_t max_seen; /* largest request, by the default count */
    size_t limit;    /* what every request must stay within */
    int saw_summary_msg;
    int saw_tool_summary; /* a reduced result showing a tool's summary */
} run_mock;

static int run_complete(loom_provider *p, const loom_llm_request *req,
                        loom_llm_event_cb cb, void *payload,
                        loom_llm_response *resp, loom_cancel *cancel)
{
    run_mock *m = (run_mock *)p;
    size_t t = count_all(req->messages, req->messages_len) +
               (req->tools_len
                    ? loom_context_count_tools(req->tools, req->tools_len, NULL)
                    : 0);
    (void)cancel;

    if (!req->stream && !req->tools_len) {
        m->summary_calls++;
        resp->text = strdup("SUMMARY: big was called many times");
        resp->usage.prompt_tokens = 50;
        resp->usage.completion_tokens = 5;
        resp->usage.total_tokens = 55;
        m->total += 55;
        return 0;
    }
    m->calls++;
    if (t > m->max_seen)
        m->max_seen = t;
    for (size_t i = 0; i < req->messages_len; i++)
        if (req->messages[i].role == LOOM_ROLE_SYSTEM &&
            req->messages[i].content &&
            strstr(req->messages[i].content, "SUMMARY: big"))
            m->saw_summary_msg = 1;
    for (size_t i = 0; i < req->messages_len; i++)
        if (req->messages[i].role == LOOM_ROLE_TOOL &&
            strstr(req->messages[i].content, "Summary:]\nTOOL-SUMMARY"))
            m->saw_tool_summary = 1;
    check_pairs(req->messages, req->messages_len);
    if (m->next++ < m->rounds) {
        char id[32], args[32];
        loom_llm_event ev;
        snprintf(id, sizeof(id), "c%d", m->next);
        /* Arguments differ per round: the run skips repeated calls. */
        snprintf(args, sizeof(args), "{\"round\":%d}", m->next);
        memset(&ev, 0, sizeof(ev));
        ev.type = LOOM_LLM_TOOL_CALL_DELTA;
        ev.tool_id = id;
        ev.tool_name = "big";
        ev.args_delta = args;
        if (cb(&ev, payload))
            return LOOM_ECANCELED;
        resp->text = strdup("");
        resp->tool_calls = calloc(1, sizeof(loom_tool_call));
        resp->tool_calls_len = 1;
        resp->tool_calls[0].id = strdup(id);
        resp->tool_calls[0].name = strdup("big");
        resp->tool_calls[0].arguments = strdup(args);
        resp->finish_reason = strdup("tool_calls");
    } else {
        resp->text = strdup("all done");
        resp->finish_reason = strdup("stop");
    }
    resp->usage.prompt_tokens = (long)t;
    resp->usage.completion_tokens = 1;
    resp->usage.total_tokens = (long)t + 1;
    m->total += (long)t + 1;
    return 0;
}

static const loom_provider_vtable run_vt = {.version =
                                                LOOM_PROVIDER_VTABLE_VERSION,
                                            .complete = run_complete,
                                            .free = sum_free};

static int big_exec(const json_t *args, const loom_tool_ctx *ctx, loom_buf *out,
                    void *payload)
{
    char *t = text_of(12000, 'b');
    int rc = loom_buf_puts(out, t);
    (void)args;
    (void)ctx;
    (void)payload;
    free(t);
    return rc;
}

static int collect(const loom_event *ev, void *payload)
{
    json_array_append_new((json_t *)payload, loom_event_to_json(ev));
    return 0;
}

static loom_tool_registry *big_registry(void)
{
    loom_tool_registry *reg;
    loom_tool t;

    assert_int_equal(loom_tool_registry_new(&reg), 0);
    memset(&t, 0, sizeof(t));
    t.name = "big";
    t.description = "returns a lot of text";
    t.execute = big_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    return reg;
}

static void test_run_emits_context_events(void **state)
{
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_tool_registry *reg = big_registry();
    loom_messages hist = {0};
    json_t *events = json_array(), *e;
    run_mock m;
    loom_run *run;
    const loom_messages *added;
    const char *summary;
    size_t i, covers = 0, nctx = 0, full = 0;
    int summary_events = 0;
    (void)state;

    memset(&m, 0, sizeof(m));
    m.base.vt = &run_vt;
    m.rounds = 12;
    ro.provider = &m.base;
    ro.model = "mock/m";
    ro.upstream_model = "m";
    ro.tools = reg;
    ro.max_iterations = 20;
    ro.max_output_tokens = 1000;
    ro.sink.emit = collect;
    ro.sink.payload = events;
    ro.context.window = 16000; /* limit 16000 - 1000 - 320 = 14680 */
    ro.context.keep_full_tool_results = 1; /* so summaries are needed */
    ro.system_prompt = "You are a test.";
    add_text(&hist, LOOM_ROLE_USER, 200, 'u');
    add_text(&hist, LOOM_ROLE_ASSISTANT, 200, 'r');
    add_text(&hist, LOOM_ROLE_USER, 200, 'U');
    assert_int_equal(loom_run_new(&run, &ro, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);
    assert_string_equal(loom_run_text(run), "all done");
    assert_int_equal(m.calls, 13);
    assert_true(m.max_seen <= 14680);
    assert_true(m.summary_calls >= 1);
    assert_true(m.saw_summary_msg);
    /* One context event before every model call, then the call. */
    json_array_foreach(events, i, e)
    {
        const char *type = json_string_value(json_object_get(e, "type"));
        json_t *s;
        if (strcmp(type, "context") != 0)
            continue;
        nctx++;
        assert_int_equal(json_integer_value(json_object_get(e, "iteration")),
                         (json_int_t)nctx);
        assert_int_equal(json_integer_value(json_object_get(e, "limit")),
                         14680);
        assert_true(json_integer_value(json_object_get(e, "tokens_after")) <=
                    14680);
        assert_non_null(json_string_value(json_object_get(e, "layout")));
        full += strcmp(json_string_value(json_object_get(e, "layout")),
                       "full") == 0;
        s = json_object_get(e, "summary");
        if (s && json_is_true(json_object_get(s, "created"))) {
            summary_events++;
            assert_string_equal(
                json_string_value(json_object_get(s, "text")),
                "SUMMARY: big was called many times");
        }
        /* The next event is about the model call it prepared. */
        assert_true(i + 1 < json_array_size(events));
    }
    assert_int_equal(nctx, 13);
    assert_true(full >= 1);
    assert_int_equal(summary_events, m.summary_calls);
    /* The summary is handed out, counted in conversation messages: the
     * history (3) and the run's messages, never the system prompt. */
    summary = loom_run_summary(run, &covers);
    assert_non_null(summary);
    assert_string_equal(summary, "SUMMARY: big was called many times");
    added = loom_run_messages(run);
    assert_true(covers > 3 && covers <= 3 + added->len);
    /* The stored conversation keeps every result whole. */
    for (i = 0; i < added->len; i++)
        if (added->items[i].role == LOOM_ROLE_TOOL)
            assert_int_equal(strlen(added->items[i].content), 12000);
    /* Summary calls are in the run's usage. */
    assert_int_equal(loom_run_usage(run)->total_tokens, m.total);
    loom_run_free(run);
    loom_messages_free(&hist);

    /* The next run starts from the stored summary: its first request
     * carries it and leaves out what it covers. */
    {
        loom_messages conv = {0};
        run_mock m2;
        memset(&m2, 0, sizeof(m2));
        m2.base.vt = &run_vt;
        add_text(&conv, LOOM_ROLE_USER, 200, 'u');
        add_text(&conv, LOOM_ROLE_ASSISTANT, 200, 'r');
        add_text(&conv, LOOM_ROLE_USER, 200, 'U');
        assert_int_equal(loom_messages_add(&conv, LOOM_ROLE_USER, "more?"),
                         0);
        ro.provider = &m2.base;
        ro.context.summary = "SUMMARY: big was called many times";
        ro.context.summary_covers = 2;
        ro.sink.emit = NULL;
        assert_int_equal(loom_run_new(&run, &ro, &conv), 0);
        assert_int_equal(loom_run_execute(run), 0);
        assert_int_equal(m2.saw_summary_msg, 1);
        assert_int_equal(m2.summary_calls, 0);
        /* No new summary was made. */
        assert_null(loom_run_summary(run, &covers));
        assert_int_equal(covers, 0);
        loom_run_free(run);
        loom_messages_free(&conv);
    }
    json_decref(events);
    loom_tool_registry_free(reg);
}

static void test_run_context_off_by_default(void **state)
{
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    json_t *events = json_array(), *e;
    run_mock m;
    loom_run *run;
    size_t i;
    (void)state;

    memset(&m, 0, sizeof(m));
    m.base.vt = &run_vt;
    ro.provider = &m.base;
    ro.upstream_model = "m";
    ro.sink.emit = collect;
    ro.sink.payload = events;
    add_text(&hist, LOOM_ROLE_USER, 400000, 'U'); /* no window: sent */
    assert_int_equal(loom_run_new(&run, &ro, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);
    assert_true(m.max_seen > 100000);
    json_array_foreach(events, i, e)
        assert_string_not_equal(json_string_value(json_object_get(e, "type")),
                                "context");
    loom_run_free(run);
    loom_messages_free(&hist);
    json_decref(events);
}

static void test_run_switches_to_window_fallback(void **state)
{
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_messages hist = {0};
    json_t *events = json_array(), *e, *ctxev = NULL;
    run_mock small, large;
    loom_run *run;
    char *sys = text_of(20000, 's'); /* 5004 tokens */
    size_t i;
    (void)state;

    memset(&small, 0, sizeof(small));
    memset(&large, 0, sizeof(large));
    small.base.vt = large.base.vt = &run_vt;
    ro.provider = &small.base;
    ro.model = "p/small";
    ro.upstream_model = "small";
    ro.system_prompt = sys;
    ro.max_output_tokens = 2000;
    ro.sink.emit = collect;
    ro.sink.payload = events;
    ro.context.window = 4000;
    ro.context.fallback_provider = &large.base;
    ro.context.fallback_model = "p/large";
    ro.context.fallback_upstream_model = "large";
    ro.context.fallback_window = 100000;
    ro.context.fallback_max_output_tokens = 1000;
    add_text(&hist, LOOM_ROLE_USER, 100, 'u');
    assert_int_equal(loom_run_new(&run, &ro, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);
    assert_int_equal(small.calls, 0);
    assert_int_equal(large.calls, 1);
    assert_string_equal(loom_run_model(run), "p/large");
    json_array_foreach(events, i, e)
        if (!strcmp(json_string_value(json_object_get(e, "type")),
                    "context"))
            ctxev = e;
    assert_non_null(ctxev);
    {
        json_t *sw = json_object_get(ctxev, "switched");
        assert_string_equal(json_string_value(json_object_get(sw, "from")),
                            "p/small");
        assert_string_equal(json_string_value(json_object_get(sw, "to")),
                            "p/large");
        assert_non_null(strstr(json_string_value(
                                   json_object_get(sw, "reason")),
                               "system prompt 5004"));
        /* The new model's limit: 100000 - 1000 - 2000. */
        assert_int_equal(json_integer_value(json_object_get(ctxev, "limit")),
                         97000);
    }
    loom_run_free(run);
    json_decref(events);
    events = json_array();

    /* Without a fallback the run fails, naming the sizes. */
    memset(&small, 0, sizeof(small));
    small.base.vt = &run_vt;
    ro.provider = &small.base;
    ro.max_output_tokens = 2000;
    ro.context.fallback_provider = NULL;
    ro.sink.payload = events;
    assert_int_equal(loom_run_new(&run, &ro, &hist), 0);
    assert_int_equal(loom_run_execute(run), LOOM_ETOOLARGE);
    assert_int_equal(loom_run_status_get(run), LOOM_RUN_FAILED);
    assert_non_null(strstr(loom_run_error(run), "system prompt 5004"));
    assert_non_null(strstr(loom_run_error(run), "window 4000"));
    assert_int_equal(small.calls, 0);
    e = json_array_get(events, json_array_size(events) - 1);
    assert_string_equal(json_string_value(json_object_get(e, "type")),
                        "run.failed");
    loom_run_free(run);

    /* A window the options cannot use is refused up front. */
    ro.context.window = 1500; /* not above max output 2000 */
    assert_int_equal(loom_run_new(&run, &ro, &hist), LOOM_EINVALID);
    loom_messages_free(&hist);
    json_decref(events);
    free(sys);
}

#ifdef LOOM_TOOL_SUMMARY_MAX
/* A tool that gives a summary of its long result. */
static int summarising_exec(const json_t *args, const loom_tool_ctx *ctx,
                            loom_buf *out, void *payload)
{
    char *t = text_of(12000, 'b');
    int rc = loom_buf_puts(out, t);
    (void)args;
    (void)payload;
    free(t);
    if (!rc && ctx->summary)
        rc = loom_buf_puts(ctx->summary, "TOOL-SUMMARY: 12000 b's");
    return rc;
}

static void test_run_shows_tool_summaries(void **state)
{
    loom_run_options ro = LOOM_RUN_OPTIONS_INIT;
    loom_tool_registry *reg;
    loom_messages hist = {0};
    loom_tool t;
    run_mock m;
    loom_run *run;
    const loom_messages *added;
    int with_summary = 0;
    (void)state;

    assert_int_equal(loom_tool_registry_new(&reg), 0);
    memset(&t, 0, sizeof(t));
    t.name = "big";
    t.description = "returns a lot of text";
    t.execute = summarising_exec;
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    memset(&m, 0, sizeof(m));
    m.base.vt = &run_vt;
    m.rounds = 8;
    ro.provider = &m.base;
    ro.upstream_model = "m";
    ro.tools = reg;
    ro.max_iterations = 20;
    ro.max_output_tokens = 1000;
    ro.context.window = 16000;
    ro.context.no_summary = 1;
    add_text(&hist, LOOM_ROLE_USER, 200, 'U');
    assert_int_equal(loom_run_new(&run, &ro, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);
    assert_int_equal(m.summary_calls, 0);
    assert_true(m.max_seen <= 14680);
    /* Older results went to the model as the tool's summary... */
    assert_int_equal(m.saw_tool_summary, 1);
    /* ...while the stored results keep both, whole. */
    added = loom_run_messages(run);
    for (size_t i = 0; i < added->len; i++)
        if (added->items[i].role == LOOM_ROLE_TOOL) {
            assert_int_equal(strlen(added->items[i].content), 12000);
            assert_string_equal(added->items[i].summary,
                                "TOOL-SUMMARY: 12000 b's");
            with_summary++;
        }
    assert_int_equal(with_summary, 8);
    loom_run_free(run);
    loom_messages_free(&hist);
    loom_tool_registry_free(reg);
}
#endif

static void test_event_name(void **state)
{
    (void)state;
    assert_string_equal(loom_event_type_name(LOOM_EV_CONTEXT), "context");
}

/* ---- config -------------------------------------------------------------- */

static void test_config_window_fallback(void **state)
{
    loom_config *cfg = NULL;
    const loom_model_config *m;
    loom_model_config tmp;
    (void)state;

    assert_int_equal(
        loom_config_load_string(
            &cfg,
            "providers: {p: {kind: openai, base_url: http://127.0.0.1:1}}\n"
            "models:\n"
            "  p/small: {context_window: 8000,\n"
            "            context_window_fallback: p/large}\n"
            "  p/large: {context_window: 128000}\n"
            "  p/none: {context_window_fallback: null}\n",
            "t.yaml"),
        0);
    assert_int_equal(loom_config_model(&m, &tmp, cfg, "p/small"), 0);
    assert_string_equal(m->context_window_fallback, "p/large");
    assert_int_equal(loom_config_model(&m, &tmp, cfg, "p/large"), 0);
    assert_null(m->context_window_fallback);
    assert_int_equal(loom_config_model(&m, &tmp, cfg, "p/none"), 0);
    assert_null(m->context_window_fallback);
    loom_config_free(cfg);

    assert_int_equal(
        loom_config_load_string(
            &cfg,
            "providers: {p: {kind: openai, base_url: http://127.0.0.1:1}}\n"
            "models:\n"
            "  p/small: {context_window_fallback: p/small}\n",
            "t.yaml"),
        LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(),
                           "models.p/small.context_window_fallback"));
    assert_non_null(strstr(loom_error_last(), "its own"));
    assert_int_equal(
        loom_config_load_string(
            &cfg,
            "providers: {p: {kind: openai, base_url: http://127.0.0.1:1}}\n"
            "models:\n"
            "  p/small: {context_window_fallback: q/large}\n",
            "t.yaml"),
        LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "provider 'q'"));
    assert_int_equal(
        loom_config_load_string(
            &cfg,
            "providers: {p: {kind: openai, base_url: http://127.0.0.1:1}}\n"
            "models:\n"
            "  p/small: {context_window_fallback: [p/a]}\n",
            "t.yaml"),
        LOOM_EINVALID);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_property_requests_fit),
        cmocka_unit_test(test_counts_are_reused),
        cmocka_unit_test(test_tool_result_cut_marker),
        cmocka_unit_test(test_share_boundary),
        cmocka_unit_test(test_older_results_reduced_newest_whole),
        cmocka_unit_test(test_reduced_result_drops_images),
        cmocka_unit_test(test_old_turns_dropped_oldest_first),
        cmocka_unit_test(test_user_message_too_large),
        cmocka_unit_test(test_nothing_fits_names_sizes),
        cmocka_unit_test(test_cut_attempts_are_bounded),
        cmocka_unit_test(test_summary_made_once_then_reused),
        cmocka_unit_test(test_summary_too_long_is_cut),
        cmocka_unit_test(test_summary_failure_drops_rounds),
        cmocka_unit_test(test_stored_summary_used),
        cmocka_unit_test(test_bad_options_and_set_window),
        cmocka_unit_test(test_run_emits_context_events),
        cmocka_unit_test(test_run_context_off_by_default),
        cmocka_unit_test(test_run_switches_to_window_fallback),
#ifdef LOOM_TOOL_SUMMARY_MAX
        cmocka_unit_test(test_run_shows_tool_summaries),
#endif
        cmocka_unit_test(test_event_name),
        cmocka_unit_test(test_config_window_fallback),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
