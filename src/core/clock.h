/*
 * Internal: the two clocks loom reads. The monotonic clock times
 * durations, timeouts and deadlines (it never jumps); the wall clock
 * stamps what people read (events, stored rows, log lines). Every layer
 * reads them here rather than through its own clock_gettime wrapper.
 */
#ifndef LOOM_CORE_CLOCK_H
#define LOOM_CORE_CLOCK_H

#include <pthread.h>
#include <stdint.h>

/* Milliseconds on the monotonic clock (since an arbitrary start). */
int64_t loom__mono_ms(void);

/* Milliseconds on the monotonic clock with the fraction kept (to the
 * nanosecond): for durations shorter than a millisecond and benchmarks. */
double loom__mono_ms_exact(void);

/* Milliseconds since the Unix epoch, on the wall clock. */
int64_t loom__unix_ms(void);

/* Makes cv a condition whose timed waits run on the monotonic clock: 0,
 * or the pthread error. */
int loom__cond_init_mono(pthread_cond_t *cv);

/* Waits on cv (made by loom__cond_init_mono, mu held) until woken or
 * until the monotonic ms until: pthread_cond_timedwait's answer. */
int loom__cond_wait_mono(pthread_cond_t *cv, pthread_mutex_t *mu, double until);

/*
 * A UTC date, "YYYY-MM-DD" (its midnight) or "YYYY-MM-DDTHH:MM:SSZ", as
 * Unix milliseconds; -1 when s is anything else, a day the month does
 * not have included (years 1970 to 9999).
 */
int64_t loom__date_ms(const char *s);

#endif
