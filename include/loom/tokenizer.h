/*
 * loom/tokenizer.h: counting and encoding tokens the way models do.
 *
 * A loom_tokenizer is a tiktoken-compatible byte-pair encoder for one
 * encoding (o200k_base, cl100k_base): the same pre-tokenisation pattern,
 * the same ranks and special tokens, so token ids are identical to
 * js-tiktoken's. It is immutable once loaded and safe to share between
 * threads. Its vocabulary comes from files that scripts/vocab.sh makes
 * (docs/tokenizer.md says where loom looks for them); a missing vocabulary
 * is an error naming that script.
 *
 * Text is UTF-8. An invalid sequence counts as U+FFFD, one per maximal
 * invalid subpart, as a WHATWG TextDecoder reads it (what a JavaScript
 * tokenizer sees of the same bytes).
 *
 * A loom_token_counter counts what a request to one model costs: exactly
 * for OpenAI models (their encoding plus the chat format's per-message
 * overheads), and for other providers, whose tokenizers are not public, as
 * an estimate that the provider's reported usage corrects as runs go.
 */
#ifndef LOOM_TOKENIZER_H
#define LOOM_TOKENIZER_H

#include "buf.h"
#include "common.h"
#include "message.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most bytes one encode, count or decode call takes (1 GiB). */
#define LOOM_TOKENIZER_MAX_INPUT ((size_t)1 << 30)

typedef struct loom_tokenizer loom_tokenizer;

/*
 * Loads an encoding by name ("o200k_base", "cl100k_base") from the vocab
 * directory, or from a path (anything with a '/') to a .tiktoken rank file
 * ("BASE64 RANK" per line). Beside a rank file X.tiktoken loom reads
 * X.meta.json (pattern, special tokens, Unicode classes; scripts/vocab.sh
 * writes it); without one, a file whose name or size says o200k_base or
 * cl100k_base gets that encoding's built-in pattern and special tokens.
 * The vocab directory is $LOOM_VOCAB_DIR, else vocab/data in the source
 * tree holding the running executable (up to three folders above it),
 * else LOOM_VOCAB_SYSTEM_DIR.
 *
 * Returns 0 and *out (free with loom_tokenizer_free), LOOM_ENOTFOUND when
 * the vocabulary is missing (the message names scripts/vocab.sh),
 * LOOM_EPROTO for a malformed file, LOOM_ETOOLARGE past a file limit,
 * LOOM_EINVALID for a bad name, LOOM_ENOMEM.
 */
int loom_tokenizer_load(loom_tokenizer **out, const char *encoding_or_path);

#define LOOM_VOCAB_SYSTEM_DIR "/usr/local/share/loom/vocab"

/* Frees a tokenizer; NULL is a no-op. */
void loom_tokenizer_free(loom_tokenizer *t);

/*
 * The process-wide tokenizer for encoding, loaded on first use; safe to
 * call from any thread. NULL when the vocabulary cannot be loaded: the
 * first failure per encoding is logged (warn) with the reason, and every
 * later call returns NULL at once. Never freed by the caller.
 */
const loom_tokenizer *loom_tokenizer_shared(const char *encoding);

/* The encoding's name ("o200k_base", or the rank file's base name). */
const char *loom_tokenizer_name(const loom_tokenizer *t);

/*
 * The number of tokens text encodes to, special-token text counted as
 * ordinary text. Allocates nothing per token (at most a copy of the text
 * and scratch space per call). Returns (size_t)-1 when len passes
 * LOOM_TOKENIZER_MAX_INPUT or memory runs out.
 */
size_t loom_tokenizer_count(const loom_tokenizer *t, const char *text,
                            size_t len);

/*
 * Encodes text into *ids (*n of them; the caller frees *ids, which is
 * never NULL on success). With allow_special, the text of the special
 * tokens (<|endoftext|>, ...) becomes their ids; without, it is ordinary
 * text (tiktoken's encode_ordinary). LOOM_ETOOLARGE past
 * LOOM_TOKENIZER_MAX_INPUT, LOOM_ENOMEM, LOOM_EINVALID for NULL arguments.
 */
