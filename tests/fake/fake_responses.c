/*
 * loom-fake-upstream's OpenAI Responses renderer: a script entry as the
 * stream of POST /v1/responses with "stream": true, or as one response
 * object otherwise. The stream is what the API sends: `event: <type>` +
 * `data:` pairs, every event with its "type" and a "sequence_number" from
 * 0, response.created and response.in_progress, then one output item after
 * the other (reasoning, message, function calls), each opened with
 * response.output_item.added, filled with deltas and closed with its
 * .done events, and response.completed (or response.incomplete) with the
 * whole response. The recorded vectors/openai-responses streams (from an
 * SDK's test suite) leave out some of these events; the event names, their
 * fields and their order otherwise match. Errors share the OpenAI Chat
 * body, {"error": {...}}, so they are rendered in fake_script.c.
 */
#include "fake_upstream.h"

#include <stdio.h>
#include <string.h>

/* The reason of an incomplete response, NULL when it completed. */
static const char *incomplete_reason(const fake_resp *r)
{
    const char *f = r->finish_reason;

    if (!f)
        return NULL;
    if (!strcmp(f, "length") || !strcmp(f, "max_output_tokens") ||
        !strcmp(f, "incomplete"))
        return "max_output_tokens";
    if (!strcmp(f, "content_filter"))
        return "content_filter";
    return NULL;
}

/*
 * The usage object with every field the API sends: from the script's
 * OpenAI Chat names, or from its own Responses names (other fields it
 * gives are kept). With usage NULL: all zeros, as in response.created.
 */
static json_t *usage_of(json_t *u)
{
    bool chat = fake_usage_is_openai(u);
    json_int_t in, out, total;
    json_t *o;

    in = fake_usage_int(u, chat ? "prompt_tokens" : "input_tokens", NULL, 0);
    out = fake_usage_int(u, chat ? "completion_tokens" : "output_tokens", NULL,
                         0);
    total = fake_usage_int(u, "total_tokens", NULL, in + out);
    o = json_pack(
        "{s:I,s:{s:I},s:I,s:{s:I},s:I}", "input_tokens", in,
        "input_tokens_details", "cached_tokens",
        fake_usage_int(u,
                       chat ? "prompt_tokens_details" : "input_tokens_details",
                       "cached_tokens", 0),
        "output_tokens", out, "output_tokens_details", "reasoning_tokens",
        fake_usage_int(
            u, chat ? "completion_tokens_details" : "output_tokens_details",
            "reasoning_tokens", 0),
        "total_tokens", total);
    if (o && u && !chat)
        json_object_update_missing(o, u);
    return o;
}

/* The response object; steals output and usage. */
static json_t *response_obj(const fake_gen *gn, const char *status,
                            json_t *output, json_t *usage)
{
    const char *why = incomplete_reason(gn->r);
    json_t *o = json_pack(
        "{s:s,s:s,s:I,s:s,s:o,s:n,s:n,s:n,s:n,s:b,s:n,s:[],s:n,s:s,s:o}", "id",
        gn->id, "object", "response", "created_at", gn->r->created, "model",
        gn->r->model, "output", output, "error", "incomplete_details",
        "instructions", "metadata", "parallel_tool_calls", 0, "temperature",
        "tools", "top_p", "status", status, "usage", usage);

    if (o && !strcmp(status, "incomplete") && why)
        json_object_set_new(o, "incomplete_details",
                            json_pack("{s:s}", "reason", why));
    return o;
}

static void item_id(const fake_gen *gn, const char *kind, size_t k, char *buf,
                    size_t n)
{
    if (k)
        snprintf(buf, n, "%s_fake_%llu_%zu", kind, (unsigned long long)gn->n,
                 k);
    else
        snprintf(buf, n, "%s_fake_%llu", kind, (unsigned long long)gn->n);
}

