/*
 * The forms a turn's tool calls put to whoever runs the turn (see
 * elicit.h), and loom_tool_elicit (loom/tools.h), which an MCP server's
 * elicitation/create reaches through the MCP tool.
 *
 * The list is short (one item per waiting call) and lives under one
 * lock with one condition; setting its call's cancel flag wakes a waiting
 * fiber, and a waiting thread also wakes every POLL_MS to look at the
 * flag, which a signal handler may set without waking anyone (as
 * approval.c does). An answer is checked against the
 * item's schema when it is given, so the one who answers hears what is
 * wrong (the HTTP API's 400) and the call only ever gets valid content.
 */
#include "agent/elicit.h"
#include "agent/subagent.h"
#include "agent/toolexec.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/fiber.h"
#include "loom/run.h"
#include "loom/tools.h"
#include "tools/mcp/mcp_internal.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POLL_MS 50.0

typedef struct item item;
struct item {
    char id[32];
    char *run_id;
    char *call_id;
    json_t *schema; /* the requested schema, or NULL */
    json_t *answer; /* {action, content}; NULL while waiting */
    item *next;
};

struct loom__elicits {
    pthread_mutex_t mu;
    loom__cond cv; /* parks a waiter on a fiber */
    int open;
    long timeout_ms; /* how long a form waits for its answer */
    unsigned next_id;
    item *items;
};

int loom__elicits_new(loom__elicits **out)
{
    loom__elicits *e = calloc(1, sizeof(*e));

    *out = NULL;
    if (!e)
        return loom__error_oom();
    if (pthread_mutex_init(&e->mu, NULL) != 0 || loom__cond_init(&e->cv) != 0) {
        free(e);
        return loom__error_set(LOOM_ERROR, "could not make the forms' lock");
    }
    *out = e;
    return 0;
}

static void item_free(item *it)
{
    free(it->run_id);
    free(it->call_id);
    json_decref(it->schema);
    json_decref(it->answer);
    free(it);
}

