/*
 * Internal: the images a tool gave with its result (loom_tool_ctx.images)
 * as the image parts of its tool message, for a model that can see.
 *
 * A tool's images come from whatever the tool talks to (an MCP server),
 * so the run checks them before they reach a request or the store: what
 * is not an object with base64 data of at most LOOM_TOOL_IMAGE_MAX_BYTES
 * and a media type that every provider takes (image/png, image/jpeg,
 * image/gif, image/webp; another would fail the model call) is left
 * out, as is every image past LOOM_TOOL_IMAGES_MAX.
 */
#ifndef LOOM_AGENT_TOOL_IMAGES_H
#define LOOM_AGENT_TOOL_IMAGES_H

#include "loom/message.h"

#include <jansson.h>

/*
 * The image parts of images (an array of {"data", "mime"} objects, or
 * NULL) into *parts (*n of them; NULL and 0 when none is usable), in
 * order. *dropped counts the images left out. The caller frees each part
 * (loom_part_clear) and the array. LOOM_ENOMEM leaves *parts NULL.
 */
int loom__tool_images_parts(const json_t *images, loom_part **parts, size_t *n,
                            size_t *dropped);

#endif
