/*
 * sqlite_vfs.c: SQLite's default VFS with the WAL's frame writes gathered
 * (docs/sqlite.md "WAL writes gathered").
 *
 * Why: SQLite writes each WAL frame as two pwrite calls, its 24-byte
 * header and then its page. A group commit of 16 appends of 100 events
 * over 100 sessions writes ~450 pages, so ~900 system calls, and on a
 * virtual machine a system call costs several microseconds beyond the
 * bytes it copies. Here the frames a commit appends are kept in a buffer
 * and written with one call per SQ_VFS_GATHER_BYTES.
 *
 * Why it is safe. A commit's frames become visible to other connections
 * (this process's readers and checkpointer, other processes) only when
 * SQLite writes the new WAL-index header, after the frames are written
 * and, with synchronous = FULL, after the WAL's sync. So:
 *   - gathering is on only while the connection commits with FULL
 *     (sq_vfs_gather), and xSync writes the buffer out before it syncs:
 *     the bytes are in the file before the header that points at them,
 *     and an error writing them is the sync's error, which fails the
 *     commit. A lazy commit (sq_vfs_lazy: a claim's) is still a FULL
 *     commit to SQLite, so it has that sync too; only its fsync is
 *     skipped (vf_sync);
 *   - any other call on the WAL file that could see the file (a read, its
 *     size, a truncation, a write that is not the next append, closing
 *     it) writes the buffer out first, and returns that error;
 *   - the database file's xShmBarrier, which SQLite calls between the two
 *     copies of the header it writes, writes out anything still buffered
 *     (nothing, by the rules above). An error there cannot be returned
 *     (the call has no result), so the WAL file is marked broken and
 *     every later write and sync of it fails.
 * A process killed with frames in the buffer loses what a kill during the
 * frames' pwrite calls would: an uncommitted tail the WAL's checksums
 * already make recovery ignore.
 *
 * The database file knows its WAL file through the name SQLite gives the
 * WAL (sqlite3_filename_database of the WAL's name is the pointer the
 * database file was opened with): each connection has its own pair, used
 * by one thread at a time; the list of open database files is shared and
 * guarded by a mutex.
 */
#include "sqlite_vfs.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Custom file controls: the opcodes SQLite defines are small integers. */
#define SQ_FCNTL_GATHER 0x45530001
#define SQ_FCNTL_LAZY 0x45530002

typedef struct vf_file vf_file;
struct vf_file {
  sqlite3_file base;
  sqlite3_file *real; /* the default VFS's file, right after this struct */
  const char *name;   /* main database: the name it was opened with */
  vf_file *next;      /* main database: the list of open ones */
  vf_file *wal;       /* main database: its connection's WAL file, when open */
  vf_file *db;        /* WAL: its connection's main database file */
  int gather;         /* main database: 1 while its WAL's appends are gathered */
  int lazy;           /* main database: 1 while its commits' WAL syncs are skipped (sq_vfs_lazy) */
  int broken;         /* WAL: a buffer could not be written where no error could be told */
  unsigned char *buf; /* WAL: pending bytes, to go at off */
  size_t len;
  sqlite3_int64 off;
};

static sqlite3_vfs vf_vfs;
static sqlite3_vfs *vf_real;
static pthread_mutex_t vf_mu = PTHREAD_MUTEX_INITIALIZER;
static vf_file *vf_dbs;

#define VF_HEAD ((int)((sizeof(vf_file) + 15) & ~(size_t)15))

static int vf_flush(vf_file *f) {
  if (f->len == 0) return SQLITE_OK;
  size_t n = f->len;
  f->len = 0;
  return f->real->pMethods->xWrite(f->real, f->buf, (int)n, f->off);
}

/* ---- the file methods: each forwards to the real file, the WAL's after
 * writing its buffer out where the call could see the file ---- */

