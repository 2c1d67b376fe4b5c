/*
 * The OpenAI Chat Completions answer decoder: no I/O, bytes in, events out
 * (nghttp2's model), so that tests and fuzzers feed it directly and the
 * adapter only moves bytes.
 *
 * A streamed body goes through the SSE parser; each `data:` payload is one
 * chat.completion.chunk. Text and reasoning deltas are passed on at once.
 * Tool calls arrive in fragments keyed by `index` (id, type and name only
 * on a call's first fragment, arguments split anywhere, several calls
 * interleaved), so they are assembled in slots by index and handed over
 * whole, once, when the answer ends. Usage is kept and emitted once at the
 * end too, because some servers repeat running totals on every chunk and a
 * consumer summing USAGE events must not count them twice.
 *
 * A non-streamed chat.completion is decoded into the same events so the
 * adapter has one path for both. Every buffer has a limit (text,
 * reasoning, arguments per call, number of calls, SSE line and event).
 *
 * Chunks take a fast path. jansson builds a whole tree for each one (an
 * allocation per value and a hashtable per object, all freed again a
 * moment later), which was two fifths of loom's cost per model call, for
 * the handful of fields read here. Instead, jsmn (a Debian package: a
 * header-only tokenizer that allocates nothing) splits the chunk into
 * tokens in an array kept by the decoder; the code below checks that the
 * tokens tile the text exactly as the JSON grammar says (jsmn alone
 * accepts things like `[1,]`), that every string is valid UTF-8 with valid
 * escapes and every number one jansson reads without overflow, and then
 * reads the few fields it needs through the `jv` accessors, which answer
 * exactly as jansson's would on the same text (duplicate keys: the last
 * wins). Strings are copied (unescaped when they hold a backslash) into a
 * scratch area on first use. Anything the fast path is not sure of (a
 * chunk jsmn or these checks refuse, more than FAST_MAX_TOKENS tokens, a
 * key with escapes, a number near the limits, a root that is not an
 * object, an "error" member) goes to jansson, so errors and their messages
 * are jansson's, unchanged. The decoding logic itself is written once over
 * `jv` and serves both paths; loom__openai_decoder_set_jansson_only()
 * forces the jansson path so tests can compare the two on every input.
 * The chunks of a stream begin alike, so a decoder keeps what tokenizing
 * and checking the head they share left, and a chunk that begins with it
 * starts from there (chunk_prefix): about two fifths less work a chunk.
 */
#include "core/error.h"
#include "llm/answer.h"
#include "llm/attempt.h"
#include "llm/openai.h"
#include "loom/buf.h"
#include "loom/sse.h"

#define JSMN_STATIC
#define JSMN_STRICT
#define JSMN_PARENT_LINKS
#include <jsmn.h>

#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *id;
    char *name;
    loom_buf args;
    int present;
} call_slot;

/* Most tokens a chunk may have on the fast path (a usual chunk has 20 to
 * 40); a bigger one goes to jansson. */
#define FAST_MAX_TOKENS 256
/* Scratch kept inside the decoder; longer chunks use the heap. */
#define FAST_INLINE_SCRATCH 2048

/* What a token holds, refined from jsmn's types. */
enum {
    K_NONE = 0, /* absent */
    K_OBJECT,
    K_ARRAY,
    K_STRING,
    K_INT,
    K_REAL,
    K_TRUE,
    K_FALSE,
    K_NULL
};

/* One chunk on the fast path: its text, tokens and decoded strings. */
typedef struct {
    const char *js;
    size_t len;
    int ntok;
    jsmntok_t tok[FAST_MAX_TOKENS];
    int next[FAST_MAX_TOKENS];   /* first token after this one's subtree */
    int str_at[FAST_MAX_TOKENS]; /* decoded string in scratch; -1: not yet */
    int str_len[FAST_MAX_TOKENS];
    int open[FAST_MAX_TOKENS];  /* while checking: containers still open */
    int items[FAST_MAX_TOKENS]; /* and how many tokens each holds so far */
    unsigned char kind[FAST_MAX_TOKENS];
    unsigned char esc[FAST_MAX_TOKENS]; /* string holds a backslash */
    char *scratch;                      /* inline, or heap_scratch */
    size_t scratch_len;
    char *heap_scratch;
    size_t heap_cap;
    char inline_scratch[FAST_INLINE_SCRATCH];
} fast_doc;

/* Where a check of a chunk's tokens stands: the next token, the text
 * position after the last one and how many containers are open (their
 * tokens in fast_doc.open). */
typedef struct {
    int i;
    size_t pos;
    int depth;
} check_at;

/* The head of a chunk a decoder keeps (see chunk_prefix), and the most
 * tokens it covers. */
#define PREFIX_MAX_BYTES 256
#define PREFIX_MAX_TOKENS 32
/* A shorter common head is not worth keeping a state for. */
#define PREFIX_MIN_BYTES 32

/*
 * The chunks of one stream mostly begin alike (id, object, created,
 * model, then "choices":[{"index":0,"delta":{), often for three fifths of
 * their bytes. A decoder keeps the head that the last chunks shared and,
 * once it has one (has_state), what tokenizing and checking those bytes
 * left: jsmn's parser and its tokens (the containers still open, without
 * an end, as jsmn wants them to go on), and the check's state with what
 * it set for those tokens. A chunk that begins with the same bytes starts
 * from there: what jsmn and the checks do with a text's first bytes does
 * not depend on what follows them (a string or number cut at the end of
 * the head is left for later by jsmn, and the head then ends before it),
 * so the tokens, checks and outcome are those of the whole chunk. Without
 * a state, text holds the last chunk's head to compare the next with.
 */
