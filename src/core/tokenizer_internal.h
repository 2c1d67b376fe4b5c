/*
 * Internal: the tokenizer's pieces that tests and the token counter reach
 * (see include/loom/tokenizer.h for the public contract).
 */
#ifndef LOOM_CORE_TOKENIZER_INTERNAL_H
#define LOOM_CORE_TOKENIZER_INTERNAL_H

#include "loom/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdint.h>
#include <string.h>

#define LOOM__NO_RANK UINT32_MAX

/* Class groups of code points (see tokenizer.c). */
enum {
    LOOM__TG_OTHER = 0, LOOM__TG_LU, LOOM__TG_LL, LOOM__TG_LT, LOOM__TG_LM,
    LOOM__TG_LO, LOOM__TG_M, LOOM__TG_N, LOOM__TG_WS, LOOM__TG_COUNT
};

/* A hash slot carries the token's first 8 bytes, so that looking up a
 * short token touches one cache line. */
typedef struct {
    uint64_t head; /* bytes 0..7, little-endian, zero-padded */
    uint32_t rank; /* NONE: empty */
    uint32_t len;
} loom__tok_slot;

typedef struct {
    char *text;
    size_t len;
    uint32_t id;
} loom__tok_special;

struct loom_tokenizer {
    char *name;
    uint8_t *bytes;    /* every token's bytes, back to back */
    uint32_t *off;     /* id -> offset into bytes */
    uint16_t *len;     /* id -> byte length; 0: no such token */
    uint32_t n_ids;    /* largest ordinary id + 1 */
    size_t max_len;    /* longest token */
    loom__tok_slot *slots;
    size_t mask;
    uint32_t *pair;    /* 65536: two-byte token -> rank */
    uint32_t byte_rank[256];
    loom__tok_special *specials;
    size_t n_specials;
    pcre2_code *re;
    int jit;
    /* JIT stacks for matching, one per match under way at most: idle ones
     * wait there for the next encode (see tokenizer.c). */
    struct loom__tok_jits *jits;
    /* Class groups: NULL when the vocabulary has none (PCRE2's tables). */
    uint16_t *stage1;  /* code point >> 8 -> block */
    uint8_t *blocks;   /* 256 groups per block */
    uint8_t rep[LOOM__TG_COUNT][3][4]; /* representative bytes */
};

/* The first (up to) 8 bytes of p as a little-endian number: what a hash
 * slot keeps of a token. */
static inline uint64_t loom__tok_head(const uint8_t *p, size_t n)
{
    uint64_t h = 0;
    size_t k;

    if (n >= 8) {
        for (k = 0; k < 8; k++)
            h |= (uint64_t)p[k] << (8 * k);
        return h;
    }
    for (k = 0; k < n; k++)
        h |= (uint64_t)p[k] << (8 * k);
    return h;
}

/* A multiply-xorshift hash of the n bytes at p, whose head is head. */
static inline uint64_t loom__tok_hash(uint64_t head, const uint8_t *p,
                                      size_t n)
{
    uint64_t h = (head ^ 0x9e3779b97f4a7c15ull) * 0xbf58476d1ce4e5b9ull;
    uint64_t w = 0;

    h ^= n * 0xff51afd7ed558ccdull;
    if (n > 8) {
        for (p += 8, n -= 8; n >= 8; p += 8, n -= 8) {
            memcpy(&w, p, 8);
            h = (h ^ (h >> 31) ^ w) * 0x94d049bb133111ebull;
        }
        for (w = 0; n; n--)
            w = w << 8 | p[n - 1];
    }
    h = (h ^ (h >> 29) ^ w) * 0xbf58476d1ce4e5b9ull;
    return h ^ (h >> 32);
}

/* Sets up t's JIT stacks (none yet); 0 or LOOM_ENOMEM. */
int loom__tokenizer_jits_new(loom_tokenizer *t);

/* Frees t's JIT stacks (when t itself is freed, no encode under way). */
void loom__tokenizer_jits_free(loom_tokenizer *t);

/* 0 when p[0..n) is valid UTF-8; sets *ascii when every byte is ASCII. */
int loom__tokenizer_utf8_check(const uint8_t *p, size_t n, int *ascii);

