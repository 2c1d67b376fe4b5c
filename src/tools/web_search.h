/*
 * tools/web_search.h: the web_search built-in tool and the helpers the run
 * loop needs around it.
 *
 * web_search asks one of four search backends (SearXNG, Tavily, Brave
 * Search, Exa; chosen in the tool's settings) and gives the model the
 * results in one shape: id, title, url, snippet and, when known, the
 * published date. The id is a short hash of the URL, so the same page has
 * the same id whichever backend found it; the run uses ids for citations
 * and for the "seen documents" set it passes back as excluded_ids.
 */
#ifndef LOOM_TOOLS_WEB_SEARCH_H
#define LOOM_TOOLS_WEB_SEARCH_H

#include "loom/tools.h"

#include <jansson.h>
#include <stddef.h>

/* Limits of the arguments (the schema says the same). */
#define LOOM_WEB_SEARCH_DEFAULT_RESULTS 5
#define LOOM_WEB_SEARCH_MAX_RESULTS 20
#define LOOM_WEB_SEARCH_QUERY_MAX 1000     /* code points */
#define LOOM_WEB_SEARCH_EXCLUDED_MAX 500   /* excluded_ids entries */
#define LOOM_WEB_SEARCH_EXCLUDED_ID_MAX 64 /* bytes per excluded id */

/* Size of an id with its terminator: "ws_" and 12 hex digits. */
#define LOOM_WEB_SEARCH_ID_SIZE 16

/*
 * Registers the web_search tool. It owns an HTTP connection pool, freed
 * with the tool. LOOM_EEXISTS when a tool of that name is there already,
 * LOOM_ENOMEM, LOOM_ERROR when libcurl fails to start.
 */
int loom__tools_add_web_search(loom_tool_registry *reg);

/*
 * Writes the id of url into out: "ws_" and 12 hex digits of a hash of the
 * URL with its fragment dropped and its scheme and host in lower case.
 * Never fails; a NULL url hashes as "".
 */
void loom__web_search_url_id(const char *url,
                             char out[LOOM_WEB_SEARCH_ID_SIZE]);

/*
 * Parses a 2xx answer body of backend ("searxng", "tavily", "brave" or
 * "exa") into *out, a new array of documents {id, title, url, snippet,
 * published} (published is null when unknown). Titles and snippets are
 * cleaned (tags dropped, whitespace collapsed) and cut; results without a
 * usable http(s) URL are skipped, duplicates (same id) kept once, at most
 * 100 kept. LOOM_EPROTO with a message for malformed JSON or an answer
 * without its results list, LOOM_EINVALID for an unknown backend.
 */
int loom__web_search_parse_response(json_t **out, const char *backend,
                                    const char *body, size_t len);

/*
 * Extracts the documents of a successful web_search result text (what the
 * tool wrote for the model) into *out, a new array of {id, title, url,
 * snippet, published} in the order the model saw them, for the run's
 * citation map and seen documents. LOOM_ENOTFOUND when text holds no
 * result list (an error result), LOOM_EPROTO when the list is malformed.
 */
int loom__web_search_documents(json_t **out, const char *text);

#endif
