/*
 * The first-byte and idle timeouts of every provider adapter (openai,
 * anthropic, gemini, openai-responses), one table row each, against
 * loom-fake-upstream: an answer that never starts ends in a timeout after
 * first_byte_timeout_ms and is not retried (a slow model is not a failed
 * one); a stream that stops after its first text delta ends in an idle
 * timeout that keeps the text that came. The fake exits cleanly after
 * both. Time checks are lower bounds only.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "fake.h"
#include "loom/llm.h"
#include "provider_harness.h"
#include "testutil.h"

#include <stdio.h>
#include <string.h>

/* One adapter: how provider_start() names it, and after how many chunks
 * of its wire format the stream of text ["a", "b"] has sent "a" only. */
typedef struct {
    const char *name, *kind, *api_key, *model;
    int chunks_through_a;
} adapter;

static const adapter adapters[] = {
    {"openai", "openai", "sk-test", "gpt-test", 2},
    {"claude", "anthropic", "sk-ant-test", "claude-test", 4},
    {"gem", "gemini", "gk-test", "gemini-test", 1},
    {"oai", "openai-responses", "sk-test", "gpt-test", 5},
};

static provider_ctx *start(const adapter *a, const char *script)
{
    loom_fake *f = fake_start_script(script);

    assert_non_null(f);
    return provider_start(f, NULL, a->name, a->kind, a->api_key, NULL, a->model,
                          2);
}

static void test_first_byte_timeout(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(adapters) / sizeof(adapters[0]); i++) {
        provider_ctx *c = start(&adapters[i], "{\"responses\":[{\"hang\":"
                                              "true},{\"text\":[\"ok\"]}]}");
        long long t0;

        print_message("%s\n", adapters[i].kind);
        c->cfg.first_byte_timeout_ms = 300;
        provider_reconfigure(c);
        t0 = test_now_ms();
        assert_int_equal(provider_run(c, NULL), LOOM_ETIMEDOUT);
        assert_true(test_now_ms() - t0 >= 290);
        assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_TIMEOUT);
        assert_non_null(strstr(loom_error_last(), "first-byte timeout"));
        /* a slow model is not retried */
        assert_int_equal(fake_request_count(c->fake), 1);
        assert_int_equal(provider_stop(c), 0);
    }
}

static void test_idle_timeout(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(adapters) / sizeof(adapters[0]); i++) {
        char script[160];
        provider_ctx *c;
        long long t0;

        print_message("%s\n", adapters[i].kind);
        snprintf(script, sizeof(script),
                 "{\"responses\":[{\"text\":[\"a\",\"b\"],\"hang\":true,"
                 "\"hang_after_chunks\":%d}]}",
                 adapters[i].chunks_through_a);
        c = start(&adapters[i], script);
        c->cfg.idle_timeout_ms = 300;
        provider_reconfigure(c);
        t0 = test_now_ms();
        assert_int_equal(provider_run(c, NULL), LOOM_ETIMEDOUT);
        assert_true(test_now_ms() - t0 >= 290);
        assert_int_equal(c->resp.error.kind, LOOM_UPSTREAM_TIMEOUT);
        assert_non_null(strstr(loom_error_last(), "idle timeout"));
        assert_string_equal(c->resp.text, "a");
        assert_int_equal(fake_request_count(c->fake), 1);
        assert_int_equal(provider_stop(c), 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_first_byte_timeout),
        cmocka_unit_test(test_idle_timeout),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
