/*
 * loom/mcp.h: the MCP (Model Context Protocol) client.
 *
 * A server object stands for one server of the config's `mcp_servers`
 * (loom/config.h): a program started with stdio, a Streamable HTTP
 * endpoint, or an HTTP+SSE one (the legacy transport, `transport: sse`). It
 * connects on first use (the handshake of the 2025-11-25 protocol, older
 * versions accepted), is shared by every thread that uses it, and reconnects on
 * the next use after the server died (a stdio program that exited, an HTTP
 * session that expired), with a backoff that grows while it keeps failing.
 * Calls in flight when it dies fail at once. A call past its timeout, or whose
 * cancel flag is set, sends notifications/cancelled and fails; nothing waits on
 * a dead server.
 *
 * loom_tools_add_mcp() offers each server's tools in a tool registry as
 * `<server>__<tool>` (docs/mcp.md says how names are made).
 *
 * Ownership: a server is reference counted. loom_mcp_server_new() gives
 * the caller one reference; each registered tool holds one more. The last
 * reference stops the server (its program and the whole process group
 * are ended, an HTTP session is deleted) and frees it.
 */
#ifndef LOOM_MCP_H
#define LOOM_MCP_H

#include "buf.h"
#include "cancel.h"
#include "common.h"
#include "config.h"
#include "tools.h"
#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_mcp_server loom_mcp_server;

/* The newest protocol version of each era loom speaks. */
#define LOOM_MCP_PROTOCOL_VERSION "2025-11-25"
#define LOOM_MCP_PROTOCOL_STATELESS "2026-07-28"

/*
 * Answers a request the server makes of the client: method is
 * "elicitation/create" (params: message, requestedSchema) or, for a
 * server whose config says `sampling: allow`, "sampling/createMessage"
 * (params: messages, maxTokens, systemPrompt, ...), and params as the
 * server sent them. Sets *result to a new result object (for an
 * elicitation {action: accept|decline|cancel, content}; for sampling
 * {role, content, model, stopReason}) and returns 0, or returns a
 * negative code to refuse (for sampling the server is told the message:
 * LOOM_ENOTFOUND as the spec's "user rejected" -1, LOOM_EINVALID as
 * -32602, others -32603). The defaults of requestedSchema are filled
 * into an accepted content by the client. Called on the thread that read
 * the request, or on the caller's for a 2026-07-28 input_required
 * result.
 */
typedef int (*loom_mcp_input_fn)(loom_mcp_server *s, const char *method,
                                 const json_t *params, void *arg,
                                 json_t **result);

/*
 * A server for cfg (copied: cfg may be freed after). Nothing is started
 * yet. LOOM_EINVALID for a config without command or url.
 */
int loom_mcp_server_new(loom_mcp_server **out,
                        const loom_mcp_server_config *cfg);

/*
 * Who answers the server's elicitations when the call they come with has
 * no answerer of its own (loom_mcp_call_options.input). Set before first
 * use: the client advertises the elicitation capability only when there
 * is one (or loom_mcp_server_set_elicitation said calls may bring one);
 * without an answerer an elicitation is declined.
 */
void loom_mcp_server_set_input(loom_mcp_server *s, loom_mcp_input_fn fn,
                               void *arg);

/*
 * Whether calls may bring an answerer of their own (on: a process with
 * someone to ask, as `loom serve`): the elicitation capability is then
 * declared on every connection, and an elicitation that comes with a
 * call without an answerer is declined. Set before first use.
 */
void loom_mcp_server_set_elicitation(loom_mcp_server *s, int on);

/*
 * How the authorization-code step of OAuth reaches a person (or, in
 * tests, an authorization server that answers at once). redirect_uri
 * writes the redirect URI the client registers and sends (cap bytes);
 * authorize shows url (the authorization request) and gives back in
 * *callback (caller frees) the whole URL the browser was sent back to.
 * Both return 0 or an error code with the message set.
 */
typedef struct {
    int (*redirect_uri)(void *arg, char *uri, size_t cap);
    int (*authorize)(void *arg, const char *url, char **callback);
    void *arg;
} loom_mcp_authorizer;

/*
 * Who runs the authorization-code step when an HTTP server asks for
 * OAuth and no usable token is at hand (a refresh token is tried first).
 * Without one that step fails with a message that says to run `loom mcp
 * login SERVER`. a is copied; NULL removes it.
 */
void loom_mcp_server_set_authorizer(loom_mcp_server *s,
                                    const loom_mcp_authorizer *a);

