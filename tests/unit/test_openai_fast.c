/*
 * Tests of the fast paths of the OpenAI adapter and of the run loop, each
 * against the slower code it replaces, which stays as the reference:
 *
 * - chunk decoding: every recorded vector, every fuzz corpus input, a list
 *   of hand-written chunks (escapes, bad UTF-8, numbers at the limits,
 *   broken grammar, duplicate keys, ...) and thousands of seeded random
 *   mutations of them go through the decoder twice, on the fast path and
 *   forced to jansson, and must give the same events, result, error and
 *   error message; the fast path is also checked to take (and to refuse)
 *   what it should, so it cannot silently fall back on everything;
 * - the request body: the text loom__openai_body_text() writes must be
 *   byte for byte json_dumps() of loom__openai_build_body() for every
 *   request shape and for random strings, with and without a cache, and
 *   the cache must follow a growing, edited and shrunk conversation;
 * - the HTTP client reusing a handle's setup: requests through one pool
 *   that change URL, method, headers and body must each go out as asked;
 * - run events: the payload of every event type, exactly.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/error.h"
#include "core/http.h"
#include "fake.h"
#include "llm/openai.h"
#include "loom/buf.h"
#include "loom/run.h"
#include "testutil.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- decoding both ways ---------------------------------------------- */

/* Everything a decode produced, as text, to compare two decodes. */
typedef struct {
    loom_buf log;
    long count;
    long cancel_at; /* event number the callback refuses; -1 never */
} trace;

static void log_str(loom_buf *b, const char *s)
{
    if (s)
        assert_int_equal(loom_buf_printf(b, "[%zu:%s]", strlen(s), s), 0);
    else
        assert_int_equal(loom_buf_puts(b, "[null]"), 0);
}

static int trace_cb(const loom_llm_event *ev, void *payload)
{
    trace *t = payload;
    loom_buf *b = &t->log;

    t->count++;
    assert_int_equal(loom_buf_printf(b, "ev%d ", (int)ev->type), 0);
    switch (ev->type) {
    case LOOM_LLM_TEXT:
    case LOOM_LLM_REASONING:
        assert_int_equal(loom_buf_printf(b, "%zu:", ev->text_len), 0);
        assert_int_equal(loom_buf_put(b, ev->text, ev->text_len), 0);
        /* Consumers may treat it as a C string. */
        assert_int_equal(ev->text[ev->text_len], '\0');
        break;
    case LOOM_LLM_TOOL_CALL_DELTA:
        assert_int_equal(loom_buf_printf(b, "%d", ev->tool_index), 0);
        log_str(b, ev->tool_id);
        log_str(b, ev->tool_name);
        log_str(b, ev->args_delta);
        break;
    case LOOM_LLM_TOOL_CALLS:
        for (size_t i = 0; i < ev->calls_len; i++) {
            log_str(b, ev->calls[i].id);
            log_str(b, ev->calls[i].name);
            log_str(b, ev->calls[i].arguments);
        }
        break;
    case LOOM_LLM_USAGE:
        assert_int_equal(loom_buf_printf(b, "%ld %ld %ld %ld %ld",
                                         ev->usage.prompt_tokens,
                                         ev->usage.completion_tokens,
                                         ev->usage.cached_tokens,
                                         ev->usage.reasoning_tokens,
                                         ev->usage.total_tokens),
                         0);
        break;
    case LOOM_LLM_FINISH:
        log_str(b, ev->finish_reason);
        break;
    case LOOM_LLM_ERROR:
        assert_int_equal(loom_buf_printf(b, "%d", ev->error_code), 0);
        log_str(b, ev->error_message);
        break;
    }
    assert_int_equal(loom_buf_putc(b, '\n'), 0);
    return t->cancel_at == t->count && ev->type != LOOM_LLM_ERROR;
}

/* Chunks that began from the state of the head they share with the chunks
 * before them (llm/openai_stream.c chunk_prefix), all tests. */
static size_t g_resumed_total;

typedef struct {
    const loom__openai_limits *lim; /* NULL: defaults */
    size_t split;                   /* first feed's length; >= len: whole */
    long cancel_at;
    int complete; /* decode as a non-streamed body */
} decode_opts;

/*
 * Decodes data one way and returns the trace (events, return code, error
 * message, decoder state and exported response) as a string to free;
 * *fast gets the chunks the fast path took.
 */
static char *decode_trace(const char *data, size_t len, const decode_opts *o,
                          int jansson_only, size_t *fast)
{
    loom__openai_decoder *d = NULL;
    loom_llm_response resp;
    const loom_upstream_error *de;
    trace t;
    size_t cut = o->split < len ? o->split : len;
    int rc;

    memset(&resp, 0, sizeof(resp));
    memset(&t, 0, sizeof(t));
    loom_buf_init(&t.log, LOOM_BUF_UNLIMITED);
    t.cancel_at = o->cancel_at;
    assert_int_equal(loom__openai_decoder_new(&d, o->lim, trace_cb, &t), 0);
    loom__openai_decoder_set_jansson_only(d, jansson_only);
    if (o->complete) {
        rc = loom__openai_decoder_complete(d, data, len);
    } else {
        rc = loom__openai_decoder_feed(d, data, cut);
        if (!rc)
            rc = loom__openai_decoder_feed(d, data + cut, len - cut);
        if (!rc)
            rc = loom__openai_decoder_finish(d);
    }
    assert_int_equal(loom_buf_printf(&t.log, "rc %d done %d started %d\n", rc,
                                     loom__openai_decoder_done(d),
                                     loom__openai_decoder_output_started(d)),
                     0);
    if (rc)
        log_str(&t.log, loom_error_last());
    de = loom__openai_decoder_error(d);
    assert_int_equal(loom_buf_printf(&t.log, "\nerr %d ", (int)de->kind), 0);
    log_str(&t.log, de->type);
    log_str(&t.log, de->message);
    assert_int_equal(loom__openai_decoder_export(d, &resp), 0);
    assert_int_equal(loom_buf_puts(&t.log, "\nresp "), 0);
    log_str(&t.log, resp.text);
    log_str(&t.log, resp.reasoning);
    log_str(&t.log, resp.finish_reason);
    log_str(&t.log, resp.response_id);
    assert_int_equal(loom_buf_printf(&t.log, "%d %ld %ld %ld %ld %ld",
                                     resp.output_started,
                                     resp.usage.prompt_tokens,
                                     resp.usage.completion_tokens,
                                     resp.usage.cached_tokens,
                                     resp.usage.reasoning_tokens,
                                     resp.usage.total_tokens),
                     0);
    for (size_t i = 0; i < resp.tool_calls_len; i++) {
        log_str(&t.log, resp.tool_calls[i].id);
        log_str(&t.log, resp.tool_calls[i].name);
        log_str(&t.log, resp.tool_calls[i].arguments);
    }
    if (fast)
        *fast = loom__openai_decoder_fast_chunks(d);
    g_resumed_total += loom__openai_decoder_resumed_chunks(d);
    loom_llm_response_clear(&resp);
    loom__openai_decoder_free(d);
    return loom_buf_detach(&t.log);
}

static size_t g_fast_total; /* chunks taken by the fast path, all tests */

/* Decodes data both ways with o; they must agree. Returns the fast path's
 * chunk count. */
static size_t same_both_ways(const char *data, size_t len,
                             const decode_opts *o)
{
    size_t fast = 0, slow = 0;
    char *a = decode_trace(data, len, o, 0, &fast);
    char *b = decode_trace(data, len, o, 1, &slow);

    assert_int_equal(slow, 0);
    if (strcmp(a, b) != 0)
        fail_msg("fast and jansson paths differ on input (%zu bytes):\n"
                 "%.*s\n--- fast:\n%s\n--- jansson:\n%s",
                 len, (int)(len > 600 ? 600 : len), data, a, b);
    free(a);
    free(b);
    g_fast_total += fast;
    return fast;
}

/* The fuzz target's reading of its first byte: small limits, a split
 * point and sometimes a cancel, so limit and cancel paths are compared
 * too. */
static void opts_from_byte(unsigned char b, size_t len,
                           loom__openai_limits *lim, decode_opts *o)
{
    memset(lim, 0, sizeof(*lim));
    lim->max_tool_calls = 1 + (b & 3);
    lim->max_args = 4 + (size_t)((b >> 2) & 7) * 16;
    lim->max_text = 8 + (size_t)(b >> 5) * 96;
    memset(o, 0, sizeof(*o));
    o->lim = lim;
    o->split = len ? (size_t)b % (len + 1) : 0;
    o->cancel_at = b % 5 == 4 ? 1 + (b >> 3) % 8 : -1;
}

