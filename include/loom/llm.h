/*
 * loom/llm.h: the provider-neutral model interface.
 *
 * A run speaks to every model through this header: a loom_llm_request
 * (messages, tools, tool choice, limits) goes in; one normalised stream of
 * loom_llm_event comes back through a callback, whatever the provider's
 * wire format, and the whole answer is collected into a loom_llm_response.
 * Adapters (llm/openai.c, ...) implement loom_provider.
 */
#ifndef LOOM_LLM_H
#define LOOM_LLM_H

#include "cancel.h"
#include "common.h"
#include "config.h"
#include "message.h"
#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Request text that the model calls of one conversation share (a run keeps
 * one), so that each call sends the conversation so far without encoding
 * it again: an adapter keeps there the encoded form of every message it
 * sent and of the tools. Set loom_llm_request.cache to use it.
 *
 * Contract: calls that share a cache send one growing conversation. The
 * messages one call sent are, in the next call, still there at the same
 * positions and unchanged (only appended to: never edited in place,
 * removed or reordered), and the tool definitions are the same, unchanged
 * (their name, description and parameters). A message whose pointers
 * (content, tool calls, tool_call_id) differ from what the cache saw is
 * encoded again, with every one after it, and so are tools given from a
 * different array or with different pointers; a change behind the same
 * pointers is not seen. One call at a time per cache; a cache belongs to
 * the provider that filled it (another provider empties it first).
 */
typedef struct loom_llm_cache loom_llm_cache;

/* Makes an empty cache. LOOM_ENOMEM. */
int loom_llm_cache_new(loom_llm_cache **out);

/* Frees a cache; NULL is a no-op. No call may be using it. */
void loom_llm_cache_free(loom_llm_cache *cache);

/*
 * The request parameters of OpenAI's Chat Completions API beyond messages,
 * tools and limits, as a client gave them: each is either sent (as is to
 * an OpenAI-compatible provider, translated to another provider's own
 * field) or refused before anything is sent (loom_llm_params_check), never
 * dropped. Zero is unset for every field; `set` says which numbers are
 * given. A filled struct owns its strings and JSON: free them with
 * loom_llm_params_clear. docs/openai-compat.md has the table of what each
 * provider kind does with each.
 */
#define LOOM_PARAM_TOP_P 0x1u
#define LOOM_PARAM_SEED 0x2u
#define LOOM_PARAM_PRESENCE_PENALTY 0x4u
#define LOOM_PARAM_FREQUENCY_PENALTY 0x8u

/* The most stop sequences a request may give (OpenAI's limit). */
#define LOOM_LLM_MAX_STOP 4

typedef enum {
    LOOM_FORMAT_UNSET = 0, /* text, the default */
    LOOM_FORMAT_JSON_OBJECT,
    LOOM_FORMAT_JSON_SCHEMA
} loom_response_format_kind;

typedef struct {
    unsigned set; /* LOOM_PARAM_* bits */
    double top_p;
    double presence_penalty;
    double frequency_penalty;
    long long seed;
    char *stop[LOOM_LLM_MAX_STOP];
    size_t stop_len;
    /* response_format: json_schema carries a name, the schema (an
     * object) and strict (1 true, 0 unset or false). */
    loom_response_format_kind format;
    char *format_name;
    char *format_description; /* NULL: none */
    json_t *format_schema;
    int format_strict;
    char *reasoning_effort; /* overrides the model's configured effort */
    char *verbosity;        /* "low", "medium" or "high" */
    char *user;             /* the end user's id, for the provider */
    /*
     * Parameters sent as they are to the providers that take them, by
     * their OpenAI names (an object; NULL: none): logit_bias, metadata,
     * service_tier, store, prompt_cache_key, safety_identifier.
     */
    json_t *extra;
} loom_llm_params;

/* Frees what p owns and zeroes it; NULL is a no-op. */
void loom_llm_params_clear(loom_llm_params *p);

/* A deep copy of src (NULL: zero) into *dst, which then owns its strings
 * and JSON. LOOM_ENOMEM (dst is then zero). */
int loom_llm_params_copy(loom_llm_params *dst, const loom_llm_params *src);

/* Whether any field of p is set (NULL: 0). */
int loom_llm_params_any(const loom_llm_params *p);

/*
 * The name of the first parameter of p that a provider of kind ("openai",
 * "anthropic", "gemini", "openai-responses") neither takes nor translates
 * ("logit_bias", "stop", "response_format", ...), or NULL when it takes
 * them all (or p is NULL). An unknown kind (an embedder's provider) takes
 * none.
 */
const char *loom_llm_params_refused(const loom_llm_params *p, const char *kind);

/*
 * loom_llm_params_refused with its error: LOOM_EINVALID with the message
 * "<param> is not supported by provider '<provider>' (<kind>)" and
 * *param (when param is not NULL) set to the parameter's name; else 0.
 */
int loom_llm_params_check(const loom_llm_params *p, const char *provider,
                          const char *kind, const char **param);

