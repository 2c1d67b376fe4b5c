/*
 * The part every answer decoder shares (see llm/answer.h): the buffers of
 * one answer and their limits, the events that open and close it, its
 * errors, the SSE parser in front, and the hand-over into a
 * loom_llm_response. The decoders were written apart, one per wire
 * format, and each had its own copy of this; what they read differs, what
 * they do with it once read does not, so that lives here once.
 */
#include "llm/answer.h"
#include "core/error.h"
#include "llm/attempt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t loom__llm_limits(size_t *max_tool_calls, size_t *max_args,
                        size_t *max_text)
{
    if (!*max_tool_calls)
        *max_tool_calls = LOOM_LLM_MAX_TOOL_CALLS;
    if (!*max_args)
        *max_args = LOOM_LLM_MAX_ARGS;
    if (!*max_text)
        *max_text = LOOM_LLM_MAX_TEXT;
    return *max_text > *max_args ? *max_text : *max_args;
}

int loom__llm_answer_new(void **out, size_t size,
                         const loom__llm_answer_kind *kind, const void *limits,
                         loom_llm_event_cb cb, void *payload)
{
    loom_sse_options opts = LOOM_SSE_OPTIONS_INIT;
    loom__llm_answer *a;
    void *lim;
    size_t max_text = 0;
    int rc;

    *out = NULL;
    if (!(a = calloc(1, size)))
        return loom__error_oom();
    a->kind = kind;
    a->cb = cb;
    a->payload = payload;
    lim = (char *)a + kind->lim_offset;
    if (limits)
        memcpy(lim, limits, kind->lim_size);
    opts.max_line = opts.max_event = kind->limits(lim, &max_text);
    loom_buf_init(&a->text, max_text);
    loom_buf_init(&a->reasoning, max_text);
    if ((rc = loom_sse_parser_new(&a->sse, &opts, kind->on_sse, a)) != 0) {
        free(a);
        return rc;
    }
    *out = a;
    return 0;
}

void loom__llm_answer_clear(loom__llm_answer *a)
{
    loom_sse_parser_free(a->sse);
    loom_buf_free(&a->text);
    loom_buf_free(&a->reasoning);
    for (size_t i = 0; i < a->calls_len; i++)
        loom_tool_call_clear(&a->calls[i]);
    free(a->calls);
    free(a->finish_reason);
    free(a->response_id);
    free(a->state);
    loom__upstream_error_clear(&a->error);
}

int loom__llm_answer_fail(loom__llm_answer *a, int rc)
{
    a->failed = rc;
    return rc;
}

int loom__llm_answer_emit(loom__llm_answer *a, const loom_llm_event *ev)
{
    if (a->cb && a->cb(ev, a->payload) != 0)
        return loom__llm_answer_fail(
            a,
            loom__error_set(LOOM_ECANCELED, "canceled by the event callback"));
    return 0;
}

int loom__llm_answer_keep(loom__llm_answer *a, loom_llm_event_type type,
                          const char *s, size_t len)
{
    loom_buf *b = type == LOOM_LLM_TEXT ? &a->text : &a->reasoning;

    if (len > b->max - b->len)
        return loom__llm_answer_fail(
            a, loom__error_set(
                   LOOM_ETOOLARGE, "answer %s passed the limit of %zu bytes",
                   type == LOOM_LLM_TEXT ? "text" : a->kind->reasoning_name,
                   b->max));
    if (len && loom_buf_put(b, s, len) != 0)
        return loom__llm_answer_fail(a, loom__error_oom());
    return 0;
}

int loom__llm_answer_pass(loom__llm_answer *a, loom_llm_event_type type,
                          const char *s, size_t len)
{
    loom_llm_event ev = {0};

    if (type == LOOM_LLM_REASONING)
        a->has_reasoning = 1;
    a->output_started = 1;
    ev.type = type;
    ev.text = s;
    ev.text_len = len;
    return loom__llm_answer_emit(a, &ev);
}

int loom__llm_answer_text(loom__llm_answer *a, loom_llm_event_type type,
                          const char *s, size_t len)
{
    int rc;

    if (!len)
        return 0;
    if ((rc = loom__llm_answer_keep(a, type, s, len)) != 0)
        return rc;
    return loom__llm_answer_pass(a, type, s, len);
}

int loom__llm_answer_args(loom__llm_answer *a, loom_buf *args, size_t index,
                          const char *s, size_t len)
{
    if (len > args->max - args->len)
        return loom__llm_answer_fail(
            a, loom__error_set(LOOM_ETOOLARGE,
                               "tool call %zu: arguments passed the limit of "
                               "%zu bytes",
                               index, args->max));
    if (len && loom_buf_put(args, s, len) != 0)
        return loom__llm_answer_fail(a, loom__error_oom());
    return 0;
}

