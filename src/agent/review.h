/*
 * Internal: the automatic review of a run's progress.
 *
 * After a turn with tool calls, a short model call reads a condensed
 * transcript (the user's request, the calls made and excerpts of their
 * results) and answers with JSON: is the request answered, what is
 * missing, and whether to proceed, gather more or replan. The run shows
 * the review's note to the model in its next turn and reports the review
 * as a `review` event. A review that fails, for whatever reason (the call
 * fails, the answer is not the JSON asked for), is skipped with a reason:
 * it never ends a run. Only cancellation and running out of memory are
 * returned as errors.
 *
 * The parts are pure and tested alone: the transcript, the parser, the
 * note and the event data; loom__review_run() joins them around one
 * provider call. See docs/review.md.
 */
#ifndef LOOM_AGENT_REVIEW_H
#define LOOM_AGENT_REVIEW_H

#include "loom/cancel.h"
#include "loom/llm.h"

#include <jansson.h>
#include <stddef.h>

/* The review's answer limit in tokens, unless the options give one. */
#define LOOM_REVIEW_DEFAULT_MAX_TOKENS 512
/* Bytes of the transcript the reviewer reads, unless the options say. */
#define LOOM_REVIEW_DEFAULT_MAX_TRANSCRIPT (12 * 1024)
/* Bytes of the user's request, of a call's arguments, of assistant text
 * and of a result excerpt shown in the transcript. */
#define LOOM_REVIEW_GOAL_MAX 2000
#define LOOM_REVIEW_ARGS_MAX 300
#define LOOM_REVIEW_TEXT_MAX 600
#define LOOM_REVIEW_RESULT_MAX 600
/* Bytes of the reviewer's answer read, unless the options say; a longer
 * answer is skipped. */
#define LOOM_REVIEW_DEFAULT_MAX_ANSWER (8 * 1024)
/* What is kept of a review: the note's bytes, the gaps and each gap's
 * bytes. */
#define LOOM_REVIEW_NOTE_MAX 1000
#define LOOM_REVIEW_GAPS_MAX 8
#define LOOM_REVIEW_GAP_MAX 300
/* Most `{` of an answer tried as the start of the review's JSON. */
#define LOOM_REVIEW_PARSE_ATTEMPTS 64
/* Bytes of an unusable answer kept for the `review` event. */
#define LOOM_REVIEW_EXCERPT_MAX 500

/* The reviewer's instructions, unless the options give others. */
extern const char LOOM_REVIEW_PROMPT[];

typedef struct {
    loom_provider *provider; /* borrowed; required */
    const char *model;       /* upstream model id; required */
    long max_tokens;         /* 0: LOOM_REVIEW_DEFAULT_MAX_TOKENS */
    const char *prompt;      /* NULL: LOOM_REVIEW_PROMPT */
    size_t max_transcript;   /* 0: LOOM_REVIEW_DEFAULT_MAX_TRANSCRIPT */
    size_t max_answer;       /* 0: LOOM_REVIEW_DEFAULT_MAX_ANSWER */
    /* What the call asks first (gate.h; NULL: nothing): a refused call
     * is a skipped review. */
    const struct loom__gate *gate;
} loom__review_options;

#define LOOM__REVIEW_OPTIONS_INIT                                              \
    {                                                                          \
        NULL, NULL, 0, NULL, 0, 0, NULL                                        \
    }

typedef enum {
    LOOM__REVIEW_PROCEED = 0,
    LOOM__REVIEW_GATHER_MORE,
    LOOM__REVIEW_REPLAN
} loom__review_step;

/* "proceed", "gather_more", "replan". */
const char *loom__review_step_name(loom__review_step step);

/* A parsed review. Owned by the caller; see loom__review_clear. */
typedef struct {
    int complete;
    loom__review_step next_step;
    char **gaps;         /* at most LOOM_REVIEW_GAPS_MAX, each cut */
    size_t gaps_len;
    size_t gaps_dropped; /* gaps past LOOM_REVIEW_GAPS_MAX */
    char *note;          /* cut to LOOM_REVIEW_NOTE_MAX; may be "" */
    int note_cut;        /* the note was longer */
} loom__review;

void loom__review_clear(loom__review *r);

/*
 * Writes into *out the transcript the reviewer reads, from the messages
 * of the run so far: the last user message (the request, cut to
 * LOOM_REVIEW_GOAL_MAX bytes), then every assistant text, tool call and
 * tool result after it, each cut (see the _MAX constants, whitespace
 * runs of results shown as one space). System messages are left out.
 * When the steps do not fit in max bytes (0: the default) the oldest are
 * left out, and a line says how many. The result is at most max bytes.
 * LOOM_ENOMEM; the caller frees *out.
 */
int loom__review_transcript(char **out, const loom_message *msgs, size_t n,
                            size_t max);

/*
 * Parses the reviewer's answer (len bytes): a JSON object {"complete":
 * bool, "gaps": [string...] (optional), "next_step": "proceed" |
 * "gather_more" | "replan" (case and `-`/space for `_` forgiven), "note":
 * string}, alone, in a code fence, or with prose around it (the first
 * `{` from which a JSON object parses is taken; at most
 * LOOM_REVIEW_PARSE_ATTEMPTS are tried). Unknown members are
 * ignored. LOOM_EPROTO with a message saying why when there is no such
 * object or a member is missing or of the wrong type; LOOM_ENOMEM. *out
 * is zeroed first and filled only on success.
 */
int loom__review_parse(loom__review *out, const char *text, size_t len);

/*
 * Writes into *out the note the run shows the model in its next turn
 * (as a system message): who wrote it, whether the request is answered,
 * the next step, the gaps and the note. At most about 4 KiB, by the
 * limits above. LOOM_ENOMEM; the caller frees *out.
 */
int loom__review_note(char **out, const loom__review *r);

/* The outcome of one review call. Owned by the caller. */
typedef struct {
    int ok;              /* 1: review holds a parsed review; 0: skipped */
    loom__review review;
    char *reason;        /* skipped: why */
    char *answer;        /* skipped with an answer: its head, cut to
                          * LOOM_REVIEW_EXCERPT_MAX bytes; else NULL */
    loom_usage usage;    /* of the review call */
    int cost_known;
    char *model;         /* the model that answered (from a router), or
                          * NULL */
} loom__review_outcome;

void loom__review_outcome_clear(loom__review_outcome *o);

/*
 * Reviews the run so far (msgs: every message of the run, in order): the
 * transcript and the prompt go to opts->provider as one non-streamed
 * call without tools, and its answer is parsed. Returns 0 with out->ok
 * set, or 0 with out->ok clear and out->reason when the review is
 * skipped (the call failed, the answer is empty, longer than max_answer,
 * or not the JSON asked for). Errors: LOOM_ECANCELED when cancel is set
 * during the call, LOOM_EINVALID without a provider or model, LOOM_ENOMEM.
 * out is always left clearable; usage is filled whenever the call
 * reported it.
 */
int loom__review_run(loom__review_outcome *out,
                     const loom__review_options *opts,
                     const loom_message *msgs, size_t n,
                     loom_cancel *cancel);

/*
 * The data of a `review` event for an outcome of the model call of
 * number iteration: see docs/review.md. NULL when out of memory. The
 * caller owns the object.
 */
json_t *loom__review_event_json(const loom__review_outcome *o,
                                int iteration);

#endif
