/*
 * Tests of the tokenizer (include/loom/tokenizer.h): ids that js-tiktoken
 * gives for fixed texts in both encodings (contractions, whitespace,
 * digits, CJK, emoji, a Unicode 16 letter, characters that are whitespace
 * to JavaScript and not, or the other way), decode round trips, invalid
 * UTF-8 read as U+FFFD per maximal subpart, special tokens, the two merge
 * methods against a plain transcription of tiktoken's algorithm, long
 * pieces, every limit (input, decode buffer, vocabulary files), loading
 * from a path with and without meta.json, a tiny hand-checked vocabulary,
 * the missing-vocabulary error and the estimator fallback (logged once),
 * and the per-model counter: model mapping, message and tool accounting,
 * and the correction factor.
 *
 * The real vocabularies must be there: run scripts/vocab.sh first (a
 * missing one fails these tests, with that advice).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/tokenizer_internal.h"
#include "loom/log.h"
#include "testutil.h"

#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define VOCAB_DIR LOOM_SOURCE_DIR "/vocab/data"

static loom_tokenizer *enc[2]; /* o200k_base, cl100k_base */
static const char *const enc_names[2] = {"o200k_base", "cl100k_base"};

static int setup(void **state)
{
    (void)state;
    setenv("LOOM_VOCAB_DIR", VOCAB_DIR, 1);
    for (int i = 0; i < 2; i++) {
        if (loom_tokenizer_load(&enc[i], enc_names[i]) < 0) {
            fprintf(stderr, "test_tokenizer: %s\n(run scripts/vocab.sh "
                    "before the tests)\n", loom_error_last());
            return -1;
        }
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (int i = 0; i < 2; i++)
        loom_tokenizer_free(enc[i]);
    loom__tokenizer_shared_reset();
    loom__token_counter_reset();
    return 0;
}

static void expect_ids(const loom_tokenizer *t, const char *text, size_t len,
                       int special, const uint32_t *want, size_t nwant)
{
    uint32_t *ids = NULL;
    size_t n = 0;

    assert_int_equal(loom_tokenizer_encode(t, text, len, special, &ids, &n),
                     0);
    if (n != nwant || memcmp(ids, want, n * sizeof(*ids))) {
        fprintf(stderr, "%s: \"%.*s\": got", loom_tokenizer_name(t),
                (int)len, text);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %u", ids[i]);
        fprintf(stderr, "\n");
        free(ids);
        fail_msg("ids differ");
    }
    if (!special)
        assert_int_equal(loom_tokenizer_count(t, text, len), n);
    free(ids);
}

/* ---------------------------------------------------------------------
 * Known ids (from js-tiktoken 1.0.21, node 20)
 */

static const struct {
    int enc;
    const char *text;
    uint32_t ids[32];
    size_t n;
} known[] = {
    {0, "Hello world", {13225, 2375}, 2},
    {0, "it's IT'S we'Re they'VE i'\xc5\xbf",
     {64190, 8734, 31233, 581, 146756, 1023, 6, 19511, 575, 6, 70067}, 11},
    {0, "a  \n\n  b   \t\r\n  c    ",
     {64, 11691, 220, 287, 271, 7709, 220, 274, 257}, 9},
    {0, "1234567 \xd9\xa1\xd9\xa2\xd9\xa3 \xc2\xb2\xc2\xbd",
     {7633, 19354, 22, 220, 46600, 53184, 81473, 220, 13848, 27124}, 10},
    {0, "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3"
        "\x82\xad\xe3\x82\xb9\xe3\x83\x88\xe3\x80\x81\xed\x95\x9c\xea\xb5"
        "\xad\xec\x96\xb4\xe3\x80\x82",
     {9048, 40909, 3385, 16056, 18368, 38236, 1395, 114854, 5959, 788}, 10},
    {0, "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f"
        "\x91\xa7\xe2\x80\x8d\xf0\x9f\x91\xa6 \xf0\x9f\x87\xab\xf0\x9f\x87"
        "\xb7 1\xef\xb8\x8f\xe2\x83\xa3",
     {28823, 102, 2524, 28823, 102, 2524, 28823, 100, 2524, 28823, 99,
      173468, 104, 55506, 115, 220, 16, 150858}, 18},
    /* U+10D4F (Garay, Unicode 16) is a letter to node, not to PCRE2 */
    {0, "\xf0\x90\xb5\x8f's \xc7\x85ungla \xe1\xbe\x88",
     {172, 238, 113, 237, 885, 220, 131, 227, 988, 1675, 220, 157, 122,
      230}, 14},
    /* U+0085 and U+180E are not JavaScript whitespace; U+FEFF is */
    {0, "x\xc2\x85y\xef\xbb\xbfz\xe1\xa0\x8e w\xc2\xa0v",
     {87, 126, 227, 88, 5574, 89, 157, 254, 236, 286, 5310, 85}, 12},
    {0, "int main(void) {\n    return 0;\n}\n",
     {491, 2758, 10218, 8, 405, 271, 622, 220, 15, 307, 739}, 11},
    {1, "Hello world", {9906, 1917}, 2},
    {1, "it's IT'S we'Re they'VE i'\xc5\xbf",
     {275, 596, 8871, 13575, 584, 50527, 814, 6, 4592, 602, 6, 129, 123},
     13},
    {1, "a  \n\n  b   \t\r\n  c    ",
     {64, 19124, 220, 293, 262, 4574, 220, 272, 257}, 9},
    {1, "1234567 \xd9\xa1\xd9\xa2\xd9\xa3 \xc2\xb2\xc2\xbd",
     {4513, 10961, 22, 220, 149, 94, 149, 95, 149, 96, 220, 30556, 27154},
     13},
    {1, "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3"
        "\x82\xad\xe3\x82\xb9\xe3\x83\x88\xe3\x80\x81\xed\x95\x9c\xea\xb5"
        "\xad\xec\x96\xb4\xe3\x80\x82",
     {9080, 22656, 45918, 252, 16144, 57933, 62903, 71634, 5486, 24486,
      89059, 255, 32179, 1811}, 14},
    {1, "\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f"
        "\x91\xa7\xe2\x80\x8d\xf0\x9f\x91\xa6 \xf0\x9f\x87\xab\xf0\x9f\x87"
        "\xb7 1\xef\xb8\x8f\xe2\x83\xa3",
     {9468, 239, 102, 378, 235, 9468, 239, 102, 378, 235, 9468, 239, 100,
      378, 235, 9468, 239, 99, 11410, 229, 104, 9468, 229, 115, 220, 16,
      31643, 158, 225, 96}, 30},
    {1, "\xf0\x90\xb5\x8f's \xc7\x85ungla \xe1\xbe\x88",
     {172, 238, 113, 237, 596, 220, 131, 227, 2234, 4355, 87189, 122, 230},
     13},
    {1, "x\xc2\x85y\xef\xbb\xbfz\xe1\xa0\x8e w\xc2\xa0v",
     {87, 126, 227, 88, 3305, 89, 157, 254, 236, 289, 4194, 85}, 12},
    {1, "int main(void) {\n    return 0;\n}\n",
     {396, 1925, 4431, 8, 341, 262, 471, 220, 15, 280, 534}, 11},
};

static void test_known_ids(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(known) / sizeof(known[0]); i++)
        expect_ids(enc[known[i].enc], known[i].text, strlen(known[i].text),
                   0, known[i].ids, known[i].n);
    assert_string_equal(loom_tokenizer_name(enc[0]), "o200k_base");
    assert_string_equal(loom_tokenizer_name(enc[1]), "cl100k_base");
    assert_int_equal(loom_tokenizer_count(enc[0], "", 0), 0);
}

