/*
 * libFuzzer target for the Anthropic Messages answer decoder
 * (llm/anthropic.h), through the checks every decoder target shares
 * (fuzz_answer.h: a control byte, then the body decoded as a stream fed
 * whole, fed split, and as a whole message object). The control byte
 * also picks small limits of content blocks and of kept signatures, so
 * those limit paths are reached too, and how the request used the
 * structured-answer tool (LOOM__ANTHROPIC_ANSWER_*). Built only with
 * -DLOOM_FUZZ=ON and clang; tests/unit/test_fuzz_corpus.c includes this file
 * with LOOM_FUZZ_NO_ENTRY defined to replay the corpus.
 */
#include "fuzz_answer.h"
#include "llm/anthropic.h"

static int fan_anthropic_new(void **out, const fan_ctl *c, loom_llm_event_cb cb,
                             void *payload)
{
    const loom__anthropic_limits lim = {
        .max_tool_calls = c->max_tool_calls,
        .max_args = c->max_args,
        .max_text = c->max_text,
        .max_blocks = 2 + (size_t)(c->b & 7),
        .max_state = 16 + (size_t)(c->b >> 4) * 64,
    };
    loom__anthropic_decoder *d = NULL;
    int rc = loom__anthropic_decoder_new(&d, &lim, cb, payload);

    /* How the request used the structured-answer tool: none, forced or
     * beside the run's tools. */
    if (d)
        loom__anthropic_decoder_set_answer(d, ((c->b >> 3) + 2) % 3);
    *out = d;
    return rc;
}

static int fuzz_anthropic_stream_one(const uint8_t *data, size_t size)
{
    return fan_one(fan_anthropic_new, data, size);
}

#ifndef LOOM_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_anthropic_stream_one(data, size);
}
#endif
