/*
 * A tiktoken-compatible byte-pair encoder (o200k_base, cl100k_base).
 *
 * Encoding is tiktoken's: special tokens (when allowed) split the text
 * into segments; a regular expression splits each segment into pieces;
 * a piece that is a token is one id, any other is merged byte by byte,
 * always merging the adjacent pair whose bytes have the lowest rank
 * (leftmost on ties). Ids are compared with js-tiktoken's, so the pattern
 * behaves as JavaScript's RegExp does there:
 *
 * - The vocabulary's pattern (meta.json, written by vocab/convert.mjs)
 *   spells \s as JavaScript's whitespace and the case-insensitive
 *   contractions as ASCII pairs. Its \p{..} classes are PCRE2's, but PCRE2
 *   never sees the text's own non-ASCII code points: each is replaced by a
 *   representative of the same UTF-8 length from its class group (Lu, Ll,
 *   Lt, Lm, Lo, M, N, whitespace, other), the groups being those of the
 *   node that converted the vocabulary ("classes" in meta.json). Pieces
 *   keep their offsets, so BPE reads the original bytes. PCRE2 (10.42:
 *   Unicode 14) and node (Unicode 15-17) then agree on every code point.
 * - Invalid UTF-8 is read as U+FFFD per maximal invalid subpart, as a
 *   WHATWG TextDecoder does, before anything else.
 *
 * Ranks live in one open-addressing hash table keyed by token bytes plus
 * a direct table for two-byte tokens (the first merges of every piece).
 * Both are hand-written: no library loom links has a byte-string map.
 * tokenizer_load.c builds them from the vocabulary files.
 * Short pieces merge with a quadratic scan over an array on the stack
 * (tiktoken's own method); long ones with a binary heap so that a
 * megabyte of letters without a space stays O(n log n).
 */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/tokenizer_internal.h"
#include "core/error.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define NONE LOOM__NO_RANK
#define SMALL_PIECE 64 /* pieces up to this merge with the array scan */

/* ---------------------------------------------------------------------
 * Hashing and rank lookup
 */

/* memcmp() == 0 for the short strings tokens are, without a call. */
static inline int same_bytes(const uint8_t *a, const uint8_t *b, size_t n)
{
    uint64_t x, y;

    while (n >= 8) {
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
        if (x != y)
            return 0;
        a += 8;
        b += 8;
        n -= 8;
    }
    while (n--)
        if (*a++ != *b++)
            return 0;
    return 1;
}

static inline uint32_t lookup(const loom_tokenizer *t, const uint8_t *p,
                              size_t n)
{
    uint64_t head;
    size_t i;

    if (n == 2)
        return t->pair[(size_t)p[0] << 8 | p[1]];
    if (n == 1)
        return t->byte_rank[p[0]];
    if (n > t->max_len)
        return NONE;
    head = loom__tok_head(p, n);
    for (i = (size_t)loom__tok_hash(head, p, n) & t->mask;;
         i = (i + 1) & t->mask) {
        const loom__tok_slot *s = &t->slots[i];
        if (s->rank == NONE)
            return NONE;
        if (s->head == head && s->len == n &&
            (n <= 8 ||
             same_bytes(t->bytes + t->off[s->rank] + 8, p + 8, n - 8)))
            return s->rank;
    }
}

/* ---------------------------------------------------------------------
 * Output sinks: ids into a growable array, or just a count
 */

typedef struct {
    uint32_t *ids; /* NULL: counting only */
    size_t n;
    size_t cap;
    /* scratch for the heap merge, grown as pieces need and reused */
    uint32_t *prev, *next, *prank, *trank;
    uint64_t *heap;
    size_t scratch_cap;
} sink;

static int sink_push(sink *s, uint32_t id)
{
    if (s->ids && s->n == s->cap) {
        size_t cap = s->cap * 2;
        uint32_t *p = realloc(s->ids, cap * sizeof(*p));
        if (!p)
            return loom__error_oom();
        s->ids = p;
        s->cap = cap;
    }
    if (s->ids)
        s->ids[s->n] = id;
    s->n++;
    return 0;
}

