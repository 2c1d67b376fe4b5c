/*
 * Tests for the sans-I/O SSE parser (include/loom/sse.h). The recorded
 * provider streams in LOOM_VECTORS_DIR are parsed whole, at every two-way
 * split and one byte at a time, and must yield the same events each way;
 * the hand-written cases pin down the WHATWG rules (line ends, BOM, fields,
 * id and retry) and every limit.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loom/sse.h"

/* ---- recording events ------------------------------------------------ */

typedef struct {
    char *event;
    char *data;
    size_t data_len;
    char *id;
    long retry;
} rec_event;

/*
 * Collects events (expect == NULL) or checks them one by one against an
 * earlier recording (expect != NULL) so the split loops allocate nothing.
 */
typedef struct recorder recorder;
struct recorder {
    rec_event *ev;
    size_t n, cap;
    const recorder *expect;
    size_t mismatches;
    size_t abort_at; /* return abort_rc on this event (1-based), 0 never */
    int abort_rc;
};

static char *dupmem(const char *s, size_t len)
{
    char *p = malloc(len + 1);

    assert_non_null(p);
    memcpy(p, s, len);
    p[len] = '\0';
    return p;
}

static int same_event(const rec_event *a, const loom_sse_event *b)
{
    return strcmp(a->event, b->event) == 0 && a->data_len == b->data_len &&
           memcmp(a->data, b->data, b->data_len) == 0 &&
           strcmp(a->id, b->id) == 0 && a->retry == b->retry;
}

static int on_event(const loom_sse_event *ev, void *payload)
{
    recorder *r = payload;

    /* The contract: data is NUL-terminated at data_len. */
    assert_int_equal(ev->data[ev->data_len], '\0');
    if (r->expect) {
        const recorder *want = r->expect;

        if (r->n >= want->n || !same_event(&want->ev[r->n], ev))
            r->mismatches++;
    } else {
        rec_event *e;

        if (r->n == r->cap) {
            r->cap = r->cap ? r->cap * 2 : 16;
            r->ev = realloc(r->ev, r->cap * sizeof(*r->ev));
            assert_non_null(r->ev);
        }
        e = &r->ev[r->n];
        e->event = dupmem(ev->event, strlen(ev->event));
        e->data = dupmem(ev->data, ev->data_len);
        e->data_len = ev->data_len;
        e->id = dupmem(ev->id, strlen(ev->id));
        e->retry = ev->retry;
    }
    r->n++;
    if (r->abort_at && r->n == r->abort_at)
        return r->abort_rc;
    return 0;
}

static void rec_free(recorder *r)
{
    size_t i;

    for (i = 0; i < r->n && !r->expect; i++) {
        free(r->ev[i].event);
        free(r->ev[i].data);
        free(r->ev[i].id);
    }
    free(r->ev);
    memset(r, 0, sizeof(*r));
}

static loom_sse_parser *new_parser(const loom_sse_options *o, recorder *r)
{
    loom_sse_parser *p = NULL;

    assert_int_equal(loom_sse_parser_new(&p, o, on_event, r), 0);
    assert_non_null(p);
    return p;
}

/* Feeds in[0..len) cut at the given offsets, then finishes. Returns the
 * first non-zero code. */
static int run_cuts(loom_sse_parser *p, const char *in, size_t len,
                    const size_t *cuts, size_t ncuts)
{
    size_t i, from = 0;
    int rc;

    for (i = 0; i <= ncuts; i++) {
        size_t to = i < ncuts ? cuts[i] : len;

        if ((rc = loom_sse_parser_feed(p, in + from, to - from)) != 0)
            return rc;
        from = to;
    }
    return loom_sse_parser_finish(p);
}

static int feed_str(loom_sse_parser *p, const char *s)
{
    return loom_sse_parser_feed(p, s, strlen(s));
}

static int parse_whole(const loom_sse_options *o, const char *in, size_t len,
                       recorder *r)
{
    loom_sse_parser *p = new_parser(o, r);
    int rc = run_cuts(p, in, len, NULL, 0);

    loom_sse_parser_free(p);
    return rc;
}

static int parse_str(const char *in, recorder *r)
{
    return parse_whole(NULL, in, strlen(in), r);
}

/*
 * Parses in whole into a recording, then at every two-way split and byte
 * by byte, and asserts that each way gives the same events and the same
 * result code. Returns the code.
 */
