/*
 * What every provider shares whatever its adapter (loom/llm.h): the
 * response cleanup, the names of upstream error kinds, and making the
 * adapter that a provider config's `kind` names.
 */
#include "core/error.h"
#include "loom/llm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void loom_llm_response_clear(loom_llm_response *r)
{
    free(r->text);
    free(r->reasoning);
    for (size_t i = 0; i < r->tool_calls_len; i++)
        loom_tool_call_clear(&r->tool_calls[i]);
    free(r->tool_calls);
    free(r->finish_reason);
    free(r->response_id);
    free(r->provider_state);
    free(r->error.type);
    free(r->error.message);
    free(r->error.request_id);
    json_decref(r->error.headers);
    free(r->model);
    memset(r, 0, sizeof(*r));
}

const char *loom_upstream_kind_name(loom_upstream_kind kind)
{
    static const char *const names[] = {
        "none",          "bad_request", "authentication", "permission",
        "not_found",     "timeout",     "conflict",       "too_large",
        "unprocessable", "rate_limit",  "server",         "connection",
        "stream",        "protocol"};
    return (unsigned)kind < sizeof(names) / sizeof(names[0]) ? names[kind]
                                                             : "unknown";
}

void loom_provider_free(loom_provider *p)
{
    if (p && p->vt && p->vt->free)
        p->vt->free(p);
}

/* Every adapter, by the `kind` a provider config names. */
static const struct {
    const char *kind;
    int (*make)(loom_provider **out, const loom_provider_config *config);
} adapters[] = {
    {"openai", loom_provider_openai_new},
    {"anthropic", loom_provider_anthropic_new},
    {"openai-responses", loom_provider_responses_new},
    {"gemini", loom_provider_gemini_new},
    /* Further adapters add one line here. */
};

int loom_provider_new(loom_provider **out, const loom_provider_config *config)
{
    const char *kind = config->kind ? config->kind : "openai";
    char known[256] = "";

    *out = NULL;
    for (size_t i = 0; i < sizeof(adapters) / sizeof(adapters[0]); i++) {
        if (strcmp(kind, adapters[i].kind) == 0)
            return adapters[i].make(out, config);
        snprintf(known + strlen(known), sizeof(known) - strlen(known), "%s%s",
                 i ? ", " : "", adapters[i].kind);
    }
    return loom__error_set(LOOM_EINVALID,
                           "provider '%s': unknown kind '%s' (known: %s)",
                           config->name ? config->name : "?", kind, known);
}