/*
 * Where an HTTP server's OAuth credentials (registered clients and
 * tokens, per authorization server) live between runs, per user: load
 * gives the JSON text saved last for user (*json, caller frees;
 * LOOM_ENOTFOUND when none), save replaces it. user is "" for the
 * server's own credentials, else the user whose own they are (a store
 * user id, loom_mcp_server_set_oauth_user); one user's are never given
 * for another's. The text holds secrets: keep it sealed (loom keeps it
 * encrypted in its store, docs/mcp.md#oauth). Set before first use;
 * without one credentials last as long as the server object.
 */
typedef struct {
    int (*load)(void *arg, const char *server, const char *user, char **json);
    int (*save)(void *arg, const char *server, const char *user,
                const char *json);
    void *arg;
} loom_mcp_credentials;
void loom_mcp_server_set_credentials(loom_mcp_server *s,
                                     const loom_mcp_credentials *c);

/*
 * Whose OAuth credentials s uses: user's own (a store user id), or the
 * server's own (NULL or "", the default). What `loom mcp login SERVER
 * --user NAME` sets. Set before first use; copied. LOOM_ENOMEM.
 */
int loom_mcp_server_set_oauth_user(loom_mcp_server *s, const char *user);

/*
 * Per-user OAuth (on: accounts are on, as in `loom serve` with auth mode
 * keys or jwt): each call of s's tools made for a user
 * (loom_tool_ctx.user_id) uses that user's own credentials
 * (loom_mcp_call_options.user), and a call for no user fails; the
 * server's own credentials serve only to list its tools. No effect on a
 * server without OAuth (stdio, the legacy SSE transport, `oauth:
 * {disabled: true}`). Set before first use.
 */
void loom_mcp_server_set_per_user(loom_mcp_server *s, int on);

/*
 * Users connecting their own accounts (docs/mcp.md "Connecting your own
 * account"): what `loom serve` offers a signed-in user at /v1/me/mcp.
 *
 * loom_mcp_server_user_oauth: 1 when s's calls use each caller's own
 * OAuth tokens obtained with a person's consent (per-user on, an HTTP
 * server with OAuth, not the client-credentials grant), else 0.
 *
 * loom_mcp_server_user_connected: 1 when s's credential store holds
 * tokens (an access or a refresh token) of user's own, 0 when not, or
 * the store's error code (a row that does not open).
 *
 * loom_mcp_server_connect_user: authorizes loom for user's own account:
 * discovery, registration, PKCE, iss, token exchange as any
 * authorization, with az running the person's step (its authorize may
 * wait up to wait_ms for them), the tokens saved under user in s's
 * credential store. Tokens user already has that still work are kept and
 * az is not asked. Then user's open session of s, if any, is let go, so
 * their next call uses the new tokens. Blocks until done; LOOM_EINVALID
 * when s takes no per-user account, else the errors of
 * loom_mcp_server_tools().
 *
 * loom_mcp_server_forget_user: lets go of user's own session of s (its
 * connection closes when the calls in flight are over; they no longer
 * save tokens). The stored credentials are left alone.
 */
int loom_mcp_server_user_oauth(loom_mcp_server *s);
int loom_mcp_server_user_connected(loom_mcp_server *s, const char *user);
int loom_mcp_server_connect_user(loom_mcp_server *s, const char *user,
                                 const loom_mcp_authorizer *az, long wait_ms);
void loom_mcp_server_forget_user(loom_mcp_server *s, const char *user);

/* Drops the caller's reference (see above). NULL is a no-op. */
void loom_mcp_server_free(loom_mcp_server *s);

/* The server's name in the config. Borrowed. */
const char *loom_mcp_server_name(const loom_mcp_server *s);

/*
 * The server's tools, started first when needed: every page of tools/list
 * (paging stops with a warning at a cursor that does not advance or comes
 * back, and after 100 pages), then the config's allow-list. *out is a new
 * array of the tool objects as the server wrote them. Errors: those of
 * loom_mcp_server_call(); on error *out is NULL.
 */
int loom_mcp_server_tools(loom_mcp_server *s, json_t **out);

/*
 * Calls tool with args (an object, or NULL for none) and gives the whole
 * result object in *out (caller frees). timeout_ms 0: the config's
 * timeout_ms. cancel may be NULL. Errors: LOOM_ETIMEDOUT, LOOM_ECANCELED
 * (both after notifications/cancelled was sent), LOOM_EUPSTREAM (the
 * server could not be started, died, or answered with a JSON-RPC error;
 * the message says which), LOOM_EPROTO (an answer that is not MCP).
 */