/* The reasoning item, empty while in progress or with its text. */
static json_t *reasoning_item(const fake_gen *gn, bool done)
{
    const fake_resp *r = gn->r;
    const char *status = done ? "completed" : "in_progress";
    char id[64];
    json_t *o;

    item_id(gn, "rs", 0, id, sizeof(id));
    if (!r->reasoning_text)
        return json_pack(
            "{s:s,s:s,s:o,s:s}", "id", id, "type", "reasoning", "summary",
            done ? json_pack("[{s:s,s:o}]", "type", "summary_text", "text",
                             fake_join(r->reasoning, NULL, 0))
                 : json_array(),
            "status", status);
    o = json_pack("{s:s,s:s,s:[],s:s}", "id", id, "type", "reasoning",
                  "summary", "status", status);
    if (o && done)
        json_object_set_new(o, "content",
                            json_pack("[{s:s,s:o}]", "type", "reasoning_text",
                                      "text",
                                      fake_join(r->reasoning, NULL, 0)));
    return o;
}

static json_t *message_item(const fake_gen *gn, bool done)
{
    char id[64];

    item_id(gn, "msg", 0, id, sizeof(id));
    return json_pack(
        "{s:s,s:s,s:s,s:s,s:o}", "id", id, "type", "message", "role",
        "assistant", "status", done ? "completed" : "in_progress", "content",
        done ? json_pack("[{s:s,s:o,s:[]}]", "type", "output_text", "text",
                         fake_join(gn->r->text, NULL, 0), "annotations")
             : json_array());
}

static json_t *call_item(const fake_gen *gn, size_t k, bool done)
{
    const fake_call *c = &gn->r->calls[k];
    char id[64], cbuf[64];
    const char *cid = fake_call_id(c, k, "call_fake_", cbuf, sizeof(cbuf));

    item_id(gn, "fc", k + 1, id, sizeof(id));
    return json_pack(
        "{s:s,s:s,s:s,s:o,s:s,s:s}", "id", id, "type", "function_call",
        "status", done ? "completed" : "in_progress", "arguments",
        done ? fake_join(NULL, c->frags, c->nfrags) : json_string(""),
        "call_id", cid, "name", c->name);
}

/* Streaming state. */
typedef struct {
    fake_stream *s;
    const fake_gen *gn;
    json_int_t seq;   /* next sequence_number */
    json_int_t index; /* output_index of the item being sent */
    json_t *output;   /* the items done so far */
} rctx;

/* Sends {"type": type, <fields>, "sequence_number"}; steals fields. */
static int emit(rctx *c, const char *type, json_t *fields)
{
    json_t *o = json_pack("{s:s}", "type", type);

    if (!o || !fields || json_object_update(o, fields)) {
        json_decref(o);
        json_decref(fields);
        return -1;
    }
    json_decref(fields);
    json_object_set_new(o, "type", json_string(type));
    json_object_set_new(o, "sequence_number", json_integer(c->seq++));
    return fake_stream_event(c->s, type, o, "\n");
}

static int item_added(rctx *c, json_t *item)
{
    return emit(c, "response.output_item.added",
                json_pack("{s:o,s:I}", "item", item, "output_index", c->index));
}

static int item_done(rctx *c, json_t *item)
{
    if (!item || json_array_append(c->output, item)) {
        json_decref(item);
        return -1;
    }
    return emit(
        c, "response.output_item.done",
        json_pack("{s:o,s:I}", "item", item, "output_index", c->index++));
}

/* content_part.added / .done of content part 0 of item id. */
static int content_part(rctx *c, const char *type, const char *id, json_t *part)
{
    return emit(c, type,
                json_pack("{s:i,s:s,s:I,s:o}", "content_index", 0, "item_id",
                          id, "output_index", c->index, "part", part));
}

