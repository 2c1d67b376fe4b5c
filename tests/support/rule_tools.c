/* Tools for the tool rules' tests (see rule_tools.h). */
#include "rule_tools.h"

int rule_echo_exec(const json_t *args, const loom_tool_ctx *ctx, loom_buf *out,
                   void *payload)
{
    const char *text = json_string_value(json_object_get(args, "text"));

    (void)payload;
    if (ctx->summary)
        loom_buf_puts(ctx->summary, "echo summary");
    return loom_buf_printf(out, "echo:%s", text ? text : "-");
}

int rule_const_exec(const json_t *args, const loom_tool_ctx *ctx, loom_buf *out,
                    void *payload)
{
    (void)args;
    (void)ctx;
    return loom_buf_puts(out, payload);
}

int rule_n_exec(const json_t *args, const loom_tool_ctx *ctx, loom_buf *out,
                void *payload)
{
    (void)ctx;
    (void)payload;
    return loom_buf_printf(
        out, "n=%lld",
        (long long)json_integer_value(json_object_get(args, "n")));
}

int rule_never(const loom_tool_ctx *ctx, void *payload)
{
    (void)ctx;
    (void)payload;
    return 0;
}
