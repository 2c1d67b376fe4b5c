/*
 * What the MCP client adds around its messages in the 2026-07-28
 * (stateless) era, and what it checks of tools and elicitations:
 *
 * - the `_meta` every request carries (protocol version, client info and
 *   capabilities), since there is no handshake to say it once;
 * - the standard HTTP headers of a request (Mcp-Method, Mcp-Name) and the
 *   custom ones a tool asks for with `x-mcp-header` on a parameter
 *   (Mcp-Param-<Name>, the value Base64-encoded when it is not plain
 *   printable ASCII);
 * - the checks of those annotations (a tool with a bad one is not
 *   offered), and the defaults of an elicitation's schema filled into an
 *   accepted answer.
 */
#include "core/error.h"
#include "loom/log.h"
#include "tools/mcp/mcp_internal.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

json_t *loom__mcp_meta(const char *version, const json_t *caps)
{
    return json_pack("{s:s,s:{s:s,s:s},s:O}",
                     "io.modelcontextprotocol/protocolVersion", version,
                     "io.modelcontextprotocol/clientInfo", "name", "loom",
                     "version", loom_version(),
                     "io.modelcontextprotocol/clientCapabilities", caps);
}

/* A header name as RFC 9110 allows it (a token). */
static int token_name(const char *n)
{
    static const char extra[] = "!#$%&'*+-.^_`|~";

    if (!*n)
        return 0;
    for (const unsigned char *p = (const unsigned char *)n; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
              (*p >= '0' && *p <= '9') || (*p && strchr(extra, *p))))
            return 0;
    return 1;
}

static int primitive_type(const json_t *type)
{
    static const char *const ok[] = {"string", "integer", "boolean", NULL};
    const char *t = json_string_value(type);

    for (size_t i = 0; t && ok[i]; i++)
        if (strcmp(t, ok[i]) == 0)
            return 1;
    return 0;
}

int loom__mcp_tool_headers(const json_t *tool, json_t **map, char *why,
                           size_t cap)
{
    const json_t *props =
        json_object_get(json_object_get(tool, "inputSchema"), "properties");
    const char *param;
    const json_t *p;
    json_t *m = NULL;

    *map = NULL;
    json_object_foreach((json_t *)props, param, p)
    {
        const json_t *h = json_object_get(p, "x-mcp-header");
        const char *name, *seen;
        const json_t *other;

        if (!h)
            continue;
        if (!m && !(m = json_object()))
            return loom__error_oom();
        name = json_string_value(h);
        if (!name || !*name || !token_name(name)) {
            snprintf(why, cap,
                     "parameter '%.60s': x-mcp-header must be a header "
                     "name (letters, digits, !#$%%&'*+-.^_`|~)",
                     param);
            goto bad;
        }
        if (!primitive_type(json_object_get(p, "type"))) {
            snprintf(why, cap,
                     "parameter '%.60s': x-mcp-header is only for a "
                     "string, number, integer or boolean",
                     param);
            goto bad;
        }
        json_object_foreach(m, seen, other)
        {
            if (strcasecmp(json_string_value(other), name) == 0) {
                snprintf(why, cap,
                         "parameters '%.60s' and '%.60s' both use the "
                         "header '%.60s'",
                         seen, param, name);
                goto bad;
            }
        }
        if (json_object_set_new(m, param, json_string(name)) != 0) {
            json_decref(m);
            return loom__error_oom();
        }
    }
    *map = m;
    return 0;

bad:
    json_decref(m);
    return LOOM_EINVALID;
}

/* A string that must travel Base64-encoded in a header. */
static int needs_base64(const char *v, size_t n)
{
    if (n && (v[0] == ' ' || v[n - 1] == ' '))
        return 1;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)v[i] < 0x20 || (unsigned char)v[i] > 0x7e)
            return 1;
    return 0;
}

/* The header text of a parameter's value, or NULL (omitted, or OOM). */
static char *header_value(const json_t *v)
{
    char *out;

    if (json_is_boolean(v))
        return strdup(json_is_true(v) ? "true" : "false");
    if (json_is_number(v))
        return json_dumps(v, JSON_ENCODE_ANY | JSON_REAL_PRECISION(17));
    if (!json_is_string(v))
        return NULL;
    if (!needs_base64(json_string_value(v), json_string_length(v)))
        return strdup(json_string_value(v));
    if (!(out = malloc(4 * (json_string_length(v) / 3 + 1) + 16)))
        return NULL;
    memcpy(out, "=?base64?", 9);
    int n = EVP_EncodeBlock((unsigned char *)out + 9,
                            (const unsigned char *)json_string_value(v),
                            (int)json_string_length(v));
    memcpy(out + 9 + n, "?=", 3);
    return out;
}

int loom__mcp_add_param_headers(json_t *headers, const json_t *map,
                                const json_t *args)
{
    const char *param;
    const json_t *h;
    char name[128];

    json_object_foreach((json_t *)map, param, h)
    {
        char *v = header_value(json_object_get(args, param));
        int rc;

        if (!v)
            continue;
        snprintf(name, sizeof(name), "Mcp-Param-%s", json_string_value(h));
        rc = json_object_set_new(headers, name, json_string(v));
        free(v);
        if (rc != 0)
            return loom__error_oom();
    }
    return 0;
}

int loom__mcp_apply_defaults(const json_t *schema, json_t *content)
{
    const json_t *props = json_object_get(schema, "properties");
    const char *key;
    const json_t *p;

    json_object_foreach((json_t *)props, key, p)
    {
        const json_t *d = json_object_get(p, "default");
        if (d && !json_object_get(content, key) &&
            json_object_set(content, key, (json_t *)d) != 0)
            return loom__error_oom();
    }
    return 0;
}