/* ---------------------------------------------------------------------
 * Round trips and invalid UTF-8
 */

static uint32_t rnd_state = 12345;
static uint32_t rnd(void)
{
    rnd_state ^= rnd_state << 13;
    rnd_state ^= rnd_state >> 17;
    rnd_state ^= rnd_state << 5;
    return rnd_state;
}

/* A random valid UTF-8 string of about n bytes from a mixed alphabet. */
static size_t random_text(char *out, size_t n)
{
    static const char *const parts[] = {
        "the ", "The", " quick", "'s", "'LL", "  ", "\n", "\r\n", "\t",
        "123", "4567890", "\xc3\xa9", "\xe6\x97\xa5", "\xf0\x9f\x98\x80",
        "\xe2\x80\x8d", "\xef\xbb\xbf", "\xc2\xa0", "<|endoftext|>", "{\"",
        "\":", "//", "!!", "\xd9\x85", "\xe0\xa4\x95\xe0\xa4\xbf", "x",
        "\xf0\x90\xb5\x8f", "\xcc\x81", "\xe3\x80\x80", "\xc2\x85"};
    size_t len = 0;

    while (len < n) {
        const char *p = parts[rnd() % (sizeof(parts) / sizeof(parts[0]))];
        size_t k = strlen(p);
        memcpy(out + len, p, k);
        len += k;
    }
    out[len] = '\0';
    return len;
}

static void test_roundtrip(void **state)
{
    char text[4200];
    loom_buf out = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);

    (void)state;
    for (int round = 0; round < 200; round++) {
        size_t len = random_text(text, (size_t)(rnd() % 4000));
        for (int e = 0; e < 2; e++) {
            uint32_t *ids = NULL;
            size_t n = 0;
            assert_int_equal(loom_tokenizer_encode(enc[e], text, len, 0,
                                                   &ids, &n), 0);
            assert_int_equal(loom_tokenizer_count(enc[e], text, len), n);
            loom_buf_clear(&out);
            assert_int_equal(loom_tokenizer_decode(enc[e], ids, n, &out), 0);
            assert_int_equal(out.len, len);
            assert_memory_equal(out.ptr ? out.ptr : "", text, len);
            free(ids);
        }
    }
    loom_buf_free(&out);
}

/* bad reads as good, byte for byte in the ids */
static void expect_same(const char *bad, size_t blen, const char *good)
{
    for (int e = 0; e < 2; e++) {
        uint32_t *want = NULL;
        size_t n = 0;
        assert_int_equal(loom_tokenizer_encode(enc[e], good, strlen(good), 0,
                                               &want, &n), 0);
        expect_ids(enc[e], bad, blen, 0, want, n);
        free(want);
    }
}

#define FFFD "\xef\xbf\xbd"

static void test_invalid_utf8(void **state)
{
    (void)state;
    expect_same("\xff", 1, FFFD);
    expect_same("a\x80\x80z", 4, "a" FFFD FFFD "z");
    /* a truncated sequence is one maximal subpart, in the middle or at
     * the end; the byte that broke it is read again */
    expect_same("a\xe2\x82z", 4, "a" FFFD "z");
    expect_same("a\xf0\x9f\x98", 4, "a" FFFD);
    expect_same("\xe2\x28\xa1", 3, FFFD "(" FFFD);
    /* overlongs, surrogates and code points past U+10FFFF: one U+FFFD per
     * byte, as no valid prefix starts them */
    expect_same("\xe0\x80\x80", 3, FFFD FFFD FFFD);
    expect_same("\xc0\xaf", 2, FFFD FFFD);
    expect_same("\xed\xa0\x80x", 4, FFFD FFFD FFFD "x");
    expect_same("\xf4\x90\x80\x80", 4, FFFD FFFD FFFD FFFD);
    expect_same("it\xc3's", 5, "it" FFFD "'s");
}

/* NUL bytes are kept, not ends of text. */
static void test_nul_bytes(void **state)
{
    loom_buf out = LOOM_BUF_INIT(64);
    uint32_t *ids = NULL;
    size_t n = 0;

    (void)state;
    assert_int_equal(loom_tokenizer_encode(enc[0], "a\0b\0", 4, 0, &ids, &n),
                     0);
    assert_true(n >= 2);
    assert_int_equal(loom_tokenizer_decode(enc[0], ids, n, &out), 0);
    assert_int_equal(out.len, 4);
    assert_memory_equal(out.ptr, "a\0b\0", 4);
    free(ids);
    loom_buf_free(&out);
}

/* ---------------------------------------------------------------------
 * Special tokens
 */

static void test_special_tokens(void **state)
{
    static const char text[] = "a<|endoftext|>b<|endofprompt|><|endoftext|>";
    static const uint32_t want0[] = {64, 199999, 65, 200018, 199999};
    static const uint32_t eot1[] = {100257};
    uint32_t *ids = NULL;
    size_t n = 0, i;
    loom_buf out = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);

    (void)state;
    expect_ids(enc[0], text, strlen(text), 1, want0, 5);
    expect_ids(enc[1], "<|endoftext|>", 13, 1, eot1, 1);
    assert_int_equal(loom_tokenizer_special_id(enc[0], "<|endoftext|>"),
                     199999);
    assert_int_equal(loom_tokenizer_special_id(enc[1], "<|fim_middle|>"),
                     100259);
    assert_int_equal(loom_tokenizer_special_id(enc[0], "<|fim_middle|>"),
                     -1);
    /* without allow_special they are plain text, and decode back */
    assert_int_equal(loom_tokenizer_encode(enc[0], text, strlen(text), 0,
                                           &ids, &n), 0);
    assert_true(n > 5);
    for (i = 0; i < n; i++)
        assert_true(ids[i] < 199998);
    assert_int_equal(loom_tokenizer_count(enc[0], text, strlen(text)), n);
    free(ids);
    /* special ids decode to their text */
    assert_int_equal(loom_tokenizer_decode(enc[0], want0, 5, &out), 0);
    assert_string_equal(out.ptr, text);
    /* a broken one is text; the same text with allow_special too */
    assert_int_equal(loom_tokenizer_encode(enc[0], "<|endoftext", 11, 1,
                                           &ids, &n), 0);
    for (i = 0; i < n; i++)
        assert_true(ids[i] < 199998);
    free(ids);
    loom_buf_free(&out);
}

/* ---------------------------------------------------------------------
 * The merge methods against a transcription of tiktoken's algorithm
 */

/* Leftmost lowest rank first, rescanning every pair each step. */
static size_t reference_bpe(const loom_tokenizer *t, const uint8_t *p,
                            size_t n, uint32_t *out)
{
    size_t *start = malloc((n + 1) * sizeof(*start)), m = n, i;

    assert_non_null(start);
    for (i = 0; i <= n; i++)
        start[i] = i;
    while (m > 1) {
        uint32_t best = UINT32_MAX;
        size_t at = 0;
        for (i = 0; i + 1 < m; i++) {
            uint32_t r = loom__tokenizer_rank(t, p + start[i],
                                              start[i + 2] - start[i]);
            if (r < best) {
                best = r;
                at = i;
            }
        }
        if (best == UINT32_MAX)
            break;
        memmove(&start[at + 1], &start[at + 2],
                (m - at - 1) * sizeof(*start));
        m--;
    }
    for (i = 0; i < m; i++)
        out[i] = loom__tokenizer_rank(t, p + start[i], start[i + 1] -
                                      start[i]);
    free(start);
    return m;
}

