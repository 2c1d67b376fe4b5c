/*
 * Fetched bytes to readable text (see tools/html_text.h).
 *
 * HTML is parsed by libxml2's HTML parser, which recovers from broken
 * markup the way browsers roughly do and handles the charset (the one
 * given, else <meta>). The tree is then walked without recursion (parent
 * and sibling pointers, so no depth can overflow the stack) and written
 * out as markdown-ish text. Whitespace follows HTML's rules: runs collapse
 * to one space, block elements start new lines, <pre> keeps its own.
 * What is dropped is decided per element: scripts, styles, forms,
 * navigation and page chrome (nav, header and footer outside articles,
 * ARIA navigation/banner/contentinfo/search roles, common sidebar and
 * footer classes) and hidden elements.
 *
 * libxml2 reports problems through per-thread error handlers that print
 * by default; the conversion silences them on its thread for its
 * duration, since the library never prints. Charsets of non-HTML text
 * are converted with iconv(3).
 */
#include "tools/html_text.h"
#include "core/error.h"
#include "core/utf8.h"

#include <errno.h>
#include <iconv.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <libxml/HTMLparser.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <libxml/uri.h>
#include <libxml/xmlerror.h>

/* Links longer than this are shown as their text alone. */
#define MAX_LINK_URL 2048
/* Nested lists whose numbering is tracked; deeper ones use "-". */
#define MAX_LISTS 16
/* Indentation of nested list items stops growing here. */
#define MAX_INDENT 8

/* ---- UTF-8 ------------------------------------------------------------- */

/* Length of the valid UTF-8 character at s (at most len bytes), or 0. */
static size_t utf8_len(const unsigned char *s, size_t len, uint32_t *cp)
{
    uint32_t c;
    size_t n;

    if (s[0] < 0x80) {
        *cp = s[0];
        return 1;
    }
    if (s[0] >= 0xc2 && s[0] <= 0xdf) {
        n = 2;
        c = s[0] & 0x1f;
    } else if (s[0] >= 0xe0 && s[0] <= 0xef) {
        n = 3;
        c = s[0] & 0x0f;
    } else if (s[0] >= 0xf0 && s[0] <= 0xf4) {
        n = 4;
        c = s[0] & 0x07;
    } else {
        return 0;
    }
    if (n > len)
        return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        c = c << 6 | (s[i] & 0x3f);
    }
    if ((n == 3 && c < 0x800) || (n == 4 && (c < 0x10000 || c > 0x10ffff)) ||
        (c >= 0xd800 && c <= 0xdfff))
        return 0;
    *cp = c;
    return n;
}

static int utf8_valid(const char *s, size_t len)
{
    uint32_t cp;

    for (size_t i = 0, n; i < len; i += n)
        if (!(n = utf8_len((const unsigned char *)s + i, len - i, &cp)))
            return 0;
    return 1;
}

/* Appends as much of s (valid UTF-8) as fits, ending on a character;
 * LOOM_ETOOLARGE when not all of it did. */
static int put_fit(loom_buf *out, const char *s, size_t n)
{
    int rc = loom_buf_put(out, s, n);
    size_t room, k;

    if (rc != LOOM_ETOOLARGE)
        return rc;
    room = out->max > out->len ? out->max - out->len : 0;
    k = loom__utf8_prefix(s, n, SIZE_MAX, room);
    if (k && loom_buf_put(out, s, k) == LOOM_ENOMEM)
        return LOOM_ENOMEM;
    return LOOM_ETOOLARGE;
}

int loom__utf8_sanitize(const char *data, size_t len, loom_buf *out)
{
    const unsigned char *s = (const unsigned char *)data;
    size_t i = 0, start = 0, n;
    uint32_t cp;
    int rc = 0;

    /* Valid runs are copied in one piece; only the odd byte is handled
     * alone. */
    while (i < len && rc == 0) {
        n = utf8_len(s + i, len - i, &cp);
        if (n && (cp >= 0x20 || cp == '\n' || cp == '\t') && cp != 0x7f &&
            !(cp >= 0x80 && cp <= 0x9f)) {
            i += n;
            continue;
        }
        rc = put_fit(out, (const char *)s + start, i - start);
        if (rc == 0 && !n)
            rc = loom_buf_puts(out, "\xef\xbf\xbd");
        else if (rc == 0 && cp == '\r' && !(i + 1 < len && s[i + 1] == '\n'))
            rc = loom_buf_putc(out, '\n');
        i += n ? n : 1;
        start = i;
    }
    if (rc == 0)
        rc = put_fit(out, (const char *)s + start, i - start);
    return rc;
}

