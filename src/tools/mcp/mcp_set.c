/*
 * A set of MCP servers (loom/mcp.h): what a front end keeps to report on
 * the servers a config's tools come from (`/readyz`, `loom mcp list`),
 * failed ones included, since a server that could not start has no
 * tools in the registry to be found through.
 *
 * The set holds a reference on each server. It is filled while the
 * registry is built and only read after, so its array needs no lock; a
 * status takes each server's own lock.
 */
#include "core/error.h"
#include "tools/mcp/mcp_internal.h"

#include <stdlib.h>
#include <string.h>

struct loom_mcp_set {
    loom_mcp_server **items;
    size_t len, cap;
};

int loom_mcp_set_new(loom_mcp_set **out)
{
    if (!(*out = calloc(1, sizeof(**out))))
        return loom__error_oom();
    return 0;
}

void loom_mcp_set_free(loom_mcp_set *set)
{
    if (!set)
        return;
    for (size_t i = 0; i < set->len; i++)
        loom_mcp_server_free(set->items[i]);
    free(set->items);
    free(set);
}

int loom_mcp_set_add(loom_mcp_set *set, loom_mcp_server *s)
{
    if (set->len == set->cap) {
        size_t cap = set->cap ? set->cap * 2 : 8;
        loom_mcp_server **items = realloc(set->items, cap * sizeof(*items));
        if (!items)
            return loom__error_oom();
        set->items = items;
        set->cap = cap;
    }
    loom__mcp_ref(s);
    set->items[set->len++] = s;
    return 0;
}

json_t *loom_mcp_set_status(loom_mcp_set *set)
{
    json_t *a = json_array();

    for (size_t i = 0; a && set && i < set->len; i++)
        if (json_array_append_new(a, loom_mcp_server_status(set->items[i]))) {
            json_decref(a);
            a = NULL;
        }
    return a;
}

size_t loom_mcp_set_len(const loom_mcp_set *set)
{
    return set ? set->len : 0;
}

loom_mcp_server *loom_mcp_set_get(const loom_mcp_set *set, size_t i)
{
    return set && i < set->len ? set->items[i] : NULL;
}

loom_mcp_server *loom_mcp_set_find(const loom_mcp_set *set, const char *name)
{
    for (size_t i = 0; set && name && i < set->len; i++)
        if (strcmp(loom_mcp_server_name(set->items[i]), name) == 0)
            return set->items[i];
    return NULL;
}