typedef struct {
    size_t len; /* bytes of text */
    int has_state;
    char text[PREFIX_MAX_BYTES];
    jsmn_parser p;
    jsmntok_t tok[PREFIX_MAX_TOKENS];
    check_at c;
    int next[PREFIX_MAX_TOKENS];
    int open[PREFIX_MAX_TOKENS];
    int items[PREFIX_MAX_TOKENS];
    unsigned char kind[PREFIX_MAX_TOKENS];
    unsigned char esc[PREFIX_MAX_TOKENS];
} chunk_prefix;

struct loom__openai_decoder {
    loom__llm_answer a; /* first: the part every decoder has */
    loom__openai_limits lim;
    call_slot *slots; /* by upstream index; gaps have present == 0 */
    size_t slots_len;
    size_t ncalls;

    int positional; /* a whole message: each call is its own, in order */
    int saw_done;   /* data: [DONE] */

    fast_doc *fast;     /* made on the first chunk */
    chunk_prefix *head; /* made on the first chunk; NULL: out of memory */
    int jansson_only;   /* tests: never take the fast path */
    size_t fast_chunks;
    size_t resumed_chunks; /* chunks that began from head's state */
};

/* What the shared part (llm/answer.h) calls back; defined at the end. */
static const loom__llm_answer_kind openai_kind;

/* The defaults of the limits (loom__llm_answer_kind.limits). */
static size_t limits_of(void *p, size_t *max_text)
{
    loom__openai_limits *lim = p;
    size_t big =
        loom__llm_limits(&lim->max_tool_calls, &lim->max_args, &lim->max_text);

    *max_text = lim->max_text;
    /* One chunk may carry a whole answer (some servers do not split), and
     * JSON escaping may double it: leave room, but stay bounded. */
    return 2 * big + 65536;
}

int loom__openai_decoder_new(loom__openai_decoder **out,
                             const loom__openai_limits *limits,
                             loom_llm_event_cb cb, void *payload)
{
    void *d = NULL;
    int rc = loom__llm_answer_new(&d, sizeof(**out), &openai_kind, limits, cb,
                                  payload);

    *out = d;
    return rc;
}

void loom__openai_decoder_set_jansson_only(loom__openai_decoder *d, int on)
{
    d->jansson_only = on;
}

size_t loom__openai_decoder_fast_chunks(const loom__openai_decoder *d)
{
    return d->fast_chunks;
}

size_t loom__openai_decoder_resumed_chunks(const loom__openai_decoder *d)
{
    return d->resumed_chunks;
}

/* ---- the fast path: checking a chunk's tokens ------------------------ */

static size_t skip_ws(const char *js, size_t pos, size_t len)
{
    while (pos < len && (js[pos] == ' ' || js[pos] == '\t' || js[pos] == '\n' ||
                         js[pos] == '\r'))
        pos++;
    return pos;
}

/* The value of 4 hex digits at s (n bytes left), -1 when not that. */
static long hex4(const unsigned char *s, size_t n)
{
    long v = 0;

    if (n < 4)
        return -1;
    for (int i = 0; i < 4; i++) {
        unsigned c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (long)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (long)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (long)(c - 'A' + 10);
        else
            return -1;
    }
    return v;
}

/*
 * Checks the body of a string token as jansson reads strings: no control
 * bytes, valid UTF-8, known escapes, \u escapes with paired surrogates and
 * no \u0000 (jansson refuses NUL without JSON_ALLOW_NUL). Returns -1 when
 * jansson would refuse it, 1 when it holds escapes, 0 when it is plain.
 */
