/*
 * Unit tests of the store's writer thread (src/store/sqlite_writer.c):
 * turns saved from many threads at once go into shared transactions
 * (group commit) and every one is stored whole and readable after the
 * store is closed, a batch with no failing write is one transaction
 * begun once, one failing write in a batch (an unknown conversation, a
 * turn that meets a full disk) fails alone, the batch written again
 * without it, a process
 * killed right after its threads' saves returned keeps every turn it
 * had acknowledged, the WAL is copied back into the database and
 * stays bounded under steady writes, a pause in writes syncs the WAL
 * without starting it over, and a write alone in its batch
 * (no savepoint) that fails leaves nothing behind.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/error.h"
#include "loom/store.h"
#include "store/sqlite_internal.h"
#include "store_fixture.h"
#include "testutil.h"

#include <pthread.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Threads saving one turn each, in one batch (under the writer's
 * BATCH_MAX, 256). */
#define NWRITERS 200
/* Every tenth writer names a conversation that does not exist. */
#define BAD_EVERY 10

typedef struct {
    loom_store *st;
    const char *conversation;
    int k;
    const char *answer; /* NULL: "a k" */
    int rc;
    char why[256];
} writer;

/* Saves turn k (user "q k", assistant answer, else "a k"; one usage
 * row) to conversation; the store's result. */
static int save_answer(loom_store *st, const char *conversation, int k,
                       const char *answer)
{
    loom_messages in = {0}, out = {0};
    loom_turn_record t = {0};
    loom_turn_usage u = {0};
    char q[32], a[32], run[32];
    int rc;

    snprintf(q, sizeof(q), "q %d", k);
    snprintf(a, sizeof(a), "a %d", k);
    snprintf(run, sizeof(run), "run_w%d", k);
    if (loom_messages_add(&in, LOOM_ROLE_USER, q) ||
        loom_messages_add_assistant(&out, answer ? answer : a, NULL, NULL, 0)) {
        loom_messages_free(&in);
        loom_messages_free(&out);
        return LOOM_ENOMEM;
    }
    u.iteration = 1;
    u.usage.prompt_tokens = 10 + k;
    u.usage.completion_tokens = 2;
    u.usage.total_tokens = 12 + k;
    u.cost = -1;
    t.conversation_id = conversation;
    t.run_id = run;
    t.model = "fake/m";
    t.input = &in;
    t.output = &out;
    t.usage = &u;
    t.usage_len = 1;
    t.cost = -1;
    rc = loom_store_save_turn(st, &t);
    loom_messages_free(&in);
    loom_messages_free(&out);
    return rc;
}

static int save_one(loom_store *st, const char *conversation, int k)
{
    return save_answer(st, conversation, k, NULL);
}

static void *write_one(void *arg)
{
    writer *w = arg;

    w->rc = save_answer(w->st, w->conversation, w->k, w->answer);
    snprintf(w->why, sizeof(w->why), "%s", w->rc ? loom_error_last() : "");
    return NULL;
}