static int parse_all_ways(const loom_sse_options *o, const char *in,
                          size_t len, recorder *ref)
{
    recorder want;
    loom_sse_parser *p;
    recorder chk;
    size_t k, i;
    int rc, rc2;

    memset(ref, 0, sizeof(*ref));
    rc = parse_whole(o, in, len, ref);
    want = *ref;

    p = new_parser(o, &chk);
    for (k = 0; k <= len; k++) {
        memset(&chk, 0, sizeof(chk));
        chk.expect = &want;
        loom_sse_parser_reset(p);
        rc2 = run_cuts(p, in, len, &k, 1);
        if (rc2 != rc || chk.n != ref->n || chk.mismatches)
            fail_msg("split at %zu: rc %d/%d, %zu/%zu events, %zu differ", k,
                     rc2, rc, chk.n, ref->n, chk.mismatches);
    }

    memset(&chk, 0, sizeof(chk));
    chk.expect = &want;
    loom_sse_parser_reset(p);
    rc2 = 0;
    for (i = 0; i < len && !rc2; i++)
        rc2 = loom_sse_parser_feed(p, in + i, 1);
    if (!rc2)
        rc2 = loom_sse_parser_finish(p);
    if (rc2 != rc || chk.n != ref->n || chk.mismatches)
        fail_msg("byte by byte: rc %d/%d, %zu/%zu events, %zu differ", rc2,
                 rc, chk.n, ref->n, chk.mismatches);
    loom_sse_parser_free(p);
    return rc;
}

static void assert_ev(const recorder *r, size_t i, const char *event,
                      const char *data, const char *id, long retry)
{
    assert_true(i < r->n);
    assert_string_equal(r->ev[i].event, event);
    assert_int_equal(r->ev[i].data_len, strlen(data));
    assert_string_equal(r->ev[i].data, data);
    assert_string_equal(r->ev[i].id, id);
    assert_int_equal(r->ev[i].retry, retry);
}

/* ---- recorded provider streams ---------------------------------------- */

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf;
    long n;

    if (!f)
        fail_msg("cannot open %s", path);
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    n = ftell(f);
    assert_true(n >= 0);
    assert_int_equal(fseek(f, 0, SEEK_SET), 0);
    buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = '\0';
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* Parses every *.sse in the folder all ways; returns how many files. */
static size_t check_folder(const char *folder)
{
    char path[4096];
    DIR *d;
    struct dirent *de;
    size_t files = 0;

    snprintf(path, sizeof(path), "%s/%s", LOOM_VECTORS_DIR, folder);
    d = opendir(path);
    if (!d)
        fail_msg("cannot open %s", path);
    while ((de = readdir(d)) != NULL) {
        recorder r;
        char *body;
        size_t len, i;

        if (fnmatch("*.sse", de->d_name, 0) != 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s/%s", LOOM_VECTORS_DIR, folder,
                 de->d_name);
        body = read_file(path, &len);
        assert_int_equal(parse_all_ways(NULL, body, len, &r), 0);
        assert_true(r.n > 0);
        for (i = 0; i < r.n; i++) {
            /* No line end may leak into the data. */
            assert_true(r.ev[i].data_len > 0);
            assert_int_not_equal(r.ev[i].data[r.ev[i].data_len - 1], '\r');
            assert_int_not_equal(r.ev[i].data[r.ev[i].data_len - 1], '\n');
            assert_string_equal(r.ev[i].id, "");
            assert_int_equal(r.ev[i].retry, -1);
        }
        rec_free(&r);
        free(body);
        files++;
    }
    closedir(d);
    return files;
}

static void parse_vector(const char *rel, recorder *r)
{
    char path[4096];
    char *body;
    size_t len;

    snprintf(path, sizeof(path), "%s/%s", LOOM_VECTORS_DIR, rel);
    body = read_file(path, &len);
    memset(r, 0, sizeof(*r));
    assert_int_equal(parse_whole(NULL, body, len, r), 0);
    free(body);
}

