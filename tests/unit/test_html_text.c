/*
 * Unit tests of src/tools/html_text.c, the text web_fetch hands to a
 * model: HTML structure to markdown-ish text (headings, lists, links,
 * code, tables, quotes), what is dropped, whitespace, charsets through
 * libxml2 and iconv, the UTF-8 helpers, Content-Type parsing, and every
 * limit crossed (the output buffer, nested list numbering and indent,
 * link length, a document nested far deeper than any stack would take).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "tools/html_text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Converts html (NUL-terminated) with base http://b.test/dir/page. */
static char *text_of(const char *html, const char *charset, size_t max,
                     int *truncated)
{
    loom_buf out = LOOM_BUF_INIT(max);
    int cut = 0, rc;

    rc = loom__html_to_text(html, strlen(html), charset,
                            "http://b.test/dir/page", &out, &cut);
    if (rc)
        fail_msg("html_to_text: %d %s", rc, loom_error_last());
    if (truncated)
        *truncated = cut;
    else
        assert_false(cut);
    return out.ptr ? out.ptr : strdup("");
}

static void expect_text(const char *html, const char *want)
{
    char *got = text_of(html, NULL, 1 << 20, NULL);

    if (strcmp(got, want) != 0)
        fail_msg("html: %s\nwant: [%s]\ngot:  [%s]", html, want, got);
    free(got);
}

static void test_structure(void **state)
{
    (void)state;
    expect_text("<title> A   page </title><h1>Top</h1><p>One\n two</p>"
                "<h3>Sub</h3><p>Three</p>",
                "Title: A page\n\n# Top\n\nOne two\n\n### Sub\n\nThree");
    expect_text("<ul><li>a<li>b<ul><li>c</ul></ul><ol><li>x<li>y</ol>",
                "- a\n- b\n  - c\n\n1. x\n2. y");
    expect_text("<ol><li><p>para in item</p></li><li><p>next</p></li></ol>",
                "1. para in item\n2. next");
    expect_text("<p>see <a href='/x'>the docs</a>, <a href='b'> spaced "
                "</a> and <a href='#top'>top</a></p>",
                "see [the docs](http://b.test/x), [spaced](http://b.test/"
                "dir/b) and top");
    expect_text("<p><a href='javascript:alert(1)'>js</a> <a href='/e'>"
                "</a>end</p>",
                "js end");
    expect_text("<base href='http://other.test/base/'><a href='p'>p</a>",
                "[p](http://other.test/base/p)");
    expect_text("<p>use <code>json_t</code> and <code></code>x</p>"
                "<pre>  line 1\n    line 2\n</pre><p>after</p>",
                "use `json_t` and x\n\n```\n  line 1\n    line 2\n```\n\n"
                "after");
    expect_text("<table><tr><th>k<th>v<tr><td>a<td>1</table>",
                "k | v\na | 1");
    expect_text("<p>a<br>b<br><br>c</p><blockquote><p>q</p></blockquote>",
                "a\nb\n\nc\n\n> q");
    expect_text("<dl><dt>term<dd>meaning</dl>", "term\n  meaning");
    expect_text("", "");
    expect_text("<p>   </p>", "");
    expect_text("plain &amp; simple &lt;b&gt; &#8364; &eacute;",
                "plain & simple <b> \xe2\x82\xac \xc3\xa9");
}

static void test_dropped(void **state)
{
    (void)state;
    expect_text("<script>a()</script><style>p{}</style><noscript>n"
                "</noscript><template>t</template><nav>menu</nav>"
                "<header>site</header><form><label>L</label><input>"
                "<button>B</button></form><iframe>f</iframe><svg><text>s"
                "</text></svg><footer>foot</footer><p>kept</p>",
                "kept");
    expect_text("<p hidden>h</p><p aria-hidden='true'>a</p><div "
                "style='DISPLAY : none'>d</div><div style='visibility:"
                "hidden'>v</div><div role='navigation'>r</div><div "
                "class='x sidebar'>s</div><div id='footer'>f</div>"
                "<p class='footer-note'>kept</p>",
                "kept");
    /* an article's own header and footer are content */
    expect_text("<article><header><h1>T</h1></header><p>b</p><footer>by "
                "me</footer></article>",
                "# T\n\nb\n\nby me");
    /* heading permalinks */
    expect_text("<h2>Sec<a href='#sec'>\xc2\xb6</a></h2>", "## Sec");
}

