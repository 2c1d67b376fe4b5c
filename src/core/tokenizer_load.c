/*
 * Loading the tokenizer's vocabulary (see tokenizer.c for encoding):
 * finding the files (LOOM_VOCAB_DIR, vocab/data above the executable, the
 * system folder), parsing the rank file into id tables and the hash index,
 * reading meta.json (pattern, special tokens, class groups) or taking a
 * built-in encoding's, compiling the pattern with PCRE2's JIT, and the
 * process-wide shared instances. Every size read from a file has a limit
 * (tokenizer_internal.h) and crossing it is LOOM_ETOOLARGE.
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/tokenizer_internal.h"
#include "core/error.h"
#include "loom/log.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define NONE LOOM__NO_RANK

/* The letters of the groups in meta.json's "classes". */
static const char group_letters[LOOM__TG_COUNT] = {'-', 'u', 'l', 't', 'm',
                                                   'o', 'M', 'N', 'W'};
/* Representatives per group for 2, 3 and 4 UTF-8 bytes (0: none). They
 * must match vocab/convert.mjs; load checks them against PCRE2. */
static const uint32_t group_reps[LOOM__TG_COUNT][3] = {
    {0xa7, 0x2190, 0x1d100}, {0x100, 0x1e00, 0x10400},
    {0x101, 0x1e01, 0x10428}, {0x1c5, 0x1f88, 0},
    {0x2b0, 0x3005, 0x16f93}, {0x5d0, 0x4e00, 0x20000},
    {0x300, 0x901, 0x101fd}, {0x660, 0x966, 0x1d7ce},
    {0, 0, 0},
};

#define WS_CLASS                                                           \
    "\\x{9}-\\x{d}\\x{20}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}-"      \
    "\\x{2029}\\x{202f}\\x{205f}\\x{3000}\\x{feff}"
#define CONTRACTIONS                                                       \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

/*
 * Built-in patterns for rank files without a meta.json: tiktoken's
 * pat_str with JavaScript's \s and js-tiktoken's contractions, as
 * vocab/convert.mjs writes them; \p{..} then use PCRE2's own tables.
 */
static const struct {
    const char *name;
    uint32_t n_ranks;
    const char *pattern;
    const char *specials[5];
    uint32_t ids[5];
} builtins[] = {
    {"o200k_base", 199998,
     "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*"
     "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+" CONTRACTIONS "?|"
     "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+"
     "[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*" CONTRACTIONS "?|"
     "\\p{N}{1,3}| ?[^" WS_CLASS "\\p{L}\\p{N}]+[\\r\\n/]*|"
     "[" WS_CLASS "]*[\\r\\n]+|[" WS_CLASS "]+(?![^" WS_CLASS "])|"
     "[" WS_CLASS "]+",
     {"<|endoftext|>", "<|endofprompt|>"},
     {199999, 200018}},
    {"cl100k_base", 100256,
     CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}|"
     " ?[^" WS_CLASS "\\p{L}\\p{N}]+[\\r\\n]*|[" WS_CLASS "]*[\\r\\n]+|"
     "[" WS_CLASS "]+(?![^" WS_CLASS "])|[" WS_CLASS "]+",
     {"<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>",
      "<|fim_suffix|>", "<|endofprompt|>"},
     {100257, 100258, 100259, 100260, 100276}},
};

void loom_tokenizer_free(loom_tokenizer *t)
{
    size_t k;

    if (!t)
        return;
    for (k = 0; k < t->n_specials; k++)
        free(t->specials[k].text);
    free(t->specials);
    free(t->name);
    free(t->bytes);
    free(t->off);
    free(t->len);
    free(t->slots);
    free(t->pair);
    free(t->stage1);
    free(t->blocks);
    pcre2_code_free(t->re);
    loom__tokenizer_jits_free(t);
    free(t);
}

/* Reads a whole file of at most max bytes. LOOM_ENOTFOUND when missing. */
static int read_file(const char *path, size_t max, char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    struct stat st;
    char *buf = NULL;
    size_t n;
    int err = 0;

    if (!f)
        return loom__error_set(errno == ENOENT ? LOOM_ENOTFOUND : LOOM_EIO,
                               "tokenizer: %s: %s", path, strerror(errno));
    if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode)) {
        err = loom__error_set(LOOM_EIO, "tokenizer: %s: not a file", path);
        goto cleanup;
    }
    if ((unsigned long long)st.st_size > max) {
        err = loom__error_set(LOOM_ETOOLARGE,
                              "tokenizer: %s: over the limit of %zu bytes",
                              path, max);
        goto cleanup;
    }
    buf = malloc((size_t)st.st_size + 1);
    if (!buf) {
        err = loom__error_oom();
        goto cleanup;
    }
    n = fread(buf, 1, (size_t)st.st_size, f);
    if (n != (size_t)st.st_size || ferror(f)) {
        err = loom__error_set(LOOM_EIO, "tokenizer: %s: read failed", path);
        goto cleanup;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    buf = NULL;
cleanup:
    free(buf);
    fclose(f);
    return err;
}

