/*
 * `loom mcp login SERVER [--user NAME]`: the browser step of OAuth for an
 * HTTP MCP server that needs a person, for the server's own credentials
 * (what lists its tools, and every call without accounts) or for one
 * user's own (what that user's calls use when accounts are on). loom listens on
 * 127.0.0.1 at a port the system picks (the redirect URI
 * http://127.0.0.1:PORT/callback, which the client registers), prints the
 * authorization URL to open, and waits, at most --timeout seconds, for the
 * browser to come back. Only a request for /callback carrying the state of that
 * very URL ends the wait; anything else is answered 400 or 404 and waited past.
 * The MCP client then checks the answer (state, iss), gets the tokens and keeps
 * them sealed in the store (mcp_store.c), where `loom serve`, `loom run`
 * and `loom mcp` find them.
 */
#include "cli/cli.h"
#include "cli/mcp_store.h"
#include "core/clock.h"
#include "core/error.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Bytes of a browser's request line and headers read at most. */
#define REQUEST_MAX 16384
/* How long one connection may take to send its request. */
#define REQUEST_MS 5000
/* The state parameter's longest value. */
#define STATE_MAX 256

typedef struct {
    const char *server;
    int fd;
    int port;
    long timeout_s;
    int asked; /* the authorizer was used */
} login;

static int redirect_uri(void *arg, char *uri, size_t cap)
{
    const login *l = arg;

    snprintf(uri, cap, "http://127.0.0.1:%d/callback", l->port);
    return 0;
}

/* The value of parameter name in the query of url (as written, not
 * decoded) into out; 0 when absent or too long. */
static int query_value(const char *url, const char *name, char *out, size_t cap)
{
    const char *q = strchr(url, '?');
    size_t n = strlen(name);

    for (const char *p = q; p && *p; p = strchr(p + 1, '&')) {
        const char *v = p + 1, *end;
        if (strncmp(v, name, n) != 0 || v[n] != '=')
            continue;
        v += n + 1;
        end = v + strcspn(v, "&# ");
        if ((size_t)(end - v) >= cap)
            return 0;
        memcpy(out, v, (size_t)(end - v));
        out[end - v] = '\0';
        return 1;
    }
    return 0;
}

static void reply(int fd, const char *status, const char *text)
{
    char head[256];
    int n = snprintf(head, sizeof(head),
                     "HTTP/1.1 %s\r\nContent-Type: text/plain; "
                     "charset=utf-8\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n\r\n",
                     status, strlen(text));

    if (write(fd, head, (size_t)n) == n)
        (void)!write(fd, text, strlen(text));
}

/*
 * Reads one request from fd into target (the request line's target).
 * 0, or -1 for a request that is not a GET or did not come in time.
 */
static int read_target(int fd, char *target, size_t cap)
{
    char buf[REQUEST_MAX + 1];
    size_t len = 0;
    int64_t end = loom__mono_ms() + REQUEST_MS;
    const char *sp;

    while (len < REQUEST_MAX && !memmem(buf, len, "\r\n\r\n", 4)) {
        struct pollfd p = {fd, POLLIN, 0};
        long left = (long)(end - loom__mono_ms());
        ssize_t n;
        if (left <= 0 || poll(&p, 1, (int)left) <= 0 ||
            (n = read(fd, buf + len, REQUEST_MAX - len)) <= 0)
            return -1;
        len += (size_t)n;
    }
    buf[len] = '\0';
    if (strncmp(buf, "GET ", 4) != 0 || !(sp = strchr(buf + 4, ' ')) ||
        (size_t)(sp - buf - 4) >= cap)
        return -1;
    memcpy(target, buf + 4, (size_t)(sp - buf - 4));
    target[sp - buf - 4] = '\0';
    return 0;
}

