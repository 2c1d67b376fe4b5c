/*
 * The tool registry: tools in the order they were added, plus a name index.
 *
 * A registry is built once at start and then read on every model turn (to
 * list tools for the request) and on every tool call (to find the tool by
 * name), so it is shaped for reading: an array of tool pointers keeps the
 * insertion order and stable addresses for the borrowed pointers that
 * get/at hand out, and a small open-addressing hash table of array indexes
 * (linear probing, kept at most half full) answers lookups by name. Writes
 * are rare, so remove simply compacts the array and rebuilds the index.
 *
 * The registry owns copies of each tool's name and description, a
 * reference to its parameters schema, and its payload (freed through
 * free_payload when the tool leaves the registry).
 *
 * A registry is reference counted: its creator holds one reference, and
 * every tool call a run starts holds another until its thread ends (a
 * call abandoned at its timeout may outlive the run and the caller's
 * reference). loom_tool_registry_free drops one; the last frees it.
 */
#include "tools/registry.h"
#include "core/error.h"
#include "core/text.h"
#include "loom/tools.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct loom_tool_registry {
    loom_tool **items; /* owned tools, in insertion order */
    size_t len;
    size_t cap;
    size_t *slots;     /* index + 1 into items, 0 for an empty slot */
    size_t nslots;     /* a power of two, >= 2 * len, or 0 */
    atomic_size_t refs; /* the creator's, plus one per running call */
};

int loom_tool_registry_new(loom_tool_registry **out)
{
    loom_tool_registry *reg;

    if (!out)
        return loom__error_set(LOOM_EINVALID, "out must not be NULL");
    *out = NULL;
    reg = calloc(1, sizeof(*reg));
    if (!reg)
        return loom__error_oom();
    atomic_init(&reg->refs, 1);
    *out = reg;
    return 0;
}

loom_tool_registry *loom__tool_registry_ref(const loom_tool_registry *reg)
{
    loom_tool_registry *r = (loom_tool_registry *)reg;

    if (r)
        atomic_fetch_add_explicit(&r->refs, 1, memory_order_relaxed);
    return r;
}

/* FNV-1a: short names, few entries; anything reasonable will do. */
static size_t hash_name(const char *s)
{
    uint64_t h = 1469598103934665603ULL;

    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return (size_t)h;
}

/* The slot holding name, or the empty slot where it would go. */
static size_t find_slot(const loom_tool_registry *reg, const char *name)
{
    size_t mask = reg->nslots - 1;
    size_t i = hash_name(name) & mask;

    while (reg->slots[i] &&
           strcmp(reg->items[reg->slots[i] - 1]->name, name) != 0)
        i = (i + 1) & mask;
    return i;
}

/* Rebuilds the index with room for at least want tools. */
static int rebuild_index(loom_tool_registry *reg, size_t want)
{
    size_t n = 8, *slots;

    while (n < want * 2)
        n *= 2;
    slots = calloc(n, sizeof(*slots));
    if (!slots)
        return loom__error_oom();
    free(reg->slots);
    reg->slots = slots;
    reg->nslots = n;
    for (size_t i = 0; i < reg->len; i++)
        reg->slots[find_slot(reg, reg->items[i]->name)] = i + 1;
    return 0;
}

/* Frees the registry's copy of a tool, payload included. */
static void tool_free(loom_tool *t)
{
    if (!t)
        return;
    free((char *)t->name);
    free((char *)t->description);
    json_decref((json_t *)t->parameters);
    if (t->free_payload)
        t->free_payload(t->payload);
    free(t);
}