static int vf_close(sqlite3_file *file) {
  vf_file *f = (vf_file *)file;
  int rc = vf_flush(f);
  pthread_mutex_lock(&vf_mu);
  if (f->db && f->db->wal == f) f->db->wal = NULL;
  if (f->name) {
    for (vf_file **p = &vf_dbs; *p; p = &(*p)->next)
      if (*p == f) {
        *p = f->next;
        break;
      }
    if (f->wal) f->wal->db = NULL;
  }
  pthread_mutex_unlock(&vf_mu);
  free(f->buf);
  int rc2 = f->real->pMethods->xClose(f->real);
  return rc != SQLITE_OK ? rc : rc2;
}

static int vf_read(sqlite3_file *file, void *out, int amt, sqlite3_int64 off) {
  vf_file *f = (vf_file *)file;
  int rc = vf_flush(f);
  return rc != SQLITE_OK ? rc : f->real->pMethods->xRead(f->real, out, amt, off);
}

static int vf_write(sqlite3_file *file, const void *in, int amt, sqlite3_int64 off) {
  vf_file *f = (vf_file *)file;
  if (f->broken) return SQLITE_IOERR_WRITE;
  int gather = f->db && f->db->gather && amt > 0 && (size_t)amt <= SQ_VFS_GATHER_BYTES;
  if (gather && f->len > 0 && off == f->off + (sqlite3_int64)f->len &&
      f->len + (size_t)amt <= SQ_VFS_GATHER_BYTES) {
    memcpy(f->buf + f->len, in, (size_t)amt);
    f->len += (size_t)amt;
    return SQLITE_OK;
  }
  int rc = vf_flush(f);
  if (rc != SQLITE_OK) return rc;
  if (gather && !f->buf) f->buf = malloc(SQ_VFS_GATHER_BYTES);
  if (!gather || !f->buf) return f->real->pMethods->xWrite(f->real, in, amt, off);
  memcpy(f->buf, in, (size_t)amt);
  f->len = (size_t)amt;
  f->off = off;
  return SQLITE_OK;
}

static int vf_truncate(sqlite3_file *file, sqlite3_int64 size) {
  vf_file *f = (vf_file *)file;
  int rc = vf_flush(f);
  return rc != SQLITE_OK ? rc : f->real->pMethods->xTruncate(f->real, size);
}

/* A lazy commit's sync (sq_vfs_lazy) writes its gathered frames out and
 * stops there. Which sync is a commit's: frames are buffered and none of
 * them is the WAL's header at offset 0. The header's sync (SQLite syncs a
 * new header before the first frame after it) sees the header alone in
 * the buffer, and a checkpoint's sees an empty one (the commit before it
 * wrote its frames out): those two are done as always, which is what
 * synchronous = NORMAL does too. */
static int vf_sync(sqlite3_file *file, int flags) {
  vf_file *f = (vf_file *)file;
  if (f->broken) return SQLITE_IOERR_FSYNC;
  int commit_only = f->db && f->db->lazy && f->len > 0 && f->off > 0;
  int rc = vf_flush(f);
  if (rc != SQLITE_OK || commit_only) return rc;
  return f->real->pMethods->xSync(f->real, flags);
}

static int vf_file_size(sqlite3_file *file, sqlite3_int64 *size) {
  vf_file *f = (vf_file *)file;
  int rc = vf_flush(f);
  return rc != SQLITE_OK ? rc : f->real->pMethods->xFileSize(f->real, size);
}

static int vf_lock(sqlite3_file *file, int lock) {
  vf_file *f = (vf_file *)file;
  return f->real->pMethods->xLock(f->real, lock);
}

static int vf_unlock(sqlite3_file *file, int lock) {
  vf_file *f = (vf_file *)file;
  return f->real->pMethods->xUnlock(f->real, lock);
}

static int vf_check_reserved(sqlite3_file *file, int *out) {
  vf_file *f = (vf_file *)file;
  return f->real->pMethods->xCheckReservedLock(f->real, out);
}

