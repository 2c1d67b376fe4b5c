/*
 * A client's request parameters (loom_llm_params): their ownership, the
 * one table of which provider kind takes which of them, and how each
 * adapter writes them (see params.h). A parameter a kind has no field for
 * is refused, before any request is sent, rather than dropped: a client
 * that asked for JSON output or a seed must not get an answer made
 * without it and believe otherwise.
 */
#include "llm/params.h"

#include "core/error.h"
#include "llm/attempt.h"

#include <stdlib.h>
#include <string.h>

void loom_llm_params_clear(loom_llm_params *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->stop_len; i++)
        free(p->stop[i]);
    free(p->format_name);
    free(p->format_description);
    json_decref(p->format_schema);
    free(p->reasoning_effort);
    free(p->verbosity);
    free(p->user);
    json_decref(p->extra);
    memset(p, 0, sizeof(*p));
}

static int dup_str(char **dst, const char *src)
{
    *dst = NULL;
    return src && !(*dst = strdup(src)) ? -1 : 0;
}

static int dup_json(json_t **dst, const json_t *src)
{
    *dst = NULL;
    return src && !(*dst = json_deep_copy(src)) ? -1 : 0;
}

int loom_llm_params_copy(loom_llm_params *dst, const loom_llm_params *src)
{
    int bad = 0;

    memset(dst, 0, sizeof(*dst));
    if (!src)
        return 0;
    dst->set = src->set;
    dst->top_p = src->top_p;
    dst->presence_penalty = src->presence_penalty;
    dst->frequency_penalty = src->frequency_penalty;
    dst->seed = src->seed;
    dst->format = src->format;
    dst->format_strict = src->format_strict;
    for (size_t i = 0; i < src->stop_len && i < LOOM_LLM_MAX_STOP; i++) {
        bad |= dup_str(&dst->stop[i], src->stop[i]);
        dst->stop_len = i + 1;
    }
    bad |= dup_str(&dst->format_name, src->format_name);
    bad |= dup_str(&dst->format_description, src->format_description);
    bad |= dup_json(&dst->format_schema, src->format_schema);
    bad |= dup_str(&dst->reasoning_effort, src->reasoning_effort);
    bad |= dup_str(&dst->verbosity, src->verbosity);
    bad |= dup_str(&dst->user, src->user);
    bad |= dup_json(&dst->extra, src->extra);
    if (bad) {
        loom_llm_params_clear(dst);
        return loom__error_oom();
    }
    return 0;
}

int loom_llm_params_any(const loom_llm_params *p)
{
    return p && (p->set || p->stop_len || p->format || p->reasoning_effort ||
                 p->verbosity || p->user || json_object_size(p->extra));
}

/* ---- which kind takes what -------------------------------------------- */

enum {
    K_OPENAI = 1,
    K_ANTHROPIC = 2,
    K_GEMINI = 4,
    K_RESPONSES = 8,
    K_ALL = 15
};

/* The parameters and the kinds that take them (as they are or translated:
 * docs/openai-compat.md says to what). `user` is never refused: loom
 * itself takes it as the run's user; the kinds listed are also told. */
static const struct {
    const char *name;
    unsigned kinds;
} rules[] = {
    {"top_p", K_ALL},
    {"seed", K_OPENAI | K_GEMINI},
    {"presence_penalty", K_OPENAI | K_GEMINI},
    {"frequency_penalty", K_OPENAI | K_GEMINI},
    {"stop", K_OPENAI | K_ANTHROPIC | K_GEMINI},
    {"response_format", K_ALL},
    {"reasoning_effort", K_ALL},
    {"verbosity", K_OPENAI | K_RESPONSES},
    {"logit_bias", K_OPENAI},
    {"metadata", K_OPENAI | K_RESPONSES},
    {"service_tier", K_OPENAI | K_RESPONSES},
    {"store", K_OPENAI},
    {"prompt_cache_key", K_OPENAI | K_RESPONSES},
    {"safety_identifier", K_OPENAI | K_RESPONSES},
};

static unsigned kind_bit(const char *kind)
{
    if (!kind)
        return 0;
    if (strcmp(kind, "openai") == 0)
        return K_OPENAI;
    if (strcmp(kind, "anthropic") == 0)
        return K_ANTHROPIC;
    if (strcmp(kind, "gemini") == 0)
        return K_GEMINI;
    if (strcmp(kind, "openai-responses") == 0)
        return K_RESPONSES;
    return 0;
}

/*
 * Why a kind cannot honour p's response_format with the rest of p, or
 * NULL. Anthropic makes the model call a tool whose input is the answer
 * (llm/anthropic.h), which the API does not take with thinking, and whose
 * input_schema must be an object's.
 */
static const char *format_conflict(const loom_llm_params *p, unsigned bit)
{
    const json_t *type = json_object_get(p->format_schema, "type");

    if (bit != K_ANTHROPIC || p->format == LOOM_FORMAT_UNSET)
        return NULL;
    if (p->reasoning_effort)
        return "together with reasoning_effort: the answer is a forced "
               "tool call, which the API does not take with thinking";
    if (p->format == LOOM_FORMAT_JSON_SCHEMA && type &&
        !(json_is_string(type) &&
          strcmp(json_string_value(type), "object") == 0))
        return "with a schema of anything but an object: the answer is a "
               "tool's input, which must be an object";
    return NULL;
}

