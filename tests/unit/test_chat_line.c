/*
 * The pure parts of `loom chat` (src/cli/chat_line.c): what a typed line
 * asks for (messages, each /command with and without its argument,
 * unknown commands, "//" for a message starting with a slash), the sum
 * /cost shows of a conversation's usage rows (priced and not), and the
 * history file's place ($XDG_STATE_HOME, else ~/.local/state).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cli/chat_line.h"

#include <stdlib.h>
#include <string.h>

/* Parses line, checks its verb and argument (NULL: not checked). */
static void parses(const char *line, chat_verb verb, const char *arg)
{
    chat_command c;

    chat_parse(line, &c);
    assert_int_equal(c.verb, verb);
    if (arg) {
        assert_int_equal(c.arg_len, strlen(arg));
        assert_memory_equal(c.arg, arg, c.arg_len);
    }
    if (verb == CHAT_BAD)
        assert_non_null(c.error);
}

static void test_parse(void **state)
{
    (void)state;
    parses("hello there", CHAT_SAY, "hello there");
    parses("  spaced out \t\n", CHAT_SAY, "spaced out");
    parses("", CHAT_EMPTY, NULL);
    parses(" \t ", CHAT_EMPTY, NULL);
    parses("/new", CHAT_NEW, "");
    parses("  /new  ", CHAT_NEW, "");
    parses("/new now", CHAT_BAD, NULL);
    parses("/agent", CHAT_AGENT, "");
    parses("/agent  coder ", CHAT_AGENT, "coder");
    parses("/model openai/gpt-4o", CHAT_MODEL, "openai/gpt-4o");
    parses("/model", CHAT_MODEL, "");
    parses("/cost", CHAT_COST, "");
    parses("/research why is the sky blue?", CHAT_RESEARCH,
           "why is the sky blue?");
    parses("/research", CHAT_BAD, NULL);
    parses("/research   ", CHAT_BAD, NULL);
    parses("/help", CHAT_HELP, "");
    parses("/exit", CHAT_EXIT, "");
    parses("/quit", CHAT_EXIT, "");
    parses("/newer", CHAT_UNKNOWN, "/newer");
    parses("/frob the knob", CHAT_UNKNOWN, "/frob");
    parses("/", CHAT_UNKNOWN, "/");
    parses("//new is a word", CHAT_SAY, "/new is a word");
    parses("a /new in the middle", CHAT_SAY, "a /new in the middle");
}

static void test_cost(void **state)
{
    chat_cost c;
    char buf[160];
    json_t *rows = json_loads(
        "[{\"prompt_tokens\":100,\"completion_tokens\":10,\"total_tokens\":"
        "110,\"cost_micros\":120},"
        "{\"prompt_tokens\":50,\"completion_tokens\":1,\"cached_tokens\":20,"
        "\"reasoning_tokens\":0,\"total_tokens\":51,\"cost_micros\":52}]",
        0, NULL);

    (void)state;
    assert_non_null(rows);
    memset(&c, 0, sizeof(c));
    chat_cost_add(&c, rows);
    assert_int_equal(c.calls, 2);
    assert_int_equal(c.total, 161);
    assert_int_equal(c.cost_micros, 172);
    chat_cost_format(&c, buf, sizeof(buf));
    assert_string_equal(buf, "2 model calls, 161 tokens (150 prompt, 11 "
                             "completion, 20 cached), $0.000172");

    /* A row without a price: the cost is not known. */
    json_array_append_new(rows, json_pack("{s:i,s:i,s:i,s:n}", "prompt_tokens",
                                          7, "completion_tokens", 3,
                                          "total_tokens", 10, "cost_micros"));
    memset(&c, 0, sizeof(c));
    chat_cost_add(&c, rows);
    chat_cost_format(&c, buf, sizeof(buf));
    assert_string_equal(buf, "3 model calls, 171 tokens (157 prompt, 14 "
                             "completion, 20 cached), cost unknown (2 of "
                             "3 calls priced)");

    /* Dollars and a short buffer. */
    memset(&c, 0, sizeof(c));
    c.calls = c.priced = 1;
    c.total = c.prompt = 5;
    c.reasoning = 2;
    c.cost_micros = 3250000;
    chat_cost_format(&c, buf, sizeof(buf));
    assert_string_equal(buf, "1 model call, 5 tokens (5 prompt, 0 "
                             "completion, 2 reasoning), $3.250000");
    chat_cost_format(&c, buf, 12);
    assert_true(strlen(buf) < 12);

    /* No rows at all. */
    memset(&c, 0, sizeof(c));
    chat_cost_format(&c, buf, sizeof(buf));
    assert_string_equal(buf, "0 model calls, 0 tokens (0 prompt, 0 "
                             "completion), cost unknown (0 of 0 calls "
                             "priced)");
    json_decref(rows);
}

static void test_history_path(void **state)
{
    char *p;

    (void)state;
    p = chat_history_path("/x/state", "/home/u");
    assert_string_equal(p, "/x/state/loom/chat_history");
    free(p);
    /* A relative XDG_STATE_HOME is to be ignored (the spec says so). */
    p = chat_history_path("rel/state", "/home/u");
    assert_string_equal(p, "/home/u/.local/state/loom/chat_history");
    free(p);
    p = chat_history_path(NULL, "/home/u");
    assert_string_equal(p, "/home/u/.local/state/loom/chat_history");
    free(p);
    assert_null(chat_history_path("", ""));
    assert_null(chat_history_path(NULL, NULL));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_cost),
        cmocka_unit_test(test_history_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
