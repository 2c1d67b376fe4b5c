/*
 * The OAuth 2.1 client of the MCP client's HTTP servers, as the MCP
 * authorization spec (2025-11-25, 2026-07-28) asks. The HTTP transport
 * (mcp_http.c) puts the current access token on each request and, on a
 * 401 or a 403 insufficient_scope, hands the answer's WWW-Authenticate
 * here; when a new token is ready it sends the request again.
 *
 * One authorization: the protected-resource metadata (RFC 9728), from
 * the challenge's resource_metadata or the well-known paths (path-based,
 * then the root), whose resource must stand for the server's URL; the
 * first authorization server's metadata (RFC 8414, then OpenID Connect
 * Discovery), whose issuer must be the one asked for; a client for that
 * issuer: the config's pre-registered one, a Client ID Metadata Document
 * URL when the server takes those, or dynamic registration (RFC 7591);
 * scopes (the challenge's, joined with those asked before, else the
 * resource's scopes_supported, else none; offline_access added when the
 * authorization server lists it); then a refresh (a 401 with a refresh
 * token at hand), the client-credentials grant, or the authorization-code
 * grant with PKCE S256, state and RFC 9207 iss checked, through the
 * authorizer (loom/mcp.h). Every authorization and token request names
 * the resource (RFC 8707). The token endpoint is authenticated as the
 * client was registered: client_secret_basic, client_secret_post, none,
 * or private_key_jwt (an ES256 or RS256 assertion, RFC 7523).
 *
 * Credentials (clients, tokens) are kept per issuer, so a server that
 * moves to another authorization server gets a new registration and
 * never the old server's client. They are saved through the server's
 * credential store when it has one. Three authorizations in a row that
 * lead to no accepted request stop the trying. Tokens and secrets are
 * never logged.
 */
#include "core/clock.h"
#include "core/error.h"
#include "loom/buf.h"
#include "loom/log.h"
#include "tools/mcp/mcp_internal.h"

#include <curl/curl.h>
#include <openssl/bio.h>
#include <openssl/ecdsa.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define MAX_ATTEMPTS 3
#define HTTP_MS 30000L
#define BODY_MAX ((size_t)1 << 20)
#define BEARER_MAX 8192
/* An access token this close to its end is refreshed before use. */
#define EXPIRY_SLACK_S 30

struct mcp_oauth {
    loom_mcp_server *s; /* its owner */
    const loom_mcp_server_config *cfg;
    pthread_mutex_t mu;   /* the fields below */
    pthread_mutex_t flow; /* one authorization at a time */
    json_t *creds;        /* {"issuer": current, "issuers": {issuer: entry}} */
    char *bearer;         /* "Bearer <token>" now in use, NULL for none */
    int attempts;
    int failed; /* the last authorization failed */
    int loaded;
    loom_mcp_authorizer az;
    loom_mcp_credentials cs;
    char *user; /* whose credentials: a user's, or "" the server's */
};

/* What discovery found for one authorization. */
typedef struct {
    json_t *prm;  /* protected-resource metadata, NULL when none */
    json_t *meta; /* authorization-server metadata */
    char issuer[LOOM_URL_MAX];
    char resource[LOOM_URL_MAX];
} found;

int loom__mcp_oauth_new(mcp_oauth **out, loom_mcp_server *s)
{
    const loom_mcp_server_config *cfg = loom__mcp_config(s);
    const char *g = cfg->oauth.grant_type, *m = cfg->oauth.auth_method;
    mcp_oauth *o;

    *out = NULL;
    if (g && strcmp(g, "authorization_code") && strcmp(g, "client_credentials"))
        return loom__error_set(LOOM_EINVALID,
                               "MCP server '%s': oauth grant_type %s is not "
                               "authorization_code or client_credentials",
                               cfg->name, g);
    if (m && strcmp(m, "client_secret_basic") &&
        strcmp(m, "client_secret_post") && strcmp(m, "none") &&
        strcmp(m, "private_key_jwt"))
        return loom__error_set(LOOM_EINVALID,
                               "MCP server '%s': oauth auth_method %s is not "
                               "client_secret_basic, client_secret_post, "
                               "none or private_key_jwt",
                               cfg->name, m);
    if (!(o = calloc(1, sizeof(*o))) ||
        !(o->creds = json_pack("{s:{}}", "issuers"))) {
        free(o);
        return loom__error_oom();
    }
    if (!(o->user = strdup(""))) {
        json_decref(o->creds);
        free(o);
        return loom__error_oom();
    }
    o->s = s;
    o->cfg = cfg;
    pthread_mutex_init(&o->mu, NULL);
    pthread_mutex_init(&o->flow, NULL);
    *out = o;
    return 0;
}

void loom__mcp_oauth_free(mcp_oauth *o)
{
    if (!o)
        return;
    json_decref(o->creds);
    free(o->bearer);
    free(o->user);
    pthread_mutex_destroy(&o->mu);
    pthread_mutex_destroy(&o->flow);
    free(o);
}

void loom__mcp_oauth_set_authorizer(mcp_oauth *o, const loom_mcp_authorizer *a)
{
    pthread_mutex_lock(&o->mu);
    if (a)
        o->az = *a;
    else
        memset(&o->az, 0, sizeof(o->az));
    pthread_mutex_unlock(&o->mu);
}

void loom__mcp_oauth_set_credentials(mcp_oauth *o,
                                     const loom_mcp_credentials *c)
{
    pthread_mutex_lock(&o->mu);
    if (c)
        o->cs = *c;
    else
        memset(&o->cs, 0, sizeof(o->cs));
    o->loaded = 0;
    pthread_mutex_unlock(&o->mu);
}

int loom__mcp_oauth_set_user(mcp_oauth *o, const char *user)
{
    char *u = strdup(user ? user : "");

    if (!u)
        return loom__error_oom();
    pthread_mutex_lock(&o->mu);
    free(o->user);
    o->user = u;
    o->loaded = 0;
    pthread_mutex_unlock(&o->mu);
    return 0;
}

