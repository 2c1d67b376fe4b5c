/*
 * libFuzzer target for the body of POST /v1/runs (server/runs_request.h):
 * the whole input is the request body, parsed as the server parses it
 * (json_loadb without flags, nothing for an empty body; text that is not
 * JSON gives the server's reason), then read by srv_runs_request_parse. Beyond
 * "no crash, no leak" it checks the contract: a bad request is a 400 with a
 * message (naming the field when it is one) and leaves nothing to free; a
 * parsed one has 1 to 1000 input messages of the roles the API takes, non-empty
 * strings, the tools it listed, and every number in its range. A broken
 * rule aborts. Built only with -DLOOM_FUZZ=ON and clang;
 * tests/unit/test_fuzz_corpus.c includes this file with LOOM_FUZZ_NO_ENTRY
 * defined to replay the corpus.
 */
#include "core/utf8.h"
#include "loom/common.h"
#include "server/runs_request.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void frq_check_spec(const srv_runs_request *q, const json_t *body)
{
    const srv_run_spec *s = &q->spec;
    const char *const strs[] = {s->agent, s->model, s->conversation_id,
                                s->system_prompt, s->user_id};

    if (s->input != &q->input || s->params != &q->params || q->input.len < 1 ||
        q->input.len > 1000)
        abort();
    for (size_t i = 0; i < q->input.len; i++) {
        loom_role r = q->input.items[i].role;
        if ((r != LOOM_ROLE_USER && r != LOOM_ROLE_SYSTEM &&
             r != LOOM_ROLE_ASSISTANT) ||
            !q->input.items[i].content)
            abort();
    }
    for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++)
        if (strs[i] && !*strs[i])
            abort();
    if (s->user_id && !loom__chat_user_valid(s->user_id))
        abort();
    if (s->max_iterations < 0 || s->max_iterations > 1000 || s->max_tokens < 0)
        abort();
    if (s->temperature != -1.0 && !(s->temperature >= 0 && s->temperature <= 2))
        abort();
    if (s->tool_names_set) {
        const json_t *tools = json_object_get(body, "tools");
        if (s->tool_names != q->tool_names ||
            s->tool_names_len != json_array_size(tools))
            abort();
        for (size_t i = 0; i < s->tool_names_len; i++)
            if (!s->tool_names[i])
                abort();
    } else if (s->tool_names_len) {
        abort();
    }
}

static int fuzz_runs_request_one(const uint8_t *data, size_t size)
{
    srv_runs_request q;
    loom__chat_error err;
    json_error_t je;
    json_t *body = size ? json_loadb((const char *)data, size, 0, &je) : NULL;
    char shown[256]; /* as http.c says why */
    const char *why = size && !body
                          ? loom__json_error_shown(shown, sizeof(shown), &je)
                          : NULL;
    int rc;

    rc = srv_runs_request_parse(&q, body, why, &err);
    if (rc == LOOM_EINVALID) {
        if (err.status != 400 || !err.message || !err.code || !err.type)
            abort();
        if (q.input.len || q.spec.input)
            abort(); /* a refused request holds nothing */
        if ((why || !json_is_object(body)) &&
            strcmp(err.code, "invalid_json") != 0)
            abort();
        if (why && !strstr(err.message, why))
            abort();
    } else if (rc == 0) {
        frq_check_spec(&q, body);
    } else if (rc != LOOM_ENOMEM) {
        abort();
    }
    srv_runs_request_clear(&q);
    loom__chat_error_clear(&err);
    json_decref(body);
    return 0;
}

#ifndef LOOM_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_runs_request_one(data, size);
}
#endif
