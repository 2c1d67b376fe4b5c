/*
 * `loom chat`'s line parsing, cost sum and history path (chat_line.h):
 * no I/O here, so each rule is a unit test away.
 */
#include "cli/chat_line.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char chat_help[] =
    "/new              start a new conversation\n"
    "/agent [NAME]     use the agent NAME (without NAME: show it)\n"
    "/model [NAME]     use the model NAME (without NAME: show it)\n"
    "/cost             this conversation's tokens and cost\n"
    "/research QUESTION  research a question: a cited report\n"
    "/help             this help\n"
    "/exit             leave (also Ctrl-D, or Ctrl-C at an empty prompt)\n"
    "Ctrl-C during an answer stops it. //text sends \"/text\".\n";

static int blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* The commands: name, verb, and whether the argument is none (0),
 * optional (1) or required (2). */
static const struct {
    const char *name;
    chat_verb verb;
    int arg;
} commands[] = {
    {"new", CHAT_NEW, 0},           {"agent", CHAT_AGENT, 1},
    {"model", CHAT_MODEL, 1},       {"cost", CHAT_COST, 0},
    {"research", CHAT_RESEARCH, 2}, {"help", CHAT_HELP, 0},
    {"exit", CHAT_EXIT, 0},         {"quit", CHAT_EXIT, 0},
};

void chat_parse(const char *line, chat_command *out)
{
    const char *s = line, *e = line + strlen(line), *name, *name_end;

    memset(out, 0, sizeof(*out));
    while (s < e && blank(*s))
        s++;
    while (e > s && blank(e[-1]))
        e--;
    out->arg = s;
    out->arg_len = (size_t)(e - s);
    if (s == e) {
        out->verb = CHAT_EMPTY;
        return;
    }
    if (*s != '/') {
        out->verb = CHAT_SAY;
        return;
    }
    if (s[1] == '/') {
        out->verb = CHAT_SAY;
        out->arg = s + 1;
        out->arg_len--;
        return;
    }
    name = s + 1;
    for (name_end = name; name_end < e && !blank(*name_end); name_end++)
        ;
    out->arg = name_end;
    while (out->arg < e && blank(*out->arg))
        out->arg++;
    out->arg_len = (size_t)(e - out->arg);
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        size_t n = strlen(commands[i].name);
        if ((size_t)(name_end - name) != n ||
            strncmp(name, commands[i].name, n) != 0)
            continue;
        out->verb = commands[i].verb;
        if (commands[i].arg == 0 && out->arg_len) {
            out->verb = CHAT_BAD;
            out->error = "this command takes no argument";
        } else if (commands[i].arg == 2 && !out->arg_len) {
            out->verb = CHAT_BAD;
            out->error = "this command needs an argument";
        }
        return;
    }
    out->verb = CHAT_UNKNOWN;
    out->arg = s;
    out->arg_len = (size_t)(name_end - s);
}

static long long field(const json_t *row, const char *key)
{
    return json_integer_value(json_object_get(row, key));
}

void chat_cost_add(chat_cost *c, const json_t *usage)
{
    size_t i;
    const json_t *row;

    json_array_foreach(usage, i, row)
    {
        const json_t *cost = json_object_get(row, "cost_micros");
        c->calls++;
        c->prompt += field(row, "prompt_tokens");
        c->completion += field(row, "completion_tokens");
        c->cached += field(row, "cached_tokens");
        c->reasoning += field(row, "reasoning_tokens");
        c->total += field(row, "total_tokens");
        if (json_is_integer(cost)) {
            c->cost_micros += json_integer_value(cost);
            c->priced++;
        }
    }
}

void chat_cost_format(const chat_cost *c, char *buf, size_t cap)
{
    size_t n = 0;
    int k;

#define PUT(...)                                                               \
    do {                                                                       \
        k = snprintf(buf + n, cap - n, __VA_ARGS__);                           \
        if (k < 0 || (size_t)k >= cap - n)                                     \
            return;                                                            \
        n += (size_t)k;                                                        \
    } while (0)
    if (!cap)
        return;
    buf[0] = '\0';
    PUT("%lld model call%s, %lld tokens (%lld prompt, %lld completion",
        c->calls, c->calls == 1 ? "" : "s", c->total, c->prompt, c->completion);
    if (c->cached)
        PUT(", %lld cached", c->cached);
    if (c->reasoning)
        PUT(", %lld reasoning", c->reasoning);
    if (c->calls && c->priced == c->calls)
        PUT("), $%lld.%06lld", c->cost_micros / 1000000,
            c->cost_micros % 1000000);
    else
        PUT("), cost unknown (%lld of %lld calls priced)", c->priced, c->calls);
#undef PUT
}

char *chat_history_path(const char *xdg_state, const char *home)
{
    char *path = NULL;
    int n;

    if (xdg_state && xdg_state[0] == '/')
        n = asprintf(&path, "%s/loom/chat_history", xdg_state);
    else if (home && *home)
        n = asprintf(&path, "%s/.local/state/loom/chat_history", home);
    else
        return NULL;
    return n < 0 ? NULL : path;
}
