/*
 * Unit tests of an event's text as the session's log writes it
 * (agent/events.h): loom__event_text must give the very bytes of the
 * compact dump of loom_event_to_json at 15 digits, which is what the log
 * held before, for every shape of event: plain and nested data, data
 * naming the envelope's keys, no run id or one that is not UTF-8, data
 * that is no object, reals, long strings, a key holding a NUL, and data
 * the dump refuses (a string that is not UTF-8).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "agent/events.h"
#include "core/utf8.h"

#include <stdlib.h>
#include <string.h>

/* Checks ev's text against the object's dump (or that both fail), then
 * drops data. */
static void assert_same(loom_event_type type, uint64_t seq, uint32_t index,
                        const char *run_id, json_t *data)
{
    loom_event ev = {type, seq, index, run_id, data};
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    json_t *o = loom_event_to_json(&ev);
    size_t len = 0;
    char *want = o ? loom__json_compact_dumps(o, 15, &len) : NULL;
    int rc;

    /* Something before it stays: the text is appended. */
    assert_int_equal(loom_buf_puts(&b, "<"), 0);
    rc = loom__event_text(&ev, &b);
    if (!want) {
        assert_int_not_equal(rc, 0);
    } else {
        assert_int_equal(rc, 0);
        assert_int_equal(b.len, len + 1);
        assert_memory_equal(b.ptr + 1, want, len);
    }
    free(want);
    json_decref(o);
    json_decref(data);
    loom_buf_free(&b);
}

static void test_event_text_same_bytes(void **state)
{
    char long_text[2000], nul_key[] = "a\0b";
    json_t *d;

    (void)state;
    memset(long_text, 'x', sizeof(long_text) - 1);
    long_text[sizeof(long_text) - 1] = '\0';
    long_text[700] = '\n';
    assert_same(LOOM_EV_MESSAGE_DELTA, 2, 0, "run_1",
                json_pack("{s:s}", "delta", "Hi \"there\"\n\x01"));
    assert_same(LOOM_EV_MESSAGE_DELTA, 3, 4, "run_1",
                json_pack("{s:s}", "delta", long_text));
    assert_same(LOOM_EV_RUN_STARTED, 1, 0, "run_1",
                json_pack("{s:n,s:s,s:i,s:i,s:s}", "agent", "model",
                          "fake/fake-model", "max_iterations", 10, "tools", 3,
                          "conversation_id", "conv_1"));
    assert_same(LOOM_EV_USAGE, 4, 0, "run_1",
                json_pack("{s:i,s:I,s:f,s:f,s:{s:i,s:[f,b,n]}}",
                          "prompt_tokens", 10, "big", (json_int_t)INT64_MIN,
                          "cost", 0.1 + 0.2, "tiny", -2.5e-300, "cumulative",
                          "total_tokens", 12, "list", 1e21, 1));
    /* The envelope wins over the data's own type, seq and index; the
     * data's run_id stays only where the event has none usable. */
    d = json_pack("{s:s,s:i,s:i,s:s,s:s}", "type", "fake", "seq", 99, "index",
                  98, "run_id", "run_data", "text", "t");
    assert_same(LOOM_EV_RUN_COMPLETED, 5, 1, "run_1", json_incref(d));
    assert_same(LOOM_EV_RUN_COMPLETED, 5, 1, NULL, json_incref(d));
    assert_same(LOOM_EV_RUN_COMPLETED, 5, 1, "run_\xff", json_incref(d));
    json_decref(d);
    /* No data, empty data, data that is no object. */
    assert_same(LOOM_EV_CONTEXT, 6, 0, "run_1", NULL);
    assert_same(LOOM_EV_CONTEXT, 6, 0, "run_1", json_object());
    assert_same(LOOM_EV_CONTEXT, 6, 0, "run_1", json_pack("[i]", 1));
    /* An unknown type, the largest seq and index. */
    assert_same((loom_event_type)LOOM_EV__COUNT, UINT64_MAX, UINT32_MAX,
                "run_1", json_object());
    /* A key holding a NUL is cut as the object's set cuts it. */
    d = json_object();
    json_object_setn_new(d, nul_key, 3, json_integer(1));
    json_object_set_new(d, "z", json_integer(2));
    json_object_setn_new(d, "type\0x", 6, json_integer(3));
    assert_same(LOOM_EV_TOOL_METRIC, 7, 0, "run_1", d);
    /* A string that is not UTF-8 fails both ways. */
    d = json_object();
    json_object_set_new(d, "delta", json_stringn_nocheck("\xc3", 1));
    assert_same(LOOM_EV_MESSAGE_DELTA, 8, 0, "run_1", d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_event_text_same_bytes),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
