/*
 * resp_test.c: `loadgen --self-test`, the response reader (resp.c)
 * against canned answers. Each answer is fed whole and then one byte at a
 * time, and both must give the same result; every limit of resp.h is
 * crossed by one byte. bench/serve.sh runs it before measuring.
 */
#include "resp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tests_failed;

#define EXPECT(cond)                                                     \
    do {                                                                 \
        if (!(cond)) {                                                   \
            fprintf(stderr, "self-test %s:%d: %s\n", __func__, __LINE__, \
                    #cond);                                              \
            tests_failed++;                                              \
        }                                                                \
    } while (0)

/* Feeds s whole, then again one byte at a time; both must agree. */
static int feed_both(resp *r, int stream, size_t body_max, const char *s,
                     size_t n, int *firsts)
{
    int rc1, rc2 = 0, st1, chunks1;
    size_t clen1;
    char content1[256];

    resp_init(r, stream, body_max);
    rc1 = resp_feed(r, s, n);
    st1 = r->status;
    chunks1 = r->content_chunks;
    clen1 = r->content_len < sizeof(content1) ? r->content_len : 0;
    memcpy(content1, r->content, clen1);
    resp_init(r, stream, body_max);
    *firsts = 0;
    for (size_t i = 0; i < n; i++) {
        rc2 = resp_feed(r, s + i, 1);
        *firsts += r->new_first;
        if (rc2 < 0)
            break;
    }
    EXPECT(rc1 == rc2);
    if (rc1 == 1) {
        EXPECT(st1 == r->status);
        EXPECT(chunks1 == r->content_chunks);
        EXPECT(clen1 == r->content_len &&
               memcmp(content1, r->content, clen1) == 0);
    }
    return rc2;
}

static void test_length_body(void)
{
    static const char body[] =
        "{\"choices\":[{\"message\":{\"role\":\"assistant\",\"content\""
        " : \"Hi there.\"}}],\"tool_events\":[{\"content\":\"no\"}]}";
    char s[512];
    int n = snprintf(s, sizeof(s), "HTTP/1.1 200 OK\r\nContent-Type: "
                     "application/json\r\ncontent-length:   %zu \r\n\r\n%s",
                     strlen(body), body);
    resp r = {0};
    int firsts;

    EXPECT(feed_both(&r, 0, BODY_MAX, s, (size_t)n, &firsts) == 1);
    EXPECT(r.status == 200 && !r.close_after && firsts == 0);
    EXPECT(r.content_len == 9 && memcmp(r.content, "Hi there.", 9) == 0);
    EXPECT(resp_check(&r, "Hi there.", 9) == 0);
    EXPECT(resp_check(&r, "Hi", 2) < 0 && strstr(r.err, "expected"));
    resp_free(&r);
}

/* head, then each part as one chunk (extension ";ext=1" on the third),
 * the last chunk and a trailer field, into out. */
static size_t chunked(char *out, size_t cap, const char *head,
                      const char *const *parts, size_t nparts)
{
    size_t n = (size_t)snprintf(out, cap, "%s", head);

    for (size_t i = 0; i < nparts && n < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%zx%s\r\n%s\r\n",
                              strlen(parts[i]), i == 2 ? ";ext=1" : "",
                              parts[i]);
    if (n < cap)
        n += (size_t)snprintf(out + n, cap - n, "0\r\nX-Trailer: 1\r\n\r\n");
    if (n >= cap) {
        tests_failed++;
        return 0;
    }
    return n;
}

static void test_chunked_stream(void)
{
    static const char *const parts[] = {
        "data: {\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}\n\n",
        "data: {\"delta\":{\"reasoning_content\":\"x\"}}\n\n"
        "data: {\"delta\":{\"content\": \"Hi\"}}\r\n\r\n",
        "data: {\"delta\":{\"content\":\" \\\"there\\\"\"}}\n",
        "\n: keep-alive\n\ndata: [DO",
        "NE]\n\n"};
    char s[1024];
    size_t n = chunked(s, sizeof(s),
                       "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                       parts, sizeof(parts) / sizeof(parts[0]));
    resp r = {0};
    int firsts;

    EXPECT(feed_both(&r, 1, BODY_MAX, s, n, &firsts) == 1);
    EXPECT(firsts == 1);
    EXPECT(r.saw_done && r.content_chunks == 2);
    EXPECT(r.content_len == 12 &&
           memcmp(r.content, "Hi \\\"there\\\"", 12) == 0);
    EXPECT(resp_check(&r, "Hi \\\"there\\\"", 12) == 0);
    /* The same without [DONE] is not a complete stream. */
    n = chunked(s, sizeof(s),
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                parts, 3);
    EXPECT(feed_both(&r, 1, BODY_MAX, s, n, &firsts) == 1);
    EXPECT(resp_check(&r, NULL, 0) < 0 && strstr(r.err, "DONE"));
    resp_free(&r);
}

static void test_eof_body_and_errors(void)
{
    static const char eof[] = "HTTP/1.0 200 OK\r\n\r\n{\"content\":\"a\"}";
    static const char cut[] = "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab";
    static const char extra[] =
        "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nabc";
    static const char bad[] = "HTTX/1.1 200 OK\r\n\r\n";
    static const char err[] =
        "HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy";
    static const char cont[] =
        "HTTP/1.1 100 Continue\r\n\r\n"
        "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
    static const char nodone[] =
        "HTTP/1.1 200 OK\r\nContent-Length: 23\r\n\r\n"
        "data: {\"content\":\"a\"}\n\n";
    resp r = {0};
    int firsts;

    EXPECT(feed_both(&r, 0, BODY_MAX, eof, sizeof(eof) - 1, &firsts) == 0);
    EXPECT(resp_eof(&r) == 1 && r.close_after);
    EXPECT(resp_check(&r, "a", 1) == 0);
    EXPECT(feed_both(&r, 0, BODY_MAX, cut, sizeof(cut) - 1, &firsts) == 0);
    EXPECT(resp_eof(&r) < 0 && strstr(r.err, "middle"));
    resp_init(&r, 0, BODY_MAX);
    EXPECT(resp_eof(&r) < 0 && strstr(r.err, "before any"));
    EXPECT(feed_both(&r, 0, BODY_MAX, extra, sizeof(extra) - 1, &firsts) < 0);
    EXPECT(feed_both(&r, 0, BODY_MAX, bad, sizeof(bad) - 1, &firsts) < 0);
    EXPECT(feed_both(&r, 0, BODY_MAX, err, sizeof(err) - 1, &firsts) == 1);
    EXPECT(resp_check(&r, NULL, 0) < 0 && strstr(r.err, "status 503"));
    EXPECT(feed_both(&r, 0, BODY_MAX, cont, sizeof(cont) - 1, &firsts) == 1);
    EXPECT(r.status == 200 && r.close_after);
    EXPECT(feed_both(&r, 1, BODY_MAX, nodone, sizeof(nodone) - 1,
                     &firsts) == 1);
    EXPECT(resp_check(&r, NULL, 0) < 0 && strstr(r.err, "DONE"));
    resp_free(&r);
}

/* Every limit of the reader, crossed by one byte. */
static void test_limits(void)
{
    static const char len_ok[] =
        "HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n0123456789abcdef";
    static const char len_over[] =
        "HTTP/1.1 200 OK\r\nContent-Length: 17\r\n\r\n0123456789abcdefg";
    static const char chunk_over[] =
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        "10\r\n0123456789abcdef\r\n1\r\ng\r\n0\r\n\r\n";
    static const char eof_over[] = "HTTP/1.0 200 OK\r\n\r\n0123456789abcdefg";
    static const char hex_over[] =
        "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        "100000000\r\n";
    char *big;
    size_t n;
    resp r = {0};
    int firsts;

    EXPECT(feed_both(&r, 0, 16, len_ok, sizeof(len_ok) - 1, &firsts) == 1);
    EXPECT(feed_both(&r, 0, 16, len_over, sizeof(len_over) - 1,
                     &firsts) < 0);
    EXPECT(strstr(r.err, "over 16 bytes"));
    EXPECT(feed_both(&r, 0, 16, chunk_over, sizeof(chunk_over) - 1,
                     &firsts) < 0);
    EXPECT(strstr(r.err, "over 16 bytes"));
    EXPECT(feed_both(&r, 0, 16, eof_over, sizeof(eof_over) - 1,
                     &firsts) < 0);
    EXPECT(feed_both(&r, 0, BODY_MAX, hex_over, sizeof(hex_over) - 1,
                     &firsts) < 0);
    EXPECT(strstr(r.err, "chunk size"));

    /* A header block of exactly HEAD_MAX bytes passes; one more fails. */
    big = malloc(HEAD_MAX + 64);
    if (!big) {
        tests_failed++;
        return;
    }
    for (int extra = 0; extra <= 1; extra++) {
        size_t fill = HEAD_MAX - strlen("HTTP/1.1 200 OK\r\nX: \r\n"
                                        "Content-Length: 0\r\n\r\n") + extra;

        n = (size_t)sprintf(big, "HTTP/1.1 200 OK\r\nX: ");
        memset(big + n, 'a', fill);
        n += fill;
        n += (size_t)sprintf(big + n, "\r\nContent-Length: 0\r\n\r\n");
        EXPECT(n == (size_t)HEAD_MAX + (size_t)extra);
        resp_init(&r, 0, BODY_MAX);
        EXPECT(resp_feed(&r, big, n) == (extra ? -1 : 1));
    }
    /* A chunk line of LINE_MAX_CHUNK bytes passes; one more fails. */
    for (int extra = 0; extra <= 1; extra++) {
        n = (size_t)sprintf(big, "HTTP/1.1 200 OK\r\n"
                                 "Transfer-Encoding: chunked\r\n\r\n1;");
        memset(big + n, 'e', LINE_MAX_CHUNK - 3 + extra);
        n += LINE_MAX_CHUNK - 3 + extra;
        n += (size_t)sprintf(big + n, "\r\nx\r\n0\r\n\r\n");
        resp_init(&r, 0, BODY_MAX);
        EXPECT(resp_feed(&r, big, n) == (extra ? -1 : 1));
    }
    /* The answer text: CONTENT_MAX bytes pass, one more is an error. */
    for (int extra = 0; extra <= 1; extra++) {
        size_t len = CONTENT_MAX + (size_t)extra;
        size_t body = len + 14;

        n = (size_t)sprintf(big, "HTTP/1.1 200 OK\r\nContent-Length: "
                                 "%zu\r\n\r\n{\"content\":\"", body);
        memset(big + n, 'c', len);
        n += len;
        n += (size_t)sprintf(big + n, "\"}");
        resp_init(&r, 0, BODY_MAX);
        EXPECT(resp_feed(&r, big, n) == 1);
        EXPECT((resp_check(&r, NULL, 0) < 0) == extra);
    }
    free(big);
    resp_free(&r);
}

int resp_self_test(void)
{
    test_length_body();
    test_chunked_stream();
    test_eof_body_and_errors();
    test_limits();
    if (tests_failed) {
        fprintf(stderr, "loadgen self-test: %d failed\n", tests_failed);
        return 1;
    }
    fprintf(stderr, "loadgen self-test: ok\n");
    return 0;
}

/* ---------------------------------------------------------------------- */