static int reasoning_summary(rctx *c, const char *id, json_t *text)
{
    const char *t = json_string_value(text);
    json_t *v;
    size_t k;

    if (emit(c, "response.reasoning_summary_part.added",
             json_pack("{s:s,s:I,s:i,s:{s:s,s:s}}", "item_id", id,
                       "output_index", c->index, "summary_index", 0, "part",
                       "type", "summary_text", "text", "")))
        return -1;
    json_array_foreach(c->gn->r->reasoning, k, v)
    {
        if (emit(c, "response.reasoning_summary_text.delta",
                 json_pack("{s:s,s:I,s:i,s:O}", "item_id", id, "output_index",
                           c->index, "summary_index", 0, "delta", v)))
            return -1;
    }
    if (emit(c, "response.reasoning_summary_text.done",
             json_pack("{s:s,s:I,s:i,s:s}", "item_id", id, "output_index",
                       c->index, "summary_index", 0, "text", t)))
        return -1;
    return emit(c, "response.reasoning_summary_part.done",
                json_pack("{s:s,s:I,s:i,s:{s:s,s:s}}", "item_id", id,
                          "output_index", c->index, "summary_index", 0, "part",
                          "type", "summary_text", "text", t));
}

static int reasoning_text(rctx *c, const char *id, json_t *text)
{
    const char *t = json_string_value(text);
    json_t *v;
    size_t k;

    if (content_part(
            c, "response.content_part.added", id,
            json_pack("{s:s,s:s}", "type", "reasoning_text", "text", "")))
        return -1;
    json_array_foreach(c->gn->r->reasoning, k, v)
    {
        if (emit(c, "response.reasoning_text.delta",
                 json_pack("{s:i,s:O,s:s,s:I}", "content_index", 0, "delta", v,
                           "item_id", id, "output_index", c->index)))
            return -1;
    }
    if (emit(c, "response.reasoning_text.done",
             json_pack("{s:i,s:s,s:I,s:s}", "content_index", 0, "item_id", id,
                       "output_index", c->index, "text", t)))
        return -1;
    return content_part(
        c, "response.content_part.done", id,
        json_pack("{s:s,s:s}", "type", "reasoning_text", "text", t));
}

static int reasoning(rctx *c)
{
    json_t *text = fake_join(c->gn->r->reasoning, NULL, 0);
    char id[64];
    int rc = -1;

    item_id(c->gn, "rs", 0, id, sizeof(id));
    if (!text || item_added(c, reasoning_item(c->gn, false)))
        goto cleanup;
    if (c->gn->r->reasoning_text ? reasoning_text(c, id, text)
                                 : reasoning_summary(c, id, text))
        goto cleanup;
    rc = item_done(c, reasoning_item(c->gn, true));
cleanup:
    json_decref(text);
    return rc;
}

/* The in-stream error: an `error` event, or response.failed. */
static int stream_error(rctx *c)
{
    json_t *e = json_pack("{s:s,s:s,s:n}", "code", "server_error", "message",
                          "fake upstream error", "param");
    json_t *resp;

    if (!e || json_object_update(e, c->gn->r->stream_error)) {
        json_decref(e);
        return -1;
    }
    if (!c->gn->r->failed_event)
        return emit(c, "error", e);
    resp =
        response_obj(c->gn, "failed", json_incref(c->output), usage_of(NULL));
    if (resp)
        json_object_set_new(resp, "error",
                            json_pack("{s:O,s:O}", "code",
                                      json_object_get(e, "code"), "message",
                                      json_object_get(e, "message")));
    json_decref(e);
    return emit(c, "response.failed", json_pack("{s:o}", "response", resp));
}

