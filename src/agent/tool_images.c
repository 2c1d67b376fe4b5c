/*
 * A tool's images as image parts of its tool message (tool_images.h):
 * each one checked (base64 data, a media type every provider takes, the
 * size and count limits of loom/tools.h) and copied.
 */
#include "agent/tool_images.h"
#include "core/error.h"
#include "loom/tools.h"

#include <stdlib.h>
#include <string.h>

static int b64_char(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
           (c >= '0' && c <= '9') || c == '+' || c == '/';
}

/* The bytes base64 s (len characters) decodes to; 0 when it is not
 * base64 (or empty). */
static size_t b64_size(const char *s, size_t len)
{
    size_t pad = 0;

    if (!len || len % 4)
        return 0;
    while (pad < 2 && s[len - 1 - pad] == '=')
        pad++;
    for (size_t i = 0; i < len - pad; i++)
        if (!b64_char((unsigned char)s[i]))
            return 0;
    return len / 4 * 3 - pad;
}

/* 1 when mime is a type every provider takes an image in. */
static int image_mime(const char *mime)
{
    static const char *const ok[] = {"image/png", "image/jpeg", "image/gif",
                                     "image/webp"};

    for (size_t i = 0; mime && i < sizeof(ok) / sizeof(ok[0]); i++)
        if (strcmp(mime, ok[i]) == 0)
            return 1;
    return 0;
}

int loom__tool_images_parts(const json_t *images, loom_part **parts, size_t *n,
                            size_t *dropped)
{
    size_t total = json_array_size(images), k = 0, i;
    const json_t *img;
    loom_part *out;

    *parts = NULL;
    *n = 0;
    *dropped = 0;
    if (!total)
        return 0;
    if (!(out = calloc(total < LOOM_TOOL_IMAGES_MAX ? total
                                                    : LOOM_TOOL_IMAGES_MAX,
                       sizeof(*out))))
        return loom__error_oom();
    json_array_foreach(images, i, img)
    {
        const json_t *data = json_object_get(img, "data");
        const char *mime = json_string_value(json_object_get(img, "mime"));
        size_t bytes =
            b64_size(json_string_value(data), json_string_length(data));
        if (k == LOOM_TOOL_IMAGES_MAX || !bytes ||
            bytes > LOOM_TOOL_IMAGE_MAX_BYTES || !image_mime(mime)) {
            (*dropped)++;
            continue;
        }
        out[k].kind = LOOM_PART_IMAGE;
        if (!(out[k].data = strdup(json_string_value(data))) ||
            !(out[k].mime = strdup(mime))) {
            loom_part_clear(&out[k]);
            for (size_t j = 0; j < k; j++)
                loom_part_clear(&out[j]);
            free(out);
            return loom__error_oom();
        }
        k++;
    }
    if (!k) {
        free(out);
        return 0;
    }
    *parts = out;
    *n = k;
    return 0;
}
