/*
 * The citation map of a run and the answer checker (see citations.h and
 * docs/citations.md).
 *
 * The map is an array of documents in first-seen order, so a number is an
 * index plus one, and a jansson object used as a hash table from "i:"+id
 * and "u:"+url to the number, for deduplication in constant time.
 *
 * The checker is a hand-written single pass over the answer: no library
 * reads Markdown the way this needs (only enough of it to know where code
 * is, with everything else copied byte for byte), and a regular
 * expression cannot tell a citation from a code span or an index. It
 * copies the text into a bounded buffer, rewriting only the markers it
 * accepts.
 */
#include "agent/citations.h"
#include "core/error.h"
#include "core/utf8.h"
#include "loom/buf.h"
#include "tools/web_search.h"

#include <stdlib.h>
#include <string.h>

struct loom__citations {
    loom__citation_doc *docs;
    size_t len, cap;
    size_t max;
    json_t *index; /* "i:<id>" / "u:<url>" -> number */
};

/* Backticks in a run longer than this are plain text (see skip_code). */
#define CODE_RUN_MAX 32

#define ANNOTATION_HEAD                                                      \
    "Citation numbers for the results above (cite a source as [n], "         \
    "several as [1][2]):\n"

/* ---- helpers ------------------------------------------------------------- */

/* A copy of at most max bytes of s (cut on a character), or NULL for a
 * NULL s. *oom is set when the copy could not be made. */
static char *dup_cut(const char *s, size_t max, int *oom)
{
    char *p;

    if (!s)
        return NULL;
    p = strndup(s, loom__utf8_cut(s, strlen(s), max));
    if (!p)
        *oom = 1;
    return p;
}

static const char *member_str(const json_t *doc, const char *key)
{
    const char *s = json_string_value(json_object_get(doc, key));

    return s && *s ? s : NULL;
}

static void doc_clear(loom__citation_doc *d)
{
    free(d->id);
    free(d->url);
    free(d->title);
    free(d->published);
    free(d->tool_call_id);
    free(d->researcher);
    memset(d, 0, sizeof(*d));
}

/* The number under "<prefix><key>", or 0. */
static size_t lookup(const loom__citations *map, const char *prefix,
                     const char *key)
{
    char *k;
    json_int_t n;

    if (!key || asprintf(&k, "%s%s", prefix, key) < 0)
        return 0;
    n = json_integer_value(json_object_get(map->index, k));
    free(k);
    return n > 0 ? (size_t)n : 0;
}

/* Records "<prefix><key>" -> number unless the key is there already. */
static int remember(loom__citations *map, const char *prefix,
                    const char *key, size_t number)
{
    char *k;
    int rc = 0;

    if (!key)
        return 0;
    if (asprintf(&k, "%s%s", prefix, key) < 0)
        return loom__error_oom();
    if (!json_object_get(map->index, k) &&
        json_object_set_new_nocheck(map->index, k,
                                    json_integer((json_int_t)number)) != 0)
        rc = loom__error_oom();
    free(k);
    return rc;
}

/* ---- the map ------------------------------------------------------------- */

int loom__citations_new(loom__citations **out, size_t max_documents)
{
    loom__citations *map = calloc(1, sizeof(*map));

    *out = NULL;
    if (!map || !(map->index = json_object())) {
        free(map);
        return loom__error_oom();
    }
    map->max = max_documents ? max_documents
                             : LOOM_CITATIONS_DEFAULT_MAX_DOCUMENTS;
    if (map->max > LOOM_CITATIONS_MAX_DOCUMENTS)
        map->max = LOOM_CITATIONS_MAX_DOCUMENTS;
    *out = map;
    return 0;
}

void loom__citations_free(loom__citations *map)
{
    if (!map)
        return;
    for (size_t i = 0; i < map->len; i++)
        doc_clear(&map->docs[i]);
    free(map->docs);
    json_decref(map->index);
    free(map);
}

size_t loom__citations_count(const loom__citations *map)
{
    return map ? map->len : 0;
}

