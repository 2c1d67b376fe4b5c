/*
 * What the store tests (test_store.c, test_store_turn_extras.c,
 * test_memory.c) and the server tests share about a SQLite store on a
 * temporary file: a fresh path, opening it, a new conversation, and the
 * raw file behind the store's back (one integer out, a statement in, two
 * conversations' rows compared).
 * Failures are cmocka assertions.
 */
#ifndef LOOM_TEST_STORE_FIXTURE_H
#define LOOM_TEST_STORE_FIXTURE_H

#include "loom/store.h"

#include <jansson.h>

/* Removes the database at path and its -wal and -shm files, if any. */
void test_db_remove(const char *path);

/* A fresh database path for name under test_tmp_dir() (any old file
 * removed); the caller frees. */
char *test_db_path(const char *name);

/* loom_store_open() that must succeed (else prints why and fails). */
loom_store *test_store_open_ok(const char *path);

/* A new conversation of st; returns its id, which the caller frees. */
char *test_conversation_create_ok(loom_store *st);

/* Conversation id as loom_store_conversation_get() returns it (a new
 * reference); the call must succeed. */
json_t *test_conversation_get_ok(loom_store *st, const char *id);

/* One integer from the raw database at path (sql returns one row, one
 * column); -1 when it returns no row. */
long long test_db_int(const char *path, const char *sql);

/* Runs sql on the raw database at path; it must succeed. */
void test_db_exec(const char *path, const char *sql);

/*
 * Whether two conversations a and b hold the same rows (ids and times
 * aside), as the raw database at path says: their conversations rows,
 * and their messages, tool calls, usage and runs rows; a failed
 * assertion names the table that differs. Each must have messages, usage
 * and a run.
 */
void test_db_same_conversation(const char *path, const char *a, const char *b);

/* The group of a loom_store_usage() answer (its "data") whose field key
 * is value (NULL: null); fails the test when there is none. */
const json_t *test_usage_group(const json_t *out, const char *key,
                               const char *value);

#endif
