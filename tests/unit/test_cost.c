/*
 * Tests of cost arithmetic (loom_cost_compute in include/loom/router.h)
 * against amounts computed by hand: plain, cached and cache-write input,
 * reasoning billed at its own price or at the output price, rounding
 * half up once per call (not per kind), parts larger than their wholes,
 * negative counts, counts in the trillions without overflow and the
 * overflow that is refused. The hand computations are in the comments:
 * tokens * dollars per million tokens = micro-dollars.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "loom/router.h"

#include <limits.h>
#include <string.h>

/* Prices from dollar amounts in micro-dollars per million tokens; -1
 * leaves an optional price unset. */
static loom_model_prices prices(int64_t in, int64_t cached, int64_t write,
                                int64_t out, int64_t reasoning)
{
    loom_model_prices p;

    p.set = 1;
    p.input = in;
    p.cached_input = cached;
    p.cache_write = write;
    p.output = out;
    p.reasoning = reasoning;
    return p;
}

static loom_usage usage(long prompt, long cached, long written,
                        long completion, long reasoning)
{
    loom_usage u;

    memset(&u, 0, sizeof(u));
    u.prompt_tokens = prompt;
    u.cached_tokens = cached;
    u.cache_write_tokens = written;
    u.completion_tokens = completion;
    u.reasoning_tokens = reasoning;
    u.total_tokens = prompt + completion;
    return u;
}

typedef struct {
    const char *what;
    loom_model_prices p;
    loom_usage u;
    int64_t want; /* micro-dollars */
} cost_case;

static void test_hand_computed(void **state)
{
    /* gpt-4o-mini: $0.15 in, $0.075 cached, $0.60 out. */
    const loom_model_prices mini = prices(150000, 75000, -1, 600000, -1);
    /* Claude Sonnet: $3 in, $0.30 cache read, $3.75 cache write, $15 out. */
    const loom_model_prices sonnet =
        prices(3000000, 300000, 3750000, 15000000, -1);
    /* A reasoning model with a reasoning price of its own: $1.10 in,
     * $4.40 out, $8 reasoning. */
    const loom_model_prices thinker = prices(1100000, -1, -1, 4400000, 8000000);
    /* One micro-dollar per million tokens, to see rounding. */
    const loom_model_prices tiny = prices(1, -1, -1, 1, -1);
    const cost_case cases[] = {
        /* 1000 * 0.15 + 500 * 0.60 = 150 + 300 */
        {"plain", mini, usage(1000, 0, 0, 500, 0), 450},
        /* (10000 - 4000) * 0.15 + 4000 * 0.075 + 2000 * 0.60
         * = 900 + 300 + 1200 */
        {"cached input", mini, usage(10000, 4000, 0, 2000, 0), 2400},
        /* Reasoning without its own price is output:
         * 100 * 0.15 + 200 * 0.60 = 15 + 120 */
        {"reasoning at output", mini, usage(100, 0, 0, 200, 150), 135},
        /* (10000 - 6000 - 2000) * 3 + 6000 * 0.30 + 2000 * 3.75
         * + 1000 * 15 = 6000 + 1800 + 7500 + 15000 */
        {"cache read and write", sonnet, usage(10000, 6000, 2000, 1000, 0),
         30300},
        /* 1234 * 1.10 + (5678 - 4000) * 4.40 + 4000 * 8
         * = 1357.4 + 7383.2 + 32000 = 40740.6, rounded up */
        {"reasoning price", thinker, usage(1234, 0, 0, 5678, 4000), 40741},
        /* Unset cached and write prices bill at input:
         * 1000 * 1.10 = 1100 */
        {"cached at input price", thinker, usage(1000, 500, 300, 0, 0), 1100},
        /* 0.5 micro-dollars rounds up; 0.499999 down. */
        {"half rounds up", tiny, usage(500000, 0, 0, 0, 0), 1},
        {"below half rounds down", tiny, usage(499999, 0, 0, 0, 0), 0},
        /* Rounded once per call: 0.4 + 0.1 = 0.5 -> 1 (per kind it
         * would be 0 + 0). */
        {"one rounding per call", tiny, usage(400000, 0, 0, 100000, 0), 1},
        /* 1,500,000 * 0.000001 = 1.5 -> 2 */
        {"whole and half", tiny, usage(1500000, 0, 0, 0, 0), 2},
        /* Parts larger than their wholes are cut: all 1000 prompt tokens
         * cached, all 100 completion tokens reasoning:
         * 1000 * 0.075 + 100 * 0.60 = 75 + 60 */
        {"parts cut to wholes", mini, usage(1000, 2000, 0, 100, 900), 135},
        /* Cache writes fit in what the cache reads left:
         * 1000 prompt = 800 cached + 200 written:
         * 800 * 0.30 + 200 * 3.75 = 240 + 750 */
        {"writes cut to the rest", sonnet, usage(1000, 800, 500, 0, 0), 990},
        /* Negative counts are nothing. */
        {"negative", mini, usage(-5, -1, -1, -7, -2), 0},
        {"nothing", mini, usage(0, 0, 0, 0, 0), 0},
        /* Free models cost 0, known. */
        {"free", prices(0, -1, -1, 0, -1), usage(123456, 0, 0, 654321, 0), 0},
        /* A trillion tokens at the highest price, $1,000,000 per million
         * tokens: 1e12 / 1e6 * 1e12 = 1e18 micro-dollars, exactly. */
        {"a trillion tokens", prices(LOOM_PRICE_MAX_MICROS, -1, -1, 0, -1),
         usage(1000000000000L, 0, 0, 0, 0), 1000000000000000000LL},
        /* LONG_MAX tokens at $0.000001: 9223372036854.775807 -> ...855 */
        {"LONG_MAX tokens", tiny, usage(LONG_MAX, 0, 0, 0, 0),
         9223372036855LL},
        /* Odd amounts: 333,333 * 0.000003 + 7 * 0.142857
         * = 0.999999 + 0.999999 = 1.999998 -> 2 */
        {"odd amounts", prices(3, -1, -1, 142857, -1),
         usage(333333, 0, 0, 7, 0), 2},
    };
    int64_t got;

    (void)state;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        got = -1;
        if (loom_cost_compute(&got, &cases[i].u, &cases[i].p) != 0)
            fail_msg("%s: %s", cases[i].what, loom_error_last());
        if (got != cases[i].want)
            fail_msg("%s: %lld micro-dollars, want %lld", cases[i].what,
                     (long long)got, (long long)cases[i].want);
    }
}