/* Compares both ways under every configuration the tests use. */
static size_t compare_all(const char *data, size_t len, unsigned char seed)
{
    decode_opts o = {NULL, (size_t)-1, -1, 0};
    loom__openai_limits lim;
    size_t fast;

    fast = same_both_ways(data, len, &o);
    o.split = len / 2;
    same_both_ways(data, len, &o);
    o.complete = 1;
    same_both_ways(data, len, &o);
    opts_from_byte(seed, len, &lim, &o);
    same_both_ways(data, len, &o);
    return fast;
}

/* Reads every regular file of dir into a callback. Returns how many. */
static int each_file(const char *dir, void (*fn)(const char *, size_t))
{
    struct dirent *de;
    DIR *dh = opendir(dir);
    int n = 0;

    if (!dh)
        return -1;
    while ((de = readdir(dh)) != NULL) {
        char path[4096];
        struct stat st;
        size_t len = 0;
        char *data;

        if (snprintf(path, sizeof(path), "%s/%s", dir, de->d_name) >=
                (int)sizeof(path) ||
            stat(path, &st) != 0 || !S_ISREG(st.st_mode))
            continue;
        data = test_read_file(path, &len);
        assert_non_null(data);
        fn(data, len);
        free(data);
        n++;
    }
    closedir(dh);
    return n;
}

static size_t g_vector_fast;

static void vector_file(const char *data, size_t len)
{
    g_vector_fast += compare_all(data, len, (unsigned char)len);
}

/* The recorded OpenAI streams: same both ways, and all on the fast path
 * except chunks with reals (logprobs), which the fast path reads too. */
static void test_vectors_both_ways(void **state)
{
    char *dir = test_vector_path("openai-chat");

    (void)state;
    assert_non_null(dir);
    g_vector_fast = 0;
    assert_true(each_file(dir, vector_file) >= 3);
    /* stream-works-1 alone has a dozen chunks. */
    assert_true(g_vector_fast >= 20);
    free(dir);
}

static void corpus_file(const char *data, size_t len)
{
    /* As the fuzz target reads it: control byte, then body... */
    if (len > 0)
        compare_all(data + 1, len - 1, (unsigned char)data[0]);
    /* ...and the whole file as a body. */
    compare_all(data, len, 0x5a);
}

/* Every fuzz corpus input and every saved crash input. */
static void test_fuzz_corpus_both_ways(void **state)
{
    char dir[4096];

    (void)state;
    snprintf(dir, sizeof(dir), "%s/fuzz/corpus/fuzz_openai_stream",
             LOOM_SOURCE_DIR);
    assert_true(each_file(dir, corpus_file) > 5);
    snprintf(dir, sizeof(dir), "%s/fuzz/crashes-found/fuzz_openai_stream",
             LOOM_SOURCE_DIR);
    each_file(dir, corpus_file);
}

/* ---- hand-written chunks --------------------------------------------- */

/*
 * Chunk texts (the JSON after "data: "), each with what the fast path
 * must do with it: 1 take it, 0 leave it to jansson, -1 either.
 */