/* ---- the credentials --------------------------------------------------- */

static const char *name_of(const mcp_oauth *o)
{
    return o->cfg->name;
}

/* The entry of issuer, made when absent. Under mu. */
static json_t *entry_locked(mcp_oauth *o, const char *issuer)
{
    json_t *all = json_object_get(o->creds, "issuers");
    json_t *e = json_object_get(all, issuer);

    if (!e && json_object_set_new(all, issuer, json_object()) == 0)
        e = json_object_get(all, issuer);
    return e;
}

static const char *str(const json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

/* Sets bearer from the current issuer's access token. Under mu. */
static void use_current_locked(mcp_oauth *o)
{
    const char *issuer = str(o->creds, "issuer");
    const json_t *e =
        issuer ? json_object_get(json_object_get(o->creds, "issuers"), issuer)
               : NULL;
    const char *tok = str(e, "access_token");
    char *b = NULL;

    if (tok && strlen(tok) < BEARER_MAX - 8 && (b = malloc(strlen(tok) + 8)))
        snprintf(b, strlen(tok) + 8, "Bearer %s", tok);
    free(o->bearer);
    o->bearer = b;
}

/* Loads the saved credentials once. Under mu. */
static void load_locked(mcp_oauth *o)
{
    char *text = NULL;
    json_t *j;
    int rc;

    if (o->loaded || !o->cs.load)
        return;
    o->loaded = 1;
    if ((rc = o->cs.load(o->cs.arg, name_of(o), o->user, &text)) != 0) {
        if (rc != LOOM_ENOTFOUND)
            loom_warn("mcp %s: the saved OAuth credentials are not readable "
                      "(%s); authorizing again",
                      name_of(o), loom_error_last());
        else if (text == NULL && loom_error_last()[0])
            loom_debug("mcp %s: no saved OAuth credentials (%s)", name_of(o),
                       loom_error_last());
        free(text);
        return;
    }
    j = json_loads(text, 0, NULL);
    free(text);
    if (json_is_object(json_object_get(j, "issuers"))) {
        json_decref(o->creds);
        o->creds = j;
        use_current_locked(o);
    } else {
        json_decref(j);
        loom_warn("mcp %s: the saved OAuth credentials are not readable; "
                  "ignored",
                  name_of(o));
    }
}

int loom__mcp_oauth_text_connected(const char *json)
{
    json_t *j = json ? json_loads(json, 0, NULL) : NULL;
    const char *issuer = str(j, "issuer");
    const json_t *e =
        issuer ? json_object_get(json_object_get(j, "issuers"), issuer) : NULL;
    int on = str(e, "access_token") || str(e, "refresh_token");

    json_decref(j);
    return on;
}

/* Saves the credentials, when there is a store. Under mu. */
static void save_locked(mcp_oauth *o)
{
    char *text;

    if (!o->cs.save)
        return;
    if (!(text = json_dumps(o->creds, JSON_COMPACT)))
        return;
    if (o->cs.save(o->cs.arg, name_of(o), o->user, text) != 0)
        loom_warn("mcp %s: saving the OAuth credentials failed: %s", name_of(o),
                  loom_error_last());
    free(text);
}

/* ---- HTTP -------------------------------------------------------------- */

typedef struct {
    long status;
    loom_buf body;
    char location[LOOM_URL_MAX];
} reply;

static size_t on_header(char *data, size_t size, size_t n, void *arg)
{
    reply *r = arg;
    size_t len = size * n;

    if (len > 9 && strncasecmp(data, "location:", 9) == 0 &&
        len - 9 < sizeof(r->location)) {
        const char *v = data + 9;
        size_t k = len - 9;
        while (k && (*v == ' ' || *v == '\t'))
            v++, k--;
        while (k && (v[k - 1] == '\r' || v[k - 1] == '\n' || v[k - 1] == ' '))
            k--;
        memcpy(r->location, v, k);
        r->location[k] = '\0';
    }
    return len;
}

static size_t on_body(char *data, size_t size, size_t n, void *arg)
{
    reply *r = arg;

    return loom_buf_put(&r->body, data, size * n) == 0 ? size * n : 0;
}

/*
 * One request: GET (form NULL) or POST of form (urlencoded) or of json
 * (is_json), with an Authorization header auth (may be NULL). Redirects
 * are not followed. r must be initialised by the caller (buf).
 */
static int http(const mcp_oauth *o, const char *url, const char *form,
                int is_json, const char *auth, int64_t deadline, reply *r)
{
    struct curl_slist *h = NULL, *t;
    long left = (long)(deadline - loom__mono_ms());
    char line[BEARER_MAX];
    CURL *e;
    CURLcode cc;

    r->status = 0;
    r->location[0] = '\0';
    loom_buf_clear(&r->body);
    if (left < 1)
        return loom__error_set(LOOM_ETIMEDOUT,
                               "MCP server '%s': no time left to authorize",
                               name_of(o));
    if (!(e = curl_easy_init()))
        return loom__error_oom();
    h = curl_slist_append(h, "Accept: application/json");
    if (h && form)
        h = (t = curl_slist_append(
                 h, is_json
                        ? "Content-Type: application/json"
                        : "Content-Type: application/x-www-form-urlencoded"))
                ? t
                : NULL;
    if (h && auth) {
        snprintf(line, sizeof(line), "Authorization: %s", auth);
        h = (t = curl_slist_append(h, line)) ? t : NULL;
    }
    if (!h) {
        curl_easy_cleanup(e);
        return loom__error_oom();
    }
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, left < HTTP_MS ? left : HTTP_MS);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, r);
    if (form)
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, form);
    cc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &r->status);
    curl_easy_cleanup(e);
    curl_slist_free_all(h);
    if (cc != CURLE_OK)
        return loom__error_set(LOOM_EUPSTREAM, "MCP server '%s': %s: %s",
                               name_of(o), url, curl_easy_strerror(cc));
    return 0;
}