static void test_errors(void **state)
{
    loom_model_prices none, max = prices(LOOM_PRICE_MAX_MICROS, -1, -1,
                                         LOOM_PRICE_MAX_MICROS, -1);
    loom_usage u = usage(1000, 0, 0, 0, 0);
    int64_t got = 5;

    (void)state;
    memset(&none, 0, sizeof(none));
    /* No prices: the cost is unknown, not zero. */
    assert_int_equal(loom_cost_compute(&got, &u, &none), LOOM_ENOTFOUND);
    assert_int_equal(got, 0);
    assert_int_equal(loom_cost_compute(NULL, &u, &max), LOOM_EINVALID);
    assert_int_equal(loom_cost_compute(&got, NULL, &max), LOOM_EINVALID);
    assert_int_equal(loom_cost_compute(&got, &u, NULL), LOOM_EINVALID);

    /* Just inside 63 bits: 9,000,000 whole millions of tokens at the
     * highest price = 9e18 micro-dollars. */
    u = usage(9000000000000L, 0, 0, 0, 0);
    assert_int_equal(loom_cost_compute(&got, &u, &max), 0);
    assert_true(got == 9000000000000000000LL);
    /* Past it: refused, not wrapped. */
    u = usage(9300000000000L, 0, 0, 0, 0);
    got = 5;
    assert_int_equal(loom_cost_compute(&got, &u, &max), LOOM_ETOOLARGE);
    assert_int_equal(got, 0);
    assert_non_null(strstr(loom_error_last(), "63 bits"));
    /* Two kinds that each fit but not together. */
    u = usage(5000000000000L, 0, 0, 5000000000000L, 0);
    assert_int_equal(loom_cost_compute(&got, &u, &max), LOOM_ETOOLARGE);
    u = usage(LONG_MAX, 0, 0, 0, 0);
    assert_int_equal(loom_cost_compute(&got, &u, &max), LOOM_ETOOLARGE);
}

/* A run's total is the sum of its calls, with no drift: a million calls
 * of 0.5 micro-dollars would be 500,000 in exact arithmetic and each
 * rounds to 1, while summing costs kept as doubles of dollars drifts. */
static void test_sums_exact(void **state)
{
    const loom_model_prices mini = prices(150000, 75000, -1, 600000, -1);
    loom_usage total, call = usage(1234, 567, 0, 89, 0);
    int64_t one = 0;
    double dollars = 0;

    (void)state;
    memset(&total, 0, sizeof(total));
    /* (1234 - 567) * 0.15 + 567 * 0.075 + 89 * 0.60
     * = 100.05 + 42.525 + 53.4 = 195.975 -> 196 */
    assert_int_equal(loom_cost_compute(&one, &call, &mini), 0);
    assert_int_equal(one, 196);
    call.cost_micros = one;
    for (int i = 0; i < 1000000; i++) {
        loom_usage_add(&total, &call);
        dollars += (double)one / 1e6;
    }
    assert_true(total.cost_micros == 196000000LL);
    assert_int_equal(total.prompt_tokens, 1234000000L);
    assert_int_equal(total.cached_tokens, 567000000L);
    /* The double sum is not exact (what the integers avoid). */
    assert_true(dollars != 196.0);

    /* loom_usage_add adds the new fields too. */
    memset(&total, 0, sizeof(total));
    call = usage(10, 1, 2, 3, 1);
    call.cost_micros = 7;
    loom_usage_add(&total, &call);
    loom_usage_add(&total, &call);
    assert_int_equal(total.cache_write_tokens, 4);
    assert_true(total.cost_micros == 14);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_computed),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_sums_exact),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