static int authorize(void *arg, const char *url, char **callback)
{
    login *l = arg;
    char state[STATE_MAX], got[STATE_MAX], target[REQUEST_MAX];
    int64_t end = loom__mono_ms() + l->timeout_s * 1000;

    l->asked = 1;
    if (!query_value(url, "state", state, sizeof(state)))
        return loom__error_set(LOOM_EPROTO, "the authorization URL has no "
                                            "state");
    printf("To authorize loom for MCP server '%s', open this URL in a "
           "browser:\n\n  %s\n\nWaiting for the browser to come back to "
           "http://127.0.0.1:%d/callback (at most %ld s)...\n",
           l->server, url, l->port, l->timeout_s);
    fflush(stdout);
    for (;;) {
        struct pollfd p = {l->fd, POLLIN, 0};
        long left = (long)(end - loom__mono_ms());
        int c;

        if (left <= 0)
            /* Not LOOM_ETIMEDOUT: the request's own timeout would be
             * reported in place of this. */
            return loom__error_set(LOOM_ERROR,
                                   "the browser did not come back within "
                                   "%ld s",
                                   l->timeout_s);
        if (poll(&p, 1, (int)left) <= 0)
            continue;
        if ((c = accept(l->fd, NULL, NULL)) < 0)
            continue;
        if (read_target(c, target, sizeof(target)) != 0) {
            reply(c, "400 Bad Request", "loom: not a request it expects\n");
        } else if (strncmp(target, "/callback", 9) != 0 ||
                   (target[9] && target[9] != '?')) {
            reply(c, "404 Not Found", "loom: nothing here\n");
        } else if (!query_value(target, "state", got, sizeof(got)) ||
                   strcmp(got, state) != 0) {
            reply(c, "400 Bad Request",
                  "loom: this answer is not for the authorization loom "
                  "asked for (its state differs); ignored\n");
        } else {
            size_t n = strlen(target) + 64;
            reply(c, "200 OK",
                  "loom: the authorization came back; you may close this "
                  "page.\n");
            close(c);
            if (!(*callback = malloc(n)))
                return loom__error_oom();
            snprintf(*callback, n, "http://127.0.0.1:%d%s", l->port, target);
            return 0;
        }
        close(c);
    }
}

/* Listens on 127.0.0.1 at a port the system picks. */
static int listen_loopback(login *l)
{
    struct sockaddr_in a;
    socklen_t alen = sizeof(a);

    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if ((l->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
        bind(l->fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        listen(l->fd, 8) != 0 ||
        getsockname(l->fd, (struct sockaddr *)&a, &alen) != 0)
        return loom__error_set(LOOM_EIO, "listening on 127.0.0.1: %s",
                               strerror(errno));
    l->port = ntohs(a.sin_port);
    return 0;
}

int cli_mcp_login(const loom_config *cfg, const char *name, long timeout_s,
                  const loom_mcp_credentials *creds, const char *user)
{
    const loom_mcp_server_config *c = NULL;
    loom_mcp_server_config copy;
    loom_mcp_authorizer az;
    loom_mcp_server *s = NULL;
    json_t *tools = NULL;
    login l;
    int rc = CLI_FAILED;

    for (size_t i = 0; i < cfg->mcp_servers_len; i++)
        if (strcmp(cfg->mcp_servers[i].name, name) == 0)
            c = &cfg->mcp_servers[i];
    if (!c || !c->url || c->oauth.disabled) {
        fprintf(stderr, "loom mcp login: %s '%s'\n",
                !c        ? "no MCP server in the config named"
                : !c->url ? "OAuth is for HTTP servers (url:), not"
                          : "oauth is disabled for",
                name);
        return CLI_USAGE;
    }
    memset(&l, 0, sizeof(l));
    l.server = name;
    l.timeout_s = timeout_s;
    l.fd = -1;
    /* The handshake waits for the person too. */
    copy = *c;
    copy.startup_timeout_ms =
        timeout_s * 1000 +
        (c->startup_timeout_ms > 0 ? c->startup_timeout_ms : 30000);
    az.redirect_uri = redirect_uri;
    az.authorize = authorize;
    az.arg = &l;
    if (listen_loopback(&l) != 0 || loom_mcp_server_new(&s, &copy) != 0 ||
        loom_mcp_server_set_oauth_user(s, user) != 0) {
        fprintf(stderr, "loom mcp login: %s\n", loom_error_last());
    } else {
        loom_mcp_server_set_credentials(s, creds);
        loom_mcp_server_set_authorizer(s, &az);
        if (loom_mcp_server_tools(s, &tools) != 0) {
            fprintf(stderr, "loom mcp login: %s\n", loom_error_last());
        } else {
            printf("%s: %s%s%s%s (%zu tools)\n", name,
                   l.asked ? "authorized" : "already authorized",
                   user ? " for user " : "", user ? user : "",
                   l.asked ? "; the credentials are kept in the store"
                           : " (the kept credentials work)",
                   json_array_size(tools));
            rc = CLI_OK;
        }
    }
    json_decref(tools);
    loom_mcp_server_free(s);
    if (l.fd >= 0)
        close(l.fd);
    return rc;
}
