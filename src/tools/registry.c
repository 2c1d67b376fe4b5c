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
 *
 * Tools whose list changes while loom runs (an MCP server's, which starts
 * in the background and may say its list changed) come from sources
 * (tools/registry.h). A registry with sources is never read by a run as
 * it is: a snapshot of it is, a registry of its own that shares the
 * fixed tools (each tool is reference counted, so a tool may sit in many
 * registries) and adds each source's current tools. A snapshot records
 * the sources' generation it was built at, so a run can tell when to
 * take another. A registry without sources is its own snapshot.
 */
#include "tools/registry.h"
#include "core/error.h"
#include "core/text.h"
#include "loom/tools.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* A tool as the registries hold it: shared by every registry it is in. */
typedef struct {
    loom_tool tool;     /* first: items point here */
    atomic_size_t refs; /* one per registry holding it */
} entry;

/* A source, shared by the registries it was carried into. */
typedef struct {
    loom__tool_source src;
    char *prefix;
    atomic_size_t refs;
} source;

struct loom_tool_registry {
    loom_tool **items; /* tools (entries) held, in insertion order */
    size_t len;
    size_t cap;
    size_t *slots;     /* index + 1 into items, 0 for an empty slot */
    size_t nslots;     /* a power of two, >= 2 * len, or 0 */
    atomic_size_t refs; /* the creator's, plus one per running call */
    source **sources;   /* held references, in the order added */
    size_t nsources;
    uint64_t built_at; /* a snapshot's: the sources' generation then */
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

/* Drops a registry's hold on a tool; the last frees it, payload
 * included. */
static void tool_free(loom_tool *t)
{
    entry *e = (entry *)t;

    if (!t || atomic_fetch_sub_explicit(&e->refs, 1, memory_order_acq_rel) != 1)
        return;
    free((char *)t->name);
    free((char *)t->description);
    json_decref((json_t *)t->parameters);
    if (t->free_payload)
        t->free_payload(t->payload);
    free(t);
}

/* Makes room for one more tool: after it, adding cannot fail. */
static int reserve_one(loom_tool_registry *reg)
{
    if (reg->len == reg->cap) {
        size_t cap = reg->cap ? reg->cap * 2 : 8;
        loom_tool **items = realloc(reg->items, cap * sizeof(*items));

        if (!items)
            return loom__error_oom();
        reg->items = items;
        reg->cap = cap;
    }
    if ((reg->len + 1) * 2 > reg->nslots)
        return rebuild_index(reg, reg->len + 1);
    return 0;
}

/* Puts a tool (an entry the registry now holds) last. Room is made. */
static void put(loom_tool_registry *reg, loom_tool *t)
{
    reg->items[reg->len++] = t;
    reg->slots[find_slot(reg, t->name)] = reg->len;
}

int loom_tool_registry_add(loom_tool_registry *reg, const loom_tool *tool)
{
    entry *e = NULL;
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
    if ((rc = reserve_one(reg)) != 0)
        return rc;

    if (!(e = calloc(1, sizeof(*e))))
        return loom__error_oom();
    atomic_init(&e->refs, 1);
    copy = &e->tool;
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

    put(reg, copy);
    copy = NULL;

cleanup:
    if (copy) {
        free((char *)copy->name);
        free((char *)copy->description);
        free(e);
    }
    return rc;
}

int loom__tool_registry_share(loom_tool_registry *reg, const loom_tool *tool)
{
    entry *e = (entry *)tool;
    int rc;

    if (loom_tool_registry_get(reg, tool->name))
        return loom__error_set(LOOM_EEXISTS, "tool '%s' is already registered",
                               tool->name);
    if ((rc = reserve_one(reg)) != 0)
        return rc;
    atomic_fetch_add_explicit(&e->refs, 1, memory_order_relaxed);
    put(reg, (loom_tool *)tool);
    return 0;
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

static void source_free(source *s)
{
    if (!s || atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) != 1)
        return;
    if (s->src.free)
        s->src.free(s->src.arg);
    free(s->prefix);
    free(s);
}

void loom_tool_registry_free(loom_tool_registry *reg)
{
    /* Acquire-release: whoever frees sees every other holder's writes. */
    if (!reg ||
        atomic_fetch_sub_explicit(&reg->refs, 1, memory_order_acq_rel) != 1)
        return;
    loom_tool_registry_clear(reg);
    for (size_t i = 0; i < reg->nsources; i++)
        source_free(reg->sources[i]);
    free(reg->sources);
    free(reg->items);
    free(reg->slots);
    free(reg);
}

/* ---- sources and snapshots ---------------------------------------------- */

/* Holds one more reference on s in reg. */
static int hold_source(loom_tool_registry *reg, source *s)
{
    source **more = realloc(reg->sources, (reg->nsources + 1) * sizeof(*more));

    if (!more)
        return loom__error_oom();
    reg->sources = more;
    atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    reg->sources[reg->nsources++] = s;
    return 0;
}

int loom__tool_registry_add_source(loom_tool_registry *reg,
                                   const loom__tool_source *src)
{
    source *s;
    int rc;

    if (!reg || !src || !src->add || !src->generation || !src->prefix ||
        !*src->prefix)
        return loom__error_set(LOOM_EINVALID,
                               "a tool source needs add, generation and a "
                               "prefix");
    if (!(s = calloc(1, sizeof(*s))) || !(s->prefix = strdup(src->prefix))) {
        free(s);
        return loom__error_oom();
    }
    s->src = *src;
    s->src.prefix = s->prefix;
    atomic_init(&s->refs, 0);
    if ((rc = hold_source(reg, s)) != 0) {
        free(s->prefix);
        free(s);
    }
    return rc;
}

int loom__tool_registry_carry_sources(loom_tool_registry *dst,
                                      const loom_tool_registry *src)
{
    int rc;

    for (size_t i = 0; src && i < src->nsources; i++)
        if ((rc = hold_source(dst, src->sources[i])) != 0)
            return rc;
    return 0;
}

size_t loom__tool_registry_source_count(const loom_tool_registry *reg)
{
    return reg ? reg->nsources : 0;
}

const char *loom__tool_registry_source_prefix(const loom_tool_registry *reg,
                                              size_t i)
{
    return reg && i < reg->nsources ? reg->sources[i]->prefix : NULL;
}

/* Whether name (or a pattern `p*`) may stand for tools of prefix. */
static int claims(const char *prefix, const char *name)
{
    size_t n = strlen(name), p = strlen(prefix);

    if (n > 1 && name[n - 1] == '*')
        return strncmp(name, prefix, (n - 1 < p ? n - 1 : p)) == 0;
    return n > p && strncmp(name, prefix, p) == 0;
}

int loom_tool_registry_claims(const loom_tool_registry *reg, const char *name)
{
    for (size_t i = 0; reg && name && i < reg->nsources; i++)
        if (claims(reg->sources[i]->prefix, name))
            return 1;
    return 0;
}

uint64_t loom__tool_registry_generation(const loom_tool_registry *reg)
{
    uint64_t g = 0;

    for (size_t i = 0; reg && i < reg->nsources; i++)
        g += reg->sources[i]->src.generation(reg->sources[i]->src.arg);
    return g;
}

uint64_t loom__tool_registry_built_at(const loom_tool_registry *snap)
{
    return snap ? snap->built_at : 0;
}

/* Whether the tools named (names, n; NULL: all) need source s. */
static int needed(const source *s, const char *const *names, size_t n)
{
    if (!names)
        return 1;
    for (size_t i = 0; i < n; i++)
        if (claims(s->prefix, names[i]))
            return 1;
    return 0;
}

int loom__tool_registry_snapshot(loom_tool_registry **out,
                                 const loom_tool_registry *reg,
                                 const char *const *names, size_t n)
{
    loom_tool_registry *snap = NULL;
    int rc;

    *out = NULL;
    if (!reg)
        return 0;
    if (!reg->nsources) {
        *out = loom__tool_registry_ref(reg);
        return 0;
    }
    if ((rc = loom_tool_registry_new(&snap)) != 0)
        return rc;
    /* Read first: a change while the sources list is seen next time. */
    snap->built_at = loom__tool_registry_generation(reg);
    for (size_t i = 0; i < reg->len && rc == 0; i++)
        rc = loom__tool_registry_share(snap, reg->items[i]);
    for (size_t i = 0; i < reg->nsources && rc == 0; i++) {
        const loom__tool_source *s = &reg->sources[i]->src;
        rc = s->add(s->arg, snap, needed(reg->sources[i], names, n));
    }
    if (rc != 0) {
        loom_tool_registry_free(snap);
        return rc;
    }
    *out = snap;
    return 0;
}

int loom_tool_registry_snapshot(loom_tool_registry **out,
                                const loom_tool_registry *reg)
{
    if (!out)
        return loom__error_set(LOOM_EINVALID, "out must not be NULL");
    return loom__tool_registry_snapshot(out, reg, NULL, 0);
}
