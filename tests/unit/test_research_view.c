/*
 * What `loom research` shows (src/cli/research_view.c): the state built
 * from a research run's events, the terminal rendering (state -> lines:
 * status line, plan, cycles with their researchers' status, sources and
 * elapsed time; cut to the width; bounded to the rows with the newest
 * lines kept), the plain progress lines, and the cleaning of untrusted
 * text (a task holding "\x1b[2J" never reaches the terminal raw).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cli/clean.h"
#include "cli/research_view.h"

#include <stdlib.h>
#include <string.h>

/* Applies one event of type with data (stolen) at now. */
static rv_change feed(research_view *v, loom_event_type type, json_t *data,
                      int64_t now)
{
    loom_event ev = {type, 1, 0, "run_1", data};
    rv_change c;

    assert_non_null(data);
    c = research_view_apply(v, &ev, now);
    json_decref(data);
    return c;
}

/* A researcher's nested event data: depth 1 under the call call_id. */
static json_t *nested(json_t *data, const char *call_id)
{
    json_object_set_new(data, "parent_run_id", json_string("run_2"));
    json_object_set_new(data, "depth", json_integer(1));
    json_object_set_new(data, "parent_call_id", json_string(call_id));
    return data;
}

static void start(research_view *v, const char *id, const char *task,
                  int64_t now)
{
    assert_int_equal(
        feed(v, LOOM_EV_TOOL_STARTED,
             json_pack("{s:s,s:s,s:{s:s}}", "id", id, "name", "research_agent",
                       "arguments", "task", task),
             now),
        RV_STARTED);
}

/* The lines of the view at now, cols x rows, joined by newlines. */
static char *render(const research_view *v, int64_t now, int cols, int rows,
                    size_t *count)
{
    char **lines = NULL, *all = calloc(1, 1);
    size_t n = research_view_render(v, now, cols, rows, &lines), len = 0;

    assert_non_null(lines);
    assert_non_null(all);
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(lines[i]), chars = 0;
        for (size_t k = 0; k < l; k++)
            chars += ((unsigned char)lines[i][k] & 0xC0) != 0x80;
        assert_true(chars <= (size_t)cols - 1);
        assert_null(strchr(lines[i], '\n'));
        assert_null(strchr(lines[i], '\x1b'));
        all = realloc(all, len + l + 2);
        assert_non_null(all);
        memcpy(all + len, lines[i], l);
        len += l;
        all[len++] = '\n';
        all[len] = '\0';
    }
    research_view_lines_free(lines, n);
    if (count)
        *count = n;
    return all;
}

static void test_clean(void **state)
{
    char *s;

    (void)state;
    s = cli_clean("a\x1b[2Jb\x1b]0;title\x07"
                  "c\x1b]8;;http://x\x1b\\d\x1b"
                  "7e\r\x7f\x01\tf\ng\xc2\x9b"
                  "h\xc3\xa9",
                  0);
    assert_string_equal(s, "abcde f gh\xc3\xa9");
    free(s);
    s = cli_clean("1.\tA\n2. B\x1b[", CLI_KEEP_NL | CLI_KEEP_TAB);
    assert_string_equal(s, "1.\tA\n2. B");
    free(s);
    s = cli_clean("x\x1b", 0); /* cut off by the end */
    assert_string_equal(s, "x");
    free(s);
}

/* A run: plan, cycle 1 with two researchers (one finding sources, one
 * failing) and a third still running, spending, then the report. */
