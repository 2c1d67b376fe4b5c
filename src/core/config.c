/*
 * Configuration: the public side. A config is the environment's providers
 * (openai and openai-responses from OPENAI_*, anthropic from ANTHROPIC_*,
 * gemini from GEMINI_*) with one YAML file read over them: the file adds
 * providers, models, agents and tool settings and replaces providers of
 * the same name. This file holds what does not depend on YAML: building
 * and freeing configs, the environment, reading the file under its 4 MiB
 * limit, the lookups, model resolution and exact price parsing.
 * config_yaml.c turns the YAML text into the config.
 */
#include "loom/config.h"
#include "core/config_internal.h"
#include "core/error.h"
#include "loom/buf.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define DEFAULT_OPENAI_URL "https://api.openai.com/v1"
#define DEFAULT_ANTHROPIC_URL "https://api.anthropic.com"
#define DEFAULT_GEMINI_URL "https://generativelanguage.googleapis.com"

/* The wire formats a provider may speak, with the base URL a file may
 * leave out (NULL: base_url is required). */
static const struct {
    const char *kind;
    const char *default_url;
} kinds[] = {
    {"openai", NULL},
    {"openai-responses", DEFAULT_OPENAI_URL},
    {"anthropic", DEFAULT_ANTHROPIC_URL},
    {"gemini", DEFAULT_GEMINI_URL},
};

int loom__config_kind_known(const char *kind, const char **default_url)
{
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        if (strcmp(kinds[i].kind, kind) == 0) {
            if (default_url)
                *default_url = kinds[i].default_url;
            return 1;
        }
    }
    return 0;
}

const char *loom__config_kind_names(void)
{
    return "openai, openai-responses, anthropic, gemini";
}

/* ---- helpers shared with config_yaml.c ---------------------------- */

static char *dup_str(const char *s)
{
    return s ? strdup(s) : NULL;
}

/* Appends name to a ", "-separated list in dst (cap bytes, at least 8),
 * ending it with "..." once it is full. */
void loom__config_names_add(char *dst, size_t cap, const char *name)
{
    size_t len = strlen(dst), need = strlen(name) + (len ? 2 : 0);

    if (len >= 3 && strcmp(dst + len - 3, "...") == 0)
        return;
    if (len + need + 4 >= cap) {
        snprintf(dst + len, cap - len, "%s...", len ? ", " : "");
        return;
    }
    snprintf(dst + len, cap - len, "%s%s", len ? ", " : "", name);
}

const char *loom__config_provider_names(char *dst, size_t cap,
                                        const loom_config *cfg)
{
    dst[0] = '\0';
    for (size_t i = 0; i < cfg->providers_len; i++)
        loom__config_names_add(dst, cap, cfg->providers[i].name);
    return cfg->providers_len ? dst : "none";
}

/* ---- the public lookups ----------------------------------------------- */

const loom_provider_config *loom_config_provider(const loom_config *cfg,
                                                 const char *name)
{
    if (!cfg || !name)
        return NULL;
    for (size_t i = 0; i < cfg->providers_len; i++)
        if (strcmp(cfg->providers[i].name, name) == 0)
            return &cfg->providers[i];
    return NULL;
}

/*
 * The built-in research agents (docs/research.md): the supervisor runs
 * research (its tools are the research run's own) and the researcher
 * searches and reads the web. Their prompts are research.c's; a config
 * that defines an agent of either name replaces it.
 */
static char researcher_search[] = "web_search";
static char researcher_fetch[] = "web_fetch";
static char *researcher_tools[] = {researcher_search, researcher_fetch};
static char research_name[] = LOOM_RESEARCH_AGENT;
static char researcher_name[] = LOOM_RESEARCHER_AGENT;
static char research_desc[] =
    "Researches a question on the web with parallel researchers and "
    "writes a cited report.";
static char researcher_desc[] =
    "Searches and reads the web on one research task and writes an "
    "intermediate report citing what it read.";
static char researcher_prompt[] =
    "You are a researcher on one task of a larger research effort. Search "
    "the web (web_search) and read the most promising pages (web_fetch), "
    "then write an intermediate report of what you found, citing every "
    "claim with the source numbers you were given, as [n]. Report only "
    "what your sources say.";