static void test_bpe_methods(void **state)
{
    static const char *const alphabets[] = {
        "ab", " ", "abcdefghijklmnopqrstuvwxyz", "0123456789 .,",
        "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e", "e\xcc\x81 ", NULL};
    uint8_t buf[300];
    uint32_t a[300], h[300], r[300];

    (void)state;
    for (int round = 0; round < 3000; round++) {
        size_t n = 1 + rnd() % (round % 3 ? 64 : 300), i;
        const char *al = alphabets[rnd() % 7];
        size_t k, na, nh, nr;
        for (i = 0; i < n; i++)
            buf[i] = al ? (uint8_t)al[rnd() % strlen(al)] : (uint8_t)rnd();
        const loom_tokenizer *t = enc[round & 1];
        nr = reference_bpe(t, buf, n, r);
        nh = loom__tokenizer_bpe(t, buf, n, LOOM__BPE_HEAP, h);
        assert_int_equal(nh, nr);
        assert_memory_equal(h, r, nr * sizeof(*r));
        assert_int_equal(loom__tokenizer_bpe(t, buf, n, LOOM__BPE_HEAP, NULL),
                         nr);
        if (n <= 64) {
            na = loom__tokenizer_bpe(t, buf, n, LOOM__BPE_ARRAY, a);
            assert_int_equal(na, nr);
            assert_memory_equal(a, r, nr * sizeof(*r));
        }
        for (k = 0; k < nr; k++)
            assert_true(r[k] != UINT32_MAX);
    }
}

/* One piece of a megabyte (letters, spaces, digits, CJK): the heap merge
 * and the regex cope, and decoding gives the text back. */
static void test_long_pieces(void **state)
{
    static const char *const fills[] = {"a", " ", "7", "ab", "\t",
                                        "\xe6\x97\xa5", "!"};
    size_t len = 1 << 20, i, k;
    char *text = malloc(len + 4);
    loom_buf out = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);

    (void)state;
    assert_non_null(text);
    for (k = 0; k < sizeof(fills) / sizeof(fills[0]); k++) {
        size_t fl = strlen(fills[k]);
        uint32_t *ids = NULL;
        size_t n = 0;
        for (i = 0; i + fl <= len; i += fl)
            memcpy(text + i, fills[k], fl);
        assert_int_equal(loom_tokenizer_encode(enc[k & 1], text, i, 0, &ids,
                                               &n), 0);
        assert_true(n > 0 && n < i);
        assert_int_equal(loom_tokenizer_count(enc[k & 1], text, i), n);
        loom_buf_clear(&out);
        assert_int_equal(loom_tokenizer_decode(enc[k & 1], ids, n, &out), 0);
        assert_int_equal(out.len, i);
        assert_memory_equal(out.ptr, text, i);
        free(ids);
    }
    free(text);
    loom_buf_free(&out);
}

/* ---------------------------------------------------------------------
 * Limits and argument errors
 */

static void test_limits(void **state)
{
    static const uint32_t hello[] = {13225, 2375};
    static const uint32_t bad[] = {13225, 199998};
    loom_buf small = LOOM_BUF_INIT(8);
    uint32_t *ids = NULL;
    size_t n = 0;
    char c = 'x';

    (void)state;
    /* past the input limit: refused before the text is read */
    assert_int_equal(loom_tokenizer_count(enc[0], &c,
                                          LOOM_TOKENIZER_MAX_INPUT + 1),
                     (size_t)-1);
    assert_int_equal(loom_tokenizer_encode(enc[0], &c,
                                           LOOM_TOKENIZER_MAX_INPUT + 1, 0,
                                           &ids, &n), LOOM_ETOOLARGE);
    assert_null(ids);
    assert_int_equal(loom_tokenizer_encode(NULL, "a", 1, 0, &ids, &n),
                     LOOM_EINVALID);
    assert_int_equal(loom_tokenizer_count(NULL, "a", 1), (size_t)-1);
    /* "Hello world" is 11 bytes: over an 8-byte buffer, which stays as
     * it was; an unknown id leaves it unchanged too */
    assert_int_equal(loom_tokenizer_decode(enc[0], hello, 2, &small),
                     LOOM_ETOOLARGE);
    assert_int_equal(small.len, 0);
    assert_int_equal(loom_tokenizer_decode(enc[0], hello, 1, &small), 0);
    assert_string_equal(small.ptr, "Hello");
    assert_int_equal(loom_tokenizer_decode(enc[0], bad, 2, &small),
                     LOOM_EINVALID);
    assert_string_equal(small.ptr, "Hello");
    assert_non_null(strstr(loom_error_last(), "199998"));
    loom_buf_free(&small);
}

/* ---------------------------------------------------------------------
 * Vocabulary files
 */

static char *tmp_dir(const char *name)
{
    char *d = test_tmp_path(name);
    assert_non_null(d);
    assert_int_equal(test_mkdir_p(d), 0);
    return d;
}

static char *path_in(const char *dir, const char *file)
{
    char *p = NULL;
    assert_true(asprintf(&p, "%s/%s", dir, file) > 0);
    return p;
}

static void write_text(const char *dir, const char *file, const char *text)
{
    char *p = path_in(dir, file);
    assert_int_equal(test_write_file(p, text, strlen(text)), 0);
    free(p);
}

static void b64(const uint8_t *p, size_t n, char *out)
{
    static const char al[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t i, o = 0;

    for (i = 0; i + 2 < n; i += 3) {
        uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
        out[o++] = al[v >> 18];
        out[o++] = al[v >> 12 & 63];
        out[o++] = al[v >> 6 & 63];
        out[o++] = al[v & 63];
    }
    if (n - i == 1) {
        out[o++] = al[p[i] >> 2];
        out[o++] = al[(p[i] & 3) << 4];
        out[o++] = '=';
        out[o++] = '=';
    } else if (n - i == 2) {
        uint32_t v = (uint32_t)p[i] << 8 | p[i + 1];
        out[o++] = al[v >> 10];
        out[o++] = al[v >> 4 & 63];
        out[o++] = al[(v & 15) << 2];
        out[o++] = '=';
    }
    out[o] = '\0';
}

/* The tiny vocabulary: every byte at its own value, then extra tokens
 * from 256 on, then `tail` lines. */
static loom_buf tiny_ranks(const char *const *extra, const char *tail)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    char line[2200];
    uint8_t byte;
    int i;

    for (i = 0; i < 256; i++) {
        byte = (uint8_t)i;
        b64(&byte, 1, line);
        assert_int_equal(loom_buf_printf(&b, "%s %d\n", line, i), 0);
    }
    for (i = 0; extra && extra[i]; i++) {
        b64((const uint8_t *)extra[i], strlen(extra[i]), line);
        assert_int_equal(loom_buf_printf(&b, "%s %d\n", line, 256 + i), 0);
    }
    if (tail)
        assert_int_equal(loom_buf_puts(&b, tail), 0);
    return b;
}

/* ranks 256..261 */
static const char *const tiny_extra[] = {"ab", "bc", "abc", "aa",
                                         "\xc3\xa9", "\xc3\xa9y", NULL};

