/*
 * libFuzzer target for the request half of the chat completions API
 * (server/chat_format.h): the whole input is a POST /v1/chat/completions
 * body. It is parsed (loom__chat_request_parse_text), and a request that
 * parses has its tool list resolved against a small registry three ways
 * (a plain model, an agent with two tools, an agent with every tool), as
 * the server does before a run starts. Beyond "no crash, no leak" it
 * checks the contracts: a bad request is a 400-class error with a message
 * and an empty request; a parsed one has a model, 1 to
 * LOOM__CHAT_MAX_MESSAGES messages of known roles, valid tool names
 * within the limit, values in range; a resolved tool list names only
 * tools the registry has, once each. A broken rule aborts. Built only
 * with -DLOOM_FUZZ=ON and clang; tests/unit/test_fuzz_corpus.c includes
 * this file with LOOM_FUZZ_NO_ENTRY defined to replay the corpus.
 */
#include "core/text.h"
#include "loom/common.h"
#include "server/chat_format.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int fch_exec(const json_t *args, const loom_tool_ctx *ctx, loom_buf *out,
                    void *payload)
{
    (void)args;
    (void)ctx;
    (void)payload;
    return loom_buf_puts(out, "ok");
}

/* The registry the tool lists are resolved against, made once. */
static const loom_tool_registry *fch_registry(void)
{
    static const char *const names[] = {"get_time", "web_search", "web_fetch"};
    static loom_tool_registry *reg;

    if (reg)
        return reg;
    if (loom_tool_registry_new(&reg) != 0)
        abort();
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        loom_tool t = LOOM_TOOL_INIT;
        t.name = names[i];
        t.description = "d";
        t.execute = fch_exec;
        if (loom_tool_registry_add(reg, &t) != 0)
            abort();
    }
    return reg;
}

/* A filled error: what the server sends back. */
static void fch_check_error(const loom__chat_error *err)
{
    json_t *j;

    if (err->status < 400 || err->status > 599 || !err->message || !err->type)
        abort();
    if (!(j = loom__chat_error_json(err)))
        abort();
    json_decref(j);
}

static void fch_check_request(const loom__chat_request *q)
{
    if (!q->model || !*q->model)
        abort();
    if (q->messages.len < 1 || q->messages.len > LOOM__CHAT_MAX_MESSAGES)
        abort();
    for (size_t i = 0; i < q->messages.len; i++) {
        const loom_message *m = &q->messages.items[i];
        if (m->role != LOOM_ROLE_SYSTEM && m->role != LOOM_ROLE_USER &&
            m->role != LOOM_ROLE_ASSISTANT && m->role != LOOM_ROLE_TOOL)
            abort();
        if (m->role == LOOM_ROLE_TOOL && !m->tool_call_id)
            abort();
        for (size_t k = 0; k < m->tool_calls_len; k++)
            if (!m->tool_calls[k].id || !m->tool_calls[k].name ||
                !m->tool_calls[k].arguments)
                abort();
    }
    if (q->tool_names_len + q->client_tools_len > LOOM__CHAT_MAX_TOOLS)
        abort();
    for (size_t i = 0; i < q->tool_names_len; i++)
        if (!loom__text_is_name(q->tool_names[i], 0))
            abort();
    for (size_t i = 0; i < q->client_tools_len; i++)
        if (!loom__text_is_name(q->client_tools[i].name, 0) ||
            (q->client_tools[i].parameters &&
             !json_is_object(q->client_tools[i].parameters)))
            abort();
    if (q->has_tool_choice &&
        q->tool_choice.kind == LOOM_TOOL_CHOICE_FUNCTION &&
        !q->tool_choice.function)
        abort();
    if (q->temperature != -1.0 && !(q->temperature >= 0 && q->temperature <= 2))
        abort();
    if (q->max_tokens < 0)
        abort();
    if (q->user && !loom__chat_user_valid(q->user))
        abort();
    if (q->conversation_id && !*q->conversation_id)
        abort();
}

/* Resolves q's tools as the server does for one kind of agent. */
static void fch_tools(const loom__chat_request *q, const char *const *agent,
                      size_t nagent, int agent_all)
{
    const loom_tool_registry *reg = fch_registry();
    const char **names = NULL;
    loom__chat_error err;
    size_t n = 0;
    int all = 0, rc;

    memset(&err, 0, sizeof(err));
    rc = loom__chat_server_tools(&names, &n, &all, q, reg, agent, nagent,
                                 agent_all, &err);
    if (rc == LOOM_EINVALID)
        fch_check_error(&err);
    else if (rc != 0 && rc != LOOM_ENOMEM)
        abort();
    if (rc == 0 && all != agent_all)
        abort();
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (!names[i] || !loom_tool_registry_get(reg, names[i]))
            abort();
        for (size_t k = 0; k < i; k++)
            if (strcmp(names[k], names[i]) == 0)
                abort();
    }
    free(names);
    loom__chat_error_clear(&err);
}

static int fuzz_chat_request_one(const uint8_t *data, size_t size)
{
    static const char *const agent[] = {"web_fetch", "get_time"};
    loom__chat_request q;
    loom__chat_error err;
    int rc;

    rc = loom__chat_request_parse_text(&q, (const char *)data, size, &err);
    if (rc == LOOM_EINVALID) {
        fch_check_error(&err);
        if (q.model || q.messages.len || q.tool_names || q.client_tools ||
            q.tools_json)
            abort(); /* a refused request holds nothing */
    } else if (rc == 0) {
        fch_check_request(&q);
        fch_tools(&q, NULL, 0, 0);
        fch_tools(&q, agent, 2, 0);
        fch_tools(&q, NULL, 0, 1);
    } else if (rc != LOOM_ENOMEM) {
        abort();
    }
    loom__chat_request_clear(&q);
    loom__chat_error_clear(&err);
    return 0;
}

#ifndef LOOM_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_chat_request_one(data, size);
}
#endif