int loom_tokenizer_encode(const loom_tokenizer *t, const char *text,
                          size_t len, int allow_special, uint32_t **ids,
                          size_t *n);

/*
 * Appends the bytes of ids to out (special tokens as their text). The
 * bytes may be any byte string, including invalid UTF-8 when ids split a
 * character. LOOM_EINVALID for an id the encoding does not have (out is
 * then unchanged), LOOM_ETOOLARGE past out's limit.
 */
int loom_tokenizer_decode(const loom_tokenizer *t, const uint32_t *ids,
                          size_t n, loom_buf *out);

/* The id of special token text ("<|endoftext|>"), or -1. */
long loom_tokenizer_special_id(const loom_tokenizer *t, const char *text);

/*
 * Counting for a model: exact for OpenAI models, corrected estimate
 * otherwise.
 */
typedef struct loom_token_counter loom_token_counter;

/*
 * A counter for model: "provider/model" or a bare model id; the id after
 * the last '/' decides. gpt-4o*, gpt-4.1*, gpt-4.5*, gpt-5*, chatgpt-4o*,
 * o1*, o3*, o4* count exactly with o200k_base; gpt-4*, gpt-3.5*,
 * text-embedding-3-* and text-embedding-ada-002 with cl100k_base. Any
 * other model (claude-*, gemini-*, ...) is estimated from o200k_base
 * counts scaled by a per-model factor that loom_token_counter_observe()
 * corrects; counters of the same model share that factor process-wide.
 * When the vocabulary is missing (logged once), every model is estimated
 * from the text's length instead, and corrected the same way.
 * Returns 0 and *out, LOOM_EINVALID for an empty model, LOOM_ENOMEM.
 */
int loom_token_counter_for_model(loom_token_counter **out, const char *model);

/* Frees a counter; NULL is a no-op. */
void loom_token_counter_free(loom_token_counter *c);

/* Tokens of text (no message overhead). */
size_t loom_token_counter_text(const loom_token_counter *c, const char *text,
                               size_t len);

/*
 * Tokens of one message including the chat format's per-message overhead
 * (OpenAI cookbook: 3 per message, the role, the content, 1 more with a
 * name; tool calls as name and arguments; docs/tokenizer.md).
 */
size_t loom_token_counter_message(const loom_token_counter *c,
                                  const loom_message *m);

/*
 * Tokens the tool definitions add to a request (an approximation: the
 * definitions rendered the way OpenAI models are shown them, plus a fixed
 * overhead; docs/tokenizer.md). 0 when n is 0.
 */
size_t loom_token_counter_tools(const loom_token_counter *c,
                                const loom_tool_def *tools, size_t n);

/*
 * Tokens of a whole request: every message, the tools, and the 3 tokens
 * that prime the reply. What loom_token_counter_observe() compares with
 * the provider's reported prompt tokens.
 */
size_t loom_token_counter_request(const loom_token_counter *c,
                                  const loom_message *messages,
                                  size_t nmessages,
                                  const loom_tool_def *tools, size_t ntools);

/* 1 when counts are exact (an OpenAI model with its vocabulary loaded). */
int loom_token_counter_is_exact(const loom_token_counter *c);

/* The encoding an exact counter uses, or the estimator's name
 * ("estimate:o200k_base", "estimate:length"). */
const char *loom_token_counter_method(const loom_token_counter *c);

/*
 * Feeds back the provider's reported prompt tokens for a request the
 * counter estimated at `estimated`. Moves the model's correction factor a
 * step towards reported / estimated (smoothed; ratios are clamped to
 * [1/4, 4], requests estimated under 32 tokens are ignored). Thread-safe.
 * A no-op for exact counters.
 */
void loom_token_counter_observe(loom_token_counter *c, size_t estimated,
                                size_t reported);

/* The model's current correction factor (1.0 for exact counters). */
double loom_token_counter_factor(const loom_token_counter *c);

#ifdef __cplusplus
}
#endif
#endif
