/*
 * Retry timing for provider adapters (see llm/retry.h). HTTP dates are
 * parsed by libcurl's curl_getdate() (RFC 9110 IMF-fixdate and the two
 * obsolete forms), so only the numeric forms are read here.
 */
#include "llm/retry.h"
#include "core/clock.h"
#include "core/error.h"
#include "core/fiber.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define SLEEP_SLICE_MS 20

/* Parses a whole non-negative decimal (surrounding blanks allowed). */
static int parse_number(const char *s, double *out)
{
    char *end;
    double v;

    while (*s == ' ' || *s == '\t')
        s++;
    if (!isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    v = strtod(s, &end);
    if (errno || end == s)
        return -1;
    while (*end == ' ' || *end == '\t')
        end++;
    if (*end)
        return -1;
    *out = v;
    return 0;
}

long loom__retry_after(const char *retry_after_ms, const char *retry_after,
                       time_t now)
{
    double v;
    time_t when;

    if (retry_after_ms && parse_number(retry_after_ms, &v) == 0)
        return v > 1e9 ? 1000000000L : (long)v;
    if (!retry_after)
        return -1;
    if (parse_number(retry_after, &v) == 0)
        return v > 1e6 ? 1000000000L : (long)(v * 1000.0);
    when = curl_getdate(retry_after, NULL);
    if (when == (time_t)-1)
        return -1;
    if (when <= now)
        return 0;
    if (when - now > 1000000)
        return 1000000000L;
    return (long)(when - now) * 1000L;
}

long loom__retry_backoff(int retry, long base_ms, long max_ms, unsigned *seed)
{
    long d = base_ms > 0 ? base_ms : 0, half;

    for (int i = 1; i < retry && d < max_ms; i++)
        d *= 2;
    if (max_ms >= 0 && d > max_ms)
        d = max_ms;
    half = d / 2;
    if (d - half <= 0)
        return d;
    return half + (long)(rand_r(seed) % (unsigned long)(d - half + 1));
}

int loom__retry_sleep(long ms, loom_cancel *cancel)
{
    double end = loom__mono_ms_exact() + (double)ms, left;

    if (loom__fiber_self()) {
        /* A fiber parks until the end, or until the flag is set. */
        while (!loom_cancel_is_set(cancel) && loom__mono_ms_exact() < end) {
            (void)loom__fiber_arm();
            loom__fiber_park_cancel(end, cancel);
        }
        if (loom_cancel_is_set(cancel))
            return loom__error_set(LOOM_ECANCELED, "canceled while waiting "
                                                   "to retry");
        return 0;
    }
    for (;;) {
        if (loom_cancel_is_set(cancel))
            return loom__error_set(LOOM_ECANCELED, "canceled while waiting "
                                                   "to retry");
        if ((left = end - loom__mono_ms_exact()) <= 0)
            return 0;
        if (left > SLEEP_SLICE_MS)
            left = SLEEP_SLICE_MS;
        /* Whole milliseconds, at least one; a fiber parks meanwhile. */
        loom__fiber_sleep(left < 1 ? 1 : (long)left);
    }
}
