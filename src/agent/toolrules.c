/*
 * The after-call rules of a tool's settings (see toolrules.h). The
 * config loader has checked their types (config_yaml.c), but settings
 * may also come from an embedder's JSON, so a value of another shape is
 * read as absent rather than trusted.
 */
#include "agent/toolrules.h"
#include "core/error.h"
#include "core/text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int loom__rules_wrap(char **out, const json_t *settings, const char *tool,
                     const char *result)
{
    const char *tmpl = json_string_value(
        json_object_get(json_object_get(settings, tool), "wrap_result"));

    *out = NULL;
    if (!tmpl)
        return 0;
    if (!(*out = loom__text_fill(tmpl, "{result}", result)))
        return loom__error_oom();
    return 0;
}

const char *loom__rules_then_force(const json_t *settings, const char *tool,
                                   const json_t *args)
{
    const json_t *f =
        json_object_get(json_object_get(settings, tool), "then_force");
    const char *when;

    if (json_is_string(f))
        return json_string_value(f);
    when = json_string_value(json_object_get(f, "when"));
    if (when && !json_is_true(json_object_get(args, when)))
        return NULL;
    return json_string_value(json_object_get(f, "tool"));
}

int loom__rules_history_summary(const json_t *settings, const char *tool)
{
    const char *h = json_string_value(
        json_object_get(json_object_get(settings, tool), "history"));

    return h && strcmp(h, "summary") == 0;
}

char *loom__rules_reduced(const char *tool, const char *summary)
{
    char *out = NULL;
    int n = summary && *summary
                ? asprintf(&out, "[result of %s, shortened for history] %s",
                           tool, summary)
                : asprintf(&out, "[result of %s omitted from history]", tool);

    return n < 0 ? NULL : out;
}