/*
 * Fetches the image or file (kind) at url for an adapter whose provider
 * must get the bytes rather than an address (Gemini, whose fileData takes
 * only its own file store and a few hosts): *data (base64) and *mime, new
 * strings the caller frees. A negative LOOM_E* code with a message that
 * names the URL otherwise; never LOOM_EUPSTREAM or LOOM_ETIMEDOUT (a
 * failed fetch says nothing about the model, so the router must not try
 * a fallback or mark the model unhealthy for it).
 */
typedef int (*loom_media_fetch_fn)(void *payload, const char *url,
                                   loom_part_kind kind, char **data,
                                   char **mime);

typedef struct {
    const char *model; /* upstream model id */
    const loom_message *messages;
    size_t messages_len;
    const loom_tool_def *tools; /* NULL/0: no tools sent */
    size_t tools_len;
    loom_tool_choice tool_choice;
    int parallel_tool_calls; /* -1 unset, 0 false, 1 true */
    long max_tokens;         /* 0: unset */
    double temperature;      /* < 0: unset */
    int stream;              /* 1: stream (default); 0: one JSON answer */
    loom_llm_cache *cache;   /* NULL: none; see loom_llm_cache */
    /*
     * Reasoning controls, sent only by adapters whose model supports them
     * (the model's config says so: capabilities.reasoning):
     * thinking_budget is tokens (Anthropic `thinking.budget_tokens`,
     * Gemini `thinkingConfig.thinkingBudget`), 0 unset;
     * reasoning_effort is "minimal", "low", "medium" or "high" (OpenAI
     * `reasoning_effort`, Responses `reasoning.effort`), NULL unset.
     */
    long thinking_budget;
    const char *reasoning_effort;
    /* Place prompt-cache breakpoints where the provider needs them
     * (Anthropic cache_control on tools, system and the last stable turn). */
    int prompt_cache;
    /* Responses API: send previous_response_id and only the new items when
     * the history's last assistant message carries a response id; `store`
     * is then true. */
    int chain_responses;
    /* The client's further parameters (loom_llm_params); NULL: none.
     * Borrowed. An adapter refuses those its kind does not take. */
    const loom_llm_params *params;
    /*
     * Which field carries max_tokens to an OpenAI-compatible provider:
     * 1 max_completion_tokens (OpenAI's reasoning models take only that),
     * -1 max_tokens, 0 by the model's family
     * (loom_config_known_max_completion_tokens).
     */
    int max_completion_tokens;
    /* Gemini: images and files given by URL are fetched with media_fetch
     * (its payload passed along) and sent as inlineData; NULL: they go as
     * fileData with the URL. Other adapters send URLs as they are. */
    loom_media_fetch_fn media_fetch;
    void *media_fetch_payload;
} loom_llm_request;

#define LOOM_LLM_REQUEST_INIT                                                  \
    {                                                                          \
        .parallel_tool_calls = -1, .temperature = -1.0, .stream = 1            \
    }

typedef enum {
    LOOM_LLM_TEXT = 0,       /* text delta */
    LOOM_LLM_REASONING,      /* reasoning delta */
    LOOM_LLM_TOOL_CALL_DELTA, /* a fragment of one tool call */
    LOOM_LLM_TOOL_CALLS,     /* every tool call of the answer, complete */
    LOOM_LLM_USAGE,          /* token counts */
    LOOM_LLM_FINISH,         /* finish reason */
    LOOM_LLM_ERROR           /* an error in the stream (also returned) */
} loom_llm_event_type;

/* One normalised event. Every pointer is borrowed for the callback. */
typedef struct {
    loom_llm_event_type type;
    const char *text; /* TEXT, REASONING: the delta */
    size_t text_len;
    int tool_index;           /* TOOL_CALL_DELTA: position of the call */
    const char *tool_id;      /* TOOL_CALL_DELTA: on the first fragment */
    const char *tool_name;    /* TOOL_CALL_DELTA: on the first fragment */
    const char *args_delta;   /* TOOL_CALL_DELTA: argument text, may be "" */
    const loom_tool_call *calls; /* TOOL_CALLS */
    size_t calls_len;
    loom_usage usage;          /* USAGE */
    const char *finish_reason; /* FINISH: "stop", "tool_calls", "length" */
    int error_code;            /* ERROR */
    const char *error_message; /* ERROR */
} loom_llm_event;

/* Non-zero return aborts the call; complete() then returns LOOM_ECANCELED. */
typedef int (*loom_llm_event_cb)(const loom_llm_event *ev, void *payload);

