/*
 * libFuzzer target for the OpenAI Responses answer decoder
 * (llm/responses.h), through the checks every decoder target shares
 * (fuzz_answer.h: a control byte, then the body decoded as a stream fed
 * whole, fed split, and as a whole response object). The control byte
 * also picks small limits of output items and of the kept reasoning
 * state, and whether the request asked the API to store the response
 * (which changes what provider_state keeps). Built only with
 * -DLOOM_FUZZ=ON and clang; tests/unit/test_fuzz_corpus.c includes this
 * file with LOOM_FUZZ_NO_ENTRY defined to replay the corpus.
 */
#include "fuzz_answer.h"
#include "llm/responses.h"

static int fan_responses_new(void **out, const fan_ctl *c, loom_llm_event_cb cb,
                             void *payload)
{
    const loom__responses_limits lim = {
        .max_tool_calls = c->max_tool_calls,
        .max_args = c->max_args,
        .max_text = c->max_text,
        .max_items = 2 + (size_t)(c->b & 7),
        .max_state = 16 + (size_t)(c->b >> 4) * 64,
    };
    loom__responses_decoder *d = NULL;
    int rc = loom__responses_decoder_new(&d, &lim, c->b & 1, cb, payload);

    *out = d;
    return rc;
}

static int fuzz_responses_stream_one(const uint8_t *data, size_t size)
{
    return fan_one(fan_responses_new, data, size);
}

#ifndef LOOM_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_responses_stream_one(data, size);
}
#endif
