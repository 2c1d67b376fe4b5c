/*
 * A SQLite VFS that writes each commit's WAL frames with one system call.
 *
 * SQLite (3.40, Debian 12) appends a transaction to the WAL one frame at
 * a time, and each frame as two writes: its 24-byte header, then its
 * page. A chat completion's turn is about 13 pages, so 26 pwrite calls,
 * each taking the file's lock and doing the page cache's per-page work
 * for one or two pages (a header and a page straddle three): at one
 * request at a time, the WAL's writes were a seventh of loom's CPU
 * (bench/serve/README.md, "Round six"). No SQLite option or
 * Debian package batches them, so this shim does, on top of the default
 * VFS ("unix"), and nothing else:
 *
 * - Files other than a WAL are opened by the default VFS straight into
 *   the shim's file object (its size covers both), so they keep the
 *   default VFS's own methods and cost nothing more.
 * - A WAL file's writes that follow one another are gathered in a buffer
 *   (up to WAL_BUF bytes; a write that does not follow, or would not
 *   fit, sends what is gathered first) and sent as one write.
 * - What is gathered is sent before anything else touches the file
 *   (read, size, sync, truncate, lock, file control, close), and at the
 *   end of each commit: a frame header whose "database size" field is not
 *   zero marks a commit frame, and the write of the page after it sends
 *   the buffer and returns its result. SQLite makes a commit visible to
 *   other connections (the WAL-index header) only after that write has
 *   returned SQLITE_OK, so no reader, in this process or another, can see
 *   a frame that is not in the file; a failed write (a full disk) fails
 *   the commit as the page's own write would have, with the default
 *   VFS's error code, and the frames gathered are dropped (SQLite never
 *   uses frames of a transaction that did not commit).
 *
 * The bytes and offsets written are those SQLite asked for, so the file is
 * the same; only the number of calls changes. Durability is unchanged: with
 * synchronous=NORMAL no commit is synced, and a sync sends the buffer first.
 */
#include "store/sqlite_internal.h"

#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* The default VFS writes at most 128 KiB - 1 bytes a call (it masks the
 * length with 0x1ffff, so a longer buffer would be cut short): 96 KiB is
 * 23 frames of 4 KiB pages. */
#define WAL_BUF (96 * 1024)
#define FRAME_HDR 24 /* a WAL frame's header (the file's own is 32) */

typedef struct {
    sqlite3_file base;  /* methods: wal_methods */
    sqlite3_file *real; /* the default VFS's file, right after this */
    unsigned char *buf; /* writes gathered, from buf_off */
    size_t len;
    sqlite3_int64 buf_off;
    int commit_next; /* the last write was a commit frame's header */
} wal_file;

static sqlite3_vfs walvfs;
static sqlite3_vfs *base_vfs;
static pthread_once_t walvfs_once = PTHREAD_ONCE_INIT;
static int walvfs_rc = SQLITE_OK;
static atomic_long walvfs_writes, walvfs_syncs;

/* Sends what is gathered; drops it either way. */
static int wal_send(wal_file *f)
{
    int rc;

    if (!f->len)
        return SQLITE_OK;
    rc = f->real->pMethods->xWrite(f->real, f->buf, (int)f->len, f->buf_off);
    atomic_fetch_add_explicit(&walvfs_writes, 1, memory_order_relaxed);
    f->len = 0;
    return rc;
}

static int wal_close(sqlite3_file *p)
{
    wal_file *f = (wal_file *)p;
    int rc = wal_send(f), rc2 = f->real->pMethods->xClose(f->real);

    free(f->buf);
    f->buf = NULL;
    return rc != SQLITE_OK ? rc : rc2;
}

static int wal_read(sqlite3_file *p, void *out, int n, sqlite3_int64 off)
{
    wal_file *f = (wal_file *)p;
    int rc = wal_send(f);

    return rc != SQLITE_OK ? rc
                           : f->real->pMethods->xRead(f->real, out, n, off);
}

static int wal_write(sqlite3_file *p, const void *data, int n,
                     sqlite3_int64 off)
{
    wal_file *f = (wal_file *)p;
    const unsigned char *d = data;
    int rc = SQLITE_OK, commit = f->commit_next;

    f->commit_next = 0;
    if (f->len && (off != f->buf_off + (sqlite3_int64)f->len ||
                   f->len + (size_t)n > WAL_BUF))
        rc = wal_send(f);
    if (rc == SQLITE_OK && (size_t)n > WAL_BUF) {
        atomic_fetch_add_explicit(&walvfs_writes, 1, memory_order_relaxed);
        return f->real->pMethods->xWrite(f->real, data, n, off);
    }
    if (rc != SQLITE_OK)
        return rc;
    if (!f->buf && !(f->buf = malloc(WAL_BUF))) {
        /* No buffer: write as SQLite asked. */
        atomic_fetch_add_explicit(&walvfs_writes, 1, memory_order_relaxed);
        return f->real->pMethods->xWrite(f->real, data, n, off);
    }
    if (!f->len)
        f->buf_off = off;
    memcpy(f->buf + f->len, data, (size_t)n);
    f->len += (size_t)n;
    if (commit)
        return wal_send(f);
    /* A frame header's bytes 4..7: the database's size in pages after a
     * commit, zero in every other frame. */
    if (n == FRAME_HDR && (d[4] | d[5] | d[6] | d[7]))
        f->commit_next = 1;
    return SQLITE_OK;
}

