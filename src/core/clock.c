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
