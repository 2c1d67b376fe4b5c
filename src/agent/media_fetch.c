/*
 * Images and files a run fetches for a provider that takes only bytes
 * (media_fetch.h): a URL from a client's message goes through the same
 * SSRF guard as web_fetch, the answer is checked to be what the part
 * says it is (an image, or a PDF), and its bytes go to the adapter as
 * base64. Each URL is fetched once per run and kept for the run's later
 * model calls.
 */
#include "agent/media_fetch.h"
#include "core/error.h"
#include "llm/parts.h"
#include "tools/netguard.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* A URL fetched earlier in the run. */
typedef struct {
    char *url, *data, *mime;
} fetched;

struct loom__media_fetcher {
    const json_t *settings;
    loom_cancel *cancel;
    loom__net_policy policy;
    int policy_read; /* 1 read, -1 the settings are wrong */
    fetched *done;
    size_t ndone;
    const char *failure;
    char user_agent[64];
};

static const char *const image_types[] = {"image/png", "image/jpeg",
                                          "image/gif", "image/webp", NULL};
static const char *const file_types[] = {"application/pdf", NULL};

int loom__media_fetcher_new(loom__media_fetcher **out, const json_t *settings,
                            loom_cancel *cancel)
{
    loom__media_fetcher *f = calloc(1, sizeof(*f));

    *out = NULL;
    if (!f)
        return loom__error_oom();
    f->settings = settings;
    f->cancel = cancel;
    loom__net_policy_init(&f->policy);
    snprintf(f->user_agent, sizeof(f->user_agent), "loom/%s (image fetch)",
             loom_version());
    *out = f;
    return 0;
}

void loom__media_fetcher_free(loom__media_fetcher *f)
{
    if (!f)
        return;
    for (size_t i = 0; i < f->ndone; i++) {
        free(f->done[i].url);
        free(f->done[i].data);
        free(f->done[i].mime);
    }
    free(f->done);
    loom__net_policy_clear(&f->policy);
    free(f);
}

const char *loom__media_fetch_failure(const loom__media_fetcher *f)
{
    return f ? f->failure : NULL;
}

/* Ends a fetch of url with code and a message naming the URL and why
 * (copied first: it may be the message of the last error). */
static int fail(loom__media_fetcher *f, int code, const char *url,
                const char *why)
{
    char w[512];

    snprintf(w, sizeof(w), "%s", why);
    f->failure =
        code == LOOM_EINVALID ? "image_url_refused" : "image_fetch_failed";
    return loom__error_set(code, "%s image URL '%s': %s",
                           code == LOOM_EINVALID ? "loom refused the"
                                                 : "could not fetch the",
                           url, w);
}

/* A URL loom does not fetch, or an answer it does not take. */
static int refused(loom__media_fetcher *f, const char *url, const char *why)
{
    return fail(f, LOOM_EINVALID, url, why);
}

/* A fetch that did not work out. */
static int failed(loom__media_fetcher *f, const char *url, const char *why)
{
    return fail(f, LOOM_EIO, url, why);
}

/* The media type of an answer: its Content-Type without parameters,
 * lower-cased, into buf; "" when absent. */
static const char *media_type(char *buf, size_t size, const char *header)
{
    size_t n = header ? strcspn(header, "; \t") : 0;

    if (n >= size)
        n = size - 1;
    for (size_t i = 0; i < n; i++)
        buf[i] = (char)(header[i] >= 'A' && header[i] <= 'Z' ? header[i] + 32
                                                             : header[i]);
    buf[n] = '\0';
    return buf;
}

static int listed(const char *type, const char *const *list)
{
    for (; *list; list++)
        if (strcmp(type, *list) == 0)
            return 1;
    return 0;
}

/* The answer's media type when kind takes it; a server that does not say
 * (or says application/octet-stream) is taken at the URL's extension. */
static const char *accepted_type(const loom__net_response *r, const char *url,
                                 loom_part_kind kind, char *buf, size_t size)
{
    const char *const *list = kind == LOOM_PART_FILE ? file_types : image_types;
    const char *type = media_type(buf, size, r->content_type);
    loom_part guess = {.kind = kind, .url = (char *)url};

    if (!*type || strcmp(type, "application/octet-stream") == 0)
        type = loom__part_mime(&guess);
    return listed(type, list) ? type : NULL;
}

/* Reads the policy from the settings on first use. */
static int read_policy(loom__media_fetcher *f)
{
    const json_t *s = f->settings;

    if (f->policy_read == 0)
        f->policy_read =
            json_is_object(s) &&
                    loom__net_policy_set(&f->policy,
                                         json_object_get(s, "allow_hosts"),
                                         json_object_get(s, "allow_ports"),
                                         "setting tools.web_fetch") != 0
                ? -1
                : 1;
    return f->policy_read;
}

