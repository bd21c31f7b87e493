/* dirsync.c: see dirsync.h. */
#include "util/dirsync.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int es_sync_parent_dir(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
  if (!dir) return -1; /* errno: ENOMEM */
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  free(dir);
  if (fd < 0) return -1;
  int rc = fsync(fd) == 0 || errno == EINVAL ? 0 : -1;
  int saved = errno;
  close(fd);
  errno = saved;
  return rc;
}