static const loom_agent_config builtin_agents[] = {
    {.name = research_name,
     .description = research_desc,
     .tools_len = 0,
     .max_iterations = 10,
     .parallel_tool_calls = 1,
     .tool_concurrency = LOOM_RESEARCH_DEFAULT_PARALLEL,
     .citations = 1,
     .count_sub_agent_calls = 0,
     .max_depth = 3,
     .max_sub_runs = 200,
     .research = 1},
    {.name = researcher_name,
     .description = researcher_desc,
     .system_prompt = researcher_prompt,
     .tools = researcher_tools,
     .tools_len = 2,
     .max_iterations = 4,
     .parallel_tool_calls = 1,
     .tool_concurrency = 8,
     .citations = 1,
     .count_sub_agent_calls = 1,
     .max_depth = 3,
     .max_sub_runs = 50},
};

const loom_agent_config *loom_config_agent(const loom_config *cfg,
                                           const char *name)
{
    if (!cfg || !name)
        return NULL;
    for (size_t i = 0; i < cfg->agents_len; i++)
        if (strcmp(cfg->agents[i].name, name) == 0)
            return &cfg->agents[i];
    for (size_t i = 0; i < sizeof(builtin_agents) / sizeof(*builtin_agents);
         i++)
        if (strcmp(builtin_agents[i].name, name) == 0)
            return &builtin_agents[i];
    return NULL;
}

static const loom_model_config *find_model(const loom_config *cfg,
                                           const char *name)
{
    for (size_t i = 0; i < cfg->models_len; i++)
        if (strcmp(cfg->models[i].name, name) == 0)
            return &cfg->models[i];
    return NULL;
}

/* Length of the provider part of "provider/model", 0 when name is not of
 * that form (no '/', or an empty side). */
size_t loom__config_provider_part(const char *name)
{
    const char *slash = strchr(name, '/');

    if (!slash || slash == name || slash[1] == '\0')
        return 0;
    return (size_t)(slash - name);
}

const loom_provider_config *loom__config_find_provider_n(const loom_config *cfg,
                                                         const char *name,
                                                         size_t len)
{
    for (size_t i = 0; i < cfg->providers_len; i++)
        if (strlen(cfg->providers[i].name) == len &&
            memcmp(cfg->providers[i].name, name, len) == 0)
            return &cfg->providers[i];
    return NULL;
}

/*
 * Why name does not resolve, written into why; 0 when it does (listed, or
 * "provider/model" with a known provider).
 */
int loom__config_model_unresolved(const loom_config *cfg, const char *name,
                                  char *why, size_t cap)
{
    char shown_name[64], known[256];
    size_t plen;

    if (find_model(cfg, name))
        return 0;
    plen = loom__config_provider_part(name);
    if (plen == 0) {
        snprintf(why, cap,
                 "model '%s' is not listed under models and is not of the "
                 "form provider/model",
                 loom__config_shown(shown_name, sizeof(shown_name), name));
        return 1;
    }
    if (loom__config_find_provider_n(cfg, name, plen))
        return 0;
    snprintf(why, cap,
             "model '%s' is not listed under models and its provider "
             "'%.*s' is not defined (providers: %s)",
             loom__config_shown(shown_name, sizeof(shown_name), name),
             (int)(plen < 64 ? plen : 64), name,
             loom__config_provider_names(known, sizeof(known), cfg));
    return 1;
}

void loom_model_config_clear(loom_model_config *m)
{
    if (!m)
        return;
    free(m->name);
    free(m->provider);
    free(m->upstream);
    free(m->reasoning_effort);
    for (size_t i = 0; i < m->fallbacks_len; i++)
        free(m->fallbacks[i]);
    free(m->fallbacks);
    free(m->context_window_fallback);
    memset(m, 0, sizeof(*m));
}

/* The defaults of a model entry: every capability but reasoning and
 * vision, no prices, no fallbacks, the config's routing policy. */
