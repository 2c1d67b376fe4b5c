/*
 * The network policy of the fetching tools: which URLs, ports and
 * addresses they may reach (see tools/netguard.h for the design). This
 * file parses URLs with libcurl's URL API, normalises IPv4 spellings with
 * inet_aton(3) (the resolver's own reading of them), resolves names once
 * and checks every address against the blocked ranges. The fetch itself,
 * which pins libcurl to the checked addresses, is in netfetch.c.
 *
 * The range tables are written out here because no installed library
 * classifies addresses (libc has only IN6_IS_ADDR_* for a few IPv6
 * kinds).
 */
#include "tools/netguard.h"
#include "core/error.h"
#include "core/text.h"

#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Bytes of a URL quoted in an error message (longer than config's 48:
 * the host and port, which the messages are about, come after a scheme). */
#define SHOWN_MAX 100

/* ---- the resolver ------------------------------------------------------ */

static pthread_mutex_t resolver_lock = PTHREAD_MUTEX_INITIALIZER;
static loom__net_resolve_fn resolver_fn;
static void *resolver_payload;

void loom__net_set_resolver(loom__net_resolve_fn fn, void *payload)
{
    pthread_mutex_lock(&resolver_lock);
    resolver_fn = fn;
    resolver_payload = payload;
    pthread_mutex_unlock(&resolver_lock);
}