/* GET url as a JSON object: *out, or NULL when it is not there (any
 * status but 200, or not an object). Errors only for the network. */
static int get_json(const mcp_oauth *o, const char *url, int64_t deadline,
                    json_t **out)
{
    reply r;
    int rc;

    *out = NULL;
    loom_buf_init(&r.body, BODY_MAX);
    rc = http(o, url, NULL, 0, NULL, deadline, &r);
    if (rc == 0 && r.status == 200) {
        *out = json_loadb(r.body.ptr, r.body.len, 0, NULL);
        if (!json_is_object(*out)) {
            json_decref(*out);
            *out = NULL;
        }
    }
    loom_debug("mcp %s: GET %s: %ld", name_of(o), url, r.status);
    loom_buf_free(&r.body);
    return rc;
}

/* ---- discovery --------------------------------------------------------- */

static void found_free(found *f)
{
    json_decref(f->prm);
    json_decref(f->meta);
}

/* The protected-resource metadata, from the challenge's URL or the
 * well-known ones; its resource checked. */
static int find_prm(mcp_oauth *o, const json_t *ch, int64_t deadline, found *f)
{
    const char *given = str(ch, "resource_metadata");
    char urls[2][LOOM_URL_MAX];
    const char *res;
    int n, rc;

    if (given) {
        snprintf(urls[0], LOOM_URL_MAX, "%s", given);
        n = 1;
    } else if ((n = loom__oauth_prm_urls(o->cfg->url, urls, 2)) < 0) {
        return loom__error_set(LOOM_EINVALID, "MCP server '%s': bad url",
                               name_of(o));
    }
    for (int i = 0; i < n && !f->prm; i++)
        if ((rc = get_json(o, urls[i], deadline, &f->prm)) != 0)
            return rc;
    if (!f->prm) {
        /* No metadata: the server's origin is its authorization server
         * (the 2025-03-26 way). */
        loom_url_parts u;
        if (loom__url_parts(o->cfg->url, &u) != 0)
            return loom__error_set(LOOM_EINVALID, "MCP server '%s': bad url",
                                   name_of(o));
        snprintf(f->issuer, sizeof(f->issuer), "%s://%s", u.scheme,
                 u.authority);
        snprintf(f->resource, sizeof(f->resource), "%s", o->cfg->url);
        return 0;
    }
    res = str(f->prm, "resource");
    if (res && !loom__oauth_resource_ok(res, o->cfg->url))
        return loom__error_set(LOOM_EUPSTREAM,
                               "MCP server '%s': its protected-resource "
                               "metadata is for %.200s, not for %.200s; not "
                               "authorizing",
                               name_of(o), res, o->cfg->url);
    snprintf(f->resource, sizeof(f->resource), "%s", res ? res : o->cfg->url);
    res = json_string_value(
        json_array_get(json_object_get(f->prm, "authorization_servers"), 0));
    if (!res || strlen(res) >= sizeof(f->issuer))
        return loom__error_set(LOOM_EUPSTREAM,
                               "MCP server '%s': its protected-resource "
                               "metadata names no authorization server",
                               name_of(o));
    snprintf(f->issuer, sizeof(f->issuer), "%s", res);
    return 0;
}

/* The authorization server's metadata, its issuer checked. */
static int find_meta(mcp_oauth *o, int64_t deadline, found *f)
{
    char urls[3][LOOM_URL_MAX];
    int n = loom__oauth_metadata_urls(f->issuer, urls, 3), rc;

    if (n < 0)
        return loom__error_set(LOOM_EUPSTREAM,
                               "MCP server '%s': authorization server %.200s "
                               "is not an http(s) URL",
                               name_of(o), f->issuer);
    for (int i = 0; i < n; i++) {
        json_t *m = NULL;
        if ((rc = get_json(o, urls[i], deadline, &m)) != 0)
            return rc;
        if (!m)
            continue;
        if (!loom__oauth_as_metadata_ok(m, f->issuer)) {
            loom_warn("mcp %s: authorization server metadata at %s names "
                      "issuer %.200s, not %.200s: not used",
                      name_of(o), urls[i], str(m, "issuer"), f->issuer);
            json_decref(m);
            return loom__error_set(LOOM_EUPSTREAM,
                                   "MCP server '%s': the authorization "
                                   "server's metadata names another issuer",
                                   name_of(o));
        }
        f->meta = m;
        return 0;
    }
    return loom__error_set(LOOM_EUPSTREAM,
                           "MCP server '%s': no authorization server "
                           "metadata for %.200s",
                           name_of(o), f->issuer);
}

/* ---- scopes ------------------------------------------------------------ */

static int has_word(const char *list, const char *w)
{
    size_t n = strlen(w);

    if (!list)
        return 0;
    for (const char *p = list; *p;) {
        size_t k = strcspn(p, " ");
        if (k == n && !strncmp(p, w, n))
            return 1;
        p += k;
        while (*p == ' ')
            p++;
    }
    return 0;
}

/* Appends each word of list not yet in b. */
static int add_words(loom_buf *b, const char *list)
{
    if (!list)
        return 0;
    for (const char *p = list; *p;) {
        size_t k = strcspn(p, " ");
        char w[256];
        if (k && k < sizeof(w)) {
            memcpy(w, p, k);
            w[k] = '\0';
            if (!has_word(loom_buf_cstr(b), w) &&
                ((b->len && loom_buf_putc(b, ' ')) || loom_buf_puts(b, w)))
                return LOOM_ENOMEM;
        }
        p += k;
        while (*p == ' ')
            p++;
    }
    return 0;
}

/*
 * The scope to ask for (into b, "" for none): the config's, or the
 * challenge's joined with what was asked before (step-up keeps what it
 * had), or the resource's scopes_supported; offline_access added when
 * the authorization server offers it and a person is asked.
 */