static void test_batched_turns(void **state)
{
    char *path = test_db_path("batch.db"), *ids[NWRITERS];
    loom_store *st = test_store_open_ok(path);
    static pthread_t th[NWRITERS];
    static writer w[NWRITERS];
    unsigned long batches, begun;
    int good = 0;

    (void)state;
    for (int k = 0; k < NWRITERS; k++)
        ids[k] = test_conversation_create_ok(st);
    /* Every save queued before the writer takes any: one batch. */
    loom__store_sqlite_hold(st, 1);
    batches = loom__store_sqlite_batches(st);
    begun = loom__store_sqlite_begun(st);
    for (int k = 0; k < NWRITERS; k++) {
        w[k] = (writer){st, k % BAD_EVERY ? ids[k] : "conv_nosuch", k, NULL, -1,
                        ""};
        assert_int_equal(pthread_create(&th[k], NULL, write_one, &w[k]), 0);
    }
    loom__store_sqlite_wait_queued(st, NWRITERS);
    loom__store_sqlite_hold(st, 0);
    for (int k = 0; k < NWRITERS; k++)
        pthread_join(th[k], NULL);
    assert_int_equal(loom__store_sqlite_batches(st), batches + 1);
    /* Written first without savepoints; the first bad one sent it back
     * to be written again, each under its own. */
    assert_int_equal(loom__store_sqlite_begun(st), begun + 2);
    for (int k = 0; k < NWRITERS; k++) {
        if (k % BAD_EVERY == 0) {
            assert_int_equal(w[k].rc, LOOM_ENOTFOUND);
            assert_non_null(strstr(w[k].why, "conv_nosuch"));
            continue;
        }
        if (w[k].rc)
            fprintf(stderr, "writer %d: %s\n", k, w[k].why);
        assert_int_equal(w[k].rc, 0);
        good++;
    }
    loom_store_free(st);

    /* After the store is closed: every good turn is in the file... */
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages"),
                     2 * good);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM usage"), good);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM runs"), good);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages "
                                       "WHERE run_id = 'run_w0'"),
                     0);
    /* ... and reads back, each in its own conversation. */
    st = test_store_open_ok(path);
    for (int k = 0; k < NWRITERS; k++) {
        loom_messages hist = {0};
        char want[32];
        assert_int_equal(loom_store_load_history(st, ids[k], &hist), 0);
        if (k % BAD_EVERY == 0) {
            assert_int_equal(hist.len, 0);
        } else {
            assert_int_equal(hist.len, 2);
            snprintf(want, sizeof(want), "q %d", k);
            assert_string_equal(hist.items[0].content, want);
            snprintf(want, sizeof(want), "a %d", k);
            assert_string_equal(hist.items[1].content, want);
        }
        loom_messages_free(&hist);
        free(ids[k]);
    }
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

/* A batch whose writes all succeed is one transaction, written once. */
static void test_clean_batch_once(void **state)
{
    char *path = test_db_path("batchclean.db"), *ids[8];
    loom_store *st = test_store_open_ok(path);
    pthread_t th[8];
    writer w[8];
    unsigned long batches, begun;

    (void)state;
    for (int k = 0; k < 8; k++)
        ids[k] = test_conversation_create_ok(st);
    loom__store_sqlite_hold(st, 1);
    batches = loom__store_sqlite_batches(st);
    begun = loom__store_sqlite_begun(st);
    for (int k = 0; k < 8; k++) {
        w[k] = (writer){st, ids[k], k, NULL, -1, ""};
        assert_int_equal(pthread_create(&th[k], NULL, write_one, &w[k]), 0);
    }
    loom__store_sqlite_wait_queued(st, 8);
    loom__store_sqlite_hold(st, 0);
    for (int k = 0; k < 8; k++) {
        pthread_join(th[k], NULL);
        assert_int_equal(w[k].rc, 0);
    }
    assert_int_equal(loom__store_sqlite_batches(st), batches + 1);
    assert_int_equal(loom__store_sqlite_begun(st), begun + 1);
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages"), 16);
    for (int k = 0; k < 8; k++)
        free(ids[k]);
    test_db_remove(path);
    free(path);
}

/* A full disk in the middle of a batch: the turn that cannot fit fails
 * with LOOM_EIO, the small ones beside it are stored. */
static void test_full_disk_in_batch(void **state)
{
    char *path = test_db_path("batchfull.db"), *ids[3], *big;
    loom_store *st = test_store_open_ok(path);
    pthread_t th[3];
    writer w[3];
    unsigned long batches;

    (void)state;
    for (int k = 0; k < 3; k++) {
        ids[k] = test_conversation_create_ok(st);
        assert_int_equal(save_one(st, ids[k], 100 + k), 0);
    }
    big = malloc(200001);
    assert_non_null(big);
    memset(big, 'z', 200000);
    big[200000] = '\0';
    /* The file may not grow: the small turns fit in its pages, the big
     * one does not. */
    assert_int_equal(
        loom__store_sqlite_exec_all(st, "PRAGMA max_page_count = 1"), 0);
    loom__store_sqlite_hold(st, 1);
    batches = loom__store_sqlite_batches(st);
    for (int k = 0; k < 3; k++) {
        w[k] = (writer){st, ids[k], k, k == 1 ? big : NULL, -1, ""};
        assert_int_equal(pthread_create(&th[k], NULL, write_one, &w[k]), 0);
    }
    loom__store_sqlite_wait_queued(st, 3);
    loom__store_sqlite_hold(st, 0);
    for (int k = 0; k < 3; k++)
        pthread_join(th[k], NULL);
    assert_int_equal(loom__store_sqlite_batches(st), batches + 1);
    assert_int_equal(w[0].rc, 0);
    assert_int_equal(w[2].rc, 0);
    assert_int_equal(w[1].rc, LOOM_EIO);
    assert_non_null(strstr(w[1].why, "disk full"));
    loom_store_free(st);
    /* Two turns in 0 and 2, one in 1. */
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages"),
                     2 * 3 + 2 * 2);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages "
                                       "WHERE length(content) > 1000"),
                     0);
    for (int k = 0; k < 3; k++)
        free(ids[k]);
    free(big);
    test_db_remove(path);
    free(path);
}