/* Keeps what was fetched for url; LOOM_ENOMEM only. */
static int keep(loom__media_fetcher *f, const char *url, const char *data,
                const char *mime)
{
    fetched *d = realloc(f->done, (f->ndone + 1) * sizeof(*d));

    if (!d)
        return loom__error_oom();
    f->done = d;
    d = &f->done[f->ndone];
    d->url = strdup(url);
    d->data = strdup(data);
    d->mime = strdup(mime);
    if (!d->url || !d->data || !d->mime) {
        free(d->url);
        free(d->data);
        free(d->mime);
        return loom__error_oom();
    }
    f->ndone++;
    return 0;
}

/* Copies what was fetched for url before, if anything: 1 when found. */
static int recall(const loom__media_fetcher *f, const char *url, char **data,
                  char **mime, int *rc)
{
    for (size_t i = 0; i < f->ndone; i++)
        if (strcmp(f->done[i].url, url) == 0) {
            *data = strdup(f->done[i].data);
            *mime = strdup(f->done[i].mime);
            *rc = *data && *mime ? 0 : loom__error_oom();
            return 1;
        }
    return 0;
}

/* Checks the answer r to url and puts it in *data and *mime. */
static int take(loom__media_fetcher *f, const char *url, loom_part_kind kind,
                const loom__net_response *r, char **data, char **mime)
{
    char why[160], buf[64];
    const char *type;

    if (r->status < 200 || r->status >= 300) {
        snprintf(why, sizeof(why), "it answered HTTP %ld", r->status);
        return failed(f, url, why);
    }
    if (!(type = accepted_type(r, url, kind, buf, sizeof(buf)))) {
        snprintf(why, sizeof(why), "its answer is '%.60s', not %s",
                 r->content_type ? r->content_type : "of no type",
                 kind == LOOM_PART_FILE ? "a PDF"
                                        : "an image (PNG, JPEG, GIF or WebP)");
        return refused(f, url, why);
    }
    if (r->body.len > (size_t)INT32_MAX / 2)
        return refused(f, url, "its answer is too large");
    if (!(*mime = strdup(type)) ||
        !(*data = malloc((r->body.len + 2) / 3 * 4 + 1))) {
        free(*mime);
        *mime = NULL;
        return loom__error_oom();
    }
    EVP_EncodeBlock((unsigned char *)*data, (const unsigned char *)r->body.ptr,
                    (int)r->body.len);
    return 0;
}

int loom__media_fetch(void *payload, const char *url, loom_part_kind kind,
                      char **data, char **mime)
{
    loom__media_fetcher *f = payload;
    loom__net_request req = {0};
    loom__net_response resp = {0};
    loom__net_target t = {0};
    int rc;

    *data = *mime = NULL;
    if (recall(f, url, data, mime, &rc))
        return rc;
    if (read_policy(f) < 0)
        return refused(f, url, loom_error_last());
    /* The first hop is checked here too, so that a refusal (an address
     * loom does not reach) is told apart from a fetch that failed. */
    rc = loom__net_target_check(&t, &f->policy, url);
    loom__net_target_clear(&t);
    if (rc == LOOM_ENOTFOUND)
        return failed(f, url, loom_error_last());
    if (rc == LOOM_ENOMEM)
        return rc;
    if (rc)
        return refused(f, url, loom_error_last());
    req.max_redirects = LOOM__NET_MAX_REDIRECTS;
    req.max_bytes = LOOM__MEDIA_FETCH_MAX_BYTES;
    req.timeout_ms = LOOM__MEDIA_FETCH_TIMEOUT_MS;
    req.user_agent = f->user_agent;
    req.cancel = f->cancel;
    rc = loom__net_fetch(&f->policy, url, &req, &resp);
    /* Past the size limit, or a redirect loom does not follow (to an
     * address it refuses, one too many). */
    if (rc == LOOM_ETOOLARGE || rc == LOOM_ERROR || rc == LOOM_EINVALID)
        rc = refused(f, url, loom_error_last());
    else if (rc && rc != LOOM_ECANCELED && rc != LOOM_ENOMEM)
        rc = failed(f, url, loom_error_last());
    else if (rc == 0 && (rc = take(f, url, kind, &resp, data, mime)) == 0)
        rc = keep(f, url, *data, *mime);
    loom__net_response_clear(&resp);
    if (rc) {
        free(*data);
        free(*mime);
        *data = *mime = NULL;
    }
    return rc;
}
