/*
 * archive.c: archive segments (docs/contract.md §3.9, docs/retention.md "Archive").
 *
 * A store with an archive directory moves a session's settled history out
 * of the database into immutable segment files (segment.h: the format):
 *
 *   DIR/<32 hex: BLAKE2b-128 of the session name>/<from>-<through>-<nonce>.seg
 *
 * The directory per session keeps any session name (NUL-free UTF-8 of any
 * bytes) off the file system; the random nonce makes every file name new,
 * so a file removed after a commit (truncate, delete, compaction) can never
 * be one a later writer has just created under the same name.
 *
 * Crash safety of archive(): inside the write transaction (one writer per
 * file, across processes on SQLite) the events are encoded, written to
 * NAME.tmp, synced, renamed to NAME and the directory synced; then the
 * segment row is recorded, the rows dropped and archived_through moved, and
 * the transaction commits. A crash before the commit leaves an unrecorded
 * file (an orphan: never read, since reads go by the segment rows) and the
 * rows intact; after it, the rows are gone and the file is durable. Orphans
 * are removed by the next archive or compaction of that session (under the
 * write lock, so no writer can be making one at that moment) and listed by
 * verify_archive.
 *
 * Reads are transparent: indexes first_index..archived_through come from
 * the segments that cover them, the rest from rows (es_archive_read_part,
 * called by store.c's read paths). A segment is re-checked at every read
 * (size, checksum, header against its row, every length while decoding):
 * a damaged or missing file is STORAGE naming it, never wrong events.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/internal.h"
#include "store/segment.h"
#include "store/store.h"
#include "util/buf.h"

#define ZSTD_LEVEL 3        /* zstd's default: well above disk speed on one core */
#define COMPACT_TRIES 5     /* compaction rebuilds at most this often when the list changes */
#define LIST_PAGE 1000      /* sessions per page when verify_archive walks them all */

static int nomem(es_err *err) { return es_fail(err, ES_STORAGE, "archive: out of memory"); }

/* ---- rows ---------------------------------------------------------------- */

void es_segment_init(es_segment *g) {
  memset(g, 0, sizeof *g);
  g->created_at = ES_NONE;
}

void es_segment_destroy(es_segment *g) {
  if (!g) return;
  free(g->file);
  es_segment_init(g);
}

int es_segment_copy(es_segment *dst, const es_segment *src) {
  *dst = *src;
  dst->file = NULL;
  if (src->file && !(dst->file = strdup(src->file))) return ES_STORAGE;
  return ES_OK;
}

void es_segments_destroy(es_segments *list) {
  if (!list) return;
  for (size_t i = 0; i < list->n; i++) es_segment_destroy(&list->v[i]);
  free(list->v);
  memset(list, 0, sizeof *list);
}

static void problem_destroy(es_archive_problem *p) {
  free(p->session);
  free(p->file);
  free(p->problem);
}

void es_archive_report_destroy(es_archive_report *r) {
  if (!r) return;
  for (size_t i = 0; i < r->n_problems; i++) problem_destroy(&r->problems[i]);
  for (size_t i = 0; i < r->n_orphans; i++) problem_destroy(&r->orphans[i]);
  free(r->problems);
  free(r->orphans);
  memset(r, 0, sizeof *r);
}

typedef struct {
  es_segments *list;
  int oom;
} seg_collector;

static int collect_segment(void *ctx, const es_segment *row) {
  seg_collector *c = ctx;
  if (es_grow((void **)&c->list->v, &c->list->cap, c->list->n + 1, sizeof *c->list->v) != ES_OK ||
      es_segment_copy(&c->list->v[c->list->n], row) != ES_OK) {
    c->oom = 1;
    return 1;
  }
  c->list->n++;
  return 0;
}

static int list_segments(es_store *s, es_txn *t, const char *session, es_segments *out, es_err *err) {
  memset(out, 0, sizeof *out);
  seg_collector c = {out, 0};
  int rc = s->ops->segment_list(s->bk, t, session, collect_segment, &c, err);
  if (rc == ES_OK && c.oom) rc = nomem(err);
  if (rc) es_segments_destroy(out);
  return rc;
}

/* ---- paths and files ------------------------------------------------------ */

/* The session's directory name: 32 hex digits of a BLAKE2b-128 of its name. */
static void session_hash(const char *session, char out[33]) {
  unsigned char h[16];
  crypto_generichash(h, sizeof h, (const unsigned char *)session, strlen(session), NULL, 0);
  es_seg_hex(h, sizeof h, out);
}

static char *join(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b);
  char *p = malloc(la + lb + 2);
  if (!p) return NULL;
  memcpy(p, a, la);
  p[la] = '/';
  memcpy(p + la + 1, b, lb + 1);
  return p;
}

static int io_fail(es_err *err, const char *what, const char *path) {
  return es_fail(err, ES_STORAGE, "archive: cannot %s '%s': %s", what, path, strerror(errno));
}

static int sync_dir(const char *path, es_err *err) {
  int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return io_fail(err, "open the directory", path);
  int rc = fsync(fd) == 0 ? ES_OK : io_fail(err, "sync the directory", path);
  close(fd);
  return rc;
}

/* mkdir -p with 0700 for what it creates. */
static int make_dirs(const char *path, es_err *err) {
  char *p = strdup(path);
  if (!p) return nomem(err);
  int rc = ES_OK;
  for (char *q = p + 1; rc == ES_OK; q++) {
    if (*q != '/' && *q != '\0') continue;
    char c = *q;
    *q = '\0';
    if (mkdir(p, 0700) == 0) {
      /* a new directory's entry must be durable before anything the
       * database records comes to depend on it */
      char *slash = strrchr(p, '/');
      if (slash && slash != p) {
        *slash = '\0';
        rc = sync_dir(p, err);
        *slash = '/';
      }
    } else if (errno != EEXIST) {
      rc = io_fail(err, "create the directory", p);
    }
    *q = c;
    if (c == '\0') break;
  }
  struct stat st;
  if (rc == ES_OK && (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)))
    rc = es_fail(err, ES_INVALID_ARGUMENT, "archive: '%s' is not a directory", path);
  free(p);
  return rc;
}


/* Writes data to path via path.tmp: write, fsync, rename. The caller syncs
 * the directory. On failure nothing is left under either name. */