static int choose_scope(const mcp_oauth *o, const json_t *ch,
                        const json_t *entry, const found *f, int code_grant,
                        loom_buf *b)
{
    const char *asked = str(ch, "scope");
    const json_t *v;
    size_t i;

    loom_buf_clear(b);
    for (i = 0; i < o->cfg->oauth.scopes_len; i++)
        if (add_words(b, o->cfg->oauth.scopes[i]))
            return LOOM_ENOMEM;
    if (asked && *asked) {
        if (add_words(b, str(entry, "scope")) || add_words(b, asked))
            return LOOM_ENOMEM;
    } else if (!b->len) {
        json_array_foreach(json_object_get(f->prm, "scopes_supported"), i, v)
        {
            if (json_is_string(v) && add_words(b, json_string_value(v)))
                return LOOM_ENOMEM;
        }
    }
    json_array_foreach(json_object_get(f->meta, "scopes_supported"), i, v)
    {
        if (code_grant && json_is_string(v) &&
            !strcmp(json_string_value(v), "offline_access") &&
            add_words(b, "offline_access"))
            return LOOM_ENOMEM;
    }
    return 0;
}

/* ---- the client -------------------------------------------------------- */

static int supports(const json_t *meta, const char *key, const char *v)
{
    const json_t *x;
    size_t i;

    json_array_foreach(json_object_get(meta, key), i, x)
    {
        if (json_is_string(x) && !strcmp(json_string_value(x), v))
            return 1;
    }
    return 0;
}

/* The token endpoint auth method to use with a secret (or without). */
static const char *pick_method(const json_t *meta, int secret)
{
    const json_t *list =
        json_object_get(meta, "token_endpoint_auth_methods_supported");

    if (!secret)
        return "none";
    if (!json_array_size(list) ||
        supports(meta, "token_endpoint_auth_methods_supported",
                 "client_secret_basic"))
        return "client_secret_basic";
    if (supports(meta, "token_endpoint_auth_methods_supported",
                 "client_secret_post"))
        return "client_secret_post";
    return "client_secret_basic";
}

static int set_str(json_t *o, const char *key, const char *v)
{
    if (!v) {
        json_object_del(o, key);
        return 0;
    }
    return json_object_set_new(o, key, json_string(v)) ? LOOM_ENOMEM : 0;
}

/* Dynamic client registration (RFC 7591) into entry. */
static int register_client(mcp_oauth *o, const found *f, json_t *entry,
                           const char *redirect, int code_grant,
                           int64_t deadline)
{
    const char *ep = str(f->meta, "registration_endpoint");
    const char *want =
        supports(f->meta, "token_endpoint_auth_methods_supported", "none") ||
                !json_array_size(json_object_get(
                    f->meta, "token_endpoint_auth_methods_supported"))
            ? "none"
            : pick_method(f->meta, 1);
    json_t *req, *ans = NULL;
    char *text;
    reply r;
    int rc;

    req = json_pack(
        "{s:s,s:s,s:s}", "client_name",
        o->cfg->oauth.client_name ? o->cfg->oauth.client_name : "loom",
        "token_endpoint_auth_method", want, "application_type", "native");
    if (!req)
        return loom__error_oom();
    if (code_grant) {
        json_object_set_new(req, "redirect_uris", json_pack("[s]", redirect));
        json_object_set_new(
            req, "grant_types",
            json_pack("[s,s]", "authorization_code", "refresh_token"));
        json_object_set_new(req, "response_types", json_pack("[s]", "code"));
    } else {
        json_object_set_new(req, "grant_types",
                            json_pack("[s]", "client_credentials"));
    }
    text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (!text)
        return loom__error_oom();
    loom_buf_init(&r.body, BODY_MAX);
    rc = http(o, ep, text, 1, NULL, deadline, &r);
    free(text);
    if (rc == 0) {
        ans = json_loadb(r.body.ptr, r.body.len, 0, NULL);
        if ((r.status != 200 && r.status != 201) || !str(ans, "client_id"))
            rc = loom__error_set(LOOM_EUPSTREAM,
                                 "MCP server '%s': client registration "
                                 "refused (HTTP %ld): %.200s",
                                 name_of(o), r.status,
                                 str(ans, "error_description")
                                     ? str(ans, "error_description")
                                     : loom_buf_cstr(&r.body));
    }
    loom_buf_free(&r.body);
    if (rc == 0) {
        const char *secret = str(ans, "client_secret");
        const char *m = str(ans, "token_endpoint_auth_method");
        rc = set_str(entry, "client_id", str(ans, "client_id"));
        if (!rc)
            rc = set_str(entry, "client_secret", secret);
        if (!rc)
            rc = set_str(entry, "auth_method",
                         m ? m : pick_method(f->meta, secret != NULL));
        if (!rc)
            rc = set_str(entry, "client_from", "registration");
        if (!rc && code_grant)
            rc = set_str(entry, "redirect_uri", redirect);
        loom_info("mcp %s: registered client with %s", name_of(o), f->issuer);
    }
    json_decref(ans);
    return rc;
}

/* a without the port of an http://127.0.0.1 URI (RFC 8252 lets a
 * loopback redirect's port change), into out. */
static void sans_loopback_port(const char *a, char *out, size_t cap)
{
    static const char lo[] = "http://127.0.0.1:";
    const char *rest;

    if (strncmp(a, lo, sizeof(lo) - 1) != 0) {
        snprintf(out, cap, "%s", a);
        return;
    }
    rest = a + sizeof(lo) - 1;
    rest += strspn(rest, "0123456789");
    snprintf(out, cap, "%s%s", lo, rest);
}

/* Whether a client registered for redirect URI was may be sent to now.
 * Clients registered before the URI was kept (was NULL) were registered
 * by `loom mcp login`, for a loopback one. */
