/*
 * Small tools for the tests of the tool rules (test_tool_rules.c and
 * test_tool_rules_wire.c): what each returns is fixed, so a test can
 * tell from a result which rule touched it.
 */
#ifndef LOOM_TEST_RULE_TOOLS_H
#define LOOM_TEST_RULE_TOOLS_H

#include "loom/tools.h"

/* "echo:<text>" ("echo:-" without text), and the summary "echo
 * summary". */
int rule_echo_exec(const json_t *args, const loom_tool_ctx *ctx, loom_buf *out,
                   void *payload);
/* The payload's text. */
int rule_const_exec(const json_t *args, const loom_tool_ctx *ctx, loom_buf *out,
                    void *payload);
/* "n=<n>". */
int rule_n_exec(const json_t *args, const loom_tool_ctx *ctx, loom_buf *out,
                void *payload);
/* should_use that always says no. */
int rule_never(const loom_tool_ctx *ctx, void *payload);

#endif