static void write_tiny(const char *dir, const char *name, const char *tail,
                       const char *meta)
{
    loom_buf b = tiny_ranks(tiny_extra, tail);
    char file[128];
    char *p;

    snprintf(file, sizeof(file), "%s.tiktoken", name);
    p = path_in(dir, file);
    assert_int_equal(test_write_file(p, b.ptr, b.len), 0);
    free(p);
    loom_buf_free(&b);
    if (meta) {
        snprintf(file, sizeof(file), "%s.meta.json", name);
        write_text(dir, file, meta);
    }
}

#define TINY_META(classes)                                                 \
    "{\"format\":1,\"encoding\":\"tiny\",\"pattern\":"                     \
    "\"\\\\p{L}+|\\\\p{N}+|[^\\\\p{L}\\\\p{N}]+\",\"special_tokens\":"     \
    "{\"<|end|>\":300}" classes "}"

static void expect_load_error(const char *dir, const char *name, int code,
                              const char *msg)
{
    loom_tokenizer *t = NULL;
    char file[128], *p;

    snprintf(file, sizeof(file), "%s.tiktoken", name);
    p = path_in(dir, file);
    assert_int_equal(loom_tokenizer_load(&t, p), code);
    assert_null(t);
    if (!strstr(loom_error_last(), msg))
        fail_msg("%s: \"%s\" lacks \"%s\"", name, loom_error_last(), msg);
    free(p);
}

static void test_tiny_vocab(void **state)
{
    char *dir = tmp_dir("tiny-vocab");
    loom_tokenizer *t = NULL;
    char *p;
    static const uint32_t abcd[] = {258, 'd'};
    static const uint32_t aaa[] = {259, 'a'};
    static const uint32_t special[] = {256, 300, 257};
    static const uint32_t e_other[] = {'x', 260, 'y'};
    static const uint32_t e_letter[] = {'x', 261};

    (void)state;
    write_tiny(dir, "tiny", NULL, TINY_META(",\"classes\":\"80:-\""));
    p = path_in(dir, "tiny.tiktoken");
    assert_int_equal(loom_tokenizer_load(&t, p), 0);
    assert_string_equal(loom_tokenizer_name(t), "tiny");
    /* abcd: ab (256) before bc (257); then ab+c = abc (258); no abcd */
    expect_ids(t, "abcd", 4, 0, abcd, 2);
    /* aaa: both pairs are aa (259); the leftmost merges */
    expect_ids(t, "aaa", 3, 0, aaa, 2);
    expect_ids(t, "ab<|end|>bc", 11, 1, special, 3);
    /* as text: ab, <|, e n d, |>, bc */
    assert_int_equal(loom_tokenizer_count(t, "ab<|end|>bc", 11), 9);
    /* every non-ASCII code point is "other" here: x, \xc3\xa9 (260), y */
    expect_ids(t, "x\xc3\xa9y", 4, 0, e_other, 3);
    loom_tokenizer_free(t);
    /* the same with every one a letter (Lo): one piece x\xc3\xa9y, whose
     * merges give x and \xc3\xa9y (261) */
    write_tiny(dir, "tiny", NULL, TINY_META(",\"classes\":\"80:o\""));
    assert_int_equal(loom_tokenizer_load(&t, p), 0);
    expect_ids(t, "x\xc3\xa9y", 4, 0, e_letter, 2);
    loom_tokenizer_free(t);
    free(p);
    free(dir);
}

