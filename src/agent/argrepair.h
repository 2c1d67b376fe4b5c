/*
 * Internal: repairing a tool call's arguments that are not valid JSON
 * with a short side model call (a tool's `repair_arguments: {model}`,
 * for tools whose arguments models often get wrong, such as a long
 * report's; docs/agents.md "Tool rules").
 *
 * The repair model reads the tool's name, its JSON Schema and the
 * broken text, and answers with the arguments as one JSON object. What
 * it answers is only parsed here: the caller validates it against the
 * schema like any arguments, so a repair can never give a tool
 * arguments that do not fit. The call's usage is handed back for the
 * run to count.
 */
#ifndef LOOM_AGENT_ARGREPAIR_H
#define LOOM_AGENT_ARGREPAIR_H

#include "loom/cancel.h"
#include "loom/llm.h"

#include <jansson.h>

/* The repair answer's limit in tokens. */
#define LOOM__REPAIR_MAX_TOKENS 1024
/* Bytes of the broken arguments shown to the repair model. */
#define LOOM__REPAIR_INPUT_MAX (32 * 1024)
/* Bytes of the repair model's answer read. */
#define LOOM__REPAIR_ANSWER_MAX (64 * 1024)

/* The repair model's instructions. */
extern const char LOOM__REPAIR_PROMPT[];

/* The outcome of one repair call. */
typedef struct {
    json_t *args;     /* the repaired arguments (an object), or NULL */
    char *why;        /* when args is NULL: why, for the model's error */
    loom_usage usage; /* of the call, whatever came of it */
    int cost_known;
    char *model; /* the model that answered (a router's), or NULL */
} loom__repair_outcome;

void loom__repair_outcome_clear(loom__repair_outcome *o);

/*
 * Asks model (the upstream id) on provider to turn raw, the broken
 * arguments of a call to tool (its name, and its schema, which may be
 * NULL), into a JSON object. A repair that fails (the call fails, the
 * answer holds no JSON object) is no error: out->args is NULL and
 * out->why says why. The call goes through gate (gate.h; NULL: none):
 * a refused call is a failed repair. Returns 0, LOOM_ECANCELED or
 * LOOM_ENOMEM.
 */
struct loom__gate;
int loom__args_repair(loom__repair_outcome *out, loom_provider *provider,
                      const char *model, const char *tool, const json_t *schema,
                      const char *raw, const struct loom__gate *gate,
                      loom_cancel *cancel);

#endif