static const struct {
    const char *json;
    int fast;
} chunks[] = {
    {"{\"id\":\"a\",\"choices\":[{\"index\":0,\"delta\":{\"content\":"
     "\"hi\"}}]}",
     1},
    /* every escape jansson knows, surrogate pairs in both cases */
    {"{\"choices\":[{\"delta\":{\"content\":\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t "
     "\\u00e9 \\u20AC \\ud83d\\ude00 \\uD83D\\uDE00 \\u0001 \\u007f\"}}]}",
     1},
    {"{\"choices\":[{\"delta\":{\"content\":\"h\xc3\xa9llo \xe6\x97\xa5 "
     "\xf0\x9f\x98\x80 \x7f\"}}]}",
     1},
    /* (no line break: that would end the SSE line) */
    {" \t {\"choices\" : [ { \"delta\" : { \"content\" : \"ws\" } } ] } \t",
     1},
    /* strings jansson refuses */
    {"{\"choices\":[{\"delta\":{\"content\":\"\xff\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"content\":\"\xc3\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"content\":\"\xc3(\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"content\":\"\xed\xa0\x80\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"content\":\"\xc0\xaf\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"content\":\"\xe0\x80\xaf\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"content\":\"\xf0\x80\x80\xaf\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"content\":\"\xf4\x90\x80\x80\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"content\":\"\xf5\x80\x80\x80\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"content\":\"a\\u0000b\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"content\":\"\\ud83d\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"content\":\"\\ude00\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"content\":\"\\ud83d\\u0041\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"content\":\"\\ud83dx\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"content\":\"\\ud83d\\n\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"content\":\"\\x\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"content\":\"\\u12\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"content\":\"\\u12G4\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"content\":\"a\x01\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"content\":\"a\tb\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"content\":\"a\\\"}}]}", 0},
    /* numbers */
    {"{\"choices\":[{\"index\":-0,\"delta\":{\"content\":\"n\"}}]}", 1},
    {"{\"choices\":[{\"index\":0.0,\"delta\":{\"content\":\"r\"}}]}", 1},
    {"{\"choices\":[{\"index\":1,\"delta\":{\"content\":\"skip\"}}]}", 1},
    {"{\"choices\":[{\"index\":1e0,\"delta\":{\"content\":\"e\"}}]}", 1},
    {"{\"choices\":[{\"index\":\"1\",\"delta\":{\"content\":\"s\"}}]}", 1},
    {"{\"choices\":[{\"index\":null,\"delta\":{\"content\":\"z\"}}]}", 1},
    {"{\"choices\":[{\"index\":01,\"delta\":{}}]}", 0},
    {"{\"choices\":[{\"index\":1.,\"delta\":{}}]}", 0},
    {"{\"choices\":[{\"index\":.5,\"delta\":{}}]}", 0},
    {"{\"choices\":[{\"index\":-,\"delta\":{}}]}", 0},
    {"{\"choices\":[{\"index\":1e,\"delta\":{}}]}", 0},
    {"{\"choices\":[{\"index\":1e+,\"delta\":{}}]}", 0},
    {"{\"choices\":[{\"index\":+1,\"delta\":{}}]}", 0},
    {"{\"choices\":[{\"index\":tru,\"delta\":{}}]}", 0},
    {"{\"choices\":[{\"index\":nul,\"delta\":{}}]}", 0},
    {"{\"x\":9223372036854775807,\"choices\":[]}", 1},
    {"{\"x\":-9223372036854775808,\"choices\":[]}", 1},
    {"{\"x\":9223372036854775808,\"choices\":[]}", 0},
    {"{\"x\":-9223372036854775809,\"choices\":[]}", 0},
    {"{\"x\":12345678901234567890123,\"choices\":[]}", 0},
    {"{\"x\":1e299,\"choices\":[]}", 1},
    {"{\"x\":1e300,\"choices\":[]}", 0},
    {"{\"x\":1e308,\"choices\":[]}", 0},
    {"{\"x\":1e309,\"choices\":[]}", 0},
    {"{\"x\":-1e309,\"choices\":[]}", 0},
    {"{\"x\":1.5e-400,\"choices\":[]}", 1},
    {"{\"x\":0e999999999,\"choices\":[]}", 0},
    {"{\"x\":1e99999999999999999999,\"choices\":[]}", 0},
    {"{\"x\":1E-99999999999999999999,\"choices\":[]}", 1},
    {"{\"x\":123456789012345678901234567890.5,\"choices\":[]}", 1},
    {"{\"choices\":[],\"usage\":{\"prompt_tokens\":1.5,\"completion_tokens\":"
     "2e3,\"total_tokens\":1e200,\"prompt_tokens_details\":{\"cached_"
     "tokens\":-4},\"completion_tokens_details\":{\"reasoning_tokens\":"
     "9223372036854775807}}}",
     1},
    {"{\"choices\":[],\"usage\":{\"prompt_tokens\":\"7\",\"completion_"
     "tokens\":true,\"total_tokens\":null}}",
     1},
    {"{\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}",
     1},
    {"{\"choices\":[],\"usage\":[1,2]}", 1},
    {"{\"choices\":[],\"usage\":-0.0}", 1},
    /* grammar jsmn alone lets through, or not */
    {"{\"choices\":[],}", 0},
    {"{\"choices\":[1,]}", 0},
    {"{\"choices\" []}", 0},
    {"{\"choices\":[] \"id\":\"x\"}", 0},
    {"{\"choices\":[]}}", 0},
    {"{\"choices\":[]", 0},
    {"{choices:[]}", 0},
    {"{1:[]}", 0},
    {"{\"a\":1}x", 0},
    {"{\"a\":1}{\"b\":2}", 0},
    {"{\"a\":1,,\"b\":2}", 0},
    {"{,\"a\":1}", 0},
    {"{\"a\"}", 0},
    {"{\"a\":}", 0},
    {"{\"a\":[}]}", 0},
    {"{\"a\":[1 2]}", 0},
    {"{\"a\":{\"b\":1}:2}", 0},
    {"{\"a\":\"b\":\"c\"}", 0},
    {"[{\"choices\":[]}]", 0},
    {"\"choices\"", 0},
    {"123", 0},
    {"true", 0},
    {"null", 0},
    {"", 0},
    {"   ", 0},
    {"{}", 1},
    {"{\"choices\":null}", 1},
    {"{\"choices\":{}}", 1},
    {"{\"choices\":\"x\"}", 1},
    {"{\"choices\":[null,1,\"x\",[],{\"delta\":null},{\"delta\":\"t\"}]}", 1},
    /* duplicate keys: the last wins */
    {"{\"choices\":[{\"delta\":{\"content\":\"first\",\"content\":"
     "\"second\"}}]}",
     1},
    {"{\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"choices\":[{\"delta\":"
     "{\"content\":\"b\"}}]}",
     1},
    {"{\"choices\":[{\"index\":0,\"index\":1,\"delta\":{\"content\":\"c\"}}]}",
     1},
    {"{\"id\":\"one\",\"id\":\"two\",\"choices\":[]}", 1},
    /* keys with escapes: jansson's */
    {"{\"c\\u0068oices\":[{\"delta\":{\"content\":\"esc\"}}]}", 0},
    {"{\"choices\":[{\"delta\":{\"con\\ttent\":\"x\"}}]}", 0},
    /* text fields */
    {"{\"choices\":[{\"delta\":{\"refusal\":\"no\",\"content\":\"yes\"}}]}", 1},
    {"{\"choices\":[{\"delta\":{\"reasoning_content\":\"r1\",\"reasoning\":"
     "\"r2\"}}]}",
     1},
    {"{\"choices\":[{\"delta\":{\"reasoning_content\":5,\"reasoning\":"
     "\"r2\"}}]}",
     1},
    {"{\"choices\":[{\"delta\":{\"reasoning\":\"only\"}}]}", 1},
    {"{\"choices\":[{\"delta\":{\"content\":\"\"}}]}", 1},
    {"{\"choices\":[{\"delta\":{\"content\":7}}]}", 1},
    {"{\"id\":5,\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}", 1},
    {"{\"choices\":[{\"delta\":{},\"finish_reason\":3}]}", 1},
    {"{\"choices\":[{\"delta\":{},\"finish_reason\":\"a\"},{\"delta\":{},"
     "\"finish_reason\":\"b\"}]}",
     1},
    {"{\"choices\":[{\"message\":{\"content\":\"m\"},\"delta\":{\"content\":"
     "\"d\"}}]}",
     1},
    /* tool calls */
    {"{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\","
     "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
     "\"{\\\"a\\\":1}\"}},{\"index\":1,\"id\":\"c2\",\"function\":{\"name\":"
     "\"g\",\"arguments\":\"\"}}]},\"finish_reason\":\"tool_calls\"}]}",
     1},
    {"{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\","
     "\"function\":{\"name\":\"f\",\"arguments\":{\"b\":1,\"a\":[1,2.5,"
     "\"x\\u00e9\"],\"b\":2}}}]}}]}",
     1},
    {"{\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"c1\",\"function\":"
     "{\"name\":\"f\",\"arguments\":[1,{}]}}]}}]}",
     1},
    {"{\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"c1\",\"function\":"
     "{\"name\":\"f\",\"arguments\":5}}]}}]}",
     1},
    {"{\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"c1\",\"function\":"
     "{\"name\":\"f\",\"arguments\":true}}]}}]}",
     1},
    {"{\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"c1\",\"function\":"
     "{\"name\":\"f\",\"arguments\":null}}]}}]}",
     1},
    {"{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":\"0\",\"function\":"
     "{\"name\":\"f\"}}]}}]}",
     1},
    {"{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":-1,\"function\":"
     "{\"name\":\"f\"}}]}}]}",
     1},
    {"{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0.5,\"function\":"
     "{\"name\":\"f\"}}]}}]}",
     1},
    {"{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":null,\"id\":\"a\","
     "\"function\":{\"name\":\"f\"}},{\"id\":\"b\",\"function\":{\"name\":"
     "\"g\"}},{\"function\":{\"arguments\":\"x\"}}]}}]}",
     1},
    {"{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"a\","
     "\"function\":{\"name\":\"f\"}},{\"index\":0,\"id\":\"b\",\"function\":"
     "{\"name\":\"g\"}}]}}]}",
     1},
    {"{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":200,\"function\":"
     "{\"name\":\"f\"}}]}}]}",
     1},
    {"{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":9223372036854775807,"
     "\"function\":{\"name\":\"f\"}}]}}]}",
     1},
    {"{\"choices\":[{\"delta\":{\"tool_calls\":{}}}]}", 1},
    {"{\"choices\":[{\"delta\":{\"tool_calls\":null}}]}", 1},
    {"{\"choices\":[{\"delta\":{\"tool_calls\":[5]}}]}", 1},
    {"{\"choices\":[{\"delta\":{\"tool_calls\":[{\"id\":\"\",\"function\":"
     "{\"name\":\"\"}}]}}]}",
     1},
    {"{\"choices\":[{\"delta\":{\"tool_calls\":[{\"function\":\"f\"}]}}]}", 1},
    /* errors: jansson's objects */
    {"{\"error\":{\"message\":\"m\",\"type\":\"t\"}}", 0},
    {"{\"error\":{\"message\":\"m\",\"code\":\"c\"}}", 0},
    {"{\"error\":\"plain\"}", 0},
    {"{\"error\":{}}", 0},
    {"{\"error\":5}", 0},
    {"{\"error\":null,\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}", 1},
};

#define NCHUNKS (sizeof(chunks) / sizeof(chunks[0]))

/* A stream of one chunk: a leading text chunk, the chunk, [DONE]. */
static char *one_chunk_stream(const char *json, size_t *len)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);

    assert_int_equal(
        loom_buf_puts(&b, "data: {\"id\":\"lead\",\"choices\":[{\"delta\":"
                          "{\"content\":\"<\"}}]}\n\ndata: "),
        0);
    assert_int_equal(loom_buf_puts(&b, json), 0);
    assert_int_equal(loom_buf_puts(&b, "\n\ndata: [DONE]\n\n"), 0);
    *len = b.len;
    return loom_buf_detach(&b);
}

static void test_chunks_both_ways(void **state)
{
    (void)state;
    for (size_t i = 0; i < NCHUNKS; i++) {
        decode_opts o = {NULL, (size_t)-1, -1, 0};
        size_t len, fast;
        char *s = one_chunk_stream(chunks[i].json, &len);

        fast = same_both_ways(s, len, &o);
        /* The leading chunk always takes the fast path. */
        if (chunks[i].fast >= 0 && fast != 1 + (size_t)chunks[i].fast)
            fail_msg("chunk %zu: fast path took %zu of 2 chunks, want %d: "
                     "%s",
                     i, fast, 1 + chunks[i].fast, chunks[i].json);
        compare_all(s, len, (unsigned char)(i * 37));
        free(s);
        /* And alone, as a whole non-streamed answer. */
        o.complete = 1;
        same_both_ways(chunks[i].json, strlen(chunks[i].json), &o);
    }
}

/* A raw NUL inside a chunk (the SSE layer passes any byte on). */
static void test_nul_byte(void **state)
{
    static const char s[] = "data: {\"choices\":[{\"delta\":{\"content\":"
                            "\"a\0b\"}}]}\n\ndata: {\"choices\":[]}\0\n\n"
                            "data: [DONE]\n\n";
    decode_opts o = {NULL, (size_t)-1, -1, 0};

    (void)state;
    assert_int_equal(same_both_ways(s, sizeof(s) - 1, &o), 0);
}

