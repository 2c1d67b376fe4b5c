/*
 * The loop rules of loop_rules.h: loom's default agent hooks, which
 * carry out the YAML keys retry_without_tool_calls and
 * model_after_retries; which calls cost no iteration; and the count of
 * tools abandoned after an error.
 *
 * The defaults are hooks of the same shape as an embedder's, called by
 * the run where the agent's hooks leave a member NULL: there is one path
 * through the loop, and a YAML key is a hook with its parameters in the
 * run's options.
 */
#include "agent/loop_rules.h"
#include "core/error.h"
#include "loom/log.h"

#include <stdlib.h>
#include <string.h>

static int default_no_calls(const loom_agent_state *st,
                            loom_no_calls_reason reason,
                            const loom_tool_call *calls, size_t ncalls,
                            loom_buf *message, void *payload)
{
    const loom_run_options *o = payload;

    (void)calls;
    (void)ncalls;
    /* The run's limit note (limit_prompt) follows. */
    if (reason == LOOM_NO_CALLS_LIMIT_REACHED)
        return 1;
    if (reason != LOOM_NO_CALLS_GENERATED || st->tools_offered == 0 ||
        st->retries >= o->retry.max)
        return 0;
    if (loom_buf_puts(message, o->retry.prompt && *o->retry.prompt
                                   ? o->retry.prompt
                                   : LOOM__RETRY_PROMPT) != 0)
        return 0;
    return 1;
}

static const char *default_model(const loom_agent_state *st, void *payload)
{
    const loom_run_options *o = payload;

    if (!o->retry.model || !*o->retry.model || o->retry.model_after <= 0 ||
        st->retries < o->retry.model_after)
        return NULL;
    return o->retry.model;
}

const loom_agent_hooks loom__loop_default_hooks = {
    .version = LOOM_AGENT_HOOKS_VERSION,
    .on_no_tool_calls = default_no_calls,
    .get_model = default_model,
};

int loom__loop_non_iterative(const loom_run_options *o, const char *name,
                             int is_think)
{
    if (!o->non_iterative_tools)
        return is_think;
    for (size_t i = 0; name && i < o->non_iterative_tools_len; i++)
        if (strcmp(o->non_iterative_tools[i], name) == 0)
            return 1;
    return 0;
}

int loom__abandoned_failed(loom__abandoned *a, const char *name)
{
    char **p;

    if (!name)
        return 0;
    for (size_t i = 0; i < a->nfailed; i++)
        if (strcmp(a->failed[i], name) == 0)
            return 0;
    if (!(p = realloc(a->failed, (a->nfailed + 1) * sizeof(*p))))
        return loom__error_oom();
    a->failed = p;
    if (!(a->failed[a->nfailed] = strdup(name)))
        return loom__error_oom();
    a->nfailed++;
    return 0;
}

/* Whether tool name is among calls. */
static int called(const char *name, const loom_tool_call *calls, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (calls[i].name && strcmp(calls[i].name, name) == 0)
            return 1;
    return 0;
}

int loom__abandoned_check(loom__abandoned *a, const char *run_id,
                          const loom_tool_call *calls, size_t n)
{
    int rc = 0;

    for (size_t i = 0; i < a->nfailed && !rc; i++) {
        const char *name = a->failed[i];
        json_t *c;
        if (called(name, calls, n))
            continue;
        loom_warn("run %s: tool not chosen after error: %s",
                  run_id ? run_id : "-", name);
        if (!a->counts)
            a->counts = json_object();
        c = a->counts
                ? json_integer(
                      json_integer_value(json_object_get(a->counts, name)) + 1)
                : NULL;
        if (!c || json_object_set_new(a->counts, name, c) != 0)
            rc = loom__error_oom();
    }
    loom__abandoned_forget(a);
    return rc;
}

void loom__abandoned_forget(loom__abandoned *a)
{
    for (size_t i = 0; i < a->nfailed; i++)
        free(a->failed[i]);
    free(a->failed);
    a->failed = NULL;
    a->nfailed = 0;
}

void loom__abandoned_clear(loom__abandoned *a)
{
    loom__abandoned_forget(a);
    json_decref(a->counts);
    a->counts = NULL;
}
