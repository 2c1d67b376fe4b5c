/*
 * Internal to the SQLite backend: its migrations (migrations.c), what
 * sqlite.c lends the backend's other files (sqlite_memory.c) to run a
 * transaction on a pooled connection, the hooks its tests use to reach
 * states a caller cannot (an older schema, a full disk), and what the
 * files of the conversation store share: the pool and its cached
 * statements (sqlite.c), the conversations (sqlite_conversations.c) and
 * saving a turn (sqlite_turn.c).
 */
#ifndef LOOM_STORE_SQLITE_INTERNAL_H
#define LOOM_STORE_SQLITE_INTERNAL_H

#include "core/fiber.h"
#include "store/store_internal.h"

#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <string.h>

/* Migration N is loom__sqlite_migrations[N - 1]; the newest schema version
 * this loom knows is loom__sqlite_migrations_len. */
extern const char *const loom__sqlite_migrations[];
extern const int loom__sqlite_migrations_len;

/*
 * Test hook: opens like loom_store_open() but migrates no further than
 * version (a database already past it is left alone).
 */
int loom__store_sqlite_open_version(loom_store **out, const char *path,
                                    int version);

/*
 * Test hook: runs sql on every idle connection of st now and on every
 * connection it opens later (say "PRAGMA max_page_count = 40"). Only
 * while no other thread uses st. sql is copied.
 */
int loom__store_sqlite_exec_all(loom_store *st, const char *sql);

/*
 * Test hooks of the writer thread (sqlite_writer.c). With on set, the
 * writer takes no new batch (writes queue up); unset, it goes on.
 * loom__store_sqlite_wait_queued() returns once n writes are queued
 * (only while held). loom__store_sqlite_batches() is how many batches
 * the writer has run; loom__store_sqlite_begun() how many write
 * transactions they began (a batch whose write failed begins again).
 */
void loom__store_sqlite_hold(loom_store *st, int on);
void loom__store_sqlite_wait_queued(loom_store *st, int n);
unsigned long loom__store_sqlite_batches(loom_store *st);
unsigned long loom__store_sqlite_begun(loom_store *st);

/* ---- transactions on pooled connections (sqlite.c) ------------------- */

typedef struct loom__sqlite_conn loom__sqlite_conn;

/*
 * Takes a pooled connection (waiting for one) and begins a transaction on
 * it: BEGIN IMMEDIATE after the store's in-process write lock when write
 * is set, a plain (read) BEGIN otherwise. Every success is paired with
 * loom__sqlite_end() with the same write.
 */
int loom__sqlite_begin(loom_store *st, int write, loom__sqlite_conn **out);
/* Rolls back whatever is still open, gives c back and drops the write
 * lock. Statements the caller prepared must be finalized first. */
void loom__sqlite_end(loom_store *st, loom__sqlite_conn *c, int write);
int loom__sqlite_commit(loom_store *st, loom__sqlite_conn *c, const char *what);
/* The connection's handle, for statements the caller prepares itself. */
sqlite3 *loom__sqlite_db(loom__sqlite_conn *c);
/* Records SQLite's error rc for what ("store PATH: what: message") and
 * returns the LOOM_E* code it maps to (a full disk is LOOM_EIO). */
int loom__sqlite_fail(loom_store *st, loom__sqlite_conn *c, int rc,
                      const char *what);

/* ---- the conversation store's files ---------------------------------- */

/* The statements each connection caches (sql_text in sqlite.c). */
enum {
    S_BEGIN,
    S_BEGIN_WRITE,
    S_COMMIT,
    S_ROLLBACK,
    S_PING,
    S_CONV_INSERT,
    S_CONV_INSERT_OWNED,
    S_CONV_INSERT_TURN,
    S_CONV_INFO,
    S_CONV_LIST,
    S_CONV_LIST_AFTER,
    S_CONV_LIST_OWNED,
    S_CONV_LIST_OWNED_AFTER,
    S_CONV_DELETE,
    S_CONV_RENAME,
    S_CONV_BASE,
    S_CONV_UPDATE,
    S_MSG_INSERT,
    S_CALL_INSERT,
    S_OUTPUT_INSERT,
    S_USAGE_INSERT,
    S_MSG_SELECT,
    S_CALL_SELECT,
    S_USAGE_SELECT,
    S_CONV_SUMMARY,
    S_RECORD_INSERT,
    S_RECORD_SELECT,
    S_BLOB_INSERT,
    S_BLOB_LINK,
    S_BLOB_SELECT,
    S_CONV_HASHES,
    S_CONV_MATCH,
    S_RUN_INSERT,
    S_RUN_MSG_INSERT,
    S_RUN_SELECT,
    S_RUN_CHILDREN,
    S_RUN_MSG_SELECT,
    S_SAVEPOINT,
    S_RELEASE,
    S_ROLLBACK_TO,
    S_SEALED_GET,
    S_SETTINGS_GET,
    S_PEPPER_GET,
    S_KEY_GET,
    S_USER_LIMITS,
    S_WORKSPACE_LIMITS,
    S_SPEND_GET,
    S_SPEND_ADD,
    S_COUNT
};

