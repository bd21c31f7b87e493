/*
 * dirsync.h: making a new file's name durable. fsync on a file syncs its
 * data, not the directory entry that names it: after a crash the file may
 * be gone. Whoever creates a file the store depends on (a database, the
 * master key file) syncs its directory too, and says so when it cannot.
 */
#ifndef ES_UTIL_DIRSYNC_H
#define ES_UTIL_DIRSYNC_H

/* fsyncs the directory holding path ("." for a bare name). 0, or -1 with
 * errno set (opening the directory, or the sync, failed). A file system
 * that cannot sync directories at all (EINVAL) counts as done: there is
 * nothing more to be had there. */
int es_sync_parent_dir(const char *path);

#endif
