/*
 * The tools of an agent's handoffs (see handoff.h): one definition per
 * agent it may hand the run over to, named transfer_to_<agent>, as users
 * of the OpenAI Agents SDK know them. The parameters are one schema
 * shared by every tool of a set: an optional "reason" the model may give,
 * which the agent.changed event reports.
 */
#include "agent/handoff.h"
#include "core/error.h"
#include "core/text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A handoff's description when the agent has none. */
#define DEFAULT_DESCRIPTION                                                    \
    "Hand the conversation over to the agent '%s', which answers the "         \
    "user from here on. Call it when that agent is better suited to the "      \
    "request."

struct loom__handoffs {
    loom_tool *tools;
    const char **targets; /* borrowed from the handoffs given */
    size_t n;
    json_t *parameters;
};

/* Frees what tool i owns: its name and description. */
static void tool_clear(loom_tool *t)
{
    free((char *)t->name);
    free((char *)t->description);
}

static int tool_make(loom_tool *t, const loom_run_handoff *h,
                     const json_t *parameters)
{
    char *name = NULL, *desc = NULL;

    if (!h->agent)
        return loom__error_set(LOOM_EINVALID, "a handoff names no agent");
    if (asprintf(&name, "%s%s", LOOM__HANDOFF_PREFIX, h->agent) < 0)
        return loom__error_oom();
    if (!loom__text_is_name(name, 0)) {
        free(name);
        return loom__error_set(LOOM_EINVALID,
                               "handoff to '%s': transfer_to_<agent> is not "
                               "a tool name ([a-zA-Z0-9_-]{1,64})",
                               h->agent);
    }
    if (h->description && *h->description)
        desc = strdup(h->description);
    else if (asprintf(&desc, DEFAULT_DESCRIPTION, h->agent) < 0)
        desc = NULL;
    if (!desc) {
        free(name);
        return loom__error_oom();
    }
    t->version = LOOM_TOOL_VERSION;
    t->name = name;
    t->description = desc;
    t->parameters = parameters;
    return 0;
}

int loom__handoffs_new(loom__handoffs **out, const loom_run_handoff *h,
                       size_t n)
{
    loom__handoffs *hs = calloc(1, sizeof(*hs));
    int rc = 0;

    *out = NULL;
    if (!hs || !(hs->tools = calloc(n + 1, sizeof(*hs->tools))) ||
        !(hs->targets = calloc(n + 1, sizeof(*hs->targets))) ||
        !(hs->parameters =
              json_pack("{s:s,s:{s:{s:s,s:s}},s:b}", "type", "object",
                        "properties", "reason", "type", "string", "description",
                        "Why the conversation is handed over (optional).",
                        "additionalProperties", 0))) {
        loom__handoffs_free(hs);
        return loom__error_oom();
    }
    for (size_t i = 0; i < n && !rc; i++) {
        for (size_t j = 0; j < i && !rc; j++)
            if (h[i].agent && strcmp(hs->targets[j], h[i].agent) == 0)
                rc = loom__error_set(LOOM_EINVALID,
                                     "handoff to '%s' is given twice",
                                     h[i].agent);
        if (!rc && (rc = tool_make(&hs->tools[i], &h[i], hs->parameters)) == 0)
            hs->targets[hs->n++] = h[i].agent;
    }
    if (rc) {
        loom__handoffs_free(hs);
        return rc;
    }
    *out = hs;
    return 0;
}

void loom__handoffs_free(loom__handoffs *hs)
{
    if (!hs)
        return;
    for (size_t i = 0; i < hs->n; i++)
        tool_clear(&hs->tools[i]);
    free(hs->tools);
    free(hs->targets);
    json_decref(hs->parameters);
    free(hs);
}

size_t loom__handoffs_count(const loom__handoffs *hs)
{
    return hs ? hs->n : 0;
}

const loom_tool *loom__handoffs_tool(const loom__handoffs *hs, size_t i)
{
    return &hs->tools[i];
}

const char *loom__handoffs_target(const loom__handoffs *hs,
                                  const loom_tool *tool)
{
    for (size_t i = 0; hs && i < hs->n; i++)
        if (tool == &hs->tools[i])
            return hs->targets[i];
    return NULL;
}