size_t loom__utf8_prefix(const char *s, size_t len, size_t max_chars,
                         size_t max_bytes)
{
    size_t i = 0, chars = 0;

    if (max_bytes > len)
        max_bytes = len;
    while (i < max_bytes && chars < max_chars) {
        size_t n = 1;

        while (i + n < len && ((unsigned char)s[i + n] & 0xc0) == 0x80)
            n++;
        if (i + n > max_bytes)
            break;
        i += n;
        chars++;
    }
    return i;
}

/* ---- charsets ------------------------------------------------------------ */

static int charset_name_ok(const char *cs)
{
    size_t n = 0;

    for (; cs[n]; n++)
        if (!((cs[n] >= 'a' && cs[n] <= 'z') ||
              (cs[n] >= 'A' && cs[n] <= 'Z') ||
              (cs[n] >= '0' && cs[n] <= '9') || strchr("-_.:+", cs[n])))
            return 0;
    return n > 0 && n <= 40;
}

void loom__content_type_parse(const char *ct, char *mt, size_t mt_cap,
                              char *cs, size_t cs_cap)
{
    const char *p = ct, *end;
    size_t n;

    mt[0] = cs[0] = '\0';
    if (!ct)
        return;
    while (*p == ' ' || *p == '\t')
        p++;
    end = p + strcspn(p, "; \t");
    n = (size_t)(end - p);
    if (n < mt_cap) {
        for (size_t i = 0; i < n; i++)
            mt[i] = (char)((p[i] >= 'A' && p[i] <= 'Z') ? p[i] - 'A' + 'a'
                                                        : p[i]);
        mt[n] = '\0';
    }
    for (p = strchr(end, ';'); p; p = strchr(p + 1, ';')) {
        const char *v = p + 1;

        while (*v == ' ' || *v == '\t')
            v++;
        if (strncasecmp(v, "charset=", 8) != 0)
            continue;
        v += 8;
        if (*v == '"') {
            v++;
            n = strcspn(v, "\"");
        } else {
            n = strcspn(v, "; \t");
        }
        if (n < cs_cap) {
            memcpy(cs, v, n);
            cs[n] = '\0';
            if (!charset_name_ok(cs))
                cs[0] = '\0';
        }
        break;
    }
}

/*
 * The decoder for a charset label. Like browsers (the WHATWG Encoding
 * Standard), Latin-1 and ASCII labels are read as windows-1252, its
 * superset: pages labelled ISO-8859-1 use its quotes and dashes.
 */
static const char *decoder_name(const char *cs)
{
    static const char *const latin1[] = {
        "iso-8859-1", "iso8859-1", "iso_8859-1", "latin1", "l1",
        "us-ascii",   "ascii",     "cp819",      "ibm819", "iso-ir-100",
        "iso_8859-1:1987", "csisolatin1", "x-cp1252", NULL};

    for (size_t i = 0; latin1[i]; i++)
        if (strcasecmp(cs, latin1[i]) == 0)
            return "WINDOWS-1252";
    return cs;
}

static int is_utf8_name(const char *cs)
{
    return strcasecmp(cs, "utf-8") == 0 || strcasecmp(cs, "utf8") == 0;
}

