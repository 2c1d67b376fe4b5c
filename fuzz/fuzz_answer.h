/*
 * The checks every answer-decoder fuzz target shares (fuzz_openai_stream,
 * fuzz_anthropic_stream, fuzz_gemini_stream, fuzz_responses_stream). The
 * decoders all embed a loom__llm_answer (llm/answer.h) and keep its
 * rules, so one harness checks them: the first input byte picks a split
 * point, small limits (so the limit paths are reached often) and
 * sometimes an event after which the callback cancels; the rest is the
 * body. It is decoded as a stream fed whole, as a stream fed in two
 * pieces (the two must give the same events and result) and as a whole
 * non-streamed body. Every run checks the event order (TEXT, REASONING
 * and TOOL_CALL_DELTA before USAGE, TOOL_CALLS and FINISH, each of those
 * at most once and in that order, nothing after FINISH, an error or a
 * cancel) and what the decoder hands over (the text is exactly the TEXT
 * deltas, the reasoning exactly the REASONING ones, no tool calls nor
 * provider_state from an answer that failed). A broken rule aborts, so
 * it shows up like a sanitizer report. A target supplies how to make its
 * decoder; tests/unit/test_fuzz_corpus.c includes every target, and so
 * this file, into one program.
 */
#ifndef LOOM_FUZZ_ANSWER_H
#define LOOM_FUZZ_ANSWER_H

#include "llm/answer.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FAN_FNV_BASIS 14695981039346656037ULL
#define FAN_FNV_PRIME 1099511628211ULL

typedef struct {
    uint64_t hash;      /* every event, field borders included */
    uint64_t text_hash; /* TEXT deltas as one string */
    uint64_t reasoning_hash;
    size_t count;
    int reasoning_seen;
    int nusage, ncalls_events, nfinish, nerror;
    size_t calls_len; /* of the TOOL_CALLS event */
    int closing;      /* USAGE or TOOL_CALLS was seen */
    int closed;       /* FINISH, ERROR or a cancel was seen */
    long cancel_at;   /* event number the callback refuses; -1 never */
    int canceled;
} fan_state;

/* What the control byte says. */
typedef struct {
    unsigned char b;
    const char *body; /* the rest of the input */
    size_t len;
    size_t cut;     /* where the split feed splits */
    long cancel_at; /* -1: never */
    /* Small limits every decoder has, for its limits struct; the target
     * derives its own ones from b. */
    size_t max_tool_calls, max_args, max_text;
    int variant; /* a target's second way of decoding; 0 in fan_run */
} fan_ctl;

/*
 * Makes a decoder (*out, freed with loom__llm_answer_free) whose events
 * go to cb with payload, with the limits and options c says. Returns 0
 * or LOOM_ENOMEM.
 */
typedef int (*fan_new_fn)(void **out, const fan_ctl *c, loom_llm_event_cb cb,
                          void *payload);

static void fan_mix(uint64_t *h, const void *p, size_t len, int border)
{
    const unsigned char *s = p;

    for (size_t i = 0; i < len; i++)
        *h = (*h ^ s[i]) * FAN_FNV_PRIME;
    if (border)
        *h = (*h ^ len) * FAN_FNV_PRIME;
}

static void fan_mix_str(uint64_t *h, const char *s)
{
    if (s)
        fan_mix(h, s, strlen(s), 1);
    else
        fan_mix(h, "", 0, 1);
}

/* Reads the control byte of data; 0 when there is none. */
static int fan_ctl_read(fan_ctl *c, const uint8_t *data, size_t size)
{
    memset(c, 0, sizeof(*c));
    if (size < 1)
        return 0;
    c->b = data[0];
    c->body = (const char *)data + 1;
    c->len = size - 1;
    c->cut = c->len ? (size_t)c->b % (c->len + 1) : 0;
    c->max_tool_calls = 1 + (c->b & 3);
    c->max_args = 4 + (size_t)((c->b >> 2) & 7) * 16;
    c->max_text = 8 + (size_t)(c->b >> 5) * 96;
    /* One input in five cancels at an event between 1 and 8. */
    c->cancel_at = c->b % 5 == 4 ? 1 + (c->b >> 3) % 8 : -1;
    return 1;
}

