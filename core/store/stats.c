/*
 * stats.c: per-call counters and latency histograms (stats.h,
 * docs/stats.md). Everything on the recording path is a relaxed atomic on
 * the calling thread's own stripe; reading sums the stripes.
 */
#include "store/stats.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Per thread: whether a counted call is running (nested calls are part of
 * it), and the stripe this thread writes to (0: not chosen yet, else
 * stripe + 1). Per thread, not shared: no lock, no contention. */
typedef struct {
  int depth;
  int stripe;
} stats_tls;
static _Thread_local stats_tls tls;

uint64_t es_stats_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int es_stats_bucket(uint64_t ns) {
  if (ns < 64) return (int)(ns >> 3);
  int e = 63 - __builtin_clzll(ns); /* 2^e <= ns < 2^(e+1), e >= 6 */
  if (e >= ES_STATS_MAX_EXP) return ES_STATS_BUCKETS - 1;
  int sub = (int)((ns >> (e - 3)) & (ES_STATS_SUB - 1));
  return ES_STATS_SUB + (e - 6) * ES_STATS_SUB + sub;
}

uint64_t es_stats_bucket_upper(int bucket) {
  if (bucket < ES_STATS_SUB) return (uint64_t)(bucket + 1) << 3;
  int e = 6 + (bucket - ES_STATS_SUB) / ES_STATS_SUB;
  uint64_t sub = (uint64_t)((bucket - ES_STATS_SUB) % ES_STATS_SUB);
  return (ES_STATS_SUB + sub + 1) << (e - 3);
}

/* The stripe of the calling thread: picked once per thread from the
 * address of its thread-local block (threads' blocks lie apart), mixed so
 * that neighbouring threads spread over the stripes. */
static int my_stripe(void) {
  if (!tls.stripe) {
    uint64_t a = (uint64_t)(uintptr_t)&tls;
    a ^= a >> 29;
    a *= 0x9E3779B97F4A7C15ull;
    tls.stripe = 1 + (int)(a >> 61) % ES_STATS_STRIPES;
  }
  return tls.stripe - 1;
}

static es_stats_stripe *stripe_get(es_stats_hist *h, int i) {
  es_stats_stripe *p = atomic_load_explicit(&h->stripe[i], memory_order_acquire);
  if (p) return p;
  es_stats_stripe *fresh = aligned_alloc(64, (sizeof *fresh + 63) / 64 * 64);
  if (!fresh) return NULL;
  memset(fresh, 0, sizeof *fresh);
  if (atomic_compare_exchange_strong_explicit(&h->stripe[i], &p, fresh, memory_order_acq_rel,
                                              memory_order_acquire))
    return fresh;
  free(fresh); /* another thread of the same stripe installed one first */
  return p;
}

void es_stats_hist_add(es_stats_hist *h, uint64_t ns, int failed) {
  es_stats_stripe *p = stripe_get(h, my_stripe());
  if (!p) return;
  /* no count of its own: the buckets' sum is the count (one atomic add
   * fewer per call) */
  if (failed) atomic_fetch_add_explicit(&p->errors, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&p->b[es_stats_bucket(ns)], 1, memory_order_relaxed);
  uint64_t m = atomic_load_explicit(&p->max_ns, memory_order_relaxed);
  while (ns > m && !atomic_compare_exchange_weak_explicit(&p->max_ns, &m, ns, memory_order_relaxed,
                                                          memory_order_relaxed)) {
  }
}

/* The p-th fraction's sample (1-based rank ceil(p * total)): the upper
 * bound of its bucket, never above max. */
static uint64_t percentile(const uint64_t *b, uint64_t total, double p, uint64_t max) {
  if (!total) return 0;
  uint64_t rank = (uint64_t)(p * (double)total);
  if ((double)rank < p * (double)total) rank++;
  if (rank < 1) rank = 1;
  uint64_t cum = 0;
  for (int i = 0; i < ES_STATS_BUCKETS; i++) {
    cum += b[i];
    if (cum >= rank) {
      uint64_t up = es_stats_bucket_upper(i);
      return up < max ? up : max;
    }
  }
  return max;
}