/* Converts through iconv cd, U+FFFD for what does not decode. */
static int iconv_all(iconv_t cd, const char *data, size_t len, loom_buf *tmp)
{
    char chunk[4096], *in = (char *)data;
    size_t inleft = len;
    int rc = 0;

    while (rc == 0) {
        char *o = chunk;
        size_t oleft = sizeof(chunk);
        size_t r = iconv(cd, inleft ? &in : NULL, &inleft, &o, &oleft);
        int err = r == (size_t)-1 ? errno : 0;

        rc = loom_buf_put(tmp, chunk, sizeof(chunk) - oleft);
        if (rc)
            break;
        if (err == E2BIG)
            continue;
        if (err == EILSEQ || err == EINVAL) {
            rc = loom_buf_puts(tmp, "\xef\xbf\xbd");
            if (err == EINVAL) /* a cut sequence at the end */
                break;
            in++;
            inleft--;
            continue;
        }
        if (err)
            return loom__error_set(LOOM_ERROR, "charset conversion: %s",
                                   strerror(err));
        if (inleft == 0)
            break;
    }
    return rc;
}

int loom__text_to_utf8(const char *data, size_t len, const char *charset,
                       loom_buf *out)
{
    loom_buf tmp = LOOM_BUF_INIT(out->max);
    const char *from = charset && *charset ? charset : NULL;
    iconv_t cd;
    int rc;

    if (!from || is_utf8_name(from)) {
        if (from || utf8_valid(data, len))
            return loom__utf8_sanitize(data, len, out);
        from = "WINDOWS-1252"; /* what undeclared non-UTF-8 text mostly is */
    }
    cd = iconv_open("UTF-8", decoder_name(from));
    if (cd == (iconv_t)-1)
        return loom__utf8_sanitize(data, len, out);
    rc = iconv_all(cd, data, len, &tmp);
    iconv_close(cd);
    /* Past the limit, what was converted is still worth keeping. */
    if (rc == 0 || rc == LOOM_ETOOLARGE) {
        int rc2 = loom__utf8_sanitize(tmp.ptr ? tmp.ptr : "", tmp.len, out);

        rc = rc ? rc : rc2;
    }
    loom_buf_free(&tmp);
    return rc;
}

/* ---- the HTML walk ------------------------------------------------------- */

typedef struct {
    loom_buf *out;
    int rc;     /* first write error; LOOM_ETOOLARGE stops the walk */
    int nl;     /* newlines wanted before the next text (0..2) */
    int space;  /* a space wanted before the next text */
    int glue;   /* an opening mark was just written: no space after it */
    int pre;    /* inside <pre> */
    int quote;  /* blockquote depth */
    const xmlNode *link; /* the <a> being written, or NULL */
    size_t link_at;      /* offset of its "[" */
    xmlChar *href;       /* its resolved URL */
    const xmlNode *code; /* the inline code element being written */
    size_t code_at;
    struct {
        const xmlNode *node;
        int ordered, n;
    } lists[MAX_LISTS];
    int depth; /* list nesting, may pass MAX_LISTS */
    const xmlChar *base;
} walker;

static int name_is(const xmlNode *n, const char *name)
{
    return n->name && strcmp((const char *)n->name, name) == 0;
}

static int name_in(const xmlNode *n, const char *const *names)
{
    for (; *names; names++)
        if (name_is(n, *names))
            return 1;
    return 0;
}

static void put(walker *w, const char *s, size_t n)
{
    if (w->rc == 0)
        w->rc = loom_buf_put(w->out, s, n);
}

static char last_char(const walker *w)
{
    return w->out->len ? w->out->ptr[w->out->len - 1] : '\n';
}

/* Writes what is pending before text: newlines (counting those already
 * written) and the blockquote marks, or one space. */
static void flush(walker *w)
{
    if (w->out->len == 0) {
        w->nl = w->space = 0;
    } else if (w->nl) {
        int have = 0;

        for (size_t i = w->out->len; i > 0 && w->out->ptr[i - 1] == '\n';
             i--)
            have++;
        for (; have < w->nl; have++)
            put(w, "\n", 1);
        for (int i = 0; i < w->quote && i < MAX_INDENT; i++)
            put(w, "> ", 2);
    } else if (w->space && !w->glue && last_char(w) != ' ' &&
               last_char(w) != '\n') {
        put(w, " ", 1);
    }
    w->nl = w->space = w->glue = 0;
}

/* Writes a mark that text follows without a space ("[", "## "). */
static void mark(walker *w, const char *s)
{
    flush(w);
    put(w, s, strlen(s));
    w->glue = 1;
}

/* Asks for n line breaks before the next text; none right after a mark
 * ("- " then <p> stays on the item's line). */