static int fan_on_event(const loom_llm_event *ev, void *payload)
{
    fan_state *st = payload;
    int type = (int)ev->type;

    if (st->closed)
        abort(); /* nothing may follow FINISH, ERROR or a cancel */
    st->count++;
    fan_mix(&st->hash, &type, sizeof(type), 1);
    switch (ev->type) {
    case LOOM_LLM_TEXT:
    case LOOM_LLM_REASONING:
        if (st->closing || !ev->text || ev->text_len == 0)
            abort();
        fan_mix(&st->hash, ev->text, ev->text_len, 1);
        if (ev->type == LOOM_LLM_TEXT) {
            fan_mix(&st->text_hash, ev->text, ev->text_len, 0);
        } else {
            fan_mix(&st->reasoning_hash, ev->text, ev->text_len, 0);
            st->reasoning_seen = 1;
        }
        break;
    case LOOM_LLM_TOOL_CALL_DELTA:
        if (st->closing || !ev->args_delta || ev->tool_index < 0)
            abort();
        fan_mix(&st->hash, &ev->tool_index, sizeof(ev->tool_index), 1);
        fan_mix_str(&st->hash, ev->tool_id);
        fan_mix_str(&st->hash, ev->tool_name);
        fan_mix_str(&st->hash, ev->args_delta);
        break;
    case LOOM_LLM_TOOL_CALLS:
        if (st->ncalls_events++ || st->nfinish || !ev->calls ||
            ev->calls_len == 0)
            abort();
        st->closing = 1;
        st->calls_len = ev->calls_len;
        for (size_t i = 0; i < ev->calls_len; i++) {
            const loom_tool_call *c = &ev->calls[i];
            if (!c->id || !c->name || !c->arguments)
                abort();
            fan_mix_str(&st->hash, c->id);
            fan_mix_str(&st->hash, c->name);
            fan_mix_str(&st->hash, c->arguments);
        }
        break;
    case LOOM_LLM_USAGE:
        if (st->nusage++ || st->ncalls_events)
            abort();
        st->closing = 1;
        fan_mix(&st->hash, &ev->usage, sizeof(ev->usage), 1);
        break;
    case LOOM_LLM_FINISH:
        if (st->nfinish++ || !ev->finish_reason)
            abort();
        fan_mix_str(&st->hash, ev->finish_reason);
        st->closed = 1;
        break;
    case LOOM_LLM_ERROR:
        if (st->nerror++ || !ev->error_message)
            abort();
        fan_mix_str(&st->hash, ev->error_message);
        fan_mix(&st->hash, &ev->error_code, sizeof(ev->error_code), 1);
        st->closed = 1;
        break;
    default:
        abort();
    }
    if (st->cancel_at >= 0 && (long)st->count == st->cancel_at &&
        ev->type != LOOM_LLM_ERROR) {
        st->canceled = 1;
        st->closed = 1;
        return 1;
    }
    return 0;
}

static void fan_state_init(fan_state *st, long cancel_at)
{
    memset(st, 0, sizeof(*st));
    st->hash = st->text_hash = st->reasoning_hash = FAN_FNV_BASIS;
    st->cancel_at = cancel_at;
}

