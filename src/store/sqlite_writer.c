/*
 * The SQLite backend's writer thread and checkpointer: the store off the
 * request path.
 *
 * Turns (and new conversations) are not written by the thread that asks:
 * loom__sqlite_write() queues the write and waits on its completion, and
 * one writer thread takes everything queued, runs it in one transaction
 * and commits once for all of them: group commit. A batch is first
 * written without savepoints: a savepoint costs SQLite a copy of every
 * page a write then changes first (its statement journal): about 25 us
 * of CPU a request at 64 connections, 7% of loom's. Writes rarely fail. When
 * one does, the transaction is rolled back whole and the batch written again
 * without it, this time each write under a savepoint of its own, so a later
 * failure is rolled back alone. While a
 * batch commits, the next one gathers. A caller returns only after its
 * batch committed, so whatever it then acknowledges (an answer sent, a
 * stream's final event, a run reported completed) is in the WAL and
 * survives the process being killed.
 *
 * A write that finds nothing queued and the writer idle, while writes
 * come one at a time, is written by its own thread instead
 * (write_inline): at one request at a time the two thread hand-offs
 * would cost more than the commit.
 *
 * SQLite's own auto-checkpoint would copy the WAL back into the database,
 * with its fsyncs, inside whichever commit crosses 1,000 frames: one
 * request in many would pay for it. Every connection has it off; the WAL
 * hook tells a checkpointer thread how far the WAL has grown, and it runs
 * a PASSIVE checkpoint on its own connection when the WAL holds
 * CKPT_FRAMES frames not yet copied, or when writes have paused for
 * CKPT_QUIET_MS. PASSIVE never waits for readers or writers, so commits
 * go on while it runs.
 *
 * A shorter pause (CKPT_IDLE_MS) syncs the WAL instead (wal_sync): the
 * commits are as durable as a checkpoint makes them, but the WAL is not
 * started over. Starting it over costs the next commit a sync of the new
 * WAL's header (SQLite does it inside that commit, about 0.4 ms here), so
 * with a checkpoint at every short pause, a server answering a few
 * requests a second paid it in nearly every request.
 */
#include "core/clock.h"
#include "core/error.h"
#include "core/fiber.h"
#include "store/completion.h"
#include "store/sqlite_internal.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

/* Writes in one transaction at most. */
#define BATCH_MAX 256
/* Batches of one in a row after which a lone write is written inline
 * again (write_inline). */
#define SOLO_AFTER 16
/* Frames (pages) in the WAL, not yet copied back, that call for a
 * checkpoint: SQLite's own default. */
#define CKPT_FRAMES 1000
/* A pause in commits this long calls for a sync of the WAL... */
#define CKPT_IDLE_MS 500
/* ... and this long for a checkpoint of what is left. */
#define CKPT_QUIET_MS 10000
/* A WAL this long (frames) is started over by the writer between two
 * batches: the cap, twice the restart length below (wal_full).
 * SQLite starts the WAL over at a write only once a checkpoint copied
 * all of it and no reader still uses it; under steady writes and reads
 * the checkpointer's PASSIVE checkpoints beside them rarely find that
 * moment, and the WAL would grow without end (here, 48 KB a request).
 * The writer's RESTART checkpoint runs with no commit beside it and
 * waits (the busy timeout) for the readers of older snapshots, so the
 * next write starts the WAL over.
 *
 * Commits wait while that checkpoint copies what is left, and at the cap
 * that is about a checkpoint's worth: a checkpointer's pass of
 * CKPT_FRAMES takes about 10 ms here, so a restart there stalled the
 * commits 10 to 15 ms. So from the restart length on, the checkpointer
 * copies what came during its pass again at once, up to CKPT_CHASE times
 * (each pass copies what came during the one before: about 1,000, 300,
 * 80 frames), and once no more than CKPT_TAIL_FRAMES are left it has the
 * writer start the WAL over (restart_due): a stall of 3 to 6 ms, most of
 * it the two syncs, whatever the WAL's length. The cap stays for a
 * checkpointer that cannot catch up (writes as fast as it copies).
 *
 * The restart length sets how often the stall comes: a chat completion
 * writes about 15 frames, so at 2,000 frames one request in 130 paid it
 * at one request at a time (0.75%: the 99th percentile moved with it,
 * 1.5 to 3 ms), at 8,000 one in 530 (bench/serve/README.md, round
 * thirteen). The WAL file then grows to about 32 MB (64 MB at the cap);
 * what is not yet synced stays CKPT_FRAMES at most, as before. */
