/*
 * The web UI (docs/ui.md): GET / and GET /assets/<name> answer the files
 * web/build.mjs embedded at build time (ui_assets.h), unless the config
 * says `server.ui: false`. The pages need no key: the UI asks for one
 * itself (its sign-in screen) and sends it to the API as a bearer token.
 *
 * Every answer carries a strict Content-Security-Policy (scripts, styles,
 * fetches and images from this origin only, no inline script, no
 * plugins, no framing), X-Content-Type-Options: nosniff and
 * Referrer-Policy: no-referrer, so model output that slipped past the
 * UI's sanitiser still cannot run script or leak the page's address. The
 * files' names are not versioned, so browsers revalidate them on each use
 * (Cache-Control: no-cache) with their ETag and get a 304 when unchanged.
 */
#include "server/srvpriv.h"
#include "server/ui_assets.h"

#include <string.h>

#define UI_CSP                                                                 \
    "default-src 'self'; script-src 'self'; style-src 'self'; "                \
    "img-src 'self' data:; connect-src 'self'; font-src 'self'; "              \
    "object-src 'none'; base-uri 'none'; form-action 'self'; "                 \
    "frame-ancestors 'none'"

int srv__ui_public(const char *path)
{
    return !strcmp(path, "/") || !strncmp(path, "/assets/", 8);
}

static const srv_ui_asset *find_asset(const char *path)
{
    for (size_t i = 0; i < srv_ui_assets_len; i++)
        if (!strcmp(srv_ui_assets[i].path, path))
            return &srv_ui_assets[i];
    return NULL;
}

/* 1 when the If-None-Match header lists etag (or is "*"). */
static int etag_matches(const srv_request *r, const char *etag)
{
    const char *inm = srv_header(r, "If-None-Match");
    size_t n = strlen(etag);

    if (!inm)
        return 0;
    for (const char *p = inm; *p;) {
        while (*p == ' ' || *p == ',')
            p++;
        if (!strncmp(p, "W/", 2))
            p += 2;
        if (*p == '*' || (!strncmp(p, etag, n) &&
                          (p[n] == '\0' || p[n] == ',' || p[n] == ' ')))
            return 1;
        while (*p && *p != ',')
            p++;
    }
    return 0;
}

static int serve(srv_request *r, const char *path)
{
    const srv_ui_asset *a = find_asset(path);
    struct MHD_Response *resp;
    int rc, fresh;

    if (!a)
        return srv_reply_error(r, 404, NULL, NULL, "not_found",
                               "no such file: %s", path);
    if ((rc = srv_set_header(r, "Content-Security-Policy", UI_CSP)) != 0 ||
        (rc = srv_set_header(r, "X-Content-Type-Options", "nosniff")) != 0 ||
        (rc = srv_set_header(r, "Referrer-Policy", "no-referrer")) != 0 ||
        (rc = srv_set_header(r, "X-Frame-Options", "DENY")) != 0 ||
        (rc = srv_set_header(r, "Cache-Control", "no-cache")) != 0 ||
        (rc = srv_set_header(r, "ETag", a->etag)) != 0)
        return rc;
    fresh = etag_matches(r, a->etag);
    resp = MHD_create_response_from_buffer(fresh ? 0 : a->len, (void *)a->data,
                                           MHD_RESPMEM_PERSISTENT);
    if (!resp)
        return srv_reply_error(r, 500, NULL, NULL, NULL, "out of memory");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, a->ctype);
    return srv__queue(r, fresh ? 304 : 200, resp);
}

static int ui_index(srv_request *r)
{
    return serve(r, "/");
}

static int ui_asset(srv_request *r)
{
    return serve(r, r->path);
}

int srv__ui_routes(srv_router *rt, const loom_server_config *sc)
{
    int rc;

    if (!sc->ui || srv_ui_assets_len == 0)
        return 0;
    if ((rc = srv_route(rt, "GET", "/", ui_index)) != 0 ||
        (rc = srv_route(rt, "GET", "/assets/{path...}", ui_asset)) != 0)
        return rc;
    return 0;
}