void loom__config_model_defaults(loom_model_config *m, const loom_config *cfg)
{
    memset(m, 0, sizeof(*m));
    m->capabilities.tools = 1;
    m->capabilities.parallel_tool_calls = 1;
    m->capabilities.max_completion_tokens = -1;
    m->prices.input = m->prices.output = 0;
    m->prices.cached_input = m->prices.cache_write = -1;
    m->prices.reasoning = -1;
    m->routing = cfg->routing;
}

/*
 * Prices are money: they are read digit by digit into integer
 * micro-dollars, because strtod would turn "0.15" into 0.1499999... and
 * every cost computed from it would drift. Written by hand since libc
 * has no exact decimal parser.
 */
int loom_price_parse(int64_t *out, const char *text)
{
    int64_t whole = 0, frac = 0;
    const char *p = text;
    int digits = 0, fdigits = 0;

    if (!out || !text)
        return loom__error_set(LOOM_EINVALID, "price: NULL argument");
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        /* More than 7 integer digits is past the maximum anyway; stop
         * before the arithmetic could overflow. */
        if (digits >= 7)
            goto bad;
        whole = whole * 10 + (*p - '0');
    }
    if (digits == 0)
        goto bad;
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++, fdigits++) {
            if (fdigits >= 6)
                return loom__error_set(LOOM_EINVALID,
                                       "more than 6 digits after the "
                                       "decimal point (prices are kept in "
                                       "micro-dollars per million tokens)");
            frac = frac * 10 + (*p - '0');
        }
        if (fdigits == 0)
            goto bad;
    }
    if (*p != '\0')
        goto bad;
    for (int i = fdigits; i < 6; i++)
        frac *= 10;
    if (whole * 1000000 + frac > LOOM_PRICE_MAX_MICROS)
        return loom__error_set(LOOM_EINVALID,
                               "must be at most 1000000 dollars per "
                               "million tokens");
    *out = whole * 1000000 + frac;
    return 0;

bad:
    return loom__error_set(LOOM_EINVALID,
                           "must be a price in dollars per million tokens "
                           "such as 0.15 or 3 (digits, an optional point "
                           "and at most 6 decimals)");
}

/*
 * A listed model is returned as is. An unlisted "provider/model" whose
 * provider exists is built in tmp (name, provider and upstream copied,
 * token counts 0): the caller frees it with loom_model_config_clear. tmp
 * is zeroed first whenever it is given, so clearing it is always safe.
 * LOOM_ENOTFOUND when the model does not resolve (the message says why),
 * LOOM_EINVALID for NULL arguments or an unlisted model without tmp.
 */
int loom_config_model(const loom_model_config **out, loom_model_config *tmp,
                      const loom_config *cfg, const char *name)
{
    const loom_model_config *m;
    char why[512];
    size_t plen;

    if (out)
        *out = NULL;
    if (tmp)
        memset(tmp, 0, sizeof(*tmp));
    if (!out || !cfg || !name)
        return loom__error_set(LOOM_EINVALID, "loom_config_model: NULL "
                                              "argument");
    if ((m = find_model(cfg, name)) != NULL) {
        *out = m;
        return 0;
    }
    if (loom__config_model_unresolved(cfg, name, why, sizeof(why)))
        return loom__error_set(LOOM_ENOTFOUND, "%s", why);
    if (!tmp)
        return loom__error_set(LOOM_EINVALID,
                               "loom_config_model: model "
                               "'%s' is not listed and no tmp was given",
                               name);
    plen = loom__config_provider_part(name);
    loom__config_model_defaults(tmp, cfg);
    tmp->name = strdup(name);
    tmp->provider = strndup(name, plen);
    tmp->upstream = strdup(name + plen + 1);
    if (!tmp->name || !tmp->provider || !tmp->upstream) {
        loom_model_config_clear(tmp);
        return loom__error_oom();
    }
    *out = tmp;
    return 0;
}

/*
 * "auto", "none" and "required" give those kinds with function NULL; any
 * other valid tool name ([a-zA-Z0-9_-]{1,64}) gives LOOM_TOOL_CHOICE_FUNCTION
 * with a malloc'd copy in out->function, which the caller frees.
 * LOOM_EINVALID for NULL, "" or an invalid name; out is then {AUTO, NULL}.
 */