static int write_file(const char *path, const unsigned char *data, size_t len, es_err *err) {
  size_t pl = strlen(path);
  char *tmp = malloc(pl + 5);
  if (!tmp) return nomem(err);
  memcpy(tmp, path, pl);
  memcpy(tmp + pl, ".tmp", 5);
  int rc = ES_OK;
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  for (int tries = 0; fd < 0 && errno == ENOENT && tries < 3; tries++) {
    /* A truncate or delete of the session that committed meanwhile removed
     * its emptied directory outside the write lock
     * (es_archive_files_finish): make it again, durably. Once our file is
     * in it, rmdir cannot take it. */
    char *slash = strrchr(tmp, '/');
    if (!slash || slash == tmp) break;
    *slash = '\0';
    int made = mkdir(tmp, 0700) == 0 || errno == EEXIST;
    char *up = made ? strrchr(tmp, '/') : NULL;
    if (up && up != tmp) {
      *up = '\0';
      made = sync_dir(tmp, err) == ES_OK;
      *up = '/';
    }
    *slash = '/';
    if (!made) break;
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  }
  if (fd < 0) rc = io_fail(err, "create", tmp);
  for (size_t off = 0; rc == ES_OK && off < len;) {
    ssize_t n = write(fd, data + off, len - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) rc = io_fail(err, "write", tmp);
    else off += (size_t)n;
  }
  if (rc == ES_OK && fsync(fd) != 0) rc = io_fail(err, "sync", tmp);
  if (fd >= 0 && close(fd) != 0 && rc == ES_OK) rc = io_fail(err, "close", tmp);
  if (rc == ES_OK && rename(tmp, path) != 0) rc = io_fail(err, "rename into place", tmp);
  if (rc != ES_OK) unlink(tmp);
  free(tmp);
  return rc;
}

/* Reads a whole file. One whose size is not `expect` is not read: *len
 * says its size and *out stays NULL (a replaced or damaged file is never
 * loaded whole into memory, however large it is). */
static int read_file(const char *path, size_t expect, unsigned char **out, size_t *len,
                     int *missing) {
  *out = NULL;
  *len = 0;
  *missing = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *missing = errno == ENOENT;
    return -1;
  }
  struct stat st;
  int rc = -1;
  unsigned char *buf = NULL;
  if (fstat(fd, &st) != 0 || st.st_size < 0) {
    /* rc stays -1 */
  } else if ((uint64_t)st.st_size != (uint64_t)expect || (uint64_t)st.st_size >= SIZE_MAX / 2) {
    *len = (uint64_t)st.st_size < SIZE_MAX / 2 ? (size_t)st.st_size : SIZE_MAX / 2;
    rc = 0;
  } else {
    size_t n = (size_t)st.st_size, off = 0;
    buf = malloc(n ? n : 1);
    while (buf && off < n) {
      ssize_t k = read(fd, buf + off, n - off);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) break;
      off += (size_t)k;
    }
    if (buf && off == n) {
      rc = 0;
      *len = n;
    }
  }
  close(fd);
  if (rc) free(buf);
  else *out = buf;
  return rc;
}

void es_archive_files_finish(es_store *s, es_archive_files *f, int committed) {
  for (size_t i = 0; committed && i < f->n; i++)
    unlink(f->v[i]); /* already gone (another cleanup got there): fine */
  /* Then each session directory, once, if that emptied it (rmdir fails
   * otherwise), under dmu: an archive of the session in this process
   * holds it from making the directory until its file is in there. The
   * directory was once removed after each file: an archive that made it
   * again meanwhile (its sweep had taken the other files) lost it again,
   * once per file left on the list, more often than write_file tries. */
  if (committed && f->n) pthread_mutex_lock(&s->dmu);
  for (size_t i = 0; committed && i < f->n; i++) {
    char *slash = strrchr(f->v[i], '/');
    if (!slash) continue;
    *slash = '\0';
    int seen = 0;
    for (size_t j = 0; j < i && !seen; j++) seen = strcmp(f->v[j], f->v[i]) == 0;
    if (!seen) rmdir(f->v[i]);
  }
  if (committed && f->n) pthread_mutex_unlock(&s->dmu);
  for (size_t i = 0; i < f->n; i++) free(f->v[i]);
  free(f->v);
  memset(f, 0, sizeof *f);
}

static int files_add(es_archive_files *f, char *path, es_err *err) {
  if (!path || es_grow((void **)&f->v, &f->cap, f->n + 1, sizeof *f->v) != ES_OK) {
    free(path);
    return nomem(err);
  }
  f->v[f->n++] = path;
  return ES_OK;
}

/* ---- open / close ----------------------------------------------------------- */

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* §3.9: the archive location is a directory path or a URL of it. A URL is
 * "scheme://..." or "file:..."; a file: URL (RFC 8089: file:///abs,
 * file://localhost/abs, file:/abs; %XX decoded) names a local (or
 * mounted) directory, which is all this build keeps segments in; another
 * scheme (s3://, ...) or a remote host is refused, naming it, rather than
 * taken for a relative directory called "s3:". *out: the path (owned),
 * or NULL when `given` is a plain path (used as it is). */
int es_archive_location(const char *given, char **out, es_err *err) {
  *out = NULL;
  size_t n = 0;
  if (isalpha((unsigned char)given[0]))
    while (isalnum((unsigned char)given[n]) || (given[n] && strchr("+.-", given[n]))) n++;
  int file = n == 4 && strncasecmp(given, "file", 4) == 0 && given[4] == ':';
  if (!(n && given[n] == ':' && (file || strncmp(given + n + 1, "//", 2) == 0))) return ES_OK;
  if (!file)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "archive: '%.*s:' URLs are not supported: give a directory or a file: URL", (int)n, given);
  const char *p = given + 5;
  if (strncmp(p, "//", 2) == 0) {
    p += 2;
    size_t host = strcspn(p, "/");
    if (host && !(host == 9 && strncasecmp(p, "localhost", 9) == 0))
      return es_fail(err, ES_INVALID_ARGUMENT,
                     "archive: file: URL names the host '%.*s': only a local directory (file:///PATH)",
                     (int)host, p);
    p += host;
  }
  if (*p != '/')
    return es_fail(err, ES_INVALID_ARGUMENT, "archive: a file: URL needs an absolute path (file:///PATH), got '%s'",
                   given);
  char *path = malloc(strlen(p) + 1), *w = path;
  if (!path) return nomem(err);
  for (; *p; p++) {
    int hi, lo;
    if (*p == '%' && (hi = hexval(p[1])) >= 0 && (lo = hexval(p[2])) >= 0) {
      if (!(*w++ = (char)(hi * 16 + lo))) {
        free(path);
        return es_fail(err, ES_INVALID_ARGUMENT, "archive: a file: URL decodes to a NUL byte (%%00)");
      }
      p += 2;
    } else if (*p == '?' || *p == '#') {
      free(path);
      return es_fail(err, ES_INVALID_ARGUMENT, "archive: a file: URL takes no query or fragment ('%s')", given);
    } else {
      *w++ = *p;
    }
  }
  *w = '\0';
  *out = path;
  return ES_OK;
}

