/*
 * Internal: the body of POST /v1/runs (docs/server.md), read without any
 * I/O so that the handler (api_runs.c) and the fuzz target
 * (fuzz/fuzz_runs_request.c) share it: a JSON body becomes the spec of a
 * run, or an error in OpenAI's shape naming the field at fault.
 */
#ifndef LOOM_SERVER_RUNS_REQUEST_H
#define LOOM_SERVER_RUNS_REQUEST_H

#include "loom/llm.h"
#include "server/chat_format.h"
#include "server/internal.h"

#include <jansson.h>

/* Tool names one request may list. */
#define SRV_RUNS_MAX_TOOLS 256

/* A parsed request. Its strings are borrowed from the body. */
typedef struct {
    loom_messages input;                        /* owned */
    const char *tool_names[SRV_RUNS_MAX_TOOLS]; /* spec.tool_names */
    srv_run_spec spec;      /* spec.input, spec.params: the two here */
    loom_llm_params params; /* owned: sampling and output parameters */
    int stream;
    int background_set; /* the request said "background" */
} srv_runs_request;

/*
 * Reads body (NULL when the request's body did not parse, json_error then
 * saying why, or NULL for an empty body) into *q, which must stay where
 * it is while spec is used and keep body alive. A body that is not a
 * JSON object is LOOM_EINVALID with code invalid_json; an unknown field
 * or a value of the wrong type or range is LOOM_EINVALID too, param
 * naming the field; *err is then filled (status 400; clear it with
 * loom__chat_error_clear). LOOM_ENOMEM. On an error nothing in *q needs
 * freeing.
 */
int srv_runs_request_parse(srv_runs_request *q, const json_t *body,
                           const char *json_error, loom__chat_error *err);

/* Frees what q owns (its input messages and parameters). */
void srv_runs_request_clear(srv_runs_request *q);

#endif
