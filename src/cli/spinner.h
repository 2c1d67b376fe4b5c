/*
 * A spinner line on a terminal for what is running now (`loom chat`'s
 * tool calls): one line, "- name args", its first character turning
 * every SPINNER_TICK_MS, redrawn in place by a thread of its own. Whoever
 * prints to the same terminal holds the spinner first (its line is
 * erased and stays so) and releases it after; the line comes back when
 * something still runs.
 *
 * Labels are shown as given: the caller cleans text from outside
 * (clean.h) first. Every function is safe from any thread.
 */
#ifndef LOOM_CLI_SPINNER_H
#define LOOM_CLI_SPINNER_H

#include <stdio.h>

#define SPINNER_TICK_MS 100
/* Entries a spinner keeps (more are counted, not named). */
#define SPINNER_MAX 32

typedef struct cli_spinner cli_spinner;

/* A spinner drawing on f (a terminal). 0, or -1 when out of memory or
 * no thread could be started. */
int cli_spinner_new(cli_spinner **out, FILE *f);
/* Erases its line and stops it; NULL is a no-op. */
void cli_spinner_free(cli_spinner *s);

/* Erases the line and keeps it erased until cli_spinner_release. */
void cli_spinner_hold(cli_spinner *s);
/* Draws the line again at once when something runs. */
void cli_spinner_release(cli_spinner *s);

/* Something started (id: a key for cli_spinner_remove; label copied). */
void cli_spinner_add(cli_spinner *s, const char *id, const char *label);
/* It ended (an unknown id is ignored). */
void cli_spinner_remove(cli_spinner *s, const char *id);
/* Forgets everything (a turn ended). */
void cli_spinner_clear(cli_spinner *s);

#endif