int es_archive_setup(es_store *s, const char *scheme, const char *url_rest,
                     const es_open_opts *opts, es_err *err) {
  if (sodium_init() < 0) return es_fail(err, ES_STORAGE, "archive: libsodium cannot start");
  if (opts && opts->archive_dir) {
    if (!*opts->archive_dir) return es_fail(err, ES_INVALID_ARGUMENT, "archive must be a directory path, not empty");
    if (!(s->archive_dir = strdup(opts->archive_dir))) return nomem(err);
    return make_dirs(s->archive_dir, err);
  }
  if (strcmp(scheme, "sqlite") == 0 && url_rest) {
    /* beside the database: PATH.archive (the URL's options start at '?') */
    size_t n = strcspn(url_rest, "?");
    if (!(s->archive_dir = malloc(n + sizeof ".archive"))) return nomem(err);
    memcpy(s->archive_dir, url_rest, n);
    memcpy(s->archive_dir + n, ".archive", sizeof ".archive");
  }
  return ES_OK;
}

void es_archive_teardown(es_store *s) {
  free(s->archive_dir);
  s->archive_dir = NULL;
}

/* ---- loading a segment -------------------------------------------------------- */

typedef struct loaded {
  unsigned char *file;
  size_t len;
  es_seg_info info;
  unsigned char *raw;
  char *path;
} loaded;

static void loaded_free(loaded *l) {
  free(l->file);
  free(l->raw);
  free(l->path);
  memset(l, 0, sizeof *l);
}

#define MISSING_TEXT "' is missing (session '"

/* Reads and checks one recorded segment: the file exists, its size,
 * checksum and header are the row's, its body decompresses. */
static int seg_load(es_store *s, const char *session, const es_segment *row, loaded *l, es_err *err) {
  memset(l, 0, sizeof *l);
  if (!(l->path = join(s->archive_dir, row->file))) return nomem(err);
  int missing;
  if (read_file(l->path, row->bytes > 0 ? (size_t)row->bytes : 0, &l->file, &l->len, &missing) != 0) {
    int e = errno;
    int rc = missing ? es_fail(err, ES_STORAGE,
                               "archive segment '%s" MISSING_TEXT "%s', events %lld..%lld)",
                               l->path, session, (long long)row->from, (long long)row->through)
                     : es_fail(err, ES_STORAGE, "archive segment '%s' cannot be read: %s", l->path,
                               strerror(e));
    loaded_free(l);
    return rc;
  }
  const char *why = NULL;
  char sum[2 * ES_SEG_SUM + 1];
  if (!l->file || (int64_t)l->len != row->bytes) {
    why = "its size differs from the recorded one";
  } else if (es_seg_parse(l->file, l->len, &l->info, &why) == 0) {
    es_seg_hex(l->info.checksum, ES_SEG_SUM, sum);
    if (strcmp(l->info.session, session) != 0) why = "its header names another session";
    else if (l->info.from != row->from || l->info.through != row->through || l->info.count != row->count)
      why = "its header's range differs from the recorded one";
    else if (strcmp(sum, row->checksum) != 0) why = "its checksum differs from the recorded one";
    else es_seg_inflate(l->file, &l->info, &l->raw, &why);
  }
  if (why) {
    int rc = es_fail(err, ES_STORAGE, "archive segment '%s' is corrupt: %s (session '%s', events %lld..%lld)",
                     l->path, why, session, (long long)row->from, (long long)row->through);
    loaded_free(l);
    return rc;
  }
  return ES_OK;
}

int es_archive_retryable(int rc, const es_err *err) {
  return rc == ES_STORAGE && err && strstr(err->msg, MISSING_TEXT) != NULL;
}

/* ---- reads -------------------------------------------------------------------- */

typedef struct {
  es_event_cb cb;
  void *ctx;
  int stopped;
} each_ctx;

static int each_row(void *ctx, const es_event *row) {
  each_ctx *c = ctx;
  c->stopped = c->cb(c->ctx, row) != 0;
  return c->stopped;
}

int es_archive_each(es_store *s, es_txn *t, const es_session_info *si, int64_t after,
                    int64_t through, es_event_cb cb, void *ctx, es_err *err) {
  int64_t first = si->first_index > 1 ? si->first_index : 1;
  int64_t lo = after + 1 > first ? after + 1 : first;
  int64_t hi = through < si->archived_through ? through : si->archived_through;
  if (lo > hi) return ES_OK;
  if (!s->archive_dir)
    return es_fail(err, ES_STORAGE,
                   "events %lld..%lld of session '%s' are archived, but this store was opened without "
                   "an archive directory (open it with {archive = DIR})",
                   (long long)lo, (long long)hi, si->session);
  es_segments list;
  int rc = list_segments(s, t, si->session, &list, err);
  if (rc) return rc;
  int64_t next = lo;  /* the next index a segment must hold */
  each_ctx c = {cb, ctx, 0};
  for (size_t i = 0; rc == ES_OK && !c.stopped && i < list.n && next <= hi; i++) {
    const es_segment *g = &list.v[i];
    if (g->through < next) continue;
    if (g->from > next) break;  /* a gap: reported below */
    loaded l;
    if ((rc = seg_load(s, si->session, g, &l, err))) break;
    const char *why = NULL;
    if (es_seg_each(&l.info, l.raw, next, hi, each_row, &c, &why) < 0)
      rc = es_fail(err, ES_STORAGE, "archive segment '%s' is corrupt: %s (session '%s')", l.path, why,
                   si->session);
    loaded_free(&l);
    next = g->through + 1;
  }
  if (rc == ES_OK && !c.stopped && next <= hi)
    rc = es_fail(err, ES_STORAGE, "archive: no segment of session '%s' holds event %lld (archived through %lld)",
                 si->session, (long long)next, (long long)si->archived_through);
  es_segments_destroy(&list);
  return rc;
}

typedef struct {
  es_events *out;
  int64_t limit;  /* ES_NONE: none */
  int oom;
} part_ctx;

static int part_row(void *ctx, const es_event *row) {
  part_ctx *c = ctx;
  if (es_events_push_copy(c->out, row) != ES_OK) {
    c->oom = 1;
    return 1;
  }
  return c->limit != ES_NONE && (int64_t)c->out->n >= c->limit;
}

