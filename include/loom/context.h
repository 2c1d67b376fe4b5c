/*
 * loom/context.h: the context engine, which fits every model request to
 * the model's context window.
 *
 * A run keeps one engine. Before each model call it hands the engine the
 * whole conversation (which it never changes: the stored conversation
 * keeps everything) and gets back the messages to send, so that messages
 * plus tool definitions fit in `context window - max output - margin`
 * tokens by the engine's own count. In order, until the request fits:
 *
 *   1. a tool result larger than its share of the window is cut, with a
 *      marker giving its original size (always, before it is ever sent);
 *   2. older tool results are shown reduced: their `summary` (given by
 *      the tool) or their head, with a marker; the newest round is kept
 *      whole (skipped with keep_full_tool_results);
 *   3. whole old turns are dropped, oldest first;
 *   4. older messages are summarised by a model call; the summary replaces
 *      them, is kept and is reused by later calls until it too needs
 *      refreshing;
 *   5. older tool rounds of the current turn are dropped, oldest first.
 *
 * The system prompt, the current (last) user message, system messages
 * after it and the newest tool round are never dropped, and an assistant
 * tool call is never separated from its results. A current user message
 * too large to fit at all is cut, with a warning. When even that is not
 * enough, fit() fails with LOOM_ETOOLARGE naming the sizes. See
 * docs/context.md.
 *
 * Token counts come from a loom_context_counter (a tokenizer's, or a
 * crude default) and are kept per message: a message is counted once and
 * counted again only when it changed (see loom_context_fit).
 *
 * Threads: one engine is used by one thread at a time.
 */
#ifndef LOOM_CONTEXT_H
#define LOOM_CONTEXT_H

#include "cancel.h"
#include "common.h"
#include "llm.h"
#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * How tokens are counted: message() counts one message as a request would
 * carry it (content, tool calls, ids, per-message overhead); tools()
 * counts the tool definitions of a request. Both must be deterministic
 * and thread-compatible. A NULL callback uses the crude default below.
 */
typedef struct {
    size_t (*message)(const loom_message *msg, void *payload);
    size_t (*tools)(const loom_tool_def *tools, size_t n, void *payload);
    void *payload;
} loom_context_counter;

/*
 * The crude default: 4 tokens per message plus one per 4 bytes (rounded
 * up) of content, provider state, tool call ids, names and arguments, and
 * 4 more per tool call. It overestimates English text a little, which is
 * the safe side, and it makes tests deterministic.
 */
size_t loom_context_count_message(const loom_message *msg, void *payload);

/* The crude default for tools: per tool 8 tokens plus one per 4 bytes of
 * name, description and compact JSON parameters. */
size_t loom_context_count_tools(const loom_tool_def *tools, size_t n,
                                void *payload);

/* The default instruction given to the summary model. */
#define LOOM_CONTEXT_SUMMARY_PROMPT                                          \
    "You condense conversations between a user and an AI assistant so the " \
    "assistant can continue with less context. Write a concise summary "    \
    "of the conversation below: what the user asked for, decisions made, "  \
    "facts and figures found (with their sources), results of tool calls "  \
    "and what remains to be done. Keep names, numbers, identifiers and "    \
    "URLs exactly. Write only the summary."

typedef struct {
    unsigned version;
    /* The model's window in tokens; must be > 0. */
    long context_window;
    /* Tokens kept for the answer; 0: min(4096, window / 4). */
    long max_output_tokens;
    /* Tokens kept free for counting error; 0: window / 50, at least 16. */
    long margin;
    /* NULL callbacks: the crude default. Copied. */
    loom_context_counter counter;
    /* Research agents: never reduce older tool results (cuts and drops
     * still apply). */
    int keep_full_tool_results;
    /* The part of the limit one tool round may take; each of its n
     * results gets share / n; 0: 0.5. Between 0 and 1. */
    double tool_result_share;
    /* Bytes of content a reduced tool result keeps when the tool gave no
     * summary (the summary itself is cut to this too); 0: 600. */
    size_t reduced_result_bytes;
    /* Summaries: the provider and upstream model that write them (NULL
     * provider: no summaries, step 4 is skipped). Borrowed. */
    loom_provider *summary_provider;
    const char *summary_model;
    /* The instruction; NULL: LOOM_CONTEXT_SUMMARY_PROMPT. Copied. */
    const char *summary_prompt;
    /* The most tokens a summary may take; 0: min(1024, limit / 8). */
    long summary_max_tokens;
    /*
     * A summary kept from earlier (NULL: none), copied, and how many
     * messages of the array given to fit() it replaces, counted after
     * the leading system messages (0: it summarises what came before the
     * array). It is used in every request until it needs refreshing.
     */
    const char *summary;
    size_t summary_covers;
    /*
     * Never cut the current user message: when it alone does not fit,
     * fit() fails with LOOM_ETOOLARGE instead (the run then moves to a
     * larger model, its context_window_fallback, rather than lose part
     * of what the user asked).
     */
    int no_user_cut;
} loom_context_options;

