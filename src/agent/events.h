/*
 * Internal: an event's JSON text written straight from the event, for the
 * session's log, which keeps every event as text. The same bytes as
 * loom__json_compact_dumps(loom_event_to_json(ev), 15, ...), without
 * building the envelope object (a hash table and an allocation per
 * envelope value) and without a text of its own for each event.
 */
#ifndef LOOM_AGENT_EVENTS_H
#define LOOM_AGENT_EVENTS_H

#include "loom/buf.h"
#include "loom/run.h"

/*
 * Appends the compact JSON text of loom_event_to_json(ev), reals written
 * with 15 digits, to b. 0, or the error (b then holds part of it): where
 * loom__json_compact_dumps would fail (a string of the data not UTF-8),
 * and when out of memory.
 */
int loom__event_text(const loom_event *ev, loom_buf *b);

#endif