/* Checks what decoder d hands over, after rc, against what it emitted. */
static void fan_check_result(void *d, const fan_state *st, int rc)
{
    loom_llm_response resp;
    uint64_t h = FAN_FNV_BASIS;

    memset(&resp, 0, sizeof(resp));
    if (st->canceled && rc != LOOM_ECANCELED)
        abort();
    if (rc == 0 && !loom__llm_answer_done(d))
        abort();
    if (rc == LOOM_EUPSTREAM && !loom__llm_answer_error_of(d)->message)
        abort();
    if (loom__llm_answer_output_started(d) !=
        (st->count >
         (size_t)(st->nusage + st->ncalls_events + st->nfinish + st->nerror)))
        abort(); /* output started exactly when a delta was passed on */
    if (loom__llm_answer_export(d, &resp) != 0)
        abort();
    if (!resp.text)
        abort();
    fan_mix(&h, resp.text, strlen(resp.text), 0);
    if (h != st->text_hash)
        abort(); /* the text is exactly the joined TEXT deltas */
    if ((resp.reasoning != NULL) != st->reasoning_seen)
        abort();
    if (resp.reasoning) {
        h = FAN_FNV_BASIS;
        fan_mix(&h, resp.reasoning, strlen(resp.reasoning), 0);
        if (h != st->reasoning_hash)
            abort();
    }
    if (rc != 0 && (resp.tool_calls_len || resp.provider_state))
        abort(); /* partial calls must never be handed over */
    if (rc == 0 && resp.tool_calls_len != st->calls_len)
        abort();
    for (size_t i = 0; i < resp.tool_calls_len; i++)
        if (!resp.tool_calls[i].id || !resp.tool_calls[i].name ||
            !resp.tool_calls[i].arguments)
            abort();
    loom_llm_response_clear(&resp);
}

/* Decodes c's body as a stream fed in two pieces at cut (c->len: whole);
 * returns the result. */
static int fan_stream(fan_new_fn make, const fan_ctl *c, size_t cut,
                      fan_state *st)
{
    void *d = NULL;
    int rc;

    if (make(&d, c, fan_on_event, st) != 0)
        abort();
    rc = loom__llm_answer_feed(d, c->body, cut);
    if (!rc)
        rc = loom__llm_answer_feed(d, c->body + cut, c->len - cut);
    if (!rc)
        rc = loom__llm_answer_finish(d);
    /* A finished or failed decoder keeps its answer. */
    if (loom__llm_answer_finish(d) != rc)
        abort();
    fan_check_result(d, st, rc);
    loom__llm_answer_free(d);
    return rc;
}

/* Decodes c's body as a whole non-streamed body; returns the result. */
static int fan_complete(fan_new_fn make, const fan_ctl *c)
{
    void *d = NULL;
    fan_state st;
    int rc;

    fan_state_init(&st, c->cancel_at);
    if (make(&d, c, fan_on_event, &st) != 0)
        abort();
    rc = loom__llm_answer_complete(d, c->body, c->len);
    if (loom__llm_answer_complete(d, c->body, c->len) != rc)
        abort(); /* a failed or ended decoder keeps its answer */
    fan_check_result(d, &st, rc);
    loom__llm_answer_free(d);
    return rc;
}

/*
 * The whole check of one input as c says: the stream fed whole (into
 * *whole, whose result is returned), fed split at c->cut (the same events
 * and result), and the body decoded whole.
 */
static int fan_run(fan_new_fn make, const fan_ctl *c, fan_state *whole)
{
    fan_state split;
    int rc1, rc2;

    fan_state_init(whole, c->cancel_at);
    fan_state_init(&split, c->cancel_at);
    rc1 = fan_stream(make, c, c->len, whole);
    rc2 = fan_stream(make, c, c->cut, &split);
    if (rc1 != rc2 || whole->count != split.count || whole->hash != split.hash)
        abort();
    fan_complete(make, c);
    return rc1;
}

/* A target's whole entry: fan_run on data, its decoder made by make. */
static int fan_one(fan_new_fn make, const uint8_t *data, size_t size)
{
    fan_state st;
    fan_ctl c;

    if (fan_ctl_read(&c, data, size))
        fan_run(make, &c, &st);
    return 0;
}

#endif