/* ---- kill -9 right after acknowledgements ---- */

#define KILL_THREADS 16
/* The parent kills the child once this many saves were acknowledged. */
#define KILL_AFTER 150

typedef struct {
    loom_store *st;
    const char *conversation;
    int k;
    int fd;
    pthread_mutex_t *fd_lock;
} acker;

/* Saves turns forever (until killed), writing each one's number to fd
 * once its save returned: the acknowledgement. */
static void *ack_loop(void *arg)
{
    acker *a = arg;

    for (int i = 0;; i++) {
        int n = a->k * 100000 + i;
        if (save_one(a->st, a->conversation, n) != 0)
            _exit(3);
        pthread_mutex_lock(a->fd_lock);
        if (write(a->fd, &n, sizeof(n)) != (ssize_t)sizeof(n))
            _exit(4);
        pthread_mutex_unlock(a->fd_lock);
    }
    return NULL;
}

/* The child: one conversation per thread, ids first (NUL-terminated, in
 * order), then acknowledgements until killed. */
static void kill_child(const char *path, int fd)
{
    static acker a[KILL_THREADS];
    static char *ids[KILL_THREADS];
    pthread_mutex_t fd_lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_t th;
    loom_store *st;

    if (loom_store_open(&st, path) != 0)
        _exit(2);
    for (int k = 0; k < KILL_THREADS; k++) {
        if (loom_store_conversation_create(st, &ids[k]) != 0 ||
            write(fd, ids[k], strlen(ids[k]) + 1) !=
                (ssize_t)strlen(ids[k]) + 1)
            _exit(2);
    }
    for (int k = 0; k < KILL_THREADS; k++) {
        a[k] = (acker){st, ids[k], k, fd, &fd_lock};
        if (pthread_create(&th, NULL, ack_loop, &a[k]) != 0)
            _exit(2);
    }
    for (;;)
        pause();
}

static void test_kill_after_acks(void **state)
{
    char *path = test_db_path("killacks.db"), ids[KILL_THREADS][64];
    int fds[2], n, acked = 0, status;
    int last[KILL_THREADS];
    loom_store *st;
    pid_t pid;

    (void)state;
    assert_int_equal(pipe(fds), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        kill_child(path, fds[1]);
    }
    close(fds[1]);
    for (int k = 0; k < KILL_THREADS; k++) {
        size_t got = 0;
        while (got < sizeof(ids[k]) && read(fds[0], ids[k] + got, 1) == 1 &&
               ids[k][got] != '\0')
            got++;
        assert_true(got > 0 && got < sizeof(ids[k]));
        last[k] = -1;
    }
    while (acked < KILL_AFTER &&
           read(fds[0], &n, sizeof(n)) == (ssize_t)sizeof(n)) {
        last[n / 100000] = n % 100000;
        acked++;
    }
    assert_int_equal(acked, KILL_AFTER);
    /* Killed right after the last acknowledgement read. */
    kill(pid, SIGKILL);
    status = test_wait_pid(pid, 60000);
    assert_int_equal(status, 128 + SIGKILL);
    /* Whatever it acknowledged before dying. */
    while (read(fds[0], &n, sizeof(n)) == (ssize_t)sizeof(n)) {
        last[n / 100000] = n % 100000;
        acked++;
    }
    close(fds[0]);

    assert_int_equal(test_db_int(path, "SELECT count(*) FROM "
                                       "pragma_integrity_check "
                                       "WHERE integrity_check = 'ok'"),
                     1);
    st = test_store_open_ok(path);
    for (int k = 0; k < KILL_THREADS; k++) {
        loom_messages hist = {0};
        char want[32];
        assert_int_equal(loom_store_load_history(st, ids[k], &hist), 0);
        /* Whole turns, in order, every acknowledged one there. */
        assert_int_equal(hist.len % 2, 0);
        assert_true(hist.len / 2 >= (size_t)(last[k] + 1));
        for (int i = 0; i <= last[k]; i++) {
            snprintf(want, sizeof(want), "q %d", k * 100000 + i);
            assert_string_equal(hist.items[2 * i].content, want);
            snprintf(want, sizeof(want), "a %d", k * 100000 + i);
            assert_string_equal(hist.items[2 * i + 1].content, want);
        }
        loom_messages_free(&hist);
    }
    loom_store_free(st);
    test_db_remove(path);
    free(path);
}