#define LOOM_CONTEXT_OPTIONS_VERSION 1
#define LOOM_CONTEXT_OPTIONS_INIT                                              \
    {                                                                          \
        .version = LOOM_CONTEXT_OPTIONS_VERSION                                \
    }

/* What the engine did to a request, strongest step last. */
typedef enum {
    LOOM_CONTEXT_FULL = 0,  /* everything (tool results over share cut) */
    LOOM_CONTEXT_REDUCED,   /* older tool results reduced */
    LOOM_CONTEXT_TRIMMED,   /* whole turns or rounds dropped */
    LOOM_CONTEXT_SUMMARY    /* a summary stands for older messages */
} loom_context_layout;

/* "full", "reduced", "trimmed", "summary". */
const char *loom_context_layout_name(loom_context_layout layout);

/* One tool result (or the user message) cut in this fit. */
typedef struct {
    size_t index;        /* in the array given to fit() */
    loom_role role;
    const char *tool_call_id; /* borrowed; NULL for a user message */
    size_t tokens_before, tokens_after;
    size_t bytes;        /* the original content's size */
} loom_context_cut;

/*
 * The outcome of one fit. Everything is borrowed from the engine and
 * valid until the next fit() or free(). messages borrow their strings
 * from the array given to fit() (which must outlive the use of the
 * request) or from the engine.
 */
typedef struct {
    const loom_message *messages;
    size_t messages_len;
    loom_context_layout layout;
    long window, max_output_tokens, margin;
    size_t limit;         /* window - max output - margin */
    size_t tokens_before; /* every message given, uncut, plus tools */
    size_t tokens_after;  /* the request: messages plus tools */
    size_t tools_tokens;
    size_t messages_before;
    const loom_context_cut *cuts; /* cuts first made in this fit */
    size_t cuts_len;
    size_t cut_total;     /* messages shown cut in this request */
    size_t reduced;       /* tool results shown reduced */
    size_t dropped_messages;
    size_t dropped_turns;  /* old turns (step 3) */
    size_t dropped_rounds; /* units of the current turn (step 5) */
    /* The engine's summary (without its heading), or NULL; covers is the
     * number of messages after the leading system ones it replaces. It
     * is in the request unless even it had to go (summary_in_request 0),
     * which happens only when the newest round and the current user
     * message leave no room for it. */
    const char *summary;
    size_t summary_covers;
    size_t summary_tokens;
    int summary_in_request;
    int summary_created; /* made by this fit's model call */
    /* The usage of the summary call (made or failed), and whether its
     * cost_micros is known (loom_llm_response.cost_known). */
    loom_usage summary_usage;
    int summary_cost_known;
    /* The summary call failed (its message), and step 5 ran instead. */
    const char *summary_error;
    /* The current user message was too large and was cut. */
    int user_cut;
    size_t user_tokens_before, user_tokens_after;
} loom_context_result;

typedef struct loom_context loom_context;

/*
 * Makes an engine. LOOM_EINVALID for a window of 0 or below, a window not
 * larger than max output plus margin, or a share outside (0, 1];
 * LOOM_ENOMEM.
 */
int loom_context_new(loom_context **out, const loom_context_options *opts);

/* NULL is a no-op. */
void loom_context_free(loom_context *ctx);

/*
 * Moves the engine to another model's window (a context_window_fallback):
 * counts are kept, cuts are made again for the new limit. Same errors as
 * loom_context_new; the engine is unchanged on error.
 */
int loom_context_set_window(loom_context *ctx, long context_window,
                            long max_output_tokens);

/*
 * Fits msgs (the whole conversation: leading system prompt, history, the
 * current user message, this run's rounds) and tools into the limit and
 * fills *out. msgs is only read. Counts are cached by position: the
 * message at index i is counted again only when its fingerprint changed
 * (role, the pointers of its strings and tool calls, the number of tool
 * calls, the length of its content and a hash of the content's first
 * and last 32 bytes); tools are counted again when the array or its
 * length changes. cancel (may be NULL) aborts a summary call.
 *
 * Returns 0; LOOM_ETOOLARGE when the parts that are never dropped do not
 * fit (the message names each size and the limit), LOOM_ECANCELED,
 * LOOM_ENOMEM. A failed summary call is not an error: step 5 runs and
 * out->summary_error says why.
 */
int loom_context_fit(loom_context *ctx, loom_context_result *out,
                     const loom_message *msgs, size_t n,
                     const loom_tool_def *tools, size_t ntools,
                     loom_cancel *cancel);

/*
 * The result as the data of a `context` event (docs/events.md): a new
 * object, or NULL when out of memory.
 */
json_t *loom_context_result_json(const loom_context_result *r);

/*
 * The summary the engine holds (without its heading), or NULL; *covers
 * (may be NULL) gets the messages after the leading system ones that it
 * replaces. Borrowed until the next fit() or free().
 */
const char *loom_context_summary(const loom_context *ctx, size_t *covers);

/* Calls made to the counter's message() since the engine was made. */
size_t loom_context_counted(const loom_context *ctx);

#ifdef __cplusplus
}
#endif
#endif