static void block(walker *w, int n)
{
    if (w->glue)
        return;
    if (n > w->nl)
        w->nl = n;
    w->space = 0;
}

static int is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f';
}

static void text(walker *w, const char *s)
{
    size_t i = 0;

    if (w->pre) {
        flush(w);
        for (size_t j; s[i] && w->rc == 0; i = j + (s[j] == '\r')) {
            j = i + strcspn(s + i, "\r");
            put(w, s + i, j - i);
        }
        return;
    }
    while (s[i] && w->rc == 0) {
        size_t j = i;

        if (is_ws(s[i])) {
            while (is_ws(s[i]))
                i++;
            w->space = 1;
            continue;
        }
        while (s[j] && !is_ws(s[j]))
            j++;
        flush(w);
        put(w, s + i, j - i);
        i = j;
    }
}

/* The value of attribute name, or NULL; free with xmlFree. */
static xmlChar *attr(const xmlNode *n, const char *name)
{
    return xmlGetProp(n, (const xmlChar *)name);
}

static int has_token(const xmlChar *v, const char *const *tokens)
{
    const char *s = (const char *)v;

    while (s && *s) {
        size_t len;

        while (is_ws(*s))
            s++;
        len = strcspn(s, " \t\n\r\f");
        for (const char *const *t = tokens; *t; t++)
            if (len && strlen(*t) == len && strncasecmp(s, *t, len) == 0)
                return 1;
        s += len;
    }
    return 0;
}

/* display:none or visibility:hidden in a style attribute. */
static int style_hidden(const xmlChar *v)
{
    char buf[256];
    size_t n = 0;

    for (const char *s = (const char *)v; *s && n + 1 < sizeof(buf); s++)
        if (!is_ws(*s))
            buf[n++] = (char)((*s >= 'A' && *s <= 'Z') ? *s - 'A' + 'a' : *s);
    buf[n] = '\0';
    return strstr(buf, "display:none") || strstr(buf, "visibility:hidden");
}

static int inside(const xmlNode *n, const char *name)
{
    for (n = n->parent; n; n = n->parent)
        if (n->type == XML_ELEMENT_NODE && name_is(n, name))
            return 1;
    return 0;
}

/* Whether an element and its subtree are left out. */
static int dropped(const xmlNode *n)
{
    static const char *const drop[] = {
        "script", "style",  "noscript", "template", "nav",    "form",
        "iframe", "frame",  "frameset", "svg",      "canvas", "object",
        "embed",  "button", "select",   "textarea", "input",  "head",
        "img",    "picture", "video",   "audio",    "map",    "dialog",
        "title",  "meta",   "link",     NULL};
    static const char *const roles[] = {"navigation", "banner",
                                        "contentinfo", "search", "menubar",
                                        "menu", NULL};
    static const char *const chrome[] = {
        "sidebar",    "sphinxsidebar", "navbar",       "navigation",
        "footer",     "breadcrumb",    "breadcrumbs",  "skip-link",
        "skiplink",   "cookie-banner", "cookie-notice", NULL};
    xmlChar *v;
    int hit = 0;

    if (name_in(n, drop))
        return 1;
    if ((name_is(n, "header") || name_is(n, "footer")) &&
        !inside(n, "article"))
        return 1;
    if (xmlHasProp(n, (const xmlChar *)"hidden"))
        return 1;
    if ((v = attr(n, "aria-hidden"))) {
        hit = strcasecmp((const char *)v, "true") == 0;
        xmlFree(v);
    }
    if (!hit && (v = attr(n, "role"))) {
        hit = has_token(v, roles);
        xmlFree(v);
    }
    if (!hit && (v = attr(n, "style"))) {
        hit = style_hidden(v);
        xmlFree(v);
    }
    if (!hit && (v = attr(n, "class"))) {
        hit = has_token(v, chrome);
        xmlFree(v);
    }
    if (!hit && (v = attr(n, "id"))) {
        hit = has_token(v, chrome);
        xmlFree(v);
    }
    return hit;
}

/* A same-page link whose whole text is a symbol ("¶", "#"): a permalink
 * marker next to a heading, noise in text. */