int loom__llm_answer_call_delta(loom__llm_answer *a, size_t index,
                                const char *id, const char *name,
                                const char *args)
{
    loom_llm_event ev = {0};

    a->output_started = 1;
    ev.type = LOOM_LLM_TOOL_CALL_DELTA;
    ev.tool_index = (int)index;
    ev.tool_id = id;
    ev.tool_name = name;
    ev.args_delta = args;
    return loom__llm_answer_emit(a, &ev);
}

int loom__llm_answer_error(loom__llm_answer *a, loom_upstream_kind kind,
                           int status, const char *msg, const char *type,
                           const char *data, size_t len, int event)
{
    loom_llm_event ev = {0};

    if (!msg) {
        msg = data;
        len = len > LOOM_LLM_MAX_ERROR_TEXT ? LOOM_LLM_MAX_ERROR_TEXT : len;
    } else {
        len = strlen(msg);
    }
    if (loom__llm_error_set(&a->error, kind, status, msg, len, type, NULL))
        return loom__llm_answer_fail(a, LOOM_ENOMEM);
    if (!event)
        return loom__llm_answer_fail(
            a, loom__error_set(LOOM_EUPSTREAM, "%s", a->error.message));
    ev.type = LOOM_LLM_ERROR;
    ev.error_code = LOOM_EUPSTREAM;
    ev.error_message = a->error.message;
    /* The stream is over whatever the callback says. */
    if (a->cb)
        a->cb(&ev, a->payload);
    return loom__llm_answer_fail(
        a,
        loom__error_set(LOOM_EUPSTREAM, "stream error: %s", a->error.message));
}

int loom__llm_answer_bad_json(loom__llm_answer *a, const char *what,
                              const char *data, size_t len)
{
    json_error_t je;
    json_t *o = json_loadb(data, len, 0, &je);
    int rc = loom__error_set(LOOM_EPROTO, "malformed %s (%s): %.*s", what,
                             o ? "not an object" : je.text,
                             (int)(len > 120 ? 120 : len), data);

    json_decref(o);
    return loom__llm_answer_fail(a, rc);
}

int loom__llm_answer_calls(loom__llm_answer *a, size_t n)
{
    if (n && !(a->calls = calloc(n, sizeof(*a->calls))))
        return loom__llm_answer_fail(a, loom__error_oom());
    return 0;
}

int loom__llm_answer_take_call(loom__llm_answer *a, loom_tool_call *c,
                               char **id, char **name, loom_buf *args,
                               const char *gen)
{
    c->id = *id ? *id : strdup(gen);
    c->name = *name;
    *id = *name = NULL;
    c->arguments = args->len ? loom_buf_detach(args) : strdup("{}");
    if (!c->id || !c->arguments)
        return loom__llm_answer_fail(a, loom__error_oom());
    return 0;
}

int loom__llm_answer_close(loom__llm_answer *a)
{
    loom_llm_event ev = {0};
    int rc;

    if (a->has_usage) {
        ev.type = LOOM_LLM_USAGE;
        ev.usage = a->usage;
        if ((rc = loom__llm_answer_emit(a, &ev)) != 0)
            return rc;
    }
    if (a->calls_len) {
        memset(&ev, 0, sizeof(ev));
        ev.type = LOOM_LLM_TOOL_CALLS;
        ev.calls = a->calls;
        ev.calls_len = a->calls_len;
        if ((rc = loom__llm_answer_emit(a, &ev)) != 0)
            return rc;
    }
    if (a->finish_reason) {
        memset(&ev, 0, sizeof(ev));
        ev.type = LOOM_LLM_FINISH;
        ev.finish_reason = a->finish_reason;
        if ((rc = loom__llm_answer_emit(a, &ev)) != 0)
            return rc;
    }
    return 0;
}

int loom__llm_answer_cut(loom__llm_answer *a, const char *what)
{
    static const char fmt[] = "stream ended before the %s was complete";
    char msg[sizeof(fmt) + 32];

    snprintf(msg, sizeof(msg), fmt, what);
    if (loom__llm_error_set(&a->error, LOOM_UPSTREAM_CONNECTION, 0, msg,
                            strlen(msg), NULL, NULL))
        return loom__llm_answer_fail(a, loom__error_oom());
    return loom__llm_answer_fail(
        a, loom__error_set(LOOM_EUPSTREAM, "%s", a->error.message));
}