/* The columns of a key (S_KEY_GET, sqlite_accounts.c's row_key) and of
 * a user's or workspace's limits (S_USER_LIMITS, S_WORKSPACE_LIMITS). */
#define KEY_COLS                                                               \
    "id, hash, workspace, user_name, service, created_at, expires_at, "        \
    "revoked_at, models, agents, rpm, tpm, max_concurrent, budget_micros, "    \
    "budget_period, budget_unpriced"
#define LIMIT_COLS                                                             \
    "rpm, tpm, max_concurrent, budget_micros, budget_period, budget_unpriced"

/* The columns of a run that S_RUN_SELECT and S_RUN_CHILDREN read, in the
 * order of the R_ indexes (sqlite_runs.c). */
#define RUN_COLS                                                               \
    "id, conversation_id, parent_run_id, parent_call_id, depth, agent, "       \
    "model, status, error, finish_reason, prompt_tokens, "                     \
    "completion_tokens, cached_tokens, reasoning_tokens, total_tokens, "       \
    "cache_write_tokens, cost_micros, created_at, ended_at"

/* Columns of S_MSG_SELECT. */
enum {
    M_ID,
    M_ROLE,
    M_CONTENT,
    M_REASONING,
    M_MODEL,
    M_FINISH,
    M_STATUS,
    M_ERROR,
    M_PROMPT,
    M_COMPLETION,
    M_COST,
    M_CREATED,
    M_RUN,
    M_CALL_ID,
    M_NAME,
    M_PLACEHOLDER,
    M_TOOL_STATUS,
    M_DURATION,
    M_PROVIDER_STATE,
    M_COST_MICROS,
    M_CITATIONS,
    M_PARTS,
    M_AGENT
};

struct loom__sqlite_conn {
    sqlite3 *db;
    sqlite3_stmt *stmts[S_COUNT];   /* prepared on first use */
    struct loom__sqlite_conn *next; /* in the idle list */
};

typedef struct loom__sqlite_job loom__sqlite_job;

/* The writer thread and the checkpointer (sqlite_writer.c). */
typedef struct {
    pthread_mutex_t lock; /* guards the queue and stop */
    pthread_cond_t work;  /* a job was queued, or stop was set */
    loom__sqlite_job *head, *tail;
    int stop;
    int started; /* the threads run */
    /* Test hooks: hold keeps the writer from taking a batch; queued is
     * the queue's length; batches counts the batches written. */
    int hold;
    int queued;
    /* A batch is being written (by the writer thread, or inline by the
     * thread of a lone write); the WAL is full and the writer thread is
     * to start it over. */
    int busy;
    int catch_up_due;
    /* Writes come one at a time: a lone write is written inline.
     * Cleared when writes queue behind an inline one, set again when the
     * writer thread has written SOLO_AFTER batches of one in a row
     * (singles) with none behind them. */
    int solo, singles;
    unsigned long batches;
    unsigned long begun; /* write transactions begun; under write_lock */
    atomic_ulong written; /* writes committed in batches */
    pthread_t writer, checkpointer;
    /* The writer's own connection, kept across batches so its page
     * cache stays warm (its own commits do not invalidate it); taken
     * from the pool at the first batch, given back at the end. Used
     * under the store's write_lock. */
    struct loom__sqlite_conn *conn;
    /* Held by whoever runs a checkpoint: the checkpointer, or the
     * writer when it starts the WAL over. */
    pthread_mutex_t ckpt_run;
    pthread_mutex_t ckpt_lock; /* guards the fields below */
    pthread_cond_t ckpt_cv;
    sqlite3 *ckpt_db; /* the checkpointer's own connection */
    int ckpt_stop;
    int ckpt_quiet;        /* it waits for CKPT_QUIET_MS with the WAL synced */
    int wal_frames;        /* frames in the WAL after the newest commit */
    int backfilled;        /* frames of it the newest checkpoint copied */
    /* The checkpointer caught up with a WAL of restart_frames or more:
     * the writer is to start it over; cleared when the WAL shrinks. At
     * twice restart_frames the writer does so whatever is left. */
    int restart_frames;
    int restart_due;
    unsigned long commits; /* commits seen by the WAL hook */
    /* Checkpoints that copied pages, times the WAL started over, and the
     * time the writer's restarts held the writes (loom_store_stats). */
    unsigned long checkpoints, restarts;
    double restart_seconds;
} loom__sqlite_writer;