static int check_string(const unsigned char *s, size_t n)
{
    /* 1 for the bytes that need a closer look: control bytes, '"', '\\'
     * and every non-ASCII byte. */
    static const unsigned char special[256] = {
        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* 0x00 */
        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* 0x10 */
        0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0x20 '"' */
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0x30 */
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0x40 */
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, /* 0x50 '\\' */
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0x60 */
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* 0x70 */
        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, /* 0x80 */
        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
        1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    size_t i = 0, k;
    int esc = 0;
    long cp, lo;

    while (i < n) {
        unsigned c = s[i];
        if (!special[c]) {
            i++;
            continue;
        }
        if (c < 0x20 || c == '"')
            return -1;
        if (c != '\\') {
            if (!(k = loom__llm_utf8_seq(s + i, n - i)))
                return -1;
            i += k;
            continue;
        }
        esc = 1;
        if (i + 1 >= n)
            return -1;
        switch (s[i + 1]) {
        case '"':
        case '\\':
        case '/':
        case 'b':
        case 'f':
        case 'n':
        case 'r':
        case 't':
            i += 2;
            break;
        case 'u':
            cp = hex4(s + i + 2, n - i - 2);
            if (cp <= 0 || (cp >= 0xDC00 && cp <= 0xDFFF))
                return -1;
            i += 6;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (i + 1 >= n || s[i] != '\\' || s[i + 1] != 'u')
                    return -1;
                lo = hex4(s + i + 2, n - i - 2);
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return -1;
                i += 6;
            }
            break;
        default:
            return -1;
        }
    }
    return esc;
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

/*
 * The kind of a primitive token, 0 when it is not one jansson reads to the
 * same value: true, false, null, an integer that fits json_int_t, or a
 * real well inside a double's range (jansson fails on overflow; a real
 * near the limit is left to it).
 */
static int check_primitive(const char *s, size_t n)
{
    size_t i = 0, int_digits;
    long exp = 0;
    int neg = 0, exp_neg = 0, real = 0;

    if (n == 4 && memcmp(s, "true", 4) == 0)
        return K_TRUE;
    if (n == 5 && memcmp(s, "false", 5) == 0)
        return K_FALSE;
    if (n == 4 && memcmp(s, "null", 4) == 0)
        return K_NULL;
    if (i < n && s[i] == '-') {
        neg = 1;
        i++;
    }
    if (i < n && s[i] == '0')
        i++;
    else if (i < n && s[i] >= '1' && s[i] <= '9')
        while (i < n && is_digit(s[i]))
            i++;
    else
        return 0;
    int_digits = i - (size_t)neg;
    if (i < n && s[i] == '.') {
        real = 1;
        if (++i >= n || !is_digit(s[i]))
            return 0;
        while (i < n && is_digit(s[i]))
            i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        real = 1;
        if (++i < n && (s[i] == '+' || s[i] == '-'))
            exp_neg = s[i++] == '-';
        if (i >= n || !is_digit(s[i]))
            return 0;
        while (i < n && is_digit(s[i])) {
            if (exp < 100000)
                exp = exp * 10 + (s[i] - '0');
            i++;
        }
    }
    if (i != n)
        return 0;
    if (real) {
        /* |value| < 10^(int_digits + exp): far from DBL_MAX (~1.8e308)
         * when that is at most 10^300. */
        if ((long)int_digits + (exp_neg ? -exp : exp) > 300)
            return 0;
        return K_REAL;
    }
    /* A JSON integer has no leading zeros, so its digit count says
     * whether it fits in 64 bits; at 19 digits compare. */
    if (int_digits > 19)
        return 0;
    if (int_digits == 19 &&
        memcmp(s + neg, neg ? "9223372036854775808" : "9223372036854775807",
               19) > 0)
        return 0;
    return K_INT;
}

/* Ends the innermost open container: its closing bracket must come next. */
static int close_container(fast_doc *f, int depth, size_t *pos, int next)
{
    int c = f->open[depth - 1];
    char want = f->kind[c] == K_OBJECT ? '}' : ']';

    *pos = skip_ws(f->js, *pos, f->len);
    /* An object's tokens come in pairs: an odd count is a key alone. */
    if (f->kind[c] == K_OBJECT && (f->items[depth - 1] & 1))
        return -1;
    if (*pos >= f->len || f->js[*pos] != want ||
        (size_t)f->tok[c].end != *pos + 1)
        return -1;
    *pos += 1;
    f->next[c] = next;
    return 0;
}

/*
 * Checks that jsmn's tokens tile the text exactly as JSON's grammar
 * allows (separators, brackets, nothing after the root), and what each
 * token holds; fills kind, next and esc. Goes from where *at stands to
 * token stop, where it leaves *at; at the last token it checks the end
 * of the text too. jsmn's own checks are looser
 * (it takes `[1,]`, `{"a" 1}` and keys that are not strings), so these are
 * what make a chunk that passes one jansson would read the same way.
 */
static int check_tokens(fast_doc *f, check_at *at, int stop)
{
    const char *js = f->js;
    size_t pos = at->pos, len = f->len;
    int depth = at->depth, i;

    for (i = at->i; i < stop; i++) {
        const jsmntok_t *t = &f->tok[i];
        int is_key = 0, r;

        if (t->start < 0 || t->end < t->start)
            return -1;
        while (depth > 0 && f->tok[f->open[depth - 1]].end <= t->start) {
            if (close_container(f, depth, &pos, i))
                return -1;
            depth--;
        }
        if (depth == 0 && i > 0)
            return -1; /* a second value after the root */
        pos = skip_ws(js, pos, len);
        if (depth > 0) {
            int c = f->open[depth - 1], n = f->items[depth - 1]++;
            if (f->kind[c] == K_OBJECT && (n & 1)) {
                if (pos >= len || js[pos] != ':')
                    return -1;
                pos = skip_ws(js, pos + 1, len);
            } else if (n > 0) {
                if (pos >= len || js[pos] != ',')
                    return -1;
                pos = skip_ws(js, pos + 1, len);
            }
            is_key = f->kind[c] == K_OBJECT && !(n & 1);
        }
        f->next[i] = i + 1;
        switch (t->type) {
        case JSMN_STRING:
            if (pos >= len || js[pos] != '"' || (size_t)t->start != pos + 1 ||
                (size_t)t->end >= len || js[t->end] != '"')
                return -1;
            r = check_string((const unsigned char *)js + t->start,
                             (size_t)(t->end - t->start));
            /* Keys are compared raw: one with escapes goes to jansson. */
            if (r < 0 || (is_key && r))
                return -1;
            f->kind[i] = K_STRING;
            f->esc[i] = (unsigned char)r;
            f->str_at[i] = -1;
            pos = (size_t)t->end + 1;
            break;
        case JSMN_PRIMITIVE:
            if (is_key || (size_t)t->start != pos)
                return -1;
            r = check_primitive(js + t->start, (size_t)(t->end - t->start));
            if (!r)
                return -1;
            f->kind[i] = (unsigned char)r;
            pos = (size_t)t->end;
            break;
        case JSMN_OBJECT:
        case JSMN_ARRAY:
            if (is_key || (size_t)t->start != pos ||
                js[pos] != (t->type == JSMN_OBJECT ? '{' : '['))
                return -1;
            f->kind[i] = t->type == JSMN_OBJECT ? K_OBJECT : K_ARRAY;
            f->open[depth] = i;
            f->items[depth] = 0;
            depth++;
            pos++;
            break;
        default:
            return -1;
        }
    }
    at->i = i;
    at->pos = pos;
    at->depth = depth;
    if (stop < f->ntok)
        return 0;
    while (depth > 0) {
        if (close_container(f, depth, &pos, f->ntok))
            return -1;
        depth--;
    }
    return skip_ws(js, pos, len) == len ? 0 : -1;
}

/*
 * A fast_doc is about 12 KiB and only needed while one chunk is decoded,
 * so a decoder holds one for a chunk only: each thread keeps one spare
 * (freed with the thread), and a decoder that finds none (another one on
 * this thread is mid-chunk, parked on a fiber) makes its own. An open
 * stream then costs no fast_doc between its chunks.
 */
static pthread_key_t fast_key;
static pthread_once_t fast_once = PTHREAD_ONCE_INIT;
static int fast_key_ok;

static void fast_doc_free(void *p)
{
    fast_doc *f = p;

    if (f)
        free(f->heap_scratch);
    free(f);
}

static void fast_key_init(void)
{
    fast_key_ok = pthread_key_create(&fast_key, fast_doc_free) == 0;
}

/* This thread's spare fast_doc, taken; NULL when it has none. */
static fast_doc *fast_take(void)
{
    fast_doc *f;

    pthread_once(&fast_once, fast_key_init);
    if (!fast_key_ok || !(f = pthread_getspecific(fast_key)))
        return NULL;
    pthread_setspecific(fast_key, NULL);
    return f;
}

/* Ends d's hold on its fast_doc: the thread's spare if it has none. */
static void fast_give(loom__openai_decoder *d)
{
    fast_doc *f = d->fast;

    d->fast = NULL;
    if (!f)
        return;
    if (fast_key_ok && !pthread_getspecific(fast_key) &&
        pthread_setspecific(fast_key, f) == 0)
        return;
    fast_doc_free(f);
}

/* How many first bytes js shares with h's text. */
static size_t head_common(const chunk_prefix *h, const char *js, size_t len)
{
    size_t n = len < h->len ? len : h->len, i = 0;

    while (i < n && js[i] == h->text[i])
        i++;
    return i;
}

/* When js begins with the head's text and the head has a state, starts
 * p, f's first tokens and *at from it and returns 1; else 0. */
static int head_resume(loom__openai_decoder *d, fast_doc *f, const char *js,
                       size_t len, jsmn_parser *p, check_at *at)
{
    const chunk_prefix *h = d->head;
    size_t k;

    if (!h || !h->has_state || len < h->len || memcmp(js, h->text, h->len) != 0)
        return 0;
    k = h->p.toknext;
    *p = h->p;
    *at = h->c;
    memcpy(f->tok, h->tok, k * sizeof(*f->tok));
    memcpy(f->next, h->next, k * sizeof(*f->next));
    memcpy(f->kind, h->kind, k);
    memcpy(f->esc, h->esc, k);
    for (size_t i = 0; i < k; i++)
        f->str_at[i] = -1;
    memcpy(f->open, h->open, (size_t)at->depth * sizeof(*f->open));
    memcpy(f->items, h->items, (size_t)at->depth * sizeof(*f->items));
    d->resumed_chunks++;
    return 1;
}

/*
 * Tokenizes the first bytes js shares with the head's text and keeps
 * jsmn's state there in the head: returns how many tokens that made (the
 * head then waits for the check's state, head_keep_check), 0 when it
 * keeps none (p is then either untouched or where jsmn stopped, to go
 * on), -1 when jsmn refused those bytes. Without a common start worth
 * keeping, the head becomes js's first bytes, to compare the next chunk
 * with.
 */
static int head_start(loom__openai_decoder *d, fast_doc *f, const char *js,
                      size_t len, jsmn_parser *p)
{
    chunk_prefix *h = d->head;
    size_t common;
    int r;

    if (!h && (h = d->head = malloc(sizeof(*h))) != NULL)
        h->len = 0;
    if (!h)
        return 0;
    h->has_state = 0;
    common = head_common(h, js, len);
    if (common < PREFIX_MIN_BYTES) {
        h->len = len < PREFIX_MAX_BYTES ? len : PREFIX_MAX_BYTES;
        memcpy(h->text, js, h->len);
        return 0;
    }
    /* A chunk like the last one whole: its head stops before its end. */
    if (common == len)
        common--;
    r = jsmn_parse(p, js, common, f->tok, FAST_MAX_TOKENS);
    if (r != JSMN_ERROR_PART)
        return r < 0 ? -1 : 0; /* a root that ends in the head: go on */
    if (p->toknext < 1 || p->toknext > PREFIX_MAX_TOKENS ||
        p->pos < PREFIX_MIN_BYTES)
        return 0;
    /* text[0, common) is js's, and jsmn stopped at or before common. */
    h->len = p->pos;
    h->p = *p;
    memcpy(h->tok, f->tok, p->toknext * sizeof(*f->tok));
    return (int)p->toknext;
}

/* Completes the head's state with the check's, stopped at its last
 * token. */
static void head_keep_check(chunk_prefix *h, const fast_doc *f,
                            const check_at *at)
{
    size_t k = (size_t)at->i;

    h->c = *at;
    memcpy(h->next, f->next, k * sizeof(*f->next));
    memcpy(h->kind, f->kind, k);
    memcpy(h->esc, f->esc, k);
    memcpy(h->open, f->open, (size_t)at->depth * sizeof(*f->open));
    memcpy(h->items, f->items, (size_t)at->depth * sizeof(*f->items));
    h->has_state = 1;
}

/*
 * Tokenizes and checks one chunk for the fast path, from the state of
 * the head it shares with the last chunks when it has one (see
 * chunk_prefix). 0 when the chunk is a JSON object the fast path reads
 * exactly as jansson would; -1 sends it to jansson (never an error of its
 * own).
 */
static int fast_parse(loom__openai_decoder *d, const char *js, size_t len)
{
    fast_doc *f = d->fast;
    jsmn_parser p;
    check_at at = {0, 0, 0};
    size_t need;
    int n, k = 0;

    if (len > INT_MAX / 2)
        return -1; /* jsmn keeps offsets in int */
    if (!f && (f = fast_take()) == NULL) {
        if (!(f = malloc(sizeof(*f))))
            return -1;
        f->heap_scratch = NULL;
        f->heap_cap = 0;
    }
    d->fast = f;
    jsmn_init(&p);
    if (!head_resume(d, f, js, len, &p, &at) &&
        (k = head_start(d, f, js, len, &p)) < 0)
        return -1;
    n = jsmn_parse(&p, js, len, f->tok, FAST_MAX_TOKENS);
    if (n < 1)
        return -1;
    f->js = js;
    f->len = len;
    f->ntok = n;
    if (k > 0) {
        if (check_tokens(f, &at, k) != 0)
            return -1;
        head_keep_check(d->head, f, &at);
    }
    if (check_tokens(f, &at, n) != 0 || f->kind[0] != K_OBJECT)
        return -1;
    /* Decoded strings are never longer than their text: reserving the
     * chunk's size (plus a NUL each) once means pointers handed out stay
     * valid for the whole chunk. */
    need = len + (size_t)n + 1;
    if (need <= FAST_INLINE_SCRATCH) {
        f->scratch = f->inline_scratch;
    } else {
        if (need > f->heap_cap) {
            char *h = realloc(f->heap_scratch, need);
            if (!h)
                return -1;
            f->heap_scratch = h;
            f->heap_cap = need;
        }
        f->scratch = f->heap_scratch;
    }
    f->scratch_len = 0;
    return 0;
}

/* Writes the UTF-8 form of cp at out; returns its length. */
static size_t utf8_put(char *out, unsigned long cp)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Unescapes a string body that check_string() passed; returns the
 * length written to out. */
static size_t unescape(char *out, const unsigned char *s, size_t n)
{
    size_t i = 0, o = 0;
    unsigned long cp, lo;

    while (i < n) {
        if (s[i] != '\\') {
            out[o++] = (char)s[i++];
            continue;
        }
        switch (s[i + 1]) {
        case 'b':
            out[o++] = '\b';
            break;
        case 'f':
            out[o++] = '\f';
            break;
        case 'n':
            out[o++] = '\n';
            break;
        case 'r':
            out[o++] = '\r';
            break;
        case 't':
            out[o++] = '\t';
            break;
        case 'u':
            cp = (unsigned long)hex4(s + i + 2, n - i - 2);
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                lo = (unsigned long)hex4(s + i + 8, n - i - 8);
                cp = ((cp - 0xD800) << 10) + (lo - 0xDC00) + 0x10000;
                i += 6;
            }
            o += utf8_put(out + o, cp);
            i += 6;
            continue;
        default: /* " \ / */
            out[o++] = (char)s[i + 1];
            break;
        }
        i += 2;
    }
    return o;
}