static int same_addr(const struct sockaddr_storage *a,
                     const struct sockaddr_storage *b)
{
    if (a->ss_family != b->ss_family)
        return 0;
    if (a->ss_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (a->ss_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                      &((const struct sockaddr_in6 *)b)->sin6_addr,
                      sizeof(struct in6_addr)) == 0;
    return 0;
}

/* getaddrinfo, keeping distinct IPv4 and IPv6 addresses in its order. */
static int system_resolve(const char *host, struct sockaddr_storage *addrs,
                          size_t max, size_t *n, void *payload)
{
    struct addrinfo hints, *res = NULL;
    int gai;

    (void)payload;
    *n = 0;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    gai = getaddrinfo(host, NULL, &hints, &res);
    if (gai == EAI_NONAME || gai == EAI_NODATA || gai == EAI_FAIL)
        return loom__error_set(LOOM_ENOTFOUND,
                               "could not resolve host '%s' (%s)", host,
                               gai_strerror(gai));
    if (gai != 0)
        return loom__error_set(LOOM_EIO, "could not resolve host '%s' (%s)",
                               host, gai == EAI_SYSTEM ? strerror(errno)
                                                       : gai_strerror(gai));
    for (struct addrinfo *ai = res; ai && *n < max; ai = ai->ai_next) {
        struct sockaddr_storage ss;
        size_t i;

        if ((ai->ai_family != AF_INET && ai->ai_family != AF_INET6) ||
            ai->ai_addrlen > sizeof(ss))
            continue;
        memset(&ss, 0, sizeof(ss));
        memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
        for (i = 0; i < *n && !same_addr(&addrs[i], &ss); i++)
            ;
        if (i == *n)
            addrs[(*n)++] = ss;
    }
    freeaddrinfo(res);
    if (*n == 0)
        return loom__error_set(LOOM_ENOTFOUND,
                               "host '%s' has no IPv4 or IPv6 address",
                               host);
    return 0;
}

static int resolve(const char *host, struct sockaddr_storage *addrs,
                   size_t max, size_t *n)
{
    loom__net_resolve_fn fn;
    void *payload;
    int rc;

    pthread_mutex_lock(&resolver_lock);
    fn = resolver_fn ? resolver_fn : system_resolve;
    payload = resolver_payload;
    pthread_mutex_unlock(&resolver_lock);
    *n = 0;
    rc = fn(host, addrs, max, n, payload);
    if (rc == 0 && (*n == 0 || *n > max))
        rc = loom__error_set(LOOM_ENOTFOUND,
                             "host '%s' has no IPv4 or IPv6 address", host);
    return rc;
}

/* ---- blocked ranges ------------------------------------------------------ */

static const struct {
    uint32_t net;
    int bits;
    const char *cidr, *what;
} v4_blocked[] = {
    {0x00000000u, 8, "0.0.0.0/8", "\"this\" network"},
    {0x0a000000u, 8, "10.0.0.0/8", "private network"},
    {0x64400000u, 10, "100.64.0.0/10", "carrier-grade NAT"},
    {0x7f000000u, 8, "127.0.0.0/8", "loopback"},
    {0xa9fe0000u, 16, "169.254.0.0/16", "link-local, cloud metadata"},
    {0xac100000u, 12, "172.16.0.0/12", "private network"},
    {0xc0000000u, 24, "192.0.0.0/24", "IETF protocol assignments"},
    {0xc0000200u, 24, "192.0.2.0/24", "documentation"},
    {0xc0a80000u, 16, "192.168.0.0/16", "private network"},
    {0xc6120000u, 15, "198.18.0.0/15", "benchmarking"},
    {0xc6336400u, 24, "198.51.100.0/24", "documentation"},
    {0xcb007100u, 24, "203.0.113.0/24", "documentation"},
    {0xe0000000u, 4, "224.0.0.0/4", "multicast"},
    /* Before 240/4 so that the broadcast address is named as such. */
    {0xffffffffu, 32, "255.255.255.255/32", "broadcast"},
    {0xf0000000u, 4, "240.0.0.0/4", "reserved"},
};

/* The range v4 (host order) is in, or -1. */
static int v4_range(uint32_t v4)
{
    for (size_t i = 0; i < sizeof(v4_blocked) / sizeof(v4_blocked[0]); i++) {
        uint32_t mask = v4_blocked[i].bits == 0
                            ? 0
                            : 0xffffffffu << (32 - v4_blocked[i].bits);
        if ((v4 & mask) == v4_blocked[i].net)
            return (int)i;
    }
    return -1;
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
           (uint32_t)p[3];
}

static int zero(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

/* The IPv4 address an IPv6 address stands for (mapped, compatible, NAT64,
 * 6to4); 0 when none. *kind names the form. */
static int v6_embedded_v4(const uint8_t *a, uint32_t *v4, const char **kind)
{
    static const uint8_t nat64[12] = {0x00, 0x64, 0xff, 0x9b};

    if (zero(a, 10) && a[10] == 0xff && a[11] == 0xff) {
        *kind = "an IPv4-mapped address";
        *v4 = be32(a + 12);
        return 1;
    }
    if (zero(a, 12)) {
        *kind = "an IPv4-compatible address";
        *v4 = be32(a + 12);
        return 1;
    }
    if (memcmp(a, nat64, 12) == 0) {
        *kind = "a NAT64 address";
        *v4 = be32(a + 12);
        return 1;
    }
    if (a[0] == 0x20 && a[1] == 0x02) {
        *kind = "a 6to4 address";
        *v4 = be32(a + 2);
        return 1;
    }
    return 0;
}

/* The IPv6-only range of a, or NULL: *what gets its description. */
static const char *v6_range(const uint8_t *a, const char **what)
{
    static const uint8_t nat64_local[6] = {0x00, 0x64, 0xff, 0x9b, 0x00, 0x01};
    static const uint8_t doc[4] = {0x20, 0x01, 0x0d, 0xb8};
    static const uint8_t discard[8] = {0x01, 0x00};

    if (memcmp(a, nat64_local, 6) == 0)
        return *what = "local-use NAT64", "64:ff9b:1::/48";
    if ((a[0] & 0xfe) == 0xfc)
        return *what = "unique local", "fc00::/7";
    if (a[0] == 0xfe && (a[1] & 0xc0) == 0x80)
        return *what = "link-local", "fe80::/10";
    if (a[0] == 0xfe && (a[1] & 0xc0) == 0xc0)
        return *what = "site-local", "fec0::/10";
    if (a[0] == 0xff)
        return *what = "multicast", "ff00::/8";
    if (memcmp(a, doc, 4) == 0)
        return *what = "documentation", "2001:db8::/32";
    if (memcmp(a, discard, 8) == 0)
        return *what = "discard-only", "100::/64";
    return NULL;
}

int loom__net_addr_blocked(const struct sockaddr *sa, char *why, size_t cap)
{
    char text[INET6_ADDRSTRLEN], v4text[INET_ADDRSTRLEN];
    const char *kind, *what, *range;
    uint32_t v4;
    int r;

    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)sa;

        v4 = ntohl(in->sin_addr.s_addr);
        if ((r = v4_range(v4)) < 0)
            return 0;
        inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
        snprintf(why, cap, "%s is in %s (%s)", text, v4_blocked[r].cidr,
                 v4_blocked[r].what);
        return 1;
    }
    if (sa->sa_family != AF_INET6) {
        snprintf(why, cap, "address family %d is not IPv4 or IPv6",
                 sa->sa_family);
        return 1;
    }
    {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
        const uint8_t *a = in6->sin6_addr.s6_addr;

        inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
        if (zero(a, 16)) {
            snprintf(why, cap, "%s is the unspecified address (::/128)",
                     text);
            return 1;
        }
        if (zero(a, 15) && a[15] == 1) {
            snprintf(why, cap, "%s is the loopback address (::1/128)", text);
            return 1;
        }
        if (v6_embedded_v4(a, &v4, &kind)) {
            struct in_addr ia;

            if ((r = v4_range(v4)) < 0)
                return 0;
            ia.s_addr = htonl(v4);
            inet_ntop(AF_INET, &ia, v4text, sizeof(v4text));
            snprintf(why, cap, "%s is %s of %s, which is in %s (%s)", text,
                     kind, v4text, v4_blocked[r].cidr, v4_blocked[r].what);
            return 1;
        }
        if ((range = v6_range(a, &what)) != NULL) {
            snprintf(why, cap, "%s is in %s (%s)", text, range, what);
            return 1;
        }
    }
    return 0;
}