void es_stats_hist_buckets(es_stats_hist *h, uint64_t b[ES_STATS_BUCKETS], es_stats_summary *out) {
  memset(out, 0, sizeof *out);
  memset(b, 0, ES_STATS_BUCKETS * sizeof *b);
  uint64_t total = 0;
  for (int i = 0; i < ES_STATS_STRIPES; i++) {
    es_stats_stripe *p = atomic_load_explicit(&h->stripe[i], memory_order_acquire);
    if (!p) continue;
    out->errors += atomic_load_explicit(&p->errors, memory_order_relaxed);
    uint64_t m = atomic_load_explicit(&p->max_ns, memory_order_relaxed);
    if (m > out->max_ns) out->max_ns = m;
    for (int k = 0; k < ES_STATS_BUCKETS; k++) {
      uint64_t v = atomic_load_explicit(&p->b[k], memory_order_relaxed);
      b[k] += v;
      total += v;
    }
  }
  out->count = total;
  out->p50_ns = percentile(b, total, 0.50, out->max_ns);
  out->p99_ns = percentile(b, total, 0.99, out->max_ns);
}

void es_stats_hist_read(es_stats_hist *h, es_stats_summary *out) {
  uint64_t b[ES_STATS_BUCKETS];
  es_stats_hist_buckets(h, b, out);
}

void es_stats_hist_destroy(es_stats_hist *h) {
  for (int i = 0; i < ES_STATS_STRIPES; i++) {
    free(atomic_load(&h->stripe[i]));
    atomic_store(&h->stripe[i], NULL);
  }
}

void es_stats_destroy(es_stats *st) {
  for (int i = 0; i < ES_OP_COUNT; i++) es_stats_hist_destroy(&st->op[i]);
}

const char *es_stats_op_name(int op) {
#define ES_STATS_NAME_(e, name) name,
  static const char *const names[] = {ES_STATS_OPS(ES_STATS_NAME_)};
#undef ES_STATS_NAME_
  return op >= 0 && op < ES_OP_COUNT ? names[op] : "?";
}

void es_stats_set_enabled(es_stats *st, int on) { atomic_store(&st->off, !on); }

int es_stats_span_begin(es_stats_span *sp, es_stats *own, es_stats *also, int op) {
  if (tls.depth || atomic_load_explicit(&own->off, memory_order_relaxed)) return 0;
  tls.depth = 1;
  sp->own = own;
  sp->also = also;
  sp->op = op;
  sp->t0 = es_stats_now_ns();
  return 1;
}

void es_stats_span_end(es_stats_span *sp, int rc) {
  uint64_t ns = es_stats_now_ns() - sp->t0;
  tls.depth = 0;
  es_stats_hist_add(&sp->own->op[sp->op], ns, rc != ES_OK);
  if (sp->also) es_stats_hist_add(&sp->also->op[sp->op], ns, rc != ES_OK);
}

/* ---- the store's side (store.h §3.12) ------------------------------------ */

#include "store/internal.h"
#include "store/shards.h"

void es_store_call_stats(es_store *s, es_call_stats *out, size_t cap, size_t *n) {
  *n = 0;
  for (int op = 0; op < ES_OP_COUNT && *n < cap; op++) {
    es_stats_summary sum;
    es_stats_hist_read(&s->stats.op[op], &sum);
    if (!sum.count) continue;
    es_call_stats *c = &out[(*n)++];
    c->op = es_stats_op_name(op);
    c->count = sum.count;
    c->errors = sum.errors;
    c->p50_ns = sum.p50_ns;
    c->p99_ns = sum.p99_ns;
    c->max_ns = sum.max_ns;
  }
}

void es_store_call_hist(es_store *s, int op, uint64_t b[ES_STATS_BUCKETS], es_stats_summary *out) {
  es_stats_hist_buckets(&s->stats.op[op], b, out);
}

void es_store_stats_enable(es_store *s, int on) { es_stats_set_enabled(&s->stats, on); }

typedef struct {
  const char *scope;
  es_counts *out;
} counts_args;

static int do_counts(es_store *s, es_txn *t, void *arg, es_err *err) {
  counts_args *a = arg;
  return s->ops->counts(s->bk, t, a->scope, a->out, err);
}

int es_core_counts(es_store *s, const char *scope, es_counts *out, es_err *err) {
  memset(out, 0, sizeof *out);
  int rc = es_core_enter(s, err);
  if (rc) return rc;
  counts_args a = {scope, out};
  rc = es_core_read(s, do_counts, &a, err);
  es_core_leave(s);
  if (rc) memset(out, 0, sizeof *out);
  return rc;
}