static void test_vocab_errors(void **state)
{
    char *dir = tmp_dir("bad-vocab");
    char meta[700];
    char *p;
    loom_buf b;
    int i;

    (void)state;
#define META TINY_META("")
    write_tiny(dir, "badb64", "@@@@ 300\n", META);
    expect_load_error(dir, "badb64", LOOM_EPROTO, "bad base64");
    write_tiny(dir, "badrank", "YWJj x\n", META);
    expect_load_error(dir, "badrank", LOOM_EPROTO, "bad rank");
    write_tiny(dir, "negrank", "YWJj -1\n", META);
    expect_load_error(dir, "negrank", LOOM_EPROTO, "bad rank");
    write_tiny(dir, "noline", "YWJj\n", META);
    expect_load_error(dir, "noline", LOOM_EPROTO, "BASE64 RANK");
    write_tiny(dir, "duprank", "eHl6 256\n", META);
    expect_load_error(dir, "duprank", LOOM_EPROTO, "rank 256 appears twice");
    write_tiny(dir, "duptok", "YWI= 400\n", META);
    expect_load_error(dir, "duptok", LOOM_EPROTO, "appears twice");
    /* a rank at the limit of 2^24 ids */
    write_tiny(dir, "bigrank", "eHl6 16777216\n", META);
    expect_load_error(dir, "bigrank", LOOM_ETOOLARGE, "limit");
    write_tiny(dir, "okrank", "eHl6 16777215\n", META);
    {
        loom_tokenizer *t = NULL;
        p = path_in(dir, "okrank.tiktoken");
        assert_int_equal(loom_tokenizer_load(&t, p), 0);
        loom_tokenizer_free(t);
        free(p);
    }
    /* a token of 1025 bytes (1024 is the most) */
    {
        char *line = malloc(2000), *tail = malloc(2100);
        uint8_t tok[1025];
        memset(tok, 'q', sizeof(tok));
        b64(tok, sizeof(tok), line);
        snprintf(tail, 2100, "%s 400\n", line);
        write_tiny(dir, "longtok", tail, META);
        expect_load_error(dir, "longtok", LOOM_ETOOLARGE, "1024 bytes");
        b64(tok, 1024, line);
        snprintf(tail, 2100, "%s 400\n", line);
        write_tiny(dir, "oktok", tail, META);
        loom_tokenizer *t = NULL;
        p = path_in(dir, "oktok.tiktoken");
        assert_int_equal(loom_tokenizer_load(&t, p), 0);
        assert_int_equal(loom_tokenizer_count(t, (const char *)tok, 1024),
                         1);
        loom_tokenizer_free(t);
        free(p);
        free(line);
        free(tail);
    }
    /* a missing byte */
    b = tiny_ranks(NULL, NULL);
    {
        const char *cut = strstr(b.ptr, "QQ== 65\n");
        assert_non_null(cut);
        memmove((char *)cut, cut + 8, strlen(cut + 8) + 1);
        b.len -= 8;
        p = path_in(dir, "nobyte.tiktoken");
        assert_int_equal(test_write_file(p, b.ptr, b.len), 0);
        free(p);
        write_text(dir, "nobyte.meta.json", META);
        expect_load_error(dir, "nobyte", LOOM_EPROTO, "byte 0x41");
    }
    loom_buf_free(&b);
    /* files over their limits (sparse) */
    {
        FILE *f;
        p = path_in(dir, "huge.tiktoken");
        f = fopen(p, "w");
        assert_non_null(f);
        assert_int_equal(ftruncate(fileno(f), (off_t)LOOM__VOCAB_MAX_FILE + 1),
                         0);
        fclose(f);
        expect_load_error(dir, "huge", LOOM_ETOOLARGE, "limit");
        free(p);
        write_tiny(dir, "hugemeta", NULL, NULL);
        p = path_in(dir, "hugemeta.meta.json");
        f = fopen(p, "w");
        assert_non_null(f);
        assert_int_equal(ftruncate(fileno(f), (off_t)LOOM__VOCAB_MAX_META + 1),
                         0);
        fclose(f);
        expect_load_error(dir, "hugemeta", LOOM_ETOOLARGE, "limit");
        free(p);
    }
    /* meta.json problems */
    write_tiny(dir, "badmeta", NULL, "{\"format\":2}");
    expect_load_error(dir, "badmeta", LOOM_EPROTO, "format 1");
    write_tiny(dir, "notjson", NULL, "{nope");
    expect_load_error(dir, "notjson", LOOM_EPROTO, "notjson.meta.json");
    write_tiny(dir, "badpat", NULL, "{\"format\":1,\"pattern\":\"(\","
               "\"special_tokens\":{}}");
    expect_load_error(dir, "badpat", LOOM_EPROTO, "pattern at offset");
    write_tiny(dir, "spaceprop", NULL, "{\"format\":1,\"pattern\":\"\\\\s+\","
               "\"special_tokens\":{},\"classes\":\"80:-\"}");
    expect_load_error(dir, "spaceprop", LOOM_EPROTO, "\\s");
    write_tiny(dir, "otherprop", NULL, "{\"format\":1,\"pattern\":"
               "\"\\\\p{Han}+\",\"special_tokens\":{},\"classes\":\"80:-\"}");
    expect_load_error(dir, "otherprop", LOOM_EPROTO, "property");
    write_tiny(dir, "badclass", NULL, TINY_META(",\"classes\":\"90:-\""));
    expect_load_error(dir, "badclass", LOOM_EPROTO, "classes");
    write_tiny(dir, "badclass2", NULL,
               TINY_META(",\"classes\":\"80:-,70:o\""));
    expect_load_error(dir, "badclass2", LOOM_EPROTO, "classes");
    write_tiny(dir, "badclass3", NULL, TINY_META(",\"classes\":\"80:Z\""));
    expect_load_error(dir, "badclass3", LOOM_EPROTO, "classes");
    /* no 4-byte titlecase letter exists to stand for one */
    write_tiny(dir, "nort", NULL,
               TINY_META(",\"classes\":\"80:-,10000:t,10001:-\""));
    expect_load_error(dir, "nort", LOOM_EPROTO, "representative");
    write_tiny(dir, "takenid", NULL, "{\"format\":1,\"pattern\":\"a\","
               "\"special_tokens\":{\"<|x|>\":65}}");
    expect_load_error(dir, "takenid", LOOM_EPROTO, "taken id");
    /* special tokens: 256 at most, of 256 bytes at most */
    b = (loom_buf)LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    assert_int_equal(loom_buf_puts(&b, "{\"format\":1,\"pattern\":\"a\","
                                       "\"special_tokens\":{"), 0);
    for (i = 0; i < 257; i++)
        assert_int_equal(loom_buf_printf(&b, "%s\"<|s%d|>\":%d", i ? "," : "",
                                         i, 1000 + i), 0);
    assert_int_equal(loom_buf_puts(&b, "}}"), 0);
    write_tiny(dir, "manyspecial", NULL, b.ptr);
    expect_load_error(dir, "manyspecial", LOOM_ETOOLARGE, "256");
    loom_buf_free(&b);
    {
        char name[300];
        memset(name, 'x', 257);
        name[257] = '\0';
        snprintf(meta, sizeof(meta), "{\"format\":1,\"pattern\":\"a\","
                 "\"special_tokens\":{\"%s\":999}}", name);
        write_tiny(dir, "longspecial", NULL, meta);
        expect_load_error(dir, "longspecial", LOOM_ETOOLARGE, "256");
    }
    /* a pattern over 64 KiB */
    b = (loom_buf)LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    assert_int_equal(loom_buf_puts(&b, "{\"format\":1,\"special_tokens\":{},"
                                       "\"pattern\":\""), 0);
    for (i = 0; i < 65537; i++)
        assert_int_equal(loom_buf_putc(&b, 'a'), 0);
    assert_int_equal(loom_buf_puts(&b, "\"}"), 0);
    write_tiny(dir, "longpat", NULL, b.ptr);
    expect_load_error(dir, "longpat", LOOM_ETOOLARGE, "pattern over");
    loom_buf_free(&b);
    /* no meta.json and neither name nor size of a known encoding */
    write_tiny(dir, "nometa", NULL, NULL);
    expect_load_error(dir, "nometa", LOOM_EPROTO, ".meta.json");
    write_text(dir, "empty.tiktoken", "\n\n");
    expect_load_error(dir, "empty", LOOM_EPROTO, "no tokens");
    expect_load_error(dir, "absent", LOOM_ENOTFOUND, "absent.tiktoken");
#undef META
    free(dir);
}

/* A bare rank file: the built-in pattern and special tokens of the
 * encoding its name (or else its size) says. */
static void test_builtin_fallback(void **state)
{
    static const uint32_t hello[] = {13225, 2375};
    static const uint32_t eot[] = {199999};
    char *dir = tmp_dir("bare-vocab");
    size_t len;
    char *ranks = test_read_file(VOCAB_DIR "/o200k_base.tiktoken", &len);
    char *p;
    loom_tokenizer *t = NULL;

    (void)state;
    assert_non_null(ranks);
    for (int k = 0; k < 2; k++) {
        p = path_in(dir, k ? "renamed.tiktoken" : "o200k_base.tiktoken");
        assert_int_equal(test_write_file(p, ranks, len), 0);
        assert_int_equal(loom_tokenizer_load(&t, p), 0);
        assert_string_equal(loom_tokenizer_name(t), "o200k_base");
        expect_ids(t, "Hello world", 11, 0, hello, 2);
        expect_ids(t, "<|endoftext|>", 13, 1, eot, 1);
        /* the known texts of Unicode 14 and before come out the same */
        for (size_t i = 0; i < 6; i++)
            expect_ids(t, known[i].text, strlen(known[i].text), 0,
                       known[i].ids, known[i].n);
        loom_tokenizer_free(t);
        free(p);
    }
    free(ranks);
    free(dir);
}

/* ---------------------------------------------------------------------
 * Finding vocabularies, the shared instances, the fallback
 */

static void test_vocab_dirs(void **state)
{
    loom_buf dirs = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    char exe[PATH_MAX], src[PATH_MAX], parent[PATH_MAX + 8];
    ssize_t n;
    loom_tokenizer *t = NULL;

    (void)state;
    unsetenv("LOOM_VOCAB_DIR");
    assert_int_equal(loom__tokenizer_vocab_dirs(&dirs), 0);
    assert_non_null(strstr(dirs.ptr, LOOM_VOCAB_SYSTEM_DIR));
    /* built under the source tree: its vocab/data is found from the
     * executable's place */
    n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    assert_true(n > 0);
    exe[n] = '\0';
    *strrchr(exe, '/') = '\0';
    snprintf(parent, sizeof(parent), "%s/..", exe);
    if (realpath(parent, exe) && realpath(LOOM_SOURCE_DIR, src) &&
        !strcmp(exe, src)) {
        char want[PATH_MAX + 16];
        snprintf(want, sizeof(want), "%s/vocab/data", src);
        assert_non_null(strstr(dirs.ptr, want));
        assert_int_equal(loom_tokenizer_load(&t, "cl100k_base"), 0);
        loom_tokenizer_free(t);
    }
    loom_buf_free(&dirs);
    setenv("LOOM_VOCAB_DIR", VOCAB_DIR, 1);
    assert_int_equal(loom_tokenizer_load(&t, "./no/such.tiktoken"),
                     LOOM_ENOTFOUND);
    assert_int_equal(loom_tokenizer_load(&t, "foo"), LOOM_ENOTFOUND);
    assert_non_null(strstr(loom_error_last(), "unknown encoding 'foo' "
                                              "(known: o200k_base, "
                                              "cl100k_base)"));
    assert_null(strstr(loom_error_last(), "no vocabulary"));
    assert_int_equal(loom_tokenizer_load(&t, ".hidden"), LOOM_EINVALID);
    assert_int_equal(loom_tokenizer_load(&t, ""), LOOM_EINVALID);
    assert_int_equal(loom_tokenizer_load(&t, NULL), LOOM_EINVALID);
}

