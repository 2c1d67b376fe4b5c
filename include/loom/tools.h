/*
 * loom/tools.h: tools, the tool registry, and argument validation.
 *
 * A tool is a name, a description, a JSON Schema for its arguments and an
 * execute function. The run loop validates the model's arguments against
 * the schema before execute() is called, so a tool sees only arguments
 * that fit its schema. execute() runs on a worker thread, possibly beside
 * other tools of the same turn: it must be thread-safe with respect to its
 * payload.
 *
 * A registry maps names to tools. It is built at start and then only read
 * (registries are immutable once built); add/remove/clear are not safe
 * while a run is using it, nor while a tool call it started may still be
 * running. Tools whose list changes while loom runs (those of MCP servers
 * started in the background, loom/mcp.h) are not in it: a snapshot of the
 * registry has them (loom_tool_registry_snapshot), and a run takes a new
 * one before a model call when they changed.
 *
 * Ownership: a registry is reference counted. Its creator holds one
 * reference, and each tool call a run starts holds one more until the
 * call's thread ends. A call that overruns its timeout (or does not stop
 * when its run is cancelled) is abandoned by the run but keeps running,
 * and keeps its reference: the tool's execute function and payload stay
 * valid however long it takes. So the creator frees the registry when it
 * is done with it (loom_tool_registry_free drops its reference), with no
 * wait for such calls; the last one out frees the tools and their
 * payloads. What a payload merely borrows (a store, say) must outlive the
 * registry's last reference, or the tool must not be able to overrun.
 */
#ifndef LOOM_TOOLS_H
#define LOOM_TOOLS_H

#include "buf.h"
#include "cancel.h"
#include "common.h"
#include "config.h"
#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What a tool is given besides its arguments. All borrowed. */
typedef struct {
    const char *call_id;     /* the model's tool call id */
    const char *tool_name;
    loom_cancel *cancel;     /* set when the run is cancelled; poll it */
    const json_t *settings;  /* this tool's config settings, or NULL */
    const json_t *user_keys; /* the requesting user's own keys: object,
                                name -> key (e.g. "tavily"), and
                                "secrets": name -> value (what MCP
                                headers' ${user.NAME} take); NULL when
                                none */
    const char *user_id;     /* the user the run is for; NULL: anonymous */
    /*
     * Where the tool may write a short summary of its result, at most
     * LOOM_TOOL_SUMMARY_MAX bytes; optional. The context engine
     * (loom/context.h) shows it in place of the result once the result is
     * old and the request must shrink; the full result is still what is
     * stored. NULL when the caller takes no summary.
     */
    loom_buf *summary;
    /*
     * Where a tool that returns documents (search results, pages) reports
     * them, for the run's seen documents (passed back as excluded_ids) and
     * citations: an empty JSON array to append objects to, each with a
     * string `id` (at most LOOM_TOOL_DOCUMENT_ID_MAX bytes) and whatever
     * else describes it (title, url, snippet...). The run reads at most
     * LOOM_TOOL_DOCUMENTS_MAX of them, and only from a call that
     * succeeded. NULL when the caller takes none.
     */
    json_t *documents;
    /*
     * Where the tool may report what the call cost, in micro-dollars
     * (a paid search API, a sub-agent's model calls); left at 0 when it
     * cost nothing known. NULL when the caller takes none.
     */
    int64_t *cost_micros;
    /*
     * Where the call's progress and streamed text go (loom_tool_progress,
     * loom_tool_delta, below): the run that started the call, which emits
     * them as events. Opaque; NULL when nobody listens (those calls then
     * do nothing).
     */
    struct loom_tool_events *events;
    /*
     * loom's own: where the call sits in a tree of agent runs, for the
     * tools loom builds (sub-agents, loom/session.h). NULL outside a run;
     * other tools ignore it.
     */
    struct loom__tool_host *host;
    /*
     * Where a tool whose result holds images (an MCP tool's image
     * content) puts them for a model that can see (its
     * capabilities.vision): an empty JSON array to append objects to,
     * each {"data": base64 without a "data:" prefix, "mime": "image/png"
     * (or image/jpeg, image/gif, image/webp: what every provider
     * takes)}. The run sends them to the model with the call's
     * result, in order; it takes at most LOOM_TOOL_IMAGES_MAX of them, of
     * at most LOOM_TOOL_IMAGE_MAX_BYTES decoded bytes each, and only from
     * a call that succeeded (an image that breaks these rules is left
     * out). The result text should still say that an image is there (a
     * short description), for what reads only text. NULL when the model
     * cannot see images or the caller takes none.
     */
    json_t *images;
} loom_tool_ctx;

/* The most bytes a tool's summary may take. */
#define LOOM_TOOL_SUMMARY_MAX 4096
/* The most documents one call reports, and the longest id. */
#define LOOM_TOOL_DOCUMENTS_MAX 100
#define LOOM_TOOL_DOCUMENT_ID_MAX 128
/* The most images one call gives the model, and the most bytes of one. */
#define LOOM_TOOL_IMAGES_MAX 4
#define LOOM_TOOL_IMAGE_MAX_BYTES (5 * 1024 * 1024)