void loom__elicits_free(loom__elicits *e)
{
    if (!e)
        return;
    while (e->items) {
        item *nx = e->items->next;
        item_free(e->items);
        e->items = nx;
    }
    loom__cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

void loom__elicits_set_open(loom__elicits *e, int open, long timeout_ms)
{
    pthread_mutex_lock(&e->mu);
    e->open = open != 0;
    e->timeout_ms =
        timeout_ms > 0 ? timeout_ms : LOOM_RUN_DEFAULT_APPROVAL_TIMEOUT_MS;
    pthread_mutex_unlock(&e->mu);
}

int loom__elicits_open(loom__elicits *e)
{
    int open;

    pthread_mutex_lock(&e->mu);
    open = e->open;
    pthread_mutex_unlock(&e->mu);
    return open;
}

/* The answer {action, content} to keep for a form of schema: accepted
 * content gets the defaults, then must fit. */
static int make_answer(const json_t *schema, const char *action,
                       const json_t *content, json_t **out)
{
    json_t *a, *c = NULL;
    char *why = NULL;
    int rc;

    *out = NULL;
    if (!action ||
        (strcmp(action, "accept") != 0 && strcmp(action, "decline") != 0 &&
         strcmp(action, "cancel") != 0))
        return loom__error_set(LOOM_EINVALID,
                               "`action` must be accept, decline or cancel");
    if (strcmp(action, "accept") != 0) {
        if (content && !json_is_null(content))
            return loom__error_set(LOOM_EINVALID,
                                   "`content` goes only with accept");
        return (*out = json_pack("{s:s}", "action", action))
                   ? 0
                   : loom__error_oom();
    }
    if (!json_is_object(content))
        return loom__error_set(LOOM_EINVALID,
                               "accept needs `content`: an object of the "
                               "requested fields");
    if (!(c = json_deep_copy(content)))
        return loom__error_oom();
    if ((rc = loom__mcp_apply_defaults(schema, c)) != 0) {
        json_decref(c);
        return rc;
    }
    if (json_is_object(schema) && loom_schema_validate(schema, c, &why) != 0) {
        rc = loom__error_set(LOOM_EINVALID,
                             "`content` does not fit the "
                             "requested schema: %s",
                             why ? why : loom_error_last());
        free(why);
        json_decref(c);
        return rc;
    }
    if (!(a = json_pack("{s:s,s:o}", "action", "accept", "content", c)))
        return loom__error_oom();
    *out = a;
    return 0;
}

int loom__elicits_answer(loom__elicits *e, const char *id, const char *action,
                         const json_t *content)
{
    json_t *answer = NULL;
    item *it;
    int rc = 0;

    if (!id)
        return loom__error_set(LOOM_EINVALID, "no elicitation id");
    pthread_mutex_lock(&e->mu);
    for (it = e->items; it && (it->answer || strcmp(it->id, id) != 0);
         it = it->next)
        ;
    if (!it)
        rc = loom__error_set(
            LOOM_ENOTFOUND, "elicitation '%s' does not wait for an answer", id);
    else if ((rc = make_answer(it->schema, action, content, &answer)) == 0) {
        it->answer = answer;
        loom__cond_broadcast(&e->cv);
    }
    pthread_mutex_unlock(&e->mu);
    return rc;
}

int loom__elicits_call_waits(loom__elicits *e, const char *run_id,
                             const char *call_id)
{
    int waits = 0;

    if (!e || !run_id || !call_id)
        return 0;
    pthread_mutex_lock(&e->mu);
    for (item *it = e->items; it && !waits; it = it->next)
        waits = !it->answer && strcmp(it->run_id, run_id) == 0 &&
                strcmp(it->call_id, call_id) == 0;
    pthread_mutex_unlock(&e->mu);
    return waits;
}

int loom__elicits_run_waits(loom__elicits *e, const char *run_id)
{
    int waits = 0;

    if (!e || !run_id)
        return 0;
    pthread_mutex_lock(&e->mu);
    for (item *it = e->items; it && !waits; it = it->next)
        waits = !it->answer && strcmp(it->run_id, run_id) == 0;
    pthread_mutex_unlock(&e->mu);
    return waits;
}

size_t loom__elicits_waiting(loom__elicits *e)
{
    size_t n = 0;

    if (!e)
        return 0;
    pthread_mutex_lock(&e->mu);
    for (item *it = e->items; it; it = it->next)
        n += !it->answer;
    pthread_mutex_unlock(&e->mu);
    return n;
}

/* The list of the call's turn, when someone answers it; else NULL. */
static loom__elicits *turn_forms(const loom_tool_ctx *ctx)
{
    loom__elicits *e;

    if (!ctx || !ctx->events || !ctx->host || !ctx->host->tree ||
        !ctx->host->run_id || !ctx->call_id)
        return NULL;
    e = loom__agent_tree_elicits(ctx->host->tree);
    return e && loom__elicits_open(e) ? e : NULL;
}

int loom_tool_can_elicit(const loom_tool_ctx *ctx)
{
    return turn_forms(ctx) != NULL;
}

/* Adds a waiting item for the call (under e->mu); NULL on OOM. */
static item *add_locked(loom__elicits *e, const loom_tool_ctx *ctx,
                        const json_t *schema)
{
    item *it = calloc(1, sizeof(*it));

    if (!it || !(it->run_id = strdup(ctx->host->run_id)) ||
        !(it->call_id = strdup(ctx->call_id)) ||
        (schema && !(it->schema = json_deep_copy(schema)))) {
        if (it)
            item_free(it);
        return NULL;
    }
    snprintf(it->id, sizeof(it->id), "elicit_%u", ++e->next_id);
    it->next = e->items;
    e->items = it;
    return it;
}

/* Unlinks it and frees it; gives its answer (NULL when none). */
static json_t *take_locked(loom__elicits *e, item *it)
{
    json_t *a = it->answer;

    for (item **pp = &e->items; *pp; pp = &(*pp)->next)
        if (*pp == it) {
            *pp = it->next;
            break;
        }
    it->answer = NULL;
    item_free(it);
    return a;
}

/* Sleeps on e->cv until it is answered, cancel is set or deadline
 * (monotonic ms) passes. Under e->mu. */
static void wait_locked(loom__elicits *e, const item *it,
                        const loom_cancel *cancel, double deadline)
{
    while (!it->answer && !loom_cancel_is_set(cancel)) {
        double now = loom__mono_ms_exact(), until = now + POLL_MS;
        if (now >= deadline)
            break;
        if (deadline < until)
            until = deadline;
        if (loom__cond_wait_cancel(&e->cv, &e->mu, until, cancel) == EINVAL)
            break;
    }
}

int loom_tool_elicit(const loom_tool_ctx *ctx, const char *source,
                     const char *message, const json_t *schema, json_t **result)
{
    loom__elicits *e = turn_forms(ctx);
    json_t *ev, *answer;
    item *it;
    int rc;

    *result = NULL;
    if (!e)
        return loom__error_set(LOOM_ENOTFOUND,
                               "nobody answers this turn's questions");
    pthread_mutex_lock(&e->mu);
    it = add_locked(e, ctx, json_is_object(schema) ? schema : NULL);
    pthread_mutex_unlock(&e->mu);
    if (!it)
        return loom__error_oom();
    ev = json_pack("{s:s,s:s,s:s,s:o}", "elicitation_id", it->id, "server",
                   source ? source : "", "message", message ? message : "",
                   "requestedSchema",
                   json_is_object(schema) ? json_deep_copy(schema)
                                          : json_object());
    rc = ev ? loom__tool_ctx_event(ctx, LOOM_EV_MCP_ELICITATION, ev)
            : LOOM_ENOMEM;
    pthread_mutex_lock(&e->mu);
    if (rc == 0)
        wait_locked(e, it, ctx->cancel,
                    loom__mono_ms_exact() + (double)e->timeout_ms);
    answer = take_locked(e, it);
    pthread_mutex_unlock(&e->mu);
    if (rc != 0) {
        json_decref(answer);
        return rc == LOOM_ENOMEM
                   ? loom__error_oom()
                   : loom__error_set(LOOM_ENOTFOUND, "the turn no longer "
                                                     "takes this call's "
                                                     "events");
    }
    /* No answer in time, or the run was cancelled: the form is. */
    if (!answer && !(answer = json_pack("{s:s}", "action", "cancel")))
        return loom__error_oom();
    *result = answer;
    return 0;
}
