/*
 * The sampling and output parameters of a Chat Completions request (and
 * of a native run, which takes the same names), parsed into a
 * loom_llm_params (loom/llm.h). Every parameter OpenAI documents is
 * either read here, and then sent upstream or refused per provider kind
 * by the library, or refused here because loom itself cannot give what it
 * asks (several answers, log probabilities, audio): a client never gets
 * an answer made without a parameter it sent and no word of it. Bad types
 * and values are a 400 naming the parameter.
 */
#include "server/chat_format.h"

#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The most metadata pairs, and the longest key and value (OpenAI's). */
#define MAX_METADATA 16
#define MAX_METADATA_KEY 64
#define MAX_METADATA_VALUE 512
/* The most logit_bias entries (OpenAI takes 300 tokens at most). */
#define MAX_LOGIT_BIAS 300
/* The longest stop sequence, and the longest short string parameter. */
#define MAX_STOP_BYTES 256
#define MAX_SHORT_STRING 256

/* A parameter loom cannot honour for any provider: 400
 * unsupported_parameter, with why. */
static int refused(loom__chat_error *err, const char *param, const char *why)
{
    return loom__chat_error_set(err, 400, "invalid_request_error",
                                "unsupported_parameter", param,
                                "Unsupported parameter: '%s' %s.", param, why);
}

/* A number in [lo, hi] into *out, its bit into p->set. */
static int get_number(loom_llm_params *p, double *out, unsigned bit,
                      const json_t *body, const char *key, double lo, double hi,
                      loom__chat_error *err)
{
    const json_t *v = loom__chat_opt(body, key);

    if (!v)
        return 0;
    if (!json_is_number(v))
        return loom__chat_bad_type(err, key, "a number", v);
    *out = json_number_value(v);
    if (!(*out >= lo && *out <= hi))
        return loom__chat_bad_value(
            err, key, "%g. Expected a value between %g and %g.", *out, lo, hi);
    p->set |= bit;
    return 0;
}

/* A string among choices (NULL-terminated) into a copy at *out. */
static int get_choice(char **out, const json_t *body, const char *key,
                      const char *const *choices, loom__chat_error *err)
{
    const json_t *v = loom__chat_opt(body, key);
    const char *s;
    char list[128] = "";

    if (!v)
        return 0;
    if (!json_is_string(v))
        return loom__chat_bad_type(err, key, "a string", v);
    s = json_string_value(v);
    for (size_t i = 0; choices[i]; i++) {
        if (strcmp(s, choices[i]) == 0)
            return (*out = strdup(s)) ? 0 : loom__error_oom();
        snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s'%s'",
                 i ? ", " : "", choices[i]);
    }
    return loom__chat_bad_value(err, key, "'%.64s'. Supported values are: %s.",
                                s, list);
}

static int parse_stop(loom_llm_params *p, const json_t *body,
                      loom__chat_error *err)
{
    const json_t *v = loom__chat_opt(body, "stop"), *e;
    char param[32];
    size_t i;

    if (!v)
        return 0;
    if (!json_is_string(v) && !json_is_array(v))
        return loom__chat_bad_type(err, "stop",
                                   "a string or an array of strings", v);
    if (json_is_array(v) && json_array_size(v) > LOOM_LLM_MAX_STOP)
        return loom__chat_bad_value(err, "stop",
                                    "%zu sequences. Expected at most %d.",
                                    json_array_size(v), LOOM_LLM_MAX_STOP);
    for (i = 0; i < (json_is_string(v) ? 1 : json_array_size(v)); i++) {
        e = json_is_string(v) ? v : json_array_get(v, i);
        snprintf(param, sizeof(param), json_is_string(v) ? "stop" : "stop[%zu]",
                 i);
        if (!json_is_string(e))
            return loom__chat_bad_type(err, param, "a string", e);
        if (!json_string_length(e) || json_string_length(e) > MAX_STOP_BYTES)
            return loom__chat_bad_value(err, param,
                                        "a stop sequence has 1 to %d bytes.",
                                        MAX_STOP_BYTES);
        if (!(p->stop[p->stop_len] = strdup(json_string_value(e))))
            return loom__error_oom();
        p->stop_len++;
    }
    return 0;
}

static int format_name_ok(const char *s)
{
    size_t n = strlen(s);

    if (n < 1 || n > 64)
        return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
              (*s >= '0' && *s <= '9') || *s == '_' || *s == '-'))
            return 0;
    return 1;
}