/* ---- values: a jansson value or a fast-path token ---------------------- */

/*
 * A value the decoding logic reads: j on the jansson path, token t (>= 0)
 * of d->fast on the fast path; neither when absent. The jv_ functions
 * answer as the jansson functions they are named after.
 */
typedef struct {
    const json_t *j;
    int t;
} jv;

static const jv JV_NONE = {NULL, -1};

static jv jv_json(const json_t *j)
{
    jv v = {j, -1};
    return v;
}

static jv jv_tok(int t)
{
    jv v = {NULL, t};
    return v;
}

static int jv_kind(const loom__openai_decoder *d, jv v)
{
    if (v.t >= 0)
        return d->fast->kind[v.t];
    if (!v.j)
        return K_NONE;
    switch (json_typeof(v.j)) {
    case JSON_OBJECT:
        return K_OBJECT;
    case JSON_ARRAY:
        return K_ARRAY;
    case JSON_STRING:
        return K_STRING;
    case JSON_INTEGER:
        return K_INT;
    case JSON_REAL:
        return K_REAL;
    case JSON_TRUE:
        return K_TRUE;
    case JSON_FALSE:
        return K_FALSE;
    default:
        return K_NULL;
    }
}

static int jv_present(jv v)
{
    return v.j || v.t >= 0;
}

