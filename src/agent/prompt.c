/*
 * The system prompt a run sends, assembled in the order seed 000 builds
 * it: the agent's prompt (or a request's override), the usage rule of
 * each tool offered, the user's own instructions (their settings), the
 * user's memories, the plan. The conversation
 * summary is not part of it: the context engine shows it as a message of
 * its own right after the system message (context.c), and example
 * exchanges (few_shot) come after both, as messages (run.c).
 *
 * One function makes the whole text from borrowed parts, so the order is
 * written once, and a run that changes a part (the plan, the agent after
 * a handoff) calls it again: run.c keeps the previous text when the new
 * one is the same, since the request cache knows messages by pointer.
 *
 * Rules come from the agent's tool-description registry first, then the
 * tool's settings, and only for the tools offered, so a rule never names
 * a tool the model cannot call. Memories are quoted as JSON strings, as
 * memory_retrieve gives them, so their text stays data.
 */
#include "agent/prompt.h"
#include "core/error.h"
#include "loom/buf.h"

#include <stdlib.h>
#include <string.h>

#define MEMORIES_HEAD                                                          \
    "<memories>\nWhat you know about the user from earlier conversations "     \
    "(saved with memory_store, most recent first; each quoted as it was "      \
    "saved):\n"

#define USER_HEAD                                                              \
    "<user_instructions>\nThe user's own instructions, from their settings "   \
    "(follow them where they do not conflict with the rules above):\n"

const loom_agent_tool_doc *loom__prompt_doc(const loom_agent_tool_doc *docs,
                                            size_t ndocs, const char *name)
{
    for (size_t i = 0; name && i < ndocs; i++)
        if (docs[i].name && strcmp(docs[i].name, name) == 0)
            return &docs[i];
    return NULL;
}

/* A tool's usage rule: the registry's, else its settings'; NULL: none. */
static const char *rule_of(const loom__prompt_parts *p, const char *name)
{
    const loom_agent_tool_doc *d = loom__prompt_doc(p->docs, p->ndocs, name);
    const char *s;

    if (d && d->selection_rule && *d->selection_rule)
        return d->selection_rule;
    s = json_string_value(json_object_get(
        json_object_get(p->tool_settings, name), "selection_rule"));
    return s && *s ? s : NULL;
}

/* Starts a section: a blank line after the one before. */
static int section(loom_buf *b)
{
    return b->len ? loom_buf_puts(b, "\n\n") : 0;
}

static int tool_rules(loom_buf *b, const loom__prompt_parts *p)
{
    int rc = 0, any = 0;

    for (size_t i = 0; !rc && i < p->ntools; i++) {
        const char *rule = rule_of(p, p->tools[i].name);
        if (!rule)
            continue;
        if (!any++ && ((rc = section(b)) != 0 ||
                       (rc = loom_buf_puts(b, "<tool_usage>\n")) != 0))
            break;
        rc = loom_buf_printf(b, "- %s: %s\n", p->tools[i].name, rule);
    }
    if (!rc && any)
        rc = loom_buf_puts(b, "</tool_usage>");
    return rc;
}

int loom__prompt_system_text(char **text, const loom__prompt_parts *p)
{
    loom_buf b = LOOM_BUF_INIT(LOOM__PROMPT_SYSTEM_MAX);
    int rc = 0;

    *text = NULL;
    if (p->base && *p->base)
        rc = loom_buf_puts(&b, p->base);
    if (!rc)
        rc = tool_rules(&b, p);
    if (!rc && p->user_instructions && *p->user_instructions &&
        (rc = section(&b)) == 0)
        rc = loom_buf_printf(&b, USER_HEAD "%s\n</user_instructions>",
                             p->user_instructions);
    if (!rc && p->memories && *p->memories && (rc = section(&b)) == 0)
        rc = loom_buf_puts(&b, p->memories);
    if (!rc && p->plan && (rc = section(&b)) == 0)
        rc = loom__plan_render(p->plan, &b);
    if (rc == LOOM_ETOOLARGE)
        rc = loom__error_set(LOOM_ETOOLARGE,
                             "the system prompt would pass %d MiB",
                             LOOM__PROMPT_SYSTEM_MAX >> 20);
    if (rc || !(*text = loom_buf_detach(&b))) {
        loom_buf_free(&b);
        return rc ? rc : loom__error_oom();
    }
    return 0;
}

int loom__prompt_memories(char **out, const json_t *memories, int64_t total)
{
    /* The quoted memories, their "- " and line ends, the head and note. */
    loom_buf b = LOOM_BUF_INIT(LOOM__PROMPT_MEMORIES_BYTES + 1024);
    const json_t *m;
    size_t i, shown = 0, bytes = 0;
    int64_t left;
    int rc;

    *out = NULL;
    if (!json_array_size(memories))
        return 0;
    rc = loom_buf_puts(&b, MEMORIES_HEAD);
    json_array_foreach(memories, i, m)
    {
        char *q;
        size_t len;
        if (rc || shown == LOOM__PROMPT_MEMORIES_MAX)
            break;
        if (!json_is_string(json_object_get(m, "content")))
            continue;
        if (!(q = json_dumps(json_object_get(m, "content"),
                             JSON_ENCODE_ANY | JSON_COMPACT))) {
            rc = loom__error_oom();
            break;
        }
        len = strlen(q);
        /* The newest that fit; one too long ends the list rather than
         * let an older one take its place. */
        if (bytes + len > LOOM__PROMPT_MEMORIES_BYTES) {
            free(q);
            break;
        }
        bytes += len;
        shown++;
        rc = loom_buf_printf(&b, "- %s\n", q);
        free(q);
    }
    left = total - (int64_t)shown;
    if (!rc && left > 0)
        rc = loom_buf_printf(&b,
                             "(%lld more memor%s not shown here; "
                             "memory_retrieve finds them.)\n",
                             (long long)left, left == 1 ? "y is" : "ies are");
    if (!rc)
        rc = loom_buf_puts(&b, "</memories>");
    if (rc || !(*out = loom_buf_detach(&b))) {
        loom_buf_free(&b);
        return rc ? rc : loom__error_oom();
    }
    return 0;
}