static int parse_json_schema(loom_llm_params *p, const json_t *rf,
                             loom__chat_error *err)
{
    const json_t *js = loom__chat_opt(rf, "json_schema"), *v;

    if (!js)
        return loom__chat_error_set(
            err, 400, "invalid_request_error", "missing_required_parameter",
            "response_format.json_schema",
            "Missing required parameter: 'response_format.json_schema'.");
    if (!json_is_object(js))
        return loom__chat_bad_type(err, "response_format.json_schema",
                                   "an object", js);
    v = loom__chat_opt(js, "name");
    if (!v || !json_is_string(v))
        return loom__chat_bad_type(err, "response_format.json_schema.name",
                                   "a string", v ? v : json_null());
    if (!format_name_ok(json_string_value(v)))
        return loom__chat_bad_value(
            err, "response_format.json_schema.name",
            "a name is 1 to 64 of a-z, A-Z, 0-9, '_' and "
            "'-'.");
    if (!(p->format_name = strdup(json_string_value(v))))
        return loom__error_oom();
    if ((v = loom__chat_opt(js, "description"))) {
        if (!json_is_string(v))
            return loom__chat_bad_type(
                err, "response_format.json_schema.description", "a string", v);
        if (!(p->format_description = strdup(json_string_value(v))))
            return loom__error_oom();
    }
    if ((v = loom__chat_opt(js, "schema"))) {
        if (!json_is_object(v))
            return loom__chat_bad_type(
                err, "response_format.json_schema.schema", "an object", v);
        if (!(p->format_schema = json_deep_copy(v)))
            return loom__error_oom();
    }
    if ((v = loom__chat_opt(js, "strict"))) {
        if (!json_is_boolean(v))
            return loom__chat_bad_type(
                err, "response_format.json_schema.strict", "a boolean", v);
        p->format_strict = json_is_true(v);
    }
    p->format = LOOM_FORMAT_JSON_SCHEMA;
    return 0;
}

static int parse_response_format(loom_llm_params *p, const json_t *body,
                                 loom__chat_error *err)
{
    const json_t *rf = loom__chat_opt(body, "response_format"), *t;
    const char *type;

    if (!rf)
        return 0;
    if (!json_is_object(rf))
        return loom__chat_bad_type(err, "response_format", "an object", rf);
    t = loom__chat_opt(rf, "type");
    if (!t || !json_is_string(t))
        return loom__chat_bad_type(err, "response_format.type", "a string",
                                   t ? t : json_null());
    type = json_string_value(t);
    if (strcmp(type, "text") == 0)
        return 0; /* the default */
    if (strcmp(type, "json_object") == 0) {
        p->format = LOOM_FORMAT_JSON_OBJECT;
        return 0;
    }
    if (strcmp(type, "json_schema") == 0)
        return parse_json_schema(p, rf, err);
    return loom__chat_bad_value(
        err, "response_format.type",
        "'%.64s'. Supported values are: 'text', 'json_object' "
        "and 'json_schema'.",
        type);
}

/* Keeps v in p->extra under key. */
static int keep_extra(loom_llm_params *p, const char *key, const json_t *v)
{
    if (!p->extra && !(p->extra = json_object()))
        return loom__error_oom();
    if (json_object_set_new(p->extra, key, json_deep_copy(v)) != 0)
        return loom__error_oom();
    return 0;
}

static int parse_logit_bias(loom_llm_params *p, const json_t *body,
                            loom__chat_error *err)
{
    const json_t *v = loom__chat_opt(body, "logit_bias"), *b;
    const char *key;
    char param[48];

    if (!v)
        return 0;
    if (!json_is_object(v))
        return loom__chat_bad_type(err, "logit_bias", "an object", v);
    if (json_object_size(v) > MAX_LOGIT_BIAS)
        return loom__chat_bad_value(
            err, "logit_bias", "expected at most %d tokens.", MAX_LOGIT_BIAS);
    json_object_foreach((json_t *)v, key, b)
    {
        snprintf(param, sizeof(param), "logit_bias.%.24s", key);
        if (!*key || strspn(key, "0123456789") != strlen(key))
            return loom__chat_bad_value(err, param, "a key is a token id.");
        if (!json_is_number(b))
            return loom__chat_bad_type(err, param, "a number", b);
        if (!(json_number_value(b) >= -100 && json_number_value(b) <= 100))
            return loom__chat_bad_value(
                err, param, "%g. Expected a value between -100 and 100.",
                json_number_value(b));
    }
    return json_object_size(v) ? keep_extra(p, "logit_bias", v) : 0;
}

