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

/*
 * Context windows of well-known models, by upstream id prefix, longest
 * prefix first where they overlap. Used only when the config gives none:
 * a listed model's `context_window` always wins.
 */
static const struct {
    const char *prefix;
    long window;
} known_windows[] = {
    {"gpt-4o", 128000},
    {"gpt-4.1", 1047576},
    {"gpt-4-turbo", 128000},
    {"gpt-4", 8192},
    {"gpt-3.5-turbo", 16385},
    {"gpt-5", 400000},
    {"o1", 200000},
    {"o3", 200000},
    {"o4", 200000},
    {"claude-", 200000},
    {"gemini-1.5", 1048576},
    {"gemini-2", 1048576},
};

long loom_config_known_context_window(const char *upstream)
{
    size_t best = 0;
    long window = 0;

    for (size_t i = 0; upstream && i < sizeof(known_windows) /
                                           sizeof(known_windows[0]);
         i++) {
        size_t n = strlen(known_windows[i].prefix);
        if (n > best && strncmp(upstream, known_windows[i].prefix, n) == 0) {
            best = n;
            window = known_windows[i].window;
        }
    }
    return window;
}

/* OpenAI's reasoning models, which refuse max_tokens. A family is its
 * prefix followed by the end or a '-' ("o1", "o3-mini", "gpt-5.1" by the
 * '.'), so "o1x" or "gpt-50" are not taken for one. */
static const char *const completion_tokens_families[] = {"o1", "o3", "o4",
                                                         "gpt-5"};

int loom_config_known_max_completion_tokens(const char *upstream)
{
    const char *slash;

    if (!upstream)
        return 0;
    /* Routers (OpenRouter, LiteLLM) name them "openai/o3". */
    if ((slash = strrchr(upstream, '/')))
        upstream = slash + 1;
    for (size_t i = 0; i < sizeof(completion_tokens_families) /
                               sizeof(completion_tokens_families[0]);
         i++) {
        size_t n = strlen(completion_tokens_families[i]);
        if (strncmp(upstream, completion_tokens_families[i], n) == 0 &&
            (!upstream[n] || upstream[n] == '-' || upstream[n] == '.'))
            return 1;
    }
    return 0;
}
