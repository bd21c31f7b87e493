/*
 * tap.h: what the C tests share. Their output is TAP-like: spec/run.sh
 * counts the "ok" and "not ok" lines of each, and a test exits non-zero
 * when one failed (tap_done). Header-only, included once per test
 * program; the functions are static inline so that a test need not use
 * every one.
 */
#ifndef ES_SPEC_TAP_H
#define ES_SPEC_TAP_H

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int test_no, failures;

static inline void ok(int cond, const char *name) {
  test_no++;
  if (!cond) failures++;
  printf("%sok %d - %s\n", cond ? "" : "not ", test_no, name);
}

/* ok() with a name made from fmt (printf's). */
static inline void okf(int cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static inline void okf(int cond, const char *fmt, ...) {
  char name[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(name, sizeof name, fmt, ap);
  va_end(ap);
  ok(cond, name);
}

/* A case this run cannot test (no PostgreSQL, a sanitizer that cannot
 * inject the fault, ...): TAP's "ok N - # SKIP why". spec/run.sh counts
 * these apart from passes; they never count as passed. */
static inline void skip(const char *why) {
  test_no++;
  printf("ok %d - # SKIP %s\n", test_no, why);
}

/* The closing line; main's exit status. */
static inline int tap_done(void) {
  printf("# %d tests, %d failed\n", test_no, failures);
  return failures ? 1 : 0;
}

/* base (ES_PG_URL, which make test sets) with a schema of its own,
 * c_<what>_<pid>_<time>: each run its own fresh store. */
static inline void pg_url(const char *base, const char *what, char *out, size_t cap) {
  snprintf(out, cap, "%s%sschema=c_%s_%ld_%ld", base, strchr(base, '?') ? "&" : "?", what,
           (long)getpid(), (long)time(NULL));
}

/* Removes a SQLite file and its -wal and -shm files. */
static inline void unlink_sqlite(const char *path) {
  static const char *const suffixes[] = {"", "-wal", "-shm"};
  char p[512];
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s%s", path, suffixes[i]);
    unlink(p);
  }
}

#endif
