/*
 * What the provider tests (tests/integration/test_provider_*.c) share: a
 * provider of one kind in front of a loom-fake-upstream, one model call
 * at a time with every event it emits recorded, the request bodies the
 * fake saw, JSON comparisons, and the tools of a whole run through
 * loom_run (echo, and one that always fails). Each test file keeps only
 * its provider's names and what it checks. Failures are cmocka
 * assertions.
 */
#ifndef LOOM_PROVIDER_HARNESS_H
#define LOOM_PROVIDER_HARNESS_H

#include "fake.h"
#include "loom/buf.h"
#include "loom/cancel.h"
#include "loom/llm.h"
#include "loom/tools.h"

#include <jansson.h>

/* One provider, its fake, a conversation and the last call's outcome. */
typedef struct {
    loom_fake *fake; /* NULL when the provider points elsewhere */
    loom_provider_config cfg;
    loom_provider *p;
    loom_messages msgs; /* sent as req.messages on every call */
    loom_llm_request req;
    loom_llm_response resp;
    /* What the events of the last call carried. */
    loom_buf events_text;      /* TEXT deltas, joined */
    loom_buf events_reasoning; /* REASONING deltas, joined */
    loom_buf order;            /* one letter per event: T R D C U F E */
    int ndeltas;               /* TOOL_CALL_DELTA events */
    int ncalls_events;         /* TOOL_CALLS events */
    int abort_on_text;         /* set: the callback aborts at a TEXT */
} provider_ctx;

/*
 * Fills cfg (zeroed first) for a provider of kind named name: base_url, or
 * fake's when NULL; api_key (may be NULL); headers (stolen; NULL: none);
 * timeouts loose enough for a loaded machine (5 s to connect, 30 s to the
 * first byte and between bytes); retries extra attempts 10 to 50 ms
 * apart. The caller releases cfg->headers.
 */
void provider_config(loom_provider_config *cfg, loom_fake *fake,
                     const char *base_url, const char *name, const char *kind,
                     const char *api_key, json_t *headers, int retries);

/*
 * A provider as provider_config() says, in front of fake (taken; may be
 * NULL with a base_url), with one user message "Hi" and a request of
 * model. Never NULL: failures are assertions. provider_stop() ends it.
 */
provider_ctx *provider_start(loom_fake *fake, const char *base_url,
                             const char *name, const char *kind,
                             const char *api_key, json_t *headers,
                             const char *model, int retries);

/* Makes the provider again after a change to c->cfg. */
void provider_reconfigure(provider_ctx *c);

/*
 * One call of c->req over c->msgs: the last response and the recorded
 * events are cleared first. Returns what loom_provider_complete()
 * returned; with LOOM_TEST_VERBOSE set, prints it and the error message.
 */
int provider_run(provider_ctx *c, loom_cancel *cancel);

/* Appends the answer in c->resp to c->msgs as an assistant message with
 * its provider_state, as the run loop does. */
void provider_add_answer(provider_ctx *c);

/* provider_run() with a cancel flag that another thread sets after_ms
 * from now (it is joined before this returns). */
int provider_run_canceled(provider_ctx *c, long after_ms);

/* Frees c and stops its fake; returns the fake's exit status (see
 * fake_stop_check), 0 without a fake. */
int provider_stop(provider_ctx *c);

/* The body of the request the fake recorded at i (a new reference). */
json_t *provider_sent_body(loom_fake *fake, size_t i);

/* Asserts that v equals the JSON text want (any JSON value), printing
 * both when not. */
void assert_json(const json_t *v, const char *want);

/* A copy of s with every ' turned into " (the caller frees): JSON that a
 * C string can hold without escapes. */
char *provider_quotes(const char *s);

/*
 * A registry with the tools of a whole run: "echo" ({"text": string},
 * answers "echo:<text>") and "fail" (no parameters, fails with "disk on
 * fire"). The caller frees it.
 */
loom_tool_registry *provider_tools(void);

#endif