/* The message item; 1 when the stream ended with its in-stream error. */
static int message(rctx *c)
{
    json_t *text = fake_join(c->gn->r->text, NULL, 0), *v;
    const char *t = json_string_value(text);
    char id[64];
    int rc = -1;
    size_t k;

    item_id(c->gn, "msg", 0, id, sizeof(id));
    if (!text || item_added(c, message_item(c->gn, false)) ||
        content_part(c, "response.content_part.added", id,
                     json_pack("{s:s,s:s,s:[]}", "type", "output_text", "text",
                               "", "annotations")))
        goto cleanup;
    json_array_foreach(c->gn->r->text, k, v)
    {
        if (emit(c, "response.output_text.delta",
                 json_pack("{s:i,s:O,s:s,s:[],s:I}", "content_index", 0,
                           "delta", v, "item_id", id, "logprobs",
                           "output_index", c->index)))
            goto cleanup;
    }
    if (c->gn->r->stream_error) {
        rc = stream_error(c) ? -1 : 1;
        goto cleanup;
    }
    if (emit(c, "response.output_text.done",
             json_pack("{s:i,s:s,s:[],s:I,s:s}", "content_index", 0, "item_id",
                       id, "logprobs", "output_index", c->index, "text", t)) ||
        content_part(c, "response.content_part.done", id,
                     json_pack("{s:s,s:s,s:[]}", "type", "output_text", "text",
                               t, "annotations")))
        goto cleanup;
    rc = item_done(c, message_item(c->gn, true));
cleanup:
    json_decref(text);
    return rc;
}

static int call(rctx *c, size_t k)
{
    const fake_call *fc = &c->gn->r->calls[k];
    json_t *args = fake_join(NULL, fc->frags, fc->nfrags);
    char id[64];
    size_t f;
    int rc = -1;

    item_id(c->gn, "fc", k + 1, id, sizeof(id));
    if (!args || item_added(c, call_item(c->gn, k, false)))
        goto cleanup;
    for (f = 0; f < fc->nfrags; f++)
        if (emit(c, "response.function_call_arguments.delta",
                 json_pack("{s:s,s:I,s:s}", "item_id", id, "output_index",
                           c->index, "delta", fc->frags[f])))
            goto cleanup;
    if (emit(c, "response.function_call_arguments.done",
             json_pack("{s:s,s:I,s:O,s:s}", "item_id", id, "output_index",
                       c->index, "arguments", args, "name", fc->name)))
        goto cleanup;
    rc = item_done(c, call_item(c->gn, k, true));
cleanup:
    json_decref(args);
    return rc;
}

int fake_responses_stream(fake_stream *s, const fake_gen *gn)
{
    const fake_resp *r = gn->r;
    rctx c = {.s = s, .gn = gn, .output = json_array()};
    const char *status = incomplete_reason(r) ? "incomplete" : "completed";
    size_t k;
    int rc = -1, m;

    if (!c.output ||
        emit(&c, "response.created",
             json_pack("{s:o}", "response",
                       response_obj(gn, "in_progress", json_array(),
                                    usage_of(NULL)))) ||
        emit(&c, "response.in_progress",
             json_pack("{s:o}", "response",
                       response_obj(gn, "in_progress", json_array(),
                                    usage_of(NULL)))))
        goto cleanup;
    if (r->reasoning && reasoning(&c))
        goto cleanup;
    if (r->text) {
        m = message(&c);
        if (m) {
            rc = m > 0 ? 0 : -1;
            goto cleanup;
        }
    } else if (r->stream_error) {
        rc = stream_error(&c);
        goto cleanup;
    }
    for (k = 0; k < r->ncalls; k++)
        if (call(&c, k))
            goto cleanup;
    rc = emit(&c,
              strcmp(status, "completed") ? "response.incomplete"
                                          : "response.completed",
              json_pack("{s:o}", "response",
                        response_obj(gn, status, json_incref(c.output),
                                     usage_of(r->usage))));
cleanup:
    json_decref(c.output);
    return rc;
}

json_t *fake_responses_message(const fake_gen *gn)
{
    const fake_resp *r = gn->r;
    json_t *output = json_array();
    size_t k;

    if (output && r->reasoning)
        json_array_append_new(output, reasoning_item(gn, true));
    if (output && r->text)
        json_array_append_new(output, message_item(gn, true));
    for (k = 0; output && k < r->ncalls; k++)
        json_array_append_new(output, call_item(gn, k, true));
    return response_obj(gn, incomplete_reason(r) ? "incomplete" : "completed",
                        output, usage_of(r->usage));
}