/* Users' sealed settings read lately (sqlite_secrets.c): a run of a user
 * reads them at every request, and they change seldom. */
#define LOOM__SETTINGS_CACHED 16
typedef struct {
    char *user_id;         /* NULL: a free slot */
    unsigned char *sealed; /* NULL: the user has none */
    size_t len;
    int64_t read_ms; /* monotonic, when read */
} loom__sqlite_settings_entry;

typedef struct {
    loom_store base;
    char *path;
    int version;
    pthread_mutex_t lock; /* guards idle, nconns and extra_sql */
    loom__cond available; /* a run on a fiber parks for a connection */
    loom__sqlite_conn *idle;
    int nconns;
    pthread_mutex_t write_lock; /* one writer at a time, in process */
    char *extra_sql;            /* test hook: run on each new connection */
    loom__sqlite_writer w;
    pthread_mutex_t settings_lock; /* guards settings, settings_saves */
    loom__sqlite_settings_entry settings[LOOM__SETTINGS_CACHED];
    unsigned long settings_saves; /* settings saved through this store */
} loom__sqlite_store;

/* Frees the settings cache (sqlite_secrets.c). */
void loom__sqlite_settings_cache_free(loom__sqlite_store *st);

/* ---- the writer thread (sqlite_writer.c) ------------------------------ */

/*
 * One write, run by the writer thread on c inside the batch's
 * transaction (under a savepoint of its own): 0, or a LOOM_E* code with
 * loom__error_set's message, and then what it wrote is rolled back while
 * the batch's other writes stay. It must leave no statement of c
 * borrowing arg's memory (done() on each it stepped).
 */
typedef int (*loom__sqlite_write_fn)(loom__sqlite_store *st,
                                     loom__sqlite_conn *c, const void *arg);

/*
 * Queues fn(arg) for the writer thread and waits until the batch that
 * holds it has committed: 0 once what fn wrote is in the WAL, else fn's
 * error (or the batch's: its BEGIN or COMMIT failed, and nothing of fn
 * is written), with its message on this thread.
 */
int loom__sqlite_write(loom__sqlite_store *st, loom__sqlite_write_fn fn,
                       const void *arg);
/* Initializes st->w (before any connection opens; no thread yet). */
void loom__sqlite_writer_init(loom__sqlite_store *st);
/* Starts the writer and checkpointer threads. */
int loom__sqlite_writer_start(loom__sqlite_store *st);
/* Stops them (after the queued writes) and frees what init made. */
void loom__sqlite_writer_free(loom__sqlite_store *st);
/* On a new connection: SQLite's auto-checkpoint off, the store's WAL
 * hook on (it tells the checkpointer how the WAL grows). */
void loom__sqlite_wal_setup(loom__sqlite_store *st, sqlite3 *db);

/* The VFS every store connection opens with (sqlite_walvfs.c): the
 * default one, with each commit's WAL frames written in one call. */
#define LOOM_SQLITE_VFS "loom-wal"
/* Registers it (once); SQLITE_OK or SQLite's code. */
int loom__sqlite_walvfs(void);
/* Writes sent to WAL files through it so far, by every connection. */
long loom__sqlite_walvfs_writes(void);
/* Syncs of WAL files through it so far, by every connection. */
long loom__sqlite_walvfs_syncs(void);
/* For tests: stores opened from now on start their WAL over from frames
 * frames (sqlite_writer.c; the cap is twice that); 0 restores the
 * default. */
