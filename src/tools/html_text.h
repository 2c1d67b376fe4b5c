/*
 * tools/html_text.h: turning fetched bytes into text a model can read.
 *
 * HTML goes through libxml2's HTML parser (a real parser with error
 * recovery, never regular expressions) and comes out as markdown-ish
 * text: the headings as "#", paragraphs, lists as "-" or "1.", links as
 * [text](url), code as `code` and fenced blocks, tables as "a | b",
 * without scripts, styles, navigation, headers, footers, forms and
 * hidden elements. Other text is converted from its charset to UTF-8.
 * Everything that leaves here is valid UTF-8 without control characters
 * other than newline and tab.
 */
#ifndef LOOM_TOOLS_HTML_TEXT_H
#define LOOM_TOOLS_HTML_TEXT_H

#include "core/utf8.h" /* loom__utf8_count, for the counts of cut text */
#include "loom/buf.h"

#include <stddef.h>

/*
 * Parses len bytes of HTML and appends its readable text to out, the
 * page title first as "Title: ..." when there is one. charset is the
 * Content-Type's (it wins), or NULL: then <meta charset> or <meta
 * http-equiv>, then libxml2's guess. base_url resolves relative links
 * (a <base href> in the page takes over). When out reaches its limit the
 * text stops there and *truncated is set; that is not an error.
 * LOOM_ENOMEM, LOOM_EPROTO when libxml2 cannot build a document at all.
 */
int loom__html_to_text(const char *html, size_t len, const char *charset,
                       const char *base_url, loom_buf *out, int *truncated);

/*
 * Turns every "<tag" and "</tag" in len bytes of s (tag in any case) into
 * "[tag" and "[/tag", so text put inside a <tag> block that frames it as
 * untrusted cannot open or end such a block itself.
 */
void loom__html_defuse(char *s, size_t len, const char *tag);

/*
 * Appends the text of an HTML fragment (a search result's title or
 * snippet, UTF-8) to out on one line: tags dropped (an inline one such as
 * <strong> sits inside a word, any other separates words), entities
 * decoded, comments dropped, runs of whitespace and control characters
 * made one space, no space at either end. Parsed by libxml2's HTML
 * parser, as loom__html_to_text. Past out's limit, out keeps what fits
 * (cut on a character) and LOOM_ETOOLARGE is returned; LOOM_ENOMEM.
 */
int loom__html_fragment_text(const char *html, size_t len, loom_buf *out);

/*
 * Appends len bytes of text in charset (NULL: UTF-8, or windows-1252 when
 * the bytes are not valid UTF-8) to out as UTF-8, through iconv. Unknown
 * charsets are read as UTF-8; bytes that do not decode become U+FFFD.
 * LOOM_ETOOLARGE past out's limit.
 */
int loom__text_to_utf8(const char *data, size_t len, const char *charset,
                       loom_buf *out);

/* Appends data as valid UTF-8: invalid bytes become U+FFFD, CR LF
 * becomes LF, other control characters but tab and newline are dropped. */
int loom__utf8_sanitize(const char *data, size_t len, loom_buf *out);

/* Bytes of the longest prefix of s (valid UTF-8) holding at most
 * max_chars code points and max_bytes bytes, ending on a character. */
size_t loom__utf8_prefix(const char *s, size_t len, size_t max_chars,
                         size_t max_bytes);

/*
 * Splits a Content-Type value: the media type in lower case into mt
 * ("text/html"), its charset parameter (unquoted, or "" when absent)
 * into cs. Values that do not fit, or charsets with characters no
 * charset name has, are treated as absent.
 */
void loom__content_type_parse(const char *ct, char *mt, size_t mt_cap,
                              char *cs, size_t cs_cap);

#endif