/* The most bytes of a progress step's label, icon or status (longer ones
 * are cut on a character boundary). */
#define LOOM_TOOL_PROGRESS_TEXT_MAX 512

/*
 * Reports a progress step of the running call: label (what it is doing
 * now, "Searching the web"), icon (a name the client maps to a picture,
 * "SEARCH") and status ("running", "done"...); icon and status may be
 * NULL. The run emits it as a `tool.progress` event before the call's
 * tool.completed, calls the agent's on_tool_progress hook and stores the
 * steps with the turn (docs/tools.md "Progress and streamed text").
 * Safe from the tool's thread (or any thread it started) while execute()
 * runs, never after it returned. A ctx without events (NULL), or a call
 * its run has abandoned, drops it. Progress is best effort: when the run
 * falls far behind, the oldest pending steps of the call are dropped.
 */
void loom_tool_progress(const loom_tool_ctx *ctx, const char *label,
                        const char *icon, const char *status);

/*
 * Streams len bytes of text the call produces as it goes (a `tool.delta`
 * event), under the same rules as loom_tool_progress. Send whole UTF-8
 * characters: bytes that are not valid UTF-8 are shown as U+FFFD.
 * Deltas the run has not emitted yet are joined into one.
 */
void loom_tool_delta(const loom_tool_ctx *ctx, const char *text, size_t len);

/*
 * Asks whoever runs the call's turn to fill in a form on behalf of
 * source (an MCP server's name): message says what for, schema (a flat
 * JSON Schema object of strings, numbers, booleans and enums, as MCP's
 * elicitation/create sends) what to fill in. The turn emits an
 * `mcp.elicitation` event and the answer comes through
 * loom_turn_answer_elicitation (the HTTP API's POST /v1/runs/{id}/input,
 * `loom run` asks on the terminal). Blocks the tool's thread until the
 * answer, the run's cancel (then {action: cancel}) or the run's approval
 * timeout (then {action: cancel}); the time does not count toward the
 * call's timeout. *result (caller frees) is {action: accept|decline|
 * cancel, content} with content valid for schema, its defaults filled
 * in. LOOM_ENOTFOUND when the turn has nobody who can answer (a
 * background run, `loom run` without a terminal, a call outside a turn):
 * the caller declines. Safe from the tool's thread while execute() runs.
 */
int loom_tool_elicit(const loom_tool_ctx *ctx, const char *source,
                     const char *message, const json_t *schema,
                     json_t **result);

/* Whether loom_tool_elicit may find someone to ask (1) or not (0). */
int loom_tool_can_elicit(const loom_tool_ctx *ctx);

/*
 * Answers a sampling request of an MCP server (params as its
 * sampling/createMessage has them) made during the running call, with
 * one completion of the call's run's model: the model of the run's call
 * that asked for the tool, resolved anew. messages are user and
 * assistant turns whose content is text or images (a block or a list of
 * them); systemPrompt, temperature and stopSequences (at most 4) are
 * passed on; maxTokens is honoured up to max_tokens (<= 0: 4096);
 * modelPreferences and includeContext are not followed. The run's
 * budget holds for the call (a call it refuses is not made:
 * LOOM_ETOOLARGE), and its usage joins the run's as a side call: a
 * `usage` event of purpose "mcp_sampling" naming the tool, stored with
 * the turn's usage. *result (caller frees) is {role: "assistant",
 * content: {type: "text", text}, model (that answered), stopReason
 * ("endTurn", "maxTokens", or the provider's finish reason)}. Blocks the
 * tool's thread; the run's cancel stops it (LOOM_ECANCELED). Errors:
 * LOOM_EINVALID for params it cannot send (audio, tools; the message
 * says what), LOOM_ENOTFOUND when the call has no run to call for
 * (outside a turn, a bare run without a session), the provider's. Safe
 * from the tool's thread while execute() runs.
 */
int loom_tool_sample(const loom_tool_ctx *ctx, const json_t *params,
                     long max_tokens, json_t **result);

/*
 * Runs the tool. On success returns 0 and writes the result text (what the
 * model reads) into out. On failure returns a negative code and writes a
 * message into out (or leaves it empty and sets loom_error_last); the
 * model is shown "Error: <message>". out has a size limit: hitting it
 * (LOOM_ETOOLARGE) is a failure the loop reports, not a crash.
 */
typedef int (*loom_tool_execute_fn)(const json_t *args,
                                    const loom_tool_ctx *ctx, loom_buf *out,
                                    void *payload);

/*
 * A tool as an embedder writes one: start from `= {0}` or
 * LOOM_TOOL_INIT and set the fields by name. version: 0 or
 * LOOM_TOOL_VERSION; the registry refuses one it does not know.
 */