#define CKPT_RESTART_FRAMES (8 * CKPT_FRAMES)
#define CKPT_CHASE 4
#define CKPT_TAIL_FRAMES 100

/* The restart length of stores opened from now on; tests shorten it
 * (loom__sqlite_wal_restart_at). */
static atomic_int restart_default = CKPT_RESTART_FRAMES;

void loom__sqlite_wal_restart_at(int frames)
{
    atomic_store(&restart_default, frames > 0 ? frames : CKPT_RESTART_FRAMES);
}

enum { J_PENDING, J_WRITTEN, J_FAILED };

struct loom__sqlite_job {
    loom__sqlite_write_fn fn;
    const void *arg;
    int state;
    int rc;
    char msg[1024]; /* the error's message, when rc */
    loom__completion done;
    loom__sqlite_job *next;
};

/* ---- the writer ------------------------------------------------------ */

static void job_fail(loom__sqlite_job *j, int rc)
{
    j->state = J_FAILED;
    j->rc = rc;
    snprintf(j->msg, sizeof(j->msg), "%s", loom_error_last());
}

/* Resets every statement of c, so none holds a write or borrowed memory. */
static void reset_all(loom__sqlite_conn *c)
{
    for (int i = 0; i < S_COUNT; i++)
        done(c->stmts[i]);
}

/*
 * Runs the batch's pending writes on c, inside its open transaction;
 * with savepoints set, each under a savepoint, so one that fails is
 * marked and rolled back alone. A batch of one needs no savepoint: its
 * transaction is its write's, rolled back whole when it fails. 0; 1 when
 * the batch's only write failed and the transaction is rolled back
 * (nothing to commit); or -1 when a failure ended the whole transaction
 * (a write without a savepoint failed, or SQLite rolled back on its own,
 * as on a full disk): the failed write is marked, the ones written are
 * pending again, for the caller to begin anew without it.
 */
static int run_jobs(loom__sqlite_store *st, loom__sqlite_conn *c,
                    loom__sqlite_job *batch, int savepoints)
{
    int alone = !batch->next, sp = savepoints && !alone;

    for (loom__sqlite_job *j = batch; j; j = j->next) {
        int rc = 0, src;

        if (j->state != J_PENDING)
            continue;
        if (sp && (src = loom__sqlite_run(c, S_SAVEPOINT)) != SQLITE_OK)
            rc = loom__sqlite_error(st, c->db, src, "starting a write");
        if (rc == 0)
            rc = j->fn(st, c, j->arg);
        if (rc == 0 && sp &&
            (src = loom__sqlite_run(c, S_RELEASE)) != SQLITE_OK)
            rc = loom__sqlite_error(st, c->db, src, "ending a write");
        if (rc == 0) {
            j->state = J_WRITTEN;
            continue;
        }
        job_fail(j, rc);
        reset_all(c);
        if (alone) {
            if (!sqlite3_get_autocommit(c->db))
                loom__sqlite_run(c, S_ROLLBACK);
            return 1;
        }
        if (!sp || sqlite3_get_autocommit(c->db) ||
            loom__sqlite_run(c, S_ROLLBACK_TO) != SQLITE_OK ||
            loom__sqlite_run(c, S_RELEASE) != SQLITE_OK) {
            if (!sqlite3_get_autocommit(c->db))
                loom__sqlite_run(c, S_ROLLBACK);
            for (loom__sqlite_job *k = batch; k; k = k->next)
                if (k->state == J_WRITTEN)
                    k->state = J_PENDING;
            return -1;
        }
    }
    return 0;
}