/* What the fast path hands out, checked against known values. */
static void test_fast_values(void **state)
{
    static const char s[] =
        "data: {\"id\":\"r\\u00e9\",\"choices\":[{\"index\":0,\"delta\":{"
        "\"content\":\"\\ud83d\\ude00\\n\\\"q\\\"\\u20ac\",\"tool_calls\":[{"
        "\"index\":0,\"id\":\"c\\/1\",\"function\":{\"name\":\"f\","
        "\"arguments\":{\"z\":1,\"a\":2}}}]},\"finish_reason\":\"stop\"}],"
        "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2.9,"
        "\"total_tokens\":9223372036854775807}}\n\ndata: [DONE]\n\n";
    loom__openai_decoder *d = NULL;
    loom_llm_response resp;

    (void)state;
    memset(&resp, 0, sizeof(resp));
    assert_int_equal(loom__openai_decoder_new(&d, NULL, NULL, NULL), 0);
    assert_int_equal(loom__openai_decoder_feed(d, s, sizeof(s) - 1), 0);
    assert_int_equal(loom__openai_decoder_finish(d), 0);
    assert_int_equal(loom__openai_decoder_fast_chunks(d), 1);
    assert_int_equal(loom__openai_decoder_export(d, &resp), 0);
    assert_string_equal(resp.text, "\xf0\x9f\x98\x80\n\"q\"\xe2\x82\xac");
    assert_string_equal(resp.response_id, "r\xc3\xa9");
    assert_string_equal(resp.finish_reason, "stop");
    assert_int_equal(resp.tool_calls_len, 1);
    assert_string_equal(resp.tool_calls[0].id, "c/1");
    assert_string_equal(resp.tool_calls[0].arguments, "{\"z\":1,\"a\":2}");
    assert_int_equal(resp.usage.prompt_tokens, 3);
    assert_int_equal(resp.usage.completion_tokens, 2);
    assert_int_equal(resp.usage.total_tokens, 1000000000000L);
    loom_llm_response_clear(&resp);
    loom__openai_decoder_free(d);
}

/* A whole (non-streamed) answer takes the fast path too; an error body,
 * or one without choices, is left to jansson, which words it. The
 * decodes above check that both ways agree on every whole body. */
static void test_fast_whole_answer(void **state)
{
    static const char ok[] =
        "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"choices\":[{"
        "\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"Hi "
        "\\u00e9.\",\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
        "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}}]},"
        "\"finish_reason\":\"tool_calls\"}],\"usage\":{\"prompt_tokens\":10,"
        "\"completion_tokens\":2,\"total_tokens\":12}}";
    static const char err[] =
        "{\"error\":{\"message\":\"no such model\",\"type\":\"invalid\"}}";
    static const char none[] = "{\"id\":\"x\",\"choices\":[]}";
    loom__openai_decoder *d = NULL;
    loom_llm_response resp;

    (void)state;
    memset(&resp, 0, sizeof(resp));
    assert_int_equal(loom__openai_decoder_new(&d, NULL, NULL, NULL), 0);
    assert_int_equal(loom__openai_decoder_complete(d, ok, sizeof(ok) - 1), 0);
    assert_int_equal(loom__openai_decoder_fast_chunks(d), 1);
    assert_true(loom__openai_decoder_done(d));
    assert_int_equal(loom__openai_decoder_export(d, &resp), 0);
    assert_string_equal(resp.text, "Hi \xc3\xa9.");
    assert_string_equal(resp.finish_reason, "tool_calls");
    assert_int_equal(resp.tool_calls_len, 1);
    assert_string_equal(resp.tool_calls[0].id, "call_1");
    assert_string_equal(resp.tool_calls[0].name, "f");
    assert_string_equal(resp.tool_calls[0].arguments, "{\"a\":1}");
    assert_int_equal(resp.usage.prompt_tokens, 10);
    assert_int_equal(resp.usage.total_tokens, 12);
    loom_llm_response_clear(&resp);
    loom__openai_decoder_free(d);

    assert_int_equal(loom__openai_decoder_new(&d, NULL, NULL, NULL), 0);
    assert_int_equal(loom__openai_decoder_complete(d, err, sizeof(err) - 1),
                     LOOM_EUPSTREAM);
    assert_int_equal(loom__openai_decoder_fast_chunks(d), 0);
    assert_string_equal(loom__openai_decoder_error(d)->message,
                        "no such model");
    loom__openai_decoder_free(d);

    assert_int_equal(loom__openai_decoder_new(&d, NULL, NULL, NULL), 0);
    assert_int_equal(loom__openai_decoder_complete(d, none, sizeof(none) - 1),
                     LOOM_EPROTO);
    assert_int_equal(loom__openai_decoder_fast_chunks(d), 0);
    assert_non_null(strstr(loom_error_last(), "no choices"));
    loom__openai_decoder_free(d);
}

/* A chunk of n tokens: an array of n - 4 numbers beside the delta. */
static char *tokens_stream(size_t n, size_t *len)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);

    /* root, "x", [...], "choices", [] = 5 tokens plus the numbers */
    assert_int_equal(loom_buf_puts(&b, "data: {\"x\":["), 0);
    for (size_t i = 0; i + 5 < n; i++)
        assert_int_equal(loom_buf_puts(&b, i ? ",7" : "7"), 0);
    assert_int_equal(loom_buf_puts(&b, "],\"choices\":[]}\n\ndata: [DONE]\n\n"),
                     0);
    *len = b.len;
    return loom_buf_detach(&b);
}

/* Deeply nested: n arrays. */
static char *nested_stream(size_t n, size_t *len)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);

    assert_int_equal(loom_buf_puts(&b, "data: {\"choices\":[],\"x\":"), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(loom_buf_putc(&b, '['), 0);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(loom_buf_putc(&b, ']'), 0);
    assert_int_equal(loom_buf_puts(&b, "}\n\ndata: [DONE]\n\n"), 0);
    *len = b.len;
    return loom_buf_detach(&b);
}

/* The token limit of the fast path (256), crossed: past it, jansson. */
static void test_token_limit(void **state)
{
    decode_opts o = {NULL, (size_t)-1, -1, 0};
    size_t len;
    char *s;

    (void)state;
    s = tokens_stream(256, &len);
    assert_int_equal(same_both_ways(s, len, &o), 1);
    free(s);
    s = tokens_stream(257, &len);
    assert_int_equal(same_both_ways(s, len, &o), 0);
    free(s);
    s = nested_stream(200, &len);
    assert_int_equal(same_both_ways(s, len, &o), 1);
    free(s);
    s = nested_stream(2100, &len); /* past jansson's own depth limit */
    assert_int_equal(same_both_ways(s, len, &o), 0);
    free(s);
}

/* Strings past the scratch kept inside the decoder (2 KiB) go to the
 * heap; a later bigger chunk grows it. */
static void test_big_strings(void **state)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    decode_opts o = {NULL, (size_t)-1, -1, 0};
    size_t sizes[] = {100, 2000, 2100, 5000, 3000, 70000};

    (void)state;
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        assert_int_equal(loom_buf_puts(&b, "data: {\"choices\":[{\"delta\":{"
                                           "\"content\":\""),
                         0);
        for (size_t i = 0; i < sizes[k]; i++)
            assert_int_equal(loom_buf_puts(&b, i % 7 == 3   ? "\\n"
                                                : i % 11 ? "x"
                                                         : "\xc3\xa9"),
                             0);
        assert_int_equal(loom_buf_puts(&b, "\",\"reasoning\":\"r\"}}]}\n\n"),
                         0);
    }
    assert_int_equal(loom_buf_puts(&b, "data: [DONE]\n\n"), 0);
    assert_int_equal(same_both_ways(b.ptr, b.len, &o), 6);
    loom_buf_free(&b);
}

/* ---- seeded random mutations ------------------------------------------ */

static uint64_t rng_state;

static unsigned rnd(unsigned n)
{
    rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (unsigned)(rng_state >> 33) % n;
}

/* Bytes that matter to a JSON reader. */
static const char interesting[] = "\"\\{}[],:u0123456789eE.-+tfn \n\t/bx\x80"
                                  "\xc3\xa9\xed\xf0\xff\x01";

static void mutate(loom_buf *b)
{
    int edits = 1 + (int)rnd(3);

    for (int e = 0; e < edits && b->len > 0; e++) {
        size_t at = rnd((unsigned)b->len);
        char c = rnd(4) ? interesting[rnd(sizeof(interesting))]
                        : (char)rnd(256);
        switch (rnd(3)) {
        case 0:
            b->ptr[at] = c;
            break;
        case 1:
            memmove(b->ptr + at, b->ptr + at + 1, b->len - at - 1);
            b->len--;
            b->ptr[b->len] = '\0';
            break;
        default:
            assert_int_equal(loom_buf_putc(b, '\0'), 0);
            memmove(b->ptr + at + 1, b->ptr + at, b->len - at - 1);
            b->ptr[at] = c;
            break;
        }
    }
}

