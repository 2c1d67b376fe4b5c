/*
 * Internal: the citation map of a run, and the check of an answer's
 * citation markers.
 *
 * Sources that tools return (web_search documents: id, title, url,
 * published) get stable numbers 1..N in the order the run first sees
 * them; the same document seen again (same id, or same URL) keeps its
 * number. After each such tool result the run appends an annotation that
 * tells the model which number each result has, so the model can write
 * `[n]`. When the answer is complete, the checker reads its markers,
 * splits grouped and ranged ones (`[1,2]`, `[1-3]` become `[1][2]`,
 * `[1][2][3]`), drops numbers that name no source, and lists the numbers
 * used, for `citation` events and for storing with the message.
 *
 * The checker works on the final text only: markers may be split across
 * stream deltas, and the deltas have been emitted by then; see
 * docs/citations.md for why and for every rule of what counts as a
 * marker. Nothing here does I/O; the map is not thread-safe (the run
 * uses it from its own thread only).
 */
#ifndef LOOM_AGENT_CITATIONS_H
#define LOOM_AGENT_CITATIONS_H

#include "loom/common.h"
#include "loom/llm.h"

#include <jansson.h>
#include <stddef.h>

/* Sources one run may number, unless the map is made with another. */
#define LOOM_CITATIONS_DEFAULT_MAX_DOCUMENTS 500
/* Bytes of a document id, and of its URL; a longer one is refused. */
#define LOOM_CITATIONS_ID_MAX 256
#define LOOM_CITATIONS_URL_MAX 4096
/* Bytes kept of a title, of a published date and of a tool call id. */
#define LOOM_CITATIONS_TITLE_MAX 512
#define LOOM_CITATIONS_PUBLISHED_MAX 64
#define LOOM_CITATIONS_CALL_ID_MAX 256
/* Bytes of answer text checked, unless the caller gives another limit;
 * the checked text may grow to twice the limit (ranges expand). */
#define LOOM_CITATIONS_DEFAULT_MAX_TEXT (1024 * 1024)
/* One marker: at most this many bytes from `[` to `]`, and this many
 * numbers once its ranges are expanded; a longer one is no citation. */
#define LOOM_CITATIONS_MARKER_MAX 128
#define LOOM_CITATIONS_MARKER_NUMBERS 32
/* Digits of one number in a marker; more is no citation (a year such as
 * [2024] is left alone). So a map numbers at most 999 sources. */
#define LOOM_CITATIONS_NUMBER_DIGITS 3
#define LOOM_CITATIONS_MAX_DOCUMENTS 999

/* One numbered source. Every string is owned by the map. */
typedef struct {
    size_t number;       /* 1..N */
    char *id;            /* the tool's document id, or NULL */
    char *url;           /* or NULL; a source has an id or a URL */
    char *title;         /* "" when the tool gave none */
    char *published;     /* as the tool gave it, or NULL */
    char *tool_call_id;  /* the call whose result first held it, or NULL */
    char *researcher;    /* a research run's: the task of the researcher
                          * that found it, or NULL */
} loom__citation_doc;

typedef struct loom__citations loom__citations;

/*
 * Makes an empty map that numbers at most max_documents sources (0:
 * LOOM_CITATIONS_DEFAULT_MAX_DOCUMENTS; more than
 * LOOM_CITATIONS_MAX_DOCUMENTS: that). LOOM_ENOMEM.
 */
int loom__citations_new(loom__citations **out, size_t max_documents);

/* Frees the map and its documents; NULL is a no-op. */
void loom__citations_free(loom__citations *map);

/* Sources numbered so far (the highest valid number). */
size_t loom__citations_count(const loom__citations *map);

/* Source number n (1..count), or NULL. Borrowed from the map. */
const loom__citation_doc *loom__citations_get(const loom__citations *map,
                                              size_t n);

/*
 * Numbers one document, a JSON object with string members id and/or url,
 * and optional title, published and researcher (other members and
 * non-string values are ignored). A document whose id or URL the map has seen
 * keeps that number (*number gets it) and its first record; its other key then
 * names the same source. tool_call_id (may be NULL) is kept with a new
 * source. LOOM_EINVALID when doc has neither a non-empty id nor url, or
 * one longer than LOOM_CITATIONS_ID_MAX / LOOM_CITATIONS_URL_MAX;
 * LOOM_ETOOLARGE when the source is new and the map is full; LOOM_ENOMEM.
 * The map is unchanged on error (but for an alias key recorded before
 * memory ran out).
 */