const loom__citation_doc *loom__citations_get(const loom__citations *map,
                                              size_t n)
{
    if (!map || n == 0 || n > map->len)
        return NULL;
    return &map->docs[n - 1];
}

int loom__citations_add(loom__citations *map, const json_t *doc,
                        const char *tool_call_id, size_t *number)
{
    const char *id = member_str(doc, "id"), *url = member_str(doc, "url");
    loom__citation_doc d;
    size_t n;
    int oom = 0, rc;

    *number = 0;
    if (!id && !url)
        return loom__error_set(LOOM_EINVALID, "the source has no id or url");
    if (id && strlen(id) > LOOM_CITATIONS_ID_MAX)
        return loom__error_set(LOOM_EINVALID,
                               "the source's id is longer than %d bytes",
                               LOOM_CITATIONS_ID_MAX);
    if (url && strlen(url) > LOOM_CITATIONS_URL_MAX)
        return loom__error_set(LOOM_EINVALID,
                               "the source's url is longer than %d bytes",
                               LOOM_CITATIONS_URL_MAX);
    n = lookup(map, "i:", id);
    if (!n)
        n = lookup(map, "u:", url);
    if (n) {
        /* Seen before: the other key becomes an alias of the source. */
        if ((rc = remember(map, "i:", id, n)) != 0 ||
            (rc = remember(map, "u:", url, n)) != 0)
            return rc;
        *number = n;
        return 0;
    }
    if (map->len >= map->max)
        return loom__error_set(LOOM_ETOOLARGE,
                               "the run has numbered %zu sources, its limit",
                               map->max);
    if (map->len == map->cap) {
        size_t cap = map->cap ? map->cap * 2 : 16;
        loom__citation_doc *p = realloc(map->docs, cap * sizeof(*p));
        if (!p)
            return loom__error_oom();
        map->docs = p;
        map->cap = cap;
    }
    memset(&d, 0, sizeof(d));
    d.number = map->len + 1;
    d.id = dup_cut(id, LOOM_CITATIONS_ID_MAX, &oom);
    d.url = dup_cut(url, LOOM_CITATIONS_URL_MAX, &oom);
    d.title = dup_cut(member_str(doc, "title") ? member_str(doc, "title")
                                               : "",
                      LOOM_CITATIONS_TITLE_MAX, &oom);
    d.published = dup_cut(member_str(doc, "published"),
                          LOOM_CITATIONS_PUBLISHED_MAX, &oom);
    d.tool_call_id = dup_cut(tool_call_id && *tool_call_id ? tool_call_id
                                                           : NULL,
                             LOOM_CITATIONS_CALL_ID_MAX, &oom);
    d.researcher =
        dup_cut(member_str(doc, "researcher"), LOOM_CITATIONS_TITLE_MAX, &oom);
    if (oom || (rc = remember(map, "i:", id, d.number)) != 0 ||
        (rc = remember(map, "u:", url, d.number)) != 0) {
        /* Take back the keys of this number so the map is unchanged. */
        char *k;
        if (id && asprintf(&k, "i:%s", id) >= 0) {
            json_object_del(map->index, k);
            free(k);
        }
        doc_clear(&d);
        return loom__error_oom();
    }
    map->docs[map->len++] = d;
    *number = d.number;
    return 0;
}

/* A name the model may read outside the tool's markers: a short token. */
static int safe_token(const char *s)
{
    size_t n = s ? strlen(s) : 0;

    if (n == 0 || n > 64)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || strchr("_.:-", c)))
            return 0;
    }
    return 1;
}