static void test_mutations_both_ways(void **state)
{
    const char *seeds[NCHUNKS + 1];
    size_t nseeds = 0;
    char *vec = test_vector_path("openai-chat/stream-works-1.sse");
    size_t vlen = 0;
    char *vdata;

    (void)state;
    assert_non_null(vec);
    vdata = test_read_file(vec, &vlen);
    assert_non_null(vdata);
    for (size_t i = 0; i < NCHUNKS; i++)
        if (chunks[i].fast == 1)
            seeds[nseeds++] = chunks[i].json;
    rng_state = 0x6c6f6f6d;
    for (int round = 0; round < 6000; round++) {
        loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
        decode_opts o = {NULL, (size_t)-1, -1, 0};
        loom__openai_limits lim;

        if (round % 10 == 0) {
            assert_int_equal(loom_buf_put(&b, vdata, vlen), 0);
        } else {
            assert_int_equal(loom_buf_puts(&b, "data: "), 0);
            assert_int_equal(loom_buf_puts(&b, seeds[rnd((unsigned)nseeds)]),
                             0);
            assert_int_equal(loom_buf_puts(&b, "\n\ndata: [DONE]\n\n"), 0);
        }
        mutate(&b);
        same_both_ways(b.ptr, b.len, &o);
        opts_from_byte((unsigned char)rnd(256), b.len, &lim, &o);
        same_both_ways(b.ptr, b.len, &o);
        loom_buf_free(&b);
    }
    free(vdata);
    free(vec);
    /* Mutations keep most chunks valid: the fast path saw plenty. */
    assert_true(g_fast_total > 3000);
}

/* Streams of chunks that begin alike, as a model's do, some of them
 * mutated: a chunk that begins with the head the decoder kept from the
 * chunks before starts from that head's tokens and checks, one that
 * differs inside the head is tokenized whole and moves the head, and both
 * must decode exactly as jansson does. */
static void test_chunk_heads_both_ways(void **state)
{
    const char *seeds[NCHUNKS + 1];
    size_t nseeds = 0, resumed_before = g_resumed_total;

    (void)state;
    for (size_t i = 0; i < NCHUNKS; i++)
        if (chunks[i].fast == 1)
            seeds[nseeds++] = chunks[i].json;
    rng_state = 0x68656164;
    for (int round = 0; round < 1500; round++) {
        loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
        decode_opts o = {NULL, (size_t)-1, -1, 0};
        const char *seed = seeds[rnd((unsigned)nseeds)];
        int n = 2 + (int)rnd(8);

        for (int c = 0; c < n; c++) {
            loom_buf chunk = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);

            /* Now and then the stream moves on to another kind of chunk. */
            if (rnd(6) == 0)
                seed = seeds[rnd((unsigned)nseeds)];
            /* The head a model's chunks share, before the seed's members
             * (as the first, when the seed is an object with some). */
            if (strncmp(seed, "{\"", 2) == 0)
                assert_int_equal(
                    loom_buf_printf(&chunk,
                                    "{\"id\":\"chatcmpl-%d\",\"object\":"
                                    "\"chat.completion.chunk\",\"created\":"
                                    "1700000000,\"model\":\"m\",%s",
                                    round, seed + 1),
                    0);
            else
                assert_int_equal(loom_buf_puts(&chunk, seed), 0);
            if (c > 0 && rnd(2))
                mutate(&chunk);
            assert_int_equal(loom_buf_puts(&b, "data: "), 0);
            assert_int_equal(loom_buf_put(&b, chunk.ptr, chunk.len), 0);
            assert_int_equal(loom_buf_puts(&b, "\n\n"), 0);
            loom_buf_free(&chunk);
        }
        assert_int_equal(loom_buf_puts(&b, "data: [DONE]\n\n"), 0);
        same_both_ways(b.ptr, b.len, &o);
        o.split = rnd((unsigned)b.len + 1);
        same_both_ways(b.ptr, b.len, &o);
        loom_buf_free(&b);
    }
    /* Plenty of chunks took the head's state. */
    assert_true(g_resumed_total - resumed_before > 500);
}

/* ---- the request body as text ------------------------------------------ */

#define DUMP_FLAGS (JSON_COMPACT | JSON_REAL_PRECISION(15))

static const int owner_a = 1, owner_b = 2;

/* Body text with cache (may be NULL) against the jansson builder: the
 * same text, or the same error. */
static void same_body_with(const loom_llm_request *req, loom_llm_cache *cache,
                           const void *owner)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    json_t *j = NULL;
    char *want = NULL;
    int rc1 = loom__openai_build_body(&j, req);
    int rc2 = loom__openai_body_text(&b, req, cache, owner);

    assert_int_equal(rc1, rc2);
    if (rc1 == 0) {
        want = json_dumps(j, DUMP_FLAGS);
        assert_non_null(want);
        if (strcmp(want, loom_buf_cstr(&b)) != 0)
            fail_msg("body differs:\n want %s\n got  %s", want,
                     loom_buf_cstr(&b));
        assert_int_equal(strlen(want), b.len);
    } else {
        assert_int_equal(b.len, 0);
    }
    free(want);
    json_decref(j);
    loom_buf_free(&b);
}

/* Without a cache, with a fresh one, and with one used twice. */
static void same_body(const loom_llm_request *req)
{
    loom_llm_cache *c = NULL;

    same_body_with(req, NULL, NULL);
    assert_int_equal(loom_llm_cache_new(&c), 0);
    same_body_with(req, c, &owner_a);
    same_body_with(req, c, &owner_a);
    loom_llm_cache_free(c);
}

static void test_body_shapes(void **state)
{
    json_t *params = json_loads(
        "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\","
        "\"description\":\"caf\\u00e9 \\\"x\\\" /\\n\"},\"n\":{\"type\":"
        "\"number\",\"minimum\":0.1,\"maximum\":1e300}},\"required\":"
        "[\"city\"],\"zzz\":null,\"aaa\":true}",
        0, NULL);
    json_t *scalar = json_integer(5);
    loom_tool_def tools[4] = {{"get_weather", "Weather \"now\"\n", params},
                              {"noargs", NULL, NULL},
                              {"odd\x01name", "", scalar},
                              {"bad\xffname", "d\xc3", params}};
    loom_tool_call calls[3] = {{"call_1", "get_weather", "{\"city\":\"P\"}"},
                               {"call_2", "get_time", NULL},
                               {NULL, NULL, ""}};
    loom_message raw[3];
    loom_messages m = {0};
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    const double temps[] = {0, 0.5, 1, 2, 1e-7, 0.1 + 0.2, 1.0 / 3, 1e22,
                            123456789.125, -1, NAN, INFINITY};
    const long maxes[] = {0, 1, 100, -5, 2147483647L, 9223372036854775807L};

    (void)state;
    assert_non_null(params);
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_SYSTEM, "Be brief."), 0);
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_USER, "Weather?"), 0);
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_USER, NULL), 0);
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_USER, ""), 0);
    assert_int_equal(
        loom_messages_add_assistant(&m, NULL, "thinking", calls, 3), 0);
    assert_int_equal(
        loom_messages_add_assistant(&m, "text too", NULL, calls, 1), 0);
    assert_int_equal(loom_messages_add_tool_result(&m, "call_1", "get_weather",
                                                   "sunny \xe2\x98\x80"),
                     0);
    assert_int_equal(
        loom_messages_add_tool_result(&m, NULL, "get_time", NULL), 0);
    assert_int_equal(loom_messages_add_assistant(&m, "", NULL, NULL, 0), 0);
    assert_int_equal(loom_messages_add_assistant(&m, NULL, NULL, NULL, 0), 0);
    assert_int_equal(
        loom_messages_add(&m, LOOM_ROLE_USER,
                          "bad \xff byte \xc3 \xed\xa0\x80 \xc0\xaf "
                          "\xf4\x90\x80\x80 \xf0\x9f\x98\x80 \x01\x1f\x7f "
                          "\"\\/\b\f\n\r\t end \xe2\x82"),
        0);
    req.model = "gpt-4o-mini";
    req.messages = m.items;
    req.messages_len = m.len;
    for (int stream = 0; stream <= 1; stream++) {
        req.stream = stream;
        for (size_t t = 0; t < sizeof(temps) / sizeof(temps[0]); t++) {
            req.temperature = temps[t];
            req.max_tokens = maxes[t % (sizeof(maxes) / sizeof(maxes[0]))];
            same_body(&req);
        }
    }
    req.temperature = -1;
    req.max_tokens = 0;
    /* tools, every choice, parallel or not */
    for (size_t nt = 0; nt <= 4; nt++) {
        req.tools = tools;
        req.tools_len = nt;
        for (int kind = 0; kind < 4; kind++) {
            for (int par = -1; par <= 1; par++) {
                req.tool_choice.kind = (loom_tool_choice_kind)kind;
                req.tool_choice.function =
                    kind == LOOM_TOOL_CHOICE_FUNCTION ? "get_\"w\xff" : NULL;
                req.parallel_tool_calls = par;
                same_body(&req);
            }
        }
    }
    /* a function choice without a name, no model, an empty model */
    req.tools_len = 2;
    req.tool_choice.kind = LOOM_TOOL_CHOICE_FUNCTION;
    req.tool_choice.function = "";
    same_body(&req);
    req.tool_choice.function = NULL;
    same_body(&req);
    req.tool_choice.kind = LOOM_TOOL_CHOICE_AUTO;
    req.model = NULL;
    same_body(&req);
    req.model = "";
    same_body(&req);
    req.model = "m\xff";
    /* roles out of range are sent as user; no messages at all */
    memset(raw, 0, sizeof(raw));
    raw[0].role = (loom_role)7;
    raw[0].content = "seven";
    raw[1].role = LOOM_ROLE_TOOL;
    raw[2].role = LOOM_ROLE_ASSISTANT;
    raw[2].tool_calls = calls;
    raw[2].tool_calls_len = 2;
    raw[2].content = "";
    req.messages = raw;
    req.messages_len = 3;
    same_body(&req);
    req.messages_len = 0;
    same_body(&req);
    loom_messages_free(&m);
    json_decref(params);
    json_decref(scalar);
}

