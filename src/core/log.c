/*
 * Levelled logging, off by default (the library never prints unless the
 * embedding program asks). Each record is formatted into one buffer and
 * written with a single fwrite so lines from concurrent threads do not
 * interleave mid-line.
 */
#include "loom/log.h"
#include "core/clock.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static FILE *log_out;
static loom_log_level log_level = LOOM_LOG_OFF;
static loom_log_format log_format = LOOM_LOG_TEXT;

static const char *const level_names[] = {"debug", "info", "warn", "error",
                                          "off"};

void loom_log_set(FILE *out, loom_log_level level, loom_log_format format)
{
    log_out = out;
    log_level = out ? level : LOOM_LOG_OFF;
    log_format = format;
}

int loom_log_level_parse(const char *name)
{
    for (int i = 0; i <= LOOM_LOG_OFF; i++)
        if (name && strcasecmp(name, level_names[i]) == 0)
            return i;
    if (name && strcasecmp(name, "warning") == 0)
        return LOOM_LOG_WARN;
    return -1;
}

int loom_log_enabled(loom_log_level level)
{
    return log_out && level >= log_level && level < LOOM_LOG_OFF;
}

void loom_log(loom_log_level level, const char *fmt, ...)
{
    char msg[2048], ts[40], *line = NULL;
    int64_t now_ms;
    time_t now;
    struct tm tm;
    va_list ap;
    int n;

    if (!loom_log_enabled(level))
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    now_ms = loom__unix_ms();
    now = (time_t)(now_ms / 1000);
    gmtime_r(&now, &tm);
    n = (int)strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + n, sizeof(ts) - (size_t)n, ".%03ldZ", (long)(now_ms % 1000));
    if (log_format == LOOM_LOG_JSON) {
        json_t *o = json_pack("{s:s,s:s,s:s}", "ts", ts, "level",
                              level_names[level], "msg", msg);
        char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
        json_decref(o);
        if (s && asprintf(&line, "%s\n", s) < 0)
            line = NULL;
        free(s);
    } else if (asprintf(&line, "%s %-5s %s\n", ts, level_names[level], msg) <
               0) {
        line = NULL;
    }
    if (line) {
        fwrite(line, 1, strlen(line), log_out);
        fflush(log_out);
        free(line);
    }
}
