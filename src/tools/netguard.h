/*
 * tools/netguard.h: the network policy of the tools that reach out to the
 * web (web_fetch and the HTTP tools declared in config), and the one HTTP
 * client they share.
 *
 * A tool that fetches URLs chosen by a model is a server-side request
 * forgery waiting to happen: "http://169.254.169.254/" reads cloud
 * credentials, "http://0x7f.1:6379/" talks to a local Redis. The guard is
 * built so that no path connects to an address that was not checked:
 *
 *   1. the URL is parsed by libcurl's own parser (so loom and libcurl
 *      agree on the host), only http and https, no user@ part, a port on
 *      the allowed list;
 *   2. a host written as an IPv4 number in any spelling inet_aton(3)
 *      accepts ("2130706433", "0177.0.0.1", "0x7f.1", "127.1") is
 *      normalised to dotted form first, and that form is what libcurl is
 *      given;
 *   3. a name is resolved once, here, and every address it resolves to
 *      must be public (see loom__net_addr_blocked); one bad address
 *      refuses the name;
 *   4. libcurl is pinned to those addresses (CURLOPT_RESOLVE, no second
 *      lookup, so no DNS rebinding), and its open-socket callback refuses
 *      any address that is not one of them, whatever libcurl might do;
 *   5. redirects are followed by loom, and each hop goes through 1-4.
 *
 * An allowlist opens named hosts ("wiki.internal", "10.1.2.3:8080",
 * "*.svc.local") on purpose: their addresses are not checked, but they
 * are still pinned. Proxy environment variables are ignored.
 */
#ifndef LOOM_TOOLS_NETGUARD_H
#define LOOM_TOOLS_NETGUARD_H

#include "loom/buf.h"
#include "loom/cancel.h"
#include "loom/common.h"

#include <jansson.h>
#include <sys/socket.h>

/* Longest URL fetched (also the longest redirect target accepted). */
#define LOOM__NET_MAX_URL 8192
/* Addresses of one name that are checked and pinned; the rest are not
 * used. */
#define LOOM__NET_MAX_ADDRS 16
/* Redirects loom follows for one fetch. */
#define LOOM__NET_MAX_REDIRECTS 5
/* Entries of allow_hosts and allow_ports. */
#define LOOM__NET_MAX_ALLOW_HOSTS 256
#define LOOM__NET_MAX_PORTS 64

/*
 * Resolves host (a name, never an IP literal) into at most max addresses
 * (port unset). Returns 0 with *n >= 1, or a negative LOOM_E* code with a
 * message (LOOM_ENOTFOUND when the name does not exist).
 */
typedef int (*loom__net_resolve_fn)(const char *host,
                                    struct sockaddr_storage *addrs,
                                    size_t max, size_t *n, void *payload);

/*
 * Replaces the resolver of every later check (NULL restores the system's,
 * getaddrinfo). For tests, which make names resolve where they need; call
 * it while no fetch is running.
 */
void loom__net_set_resolver(loom__net_resolve_fn fn, void *payload);

/* One allowlist entry: a host (lower case, IPs in canonical form, "*."
 * prefix for a suffix match) and a port (0: any allowed port). */
typedef struct {
    char *host;
    int port;
} loom__net_allow;

typedef struct {
    loom__net_allow *hosts;
    size_t hosts_len;
    int ports[LOOM__NET_MAX_PORTS]; /* allowed ports; default 80, 443 */
    size_t ports_len;
} loom__net_policy;

/* The default policy: ports 80 and 443, nothing allowlisted. */
void loom__net_policy_init(loom__net_policy *p);

/*
 * Sets the allowlist from allow_hosts (a JSON array of "host",
 * "host:port", "[v6]:port" or "*.suffix" strings) and the ports from
 * allow_ports (an array of 1..65535), either may be NULL (keep what p
 * has). what names the setting in messages ("tools.web_fetch").
 * LOOM_EINVALID for a malformed entry; p is unchanged then.
 */
int loom__net_policy_set(loom__net_policy *p, const json_t *allow_hosts,
                         const json_t *allow_ports, const char *what);