/* A random string: edge bytes, valid and broken UTF-8, no NUL. */
static char *random_string(void)
{
    static const char *const pieces[] = {
        "a", "Z", " ", "\"", "\\", "/", "\x01", "\x1f", "\x7f", "\n", "\t",
        "\b", "\f", "\r", "\xc3\xa9", "\xe6\x97\xa5", "\xf0\x9f\x98\x80",
        "\xc3", "\xe6\x97", "\xf0\x9f\x98", "\xff", "\x80", "\xc0\xaf",
        "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xf8\x88\x80\x80\x80", "{}",
        "\\u0000"};
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    unsigned n = rnd(12);

    assert_int_equal(loom_buf_puts(&b, ""), 0);
    for (unsigned i = 0; i < n; i++) {
        if (rnd(8) == 0) {
            char c = (char)(1 + rnd(255));
            assert_int_equal(loom_buf_putc(&b, c), 0);
        } else {
            assert_int_equal(
                loom_buf_puts(&b, pieces[rnd(sizeof(pieces) /
                                             sizeof(pieces[0]))]),
                0);
        }
    }
    return loom_buf_detach(&b);
}

static void test_body_random_strings(void **state)
{
    (void)state;
    rng_state = 42;
    for (int round = 0; round < 1500; round++) {
        char *s[12];
        loom_tool_call calls[2];
        loom_message msgs[5];
        loom_tool_def tool;
        loom_llm_request req = LOOM_LLM_REQUEST_INIT;

        for (int i = 0; i < 12; i++)
            s[i] = random_string();
        memset(msgs, 0, sizeof(msgs));
        calls[0].id = s[0];
        calls[0].name = s[1];
        calls[0].arguments = s[2];
        calls[1].id = s[3];
        calls[1].name = s[4];
        calls[1].arguments = s[5];
        msgs[0].role = LOOM_ROLE_SYSTEM;
        msgs[0].content = s[6];
        msgs[1].role = LOOM_ROLE_USER;
        msgs[1].content = s[7];
        msgs[2].role = LOOM_ROLE_ASSISTANT;
        msgs[2].content = round % 2 ? s[8] : NULL;
        msgs[2].tool_calls = calls;
        msgs[2].tool_calls_len = 2;
        msgs[3].role = LOOM_ROLE_TOOL;
        msgs[3].tool_call_id = s[9];
        msgs[3].content = s[10];
        msgs[4].role = LOOM_ROLE_ASSISTANT;
        msgs[4].content = s[11];
        tool.name = s[1];
        tool.description = round % 3 ? s[8] : NULL;
        tool.parameters = NULL;
        req.model = s[6][0] ? s[6] : "m";
        req.messages = msgs;
        req.messages_len = 5;
        req.tools = &tool;
        req.tools_len = round % 2;
        req.tool_choice.kind = LOOM_TOOL_CHOICE_FUNCTION;
        req.tool_choice.function = s[0][0] ? s[0] : "f";
        same_body(&req);
        for (int i = 0; i < 12; i++)
            free(s[i]);
    }
}

/* A conversation that grows call after call through one cache, then is
 * edited, shrunk, given other tools, and used by another provider. */
static void test_body_cache(void **state)
{
    json_t *params = json_loads("{\"type\":\"object\"}", 0, NULL);
    loom_tool_def tools[2] = {{"a", "first", params}, {"b", NULL, NULL}};
    loom_tool_def tools_copy[2];
    loom_tool_call call = {"call_1", "a", "{}"};
    loom_messages m = {0};
    loom_llm_cache *c = NULL;
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    char *old;

    (void)state;
    assert_int_equal(loom_llm_cache_new(&c), 0);
    req.model = "m";
    req.tools = tools;
    req.tools_len = 2;
    assert_int_equal(loom_messages_add(&m, LOOM_ROLE_USER, "hi"), 0);
    for (int i = 0; i < 40; i++) {
        char text[32];
        snprintf(text, sizeof(text), "result %d \"q\"", i);
        if (i % 2)
            assert_int_equal(loom_messages_add_tool_result(&m, "call_1", "a",
                                                           text),
                             0);
        else
            assert_int_equal(
                loom_messages_add_assistant(&m, NULL, NULL, &call, 1), 0);
        /* m.items moves as it grows; the messages' own pointers stay. */
        req.messages = m.items;
        req.messages_len = m.len;
        req.tool_choice.kind = (loom_tool_choice_kind)(i % 3);
        same_body_with(&req, c, &owner_a);
    }
    /* The cache is used: a change behind the same pointer (against the
     * contract) is not seen... */
    assert_int_equal(loom__openai_body_text(&b, &req, c, &owner_a), 0);
    old = loom_buf_detach(&b);
    m.items[0].content[0] = 'H';
    assert_int_equal(loom__openai_body_text(&b, &req, c, &owner_a), 0);
    assert_string_equal(loom_buf_cstr(&b), old);
    m.items[0].content[0] = 'h';
    loom_buf_free(&b);
    free(old);
    /* ...while a message replaced (new pointer) is encoded again, with
     * every one after it. */
    free(m.items[3].content);
    m.items[3].content = strdup("edited \xff");
    same_body_with(&req, c, &owner_a);
    free(m.items[0].content);
    m.items[0].content = strdup("first edited");
    same_body_with(&req, c, &owner_a);
    /* fewer messages, then more again */
    req.messages_len = 5;
    same_body_with(&req, c, &owner_a);
    req.messages_len = m.len;
    same_body_with(&req, c, &owner_a);
    req.messages_len = 0;
    same_body_with(&req, c, &owner_a);
    req.messages_len = m.len;
    /* the same definitions from another array: still right */
    memcpy(tools_copy, tools, sizeof(tools));
    req.tools = tools_copy;
    same_body_with(&req, c, &owner_a);
    tools_copy[1].description = "now described";
    same_body_with(&req, c, &owner_a);
    req.tools_len = 1;
    same_body_with(&req, c, &owner_a);
    req.tools_len = 0;
    same_body_with(&req, c, &owner_a);
    req.tools_len = 2;
    same_body_with(&req, c, &owner_a);
    /* another provider: the cache starts over */
    same_body_with(&req, c, &owner_b);
    same_body_with(&req, c, &owner_a);
    /* an error leaves the cache usable */
    req.model = NULL;
    same_body_with(&req, c, &owner_a);
    req.model = "m";
    same_body_with(&req, c, &owner_a);
    assert_non_null(loom__openai_cache_body(c));
    loom_llm_cache_free(c);
    loom_llm_cache_free(NULL);
    loom_messages_free(&m);
    json_decref(params);
}

/* ---- the HTTP client reusing a handle's setup ------------------------- */

typedef struct {
    size_t bytes;
    int calls;
} body_count;

static int count_body(const char *data, size_t len, void *payload)
{
    body_count *c = payload;

    (void)data;
    c->bytes += len;
    c->calls++;
    return 0;
}

