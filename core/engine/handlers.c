/*
 * handlers.c: the set of event types an engine has handlers for, read from
 * scripts/handlers (docs/contract.md §4: an engine claims only those types, so a
 * wrong scripts directory leaves work pending instead of settling it).
 *
 * A type is the path of a .lua file below handlers/ without the suffix
 * ("order.placed", "billing/refund"), as the loader maps them. The set is
 * shared by the workers and replaced whole when the keeper rescans it
 * (refcounted, so a worker claiming with the old set never sees it freed).
 * The same scan lists the reducers, for loading every script at start.
 *
 * A path that does not fit PATH_BYTES is an error, never cut short: a
 * truncated name would be another type (or another file).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/internal.h"

#define MAX_DEPTH 8 /* nested folders of handlers followed */
#define PATH_BYTES 4096 /* PATH_MAX: the longest path a script may have */

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int add(es_type_set *t, size_t *cap, const char *name) {
  if (t->n == *cap) {
    size_t nc = *cap ? *cap * 2 : 16;
    char **v = realloc(t->v, nc * sizeof *v);
    if (!v) return -1;
    t->v = v;
    *cap = nc;
  }
  if (!(t->v[t->n] = strdup(name))) return -1;
  t->n++;
  return 0;
}

static int too_long(es_err *err, const char *a, const char *b) {
  return es_fail(err, ES_INVALID_ARGUMENT, "script path too long (over %d bytes): %.200s/%.200s...",
                 PATH_BYTES - 1, a, b);
}

/* Adds the .lua files below dir/rel (rel "" at the top). */
static int scan(es_type_set *t, size_t *cap, const char *dir, const char *rel, int depth,
                es_err *err) {
  char path[PATH_BYTES];
  int n = snprintf(path, sizeof path, "%s%s%s", dir, *rel ? "/" : "", rel);
  if (n < 0 || (size_t)n >= sizeof path) return too_long(err, dir, rel);
  DIR *d = opendir(path);
  if (!d) return ES_OK; /* no such folder yet: no scripts */
  struct dirent *de;
  int rc = ES_OK;
  while (rc == ES_OK && (de = readdir(d)) != NULL) {
    const char *nm = de->d_name;
    if (nm[0] == '.') continue; /* ., .., hidden files: never a type */
    char sub[PATH_BYTES], full[PATH_BYTES];
    n = snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", nm);
    if (n < 0 || (size_t)n >= sizeof sub) {
      rc = too_long(err, path, nm);
      break;
    }
    n = snprintf(full, sizeof full, "%s/%s", dir, sub);
    if (n < 0 || (size_t)n >= sizeof full) {
      rc = too_long(err, path, nm);
      break;
    }
    struct stat st;
    if (stat(full, &st) != 0) continue;
    size_t len = strlen(sub);
    if (S_ISDIR(st.st_mode)) {
      if (depth < MAX_DEPTH) rc = scan(t, cap, dir, sub, depth + 1, err);
    } else if (S_ISREG(st.st_mode) && len > 4 && strcmp(sub + len - 4, ".lua") == 0) {
      sub[len - 4] = '\0';
      if (add(t, cap, sub)) rc = es_fail(err, ES_STORAGE, "out of memory");
    }
  }
  closedir(d);
  return rc;
}

es_type_set *es_script_scan(const char *scripts, const char *kind, es_err *err) {
  es_type_set *t = calloc(1, sizeof *t);
  if (!t) {
    es_fail(err, ES_STORAGE, "out of memory");
    return NULL;
  }
  atomic_init(&t->refs, 1);
  char dir[PATH_BYTES];
  int n = snprintf(dir, sizeof dir, "%s/%s", scripts, kind);
  size_t cap = 0;
  int rc = n < 0 || (size_t)n >= sizeof dir ? too_long(err, scripts, kind)
                                             : scan(t, &cap, dir, "", 0, err);
  if (rc != ES_OK) {
    es_type_set_release(t);
    return NULL;
  }
  if (t->n) qsort(t->v, t->n, sizeof *t->v, cmp_str);
  return t;
}

es_type_set *es_type_set_scan(const char *scripts, es_err *err) {
  return es_script_scan(scripts, "handlers", err);
}

int es_type_set_has(const es_type_set *t, const char *type) {
  return t && t->n && bsearch(&type, t->v, t->n, sizeof *t->v, cmp_str) != NULL;
}

es_type_set *es_type_set_get(pthread_mutex_t *mu, es_type_set *const *slot) {
  pthread_mutex_lock(mu);
  es_type_set *t = *slot;
  if (t) atomic_fetch_add(&t->refs, 1);
  pthread_mutex_unlock(mu);
  return t;
}

void es_type_set_release(es_type_set *t) {
  if (!t || atomic_fetch_sub(&t->refs, 1) != 1) return;
  for (size_t i = 0; i < t->n; i++) free(t->v[i]);
  free(t->v);
  free(t);
}

/* a ∪ b (either may be NULL) without the names of minus[0..n_minus), as a
 * new set with one reference; NULL when out of memory. */
es_type_set *es_type_set_union(const es_type_set *a, const es_type_set *b, char *const *minus,
                               size_t n_minus) {
  es_type_set *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  atomic_init(&t->refs, 1);
  size_t cap = 0;
  const es_type_set *both[2] = {a, b};
  for (int k = 0; k < 2; k++) {
    for (size_t i = 0; both[k] && i < both[k]->n; i++) {
      const char *name = both[k]->v[i];
      int skip = k == 1 && es_type_set_has(a, name);
      for (size_t m = 0; m < n_minus && !skip; m++) skip = strcmp(minus[m], name) == 0;
      if (!skip && add(t, &cap, name)) {
        es_type_set_release(t);
        return NULL;
      }
    }
  }
  if (t->n) qsort(t->v, t->n, sizeof *t->v, cmp_str);
  return t;
}