static int b64_value(int c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    if (c == '+')
        return 62;
    if (c == '/')
        return 63;
    return -1;
}

/* Decodes standard base64 (padding optional) into out; returns the byte
 * count or -1. Hand-written: no linked library exposes base64. */
static long b64_decode(const char *s, size_t n, uint8_t *out, size_t cap)
{
    uint32_t acc = 0;
    size_t o = 0, i, bits = 0;

    while (n && s[n - 1] == '=')
        n--;
    for (i = 0; i < n; i++) {
        int v = b64_value((unsigned char)s[i]);
        if (v < 0)
            return -1;
        acc = acc << 6 | (uint32_t)v;
        bits += 6;
        if (bits >= 8) {
            bits -= 8;
            if (o == cap)
                return -1;
            out[o++] = (uint8_t)(acc >> bits);
        }
    }
    if (bits >= 6)
        return -1; /* a lone trailing character */
    return (long)o;
}


typedef struct {
    uint32_t rank;
    uint32_t off;
    uint32_t len;
} rank_entry;

/* Parses the rank file text (NUL-terminated, modified in place) into t's
 * id tables; *n_ranks is the number of tokens. */
static int parse_ranks(loom_tokenizer *t, const char *path, char *text,
                       size_t len, uint32_t *n_ranks)
{
    uint8_t tok[LOOM__VOCAB_MAX_TOKEN];
    rank_entry *e = NULL;
    size_t lines = 1, n = 0, used = 0, pos = 0, line_no = 0, i;
    uint32_t max_rank = 0;
    int err = 0;

    for (i = 0; i < len; i++)
        lines += text[i] == '\n';
    e = malloc(lines * sizeof(*e));
    t->bytes = malloc(len + 1);
    if (!e || !t->bytes) {
        err = loom__error_oom();
        goto cleanup;
    }
    while (pos < len) {
        char *nl = memchr(text + pos, '\n', len - pos), *endp;
        size_t end = nl ? (size_t)(nl - text) : len, stop = end, sp, chars;
        unsigned long rank;
        long blen;

        line_no++;
        if (stop > pos && text[stop - 1] == '\r')
            stop--;
        if (stop == pos) {
            pos = end + 1;
            continue;
        }
        for (sp = pos; sp < stop && text[sp] != ' '; sp++)
            ;
        if (sp == stop || sp == pos) {
            err = loom__error_set(LOOM_EPROTO, "tokenizer: %s:%zu: expected "
                                  "\"BASE64 RANK\"", path, line_no);
            goto cleanup;
        }
        text[stop] = '\0';
        errno = 0;
        rank = strtoul(text + sp + 1, &endp, 10);
        if (errno || *endp || text[sp + 1] < '0' || text[sp + 1] > '9') {
            err = loom__error_set(LOOM_EPROTO, "tokenizer: %s:%zu: bad rank",
                                  path, line_no);
            goto cleanup;
        }
        if (rank >= LOOM__VOCAB_MAX_RANK || n >= LOOM__VOCAB_MAX_RANK) {
            err = loom__error_set(LOOM_ETOOLARGE, "tokenizer: %s:%zu: rank "
                                  "or token count over the limit of %u",
                                  path, line_no, LOOM__VOCAB_MAX_RANK);
            goto cleanup;
        }
        for (chars = sp - pos; chars && text[pos + chars - 1] == '=';)
            chars--;
        if (chars * 3 / 4 > sizeof(tok)) {
            err = loom__error_set(LOOM_ETOOLARGE, "tokenizer: %s:%zu: token "
                                  "over %d bytes", path, line_no,
                                  LOOM__VOCAB_MAX_TOKEN);
            goto cleanup;
        }
        blen = b64_decode(text + pos, sp - pos, tok, sizeof(tok));
        if (blen <= 0) {
            err = loom__error_set(LOOM_EPROTO, "tokenizer: %s:%zu: bad "
                                  "base64", path, line_no);
            goto cleanup;
        }
        memcpy(t->bytes + used, tok, (size_t)blen);
        e[n].rank = (uint32_t)rank;
        e[n].off = (uint32_t)used;
        e[n].len = (uint32_t)blen;
        n++;
        used += (size_t)blen;
        if (rank > max_rank)
            max_rank = (uint32_t)rank;
        pos = end + 1;
    }
    if (!n) {
        err = loom__error_set(LOOM_EPROTO, "tokenizer: %s: no tokens", path);
        goto cleanup;
    }
    t->n_ids = max_rank + 1;
    t->off = calloc(t->n_ids, sizeof(*t->off));
    t->len = calloc(t->n_ids, sizeof(*t->len));
    if (!t->off || !t->len) {
        err = loom__error_oom();
        goto cleanup;
    }
    for (i = 0; i < n; i++) {
        if (t->len[e[i].rank]) {
            err = loom__error_set(LOOM_EPROTO, "tokenizer: %s: rank %u "
                                  "appears twice", path, e[i].rank);
            goto cleanup;
        }
        t->off[e[i].rank] = e[i].off;
        t->len[e[i].rank] = (uint16_t)e[i].len;
        if (e[i].len > t->max_len)
            t->max_len = e[i].len;
    }
    *n_ranks = (uint32_t)n;
cleanup:
    free(e);
    return err;
}

