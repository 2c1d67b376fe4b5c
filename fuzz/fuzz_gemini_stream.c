/*
 * libFuzzer target for the Gemini answer decoder (llm/gemini.h), through
 * the checks every decoder target shares (fuzz_answer.h: a control byte,
 * then the body decoded as a stream fed whole, fed split, and as a whole
 * body, an object or an array of them). The control byte also picks a
 * small limit of the kept provider_state and the turn that numbers the
 * call ids the decoder makes. Built only with -DLOOM_FUZZ=ON and clang;
 * tests/unit/test_fuzz_corpus.c includes this file with
 * LOOM_FUZZ_NO_ENTRY defined to replay the corpus.
 */
#include "fuzz_answer.h"
#include "llm/gemini.h"

static int fan_gemini_new(void **out, const fan_ctl *c, loom_llm_event_cb cb,
                          void *payload)
{
    const loom__gemini_limits lim = {
        .max_tool_calls = c->max_tool_calls,
        .max_args = c->max_args,
        .max_text = c->max_text,
        .max_state = 16 + (size_t)(c->b >> 4) * 64,
    };
    long turn = c->b & 1 ? (long)c->b : 0x7fffffffL;
    loom__gemini_decoder *d = NULL;
    int rc = loom__gemini_decoder_new(&d, &lim, turn, cb, payload);

    *out = d;
    return rc;
}

static int fuzz_gemini_stream_one(const uint8_t *data, size_t size)
{
    return fan_one(fan_gemini_new, data, size);
}

#ifndef LOOM_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_gemini_stream_one(data, size);
}
#endif
