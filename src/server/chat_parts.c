/*
 * The content parts of a Chat Completions message (chat_parts.h): text,
 * images and files as OpenAI clients send them, checked and turned into
 * loom_part values that every adapter can send on.
 *
 * Only the forms that all four providers can take are accepted: images
 * as PNG, JPEG, GIF or WebP, files as PDF, each either inline (a base64
 * data: URL, whose decoded size is counted against the limits) or by an
 * http(s) URL. A part that is malformed, of a kind loom cannot pass on
 * (input_audio, a file_id of OpenAI's own file store), or past a limit is
 * a 400 that names it, before any run starts: a model would only fail
 * later with a less clear message, after the client waited for it.
 */
#include "server/chat_parts.h"
#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PARAM_MAX 192
/* "messages[<i>].content[<j>]" with two 20-digit indexes fits. */
#define AT_MAX 64

static const char *const image_mimes[] = {"image/png", "image/jpeg",
                                          "image/gif", "image/webp", NULL};
static const char *const file_mimes[] = {"application/pdf", NULL};

/* A 400 with code on param; the message is the format's text. */
#define invalid(err, code, param, ...)                                         \
    loom__chat_error_set(err, 400, "invalid_request_error", code, param,       \
                         __VA_ARGS__)

/* The string at key of o into *out; a missing or non-string one is a
 * 400 on param. */
static int string_at(const char **out, const json_t *o, const char *key,
                     const char *param, int required, loom__chat_error *err)
{
    const json_t *v = json_object_get(o, key);

    *out = NULL;
    if (!v || json_is_null(v)) {
        if (!required)
            return 0;
        return invalid(err, "missing_required_parameter", param,
                       "Missing required parameter: '%s'.", param);
    }
    if (!json_is_string(v))
        return invalid(err, "invalid_type", param,
                       "Invalid type for '%s': expected a string.", param);
    *out = json_string_value(v);
    return 0;
}

static int is_b64(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
           (c >= '0' && c <= '9') || c == '+' || c == '/';
}

/* 1 when s is base64 as data: URLs carry it: the alphabet, a length
 * that is a multiple of 4, at most two '=' at the end. */
static int valid_b64(const char *s)
{
    size_t n = strlen(s), pad = 0;

    if (!n || n % 4)
        return 0;
    while (pad < 2 && s[n - 1 - pad] == '=')
        pad++;
    for (size_t k = 0; k < n - pad; k++)
        if (!is_b64((unsigned char)s[k]))
            return 0;
    return 1;
}

static int listed(const char *s, size_t len, const char *const *list)
{
    for (; *list; list++)
        if (strlen(*list) == len && strncmp(*list, s, len) == 0)
            return 1;
    return 0;
}

/* The media types of list as "a, b or c" into buf. */
static const char *list_text(char *buf, size_t size, const char *const *list)
{
    size_t at = 0;

    buf[0] = '\0';
    for (size_t k = 0; list[k] && at < size; k++)
        at += (size_t)snprintf(buf + at, size - at, "%s%s",
                               k == 0        ? ""
                               : list[k + 1] ? ", "
                                             : " or ",
                               list[k]);
    return buf;
}

/*
 * Fills part's url, or its data and mime from a data: URL, checking the
 * media type against mimes. param names the URL field.
 */
static int set_source(loom_part *part, const char *url,
                      const char *const *mimes, const char *param,
                      loom__chat_error *err)
{
    char kinds[128];
    const char *semi, *comma;

    if (strncmp(url, "data:", 5) == 0) {
        semi = strchr(url + 5, ';');
        comma = strchr(url + 5, ',');
        if (!semi || !comma || comma - semi < 7 ||
            strncmp(comma - 7, ";base64", 7) != 0)
            return invalid(err, "invalid_value", param,
                           "Invalid value for '%s': a data URL must be "
                           "'data:<media type>;base64,<data>'.",
                           param);
        if (!listed(url + 5, (size_t)(semi - url - 5), mimes))
            return loom__chat_error_set(
                err, 400, "invalid_request_error", "unsupported_value", param,
                "Invalid value for '%s': media type '%.*s' is not supported; "
                "expected %s.",
                param, (int)(semi - url - 5), url + 5,
                list_text(kinds, sizeof(kinds), mimes));
        if (!valid_b64(comma + 1))
            return invalid(err, "invalid_value", param,
                           "Invalid value for '%s': the data is not valid "
                           "base64.",
                           param);
        if (!(part->mime = strndup(url + 5, (size_t)(semi - url - 5))) ||
            !(part->data = strdup(comma + 1)))
            return loom__error_oom();
        return 0;
    }
    if (strncmp(url, "https://", 8) != 0 && strncmp(url, "http://", 7) != 0)
        return invalid(err, "invalid_value", param,
                       "Invalid value for '%s': expected an http(s) URL or "
                       "a base64 data URL.",
                       param);
    if (strlen(url) > LOOM__CHAT_MAX_MEDIA_URL)
        return loom__chat_error_set(
            err, 400, "invalid_request_error", "string_above_max_length", param,
            "Invalid '%s': string too long. Expected a string with maximum "
            "length %d, but got a string with length %zu instead.",
            param, LOOM__CHAT_MAX_MEDIA_URL, strlen(url));
    if (!(part->url = strdup(url)))
        return loom__error_oom();
    return 0;
}