static int same_redirect(const char *was, const char *now)
{
    char a[LOOM_URL_MAX], b[LOOM_URL_MAX];

    if (!was)
        was = "http://127.0.0.1:0/callback";
    sans_loopback_port(was, a, sizeof(a));
    sans_loopback_port(now, b, sizeof(b));
    return strcmp(a, b) == 0;
}

/* Makes sure entry has a client for the issuer of f. */
static int ensure_client(mcp_oauth *o, const found *f, json_t *entry,
                         const char *redirect, int code_grant, int64_t deadline)
{
    const loom_mcp_oauth_config *c = &o->cfg->oauth;

    if (c->client_id) {
        /* the config's client, whichever issuer */
        if (set_str(entry, "client_id", c->client_id) ||
            set_str(entry, "client_secret", c->client_secret) ||
            set_str(entry, "auth_method",
                    c->auth_method ? c->auth_method
                    : c->private_key
                        ? "private_key_jwt"
                        : pick_method(f->meta, c->client_secret != NULL)) ||
            set_str(entry, "client_from", "config"))
            return loom__error_oom();
        return 0;
    }
    if (str(entry, "client_id") &&
        (!code_grant || !str(entry, "client_from") ||
         strcmp(str(entry, "client_from"), "registration") != 0 ||
         same_redirect(str(entry, "redirect_uri"), redirect)))
        return 0;
    if (str(entry, "client_id"))
        /* Registered for another redirect URI (`loom mcp login`'s, and
         * now loom serve's own): a client of its own for this one. */
        loom_info("mcp %s: registering again for redirect URI %s", name_of(o),
                  redirect);
    if (c->client_metadata_url && code_grant &&
        json_is_true(json_object_get(
            f->meta, "client_id_metadata_document_supported"))) {
        if (set_str(entry, "client_id", c->client_metadata_url) ||
            set_str(entry, "auth_method", "none") ||
            set_str(entry, "client_from", "metadata_document"))
            return loom__error_oom();
        return 0;
    }
    if (str(f->meta, "registration_endpoint"))
        return register_client(o, f, entry, redirect, code_grant, deadline);
    return loom__error_set(LOOM_EINVALID,
                           "MCP server '%s': authorization server %.200s "
                           "takes no registration; give oauth.client_id "
                           "(and client_secret) in the config",
                           name_of(o), f->issuer);
}

/* ---- the token endpoint ------------------------------------------------ */

/* A private_key_jwt client assertion (RFC 7523) for aud, signed with the
 * config's key (ES256 or RS256). */
static int client_assertion(const mcp_oauth *o, const char *client_id,
                            const char *aud, loom_buf *out)
{
    const char *alg =
        o->cfg->oauth.signing_alg ? o->cfg->oauth.signing_alg : "ES256";
    int es = !strcmp(alg, "ES256");
    char jti[32], part[2048];
    unsigned char sig[600], raw[64];
    size_t siglen = sizeof(sig);
    json_t *head, *body;
    char *h = NULL, *b = NULL;
    BIO *bio;
    EVP_PKEY *key = NULL;
    EVP_MD_CTX *md = NULL;
    int rc = LOOM_ERROR;
    time_t now = time(NULL);

    if (!es && strcmp(alg, "RS256"))
        return loom__error_set(LOOM_EINVALID,
                               "MCP server '%s': oauth signing_alg %s is not "
                               "ES256 or RS256",
                               name_of(o), alg);
    if (!o->cfg->oauth.private_key ||
        loom__oauth_random(jti, 16, sizeof(jti)) != 0)
        return loom__error_set(LOOM_EINVALID,
                               "MCP server '%s': private_key_jwt needs "
                               "oauth.private_key",
                               name_of(o));
    head = json_pack("{s:s,s:s}", "alg", alg, "typ", "JWT");
    body = json_pack("{s:s,s:s,s:s,s:I,s:I,s:s}", "iss", client_id, "sub",
                     client_id, "aud", aud, "iat", (json_int_t)now, "exp",
                     (json_int_t)now + 300, "jti", jti);
    h = json_dumps(head, JSON_COMPACT);
    b = json_dumps(body, JSON_COMPACT);
    json_decref(head);
    json_decref(body);
    bio = BIO_new_mem_buf(o->cfg->oauth.private_key, -1);
    if (!h || !b || !bio)
        goto done;
    key = PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL);
    loom_buf_clear(out);
    if (!key ||
        !loom__b64url((unsigned char *)h, strlen(h), part, sizeof(part)) ||
        loom_buf_puts(out, part) || loom_buf_putc(out, '.') ||
        !loom__b64url((unsigned char *)b, strlen(b), part, sizeof(part)) ||
        loom_buf_puts(out, part) || !(md = EVP_MD_CTX_new()) ||
        EVP_DigestSignInit(md, NULL, EVP_sha256(), NULL, key) != 1 ||
        EVP_DigestSign(md, sig, &siglen, (const unsigned char *)out->ptr,
                       out->len) != 1)
        goto done;
    if (es) {
        const unsigned char *p = sig;
        ECDSA_SIG *es_sig = d2i_ECDSA_SIG(NULL, &p, (long)siglen);
        const BIGNUM *r, *s;
        if (!es_sig)
            goto done;
        ECDSA_SIG_get0(es_sig, &r, &s);
        BN_bn2binpad(r, raw, 32);
        BN_bn2binpad(s, raw + 32, 32);
        ECDSA_SIG_free(es_sig);
        memcpy(sig, raw, 64);
        siglen = 64;
    }
    if (loom_buf_putc(out, '.') ||
        !loom__b64url(sig, siglen, part, sizeof(part)) ||
        loom_buf_puts(out, part))
        goto done;
    rc = 0;
done:
    if (rc != 0)
        rc = loom__error_set(LOOM_EINVALID,
                             "MCP server '%s': cannot sign a client "
                             "assertion with oauth.private_key (%s)",
                             name_of(o), alg);
    EVP_MD_CTX_free(md);
    EVP_PKEY_free(key);
    BIO_free(bio);
    free(h);
    free(b);
    return rc;
}