static void test_vectors_openai_chat(void **state)
{
    recorder r;

    (void)state;
    assert_int_equal(check_folder("openai-chat"), 3);

    parse_vector("openai-chat/stream-works-1.sse", &r);
    assert_int_equal(r.n, 14);
    assert_string_equal(r.ev[0].event, "message");
    assert_non_null(strstr(r.ev[1].data, "\"delta\":{\"content\":\"{\\\"\"}"));
    assert_ev(&r, 13, "message", "[DONE]", "", -1);
    rec_free(&r);

    parse_vector("openai-chat/stream-is-robust-against-leading-newline-"
                 "chunks-1.sse", &r);
    assert_int_equal(r.n, 15);
    assert_non_null(strstr(r.ev[1].data, "{\"content\":\"\\n\\n\"}"));
    assert_ev(&r, 14, "message", "[DONE]", "", -1);
    rec_free(&r);

    parse_vector("openai-chat/stream-emits-content-logprobs-events-1.sse", &r);
    assert_int_equal(r.n, 14);
    rec_free(&r);
}

static void test_vectors_openai_responses(void **state)
{
    recorder r;

    (void)state;
    assert_int_equal(check_folder("openai-responses"), 2);

    parse_vector("openai-responses/stream-standard-text-works-1.sse", &r);
    assert_int_equal(r.n, 9);
    assert_ev(&r, 3, "message",
              "{\"content_index\":0,\"delta\":\"Hello \",\"item_id\":\"msg_1\","
              "\"logprobs\":[],\"output_index\":0,\"sequence_number\":3,"
              "\"type\":\"response.output_text.delta\"}",
              "", -1);
    assert_ev(&r, 8, "message", "[DONE]", "", -1);
    rec_free(&r);

    parse_vector("openai-responses/stream-reasoning-works-1.sse", &r);
    assert_int_equal(r.n, 12);
    assert_non_null(strstr(r.ev[3].data, "\"delta\":\"Chain: Step 1. \""));
    rec_free(&r);
}

static void test_vectors_anthropic(void **state)
{
    recorder r;

    (void)state;
    assert_int_equal(check_folder("anthropic"), 2);

    parse_vector("anthropic/basic_response.sse", &r);
    assert_int_equal(r.n, 9);
    assert_string_equal(r.ev[0].event, "message_start");
    assert_ev(&r, 2, "ping", "{\"type\": \"ping\"}", "", -1);
    assert_ev(&r, 3, "content_block_delta",
              "{\"type\":\"content_block_delta\",\"index\":0,\"delta\":"
              "{\"type\":\"text_delta\",\"text\":\"Hello\"}}",
              "", -1);
    assert_ev(&r, 8, "message_stop", "{\"type\":\"message_stop\"}", "", -1);
    rec_free(&r);

    parse_vector("anthropic/tool_use_response.sse", &r);
    assert_int_equal(r.n, 15);
    assert_string_equal(r.ev[6].event, "content_block_start");
    assert_non_null(strstr(r.ev[6].data, "\"name\":\"get_weather\""));
    rec_free(&r);
}

static void test_vectors_gemini(void **state)
{
    static const char first[] =
        "{\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"The\"}],"
        "\"role\":\"model\"}}],\"modelVersion\":\"gemini-2.0-flash\"";
    recorder r;

    (void)state;
    assert_int_equal(check_folder("gemini"), 4);

    parse_vector("gemini/text-0.sse", &r);
    assert_int_equal(r.n, 11);
    assert_string_equal(r.ev[0].event, "message");
    assert_memory_equal(r.ev[0].data, first, sizeof(first) - 1);
    assert_int_equal(r.ev[0].data[r.ev[0].data_len - 1], '}');
    rec_free(&r);

    parse_vector("gemini/error-0.sse", &r);
    assert_int_equal(r.n, 1);
    assert_non_null(strstr(r.ev[0].data, "\"status\":\"NOT_FOUND\"}}"));
    rec_free(&r);
}

/* ---- line ends, BOM --------------------------------------------------- */

static void expect_two(const char *eol)
{
    char in[256];
    recorder r;

    snprintf(in, sizeof(in), "event: a%sdata: 1%sdata: 2%s%sdata: 3%s%s",
             eol, eol, eol, eol, eol, eol);
    assert_int_equal(parse_all_ways(NULL, in, strlen(in), &r), 0);
    assert_int_equal(r.n, 2);
    assert_ev(&r, 0, "a", "1\n2", "", -1);
    assert_ev(&r, 1, "message", "3", "", -1);
    rec_free(&r);
}