static int param_given(const loom_llm_params *p, const char *name)
{
    if (strcmp(name, "top_p") == 0)
        return (p->set & LOOM_PARAM_TOP_P) != 0;
    if (strcmp(name, "seed") == 0)
        return (p->set & LOOM_PARAM_SEED) != 0;
    if (strcmp(name, "presence_penalty") == 0)
        return (p->set & LOOM_PARAM_PRESENCE_PENALTY) != 0;
    if (strcmp(name, "frequency_penalty") == 0)
        return (p->set & LOOM_PARAM_FREQUENCY_PENALTY) != 0;
    if (strcmp(name, "stop") == 0)
        return p->stop_len > 0;
    if (strcmp(name, "response_format") == 0)
        return p->format != LOOM_FORMAT_UNSET;
    if (strcmp(name, "reasoning_effort") == 0)
        return p->reasoning_effort != NULL;
    if (strcmp(name, "verbosity") == 0)
        return p->verbosity != NULL;
    return json_object_get(p->extra, name) != NULL;
}

const char *loom_llm_params_refused(const loom_llm_params *p, const char *kind)
{
    unsigned bit = kind_bit(kind);

    if (!p)
        return NULL;
    for (size_t i = 0; i < sizeof(rules) / sizeof(rules[0]); i++)
        if (!(rules[i].kinds & bit) && param_given(p, rules[i].name))
            return rules[i].name;
    if (format_conflict(p, bit))
        return "response_format";
    /* An extra the table does not know is no parameter of any kind. */
    if (json_is_object(p->extra)) {
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)p->extra, key, v)
        {
            size_t i = 0;
            while (i < sizeof(rules) / sizeof(rules[0]) &&
                   strcmp(rules[i].name, key) != 0)
                i++;
            if (i == sizeof(rules) / sizeof(rules[0]))
                return key;
        }
    }
    return NULL;
}

int loom_llm_params_check(const loom_llm_params *p, const char *provider,
                          const char *kind, const char **param)
{
    const char *name = loom_llm_params_refused(p, kind);
    const char *why = name && strcmp(name, "response_format") == 0
                          ? format_conflict(p, kind_bit(kind))
                          : NULL;

    if (param)
        *param = name;
    if (!name)
        return 0;
    return loom__error_set(LOOM_EINVALID,
                           "%s is not supported by provider '%s' (%s)%s%s",
                           name, provider ? provider : "?", kind ? kind : "?",
                           why ? " " : "", why ? why : "");
}

/* ---- the wire ------------------------------------------------------------ */

