/*
 * A scripted loom_provider for the unit tests of the run loop: complete()
 * replays a table of answers (text, tool calls, text after the calls,
 * usage, a failure, or a wait for cancellation), one per request, and
 * records what each request carried (tool names, tool choice, message
 * roles, the last message and the system message). The provider lives in
 * the caller's memory: mock_init() sets it up, mock_clear() frees what
 * the recording allocated. Running past the table, or past
 * MOCK_MAX_TURNS requests, fails the test (a cmocka assertion).
 */
#ifndef LOOM_MOCK_PROVIDER_H
#define LOOM_MOCK_PROVIDER_H

#include "loom/llm.h"

#include <stddef.h>

/* Calls one answer may list, and requests one mock answers. */
#define MOCK_MAX_CALLS 8
#define MOCK_MAX_TURNS 32

/* mock_init() flags. */
/* Streams one LOOM_LLM_TOOL_CALL_DELTA per call (its whole id, name and
 * arguments) after the text, as an adapter does. */
#define MOCK_STREAM_CALLS 1u
/* Sets provider_state to {"mock":{"turn":<1-based request>}}. */
#define MOCK_STATE 2u

/* One scripted answer. Unset fields are zero. */
typedef struct {
    const char *text;                          /* one TEXT delta; NULL: none */
    const char *calls[MOCK_MAX_CALLS][3];      /* {id, name, arguments} */
    int ncalls;
    /* When > 0: this many calls of calls[0]'s tool, ids "m<i>", arguments
     * calls[0][2] with its first "%d" replaced by i. */
    int many;
    const char *text_after; /* a TEXT delta after the call deltas */
    long prompt, completion; /* usage reported */
    int fail_rc;     /* returned instead of an answer: a 500 after 3 tries */
    int wait_cancel; /* blocks until cancelled; returns LOOM_ECANCELED */
} mock_answer;

/* What one request carried. Strings are owned by the mock. */
typedef struct {
    size_t tools_len;
    char *tools; /* the tools' names, "a,b,c" */
    loom_tool_choice_kind choice;
    size_t nmsg;
    loom_role last_role;  /* of the last message */
    char *last_content;   /* of the last message; NULL when it has none */
    char *all_roles;      /* first letter of each role: "suat" */
    char *system;         /* the first message when a system one, or NULL */
    size_t nsystem;       /* system messages */
    char *first_tool;     /* content of the first tool message, or NULL */
    char *tool_texts;     /* every tool message's content, joined by "|" */
    char *choice_fn;      /* the forced function's name, or NULL */
    char *model;          /* the request's model, or NULL */
    char *first_user;     /* content of the first user message, or NULL */
} mock_seen;

/* Called with each request's usage as its answer set it; may change it. */
typedef void (*mock_usage_fn)(const loom_llm_request *req, loom_usage *usage,
                              void *payload);

typedef struct {
    loom_provider base; /* first: &m->base is the provider */
    const mock_answer *answers;
    int n;    /* answers in the table */
    int next; /* requests answered so far */
    unsigned flags;
    mock_usage_fn usage; /* NULL: the answer's usage as it is */
    void *usage_payload;
    mock_seen seen[MOCK_MAX_TURNS];
} mock_provider;

/*
 * Sets m up (zeroed first) to answer request k with answers[k], k < n;
 * answers is borrowed and must outlive the provider's use. flags are
 * MOCK_* bits. base.name and usage are left NULL.
 */
void mock_init(mock_provider *m, const mock_answer *answers, int n,
               unsigned flags);

/* Frees what m recorded; m may be set up again after. */
void mock_clear(mock_provider *m);

#endif