/* json_object_get: the member's value, none when o is not an object. */
static jv jv_get(const loom__openai_decoder *d, jv o, const char *key)
{
    const fast_doc *f = d->fast;
    size_t klen;
    int found = -1;

    if (o.t < 0)
        return jv_json(o.j ? json_object_get(o.j, key) : NULL);
    if (f->kind[o.t] != K_OBJECT)
        return JV_NONE;
    klen = strlen(key);
    /* Keys and values alternate; a duplicate key: the last one wins, as
     * in jansson. */
    for (int k = o.t + 1; k < f->next[o.t]; k = f->next[k + 1]) {
        const jsmntok_t *t = &f->tok[k];
        if ((size_t)(t->end - t->start) == klen && f->js[t->start] == key[0] &&
            memcmp(f->js + t->start, key, klen) == 0)
            found = k + 1;
    }
    return jv_tok(found);
}

/* The first element of an array (none when empty or not an array); *it
 * keeps the place for jv_next. */
static jv jv_first(const loom__openai_decoder *d, jv a, size_t *it)
{
    const fast_doc *f = d->fast;

    *it = 0;
    if (a.t < 0)
        return jv_json(a.j ? json_array_get(a.j, 0) : NULL);
    if (f->kind[a.t] != K_ARRAY || f->next[a.t] == a.t + 1)
        return JV_NONE;
    *it = (size_t)a.t + 1;
    return jv_tok(a.t + 1);
}

static jv jv_next(const loom__openai_decoder *d, jv a, size_t *it)
{
    const fast_doc *f = d->fast;
    int k;

    if (a.t < 0)
        return jv_json(json_array_get(a.j, ++*it));
    k = f->next[*it];
    if (k >= f->next[a.t])
        return JV_NONE;
    *it = (size_t)k;
    return jv_tok(k);
}

/* json_string_value (NUL-terminated, valid until the chunk is done) and
 * json_string_length; NULL when v is not a string. */
