/*
 * libFuzzer target for the SSE parser. The first input byte picks a split
 * point and small limits (so the limit paths are reached often); the rest
 * is the stream. The stream is parsed whole and in two pieces, and the two
 * runs must give the same events and the same result: a difference (or any
 * sanitizer report) is a bug. Built only with -DLOOM_FUZZ=ON and clang.
 */
#include "loom/sse.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct {
    uint64_t hash;
    size_t count;
} digest;

static void mix(digest *d, const void *p, size_t len)
{
    const unsigned char *s = p;
    size_t i;

    /* FNV-1a, with the length folded in so field borders count. */
    for (i = 0; i < len; i++)
        d->hash = (d->hash ^ s[i]) * 1099511628211ULL;
    d->hash = (d->hash ^ len) * 1099511628211ULL;
}

static int on_event(const loom_sse_event *ev, void *payload)
{
    digest *d = payload;

    if (ev->data[ev->data_len] != '\0')
        abort();
    mix(d, ev->event, strlen(ev->event));
    mix(d, ev->data, ev->data_len);
    mix(d, ev->id, strlen(ev->id));
    mix(d, &ev->retry, sizeof(ev->retry));
    d->count++;
    return 0;
}

static int run(const loom_sse_options *o, const char *s, size_t len,
               size_t cut, digest *d)
{
    loom_sse_parser *p = NULL;
    int rc;

    d->hash = 14695981039346656037ULL;
    d->count = 0;
    if (loom_sse_parser_new(&p, o, on_event, d) != 0)
        abort();
    rc = loom_sse_parser_feed(p, s, cut);
    if (!rc)
        rc = loom_sse_parser_feed(p, s + cut, len - cut);
    if (!rc)
        rc = loom_sse_parser_finish(p);
    loom_sse_parser_free(p);
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    loom_sse_options o = LOOM_SSE_OPTIONS_INIT;
    const char *s;
    size_t len, cut;
    digest whole, split;
    int rc1, rc2;

    if (size < 1)
        return 0;
    s = (const char *)data + 1;
    len = size - 1;
    cut = len ? (size_t)data[0] % (len + 1) : 0;
    o.max_line = 8 + (data[0] & 0x3f);
    o.max_event = 16 + (size_t)(data[0] >> 2) * 4;

    rc1 = run(&o, s, len, len, &whole);
    rc2 = run(&o, s, len, cut, &split);
    if (rc1 != rc2 || whole.count != split.count || whole.hash != split.hash)
        abort();
    return 0;
}