static void test_charsets(void **state)
{
    const char *cp = "<title>Caf\xe9</title><p>\x93q\x94 \x80</p>";
    char *t;

    (void)state;
    t = text_of(cp, "windows-1252", 1 << 20, NULL);
    assert_string_equal(t, "Title: Caf\xc3\xa9\n\n\xe2\x80\x9cq\xe2\x80\x9d "
                           "\xe2\x82\xac");
    free(t);
    /* Latin-1 labels read as windows-1252, as browsers do */
    t = text_of(cp, "ISO-8859-1", 1 << 20, NULL);
    assert_non_null(strstr(t, "\xe2\x80\x9cq\xe2\x80\x9d"));
    free(t);
    /* the header's charset wins over <meta> */
    t = text_of("<meta charset='windows-1252'><p>caf\xc3\xa9</p>", "utf-8",
                1 << 20, NULL);
    assert_string_equal(t, "caf\xc3\xa9");
    free(t);
    /* a charset name with odd characters is ignored, not passed on */
    t = text_of("<p>x</p>", "../../etc", 1 << 20, NULL);
    assert_string_equal(t, "x");
    free(t);
}

static void test_text_to_utf8(void **state)
{
    loom_buf b = LOOM_BUF_INIT(1024);

    (void)state;
    assert_int_equal(loom__text_to_utf8("caf\xe9", 4, "latin1", &b), 0);
    assert_string_equal(b.ptr, "caf\xc3\xa9");
    loom_buf_clear(&b);
    /* undeclared and not UTF-8: windows-1252 */
    assert_int_equal(loom__text_to_utf8("\x93x\x94", 3, NULL, &b), 0);
    assert_string_equal(b.ptr, "\xe2\x80\x9cx\xe2\x80\x9d");
    loom_buf_clear(&b);
    /* declared UTF-8 but broken: U+FFFD */
    assert_int_equal(loom__text_to_utf8("a\xe9z", 3, "utf-8", &b), 0);
    assert_string_equal(b.ptr, "a\xef\xbf\xbdz");
    loom_buf_clear(&b);
    /* an unknown charset: read as UTF-8 */
    assert_int_equal(loom__text_to_utf8("ok", 2, "x-no-such", &b), 0);
    assert_string_equal(b.ptr, "ok");
    loom_buf_clear(&b);
    /* bytes the charset does not define */
    assert_int_equal(loom__text_to_utf8("a\x81z", 3, "windows-1252", &b), 0);
    assert_string_equal(b.ptr, "a\xef\xbf\xbdz");
    loom_buf_free(&b);
}

