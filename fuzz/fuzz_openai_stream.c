/*
 * libFuzzer target for the OpenAI Chat Completions answer decoder
 * (llm/openai.h). The first input byte picks a split point, small limits
 * (so the limit paths are reached often) and sometimes an event after
 * which the callback cancels; the rest is the body. It is decoded four
 * times, with the checks every decoder target shares (fuzz_answer.h): as
 * a stream fed whole, as a stream fed in two pieces, as a non-streamed
 * answer, and here also as a stream with the jansson reference path
 * forced, which must decode exactly as the jsmn fast path does. Built only
 * with -DLOOM_FUZZ=ON and clang; tests/unit/test_fuzz_corpus.c includes
 * this file with LOOM_FUZZ_NO_ENTRY defined to replay the corpus.
 */
#include "fuzz_answer.h"
#include "llm/openai.h"

/* c->variant forces the jansson reference path. */
static int fan_openai_new(void **out, const fan_ctl *c, loom_llm_event_cb cb,
                          void *payload)
{
    const loom__openai_limits lim = {
        .max_tool_calls = c->max_tool_calls,
        .max_args = c->max_args,
        .max_text = c->max_text,
    };
    loom__openai_decoder *d = NULL;
    int rc = loom__openai_decoder_new(&d, &lim, cb, payload);

    if (d)
        loom__openai_decoder_set_jansson_only(d, c->variant);
    *out = d;
    return rc;
}

static int fuzz_openai_stream_one(const uint8_t *data, size_t size)
{
    fan_ctl c;
    fan_state whole, ref;
    int rc1, rc3;

    if (!fan_ctl_read(&c, data, size))
        return 0;
    rc1 = fan_run(fan_openai_new, &c, &whole);
    /* The fast path must decode exactly as the jansson reference does. */
    c.variant = 1;
    fan_state_init(&ref, c.cancel_at);
    rc3 = fan_stream(fan_openai_new, &c, c.len, &ref);
    if (rc1 != rc3 || whole.count != ref.count || whole.hash != ref.hash)
        abort();
    return 0;
}

#ifndef LOOM_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_openai_stream_one(data, size);
}
#endif