int loom__citations_add(loom__citations *map, const json_t *doc,
                        const char *tool_call_id, size_t *number);

/*
 * The hook for a tool result: numbers every document of docs (a JSON
 * array of document objects, in the order the model saw them, such as
 * loom__web_search_documents gives) and writes into *out the annotation
 * the run appends to the result text, one line per source:
 *
 *     Citation numbers for the results above (cite a source as [n], ...):
 *     [1] ws_c7244eb2f8e0
 *     [3] result 2
 *
 * A source is named by its id when that is a short token (letters,
 * digits, `_.:-`, at most 64 bytes), else by its position in docs:
 * titles and URLs are untrusted text and are never repeated outside the
 * tool's own markers. Documents that cannot be numbered (no id or URL,
 * too long, map full) are left out, and a last line says how many.
 * *out is NULL (and 0 returned) when docs is empty or not an array.
 * Returns 0 or LOOM_ENOMEM; the caller frees *out.
 */
int loom__citations_annotate(loom__citations *map, const json_t *docs,
                             const char *tool_call_id, char **out);

/*
 * Numbers the sources of an earlier conversation (the history a run is
 * given) in the order the runs that made it numbered them, so that the
 * numbers in its stored annotations and answers keep naming the same
 * sources: every successful web_search result among msgs (role tool,
 * name "web_search"), read with loom__web_search_documents, is added as
 * loom__citations_annotate would have added it. Sources of other tools
 * are not in the text in a form that can be read back, and are not
 * seeded. Returns 0 or LOOM_ENOMEM; a result that cannot be read, or a
 * full map, is skipped.
 */
int loom__citations_seed(loom__citations *map, const loom_message *msgs,
                         size_t n);

/* The outcome of a check. Owned by the caller; see _checked_clear. */
typedef struct {
    char *text;       /* the checked text, NUL-terminated */
    size_t text_len;
    size_t *numbers;  /* the numbers cited, each once, in order of first
                       * use; NULL when none */
    size_t numbers_len;
    size_t markers;   /* citation markers read (each `[...]` once) */
    size_t dropped;   /* numbers dropped: 0, or past the sources */
    size_t rewritten; /* markers written back in another form */
} loom__citations_checked;

/*
 * Checks the citation markers of text (len bytes; the final answer)
 * against count numbered sources, by the rules of docs/citations.md:
 * free-standing markers `[n]`, `[n,m]`, `[n-m]` (spaces allowed) are
 * written back as `[n][m]...`, numbers outside 1..count dropped (a marker
 * left empty goes, with the spaces before it when punctuation or the line
 * end follows); markers attached to a word (`x[1]`) count only when every
 * number is valid and are left as written otherwise; code spans, fenced
 * code, links `[1](url)`, reference definitions `[1]: url`, escaped
 * `\[1]` and anything else not of that form are copied unchanged.
 * max_text: bytes of text checked (0: LOOM_CITATIONS_DEFAULT_MAX_TEXT);
 * LOOM_ETOOLARGE when len passes it or the checked text passes twice it;
 * LOOM_ENOMEM. *out is zeroed first and filled only on success.
 */
int loom__citations_check(size_t count, const char *text, size_t len,
                          size_t max_text, loom__citations_checked *out);

/* Frees what a check filled; zeroes it. NULL is a no-op. */
void loom__citations_checked_clear(loom__citations_checked *c);

/*
 * The data of a `citation` event for source n: {number, id, url, title,
 * published, tool_call_id}, absent strings as null. NULL when n names no
 * source or out of memory. The caller owns the object.
 */
json_t *loom__citation_json(const loom__citations *map, size_t n);

/*
 * The sources a check found, as stored with the message: an array of
 * loom__citation_json objects in the order of c->numbers (numbers the map
 * does not hold are left out). NULL when out of memory.
 */
json_t *loom__citations_used_json(const loom__citations *map,
                                  const loom__citations_checked *c);

#endif