int loom__citations_annotate(loom__citations *map, const json_t *docs,
                             const char *tool_call_id, char **out)
{
    loom_buf b = LOOM_BUF_INIT(LOOM_BUF_UNLIMITED);
    size_t i, n, unnumbered = 0, lines = 0;
    size_t *shown = NULL;
    const json_t *d;
    int rc = 0;

    *out = NULL;
    if (!json_is_array(docs) || json_array_size(docs) == 0)
        return 0;
    /* A source listed twice in one result is shown once. */
    shown = calloc(json_array_size(docs), sizeof(*shown));
    if (!shown)
        return loom__error_oom();
    json_array_foreach(docs, i, d) {
        const char *id = member_str(d, "id");
        int dup = 0;

        rc = loom__citations_add(map, d, tool_call_id, &n);
        if (rc == LOOM_ENOMEM)
            goto cleanup;
        if (rc) {
            rc = 0;
            unnumbered++;
            continue;
        }
        for (size_t j = 0; j < lines && !dup; j++)
            dup = shown[j] == n;
        if (dup)
            continue;
        if (lines++ == 0 && (rc = loom_buf_puts(&b, ANNOTATION_HEAD)) != 0)
            goto cleanup;
        shown[lines - 1] = n;
        rc = safe_token(id) ? loom_buf_printf(&b, "[%zu] %s\n", n, id)
                            : loom_buf_printf(&b, "[%zu] result %zu\n", n,
                                              i + 1);
        if (rc)
            goto cleanup;
    }
    if (unnumbered &&
        (rc = loom_buf_printf(&b,
                              "%zu result%s ha%s no citation number and "
                              "cannot be cited.\n",
                              unnumbered, unnumbered == 1 ? "" : "s",
                              unnumbered == 1 ? "s" : "ve")) != 0)
        goto cleanup;
    if (!b.len)
        goto cleanup;
    /* Without the final newline: the run joins it to the result. */
    b.ptr[--b.len] = '\0';
    if (!(*out = loom_buf_detach(&b)))
        rc = loom__error_oom();
cleanup:
    free(shown);
    loom_buf_free(&b);
    return rc;
}