static void run_events(research_view *v)
{
    research_view_init(v, 1000);
    assert_int_equal(feed(v, LOOM_EV_RESEARCH_PLAN,
                          json_pack("{s:s}", "delta", "1. Alpha\n2. Be"), 1100),
                     RV_PLAN);
    assert_int_equal(
        feed(v, LOOM_EV_RESEARCH_PLAN, json_pack("{s:s}", "delta", "ta"), 1150),
        RV_PLAN);
    assert_int_equal(
        feed(v, LOOM_EV_USAGE,
             json_pack("{s:i,s:i}", "total_tokens", 1500, "cost_micros", 3100),
             1200),
        RV_SPENT);
    assert_int_equal(feed(v, LOOM_EV_RESEARCH_CYCLE,
                          json_pack("{s:i,s:i}", "cycle", 1, "max_cycles", 8),
                          1300),
                     RV_CYCLE);
    assert_int_equal(feed(v, LOOM_EV_RESEARCH_BRANCH,
                          json_pack("{s:i,s:i,s:i}", "cycle", 1, "researchers",
                                    3, "calls", 3),
                          1300),
                     RV_BRANCH);
    start(v, "c1", "alpha", 2000);
    start(v, "c2", "beta", 2000);
    start(v, "c3", "evil\x1b[2Jtask\nline", 2000);
    assert_int_equal(
        feed(v, LOOM_EV_TOOL_METRIC,
             nested(json_pack("{s:s,s:[{s:s},{s:s}]}", "name", "web_search",
                              "documents", "url", "u1", "url", "u2"),
                    "c1"),
             2500),
        RV_SPENT);
    assert_int_equal(feed(v, LOOM_EV_USAGE,
                          nested(json_pack("{s:i,s:i}", "total_tokens", 500,
                                           "cost_micros", 900),
                                 "c1"),
                          2600),
                     RV_SPENT);
    assert_int_equal(feed(v, LOOM_EV_TOOL_COMPLETED,
                          json_pack("{s:s,s:s,s:i}", "id", "c1", "name",
                                    "research_agent", "duration_ms", 4200),
                          6200),
                     RV_ENDED);
    assert_int_equal(feed(v, LOOM_EV_TOOL_FAILED,
                          json_pack("{s:s,s:s,s:i,s:s}", "id", "c2", "name",
                                    "research_agent", "duration_ms", 1100,
                                    "error", "beta broke\x1b[31m"),
                          3100),
                     RV_ENDED);
    /* Another run's events and other tools change nothing shown. */
    assert_int_equal(
        feed(v, LOOM_EV_TOOL_STARTED,
             json_pack("{s:s,s:s}", "id", "t", "name", "think_tool"), 6300),
        RV_NONE);
}

static void test_render(void **state)
{
    research_view v;
    char *s;
    size_t n;

    (void)state;
    run_events(&v);
    s = render(&v, 9000, 200, 40, &n);
    assert_non_null(strstr(s,
                           "research: cycle 1/8, 3 researchers (1 running,"
                           " 1 done, 1 failed), 2000 tokens, $0.0040, 8 s\n"));
    assert_non_null(strstr(s, "plan:\n  1. Alpha\n  2. Beta\n"));
    assert_non_null(strstr(s, "cycle 1/8: 3 researchers\n"));
    assert_non_null(strstr(s, "  [done]       4.2 s    2 sources  1: alpha\n"));
    assert_non_null(strstr(s, "  [failed]     1.1 s    0 sources  2: beta --"
                              " beta broke\n"));
    /* Running: elapsed on the caller's clock; the escape removed. */
    assert_non_null(strstr(s, "  [running]    7.0 s    0 sources  3: eviltask"
                              " line\n"));
    assert_int_equal(n, 8);
    free(s);

    /* Narrow: every line cut to the width (render() checks). */
    free(render(&v, 9000, 20, 40, NULL));

    /* The report: the phase says so, then the end. */
    assert_int_equal(
        feed(&v, LOOM_EV_TOOL_STARTED,
             json_pack("{s:s,s:s}", "id", "g", "name", "generate_report"),
             9100),
        RV_WRITING);
    s = render(&v, 9200, 200, 40, NULL);
    assert_non_null(strstr(s, "research: writing the report,"));
    assert_non_null(strstr(s, "\nwriting the report\n"));
    free(s);
    assert_int_equal(feed(&v, LOOM_EV_RUN_FAILED,
                          json_pack("{s:s}", "status", "cancelled"), 9300),
                     RV_FAILED_RUN);
    s = render(&v, 9400, 200, 40, NULL);
    assert_non_null(strstr(s, "research: cancelled,"));
    free(s);
    research_view_free(&v);
}