int loom_tool_choice_parse(loom_tool_choice *out, const char *s)
{
    char tmp[64];

    if (!out)
        return loom__error_set(LOOM_EINVALID, "tool_choice: NULL argument");
    out->kind = LOOM_TOOL_CHOICE_AUTO;
    out->function = NULL;
    if (!s)
        return loom__error_set(LOOM_EINVALID, "tool_choice: NULL argument");
    if (strcmp(s, "auto") == 0)
        return 0;
    if (strcmp(s, "none") == 0) {
        out->kind = LOOM_TOOL_CHOICE_NONE;
        return 0;
    }
    if (strcmp(s, "required") == 0) {
        out->kind = LOOM_TOOL_CHOICE_REQUIRED;
        return 0;
    }
    if (!loom__config_valid_name(s, 0))
        return loom__error_set(LOOM_EINVALID,
                               "tool_choice must be auto, none, required or "
                               "a tool name ([a-zA-Z0-9_-]{1,64}), got '%s'",
                               loom__config_shown(tmp, sizeof(tmp), s));
    if (!(out->function = strdup(s)))
        return loom__error_oom();
    out->kind = LOOM_TOOL_CHOICE_FUNCTION;
    return 0;
}

/* ---- building and freeing --------------------------------------------- */

void loom__config_provider_clear(loom_provider_config *p)
{
    free(p->name);
    free(p->kind);
    free(p->base_url);
    free(p->api_key);
    json_decref(p->headers);
    memset(p, 0, sizeof(*p));
}

static void http_tool_clear(loom_http_tool_config *t)
{
    free(t->name);
    free(t->description);
    free(t->method);
    free(t->url);
    json_decref(t->headers);
    json_decref(t->parameters);
    for (size_t i = 0; i < t->allow_hosts_len; i++)
        free(t->allow_hosts[i]);
    free(t->allow_hosts);
    memset(t, 0, sizeof(*t));
}