/* {"type": "image_url", "image_url": {"url", "detail"}}; a bare string
 * for image_url is taken as the url (LangChain sends that form). */
static int parse_image(loom_part *part, const json_t *v, const char *at,
                       loom__chat_error *err)
{
    char pp[PARAM_MAX];
    const char *url, *detail = NULL;
    int rc;

    part->kind = LOOM_PART_IMAGE;
    snprintf(pp, sizeof(pp), "%.63s.image_url", at);
    if (json_is_string(v)) {
        url = json_string_value(v);
    } else if (!json_is_object(v)) {
        return invalid(err, v ? "invalid_type" : "missing_required_parameter",
                       pp,
                       v ? "Invalid type for '%s': expected an object."
                         : "Missing required parameter: '%s'.",
                       pp);
    } else {
        snprintf(pp, sizeof(pp), "%.63s.image_url.url", at);
        if ((rc = string_at(&url, v, "url", pp, 1, err)) != 0)
            return rc;
        snprintf(pp, sizeof(pp), "%.63s.image_url.detail", at);
        if ((rc = string_at(&detail, v, "detail", pp, 0, err)) != 0)
            return rc;
        if (detail && strcmp(detail, "auto") != 0 &&
            strcmp(detail, "low") != 0 && strcmp(detail, "high") != 0)
            return invalid(err, "invalid_value", pp,
                           "Invalid value for '%s': '%s'. Supported values "
                           "are: 'auto', 'low' and 'high'.",
                           pp, detail);
        if (detail && !(part->detail = strdup(detail)))
            return loom__error_oom();
        snprintf(pp, sizeof(pp), "%.63s.image_url.url", at);
    }
    return set_source(part, url, image_mimes, pp, err);
}

/* {"type": "file", "file": {"file_data", "filename"}}; file_id names a
 * file in OpenAI's store, which loom does not have. */
static int parse_file(loom_part *part, const json_t *v, const char *at,
                      loom__chat_error *err)
{
    char pp[PARAM_MAX];
    const char *data, *name;
    int rc;

    part->kind = LOOM_PART_FILE;
    snprintf(pp, sizeof(pp), "%.63s.file", at);
    if (!json_is_object(v))
        return invalid(err, v ? "invalid_type" : "missing_required_parameter",
                       pp,
                       v ? "Invalid type for '%s': expected an object."
                         : "Missing required parameter: '%s'.",
                       pp);
    if (json_object_get(v, "file_id")) {
        snprintf(pp, sizeof(pp), "%.63s.file.file_id", at);
        return invalid(err, "unsupported_parameter", pp,
                       "Unsupported parameter: '%s': loom has no file store; "
                       "send the file inline as file_data.",
                       pp);
    }
    snprintf(pp, sizeof(pp), "%.63s.file.filename", at);
    if ((rc = string_at(&name, v, "filename", pp, 0, err)) != 0)
        return rc;
    if (name && !(part->filename = strdup(name)))
        return loom__error_oom();
    snprintf(pp, sizeof(pp), "%.63s.file.file_data", at);
    if ((rc = string_at(&data, v, "file_data", pp, 1, err)) != 0)
        return rc;
    /* As in OpenAI's API: a file comes inline, never by address. */
    if (strncmp(data, "data:", 5) != 0)
        return invalid(err, "invalid_value", pp,
                       "Invalid value for '%s': expected a base64 data URL "
                       "('data:application/pdf;base64,...').",
                       pp);
    return set_source(part, data, file_mimes, pp, err);
}

/* Counts part against the request's limits; at names it. */
static int count_media(const loom_part *part, const char *at,
                       loom__chat_media *totals, loom__chat_error *err)
{
    size_t bytes = loom_part_data_size(part);

    if (++totals->count > LOOM__CHAT_MAX_MEDIA)
        return loom__chat_error_set(
            err, 400, "invalid_request_error", "too_many_images", at,
            "Invalid '%s': a request may hold at most %d images and files.", at,
            LOOM__CHAT_MAX_MEDIA);
    if (bytes > LOOM__CHAT_MAX_MEDIA_BYTES)
        return loom__chat_error_set(
            err, 400, "invalid_request_error", "image_too_large", at,
            "Invalid '%s': the data is %zu bytes; an image or file may be at "
            "most %u bytes.",
            at, bytes, LOOM__CHAT_MAX_MEDIA_BYTES);
    totals->bytes += bytes;
    if (totals->bytes > LOOM__CHAT_MAX_MEDIA_TOTAL)
        return loom__chat_error_set(
            err, 400, "invalid_request_error", "images_too_large", at,
            "Invalid '%s': the images and files of a request may hold at "
            "most %u bytes together; this one brings them to %zu.",
            at, LOOM__CHAT_MAX_MEDIA_TOTAL, totals->bytes);
    return 0;
}

