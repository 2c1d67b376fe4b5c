/*
 * libFuzzer target for the configuration loader (loom/config.h): the input
 * is YAML text, loaded with loom_config_load_string from a NUL-terminated
 * copy. A config that loads is walked through the lookups a run makes
 * (default agent, each agent's model and provider); one that does not
 * must leave *out NULL and a message. The variables the seed files name
 * are set, so seeds load whole and the fuzzer starts from valid configs.
 * Built only with -DLOOM_FUZZ=ON and clang; tests/unit/test_fuzz_corpus.c
 * includes this file with LOOM_FUZZ_NO_ENTRY defined to replay the corpus.
 */
#include "loom/common.h"
#include "loom/config.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void fcf_walk(const loom_config *cfg)
{
    const loom_model_config *m;
    loom_model_config tmp;

    if (cfg->default_agent && !loom_config_agent(cfg, cfg->default_agent))
        abort(); /* the loader checks that the default agent exists */
    for (size_t i = 0; i < cfg->agents_len; i++) {
        const loom_agent_config *a = &cfg->agents[i];

        if (!a->name || loom_config_agent(cfg, a->name) == NULL)
            abort();
        if (!a->model)
            continue;
        memset(&tmp, 0, sizeof(tmp));
        m = NULL;
        if (loom_config_model(&m, &tmp, cfg, a->model) == 0) {
            if (!m || !m->provider || !loom_config_provider(cfg, m->provider))
                abort();
        }
        loom_model_config_clear(&tmp);
    }
    for (size_t i = 0; i < cfg->providers_len; i++)
        if (!cfg->providers[i].name || !cfg->providers[i].base_url ||
            !cfg->providers[i].headers)
            abort();
    if (!cfg->tools)
        abort();
}

static int fuzz_config_one(const uint8_t *data, size_t size)
{
    loom_config *cfg = NULL;
    char *yaml;
    int rc;

    /* Names the seed configs use; 0: keep a value already set. */
    setenv("OPENAI_API_KEY", "sk-fuzz", 0);
    setenv("LOOM_TEST_FULL_KEY", "sk-fuzz-full", 0);
    yaml = malloc(size + 1);
    if (!yaml)
        return 0;
    if (size)
        memcpy(yaml, data, size);
    yaml[size] = '\0';
    rc = loom_config_load_string(&cfg, yaml, "fuzz.yaml");
    if (rc == 0) {
        if (!cfg)
            abort();
        fcf_walk(cfg);
    } else if (cfg || rc > 0 || loom_error_last()[0] == '\0') {
        abort();
    }
    loom_config_free(cfg);
    free(yaml);
    return 0;
}

#ifndef LOOM_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_config_one(data, size);
}
#endif