int loom__citations_seed(loom__citations *map, const loom_message *msgs,
                         size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const loom_message *m = &msgs[i];
        json_t *docs = NULL, *d;
        size_t k, num;
        int rc = 0;

        if (m->role != LOOM_ROLE_TOOL || !m->name ||
            strcmp(m->name, "web_search") != 0 || !m->content ||
            loom__web_search_documents(&docs, m->content) != 0)
            continue;
        json_array_foreach(docs, k, d) {
            rc = loom__citations_add(map, d, m->tool_call_id, &num);
            if (rc == LOOM_ENOMEM)
                break;
            rc = 0;
        }
        json_decref(docs);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- the checker --------------------------------------------------------- */

typedef struct {
    const char *s;
    size_t len;
    size_t count;          /* valid numbers are 1..count */
    loom_buf out;
    loom__citations_checked *res;
    size_t cap_numbers;
    unsigned char *used;   /* used[n]: n is in res->numbers */
    size_t used_size;
    size_t cite_end;       /* where the last citation marker ended */
    size_t index_end;      /* where the last index `x[..]` ended */
    int no_close[CODE_RUN_MAX + 1]; /* no closing run of that length */
} checker;

/* A parsed `[...]`: its numbers in order, its length. */
typedef struct {
    size_t nums[LOOM_CITATIONS_MARKER_NUMBERS];
    size_t n;
    size_t end; /* index just past `]` */
} marker;

static int is_word(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || c == '_' || c == ')';
}

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static size_t skip_blank(const char *s, size_t i, size_t end)
{
    while (i < end && (s[i] == ' ' || s[i] == '\t'))
        i++;
    return i;
}

/* Reads a number of 1..NUMBER_DIGITS digits at *i; -1 when none. */
static long read_number(const char *s, size_t *i, size_t end)
{
    size_t k = *i;
    long v = 0;

    while (k < end && is_digit(s[k])) {
        if (k - *i >= LOOM_CITATIONS_NUMBER_DIGITS)
            return -1;
        v = v * 10 + (s[k] - '0');
        k++;
    }
    if (k == *i)
        return -1;
    *i = k;
    return v;
}

/* A range dash at *i: '-' or an en dash (U+2013). */
static int read_dash(const char *s, size_t *i, size_t end)
{
    if (*i < end && s[*i] == '-') {
        (*i)++;
        return 1;
    }
    if (*i + 3 <= end && memcmp(s + *i, "\xE2\x80\x93", 3) == 0) {
        *i += 3;
        return 1;
    }
    return 0;
}

/*
 * Parses a marker at s[i] == '[': items `n` or `n-m` separated by ',' or
 * ';', blanks allowed around each. 0 when it is one, -1 when not.
 */
static int parse_marker(const char *s, size_t i, size_t len, marker *m)
{
    size_t end = len - i > LOOM_CITATIONS_MARKER_MAX
                     ? i + LOOM_CITATIONS_MARKER_MAX
                     : len;
    size_t k = i + 1;

    m->n = 0;
    for (;;) {
        long a, b;
        k = skip_blank(s, k, end);
        if ((a = read_number(s, &k, end)) < 0)
            return -1;
        b = a;
        k = skip_blank(s, k, end);
        if (read_dash(s, &k, end)) {
            k = skip_blank(s, k, end);
            if ((b = read_number(s, &k, end)) < a)
                return -1;
            k = skip_blank(s, k, end);
        }
        if ((size_t)(b - a) >= LOOM_CITATIONS_MARKER_NUMBERS - m->n)
            return -1;
        for (long v = a; v <= b; v++)
            m->nums[m->n++] = (size_t)v;
        if (k < end && (s[k] == ',' || s[k] == ';')) {
            k++;
            continue;
        }
        if (k < end && s[k] == ']') {
            m->end = k + 1;
            return 0;
        }
        return -1;
    }
}

/* Notes that number n was cited. */
static int use_number(checker *c, size_t n)
{
    loom__citations_checked *r = c->res;

    if (c->used[n])
        return 0;
    if (r->numbers_len == c->cap_numbers) {
        size_t cap = c->cap_numbers ? c->cap_numbers * 2 : 8;
        size_t *p = realloc(r->numbers, cap * sizeof(*p));
        if (!p)
            return loom__error_oom();
        r->numbers = p;
        c->cap_numbers = cap;
    }
    r->numbers[r->numbers_len++] = n;
    c->used[n] = 1;
    return 0;
}

/* At a line start i: a code fence (up to 3 spaces, then 3 or more of `
 * or ~). Returns its length, with its character in *ch and the index past
 * it in *after; 0 when there is none. */
static size_t fence_at(const char *s, size_t i, size_t len, char *ch,
                       size_t *after)
{
    size_t k = i, n = 0;

    while (k < len && k - i < 3 && s[k] == ' ')
        k++;
    if (k >= len || (s[k] != '`' && s[k] != '~'))
        return 0;
    *ch = s[k];
    while (k + n < len && s[k + n] == *ch)
        n++;
    *after = k + n;
    return n >= 3 ? n : 0;
}

static size_t line_end(const char *s, size_t i, size_t len)
{
    const char *nl = memchr(s + i, '\n', len - i);

    return nl ? (size_t)(nl - s) + 1 : len;
}

/*
 * From a fence opening at the line starting at i: the index past the
 * closing fence line (same character, at least as long, nothing but
 * blanks after it), or the end of the text when none.
 */
static size_t skip_fenced(const char *s, size_t i, size_t len, char ch,
                          size_t flen)
{
    size_t k = line_end(s, i, len);

    while (k < len) {
        char c2;
        size_t after, e = line_end(s, k, len);
        size_t n = fence_at(s, k, len, &c2, &after);
        if (n >= flen && c2 == ch) {
            size_t t = skip_blank(s, after, e);
            if (t == e || s[t] == '\n' || s[t] == '\r')
                return e;
        }
        k = e;
    }
    return len;
}

/*
 * At a run of backticks at i: the index past the matching closing run
 * (the same number of backticks), or i plus the run when there is none
 * (the backticks are then plain text). A failed search is remembered per
 * run length, so that text full of unmatched backticks stays linear.
 */
static size_t skip_code(checker *c, size_t i)
{
    const char *s = c->s;
    size_t n = 0, k;

    while (i + n < c->len && s[i + n] == '`')
        n++;
    if (n > CODE_RUN_MAX || c->no_close[n])
        return i + n;
    for (k = i + n; k < c->len;) {
        size_t m = 0;
        if (s[k] != '`') {
            k++;
            continue;
        }
        while (k + m < c->len && s[k + m] == '`')
            m++;
        if (m == n)
            return k + m;
        k += m;
    }
    c->no_close[n] = 1;
    return i + n;
}

static int put(checker *c, const char *p, size_t n)
{
    return loom_buf_put(&c->out, p, n);
}

/* Drops the blanks that end the output (not past its last newline). */
static void trim_blanks(checker *c)
{
    while (c->out.len > 0 && (c->out.ptr[c->out.len - 1] == ' ' ||
                              c->out.ptr[c->out.len - 1] == '\t'))
        c->out.ptr[--c->out.len] = '\0';
}

/*
 * Handles `[` at i. Returns the index to continue from (after the
 * marker, or i + 1 with the `[` copied when it is no citation), or a
 * negative error.
 */
static long bracket(checker *c, size_t i, int line_start)
{
    const char *s = c->s;
    marker m;
    unsigned char prev = i ? (unsigned char)s[i - 1] : 0;
    int attached, any_bad = 0, rc;
    size_t kept = 0, after;
    char nb[32];

    if (parse_marker(s, i, c->len, &m) != 0)
        goto literal;
    after = m.end;
    /* A link `[1](url)`, or a reference definition `[1]: url`. */
    if (after < c->len && s[after] == '(')
        goto literal;
    if (line_start && after < c->len && s[after] == ':')
        goto literal;
    /* Right after a word, `)` or an index's `]`: an index, unless it is
     * a valid citation; right after a citation's `]`: a citation. */
    attached = i > 0 && (is_word(prev) ||
                         (prev == ']' && c->cite_end != i));
    if (prev == ']' && c->index_end == i)
        goto index;
    for (size_t k = 0; k < m.n; k++)
        any_bad |= m.nums[k] == 0 || m.nums[k] > c->count;
    if (attached && any_bad)
        goto index;
    c->res->markers++;
    c->cite_end = after;
    /* Canonical is one number written `[n]`; anything else is rewritten. */
    if (m.n != 1 || any_bad ||
        (size_t)snprintf(nb, sizeof(nb), "[%zu]", m.nums[0]) != after - i ||
        memcmp(nb, s + i, after - i) != 0)
        c->res->rewritten++;
    for (size_t k = 0; k < m.n; k++) {
        size_t v = m.nums[k];
        int seen = 0;
        if (v == 0 || v > c->count) {
            c->res->dropped++;
            continue;
        }
        for (size_t j = 0; j < k && !seen; j++)
            seen = m.nums[j] == v;
        if (seen)
            continue;
        kept++;
        if ((rc = use_number(c, v)) != 0 ||
            (rc = loom_buf_printf(&c->out, "[%zu]", v)) != 0)
            return rc;
    }
    if (!kept && (after >= c->len ||
                  (s[after] && strchr(" \t\r\n.,;:!?)", s[after]))))
        trim_blanks(c);
    return (long)after;
index:
    c->index_end = m.end;
    if ((rc = put(c, s + i, m.end - i)) != 0)
        return rc;
    return (long)m.end;
literal:
    if ((rc = put(c, "[", 1)) != 0)
        return rc;
    return (long)i + 1;
}

static int check_text(checker *c)
{
    const char *s = c->s;
    size_t i = 0;
    int line_start = 1, rc;

    while (i < c->len) {
        size_t j;
        long r;
        char ch;

        if (line_start) {
            size_t flen = fence_at(s, i, c->len, &ch, &j);
            if (flen) {
                j = skip_fenced(s, i, c->len, ch, flen);
                if ((rc = put(c, s + i, j - i)) != 0)
                    return rc;
                i = j;
                continue;
            }
        }
        switch (s[i]) {
        case '`':
            j = skip_code(c, i);
            if ((rc = put(c, s + i, j - i)) != 0)
                return rc;
            i = j;
            line_start = 0;
            continue;
        case '\\':
            j = i + 1 < c->len ? i + 2 : i + 1;
            if ((rc = put(c, s + i, j - i)) != 0)
                return rc;
            line_start = s[j - 1] == '\n';
            i = j;
            continue;
        case '[':
            /* A reference definition may be indented up to 3 spaces. */
            j = i;
            while (j > 0 && i - j < 3 && s[j - 1] == ' ')
                j--;
            if ((r = bracket(c, i, j == 0 || s[j - 1] == '\n')) < 0)
                return (int)r;
            i = (size_t)r;
            line_start = 0;
            continue;
        default:
            if ((rc = put(c, s + i, 1)) != 0)
                return rc;
            line_start = s[i] == '\n';
            i++;
        }
    }
    return 0;
}

int loom__citations_check(size_t count, const char *text, size_t len,
                          size_t max_text, loom__citations_checked *out)
{
    checker c;
    int rc;

    memset(out, 0, sizeof(*out));
    if (!max_text)
        max_text = LOOM_CITATIONS_DEFAULT_MAX_TEXT;
    if (len > max_text)
        return loom__error_set(LOOM_ETOOLARGE,
                               "the answer is %zu bytes, more than the %zu "
                               "checked for citations",
                               len, max_text);
    memset(&c, 0, sizeof(c));
    c.s = text ? text : "";
    c.len = text ? len : 0;
    /* Numbers past the marker's digits never occur: no need to mark. */
    c.count = count;
    c.used_size = count < 999 ? count + 1 : 1000;
    c.res = out;
    c.cite_end = c.index_end = (size_t)-1;
    loom_buf_init(&c.out, max_text * 2);
    if (!(c.used = calloc(c.used_size, 1))) {
        rc = loom__error_oom();
        goto cleanup;
    }
    if ((rc = check_text(&c)) != 0) {
        if (rc == LOOM_ETOOLARGE)
            rc = loom__error_set(rc,
                                 "the answer with its citations split "
                                 "passes %zu bytes",
                                 max_text * 2);
        goto cleanup;
    }
    /* The length before detaching: the text may hold NUL bytes. */
    out->text_len = c.out.len;
    if ((rc = loom_buf_put(&c.out, "", 0)) != 0 ||
        !(out->text = loom_buf_detach(&c.out))) {
        rc = rc ? rc : loom__error_oom();
        goto cleanup;
    }
cleanup:
    free(c.used);
    loom_buf_free(&c.out);
    if (rc)
        loom__citations_checked_clear(out);
    return rc;
}

void loom__citations_checked_clear(loom__citations_checked *c)
{
    if (!c)
        return;
    free(c->text);
    free(c->numbers);
    memset(c, 0, sizeof(*c));
}

/* ---- JSON ---------------------------------------------------------------- */

static json_t *str_or_null(const char *s)
{
    return s ? json_string(s) : json_null();
}

json_t *loom__citation_json(const loom__citations *map, size_t n)
{
    const loom__citation_doc *d = loom__citations_get(map, n);
    json_t *o;

    if (!d)
        return NULL;
    o = json_pack("{s:I, s:o, s:o, s:s, s:o, s:o}", "number",
                  (json_int_t)d->number, "id", str_or_null(d->id), "url",
                  str_or_null(d->url), "title", d->title ? d->title : "",
                  "published", str_or_null(d->published), "tool_call_id",
                  str_or_null(d->tool_call_id));
    if (o && d->researcher &&
        json_object_set_new(o, "researcher", json_string(d->researcher))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *loom__citations_used_json(const loom__citations *map,
                                  const loom__citations_checked *c)
{
    json_t *arr = json_array();

    if (!arr)
        return NULL;
    for (size_t i = 0; c && i < c->numbers_len; i++) {
        json_t *o;
        if (!loom__citations_get(map, c->numbers[i]))
            continue;
        if (!(o = loom__citation_json(map, c->numbers[i])) ||
            json_array_append_new(arr, o) != 0) {
            json_decref(arr);
            return NULL;
        }
    }
    return arr;
}