/* One request through pool; returns the response's new_connections. */
static long http_one(loom__http_pool *pool, const char *url,
                     const char *method, const char *const *hdrs, size_t nh,
                     const char *body, long connect_ms, body_count *bc)
{
    loom__http_request req;
    loom__http_response resp;
    long n;

    memset(&req, 0, sizeof(req));
    memset(&resp, 0, sizeof(resp));
    req.method = method;
    req.url = url;
    req.headers = hdrs;
    req.headers_len = nh;
    req.body = body;
    req.body_len = body ? strlen(body) : 0;
    req.connect_timeout_ms = connect_ms;
    req.on_body = count_body;
    req.payload = bc;
    if (loom__http_perform(pool, &req, &resp) != 0)
        fail_msg("request failed: %s", loom_error_last());
    assert_int_equal(resp.status, 200);
    n = resp.new_connections;
    loom__http_response_clear(&resp);
    return n;
}

/* Recorded request i of f: method, path, a header (NULL: must be absent)
 * and the body's "n". */
static void check_record(loom_fake *f, size_t i, const char *method,
                         const char *path, const char *hname,
                         const char *hvalue, const char *absent, long n)
{
    json_t *r = fake_request(f, i);
    json_t *h;

    assert_non_null(r);
    h = json_object_get(r, "headers");
    assert_string_equal(json_string_value(json_object_get(r, "method")),
                        method);
    assert_string_equal(json_string_value(json_object_get(r, "path")), path);
    if (hname)
        assert_string_equal(json_string_value(json_object_get(h, hname)),
                            hvalue);
    if (absent)
        assert_null(json_object_get(h, absent));
    if (n >= 0)
        assert_int_equal(json_integer_value(json_object_get(
                             json_object_get(r, "body"), "n")),
                         n);
    else
        assert_null(json_object_get(r, "body"));
    json_decref(r);
}

static void test_http_setup_reuse(void **state)
{
    static const char script[] =
        "{\"loop\":true,\"responses\":[{\"text\":[\"ok\",\" then\"]}]}";
    const char *ha[] = {"Content-Type: application/json", "X-A: 1"};
    const char *hb[] = {"Content-Type: application/json", "X-B: 2"};
    loom_fake *fa = fake_start_script(script);
    loom_fake *fb = fake_start_script(script);
    loom__http_pool *pool = NULL;
    char ua[256], ub[256], models[256];
    body_count bc[10];

    (void)state;
    assert_non_null(fa);
    assert_non_null(fb);
    memset(bc, 0, sizeof(bc));
    snprintf(ua, sizeof(ua), "%s/chat/completions", fake_base_url(fa));
    snprintf(ub, sizeof(ub), "%s/chat/completions", fake_base_url(fb));
    snprintf(models, sizeof(models), "%s/models", fake_base_url(fa));
    assert_int_equal(loom__http_pool_new(&pool), 0);

    http_one(pool, ua, "POST", ha, 2, "{\"n\":1}", 5000, &bc[0]);
    /* The same setup: the handle is not set up again, and the kept-alive
     * connection is reused. */
    assert_int_equal(http_one(pool, ua, "POST", ha, 2,
                              "{\"n\":2,\"stream\":true}", 5000, &bc[1]),
                     0);
    http_one(pool, ua, "POST", hb, 2, "{\"n\":3}", 5000, &bc[2]);
    http_one(pool, models, "GET", NULL, 0, NULL, 5000, &bc[3]);
    http_one(pool, ua, "POST", ha, 2, "{\"n\":5}", 5000, &bc[4]);
    http_one(pool, ua, "PUT", ha, 2, "{\"n\":6}", 5000, &bc[5]);
    http_one(pool, ua, "POST", ha, 2, "{\"n\":7}", 5000, &bc[6]);
    http_one(pool, ub, "POST", ha, 1, "{\"n\":8}", 5000, &bc[7]);
    http_one(pool, ua, "POST", ha, 1, "{\"n\":9}", 0, &bc[8]);
    http_one(pool, ua, NULL, ha, 2, "{\"n\":10}", 0, &bc[9]);

    assert_int_equal(fake_request_count(fa), 9);
    assert_int_equal(fake_request_count(fb), 1);
    check_record(fa, 0, "POST", "/v1/chat/completions", "x-a", "1", "x-b", 1);
    check_record(fa, 1, "POST", "/v1/chat/completions", "x-a", "1", "x-b", 2);
    check_record(fa, 2, "POST", "/v1/chat/completions", "x-b", "2", "x-a", 3);
    check_record(fa, 3, "GET", "/v1/models", NULL, NULL, "x-a", -1);
    check_record(fa, 4, "POST", "/v1/chat/completions", "x-a", "1", "x-b", 5);
    check_record(fa, 5, "PUT", "/v1/chat/completions", "x-a", "1", NULL, 6);
    check_record(fa, 6, "POST", "/v1/chat/completions", "x-a", "1", NULL, 7);
    check_record(fb, 0, "POST", "/v1/chat/completions", "content-type",
                 "application/json", "x-a", 8);
    check_record(fa, 7, "POST", "/v1/chat/completions", "content-type",
                 "application/json", "x-a", 9);
    check_record(fa, 8, "POST", "/v1/chat/completions", "x-a", "1", NULL, 10);
    /* Each request's body went to its own callback payload. */
    for (int i = 0; i < 10; i++)
        assert_true(bc[i].bytes > 0);
    /* The streamed one is bigger than the JSON answers. */
    assert_true(bc[1].bytes > bc[0].bytes);
    loom__http_pool_free(pool);
    fake_stop(fa);
    fake_stop(fb);
}

/* ---- run events -------------------------------------------------------- */

typedef struct {
    loom_provider base;
    int next;
    const loom_llm_cache *caches[4];
} script_provider;

static int script_complete(loom_provider *p, const loom_llm_request *req,
                           loom_llm_event_cb cb, void *payload,
                           loom_llm_response *resp, loom_cancel *cancel)
{
    script_provider *sp = (script_provider *)p;
    loom_llm_event ev;
    int n = sp->next++;

    (void)cancel;
    assert_true(n < 4);
    sp->caches[n] = req->cache;
    memset(&ev, 0, sizeof(ev));
    if (n == 0 || n == 2) {
        ev.type = n ? LOOM_LLM_TEXT : LOOM_LLM_REASONING;
        ev.text = n ? "Done \xc3\xa9" : "thinking";
        ev.text_len = strlen(ev.text);
        if (cb(&ev, payload))
            return LOOM_ECANCELED;
    }
    if (n == 2) {
        /* invalid UTF-8 in a delta: its payload is {} (json_pack's way) */
        ev.text = "bad \xff";
        ev.text_len = strlen(ev.text);
        if (cb(&ev, payload))
            return LOOM_ECANCELED;
    }
    resp->text = strdup(n == 2 ? "Done \xc3\xa9" : "");
    if (n == 0) {
        resp->tool_calls = calloc(1, sizeof(loom_tool_call));
        resp->tool_calls_len = 1;
        resp->tool_calls[0].id = strdup("c1");
        resp->tool_calls[0].name = strdup("echo");
        resp->tool_calls[0].arguments = strdup("{\"x\":1}");
    } else if (n == 1) {
        resp->tool_calls = calloc(3, sizeof(loom_tool_call));
        resp->tool_calls_len = 3;
        resp->tool_calls[0].id = strdup("c2");
        resp->tool_calls[0].name = strdup("nope");
        resp->tool_calls[0].arguments = strdup("{}");
        resp->tool_calls[1].id = strdup("c3");
        resp->tool_calls[1].name = strdup("echo");
        resp->tool_calls[1].arguments = strdup("{bad");
        resp->tool_calls[2].id = strdup("c4");
        resp->tool_calls[2].name = strdup("echo");
        resp->tool_calls[2].arguments = strdup("{}");
    }
    resp->usage.prompt_tokens = 10 + n;
    resp->usage.completion_tokens = 2;
    resp->usage.total_tokens = 12 + n;
    resp->finish_reason = strdup(n == 2 ? "stop" : "tool_calls");
    return 0;
}

static void script_free(loom_provider *p)
{
    (void)p;
}

static const loom_provider_vtable script_vt = {.version =
                                                   LOOM_PROVIDER_VTABLE_VERSION,
                                               .complete = script_complete,
                                               .free = script_free};

static int echo_exec(const json_t *args, const loom_tool_ctx *ctx,
                     loom_buf *out, void *payload)
{
    (void)args;
    (void)ctx;
    (void)payload;
    return loom_buf_puts(out, "got \"it\"");
}