/* "Basic base64(urlenc(id):urlenc(secret))" (RFC 6749 section 2.3.1). */
static int basic_auth(const char *id, const char *secret, char *out, size_t cap)
{
    loom_buf pair;
    int rc = LOOM_ETOOLARGE;

    loom_buf_init(&pair, 4096);
    if (loom__form_escape(&pair, id) == 0 && loom_buf_putc(&pair, ':') == 0 &&
        loom__form_escape(&pair, secret ? secret : "") == 0 &&
        cap > 6 + (pair.len + 2) / 3 * 4) {
        snprintf(out, cap, "Basic ");
        EVP_EncodeBlock((unsigned char *)out + 6,
                        (const unsigned char *)pair.ptr, (int)pair.len);
        rc = 0;
    }
    loom_buf_free(&pair);
    return rc;
}

/*
 * POSTs form (grant and the rest) to the token endpoint with the
 * client's authentication, and takes the token into entry. Errors say
 * what the server said.
 */
static int token_request(mcp_oauth *o, const found *f, json_t *entry,
                         loom_buf *form, const char *asked_scope,
                         int64_t deadline)
{
    const char *method = str(entry, "auth_method");
    const char *id = str(entry, "client_id");
    const char *secret = str(entry, "client_secret");
    char auth[4096 + 16];
    const char *use_auth = NULL;
    json_t *ans = NULL;
    reply r;
    int rc = 0;

    if (!method)
        method = "none";
    if (!strcmp(method, "client_secret_basic")) {
        if (basic_auth(id, secret, auth, sizeof(auth)) != 0)
            return loom__error_set(LOOM_ETOOLARGE,
                                   "MCP server '%s': client id or secret "
                                   "too long",
                                   name_of(o));
        use_auth = auth;
    } else if (!strcmp(method, "client_secret_post")) {
        rc = loom__form_add(form, "client_id", id) ||
             loom__form_add(form, "client_secret", secret);
    } else if (!strcmp(method, "private_key_jwt")) {
        loom_buf jwt;
        loom_buf_init(&jwt, 16384);
        rc = client_assertion(o, id, f->issuer, &jwt);
        if (rc == 0 &&
            (loom__form_add(form, "client_id", id) ||
             loom__form_add(form, "client_assertion_type",
                            "urn:ietf:params:oauth:client-assertion-type:"
                            "jwt-bearer") ||
             loom__form_add(form, "client_assertion", loom_buf_cstr(&jwt))))
            rc = LOOM_ENOMEM;
        loom_buf_free(&jwt);
        if (rc == LOOM_EINVALID)
            return rc;
    } else {
        rc = loom__form_add(form, "client_id", id);
    }
    if (rc != 0)
        return loom__error_oom();
    loom_buf_init(&r.body, BODY_MAX);
    rc = http(o, str(f->meta, "token_endpoint"), loom_buf_cstr(form), 0,
              use_auth, deadline, &r);
    if (rc == 0) {
        const char *type;
        ans = json_loadb(r.body.ptr, r.body.len, 0, NULL);
        type = str(ans, "token_type");
        if (r.status != 200 || !str(ans, "access_token"))
            rc = loom__error_set(
                LOOM_EUPSTREAM,
                "MCP server '%s': the token endpoint refused (HTTP %ld): "
                "%.100s%s%.200s",
                name_of(o), r.status,
                str(ans, "error") ? str(ans, "error") : "",
                str(ans, "error_description") ? ": " : "",
                str(ans, "error_description") ? str(ans, "error_description")
                                              : "");
        else if (type && strcasecmp(type, "Bearer") != 0)
            rc = loom__error_set(LOOM_EUPSTREAM,
                                 "MCP server '%s': token type %.40s is not "
                                 "supported (Bearer only)",
                                 name_of(o), type);
    }
    loom_buf_free(&r.body);
    if (rc == 0) {
        json_int_t exp = json_integer_value(json_object_get(ans, "expires_in"));
        const char *scope = str(ans, "scope");
        rc = set_str(entry, "access_token", str(ans, "access_token"));
        if (!rc && str(ans, "refresh_token"))
            rc = set_str(entry, "refresh_token", str(ans, "refresh_token"));
        if (!rc)
            rc = set_str(entry, "scope",
                         scope                         ? scope
                         : asked_scope && *asked_scope ? asked_scope
                                                       : NULL);
        if (!rc)
            rc = set_str(entry, "resource", f->resource);
        if (!rc && exp > 0)
            rc = json_object_set_new(entry, "expires_at",
                                     json_integer((json_int_t)time(NULL) + exp))
                     ? LOOM_ENOMEM
                     : 0;
        else if (!rc)
            json_object_del(entry, "expires_at");
        if (!rc)
            rc = set_str(entry, "token_endpoint",
                         str(f->meta, "token_endpoint"));
    }
    json_decref(ans);
    return rc;
}

/* The refresh_token grant for entry. */
static int refresh(mcp_oauth *o, const found *f, json_t *entry,
                   int64_t deadline)
{
    loom_buf form;
    int rc;

    loom_buf_init(&form, 1 << 16);
    rc = loom__form_add(&form, "grant_type", "refresh_token") ||
                 loom__form_add(&form, "refresh_token",
                                str(entry, "refresh_token")) ||
                 loom__form_add(&form, "resource", f->resource)
             ? LOOM_ENOMEM
             : token_request(o, f, entry, &form, str(entry, "scope"), deadline);
    loom_buf_free(&form);
    return rc;
}

/* The authorization-code grant: the person (through the authorizer),
 * then the token. *deadline is pushed back by the time the authorizer
 * took. */
