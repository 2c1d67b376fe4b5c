/*
 * Internal: a message's content parts (loom_part: text, images, files) in
 * each provider's request shape. Kept apart from the adapters' request
 * builders, which call these only for a message that holds an image or a
 * file (loom_message_has_media); a message of text alone is sent as its
 * content string, as before parts existed.
 */
#ifndef LOOM_LLM_PARTS_H
#define LOOM_LLM_PARTS_H

#include "loom/llm.h"
#include "loom/message.h"

#include <jansson.h>

/*
 * Chat Completions: the "content" array of m, of {"type": "text"},
 * {"type": "image_url", "image_url": {"url", "detail"}} (data as a data:
 * URL) and {"type": "file", "file": {"filename", "file_data"}} parts.
 * NULL on OOM.
 */
json_t *loom__parts_openai(const loom_message *m);

/*
 * Responses API: the "content" array of a user message item, of
 * input_text, input_image {image_url, detail} and input_file {filename,
 * file_data | file_url} parts. NULL on OOM.
 */
json_t *loom__parts_responses(const loom_message *m);

/*
 * Anthropic Messages: the content blocks of m, in order: text, image
 * (source base64 or url) and document (a PDF; source base64 or url).
 * NULL on OOM.
 */
json_t *loom__parts_anthropic(const loom_message *m);

/*
 * Gemini: the parts of m's content: {"text"}, {"inlineData": {mimeType,
 * data}} for data and {"fileData": {mimeType, fileUri}} for a URL, whose
 * media type is the part's own or else guessed from the URL's extension
 * (Gemini needs one). NULL on OOM.
 */
json_t *loom__parts_gemini(const loom_message *m);

/*
 * The same, with every image or file given by URL fetched by
 * req->media_fetch (when set) and sent as inlineData with the media type
 * the fetch found. *out NULL on failure: the fetch's error (a message
 * naming the URL), or LOOM_ENOMEM.
 */
int loom__parts_gemini_fetched(json_t **out, const loom_message *m,
                               const loom_llm_request *req);

/*
 * The media type of a part: its mime, else the one the URL's file
 * extension says (.png, .jpg/.jpeg, .gif, .webp, .pdf), else "image/jpeg"
 * for an image and "application/pdf" for a file. Borrowed or static.
 */
const char *loom__part_mime(const loom_part *p);

#endif