static void test_line_ends(void **state)
{
    static const char mixed[] =
        "event: a\r\ndata: 1\rdata: 2\n\r\ndata: 3\n\r";
    recorder r;

    (void)state;
    expect_two("\n");
    expect_two("\r\n");
    expect_two("\r");
    assert_int_equal(parse_all_ways(NULL, mixed, strlen(mixed), &r), 0);
    assert_int_equal(r.n, 2);
    assert_ev(&r, 0, "a", "1\n2", "", -1);
    assert_ev(&r, 1, "message", "3", "", -1);
    rec_free(&r);

    /* "\n\r" is two line ends, "\r\n" one: here the LF-CR pair is a blank
     * line between the two data lines. */
    memset(&r, 0, sizeof(r));
    assert_int_equal(parse_str("data: x\n\rdata: y\r\n\r\n", &r), 0);
    assert_int_equal(r.n, 2);
    assert_ev(&r, 0, "message", "x", "", -1);
    assert_ev(&r, 1, "message", "y", "", -1);
    rec_free(&r);
}

static void test_cr_lf_across_feeds(void **state)
{
    loom_sse_parser *p;
    recorder r;

    (void)state;
    memset(&r, 0, sizeof(r));
    p = new_parser(NULL, &r);
    /* If the LF were a second line end, "x" would be dispatched alone. */
    assert_int_equal(loom_sse_parser_feed(p, "data: x\r", 8), 0);
    assert_int_equal(loom_sse_parser_feed(p, "", 0), 0);
    assert_int_equal(loom_sse_parser_feed(p, "\ndata: y\r", 9), 0);
    assert_int_equal(r.n, 0);
    assert_int_equal(loom_sse_parser_feed(p, "\n", 1), 0);
    assert_int_equal(r.n, 0);
    assert_int_equal(loom_sse_parser_feed(p, "\r", 1), 0);
    assert_int_equal(r.n, 1);
    assert_ev(&r, 0, "message", "x\ny", "", -1);
    /* A CR at a chunk end followed by something other than LF. */
    assert_int_equal(loom_sse_parser_feed(p, "data: z\r", 8), 0);
    assert_int_equal(loom_sse_parser_feed(p, "data: w\r", 8), 0);
    assert_int_equal(loom_sse_parser_feed(p, "\r", 1), 0);
    assert_int_equal(r.n, 2);
    assert_ev(&r, 1, "message", "z\nw", "", -1);
    assert_int_equal(loom_sse_parser_finish(p), 0);
    assert_int_equal(r.n, 2);
    loom_sse_parser_free(p);
    rec_free(&r);
}

