/*
 * llm/answer.h: what every answer decoder (llm/<kind>_stream.c) shares. Each
 * decoder reads its own wire format, but what it makes of it is the same:
 * text and reasoning deltas passed on at once and kept under a limit, the
 * complete tool calls, usage, finish reason, response id and
 * provider_state handed over at the end, an error that stops it for good,
 * and an SSE parser in front of it all. A decoder embeds loom__llm_answer
 * as its first member and uses the functions here for that part, which is
 * also what the attempt loop (llm/attempt.h) needs of it: the functions
 * taking a void *d take such a decoder and fit loom__llm_decoder_ops.
 */
#ifndef LOOM_LLM_ANSWER_H
#define LOOM_LLM_ANSWER_H

#include "loom/buf.h"
#include "loom/llm.h"
#include "loom/sse.h"

#include <jansson.h>

/* The default limits of one answer, which every adapter has: tool calls,
 * bytes of one call's arguments, bytes of text (and of reasoning). */
#define LOOM_LLM_MAX_TOOL_CALLS 128
#define LOOM_LLM_MAX_ARGS ((size_t)1 << 20)
#define LOOM_LLM_MAX_TEXT ((size_t)16 << 20)
/* Error text kept from a stream's error data that is not JSON. */
#define LOOM_LLM_MAX_ERROR_TEXT 500
/* Token counts beyond this are nonsense from a broken server; clamping
 * keeps sums of them (usage totals over a run) from overflowing. */
#define LOOM_LLM_MAX_TOKEN_COUNT 1000000000000L

/* What a kind's complete_text returns for a body it leaves to complete. */
#define LOOM__ANSWER_DECLINED 1

/* What a decoder tells the shared part about itself: one static each. */
typedef struct {
    /* Each SSE event of a streamed body; payload is the decoder. */
    loom_sse_event_cb on_sse;
    /* Builds the complete calls (and state) and emits the closing events
     * (loom__llm_answer_close); sets ended. */
    int (*close)(void *d);
    /*
     * A streamed body ended cleanly and the answer is still open. NULL:
     * an answer with a finish reason is whole and is closed, any other is
     * cut off (loom__llm_answer_cut(), what being cut_what). Else the
     * decoder's own rule, which does one or the other.
     */
    int (*end)(void *d);
    const char *cut_what;
    /* A whole JSON body (a non-streamed answer, or a server that answered
     * a streaming request with one), parsed: o is an object, or an array
     * when arrays is set; body and len are its text, for messages. Closes
     * the answer. */
    int (*complete)(void *d, const json_t *o, const char *body, size_t len);
    int arrays;
    /* Optional: the same body decoded from its text without jansson;
     * LOOM__ANSWER_DECLINED (having emitted nothing) hands it to
     * complete. NULL: always complete. */
    int (*complete_text)(void *d, const char *body, size_t len);
    /* Frees what is the decoder's own, not its loom__llm_answer. */
    void (*release)(void *d);
    /* The reasoning's name in limit errors ("reasoning", "thinking"). */
    const char *reasoning_name;
    /* The message when the SSE parser passes its own size limit; NULL:
     * the parser's. */
    const char *sse_limit_msg;
    /*
     * The decoder's limits struct: lim_size bytes at lim_offset in the
     * decoder, where loom__llm_answer_new copies the caller's (all 0 when
     * it has none). limits sets each 0 in it to its default (the three
     * every decoder has through loom__llm_limits), sets *max_text to the
     * limit of text and of reasoning, and returns how many bytes one SSE
     * line or event may be.
     */
    size_t lim_offset, lim_size;
    size_t (*limits)(void *lim, size_t *max_text);
} loom__llm_answer_kind;

typedef struct {
    const loom__llm_answer_kind *kind;
    loom_llm_event_cb cb; /* may be NULL */
    void *payload;
    loom_sse_parser *sse;

    loom_buf text;      /* the text deltas, under the text limit */
    loom_buf reasoning; /* the reasoning deltas, under the same limit */
    int has_reasoning;
    loom_tool_call *calls; /* the complete calls, built at the end */
    size_t calls_len;
    loom_usage usage;
    int has_usage;
    char *finish_reason; /* loom's name for it */
    char *response_id;
    char *state; /* provider_state text, built at the end, or NULL */

    int output_started; /* text, reasoning or a call was passed on */
    int ended;          /* closing events emitted */
    int failed;         /* the error that stopped the decoder, 0 if none */
    loom_upstream_error error;
} loom__llm_answer;

