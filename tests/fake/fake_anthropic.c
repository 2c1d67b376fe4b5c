/*
 * loom-fake-upstream's Anthropic Messages renderer: a script entry as the
 * `event:` + `data:` stream of POST /v1/messages with "stream": true
 * (message_start, content blocks with their deltas, one ping, message_delta,
 * message_stop), as one message object otherwise, and Anthropic's error
 * bodies. The shapes follow the recorded streams in vectors/anthropic: a
 * ping right after the first content_block_start, a tool_use block that
 * starts with an empty input_json_delta. Script fields given in OpenAI
 * terms ("stop", "tool_calls", prompt_tokens...) are translated; see
 * docs/fake-upstream.md.
 */
#include "fake_upstream.h"

#include <stdio.h>
#include <string.h>

/* Anthropic's error type for an HTTP status. */
static const char *error_type(int status)
{
    switch (status) {
    case 400:
        return "invalid_request_error";
    case 401:
        return "authentication_error";
    case 402:
        return "billing_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 413:
        return "request_too_large";
    case 429:
        return "rate_limit_error";
    case 504:
        return "timeout_error";
    case 529:
        return "overloaded_error";
    default:
        return status < 500 ? "invalid_request_error" : "api_error";
    }
}

/* {"type":"error","error":{"type","message",...}}, the script's fields
 * first, type and message filled in when missing. */
static json_t *error_obj(json_t *error, const char *type, const char *msg)
{
    json_t *e = json_copy(error);

    if (!e)
        return NULL;
    if (!json_object_get(e, "type"))
        json_object_set_new(e, "type", json_string(type));
    if (!json_object_get(e, "message"))
        json_object_set_new(e, "message", json_string(msg));
    return json_pack("{s:s,s:o}", "type", "error", "error", e);
}

json_t *fake_anthropic_error(int status, json_t *error)
{
    return error_obj(error, error_type(status), "fake upstream error");
}

static const char *stop_reason(const fake_resp *r)
{
    static const char *const map[][2] = {
        {"stop", "end_turn"},
        {"tool_calls", "tool_use"},
        {"length", "max_tokens"},
        {"content_filter", "refusal"},
    };
    size_t i;

    if (!r->finish_reason)
        return r->ncalls ? "tool_use" : "end_turn";
    for (i = 0; i < sizeof(map) / sizeof(*map); i++)
        if (!strcmp(r->finish_reason, map[i][0]))
            return map[i][1];
    return r->finish_reason;
}

/*
 * The usage object: the script's own Anthropic fields over zeros, or its
 * OpenAI fields translated (OpenAI's prompt_tokens counts cached tokens,
 * Anthropic's input_tokens does not).
 */
static json_t *usage_of(const fake_resp *r)
{
    json_t *u = r->usage, *out;
    json_int_t cached, prompt;

    if (u && fake_usage_is_openai(u)) {
        prompt = fake_usage_int(u, "prompt_tokens", NULL, 0);
        cached =
            fake_usage_int(u, "prompt_tokens_details", "cached_tokens", -1);
        out = json_pack("{s:I,s:I}", "input_tokens",
                        prompt - (cached > 0 ? cached : 0), "output_tokens",
                        fake_usage_int(u, "completion_tokens", NULL, 0));
        if (out && cached >= 0) {
            json_object_set_new(out, "cache_creation_input_tokens",
                                json_integer(0));
            json_object_set_new(out, "cache_read_input_tokens",
                                json_integer(cached));
        }
        return out;
    }
    out = json_pack("{s:i,s:i}", "input_tokens", 0, "output_tokens", 0);
    if (out && u)
        json_object_update(out, u);
    return out;
}

/* The script's signature, or one made up in buf (64 bytes are enough). */
static const char *signature_of(const fake_gen *gn, char *buf, size_t n)
{
    if (gn->r->signature)
        return gn->r->signature;
    snprintf(buf, n, "fake_signature_%llu", (unsigned long long)gn->n);
    return buf;
}

static int event(fake_stream *s, const char *name, json_t *obj)
{
    return fake_stream_event(s, name, obj, "\n");
}

/* Streaming state: the next block index, whether the ping went out. */
typedef struct {
    fake_stream *s;
    json_int_t index;
    bool pinged;
} actx;

/* The ping as the API sends it (with a space, unlike the other events). */
static int ping(actx *c)
{
    static const char ev[] = "event: ping\ndata: {\"type\": \"ping\"}\n\n";

    c->pinged = true;
    return fake_stream_copy(c->s, ev, sizeof(ev) - 1);
}

/* content_block_start, then the one ping the API sends after the first. */
static int block_start(actx *c, json_t *block)
{
    if (event(c->s, "content_block_start",
              json_pack("{s:s,s:I,s:o}", "type", "content_block_start", "index",
                        c->index, "content_block", block)))
        return -1;
    return c->pinged ? 0 : ping(c);
}

static int block_delta(actx *c, const char *type, const char *key,
                       const char *val)
{
    return event(c->s, "content_block_delta",
                 json_pack("{s:s,s:I,s:{s:s,s:s}}", "type",
                           "content_block_delta", "index", c->index, "delta",
                           "type", type, key, val));
}

static int block_stop(actx *c)
{
    int rc = event(c->s, "content_block_stop",
                   json_pack("{s:s,s:I}", "type", "content_block_stop", "index",
                             c->index));

    c->index++;
    return rc;
}