void loom__sqlite_wal_restart_at(int frames);

/* Records SQLite's error rc (message from db when there is one) as
 * "store PATH: what: message"; returns the LOOM_E* code. */
int loom__sqlite_error(loom__sqlite_store *st, sqlite3 *db, int rc,
                       const char *what);
/* LOOM_ENOTFOUND: "conversation 'id' not found". */
int loom__sqlite_not_found(const char *id);
/* The cached statement id of c, prepared on first use: an SQLite code
 * (loom__sqlite_stmt), or a LOOM_E* code with the error recorded
 * (loom__sqlite_use). Reset it after use (done(); releasing c does). */
int loom__sqlite_stmt(loom__sqlite_conn *c, int id, sqlite3_stmt **out);
int loom__sqlite_use(loom__sqlite_store *st, loom__sqlite_conn *c, int id,
                     sqlite3_stmt **out);
/* Runs a cached statement that returns no rows; an SQLite code. */
int loom__sqlite_run(loom__sqlite_conn *c, int id);
/* Ends whatever c has running: every statement reset, an open
 * transaction rolled back. */
void loom__sqlite_reset(loom__sqlite_conn *c);
/* Takes an idle connection, opens one, or waits for one. */
int loom__sqlite_acquire(loom__sqlite_store *st, loom__sqlite_conn **out);
/* Gives c back (NULL is a no-op), with no statement running and no
 * transaction open: what an error left open is rolled back. */
void loom__sqlite_release(loom__sqlite_store *st, loom__sqlite_conn *c);
/* BEGIN on c: a read transaction, one snapshot for what follows. */
int loom__sqlite_begin_read(loom__sqlite_store *st, loom__sqlite_conn *c);
/* Conversation id's message count on c; LOOM_ENOTFOUND when absent. */
int loom__sqlite_exists(loom__sqlite_store *st, loom__sqlite_conn *c,
                        const char *id, int64_t *count);

/* The vtable entries of sqlite_conversations.c and sqlite_turn.c. */
int loom__sqlite_conversation_create(loom_store *base, const char *id,
                                     const char *owner, int64_t now);
int loom__sqlite_conversation_info(loom_store *base, const char *id,
                                   loom_conversation_info *out);
int loom__sqlite_conversation_list(loom_store *base, const char *owner,
                                   const char *like, const char *after,
                                   int limit, json_t **out);
int loom__sqlite_conversation_get(loom_store *base, const char *id,
                                  json_t **out);
int loom__sqlite_conversation_delete(loom_store *base, const char *id);
int loom__sqlite_conversation_rename(loom_store *base, const char *id,
                                     const char *title);
int loom__sqlite_load_history(loom_store *base, const char *id,
                              loom_messages *out);
int loom__sqlite_conversation_summary(loom_store *base, const char *id,
                                      char **summary, size_t *covers,
                                      char **plan);
int loom__sqlite_save_turn(loom_store *base, const loom__store_plan *p);

/* Branches (sqlite_branches.c): the vtable's conversation_branch, and
 * what a reader of a conversation adds on c, in its read transaction:
 * "versions" and "version" on each of msgs (the conversation's messages
 * as JSON, in order) that has more than one version, and the
 * conversation's "parent_id" and "fork_message" on conv. */
int loom__sqlite_conversation_branch(loom_store *base, const char *id,
                                     const char *message_id,
                                     const char *branch_id, int64_t now);
int loom__sqlite_versions_on(loom_store *base, loom__sqlite_conn *c,
                             const char *id, json_t *msgs);
int loom__sqlite_branch_info_on(loom_store *base, loom__sqlite_conn *c,
                                const char *id, json_t *conv);

/* A conversation's row as save_turn reads it (loom__sqlite_conv_read)
 * and then writes it back: its message count, and its transcript hashes
 * as the turn extends them. */
typedef struct {
    int64_t count;
    int has_last, has_streamed; /* h.last, h.streamed hold a hash */
    loom__transcript h;
    /* Set by loom__sqlite_transcript_extend: the hashes are to be
     * written (else the row keeps what it has), and this is the
     * conversation's first turn (it gets the turn's user as owner). */
    int extend, first;
} loom__sqlite_conv_row;

