/*
 * Repairing broken tool arguments with a side model call (see
 * argrepair.h). The answer is searched for its first JSON object, as a
 * model may wrap it in a code fence or a sentence despite being told
 * not to.
 */
#include "agent/argrepair.h"
#include "agent/gate.h"
#include "core/error.h"
#include "core/utf8.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char LOOM__REPAIR_PROMPT[] =
    "You repair the arguments of a tool call. The model that called the "
    "tool wrote arguments that are not valid JSON. Extract what it meant "
    "and answer with the arguments as one JSON object that fits the "
    "tool's JSON Schema, and nothing else: no prose, no code fence. Keep "
    "the values the model wrote; do not invent values it did not give.";

/* Most `{` of an answer tried as the start of the object. */
#define PARSE_ATTEMPTS 32

void loom__repair_outcome_clear(loom__repair_outcome *o)
{
    json_decref(o->args);
    free(o->why);
    free(o->model);
    memset(o, 0, sizeof(*o));
}

static int on_repair_event(const loom_llm_event *ev, void *payload)
{
    (void)ev;
    return payload ? loom_cancel_is_set((loom_cancel *)payload) : 0;
}

/* The first JSON object of text, or NULL. */
static json_t *first_object(const char *text)
{
    const char *p = text;

    for (int i = 0; i < PARSE_ATTEMPTS && (p = strchr(p, '{')) != NULL;
         i++, p++) {
        json_t *v = json_loads(p, JSON_DISABLE_EOF_CHECK, NULL);
        if (json_is_object(v))
            return v;
        json_decref(v);
    }
    return NULL;
}

/* The user message: the tool, its schema and the broken text. */
static char *repair_input(const char *tool, const json_t *schema,
                          const char *raw)
{
    char *dump =
        schema ? json_dumps(schema, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    size_t len = strlen(raw),
           cut = loom__utf8_cut(raw, len, LOOM__REPAIR_INPUT_MAX);
    char *out = NULL;

    if (asprintf(&out,
                 "Tool: %s\nJSON Schema of its arguments: %s\nThe broken "
                 "arguments:\n%.*s%s",
                 tool, dump ? dump : "{\"type\":\"object\"}", (int)cut, raw,
                 cut < len ? "..." : "") < 0)
        out = NULL;
    free(dump);
    return out;
}

static int fail_why(loom__repair_outcome *out, const char *why,
                    const char *detail)
{
    if (asprintf(&out->why, "%s%s", why, detail ? detail : "") < 0) {
        out->why = NULL;
        return loom__error_oom();
    }
    return 0;
}

int loom__args_repair(loom__repair_outcome *out, loom_provider *provider,
                      const char *model, const char *tool, const json_t *schema,
                      const char *raw, const loom__gate *gate,
                      loom_cancel *cancel)
{
    loom_llm_request req = LOOM_LLM_REQUEST_INIT;
    loom_llm_response resp;
    loom_message m[2];
    char *input;
    int rc;

    memset(out, 0, sizeof(*out));
    memset(&resp, 0, sizeof(resp));
    if (!(input = repair_input(tool, schema, raw)))
        return loom__error_oom();
    memset(m, 0, sizeof(m));
    m[0].role = LOOM_ROLE_SYSTEM;
    m[0].content = (char *)LOOM__REPAIR_PROMPT;
    m[1].role = LOOM_ROLE_USER;
    m[1].content = input;
    req.model = model;
    req.messages = m;
    req.messages_len = 2;
    req.max_tokens = LOOM__REPAIR_MAX_TOKENS;
    req.stream = 0;
    rc = loom__gated_complete(gate, provider, &req, on_repair_event, cancel,
                              &resp, cancel);
    free(input);
    out->usage = resp.usage;
    out->cost_known = resp.cost_known;
    if (resp.model && !(out->model = strdup(resp.model)))
        rc = loom__error_oom();
    else if (rc == LOOM_ECANCELED || (cancel && loom_cancel_is_set(cancel)))
        rc = loom__error_set(LOOM_ECANCELED, "cancelled while repairing "
                                             "arguments");
    else if (rc != 0 && rc != LOOM_ENOMEM)
        rc = fail_why(out, "the repair call failed: ",
                      resp.error.message ? resp.error.message
                                         : loom_error_last());
    else if (rc == 0 &&
             (!resp.text || strlen(resp.text) > LOOM__REPAIR_ANSWER_MAX ||
              !(out->args = first_object(resp.text))))
        rc = fail_why(out, "the repair model answered no JSON object", NULL);
    loom_llm_response_clear(&resp);
    return rc;
}
