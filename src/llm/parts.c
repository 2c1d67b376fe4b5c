/*
 * A message's images and files in the request shape of each provider
 * (llm/parts.h). The four shapes say the same three things (text, an
 * image, a document; by URL or inline base64) in different words, so
 * they live side by side here, where a reader can compare them, rather
 * than spread over the adapters' request builders.
 *
 * URLs are passed on as they are: OpenAI, the Responses API and
 * Anthropic fetch them themselves. Gemini's fileData takes only a few
 * hosts, so for Gemini the request's media_fetch (set by the run, which
 * fetches through web_fetch's SSRF guard) turns a URL into inlineData;
 * nothing here does network I/O itself.
 */
#include "llm/parts.h"
#include "core/error.h"
#include "llm/attempt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* "data:<mime>;base64,<data>" of p, as a new JSON string. */
static json_t *data_url(const loom_part *p)
{
    json_t *s;
    char *u;

    if (asprintf(&u, "data:%s;base64,%s", loom__part_mime(p), p->data) < 0)
        return NULL;
    s = json_string(u);
    free(u);
    return s;
}

/* The URL of p, or its data as a data: URL. */
static json_t *url_of(const loom_part *p)
{
    return p->data ? data_url(p) : loom__llm_json_string(p->url);
}

static int ends_with(const char *s, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);

    return n >= k && strncasecmp(s + n - k, suffix, k) == 0;
}

const char *loom__part_mime(const loom_part *p)
{
    static const char *const ext[][2] = {
        {".png", "image/png"},   {".jpg", "image/jpeg"},
        {".jpeg", "image/jpeg"}, {".gif", "image/gif"},
        {".webp", "image/webp"}, {".pdf", "application/pdf"}};
    size_t n;

    if (p->mime && *p->mime)
        return p->mime;
    /* The path's end, before any query or fragment. */
    n = p->url ? strcspn(p->url, "?#") : 0;
    for (size_t i = 0; i < sizeof(ext) / sizeof(ext[0]); i++)
        if (ends_with(p->url, n, ext[i][0]))
            return ext[i][1];
    return p->kind == LOOM_PART_FILE ? "application/pdf" : "image/jpeg";
}

/* Appends v (stolen) to arr; 1 on failure, as the builders chain them. */
static int add(json_t *arr, json_t *v)
{
    return !v || json_array_append_new(arr, v) != 0;
}

/* Builds an array of one item per part of m with one(part), leaving out
 * empty text parts with skip_empty (Anthropic and Gemini refuse them);
 * NULL on OOM. */
static json_t *each(const loom_message *m, json_t *(*one)(const loom_part *),
                    int skip_empty)
{
    json_t *arr = json_array();
    int bad = !arr;

    for (size_t i = 0; !bad && i < m->parts_len; i++) {
        const loom_part *p = &m->parts[i];
        if (skip_empty && p->kind == LOOM_PART_TEXT && (!p->text || !*p->text))
            continue;
        bad = add(arr, one(p));
    }
    if (bad) {
        json_decref(arr);
        return NULL;
    }
    return arr;
}