static const char *jv_str(const loom__openai_decoder *d, jv v, size_t *len)
{
    fast_doc *f = d->fast;
    const jsmntok_t *t;
    char *out;
    size_t n;

    if (v.t < 0) {
        if (!json_is_string(v.j))
            return NULL;
        if (len)
            *len = json_string_length(v.j);
        return json_string_value(v.j);
    }
    if (f->kind[v.t] != K_STRING)
        return NULL;
    if (f->str_at[v.t] < 0) {
        t = &f->tok[v.t];
        out = f->scratch + f->scratch_len;
        n = (size_t)(t->end - t->start);
        if (f->esc[v.t])
            n = unescape(out, (const unsigned char *)f->js + t->start, n);
        else
            memcpy(out, f->js + t->start, n);
        out[n] = '\0';
        f->str_at[v.t] = (int)f->scratch_len;
        f->str_len[v.t] = (int)n;
        f->scratch_len += n + 1;
    }
    if (len)
        *len = (size_t)f->str_len[v.t];
    return f->scratch + f->str_at[v.t];
}

/* json_integer_value: 0 when v is not an integer. */
static json_int_t jv_int(const loom__openai_decoder *d, jv v)
{
    const fast_doc *f = d->fast;
    const char *s;
    json_int_t x = 0;
    int neg;

    if (v.t < 0)
        return json_integer_value(v.j);
    if (f->kind[v.t] != K_INT)
        return 0;
    s = f->js + f->tok[v.t].start;
    neg = *s == '-';
    /* Summed on the negative side, where the range is one larger;
     * check_primitive() made sure it fits. */
    for (s += neg; s < f->js + f->tok[v.t].end; s++)
        x = x * 10 - (*s - '0');
    return neg ? x : -x;
}

/* Parses token t's text with jansson, for the rare reads (a real's value,
 * an object re-serialized) where that is the exact answer. New reference,
 * NULL on OOM. */
static json_t *jv_load(const loom__openai_decoder *d, int t)
{
    const jsmntok_t *tk = &d->fast->tok[t];

    return json_loadb(d->fast->js + tk->start, (size_t)(tk->end - tk->start),
                      JSON_DECODE_ANY, NULL);
}

/* json_real_value: 0 when v is not a real. */
static double jv_real(const loom__openai_decoder *d, jv v)
{
    json_t *j;
    double r;

    if (v.t < 0)
        return json_real_value(v.j);
    if (d->fast->kind[v.t] != K_REAL)
        return 0;
    j = jv_load(d, v.t);
    r = json_real_value(j);
    json_decref(j);
    return r;
}

/* json_dumps(v, JSON_COMPACT): NULL for a scalar, as there. */
static char *jv_dump(const loom__openai_decoder *d, jv v)
{
    json_t *j;
    char *s;

    if (v.t < 0)
        return json_dumps(v.j, JSON_COMPACT);
    if (!(j = jv_load(d, v.t)))
        return NULL;
    s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

/* ---- decoding, over jv ------------------------------------------------ */

static const char *str_of(const loom__openai_decoder *d, jv o, const char *key)
{
    return jv_str(d, jv_get(d, o, key), NULL);
}

/* A count from o[key] (see loom__llm_count). */
static long num_of(const loom__openai_decoder *d, jv o, const char *key)
{
    jv v = jv_get(d, o, key);

    if (jv_kind(d, v) == K_INT)
        return loom__llm_count_int(jv_int(d, v));
    if (jv_kind(d, v) == K_REAL)
        return loom__llm_count_real(jv_real(d, v));
    return 0;
}

static int dup_into(char **dst, const char *src, size_t len)
{
    free(*dst);
    *dst = strndup(src, len);
    return *dst ? 0 : loom__error_oom();
}

/* An error inside the stream (a chunk with "error", or `event: error`);
 * always on the jansson path. */
static int stream_error(loom__openai_decoder *d, const char *data, size_t len,
                        const json_t *obj)
{
    const char *msg, *type;

    loom__openai_error_fields(obj, &msg, &type);
    return loom__llm_answer_error(&d->a, LOOM_UPSTREAM_STREAM, 0, msg, type,
                                  data, len, 1);
}

static int add_json_text(loom__openai_decoder *d, loom_llm_event_type type,
                         jv v)
{
    size_t len = 0;
    const char *s = jv_str(d, v, &len);

    if (!s)
        return 0;
    return loom__llm_answer_text(&d->a, type, s, len);
}

/* Finds the slot a fragment belongs to (see the file comment), making it
 * when new. */
static int find_slot(loom__openai_decoder *d, jv tc, const char *id,
                     size_t *out)
{
    jv jidx = jv_get(d, tc, "index");
    size_t i;

    if (jv_present(jidx) && jv_kind(d, jidx) != K_NULL) {
        json_int_t v = jv_int(d, jidx);
        if (jv_kind(d, jidx) != K_INT || v < 0)
            return loom__llm_answer_fail(
                &d->a,
                loom__error_set(LOOM_EPROTO, "tool call with a bad index"));
        if ((uint64_t)v >= d->lim.max_tool_calls)
            goto too_many;
        i = (size_t)v;
        /* Some servers send every call at index 0; a different id in a
         * used slot is a new call. */
        if (i < d->slots_len && d->slots[i].present && id && d->slots[i].id &&
            strcmp(id, d->slots[i].id) != 0)
            i = d->slots_len;
    } else if (d->positional || !d->slots_len ||
               (id && (!d->slots[d->slots_len - 1].id ||
                       strcmp(id, d->slots[d->slots_len - 1].id) != 0))) {
        i = d->slots_len;
    } else {
        i = d->slots_len - 1;
    }
    if (i >= d->slots_len || !d->slots[i].present) {
        if (i >= d->lim.max_tool_calls || d->ncalls >= d->lim.max_tool_calls)
            goto too_many;
    }
    if (i >= d->slots_len) {
        call_slot *s = realloc(d->slots, (i + 1) * sizeof(*s));
        if (!s)
            return loom__llm_answer_fail(&d->a, loom__error_oom());
        memset(s + d->slots_len, 0, (i + 1 - d->slots_len) * sizeof(*s));
        for (size_t k = d->slots_len; k <= i; k++)
            loom_buf_init(&s[k].args, d->lim.max_args);
        d->slots = s;
        d->slots_len = i + 1;
    }
    *out = i;
    return 0;

too_many:
    return loom__llm_answer_fail(
        &d->a,
        loom__error_set(LOOM_ETOOLARGE, "answer has more than %zu tool calls",
                        d->lim.max_tool_calls));
}

static int tool_fragment(loom__openai_decoder *d, jv tc)
{
    jv fn = jv_get(d, tc, "function");
    jv jargs = jv_get(d, fn, "arguments");
    const char *id = str_of(d, tc, "id"), *name = str_of(d, fn, "name");
    const char *args = "";
    char *dumped = NULL;
    const char *first_id = NULL, *first_name = NULL;
    size_t idx = 0, args_len = 0;
    call_slot *s;
    int rc;

    if (jv_kind(d, tc) != K_OBJECT)
        return loom__llm_answer_fail(
            &d->a,
            loom__error_set(LOOM_EPROTO, "tool call delta is not an object"));
    if (id && !*id)
        id = NULL;
    if (name && !*name)
        name = NULL;
    if ((rc = find_slot(d, tc, id, &idx)) != 0)
        return rc;
    if (jv_kind(d, jargs) == K_STRING) {
        args = jv_str(d, jargs, &args_len);
    } else if (jv_present(jargs) && jv_kind(d, jargs) != K_NULL) {
        /* Some servers (Ollama) send the arguments as an object. */
        dumped = jv_dump(d, jargs);
        if (!dumped)
            return loom__llm_answer_fail(&d->a, loom__error_oom());
        args = dumped;
        args_len = strlen(dumped);
    }
    s = &d->slots[idx];
    if (!s->present) {
        s->present = 1;
        d->ncalls++;
    }
    if (id && !s->id) {
        if ((rc = dup_into(&s->id, id, strlen(id))) != 0)
            goto out;
        first_id = s->id;
    }
    if (name && !s->name) {
        if ((rc = dup_into(&s->name, name, strlen(name))) != 0)
            goto out;
        first_name = s->name;
    }
    rc = loom__llm_answer_args(&d->a, &s->args, idx, args, args_len);
    if (rc == 0)
        rc =
            loom__llm_answer_call_delta(&d->a, idx, first_id, first_name, args);
    free(dumped);
    return rc;

out:
    free(dumped);
    return loom__llm_answer_fail(&d->a, rc);
}

static int tool_calls(loom__openai_decoder *d, jv arr)
{
    size_t it;
    int rc;

    if (!jv_present(arr) || jv_kind(d, arr) == K_NULL)
        return 0;
    if (jv_kind(d, arr) != K_ARRAY)
        return loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_EPROTO, "tool_calls is not an array"));
    for (jv tc = jv_first(d, arr, &it); jv_present(tc);
         tc = jv_next(d, arr, &it)) {
        if ((rc = tool_fragment(d, tc)) != 0)
            return rc;
    }
    return 0;
}