static void test_bom(void **state)
{
    static const char with_bom[] = "\xEF\xBB\xBF"
                                   "data: a\n\n";
    static const char two_boms[] = "\xEF\xBB\xBF\xEF\xBB\xBF"
                                   "data: a\n\ndata: b\n\n";
    static const char late_bom[] = "data: a\n\n\xEF\xBB\xBF"
                                   "data: b\n\n";
    loom_sse_options o = LOOM_SSE_OPTIONS_INIT;
    loom_sse_parser *p;
    recorder r;

    (void)state;
    assert_int_equal(
        parse_all_ways(NULL, with_bom, sizeof(with_bom) - 1, &r), 0);
    assert_int_equal(r.n, 1);
    assert_ev(&r, 0, "message", "a", "", -1);
    rec_free(&r);

    /* Only one BOM is skipped: the second makes the field name unknown. */
    assert_int_equal(
        parse_all_ways(NULL, two_boms, sizeof(two_boms) - 1, &r), 0);
    assert_int_equal(r.n, 1);
    assert_ev(&r, 0, "message", "b", "", -1);
    rec_free(&r);

    /* Nor is a BOM after the stream start, wherever a chunk begins. */
    assert_int_equal(parse_all_ways(NULL, late_bom, sizeof(late_bom) - 1, &r),
                     0);
    assert_int_equal(r.n, 1);
    assert_ev(&r, 0, "message", "a", "", -1);
    rec_free(&r);

    /* A BOM split over three feeds is still skipped: with max_line 3 the
     * line "xyz" fits only if the BOM is not counted. */
    o.max_line = 3;
    memset(&r, 0, sizeof(r));
    p = new_parser(&o, &r);
    assert_int_equal(loom_sse_parser_feed(p, "\xEF", 1), 0);
    assert_int_equal(loom_sse_parser_feed(p, "\xBB", 1), 0);
    assert_int_equal(loom_sse_parser_feed(p, "\xBF", 1), 0);
    assert_int_equal(loom_sse_parser_feed(p, "xyz\n", 4), 0);
    assert_int_equal(loom_sse_parser_finish(p), 0);

    /* A BOM prefix that stops matching is input: "\xEF\xBB" + "xy" is a
     * four-byte line. */
    loom_sse_parser_reset(p);
    assert_int_equal(loom_sse_parser_feed(p, "\xEF", 1), 0);
    assert_int_equal(loom_sse_parser_feed(p, "\xBB", 1), 0);
    assert_int_equal(loom_sse_parser_feed(p, "xy\n", 3), LOOM_ETOOLARGE);

    /* Same within a single chunk, and a lone prefix at finish(). */
    loom_sse_parser_reset(p);
    assert_int_equal(loom_sse_parser_feed(p, "\xEF\xBBxy\n", 5),
                     LOOM_ETOOLARGE);
    loom_sse_parser_reset(p);
    assert_int_equal(loom_sse_parser_feed(p, "\xEF\xBB", 2), 0);
    assert_int_equal(loom_sse_parser_finish(p), 0);
    assert_int_equal(r.n, 0);

    /* reset() re-arms the BOM check. */
    loom_sse_parser_reset(p);
    assert_int_equal(loom_sse_parser_feed(p, "\xEF\xBB\xBF", 3), 0);
    assert_int_equal(loom_sse_parser_feed(p, "a:b\n", 4), 0);
    loom_sse_parser_free(p);
    rec_free(&r);
}

/* ---- fields ------------------------------------------------------------ */

static void test_data_joining(void **state)
{
    static const char in[] = "data: a\ndata:\ndata:  b\ndata:c\n\n"
                             "data\n\n"
                             "data: a\0b\n\n";
    recorder r;

    (void)state;
    assert_int_equal(parse_all_ways(NULL, in, sizeof(in) - 1, &r), 0);
    assert_int_equal(r.n, 3);
    /* Only the first space after the colon goes. */
    assert_ev(&r, 0, "message", "a\n\n b\nc", "", -1);
    /* A field without a colon has an empty value. */
    assert_ev(&r, 1, "message", "", "", -1);
    assert_int_equal(r.ev[2].data_len, 3);
    assert_memory_equal(r.ev[2].data, "a\0b", 3);
    rec_free(&r);
}

static void test_comments_and_unknown_fields(void **state)
{
    static const char in[] = ": hello\n:\n: ping\n\n"
                             "data: x\n: in the middle\nfoo: bar\nDATA: no\n"
                             "Event: no\n\n";
    recorder r;

    (void)state;
    assert_int_equal(parse_all_ways(NULL, in, strlen(in), &r), 0);
    assert_int_equal(r.n, 1);
    assert_ev(&r, 0, "message", "x", "", -1);
    rec_free(&r);
}

static void test_event_type(void **state)
{
    static const char in[] = "event: foo\ndata: 1\n\n"
                             "data: 2\n\n"
                             "event: lost\n\n"
                             "data: 3\n\n"
                             "event\ndata: 4\n\n"
                             "event: a\nevent: b\ndata: 5\n\n";
    recorder r;

    (void)state;
    assert_int_equal(parse_all_ways(NULL, in, strlen(in), &r), 0);
    assert_int_equal(r.n, 5);
    assert_ev(&r, 0, "foo", "1", "", -1);
    /* Resets to "message" after a dispatch ... */
    assert_ev(&r, 1, "message", "2", "", -1);
    /* ... and after a blank line that dispatched nothing. */
    assert_ev(&r, 2, "message", "3", "", -1);
    assert_ev(&r, 3, "message", "4", "", -1);
    assert_ev(&r, 4, "b", "5", "", -1);
    rec_free(&r);
}