/* ---- the policy ------------------------------------------------------- */

void loom__net_policy_init(loom__net_policy *p)
{
    memset(p, 0, sizeof(*p));
    p->ports[0] = 80;
    p->ports[1] = 443;
    p->ports_len = 2;
}

void loom__net_policy_clear(loom__net_policy *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->hosts_len; i++)
        free(p->hosts[i].host);
    free(p->hosts);
    loom__net_policy_init(p);
}

static void lower(char *s)
{
    for (; *s; s++)
        if (*s >= 'A' && *s <= 'Z')
            *s = (char)(*s - 'A' + 'a');
}

/*
 * The key a host is compared under: IPv4 in dotted form whatever its
 * spelling, IPv6 in canonical form without brackets, names in lower case
 * without a trailing dot. *family is AF_INET/AF_INET6 for literals, 0 for
 * names; addr (when given) gets the literal's address. NULL when out of
 * memory or, for names, when it holds characters no host name has.
 */
static char *host_key(const char *host, int *family,
                      struct sockaddr_storage *addr)
{
    struct in_addr a4;
    struct in6_addr a6;
    char buf[INET6_ADDRSTRLEN + 2], *s;
    size_t len = strlen(host);

    *family = 0;
    if (len >= 2 && host[0] == '[' && host[len - 1] == ']' &&
        len - 2 < sizeof(buf)) {
        memcpy(buf, host + 1, len - 2);
        buf[len - 2] = '\0';
        if (inet_pton(AF_INET6, buf, &a6) != 1)
            return NULL;
    } else if (strchr(host, ':')) {
        if (len >= sizeof(buf) || inet_pton(AF_INET6, host, &a6) != 1)
            return NULL;
    } else if (inet_aton(host, &a4) != 0) {
        *family = AF_INET;
        inet_ntop(AF_INET, &a4, buf, sizeof(buf));
        if (addr) {
            memset(addr, 0, sizeof(*addr));
            addr->ss_family = AF_INET;
            ((struct sockaddr_in *)addr)->sin_addr = a4;
        }
        return strdup(buf);
    } else {
        for (const char *c = host; *c; c++)
            if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                  (*c >= '0' && *c <= '9') || *c == '-' || *c == '.' ||
                  *c == '_' || (unsigned char)*c >= 0x80))
                return NULL;
        if (!(s = strdup(host)))
            return NULL;
        lower(s);
        len = strlen(s);
        if (len > 1 && s[len - 1] == '.')
            s[len - 1] = '\0';
        return s;
    }
    *family = AF_INET6;
    inet_ntop(AF_INET6, &a6, buf, sizeof(buf));
    if (addr) {
        memset(addr, 0, sizeof(*addr));
        addr->ss_family = AF_INET6;
        ((struct sockaddr_in6 *)addr)->sin6_addr = a6;
    }
    return strdup(buf);
}