static void free_strings(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

void loom__config_mcp_server_clear(loom_mcp_server_config *m)
{
    free(m->name);
    free(m->transport);
    free(m->command);
    free_strings(m->args, m->args_len);
    json_decref(m->env);
    free(m->cwd);
    free(m->url);
    json_decref(m->headers);
    free_strings(m->tools, m->tools_len);
    free(m->protocol_version);
    free(m->oauth.client_id);
    free(m->oauth.client_secret);
    free(m->oauth.auth_method);
    free(m->oauth.client_metadata_url);
    free(m->oauth.client_name);
    free_strings(m->oauth.scopes, m->oauth.scopes_len);
    free(m->oauth.grant_type);
    free(m->oauth.private_key);
    free(m->oauth.signing_alg);
    free_strings(m->roots, m->roots_len);
    free(m->sampling);
    memset(m, 0, sizeof(*m));
}

static void agent_clear(loom_agent_config *a)
{
    free(a->name);
    free(a->model);
    free(a->system_prompt);
    free(a->review_model);
    free(a->limit_prompt);
    free(a->many_results.prompt);
    free(a->tool_descriptions);
    for (size_t i = 0; i < a->tool_docs_len; i++) {
        free(a->tool_docs[i].name);
        free(a->tool_docs[i].description);
        free(a->tool_docs[i].selection_rule);
    }
    free(a->tool_docs);
    free(a->few_shot.file);
    for (size_t i = 0; i < a->few_shot.models_len; i++)
        free(a->few_shot.models[i]);
    free(a->few_shot.models);
    for (size_t i = 0; i < a->few_shot.examples_len; i++) {
        free(a->few_shot.examples[i].user);
        free(a->few_shot.examples[i].assistant);
    }
    free(a->few_shot.examples);
    json_decref(a->tool_options);
    free(a->tools_disabled_message);
    free(a->retry.prompt);
    free(a->model_after.model);
    for (size_t j = 0; j < a->non_iterative_tools_len; j++)
        free(a->non_iterative_tools[j]);
    free(a->non_iterative_tools);
    for (size_t i = 0; i < a->tools_len; i++)
        free(a->tools[i]);
    free(a->tools);
    free(a->tools_lines);
    for (size_t i = 0; i < a->sub_agents_len; i++)
        free(a->sub_agents[i]);
    free(a->sub_agents);
    free(a->sub_agents_lines);
    free(a->tool_choice.function);
    for (size_t i = 0; i < a->data_policy.tools_len; i++)
        free(a->data_policy.tools[i]);
    free(a->data_policy.tools);
    free(a->description);
    for (size_t i = 0; i < a->handoffs_len; i++)
        free(a->handoffs[i]);
    free(a->handoffs);
    free(a->handoffs_lines);
    memset(a, 0, sizeof(*a));
}

void loom_config_free(loom_config *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < cfg->providers_len; i++)
        loom__config_provider_clear(&cfg->providers[i]);
    free(cfg->providers);
    for (size_t i = 0; i < cfg->models_len; i++)
        loom_model_config_clear(&cfg->models[i]);
    free(cfg->models);
    for (size_t i = 0; i < cfg->agents_len; i++)
        agent_clear(&cfg->agents[i]);
    free(cfg->agents);
    for (size_t i = 0; i < cfg->http_tools_len; i++)
        http_tool_clear(&cfg->http_tools[i]);
    free(cfg->http_tools);
    for (size_t i = 0; i < cfg->mcp_servers_len; i++)
        loom__config_mcp_server_clear(&cfg->mcp_servers[i]);
    free(cfg->mcp_servers);
    free(cfg->path);
    free(cfg->source);
    free(cfg->default_agent);
    json_decref(cfg->tools);
    free(cfg->server.listen);
    free(cfg->server.db);
    free(cfg->server.secret_key);
    free(cfg->server.public_url);
    free(cfg->research.model);
    free(cfg->research.researcher_model);
    for (size_t i = 0; i < cfg->research.researcher_tools_len; i++)
        free(cfg->research.researcher_tools[i]);
    free(cfg->research.researcher_tools);
    for (size_t i = 0; i < cfg->server.cors_origins_len; i++)
        free(cfg->server.cors_origins[i]);
    free(cfg->server.cors_origins);
    free(cfg->auth.mode);
    free(cfg->auth.admin_key);
    free(cfg->auth.jwt.secret);
    free(cfg->auth.jwt.jwks_file);
    free(cfg->auth.jwt.audience);
    free(cfg->auth.jwt.issuer);
    free(cfg->auth.jwt.workspace_claim);
    free(cfg->log_level);
    free(cfg->log_format);
    free(cfg);
}

/* Defaults of a provider, and an empty headers object. */
int loom__config_provider_init(loom_provider_config *p, const char *name)
{
    memset(p, 0, sizeof(*p));
    p->connect_timeout_ms = 10000;
    p->first_byte_timeout_ms = 120000;
    p->idle_timeout_ms = 120000;
    p->answer_timeout_ms = 600000;
    p->max_retries = 2;
    p->retry_base_delay_ms = 500;
    p->retry_max_delay_ms = 30000;
    p->name = strdup(name);
    p->kind = strdup("openai");
    p->headers = json_object();
    if (!p->name || !p->kind || !p->headers)
        return loom__error_oom();
    return 0;
}

/* Adds p to cfg (taking its contents), replacing a provider of the same
 * name: that is how the file overrides the environment. */
int loom__config_provider_install(loom_config *cfg, loom_provider_config *p)
{
    loom_provider_config *v;

    for (size_t i = 0; i < cfg->providers_len; i++) {
        if (strcmp(cfg->providers[i].name, p->name) == 0) {
            loom__config_provider_clear(&cfg->providers[i]);
            cfg->providers[i] = *p;
            memset(p, 0, sizeof(*p));
            return 0;
        }
    }
    v = realloc(cfg->providers, (cfg->providers_len + 1) * sizeof(*v));
    if (!v)
        return loom__error_oom();
    cfg->providers = v;
    v[cfg->providers_len++] = *p;
    memset(p, 0, sizeof(*p));
    return 0;
}