static void test_id(void **state)
{
    static const char in[] = "data: a\n\n"
                             "id: 1\ndata: b\n\n"
                             "data: c\n\n"
                             "id: 2\n\n"
                             "data: d\n\n"
                             "id: 3\0x\ndata: e\n\n"
                             "id:\ndata: f\n\n"
                             "id\nid: 7\ndata: g\n\n";
    recorder r;

    (void)state;
    assert_int_equal(parse_all_ways(NULL, in, sizeof(in) - 1, &r), 0);
    assert_int_equal(r.n, 7);
    assert_ev(&r, 0, "message", "a", "", -1);
    assert_ev(&r, 1, "message", "b", "1", -1);
    /* The id persists across events ... */
    assert_ev(&r, 2, "message", "c", "1", -1);
    /* ... even when set in a block without data. */
    assert_ev(&r, 3, "message", "d", "2", -1);
    /* An id containing NUL is ignored. */
    assert_ev(&r, 4, "message", "e", "2", -1);
    /* An empty id clears it. */
    assert_ev(&r, 5, "message", "f", "", -1);
    assert_ev(&r, 6, "message", "g", "7", -1);
    rec_free(&r);
}

static void test_retry(void **state)
{
    static const char in[] = "data: a\n\n"
                             "retry: 3000\ndata: b\n\n"
                             "retry: 12a\nretry: -1\nretry:\nretry: 1.5\n"
                             "retry:  100\nretry: +5\n"
                             "retry: 99999999999999999999999999\n"
                             "data: c\n\n"
                             "retry:0\ndata: d\n\n"
                             "retry: 250\n\ndata: e\n\n";
    recorder r;

    (void)state;
    assert_int_equal(parse_all_ways(NULL, in, strlen(in), &r), 0);
    assert_int_equal(r.n, 5);
    assert_ev(&r, 0, "message", "a", "", -1);
    assert_ev(&r, 1, "message", "b", "", 3000);
    /* None of the invalid values replaced it. */
    assert_ev(&r, 2, "message", "c", "", 3000);
    assert_ev(&r, 3, "message", "d", "", 0);
    assert_ev(&r, 4, "message", "e", "", 250);
    rec_free(&r);
}

static void test_stray_blank_lines(void **state)
{
    static const char in[] = "\n\n\r\n\r\r\n\ndata: x\n\n\n\n\r\n";
    recorder r;

    (void)state;
    assert_int_equal(parse_all_ways(NULL, in, strlen(in), &r), 0);
    assert_int_equal(r.n, 1);
    assert_ev(&r, 0, "message", "x", "", -1);
    rec_free(&r);
}

static void test_finish(void **state)
{
    loom_sse_parser *p;
    recorder r;

    (void)state;
    memset(&r, 0, sizeof(r));
    p = new_parser(NULL, &r);

    /* A partial last line is a line, and the event is dispatched. */
    assert_int_equal(loom_sse_parser_feed(p, "event: e\ndata: x", 16), 0);
    assert_int_equal(r.n, 0);
    assert_int_equal(loom_sse_parser_finish(p), 0);
    assert_int_equal(r.n, 1);
    assert_ev(&r, 0, "e", "x", "", -1);

    /* Complete line, no blank line. */
    loom_sse_parser_reset(p);
    assert_int_equal(loom_sse_parser_feed(p, "data: y\r", 8), 0);
    assert_int_equal(loom_sse_parser_finish(p), 0);
    assert_int_equal(r.n, 2);
    assert_ev(&r, 1, "message", "y", "", -1);

    /* Nothing pending: nothing more. */
    loom_sse_parser_reset(p);
    assert_int_equal(feed_str(p, "data: z\n\nevent: q\nid: 4"), 0);
    assert_int_equal(r.n, 3);
    assert_int_equal(loom_sse_parser_finish(p), 0);
    assert_int_equal(r.n, 3);
    loom_sse_parser_free(p);
    rec_free(&r);
}

/* ---- limits, abort, reset --------------------------------------------- */