/* Parses "port" into 1..65535; -1 when it is not one. */
static int parse_port(const char *s)
{
    long v = 0;

    if (!*s || strlen(s) > 5)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        v = v * 10 + (*s - '0');
    }
    return v >= 1 && v <= 65535 ? (int)v : -1;
}

/* Parses one allowlist entry into e (host malloc'd); 0 or -1. */
static int parse_allow(const char *entry, loom__net_allow *e)
{
    char host[300], *key;
    const char *colon, *end;
    int family, port = 0, wild = 0;
    size_t len;

    memset(e, 0, sizeof(*e));
    if (!*entry || strlen(entry) >= sizeof(host) ||
        strpbrk(entry, " \t\r\n/@?#%"))
        return -1;
    if (entry[0] == '[') {
        if (!(end = strchr(entry, ']')))
            return -1;
        len = (size_t)(end - entry) + 1;
        if (end[1] == ':' && (port = parse_port(end + 2)) < 0)
            return -1;
        if (end[1] != '\0' && end[1] != ':')
            return -1;
    } else if ((colon = strchr(entry, ':')) != NULL &&
               !strchr(colon + 1, ':')) {
        len = (size_t)(colon - entry);
        if ((port = parse_port(colon + 1)) < 0)
            return -1;
    } else {
        len = strlen(entry); /* a name, or a bare IPv6 address */
    }
    memcpy(host, entry, len);
    host[len] = '\0';
    if (strncmp(host, "*.", 2) == 0) {
        wild = 1;
        if (!host[2] || host[2] == '.')
            return -1;
    }
    if (!(key = host_key(wild ? host + 2 : host, &family, NULL)) || !*key) {
        free(key);
        return -1;
    }
    if (wild && family != 0) {
        free(key);
        return -1;
    }
    if (wild) {
        e->host = malloc(strlen(key) + 3);
        if (e->host)
            snprintf(e->host, strlen(key) + 3, "*.%s", key);
        free(key);
    } else {
        e->host = key;
    }
    if (!e->host)
        return -1;
    e->port = port;
    return 0;
}

int loom__net_policy_allow(loom__net_policy *p, const char *entry,
                           const char *what)
{
    loom__net_allow e, *v;

    if (p->hosts_len >= LOOM__NET_MAX_ALLOW_HOSTS)
        return loom__error_set(LOOM_EINVALID,
                               "%s: allow_hosts has more than %d entries",
                               what, LOOM__NET_MAX_ALLOW_HOSTS);
    if (parse_allow(entry, &e) != 0)
        return loom__error_set(LOOM_EINVALID,
                               "%s: allow_hosts entry '%.80s' is not a host, "
                               "host:port, [IPv6]:port or *.domain",
                               what, entry);
    v = realloc(p->hosts, (p->hosts_len + 1) * sizeof(*v));
    if (!v) {
        free(e.host);
        return loom__error_oom();
    }
    p->hosts = v;
    p->hosts[p->hosts_len++] = e;
    return 0;
}