static void read_usage(loom__openai_decoder *d, jv u)
{
    if (jv_kind(d, u) != K_OBJECT)
        return;
    d->a.usage.prompt_tokens = num_of(d, u, "prompt_tokens");
    d->a.usage.completion_tokens = num_of(d, u, "completion_tokens");
    d->a.usage.total_tokens = num_of(d, u, "total_tokens");
    if (!jv_present(jv_get(d, u, "total_tokens")))
        d->a.usage.total_tokens =
            d->a.usage.prompt_tokens + d->a.usage.completion_tokens;
    d->a.usage.cached_tokens =
        num_of(d, jv_get(d, u, "prompt_tokens_details"), "cached_tokens");
    d->a.usage.reasoning_tokens = num_of(
        d, jv_get(d, u, "completion_tokens_details"), "reasoning_tokens");
    d->a.has_usage = 1;
}

static int keep_finish(loom__openai_decoder *d, jv v)
{
    const char *s = jv_str(d, v, NULL);

    if (!s || d->a.finish_reason)
        return 0;
    if (!(d->a.finish_reason = strdup(s)))
        return loom__llm_answer_fail(&d->a, loom__error_oom());
    return 0;
}

/* Text, refusal, reasoning and tool calls of a delta or a message. */
static int message_parts(loom__openai_decoder *d, jv m)
{
    jv r;
    int rc;

    if (jv_kind(d, m) != K_OBJECT)
        return 0;
    if ((rc = add_json_text(d, LOOM_LLM_TEXT, jv_get(d, m, "content"))))
        return rc;
    /* A refusal is the model's answer to the user: keep it as text. */
    if ((rc = add_json_text(d, LOOM_LLM_TEXT, jv_get(d, m, "refusal"))))
        return rc;
    /* vLLM and DeepSeek say reasoning_content, Ollama and others reasoning;
     * a server sending both means the same text. */
    r = jv_get(d, m, "reasoning_content");
    if (jv_kind(d, r) != K_STRING)
        r = jv_get(d, m, "reasoning");
    if ((rc = add_json_text(d, LOOM_LLM_REASONING, r)))
        return rc;
    return tool_calls(d, jv_get(d, m, "tool_calls"));
}

/* Common fields of a chunk or a completion: id, usage, choices. */
static int answer_object(loom__openai_decoder *d, jv o, const char *part)
{
    jv choices = jv_get(d, o, "choices");
    const char *id = str_of(d, o, "id");
    size_t it;
    int rc;

    if (id && !d->a.response_id && dup_into(&d->a.response_id, id, strlen(id)))
        return loom__llm_answer_fail(&d->a, LOOM_ENOMEM);
    read_usage(d, jv_get(d, o, "usage"));
    if (jv_present(choices) && jv_kind(d, choices) != K_ARRAY)
        return loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_EPROTO, "choices is not an array"));
    for (jv c = jv_first(d, choices, &it); jv_present(c);
         c = jv_next(d, choices, &it)) {
        jv ci = jv_get(d, c, "index");
        /* Only the first choice is loom's (n is never sent). */
        if (jv_kind(d, c) != K_OBJECT || (jv_present(ci) && jv_int(d, ci) != 0))
            continue;
        if ((rc = message_parts(d, jv_get(d, c, part))) != 0)
            return rc;
        if ((rc = keep_finish(d, jv_get(d, c, "finish_reason"))))
            return rc;
    }
    return 0;
}

