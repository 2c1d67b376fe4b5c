/*
 * libFuzzer target for the OpenAI Chat Completions answer decoder
 * (llm/openai.h). The first input byte picks a split point, small limits
 * (so the limit paths are reached often) and sometimes an event after
 * which the callback cancels; the rest is the body. It is decoded four
 * times: as a stream fed whole, as a stream fed in two pieces, the same
 * with the jansson reference path forced (it must agree), and as a
 * non-streamed answer. The two stream runs must give the same events and
 * result, the events must keep the documented order (USAGE, TOOL_CALLS
 * and FINISH at most once, nothing after FINISH, an error or a cancel),
 * and the exported response must hold exactly the text that was emitted.
 * A broken rule aborts, so it shows up like a sanitizer report. Built only
 * with -DLOOM_FUZZ=ON and clang; tests/unit/test_fuzz_corpus.c includes
 * this file with LOOM_FUZZ_NO_ENTRY defined to replay the corpus.
 */
#include "llm/openai.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FOS_FNV_BASIS 14695981039346656037ULL
#define FOS_FNV_PRIME 1099511628211ULL

typedef struct {
    uint64_t hash;      /* every event, field borders included */
    uint64_t text_hash; /* TEXT deltas as one string */
    uint64_t reasoning_hash;
    size_t count;
    int reasoning_seen;
    int nusage, ncalls_events, nfinish, nerror;
    size_t calls_len;   /* of the TOOL_CALLS event */
    int closing;        /* USAGE or TOOL_CALLS was seen */
    int closed;         /* FINISH, ERROR or a cancel was seen */
    long cancel_at;     /* event number the callback refuses; -1 never */
    int canceled;
} fos_state;

static void fos_mix(uint64_t *h, const void *p, size_t len, int border)
{
    const unsigned char *s = p;

    for (size_t i = 0; i < len; i++)
        *h = (*h ^ s[i]) * FOS_FNV_PRIME;
    if (border)
        *h = (*h ^ len) * FOS_FNV_PRIME;
}

static void fos_mix_str(uint64_t *h, const char *s)
{
    if (s)
        fos_mix(h, s, strlen(s), 1);
    else
        fos_mix(h, "", 0, 1);
}