static int count_lines(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p++)
        n++;
    return n;
}

/* No vocabulary: a clear error naming scripts/vocab.sh, logged once by
 * the shared loader; counters then estimate from length, and correct. */
static void test_missing_vocab(void **state)
{
    char *empty = tmp_dir("no-vocab");
    char *logbuf = NULL;
    size_t loglen = 0;
    FILE *log = open_memstream(&logbuf, &loglen);
    loom_tokenizer *t = NULL;
    loom_token_counter *c = NULL;
    const char text[] = "Hello world, this is a sentence of some length.";
    char *big = malloc(4001);
    size_t k;

    (void)state;
    assert_non_null(log);
    setenv("LOOM_VOCAB_DIR", empty, 1);
    assert_int_equal(loom_tokenizer_load(&t, "o200k_base"), LOOM_ENOTFOUND);
    assert_non_null(strstr(loom_error_last(), "scripts/vocab.sh"));
    assert_non_null(strstr(loom_error_last(), empty));
    loom__tokenizer_shared_reset();
    loom__token_counter_reset();
    loom_log_set(log, LOOM_LOG_WARN, LOOM_LOG_TEXT);
    assert_null(loom_tokenizer_shared("o200k_base"));
    assert_null(loom_tokenizer_shared("o200k_base"));
    assert_int_equal(loom_token_counter_for_model(&c, "openai/gpt-4o"), 0);
    assert_false(loom_token_counter_is_exact(c));
    assert_string_equal(loom_token_counter_method(c), "estimate:length");
    k = loom_token_counter_text(c, text, strlen(text));
    assert_int_equal(k, loom__token_estimate_length(text, strlen(text)));
    /* the estimate corrects towards what the provider reports: 4000
     * bytes estimate at 1000 tokens, reported as 1300 */
    assert_non_null(big);
    memset(big, 'a', 4000);
    assert_int_equal(loom__token_estimate_length(big, 4000), 1000);
    for (int i = 0; i < 60; i++)
        loom_token_counter_observe(c, loom_token_counter_text(c, big, 4000),
                                   1300);
    assert_true(fabs(loom_token_counter_factor(c) - 1.3) < 0.005);
    free(big);
    assert_true(loom_token_counter_text(c, text, strlen(text)) > k);
    loom_token_counter_free(c);
    fflush(log);
    loom_log_set(NULL, LOOM_LOG_OFF, LOOM_LOG_TEXT);
    fclose(log);
    assert_int_equal(count_lines(logbuf, "scripts/vocab.sh"), 1);
    assert_non_null(strstr(logbuf, "estimated"));
    free(logbuf);
    loom__tokenizer_shared_reset();
    loom__token_counter_reset();
    setenv("LOOM_VOCAB_DIR", VOCAB_DIR, 1);
    free(empty);
}

static void *shared_thread(void *arg)
{
    (void)arg;
    return (void *)loom_tokenizer_shared("cl100k_base");
}

static void test_shared(void **state)
{
    pthread_t th[4];
    void *got[4];
    int i;

    (void)state;
    loom__tokenizer_shared_reset();
    for (i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, shared_thread, NULL),
                         0);
    for (i = 0; i < 4; i++)
        assert_int_equal(pthread_join(th[i], &got[i]), 0);
    assert_non_null(got[0]);
    for (i = 1; i < 4; i++)
        assert_ptr_equal(got[i], got[0]);
    assert_ptr_equal(loom_tokenizer_shared("cl100k_base"), got[0]);
    assert_ptr_not_equal(loom_tokenizer_shared("o200k_base"), got[0]);
    assert_null(loom_tokenizer_shared("bad/name"));
}

/* ---------------------------------------------------------------------
 * The per-model counter
 */

static void test_model_mapping(void **state)
{
    static const struct {
        const char *model, *method;
    } cases[] = {
        {"openai/gpt-4o", "o200k_base"}, {"gpt-4o-mini", "o200k_base"},
        {"GPT-4O", "o200k_base"}, {"gpt-4.1-nano", "o200k_base"},
        {"gpt-4.5-preview", "o200k_base"}, {"gpt-5", "o200k_base"},
        {"gpt-5-mini", "o200k_base"}, {"chatgpt-4o-latest", "o200k_base"},
        {"o1", "o200k_base"}, {"o1-preview", "o200k_base"},
        {"o3-mini", "o200k_base"}, {"o4-mini", "o200k_base"},
        {"azure/gpt-4", "cl100k_base"}, {"gpt-4-turbo", "cl100k_base"},
        {"gpt-4-0613", "cl100k_base"}, {"gpt-3.5-turbo", "cl100k_base"},
        {"gpt-35-turbo", "cl100k_base"},
        {"text-embedding-3-small", "cl100k_base"},
        {"text-embedding-ada-002", "cl100k_base"},
        {"anthropic/claude-sonnet-4-5", "estimate:o200k_base"},
        {"gemini/gemini-2.5-flash", "estimate:o200k_base"},
        {"o10", "estimate:o200k_base"}, {"gpt-oss-20b", "estimate:o200k_base"},
        {"llama-3.1-8b", "estimate:o200k_base"},
    };
    loom_token_counter *c = NULL;

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(loom_token_counter_for_model(&c, cases[i].model), 0);
        if (strcmp(loom_token_counter_method(c), cases[i].method))
            fail_msg("%s: %s, want %s", cases[i].model,
                     loom_token_counter_method(c), cases[i].method);
        assert_int_equal(loom_token_counter_is_exact(c),
                         strncmp(cases[i].method, "estimate", 8) != 0);
        loom_token_counter_free(c);
    }
    assert_int_equal(loom_token_counter_for_model(&c, ""), LOOM_EINVALID);
    assert_int_equal(loom_token_counter_for_model(&c, "openai/"),
                     LOOM_EINVALID);
    assert_int_equal(loom_token_counter_for_model(&c, NULL), LOOM_EINVALID);
    loom_token_counter_free(NULL);
}

static size_t count0(const char *s)
{
    return loom_tokenizer_count(enc[0], s, strlen(s));
}

