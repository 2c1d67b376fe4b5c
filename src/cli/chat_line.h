/*
 * The pure parts of `loom chat` (docs/chat.md), kept apart from the
 * terminal so they are unit tested: what a typed line asks for (a
 * message or a /command), the sum of a conversation's stored usage rows
 * that /cost shows, and where the line history is kept.
 */
#ifndef LOOM_CLI_CHAT_LINE_H
#define LOOM_CLI_CHAT_LINE_H

#include <jansson.h>
#include <stddef.h>

typedef enum {
    CHAT_SAY,      /* a message for the model (arg: the text) */
    CHAT_EMPTY,    /* nothing but blanks */
    CHAT_NEW,      /* /new */
    CHAT_AGENT,    /* /agent [NAME] (arg_len 0: show the agent) */
    CHAT_MODEL,    /* /model [NAME] (arg_len 0: show the model) */
    CHAT_COST,     /* /cost */
    CHAT_RESEARCH, /* /research QUESTION */
    CHAT_HELP,     /* /help */
    CHAT_EXIT,     /* /exit or /quit */
    CHAT_UNKNOWN,  /* a /word no command has (arg: the word) */
    CHAT_BAD       /* a command used wrongly (error: why) */
} chat_verb;

typedef struct {
    chat_verb verb;
    const char *arg; /* into the line; not NUL-terminated at arg_len */
    size_t arg_len;
    const char *error; /* CHAT_BAD: a static message */
} chat_command;

/*
 * Reads a typed line (NUL-terminated; blanks around it ignored). A line
 * that starts with '/' is a command: its name, then its argument after
 * blanks. "//text" is the message "/text", for a message that starts
 * with a slash. Anything else is a message.
 */
void chat_parse(const char *line, chat_command *out);

/* The commands, one per line, for /help. */
extern const char chat_help[];

/* What a conversation's usage rows add up to. */
typedef struct {
    long long calls; /* model calls (rows) */
    long long prompt, completion, cached, reasoning, total;
    long long cost_micros; /* of the priced rows */
    long long priced;      /* rows with a cost */
} chat_cost;

/*
 * Adds the usage rows of loom_store_conversation_get's "usage" array
 * (each {prompt_tokens, completion_tokens, cached_tokens,
 * reasoning_tokens, total_tokens, cost_micros}; missing or null fields
 * count 0, a null cost_micros leaves the row unpriced) to c.
 */
void chat_cost_add(chat_cost *c, const json_t *usage);

/*
 * c as /cost shows it, in buf (cap bytes, cut when short): "2 model
 * calls, 161 tokens (150 prompt, 11 completion), $0.000172"; cached and
 * reasoning tokens when any; the cost when every call was priced, else
 * how many were.
 */
void chat_cost_format(const chat_cost *c, char *buf, size_t cap);

/*
 * The history file: $XDG_STATE_HOME/loom/chat_history when xdg_state is
 * an absolute path, else <home>/.local/state/loom/chat_history. NULL
 * when neither is usable (or out of memory); else caller frees.
 */
char *chat_history_path(const char *xdg_state, const char *home);

#endif