/* Transcript hashes (sqlite_transcript.c): the vtable's
 * conversation_match; reading conversation id's row on c (its count and
 * hashes; LOOM_ENOTFOUND when absent); and extending the row's hashes by
 * the plan's turn, in memory (save_turn writes them with the turn). */
int loom__sqlite_conversation_match(loom_store *base, const char *user_id,
                                    const unsigned char *hash, char **id_out);
int loom__sqlite_conv_read(loom__sqlite_store *st, loom__sqlite_conn *c,
                           const char *id, loom__sqlite_conv_row *out);
int loom__sqlite_transcript_extend(loom__sqlite_conv_row *row,
                                   const loom__store_plan *p);

/* Runs (sqlite_runs.c): the vtable's run_get and run_children, and, inside
 * save_turn's write transaction on c, the plan's run row and (for a
 * sub-agent's run) its messages. */
int loom__sqlite_run_get(loom_store *base, const char *id, const char *user_id,
                         json_t **out);
int loom__sqlite_run_children(loom_store *base, const char *id, json_t **out);
int loom__sqlite_run_insert(loom__sqlite_store *st, loom__sqlite_conn *c,
                            const loom__store_plan *p);
int loom__sqlite_run_messages_insert(loom__sqlite_store *st,
                                     loom__sqlite_conn *c,
                                     const loom__store_plan *p);

/* Column i as JSON (integer, real, null or text) and column i's JSON text
 * parsed (NULL when NULL or unparsable), for the readers' JSON. */
json_t *loom__sqlite_col_json(sqlite3_stmt *s, int i);
json_t *loom__sqlite_col_parsed(sqlite3_stmt *s, int i);

/* ---- binding and reading, for every file of the backend --------------- */

/* Resets a statement so it holds no snapshot and no borrowed strings. */
static inline void done(sqlite3_stmt *s)
{
    if (s) {
        sqlite3_reset(s);
        sqlite3_clear_bindings(s);
    }
}

/* Binders that do nothing once *rc holds an error. */
static inline void b_text(sqlite3_stmt *s, int i, const char *v, int *rc)
{
    if (*rc == SQLITE_OK)
        *rc = v ? sqlite3_bind_text64(s, i, v, strlen(v), SQLITE_STATIC,
                                      SQLITE_UTF8)
                : sqlite3_bind_null(s, i);
}

/* Binds len bytes of v (NULL when v is). */
static inline void b_textn(sqlite3_stmt *s, int i, const char *v, size_t len,
                           int *rc)
{
    if (*rc == SQLITE_OK)
        *rc = v ? sqlite3_bind_text64(s, i, v, len, SQLITE_STATIC, SQLITE_UTF8)
                : sqlite3_bind_null(s, i);
}

/* Binds len bytes of v as a blob, borrowed until the statement's reset. */
static inline void b_blob(sqlite3_stmt *s, int i, const void *v, size_t len,
                          int *rc)
{
    if (*rc == SQLITE_OK)
        *rc = sqlite3_bind_blob64(s, i, v, len, SQLITE_STATIC);
}

static inline void b_int(sqlite3_stmt *s, int i, int64_t v, int *rc)
{
    if (*rc == SQLITE_OK)
        *rc = sqlite3_bind_int64(s, i, v);
}

/* Binds v, or NULL when v is negative (unknown). */
static inline void b_real(sqlite3_stmt *s, int i, double v, int *rc)
{
    if (*rc == SQLITE_OK)
        *rc = v >= 0 ? sqlite3_bind_double(s, i, v) : sqlite3_bind_null(s, i);
}

/* Binds micro-dollars, or NULL when v is negative (unknown). */
static inline void b_micros(sqlite3_stmt *s, int i, int64_t v, int *rc)
{
    if (*rc == SQLITE_OK)
        *rc = v >= 0 ? sqlite3_bind_int64(s, i, v) : sqlite3_bind_null(s, i);
}