/* Limits on vocabulary files (each crossing is LOOM_ETOOLARGE). */
#define LOOM__VOCAB_MAX_FILE ((size_t)64 << 20)   /* rank file bytes */
#define LOOM__VOCAB_MAX_META ((size_t)4 << 20)    /* meta.json bytes */
#define LOOM__VOCAB_MAX_TOKEN 1024                /* bytes of one token */
#define LOOM__VOCAB_MAX_RANK ((uint32_t)1 << 24)  /* largest id + 1 */
#define LOOM__VOCAB_MAX_SPECIAL 256               /* special tokens */
#define LOOM__VOCAB_MAX_SPECIAL_LEN 256           /* bytes of one */
#define LOOM__VOCAB_MAX_PATTERN ((size_t)64 << 10) /* pattern bytes */

/* How loom__tokenizer_bpe merges: as the encoder picks, or forced. */
#define LOOM__BPE_AUTO 0
#define LOOM__BPE_ARRAY 1 /* the quadratic scan, for short pieces */
#define LOOM__BPE_HEAP 2  /* the heap, for long ones */

/*
 * Byte-pair merges one piece of n bytes (1 <= n, n < 2^31) with method;
 * writes the ids to out (room for n) and returns how many. Both methods
 * give tiktoken's result (lowest rank first, leftmost on ties); tests
 * compare them. Returns (size_t)-1 when scratch memory runs out.
 */
size_t loom__tokenizer_bpe(const loom_tokenizer *t, const uint8_t *piece,
                           size_t n, int method, uint32_t *out);

/* The rank of the token whose bytes are p[0..n), or UINT32_MAX. */
uint32_t loom__tokenizer_rank(const loom_tokenizer *t, const uint8_t *p,
                              size_t n);

/*
 * Where loom looks for vocabularies, in order, joined by ", " into out
 * ("" when LOOM_VOCAB_DIR is set to ""): $LOOM_VOCAB_DIR alone when set,
 * else the vocab/data folders above the executable and the system dir.
 */
int loom__tokenizer_vocab_dirs(loom_buf *out);

/* Forgets the shared tokenizers (and their logged failures), freeing
 * them. Tests only: nothing may be using them. */
void loom__tokenizer_shared_reset(void);

/* Forgets the counts kept process-wide (tokenizer_count.c: rendered tool
 * definitions, system prompts, role names); loom__tokenizer_shared_reset
 * calls it, since they are kept per tokenizer. */
void loom__token_counter_tools_memo_reset(void);

/* Forgets every model's correction factor. Tests only. */
void loom__token_counter_reset(void);

/* The length-based estimate of text's tokens used without a vocabulary. */
size_t loom__token_estimate_length(const char *text, size_t len);

/*
 * loom_token_counter_request() in two parts, for a caller that sends the
 * same tools on every call and counts them once: tools_raw is the tools'
 * unscaled count (loom__token_counter_tools_raw on the same counter; 0
 * for none), ntools how many there are. The total is the same as
 * loom_token_counter_request's for those messages and tools.
 */
size_t loom__token_counter_tools_raw(const loom_token_counter *c,
                                     const loom_tool_def *tools, size_t n);
size_t loom__token_counter_request_raw(const loom_token_counter *c,
                                       const loom_message *messages,
                                       size_t nmessages, size_t tools_raw,
                                       size_t ntools);

/*
 * What loom__token_counter_request_memo keeps of each message it counted:
 * a fingerprint of what the count reads (its texts' addresses, lengths
 * and a 64-bit hash of their bytes) and the message's unscaled and media
 * tokens. Zeroed: empty. One per caller (a run), freed with
 * loom__token_memo_free.
 */
typedef struct {
    uint64_t hash;
    const char *content;
    size_t raw;
    size_t media;
    int system;
} loom__token_memo_item;

typedef struct {
    const loom_token_counter *counter; /* what the items were counted by */
    loom__token_memo_item *items;
    size_t len, cap;
} loom__token_memo;

/*
 * loom__token_counter_request_raw, counting again only the messages that
 * are not in memo at their place with the same fingerprint (a run's
 * request grows by appending, so each call counts only what is new).
 * The total is the same; memo keeps the messages' counts for the next
 * call (when out of memory it keeps fewer, and counts are made anew).
 * memo NULL: none (loom__token_counter_request_raw).
 */
size_t loom__token_counter_request_memo(const loom_token_counter *c,
                                        loom__token_memo *memo,
                                        const loom_message *messages,
                                        size_t nmessages, size_t tools_raw,
                                        size_t ntools);

void loom__token_memo_free(loom__token_memo *memo);

#endif
