/*
 * listing.c: merging listings by name and paging a listing through a
 * filter (listing.h), for the tenant view and the shard router.
 */
#include "store/listing.h"

#include <stdlib.h>
#include <string.h>

static const char *name_of(const es_list_kind *k, const void *e) {
  return *(char *const *)((const char *)e + k->name_off);
}

static void *at(const es_list_kind *k, const es_list *l, size_t i) {
  return (char *)l->v + i * k->elem;
}

void es_list_clear(const es_list_kind *k, es_list *l) {
  for (size_t i = 0; i < l->n; i++) k->destroy(at(k, l, i));
  free(l->v);
  l->v = NULL;
  l->n = l->cap = 0;
}

int es_list_take(const es_list_kind *k, es_list *out, es_list *part, es_err *err) {
  if (part->n && es_grow(&out->v, &out->cap, out->n + part->n, k->elem)) {
    es_list_clear(k, part);
    return es_fail(err, ES_STORAGE, "out of memory");
  }
  if (part->n) memcpy(at(k, out, out->n), part->v, part->n * k->elem);
  out->n += part->n;
  free(part->v);
  part->v = NULL;
  part->n = part->cap = 0;
  return ES_OK;
}

static int cmp_name(const void *a, const void *b, void *kind) {
  return strcmp(name_of(kind, a), name_of(kind, b));
}

int es_list_sort_unique(const es_list_kind *k, es_list *l, int64_t limit) {
  if (l->n > 1) qsort_r(l->v, l->n, k->elem, cmp_name, (void *)k);
  size_t kept = 0;
  int cut = 0;
  for (size_t i = 0; i < l->n; i++) {
    void *e = at(k, l, i);
    int dup = kept && strcmp(name_of(k, at(k, l, kept - 1)), name_of(k, e)) == 0;
    if (dup || (limit != ES_NONE && (int64_t)kept >= limit)) {
      cut |= !dup;
      k->destroy(e);
      continue;
    }
    if (kept != i) memcpy(at(k, l, kept), e, k->elem);
    kept++;
  }
  l->n = kept;
  return cut;
}

int es_list_page_through(const es_list_kind *k, es_list_page_fn fetch, es_list_keep_fn keep,
                         void *ctx, const char *from, int64_t limit, es_list *out, es_err *err) {
  int rc = ES_OK;
  char *cur = NULL; /* the last name of the previous page */
  for (int more = 1; !rc && more && (int64_t)out->n < limit;) {
    es_list page = {0};
    rc = fetch(ctx, cur ? cur : from, limit - (int64_t)out->n, &page, err);
    more = !rc && (int64_t)page.n == limit - (int64_t)out->n;
    free(cur);
    cur = NULL;
    if (!rc && more && page.n && !(cur = strdup(name_of(k, at(k, &page, page.n - 1)))))
      rc = es_fail(err, ES_STORAGE, "out of memory");
    for (size_t i = 0; !rc && i < page.n; i++) {
      void *e = at(k, &page, i);
      int kept = keep(ctx, name_of(k, e));
      if (kept < 0) more = 0;
      if (kept <= 0) continue;
      if (es_grow(&out->v, &out->cap, out->n + 1, k->elem)) {
        rc = es_fail(err, ES_STORAGE, "out of memory");
        break;
      }
      memcpy(at(k, out, out->n++), e, k->elem);
      memset(e, 0, k->elem); /* moved: the page no longer owns it */
    }
    es_list_clear(k, &page);
  }
  free(cur);
  if (rc) es_list_clear(k, out);
  return rc;
}