static int parse_part(loom_part *part, const json_t *v, const char *list,
                      size_t i, size_t j, loom_role role,
                      loom__chat_media *totals, loom__chat_error *err)
{
    char at[AT_MAX], pp[PARAM_MAX];
    const char *type, *text;
    int rc;

    snprintf(at, sizeof(at), "%.9s[%zu].content[%zu]", list, i, j);
    if (!json_is_object(v))
        return invalid(err, "invalid_type", at,
                       "Invalid type for '%s': expected an object.", at);
    snprintf(pp, sizeof(pp), "%.63s.type", at);
    if ((rc = string_at(&type, v, "type", pp, 1, err)) != 0)
        return rc;
    if (strcmp(type, "text") == 0) {
        part->kind = LOOM_PART_TEXT;
        snprintf(pp, sizeof(pp), "%.63s.text", at);
        if ((rc = string_at(&text, v, "text", pp, 1, err)) != 0)
            return rc;
        return (part->text = strdup(text)) ? 0 : loom__error_oom();
    }
    if (strcmp(type, "image_url") != 0 && strcmp(type, "file") != 0)
        return invalid(err, "unsupported_value", pp,
                       "Invalid value for '%s': content parts of type '%s' "
                       "are not supported; loom accepts 'text', 'image_url' "
                       "and 'file' parts.",
                       pp, type);
    if (role != LOOM_ROLE_USER)
        return invalid(err, "unsupported_value", pp,
                       "Invalid value for '%s': '%s' parts are only "
                       "accepted in user messages.",
                       pp, type);
    rc = type[0] == 'i'
             ? parse_image(part, json_object_get(v, "image_url"), at, err)
             : parse_file(part, json_object_get(v, "file"), at, err);
    return rc ? rc : count_media(part, at, totals, err);
}

int loom__chat_parts_parse(loom_part **out, size_t *n, const json_t *content,
                           size_t i, loom_role role, loom__chat_media *totals,
                           loom__chat_error *err)
{
    return loom__chat_parts_parse_in(out, n, content, "messages", i, role,
                                     totals, err);
}

int loom__chat_parts_parse_in(loom_part **out, size_t *n, const json_t *content,
                              const char *list, size_t i, loom_role role,
                              loom__chat_media *totals, loom__chat_error *err)
{
    size_t len = json_array_size(content), j;
    const json_t *v;
    loom_part *parts;
    int rc = 0;

    *out = NULL;
    *n = 0;
    if (!len)
        return 0;
    if (!(parts = calloc(len, sizeof(*parts))))
        return loom__error_oom();
    json_array_foreach(content, j, v)
    {
        rc = parse_part(&parts[j], v, list, i, j, role, totals, err);
        if (rc) {
            loom__chat_parts_free(parts, j + 1);
            return rc;
        }
    }
    *out = parts;
    *n = len;
    return 0;
}

void loom__chat_parts_free(loom_part *parts, size_t n)
{
    for (size_t k = 0; parts && k < n; k++)
        loom_part_clear(&parts[k]);
    free(parts);
}

int loom__chat_media_check(srv_server *s, const loom_messages *msgs,
                           const char *model, const loom_agent_config *agent,
                           const char *shown, const char *list,
                           loom__chat_error *err)
{
    const loom_model_config *m = NULL;
    loom_model_config tmp;
    char param[AT_MAX];
    size_t at = 0;
    int rc, vision;

    while (at < msgs->len && !loom_message_has_media(&msgs->items[at]))
        at++;
    if (at == msgs->len)
        return 1;
    if (!model)
        model = srv_default_model(s, agent);
    memset(&tmp, 0, sizeof(tmp));
    if (!model || (rc = srv_model(s, model, &m, &tmp)) == LOOM_ENOTFOUND)
        vision = 0;
    else if (rc)
        return rc;
    else
        vision = m->capabilities.vision;
    loom_model_config_clear(&tmp);
    if (vision)
        return 1;
    snprintf(param, sizeof(param), "%.9s[%zu].content", list, at);
    return loom__chat_error_set(
        err, 400, "invalid_request_error", "model_not_vision", param,
        "The model `%s` does not take images or files (its config does not "
        "set capabilities.vision); send text only or pick a model that has "
        "it.",
        model ? model : shown);
}
