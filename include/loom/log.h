/*
 * loom/log.h: levelled logging.
 *
 * The library never prints on its own: logging is off until the program
 * that embeds libloom turns it on with loom_log_set() (the loom command
 * does, to stderr). Output is one line per record, plain text for a
 * terminal or JSON lines ({"ts","level","msg"}) for log collectors.
 */
#ifndef LOOM_LOG_H
#define LOOM_LOG_H

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    LOOM_LOG_DEBUG = 0,
    LOOM_LOG_INFO = 1,
    LOOM_LOG_WARN = 2,
    LOOM_LOG_ERROR = 3,
    LOOM_LOG_OFF = 4
} loom_log_level;

typedef enum { LOOM_LOG_TEXT = 0, LOOM_LOG_JSON = 1 } loom_log_format;

/* Sends records at level and above to out (NULL: off). Not thread-safe
 * against concurrent logging; call it at start. */
void loom_log_set(FILE *out, loom_log_level level, loom_log_format format);
/* Parses "debug", "info", "warn", "error", "off"; -1 when unknown. */
int loom_log_level_parse(const char *name);
int loom_log_enabled(loom_log_level level);
void loom_log(loom_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define loom_debug(...) loom_log(LOOM_LOG_DEBUG, __VA_ARGS__)
#define loom_info(...) loom_log(LOOM_LOG_INFO, __VA_ARGS__)
#define loom_warn(...) loom_log(LOOM_LOG_WARN, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