/* Steady writes: threads saving WAL_TURNS turns of WAL_ANSWER bytes
 * each, about 12,000 WAL frames in all (each answer spills onto two
 * overflow pages, plus the rows and index pages around it). */
#define WAL_THREADS 4
#define WAL_TURNS 500
#define WAL_ANSWER 6000
/* The tests' restart length (loom__sqlite_wal_restart_at: the default's
 * quarter, so that a test writes past it in seconds): the writer starts
 * the WAL over at twice that, 4,000 frames, whatever is left; with the
 * batches that commit before it does and the page size with each
 * frame's header, the WAL file stays under WAL_MAX_BYTES. */
#define WAL_RESTART 2000
#define WAL_MAX_BYTES (5500L * (4096 + 24))

typedef struct {
    loom_store *st;
    char *conversation;
    const char *path_wal;
    const char *answer;
    int k;
    long max_wal; /* the largest WAL size seen after a save */
    int rc;
} wal_writer;

static long file_size(const char *path)
{
    struct stat sb;

    return stat(path, &sb) == 0 ? (long)sb.st_size : 0;
}

/* An answer of WAL_ANSWER bytes; caller frees. */
static char *wal_answer(void)
{
    char *answer = malloc(WAL_ANSWER + 1);

    assert_non_null(answer);
    memset(answer, 'x', WAL_ANSWER);
    answer[WAL_ANSWER] = '\0';
    return answer;
}

static void *wal_write(void *arg)
{
    wal_writer *w = arg;

    for (int i = 0; i < WAL_TURNS && w->rc == 0; i++) {
        long n;
        w->rc =
            save_answer(w->st, w->conversation, w->k * 100000 + i, w->answer);
        if ((n = file_size(w->path_wal)) > w->max_wal)
            w->max_wal = n;
    }
    return NULL;
}

/* The store at path, its WAL started over from WAL_RESTART frames. */
static loom_store *open_short_wal(const char *path)
{
    loom_store *st;

    loom__sqlite_wal_restart_at(WAL_RESTART);
    st = test_store_open_ok(path);
    loom__sqlite_wal_restart_at(0);
    return st;
}