int loom__net_policy_set(loom__net_policy *p, const json_t *allow_hosts,
                         const json_t *allow_ports, const char *what)
{
    loom__net_policy tmp;
    size_t i;
    int rc = 0;

    loom__net_policy_init(&tmp);
    if (allow_hosts && !json_is_null(allow_hosts)) {
        if (!json_is_array(allow_hosts)) {
            rc = loom__error_set(LOOM_EINVALID,
                                 "%s: allow_hosts must be a list of hosts",
                                 what);
            goto cleanup;
        }
        for (i = 0; i < json_array_size(allow_hosts); i++) {
            const json_t *h = json_array_get(allow_hosts, i);

            if (!json_is_string(h)) {
                rc = loom__error_set(LOOM_EINVALID,
                                     "%s: allow_hosts[%zu] must be a string",
                                     what, i);
                goto cleanup;
            }
            if ((rc = loom__net_policy_allow(&tmp, json_string_value(h),
                                             what)) != 0)
                goto cleanup;
        }
    }
    if (allow_ports && !json_is_null(allow_ports)) {
        if (!json_is_array(allow_ports) ||
            json_array_size(allow_ports) > LOOM__NET_MAX_PORTS) {
            rc = loom__error_set(LOOM_EINVALID,
                                 "%s: allow_ports must be a list of at most "
                                 "%d ports",
                                 what, LOOM__NET_MAX_PORTS);
            goto cleanup;
        }
        tmp.ports_len = 0;
        for (i = 0; i < json_array_size(allow_ports); i++) {
            const json_t *v = json_array_get(allow_ports, i);

            if (!json_is_integer(v) || json_integer_value(v) < 1 ||
                json_integer_value(v) > 65535) {
                rc = loom__error_set(LOOM_EINVALID,
                                     "%s: allow_ports[%zu] must be a port "
                                     "from 1 to 65535",
                                     what, i);
                goto cleanup;
            }
            tmp.ports[tmp.ports_len++] = (int)json_integer_value(v);
        }
    } else {
        memcpy(tmp.ports, p->ports, sizeof(tmp.ports));
        tmp.ports_len = p->ports_len;
    }
    if (!allow_hosts || json_is_null(allow_hosts)) {
        /* Keep p's allowlist: move it over. */
        tmp.hosts = p->hosts;
        tmp.hosts_len = p->hosts_len;
        p->hosts = NULL;
        p->hosts_len = 0;
    }
    loom__net_policy_clear(p);
    *p = tmp;
    return 0;

cleanup:
    loom__net_policy_clear(&tmp);
    return rc;
}

static int port_listed(const loom__net_policy *p, int port)
{
    for (size_t i = 0; i < p->ports_len; i++)
        if (p->ports[i] == port)
            return 1;
    return 0;
}

/* Whether key matches entry host h ("*.x" matches names under x). */
static int host_matches(const char *h, const char *key)
{
    size_t hl, kl;

    if (strncmp(h, "*.", 2) != 0)
        return strcmp(h, key) == 0;
    hl = strlen(h + 1); /* ".suffix" */
    kl = strlen(key);
    return kl > hl && strcmp(key + kl - hl, h + 1) == 0;
}

/*
 * Whether key:port is allowlisted (1), and whether the port may be used
 * at all (*port_ok): an entry with that exact port opens it; otherwise it
 * must be on the allowed ports.
 */
static int allowlisted(const loom__net_policy *p, const char *key, int port,
                       int *port_ok)
{
    int hit = 0;

    *port_ok = port_listed(p, port);
    for (size_t i = 0; i < p->hosts_len; i++) {
        if (!host_matches(p->hosts[i].host, key))
            continue;
        if (p->hosts[i].port == port) {
            *port_ok = 1;
            hit = 1;
        } else if (p->hosts[i].port == 0) {
            hit = 1;
        }
    }
    return hit && *port_ok;
}

static void ports_text(const loom__net_policy *p, char *dst, size_t cap)
{
    size_t len = 0;

    dst[0] = '\0';
    for (size_t i = 0; i < p->ports_len && len + 8 < cap; i++)
        len += (size_t)snprintf(dst + len, cap - len, "%s%d", i ? ", " : "",
                                p->ports[i]);
    if (!p->ports_len)
        snprintf(dst, cap, "none");
}

/* The scheme at the start of url, lower case, in dst; 0 when url does not
 * start with one. */
