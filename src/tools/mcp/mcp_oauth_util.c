/*
 * The pure parts of the MCP client's OAuth 2.1 support (mcp_oauth.c), kept
 * apart so unit tests reach them without a network: base64url and PKCE
 * S256 (RFC 7636), form and query encoding, the Bearer challenge of a
 * WWW-Authenticate header (RFC 6750, RFC 9728 resource_metadata), the
 * well-known URLs of protected-resource (RFC 9728) and authorization-
 * server metadata (RFC 8414, OpenID Connect Discovery), the checks that
 * guard them (the metadata's issuer, the resource the metadata names, the
 * iss of an authorization response, RFC 9207).
 */
#include "core/error.h"
#include "tools/mcp/mcp_internal.h"

#include <ctype.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

size_t loom__b64url(const unsigned char *in, size_t n, char *out, size_t cap)
{
    static const char abc[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    size_t o = 0;

    for (size_t i = 0; i < n; i += 3) {
        unsigned v = (unsigned)in[i] << 16;
        size_t k = n - i >= 3 ? 4 : n - i + 1;
        if (i + 1 < n)
            v |= (unsigned)in[i + 1] << 8;
        if (i + 2 < n)
            v |= in[i + 2];
        for (size_t j = 0; j < k; j++) {
            if (o + 1 >= cap)
                return 0;
            out[o++] = abc[(v >> (18 - 6 * j)) & 63];
        }
    }
    if (o >= cap)
        return 0;
    out[o] = '\0';
    return o;
}

int loom__pkce_challenge(const char *verifier, char out[LOOM_PKCE_MAX])
{
    unsigned char md[32];
    unsigned int len = 0;

    if (!EVP_Digest(verifier, strlen(verifier), md, &len, EVP_sha256(), NULL))
        return loom__error_set(LOOM_ERROR, "SHA-256 failed");
    return loom__b64url(md, len, out, LOOM_PKCE_MAX) ? 0 : LOOM_ERROR;
}

int loom__oauth_random(char *out, size_t bytes, size_t cap)
{
    unsigned char r[64];

    if (bytes > sizeof(r) || RAND_bytes(r, (int)bytes) != 1)
        return loom__error_set(LOOM_ERROR, "no random bytes");
    return loom__b64url(r, bytes, out, cap) ? 0 : LOOM_ERROR;
}

int loom__pkce_pair(char verifier[LOOM_PKCE_MAX], char challenge[LOOM_PKCE_MAX])
{
    int rc = loom__oauth_random(verifier, 32, LOOM_PKCE_MAX);

    return rc ? rc : loom__pkce_challenge(verifier, challenge);
}

int loom__form_escape(loom_buf *b, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        int rc = isalnum(c) || strchr("-._~", c)
                     ? loom_buf_putc(b, (char)c)
                     : loom_buf_printf(b, "%%%02X", c);
        if (rc != 0)
            return LOOM_ENOMEM;
    }
    return 0;
}