static int code_grant(mcp_oauth *o, const found *f, json_t *entry,
                      const char *scope, const char *redirect,
                      int64_t *deadline)
{
    char verifier[LOOM_PKCE_MAX], challenge[LOOM_PKCE_MAX], state[64];
    const char *ep = str(f->meta, "authorization_endpoint");
    char *back = NULL, *code = NULL, *got_state = NULL, *iss = NULL,
         *err = NULL;
    loom_buf url, form;
    int rc;

    if (!ep)
        return loom__error_set(LOOM_EUPSTREAM,
                               "MCP server '%s': the authorization server "
                               "has no authorization endpoint",
                               name_of(o));
    if (!supports(f->meta, "code_challenge_methods_supported", "S256"))
        return loom__error_set(LOOM_EUPSTREAM,
                               "MCP server '%s': the authorization server "
                               "does not offer PKCE S256; not authorizing",
                               name_of(o));
    if ((rc = loom__pkce_pair(verifier, challenge)) != 0 ||
        (rc = loom__oauth_random(state, 24, sizeof(state))) != 0)
        return rc;
    loom_buf_init(&url, 1 << 16);
    loom_buf_init(&form, 1 << 16);
    if (loom__form_add(&url, "response_type", "code") ||
        loom__form_add(&url, "client_id", str(entry, "client_id")) ||
        loom__form_add(&url, "redirect_uri", redirect) ||
        loom__form_add(&url, "code_challenge", challenge) ||
        loom__form_add(&url, "code_challenge_method", "S256") ||
        loom__form_add(&url, "state", state) ||
        (*scope && loom__form_add(&url, "scope", scope)) ||
        loom__form_add(&url, "resource", f->resource)) {
        rc = loom__error_oom();
        goto done;
    }
    {
        /* the endpoint may have a query of its own */
        size_t cap = strlen(ep) + url.len + 2;
        char *full = malloc(cap);
        if (!full) {
            rc = loom__error_oom();
            goto done;
        }
        snprintf(full, cap, "%s%c%s", ep, strchr(ep, '?') ? '&' : '?',
                 loom_buf_cstr(&url));
        /* The person's time does not count against the request's. */
        int64_t t0 = loom__mono_ms();
        rc = o->az.authorize(o->az.arg, full, &back);
        *deadline += loom__mono_ms() - t0;
        free(full);
    }
    if (rc != 0)
        goto done;
    got_state = loom__query_param(back, "state");
    code = loom__query_param(back, "code");
    iss = loom__query_param(back, "iss");
    err = loom__query_param(back, "error");
    if (!got_state || strcmp(got_state, state) != 0) {
        rc = loom__error_set(LOOM_EUPSTREAM,
                             "MCP server '%s': the authorization answer's "
                             "state is not the one sent; ignored",
                             name_of(o));
    } else if (!loom__oauth_iss_ok(f->meta, f->issuer, iss)) {
        rc = loom__error_set(LOOM_EUPSTREAM,
                             "MCP server '%s': the authorization answer %s "
                             "(RFC 9207); rejected",
                             name_of(o),
                             iss ? "comes from another issuer"
                                 : "lacks the iss its server promised");
    } else if (err || !code) {
        char *desc = loom__query_param(back, "error_description");
        rc = loom__error_set(LOOM_EUPSTREAM,
                             "MCP server '%s': authorization refused: "
                             "%.100s%s%.200s",
                             name_of(o), err ? err : "no code",
                             desc ? ": " : "", desc ? desc : "");
        free(desc);
    } else if (loom__form_add(&form, "grant_type", "authorization_code") ||
               loom__form_add(&form, "code", code) ||
               loom__form_add(&form, "redirect_uri", redirect) ||
               loom__form_add(&form, "code_verifier", verifier) ||
               loom__form_add(&form, "resource", f->resource)) {
        rc = loom__error_oom();
    } else {
        rc = token_request(o, f, entry, &form, scope, *deadline);
    }
done:
    free(back);
    free(code);
    free(got_state);
    free(iss);
    free(err);
    loom_buf_free(&url);
    loom_buf_free(&form);
    return rc;
}

/* The client-credentials grant (the MCP extension). */
static int credentials_grant(mcp_oauth *o, const found *f, json_t *entry,
                             const char *scope, int64_t deadline)
{
    loom_buf form;
    int rc;

    loom_buf_init(&form, 1 << 16);
    rc = loom__form_add(&form, "grant_type", "client_credentials") ||
                 (*scope && loom__form_add(&form, "scope", scope)) ||
                 loom__form_add(&form, "resource", f->resource)
             ? loom__error_oom()
             : token_request(o, f, entry, &form, scope, deadline);
    loom_buf_free(&form);
    return rc;
}

/* ---- the transport's side ---------------------------------------------- */

void loom__mcp_oauth_bearer(mcp_oauth *o, int64_t deadline, char *out,
                            size_t cap)
{
    const char *issuer;
    json_t *e;
    json_int_t exp;

    out[0] = '\0';
    pthread_mutex_lock(&o->mu);
    load_locked(o);
    issuer = str(o->creds, "issuer");
    e = issuer ? json_object_get(json_object_get(o->creds, "issuers"), issuer)
               : NULL;
    exp = json_integer_value(json_object_get(e, "expires_at"));
    if (e && exp && exp - EXPIRY_SLACK_S <= (json_int_t)time(NULL) &&
        str(e, "refresh_token") && str(e, "token_endpoint")) {
        /* Refresh ahead of use; a failure leaves it to the 401. */
        found f;
        memset(&f, 0, sizeof(f));
        snprintf(f.issuer, sizeof(f.issuer), "%s", issuer);
        snprintf(f.resource, sizeof(f.resource), "%s",
                 str(e, "resource") ? str(e, "resource") : o->cfg->url);
        f.meta = json_pack("{s:s}", "token_endpoint", str(e, "token_endpoint"));
        if (f.meta && refresh(o, &f, e, deadline) == 0) {
            use_current_locked(o);
            save_locked(o);
        } else {
            json_object_del(e, "expires_at");
            loom_info("mcp %s: refreshing the access token failed: %s",
                      name_of(o), loom_error_last());
        }
        found_free(&f);
    }
    if (o->bearer && strlen(o->bearer) < cap)
        snprintf(out, cap, "%s", o->bearer);
    pthread_mutex_unlock(&o->mu);
}