static int fos_on_event(const loom_llm_event *ev, void *payload)
{
    fos_state *st = payload;
    int type = (int)ev->type;

    if (st->closed)
        abort(); /* nothing may follow FINISH, ERROR or a cancel */
    st->count++;
    fos_mix(&st->hash, &type, sizeof(type), 1);
    switch (ev->type) {
    case LOOM_LLM_TEXT:
    case LOOM_LLM_REASONING:
        if (st->closing || !ev->text || ev->text_len == 0)
            abort();
        fos_mix(&st->hash, ev->text, ev->text_len, 1);
        if (ev->type == LOOM_LLM_TEXT) {
            fos_mix(&st->text_hash, ev->text, ev->text_len, 0);
        } else {
            fos_mix(&st->reasoning_hash, ev->text, ev->text_len, 0);
            st->reasoning_seen = 1;
        }
        break;
    case LOOM_LLM_TOOL_CALL_DELTA:
        if (st->closing || !ev->args_delta || ev->tool_index < 0)
            abort();
        fos_mix(&st->hash, &ev->tool_index, sizeof(ev->tool_index), 1);
        fos_mix_str(&st->hash, ev->tool_id);
        fos_mix_str(&st->hash, ev->tool_name);
        fos_mix_str(&st->hash, ev->args_delta);
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
            fos_mix_str(&st->hash, c->id);
            fos_mix_str(&st->hash, c->name);
            fos_mix_str(&st->hash, c->arguments);
        }
        break;
    case LOOM_LLM_USAGE:
        if (st->nusage++ || st->ncalls_events)
            abort();
        st->closing = 1;
        fos_mix(&st->hash, &ev->usage, sizeof(ev->usage), 1);
        break;
    case LOOM_LLM_FINISH:
        if (st->nfinish++ || !ev->finish_reason)
            abort();
        fos_mix_str(&st->hash, ev->finish_reason);
        st->closed = 1;
        break;
    case LOOM_LLM_ERROR:
        if (st->nerror++ || !ev->error_message)
            abort();
        fos_mix_str(&st->hash, ev->error_message);
        fos_mix(&st->hash, &ev->error_code, sizeof(ev->error_code), 1);
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

static void fos_state_init(fos_state *st, long cancel_at)
{
    memset(st, 0, sizeof(*st));
    st->hash = st->text_hash = st->reasoning_hash = FOS_FNV_BASIS;
    st->cancel_at = cancel_at;
}

/* Checks what the decoder hands over against what it emitted. */
static void fos_check_result(loom__openai_decoder *d, const fos_state *st,
                             int rc)
{
    loom_llm_response resp;
    uint64_t h = FOS_FNV_BASIS;

    memset(&resp, 0, sizeof(resp));
    if (st->canceled && rc != LOOM_ECANCELED)
        abort();
    if (rc == 0 && !loom__openai_decoder_done(d))
        abort();
    if (rc == LOOM_EUPSTREAM && !loom__openai_decoder_error(d)->message)
        abort();
    if (loom__openai_decoder_export(d, &resp) != 0)
        abort();
    if (!resp.text)
        abort();
    fos_mix(&h, resp.text, strlen(resp.text), 0);
    if (h != st->text_hash)
        abort(); /* the text is exactly the joined TEXT deltas */
    if ((resp.reasoning != NULL) != st->reasoning_seen)
        abort();
    if (resp.reasoning) {
        h = FOS_FNV_BASIS;
        fos_mix(&h, resp.reasoning, strlen(resp.reasoning), 0);
        if (h != st->reasoning_hash)
            abort();
    }
    if (rc != 0 && resp.tool_calls_len)
        abort(); /* partial calls must never be handed over */
    if (rc == 0 && resp.tool_calls_len != st->calls_len)
        abort();
    for (size_t i = 0; i < resp.tool_calls_len; i++)
        if (!resp.tool_calls[i].id || !resp.tool_calls[i].name ||
            !resp.tool_calls[i].arguments)
            abort();
    loom_llm_response_clear(&resp);
}

/* Decodes s as a stream fed in two pieces at cut; returns the result.
 * jansson_only forces the reference path instead of the jsmn fast path. */
static int fos_stream(const loom__openai_limits *lim, const char *s,
                      size_t len, size_t cut, fos_state *st, int jansson_only)
{
    loom__openai_decoder *d = NULL;
    int rc;

    if (loom__openai_decoder_new(&d, lim, fos_on_event, st) != 0)
        abort();
    loom__openai_decoder_set_jansson_only(d, jansson_only);
    rc = loom__openai_decoder_feed(d, s, cut);
    if (!rc)
        rc = loom__openai_decoder_feed(d, s + cut, len - cut);
    if (!rc)
        rc = loom__openai_decoder_finish(d);
    /* A finished or failed decoder keeps its answer. */
    if (loom__openai_decoder_finish(d) != rc)
        abort();
    fos_check_result(d, st, rc);
    loom__openai_decoder_free(d);
    return rc;
}

static int fos_complete(const loom__openai_limits *lim, const char *s,
                        size_t len, long cancel_at)
{
    loom__openai_decoder *d = NULL;
    fos_state st;
    int rc;

    fos_state_init(&st, cancel_at);
    if (loom__openai_decoder_new(&d, lim, fos_on_event, &st) != 0)
        abort();
    rc = loom__openai_decoder_complete(d, s, len);
    fos_check_result(d, &st, rc);
    loom__openai_decoder_free(d);
    return rc;
}

static int fuzz_openai_stream_one(const uint8_t *data, size_t size)
{
    loom__openai_limits lim;
    const char *s;
    size_t len, cut;
    unsigned char b;
    long cancel_at;
    fos_state whole, split, ref;
    int rc1, rc2, rc3;

    if (size < 1)
        return 0;
    b = data[0];
    s = (const char *)data + 1;
    len = size - 1;
    cut = len ? (size_t)b % (len + 1) : 0;
    memset(&lim, 0, sizeof(lim));
    lim.max_tool_calls = 1 + (b & 3);
    lim.max_args = 4 + (size_t)((b >> 2) & 7) * 16;
    lim.max_text = 8 + (size_t)(b >> 5) * 96;
    /* One input in five cancels at an event between 1 and 8. */
    cancel_at = b % 5 == 4 ? 1 + (b >> 3) % 8 : -1;

    fos_state_init(&whole, cancel_at);
    fos_state_init(&split, cancel_at);
    fos_state_init(&ref, cancel_at);
    rc1 = fos_stream(&lim, s, len, len, &whole, 0);
    rc2 = fos_stream(&lim, s, len, cut, &split, 0);
    if (rc1 != rc2 || whole.count != split.count || whole.hash != split.hash)
        abort();
    /* The fast path must decode exactly as the jansson reference does. */
    rc3 = fos_stream(&lim, s, len, len, &ref, 1);
    if (rc1 != rc3 || whole.count != ref.count || whole.hash != ref.hash)
        abort();
    fos_complete(&lim, s, len, cancel_at);
    return 0;
}

#ifndef LOOM_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_openai_stream_one(data, size);
}
#endif