int loom__form_add(loom_buf *b, const char *key, const char *value)
{
    if (!value)
        return 0;
    if ((b->len && loom_buf_putc(b, '&') != 0) || loom__form_escape(b, key) ||
        loom_buf_putc(b, '=') != 0 || loom__form_escape(b, value))
        return LOOM_ENOMEM;
    return 0;
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    return c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

char *loom__query_param(const char *url, const char *name)
{
    const char *q = strchr(url, '?');
    size_t nlen = strlen(name);

    if (!q)
        return NULL;
    for (q++; *q && *q != '#';) {
        const char *end = q + strcspn(q, "&#");
        if ((size_t)(end - q) > nlen && !strncmp(q, name, nlen) &&
            q[nlen] == '=') {
            char *v = malloc((size_t)(end - q) + 1), *o = v;
            if (!v)
                return NULL;
            for (const char *p = q + nlen + 1; p < end; p++) {
                if (*p == '%' && p + 2 < end && hexval(p[1]) >= 0 &&
                    hexval(p[2]) >= 0) {
                    *o++ = (char)(hexval(p[1]) * 16 + hexval(p[2]));
                    p += 2;
                } else {
                    *o++ = *p == '+' ? ' ' : *p;
                }
            }
            *o = '\0';
            return v;
        }
        q = *end == '&' ? end + 1 : end;
    }
    return NULL;
}

json_t *loom__www_authenticate(const char *h)
{
    json_t *o;
    const char *p = h;

    while (*p == ' ')
        p++;
    if (strncasecmp(p, "Bearer", 6) != 0 || (p[6] && p[6] != ' '))
        return NULL;
    if (!(o = json_object()))
        return NULL;
    p += 6;
    for (;;) {
        char key[64], val[2048];
        size_t k = 0, v = 0;
        while (*p == ' ' || *p == ',')
            p++;
        if (!*p)
            break;
        while (*p && *p != '=' && *p != ' ' && *p != ',')
            if (k + 1 < sizeof(key))
                key[k++] = (char)tolower((unsigned char)*p++);
            else
                p++;
        key[k] = '\0';
        while (*p == ' ')
            p++;
        if (*p != '=')
            continue; /* a token68 or a stray word: skipped */
        p++;
        while (*p == ' ')
            p++;
        if (*p == '"') {
            for (p++; *p && *p != '"'; p++) {
                if (*p == '\\' && p[1])
                    p++;
                if (v + 1 < sizeof(val))
                    val[v++] = *p;
            }
            if (*p == '"')
                p++;
        } else {
            while (*p && *p != ',' && *p != ' ')
                if (v + 1 < sizeof(val))
                    val[v++] = *p++;
                else
                    p++;
        }
        val[v] = '\0';
        if (k && json_object_set_new(o, key, json_string(val)) != 0) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

int loom__url_parts(const char *url, loom_url_parts *u)
{
    const char *p = strstr(url, "://"), *host, *path;
    size_t n;

    memset(u, 0, sizeof(*u));
    if (!p || (size_t)(p - url) >= sizeof(u->scheme))
        return LOOM_EINVALID;
    for (n = 0; url + n < p; n++)
        u->scheme[n] = (char)tolower((unsigned char)url[n]);
    host = p + 3;
    path = host + strcspn(host, "/?#");
    n = (size_t)(path - host);
    if (!n || n >= sizeof(u->authority))
        return LOOM_EINVALID;
    for (size_t i = 0; i < n; i++)
        u->authority[i] = (char)tolower((unsigned char)host[i]);
    n = strcspn(path, "?#");
    if (n >= sizeof(u->path))
        return LOOM_EINVALID;
    memcpy(u->path, path, n);
    u->path[n] = '\0';
    /* the default port says nothing */
    n = strlen(u->authority);
    if (!strcmp(u->scheme, "https") && n > 4 &&
        !strcmp(u->authority + n - 4, ":443"))
        u->authority[n - 4] = '\0';
    else if (!strcmp(u->scheme, "http") && n > 3 &&
             !strcmp(u->authority + n - 3, ":80"))
        u->authority[n - 3] = '\0';
    return strcmp(u->scheme, "http") && strcmp(u->scheme, "https")
               ? LOOM_EINVALID
               : 0;
}

int loom__oauth_resource_ok(const char *resource, const char *server_url)
{
    loom_url_parts r, s;
    size_t n;

    if (!resource || strchr(resource, '#') ||
        loom__url_parts(resource, &r) != 0 ||
        loom__url_parts(server_url, &s) != 0)
        return 0;
    if (strcmp(r.scheme, s.scheme) || strcmp(r.authority, s.authority))
        return 0;
    n = strlen(r.path);
    while (n && r.path[n - 1] == '/')
        n--;
    return strncmp(r.path, s.path, n) == 0 &&
           (s.path[n] == '\0' || s.path[n] == '/');
}

/*
 * One well-known URL into out: scheme://authority, then between (a
 * well-known path, or the resource's path), then after. LOOM_EINVALID
 * when it would not fit: a cut URL would ask the wrong server.
 */
static int well_known(char out[LOOM_URL_MAX], const loom_url_parts *u,
                      const char *between, const char *after)
{
    int n = snprintf(out, LOOM_URL_MAX, "%s://%s%s%s", u->scheme, u->authority,
                     between, after);

    return n < 0 || n >= LOOM_URL_MAX ? LOOM_EINVALID : 0;
}

int loom__oauth_metadata_urls(const char *issuer, char urls[][LOOM_URL_MAX],
                              int cap)
{
    loom_url_parts u;
    size_t n;
    int k = 0;

    if (loom__url_parts(issuer, &u) != 0 || strchr(issuer, '?') ||
        strchr(issuer, '#') || cap < 3)
        return LOOM_EINVALID;
    n = strlen(u.path);
    while (n && u.path[n - 1] == '/')
        u.path[--n] = '\0';
    if (n) {
        if (well_known(urls[k++], &u, "/.well-known/oauth-authorization-server",
                       u.path) ||
            well_known(urls[k++], &u, "/.well-known/openid-configuration",
                       u.path) ||
            well_known(urls[k++], &u, u.path,
                       "/.well-known/openid-configuration"))
            return LOOM_EINVALID;
    } else if (well_known(urls[k++], &u,
                          "/.well-known/oauth-authorization-server", "") ||
               well_known(urls[k++], &u, "/.well-known/openid-configuration",
                          "")) {
        return LOOM_EINVALID;
    }
    return k;
}

int loom__oauth_prm_urls(const char *server_url, char urls[][LOOM_URL_MAX],
                         int cap)
{
    loom_url_parts u;
    size_t n;
    int k = 0;

    if (loom__url_parts(server_url, &u) != 0 || cap < 2)
        return LOOM_EINVALID;
    n = strlen(u.path);
    while (n && u.path[n - 1] == '/')
        u.path[--n] = '\0';
    if (n && well_known(urls[k++], &u, "/.well-known/oauth-protected-resource",
                        u.path))
        return LOOM_EINVALID;
    if (well_known(urls[k++], &u, "/.well-known/oauth-protected-resource", ""))
        return LOOM_EINVALID;
    return k;
}

int loom__oauth_iss_ok(const json_t *as_meta, const char *issuer,
                       const char *iss)
{
    if (iss)
        return strcmp(iss, issuer) == 0;
    return !json_is_true(json_object_get(
        as_meta, "authorization_response_iss_parameter_supported"));
}

int loom__oauth_as_metadata_ok(const json_t *meta, const char *issuer)
{
    const char *v = json_string_value(json_object_get(meta, "issuer"));

    return v && strcmp(v, issuer) == 0 &&
           json_is_string(json_object_get(meta, "token_endpoint"));
}
