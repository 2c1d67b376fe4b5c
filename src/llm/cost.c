/*
 * The cost of a model call, in integer micro-dollars (loom_cost_compute,
 * see loom/router.h).
 *
 * Prices are micro-dollars per million tokens, so tokens * price is in
 * units of 1e-12 dollars: exact, but large enough to overflow 64 bits for
 * absurd counts. Each product is therefore split as
 * (tokens / 1e6) * price + (tokens % 1e6) * price / 1e6: a whole number of
 * micro-dollars, checked for overflow, plus a remainder below one
 * micro-dollar kept in millionths. The remainders of every kind are
 * summed and the total rounded half up once, so a call's cost is the
 * exact amount to the nearest micro-dollar and a run's total (the sum of
 * its calls) has no drift at all. No floating point anywhere: a double
 * would turn 0.15 into 0.1499999... and lose cents over millions of calls.
 */
#include "loom/router.h"
#include "core/error.h"

#include <limits.h>
#include <string.h>

#define MILLION 1000000LL

typedef struct {
    int64_t micros; /* whole micro-dollars */
    int64_t rem;    /* millionths of a micro-dollar, 0 .. MILLION - 1 */
    int overflow;
} acc;

/* Adds tokens at price (micro-dollars per million tokens). */
static void acc_add(acc *a, long tokens, int64_t price)
{
    int64_t t = tokens, q, r, whole, part;

    if (t <= 0 || price <= 0 || a->overflow)
        return;
    q = t / MILLION;
    r = t % MILLION;
    /* r < 1e6 and price <= LOOM_PRICE_MAX_MICROS (1e12): r * price stays
     * below 1e18, inside 63 bits. Larger prices are not accepted by the
     * config; one given by hand is checked like the rest. */
    if (__builtin_mul_overflow(q, price, &whole) ||
        __builtin_mul_overflow(r, price, &part) ||
        __builtin_add_overflow(whole, part / MILLION, &whole) ||
        __builtin_add_overflow(a->micros, whole, &a->micros)) {
        a->overflow = 1;
        return;
    }
    a->rem += part % MILLION;
    if (a->rem >= MILLION) {
        a->rem -= MILLION;
        if (__builtin_add_overflow(a->micros, 1, &a->micros))
            a->overflow = 1;
    }
}

static long clamp(long v, long lo, long hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

int loom_cost_compute(int64_t *out, const loom_usage *u,
                      const loom_model_prices *p)
{
    long prompt, cached, written, completion, reasoning;
    acc a;

    if (out)
        *out = 0;
    if (!out || !u || !p)
        return loom__error_set(LOOM_EINVALID, "cost: NULL argument");
    if (!p->set)
        return loom__error_set(LOOM_ENOTFOUND,
                               "cost: the model has no prices");
    memset(&a, 0, sizeof(a));
    /* The parts are inside their wholes (prompt_tokens counts cached and
     * written tokens, completion_tokens counts reasoning): a server that
     * reports a part larger than its whole is not billed twice. */
    prompt = clamp(u->prompt_tokens, 0, LONG_MAX);
    cached = clamp(u->cached_tokens, 0, prompt);
    written = clamp(u->cache_write_tokens, 0, prompt - cached);
    completion = clamp(u->completion_tokens, 0, LONG_MAX);
    reasoning = clamp(u->reasoning_tokens, 0, completion);

    acc_add(&a, prompt - cached - written, p->input);
    acc_add(&a, cached, p->cached_input >= 0 ? p->cached_input : p->input);
    acc_add(&a, written, p->cache_write >= 0 ? p->cache_write : p->input);
    acc_add(&a, completion - reasoning, p->output);
    acc_add(&a, reasoning, p->reasoning >= 0 ? p->reasoning : p->output);
    if (!a.overflow && a.rem >= MILLION / 2 &&
        __builtin_add_overflow(a.micros, 1, &a.micros))
        a.overflow = 1;
    if (a.overflow)
        return loom__error_set(LOOM_ETOOLARGE,
                               "cost: the amount does not fit in 63 bits "
                               "of micro-dollars");
    *out = a.micros;
    return 0;
}
