/*
 * Internal: a conversation's title, written by a short model call after
 * its first answer (docs/server.md "Conversation titles").
 *
 * The call reads the user's first message and the answer (each cut), and
 * is asked for a few words. Its answer is untrusted text: only the first
 * line is kept, markup around it (quotes, `#`, `*`, "Title:") is taken
 * off, control characters become spaces, runs of spaces one, and it is
 * cut to LOOM_TITLE_MAX bytes on a character. A call that fails or says
 * nothing usable gives no title (the store keeps the one it made from
 * the user's first words). Only cancellation and running out of memory
 * are errors.
 */
#ifndef LOOM_AGENT_TITLE_H
#define LOOM_AGENT_TITLE_H

#include "agent/gate.h"
#include "loom/cancel.h"
#include "loom/llm.h"

#include <stddef.h>

/* Bytes of a title, at most. */
#define LOOM_TITLE_MAX 80
/* Bytes of the user's message and of the answer the call reads. */
#define LOOM_TITLE_INPUT_MAX 1500
/* The call's answer limit in tokens. */
#define LOOM_TITLE_MAX_TOKENS 32

extern const char LOOM_TITLE_PROMPT[];

/* What the call did: its usage (counted whatever the title's source). */
typedef struct {
    char *title; /* NULL: none usable */
    loom_usage usage;
    int cost_known;
    char *model; /* the answering model, or NULL */
} loom__title_outcome;

void loom__title_outcome_clear(loom__title_outcome *o);

/*
 * The title of text as shown in a list: the rules above, written to dst
 * (cap > LOOM_TITLE_MAX bytes). Returns strlen(dst).
 */
size_t loom__title_clean(char *dst, size_t cap, const char *text);

/*
 * Asks provider (model: the upstream id) for the title of a conversation
 * that began with user and was answered with answer (either may be NULL),
 * through the run's gate (NULL: none; a refused call gives no title).
 * 0, LOOM_ECANCELED or LOOM_ENOMEM.
 */
int loom__title_run(loom__title_outcome *out, const loom__gate *gate,
                    loom_provider *provider, const char *model,
                    const char *user, const char *answer, loom_cancel *cancel);

#endif