int loom__llm_answer_feed(void *d, const char *data, size_t len)
{
    loom__llm_answer *a = d;
    int rc;

    if (a->failed)
        return a->failed;
    if (a->ended)
        return 0; /* nothing after the end belongs to the answer */
    rc = loom_sse_parser_feed(a->sse, data, len);
    if (rc && !a->failed) { /* the SSE parser's own limit */
        if (rc == LOOM_ETOOLARGE && a->kind->sse_limit_msg)
            rc = loom__error_set(rc, "%s", a->kind->sse_limit_msg);
        a->failed = rc;
    }
    return rc;
}

int loom__llm_answer_finish(void *d)
{
    loom__llm_answer *a = d;
    int rc;

    if (a->failed)
        return a->failed;
    if (a->ended)
        return 0;
    if ((rc = loom_sse_parser_finish(a->sse)) != 0) {
        if (!a->failed)
            a->failed = rc;
        return rc;
    }
    if (a->ended)
        return 0;
    if (a->kind->end)
        return a->kind->end(d);
    if (a->finish_reason && a->kind->close)
        return a->kind->close(d);
    return loom__llm_answer_cut(a, a->kind->cut_what);
}

int loom__llm_answer_complete(void *d, const char *body, size_t len)
{
    loom__llm_answer *a = d;
    json_t *o;
    int rc;

    if (a->failed)
        return a->failed;
    if (a->ended)
        return 0;
    if (a->kind->complete_text &&
        (rc = a->kind->complete_text(d, body, len)) != LOOM__ANSWER_DECLINED)
        return rc;
    o = json_loadb(body, len, 0, NULL);
    if (json_is_object(o) || (a->kind->arrays && json_is_array(o)))
        rc = a->kind->complete(d, o, body, len);
    else
        rc = loom__llm_answer_bad_json(a, "answer", body, len);
    json_decref(o);
    return rc;
}

void loom__llm_answer_free(void *d)
{
    loom__llm_answer *a = d;

    if (!a)
        return;
    a->kind->release(d);
    loom__llm_answer_clear(a);
    free(a);
}

int loom__llm_answer_output_started(const void *d)
{
    return ((const loom__llm_answer *)d)->output_started;
}

int loom__llm_answer_done(const void *d)
{
    return ((const loom__llm_answer *)d)->ended;
}

const loom_upstream_error *loom__llm_answer_error_of(const void *d)
{
    return &((const loom__llm_answer *)d)->error;
}

int loom__llm_answer_export(void *d, loom_llm_response *resp)
{
    loom__llm_answer *a = d;
    char *text = loom_buf_detach(&a->text);

    if (!text)
        return loom__error_oom();
    free(resp->text);
    resp->text = text;
    free(resp->reasoning);
    resp->reasoning = NULL;
    if (a->has_reasoning && !(resp->reasoning = loom_buf_detach(&a->reasoning)))
        return loom__error_oom();
    resp->usage = a->usage;
    free(resp->finish_reason);
    resp->finish_reason = a->finish_reason;
    a->finish_reason = NULL;
    free(resp->response_id);
    resp->response_id = a->response_id;
    a->response_id = NULL;
    resp->output_started = a->output_started;
    for (size_t i = 0; i < resp->tool_calls_len; i++)
        loom_tool_call_clear(&resp->tool_calls[i]);
    free(resp->tool_calls);
    resp->tool_calls = NULL;
    resp->tool_calls_len = 0;
    free(resp->provider_state);
    resp->provider_state = NULL;
    if (a->ended && !a->failed) {
        resp->tool_calls = a->calls;
        resp->tool_calls_len = a->calls_len;
        a->calls = NULL;
        a->calls_len = 0;
        resp->provider_state = a->state;
        a->state = NULL;
    }
    return 0;
}

long loom__llm_count_int(json_int_t i)
{
    return i < 0                          ? 0
           : i > LOOM_LLM_MAX_TOKEN_COUNT ? LOOM_LLM_MAX_TOKEN_COUNT
                                          : (long)i;
}

long loom__llm_count_real(double r)
{
    /* NaN fails both comparisons and lands on 0. */
    return r >= 1.0 ? r < (double)LOOM_LLM_MAX_TOKEN_COUNT
                          ? (long)r
                          : LOOM_LLM_MAX_TOKEN_COUNT
                    : 0;
}

long loom__llm_count(const json_t *v)
{
    if (json_is_integer(v))
        return loom__llm_count_int(json_integer_value(v));
    if (json_is_real(v))
        return loom__llm_count_real(json_real_value(v));
    return 0;
}
