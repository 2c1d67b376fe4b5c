/*
 * loom/message.h: conversation messages, the tools offered to a model,
 * and token usage.
 *
 * These are the plain owned data that every layer passes around: the
 * model adapters (loom/llm.h) encode them, the run loop builds them, the
 * store keeps them and the tokenizer counts them. They live in core so
 * that a layer below the model interface (the tokenizer, the store) can
 * use them without including loom/llm.h.
 */
#ifndef LOOM_MESSAGE_H
#define LOOM_MESSAGE_H

#include "common.h"
#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    LOOM_ROLE_SYSTEM = 0,
    LOOM_ROLE_USER,
    LOOM_ROLE_ASSISTANT,
    LOOM_ROLE_TOOL
} loom_role;

const char *loom_role_name(loom_role role);

typedef struct {
    char *id;        /* provider's call id ("call_abc") */
    char *name;      /* tool name */
    char *arguments; /* JSON text as the model produced it (may be invalid) */
} loom_tool_call;

typedef enum {
    LOOM_PART_TEXT = 0,
    LOOM_PART_IMAGE, /* an image the model looks at */
    LOOM_PART_FILE   /* a document (PDF) the model reads */
} loom_part_kind;

/*
 * One content part of a message that holds more than text. An image or
 * file comes either by url (an http(s) address: the provider, or loom
 * for a provider that needs the bytes, fetches it) or as data (the bytes
 * in base64, without a "data:" prefix) with its media type. Every
 * pointer is owned by the part.
 */
typedef struct {
    loom_part_kind kind;
    char *text;     /* TEXT: the text */
    char *url;      /* IMAGE, FILE: the address; NULL with data */
    char *data;     /* IMAGE, FILE: base64 bytes; NULL with url */
    char *mime;     /* media type of data ("image/png"); NULL when unknown */
    char *detail;   /* IMAGE: "low", "high", "auto"; NULL for the default */
    char *filename; /* FILE: its name, or NULL */
} loom_part;

/* One conversation message. Every pointer is owned by the message. */
typedef struct {
    loom_role role;
    char *content;   /* text; may be NULL (assistant with only tool calls) */
    char *reasoning; /* assistant reasoning text, may be NULL */
    loom_tool_call *tool_calls; /* assistant only */
    size_t tool_calls_len;
    char *tool_call_id; /* tool only: the call this answers */
    char *name;         /* tool only: the tool's name */
    /*
     * Assistant only: what a provider must get back unchanged on the next
     * request (Anthropic thinking blocks and their signatures, Gemini
     * thoughtSignature, a Responses API response id). A JSON object text
     * whose keys are adapter kinds ("anthropic", "gemini", ...), each
     * adapter reading only its own key; NULL when none. Opaque to the run
     * loop and the store, which carry it as is.
     */
    char *provider_state;
    /*
     * Tool only: a short summary of the result that the tool gave, or NULL.
     * Never sent as is: the context engine (loom/context.h) shows it in
     * place of an older result when the request must shrink.
     */
    char *summary;
    /*
     * The content as ordered parts, when the message holds more than text
     * (images, files); NULL and 0 otherwise. content then holds the text
     * parts joined by newlines, so that whatever reads only text (logs,
     * the store's previews, the context engine's text counts) keeps
     * working; adapters send the parts instead of content.
     *
     * A tool message differs: its parts are only the images the tool
     * gave with its result (loom_tool_ctx.images, for a model that
     * sees), and content stays its whole text, which adapters send
     * beside them (the context engine may cut or reduce that text; a
     * reduced result is sent without its images).
     */
    loom_part *parts;
    size_t parts_len;
} loom_message;

/* A growable list of messages that owns them. */
typedef struct {
    loom_message *items;
    size_t len;
    size_t cap;
} loom_messages;

/* Appends a message of role with a copy of content (may be NULL). */
int loom_messages_add(loom_messages *m, loom_role role, const char *content);
/* Appends a tool result answering call_id. */
int loom_messages_add_tool_result(loom_messages *m, const char *call_id,
                                  const char *name, const char *content);
/* Appends an assistant message, copying text, reasoning and calls. */
int loom_messages_add_assistant(loom_messages *m, const char *content,
                                const char *reasoning,
                                const loom_tool_call *calls, size_t ncalls);
/*
 * Appends a message of role with parts (copied; n may be 0) and their
 * text parts joined by newlines as its content. A message whose parts
 * are all text gets only the content.
 */
int loom_messages_add_parts(loom_messages *m, loom_role role,
                            const loom_part *parts, size_t n);
/* 1 when msg has an image or file part. */
int loom_message_has_media(const loom_message *msg);
/* The bytes that a part's base64 data decodes to (0 without data). */
size_t loom_part_data_size(const loom_part *part);
void loom_part_clear(loom_part *part);
/* Deep-copies src into *dst; LOOM_ENOMEM leaves *dst empty. */
int loom_part_copy(loom_part *dst, const loom_part *src);
/* Deep-copies every message of src onto the end of dst. */
int loom_messages_append(loom_messages *dst, const loom_messages *src);
void loom_messages_free(loom_messages *m);
void loom_tool_call_clear(loom_tool_call *c);
void loom_message_clear(loom_message *msg);

/* A tool as offered to the model. Borrowed by the request. */
typedef struct {
    const char *name;
    const char *description;
    const json_t *parameters; /* JSON Schema object */
} loom_tool_def;

typedef struct {
    long prompt_tokens;
    long completion_tokens;
    long cached_tokens;    /* prompt tokens served from the cache */
    long reasoning_tokens; /* completion tokens spent reasoning */
    long total_tokens;
    /* Prompt tokens written to the provider's prompt cache (Anthropic
     * cache_creation_input_tokens), counted in prompt_tokens like
     * cached_tokens: adapters whose provider reports them apart add them
     * to prompt_tokens. */
    long cache_write_tokens;
    /* What the call cost in micro-dollars (1e-6 USD), from the answering
     * model's configured prices (see loom/router.h); 0 when unknown, as
     * loom_llm_response.cost_known then says. */
    int64_t cost_micros;
} loom_usage;

/* Adds b into a, field by field. */
void loom_usage_add(loom_usage *a, const loom_usage *b);

#ifdef __cplusplus
}
#endif
#endif