static void test_message_accounting(void **state)
{
    loom_token_counter *c = NULL, *cl = NULL;
    loom_message m[3];
    loom_tool_call call = {"call_1", "get_weather", "{\"city\":\"Paris\"}"};
    size_t want;

    (void)state;
    memset(m, 0, sizeof(m));
    m[0].role = LOOM_ROLE_SYSTEM;
    m[0].content = "You are a helpful assistant.";
    m[1].role = LOOM_ROLE_USER;
    m[1].content = "Hello world";
    m[2].role = LOOM_ROLE_ASSISTANT;
    m[2].tool_calls = &call;
    m[2].tool_calls_len = 1;
    m[2].reasoning = "thinking hard";
    assert_int_equal(loom_token_counter_for_model(&c, "openai/gpt-4o"), 0);
    assert_true(loom_token_counter_is_exact(c));
    /* 3 per message, the role, the content: "user" is 1, "Hello world" 2 */
    assert_int_equal(loom_token_counter_message(c, &m[1]), 3 + 1 + 2);
    assert_int_equal(loom_token_counter_message(c, &m[0]),
                     3 + count0("system") + count0(m[0].content));
    /* a call: 3 more, its name and arguments; no reasoning for OpenAI */
    assert_int_equal(loom_token_counter_message(c, &m[2]),
                     3 + count0("assistant") + 3 + count0("get_weather") +
                     count0(call.arguments));
    /* a name: its tokens and 1 */
    m[1].name = "bob";
    assert_int_equal(loom_token_counter_message(c, &m[1]),
                     3 + 1 + 2 + count0("bob") + 1);
    m[1].name = NULL;
    /* the request: every message and 3 to prime the reply */
    want = 0;
    for (int i = 0; i < 3; i++)
        want += loom_token_counter_message(c, &m[i]);
    assert_int_equal(loom_token_counter_request(c, m, 3, NULL, 0), want + 3);
    assert_int_equal(loom_token_counter_text(c, "Hello world", 11), 2);
    /* cl100k_base counts differently for gpt-4 */
    assert_int_equal(loom_token_counter_for_model(&cl, "gpt-4"), 0);
    assert_int_equal(loom_token_counter_text(cl, "1234567", 7),
                     loom_tokenizer_count(enc[1], "1234567", 7));
    assert_true(loom_token_counter_factor(c) == 1.0);
    loom_token_counter_observe(c, 1000, 5000); /* exact: no-op */
    assert_true(loom_token_counter_factor(c) == 1.0);
    assert_int_equal(loom_token_counter_message(NULL, &m[0]), 0);
    loom_token_counter_free(cl);
    loom_token_counter_free(c);
}

/* The memo's count is the plain count, however the messages change
 * between calls: appended, changed in place, replaced, fewer, another
 * counter. */
static void test_request_memo(void **state)
{
    loom_token_counter *c = NULL, *g = NULL;
    loom__token_memo memo = {0};
    loom_message m[4];
    loom_tool_call call = {"call_1", "get_weather", "{\"city\":\"Paris\"}"};
    char text[] = "Hello world, how are you?";

    (void)state;
    memset(m, 0, sizeof(m));
    m[0].role = LOOM_ROLE_SYSTEM;
    m[0].content = "You are a helpful assistant.";
    m[1].role = LOOM_ROLE_USER;
    m[1].content = text;
    m[2].role = LOOM_ROLE_ASSISTANT;
    m[2].tool_calls = &call;
    m[2].tool_calls_len = 1;
    m[2].reasoning = "thinking hard";
    m[3].role = LOOM_ROLE_TOOL;
    m[3].name = "get_weather";
    m[3].content = "sunny and warm in Paris today";
    assert_int_equal(loom_token_counter_for_model(&c, "claude-sonnet-4"), 0);
    assert_int_equal(loom_token_counter_for_model(&g, "openai/gpt-4o"), 0);
#define SAME(ctr, n)                                                           \
    assert_int_equal(                                                          \
        loom__token_counter_request_memo(ctr, &memo, m, n, 40, 1),             \
        loom__token_counter_request_raw(ctr, m, n, 40, 1))
    for (size_t n = 1; n <= 4; n++)
        SAME(c, n);
    SAME(c, 4); /* all from the memo */
    memcpy(text, "Goodbye, cruel world now!", sizeof(text)); /* in place */
    SAME(c, 4);
    m[3].content = "rain, and much colder than expected"; /* replaced */
    SAME(c, 4);
    call.arguments = "{\"city\":\"London, England\"}";
    SAME(c, 4);
    m[2].reasoning = NULL;
    SAME(c, 4);
    SAME(c, 2); /* fewer */
    SAME(c, 4);
    SAME(g, 4);                 /* another counter: counted anew */
    m[0].role = LOOM_ROLE_USER; /* no system message: no tools adjustment */
    SAME(g, 4);
    SAME(c, 4);
#undef SAME
    loom__token_memo_free(&memo);
    loom_token_counter_free(g);
    loom_token_counter_free(c);
}

/* The counts kept process-wide (role names, system prompts) are the
 * plain counts, per encoding: a second counter of the same model reads
 * them, one of another encoding counts its own. */
static void test_shared_counts(void **state)
{
    /* "Привет, как дела?" */
    char prompt[] = "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82, "
                    "\xd0\xba\xd0\xb0\xd0\xba \xd0\xb4\xd0\xb5\xd0\xbb"
                    "\xd0\xb0?";
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    loom_token_counter *c[3] = {NULL, NULL, NULL};
    const char *models[3] = {"openai/gpt-4o", "gpt-4o-mini", "gpt-4"};
    loom_message m;
    size_t want, n = strlen(prompt);

    (void)state;
    /* the test tells the encodings apart */
    assert_int_not_equal(loom_tokenizer_count(enc[0], prompt, n),
                         loom_tokenizer_count(enc[1], prompt, n));
    memset(&m, 0, sizeof(m));
    m.content = prompt;
    for (int i = 0; i < 3; i++) {
        const loom_tokenizer *t = i < 2 ? enc[0] : enc[1];
        assert_int_equal(loom_token_counter_for_model(&c[i], models[i]), 0);
        for (int r = 0; r < 4; r++) {
            m.role = (loom_role)r;
            want = 3 + loom_tokenizer_count(t, roles[r], strlen(roles[r])) +
                   loom_tokenizer_count(t, prompt, n);
            assert_int_equal(loom_token_counter_message(c[i], &m), want);
            assert_int_equal(loom_token_counter_message(c[i], &m), want);
        }
    }
    for (int i = 0; i < 3; i++)
        loom_token_counter_free(c[i]);
}