static json_t *stop_array(const loom_llm_params *p)
{
    json_t *a = json_array();

    for (size_t i = 0; a && i < p->stop_len; i++)
        if (json_array_append_new(a, loom__llm_json_string(p->stop[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

/* OpenAI's response_format object ({"type": "json_schema", "json_schema":
 * {name, schema, strict}}); NULL on OOM. */
static json_t *openai_format(const loom_llm_params *p)
{
    json_t *js;

    if (p->format == LOOM_FORMAT_JSON_OBJECT)
        return json_pack("{s:s}", "type", "json_object");
    js = json_pack("{s:o}", "name", loom__llm_json_string(p->format_name));
    if (js && p->format_description &&
        loom__llm_put(js, "description",
                      loom__llm_json_string(p->format_description))) {
        json_decref(js);
        return NULL;
    }
    if (js && p->format_schema &&
        loom__llm_put(js, "schema", json_incref(p->format_schema))) {
        json_decref(js);
        return NULL;
    }
    if (js && p->format_strict && loom__llm_put(js, "strict", json_true())) {
        json_decref(js);
        return NULL;
    }
    return js ? json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", js)
              : NULL;
}

/* Puts every extra the kind takes (all known ones were checked). */
static int put_extras(json_t *body, const loom_llm_params *p, unsigned bit)
{
    int bad = 0;

    for (size_t i = 0; i < sizeof(rules) / sizeof(rules[0]); i++) {
        json_t *v = json_object_get(p->extra, rules[i].name);
        if (v && (rules[i].kinds & bit))
            bad |= loom__llm_put(body, rules[i].name, json_deep_copy(v));
    }
    return bad;
}

int loom__params_put_openai(json_t *body, const loom_llm_params *p)
{
    int bad = 0;

    if (!p)
        return 0;
    if (p->set & LOOM_PARAM_TOP_P)
        bad |= loom__llm_put(body, "top_p", json_real(p->top_p));
    if (p->set & LOOM_PARAM_SEED)
        bad |= loom__llm_put(body, "seed", json_integer(p->seed));
    if (p->set & LOOM_PARAM_PRESENCE_PENALTY)
        bad |= loom__llm_put(body, "presence_penalty",
                             json_real(p->presence_penalty));
    if (p->set & LOOM_PARAM_FREQUENCY_PENALTY)
        bad |= loom__llm_put(body, "frequency_penalty",
                             json_real(p->frequency_penalty));
    if (p->stop_len)
        bad |= loom__llm_put(body, "stop", stop_array(p));
    if (p->format)
        bad |= loom__llm_put(body, "response_format", openai_format(p));
    if (p->verbosity)
        bad |= loom__llm_put(body, "verbosity",
                             loom__llm_json_string(p->verbosity));
    if (p->user)
        bad |= loom__llm_put(body, "user", loom__llm_json_string(p->user));
    bad |= put_extras(body, p, K_OPENAI);
    return bad ? -1 : 0;
}

int loom__params_put_anthropic(json_t *body, const loom_llm_params *p)
{
    int bad = 0;

    if (!p)
        return 0;
    if (p->set & LOOM_PARAM_TOP_P)
        bad |= loom__llm_put(body, "top_p", json_real(p->top_p));
    if (p->stop_len)
        bad |= loom__llm_put(body, "stop_sequences", stop_array(p));
    if (p->user)
        bad |= loom__llm_put(
            body, "metadata",
            json_pack("{s:o}", "user_id", loom__llm_json_string(p->user)));
    return bad ? -1 : 0;
}

int loom__params_put_gemini(json_t *g, const loom_llm_params *p)
{
    int bad = 0;

    if (!p)
        return 0;
    if (p->set & LOOM_PARAM_TOP_P)
        bad |= loom__llm_put(g, "topP", json_real(p->top_p));
    if (p->set & LOOM_PARAM_SEED)
        bad |= loom__llm_put(g, "seed", json_integer(p->seed));
    if (p->set & LOOM_PARAM_PRESENCE_PENALTY)
        bad |=
            loom__llm_put(g, "presencePenalty", json_real(p->presence_penalty));
    if (p->set & LOOM_PARAM_FREQUENCY_PENALTY)
        bad |= loom__llm_put(g, "frequencyPenalty",
                             json_real(p->frequency_penalty));
    if (p->stop_len)
        bad |= loom__llm_put(g, "stopSequences", stop_array(p));
    if (p->format)
        bad |= loom__llm_put(g, "responseMimeType",
                             json_string("application/json"));
    /* responseJsonSchema takes JSON Schema as clients write it
     * (additionalProperties and all); responseSchema takes only an
     * OpenAPI subset that a zod or pydantic schema does not fit. */
    if (p->format == LOOM_FORMAT_JSON_SCHEMA && p->format_schema)
        bad |= loom__llm_put(g, "responseJsonSchema",
                             json_incref(p->format_schema));
    return bad ? -1 : 0;
}

int loom__params_put_responses(json_t *body, const loom_llm_params *p)
{
    json_t *text = NULL, *fmt = NULL;
    int bad = 0;

    if (!p)
        return 0;
    if (p->set & LOOM_PARAM_TOP_P)
        bad |= loom__llm_put(body, "top_p", json_real(p->top_p));
    if (p->format || p->verbosity)
        bad |= loom__llm_put(body, "text", text = json_object());
    /* Responses flattens the format: {"type", "name", "schema",
     * "strict"}. */
    if (!bad && p->format == LOOM_FORMAT_JSON_OBJECT)
        bad |= loom__llm_put(text, "format",
                             json_pack("{s:s}", "type", "json_object"));
    if (!bad && p->format == LOOM_FORMAT_JSON_SCHEMA) {
        bad |= loom__llm_put(
            text, "format",
            fmt = json_pack("{s:s,s:o}", "type", "json_schema", "name",
                            loom__llm_json_string(p->format_name)));
        if (!bad && p->format_description)
            bad |= loom__llm_put(fmt, "description",
                                 loom__llm_json_string(p->format_description));
        if (!bad && p->format_schema)
            bad |= loom__llm_put(fmt, "schema", json_incref(p->format_schema));
        if (!bad && p->format_strict)
            bad |= loom__llm_put(fmt, "strict", json_true());
    }
    if (!bad && p->verbosity)
        bad |= loom__llm_put(text, "verbosity",
                             loom__llm_json_string(p->verbosity));
    if (p->user)
        bad |= loom__llm_put(body, "user", loom__llm_json_string(p->user));
    bad |= put_extras(body, p, K_RESPONSES);
    return bad ? -1 : 0;
}

const char *loom__params_effort(const loom_llm_params *p,
                                const char *req_effort)
{
    if (p && p->reasoning_effort && *p->reasoning_effort)
        return p->reasoning_effort;
    return req_effort && *req_effort ? req_effort : NULL;
}

long loom__params_effort_budget(const char *effort)
{
    static const struct {
        const char *effort;
        long budget;
    } budgets[] = {
        {"minimal", 1024}, {"low", 2048}, {"medium", 8192}, {"high", 24576}};

    for (size_t i = 0; effort && i < sizeof(budgets) / sizeof(budgets[0]); i++)
        if (strcmp(budgets[i].effort, effort) == 0)
            return budgets[i].budget;
    return 0;
}