/*
 * An absolute http:// or https:// URL that libcurl's parser takes: a
 * host, a port 0..65535 when given, no spaces or control characters.
 * curl also takes "http:/h" and "http:///h", which in a config are typos,
 * so the scheme must be followed by "//" and the host itself.
 */
int loom__config_valid_url(const char *s)
{
    CURLU *u = curl_url();
    char *scheme = NULL;
    int ok = 0;

    if (u && curl_url_set(u, CURLUPART_URL, s, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
        (strcmp(scheme, "http") == 0 || strcmp(scheme, "https") == 0)) {
        size_t n = strlen(scheme);

        ok = strncmp(s + n, "://", 3) == 0 && s[n + 3] != '/';
    }
    curl_free(scheme);
    curl_url_cleanup(u);
    return ok;
}

void loom__config_strip_slashes(char *s)
{
    size_t n = strlen(s);

    while (n > 0 && s[n - 1] == '/')
        s[--n] = '\0';
}

static loom_config *config_new(void)
{
    loom_config *cfg = calloc(1, sizeof(*cfg));

    if (!cfg)
        return NULL;
    cfg->server.listen = strdup(LOOM_SERVER_DEFAULT_LISTEN);
    cfg->server.db = strdup(LOOM_SERVER_DEFAULT_DB);
    cfg->server.max_body_bytes = 4L << 20;
    cfg->server.max_concurrent_runs = 64;
    cfg->server.max_connections = 32768;
    cfg->server.max_connections_per_address = 1024;
    cfg->server.header_timeout_ms = 10000;
    cfg->server.connection_memory_kb = 32;
    cfg->server.queue_max = 256;
    cfg->server.queue_wait_ms = 10000;
    cfg->server.keepalive_ms = 15000;
    cfg->auth.jwt.leeway_seconds = 60;
    cfg->server.read_timeout_ms = 30000;
    cfg->server.shutdown_grace_ms = 10000;
    cfg->server.keep_finished_runs = 1000;
    cfg->server.ui = 1;
    cfg->server.fibers = 1;
    cfg->server.tool_threads = 64;
    cfg->server.fiber_stack_kb = 256;
    cfg->server.max_run_events_bytes = 64L << 20;
    cfg->research.max_cycles = LOOM_RESEARCH_DEFAULT_MAX_CYCLES;
    cfg->research.max_cycles_reasoning =
        LOOM_RESEARCH_DEFAULT_MAX_CYCLES_REASONING;
    cfg->research.max_parallel_researchers = LOOM_RESEARCH_DEFAULT_PARALLEL;
    cfg->research.researcher_max_searches = LOOM_RESEARCH_DEFAULT_SEARCHES;
    cfg->research.report_max_tokens = LOOM_RESEARCH_DEFAULT_REPORT_TOKENS;
    cfg->research.time_limit_s = LOOM_RESEARCH_DEFAULT_TIME_LIMIT_S;
    cfg->research.clarify = 1;
    cfg->research.min_context_tokens = LOOM_RESEARCH_DEFAULT_MIN_CONTEXT;
    cfg->routing.retries = 0;
    cfg->routing.cooldown_ms = 30000;
    cfg->routing.failures_before_cooldown = 3;
    if (!(cfg->tools = json_object()) || !cfg->server.listen ||
        !cfg->server.db) {
        loom_config_free(cfg);
        return NULL;
    }
    return cfg;
}

static const char *env_nonempty(const char *name)
{
    const char *v = getenv(name);

    return v && *v ? v : NULL;
}

/* The providers the environment makes: a name, its kind, and the
 * variables of its key and base URL. OPENAI_* serve two providers, one
 * per OpenAI wire format. */
static const struct {
    const char *name, *kind, *key_var, *url_var, *default_url;
} env_providers[] = {
    {"openai", "openai", "OPENAI_API_KEY", "OPENAI_BASE_URL",
     DEFAULT_OPENAI_URL},
    {"openai-responses", "openai-responses", "OPENAI_API_KEY",
     "OPENAI_BASE_URL", DEFAULT_OPENAI_URL},
    {"anthropic", "anthropic", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL",
     DEFAULT_ANTHROPIC_URL},
    {"gemini", "gemini", "GEMINI_API_KEY", "GEMINI_BASE_URL",
     DEFAULT_GEMINI_URL},
};

/* Adds env_providers[i] to cfg when its key or base URL is set. */
static int env_provider(loom_config *cfg, size_t i)
{
    loom_provider_config p;
    const char *key = env_nonempty(env_providers[i].key_var);
    const char *url = env_nonempty(env_providers[i].url_var);
    char tmp[64];
    int rc;

    memset(&p, 0, sizeof(p));
    if (!key && !url)
        return 0;
    if (url && !loom__config_valid_url(url))
        return loom__error_set(LOOM_EINVALID,
                               "environment: %s: must be an http:// or "
                               "https:// URL, got '%s'",
                               env_providers[i].url_var,
                               loom__config_shown(tmp, sizeof(tmp), url));
    if ((rc = loom__config_provider_init(&p, env_providers[i].name)) != 0)
        goto cleanup;
    free(p.kind);
    p.kind = strdup(env_providers[i].kind);
    p.base_url = strdup(url ? url : env_providers[i].default_url);
    p.api_key = dup_str(key);
    if (!p.kind || !p.base_url || (key && !p.api_key)) {
        rc = loom__error_oom();
        goto cleanup;
    }
    loom__config_strip_slashes(p.base_url);
    rc = loom__config_provider_install(cfg, &p);

cleanup:
    loom__config_provider_clear(&p);
    return rc;
}

/*
 * Each provider of env_providers exists when its key or its base URL is
 * set and not empty: a base URL alone is enough because local servers
 * (Ollama, llama.cpp, vLLM) need no key. Nothing else comes from the
 * environment. LOOM_EINVALID when a base URL is not an http(s) URL.
 */
int loom_config_from_env(loom_config **out)
{
    loom_config *cfg = NULL;
    int rc = 0;

    if (!out)
        return loom__error_set(LOOM_EINVALID, "loom_config_from_env: NULL "
                                              "argument");
    *out = NULL;
    if (!(cfg = config_new()))
        return loom__error_oom();
    for (size_t i = 0; i < sizeof(env_providers) / sizeof(env_providers[0]);
         i++)
        if ((rc = env_provider(cfg, i)) != 0)
            break;
    if (rc)
        loom_config_free(cfg);
    else
        *out = cfg;
    return rc;
}

/* A failure without a list of errors (the file unread, a syntax error)
 * as a list of one, for *errors. */
static int report_one(int rc, char **errors)
{
    if (errors && !(*errors = strdup(loom_error_last())))
        return loom__error_oom();
    return rc;
}

/* Reads data (len bytes) over the environment's config; name stands for
 * the file in messages, path (NULL for text) is kept in the config. */
static int load_text(loom_config **out, const char *data, size_t len,
                     const char *name, const char *path, char **errors)
{
    loom__config_errors errs;
    loom_config *cfg = NULL;
    int rc;

    *out = NULL;
    loom__config_errors_init(&errs);
    if (len > LOOM__CONFIG_MAX_BYTES)
        return report_one(loom__error_set(LOOM_ETOOLARGE,
                                          "%s: larger than the %zu MiB limit "
                                          "for a config file",
                                          name, LOOM__CONFIG_MAX_BYTES >> 20),
                          errors);
    if ((rc = loom_config_from_env(&cfg)) != 0)
        return report_one(rc, errors);
    if ((path && !(cfg->path = strdup(path))) ||
        !(cfg->source = strdup(name))) {
        rc = loom__error_oom();
        goto cleanup;
    }
    rc = loom__config_parse_yaml(cfg, data, len, name, &errs);
    /* Out of memory ends the load whatever the list holds. */
    if (rc != LOOM_ENOMEM && errs.count > 0)
        rc = loom__config_errors_raise(&errs, errors);
    else if (rc != 0 && rc != LOOM_ENOMEM)
        rc = report_one(rc, errors);

cleanup:
    loom__config_errors_free(&errs);
    if (rc)
        loom_config_free(cfg);
    else
        *out = cfg;
    return rc;
}

/*
 * Reads the YAML text over the environment's config. name (default
 * "<string>") stands for the file in messages; cfg->path stays NULL.
 * LOOM_ETOOLARGE past 4 MiB, else as loom_config_load.
 */
int loom_config_load_string_report(loom_config **out, const char *yaml,
                                   const char *name, char **errors)
{
    size_t len;

    if (errors)
        *errors = NULL;
    if (!out || !yaml)
        return report_one(loom__error_set(LOOM_EINVALID,
                                          "loom_config_load_string: NULL "
                                          "argument"),
                          errors);
    *out = NULL;
    len = strnlen(yaml, LOOM__CONFIG_MAX_BYTES + 1);
    return load_text(out, yaml, len, name ? name : "<string>", NULL, errors);
}

int loom_config_load_string(loom_config **out, const char *yaml,
                            const char *name)
{
    return loom_config_load_string_report(out, yaml, name, NULL);
}

int loom__config_read_file(loom_buf *b, const char *path, size_t max,
                           const char *what)
{
    struct stat st;
    char chunk[65536];
    int fd, rc = 0;
    ssize_t n;

    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return loom__error_set(LOOM_ENOTFOUND, "%s: no such file", path);
        return loom__error_set(LOOM_EIO, "%s: %s", path, strerror(errno));
    }
    if (fstat(fd, &st) != 0) {
        rc = loom__error_set(LOOM_EIO, "%s: %s", path, strerror(errno));
        goto cleanup;
    }
    if (S_ISDIR(st.st_mode)) {
        rc = loom__error_set(LOOM_EINVALID, "%s: is a directory", path);
        goto cleanup;
    }
    /* The size check up front spares reading a huge file; the buffer's
     * limit still holds for pipes and files that grow meanwhile. */
    if (S_ISREG(st.st_mode) &&
        (unsigned long long)st.st_size > (unsigned long long)max)
        goto too_large;
    for (;;) {
        n = read(fd, chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = loom__error_set(LOOM_EIO, "%s: %s", path, strerror(errno));
            goto cleanup;
        }
        if (n == 0)
            break;
        if (b->len + (size_t)n > max ||
            (rc = loom_buf_put(b, chunk, (size_t)n)) == LOOM_ETOOLARGE)
            goto too_large;
        if (rc)
            goto cleanup;
    }
    goto cleanup;

too_large:
    if (max >= ((size_t)1 << 20))
        rc = loom__error_set(LOOM_ETOOLARGE,
                             "%s: larger than the %zu MiB limit for %s", path,
                             max >> 20, what);
    else
        rc = loom__error_set(LOOM_ETOOLARGE,
                             "%s: larger than the %zu KiB limit for %s", path,
                             max >> 10, what);

cleanup:
    close(fd);
    return rc;
}

