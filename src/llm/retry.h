/*
 * llm/retry.h: when and how long to wait before retrying a model call.
 *
 * Shared by provider adapters: parsing the server's own advice
 * (retry-after-ms, Retry-After as seconds or an HTTP date), jittered
 * exponential backoff, and a sleep that a loom_cancel flag interrupts.
 */
#ifndef LOOM_LLM_RETRY_H
#define LOOM_LLM_RETRY_H

#include "loom/cancel.h"

#include <time.h>

/* The longest server-requested delay loom honours; past it, no retry. */
#define LOOM_RETRY_MAX_HONOURED_MS 60000L

/*
 * The delay the server asked for, in ms: retry_after_ms (milliseconds)
 * wins over retry_after (delta-seconds or an HTTP date, compared with
 * now). Either may be NULL. Returns -1 when neither is present or
 * parsable; a date in the past gives 0.
 */
long loom__retry_after(const char *retry_after_ms, const char *retry_after,
                       time_t now);

/*
 * Backoff before retry number `retry` (1 for the first retry): base * 2^
 * (retry - 1) capped at max_ms, then a random value in [half, full] of it
 * ("equal jitter", so that retries of many clients spread out but never
 * come back at once). *seed is the caller's PRNG state.
 */
long loom__retry_backoff(int retry, long base_ms, long max_ms, unsigned *seed);

/* Sleeps ms in short slices; LOOM_ECANCELED as soon as cancel is set. */
int loom__retry_sleep(long ms, loom_cancel *cancel);

#endif
