/*
 * sqlite_vfs.h: the VFS the sqlite: backend opens its files through
 * (docs/sqlite.md "WAL writes gathered"). It is SQLite's default VFS with
 * one change: while a connection has gathering on, the frames a commit
 * appends to the WAL are written with one system call per run of up to
 * SQ_VFS_GATHER_BYTES instead of two per page.
 */
#ifndef ES_SQLITE_VFS_H
#define ES_SQLITE_VFS_H

#include <sqlite3.h>

#define SQ_VFS_NAME "eventstore"
/* A WAL file's buffer, allocated at its first gathered write: 31 frames
 * of 4 KiB pages. The unix VFS writes at most 128 KiB - 1 bytes a call
 * (a longer write comes back short, as a full disk). */
#define SQ_VFS_GATHER_BYTES ((1 << 17) - 1)

/* Registers the VFS (once per process; later calls return the first
 * result). SQLITE_OK, or SQLite's code when it could not be registered:
 * the caller then opens with the default VFS. */
int sq_vfs_register(void);

/* Gathering on (1) or off (0) for db's main file. Only a connection
 * whose every commit syncs the WAL (synchronous = FULL) may turn it on:
 * the sync is where gathered frames are written out, before the commit
 * is published to readers. SQLITE_OK, or SQLITE_NOTFOUND when db's file
 * is not on this VFS. */
int sq_vfs_gather(sqlite3 *db, int on);

/* Lazy commits on (1) or off (0) for db's main file, whose gathering is
 * on: a commit's sync of the WAL writes the frames out without syncing
 * them, as synchronous = NORMAL commits (the WAL header's sync and a
 * checkpoint's are still made). For a claim's transaction (docs/sqlite.md
 * "Claims and power loss"): its frames are gathered too, and a write
 * error is still the commit's. SQLITE_OK, or SQLITE_NOTFOUND as above. */
int sq_vfs_lazy(sqlite3 *db, int on);

#endif