static int vf_file_control(sqlite3_file *file, int op, void *arg) {
  vf_file *f = (vf_file *)file;
  if (op == SQ_FCNTL_GATHER && f->name) {
    f->gather = *(int *)arg != 0;
    return SQLITE_OK;
  }
  if (op == SQ_FCNTL_LAZY && f->name) {
    f->lazy = *(int *)arg != 0;
    return SQLITE_OK;
  }
  return f->real->pMethods->xFileControl(f->real, op, arg);
}

static int vf_sector_size(sqlite3_file *file) {
  vf_file *f = (vf_file *)file;
  return f->real->pMethods->xSectorSize(f->real);
}

static int vf_device_characteristics(sqlite3_file *file) {
  vf_file *f = (vf_file *)file;
  return f->real->pMethods->xDeviceCharacteristics(f->real);
}

static int vf_shm_map(sqlite3_file *file, int pg, int pgsz, int extend, void volatile **out) {
  vf_file *f = (vf_file *)file;
  return f->real->pMethods->xShmMap(f->real, pg, pgsz, extend, out);
}

static int vf_shm_lock(sqlite3_file *file, int offset, int n, int flags) {
  vf_file *f = (vf_file *)file;
  return f->real->pMethods->xShmLock(f->real, offset, n, flags);
}

static void vf_shm_barrier(sqlite3_file *file) {
  vf_file *f = (vf_file *)file;
  vf_file *w = f->wal;
  if (w && w->len > 0 && vf_flush(w) != SQLITE_OK) w->broken = 1;
  f->real->pMethods->xShmBarrier(f->real);
}

static int vf_shm_unmap(sqlite3_file *file, int del) {
  vf_file *f = (vf_file *)file;
  return f->real->pMethods->xShmUnmap(f->real, del);
}

static int vf_fetch(sqlite3_file *file, sqlite3_int64 off, int amt, void **out) {
  vf_file *f = (vf_file *)file;
  return f->real->pMethods->xFetch(f->real, off, amt, out);
}

static int vf_unfetch(sqlite3_file *file, sqlite3_int64 off, void *p) {
  vf_file *f = (vf_file *)file;
  return f->real->pMethods->xUnfetch(f->real, off, p);
}

static const sqlite3_io_methods vf_methods = {
    3,           vf_close,        vf_read,          vf_write,           vf_truncate,
    vf_sync,     vf_file_size,    vf_lock,          vf_unlock,          vf_check_reserved,
    vf_file_control, vf_sector_size, vf_device_characteristics, vf_shm_map, vf_shm_lock,
    vf_shm_barrier, vf_shm_unmap, vf_fetch,         vf_unfetch,
};

/* ---- the VFS: xOpen wraps the real file; the rest forward ---- */

static int vf_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *file, int flags,
                   int *out_flags) {
  (void)vfs;
  vf_file *f = (vf_file *)file;
  memset(f, 0, sizeof *f);
  f->real = (sqlite3_file *)((char *)f + VF_HEAD);
  int rc = vf_real->xOpen(vf_real, name, f->real, flags, out_flags);
  /* A real file with methods is closed through ours even after an error
   * (SQLite calls xClose whenever pMethods is set). */
  f->base.pMethods = f->real->pMethods ? &vf_methods : NULL;
  if (rc != SQLITE_OK || !f->base.pMethods || !name) return rc;
  pthread_mutex_lock(&vf_mu);
  if (flags & SQLITE_OPEN_MAIN_DB) {
    f->name = name;
    f->next = vf_dbs;
    vf_dbs = f;
  } else if (flags & SQLITE_OPEN_WAL) {
    const char *db = sqlite3_filename_database(name);
    for (vf_file *d = vf_dbs; d; d = d->next)
      if (d->name == db) {
        d->wal = f;
        f->db = d;
        break;
      }
  }
  pthread_mutex_unlock(&vf_mu);
  return rc;
}

static int vf_delete(sqlite3_vfs *vfs, const char *name, int sync_dir) {
  (void)vfs;
  return vf_real->xDelete(vf_real, name, sync_dir);
}

static int vf_access(sqlite3_vfs *vfs, const char *name, int flags, int *out) {
  (void)vfs;
  return vf_real->xAccess(vf_real, name, flags, out);
}