static void sink_scratch_free(sink *s)
{
    free(s->prev);
    free(s->next);
    free(s->prank);
    free(s->trank);
    free(s->heap);
}

static int sink_scratch(sink *s, size_t n)
{
    size_t cap = s->scratch_cap ? s->scratch_cap : 256;

    if (n <= s->scratch_cap)
        return 0;
    while (cap < n)
        cap *= 2;
    sink_scratch_free(s);
    s->prev = malloc(cap * sizeof(uint32_t));
    s->next = malloc(cap * sizeof(uint32_t));
    s->prank = malloc(cap * sizeof(uint32_t));
    s->trank = malloc(cap * sizeof(uint32_t));
    /* each merge pushes at most two entries */
    s->heap = malloc(3 * cap * sizeof(uint64_t));
    if (!s->prev || !s->next || !s->prank || !s->trank || !s->heap) {
        sink_scratch_free(s);
        s->prev = s->next = s->prank = s->trank = NULL;
        s->heap = NULL;
        s->scratch_cap = 0;
        return loom__error_oom();
    }
    s->scratch_cap = cap;
    return 0;
}

/* ---------------------------------------------------------------------
 * Byte-pair merging
 */

/*
 * The array scan: parts[0..m) hold each part's start offset, the token it
 * is (trank) and the rank of it joined with the next part (prank); a
 * sentinel part m holds the end. Each step merges the leftmost lowest
 * prank and recomputes its two neighbours.
 */
typedef struct {
    uint32_t pos, prank, trank;
} part;

static size_t bpe_array(const loom_tokenizer *t, const uint8_t *p, size_t n,
                        uint32_t *out)
{
    part parts[SMALL_PIECE + 1];
    size_t m = n, i, best;
    uint32_t min;

    for (i = 0; i < n; i++) {
        parts[i].pos = (uint32_t)i;
        parts[i].trank = t->byte_rank[p[i]];
        parts[i].prank = i + 1 < n ? t->pair[(size_t)p[i] << 8 | p[i + 1]] :
                                     NONE;
    }
    parts[n].pos = (uint32_t)n;
    for (;;) {
        min = NONE;
        best = 0;
        for (i = 0; i + 1 < m; i++) {
            if (parts[i].prank < min) {
                min = parts[i].prank;
                best = i;
            }
        }
        if (min == NONE)
            break;
        parts[best].trank = min;
        /* drop part best+1 (the sentinel moves down too) */
        memmove(&parts[best + 1], &parts[best + 2],
                (m - best - 1) * sizeof(parts[0]));
        m--;
        parts[best].prank = best + 1 < m ?
            lookup(t, p + parts[best].pos,
                   parts[best + 2].pos - parts[best].pos) : NONE;
        if (best > 0)
            parts[best - 1].prank = lookup(t, p + parts[best - 1].pos,
                                           parts[best + 1].pos -
                                           parts[best - 1].pos);
    }
    for (i = 0; out && i < m; i++)
        out[i] = parts[i].trank;
    return m;
}

static inline void heap_push(uint64_t *h, size_t *n, uint64_t key)
{
    size_t i = (*n)++;

    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (h[parent] <= key)
            break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = key;
}