static void test_line_limit(void **state)
{
    /* "data: 0123456789" is 16 bytes. */
    static const char ok[] = "data: 0123456789\r\n\r\n";
    static const char big[] = "data: 0123456789A\n\n";
    loom_sse_options o = LOOM_SSE_OPTIONS_INIT;
    loom_sse_parser *p;
    recorder r;
    char longline[64];

    (void)state;
    o.max_line = 16;
    assert_int_equal(parse_all_ways(&o, ok, strlen(ok), &r), 0);
    assert_int_equal(r.n, 1);
    assert_ev(&r, 0, "message", "0123456789", "", -1);
    rec_free(&r);

    /* One more byte fails at every split, after the earlier events. */
    snprintf(longline, sizeof(longline), "data: a\n\n%s", big);
    assert_int_equal(parse_all_ways(&o, longline, strlen(longline), &r),
                     LOOM_ETOOLARGE);
    assert_int_equal(r.n, 1);
    rec_free(&r);

    /* A line that never ends fails as soon as it is too long, and the
     * parser then refuses input until reset. */
    memset(&r, 0, sizeof(r));
    p = new_parser(&o, &r);
    assert_int_equal(loom_sse_parser_feed(p, "data: 012345678", 15), 0);
    assert_int_equal(loom_sse_parser_feed(p, "9", 1), 0);
    loom_error_clear();
    assert_int_equal(loom_sse_parser_feed(p, "A", 1), LOOM_ETOOLARGE);
    assert_int_equal(loom_error_last_code(), LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "SSE line longer than 16"));
    assert_int_equal(loom_sse_parser_feed(p, "\n\n", 2), LOOM_ETOOLARGE);
    assert_int_equal(loom_sse_parser_finish(p), LOOM_ETOOLARGE);
    assert_int_equal(r.n, 0);
    loom_sse_parser_reset(p);
    assert_int_equal(loom_sse_parser_feed(p, ok, strlen(ok)), 0);
    assert_int_equal(r.n, 1);
    loom_sse_parser_free(p);
    rec_free(&r);
}

static void test_event_limit(void **state)
{
    static const char ok1[] = "data: 0123456789\n\n";
    static const char ok2[] = "data: 01234\ndata: 0123\n\n";
    static const char big[] = "data: ok\n\ndata: 01234\ndata: 01234\n\n";
    loom_sse_options o = LOOM_SSE_OPTIONS_INIT;
    recorder r;

    (void)state;
    o.max_event = 10;
    assert_int_equal(parse_all_ways(&o, ok1, strlen(ok1), &r), 0);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.ev[0].data_len, 10);
    rec_free(&r);
    /* The joining LF counts: 5 + 1 + 4 = 10. */
    assert_int_equal(parse_all_ways(&o, ok2, strlen(ok2), &r), 0);
    assert_int_equal(r.n, 1);
    assert_ev(&r, 0, "message", "01234\n0123", "", -1);
    rec_free(&r);

    loom_error_clear();
    assert_int_equal(parse_all_ways(&o, big, strlen(big), &r),
                     LOOM_ETOOLARGE);
    assert_int_equal(loom_error_last_code(), LOOM_ETOOLARGE);
    assert_non_null(strstr(loom_error_last(), "event"));
    assert_int_equal(r.n, 1);
    assert_ev(&r, 0, "message", "ok", "", -1);
    rec_free(&r);
}

static void test_default_limits(void **state)
{
    const size_t mib = (size_t)1 << 20;
    loom_sse_parser *p;
    recorder r;
    char *line;
    size_t i;

    (void)state;
    /* A line of exactly 1 MiB: "data:" and a value filling the rest. */
    line = malloc(mib + 2);
    assert_non_null(line);
    memcpy(line, "data:", 5);
    memset(line + 5, 'x', mib - 5);
    line[mib] = '\n';

    memset(&r, 0, sizeof(r));
    p = new_parser(NULL, &r);
    /* Eight such lines join to 8 * (1 MiB - 5) + 7 bytes: under 8 MiB. */
    for (i = 0; i < 8; i++)
        assert_int_equal(loom_sse_parser_feed(p, line, mib + 1), 0);
    assert_int_equal(loom_sse_parser_feed(p, "\n", 1), 0);
    assert_int_equal(r.n, 1);
    assert_int_equal(r.ev[0].data_len, 8 * (mib - 5) + 7);
    /* A ninth passes the 8 MiB event limit. */
    for (i = 0; i < 8; i++)
        assert_int_equal(loom_sse_parser_feed(p, line, mib + 1), 0);
    assert_int_equal(loom_sse_parser_feed(p, line, mib + 1), LOOM_ETOOLARGE);

    /* One byte over 1 MiB is too long a line. */
    loom_sse_parser_reset(p);
    line[mib] = 'x';
    line[mib + 1] = '\n';
    assert_int_equal(loom_sse_parser_feed(p, line, mib + 2), LOOM_ETOOLARGE);
    loom_sse_parser_free(p);
    rec_free(&r);
    free(line);
}