static int vf_full_pathname(sqlite3_vfs *vfs, const char *name, int n, char *out) {
  (void)vfs;
  return vf_real->xFullPathname(vf_real, name, n, out);
}

static void *vf_dlopen(sqlite3_vfs *vfs, const char *name) {
  (void)vfs;
  return vf_real->xDlOpen(vf_real, name);
}

static void vf_dlerror(sqlite3_vfs *vfs, int n, char *out) {
  (void)vfs;
  vf_real->xDlError(vf_real, n, out);
}

static void (*vf_dlsym(sqlite3_vfs *vfs, void *h, const char *sym))(void) {
  (void)vfs;
  return vf_real->xDlSym(vf_real, h, sym);
}

static void vf_dlclose(sqlite3_vfs *vfs, void *h) {
  (void)vfs;
  vf_real->xDlClose(vf_real, h);
}

static int vf_randomness(sqlite3_vfs *vfs, int n, char *out) {
  (void)vfs;
  return vf_real->xRandomness(vf_real, n, out);
}

static int vf_sleep(sqlite3_vfs *vfs, int us) {
  (void)vfs;
  return vf_real->xSleep(vf_real, us);
}

static int vf_current_time(sqlite3_vfs *vfs, double *out) {
  (void)vfs;
  return vf_real->xCurrentTime(vf_real, out);
}

static int vf_last_error(sqlite3_vfs *vfs, int n, char *out) {
  (void)vfs;
  return vf_real->xGetLastError ? vf_real->xGetLastError(vf_real, n, out) : 0;
}

static int vf_current_time64(sqlite3_vfs *vfs, sqlite3_int64 *out) {
  (void)vfs;
  return vf_real->xCurrentTimeInt64(vf_real, out);
}

static int vf_registered = SQLITE_ERROR;
static pthread_once_t vf_once = PTHREAD_ONCE_INIT;

static void vf_register_once(void) {
  vf_real = sqlite3_vfs_find(NULL);
  /* The methods above are those of io_methods version 3 and VFS version
   * 2: a real VFS older than that (none SQLite ships) is left alone. */
  if (!vf_real || vf_real->iVersion < 2 || !vf_real->xCurrentTimeInt64) return;
  vf_vfs.iVersion = 2;
  vf_vfs.szOsFile = VF_HEAD + vf_real->szOsFile;
  vf_vfs.mxPathname = vf_real->mxPathname;
  vf_vfs.zName = SQ_VFS_NAME;
  vf_vfs.xOpen = vf_open;
  vf_vfs.xDelete = vf_delete;
  vf_vfs.xAccess = vf_access;
  vf_vfs.xFullPathname = vf_full_pathname;
  vf_vfs.xDlOpen = vf_dlopen;
  vf_vfs.xDlError = vf_dlerror;
  vf_vfs.xDlSym = vf_dlsym;
  vf_vfs.xDlClose = vf_dlclose;
  vf_vfs.xRandomness = vf_randomness;
  vf_vfs.xSleep = vf_sleep;
  vf_vfs.xCurrentTime = vf_current_time;
  vf_vfs.xGetLastError = vf_last_error;
  vf_vfs.xCurrentTimeInt64 = vf_current_time64;
  vf_registered = sqlite3_vfs_register(&vf_vfs, 0);
}

int sq_vfs_register(void) {
  pthread_once(&vf_once, vf_register_once);
  return vf_registered;
}

static int vf_control(sqlite3 *db, int op, int on) {
  sqlite3_vfs *v = NULL;
  if (sqlite3_file_control(db, "main", SQLITE_FCNTL_VFS_POINTER, &v) != SQLITE_OK || v != &vf_vfs)
    return SQLITE_NOTFOUND;
  return sqlite3_file_control(db, "main", op, &on);
}

int sq_vfs_gather(sqlite3 *db, int on) { return vf_control(db, SQ_FCNTL_GATHER, on); }

int sq_vfs_lazy(sqlite3 *db, int on) { return vf_control(db, SQ_FCNTL_LAZY, on); }
