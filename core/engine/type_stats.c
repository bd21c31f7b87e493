/*
 * type_stats.c: per-event-type handler figures (type_stats.h).
 */
#include "engine/type_stats.h"

#include <stdlib.h>
#include <string.h>

struct es_type_arr {
  es_type_arr *next_retired;
  size_t n;
  es_type_stat *v[];
};

/* The entry of type in a (NULL: none); *at: where it would go. */
static es_type_stat *find(const es_type_arr *a, const char *type, size_t *at) {
  size_t lo = 0, hi = a ? a->n : 0;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    int c = strcmp(a->v[mid]->type, type);
    if (c == 0) return a->v[mid];
    if (c < 0) lo = mid + 1;
    else hi = mid;
  }
  if (at) *at = lo;
  return NULL;
}

/* The entry of type, made on first use (NULL: out of memory; the sample
 * is then dropped: counting never fails a run). */
static es_type_stat *get(es_type_stats *t, const char *type) {
  es_type_arr *a = atomic_load_explicit(&t->cur, memory_order_acquire);
  es_type_stat *st = find(a, type, NULL);
  if (st) return st;
  size_t len = strlen(type) + 1;
  es_type_stat *fresh = calloc(1, sizeof *fresh + len);
  if (!fresh) return NULL;
  memcpy(fresh->type, type, len);
  for (;;) {
    size_t at = 0;
    if ((st = find(a, type, &at))) { /* another worker added it meanwhile */
      free(fresh);
      return st;
    }
    size_t n = a ? a->n : 0;
    es_type_arr *b = malloc(sizeof *b + (n + 1) * sizeof *b->v);
    if (!b) {
      free(fresh);
      return NULL;
    }
    b->n = n + 1;
    if (at) memcpy(b->v, a->v, at * sizeof *b->v);
    b->v[at] = fresh;
    if (n > at) memcpy(b->v + at + 1, a->v + at, (n - at) * sizeof *b->v);
    if (atomic_compare_exchange_strong_explicit(&t->cur, &a, b, memory_order_acq_rel,
                                                memory_order_acquire)) {
      /* readers may still hold a: keep it until destroy (one per type) */
      if (a) {
        es_type_arr *r = atomic_load(&t->retired);
        do a->next_retired = r;
        while (!atomic_compare_exchange_weak(&t->retired, &r, a));
      }
      return fresh;
    }
    free(b); /* a is now the array another worker installed: again */
  }
}

uint64_t es_type_stats_begin(es_type_stats *t, uint64_t now_ns) {
  return atomic_load_explicit(&t->off, memory_order_relaxed) ? 0 : now_ns;
}

uint64_t es_type_stats_end(es_type_stats *t, uint64_t t0, uint64_t now_ns) {
  return t0 && !atomic_load_explicit(&t->off, memory_order_relaxed) ? now_ns - t0 : 0;
}

void es_type_stats_enable(es_type_stats *t, int on) { atomic_store(&t->off, !on); }

void es_type_stats_count(es_type_stats *t, const char *type, int kind) {
  if (atomic_load_explicit(&t->off, memory_order_relaxed)) return;
  es_type_stat *st = get(t, type);
  if (!st) return;
  _Atomic uint64_t *c = kind == ES_TYPE_HANDLED ? &st->handled
                        : kind == ES_TYPE_FAILED ? &st->failed
                                                 : &st->dead;
  atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

void es_type_stats_run(es_type_stats *t, const char *type, uint64_t ns, int failed) {
  if (atomic_load_explicit(&t->off, memory_order_relaxed)) return;
  es_type_stat *st = get(t, type);
  if (st) es_stats_hist_add(&st->runs, ns, failed);
}

void es_type_stats_each(es_type_stats *t, void (*fn)(void *ctx, const es_type_stat *st),
                        void *ctx) {
  es_type_arr *a = atomic_load_explicit(&t->cur, memory_order_acquire);
  for (size_t i = 0; a && i < a->n; i++) fn(ctx, a->v[i]);
}

void es_type_stats_destroy(es_type_stats *t) {
  es_type_arr *a = atomic_load(&t->cur);
  for (size_t i = 0; a && i < a->n; i++) {
    es_stats_hist_destroy(&a->v[i]->runs);
    free(a->v[i]);
  }
  free(a);
  for (es_type_arr *r = atomic_load(&t->retired), *next; r; r = next) {
    next = r->next_retired;
    free(r);
  }
  atomic_store(&t->cur, NULL);
  atomic_store(&t->retired, NULL);
}