static void test_callback_abort(void **state)
{
    static const char in[] = "data: 1\n\ndata: 2\n\ndata: 3\n\n";
    loom_sse_parser *p;
    recorder r;

    (void)state;
    memset(&r, 0, sizeof(r));
    r.abort_at = 2;
    r.abort_rc = 42;
    p = new_parser(NULL, &r);
    assert_int_equal(loom_sse_parser_feed(p, in, strlen(in)), 42);
    /* Stopped at once: the third event was never delivered. */
    assert_int_equal(r.n, 2);
    assert_int_equal(loom_sse_parser_feed(p, in, strlen(in)), 42);
    assert_int_equal(loom_sse_parser_finish(p), 42);
    assert_int_equal(r.n, 2);

    /* A negative loom code is passed through too, also from finish(). */
    loom_sse_parser_reset(p);
    r.abort_at = 3;
    r.abort_rc = LOOM_ECANCELED;
    assert_int_equal(loom_sse_parser_feed(p, "data: x", 7), 0);
    assert_int_equal(loom_sse_parser_finish(p), LOOM_ECANCELED);
    assert_int_equal(r.n, 3);
    loom_sse_parser_free(p);
    rec_free(&r);
}

static void test_reset(void **state)
{
    loom_sse_parser *p;
    recorder r;

    (void)state;
    memset(&r, 0, sizeof(r));
    p = new_parser(NULL, &r);
    assert_int_equal(feed_str(p, "id: 9\nretry: 5\ndata: 1\n\n"
                                 "event: e\ndata: partial\nda"),
                     0);
    assert_int_equal(r.n, 1);
    assert_ev(&r, 0, "message", "1", "9", 5);
    loom_sse_parser_reset(p);
    /* The partial line is gone: "ta" is an unknown field ... */
    assert_int_equal(feed_str(p, "ta: 2\n\n"), 0);
    assert_int_equal(r.n, 1);
    /* ... and so are the id, retry and pending event type. */
    assert_int_equal(feed_str(p, "data: 3\n\n"), 0);
    assert_int_equal(r.n, 2);
    assert_ev(&r, 1, "message", "3", "", -1);
    loom_sse_parser_free(p);
    rec_free(&r);
}

static void test_new_args(void **state)
{
    loom_sse_options o = LOOM_SSE_OPTIONS_INIT;
    loom_sse_parser *p = (loom_sse_parser *)&o;
    recorder r;

    (void)state;
    assert_int_equal(loom_sse_parser_new(&p, NULL, NULL, &r), LOOM_EINVALID);
    assert_null(p);
    o.version = 99;
    assert_int_equal(loom_sse_parser_new(&p, &o, on_event, &r),
                     LOOM_EINVALID);
    assert_null(p);
    assert_int_equal(loom_sse_parser_new(NULL, NULL, on_event, &r),
                     LOOM_EINVALID);
    assert_int_equal(loom_sse_parser_feed(NULL, "x", 1), LOOM_EINVALID);
    assert_int_equal(loom_sse_parser_finish(NULL), LOOM_EINVALID);
    loom_sse_parser_reset(NULL);
    loom_sse_parser_free(NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors_openai_chat),
        cmocka_unit_test(test_vectors_openai_responses),
        cmocka_unit_test(test_vectors_anthropic),
        cmocka_unit_test(test_vectors_gemini),
        cmocka_unit_test(test_line_ends),
        cmocka_unit_test(test_cr_lf_across_feeds),
        cmocka_unit_test(test_bom),
        cmocka_unit_test(test_data_joining),
        cmocka_unit_test(test_comments_and_unknown_fields),
        cmocka_unit_test(test_event_type),
        cmocka_unit_test(test_id),
        cmocka_unit_test(test_retry),
        cmocka_unit_test(test_stray_blank_lines),
        cmocka_unit_test(test_finish),
        cmocka_unit_test(test_line_limit),
        cmocka_unit_test(test_event_limit),
        cmocka_unit_test(test_default_limits),
        cmocka_unit_test(test_callback_abort),
        cmocka_unit_test(test_reset),
        cmocka_unit_test(test_new_args),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