static void test_wal_bounded(void **state)
{
    char *path = test_db_path("wal.db"), wal[512], *answer;
    loom_store *st;
    static wal_writer w[WAL_THREADS];
    pthread_t th[WAL_THREADS];
    long db_size, max_wal = 0;

    (void)state;
    st = open_short_wal(path);
    snprintf(wal, sizeof(wal), "%s-wal", path);
    answer = wal_answer();
    /* A few turns, then a pause: the checkpointer copies them into the
     * database file on its own (once writes paused for ten seconds).
     * Waits for all of them, up to a minute: a checkpoint may land
     * between two of the turns and copy only the first. */
    w[0] =
        (wal_writer){st, test_conversation_create_ok(st), wal, answer, 0, 0, 0};
    db_size = file_size(path);
    for (int i = 0; i < 20; i++)
        assert_int_equal(save_answer(st, w[0].conversation, i, answer), 0);
    for (int i = 0; i < 600 && file_size(path) <= db_size + 20 * WAL_ANSWER;
         i++)
        usleep(100000);
    assert_true(file_size(path) > db_size + 20 * WAL_ANSWER);

    for (int k = 0; k < WAL_THREADS; k++) {
        if (k > 0)
            w[k] = (wal_writer){
                st, test_conversation_create_ok(st), wal, answer, k, 0, 0};
        assert_int_equal(pthread_create(&th[k], NULL, wal_write, &w[k]), 0);
    }
    for (int k = 0; k < WAL_THREADS; k++) {
        pthread_join(th[k], NULL);
        assert_int_equal(w[k].rc, 0);
        if (w[k].max_wal > max_wal)
            max_wal = w[k].max_wal;
    }
    /* Far more than WAL_MAX_BYTES went through the WAL... */
    assert_true(file_size(path) >
                (long)WAL_THREADS * WAL_TURNS * WAL_ANSWER / 2);
    /* ... which never held more than its bound. */
    if (max_wal > WAL_MAX_BYTES)
        fprintf(stderr, "the WAL reached %ld bytes\n", max_wal);
    assert_true(max_wal > 0 && max_wal <= WAL_MAX_BYTES);
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages"),
                     2 * (20 + WAL_THREADS * WAL_TURNS));
    for (int k = 0; k < WAL_THREADS; k++)
        free(w[k].conversation);
    free(answer);
    test_db_remove(path);
    free(path);
}

/* Writes one at a time, as at one request at a time: the checkpointer
 * keeps up, and the writer starts the WAL over once it is WAL_RESTART
 * (2,000) frames long and the checkpointer has left little to copy (a
 * short stall), well before the cap of 4,000 (where what was left to
 * copy stalled commits 10 to 15 ms). The turns here write about 16,000 frames
 * in all, so without that the WAL file would reach the cap's size. The pause
 * between turns leaves the checkpointer a wide margin: it would have to fall
 * about 1,000 frames (some 140 turns, a quarter of a second) behind the writes
 * for the cap to come first. */
#define PACED_TURNS 1200
#define PACED_MAX_BYTES (3400L * (4096 + 24))

static void test_wal_restarted_early(void **state)
{
    char *path = test_db_path("paced.db"), wal[512], *answer, *conversation;
    loom_store *st;
    loom_store_stats s0, s1;
    long max_wal = 0, n;

    (void)state;
    st = open_short_wal(path);
    conversation = test_conversation_create_ok(st);
    snprintf(wal, sizeof(wal), "%s-wal", path);
    answer = wal_answer();
    assert_int_equal(loom_store_stats_get(st, &s0), 0);
    for (int i = 0; i < PACED_TURNS; i++) {
        assert_int_equal(save_answer(st, conversation, i, answer), 0);
        if ((n = file_size(wal)) > max_wal)
            max_wal = n;
        usleep(2000);
    }
    /* What /metrics shows of it: every turn committed in a group commit
     * of its own (one at a time), at least as many commits, the WAL
     * started over several times (16,000 pages, restarts from 2,000),
     * each with the writes held a little, and checkpoints between. */
    assert_int_equal(loom_store_stats_get(st, &s1), 0);
    assert_int_equal(s1.batched - s0.batched, PACED_TURNS);
    assert_true(s1.batches - s0.batches >= PACED_TURNS);
    assert_true(s1.commits - s0.commits >= PACED_TURNS);
    assert_true(s1.wal_restarts - s0.wal_restarts >= 4);
    assert_true(s1.wal_restart_seconds > s0.wal_restart_seconds);
    assert_true(s1.checkpoints - s0.checkpoints >=
                s1.wal_restarts - s0.wal_restarts);
    assert_true(s1.wal_pages > 0 && s1.wal_pages * (4096 + 24) <= max_wal);
    loom_store_free(st);
    if (max_wal > PACED_MAX_BYTES)
        fprintf(stderr, "the WAL reached %ld frames\n", max_wal / (4096 + 24));
    assert_true(max_wal > 0 && max_wal <= PACED_MAX_BYTES);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages"),
                     2 * PACED_TURNS);
    free(conversation);
    free(answer);
    test_db_remove(path);
    free(path);
}