/* Builds the byte, pair and hash tables; every token must be unique and
 * every single byte a token. */
static int build_index(loom_tokenizer *t, const char *path, uint32_t n)
{
    size_t cap = 1024, i;
    uint32_t id;

    /* a load of up to 0.8: a denser table misses the cache less, and
     * linear probing stays within a line or two */
    while (cap < (size_t)n * 5 / 4)
        cap *= 2;
    t->slots = malloc(cap * sizeof(*t->slots));
    t->pair = malloc(65536 * sizeof(*t->pair));
    if (!t->slots || !t->pair)
        return loom__error_oom();
    t->mask = cap - 1;
    for (i = 0; i < cap; i++)
        t->slots[i].rank = NONE;
    for (i = 0; i < 65536; i++)
        t->pair[i] = NONE;
    for (i = 0; i < 256; i++)
        t->byte_rank[i] = NONE;
    for (id = 0; id < t->n_ids; id++) {
        const uint8_t *p = t->bytes + t->off[id];
        size_t n_ = t->len[id];
        uint64_t head;

        if (!n_)
            continue;
        if (loom__tokenizer_rank(t, p, n_) != NONE)
            return loom__error_set(LOOM_EPROTO, "tokenizer: %s: token %u "
                                   "appears twice", path, id);
        if (n_ == 1) {
            t->byte_rank[p[0]] = id;
            continue;
        }
        if (n_ == 2) {
            t->pair[(size_t)p[0] << 8 | p[1]] = id;
            continue;
        }
        head = loom__tok_head(p, n_);
        for (i = (size_t)loom__tok_hash(head, p, n_) & t->mask;
             t->slots[i].rank != NONE; i = (i + 1) & t->mask)
            ;
        t->slots[i].head = head;
        t->slots[i].rank = id;
        t->slots[i].len = (uint32_t)n_;
    }
    for (i = 0; i < 256; i++)
        if (t->byte_rank[i] == NONE)
            return loom__error_set(LOOM_EPROTO, "tokenizer: %s: no token "
                                   "for the byte 0x%02zx", path, i);
    return 0;
}

static int add_special(loom_tokenizer *t, const char *path, const char *text,
                       json_int_t id)
{
    size_t len = strlen(text), k;
    int ascii;

    if (t->n_specials >= LOOM__VOCAB_MAX_SPECIAL)
        return loom__error_set(LOOM_ETOOLARGE, "tokenizer: %s: more than %d "
                               "special tokens", path,
                               LOOM__VOCAB_MAX_SPECIAL);
    if (!len || len > LOOM__VOCAB_MAX_SPECIAL_LEN)
        return loom__error_set(len ? LOOM_ETOOLARGE : LOOM_EPROTO,
                               "tokenizer: %s: special token of %zu bytes "
                               "(1 to %d)", path, len,
                               LOOM__VOCAB_MAX_SPECIAL_LEN);
    if (loom__tokenizer_utf8_check((const uint8_t *)text, len, &ascii) < 0)
        return loom__error_set(LOOM_EPROTO, "tokenizer: %s: special token "
                               "is not UTF-8", path);
    if (id < 0 || id >= (json_int_t)LOOM__VOCAB_MAX_RANK ||
        ((uint32_t)id < t->n_ids && t->len[id]))
        return loom__error_set(LOOM_EPROTO, "tokenizer: %s: special token "
                               "%s has a bad or taken id", path, text);
    for (k = 0; k < t->n_specials; k++)
        if (t->specials[k].id == (uint32_t)id ||
            !strcmp(t->specials[k].text, text))
            return loom__error_set(LOOM_EPROTO, "tokenizer: %s: special "
                                   "token %s appears twice", path, text);
    t->specials[t->n_specials].text = strdup(text);
    if (!t->specials[t->n_specials].text)
        return loom__error_oom();
    t->specials[t->n_specials].len = len;
    t->specials[t->n_specials].id = (uint32_t)id;
    t->n_specials++;
    return 0;
}