/*
 * Sets the limits every decoder has to their defaults where they are 0
 * (LOOM_LLM_MAX_TOOL_CALLS, _ARGS, _TEXT) and returns the larger of
 * max_text and max_args, what one event may carry whole.
 */
size_t loom__llm_limits(size_t *max_tool_calls, size_t *max_args,
                        size_t *max_text);

/*
 * Makes a decoder of kind: size bytes (the decoder's struct, whose first
 * member is a loom__llm_answer), zeroed, its limits those of limits (a
 * struct of kind->lim_size bytes, or NULL) with their defaults as
 * kind->limits sets them, text and reasoning each limited as it says,
 * and an SSE parser whose lines and events may be as large as it says.
 * Events go to cb (may be NULL) with payload. *out is the caller's
 * (loom__llm_answer_free). LOOM_ENOMEM.
 */
int loom__llm_answer_new(void **out, size_t size,
                         const loom__llm_answer_kind *kind, const void *limits,
                         loom_llm_event_cb cb, void *payload);

/* Frees what the shared part of a decoder holds (not a itself). */
void loom__llm_answer_clear(loom__llm_answer *a);

/* Stops the decoder with rc (a LOOM_E* code, its message set); returns
 * rc. */
int loom__llm_answer_fail(loom__llm_answer *a, int rc);

/* Passes ev to the callback; a non-zero return from it fails the decoder
 * with LOOM_ECANCELED. */
int loom__llm_answer_emit(loom__llm_answer *a, const loom_llm_event *ev);

/*
 * Appends a delta of type (LOOM_LLM_TEXT or LOOM_LLM_REASONING) to its
 * buffer without passing it on: LOOM_ETOOLARGE "answer <text|reasoning
 * name> passed the limit of <n> bytes" past the limit, LOOM_ENOMEM; the
 * decoder fails with either.
 */
int loom__llm_answer_keep(loom__llm_answer *a, loom_llm_event_type type,
                          const char *s, size_t len);

/* Passes on a delta already kept (len > 0): output has started. */
int loom__llm_answer_pass(loom__llm_answer *a, loom_llm_event_type type,
                          const char *s, size_t len);

/* Keeps and passes on a delta; nothing for len 0. */
int loom__llm_answer_text(loom__llm_answer *a, loom_llm_event_type type,
                          const char *s, size_t len);

/* Appends len bytes to the arguments of tool call index, under the limit
 * of the args buffer: LOOM_ETOOLARGE "tool call <index>: arguments passed
 * the limit of <n> bytes", LOOM_ENOMEM; the decoder fails with either. */
int loom__llm_answer_args(loom__llm_answer *a, loom_buf *args, size_t index,
                          const char *s, size_t len);

/* Passes on a fragment of tool call index (id and name on its first
 * fragment, else NULL; args may be ""): output has started. */
int loom__llm_answer_call_delta(loom__llm_answer *a, size_t index,
                                const char *id, const char *name,
                                const char *args);

/*
 * Fails the decoder with an error the answer carried: a->error set to
 * kind, status (0: none), msg (NULL: the first LOOM_LLM_MAX_ERROR_TEXT
 * bytes of data) and type (may be NULL). With event, an LOOM_LLM_ERROR
 * event is passed on (its callback's answer is not asked) and the
 * message is "stream error: <msg>", else "<msg>". Returns LOOM_EUPSTREAM,
 * or LOOM_ENOMEM.
 */
int loom__llm_answer_error(loom__llm_answer *a, loom_upstream_kind kind,
                           int status, const char *msg, const char *type,
                           const char *data, size_t len, int event);

/* Fails the decoder with LOOM_EPROTO "malformed <what> (<why>): <data>",
 * why being jansson's reason when data is not JSON, else "not an
 * object". It parses data again to say why: the decoders keep no
 * json_error_t (264 bytes) on the stack of the fiber a stream reads on. */
int loom__llm_answer_bad_json(loom__llm_answer *a, const char *what,
                              const char *data, size_t len);