static int permalink(const xmlNode *n)
{
    xmlChar *c = xmlNodeGetContent(n);
    const char *s = (const char *)c;
    size_t len;
    int hit = 1;

    if (!c)
        return 0;
    while (is_ws(*s))
        s++;
    len = strlen(s);
    while (len && is_ws(s[len - 1]))
        len--;
    if (len == 0 || len > 4)
        hit = 0;
    for (size_t i = 0; i < len && hit; i++)
        if ((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
            (s[i] >= '0' && s[i] <= '9'))
            hit = 0;
    xmlFree(c);
    return hit;
}

static void enter_link(walker *w, const xmlNode *n)
{
    xmlChar *href = attr(n, "href"), *abs = NULL;
    const char *h = (const char *)href;

    if (!href)
        return;
    while (is_ws(*h))
        h++;
    if (*h && *h != '#' && strncasecmp(h, "javascript:", 11) != 0 &&
        (abs = xmlBuildURI((const xmlChar *)h, w->base)) != NULL &&
        strlen((const char *)abs) <= MAX_LINK_URL) {
        mark(w, "[");
        w->link = n;
        w->link_at = w->out->len - 1;
        w->href = abs;
        abs = NULL;
    }
    xmlFree(abs);
    xmlFree(href);
}

/* Drops the bytes from at on (an opening mark with nothing after it). */
static void unwrite(walker *w, size_t at)
{
    if (at < w->out->len) {
        w->out->len = at;
        w->out->ptr[at] = '\0';
    }
}

static void leave_link(walker *w)
{
    int space = w->space;

    if (w->rc == 0 && w->out->len <= w->link_at + 1) {
        unwrite(w, w->link_at);
    } else {
        w->space = 0;
        put(w, "](", 2);
        put(w, (const char *)w->href, strlen((const char *)w->href));
        put(w, ")", 1);
        w->space = space;
    }
    w->glue = 0;
    xmlFree(w->href);
    w->href = NULL;
    w->link = NULL;
}

static int heading_level(const xmlNode *n)
{
    const char *s = (const char *)n->name;

    if (s && s[0] == 'h' && s[1] >= '1' && s[1] <= '6' && s[2] == '\0')
        return s[1] - '0';
    return 0;
}

static void enter_item(walker *w, const xmlNode *n)
{
    const xmlNode *prev = n->prev;
    char prefix[64];
    int indent = w->depth > 1 ? w->depth - 1 : 0, len = 0;

    if (indent > MAX_INDENT)
        indent = MAX_INDENT;
    while (prev && prev->type != XML_ELEMENT_NODE)
        prev = prev->prev;
    /* Items follow each other line by line, even when a paragraph in the
     * last one asked for a blank line. */
    if (prev && name_is(prev, "li"))
        w->nl = 0;
    block(w, 1);
    for (int i = 0; i < indent; i++)
        len += snprintf(prefix + len, sizeof(prefix) - (size_t)len, "  ");
    if (w->depth > 0 && w->depth <= MAX_LISTS &&
        w->lists[w->depth - 1].ordered)
        snprintf(prefix + len, sizeof(prefix) - (size_t)len, "%d. ",
                 ++w->lists[w->depth - 1].n);
    else
        snprintf(prefix + len, sizeof(prefix) - (size_t)len, "- ");
    mark(w, prefix);
}

static int is_cell(const xmlNode *n)
{
    return n->type == XML_ELEMENT_NODE &&
           (name_is(n, "td") || name_is(n, "th"));
}

/* Enters element n: 1 when its subtree is skipped. */
static int enter(walker *w, const xmlNode *n)
{
    static const char *const para[] = {
        "p",      "section", "article",  "main",   "aside",  "blockquote",
        "table",  "dl",      "figure",   "hr",     "center", "fieldset",
        "header", "footer",  "address",  NULL};
    static const char *const line[] = {
        "div", "tr", "dt", "caption", "summary", "details", "figcaption",
        "body", "tbody", "thead", "tfoot", "legend", NULL};
    static const char *const code[] = {"code", "kbd", "samp", "tt", NULL};
    int level = heading_level(n);

    if (dropped(n))
        return 1;
    if (level) {
        char hashes[8] = "######";

        block(w, 2);
        hashes[level] = '\0';
        mark(w, hashes);
        put(w, " ", 1);
    } else if (name_is(n, "a")) {
        if (!w->link) {
            xmlChar *href = attr(n, "href");
            int skip = href && href[0] == '#' && permalink(n);

            xmlFree(href);
            if (skip)
                return 1;
            enter_link(w, n);
        }
    } else if (name_is(n, "pre")) {
        block(w, 2);
        flush(w);
        if (!w->pre++)
            put(w, "```\n", 4);
    } else if (name_in(n, code)) {
        if (!w->pre && !w->code) {
            mark(w, "`");
            w->code = n;
            w->code_at = w->out->len - 1;
        }
    } else if (name_is(n, "ul") || name_is(n, "ol")) {
        block(w, w->depth ? 1 : 2);
        if (w->depth < MAX_LISTS) {
            w->lists[w->depth].node = n;
            w->lists[w->depth].ordered = name_is(n, "ol");
            w->lists[w->depth].n = 0;
        }
        w->depth++;
    } else if (name_is(n, "li")) {
        enter_item(w, n);
    } else if (name_is(n, "dd")) {
        block(w, 1);
        mark(w, "  ");
    } else if (name_is(n, "br")) {
        w->nl = w->nl < 2 ? w->nl + 1 : 2;
        w->space = 0;
    } else if (is_cell(n)) {
        const xmlNode *prev = n->prev;

        while (prev && prev->type != XML_ELEMENT_NODE)
            prev = prev->prev;
        if (prev && is_cell(prev)) {
            w->space = 0;
            mark(w, " | ");
        }
    } else if (name_in(n, para)) {
        block(w, 2);
        if (name_is(n, "blockquote"))
            w->quote++;
    } else if (name_in(n, line)) {
        block(w, 1);
    }
    return 0;
}

static void leave(walker *w, const xmlNode *n)
{
    static const char *const para[] = {
        "p",     "section", "article", "main",   "aside",   "table",
        "dl",    "figure",  "hr",      "center", "fieldset", "header",
        "footer", "address", NULL};
    static const char *const line[] = {
        "div", "tr", "dt", "dd", "li", "caption", "summary", "details",
        "figcaption", "tbody", "thead", "tfoot", "legend", NULL};

    /* Headings and paragraphs are never the open link or code span. */
    if (heading_level(n) || name_in(n, para)) {
        block(w, 2);
    } else if (n == w->link) {
        leave_link(w);
    } else if (n == w->code) {
        if (w->rc == 0 && w->out->len <= w->code_at + 1) {
            unwrite(w, w->code_at);
        } else {
            int space = w->space;

            w->space = 0;
            put(w, "`", 1);
            w->space = space;
        }
        w->glue = 0;
        w->code = NULL;
    } else if (name_is(n, "pre")) {
        if (--w->pre == 0) {
            if (last_char(w) != '\n')
                put(w, "\n", 1);
            put(w, "```", 3);
        }
        block(w, 2);
    } else if (name_is(n, "ul") || name_is(n, "ol")) {
        w->depth--;
        block(w, w->depth ? 1 : 2);
    } else if (name_is(n, "blockquote")) {
        block(w, 2);
        w->quote--;
    } else if (name_in(n, line)) {
        block(w, 1);
    }
}

/* Walks the subtree under top, in document order, without recursion. */
static void walk(walker *w, const xmlNode *top)
{
    const xmlNode *cur = top->children;

    while (cur && w->rc == 0) {
        if (cur->type == XML_ELEMENT_NODE) {
            if (!enter(w, cur)) {
                if (cur->children) {
                    cur = cur->children;
                    continue;
                }
                leave(w, cur);
            }
        } else if ((cur->type == XML_TEXT_NODE ||
                    cur->type == XML_CDATA_SECTION_NODE) &&
                   cur->content) {
            text(w, (const char *)cur->content);
        }
        while (cur != top && !cur->next) {
            cur = cur->parent;
            if (cur != top && w->rc == 0)
                leave(w, cur);
        }
        if (cur == top)
            break;
        cur = cur->next;
    }
}

/* The first element called name under top (document order), or NULL. */
static const xmlNode *find(const xmlNode *top, const char *name)
{
    const xmlNode *cur = top->children;

    while (cur) {
        if (cur->type == XML_ELEMENT_NODE) {
            if (name_is(cur, name))
                return cur;
            if (cur->children && !name_is(cur, "svg")) {
                cur = cur->children;
                continue;
            }
        }
        while (cur != top && !cur->next)
            cur = cur->parent;
        if (cur == top)
            break;
        cur = cur->next;
    }
    return NULL;
}

/* "Title: <title>\n\n" with the title's whitespace collapsed. */
static void write_title(walker *w, const xmlNode *root)
{
    const xmlNode *head = find(root, "head"), *t;
    xmlChar *c;

    if (!head || !(t = find(head, "title")) || !(c = xmlNodeGetContent(t)))
        return;
    mark(w, "Title: ");
    text(w, (const char *)c);
    xmlFree(c);
    if (w->out->len <= 7) /* an empty title */
        unwrite(w, 0);
    block(w, 2);
}

static void silent_generic(void *ctx, const char *msg, ...)
{
    (void)ctx;
    (void)msg;
}

static void silent_structured(void *ctx, xmlErrorPtr err)
{
    (void)ctx;
    (void)err;
}

static pthread_once_t xml_once = PTHREAD_ONCE_INIT;

static void xml_init(void)
{
    xmlInitParser();
}

/*
 * Parses len bytes of HTML (len checked by the caller) with libxml2,
 * its error handlers silenced on this thread meanwhile. NULL when
 * libxml2 builds no document (an empty input, or out of memory).
 */
static htmlDocPtr read_html(const char *html, size_t len, const char *url,
                            const char *encoding)
{
    xmlGenericErrorFunc old_generic;
    xmlStructuredErrorFunc old_structured;
    void *old_generic_ctx, *old_structured_ctx;
    htmlDocPtr doc;

    pthread_once(&xml_once, xml_init);
    /* The handlers are per thread in libxml2; they are put back after. */
    old_generic = xmlGenericError;
    old_generic_ctx = xmlGenericErrorContext;
    old_structured = xmlStructuredError;
    old_structured_ctx = xmlStructuredErrorContext;
    xmlSetGenericErrorFunc(NULL, silent_generic);
    xmlSetStructuredErrorFunc(NULL, silent_structured);
    doc = htmlReadMemory(html, (int)len, url, encoding,
                         HTML_PARSE_RECOVER | HTML_PARSE_NOERROR |
                             HTML_PARSE_NOWARNING | HTML_PARSE_NONET);
    xmlSetGenericErrorFunc(old_generic_ctx, old_generic);
    xmlSetStructuredErrorFunc(old_structured_ctx, old_structured);
    return doc;
}

int loom__html_to_text(const char *html, size_t len, const char *charset,
                       const char *base_url, loom_buf *out, int *truncated)
{
    loom_buf raw = LOOM_BUF_INIT(out->max);
    htmlDocPtr doc = NULL;
    xmlNode *root;
    xmlChar *base = NULL;
    walker w;
    int rc = 0;

    *truncated = 0;
    if (len > (size_t)INT32_MAX)
        return loom__error_set(LOOM_ETOOLARGE, "HTML larger than 2 GiB");
    doc = read_html(html, len, base_url,
                    charset && charset_name_ok(charset) ? decoder_name(charset)
                                                        : NULL);
    if (!doc || !(root = xmlDocGetRootElement(doc))) {
        /* libxml2 builds no document from an empty page: no text. */
        rc = doc || len == 0 ? 0
                             : loom__error_set(LOOM_EPROTO,
                                               "the HTML could not be parsed");
        goto cleanup;
    }
    memset(&w, 0, sizeof(w));
    w.out = &raw;
    {
        const xmlNode *head = find(root, "head");
        const xmlNode *b = head ? find(head, "base") : NULL;
        xmlChar *href = b ? attr(b, "href") : NULL;

        if (href)
            base = xmlBuildURI(href, (const xmlChar *)base_url);
        xmlFree(href);
        w.base = base ? base : (const xmlChar *)base_url;
    }
    write_title(&w, root);
    walk(&w, root);
    xmlFree(w.href);
    if (w.rc == LOOM_ETOOLARGE) {
        *truncated = 1;
        w.rc = 0;
    }
    if ((rc = w.rc) != 0)
        goto cleanup;
    /* Trailing blank lines and spaces are noise. */
    while (raw.len && (raw.ptr[raw.len - 1] == '\n' ||
                       raw.ptr[raw.len - 1] == ' '))
        unwrite(&w, raw.len - 1);
    rc = loom__utf8_sanitize(raw.ptr ? raw.ptr : "", raw.len, out);
    if (rc == LOOM_ETOOLARGE) {
        *truncated = 1;
        rc = 0;
    }

cleanup:
    xmlFree(base);
    if (doc)
        xmlFreeDoc(doc);
    loom_buf_free(&raw);
    return rc;
}

void loom__html_defuse(char *s, size_t len, const char *tag)
{
    const size_t tl = strlen(tag);

    for (size_t i = 0; i < len; i++) {
        size_t j = i + 1;

        if (s[i] != '<')
            continue;
        if (j < len && s[j] == '/')
            j++;
        if (len - j >= tl && strncasecmp(s + j, tag, tl) == 0)
            s[i] = '[';
    }
}

/* ---- fragments ----------------------------------------------------------- */

/* Tags that sit inside words (a search engine's <strong> around a match);
 * any other tag separates words. */
static const char *const inline_tags[] = {"a",    "b",    "code",   "em", "i",
                                          "mark", "span", "strong", "u",  NULL};

static int fragment_space(char c)
{
    return (unsigned char)c <= 0x20 || c == 0x7f;
}

/* Appends the words of s to out, one space between them (asked for by
 * *space, never before the first). Past out's limit it puts the part of
 * the word that fits, cut on a character, and returns LOOM_ETOOLARGE. */
static int fragment_put(loom_buf *out, const char *s, int *space)
{
    int rc = 0;

    while (*s && rc == 0) {
        size_t n = 0, room;

        if (fragment_space(*s)) {
            *space = 1;
            s++;
            continue;
        }
        while (s[n] && !fragment_space(s[n]))
            n++;
        if (*space && out->len)
            rc = loom_buf_putc(out, ' ');
        *space = 0;
        room = out->max - out->len;
        if (rc == 0 && n > room) {
            loom_buf_put(out, s, loom__utf8_cut(s, n, room));
            rc = LOOM_ETOOLARGE;
        } else if (rc == 0) {
            rc = loom_buf_put(out, s, n);
        }
        s += n;
    }
    return rc;
}

int loom__html_fragment_text(const char *html, size_t len, loom_buf *out)
{
    htmlDocPtr doc;
    const xmlNode *top, *cur;
    int space = 0, rc = 0;

    if (len > (size_t)INT32_MAX)
        return loom__error_set(LOOM_ETOOLARGE, "HTML larger than 2 GiB");
    /* libxml2 builds no document from an empty fragment: no text. */
    if (len == 0 || !(doc = read_html(html, len, NULL, "UTF-8")))
        return 0;
    /* The walk of walk(), reduced to text and word breaks. */
    top = (const xmlNode *)doc;
    cur = top->children;
    while (cur && rc == 0) {
        if (cur->type == XML_ELEMENT_NODE) {
            if (!name_in(cur, inline_tags))
                space = 1;
            if (cur->children) {
                cur = cur->children;
                continue;
            }
        } else if ((cur->type == XML_TEXT_NODE ||
                    cur->type == XML_CDATA_SECTION_NODE) &&
                   cur->content) {
            rc = fragment_put(out, (const char *)cur->content, &space);
        }
        while (cur != top && !cur->next) {
            cur = cur->parent;
            if (cur->type == XML_ELEMENT_NODE && !name_in(cur, inline_tags))
                space = 1;
        }
        if (cur == top)
            break;
        cur = cur->next;
    }
    xmlFreeDoc(doc);
    if (rc == LOOM_ETOOLARGE)
        return loom__error_set(rc, "the text passed %zu bytes", out->max);
    return rc ? loom__error_oom() : 0;
}