int loom_mcp_server_call(loom_mcp_server *s, const char *tool,
                         const json_t *args, long timeout_ms,
                         loom_cancel *cancel, json_t **out);

/*
 * What a call may be given besides its arguments. timeout_ms (0: the
 * config's) is how long the call may go without news: each progress
 * notification of the server pushes the end back to timeout_ms from
 * then, but never past total_ms after the start (0: 5 times timeout_ms).
 * on_progress (may be NULL) gets each notifications/progress params
 * (progress, total, message) on the thread that read it, only while the
 * call runs. A call always asks for progress (a progressToken).
 * headers (may be NULL): HTTP headers of this call only (name -> value),
 * sent with the config's by the Streamable HTTP transport: the values of
 * config headers that name a user's secret (${user.NAME}), resolved for
 * the caller (loom_mcp_user_headers). Borrowed for the call.
 */
typedef struct {
    long timeout_ms;
    long total_ms;
    loom_cancel *cancel;
    void (*on_progress)(const json_t *params, void *arg);
    void *progress_arg;
    /*
     * Who answers the elicitations (and, when the server may sample,
     * the sampling requests) that come with this call (NULL: the
     * server's answerer, loom_mcp_server_set_input): called on the
     * calling thread, never on a transport's reader, while the call runs.
     * The time it takes does not count toward the call's timeout, so it
     * may wait for a person (and should watch cancel). elicitation: 1
     * when input answers elicitations (the 2026-07-28 era declares the
     * capability per request, then); an elicitation given to a call
     * without one is declined. A stdio server's request is the call's
     * when it is the only call in flight with an answerer; with several
     * it cannot be told apart and is declined.
     */
    loom_mcp_input_fn input;
    void *input_arg;
    int elicitation;
    const json_t *headers;
    /*
     * The user (a store user id) whose own OAuth credentials the call
     * uses, NULL: the server's. Such a call goes through a connection of
     * that user's own (its own session, its own tokens, refreshed and
     * saved under that user), made on first use and kept for the next
     * calls, for at most LOOM_MCP_USERS_MAX users at once (the least
     * recently used is let go). Without credentials of that user's, a
     * server that asks for authorization fails the call with a message
     * that says to run `loom mcp login SERVER --user USER`: a call never
     * runs the authorization-code step for a user. Ignored by a server
     * without OAuth. Borrowed for the call.
     */
    const char *user;
} loom_mcp_call_options;

/* Users with a connection of their own to one server at most. */
#define LOOM_MCP_USERS_MAX 64

/*
 * Per-user header values (docs/mcp.md "Per-user headers"): a config
 * header whose value holds ${user.NAME} is never sent as written; each
 * call sends it with every ${user.NAME} replaced by the caller's secret
 * NAME, taken from secrets (an object, name -> string; NULL: none).
 * *out (new reference) is an object of those headers, resolved, or NULL
 * when the server has none. LOOM_ENOTFOUND when secrets lack a name (the
 * message says which and where to add it), LOOM_EINVALID for a value
 * that cannot go in a header (a line break, or longer than 8 KiB),
 * LOOM_ENOMEM.
 */
int loom_mcp_user_headers(const loom_mcp_server *s, const json_t *secrets,
                          json_t **out);

/* loom_mcp_server_call() with options (o may be NULL: the defaults). */
int loom_mcp_server_call_opts(loom_mcp_server *s, const char *tool,
                              const json_t *args,
                              const loom_mcp_call_options *o, json_t **out);

/*
 * Sends any request (resources/list, prompts/get, ...) with params (NULL
 * for none) and gives its result in *out, as loom_mcp_server_call() does.
 */
int loom_mcp_server_request(loom_mcp_server *s, const char *method,
                            const json_t *params, long timeout_ms,
                            loom_cancel *cancel, json_t **out);

/*
 * What the server is now, as a new object: name, transport ("stdio",
 * "http", "sse"), state ("idle" before first use, "starting" during the
 * first start, "ready", "down" after it died, "failed" when the last start
 * failed, "restarting" during a later start), and when known
 * protocol_version, tools (how many its last listing offered), server
 * (its serverInfo) and error (the last one).
 */
json_t *loom_mcp_server_status(loom_mcp_server *s);