/* Makes room for the n complete calls of the answer (a->calls_len stays
 * 0; nothing for n 0). LOOM_ENOMEM, failing the decoder. */
int loom__llm_answer_calls(loom__llm_answer *a, size_t n);

/*
 * Makes c one of the answer's complete calls from its parts: the id and
 * the name taken from *id and *name (which are then NULL; a copy of gen
 * when *id is NULL: a result must refer to some id), the arguments
 * detached from args ("{}" when it is empty: no arguments at all means
 * none, and that is what a tool expects). LOOM_ENOMEM, failing the
 * decoder.
 */
int loom__llm_answer_take_call(loom__llm_answer *a, loom_tool_call *c,
                               char **id, char **name, loom_buf *args,
                               const char *gen);

/*
 * Emits the closing events of an answer whose calls (and state) are
 * built: USAGE when there was usage, TOOL_CALLS when there are calls,
 * FINISH when there is a finish reason. Returns like emit().
 */
int loom__llm_answer_close(loom__llm_answer *a);

/* Fails the decoder with LOOM_EUPSTREAM, kind LOOM_UPSTREAM_CONNECTION:
 * "stream ended before the <what> was complete". */
int loom__llm_answer_cut(loom__llm_answer *a, const char *what);

/*
 * For loom__llm_decoder_ops, d being a decoder whose first member is a
 * loom__llm_answer:
 * - feed: streamed body bytes, at any split, through the SSE parser;
 *   nothing after the answer ended; the decoder's error once it failed,
 *   or the parser's own limit, which fails it.
 * - finish: the streamed body ended cleanly. The SSE parser gives what it
 *   still holds; then, if the answer did not end, it is closed or cut off
 *   as the kind's end says.
 * - complete: a whole JSON body, parsed here (LOOM_EPROTO "malformed
 *   answer ..." when it is not JSON, or neither an object nor an array
 *   the kind takes) and decoded by the kind's complete; nothing once the
 *   decoder failed or ended.
 * - free: the whole decoder; NULL is a no-op.
 * - output_started; done: the answer ended (its closing events were
 *   emitted); error_of: the borrowed error after LOOM_EUPSTREAM.
 * - export: moves what was decoded into resp, freeing what resp held
 *   there: text (always, "" when none), reasoning, usage, finish reason,
 *   response id, output_started, and, only when the answer ended without
 *   error (partial calls must not be run), the tool calls and
 *   provider_state. LOOM_ENOMEM.
 */
int loom__llm_answer_feed(void *d, const char *data, size_t len);
int loom__llm_answer_finish(void *d);
int loom__llm_answer_complete(void *d, const char *body, size_t len);
void loom__llm_answer_free(void *d);
int loom__llm_answer_output_started(const void *d);
int loom__llm_answer_done(const void *d);
const loom_upstream_error *loom__llm_answer_error_of(const void *d);
int loom__llm_answer_export(void *d, loom_llm_response *resp);

/*
 * Declares the interface of one adapter's answer decoder, written once
 * here: T is its type (loom__openai_decoder, ...), L its limits struct
 * and the rest the parameters T_new takes between limits and cb, each
 * followed by a comma (none: nothing after L's comma). The adapter's
 * header says what its wire format adds (what ends an answer, what a
 * whole body is, what provider_state holds).
 *
 * - typedef struct T T, opaque.
 * - T_new(&d, limits, ..., cb, payload): a decoder for one answer; *out
 *   is the caller's (T_free). limits may be NULL, and a limit 0, for the
 *   defaults. Events go to cb (may be NULL) as they are decoded; a
 *   non-zero return from cb makes the decoder fail with LOOM_ECANCELED.
 *   Event order: TEXT / REASONING / TOOL_CALL_DELTA as they come, then
 *   at the end USAGE (once, the last counts seen), TOOL_CALLS (once,
 *   when the answer has calls, in order) and FINISH (last). LOOM_ENOMEM.
 * - T_free: the decoder; NULL is a no-op.
 * - T_feed: streamed body bytes, at any split. Returns 0, or an error,
 *   after which the decoder is finished: LOOM_EUPSTREAM for an error
 *   inside the stream (details: T_error), LOOM_EPROTO for data that is
 *   not what the format says, LOOM_ETOOLARGE past a limit, LOOM_ECANCELED
 *   when cb aborted.
 * - T_finish: ends a streamed body (the connection closed cleanly) and
 *   emits the closing events. A stream that ends before its answer did
 *   fails with LOOM_EUPSTREAM, kind LOOM_UPSTREAM_CONNECTION. Returns
 *   like feed.
 * - T_complete: decodes a whole non-streamed body into the same events
 *   (each delta whole, then the closing ones). Returns like feed; an
 *   error body is LOOM_EUPSTREAM.
 * - T_output_started: whether any text, reasoning or tool call was
 *   emitted.
 * - T_done: whether the answer ended (its closing events were emitted).
 * - T_error: the upstream error after LOOM_EUPSTREAM (borrowed).
 * - T_export: moves what was decoded into resp: text (always, "" when
 *   none), reasoning, usage, finish reason, response id, output_started,
 *   and, only when the answer ended without error (partial calls must
 *   not be run), the tool calls and provider_state. Frees what resp held
 *   in those fields. LOOM_ENOMEM.
 *
 * T and L are type names, which cannot take the parentheses clang-tidy
 * asks for.
 */
