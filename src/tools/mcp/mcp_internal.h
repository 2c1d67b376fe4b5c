/*
 * tools/mcp/mcp_internal.h: what the MCP client core (mcp_client.c)
 * shares with its transports (mcp_stdio.c, mcp_http.c).
 *
 * The core owns the JSON-RPC state: request ids, the requests waiting for
 * an answer, the handshake and the server's state. A transport moves
 * messages: send() writes one, and every message that arrives is handed
 * to loom__mcp_dispatch(), whatever thread it arrives on (the stdio
 * reader thread, or the thread of an HTTP POST whose answer it is). A
 * transport that finds its server gone calls loom__mcp_lost().
 *
 * A connection is one start of the server (one process, one HTTP
 * session), numbered by gen. It is reference counted under the server's
 * lock: a restart retires the old one (stop: the process is ended, the
 * reader threads joined) while a sender may still hold it; the last
 * reference frees it.
 */
#ifndef LOOM_TOOLS_MCP_INTERNAL_H
#define LOOM_TOOLS_MCP_INTERNAL_H

#include "loom/mcp.h"

#include <jansson.h>
#include <stdint.h>

/* The largest message accepted from a server. */
#define LOOM_MCP_MAX_MESSAGE ((size_t)64 << 20)

typedef struct mcp_pending mcp_pending;

typedef struct {
    const char *name; /* "stdio", "http" */
    /* Starts a connection for s; *impl is the transport's state. */
    int (*open)(loom_mcp_server *s, unsigned gen, void **impl);
    /*
     * Sends msg. p is the request whose answer is awaited (NULL for a
     * notification or a reply); a transport that answers on the same
     * exchange (HTTP) dispatches the answer before it returns. Stops at
     * deadline (loom__mono_ms) or when cancel is set. LOOM_ENOTFOUND
     * means the HTTP session expired.
     */
    int (*send)(void *impl, const json_t *msg, int64_t deadline,
                loom_cancel *cancel, mcp_pending *p);
    /* Ends the connection: no dispatch happens after it returns. */
    void (*stop)(void *impl);
    /* Frees what stop left (after the last sender let go). */
    void (*free)(void *impl);
    /*
     * The 2026-07-28 era: keeps a subscriptions/listen request open
     * (loom__mcp_listen_request) until stop, its messages dispatched
     * (HTTP: its stream's; stdio: those tagged with its id), opened
     * again when it ends. Called once per connection, after the server
     * was discovered; returns when it is open (HTTP: or a little
     * later; stdio: once the request is written).
     */
    void (*listen)(void *impl);
} mcp_transport;

extern const mcp_transport loom__mcp_stdio;
extern const mcp_transport loom__mcp_http;
/* The legacy HTTP+SSE transport (2024-11-05), mcp_sse_legacy.c. */
extern const mcp_transport loom__mcp_sse;

struct curl_slist;
/*
 * Appends "key: value" for each string of o to h (a curl header list);
 * NULL on OOM (h is then freed). Values that would break the header (CR,
 * LF) or do not fit are left out, and so are values naming a user's
 * secret (${user.NAME}: a call sends those resolved). Defined in
 * mcp_http.c.
 */
struct curl_slist *loom__mcp_curl_headers(struct curl_slist *h,
                                          const json_t *o);

/* Takes one more reference to s (loom_mcp_server_free drops it). */
void loom__mcp_ref(loom_mcp_server *s);

/* How many notifications/tools/list_changed the server sent (any
 * thread): a change means its tools should be listed again. */
unsigned loom__mcp_lists_changed(loom_mcp_server *s);

/* Marks the server's tool list stale as its list_changed does: a
 * subscription opened again may have missed a change. */
void loom__mcp_list_stale(loom_mcp_server *s);

/*
 * A new subscriptions/listen request (2026-07-28) asking for
 * toolsListChanged, with a fresh id and the era's `_meta`. NULL on OOM.
 */
json_t *loom__mcp_listen_request(loom_mcp_server *s);

/* Logs that the server refused subscriptions/listen with error (the
 * answer's `error`): its list changes are not followed. */
void loom__mcp_listen_refused(loom_mcp_server *s, const json_t *error);

/* The server's config and name, for the transports. Borrowed. */
const loom_mcp_server_config *loom__mcp_config(const loom_mcp_server *s);

/* The negotiated protocol version, copied into out ("" before). */
void loom__mcp_protocol(loom_mcp_server *s, char *out, size_t cap);

/* When request p's time is up now (progress pushes it back). */
int64_t loom__mcp_deadline(loom_mcp_server *s, const mcp_pending *p);
/* Pushes p's deadline back by ms (a person's time spent authorizing). */
void loom__mcp_defer(loom_mcp_server *s, mcp_pending *p, int64_t ms);

/* The headers of the call p belongs to (loom_mcp_call_options.headers);
 * NULL: none. Borrowed for as long as p waits. */