/*
 * A tools/call result as text for a model: text content joined with
 * blank lines, structuredContent as JSON when there is no text, images
 * and audio described, resource links and embedded resources by URI (and
 * their text). Cut with a note when out fills. Returns 1 when the result
 * says isError, 0 otherwise, or a negative code (LOOM_ENOMEM).
 */
int loom_mcp_result_text(const json_t *result, loom_buf *out);

/*
 * Checks a tools/call result against the tool's outputSchema (its
 * tools/list entry's, NULL: none): a result that is not an isError one
 * must carry structuredContent that fits the schema, as the protocol
 * asks. Returns 0 when it does (or there is nothing to check);
 * LOOM_EINVALID with *msg (caller frees) saying what is wrong in words a
 * model can act on; LOOM_ENOMEM.
 */
int loom_mcp_result_check(const json_t *output_schema, const json_t *result,
                          char **msg);

/*
 * The tool name `<server>__<tool>`: characters outside [A-Za-z0-9_-]
 * become '_', and a name longer than 64 bytes is cut and given a hash
 * of the whole name, so it stays unique and the same from run to run.
 * out must hold 65 bytes.
 */
void loom_mcp_tool_name(char out[65], const char *server, const char *tool);

/*
 * Starts the config's MCP servers (in parallel, each within its
 * startup_timeout_ms) and registers their tools in reg. A server that
 * cannot be started or listed is logged and skipped: it never fails the
 * call. Returns 0, or LOOM_ENOMEM.
 */
int loom_tools_add_mcp(loom_tool_registry *reg, const loom_config *cfg);

/*
 * A set of servers, to report on them (the servers of a config, failed
 * ones included: loom_mcp_setup.servers). It holds a reference on each.
 * Fill it before sharing it; loom_mcp_set_status() is then safe from any
 * thread.
 */
typedef struct loom_mcp_set loom_mcp_set;
int loom_mcp_set_new(loom_mcp_set **out);
/* Drops the set's references and frees it. NULL is a no-op. */
void loom_mcp_set_free(loom_mcp_set *set);
/* Adds s (the set takes a reference). LOOM_ENOMEM. */
int loom_mcp_set_add(loom_mcp_set *set, loom_mcp_server *s);
/* A new array of each server's loom_mcp_server_status(), in the order
 * added (set NULL: empty); NULL on OOM. */
json_t *loom_mcp_set_status(loom_mcp_set *set);
/* How many servers set holds (NULL: none), and the i-th, borrowed (NULL
 * past the end). */
size_t loom_mcp_set_len(const loom_mcp_set *set);
loom_mcp_server *loom_mcp_set_get(const loom_mcp_set *set, size_t i);
/* The server of set named name, borrowed; NULL when none is. */
loom_mcp_server *loom_mcp_set_find(const loom_mcp_set *set, const char *name);

/*
 * What the servers that loom_tools_add_mcp_with() makes are given before
 * they start: where their OAuth credentials live and who runs the
 * authorization-code step (each NULL: none), and when they start. Both are
 * copied into every server; what they point to (their arg) must outlive the
 * registry. servers (NULL: none) gets every server made, whether it started or
 * not.
 */
typedef struct {
    const loom_mcp_credentials *credentials;
    const loom_mcp_authorizer *authorizer;
    loom_mcp_set *servers;
    /* loom_mcp_server_set_elicitation: the process has someone to ask. */
    int elicitation;
    /* loom_mcp_server_set_per_user: accounts are on. */
    int per_user;
    /*
     * Non-zero: the servers start in the background and the call returns
     * at once. Their tools are then not in the registry itself but in
     * its snapshots (loom_tool_registry_snapshot, which a run takes): a
     * snapshot waits for a server's first listing when its run names the
     * server's tools (or offers every tool), lists them again after the
     * server sent notifications/tools/list_changed, and tries a server
     * that failed again (with the client's backoff). What loom serve and
     * loom run do. 0: each server is started and listed before the call
     * returns, and its tools are registered.
     */
    int background;
} loom_mcp_setup;

/* loom_tools_add_mcp() with setup (NULL: none). */
int loom_tools_add_mcp_with(loom_tool_registry *reg, const loom_config *cfg,
                            const loom_mcp_setup *setup);

/* loom_tools_new_from_config() whose MCP servers get setup (NULL:
 * none). */
int loom_tools_new_from_config_with(loom_tool_registry **out,
                                    const loom_config *cfg,
                                    const loom_mcp_setup *setup);

#ifdef __cplusplus
}
#endif
#endif
