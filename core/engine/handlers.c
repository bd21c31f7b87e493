/*
 * handlers.c: the set of event types an engine has handlers for, read from
 * scripts/handlers (CONTRACT §4: an engine claims only those types, so a
 * wrong scripts directory leaves work pending instead of settling it).
 *
 * A type is the path of a .lua file below handlers/ without the suffix
 * ("order.placed", "billing/refund"), as the loader maps them. The set is
 * shared by the workers and replaced whole when the keeper rescans it
 * (refcounted, so a worker claiming with the old set never sees it freed).
 */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/internal.h"

#define MAX_DEPTH 8 /* nested folders of handlers followed */

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

/* Adds the .lua files below dir/rel (rel "" at the top). */
static int scan(es_type_set *t, size_t *cap, const char *dir, const char *rel, int depth) {
  char path[4096];
  snprintf(path, sizeof path, "%s%s%s", dir, *rel ? "/" : "", rel);
  DIR *d = opendir(path);
  if (!d) return 0; /* no handlers/ yet: no types */
  struct dirent *de;
  int rc = 0;
  while (rc == 0 && (de = readdir(d)) != NULL) {
    const char *nm = de->d_name;
    if (nm[0] == '.') continue; /* ., .., hidden files: never a type */
    char sub[4096], full[8192];
    int n = snprintf(sub, sizeof sub, "%s%s%s", rel, *rel ? "/" : "", nm);
    if (n < 0 || (size_t)n >= sizeof sub) continue;
    snprintf(full, sizeof full, "%s/%s", dir, sub);
    struct stat st;
    if (stat(full, &st) != 0) continue;
    size_t len = strlen(sub);
    if (S_ISDIR(st.st_mode)) {
      if (depth < MAX_DEPTH) rc = scan(t, cap, dir, sub, depth + 1);
    } else if (S_ISREG(st.st_mode) && len > 4 && strcmp(sub + len - 4, ".lua") == 0) {
      sub[len - 4] = '\0';
      rc = add(t, cap, sub);
    }
  }
  closedir(d);
  return rc;
}

es_type_set *es_type_set_scan(const char *scripts) {
  es_type_set *t = calloc(1, sizeof *t);
  if (!t) return NULL;
  atomic_init(&t->refs, 1);
  char dir[4096];
  snprintf(dir, sizeof dir, "%s/handlers", scripts);
  size_t cap = 0;
  if (scan(t, &cap, dir, "", 0) != 0) {
    es_type_set_release(t);
    return NULL;
  }
  if (t->n) qsort(t->v, t->n, sizeof *t->v, cmp_str);
  return t;
}

int es_type_set_has(const es_type_set *t, const char *type) {
  return t && t->n && bsearch(&type, t->v, t->n, sizeof *t->v, cmp_str) != NULL;
}

void es_type_set_release(es_type_set *t) {
  if (!t || atomic_fetch_sub(&t->refs, 1) != 1) return;
  for (size_t i = 0; i < t->n; i++) free(t->v[i]);
  free(t->v);
  free(t);
}
