/*
 * loom/server.h: loom's HTTP server, embeddable in-process.
 *
 * The server speaks loom's native run API (/v1/runs, server-sent events),
 * the OpenAI-compatible Chat Completions API, conversations, /healthz,
 * /readyz and /metrics (see docs/server.md). It is event-driven
 * (libmicrohttpd on one polling thread); each run executes on a worker
 * thread of its own.
 *
 * Lifetime: loom_server_new() builds the providers of the config and
 * checks the options; loom_server_start() binds and starts serving;
 * loom_server_stop() stops gracefully (stop accepting, let runs finish up
 * to shutdown_grace_ms, cancel the rest and store what they had);
 * loom_server_free() stops if needed and frees.
 */
#ifndef LOOM_SERVER_H
#define LOOM_SERVER_H

#include "common.h"
#include "config.h"
#include "mcp.h"
#include "store.h"
#include "tools.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_server loom_server;

typedef struct {
    unsigned version;
    /* Borrowed: they must outlive the server. */
    const loom_config *config;        /* required; server: section used */
    loom_store *store;                /* required */
    const loom_tool_registry *tools;  /* NULL: loom's built-in tools */
    /* "HOST:PORT" to listen on; NULL: config->server.listen. Port 0 picks
     * a free port (see loom_server_port). */
    const char *listen;
    /* The config's providers are loom's offline demo (a fake model, as
     * `loom serve` starts without any provider): /readyz and /v1/models
     * say so ("offline_demo": true). */
    int offline_demo;
    /* The MCP servers the tools come from (NULL: none): /readyz reports
     * each one's state (it never makes loom unready). Borrowed. */
    loom_mcp_set *mcp_servers;
} loom_server_options;

#define LOOM_SERVER_OPTIONS_VERSION 1
#define LOOM_SERVER_OPTIONS_INIT                                               \
    {                                                                          \
        .version = LOOM_SERVER_OPTIONS_VERSION                                 \
    }

/*
 * Creates a server: builds one provider per configured provider (shared
 * by every run) and checks the listen address. LOOM_EINVALID for a bad
 * address, a missing config or store, or an agent naming an unknown tool.
 */
int loom_server_new(loom_server **out, const loom_server_options *opts);

/* Binds and starts serving. LOOM_EIO when the address cannot be bound. */
int loom_server_start(loom_server *srv);

/* The port it listens on (after start), 0 before. */
int loom_server_port(const loom_server *srv);

/*
 * Stops gracefully: closes the listening socket, lets running runs go on
 * for up to the config's shutdown_grace_ms, then cancels the rest, waits
 * for them to store their turns and closes every connection. Safe to call
 * twice; not from a signal handler (see loom_server_request_stop).
 */
void loom_server_stop(loom_server *srv);

/*
 * Asks a thread blocked in loom_server_wait() to return; async-signal
 * safe (a SIGTERM handler may call it).
 */
void loom_server_request_stop(loom_server *srv);

/* Blocks until loom_server_request_stop() is called. */
void loom_server_wait(loom_server *srv);

/* Stops if needed, then frees. NULL is a no-op. */
void loom_server_free(loom_server *srv);

/*
 * Raises this process's open files limit (RLIMIT_NOFILE) to its hard
 * limit, so the server can hold as many connections as it is configured
 * for (`loom serve` calls it at start; an embedder decides for itself).
 * *limit (may be NULL) gets the limit now in force, -1 for none. 0, or
 * LOOM_EIO when the limit cannot be read.
 */
int loom_server_raise_fd_limit(long *limit);

#ifdef __cplusplus
}
#endif
#endif
