/*
 * The web UI's files (docs/ui.md), embedded in the binary at build time.
 *
 * web/build.mjs writes the table into <build>/ui_assets.c from web/src/
 * and the pinned npm packages the UI uses (marked, DOMPurify); a build
 * with LOOM_WEB_UI off gets an empty table. ui.c serves it.
 */
#ifndef LOOM_SERVER_UI_ASSETS_H
#define LOOM_SERVER_UI_ASSETS_H

#include <stddef.h>

typedef struct {
    const char *path;  /* "/" or "/assets/<name>" */
    const char *ctype; /* its Content-Type */
    const char *etag;  /* a strong ETag, quotes included */
    const unsigned char *data;
    size_t len;
} srv_ui_asset;

extern const srv_ui_asset srv_ui_assets[];
extern const size_t srv_ui_assets_len;

#endif