/* Steps s once: SQLITE_DONE becomes SQLITE_OK; anything else stays. */
static inline int step_done(sqlite3_stmt *s, int rc)
{
    if (rc != SQLITE_OK)
        return rc;
    rc = sqlite3_step(s);
    return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static inline const char *col_text(sqlite3_stmt *s, int i)
{
    return (const char *)sqlite3_column_text(s, i);
}

/* A copy of column i, NULL when SQL NULL; *bad set when out of memory. */
static inline char *col_dup(sqlite3_stmt *s, int i, int *bad)
{
    const char *v = col_text(s, i);
    char *d;

    if (!v)
        return NULL;
    if (!(d = strdup(v)))
        *bad = 1;
    return d;
}

/* ---- sealed secrets (sqlite_secrets.c): the vtable entries ----------- */

int loom__sqlite_mcp_credentials_get(loom_store *st, const char *server,
                                     const char *user_id, unsigned char **out,
                                     size_t *len);
int loom__sqlite_user_settings_get(loom_store *st, const char *user_id,
                                   unsigned char **out, size_t *len);
int loom__sqlite_user_settings_put(loom_store *st, const char *user_id,
                                   const unsigned char *sealed, size_t len,
                                   int64_t now);
int loom__sqlite_mcp_credentials_put(loom_store *st, const char *server,
                                     const char *user_id,
                                     const unsigned char *sealed, size_t len,
                                     int64_t now);
void loom__sqlite_stats(loom_store *st, loom_store_stats *out);
int loom__sqlite_mcp_credentials_delete(loom_store *st, const char *server,
                                        const char *user_id);

/* ---- memories (sqlite_memory.c): the vtable entries ------------------ */

int loom__sqlite_memory_add(loom_store *st, const loom__store_memory *m,
                            char id[LOOM__STORE_ID_SIZE], int *duplicate);
int loom__sqlite_memory_search(loom_store *st, const char *user_id,
                               const char *const *terms, size_t nterms,
                               int limit, json_t **out);
int loom__sqlite_memory_delete(loom_store *st, const char *user_id,
                               const char *id);
int loom__sqlite_memory_count(loom_store *st, const char *user_id,
                              int64_t *out);

/* ---- accounts (sqlite_accounts.c): the vtable entries ---------------- */

int loom__sqlite_key_pepper(loom_store *st, int create,
                            unsigned char out[LOOM__STORE_PEPPER_SIZE]);
int loom__sqlite_key_insert(loom_store *st, const loom__store_key *k);
int loom__sqlite_key_get(loom_store *st, const char *id, loom_key_info *out,
                         unsigned char hash[LOOM__STORE_KEY_HASH_SIZE]);
int loom__sqlite_key_revoke(loom_store *st, const char *id,
                            const loom__store_audit *a, loom_key_info *out);
int loom__sqlite_key_set_limits(loom_store *st, const char *id,
                                const loom_limits *l,
                                const loom__store_audit *a);
int loom__sqlite_user_ensure(loom_store *st, const loom__store_audit *a,
                             int *created);
int loom__sqlite_key_list(loom_store *st, const char *workspace,
                          const char *user, json_t **out);
int loom__sqlite_user_list(loom_store *st, const char *workspace, json_t **out);
int loom__sqlite_workspace_list(loom_store *st, json_t **out);
int loom__sqlite_audit_list(loom_store *st, int limit, json_t **out);
int loom__sqlite_account_limits(loom_store *st, const char *workspace,
                                const char *user, loom_limits *user_out,
                                loom_limits *workspace_out);
int loom__sqlite_account_set_limits(loom_store *st, const char *workspace,
                                    const char *user, const loom_limits *l,
                                    const loom__store_audit *a);
int loom__sqlite_audit_add(loom_store *st, const loom__store_audit *a);
int loom__sqlite_spend_get(loom_store *st, const char *scope,
                           const char *period, int64_t period_start,
                           int64_t *out);
int loom__sqlite_spend_add(loom_store *st, const char *scope,
                           const char *period, int64_t period_start,
                           int64_t micros, int64_t now);
int loom__sqlite_spend_list(loom_store *st, const char *scope_prefix,
                            json_t **out);

/* Research runs (sqlite_research.c): the vtable's research_put,
 * research_get and research_running. */
int loom__sqlite_research_put(loom_store *base,
                              const loom_store_research_write *w, int64_t now);
int loom__sqlite_research_get(loom_store *base, const char *run_id,
                              const char *user_id, int any_user, int events,
                              json_t **out);
int loom__sqlite_research_running(loom_store *base, json_t **out);

/* ---- usage sums (sqlite_usage.c): the vtable entry -------------------- */

int loom__sqlite_usage(loom_store *st, const loom_usage_query *q, long rows,
                       long groups, json_t **out);

#endif