/* Many researchers on a short terminal: at most rows lines, the newest
 * kept, the oldest counted. */
static void test_bounded(void **state)
{
    research_view v;
    char id[16], task[32], *s;
    size_t n;

    (void)state;
    research_view_init(&v, 0);
    feed(&v, LOOM_EV_RESEARCH_PLAN,
         json_pack("{s:s}", "delta", "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n"), 0);
    for (int c = 1; c <= 8; c++) {
        feed(&v, LOOM_EV_RESEARCH_CYCLE,
             json_pack("{s:i,s:i}", "cycle", c, "max_cycles", 8), 0);
        for (int r = 0; r < 5; r++) {
            snprintf(id, sizeof(id), "c%d-%d", c, r);
            snprintf(task, sizeof(task), "task %d.%d", c, r);
            start(&v, id, task, 0);
        }
    }
    s = render(&v, 100, 80, 12, &n);
    assert_int_equal(n, 12);
    assert_non_null(strstr(s, "earlier lines)\n"));
    assert_non_null(strstr(s, "40: task 8.4\n"));
    assert_null(strstr(s, "1: task 1.0\n"));
    free(s);
    s = render(&v, 100, 80, 40, &n);
    assert_true(n <= 40);
    assert_non_null(strstr(s, "plan:\n  1\n"));
    assert_non_null(strstr(s, "more lines)\n"));
    free(s);
    s = render(&v, 100, 80, 1, &n);
    assert_int_equal(n, 1);
    assert_non_null(strstr(s, "research: cycle 8/8, 40 researchers"));
    free(s);
    research_view_free(&v);
}

/* The plain lines, as `loom research` prints them without a terminal. */
static void test_plain(void **state)
{
    static const rv_change order[] = {RV_PLAN, RV_CYCLE, RV_BRANCH};
    research_view v;
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
    loom_event ev = {LOOM_EV_RUN_COMPLETED, 1, 0, "run_1", NULL};

    (void)state;
    assert_non_null(f);
    run_events(&v);
    /* Replay what run_events changed, as the sink would have printed. */
    for (size_t i = 0; i < sizeof(order) / sizeof(*order); i++)
        research_view_plain(&v, order[i], f);
    for (size_t k = 1; k <= 3; k++) {
        v.last = k;
        research_view_plain(&v, RV_STARTED, f);
    }
    v.last = 1;
    research_view_plain(&v, RV_ENDED, f);
    v.last = 2;
    research_view_plain(&v, RV_ENDED, f);
    ev.data = json_pack("{s:s,s:s,s:{s:i,s:i,s:i}}", "status", "completed",
                        "report_reason", "cycle_limit", "research", "cycles", 1,
                        "researchers", 3, "failed", 1);
    research_view_plain(&v, research_view_apply(&v, &ev, 9000), f);
    json_decref(ev.data);
    fclose(f);
    assert_string_equal(
        out, "plan:\n1. Alpha\n2. Beta\n"
             "cycle 1/8: 2000 tokens, $0.0040 so far\n"
             "cycle 1: 3 researchers in parallel\n"
             "researcher 1: started: alpha\n"
             "researcher 2: started: beta\n"
             "researcher 3: started: eviltask line\n"
             "researcher 1: done in 4.2 s, 2 sources\n"
             "researcher 2: failed in 1.1 s: beta broke\n"
             "report (cycle_limit): 1 cycle, 3 researchers (1 failed), 0 "
             "sources cited; 2000 tokens, $0.0040\n");
    free(out);
    research_view_free(&v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clean),
        cmocka_unit_test(test_render),
        cmocka_unit_test(test_bounded),
        cmocka_unit_test(test_plain),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