static size_t utf8_put(uint32_t cp, uint8_t *q)
{
    if (cp < 0x80) {
        q[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        q[0] = (uint8_t)(0xc0 | cp >> 6);
        q[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        q[0] = (uint8_t)(0xe0 | cp >> 12);
        q[1] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
        q[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    q[0] = (uint8_t)(0xf0 | cp >> 18);
    q[1] = (uint8_t)(0x80 | (cp >> 12 & 0x3f));
    q[2] = (uint8_t)(0x80 | (cp >> 6 & 0x3f));
    q[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

/* Checks that PCRE2 puts every representative in its own group. */
static int check_reps(const loom_tokenizer *t)
{
    static const char probe[] =
        "^(?:(\\p{Lu})|(\\p{Ll})|(\\p{Lt})|(\\p{Lm})|(\\p{Lo})|(\\p{M})|"
        "(\\p{N})|([^\\p{L}\\p{M}\\p{N}]))$";
    static const int groups[] = {0, LOOM__TG_LU, LOOM__TG_LL, LOOM__TG_LT,
                                 LOOM__TG_LM, LOOM__TG_LO, LOOM__TG_M,
                                 LOOM__TG_N, LOOM__TG_OTHER};
    pcre2_code *re;
    pcre2_match_data *md = NULL;
    PCRE2_SIZE eoff;
    int g, k, rc, e, err = 0;

    re = pcre2_compile((PCRE2_SPTR)probe, PCRE2_ZERO_TERMINATED, PCRE2_UTF,
                       &e, &eoff, NULL);
    md = re ? pcre2_match_data_create_from_pattern(re, NULL) : NULL;
    if (!re || !md) {
        err = loom__error_oom();
        goto cleanup;
    }
    for (g = 0; g < LOOM__TG_WS; g++) {
        for (k = 0; k < 3; k++) {
            if (!group_reps[g][k])
                continue;
            rc = pcre2_match(re, t->rep[g][k], (size_t)k + 2, 0, 0, md,
                             NULL);
            if (rc < 2 || groups[rc - 1] != g) {
                err = loom__error_set(LOOM_ERROR, "tokenizer: this PCRE2 "
                                      "does not class U+%04X as '%c'",
                                      group_reps[g][k], group_letters[g]);
                goto cleanup;
            }
        }
    }
cleanup:
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return err;
}

/* Builds the two-stage group table from "START:G,..." (hex, from 0x80). */
static int build_groups(loom_tokenizer *t, const char *path, const char *s)
{
    uint8_t *flat = NULL;
    size_t nblocks = LOOM__TG_COUNT, b, i;
    uint32_t start, next_start, cp, prev = 0;
    int err = 0, g, k;

    flat = malloc(0x110000);
    t->stage1 = malloc(0x1100 * sizeof(*t->stage1));
    if (!flat || !t->stage1) {
        err = loom__error_oom();
        goto cleanup;
    }
    memset(flat, LOOM__TG_OTHER, 0x80);
    for (i = 0; *s; i++) {
        char *end;
        const char *gl;
        unsigned long v = strtoul(s, &end, 16);

        if (end == s || *end != ':' || !end[1] || v > 0x10ffff ||
            (i == 0 && v != 0x80) || (i > 0 && v <= prev) ||
            !(gl = memchr(group_letters, end[1], LOOM__TG_COUNT)) ||
            (end[2] && end[2] != ',') || (end[2] == ',' && !end[3])) {
            err = loom__error_set(LOOM_EPROTO, "tokenizer: %s: bad "
                                  "\"classes\" near \"%.20s\"", path, s);
            goto cleanup;
        }
        start = (uint32_t)v;
        g = (int)(gl - group_letters);
        s = end + 2 + (end[2] == ',');
        next_start = *s ? (uint32_t)strtoul(s, NULL, 16) : 0x110000;
        if (next_start <= start || next_start > 0x110000) {
            err = loom__error_set(LOOM_EPROTO, "tokenizer: %s: \"classes\" "
                                  "out of order", path);
            goto cleanup;
        }
        for (cp = start; cp < next_start; cp++)
            flat[cp] = (uint8_t)g;
        if (g != LOOM__TG_WS) {
            /* every UTF-8 length in the run needs a representative */
            for (k = 0; k < 3; k++) {
                static const uint32_t lo[] = {0x80, 0x800, 0x10000};
                static const uint32_t hi[] = {0x800, 0x10000, 0x110000};
                if (start < hi[k] && next_start > lo[k] &&
                    !group_reps[g][k]) {
                    err = loom__error_set(LOOM_EPROTO, "tokenizer: %s: no "
                                          "%d-byte representative for class "
                                          "'%c'", path, k + 2,
                                          group_letters[g]);
                    goto cleanup;
                }
            }
        }
        prev = start;
    }
    if (!i) {
        err = loom__error_set(LOOM_EPROTO, "tokenizer: %s: empty "
                              "\"classes\"", path);
        goto cleanup;
    }
    /* uniform blocks share LOOM__TG_COUNT canned blocks; the rest are copied */
    t->blocks = malloc((size_t)0x1100 * 256 + (size_t)LOOM__TG_COUNT * 256);
    if (!t->blocks) {
        err = loom__error_oom();
        goto cleanup;
    }
    for (g = 0; g < LOOM__TG_COUNT; g++)
        memset(t->blocks + (size_t)g * 256, g, 256);
    for (b = 0; b < 0x1100; b++) {
        const uint8_t *blk = flat + b * 256;
        for (i = 1; i < 256 && blk[i] == blk[0]; i++)
            ;
        if (i == 256) {
            t->stage1[b] = blk[0];
            continue;
        }
        memcpy(t->blocks + nblocks * 256, blk, 256);
        t->stage1[b] = (uint16_t)nblocks++;
    }
    {
        uint8_t *shrunk = realloc(t->blocks, nblocks * 256);
        if (shrunk)
            t->blocks = shrunk;
    }
    for (g = 0; g < LOOM__TG_COUNT; g++)
        for (k = 0; k < 3; k++)
            if (group_reps[g][k])
                utf8_put(group_reps[g][k], t->rep[g][k]);
    err = check_reps(t);
cleanup:
    free(flat);
    return err;
}

/* With class groups, the pattern may use only the properties they
 * cover: no \s \d \w \b (PCRE2's own meaning), no (?i). */
static int check_pattern(const char *path, const char *p)
{
    static const char *const allowed[] = {"L}", "Lu}", "Ll}", "Lt}", "Lm}",
                                          "Lo}", "M}", "N}"};
    size_t k;

    for (; *p; p++) {
        if (p[0] == '(' && p[1] == '?' && p[2] != ':' && p[2] != '!' &&
            p[2] != '=')
            return loom__error_set(LOOM_EPROTO, "tokenizer: %s: the pattern "
                                   "uses \"(?%c\", which loom does not "
                                   "support", path, p[2]);
        if (*p != '\\' || !p[1])
            continue;
        p++;
        if (strchr("sSdDwWbBhHvVRXNC", *p))
            return loom__error_set(LOOM_EPROTO, "tokenizer: %s: the pattern "
                                   "uses \\%c, which loom does not support "
                                   "(vocab/convert.mjs spells it out)",
                                   path, *p);
        if ((*p == 'p' || *p == 'P') && p[1] == '{') {
            for (k = 0; k < sizeof(allowed) / sizeof(allowed[0]); k++)
                if (!strncmp(p + 2, allowed[k], strlen(allowed[k])))
                    break;
            if (k == sizeof(allowed) / sizeof(allowed[0]))
                return loom__error_set(LOOM_EPROTO, "tokenizer: %s: the "
                                       "pattern uses a property other than "
                                       "L Lu Ll Lt Lm Lo M N", path);
        }
    }
    return 0;
}

static int compile_pattern(loom_tokenizer *t, const char *path,
                           const char *pattern)
{
    PCRE2_SIZE eoff;
    int e;

    if (strlen(pattern) > LOOM__VOCAB_MAX_PATTERN)
        return loom__error_set(LOOM_ETOOLARGE, "tokenizer: %s: pattern over "
                               "%zu bytes", path,
                               (size_t)LOOM__VOCAB_MAX_PATTERN);
    t->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP, &e, &eoff, NULL);
    if (!t->re) {
        PCRE2_UCHAR msg[120];
        pcre2_get_error_message(e, msg, sizeof(msg));
        return loom__error_set(LOOM_EPROTO, "tokenizer: %s: pattern at "
                               "offset %zu: %s", path, (size_t)eoff,
                               (const char *)msg);
    }
    t->jit = pcre2_jit_compile(t->re, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

/* Reads X.meta.json: pattern, special tokens, classes, name. */
static int load_meta(loom_tokenizer *t, const char *path, const char *text,
                     size_t len)
{
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr), *specials, *v;
    const char *key, *pattern, *classes, *name;
    int err = 0;

    if (!root || !json_is_object(root)) {
        err = loom__error_set(LOOM_EPROTO, "tokenizer: %s: %s", path,
                              root ? "not a JSON object" : jerr.text);
        goto cleanup;
    }
    pattern = json_string_value(json_object_get(root, "pattern"));
    specials = json_object_get(root, "special_tokens");
    classes = json_string_value(json_object_get(root, "classes"));
    name = json_string_value(json_object_get(root, "encoding"));
    if (json_integer_value(json_object_get(root, "format")) != 1 ||
        !pattern || !json_is_object(specials) ||
        (json_object_get(root, "classes") && !classes)) {
        err = loom__error_set(LOOM_EPROTO, "tokenizer: %s: expected format "
                              "1 with \"pattern\" and \"special_tokens\" "
                              "(run scripts/vocab.sh)", path);
        goto cleanup;
    }
    if (json_object_size(specials) > LOOM__VOCAB_MAX_SPECIAL) {
        err = loom__error_set(LOOM_ETOOLARGE, "tokenizer: %s: more than %d "
                              "special tokens", path,
                              LOOM__VOCAB_MAX_SPECIAL);
        goto cleanup;
    }
    t->specials = calloc(json_object_size(specials) + 1,
                         sizeof(loom__tok_special));
    if (!t->specials) {
        err = loom__error_oom();
        goto cleanup;
    }
    json_object_foreach(specials, key, v) {
        if (!json_is_integer(v)) {
            err = loom__error_set(LOOM_EPROTO, "tokenizer: %s: special token "
                                  "%s has no integer id", path, key);
            goto cleanup;
        }
        err = add_special(t, path, key, json_integer_value(v));
        if (err < 0)
            goto cleanup;
    }
    if (name && *name) {
        free(t->name);
        t->name = strdup(name);
        if (!t->name) {
            err = loom__error_oom();
            goto cleanup;
        }
    }
    if (classes) {
        err = check_pattern(path, pattern);
        if (err < 0)
            goto cleanup;
        err = build_groups(t, path, classes);
        if (err < 0)
            goto cleanup;
    }
    err = compile_pattern(t, path, pattern);
cleanup:
    json_decref(root);
    return err;
}

/* No meta.json: the built-in encoding named by the file or its size. */
static int load_builtin(loom_tokenizer *t, const char *path,
                        uint32_t n_ranks)
{
    const char *base = strrchr(path, '/');
    size_t b, k;
    int err;

    base = base ? base + 1 : path;
    for (b = 0; b < sizeof(builtins) / sizeof(builtins[0]); b++)
        if (!strncmp(base, builtins[b].name, strlen(builtins[b].name)))
            break;
    if (b == sizeof(builtins) / sizeof(builtins[0]))
        for (b = 0; b < sizeof(builtins) / sizeof(builtins[0]); b++)
            if (builtins[b].n_ranks == n_ranks)
                break;
    if (b == sizeof(builtins) / sizeof(builtins[0]))
        return loom__error_set(LOOM_EPROTO, "tokenizer: %s: no pattern: put "
                               "a .meta.json beside it (scripts/vocab.sh "
                               "writes them) or name it after its encoding "
                               "(o200k_base.tiktoken, cl100k_base.tiktoken)",
                               path);
    t->specials = calloc(5, sizeof(loom__tok_special));
    free(t->name);
    t->name = strdup(builtins[b].name);
    if (!t->specials || !t->name)
        return loom__error_oom();
    for (k = 0; k < 5 && builtins[b].specials[k]; k++) {
        err = add_special(t, path, builtins[b].specials[k],
                          builtins[b].ids[k]);
        if (err < 0)
            return err;
    }
    return compile_pattern(t, path, builtins[b].pattern);
}

static int load_path(loom_tokenizer **out, const char *path)
{
    loom_tokenizer *t = calloc(1, sizeof(*t));
    char *text = NULL, *meta_path = NULL, *meta = NULL;
    const char *base = strrchr(path, '/');
    size_t len, plen = strlen(path), meta_len;
    uint32_t n_ranks = 0;
    int err;

    if (!t)
        return loom__error_oom();
    err = loom__tokenizer_jits_new(t);
    if (err < 0)
        goto cleanup;
    base = base ? base + 1 : path;
    t->name = strndup(base, strcspn(base, "."));
    if (!t->name) {
        err = loom__error_oom();
        goto cleanup;
    }
    err = read_file(path, LOOM__VOCAB_MAX_FILE, &text, &len);
    if (err < 0)
        goto cleanup;
    err = parse_ranks(t, path, text, len, &n_ranks);
    if (err < 0)
        goto cleanup;
    err = build_index(t, path, n_ranks);
    if (err < 0)
        goto cleanup;
    if (plen > 9 && !strcmp(path + plen - 9, ".tiktoken"))
        plen -= 9;
    if (asprintf(&meta_path, "%.*s.meta.json", (int)plen, path) < 0) {
        meta_path = NULL;
        err = loom__error_oom();
        goto cleanup;
    }
    err = read_file(meta_path, LOOM__VOCAB_MAX_META, &meta, &meta_len);
    if (err == LOOM_ENOTFOUND)
        err = load_builtin(t, path, n_ranks);
    else if (!err)
        err = load_meta(t, meta_path, meta, meta_len);
    if (err < 0)
        goto cleanup;
    *out = t;
    t = NULL;
cleanup:
    free(meta);
    free(meta_path);
    free(text);
    loom_tokenizer_free(t);
    return err;
}

/* The folder of the running executable, or "" when unknown. */
static void exe_dir(char *buf, size_t cap)
{
    ssize_t n = readlink("/proc/self/exe", buf, cap - 1);
    char *slash;

    if (n <= 0) {
        buf[0] = '\0';
        return;
    }
    buf[n] = '\0';
    slash = strrchr(buf, '/');
    if (slash)
        *slash = '\0';
    else
        buf[0] = '\0';
}

/* Appends the folders to search to out, one per line. */
static int vocab_dirs(loom_buf *out)
{
    const char *env = getenv("LOOM_VOCAB_DIR");
    char exe[PATH_MAX], cand[PATH_MAX + 64], real[PATH_MAX];
    struct stat st;
    int level, err;

    if (env)
        return *env ? loom_buf_printf(out, "%s\n", env) : 0;
    exe_dir(exe, sizeof(exe));
    for (level = 0; exe[0] && level < 4; level++) {
        int n = snprintf(cand, sizeof(cand), "%s/", exe);
        for (int k = 0; k < level; k++)
            n += snprintf(cand + n, sizeof(cand) - (size_t)n, "../");
        snprintf(cand + n, sizeof(cand) - (size_t)n, "vocab/data");
        if (stat(cand, &st) == 0 && S_ISDIR(st.st_mode) &&
            realpath(cand, real)) {
            err = loom_buf_printf(out, "%s\n", real);
            if (err < 0)
                return err;
        }
    }
    return loom_buf_printf(out, "%s\n", LOOM_VOCAB_SYSTEM_DIR);
}

int loom__tokenizer_vocab_dirs(loom_buf *out)
{
    loom_buf dirs = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    const char *p;
    int err = vocab_dirs(&dirs);

    for (p = loom_buf_cstr(&dirs); !err && *p;) {
        size_t n = strcspn(p, "\n");
        err = loom_buf_printf(out, "%s%.*s", p == dirs.ptr ? "" : ", ",
                              (int)n, p);
        p += n + (p[n] == '\n');
    }
    loom_buf_free(&dirs);
    return err;
}

static int valid_name(const char *s)
{
    size_t n = strlen(s), i;

    if (!n || n > 64 || s[0] == '.')
        return 0;
    for (i = 0; i < n; i++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                    "0123456789_-.", s[i]))
            return 0;
    return 1;
}

/* The names of the built-in encodings, for messages. */
#define KNOWN_ENCODINGS "o200k_base, cl100k_base"

/* Whether name is a built-in encoding's (one scripts/vocab.sh fetches). */
static int builtin_named(const char *name)
{
    size_t b;

    for (b = 0; b < sizeof(builtins) / sizeof(builtins[0]); b++)
        if (!strcmp(name, builtins[b].name))
            return 1;
    return 0;
}

int loom_tokenizer_load(loom_tokenizer **out, const char *encoding_or_path)
{
    const char *name = encoding_or_path;
    loom_buf dirs = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    loom_buf looked = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    char *path = NULL;
    const char *p;
    int err;

    if (!out || !name || !*name)
        return loom__error_set(LOOM_EINVALID,
                               "loom_tokenizer_load: no encoding given");
    *out = NULL;
    if (strchr(name, '/'))
        return load_path(out, name);
    if (!valid_name(name))
        return loom__error_set(LOOM_EINVALID, "tokenizer: bad encoding name "
                               "\"%s\"", name);
    err = vocab_dirs(&dirs);
    if (err < 0)
        goto cleanup;
    err = LOOM_ENOTFOUND;
    for (p = loom_buf_cstr(&dirs); *p;) {
        size_t n = strcspn(p, "\n");
        struct stat st;

        free(path);
        if (asprintf(&path, "%.*s/%s.tiktoken", (int)n, p, name) < 0) {
            path = NULL;
            err = loom__error_oom();
            goto cleanup;
        }
        if (stat(path, &st) == 0) {
            err = load_path(out, path);
            goto cleanup;
        }
        if (loom_buf_printf(&looked, "%s%.*s", looked.len ? ", " : "",
                            (int)n, p) < 0) {
            err = loom__error_oom();
            goto cleanup;
        }
        p += n + (p[n] == '\n');
    }
    if (!builtin_named(name))
        err = loom__error_set(LOOM_ENOTFOUND,
                              "tokenizer: unknown encoding "
                              "'%s' (known: %s); another vocabulary is a "
                              "path to its .tiktoken file, or %s.tiktoken "
                              "in a vocab folder (looked in %s; "
                              "scripts/vocab.sh fills it with the known "
                              "ones)",
                              name, KNOWN_ENCODINGS, name,
                              looked.len ? looked.ptr
                                         : "LOOM_VOCAB_DIR, which is empty");
    else
        err = loom__error_set(LOOM_ENOTFOUND,
                              "tokenizer: no vocabulary for "
                              "%s (looked for %s.tiktoken in %s); run "
                              "scripts/vocab.sh in loom's source tree, or "
                              "set LOOM_VOCAB_DIR to a folder holding it",
                              name, name,
                              looked.len ? looked.ptr
                                         : "LOOM_VOCAB_DIR, which is empty");
cleanup:
    free(path);
    loom_buf_free(&looked);
    loom_buf_free(&dirs);
    return err;
}

/* ---------------------------------------------------------------------
 * Shared instances
 */

#define SHARED_MAX 8

static pthread_mutex_t shared_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char name[72];
    loom_tokenizer *t; /* NULL: loading failed (logged) */
} shared[SHARED_MAX];
static size_t shared_n;

const loom_tokenizer *loom_tokenizer_shared(const char *encoding)
{
    loom_tokenizer *t = NULL;
    size_t i;

    if (!encoding || !valid_name(encoding)) {
        loom__error_set(LOOM_EINVALID, "tokenizer: bad encoding name");
        return NULL;
    }
    pthread_mutex_lock(&shared_mu);
    for (i = 0; i < shared_n; i++) {
        if (!strcmp(shared[i].name, encoding)) {
            t = shared[i].t;
            if (!t)
                loom__error_set(LOOM_ENOTFOUND, "tokenizer: %s is not "
                                "loaded (see the log)", encoding);
            goto done;
        }
    }
    if (shared_n == SHARED_MAX) {
        loom__error_set(LOOM_ETOOLARGE, "tokenizer: more than %d shared "
                        "encodings", SHARED_MAX);
        goto done;
    }
    if (loom_tokenizer_load(&t, encoding) < 0) {
        t = NULL;
        loom_warn("%s; token counts are estimated from text length",
                  loom_error_last());
    }
    snprintf(shared[shared_n].name, sizeof(shared[shared_n].name), "%s",
             encoding);
    shared[shared_n++].t = t;
done:
    pthread_mutex_unlock(&shared_mu);
    return t;
}

void loom__tokenizer_shared_reset(void)
{
    size_t i;

    pthread_mutex_lock(&shared_mu);
    loom__token_counter_tools_memo_reset();
    for (i = 0; i < shared_n; i++)
        loom_tokenizer_free(shared[i].t);
    shared_n = 0;
    pthread_mutex_unlock(&shared_mu);
}