static int wal_truncate(sqlite3_file *p, sqlite3_int64 size)
{
    wal_file *f = (wal_file *)p;
    int rc = wal_send(f);

    return rc != SQLITE_OK ? rc : f->real->pMethods->xTruncate(f->real, size);
}

static int wal_sync(sqlite3_file *p, int flags)
{
    wal_file *f = (wal_file *)p;
    int rc = wal_send(f);

    atomic_fetch_add_explicit(&walvfs_syncs, 1, memory_order_relaxed);
    return rc != SQLITE_OK ? rc : f->real->pMethods->xSync(f->real, flags);
}

static int wal_size(sqlite3_file *p, sqlite3_int64 *size)
{
    wal_file *f = (wal_file *)p;
    int rc = wal_send(f);

    return rc != SQLITE_OK ? rc : f->real->pMethods->xFileSize(f->real, size);
}

static int wal_lock(sqlite3_file *p, int level)
{
    wal_file *f = (wal_file *)p;
    int rc = wal_send(f);

    return rc != SQLITE_OK ? rc : f->real->pMethods->xLock(f->real, level);
}

static int wal_unlock(sqlite3_file *p, int level)
{
    wal_file *f = (wal_file *)p;
    int rc = wal_send(f);

    return rc != SQLITE_OK ? rc : f->real->pMethods->xUnlock(f->real, level);
}

static int wal_reserved(sqlite3_file *p, int *out)
{
    wal_file *f = (wal_file *)p;

    return f->real->pMethods->xCheckReservedLock(f->real, out);
}

static int wal_control(sqlite3_file *p, int op, void *arg)
{
    wal_file *f = (wal_file *)p;
    int rc = wal_send(f);

    return rc != SQLITE_OK ? rc
                           : f->real->pMethods->xFileControl(f->real, op, arg);
}

static int wal_sector(sqlite3_file *p)
{
    wal_file *f = (wal_file *)p;

    return f->real->pMethods->xSectorSize(f->real);
}

static int wal_device(sqlite3_file *p)
{
    wal_file *f = (wal_file *)p;

    return f->real->pMethods->xDeviceCharacteristics(f->real);
}

/* Version 1: SQLite maps and locks shared memory through the database
 * file, never through its WAL. */
static const sqlite3_io_methods wal_methods = {
    .iVersion = 1,
    .xClose = wal_close,
    .xRead = wal_read,
    .xWrite = wal_write,
    .xTruncate = wal_truncate,
    .xSync = wal_sync,
    .xFileSize = wal_size,
    .xLock = wal_lock,
    .xUnlock = wal_unlock,
    .xCheckReservedLock = wal_reserved,
    .xFileControl = wal_control,
    .xSectorSize = wal_sector,
    .xDeviceCharacteristics = wal_device,
};

static int walvfs_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *p,
                       int flags, int *out_flags)
{
    wal_file *f = (wal_file *)p;
    int rc;

    (void)vfs;
    if (!(flags & SQLITE_OPEN_WAL))
        return base_vfs->xOpen(base_vfs, name, p, flags, out_flags);
    memset(f, 0, sizeof(*f));
    f->real = (sqlite3_file *)(f + 1);
    rc = base_vfs->xOpen(base_vfs, name, f->real, flags, out_flags);
    /* pMethods set only on success: SQLite then calls xClose even when
     * the open failed, which must not close the unopened real file. */
    if (f->real->pMethods)
        f->base.pMethods = &wal_methods;
    return rc;
}

static void walvfs_register(void)
{
    if (!(base_vfs = sqlite3_vfs_find(NULL))) {
        walvfs_rc = SQLITE_ERROR;
        return;
    }
    walvfs = *base_vfs;
    walvfs.zName = LOOM_SQLITE_VFS;
    walvfs.pNext = NULL;
    walvfs.szOsFile = (int)sizeof(wal_file) + base_vfs->szOsFile;
    walvfs.xOpen = walvfs_open;
    walvfs_rc = sqlite3_vfs_register(&walvfs, 0);
}

int loom__sqlite_walvfs(void)
{
    pthread_once(&walvfs_once, walvfs_register);
    return walvfs_rc;
}

long loom__sqlite_walvfs_writes(void)
{
    return atomic_load_explicit(&walvfs_writes, memory_order_relaxed);
}

long loom__sqlite_walvfs_syncs(void)
{
    return atomic_load_explicit(&walvfs_syncs, memory_order_relaxed);
}