/* Writes the batch in one transaction and signals each of its writes;
 * under the store's write lock, which it releases. */
static void run_batch_locked(loom__sqlite_store *st, loom__sqlite_job *batch)
{
    loom__sqlite_conn *c = NULL;
    loom__sqlite_job *next;
    int rc, src, ran, savepoints = 0;

    rc = st->w.conn ? 0 : loom__sqlite_acquire(st, &st->w.conn);
    c = st->w.conn;
    while (rc == 0) {
        if ((src = loom__sqlite_run(c, S_BEGIN_WRITE)) != SQLITE_OK) {
            rc = loom__sqlite_error(st, c->db, src, "starting a write");
            break;
        }
        st->w.begun++;
        /* Again without the failed write, the others under savepoints. */
        if ((ran = run_jobs(st, c, batch, savepoints)) < 0) {
            savepoints = 1;
            continue;
        }
        if (ran == 0 && (src = loom__sqlite_run(c, S_COMMIT)) != SQLITE_OK)
            rc = loom__sqlite_error(st, c->db, src, "committing writes");
        break;
    }
    for (loom__sqlite_job *j = batch; j; j = j->next)
        if (rc != 0 && j->state != J_FAILED)
            job_fail(j, rc);
        else if (rc == 0 && j->state == J_WRITTEN)
            atomic_fetch_add_explicit(&st->w.written, 1, memory_order_relaxed);
    /* Rolls back whatever a failed COMMIT left open. */
    if (c)
        loom__sqlite_reset(c);
    pthread_mutex_unlock(&st->write_lock);
    for (loom__sqlite_job *j = batch; j; j = next) {
        next = j->next;
        loom__completion_signal(&j->done);
    }
}

static void run_batch(loom__sqlite_store *st, loom__sqlite_job *batch)
{
    /* As every writer: the write lock before a connection. */
    pthread_mutex_lock(&st->write_lock);
    run_batch_locked(st, batch);
}

static void wal_checkpoint(loom__sqlite_writer *w, sqlite3 *db, int mode);

/* Whether the writer should start the WAL over: it is at the cap (twice
 * the restart length), or the checkpointer caught up with it
 * (restart_due). */
static int wal_full(loom__sqlite_writer *w)
{
    int full;

    pthread_mutex_lock(&w->ckpt_lock);
    full = w->wal_frames >= 2 * w->restart_frames || w->restart_due;
    pthread_mutex_unlock(&w->ckpt_lock);
    return full;
}

/* When the WAL is full (wal_full), copies what is left of it on
 * the writer's connection with no write beside it, so that the next
 * write starts it over (commits wait meanwhile: the cost of a bounded
 * WAL under steady writes). On the writer thread only: it may wait for
 * readers up to the busy timeout. */
static void catch_up(loom__sqlite_store *st)
{
    loom__sqlite_writer *w = &st->w;
    double t0;

    if (!wal_full(w) || !w->conn)
        return;
    pthread_mutex_lock(&st->write_lock);
    t0 = loom__mono_ms_exact();
    wal_checkpoint(w, w->conn->db, SQLITE_CHECKPOINT_RESTART);
    pthread_mutex_lock(&w->ckpt_lock);
    w->restart_seconds += (loom__mono_ms_exact() - t0) / 1000.0;
    pthread_mutex_unlock(&w->ckpt_lock);
    pthread_mutex_unlock(&st->write_lock);
}

/* Whether the writer thread has work it may start now. Under lock. */
static int writer_may_start(const loom__sqlite_writer *w)
{
    if (w->busy)
        return 0;
    return w->catch_up_due || (w->head && (!w->hold || w->stop));
}