/* What an upstream error was, for callers that handle them. */
typedef enum {
    LOOM_UPSTREAM_NONE = 0,
    LOOM_UPSTREAM_BAD_REQUEST,   /* 400 */
    LOOM_UPSTREAM_AUTH,          /* 401 */
    LOOM_UPSTREAM_PERMISSION,    /* 403 */
    LOOM_UPSTREAM_NOT_FOUND,     /* 404 */
    LOOM_UPSTREAM_TIMEOUT,       /* 408, or a loom-side time limit */
    LOOM_UPSTREAM_CONFLICT,      /* 409 */
    LOOM_UPSTREAM_TOO_LARGE,     /* 413 */
    LOOM_UPSTREAM_UNPROCESSABLE, /* 422 */
    LOOM_UPSTREAM_RATE_LIMIT,    /* 429 */
    LOOM_UPSTREAM_SERVER,        /* 5xx */
    LOOM_UPSTREAM_CONNECTION,    /* could not connect, or dropped */
    LOOM_UPSTREAM_STREAM,        /* an error event inside the stream */
    LOOM_UPSTREAM_PROTOCOL       /* a body loom could not parse */
} loom_upstream_kind;

const char *loom_upstream_kind_name(loom_upstream_kind kind);

typedef struct {
    loom_upstream_kind kind;
    int http_status; /* 0 when none */
    char *type;      /* provider's error type/code, may be NULL */
    char *message;   /* provider's message, or loom's description */
    char *request_id; /* x-request-id or similar, may be NULL */
    int attempts;    /* requests made, retries included */
    /* The failed answer's rate-limit headers, for a server to pass on to
     * its own client: an object of lower-case name -> string value
     * (Retry-After, retry-after-ms, x-ratelimit-*; at most 12, values at
     * most 128 bytes), NULL when it had none. Freed with the response. */
    json_t *headers;
} loom_upstream_error;

/* Everything one model call produced. Owned by the caller. */
typedef struct {
    char *text;      /* joined text deltas, "" when none */
    char *reasoning; /* joined reasoning deltas, NULL when none */
    loom_tool_call *tool_calls;
    size_t tool_calls_len;
    loom_usage usage;
    char *finish_reason; /* NULL when the stream ended without one */
    char *response_id;   /* provider's id for the answer, may be NULL */
    /* State for the assistant message (see loom_message.provider_state):
     * a JSON object text keyed by the adapter's kind, or NULL. */
    char *provider_state;
    int output_started;  /* any text, reasoning or tool call was received */
    loom_upstream_error error; /* filled when complete() fails upstream */
    /* The model that answered, "provider/model", set by the model router
     * (loom/router.h), which may fall back to another model than the one
     * asked for; NULL from a bare adapter. */
    char *model;
    /* usage.cost_micros was computed from configured prices. */
    int cost_known;
} loom_llm_response;

void loom_llm_response_clear(loom_llm_response *r);

typedef struct loom_provider loom_provider;

/*
 * A provider's functions. An embedder's provider fills one (designated
 * initializers: .version = LOOM_PROVIDER_VTABLE_VERSION, .complete,
 * .free); a run refuses a version it does not know (0 is taken as the
 * current one).
 */
#define LOOM_PROVIDER_VTABLE_VERSION 1
typedef struct {
    unsigned version;
    /*
     * Makes one model call (retrying as configured before output starts),
     * emitting events to cb as they arrive and filling *resp (zeroed by the
     * caller). Returns 0, LOOM_ECANCELED when cancel is set or cb aborted,
     * LOOM_ETIMEDOUT, LOOM_EUPSTREAM (details in resp->error), LOOM_EPROTO.
     */
    int (*complete)(loom_provider *p, const loom_llm_request *req,
                    loom_llm_event_cb cb, void *payload,
                    loom_llm_response *resp, loom_cancel *cancel);
    void (*free)(loom_provider *p);
} loom_provider_vtable;

struct loom_provider {
    const loom_provider_vtable *vt;
    char *name; /* provider name from the config */
};

/* Builds the adapter that config->kind names. LOOM_EINVALID when unknown. */
int loom_provider_new(loom_provider **out, const loom_provider_config *config);

/* The OpenAI Chat Completions adapter (kind "openai"). */
int loom_provider_openai_new(loom_provider **out,
                             const loom_provider_config *config);

/* The Google Gemini adapter (kind "gemini"); see docs/providers.md.
 * base_url defaults to https://generativelanguage.googleapis.com. */
int loom_provider_gemini_new(loom_provider **out,
                             const loom_provider_config *config);

/* The OpenAI Responses API adapter (kind "openai-responses"); see
 * docs/providers.md. Requests go to POST {base_url}/responses. */
int loom_provider_responses_new(loom_provider **out,
                                const loom_provider_config *config);

/* The Anthropic Messages adapter (kind "anthropic"); see docs/providers.md.
 * base_url defaults to https://api.anthropic.com. */
int loom_provider_anthropic_new(loom_provider **out,
                                const loom_provider_config *config);

static inline int loom_provider_complete(loom_provider *p,
                                         const loom_llm_request *req,
                                         loom_llm_event_cb cb, void *payload,
                                         loom_llm_response *resp,
                                         loom_cancel *cancel)
{
    return p->vt->complete(p, req, cb, payload, resp, cancel);
}

/* NULL is a no-op. */
void loom_provider_free(loom_provider *p);

#ifdef __cplusplus
}
#endif
#endif