#define LOOM_TOOL_VERSION 1
typedef struct {
    unsigned version;
    const char *name;        /* [a-zA-Z0-9_-]{1,64} */
    const char *description;
    const json_t *parameters; /* JSON Schema object; NULL: no arguments */
    loom_tool_execute_fn execute;
    void *payload;                 /* passed to execute */
    void (*free_payload)(void *payload); /* called on removal, may be NULL */
    /*
     * Whether the tool is enabled for this call's user and request
     * (ctx->user_id, user_keys, settings; summary, documents,
     * cost_micros and images are NULL): 0 means not, and the call ends failed
     * with code TOOL_NOT_ENABLED without running (docs/tools.md). Called on the
     * run's thread before the arguments are read; it must not block for long.
     * NULL: always enabled.
     */
    int (*should_use)(const loom_tool_ctx *ctx, void *payload);
} loom_tool;

#define LOOM_TOOL_INIT                                                         \
    {                                                                          \
        .version = LOOM_TOOL_VERSION                                           \
    }

typedef struct loom_tool_registry loom_tool_registry;

/* A new, empty registry; the caller holds its one reference. */
int loom_tool_registry_new(loom_tool_registry **out);
/*
 * Drops the caller's reference. The last reference (the caller's, or that
 * of a tool call still running on its thread) frees every tool and their
 * payloads. NULL is a no-op.
 */
void loom_tool_registry_free(loom_tool_registry *reg);

/*
 * Copies the tool (name, description, a reference to parameters) into the
 * registry. LOOM_EEXISTS for a duplicate name, LOOM_EINVALID for a bad
 * version or name or a missing execute. On failure free_payload is not called:
 * the caller still owns the payload.
 */
int loom_tool_registry_add(loom_tool_registry *reg, const loom_tool *tool);
/* LOOM_ENOTFOUND when absent. */
int loom_tool_registry_remove(loom_tool_registry *reg, const char *name);
/* Borrowed; NULL when absent. */
const loom_tool *loom_tool_registry_get(const loom_tool_registry *reg,
                                        const char *name);
size_t loom_tool_registry_count(const loom_tool_registry *reg);
/* The i-th tool in the order added, NULL past the end. */
const loom_tool *loom_tool_registry_at(const loom_tool_registry *reg,
                                       size_t i);
void loom_tool_registry_clear(loom_tool_registry *reg);
/* Names in order, joined with ", " ("a, b"); caller frees. */
char *loom_tool_registry_names(const loom_tool_registry *reg);

/*
 * A registry of reg's tools now (the caller holds its one reference): its
 * own tools, and those of the MCP servers started in the background
 * (loom_mcp_setup.background), waiting for a server's first listing (or
 * one due after its list changed) within its startup_timeout_ms; a server
 * that fails adds no tools. For a registry without such servers it is reg
 * itself, with one more reference. *out is NULL when reg is. LOOM_ENOMEM.
 */
int loom_tool_registry_snapshot(loom_tool_registry **out,
                                const loom_tool_registry *reg);

/*
 * Whether name (or a pattern `prefix*`) stands for tools of an MCP server
 * that reg gets in snapshots (`<server>__...`), present or not.
 */
int loom_tool_registry_claims(const loom_tool_registry *reg, const char *name);

/*
 * Validates value against a JSON Schema subset: type (string, number,
 * integer, boolean, object, array, null, or a list of them), required,
 * properties, additionalProperties (false or a schema), enum, const,
 * items, minItems/maxItems, minimum/maximum, exclusiveMinimum/Maximum,
 * minLength/maxLength (in code points), pattern is ignored. Returns 0 when
 * valid; otherwise LOOM_EINVALID and *msg (caller frees) says what to fix
 * in words a model can act on: "`query` is required and must be a
 * string", "`items[2].count` must be at most 10".
 */
int loom_schema_validate(const json_t *schema, const json_t *value,
                         char **msg);

/* Adds loom's built-in tools (get_time, ...). */
int loom_tools_add_builtins(loom_tool_registry *reg);

/*
 * Registers the tools the config declares (the `http_tools`, then the
 * tools of the `mcp_servers`, see loom/mcp.h: those servers are started
 * and listed here, and one that fails is logged and skipped) in reg, in
 * file order; each copies what it needs, so cfg may be freed after.
 * LOOM_EEXISTS when a name is already registered (a built-in), LOOM_EINVALID
 * for a malformed allow_hosts entry; tools added before the failure stay
 * registered. Defined in src/tools/http_tools.c.
 */
int loom_tools_add_from_config(loom_tool_registry *reg, const loom_config *cfg);

/*
 * A new registry with loom's built-in tools and then the config's own
 * (what `loom run` and `loom serve` offer). On failure *out is NULL and
 * the error says which tool.
 */
int loom_tools_new_from_config(loom_tool_registry **out,
                               const loom_config *cfg);

#ifdef __cplusplus
}
#endif
#endif