static void *writer_main(void *arg)
{
    loom__sqlite_store *st = arg;
    loom__sqlite_writer *w = &st->w;
    loom__sqlite_job *batch, *last;
    int n, single;

    pthread_setname_np(pthread_self(), "loom-store");
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (!writer_may_start(w) && !(w->stop && !w->busy))
            pthread_cond_wait(&w->work, &w->lock);
        if (!writer_may_start(w))
            break;
        /* Everything queued while the previous batch committed. */
        batch = NULL;
        if (w->head) {
            batch = last = w->head;
            n = 1;
            for (; n < BATCH_MAX && last->next; n++)
                last = last->next;
            w->head = last->next;
            if (!w->head)
                w->tail = NULL;
            last->next = NULL;
            w->queued -= n;
            w->batches++;
        }
        w->catch_up_due = 0;
        w->busy = 1;
        pthread_mutex_unlock(&w->lock);
        /* The jobs are their callers' and end with run_batch(). */
        single = batch && !batch->next;
        if (batch)
            run_batch(st, batch);
        catch_up(st);
        pthread_mutex_lock(&w->lock);
        w->busy = 0;
        /* SOLO_AFTER batches of one in a row, nothing queued behind
         * them: writes come one at a time again. */
        w->singles = single && !w->head ? w->singles + 1 : 0;
        if (w->singles >= SOLO_AFTER)
            w->solo = 1;
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/*
 * A write that finds the writer idle and nothing queued (and the write
 * lock free: the caller took it) is written by its own thread at once,
 * a batch of one: at one request at a time this
 * saves the two thread hand-offs (to the writer and back) each write
 * would otherwise cost. Writes that come meanwhile queue for the writer
 * thread, woken when this one ends. A WAL grown full is left to the
 * writer thread (its checkpoint may wait for readers).
 */
static void write_inline(loom__sqlite_store *st, loom__sqlite_job *j)
{
    loom__sqlite_writer *w = &st->w;
    int full;

    run_batch_locked(st, j);
    full = wal_full(w);
    pthread_mutex_lock(&w->lock);
    w->busy = 0;
    /* Others wrote meanwhile: batches serve them better. */
    if (w->head)
        w->solo = 0;
    if (full)
        w->catch_up_due = 1;
    if (w->head || full)
        pthread_cond_broadcast(&w->work);
    pthread_mutex_unlock(&w->lock);
}

/* Queues j for the writer thread. Under w->lock, which it drops. */
static void enqueue(loom__sqlite_writer *w, loom__sqlite_job *j)
{
    if (w->tail)
        w->tail->next = j;
    else
        w->head = j;
    w->tail = j;
    w->queued++;
    /* The writer, and a test waiting for the queue to fill. */
    pthread_cond_broadcast(&w->work);
    pthread_mutex_unlock(&w->lock);
}

typedef struct {
    loom__sqlite_store *st;
    loom__sqlite_job *j;
} submit_call;

/* Writes j at once when the writer is idle (write_inline), else queues
 * it for the writer thread. */
static void submit(void *arg)
{
    submit_call *c = arg;
    loom__sqlite_store *st = c->st;
    loom__sqlite_writer *w = &st->w;

    pthread_mutex_lock(&w->lock);
    /* The write lock is only tried: another write holding it (a
     * conversation deleted, say) must not stall this thread, which may
     * run other fibers. */
    if (w->solo && !w->busy && !w->head && !w->hold && !w->stop &&
        !w->catch_up_due && pthread_mutex_trylock(&st->write_lock) == 0) {
        w->busy = 1;
        w->batches++;
        pthread_mutex_unlock(&w->lock);
        write_inline(st, c->j);
    } else {
        enqueue(w, c->j);
    }
}

int loom__sqlite_write(loom__sqlite_store *st, loom__sqlite_write_fn fn,
                       const void *arg)
{
    loom__sqlite_job j = {.fn = fn, .arg = arg, .state = J_PENDING};
    submit_call c = {st, &j};

    loom__completion_init(&j.done);
    /* On a fiber, on its worker's stack: SQLite's b-tree code goes deeper
     * than the one page of stack a stream's fiber touches otherwise, and
     * that page would stay with the fiber. The locks are taken and
     * released there too (ThreadSanitizer takes a fiber for a thread of
     * its own); the wait for a queued write parks the fiber as before. */
    loom__fiber_on_worker(submit, &c);
    loom__completion_wait(&j.done);
    loom__completion_destroy(&j.done);
    return j.rc ? loom__error_set(j.rc, "%s", j.msg) : 0;
}

void loom__store_sqlite_hold(loom_store *base, int on)
{
    loom__sqlite_writer *w = &((loom__sqlite_store *)base)->w;

    pthread_mutex_lock(&w->lock);
    w->hold = on;
    pthread_cond_broadcast(&w->work);
    pthread_mutex_unlock(&w->lock);
}

void loom__store_sqlite_wait_queued(loom_store *base, int n)
{
    loom__sqlite_writer *w = &((loom__sqlite_store *)base)->w;

    pthread_mutex_lock(&w->lock);
    while (w->queued < n)
        pthread_cond_wait(&w->work, &w->lock);
    pthread_mutex_unlock(&w->lock);
}

unsigned long loom__store_sqlite_batches(loom_store *base)
{
    loom__sqlite_writer *w = &((loom__sqlite_store *)base)->w;
    unsigned long n;

    pthread_mutex_lock(&w->lock);
    n = w->batches;
    pthread_mutex_unlock(&w->lock);
    return n;
}

void loom__sqlite_stats(loom_store *base, loom_store_stats *out)
{
    loom__sqlite_writer *w = &((loom__sqlite_store *)base)->w;

    out->batches = loom__store_sqlite_batches(base);
    out->batched = atomic_load_explicit(&w->written, memory_order_relaxed);
    pthread_mutex_lock(&w->ckpt_lock);
    out->commits = w->commits;
    out->checkpoints = w->checkpoints;
    out->wal_restarts = w->restarts;
    out->wal_restart_seconds = w->restart_seconds;
    out->wal_pages = w->wal_frames;
    pthread_mutex_unlock(&w->ckpt_lock);
}

unsigned long loom__store_sqlite_begun(loom_store *base)
{
    loom__sqlite_store *st = (loom__sqlite_store *)base;
    unsigned long n;

    pthread_mutex_lock(&st->write_lock);
    n = st->w.begun;
    pthread_mutex_unlock(&st->write_lock);
    return n;
}

/* ---- checkpoints ----------------------------------------------------- */

/* Frames in the WAL not yet copied back. Under ckpt_lock. */
static int pending_frames(const loom__sqlite_writer *w)
{
    return w->wal_frames - w->backfilled;
}

/* SQLite calls this after each commit on every connection of the store,
 * with the WAL's size in frames. */
static int wal_hook(void *arg, sqlite3 *db, const char *name, int frames)
{
    loom__sqlite_writer *w = arg;
    int before;

    (void)db;
    (void)name;
    pthread_mutex_lock(&w->ckpt_lock);
    before = pending_frames(w);
    /* A smaller WAL: a writer started it over after a checkpoint. */
    if (frames < w->wal_frames) {
        w->backfilled = w->restart_due = 0;
        w->restarts++;
    }
    w->wal_frames = frames;
    w->commits++;
    /* Wake the checkpointer when it waits for a first commit, or for a
     * quiet WAL it has synced, or the WAL is past the threshold. */
    if (before <= 0 || w->ckpt_quiet || pending_frames(w) >= CKPT_FRAMES)
        pthread_cond_signal(&w->ckpt_cv);
    pthread_mutex_unlock(&w->ckpt_lock);
    return SQLITE_OK;
}

void loom__sqlite_wal_setup(loom__sqlite_store *st, sqlite3 *db)
{
    sqlite3_wal_autocheckpoint(db, 0);
    sqlite3_wal_hook(db, wal_hook, &st->w);
}

/* Copies the WAL back into the database on db, in SQLite's checkpoint
 * mode, one checkpoint at a time. A failure (another process holding a
 * lock, a full disk, readers past the busy timeout) is left for the
 * next time. */
static void wal_checkpoint(loom__sqlite_writer *w, sqlite3 *db, int mode)
{
    int log = 0, copied = 0, rc;

    pthread_mutex_lock(&w->ckpt_run);
    rc = sqlite3_wal_checkpoint_v2(db, NULL, mode, &log, &copied);
    pthread_mutex_unlock(&w->ckpt_run);
    pthread_mutex_lock(&w->ckpt_lock);
    if (rc == SQLITE_OK && copied > 0 && w->wal_frames >= copied) {
        if (copied > w->backfilled)
            w->checkpoints++;
        w->backfilled = copied;
    }
    pthread_mutex_unlock(&w->ckpt_lock);
}

/* wal_checkpoint() from the checkpointer, under ckpt_lock (dropped
 * meanwhile). */
static void checkpoint(loom__sqlite_writer *w, sqlite3 *db)
{
    pthread_mutex_unlock(&w->ckpt_lock);
    wal_checkpoint(w, db, SQLITE_CHECKPOINT_PASSIVE);
    pthread_mutex_lock(&w->ckpt_lock);
}

/* Syncs the WAL through db's own handle of it (the checkpointer's
 * connection opened it at its first read); what other connections wrote
 * is in the same file. 0, or -1 when db has no WAL open or the sync
 * failed: a checkpoint (which syncs too) is then due. */
static int wal_sync(sqlite3 *db)
{
    sqlite3_file *f = NULL;

    if (sqlite3_file_control(db, "main", SQLITE_FCNTL_JOURNAL_POINTER, &f) !=
            SQLITE_OK ||
        !f || !f->pMethods)
        return -1;
    return f->pMethods->xSync(f, SQLITE_SYNC_NORMAL) == SQLITE_OK ? 0 : -1;
}

/* Now plus ms, on the clock of ckpt_cv. */
static struct timespec deadline(int ms)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

static void *checkpointer_main(void *arg)
{
    loom__sqlite_store *st = arg;
    loom__sqlite_writer *w = &st->w;
    /* Commits the newest checkpoint saw: none since, nothing to copy.
     * Commits the newest sync of the WAL saw. */
    unsigned long seen = 0, synced = 0;
    sqlite3 *db = NULL;

    pthread_setname_np(pthread_self(), "loom-checkpoint");
    pthread_mutex_lock(&w->ckpt_lock);
    db = w->ckpt_db;
    while (!w->ckpt_stop) {
        if (pending_frames(w) <= 0 || w->commits == seen) {
            pthread_cond_wait(&w->ckpt_cv, &w->ckpt_lock);
        } else if (pending_frames(w) >= CKPT_FRAMES) {
            seen = w->commits;
            checkpoint(w, db);
            /* A long WAL: catch up with the commits, for the writer to
             * start it over (restart_frames). */
            for (int i = 0; i < CKPT_CHASE && !w->ckpt_stop &&
                            w->wal_frames >= w->restart_frames &&
                            pending_frames(w) > CKPT_TAIL_FRAMES;
                 i++) {
                seen = w->commits;
                checkpoint(w, db);
            }
            if (w->wal_frames >= w->restart_frames &&
                pending_frames(w) <= CKPT_TAIL_FRAMES && !w->restart_due) {
                w->restart_due = 1;
                pthread_mutex_unlock(&w->ckpt_lock);
                pthread_mutex_lock(&w->lock);
                w->catch_up_due = 1;
                pthread_cond_broadcast(&w->work);
                pthread_mutex_unlock(&w->lock);
                pthread_mutex_lock(&w->ckpt_lock);
            }
        } else {
            /* Idle: no commit for CKPT_IDLE_MS (a sync is due), or for
             * CKPT_QUIET_MS since (a checkpoint). */
            unsigned long at = w->commits;
            struct timespec ts = deadline(
                synced == at ? CKPT_QUIET_MS - CKPT_IDLE_MS : CKPT_IDLE_MS);
            int rc = 0;

            w->ckpt_quiet = synced == at;
            while (!w->ckpt_stop && w->commits == at && rc != ETIMEDOUT &&
                   pending_frames(w) < CKPT_FRAMES)
                rc = pthread_cond_timedwait(&w->ckpt_cv, &w->ckpt_lock, &ts);
            w->ckpt_quiet = 0;
            if (rc != ETIMEDOUT || w->commits != at)
                continue;
            if (synced != at) {
                synced = at;
                pthread_mutex_unlock(&w->ckpt_lock);
                rc = wal_sync(db);
                pthread_mutex_lock(&w->ckpt_lock);
                if (rc == 0)
                    continue;
            }
            seen = w->commits;
            checkpoint(w, db);
        }
    }
    pthread_mutex_unlock(&w->ckpt_lock);
    return NULL;
}

/* ---- starting and stopping ------------------------------------------ */

void loom__sqlite_writer_init(loom__sqlite_store *st)
{
    loom__sqlite_writer *w = &st->w;
    pthread_condattr_t attr;

    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->work, NULL);
    w->solo = 1;
    pthread_mutex_init(&w->ckpt_lock, NULL);
    pthread_mutex_init(&w->ckpt_run, NULL);
    w->restart_frames = atomic_load(&restart_default);
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&w->ckpt_cv, &attr);
    pthread_condattr_destroy(&attr);
}