int es_archive_read_part(es_store *s, es_txn *t, const es_session_info *si, int64_t *after,
                         int64_t through, int64_t *limit, es_events *out, es_err *err) {
  if (si->archived_through <= *after || (*limit != ES_NONE && *limit <= 0)) return ES_OK;
  size_t n0 = out->n;
  part_ctx c = {out, *limit == ES_NONE ? ES_NONE : (int64_t)n0 + *limit, 0};
  int rc = es_archive_each(s, t, si, *after, through, part_row, &c, err);
  if (rc == ES_OK && c.oom) rc = nomem(err);
  if (rc) return rc;
  if (*limit != ES_NONE) *limit -= (int64_t)(out->n - n0);
  *after = si->archived_through;
  return ES_OK;
}

/* ---- writing a segment -------------------------------------------------------- */

/* Removes the files of the session's directory that no segment row names
 * (crash orphans, ours only: *.seg and *.tmp). Runs under the write lock,
 * so no writer is making one right now. In a group transaction a row the
 * open group removed is still committed: those files stay until that
 * commit is through (their remover unlinks them). */
static int sweep_orphans(es_store *s, es_txn *t, const char *session, const char *dir, es_err *err) {
  es_segments mine, committed = {0};
  int rc = list_segments(s, t, session, &mine, err);
  if (rc) return rc;
  if (s->ops->group_commit) {
    es_txn *r = NULL;
    rc = s->ops->read_begin(s->bk, &r, err);
    if (rc == ES_OK) {
      rc = list_segments(s, r, session, &committed, err);
      s->ops->read_end(s->bk, r);
    }
  }
  DIR *d = rc == ES_OK ? opendir(dir) : NULL;
  struct dirent *de;
  while (d && (de = readdir(d))) {
    size_t n = strlen(de->d_name);
    int ours = (n > 4 && strcmp(de->d_name + n - 4, ".seg") == 0) ||
               (n > 8 && strcmp(de->d_name + n - 8, ".seg.tmp") == 0);
    if (!ours) continue;
    int named = 0;
    es_segments *lists[2] = {&mine, &committed};
    for (int k = 0; k < 2 && !named; k++)
      for (size_t i = 0; i < lists[k]->n && !named; i++) {
        const char *slash = strrchr(lists[k]->v[i].file, '/');
        named = strcmp(slash ? slash + 1 : lists[k]->v[i].file, de->d_name) == 0;
      }
    if (named) continue;
    char *p = join(dir, de->d_name);
    if (p) unlink(p);
    free(p);
  }
  if (d) closedir(d);
  es_segments_destroy(&mine);
  es_segments_destroy(&committed);
  return rc;
}

/* Makes the session's directory (and the archive's), syncing each parent
 * that got a new entry. *dir: its path. */
static int session_dir(es_store *s, const char *session, char **dir, char hash[33], es_err *err) {
  session_hash(session, hash);
  *dir = NULL;
  int rc = make_dirs(s->archive_dir, err);
  if (rc) return rc;
  char *d = join(s->archive_dir, hash);
  if (!d) return nomem(err);
  if (mkdir(d, 0700) == 0) {
    rc = sync_dir(s->archive_dir, err);
  } else if (errno != EEXIST) {
    rc = io_fail(err, "create the directory", d);
  }
  if (rc) free(d);
  else *dir = d;
  return rc;
}

/* Writes a built image as a new segment file of the session (a fresh
 * name); fills row's file, bytes, checksum. The caller syncs dir. */
static int put_file(const char *dir, const char *hash, const unsigned char *img, size_t len,
                    const es_seg_info *info, es_segment *row, es_err *err) {
  unsigned char nonce[8];
  char nhex[17], name[96];
  randombytes_buf(nonce, sizeof nonce);
  es_seg_hex(nonce, sizeof nonce, nhex);
  snprintf(name, sizeof name, "%020lld-%020lld-%s.seg", (long long)info->from,
           (long long)info->through, nhex);
  char *path = join(dir, name);
  if (!path) return nomem(err);
  int rc = write_file(path, img, len, err);
  free(path);
  if (rc) return rc;
  size_t fl = strlen(hash) + 1 + strlen(name) + 1;
  if (!(row->file = malloc(fl))) return nomem(err);
  snprintf(row->file, fl, "%s/%s", hash, name);
  row->from = info->from;
  row->through = info->through;
  row->count = info->count;
  row->bytes = (int64_t)len;
  es_seg_hex(info->checksum, ES_SEG_SUM, row->checksum);
  return ES_OK;
}

/* ---- copies between stores (a shard move) ---------------------------------------- */

int es_archive_copy_files(es_store *from, es_store *to, const char *session,
                          const es_segments *segs, es_err *err) {
  if (!segs->n) return ES_OK;
  if (!from->archive_dir || !to->archive_dir)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "session '%s' has archived segments and a store it moves between has no "
                   "archive directory",
                   session);
  char *dir = NULL, hash[33];
  int rc = session_dir(to, session, &dir, hash, err);
  for (size_t i = 0; rc == ES_OK && i < segs->n; i++) {
    loaded l;
    if ((rc = seg_load(from, session, &segs->v[i], &l, err))) break; /* checked before copied */
    char *path = join(to->archive_dir, segs->v[i].file);
    rc = path ? write_file(path, l.file, l.len, err) : nomem(err);
    free(path);
    loaded_free(&l);
  }
  if (rc == ES_OK) rc = sync_dir(dir, err);
  free(dir);
  return rc;
}

/* ---- writing and walking whole segments ---------------------------------------- */

/* Writes the raw body of events from..through of session as a new segment
 * file and records its row (created_at as given), inside the caller's
 * write transaction: the file is written, synced and its directory synced
 * before the row exists, so a crash before the commit leaves an orphan
 * (never read: reads go by the rows), swept here by the session's next
 * segment write. *row (when non-NULL) gets the recorded row. */
