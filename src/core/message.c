/*
 * Conversation messages and usage arithmetic (loom/message.h): the small
 * owned data structures that every provider adapter, the run loop, the
 * store and the tokenizer share.
 */
#include "loom/message.h"
#include "core/error.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char *const role_names[] = {"system", "user", "assistant", "tool"};

const char *loom_role_name(loom_role role)
{
    return (unsigned)role < 4 ? role_names[role] : "user";
}

static int dup_opt(char **dst, const char *src)
{
    *dst = NULL;
    if (src && !(*dst = strdup(src)))
        return loom__error_oom();
    return 0;
}

/* Room for n more messages. A list starts small (a run's often holds
 * one or two for as long as it streams) and doubles. */
static int reserve(loom_messages *m, size_t n)
{
    loom_message *p;
    size_t cap;

    if (n <= m->cap - m->len)
        return 0;
    if (n > SIZE_MAX / 2 / sizeof(*p) - m->len)
        return loom__error_oom();
    cap = m->cap ? m->cap * 2 : 2;
    while (cap < m->len + n)
        cap *= 2;
    p = realloc(m->items, cap * sizeof(*p));
    if (!p)
        return loom__error_oom();
    m->items = p;
    m->cap = cap;
    return 0;
}

void loom_tool_call_clear(loom_tool_call *c)
{
    free(c->id);
    free(c->name);
    free(c->arguments);
    c->id = c->name = c->arguments = NULL;
}

void loom_part_clear(loom_part *part)
{
    free(part->text);
    free(part->url);
    free(part->data);
    free(part->mime);
    free(part->detail);
    free(part->filename);
    memset(part, 0, sizeof(*part));
}

int loom_part_copy(loom_part *dst, const loom_part *src)
{
    memset(dst, 0, sizeof(*dst));
    dst->kind = src->kind;
    if (dup_opt(&dst->text, src->text) || dup_opt(&dst->url, src->url) ||
        dup_opt(&dst->data, src->data) || dup_opt(&dst->mime, src->mime) ||
        dup_opt(&dst->detail, src->detail) ||
        dup_opt(&dst->filename, src->filename)) {
        loom_part_clear(dst);
        return LOOM_ENOMEM;
    }
    return 0;
}

size_t loom_part_data_size(const loom_part *part)
{
    size_t n = part->data ? strlen(part->data) : 0;

    while (n && (part->data[n - 1] == '=' || part->data[n - 1] == '\n' ||
                 part->data[n - 1] == '\r'))
        n--;
    /* Every 4 characters are 3 bytes; 2 and 3 left over are 1 and 2. */
    return n / 4 * 3 + (n % 4 ? n % 4 - 1 : 0);
}

int loom_message_has_media(const loom_message *msg)
{
    for (size_t i = 0; i < msg->parts_len; i++)
        if (msg->parts[i].kind != LOOM_PART_TEXT)
            return 1;
    return 0;
}

static void clear_parts(loom_message *msg)
{
    for (size_t i = 0; i < msg->parts_len; i++)
        loom_part_clear(&msg->parts[i]);
    free(msg->parts);
    msg->parts = NULL;
    msg->parts_len = 0;
}

static int copy_parts(loom_message *msg, const loom_part *parts, size_t n)
{
    if (!n)
        return 0;
    msg->parts = calloc(n, sizeof(*parts));
    if (!msg->parts)
        return loom__error_oom();
    for (size_t i = 0; i < n; i++) {
        if (loom_part_copy(&msg->parts[i], &parts[i]))
            return LOOM_ENOMEM;
        msg->parts_len = i + 1;
    }
    return 0;
}

void loom_message_clear(loom_message *msg)
{
    clear_parts(msg);
    free(msg->content);
    free(msg->reasoning);
    for (size_t i = 0; i < msg->tool_calls_len; i++)
        loom_tool_call_clear(&msg->tool_calls[i]);
    free(msg->tool_calls);
    free(msg->tool_call_id);
    free(msg->name);
    free(msg->provider_state);
    free(msg->summary);
    memset(msg, 0, sizeof(*msg));
}

static int copy_calls(loom_message *msg, const loom_tool_call *calls, size_t n)
{
    if (!n)
        return 0;
    msg->tool_calls = calloc(n, sizeof(*calls));
    if (!msg->tool_calls)
        return loom__error_oom();
    for (size_t i = 0; i < n; i++) {
        msg->tool_calls_len = i + 1;
        if (dup_opt(&msg->tool_calls[i].id, calls[i].id) ||
            dup_opt(&msg->tool_calls[i].name, calls[i].name) ||
            dup_opt(&msg->tool_calls[i].arguments,
                    calls[i].arguments ? calls[i].arguments : "{}"))
            return LOOM_ENOMEM;
    }
    return 0;
}