static void test_utf8_and_content_type(void **state)
{
    char mt[32], cs[16];
    loom_buf b = LOOM_BUF_INIT(64);

    (void)state;
    loom__content_type_parse("Text/HTML; Charset=\"ISO-8859-1\"", mt,
                             sizeof(mt), cs, sizeof(cs));
    assert_string_equal(mt, "text/html");
    assert_string_equal(cs, "ISO-8859-1");
    loom__content_type_parse("application/json", mt, sizeof(mt), cs,
                             sizeof(cs));
    assert_string_equal(mt, "application/json");
    assert_string_equal(cs, "");
    loom__content_type_parse("text/plain; format=x; charset=utf-8", mt,
                             sizeof(mt), cs, sizeof(cs));
    assert_string_equal(cs, "utf-8");
    /* charsets that are not names, and values too long, are dropped */
    loom__content_type_parse("text/plain; charset=a/b", mt, sizeof(mt), cs,
                             sizeof(cs));
    assert_string_equal(cs, "");
    loom__content_type_parse("text/plain; charset=aaaaaaaaaaaaaaaaaaaaaa",
                             mt, sizeof(mt), cs, sizeof(cs));
    assert_string_equal(cs, "");
    loom__content_type_parse(NULL, mt, sizeof(mt), cs, sizeof(cs));
    assert_string_equal(mt, "");

    /* invalid bytes become U+FFFD, CR LF becomes LF, controls go */
    assert_int_equal(loom__utf8_sanitize("a\xff" "b\r\nc\x01\xc3\xa9\r"
                                         "\xc2\x85" "\xed\xa0\x80",
                                         15, &b),
                     0);
    assert_string_equal(b.ptr, "a\xef\xbf\xbd" "b\nc\xc3\xa9\n"
                               "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    loom_buf_clear(&b);
    assert_int_equal(loom__utf8_sanitize("a\xc3\xa9z", 4, &b), 0);
    assert_int_equal(loom__utf8_count(b.ptr, b.len), 3);
    /* a prefix ends on a character */
    assert_int_equal(loom__utf8_prefix(b.ptr, b.len, 2, 100), 3);
    assert_int_equal(loom__utf8_prefix(b.ptr, b.len, 100, 2), 1);
    assert_int_equal(loom__utf8_prefix(b.ptr, b.len, 0, 100), 0);
    /* the buffer limit cuts on a character too */
    loom_buf_free(&b);
    loom_buf_init(&b, 3);
    assert_int_equal(loom__utf8_sanitize("ab\xc3\xa9", 4, &b),
                     LOOM_ETOOLARGE);
    assert_string_equal(b.ptr, "ab");
    loom_buf_free(&b);
}

/* ---- limits */

static void test_output_limit(void **state)
{
    char *html = malloc(200000), *t;
    size_t len = 0;
    int cut;

    (void)state;
    for (int i = 0; i < 5000; i++)
        len += (size_t)snprintf(html + len, 200000 - len,
                                "<p>para %d \xc3\xa9</p>", i);
    t = text_of(html, NULL, 1000, &cut);
    assert_true(cut);
    assert_true(strlen(t) <= 1000);
    assert_true(strncmp(t, "para 0 \xc3\xa9\n\npara 1", 15) == 0);
    free(t);
    t = text_of(html, NULL, 1 << 20, &cut);
    assert_false(cut);
    assert_non_null(strstr(t, "para 4999 \xc3\xa9"));
    free(t);
    free(html);
}

static void test_nesting_limits(void **state)
{
    char html[4096], *t, want[64];
    size_t len = 0;

    (void)state;
    /* 20 nested numbered lists: numbers for the first 16 levels (then
     * "-"), indentation growing to 8 steps only */
    for (int i = 0; i < 20; i++)
        len += (size_t)snprintf(html + len, sizeof(html) - len,
                                "<ol><li>L%d", i + 1);
    t = text_of(html, NULL, 1 << 20, NULL);
    assert_true(strncmp(t, "1. L1\n  1. L2\n    1. L3\n", 24) == 0);
    snprintf(want, sizeof(want), "\n%*s1. L16\n%*s- L17\n", 16, "", 16, "");
    if (!strstr(t, want))
        fail_msg("no '%s' in:\n%s", want, t);
    assert_non_null(strstr(t, "\n                - L20"));
    free(t);
}

static void test_deep_document(void **state)
{
    size_t depth = 100000, len = 0;
    char *html = malloc(depth * 11 + 64), *t;

    (void)state;
    for (size_t i = 0; i < depth; i++) {
        memcpy(html + len, "<div><span>", 11);
        len += 11;
    }
    memcpy(html + len, "deep", 5);
    /* walked without recursion: no stack to overflow */
    t = text_of(html, NULL, 1 << 20, NULL);
    free(html);
    free(t);
}

static void test_link_length_limit(void **state)
{
    char html[6000], xs[2100], ys[2100], *t;

    (void)state;
    memset(xs, 'x', sizeof(xs));
    memset(ys, 'y', sizeof(ys));
    /* a URL of 2048 bytes is linked, a longer one is text alone */
    snprintf(html, sizeof(html),
             "<a href='http://b.test/%.*s'>ok</a> <a "
             "href='http://b.test/%.*s'>long</a>",
             2048 - 14, xs, 2049 - 14, ys);
    t = text_of(html, NULL, 1 << 20, NULL);
    assert_non_null(strstr(t, "[ok](http://b.test/xxx"));
    assert_non_null(strstr(t, "xxx) long"));
    assert_null(strstr(t, "yyy"));
    free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_structure),
        cmocka_unit_test(test_dropped),
        cmocka_unit_test(test_charsets),
        cmocka_unit_test(test_text_to_utf8),
        cmocka_unit_test(test_utf8_and_content_type),
        cmocka_unit_test(test_output_limit),
        cmocka_unit_test(test_nesting_limits),
        cmocka_unit_test(test_deep_document),
        cmocka_unit_test(test_link_length_limit),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