void loom__mcp_oauth_accepted(mcp_oauth *o)
{
    pthread_mutex_lock(&o->mu);
    o->attempts = 0;
    o->failed = 0;
    pthread_mutex_unlock(&o->mu);
}

int loom__mcp_oauth_failed(mcp_oauth *o)
{
    int f;

    pthread_mutex_lock(&o->mu);
    f = o->failed;
    pthread_mutex_unlock(&o->mu);
    return f;
}

/* One authorization, under flow. */
static int authorize(mcp_oauth *o, long status, const json_t *ch,
                     int64_t *deadlinep)
{
    const loom_mcp_oauth_config *c = &o->cfg->oauth;
    int code = !c->grant_type || strcmp(c->grant_type, "client_credentials");
    char redirect[LOOM_URL_MAX] = "";
    loom_mcp_authorizer az;
    loom_buf scope;
    json_t *entry;
    found f;
    int rc;

    int64_t deadline = *deadlinep;

    memset(&f, 0, sizeof(f));
    loom_buf_init(&scope, 1 << 14);
    if ((rc = find_prm(o, ch, deadline, &f)) != 0 ||
        (rc = find_meta(o, deadline, &f)) != 0)
        goto done;
    pthread_mutex_lock(&o->mu);
    az = o->az;
    entry = json_deep_copy(entry_locked(o, f.issuer));
    pthread_mutex_unlock(&o->mu);
    if (!entry) {
        rc = loom__error_oom();
        goto done;
    }
    /* A token the server turned away: a refresh may do (not for more
     * scope: that needs a new grant). */
    if (status == 401 && str(entry, "refresh_token")) {
        if ((rc = refresh(o, &f, entry, deadline)) == 0)
            goto keep;
        loom_info("mcp %s: refresh failed (%s); authorizing again", name_of(o),
                  loom_error_last());
        json_object_del(entry, "refresh_token");
    }
    json_object_del(entry, "access_token");
    if ((rc = choose_scope(o, ch, entry, &f, code, &scope)) != 0)
        goto done_entry;
    if (code) {
        if ((!az.authorize || !az.redirect_uri) && *o->user) {
            rc = loom__error_set(
                LOOM_EUPSTREAM,
                "MCP server '%s' needs your own account there, and you have "
                "not connected it. Tell the user: connect your account: "
                "`loom mcp login %s --user %s` (or, with loom serve, in the "
                "web UI's settings: MCP accounts)",
                name_of(o), name_of(o), o->user);
            goto done_entry;
        }
        if (!az.authorize || !az.redirect_uri) {
            rc = loom__error_set(LOOM_EUPSTREAM,
                                 "MCP server '%s' needs a person to "
                                 "authorize loom: run `loom mcp login %s`",
                                 name_of(o), name_of(o));
            goto done_entry;
        }
        if ((rc = az.redirect_uri(az.arg, redirect, sizeof(redirect))) != 0)
            goto done_entry;
    }
    if ((rc = ensure_client(o, &f, entry, redirect, code, deadline)) != 0)
        goto done_entry;
    rc = code
             ? code_grant(o, &f, entry, loom_buf_cstr(&scope), redirect,
                          deadlinep)
             : credentials_grant(o, &f, entry, loom_buf_cstr(&scope), deadline);
    if (rc != 0)
        goto done_entry;
keep:
    pthread_mutex_lock(&o->mu);
    if (json_object_set(json_object_get(o->creds, "issuers"), f.issuer,
                        entry) != 0 ||
        set_str(o->creds, "issuer", f.issuer) != 0) {
        rc = loom__error_oom();
    } else {
        use_current_locked(o);
        save_locked(o);
        loom_info("mcp %s: authorized by %s%s%s", name_of(o), f.issuer,
                  str(entry, "scope") ? " for " : "",
                  str(entry, "scope") ? str(entry, "scope") : "");
    }
    pthread_mutex_unlock(&o->mu);
done_entry:
    json_decref(entry);
done:
    loom_buf_free(&scope);
    found_free(&f);
    return rc;
}

int loom__mcp_oauth_challenge(mcp_oauth *o, long status, const char *www,
                              const char *bearer, int64_t *deadline)
{
    json_t *ch = loom__www_authenticate(www ? www : "");
    const char *err = str(ch, "error");
    int rc, n;

    if (o->cfg->oauth.disabled ||
        (status == 403 && (!err || strcmp(err, "insufficient_scope") != 0)) ||
        (status != 401 && status != 403)) {
        json_decref(ch);
        return 0;
    }
    pthread_mutex_lock(&o->flow);
    pthread_mutex_lock(&o->mu);
    if (o->bearer && strcmp(o->bearer, bearer ? bearer : "") != 0) {
        /* another request got a new token meanwhile */
        pthread_mutex_unlock(&o->mu);
        pthread_mutex_unlock(&o->flow);
        json_decref(ch);
        return 1;
    }
    n = ++o->attempts;
    pthread_mutex_unlock(&o->mu);
    if (n > MAX_ATTEMPTS) {
        rc = loom__error_set(LOOM_EUPSTREAM,
                             "MCP server '%s': still refused (HTTP %ld%s%s) "
                             "after %d authorizations; giving up",
                             name_of(o), status, err ? ", " : "",
                             err ? err : "", MAX_ATTEMPTS);
    } else {
        loom_info("mcp %s: HTTP %ld%s%s: authorizing", name_of(o), status,
                  err ? ", " : "", err ? err : "");
        rc = authorize(o, status, ch, deadline);
        if (rc == 0)
            rc = 1;
    }
    pthread_mutex_lock(&o->mu);
    o->failed = rc < 0;
    pthread_mutex_unlock(&o->mu);
    pthread_mutex_unlock(&o->flow);
    json_decref(ch);
    return rc;
}