static int stream_error(actx *c, const fake_resp *r)
{
    return event(c->s, "error",
                 error_obj(r->stream_error, "overloaded_error", "Overloaded"));
}

static int tool_block(actx *c, const fake_call *call, size_t k)
{
    char cbuf[64];
    const char *cid = fake_call_id(call, k, "toolu_fake_", cbuf, sizeof(cbuf));
    size_t f;

    if (block_start(c, json_pack("{s:s,s:s,s:s,s:{}}", "type", "tool_use", "id",
                                 cid, "name", call->name, "input")))
        return -1;
    /* The API opens every tool_use block with an empty fragment. */
    if (block_delta(c, "input_json_delta", "partial_json", ""))
        return -1;
    for (f = 0; f < call->nfrags; f++)
        if (block_delta(c, "input_json_delta", "partial_json", call->frags[f]))
            return -1;
    return block_stop(c);
}

int fake_anthropic_stream(fake_stream *s, const fake_gen *gn)
{
    const fake_resp *r = gn->r;
    actx c = {.s = s};
    json_t *usage = usage_of(r), *start, *v;
    char sbuf[64];
    const char *sig;
    size_t k;
    int rc = -1;

    if (!usage)
        return -1;
    /* message_start reports the prompt and the first output token. */
    start = json_copy(usage);
    if (start && fake_usage_int(start, "output_tokens", NULL, 0) > 1)
        json_object_set_new(start, "output_tokens", json_integer(1));
    if (event(s, "message_start",
              json_pack("{s:s,s:{s:s,s:s,s:s,s:s,s:[],s:n,s:n,s:o}}", "type",
                        "message_start", "message", "id", gn->id, "type",
                        "message", "role", "assistant", "model", r->model,
                        "content", "stop_reason", "stop_sequence", "usage",
                        start)))
        goto cleanup;
    if (r->reasoning) {
        sig = signature_of(gn, sbuf, sizeof(sbuf));
        if (block_start(&c, json_pack("{s:s,s:s,s:s}", "type", "thinking",
                                      "thinking", "", "signature", "")))
            goto cleanup;
        json_array_foreach(r->reasoning, k, v)
        {
            if (block_delta(&c, "thinking_delta", "thinking",
                            json_string_value(v)))
                goto cleanup;
        }
        if (block_delta(&c, "signature_delta", "signature", sig) ||
            block_stop(&c))
            goto cleanup;
    }
    if (r->redacted_thinking &&
        (block_start(&c, json_pack("{s:s,s:s}", "type", "redacted_thinking",
                                   "data", r->redacted_thinking)) ||
         block_stop(&c)))
        goto cleanup;
    if (r->text) {
        if (block_start(&c, json_pack("{s:s,s:s}", "type", "text", "text", "")))
            goto cleanup;
        json_array_foreach(r->text, k, v)
        {
            if (block_delta(&c, "text_delta", "text", json_string_value(v)))
                goto cleanup;
        }
        if (r->stream_error) {
            rc = stream_error(&c, r);
            goto cleanup;
        }
        if (block_stop(&c))
            goto cleanup;
    } else if (r->stream_error) {
        rc = stream_error(&c, r);
        goto cleanup;
    }
    for (k = 0; k < r->ncalls; k++)
        if (tool_block(&c, &r->calls[k], k))
            goto cleanup;
    if (!c.pinged && ping(&c)) /* no block at all */
        goto cleanup;
    if (event(s, "message_delta",
              json_pack("{s:s,s:{s:s,s:n},s:O}", "type", "message_delta",
                        "delta", "stop_reason", stop_reason(r), "stop_sequence",
                        "usage", usage)) ||
        event(s, "message_stop", json_pack("{s:s}", "type", "message_stop")))
        goto cleanup;
    rc = 0;
cleanup:
    json_decref(usage);
    return rc;
}

json_t *fake_anthropic_message(const fake_gen *gn)
{
    const fake_resp *r = gn->r;
    json_t *content = json_array(), *out;
    char sbuf[64], cbuf[64];
    const char *sig, *cid;
    size_t k;

    if (!content)
        return NULL;
    if (r->reasoning) {
        sig = signature_of(gn, sbuf, sizeof(sbuf));
        json_array_append_new(
            content,
            json_pack("{s:s,s:o,s:s}", "type", "thinking", "thinking",
                      fake_join(r->reasoning, NULL, 0), "signature", sig));
    }
    if (r->redacted_thinking)
        json_array_append_new(content, json_pack("{s:s,s:s}", "type",
                                                 "redacted_thinking", "data",
                                                 r->redacted_thinking));
    if (r->text)
        json_array_append_new(content,
                              json_pack("{s:s,s:o}", "type", "text", "text",
                                        fake_join(r->text, NULL, 0)));
    for (k = 0; k < r->ncalls; k++) {
        cid = fake_call_id(&r->calls[k], k, "toolu_fake_", cbuf, sizeof(cbuf));
        /* The server checked the arguments with fake_args_ok(). */
        json_array_append_new(content,
                              json_pack("{s:s,s:s,s:s,s:o}", "type", "tool_use",
                                        "id", cid, "name", r->calls[k].name,
                                        "input", fake_call_args(&r->calls[k])));
    }
    out = json_pack("{s:s,s:s,s:s,s:s,s:o,s:s,s:n,s:o}", "id", gn->id, "type",
                    "message", "role", "assistant", "model", r->model,
                    "content", content, "stop_reason", stop_reason(r),
                    "stop_sequence", "usage", usage_of(r));
    return out;
}