/* Adds one allowlist entry (the syntax of allow_hosts). */
int loom__net_policy_allow(loom__net_policy *p, const char *entry,
                           const char *what);

/* Frees the allowlist and resets p to the default. */
void loom__net_policy_clear(loom__net_policy *p);

/* A URL that passed the policy, with the addresses it may connect to. */
typedef struct {
    char *url;  /* normalised URL: what libcurl is given */
    char *host; /* host as libcurl sees it ("[::1]" for IPv6) */
    int port;
    int allowlisted;
    int literal; /* the host is an IP address; nothing was resolved */
    size_t naddrs;
    struct sockaddr_storage addrs[LOOM__NET_MAX_ADDRS];
} loom__net_target;

/*
 * Parses url and checks it against p: scheme, credentials, port, and
 * every address the host is or resolves to. On success t holds the
 * normalised URL and the checked addresses (free with _target_clear).
 * Errors, each with a message a model can act on:
 *   LOOM_EINVALID   not a URL, too long, scheme other than http(s),
 *                   user@ part, a port that is not allowed
 *   LOOM_ENOTFOUND  the name does not resolve
 *   LOOM_ERROR      blocked by policy ("... 10.0.0.5 is in 10.0.0.0/8
 *                   (private network)")
 * Nothing is connected to.
 */
int loom__net_target_check(loom__net_target *t, const loom__net_policy *p,
                           const char *url);
void loom__net_target_clear(loom__net_target *t);

/*
 * Whether sa (AF_INET or AF_INET6) is in a blocked range: 1 with "<addr>
 * is in <range> (<what>)" in why (cap bytes), else 0. IPv4-mapped,
 * IPv4-compatible, NAT64 and 6to4 IPv6 addresses are judged by the IPv4
 * address they carry.
 */
int loom__net_addr_blocked(const struct sockaddr *sa, char *why, size_t cap);

/*
 * Whether a connection to sa (len bytes) fits t: one of its checked
 * addresses on its port, and, unless t is allowlisted, not blocked.
 * 0 when it may connect; else 1 with the reason in why.
 */
int loom__net_target_refuses(const loom__net_target *t,
                             const struct sockaddr *sa, size_t len,
                             char *why, size_t cap);

/* One fetch: a request, its limits, and whether to follow redirects. */
typedef struct {
    const char *method;          /* NULL: GET */
    const char *const *headers;  /* "Name: value" lines */
    size_t headers_len;
    const char *body;            /* sent as is; may be NULL */
    size_t body_len;
    int max_redirects;           /* 0: a 3xx is returned, not followed */
    size_t max_bytes;            /* body bytes of any answer */
    long timeout_ms;             /* the whole fetch, redirects included */
    long low_speed_bytes;        /* slower than this for ... */
    long low_speed_secs;         /* ... this long fails; 0: no check */
    const char *user_agent;
    loom_cancel *cancel;         /* may be NULL */
} loom__net_request;

/* What came back. Zero it before the call; free with _response_clear. */
typedef struct {
    long status;
    char *url;          /* the URL that answered (after redirects) */
    char *content_type; /* the header's value, NULL when absent */
    char *location;     /* a redirect that was not followed, or NULL */
    loom_buf body;
    int redirects;      /* redirects followed */
} loom__net_response;

/*
 * Fetches url under policy p, following up to req->max_redirects
 * redirects (each checked like the first URL). Any complete HTTP answer
 * returns 0, whatever its status. Otherwise, with a message:
 *   the errors of loom__net_target_check, for any hop
 *   LOOM_ETOOLARGE  the body passed max_bytes, or a redirect target is
 *                   longer than LOOM__NET_MAX_URL
 *   LOOM_ETIMEDOUT  timeout_ms passed, or the transfer was too slow
 *   LOOM_ECANCELED  req->cancel was set
 *   LOOM_EIO        connection refused or failed, TLS errors, a broken
 *                   answer
 *   LOOM_ERROR      too many redirects; a connection to an unchecked
 *                   address was refused
 */
int loom__net_fetch(const loom__net_policy *p, const char *url,
                    const loom__net_request *req, loom__net_response *resp);
void loom__net_response_clear(loom__net_response *resp);

#endif
