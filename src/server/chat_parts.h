/*
 * Internal: the content parts of a Chat Completions message (text,
 * image_url, file) as loom_part values, with the limits on images and
 * files that one request may carry (docs/openai-compat.md, "Images and
 * files"), and whether the model may get them; for the chat API and the
 * native runs API alike. No I/O: a URL is checked for its form only;
 * whoever fetches it later goes through the SSRF guard.
 */
#ifndef LOOM_SERVER_CHAT_PARTS_H
#define LOOM_SERVER_CHAT_PARTS_H

#include "server/chat_format.h"
#include "server/internal.h"

/* Images and files one request may hold, over all its messages. */
#define LOOM__CHAT_MAX_MEDIA 32
/* The decoded bytes of one image or file sent as data. */
#define LOOM__CHAT_MAX_MEDIA_BYTES (8u << 20)
/* The decoded bytes of every image and file of one request together. */
#define LOOM__CHAT_MAX_MEDIA_TOTAL (20u << 20)
/* The longest image or file URL (a data: URL is bounded by the above). */
#define LOOM__CHAT_MAX_MEDIA_URL 8192

/* What the parts parsed so far hold, to apply the per-request limits. */
typedef struct {
    size_t count; /* images and files */
    size_t bytes; /* their decoded data */
} loom__chat_media;

/*
 * Parses content, the array of parts of messages[i], into *out (n parts,
 * owned by the caller: free each with loom_part_clear, then the array).
 * Text parts are {"type": "text", "text"}; images {"type": "image_url",
 * "image_url": {"url", "detail"}} where url is https:// or http:// or a
 * data:image/{png,jpeg,gif,webp};base64 URL; files {"type": "file",
 * "file": {"file_data": "data:application/pdf;base64,...", "filename"}}.
 * Images and files only in user messages (role). totals carries the
 * counts across the request's messages. On a bad part or a crossed
 * limit returns LOOM_EINVALID with a 400 in *err naming the part
 * ("messages[1].content[2].image_url.url"); LOOM_ENOMEM on OOM. *out is
 * NULL on failure.
 */
int loom__chat_parts_parse(loom_part **out, size_t *n, const json_t *content,
                           size_t i, loom_role role, loom__chat_media *totals,
                           loom__chat_error *err);

/*
 * The same for the content of list[i], where list names the array of
 * messages in parameter names: "messages" (chat), "input" (the native
 * runs API: "input[0].content[1].image_url.url"). At most 9 characters.
 */
int loom__chat_parts_parse_in(loom_part **out, size_t *n, const json_t *content,
                              const char *list, size_t i, loom_role role,
                              loom__chat_media *totals, loom__chat_error *err);

/*
 * Whether msgs may go to a model: 1 when none holds an image or file, or
 * the model takes them (capabilities.vision in its config, false by
 * default). The model is model ("provider/model"), else the default model
 * of agent (srv_default_model); shown names it in the message when there
 * is none. Otherwise LOOM_EINVALID with a 400 model_not_vision in *err
 * naming "<list>[i].content" of the first message with media; another
 * LOOM_E* code on failure.
 */
int loom__chat_media_check(srv_server *s, const loom_messages *msgs,
                           const char *model, const loom_agent_config *agent,
                           const char *shown, const char *list,
                           loom__chat_error *err);

/* Frees n parts and the array. */
void loom__chat_parts_free(loom_part *parts, size_t n);

#endif