/*
 * Reads the file at path (at most 4 MiB) over the environment's config.
 * LOOM_ENOTFOUND when it does not exist, LOOM_EIO when it cannot be read,
 * LOOM_ETOOLARGE past 4 MiB or a nesting/expansion limit, LOOM_EINVALID
 * with "file:line: key: problem" for anything wrong inside.
 */
int loom_config_load_report(loom_config **out, const char *path, char **errors)
{
    loom_buf b = LOOM_BUF_INIT(LOOM__CONFIG_MAX_BYTES);
    int rc;

    if (errors)
        *errors = NULL;
    if (!out || !path)
        return report_one(loom__error_set(LOOM_EINVALID, "loom_config_load: "
                                                         "NULL argument"),
                          errors);
    *out = NULL;
    rc = loom__config_read_file(&b, path, LOOM__CONFIG_MAX_BYTES,
                                "a config file");
    if (rc == 0) {
        rc = load_text(out, loom_buf_cstr(&b), b.len, path, path, errors);
        errors = NULL; /* load_text has filled it */
    }
    loom_buf_free(&b);
    return rc && rc != LOOM_ENOMEM ? report_one(rc, errors) : rc;
}

int loom_config_load(loom_config **out, const char *path)
{
    return loom_config_load_report(out, path, NULL);
}
