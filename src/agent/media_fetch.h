/*
 * Internal: the images and files a run fetches itself, for a provider
 * that must get their bytes rather than their address (Gemini; see
 * loom_llm_request.media_fetch).
 *
 * A client's image URL is an address on loom's network chosen by
 * somebody else, so it is fetched exactly as web_fetch fetches a model's
 * URL: under the same network policy (tools.web_fetch's allow_hosts and
 * allow_ports, the SSRF guard of tools/netguard.h: every resolved address
 * checked, the connection pinned, redirects checked again), at most
 * LOOM__MEDIA_FETCH_MAX_BYTES and LOOM__MEDIA_FETCH_TIMEOUT_MS. What a
 * run fetched it keeps, so a URL is fetched once per run however many
 * model calls send it again.
 */
#ifndef LOOM_AGENT_MEDIA_FETCH_H
#define LOOM_AGENT_MEDIA_FETCH_H

#include "loom/cancel.h"
#include "loom/message.h"

#include <jansson.h>

/* An image or file fetched: the chat API's limit on one given inline. */
#define LOOM__MEDIA_FETCH_MAX_BYTES ((size_t)8 << 20)
/* One fetch, redirects included. */
#define LOOM__MEDIA_FETCH_TIMEOUT_MS 20000L

/* What one run fetched, and why a fetch failed. */
typedef struct loom__media_fetcher loom__media_fetcher;

/*
 * A fetcher under the policy of settings (the tools.web_fetch settings
 * object, may be NULL: the default policy), stopping when cancel is set
 * (may be NULL). Both are borrowed. LOOM_ENOMEM.
 */
int loom__media_fetcher_new(loom__media_fetcher **out, const json_t *settings,
                            loom_cancel *cancel);
void loom__media_fetcher_free(loom__media_fetcher *f);

/*
 * loom_media_fetch_fn over a fetcher (payload). Failures, with a message
 * naming the URL: LOOM_EINVALID when loom refuses the URL (the policy: a
 * private or loopback address, a port not allowed, not http(s), directly
 * or by a redirect; too many redirects; a body past the limit; an answer
 * that is not an image or a PDF as kind wants)
 * and LOOM_EIO when the fetch failed (no such name, a connection or TLS
 * failure, a time limit, an HTTP status other than 2xx); LOOM_ECANCELED.
 */
int loom__media_fetch(void *payload, const char *url, loom_part_kind kind,
                      char **data, char **mime);

/*
 * Why the last fetch failed, as an error code for run.failed:
 * "image_url_refused" (LOOM_EINVALID above), "image_fetch_failed"
 * (LOOM_EIO), or NULL when no fetch failed.
 */
const char *loom__media_fetch_failure(const loom__media_fetcher *f);

#endif