const json_t *loom__mcp_call_headers(const mcp_pending *p);

/* Whether request p has its answer (a transport may stop reading). */
int loom__mcp_answered(loom_mcp_server *s, const mcp_pending *p);

/*
 * Handles one message from connection gen: an answer wakes its request;
 * a request from the server is answered (ping; the rest "method not
 * found"); notifications are logged or noted. Takes msg's reference.
 */
void loom__mcp_dispatch(loom_mcp_server *s, unsigned gen, json_t *msg);

/* Connection gen is gone (why: for messages): its requests fail now. */
void loom__mcp_lost(loom_mcp_server *s, unsigned gen, const char *why);

/*
 * The HTTP headers msg needs beyond the transport's own, as a new object
 * (name -> value): in the 2026-07-28 era Mcp-Method, Mcp-Name (the tool,
 * prompt or resource) and the Mcp-Param-* headers a tool's x-mcp-header
 * annotations ask for; nothing before. NULL on OOM.
 */
json_t *loom__mcp_request_headers(loom_mcp_server *s, const json_t *msg);

/* ---- mcp_meta.c ---- */

/* The `_meta` of a 2026-07-28 request: version, client info, caps. */
json_t *loom__mcp_meta(const char *version, const json_t *caps);

/*
 * The x-mcp-header annotations of tool's parameters: *map is a new object
 * param -> header name, or NULL when there are none. LOOM_EINVALID (why
 * says what) for an annotation that is not a header name, that is on a
 * parameter that is not a string, integer or boolean (not a number, as
 * the 2026-07-28 spec says), or that
 * repeats another (case does not count).
 */
int loom__mcp_tool_headers(const json_t *tool, json_t **map, char *why,
                           size_t cap);

/*
 * Adds to headers the Mcp-Param-<Name> of each annotated parameter of
 * args (map from loom__mcp_tool_headers): numbers as JSON writes them,
 * booleans as true/false, strings as they are unless they hold
 * characters outside printable ASCII or start or end with a space (then
 * =?base64?...?=); null or absent ones are left out.
 */
int loom__mcp_add_param_headers(json_t *headers, const json_t *map,
                                const json_t *args);

/* Sets in content each property of schema it lacks that has a default. */
int loom__mcp_apply_defaults(const json_t *schema, json_t *content);

/* ---- mcp_users.c: users' own servers ---- */

typedef struct mcp_users mcp_users;

/* Whether s's tools use each caller's own OAuth credentials
 * (loom_mcp_server_set_per_user). */
int loom__mcp_per_user(loom_mcp_server *s);

/*
 * Makes child (new, unused, made from s's config) user's own server of
 * s: s's credential store, answerer and elicitation, user's credentials,
 * and s's tool listing for the headers of its calls. s must outlive
 * child's calls (each call of s's holds s). LOOM_ENOMEM.
 */
int loom__mcp_adopt(loom_mcp_server *child, loom_mcp_server *s,
                    const char *user);

/* An empty table of users' servers (one per HTTP server). LOOM_ENOMEM. */
int loom__mcp_users_new(mcp_users **out);
/*
 * user's own server of s (a new reference in *out), kept in users (s's):
 * made on first use, the least recently used let go past
 * LOOM_MCP_USERS_MAX. LOOM_EINVALID for an empty user, LOOM_ENOMEM.
 */
int loom__mcp_user_server(loom_mcp_server *s, mcp_users *users,
                          const char *user, loom_mcp_server **out);
/* Drops every user's server (the calls in flight keep theirs). */
void loom__mcp_users_free(mcp_users *u);
/*
 * Lets go of user's own server in users, when there is one: the next
 * call of that user's makes a new one (loading that user's credentials
 * again). A call in flight keeps its reference, but its server no longer
 * saves credentials (a refresh it makes is not written back).
 */
void loom__mcp_users_drop(mcp_users *users, const char *user);
/* s's table of users' servers; NULL for a server without OAuth. */
mcp_users *loom__mcp_users(loom_mcp_server *s);
/* Where s's OAuth credentials live (loom_mcp_server_set_credentials). */
loom_mcp_credentials loom__mcp_credentials(loom_mcp_server *s);

/* ---- mcp_oauth.c: the OAuth 2.1 client of HTTP servers ---- */

typedef struct mcp_oauth mcp_oauth;

/* The OAuth state of s (an HTTP server), NULL for stdio. Borrowed. */
mcp_oauth *loom__mcp_oauth(loom_mcp_server *s);

/* A new OAuth state for server s, *out. LOOM_EINVALID for a bad `oauth`
 * config (the message says what). */
int loom__mcp_oauth_new(mcp_oauth **out, loom_mcp_server *s);
void loom__mcp_oauth_free(mcp_oauth *o);
void loom__mcp_oauth_set_authorizer(mcp_oauth *o, const loom_mcp_authorizer *a);
void loom__mcp_oauth_set_credentials(mcp_oauth *o,
                                     const loom_mcp_credentials *c);