static int message_copy(loom_message *dst, const loom_message *src)
{
    memset(dst, 0, sizeof(*dst));
    dst->role = src->role;
    if (dup_opt(&dst->content, src->content) ||
        dup_opt(&dst->reasoning, src->reasoning) ||
        dup_opt(&dst->tool_call_id, src->tool_call_id) ||
        dup_opt(&dst->name, src->name) ||
        dup_opt(&dst->provider_state, src->provider_state) ||
        dup_opt(&dst->summary, src->summary) ||
        copy_calls(dst, src->tool_calls, src->tool_calls_len) ||
        copy_parts(dst, src->parts, src->parts_len)) {
        loom_message_clear(dst);
        return LOOM_ENOMEM;
    }
    return 0;
}

int loom_messages_add(loom_messages *m, loom_role role, const char *content)
{
    loom_message msg = {0};

    msg.role = role;
    msg.content = (char *)content;
    return loom_messages_append(
        m, &(loom_messages){.items = &msg, .len = 1, .cap = 1});
}

/* The text parts of parts joined by newlines, or NULL when none. */
static int join_text(char **out, const loom_part *parts, size_t n)
{
    size_t len = 0, at = 0;
    int any = 0;

    *out = NULL;
    for (size_t i = 0; i < n; i++)
        if (parts[i].kind == LOOM_PART_TEXT && parts[i].text) {
            len += strlen(parts[i].text) + 1;
            any = 1;
        }
    if (!any)
        return 0;
    if (!(*out = malloc(len)))
        return loom__error_oom();
    for (size_t i = 0; i < n; i++) {
        size_t k;
        if (parts[i].kind != LOOM_PART_TEXT || !parts[i].text)
            continue;
        if (at)
            (*out)[at++] = '\n';
        k = strlen(parts[i].text);
        memcpy(*out + at, parts[i].text, k);
        at += k;
    }
    (*out)[at] = '\0';
    return 0;
}

int loom_messages_add_parts(loom_messages *m, loom_role role,
                            const loom_part *parts, size_t n)
{
    loom_message msg = {0};
    int rc;

    msg.role = role;
    if ((rc = join_text(&msg.content, parts, n)) != 0)
        return rc;
    if (loom_message_has_media(
            &(loom_message){.parts = (loom_part *)parts, .parts_len = n})) {
        msg.parts = (loom_part *)parts;
        msg.parts_len = n;
    }
    rc = loom_messages_append(
        m, &(loom_messages){.items = &msg, .len = 1, .cap = 1});
    free(msg.content);
    return rc;
}

int loom_messages_add_tool_result(loom_messages *m, const char *call_id,
                                  const char *name, const char *content)
{
    loom_message msg = {0};

    msg.role = LOOM_ROLE_TOOL;
    msg.content = (char *)content;
    msg.tool_call_id = (char *)call_id;
    msg.name = (char *)name;
    return loom_messages_append(
        m, &(loom_messages){.items = &msg, .len = 1, .cap = 1});
}

int loom_messages_add_assistant(loom_messages *m, const char *content,
                                const char *reasoning,
                                const loom_tool_call *calls, size_t ncalls)
{
    loom_message msg = {0};

    msg.role = LOOM_ROLE_ASSISTANT;
    msg.content = (char *)content;
    msg.reasoning = (char *)reasoning;
    msg.tool_calls = (loom_tool_call *)calls;
    msg.tool_calls_len = ncalls;
    return loom_messages_append(
        m, &(loom_messages){.items = &msg, .len = 1, .cap = 1});
}

int loom_messages_append(loom_messages *dst, const loom_messages *src)
{
    int rc = reserve(dst, src->len);

    for (size_t i = 0; !rc && i < src->len; i++)
        if ((rc = message_copy(&dst->items[dst->len], &src->items[i])) == 0)
            dst->len++;
    return rc;
}

void loom_messages_free(loom_messages *m)
{
    for (size_t i = 0; i < m->len; i++)
        loom_message_clear(&m->items[i]);
    free(m->items);
    m->items = NULL;
    m->len = m->cap = 0;
}

void loom_usage_add(loom_usage *a, const loom_usage *b)
{
    a->prompt_tokens += b->prompt_tokens;
    a->completion_tokens += b->completion_tokens;
    a->cached_tokens += b->cached_tokens;
    a->reasoning_tokens += b->reasoning_tokens;
    a->total_tokens += b->total_tokens;
    a->cache_write_tokens += b->cache_write_tokens;
    a->cost_micros += b->cost_micros;
}