static int url_scheme(const char *url, char *dst, size_t cap)
{
    size_t i = 0;

    if (!((url[0] >= 'a' && url[0] <= 'z') || (url[0] >= 'A' && url[0] <= 'Z')))
        return 0;
    for (; url[i] && url[i] != ':'; i++) {
        char c = url[i];

        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.') ||
            i + 1 >= cap)
            return 0;
        dst[i] = (char)(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    }
    dst[i] = '\0';
    return url[i] == ':';
}

void loom__net_target_clear(loom__net_target *t)
{
    if (!t)
        return;
    free(t->url);
    free(t->host);
    memset(t, 0, sizeof(*t));
}

static int curl_part(CURLU *u, CURLUPart part, unsigned flags, char **out)
{
    *out = NULL;
    return curl_url_get(u, part, out, flags) == CURLUE_OK && *out;
}

int loom__net_target_check(loom__net_target *t, const loom__net_policy *p,
                           const char *url)
{
    CURLU *u = NULL;
    CURLUcode uc;
    char scheme[32], tmp[128], ports[256], why[256], *s = NULL, *key = NULL;
    int family, port_ok, rc = 0;
    struct sockaddr_storage lit;

    memset(t, 0, sizeof(*t));
    if (!url || !*url)
        return loom__error_set(LOOM_EINVALID, "the URL is empty");
    if (strlen(url) > LOOM__NET_MAX_URL)
        return loom__error_set(LOOM_EINVALID,
                               "the URL is longer than %d bytes",
                               LOOM__NET_MAX_URL);
    if (!url_scheme(url, scheme, sizeof(scheme)))
        return loom__error_set(
            LOOM_EINVALID,
            "'%s' is not a valid URL: it must start with "
            "http:// or https://",
            loom__text_shown(tmp, sizeof(tmp), url, SHOWN_MAX));
    if (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0)
        return loom__error_set(
            LOOM_EINVALID,
            "unsupported URL scheme '%s': only http:// "
            "and https:// URLs are fetched",
            loom__text_shown(tmp, sizeof(tmp), scheme, SHOWN_MAX));
    if (!(u = curl_url()))
        return loom__error_oom();
    if ((uc = curl_url_set(u, CURLUPART_URL, url, 0)) != CURLUE_OK) {
        rc = loom__error_set(LOOM_EINVALID, "'%s' is not a valid URL (%s)",
                             loom__text_shown(tmp, sizeof(tmp), url, SHOWN_MAX),
                             curl_url_strerror(uc));
        goto cleanup;
    }
    if (curl_part(u, CURLUPART_USER, 0, &s) ||
        curl_part(u, CURLUPART_PASSWORD, 0, &s)) {
        rc =
            loom__error_set(LOOM_EINVALID,
                            "URLs with credentials (user@host) are not "
                            "fetched: '%s'",
                            loom__text_shown(tmp, sizeof(tmp), url, SHOWN_MAX));
        goto cleanup;
    }
    curl_free(s);
    if (curl_part(u, CURLUPART_ZONEID, 0, &s)) {
        rc = loom__error_set(
            LOOM_EINVALID, "IPv6 zone identifiers are not fetched: '%s'",
            loom__text_shown(tmp, sizeof(tmp), url, SHOWN_MAX));
        goto cleanup;
    }
    curl_free(s);
    if (!curl_part(u, CURLUPART_HOST, 0, &s) || !*s) {
        rc =
            loom__error_set(LOOM_EINVALID, "'%s' has no host",
                            loom__text_shown(tmp, sizeof(tmp), url, SHOWN_MAX));
        goto cleanup;
    }
    /* Percent-encoded hosts would be decoded differently by different
     * readers; no real site needs one. */
    if (strchr(s, '%') || !(key = host_key(s, &family, &lit))) {
        rc = loom__error_set(LOOM_EINVALID, "'%s' is not a valid host name",
                             loom__text_shown(tmp, sizeof(tmp), s, SHOWN_MAX));
        goto cleanup;
    }
    curl_free(s);
    s = NULL;
    /* An IPv4 address in another spelling is given to libcurl in the
     * dotted form that was checked. */
    if (family == AF_INET &&
        curl_url_set(u, CURLUPART_HOST, key, 0) != CURLUE_OK) {
        rc = loom__error_oom();
        goto cleanup;
    }
    curl_url_set(u, CURLUPART_FRAGMENT, NULL, 0);
    if (!curl_part(u, CURLUPART_PORT, CURLU_DEFAULT_PORT, &s)) {
        rc =
            loom__error_set(LOOM_EINVALID, "'%s' has no port",
                            loom__text_shown(tmp, sizeof(tmp), url, SHOWN_MAX));
        goto cleanup;
    }
    /* Digits: libcurl checked the port. */
    t->port = (int)strtol(s, NULL, 10);
    curl_free(s);
    s = NULL;
    t->allowlisted = allowlisted(p, key, t->port, &port_ok);
    if (!port_ok) {
        ports_text(p, ports, sizeof(ports));
        rc = loom__error_set(LOOM_ERROR,
                             "blocked by policy: port %d is not allowed "
                             "(allowed ports: %s; an allow_hosts entry "
                             "host:port opens one for a host)",
                             t->port, ports);
        goto cleanup;
    }
    if (!curl_part(u, CURLUPART_HOST, 0, &t->host) ||
        !curl_part(u, CURLUPART_URL, 0, &t->url)) {
        rc = loom__error_oom();
        goto cleanup;
    }
    /* libcurl's strings are freed with curl_free; keep plain malloc'd
     * copies so the target is freed one way. */
    {
        char *h = strdup(t->host), *v = strdup(t->url);

        curl_free(t->host);
        curl_free(t->url);
        t->host = h;
        t->url = v;
        if (!h || !v) {
            rc = loom__error_oom();
            goto cleanup;
        }
    }
    if (family) {
        t->literal = 1;
        t->naddrs = 1;
        t->addrs[0] = lit;
    } else if ((rc = resolve(key, t->addrs, LOOM__NET_MAX_ADDRS,
                             &t->naddrs)) != 0) {
        goto cleanup;
    }
    if (t->allowlisted)
        goto cleanup;
    for (size_t i = 0; i < t->naddrs; i++) {
        if (loom__net_addr_blocked((struct sockaddr *)&t->addrs[i], why,
                                   sizeof(why))) {
            if (family)
                rc = loom__error_set(LOOM_ERROR, "blocked by policy: %s",
                                     why);
            else
                rc = loom__error_set(
                    LOOM_ERROR,
                    "blocked by policy: host '%s' resolves "
                    "to a blocked address: %s",
                    loom__text_shown(tmp, sizeof(tmp), key, SHOWN_MAX), why);
            goto cleanup;
        }
    }

cleanup:
    if (s)
        curl_free(s);
    free(key);
    curl_url_cleanup(u);
    if (rc)
        loom__net_target_clear(t);
    return rc;
}