/*
 * Whether json (credentials as loom_mcp_credentials saves them) holds a
 * token for its current issuer: an access or a refresh token.
 */
int loom__mcp_oauth_text_connected(const char *json);
/* Whose credentials o loads and saves (loom_mcp_server_set_oauth_user):
 * user's, or "" (NULL) the server's. Copied; LOOM_ENOMEM. */
int loom__mcp_oauth_set_user(mcp_oauth *o, const char *user);

/*
 * Before a request: refreshes an access token that has expired (when a
 * refresh token is at hand), then writes "Bearer <token>" into out, or ""
 * when there is no token. A token longer than cap is never sent.
 */
void loom__mcp_oauth_bearer(mcp_oauth *o, int64_t deadline, char *out,
                            size_t cap);

/*
 * An answer of status (401, 403) came to a request that carried bearer
 * ("" for none), with the WWW-Authenticate header www ("" for none).
 * Returns 1 when a (new) token is ready and the request should be sent
 * again, 0 when the answer is no authorization challenge (a 403 that is
 * not insufficient_scope), or the error (message set) when authorization
 * failed or gave up: after 3 authorizations in a row that did not lead
 * to an accepted request. *deadline bounds the authorization and is
 * pushed back by the time a person took (the authorizer's wait), so the
 * request sent again still has its own time.
 */
int loom__mcp_oauth_challenge(mcp_oauth *o, long status, const char *www,
                              const char *bearer, int64_t *deadline);

/* A request that carried a token was accepted: the attempts start over. */
void loom__mcp_oauth_accepted(mcp_oauth *o);

/* Whether the last authorization failed (and nothing was accepted since):
 * an answer that is an authorization failure, not an old server's. */
int loom__mcp_oauth_failed(mcp_oauth *o);

/* ---- mcp_oauth_util.c: the pure parts, for tests ---- */

#define LOOM_PKCE_MAX 64
#define LOOM_URL_MAX 2048

/* base64url of n bytes, without padding, into out (cap bytes, NUL
 * ended). Its length, or 0 when cap is too small. */
size_t loom__b64url(const unsigned char *in, size_t n, char *out, size_t cap);

/* BASE64URL(SHA256(verifier)) (RFC 7636 S256). */
int loom__pkce_challenge(const char *verifier, char out[LOOM_PKCE_MAX]);

/* A new verifier (43 characters from 32 random bytes) and its challenge. */
int loom__pkce_pair(char verifier[LOOM_PKCE_MAX],
                    char challenge[LOOM_PKCE_MAX]);

/* bytes random bytes as base64url into out (cap bytes). */
int loom__oauth_random(char *out, size_t bytes, size_t cap);

/* Appends s percent-encoded: all but the unreserved characters. */
int loom__form_escape(loom_buf *b, const char *s);

/* Appends key=value (both percent-encoded, '&' between pairs) to b; a
 * NULL value adds nothing. */
int loom__form_add(loom_buf *b, const char *key, const char *value);

/* The decoded value of query parameter name of url (new string), NULL
 * when absent (or OOM). */
char *loom__query_param(const char *url, const char *name);

/* The parameters (keys lowercased) of a Bearer challenge, as a new
 * object; NULL when header is no Bearer challenge. */
json_t *loom__www_authenticate(const char *header);

/* An http(s) URL cut up: scheme and authority lowercased, the default
 * port left out; path without query or fragment. */
typedef struct {
    char scheme[8];
    char authority[256];
    char path[LOOM_URL_MAX];
} loom_url_parts;
int loom__url_parts(const char *url, loom_url_parts *u);

/* Whether resource (a protected-resource metadata's) may stand for the
 * server at server_url: same scheme, host and port, its path the
 * server's or a parent of it, no fragment. */
int loom__oauth_resource_ok(const char *resource, const char *server_url);

/* The authorization-server metadata URLs of issuer, in the order to try
 * (RFC 8414 section 3.1, then OpenID Connect Discovery both ways). Their
 * number, or LOOM_EINVALID. cap >= 3. */
int loom__oauth_metadata_urls(const char *issuer, char urls[][LOOM_URL_MAX],
                              int cap);

/* The protected-resource metadata URLs of a server (RFC 9728 section
 * 3.1): path-based first, then the root. cap >= 2. */
int loom__oauth_prm_urls(const char *server_url, char urls[][LOOM_URL_MAX],
                         int cap);

/* Whether an authorization response's iss (NULL when absent) is right
 * for issuer (RFC 9207): equal as strings when present; absent only when
 * the metadata does not promise it. */
int loom__oauth_iss_ok(const json_t *as_meta, const char *issuer,
                       const char *iss);

/* Whether metadata fetched for issuer names that very issuer (RFC 8414
 * section 3.3, as strings) and has a token endpoint. */
int loom__oauth_as_metadata_ok(const json_t *meta, const char *issuer);

#endif
