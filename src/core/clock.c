/*
 * The two clocks loom reads (core/clock.h), over clock_gettime(2).
 * CLOCK_MONOTONIC and CLOCK_REALTIME cannot fail on Linux for a valid
 * timespec, so the results are not checked.
 */
#include "core/clock.h"

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