static int write_segment(es_store *s, es_txn *t, const char *session, int64_t from,
                         int64_t through, const unsigned char *raw, size_t raw_len,
                         int64_t created_at, es_segment *row, es_err *err) {
  unsigned char *img = NULL;
  size_t len = 0;
  es_seg_info info;
  char *dir = NULL, hash[33];
  es_segment mine;
  es_segment_init(&mine);
  int rc = es_seg_build(session, from, through, through - from + 1, raw, raw_len, ZSTD_LEVEL, &img,
                        &len, &info, err);
  if (rc == ES_OK) {
    /* dmu: no emptied-directory removal between making it and our file */
    pthread_mutex_lock(&s->dmu);
    if ((rc = session_dir(s, session, &dir, hash, err)) == ES_OK &&
        (rc = sweep_orphans(s, t, session, dir, err)) == ES_OK)
      rc = put_file(dir, hash, img, len, &info, &mine, err);
    pthread_mutex_unlock(&s->dmu);
  }
  if (rc == ES_OK) rc = sync_dir(dir, err);
  mine.created_at = created_at;
  /* From here a failure (or a failed commit) leaves the file as an orphan. */
  if (rc == ES_OK) rc = s->ops->segment_put(s->bk, t, session, &mine, err);
  if (rc == ES_OK && row && es_segment_copy(row, &mine) != ES_OK) rc = nomem(err);
  es_segment_destroy(&mine);
  free(img);
  free(dir);
  return rc;
}

int es_archive_import_segment(es_store *s, es_txn *t, const char *session, int64_t from,
                              int64_t through, const unsigned char *raw, size_t raw_len,
                              int64_t created_at, es_err *err) {
  if (!s->archive_dir)
    return es_fail(err, ES_INVALID_ARGUMENT,
                   "session '%s' has archived events and this store has no archive directory: "
                   "open it with {archive = DIR} (--archive DIR)",
                   session);
  return write_segment(s, t, session, from, through, raw, raw_len, created_at, NULL, err);
}

typedef struct {
  const es_segment *g;
  es_archive_seg_cb cb;
  void *ctx;
} whole_ctx;

static int whole_row(void *ctx, const es_event *row) {
  whole_ctx *c = ctx;
  return c->cb(c->ctx, c->g, row);
}

int es_archive_each_segment(es_store *s, es_txn *t, const char *session, es_archive_seg_cb cb,
                            void *ctx, es_err *err) {
  es_segments list;
  int rc = list_segments(s, t, session, &list, err);
  if (rc == ES_OK && list.n && !s->archive_dir)
    rc = es_fail(err, ES_STORAGE,
                 "session '%s' has archived segments, but this store was opened without an "
                 "archive directory (open it with {archive = DIR})",
                 session);
  for (size_t i = 0; rc == ES_OK && i < list.n; i++) {
    loaded l;
    if ((rc = seg_load(s, session, &list.v[i], &l, err))) break;
    whole_ctx c = {&list.v[i], cb, ctx};
    const char *why = NULL;
    int w = es_seg_each(&l.info, l.raw, list.v[i].from, list.v[i].through, whole_row, &c, &why);
    if (w < 0)
      rc = es_fail(err, ES_STORAGE, "archive segment '%s' is corrupt: %s (session '%s')", l.path,
                   why, session);
    else if (w > 0)
      rc = es_fail(err, ES_STORAGE, "archive: out of memory walking session '%s'", session);
    loaded_free(&l);
  }
  es_segments_destroy(&list);
  return rc;
}

/* ---- archive() ------------------------------------------------------------------ */

typedef struct {
  const char *session;
  int64_t through, now;
  int written;
  es_segment *out;
} archive_args;

typedef struct {
  es_buf raw;
  int64_t next;
  int64_t bad_index;
  int bad_status;
  int oom;
} enc_ctx;

static int encode_row(void *ctx, const es_event *row) {
  enc_ctx *c = ctx;
  if (row->index != c->next) return 1; /* a missing row: found by the caller */
  if (row->status != ES_STATUS_PROCESSED) {
    c->bad_index = row->index;
    c->bad_status = row->status;
    return 1;
  }
  if (es_seg_raw_add(&c->raw, row) != ES_OK) {
    c->oom = 1;
    return 1;
  }
  c->next++;
  return 0;
}

static int do_archive(es_store *s, es_txn *t, void *arg, es_err *err) {
  archive_args *a = arg;
  es_session_info si;
  int rc = s->ops->session_get(s->bk, t, a->session, &si, err);
  if (rc == ES_NOT_FOUND) {
    if (a->through == 0) return ES_OK;
    return es_fail(err, ES_NO_SUCH_EVENT, "cannot archive session '%s' through %lld: it has no events",
                   a->session, (long long)a->through);
  }
  if (rc) return rc;
  int64_t first = si.first_index > 1 ? si.first_index : 1;
  int64_t from = si.archived_through + 1 > first ? si.archived_through + 1 : first;
  enc_ctx c = {.next = from};
  es_buf_init(&c.raw);
  es_segment row;
  es_segment_init(&row);
  if (a->through > si.head) {
    rc = es_fail(err, ES_NO_SUCH_EVENT, "cannot archive session '%s' through %lld: its head is %lld",
                 a->session, (long long)a->through, (long long)si.head);
    goto out;
  }
  if (a->through < from) goto out; /* archived (or truncated) through there already */
  rc =
      s->ops->event_range(s->bk, t, a->session, from - 1, a->through, ES_NONE, encode_row, &c, err);
  if (rc) goto out;
  if (c.oom) {
    rc = nomem(err);
  } else if (c.bad_index) {
    rc = es_fail(err, ES_INVALID_ARGUMENT,
                 "cannot archive session '%s' through %lld: event %lld is %s (only processed events "
                 "can be archived: let it complete, or settle it)",
                 a->session, (long long)a->through, (long long)c.bad_index,
                 c.bad_status == ES_STATUS_DEAD ? "a dead letter" : "pending");
  } else if (c.next != a->through + 1) {
    rc = es_fail(err, ES_STORAGE, "session '%s' has no event %lld below its head", a->session,
                 (long long)c.next);
  }
  if (rc) goto out;
  if ((rc = write_segment(s, t, a->session, from, a->through, (const unsigned char *)c.raw.data,
                          c.raw.len, a->now, &row, err)) ||
      (rc = s->ops->event_delete_range(s->bk, t, a->session, a->through, err)))
    goto out;
  si.archived_through = a->through;
  if ((rc = s->ops->session_put(s->bk, t, &si, err))) goto out;
  if (es_segment_copy(a->out, &row) != ES_OK) {
    rc = nomem(err);
    goto out;
  }
  a->written = 1;
out:
  es_segment_destroy(&row);
  es_buf_destroy(&c.raw);
  es_session_info_destroy(&si);
  return rc;
}

static int need_archive(es_store *s, es_err *err) {
  if (s->archive_dir) return ES_OK;
  return es_fail(err, ES_INVALID_ARGUMENT,
                 "this store has no archive directory: open the store with {archive = DIR}");
}

