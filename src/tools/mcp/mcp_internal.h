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
} mcp_transport;

extern const mcp_transport loom__mcp_stdio;
extern const mcp_transport loom__mcp_http;

/* Takes one more reference to s (loom_mcp_server_free drops it). */
void loom__mcp_ref(loom_mcp_server *s);

/* The server's config and name, for the transports. Borrowed. */
const loom_mcp_server_config *loom__mcp_config(const loom_mcp_server *s);

/* The negotiated protocol version, copied into out ("" before). */
void loom__mcp_protocol(loom_mcp_server *s, char *out, size_t cap);

/* When request p's time is up now (progress pushes it back). */
int64_t loom__mcp_deadline(loom_mcp_server *s, const mcp_pending *p);

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

#endif