static void test_tool_accounting(void **state)
{
    json_error_t jerr;
    json_t *params = json_loads(
        "{\"type\":\"object\",\"properties\":{"
        "\"city\":{\"type\":\"string\",\"description\":\"City name\"},"
        "\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]},"
        "\"days\":{\"type\":\"integer\"},"
        "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
        "\"opts\":{\"type\":\"object\",\"properties\":{"
        "\"deep\":{\"type\":\"boolean\",\"description\":\"Deep?\"}}}},"
        "\"required\":[\"city\"]}", 0, &jerr);
    static const char rendered[] =
        "namespace functions {\n\n"
        "// Get the weather\n"
        "type get_weather = (_: {\n"
        "// City name\n"
        "city: string,\n"
        "unit?: \"c\" | \"f\",\n"
        "days?: number,\n"
        "tags?: string[],\n"
        "opts?: {\n"
        "  deep?: boolean,\n"
        "},\n"
        "}) => any;\n\n"
        "type now = () => any;\n\n"
        "} // namespace functions";
    loom_tool_def tools[2] = {{"get_weather", "Get the weather", NULL},
                              {"now", NULL, NULL}};
    loom_message sys;
    loom_token_counter *c = NULL, *a = NULL;
    json_t *deep;
    size_t k;

    (void)state;
    assert_non_null(params);
    tools[0].parameters = params;
    assert_int_equal(loom_token_counter_for_model(&c, "gpt-4o"), 0);
    assert_int_equal(loom_token_counter_tools(c, tools, 2),
                     count0(rendered) + 9);
    assert_int_equal(loom_token_counter_tools(c, tools, 0), 0);
    /* with a system message, 4 less */
    memset(&sys, 0, sizeof(sys));
    sys.role = LOOM_ROLE_SYSTEM;
    sys.content = "Be brief.";
    assert_int_equal(loom_token_counter_request(c, &sys, 1, tools, 2),
                     loom_token_counter_message(c, &sys) + 3 +
                     count0(rendered) + 9 - 4);
    /* Anthropic: scaled by its factor, plus its tool-use system prompt */
    assert_int_equal(loom_token_counter_for_model(&a, "claude-opus-4-1"), 0);
    k = loom_token_counter_tools(a, tools, 2);
    assert_int_equal(k, (size_t)llround(1.2 * (double)(count0(rendered) + 9))
                        + 346);
    /* a schema nested past the depth limit renders (as any), no crash */
    deep = json_pack("{s:s}", "type", "string");
    for (int i = 0; i < 40; i++)
        deep = json_pack("{s:s,s:{s:o}}", "type", "object", "properties",
                         "x", deep);
    tools[1].parameters = deep;
    assert_true(loom_token_counter_tools(c, tools, 2) > count0(rendered));
    /* counts kept of rendered tools: more sets than are kept, each
     * counted as its text is, then the first again */
    for (int i = 0; i < 40; i++) {
        char name[48], text[160];
        loom_tool_def one = {name, "Does a thing", NULL};
        snprintf(name, sizeof(name), "tool_%d%s", i % 20,
                 i % 3 ? "_with_a_longer_name" : "");
        snprintf(text, sizeof(text),
                 "namespace functions {\n\n// Does a thing\ntype %s = () "
                 "=> any;\n\n} // namespace functions",
                 name);
        assert_int_equal(loom_token_counter_tools(c, &one, 1),
                         count0(text) + 9);
    }
    tools[1].parameters = NULL;
    assert_int_equal(loom_token_counter_tools(c, tools, 2),
                     count0(rendered) + 9);
    json_decref(deep);
    json_decref(params);
    loom_token_counter_free(a);
    loom_token_counter_free(c);
}

static void test_correction(void **state)
{
    loom_token_counter *a = NULL, *b = NULL, *g = NULL;
    char text[4600];
    size_t base;
    double f;

    (void)state;
    /* long enough (about 1000 tokens) that rounding does not matter */
    text[0] = '\0';
    for (int i = 0; i < 100; i++)
        strcat(text, "The quick brown fox jumps over the lazy dog. ");
    base = count0(text);
    assert_true(base > 900);
    loom__token_counter_reset();
    assert_int_equal(loom_token_counter_for_model(&a, "anthropic/claude-x"),
                     0);
    assert_int_equal(loom_token_counter_for_model(&b, "claude-x"), 0);
    assert_int_equal(loom_token_counter_for_model(&g, "gemini-2.5-pro"), 0);
    assert_false(loom_token_counter_is_exact(a));
    /* priors: 1.2 for Claude, 1.0 for Gemini */
    assert_true(fabs(loom_token_counter_factor(a) - 1.2) < 1e-9);
    assert_true(fabs(loom_token_counter_factor(g) - 1.0) < 1e-9);
    assert_int_equal(loom_token_counter_text(a, text, strlen(text)),
                     (size_t)llround(1.2 * (double)base));
    /* one step: 30% of the way, in log space */
    loom_token_counter_observe(a, 1000, 1500);
    f = 1.2 * pow(1.5, 0.3);
    assert_true(fabs(loom_token_counter_factor(a) - f) < 1e-9);
    /* the same model id shares the factor; another model does not */
    assert_true(fabs(loom_token_counter_factor(b) - f) < 1e-9);
    assert_true(fabs(loom_token_counter_factor(g) - 1.0) < 1e-9);
    /* ignored: estimates under 32 tokens, a report of 0 */
    loom_token_counter_observe(a, 31, 1000);
    loom_token_counter_observe(a, 1000, 0);
    assert_true(fabs(loom_token_counter_factor(a) - f) < 1e-9);
    /* converges on reported / estimated at a steady ratio */
    for (int i = 0; i < 60; i++)
        loom_token_counter_observe(a, loom_token_counter_text(a, text,
                                                              strlen(text)),
                                   base * 2);
    assert_true(fabs(loom_token_counter_factor(a) - 2.0) < 0.005);
    /* a wild ratio moves it at most 4^0.3 per step */
    f = loom_token_counter_factor(a);
    loom_token_counter_observe(a, 100, 100000);
    assert_true(fabs(loom_token_counter_factor(a) - f * pow(4.0, 0.3)) <
                1e-9);
    /* and the factor stays within [0.1, 10] */
    for (int i = 0; i < 100; i++)
        loom_token_counter_observe(a, 100, 1);
    assert_true(fabs(loom_token_counter_factor(a) - 0.1) < 1e-9);
    loom_token_counter_free(a);
    loom_token_counter_free(b);
    loom_token_counter_free(g);
    loom__token_counter_reset();
}

static void *observe_thread(void *arg)
{
    loom_token_counter *c = arg;

    /* up by 1.5 and back down, 2000 times: the steps cancel exactly */
    for (int i = 0; i < 2000; i++) {
        loom_token_counter_observe(c, 1000, 1500);
        loom_token_counter_observe(c, 1500, 1000);
    }
    return NULL;
}

/* Threads updating one factor at once lose no update: the steps of all
 * of them cancel, so it ends where it started. */
static void test_correction_threads(void **state)
{
    loom_token_counter *c[4];
    pthread_t th[4];
    int i;

    (void)state;
    loom__token_counter_reset();
    for (i = 0; i < 4; i++)
        assert_int_equal(loom_token_counter_for_model(&c[i], "gemini-x"), 0);
    for (i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, observe_thread, c[i]),
                         0);
    for (i = 0; i < 4; i++)
        assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_true(fabs(loom_token_counter_factor(c[0]) - 1.0) < 1e-9);
    for (i = 0; i < 4; i++)
        loom_token_counter_free(c[i]);
    loom__token_counter_reset();
}

static void test_estimate_length(void **state)
{
    (void)state;
    assert_int_equal(loom__token_estimate_length("", 0), 0);
    assert_int_equal(loom__token_estimate_length("abcd", 4), 1);
    assert_int_equal(loom__token_estimate_length("abcde", 5), 2);
    /* one per non-ASCII character */
    assert_int_equal(loom__token_estimate_length(
                         "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e", 9), 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_ids),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_nul_bytes),
        cmocka_unit_test(test_special_tokens),
        cmocka_unit_test(test_bpe_methods),
        cmocka_unit_test(test_long_pieces),
        cmocka_unit_test(test_limits),
        cmocka_unit_test(test_tiny_vocab),
        cmocka_unit_test(test_vocab_errors),
        cmocka_unit_test(test_builtin_fallback),
        cmocka_unit_test(test_vocab_dirs),
        cmocka_unit_test(test_missing_vocab),
        cmocka_unit_test(test_shared),
        cmocka_unit_test(test_model_mapping),
        cmocka_unit_test(test_message_accounting),
        cmocka_unit_test(test_request_memo),
        cmocka_unit_test(test_shared_counts),
        cmocka_unit_test(test_tool_accounting),
        cmocka_unit_test(test_correction),
        cmocka_unit_test(test_correction_threads),
        cmocka_unit_test(test_estimate_length),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