int loom_tool_registry_add(loom_tool_registry *reg, const loom_tool *tool)
{
    loom_tool *copy = NULL;
    int rc = 0;

    if (!reg || !tool)
        return loom__error_set(LOOM_EINVALID, "registry and tool are required");
    if (tool->version != 0 && tool->version != LOOM_TOOL_VERSION)
        return loom__error_set(LOOM_EINVALID,
                               "tool '%.80s': unknown version %u (this loom "
                               "knows %d)",
                               tool->name ? tool->name : "(null)",
                               tool->version, LOOM_TOOL_VERSION);
    if (!tool->name || !loom__text_is_name(tool->name, 0))
        return loom__error_set(LOOM_EINVALID,
                               "invalid tool name '%.80s': use 1 to 64 "
                               "letters, digits, '_' or '-'",
                               tool->name ? tool->name : "(null)");
    if (!tool->execute)
        return loom__error_set(LOOM_EINVALID,
                               "tool '%s' has no execute function",
                               tool->name);
    if (tool->parameters && !json_is_object(tool->parameters))
        return loom__error_set(LOOM_EINVALID,
                               "tool '%s': parameters must be a JSON Schema "
                               "object", tool->name);
    if (loom_tool_registry_get(reg, tool->name))
        return loom__error_set(LOOM_EEXISTS,
                               "tool '%s' is already registered", tool->name);

    /* Make room first so that nothing can fail after the copy exists. */
    if (reg->len == reg->cap) {
        size_t cap = reg->cap ? reg->cap * 2 : 8;
        loom_tool **items = realloc(reg->items, cap * sizeof(*items));

        if (!items)
            return loom__error_oom();
        reg->items = items;
        reg->cap = cap;
    }
    if ((reg->len + 1) * 2 > reg->nslots &&
        (rc = rebuild_index(reg, reg->len + 1)) != 0)
        return rc;

    copy = calloc(1, sizeof(*copy));
    if (!copy)
        return loom__error_oom();
    copy->name = strdup(tool->name);
    copy->description = strdup(tool->description ? tool->description : "");
    if (!copy->name || !copy->description) {
        rc = loom__error_oom();
        goto cleanup;
    }
    copy->execute = tool->execute;
    if (tool->parameters)
        copy->parameters = json_incref((json_t *)tool->parameters);
    /* Ownership of the payload passes only on success. */
    copy->payload = tool->payload;
    copy->free_payload = tool->free_payload;
    copy->should_use = tool->should_use;

    reg->items[reg->len++] = copy;
    reg->slots[find_slot(reg, copy->name)] = reg->len;
    copy = NULL;

cleanup:
    if (copy) {
        free((char *)copy->name);
        free((char *)copy->description);
        free(copy);
    }
    return rc;
}

const loom_tool *loom_tool_registry_get(const loom_tool_registry *reg,
                                        const char *name)
{
    size_t slot;

    if (!reg || !name || reg->len == 0)
        return NULL;
    slot = find_slot(reg, name);
    return reg->slots[slot] ? reg->items[reg->slots[slot] - 1] : NULL;
}

int loom_tool_registry_remove(loom_tool_registry *reg, const char *name)
{
    size_t slot, i;
    loom_tool *t;

    if (!reg || !name)
        return loom__error_set(LOOM_EINVALID, "registry and name are required");
    if (reg->len == 0 || !reg->slots[slot = find_slot(reg, name)])
        return loom__error_set(LOOM_ENOTFOUND, "no tool named '%.80s'", name);
    i = reg->slots[slot] - 1;
    t = reg->items[i];
    memmove(&reg->items[i], &reg->items[i + 1],
            (reg->len - i - 1) * sizeof(*reg->items));
    reg->len--;
    /*
     * Rebuilding into a table of the same size cannot fail for want of
     * memory if we reuse it, so clear and refill it in place rather than
     * calling rebuild_index (which allocates).
     */
    memset(reg->slots, 0, reg->nslots * sizeof(*reg->slots));
    for (size_t j = 0; j < reg->len; j++)
        reg->slots[find_slot(reg, reg->items[j]->name)] = j + 1;
    tool_free(t);
    return 0;
}

size_t loom_tool_registry_count(const loom_tool_registry *reg)
{
    return reg ? reg->len : 0;
}

const loom_tool *loom_tool_registry_at(const loom_tool_registry *reg,
                                       size_t i)
{
    return reg && i < reg->len ? reg->items[i] : NULL;
}

void loom_tool_registry_clear(loom_tool_registry *reg)
{
    if (!reg)
        return;
    for (size_t i = 0; i < reg->len; i++)
        tool_free(reg->items[i]);
    reg->len = 0;
    if (reg->slots)
        memset(reg->slots, 0, reg->nslots * sizeof(*reg->slots));
}

char *loom_tool_registry_names(const loom_tool_registry *reg)
{
    size_t total = 1;
    char *s, *p;

    for (size_t i = 0; reg && i < reg->len; i++)
        total += strlen(reg->items[i]->name) + (i ? 2 : 0);
    s = malloc(total);
    if (!s) {
        loom__error_oom();
        return NULL;
    }
    p = s;
    for (size_t i = 0; reg && i < reg->len; i++) {
        size_t n = strlen(reg->items[i]->name);

        if (i) {
            memcpy(p, ", ", 2);
            p += 2;
        }
        memcpy(p, reg->items[i]->name, n);
        p += n;
    }
    *p = '\0';
    return s;
}

void loom_tool_registry_free(loom_tool_registry *reg)
{
    /* Acquire-release: whoever frees sees every other holder's writes. */
    if (!reg ||
        atomic_fetch_sub_explicit(&reg->refs, 1, memory_order_acq_rel) != 1)
        return;
    loom_tool_registry_clear(reg);
    free(reg->items);
    free(reg->slots);
    free(reg);
}