/* Builds the complete calls and emits USAGE, TOOL_CALLS and FINISH. */
static int close_answer(void *owner)
{
    loom__openai_decoder *d = owner;
    char gen[32];

    d->a.ended = 1;
    if (loom__llm_answer_calls(&d->a, d->ncalls))
        return LOOM_ENOMEM;
    for (size_t i = 0; i < d->slots_len; i++) {
        call_slot *s = &d->slots[i];

        if (!s->present)
            continue;
        if (!s->name)
            return loom__llm_answer_fail(
                &d->a,
                loom__error_set(LOOM_EPROTO, "tool call %zu has no name", i));
        snprintf(gen, sizeof(gen), "call_%zu", i);
        if (loom__llm_answer_take_call(&d->a, &d->a.calls[d->a.calls_len++],
                                       &s->id, &s->name, &s->args, gen))
            return LOOM_ENOMEM;
    }
    return loom__llm_answer_close(&d->a);
}

static int on_sse(const loom_sse_event *ev, void *payload)
{
    loom__openai_decoder *d = payload;
    json_t *o;
    int rc;

    if (d->a.failed)
        return d->a.failed;
    if (d->saw_done)
        return 0; /* nothing after [DONE] belongs to the answer */
    if (strcmp(ev->event, "error") == 0) {
        o = json_loadb(ev->data, ev->data_len, 0, NULL);
        rc = stream_error(d, ev->data, ev->data_len, o);
        json_decref(o);
        return rc;
    }
    if (strcmp(ev->event, "message") != 0)
        return 0; /* pings and other events of proxies */
    if (ev->data_len == 6 && memcmp(ev->data, "[DONE]", 6) == 0) {
        d->saw_done = 1;
        return close_answer(d);
    }
    if (!d->jansson_only && fast_parse(d, ev->data, ev->data_len) == 0) {
        jv root = jv_tok(0);
        int ek = jv_kind(d, jv_get(d, root, "error"));
        /* An error chunk is rare and wants jansson's objects. */
        if (ek == K_NONE || ek == K_NULL) {
            d->fast_chunks++;
            rc = answer_object(d, root, "delta");
            fast_give(d);
            return rc;
        }
    }
    fast_give(d);
    o = json_loadb(ev->data, ev->data_len, 0, NULL);
    if (!json_is_object(o))
        rc = loom__llm_answer_bad_json(&d->a, "chunk", ev->data, ev->data_len);
    else if (json_object_get(o, "error") &&
             !json_is_null(json_object_get(o, "error")))
        rc = stream_error(d, ev->data, ev->data_len, o);
    else
        rc = answer_object(d, jv_json(o), "delta");
    json_decref(o);
    return rc;
}

/* A whole JSON body (loom__llm_answer_kind.complete). */
static int complete(void *owner, const json_t *o, const char *body, size_t len)
{
    loom__openai_decoder *d = owner;
    const json_t *choices = json_object_get(o, "choices");
    int rc;

    d->positional = 1;
    if (json_object_get(o, "error") &&
        !json_is_null(json_object_get(o, "error")))
        return stream_error(d, body, len, o);
    if (!json_is_array(choices) || json_array_size(choices) == 0)
        return loom__llm_answer_fail(
            &d->a, loom__error_set(LOOM_EPROTO, "answer has no choices"));
    if ((rc = answer_object(d, jv_json(o), "message")) != 0)
        return rc;
    return close_answer(d);
}

/* A whole JSON body through the fast path, as on_sse takes a chunk;
 * declined (to complete, through jansson) when the fast path cannot read
 * it exactly or it is not a plain answer (an error object, no choices),
 * which complete words. */
static int complete_text(void *owner, const char *body, size_t len)
{
    loom__openai_decoder *d = owner;
    jv root, choices;
    size_t it;
    int ek, rc = LOOM__ANSWER_DECLINED;

    if (d->jansson_only || fast_parse(d, body, len) != 0) {
        fast_give(d);
        return rc;
    }
    root = jv_tok(0);
    ek = jv_kind(d, jv_get(d, root, "error"));
    choices = jv_get(d, root, "choices");
    if ((ek == K_NONE || ek == K_NULL) &&
        jv_present(jv_first(d, choices, &it))) {
        d->fast_chunks++;
        d->positional = 1;
        rc = answer_object(d, root, "message");
    }
    fast_give(d);
    if (rc == 0)
        rc = close_answer(d);
    return rc;
}

/* Frees what is this decoder's own (loom__llm_answer_free() does the
 * rest). */
static void release(void *owner)
{
    loom__openai_decoder *d = owner;

    for (size_t i = 0; i < d->slots_len; i++) {
        free(d->slots[i].id);
        free(d->slots[i].name);
        loom_buf_free(&d->slots[i].args);
    }
    free(d->slots);
    fast_doc_free(d->fast);
    free(d->head);
}

/* A stream without [DONE] ends an answer that has its finish reason:
 * servers that omit [DONE] still send one. */
static const loom__llm_answer_kind openai_kind = {
    .on_sse = on_sse,
    .close = close_answer,
    .complete = complete,
    .complete_text = complete_text,
    .release = release,
    .cut_what = "answer",
    .reasoning_name = "reasoning",
    .lim_offset = offsetof(loom__openai_decoder, lim),
    .lim_size = sizeof(loom__openai_limits),
    .limits = limits_of,
};

LOOM__LLM_DECODER_API(loom__openai_decoder)
