/*
 * loom-fake-upstream's Google Gemini renderer: a script entry as the
 * answer of models/M:streamGenerateContent (SSE framed with "\r\n\r\n"
 * when the query has alt=sse, as in the recorded vectors/gemini streams;
 * a JSON array of the same objects without it) or of models/M:
 * generateContent (one object), and Gemini's error bodies. Each streamed
 * object is a GenerateContentResponse with one candidate: one per
 * reasoning string (a part with "thought": true), one per text string, one
 * with every functionCall part, the last one with finishReason and the
 * whole usageMetadata. Script fields given in OpenAI terms are translated;
 * see docs/fake-upstream.md.
 */
#include "fake_upstream.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The google.rpc status name Gemini pairs with an HTTP status. */
static const char *status_name(json_int_t code)
{
    switch (code) {
    case 400:
        return "INVALID_ARGUMENT";
    case 401:
        return "UNAUTHENTICATED";
    case 403:
        return "PERMISSION_DENIED";
    case 404:
        return "NOT_FOUND";
    case 409:
        return "ABORTED";
    case 429:
        return "RESOURCE_EXHAUSTED";
    case 499:
        return "CANCELLED";
    case 500:
        return "INTERNAL";
    case 501:
        return "NOT_IMPLEMENTED";
    case 503:
        return "UNAVAILABLE";
    case 504:
        return "DEADLINE_EXCEEDED";
    default:
        return "UNKNOWN";
    }
}

json_t *fake_gemini_error(int status, json_t *error)
{
    json_t *e = json_copy(error);
    json_int_t code;

    if (!e)
        return NULL;
    if (!json_object_get(e, "code"))
        json_object_set_new(e, "code", json_integer(status));
    code = fake_usage_int(e, "code", NULL, status);
    if (!json_object_get(e, "message"))
        json_object_set_new(e, "message", json_string("fake upstream error"));
    if (!json_object_get(e, "status"))
        json_object_set_new(e, "status", json_string(status_name(code)));
    return json_pack("{s:o}", "error", e);
}

static const char *finish_reason(const fake_resp *r)
{
    static const char *const map[][2] = {
        {"stop", "STOP"},
        {"tool_calls", "STOP"}, /* Gemini ends function calls with STOP */
        {"length", "MAX_TOKENS"},
        {"content_filter", "SAFETY"},
    };
    size_t i;

    if (!r->finish_reason)
        return "STOP";
    for (i = 0; i < sizeof(map) / sizeof(*map); i++)
        if (!strcmp(r->finish_reason, map[i][0]))
            return map[i][1];
    return r->finish_reason;
}

/*
 * usageMetadata: the script's own fields verbatim, or its OpenAI fields
 * translated (Gemini counts thoughts apart from candidates, OpenAI counts
 * reasoning inside completion_tokens). NULL when the script has none.
 */
static json_t *usage_of(const fake_resp *r)
{
    json_t *u = r->usage, *out;
    json_int_t p, c, rs, cached;

    if (!u)
        return NULL;
    if (!fake_usage_is_openai(u))
        return json_copy(u);
    p = fake_usage_int(u, "prompt_tokens", NULL, 0);
    c = fake_usage_int(u, "completion_tokens", NULL, 0);
    rs = fake_usage_int(u, "completion_tokens_details", "reasoning_tokens", -1);
    cached = fake_usage_int(u, "prompt_tokens_details", "cached_tokens", -1);
    out = json_pack("{s:I,s:I,s:I}", "promptTokenCount", p,
                    "candidatesTokenCount", c - (rs > 0 ? rs : 0),
                    "totalTokenCount",
                    fake_usage_int(u, "total_tokens", NULL, p + c));
    if (out && cached >= 0)
        json_object_set_new(out, "cachedContentTokenCount",
                            json_integer(cached));
    if (out && rs >= 0)
        json_object_set_new(out, "thoughtsTokenCount", json_integer(rs));
    return out;
}

/* The usage the API repeats on every chunk before the last: the prompt
 * only (as in vectors/gemini/text-0.sse). NULL when unknown. */
static json_t *partial_usage(json_t *full)
{
    json_int_t p = fake_usage_int(full, "promptTokenCount", NULL, -1);

    if (p < 0)
        return NULL;
    return json_pack("{s:I,s:I}", "promptTokenCount", p, "totalTokenCount", p);
}

/* A GenerateContentResponse with one candidate; steals parts, borrows
 * usage (NULL: none). */
static json_t *response(const fake_gen *gn, json_t *parts, const char *finish,
                        json_t *usage)
{
    json_t *cand =
        json_pack("{s:{s:o,s:s}}", "content", "parts", parts, "role", "model");
    json_t *out;

    if (cand && finish)
        json_object_set_new(cand, "finishReason", json_string(finish));
    out = json_pack("{s:[o],s:s,s:s}", "candidates", cand, "modelVersion",
                    gn->r->model, "responseId", gn->id);
    if (out && usage)
        json_object_set(out, "usageMetadata", usage);
    return out;
}

