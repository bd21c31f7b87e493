/*
 * dirsync_test.c: es_sync_parent_dir (core/util/dirsync.h), what the
 * SQLite backend and the master key file use to make a new file's name
 * durable. It used to be open-coded in both with its failures ignored;
 * now a failure is reported (and both callers fail with STORAGE).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util/dirsync.h"

#include "tap.h"

int main(void) {
  char dir[] = "/tmp/es_dirsync_XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  char path[256];
  snprintf(path, sizeof path, "%s/file", dir);
  ok(es_sync_parent_dir(path) == 0, "a file in an existing directory: its directory synced");
  ok(es_sync_parent_dir("/etc-not-a-dir-of-eventstore") == 0, "a file at the root: / synced");
  char cwd[4096];
  ok(getcwd(cwd, sizeof cwd) && chdir(dir) == 0 && es_sync_parent_dir("bare") == 0 && chdir(cwd) == 0,
     "a bare name: the working directory synced");
  snprintf(path, sizeof path, "%s/gone/file", dir);
  errno = 0;
  ok(es_sync_parent_dir(path) == -1 && errno == ENOENT,
     "a directory that cannot be opened is a failure with errno, never ignored");
  snprintf(path, sizeof path, "%s/file", dir);
  FILE *f = fopen(path, "w");
  if (f) fclose(f);
  char inner[300];
  snprintf(inner, sizeof inner, "%s/x", path);
  errno = 0;
  ok(es_sync_parent_dir(inner) == -1 && errno == ENOTDIR, "a parent that is a file: ENOTDIR");
  unlink(path);
  rmdir(dir);
  printf("1..%d\n", test_no);
  return tap_done();
}