static inline uint64_t heap_pop(uint64_t *h, size_t *n)
{
    uint64_t top = h[0], last = h[--(*n)];
    size_t i = 0, c;

    while ((c = 2 * i + 1) < *n) {
        if (c + 1 < *n && h[c + 1] < h[c])
            c++;
        if (last <= h[c])
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

/*
 * The heap: parts form a linked list whose nodes are named by their start
 * offset. prank[i] is the rank of node i joined with its successor (NONE
 * when it cannot join, or when i is gone); the heap holds keys
 * rank << 32 | i, so the smallest key is the leftmost lowest rank, as in
 * the array scan. Keys whose rank no longer matches prank are stale.
 */
static size_t bpe_heap(const loom_tokenizer *t, const uint8_t *p, size_t n,
                       sink *s, uint32_t *out)
{
    uint32_t *prev, *next, *prank, *trank, un = (uint32_t)n, i, j, k, h, r;
    uint64_t *heap;
    size_t hn = 0, parts = n, c;

    if (sink_scratch(s, n) < 0)
        return (size_t)-1;
    prev = s->prev;
    next = s->next;
    prank = s->prank;
    trank = s->trank;
    heap = s->heap;
    for (i = 0; i < un; i++) {
        prev[i] = i ? i - 1 : NONE;
        next[i] = i + 1;
        trank[i] = t->byte_rank[p[i]];
        prank[i] = i + 1 < un ? t->pair[(size_t)p[i] << 8 | p[i + 1]] : NONE;
        if (prank[i] != NONE)
            heap_push(heap, &hn, (uint64_t)prank[i] << 32 | i);
    }
    while (hn) {
        uint64_t key = heap_pop(heap, &hn);
        r = (uint32_t)(key >> 32);
        i = (uint32_t)key;
        if (prank[i] != r)
            continue;
        j = next[i];
        k = next[j];
        trank[i] = r;
        next[i] = k;
        if (k < un)
            prev[k] = i;
        prank[j] = NONE;
        parts--;
        prank[i] = k < un ? lookup(t, p + i, next[k] - i) : NONE;
        if (prank[i] != NONE)
            heap_push(heap, &hn, (uint64_t)prank[i] << 32 | i);
        h = prev[i];
        if (h != NONE) {
            prank[h] = lookup(t, p + h, k - h);
            if (prank[h] != NONE)
                heap_push(heap, &hn, (uint64_t)prank[h] << 32 | h);
        }
    }
    if (out)
        for (i = 0, c = 0; i < un; i = next[i])
            out[c++] = trank[i];
    return parts;
}

uint32_t loom__tokenizer_rank(const loom_tokenizer *t, const uint8_t *p,
                              size_t n)
{
    return n ? lookup(t, p, n) : NONE;
}

size_t loom__tokenizer_bpe(const loom_tokenizer *t, const uint8_t *piece,
                           size_t n, int method, uint32_t *out)
{
    sink s;
    size_t r;

    if (method == LOOM__BPE_AUTO)
        method = n <= SMALL_PIECE ? LOOM__BPE_ARRAY : LOOM__BPE_HEAP;
    if (method == LOOM__BPE_ARRAY && n <= SMALL_PIECE)
        return bpe_array(t, piece, n, out);
    memset(&s, 0, sizeof(s));
    r = bpe_heap(t, piece, n, &s, out);
    sink_scratch_free(&s);
    return r;
}

/* Emits the ids of one piece. */
static int encode_piece(const loom_tokenizer *t, const uint8_t *p, size_t n,
                        sink *s)
{
    uint32_t small[SMALL_PIECE];
    uint32_t r = lookup(t, p, n);
    size_t k, i;

    if (r != NONE)
        return sink_push(s, r);
    if (n <= SMALL_PIECE) {
        k = bpe_array(t, p, n, s->ids ? small : NULL);
        if (!s->ids) {
            s->n += k;
            return 0;
        }
        for (i = 0; i < k; i++)
            if (sink_push(s, small[i]) < 0)
                return LOOM_ENOMEM;
        return 0;
    }
    if (s->ids && s->cap - s->n < n) {
        /* room for the worst case: one id per byte */
        size_t cap = s->n + n;
        uint32_t *q;
        if (cap < s->cap * 2)
            cap = s->cap * 2;
        q = realloc(s->ids, cap * sizeof(*q));
        if (!q)
            return loom__error_oom();
        s->ids = q;
        s->cap = cap;
    }
    k = bpe_heap(t, p, n, s, s->ids ? s->ids + s->n : NULL);
    if (k == (size_t)-1)
        return LOOM_ENOMEM;
    s->n += k;
    return 0;
}

/* ---------------------------------------------------------------------
 * UTF-8: validation, WHATWG replacement, class normalisation
 */

/* Bytes of the valid sequence at p[0..n), or 0 when it is invalid (the
 * WHATWG decoder then emits U+FFFD and skips *bad bytes). */
static size_t utf8_seq(const uint8_t *p, size_t n, size_t *bad)
{
    uint8_t b = p[0], lo = 0x80, hi = 0xbf;
    size_t need, j;

    if (b < 0x80)
        return 1;
    if (b >= 0xc2 && b <= 0xdf) {
        need = 1;
    } else if (b >= 0xe0 && b <= 0xef) {
        need = 2;
        if (b == 0xe0)
            lo = 0xa0;
        else if (b == 0xed)
            hi = 0x9f;
    } else if (b >= 0xf0 && b <= 0xf4) {
        need = 3;
        if (b == 0xf0)
            lo = 0x90;
        else if (b == 0xf4)
            hi = 0x8f;
    } else {
        *bad = 1;
        return 0;
    }
    for (j = 1; j <= need; j++) {
        if (j >= n || p[j] < lo || p[j] > hi) {
            /* the maximal subpart ends before p[j], which is read again */
            *bad = j;
            return 0;
        }
        lo = 0x80;
        hi = 0xbf;
    }
    return need + 1;
}

/* 0 when p[0..n) is valid UTF-8; sets *ascii when every byte is ASCII. */
int loom__tokenizer_utf8_check(const uint8_t *p, size_t n, int *ascii)
{
    size_t i = 0, k, bad;

    while (i + 8 <= n) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        if (w & 0x8080808080808080ull)
            break;
        i += 8;
    }
    while (i < n && p[i] < 0x80)
        i++;
    *ascii = i == n;
    while (i < n) {
        if (p[i] < 0x80) {
            i++;
            continue;
        }
        k = utf8_seq(p + i, n - i, &bad);
        if (!k)
            return -1;
        i += k;
    }
    return 0;
}

/* A copy of p[0..n) with each maximal invalid subpart replaced by U+FFFD
 * (EF BF BD). */
static int utf8_replace(const uint8_t *p, size_t n, uint8_t **out,
                        size_t *outlen)
{
    uint8_t *q;
    size_t i = 0, o = 0, k, bad;

    if (n > LOOM_TOKENIZER_MAX_INPUT)
        return loom__error_set(LOOM_ETOOLARGE, "tokenizer: input too large");
    q = malloc(3 * n + 1);
    if (!q)
        return loom__error_oom();
    while (i < n) {
        k = utf8_seq(p + i, n - i, &bad);
        if (k) {
            memcpy(q + o, p + i, k);
            o += k;
            i += k;
        } else {
            /* Bytes into a counted buffer: no terminator wanted. */
            memcpy(q + o, "\xef\xbf\xbd", 3); /* NOLINT(bugprone-not-null-*) */
            o += 3;
            i += bad;
        }
    }
    *out = q;
    *outlen = o;
    return 0;
}

static inline uint8_t group_of(const loom_tokenizer *t, uint32_t cp)
{
    return t->blocks[(size_t)t->stage1[cp >> 8] << 8 | (cp & 0xff)];
}

/* p[0..n) (valid UTF-8) with every non-ASCII code point outside the
 * whitespace group replaced by its group's representative. */
static void normalise(const loom_tokenizer *t, const uint8_t *p, size_t n,
                      uint8_t *q)
{
    size_t i = 0, k;
    uint32_t cp;
    uint8_t g;

    while (i < n) {
        uint8_t b = p[i];
        if (b < 0x80) {
            q[i++] = b;
            continue;
        }
        if (b < 0xe0) {
            k = 2;
            cp = (uint32_t)(b & 0x1f) << 6 | (p[i + 1] & 0x3f);
        } else if (b < 0xf0) {
            k = 3;
            cp = (uint32_t)(b & 0x0f) << 12 |
                 (uint32_t)(p[i + 1] & 0x3f) << 6 | (p[i + 2] & 0x3f);
        } else {
            k = 4;
            cp = (uint32_t)(b & 0x07) << 18 |
                 (uint32_t)(p[i + 1] & 0x3f) << 12 |
                 (uint32_t)(p[i + 2] & 0x3f) << 6 | (p[i + 3] & 0x3f);
        }
        g = group_of(t, cp);
        if (g == LOOM__TG_WS)
            memcpy(q + i, p + i, k);
        else
            memcpy(q + i, t->rep[g][k - 2], k);
        i += k;
    }
}

/* ---------------------------------------------------------------------
 * Encoding
 */

/* A JIT stack and the match context that hands it to PCRE2. Without one,
 * PCRE2's JIT matches on a 32 KiB buffer on the caller's stack; on a
 * fiber (core/fiber.h: a run of `loom serve` counts its prompt's tokens
 * there) the match wrote a page at the far end of that buffer, 4 KB
 * more of every open stream's stack than its run needs. These live on
 * the heap, one per match under way at most, kept idle on the tokenizer
 * between encodes. */
typedef struct loom__tok_jit {
    struct loom__tok_jit *next;
    pcre2_match_context *mctx;
    pcre2_jit_stack *stack;
} tok_jit;

struct loom__tok_jits {
    pthread_mutex_t mu;
    tok_jit *idle;
};

/* Starts at 32 KiB (PCRE2's own stack size) and grows as far as a
 * pathological piece needs, up to 64 MiB (mapped, touched as used). */
#define JIT_STACK_START ((size_t)32 << 10)
#define JIT_STACK_MAX ((size_t)64 << 20)

static void jit_free(tok_jit *j)
{
    if (!j)
        return;
    pcre2_jit_stack_free(j->stack);
    pcre2_match_context_free(j->mctx);
    free(j);
}

int loom__tokenizer_jits_new(loom_tokenizer *t)
{
    t->jits = calloc(1, sizeof(*t->jits));
    if (!t->jits)
        return loom__error_oom();
    pthread_mutex_init(&t->jits->mu, NULL);
    return 0;
}

void loom__tokenizer_jits_free(loom_tokenizer *t)
{
    if (!t->jits)
        return;
    while (t->jits->idle) {
        tok_jit *j = t->jits->idle;
        t->jits->idle = j->next;
        jit_free(j);
    }
    pthread_mutex_destroy(&t->jits->mu);
    free(t->jits);
    t->jits = NULL;
}

/* An idle JIT stack of t, or a new one; NULL (error set) when out of
 * memory. Give it back with jit_put. */
static tok_jit *jit_take(const loom_tokenizer *t)
{
    tok_jit *j;

    pthread_mutex_lock(&t->jits->mu);
    j = t->jits->idle;
    if (j)
        t->jits->idle = j->next;
    pthread_mutex_unlock(&t->jits->mu);
    if (j)
        return j;
    j = calloc(1, sizeof(*j));
    if (j) {
        j->mctx = pcre2_match_context_create(NULL);
        j->stack = pcre2_jit_stack_create(JIT_STACK_START, JIT_STACK_MAX, NULL);
    }
    if (!j || !j->mctx || !j->stack) {
        jit_free(j);
        loom__error_oom();
        return NULL;
    }
    pcre2_jit_stack_assign(j->mctx, NULL, j->stack);
    return j;
}

static void jit_put(const loom_tokenizer *t, tok_jit *j)
{
    if (!j)
        return;
    pthread_mutex_lock(&t->jits->mu);
    j->next = t->jits->idle;
    t->jits->idle = j;
    pthread_mutex_unlock(&t->jits->mu);
}

/* Splits subject[0..n) (the regex's view) into pieces of src[0..n);
 * mctx carries the JIT stack when t->jit. */
static int encode_segment(const loom_tokenizer *t, const uint8_t *subject,
                          const uint8_t *src, size_t n, pcre2_match_data *md,
                          pcre2_match_context *mctx, sink *s)
{
    PCRE2_SIZE off = 0, *ov;
    int rc, err = 0;

    while (off < n) {
        if (t->jit)
            rc = pcre2_jit_match(t->re, subject, n, off, 0, md, mctx);
        else
            rc = pcre2_match(t->re, subject, n, off, PCRE2_NO_UTF_CHECK, md,
                             NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(rc, msg, sizeof(msg));
            return loom__error_set(LOOM_ERROR, "tokenizer: pattern: %s",
                                   (const char *)msg);
        }
        ov = pcre2_get_ovector_pointer(md);
        if (ov[1] == ov[0]) {
            /* an empty match yields no tokens; step over one character */
            off = ov[1] + 1;
            while (off < n && (subject[off] & 0xc0) == 0x80)
                off++;
            continue;
        }
        err = encode_piece(t, src + ov[0], ov[1] - ov[0], s);
        if (err < 0)
            return err;
        off = ov[1];
    }
    return err;
}

#define NOT_SEARCHED (SIZE_MAX - 1)

/* The earliest special token at or after pos; next[] caches each one's
 * next occurrence (SIZE_MAX: none left, NOT_SEARCHED: unknown), searched
 * again once pos has passed it. Returns its index or -1. */
static long next_special(const loom_tokenizer *t, const uint8_t *p,
                         size_t n, size_t pos, size_t *next)
{
    long best = -1;
    size_t k;

    for (k = 0; k < t->n_specials; k++) {
        if (next[k] == NOT_SEARCHED ||
            (next[k] != SIZE_MAX && next[k] < pos)) {
            const uint8_t *f = memmem(p + pos, n - pos, t->specials[k].text,
                                      t->specials[k].len);
            next[k] = f ? (size_t)(f - p) : SIZE_MAX;
        }
        if (next[k] != SIZE_MAX && (best < 0 || next[k] < next[best]))
            best = (long)k;
    }
    return best;
}

static int encode(const loom_tokenizer *t, const char *text, size_t len,
                  int allow_special, sink *s)
{
    const uint8_t *src = (const uint8_t *)text, *subject;
    uint8_t *fixed = NULL, *norm = NULL;
    size_t *next = NULL, pos = 0, k, n = len;
    pcre2_match_data *md = NULL;
    tok_jit *jit = NULL;
    int ascii, err = 0;

    if (len > LOOM_TOKENIZER_MAX_INPUT)
        return loom__error_set(LOOM_ETOOLARGE,
                               "tokenizer: input of %zu bytes is over the "
                               "limit of %zu", len,
                               (size_t)LOOM_TOKENIZER_MAX_INPUT);
    if (!len)
        return 0;
    if (loom__tokenizer_utf8_check(src, n, &ascii) < 0) {
        err = utf8_replace(src, n, &fixed, &n);
        if (err < 0)
            goto cleanup;
        src = fixed;
        ascii = 0;
    }
    subject = src;
    if (!ascii && t->stage1) {
        norm = malloc(n);
        if (!norm) {
            err = loom__error_oom();
            goto cleanup;
        }
        normalise(t, src, n, norm);
        subject = norm;
    }
    md = pcre2_match_data_create(1, NULL);
    if (!md) {
        err = loom__error_oom();
        goto cleanup;
    }
    if (t->jit && !(jit = jit_take(t))) {
        err = LOOM_ENOMEM;
        goto cleanup;
    }
    if (allow_special && t->n_specials) {
        next = malloc(t->n_specials * sizeof(*next));
        if (!next) {
            err = loom__error_oom();
            goto cleanup;
        }
        for (k = 0; k < t->n_specials; k++)
            next[k] = NOT_SEARCHED;
    }
    for (;;) {
        long sp = next ? next_special(t, src, n, pos, next) : -1;
        size_t end = sp >= 0 ? next[sp] : n;

        err = encode_segment(t, subject + pos, src + pos, end - pos, md,
                             jit ? jit->mctx : NULL, s);
        if (err < 0 || sp < 0)
            break;
        err = sink_push(s, t->specials[sp].id);
        if (err < 0)
            break;
        pos = end + t->specials[sp].len;
    }
cleanup:
    jit_put(t, jit);
    pcre2_match_data_free(md);
    free(next);
    free(norm);
    free(fixed);
    return err;
}

size_t loom_tokenizer_count(const loom_tokenizer *t, const char *text,
                            size_t len)
{
    sink s;
    int err;

    if (!t || (!text && len))
        return (size_t)-1;
    memset(&s, 0, sizeof(s));
    err = encode(t, text, len, 0, &s);
    sink_scratch_free(&s);
    return err < 0 ? (size_t)-1 : s.n;
}

int loom_tokenizer_encode(const loom_tokenizer *t, const char *text,
                          size_t len, int allow_special, uint32_t **ids,
                          size_t *n)
{
    sink s;
    int err;

    if (!t || (!text && len) || !ids || !n)
        return loom__error_set(LOOM_EINVALID,
                               "loom_tokenizer_encode: NULL argument");
    if (len > LOOM_TOKENIZER_MAX_INPUT)
        return loom__error_set(LOOM_ETOOLARGE,
                               "tokenizer: input of %zu bytes is over the "
                               "limit of %zu", len,
                               (size_t)LOOM_TOKENIZER_MAX_INPUT);
    memset(&s, 0, sizeof(s));
    s.cap = len / 3 + 16;
    s.ids = malloc(s.cap * sizeof(*s.ids));
    if (!s.ids)
        return loom__error_oom();
    err = encode(t, text, len, allow_special, &s);
    sink_scratch_free(&s);
    if (err < 0) {
        free(s.ids);
        return err;
    }
    *ids = s.ids;
    *n = s.n;
    return 0;
}

int loom_tokenizer_decode(const loom_tokenizer *t, const uint32_t *ids,
                          size_t n, loom_buf *out)
{
    size_t i, k, total = 0;
    int err;

    if (!t || (!ids && n) || !out)
        return loom__error_set(LOOM_EINVALID,
                               "loom_tokenizer_decode: NULL argument");
    /* check every id first so that a bad one leaves out unchanged */
    for (i = 0; i < n; i++) {
        if (ids[i] < t->n_ids && t->len[ids[i]]) {
            total += t->len[ids[i]];
            continue;
        }
        for (k = 0; k < t->n_specials; k++)
            if (t->specials[k].id == ids[i])
                break;
        if (k == t->n_specials)
            return loom__error_set(LOOM_EINVALID,
                                   "tokenizer: %s has no token %u",
                                   t->name, ids[i]);
        total += t->specials[k].len;
    }
    if (total > LOOM_TOKENIZER_MAX_INPUT)
        return loom__error_set(LOOM_ETOOLARGE,
                               "tokenizer: decoded text over %zu bytes",
                               (size_t)LOOM_TOKENIZER_MAX_INPUT);
    if (out->len + total > out->max || total > out->max)
        return loom__error_set(LOOM_ETOOLARGE,
                               "buffer limit of %zu bytes exceeded",
                               out->max);
    for (i = 0; i < n; i++) {
        if (ids[i] < t->n_ids && t->len[ids[i]]) {
            err = loom_buf_put(out, t->bytes + t->off[ids[i]],
                               t->len[ids[i]]);
        } else {
            for (k = 0; t->specials[k].id != ids[i]; k++)
                ;
            err = loom_buf_put(out, t->specials[k].text,
                               t->specials[k].len);
        }
        if (err < 0)
            return err;
    }
    return 0;
}

long loom_tokenizer_special_id(const loom_tokenizer *t, const char *text)
{
    size_t k;

    for (k = 0; t && text && k < t->n_specials; k++)
        if (!strcmp(t->specials[k].text, text))
            return (long)t->specials[k].id;
    return -1;
}

const char *loom_tokenizer_name(const loom_tokenizer *t)
{
    return t ? t->name : "";
}