static int collect_event(const loom_event *ev, void *payload)
{
    loom_buf *b = payload;
    json_t *d = json_deep_copy(ev->data);
    char *s;

    assert_non_null(d);
    if (json_object_get(d, "duration_ms")) {
        assert_true(json_is_real(json_object_get(d, "duration_ms")));
        json_object_set_new(d, "duration_ms", json_integer(0));
    }
    if (json_object_get(d, "started_at_ms")) {
        assert_true(json_integer_value(json_object_get(d, "started_at_ms")) >
                    0);
        json_object_set_new(d, "started_at_ms", json_integer(0));
    }
    s = json_dumps(d, JSON_COMPACT);
    assert_non_null(s);
    assert_int_equal(loom_buf_printf(b, "%s %s\n",
                                     loom_event_type_name(ev->type), s),
                     0);
    free(s);
    json_decref(d);
    return 0;
}

/* Every event's payload, keys in order: pins what the run sends. */
static void test_run_event_payloads(void **state)
{
    static const char want[] =
        "run.started {\"agent\":null,\"model\":\"fake/m\",\"max_iterations\":"
        "5,\"tools\":1}\n"
        "reasoning.delta {\"delta\":\"thinking\"}\n"
        "usage {\"prompt_tokens\":10,\"completion_tokens\":2,\"cached_"
        "tokens\":0,\"reasoning_tokens\":0,\"total_tokens\":12,\"iteration\":"
        "1,\"cumulative\":{\"prompt_tokens\":10,\"completion_tokens\":2,"
        "\"cached_tokens\":0,\"reasoning_tokens\":0,\"total_tokens\":12}}\n"
        "tool_calls {\"calls\":[{\"id\":\"c1\",\"name\":\"echo\","
        "\"arguments\":\"{\\\"x\\\":1}\",\"text_offset\":0}]}\n"
        "tool.started {\"id\":\"c1\",\"name\":\"echo\",\"arguments\":"
        "{\"x\":1}}\n"
        "tool.completed {\"id\":\"c1\",\"name\":\"echo\",\"output\":\"got "
        "\\\"it\\\"\",\"truncated\":false,\"output_size\":8,\"duration_"
        "ms\":0}\n"
        "tool.metric {\"call_id\":\"c1\",\"tool\":\"echo\",\"iteration\":1,"
        "\"arguments\":{\"x\":1},\"arguments_size\":7,\"started_at_ms\":0,"
        "\"duration_ms\":0,\"status\":\"success\",\"error\":null,"
        "\"result_size\":8,\"truncated\":false,\"cost_micros\":0,"
        "\"documents\":[]}\n"
        "usage {\"prompt_tokens\":11,\"completion_tokens\":2,\"cached_"
        "tokens\":0,\"reasoning_tokens\":0,\"total_tokens\":13,\"iteration\":"
        "2,\"cumulative\":{\"prompt_tokens\":21,\"completion_tokens\":4,"
        "\"cached_tokens\":0,\"reasoning_tokens\":0,\"total_tokens\":25}}\n"
        "tool_calls {\"calls\":[{\"id\":\"c2\",\"name\":\"nope\","
        "\"arguments\":\"{}\",\"text_offset\":0},{\"id\":\"c3\",\"name\":"
        "\"echo\",\"arguments\":\"{bad\",\"text_offset\":0},{\"id\":\"c4\","
        "\"name\":\"echo\",\"arguments\":\"{}\",\"text_offset\":0}]}\n"
        "tool.failed {\"id\":\"c2\",\"name\":\"nope\",\"stage\":\"lookup\","
        "\"error\":\"Unknown tool 'nope'. Available tools: echo.\","
        "\"output\":\"Error: Unknown tool 'nope'. Available tools: echo.\","
        "\"duration_ms\":0}\n"
        "tool.metric {\"call_id\":\"c2\",\"tool\":\"nope\",\"iteration\":2,"
        "\"arguments\":{},\"arguments_size\":2,\"started_at_ms\":0,"
        "\"duration_ms\":0,\"status\":\"error\",\"error\":{\"code\":"
        "\"ENOTFOUND\",\"stage\":\"lookup\",\"message\":\"Unknown tool "
        "'nope'. Available tools: echo.\"},\"result_size\":50,"
        "\"truncated\":false,\"cost_micros\":0,\"documents\":[]}\n";
    loom_buf got = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    loom_run_options o = LOOM_RUN_OPTIONS_INIT;
    loom_tool_registry *reg = NULL;
    loom_messages hist = {0};
    script_provider sp;
    loom_run *run = NULL;
    loom_tool t;
    json_t *params = json_loads("{\"type\":\"object\",\"properties\":{\"x\":"
                                "{\"type\":\"integer\"}}}",
                                0, NULL);

    (void)state;
    memset(&sp, 0, sizeof(sp));
    sp.base.vt = &script_vt;
    sp.base.name = "script";
    memset(&t, 0, sizeof(t));
    t.name = "echo";
    t.description = "Echoes.";
    t.parameters = params;
    t.execute = echo_exec;
    assert_int_equal(loom_tool_registry_new(&reg), 0);
    assert_int_equal(loom_tool_registry_add(reg, &t), 0);
    assert_int_equal(loom_messages_add(&hist, LOOM_ROLE_USER, "go"), 0);
    o.provider = &sp.base;
    o.model = "fake/m";
    o.upstream_model = "m";
    o.tools = reg;
    o.max_iterations = 5;
    o.tool_concurrency = 1;
    o.sink.emit = collect_event;
    o.sink.payload = &got;
    assert_int_equal(loom_run_new(&run, &o, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);
    assert_string_equal(loom_run_text(run), "Done \xc3\xa9");
    /* The start of the log is exact; the rest is checked piece by piece
     * (tool.failed for the bad JSON quotes jansson's message). */
    if (strncmp(loom_buf_cstr(&got), want, strlen(want)) != 0)
        fail_msg("events differ:\n got\n%s\n want (start)\n%s",
                 loom_buf_cstr(&got), want);
    assert_non_null(strstr(
        got.ptr, "tool.failed {\"id\":\"c3\",\"name\":\"echo\",\"stage\":"
                 "\"arguments\",\"error\":\"invalid JSON in the arguments of "
                 "'echo': "));
    assert_non_null(strstr(got.ptr, "tool.started {\"id\":\"c4\",\"name\":"
                                    "\"echo\",\"arguments\":{}}\n"));
    assert_non_null(strstr(
        got.ptr, "message.delta {\"delta\":\"Done \xc3\xa9\"}\n"
                 "message.delta {}\n"
                 "usage {\"prompt_tokens\":12,"));
    assert_non_null(strstr(
        got.ptr, "run.completed {\"status\":\"completed\",\"text\":\"Done "
                 "\xc3\xa9\",\"iterations\":3,\"finish_reason\":\"stop\","
                 "\"usage\":{\"prompt_tokens\":33,"));
    /* One cache for the whole run. */
    assert_int_equal(sp.next, 3);
    assert_non_null(sp.caches[0]);
    assert_ptr_equal(sp.caches[0], sp.caches[1]);
    assert_ptr_equal(sp.caches[0], sp.caches[2]);
    loom_run_free(run);

    /* Without a sink, the same run works and builds nothing to send. */
    memset(&sp, 0, sizeof(sp));
    sp.base.vt = &script_vt;
    sp.base.name = "script";
    o.sink.emit = NULL;
    o.sink.payload = NULL;
    assert_int_equal(loom_run_new(&run, &o, &hist), 0);
    assert_int_equal(loom_run_execute(run), 0);
    assert_string_equal(loom_run_text(run), "Done \xc3\xa9");
    loom_run_free(run);

    loom_messages_free(&hist);
    loom_tool_registry_free(reg);
    loom_buf_free(&got);
    json_decref(params);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors_both_ways),
        cmocka_unit_test(test_fuzz_corpus_both_ways),
        cmocka_unit_test(test_chunks_both_ways),
        cmocka_unit_test(test_nul_byte),
        cmocka_unit_test(test_fast_values),
        cmocka_unit_test(test_fast_whole_answer),
        cmocka_unit_test(test_token_limit),
        cmocka_unit_test(test_big_strings),
        cmocka_unit_test(test_mutations_both_ways),
        cmocka_unit_test(test_chunk_heads_both_ways),
        cmocka_unit_test(test_body_shapes),
        cmocka_unit_test(test_body_random_strings),
        cmocka_unit_test(test_body_cache),
        cmocka_unit_test(test_http_setup_reuse),
        cmocka_unit_test(test_run_event_payloads),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
