/*
 * libFuzzer target for the JSON Schema subset validator
 * (loom_schema_validate in loom/tools.h). The input is split at its first
 * NUL byte: the part before is the schema, the part after the value, both
 * parsed with json_loadb (any JSON value, NUL escapes allowed). Without a
 * NUL the document is validated against itself, which still reaches every
 * keyword. A result must be 0 with no message, or LOOM_EINVALID with a
 * non-empty one (LOOM_ENOMEM aside). Built only with -DLOOM_FUZZ=ON and
 * clang; tests/unit/test_fuzz_corpus.c includes this file with
 * LOOM_FUZZ_NO_ENTRY defined to replay the corpus.
 */
#include "loom/common.h"
#include "loom/tools.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int fuzz_schema_one(const uint8_t *data, size_t size)
{
    const char *s = (const char *)data;
    const char *nul = size ? memchr(s, '\0', size) : NULL;
    size_t schema_len = nul ? (size_t)(nul - s) : size;
    json_t *schema = NULL, *value = NULL;
    char *msg = NULL;
    int rc;

    schema = json_loadb(s, schema_len, JSON_DECODE_ANY | JSON_ALLOW_NUL,
                        NULL);
    if (!schema)
        goto cleanup;
    if (nul)
        value = json_loadb(nul + 1, size - schema_len - 1,
                           JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    else
        value = json_incref(schema);
    if (!value)
        goto cleanup;
    rc = loom_schema_validate(schema, value, &msg);
    if (rc == 0 && msg)
        abort();
    if (rc == LOOM_EINVALID && (!msg || !*msg))
        abort();
    if (rc != 0 && rc != LOOM_EINVALID && rc != LOOM_ENOMEM)
        abort();
    /* Without a place for the message the answer is the same. */
    if (loom_schema_validate(schema, value, NULL) != rc)
        abort();

cleanup:
    free(msg);
    json_decref(value);
    json_decref(schema);
    return 0;
}

#ifndef LOOM_FUZZ_NO_ENTRY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return fuzz_schema_one(data, size);
}
#endif