static int parse_metadata(loom_llm_params *p, const json_t *body,
                          loom__chat_error *err)
{
    const json_t *v = loom__chat_opt(body, "metadata"), *m;
    const char *key;
    char param[48];

    if (!v)
        return 0;
    if (!json_is_object(v))
        return loom__chat_bad_type(err, "metadata", "an object", v);
    if (json_object_size(v) > MAX_METADATA)
        return loom__chat_bad_value(err, "metadata",
                                    "expected at most %d pairs.", MAX_METADATA);
    json_object_foreach((json_t *)v, key, m)
    {
        snprintf(param, sizeof(param), "metadata.%.24s", key);
        if (strlen(key) > MAX_METADATA_KEY)
            return loom__chat_bad_value(
                err, param, "a key has at most %d bytes.", MAX_METADATA_KEY);
        if (!json_is_string(m))
            return loom__chat_bad_type(err, param, "a string", m);
        if (json_string_length(m) > MAX_METADATA_VALUE)
            return loom__chat_bad_value(err, param,
                                        "a value has at most %d bytes.",
                                        MAX_METADATA_VALUE);
    }
    return json_object_size(v) ? keep_extra(p, "metadata", v) : 0;
}

/* The pass-through strings and flags OpenAI-compatible providers take. */
static int parse_extras(loom_llm_params *p, const json_t *body,
                        loom__chat_error *err)
{
    static const char *const tiers[] = {"auto",  "default",  "flex",
                                        "scale", "priority", NULL};
    static const char *const strings[] = {"prompt_cache_key",
                                          "safety_identifier"};
    const json_t *v;
    char *tier = NULL;
    int rc;

    if ((rc = parse_logit_bias(p, body, err)) ||
        (rc = parse_metadata(p, body, err)) ||
        (rc = get_choice(&tier, body, "service_tier", tiers, err)))
        return rc;
    if (tier) {
        json_t *s = json_string(tier);
        rc = s ? keep_extra(p, "service_tier", s) : loom__error_oom();
        json_decref(s);
        free(tier);
        if (rc)
            return rc;
    }
    if ((v = loom__chat_opt(body, "store"))) {
        if (!json_is_boolean(v))
            return loom__chat_bad_type(err, "store", "a boolean", v);
        if ((rc = keep_extra(p, "store", v)))
            return rc;
    }
    for (size_t i = 0; i < sizeof(strings) / sizeof(strings[0]); i++) {
        if (!(v = loom__chat_opt(body, strings[i])))
            continue;
        if (!json_is_string(v))
            return loom__chat_bad_type(err, strings[i], "a string", v);
        if (json_string_length(v) > MAX_SHORT_STRING)
            return loom__chat_bad_value(err, strings[i],
                                        "expected at most %d bytes.",
                                        MAX_SHORT_STRING);
        if ((rc = keep_extra(p, strings[i], v)))
            return rc;
    }
    return 0;
}

/* What loom cannot give whatever the provider: refused by name. */
static int parse_refused(const json_t *body, loom__chat_error *err)
{
    static const char *const never[] = {"audio", "prediction",
                                        "web_search_options", "functions",
                                        "function_call"};
    const json_t *v;

    if ((v = loom__chat_opt(body, "n"))) {
        if (!json_is_integer(v))
            return loom__chat_bad_type(err, "n", "an integer", v);
        if (json_integer_value(v) < 1)
            return loom__chat_bad_value(err, "n",
                                        "%lld. Expected a value of at least 1.",
                                        (long long)json_integer_value(v));
        if (json_integer_value(v) > 1)
            return refused(err, "n",
                           "above 1: loom runs one answer per request "
                           "(its tools and stored conversation follow one "
                           "answer); send n requests instead");
    }
    if ((v = loom__chat_opt(body, "logprobs"))) {
        if (!json_is_boolean(v))
            return loom__chat_bad_type(err, "logprobs", "a boolean", v);
        if (json_is_true(v))
            return refused(err, "logprobs",
                           "is not supported: loom does not return log "
                           "probabilities");
    }
    if ((v = loom__chat_opt(body, "top_logprobs"))) {
        if (!json_is_integer(v))
            return loom__chat_bad_type(err, "top_logprobs", "an integer", v);
        return refused(err, "top_logprobs",
                       "is not supported: loom does not return log "
                       "probabilities");
    }
    if ((v = loom__chat_opt(body, "modalities"))) {
        if (!json_is_array(v))
            return loom__chat_bad_type(err, "modalities", "an array", v);
        for (size_t i = 0; i < json_array_size(v); i++)
            if (!json_is_string(json_array_get(v, i)) ||
                strcmp(json_string_value(json_array_get(v, i)), "text"))
                return refused(err, "modalities",
                               "other than [\"text\"] is not supported");
    }
    for (size_t i = 0; i < sizeof(never) / sizeof(never[0]); i++)
        if (loom__chat_opt(body, never[i]))
            return refused(err, never[i], "is not supported by loom");
    return 0;
}