/* NOLINTBEGIN(bugprone-macro-parentheses) */
#define LOOM__LLM_DECODER_DECLARE(T, L, ...)                                   \
    typedef struct T T;                                                        \
    int T##_new(T **out, const L *limits, __VA_ARGS__ loom_llm_event_cb cb,    \
                void *payload);                                                \
    void T##_free(T *d);                                                       \
    int T##_feed(T *d, const char *data, size_t len);                          \
    int T##_finish(T *d);                                                      \
    int T##_complete(T *d, const char *body, size_t len);                      \
    int T##_output_started(const T *d);                                        \
    int T##_done(const T *d);                                                  \
    const loom_upstream_error *T##_error(const T *d);                          \
    int T##_export(T *d, loom_llm_response *resp);
/* NOLINTEND(bugprone-macro-parentheses) */

/*
 * Defines the typed entry points that LOOM__LLM_DECODER_DECLARE declares
 * but _new, T being the decoder's type: T_free, T_feed, T_finish,
 * T_complete, T_output_started, T_done, T_error and T_export, each the
 * loom__llm_answer_ function of the same name (error: _error_of). Written
 * once here rather than as eight one-line wrappers in every decoder. T is
 * a type name, which cannot take the parentheses clang-tidy asks for.
 */
/* NOLINTBEGIN(bugprone-macro-parentheses) */
#define LOOM__LLM_DECODER_API(T)                                               \
    void T##_free(T *d)                                                        \
    {                                                                          \
        loom__llm_answer_free(d);                                              \
    }                                                                          \
    int T##_feed(T *d, const char *data, size_t len)                           \
    {                                                                          \
        return loom__llm_answer_feed(d, data, len);                            \
    }                                                                          \
    int T##_finish(T *d)                                                       \
    {                                                                          \
        return loom__llm_answer_finish(d);                                     \
    }                                                                          \
    int T##_complete(T *d, const char *body, size_t len)                       \
    {                                                                          \
        return loom__llm_answer_complete(d, body, len);                        \
    }                                                                          \
    int T##_output_started(const T *d)                                         \
    {                                                                          \
        return loom__llm_answer_output_started(d);                             \
    }                                                                          \
    int T##_done(const T *d)                                                   \
    {                                                                          \
        return loom__llm_answer_done(d);                                       \
    }                                                                          \
    const loom_upstream_error *T##_error(const T *d)                           \
    {                                                                          \
        return loom__llm_answer_error_of(d);                                   \
    }                                                                          \
    int T##_export(T *d, loom_llm_response *resp)                              \
    {                                                                          \
        return loom__llm_answer_export(d, resp);                               \
    }
/* NOLINTEND(bugprone-macro-parentheses) */

/* A token count: v when it is a number, clamped to [0,
 * LOOM_LLM_MAX_TOKEN_COUNT] (reals below 1 and NaN are 0); else 0. */
long loom__llm_count(const json_t *v);
long loom__llm_count_int(json_int_t i);
long loom__llm_count_real(double r);

#endif
