/*
 * loom/recorder.h: turns a run's event stream into a storable turn.
 *
 * A recorder is a sink that sits in front of another sink: it notes what
 * the store needs and the events do not leave behind in the run itself
 * (where in the assistant text each tool call appeared, each tool's
 * outcome and duration, each model call's usage), then forwards every
 * event unchanged. After the run, loom_recorder_turn() fills a loom_turn
 * ready for loom_store_save_turn().
 */
#ifndef LOOM_RECORDER_H
#define LOOM_RECORDER_H

#include "run.h"
#include "store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct loom_recorder loom_recorder;

/* inner may have a NULL emit (record only). */
int loom_recorder_new(loom_recorder **out, loom_sink inner);
/* The sink to give the run (payload is the recorder). */
loom_sink loom_recorder_sink(loom_recorder *rec);

/*
 * Fills *turn from what was recorded and from the finished run: output
 * messages, status (ok, error or cancelled with the run's error as
 * reason), finish reason, tool outcomes, call offsets and usage rows. The
 * caller sets conversation_id, input and agent. Pointers are borrowed
 * from rec and run: valid until either is freed.
 */
int loom_recorder_turn(loom_recorder *rec, const loom_run *run,
                       loom_turn *turn);

void loom_recorder_free(loom_recorder *rec);

#ifdef __cplusplus
}
#endif
#endif