int loom__chat_params_parse(loom_llm_params *out, const json_t *body,
                            loom__chat_error *err)
{
    static const char *const efforts[] = {"none",   "minimal", "low",
                                          "medium", "high",    NULL};
    static const char *const verbosities[] = {"low", "medium", "high", NULL};
    const json_t *v;
    int rc;

    memset(out, 0, sizeof(*out));
    if ((rc = parse_refused(body, err)) ||
        (rc = get_number(out, &out->top_p, LOOM_PARAM_TOP_P, body, "top_p", 0,
                         1, err)) ||
        (rc = get_number(out, &out->presence_penalty,
                         LOOM_PARAM_PRESENCE_PENALTY, body, "presence_penalty",
                         -2, 2, err)) ||
        (rc = get_number(out, &out->frequency_penalty,
                         LOOM_PARAM_FREQUENCY_PENALTY, body,
                         "frequency_penalty", -2, 2, err)))
        goto fail;
    if ((v = loom__chat_opt(body, "seed"))) {
        if (!json_is_integer(v)) {
            rc = loom__chat_bad_type(err, "seed", "an integer", v);
            goto fail;
        }
        out->seed = (long long)json_integer_value(v);
        out->set |= LOOM_PARAM_SEED;
    }
    if ((rc = parse_stop(out, body, err)) ||
        (rc = parse_response_format(out, body, err)) ||
        (rc = get_choice(&out->reasoning_effort, body, "reasoning_effort",
                         efforts, err)) ||
        (rc = get_choice(&out->verbosity, body, "verbosity", verbosities,
                         err)) ||
        (rc = parse_extras(out, body, err)))
        goto fail;
    /* `user` was checked as loom's user id; the provider is told too. */
    if ((v = loom__chat_opt(body, "user")) && json_is_string(v) &&
        !(out->user = strdup(json_string_value(v)))) {
        rc = loom__error_oom();
        goto fail;
    }
    return 0;
fail:
    loom_llm_params_clear(out);
    return rc;
}

/* ---- a run's budget ------------------------------------------------------ */

/* The most a request's max_cost_usd may be, in dollars. */
#define MAX_BUDGET_USD 1000000.0
/* The longest max_seconds: a week. */
#define MAX_BUDGET_SECONDS (7L * 24 * 3600)

/* An integer member of a budget in [1, hi] into *out. */
static int budget_int(long *out, const json_t *b, const char *key,
                      const char *param, long hi, loom__chat_error *err)
{
    const json_t *v = loom__chat_opt(b, key);
    char name[64];

    if (!v)
        return 0;
    snprintf(name, sizeof(name), "%s.%s", param, key);
    if (!json_is_integer(v))
        return loom__chat_bad_type(err, name, "an integer", v);
    if (json_integer_value(v) < 1 || json_integer_value(v) > hi)
        return loom__chat_bad_value(err, name,
                                    "%lld. Expected an integer from 1 to %ld.",
                                    (long long)json_integer_value(v), hi);
    *out = (long)json_integer_value(v);
    return 0;
}

int loom__chat_budget_parse(loom_run_budget *out, const json_t *v,
                            const char *param, loom__chat_error *err)
{
    const char *key;
    const json_t *x;
    char name[64];
    double usd;
    int rc;

    memset(out, 0, sizeof(*out));
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_object(v))
        return loom__chat_bad_type(err, param, "an object", v);
    json_object_foreach((json_t *)v, key, x)
    {
        if (strcmp(key, "max_cost_usd") && strcmp(key, "max_tokens") &&
            strcmp(key, "max_seconds")) {
            snprintf(name, sizeof(name), "%s.%.32s", param, key);
            return loom__chat_error_set(
                err, 400, "invalid_request_error", "unknown_parameter", name,
                "Unknown parameter: '%s'. A budget has max_cost_usd, "
                "max_tokens and max_seconds.",
                name);
        }
    }
    if ((x = loom__chat_opt(v, "max_cost_usd")) != NULL) {
        snprintf(name, sizeof(name), "%s.max_cost_usd", param);
        if (!json_is_number(x))
            return loom__chat_bad_type(err, name, "a number", x);
        usd = json_number_value(x);
        if (!(usd > 0 && usd <= MAX_BUDGET_USD) || usd * 1e6 < 0.5)
            return loom__chat_bad_value(err, name,
                                        "%g. Expected dollars above 0, at "
                                        "most %.0f.",
                                        usd, MAX_BUDGET_USD);
        out->max_cost_micros = (int64_t)(usd * 1e6 + 0.5);
    }
    if ((rc = budget_int(&out->max_tokens, v, "max_tokens", param,
                         1000000000000L, err)) != 0 ||
        (rc = budget_int(&out->max_seconds, v, "max_seconds", param,
                         MAX_BUDGET_SECONDS, err)) != 0) {
        memset(out, 0, sizeof(*out));
        return rc;
    }
    return 0;
}