int es_core_archive(es_store *s, const char *session, int64_t through, int *written,
                    es_segment *out, es_err *err) {
  int rc;
  *written = 0;
  es_segment_init(out);
  if ((rc = es_check_name("session", session, err))) return rc;
  if (through < 0) return es_fail(err, ES_INVALID_ARGUMENT, "through must be >= 0");
  if ((rc = need_archive(s, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  archive_args a = {session, through, 0, 0, out};
  rc = es_store_now(s, &a.now, err);
  if (rc == ES_OK) rc = es_core_write(s, do_archive, &a, err);
  es_core_leave(s);
  if (rc == ES_OK) *written = a.written;
  else es_segment_destroy(out);
  return rc;
}

/* ---- segments() ------------------------------------------------------------------ */

typedef struct {
  const char *session;
  es_segments *out;
} list_args;

static int do_segments(es_store *s, es_txn *t, void *arg, es_err *err) {
  list_args *a = arg;
  return list_segments(s, t, a->session, a->out, err);
}

int es_core_segments(es_store *s, const char *session, es_segments *out, es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = es_check_name("session", session, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  list_args a = {session, out};
  rc = es_core_read(s, do_segments, &a, err);
  es_core_leave(s);
  return rc;
}

/* ---- archived() ------------------------------------------------------------------ */

void es_archived_destroy(es_archived *list) {
  if (!list) return;
  for (size_t i = 0; i < list->n; i++) free(list->v[i].session);
  free(list->v);
  free(list->cursor);
  memset(list, 0, sizeof *list);
}

typedef struct {
  const char *prefix, *after;
  int64_t limit;  /* one more than asked: whether more follow */
  es_archived *out;
  int oom;
} archived_args;

static int collect_archived_row(void *ctx, const char *session, int64_t through) {
  archived_args *a = ctx;
  es_archived *o = a->out;
  if (es_grow((void **)&o->v, &o->cap, o->n + 1, sizeof *o->v) ||
      !(o->v[o->n].session = strdup(session))) {
    a->oom = 1;
    return 1;
  }
  o->v[o->n++].archived_through = through;
  return 0;
}

static int do_archived(es_store *s, es_txn *t, void *arg, es_err *err) {
  archived_args *a = arg;
  int rc = s->ops->segment_sessions(s->bk, t, a->prefix, a->after, a->limit, collect_archived_row, a,
                                    err);
  return rc == ES_OK && a->oom ? nomem(err) : rc;
}

/* A page: the rows of limit + 1 read; the extra one says more follow and
 * goes, leaving the last kept session as the cursor. */
static int archived_page(es_archived *out, int64_t limit, es_err *err) {
  if ((int64_t)out->n <= limit) return ES_OK;
  while ((int64_t)out->n > limit) free(out->v[--out->n].session);
  if (!(out->cursor = strdup(out->v[out->n - 1].session))) return nomem(err);
  return ES_OK;
}

int es_core_archived(es_store *s, const char *prefix, const char *after, int64_t limit,
                     es_archived *out, es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if ((rc = es_rule_check_limit(limit, err)) || (rc = es_rule_check_after(after, err)) ||
      (rc = es_check_utf8("prefix", prefix, err)))
    return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  /* one more than asked (a limit near ES_MAX_LIMIT: as good as none) */
  archived_args a = {prefix ? prefix : "", after, limit < ES_MAX_LIMIT ? limit + 1 : ES_NONE, out, 0};
  rc = es_core_read(s, do_archived, &a, err);
  es_core_leave(s);
  if (rc == ES_OK) rc = archived_page(out, limit, err);
  if (rc) es_archived_destroy(out);
  return rc;
}

/* ---- truncate and delete ----------------------------------------------------------- */

int es_archive_drop(es_store *s, es_txn *t, const char *session, int64_t through,
                    es_archive_files *drop, es_err *err) {
  es_segments list;
  int rc = list_segments(s, t, session, &list, err);
  for (size_t i = 0; rc == ES_OK && i < list.n; i++) {
    const es_segment *g = &list.v[i];
    if (g->through > through) break;
    rc = s->ops->segment_delete(s->bk, t, session, g->from, err);
    if (rc == ES_OK && s->archive_dir) rc = files_add(drop, join(s->archive_dir, g->file), err);
  }
  es_segments_destroy(&list);
  return rc;
}

/* ---- compact_archive() ----------------------------------------------------------- */

/* One merged file to be: segments [first, last) of the list read. */
typedef struct {
  size_t first, last;
  unsigned char *img;
  size_t len;
  es_seg_info info;
} merge;

typedef struct {
  const char *session;
  const es_segments *seen;  /* the list the merges were built from */
  merge *m;
  size_t nm;
  int64_t now;
  int changed;              /* the list is not `seen` any more: build again */
  int64_t after;            /* segments after the merge */
  es_archive_files drop;    /* the merged-away files, removed after commit */
} compact_args;

static int same_list(const es_segments *x, const es_segments *y) {
  if (x->n != y->n) return 0;
  for (size_t i = 0; i < x->n; i++)
    if (x->v[i].from != y->v[i].from || x->v[i].through != y->v[i].through ||
        strcmp(x->v[i].checksum, y->v[i].checksum) != 0 || strcmp(x->v[i].file, y->v[i].file) != 0)
      return 0;
  return 1;
}

static int do_compact(es_store *s, es_txn *t, void *arg, es_err *err) {
  compact_args *a = arg;
  es_segments now;
  int rc = list_segments(s, t, a->session, &now, err);
  if (rc) return rc;
  a->changed = !same_list(&now, a->seen);
  es_segments_destroy(&now);
  if (a->changed) return ES_OK;
  char *dir = NULL, hash[33];
  /* dmu: no emptied-directory removal between making it and the files */
  pthread_mutex_lock(&s->dmu);
  if ((rc = session_dir(s, a->session, &dir, hash, err)) ||
      (rc = sweep_orphans(s, t, a->session, dir, err))) {
    pthread_mutex_unlock(&s->dmu);
    goto out;
  }
  int64_t removed = 0;
  for (size_t k = 0; rc == ES_OK && k < a->nm; k++) {
    merge *m = &a->m[k];
    es_segment row;
    es_segment_init(&row);
    rc = put_file(dir, hash, m->img, m->len, &m->info, &row, err);
    row.created_at = a->now;
    for (size_t i = m->first; rc == ES_OK && i < m->last; i++) {
      const es_segment *g = &a->seen->v[i];
      rc = s->ops->segment_delete(s->bk, t, a->session, g->from, err);
      if (rc == ES_OK) rc = files_add(&a->drop, join(s->archive_dir, g->file), err);
      removed++;
    }
    if (rc == ES_OK) rc = s->ops->segment_put(s->bk, t, a->session, &row, err);
    removed--;
    es_segment_destroy(&row);
  }
  pthread_mutex_unlock(&s->dmu);
  if (rc == ES_OK) rc = sync_dir(dir, err);
  a->after = (int64_t)a->seen->n - removed;
out:
  free(dir);
  return rc;
}

/* Reads the session's segment list (a read transaction). */
static int read_list(es_store *s, const char *session, es_segments *out, es_err *err) {
  list_args a = {session, out};
  return es_core_read(s, do_segments, &a, err);
}

static void merges_free(merge *m, size_t n) {
  for (size_t i = 0; i < n; i++) free(m[i].img);
  free(m);
}

/* es_seg_each's callback: appends the event to the raw body ctx (an out of
 * memory stops the walk and leaves the buffer's oom flag set). */
static int reencode(void *ctx, const es_event *e) { return es_seg_raw_add(ctx, e) != ES_OK; }

/* Plans and builds the merged files for `list`, without any lock: runs of
 * adjacent segments whose decoded bodies fit ES_ARCHIVE_MERGE_MAX_RAW
 * together, each run of two or more becoming one file (the raw bodies
 * concatenated: events are not re-encoded). */
static int build_merges(es_store *s, const char *session, const es_segments *list, merge **out,
                        size_t *nout, es_err *err) {
  *out = NULL;
  *nout = 0;
  size_t cap = 0;
  int rc = ES_OK;
  es_buf raw;
  es_buf_init(&raw);
  size_t i = 0;
  while (rc == ES_OK && i < list->n) {
    size_t j = i;
    int64_t total = 0;
    es_buf_destroy(&raw);
    /* extend the run while the next segment is adjacent and fits */
    while (rc == ES_OK && j < list->n) {
      const es_segment *g = &list->v[j];
      if (j > i && g->from != list->v[j - 1].through + 1) break;
      loaded l;
      if ((rc = seg_load(s, session, g, &l, err))) break;
      const char *why = NULL;
      int fits = j == i || total + (int64_t)l.info.raw_len <= ES_ARCHIVE_MERGE_MAX_RAW;
      /* an older format's events are re-encoded in the current one while
       * they are checked; the current format's body is taken as it is */
      int old = l.info.version != ES_SEG_VERSION;
      if (es_seg_each(&l.info, l.raw, 1, fits && old ? INT64_MAX : 0, reencode, &raw, &why) < 0)
        rc = es_fail(err, ES_STORAGE, "archive segment '%s' is corrupt: %s (session '%s')", l.path,
                     why, session);
      if (rc == ES_OK && fits) {
        total += (int64_t)l.info.raw_len;
        if ((!old && es_buf_add(&raw, l.raw, (size_t)l.info.raw_len) != ES_OK) || raw.oom)
          rc = nomem(err);
      }
      loaded_free(&l);
      if (!fits) break;
      j++;
    }
    if (rc == ES_OK && j - i >= 2) {
      if (es_grow((void **)out, &cap, *nout + 1, sizeof **out) != ES_OK) {
        rc = nomem(err);
        break;
      }
      merge *m = &(*out)[*nout];
      memset(m, 0, sizeof *m);
      m->first = i;
      m->last = j;
      int64_t from = list->v[i].from, through = list->v[j - 1].through;
      rc = es_seg_build(session, from, through, through - from + 1, (const unsigned char *)raw.data,
                        raw.len, ZSTD_LEVEL, &m->img, &m->len, &m->info, err);
      if (rc == ES_OK) (*nout)++;
    }
    i = j > i ? j : i + 1;
  }
  es_buf_destroy(&raw);
  if (rc) {
    merges_free(*out, *nout);
    *out = NULL;
    *nout = 0;
  }
  return rc;
}

int es_core_compact_archive(es_store *s, const char *session, int64_t *before, int64_t *after,
                            es_err *err) {
  int rc;
  *before = *after = 0;
  if ((rc = es_check_name("session", session, err))) return rc;
  if ((rc = need_archive(s, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  int done = 0;
  for (int attempt = 0; rc == ES_OK && !done && attempt < COMPACT_TRIES; attempt++) {
    es_segments list;
    merge *m = NULL;
    size_t nm = 0;
    rc = read_list(s, session, &list, err);
    if (rc) break;
    rc = build_merges(s, session, &list, &m, &nm, err);
    if (es_archive_retryable(rc, err)) { /* a file went meanwhile: the list changed */
      rc = ES_OK;
      es_segments_destroy(&list);
      continue;
    }
    *before = *after = (int64_t)list.n;
    if (rc == ES_OK && nm == 0) done = 1; /* nothing to merge: idempotent */
    if (rc == ES_OK && nm > 0) {
      if (s->archive_race) s->archive_race(s, s->archive_race_ctx);
      compact_args a = {session, &list, m, nm, 0, 0, 0, {0}};
      rc = es_store_now(s, &a.now, err);
      if (rc == ES_OK) rc = es_core_write(s, do_compact, &a, err);
      es_archive_files_finish(s, &a.drop, rc == ES_OK && !a.changed);
      if (rc == ES_OK && !a.changed) {
        *after = a.after;
        done = 1;
      }
    }
    merges_free(m, nm);
    es_segments_destroy(&list);
  }
  if (rc == ES_OK && !done)
    rc = es_fail(err, ES_STORAGE,
                 "compact_archive of session '%s': the segment list changed under it %d times "
                 "(archive, truncate or delete running meanwhile); try again",
                 session, COMPACT_TRIES);
  es_core_leave(s);
  return rc;
}

/* ---- verify_archive() --------------------------------------------------------------- */

static int add_problem(es_archive_problem **v, size_t *n, size_t *cap, const char *session,
                       const char *file, const char *problem) {
  if (es_grow((void **)v, cap, *n + 1, sizeof **v) != ES_OK) return ES_STORAGE;
  es_archive_problem *p = &(*v)[*n];
  p->session = session ? strdup(session) : NULL;
  p->file = strdup(file);
  p->problem = strdup(problem);
  if ((session && !p->session) || !p->file || !p->problem) {
    problem_destroy(p);
    return ES_STORAGE;
  }
  (*n)++;
  return ES_OK;
}

/* The sessions verify looks at, with their segment lists. */
typedef struct {
  char *session;
  char hash[33];
  es_segments list;
} checked;

typedef struct {
  checked *v;
  size_t n, cap;
  int oom;
  char *cursor;  /* the last session seen (listing) */
  size_t seen;
} verify_set;

static int collect_archived(void *ctx, const es_session_info *row) {
  verify_set *vs = ctx;
  vs->seen++;
  free(vs->cursor);
  if (!(vs->cursor = strdup(row->session))) {
    vs->oom = 1;
    return 1;
  }
  if (row->archived_through <= 0) return 0;
  if (es_grow((void **)&vs->v, &vs->cap, vs->n + 1, sizeof *vs->v) != ES_OK ||
      !(vs->v[vs->n].session = strdup(row->session))) {
    vs->oom = 1;
    return 1;
  }
  memset(&vs->v[vs->n].list, 0, sizeof vs->v[vs->n].list);
  vs->n++;
  return 0;
}

typedef struct {
  const char *session;  /* NULL: every session */
  verify_set *vs;
} verify_args;

/* One read transaction: the sessions (a page of them when all) and their
 * segment lists. */
static int do_verify_list(es_store *s, es_txn *t, void *arg, es_err *err) {
  verify_args *a = arg;
  verify_set *vs = a->vs;
  size_t n0 = vs->n;
  int rc;
  if (a->session) {
    if (es_grow((void **)&vs->v, &vs->cap, vs->n + 1, sizeof *vs->v) != ES_OK ||
        !(vs->v[vs->n].session = strdup(a->session)))
      return nomem(err);
    memset(&vs->v[vs->n].list, 0, sizeof vs->v[vs->n].list);
    vs->n++;
    vs->seen = 1;
  } else {
    vs->seen = 0;
    char *after = vs->cursor ? strdup(vs->cursor) : NULL;
    if (vs->cursor && !after) return nomem(err);
    rc = s->ops->session_list(s->bk, t, "", after, LIST_PAGE, collect_archived, vs, err);
    free(after);
    if (rc == ES_OK && vs->oom) rc = nomem(err);
    if (rc) return rc;
  }
  for (size_t i = n0; i < vs->n; i++) {
    session_hash(vs->v[i].session, vs->v[i].hash);
    if ((rc = list_segments(s, t, vs->v[i].session, &vs->v[i].list, err))) return rc;
  }
  return ES_OK;
}

static int is_hash_name(const char *name) {
  if (strlen(name) != 32) return 0;
  for (const char *p = name; *p; p++)
    if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'))) return 0;
  return 1;
}

/* Lists the files of one session directory that no row names. */
static int find_orphans(es_store *s, const char *hash, const checked *c, es_archive_report *r) {
  char *dir = join(s->archive_dir, hash);
  if (!dir) return ES_STORAGE;
  DIR *d = opendir(dir);
  struct dirent *de;
  int rc = ES_OK;
  while (rc == ES_OK && d && (de = readdir(d))) {
    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
    char rel[512];
    snprintf(rel, sizeof rel, "%s/%s", hash, de->d_name);
    int named = 0;
    for (size_t i = 0; c && i < c->list.n && !named; i++) named = strcmp(c->list.v[i].file, rel) == 0;
    if (named) continue;
    rc = add_problem(&r->orphans, &r->n_orphans, &r->cap_orphans, c ? c->session : NULL, rel,
                     c ? "orphan: no segment row names it (left by a crash, or being written now)"
                       : "orphan: no session with archived events owns its directory");
  }
  if (d) closedir(d);
  free(dir);
  return rc;
}

int es_core_verify_archive(es_store *s, const char *session, es_archive_report *out, es_err *err) {
  int rc;
  memset(out, 0, sizeof *out);
  if (session && (rc = es_check_name("session", session, err))) return rc;
  if ((rc = need_archive(s, err))) return rc;
  if ((rc = es_core_enter(s, err))) return rc;
  verify_set vs = {0};
  verify_args a = {session, &vs};
  do {
    rc = es_core_read(s, do_verify_list, &a, err);
  } while (rc == ES_OK && !session && vs.seen == LIST_PAGE);
  for (size_t i = 0; rc == ES_OK && i < vs.n; i++) {
    const checked *c = &vs.v[i];
    for (size_t k = 0; rc == ES_OK && k < c->list.n; k++) {
      const es_segment *g = &c->list.v[k];
      es_err e = {0};
      loaded l;
      int bad = seg_load(s, c->session, g, &l, &e);
      const char *why = NULL;
      if (!bad && es_seg_each(&l.info, l.raw, 1, 0, NULL, NULL, &why) < 0)
        bad = es_fail(&e, ES_STORAGE, "archive segment '%s' is corrupt: %s", l.path, why);
      /* a file removed since the list was read (compaction, truncate) is no problem */
      if (bad && es_archive_retryable(bad, &e)) {
        es_segments now;
        list_args la = {c->session, &now};
        if (es_core_read(s, do_segments, &la, err) == ES_OK) {
          int still = 0;
          for (size_t j = 0; j < now.n; j++) still |= strcmp(now.v[j].file, g->file) == 0;
          es_segments_destroy(&now);
          if (!still) bad = 0;
        }
      }
      if (!l.path) l.path = NULL;
      loaded_free(&l);
      out->checked++;
      if (bad && add_problem(&out->problems, &out->n_problems, &out->cap_problems, c->session,
                             g->file, e.msg) != ES_OK)
        rc = nomem(err);
    }
  }
  /* orphans: the directories of the sessions looked at, or every one */
  if (rc == ES_OK && session) {
    char hash[33];
    session_hash(session, hash);
    if (find_orphans(s, hash, vs.n ? &vs.v[0] : NULL, out) != ES_OK) rc = nomem(err);
  } else if (rc == ES_OK) {
    DIR *d = opendir(s->archive_dir);
    struct dirent *de;
    while (rc == ES_OK && d && (de = readdir(d))) {
      if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
      const checked *c = NULL;
      for (size_t i = 0; i < vs.n && !c; i++)
        if (strcmp(vs.v[i].hash, de->d_name) == 0) c = &vs.v[i];
      if (!is_hash_name(de->d_name)) {
        if (add_problem(&out->orphans, &out->n_orphans, &out->cap_orphans, NULL, de->d_name,
                        "orphan: not a session directory of this archive") != ES_OK)
          rc = nomem(err);
        continue;
      }
      if (find_orphans(s, de->d_name, c, out) != ES_OK) rc = nomem(err);
    }
    if (d) closedir(d);
  }
  for (size_t i = 0; i < vs.n; i++) {
    free(vs.v[i].session);
    es_segments_destroy(&vs.v[i].list);
  }
  free(vs.v);
  free(vs.cursor);
  es_core_leave(s);
  if (rc) es_archive_report_destroy(out);
  return rc;
}