static json_t *text_of(const char *key, const char *type, const loom_part *p)
{
    json_t *o = type ? json_pack("{s:s}", "type", type) : json_object();

    if (o && loom__llm_put(o, key, loom__llm_json_string(p->text))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* ---- Chat Completions ------------------------------------------------- */

static json_t *openai_part(const loom_part *p)
{
    json_t *o, *inner = json_object();
    int bad = !inner;

    if (p->kind == LOOM_PART_TEXT) {
        json_decref(inner);
        return text_of("text", "text", p);
    }
    if (p->kind == LOOM_PART_IMAGE) {
        bad = bad || loom__llm_put(inner, "url", url_of(p));
        if (!bad && p->detail)
            bad = loom__llm_put(inner, "detail", json_string(p->detail));
    } else {
        if (!bad && p->filename)
            bad = loom__llm_put(inner, "filename",
                                loom__llm_json_string(p->filename));
        bad = bad || loom__llm_put(inner, "file_data", url_of(p));
    }
    if (bad) {
        json_decref(inner);
        return NULL;
    }
    o = p->kind == LOOM_PART_IMAGE
            ? json_pack("{s:s,s:o}", "type", "image_url", "image_url", inner)
            : json_pack("{s:s,s:o}", "type", "file", "file", inner);
    return o;
}

json_t *loom__parts_openai(const loom_message *m)
{
    return each(m, openai_part, 0);
}

/* ---- Responses API ---------------------------------------------------- */

static json_t *responses_part(const loom_part *p)
{
    json_t *o;
    int bad;

    if (p->kind == LOOM_PART_TEXT)
        return text_of("text", "input_text", p);
    if (p->kind == LOOM_PART_IMAGE) {
        o = json_pack("{s:s,s:s}", "type", "input_image", "detail",
                      p->detail ? p->detail : "auto");
        bad = !o || loom__llm_put(o, "image_url", url_of(p));
    } else {
        o = json_pack("{s:s}", "type", "input_file");
        bad = !o;
        /* The API wants a name beside inline data. */
        if (!bad && (p->filename || p->data))
            bad = loom__llm_put(
                o, "filename",
                loom__llm_json_string(p->filename ? p->filename : "file.pdf"));
        if (!bad)
            bad =
                loom__llm_put(o, p->data ? "file_data" : "file_url", url_of(p));
    }
    if (bad) {
        json_decref(o);
        return NULL;
    }
    return o;
}

json_t *loom__parts_responses(const loom_message *m)
{
    return each(m, responses_part, 0);
}

/* ---- Anthropic -------------------------------------------------------- */

static json_t *anthropic_part(const loom_part *p)
{
    json_t *src;

    if (p->kind == LOOM_PART_TEXT)
        return text_of("text", "text", p);
    if (p->data)
        src = json_pack("{s:s,s:s,s:s}", "type", "base64", "media_type",
                        loom__part_mime(p), "data", p->data);
    else
        src = json_pack("{s:s,s:o}", "type", "url", "url",
                        loom__llm_json_string(p->url));
    if (!src)
        return NULL;
    return json_pack("{s:s,s:o}", "type",
                     p->kind == LOOM_PART_IMAGE ? "image" : "document",
                     "source", src);
}

json_t *loom__parts_anthropic(const loom_message *m)
{
    return each(m, anthropic_part, 1);
}

/* ---- Gemini ----------------------------------------------------------- */

static json_t *gemini_part(const loom_part *p)
{
    if (p->kind == LOOM_PART_TEXT)
        return text_of("text", NULL, p);
    if (p->data)
        return json_pack("{s:{s:s,s:s}}", "inlineData", "mimeType",
                         loom__part_mime(p), "data", p->data);
    return json_pack("{s:{s:s,s:o}}", "fileData", "mimeType",
                     loom__part_mime(p), "fileUri",
                     loom__llm_json_string(p->url));
}

json_t *loom__parts_gemini(const loom_message *m)
{
    return each(m, gemini_part, 1);
}

int loom__parts_gemini_fetched(json_t **out, const loom_message *m,
                               const loom_llm_request *req)
{
    json_t *arr;
    int rc = 0;

    *out = NULL;
    if (!req->media_fetch) {
        *out = loom__parts_gemini(m);
        return *out ? 0 : loom__error_oom();
    }
    if (!(arr = json_array()))
        return loom__error_oom();
    for (size_t i = 0; !rc && i < m->parts_len; i++) {
        const loom_part *p = &m->parts[i];
        char *data = NULL, *mime = NULL;
        if (p->kind == LOOM_PART_TEXT || p->data || !p->url) {
            if (p->kind == LOOM_PART_TEXT && (!p->text || !*p->text))
                continue;
            if (add(arr, gemini_part(p)))
                rc = loom__error_oom();
            continue;
        }
        if ((rc = req->media_fetch(req->media_fetch_payload, p->url, p->kind,
                                   &data, &mime)) == 0 &&
            add(arr, json_pack("{s:{s:s,s:s}}", "inlineData", "mimeType", mime,
                               "data", data)))
            rc = loom__error_oom();
        free(data);
        free(mime);
    }
    if (rc) {
        json_decref(arr);
        return rc;
    }
    *out = arr;
    return 0;
}