int loom__sqlite_writer_start(loom__sqlite_store *st)
{
    loom__sqlite_writer *w = &st->w;
    const char *what = "cannot open";
    int rc;

    /* The checkpointer's own connection, outside the pool. */
    rc = sqlite3_open_v2(st->path, &w->ckpt_db,
                         SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX,
                         LOOM_SQLITE_VFS);
    if (rc == SQLITE_OK) {
        sqlite3_busy_timeout(w->ckpt_db, 0);
        sqlite3_wal_autocheckpoint(w->ckpt_db, 0);
        /* A connection that has not read the database yet has not opened
         * its WAL, and SQLite before 3.42 (Debian 12 ships 3.40) makes a
         * checkpoint on it a silent no-op: the WAL would grow without
         * end. One read opens it. */
        what = "cannot read";
        rc = sqlite3_exec(w->ckpt_db, "SELECT count(*) FROM sqlite_schema",
                          NULL, NULL, NULL);
    }
    if (rc != SQLITE_OK) {
        rc = w->ckpt_db ? loom__sqlite_error(st, w->ckpt_db, rc, what)
                        : loom__error_oom();
        sqlite3_close(w->ckpt_db);
        w->ckpt_db = NULL;
        return rc;
    }
    if (pthread_create(&w->writer, NULL, writer_main, st) != 0)
        return loom__error_set(
            LOOM_ERROR, "store %s: cannot start the writer thread", st->path);
    w->started = 1;
    if (pthread_create(&w->checkpointer, NULL, checkpointer_main, st) != 0)
        return loom__error_set(
            LOOM_ERROR, "store %s: cannot start the checkpointer", st->path);
    w->started = 2;
    return 0;
}

void loom__sqlite_writer_free(loom__sqlite_store *st)
{
    loom__sqlite_writer *w = &st->w;

    pthread_mutex_lock(&w->lock);
    w->stop = 1;
    pthread_cond_signal(&w->work);
    pthread_mutex_unlock(&w->lock);
    pthread_mutex_lock(&w->ckpt_lock);
    w->ckpt_stop = 1;
    pthread_cond_signal(&w->ckpt_cv);
    pthread_mutex_unlock(&w->ckpt_lock);
    if (w->started > 0)
        pthread_join(w->writer, NULL);
    if (w->started > 1)
        pthread_join(w->checkpointer, NULL);
    sqlite3_close(w->ckpt_db);
    loom__sqlite_release(st, w->conn);
    w->conn = NULL;
    pthread_mutex_destroy(&w->ckpt_run);
    pthread_cond_destroy(&w->work);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->ckpt_cv);
    pthread_mutex_destroy(&w->ckpt_lock);
}
