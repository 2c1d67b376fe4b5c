/*
 * The model loom uses when nothing names one, the same for `loom run` and
 * `loom serve`: $LOOM_MODEL, else the first model the config lists, else
 * a well-known model of the first provider, chosen by its wire format
 * (a provider built from OPENAI_API_KEY alone answers to gpt-4o-mini, one
 * from ANTHROPIC_API_KEY to claude-sonnet-4-5, and so on).
 */
#include "core/error.h"
#include "loom/config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kind_models[][2] = {
    {"openai", "gpt-4o-mini"},
    {"openai-responses", "gpt-4o-mini"},
    {"anthropic", "claude-sonnet-4-5"},
    {"gemini", "gemini-2.5-flash"},
};

const char *loom_config_kind_default_model(const char *kind)
{
    for (size_t i = 0; kind && i < sizeof(kind_models) / sizeof(*kind_models);
         i++)
        if (strcmp(kind_models[i][0], kind) == 0)
            return kind_models[i][1];
    return kind_models[0][1];
}

int loom_config_default_model(char **out, const loom_config *cfg)
{
    const char *env = getenv("LOOM_MODEL");
    const loom_provider_config *p;

    *out = NULL;
    if (env && *env)
        *out = strdup(env);
    else if (cfg->models_len)
        *out = strdup(cfg->models[0].name);
    else if (cfg->providers_len) {
        p = &cfg->providers[0];
        if (asprintf(out, "%s/%s", p->name,
                     loom_config_kind_default_model(p->kind)) < 0)
            *out = NULL;
    } else
        return 0;
    return *out ? 0 : loom__error_oom();
}
