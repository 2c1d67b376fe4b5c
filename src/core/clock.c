/*
 * The two clocks loom reads (core/clock.h), over clock_gettime(2).
 * CLOCK_MONOTONIC and CLOCK_REALTIME cannot fail on Linux for a valid
 * timespec, so the results are not checked.
 */
#include "core/clock.h"

#include <string.h>
#include <time.h>

int64_t loom__mono_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

double loom__mono_ms_exact(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

int64_t loom__unix_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int loom__cond_init_mono(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    int rc;

    if ((rc = pthread_condattr_init(&ca)) != 0)
        return rc;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    rc = pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
    return rc;
}

int loom__cond_wait_mono(pthread_cond_t *cv, pthread_mutex_t *mu, double until)
{
    struct timespec ts;

    ts.tv_sec = (time_t)(until / 1e3);
    ts.tv_nsec = (long)((until - (double)ts.tv_sec * 1e3) * 1e6);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return pthread_cond_timedwait(cv, mu, &ts);
}

/* The n digits at s as a number; -1 when one is not a digit. */
static int digits(const char *s, int n)
{
    int v = 0;

    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

int64_t loom__date_ms(const char *s)
{
    /* Written out rather than strptime(), which takes "2026-2-31" and
     * leaves timegm() to roll it into March. */
    size_t len = s ? strlen(s) : 0;
    struct tm tm, back;
    time_t t;

    if ((len != 10 && len != 20) || s[4] != '-' || s[7] != '-' ||
        (len == 20 &&
         (s[10] != 'T' || s[13] != ':' || s[16] != ':' || s[19] != 'Z')))
        return -1;
    memset(&tm, 0, sizeof(tm));
    tm.tm_year = digits(s, 4) - 1900;
    tm.tm_mon = digits(s + 5, 2) - 1;
    tm.tm_mday = digits(s + 8, 2);
    if (len == 20) {
        tm.tm_hour = digits(s + 11, 2);
        tm.tm_min = digits(s + 14, 2);
        tm.tm_sec = digits(s + 17, 2);
    }
    if (tm.tm_year < 70 || tm.tm_mon < 0 || tm.tm_mon > 11 || tm.tm_mday < 1 ||
        tm.tm_hour < 0 || tm.tm_hour > 23 || tm.tm_min < 0 || tm.tm_min > 59 ||
        tm.tm_sec < 0 || tm.tm_sec > 59)
        return -1;
    back = tm;
    t = timegm(&tm);
    /* A day past the month's end comes back as another day. */
    if (t == (time_t)-1 || tm.tm_mday != back.tm_mday ||
        tm.tm_mon != back.tm_mon)
        return -1;
    return (int64_t)t * 1000;
}