/* A short pause in writes syncs the WAL (its commits are durable from
 * then on) without starting it over, so the next commit does not sync a
 * new WAL's header: no sync at all inside a commit. */
static void test_pause_syncs_wal(void **state)
{
    char *path = test_db_path("pause.db");
    loom_store *st = test_store_open_ok(path);
    char *conversation = test_conversation_create_ok(st);
    long syncs;
    int i;

    (void)state;
    assert_int_equal(save_one(st, conversation, 1), 0);
    syncs = loom__sqlite_walvfs_syncs();
    /* The pause: the WAL is synced after half a second. */
    for (i = 0; i < 100 && loom__sqlite_walvfs_syncs() == syncs; i++)
        usleep(50000);
    assert_true(loom__sqlite_walvfs_syncs() > syncs);
    /* Turns after it, each after a pause shorter than a checkpoint's:
     * none syncs. */
    for (int k = 2; k < 5; k++) {
        usleep(700000);
        syncs = loom__sqlite_walvfs_syncs();
        assert_int_equal(save_one(st, conversation, k), 0);
        assert_int_equal(loom__sqlite_walvfs_syncs(), syncs);
    }
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages"), 8);
    free(conversation);
    test_db_remove(path);
    free(path);
}

/* A write that inserts a conversation row (arg: its id), then fails. */
static int write_half(loom__sqlite_store *st, loom__sqlite_conn *c,
                      const void *arg)
{
    char *sql = sqlite3_mprintf("INSERT INTO conversations (id, title, "
                                "created_at, updated_at, message_count) "
                                "VALUES (%Q, '', 1, 1, 0)",
                                (const char *)arg);
    int rc = sqlite3_exec(c->db, sql, NULL, NULL, NULL);

    (void)st;
    sqlite3_free(sql);
    assert_int_equal(rc, SQLITE_OK);
    return loom__error_set(LOOM_EINVALID, "failed half way");
}

typedef struct {
    loom__sqlite_store *st;
    const char *id;
    int rc;
} half_writer;

static void *write_half_thread(void *arg)
{
    half_writer *h = arg;

    h->rc = loom__sqlite_write(h->st, write_half, h->id);
    return NULL;
}

/* A write alone in its batch (run inline by its caller, or by the writer
 * thread) that fails after writing leaves nothing of it, reports its
 * error, and the writes after it are stored. */
static void test_lone_write_fails(void **state)
{
    char *path = test_db_path("lone.db");
    loom_store *st = test_store_open_ok(path);
    char *id = test_conversation_create_ok(st);
    half_writer h = {(loom__sqlite_store *)st, "conv_held", -1};
    pthread_t th;

    (void)state;
    assert_int_equal(loom__sqlite_write(h.st, write_half, "conv_inline"),
                     LOOM_EINVALID);
    assert_non_null(strstr(loom_error_last(), "failed half way"));
    assert_int_equal(save_one(st, id, 1), 0);
    /* The same through the writer thread: held until queued. */
    loom__store_sqlite_hold(st, 1);
    assert_int_equal(pthread_create(&th, NULL, write_half_thread, &h), 0);
    loom__store_sqlite_wait_queued(st, 1);
    loom__store_sqlite_hold(st, 0);
    pthread_join(th, NULL);
    assert_int_equal(h.rc, LOOM_EINVALID);
    assert_int_equal(save_one(st, id, 2), 0);
    loom_store_free(st);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM conversations"),
                     1);
    assert_int_equal(test_db_int(path, "SELECT count(*) FROM messages"), 4);
    free(id);
    test_db_remove(path);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batched_turns),
        cmocka_unit_test(test_clean_batch_once),
        cmocka_unit_test(test_full_disk_in_batch),
        cmocka_unit_test(test_kill_after_acks),
        cmocka_unit_test(test_wal_bounded),
        cmocka_unit_test(test_wal_restarted_early),
        cmocka_unit_test(test_pause_syncs_wal),
        cmocka_unit_test(test_lone_write_fails),
    };

    return cmocka_run_group_tests(tests, NULL, NULL);
}
