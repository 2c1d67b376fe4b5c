/*
 * A conversation's title as loom keeps it from a model's answer
 * (agent/title.h): the first line, markup off, blanks folded, cut on a
 * character.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "agent/title.h"

#include <string.h>

static const char *clean(const char *in)
{
    static char out[LOOM_TITLE_MAX * 2];

    loom__title_clean(out, sizeof(out), in);
    return out;
}

static void test_clean(void **state)
{
    (void)state;
    assert_string_equal(clean("Trip to Paris"), "Trip to Paris");
    assert_string_equal(clean("\"Trip to Paris\""), "Trip to Paris");
    assert_string_equal(clean("**Title:** `Trip`\nSure! Here..."), "Trip");
    assert_string_equal(clean("\n\n  # Budget   planning\t2027 \r\nx"),
                        "Budget planning 2027");
    assert_string_equal(clean("a\x01\x1b[2Jb"), "a [2Jb");
    assert_string_equal(clean(""), "");
    assert_string_equal(clean(NULL), "");
    assert_string_equal(clean("\"\"\n"), "");
}

/* Past LOOM_TITLE_MAX bytes: cut on a character, no space at the end. */
static void test_cut(void **state)
{
    char in[400], out[LOOM_TITLE_MAX * 2];
    size_t n = 0;

    (void)state;
    /* "é" is two bytes: 79 "a" then "é" puts its second byte at 81. */
    memset(in, 'a', 79);
    n = 79;
    memcpy(in + n, "\xc3\xa9 and more words here", 22);
    in[n + 22] = '\0';
    assert_int_equal(loom__title_clean(out, sizeof(out), in), 79);
    assert_int_equal(strlen(out), 79);
    memset(in, 'a', 79);
    in[79] = ' ';
    memset(in + 80, 'b', 10);
    in[90] = '\0';
    assert_int_equal(loom__title_clean(out, sizeof(out), in), 79);
    /* A small buffer is never overrun. */
    assert_int_equal(loom__title_clean(out, 5, "Trip to Paris"), 4);
    assert_string_equal(out, "Trip");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clean),
        cmocka_unit_test(test_cut),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