int loom__net_target_refuses(const loom__net_target *t,
                             const struct sockaddr *sa, size_t len,
                             char *why, size_t cap)
{
    struct sockaddr_storage ss;
    char text[INET6_ADDRSTRLEN] = "?";
    int port;

    if (len > sizeof(ss) || len < sizeof(struct sockaddr_in) ||
        (sa->sa_family != AF_INET && sa->sa_family != AF_INET6) ||
        (sa->sa_family == AF_INET6 && len < sizeof(struct sockaddr_in6))) {
        snprintf(why, cap, "a connection of address family %d was refused",
                 sa->sa_family);
        return 1;
    }
    memset(&ss, 0, sizeof(ss));
    memcpy(&ss, sa, len);
    if (ss.ss_family == AF_INET) {
        port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, text,
                  sizeof(text));
    } else {
        port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, text,
                  sizeof(text));
    }
    if (!t->allowlisted &&
        loom__net_addr_blocked((const struct sockaddr *)&ss, why, cap))
        return 1;
    for (size_t i = 0; i < t->naddrs; i++)
        if (same_addr(&t->addrs[i], &ss) && port == t->port)
            return 0;
    snprintf(why, cap,
             "a connection to %s port %d was refused: it is not an address "
             "checked for this URL",
             text, port);
    return 1;
}