/* Adds thoughtSignature to a part when the script gives one. */
static json_t *sign(const fake_resp *r, json_t *part, bool here)
{
    if (part && here && r->thought_signature)
        json_object_set_new(part, "thoughtSignature",
                            json_string(r->thought_signature));
    return part;
}

/* Every functionCall part, the first one signed (as Gemini does). */
static json_t *call_parts(const fake_resp *r)
{
    json_t *parts = json_array(), *fc;
    size_t k;

    for (k = 0; parts && k < r->ncalls; k++) {
        /* The server checked the arguments with fake_args_ok(). */
        fc = json_pack("{s:s,s:o}", "name", r->calls[k].name, "args",
                       fake_call_args(&r->calls[k]));
        if (fc && r->calls[k].id)
            json_object_set_new(fc, "id", json_string(r->calls[k].id));
        if (json_array_append_new(
                parts, sign(r, json_pack("{s:o}", "functionCall", fc), !k))) {
            json_decref(parts);
            return NULL;
        }
    }
    return parts;
}

typedef struct {
    fake_stream *s;
    bool sse;
    bool first;
} gctx;

/* One streamed object: an SSE event, or an element of the JSON array. */
static int emit(gctx *c, json_t *obj)
{
    char *js, *buf;
    size_t n;

    if (c->sse)
        return fake_stream_event(c->s, NULL, obj, "\r\n");
    js = obj ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (!js)
        return -1;
    n = strlen(js) + 4;
    buf = malloc(n);
    if (buf)
        snprintf(buf, n, "%s%s", c->first ? "[" : ",\r\n", js);
    free(js);
    c->first = false;
    return fake_stream_take(c->s, buf, buf ? strlen(buf) : 0);
}

int fake_gemini_stream(fake_stream *s, const fake_gen *gn)
{
    const fake_resp *r = gn->r;
    gctx c = {.s = s, .sse = gn->sse, .first = true};
    size_t nr = json_array_size(r->reasoning), nt = json_array_size(r->text);
    size_t total = nr + nt + (r->ncalls ? 1 : 0), i, k;
    json_t *usage = usage_of(r), *part_usage = partial_usage(usage), *part;
    int rc = -1;

    if (r->usage && !usage)
        goto cleanup;
    for (i = 0; i < nr + nt; i++) {
        bool last = i + 1 == total && !r->stream_error;
        /* The signature rides on the last part when no call takes it. */
        bool signed_here = !r->ncalls && (i + 1 == nr + nt);

        k = i < nr ? i : i - nr;
        part =
            i < nr
                ? json_pack("{s:s,s:b}", "text",
                            json_string_value(json_array_get(r->reasoning, k)),
                            "thought", 1)
                : json_pack("{s:s}", "text",
                            json_string_value(json_array_get(r->text, k)));
        if (emit(&c, response(gn, json_pack("[o]", sign(r, part, signed_here)),
                              last ? finish_reason(r) : NULL,
                              last ? usage : part_usage)))
            goto cleanup;
    }
    if (r->stream_error) {
        if (emit(&c, fake_gemini_error(500, r->stream_error)))
            goto cleanup;
    } else if (r->ncalls) {
        if (emit(&c, response(gn, call_parts(r), finish_reason(r), usage)))
            goto cleanup;
    } else if (!total) {
        part = sign(r, json_pack("{s:s}", "text", ""), true);
        if (emit(&c,
                 response(gn, json_pack("[o]", part), finish_reason(r), usage)))
            goto cleanup;
    }
    rc = c.sse ? 0 : fake_stream_copy(s, "]", 1);
cleanup:
    json_decref(usage);
    json_decref(part_usage);
    return rc;
}

json_t *fake_gemini_message(const fake_gen *gn)
{
    const fake_resp *r = gn->r;
    json_t *parts = r->ncalls ? call_parts(r) : json_array(), *usage, *out;

    if (!parts)
        return NULL;
    /* Thoughts, then text, then the calls; signed as in a stream. */
    if (r->text)
        json_array_insert_new(
            parts, 0,
            sign(r, json_pack("{s:o}", "text", fake_join(r->text, NULL, 0)),
                 !r->ncalls));
    if (r->reasoning)
        json_array_insert_new(
            parts, 0,
            sign(r,
                 json_pack("{s:o,s:b}", "text",
                           fake_join(r->reasoning, NULL, 0), "thought", 1),
                 !r->ncalls && !r->text));
    if (!json_array_size(parts))
        json_array_append_new(parts,
                              sign(r, json_pack("{s:s}", "text", ""), true));
    usage = usage_of(r);
    out = response(gn, parts, finish_reason(r), usage);
    json_decref(usage);
    return out;
}
